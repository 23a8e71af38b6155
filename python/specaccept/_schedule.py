"""How many tokens each request drafts, chosen before every step.

:class:`AdaptiveK` maximises the step's expected emitted tokens per second (or,
for a fixed batch, the rate at which it finishes): each request's acceptance per
draft depth estimated from what the verifier saw, the step's time fitted online
to what the step computes. :class:`HeuristicK` is transformers' schedule
(``num_assistant_tokens_schedule="heuristic"``). Both only choose how many tokens
are drafted: verification, and so exactness, is untouched. The contract is
docs/spec.md section 13.

A consumer (the generation loop, the vLLM plugin, your own engine) calls, per step:

1. ``choice = schedule.choose(requests, available, padded=..., remaining=...)``:
   ``choice.k[r]`` drafts for request ``requests[r]``, at most ``available[r]``;
2. ``schedule.observe(requests, drafted, accepted, ...)`` with what the verifier kept;
3. ``schedule.observe_cost(seconds, target_tokens, draft_forwards)`` with the
   step's wall time (not for a step that also processed prompts);
4. ``schedule.finish(requests)`` for the requests that ended.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np

from . import _native
from ._checks import check_int
from ._errors import InputError

__all__ = ["MAX_K", "AdaptiveK", "HeuristicK", "KChoice", "KSchedule"]

#: A request's acceptance before anything is known about any request.
PRIOR_ACCEPTANCE = 0.5
#: The largest ``max_k`` of :class:`AdaptiveK` (it keeps counts per draft depth).
MAX_K = 4096
#: A probe is made only when its predicted worth is at least this share of the choice's.
PROBE_WORTH = 0.9
#: The measured steps the cost is fitted to (the most recent).
COST_STEPS = 256


class StepCost(Protocol):
    """A fitted step time (``_native.StepCost``, or the reference's)."""

    @property
    def coef(self) -> tuple[float, float, float]: ...

    def seconds(self, target_tokens: float, draft_forwards: float) -> float: ...


class _Steps:
    """The last ``size`` measured steps' seconds, target tokens and draft
    forwards, in three ring buffers."""

    def __init__(self, size: int):
        self.data = np.zeros((3, size))
        self.count = 0  # steps measured (the next one is written at count % size)

    def append(self, seconds: float, target_tokens: float, draft_forwards: float) -> None:
        self.data[:, self.count % self.data.shape[1]] = (seconds, target_tokens, draft_forwards)
        self.count += 1

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(t, x, f)``, oldest first, each contiguous."""
        size = self.data.shape[1]
        if self.count <= size:
            part = self.data[:, : self.count]
        else:
            head = self.count % size
            part = np.concatenate((self.data[:, head:], self.data[:, :head]), axis=1)
        return part[0], part[1], part[2]


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
        ``float64 [R, max_k]``: each request's estimated acceptance per draft
        depth, as the choice used (``[R, 0]`` for :class:`HeuristicK`).
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
        self,
        requests: Sequence[Any],
        available: Sequence[int],
        *,
        padded: bool = True,
        remaining: Sequence[int] | None = None,
    ) -> KChoice: ...

    def observe(
        self,
        requests: Sequence[Any],
        drafted: Sequence[int],
        accepted: Sequence[int],
        *,
        acceptances: Sequence[Sequence[float] | None] | None = None,
    ) -> None: ...

    def observe_cost(self, seconds: float, target_tokens: int, draft_forwards: int = 0) -> None: ...

    def finish(self, requests: Sequence[Any]) -> None: ...


def _counts(values: Any, name: str, length: int) -> np.ndarray:
    """A sequence of ``length`` ints ``>= 0`` as ``int64``."""
    if isinstance(values, (str, bytes)) or not isinstance(values, (Sequence, np.ndarray)):
        raise TypeError(f"{name} must be a sequence of ints, got {type(values).__name__}")
    array = np.asarray(values)
    if array.ndim != 1 or (array.size and array.dtype.kind not in "iu"):
        if array.ndim == 1 and array.dtype == object:
            for i, v in enumerate(values):
                check_int(v, f"{name}[{i}]")
            raise InputError(f"{name} must be < 2**63", argument=name)
        raise TypeError(f"{name} must be a 1-D sequence of ints")
    if array.dtype.kind == "u" and array.size and array.max() > np.iinfo(np.int64).max:
        raise InputError(f"{name} must be < 2**63", argument=name)
    if len(array) != length:
        raise InputError(f"{name} has {len(array)} values for {length} requests", argument=name)
    if array.size and array.min() < 0:
        raise InputError(f"{name} must be >= 0", argument=name)
    return array.astype(np.int64)


def _amount(value: Any, name: str) -> float:
    """A finite number ``>= 0`` as a float."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(
        value, (int, float, np.integer, np.floating)
    ):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    try:
        out = float(value)
    except OverflowError:
        raise InputError(f"{name} is too large, got {value}", argument=name) from None
    if not (math.isfinite(out) and out >= 0):
        raise InputError(f"{name} must be finite and >= 0, got {value}", argument=name)
    return out


