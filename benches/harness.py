"""Benchmark suite for ``specaccept.verify``: against its peers and against the memory floor.

Run after ``pip install .`` (a release build), from a checkout::

    python benches/bench_verify.py                 # full run: a few minutes on 2 cores
    python benches/bench_verify.py --quick         # seconds: small shapes
    python benches/bench_verify.py --quick --budget 0.01 --out /tmp/bench.json   # CI smoke
    python benches/bench_verify.py --markdown --plot benches/results/verify.png

or from anywhere: ``python -m specaccept bench`` (quick; ``--full`` for the full run).

Options: ``--budget S`` seconds of samples per measurement (default 1.0, 0.05 with
``--quick``); ``--out FILE.json`` where the results go, with the CSV next to it (same stem,
``.csv``; default ``benches/results/verify.json``, or a file in the temp directory with
``--quick`` so that a smoke run never replaces a full one); ``--markdown`` prints the table
again as a GitHub markdown table; ``--plot FILE.png`` sweeps the batch size and plots time
per call against it (needs matplotlib, otherwise it says so and goes on without the plot).

Regimes (float32, draft probabilities given, shapes ``(B, K, V)`` in ``SHAPES``):

* ``reject``: every row is rejected at position 0, so one residual row pair
  ``max(0, p[b, 0] - q[b, 0])`` is read and sampled per row;
* ``accept``: every draft is accepted, so the bonus row ``p[b, K]`` is read and sampled;
* ``greedy``: ``verify(..., greedy=True)`` with drafts equal to the argmax, so all
  ``K + 1`` target rows are scanned for their argmax;
* ``verify_greedy (ids)``: ``verify_greedy`` on precomputed argmax ids; no probabilities.

The bench checks that each regime holds (``num_accepted`` all 0 or all ``K``) and that every
peer agrees with specaccept on ``num_accepted`` (tokens may differ by summation order).

Columns, all medians per call of the whole Python call, measured in one run so that the
ratios are comparable even on a noisy machine:

* ``ours 1t`` / ``ours Nt``: specaccept with one thread and with all ``N`` cores
  (``specaccept.set_num_threads``; a single ``ours`` column where that is missing);
* ``numpy``: the vectorised NumPy way (the common peer baseline, one thread): the residual
  over all ``[B, K, V]`` then inverse-CDF sampling; argmax over ``[B, K+1, V]`` for greedy;
* ``torch``: PyTorch on CPU (its default thread count), written the way HF transformers'
  ``_speculative_sampling`` and vLLM's rejection sampler write it; only when ``import torch``
  works (torch is never a dependency);
* ``reference``: the pure-Python ``specaccept.reference``, at ``B = 1`` only;
* ``floor 1t`` / ``floor Nt``: the bytes the regime must read divided by this machine's read
  bandwidth, measured in the same run as the fastest large NumPy reduction over a 512 MiB
  array (128 MiB with ``--quick``; far beyond the caches): on one thread, and on ``N`` Python threads reducing
  disjoint slices at once (NumPy releases the GIL in reductions). Bytes per batch row,
  float32: ``reject`` 2 gathered values + ``2 V``; ``accept`` ``2 K`` gathered + ``V``;
  ``greedy`` ``(K + 1) V``; ``verify_greedy (ids)`` ``2 K + 1`` int64 ids.

Reading the ratios: ``1t/floor`` = ours 1t / floor 1t and ``Nt/floor`` = ours Nt / floor Nt
say how close specaccept gets to reading its bytes at the speed of a NumPy reduction (1.0 is
the floor; per-call overhead dominates when few bytes are read). ``numpy/ours`` = numpy /
ours 1t is the speed-up over NumPy, both on one thread. At ``B = 1`` the working set fits in
cache and repeated calls read it from there, so the DRAM floor is not a bound and the ratio
can fall below 1.
"""

from __future__ import annotations

import argparse
import csv
import gc
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import specaccept
from specaccept import reference

try:
    import torch
except Exception:  # ImportError, or a broken install (OSError from a missing library)
    torch = None  # type: ignore[assignment]

Tensor = Any  # torch.Tensor when torch is importable

