"""``acceptance_rate`` against the NumPy one-liner ``np.minimum(p, q).sum(-1)``.

Run after ``pip install .``::

    python benches/bench_acceptance_rate.py            # a few seconds
    python benches/bench_acceptance_rate.py --quick

float32 ``[B, K, V]`` target and draft probabilities; medians of whole calls, in
one run, on 1 thread and on all threads.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import numpy as np
import specaccept
from harness import median_of_runs

SHAPES = [(1, 5, 128256), (64, 5, 128256)]
QUICK_SHAPES = [(1, 5, 32000), (8, 5, 32000)]


def median_us(fn: Callable[[], object], repeats: int) -> float:
    return median_of_runs(fn, repeats) * 1e6


def measure(batch: int, num_draft: int, vocab: int, repeats: int, threads: int) -> str:
    rng = np.random.default_rng(0)
    p = rng.random((batch, num_draft, vocab), dtype=np.float32)
    q = rng.random((batch, num_draft, vocab), dtype=np.float32)
    np.testing.assert_allclose(
        specaccept.acceptance_rate(p, q), np.minimum(p, q).sum(-1, dtype=np.float64), rtol=1e-9
    )
    try:
        specaccept.set_num_threads(1)
        one = median_us(lambda: specaccept.acceptance_rate(p, q), repeats)
    finally:
        specaccept.set_num_threads(threads)
    many = median_us(lambda: specaccept.acceptance_rate(p, q), repeats)
    numpy = median_us(lambda: np.minimum(p, q).sum(-1), repeats)
    return (
        f"{batch:>3} {num_draft:>2} {vocab:>7} {one:>11.1f} {many:>11.1f} "
        f"{numpy:>10.1f} {numpy / min(one, many):>10.1f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small shapes, few repeats")
    args = parser.parse_args()
    shapes, repeats = (QUICK_SHAPES, 3) if args.quick else (SHAPES, 15)
    threads = specaccept.get_num_threads()
    print(
        f"{'B':>3} {'K':>2} {'V':>7} {'ours 1t us':>11} {f'ours {threads}t us':>11} "
        f"{'numpy us':>10} {'numpy/ours':>10}"
    )
    for shape in shapes:
        print(measure(*shape, repeats, threads))


if __name__ == "__main__":
    main()
