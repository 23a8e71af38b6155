"""specaccept inside vLLM: a general plugin that replaces vLLM's rejection sampling.

vLLM loads the entry point ``vllm.general_plugins`` / ``specaccept`` (this
module's :func:`register`) in every process it starts. The plugin is **opt-in**:
unless ``SPECACCEPT_VLLM`` names a method, it does nothing at all, and vLLM stays
exactly its own. With ``SPECACCEPT_VLLM=token`` (standard speculative sampling) or
``block`` (block verification), vLLM V1's ``RejectionSampler.forward`` is replaced,
on the CPU platform of the vLLM versions in :data:`SUPPORTED_VLLM`, by
:func:`specaccept.compat.vllm.verify_logits` over vLLM's logits, read in place:

- vLLM's own logits processors (penalties, bad words, allowed ids, min tokens,
  logit bias, thinking budget) stay vLLM's: where any is active in a step, the
  rows are copied and processed by vLLM's own methods, exactly as its forward
  does (the drafted positions by ``RejectionSampler.apply_logits_processors``,
  the bonus rows by ``Sampler.apply_logits_processors``);
- temperature, min-p, top-k and top-p are specaccept's (docs/spec.md section
  8.2, min-p first as vLLM's sampler applies it), applied only to the rows a
  request reads; the bonus token is drawn here too, from the bonus row, only
  when every draft is accepted;
- uniforms: from torch's global generator, as vLLM's; a request with a seed
  (vLLM's ``SamplingParams(seed=...)``) draws by position instead, so that its
  text does not depend on the batch, preemption or the number of drafts
  (:mod:`specaccept.compat.vllm_seeds`, docs/spec.md section 9.3).

With the plugin on, vLLM's refusal of ``min_p`` and ``logit_bias`` with
speculative decoding (``SamplingParams._validate_spec_decode``) is lifted: the
plugin serves both exactly (logit bias through vLLM's own processor, min-p in
specaccept's transform).

Cases it does not serve keep vLLM's own forward and say why in the log, once:
logits off the CPU, and a custom argmax-invariant logits processor (which vLLM
refuses with speculative decoding). Processed-logprobs modes are served from the
rows the plugin samples, and ``rejection_sample_method="synthetic"`` (which vLLM's
CPU path cannot run) by specaccept's ``lossy.Synthetic`` at vLLM's rates.

``SPECACCEPT_VLLM_K=auto`` also chooses, each step, how many of the n-gram
proposer's drafts each request keeps (:mod:`specaccept.compat.vllm_schedule`).

``SPECACCEPT_VLLM_RECORD=path.npz`` also records the verified steps (the
processed target rows, bonus position included, and the drafter's rows) in the
layout ``python -m specaccept compare --from`` reads.

docs/serving.md ("vLLM") has the install recipe and the guarantees.
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import threading
from typing import Any, Literal

import numpy as np

__all__ = ["METHODS", "SUPPORTED_VLLM", "register"]

#: The vLLM versions whose ``RejectionSampler`` this plugin was written against
#: (``vllm/v1/sample/rejection_sampler.py``): another version keeps its own.
SUPPORTED_VLLM = ("0.32.0",)

#: ``SPECACCEPT_VLLM``'s values: specaccept's chain methods.
METHODS = ("token", "block")

#: vLLM's greedy threshold (``vllm.v1.sample.sampler._SAMPLING_EPS``): a request
#: below it is sampled greedily.
SAMPLING_EPS = 1e-5

#: At most this many recorded request-steps are kept (each ``(K+1) * V`` float32
#: values), unless ``SPECACCEPT_VLLM_RECORD_ROWS`` says otherwise.
RECORD_ROWS = 256

# Under vLLM's own logger, so that its handlers print these lines.
logger = logging.getLogger("vllm.specaccept")

_LOGGED: set[str] = set()
_LOCK = threading.Lock()


def register() -> None:
    """The ``vllm.general_plugins`` entry point: installs the replacement when
    ``SPECACCEPT_VLLM`` names a method, else does nothing. Never raises: what it
    cannot do, it logs, and vLLM keeps its own path."""
    method = os.environ.get("SPECACCEPT_VLLM", "")
    if not method:
        if os.environ.get("SPECACCEPT_VLLM_K"):
            logger.warning(
                "specaccept: SPECACCEPT_VLLM_K is set but SPECACCEPT_VLLM is not: "
                "the plugin is off and vLLM drafts num_speculative_tokens as configured"
            )
        return
    try:
        _install(method)
    except Exception as error:  # never take vLLM down at start-up
        logger.warning("specaccept: not installed, vLLM keeps its own sampler: %r", error)


def _install(method: str) -> None:
    if method not in METHODS:
        logger.warning(
            "specaccept: SPECACCEPT_VLLM=%r is not one of %s; vLLM keeps its own sampler",
            method,
            METHODS,
        )
        return
    import vllm
    from vllm.platforms import current_platform

    version = getattr(vllm, "__version__", "unknown")
    if version not in SUPPORTED_VLLM:
        logger.warning(
            "specaccept: vLLM %s is not a version this plugin was written for (%s); "
            "vLLM keeps its own rejection sampler",
            version,
            ", ".join(SUPPORTED_VLLM),
        )
        return
    if not current_platform.is_cpu():
        logger.warning(
            "specaccept: vLLM's platform is %s, not the CPU; vLLM keeps its own rejection sampler",
            getattr(current_platform, "device_name", type(current_platform).__name__),
        )
        return
    from vllm.v1.sample.rejection_sampler import RejectionSampler

    with _LOCK:
        if getattr(RejectionSampler.forward, "_specaccept", None) is not None:
            return  # registered twice in this process
        original_init, original_forward = RejectionSampler.__init__, RejectionSampler.forward
        verifier = _Verifier("block" if method == "block" else "token", original_forward, version)

        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            original_init(self, *args, **kwargs)
            verifier.attach(self)

        def forward(self: Any, metadata: Any, draft_probs: Any, logits: Any, sm: Any) -> Any:
            return verifier.forward(self, metadata, draft_probs, logits, sm)

        forward._specaccept = verifier  # type: ignore[attr-defined]
        RejectionSampler.__init__ = __init__  # type: ignore[method-assign]
        RejectionSampler.forward = forward  # type: ignore[method-assign]
        try:
            _allow_min_p_and_logit_bias()
        except Exception as error:  # the sampler stays replaced; only this is not
            logger.warning(
                "specaccept: min_p and logit_bias stay refused with speculative decoding "
                "(vLLM's check could not be replaced: %r)",
                error,
            )
        try:
            _check_each_worker(method)
        except Exception as error:  # only the start-up check is lost
            logger.warning("specaccept: vLLM's CPU worker could not be wrapped: %r", error)
        try:
            from .vllm_seeds import install as install_seeds

            install_seeds()
        except Exception as error:  # seeded requests keep vLLM's generators
            logger.warning(
                "specaccept: seeded requests draw from their torch.Generator, as vLLM's "
                "own (the model runner could not be wrapped: %r)",
                error,
            )
    schedule = os.environ.get("SPECACCEPT_VLLM_K", "")
    if schedule:
        from .vllm_schedule import install

        install(schedule)


def _check_each_worker(method: str) -> None:
    """At each CPU worker's start (``CPUWorker.init_device``, which builds the
    model runner), :func:`check_runner` on its runner."""
    from vllm.v1.worker import cpu_worker

    init_device = cpu_worker.CPUWorker.init_device

    def checked(self: Any) -> None:
        init_device(self)
        check_runner(getattr(self, "model_runner", None), method)

    cpu_worker.CPUWorker.init_device = checked  # type: ignore[method-assign]


def check_runner(runner: Any, method: str) -> bool:
    """Whether the plugin acts in ``runner``'s steps; says so at start when not:
    vLLM's V2 model runner (``VLLM_USE_V2_MODEL_RUNNER=1``, or its default where
    Triton has a CPU backend) samples without V1's ``RejectionSampler``, so the
    plugin cannot take effect there (a warning). With speculative decoding off,
    an info line: only seeded requests' draws are the plugin's."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    if not isinstance(runner, GPUModelRunner):
        logger.warning(
            "specaccept: SPECACCEPT_VLLM=%s has no effect in this worker: its model runner "
            "%s is not vLLM V1's GPUModelRunner (vLLM's V2 model runner samples without "
            "V1's RejectionSampler); set VLLM_USE_V2_MODEL_RUNNER=0 for the plugin",
            method,
            type(runner).__module__ + "." + type(runner).__qualname__,
        )
        return False
    if getattr(runner, "speculative_config", None) is None:
        _log_once(
            "no-spec",
            "specaccept: speculative decoding is off: nothing to verify; seeded requests "
            "still draw by position (SPECACCEPT_VLLM=%s)",
            method,
            level=logging.INFO,
        )
    return True


