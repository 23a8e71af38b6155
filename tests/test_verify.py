"""Exact behaviour of verify and verify_greedy on hand-written cases."""

from __future__ import annotations

import numpy as np
import pytest
import specaccept
from conftest import LAST_UNIFORM
from specaccept import Verification, reference


def one_row(p_rows, q_rows, drafts, u, ru, **kwargs) -> Verification:
    return specaccept.verify(
        np.array([drafts], dtype=np.int64).reshape(1, -1),
        np.array([p_rows], dtype=np.float64),
        None
        if q_rows is None
        else np.array([q_rows], dtype=np.float64).reshape(1, len(drafts), -1),
        uniforms=np.array([u], dtype=np.float64).reshape(1, -1),
        recovery_uniforms=np.array([ru]),
        **kwargs,
    )


# --- The seed's worked example: draft q = 0.8, target p = 0.6 for "learning". ---


def test_worked_example_rejection_probability_is_one_quarter():
    assert specaccept.rejection_probability(0.6, 0.8) == pytest.approx(0.25, abs=1e-15)
    assert specaccept.rejection_probability(0.6, 0.8) == 1 - 0.6 / 0.8


@pytest.mark.parametrize(
    ("u", "accepted"), [(0.0, True), (0.7499, True), (0.75, False), (0.9, False)]
)
def test_worked_example_accepted_iff_u_below_three_quarters(u, accepted):
    assert bool(specaccept.acceptance_mask(0.6, 0.8, u)) is accepted
    # The same decision inside verify: token 0 is "learning".
    r = one_row([[0.6, 0.4], [0.5, 0.5]], [[0.8, 0.2]], [0], [u], 0.5)
    assert r.num_accepted.tolist() == [int(accepted)]
    if not accepted:
        # The residual max(0, p - q) = [0, 0.2] puts all mass on token 1.
        assert r.tokens(0).tolist() == [1]


@pytest.mark.parametrize("u", [0.0, 0.3, 0.5, LAST_UNIFORM])
def test_q_at_most_p_accepts_for_every_uniform(u):
    p = np.array([0.2, 0.5, 0.3, 0.0])
    for q_x, p_x in [(0.5, 0.5), (0.1, 0.5), (0.0, 0.5)]:
        assert bool(specaccept.acceptance_mask(p_x, q_x, u))
    r = one_row([p, p], [[0.2, 0.4, 0.4, 0.0]], [1], [u], 0.0)
    assert r.num_accepted.tolist() == [1]


def test_p_zero_rejects_even_when_q_is_zero():
    assert not specaccept.acceptance_mask(0.0, 0.0, 0.0)
    assert specaccept.rejection_probability(0.0, 0.0) == 1.0
    r = one_row([[0.0, 1.0], [0.5, 0.5]], [[0.0, 1.0]], [0], [0.0], 0.0)
    assert r.num_accepted.tolist() == [0]
    assert r.tokens(0).tolist() == [1], "the replacement lies in the support of p"


def test_uniform_exactly_at_the_ratio_rejects():
    p, q = 0.375, 0.75  # p/q = 0.5 exactly
    assert not specaccept.acceptance_mask(p, q, 0.5)
    assert specaccept.acceptance_mask(p, q, float(np.nextafter(0.5, 0)))


def test_one_hot_target_equal_to_the_drafts_accepts_everything():
    rng = np.random.default_rng(1)
    batch, num_draft, vocab = 6, 5, 50
    drafts = rng.integers(0, vocab, size=(batch, num_draft))
    p = np.zeros((batch, num_draft + 1, vocab))
    for b in range(batch):
        for t in range(num_draft):
            p[b, t, drafts[b, t]] = 1.0
    p[:, num_draft] = rng.dirichlet(np.ones(vocab), size=batch)
    q = rng.dirichlet(np.ones(vocab), size=(batch, num_draft))
    for draft_probs in (q, None):
        r = specaccept.verify(drafts, p, draft_probs, rng=2)
        assert r.num_accepted.tolist() == [num_draft] * batch
        np.testing.assert_array_equal(r.output_token_ids[:, :num_draft], drafts)
        assert (r.output_token_ids[:, num_draft] >= 0).all()


def test_disjoint_supports_reject_at_position_zero_and_replace_inside_p():
    rng = np.random.default_rng(2)
    batch, num_draft, vocab = 200, 3, 20
    p = np.zeros((batch, num_draft + 1, vocab))
    p[:, :, :10] = rng.dirichlet(np.ones(10), size=(batch, num_draft + 1))
    q = np.zeros((batch, num_draft, vocab))
    q[:, :, 10:] = rng.dirichlet(np.ones(10), size=(batch, num_draft))
    drafts = rng.integers(10, 20, size=(batch, num_draft))
    r = specaccept.verify(drafts, p, q, rng=3)
    assert (r.num_accepted == 0).all()
    assert (r.num_emitted == 1).all()
    assert ((r.output_token_ids[:, 0] >= 0) & (r.output_token_ids[:, 0] < 10)).all()
    assert (r.output_token_ids[:, 1:] == -1).all()


