"""``verify_tree``: a single path is the chain, parity with the reference on random
trees, and lossless output (chi-square, N >= 100,000)."""

from __future__ import annotations

import numpy as np
import pytest
import specaccept
from conftest import FLOAT_DTYPES, random_rows
from scipy import stats
from specaccept import InputError, reference

ALPHA = 1e-6  # false-failure rate of each statistical check


def tree_outcome(fn, **kwargs):
    try:
        r = fn(**kwargs)
    except (TypeError, ValueError) as e:
        return (type(e), str(e))
    return (
        r.output_token_ids.tolist(),
        r.num_accepted.tolist(),
        r.num_emitted.tolist(),
        r.accepted_node_ids.tolist(),
    )


@pytest.mark.parametrize("with_draft", [True, False])
@pytest.mark.parametrize("seed", range(30))
def test_a_single_path_is_the_chain(seed, with_draft):
    rng = np.random.default_rng(seed)
    batch, k, vocab = 5, int(rng.integers(0, 6)), int(rng.choice([3, 17, 300]))
    p = random_rows(rng, (batch, k + 1, vocab), np.float32)
    q = random_rows(rng, (batch, k, vocab), np.float32) if with_draft else None
    ids = rng.integers(0, vocab, size=(batch, k))
    ids = np.where(rng.random((batch, k)) < 0.5, p[:, :k].argmax(-1), ids)
    u, ru = rng.random((batch, k)), rng.random(batch)
    greedy = rng.random(batch) < 0.3
    chain = specaccept.verify(ids, p, q, uniforms=u, recovery_uniforms=ru, greedy=greedy)
    # Node n (n >= 1) holds draft n - 1; node n's target row is chain row n.
    parents = np.arange(-1, k)
    tokens = np.concatenate([np.zeros((batch, 1), dtype=ids.dtype), ids], axis=1)
    tree_q = None if q is None else np.concatenate([np.zeros((batch, 1, vocab), np.float32), q], 1)
    tree_u = np.concatenate([np.zeros((batch, 1)), u], axis=1)
    tree = specaccept.verify_tree(
        tokens, parents, p, tree_q, uniforms=tree_u, recovery_uniforms=ru, greedy=greedy
    )
    np.testing.assert_array_equal(tree.output_token_ids, chain.output_token_ids)
    np.testing.assert_array_equal(tree.num_accepted, chain.num_accepted)
    for b in range(batch):
        n = chain.num_accepted[b]
        assert tree.accepted_node_ids[b, :n].tolist() == list(range(1, n + 1))


def random_tree(rng, nodes: int) -> np.ndarray:
    parents = np.full(nodes, -1)
    real = [0]
    for n in range(1, nodes):
        if rng.random() < 0.15:
            continue  # padding
        parents[n] = rng.choice(real)
        real.append(n)
    return parents


