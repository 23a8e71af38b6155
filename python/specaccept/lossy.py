"""The lossy verification methods, as values for ``method=``.

Their output does **not** follow the target distribution: they exist to be
compared with the exact rules (:mod:`specaccept.lab`) and to drive load tests.
A method without parameters is a string (``"token"``, ``"block"``,
``"traversal"``); these carry theirs, checked when they are made, frozen, and
shown as the label the laboratory prints. ``method="typical"`` is a shorthand
for ``Typical()``. The rules are docs/spec.md sections 2.7 and 2.8.

Examples
--------
>>> import numpy as np, specaccept
>>> from specaccept.lossy import Synthetic, Typical
>>> Typical(epsilon=0.05)
typical(epsilon=0.05, delta=0.3)
>>> p = np.full((1, 3, 4), 0.25)
>>> r = specaccept.verify(np.array([[1, 2]]), p, method=Synthetic(rate=1.0), rng=0)
>>> int(r.num_accepted[0])     # a rate of 1 accepts every draft, whatever p and q
2
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from ._errors import InputError

__all__ = ["MAX_RATES", "Synthetic", "Typical"]

#: Per-position synthetic rates at most (one per draft position).
MAX_RATES = 1 << 16


def _number(value: Any, name: str) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.number)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    try:
        return float(value)
    except OverflowError:
        return math.inf


@dataclass(frozen=True, repr=False)
class Typical:
    """Typical acceptance (Cai et al., "Medusa", arXiv 2401.10774): a draft is kept
    while its target probability exceeds ``min(epsilon, delta * exp(-H))``, ``H``
    the target row's entropy (docs/spec.md section 2.7). **Lossy.**

    Parameters
    ----------
    epsilon : float
        The absolute threshold, finite and ``>= 0`` (Medusa's default 0.09).
    delta : float
        The entropy-scaled threshold's factor, finite and ``>= 0`` (default 0.3).
    """

    epsilon: float = 0.09
    delta: float = 0.3
    name: ClassVar[str] = "typical"

    def __post_init__(self) -> None:
        for field in ("epsilon", "delta"):
            number = _number(getattr(self, field), field)
            if not (math.isfinite(number) and number >= 0):
                raise InputError(
                    f"{field} must be a finite number >= 0, got {number!r}", argument=field
                )
            object.__setattr__(self, field, number)

    def __repr__(self) -> str:
        return f"typical(epsilon={self.epsilon:g}, delta={self.delta:g})"


@dataclass(frozen=True, repr=False)
class Synthetic:
    """Synthetic acceptance: draft position ``t`` is accepted iff ``u_t < rate[t]``,
    whatever the probabilities (docs/spec.md section 2.8): a load generator with
    a chosen acceptance rate. **Lossy.**

    Parameters
    ----------
    rate : float or sequence of float
        One rate in ``[0, 1]`` for every position, or one per draft position
        (then as many as the verified ``K``).
    """

    rate: float | tuple[float, ...]
    name: ClassVar[str] = "synthetic"

    def __post_init__(self) -> None:
        rate = self.rate
        if isinstance(rate, np.ndarray) and rate.ndim == 0:
            rate = rate.item()
        if isinstance(rate, (str, bytes)) or isinstance(rate, (bool, np.bool_)):
            raise TypeError(
                f"rate must be a number or a sequence of numbers, got {type(rate).__name__}"
            )
        if isinstance(rate, (Sequence, np.ndarray)):
            if np.ndim(rate) != 1:
                raise TypeError("rate must be a number or a 1-D sequence of numbers")
            if len(rate) > MAX_RATES:
                raise InputError(
                    f"rate has {len(rate)} values: one per draft position, at most {MAX_RATES}",
                    argument="rate",
                )
            values = np.asarray(rate, dtype=object).reshape(-1)
            each = [_number(v, f"rate[{i}]") for i, v in enumerate(values)]
            checked: list[tuple[str, float]] = [(f"rate[{i}]", v) for i, v in enumerate(each)]
            rates: float | tuple[float, ...] = tuple(each)
        else:
            rates = _number(rate, "rate")
            checked = [("rate", rates)]
        for where, value in checked:
            if not 0.0 <= value <= 1.0:
                raise InputError(f"{where} = {value!r}: a rate must lie in [0, 1]", argument="rate")
        object.__setattr__(self, "rate", rates)

    def rates(self, num_draft: int) -> np.ndarray:
        """The rate of each of ``num_draft`` positions, float64 ``[K]``."""
        if isinstance(self.rate, tuple):
            if len(self.rate) != num_draft:
                raise InputError(
                    f"rate has {len(self.rate)} values, one per draft position: the call has "
                    f"K = {num_draft}",
                    argument="method",
                )
            return np.array(self.rate, dtype=np.float64)
        return np.full(num_draft, self.rate, dtype=np.float64)

    def __repr__(self) -> str:
        if isinstance(self.rate, tuple):
            return "synthetic(rate=[" + ", ".join(f"{r:g}" for r in self.rate) + "])"
        return f"synthetic(rate={self.rate:g})"
