"""Type stubs of the Rust extension ``specaccept._native`` (src/py.rs).

These are the raw entry points behind the public API: arguments already
normalised by ``specaccept._api`` (arrays of supported dtypes, uniforms drawn).
"""

from typing import Any

import numpy as np
import numpy.typing as npt

from ._errors import InputError

__all__ = [
    "MAX_THREADS_PER_CPU",
    "PARALLEL_MIN_ELEMENTS",
    "SUM_BLOCK",
    "SUM_LANES",
    "NotInPlace",
    "acceptance_mask",
    "acceptance_rate",
    "accepted_prefix_length",
    "counter_stream",
    "counter_uniforms",
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
