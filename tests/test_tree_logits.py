"""Trees verified from logits (docs/spec.md section 7.7): ``verify_tree_logits`` is
``verify_tree`` on the transformed rows, reads only the rows its walk needs, matches
the reference, and its output follows the transformed target."""

from __future__ import annotations

import numpy as np
import pytest
import specaccept
from conftest import FLOAT_DTYPES
from scipy import stats
from specaccept import InputError, reference

PARENTS = np.array([-1, 0, 0, 1, 1, 2, 3])  # root -> {1, 2}; 1 -> {3, 4}; 2 -> 5; 3 -> 6


def logits_case(seed: int, batch: int = 5, vocab: int = 40) -> dict:
    rng = np.random.default_rng(seed)
    nodes = len(PARENTS)
    target = rng.normal(size=(batch, nodes, vocab)) * 2
    draft = target + rng.normal(size=(batch, nodes, vocab))
    if seed % 3 == 0:
        target[:, :, :3] = -np.inf  # masked tokens
    tokens = np.where(
        rng.random((batch, nodes)) < 0.5,
        target.argmax(-1),
        rng.integers(0, vocab, (batch, nodes)),
    )
    return dict(
        node_token_ids=tokens,
        parent_ids=PARENTS,
        target_logits=target.astype(FLOAT_DTYPES[seed % 3]),
        draft_logits=None if seed % 4 == 3 else draft.astype(FLOAT_DTYPES[(seed + 1) % 3]),
        temperature=rng.choice([0.0, 0.6, 1.0, 1.7], size=batch),
        top_k=rng.choice([0, 1, 5, 200], size=batch),
        top_p=rng.choice([1.0, 0.9, 0.5], size=batch),
        uniforms=rng.random((batch, nodes)),
        recovery_uniforms=rng.random(batch),
    )


def outcome(fn, **kwargs):
    try:
        r = fn(**kwargs)
    except (TypeError, ValueError) as e:
        return (type(e).__name__, str(e))
    return (r.output_token_ids.tolist(), r.accepted_node_ids.tolist(), r.num_emitted.tolist())


@pytest.mark.parametrize("method", ["token", "traversal"])
@pytest.mark.parametrize("block", range(3))
def test_matches_the_reference(method, block) -> None:
    accepted = 0
    for seed in range(block * 40, (block + 1) * 40):
        case = logits_case(seed)
        if seed % 7 == 0:
            case["target_logits"][2, 0, 5] = np.nan  # row 2's root row is read: an error
        native = outcome(specaccept.verify_tree_logits, **case, method=method)
        oracle = outcome(reference.verify_tree_logits, **case, method=method)
        assert native == oracle, f"seed {seed}"
        if isinstance(native[0], list):
            accepted += sum(len([n for n in row if n >= 0]) for row in native[1])
    assert accepted > 0


def _transformed(logits: np.ndarray, case: dict) -> np.ndarray:
    """Every row through the reference's transform, with the case's parameters."""
    batch, nodes, _ = logits.shape
    return np.array(
        [
            [
                reference.transform_logits(
                    logits[b, n],
                    float(case["temperature"][b]),
                    int(case["top_k"][b]),
                    float(case["top_p"][b]),
                )
                for n in range(nodes)
            ]
            for b in range(batch)
        ]
    )


@pytest.mark.parametrize("method", ["token", "traversal"])
def test_it_is_verify_tree_on_the_transformed_rows(method) -> None:
    # The same uniforms on verify_tree over the reference's transform (float64):
    # the same tokens (they could differ only where a draw lies within rounding
    # of a boundary).
    for seed in range(40):
        case = logits_case(seed)
        case["temperature"] = np.where(case["temperature"] == 0, 1.0, case["temperature"])

        p = _transformed(case["target_logits"], case)
        q = None if case["draft_logits"] is None else _transformed(case["draft_logits"], case)
        want = specaccept.verify_tree(
            case["node_token_ids"],
            PARENTS,
            p,
            q,
            uniforms=case["uniforms"],
            recovery_uniforms=case["recovery_uniforms"],
            method=method,
        )
        got = specaccept.verify_tree_logits(**case, method=method)
        assert got.output_token_ids.tolist() == want.output_token_ids.tolist(), seed
        assert got.accepted_node_ids.tolist() == want.accepted_node_ids.tolist(), seed


def test_temperature_zero_is_the_greedy_tree_on_the_raw_logits() -> None:
    case = logits_case(4)
    case["temperature"] = np.zeros(5)
    logits = case["target_logits"].astype(np.float64)
    got = specaccept.verify_tree_logits(**case)
    want = specaccept.verify_tree(
        case["node_token_ids"],
        PARENTS,
        np.exp(logits - logits.max(-1, keepdims=True)),  # the same argmax, as weights
        greedy=True,
    )
    assert got.output_token_ids.tolist() == want.output_token_ids.tolist()


