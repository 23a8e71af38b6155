"""``model.generate(custom_generate=speculative)``: specaccept's loop inside
Hugging Face's ``generate`` (docs/spec.md section 12.8).

Greedy rows must equal ``model.generate(do_sample=False)`` on the same padded
batch, token for token and padding for padding (float64 tiny Llamas: a row's
logits in a batch equal its logits alone to about 1e-15); the law of sampled
tokens must be the target's, by the exact enumeration of test_generation_law
run through the entry point; every argument it cannot honour is refused with
an error naming it; a streamer receives exactly the returned tokens.
"""

from __future__ import annotations

import importlib.metadata
import inspect

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import specaccept  # noqa: E402
from enumeration import (  # noqa: E402
    BLOCK,
    HALVES,
    chain_coordinates,
    scripted_rows,
    weighted_law,
)
from specaccept.generation import _custom_generate  # noqa: E402
from specaccept.generation.hf import TRANSFORMERS_VERSIONS, speculative  # noqa: E402
from test_generation_law import target_law  # noqa: E402
from tiny_llama import halves, llama  # noqa: E402

PAD = 63  # a token of the vocabulary: padding with 0 would show
EOS = 36  # a token some rows of TARGET's greedy text emit, others not (checked below)
PROMPTS = [
    [5, 6],
    [1, 2, 3, 4, 1, 2],
    [9],
    [3, 3, 3, 3],
    [7, 8, 9, 10, 11, 12, 13],
    [2, 4],
    [60, 61, 62],
    [17, 18, 17, 18, 17],
]


@pytest.fixture(scope="module")
def models():
    return llama(0, eos=EOS), llama(1, layers=1)


def left_padded(prompts: list[list[int]], pad: int = PAD) -> dict[str, torch.Tensor]:
    """A batch as a tokenizer pads it for generation (``padding_side="left"``)."""
    width = max(len(p) for p in prompts)
    ids = [[pad] * (width - len(p)) + p for p in prompts]
    mask = [[0] * (width - len(p)) + [1] * len(p) for p in prompts]
    return {"input_ids": torch.tensor(ids), "attention_mask": torch.tensor(mask)}


class Recording:
    """A streamer (``put``/``end``) that keeps what it is given."""

    def __init__(self):
        self.values: list[torch.Tensor] = []
        self.ended = 0

    def put(self, value: torch.Tensor) -> None:
        self.values.append(value.clone())

    def end(self) -> None:
        self.ended += 1


DRAFTERS = {
    "assistant_model": lambda draft: dict(assistant_model=draft, num_assistant_tokens=3),
    "prompt lookup": lambda draft: dict(prompt_lookup_num_tokens=3),
    "early exit": lambda draft: dict(assistant_early_exit=1, num_assistant_tokens=2),
}


def greedy_both_ways(models, batch, drafter, **extra):
    """The first ``batch`` prompts, left-padded, and transformers' greedy output for
    them, without and with ``custom_generate=speculative`` (the drafter's arguments
    and ``extra`` passed to ``generate``)."""
    target, draft = models
    inputs = left_padded(PROMPTS[:batch])
    options = dict(do_sample=False, max_new_tokens=14, pad_token_id=PAD)
    expected = target.generate(**inputs, **options)
    got = target.generate(
        **inputs, **options, custom_generate=speculative, **drafter(draft), **extra
    )
    return inputs, expected, got


@pytest.mark.parametrize("batch", [1, 4, 8])
@pytest.mark.parametrize("drafter", DRAFTERS)
def test_greedy_rows_equal_transformers_greedy_generate(models, batch, drafter):
    inputs, expected, got = greedy_both_ways(models, batch, DRAFTERS[drafter])
    assert got.dtype == torch.long
    assert got.tolist() == expected.tolist()
    if batch == 8:
        # The batch exercises rows that end early on EOS (padded after it) and rows
        # that do not.
        new = expected[:, inputs["input_ids"].shape[1] :]
        ended = [EOS in row for row in new.tolist()]
        assert any(ended) and not all(ended)
        assert any(row[-1] == PAD for row in new.tolist())


