"""specaccept's loop inside Hugging Face's ``generate``: the ``custom_generate``
callable :func:`speculative` (exported as ``specaccept.generation.hf.speculative``).

``model.generate(**inputs, custom_generate=speculative, assistant_model=draft)``
(or ``prompt_lookup_num_tokens=4``): transformers prepares the inputs and the
generation config, then calls :func:`speculative` with ``_sample``'s signature.
It reads transformers' arguments (their names are kept here), refuses those it
cannot honour, runs :func:`specaccept.generation.generate`'s loop through the
same checked :class:`~specaccept.generation._options.Options`, and returns what
``generate`` returns. The contract is docs/spec.md section 12.8.

What transformers prepares and this ignores: the cache it made for the call
(``model_kwargs["past_key_values"]`` up to 5.17, ``["cache"]`` since; the loop
keeps its own sessions, one per model), ``position_ids`` (a row's positions
start at its first unpadded token, as transformers' do), ``logits_to_keep``
and ``use_cache``. transformers 4.57 and later do not pass ``assistant_model``
or ``streamer`` to a ``custom_generate`` callable; they are read from the
calling ``generate``'s arguments (its frame), as transformers 4.56 passed them.
"""

from __future__ import annotations

import importlib.metadata
import sys
import warnings
from typing import Any

import numpy as np

from .._errors import InputError
from .._schedule import HeuristicK
from ._drafters import PromptLookup
from ._loop import auto_schedule, context_of, drafter_key, run
from ._options import Options

__all__ = ["TRANSFORMERS_VERSIONS", "speculative"]

#: The transformers versions :func:`speculative` is tested with (inclusive): 4.56
#: introduced ``custom_generate`` callables; CI installs the newest.
TRANSFORMERS_VERSIONS = ("4.56.0", "5.25.0")

#: The processors ``generate`` builds from arguments the loop honours itself
#: (docs/spec.md section 8.2), or that change no law: ``renormalize_logits``.
_HONOURED_PROCESSORS = {
    "TemperatureLogitsWarper",
    "TopKLogitsWarper",
    "TopPLogitsWarper",
    "MinPLogitsWarper",
    "LogitNormalization",
}

#: The config value each honoured warper carries (it must be the config's: the
#: loop reads the config).
_WARPER_VALUE = {
    "TemperatureLogitsWarper": "temperature",
    "TopKLogitsWarper": "top_k",
    "TopPLogitsWarper": "top_p",
    "MinPLogitsWarper": "min_p",
}

#: The generate argument behind each processor or stopping criterion it cannot
#: honour (for the error message); others are named by their class.
_ARGUMENT_OF = {
    "MinLengthLogitsProcessor": "min_length (or min_new_tokens)",
    "MinNewTokensLengthLogitsProcessor": "min_new_tokens",
    "RepetitionPenaltyLogitsProcessor": "repetition_penalty",
    "NoRepeatNGramLogitsProcessor": "no_repeat_ngram_size",
    "TopHLogitsWarper": "top_h",
    "TypicalLogitsWarper": "typical_p",
    "EpsilonLogitsWarper": "epsilon_cutoff",
    "EtaLogitsWarper": "eta_cutoff",
    "NoBadWordsLogitsProcessor": "bad_words_ids",
    "SequenceBiasLogitsProcessor": "sequence_bias",
    "ForcedBOSTokenLogitsProcessor": "forced_bos_token_id",
    "ForcedEOSTokenLogitsProcessor": "forced_eos_token_id",
    "SuppressTokensLogitsProcessor": "suppress_tokens",
    "SuppressTokensAtBeginLogitsProcessor": "begin_suppress_tokens",
    "ClassifierFreeGuidanceLogitsProcessor": "guidance_scale",
    "UnbatchedClassifierFreeGuidanceLogitsProcessor": "guidance_scale",
    "ExponentialDecayLengthPenalty": "exponential_decay_length_penalty",
    "InfNanRemoveLogitsProcessor": "remove_invalid_values",
    "PrefixConstrainedLogitsProcessor": "prefix_allowed_tokens_fn",
    "WatermarkLogitsProcessor": "watermarking_config",
    "SynthIDTextWatermarkLogitsProcessor": "watermarking_config",
    "StopStringCriteria": "stop_strings",
    "MaxTimeCriteria": "max_time",
}

