"""mlx-lm's speculative decoding with speculative sampling: drop-ins for
``mlx_lm.generate``'s ``speculative_generate_step``, ``stream_generate``,
``generate`` and ``batch_generate`` (with a draft model: rows verified
together), and for ``mlx_lm.sample_utils.make_sampler``.

mlx-lm (0.32, :data:`~specaccept.generation.mlx.MLX_LM_VERSIONS`) keeps a draft
only when it equals the token the target samples at that position: exact, but a
draft is kept with probability ``sum_x p(x) q(x)`` where speculative sampling keeps
it with ``sum_x min(p(x), q(x))`` (docs/spec.md section 1). Here the same call
verifies with specaccept's token method over mlx-lm's models and caches
(:class:`~specaccept.generation.mlx.MLXModel`), drawing each token from the law
mlx-lm's sampler draws it from: the target's log-probabilities filtered by top-p,
then min-p, then top-k (mlx-lm's own ``apply_top_p``, ``apply_min_p`` and
``apply_top_k``, in ``make_sampler``'s order, at temperature 1), then divided by the
temperature. Switching is one import::

    from specaccept.compat.mlx_lm import make_sampler, stream_generate

    sampler = make_sampler(temp=0.8, top_p=0.95)
    for response in stream_generate(model, tokenizer, prompt, max_tokens=128,
                                    draft_model=draft_model, sampler=sampler):
        print(response.text, end="")

What it honours: ``num_draft_tokens``, ``max_tokens``, ``sampler`` (from this
module's :func:`make_sampler`, whose settings it reads, or mlx-lm's greedy
sampler), ``stream``, ``prefill_step_size`` (prompts are fed in chunks of at most
that many tokens). What it refuses by name (``ValueError``): ``logits_processors``,
``prompt_cache``, ``kv_bits`` (a quantised cache), a sampler it cannot read (a
function: its law is unknown, so no verifier can keep to it) and XTC sampling
(a random filter). The randomness is specaccept's counter-based draws keyed by a
seed taken from MLX's global generator (``mx.random.seed`` makes a run
reproducible) or given as ``seed=``. :func:`batch_generate` verifies rows of
different lengths together (:func:`specaccept.generate` over
:class:`~specaccept.generation.mlx.MLXModel`).
The contract is docs/spec.md section 12.9.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import generation as _generation
from .._checks import check_int
from .._errors import InputError
from ..generation._drafters import PromptLookup
from ..generation._loop import run_steps
from ..generation._options import Options
from ..generation._session import _token_lists
from ..generation.mlx import MLXModel

__all__ = [
    "Sampler",
    "batch_generate",
    "generate",
    "make_sampler",
    "speculative_generate_step",
    "stream_generate",
]


@dataclass(frozen=True)
class Sampler:
    """mlx-lm's sampler, with its settings kept (what :func:`make_sampler` returns).

    Calling it is calling mlx-lm's own sampler of the same settings (a token from
    ``logprobs``); :meth:`process` gives the logits that sampler draws from, which
    is what the verifier reads.
    """

    temp: float = 0.0
    top_p: float = 0.0
    min_p: float = 0.0
    min_tokens_to_keep: int = 1
    top_k: int = 0
    _draw: Any = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        from mlx_lm.sample_utils import make_sampler as mlx_make_sampler

        for name in ("temp", "top_p", "min_p"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"{name} must be a number, got {type(value).__name__}")
            if not value >= 0 or value != value:
                raise InputError(f"{name} must be >= 0, got {value}", argument=name)
        if self.min_p > 1:
            raise InputError(f"min_p must lie in [0, 1], got {self.min_p}", argument="min_p")
        for name in ("min_tokens_to_keep", "top_k"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        if self.min_tokens_to_keep < 1:
            raise InputError("min_tokens_to_keep must be >= 1", argument="min_tokens_to_keep")
        if self.top_k < 0:
            raise InputError(f"top_k must be >= 0, got {self.top_k}", argument="top_k")
        draw = mlx_make_sampler(
            temp=float(self.temp),
            top_p=float(self.top_p),
            min_p=float(self.min_p),
            min_tokens_to_keep=self.min_tokens_to_keep,
            top_k=self.top_k,
        )
        object.__setattr__(self, "_draw", draw)

    @property
    def greedy(self) -> bool:
        return self.temp == 0

    def __call__(self, logprobs: Any) -> Any:
        return self._draw(logprobs)

    def process(self, logits: Any) -> Any:
        """The logits mlx-lm's sampler draws from, ``[..., V]`` (any leading
        shape): log-softmax, then top-p, min-p and top-k in ``make_sampler``'s
        order (mlx-lm's own functions), then divided by the temperature."""
        import mlx.core as mx

        return self.filtered(logits - mx.logsumexp(logits, axis=-1, keepdims=True))

    def filtered(self, logprobs: Any) -> Any:
        """:meth:`process` of log-probabilities already normalised."""
        from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p

        shape = logprobs.shape
        rows = logprobs.reshape(-1, shape[-1])
        if 0 < self.top_p < 1.0:
            rows = apply_top_p(rows, self.top_p)
        if self.min_p != 0.0:
            rows = apply_min_p(rows, self.min_p, self.min_tokens_to_keep)
        if self.top_k > 0:
            rows = apply_top_k(rows, self.top_k)
        return (rows * (1 / self.temp)).reshape(shape)


def make_sampler(
    temp: float = 0.0,
    top_p: float = 0.0,
    min_p: float = 0.0,
    min_tokens_to_keep: int = 1,
    top_k: int = 0,
    xtc_probability: float = 0.0,
    xtc_threshold: float = 0.1,
    xtc_special_tokens: Sequence[int] | None = None,
) -> Sampler:
    """``mlx_lm.sample_utils.make_sampler``'s call, returning a :class:`Sampler`
    (mlx-lm's sampler of the same settings, which :func:`speculative_generate_step`
    can read). XTC (``xtc_probability > 0``) is refused: it removes tokens at
    random, a law no verifier can keep to."""
    if xtc_probability:
        raise InputError(
            "xtc_probability: XTC sampling removes tokens at random; specaccept verifies "
            "temperature, top-p, min-p and top-k only",
            argument="xtc_probability",
        )
    return Sampler(temp, top_p, min_p, min_tokens_to_keep, top_k)


def _sampler(sampler: Any) -> Sampler:
    """The sampler's settings: ``None`` and mlx-lm's greedy sampler are greedy."""
    from mlx_lm.sample_utils import greedy_sampler

    if sampler is None or sampler is greedy_sampler:
        return Sampler()
    if isinstance(sampler, Sampler):
        return sampler
    raise InputError(
        "sampler: speculative sampling keeps to the law the sampler draws from, which a "
        "function does not tell; make it with specaccept.compat.mlx_lm.make_sampler (the "
        "same arguments as mlx-lm's), or pass None for greedy decoding",
        argument="sampler",
    )


class _Target:
    """The target's ``process``: the sampler's logits for the verifier, and the
    raw log-probabilities of the last call kept for the yields."""

    def __init__(self, sampler: Sampler):
        self.sampler = sampler
        self.logprobs: Any = None

    def __call__(self, logits: Any) -> Any:
        import mlx.core as mx

        self.logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        return logits if self.sampler.greedy else self.sampler.filtered(self.logprobs)


def _models(
    model: Any,
    draft_model: Any,
    draft: Any,
    settings: Sampler,
    prefill: int,
    target_process: Any = None,
) -> tuple[MLXModel, Any]:
    """The target and the drafter (an :class:`MLXModel` of ``draft_model``, or
    ``draft``: a ``PromptLookup``, an ``MLXModel``), both models' scores processed
    as the sampler draws; the target's through ``target_process`` where given."""
    if (draft_model is None) == (draft is None):
        raise InputError("give one of draft_model and draft", argument="draft_model")
    process = None if settings.greedy else settings.process
    target = MLXModel(model, process=target_process or process, prefill=prefill)
    if draft is None:
        drafter: Any = MLXModel(
            draft_model, vocab_size=target.vocab_size, process=process, prefill=prefill
        )
    elif isinstance(draft, PromptLookup):
        drafter = draft
    elif isinstance(draft, MLXModel):
        drafter = draft.with_process(process)
    else:
        raise TypeError(f"draft must be a PromptLookup or an MLXModel, got {type(draft).__name__}")
    return target, drafter


def _seed(seed: int | None) -> int:
    """``seed``, or one drawn from MLX's global generator (``mx.random.seed``)."""
    import mlx.core as mx

    if seed is None:
        return int(np.array(mx.random.randint(0, 2**31 - 1, (1,)))[0])
    return seed


def speculative_generate_step(
    prompt: Any,
    model: Any,
    draft_model: Any = None,
    stream: Any = None,
    *,
    num_draft_tokens: int = 2,
    max_tokens: int = 256,
    sampler: Any = None,
    logits_processors: Any = None,
    prompt_cache: Any = None,
    prefill_step_size: int = 512,
    kv_bits: int | None = None,
    kv_group_size: int = 64,
    quantized_kv_start: int = 5000,
    draft: Any = None,
    seed: int | None = None,
    eos_token_ids: Sequence[int] | None = None,
) -> Iterator[tuple[int, Any, bool]]:
    """``mlx_lm.generate.speculative_generate_step``, verified by speculative
    sampling: yields ``(token, logprobs, from_draft)`` as mlx-lm does (the token an
    int, ``logprobs`` the target's log-softmax ``[V]`` at its position, whether
    the token is an accepted draft).

    Beyond mlx-lm's arguments: ``draft`` (a specaccept drafter instead of
    ``draft_model``: :class:`~specaccept.PromptLookup`, an
    :class:`~specaccept.generation.mlx.MLXModel`), ``seed`` (the draws' key;
    default: taken from MLX's global generator) and ``eos_token_ids`` (stop after
    one of them: what ``stream_generate`` passes)."""
    import mlx.core as mx

    for name, value in (
        ("logits_processors", logits_processors),
        ("prompt_cache", prompt_cache),
        ("kv_bits", kv_bits),
    ):
        if value not in (None, [], ()):
            raise InputError(
                f"{name}: not supported by specaccept's speculative_generate_step "
                "(module docstring: what it honours)",
                argument=name,
            )
    settings = _sampler(sampler)
    num_draft_tokens = check_int(num_draft_tokens, "num_draft_tokens")
    max_tokens = check_int(max_tokens, "max_tokens")
    prefill_step_size = check_int(prefill_step_size, "prefill_step_size", 1)
    tokens = _token_lists([prompt.tolist() if hasattr(prompt, "tolist") else prompt], 1, "prompt")[
        0
    ]
    target_process = _Target(settings)
    target, drafter = _models(
        model, draft_model, draft, settings, prefill_step_size, target_process
    )
    options = Options.check(
        k=num_draft_tokens,
        max_new_tokens=max_tokens,
        greedy=settings.greedy,
        seed=_seed(seed),
        eos_token_id=None if not eos_token_ids else list(eos_token_ids),
    )
    emitted = 0
    with mx.stream(stream if stream is not None else mx.default_stream(mx.default_device())):
        for result in run_steps(target, drafter, [tokens], options):
            new = result.tokens[0][emitted:]
            if not new:
                continue
            logprobs = target_process.logprobs
            for j, token in enumerate(new):
                yield token, logprobs[0, j], j < len(new) - 1
            emitted += len(new)


def stream_generate(
    model: Any,
    tokenizer: Any,
    prompt: Any,
    max_tokens: int = 256,
    draft_model: Any = None,
    stream: Any = None,
    **kwargs: Any,
) -> Iterator[Any]:
    """``mlx_lm.generate.stream_generate`` with a draft model (or ``draft=``),
    verified by :func:`speculative_generate_step`: the same
    ``mlx_lm.generate.GenerationResponse`` objects (text segments, the token, its
    log-probabilities, ``from_draft``, timings, ``finish_reason`` ``"stop"`` or
    ``"length"``). Without a draft model it is mlx-lm's own."""
    import mlx.core as mx
    from mlx_lm.generate import GenerationResponse
    from mlx_lm.generate import stream_generate as mlx_stream_generate
    from mlx_lm.tokenizer_utils import TokenizerWrapper

    if draft_model is None and kwargs.get("draft") is None:
        kwargs.pop("draft", None)
        yield from mlx_stream_generate(model, tokenizer, prompt, max_tokens, **kwargs)
        return
    if not isinstance(tokenizer, TokenizerWrapper):
        tokenizer = TokenizerWrapper(tokenizer)
    if isinstance(prompt, str):
        special = tokenizer.bos_token is None or not prompt.startswith(tokenizer.bos_token)
        prompt = tokenizer.encode(prompt, add_special_tokens=special)
    ids = [int(t) for t in (prompt.tolist() if hasattr(prompt, "tolist") else prompt)]
    detokenizer = tokenizer.detokenizer
    stops = set(tokenizer.eos_token_ids)
    steps = speculative_generate_step(
        ids,
        model,
        draft_model,
        stream,
        max_tokens=max_tokens,
        eos_token_ids=sorted(stops),
        **kwargs,
    )
    started = time.perf_counter()
    prompt_tps = 0.0
    logprobs: Any = None
    n, token, from_draft = 0, 0, False

    def response(n: int, token: int, logprobs: Any, from_draft: bool, finish: str | None) -> Any:
        return GenerationResponse(
            text=detokenizer.last_segment,
            token=token,
            logprobs=logprobs,
            from_draft=from_draft,
            prompt_tokens=len(ids),
            prompt_tps=prompt_tps,
            generation_tokens=n + 1,
            generation_tps=(n + 1) / max(time.perf_counter() - started, 1e-9),
            peak_memory=mx.get_peak_memory() / 1e9,
            finish_reason=finish,
        )

    for n, (token, logprobs, from_draft) in enumerate(steps):
        if n == 0:
            prompt_tps = len(ids) / max(time.perf_counter() - started, 1e-9)
            started = time.perf_counter()
        if token in stops:
            break
        detokenizer.add_token(token)
        if n + 1 == max_tokens:
            break
        yield response(n, token, logprobs, from_draft, None)
    detokenizer.finalize()
    yield response(n, token, logprobs, from_draft, "stop" if token in stops else "length")


def generate(model: Any, tokenizer: Any, prompt: Any, verbose: bool = False, **kwargs: Any) -> str:
    """``mlx_lm.generate.generate``: the whole text of :func:`stream_generate`."""
    text = ""
    for response in stream_generate(model, tokenizer, prompt, **kwargs):
        if verbose:
            print(response.text, end="", flush=True)
        text += response.text
    if verbose:
        print()
    return text


#: mlx-lm's BatchGenerator settings that change no token: accepted, not used
#: (specaccept runs the prompts of a call in batches of ``completion_batch_size``).
_BATCH_TUNING = ("prefill_batch_size",)


def batch_generate(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[Sequence[int]],
    prompt_caches: Any = None,
    max_tokens: int | Sequence[int] = 128,
    verbose: bool = False,
    return_prompt_caches: bool = False,
    return_token_ids: bool = False,
    return_logprobs: bool = False,
    *,
    draft_model: Any = None,
    draft: Any = None,
    num_draft_tokens: int = 2,
    sampler: Any = None,
    seed: int | None = None,
    completion_batch_size: int = 32,
    prefill_step_size: int = 2048,
    stream: Any = None,
    **kwargs: Any,
) -> Any:
    """``mlx_lm.generate.batch_generate`` with a draft model (or ``draft=``):
    rows of different lengths verified together by speculative sampling
    (:func:`specaccept.generate` over :class:`~specaccept.generation.mlx.MLXModel`,
    ``completion_batch_size`` prompts at a time), where mlx-lm batches nothing
    with a draft model. Returns mlx-lm's ``BatchResponse``: each prompt's text
    and, with ``return_token_ids``, its tokens, ending before an EOS token of the
    tokenizer's as mlx-lm's do; ``stats`` with the prompts' tokens, the first
    step's time as ``prompt_time`` (it feeds the prompts), the generated tokens,
    the steps and the rest as ``decode_time``. Each row's draws are keyed by
    ``seed`` and its prompt (docs/spec.md section 12.4), so its text does not
    depend on the batch. Refused by name: ``prompt_caches``,
    ``return_prompt_caches``, ``return_logprobs``, ``logits_processors`` and
    ``max_kv_size`` (a rotating cache), as :func:`speculative_generate_step`
    refuses what it cannot keep exact. Without a draft model it is mlx-lm's own."""
    import mlx.core as mx
    from mlx_lm.generate import BatchResponse, BatchStats
    from mlx_lm.generate import batch_generate as mlx_batch_generate
    from mlx_lm.tokenizer_utils import TokenizerWrapper

    if draft_model is None and draft is None:
        return mlx_batch_generate(
            model, tokenizer, prompts, prompt_caches, max_tokens, verbose,  # type: ignore[arg-type]
            return_prompt_caches, return_token_ids, return_logprobs, sampler=sampler,
            completion_batch_size=completion_batch_size, prefill_step_size=prefill_step_size,
            stream=stream, **kwargs,
        )  # fmt: skip
    refused = {
        "prompt_caches": prompt_caches not in (None, [], ()),
        "return_prompt_caches": bool(return_prompt_caches),
        "return_logprobs": bool(return_logprobs),
        "logits_processors": kwargs.get("logits_processors") not in (None, [], ()),
        "max_kv_size": kwargs.get("max_kv_size") is not None,
    }
    for name, given in refused.items():
        if given:
            raise InputError(
                f"{name}: not supported by specaccept's batch_generate with a draft model",
                argument=name,
            )
    unknown = sorted(set(kwargs) - {"logits_processors", "max_kv_size", *_BATCH_TUNING})
    if unknown:
        raise TypeError(f"batch_generate() got an unexpected keyword argument {unknown[0]!r}")
    settings = _sampler(sampler)
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence):
        raise TypeError(f"prompts must be a list of token lists, got {type(prompts).__name__}")
    listed = [p.tolist() if hasattr(p, "tolist") else p for p in prompts]
    rows = _token_lists(listed, len(listed), "prompts")
    if isinstance(max_tokens, (int, np.integer)) and not isinstance(max_tokens, bool):
        limits = [check_int(max_tokens, "max_tokens")] * len(rows)
    else:
        if isinstance(max_tokens, (str, bytes)) or not isinstance(max_tokens, Sequence):
            raise TypeError(
                f"max_tokens must be an int or a list of ints, got {type(max_tokens).__name__}"
            )
        limits = [check_int(m, "max_tokens") for m in max_tokens]
        if len(limits) != len(rows):
            raise InputError(
                f"max_tokens has {len(limits)} entries for {len(rows)} prompts",
                argument="max_tokens",
            )
    completion_batch_size = check_int(completion_batch_size, "completion_batch_size", 1)
    prefill_step_size = check_int(prefill_step_size, "prefill_step_size", 1)
    if not isinstance(tokenizer, TokenizerWrapper):
        tokenizer = TokenizerWrapper(tokenizer)
    stops = sorted(set(tokenizer.eos_token_ids))
    target, drafter = _models(model, draft_model, draft, settings, prefill_step_size)
    seed = _seed(seed)
    k = check_int(num_draft_tokens, "num_draft_tokens")
    tokens: list[list[int]] = []
    stats = BatchStats(prompt_tokens=sum(len(r) for r in rows))
    begun = time.perf_counter()
    with mx.stream(stream if stream is not None else mx.default_stream(mx.default_device())):
        for start in range(0, len(rows), completion_batch_size):
            chunk = slice(start, start + completion_batch_size)
            out = _generation.generate(
                target, drafter, rows[chunk], k=k,
                max_new_tokens=max(limits[chunk], default=1) or 1, greedy=settings.greedy,
                temperature=1.0, seed=seed, eos_token_id=stops or None,
            )  # fmt: skip
            for row, limit in zip(out.tokens, limits[chunk], strict=True):
                row = row[:limit]
                tokens.append(row[:-1] if row and row[-1] in stops else row)
            stats.prompt_time += out.step_seconds[0] if out.step_seconds else 0.0
            stats.decode_time += sum(out.step_seconds[1:])
            stats.generation_steps += len(out.step_seconds)
            if verbose:
                print(f"[batch_generate] Finished processing {len(tokens)}/{len(rows)} ...")
    stats.generation_tokens = sum(len(t) for t in tokens)
    stats.wall_time = time.perf_counter() - begun
    stats.peak_memory = mx.get_peak_memory() / 1e9
    texts = [tokenizer.decode(t) for t in tokens]
    return BatchResponse(texts, stats, None, tokens if return_token_ids else None, None)
