"""Engine layouts over specaccept's one kernel.

- :mod:`specaccept.compat.vllm`: vLLM's flattened ragged layout (drafts of all
  requests back to back, bonus tokens given), output ``[B, max_k + 1]`` padded
  with ``-1``.
- :mod:`specaccept.compat.flashinfer`: FlashInfer's ``chain_speculative_sampling``
  (padded ``[B, K]`` drafts, ``uniform_samples [B, K+1]``), returning output ids,
  the non-causal accepted count and the emitted-draft count.

Each is a thin layer: the verification runs in the same native kernel as
:func:`specaccept.verify`, under specaccept's rule; each module's docstring lists
where the original engine's rule differs.
"""

from . import flashinfer, vllm

__all__ = ["flashinfer", "vllm"]
