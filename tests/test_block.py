"""Block verification (``method="block"``, docs/spec.md section 2.6) is exact for the
joint law of what it emits, not only per position, and never accepts fewer drafts
in expectation than the token rule.

The models are context-dependent: the target and the draft are Markov chains over
a small vocabulary, so ``p_t`` depends on the drafted prefix. A step drafts ``k``
tokens, verifies them, and is continued with target samples to ``k + 1`` tokens;
the law of those ``k + 1`` tokens must be the target chain's. It is computed
exactly (rational arithmetic) from the rule as docs/spec.md states it, and
checked through the native code by a chi-square test.
"""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np
import pytest
import specaccept
from scipy import stats
from specaccept import reference

F = Fraction

# Two context-dependent models over V = 3 tokens: row c is the law of the token
# after token c. The draft favours token 0, the target tokens 1 and 2.
TARGET = [
    [F(1, 5), F(3, 10), F(1, 2)],
    [F(1, 10), F(3, 10), F(3, 5)],
    [F(2, 5), F(7, 20), F(1, 4)],
]
DRAFT = [
    [F(3, 5), F(1, 5), F(1, 5)],
    [F(1, 2), F(1, 3), F(1, 6)],
    [F(2, 3), F(1, 6), F(1, 6)],
]
V = 3
START = 0  # the committed token before the block


def positive(x: Fraction) -> Fraction:
    return x if x > 0 else F(0)


def next_rho(rho: Fraction, p: Fraction, q: Fraction) -> Fraction:
    if rho == 0 or p == 0:
        return F(0)
    if q == 0:
        return F(1)
    return min(F(1), rho * p / q)


def step_law(drafts, target_rows, draft_rows, variant="block"):
    """``{(tau, token): probability}`` of one verified block, exactly.

    ``target_rows[t]`` is ``p_t`` (``t <= k``), ``draft_rows[t]`` is ``q_t``.
    ``variant``: ``"block"`` (the rule), ``"token"`` (the token rule), or a
    plausibly wrong block rule: ``"first-failure"`` (stop at the first failure)
    or ``"no-rho"`` (residual ``p_tau - q_tau`` without ``rho_tau``), or
    ``"early-skip"`` (a step fails without its round when ``eta_i >= rho_i / 2``).
    """
    k = len(drafts)
    law: dict[tuple[int, int], Fraction] = {}

    def emit(tau: int, weight: Fraction, scale: Fraction) -> None:
        if weight == 0:
            return
        if tau == k:
            row = target_rows[k]
        else:
            row = [positive(scale * target_rows[tau][v] - draft_rows[tau][v]) for v in range(V)]
            if sum(row) == 0:
                row = target_rows[tau]
        total = sum(row)
        for v in range(V):
            if row[v]:
                law[(tau, v)] = law.get((tau, v), F(0)) + weight * row[v] / total

    if variant == "token":
        alive = F(1)
        for t, x in enumerate(drafts):
            p, q = target_rows[t][x], draft_rows[t][x]
            a = F(0) if p == 0 else (F(1) if q <= p else p / q)
            emit(t, alive * (1 - a), F(1))
            alive *= a
        emit(k, alive, F(1))
        return law

    rho = [F(1)]
    for t, x in enumerate(drafts):
        rho.append(next_rho(rho[t], target_rows[t][x], draft_rows[t][x]))
    h = {}
    for i in range(1, k):
        z = sum(positive(rho[i] * target_rows[i][v] - draft_rows[i][v]) for v in range(V))
        denominator = z + 1 - rho[i]
        h[i] = F(1) if denominator == 0 else z / denominator
        # A step with eta_i >= rho_i fails without its round (docs/spec.md section
        # 2.6): it succeeds with probability min(rho_i, h_i), which is h_i.
        assert h[i] <= rho[i]
        h[i] = min(h[i], rho[i] / 2 if variant == "early-skip" else rho[i])
    if k:
        h[k] = rho[k]
    for tau in range(k + 1):
        if variant == "first-failure":
            # Accept while eta_i < h_i, stop at the first failure.
            weight = np.prod([h[j] for j in range(1, tau + 1)], dtype=object) * (
                (1 - h[tau + 1]) if tau < k else 1
            )
        else:
            # tau = the largest i with eta_i < h_i: a later success overrides.
            weight = (h[tau] if tau else F(1)) * np.prod(
                [1 - h[j] for j in range(tau + 1, k + 1)], dtype=object
            )
        scale = F(1) if variant == "no-rho" else rho[tau]
        emit(tau, F(weight), scale)
    return law


