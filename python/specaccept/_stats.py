"""Acceptance statistics of a serving run, and the closed forms that use them.

A serving engine tunes ``K`` (drafted tokens per step) from how often drafts are
accepted. :class:`AcceptanceStats` accumulates what each :func:`~specaccept.verify`
step kept; the closed forms of Leviathan et al., "Fast Inference from Transformers
via Speculative Decoding" (ICML 2023), turn a per-token acceptance probability
``a`` into the expected tokens per step, the walltime improvement, and the best
``K``. :func:`~specaccept.acceptance_rate` gives ``a`` analytically from the two
distributions; :attr:`AcceptanceStats.alpha` estimates it from a run.
"""

from __future__ import annotations

import json
import math
import sys
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np

from ._errors import InputError

__all__ = [
    "AcceptanceStats",
    "best_num_draft_tokens",
    "expected_speedup",
    "expected_tokens_per_step",
]


def _check_rate(a: float, name: str = "a") -> float:
    if isinstance(a, (bool, np.bool_)) or not isinstance(a, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a number in [0, 1], got {type(a).__name__}")
    if isinstance(a, (int, np.integer)) and not 0 <= a <= 1:
        # Compared as an int: a huge one has no float.
        raise InputError(f"{name} must lie in [0, 1], got {a}", argument=name)
    a = float(a)
    if not 0.0 <= a <= 1.0:
        raise InputError(f"{name} must lie in [0, 1], got {a}", argument=name)
    return a


def _check_count(k: int, name: str) -> int:
    if isinstance(k, (bool, np.bool_)) or not isinstance(k, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(k).__name__}")
    if k < 0:
        raise InputError(f"{name} must be >= 0, got {k}", argument=name)
    return int(k)


def _check_cost(c: float) -> float:
    if isinstance(c, (bool, np.bool_)) or not isinstance(c, (int, float, np.integer, np.floating)):
        raise TypeError(f"c must be a number (a cost ratio >= 0), got {type(c).__name__}")
    if isinstance(c, (int, np.integer)) and not 0 <= c <= sys.float_info.max:
        raise InputError(f"c must be a finite cost ratio >= 0, got {c}", argument="c")
    c = float(c)
    if not (c >= 0.0 and math.isfinite(c)):
        raise InputError(f"c must be a finite cost ratio >= 0, got {c}", argument="c")
    return c


# a ** n for a float a < 1 is 0.0 from n = 2**64 on (a <= 1 - 2**-53, so
# a ** 2**64 <= exp(-2048)): exponents are capped there, so a huge int k needs
# no float conversion.
_EXPONENT_CAP = 2**64


def _tokens(a: float, k: int) -> float | int:
    """``(1 - a^(k+1)) / (1 - a)``; the exact int ``k + 1`` when ``a == 1``."""
    if a == 1.0:
        return k + 1
    return (1.0 - a ** min(k + 1, _EXPONENT_CAP)) / (1.0 - a)


def _as_float(value: float | int | Fraction, name: str, got: int) -> float:
    try:
        return float(value)
    except OverflowError:
        raise InputError(
            f"{name} = {got} is too large: the result does not fit a float", argument=name
        ) from None


def _speedup(a: float, k: int, c: float) -> float:
    """:func:`expected_speedup` of checked arguments."""
    tokens = _tokens(a, k)
    if k < 2**53:
        denominator = k * c + 1.0
        if math.isfinite(denominator):
            return float(tokens) / denominator
    # k * c + 1 past what a float holds (or k past 2**53): exactly, rounded once.
    return _as_float(Fraction(tokens) / (Fraction(c) * k + 1), "k", k)


def expected_tokens_per_step(a: float, k: int) -> float:
    """Expected tokens emitted by one verification step: ``(1 - a^(k+1)) / (1 - a)``.

    ``a`` is the probability that a drafted token is accepted (independently per
    position), ``k`` the number of drafted tokens. Includes the replacement or
    bonus token, so it is between 1 (``a = 0``) and ``k + 1`` (``a = 1``).

    Examples
    --------
    >>> import specaccept
    >>> specaccept.expected_tokens_per_step(0.5, 1), specaccept.expected_tokens_per_step(1.0, 4)
    (1.5, 5.0)
    """
    a, k = _check_rate(a), _check_count(k, "k")
    return _as_float(_tokens(a, k), "k", k)


def expected_speedup(a: float, k: int, c: float) -> float:
    """Expected walltime improvement of speculative decoding over plain decoding.

    ``(1 - a^(k+1)) / ((1 - a) (k c + 1))`` (Leviathan et al., 2023, Theorem 3.8):
    one step costs ``k`` draft calls and one target call, ``c`` being the cost of a
    draft call relative to a target call, and emits
    :func:`expected_tokens_per_step` tokens. Values below 1 mean a slowdown.

    Examples
    --------
    >>> import specaccept
    >>> round(specaccept.expected_speedup(0.8, 4, 0.05), 4)   # 3.3616 tokens for 1.2 calls
    2.8013
    """
    c = _check_cost(c)
    a, k = _check_rate(a), _check_count(k, "k")
    return _speedup(a, k, c)


# Up to this max_k every k is evaluated; past it the answer is found by bisection.
_EXHAUSTIVE_MAX_K = 4096
# Past the exhaustive range, the neighbours of the continuous optimum compared
# in float (the objective is flat there to rounding).
_WINDOW = 64


def best_num_draft_tokens(a: float, c: float, max_k: int = 64) -> int:
    """The ``k`` in ``0..max_k`` with the largest :func:`expected_speedup` (smallest on ties).

    ``0`` means speculation does not pay: plain decoding is faster. Up to
    ``max_k = 4096`` every ``k`` is compared; past it the speedup's single peak
    (it rises, then falls, in ``k``) is found by bisection, so any ``max_k``
    answers in microseconds.

    Examples
    --------
    >>> import specaccept
    >>> specaccept.best_num_draft_tokens(0.8, 0.05), specaccept.best_num_draft_tokens(0.1, 0.5)
    (8, 0)
    """
    c = _check_cost(c)
    a = _check_rate(a)
    max_k = _check_count(max_k, "max_k")
    if max_k <= _EXHAUSTIVE_MAX_K:
        return _argmax(a, c, range(max_k + 1))
    if a == 1.0:  # (k + 1) / (k c + 1): rises for c < 1, constant at c = 1, falls past it
        return max_k if c < 1.0 else 0
    if a == 0.0 or c >= 1.0:  # nothing beats k = 0: each draft costs at least what it adds
        return 0
    if c == 0.0:
        # Drafts are free: the speedup only rises, to its float maximum; the
        # first k that reaches it.
        top = _speedup(a, max_k, c)
        return _bisect(lambda k: _speedup(a, k, c) >= top, 0, max_k)
    # 0 < a < 1, 0 < c < 1: the speedup rises while
    # c (a^-(k+1) - 1) < -ln(a) (1 + k c) (its log-derivative is positive), then
    # falls. The last rising k is found by bisection (k <= 2**64 always: past
    # it a^-(k+1) overflows), then its neighbours are compared in float.
    rate = -math.log(a)

    def rising(k: int) -> bool:
        exponent = rate * (k + 1)
        return exponent < 709.0 and c * math.expm1(exponent) < rate * (1.0 + k * c)

    high = min(max_k, _EXPONENT_CAP)
    last_rising = _bisect(lambda k: not rising(k), 0, high) - 1
    low = max(0, last_rising - _WINDOW)
    return _argmax(a, c, [0, *range(low, min(max_k, last_rising + _WINDOW) + 1)])


def _argmax(a: float, c: float, ks: Any) -> int:
    """The ``k`` of ``ks`` (increasing) with the largest speedup, the first on ties."""
    best_k, best = 0, -math.inf
    for k in ks:
        value = _speedup(a, k, c)
        if value > best:
            best_k, best = k, value
    return best_k


def _bisect(done: Any, low: int, high: int) -> int:
    """The smallest ``k`` in ``[low, high]`` with ``done(k)`` (``high + 1`` if none);
    ``done`` is false, then true."""
    high += 1
    while low < high:
        middle = (low + high) // 2
        if done(middle):
            high = middle
        else:
            low = middle + 1
    return low


def _counts(x: Any, name: str) -> np.ndarray:
    from ._arrays import as_numpy

    arr = np.asarray(as_numpy(x, name))
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integers, got {arr.dtype}")
    return arr.astype(np.int64, copy=False)


def _padded_sum(a: list[int], b: list[int]) -> list[int]:
    n = max(len(a), len(b))
    return [(a[i] if i < len(a) else 0) + (b[i] if i < len(b) else 0) for i in range(n)]


# Counts are totals of int64 arrays: a value past this is corrupt, not a count.
_MAX_COUNT = 2**63 - 1
_TOTALS = (
    "num_steps",
    "total_draft_tokens",
    "num_accepted_tokens",
    "num_emitted_tokens",
    "num_tried_tokens",
)
_LISTS = ("drafted_per_position", "accepted_per_position", "accepted_length_histogram")
# Keys an older version wrote, by the current name.
_OLD_KEYS = {"total_draft_tokens": "num_draft_tokens"}


def _count(value: Any, name: str) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"AcceptanceStats: {name} must be an int, got {type(value).__name__}")
    if not 0 <= value <= _MAX_COUNT:
        raise InputError(
            f"AcceptanceStats: {name} = {value} is outside [0, 2**63 - 1]", argument=name
        )
    return int(value)


