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

First, at ``B = 1`` on realistic inputs (the headline): SmolLM2-135M-Instruct's logits
over text (V = 49152), draft rows the target's plus Gaussian noise (sigma 0.3 and 1) or
another position's rows (a weak drafter), drafts sampled from the transformed draft rows,
fresh uniforms at every call, 64 steps a round; without filters, with top-k 50 / top-p 0.9,
and with min-p 0.05 (transformers' ``MinPLogitsWarper`` on its side). Then, as a labelled extra, at ``B = 1``
``verify_logits`` against Hugging Face transformers' path (its logits warpers position by position,
then ``_speculative_sampling``, the code of ``generate(assistant_model=...)``), both
on one thread, ``K = 5``, ``V`` = 32000, 128256 and 151936, in three regimes that
hold for any uniform (``reject`` at position 0, ``accept`` every draft, ``mixed``:
rejected at position 2), with and without top-k/top-p. ``1t q``: one thread with the
drafter's own ``q_t(x_t)`` given (``draft_token_probs``), so accepted positions read no
draft row. Only with PyTorch and transformers importable (CI's second environment);
``--hf-only`` runs it alone.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from functools import partial

import numpy as np
import specaccept
from harness import median_of_runs

SHAPES = [(64, 5, 128256), (1, 5, 151936)]
QUICK_SHAPES = [(8, 5, 32000), (1, 5, 32000)]
TEMPERATURE = 0.8


def numpy_transform(logits: np.ndarray, top_k: int, top_p: float, min_p: float = 0.0) -> np.ndarray:
    z = logits / TEMPERATURE
    z = z - z.max(axis=-1, keepdims=True)
    probs = np.exp(z)
    probs /= probs.sum(axis=-1, keepdims=True)
    if min_p:
        probs = np.where(probs >= min_p * probs.max(axis=-1, keepdims=True), probs, 0)
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


HF_VOCABS = (32000, 128256, 151936)
HF_K = 5


def hf_inputs(vocab: int, regime: str):
    """B = 1 logits where the regime holds for any uniform: ``reject`` (``q(x_0) ~ 1``,
    ``p(x_0) ~ 0``), ``accept`` (``q(x_t) ~ 0 < p(x_t)`` everywhere) or ``mixed``
    (accepted at positions 0 and 1, rejected at 2)."""
    rng = np.random.default_rng(1)
    target = (rng.standard_normal((1, HF_K + 1, vocab), dtype=np.float32) * 3).astype(np.float32)
    draft = target[:, :HF_K] + rng.standard_normal((1, HF_K, vocab), dtype=np.float32)
    best, worst = np.argmax(target[:, :HF_K], axis=-1), np.argmin(target[:, :HF_K], axis=-1)
    stop = {"reject": 0, "accept": HF_K, "mixed": 2}[regime]
    ids = np.where(np.arange(HF_K) < stop, best, worst)
    for t in range(HF_K):
        draft[0, t, ids[0, t]] += 50.0 if t >= stop else -50.0
    u = np.where(np.arange(HF_K) < stop, 0.0, np.nextafter(1.0, 0.0))[None, :]
    return ids, target, draft, u, np.array([0.5]), stop


def draft_probabilities(ids, draft, filters) -> np.ndarray:
    """``q_t(x_t)`` of the transformed draft rows, as a drafter that sampled ``x_t``
    from them holds it (NumPy, float64)."""
    probs = numpy_transform(
        draft.astype(np.float64) * (TEMPERATURE / filters["temperature"]),
        filters["top_k"],
        filters["top_p"],
    )
    return np.take_along_axis(probs, ids[..., None], axis=-1)[..., 0]


RECOVERY_CYCLE = 128


def cycling_recovery(call):
    """``call`` with ``recovery_uniforms`` cycling through ``RECOVERY_CYCLE`` values
    spread over ``[0, 1)``, one per call: the draw's cost depends on it (a few fall
    back to the float64 pass), so a time over a whole cycle is the mean over draws."""
    values = [np.array([(i + 0.5) / RECOVERY_CYCLE]) for i in range(RECOVERY_CYCLE)]
    state = {"i": 0}

    def cycled(**kwargs):
        state["i"] = (state["i"] + 1) % len(values)
        return call(recovery_uniforms=values[state["i"]], **kwargs)

    return cycled


def mean_seconds(fn: Callable[[], object], calls: int) -> float:
    """Mean seconds per call over ``calls`` calls in a row."""
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def hf_path(torch, hf_sampling, warpers, ids, target, draft):
    """What ``generate(assistant_model=...)`` does with the logits of one step: the
    logits processors position by position, then ``_speculative_sampling``."""
    candidate_ids = torch.from_numpy(ids)
    new_logits = torch.from_numpy(target).clone()
    candidate_logits = torch.from_numpy(draft).clone()
    for warp in warpers:
        for t in range(new_logits.shape[1]):
            new_logits[:, t] = warp(candidate_ids, new_logits[:, t])
        for t in range(candidate_logits.shape[1]):
            candidate_logits[:, t] = warp(candidate_ids, candidate_logits[:, t])
    return hf_sampling(candidate_ids, candidate_logits, HF_K, new_logits)


def hf_table(torch, repeats: int, vocabs=HF_VOCABS) -> None:
    """B = 1 against Hugging Face transformers on one thread each (issue 19)."""
    try:
        from transformers.generation.logits_process import (
            TemperatureLogitsWarper,
            TopKLogitsWarper,
            TopPLogitsWarper,
        )
        from transformers.generation.utils import _speculative_sampling
    except ImportError:
        print("transformers not importable: the B = 1 comparison is skipped")
        return
    threads = specaccept.get_num_threads()
    torch_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    print(
        f"\nB = 1, K = {HF_K}, float32 logits, temperature {TEMPERATURE}: Hugging Face "
        "transformers' warpers + _speculative_sampling (PyTorch, 1 thread) against "
        "verify_logits (1 thread, and all)"
    )
    print(
        f"{'V':>7} {'filters':<20} {'regime':<7} {'HF us':>8} {'1t us':>8} "
        f"{f'{threads}t us':>8} {'1t q us':>8} {'HF/1t':>6} {f'HF/{threads}t':>6} {'HF/1t q':>7}"
    )
    for vocab in vocabs:
        for regime in ("reject", "accept", "mixed"):
            ids, target, draft, u, ru, stop = hf_inputs(vocab, regime)
            for top_k, top_p in ((0, 1.0), (50, 0.9)):
                warpers = [TemperatureLogitsWarper(TEMPERATURE)]
                if top_k:
                    warpers += [TopKLogitsWarper(top_k), TopPLogitsWarper(top_p)]
                filters = dict(temperature=TEMPERATURE, top_k=top_k, top_p=top_p)
                call = partial(
                    specaccept.verify_logits,
                    ids,
                    target,
                    draft,
                    **filters,
                    uniforms=u,
                    recovery_uniforms=ru,
                )
                assert int(call().num_accepted[0]) == stop
                call = cycling_recovery(call)
                hf_call = partial(
                    hf_path, torch, _speculative_sampling, warpers, ids, target, draft
                )
                assert int(hf_call()[1]) == stop, regime
                # The drafter's own q(x_t) given: accepted positions read no draft row.
                given_q = draft_probabilities(ids, draft, filters)
                ours = [
                    (1, call),
                    (threads, call),
                    (1, partial(call, draft_token_probs=given_q)),
                ]
                for _, fn in ours:
                    fn()  # warm-up
                # Rounds of HF then ours (a whole cycle of recovery uniforms each):
                # the ratio is the median of the rounds' ratios, so a slow spell of
                # this shared machine hits both sides of one round.
                hf_times, our_times = [], [[] for _ in ours]
                for _ in range(repeats):
                    hf_times.append(mean_seconds(hf_call, 2))
                    for (n, fn), out in zip(ours, our_times, strict=True):
                        specaccept.set_num_threads(n)
                        out.append(mean_seconds(fn, RECOVERY_CYCLE))
                specaccept.set_num_threads(threads)
                hf = statistics.median(hf_times)
                times = [statistics.median(t) for t in our_times]
                ratios = [
                    statistics.median(h / o for h, o in zip(hf_times, t, strict=True))
                    for t in our_times
                ]
                label = "none" if not top_k else f"top-k {top_k}, top-p {top_p}"
                print(
                    f"{vocab:>7} {label:<20} {regime:<7} {hf * 1e6:>8.0f} {times[0] * 1e6:>8.0f} "
                    f"{times[1] * 1e6:>8.0f} {times[2] * 1e6:>8.0f} {ratios[0]:>6.1f} "
                    f"{ratios[1]:>6.1f} {ratios[2]:>7.1f}"
                )
    torch.set_num_threads(torch_threads)


# Realistic B = 1 inputs (issue 27): SmolLM2-135M-Instruct's logits on text, drafts
# sampled from the draft rows, fresh uniforms at every call.
SMOLLM2_TOKENS = 400
SMOLLM2_STEPS = 64
SMOLLM2_DRAFTERS = (
    ("target + N(0, 0.3^2)", 0.3),
    ("target + N(0, 1)", 1.0),
    ("weak: another position's", None),
)
#: (top-k, top-p, min-p) of the realistic table's rows.
SMOLLM2_FILTERS = ((0, 1.0, 0.0), (50, 0.9, 0.0), (0, 1.0, 0.05))


def filters_label(top_k: int, top_p: float, min_p: float = 0.0) -> str:
    parts = [f"top-k {top_k}"] * bool(top_k) + [f"top-p {top_p}"] * (top_p < 1)
    parts += [f"min-p {min_p}"] * bool(min_p)
    return ", ".join(parts) or "none"


def smollm2_logits(torch) -> np.ndarray | None:
    """SmolLM2's float32 logits ``[T, V]`` over the first tokens of the built-in
    text, or ``None`` when the model is not installed."""
    try:
        from specaccept.generation.hf import load_smollm2
        from specaccept.ngram import builtin_text

        target = load_smollm2()
    except (ImportError, ModuleNotFoundError) as error:
        print(f"SmolLM2 not available ({error}): the realistic B = 1 table is skipped")
        return None
    ids = target.tokenizer(builtin_text()[:6000])["input_ids"][:SMOLLM2_TOKENS]
    with torch.no_grad():
        logits = target.model(torch.tensor([ids])).logits[0]
    return logits.float().numpy()


def smollm2_steps(logits: np.ndarray, sigma: float | None, filters: dict, seed: int) -> list:
    """``SMOLLM2_STEPS`` verification steps at random positions: the target's rows
    ``[1, K+1, V]``, the drafter's rows ``[1, K, V]`` (the target's plus Gaussian
    noise, or, ``sigma=None``, the rows of other positions), and drafts sampled from
    the transformed draft rows (NumPy, float64)."""
    rng = np.random.default_rng(seed)
    positions, vocab = logits.shape
    steps = []
    for _ in range(SMOLLM2_STEPS):
        start = int(rng.integers(0, positions - HF_K - 1))
        target = logits[None, start : start + HF_K + 1].copy()
        if sigma is None:
            other = rng.integers(0, positions, size=HF_K)
            draft = logits[None, other].copy()
        else:
            noise = rng.standard_normal((1, HF_K, vocab), dtype=np.float32) * sigma
            draft = (target[:, :HF_K] + noise).astype(np.float32)
        q = numpy_transform(
            draft.astype(np.float64) * (TEMPERATURE / filters["temperature"]),
            filters["top_k"],
            filters["top_p"],
            filters.get("min_p", 0.0),
        )
        ids = np.array([[rng.choice(vocab, p=q[0, t] / q[0, t].sum()) for t in range(HF_K)]])
        given_q = np.take_along_axis(q, ids[..., None], axis=-1)[..., 0]
        steps.append((ids, target, draft, given_q))
    return steps


def smollm2_table(torch, repeats: int) -> None:
    """B = 1 against Hugging Face on realistic inputs: SmolLM2's logits, drafts
    sampled from the draft rows, fresh uniforms every call (issue 27)."""
    try:
        from transformers.generation.logits_process import (
            MinPLogitsWarper,
            TemperatureLogitsWarper,
            TopKLogitsWarper,
            TopPLogitsWarper,
        )
        from transformers.generation.utils import _speculative_sampling
    except ImportError:
        print("transformers not importable: the realistic B = 1 comparison is skipped")
        return
    logits = smollm2_logits(torch)
    if logits is None:
        return
    threads = specaccept.get_num_threads()
    torch_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    print(
        f"\nB = 1, K = {HF_K}, SmolLM2-135M-Instruct logits on text (V = {logits.shape[1]}), "
        f"temperature {TEMPERATURE}, drafts sampled from the draft rows, fresh uniforms: "
        f"Hugging Face (PyTorch, 1 thread) against verify_logits; {SMOLLM2_STEPS} steps a round"
    )
    print(
        f"{'drafter':<26} {'filters':<20} {'accepted':>8} {'HF us':>8} {'1t us':>8} "
        f"{f'{threads}t us':>8} {'1t q us':>8} {'HF/1t':>6} {f'HF/{threads}t':>6} {'HF/1t q':>7}"
    )
    for name, sigma in SMOLLM2_DRAFTERS:
        for top_k, top_p, min_p in SMOLLM2_FILTERS:
            filters = dict(temperature=TEMPERATURE, top_k=top_k, top_p=top_p, min_p=min_p)
            warpers = [TemperatureLogitsWarper(TEMPERATURE)]
            if top_k:
                warpers += [TopKLogitsWarper(top_k), TopPLogitsWarper(top_p)]
            if min_p:
                warpers.append(MinPLogitsWarper(min_p))
            steps = smollm2_steps(logits, sigma, filters, seed=7)
            generator = np.random.default_rng(11)

            def hf_round(steps=steps, warpers=warpers) -> None:
                for ids, target, draft, _ in steps:
                    hf_path(torch, _speculative_sampling, warpers, ids, target, draft)

            def our_round(given: bool, steps=steps, filters=filters, generator=generator) -> None:
                for ids, target, draft, q in steps:
                    specaccept.verify_logits(
                        ids,
                        target,
                        draft,
                        **filters,
                        rng=generator,
                        draft_token_probs=q if given else None,
                    )

            accepted = np.mean(
                [
                    specaccept.verify_logits(ids, t, d, **filters, rng=generator).num_accepted[0]
                    for ids, t, d, _ in steps
                ]
            )
            ours = [(1, False), (threads, False), (1, True)]
            hf_round()  # warm-up
            hf_times, our_times = [], [[] for _ in ours]
            for _ in range(repeats):
                start = time.perf_counter()
                hf_round()
                hf_times.append((time.perf_counter() - start) / len(steps))
                for (n, given), out in zip(ours, our_times, strict=True):
                    specaccept.set_num_threads(n)
                    start = time.perf_counter()
                    our_round(given)
                    out.append((time.perf_counter() - start) / len(steps))
            specaccept.set_num_threads(threads)
            hf = statistics.median(hf_times)
            times = [statistics.median(t) for t in our_times]
            ratios = [
                statistics.median(h / o for h, o in zip(hf_times, t, strict=True))
                for t in our_times
            ]
            label = filters_label(top_k, top_p, min_p)
            print(
                f"{name:<26} {label:<20} {accepted:>8.2f} {hf * 1e6:>8.0f} {times[0] * 1e6:>8.0f} "
                f"{times[1] * 1e6:>8.0f} {times[2] * 1e6:>8.0f} {ratios[0]:>6.1f} "
                f"{ratios[1]:>6.1f} {ratios[2]:>7.1f}"
            )
    torch.set_num_threads(torch_threads)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small shapes")
    parser.add_argument(
        "--hf-only", action="store_true", help="only the B = 1 comparison with transformers"
    )
    parser.add_argument(
        "--smollm2-only", action="store_true", help="only the realistic B = 1 table (SmolLM2)"
    )
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
    if torch is not None and not args.quick:
        smollm2_table(torch, repeats)
    if args.smollm2_only:
        return
    if torch is not None:
        print("\nLabelled extra, inputs built so that every decision is made at once (drafted")
        print("logits moved by +-50): the regimes hold for any uniform.")
        hf_table(torch, repeats, (32000,) if args.quick else HF_VOCABS)
    if args.hf_only:
        return
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
