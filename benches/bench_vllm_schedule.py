"""k chosen each step inside vLLM: plain decoding, fixed k, vLLM's per-batch-size
schedule and the plugin's ``SPECACCEPT_VLLM_K=auto``, in one run.

SmolLM2-135M-Instruct (float32) in vLLM's CPU build (the environment of
``.ci/vllm-env``, with specaccept installed), ``bench_generate.py``'s chat
prompts, ``ignore_eos`` so every request emits ``--tokens`` tokens. The drafter
(``--drafter``): ``ngram`` (``prompt_lookup_max=3``, ``prompt_lookup_min=1``) or
``draft-model`` (``method="draft_model"``: SmolLM2's own first ``--draft-layers``
of 30 layers, its norm and head, saved as a checkpoint by
``generation.hf.save_smollm2(..., layers=)``: the early exit as vLLM loads a draft
model)::

    python benches/bench_vllm_schedule.py            # about 30 minutes on 2 cores
    python benches/bench_vllm_schedule.py --drafter draft-model
    python benches/bench_vllm_schedule.py --quick    # the CI smoke run (about 3 minutes)
    python benches/bench_vllm_schedule.py --drafter draft-model --columns plain auto --repeats 3
    python benches/bench_vllm_schedule.py --drafter draft-model --paired --pairs 16

Every column runs in a process of its own (one engine per configuration; vLLM
loads plugins once per process), with the plugin on (``SPECACCEPT_VLLM=token``:
vLLM's own CPU sampler is wrong above temperature 0, docs/serving.md). In that
process the prompts run, at each batch size and temperature, in groups of that
size, one ``LLM.generate`` per group. The columns:

- ``plain``: no speculative decoding;
- ``k = 1, 2, 4, 8``: ``num_speculative_tokens`` fixed;
- ``per-batch``: vLLM's ``num_speculative_tokens_per_batch_size`` with the best
  schedule that can be written by hand: at each batch size the fixed ``k`` of
  this run with the most tokens per second (over both temperatures), so it runs
  after the fixed columns;
- ``auto``: ``num_speculative_tokens=8`` and ``SPECACCEPT_VLLM_K=auto`` (the
  plugin's AdaptiveK trims each request's drafts every step); the controller lives
  as long as the engine, so only the process's first group starts from nothing;
- ``k=0`` (only when named in ``--columns``): ``num_speculative_tokens=8`` with
  every draft dropped, as ``auto`` drops them when it drafts nothing: n-gram
  proposals after the proposer ran, a draft model's before it runs (no drafter
  forward). vLLM's speculative path with nothing drafted, measured apart from the
  controller: ``k=0/plain`` is what that path costs, ``auto/k=0`` what the
  controller adds.

Reported per point: output tokens per second over the ``generate`` calls, the
same after each call's first engine step (which feeds the prompts), emitted
tokens per target call (tokens over the request-steps that decoded), and
``auto``'s ratios to plain, to the best fixed ``k`` and to ``per-batch``.
``--columns`` runs a subset (plain and auto always); ``--repeats N`` runs each
column N times in rotated orders and reports each number's median.

``--paired`` (plain and auto unless ``--columns`` names more; not ``per-batch``)
keeps every column's engine running at once, each in its own process, idle ones
blocked on their input, and runs each group in every column in turn, the order
rotated from group to group: each of auto's calls has plain's same call seconds
away, not minutes. ``--pairs N`` repeats the groups until each point has at least
N pairs. auto/plain is then the geometric mean of the pairs' speed ratios with its
95% interval and the verdict against the goal of 0.97x (``paired.py``). Never
run beside another busy process: vLLM pins its OpenMP threads and both slow down
tenfold.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from datetime import date
from typing import Any

from paired import CONFIDENCE, ratio_cell
from vllm_worker import Served, run_worker, serve

FIXED = (1, 2, 4, 8)
#: The issue's goal against plain decoding (never slower than 0.97x).
GOAL = 0.97
#: ... and against a fixed k (at least 0.95x the best).
GOAL_FIXED = 0.95
NGRAM = {"method": "ngram", "prompt_lookup_max": 3, "prompt_lookup_min": 1}


def engine(job: dict) -> tuple[Any, list[tuple[float, int]], list[dict]]:
    """The column's engine, warm; the list its steps are recorded into (each engine
    step's start and requests: this process is vLLM's worker); the prompts."""
    from vllm import LLM, SamplingParams
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    options = {}
    if job["speculative"] is not None:
        options["speculative_config"] = {**job["drafter"], **job["speculative"]}
    llm = LLM(
        model=job["model"],
        dtype="float32",
        max_model_len=1024,
        max_num_seqs=max(job["batches"]),
        enforce_eager=True,
        seed=0,
        **options,
    )
    steps: list[tuple[float, int]] = []
    execute = GPUModelRunner.execute_model

    def counted(self, scheduler_output, *args, **kwargs):
        steps.append((time.perf_counter(), len(scheduler_output.num_scheduled_tokens)))
        return execute(self, scheduler_output, *args, **kwargs)

    GPUModelRunner.execute_model = counted
    if job.get("drop_drafts"):
        drop_drafts(GPUModelRunner)
    from bench_generate import chat_ids

    tokenizer = llm.get_tokenizer()
    prompts = [{"prompt_token_ids": chat_ids(tokenizer, m)} for m in job["messages"]]
    llm.generate(prompts[:1], SamplingParams(max_tokens=4), use_tqdm=False)  # warm-up
    return llm, steps, prompts


def drop_drafts(runner_class: Any) -> None:
    """The ``k=0`` column: every draft dropped before vLLM schedules it (n-gram
    proposals after the proposer ran; a draft model not run at all)."""
    import torch

    propose = runner_class.propose_draft_token_ids
    take = runner_class.take_draft_token_ids

    def proposed(self, *args, **kwargs):
        if self.speculative_config.method == "ngram":
            return propose(self, *args, **kwargs)
        self._draft_probs = None
        self._draft_prob_req_ids = None
        rows = len(self.input_batch.req_ids)
        return torch.empty((rows, 0), dtype=torch.int64, device=self.device)

    def taken(self):
        drafts = take(self)
        if drafts is None:
            return None
        return type(drafts)(list(drafts.req_ids), [[] for _ in drafts.req_ids])

    runner_class.propose_draft_token_ids = proposed
    runner_class.take_draft_token_ids = taken


def run_group(llm: Any, steps: list, group: list[dict], temperature: float, tokens: int) -> dict:
    """One ``LLM.generate`` of ``group``: its output tokens, seconds, seconds after
    its first engine step (which fed the prompts and emitted each request's first
    token) and request-steps after the first."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=temperature, max_tokens=tokens, ignore_eos=True, seed=None)
    steps.clear()
    start = time.perf_counter()
    outputs = llm.generate(group, params, use_tqdm=False)
    end = time.perf_counter()
    return {
        "tokens": sum(len(r.outputs[0].token_ids) for r in outputs),
        "seconds": end - start,
        "after_first": end - steps[1][0] if len(steps) > 1 else 0.0,
        "request_steps": sum(n for _, n in steps[1:]),
    }