@pytest.mark.parametrize(
    "given, own, k",
    [(None, 2, 2), (3, 2, 3), (None, None, 20)],
    ids=["the assistant's config", "generate's argument", "transformers' default"],
)
def test_drafts_per_step_are_num_assistant_tokens(given, own, k):
    """k is num_assistant_tokens given to generate, else the assistant's own
    generation config's (which transformers' assisted generation reads), else 20;
    seen in the target's forward calls with an assistant that is a copy of it
    (every draft accepted: k + 1 tokens a step)."""
    extra = {} if given is None else {"num_assistant_tokens": given}
    assert forwards_with_a_copy({"num_assistant_tokens": own}, **extra) == -(
        -12 // (min(k, 11) + 1)
    )


def forwards_with_a_copy(assistant_config, **extra):
    """The target's forward calls for 12 greedy tokens with an assistant that is a
    copy of it (every draft accepted), its generation config set as given."""
    import copy

    target = llama(3)
    assistant = copy.deepcopy(target)
    for name, value in assistant_config.items():
        setattr(assistant.generation_config, name, value)
    calls = []
    target.register_forward_pre_hook(lambda module, args: calls.append(1))
    out = target.generate(
        torch.tensor([[1, 2, 3]]),
        do_sample=False,
        max_new_tokens=12,
        custom_generate=speculative,
        assistant_model=assistant,
        **extra,
    )
    assert out.shape == (1, 15)
    return len(calls)


@pytest.mark.parametrize(
    "extra", [dict(num_assistant_tokens_schedule="heuristic"), dict(k="auto")], ids=str
)
@pytest.mark.parametrize("drafter", DRAFTERS)
def test_scheduled_drafts_keep_transformers_greedy_output(models, drafter, extra):
    """transformers' heuristic schedule, and specaccept's own (k="auto"), change how
    many tokens are drafted, never the greedy output."""
    _, expected, got = greedy_both_ways(models, 4, DRAFTERS[drafter], **extra)
    assert got.tolist() == expected.tolist()


@pytest.mark.parametrize("schedule, forwards", [("constant", 4), ("heuristic", 3)])
def test_num_assistant_tokens_schedule_is_honoured(schedule, forwards):
    """An assistant that is a copy of the target accepts every draft: the constant
    schedule drafts 2 a step (3 tokens a call: 4 calls for 12 tokens), the
    heuristic one 2, then 4, then what is left (3 + 5 + 4: 3 calls)."""
    config = {"num_assistant_tokens_schedule": schedule}
    assert forwards_with_a_copy(config, num_assistant_tokens=2) == forwards


def test_an_unknown_schedule_or_k_is_refused(models):
    import copy

    target, draft = models
    assistant = copy.deepcopy(draft)
    assistant.generation_config.num_assistant_tokens_schedule = "fastest"
    with pytest.raises(specaccept.InputError) as raised:
        target.generate(
            torch.tensor([[1, 2, 3]]),
            max_new_tokens=4,
            custom_generate=speculative,
            assistant_model=assistant,
        )
    assert raised.value.argument == "num_assistant_tokens_schedule"
    with pytest.raises(specaccept.InputError) as raised:
        target.generate(
            torch.tensor([[1, 2, 3]]),
            max_new_tokens=4,
            custom_generate=speculative,
            prompt_lookup_num_tokens=2,
            k="fast",
        )
    assert raised.value.argument == "k"


def test_return_dict_in_generate_gives_transformers_output(models):
    target, draft = models
    inputs = left_padded(PROMPTS[:4])
    expected = target.generate(**inputs, do_sample=False, max_new_tokens=6, pad_token_id=PAD)
    out = target.generate(
        **inputs,
        do_sample=False,
        max_new_tokens=6,
        pad_token_id=PAD,
        custom_generate=speculative,
        assistant_model=draft,
        num_assistant_tokens=2,
        return_dict_in_generate=True,
    )
    assert isinstance(out, transformers.generation.utils.GenerateDecoderOnlyOutput)
    assert out.sequences.tolist() == expected.tolist()
    assert out.scores is None


def test_an_unpadded_batch_without_an_attention_mask(models):
    target, _draft = models
    ids = torch.tensor([[1, 2, 3], [4, 5, 6]])
    expected = target.generate(ids, do_sample=False, max_new_tokens=8, pad_token_id=PAD)
    got = target.generate(
        ids,
        do_sample=False,
        max_new_tokens=8,
        pad_token_id=PAD,
        custom_generate=speculative,
        prompt_lookup_num_tokens=2,
    )
    assert got.tolist() == expected.tolist()