def test_replacement_never_emits_the_rejected_one_hot_draft():
    # draft_probs=None: the residual is p with the draft zeroed.
    p = np.array([[[0.5, 0.5], [0.5, 0.5]]])
    for ru in (0.0, 0.49, 0.51, LAST_UNIFORM):
        r = specaccept.verify(
            np.array([[0]]), p, uniforms=np.array([[0.9]]), recovery_uniforms=np.array([ru])
        )
        assert r.to_lists() == [[1]]


def test_bonus_token_is_sampled_from_the_row_after_the_last_draft():
    # Row k_b is the bonus distribution, also in ragged batches.
    p = np.zeros((2, 4, 5))
    p[:, :, 0] = 1.0  # drafts of token 0 are accepted
    p[0, 3] = [0, 0, 0, 0, 1.0]
    p[1, 1] = [0, 0, 1.0, 0, 0]
    r = specaccept.verify(
        np.array([[0, 0, 0], [0, -1, -1]]),
        p,
        num_draft_tokens=np.array([3, 1]),
        rng=0,
    )
    assert r.to_lists() == [[0, 0, 0, 4], [0, 2]]
    assert r.num_accepted.tolist() == [3, 1]
    assert r.output_token_ids.tolist() == [[0, 0, 0, 4], [0, 2, -1, -1]]


def test_zero_drafts_emit_only_the_bonus():
    p = np.array([[[0.0, 1.0, 0.0]], [[0.0, 0.0, 1.0]]])
    r = specaccept.verify(np.zeros((2, 0), dtype=np.int64), p, rng=0)
    assert r.to_lists() == [[1], [2]]
    assert r.num_accepted.tolist() == [0, 0]
    g = specaccept.verify_greedy(np.zeros((1, 0), dtype=np.int32), np.array([[7]]))
    assert g.to_lists() == [[7]]


def test_residual_falls_back_to_p_when_it_sums_to_zero():
    # An unnormalised q that dominates p everywhere: max(0, p - q) == 0.
    p = np.array([[[0.2, 0.3], [0.5, 0.5]]])
    q = np.array([[[0.4, 0.6]]])
    r = specaccept.verify(
        np.array([[0]]), p, q, uniforms=np.array([[0.9]]), recovery_uniforms=np.array([0.5])
    )
    assert r.num_accepted.tolist() == [0]
    assert r.tokens(0).tolist() == [1], (
        "inverse CDF of p = [0.2, 0.3] at u = 0.5: cumsum 0.5 > 0.25"
    )


def test_inverse_cdf_boundaries():
    p = np.array([[[0.0, 0.25, 0.0, 0.5, 0.25]]])  # K = 0: the bonus alone
    ids = np.zeros((1, 0), dtype=np.int64)
    expected = {0.0: 1, 0.2499: 1, 0.25: 3, 0.7499: 3, 0.75: 4, LAST_UNIFORM: 4}
    for ru, token in expected.items():
        r = specaccept.verify(ids, p, recovery_uniforms=np.array([ru]), rng=0)
        assert r.tokens(0).tolist() == [token], ru


def test_rounding_falls_back_to_the_last_positive_weight():
    # Canonical sum of [1, 0, 2^-53, 2^-53] is 1 + 2^-52; u * T rounds to 1.0 and the
    # running sum never exceeds it: the last positive weight (index 3) is taken.
    tiny = 2.0**-53
    p = np.array([[[1.0, 0.0, tiny, tiny]]])
    for fn in (specaccept.verify, reference.verify):
        r = fn(np.zeros((1, 0), np.int64), p, recovery_uniforms=np.array([LAST_UNIFORM]), rng=0)
        assert r.tokens(0).tolist() == [3]


GREEDY_TABLE = [
    # drafts, argmax targets [K+1], k_b, expected tokens, expected n
    ([5, 6, 7], [5, 6, 7, 8], 3, [5, 6, 7, 8], 3),  # full match + bonus
    ([5, 6, 7], [5, 9, 7, 8], 3, [5, 9], 1),  # early mismatch: the target's token
    ([5, 6, 7], [1, 6, 7, 8], 3, [1], 0),  # mismatch at position 0
    ([5, 6, -1], [5, 6, 3, 8], 2, [5, 6, 3], 2),  # ragged: row has 2 drafts, bonus at 2
    ([-1, -1, -1], [4, 6, 7, 8], 0, [4], 0),  # zero drafts: bonus only
]


@pytest.mark.parametrize(("drafts", "targets", "k", "tokens", "n"), GREEDY_TABLE)
def test_greedy_table(drafts, targets, k, tokens, n):
    counts = np.array([k])
    r = specaccept.verify_greedy(np.array([drafts]), np.array([targets]), num_draft_tokens=counts)
    assert r.to_lists() == [tokens]
    assert r.num_accepted.tolist() == [n]
    assert r.num_emitted.tolist() == [n + 1]
    # verify(greedy=True) on one-hot target rows at those argmaxes agrees.
    vocab = 10
    p = np.full((1, 4, vocab), 0.01)
    for t, y in enumerate(targets):
        p[0, t, y] = 0.5
    g = specaccept.verify(np.array([drafts]), p, num_draft_tokens=counts, greedy=True)
    assert g.to_lists() == [tokens]


