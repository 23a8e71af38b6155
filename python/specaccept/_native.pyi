"""Type stubs of the Rust extension ``specaccept._native`` (src/py.rs).

These are the raw entry points behind the public API: arguments already
normalised by ``specaccept._api`` (arrays of supported dtypes, uniforms drawn).
"""

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
    "get_num_threads",
    "max_num_threads",
    "rejection_probability",
    "set_num_threads",
    "verify",
    "verify_flat",
    "verify_greedy",
    "verify_logits",
    "verify_tree",
]

SUM_BLOCK: int
SUM_LANES: int
PARALLEL_MIN_ELEMENTS: int
MAX_THREADS_PER_CPU: int

class NotInPlace(TypeError):
    """An input not readable in place, found before any work: convert and call again."""

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

def verify(
    draft_token_ids: npt.NDArray[np.int32 | np.int64],
    target_probs: npt.NDArray[np.floating],
    draft_probs: npt.NDArray[np.floating] | None,
    num_draft_tokens: npt.NDArray[np.int32 | np.int64] | None,
    uniforms: npt.NDArray[np.floating] | None,
    recovery_uniforms: npt.NDArray[np.floating] | None,
    greedy: bool | npt.NDArray[np.bool_],
    out: _Out | None = None,
    draws: npt.NDArray[np.float64] | None = None,
    isolate: bool = False,
) -> _Chain | _Isolated: ...
def verify_flat(
    draft_token_ids: npt.NDArray[np.int32 | np.int64],
    num_draft_tokens: npt.NDArray[np.int32 | np.int64],
    target_probs: npt.NDArray[np.floating],
    draft_probs: npt.NDArray[np.floating] | None,
    bonus_token_ids: npt.NDArray[np.int32 | np.int64],
    uniforms: npt.NDArray[np.floating] | None,
    recovery_uniforms: npt.NDArray[np.floating] | None,
    greedy: bool | npt.NDArray[np.bool_],
    out: _Out | None = None,
    isolate: bool = False,
) -> _Chain | _Isolated: ...
def verify_greedy(
    draft_token_ids: npt.NDArray[np.int32 | np.int64],
    target_token_ids: npt.NDArray[np.int32 | np.int64],
    num_draft_tokens: npt.NDArray[np.int32 | np.int64] | None,
    out: _Out | None = None,
) -> _Chain: ...
def rejection_probability(
    target_prob: npt.NDArray[np.floating], draft_prob: npt.NDArray[np.floating]
) -> npt.NDArray[np.float64]: ...
def acceptance_mask(
    target_prob: npt.NDArray[np.floating],
    draft_prob: npt.NDArray[np.floating],
    uniform: npt.NDArray[np.floating],
) -> npt.NDArray[np.bool_]: ...
def acceptance_rate(
    target_probs: npt.NDArray[np.floating], draft_probs: npt.NDArray[np.floating]
) -> npt.NDArray[np.float64]: ...
def accepted_prefix_length(
    accepted: npt.NDArray[np.bool_], num_draft_tokens: npt.NDArray[np.int32 | np.int64] | None
) -> npt.NDArray[np.int64]: ...
def get_num_threads() -> int: ...
def set_num_threads(n: int) -> None: ...
def max_num_threads() -> int: ...
def verify_tree(
    node_token_ids: npt.NDArray[np.int32 | np.int64],
    parent_ids: npt.NDArray[np.int32 | np.int64],
    target_probs: npt.NDArray[np.floating],
    draft_probs: npt.NDArray[np.floating] | None,
    uniforms: npt.NDArray[np.floating] | None,
    recovery_uniforms: npt.NDArray[np.floating] | None,
    greedy: bool | npt.NDArray[np.bool_],
) -> tuple[
    npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]
]: ...
def verify_logits(
    draft_token_ids: npt.NDArray[np.int32 | np.int64],
    target_logits: npt.NDArray[np.floating],
    draft_logits: npt.NDArray[np.floating] | None,
    temperature: npt.NDArray[np.float64],
    top_k: npt.NDArray[np.int64],
    top_p: npt.NDArray[np.float64],
    num_draft_tokens: npt.NDArray[np.int32 | np.int64] | None,
    uniforms: npt.NDArray[np.floating] | None,
    recovery_uniforms: npt.NDArray[np.floating] | None,
    isolate: bool = False,
) -> _Chain | _Isolated: ...
