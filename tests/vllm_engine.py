"""vLLM on SmolLM2 in a process of its own: ``python tests/vllm_engine.py JOB.json OUT.json``.

tests/test_vllm_plugin.py runs one engine configuration per process (vLLM loads
its plugins once per process, so ``SPECACCEPT_VLLM`` is fixed there). The job:

- ``model``: the checkpoint folder; ``llm``: ``vllm.LLM``'s keyword arguments;
- ``poison_processor``: add :class:`Poison` to the engine's logits processors;
- ``runs``: a list of ``{"name", "prompts", "sampling"}``, ``sampling`` one dict of
  ``SamplingParams`` arguments for every prompt or a list of one per prompt
  (``extra_args: {"poison": true}`` poisons a request).

The output: ``forward`` (the qualified name and module of vLLM's
``RejectionSampler.forward`` in this process), ``patched`` (whether specaccept
replaced it), and per run the requests' ``text``, ``token_ids`` and
``finish_reason``.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates


class Poison(LogitsProcessor):
    """Sets every logit of a request with ``extra_args={"poison": True}`` to NaN."""

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool):
        self.rows: dict[int, bool] = {}

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        process_dict_updates(
            self.rows,
            batch_update,
            lambda params, _, __: True if (params.extra_args or {}).get("poison") else None,
        )

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for row in self.rows:
            if row < logits.shape[0]:
                logits[row] = float("nan")
        return logits


def main(job_path: str, out_path: str) -> None:
    from vllm import LLM, SamplingParams
    from vllm.v1.sample.rejection_sampler import RejectionSampler

    with open(job_path) as file:
        job = json.load(file)
    kwargs = dict(job.get("llm", {}))
    if job.get("poison_processor"):
        kwargs["logits_processors"] = [Poison]
    llm = LLM(model=job["model"], **kwargs)
    forward = RejectionSampler.forward
    out: dict[str, Any] = {
        "forward": f"{forward.__module__}.{forward.__qualname__}",
        "patched": getattr(forward, "_specaccept", None) is not None,
        "runs": {},
    }
    for run in job["runs"]:
        prompts = run["prompts"]
        sampling = run["sampling"]
        if isinstance(sampling, dict):
            params: Any = SamplingParams(**sampling)
        else:
            params = [SamplingParams(**s) for s in sampling]
        results = llm.generate(prompts, params, use_tqdm=False)
        out["runs"][run["name"]] = [
            {
                "text": r.outputs[0].text,
                "token_ids": list(r.outputs[0].token_ids),
                "finish_reason": r.outputs[0].finish_reason,
            }
            for r in results
        ]
    with open(out_path, "w") as file:
        json.dump(out, file)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