# --------------------------------------------------------------------------
# Streaming: the streamed tokens are the returned ones
# --------------------------------------------------------------------------


@pytest.mark.parametrize("batch", [1, 8])
def test_the_streamer_receives_the_returned_tokens(models, batch):
    target, _draft = models
    inputs = left_padded(PROMPTS[1:2] if batch == 1 else PROMPTS)  # [1]: no early EOS
    streamer = Recording()
    out = target.generate(
        **inputs,
        do_sample=False,
        max_new_tokens=14,
        pad_token_id=PAD,
        custom_generate=speculative,
        assistant_model=target,  # every draft accepted: steps of several tokens
        num_assistant_tokens=3,
        streamer=streamer,
    )
    width = inputs["input_ids"].shape[1]
    # generate itself puts the prompt first; then every new token once; end once.
    assert streamer.values[0].tolist() == inputs["input_ids"].tolist()
    assert streamer.ended == 1
    new = out[:, width:]
    if batch == 1:
        # One [1, n] tensor per step, as transformers' assisted generation puts them.
        assert all(v.ndim == 2 and v.shape[0] == 1 for v in streamer.values[1:])
        streamed = torch.cat([v[0] for v in streamer.values[1:]])
        assert streamed.tolist() == new[0].tolist()
        assert len(streamer.values) - 1 < new.shape[1]  # several tokens in some step
    else:
        # One [B] column per new position, as transformers' sampling loop puts them,
        # rows that ended early padded.
        assert all(v.shape == (batch,) for v in streamer.values[1:])
        streamed = torch.stack(streamer.values[1:], dim=1)
        assert streamed.tolist() == new.tolist()
        assert any(row[-1] == PAD and EOS in row for row in new.tolist()), "a row ended early"


def test_a_text_streamer_prints_the_continuation(models, capsys):
    target, _draft = models

    class Digits:
        """A stand-in tokenizer: token ids as space-separated numbers."""

        def decode(self, ids, **kwargs):
            return "".join(f"{int(i)} " for i in ids)

    inputs = left_padded(PROMPTS[1:2])
    out = target.generate(
        **inputs,
        do_sample=False,
        max_new_tokens=10,
        custom_generate=speculative,
        prompt_lookup_num_tokens=3,
        streamer=transformers.TextStreamer(Digits(), skip_prompt=True),
    )
    printed = capsys.readouterr().out.split()
    assert printed == [str(t) for t in out[0, inputs["input_ids"].shape[1] :].tolist()]


# --------------------------------------------------------------------------
# Sampling: the law of the first tokens is the target's, exactly
# --------------------------------------------------------------------------


LAW_PROMPTS = [[1, 2, 3], [3, 0, 2, 1, 1, 0, 2]]


def enumerated_law(monkeypatch, target, draft, method, points):
    """The exact law of the first two tokens of each prompt, every combination of
    the step's uniforms one row of one left-padded ``generate`` call."""
    rows = scripted_rows(monkeypatch, LAW_PROMPTS, chain_coordinates(points))
    out = target.generate(
        **left_padded([LAW_PROMPTS[p] for p, _ in rows], pad=0),  # a vocabulary of 4
        do_sample=True,
        top_k=0,
        max_new_tokens=3,
        pad_token_id=0,
        custom_generate=speculative,
        assistant_model=draft,
        num_assistant_tokens=2,
        # An extra argument of speculative's (transformers >= 4.57 passes those on).
        **({} if method == "token" else {"method": method}),
    )
    width = max(len(p) for p in LAW_PROMPTS)
    return weighted_law(rows, out[:, width:].tolist(), len(LAW_PROMPTS), 2)


@pytest.fixture(scope="module")
def halves_models():
    return halves(10, vocab=4), halves(11, vocab=4, layers=1)


@pytest.mark.parametrize("method, points", [("token", HALVES), ("block", BLOCK)])
def test_sampled_tokens_follow_the_target_exactly(monkeypatch, halves_models, method, points):
    target, draft = halves_models
    laws = enumerated_law(monkeypatch, target, draft, method, points)
    for p, prompt in enumerate(LAW_PROMPTS):
        assert laws[p] == target_law(target, prompt, 2)


