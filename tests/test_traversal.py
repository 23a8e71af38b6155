"""Traversal verification (``verify_tree(method="traversal")``, docs/spec.md section 7.6):
the native code equals the reference, equals block verification on a chain, and its
rows follow the target's law (chi-square against the exact law of
``tests/tree_laws.py``, where the rule itself is checked by enumeration)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import specaccept
import test_block
from scipy import stats
from specaccept import reference
from tree_laws import MarkovModel, depth, target_sequences

ALPHA = 1e-6  # false-failure rate of the chi-square test


def random_tree_case(seed):
    rng = np.random.default_rng(seed)
    batch, nodes, vocab = 4, int(rng.integers(1, 9)), int(rng.integers(1, 40))
    parents = np.array([-1] + [int(rng.integers(0, n)) for n in range(1, nodes)])
    if seed % 5 == 0 and nodes > 2:
        parents[nodes - 1] = -1  # padding
    dtype = (np.float16, np.float32, np.float64)[seed % 3]
    p = rng.dirichlet(np.full(vocab, 0.4), size=(batch, nodes)).astype(dtype)
    q = None if seed % 2 else rng.dirichlet(np.full(vocab, 0.4), size=(batch, nodes)).astype(dtype)
    ids = rng.integers(0, vocab, size=(batch, nodes))
    favourite = p[np.arange(batch)[:, None], np.maximum(parents, 0)].argmax(-1)
    ids = np.where(rng.random((batch, nodes)) < 0.5, favourite, ids)
    return dict(
        node_token_ids=ids,
        parent_ids=parents,
        target_probs=p,
        draft_probs=q,
        uniforms=rng.random((batch, nodes)),
        recovery_uniforms=rng.random(batch),
        greedy=rng.random(batch) < 0.2,
    )


@pytest.mark.parametrize("seed", range(60))
def test_native_equals_the_reference(seed):
    case = random_tree_case(seed)
    native = specaccept.verify_tree(**case, method="traversal")
    oracle = reference.verify_tree(**case, method="traversal")
    assert native.to_lists() == oracle.to_lists()
    assert native.accepted_node_ids.tolist() == oracle.accepted_node_ids.tolist()


@pytest.mark.parametrize("one_hot", [False, True], ids=["draft-probs", "one-hot"])
@pytest.mark.parametrize("seed", range(40))
def test_on_a_chain_it_is_block_verification_bit_for_bit(seed, one_hot):
    case = test_block.random_case(seed, one_hot)
    ids, p, q = case["draft_token_ids"], case["target_probs"], case["draft_probs"]
    batch, k = ids.shape
    chain = specaccept.verify(
        ids,
        p,
        q,
        uniforms=case["uniforms"],
        recovery_uniforms=case["recovery_uniforms"],
        method="block",
    )
    # Node 0 the root, node i the i-th draft; its uniform is the chain's (i-1)-th.
    tree = specaccept.verify_tree(
        np.concatenate([np.zeros((batch, 1), np.int64), ids], axis=1),
        np.arange(-1, k),
        p,
        None
        if q is None
        else np.concatenate([np.zeros((batch, 1, p.shape[2]), q.dtype), q], axis=1),
        uniforms=np.concatenate([np.zeros((batch, 1)), case["uniforms"]], axis=1),
        recovery_uniforms=case["recovery_uniforms"],
        method="traversal",
    )
    assert tree.to_lists() == chain.to_lists()


# A tree of 6 drafted nodes over V = 3: two candidates at the root, one with two
# children, the other with one (breadth first: 1, 2 | 3, 4 under 1 | 5 under 2).
PARENTS = np.array([-1, 0, 0, 1, 1, 2])
SHAPE = [[[], []], [[]]]


def draw_trees(rows, target, draft, rng):
    """Rows of trees drawn from the draft chain (siblings without replacement), with
    the rows verify_tree reads: p at each node's prefix, q_c the law c was drawn from."""
    nodes = len(PARENTS)
    ids = np.zeros((rows, nodes), np.int64)
    p = np.zeros((rows, nodes, 3))
    q = np.zeros((rows, nodes, 3))
    for r in range(rows):
        prefixes = {0: (0,)}
        for node in range(nodes):
            if node:
                parent = int(PARENTS[node])
                earlier = [c for c in range(1, node) if PARENTS[c] == parent]
                law = np.array([float(x) for x in draft(prefixes[parent])])
                law[[int(ids[r, c]) for c in earlier]] = 0.0
                law /= law.sum()
                q[r, node] = law
                ids[r, node] = rng.choice(3, p=law)
                prefixes[node] = (*prefixes[parent], int(ids[r, node]))
            p[r, node] = [float(x) for x in target(prefixes[node])]
    return ids, p, q