#: Generation-config values it cannot honour: the value that means "off", and why.
_OFF = {
    "num_beam_groups": (1, "beam search keeps several hypotheses per row"),
    "num_beams": (1, "beam search keeps several hypotheses per row"),
    "penalty_alpha": (None, "contrastive search is not sampling from the model"),
    "dola_layers": (None, "DoLa decoding changes the model's distribution"),
    "output_scores": (False, "a step scores several positions at once; no per-token scores"),
    "output_logits": (False, "a step scores several positions at once; no per-token logits"),
    "output_attentions": (False, "the sessions' attention is not transformers' per step"),
    "output_hidden_states": (False, "the sessions' states are not transformers' per step"),
    "token_healing": (False, "it rewrites the prompt"),
}

#: What ``generate`` passes in ``model_kwargs`` that the loop ignores (its own
#: sessions, positions and masks replace them).
_IGNORED_MODEL_KWARGS = {"position_ids", "logits_to_keep", "use_cache", "cache_position"}
_CACHE_KWARGS = ("cache", "past_key_values")


def _check_version() -> None:
    """The installed transformers' version, refused when older than the first
    tested one, warned about when newer than the last."""
    from packaging.version import Version

    version = importlib.metadata.version("transformers")
    low, high = (Version(v) for v in TRANSFORMERS_VERSIONS)
    if Version(version) < low:
        raise InputError(
            f"custom_generate=speculative needs transformers >= {TRANSFORMERS_VERSIONS[0]} "
            f"(callables in custom_generate), found {version}",
            argument="custom_generate",
        )
    if Version(version).release > high.release:
        warnings.warn(
            f"specaccept's custom_generate is tested with transformers {TRANSFORMERS_VERSIONS[0]} "
            f"to {TRANSFORMERS_VERSIONS[1]}, found {version}; what generate prepares may differ",
            UserWarning,
            stacklevel=3,
        )


#: How many frames up the calling ``generate`` is looked for (a wrapper or two
#: between it and :func:`speculative`).
_CALLER_DEPTH = 8


def _caller_arguments(frame: Any) -> dict[str, Any]:
    """The arguments of the transformers ``generate`` call that called us (its
    frame's locals: the nearest such frame up the stack), or nothing when none
    did."""
    for _ in range(_CALLER_DEPTH):
        if frame is None:
            break
        if (
            frame.f_code.co_name == "generate"
            and frame.f_globals.get("__name__") == "transformers.generation.utils"
        ):
            return dict(frame.f_locals)
        frame = frame.f_back
    return {}


def _refuse(argument: str, why: str) -> InputError:
    return InputError(
        f"custom_generate=speculative does not support {argument}: {why}", argument=argument
    )


def _check_generation_config(config: Any) -> None:
    for name, (off, why) in _OFF.items():
        value = getattr(config, name, off)
        if value is not None and value != off:
            raise _refuse(name, f"got {name}={value!r}: {why}")