def _count_list(values: Any, name: str) -> list[int]:
    if not isinstance(values, (list, tuple)):
        raise TypeError(
            f"AcceptanceStats: {name} must be a list of ints, got {type(values).__name__}"
        )
    out = []
    for i, value in enumerate(values):
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            raise TypeError(
                f"AcceptanceStats: {name}[{i}] must be an int, got {type(value).__name__}"
            )
        if not 0 <= value <= _MAX_COUNT:
            raise InputError(
                f"AcceptanceStats: {name}[{i}] = {value} is outside [0, 2**63 - 1]",
                argument=name,
                index=(i,),
            )
        out.append(int(value))
    return out


@dataclass
class AcceptanceStats:
    """What verification steps kept, accumulated row by row (one row = one sequence-step).

    Feed it every result with :meth:`update`; combine workers with :meth:`merge`
    (or ``+``); store it with :meth:`to_dict` / :meth:`to_json`. Every count is
    checked when the statistics are built (a wrong type is a ``TypeError``, a
    negative count or lists of mismatched lengths an
    :class:`~specaccept.InputError`), so a corrupt dict never loads.

    Attributes
    ----------
    num_steps : int
        Rows verified (vLLM's ``num_drafts``).
    total_draft_tokens : int
        Drafted tokens, ``sum(k_b)`` over every row (stored as
        ``"num_draft_tokens"`` before version 0.2; that key still loads).
    num_accepted_tokens : int
        Accepted drafts, ``sum(n_b)``.
    num_emitted_tokens : int
        Tokens emitted, ``sum(n_b + 1)`` (accepted drafts plus the replacement or bonus).
    num_tried_tokens : int
        Drafts whose acceptance test ran: the accepted ones plus the rejected one
        of each row that rejected (later drafts are never tested).
    drafted_per_position : list of int
        Entry ``t``: rows that drafted a token at position ``t`` (``k_b > t``).
    accepted_per_position : list of int
        Entry ``t``: rows whose token at position ``t`` was accepted (``n_b > t``).
    accepted_length_histogram : list of int
        Entry ``n``: rows with exactly ``n`` accepted drafts.

    Examples
    --------
    >>> import numpy as np, specaccept
    >>> stats = specaccept.AcceptanceStats()
    >>> r = specaccept.verify_greedy(np.array([[3, 4, 5], [3, 4, 5]]),
    ...                              np.array([[3, 4, 5, 6], [3, 8, 5, 6]]))
    >>> stats.update(r)
    >>> stats.num_accepted_tokens, stats.accepted_length_histogram, stats.mean_emitted_tokens
    (4, [0, 1, 0, 1], 3.0)
    """

    num_steps: int = 0
    total_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_emitted_tokens: int = 0
    num_tried_tokens: int = 0
    drafted_per_position: list[int] = field(default_factory=list)
    accepted_per_position: list[int] = field(default_factory=list)
    accepted_length_histogram: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        for name in _TOTALS:
            setattr(self, name, _count(getattr(self, name), name))
        for name in _LISTS:
            setattr(self, name, _count_list(getattr(self, name), name))
        positions = len(self.drafted_per_position)
        if len(self.accepted_per_position) != positions:
            raise InputError(
                f"AcceptanceStats: accepted_per_position has {len(self.accepted_per_position)} "
                f"entries, drafted_per_position {positions}: one per draft position each",
                argument="accepted_per_position",
            )
        histogram = len(self.accepted_length_histogram)
        if histogram != (positions + 1 if positions or histogram else 0):
            raise InputError(
                f"AcceptanceStats: accepted_length_histogram has {histogram} entries, "
                f"expected {positions + 1} (accepted lengths 0..{positions})",
                argument="accepted_length_histogram",
            )

    @property
    def num_draft_tokens(self) -> int:
        """Deprecated name of :attr:`total_draft_tokens` (``num_draft_tokens`` is
        the per-row ``[B]`` array everywhere else)."""
        warnings.warn(
            "AcceptanceStats.num_draft_tokens is renamed total_draft_tokens",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.total_draft_tokens

    def update(self, result: Any, num_draft_tokens: Any = None) -> None:
        """Add one verification step: a :class:`~specaccept.Verification` (NumPy or
        ``like=`` arrays) and the draft counts it was called with (``None``: ``K``
        for every row, ``K`` from ``result.output_token_ids``).

        Rows set aside by ``errors="isolate"`` (``result.errors``) were not
        verified and are left out. A refused step (``TypeError``, ``ValueError``)
        leaves the statistics as they were.
        """
        if not (hasattr(result, "num_accepted") and hasattr(result, "output_token_ids")):
            raise TypeError(
                "result must be a Verification (num_accepted and output_token_ids), "
                f"got {type(result).__name__}"
            )
        accepted = _counts(result.num_accepted, "result.num_accepted")
        ids = np.asarray(_counts(result.output_token_ids, "result.output_token_ids"))
        if accepted.ndim != 1 or ids.ndim != 2 or ids.shape[0] != accepted.shape[0]:
            raise InputError(
                "result: expected num_accepted [B] and output_token_ids [B, K+1]",
                argument="result",
            )
        if ids.shape[1] == 0:
            raise InputError(
                "result.output_token_ids: has 0 columns, expected K+1 >= 1",
                argument="result.output_token_ids",
            )
        batch, num_draft = accepted.shape[0], ids.shape[1] - 1
        if num_draft_tokens is None:
            drafts = np.full(batch, num_draft, dtype=np.int64)
        else:
            drafts = _counts(num_draft_tokens, "num_draft_tokens")
            if drafts.shape != (batch,):
                raise InputError(
                    f"num_draft_tokens: has shape {drafts.shape}, expected ({batch},)",
                    argument="num_draft_tokens",
                )
        rows = np.arange(batch)
        isolated = [b for b in getattr(result, "errors", None) or () if isinstance(b, int)]
        if isolated:
            rows = np.setdiff1d(rows, isolated)
            accepted, drafts, batch = accepted[rows], drafts[rows], len(rows)
        bad = (accepted < 0) | (accepted > drafts) | (drafts > num_draft)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            b = int(rows[i])
            raise InputError(
                "num_accepted and num_draft_tokens must satisfy 0 <= n_b <= k_b <= K",
                argument="num_draft_tokens" if drafts[i] > num_draft else "result.num_accepted",
                index=(b,),
                row=b,
            )
        positions = np.arange(num_draft)
        accepted_sum = int(accepted.sum())
        drafted = (drafts[:, None] > positions).sum(axis=0).tolist()
        kept = (accepted[:, None] > positions).sum(axis=0).tolist()
        histogram = np.bincount(accepted, minlength=num_draft + 1).tolist()
        self.num_steps += batch
        self.total_draft_tokens += int(drafts.sum())
        self.num_accepted_tokens += accepted_sum
        self.num_emitted_tokens += accepted_sum + batch
        self.num_tried_tokens += accepted_sum + int((accepted < drafts).sum())
        self.drafted_per_position = _padded_sum(self.drafted_per_position, drafted)
        self.accepted_per_position = _padded_sum(self.accepted_per_position, kept)
        self.accepted_length_histogram = _padded_sum(self.accepted_length_histogram, histogram)

    # --- derived rates ----------------------------------------------------------------

    @property
    def acceptance_rate(self) -> float:
        """Accepted drafts / drafted tokens (vLLM's draft acceptance rate); NaN before any draft."""
        return (
            self.num_accepted_tokens / self.total_draft_tokens
            if self.total_draft_tokens
            else math.nan
        )

    @property
    def alpha(self) -> float:
        """Estimate of the per-token acceptance probability ``a``: accepted / tried.

        Under independent acceptance with probability ``a`` at every position, each
        tried draft is a Bernoulli(``a``) trial, so this is the maximum-likelihood
        estimate, the value to pass to :func:`expected_tokens_per_step`.
        """
        return (
            self.num_accepted_tokens / self.num_tried_tokens if self.num_tried_tokens else math.nan
        )

    @property
    def position_acceptance_rate(self) -> list[float]:
        """Entry ``t``: rows accepting position ``t`` / rows that drafted it."""
        return [
            a / d if d else math.nan
            for a, d in zip(self.accepted_per_position, self.drafted_per_position, strict=True)
        ]

    @property
    def mean_accepted_length(self) -> float:
        """Accepted drafts per row: ``mean(n_b)``."""
        return self.num_accepted_tokens / self.num_steps if self.num_steps else math.nan

    @property
    def mean_emitted_tokens(self) -> float:
        """Tokens emitted per row: ``mean(n_b + 1)`` (vLLM's and SGLang's "acceptance length")."""
        return self.num_emitted_tokens / self.num_steps if self.num_steps else math.nan

    # --- combining and storing --------------------------------------------------------

    def merge(self, other: AcceptanceStats) -> AcceptanceStats:
        """The statistics of both runs (e.g. two workers); neither operand changes."""
        if not isinstance(other, AcceptanceStats):
            raise TypeError(f"can only merge AcceptanceStats, got {type(other).__name__}")
        return AcceptanceStats(
            num_steps=self.num_steps + other.num_steps,
            total_draft_tokens=self.total_draft_tokens + other.total_draft_tokens,
            num_accepted_tokens=self.num_accepted_tokens + other.num_accepted_tokens,
            num_emitted_tokens=self.num_emitted_tokens + other.num_emitted_tokens,
            num_tried_tokens=self.num_tried_tokens + other.num_tried_tokens,
            drafted_per_position=_padded_sum(self.drafted_per_position, other.drafted_per_position),
            accepted_per_position=_padded_sum(
                self.accepted_per_position, other.accepted_per_position
            ),
            accepted_length_histogram=_padded_sum(
                self.accepted_length_histogram, other.accepted_length_histogram
            ),
        )

    def __add__(self, other: AcceptanceStats) -> AcceptanceStats:
        return self.merge(other)

    def to_dict(self) -> dict[str, Any]:
        """The counts as plain ``int`` and ``list`` (JSON-ready); rates are derived."""
        return {
            "num_steps": self.num_steps,
            "total_draft_tokens": self.total_draft_tokens,
            "num_accepted_tokens": self.num_accepted_tokens,
            "num_emitted_tokens": self.num_emitted_tokens,
            "num_tried_tokens": self.num_tried_tokens,
            "drafted_per_position": list(self.drafted_per_position),
            "accepted_per_position": list(self.accepted_per_position),
            "accepted_length_histogram": list(self.accepted_length_histogram),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AcceptanceStats:
        """The inverse of :meth:`to_dict` (also reads the old key ``"num_draft_tokens"``).

        A corrupt dict is refused by name: a missing key or a bad count is a
        ``ValueError`` (:class:`~specaccept.InputError`), a wrong type a ``TypeError``.
        """
        if not isinstance(data, Mapping):
            raise TypeError(
                f"AcceptanceStats.from_dict: expected a dict, got {type(data).__name__}"
            )
        fields = cls().to_dict().keys()
        values = {}
        for k in fields:
            if k in data:
                values[k] = data[k]
            elif _OLD_KEYS.get(k) in data:
                values[k] = data[_OLD_KEYS[k]]
        missing = [k for k in fields if k not in values]
        if missing:
            raise InputError(
                f"AcceptanceStats.from_dict: missing {', '.join(missing)}", argument=missing[0]
            )
        return cls(**values)

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_json(cls, text: str | bytes) -> AcceptanceStats:
        """The inverse of :meth:`to_json`: :meth:`from_dict` of the parsed text."""
        if not isinstance(text, (str, bytes, bytearray)):
            raise TypeError(f"AcceptanceStats.from_json: expected a str, got {type(text).__name__}")
        try:
            data = json.loads(text)
        except RecursionError:
            raise InputError(
                "AcceptanceStats.from_json: the JSON nests too deeply", argument="text"
            ) from None
        except ValueError as error:  # not JSON, not UTF-8, or a number past int's digits
            raise InputError(
                f"AcceptanceStats.from_json: text is not JSON of the statistics: {error}",
                argument="text",
            ) from error
        return cls.from_dict(data)

    def summary(self) -> dict[str, Any]:
        """The counts and the derived rates, for logging."""
        return {
            **self.to_dict(),
            "acceptance_rate": self.acceptance_rate,
            "alpha": self.alpha,
            "position_acceptance_rate": self.position_acceptance_rate,
            "mean_accepted_length": self.mean_accepted_length,
            "mean_emitted_tokens": self.mean_emitted_tokens,
        }
