"""Tree verification: many candidates per position (EAGLE, Medusa, SpecInfer, multi-draft)."""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from . import _native
from ._arrays import float_array, int_array, like_converter
from ._checks import check_flag
from ._errors import InputError
from ._options import TREE_METHODS, as_greedy, as_method, isolating, per_row, tree_out_buffers
from ._result import TreeVerification, finish_tree
from ._uniforms import CounterLike, RngLike, draw, seeded

__all__ = ["verify_tree", "verify_tree_logits"]


def verify_tree(
    node_token_ids: npt.ArrayLike,
    parent_ids: npt.ArrayLike,
    target_probs: npt.ArrayLike,
    draft_probs: npt.ArrayLike | None = None,
    *,
    uniforms: npt.ArrayLike | None = None,
    recovery_uniforms: npt.ArrayLike | None = None,
    rng: RngLike = None,
    seeds: CounterLike = None,
    offsets: CounterLike = None,
    greedy: bool | npt.ArrayLike = False,
    like: Any = None,
    method: Literal["token", "traversal"] = "token",
    errors: Literal["raise", "isolate"] = "raise",
    out: TreeVerification | tuple[Any, ...] | None = None,
) -> TreeVerification:
    """Verify a tree of drafted tokens by multi-round rejection sampling.

    Per row, starting at the root with ``P`` its target row: the children of the
    current node are tried in index order; child ``c`` with token ``x`` is
    accepted by the chain rule applied to ``P(x) / S`` and ``q_c(x)`` with
    uniform ``uniforms[b, c]`` (``S = 1`` for a target row, used as given like
    :func:`verify` does). On acceptance the walk moves to ``c`` and ``P`` becomes
    its target row; on rejection ``P = max(0, P / S - q_c)``, ``S = sum(P)``, and
    the next child is tried. When no child is accepted, one token is sampled
    from ``P`` (from the node's target row if ``P`` sums to 0); at a leaf, the
    bonus token is sampled from the leaf's target row. The output follows the
    target exactly; a tree that is a single path gives :func:`verify`'s result.

    Parameters
    ----------
    node_token_ids : int array ``[B, N]``
        Node ``n``'s token; node 0 is the root (the last committed token, ignored).
    parent_ids : int array ``[B, N]`` or ``[N]`` (shared by all rows)
        ``parent_ids[b, 0] = -1``; a node ``n >= 1`` has ``0 <= parent < n``, or
        ``-1`` for padding.
    target_probs : float array ``[B, N, V]``
        Row ``n``: the target's distribution of the token after node ``n``.
    draft_probs : float array ``[B, N, V]``, optional
        Row ``c``: the distribution child ``c``'s token was drawn from (row 0
        unused). ``None``: deterministic proposals (``q`` one-hot at the token),
        e.g. the top-``m`` tokens of a draft.
    uniforms : float array ``[B, N]``, optional
        Entry ``c`` is used when child ``c`` is tried. Drawn from ``rng`` if missing.
    recovery_uniforms : float array ``[B]``, optional
        The draw of the replacement or bonus token. Drawn from ``rng`` if missing.
    rng : None, int, Generator, or a sequence of ``B`` Generators
        Draws ``uniforms = g.random((B, N))`` then ``recovery_uniforms = g.random(B)``;
        with one Generator per row, row ``b`` draws its ``N`` uniforms then its
        recovery uniform from ``rng[b]``, so its result does not depend on the
        other rows (as for :func:`verify`).
    seeds, offsets : int arrays ``[B]`` (``offsets`` also one int), optional
        Counter-based uniforms instead of ``uniforms``/``recovery_uniforms``/``rng``:
        ``counter_uniforms(seeds, offsets, N)``, so node ``c``'s draw is Philox
        stream 0 at index ``c``. A row's result then depends only on its own
        seed, offset and rows, as for :func:`verify`.
    greedy : bool or bool array ``[B]``
        Rows verified by argmax: accept the first child whose token is the argmax
        of the current node's target row; otherwise emit that argmax.
    like : array or tensor, optional
        The framework of the results, as for :func:`verify`.
    method : ``"token"`` or ``"traversal"``
        ``"token"`` (default): top-down multi-round rejection sampling, a child
        tried with its own ratio ``p/q``. ``"traversal"``: traversal verification
        (Weng et al., NeurIPS 2025): the tree is visited leaves first (post-order,
        children in index order), each node tried with the acceptance rate of its
        whole path, and a rejected node's siblings continue from the residual; it
        is lossless and, on a chain, exactly ``verify(method="block")``. Row ``c``
        of ``draft_probs`` must be the distribution child ``c`` was drawn from
        (for siblings drawn without replacement, the parent's distribution with
        the earlier siblings removed and renormalised). See docs/spec.md
        section 7.6 and docs/methods.md.
    errors : ``"raise"`` or ``"isolate"``
        ``"raise"`` (default): the first bad row fails the call. ``"isolate"``: a
        row with a bad value (its parent links, a token, a uniform, a probability
        it reads) is set aside: its error is in ``result.errors[b]``, its tokens
        and nodes are ``-1`` and its counts 0; the other rows are verified as in a
        batch without it, and ``D`` is their deepest path. A ``[N]`` ``parent_ids``
        shared by every row is checked once, and its error raises.
    out : TreeVerification or tuple, optional
        Buffers for the result, reused across calls: ``(output_token_ids [B, W+1],
        num_accepted [B], num_emitted [B] or None, accepted_node_ids [B, W])``,
        int64 and writeable, any width ``W >= D`` (the columns past a row's path
        are ``-1``), sharing no memory with an input or with each other.

    Returns
    -------
    TreeVerification
        ``output_token_ids [B, D+1]``, ``num_accepted [B]``, ``num_emitted [B]``,
        ``accepted_node_ids [B, D]`` (``-1`` padded; ``D`` the deepest path).

    Examples
    --------
    >>> import numpy as np, specaccept
    >>> # Root with two children (tokens 1 and 2); child 2 has a child (token 0).
    >>> parents = np.array([-1, 0, 0, 2])
    >>> tokens = np.array([[0, 1, 2, 0]])
    >>> p = np.array([[[0.0, 0.0, 1.0], [1, 0, 0], [1.0, 0.0, 0.0], [0, 1, 0]]])  # [1, N=4, V=3]
    >>> r = specaccept.verify_tree(tokens, parents, p, greedy=True)
    >>> r.output_token_ids.tolist(), r.accepted_node_ids.tolist()   # 1 rejected, 2 and 0 kept
    ([[2, 0, 1]], [[2, 3]])
    """
    convert = like_converter(like)
    rule = as_method(method, TREE_METHODS)
    ids, parents = _tree_arrays(node_token_ids, parent_ids)
    target = float_array(target_probs, "target_probs")
    draft = None if draft_probs is None else float_array(draft_probs, "draft_probs")
    greedy_rows = as_greedy(greedy)
    u = None if uniforms is None else float_array(uniforms, "uniforms")
    ru = None if recovery_uniforms is None else float_array(recovery_uniforms, "recovery_uniforms")
    u, ru = _tree_uniforms(ids, u, ru, rng, seeds, offsets, greedy_rows is not True)
    isolate = isolating(errors)
    buffers = tree_out_buffers(out)
    result = _native.verify_tree(
        ids, parents, target, draft, u, ru, greedy_rows, rule, buffers, isolate
    )
    return finish_tree(result, convert)