def _check_processors(
    logits_processor: Any, stopping_criteria: Any, config: Any, eos: list[int], caller: dict
) -> None:
    """Refuses every processor and stopping criterion the loop would not apply as
    ``generate`` built it: those passed to ``generate`` (they replace the ones
    built from the config), those of other kinds, and warpers or criteria whose
    values are not the config's (the loop reads the config)."""
    for name in ("logits_processor", "stopping_criteria"):
        if caller.get(name):
            raise _refuse(name, "a list of your own; the loop applies the config's alone")
    for processor in logits_processor or ():
        name = type(processor).__name__
        if name not in _HONOURED_PROCESSORS:
            argument = _ARGUMENT_OF.get(name, "logits_processor")
            raise _refuse(argument, f"it adds a {name}, which the exact loop cannot apply")
        value = _WARPER_VALUE.get(name)
        if (
            value is not None and getattr(processor, value, None) != getattr(config, value)
        ) or getattr(processor, "min_tokens_to_keep", 1) != 1:
            raise _refuse("logits_processor", f"a {name} other than the config's")
    for criterion in stopping_criteria or ():
        name = type(criterion).__name__
        if name == "MaxLengthCriteria":
            if getattr(criterion, "max_length", None) != config.max_length:
                raise _refuse("stopping_criteria", "a max length other than the config's")
        elif name == "EosTokenCriteria":
            ids = getattr(criterion, "eos_token_id", None)
            if sorted(_token_ids(ids)) != sorted(eos):
                raise _refuse("stopping_criteria", "end-of-sequence tokens other than the config's")
        else:
            argument = _ARGUMENT_OF.get(name, "stopping_criteria")
            raise _refuse(argument, f"it adds a {name}; rows stop at max_new_tokens or EOS only")


def _check_model_kwargs(model_kwargs: dict[str, Any]) -> Any:
    """The attention mask, after refusing what the loop cannot honour."""
    for name, value in model_kwargs.items():
        if name in _IGNORED_MODEL_KWARGS or name == "attention_mask":
            continue
        if name in _CACHE_KWARGS:
            length = getattr(value, "get_seq_length", None)
            if value is None or (callable(length) and int(length()) == 0):
                continue  # the empty cache generate made for the call: ignored
            raise _refuse(name, "a filled cache; the loop keeps its own sessions")
        raise _refuse(name, "the loop feeds token ids to a decoder-only model")
    return model_kwargs.get("attention_mask")


def _prompts(input_ids: Any, attention_mask: Any) -> list[list[int]]:
    """Each row's tokens, without its left padding."""
    ids = input_ids.detach().cpu().numpy()
    if ids.ndim != 2:
        raise InputError(
            f"input_ids must be [batch, length], got {tuple(ids.shape)}", argument="input_ids"
        )
    if attention_mask is None:
        return [row.tolist() for row in ids]
    mask = attention_mask.detach().cpu().numpy()
    if mask.shape != ids.shape:
        raise InputError(
            f"attention_mask is {tuple(mask.shape)} for input_ids {tuple(ids.shape)}",
            argument="attention_mask",
        )
    prompts = []
    for b, (row, kept) in enumerate(zip(ids, mask != 0, strict=True)):
        count = int(kept.sum())
        if count == 0 or not kept[len(row) - count :].all():
            raise InputError(
                f"attention_mask row {b} is not left padding (zeros, then ones, at least one): "
                "decoder-only generation needs tokenizer.padding_side = 'left'",
                argument="attention_mask",
                row=b,
            )
        prompts.append(row[len(row) - count :].tolist())
    return prompts


def _token_ids(value: Any) -> list[int]:
    """An int, a list of ints or a tensor of them, as a list (``None``: empty)."""
    if value is None:
        return []
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, int):
        return [value]
    return [int(v) for v in value]


#: transformers' default ``num_assistant_tokens``.
_DEFAULT_ASSISTANT_TOKENS = 20


def _assistant_setting(
    name: str, default: Any, config: Any, assistant_model: Any, caller: dict[str, Any]
) -> Any:
    """A draft model's setting: the value given to ``generate`` (as an argument,
    or a config value other than transformers' default), else the assistant's own
    generation config's (which transformers' assisted generation reads), else
    transformers' default."""
    given = (caller.get("kwargs") or {}).get(name)
    if given is None and getattr(config, name, default) != default:
        given = getattr(config, name)
    if given is not None:
        return given
    own = getattr(getattr(assistant_model, "generation_config", None), name, None)
    return own if own is not None else default


def _drafts_per_step(config: Any, assistant_model: Any, caller: dict[str, Any]) -> int:
    """``k`` for a draft model: ``num_assistant_tokens`` (transformers' default 20)."""
    return int(
        _assistant_setting(
            "num_assistant_tokens", _DEFAULT_ASSISTANT_TOKENS, config, assistant_model, caller
        )
    )


