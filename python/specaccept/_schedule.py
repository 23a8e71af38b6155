"""How many tokens each request drafts, chosen before every step.

:class:`AdaptiveK` maximises the step's expected emitted tokens per second: each
request's acceptance estimated from what the verifier saw, the step's time fitted
online to what the step computes. :class:`HeuristicK` is transformers' schedule
(``num_assistant_tokens_schedule="heuristic"``). Both only choose how many tokens
are drafted: verification, and so exactness, is untouched. The contract is
docs/spec.md section 13.

A consumer (the generation loop, the vLLM plugin, your own engine) calls, per step:

1. ``choice = schedule.choose(requests, available, padded=...)``: ``choice.k[r]``
   drafts for request ``requests[r]``, at most ``available[r]``;
2. ``schedule.observe(requests, drafted, accepted, ...)`` with what the verifier kept;
3. ``schedule.observe_cost(seconds, target_tokens, draft_forwards)`` with the
   step's wall time (not for a step that also processed prompts);
4. ``schedule.finish(requests)`` for the requests that ended.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ._errors import InputError

__all__ = ["AdaptiveK", "HeuristicK", "KChoice", "KSchedule", "expected_emitted"]

#: A request's acceptance before anything is known about any request.
PRIOR_ACCEPTANCE = 0.5


def expected_emitted(acceptance: float, k: int) -> float:
    """Expected tokens one verification emits for ``k`` drafts accepted each with
    probability ``acceptance`` once the earlier ones are: ``sum_{i=0..k} a^i``."""
    if acceptance >= 1.0:
        return float(k + 1)
    return (1.0 - acceptance ** (k + 1)) / (1.0 - acceptance)


@dataclass(frozen=True)
class KChoice:
    """One step's choice (docs/spec.md section 13.4).

    Attributes
    ----------
    requests : tuple
        The requests of the step, in the consumer's order.
    k : numpy.ndarray
        ``int64 [R]``: tokens each request drafts (``<= available``).
    available : numpy.ndarray
        ``int64 [R]``: the most each request could draft.
    acceptance : numpy.ndarray
        ``float64 [R]``: each request's estimated acceptance the choice used
        (``nan`` for :class:`HeuristicK`).
    expected_tokens : float
        Expected emitted tokens of the step (``nan`` when not modelled).
    predicted_seconds : float
        The step's predicted time (``nan`` while the cost is not yet fitted).
    reason : str
        ``"start"`` (nothing measured yet), ``"probe"`` (a step chosen to measure
        the cost), ``"model"`` (the best modelled choice) or ``"heuristic"``.
    """

    requests: tuple[Any, ...]
    k: np.ndarray
    available: np.ndarray
    acceptance: np.ndarray
    expected_tokens: float
    predicted_seconds: float
    reason: str

    @property
    def width(self) -> int:
        """The widest request's drafts: what a padded backend computes for every row."""
        return int(self.k.max()) if len(self.k) else 0


@runtime_checkable
class KSchedule(Protocol):
    """What a consumer calls (see the module's docstring)."""

    def choose(
        self, requests: Sequence[Any], available: Sequence[int], *, padded: bool = True
    ) -> KChoice: ...

    def observe(
        self,
        requests: Sequence[Any],
        drafted: Sequence[int],
        accepted: Sequence[int],
        *,
        positions: Sequence[float] | None = None,
        acceptances: Sequence[float] | None = None,
    ) -> None: ...

    def observe_cost(self, seconds: float, target_tokens: int, draft_forwards: int = 0) -> None: ...

    def finish(self, requests: Sequence[Any]) -> None: ...


def _count(value: Any, name: str, minimum: int = 0) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int >= {minimum}, got {type(value).__name__}")
    if value < minimum:
        raise InputError(f"{name} must be an int >= {minimum}, got {value}", argument=name)
    return int(value)


def _counts(values: Any, name: str, length: int) -> np.ndarray:
    """A sequence of ``length`` ints ``>= 0`` as ``int64``."""
    if isinstance(values, (str, bytes)) or not isinstance(values, (Sequence, np.ndarray)):
        raise TypeError(f"{name} must be a sequence of ints, got {type(values).__name__}")
    array = np.asarray(values)
    if array.ndim != 1 or (array.size and array.dtype.kind not in "iu"):
        if array.ndim == 1 and array.dtype == object:
            for i, v in enumerate(values):
                _count(v, f"{name}[{i}]")
        raise TypeError(f"{name} must be a 1-D sequence of ints")
    if len(array) != length:
        raise InputError(f"{name} has {len(array)} values for {length} requests", argument=name)
    if array.size and array.min() < 0:
        raise InputError(f"{name} must be >= 0", argument=name)
    return array.astype(np.int64)


