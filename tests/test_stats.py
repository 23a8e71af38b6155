"""AcceptanceStats against counts by hand, and against the closed forms on simulated runs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import specaccept
from conftest import random_rows
from scipy import stats as scipy_stats
from specaccept import AcceptanceStats, Verification


def result(accepted: list[int], num_draft: int) -> Verification:
    """A Verification with the given accepted counts (tokens are irrelevant to the stats)."""
    batch = len(accepted)
    ids = np.full((batch, num_draft + 1), -1, dtype=np.int64)
    for b, n in enumerate(accepted):
        ids[b, : n + 1] = 7
    n = np.array(accepted, dtype=np.int64)
    return Verification(ids, n, n + 1)


def test_counts_by_hand():
    s = AcceptanceStats()
    # Step 1: K = 3, rows accept 3, 0, 1 of 3, 3, 2 drafts.
    s.update(result([3, 0, 1], 3), num_draft_tokens=np.array([3, 3, 2]))
    # Step 2: K = 2, two rows accept 2 and 1 of 2 drafts.
    s.update(result([2, 1], 2))
    assert s.num_steps == 5
    assert s.total_draft_tokens == 3 + 3 + 2 + 2 + 2
    assert s.num_accepted_tokens == 3 + 0 + 1 + 2 + 1
    assert s.num_emitted_tokens == 7 + 5
    # Tried: accepted ones, plus the rejected position of rows with n < k (rows 2, 3, 5).
    assert s.num_tried_tokens == 7 + 3
    assert s.drafted_per_position == [5, 5, 2]
    assert s.accepted_per_position == [4, 2, 1]  # rows with n > 0: 4; n > 1: 2; n > 2: 1
    assert s.accepted_length_histogram == [1, 2, 1, 1]
    assert s.acceptance_rate == 7 / 12
    assert s.alpha == 7 / 10
    assert s.position_acceptance_rate == [4 / 5, 2 / 5, 1 / 2]
    assert s.mean_accepted_length == 7 / 5
    assert s.mean_emitted_tokens == 12 / 5


def test_merge_equals_one_accumulator_and_json_round_trips():
    rng = np.random.default_rng(0)
    steps = [(result(rng.integers(0, k + 1, size=4).tolist(), k), None) for k in (1, 4, 2, 4, 3)]
    whole, left, right = AcceptanceStats(), AcceptanceStats(), AcceptanceStats()
    for i, (r, counts) in enumerate(steps):
        whole.update(r, counts)
        (left if i % 2 else right).update(r, counts)
    assert left + right == whole
    assert right.merge(left) == whole
    assert AcceptanceStats.from_json(whole.to_json()) == whole
    assert AcceptanceStats.from_dict(whole.to_dict()) == whole
    assert math.isnan(AcceptanceStats().alpha) and math.isnan(AcceptanceStats().acceptance_rate)


@pytest.mark.parametrize(
    ("accepted", "counts", "num_draft"),
    [([2], [1], 2), ([-1], None, 2), ([1], [3], 2)],
    ids=["accepted above k_b", "negative", "k_b above K"],
)
def test_impossible_results_are_refused(accepted, counts, num_draft):
    n = np.array(accepted)
    impossible = Verification(np.zeros((1, num_draft + 1), dtype=np.int64), n, n + 1)
    with pytest.raises(ValueError, match="0 <= n_b <= k_b <= K"):
        AcceptanceStats().update(impossible, None if counts is None else np.array(counts))


def test_closed_forms_at_known_points():
    assert specaccept.expected_tokens_per_step(0.0, 5) == 1.0
    assert specaccept.expected_tokens_per_step(1.0, 5) == 6.0
    assert specaccept.expected_tokens_per_step(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)
    # The sum formula: 1 + a + ... + a^k.
    for a in (0.1, 0.6, 0.95):
        assert specaccept.expected_tokens_per_step(a, 7) == pytest.approx(
            sum(a**i for i in range(8))
        )
    assert specaccept.expected_speedup(0.6, 3, 0.0) == pytest.approx(1 + 0.6 + 0.36 + 0.216)
    assert specaccept.expected_speedup(0.0, 3, 0.1) == pytest.approx(1 / 1.3)
    # Best k by brute force over the same formula.
    for a, c in ((0.8, 0.05), (0.6, 0.2), (0.95, 0.01), (0.2, 0.5)):
        best = specaccept.best_num_draft_tokens(a, c, max_k=40)
        values = [specaccept.expected_speedup(a, k, c) for k in range(41)]
        assert values[best] == max(values) and best == values.index(max(values))
    assert specaccept.best_num_draft_tokens(0.1, 0.5) == 0, "speculation does not pay"
    for bad, error in ((1.5, ValueError), (-0.1, ValueError), ("0.5", TypeError)):
        with pytest.raises(error, match="a must"):
            specaccept.expected_tokens_per_step(bad, 3)
    with pytest.raises(ValueError, match="k must"):
        specaccept.expected_tokens_per_step(0.5, -1)


def test_a_simulated_run_follows_the_closed_forms():
    # Every position has the same p and q, so acceptance is Bernoulli(alpha) per
    # tried position and n_b is truncated-geometric: the closed forms apply exactly.
    rng = np.random.default_rng(11)
    vocab, k, rows = 20, 4, 20_000
    p = random_rows(rng, (vocab,), np.float64)
    q = random_rows(rng, (vocab,), np.float64)
    alpha = float(specaccept.acceptance_rate(p, q))
    target = np.broadcast_to(p, (rows, k + 1, vocab))
    draft = np.broadcast_to(q, (rows, k, vocab))
    s = AcceptanceStats()
    for _ in range(2):
        drafts = rng.choice(vocab, p=q, size=(rows, k))
        s.update(specaccept.verify(drafts, target, draft, rng=rng))
    # Histogram against the truncated geometric law (chi-square, false failure 1e-6).
    law = np.array([alpha**n * (1 - alpha) for n in range(k)] + [alpha**k])
    chi2 = scipy_stats.chisquare(s.accepted_length_histogram, law * s.num_steps)
    assert chi2.pvalue > 1e-6, (s.accepted_length_histogram, law)
    # The estimates and the closed form: within 6 standard errors (false failure ~ 2e-9).
    tokens = np.arange(1, k + 2)
    sd = math.sqrt(float((law * tokens**2).sum() - (law * tokens).sum() ** 2) / s.num_steps)
    expected = specaccept.expected_tokens_per_step(alpha, k)
    assert abs(s.mean_emitted_tokens - expected) < 6 * sd
    assert abs(s.alpha - alpha) < 6 * math.sqrt(alpha * (1 - alpha) / s.num_tried_tokens)
    assert s.position_acceptance_rate == pytest.approx(
        [alpha ** (t + 1) for t in range(k)], abs=0.02
    )
