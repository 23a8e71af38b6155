"""The native code agrees with specaccept.reference token for token.

Each seed builds a random valid batch (see ``conftest.random_case``: B in 0..9,
K in 0..8, V in 1..300, f16/f32/f64 mixed between p and q, int32/int64 ids,
ragged rows, mixed greedy rows, draft_probs=None, boundary uniforms, p == q,
p == 0, q == 0, one-hot rows, zero tails, non-contiguous layouts).
"""

from __future__ import annotations

import numpy as np
import pytest
import specaccept
from conftest import random_case
from specaccept import reference

NUM_PARITY_CASES = 1500


def outcome(fn, **kwargs):
    """The result of ``fn``, or the type and message of what it raised."""
    try:
        r = fn(**kwargs)
    except (TypeError, ValueError) as e:
        return (type(e), str(e))
    return (r.output_token_ids.tolist(), r.num_accepted.tolist(), r.num_emitted.tolist())


@pytest.mark.parametrize("block", range(NUM_PARITY_CASES // 100))
def test_verify_matches_reference_on_random_batches(block):
    covered = {"rejected": 0, "bonus": 0}
    for seed in range(block * 100, (block + 1) * 100):
        case = random_case(seed)
        native = outcome(specaccept.verify, **case)
        oracle = outcome(reference.verify, **case)
        assert native == oracle, f"seed {seed}"
        assert not isinstance(native[0], type), f"seed {seed} built an invalid case: {native}"
        k = case["draft_token_ids"].shape[1]
        covered["rejected"] += sum(n < k for n in native[1])
        covered["bonus"] += sum(n == k for n in native[1])
    # The block exercised both endings of a row.
    assert covered["rejected"] > 50 and covered["bonus"] > 50, covered


@pytest.mark.parametrize("seed", range(200))
def test_verify_greedy_matches_reference(seed):
    rng = np.random.default_rng(seed)
    batch, num_draft = int(rng.integers(0, 9)), int(rng.integers(0, 8))
    targets = rng.integers(0, 4, size=(batch, num_draft + 1))
    drafts = np.where(rng.random((batch, num_draft)) < 0.8, targets[:, :num_draft], 9)
    counts = rng.integers(0, num_draft + 1, size=batch) if rng.random() < 0.5 else None
    dtype = (np.int32, np.int64)[seed % 2]
    kwargs = dict(
        draft_token_ids=drafts.astype(dtype),
        target_token_ids=np.asfortranarray(targets),
        num_draft_tokens=counts,
    )
    assert outcome(specaccept.verify_greedy, **kwargs) == outcome(reference.verify_greedy, **kwargs)


@pytest.mark.parametrize("seed", range(50))
def test_primitives_match_reference(seed):
    rng = np.random.default_rng(seed)
    shape = tuple(int(n) for n in rng.integers(0, 5, size=rng.integers(0, 4)))
    dtypes = [(np.float16, np.float32, np.float64)[i] for i in rng.integers(0, 3, size=3)]
    p = rng.choice([0.0, 0.25, 0.5, 1.0, rng.random()], size=shape).astype(dtypes[0])
    q = rng.choice([0.0, 0.25, 0.5, 1.0, rng.random()], size=shape).astype(dtypes[1])
    u = rng.choice([0.0, 0.5, 0.999, rng.random()], size=shape).astype(dtypes[2])
    np.testing.assert_array_equal(
        specaccept.rejection_probability(p, q), reference.rejection_probability(p, q)
    )
    np.testing.assert_array_equal(
        specaccept.acceptance_mask(p, q, u), reference.acceptance_mask(p, q, u)
    )
    if len(shape) == 2:
        mask = reference.acceptance_mask(p, q, u)
        counts = rng.integers(0, shape[1] + 1, size=shape[0])
        for c in (None, counts):
            np.testing.assert_array_equal(
                specaccept.accepted_prefix_length(mask, c),
                reference.accepted_prefix_length(mask, c),
            )


def test_reference_mirrors_the_native_summation_order():
    assert (reference.SUM_BLOCK, reference.SUM_LANES) == (
        specaccept._native.SUM_BLOCK,
        specaccept._native.SUM_LANES,
    )


def test_parity_holds_where_summation_order_decides_the_token():
    """Rows whose cumulative sums round differently in another order.

    Weights of wildly different magnitudes make a sequential sum and the blocked,
    laned sum differ in the last bits; uniforms placed right at cumulative
    boundaries then pick the token by rounding alone. Native and reference must
    still agree, because they share one summation order.
    """
    rng = np.random.default_rng(7)
    vocab = 3 * 256 + 11
    for trial in range(40):
        row = rng.random(vocab) * 10.0 ** rng.integers(-12, 1, size=vocab)
        p = np.stack([row / row.sum()] * 2)[None]  # [1, 2, V]: K = 1, bonus row
        cdf = np.cumsum(p[0, 1])
        boundary = cdf[rng.integers(0, vocab - 1)]
        uniforms = np.array([[0.0]])  # accept the draft (q = one-hot, p(x) > 0)
        for ru in (boundary, np.nextafter(boundary, 0), np.nextafter(boundary, 1)):
            if not 0 <= ru < 1:
                continue
            kwargs = dict(
                draft_token_ids=np.array([[int(np.argmax(p[0, 0]))]]),
                target_probs=p,
                uniforms=uniforms,
                recovery_uniforms=np.array([ru]),
            )
            assert outcome(specaccept.verify, **kwargs) == outcome(reference.verify, **kwargs), (
                trial
            )