def rows_for(drafts, one_hot):
    """``p_0..p_k`` and ``q_0..q_{k-1}`` of a drafted block (Markov contexts)."""
    context = [START, *drafts]
    target_rows = [TARGET[c] for c in context]
    if one_hot:
        draft_rows = [[F(int(v == x)) for v in range(V)] for x in drafts]
    else:
        draft_rows = [DRAFT[c] for c in context[:-1]]
    return target_rows, draft_rows


def draft_blocks(k, one_hot):
    """Every drafted block with its probability: sampled from the draft chain, or
    (one-hot) the draft chain's greedy proposal."""
    if one_hot:
        drafts, context = [], START
        for _ in range(k):
            context = max(range(V), key=lambda v: (DRAFT[context][v], -v))
            drafts.append(context)
        yield tuple(drafts), F(1)
        return
    for drafts in itertools.product(range(V), repeat=k):
        weight, context = F(1), START
        for x in drafts:
            weight *= DRAFT[context][x]
            context = x
        yield drafts, weight


def sequence_law(k, one_hot, variant="block"):
    """The exact law of the first k + 1 tokens: a verified block continued by the target."""
    law: dict[tuple[int, ...], Fraction] = {}
    for drafts, weight in draft_blocks(k, one_hot):
        target_rows, draft_rows = rows_for(drafts, one_hot)
        for (tau, token), p in step_law(drafts, target_rows, draft_rows, variant).items():
            emitted = (*drafts[:tau], token)
            for rest in itertools.product(range(V), repeat=k + 1 - len(emitted)):
                sequence, q, context = (*emitted, *rest), weight * p, emitted[-1]
                for y in rest:
                    q *= TARGET[context][y]
                    context = y
                law[sequence] = law.get(sequence, F(0)) + q
    return law


def target_law(length):
    law = {}
    for sequence in itertools.product(range(V), repeat=length):
        q, context = F(1), START
        for y in sequence:
            q *= TARGET[context][y]
            context = y
        law[sequence] = q
    return law


def expected_accepted(k, one_hot, variant):
    total = F(0)
    for drafts, weight in draft_blocks(k, one_hot):
        target_rows, draft_rows = rows_for(drafts, one_hot)
        law = step_law(drafts, target_rows, draft_rows, variant)
        total += weight * sum(p * tau for (tau, _), p in law.items())
    return total


@pytest.mark.parametrize("one_hot", [False, True], ids=["draft-probs", "one-hot"])
@pytest.mark.parametrize("k", [1, 2, 3])
def test_the_block_rule_emits_the_target_law_exactly(k, one_hot):
    assert sequence_law(k, one_hot) == target_law(k + 1)
    assert sequence_law(k, one_hot, "token") == target_law(k + 1)


@pytest.mark.parametrize("variant", ["first-failure", "no-rho", "early-skip"])
def test_plausibly_wrong_block_rules_are_caught(variant):
    # Each wrong rule breaks the law on these models (and the test above would fail).
    assert sequence_law(3, False, variant) != target_law(4)


@pytest.mark.parametrize("one_hot", [False, True], ids=["draft-probs", "one-hot"])
@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_block_never_accepts_fewer_in_expectation(k, one_hot):
    block, token = expected_accepted(k, one_hot, "block"), expected_accepted(k, one_hot, "token")
    assert block >= token
    if one_hot:
        assert block == token  # one-hot drafts: the same accepted-length law
    elif k >= 2:
        assert block > token