def random_tree_case(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    batch, nodes = int(rng.integers(0, 5)), int(rng.integers(1, 12))
    vocab = int(rng.choice([1, 2, 5, 33, 257, 300]))
    shared = rng.random() < 0.3
    parents = (
        random_tree(rng, nodes)
        if shared
        else np.array([random_tree(rng, nodes) for _ in range(batch)], dtype=np.int64).reshape(
            batch, nodes
        )
    )
    p = random_rows(rng, (batch, nodes, vocab), FLOAT_DTYPES[rng.integers(3)])
    q = (
        None
        if rng.random() < 0.3
        else random_rows(rng, (batch, nodes, vocab), FLOAT_DTYPES[rng.integers(3)])
    )
    tokens = rng.integers(0, vocab, size=(batch, nodes))
    tokens = np.where(rng.random((batch, nodes)) < 0.4, np.argmax(p, axis=-1), tokens)
    case = dict(
        node_token_ids=tokens.astype((np.int32, np.int64)[seed % 2]),
        parent_ids=parents,
        target_probs=p,
        draft_probs=q,
        uniforms=rng.random((batch, nodes)),
        recovery_uniforms=rng.random(batch),
        greedy=rng.random(batch) < 0.25 if rng.random() < 0.5 else bool(rng.random() < 0.2),
    )
    if seed % 11 == 0 and batch:
        case["target_probs"][0, 0, :] = np.nan  # an error: the root row is read
    return case


@pytest.mark.parametrize("block", range(6))
def test_matches_the_reference_on_random_trees(block):
    accepted_somewhere = 0
    for seed in range(block * 50, (block + 1) * 50):
        case = random_tree_case(seed)
        native = tree_outcome(specaccept.verify_tree, **case)
        oracle = tree_outcome(reference.verify_tree, **case)
        assert native == oracle, f"seed {seed}"
        if not isinstance(native[0], type):
            accepted_somewhere += sum(native[1])
    assert accepted_somewhere > 0


def first_tokens(rows: int, m: int, with_draft: bool, seed: int):
    """A root with m children; returns the first emitted token of each row and p."""
    rng = np.random.default_rng(seed)
    vocab = 8
    p = rng.dirichlet(np.ones(vocab))
    q = rng.dirichlet(np.ones(vocab))
    nodes = m + 1
    parents = np.array([-1] + [0] * m)
    if with_draft:
        children = rng.choice(vocab, p=q, size=(rows, m))  # i.i.d. from q
        draft = np.broadcast_to(q, (rows, nodes, vocab))
    else:
        children = np.broadcast_to(np.argsort(-q, kind="stable")[:m], (rows, m))  # top-m of q
        draft = None
    tokens = np.concatenate([np.zeros((rows, 1), dtype=np.int64), children], axis=1)
    target = np.broadcast_to(p, (rows, nodes, vocab))
    result = specaccept.verify_tree(tokens, parents, target, draft, rng=rng)
    return result.output_token_ids[:, 0], p, result


@pytest.mark.parametrize("m", [2, 4])
@pytest.mark.parametrize("with_draft", [True, False], ids=["iid from q", "top-m of q"])
def test_the_first_token_follows_the_target(m, with_draft):
    rows = 100_000
    first, p, result = first_tokens(rows, m, with_draft, seed=m + 10 * with_draft)
    counts = np.bincount(first, minlength=len(p))
    assert stats.chisquare(counts, p * rows).pvalue > ALPHA, (counts / rows, p)
    assert 0 < result.num_accepted.mean() < 1


def test_a_two_level_trees_second_token_follows_its_target_row():
    rng = np.random.default_rng(3)
    rows, vocab = 100_000, 6
    p0, p1 = rng.dirichlet(np.ones(vocab)), rng.dirichlet(np.ones(vocab))
    q0, q1 = rng.dirichlet(np.ones(vocab)), rng.dirichlet(np.ones(vocab))
    # Root -> children 1, 2; each has children 3, 4 (of 1) and 5, 6 (of 2).
    parents = np.array([-1, 0, 0, 1, 1, 2, 2])
    level = np.array([0, 1, 1, 2, 2, 2, 2])
    tokens = np.where(
        level == 1,
        rng.choice(vocab, p=q0, size=(rows, 7)),
        rng.choice(vocab, p=q1, size=(rows, 7)),
    )
    target = np.stack([p0, p1, p1, p1, p1, p1, p1])  # every level-1 node's row is p1
    draft = np.stack([q0, q0, q0, q1, q1, q1, q1])
    result = specaccept.verify_tree(
        tokens,
        parents,
        np.broadcast_to(target, (rows, 7, vocab)),
        np.broadcast_to(draft, (rows, 7, vocab)),
        rng=rng,
    )
    first = result.output_token_ids[:, 0]
    assert stats.chisquare(np.bincount(first, minlength=vocab), p0 * rows).pvalue > ALPHA
    went_on = result.num_accepted >= 1
    second = result.output_token_ids[went_on, 1]
    expected = p1 * went_on.sum()
    assert stats.chisquare(np.bincount(second, minlength=vocab), expected).pvalue > ALPHA
    assert (result.accepted_node_ids[went_on, 0] <= 2).all()


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        (lambda c: c["parent_ids"].__setitem__(0, 3), r"parent_ids\[0, 0\] = 3"),
        (
            lambda c: c["parent_ids"].__setitem__(2, 2),
            r"parent_ids\[0, 2\] = 2: a parent must come before",
        ),
        (
            lambda c: c.update(parent_ids=np.array([-1, -1, 1])),
            r"parent_ids\[0, 2\] = 1: the parent is padding",
        ),
        (
            lambda c: c["node_token_ids"].__setitem__((0, 1), 5),
            r"node_token_ids\[0, 1\] = 5 is outside",
        ),
        (lambda c: c["uniforms"].__setitem__((0, 1), 1.0), r"uniforms\[0, 1\]"),
        (lambda c: c.update(target_probs=c["target_probs"][:, :2]), "target_probs"),
    ],
)
def test_errors_name_the_argument(change, fragment):
    case = dict(
        node_token_ids=np.array([[0, 1, 2]]),
        parent_ids=np.array([-1, 0, 0]),
        target_probs=np.full((1, 3, 3), 1 / 3),
        draft_probs=np.full((1, 3, 3), 1 / 3),
        uniforms=np.full((1, 3), 0.5),
        recovery_uniforms=np.array([0.5]),
    )
    change(case)
    for impl in (specaccept, reference):
        with pytest.raises(ValueError, match=fragment):
            impl.verify_tree(**case)