def test_native_traversal_rows_follow_the_target_law():
    rows = 30_000
    target, draft = MarkovModel(41), MarkovModel(141)
    rng = np.random.default_rng(5)
    ids, p, q = draw_trees(rows, target, draft, rng)
    result = specaccept.verify_tree(ids, PARENTS, p, q, rng=rng, method="traversal")
    length = depth(SHAPE) + 1
    sequences = np.full((rows, length), -1)
    for b in range(rows):
        emitted = result.tokens(b)
        sequences[b, : len(emitted)] = emitted
    for b in range(rows):
        prefix = (0, *[int(y) for y in sequences[b] if y >= 0])
        for t in range(len(prefix) - 1, length):
            law = [float(x) for x in target(prefix)]
            sequences[b, t] = rng.choice(3, p=law)
            prefix = (*prefix, int(sequences[b, t]))
    cells = sequences @ (3 ** np.arange(length - 1, -1, -1))
    observed = np.bincount(cells, minlength=3**length)
    law = target_sequences(length, target)
    expected = np.array([float(law.get(s, 0)) for s in itertools.product(range(3), repeat=length)])
    keep = expected > 0
    assert observed[~keep].sum() == 0, "a sequence the target rules out was emitted"
    statistic, p_value = stats.chisquare(observed[keep], expected[keep] * rows)
    assert p_value > ALPHA, (statistic, p_value)


def test_traversal_accepts_more_than_token_on_the_same_trees():
    rows = 20_000
    target, draft = MarkovModel(42), MarkovModel(142)
    rng = np.random.default_rng(6)
    ids, p, q = draw_trees(rows, target, draft, rng)
    u, ru = rng.random((rows, len(PARENTS))), rng.random(rows)
    kwargs = dict(uniforms=u, recovery_uniforms=ru)
    token = specaccept.verify_tree(ids, PARENTS, p, q, **kwargs).num_accepted
    traversal = specaccept.verify_tree(
        ids, PARENTS, p, q, **kwargs, method="traversal"
    ).num_accepted
    gain = traversal - token
    assert gain.mean() > 4 * gain.std() / np.sqrt(rows), (token.mean(), traversal.mean())


def test_the_method_is_checked():
    case = random_tree_case(3)
    with pytest.raises(specaccept.InputError, match="method must be one of"):
        specaccept.verify_tree(**case, method="block")
    with pytest.raises(TypeError, match="method must be one of"):
        specaccept.verify_tree(**case, method=1)
    with pytest.raises(specaccept.InputError, match="method must be one of"):
        reference.verify_tree(**case, method="Traversal")


def test_a_deep_chain_runs_without_recursion():
    # 5,000 nodes in a line, every one rejected: the stack is a vector, not calls.
    nodes, vocab = 5_000, 4
    p = np.full((1, nodes, vocab), 0.25)
    q = np.zeros((1, nodes, vocab))
    q[..., 0] = 1.0
    ids = np.zeros((1, nodes), np.int64)
    r = specaccept.verify_tree(
        ids,
        np.arange(-1, nodes - 1),
        p,
        q,
        uniforms=np.full((1, nodes), 0.999),
        recovery_uniforms=np.array([0.5]),
        method="traversal",
    )
    assert r.num_accepted[0] == 0 and r.tokens(0)[0] in (1, 2, 3)


@pytest.mark.parametrize("method", ["token", "traversal"])
@pytest.mark.parametrize("seed", range(8))
def test_expected_num_accepted_tree_matches_monte_carlo(seed, method):
    case = random_tree_case(seed)
    case["greedy"] = False
    del case["uniforms"], case["recovery_uniforms"]
    reps = 20_000
    nodes = case["node_token_ids"].shape[1]
    exact = specaccept.lab.expected_num_accepted_tree(
        case["node_token_ids"],
        case["parent_ids"],
        case["target_probs"],
        case["draft_probs"],
        method=method,
    )
    tiled = {
        k: (np.repeat(v, reps, axis=0) if isinstance(v, np.ndarray) and k != "parent_ids" else v)
        for k, v in case.items()
    }
    got = specaccept.verify_tree(**tiled, rng=seed, method=method).num_accepted.reshape(-1, reps)
    spread = got.std(axis=1) / np.sqrt(reps)
    rare = nodes * 20 / reps  # events too rare to be seen move the mean this much at most
    assert np.all(np.abs(got.mean(axis=1) - exact) < 5.5 * spread + rare)