SHAPES = [(1, 5, 32000), (1, 5, 128256), (64, 5, 128256), (256, 8, 151936)]
QUICK_SHAPES = [(1, 5, 32000), (8, 5, 32000)]
REGIMES = ("reject", "accept", "greedy", "verify_greedy (ids)")
SWEEP_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128)
SWEEP_K, SWEEP_V, QUICK_SWEEP_V = 5, 128256, 4096
BANDWIDTH_BYTES, QUICK_BANDWIDTH_BYTES = 512 << 20, 128 << 20
PROB_BYTES, ID_BYTES = 4, 8  # float32 probabilities, int64 ids
HAS_THREAD_API = hasattr(specaccept, "set_num_threads") and hasattr(specaccept, "get_num_threads")
ALL_THREADS = os.cpu_count() or 1
FIELDS = [
    "B",
    "K",
    "V",
    "regime",
    "specaccept_1t_s",
    "specaccept_all_s",
    "specaccept_s",
    "numpy_s",
    "torch_s",
    "reference_s",
    "bytes_read",
    "floor_1t_s",
    "floor_all_s",
    "ours_1t_over_floor_1t",
    "ours_all_over_floor_all",
    "numpy_over_ours",
]

Row = dict[str, Any]


# --------------------------------------------------------------------------
# Peers: the same algorithm as NumPy and PyTorch users write it.
# --------------------------------------------------------------------------