@pytest.mark.parametrize("filters", [True, False])
def test_a_single_path_is_verify_logits(filters) -> None:
    # Without filters (float32 rows) each node's only child is decided as the
    # chain decides its position: by the screens and the certified passes.
    rng = np.random.default_rng(3)
    batch, k, vocab = 64, 4, 30
    target = rng.normal(size=(batch, k + 1, vocab)).astype(np.float32)
    draft = target[:, :k] + (rng.normal(size=(batch, k, vocab)) * 0.5).astype(np.float32)
    ids = rng.integers(0, vocab, (batch, k))
    u, ru = rng.random((batch, k)), rng.random(batch)
    params = dict(temperature=0.8, top_k=10 if filters else 0, top_p=0.95 if filters else 1.0)
    chain = specaccept.verify_logits(ids, target, draft, uniforms=u, recovery_uniforms=ru, **params)
    nodes = np.concatenate([np.zeros((batch, 1), np.int64), ids], axis=1)
    # Row c of a tree's draft logits is the row child c was drawn from.
    tree_draft = np.concatenate([draft[:, :1], draft], axis=1)
    tree = specaccept.verify_tree_logits(
        nodes,
        np.arange(-1, k),
        target,
        tree_draft,
        uniforms=np.concatenate([np.zeros((batch, 1)), u], axis=1),
        recovery_uniforms=ru,
        **params,
    )
    assert tree.output_token_ids.tolist() == chain.output_token_ids.tolist()
    assert 0 < chain.num_accepted.sum() < batch * k
    if not filters:
        # Both took the looks: the float64 path, forced by top_k = V, agrees.
        exact = specaccept.verify_tree_logits(
            nodes,
            np.arange(-1, k),
            target,
            tree_draft,
            uniforms=np.concatenate([np.zeros((batch, 1)), u], axis=1),
            recovery_uniforms=ru,
            temperature=0.8,
            top_k=vocab,
        )
        assert exact.output_token_ids.tolist() == tree.output_token_ids.tolist()


def test_only_the_rows_a_walk_reads_are_checked() -> None:
    # A greedy walk root -> 1 -> 3 reads the target rows 0, 1, 3 and (3 has a
    # child, 6, whose token is not the argmax) ... and never rows 2, 4, 5 or 6.
    vocab = 5
    target = np.full((1, 7, vocab), -1.0)
    tokens = np.array([[0, 2, 1, 3, 0, 0, 4]])
    for node, best in ((0, 2), (1, 3), (3, 0)):
        target[0, node, best] = 1.0
    for unread in (2, 4, 5, 6):
        target[0, unread, 1] = np.nan
    r = specaccept.verify_tree_logits(tokens, PARENTS, target, temperature=0.0)
    assert r.output_token_ids.tolist() == [[2, 3, 0, -1]]  # D = 3
    sampled = specaccept.verify_tree_logits(
        tokens, PARENTS, target, temperature=1.0, top_k=1, rng=0
    )
    assert sampled.output_token_ids.tolist() == [[2, 3, 0, -1]]  # top-1: the greedy path
    # A NaN in a row the walk reads is named.
    target[0, 3, 4] = np.nan
    for fn in (specaccept.verify_tree_logits, reference.verify_tree_logits):
        with pytest.raises(InputError, match=r"target_logits\[0, 3, 4\] = nan") as raised:
            fn(tokens, PARENTS, target, temperature=1.0, top_k=1, rng=0)
        assert raised.value.row == 0


def _as_the_exact_pass(kwargs: dict, vocab: int, far: np.ndarray | None = None):
    """``verify_tree_logits(**kwargs)`` (no filters: the looks apply) checked against
    the float64 path, forced by ``top_k = V`` (it keeps every token; filtered rows
    skip the looks), and on the rows ``far`` from every boundary against the
    reference (which differs only within about 1e-9). Returns the result."""
    looked = specaccept.verify_tree_logits(**kwargs)
    exact = specaccept.verify_tree_logits(**kwargs, top_k=vocab)
    np.testing.assert_array_equal(looked.output_token_ids, exact.output_token_ids)
    np.testing.assert_array_equal(looked.accepted_node_ids, exact.accepted_node_ids)
    if far is not None:
        expected = reference.verify_tree_logits(**kwargs)
        np.testing.assert_array_equal(looked.output_token_ids[far], expected.output_token_ids[far])
    return looked


# Relative distances from a boundary: rows cycle through them, both sides of each.
DISTANCES = np.array([1e-2, 1e-4, 1e-6, 1e-8, 1e-10, 1e-12, 0.0])


