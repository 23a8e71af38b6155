"""What a serving engine's inputs cost (issue 17): bfloat16 rows against the floor of
their bytes, and each form of randomness beside the call it feeds.

Run after ``pip install .`` (a release build)::

    python benches/bench_serving_inputs.py           # about a minute
    python benches/bench_serving_inputs.py --quick   # seconds, small shapes

Two tables, all medians per call measured in one run (ratios are what to read on a
noisy machine):

1. **dtypes**: ``verify`` on the same probabilities as float32, bfloat16 and float16
   (``B, K, V`` below, draft probabilities given), in three regimes: ``reject`` (every row
   rejected at position 0: two rows of ``V`` read per request), ``accept`` (all accepted:
   the bonus row read) and ``greedy`` (all ``K + 1`` rows scanned for their argmax). The
   floor is the bytes the regime must read at that dtype's width (see ``_bench.bytes_read``,
   scaled by the element size) over this machine's read bandwidth, measured in the same run
   (specaccept's own threads: all cores; the floor likewise).
2. **randomness** at ``B = 256`` (and ``B = 1``), ``K = 5``: ``verify`` with explicit
   uniforms (nothing drawn), with one ``numpy.random.Generator``, with ``B`` per-row
   Generators, and with ``seeds``/``offsets`` (Philox4x32-10); and the draw alone for each
   form (``counter_uniforms`` for the seeds, with its argument checks). ``share`` is the
   draw alone over the call: the part of the call that drawing costs. The explicit
   uniforms are the seeds' own, so those two calls do the same verification work.
"""

from __future__ import annotations

import argparse
import os
import platform
from datetime import date
from functools import partial

import ml_dtypes
import numpy as np
import specaccept
from harness import (
    PROB_BYTES,
    bytes_read,
    cpu_model,
    make_inputs,
    measure,
    read_bandwidth,
)

DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}


def dtype_table(batch: int, num_draft: int, vocab: int, budget: float, threads: int) -> None:
    inp = make_inputs(batch, num_draft, vocab)
    _, bandwidth = read_bandwidth(256 << 20 if budget >= 0.5 else 64 << 20, threads)
    print(f"\n### dtypes: B={batch} K={num_draft} V={vocab}, {threads} threads")
    print("| regime | dtype | ours | floor | ours/floor | vs float32 |")
    print("|---|---|---:|---:|---:|---:|")
    batch_, k, _ = inp.shape
    greedy_ids = np.ascontiguousarray(inp.argmax_ids[:, :k])
    for regime in ("reject", "accept", "greedy"):
        base = None
        for name, dtype in DTYPES.items():
            # The same values in each dtype: the float32 rows rounded once, so the
            # regimes hold (the ids were made for the float32 values).
            p = inp.p.astype(dtype)
            q = inp.q.astype(dtype)
            if regime == "greedy":
                ids = np.argmax(p.astype(np.float32)[:, :k], axis=-1)
                call = partial(specaccept.verify, ids, p, q, greedy=True)
            else:
                ids = inp.reject_ids if regime == "reject" else greedy_ids
                u = np.full((batch_, k), np.nextafter(1.0, 0.0) if regime == "reject" else 0.0)
                call = partial(
                    specaccept.verify, ids, p, q, uniforms=u, recovery_uniforms=inp.recovery
                )
            seconds, result = measure(call, budget)
            expected = 0 if regime == "reject" else k
            if regime != "greedy" and not (result.num_accepted == expected).all():
                raise RuntimeError(f"{regime} {name}: regime broken")
            width = np.dtype(dtype).itemsize
            floor = bytes_read(regime, batch_, k, vocab) * width / PROB_BYTES / bandwidth
            base = base or seconds
            print(
                f"| {regime} | {name} | {seconds * 1e3:.2f} ms | {floor * 1e3:.2f} ms | "
                f"{seconds / floor:.2f} | {base / seconds:.2f}x |"
            )


def randomness_table(batch: int, num_draft: int, vocab: int, budget: float) -> None:
    inp = make_inputs(batch, num_draft, vocab)
    p, q, ids = inp.p, inp.q, inp.reject_ids
    g = np.random.default_rng(0)
    per_row = [np.random.default_rng(b) for b in range(batch)]
    seeds = np.arange(batch, dtype=np.uint64) * 7919
    offsets = np.full(batch, 42, dtype=np.uint64)
    u, ru = specaccept.counter_uniforms(seeds, offsets, num_draft)
    forms = {
        "explicit uniforms": (
            partial(specaccept.verify, ids, p, q, uniforms=u, recovery_uniforms=ru),
            None,
        ),
        "one Generator": (
            partial(specaccept.verify, ids, p, q, rng=g),
            partial(g.random, batch * num_draft + batch),
        ),
        "B Generators": (
            partial(specaccept.verify, ids, p, q, rng=per_row),
            partial(_draw_per_row, per_row, num_draft),
        ),
        "seeds/offsets": (
            partial(specaccept.verify, ids, p, q, seeds=seeds, offsets=offsets),
            partial(specaccept.counter_uniforms, seeds, offsets, num_draft),
        ),
    }
    print(f"\n### randomness: B={batch} K={num_draft} V={vocab} float32, draft probabilities given")
    print("| uniforms from | call | draw alone | share of the call |")
    print("|---|---:|---:|---:|")
    for name, (call, draw) in forms.items():
        seconds, _ = measure(call, budget)
        drawn = measure(draw, budget)[0] if draw is not None else 0.0
        share = drawn / seconds
        print(f"| {name} | {seconds * 1e6:.1f} us | {drawn * 1e6:.1f} us | {share * 100:.1f}% |")


def _draw_per_row(generators: list[np.random.Generator], k: int) -> None:
    for g in generators:
        g.random(k)
        g.random()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small shapes, short budgets")
    args = parser.parse_args()
    budget = 0.05 if args.quick else 1.0
    threads = os.cpu_count() or 1
    print(
        f"{date.today()}, {cpu_model()}, {threads} cores, Python {platform.python_version()}, "
        f"specaccept {specaccept.__version__}; `python benches/bench_serving_inputs.py"
        f"{' --quick' if args.quick else ''}`"
    )
    if args.quick:
        dtype_table(4, 3, 4096, budget, threads)
        randomness_table(16, 5, 1024, budget)
        return
    dtype_table(64, 5, 128256, budget, threads)
    randomness_table(256, 5, 32000, budget)
    randomness_table(1, 5, 32000, budget)


if __name__ == "__main__":
    main()
