"""Call overhead of ``verify`` and ``verify_greedy`` at B = 1: where a small call's time goes.

Run after ``pip install .``::

    python benches/bench_overhead.py           # about 10 seconds
    python benches/bench_overhead.py --quick   # about a second

A serving loop calls verification once per decoding step, so for one sequence
(B = 1) the fixed cost of a call matters as much as the kernel. This times, in
one run, the layers of one call on a tiny vocabulary (V = 8, the kernel is
negligible) and on (1, 5, 32000) float32 with draft probabilities:

- ``_native.verify``: the binding alone (argument checks, output arrays, GIL release);
- ``verify`` with the uniforms given: plus the Python layer;
- ``verify`` with ``rng`` a Generator: plus drawing the uniforms;
- ``verify(..., out=...)``: with caller-provided output buffers;
- ``verify_greedy``: the integer-only path;

and prints microseconds per call (best of several repeats of many calls).
"""

from __future__ import annotations

import argparse
import timeit
from collections.abc import Callable

import numpy as np
import specaccept
from specaccept import _native


def per_call_us(fn: Callable[[], object], number: int, repeat: int) -> float:
    fn()
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e6


def inputs(vocab: int, num_draft: int = 5) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    p = rng.random((1, num_draft + 1, vocab), dtype=np.float32)
    p /= p.sum(axis=-1, keepdims=True)
    q = rng.random((1, num_draft, vocab), dtype=np.float32)
    q /= q.sum(axis=-1, keepdims=True)
    # Rejected at position 0: the residual row pair is read.
    ids = np.argmax(q - p[:, :num_draft], axis=-1)
    return dict(
        draft_token_ids=ids,
        target_probs=p,
        draft_probs=q,
        uniforms=np.full((1, num_draft), np.nextafter(1.0, 0.0)),
        recovery_uniforms=np.full(1, 0.5),
    )


def calls(vocab: int) -> dict[str, Callable[[], object]]:
    c = inputs(vocab)
    ids, p, q, u, ru = (c[k] for k in c)
    g = np.random.default_rng(1)
    out = specaccept.Verification.empty(1, 5)
    targets = np.argmax(p, axis=-1)
    return {
        "_native.verify (binding only)": lambda: _native.verify(ids, p, q, None, u, ru, False),
        "verify(uniforms given)": lambda: specaccept.verify(**c),
        "verify(rng=Generator)": lambda: specaccept.verify(ids, p, q, rng=g),
        "verify(uniforms given, out=buffers)": lambda: specaccept.verify(**c, out=out),
        "verify_greedy (ids)": lambda: specaccept.verify_greedy(ids, targets),
        "verify_greedy (ids, out=buffers)": lambda: specaccept.verify_greedy(ids, targets, out=out),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    args = parser.parse_args()
    number, repeat = (200, 3) if args.quick else (5000, 7)
    tiny, real = calls(8), calls(32000)
    print(f"{'call':<40} {'V=8 us':>8} {'V=32000 us':>11}")
    for name in tiny:
        small, large = (per_call_us(c[name], number, repeat) for c in (tiny, real))
        print(f"{name:<40} {small:8.2f} {large:11.2f}")


if __name__ == "__main__":
    main()
