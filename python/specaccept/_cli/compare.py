"""``python -m specaccept compare``: the verifier laboratory on the command line.

Steps come from the built-in n-gram models (a bigram draft for a 4-gram target,
contexts drawn from the shipped novel) at several ``K``, or from a saved
``.npz`` (``--from``). Every chain method runs on the same steps and uniforms
(:func:`specaccept.lab.compare_methods`); on the built-in models, trees of equal
node budgets are also compared, token against traversal verification, by their
exact expected accepted length (:func:`specaccept.lab.expected_num_accepted_tree`).
``--plot`` draws the numbers (``plot.py``)."""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
from typing import Any

from .._errors import InputError
from ..lab import MethodComparison, compare_methods
from ..lab._steps import NPZ_ARRAYS, builtin_steps, builtin_trees, load_steps
from ..lossy import Synthetic, Typical
from .plot import draw
from .progress import progress_bar


def add_parser(commands: Any, int_in: Any, writable: Any) -> None:
    """Registers ``compare`` on the command line's subparsers."""
    compare = commands.add_parser(
        "compare",
        help="every verification method on the same drafts, exact and lossy",
        description="Every verification method on the same drafts and uniforms: accepted "
        "drafts with intervals, exact expectations, and the next token's distance to the "
        "target for the lossy methods (docs/methods.md). Arrays of a --from file: "
        + "; ".join(f"{k} ({v})" for k, v in NPZ_ARRAYS.items())
        + ".",
    )
    compare.add_argument(
        "--from",
        dest="source",
        metavar="FILE.npz",
        help="logged steps instead of the n-gram models",
    )
    compare.add_argument(
        "--k", type=_ks, default=[2, 4, 6], help="draft lengths, comma-separated (default 2,4,6)"
    )
    compare.add_argument(
        "--steps", type=int_in(1, 100_000), default=200, help="steps per K (default 200)"
    )
    compare.add_argument(
        "--samples", type=int_in(2, 100_000), default=50, help="runs per step (default 50)"
    )
    compare.add_argument("--epsilon", type=float, default=0.09, help="typical's epsilon (0.09)")
    compare.add_argument("--delta", type=float, default=0.3, help="typical's delta (0.3)")
    compare.add_argument(
        "--synthetic", type=float, metavar="RATE", help="also run synthetic acceptance at RATE"
    )
    compare.add_argument("--seed", type=int_in(0), default=0, help="random seed (default 0)")
    compare.add_argument("--csv", type=writable, metavar="FILE", help="write the chain table")
    compare.add_argument("--json", type=writable, metavar="FILE", help="write every number")
    compare.add_argument(
        "--plot",
        type=writable,
        metavar="FILE.png",
        help="draw the comparison (needs matplotlib): at one K the law of the accepted "
        "length, acceptance per draft position, speed against fidelity; at several K "
        "accepted length against K",
    )
    compare.set_defaults(run=run)


def _ks(text: str) -> list[int]:
    try:
        ks = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected K values like 2,4,6, got {text!r}") from None
    if not ks or ks[0] < 1 or ks[-1] > 64:
        raise argparse.ArgumentTypeError("each K must lie in [1, 64]")
    return ks


def _methods(args: argparse.Namespace) -> list[Any]:
    methods: list[Any] = ["token", "block", Typical(epsilon=args.epsilon, delta=args.delta)]
    if args.synthetic is not None:
        methods.append(Synthetic(rate=args.synthetic))
    return methods


def run(args: argparse.Namespace) -> int:
    try:
        steps: dict[int | None, Any]
        if args.source is not None:
            steps = {None: load_steps(args.source)}
        else:
            steps = builtin_steps(args.k, args.steps, args.seed)
        chain: list[tuple[int, MethodComparison]] = []
        for k, (ids, p, q, counts) in steps.items():
            label = f"K = {ids.shape[1]}" if k is None else f"K = {k}"
            comparison = compare_methods(
                ids,
                p,
                q,
                methods=_methods(args),
                num_draft_tokens=counts,
                samples=args.samples,
                seed=args.seed,
                progress=progress_bar(f"compare {label}"),
            )
            chain.append((ids.shape[1], comparison))
        trees = builtin_trees(args.steps, args.seed) if args.source is None else []
    except (InputError, ValueError, TypeError) as error:
        print(f"python -m specaccept compare: error: {error}", file=sys.stderr)
        return 2
    source = args.source or "the built-in n-gram models (4-gram target, bigram draft)"
    print(f"Steps from {source}; {args.samples} runs per step, the same uniforms for every method.")
    for k, comparison in chain:
        print(f"\nChains, K = {k} ({comparison.steps} steps):\n")
        print(comparison.table())
    if trees:
        print(
            f"\nTrees of 6 drafted nodes ({args.steps} drafted trees per shape; exact expectations):\n"
        )
        print("| shape | token | traversal | gain |")
        print("|---|---:|---:|---:|")
        for row in trees:
            print(
                f"| {row['shape']} | {row['token']:.3f} | {row['traversal']:.3f} "
                f"| {row['traversal'] / row['token'] - 1:+.1%} |"
            )
    print("\nLossy methods do not follow the target; TV is their next-token distance to it.")
    _write(args, chain, trees)
    return 0


def _rows(chain: list[tuple[int, MethodComparison]]) -> list[dict[str, Any]]:
    return [{"num_draft": k, **row} for k, comparison in chain for row in comparison.to_dicts()]


def _write(
    args: argparse.Namespace,
    chain: list[tuple[int, MethodComparison]],
    trees: list[dict[str, Any]],
) -> None:
    rows = _rows(chain)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"source": args.source, "chain": rows, "tree": trees}, f, indent=2)
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    if args.plot:
        source = (
            os.path.basename(args.source)
            if args.source is not None
            else "Built-in n-gram models (4-gram target, bigram draft)"
        )
        draw(chain, args.plot, source=source)
