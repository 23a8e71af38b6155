"""The verifier laboratory: every method on the same drafts, and the exact
expectations of each method's accepted length.

- :func:`compare_methods` / :class:`MethodComparison` / :class:`MethodResult` /
  :class:`AcceptedLengths`: every chain method on the same logged steps and
  uniforms, and how each one's accepted length is spread (``_compare.py``).
- :func:`expected_num_accepted`, :func:`expected_num_accepted_tree`: the exact
  expected accepted length of given drafts, per method (``_expectation.py``).
- :func:`load_steps`: the ``.npz`` steps ``python -m specaccept compare --from``
  reads and ``generate(..., record=)`` writes (``_steps.py``).

The contract is docs/spec.md sections 6.4 and 6.6; the guide docs/methods.md.
"""

from ._compare import AcceptedLengths, MethodComparison, MethodResult, compare_methods
from ._expectation import expected_num_accepted, expected_num_accepted_tree
from ._steps import NPZ_ARRAYS, load_steps

__all__ = [
    "NPZ_ARRAYS",
    "AcceptedLengths",
    "MethodComparison",
    "MethodResult",
    "compare_methods",
    "expected_num_accepted",
    "expected_num_accepted_tree",
    "load_steps",
]