def _allow_min_p_and_logit_bias() -> None:
    """vLLM 0.32 refuses a request with ``min_p`` or ``logit_bias`` when
    speculative decoding is on (``SamplingParams._validate_spec_decode``, its only
    check), and its model runner then builds only the min-tokens processor
    (``build_logitsprocs``). With the plugin verifying both are served exactly:
    the check accepts them, and the runner builds vLLM's built-in processors as
    without speculative decoding (min-p applied by specaccept's transform on
    verified steps, by vLLM's sampler on the others; the logit bias by vLLM's
    processor, and by :func:`_bias_drafted_rows` on the drafted rows). Custom
    processors stay refused, as vLLM refuses them."""
    from vllm.sampling_params import SamplingParams
    from vllm.v1.sample import logits_processor
    from vllm.v1.worker import gpu_model_runner

    def _validate_spec_decode(self: Any, speculative_config: Any) -> None:
        return None

    _validate_spec_decode._specaccept = True  # type: ignore[attr-defined]
    SamplingParams._validate_spec_decode = _validate_spec_decode  # type: ignore[method-assign]
    build = gpu_model_runner.build_logitsprocs

    def build_logitsprocs(
        vllm_config: Any,
        device: Any,
        is_pin_memory: bool,
        is_pooling_model: bool,
        custom_logitsprocs: Any = (),
    ) -> Any:
        if vllm_config.speculative_config and not is_pooling_model and not custom_logitsprocs:
            return logits_processor.LogitsProcessors(
                ctor(vllm_config, device, is_pin_memory)
                for ctor in logits_processor.BUILTIN_LOGITS_PROCESSORS
            )
        return build(vllm_config, device, is_pin_memory, is_pooling_model, custom_logitsprocs)

    gpu_model_runner.build_logitsprocs = build_logitsprocs