def test_the_tree_accepts_more_than_the_chain_on_the_same_budget():
    # Six drafted tokens either way: a chain of 6, or two candidates at the first
    # position each followed by a chain of two. At a moderate acceptance rate the
    # second candidate pays off (benches/bench_tree.py sweeps the rate).
    rng = np.random.default_rng(0)
    rows, vocab = 20_000, 64
    p = rng.dirichlet(np.full(vocab, 0.5))
    q = 0.25 * p + 0.75 * rng.dirichlet(np.full(vocab, 0.5))
    alpha = float(specaccept.acceptance_rate(p, q))
    assert 0.35 < alpha < 0.6
    chain = specaccept.verify(
        rng.choice(vocab, p=q, size=(rows, 6)),
        np.broadcast_to(p, (rows, 7, vocab)),
        np.broadcast_to(q, (rows, 6, vocab)),
        rng=rng,
    )
    parents = np.array([-1, 0, 0, 1, 2, 3, 4])
    tree = specaccept.verify_tree(
        rng.choice(vocab, p=q, size=(rows, 7)),
        parents,
        np.broadcast_to(p, (rows, 7, vocab)),
        np.broadcast_to(q, (rows, 7, vocab)),
        rng=rng,
    )
    # Means over 20,000 rows have standard errors near 0.01: a 0.1 gap is 7 of them.
    assert tree.num_accepted.mean() > chain.num_accepted.mean() + 0.1


def test_large_trees_give_the_same_tokens_on_any_number_of_threads():
    rng = np.random.default_rng(5)
    batch, vocab = 24, 20_000
    assert batch * vocab >= specaccept.PARALLEL_MIN_ELEMENTS
    parents = np.array([-1, 0, 0, 1, 1, 2, 5])
    p = random_rows(rng, (batch, 7, vocab), np.float32)
    q = random_rows(rng, (batch, 7, vocab), np.float32)
    tokens = np.where(
        rng.random((batch, 7)) < 0.5, p.argmax(-1), rng.integers(0, vocab, (batch, 7))
    )
    kwargs = dict(uniforms=rng.random((batch, 7)), recovery_uniforms=rng.random(batch))
    before = specaccept.get_num_threads()
    try:
        results = []
        for n in (1, 2, 3):
            specaccept.set_num_threads(n)
            results.append(
                tree_outcome(
                    specaccept.verify_tree,
                    node_token_ids=tokens,
                    parent_ids=parents,
                    target_probs=p,
                    draft_probs=q,
                    **kwargs,
                )
            )
    finally:
        specaccept.set_num_threads(before)
    assert results[0] == results[1] == results[2]
    assert sum(results[0][1]) > 0


