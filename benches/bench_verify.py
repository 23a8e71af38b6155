"""Benchmark of ``specaccept.verify`` against the ways users would otherwise do it.

Run after ``pip install .`` (a release build):

    python benches/bench_verify.py            # full table
    python benches/bench_verify.py --quick    # seconds: the smoke run CI uses

Each row is one shape, float32 probabilities with draft probabilities, in two
regimes: ``reject`` (every row rejected at position 0, so the residual row pair
is read) and ``accept`` (every draft accepted, so the bonus row is read). Times
are medians per call of the whole Python call, measured in one run, so the
ratios are comparable even on a noisy machine. Results are printed as a table
and written to ``benches/results/verify.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from functools import partial
from pathlib import Path

import numpy as np
import specaccept
from specaccept import reference

SHAPES = [(1, 5, 32000), (1, 5, 128256), (64, 5, 128256), (256, 8, 151936)]
QUICK_SHAPES = [(1, 5, 32000), (8, 5, 32000)]


def numpy_verify(ids, p, q, u, ru):
    """The same algorithm as a NumPy user writes it: residual over all [B, K, V]."""
    batch, num_draft = ids.shape
    rows = np.arange(batch)
    p_x = np.take_along_axis(p[:, :num_draft], ids[..., None], -1)[..., 0].astype(np.float64)
    q_x = np.take_along_axis(q, ids[..., None], -1)[..., 0].astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        accept = (p_x > 0) & ((q_x <= p_x) | (u < p_x / q_x))
    n = np.where(accept.all(axis=1), num_draft, np.argmin(accept, axis=1))
    residual = np.maximum(p[:, :num_draft] - q, 0)
    dist = np.where(
        (n < num_draft)[:, None], residual[rows, np.minimum(n, num_draft - 1)], p[:, num_draft]
    )
    cdf = np.cumsum(dist, axis=1, dtype=np.float64)
    token = np.minimum((cdf <= ru[:, None] * cdf[:, -1:]).sum(axis=1), p.shape[2] - 1)
    out = np.full((batch, num_draft + 1), -1)
    for b in range(batch):
        out[b, : n[b]] = ids[b, : n[b]]
        out[b, n[b]] = token[b]
    return out, n


def make_inputs(batch, num_draft, vocab, regime, seed=0):
    rng = np.random.default_rng(seed)
    p = rng.random((batch, num_draft + 1, vocab), dtype=np.float32)
    p /= p.sum(axis=-1, keepdims=True)
    q = rng.random((batch, num_draft, vocab), dtype=np.float32)
    q /= q.sum(axis=-1, keepdims=True)
    if regime == "reject":
        # Draft the token where q exceeds p most, and a uniform no ratio is above.
        ids = np.argmax(q - p[:, :num_draft], axis=-1)
        u = np.full((batch, num_draft), np.nextafter(1.0, 0.0))
    else:
        ids = np.argmax(p[:, :num_draft], axis=-1)
        u = np.zeros((batch, num_draft))
    ru = rng.random(batch)
    return ids.astype(np.int64), p, q, u, ru


def median_seconds(fn, budget: float) -> float:
    fn()  # warm up
    start = time.perf_counter()
    fn()
    once = max(time.perf_counter() - start, 1e-7)
    number = max(1, int(0.02 / once))
    samples = []
    deadline = time.perf_counter() + budget
    while len(samples) < 5 or (time.perf_counter() < deadline and len(samples) < 200):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        samples.append((time.perf_counter() - t0) / number)
    return statistics.median(samples)


def run(shapes, budget, with_reference_up_to=40_000):
    rows = []
    for batch, num_draft, vocab in shapes:
        for regime in ("reject", "accept"):
            ids, p, q, u, ru = make_inputs(batch, num_draft, vocab, regime)
            args, given = (ids, p, q), {"uniforms": u, "recovery_uniforms": ru}
            ours = specaccept.verify(*args, **given)
            expect = "reject" if regime == "reject" else "accept"
            assert (ours.num_accepted == (0 if expect == "reject" else num_draft)).all()
            row = {
                "B": batch,
                "K": num_draft,
                "V": vocab,
                "regime": regime,
                "specaccept_s": median_seconds(partial(specaccept.verify, *args, **given), budget),
                "numpy_s": median_seconds(partial(numpy_verify, *args, u, ru), budget),
            }
            if batch * vocab <= with_reference_up_to:
                row["reference_s"] = median_seconds(
                    partial(reference.verify, *args, **given), budget
                )
            rows.append(row)
        greedy_ids = np.argmax(p[:, :num_draft], axis=-1)
        targets = np.argmax(p, axis=-1)
        rows.append(
            {
                "B": batch,
                "K": num_draft,
                "V": vocab,
                "regime": "verify_greedy (ids)",
                "specaccept_s": median_seconds(
                    partial(specaccept.verify_greedy, greedy_ids, targets), budget
                ),
            }
        )
    return rows


def show(rows):
    def us(x):
        return f"{x * 1e6:10.1f}" if x is not None else f"{'-':>10}"

    header = f"{'B':>4} {'K':>2} {'V':>7} {'regime':<20} {'specaccept us':>13} {'numpy us':>10} {'reference us':>12} {'numpy/ours':>10}"
    print(header)
    print("-" * len(header))
    for r in rows:
        ratio = f"{r['numpy_s'] / r['specaccept_s']:10.1f}" if "numpy_s" in r else f"{'-':>10}"
        print(
            f"{r['B']:>4} {r['K']:>2} {r['V']:>7} {r['regime']:<20} {us(r['specaccept_s']):>13}"
            f" {us(r.get('numpy_s')):>10} {us(r.get('reference_s')):>12} {ratio}"
        )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small shapes, short budget")
    parser.add_argument("--budget", type=float, default=None, help="seconds per measurement")
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "verify.json"
    )
    args = parser.parse_args()
    shapes = QUICK_SHAPES if args.quick else SHAPES
    budget = args.budget if args.budget is not None else (0.05 if args.quick else 1.0)
    rows = run(shapes, budget)
    show(rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "cpus": __import__("os").cpu_count(),
        "specaccept": specaccept.__version__,
        "numpy": np.__version__,
    }
    args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    print(f"\nwritten to {args.out}")


if __name__ == "__main__":
    main()
