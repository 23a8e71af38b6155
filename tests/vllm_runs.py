"""Running vLLM's engine on SmolLM2 from a test: one configuration per process
(tests/vllm_engine.py), shared by tests/test_vllm_plugin.py and
tests/test_vllm_serving.py."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

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


def run_engine(model, tmp_path, name, runs, *, method="token", record=False, **options):
    """Runs tests/vllm_engine.py once; returns its output (and the recording)."""
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
    done = subprocess.run(
        [sys.executable, str(HERE / "vllm_engine.py"), str(job_path), str(out_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    log = done.stdout + done.stderr
    assert done.returncode == 0, f"vLLM exited with {done.returncode}:\n{log[-6000:]}"
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