@pytest.mark.parametrize("method", ["token", "traversal"])
@pytest.mark.parametrize("layout", ["contiguous", "strided", "strided target"])
@pytest.mark.parametrize(
    ("arg", "node", "value"),
    [
        ("target_probs", 0, np.nan),  # the root's row: read by the first round
        ("draft_probs", 1, -0.25),  # the first child's row: the first round
        ("draft_probs", 2, np.inf),  # the second child's row: a later round
    ],
)
def test_bad_values_in_rows_the_rounds_read_are_named(arg, node, value, layout, method):
    # Both children are rejected (q(x) = 0.9 > p(x), u near 1), so the root's row
    # and both draft rows are read in full by the residual rounds. A strided
    # target row with a unit-stride draft row is copied before its first round.
    vocab = 6
    p = np.full((1, 3, vocab), 1 / vocab)
    q = np.full((1, 3, vocab), 0.02)
    q[0, 1, 1] = q[0, 2, 2] = 0.9
    case = dict(
        node_token_ids=np.array([[0, 1, 2]]),
        parent_ids=np.array([-1, 0, 0]),
        target_probs=p,
        draft_probs=q,
        uniforms=np.full((1, 3), 0.999),
        recovery_uniforms=np.array([0.5]),
        method=method,
    )
    assert specaccept.verify_tree(**case).num_accepted.tolist() == [0]
    case[arg] = case[arg].copy()
    case[arg][0, node, 4] = value
    if layout != "contiguous":  # the same values through a non-unit stride
        names = ("target_probs", "draft_probs") if layout == "strided" else ("target_probs",)
        for name in names:
            wide = np.zeros((1, 3, 2 * vocab))
            wide[..., ::2] = case[name]
            case[name] = wide[..., ::2]
    for impl in (specaccept, reference):
        with pytest.raises(ValueError, match=rf"^{arg}\[0, {node}, 4\] = "):
            impl.verify_tree(**case)


def test_one_generator_per_row_makes_a_row_independent_of_the_others() -> None:
    rng = np.random.default_rng(8)
    batch, nodes, vocab = 4, 6, 9
    parents = np.array([-1, 0, 0, 1, 1, 2])
    ids = rng.integers(0, vocab, (batch, nodes))
    p = rng.dirichlet(np.ones(vocab), (batch, nodes))
    q = rng.dirichlet(np.ones(vocab), (batch, nodes))

    def generators():
        return [np.random.default_rng(100 + b) for b in range(batch)]

    for method in ("token", "traversal"):
        together = specaccept.verify_tree(ids, parents, p, q, rng=generators(), method=method)
        want = reference.verify_tree(ids, parents, p, q, rng=generators(), method=method)
        assert together.output_token_ids.tolist() == want.output_token_ids.tolist()
        for b in range(batch):
            alone = specaccept.verify_tree(
                ids[b : b + 1], parents, p[b : b + 1], q[b : b + 1],
                rng=[np.random.default_rng(100 + b)], method=method,
            )  # fmt: skip
            assert alone.output_token_ids[0].tolist() == together.output_token_ids[b].tolist()
    with pytest.raises(specaccept.InputError, match="one per row") as error:
        specaccept.verify_tree(ids, parents, p, q, rng=generators()[:3])
    assert error.value.argument == "rng"
    with pytest.raises(TypeError, match=r"rng\[1\]"):
        specaccept.verify_tree(ids, parents, p, q, rng=[np.random.default_rng(), 5, 6, 7])


# --- The residual rounds' arithmetic, to the bit (docs/spec.md sections 7.3, 7.6) ---------


def _canonical4(w: list[float]) -> float:
    # Four weights in one block: lanes 0..3, added pairwise: (w0 + w1) + (w2 + w3).
    return (w[0] + w[1]) + (w[2] + w[3])


def _draw4(w: list[float], u: float) -> int:
    total = _canonical4(w)
    cumulative = 0.0
    for i, v in enumerate(w):
        cumulative += v
        if v > 0 and cumulative > u * total:
            return i
    return max(i for i, v in enumerate(w) if v > 0)


def _second_round(w: list[float], total: float, rate: float, q: list[float], spec: bool):
    """A later round's weights: the spec's `w * (a / T)` or the plausible `a * (w / T)`."""
    f = rate / total
    return [
        max(0.0, v * f - qv) if spec else max(0.0, rate * (v / total) - qv)
        for v, qv in zip(w, q, strict=True)
    ]


