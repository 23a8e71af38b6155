"""The traversal rule of ``tests/tree_laws.py`` (the oracle for issue 16) is lossless
on context-dependent models and many tree shapes, is block verification on a chain,
and its plausibly wrong variants are not: exact enumeration, rational arithmetic."""

from __future__ import annotations

import pytest
import test_block
from tree_laws import (
    MarkovModel,
    depth,
    draft_trees,
    expected_accepted,
    sequence_law,
    target_sequences,
    traversal_law,
)

SHAPES = {
    "chain of 3": [[[[]]]],
    "two at the root": [[], []],
    "three at the root": [[], [], []],
    "two levels": [[[], []], [[]]],
    "unbalanced": [[[[]]], []],
}


@pytest.mark.parametrize("zeros", [False, True], ids=["positive", "with-zeros"])
@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("name", SHAPES)
def test_the_traversal_rule_is_lossless(name, seed, zeros):
    shape = SHAPES[name]
    # A node with V children needs a draft that can draw every token.
    full = max(len(shape), 1) == 3
    target, draft = MarkovModel(10 + seed, zeros), MarkovModel(100 + seed, zeros and not full)
    assert sum(weight for weight, _ in draft_trees(shape, (0,), draft)) == 1
    assert sequence_law(shape, target, draft) == target_sequences(depth(shape) + 1, target)


@pytest.mark.parametrize(
    "variant", ["no-draft-update", "no-rate-update", "early-skip", "doomed-skip"]
)
def test_plausibly_wrong_traversal_rules_are_caught(variant):
    shape = SHAPES["two levels"]
    target, draft = MarkovModel(11), MarkovModel(101)
    assert sequence_law(shape, target, draft, variant) != target_sequences(3, target)


@pytest.mark.parametrize("seed", range(4))
def test_on_a_chain_it_is_block_verification(seed):
    # The same accepted-length law as block verification on every drafted chain.
    target, draft = MarkovModel(20 + seed), MarkovModel(200 + seed)
    for _, tree in draft_trees(SHAPES["chain of 3"], (0,), draft):
        drafts, node = [], tree
        while node:
            drafts.append(node[0][0])
            node = node[0][1]
        contexts = [(0, *drafts[:t]) for t in range(len(drafts) + 1)]
        block = test_block.step_law(
            drafts, [target(c) for c in contexts], [draft(c) for c in contexts[:-1]]
        )
        traversal = traversal_law(tree, (0,), target, draft)
        as_block = {(len(path), y): p for (path, y), p in traversal.items()}
        assert as_block == block


def test_traversal_expects_at_least_the_chain_of_its_first_path():
    # More candidates per position never accept fewer drafts in expectation here.
    target, draft = MarkovModel(31), MarkovModel(131)
    wide = expected_accepted([[[]], [[]]], target, draft)
    chain = expected_accepted([[[]]], target, draft)
    assert wide >= chain


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("name", SHAPES)
def test_the_traversal_rule_is_lossless_on_proposed_trees(name, seed):
    # draft_probs=None: deterministic candidates (a top-k drafter), one-hot rows.
    from tree_laws import continued, one_hot_law, proposed_tree

    target, draft = MarkovModel(50 + seed), MarkovModel(150 + seed)
    shape = SHAPES[name]
    tree = proposed_tree(shape, (0,), draft)
    length = depth(shape) + 1
    assert continued(one_hot_law(tree, (0,), target), length, target) == target_sequences(
        length, target
    )
