"""vLLM on SmolLM2 in a process of its own: ``python tests/vllm_engine.py JOB.json OUT.json``,
or, with ``--serve FD``, each job in a fork of one process that imported vLLM
(:func:`serve`; tests/vllm_runs.py uses it).

tests/test_vllm_plugin.py runs one engine configuration per process (vLLM loads
its plugins once per process, so ``SPECACCEPT_VLLM`` is fixed there). The job:

- ``model``: the checkpoint folder; ``llm``: ``vllm.LLM``'s keyword arguments;
- ``poison``: a prompt whose requests get NaN logits from their first
  verification step on (:func:`poison`; one process only);
- ``runs``: a list of ``{"name", "prompts", "sampling"}``, ``sampling`` one dict of
  ``SamplingParams`` arguments for every prompt or a list of one per prompt; with
  ``"expect_error": true`` the run's output is ``{"error": "Type: message"}`` (or
  ``None`` when vLLM raised nothing).

The output: ``forward`` (the qualified name and module of vLLM's
``RejectionSampler.forward`` in this process), ``patched`` (whether specaccept
replaced it), per run the requests' ``text``, ``token_ids``, ``finish_reason`` and
``logprobs`` (per position, token id to ``[logprob, rank]``) and ``preempted``
(how many times vLLM's scheduler preempted it; one process mode), ``outputs``
(every completion's token ids, for ``n > 1``); ``drafter_runs`` (how many times
a model drafter ran its pass; one process mode); ``seconds`` (wall time of
the engine's start and of each run, for the test log); ``counters`` (vLLM's counters at
the end, when its statistics are on); and ``steps``:
each verification step's ``[num_draft_tokens, tokens emitted per request]`` (one
process mode; empty when the worker is spawned), and ``run_steps`` the same per run.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any


def poison(prompt_token_ids: list[int]) -> None:
    """From the first verification step on, the logits of every request whose prompt
    is ``prompt_token_ids`` are NaN (a model blowing up on one sequence), in the
    rows vLLM hands its rejection sampler; the prompt's own step is left alone."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    sample = GPUModelRunner._sample

    def poisoned(self, logits, spec_decode_metadata):
        if spec_decode_metadata is not None and logits is not None:
            start = 0
            for req_id, k in zip(
                self.input_batch.req_ids, spec_decode_metadata.num_draft_tokens, strict=False
            ):
                if list(self.requests[req_id].prompt_token_ids) == prompt_token_ids:
                    logits[start : start + k + 1] = float("nan")
                start += k + 1
        return sample(self, logits, spec_decode_metadata)

    GPUModelRunner._sample = poisoned


def count_preemptions() -> list[tuple[int, ...]]:
    """The prompt of each request vLLM's scheduler preempts, from now on (one
    process mode: the scheduler runs in this process)."""
    from vllm.v1.core.sched.scheduler import Scheduler

    preempted: list[tuple[int, ...]] = []
    preempt = Scheduler._preempt_request

    def counted(self, request, *args, **kwargs):
        preempted.append(tuple(request.prompt_token_ids or ()))
        return preempt(self, request, *args, **kwargs)

    Scheduler._preempt_request = counted
    return preempted


def count_drafter_runs() -> list[None]:
    """One entry per pass of vLLM's model drafters (draft model, EAGLE:
    ``SpecDecodeBaseProposer.propose``), from now on (one process mode)."""
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer

    runs: list[None] = []
    propose = SpecDecodeBaseProposer.propose

    def counted(self, *args, **kwargs):
        runs.append(None)
        return propose(self, *args, **kwargs)

    SpecDecodeBaseProposer.propose = counted
    return runs


def _params(sampling: dict) -> dict:
    """``SamplingParams`` arguments from JSON: ``logit_bias``'s token ids back to
    ints, ``structured_outputs`` (a dict) as vLLM's ``StructuredOutputsParams``."""
    if "logit_bias" in sampling:
        sampling = {
            **sampling,
            "logit_bias": {int(t): b for t, b in sampling["logit_bias"].items()},
        }
    if "structured_outputs" in sampling:
        from vllm.sampling_params import StructuredOutputsParams

        sampling = {
            **sampling,
            "structured_outputs": StructuredOutputsParams(**sampling["structured_outputs"]),
        }
    return sampling


def counters(llm) -> dict[str, float]:
    """vLLM's counters now (``LLM.get_metrics``; needs ``disable_log_stats=False``)."""
    try:
        metrics = llm.get_metrics()
    except Exception:
        return {}
    return {m.name: float(m.value) for m in metrics if type(m).__name__ == "Counter"}