def numpy_verify(
    ids: np.ndarray, p: np.ndarray, q: np.ndarray, u: np.ndarray, ru: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Vectorised NumPy: residual over all ``[B, K, V]``, then inverse-CDF sampling."""
    batch, num_draft = ids.shape
    rows = np.arange(batch)
    p_x = np.take_along_axis(p[:, :num_draft], ids[..., None], -1)[..., 0].astype(np.float64)
    q_x = np.take_along_axis(q, ids[..., None], -1)[..., 0].astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        accept = (p_x > 0) & ((q_x <= p_x) | (u < p_x / q_x))
    n = np.where(accept.all(axis=1), num_draft, np.argmin(accept, axis=1))
    residual = np.maximum(p[:, :num_draft] - q, 0)
    rejected = (n < num_draft)[:, None]
    dist = np.where(rejected, residual[rows, np.minimum(n, num_draft - 1)], p[:, num_draft])
    cdf = np.cumsum(dist, axis=1, dtype=np.float64)
    token = np.minimum((cdf <= ru[:, None] * cdf[:, -1:]).sum(axis=1), p.shape[2] - 1)
    out = np.full((batch, num_draft + 1), -1, dtype=np.int64)
    keep = np.arange(num_draft) < n[:, None]
    out[:, :num_draft][keep] = ids[keep]
    out[rows, n] = token
    return out, n


def numpy_verify_greedy_ids(ids: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Greedy from argmax ids: compare, accepted prefix, emit the targets up to it."""
    num_draft = ids.shape[1]
    match = ids == targets[:, :num_draft]
    n = np.where(match.all(axis=1), num_draft, np.argmin(match, axis=1))
    out = np.where(np.arange(num_draft + 1) <= n[:, None], targets, -1)
    return out, n


def numpy_verify_greedy(ids: np.ndarray, p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Greedy from probabilities: argmax over all ``[B, K+1, V]``, then as from ids."""
    return numpy_verify_greedy_ids(ids, np.argmax(p, axis=-1))


def torch_verify(ids: Tensor, p: Tensor, q: Tensor, u: Tensor, ru: Tensor) -> tuple[Tensor, Tensor]:
    """PyTorch as HF's ``_speculative_sampling`` / vLLM's rejection sampler write it."""
    batch, num_draft = ids.shape
    rows = torch.arange(batch)
    p_draft = p[:, :num_draft]
    p_x = p_draft.gather(-1, ids[..., None]).squeeze(-1)
    q_x = q.gather(-1, ids[..., None]).squeeze(-1)
    accepted = u < p_x / q_x  # the ratio p/q; p == 0 gives 0 or NaN, which rejects
    n = ((~accepted).cumsum(-1) < 1).sum(-1)  # HF's n_matches
    residual = (p_draft - q).clamp_min_(0)  # vLLM: the residual over all [B, K, V]
    residual.div_(residual.sum(-1, keepdim=True))
    rejected = (n < num_draft)[:, None]
    dist = torch.where(rejected, residual[rows, n.clamp(max=num_draft - 1)], p[:, num_draft])
    cdf = dist.cumsum(-1, dtype=torch.float64)
    token = torch.searchsorted(cdf, ru[:, None] * cdf[:, -1:], right=True).squeeze(-1)
    out = torch.full((batch, num_draft + 1), -1, dtype=torch.int64)
    out[:, :num_draft] = torch.where(torch.arange(num_draft) < n[:, None], ids, -1)
    out[rows, n] = token.clamp(max=p.shape[-1] - 1)
    return out, n


def torch_verify_greedy_ids(ids: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
    """vLLM's greedy path: the accepted prefix as a cumulative product of matches."""
    num_draft = ids.shape[1]
    n = (ids == targets[:, :num_draft]).cumprod(-1).sum(-1)
    out = torch.where(torch.arange(num_draft + 1) <= n[:, None], targets, -1)
    return out, n


def torch_verify_greedy(ids: Tensor, p: Tensor) -> tuple[Tensor, Tensor]:
    return torch_verify_greedy_ids(ids, p.argmax(-1))


# --------------------------------------------------------------------------
# Inputs.
# --------------------------------------------------------------------------


@dataclass
class Inputs:
    """One shape's arrays; both regimes with probabilities share ``p`` and ``q``."""

    p: np.ndarray  # target probabilities [B, K+1, V], float32
    q: np.ndarray  # draft probabilities [B, K, V], float32
    reject_ids: np.ndarray  # [B, K]: q > p at every drafted token
    argmax_ids: np.ndarray  # [B, K+1]: the argmax of every target row
    recovery: np.ndarray  # [B] recovery uniforms

    @property
    def shape(self) -> tuple[int, int, int]:
        batch, num_draft, vocab = self.q.shape
        return batch, num_draft, vocab


def random_probs(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Normalised random float32 rows, made in place (no float64 array of the full size)."""
    x = rng.random(shape, dtype=np.float32)
    x /= x.sum(axis=-1, keepdims=True)
    return x


def make_rejecting(p: np.ndarray, q: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Random draft ids with ``q > p`` at each, made by swapping ``p`` and ``q`` there.

    With a uniform just below 1 every such draft is rejected. Only ``B * K`` values
    change (rows need not sum to 1 exactly), so this costs nothing next to the arrays.
    """
    batch, num_draft, vocab = q.shape
    ids = rng.integers(0, vocab, size=(batch, num_draft))
    b, t = np.indices((batch, num_draft))
    p_x, q_x = p[b, t, ids], q[b, t, ids]
    low, high = np.minimum(p_x, q_x), np.maximum(p_x, q_x)
    high = np.where(high > low, high, np.nextafter(low, np.float32(1)))
    p[b, t, ids], q[b, t, ids] = low, high
    return ids


def make_inputs(batch: int, num_draft: int, vocab: int, seed: int = 0) -> Inputs:
    rng = np.random.default_rng(seed)
    p = random_probs(rng, (batch, num_draft + 1, vocab))
    q = random_probs(rng, (batch, num_draft, vocab))
    reject_ids = make_rejecting(p, q, rng)
    argmax_ids = np.argmax(p, axis=-1)  # after the swap, which may lower a maximum
    return Inputs(p, q, reject_ids, argmax_ids, rng.random(batch))


# --------------------------------------------------------------------------
# Timing, threads and the memory floor.
# --------------------------------------------------------------------------


def median_of_runs(fn: Callable[[], Any], repeats: int) -> float:
    """Median seconds of ``repeats`` single calls of ``fn`` after one warm-up call
    (for calls too long to batch; :func:`measure` batches short ones)."""
    fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def measure(
    fn: Callable[[], Any], budget: float, min_samples: int = 3, max_samples: int = 200
) -> tuple[float, Any]:
    """Median seconds per call of ``fn``, and the result of its first (warm-up) call."""
    start = time.perf_counter()
    result = fn()
    once = max(time.perf_counter() - start, 1e-7)
    number = max(1, int(0.005 / once))  # group fast calls so the timer's cost vanishes
    samples: list[float] = []
    deadline = time.perf_counter() + budget
    while len(samples) < min_samples or (
        time.perf_counter() < deadline and len(samples) < max_samples
    ):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        samples.append((time.perf_counter() - start) / number)
    return statistics.median(samples), result


@contextmanager
def specaccept_threads(n: int | None) -> Iterator[None]:
    """specaccept on ``n`` threads inside the block (``None``: leave it as it is)."""
    if n is None:
        yield
        return
    before = specaccept.get_num_threads()
    specaccept.set_num_threads(n)
    try:
        yield
    finally:
        specaccept.set_num_threads(before)


def thread_settings() -> list[tuple[str, int | None]]:
    """The specaccept columns: their row key and thread count (``None``: the default)."""
    if HAS_THREAD_API:
        return [("specaccept_1t_s", 1), ("specaccept_all_s", ALL_THREADS)]
    return [("specaccept_s", None)]


REDUCTIONS: dict[str, Callable[[np.ndarray], Any]] = {
    "bitwise_or.reduce(uint64)": lambda a: np.bitwise_or.reduce(a.view(np.uint64)),
    "max(float32)": np.max,
    "sum(float32)": np.sum,
}


def _timed_reduce(
    barrier: threading.Barrier, reduce: Callable[[np.ndarray], Any], a: np.ndarray
) -> tuple[float, float]:
    barrier.wait()
    start = time.perf_counter()
    reduce(a)
    return start, time.perf_counter()


def seconds_1t(buf: np.ndarray, reduce: Callable[[np.ndarray], Any]) -> float:
    start = time.perf_counter()
    reduce(buf)
    return time.perf_counter() - start


def seconds_threads(
    pool: ThreadPoolExecutor, chunks: list[np.ndarray], reduce: Callable[[np.ndarray], Any]
) -> float:
    """Wall time for ``len(chunks)`` threads to reduce one chunk each, started together.

    Each thread times itself: from the first start to the last end, whenever the
    submitting thread gets the GIL back.
    """
    barrier = threading.Barrier(len(chunks))
    spans = [f.result() for f in [pool.submit(_timed_reduce, barrier, reduce, c) for c in chunks]]
    return max(end for _, end in spans) - min(start for start, _ in spans)


def read_bandwidth(nbytes: int, threads: int, repeats: int = 3) -> tuple[float, float]:
    """Bytes per second read by the fastest NumPy reduction: one thread, ``threads`` threads."""
    buf = np.ones(nbytes // PROB_BYTES, dtype=np.float32)  # written, so the pages exist
    chunks = np.array_split(buf, threads)
    best_1t = best_all = float("inf")
    with ThreadPoolExecutor(threads) as pool:
        for reduce in REDUCTIONS.values():
            reduce(buf)  # warm-up
            for _ in range(repeats):
                best_1t = min(best_1t, seconds_1t(buf, reduce))
                best_all = min(best_all, seconds_threads(pool, chunks, reduce))
    return buf.nbytes / best_1t, buf.nbytes / best_all


class ReadFloor:
    """The read floor measured next to each timed call, for ratios this noisy machine
    keeps: :meth:`ratio` times ``fn`` and, right before each call, the fastest NumPy
    reduction (chosen once, as :func:`read_bandwidth` chooses) over a 256 MiB buffer
    on the same number of threads. Each call's floor is ``nbytes`` at the bandwidth
    just measured; the ratio is the median of the calls' ratios, so a drift in the
    machine's bandwidth moves both sides of each ratio together."""

    def __init__(self, threads: int, nbytes: int = 256 << 20) -> None:
        self.buf = np.ones(nbytes // PROB_BYTES, dtype=np.float32)  # pages exist
        self.chunks = np.array_split(self.buf, threads)
        self.pool = ThreadPoolExecutor(threads)
        best = {}
        for name, reduce in REDUCTIONS.items():
            reduce(self.buf)  # warm-up
            best[name] = min(seconds_1t(self.buf, reduce) for _ in range(3))
        self.reduce = REDUCTIONS[min(best, key=best.__getitem__)]

    def bandwidth(self, threads: int) -> float:
        """Bytes per second read now, on one thread or on all."""
        if threads == 1:
            return self.buf.nbytes / seconds_1t(self.buf, self.reduce)
        return self.buf.nbytes / seconds_threads(self.pool, self.chunks, self.reduce)

    def ratio(
        self, fn: Callable[[], Any], nbytes: int, threads: int, repeats: int
    ) -> tuple[float, float, float]:
        """Median seconds of ``fn``, median floor seconds of ``nbytes``, median ratio
        of the two over ``repeats`` pairs (``fn`` runs on however many threads the
        caller set; ``threads`` is the floor's)."""
        fn()  # warm-up
        times, floors = [], []
        for _ in range(repeats):
            floors.append(nbytes / self.bandwidth(threads))
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        ratios = [t / f for t, f in zip(times, floors, strict=True)]
        return statistics.median(times), statistics.median(floors), statistics.median(ratios)

    def close(self) -> None:
        self.pool.shutdown()


@dataclass
class Floors:
    """Read bandwidths in bytes per second, one thread and all threads."""

    one: float
    all: float

    def add_to(self, row: Row, nbytes: int) -> None:
        row["bytes_read"] = nbytes
        row["floor_1t_s"] = nbytes / self.one
        row["floor_all_s"] = nbytes / self.all


def bytes_read(regime: str, batch: int, num_draft: int, vocab: int) -> int:
    """The bytes a regime must read at least (see the module docstring)."""
    per_row = {
        "reject": (2 + 2 * vocab) * PROB_BYTES,
        "accept": (2 * num_draft + vocab) * PROB_BYTES,
        "greedy": (num_draft + 1) * vocab * PROB_BYTES,
        "verify_greedy (ids)": (2 * num_draft + 1) * ID_BYTES,
    }[regime]
    return batch * per_row


# --------------------------------------------------------------------------
# The table: one row per shape and regime.
# --------------------------------------------------------------------------


def regime_calls(
    inp: Inputs, regime: str, tp: tuple[Tensor, Tensor] | None
) -> tuple[Callable[[], Any], dict[str, Callable[[], Any]]]:
    """specaccept's call for ``regime`` and its peers' calls, keyed by column name.

    ``tp`` is ``(p, q)`` as tensors (from ``torch.from_numpy``, made once per shape); the
    small arrays are converted here, outside the timed calls.
    """
    batch, num_draft, _ = inp.shape
    p, q, ru, targets = inp.p, inp.q, inp.recovery, inp.argmax_ids
    greedy_ids = np.ascontiguousarray(targets[:, :num_draft])
    t = torch.from_numpy if torch is not None else None
    peers: dict[str, Callable[[], Any]]
    if regime in ("reject", "accept"):
        ids = inp.reject_ids if regime == "reject" else greedy_ids
        fill = np.nextafter(1.0, 0.0) if regime == "reject" else 0.0
        u = np.full((batch, num_draft), fill)
        kwargs: dict[str, Any] = {"uniforms": u, "recovery_uniforms": ru}
        ours = partial(specaccept.verify, ids, p, q, **kwargs)
        peers = {
            "numpy": partial(numpy_verify, ids, p, q, u, ru),
            "reference": partial(reference.verify, ids, p, q, **kwargs),
        }
        if t is not None and tp is not None:
            peers["torch"] = partial(torch_verify, t(ids), tp[0], tp[1], t(u), t(ru))
    elif regime == "greedy":
        ours = partial(specaccept.verify, greedy_ids, p, q, greedy=True)
        peers = {
            "numpy": partial(numpy_verify_greedy, greedy_ids, p),
            "reference": partial(reference.verify, greedy_ids, p, q, greedy=True),
        }
        if t is not None and tp is not None:
            peers["torch"] = partial(torch_verify_greedy, t(greedy_ids), tp[0])
    else:
        ours = partial(specaccept.verify_greedy, greedy_ids, targets)
        peers = {
            "numpy": partial(numpy_verify_greedy_ids, greedy_ids, targets),
            "reference": partial(reference.verify_greedy, greedy_ids, targets),
        }
        if t is not None:
            peers["torch"] = partial(torch_verify_greedy_ids, t(greedy_ids), t(targets))
    if batch > 1:
        del peers["reference"]  # pure Python: the small shapes only
    return ours, peers


def accepted_counts(result: Any) -> np.ndarray:
    """``num_accepted`` of a Verification, or ``n`` of a peer's ``(out, n)``."""
    n = result.num_accepted if hasattr(result, "num_accepted") else result[1]
    return np.asarray(n)


def check(ok: bool, message: str) -> None:
    if not ok:
        raise RuntimeError(message)


def bench_regime(
    inp: Inputs, regime: str, tp: tuple[Tensor, Tensor] | None, budget: float, floors: Floors
) -> Row:
    batch, num_draft, vocab = inp.shape
    where = f"B={batch} K={num_draft} V={vocab} {regime}"
    expected = 0 if regime == "reject" else num_draft
    ours, peers = regime_calls(inp, regime, tp)
    row: Row = dict.fromkeys(FIELDS)
    row.update(B=batch, K=num_draft, V=vocab, regime=regime)
    for key, threads in thread_settings():
        with specaccept_threads(threads):
            row[key], result = measure(ours, budget)
        counts = accepted_counts(result)
        check(bool((counts == expected).all()), f"{where}: regime broken, accepted {counts}")
    for name, call in peers.items():
        row[f"{name}_s"], result = measure(call, budget)
        counts = accepted_counts(result)
        check(bool((counts == expected).all()), f"{where}: {name} disagrees, accepted {counts}")
    floors.add_to(row, bytes_read(regime, batch, num_draft, vocab))
    add_ratios(row)
    return row


def add_ratios(row: Row) -> None:
    ours_1t = row["specaccept_1t_s"] or row["specaccept_s"]
    row["ours_1t_over_floor_1t"] = ours_1t / row["floor_1t_s"]
    if row["specaccept_all_s"] is not None:
        row["ours_all_over_floor_all"] = row["specaccept_all_s"] / row["floor_all_s"]
    if row["numpy_s"] is not None:
        row["numpy_over_ours"] = row["numpy_s"] / ours_1t


def bench_shape(shape: tuple[int, int, int], budget: float, floors: Floors) -> list[Row]:
    inp = make_inputs(*shape)
    tp = (torch.from_numpy(inp.p), torch.from_numpy(inp.q)) if torch is not None else None
    return [bench_regime(inp, regime, tp, budget, floors) for regime in REGIMES]


def run_table(shapes: list[tuple[int, int, int]], budget: float, floors: Floors) -> list[Row]:
    rows = []
    for shape in shapes:
        start = time.perf_counter()
        rows += bench_shape(shape, budget, floors)
        gc.collect()  # this shape's arrays go before the next shape's are made
        print(f"(B, K, V) = {shape}: {time.perf_counter() - start:.1f} s", file=sys.stderr)
    return rows


# --------------------------------------------------------------------------
# The batch sweep behind --plot.
# --------------------------------------------------------------------------


def batch_sweep(vocab: int, budget: float, floors: Floors) -> list[Row]:
    """All-reject ``verify`` at K = 5 for each B in ``SWEEP_BATCHES``, on slices of one input."""
    inp = make_inputs(max(SWEEP_BATCHES), SWEEP_K, vocab, seed=1)
    u = np.full(inp.reject_ids.shape, np.nextafter(1.0, 0.0))
    rows = []
    for batch in SWEEP_BATCHES:
        # Leading-axis slices of C-contiguous arrays are C-contiguous: read in place.
        args = (inp.reject_ids[:batch], inp.p[:batch], inp.q[:batch])
        ours = partial(
            specaccept.verify, *args, uniforms=u[:batch], recovery_uniforms=inp.recovery[:batch]
        )
        row: Row = {"B": batch, "K": SWEEP_K, "V": vocab}
        for key, threads in thread_settings():
            with specaccept_threads(threads):
                row[key], result = measure(ours, budget)
            check(bool((result.num_accepted == 0).all()), f"sweep B={batch}: regime broken")
        # NumPy's share stays bounded: at most a few calls at large B.
        numpy_call = partial(numpy_verify, *args, u[:batch], inp.recovery[:batch])
        row["numpy_s"], _ = measure(numpy_call, min(budget, 0.2), min_samples=2, max_samples=20)
        floors.add_to(row, bytes_read("reject", batch, SWEEP_K, vocab))
        rows.append(row)
    return rows


def plot_sweep(rows: list[Row], path: Path, meta: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullLocator

    batches = [r["B"] for r in rows]
    series = [
        ("specaccept_1t_s", "specaccept, 1 thread", "o-"),
        ("specaccept_all_s", f"specaccept, {ALL_THREADS} threads", "s-"),
        ("specaccept_s", "specaccept (default threads)", "o-"),
        ("numpy_s", "NumPy (1 thread)", "^-"),
        ("floor_1t_s", "floor, 1 thread", "--"),
        ("floor_all_s", f"floor, {ALL_THREADS} threads", ":"),
    ]
    fig, ax = plt.subplots(figsize=(8, 5))
    for key, label, style in series:
        if key in rows[0]:
            color = {"floor_1t_s": "0.45", "floor_all_s": "k"}.get(key)
            ax.loglog(batches, [r[key] * 1e6 for r in rows], style, color=color, label=label)
    ax.set_xticks(batches, [str(b) for b in batches])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel("batch size B")
    ax.set_ylabel("time per call (µs)")
    ax.set_title(
        f"verify, every row rejected: K={rows[0]['K']}, V={rows[0]['V']}, float32\n"
        f"{meta['cpu']}, {meta['cores']} cores, {meta['date']}",
        fontsize=10,
    )
    ax.grid(True, which="major", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def matplotlib_available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except Exception:
        print("matplotlib not importable: no plot (pip install matplotlib)", file=sys.stderr)
        return False
    return True


# --------------------------------------------------------------------------
# Output.
# --------------------------------------------------------------------------


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def make_meta(floors: Floors, budget: float, quick: bool) -> dict[str, Any]:
    return {
        "date": time.strftime("%Y-%m-%d"),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "specaccept": specaccept.__version__,
        "torch": torch.__version__ if torch is not None else None,
        "read_bandwidth_1t_gb_s": floors.one / 1e9,
        "read_bandwidth_all_gb_s": floors.all / 1e9,
        "specaccept_threads": [n for _, n in thread_settings()] if HAS_THREAD_API else "default",
        "floor_threads": ALL_THREADS,
        "torch_threads": torch.get_num_threads() if torch is not None else None,
        "budget_s": budget,
        "quick": quick,
    }


def columns() -> list[tuple[str, str, str]]:
    """(header, row key, kind) of the printed table; kind ``us``, ``ratio`` or ``int``."""
    if HAS_THREAD_API:
        ours = [
            ("ours 1t", "specaccept_1t_s", "us"),
            (f"ours {ALL_THREADS}t", "specaccept_all_s", "us"),
        ]
    else:
        ours = [("ours", "specaccept_s", "us")]
    return [
        ("B", "B", "int"),
        ("K", "K", "int"),
        ("V", "V", "int"),
        ("regime", "regime", "str"),
        *ours,
        ("numpy", "numpy_s", "us"),
        ("torch", "torch_s", "us"),
        ("reference", "reference_s", "us"),
        ("floor 1t", "floor_1t_s", "us"),
        (f"floor {ALL_THREADS}t", "floor_all_s", "us"),
        ("1t/floor", "ours_1t_over_floor_1t", "ratio"),
        (f"{ALL_THREADS}t/floor", "ours_all_over_floor_all", "ratio"),
        ("numpy/ours", "numpy_over_ours", "ratio"),
    ]


def cell(value: Any, kind: str) -> str:
    if value is None:
        return "-"
    if kind == "us":
        return f"{value * 1e6:.1f}" if value >= 1e-6 else f"{value * 1e6:.3f}"
    if kind == "ratio":
        return f"{value:.2f}"
    return str(value)


def table_cells(rows: list[Row]) -> tuple[list[str], list[list[str]]]:
    cols = columns()
    headers = [h if kind in ("ratio", "int", "str") else f"{h} us" for h, _, kind in cols]
    return headers, [[cell(r[key], kind) for _, key, kind in cols] for r in rows]


def print_table(rows: list[Row]) -> None:
    headers, body = table_cells(rows)
    widths = [max(len(x) for x in column) for column in zip(headers, *body, strict=True)]
    regime = headers.index("regime")

    def line(cells: list[str]) -> str:
        return " ".join(
            c.ljust(w) if i == regime else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    print(line(headers))
    print("-" * len(line(headers)))
    for cells in body:
        print(line(cells))


def print_markdown(rows: list[Row]) -> None:
    headers, body = table_cells(rows)
    print("| " + " | ".join(headers) + " |")
    print("|" + "|".join(":---" if h == "regime" else "---:" for h in headers) + "|")
    for cells in body:
        print("| " + " | ".join(cells) + " |")


def print_notes(meta: dict[str, Any]) -> None:
    print(
        f"\nread bandwidth: {meta['read_bandwidth_1t_gb_s']:.1f} GB/s on 1 thread, "
        f"{meta['read_bandwidth_all_gb_s']:.1f} GB/s on {ALL_THREADS} threads "
        f"({meta['cpu']}, {meta['cores']} cores, {meta['date']})."
    )
    print(
        "note: at B=1 the working set fits in cache and repeated calls read it from there, "
        "so the DRAM floor is not a bound (a ratio below 1 is possible)."
    )
    if not HAS_THREAD_API:
        print(
            "note: specaccept.set_num_threads is missing in this build: one specaccept column, "
            "at the library's default thread count."
        )
    if torch is None:
        print("torch not importable: skipped")
    else:
        print(f"torch {torch.__version__} on {torch.get_num_threads()} threads (its default).")


def write_results(out: Path, meta: dict[str, Any], rows: list[Row], sweep: list[Row]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"meta": meta, "rows": rows}
    if sweep:
        results["batch_sweep"] = sweep
    out.write_text(json.dumps(results, indent=2) + "\n")
    with out.with_suffix(".csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    print(f"written to {out} and {out.with_suffix('.csv')}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small shapes, short budget")
    parser.add_argument("--budget", type=float, default=None, help="seconds per measurement")
    parser.add_argument("--out", type=Path, default=None, help="the JSON file (CSV next to it)")
    parser.add_argument("--plot", type=Path, default=None, metavar="FILE", help="batch sweep PNG")
    parser.add_argument("--markdown", action="store_true", help="also a GitHub markdown table")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None, default_out: Path | None = None) -> None:
    """Run the suite; ``argv`` as on the command line. Results go to ``--out``, else
    ``default_out``, else a file in the temporary directory."""
    args = parse_args(argv)
    budget = args.budget if args.budget is not None else (0.05 if args.quick else 1.0)
    name = "specaccept-bench-quick.json" if args.quick else "specaccept-bench.json"
    out = args.out or default_out or Path(tempfile.gettempdir()) / name
    plot = args.plot is not None and matplotlib_available()
    nbytes = QUICK_BANDWIDTH_BYTES if args.quick else BANDWIDTH_BYTES
    floors = Floors(*read_bandwidth(nbytes, ALL_THREADS))
    rows = run_table(QUICK_SHAPES if args.quick else SHAPES, budget, floors)
    meta = make_meta(floors, budget, args.quick)
    sweep = batch_sweep(QUICK_SWEEP_V if args.quick else SWEEP_V, budget, floors) if plot else []
    print_table(rows)
    if args.markdown:
        print()
        print_markdown(rows)
    print_notes(meta)
    write_results(out, meta, rows, sweep)
    if plot:
        plot_sweep(sweep, args.plot, meta)
        print(f"plot written to {args.plot}")


if __name__ == "__main__":
    main()
