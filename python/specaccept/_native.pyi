"""Type stubs of the Rust extension ``specaccept._native`` (src/py.rs).

These are the raw entry points behind the public API: arguments already
normalised by ``specaccept._api`` (arrays of supported dtypes, uniforms drawn).
"""

from typing import Any, final

import numpy as np
import numpy.typing as npt

from ._errors import InputError

__all__ = [
    "MAX_THREADS_PER_CPU",
    "PARALLEL_MIN_ELEMENTS",
    "SUM_BLOCK",
    "SUM_LANES",
    "NotInPlace",
    "StepCost",
    "acceptance_mask",
    "acceptance_rate",
    "acceptance_rows",
    "accepted_prefix_length",
    "best_ragged",
    "best_width",
    "counter_stream",
    "counter_uniforms",
    "fit_step_cost",
    "get_num_threads",
    "max_num_threads",
    "rejection_probability",
    "set_num_threads",
    "verify",
    "verify_flat",
    "verify_flat_logits",
    "verify_greedy",
    "verify_logits",
    "verify_tree",
    "verify_tree_logits",
]

SUM_BLOCK: int
SUM_LANES: int
PARALLEL_MIN_ELEMENTS: int
MAX_THREADS_PER_CPU: int

class NotInPlace(TypeError):
    """An input not readable in place, found before any work: convert and call again."""

# Inputs: any object. Arrays of the listed dtypes (aligned, native byte order)
# are read in place; anything else raises NotInPlace before any work, and the
# Python layer converts it (specaccept._arrays) and calls again.
_In = Any
# `method=` as the Python layer passes it: "token", "block", ("typical", epsilon,
# delta) or ("synthetic", acceptance rates [K] float64); None is "token".
_Method = str | tuple[str, float, float] | tuple[str, npt.NDArray[np.float64]] | None

_Chain = tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]
# With isolate=True: the bad rows as (row, InputError), after the three arrays.
_Isolated = tuple[
    npt.NDArray[np.int64],
    npt.NDArray[np.int64],
    npt.NDArray[np.int64],
    list[tuple[int, InputError]],
]
# (output_token_ids, num_accepted, num_emitted or None)
_Out = tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64] | None]
_Tree = tuple[
    npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]
]
# With isolate=True: the bad rows as (row, InputError), after the four arrays.
_TreeIsolated = tuple[
    npt.NDArray[np.int64],
    npt.NDArray[np.int64],
    npt.NDArray[np.int64],
    npt.NDArray[np.int64],
    list[tuple[int, InputError]],
]
# (output_token_ids, num_accepted, num_emitted or None, accepted_node_ids)
_TreeOut = tuple[
    npt.NDArray[np.int64],
    npt.NDArray[np.int64],
    npt.NDArray[np.int64] | None,
    npt.NDArray[np.int64],
]

def verify(
    draft_token_ids: _In,
    target_probs: _In,
    draft_probs: _In | None,
    num_draft_tokens: _In | None,
    uniforms: _In | None,
    recovery_uniforms: _In | None,
    greedy: bool | npt.NDArray[np.bool_],
    out: _Out | None = None,
    draws: npt.NDArray[np.float64] | None = None,
    isolate: bool = False,
    method: _Method = None,
) -> _Chain | _Isolated: ...
def verify_flat(
    draft_token_ids: _In,
    num_draft_tokens: _In,
    target_probs: _In,
    draft_probs: _In | None,
    bonus_token_ids: _In,
    uniforms: _In | None,
    recovery_uniforms: _In | None,
    greedy: bool | npt.NDArray[np.bool_],
    out: _Out | None = None,
    isolate: bool = False,
    method: _Method = None,
) -> _Chain | _Isolated: ...
def verify_greedy(
    draft_token_ids: _In,
    target_token_ids: _In,
    num_draft_tokens: _In | None,
    out: _Out | None = None,
) -> _Chain: ...
def rejection_probability(target_prob: _In, draft_prob: _In) -> npt.NDArray[np.float64]: ...
def acceptance_mask(
    target_prob: _In,
    draft_prob: _In,
    uniform: _In,
) -> npt.NDArray[np.bool_]: ...
def acceptance_rate(target_probs: _In, draft_probs: _In) -> npt.NDArray[np.float64]: ...
def accepted_prefix_length(
    accepted: npt.NDArray[np.bool_], num_draft_tokens: _In | None
) -> npt.NDArray[np.int64]: ...
def counter_stream(
    seeds: npt.NDArray[np.uint64],
    offsets: npt.NDArray[np.uint64],
    num_positions: int,
    stream: int,
) -> npt.NDArray[np.float64]: ...
def counter_uniforms(
    seeds: npt.NDArray[np.uint64], offsets: npt.NDArray[np.uint64], num_positions: int
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]: ...