def point(batch: int, temperature: float, calls: list[dict], requests: int) -> dict:
    """A point's numbers from its calls (``requests`` of them emitted a first token
    in their first step)."""
    tokens = sum(c["tokens"] for c in calls)
    return {
        "batch": batch,
        "temperature": temperature,
        "tokens_per_s": tokens / sum(c["seconds"] for c in calls),
        "after_first_per_s": (tokens - requests) / sum(c["after_first"] for c in calls),
        "per_target_call": (tokens - requests) / max(sum(c["request_steps"] for c in calls), 1),
        "groups": len(calls),
    }


def cell(p: dict) -> str:
    """A point's table cell: tokens/s end to end (after the first step) [emitted
    per target call]."""
    return f"{p['tokens_per_s']:.1f} ({p['after_first_per_s']:.1f}) [{p['per_target_call']:.2f}]"


def print_header(prompts: int, tokens: int) -> None:
    """The run's date, machine, command and workload."""
    print(
        f"\n{date.today()}, {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"python benches/bench_vllm_schedule.py {' '.join(sys.argv[1:])} "
        f"({prompts} prompts, {tokens} tokens each)"
    )


def worker(job: dict) -> dict:
    """One column: every point, in one engine (``--worker JOB``)."""
    llm, steps, prompts = engine(job)
    points = []
    for batch in job["batches"]:
        for temperature in job["temperatures"]:
            calls = [
                run_group(llm, steps, prompts[i : i + batch], temperature, job["tokens"])
                for i in range(0, len(prompts), batch)
            ]
            points.append(point(batch, temperature, calls, len(prompts)))
    return {"points": points}