def _probabilities(values: Any, name: str, rows: int) -> list[np.ndarray | None]:
    """One sequence of probabilities per request, or ``None`` (its counts)."""
    if isinstance(values, (str, bytes)) or not isinstance(values, (Sequence, np.ndarray)):
        raise TypeError(f"{name} must be a sequence of sequences of numbers")
    if len(values) != rows:
        raise InputError(f"{name} has {len(values)} rows for {rows} requests", argument=name)
    out: list[np.ndarray | None] = []
    for r, row in enumerate(values):
        if row is None:
            out.append(None)
            continue
        if isinstance(row, (str, bytes)):
            raise TypeError(f"{name}[{r}] must be a sequence of numbers")
        try:
            array = np.asarray(row, dtype=np.float64)
        except (TypeError, ValueError):
            raise TypeError(f"{name}[{r}] must be a sequence of numbers") from None
        if array.ndim != 1:
            raise TypeError(f"{name}[{r}] must be a 1-D sequence of numbers")
        if not ((array >= 0) & (array <= 1)).all():
            raise InputError(f"{name}[{r}] must lie in [0, 1]", argument=name)
        out.append(array)
    return out


def _observation(
    requests: Any, drafted: Any, accepted: Any
) -> tuple[tuple[Any, ...], np.ndarray, np.ndarray]:
    """``observe``'s request ids and counts, checked (``accepted <= drafted``)."""
    ids = _requests(requests)
    drafted_ = _counts(drafted, "drafted", len(ids))
    accepted_ = _counts(accepted, "accepted", len(ids))
    if (accepted_ > drafted_).any():
        raise InputError("accepted must be <= drafted", argument="accepted")
    return ids, drafted_, accepted_


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
    """Discounted pseudo-counts per draft depth: ``accepted[i]`` of ``tried[i]``
    drafts at depth ``i`` (docs/spec.md section 13.2)."""

    accepted: np.ndarray
    tried: np.ndarray

    @classmethod
    def empty(cls, depths: int) -> _Acceptance:
        return cls(np.zeros(depths), np.zeros(depths))

    def add(self, accepted: np.ndarray, tried: np.ndarray, keep: float) -> None:
        self.accepted *= keep
        self.tried *= keep
        self.accepted += accepted
        self.tried += tried