def _boundary_case(rng, rate: float, updated: bool = False):
    """Rows over four tokens where the second round's two formulas put the last
    draw on opposite sides of a recovery uniform; None if this draw found none."""
    p = rng.dirichlet(np.ones(4))
    q1 = rng.dirichlet(np.ones(4))
    q2 = rng.dirichlet(np.ones(4))
    first = [max(0.0, v * rate - qv) for v, qv in zip(p, q1, strict=True)]
    s = _canonical4(first)
    if not s > 0:
        return None
    # A traversal node below the root takes the rate h(S, a) = S / ((S + 1) - a)
    # after its first removal (section 7.6); the root, and the token rule, keep 1.
    later = s / ((s + 1.0) - rate) if updated else rate
    spec = _second_round(first, s, later, q2, True)
    plain = _second_round(first, s, later, q2, False)
    if spec == plain or not _canonical4(spec) > 0:
        return None
    # A uniform at or next to one of the draw's boundaries (the cumulative weights
    # over the total) under either formula.
    for w in (spec, plain):
        for k in (1, 2, 3):
            edge = sum(w[:k]) / _canonical4(w)
            for r in (edge, np.nextafter(edge, 1.0), np.nextafter(edge, 0.0)):
                if 0 <= r < 1 and _draw4(spec, r) != _draw4(plain, r):
                    return p, q1, q2, float(r), _draw4(spec, r)
    return None


@pytest.mark.parametrize("method", ["token", "traversal"])
def test_later_rounds_scale_by_one_factor_to_the_bit(method) -> None:
    # Root 0 with two children (tokens 0 and 1), both rejected, then the draw from
    # the second round's residual: its weights are P * (1 / S) - q, not P / S - q.
    # The recovery uniform sits between the two formulas' boundaries, so a kernel
    # that divides (or the reference, if it did) draws the other token.
    rng = np.random.default_rng(7)
    found = 0
    for _ in range(4000):
        case = _boundary_case(rng, 1.0)
        if case is None:
            continue
        p, q1, q2, r, expected = case
        target = np.array([[p, p, p]])
        draft = np.array([[q1, q1, q2]])
        ids = np.array([[0, 0, 1]])
        # Rejected for sure: u just below 1 and q(x) > p(x) (checked below).
        if not (q1[0] > p[0]):
            continue
        first = [max(0.0, a - b) for a, b in zip(p, q1, strict=True)]
        if not q2[1] > first[1] / _canonical4(first):
            continue
        kwargs = dict(
            uniforms=np.full((1, 3), np.nextafter(1.0, 0.0)),
            recovery_uniforms=np.array([r]),
            method=method,
        )
        for fn in (specaccept.verify_tree, reference.verify_tree):
            out = fn(ids, np.array([-1, 0, 0]), target, draft, **kwargs)
            assert out.num_accepted[0] == 0
            assert out.output_token_ids[0, 0] == expected, (fn.__module__, p, q1, q2, r)
        found += 1
        if found == 20:
            break
    assert found == 20