def _log_once(key: str, message: str, *args: Any, level: int = logging.WARNING) -> None:
    with _LOCK:
        if key in _LOGGED:
            return
        _LOGGED.add(key)
    logger.log(level, message, *args)


class _Verifier:
    """The replacement of ``RejectionSampler.forward`` (one per process)."""

    def __init__(self, method: Literal["token", "block"], original_forward: Any, version: str):
        self.method, self.version = method, version
        self.original_forward = original_forward
        self.eos_token_id: int | None = None
        self.recorder: _Recording | None = None
        path = os.environ.get("SPECACCEPT_VLLM_RECORD")
        if path:
            self.recorder = _Recording(path)

    def attach(self, sampler: Any) -> None:
        """At the sampler's construction (inside vLLM's config context, once its
        logging is set up): the start-up line, the model's end-of-sequence token,
        and the recording's file name for this rank."""
        from .. import __version__

        if self.recorder is not None:
            self.recorder.name_for_rank()
        _log_once(
            "installed",
            "specaccept %s: vLLM %s's RejectionSampler.forward replaced by specaccept's %s "
            "verification from logits (SPECACCEPT_VLLM=%s)%s",
            __version__,
            self.version,
            self.method,
            self.method,
            f"; recording to {self.recorder.path}" if self.recorder else "",
            level=logging.INFO,
        )
        try:
            from vllm.config import get_current_vllm_config

            config = get_current_vllm_config().model_config
            eos = getattr(config.hf_text_config, "eos_token_id", None)
            if isinstance(eos, (list, tuple)):
                eos = eos[0] if eos else None
            self.eos_token_id = None if eos is None else int(eos)
        except Exception as error:  # a config without one: a bad request emits nothing
            _log_once("eos", "specaccept: no end-of-sequence token found (%r)", error)

    def unsupported(self, sampler: Any, logits: Any, sm: Any) -> str | None:
        """Why this step keeps vLLM's own forward, or ``None``."""
        MinPLogitsProcessor = _vllm().MinPLogitsProcessor

        if logits.device.type != "cpu":
            return f"logits on {logits.device}: specaccept verifies CPU tensors"
        for processor in sm.logitsprocs.argmax_invariant:
            if not isinstance(processor, MinPLogitsProcessor):
                return f"the argmax-invariant logits processor {type(processor).__name__}"
        return None

    def forward(self, sampler: Any, metadata: Any, draft_probs: Any, logits: Any, sm: Any) -> Any:
        reason = self.unsupported(sampler, logits, sm)
        if reason is not None:
            _log_once(reason, "specaccept: vLLM's own rejection sampler for this step: %s", reason)
            return self.original_forward(sampler, metadata, draft_probs, logits, sm)
        return self.verify(sampler, metadata, draft_probs, logits, sm)

    def verify(self, sampler: Any, metadata: Any, draft_probs: Any, logits: Any, sm: Any) -> Any:
        import torch

        from .. import _native
        from . import vllm_seeds

        counts = metadata.num_draft_tokens
        batch = len(counts)
        rows = _processed_rows(sampler, metadata, logits, sm)
        temperature, top_k, top_p, min_p = _sampling(sm, batch, logits.shape[-1])
        seeded = vllm_seeds.current()
        uniforms, recovery = _uniforms(sm, counts, temperature, seeded)
        per_request = _per_request(batch, temperature, top_k, top_p, min_p)
        rule = _rule(sampler, self.method, counts)
        drafts, flat = _numpy(metadata.draft_token_ids, "draft_token_ids"), _numpy(rows, "logits")
        # compat.vllm.verify_logits's native call, made here with vLLM's own
        # arrays (the serving path: no conversions to check, every value checked
        # natively; docs/spec.md section 9.1.1).
        result = _native.verify_flat_logits(
            drafts,
            np.asarray(counts, dtype=np.int64),
            flat,
            None if draft_probs is None else _numpy(draft_probs, "draft_probs"),
            per_request[0],
            per_request[1],
            per_request[2],
            uniforms,
            recovery,
            True,
            rule,
            per_request[3],
        )
        ids = result[0]
        failed: dict[int, Exception] = dict(result[3]) if len(result) == 4 else {}
        if seeded is not None and draft_probs is None and rule == "token":
            # Deterministic drafts of seeded requests: docs/spec.md section 9.3, "Seeds".
            for b, error in vllm_seeds.match_samples(
                ids, seeded, flat, counts, drafts, per_request
            ):
                failed.setdefault(b, error)
        for b, error in sorted(failed.items()):
            # vLLM's worker cannot finish one request with an error: the closest is
            # its end-of-sequence token (docs/spec.md section 9.3).
            logger.error("specaccept: request %d of this step ended: %s", b, error)
            ids[b] = -1
            if self.eos_token_id is not None:
                ids[b, 0] = self.eos_token_id
        out = torch.from_numpy(ids.astype(np.int32))
        if ids.shape[1] != metadata.max_spec_len + 1:  # vLLM's width, should they differ
            out = torch.full((batch, metadata.max_spec_len + 1), -1, dtype=torch.int32)
            out[:, : ids.shape[1]] = torch.from_numpy(ids.astype(np.int32))
        if self.recorder is not None:
            self.recorder.add(rows, metadata, draft_probs, per_request)
        logprobs = None
        if sm.max_num_logprobs is not None:
            # vLLM's own gathering (docs/spec.md section 9.3, item 6), from the raw
            # logits or, in a processed mode, the rows the tokens were drawn from.
            source = logits
            if sampler.is_processed_logprobs_mode:
                source = _processed_logits(rows, per_request, counts)
            logprobs = sampler._get_logprobs_tensors(
                sm.max_num_logprobs,
                metadata,
                logits,
                source[metadata.target_logits_indices].to(torch.float32),
                source[metadata.bonus_logits_indices].to(torch.float32),
                out,
            )
        return _vllm().SamplerOutput(sampled_token_ids=out, logprobs_tensors=logprobs)


