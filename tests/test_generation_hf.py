"""Batched, KV-cached speculative generation over Hugging Face models (issue 25).

Small random float64 Llamas: every row's output must be the target's own greedy
decoding of that row alone (``model.generate``, batch 1), whatever the other
rows accept; sessions must score exactly what an uncached forward call scores;
the cache must be used; bad models and bad prompts end only their request with
``errors="isolate"``.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import specaccept  # noqa: E402
from specaccept.generation.hf import HFModel  # noqa: E402
from tiny_llama import full_logits, hf_greedy, llama  # noqa: E402

VOCAB = 64


@pytest.fixture(scope="module")
def models():
    return llama(0, layers=2, vocab=VOCAB, eos=7), llama(1, layers=1, vocab=VOCAB)


def ragged_prompts(batch: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    lengths = [1, 9, 3, 17, 5, 2, 12, 7, 4, 30][:batch]
    prompts = [rng.integers(8, VOCAB, n).tolist() for n in lengths]
    # A prompt that repeats itself, so that prompt lookup finds matches.
    prompts[-1] = (prompts[-1] * 3)[: max(len(prompts[-1]), 6)]
    return prompts


# --------------------------------------------------------------------------
# Sessions: exactly the scores of an uncached forward call
# --------------------------------------------------------------------------


def test_session_scores_chains_trees_rollbacks_and_selections_exactly(models):
    target, _ = models
    session = HFModel(target).session([[10, 11, 12], [], [13] * 300, [14, 15]])
    sequences = [[10, 11, 12], [], [13] * 300, [14, 15]]
    rng = np.random.default_rng(3)
    worst, compacted = 0.0, False
    for step in range(40):
        rows = session.num_rows
        if step % 4 == 3:
            # A tree below the committed end: [a, b under a, c under a, d under c].
            tokens = [rng.integers(0, VOCAB, 4).tolist() for _ in range(rows)]
            parents = [[-1, 0, 0, 2]] * rows
            scores = session.extend(tokens, parents)
            paths = [[0], [0, 1], [0, 2, 3], [0, 2]][:rows]
            paths += [[0]] * (rows - len(paths))
            for b in range(rows):
                for i, path in enumerate(([0], [0, 1], [0, 2], [0, 2, 3])):
                    expected = full_logits(target, sequences[b] + [tokens[b][j] for j in path])
                    worst = max(worst, np.abs(scores[b, i] - expected[-1]).max())
            session.commit(paths)
            for b in range(rows):
                sequences[b] += [tokens[b][j] for j in paths[b]]
        else:
            # Ragged chains (a row may add nothing), then a random prefix of each kept.
            tokens = [rng.integers(0, VOCAB, rng.integers(0, 5)).tolist() for _ in range(rows)]
            if not any(tokens):
                tokens[0] = [5]
            scores = session.extend(tokens)
            for b in range(rows):
                if tokens[b]:
                    expected = full_logits(target, sequences[b] + tokens[b])[-len(tokens[b]) :]
                    worst = max(worst, np.abs(scores[b, : len(tokens[b])] - expected).max())
            lengths = [
                len(s) + int(rng.integers(0, len(t) + 1))
                for s, t in zip(sequences, tokens, strict=True)
            ]
            session.rollback(lengths)
            for b in range(rows):
                sequences[b] += tokens[b][: lengths[b] - len(sequences[b])]
        assert session.lengths == [len(s) for s in sequences]
        compacted |= session.columns < max(len(s) for s in sequences) + 20
        if step == 20:
            session.select([3, 0, 0, 2])  # reordered, with a row twice
            sequences = [sequences[3], sequences[0], list(sequences[0]), sequences[2]]
    assert worst < 1e-12
    assert compacted, "holes were compacted away at least once"


def test_a_forward_call_that_fails_leaves_the_session_as_it_was(models):
    target, _ = models
    model = HFModel(target)
    session = model.session([[1, 2, 3], [4, 5]])
    calls = {"n": 0}

    def fail_in_layer_one(module, args):
        calls["n"] += 1
        raise RuntimeError("layer one failed")

    handle = target.model.layers[1].register_forward_pre_hook(fail_in_layer_one)
    try:
        with pytest.raises(RuntimeError, match="layer one failed"):
            session.extend([[6, 7], [8]])
    finally:
        handle.remove()
    assert calls["n"] == 1 and session.lengths == [3, 2]
    scores = session.extend([[6, 7], [8]])
    np.testing.assert_allclose(scores[0, :2], full_logits(target, [1, 2, 3, 6, 7])[-2:], atol=1e-12)
    np.testing.assert_allclose(scores[1, :1], full_logits(target, [4, 5, 8])[-1:], atol=1e-12)


def test_a_long_prompt_failing_in_its_last_chunk_leaves_the_session_as_it_was(models):
    target, _ = models
    session = HFModel(target).session([[1, 2], [3]])
    calls = {"n": 0}

    def fail_on_the_second_call(module, args):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("second call")

    long = [int(t) for t in np.random.default_rng(0).integers(0, VOCAB, 400)]
    handle = target.register_forward_pre_hook(fail_on_the_second_call)
    try:
        with pytest.raises(RuntimeError, match="second call"):
            session.extend([long, [4]], scored=[1, 1])  # a chunk of 256, then the rest
    finally:
        handle.remove()
    assert session.lengths == [2, 1] and session.columns == 2
    scores = session.extend([long, [4]], scored=[1, 1])
    np.testing.assert_allclose(scores[0, 0], full_logits(target, [1, 2, *long])[-1], atol=1e-12)
    np.testing.assert_allclose(scores[1, 0], full_logits(target, [3, 4])[-1], atol=1e-12)


@pytest.mark.parametrize(
    ("call", "argument", "fragment"),
    [
        (lambda s: s.extend([[64], []]), "tokens", r"tokens\[0\]\[0\] = 64 is outside"),
        (lambda s: s.extend([[1], [-1]]), "tokens", "outside"),
        (lambda s: s.extend([[1]]), "tokens", "has 1 rows, the session 2"),
        (lambda s: s.extend([[1, 2], []], [[-1, 1], []]), "parents", r"parents\[0\]\[1\] = 1"),
        (lambda s: s.extend([[1], []], [[0], []]), "parents", "earlier provisional"),
        (lambda s: s.extend([[1], []], [[-1, -1], []]), "parents", "2 entries for 1 tokens"),
        (lambda s: s.extend([[1] * 600, []]), "tokens", "past the model's context of 512"),
        (lambda s: s.commit([[1], []]), "keep", r"keep\[0\]\[0\] = 1"),
        (lambda s: s.rollback([0, 2]), "lengths", "between its committed 3"),
        (lambda s: s.select([2]), "rows", "not a row of the session"),
    ],
)
def test_session_arguments_are_checked_by_name(models, call, argument, fragment):
    target, _ = models
    session = HFModel(target).session([[1, 2, 3], [4, 5]])
    with pytest.raises(specaccept.InputError, match=fragment) as error:
        call(session)
    assert error.value.argument == argument
    assert session.lengths == [3, 2]


def test_what_is_not_a_causal_lm_or_a_tokenizer_is_refused(models):
    target, _ = models
    with pytest.raises(TypeError, match="causal LM with an output head"):
        HFModel(target.model)  # the base model: hidden states, no logits
    with pytest.raises(TypeError, match="tokenizer must be None or have encode and decode"):
        HFModel(target, tokenizer=3)


@pytest.mark.parametrize("bad", [[["a"]], [[1.5], []], 5, [None, []]])
def test_session_token_types_are_checked(models, bad):
    target, _ = models
    with pytest.raises(TypeError, match="tokens"):
        HFModel(target).session([[1], [2]]).extend(bad)


# --------------------------------------------------------------------------
# Greedy: every row equals the target's own greedy decoding of it alone
# --------------------------------------------------------------------------

DRAFTERS = {
    "draft model": lambda t, d: dict(draft=HFModel(d), k=4),
    "draft model, k = 1": lambda t, d: dict(draft=HFModel(d), k=1),
    "prompt lookup": lambda t, d: dict(draft=specaccept.PromptLookup(), k=4),
    "the target itself": lambda t, d: dict(draft=HFModel(t), k=3),
    "block": lambda t, d: dict(draft=HFModel(d), k=3, method="block"),
    "tree [3, 2, 1]": lambda t, d: dict(draft=HFModel(d), tree=[3, 2, 1]),
    "tree [2, 2], traversal": lambda t, d: dict(draft=HFModel(d), tree=[2, 2], method="traversal"),
    "stateless draft": lambda t, d: dict(draft=Stateless(HFModel(d)), k=2),
}


class Stateless:
    """A LanguageModel only (no sessions): every call recomputes whole sequences."""

    def __init__(self, model: HFModel):
        self.model, self.vocab_size = model, model.vocab_size

    def next_token_probs(self, sequences, num_positions):
        return self.model.next_token_probs(sequences, num_positions)


@pytest.mark.parametrize("drafter", DRAFTERS)
@pytest.mark.parametrize("batch", [1, 4, 8])
def test_greedy_rows_equal_the_target_decoding_each_alone(models, drafter, batch):
    target, draft = models
    prompts = ragged_prompts(batch, seed=batch)
    expected = [hf_greedy(target, p, 24) for p in prompts]
    out = specaccept.generate(
        HFModel(target),
        prompts=prompts,
        max_new_tokens=24,
        greedy=True,
        eos_token_id=7,
        **DRAFTERS[drafter](target, draft),
    )
    assert out.tokens == expected
    assert all(r in ("eos", "max_new_tokens") for r in out.stop_reasons)


def test_greedy_with_sampling_rows_mixed_in_keeps_the_greedy_rows_exact(models):
    target, draft = models
    prompts = ragged_prompts(6, seed=2)
    temperature = [0.0, 1.0, 0.0, 0.7, 0.0, 1.3]
    out = specaccept.generate(
        HFModel(target), HFModel(draft), prompts, k=3, max_new_tokens=16,
        temperature=temperature, top_k=[0, 5, 0, 0, 0, 3], top_p=[1.0, 0.9, 1.0, 0.8, 1.0, 1.0],
        eos_token_id=7, rng=0,
    )  # fmt: skip
    for b in (0, 2, 4):
        assert out.tokens[b] == hf_greedy(target, prompts[b], 16)


# --------------------------------------------------------------------------
# The cache is used
# --------------------------------------------------------------------------


def test_the_target_processes_new_tokens_times_k_plus_one_positions_not_length_squared(models):
    target, draft = models
    positions = []
    handle = target.register_forward_pre_hook(
        lambda module, args, kwargs: positions.append(kwargs["input_ids"].numel()),
        with_kwargs=True,
    )
    prompts, k, new = [[9] * 40, [10, 11, 12] * 10], 3, 60
    try:
        out = specaccept.generate(
            HFModel(target), HFModel(draft), prompts, k=k, max_new_tokens=new, rng=0
        )
    finally:
        handle.remove()
    prompt_positions = 2 * max(len(p) for p in prompts)
    assert out.num_tokens == 2 * new
    # Each step feeds every row its pending token and k drafts: (k + 1) per row.
    assert sum(positions) - prompt_positions <= out.target_calls * (k + 1)
    assert out.target_calls <= 2 * new
    # Without a cache, every call would process whole sequences: far more.
    stateless = sum(len(p) + new for p in prompts) * out.target_forwards / 2
    assert sum(positions) < stateless / 3


# --------------------------------------------------------------------------
# Randomness: a seeded request does not depend on the batch (float64)
# --------------------------------------------------------------------------


@pytest.mark.parametrize("options", [dict(k=3), dict(tree=[2, 2]), dict(k=2, method="block")])
def test_a_seeded_request_gets_the_same_tokens_alone_and_in_a_batch(models, options):
    target, draft = models
    prompts = ragged_prompts(5, seed=9)
    kwargs = dict(max_new_tokens=14, seed=123, temperature=0.9, top_k=20, **options)
    batch = specaccept.generate(HFModel(target), HFModel(draft), prompts, **kwargs)
    for b in (0, 3, 4):
        alone = specaccept.generate(HFModel(target), HFModel(draft), [prompts[b]], **kwargs)
        assert alone.tokens[0] == batch.tokens[b]


# --------------------------------------------------------------------------
# Hostile models and prompts
# --------------------------------------------------------------------------

POISON = 13


MARK = [20, 21, 22, POISON]


class Poisoned(transformers.LlamaForCausalLM):
    """A Llama that misbehaves on the rows whose input in this call holds the tokens
    MARK in a row (a prompt ending with them: fed at the first step; drafts never
    spell them)."""

    mode = "nan"

    def forward(self, input_ids=None, **kwargs):
        output = super().forward(input_ids=input_ids, **kwargs)
        windows = input_ids.unfold(1, len(MARK), 1) if input_ids.shape[1] >= len(MARK) else None
        hit = (
            torch.zeros(input_ids.shape[0], dtype=torch.bool)
            if windows is None
            else (windows == torch.tensor(MARK)).all(dim=2).any(dim=1)
        )
        if hit.any():
            if self.mode == "raise":
                raise RuntimeError("poisoned row")
            if self.mode == "nan":
                output.logits[hit] = torch.nan
            if self.mode == "shape":
                output.logits = output.logits[..., :-1]
        return output


def poisoned(mode: str) -> Poisoned:
    base = llama(0, layers=2, vocab=VOCAB, eos=7)
    model = Poisoned(base.config).to(torch.float64).eval()
    model.load_state_dict(base.state_dict())
    model.mode = mode
    return model


@pytest.mark.parametrize("shape", [dict(k=3), dict(tree=[2, 2])])
@pytest.mark.parametrize("bad", ["target", "draft"])
@pytest.mark.parametrize("mode", ["nan", "raise"])
def test_a_bad_request_ends_alone_with_isolate(models, mode, bad, shape):
    target, draft = models
    clean = ragged_prompts(4, seed=5)
    prompts = [*clean[:2], MARK, *clean[2:]]  # fed at the first step
    models_used = {"target": HFModel(target), "draft": HFModel(draft)}
    models_used[bad] = HFModel(poisoned(mode))
    run = dict(prompts=prompts, max_new_tokens=12, greedy=True, eos_token_id=7, **shape)
    out = specaccept.generate(**models_used, errors="isolate", **run)
    assert set(out.errors) == {2} and out.stop_reasons[2] == "error"
    assert out.tokens[2] == []
    for b, prompt in enumerate(prompts):
        if b != 2:
            assert out.tokens[b] == hf_greedy(target, prompt, 12)
    with pytest.raises(ValueError if mode == "nan" else RuntimeError):
        specaccept.generate(**models_used, **run)


def test_a_model_with_logits_of_the_wrong_shape_is_named(models):
    _, draft = models
    with pytest.raises(
        specaccept.InputError, match=r"target\.session\.extend returned shape"
    ) as error:
        specaccept.generate(
            HFModel(poisoned("shape")), HFModel(draft), [MARK], k=2, max_new_tokens=4
        )
    assert error.value.argument == "target"


def test_empty_and_too_long_prompts_end_alone_with_isolate(models):
    target, draft = models
    long = [9] * 600  # the context is 512
    prompts = [[1, 2, 3], [], long, [4, 5]]
    out = specaccept.generate(
        HFModel(target), HFModel(draft), prompts, k=2, max_new_tokens=6, greedy=True,
        errors="isolate",
    )  # fmt: skip
    assert set(out.errors) == {1, 2}
    assert out.errors[1].argument == "prompts" and "is empty" in str(out.errors[1])
    assert "more than the models' context of 512" in str(out.errors[2])
    assert out.tokens[0] == hf_greedy(target, [1, 2, 3], 6)[:6]
    for bad in ([[1], []], [[1], long]):
        with pytest.raises(specaccept.InputError, match="prompts"):
            specaccept.generate(HFModel(target), HFModel(draft), bad, max_new_tokens=2)


def test_a_row_stops_at_the_models_context(models):
    target, draft = models
    prompt = [9] * 505
    out = specaccept.generate(
        HFModel(target), HFModel(draft), [prompt, [1, 2]], k=4, max_new_tokens=20, greedy=True
    )
    assert len(prompt) + len(out.tokens[0]) == 512 and out.stop_reasons[0] == "context"
    assert out.tokens[0] == hf_greedy(target, prompt, 7)
    assert len(out.tokens[1]) == 20


# --------------------------------------------------------------------------
# Recording: the verified steps, for the laboratory
# --------------------------------------------------------------------------


def test_recorded_steps_load_in_the_laboratory(models, tmp_path):
    from specaccept.lab import load_steps

    target, draft = models
    path = tmp_path / "steps.npz"
    # Equal prompts reach max_new_tokens together: their last step drafts nothing.
    prompts = [*ragged_prompts(3, seed=1), *[[20, 21, 22]] * 200]
    out = specaccept.generate(
        HFModel(target), HFModel(draft), prompts, k=3, max_new_tokens=10, rng=0,
        temperature=0.8, record=path,
    )  # fmt: skip
    ids, p, q, counts = load_steps(str(path))
    assert q is not None, "a step without drafts does not drop the draft rows"
    assert ids.shape[0] == out.stats.num_steps and ids.shape[1] == 3
    assert p.shape == (ids.shape[0], 4, VOCAB) and q.shape == (ids.shape[0], 3, VOCAB)
    assert (counts == 0).any() and (counts == 3).any()
    for s in range(ids.shape[0]):
        k = counts[s]
        np.testing.assert_allclose(p[s, : k + 1].sum(-1), 1.0, rtol=1e-5)
        assert (q[s, np.arange(k), ids[s, :k]] > 0).all(), "each draft has mass in its row"
    # The recorded rows are the ones verified: the run's accepted drafts agree with
    # their exact expectation within 5 standard errors (fails by chance with p < 1e-6).
    expected = specaccept.lab.expected_num_accepted(ids, p, q, num_draft_tokens=counts)
    second = np.zeros_like(expected)
    for s in range(ids.shape[0]):
        survive, moments = 1.0, 0.0
        for t in range(counts[s]):
            x = ids[s, t]
            survive *= min(1.0, p[s, t, x] / q[s, t, x])
            moments += (2 * t + 1) * survive  # E[n^2] = sum_j (2j + 1) P(n > j)
        second[s] = moments
    variance = float((second - expected**2).sum())
    gap = out.stats.num_accepted_tokens - expected.sum()
    assert abs(gap) < 5 * np.sqrt(variance)
    comparison = specaccept.lab.compare_methods(ids, p, q, num_draft_tokens=counts, samples=4)
    assert comparison["token"].mean_accepted > 0
