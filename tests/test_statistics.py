"""The output follows the target distribution: the point of speculative sampling.

Method. A "problem" fixes target rows ``p_0 .. p_K`` and draft rows
``q_0 .. q_{K-1}`` over V = 10 tokens, the same for every one of N = 100_000
batch rows (a context-free model pair; the arrays are broadcast views, so
nothing is copied). Drafts are sampled from ``q_t``. Among the rows that reach
position ``t`` (all earlier drafts accepted), the token emitted at ``t`` must
follow ``p_t`` -- the accepted draft or the replacement for ``t < K``, the bonus
for ``t = K``. Each position is checked with Pearson's chi-square goodness of
fit (bins with expected count < 5 pooled); with identical rows at every
position, the accepted-length histogram must follow ``alpha^i (1 - alpha)``
(``alpha^K`` for ``i = K``), ``alpha = sum(min(p, q))``.

Significance. A check fails when a p-value is below ``ALPHA = 1e-6``. This file
runs about 30 such checks on correct implementations, so for a random seed a
correct implementation fails with probability below 3e-5 (union bound); the
seeds are fixed, so the suite is deterministic. The same checks applied to two
deliberately wrong verifiers give p-values below 1e-6 by a wide margin, which
shows they have the power to catch real mistakes.
"""

from __future__ import annotations

import numpy as np
import pytest
import specaccept
from scipy import stats
from specaccept import reference

ALPHA = 1e-6
N = 100_000
V = 10


def chi_square_pvalue(tokens: np.ndarray, probs: np.ndarray) -> float:
    """Pearson goodness of fit of ``tokens`` to ``probs``; 0 if a token has p == 0."""
    probs = probs / probs.sum()
    counts = np.bincount(tokens, minlength=len(probs)).astype(float)
    expected = probs * len(tokens)
    if counts[probs == 0].any():
        return 0.0
    order = np.argsort(expected)
    small = np.cumsum(expected[order]) < 5
    pooled_counts = np.append(counts[order][~small], counts[order][small].sum())
    pooled_expected = np.append(expected[order][~small], expected[order][small].sum())
    if pooled_expected[-1] == 0:
        pooled_counts, pooled_expected = pooled_counts[:-1], pooled_expected[:-1]
    if len(pooled_counts) < 2:
        return 1.0
    return float(stats.chisquare(pooled_counts, pooled_expected).pvalue)


def make_problem(seed: int, num_draft: int, identical: bool = False):
    rng = np.random.default_rng(seed)
    # Mixed with the uniform distribution so every expected count is large.
    p = 0.7 * rng.dirichlet(np.ones(V), size=num_draft + 1) + 0.3 / V
    q = 0.7 * rng.dirichlet(np.ones(V), size=max(num_draft, 1))[:num_draft] + 0.3 / V
    if identical:
        p[:] = p[0]
        q[:] = q[0]
    return p, q


def draft_tokens(rng: np.random.Generator, q: np.ndarray, n: int) -> np.ndarray:
    cols = [
        np.minimum(np.searchsorted(np.cumsum(q_t), rng.random(n), side="right"), V - 1) for q_t in q
    ]
    return np.stack(cols, axis=1) if cols else np.zeros((n, 0), dtype=np.int64)


def run(verify_fn, p, q, seed, *, with_draft_probs=True, n=N):
    """Verifies n rows whose drafts were sampled from q (passed as draft_probs or not)."""
    rng = np.random.default_rng(seed)
    num_draft = q.shape[0]
    drafts = draft_tokens(rng, q, n)
    target = np.broadcast_to(p, (n, num_draft + 1, V))
    draft = np.broadcast_to(q, (n, num_draft, V)) if with_draft_probs else None
    return verify_fn(drafts, target, draft, rng=rng)


def position_pvalues(result, p) -> list[float]:
    """One p-value per position t = 0..K: emitted token at t vs p_t."""
    pvalues = []
    for t in range(p.shape[0]):
        reached = result.num_emitted > t
        assert reached.sum() > 2_000, f"too few rows reach position {t} to test it"
        pvalues.append(chi_square_pvalue(result.output_token_ids[reached, t], p[t]))
    return pvalues


def length_pvalue(num_accepted, alpha: float, num_draft: int) -> float:
    expected = np.array([alpha**i * (1 - alpha) for i in range(num_draft)] + [alpha**num_draft])
    counts = np.bincount(num_accepted, minlength=num_draft + 1)
    return float(stats.chisquare(counts, expected * counts.sum()).pvalue)


