"""The result type of chain verification."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = ["TreeVerification", "Verification"]


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

    @classmethod
    def empty(cls, batch_size: int, num_draft: int) -> Verification:
        """Buffers for ``B`` rows of ``K`` drafts, to pass as ``out=`` in a decoding loop.

        Examples
        --------
        >>> import numpy as np, specaccept
        >>> buffers = specaccept.Verification.empty(1, 2)
        >>> r = specaccept.verify_greedy(np.array([[5, 7]]), np.array([[5, 9, 2]]), out=buffers)
        >>> r.output_token_ids is buffers.output_token_ids, r.to_lists()
        (True, [[5, 9]])
        """
        for name, value in (("batch_size", batch_size), ("num_draft", num_draft)):
            if not isinstance(value, (int, np.integer)) or isinstance(value, (bool, np.bool_)):
                raise TypeError(f"{name} must be an int, got {type(value).__name__}")
            if value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
        return cls(
            np.full((batch_size, num_draft + 1), -1, dtype=np.int64),
            np.zeros(batch_size, dtype=np.int64),
            np.zeros(batch_size, dtype=np.int64),
        )


@dataclass(frozen=True, slots=True, eq=False)
class TreeVerification(Verification):
    """The result of :func:`specaccept.verify_tree`: a :class:`Verification` whose rows
    have ``D + 1`` entries (``D`` the deepest path of the batch), and the nodes taken.

    Attributes
    ----------
    accepted_node_ids : ndarray of int64, shape ``[B, D]``
        The node index of each accepted token, then ``-1``: the key-value cache
        entries to keep.
    """

    accepted_node_ids: npt.NDArray[np.int64] | None = None


# The hot path builds results without the frozen dataclass's __init__
# (three object.__setattr__ calls): the slot descriptors set the fields directly.
_new = object.__new__
_set_output_token_ids = Verification.output_token_ids.__set__  # type: ignore[attr-defined]
_set_num_accepted = Verification.num_accepted.__set__  # type: ignore[attr-defined]
_set_num_emitted = Verification.num_emitted.__set__  # type: ignore[attr-defined]


def _verification(
    output_token_ids: npt.NDArray[np.int64],
    num_accepted: npt.NDArray[np.int64],
    num_emitted: npt.NDArray[np.int64],
) -> Verification:
    result = _new(Verification)
    _set_output_token_ids(result, output_token_ids)
    _set_num_accepted(result, num_accepted)
    _set_num_emitted(result, num_emitted)
    return result
