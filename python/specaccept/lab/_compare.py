"""The verifier laboratory: every chain method on the same drafts, with a number
for each (docs/spec.md section 6.6, docs/methods.md).

:func:`compare_methods` verifies logged steps (drafts and the rows they were
verified against) with each method, on the **same uniforms** (counter-based:
sample ``r`` of step ``s`` uses seed ``seed + r`` at offset ``s`` for every
method), and reports per method:

- the mean number of accepted drafts over the runs, with a confidence interval,
  and the mean tokens per target call (accepted + 1);
- the exact expectation of that mean over the uniforms, where one exists in
  closed form (every method here has one);
- the total-variation distance between the law of the next token the method
  emits (the first emitted token, over the draft's randomness and the uniforms)
  and the target's row ``p_0``: 0 for the lossless methods, in closed form for
  the lossy ones; averaged over the steps, with an interval over them.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from statistics import NormalDist
from typing import Any

import numpy as np
import numpy.typing as npt

from .._api import verify
from .._arrays import float_array, int_array
from .._errors import InputError
from .._options import CHAIN_METHODS
from ..lossy import Synthetic, Typical
from ._expectation import expected_num_accepted

__all__ = ["MethodComparison", "MethodResult", "compare_methods"]

#: The most runs per step and method (an interval's width shrinks as 1 / sqrt:
#: past this it is the steps, not the runs, that limit it).
MAX_SAMPLES = 1_000_000

#: What :func:`compare_methods` runs when ``methods`` is not given.
DEFAULT_METHODS: tuple[str | tuple[str, dict[str, Any]], ...] = ("token", "block", "typical")


@dataclass(frozen=True)
class MethodResult:
    """One method's numbers in a :class:`MethodComparison`.

    Attributes
    ----------
    method : str
        The label: the method and its parameters, e.g. ``"typical(epsilon=0.09, delta=0.3)"``.
    name : str
        ``"token"``, ``"block"``, ``"typical"`` or ``"synthetic"``.
    lossless : bool
        Whether the method's output follows the target exactly.
    mean_accepted, accepted_interval : float, (float, float)
        Mean accepted drafts per step over every run, and its confidence interval.
    expected_accepted : float
        The exact expectation of ``mean_accepted`` over the uniforms, given the drafts.
    tokens_per_call, tokens_interval : float, (float, float)
        ``mean_accepted + 1`` (every step emits one more token), and its interval.
    tv_distance, tv_interval : float, (float, float)
        Mean over the steps of the total-variation distance between the method's
        next-token law and the target's, and the interval of that mean over the
        steps (0 and ``(0, 0)`` for a lossless method).
    """

    method: str
    name: str
    lossless: bool
    mean_accepted: float
    accepted_interval: tuple[float, float]
    expected_accepted: float
    tokens_per_call: float
    tokens_interval: tuple[float, float]
    tv_distance: float
    tv_interval: tuple[float, float]


@dataclass(frozen=True, eq=False)
class AcceptedLengths:
    """How one method's accepted length is spread over ``0..K`` on the compared
    steps: what ``python -m specaccept compare --plot`` draws.

    Attributes
    ----------
    histogram : int array ``[K+1]``
        How many (run, step) pairs accepted ``n`` drafts, ``n = 0..K``: the
        observed law (its mean is ``mean_accepted``).
    drafted : int array ``[K]``
        How many steps drafted position ``i`` (``k_s >= i``), ``i = 1..K``.
    observed_per_position : float array ``[K]``
        The share of (run, step) pairs whose ``i``-th draft was accepted, among
        the steps that drafted it (NaN where none did).
    exact_per_position : float array ``[K]`` or None
        The same share in expectation over the uniforms, exactly: token from
        :func:`expected_num_accepted` (its ``i``-th draft is accepted with
        ``prod_{t<i} a_t`` whatever follows), typical from its one run (it uses no
        uniforms), synthetic ``prod_{t<i} a_t``. ``None`` for block verification,
        whose decision at ``i`` depends on the drafts after ``i``.
    """

    histogram: npt.NDArray[np.int64]
    drafted: npt.NDArray[np.int64]
    observed_per_position: npt.NDArray[np.float64]
    exact_per_position: npt.NDArray[np.float64] | None


@dataclass
class MethodComparison:
    """The result of :func:`compare_methods`: one :class:`MethodResult` per method.

    ``comparison["block"]`` (a label or a name) gives a method's result;
    :meth:`table` a markdown table; :meth:`to_json` and :meth:`to_csv` the same
    numbers as text. ``lengths[label]``: the method's :class:`AcceptedLengths`
    (filled by :func:`compare_methods`; not part of the tables or the JSON).
    """

    results: list[MethodResult]
    steps: int
    samples: int
    confidence: float
    meta: dict[str, Any] = field(default_factory=dict)
    lengths: dict[str, AcceptedLengths] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def __getitem__(self, key: str) -> MethodResult:
        for result in self.results:
            if key in (result.method, result.name):
                return result
        raise KeyError(key)

    def table(self) -> str:
        """A markdown table; lossy methods are marked as such."""
        level = f"{self.confidence:.0%}"
        lines = [
            f"| method | exact? | accepted drafts ({level} CI) | expected | tokens per target call"
            f" | TV to target ({level} CI) |",
            "|---|---|---:|---:|---:|---:|",
        ]
        for r in self.results:
            lines.append(
                f"| {r.method} | {'lossless' if r.lossless else '**lossy**'} "
                f"| {r.mean_accepted:.3f} [{r.accepted_interval[0]:.3f}, "
                f"{r.accepted_interval[1]:.3f}] | {r.expected_accepted:.3f} "
                f"| {r.tokens_per_call:.3f} | {r.tv_distance:.4f} [{r.tv_interval[0]:.4f}, "
                f"{r.tv_interval[1]:.4f}] |"
            )
        return "\n".join(lines)

    def to_dicts(self) -> list[dict[str, Any]]:
        """One flat dict per method (intervals as ``_low``/``_high`` entries)."""
        rows = []
        for r in self.results:
            row: dict[str, Any] = {}
            for key, value in asdict(r).items():
                if isinstance(value, tuple):
                    row[f"{key}_low"], row[f"{key}_high"] = value
                else:
                    row[key] = value
            row.update(steps=self.steps, samples=self.samples, confidence=self.confidence)
            rows.append(row)
        return rows

    def to_json(self) -> str:
        return json.dumps({"meta": self.meta, "results": self.to_dicts()}, indent=2)

    def to_csv(self) -> str:
        rows = self.to_dicts()
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=list(rows[0]) if rows else ["method"])
        writer.writeheader()
        writer.writerows(rows)
        return out.getvalue()


def _method_specs(methods: Any) -> list[tuple[str, Any]]:
    """``methods`` as ``(label, method)`` pairs, checked: a method is ``"token"``,
    ``"block"``, ``"typical"`` (``lossy.Typical()``) or a :mod:`specaccept.lossy`
    value; its label is its name or the value's repr."""
    if isinstance(methods, str) or not isinstance(methods, Sequence) or not methods:
        raise TypeError(
            "methods must be a non-empty sequence of method names or specaccept.lossy values"
        )
    specs: list[tuple[str, Any]] = []
    for item in methods:
        if isinstance(item, (Typical, Synthetic)):
            specs.append((repr(item), item))
            continue
        if not isinstance(item, str):
            raise TypeError(
                f"methods: {item!r:.60} is not a method name or a specaccept.lossy value"
            )
        if item == "typical":
            specs.append((repr(Typical()), Typical()))
        elif item in CHAIN_METHODS:
            specs.append((item, item))
        elif item == "synthetic":
            raise InputError(
                "methods: 'synthetic' needs a rate: specaccept.lossy.Synthetic(rate=...)",
                argument="methods",
            )
        else:
            raise InputError(
                f"methods: {item!r:.40} is not one of {(*CHAIN_METHODS, 'typical')} "
                "or a specaccept.lossy value",
                argument="methods",
            )
    labels = [label for label, _ in specs]
    if len(set(labels)) != len(labels):
        raise InputError("methods: a method is listed twice", argument="methods")
    return specs


