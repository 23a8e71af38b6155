"""``acceptance_rate``: ``sum(min(p, q))`` per row, equal to the reference to the bit,
threaded, and the probability that a drafted token is accepted."""

from __future__ import annotations

import numpy as np
import pytest
import specaccept
from conftest import FLOAT_DTYPES, random_rows, strided_layout
from scipy import stats
from specaccept import reference


@pytest.mark.parametrize("seed", range(40))
def test_matches_the_reference_bit_for_bit(seed):
    rng = np.random.default_rng(seed)
    shape = tuple(int(n) for n in rng.integers(1, 4, size=rng.integers(0, 3)))
    vocab = int(rng.choice([1, 7, 255, 256, 257, 700]))
    p = random_rows(rng, (*shape, vocab), FLOAT_DTYPES[rng.integers(3)])
    q = random_rows(rng, (*shape, vocab), FLOAT_DTYPES[rng.integers(3)])
    if seed % 3 == 0:
        q = p.astype(q.dtype)  # equal rows: rate 1 up to rounding
    layout = ("c", "fortran", "step", "reversed")[seed % 4]
    p, q = strided_layout(rng, p, layout), strided_layout(rng, q, "c")
    ours, theirs = specaccept.acceptance_rate(p, q), reference.acceptance_rate(p, q)
    assert np.shape(ours) == shape
    np.testing.assert_array_equal(ours, theirs)


def test_known_values():
    p = np.array([[0.6, 0.4, 0.0], [1.0, 0.0, 0.0], [0.25, 0.25, 0.5]])
    q = np.array([[0.8, 0.1, 0.1], [0.0, 0.5, 0.5], [0.25, 0.25, 0.5]])
    np.testing.assert_allclose(specaccept.acceptance_rate(p, q), [0.7, 0.0, 1.0], rtol=1e-15)
    assert isinstance(specaccept.acceptance_rate(p[0], q[0]), np.floating), "one row: a scalar"


def test_threads_give_the_same_bits():
    rng = np.random.default_rng(1)
    p = random_rows(rng, (64, 9000), np.float32)
    q = random_rows(rng, (64, 9000), np.float16)
    before = specaccept.get_num_threads()
    try:
        results = []
        for n in (1, 2, 4):
            specaccept.set_num_threads(n)
            results.append(specaccept.acceptance_rate(p, q))
    finally:
        specaccept.set_num_threads(before)
    for r in results[1:]:
        np.testing.assert_array_equal(r, results[0])


@pytest.mark.parametrize("impl", [specaccept, reference], ids=["native", "reference"])
def test_errors_name_the_argument_and_index(impl):
    p = np.full((2, 3, 4), 0.25)
    q = p.copy()
    q[1, 2, 1] = -0.5
    with pytest.raises(ValueError, match=r"draft_probs\[1, 2, 1\] = -0\.5"):
        impl.acceptance_rate(p, q)
    with pytest.raises(ValueError, match="draft_probs"):
        impl.acceptance_rate(p, q[:, :2])
    with pytest.raises(ValueError, match="target_probs"):
        impl.acceptance_rate(np.float64(0.5), np.float64(0.5))
    with pytest.raises(TypeError, match="target_probs"):
        impl.acceptance_rate(p.astype(int), q)


def test_it_is_the_probability_that_a_draft_is_accepted():
    # One drafted token per row, drawn from q: the share accepted by verify is alpha.
    rng = np.random.default_rng(7)
    vocab, rows = 50, 40_000
    p = random_rows(rng, (1, 2, vocab), np.float64)
    q = random_rows(rng, (1, 1, vocab), np.float64)
    alpha = float(specaccept.acceptance_rate(p[0, 0], q[0, 0]))
    drafts = rng.choice(vocab, p=q[0, 0], size=(rows, 1))
    result = specaccept.verify(
        drafts,
        np.broadcast_to(p, (rows, 2, vocab)),
        np.broadcast_to(q, (rows, 1, vocab)),
        rng=rng,
    )
    accepted = int(result.num_accepted.sum())
    # Two-sided binomial test; a correct implementation fails with probability 1e-6.
    assert stats.binomtest(accepted, rows, alpha).pvalue > 1e-6, (accepted / rows, alpha)