class _Table:
    """Every request's :class:`_Acceptance`, one row each of two arrays (so that a
    step's requests are updated and read at once); row 0 stays zeros: a request
    never observed."""

    def __init__(self, depths: int):
        self.counts = _Acceptance(np.zeros((8, depths)), np.zeros((8, depths)))
        self.rows: dict[Any, int] = {}
        self.free = list(range(7, 0, -1))

    def rows_of(self, ids: tuple[Any, ...], *, add: bool = False) -> np.ndarray:
        """The requests' rows (``add``: new requests given one, else row 0)."""
        if add:
            for request in ids:
                if request not in self.rows:
                    if not self.free:
                        self._grow()
                    self.rows[request] = self.free.pop()
        return np.fromiter((self.rows.get(r, 0) for r in ids), np.intp, len(ids))

    def _grow(self) -> None:
        size, depths = self.counts.accepted.shape
        for name in ("accepted", "tried"):
            grown = np.zeros((2 * size, depths))
            grown[:size] = getattr(self.counts, name)
            setattr(self.counts, name, grown)
        self.free = list(range(2 * size - 1, size - 1, -1))

    def add(self, rows: np.ndarray, hits: np.ndarray, tried: np.ndarray, keep: float) -> None:
        """Each row's counts discounted by ``keep``, then the step's added."""
        part = _Acceptance(self.counts.accepted[rows], self.counts.tried[rows])
        part.add(hits, tried, keep)
        self.counts.accepted[rows], self.counts.tried[rows] = part.accepted, part.tried

    def forget(self, ids: tuple[Any, ...]) -> None:
        for request in ids:
            row = self.rows.pop(request, None)
            if row is not None:
                self.counts.accepted[row] = self.counts.tried[row] = 0.0
                self.free.append(row)