def compare_methods(
    draft_token_ids: npt.ArrayLike,
    target_probs: npt.ArrayLike,
    draft_probs: npt.ArrayLike | None = None,
    *,
    methods: Sequence[str | tuple[str, dict[str, Any]]] = DEFAULT_METHODS,
    num_draft_tokens: npt.ArrayLike | None = None,
    samples: int = 100,
    seed: int = 0,
    confidence: float = 0.95,
    progress: Callable[[int, int], None] | None = None,
) -> MethodComparison:
    """Every method on the same logged steps, with the same uniforms: how many drafts
    each accepts, exactly and by simulation, and (lossy methods) what it costs in
    fidelity.

    Each of the ``N`` steps is a row: drafts ``x_t`` sampled from ``draft_probs``
    (``None``: deterministic proposals), scored by ``target_probs``, as
    :func:`verify` takes them. Every method verifies every step ``samples`` times,
    run ``r`` with ``seeds = seed + r`` at ``offsets = step``, so the methods see
    the same uniforms.

    Parameters
    ----------
    draft_token_ids : int array ``[N, K]``
    target_probs : float array ``[N, K+1, V]``
    draft_probs : float array ``[N, K, V]``, optional
        The laws the drafts were sampled from; ``None`` for deterministic drafts.
    methods : sequence of method names or :mod:`specaccept.lossy` values
        ``"token"``, ``"block"`` (lossless), ``"typical"`` (``lossy.Typical()``,
        Medusa's defaults), ``lossy.Typical(epsilon, delta)`` and
        ``lossy.Synthetic(rate)``, all **lossy** but the first two. Default:
        token, block and typical.
    num_draft_tokens : int array ``[N]``, optional
        Drafts per step, as for :func:`verify`.
    samples : int
        Runs per step and method (at least 2, for the intervals).
    seed : int
        The first seed of the runs.
    confidence : float
        The level of the intervals (normal approximation), in ``(0, 1)``.
    progress : callable, optional
        ``progress(done, total)`` after each run.

    Returns
    -------
    MethodComparison

    Notes
    -----
    ``accepted_interval`` is the interval of the mean over the runs around the
    mean over these steps of each step's expectation (within-step variance, so
    ``expected_accepted`` lies in it with the stated probability).
    ``expected_accepted`` is exact: :func:`expected_num_accepted` for token and
    block; typical acceptance decides without the uniforms (one run is its
    expectation); synthetic's is ``sum_{j<=k} prod_{t<j} a_t``.

    The next-token law of a method is the law of the first emitted token over
    the draft ``x_0 ~ q_0`` (``q_0`` one-hot at the logged ``x_0`` for
    deterministic drafts) and the uniforms. It is ``p_0 / sum(p_0)`` exactly for
    token and block verification (TV 0). Typical: ``x`` itself where accepted,
    else a draw from the typical part of ``p_0``; synthetic:
    ``a_0 q_0 + (1 - a_0) p_0``. Both in closed form (NumPy, float64), with the
    interval of their mean over the steps.

    Examples
    --------
    >>> import numpy as np, specaccept
    >>> # The block paper's toy model, each block logged as often as q draws it.
    >>> ids = np.array([[0, 0]] * 4 + [[0, 1]] * 2 + [[1, 0]] * 2 + [[1, 1]])
    >>> p = np.tile([1 / 3, 2 / 3], (9, 3, 1))
    >>> q = np.tile([2 / 3, 1 / 3], (9, 2, 1))
    >>> c = specaccept.lab.compare_methods(ids, p, q, methods=["token", "block"], samples=20)
    >>> [round(c[m].expected_accepted * 9, 6) for m in ("token", "block")]   # 10/9, 11/9
    [10.0, 11.0]
    """
    specs = _method_specs(methods)
    if isinstance(samples, bool) or not isinstance(samples, (int, np.integer)):
        raise TypeError(f"samples must be an int, got {type(samples).__name__}")
    if not 2 <= samples <= MAX_SAMPLES:
        raise InputError(
            f"samples must lie in [2, {MAX_SAMPLES}], got {samples}", argument="samples"
        )
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise InputError(f"seed must be an int >= 0, got {seed!r:.40}", argument="seed")
    if not (isinstance(confidence, (int, float)) and 0 < confidence < 1):
        raise InputError(
            f"confidence must lie in (0, 1), got {confidence!r:.40}", argument="confidence"
        )
    ids = int_array(draft_token_ids, "draft_token_ids")
    p = float_array(target_probs, "target_probs")
    q = None if draft_probs is None else float_array(draft_probs, "draft_probs")
    counts = None if num_draft_tokens is None else int_array(num_draft_tokens, "num_draft_tokens")
    if ids.ndim != 2:
        raise InputError(
            f"draft_token_ids must be 2-D [N, K], got shape {ids.shape}", argument="draft_token_ids"
        )
    steps, num_draft = ids.shape
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    try:
        offsets = np.arange(steps, dtype=np.uint64)
        seeds = np.empty(steps, dtype=np.uint64)
        k_rows = np.full(steps, num_draft) if counts is None else counts.astype(np.int64)
    except MemoryError:
        raise MemoryError(
            f"draft_token_ids: {steps} steps need per-step buffers that cannot be allocated"
        ) from None
    total_runs = len(specs) * int(samples)
    results = []
    lengths: dict[str, AcceptedLengths] = {}
    drafted = (k_rows[None, :] >= np.arange(1, num_draft + 1)[:, None]).sum(axis=1)
    for m, (label, method) in enumerate(specs):
        histogram = np.zeros(num_draft + 1, dtype=np.int64)
        # Per step: the sums of the accepted counts and of their squares (O(N) memory).
        total = np.zeros(steps)
        squares = np.zeros(steps)
        first = np.zeros(steps)
        for r in range(int(samples)):
            seeds.fill(seed + r)
            result = verify(
                ids,
                p,
                q,
                num_draft_tokens=counts,
                seeds=seeds,
                offsets=offsets,
                method=method,
            )
            accepted = result.num_accepted.astype(np.float64)
            if r == 0:
                first = accepted
            total += accepted
            squares += accepted * accepted
            histogram += np.bincount(result.num_accepted, minlength=num_draft + 1)
            if progress is not None:
                progress(m * int(samples) + r + 1, total_runs)
        expected = _expected(method, ids, p, q, counts, k_rows, first)
        lengths[label] = AcceptedLengths(
            histogram=histogram,
            drafted=drafted,
            observed_per_position=_shares(histogram[::-1].cumsum()[::-1][1:], drafted * samples),
            exact_per_position=_exact_per_position(method, ids, p, q, k_rows, drafted, first),
        )
        mean = float(total.sum()) / (steps * samples) if steps else 0.0
        # Within-step variance: the interval of the mean over runs around the
        # mean of the steps' expectations.
        step_means = total / samples
        variances = np.maximum(squares - samples * step_means**2, 0.0) / (samples - 1)
        half = z * math.sqrt(float(variances.sum()) / samples) / steps if steps else 0.0
        tv = _next_token_tv(method, ids, p, q, k_rows)
        tv_half = z * float(tv.std(ddof=1)) / math.sqrt(steps) if steps > 1 else 0.0
        results.append(
            MethodResult(
                method=label,
                name=getattr(method, "name", method),
                lossless=isinstance(method, str),
                mean_accepted=mean,
                accepted_interval=(mean - half, mean + half),
                expected_accepted=float(expected.mean()) if steps else 0.0,
                tokens_per_call=mean + 1,
                tokens_interval=(mean + 1 - half, mean + 1 + half),
                tv_distance=float(tv.mean()) if steps else 0.0,
                tv_interval=(
                    float(tv.mean()) - tv_half if steps else 0.0,
                    float(tv.mean()) + tv_half if steps else 0.0,
                ),
            )
        )
    meta = {"steps": steps, "num_draft": num_draft, "vocab": int(p.shape[-1]), "seed": seed}
    comparison = MethodComparison(results, steps, int(samples), float(confidence), meta)
    comparison.lengths.update(lengths)
    return comparison