def served(job: dict) -> None:
    """One column's engine kept running (``--serve JOB``): each command runs one
    group (``start``, ``batch``, ``temperature``) and answers with its call."""
    llm, steps, prompts = engine(job)
    serve(
        lambda c: run_group(
            llm,
            steps,
            prompts[c["start"] : c["start"] + c["batch"]],
            c["temperature"],
            job["tokens"],
        )
    )


def job(base: dict, speculative: dict | None) -> dict:
    """A column's job: its speculative config (``drop``: the ``k=0`` column)."""
    speculative = dict(speculative) if speculative is not None else None
    drop = bool(speculative and speculative.pop("drop", False))
    return {**base, "speculative": speculative, "drop_drafts": drop}


def plugin(auto: bool) -> dict[str, str]:
    return {"SPECACCEPT_VLLM": "token"} | ({"SPECACCEPT_VLLM_K": "auto"} if auto else {})


def check_started(job: dict, log: str) -> None:
    """Raises unless the plugin's log says its schedule started."""
    kind = "n-gram" if job["drafter"]["method"] == "ngram" else "draft model's"
    if f"SPECACCEPT_VLLM_K=auto: each request's {kind} drafts" not in log:
        raise RuntimeError("the plugin's schedule did not start:\n" + log[-4000:])


def run(job: dict, auto: bool) -> dict:
    result, log = run_worker(__file__, job, plugin(auto))
    if auto:
        check_started(job, log)
    return result


def median_points(runs: list[list[dict]]) -> list[dict]:
    """Each point's median over a column's runs (every number of it)."""
    import statistics

    return [
        {
            key: statistics.median(run[i][key] for run in runs)
            if isinstance(value, float)
            else value
            for key, value in point.items()
        }
        for i, point in enumerate(runs[0])
    ]