def _at_distance(value: float, b: int, period: int) -> float:
    """``value`` moved by row ``b``'s relative distance: rows take each of ``DISTANCES``
    for ``period`` rows, the first half of them below ``value``, the rest above."""
    sign = 1.0 if (b // (period // 2)) % 2 else -1.0
    return value * (1 + sign * DISTANCES[(b // period) % len(DISTANCES)])


def _far(batch: int, period: int) -> np.ndarray:
    """The rows ``_at_distance`` puts at least 1e-8 from their boundary."""
    return DISTANCES[(np.arange(batch) // period) % len(DISTANCES)] >= 1e-8


def _near_an_edge(rng, residual: np.ndarray, b: int, period: int) -> float:
    """A recovery uniform at row ``b``'s distance from a boundary of the cumulative
    sums of ``residual`` (a random one with weight after it)."""
    cumulative = np.cumsum(residual) / residual.sum()
    edge = cumulative[rng.choice(np.flatnonzero(residual[:-1] > 0))]
    return min(_at_distance(edge, b, period), 0.999)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("draft", ["rows", "prefix", "one-hot"])
def test_the_screens_decide_a_first_child_as_the_exact_pass_next_to_the_boundary(
    dtype, draft
) -> None:
    # Without filters a node's first child may be accepted from the screens of the
    # two rows (docs/spec.md section 7.7), neither row transformed. Put each first
    # child's u at relative distances 1e-2 .. 1e-12 from p/q (either side) and at
    # it: the tokens must equal the exact pass's, forced by top_k = V (it keeps
    # every token; filtered rows skip the screens). "prefix": the draft rows hold
    # nearly all their mass in their first 2048 logits, so the first chunk alone
    # bounds q(x) (src/logits/screen.rs, draft_prefix_accepts).
    rng = np.random.default_rng(12)
    batch, vocab = 48, 3000
    nodes = len(PARENTS)
    target = (rng.normal(size=(batch, nodes, vocab)) * 2).astype(dtype)
    noise = rng.normal(size=(batch, nodes, vocab)) * 0.5
    drafted = target[:, np.maximum(PARENTS, 0)].astype(np.float64) + noise
    if draft == "prefix":
        drafted[:, :, :2048] += 8.0
        target[:, :, :2048] += dtype(8.0)
    tokens = np.argmax(drafted, axis=-1)
    draft_logits = None if draft == "one-hot" else drafted.astype(dtype)
    temperature = rng.choice([0.7, 1.3], size=batch)
    u = rng.random((batch, nodes))
    distances = np.array([1e-2, 1e-4, 1e-5, 1e-6, 1e-8, 1e-10, 1e-12, 0.0])
    first_children = [n for n in range(1, nodes) if n == min(np.flatnonzero(PARENTS == PARENTS[n]))]
    assert first_children == [1, 3, 5, 6]
    for b in range(batch):
        for i, c in enumerate(first_children):
            law = reference.transform_logits(target[b, PARENTS[c]], temperature[b], 0, 1.0)
            q = 1.0
            if draft_logits is not None:
                q = reference.transform_logits(draft_logits[b, c], temperature[b], 0, 1.0)[
                    tokens[b, c]
                ]
            sign = -1.0 if (b >> i) & 1 else 1.0  # below p/q (accepted) on bit i of b
            ratio = law[tokens[b, c]] / q
            u[b, c] = min(ratio * (1 + sign * rng.choice(distances)), 0.999)
    kwargs = dict(
        node_token_ids=tokens,
        parent_ids=PARENTS,
        target_logits=target,
        draft_logits=draft_logits,
        temperature=temperature,
        uniforms=u,
        recovery_uniforms=rng.random(batch),
    )
    screened = _as_the_exact_pass(kwargs, vocab)
    accepted = (screened.accepted_node_ids[:, 0] == 1).sum()
    assert 0 < accepted < batch, "the root's first child is both accepted and rejected"
    assert (screened.num_accepted >= 2).any(), "some walks go past a second first child"


@pytest.mark.parametrize("one_hot", [False, True])
def test_top_k_candidates_decide_a_first_child_as_the_reference_next_to_the_boundary(
    one_hot,
) -> None:
    # With top-k a node's first child is decided on p(x) and q(x) computed from
    # top-k's candidates (docs/spec.md section 7.7), the rows not transformed.
    # u sits at relative distances 1e-2 .. 1e-8 from p/q, either side: the
    # reference's tokens (which differ only within about 1e-9).
    rng = np.random.default_rng(14)
    batch, vocab, top_k = 48, 3000, 10  # top-k applies up to V / 256 = 12 blocks
    nodes = len(PARENTS)
    target = (rng.normal(size=(batch, nodes, vocab)) * 2).astype(np.float32)
    parent_rows = target[:, np.maximum(PARENTS, 0)]  # child c drafts the parent's next token
    drafted = parent_rows + (rng.normal(size=(batch, nodes, vocab)) * 0.3).astype(np.float32)
    tokens = np.argsort(-drafted, axis=-1)[:, :, 0]  # in both top-k sets, mostly
    draft_logits = None if one_hot else drafted
    u = rng.random((batch, nodes))
    distances = np.array([1e-2, 1e-4, 1e-6, 1e-8])
    for b in range(batch):
        for i, c in enumerate([1, 3, 5, 6]):  # the first children
            law = reference.transform_logits(target[b, PARENTS[c]], 0.9, top_k, 1.0)
            q = 1.0
            if draft_logits is not None:
                q = reference.transform_logits(draft_logits[b, c], 0.9, top_k, 1.0)[tokens[b, c]]
            sign = -1.0 if (b >> i) & 1 else 1.0
            u[b, c] = min(law[tokens[b, c]] / q * (1 + sign * rng.choice(distances)), 0.999)
    kwargs = dict(
        node_token_ids=tokens,
        parent_ids=PARENTS,
        target_logits=target,
        draft_logits=draft_logits,
        temperature=0.9,
        top_k=top_k,
        uniforms=u,
        recovery_uniforms=rng.random(batch),
    )
    got = specaccept.verify_tree_logits(**kwargs)
    want = reference.verify_tree_logits(**kwargs)
    np.testing.assert_array_equal(got.output_token_ids, want.output_token_ids)
    accepted = (got.accepted_node_ids[:, 0] == 1).sum()
    assert 0 < accepted < batch, "the root's first child is both accepted and rejected"


@pytest.mark.parametrize("method", ["token", "traversal"])
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_the_certified_bonus_draw_is_the_exact_pass_draw_next_to_a_boundary(dtype, method) -> None:
    # Without filters a leaf's bonus token may be drawn by the certified pass
    # (docs/spec.md section 7.7), its row not transformed. Every child is accepted
    # (u = 0, every p > 0), so each walk ends at leaf 6 after 1 and 3; the recovery
    # uniform sits at a relative distance 1e-2 .. 1e-12 (either side) from a
    # boundary of the leaf row's cumulative probabilities, or on it. The tokens must
    # equal the exact pass's, forced by top_k = V.
    rng = np.random.default_rng(13)
    batch, vocab = 64, 3000
    nodes = len(PARENTS)
    target = (rng.normal(size=(batch, nodes, vocab)) * 2).astype(dtype)
    tokens = rng.integers(0, vocab, (batch, nodes))
    temperature = rng.choice([0.7, 1.3], size=batch)
    recovery = np.empty(batch)
    for b in range(batch):
        law = np.asarray(reference.transform_logits(target[b, 6], temperature[b], 0, 1.0))
        cumulative = np.cumsum(law) / law.sum()
        edge = cumulative[rng.integers(0, vocab - 1)]
        recovery[b] = min(_at_distance(edge, b, 2), 0.999)
    kwargs = dict(
        node_token_ids=tokens,
        parent_ids=PARENTS,
        target_logits=target,
        temperature=temperature,
        uniforms=np.zeros((batch, nodes)),
        recovery_uniforms=recovery,
        method=method,
    )
    drawn = _as_the_exact_pass(kwargs, vocab, _far(batch, 2))
    assert (drawn.accepted_node_ids == [1, 3, 6]).all()


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("one_hot", [False, True])
def test_an_only_child_s_residual_draw_is_the_exact_pass_draw_next_to_a_boundary(
    dtype, one_hot
) -> None:
    # Without filters a node's only child is the chain's position (docs/spec.md
    # section 7.7): accepted or rejected, and the residual max(0, p - q) drawn, by
    # the certified passes, neither row transformed. A chain root -> 1 -> 2: even
    # rows reject node 1, odd rows accept it and reject node 2 (the drafted token
    # has q(x) > p(x) and u just under 1). The recovery uniform sits at a
    # relative distance 1e-2 .. 1e-12 (either side) from a boundary of the
    # residual's cumulative sums, or on it. The tokens must equal the exact
    # pass's, forced by top_k = V.
    rng = np.random.default_rng(15)
    batch, vocab = 64, 3000
    parents = np.array([-1, 0, 1])
    target = (rng.normal(size=(batch, 3, vocab)) * 2).astype(dtype)
    drafted = (target.astype(np.float64) + rng.normal(size=(batch, 3, vocab))).astype(dtype)
    drafted[:, 0] = drafted[:, 1]  # row c scores child c's proposal
    temperature = rng.choice([0.7, 1.3], size=batch)
    tokens = np.zeros((batch, 3), np.int64)
    u = np.zeros((batch, 3))
    recovery = np.empty(batch)
    for b in range(batch):
        rejected = 1 + b % 2
        node = parents[rejected]
        p = np.asarray(reference.transform_logits(target[b, node], temperature[b], 0, 1.0))
        if one_hot:
            x = int(rng.integers(0, vocab))
            q = np.zeros(vocab)
            q[x] = 1.0
        else:
            q = np.asarray(reference.transform_logits(drafted[b, rejected], temperature[b], 0, 1.0))
            x = int(np.argmax(q - p))
        tokens[b, rejected] = x
        if rejected == 2:
            tokens[b, 1] = int(np.argmax(target[b, 0]))  # accepted with u = 0
        u[b, rejected] = np.nextafter(1.0, 0.0)
        recovery[b] = _near_an_edge(rng, np.maximum(p - q, 0.0), b, 4)
    kwargs = dict(
        node_token_ids=tokens,
        parent_ids=parents,
        target_logits=target,
        draft_logits=None if one_hot else drafted,
        temperature=temperature,
        uniforms=u,
        recovery_uniforms=recovery,
    )
    drawn = _as_the_exact_pass(kwargs, vocab, _far(batch, 4))
    assert drawn.num_accepted.tolist() == [b % 2 for b in range(batch)]


def _agree_on_random_trees(rng, shape, method: str, cases: int) -> None:
    """``cases`` random batches of trees (``shape(case)``: the parent links), each
    checked against the exact pass: drafters close to, far from, unrelated to or
    equal to the target (draft row ``c`` near its parent's target row), or one-hot;
    masked tokens; drafted tokens sampled from the draft rows or uniform; uniforms
    random, scaled down (deeper acceptances) or all 0, 0.5 or just under 1; float16
    or float32 logits (the looks apply)."""
    for case in range(cases):
        vocab = int(rng.choice([5, 40, 300, 3000]))
        parents = shape(case)
        batch, nodes = 8, len(parents)
        target = rng.normal(size=(batch, nodes, vocab)) * rng.choice([0.5, 2.0, 5.0])
        above = target[:, np.maximum(parents, 0)]
        drafted = [
            above + rng.normal(size=target.shape) * 0.3,
            above + rng.normal(size=target.shape) * 2.0,
            rng.normal(size=target.shape) * 2.0,
            above.copy(),
        ][case % 4]
        if case % 5 == 0:
            target[:, :, : max(1, vocab // 3)] = -np.inf
        temperature = float(rng.choice([0.3, 0.8, 2.0]))
        tokens = rng.integers(0, vocab, (batch, nodes))
        if case % 2 == 0:
            z = drafted / temperature
            q = np.exp(z - z.max(-1, keepdims=True))
            cdf = np.cumsum(q / q.sum(-1, keepdims=True), -1)
            tokens = (cdf < rng.random((batch, nodes, 1))).sum(-1).clip(0, vocab - 1)
        u = rng.random((batch, nodes)) * rng.choice([1.0, 0.1])
        if case % 3 == 0:
            u[:] = rng.choice([0.0, 0.5, np.nextafter(1.0, 0.0)])
        dtype = FLOAT_DTYPES[case % 2]
        kwargs = dict(
            node_token_ids=tokens,
            parent_ids=parents,
            target_logits=target.astype(dtype),
            draft_logits=None if case % 3 == 2 else drafted.astype(dtype),  # one-hot
            temperature=temperature,
            uniforms=u,
            recovery_uniforms=rng.random(batch),
            method=method,
        )
        _as_the_exact_pass(kwargs, vocab)


@pytest.mark.parametrize("block", range(3))
def test_children_tried_in_turn_agree_with_the_exact_pass_on_random_trees(block) -> None:
    # The look at a node's children in turn (docs/spec.md section 7.7) on random
    # trees, 2 to 4 children at the root, each with a child, and random inputs
    # (_agree_on_random_trees): the tokens must equal the exact pass's, forced by
    # top_k = V.
    rng = np.random.default_rng(40 + block)

    def shape(_case: int) -> np.ndarray:
        width = int(rng.integers(2, 5))
        return np.array([-1] + [0] * width + list(range(1, width + 1)))

    _agree_on_random_trees(rng, shape, "token", 20)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("one_hot", [False, True])
@pytest.mark.parametrize("near", ["second child", "draw"])
def test_children_tried_in_turn_are_decided_as_the_exact_pass_next_to_a_boundary(
    dtype, one_hot, near
) -> None:
    # Without filters a node's children tried in turn are decided from the certified
    # passes of the target row and each child's draft row (none with one-hot
    # drafts), the rounds' residuals on their kept terms (docs/spec.md section 7.7),
    # no row transformed. The root has three children; each drafted token has
    # q(x) > p(x) in its round. "second child": the first is rejected (u just under 1) and the
    # second's u sits at a relative distance 1e-2 .. 1e-12 (either side) from its
    # p/q, or on it. "draw": all three are rejected and the recovery uniform sits
    # at those distances from a boundary of the last residual's cumulative sums.
    # The tokens must equal the exact pass's, forced by top_k = V.
    rng = np.random.default_rng(17)
    batch, vocab = 64, 3000
    parents = np.array([-1, 0, 0, 0])
    target = (rng.normal(size=(batch, 4, vocab)) * 2).astype(dtype)
    drafted = target[:, [0]].astype(np.float64) + rng.normal(size=(batch, 4, vocab))
    drafted = drafted.astype(dtype)
    temperature = rng.choice([0.7, 1.3], size=batch)
    tokens = np.zeros((batch, 4), np.int64)
    u = np.full((batch, 4), np.nextafter(1.0, 0.0))
    recovery = rng.random(batch)
    for b in range(batch):
        residual = np.asarray(reference.transform_logits(target[b, 0], temperature[b], 0, 1.0))
        for c in (1, 2, 3):
            p = residual / residual.sum()
            if one_hot:
                x = int(rng.choice(np.flatnonzero(p > 0)))
                q = np.zeros(vocab)
                q[x] = 1.0
            else:
                q = np.asarray(reference.transform_logits(drafted[b, c], temperature[b], 0, 1.0))
                x = int(np.argmax(q - p))
            tokens[b, c] = x
            if near == "second child" and c == 2:
                u[b, c] = _at_distance(p[x] / q[x], b, 4)
                break
            residual = np.maximum(p - q, 0.0)
        if near == "draw":
            recovery[b] = _near_an_edge(rng, residual, b, 4)
    kwargs = dict(
        node_token_ids=tokens,
        parent_ids=parents,
        target_logits=target,
        draft_logits=None if one_hot else drafted,
        temperature=temperature,
        uniforms=u,
        recovery_uniforms=recovery,
    )
    verified = _as_the_exact_pass(kwargs, vocab, _far(batch, 4))
    if near == "draw":
        assert verified.num_accepted.tolist() == [0] * batch
    else:
        # Both sides of the second child's rate are represented.
        accepted = verified.accepted_node_ids[:, 0]
        assert {-1, 2} <= set(accepted.tolist())


# Tree shapes for traversal's walk: 3 x 4 (root -> 1, 2, 3; each with four
# leaves), three chains of four, a binary tree of depth 3, and PARENTS.
WALK_SHAPES = [
    np.array([-1, 0, 0, 0] + [1 + (n - 4) // 4 for n in range(4, 16)]),
    np.array([-1, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9]),
    np.array([-1] + [(n - 1) // 2 for n in range(1, 15)]),
    PARENTS,
]


@pytest.mark.parametrize("block", range(3))
def test_traversal_s_walk_agrees_with_the_exact_pass_on_random_trees(block) -> None:
    # Without filters traversal's whole walk may be decided from the certified
    # passes (docs/spec.md section 7.7). Trees of each of WALK_SHAPES, random inputs
    # (_agree_on_random_trees): the tokens must equal the exact pass's, forced by
    # top_k = V.
    rng = np.random.default_rng(70 + block)
    _agree_on_random_trees(rng, lambda case: WALK_SHAPES[case % len(WALK_SHAPES)], "traversal", 24)


def _exact_outcomes(kwargs: dict, vocab: int) -> np.ndarray:
    """Each row's outcome on the float64 path (``top_k = V``): its accepted nodes
    and emitted tokens, one row of integers."""
    exact = specaccept.verify_tree_logits(**kwargs, top_k=vocab)
    return np.concatenate([exact.accepted_node_ids, exact.output_token_ids], axis=1)


def _boundary(kwargs: dict, vocab: int, place, high: np.ndarray) -> tuple:
    """Per row, where the float64 path's outcome changes as a uniform moves from 0
    to ``high``: ``place(kwargs, values)`` writes the uniform of each row. Bisects
    to the smallest float64 value with ``high``'s outcome. Returns the boundaries,
    and which rows have one (the outcome at 0 differs from that at ``high``)."""
    low = np.zeros_like(high)
    place(kwargs, low)
    at_low = _exact_outcomes(kwargs, vocab)
    place(kwargs, high)
    changes = (_exact_outcomes(kwargs, vocab) != at_low).any(axis=1)
    high = high.copy()
    while True:
        middle = low + (high - low) / 2
        open_ = (middle > low) & (middle < high)
        if not open_.any():
            return high, changes
        place(kwargs, middle)
        same = (_exact_outcomes(kwargs, vocab) == at_low).all(axis=1)
        low = np.where(open_ & same, middle, low)
        high = np.where(open_ & ~same, middle, high)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("one_hot", [False, True])
@pytest.mark.parametrize("near", ["later leaf", "parent", "parent's draw", "root's draw"])
def test_traversal_s_walk_is_decided_as_the_exact_pass_next_to_a_boundary(
    dtype, one_hot, near
) -> None:
    # The 3 x 4 tree (root -> 1, 2, 3; node 1 -> 4, 5, 6, 7), drafts near the
    # parent's target row, tokens sampled from them, every uniform just under 1
    # (everything rejected, every round made) but the one moved. Each row's
    # boundary of the float64 path is found by bisection on it (the exact pass,
    # forced by top_k = V); the uniform is then put at relative distances 1e-2 ..
    # 1e-12 from it (either side) and on it. "later leaf": node 5's uniform, its
    # rate from node 1's residual after node 4's removal (node 1's u = 0, so its
    # rounds are made); "parent": node 1's, its
    # rate after its four leaves' rounds; "parent's draw": node 1 accepted (u = 0)
    # after them, the recovery uniform at a boundary of its residual's draw;
    # "root's draw": everything rejected, the root's residual after three rounds.
    # The certified walk (docs/spec.md section 7.7) must give the exact pass's tokens.
    rng = np.random.default_rng(23)
    parents = WALK_SHAPES[0]
    batch, nodes, vocab = 48, len(parents), 3000
    target = (rng.normal(size=(batch, nodes, vocab)) * 2).astype(dtype)
    # Siblings drawn independently from one draft row: row c is its parent's.
    noise = rng.normal(size=(batch, nodes, vocab))
    above = np.maximum(parents, 0)
    drafted = (target[:, above].astype(np.float64) + noise[:, above]).astype(dtype)
    temperature = rng.choice([0.7, 1.3], size=batch)
    tokens = np.zeros((batch, nodes), np.int64)
    for b in range(batch):
        t = temperature[b]
        p = [np.asarray(reference.transform_logits(target[b, v], t, 0, 1.0)) for v in range(4)]
        for v in range(4):
            children = np.flatnonzero(parents == v)
            if one_hot:
                # Tokens the target gives little: rates below 1.
                picked = rng.choice(np.argsort(p[v])[: vocab // 2], len(children), replace=False)
            else:
                # q(x) > p(x): rates below 1, and each residual 0 at the siblings' tokens.
                q = np.asarray(reference.transform_logits(drafted[b, children[0]], t, 0, 1.0))
                picked = np.argsort(p[v] - q)[: len(children)]
                if near == "later leaf" and v == 0:
                    picked[0] = int(np.argmax(p[0]))  # node 1's rate near 1 (its u is 0)
                if near == "later leaf" and v == 1:
                    # Node 5's rate after node 4's removal (section 7.6) in (0.1, 0.9).
                    q_1 = np.asarray(reference.transform_logits(drafted[b, 1], t, 0, 1.0))
                    a = min(1.0, p[0][tokens[b, 1]] / q_1[tokens[b, 1]])
                    w = np.maximum(a * p[1] - q, 0.0)
                    a = w.sum() / (w.sum() + 1 - a)
                    rate = np.minimum(a * w / w.sum() / q, 1.0)
                    between = np.flatnonzero((rate > 0.1) & (rate < 0.9))
                    if len(between):
                        picked[1] = rng.choice(between)
            tokens[b, children] = picked
    u = np.full((batch, nodes), np.nextafter(1.0, 0.0))
    if near in ("later leaf", "parent's draw"):
        u[:, 1] = 0.0  # below node 1's rate: step 3 makes every round
    kwargs = dict(
        node_token_ids=tokens,
        parent_ids=parents,
        target_logits=target,
        draft_logits=None if one_hot else drafted,
        temperature=temperature,
        uniforms=u,
        recovery_uniforms=rng.random(batch),
        method="traversal",
    )
    if near.endswith("draw"):

        def place(kw, values):
            kw["recovery_uniforms"] = values

        high = kwargs["recovery_uniforms"]
    else:
        node = 5 if near == "later leaf" else 1

        def place(kw, values):
            kw["uniforms"] = u.copy()
            kw["uniforms"][:, node] = values

        high = np.full(batch, np.nextafter(1.0, 0.0))
    edge, changes = _boundary(kwargs, vocab, place, high)
    assert changes.mean() > 0.5, "most rows have a boundary to test"
    values = np.array([_at_distance(e, b, 4) for b, e in enumerate(edge)])
    place(kwargs, np.where(changes, np.minimum(values, np.nextafter(1.0, 0.0)), high))
    # Not against the reference: uniforms just under 1 sit within 1e-16 of rates
    # that are 1 up to the last bits of a float64 sum (h(S, 1) = S / ((S + 1) - 1)),
    # and the reference's sums differ within about 1e-9.
    verified = _as_the_exact_pass(kwargs, vocab)
    if not near.endswith("draw"):
        # Both sides of the rate are represented.
        accepted = (verified.accepted_node_ids == node).any(axis=1)[changes]
        assert 0 < accepted.sum() < len(accepted)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("one_hot", [False, True])
def test_traversal_s_first_leaf_is_decided_as_the_exact_pass_next_to_its_rate(
    dtype, one_hot
) -> None:
    # Without filters traversal's first decision, the first leaf down the first
    # children (root -> 1 -> 3 -> 6), may be proved an acceptance from the screens'
    # bounds on each p_v(x) and q_c(x) (docs/spec.md section 7.7), no row
    # transformed. Put that leaf's uniform at relative distances 1e-2 .. 1e-12 from
    # its rate (either side) and on it: the tokens must equal the exact pass's,
    # forced by top_k = V.
    rng = np.random.default_rng(16)
    batch, vocab = 128, 3000
    nodes = len(PARENTS)
    target = (rng.normal(size=(batch, nodes, vocab)) * 2).astype(dtype)
    noise = rng.normal(size=(batch, nodes, vocab)) * 0.5
    drafted = (target[:, np.maximum(PARENTS, 0)].astype(np.float64) + noise).astype(dtype)
    tokens = np.argmax(drafted, axis=-1)  # q(x) often above p(x): rates below 1
    temperature = rng.choice([0.7, 1.3], size=batch)
    u = rng.random((batch, nodes))
    distances = np.array([0.5, 0.1, 1e-2, 1e-4, 1e-6, 1e-8, 1e-10, 1e-12, 0.0])
    for b in range(batch):
        rate = 1.0
        for v, c in ((0, 1), (1, 3), (3, 6)):
            p = reference.transform_logits(target[b, v], temperature[b], 0, 1.0)[tokens[b, c]]
            q = 1.0
            if not one_hot:
                q = reference.transform_logits(drafted[b, c], temperature[b], 0, 1.0)[tokens[b, c]]
            rate = min(1.0, rate * p / q)
        sign = -1.0 if b % 2 else 1.0  # odd rows: below the rate (accepted)
        u[b, 6] = min(rate * (1 + sign * distances[(b // 2) % len(distances)]), 0.999)
    kwargs = dict(
        node_token_ids=tokens,
        parent_ids=PARENTS,
        target_logits=target,
        draft_logits=None if one_hot else drafted,
        temperature=temperature,
        uniforms=u,
        recovery_uniforms=rng.random(batch),
        method="traversal",
    )
    screened = _as_the_exact_pass(kwargs, vocab)
    first = (screened.accepted_node_ids == [1, 3, 6]).all(axis=1)
    assert 0 < first.sum() < batch, "the first leaf is both accepted and rejected"


def test_traversal_s_first_leaf_is_not_accepted_past_a_rate_that_underflows() -> None:
    # Root -> 1 -> 2 -> 3, temperature 1. p_0(5) and p_1(6) are about 1e-174, q
    # about 1 there: node 2's rate underflows to 0 in float64, so the walk rejects
    # node 2 first and emits nothing drafted, even though q_3(7) = exp(-800) is 0
    # (which alone would give rate 1). The first-leaf look must not accept
    # (found by review: 0 * p / 0 gave NaN, and NaN.min(1) is 1).
    vocab = 300
    target = np.zeros((1, 4, vocab), np.float32)
    draft = np.zeros((1, 4, vocab), np.float32)
    target[0, :2, 0] = 400.0
    draft[0, 1, 5] = draft[0, 2, 6] = 10.0
    draft[0, 3, 0] = 800.0
    kwargs = dict(
        node_token_ids=np.array([[0, 5, 6, 7]]),
        parent_ids=np.array([-1, 0, 1, 2]),
        target_logits=target,
        draft_logits=draft,
        uniforms=np.array([[0.0, 0.5, 0.5, 0.5]]),
        recovery_uniforms=np.array([0.3]),
        method="traversal",
    )
    got = _as_the_exact_pass(kwargs, vocab, far=np.array([True]))
    assert got.num_accepted.tolist() == [0]


@pytest.mark.parametrize("row", ["draft", "leaf"])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_a_bad_logit_is_an_error_where_the_screens_would_decide(row, bad) -> None:
    # Root -> 1 (a leaf). The drafted token is unlikely under the draft and likely
    # under the target: the draft row's first 2048 logits prove the child accepted
    # (src/logits/screen.rs, draft_prefix_accepts), then the leaf's bonus is drawn
    # by the certified pass. Neither row is transformed, yet each is checked whole
    # (docs/spec.md section 7.7), as the reference checks it.
    vocab = 5000
    target = np.zeros((1, 2, vocab), np.float32)
    target[0, 0, 100] = 10
    draft = np.zeros((1, 2, vocab), np.float32)
    draft[0, 1, :2048] = 5
    draft[0, 1, 100] = 0
    case = dict(
        node_token_ids=np.array([[0, 100]]),
        parent_ids=np.array([-1, 0]),
        target_logits=target,
        draft_logits=draft,
        uniforms=np.array([[0.0, 0.5]]),
        recovery_uniforms=np.array([0.5001]),  # between two tokens' boundaries
    )
    for verify in (specaccept.verify_tree_logits, reference.verify_tree_logits):
        assert verify(**case).accepted_node_ids.tolist() == [[1]]
    arg, where = (
        ("draft_logits", (0, 1, 4999)) if row == "draft" else ("target_logits", (0, 1, 2500))
    )
    (draft if row == "draft" else target)[where] = bad
    named = rf"{arg}\[0, 1, {where[2]}\] = {'nan' if np.isnan(bad) else 'inf'}"
    for verify in (specaccept.verify_tree_logits, reference.verify_tree_logits):
        with pytest.raises(ValueError, match=named):
            verify(**case)


@pytest.mark.parametrize("method", ["token", "traversal"])
def test_isolate_and_out(method) -> None:
    case = logits_case(6)
    case["temperature"][1] = -1.0  # row 1: a bad temperature
    case["target_logits"][3, 0, 0] = np.inf  # row 3: its root row is read
    depth = 3
    buffers = (
        np.zeros((5, depth + 2), np.int64),
        np.zeros(5, np.int64),
        np.zeros(5, np.int64),
        np.zeros((5, depth + 1), np.int64),
    )
    for fn in (specaccept.verify_tree_logits, reference.verify_tree_logits):
        r = fn(**case, method=method, errors="isolate", out=buffers)
        assert sorted(r.errors) == [1, 3]
        assert "temperature[1]" in str(r.errors[1])
        assert "target_logits[3, 0, 0]" in str(r.errors[3])
        assert r.output_token_ids is buffers[0]
        assert (buffers[0][[1, 3]] == -1).all() and (buffers[2][[1, 3]] == 0).all()
        good = [0, 2, 4]
        alone = fn(
            **{
                k: (v[good] if k not in ("parent_ids",) and isinstance(v, np.ndarray) else v)
                for k, v in case.items()
            },
            method=method,
        )
        width = alone.accepted_node_ids.shape[1]
        assert buffers[0][good][:, : width + 1].tolist() == alone.output_token_ids.tolist()


# --- The output law (chi-square; false-failure rate 1e-6 per test) -----------------------


def _law(logits: np.ndarray, params: dict) -> np.ndarray:
    return np.array(
        reference.transform_logits(logits, params["temperature"], params["top_k"], params["top_p"])
    )


FILTERED = dict(temperature=0.8, top_k=4, top_p=0.9)


def _first_tokens(
    method: str, draft_params: dict, rows: int, seed: int, params: dict = FILTERED
) -> tuple[np.ndarray, np.ndarray]:
    """First emitted tokens of :func:`_sampled_tree` and their law."""
    r, root_t, _ = _sampled_tree(method, draft_params, rows, seed, params)
    return r.output_token_ids[:, 0], _law(root_t, params)


def _sampled_tree(method: str, draft_params: dict, rows: int, seed: int, params: dict):
    """A root with two children and a grandchild each (each child's only child),
    drafted from the transformed draft rows (siblings without replacement for
    traversal: the second child's row masks the first's token), verified with
    the target's parameters ``params``. Returns the result, the root's target
    logits and the children's."""
    rng = np.random.default_rng(seed)
    vocab = 6
    # float32: rows the screens apply to (docs/spec.md section 8.6).
    root_t = np.array([1.0, 0.2, -0.5, 0.7, -2.0, 0.1], np.float32)
    root_d = np.array([0.4, 1.0, -0.2, 0.0, 0.5, -1.0], np.float32)
    grand_t = np.array([0.3, -0.3, 0.9, 0.0, 0.2, -1.0], np.float32)
    grand_d = np.array([0.0, 0.5, 0.5, -0.5, 0.2, 0.1], np.float32)
    q_root = _law(root_d, draft_params)
    first = rng.choice(vocab, size=rows, p=q_root)
    second_rows = np.tile(root_d, (rows, 1))
    if method == "traversal":
        second_rows[np.arange(rows), first] = -np.inf
        second = np.array([rng.choice(vocab, p=_law(r, draft_params)) for r in second_rows])
    else:
        second = rng.choice(vocab, size=rows, p=q_root)
    q_grand = _law(grand_d, draft_params)
    g1, g2 = rng.choice(vocab, size=rows, p=q_grand), rng.choice(vocab, size=rows, p=q_grand)
    parents = np.array([-1, 0, 0, 1, 2])
    tokens = np.stack([np.zeros(rows, np.int64), first, second, g1, g2], axis=1)
    target = np.tile(np.stack([root_t, grand_t, grand_t, grand_t, grand_t]), (rows, 1, 1))
    draft = np.stack(
        [
            np.tile(root_d, (rows, 1)),
            np.tile(root_d, (rows, 1)),
            second_rows,
            np.tile(grand_d, (rows, 1)),
            np.tile(grand_d, (rows, 1)),
        ],
        axis=1,
    )
    r = specaccept.verify_tree_logits(
        tokens, parents, target, draft, rng=rng, method=method, **params
    )
    return r, root_t, grand_t


def _p_value(observed: np.ndarray, law: np.ndarray) -> float:
    counts = np.bincount(observed, minlength=len(law))
    assert counts[law == 0].sum() == 0, "a filtered token was emitted"
    kept = law > 0
    return stats.chisquare(counts[kept], law[kept] * counts.sum()).pvalue


@pytest.mark.parametrize("method", ["token", "traversal"])
@pytest.mark.parametrize("params", [FILTERED, dict(temperature=1.1, top_k=0, top_p=1.0)])
def test_the_first_token_follows_the_transformed_target(method, params) -> None:
    # Without filters the token rule's first children go through the screens.
    observed, law = _first_tokens(method, params, 40_000, seed=1, params=params)
    assert _p_value(observed, law) > 1e-6


@pytest.mark.parametrize("params", [FILTERED, dict(temperature=1.1, top_k=0, top_p=1.0)])
def test_the_token_after_an_accepted_child_follows_its_target(params) -> None:
    # The token rule: once child 1 is accepted, its only child is verified on
    # child 1's target row, so the next token follows that row's law. Without
    # filters that only child goes through the chain's certified position, its
    # residual drawn from the kept float32 terms (docs/spec.md section 7.7).
    r, _, grand_t = _sampled_tree("token", params, 40_000, 3, params)
    past_one = r.accepted_node_ids[:, 0] == 1
    assert past_one.sum() > 10_000
    assert _p_value(r.output_token_ids[past_one, 1], _law(grand_t, params)) > 1e-6


@pytest.mark.parametrize("method", ["token", "traversal"])
def test_drafts_from_other_filters_are_caught(method) -> None:
    # Drafts sampled without the filters, verified with them: q is wrong, and the
    # law moves (the test above would fail for such a caller).
    observed, law = _first_tokens(method, dict(temperature=1.3, top_k=0, top_p=1.0), 40_000, 2)
    counts = np.bincount(observed, minlength=len(law))
    kept = law > 0
    assert stats.chisquare(counts[kept], law[kept] * counts.sum()).pvalue < 1e-6
