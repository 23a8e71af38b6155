"""The result type of chain verification."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = ["Verification"]


@dataclass(frozen=True, slots=True, eq=False)
class Verification:
    """What one verification step keeps, per batch row ``b``.

    Attributes
    ----------
    output_token_ids : ndarray of int64, shape ``[B, K+1]``
        The ``n_b + 1`` emitted tokens of each row (the accepted drafts, then the
        replacement or bonus token), padded with ``-1``.
    num_accepted : ndarray of int64, shape ``[B]``
        ``n_b``, the accepted prefix length: drafts kept from the start of the row.
    num_emitted : ndarray of int64, shape ``[B]``
        ``n_b + 1``, the number of valid entries of ``output_token_ids[b]``.

    Examples
    --------
    >>> import numpy as np, specaccept
    >>> r = specaccept.verify_greedy(np.array([[5, 7]]), np.array([[5, 9, 2]]))
    >>> r.tokens(0).tolist(), int(r.num_accepted[0])
    ([5, 9], 1)
    """

    output_token_ids: npt.NDArray[np.int64]
    num_accepted: npt.NDArray[np.int64]
    num_emitted: npt.NDArray[np.int64]

    @property
    def batch_size(self) -> int:
        """``B``, the number of rows."""
        return int(self.num_accepted.shape[0])

    def tokens(self, row: int) -> npt.NDArray[np.int64]:
        """The emitted tokens of ``row`` (a view of ``output_token_ids``, no padding)."""
        return self.output_token_ids[row, : self.num_emitted[row]]

    def to_lists(self) -> list[list[int]]:
        """The emitted tokens of every row, as Python lists."""
        return [self.tokens(b).tolist() for b in range(self.batch_size)]