def _tree_arrays(node_token_ids: Any, parent_ids: Any) -> tuple[np.ndarray, np.ndarray]:
    """``node_token_ids [B, N]``, and ``parent_ids`` as ``[B, N]`` (a shared ``[N]``
    as a stride-0 view, no copy)."""
    ids = int_array(node_token_ids, "node_token_ids")
    if ids.ndim != 2:
        raise InputError(
            f"node_token_ids must be 2-D [B, N], got shape {ids.shape}", argument="node_token_ids"
        )
    parents = int_array(parent_ids, "parent_ids")
    if parents.ndim == 1 and parents.shape == ids.shape[1:]:
        parents = np.broadcast_to(parents, ids.shape)
    return ids, parents


def _tree_uniforms(
    ids: np.ndarray,
    u: Any,
    ru: Any,
    rng: RngLike,
    seeds: CounterLike,
    offsets: CounterLike,
    sampled: bool,
) -> tuple[Any, Any]:
    """The uniforms of a tree batch (docs/spec.md sections 4.3, 4.5, 4.6): given,
    counter-based, or drawn from ``rng`` when a row is sampled."""
    counter = seeded(seeds, offsets, ids.shape[0], ids.shape[1], u, ru, rng)
    if counter is not None:
        return counter
    if (u is None or ru is None) and sampled:
        # One Generator: g.random((B, N)) then g.random(B); B Generators: row b
        # draws its N uniforms, then its recovery uniform, from rng[b] (section 4.3).
        batch, nodes = ids.shape
        drawn_u, drawn_ru = draw(
            rng, batch, nodes, None, u is None, ru is None, "node_token_ids [B, N]"
        )
        return (drawn_u if u is None else u), (drawn_ru if ru is None else ru)
    return u, ru


