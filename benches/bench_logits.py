"""``verify_logits`` against the NumPy path (softmax + filters + ``verify``) and PyTorch.

Run after ``pip install .``::

    python benches/bench_logits.py            # a minute or two
    python benches/bench_logits.py --quick    # seconds

float32 logits with draft logits, ``(B, K, V)`` = (64, 5, 128256) and (1, 5, 151936),
without filters and with top-k = 50 / top-p = 0.9, temperature 0.8, in two regimes:
``reject`` (every row rejected at position 0: two rows transformed per row) and
``accept`` (every draft accepted: ``2K + 1`` rows transformed). The NumPy and PyTorch
paths transform every ``[B, K+1, V]`` row the way users write it (softmax, top-k by
partition, top-p by sorting), then call ``specaccept.verify``. Medians of whole calls,
in one run. The last column is the ``exp`` throughput of ``verify_logits`` (values
exponentiated per second, counting every element of every transformed row).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np
import specaccept

SHAPES = [(64, 5, 128256), (1, 5, 151936)]
QUICK_SHAPES = [(8, 5, 32000), (1, 5, 32000)]
TEMPERATURE = 0.8


def numpy_transform(logits: np.ndarray, top_k: int, top_p: float) -> np.ndarray:
    z = logits / TEMPERATURE
    z = z - z.max(axis=-1, keepdims=True)
    probs = np.exp(z)
    probs /= probs.sum(axis=-1, keepdims=True)
    if top_k:
        kth = -np.partition(-probs, top_k - 1, axis=-1)[..., top_k - 1 : top_k]
        probs = np.where(probs >= kth, probs, 0)
        probs /= probs.sum(axis=-1, keepdims=True)
    if top_p < 1:
        ordered = -np.sort(-probs, axis=-1)
        cumulative = np.cumsum(ordered, axis=-1)
        cut = np.argmax(cumulative >= top_p, axis=-1)[..., None]
        last = np.take_along_axis(ordered, cut, axis=-1)
        probs = np.where(probs >= last, probs, 0)
        probs /= probs.sum(axis=-1, keepdims=True)
    return probs


def torch_transform(torch, logits, top_k: int, top_p: float):
    probs = torch.softmax(logits / TEMPERATURE, dim=-1)
    if top_k:
        kth = torch.topk(probs, top_k, dim=-1).values[..., -1:]
        probs = torch.where(probs >= kth, probs, 0)
        probs = probs / probs.sum(-1, keepdim=True)
    if top_p < 1:
        ordered, _ = torch.sort(probs, dim=-1, descending=True)
        cut = (ordered.cumsum(-1) >= top_p).int().argmax(-1, keepdim=True)
        last = ordered.gather(-1, cut)
        probs = torch.where(probs >= last, probs, 0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def median_ms(fn: Callable[[], object], repeats: int) -> float:
    fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1e3


def inputs(batch: int, k: int, vocab: int, regime: str):
    rng = np.random.default_rng(0)
    target = (rng.standard_normal((batch, k + 1, vocab), dtype=np.float32) * 3).astype(np.float32)
    draft = target[:, :k] + rng.standard_normal((batch, k, vocab), dtype=np.float32)
    ids = np.argmax(target[:, :k], axis=-1)  # the target's favourite: kept by every filter
    u = np.full((batch, k), np.nextafter(1.0, 0.0) if regime == "reject" else 0.0)
    if regime == "reject":
        draft[np.arange(batch)[:, None], np.arange(k), ids] += 50.0  # q(x) ~ 1 > p(x)
    else:
        draft[np.arange(batch)[:, None], np.arange(k), ids] -= 50.0  # q(x) ~ 0 < p(x)
    return ids, target, draft, u, rng.random(batch)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small shapes")
    args = parser.parse_args()
    shapes, repeats = (QUICK_SHAPES, 3) if args.quick else (SHAPES, 7)
    try:
        import torch
    except ImportError:
        torch = None
        print("torch not importable: skipped")
    header = (
        f"{'B':>3} {'K':>2} {'V':>7} {'filters':<15} {'regime':<7} {'ours ms':>9} "
        f"{'numpy ms':>9} {'torch ms':>9} {'numpy/ours':>10} {'exp/s':>9}"
    )
    print(header)
    for batch, k, vocab in shapes:
        for regime in ("reject", "accept"):
            ids, target, draft, u, ru = inputs(batch, k, vocab, regime)
            for top_k, top_p in ((0, 1.0), (50, 0.9)):
                kw = dict(uniforms=u, recovery_uniforms=ru)
                filters = dict(temperature=TEMPERATURE, top_k=top_k, top_p=top_p)
                ours = specaccept.verify_logits(ids, target, draft, **filters, **kw)
                expected_n = 0 if regime == "reject" else k
                assert (ours.num_accepted == expected_n).all(), ours.num_accepted
                ours_ms = median_ms(
                    lambda: specaccept.verify_logits(ids, target, draft, **filters, **kw),  # noqa: B023
                    repeats,
                )
                numpy_ms = median_ms(
                    lambda: specaccept.verify(  # noqa: B023
                        ids,
                        numpy_transform(target, top_k, top_p),  # noqa: B023
                        numpy_transform(draft, top_k, top_p),  # noqa: B023
                        **kw,  # noqa: B023
                    ),
                    max(1, repeats // 3),
                )
                torch_ms = float("nan")
                if torch is not None:
                    tt, td = torch.from_numpy(target), torch.from_numpy(draft)
                    torch_ms = median_ms(
                        lambda: specaccept.verify(  # noqa: B023
                            ids,
                            torch_transform(torch, tt, top_k, top_p).numpy(),  # noqa: B023
                            torch_transform(torch, td, top_k, top_p).numpy(),  # noqa: B023
                            **kw,  # noqa: B023
                        ),
                        max(1, repeats // 3),
                    )
                rows = batch * (2 if regime == "reject" else 2 * k + 1)
                exps = rows * vocab / (ours_ms / 1e3)
                label = "none" if not top_k else f"top-k {top_k}, top-p {top_p}"
                print(
                    f"{batch:>3} {k:>2} {vocab:>7} {label:<15} {regime:<7} {ours_ms:>9.2f} "
                    f"{numpy_ms:>9.2f} {torch_ms:>9.2f} {numpy_ms / ours_ms:>10.1f} {exps:>9.2e}"
                )


if __name__ == "__main__":
    main()