def test_the_worked_example_of_the_paper():
    # V = 2, every position p = (1/3, 2/3), q = (2/3, 1/3), k = 2: 10/9 and 11/9.
    p, q = [F(1, 3), F(2, 3)], [F(2, 3), F(1, 3)]
    expected = {"token": F(0), "block": F(0)}
    for drafts in itertools.product(range(2), repeat=2):
        weight = q[drafts[0]] * q[drafts[1]]
        for method in expected:
            law = step_law_2(drafts, p, q, method)
            expected[method] += weight * sum(pr * tau for (tau, _), pr in law.items())
    assert expected == {"token": F(10, 9), "block": F(11, 9)}
    # The closed form of the library on every drafted block, weighted the same way.
    ids = np.array(list(itertools.product(range(2), repeat=2)))
    weights = np.array([float(q[a] * q[b]) for a, b in ids])
    target = np.tile([1 / 3, 2 / 3], (4, 3, 1))
    draft = np.tile([2 / 3, 1 / 3], (4, 2, 1))
    for method, value in (("token", 10 / 9), ("block", 11 / 9)):
        got = specaccept.lab.expected_num_accepted(ids, target, draft, method=method)
        assert float(weights @ got) == pytest.approx(value, abs=1e-12)


def step_law_2(drafts, p, q, method):
    global V
    saved, V = V, 2
    try:
        return step_law(drafts, [p] * 3, [q] * 2, method)
    finally:
        V = saved


# --- through the native code ---------------------------------------------------------

ALPHA = 1e-6  # false-failure rate of each chi-square test


def as_array(rows):
    return np.array([[float(x) for x in row] for row in rows])


def sample_chain(rng, matrix, context, size):
    cdf = np.cumsum(matrix[context], axis=-1)
    return (rng.random((size, 1)) > cdf).sum(axis=1)


@pytest.mark.parametrize("one_hot", [False, True], ids=["draft-probs", "one-hot"])
def test_native_block_rows_follow_the_target_law(one_hot):
    k, rows = 3, 60_000
    rng = np.random.default_rng(7 + one_hot)
    target, draft = as_array(TARGET), as_array(DRAFT)
    if one_hot:
        drafts = np.tile([x for x in next(draft_blocks(k, True))[0]], (rows, 1))
    else:
        drafts = np.empty((rows, k), np.int64)
        context = np.full(rows, START)
        for t in range(k):
            drafts[:, t] = sample_chain(rng, draft, context, rows)
            context = drafts[:, t]
    contexts = np.concatenate([np.full((rows, 1), START), drafts], axis=1)
    p = target[contexts]  # [rows, k+1, V]
    q = None if one_hot else draft[contexts[:, :k]]
    result = specaccept.verify(drafts, p, q, rng=rng, method="block")
    # Continue every row with target samples to k + 1 tokens.
    sequences = np.full((rows, k + 1), -1)
    for b in range(rows):
        emitted = result.tokens(b)
        sequences[b, : len(emitted)] = emitted
    for t in range(1, k + 1):
        todo = sequences[:, t] < 0
        sequences[todo, t] = sample_chain(rng, target, sequences[todo, t - 1], int(todo.sum()))
    cells = sequences @ (V ** np.arange(k, -1, -1))
    observed = np.bincount(cells, minlength=V ** (k + 1))
    law = target_law(k + 1)
    expected = np.array([float(law[s]) for s in itertools.product(range(V), repeat=k + 1)])
    statistic, p_value = stats.chisquare(observed, expected * rows)
    assert p_value > ALPHA, (statistic, p_value)
    # The mean accepted length is the exact expectation of the rule.
    exact = float(expected_accepted(k, one_hot, "block"))
    spread = result.num_accepted.std() / np.sqrt(rows)
    assert abs(result.num_accepted.mean() - exact) < 5.5 * spread  # about 4e-8 two-sided