def test_expected_num_accepted_tree_is_the_exact_law_on_markov_trees():
    from tree_laws import draft_trees, expected_accepted

    target, draft = MarkovModel(43), MarkovModel(143)
    total = 0.0
    for weight, tree in draft_trees(SHAPE, (0,), draft):
        # The tree as verify_tree's arrays, numbered breadth-first as PARENTS is.
        ids, prefixes = [0], [(0,)]
        level = [((0, x), sub) for x, sub in tree]
        for prefix, _ in level:
            ids.append(prefix[-1])
            prefixes.append(prefix)
        for prefix, sub in level:
            for x, _ in sub:
                ids.append(x)
                prefixes.append((*prefix, x))
        p = np.array([[float(v) for v in target(pre)] for pre in prefixes])
        q = np.zeros_like(p)
        for node in range(1, len(PARENTS)):
            parent = int(PARENTS[node])
            earlier = [int(ids[c]) for c in range(1, node) if PARENTS[c] == parent]
            law = np.array([float(v) for v in draft(prefixes[parent])])
            law[earlier] = 0.0
            q[node] = law / law.sum()
        expected = specaccept.lab.expected_num_accepted_tree(
            np.array([ids]), PARENTS, p[None], q[None], method="traversal"
        )[0]
        total += float(weight) * expected
    assert total == pytest.approx(float(expected_accepted(SHAPE, target, draft)), abs=1e-12)


def test_traversal_expects_more_on_the_builtin_ngram_models():
    from specaccept.ngram import builtin_models, builtin_text, drafted_tree

    target, draft, vocab = builtin_models()
    ids = vocab.encode(builtin_text()[:20_000])
    rng = np.random.default_rng(12)
    parents = np.array([-1, 0, 0, 1, 2, 3, 4])  # two candidates, each followed by two
    gain = []
    for start in rng.integers(8, len(ids) - 8, size=900):
        tree = drafted_tree(target, draft, ids[int(start) - 8 : int(start)], parents, rng)
        args = (tree[0], parents, tree[1], tree[2])
        token = specaccept.lab.expected_num_accepted_tree(*args, method="token")[0]
        traversal = specaccept.lab.expected_num_accepted_tree(*args, method="traversal")[0]
        gain.append(traversal - token)
    gain = np.array(gain)
    # Paired over the same trees: above zero by 4 standard errors.
    assert gain.mean() > 4 * gain.std() / np.sqrt(len(gain)), gain.mean()


@pytest.mark.parametrize(
    "fn", [specaccept.verify_tree, reference.verify_tree], ids=["native", "reference"]
)
def test_a_node_rejected_before_its_last_childs_round_reads_neither_row(fn):
    # Root 0 -> node 1 (rate 0.2 / 0.4 = 1/2) -> node 2 (rate 1/2 * 0.25 / 0.5 = 1/4), V = 4.
    # Node 1's target row and node 2's draft row hold a NaN off the drafted tokens: the
    # round that removes node 2 would read both.
    nan = float("nan")
    p = np.array([[[0.2, 0.3, 0.3, 0.2], [0.25, nan, 0.5, 0.25], [0.25] * 4]])
    q = np.array([[[0.25] * 4, [0.4, 0.2, 0.2, 0.2], [0.5, nan, 0.25, 0.25]]])
    ids, parents, ru = np.array([[0, 0, 0]]), np.array([-1, 0, 1]), np.array([0.5])
    # u_2 rejects node 2; u_1 = a_1 rejects node 1 without the round; the root's residual
    # max(0, p_0 - q_1) = (0, 0.1, 0.1, 0) draws token 1 or 2.
    r = fn(
        ids,
        parents,
        p,
        q,
        uniforms=np.array([[0.0, 0.5, 0.99]]),
        recovery_uniforms=ru,
        method="traversal",
    )
    assert r.num_accepted[0] == 0 and r.output_token_ids[0, 0] in (1, 2)
    # Just below a_1 the round is made, and it reads node 1's target row first.
    u = np.array([[0.0, np.nextafter(0.5, 0), 0.99]])
    with pytest.raises(ValueError, match=r"target_probs\[0, 1, 1\]"):
        fn(ids, parents, p, q, uniforms=u, recovery_uniforms=ru, method="traversal")