# AdaptiveK's numbers (docs/spec.md sections 13.2 and 13.3; src/schedule.rs).
@final
class StepCost:
    """A fitted step time: the line ``coef`` and each measured point's correction."""

    def __new__(
        cls, coef: tuple[float, float, float], cells: dict[tuple[float, float], float]
    ) -> StepCost: ...
    @property
    def coef(self) -> tuple[float, float, float]: ...
    @property
    def cells(self) -> dict[tuple[float, float], float]: ...
    def seconds(self, target_tokens: float, draft_forwards: float) -> float: ...

def acceptance_rows(
    accepted: npt.NDArray[np.float64],
    tried: npt.NDArray[np.float64],
    pooled: float,
    prior_weight: float,
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.float64]]: ...
def fit_step_cost(
    t: npt.NDArray[np.float64],
    x: npt.NDArray[np.float64],
    f: npt.NDArray[np.float64],
    keep: float,
) -> StepCost | None: ...
def best_width(
    cost: StepCost,
    cumulative: npt.NDArray[np.float64],
    cap: npt.NDArray[np.int64],
    min_k: int,
    remaining: npt.NDArray[np.float64] | None = None,
) -> npt.NDArray[np.int64]: ...
def best_ragged(
    cost: StepCost,
    reach: npt.NDArray[np.float64],
    cumulative: npt.NDArray[np.float64],
    cap: npt.NDArray[np.int64],
    min_k: int,
    remaining: npt.NDArray[np.float64] | None = None,
) -> npt.NDArray[np.int64]: ...
def get_num_threads() -> int: ...
def set_num_threads(n: int) -> None: ...
def max_num_threads() -> int: ...
def verify_tree(
    node_token_ids: _In,
    parent_ids: _In,
    target_probs: _In,
    draft_probs: _In | None,
    uniforms: _In | None,
    recovery_uniforms: _In | None,
    greedy: bool | npt.NDArray[np.bool_],
    method: str = "token",
    out: _TreeOut | None = None,
    isolate: bool = False,
) -> _Tree | _TreeIsolated: ...
def verify_tree_logits(
    node_token_ids: _In,
    parent_ids: _In,
    target_logits: _In,
    draft_logits: _In | None,
    temperature: npt.NDArray[np.float64],
    top_k: npt.NDArray[np.int64],
    top_p: npt.NDArray[np.float64],
    uniforms: _In | None,
    recovery_uniforms: _In | None,
    method: str = "token",
    out: _TreeOut | None = None,
    isolate: bool = False,
    min_p: npt.NDArray[np.float64] | None = None,
    min_p_last: bool = False,
) -> _Tree | _TreeIsolated: ...
def verify_logits(
    draft_token_ids: _In,
    target_logits: _In,
    draft_logits: _In | None,
    temperature: npt.NDArray[np.float64],
    top_k: npt.NDArray[np.int64],
    top_p: npt.NDArray[np.float64],
    num_draft_tokens: _In | None,
    uniforms: _In | None,
    recovery_uniforms: _In | None,
    isolate: bool = False,
    method: _Method = None,
    draft_token_probs: _In | None = None,
    min_p: npt.NDArray[np.float64] | None = None,
    min_p_last: bool = False,
) -> _Chain | _Isolated: ...
def verify_flat_logits(
    draft_token_ids: _In,
    num_draft_tokens: _In,
    logits: _In,
    draft_probs: _In | None,
    temperature: npt.NDArray[np.float64],
    top_k: npt.NDArray[np.int64],
    top_p: npt.NDArray[np.float64],
    uniforms: _In | None,
    recovery_uniforms: _In | None,
    isolate: bool = False,
    method: _Method = None,
    min_p: npt.NDArray[np.float64] | None = None,
    min_p_last: bool = False,
) -> _Chain | _Isolated: ...