@pytest.mark.parametrize("num_draft", [1, 4])
@pytest.mark.parametrize("with_draft_probs", [True, False], ids=["draft_probs", "one_hot"])
def test_emitted_tokens_follow_the_target(num_draft, with_draft_probs):
    p, q = make_problem(seed=100 + num_draft, num_draft=num_draft)
    if not with_draft_probs:
        # A deterministic drafter that is often right (one-hot verification accepts
        # with probability p(x), so a poor drafter would leave later positions empty).
        p = 0.5 * p + 0.5 * (np.arange(V) == 3)
        q = np.tile(0.85 * (np.arange(V) == 3) + 0.015, (num_draft, 1))
    result = run(specaccept.verify, p, q, seed=200 + num_draft, with_draft_probs=with_draft_probs)
    pvalues = position_pvalues(result, p)
    assert min(pvalues) > ALPHA, pvalues
    # The check is not vacuous: drafts were rejected and bonus tokens emitted.
    assert 0.05 < (result.num_accepted < num_draft).mean() < 0.95


@pytest.mark.parametrize("num_draft", [1, 4])
def test_accepted_length_is_geometric(num_draft):
    p, q = make_problem(seed=300 + num_draft, num_draft=num_draft, identical=True)
    result = run(specaccept.verify, p, q, seed=400 + num_draft)
    alpha = float(np.minimum(p[0], q[0]).sum())
    assert length_pvalue(result.num_accepted, alpha, num_draft) > ALPHA
    assert position_pvalues(result, p) > [ALPHA] * (num_draft + 1)


def test_one_hot_drafts_accept_with_probability_p_of_the_draft():
    # draft_probs=None: position t accepts with probability p_t(x_t), whatever chose x_t.
    p, q = make_problem(seed=500, num_draft=4, identical=True)
    result = run(specaccept.verify, p, q, seed=501, with_draft_probs=False)
    alpha = float((q[0] * p[0]).sum())
    assert length_pvalue(result.num_accepted, alpha, 4) > ALPHA


def test_float16_and_float32_rows_follow_their_own_values():
    # Low precision rows are read as they are: the target is the stored row.
    p, q = make_problem(seed=600, num_draft=2)
    p16, q32 = p.astype(np.float16), q.astype(np.float32)
    result = run(specaccept.verify, p16, q32, seed=601)
    assert min(position_pvalues(result, p16.astype(np.float64))) > ALPHA


def test_the_reference_itself_follows_the_target():
    p, q = make_problem(seed=700, num_draft=1)
    result = run(reference.verify, p, q, seed=701)
    assert min(position_pvalues(result, p)) > ALPHA


# --- The checks catch mistakes: wrong variants of the reference fail them. ---


def verify_reusing_the_acceptance_uniform(drafts, target, draft, rng):
    """Wrong: the replacement sample reuses u_t of the rejected position."""
    uniforms = rng.random(drafts.shape)
    recovery = rng.random(drafts.shape[0])
    first = reference.verify(drafts, target, draft, uniforms=uniforms, recovery_uniforms=recovery)
    rejected = np.nonzero(first.num_accepted < drafts.shape[1])[0]
    recovery[rejected] = uniforms[rejected, first.num_accepted[rejected]]
    return reference.verify(drafts, target, draft, uniforms=uniforms, recovery_uniforms=recovery)


def verify_without_clamping_the_residual(drafts, target, draft, rng, monkeypatch):
    """Wrong: the residual is p - q, negative entries left in."""

    def unclamped(p, q, b, t, x):
        return [float(p[b, t, i]) - float(q[b, t, i]) for i in range(p.shape[2])]

    with monkeypatch.context() as patch:
        patch.setattr(reference, "_residual", unclamped)
        return reference.verify(drafts, target, draft, rng=rng)


def test_the_check_fails_when_the_acceptance_uniform_is_reused():
    p, q = make_problem(seed=800, num_draft=1)
    result = run(verify_reusing_the_acceptance_uniform, p, q, seed=801)
    assert min(position_pvalues(result, p)) < ALPHA


def test_the_check_fails_when_the_residual_is_not_clamped(monkeypatch):
    p, q = make_problem(seed=900, num_draft=1)

    def wrong(drafts, target, draft, rng):
        return verify_without_clamping_the_residual(drafts, target, draft, rng, monkeypatch)

    result = run(wrong, p, q, seed=901)
    assert min(position_pvalues(result, p)) < ALPHA


def test_the_length_check_fails_for_a_wrong_acceptance_rate():
    # Wrong: accepting with probability p/q squared (a plausible typo) shortens prefixes.
    p, q = make_problem(seed=1000, num_draft=4, identical=True)
    rng = np.random.default_rng(1001)
    drafts = draft_tokens(rng, q, N)
    ratio = np.minimum(1.0, p[0][drafts] / q[0][drafts])
    accepted = rng.random(drafts.shape) < ratio**2
    num_accepted = specaccept.accepted_prefix_length(accepted)
    alpha = float(np.minimum(p[0], q[0]).sum())
    assert length_pvalue(num_accepted, alpha, 4) < ALPHA
    # ... while the right rate passes the same check on the same draws.
    right = specaccept.accepted_prefix_length(rng.random(drafts.shape) < ratio)
    assert length_pvalue(right, alpha, 4) > ALPHA