@pytest.mark.parametrize("method", ["token", "traversal"])
@pytest.mark.parametrize("children", [2, 3, 4])
@pytest.mark.parametrize("vocab", [4, 300])
@pytest.mark.parametrize("layout", ["contiguous", "strided"])
def test_a_round_whose_factor_overflows_gives_the_reference_tokens(
    method, children, vocab, layout
) -> None:
    # float64 rows whose first residual is one subnormal entry: its total S is
    # about 2e-320, so the next round's factor 1 / S is inf (docs/spec.md
    # section 7.3): 0 * inf is NaN, max(0, NaN) is 0, and the tiny entry becomes
    # inf. The residual buffer is the library's own values, not an input: the
    # tokens must be the reference's, not an error naming target_probs. Every
    # child (token 0) is rejected; with two children the draw lands on the inf
    # entry; with three the last round (summed, not written) reads the inf
    # entry, with four a written round does too, and the residual then sums to
    # 0, so the draw falls back to the target row. At V = 300 the entry sits in
    # the kernels' vector body; strided draft rows take the scalar rounds.
    tiny_at = 2 if vocab == 4 else 40
    p = np.zeros(vocab)
    p[[0, 1, tiny_at]] = [0.5, 0.5, 2e-320]
    q = np.zeros((children, vocab))
    q[:, 0] = 0.75  # q(0) > p(0): rejected at u = 0.9
    q[0, 1] = 0.5  # the first residual: only the entry at tiny_at
    q[1:, 1] = 0.25
    target = np.broadcast_to(p, (1, children + 1, vocab)).copy()
    draft = np.zeros((1, children + 1, vocab))
    draft[0, 1:] = q
    if layout == "strided":
        wide = np.zeros((1, children + 1, 2 * vocab))
        wide[..., ::2] = draft
        draft = wide[..., ::2]
    kwargs = dict(
        uniforms=np.full((1, children + 1), 0.9),
        recovery_uniforms=np.array([0.5]),
        method=method,
    )
    ids = np.zeros((1, children + 1), np.int64)
    parents = np.array([-1] + [0] * children)
    ours = specaccept.verify_tree(ids, parents, target, draft, **kwargs)
    theirs = reference.verify_tree(ids, parents, target, draft, **kwargs)
    assert ours.num_accepted.tolist() == theirs.num_accepted.tolist() == [0]
    expected = tiny_at if children == 2 else 1
    assert ours.output_token_ids[0, 0] == theirs.output_token_ids[0, 0] == expected


@pytest.mark.parametrize("children", [3, 4])
def test_a_nan_probability_over_a_zero_draft_probability_rejects(children) -> None:
    # As above (V = 4, the first residual one subnormal entry at 2), with the
    # third child drafting token 2, which its draft row gives 0: after the
    # second round that entry is inf and the residual's total inf, so p(x) =
    # inf / inf is NaN, and u < NaN / 0 is false in float64 (docs/spec.md
    # sections 0.2, 1.1): rejected. The reference must not raise Python's
    # ZeroDivisionError; both give the target row's draw (token 1). (Traversal
    # gives a child with q(x) = 0 the rate 1, section 7.6: no division.)
    p = np.array([0.5, 0.5, 2e-320, 0.0])
    draft = np.zeros((1, children + 1, 4))
    draft[0, 1:] = [0.75, 0.25, 0.0, 0.0]
    draft[0, 1, 1] = 0.5
    ids = np.zeros((1, children + 1), np.int64)
    ids[0, 3] = 2
    kwargs = dict(
        uniforms=np.full((1, children + 1), 0.9),
        recovery_uniforms=np.array([0.5]),
    )
    parents = np.array([-1] + [0] * children)
    target = np.broadcast_to(p, (1, children + 1, 4))
    for fn in (specaccept.verify_tree, reference.verify_tree):
        out = fn(ids, parents, target, draft, **kwargs)
        assert out.num_accepted.tolist() == [0], fn.__module__
        assert out.output_token_ids[0, 0] == 1, fn.__module__


def test_traversal_scales_a_later_round_by_its_rate_over_its_total() -> None:
    # Root -> v -> {c1, c2}: v's rate a < 1; c1 and c2 rejected; v accepted
    # (u_v = 0), its token drawn from w_v * (a / T) - q_c2.
    rng = np.random.default_rng(11)
    found = 0
    for _ in range(20000):
        root = rng.dirichlet(np.ones(4))
        qv = rng.dirichlet(np.ones(4))
        if not qv[2] > root[2]:
            continue
        rate = root[2] / qv[2]  # next_rho(1, p(x_v), q(x_v)), below 1
        case = _boundary_case(rng, rate, updated=True)
        if case is None:
            continue
        p, q1, q2, r, expected = case
        target = np.array([[root, p, p, p]])
        draft = np.array([[qv, qv, q1, q2]])
        ids = np.array([[0, 2, 0, 1]])
        # Rejections for sure: each leaf's rate is below 1 and its uniform just below 1.
        s1 = _canonical4([max(0.0, v * rate - w) for v, w in zip(p, q1, strict=True)])
        if not (rate * p[0] < q1[0] and s1 > 0):
            continue
        out_args = dict(
            uniforms=np.array([[0.0, 0.0, np.nextafter(1.0, 0.0), np.nextafter(1.0, 0.0)]]),
            recovery_uniforms=np.array([r]),
            method="traversal",
        )
        native = specaccept.verify_tree(ids, np.array([-1, 0, 1, 1]), target, draft, **out_args)
        ref = reference.verify_tree(ids, np.array([-1, 0, 1, 1]), target, draft, **out_args)
        if native.num_accepted[0] != 1:
            continue  # a leaf was accepted after all (its second-round rate reached 1)
        assert native.output_token_ids[0].tolist() == [2, expected, -1]
        assert ref.output_token_ids[0].tolist() == [2, expected, -1]
        found += 1
        if found == 10:
            break
    assert found == 10


