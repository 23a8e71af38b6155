"""Tree verification: acceptance length against the chain, and time against the floor.

Run after ``pip install .``::

    python benches/bench_tree.py            # about a minute
    python benches/bench_tree.py --quick    # seconds

1. **Acceptance on the same budget.** Every position has the same target ``p`` and
   draft ``q`` (so the per-token acceptance rate is ``a = sum(min(p, q))``). A chain
   drafts 6 tokens; a tree drafts 6 nodes: two candidates at the first position,
   each followed by a chain of two (depth 3). Both are verified on the same rows;
   the table gives the mean accepted length of each.
2. **Time.** ``(B, N, V) = (64, 16, 128256)`` float32 with draft probabilities: a root
   with 3 children, each with 4 children, every root child rejected (so the root's
   target row and 3 draft rows are read, and 3 residuals computed), against
   ``verify`` on a chain of ``K = 15`` rejected at position 0, and against the floor
   (bytes that must be read / this machine's read bandwidth, measured right before
   each timed call; the ratio is the median of the calls' ratios, ``harness.ReadFloor``).
   Then the same tree from logits, on one thread and on all: time per row
   transformed, against ``verify_logits`` on the chain.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
from collections.abc import Callable

import numpy as np
import specaccept
from harness import ReadFloor, median_of_runs

CHAIN_K = 6
# Root 0 -> 1, 2; 1 -> 3 -> 5; 2 -> 4 -> 6: six drafted nodes, depth 3.
TREE_PARENTS = np.array([-1, 0, 0, 1, 2, 3, 4])
# The timed tree: a root with 3 children, each with 4 children (16 nodes).
TIMED_PARENTS = np.array([-1, 0, 0, 0] + [1 + (n - 4) // 4 for n in range(4, 16)])


def acceptance(a_target: float, rows: int, seed: int) -> tuple[float, float, float, float]:
    """Mean accepted length of the chain, of the tree (token) and of the tree
    (traversal), for p and q with overlap ~a."""
    rng = np.random.default_rng(seed)
    vocab = 64
    p = rng.dirichlet(np.full(vocab, 0.5))
    noise = rng.dirichlet(np.full(vocab, 0.5))
    # Mix the draft towards the target until the overlap is near a_target.
    weight = min(1.0, max(0.0, a_target))
    q = weight * p + (1 - weight) * noise
    a = float(specaccept.acceptance_rate(p, q))
    chain_ids = rng.choice(vocab, p=q, size=(rows, CHAIN_K))
    chain = specaccept.verify(
        chain_ids,
        np.broadcast_to(p, (rows, CHAIN_K + 1, vocab)),
        np.broadcast_to(q, (rows, CHAIN_K, vocab)),
        rng=rng,
    )
    nodes = len(TREE_PARENTS)
    tree_ids = rng.choice(vocab, p=q, size=(rows, nodes))
    target = np.broadcast_to(p, (rows, nodes, vocab))
    draft = np.broadcast_to(q, (rows, nodes, vocab))
    u, ru = rng.random((rows, nodes)), rng.random(rows)
    tree = specaccept.verify_tree(
        tree_ids, TREE_PARENTS, target, draft, uniforms=u, recovery_uniforms=ru
    )
    traversal = specaccept.verify_tree(
        tree_ids,
        TREE_PARENTS,
        target,
        draft,
        uniforms=u,
        recovery_uniforms=ru,
        method="traversal",
    )
    return (
        a,
        float(chain.num_accepted.mean()),
        float(tree.num_accepted.mean()),
        float(traversal.num_accepted.mean()),
    )


# Tree shapes for the n-gram comparison (parents, breadth first).
SHAPES = {
    "chain of 4": [-1, 0, 1, 2, 3],
    "2 at the root, chains of 2": [-1, 0, 0, 1, 2, 3, 4],
    "3 at the root": [-1, 0, 0, 0],
    "2 x 2 x 2 (binary, depth 3)": [-1, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6],
}


def ngram_gain(blocks: int, seed: int) -> list[tuple[str, float, float]]:
    """Exact expected accepted length (over the uniforms) of the token and traversal
    rules on trees drafted by the bigram model for the 4-gram target, averaged over
    drafted trees."""
    from specaccept.ngram import builtin_models, builtin_text, drafted_tree

    target, draft, vocab = builtin_models()
    ids = vocab.encode(builtin_text()[:200_000])
    rng = np.random.default_rng(seed)
    rows = []
    for name, parents in SHAPES.items():
        token = traversal = 0.0
        for start in rng.integers(8, len(ids) - 8, size=blocks):
            tree = drafted_tree(target, draft, ids[int(start) - 8 : int(start)], parents, rng)
            args = (tree[0], np.array(parents), tree[1], tree[2])
            token += specaccept.lab.expected_num_accepted_tree(*args, method="token")[0]
            traversal += specaccept.lab.expected_num_accepted_tree(*args, method="traversal")[0]
        rows.append((name, token / blocks, traversal / blocks))
    return rows


def median_ms(fn: Callable[[], object], repeats: int) -> float:
    return median_of_runs(fn, repeats) * 1e3


def rejected_rows(rng, batch: int, rows: int, vocab: int):
    """float32 rows where every candidate is rejected and every round traversal may
    skip is still made: target rows uniform in [0.5, 1) and normalised; draft rows 1 at
    the node's (or position's) token and 0 elsewhere, so every residual stays positive
    away from the removed tokens, each later sibling enters with a rate above 0, and a
    parent's rounds are needed for its later children (docs/spec.md section 7.6, step
    3); uniforms just under 1. Returns ``p, q, tokens, uniforms, recovery_uniforms``."""
    p = rng.random((batch, rows, vocab), dtype=np.float32) / 2 + np.float32(0.5)
    p /= p.sum(axis=-1, keepdims=True)
    q = np.zeros((batch, rows, vocab), np.float32)
    tokens = rng.integers(0, vocab, size=(batch, rows))
    q[np.arange(batch)[:, None], np.arange(rows), tokens] = 1.0  # q(x) > p(x)
    u = np.full((batch, rows), np.nextafter(1.0, 0.0))
    return p, q, tokens, u, np.full(batch, 0.5)


def timing(batch: int, vocab: int, repeats: int) -> None:
    rng = np.random.default_rng(0)
    parents = TIMED_PARENTS
    nodes = len(parents)
    p, q, tokens, u, ru = rejected_rows(rng, batch, nodes, vocab)
    tree = specaccept.verify_tree(tokens, parents, p, q, uniforms=u, recovery_uniforms=ru)
    assert (tree.num_accepted == 0).all()
    k = nodes - 1
    chain_q = q[:, 1:]
    chain_u = u[:, 1:]
    chain = specaccept.verify(tokens[:, 1:], p, chain_q, uniforms=chain_u, recovery_uniforms=ru)
    assert (chain.num_accepted == 0).all()
    floor = ReadFloor(specaccept.get_num_threads())
    tree_bytes = batch * 4 * vocab * 4  # the root's row and 3 draft rows
    # Traversal removes every node, but a parent whose uniform already rejects it
    # skips its last child's round: 12 draft rows (the root's 3 children, the first 3
    # children of each), and the target rows of the root and its 3 children.
    traversal_bytes = batch * 16 * vocab * 4
    chain_bytes = batch * 2 * vocab * 4  # one residual pair
    n = specaccept.get_num_threads()
    print(f"\n(B, N, V) = ({batch}, {nodes}, {vocab}) float32, every candidate rejected:")
    print(
        f"  {'':14} {'1 thread':>9} {'floor':>7} {'ratio':>6} {f'{n} threads':>10} {'floor':>7}"
        f" {'ratio':>6}  (ms; ratio: the median of each call's over the floor read before it)"
    )
    for name, nbytes, fn in (
        (
            "verify_tree",
            tree_bytes,
            lambda: specaccept.verify_tree(tokens, parents, p, q, uniforms=u, recovery_uniforms=ru),
        ),
        (
            "traversal",
            traversal_bytes,
            lambda: specaccept.verify_tree(
                tokens, parents, p, q, uniforms=u, recovery_uniforms=ru, method="traversal"
            ),
        ),
        (
            f"verify K={k}",
            chain_bytes,
            lambda: specaccept.verify(
                tokens[:, 1:], p, chain_q, uniforms=chain_u, recovery_uniforms=ru
            ),
        ),
    ):
        cells = []
        for used in (1, n):
            specaccept.set_num_threads(used)
            t, f, r = floor.ratio(fn, nbytes, used, repeats)
            cells.append((t * 1e3, f * 1e3, r))
        specaccept.set_num_threads(n)
        (t1, f1, r1), (tn, fn_, rn) = cells
        print(f"  {name:14} {t1:9.2f} {f1:7.2f} {r1:5.2f}x {tn:10.2f} {fn_:7.2f} {rn:5.2f}x")
    bandwidths = [statistics.median(floor.bandwidth(t) for _ in range(5)) for t in (1, n)]
    floor.close()
    print(
        f"  read bandwidth now {bandwidths[0] / 1e9:.1f} GB/s on 1 thread, "
        f"{bandwidths[1] / 1e9:.1f} GB/s on all"
    )
    # Labelled extra: rows uniform in [0, 1), not normalised, q = 1 at each token. The
    # residuals lose every later child's weight, so traversal skips most rounds.
    p = rng.random((batch, nodes, vocab), dtype=np.float32)
    q = rng.random((batch, nodes, vocab), dtype=np.float32)
    q[np.arange(batch)[:, None], np.arange(nodes), tokens] = 1.0
    ms = [
        median_ms(
            lambda m=m: specaccept.verify_tree(
                tokens, parents, p, q, uniforms=u, recovery_uniforms=ru, method=m
            ),
            repeats,
        )
        for m in ("token", "traversal")
    ]
    print(
        f"  labelled extra, rows uniform in [0, 1) ({n} threads): token {ms[0]:.2f} ms, "
        f"traversal {ms[1]:.2f} ms, {ms[1] / ms[0]:.2f}x"
    )
    logits_timing(tokens, parents, u, ru, batch, vocab, repeats)


def logits_timing(tokens, parents, u, ru, batch: int, vocab: int, repeats: int) -> None:
    """The same 3 x 4 tree from float32 logits (temperature 0.8), every candidate
    rejected: the token rule reads the root's target row and 3 draft rows (without
    filters the certified passes decide them, none transformed), traversal
    transforms the 4 target rows and 15 draft rows. Per row read, against
    verify_logits on a chain rejected at position 0 (2 rows read per row)."""
    rng = np.random.default_rng(1)
    nodes = tokens.shape[1]
    target = rng.normal(size=(batch, nodes, vocab)).astype(np.float32)
    draft = rng.normal(size=(batch, nodes, vocab)).astype(np.float32)
    rows = np.arange(batch)[:, None]
    draft[rows, np.arange(nodes), tokens] += 30.0  # q(x) near 1 > p(x): every child rejected
    params = dict(temperature=0.8)
    tree = specaccept.verify_tree_logits(
        tokens, parents, target, draft, uniforms=u, recovery_uniforms=ru, **params
    )
    assert (tree.num_accepted == 0).all()
    chain_ids = tokens[:, 1:]
    chain = specaccept.verify_logits(
        chain_ids, target, draft[:, 1:], uniforms=u[:, 1:], recovery_uniforms=ru, **params
    )
    assert (chain.num_accepted == 0).all()
    n = specaccept.get_num_threads()
    print("\nFrom float32 logits, temperature 0.8, every candidate rejected:")
    print(
        f"  {'':22} {'1t ms':>8} {f'{n}t ms':>8} {'rows':>5} {'us/row 1t':>10} {f'us/row {n}t':>10}"
    )
    for name, transformed, fn in (
        (
            "verify_tree_logits",
            4,
            lambda: specaccept.verify_tree_logits(
                tokens, parents, target, draft, uniforms=u, recovery_uniforms=ru, **params
            ),
        ),
        (
            "  traversal",
            19,
            lambda: specaccept.verify_tree_logits(
                tokens,
                parents,
                target,
                draft,
                uniforms=u,
                recovery_uniforms=ru,
                method="traversal",
                **params,
            ),
        ),
        (
            "verify_logits K=15",
            2,
            lambda: specaccept.verify_logits(
                chain_ids, target, draft[:, 1:], uniforms=u[:, 1:], recovery_uniforms=ru, **params
            ),
        ),
    ):
        times = []
        for used in (1, n):
            specaccept.set_num_threads(used)
            times.append(median_ms(fn, repeats))
        specaccept.set_num_threads(n)
        per_row = [ms * 1e3 / (batch * transformed) for ms in times]
        print(
            f"  {name:22} {times[0]:8.2f} {times[1]:8.2f} {transformed:5d} {per_row[0]:10.1f}"
            f" {per_row[1]:10.1f}"
        )


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def sampled_tree(rng, batch: int, vocab: int, sigma: float):
    """``TIMED_PARENTS`` drafted as a serving loop drafts it (see ``sampled_timing``):
    the node tokens, float32 target rows and float32 draft rows."""
    parents = TIMED_PARENTS
    nodes = len(parents)
    logits = rng.standard_normal((batch, nodes, vocab), dtype=np.float32) * 3
    target = softmax(logits / 0.8).astype(np.float32)
    noise = rng.standard_normal((batch, nodes, vocab), dtype=np.float32) * sigma
    at_node = softmax((logits + noise) / 0.8)
    tokens = np.zeros((batch, nodes), np.int64)
    draft = np.zeros((batch, nodes, vocab), np.float32)
    for b in range(batch):
        taken: dict[int, list[int]] = {}
        for c in range(1, nodes):
            row = at_node[b, parents[c]].copy()
            row[taken.get(parents[c], [])] = 0.0
            row /= row.sum()
            tokens[b, c] = rng.choice(vocab, p=row)
            draft[b, c] = row
            taken.setdefault(int(parents[c]), []).append(int(tokens[b, c]))
    return tokens, target, draft


def sampled_timing(batch: int, vocab: int, repeats: int) -> None:
    """The 3 x 4 tree drafted as a serving loop drafts it: target rows
    ``softmax(l / 0.8)`` of logits ``3 N(0, 1)``, a drafter whose logits are the
    target's plus ``sigma N(0, 1)``, each node's children drawn from the drafter's row
    at the node without replacement (row ``c`` of ``draft_probs`` the row child ``c``
    was drawn from). The token rule against traversal on the same trees, uniforms
    and thread count."""
    rng = np.random.default_rng(3)
    parents = TIMED_PARENTS
    nodes = len(parents)
    n = specaccept.get_num_threads()
    print(f"\nThe same shape drafted from sampled rows ({batch} rows, V = {vocab}, {n} threads):")
    print(
        f"  {'sigma':>5} {'accepted: token':>16} {'traversal':>10} {'token ms':>9} {'traversal ms':>13} {'ratio':>6}"
    )
    for sigma in (0.5, 1.0, 2.0):
        tokens, target, draft = sampled_tree(rng, batch, vocab, sigma)
        u, ru = rng.random((batch, nodes)), rng.random(batch)
        args = (tokens, parents, target, draft)
        kwargs = dict(uniforms=u, recovery_uniforms=ru)
        token = specaccept.verify_tree(*args, **kwargs)
        traversal = specaccept.verify_tree(*args, **kwargs, method="traversal")
        times = [
            median_ms(
                lambda m=m, a=args, k=kwargs: specaccept.verify_tree(*a, **k, method=m), repeats
            )
            for m in ("token", "traversal")
        ]
        print(
            f"  {sigma:>5} {token.num_accepted.mean():>16.2f} {traversal.num_accepted.mean():>10.2f} "
            f"{times[0]:>9.2f} {times[1]:>13.2f} {times[1] / times[0]:>5.2f}x"
        )


# Three candidates at the root, each followed by a chain of three (13 nodes, depth
# 4): the shape of trees that branch where the drafter is unsure and then follow its
# top choice (SpecInfer's and Sequoia's trees end in such chains). Nodes 1..9 each
# have one child.
BRANCH_PARENTS = np.array([-1, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9])

# The trees from SmolLM2's logits: (name, parent links).
SMOLLM2_SHAPES = (("3 x 4", TIMED_PARENTS), ("3 chains of 4", BRANCH_PARENTS))


def depths(parents: np.ndarray) -> np.ndarray:
    """Each node's depth (the root's is 0; parents precede their children)."""
    depth = np.zeros(len(parents), np.int64)
    for c in range(1, len(parents)):
        depth[c] = depth[parents[c]] + 1
    return depth


def smollm2_tree(
    rng,
    logits: np.ndarray,
    batch: int,
    sigma: float | None,
    method: str,
    parents: np.ndarray = TIMED_PARENTS,
):
    """The tree ``parents`` over SmolLM2's logits ``[T, V]`` (issue 27's realistic
    regimes, as ``bench_logits.py``'s): in each batch row, node ``n``'s target row is
    the text's row at ``start + depth(n)`` for a random ``start``; the drafter's row at
    a node is its target row plus ``sigma N(0, 1)`` (``sigma=None``: the row of
    another position, a weak drafter); children are drawn from the drafter's row
    transformed at temperature 0.8, independently for the token rule, without
    replacement for traversal (child ``c``'s row masks its earlier siblings'
    tokens, ``-inf``). Returns float32 target and draft logits and the tokens."""
    from bench_logits import TEMPERATURE

    nodes, depth = len(parents), depths(parents)
    positions, vocab = logits.shape
    target = np.empty((batch, nodes, vocab), np.float32)
    draft = np.empty((batch, nodes, vocab), np.float32)
    tokens = np.zeros((batch, nodes), np.int64)
    for b in range(batch):
        start = int(rng.integers(0, positions - int(depth.max())))
        target[b] = logits[start + depth]
        drafter = {}
        for n in map(int, np.unique(parents[1:])):  # the nodes with children
            if sigma is None:
                drafter[n] = logits[int(rng.integers(0, positions))].copy()
            else:
                noise = rng.standard_normal(vocab, dtype=np.float32) * sigma
                drafter[n] = (target[b, n] + noise).astype(np.float32)
        draft[b, 0] = drafter[0]  # never read: the root is not drafted
        taken: dict[int, list[int]] = {}
        for c in range(1, nodes):
            row = drafter[int(parents[c])].copy()
            if method == "traversal":
                row[taken.get(int(parents[c]), [])] = -np.inf
            z = row.astype(np.float64) / TEMPERATURE
            q = np.exp(z - z.max())
            tokens[b, c] = rng.choice(vocab, p=q / q.sum())
            draft[b, c] = row
            taken.setdefault(int(parents[c]), []).append(int(tokens[b, c]))
    return tokens, target, draft


def rows_read(result, parents: np.ndarray) -> int:
    """Rows the token rule's walk reads (the float64 walk transforms them, the looks
    need not): each path node's target row and the draft rows of the children it
    tries (children in index order, up to the accepted one, or all of them)."""
    children = [np.flatnonzero(parents == n) for n in range(len(parents))]
    total = 0
    for path in result.accepted_node_ids:
        nodes = [0] + [int(n) for n in path if n >= 0]
        total += len(nodes)
        for depth, n in enumerate(nodes):
            kids = children[n]
            if depth + 1 < len(nodes):
                total += int(np.searchsorted(kids, nodes[depth + 1])) + 1
            else:
                total += len(kids)
    return total


def smollm2_timing(batch: int, repeats: int) -> None:
    """The trees of ``SMOLLM2_SHAPES`` from SmolLM2's logits (``smollm2_tree``), no
    filters, temperature 0.8, fresh uniforms every call: ms per call on one thread
    and on all, and per row the float64 walk would transform."""
    try:
        import torch
    except ImportError:
        print("PyTorch not installed: the table from SmolLM2's logits is skipped")
        return
    from bench_logits import SMOLLM2_DRAFTERS, TEMPERATURE, smollm2_logits

    logits = smollm2_logits(torch)
    if logits is None:
        return
    rng = np.random.default_rng(5)
    n = specaccept.get_num_threads()
    vocab = logits.shape[1]
    print(f"\nTrees from SmolLM2's logits ({batch} rows, V = {vocab}, no filters):")
    print(
        f"  {'shape':13} {'drafter':28} {'method':>9} {'accepted':>8} {'rows':>5} {'1t ms':>7} {f'{n}t ms':>7} {'us/row 1t':>10}"
    )
    for (shape, parents), (name, sigma), method in itertools.product(
        SMOLLM2_SHAPES, SMOLLM2_DRAFTERS, ("token", "traversal")
    ):
        tokens, target, draft = smollm2_tree(rng, logits, batch, sigma, method, parents)

        def call(m=method, t=tokens, tg=target, d=draft, a=parents):
            # Fresh uniforms every call, drawn from ``rng``.
            return specaccept.verify_tree_logits(
                t, a, tg, d, temperature=TEMPERATURE, rng=rng, method=m
            )

        results = [call() for _ in range(16)]
        accepted = np.mean([r.num_accepted.mean() for r in results])
        read = np.mean([rows_read(r, parents) for r in results]) / batch
        if method != "token":
            read = float("nan")  # rows_read counts the token rule's walk
        times = []
        for used in (1, n):
            specaccept.set_num_threads(used)
            times.append(median_ms(call, repeats))
        specaccept.set_num_threads(n)
        per_row = times[0] * 1e3 / (batch * read)
        print(
            f"  {shape:13} {name:28} {method:>9} {accepted:>8.2f} {read:>5.1f} {times[0]:>7.2f} "
            f"{times[1]:>7.2f} {per_row:>10.1f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rows, a smaller vocabulary")
    parser.add_argument(
        "--smollm2-only", action="store_true", help="only the trees from SmolLM2's logits"
    )
    args = parser.parse_args()
    if args.smollm2_only:
        smollm2_timing(batch=16, repeats=15)
        return
    rows = 5_000 if args.quick else 100_000
    print(f"Mean accepted length on a budget of {CHAIN_K} drafted tokens ({rows} rows):")
    print(f"  {'a = sum(min(p, q))':>20} {'chain (K=6)':>12} {'tree (2x3)':>11} {'traversal':>10}")
    for target in (0.3, 0.5, 0.6, 0.7, 0.8, 0.9):
        a, chain, tree, traversal = acceptance(target, rows, seed=int(target * 100))
        print(f"  {a:>20.2f} {chain:>12.3f} {tree:>11.3f} {traversal:>10.3f}")
    blocks = 20 if args.quick else 300
    print(f"\nExpected accepted length on the n-gram models ({blocks} drafted trees per shape):")
    print(f"  {'shape':30} {'token':>7} {'traversal':>10} {'gain':>6}")
    for name, token, traversal in ngram_gain(blocks, seed=2):
        print(f"  {name:30} {token:7.3f} {traversal:10.3f} {100 * (traversal / token - 1):5.1f}%")
    if args.quick:
        timing(batch=4, vocab=4096, repeats=3)
        sampled_timing(batch=4, vocab=4096, repeats=3)
    else:
        timing(batch=64, vocab=128256, repeats=7)
        sampled_timing(batch=64, vocab=128256, repeats=7)
        smollm2_timing(batch=16, repeats=15)


if __name__ == "__main__":
    main()
