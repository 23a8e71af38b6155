"""``python -m specaccept compare``: the verifier laboratory on the command line.

Steps come from the built-in n-gram models (a bigram draft for a 4-gram target,
contexts drawn from the shipped novel) at several ``K``, or from a saved
``.npz`` (``--from``). Every chain method runs on the same steps and uniforms
(:func:`specaccept.compare_methods`); on the built-in models, trees of equal
node budgets are also compared, token against traversal verification, by their
exact expected accepted length (:func:`specaccept.expected_num_accepted_tree`).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import zipfile
from typing import Any

import numpy as np

from ._compare import MethodComparison, compare_methods
from ._errors import InputError
from ._expectation import expected_num_accepted_tree
from ._progress import progress_bar

__all__ = ["NPZ_ARRAYS", "TREE_SHAPES", "add_parser"]

#: The arrays a ``--from`` file holds (``np.savez``): required, then optional.
NPZ_ARRAYS = {
    "draft_token_ids": "int [N, K]: the drafted tokens of N logged steps",
    "target_probs": "float [N, K+1, V]: the target's rows at each drafted position and after",
    "draft_probs": "float [N, K, V], optional: the laws the drafts were sampled from",
    "num_draft_tokens": "int [N], optional: drafts per step when they differ",
}

#: Tree shapes with 6 drafted nodes each (parents, parents before children).
TREE_SHAPES = {
    "chain of 6": [-1, 0, 1, 2, 3, 4, 5],
    "2 chains of 3": [-1, 0, 0, 1, 2, 3, 4],
    "3 chains of 2": [-1, 0, 0, 0, 1, 2, 3],
    "binary, depth 2": [-1, 0, 0, 1, 1, 2, 2],
    "6 at the root": [-1, 0, 0, 0, 0, 0, 0],
}


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
    compare.add_argument("--plot", type=writable, metavar="FILE.png", help="write the plots")
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
    methods: list[Any] = [
        "token",
        "block",
        ("typical", {"epsilon": args.epsilon, "delta": args.delta}),
    ]
    if args.synthetic is not None:
        methods.append(("synthetic", {"acceptance_rate": args.synthetic}))
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


def _write(args: argparse.Namespace, chain, trees) -> None:
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
        plot(rows, args.plot)


def plot(rows: list[dict[str, Any]], path: str) -> None:
    """Accepted drafts against K, one line per method; and tokens per call against
    TV distance (the fidelity a lossy method trades for speed)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"matplotlib is not installed: no plot written to {path}", file=sys.stderr)
        return
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for method in dict.fromkeys(r["method"] for r in rows):
        mine = [r for r in rows if r["method"] == method]
        lossy = not mine[0]["lossless"]
        label = f"{method} (lossy)" if lossy else method
        left.plot(
            [r["num_draft"] for r in mine],
            [r["mean_accepted"] for r in mine],
            "--o" if lossy else "-o",
            label=label,
        )
        right.scatter(
            [r["tv_distance"] for r in mine], [r["tokens_per_call"] for r in mine], label=label
        )
    left.set(
        xlabel="K (drafts per step)", ylabel="accepted drafts per step", title="Accepted length"
    )
    right.set(
        xlabel="TV distance of the next token to the target",
        ylabel="tokens per target call",
        title="Speed against fidelity",
    )
    for axis in (left, right):
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def load_steps(path: str) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]:
    """The arrays of a ``--from`` file, checked, with messages that name them."""
    try:
        data = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise InputError(f"{path}: no such file", argument="from") from None
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as error:
        raise InputError(f"{path} is not an .npz file: {error}", argument="from") from None
    if not isinstance(data, np.lib.npyio.NpzFile):
        raise InputError(f"{path} holds one array, not an .npz of named arrays", argument="from")
    with data:
        for name in ("draft_token_ids", "target_probs"):
            if name not in data.files:
                raise InputError(
                    f"{path} has no {name} ({NPZ_ARRAYS[name]}); it holds {sorted(data.files)}",
                    argument="from",
                )
        try:
            arrays = {name: data[name] for name in NPZ_ARRAYS if name in data.files}
        except ValueError as error:
            raise InputError(f"{path}: {error}", argument="from") from None
    ids, p = arrays["draft_token_ids"], arrays["target_probs"]
    if ids.dtype.kind not in "iu" or ids.ndim != 2:
        raise InputError(
            f"{path}: draft_token_ids must be an int array [N, K], got {ids.dtype} {ids.shape}",
            argument="from",
        )
    if p.dtype.kind != "f" or p.ndim != 3 or p.shape[:2] != (ids.shape[0], ids.shape[1] + 1):
        raise InputError(
            f"{path}: target_probs must be a float array [N, K+1, V] = "
            f"[{ids.shape[0]}, {ids.shape[1] + 1}, V], got {p.dtype} {p.shape}",
            argument="from",
        )
    return ids, p, arrays.get("draft_probs"), arrays.get("num_draft_tokens")


def builtin_steps(ks: list[int], steps: int, seed: int) -> dict[int | None, Any]:
    """``steps`` blocks of each ``K`` drafted by the bigram model for the 4-gram
    target, after contexts of 8 tokens drawn from the novel."""
    from .ngram import builtin_models, builtin_text, drafted_block

    target, draft, vocab = builtin_models()
    text = vocab.encode(builtin_text()[:200_000])
    rng = np.random.default_rng(seed)
    out: dict[int | None, Any] = {}
    for k in ks:
        blocks = [
            drafted_block(target, draft, text[int(s) - 8 : int(s)], k, rng)
            for s in rng.integers(8, len(text) - 8, size=steps)
        ]
        out[k] = (
            np.concatenate([b[0] for b in blocks]),
            np.concatenate([b[1] for b in blocks]),
            np.concatenate([b[2] for b in blocks]),
            None,
        )
    return out


def builtin_trees(count: int, seed: int) -> list[dict[str, Any]]:
    """Token against traversal verification on drafted trees of :data:`TREE_SHAPES`:
    the exact expected accepted length, averaged over ``count`` trees per shape."""
    from .ngram import builtin_models, builtin_text, drafted_tree

    target, draft, vocab = builtin_models()
    text = vocab.encode(builtin_text()[:200_000])
    rng = np.random.default_rng(seed + 1)
    rows = []
    for shape, parents in TREE_SHAPES.items():
        totals = {"token": 0.0, "traversal": 0.0}
        for s in rng.integers(8, len(text) - 8, size=count):
            ids, p, q = drafted_tree(target, draft, text[int(s) - 8 : int(s)], parents, rng)
            tree = (ids, np.array(parents), p, q)
            totals["token"] += float(expected_num_accepted_tree(*tree, method="token")[0])
            totals["traversal"] += float(expected_num_accepted_tree(*tree, method="traversal")[0])
        rows.append(
            {
                "shape": shape,
                "nodes": len(parents) - 1,
                "token": totals["token"] / count,
                "traversal": totals["traversal"] / count,
            }
        )
    return rows
