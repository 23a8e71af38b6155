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
in one run. ``verify_logits`` runs on one thread (``1t``, against NumPy's one) and on
all (``Nt``, its default; PyTorch uses all cores too). The last column is its ``exp``
throughput on one thread (values exponentiated per second, counting every element of
every transformed row).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import numpy as np
import specaccept
from specaccept._bench import median_of_runs

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
    return median_of_runs(fn, repeats) * 1e3


def inputs(batch: int, k: int, vocab: int, regime: str):
    rng = np.random.default_rng(0)
    target = (rng.standard_normal((batch, k + 1, vocab), dtype=np.float32) * 3).astype(np.float32)
    draft = target[:, :k] + rng.standard_normal((batch, k, vocab), dtype=np.float32)
    # reject: the target's least likely token (p(x) ~ 0, filtered by top-k); accept: its favourite.
    ids = (
        np.argmin(target[:, :k], axis=-1)
        if regime == "reject"
        else np.argmax(target[:, :k], axis=-1)
    )
    u = np.full((batch, k), np.nextafter(1.0, 0.0) if regime == "reject" else 0.0)
    if regime == "reject":
        draft[np.arange(batch)[:, None], np.arange(k), ids] += 50.0  # q(x) ~ 1 > p(x)
    else:
        draft[np.arange(batch)[:, None], np.arange(k), ids] -= 50.0  # q(x) ~ 0 < p(x)
    return ids, target, draft, u, rng.random(batch)


def measure(case: tuple, top_k: int, top_p: float, torch, repeats: int) -> tuple[float, ...]:
    """Milliseconds per call: specaccept on 1 and all threads, the NumPy path, the
    PyTorch path (NaN without it)."""
    ids, target, draft, u, ru = case
    kw = dict(uniforms=u, recovery_uniforms=ru)
    filters = dict(temperature=TEMPERATURE, top_k=top_k, top_p=top_p)
    threads = specaccept.get_num_threads()
    ours = []
    for n in (1, threads):
        specaccept.set_num_threads(n)
        ours.append(
            median_ms(
                lambda: specaccept.verify_logits(ids, target, draft, **filters, **kw), repeats
            )
        )
    specaccept.set_num_threads(threads)
    numpy = median_ms(
        lambda: specaccept.verify(
            ids, numpy_transform(target, top_k, top_p), numpy_transform(draft, top_k, top_p), **kw
        ),
        max(1, repeats // 3),
    )
    with_torch = float("nan")
    if torch is not None:
        tt, td = torch.from_numpy(target), torch.from_numpy(draft)
        with_torch = median_ms(
            lambda: specaccept.verify(
                ids,
                torch_transform(torch, tt, top_k, top_p).numpy(),
                torch_transform(torch, td, top_k, top_p).numpy(),
                **kw,
            ),
            max(1, repeats // 3),
        )
    return ours[0], ours[1], numpy, with_torch


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
    n = specaccept.get_num_threads()
    print(
        f"{'B':>3} {'K':>2} {'V':>7} {'filters':<20} {'regime':<7} {'1t ms':>8} "
        f"{f'{n}t ms':>8} {'numpy ms':>9} {'torch ms':>9} {'np/1t':>6} {f'np/{n}t':>6} "
        f"{'exp/s 1t':>9}"
    )
    for batch, k, vocab in shapes:
        for regime in ("reject", "accept"):
            case = inputs(batch, k, vocab, regime)
            ids, target, draft, u, ru = case
            for top_k, top_p in ((0, 1.0), (50, 0.9)):
                check = specaccept.verify_logits(
                    ids,
                    target,
                    draft,
                    temperature=TEMPERATURE,
                    top_k=top_k,
                    top_p=top_p,
                    uniforms=u,
                    recovery_uniforms=ru,
                )
                assert (check.num_accepted == (0 if regime == "reject" else k)).all()
                one, ours, numpy, with_torch = measure(case, top_k, top_p, torch, repeats)
                rows = batch * (2 if regime == "reject" else 2 * k + 1)
                label = "none" if not top_k else f"top-k {top_k}, top-p {top_p}"
                print(
                    f"{batch:>3} {k:>2} {vocab:>7} {label:<20} {regime:<7} {one:>8.2f} "
                    f"{ours:>8.2f} {numpy:>9.2f} {with_torch:>9.2f} {numpy / one:>6.1f} "
                    f"{numpy / ours:>6.1f} {rows * vocab / (one / 1e3):>9.2e}"
                )


if __name__ == "__main__":
    main()