def _expected(method, ids, p, q, counts, k_rows, first_run) -> np.ndarray:
    """Each step's exact expectation of the accepted drafts over the uniforms."""
    if isinstance(method, str):
        named: Any = method  # "token" or "block"
        return expected_num_accepted(ids, p, q, method=named, num_draft_tokens=counts)
    if isinstance(method, Typical):
        return first_run  # decided without the uniforms: every run is the expectation
    rates = method.rates(ids.shape[1])
    survive = np.concatenate([[1.0], np.cumprod(rates)])  # P(n >= j) = prod_{t<j} a_t
    cumulative = np.cumsum(survive[1:])  # E[n | k] = sum_{j=1..k} P(n >= j)
    return np.array([cumulative[k - 1] if k > 0 else 0.0 for k in k_rows])


def _shares(numerators: np.ndarray, denominators: np.ndarray) -> npt.NDArray[np.float64]:
    """``numerators / denominators``, NaN where a denominator is 0."""
    out = np.full(len(denominators), np.nan)
    np.divide(numerators, denominators, out=out, where=denominators > 0)
    return out


def _exact_per_position(
    method: Any,
    ids: np.ndarray,
    p: np.ndarray,
    q: np.ndarray | None,
    k_rows: np.ndarray,
    drafted: np.ndarray,
    first_run: np.ndarray,
) -> npt.NDArray[np.float64] | None:
    """For ``i = 1..K``, the mean over the steps that drafted position ``i`` of the
    probability that its draft is accepted; ``None`` where no closed form is kept
    (block: the decision at ``i`` depends on the later drafts)."""
    num_draft = ids.shape[1]
    positions = np.arange(1, num_draft + 1)
    live = k_rows[None, :] >= positions[:, None]  # [K, N]: step s drafted position i
    if method == "token":
        # E[n | first i drafts] - E[n | first i - 1] = prod_{t<i} a_t: the token rule
        # decides position t from the first t + 1 drafts alone.
        expected = [
            expected_num_accepted(ids, p, q, method="token", num_draft_tokens=np.minimum(k_rows, i))
            for i in range(num_draft + 1)
        ]
        reached = np.stack([expected[i] - expected[i - 1] for i in positions])
    elif isinstance(method, Typical):
        reached = (first_run[None, :] >= positions[:, None]).astype(np.float64)
    elif isinstance(method, Synthetic):
        survive = np.cumprod(method.rates(num_draft))  # P(n >= i) = prod_{t<i} a_t
        reached = np.broadcast_to(survive[:, None], live.shape)
    else:
        return None
    return _shares(np.where(live, reached, 0.0).sum(axis=1), drafted)


