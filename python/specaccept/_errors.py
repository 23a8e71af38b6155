"""The exception a serving loop can act on: which argument is bad, and where.

Every bad input that specaccept reports as a ``ValueError`` (from the native core,
the Python layer or :mod:`specaccept.reference`) is an :class:`InputError`: a
``ValueError`` subclass that also carries the argument's name, the index of the
bad value, and the batch row (request) it belongs to, so an engine can drop or
retry one request instead of the whole step. See docs/spec.md section 5.
"""

from __future__ import annotations

from typing import Any

__all__ = ["InputError"]


class InputError(ValueError):
    """A bad argument: a wrong shape, or a value outside its domain.

    Attributes
    ----------
    argument : str or None
        The argument's name as the API spells it (``"target_probs"``,
        ``"num_draft_tokens"``, ``"out.num_accepted"``, ...).
    index : tuple of int or None
        The index of the bad value within ``argument``; ``None`` for a shape
        error or a scalar argument.
    row : int or None
        The batch row (request) the bad value belongs to; ``None`` when the
        error is about the batch as a whole (a shape). In vLLM's flat layout
        ``index`` counts drafts across requests, while ``row`` is the request.

    Examples
    --------
    >>> import numpy as np, specaccept
    >>> try:
    ...     specaccept.verify(np.array([[0], [7]]), np.full((2, 2, 4), 0.25), rng=0)
    ... except specaccept.InputError as e:
    ...     print(e.argument, e.index, e.row)
    draft_token_ids (1, 0) 1
    """

    argument: str | None
    index: tuple[int, ...] | None
    row: int | None

    def __init__(
        self,
        message: str,
        argument: str | None = None,
        index: Any = None,
        row: int | None = None,
    ) -> None:
        super().__init__(message)
        self.argument = argument
        self.index = None if index is None else tuple(int(i) for i in index)
        self.row = None if row is None else int(row)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.argument, self.index, self.row))