def _numbers(values: Any, name: str, length: int) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64) if values is not None else None
    if array is None or array.ndim != 1:
        raise TypeError(f"{name} must be a 1-D sequence of numbers")
    if len(array) != length:
        raise InputError(f"{name} has {len(array)} values for {length} requests", argument=name)
    if not np.isfinite(array).all() or (array < 0).any():
        raise InputError(f"{name} must be finite and >= 0", argument=name)
    return array


def _requests(requests: Any) -> tuple[Any, ...]:
    if isinstance(requests, (str, bytes)) or not isinstance(requests, (Sequence, np.ndarray)):
        raise TypeError(f"requests must be a sequence, got {type(requests).__name__}")
    out = tuple(r.item() if isinstance(r, np.generic) else r for r in requests)
    try:
        if len(set(out)) != len(out):
            raise InputError("requests must be distinct", argument="requests")
    except TypeError:
        raise TypeError("requests must be hashable (request ids)") from None
    return out


@dataclass
class _Acceptance:
    """Discounted pseudo-counts: ``accepted`` of ``positions`` (docs/spec.md 13.2)."""

    accepted: float = 0.0
    positions: float = 0.0

    def add(self, accepted: float, positions: float, keep: float) -> None:
        self.accepted = keep * self.accepted + accepted
        self.positions = keep * self.positions + positions