def _rule(sampler: Any, method: str, counts: list[int]) -> Any:
    """The native chain rule of a step: the switch's method, or, when vLLM's
    ``rejection_sample_method`` is ``"synthetic"`` (vLLM's CPU path has none: it
    stops the engine), specaccept's ``lossy.Synthetic`` with vLLM's conditional
    rates of the step's first ``max(num_draft_tokens)`` positions (docs/spec.md
    sections 2.8 and 9.3)."""
    if not sampler.synthetic_mode or not counts or max(counts) == 0:
        return method
    rates = sampler.synthetic_conditional_rates.to("cpu").double().numpy()
    return ("synthetic", np.ascontiguousarray(rates[: max(counts)]))


def _numpy(tensor: Any, name: str) -> Any:
    """A CPU tensor as a NumPy array over its memory (``Tensor.numpy``, cheaper
    than DLPack per call); bfloat16, which ``Tensor.numpy`` refuses, through
    DLPack as an ``ml_dtypes.bfloat16`` array (``name`` in its errors)."""
    import torch

    from .._arrays import as_numpy

    if tensor.dtype == torch.bfloat16:
        return as_numpy(tensor, name)
    return tensor.detach().numpy()


@functools.cache
def _vllm() -> Any:
    """The vLLM classes the replacement reads, imported once."""
    from types import SimpleNamespace

    from vllm.v1.outputs import SamplerOutput
    from vllm.v1.sample.logits_processor import builtin

    return SimpleNamespace(
        SamplerOutput=SamplerOutput,
        MinPLogitsProcessor=builtin.MinPLogitsProcessor,
        MinTokensLogitsProcessor=builtin.MinTokensLogitsProcessor,
        LogitBiasLogitsProcessor=builtin.LogitBiasLogitsProcessor,
    )