#: transformers' schedules of ``num_assistant_tokens`` (``num_assistant_tokens_schedule``).
_SCHEDULES = ("constant", "heuristic", "heuristic_transient")


def _schedule(
    k: int,
    chosen: Any,
    config: Any,
    assistant_model: Any,
    caller: dict[str, Any],
    model: Any,
    drafter: Any,
) -> Any:
    """The loop's ``k`` for a draft model: ``chosen`` (speculative's own ``k``:
    ``"auto"`` is the :class:`~specaccept.AdaptiveK` kept for ``model`` and
    ``drafter`` with ``max_k = k``, ``_loop.auto_schedule``), else
    transformers' ``num_assistant_tokens_schedule``: ``"constant"`` is ``k``,
    ``"heuristic"`` and ``"heuristic_transient"`` a :class:`~specaccept.HeuristicK`
    starting at ``k`` (docs/spec.md section 12.8)."""
    if chosen is not None:
        if isinstance(chosen, str) and chosen == "auto":
            return auto_schedule(model, drafter, max_k=k)
        return chosen
    if assistant_model is None:
        return k
    name = _assistant_setting(
        "num_assistant_tokens_schedule", "constant", config, assistant_model, caller
    )
    if name not in _SCHEDULES:
        raise InputError(
            f"num_assistant_tokens_schedule must be one of {_SCHEDULES}, got {name!r}",
            argument="num_assistant_tokens_schedule",
        )
    return k if name == "constant" else HeuristicK(start=k)


def _pad_needed() -> InputError:
    return InputError(
        "pad_token_id is needed: rows ended at different lengths (set pad_token_id, "
        "e.g. to the tokenizer's)",
        argument="pad_token_id",
    )


class _Stream:
    """``streamer=`` driven from the loop's ``on_tokens``: at batch 1 each step's
    new tokens as one ``[1, n]`` tensor (as transformers' assisted generation
    puts them); at batch > 1 the output's columns, one ``[B]`` tensor each, as
    soon as every row has its token in it (a row that ended gives the padding
    token), as transformers' sampling loop puts them."""

    def __init__(self, streamer: Any, batch: int, pad: int | None, torch: Any):
        self.streamer, self.batch, self.pad, self.torch = streamer, batch, pad, torch
        self.tokens: list[list[int]] = [[] for _ in range(batch)]
        self.finished = [False] * batch
        self.sent = 0

    def __call__(self, request: int, tokens: list[int], finished: bool) -> None:
        if self.batch == 1:
            if tokens:
                self.streamer.put(self.torch.tensor([tokens], dtype=self.torch.long))
            return
        self.tokens[request] += tokens
        self.finished[request] = self.finished[request] or finished
        while True:
            rows = [row[self.sent] if self.sent < len(row) else None for row in self.tokens]
            waiting = any(
                t is None and not done for t, done in zip(rows, self.finished, strict=True)
            )
            if waiting or all(token is None for token in rows):
                return
            if self.pad is None and None in rows:
                raise _pad_needed()
            values = [self.pad if token is None else token for token in rows]
            self.streamer.put(self.torch.tensor(values, dtype=self.torch.long))
            self.sent += 1