def verify_tree_logits(
    node_token_ids: npt.ArrayLike,
    parent_ids: npt.ArrayLike,
    target_logits: npt.ArrayLike,
    draft_logits: npt.ArrayLike | None = None,
    *,
    temperature: float | npt.ArrayLike = 1.0,
    top_k: int | npt.ArrayLike = 0,
    top_p: float | npt.ArrayLike = 1.0,
    uniforms: npt.ArrayLike | None = None,
    recovery_uniforms: npt.ArrayLike | None = None,
    rng: RngLike = None,
    seeds: CounterLike = None,
    offsets: CounterLike = None,
    method: Literal["token", "traversal"] = "token",
    errors: Literal["raise", "isolate"] = "raise",
    out: TreeVerification | tuple[Any, ...] | None = None,
    like: Any = None,
    min_p: float | npt.ArrayLike = 0.0,
    min_p_last: bool = False,
) -> TreeVerification:
    """Verify a tree of drafted tokens from logits (EAGLE, Medusa, SpecInfer).

    The result is :func:`verify_tree` on the probabilities of
    :func:`verify_logits`' transform (temperature, softmax, min-p, top-k, top-p;
    per row), in float64: ``p_i = w_i / W`` of docs/spec.md section 8.2. At most the
    rows a tree row reads are transformed, the first time they are read: the
    target rows of the nodes its walk visits and the draft rows of the children
    it tries. On float16/bfloat16/float32 logits the token rule accepts a node's
    first child from float32 screens of the node's target row and the child's
    draft row (no filters) or from top-k's candidates. Without filters the token
    rule decides a node's only child as ``verify_logits`` decides a position
    (accepted, or the residual drawn, from certified float32 passes) and a
    node's children tried in turn (the rounds' residuals on the passes' kept
    terms, with proven bounds), traversal
    accepts its first leaf where the screens' bounds on the rates down to it
    prove it, and both methods draw a leaf's bonus with a certified pass. Each
    look is taken only where it proves the float64 outcome (section 7.7). Those
    rows are checked but not transformed, and the tokens are the same, bit for
    bit.
    A row with temperature 0 is greedy: at each node the first child
    whose token is the argmax of the raw logits is accepted (no transform).

    Parameters
    ----------
    node_token_ids, parent_ids
        As for :func:`verify_tree`.
    target_logits : float16/bfloat16/float32/float64 array ``[B, N, V]``
        Row ``n`` scores the token after node ``n``. ``-inf`` masks a token; NaN
        and ``+inf`` are errors.
    draft_logits : float array ``[B, N, V]``, optional
        Row ``c`` scores the distribution child ``c``'s token was drawn from,
        with the same transform (row 0 unused). ``None``: deterministic
        proposals (``q`` one-hot at the token).
    temperature, top_k, top_p, min_p : number or ``[B]``
        As for :func:`verify_logits`; temperature 0 makes the row greedy.
    uniforms, recovery_uniforms, rng, seeds, offsets, method, errors, out, like
        As for :func:`verify_tree`.
    min_p_last : bool
        As for :func:`verify_logits`.

    Returns
    -------
    TreeVerification

    Examples
    --------
    >>> import numpy as np, specaccept
    >>> parents = np.array([-1, 0, 0, 2])          # root -> {1, 2}; 2 -> 3
    >>> tokens = np.array([[0, 1, 2, 0]])
    >>> logits = np.log(np.array([[[0.1, 0.2, 0.7], [1, 1, 1], [0.8, 0.1, 0.1], [0.3, 0.6, 0.1]]]))
    >>> r = specaccept.verify_tree_logits(tokens, parents, logits, temperature=0.0)
    >>> r.output_token_ids.tolist(), r.accepted_node_ids.tolist()   # greedy: 2, then 0, then 1
    ([[2, 0, 1]], [[2, 3]])
    """
    convert = like_converter(like)
    rule = as_method(method, TREE_METHODS)
    isolate = isolating(errors)
    ids, parents = _tree_arrays(node_token_ids, parent_ids)
    target = float_array(target_logits, "target_logits")
    draft = None if draft_logits is None else float_array(draft_logits, "draft_logits")
    batch = ids.shape[0]
    temperatures = per_row(temperature, "temperature", batch, np.float64)
    top_ks = per_row(top_k, "top_k", batch, np.int64)
    top_ps = per_row(top_p, "top_p", batch, np.float64)
    min_ps = per_row(min_p, "min_p", batch, np.float64)
    last = check_flag(min_p_last, "min_p_last")
    u = None if uniforms is None else float_array(uniforms, "uniforms")
    ru = None if recovery_uniforms is None else float_array(recovery_uniforms, "recovery_uniforms")
    sampled = bool((temperatures != 0).any())
    u, ru = _tree_uniforms(ids, u, ru, rng, seeds, offsets, sampled)
    buffers = tree_out_buffers(out)
    result = _native.verify_tree_logits(
        ids,
        parents,
        target,
        draft,
        temperatures,
        top_ks,
        top_ps,
        u,
        ru,
        rule,
        buffers,
        isolate,
        min_ps,
        last,
    )
    return finish_tree(result, convert)
