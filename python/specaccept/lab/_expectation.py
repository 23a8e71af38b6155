"""The expected accepted length of each row given its drafts, in closed form.

A zero-variance way to compare verification methods on the same drafts: the
expectation of ``num_accepted`` over the uniforms, computed from the rows
(docs/spec.md section 6.4).
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import numpy.typing as npt

from .._arrays import float_array, int_array
from .._errors import InputError
from .._options import as_method

__all__ = ["expected_num_accepted", "expected_num_accepted_tree"]


def expected_num_accepted(
    draft_token_ids: npt.ArrayLike,
    target_probs: npt.ArrayLike,
    draft_probs: npt.ArrayLike | None = None,
    *,
    method: Literal["token", "block"] = "token",
    num_draft_tokens: npt.ArrayLike | None = None,
) -> npt.NDArray[np.float64]:
    """The expectation of ``num_accepted`` over the uniforms, given the drafts.

    For row ``b`` with ``k = k_b`` drafts ``x_t``, ``p_t = target_probs[b, t]``
    and ``q_t = draft_probs[b, t]`` (one-hot at ``x_t`` when ``None``):

    - ``"token"``: ``sum_{i=1..k} prod_{t<i} a_t``, with ``a_t`` the acceptance
      probability of position ``t``: 0 when ``p_t(x_t) = 0``, else
      ``min(1, p_t(x_t) / q_t(x_t))``;
    - ``"block"``: ``sum_{i=1..k} i * h_i * prod_{j>i} (1 - h_j)``, with the
      ``h_i`` of block verification (docs/spec.md section 2.6).

    Computed in float64 with NumPy (the sums of ``h_i`` in NumPy's order, so the
    last bits may differ from the ``h_i`` a verifier compares against).

    Parameters
    ----------
    draft_token_ids : int array ``[B, K]``
    target_probs : float array ``[B, K+1, V]``
    draft_probs : float array ``[B, K, V]``, optional
    method : ``"token"`` or ``"block"``
    num_draft_tokens : int array ``[B]``, optional
        Drafts per row, ``0 <= k_b <= K``.

    Returns
    -------
    ndarray of float64, shape ``[B]``

    Examples
    --------
    >>> import numpy as np, specaccept
    >>> ids = np.array([[0, 0], [0, 1], [1, 0], [1, 1]])   # every block of V = 2, k = 2
    >>> p = np.tile([1 / 3, 2 / 3], (4, 3, 1))
    >>> q = np.tile([2 / 3, 1 / 3], (4, 2, 1))
    >>> weights = np.array([4, 2, 2, 1]) / 9                # their draft probabilities
    >>> [round(float(weights @ specaccept.lab.expected_num_accepted(ids, p, q, method=m)), 6)
    ...  for m in ("token", "block")]                      # 10/9 and 11/9
    [1.111111, 1.222222]
    """
    rule = as_method(method)
    ids = int_array(draft_token_ids, "draft_token_ids")
    p = float_array(target_probs, "target_probs")
    q = None if draft_probs is None else float_array(draft_probs, "draft_probs")
    if ids.ndim != 2:
        raise InputError(
            f"draft_token_ids must be 2-D [B, K], got shape {ids.shape}", argument="draft_token_ids"
        )
    batch, k_max = ids.shape
    if p.ndim != 3 or p.shape[:2] != (batch, k_max + 1):
        raise InputError(
            f"target_probs: has shape {p.shape}, expected ({batch}, {k_max + 1}, V)",
            argument="target_probs",
        )
    vocab = p.shape[2]
    if q is not None and q.shape != (batch, k_max, vocab):
        raise InputError(
            f"draft_probs: has shape {q.shape}, expected {(batch, k_max, vocab)}",
            argument="draft_probs",
        )
    if num_draft_tokens is None:
        counts = np.full(batch, k_max, dtype=np.int64)
    else:
        counts = int_array(num_draft_tokens, "num_draft_tokens")
        if counts.shape != (batch,):
            raise InputError(
                f"num_draft_tokens: has shape {counts.shape}, expected ({batch},)",
                argument="num_draft_tokens",
            )
        bad = (counts < 0) | (counts > k_max)
        if bad.any():
            b = int(np.flatnonzero(bad)[0])
            raise InputError(
                f"num_draft_tokens[{b}] = {int(counts[b])} is outside [0, K] with K = {k_max}",
                argument="num_draft_tokens",
                index=(b,),
                row=b,
            )
    positions = np.arange(k_max)
    live = positions[None, :] < counts[:, None]  # [B, K]: position t < k_b
    safe_ids = np.where(live, ids, 0)
    out_of_range = live & ((ids < 0) | (ids >= vocab))
    if out_of_range.any():
        b, t = (int(i) for i in np.argwhere(out_of_range)[0])
        raise InputError(
            f"draft_token_ids[{b}, {t}] = {int(ids[b, t])} is outside [0, V) with V = {vocab}",
            argument="draft_token_ids",
            index=(b, t),
            row=b,
        )
    rows = np.arange(batch)[:, None]
    p_x = p[rows, positions[None, :], safe_ids].astype(np.float64)  # [B, K]
    q_x = (
        np.ones_like(p_x) if q is None else q[rows, positions[None, :], safe_ids].astype(np.float64)
    )
    _check_gathered(p_x, live, "target_probs", safe_ids)
    _check_gathered(q_x, live, "draft_probs", safe_ids)
    if rule == "token":
        with np.errstate(divide="ignore", invalid="ignore"):
            a = np.where(p_x == 0, 0.0, np.where(q_x <= p_x, 1.0, p_x / q_x))
        a = np.where(live, a, 0.0)
        return np.cumprod(a, axis=1).sum(axis=1) if k_max else np.zeros(batch)
    return _block_expectation(p, q, p_x, q_x, live, counts, safe_ids)


def _block_expectation(p, q, p_x, q_x, live, counts, ids) -> np.ndarray:
    batch, k_max = p_x.shape
    rho = np.ones((batch, k_max + 1))
    for t in range(k_max):
        previous = rho[:, t]
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.minimum(1.0, previous * p_x[:, t] / q_x[:, t])
        rho[:, t + 1] = np.where(
            (previous == 0) | (p_x[:, t] == 0), 0.0, np.where(q_x[:, t] == 0, 1.0, ratio)
        )
    h = np.zeros((batch, k_max + 1))  # h[:, i] for 1 <= i <= k_b; 0 past k_b
    for i in range(1, k_max):
        inner = live[:, i]  # i < k_b
        if q is None:
            z = rho[:, i] * (1.0 - p_x[:, i])
        else:
            weights = rho[:, i, None] * p[:, i].astype(np.float64) - q[:, i].astype(np.float64)
            z = np.maximum(weights, 0.0).sum(axis=1)
        denominator = (z + 1.0) - rho[:, i]
        with np.errstate(divide="ignore", invalid="ignore"):
            value = np.where(denominator == 0, 1.0, z / denominator)
        h[:, i] = np.where(inner, value, 0.0)
    rows = np.arange(batch)
    has_drafts = counts > 0
    h[rows[has_drafts], counts[has_drafts]] = rho[rows[has_drafts], counts[has_drafts]]
    # P(tau = i) = h_i * prod_{j > i} (1 - h_j): the products from the top down.
    survive = np.ones((batch, k_max + 2))
    for j in range(k_max, 0, -1):
        survive[:, j] = survive[:, j + 1] * (1.0 - h[:, j])
    index = np.arange(k_max + 1)
    return (index[None, 1:] * h[:, 1:] * survive[:, 2:]).sum(axis=1)


def _check_gathered(values, live, name, ids) -> None:
    bad = live & ~((values >= 0) & (values <= 1))
    if bad.any():
        b, t = (int(i) for i in np.argwhere(bad)[0])
        raise InputError(
            f"{name}[{b}, {t}, {int(ids[b, t])}] = {values[b, t]!r}: the probability of a "
            "drafted token must lie in [0, 1]",
            argument=name,
            index=(b, t, int(ids[b, t])),
            row=b,
        )


def expected_num_accepted_tree(
    node_token_ids: npt.ArrayLike,
    parent_ids: npt.ArrayLike,
    target_probs: npt.ArrayLike,
    draft_probs: npt.ArrayLike | None = None,
    *,
    method: Literal["token", "traversal"] = "token",
) -> npt.NDArray[np.float64]:
    """The expectation of ``verify_tree``'s ``num_accepted`` over the uniforms, given the tree.

    An exact recursion over the tree (docs/spec.md sections 7.3 and 7.6), in
    float64 with NumPy: ``"token"`` tries a node's children in order, each
    accepted with ``min(1, P(x) / q_c(x))`` against the current residual ``P``;
    ``"traversal"`` follows the traversal rule's path rates and residuals. Greedy
    rows are not modelled (their length is not random).

    Parameters
    ----------
    node_token_ids : int array ``[B, N]``
    parent_ids : int array ``[B, N]`` or ``[N]``
    target_probs : float array ``[B, N, V]``
    draft_probs : float array ``[B, N, V]``, optional
    method : ``"token"`` or ``"traversal"``

    Returns
    -------
    ndarray of float64, shape ``[B]``

    Examples
    --------
    >>> import numpy as np, specaccept
    >>> ids, parents = np.array([[0, 0, 1]]), np.array([-1, 0, 1])    # a chain of 2
    >>> p = np.tile([1 / 3, 2 / 3], (1, 3, 1))
    >>> q = np.tile([2 / 3, 1 / 3], (1, 3, 1))
    >>> tree = specaccept.lab.expected_num_accepted_tree(ids, parents, p, q, method="traversal")
    >>> chain = specaccept.lab.expected_num_accepted(ids[:, 1:], p, q[:, 1:], method="block")
    >>> bool(np.isclose(tree[0], chain[0]))
    True
    """
    rule = as_method(method, ("token", "traversal"))
    ids = int_array(node_token_ids, "node_token_ids")
    parents = int_array(parent_ids, "parent_ids")
    p = float_array(target_probs, "target_probs")
    q = None if draft_probs is None else float_array(draft_probs, "draft_probs")
    if ids.ndim != 2 or ids.shape[1] == 0:
        raise InputError(
            f"node_token_ids must be 2-D [B, N] with N >= 1, got shape {ids.shape}",
            argument="node_token_ids",
        )
    batch, nodes = ids.shape
    if parents.ndim == 1 and parents.shape == (nodes,):
        parents = np.broadcast_to(parents, ids.shape)
    if parents.shape != (batch, nodes):
        raise InputError(
            f"parent_ids: has shape {parents.shape}, expected ({batch}, {nodes}) or ({nodes},)",
            argument="parent_ids",
        )
    if p.ndim != 3 or p.shape[:2] != (batch, nodes):
        raise InputError(
            f"target_probs: has shape {p.shape}, expected ({batch}, {nodes}, V)",
            argument="target_probs",
        )
    vocab = p.shape[2]
    if q is not None and q.shape != p.shape:
        raise InputError(
            f"draft_probs: has shape {q.shape}, expected {p.shape}", argument="draft_probs"
        )
    out = np.zeros(batch)
    for b in range(batch):
        children: list[list[int]] = [[] for _ in range(nodes)]
        depth = [0] * nodes
        if int(parents[b, 0]) != -1:
            raise InputError(
                f"parent_ids[{b}, 0] = {int(parents[b, 0])}: the root's parent must be -1",
                argument="parent_ids",
                index=(b, 0),
                row=b,
            )
        for n in range(1, nodes):
            parent = int(parents[b, n])
            if parent == -1:
                depth[n] = -1
                continue
            if not 0 <= parent < n or depth[parent] == -1:
                raise InputError(
                    f"parent_ids[{b}, {n}] = {parent}: a parent must be an earlier node",
                    argument="parent_ids",
                    index=(b, n),
                    row=b,
                )
            depth[n] = depth[parent] + 1
            x = int(ids[b, n])
            if not 0 <= x < vocab:
                raise InputError(
                    f"node_token_ids[{b}, {n}] = {x} is outside [0, V) with V = {vocab}",
                    argument="node_token_ids",
                    index=(b, n),
                    row=b,
                )
            children[parent].append(n)
        if max(depth) > _MAX_DEPTH:
            raise InputError(
                f"parent_ids: row {b} has a path of {max(depth)} nodes; the recursion "
                f"handles at most {_MAX_DEPTH}",
                argument="parent_ids",
                row=b,
            )
        rows = _TreeRows(p[b], None if q is None else q[b], ids[b], children)
        out[b] = rows.token(0) if rule == "token" else rows.traversal(0, 1.0, 0)[1]
    return out


# Deeper trees would need Python frames past the interpreter's limit.
_MAX_DEPTH = 200


class _TreeRows:
    """One row's tree, for the recursions of expected_num_accepted_tree."""

    def __init__(self, p, q, ids, children):
        self.p, self.q, self.ids, self.children = p, q, ids, children

    def draft(self, c: int) -> np.ndarray:
        if self.q is not None:
            return self.q[c].astype(np.float64)
        row = np.zeros(self.p.shape[1])
        row[int(self.ids[c])] = 1.0
        return row

    def token(self, v: int) -> float:
        """Expected accepted length below ``v``, top-down (SpecInfer's rule)."""
        residual = self.p[v].astype(np.float64)
        alive, expected = 1.0, 0.0
        for c in self.children[v]:
            x, q = int(self.ids[c]), self.draft(c)
            p_x, q_x = residual[x], q[x]
            accept = 0.0 if p_x == 0 else (1.0 if q_x <= p_x else p_x / q_x)
            expected += alive * accept * (1.0 + self.token(c))
            alive *= 1.0 - accept
            weights = np.maximum(residual - q, 0.0)
            total = weights.sum()
            residual = weights / total if total > 0 else weights
        return expected

    def traversal(self, v: int, rate: float, depth: int) -> tuple[float, float]:
        """(probability the subtree of ``v`` accepts, expected accepted length) entering
        ``v`` with ``rate``."""
        weights, total, a = self.p[v].astype(np.float64), 1.0, rate
        rejected, accepted, expected = 1.0, 0.0, 0.0
        for c in self.children[v]:
            x, q = int(self.ids[c]), self.draft(c)
            share = weights[x] / total if total > 0 else 0.0
            child_rate = (
                0.0 if a == 0 or share == 0 else (1.0 if q[x] == 0 else min(1.0, a * share / q[x]))
            )
            taken, length = self.traversal(c, child_rate, depth + 1)
            expected += rejected * length
            accepted += rejected * taken
            rejected *= 1.0 - taken
            weights = np.maximum(a * (weights / total if total > 0 else 0.0) - q, 0.0)
            total = float(weights.sum())
            denominator = (total + 1.0) - a
            a = 1.0 if v == 0 or denominator == 0 else total / denominator
        keep = rejected * a
        return accepted + keep, expected + keep * depth
