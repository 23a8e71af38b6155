"""Min-p in the sampling transform (docs/spec.md section 8.2): by hand, the law of
the emitted token by exact enumeration in both orders, parity with the reference
(chains, trees, vLLM's layout), ``generate``'s law, and its errors. Losslessness with
min-p is in tests/test_logits.py (test_lossless_and_masked_tokens_never_emitted)."""

from __future__ import annotations

import numpy as np
import pytest
import specaccept
import test_logits
import test_tree_logits
from scipy import stats
from specaccept import reference
from specaccept.compat import vllm

#: Probabilities where min-p and top-p filter differently in the two orders:
#: min-p 0.3 drops 0.1 (below 0.3 * 0.4); top-p 0.75 then keeps two of the three
#: left (4/9 + 3/9 >= 0.75) before min-p, three (0.4 + 0.3 < 0.75) after it.
P = np.array([0.4, 0.3, 0.2, 0.1])
LOGITS = np.log(P)
FIRST = np.array([4, 3, 0, 0]) / 7  # vLLM's order: min-p, then top-p
LAST = np.array([4, 3, 2, 0]) / 9  # transformers' order: top-p, then min-p


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        (dict(min_p=0.3), [4 / 9, 3 / 9, 2 / 9, 0]),
        (dict(min_p=0.3, top_p=0.75), FIRST),
        (dict(min_p=0.3, top_p=0.75, min_p_last=True), LAST),
        (dict(min_p=0.6, top_k=3, min_p_last=True), [4 / 7, 3 / 7, 0, 0]),
        (dict(min_p=1.0), [1, 0, 0, 0]),
        (dict(min_p=0.0, top_p=0.75), [4 / 9, 3 / 9, 2 / 9, 0]),
    ],
)
def test_the_reference_transform_by_hand(kwargs, expected):
    top_k, top_p = kwargs.pop("top_k", 0), kwargs.pop("top_p", 1.0)
    got = reference.transform_logits(LOGITS, 1.0, top_k, top_p, **kwargs)
    np.testing.assert_allclose(got, expected, atol=1e-12)


def test_min_p_is_relative_to_the_tempered_largest_probability():
    # At temperature 2 the probabilities are sqrt(P) normalised: 0.1's token has
    # sqrt(0.1 / 0.4) = 0.5 of the largest, so min-p 0.5 keeps it, 0.51 does not.
    kept = reference.transform_logits(LOGITS, 2.0, 0, 1.0, min_p=0.5)
    assert all(p > 0 for p in kept)
    assert reference.transform_logits(LOGITS, 2.0, 0, 1.0, min_p=0.51)[3] == 0


def bonus_law(min_p_last: bool, dtype, **filters) -> np.ndarray:
    """The law of the token ``verify_logits`` emits with no drafts, by exact
    enumeration: the recovery uniform at the midpoints of 4000 equal cells."""
    grid = (np.arange(4000) + 0.5) / 4000
    rows = np.broadcast_to(LOGITS.astype(dtype), (grid.size, 1, 4))
    out = specaccept.verify_logits(
        np.zeros((grid.size, 0), dtype=np.int64),
        rows,
        min_p_last=min_p_last,
        recovery_uniforms=grid,
        uniforms=np.zeros((grid.size, 0)),
        **filters,
    )
    return np.bincount(out.output_token_ids[:, 0], minlength=4) / grid.size


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16])
def test_the_emitted_law_in_each_order_by_enumeration(dtype):
    """Each order's law to the grid's resolution; the two differ, so a transform
    that ignored ``min_p_last`` (or min-p) fails one of them."""
    for last, expected in ((False, FIRST), (True, LAST)):
        law = bonus_law(last, dtype, min_p=0.3, top_p=0.75)
        want = reference.transform_logits(
            LOGITS.astype(dtype), 1.0, 0, 0.75, min_p=0.3, min_p_last=last
        )
        np.testing.assert_allclose(want, expected, atol=2e-3)  # float16 rounds the logits
        np.testing.assert_allclose(law, want, atol=1 / 4000)
    # Min-p alone, unfiltered rows (the screens' path) and with top-k (the sparse path).
    np.testing.assert_allclose(
        bonus_law(False, dtype, min_p=0.3), [4 / 9, 3 / 9, 2 / 9, 0], atol=2e-3
    )
    np.testing.assert_allclose(
        bonus_law(False, dtype, min_p=0.6, top_k=3), [4 / 7, 3 / 7, 0, 0], atol=2e-3
    )