def _needs_processors(sm: Any) -> bool:
    """Whether any of vLLM's own logits processors changes a row of this step."""
    LogitBiasLogitsProcessor = _vllm().LogitBiasLogitsProcessor
    MinTokensLogitsProcessor = _vllm().MinTokensLogitsProcessor

    if not sm.no_penalties or sm.allowed_token_ids_mask is not None or sm.bad_words_token_ids:
        return True
    for processor in sm.logitsprocs.non_argmax_invariant:
        if isinstance(processor, MinTokensLogitsProcessor):
            if processor.min_toks:
                return True
        elif isinstance(processor, LogitBiasLogitsProcessor):
            if processor.biases:
                return True
        else:
            return True  # a custom processor: assume it acts
    holder = sm.thinking_budget_state_holder
    return holder is not None and holder.has_tracked_requests()


def _processed_rows(sampler: Any, metadata: Any, logits: Any, sm: Any) -> Any:
    """``logits`` itself, or, where vLLM's processors act, a float32 copy processed
    by vLLM's own methods in its forward's order (bonus rows, then drafted rows)."""
    import torch

    if not _needs_processors(sm):
        return logits
    rows = logits.to(torch.float32, copy=True)
    bonus = metadata.bonus_logits_indices
    rows[bonus] = sampler.sampler.apply_logits_processors(rows[bonus], sm, True)
    target = metadata.target_logits_indices
    if target.numel():
        rows[target] = sampler.apply_logits_processors(rows[target], sm, metadata)
        _bias_drafted_rows(rows, target, metadata.num_draft_tokens, sm)
    return rows