def speculative(
    model: Any,
    input_ids: Any,
    logits_processor: Any = None,
    stopping_criteria: Any = None,
    generation_config: Any = None,
    synced_gpus: bool = False,
    streamer: Any = None,
    *,
    method: str = "token",
    seed: int | None = None,
    record: Any = None,
    k: Any = None,
    **model_kwargs: Any,
) -> Any:
    """Batched, exact speculative decoding as Hugging Face ``generate``'s
    ``custom_generate``.

    ``model.generate(**tokenizer(prompts, padding=True, return_tensors="pt"),
    custom_generate=speculative, assistant_model=draft, num_assistant_tokens=4,
    max_new_tokens=64)``: every row of a left-padded batch gets exactly the
    target's greedy decoding (``do_sample=False``) or a sample of the target's
    distribution after ``temperature``, ``top_k``, ``top_p`` and ``min_p``
    (``do_sample=True``), as :func:`specaccept.generate` does.

    Arguments read from ``generate``: ``assistant_model`` (a draft model with the
    target's vocabulary; ``num_assistant_tokens`` drafts per step, scheduled by
    ``num_assistant_tokens_schedule``: ``"constant"``, or ``"heuristic"`` as
    :class:`~specaccept.HeuristicK`),
    or ``prompt_lookup_num_tokens`` (n-gram lookup with
    ``max_matching_ngram_size``), or ``assistant_early_exit`` (the target's
    first layers); ``do_sample``, ``temperature``, ``top_k``, ``top_p``,
    ``min_p`` (in transformers' order, min-p last; its defaults: ``top_k=50``
    when sampling); ``max_new_tokens``
    (or ``max_length``; a run past the model's context is refused);
    ``eos_token_id`` (an int or a list), ``pad_token_id``; ``streamer``;
    ``return_dict_in_generate``. Random draws come from a generator seeded from
    torch's (``torch.manual_seed`` makes a run repeatable). Anything else
    ``generate`` would honour (beam search, penalties, ``output_scores``, your
    own logits processors, ...) is refused with an error naming it.

    Extra arguments (pass them to ``generate``): ``k`` (``"auto"``: an
    :class:`~specaccept.AdaptiveK` whose ``max_k`` is the drafter's count, or a
    schedule: each step's drafts chosen per request, docs/spec.md section 13),
    ``method`` (``"token"`` or ``"block"``), ``seed`` (per-request counter-based randomness: a request's
    text does not depend on the batch), ``record`` (a path: the verified steps
    for ``python -m specaccept compare --from``).

    Returns
    -------
    torch.LongTensor or GenerateDecoderOnlyOutput
        ``[B, prompt + new]``: the input ids, then each row's new tokens, rows
        that ended early (EOS) padded with ``pad_token_id``; with
        ``return_dict_in_generate``, a ``GenerateDecoderOnlyOutput`` with
        ``sequences`` alone.

    Raises
    ------
    ValueError
        An argument it cannot honour (an :class:`~specaccept.InputError` naming
        it), a transformers version older than 4.56, right padding.
    """
    import torch

    chosen = k  # speculative's own k (the drafter's count is read below)
    caller = _caller_arguments(sys._getframe(1))
    _check_version()
    if streamer is None:
        streamer = caller.get("streamer")
    assistant_model = caller.get("assistant_model")
    from transformers import GenerationConfig

    if not isinstance(generation_config, GenerationConfig):
        raise TypeError(
            "generation_config must be a transformers GenerationConfig, got "
            f"{type(generation_config).__name__} (speculative is called by "
            "model.generate(custom_generate=speculative))"
        )
    for name, tensor in (
        ("input_ids", input_ids),
        ("attention_mask", model_kwargs.get("attention_mask")),
    ):
        if tensor is not None and not (
            isinstance(tensor, torch.Tensor)
            and not tensor.is_floating_point()
            and not tensor.is_complex()
        ):
            raise TypeError(f"{name} must be an integer torch tensor, got {type(tensor).__name__}")
    config = generation_config
    if getattr(getattr(model, "config", None), "is_encoder_decoder", False):
        raise _refuse("model", "encoder-decoder models (the loop drives decoder-only models)")
    if synced_gpus or caller.get("synced_gpus"):
        raise _refuse("synced_gpus", "one process runs the loop")
    _check_generation_config(config)
    eos = _token_ids(getattr(config, "_eos_token_tensor", None)) or _token_ids(config.eos_token_id)
    _check_processors(logits_processor, stopping_criteria, config, eos, caller)
    attention_mask = _check_model_kwargs(model_kwargs)
    prompts = _prompts(input_ids, attention_mask)

    from .hf import HFModel

    target = HFModel(model)
    lookup = config.prompt_lookup_num_tokens
    early_exit: Any = getattr(config, "assistant_early_exit", None)
    given = [
        name
        for name, value in (
            ("assistant_model", assistant_model),
            ("prompt_lookup_num_tokens", lookup),
            ("assistant_early_exit", early_exit),
        )
        if value is not None
    ]
    if len(given) != 1:
        raise InputError(
            "custom_generate=speculative needs one drafter: assistant_model=, "
            f"prompt_lookup_num_tokens= or assistant_early_exit=; got "
            f"{', '.join(given) if given else 'none'}",
            argument="assistant_model",
        )
    draft: Any
    if lookup is not None:
        draft = PromptLookup(max_ngram=config.max_matching_ngram_size or 2)
        k = lookup
    else:
        if assistant_model is not None:
            draft = HFModel(assistant_model)
            if draft.vocab_size != target.vocab_size:
                raise InputError(
                    f"assistant_model has a vocabulary of {draft.vocab_size} tokens, the model "
                    f"{target.vocab_size}: the verifier needs one vocabulary (transformers' "
                    "universal assisted decoding is not supported)",
                    argument="assistant_model",
                )
        else:
            draft = target.early_exit(early_exit)
        # Early exit drafts with the model itself: its own config, as transformers'.
        k = _drafts_per_step(config, model if assistant_model is None else assistant_model, caller)
    schedule = _schedule(
        int(k),
        chosen,
        config,
        None if lookup is not None else (model if assistant_model is None else assistant_model),
        caller,
        model,
        drafter_key(draft) if early_exit is None else ("early exit", early_exit),
    )

    batch, width = int(input_ids.shape[0]), int(input_ids.shape[1])
    max_new_tokens = max(int(config.max_length) - width, 0)
    context = context_of(target, draft)
    longest = max(len(p) for p in prompts)
    if context is not None and longest + max_new_tokens > context:
        raise InputError(
            f"max_new_tokens = {max_new_tokens} after a prompt of {longest} tokens passes the "
            f"models' context of {context} (their position limit or sliding window), "
            "where the loop ends a row and transformers would go on",
            argument="max_new_tokens",
        )
    if seed is not None and (config.num_return_sequences or 1) > 1:
        raise InputError(
            "seed with num_return_sequences > 1: a request's randomness is its seed and its "
            "prompt, so its copies would be identical",
            argument="seed",
        )
    pads = _token_ids(getattr(config, "_pad_token_tensor", None)) or _token_ids(config.pad_token_id)
    pad = pads[0] if pads else None
    sample = bool(config.do_sample)
    rng = None
    if sample and seed is None:
        rng = np.random.default_rng(int(torch.randint(0, 2**62, (1,)).item()))
    stream = None if streamer is None else _Stream(streamer, batch, pad, torch)
    options = Options.check(
        k=schedule,
        max_new_tokens=max_new_tokens,
        eos_token_id=eos,
        greedy=not sample,
        temperature=1.0 if config.temperature is None else float(config.temperature),
        top_k=int(config.top_k or 0),
        top_p=1.0 if config.top_p is None else float(config.top_p),
        # transformers' order: MinPLogitsWarper after TopKLogitsWarper and TopPLogitsWarper.
        min_p=0.0 if config.min_p is None else float(config.min_p),
        min_p_last=True,
        method=method,
        rng=rng,
        seed=seed,
        record=record,
        on_tokens=stream,
    )
    result = run(target, draft, prompts, options)
    if streamer is not None:
        streamer.end()

    emitted = max((len(t) for t in result.tokens), default=0)
    if pad is None and any(len(t) < emitted for t in result.tokens):
        raise _pad_needed()
    new = torch.full((batch, emitted), 0 if pad is None else pad, dtype=torch.long)
    for b, tokens in enumerate(result.tokens):
        if tokens:
            new[b, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
    sequences = torch.cat([input_ids, new.to(input_ids.device)], dim=1)
    if not config.return_dict_in_generate:
        return sequences
    from transformers.generation.utils import GenerateDecoderOnlyOutput

    output: Any = GenerateDecoderOnlyOutput
    return output(sequences=sequences)