# --- errors="isolate" and out= (docs/spec.md section 7.5) --------------------------------


def _spoil(case: dict, b: int, how: str) -> None:
    """Makes row ``b`` bad in a way its verification reads (whatever the draws)."""
    if how == "parents":
        case["parent_ids"][b, 0] = 0  # the root's parent must be -1
    elif how == "recovery":
        case["recovery_uniforms"][b] = 2.0
    elif how == "root row":
        case["target_probs"][b, 0, :] = np.nan  # every row reads its root row
        case["greedy"][b] = True


def _isolation_case(seed: int, method: str) -> dict:
    rng = np.random.default_rng(seed)
    batch, nodes, vocab = 6, 7, 33
    parents = np.array([random_tree(rng, nodes) for _ in range(batch)], dtype=np.int64)
    p = random_rows(rng, (batch, nodes, vocab), np.float32)
    q = random_rows(rng, (batch, nodes, vocab), np.float32)
    tokens = np.where(
        rng.random((batch, nodes)) < 0.5, p.argmax(-1), rng.integers(0, vocab, (batch, nodes))
    )
    return dict(
        node_token_ids=tokens,
        parent_ids=parents,
        target_probs=p,
        draft_probs=q,
        uniforms=rng.random((batch, nodes)),
        recovery_uniforms=rng.random(batch),
        greedy=rng.random(batch) < 0.3,
        method=method,
    )


@pytest.mark.parametrize("method", ["token", "traversal"])
@pytest.mark.parametrize("how", ["parents", "recovery", "root row"])
@pytest.mark.parametrize("threads", [1, 2])
def test_isolated_rows_leave_the_others_as_a_batch_without_them(method, how, threads) -> None:
    before = specaccept.get_num_threads()
    specaccept.set_num_threads(threads)
    try:
        for seed in range(8):
            case = _isolation_case(seed, method)
            bad = [1, 4]
            for b in bad:
                _spoil(case, b, how)
            if how == "recovery":
                case["greedy"][bad] = False  # a greedy row reads no uniform
            good = [b for b in range(6) if b not in bad]
            alone = specaccept.verify_tree(
                **{
                    k: (v[good] if isinstance(v, np.ndarray) and v.ndim and k != "method" else v)
                    for k, v in case.items()
                }
            )
            for fn in (specaccept.verify_tree, reference.verify_tree):
                with pytest.raises(InputError) as raised:
                    fn(**case)
                assert raised.value.row == 1
                result = fn(**case, errors="isolate")
                assert sorted(result.errors) == bad
                assert all(result.errors[b].row == b for b in bad)
                assert str(result.errors[1]) == str(raised.value)
                assert (result.output_token_ids[bad] == -1).all()
                assert (result.accepted_node_ids[bad] == -1).all()
                assert (result.num_emitted[bad] == 0).all()
                # The good rows: the batch without the bad ones, token for token.
                width = alone.accepted_node_ids.shape[1]
                if how == "parents":
                    assert result.accepted_node_ids.shape[1] == width  # D over the good rows
                assert result.output_token_ids[good][:, : width + 1].tolist() == (
                    alone.output_token_ids.tolist()
                )
                assert result.accepted_node_ids[good][:, :width].tolist() == (
                    alone.accepted_node_ids.tolist()
                )
                assert result.num_accepted[good].tolist() == alone.num_accepted.tolist()
    finally:
        specaccept.set_num_threads(before)