def test_the_chi_square_test_sees_a_wrong_law():
    # The same test on rows drawn from the first-failure rule's law fails.
    k, rows = 3, 60_000
    rng = np.random.default_rng(3)
    law = sequence_law(k, False, "first-failure")
    cells = list(itertools.product(range(V), repeat=k + 1))
    wrong = np.array([float(law.get(s, 0)) for s in cells])
    observed = np.bincount(rng.choice(len(cells), size=rows, p=wrong), minlength=len(cells))
    target = target_law(k + 1)
    expected = np.array([float(target[s]) for s in cells])
    assert stats.chisquare(observed, expected * rows)[1] < ALPHA


# --- parity with the reference, and the expectation ----------------------------------


def random_case(seed, one_hot=False):
    rng = np.random.default_rng(seed)
    batch, k, vocab = 5, int(rng.integers(0, 6)), int(rng.integers(1, 60))
    dtype = (np.float16, np.float32, np.float64)[seed % 3]
    raw = rng.gamma(0.3, size=(batch, k + 1, vocab))
    p = (raw / raw.sum(-1, keepdims=True)).astype(dtype)
    raw = rng.gamma(0.3, size=(batch, k, vocab))
    q = None if one_hot else (raw / raw.sum(-1, keepdims=True)).astype(dtype)
    ids = rng.integers(0, vocab, size=(batch, k))
    if k:
        ids = np.where(rng.random((batch, k)) < 0.6, p[:, :k].argmax(2), ids)
    return dict(
        draft_token_ids=ids,
        target_probs=p,
        draft_probs=q,
        num_draft_tokens=rng.integers(0, k + 1, size=batch),
        uniforms=rng.random((batch, k)),
        recovery_uniforms=rng.random(batch),
        greedy=rng.random(batch) < 0.2,
    )


@pytest.mark.parametrize("one_hot", [False, True], ids=["draft-probs", "one-hot"])
@pytest.mark.parametrize("seed", range(40))
def test_native_equals_the_reference(seed, one_hot):
    case = random_case(seed, one_hot)
    native = specaccept.verify(**case, method="block")
    oracle = reference.verify(**case, method="block")
    assert native.to_lists() == oracle.to_lists()
    assert native.num_accepted.tolist() == oracle.num_accepted.tolist()


def test_strided_and_contiguous_rows_give_the_same_tokens():
    case = random_case(5)
    strided = dict(case)
    for name in ("target_probs", "draft_probs"):
        doubled = np.repeat(case[name], 2, axis=-1)
        strided[name] = doubled[..., ::2]
        assert not strided[name].flags.c_contiguous
    assert (
        specaccept.verify(**strided, method="block").to_lists()
        == specaccept.verify(**case, method="block").to_lists()
    )


def test_a_uniform_exactly_at_h_is_a_failure():
    # k = 1: h_1 = rho_1 = p/q = 0.5 exactly; eta_1 = 0.5 fails, the next float below passes.
    p = np.array([[[0.25, 0.75], [0.5, 0.5]]])
    q = np.array([[[0.5, 0.5]]])
    ids = np.array([[0]])
    for u, accepted in ((0.5, 0), (np.nextafter(0.5, 0), 1)):
        for fn in (specaccept.verify, reference.verify):
            r = fn(
                ids,
                p,
                q,
                uniforms=np.array([[u]]),
                recovery_uniforms=np.array([0.3]),
                method="block",
            )
            assert r.num_accepted[0] == accepted


def test_a_later_success_overrides_an_earlier_failure():
    # k = 2, V = 2: rho_1 = 1/2; eta_1 fails h_1, eta_2 = 0 < h_2 = rho_2 > 0: tau = 2.
    p = np.array([[[0.5, 0.5], [0.5, 0.5], [0.3, 0.7]]])
    q = np.array([[[1.0, 0.0], [0.5, 0.5]]])
    ids = np.array([[0, 0]])
    kwargs = dict(uniforms=np.array([[0.999, 0.0]]), recovery_uniforms=np.array([0.5]))
    assert specaccept.verify(ids, p, q, **kwargs, method="token").num_accepted[0] == 0
    for fn in (specaccept.verify, reference.verify):
        r = fn(ids, p, q, **kwargs, method="block")
        assert r.num_accepted[0] == 2