def _next_token_tv(method, ids, p, q, k_rows) -> np.ndarray:
    """Per step, TV between the method's first-token law and ``p_0 / sum(p_0)``."""
    steps, vocab = ids.shape[0], p.shape[-1]
    tv = np.zeros(steps)
    if isinstance(method, str):
        return tv  # lossless
    for s in range(steps):
        p0 = np.asarray(p[s, 0], dtype=np.float64)
        p0 = p0 / p0.sum()
        if k_rows[s] == 0:
            law = _typical_part(p0, method) if isinstance(method, Typical) else p0
        else:
            if q is None:
                q0 = np.zeros(vocab)
                q0[int(ids[s, 0])] = 1.0
            else:
                q0 = np.asarray(q[s, 0], dtype=np.float64)
                q0 = q0 / q0.sum()
            if isinstance(method, Typical):
                kept = p0 > _typical_threshold(p0, method)
                stay = float(q0[kept].sum())
                law = np.where(kept, q0, 0.0) + (1.0 - stay) * _typical_part(p0, method)
            else:
                a0 = float(method.rates(ids.shape[1])[0])
                law = a0 * q0 + (1.0 - a0) * p0
        tv[s] = 0.5 * float(np.abs(law - p0).sum())
    return tv


def _typical_threshold(p0: np.ndarray, method: Typical) -> float:
    nonzero = p0[(p0 > 0) & (p0 < 1)]
    entropy = float(-(nonzero * np.log(nonzero)).sum())
    return min(method.epsilon, method.delta * math.exp(-entropy))


def _typical_part(p0: np.ndarray, method: Typical) -> np.ndarray:
    """``p0`` without its entries below the typical threshold, renormalised."""
    part = np.where(p0 >= _typical_threshold(p0, method), p0, 0.0)
    return part / part.sum() if part.sum() > 0 else p0