def test_shared_parent_links_that_are_bad_fail_the_call_even_when_isolating() -> None:
    case = _isolation_case(0, "token")
    case["parent_ids"] = np.array([0, 0, 0, 1, 1, 2, 2])  # the root's parent must be -1
    for fn in (specaccept.verify_tree, reference.verify_tree):
        with pytest.raises(InputError, match=r"parent_ids\[0, 0\]"):
            fn(**case, errors="isolate")


@pytest.mark.parametrize("method", ["token", "traversal"])
@pytest.mark.parametrize("form", ["result", "tuple", "no emitted"])
def test_tree_results_land_in_wider_buffers(method, form) -> None:
    case = _isolation_case(3, method)
    plain = specaccept.verify_tree(**case)
    depth = plain.accepted_node_ids.shape[1]
    width = depth + 3  # a serving loop's fixed width, past this batch's D
    for fn in (specaccept.verify_tree, reference.verify_tree):
        buffers = (
            np.full((6, width + 1), 99, np.int64),
            np.full(6, 99, np.int64),
            np.full(6, 99, np.int64),
            np.full((6, width), 99, np.int64),
        )
        if form == "result":
            out = specaccept.TreeVerification(*buffers)
        elif form == "tuple":
            out = buffers
        else:
            out = (buffers[0], buffers[1], None, buffers[3])
        result = fn(**case, out=out)
        assert result.output_token_ids is buffers[0]
        assert result.accepted_node_ids is buffers[3]
        assert result.num_accepted is buffers[1]
        assert (result.num_emitted is buffers[2]) == (form != "no emitted")
        assert buffers[0][:, : depth + 1].tolist() == plain.output_token_ids.tolist()
        assert (buffers[0][:, depth + 1 :] == -1).all()
        assert buffers[3][:, :depth].tolist() == plain.accepted_node_ids.tolist()
        assert (buffers[3][:, depth:] == -1).all()
        assert result.num_emitted.tolist() == plain.num_emitted.tolist()


@pytest.mark.parametrize(
    ("change", "error", "fragment"),
    [
        ("narrow", InputError, "fewer than the deepest path"),
        ("widths differ", InputError, r"\[B, W\+1\]"),
        ("rows", InputError, "B = 6"),
        ("int32", TypeError, "int64"),
        ("aliases target", InputError, "shares memory with"),
        ("aliases itself", InputError, "shares memory with out.output_token_ids"),
        ("read-only", InputError, "read-only"),
        ("three arrays", TypeError, "TreeVerification or a tuple"),
    ],
)
def test_bad_tree_buffers_are_refused_naming_them(change, error, fragment) -> None:
    case = _isolation_case(5, "token")
    depth = specaccept.verify_tree(**case).accepted_node_ids.shape[1]
    ids = np.zeros((6, depth + 1), np.int64)
    nodes = np.zeros((6, depth), np.int64)
    accepted, emitted = np.zeros(6, np.int64), np.zeros(6, np.int64)
    out: tuple = (ids, accepted, emitted, nodes)
    if change == "narrow":
        out = (ids[:, :depth], accepted, emitted, nodes[:, : depth - 1])
    elif change == "widths differ":
        out = (ids, accepted, emitted, np.zeros((6, depth + 1), np.int64))
    elif change == "rows":
        out = (ids[:5], accepted, emitted, nodes)
    elif change == "int32":
        out = (ids.astype(np.int32), accepted, emitted, nodes)
    elif change == "aliases target":
        case["node_token_ids"] = case["node_token_ids"].astype(np.int64)
        out = (ids, accepted, emitted, case["node_token_ids"][:, :depth])
    elif change == "aliases itself":
        out = (ids, accepted, emitted, ids[:, :depth])
    elif change == "read-only":
        nodes.flags.writeable = False
    else:
        out = (ids, accepted, emitted)
    snapshot = {k: np.copy(v) for k, v in case.items() if isinstance(v, np.ndarray)}
    for fn in (specaccept.verify_tree, reference.verify_tree):
        with pytest.raises(error, match=fragment):
            fn(**case, out=out)
    for k, v in snapshot.items():
        assert np.array_equal(case[k], v, equal_nan=True), k