@pytest.mark.parametrize("fn", [specaccept.verify, reference.verify], ids=["native", "reference"])
def test_a_step_whose_uniform_reaches_rho_fails_without_reading_its_rows(fn):
    # k = 3, V = 4: rho_1 = 0.2 / 0.4 = 1/2, rho_2 = 1/4, rho_3 = 1/8. Draft row 1 holds a
    # NaN off its drafted token, so the step down to i = 1 raises if it reads the row.
    nan = float("nan")
    p = np.array([[[0.2, 0.3, 0.3, 0.2], [0.25] * 4, [0.25] * 4, [0.1, 0.2, 0.3, 0.4]]])
    q = np.array([[[0.4, 0.2, 0.2, 0.2], [0.5, nan, 0.25, 0.25], [0.5, 0.25, 0.25, 0.0]]])
    ids = np.array([[0, 0, 0]])
    ru = np.array([0.5])
    # eta_3 = eta_2 = 0.99 fail; eta_1 = rho_1 fails without the round: tau = 0, and the
    # token rule's residual max(0, p_0 - q_0) = (0, 0.1, 0.1, 0) draws token 1 or 2.
    r = fn(ids, p, q, uniforms=np.array([[0.5, 0.99, 0.99]]), recovery_uniforms=ru, method="block")
    assert r.num_accepted[0] == 0 and r.output_token_ids[0, 0] in (1, 2)
    # Just below rho_1 the step computes h_1 from the rows, and the NaN is an error.
    with pytest.raises(ValueError, match=r"draft_probs\[0, 1, 1\]"):
        fn(
            ids,
            p,
            q,
            uniforms=np.array([[np.nextafter(0.5, 0), 0.99, 0.99]]),
            recovery_uniforms=ru,
            method="block",
        )


@pytest.mark.parametrize("seed", range(10))
def test_expected_num_accepted_matches_monte_carlo(seed):
    case = random_case(seed)
    del case["uniforms"], case["recovery_uniforms"], case["greedy"]
    rng = np.random.default_rng(seed)
    reps = 20_000
    tiled = {
        k: (np.repeat(v, reps, axis=0) if isinstance(v, np.ndarray) else v) for k, v in case.items()
    }
    for method in ("token", "block"):
        exact = specaccept.lab.expected_num_accepted(**case, method=method)
        got = specaccept.verify(**tiled, rng=rng, method=method).num_accepted.reshape(-1, reps)
        spread = got.std(axis=1) / np.sqrt(reps)
        # Events rarer than 20 / reps may go unseen (and leave no spread): each
        # moves the mean by at most K times its probability.
        rare = case["draft_token_ids"].shape[1] * 20 / reps
        assert np.all(np.abs(got.mean(axis=1) - exact) < 5.5 * spread + rare), method


@pytest.mark.parametrize("seed", range(20))
def test_block_expects_at_least_as_many_on_random_rows(seed):
    # The guarantee is over the drafts (sampled from q), not for each drafted block:
    # every block of a small vocabulary, weighted by its draft probability.
    rng = np.random.default_rng(seed)
    vocab, k = int(rng.integers(2, 6)), int(rng.integers(1, 4))
    p = rng.dirichlet(np.full(vocab, 0.5), size=k + 1)
    q = rng.dirichlet(np.full(vocab, 0.5), size=k)
    blocks = np.array(list(itertools.product(range(vocab), repeat=k)))
    weights = np.prod(q[np.arange(k), blocks], axis=1)
    target, draft = np.tile(p, (len(blocks), 1, 1)), np.tile(q, (len(blocks), 1, 1))
    token = weights @ specaccept.lab.expected_num_accepted(blocks, target, draft, method="token")
    block = weights @ specaccept.lab.expected_num_accepted(blocks, target, draft, method="block")
    assert block >= token - 1e-12
    if k >= 2:
        assert block > token  # strictly, on these mixed rows


