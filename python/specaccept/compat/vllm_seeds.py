"""Seeded requests in vLLM, keyed by position (docs/spec.md section 9.3, "Seeds").

vLLM draws a seeded request's randomness from its own ``torch.Generator``, whose
state follows the schedule: a request resumed after preemption, or drafted
another number of tokens, draws its noise at other positions, so its text
depends on the batch. With the plugin on, a seeded request at a temperature
above 0 draws instead from specaccept's counter streams (docs/spec.md section
4.6): key :func:`specaccept._uniforms.request_seed` of its seed and prompt,
offset the number of tokens it has generated before the token drawn.

- A step without drafts (vLLM's ``Sampler``): the token at offset ``o`` is drawn
  from the request's row (vLLM's processors, then section 8.2's transform) with
  the recovery uniform of offset ``o``.
- A verification step with deterministic drafts (n-gram, ``draft_probs=None``) and
  ``method="token"``: each position ``t`` draws the target's own sample ``y_t`` the
  same way at offset ``o + t``, and the drafts are kept while they equal it
  (:func:`match_samples`, the rule of docs/spec.md section 12.4). So the text is
  the same whatever was drafted, in any batch and under preemption.
- Otherwise (drafter probabilities, ``method="block"``): the verifier's own
  ``seeds``/``offsets`` draws at offset ``o`` (:func:`counter_step_uniforms`):
  independent of the batch and of preemption, not of the number of drafts.

The model runner's ``_sample`` is wrapped to read each step's seeded requests
(:class:`SeededRows`) from its input batch; vLLM's ``Sampler.sample`` to redraw
those rows in steps without drafts.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["SeededRows", "counter_step_uniforms", "current", "install", "match_samples"]

_STEP = threading.local()


@dataclass(frozen=True)
class SeededRows:
    """The seeded requests of the step being sampled: their batch indices, keys
    and offsets (tokens generated before this step), ``uint64``; ``plain`` when
    the step has no drafts (vLLM's ``Sampler`` draws)."""

    index: np.ndarray
    keys: np.ndarray
    offsets: np.ndarray
    plain: bool

    def sampled(self, batch: int, temperature: np.ndarray) -> list[int]:
        """The entries whose request is in a batch of ``batch`` at a temperature
        above 0 (greedy requests draw nothing)."""
        return [j for j, b in enumerate(self.index.tolist()) if b < batch and temperature[b] > 0]


def current() -> SeededRows | None:
    """The step's seeded requests while the model runner samples, else ``None``
    (a sampler called outside a runner's step, or the step could not be read)."""
    return getattr(_STEP, "rows", None)


def install() -> None:
    """Wraps ``GPUModelRunner._sample`` (the step's seeded requests) and
    ``Sampler.sample`` (their tokens in steps without drafts), once per process."""
    from vllm.v1.sample.sampler import Sampler
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    if getattr(GPUModelRunner._sample, "_specaccept", False):
        return
    sample_step, sample = GPUModelRunner._sample, Sampler.sample

    def _sample(self: Any, logits: Any, spec_decode_metadata: Any) -> Any:
        _STEP.rows = _read_step(self, spec_decode_metadata is None)
        try:
            return sample_step(self, logits, spec_decode_metadata)
        finally:
            _STEP.rows = None

    def _sampler_sample(
        self: Any, logits: Any, sampling_metadata: Any, logprobs_mode_override: Any = None
    ) -> Any:
        step = current()
        if step is None or not step.plain or not step.index.size or sampling_metadata.all_greedy:
            return sample(self, logits, sampling_metadata, logprobs_mode_override)
        return _redraw_plain(sample, self, logits, sampling_metadata, logprobs_mode_override, step)

    _sample._specaccept = True  # type: ignore[attr-defined]
    GPUModelRunner._sample = _sample  # type: ignore[method-assign]
    Sampler.sample = _sampler_sample  # type: ignore[method-assign]


def _read_step(runner: Any, plain: bool) -> SeededRows | None:
    """The runner's seeded requests now, or ``None`` (logged once) when its input
    batch cannot be read: they then draw from their ``torch.Generator``, as vLLM."""
    from .._uniforms import request_seed
    from .vllm_plugin import _log_once

    try:
        batch = runner.input_batch
        index = np.array(sorted(i for i in batch.generators if i < batch.num_reqs), dtype=np.int64)
        cache: dict[str, int] = runner.__dict__.setdefault("_specaccept_seed_keys", {})
        if len(cache) > 2 * batch.num_reqs + 64:  # requests that left the batch
            cache.clear()
        keys = np.zeros(index.size, dtype=np.uint64)
        for j, i in enumerate(index.tolist()):
            req_id = batch.req_ids[i]
            if req_id not in cache:
                state = runner.requests[req_id]
                cache[req_id] = request_seed(
                    state.sampling_params.seed, state.prompt_token_ids or []
                )
            keys[j] = cache[req_id]
        offsets = (batch.num_tokens_no_spec[index] - batch.num_prompt_tokens[index]).astype(
            np.uint64
        )
        return SeededRows(index, keys, offsets, plain)
    except Exception as error:  # vLLM's own draws for seeded requests
        _log_once(
            "seeds",
            "specaccept: seeded requests draw from their torch.Generator (the model "
            "runner's step could not be read: %r)",
            error,
        )
        return None


def position_draws(
    rows: np.ndarray, params: tuple[np.ndarray, ...], keys: np.ndarray, offsets: np.ndarray
) -> tuple[np.ndarray, dict[int, Exception]]:
    """One token from each of ``rows [n, V]`` (logits, vLLM's processors applied),
    transformed by ``params`` (``temperature, top_k, top_p, min_p``, ``[n]``; min-p
    first, as vLLM) and drawn with the recovery uniform (stream 1, index 0) of
    ``keys[j]`` at ``offsets[j]``: what plain decoding draws at that offset. Rows
    that fail (non-finite logits) are in the returned errors, by row."""
    from .. import _native
    from .._uniforms import counter_uniforms

    n = rows.shape[0]
    recovery = counter_uniforms(keys, offsets, 0)[1]
    temperature, top_k, top_p, min_p = (np.ascontiguousarray(a) for a in params)
    result = _native.verify_flat_logits(
        np.zeros(0, dtype=np.int64),
        np.zeros(n, dtype=np.int64),
        np.ascontiguousarray(rows),
        None,
        temperature,
        top_k,
        top_p,
        np.zeros(0),
        recovery,
        True,
        "token",
        min_p,
    )
    errors: dict[int, Exception] = {int(j): e for j, e in result[3]} if len(result) == 4 else {}
    return np.asarray(result[0])[:, 0], errors


def counter_step_uniforms(
    step: SeededRows, counts: list[int], temperature: np.ndarray, uniforms: Any, recovery: Any
) -> None:
    """Writes each seeded sampled request's acceptance uniforms (its slots of the
    flat ``uniforms [T]``) and recovery uniform (``recovery [B]``) from its counter
    streams at its offset: the verifier's own ``seeds``/``offsets`` draws."""
    from .._uniforms import counter_uniforms

    pick = step.sampled(len(counts), temperature)
    if not pick:
        return
    chosen = step.index[pick]
    width = max(counts[b] for b in chosen.tolist())
    own, own_recovery = counter_uniforms(step.keys[pick], step.offsets[pick], width)
    starts = np.cumsum([0, *counts])
    for j, b in enumerate(chosen.tolist()):
        uniforms[starts[b] : starts[b] + counts[b]] = own[j, : counts[b]]
        recovery[b] = own_recovery[j]


def match_samples(
    ids: np.ndarray,
    step: SeededRows,
    logits: np.ndarray,
    counts: list[int],
    drafts: np.ndarray,
    params: tuple[np.ndarray, ...],
) -> list[tuple[int, Exception]]:
    """docs/spec.md section 12.4's rule for deterministic drafts, on vLLM's flat
    layout: for each seeded request ``b`` at a temperature above 0, with ``k``
    drafts ``x`` (``drafts`` from its slot) and rows ``logits[s_b .. s_b + k]``,
    ``y_t`` = :func:`position_draws` of row ``t`` at offset ``o + t``; its row of
    ``ids`` becomes ``x_0 .. x_{n-1}, y_n`` (``n`` the first ``t`` with ``x_t !=
    y_t``, or ``k``), ``-1`` padded. Returns the requests whose rows failed."""
    pick = step.sampled(len(counts), params[0])
    if not pick:
        return []
    row_starts = np.cumsum([0, *(np.asarray(counts) + 1)])
    draft_starts = np.cumsum([0, *counts])
    which, entry, position = [], [], []
    for j in pick:
        b = int(step.index[j])
        for t in range(counts[b] + 1):
            which.append(b)
            entry.append(j)
            position.append(t)
    which_a, entry_a = np.array(which), np.array(entry)
    position_a = np.array(position, dtype=np.uint64)
    rows = row_starts[which_a] + position_a.astype(np.int64)
    tokens, bad = position_draws(
        logits[rows],
        tuple(np.asarray(p)[which_a] for p in params),
        step.keys[entry_a],
        step.offsets[entry_a] + position_a,
    )
    failed: dict[int, Exception] = {}
    for r, error in bad.items():
        failed.setdefault(int(which_a[r]), error)
    at = 0
    for j in pick:
        b = int(step.index[j])
        k = counts[b]
        y = tokens[at : at + k + 1]
        at += k + 1
        if b in failed:
            continue
        x = drafts[draft_starts[b] : draft_starts[b] + k]
        n = int(np.argmin(np.append(x == y[:k], False)))  # the first draft unlike its draw
        ids[b] = -1
        ids[b, :n] = x[:n]
        ids[b, n] = y[n]
    return sorted(failed.items())


def _redraw_plain(
    sample: Any, sampler: Any, logits: Any, sm: Any, mode: Any, step: SeededRows
) -> Any:
    """vLLM's ``Sampler.sample`` on a step without drafts, then each seeded sampled
    request's token replaced by :func:`position_draws` of its row (kept from before
    vLLM's in-place temperature) at its offset. A row that fails keeps vLLM's."""
    import torch

    from .vllm_plugin import _numpy, _per_request, _sampling

    batch = logits.shape[0]
    params = _per_request(batch, *_sampling(sm, batch, logits.shape[-1]))
    pick = step.sampled(batch, params[0])
    if not pick:
        return sample(sampler, logits, sm, mode)
    chosen = step.index[pick]
    saved = logits[torch.from_numpy(chosen)].to(torch.float32, copy=True)
    sampled, processed = sample(sampler, logits, sm, mode)
    tokens, bad = position_draws(
        _numpy(saved, "logits"),
        tuple(np.asarray(p)[chosen] for p in params),
        step.keys[pick],
        step.offsets[pick],
    )
    keep = np.array([j not in bad for j in range(len(pick))], dtype=bool)
    if keep.any():
        where = torch.from_numpy(chosen[keep])
        sampled[where] = torch.from_numpy(tokens[keep]).to(sampled.dtype)
    return sampled, processed