def main(job_path: str, out_path: str) -> None:
    from vllm import LLM, SamplingParams
    from vllm.v1.sample.rejection_sampler import RejectionSampler

    with open(job_path) as file:
        job = json.load(file)
    preempted = count_preemptions()
    started = time.perf_counter()
    llm = LLM(model=job["model"], **job.get("llm", {}))
    seconds = {"engine": time.perf_counter() - started}
    if job.get("poison"):
        poison(llm.get_tokenizer()(job["poison"]).input_ids)
    forward = RejectionSampler.forward
    steps: list[list[list[int]]] = []

    def counted(self, metadata, draft_probs, logits, sm):
        result = forward(self, metadata, draft_probs, logits, sm)
        emitted = (result.sampled_token_ids != -1).sum(dim=1).tolist()
        steps.append([list(metadata.num_draft_tokens), emitted])
        return result

    # In this process's worker (one process mode): each verification step's
    # drafts and emitted tokens per request.
    RejectionSampler.forward = counted
    drafter_runs = count_drafter_runs()
    out: dict[str, Any] = {
        "forward": f"{forward.__module__}.{forward.__qualname__}",
        "patched": getattr(forward, "_specaccept", None) is not None,
        "runs": {},
        "run_steps": {},
    }
    for run in job["runs"]:
        prompts = run["prompts"]
        sampling = run["sampling"]
        if isinstance(sampling, dict):
            params: Any = SamplingParams(**_params(sampling))
        else:
            params = [SamplingParams(**_params(s)) for s in sampling]
        preempted.clear()
        first_step = len(steps)
        started = time.perf_counter()
        if run.get("expect_error"):
            try:
                llm.generate(prompts, params, use_tqdm=False)
            except Exception as error:
                out["runs"][run["name"]] = {"error": f"{type(error).__name__}: {error}"}
            else:
                out["runs"][run["name"]] = {"error": None}
            seconds[run["name"]] = time.perf_counter() - started
            continue
        results = llm.generate(prompts, params, use_tqdm=False)
        out["runs"][run["name"]] = [
            {
                "text": r.outputs[0].text,
                "token_ids": list(r.outputs[0].token_ids),
                "finish_reason": r.outputs[0].finish_reason,
                "logprobs": None
                if r.outputs[0].logprobs is None
                else [
                    {str(t): [p.logprob, p.rank] for t, p in position.items()}
                    for position in r.outputs[0].logprobs
                ],
                "preempted": preempted.count(tuple(r.prompt_token_ids or ())),
                "outputs": [list(o.token_ids) for o in r.outputs],
            }
            for r in results
        ]
        out["run_steps"][run["name"]] = steps[first_step:]
        seconds[run["name"]] = time.perf_counter() - started
    out["steps"] = steps
    out["seconds"] = seconds
    out["drafter_runs"] = len(drafter_runs)
    out["counters"] = counters(llm)
    with open(out_path, "w") as file:
        json.dump(out, file)


def serve(answers: int) -> None:
    """``python tests/vllm_engine.py --serve FD``: vLLM imported once, and each job
    run in a fork of this process, which has not started an engine or loaded a
    plugin (vLLM loads its plugins when an engine starts, in the fork, with the
    job's environment). One job per line on stdin, ``{"job", "out", "log",
    "env"}``: its environment replaces this one, its output and errors go to
    ``log``; answered on the file descriptor ``answers`` (not stdout, which
    vLLM's log may write to) with ``{"pid"}`` when it started and ``{"status"}``
    (its exit status) when it ended. Each job then costs an engine's start, not
    vLLM's and torch's imports. This process, and each job, die with their
    parent (Linux's parent-death signal)."""
    import os

    _die_with_parent()

    import vllm.plugins
    from vllm import LLM, SamplingParams  # noqa: F401  (imported once, for every fork)
    from vllm.v1.core.sched.scheduler import Scheduler  # noqa: F401
    from vllm.v1.sample.rejection_sampler import RejectionSampler  # noqa: F401
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer  # noqa: F401
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner  # noqa: F401

    for line in sys.stdin:
        request = json.loads(line)
        # A plugin loaded here would keep this process's environment in every fork.
        assert not vllm.plugins.plugins_loaded
        pid = os.fork()
        if pid == 0:
            os.close(answers)
            _run_forked(request)  # exits
        os.write(answers, (json.dumps({"pid": pid}) + "\n").encode())
        _, status = os.waitpid(pid, 0)
        os.write(
            answers, (json.dumps({"status": os.waitstatus_to_exitcode(status)}) + "\n").encode()
        )


def _die_with_parent() -> None:
    """SIGKILL for this process when its parent ends (``prctl(PR_SET_PDEATHSIG)``;
    nothing where the call is missing)."""
    import ctypes
    import signal

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)
    except (AttributeError, OSError):
        pass


def _run_forked(request: dict) -> None:
    """A job in the fork :func:`serve` made: as ``main`` in a process of its own
    (the process exits here, its exit handlers run: a recording is saved)."""
    import os
    import traceback

    _die_with_parent()
    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.close(null)
    os.environ.clear()
    os.environ.update(request["env"])
    code = 0
    try:
        main(request["job"], request["out"])
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(code)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        serve(int(sys.argv[2]))
    else:
        main(sys.argv[1], sys.argv[2])