@dataclass(eq=False)
class AdaptiveK:
    """Chooses each step's drafts to maximise expected emitted tokens per second.

    Before a step, for the requests of the batch, :meth:`choose` weighs each
    candidate choice by its expected emitted tokens (each request's acceptance
    per draft depth, estimated from the steps it ran) over its predicted time (a
    line fitted to the steps already measured, in the tokens the target computes
    and the drafter's forward calls, corrected where a point was measured), and
    takes the best, ``0`` drafts included when drafting cannot pay. Given each
    request's ``remaining`` tokens (a fixed batch, run to its end), it weighs the
    rate at which the slowest request finishes instead. A padded backend (every
    row computes the widest row's positions) gets one width for the batch; a
    ragged one a count per request. See docs/spec.md section 13.

    Parameters
    ----------
    max_k : int
        The most tokens a request drafts in one step.
    min_k : int
        The fewest (``0`` lets the schedule turn drafting off).
    start : int, optional
        Drafts per request while nothing is measured (default ``max_k // 2``, at
        least ``min_k``): the first steps alternate ``start`` and none, two points
        far enough apart to fit the cost.
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
        A request's estimate at each depth starts at the pooled estimate of all
        requests with this weight (in drafts).

    Examples
    --------
    >>> import specaccept
    >>> schedule = specaccept.AdaptiveK(max_k=8)
    >>> schedule.choose(["a", "b"], [8, 8]).k.tolist()   # nothing measured yet
    [4, 4]
    >>> schedule.observe(["a", "b"], [4, 4], [2, 0])      # "a" kept 2 of 4
    >>> schedule.acceptance("a")[:3].round(2).tolist()   # per draft depth
    [0.67, 0.78, 0.52]
    """

    max_k: int = 8
    min_k: int = 0
    start: int | None = None
    memory: float = 16.0
    cost_memory: float = 32.0
    probe_every: int = 16
    prior_weight: float = 2.0
    _requests: _Table = field(init=False, repr=False)
    _pooled: _Acceptance = field(init=False, repr=False)
    _steps: _Steps = field(default_factory=lambda: _Steps(COST_STEPS), init=False, repr=False)
    _modelled: int = field(default=0, init=False, repr=False)
    _last_width: int | None = field(default=None, init=False, repr=False)
    _fitted: StepCost | None = field(default=None, init=False, repr=False)
    #: What computes the numbers: the native ``acceptance_rows``, ``fit_step_cost``,
    #: ``best_width`` and ``best_ragged`` (``specaccept.reference.AdaptiveK``: the
    #: same in NumPy).
    _kernels: ClassVar[Any] = _native

    def __post_init__(self) -> None:
        self.max_k = check_int(self.max_k, "max_k")
        if self.max_k > MAX_K:
            raise InputError(f"max_k must be <= {MAX_K}, got {self.max_k}", argument="max_k")
        self.min_k = check_int(self.min_k, "min_k")
        if self.min_k > self.max_k:
            raise InputError(
                f"min_k = {self.min_k} is larger than max_k = {self.max_k}", argument="min_k"
            )
        start = max(self.max_k // 2, self.min_k) if self.start is None else self.start
        self.start = check_int(start, "start")
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
        self.probe_every = check_int(self.probe_every, "probe_every")
        self._pooled = _Acceptance.empty(1)  # depth 0: a new request's prior
        self._requests = _Table(self.max_k)

    # -- acceptance -------------------------------------------------------------

    def pooled(self) -> float:
        """The acceptance of a first draft over all requests: their discounted
        counts at depth 0, with 0.5 as a prior of weight 1."""
        return float((self._pooled.accepted[0] + PRIOR_ACCEPTANCE) / (self._pooled.tried[0] + 1.0))

    def acceptance(self, request: Any) -> np.ndarray:
        """The estimated probability, per draft depth ``i`` (``[max_k]``), that a
        draft of ``request`` at depth ``i`` is accepted once the drafts before it
        are: its discounted counts at that depth, plus a prior of weight
        ``prior_weight``: the pooled estimate at depth 0, the request's own
        estimate at depth ``i - 1`` deeper (docs/spec.md section 13.2)."""
        return self._estimates((request,))[0][0]

    def observe(
        self,
        requests: Sequence[Any],
        drafted: Sequence[int],
        accepted: Sequence[int],
        *,
        acceptances: Sequence[Sequence[float] | None] | None = None,
    ) -> None:
        """What one step's verification kept: request ``requests[r]`` drafted
        ``drafted[r]`` and ``accepted[r]`` were accepted. Depths ``0 ..
        accepted - 1`` count as tried and accepted, depth ``accepted`` (when
        ``accepted < drafted``) as tried and rejected. With ``acceptances``,
        ``acceptances[r][i]`` for each depth ``i`` observed (any number of them,
        past ``max_k`` ignored) replaces that for request ``r`` (``None``: its
        counts): the probability that the draft at depth ``i`` is accepted once the
        ones before it are (the exact one where the rows are seen, or 0 and 1
        where it was observed), each depth counted as tried once (docs/spec.md
        section 13.2)."""
        ids, drafted_, accepted_ = _observation(requests, drafted, accepted)
        n = len(ids)
        exact = None if acceptances is None else _probabilities(acceptances, "acceptances", n)
        keep = 1.0 - 1.0 / self.memory
        depths = np.arange(self.max_k)
        tried = (depths[None, :] < np.minimum(accepted_ + 1, drafted_)[:, None]).astype(float)
        hits = (depths[None, :] < accepted_[:, None]).astype(np.float64)
        for r, row in enumerate(exact or ()):
            if row is not None:
                seen = min(len(row), self.max_k)
                tried[r], hits[r] = 0.0, 0.0
                tried[r, :seen], hits[r, :seen] = 1.0, row[:seen]
        self._requests.add(self._requests.rows_of(ids, add=True), hits, tried, keep)
        first = (hits[:, 0].sum(), tried[:, 0].sum()) if self.max_k else (0.0, 0.0)
        self._pooled.add(np.array([first[0]]), np.array([first[1]]), keep)

    def finish(self, requests: Sequence[Any]) -> None:
        """Forget the requests that ended."""
        self._requests.forget(_requests(requests))

    # -- cost -------------------------------------------------------------------

    def observe_cost(self, seconds: float, target_tokens: int, draft_forwards: int = 0) -> None:
        """One measured step: its wall time, the tokens the target computed (padding
        included where the backend pads) and the drafter's forward calls."""
        t = _amount(seconds, "seconds")
        x = check_int(target_tokens, "target_tokens")
        f = check_int(draft_forwards, "draft_forwards")
        self._steps.append(t, float(x), float(f))
        self._fitted = None

    def cost_model(self) -> tuple[float, float, float] | None:
        """``(fixed, per_target_token, per_draft_forward)`` seconds fitted to the
        measured steps (discounted by ``cost_memory``, then one Huber reweighting),
        or ``None`` while the steps measured do not tell a fixed cost from a
        per-token one (fewer than two distinct target token counts)."""
        cost = self._cost()
        return None if cost is None else cost.coef

    def _cost(self) -> StepCost | None:
        """The fitted line, and each measured ``(target tokens, draft forwards)``
        point's own correction to it (docs/spec.md section 13.3; computed by
        ``_kernels.fit_step_cost``)."""
        if self._fitted is None:
            t, x, f = self._steps.arrays()
            self._fitted = self._kernels.fit_step_cost(t, x, f, 1.0 - 1.0 / self.cost_memory)
        return self._fitted

    def predict_seconds(self, target_tokens: float, draft_forwards: float) -> float:
        """The predicted step time (``nan`` before a fit) of a step computing
        ``target_tokens`` and ``draft_forwards`` (finite numbers ``>= 0``)."""
        x = _amount(target_tokens, "target_tokens")
        f = _amount(draft_forwards, "draft_forwards")
        cost = self._cost()
        return math.nan if cost is None else cost.seconds(x, f)

    def __getstate__(self) -> dict[str, Any]:
        """For pickle and copy: the fitted cost is a cache (refitted on use)."""
        return {**self.__dict__, "_fitted": None}

    # -- the choice -------------------------------------------------------------

    def choose(
        self,
        requests: Sequence[Any],
        available: Sequence[int],
        *,
        padded: bool = True,
        remaining: Sequence[int] | None = None,
    ) -> KChoice:
        """The drafts of each request this step (docs/spec.md section 13.3).

        ``available[r]``: the most request ``requests[r]`` can draft this step (its
        room, or what a deterministic drafter proposed); the choice never exceeds it
        nor ``max_k``. ``padded``: the backend computes the widest row's positions
        for every row (one width for the batch), else each request's own.
        ``remaining``: with a fixed batch run to its end (no request joins), the
        tokens each request may still emit (each ``>= 1``): the choice then
        maximises the rate at which the batch finishes, not the step's tokens per
        second."""
        ids = _requests(requests)
        cap = np.minimum(_counts(available, "available", len(ids)), self.max_k)
        left = None
        if remaining is not None:
            left = _counts(remaining, "remaining", len(ids))
            if left.size and left.min() < 1:
                raise InputError("remaining must be >= 1", argument="remaining")
        alpha, reach, cumulative = self._estimates(ids)
        model = self._cost()
        if model is None:
            # Nothing fitted yet: ``start`` drafts, then alternately none and
            # ``start``, until the measured steps differ in what they computed.
            width = (self.start or 0) if not self._last_width else 0
            k = np.minimum(cap, max(width, self.min_k))
            return self._made(ids, k, cap, alpha, cumulative, None, "start", padded)

        def worth(choice: np.ndarray) -> float:
            return _worth(cumulative, choice, model, padded, left)

        remaining_ = None if left is None else left.astype(np.float64)
        if padded:
            k = self._kernels.best_width(model, cumulative, cap, self.min_k, remaining_)
        else:
            k = self._kernels.best_ragged(model, reach, cumulative, cap, self.min_k, remaining_)
        reason = "model"
        self._modelled += 1
        if self.probe_every and self._modelled % self.probe_every == 0:
            # A probe that the model expects to cost more than a tenth of the
            # step's worth is not made (drafts far too dear teach nothing useful).
            probe = self._probe(k, cap, padded)
            if worth(probe) >= PROBE_WORTH * worth(k):
                k, reason = probe, "probe"
        return self._made(ids, k, cap, alpha, cumulative, model, reason, padded)

    def _estimates(self, ids: tuple[Any, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Each request's acceptance per depth ``[R, max_k]`` (section 13.2's
        recurrence), the expected tokens each draft adds and their running sum
        (``[R, max_k + 1]`` each; ``_kernels.acceptance_rows``)."""
        rows = self._requests.rows_of(ids)
        counts = self._requests.counts
        return self._kernels.acceptance_rows(
            counts.accepted[rows], counts.tried[rows], self.pooled(), self.prior_weight
        )

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
        cumulative: np.ndarray,
        model: StepCost | None,
        reason: str,
        padded: bool,
    ) -> KChoice:
        k = k.astype(np.int64)
        tokens = float(_emitted(cumulative, k).sum())
        target_tokens, width = _computed(k, padded)
        seconds = math.nan if model is None else model.seconds(target_tokens, width)
        self._last_width = width
        return KChoice(ids, k, cap.astype(np.int64), alpha, tokens, seconds, reason)


def _emitted(cumulative: np.ndarray, k: np.ndarray) -> np.ndarray:
    """Each request's expected emitted tokens with ``k[r]`` drafts: ``sum_{j <= k}
    reach[r, j]``, from ``cumulative = cumsum(reach, axis=1)``."""
    if not len(k):
        return np.zeros(0)
    return cumulative[np.arange(len(k)), k]


def _computed(k: np.ndarray, padded: bool) -> tuple[int, int]:
    """What a choice makes the step compute: target tokens (every row padded to
    the widest where the backend pads) and draft forward calls (the widest)."""
    width = int(k.max()) if len(k) else 0
    return (len(k) * (1 + width) if padded else len(k) + int(k.sum())), width


def _worth(
    cumulative: np.ndarray,
    k: np.ndarray,
    model: StepCost,
    padded: bool,
    remaining: np.ndarray | None,
) -> float:
    """What a choice is worth: its expected tokens per predicted second, or, with
    ``remaining``, the fraction of the slowest request's remaining tokens it
    expects to emit per predicted second (``min_r E_r / remaining_r`` over the
    time: the rate at which the batch finishes)."""
    emitted = _emitted(cumulative, k)
    value = (
        float(emitted.sum())
        if remaining is None
        else float(np.min(emitted / remaining, initial=math.inf))
    )
    seconds = model.seconds(*_computed(k, padded))
    return value / seconds if seconds > 0 else math.inf


@dataclass(eq=False)
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
        self.start = check_int(self.start, "start")
        if self.max_k is not None:
            self.max_k = check_int(self.max_k, "max_k")

    def current(self, request: Any) -> int:
        """The drafts ``request`` asks for next (its available count may cut it)."""
        k = self._k.get(request, self.start)
        return k if self.max_k is None else min(k, self.max_k)

    def choose(
        self,
        requests: Sequence[Any],
        available: Sequence[int],
        *,
        padded: bool = True,
        remaining: Sequence[int] | None = None,
    ) -> KChoice:
        """Each request's current count, cut by ``available`` (``padded`` and
        ``remaining`` are not used)."""
        ids = _requests(requests)
        cap = _counts(available, "available", len(ids))
        k = np.array([min(self.current(r), c) for r, c in zip(ids, cap, strict=True)], np.int64)
        none = np.zeros((len(ids), 0))
        return KChoice(ids, k, cap, none, math.nan, math.nan, "heuristic")

    def observe(
        self,
        requests: Sequence[Any],
        drafted: Sequence[int],
        accepted: Sequence[int],
        *,
        acceptances: Sequence[Sequence[float] | None] | None = None,
    ) -> None:
        """transformers' rule: all of ``drafted`` accepted (and at least one
        drafted), 2 more; else 1 fewer, at least 1. A request that drafted nothing
        keeps its count."""
        ids, drafted_, accepted_ = _observation(requests, drafted, accepted)
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
