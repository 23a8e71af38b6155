"""Block verification beside token verification: accepted drafts, and time against the floor.

Run after ``pip install .``::

    python benches/bench_block.py            # a few minutes
    python benches/bench_block.py --quick    # seconds

1. **Gain on the built-in n-gram models.** Contexts from the shipped text; the
   draft (a bigram model) samples ``K`` tokens; the target is the 4-gram model.
   For each drafted block, ``expected_num_accepted`` gives the exact expectation
   over the uniforms of each method (zero variance), averaged over the blocks.
2. **Time.** ``(B, K, V)`` float32 with draft probabilities, three regimes on the
   same rows and uniforms: ``accept`` (every ``u = 0``: both methods accept all and
   read one bonus row), ``reject`` (every ``u`` just below 1: the token rule reads
   one residual pair at position 0; the block rule reads the pairs of positions
   ``K-1 .. 1`` for ``h_i`` and the pair at 0 for the residual) and ``mixed``
   (random uniforms). Each against its floor: the bytes the method must read in that
   regime (as counted from the rows' outcomes) over this machine's read bandwidth,
   measured in the same run.
"""

from __future__ import annotations

import argparse
import platform

import numpy as np
import specaccept
from harness import cpu_model, median_of_runs, read_bandwidth


def ngram_gain(k_values: list[int], steps: int, seed: int) -> list[tuple[int, float, float]]:
    from specaccept.ngram import builtin_models, drafted_block

    target, draft, vocab = builtin_models()
    ids = vocab.encode(specaccept.ngram.builtin_text()[:200_000])
    rng = np.random.default_rng(seed)
    rows = []
    for k in k_values:
        token, block = 0.0, 0.0
        for start in rng.integers(8, len(ids) - 8, size=steps):
            args = drafted_block(target, draft, ids[int(start) - 8 : int(start)], k, rng)
            token += specaccept.lab.expected_num_accepted(*args, method="token")[0]
            block += specaccept.lab.expected_num_accepted(*args, method="block")[0]
        rows.append((k, token / steps, block / steps))
    return rows


def rows_read(result: specaccept.Verification, method: str, k: int) -> int:
    """Rows of V a method must read, from the outcomes: the bonus row when all are
    accepted; else one residual pair, and for the block rule one pair per position
    from K-1 down to the one it stopped at (whose pair is the residual's)."""
    n = result.num_accepted
    if method == "token":
        return int(np.where(n == k, 1, 2).sum())
    return int(np.where(n == k, 1, 2 * (k - np.maximum(n, 1)) + 2 * (n == 0)).sum())


def timing(batch: int, k: int, vocab: int, repeats: int) -> None:
    rng = np.random.default_rng(0)
    p = rng.random((batch, k + 1, vocab), dtype=np.float32)
    q = rng.random((batch, k, vocab), dtype=np.float32)
    p /= p.sum(-1, keepdims=True)
    q /= q.sum(-1, keepdims=True)
    ids = rng.integers(0, vocab, size=(batch, k))
    ru = rng.random(batch)
    regimes = {
        "accept": np.zeros((batch, k)),
        "reject": np.full((batch, k), np.nextafter(1.0, 0.0)),
        "mixed": rng.random((batch, k)),
    }
    single, threads = read_bandwidth(256 << 20, specaccept.get_num_threads())
    n = specaccept.get_num_threads()
    print(f"\n(B, K, V) = ({batch}, {k}, {vocab}) float32 with draft probabilities:")
    header = f"  {'regime':8} {'method':6} {'accepted':>8} {'1 thread':>9} {'floor':>7}"
    print(header + f" {'ratio':>6} {f'{n} threads':>10} {'floor':>7} {'ratio':>6}  (ms)")
    for regime, u in regimes.items():
        for method in ("token", "block"):

            def call(u=u, method=method):
                return specaccept.verify(ids, p, q, uniforms=u, recovery_uniforms=ru, method=method)

            result = call()
            nbytes = rows_read(result, method, k) * vocab * 4
            times = []
            for used in (1, n):
                specaccept.set_num_threads(used)
                times.append(median_of_runs(call, repeats) * 1e3)
            specaccept.set_num_threads(n)
            floor_1, floor_n = nbytes / single * 1e3, nbytes / threads * 1e3
            print(
                f"  {regime:8} {method:6} {result.num_accepted.mean():8.2f} {times[0]:9.2f} "
                f"{floor_1:7.2f} {times[0] / floor_1:6.2f} {times[1]:10.2f} {floor_n:7.2f} "
                f"{times[1] / floor_n:6.2f}"
            )
    print(f"  read bandwidth {single / 1e9:.1f} GB/s on 1 thread, {threads / 1e9:.1f} GB/s on all")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps, smaller shapes")
    args = parser.parse_args()
    print(f"machine: {cpu_model()}, {platform.machine()}, {specaccept.get_num_threads()} threads")
    steps = 50 if args.quick else 2000
    print(f"\nExpected accepted drafts per block on the n-gram models ({steps} blocks per K):")
    print(f"  {'K':>3} {'token':>8} {'block':>8} {'gain':>7}")
    for k, token, block in ngram_gain([2, 4, 6, 8], steps, seed=1):
        print(f"  {k:>3} {token:8.3f} {block:8.3f} {100 * (block / token - 1):6.1f}%")
    if args.quick:
        timing(batch=4, k=4, vocab=4096, repeats=3)
    else:
        timing(batch=64, k=5, vocab=128256, repeats=7)


if __name__ == "__main__":
    main()
