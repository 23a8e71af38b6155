"""The result type of chain verification."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np
import numpy.typing as npt

from ._errors import InputError

__all__ = ["TreeVerification", "Verification", "finish", "finish_tree"]


#: No isolated rows: the ``errors`` of every result verified without a bad row.
_NO_ERRORS: Mapping[int, InputError] = MappingProxyType({})


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
    errors : mapping of int to InputError
        The rows set aside by ``errors="isolate"``, each with its error; such a
        row's tokens are ``-1`` and its counts 0. Empty otherwise.

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
    errors: Mapping[int, InputError] = field(default_factory=lambda: _NO_ERRORS, kw_only=True)

    @property
    def batch_size(self) -> int:
        """``B``, the number of rows."""
        shape = getattr(self.num_accepted, "shape", None)
        if not isinstance(shape, tuple) or len(shape) != 1:
            raise TypeError(
                "num_accepted must be an array of shape [B], got "
                f"{type(self.num_accepted).__name__} of shape {shape!r:.40}"
            )
        return int(shape[0])

    def tokens(self, row: int) -> npt.NDArray[np.int64]:
        """The emitted tokens of ``row`` (a view of ``output_token_ids``, no padding).

        ``row`` is an int in ``[-B, B)`` (negative rows count from the end).
        """
        if isinstance(row, (bool, np.bool_)) or not isinstance(row, (int, np.integer)):
            raise TypeError(f"row must be an int, got {type(row).__name__}")
        batch = self.batch_size
        if not -batch <= int(row) < batch:
            raise InputError(f"row {int(row)} is outside [0, B) with B = {batch}", argument="row")
        b = int(row) % batch
        shape = getattr(self.output_token_ids, "shape", None)
        if not isinstance(shape, tuple) or len(shape) != 2 or int(shape[0]) != batch:
            raise TypeError(
                f"output_token_ids must be an array of shape [B, K+1] with B = {batch}, got "
                f"{type(self.output_token_ids).__name__} of shape {shape!r:.40}"
            )
        n = _count(self.num_emitted, b, batch)
        if not 0 <= n <= int(shape[1]):
            raise InputError(
                f"num_emitted[{b}] = {n} is outside [0, K+1] with K+1 = {int(shape[1])}",
                argument="num_emitted",
                index=(b,),
                row=b,
            )
        return self.output_token_ids[b, :n]

    def to_lists(self) -> list[list[int]]:
        """The emitted tokens of every row, as Python lists."""
        return [self.tokens(b).tolist() for b in range(self.batch_size)]

    @classmethod
    def empty(cls, batch_size: int, num_draft: int) -> Verification:
        """Buffers for ``B`` rows of ``K`` drafts, to pass as ``out=`` in a decoding loop.

        A size that cannot be an array dimension is an :class:`~specaccept.InputError`;
        buffers this process cannot allocate are a ``MemoryError`` naming the argument.

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
                raise InputError(f"{name} must be >= 0, got {value}", argument=name)
        batch, width = int(batch_size), int(num_draft) + 1
        for name, extent, what in (
            ("batch_size", batch, "B"),
            ("num_draft", width, "K + 1"),
        ):
            if extent > _MAX_BYTES:
                raise InputError(
                    f"{name} = {int(batch_size if name == 'batch_size' else num_draft)}: "
                    f"{what} = {extent} is larger than the largest array dimension "
                    f"({_MAX_BYTES})",
                    argument=name,
                )
        # The [B] counts, then output_token_ids [B, K+1]: the first that does not
        # fit names the argument its size comes from.
        if batch * 8 > _MAX_BYTES:
            raise _too_large("batch_size", batch)
        if batch * width * 8 > _MAX_BYTES:
            raise _too_large("num_draft", batch * width, batch_size=batch)
        try:
            num_accepted = np.zeros(batch, dtype=np.int64)
            num_emitted = np.zeros(batch, dtype=np.int64)
        except MemoryError:
            raise _too_large("batch_size", batch) from None
        try:
            output_token_ids = np.full((batch, width), -1, dtype=np.int64)
        except MemoryError:
            raise _too_large("num_draft", batch * width, batch_size=batch) from None
        return cls(output_token_ids, num_accepted, num_emitted)


# The most bytes (and so the largest extent) one NumPy array can describe.
_MAX_BYTES = sys.maxsize


def _too_large(argument: str, values: int, batch_size: int | None = None) -> MemoryError:
    size, unit = float(values * 8), "bytes"
    for larger in ("KiB", "MiB", "GiB", "TiB", "PiB", "EiB"):
        if size < 1024.0:
            break
        size, unit = size / 1024.0, larger
    shown = f"{int(size)} bytes" if unit == "bytes" else f"{size:.1f} {unit}"
    rows = "" if batch_size is None else f" (batch_size = {batch_size})"
    return MemoryError(
        f"{argument}: needs a buffer of {values} values ({shown}){rows}, which cannot be allocated"
    )


def _count(counts: Any, b: int, batch: int) -> int:
    """``counts[b]`` as an int (``counts`` a [B] array of any framework)."""
    shape = getattr(counts, "shape", None)
    if not isinstance(shape, tuple) or len(shape) != 1 or int(shape[0]) != batch:
        raise TypeError(
            f"num_emitted must be an array of shape [B] with B = {batch}, got "
            f"{type(counts).__name__} of shape {shape!r:.40}"
        )
    value = counts[b]
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):
        raise TypeError(
            f"num_emitted must hold integers, got {type(value).__name__} at row {b}"
        ) from None


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
_set_output_token_ids = Verification.output_token_ids.__set__  # type: ignore[attr-defined, misc]
_set_num_accepted = Verification.num_accepted.__set__  # type: ignore[attr-defined, misc]
_set_num_emitted = Verification.num_emitted.__set__  # type: ignore[attr-defined, misc]
_set_errors = Verification.errors.__set__  # type: ignore[attr-defined, misc]


def _verification(
    output_token_ids: npt.NDArray[np.int64],
    num_accepted: npt.NDArray[np.int64],
    num_emitted: npt.NDArray[np.int64],
    errors: Mapping[int, InputError] | None = None,
) -> Verification:
    result = _new(Verification)
    _set_output_token_ids(result, output_token_ids)
    _set_num_accepted(result, num_accepted)
    _set_num_emitted(result, num_emitted)
    _set_errors(result, MappingProxyType(errors) if errors else _NO_ERRORS)
    return result


def finish(result: tuple[Any, ...], convert: Any) -> Verification:
    """The native result as a :class:`Verification`; a fourth item lists the
    isolated rows as ``(row, InputError)``."""
    if convert is None and len(result) == 3:
        return _verification(*result)  # the serving loop's case, first
    ids, accepted, emitted = result[:3]
    if convert is not None:
        ids, accepted, emitted = convert(ids), convert(accepted), convert(emitted)
    bad = dict(result[3]) if len(result) == 4 else None
    return _verification(ids, accepted, emitted, errors=bad)


def finish_tree(result: tuple[Any, ...], convert: Any) -> TreeVerification:
    """The native tree result as a :class:`TreeVerification`; a fifth item lists
    the isolated rows as ``(row, InputError)``."""
    arrays = result[:4]
    if convert is not None:
        arrays = tuple(convert(a) for a in arrays)
    bad = dict(result[4]) if len(result) == 5 and result[4] else None
    return TreeVerification(*arrays, errors=MappingProxyType(bad) if bad else _NO_ERRORS)