def _bias_drafted_rows(rows: Any, target: Any, counts: list[int], sm: Any) -> None:
    """vLLM's logit bias on the drafted positions' rows, which its
    ``RejectionSampler.apply_logits_processors`` leaves out (vLLM refuses
    ``logit_bias`` with speculative decoding): each request's biases added to its
    rows, as ``LogitBiasLogitsProcessor`` adds them to the bonus rows."""
    import torch

    LogitBiasLogitsProcessor = _vllm().LogitBiasLogitsProcessor
    for processor in sm.logitsprocs.non_argmax_invariant:
        if not isinstance(processor, LogitBiasLogitsProcessor) or not processor.biases:
            continue
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
        where, tokens, values = [], [], []
        for b, biases in processor.biases.items():
            if b >= len(counts) or not counts[b]:
                continue
            for t in range(counts[b]):
                for token, bias in biases.items():
                    where.append(int(target[starts[b] + t]))
                    tokens.append(int(token))
                    values.append(float(bias))
        if where:
            index = (torch.tensor(where), torch.tensor(tokens))
            rows.index_put_(index, torch.tensor(values, dtype=rows.dtype), accumulate=True)


def _processed_logits(rows: Any, per_request: tuple[np.ndarray, ...], counts: list[int]) -> Any:
    """vLLM's ``processed_logits`` of a step, as the plugin samples: each sampled
    row (vLLM's processors applied) divided by its temperature where section
    8.2's transform (min-p, top-k, top-p) keeps a token, ``-inf`` elsewhere; greedy
    rows as they are. ``[T + B, V]`` float32."""
    import torch

    from ..generation._sampling import Sampling, transform

    values = rows.to(torch.float32).numpy()
    temperature, top_k, top_p, min_p = (
        np.repeat(np.asarray(a), np.asarray(counts) + 1) for a in per_request
    )
    probs, _ = transform(values[:, None, :], Sampling(temperature, top_k, top_p, min_p))
    out = values.copy()
    sampled = temperature > 0
    with np.errstate(divide="ignore", invalid="ignore"):
        scaled = values[sampled] / temperature[sampled, None].astype(np.float32)
    out[sampled] = np.where(probs[sampled, 0] > 0, scaled, -np.inf)
    return torch.from_numpy(out)


def _sampling(sm: Any, batch: int, vocab: int) -> tuple[Any, Any, Any, Any]:
    """Per request: temperature (0 for vLLM's greedy requests), top-k (0: off),
    top-p (1: off) and min-p (0: off; from vLLM's ``MinPLogitsProcessor``, by the
    request's index in the batch), as specaccept reads them (``[B]`` arrays, or
    one number for every request)."""
    if sm.all_greedy or sm.temperature is None:
        return 0.0, 0, 1.0, 0.0  # filters do not apply to greedy rows
    temperature = sm.temperature.numpy().astype(np.float64)
    temperature[temperature < SAMPLING_EPS] = 0.0
    top_k = np.zeros(batch, dtype=np.int64)
    if sm.top_k is not None:
        top_k = sm.top_k.numpy().astype(np.int64)
        top_k[(top_k <= 0) | (top_k >= vocab)] = 0
    top_p = np.ones(batch)
    if sm.top_p is not None:
        top_p = sm.top_p.numpy().astype(np.float64)
    min_p: Any = 0.0
    for processor in sm.logitsprocs.argmax_invariant:
        if isinstance(processor, _vllm().MinPLogitsProcessor) and processor.min_p_count:
            # vLLM keeps min-p as float32; widened, as the temperature.
            min_p = processor.min_p_cpu[:batch].astype(np.float64)
    return temperature, top_k, top_p, min_p