@dataclass
class AdaptiveK:
    """Chooses each step's drafts to maximise expected emitted tokens per second.

    Before a step, for the requests of the batch, :meth:`choose` weighs each
    candidate choice by its expected emitted tokens (each request's acceptance,
    estimated from the steps it ran) over its predicted time (a line fitted to
    the steps already measured, in the tokens the target computes and the
    drafter's forward calls), and takes the best, ``0`` drafts included when
    drafting cannot pay. A padded backend (every row computes the widest row's
    positions) gets one width for the batch; a ragged one a count per request.
    See docs/spec.md section 13.

    Parameters
    ----------
    max_k : int
        The most tokens a request drafts in one step.
    min_k : int
        The fewest (``0`` lets the schedule turn drafting off).
    start : int, optional
        Drafts per request while nothing is measured (default ``min(2, max_k)``,
        at least ``min_k``).
    memory : float
        How fast acceptance is forgotten: a request's counts are multiplied by
        ``1 - 1/memory`` every step it runs (``inf``: never).
    cost_memory : float
        The same for the step-time fit (per measured step).
    probe_every : int
        Every this many modelled steps, one step drafts 1 more or fewer than the
        model's choice, so that the cost stays measured away from one point
        (``0``: never).
    prior_weight : float
        A request's estimate starts at the pooled estimate of all requests
        with this weight (in positions).

    Examples
    --------
    >>> import specaccept
    >>> schedule = specaccept.AdaptiveK(max_k=8)
    >>> schedule.choose(["a", "b"], [8, 8]).k.tolist()   # nothing measured yet
    [2, 2]
    """

    max_k: int = 8
    min_k: int = 0
    start: int | None = None
    memory: float = 16.0
    cost_memory: float = 32.0
    probe_every: int = 16
    prior_weight: float = 2.0
    _requests: dict[Any, _Acceptance] = field(default_factory=dict, init=False, repr=False)
    _pooled: _Acceptance = field(default_factory=_Acceptance, init=False, repr=False)
    _costs: deque = field(default_factory=lambda: deque(maxlen=256), init=False, repr=False)
    _modelled: int = field(default=0, init=False, repr=False)
    _last_width: int | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.max_k = _count(self.max_k, "max_k")
        self.min_k = _count(self.min_k, "min_k")
        if self.min_k > self.max_k:
            raise InputError(
                f"min_k = {self.min_k} is larger than max_k = {self.max_k}", argument="min_k"
            )
        start = max(min(2, self.max_k), self.min_k) if self.start is None else self.start
        self.start = _count(start, "start")
        if not self.min_k <= self.start <= self.max_k:
            raise InputError(f"start must lie in [min_k, max_k], got {start}", argument="start")
        for name in ("memory", "cost_memory", "prior_weight"):
            value = getattr(self, name)
            if isinstance(value, (bool, np.bool_)) or not isinstance(
                value, (int, float, np.integer, np.floating)
            ):
                raise TypeError(f"{name} must be a number, got {type(value).__name__}")
            if not (value >= 1 if name != "prior_weight" else value > 0) or math.isnan(value):
                raise InputError(
                    f"{name} must be {'>= 1' if name != 'prior_weight' else '> 0'}, got {value}",
                    argument=name,
                )
            setattr(self, name, float(value))
        self.probe_every = _count(self.probe_every, "probe_every")

    # -- acceptance -------------------------------------------------------------

    def acceptance(self, request: Any) -> float:
        """The estimated probability that a draft of ``request`` is accepted once the
        drafts before it are: its discounted accepted positions, plus the pooled
        estimate with weight ``prior_weight``, over its positions plus that weight."""
        pooled = (self._pooled.accepted + PRIOR_ACCEPTANCE) / (self._pooled.positions + 1.0)
        own = self._requests.get(request)
        if own is None:
            return pooled
        w = self.prior_weight
        return (own.accepted + w * pooled) / (own.positions + w)

    def observe(
        self,
        requests: Sequence[Any],
        drafted: Sequence[int],
        accepted: Sequence[int],
        *,
        positions: Sequence[float] | None = None,
        acceptances: Sequence[float] | None = None,
    ) -> None:
        """What one step's verification kept: request ``requests[r]`` drafted
        ``drafted[r]`` and ``accepted[r]`` were accepted. By default a request
        observes ``min(accepted + 1, drafted)`` positions, ``accepted`` of them
        accepted; ``positions`` and ``acceptances`` replace both (the exact
        acceptance probabilities summed, or deterministic drafts compared with what
        was emitted past the verified ones: docs/spec.md section 13.2)."""
        ids = _requests(requests)
        n = len(ids)
        drafted_ = _counts(drafted, "drafted", n)
        accepted_ = _counts(accepted, "accepted", n)
        if (accepted_ > drafted_).any():
            raise InputError("accepted must be <= drafted", argument="accepted")
        if (positions is None) != (acceptances is None):
            raise InputError(
                "positions and acceptances go together",
                argument="positions" if positions is None else "acceptances",
            )
        if positions is None:
            seen = np.minimum(accepted_ + 1, drafted_).astype(np.float64)
            hits = accepted_.astype(np.float64)
        else:
            seen = _numbers(positions, "positions", n)
            hits = _numbers(acceptances, "acceptances", n)
            if (hits > seen + 1e-9).any():
                raise InputError("acceptances must be <= positions", argument="acceptances")
        keep = 1.0 - 1.0 / self.memory
        for request, s, h in zip(ids, seen.tolist(), hits.tolist(), strict=True):
            state = self._requests.setdefault(request, _Acceptance())
            state.add(h, s, keep)
        self._pooled.add(float(hits.sum()), float(seen.sum()), keep)

    def finish(self, requests: Sequence[Any]) -> None:
        """Forget the requests that ended."""
        for request in _requests(requests):
            self._requests.pop(request, None)

    # -- cost -------------------------------------------------------------------

    def observe_cost(self, seconds: float, target_tokens: int, draft_forwards: int = 0) -> None:
        """One measured step: its wall time, the tokens the target computed (padding
        included where the backend pads) and the drafter's forward calls."""
        if isinstance(seconds, (bool, np.bool_)) or not isinstance(
            seconds, (int, float, np.integer, np.floating)
        ):
            raise TypeError(f"seconds must be a number, got {type(seconds).__name__}")
        if not (math.isfinite(seconds) and seconds >= 0):
            raise InputError(f"seconds must be finite and >= 0, got {seconds}", argument="seconds")
        x = _count(target_tokens, "target_tokens")
        f = _count(draft_forwards, "draft_forwards")
        self._costs.append((float(seconds), float(x), float(f)))

    def cost_model(self) -> tuple[float, float, float] | None:
        """``(fixed, per_target_token, per_draft_forward)`` seconds fitted to the
        measured steps (discounted by ``cost_memory``), or ``None`` while the steps
        measured do not tell a fixed cost from a per-token one (fewer than two
        distinct target token counts)."""
        if len(self._costs) < 2:
            return None
        data = np.array(self._costs)
        t, x, f = data[:, 0], data[:, 1], data[:, 2]
        if np.ptp(x) == 0 and np.ptp(f) == 0:
            return None
        keep = 1.0 - 1.0 / self.cost_memory
        w = keep ** np.arange(len(t) - 1, -1, -1, dtype=np.float64)
        design = np.stack([np.ones_like(x), x, f], axis=1)
        return _fit(design, t, w)

    def predict_seconds(self, target_tokens: float, draft_forwards: float) -> float:
        """The fitted step time (``nan`` before a fit)."""
        model = self.cost_model()
        if model is None:
            return math.nan
        return model[0] + model[1] * target_tokens + model[2] * draft_forwards

    # -- the choice -------------------------------------------------------------

    def choose(
        self, requests: Sequence[Any], available: Sequence[int], *, padded: bool = True
    ) -> KChoice:
        """The drafts of each request this step (docs/spec.md section 13.3).

        ``available[r]``: the most request ``requests[r]`` can draft this step (its
        room, or what a deterministic drafter proposed); the choice never exceeds it
        nor ``max_k``. ``padded``: the backend computes the widest row's positions
        for every row (one width for the batch), else each request's own."""
        ids = _requests(requests)
        cap = np.minimum(_counts(available, "available", len(ids)), self.max_k)
        alpha = np.array([self.acceptance(r) for r in ids], dtype=np.float64)
        model = self.cost_model()
        if model is None:
            # Nothing fitted yet: ``start`` drafts, then alternately none and
            # ``start``, until the measured steps differ in what they computed.
            width = self.start if not self._last_width else 0
            k = np.minimum(cap, max(width, self.min_k))
            return self._made(ids, k, cap, alpha, None, "start", padded)
        if padded:
            k = _best_width(alpha, cap, model, self.min_k)
        else:
            k = _best_ragged(alpha, cap, model, self.min_k)
        reason = "model"
        self._modelled += 1
        if self.probe_every and self._modelled % self.probe_every == 0:
            k, reason = self._probe(k, cap, padded), "probe"
        return self._made(ids, k, cap, alpha, model, reason, padded)

    def _probe(self, k: np.ndarray, cap: np.ndarray, padded: bool) -> np.ndarray:
        """The choice moved by 1 draft (up on odd probes, down on even ones, the
        other way where that is blocked), within each request's bounds."""
        up = (self._modelled // self.probe_every) % 2 == 1
        for direction in (1, -1) if up else (-1, 1):
            if padded:
                width = int(k.max()) if len(k) else 0
                moved = np.minimum(cap, np.clip(width + direction, self.min_k, self.max_k))
                moved = np.maximum(moved, np.minimum(cap, self.min_k))
            else:
                moved = np.clip(k + direction, np.minimum(cap, self.min_k), cap)
            if not np.array_equal(moved, k):
                return moved.astype(np.int64)
        return k

    def _made(
        self,
        ids: tuple[Any, ...],
        k: np.ndarray,
        cap: np.ndarray,
        alpha: np.ndarray,
        model: tuple[float, float, float] | None,
        reason: str,
        padded: bool,
    ) -> KChoice:
        k = k.astype(np.int64)
        tokens = float(sum(expected_emitted(a, int(j)) for a, j in zip(alpha, k, strict=True)))
        width = int(k.max()) if len(k) else 0
        seconds = math.nan
        if model is not None:
            computed = len(ids) * (1 + width) if padded else len(ids) + int(k.sum())
            seconds = _seconds(model, computed, width)
        self._last_width = width
        return KChoice(ids, k, cap.astype(np.int64), alpha, tokens, seconds, reason)


def _fit(design: np.ndarray, t: np.ndarray, w: np.ndarray) -> tuple[float, float, float]:
    """Weighted least squares with every coefficient ``>= 0`` (a step has no
    negative fixed cost and never gets cheaper for computing more): of the subsets
    of the three columns whose own fit is non-negative, the one with the least
    residual, a larger subset only where it fits better (so columns that moved
    together, as target tokens and draft forwards do at a constant batch, are
    explained by the first of them: the target's tokens)."""
    best: tuple[float, np.ndarray] | None = None
    better = 1e-9 * float((w * t * t).sum())  # what counts as a better fit
    for columns in ((0,), (1,), (2,), (0, 1), (0, 2), (1, 2), (0, 1, 2)):
        sub = design[:, columns]
        if not sub.any():
            continue
        coef = _solve(sub, t, w)
        if (coef < 0).any():
            continue
        residual = float((w * (t - sub @ coef) ** 2).sum())
        if best is None or residual < best[0] - better:
            full = np.zeros(3)
            full[list(columns)] = coef
            best = (residual, full)
    if best is None:  # every time measured is 0
        return 0.0, 0.0, 0.0
    return float(best[1][0]), float(best[1][1]), float(best[1][2])


def _solve(design: np.ndarray, t: np.ndarray, w: np.ndarray) -> np.ndarray:
    weighted = design * w[:, None]
    gram = design.T @ weighted
    ridge = 1e-9 * np.diag(gram) + 1e-300
    return np.linalg.solve(gram + np.diag(ridge), weighted.T @ t)


def _seconds(model: tuple[float, float, float], target_tokens: float, forwards: float) -> float:
    return model[0] + model[1] * target_tokens + model[2] * forwards


def _best_width(
    alpha: np.ndarray, cap: np.ndarray, model: tuple[float, float, float], min_k: int
) -> np.ndarray:
    """Padded backends: the width ``w`` (each request drafting ``min(w, cap)``)
    with the most expected tokens per predicted second; the smaller on ties."""
    rows = len(alpha)
    best, best_rate = np.minimum(cap, min_k), -math.inf
    top = int(cap.max()) if rows else 0
    for w in range(min(min_k, top), top + 1):
        k = np.minimum(cap, w)
        width = int(k.max()) if rows else 0
        tokens = sum(expected_emitted(a, int(j)) for a, j in zip(alpha, k, strict=True))
        seconds = _seconds(model, rows * (1 + width), width)
        rate = tokens / seconds if seconds > 0 else math.inf
        if rate > best_rate * (1 + 1e-12):
            best, best_rate = k, rate
    return best


def _best_ragged(
    alpha: np.ndarray, cap: np.ndarray, model: tuple[float, float, float], min_k: int
) -> np.ndarray:
    """Ragged backends: drafts added one at a time, each time the one with the
    largest expected gain (request ``r``'s ``j``-th draft adds ``alpha_r^j``); of
    every prefix of that order, the one with the most expected tokens per
    predicted second (the fewest drafts on ties)."""
    rows = len(alpha)
    k = np.minimum(cap, min_k).astype(np.int64)
    tokens = sum(expected_emitted(a, int(j)) for a, j in zip(alpha, k, strict=True))
    gains = [(alpha[r] ** j, r) for r in range(rows) for j in range(int(k[r]) + 1, int(cap[r]) + 1)]
    gains.sort(key=lambda g: -g[0])  # stable: a request's drafts stay in order
    computed = rows + int(k.sum())
    width = int(k.max()) if rows else 0
    seconds = _seconds(model, computed, width)
    best, best_rate = k.copy(), tokens / seconds if seconds > 0 else math.inf
    for gain, r in gains:
        k[r] += 1
        tokens += gain
        computed += 1
        width = max(width, int(k[r]))
        seconds = _seconds(model, computed, width)
        rate = tokens / seconds if seconds > 0 else math.inf
        if rate > best_rate * (1 + 1e-12):
            best, best_rate = k.copy(), rate
    return best


@dataclass
class HeuristicK:
    """transformers' ``num_assistant_tokens_schedule="heuristic"``, per request:
    a request starts at ``start`` drafts; after a step whose drafts were all
    accepted it drafts 2 more, else 1 fewer (never below 1), within ``max_k``.

    Parameters
    ----------
    start : int
        Drafts of a new request (transformers' ``num_assistant_tokens``).
    max_k : int, optional
        A bound on any request's drafts (``None``: none but ``available``).
    """

    start: int = 20
    max_k: int | None = None
    _k: dict[Any, int] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        self.start = _count(self.start, "start")
        if self.max_k is not None:
            self.max_k = _count(self.max_k, "max_k")

    def current(self, request: Any) -> int:
        """The drafts ``request`` asks for next (its available count may cut it)."""
        k = self._k.get(request, self.start)
        return k if self.max_k is None else min(k, self.max_k)

    def choose(
        self, requests: Sequence[Any], available: Sequence[int], *, padded: bool = True
    ) -> KChoice:
        ids = _requests(requests)
        cap = _counts(available, "available", len(ids))
        k = np.array([min(self.current(r), c) for r, c in zip(ids, cap, strict=True)], np.int64)
        nan = np.full(len(ids), np.nan)
        return KChoice(ids, k, cap, nan, math.nan, math.nan, "heuristic")

    def observe(
        self,
        requests: Sequence[Any],
        drafted: Sequence[int],
        accepted: Sequence[int],
        *,
        positions: Sequence[float] | None = None,
        acceptances: Sequence[float] | None = None,
    ) -> None:
        """transformers' rule: all of ``drafted`` accepted (and at least one
        drafted), 2 more; else 1 fewer, at least 1. A request that drafted nothing
        keeps its count."""
        ids = _requests(requests)
        drafted_ = _counts(drafted, "drafted", len(ids))
        accepted_ = _counts(accepted, "accepted", len(ids))
        for request, d, a in zip(ids, drafted_.tolist(), accepted_.tolist(), strict=True):
            if d == 0:
                continue
            k = self._k.get(request, self.start)
            self._k[request] = k + 2 if a == d else max(1, k - 1)

    def observe_cost(self, seconds: float, target_tokens: int, draft_forwards: int = 0) -> None:
        """Not used: the heuristic ignores time."""

    def finish(self, requests: Sequence[Any]) -> None:
        for request in _requests(requests):
            self._k.pop(request, None)