def test_greedy_takes_the_first_maximal_index():
    p = np.array([[[0.1, 0.4, 0.4, 0.1], [0.3, 0.3, 0.2, 0.2]]])
    r = specaccept.verify(np.array([[2]]), p, greedy=True)
    assert r.to_lists() == [[1]]
    r = specaccept.verify(np.array([[1]]), p, greedy=True)
    assert r.to_lists() == [[1, 0]]


def test_mixed_greedy_rows():
    p = np.array([[[0.3, 0.7], [0.9, 0.1]]] * 2)
    q = np.array([[[0.9, 0.1]]] * 2)
    # Row 0 greedy: draft 0 is not the argmax (1). Row 1 sampled: q > p, u = 0 < p/q accepts.
    r = specaccept.verify(
        np.array([[0], [0]]),
        p,
        q,
        uniforms=np.zeros((2, 1)),
        recovery_uniforms=np.zeros(2),
        greedy=np.array([True, False]),
    )
    assert r.to_lists() == [[1], [0, 0]]


def test_verification_is_a_frozen_typed_result():
    r = specaccept.verify_greedy(np.array([[1, 2]]), np.array([[1, 3, 0]]))
    assert r.output_token_ids.dtype == np.int64
    assert r.num_accepted.dtype == np.int64 and r.num_emitted.dtype == np.int64
    assert r.batch_size == 1
    with pytest.raises(AttributeError):
        r.num_accepted = np.array([5])  # type: ignore[misc]


def test_empty_batch():
    for greedy in (False, True):
        r = specaccept.verify(
            np.zeros((0, 3), np.int64),
            np.zeros((0, 4, 7)),
            np.zeros((0, 3, 7)),
            rng=1,
            greedy=greedy,
        )
        assert r.output_token_ids.shape == (0, 4) and r.num_accepted.shape == (0,)


# --- Randomness: seeds, Generators, per-row streams. ---


def batch(seed=0, batch=6, num_draft=4, vocab=30):
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.ones(vocab), size=(batch, num_draft + 1))
    q = rng.dirichlet(np.ones(vocab), size=(batch, num_draft))
    drafts = rng.integers(0, vocab, size=(batch, num_draft))
    return drafts, p, q


def test_same_seed_same_result_and_seed_equals_generator_draws():
    drafts, p, q = batch()
    a = specaccept.verify(drafts, p, q, rng=123)
    b = specaccept.verify(drafts, p, q, rng=123)
    assert a.to_lists() == b.to_lists()
    g = np.random.default_rng(123)
    explicit = specaccept.verify(
        drafts, p, q, uniforms=g.random((6, 4)), recovery_uniforms=g.random(6)
    )
    assert a.to_lists() == explicit.to_lists()
    c = specaccept.verify(drafts, p, q, rng=np.random.default_rng(123))
    assert a.to_lists() == c.to_lists()


def test_a_generator_advances_by_exactly_the_draws_used_whatever_the_dtypes():
    drafts, p, q = batch()
    expected = specaccept.verify(drafts, p, q, rng=np.random.default_rng(9))
    for ids, target in ((drafts, p), (drafts.astype(np.int16), p.astype(">f8"))):
        g = np.random.default_rng(9)
        got = specaccept.verify(ids, target, q, rng=g)
        assert got.to_lists() == expected.to_lists()
        reference_stream = np.random.default_rng(9)
        reference_stream.random(6 * 4 + 6)
        assert g.random() == reference_stream.random()


def test_different_seeds_give_different_samples():
    drafts, p, q = batch(batch=50)
    results = {
        tuple(map(tuple, specaccept.verify(drafts, p, q, rng=s).to_lists())) for s in range(5)
    }
    assert len(results) == 5


def test_a_row_with_its_own_generator_does_not_depend_on_the_batch():
    drafts, p, q = batch(batch=8)
    counts = np.array([4, 2, 0, 3, 4, 1, 4, 2])
    rows = [np.random.default_rng(1000 + b) for b in range(8)]
    full = specaccept.verify(drafts, p, q, num_draft_tokens=counts, rng=rows)
    for b in range(8):
        alone = specaccept.verify(
            drafts[b : b + 1],
            p[b : b + 1],
            q[b : b + 1],
            num_draft_tokens=counts[b : b + 1],
            rng=[np.random.default_rng(1000 + b)],
        )
        assert alone.to_lists() == [full.to_lists()[b]]
    # Row b drew g_b.random(k_b) then g_b.random(): the streams are consumed exactly so.
    for b in range(8):
        g = np.random.default_rng(1000 + b)
        g.random(counts[b])
        g.random()
        assert rows[b].random() == g.random()


def test_rng_is_not_consulted_when_uniforms_are_given():
    drafts, p, q = batch()
    g = np.random.default_rng(5)
    state = g.bit_generator.state
    specaccept.verify(
        drafts, p, q, uniforms=np.full((6, 4), 0.5), recovery_uniforms=np.full(6, 0.5), rng=g
    )
    assert g.bit_generator.state == state
