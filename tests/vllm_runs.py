"""Running vLLM's engine on SmolLM2 from a test: one configuration per process
(tests/vllm_engine.py), shared by tests/test_vllm_plugin.py and
tests/test_vllm_serving.py."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import pathlib
import select
import signal
import subprocess
import sys
import time
from typing import Any

import numpy as np

HERE = pathlib.Path(__file__).parent
NGRAM = {
    "method": "ngram",
    "num_speculative_tokens": 4,
    "prompt_lookup_max": 3,
    "prompt_lookup_min": 1,
}
LLM_ARGS = {"dtype": "float32", "max_model_len": 512, "enforce_eager": True, "seed": 0}


def smollm2_folder() -> str:
    """SmolLM2 as a checkpoint folder vLLM reads (made once, cached)."""
    from specaccept.generation import hf

    cache = os.environ.get("SPECACCEPT_VLLM_MODEL") or os.path.expanduser(
        "~/.cache/specaccept/smollm2-135m-instruct-f32"
    )
    return str(hf.save_smollm2(cache))


def draft_folder(layers: int = 8) -> str:
    """SmolLM2's first ``layers`` decoder layers, its norm and head, as a draft
    model's checkpoint folder beside the model's (made once, cached)."""
    from specaccept.generation import hf

    return str(hf.save_smollm2(f"{smollm2_folder()}-{layers}-layers", layers))


#: The longest a job may run.
JOB_SECONDS = 900


class _Forks:
    """``tests/vllm_engine.py --serve FD``: one process that imported vLLM, forking
    a process per job (started at the first job, kept for the session; answering
    on a pipe of its own). Importing vLLM and torch takes about 20 s here, an
    engine's start about 10 s. A job that runs too long is killed and the server
    started anew. ``SPECACCEPT_VLLM_TEST_FORK=0`` runs each job in a fresh
    interpreter instead."""

    def __init__(self) -> None:
        self.process: subprocess.Popen | None = None
        self.answers = -1  # the read end of the server's answers
        self.buffer = b""

    def run(self, job: pathlib.Path, out: pathlib.Path, log: pathlib.Path, env: dict) -> int:
        """The job's exit status (``-9`` when it ran past :data:`JOB_SECONDS`)."""
        process = self._process(env)
        request = {"job": str(job), "out": str(out), "log": str(log), "env": env}
        assert process.stdin is not None
        process.stdin.write((json.dumps(request) + "\n").encode())
        process.stdin.flush()
        deadline = time.monotonic() + JOB_SECONDS
        started = self._answer(process, deadline)
        ended = None if started is None else self._answer(process, deadline)
        if started is None or ended is None:  # too long: the job and the server killed
            if started is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(started["pid"], signal.SIGKILL)
            self.stop()
            return -9
        return int(ended["status"])

    def stop(self) -> None:
        """Ends the server (its running job dies with it); the next job starts one."""
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            if self.process.stdin is not None:
                self.process.stdin.close()
            os.close(self.answers)
            self.process = None

    def _process(self, env: dict) -> subprocess.Popen:
        if self.process is not None and self.process.poll() is not None:
            self.stop()
        if self.process is None:
            base = {k: v for k, v in env.items() if not k.startswith("SPECACCEPT_VLLM")}
            read, write = os.pipe()
            self.process = subprocess.Popen(
                [sys.executable, str(HERE / "vllm_engine.py"), "--serve", str(write)],
                stdin=subprocess.PIPE,
                pass_fds=(write,),
                env=base,
            )
            os.close(write)
            self.answers, self.buffer = read, b""
        return self.process

    def _answer(self, process: subprocess.Popen, deadline: float) -> dict[str, Any] | None:
        """The server's next line, as JSON; ``None`` past ``deadline`` (an
        AssertionError when the server ended)."""
        fd = self.answers
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 65536)
            assert chunk, f"tests/vllm_engine.py --serve ended ({process.wait()})"
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)


_FORKS = _Forks()
atexit.register(_FORKS.stop)


def run_engine(model, tmp_path, name, runs, *, method="token", record=False, **options):
    """Runs tests/vllm_engine.py's job once (in a fork of :class:`_Forks`' process);
    returns its output (and the recording)."""
    job = {"model": model, "llm": {**LLM_ARGS, **options.get("llm", {})}, "runs": runs}
    if options.get("poison"):
        job["poison"] = options["poison"]
    job_path, out_path = tmp_path / f"{name}.json", tmp_path / f"{name}-out.json"
    job_path.write_text(json.dumps(job))
    env = {
        **os.environ,
        "VLLM_ENABLE_V1_MULTIPROCESSING": options.get("multiprocessing", "0"),
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "HF_HUB_OFFLINE": "1",
    }
    for variable in ("SPECACCEPT_VLLM", "SPECACCEPT_VLLM_RECORD", "SPECACCEPT_VLLM_K"):
        env.pop(variable, None)
    env.update(options.get("env", {}))
    if method is not None:
        env["SPECACCEPT_VLLM"] = method
    recording = tmp_path / f"{name}.npz"
    if record:
        env["SPECACCEPT_VLLM_RECORD"] = str(recording)
    if os.environ.get("SPECACCEPT_VLLM_TEST_FORK", "1") == "0":
        done = subprocess.run(
            [sys.executable, str(HERE / "vllm_engine.py"), str(job_path), str(out_path)],
            env=env,
            capture_output=True,
            text=True,
            timeout=JOB_SECONDS,
        )
        status, log = done.returncode, done.stdout + done.stderr
    else:
        log_path = tmp_path / f"{name}.log"
        status = _FORKS.run(job_path, out_path, log_path, env)
        log = log_path.read_text(errors="replace")
    assert status == 0, f"vLLM exited with {status}:\n{log[-6000:]}"
    out = json.loads(out_path.read_text())
    out["log"] = log
    if record:
        with np.load(recording) as data:
            out["recording"] = {k: data[k] for k in data.files}
    return out


def with_spec(**llm):
    return {"llm": {"speculative_config": NGRAM, **llm}}


def with_draft_model(folder, k=4, **llm):
    """vLLM's ``method="draft_model"`` with the draft model in ``folder``."""
    spec = {"method": "draft_model", "model": folder, "num_speculative_tokens": k}
    return {"llm": {"speculative_config": spec, **llm}}


def texts(out, run):
    return [r["token_ids"] for r in out["runs"][run]]


def same_until_eos(vllm_ids, hf_ids):
    """vLLM stops at the end-of-sequence token (HF here runs on): compare up to it."""
    return hf_ids[: len(vllm_ids)] == vllm_ids
