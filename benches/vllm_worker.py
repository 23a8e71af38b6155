"""One vLLM configuration in a process of its own, for the vLLM benchmarks.

vLLM loads its plugins once per process, so each configuration (plugin on or
off, ``SPECACCEPT_VLLM_K``, a recording) runs as ``python SCRIPT --worker JOB``:
one engine process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), 2 GiB of KV cache, no
OpenMP thread binding, offline. The script's worker prints its result as the last
line of its output, in JSON. :class:`Served` keeps such a process running (``python
SCRIPT --serve JOB``) and sends it one command at a time, so that two engines can
take turns call by call (``paired.py``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections import deque
from collections.abc import Callable
from typing import IO, Any

#: vLLM's settings for every benchmark process.
VLLM_SETTINGS = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_CPU_KVCACHE_SPACE": "2",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "HF_HUB_OFFLINE": "1",
}


def _environment(plugin: dict[str, str]) -> dict[str, str]:
    """This process's environment with vLLM's settings and, of the plugin's
    ``SPECACCEPT_VLLM*`` variables, only those in ``plugin``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECACCEPT_VLLM")}
    return env | VLLM_SETTINGS | plugin


def _job_file(job: dict) -> str:
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as file:
        json.dump(job, file)
    return file.name


def run_worker(script: str, job: dict, plugin: dict[str, str]) -> tuple[dict, str]:
    """Runs ``script --worker JOB`` with vLLM's settings and, of the plugin's
    ``SPECACCEPT_VLLM*`` variables, only those in ``plugin``; returns the
    worker's JSON result and its log (output and errors). A failed run raises
    ``RuntimeError`` with the log's end."""
    path = _job_file(job)
    try:
        done = subprocess.run(
            [sys.executable, script, "--worker", path],
            env=_environment(plugin),
            capture_output=True,
            text=True,
        )
    finally:
        os.unlink(path)
    log = done.stdout + done.stderr
    if done.returncode:
        raise RuntimeError(log[-4000:])
    return json.loads(done.stdout.strip().splitlines()[-1]), log


#: How a served worker's answers begin (vLLM may print other lines).
ANSWER = "@@answer "


def serve(answer: Callable[[dict], dict]) -> None:
    """The worker's side of :class:`Served`: announces itself ready, then answers
    each JSON command read from standard input with ``answer(command)``, until
    standard input closes."""
    print(ANSWER + json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        print(ANSWER + json.dumps(answer(json.loads(line))), flush=True)


class Served:
    """``script --serve JOB`` kept running with vLLM's settings and ``plugin``'s
    variables (as :func:`run_worker`); :meth:`call` sends one command and returns
    the worker's answer. Idle, the worker blocks reading its input and computes
    nothing. A worker that ends early raises ``RuntimeError`` with its log's end."""

    def __init__(self, script: str, job: dict, plugin: dict[str, str]):
        self._path = _job_file(job)
        self._errors: IO[str] = tempfile.TemporaryFile("w+")
        self._output: deque[str] = deque(maxlen=400)
        self._process = subprocess.Popen(
            [sys.executable, script, "--serve", self._path],
            env=_environment(plugin),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._errors,
            text=True,
        )
        try:
            self._answer()  # ready: the engine is built and warm
        except BaseException:
            self.close()
            raise

    def call(self, command: dict) -> dict[str, Any]:
        assert self._process.stdin is not None
        self._process.stdin.write(json.dumps(command) + "\n")
        self._process.stdin.flush()
        return self._answer()

    def _answer(self) -> dict[str, Any]:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            if line.startswith(ANSWER):
                return json.loads(line[len(ANSWER) :])
            self._output.append(line)
        self._process.wait()
        raise RuntimeError(f"the worker ended ({self._process.returncode}):\n{self.log()[-4000:]}")

    def log(self) -> str:
        """The worker's output lines so far (the last 400) and its errors."""
        self._errors.seek(0)
        return "".join(self._output) + self._errors.read()

    def close(self) -> None:
        if self._process.stdin is not None and not self._process.stdin.closed:
            self._process.stdin.close()
        try:
            self._process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._errors.close()
        if os.path.exists(self._path):
            os.unlink(self._path)

    def __enter__(self) -> Served:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