def test_block_expects_more_on_the_builtin_ngram_models():
    from specaccept.ngram import builtin_models, drafted_block

    target, draft, vocab = builtin_models()
    rng = np.random.default_rng(11)
    ids = vocab.encode(ngram_prompt())
    k, steps = 4, 1500
    starts = rng.integers(8, len(ids) - 8, size=steps)
    token, block = [], []
    for start in starts:
        args = drafted_block(target, draft, ids[int(start) - 8 : int(start)], k, rng)
        token.append(specaccept.lab.expected_num_accepted(*args, method="token")[0])
        block.append(specaccept.lab.expected_num_accepted(*args, method="block")[0])
    gain = np.array(block) - np.array(token)
    # Paired over the same drafts: the mean gain is above zero by 4 standard errors.
    assert gain.mean() > 4 * gain.std() / np.sqrt(steps), (np.mean(token), np.mean(block))


def ngram_prompt() -> str:
    from specaccept.ngram import builtin_text

    return builtin_text()[:20000]


def test_the_method_is_checked():
    case = random_case(1)
    with pytest.raises(specaccept.InputError, match="method must be one of"):
        specaccept.verify(**case, method="tree")
    with pytest.raises(TypeError, match="method must be one of"):
        specaccept.verify(**case, method=None)
    with pytest.raises(specaccept.InputError, match="method must be one of"):
        reference.verify(**case, method="Block")


@pytest.mark.parametrize("seed", range(6))
def test_the_vllm_layer_verifies_blocks_as_verify_does(seed):
    from specaccept.compat import vllm

    rng = np.random.default_rng(seed)
    counts, vocab = [3, 0, 4, 2], 12
    total, k_max = sum(counts), max(counts)
    p = rng.dirichlet(np.full(vocab, 0.4), size=total)
    q = rng.dirichlet(np.full(vocab, 0.4), size=total)
    ids = np.where(rng.random(total) < 0.5, p.argmax(1), rng.integers(0, vocab, size=total))
    u, ru = rng.random(total), rng.random(len(counts))
    bonus = rng.integers(0, vocab, size=len(counts))
    for name in ("block", "standard"):
        flat = vllm.verify(
            ids, counts, p, q, bonus, uniforms=u, recovery_uniforms=ru, rejection_sample_method=name
        )
        start = 0
        for b, k in enumerate(counts):
            rows = slice(start, start + k)
            target = np.zeros((1, k_max + 1, vocab))
            target[0, :k] = p[rows]
            target[0, k] = np.eye(vocab)[bonus[b]]  # the given bonus, as a point mass
            draft = np.zeros((1, k_max, vocab))
            draft[0, :k] = q[rows]
            padded_u = np.zeros((1, k_max))
            padded_u[0, :k] = u[rows]
            padded_ids = np.zeros((1, k_max), np.int64)
            padded_ids[0, :k] = ids[rows]
            alone = specaccept.verify(
                padded_ids,
                target,
                draft,
                num_draft_tokens=np.array([k]),
                uniforms=padded_u,
                recovery_uniforms=ru[[b]],
                method="block" if name == "block" else "token",
            )
            assert flat.tokens(b).tolist() == alone.tokens(0).tolist(), (name, b)
            start += k


# --- from logits ----------------------------------------------------------------------