def test_a_loop_fed_the_padding_changes_the_law(monkeypatch, halves_models):
    """The enumeration tells apart a plausibly wrong entry point: one that feeds
    each row its left padding as prompt tokens."""
    target, draft = halves_models
    monkeypatch.setattr(
        _custom_generate, "_prompts", lambda ids, mask: [row.tolist() for row in ids]
    )
    laws = enumerated_law(monkeypatch, target, draft, "token", HALVES)
    assert laws[0] != target_law(target, LAW_PROMPTS[0], 2)


def test_sampling_is_repeatable_with_torch_manual_seed(models):
    target, draft = models
    inputs = left_padded(PROMPTS[:4])
    runs = []
    for seed in (5, 5, 6):
        torch.manual_seed(seed)
        runs.append(
            target.generate(
                **inputs,
                do_sample=True,
                temperature=1.5,
                top_k=0,
                max_new_tokens=12,
                pad_token_id=PAD,
                custom_generate=speculative,
                assistant_model=draft,
                num_assistant_tokens=3,
            ).tolist()
        )
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


# --------------------------------------------------------------------------
# Refusals: every argument it cannot honour, named
# --------------------------------------------------------------------------


class Shift(transformers.LogitsProcessor):
    def __call__(self, input_ids, scores):
        return scores


class Never(transformers.StoppingCriteria):
    def __call__(self, input_ids, scores, **kwargs):
        return torch.zeros(input_ids.shape[0], dtype=torch.bool)


REFUSED = {
    "num_beams": dict(num_beams=2),
    "num_beam_groups": dict(num_beams=2, num_beam_groups=2, diversity_penalty=0.5),
    "penalty_alpha": dict(penalty_alpha=0.6, top_k=4),
    "dola_layers": dict(dola_layers="low"),
    "guidance_scale (unbatched)": dict(
        guidance_scale=1.5, negative_prompt_ids=torch.tensor([[1]] * 2)
    ),
    "watermarking_config (SynthID)": dict(
        watermarking_config=transformers.SynthIDTextWatermarkingConfig(keys=[1, 2], ngram_len=2)
    ),
    "output_scores": dict(output_scores=True, return_dict_in_generate=True),
    "output_logits": dict(output_logits=True, return_dict_in_generate=True),
    "output_attentions": dict(output_attentions=True, return_dict_in_generate=True),
    "output_hidden_states": dict(output_hidden_states=True, return_dict_in_generate=True),
    "repetition_penalty": dict(repetition_penalty=1.3),
    "no_repeat_ngram_size": dict(no_repeat_ngram_size=2),
    "min_length": dict(min_length=5),
    "min_new_tokens": dict(min_new_tokens=3),
    "typical_p": dict(do_sample=True, typical_p=0.5),
    "epsilon_cutoff": dict(do_sample=True, epsilon_cutoff=0.001),
    "eta_cutoff": dict(do_sample=True, eta_cutoff=0.001),
    "bad_words_ids": dict(bad_words_ids=[[3]]),
    "sequence_bias": dict(sequence_bias={(3,): -1.0}),
    "forced_bos_token_id": dict(forced_bos_token_id=3),
    "forced_eos_token_id": dict(forced_eos_token_id=3),
    "suppress_tokens": dict(suppress_tokens=[3]),
    "begin_suppress_tokens": dict(begin_suppress_tokens=[3]),
    "guidance_scale": dict(guidance_scale=1.5),
    "exponential_decay_length_penalty": dict(exponential_decay_length_penalty=(2, 1.5)),
    "remove_invalid_values": dict(remove_invalid_values=True),
    "prefix_allowed_tokens_fn": dict(prefix_allowed_tokens_fn=lambda b, ids: [1, 2]),
    "watermarking_config": dict(
        watermarking_config=transformers.WatermarkingConfig(greenlist_ratio=0.25)
    ),
    "max_time": dict(max_time=100.0),
    "logits_processor": dict(logits_processor=transformers.LogitsProcessorList([Shift()])),
    "stopping_criteria": dict(stopping_criteria=transformers.StoppingCriteriaList([Never()])),
    # Kinds the loop applies itself, passed to generate: they replace the config's.
    "logits_processor (top-k)": dict(
        do_sample=True,
        logits_processor=transformers.LogitsProcessorList([transformers.TopKLogitsWarper(1)]),
    ),
    # Even one that carries the config's own values (the loop reads the config).
    "logits_processor (the config's temperature)": dict(
        do_sample=True,
        temperature=0.7,
        logits_processor=transformers.LogitsProcessorList(
            [transformers.TemperatureLogitsWarper(0.7)]
        ),
    ),
    "stopping_criteria (EOS)": dict(
        stopping_criteria=transformers.StoppingCriteriaList(
            [transformers.generation.stopping_criteria.EosTokenCriteria(eos_token_id=47)]
        )
    ),
    "stopping_criteria (max length)": dict(
        stopping_criteria=transformers.StoppingCriteriaList([transformers.MaxLengthCriteria(5)])
    ),
    "synced_gpus": dict(synced_gpus=True),
}


