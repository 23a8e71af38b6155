"""Steps for the laboratory: the ``.npz`` files ``python -m specaccept compare
--from`` reads (and ``generate(..., record=)`` writes), and steps drafted by the
built-in n-gram models."""

from __future__ import annotations

import zipfile
from typing import Any

import numpy as np

from .._errors import InputError
from ._expectation import expected_num_accepted_tree

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
    from ..ngram import builtin_models, builtin_text, drafted_block

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
    from ..ngram import builtin_models, builtin_text, drafted_tree

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