@pytest.mark.parametrize(
    "fn", [specaccept.verify_tree, reference.verify_tree], ids=["native", "reference"]
)
def test_a_rejected_node_skips_its_rounds_only_if_no_later_child_can_enter_above_rate_0(fn):
    # As above with a second child (node 3, token 2) under node 1, whose draft row holds a
    # NaN at its own token: read only if node 3 is entered. Removing node 2 would leave
    # node 1's weight at token 2 at max(0, 0.5 * 0.5 - q_2(2)).
    nan = float("nan")
    p = np.array([[[0.2, 0.3, 0.3, 0.2], [0.25, nan, 0.5, 0.25], [0.25] * 4, [0.25] * 4]])
    ids, parents = np.array([[0, 0, 0, 2]]), np.array([-1, 0, 1, 1])
    u, ru = np.array([[0.0, 0.5, 0.99, 0.99]]), np.array([0.5])

    def rows(q_2_at_2):
        q_2 = [0.5, 0.25, q_2_at_2, 0.25 - q_2_at_2]
        return np.array([[[0.25] * 4, [0.4, 0.2, 0.2, 0.2], q_2, [0.25, 0.25, nan, 0.5]]])

    # q_2(2) = 0.25: node 3 could only enter with rate 0, and u_1 = a_1 rejects node 1:
    # neither node 1's row nor node 3's is read.
    r = fn(ids, parents, p, rows(0.25), uniforms=u, recovery_uniforms=ru, method="traversal")
    assert r.num_accepted[0] == 0 and r.output_token_ids[0, 0] in (1, 2)
    # q_2(2) = 0.1: node 3 keeps weight 0.15, so node 2's round is made (its sibling's
    # rate needs it) whatever node 1's uniform is, and it reads node 1's target row.
    with pytest.raises(ValueError, match=r"target_probs\[0, 1, 1\]"):
        fn(ids, parents, p, rows(0.1), uniforms=u, recovery_uniforms=ru, method="traversal")
    # With node 1 not yet rejected by its uniform, the round is made too.
    u_low = np.array([[0.0, np.nextafter(0.5, 0), 0.99, 0.99]])
    with pytest.raises(ValueError, match=r"target_probs\[0, 1, 1\]"):
        fn(ids, parents, p, rows(0.25), uniforms=u_low, recovery_uniforms=ru, method="traversal")


@pytest.mark.parametrize(
    "fn", [specaccept.verify_tree, reference.verify_tree], ids=["native", "reference"]
)
def test_the_subtree_of_a_node_entered_with_rate_0_is_not_visited(fn):
    # Root 0 -> node 1 -> node 2, V = 4; node 2's token is out of range. Node 1's token
    # has target probability 0 (rate 0): nothing under it is entered, and the root's
    # residual max(0, p_0 - q_1) = (0, 0.5, 0.3, 0) draws token 1 or 2.
    p = np.array([[[0.0, 0.5, 0.3, 0.2], [0.25] * 4, [0.25] * 4]])
    q = np.array([[[0.25] * 4, [0.4, 0.0, 0.0, 0.6], [0.25] * 4]])
    parents, u, ru = np.array([-1, 0, 1]), np.zeros((1, 3)), np.array([0.5])
    r = fn(
        np.array([[0, 0, 9]]), parents, p, q, uniforms=u, recovery_uniforms=ru, method="traversal"
    )
    assert r.num_accepted[0] == 0 and r.output_token_ids[0, 0] in (1, 2)
    # Node 1 on token 3 (rate 0.2 / 0.6 = 1/3) is descended into, and the token is an error.
    with pytest.raises(ValueError, match=r"node_token_ids\[0, 2\]"):
        fn(
            np.array([[0, 3, 9]]),
            parents,
            p,
            q,
            uniforms=u,
            recovery_uniforms=ru,
            method="traversal",
        )