def logits_case(seed):
    rng = np.random.default_rng(seed)
    batch, k, vocab = 4, int(rng.integers(0, 5)), int(rng.integers(1, 80))
    target = (rng.normal(size=(batch, k + 1, vocab)) * 2).astype((np.float32, np.float64)[seed % 2])
    draft = None if seed % 3 == 0 else (rng.normal(size=(batch, k, vocab)) * 2).astype(np.float32)
    ids = rng.integers(0, vocab, size=(batch, k))
    if k:
        ids = np.where(rng.random((batch, k)) < 0.5, target[:, :k].argmax(2), ids)
    return dict(
        draft_token_ids=ids,
        target_logits=target,
        draft_logits=draft,
        temperature=rng.choice([0.0, 0.6, 1.0, 1.7], size=batch),
        top_k=rng.choice([0, 1, 3, 20], size=batch),
        top_p=rng.choice([1.0, 0.8, 0.95], size=batch),
        num_draft_tokens=rng.integers(0, k + 1, size=batch),
        uniforms=rng.random((batch, k)),
        recovery_uniforms=rng.random(batch),
    )


@pytest.mark.parametrize("seed", range(60))
def test_verify_logits_block_equals_the_reference(seed):
    case = logits_case(seed)
    native = specaccept.verify_logits(**case, method="block")
    oracle = reference.verify_logits(**case, method="block")
    assert native.to_lists() == oracle.to_lists()


@pytest.mark.parametrize("seed", range(20))
def test_verify_logits_block_is_verify_block_on_the_transformed_rows(seed):
    case = logits_case(seed)
    case["temperature"] = np.where(case["temperature"] == 0, 0.8, case["temperature"])
    batch, _, vocab = case["target_logits"].shape

    def transformed(logits, b):
        rows = [
            reference.transform_logits(
                row, case["temperature"][b], case["top_k"][b], case["top_p"][b]
            )
            for row in logits[b]
        ]
        return np.array(rows).reshape(len(rows), vocab)

    p = np.stack([transformed(case["target_logits"], b) for b in range(batch)])
    q = None
    if case["draft_logits"] is not None:
        q = np.stack([transformed(case["draft_logits"], b) for b in range(batch)])
    from_logits = specaccept.verify_logits(**case, method="block")
    from_probs = specaccept.verify(
        case["draft_token_ids"],
        p,
        q,
        num_draft_tokens=case["num_draft_tokens"],
        uniforms=case["uniforms"],
        recovery_uniforms=case["recovery_uniforms"],
        method="block",
    )
    assert from_logits.num_accepted.tolist() == from_probs.num_accepted.tolist()


def test_block_rows_are_the_same_on_any_thread_count_and_into_out_buffers():
    before = specaccept.get_num_threads()
    rng = np.random.default_rng(21)
    batch, k, vocab = 48, 4, 12_000  # above PARALLEL_MIN_ELEMENTS: rows run on the pool
    p = rng.dirichlet(np.full(vocab, 0.3), size=(batch, k + 1)).astype(np.float32)
    q = rng.dirichlet(np.full(vocab, 0.3), size=(batch, k)).astype(np.float32)
    ids = np.where(
        rng.random((batch, k)) < 0.5, p[:, :k].argmax(2), rng.integers(0, vocab, (batch, k))
    )
    u, ru = rng.random((batch, k)), rng.random(batch)
    counts = rng.integers(0, k + 1, size=batch)
    expected = reference.verify(
        ids, p, q, num_draft_tokens=counts, uniforms=u, recovery_uniforms=ru, method="block"
    ).to_lists()
    try:
        for n in (1, 2, 4):
            specaccept.set_num_threads(n)
            out = specaccept.Verification.empty(batch, k)
            r = specaccept.verify(
                ids,
                p,
                q,
                num_draft_tokens=counts,
                uniforms=u,
                recovery_uniforms=ru,
                method="block",
                out=out,
            )
            assert r.output_token_ids is out.output_token_ids
            assert r.to_lists() == expected, n
    finally:
        specaccept.set_num_threads(before)
    # Per-row Generators: a row's tokens do not depend on the rest of the batch.
    seeds = [np.random.default_rng(s) for s in range(batch)]
    whole = specaccept.verify(ids, p, q, rng=seeds, method="block")
    alone = specaccept.verify(
        ids[5:6], p[5:6], q[5:6], rng=[np.random.default_rng(5)], method="block"
    )
    assert whole.tokens(5).tolist() == alone.tokens(0).tolist()