def hand_schedule(results: dict, batches: list[int]) -> list[list[int]]:
    """vLLM's ``num_speculative_tokens_per_batch_size``: at each batch size the
    fixed k (of those run) with the most tokens per second summed over the
    temperatures."""
    schedule = []
    for batch in batches:
        rates = {
            k: sum(p["tokens_per_s"] for p in results[f"k={k}"] if p["batch"] == batch)
            for k in FIXED
            if f"k={k}" in results
        }
        schedule.append([batch, batch, max(rates, key=lambda k: rates[k])])
    # Ranges between the measured sizes take the next smaller one's k.
    return [
        [b, (schedule[i + 1][0] - 1 if i + 1 < len(schedule) else b), k]
        for i, (b, _, k) in enumerate(schedule)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="plain, k=4, auto; batch 2; T=0.8")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4, 8, 16])
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 0.8])
    parser.add_argument(
        "--model", default=os.path.expanduser("~/.cache/specaccept/smollm2-135m-instruct-f32")
    )
    parser.add_argument("--drafter", choices=["ngram", "draft-model"], default="ngram")
    parser.add_argument("--draft-layers", type=int, default=8)
    parser.add_argument(
        "--columns",
        nargs="+",
        help="run only these columns (plain, k=0, k=1, k=2, k=4, k=8, per-batch, auto; "
        "per-batch needs the fixed ones it chooses from; k=0 only when named); the ratios are "
        "to the columns run",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="run every column (per-batch excepted) this many times, in rotated orders; "
        "each cell the median",
    )
    parser.add_argument(
        "--paired",
        action="store_true",
        help="keep every column's engine running and run each group in each in turn, seconds "
        "apart (the order alternated); report auto/plain with its confidence interval",
    )
    parser.add_argument(
        "--pairs",
        type=int,
        default=1,
        help="--paired: at least this many pairs of calls per point (the groups repeated)",
    )
    parser.add_argument("--out", help="write every number as JSON")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        with open(args.worker) as file:
            print(json.dumps(worker(json.load(file))))
        return
    if args.serve:
        with open(args.serve) as file:
            served(json.load(file))
        return
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_generate import TEMPLATES, passages
    from specaccept.generation import hf

    model = str(hf.save_smollm2(args.model))
    drafter = NGRAM
    if args.drafter == "draft-model":
        folder = hf.save_smollm2(f"{args.model}-{args.draft_layers}-layers", args.draft_layers)
        drafter = {"method": "draft_model", "model": str(folder)}
    if args.quick:
        args.prompts, args.tokens, args.batches, args.temperatures = 4, 16, [2], [0.8]
    messages = [
        TEMPLATES[i % len(TEMPLATES)].format(p) for i, p in enumerate(passages(args.prompts))
    ]
    base = {
        "model": model,
        "messages": messages,
        "tokens": args.tokens,
        "batches": args.batches,
        "temperatures": args.temperatures,
        "drafter": drafter,
    }
    if args.paired and not args.columns:
        args.columns = ["plain", "auto"]
    columns: list[tuple[str, dict | None, bool]] = [("plain", None, False)]
    fixed = (4,) if args.quick else FIXED
    chosen = set(args.columns or ["plain", *(f"k={k}" for k in fixed), "per-batch", "auto"])
    unknown = chosen - {"plain", "k=0", *(f"k={k}" for k in FIXED), "per-batch", "auto"}
    if unknown or "plain" not in chosen or "auto" not in chosen:
        parser.error(f"--columns: plain and auto, and any of k=0 ... k=8, per-batch ({unknown})")
    fixed = tuple(k for k in fixed if f"k={k}" in chosen)
    if "k=0" in chosen:
        columns.append(("k=0", {"num_speculative_tokens": 8, "drop": True}, False))
    columns += [(f"k={k}", {"num_speculative_tokens": k}, False) for k in fixed]
    columns.append(("auto", {"num_speculative_tokens": 8}, True))
    if args.paired:
        if "per-batch" in chosen:
            parser.error("--paired: per-batch needs the fixed columns' results first")
        paired_run(args, base, columns)
        return
    runs: dict[str, list[list[dict]]] = {name: [] for name, _, _ in columns}
    began = time.perf_counter()
    for repeat in range(args.repeats):
        # Each repeat runs the columns in an order rotated by one (the machine's
        # drift between processes minutes apart falls on every column alike).
        for name, speculative, auto in columns[repeat:] + columns[:repeat]:
            runs[name].append(run(job(base, speculative), auto)["points"])
            print(
                f"{name}: done at {time.perf_counter() - began:.0f} s", file=sys.stderr, flush=True
            )
    results = {name: median_points(points) for name, points in runs.items() if name != "auto"}
    if not args.quick and fixed and "per-batch" in chosen:
        schedule = hand_schedule(results, args.batches)
        spec = {"num_speculative_tokens": 8, "num_speculative_tokens_per_batch_size": schedule}
        results["per-batch"] = run({**base, "speculative": spec}, False)["points"]
        print(f"per-batch {schedule}: done", file=sys.stderr, flush=True)
    else:
        schedule = None
    results["auto"] = median_points(runs["auto"])
    names = list(results)
    print_header(len(messages), args.tokens)
    if schedule:
        print(f"per-batch: num_speculative_tokens_per_batch_size={schedule}")
    print("\ntokens/s end to end (after the first step) [emitted per target call]\n")
    print("| batch | T | " + " | ".join(names) + " | auto/plain | auto/best k | auto/per-batch |")
    print("|---" * (len(names) + 5) + "|")
    for i, plain in enumerate(results["plain"]):
        cells = [cell(results[name][i]) for name in names]
        auto = results["auto"][i]["tokens_per_s"]
        best = max((results[f"k={k}"][i]["tokens_per_s"] for k in fixed), default=float("nan"))
        per_batch = results["per-batch"][i]["tokens_per_s"] if "per-batch" in results else None
        print(
            f"| {plain['batch']} | {plain['temperature']} | "
            + " | ".join(cells)
            + f" | {auto / plain['tokens_per_s']:.2f}x | {auto / best:.2f}x | "
            + (f"{auto / per_batch:.2f}x |" if per_batch else "- |")
        )
    if args.out:
        with open(args.out, "w") as file:
            json.dump(
                {"results": results, "schedule": schedule, "args": vars(args)}, file, indent=1
            )