def _per_request(
    batch: int, temperature: Any, top_k: Any, top_p: Any, min_p: Any = 0.0
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``temperature``, ``top_k``, ``top_p``, ``min_p`` as ``[B]`` arrays (one
    number for every request: a read-only view)."""
    return (
        np.broadcast_to(np.asarray(temperature, dtype=np.float64), batch),
        np.broadcast_to(np.asarray(top_k, dtype=np.int64), batch),
        np.broadcast_to(np.asarray(top_p, dtype=np.float64), batch),
        np.broadcast_to(np.asarray(min_p, dtype=np.float64), batch),
    )


def _uniforms(
    sm: Any, counts: list[int], temperature: np.ndarray, seeded: Any = None
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """The step's uniforms, ``[T]`` and ``[B]``, from torch's global generator; a
    seeded request's from its counter streams at its offset (``seeded``, the
    step's :class:`~specaccept.compat.vllm_seeds.SeededRows`), or, when the step
    could not be read, its ``k + 1`` from its own generator (acceptance, then
    recovery or bonus); none when every request is greedy."""
    import torch

    if not np.any(temperature):
        return None, None
    total = sum(counts)
    drawn = torch.rand(total + len(counts), dtype=torch.float64).numpy()
    uniforms, recovery = drawn[:total], drawn[total:]
    if seeded is not None:
        from .vllm_seeds import counter_step_uniforms

        counter_step_uniforms(seeded, counts, temperature, uniforms, recovery)
    elif sm.generators:
        starts = np.cumsum([0, *counts])
        for b, generator in sm.generators.items():
            if b >= len(counts):
                continue
            k = counts[b]
            own = torch.rand(k + 1, dtype=torch.float64, generator=generator).numpy()
            uniforms[starts[b] : starts[b] + k] = own[:k]
            recovery[b] = own[k]
    return uniforms, recovery


class _Recording:
    """``SPECACCEPT_VLLM_RECORD``: the verified steps, as probabilities (vLLM's
    processed law: its processors, then specaccept's temperature, top-k, top-p),
    saved at exit (and when full) in ``compare --from``'s layout."""

    def __init__(self, path: str):
        self.path = path
        self.limit = int(os.environ.get("SPECACCEPT_VLLM_RECORD_ROWS", RECORD_ROWS))
        self.rows = 0
        self.saved = False
        self.recorder: Any = None
        atexit.register(self.save)

    def name_for_rank(self) -> None:
        """Rank ``r > 0`` of a distributed run writes ``stem.rank{r}.npz``."""
        try:
            import torch.distributed as dist

            rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        except Exception:
            rank = 0
        if rank:
            stem, ext = os.path.splitext(self.path)
            self.path = f"{stem}.rank{rank}{ext or '.npz'}"

    def add(self, rows: Any, metadata: Any, draft_probs: Any, sampling: tuple) -> None:
        from ..generation._record import Recorder
        from ..generation._sampling import Sampling, transform

        counts = np.asarray(metadata.num_draft_tokens, dtype=np.int64)
        drafted = np.flatnonzero(counts > 0)
        if not drafted.size or self.rows >= self.limit:
            return
        drafted = drafted[: self.limit - self.rows]
        if self.recorder is None:
            self.recorder = Recorder(self.path, draft_probs is None)
        width = int(counts[drafted].max())
        vocab = rows.shape[-1]
        starts = np.concatenate([[0], np.cumsum(counts + 1)[:-1]])
        draft_starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        values = rows.float().numpy() if hasattr(rows, "float") else np.asarray(rows)
        logits = np.zeros((drafted.size, width + 1, vocab), dtype=np.float32)
        ids = np.zeros((drafted.size, width), dtype=np.int64)
        flat_ids = np.asarray(metadata.draft_token_ids)
        draft = None if draft_probs is None else np.zeros((drafted.size, width, vocab), np.float32)
        q = None if draft_probs is None else np.asarray(draft_probs.float())
        for i, b in enumerate(drafted):
            k = int(counts[b])
            logits[i, : k + 1] = values[starts[b] : starts[b] + k + 1]
            ids[i, :k] = flat_ids[draft_starts[b] : draft_starts[b] + k]
            if draft is not None and q is not None:
                draft[i, :k] = q[draft_starts[b] : draft_starts[b] + k]
        temperature, top_k, top_p, min_p = (a[drafted] for a in sampling)
        law = Sampling(temperature, top_k, top_p, min_p)  # min-p first, as vLLM
        probs, _ = transform(logits, law, list(counts[drafted] + 1))
        self.recorder.add(ids, probs, draft, counts[drafted])
        self.rows += drafted.size
        if self.rows >= self.limit:
            _log_once(
                "record-full",
                "specaccept: %d steps recorded (SPECACCEPT_VLLM_RECORD_ROWS); saving %s",
                self.rows,
                self.path,
            )
            self.save()

    def save(self) -> None:
        if self.recorder is None or self.saved:
            return
        self.saved = True
        try:
            self.recorder.save()
            logger.info("specaccept: %d verified steps recorded in %s", self.rows, self.path)
        except Exception as error:
            logger.warning("specaccept: could not record %s: %r", self.path, error)