def refused(model, match: str, inputs=None, **arguments) -> None:
    """``model.generate(custom_generate=speculative)`` raises a ValueError matching
    ``match`` (prompt lookup, 4 new tokens, unless ``arguments`` say otherwise)."""
    call = dict(max_new_tokens=4, custom_generate=speculative)
    if not {"assistant_model", "prompt_lookup_num_tokens"} & arguments.keys():
        call["prompt_lookup_num_tokens"] = 2
    call.update(arguments)
    with pytest.raises(ValueError, match=match):
        model.generate(**(inputs if inputs is not None else left_padded(PROMPTS[:2])), **call)


if hasattr(transformers, "TopHLogitsWarper"):  # top_h: transformers 5.x
    REFUSED["top_h"] = dict(do_sample=True, top_h=0.5)


@pytest.mark.parametrize("argument", REFUSED)
def test_an_argument_it_cannot_honour_is_refused_by_name(models, argument):
    name = argument.split(" ")[0]
    refused(models[0], rf"does not support .*\b{name}\b", pad_token_id=PAD, **REFUSED[argument])


def test_min_p_is_honoured_in_transformers_order(models, monkeypatch):
    """min_p reaches the loop as transformers applies it (after top-k and top-p);
    with it the sampled text is the loop's with the same options (generate's own
    law with min-p is tested in tests/test_min_p.py)."""
    target, _draft = models
    seen = []
    run = _custom_generate.run

    def spy(target, draft, prompts, options):
        seen.append(options)
        return run(target, draft, prompts, options)

    monkeypatch.setattr(_custom_generate, "run", spy)
    out = target.generate(
        **left_padded(PROMPTS),
        do_sample=True,
        top_p=0.9,
        min_p=0.2,
        max_new_tokens=6,
        pad_token_id=PAD,
        custom_generate=speculative,
        prompt_lookup_num_tokens=3,
    )
    (options,) = seen
    assert (options.min_p, options.min_p_last, options.top_p) == (0.2, True, 0.9)
    assert out.shape[0] == len(PROMPTS)


def test_right_padding_is_refused(models):
    inputs = dict(
        input_ids=torch.tensor([[1, 2, 3], [4, 5, PAD]]),
        attention_mask=torch.tensor([[1, 1, 1], [1, 1, 0]]),
    )
    refused(models[0], "attention_mask row 1 is not left padding", inputs, pad_token_id=PAD)


def test_exactly_one_drafter_is_needed(models):
    target, draft = models
    refused(
        target, "needs one drafter: .* got none", pad_token_id=PAD, prompt_lookup_num_tokens=None
    )
    refused(
        target,
        "needs one drafter: .* got assistant_model, prompt_lookup_num_tokens",
        pad_token_id=PAD,
        assistant_model=draft,
        prompt_lookup_num_tokens=2,
    )


def test_an_assistant_with_another_vocabulary_is_refused(models):
    refused(
        models[0],
        "assistant_model has a vocabulary of 32 tokens",
        left_padded(PROMPTS[:1]),
        assistant_model=llama(2, layers=1, vocab=32),
        tokenizer=object(),
        assistant_tokenizer=object(),
    )


def test_inputs_embeds_are_refused(models):
    target, _ = models
    embeds = target.get_input_embeddings()(torch.tensor([[1, 2, 3]]))
    refused(target, "inputs_embeds", dict(inputs_embeds=embeds))


