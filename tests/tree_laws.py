"""Exact output laws of tree verification rules, in rational arithmetic: the oracle
for tree methods (issue 16: traversal verification, Weng et al., NeurIPS 2025).

A draft tree of a fixed shape is drawn from a context-dependent draft model: the
children of a node are drawn one after another, without replacement, from the
draft's distribution at the node's prefix. A rule turns the tree into an accepted
path and one more token; continuing with target samples to a fixed length gives a
law over sequences that must equal the target model's for a lossless rule.

``traversal_law`` is the traversal rule in its recursive form (post-order, children
in draw order): entering node ``v`` with rate ``a``,

    for each child c (token x), in draw order:
        visit c with rate min(1, a * Mb(x) / Ms(x))          # the path's ratio
        if c's subtree rejected:
            S  = sum_y max(0, a * Mb(y) - Ms(y))
            Mb = max(0, a * Mb - Ms) / S                     # the target residual
            Ms = Ms without x, renormalised                  # siblings drawn without replacement
            a  = S / (S + 1 - a)                             # 1 when the denominator is 0
    accept v with probability a; the next token from Mb

with ``Mb``, ``Ms`` starting as the target's and the draft's distributions at the
node's prefix, and the root entered with ``a = 1``. On a chain it is block
verification. Its variants (``variant=``) are plausibly wrong rules the tests must
tell apart from it.
"""

from __future__ import annotations

import itertools
import random
from fractions import Fraction

F = Fraction
V = 3

# A tree shape: the list of its children's shapes ([] is a leaf).
Shape = list


class MarkovModel:
    """A distribution over V tokens for every prefix, rational, fixed by the seed."""

    def __init__(self, seed: int, zeros: bool = False):
        self.seed, self.zeros, self.cache = seed, zeros, {}

    def __call__(self, prefix: tuple[int, ...]) -> tuple[Fraction, ...]:
        if prefix not in self.cache:
            rng = random.Random(repr((self.seed, prefix)))
            while True:
                weights = [rng.randint(0 if self.zeros else 1, 6) for _ in range(V)]
                if sum(weights):
                    break
            self.cache[prefix] = tuple(F(w, sum(weights)) for w in weights)
        return self.cache[prefix]


def draft_trees(shape: Shape, prefix: tuple[int, ...], draft: MarkovModel):
    """Every tree of ``shape`` below ``prefix`` with its probability: ``(prob, [(token, subtree)])``."""
    if not shape:
        yield F(1), []
        return
    dist = draft(prefix)
    for tokens in itertools.permutations(range(V), len(shape)):
        prob, used = F(1), F(0)
        for x in tokens:
            if dist[x] == 0 or used == 1:
                prob = F(0)
                break
            prob *= dist[x] / (1 - used)
            used += dist[x]
        if prob == 0:
            continue
        subtrees = [
            list(draft_trees(child, (*prefix, x), draft))
            for child, x in zip(shape, tokens, strict=True)
        ]
        for combination in itertools.product(*subtrees):
            weight, tree = prob, []
            for x, (sub_prob, sub_tree) in zip(tokens, combination, strict=True):
                weight *= sub_prob
                tree.append((x, sub_tree))
            yield weight, tree


def positive(x: Fraction) -> Fraction:
    return x if x > 0 else F(0)


def traversal_law(tree, prefix, target, draft, variant: str = "traversal"):
    """``{(accepted tokens, next token): probability}`` of the traversal rule on one tree.

    ``variant``: ``"no-draft-update"`` keeps ``Ms`` when a sibling is removed;
    ``"no-rate-update"`` keeps ``a``; ``"early-skip"`` rejects a node whose uniform is
    at least half its rate before its last child's round; ``"doomed-skip"`` rejects a
    node at any child's removal once its uniform is at least its rate, without trying
    its later children (all plausibly wrong).
    """
    law: dict[tuple[tuple[int, ...], int], Fraction] = {}
    _visit(tree, prefix, F(1), F(1), (), target, draft, variant, law)
    return law


