"""One vLLM configuration in a process of its own, for the vLLM benchmarks.

vLLM loads its plugins once per process, so each configuration (plugin on or
off, ``SPECACCEPT_VLLM_K``, a recording) runs as ``python SCRIPT --worker JOB``:
one engine process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), 2 GiB of KV cache, no
OpenMP thread binding, offline. The script's worker prints its result as the last
line of its output, in JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

#: vLLM's settings for every benchmark process.
VLLM_SETTINGS = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_CPU_KVCACHE_SPACE": "2",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "HF_HUB_OFFLINE": "1",
}


def run_worker(script: str, job: dict, plugin: dict[str, str]) -> tuple[dict, str]:
    """Runs ``script --worker JOB`` with vLLM's settings and, of the plugin's
    ``SPECACCEPT_VLLM*`` variables, only those in ``plugin``; returns the
    worker's JSON result and its log (output and errors). A failed run raises
    ``RuntimeError`` with the log's end."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECACCEPT_VLLM")}
    env.update(VLLM_SETTINGS)
    env.update(plugin)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as file:
        json.dump(job, file)
    try:
        done = subprocess.run(
            [sys.executable, script, "--worker", file.name],
            env=env,
            capture_output=True,
            text=True,
        )
    finally:
        os.unlink(file.name)
    log = done.stdout + done.stderr
    if done.returncode:
        raise RuntimeError(log[-4000:])
    return json.loads(done.stdout.strip().splitlines()[-1]), log