def paired_run(args: argparse.Namespace, base: dict, columns: list) -> None:
    """``--paired``: every column's engine running at once; at each point each
    group runs in every column in turn (the order rotated group by group and
    repeat by repeat), so each of auto's calls has plain's same call seconds away.
    Prints each column's numbers and auto/plain as the geometric mean of the
    calls' speed ratios with its interval (paired.py)."""
    began = time.perf_counter()
    workers: dict[str, Served] = {}
    try:
        for name, speculative, auto in columns:
            workers[name] = Served(__file__, job(base, speculative), plugin(auto))
        print(f"engines ready at {time.perf_counter() - began:.0f} s", file=sys.stderr)
        names = list(workers)
        rows = []
        turn = 0
        for batch in args.batches:
            for temperature in args.temperatures:
                calls: dict[str, list[dict]] = {n: [] for n in names}
                groups = -(-len(base["messages"]) // batch)
                repeats = max(args.repeats, -(-args.pairs // groups))
                for _ in range(repeats):
                    for start in range(0, len(base["messages"]), batch):
                        command = {"start": start, "batch": batch, "temperature": temperature}
                        for name in names[turn % len(names) :] + names[: turn % len(names)]:
                            calls[name].append(workers[name].call(command))
                        turn += 1
                requests = len(base["messages"]) * repeats
                points = {n: point(batch, temperature, c, requests) for n, c in calls.items()}
                ratios = {
                    other: [
                        (a["tokens"] / a["seconds"]) / (o["tokens"] / o["seconds"])
                        for a, o in zip(calls["auto"], calls[other], strict=True)
                    ]
                    for other in names
                    if other != "auto"
                }
                if "k=0" in calls:  # what vLLM's speculative path costs with nothing drafted
                    ratios["k=0/plain"] = [
                        (a["tokens"] / a["seconds"]) / (o["tokens"] / o["seconds"])
                        for a, o in zip(calls["k=0"], calls["plain"], strict=True)
                    ]
                rows.append((points, ratios))
                print(
                    f"batch {batch}, T {temperature}: {ratio_cell(ratios['plain'], GOAL)} "
                    f"at {time.perf_counter() - began:.0f} s",
                    file=sys.stderr,
                    flush=True,
                )
        check_started(base, workers["auto"].log())
    finally:
        for served_worker in workers.values():
            served_worker.close()
    print_header(len(base["messages"]), args.tokens)
    others = [n if "/" in n else f"auto/{n}" for n in rows[0][1]] if rows else []
    print(
        "\ntokens/s end to end (after the first step) [emitted per target call]; auto/...: the "
        f"calls' geometric mean [{CONFIDENCE:.0%} interval] and the verdict against {GOAL}x "
        f"(plain) or {GOAL_FIXED}x (a fixed k)\n"
    )
    print("| batch | T | " + " | ".join(names) + " | pairs | " + " | ".join(others) + " |")
    print("|---" * (len(names) + len(others) + 3) + "|")
    for points, ratios in rows:
        cells = [cell(p) for p in points.values()]
        first = points["plain"]
        print(
            f"| {first['batch']} | {first['temperature']} | "
            + " | ".join(cells)
            + f" | {len(ratios['plain'])} | "
            + " | ".join(
                ratio_cell(r, GOAL if n in ("plain", "k=0", "k=0/plain") else GOAL_FIXED)
                for n, r in ratios.items()
            )
            + " |"
        )
    if args.out:
        with open(args.out, "w") as file:
            json.dump({"rows": rows, "args": vars(args)}, file, indent=1)


if __name__ == "__main__":
    main()