def _visit(tree, prefix, rate, weight, path, target, draft, variant, law) -> Fraction:
    """Adds the outcomes of entering this node with ``rate`` (``weight``: the
    probability of getting here); returns the probability the subtree accepts.
    ``draft=None``: proposed trees, each child's draft row one-hot at its token."""
    mb, a = list(target(prefix)), rate
    ms = None if draft is None else list(draft(prefix))
    rejected_all = F(1)  # the probability every child so far was rejected
    accepted = F(0)
    gate = F(1)  # "doomed-skip": the probability the node's uniform lets it go on
    for x, subtree in tree:
        if draft is None:
            ms = [F(int(y == x)) for y in range(V)]
        child_rate = F(0) if (a == 0 or mb[x] == 0) else min(F(1), a * mb[x] / ms[x])
        child = _visit(
            subtree,
            (*prefix, x),
            child_rate,
            weight * rejected_all * gate,
            (*path, x),
            target,
            draft,
            variant,
            law,
        )
        accepted += rejected_all * gate * child
        rejected_all *= 1 - child
        residual = [positive(a * mb[y] - ms[y]) for y in range(V)]
        mass = sum(residual)
        if mass > 0:
            mb = [r / mass for r in residual]
        if draft is not None and variant != "no-draft-update":
            removed = ms[x]
            ms = (
                [F(0) if y == x else ms[y] / (1 - removed) for y in range(V)] if removed < 1 else ms
            )
        before = a  # the rate before this child's round
        if variant == "doomed-skip" and path:
            gate = min(gate, before)
        if variant != "no-rate-update":
            denominator = mass + 1 - a
            a = F(1) if denominator == 0 else mass / denominator
    if tree and path:
        # A node rejected when its uniform is >= its rate before the last child's
        # round skips that round (docs/spec.md section 7.6, step 3): it is accepted
        # with probability min(before, a), which is a, since a round never raises it.
        assert variant == "no-rate-update" or a <= before
        a = min(a, before / 2 if variant == "early-skip" else before)
    keep = rejected_all * a
    if keep:
        total = sum(mb)
        for y in range(V):
            if mb[y]:
                key = (path, y)
                law[key] = law.get(key, F(0)) + weight * keep * mb[y] / total
    return accepted + keep


def sequence_law(shape: Shape, target, draft, variant: str = "traversal"):
    """The law of the first ``depth + 1`` tokens: a verified tree continued by the target."""
    law: dict[tuple[tuple[int, ...], int], Fraction] = {}
    for weight, tree in draft_trees(shape, (0,), draft):
        for key, prob in traversal_law(tree, (0,), target, draft, variant).items():
            law[key] = law.get(key, F(0)) + weight * prob
    return continued(law, depth(shape) + 1, target)


def target_sequences(length: int, target):
    law = {}
    for sequence in itertools.product(range(V), repeat=length):
        q, prefix = F(1), (0,)
        for y in sequence:
            q *= target(prefix)[y]
            prefix = (*prefix, y)
        if q:
            law[sequence] = q
    return law


def depth(shape: Shape) -> int:
    return 1 + max(map(depth, shape)) if shape else 0


def expected_accepted(shape: Shape, target, draft, variant: str = "traversal") -> Fraction:
    total = F(0)
    for weight, tree in draft_trees(shape, (0,), draft):
        for (path, _), prob in traversal_law(tree, (0,), target, draft, variant).items():
            total += weight * prob * len(path)
    return total


def proposed_tree(shape: Shape, prefix: tuple[int, ...], draft: MarkovModel):
    """The deterministic tree a top-k drafter proposes: at each node the draft's most
    likely tokens, in order (ties by lower id)."""
    dist = draft(prefix)
    order = sorted(range(V), key=lambda v: (-dist[v], v))
    return [
        (order[i], proposed_tree(child, (*prefix, order[i]), draft))
        for i, child in enumerate(shape)
    ]


def one_hot_law(tree, prefix, target):
    """The traversal rule's law on a proposed tree (``draft_probs=None``: each child's
    draft row is one-hot at its token)."""
    return traversal_law(tree, prefix, target, None)


def continued(law, length: int, target):
    """A step's law continued by target samples to ``length`` tokens."""
    out: dict[tuple[int, ...], Fraction] = {}
    for (path, token), prob in law.items():
        emitted = (*path, token)
        for rest in itertools.product(range(V), repeat=length - len(emitted)):
            q, prefix = prob, (0, *emitted)
            for y in rest:
                q *= target(prefix)[y]
                prefix = (*prefix, y)
            if q:
                out[(*emitted, *rest)] = out.get((*emitted, *rest), F(0)) + q
    return out
