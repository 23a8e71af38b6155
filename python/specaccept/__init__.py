"""specaccept: the verification step of speculative decoding, exact and zero-copy.

A small draft model proposes ``K`` tokens, the target model scores them in one
pass, and :func:`verify` decides which to keep so that the output follows the
target model exactly. The work runs in Rust over NumPy buffers read in place;
:mod:`specaccept.reference` is the pure-Python oracle it matches token for token.
"""

from . import lab, lossy  # noqa: F401  (subpackages: the laboratory, the lossy methods)
from ._api import (
    RngLike,
    acceptance_mask,
    acceptance_rate,
    accepted_prefix_length,
    rejection_probability,
    verify,
    verify_greedy,
)
from ._errors import InputError
from ._logits import verify_logits
from ._result import TreeVerification, Verification
from ._schedule import AdaptiveK, HeuristicK, KChoice, KSchedule
from ._stats import (
    AcceptanceStats,
    best_num_draft_tokens,
    expected_speedup,
    expected_tokens_per_step,
)
from ._threads import (
    PARALLEL_MIN_ELEMENTS,
    _apply_environment,
    get_num_threads,
    max_num_threads,
    set_num_threads,
)
from ._tree import verify_tree, verify_tree_logits
from ._uniforms import counter_uniforms
from .generation import Drafter, Generation, LanguageModel, PromptLookup, generate

__version__ = "0.1.0"

_apply_environment()

__all__ = [
    "PARALLEL_MIN_ELEMENTS",
    "AcceptanceStats",
    "AdaptiveK",
    "Drafter",
    "Generation",
    "HeuristicK",
    "InputError",
    "KChoice",
    "KSchedule",
    "LanguageModel",
    "PromptLookup",
    "RngLike",
    "TreeVerification",
    "Verification",
    "__version__",
    "acceptance_mask",
    "acceptance_rate",
    "accepted_prefix_length",
    "best_num_draft_tokens",
    "counter_uniforms",
    "expected_speedup",
    "expected_tokens_per_step",
    "generate",
    "get_num_threads",
    "max_num_threads",
    "rejection_probability",
    "set_num_threads",
    "verify",
    "verify_greedy",
    "verify_logits",
    "verify_tree",
    "verify_tree_logits",
]