def test_a_filled_cache_is_refused(models):
    target, _ = models
    cache = transformers.DynamicCache()
    # transformers 5.25 names it cache, earlier versions past_key_values.
    name = "cache" if "cache" in inspect.signature(target.forward).parameters else "past_key_values"
    target(input_ids=torch.tensor([[1, 2]]), use_cache=True, **{name: cache})
    refused(target, "a filled cache", {"input_ids": torch.tensor([[1, 2, 3]]), name: cache})


def test_an_encoder_decoder_model_is_refused():
    config = transformers.T5Config(
        vocab_size=32, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_heads=2
    )
    model = transformers.T5ForConditionalGeneration(config).eval()
    refused(model, "encoder-decoder", dict(input_ids=torch.tensor([[1, 2, 3]])))


def test_a_run_past_the_model_s_context_is_refused():
    """The loop ends a row at the models' context (a position limit of 12 here, or a
    sliding window), where transformers would go on: refused before any call."""
    refused(
        llama(0, positions=12),
        "max_new_tokens = 8 after a prompt of 6 tokens passes",
        max_new_tokens=8,
        pad_token_id=PAD,
    )


def test_a_wrapped_speculative_still_reads_generate_s_arguments(models):
    """assistant_model and streamer are read from the calling generate's frame, also
    through a wrapper (transformers >= 4.57 does not hand them on)."""
    target, draft = models
    inputs = left_padded(PROMPTS[:4])
    expected = target.generate(**inputs, do_sample=False, max_new_tokens=8, pad_token_id=PAD)
    streamer = Recording()
    got = target.generate(
        **inputs,
        do_sample=False,
        max_new_tokens=8,
        pad_token_id=PAD,
        custom_generate=lambda *args, **kwargs: speculative(*args, **kwargs),
        assistant_model=draft,
        num_assistant_tokens=2,
        streamer=streamer,
    )
    assert got.tolist() == expected.tolist()
    assert streamer.ended == 1 and len(streamer.values) > 1


def test_seed_with_copies_of_a_request_is_refused(models):
    config = transformers.GenerationConfig(
        do_sample=True, num_return_sequences=2, prompt_lookup_num_tokens=2, max_length=6
    )
    with pytest.raises(ValueError, match="seed with num_return_sequences > 1"):
        speculative(models[0], torch.tensor([[1, 2], [1, 2]]), generation_config=config, seed=3)


@pytest.mark.parametrize(
    "call",
    [
        lambda m: speculative(m, torch.tensor([[1, 2]])),
        lambda m: speculative(m, [[1, 2]], generation_config=transformers.GenerationConfig()),
        lambda m: speculative(
            m, torch.tensor([[1.0, 2.0]]), generation_config=transformers.GenerationConfig()
        ),
        lambda m: speculative(
            m,
            torch.tensor([[1, 2]]),
            generation_config=transformers.GenerationConfig(),
            attention_mask=[[1, 1]],
        ),
        lambda m: speculative(
            "model",
            torch.tensor([[1, 2]]),
            generation_config=transformers.GenerationConfig(prompt_lookup_num_tokens=2),
        ),
    ],
    ids=["no config", "ids a list", "ids float", "mask a list", "model a str"],
)
def test_called_directly_with_wrong_types_it_raises_type_error(models, call):
    with pytest.raises(TypeError):
        call(models[0])


@pytest.mark.parametrize("version, outcome", [("4.55.4", "error"), ("99.0.0", "warning")])
def test_the_transformers_version_is_checked_at_call_time(models, monkeypatch, version, outcome):
    target, _ = models
    real = importlib.metadata.version
    monkeypatch.setattr(
        importlib.metadata,
        "version",
        lambda name: version if name == "transformers" else real(name),
    )
    call = dict(
        input_ids=torch.tensor([[1, 2, 3]]),
        max_new_tokens=2,
        custom_generate=speculative,
        prompt_lookup_num_tokens=2,
    )
    if outcome == "error":
        with pytest.raises(ValueError, match=r"needs transformers >= 4\.56\.0"):
            target.generate(**call)
    else:
        with pytest.warns(UserWarning, match=f"tested with transformers .* found {version}"):
            target.generate(**call)


def test_the_installed_transformers_is_in_the_tested_range():
    def parts(text):
        return tuple(int(x) for x in text.split(".")[:3])

    installed = parts(importlib.metadata.version("transformers"))
    assert parts(TRANSFORMERS_VERSIONS[0]) <= installed <= parts(TRANSFORMERS_VERSIONS[1])