def with_min_p(case: dict, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    batch = len(case["temperature"])
    case["min_p"] = rng.choice([0.0, 0.02, 0.2, 0.7, 1.0], size=batch)
    case["min_p_last"] = bool(seed % 2)
    return case


@pytest.mark.parametrize("block", range(3))
def test_chains_match_the_reference(block):
    for seed in range(block * 100, (block + 1) * 100):
        case = with_min_p(test_logits.logits_case(seed), seed)
        got = test_logits.outcome(specaccept.verify_logits, **case)
        assert got == test_logits.outcome(reference.verify_logits, **case), f"seed {seed}"


@pytest.mark.parametrize("method", ["token", "traversal"])
def test_trees_match_the_reference(method):
    for seed in range(120):
        case = with_min_p(test_tree_logits.logits_case(seed), seed)
        case["method"] = method
        got = test_tree_logits.outcome(specaccept.verify_tree_logits, **case)
        assert got == test_tree_logits.outcome(reference.verify_tree_logits, **case), seed


@pytest.mark.parametrize("seed", range(10))
def test_vllm_s_layout_applies_min_p_first(seed):
    """compat.vllm.verify_logits on the flat rows equals verify_logits with
    min_p_last=False on the same rows padded, with the same uniforms."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, 4, size=3)
    width, vocab = int(counts.max()), 30
    logits = rng.normal(size=(int(counts.sum()) + 3, vocab)) * 2
    ids = rng.integers(0, vocab, size=int(counts.sum()))
    uniforms, recovery = rng.random(int(counts.sum())), rng.random(3)
    min_p = rng.choice([0.0, 0.05, 0.3], size=3)
    padded = np.zeros((3, width + 1, vocab))
    padded_ids = np.zeros((3, width), dtype=np.int64)
    padded_u = np.zeros((3, width))
    row = slot = 0
    for b, k in enumerate(counts):
        padded[b, : k + 1] = logits[row : row + k + 1]
        padded_ids[b, :k] = ids[slot : slot + k]
        padded_u[b, :k] = uniforms[slot : slot + k]
        row, slot = row + k + 1, slot + k
    common = dict(temperature=0.9, top_k=8, top_p=0.8, min_p=min_p, recovery_uniforms=recovery)
    flat = vllm.verify_logits(ids, counts, logits, uniforms=uniforms, **common)
    want = specaccept.verify_logits(
        padded_ids, padded, num_draft_tokens=counts, uniforms=padded_u, **common
    )
    np.testing.assert_array_equal(flat.output_token_ids[:, : width + 1], want.output_token_ids)


@pytest.mark.parametrize(
    "min_p, error, fragment",
    [
        (-0.1, ValueError, "min_p[0] = -0.1: min_p must lie in [0, 1]"),
        (1.5, ValueError, "min_p must lie in [0, 1]"),
        (float("nan"), ValueError, "min_p must lie in [0, 1]"),
        (np.array([0.1, 0.2, 0.3]), ValueError, "min_p"),
        ("0.1", TypeError, "min_p"),
    ],
)
def test_bad_min_p_is_named(min_p, error, fragment):
    ids, logits = np.zeros((2, 1), dtype=np.int64), np.zeros((2, 2, 3))
    for verify in (specaccept.verify_logits, reference.verify_logits):
        with pytest.raises(error) as raised:
            verify(ids, logits, min_p=min_p, rng=0)
        assert fragment in str(raised.value)
        if error is ValueError:
            assert raised.value.argument == "min_p"


def test_min_p_last_must_be_a_bool():
    ids, logits = np.zeros((1, 1), dtype=np.int64), np.zeros((1, 2, 3))
    for verify in (specaccept.verify_logits, reference.verify_logits):
        with pytest.raises(TypeError, match="min_p_last must be True or False"):
            verify(ids, logits, min_p=0.1, min_p_last=1, rng=0)


def test_a_row_with_a_bad_min_p_is_isolated():
    ids, logits = np.zeros((2, 1), dtype=np.int64), np.zeros((2, 2, 3))
    r = specaccept.verify_logits(ids, logits, min_p=np.array([0.1, 2.0]), errors="isolate", rng=0)
    assert list(r.errors) == [1] and r.errors[1].argument == "min_p"
    assert r.num_emitted[0] >= 1


# --------------------------------------------------------------------------
# generate: the law of sampled continuations with min-p
# --------------------------------------------------------------------------


def continuation_law(target, prompt, length, vocab, **filters) -> np.ndarray:
    """The target's exact law of ``length`` tokens after ``prompt``, each step's
    row transformed by the reference (temperature 0.9, top-p 0.8, ``filters``)."""
    law = np.zeros(vocab**length)
    for code in range(vocab**length):
        tokens = [(code // vocab**i) % vocab for i in reversed(range(length))]
        seq, prob = list(prompt), 1.0
        for t in tokens:
            with np.errstate(divide="ignore"):
                logits = np.log(target.distribution(seq))
            prob *= reference.transform_logits(logits, 0.9, 0, 0.8, **filters)[t]
            seq.append(t)
        law[code] = prob
    return law


@pytest.mark.parametrize("min_p_last", [False, True])
@pytest.mark.parametrize("shape", [dict(k=2), dict(k=2, method="block"), dict(tree=[2, 1])])
def test_generate_samples_the_min_p_law(min_p_last, shape):
    """3-token continuations against the exact law of each order (chi-square,
    false-failure rate 1e-6); the two orders' laws differ here, so a loop that
    ignored ``min_p_last`` fails one of them."""
    from test_generate import Markov

    vocab, rows, length, prompt = 5, 10_000, 3, [1, 2]
    target, draft = Markov(vocab, 3, seed=5), Markov(vocab, 2, seed=6, concentration=2.0)
    filters = dict(min_p=0.3, min_p_last=min_p_last)
    out = specaccept.generate(
        target,
        draft,
        [prompt] * rows,
        max_new_tokens=length,
        rng=7,
        temperature=0.9,
        top_p=0.8,
        **filters,
        **shape,
    )
    law = continuation_law(target, prompt, length, vocab, **filters)
    other = continuation_law(target, prompt, length, vocab, min_p=0.3, min_p_last=not min_p_last)
    assert np.abs(law - other).sum() > 0.05  # the orders are told apart
    observed = np.bincount(
        np.array(out.tokens) @ (vocab ** np.arange(length)[::-1]), minlength=law.size
    )
    assert observed[law == 0].sum() == 0
    kept = law > 0
    assert stats.chisquare(observed[kept], law[kept] * rows).pvalue > 1e-6


def test_generate_checks_min_p():
    from specaccept.ngram import builtin_models

    target, draft, vocab = builtin_models()
    prompt = [vocab.encode("Anne Elliot was")]
    with pytest.raises(ValueError, match="min_p must lie in"):
        specaccept.generate(target, draft, prompt, min_p=1.5)
    with pytest.raises(TypeError, match="min_p_last"):
        specaccept.generate(target, draft, prompt, min_p=0.1, min_p_last="yes")
    # Greedy rows: min-p keeps the argmax, the text is plain greedy's.
    greedy = specaccept.generate(target, draft, prompt, greedy=True, max_new_tokens=12)
    assert (
        specaccept.generate(target, draft, prompt, greedy=True, min_p=0.9, max_new_tokens=12).tokens
        == greedy.tokens
    )
