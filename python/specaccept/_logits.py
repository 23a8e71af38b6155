"""Verification from logits: temperature, top-k, top-p and min-p applied only where read."""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from . import _native
from ._api import Method
from ._arrays import float_array, int_array, like_converter
from ._checks import check_flag
from ._errors import InputError
from ._options import chain_rule, isolating, per_row
from ._result import Verification, finish
from ._uniforms import CounterLike, RngLike, draw_missing

__all__ = ["verify_logits"]


def verify_logits(
    draft_token_ids: npt.ArrayLike,
    target_logits: npt.ArrayLike,
    draft_logits: npt.ArrayLike | None = None,
    *,
    temperature: float | npt.ArrayLike = 1.0,
    top_k: int | npt.ArrayLike = 0,
    top_p: float | npt.ArrayLike = 1.0,
    num_draft_tokens: npt.ArrayLike | None = None,
    uniforms: npt.ArrayLike | None = None,
    recovery_uniforms: npt.ArrayLike | None = None,
    rng: RngLike = None,
    seeds: CounterLike = None,
    offsets: CounterLike = None,
    like: Any = None,
    errors: Literal["raise", "isolate"] = "raise",
    method: Method = "token",
    draft_token_probs: npt.ArrayLike | None = None,
    min_p: float | npt.ArrayLike = 0.0,
    min_p_last: bool = False,
) -> Verification:
    """Verify drafted tokens from logits, with the engine's sampling transform.

    The result is :func:`verify` on ``transform(target_logits)`` and
    ``transform(draft_logits)``, where ``transform`` is, in order: divide by the
    temperature; softmax; min-p keeps every entry of probability at least
    ``min_p`` times the largest; top-k keeps every entry at least the k-th largest
    (ties kept) and renormalises; top-p keeps, in decreasing order (ties by lower
    index), the shortest prefix whose mass reaches ``top_p`` plus every entry tied
    with the last one kept, and renormalises. That is vLLM's order; with
    ``min_p_last=True`` min-p comes after top-p instead (transformers' order: the
    two differ only where both min-p and top-p are on). Only the rows a row reads are transformed
    (positions up to its first rejection, and the bonus row), with selection rather
    than a sort, and a vectorised ``exp``. Without filters, a float16/bfloat16/float32
    position is usually proven accepted by a cheaper float32 pass with certified
    error bounds, and the float64 transform runs only where those bounds cannot
    decide (``u`` within about ``5e-4`` of ``p/q``, or a rejection): the tokens
    are the same either way. With top-k on, an accepted position computes the
    ``exp`` of top-k's few candidates only, with the same results.

    The same transform is applied to the draft logits: the drafts must have been
    sampled from exactly that transformed draft distribution. Sampling the draft
    with other settings (say, without top-k) while verifying with these makes
    ``q`` wrong, and the output no longer follows the target.

    Parameters
    ----------
    draft_token_ids : int array ``[B, K]``
    target_logits : float16/bfloat16/float32/float64 array ``[B, K+1, V]``
        ``-inf`` masks a token; NaN and ``+inf`` are errors.
    draft_logits : float array ``[B, K, V]``, optional
        ``None``: deterministic drafts (``q`` one-hot at the draft).
    temperature : float or ``[B]``
        ``0`` for a greedy row (accept iff the draft is the argmax), else at least
        the smallest normal float64 (``2.2e-308``; below it ``1 / T`` overflows).
        A tiny temperature approaches greedy without overflow: the softmax is
        computed as ``exp((l - max l) / T)``.
    top_k : int or ``[B]``
        ``0`` switches it off.
    top_p : float or ``[B]``
        In ``(0, 1]``; ``1.0`` switches it off.
    num_draft_tokens, uniforms, recovery_uniforms, rng, seeds, offsets, like
        As for :func:`verify`.

    errors : ``"raise"`` or ``"isolate"``
        As for :func:`verify`: with ``"isolate"`` a row with a bad value (its
        logits, temperature, top-k, top-p, min-p, ids, count or uniforms) is marked in
        ``result.errors`` and the other rows are verified as without it.
    method : ``"token"`` or ``"block"``
        As for :func:`verify`. ``"block"`` needs every position's exact
        ``p_t(x_t)`` and ``q_t(x_t)``, so each sampled row runs the float64
        transform on all its rows (the screen and the top-k candidate path,
        which prove token decisions, are not used), and, going down from the
        last position, transforms one more pair of rows per step. The **lossy**
        :mod:`specaccept.lossy` values (``Typical``, ``Synthetic``) apply
        :func:`verify`'s rules to the transformed target rows; typical reads
        every target row up to the stop, and neither reads the draft logits.
    draft_token_probs : float array ``[B, K]``, optional
        The drafter's own ``q_t(x_t)``: the probability it sampled each draft
        with (it has it: it drew ``x_t`` from that row). The token rule then
        uses these values, and an accepted position reads no draft row: about
        half the work of a row whose drafts are accepted. At a rejected
        position the draft row is read for the residual, and a value more
        than 1% (relative) or ``1e-6`` from the row's own is an
        :class:`InputError` (a different temperature, filter or position).
        Needs ``draft_logits`` and ``method="token"``. See docs/spec.md
        section 8.7.
    min_p : float or ``[B]``
        In ``[0, 1]``; ``0.0`` switches it off. Keeps the tokens whose
        probability (after the temperature) is at least ``min_p`` times the
        largest; ``1.0`` keeps only the most likely ones.
    min_p_last : bool
        ``False`` (vLLM's order): min-p before top-k and top-p, so top-p reaches
        ``top_p`` of what min-p kept. ``True`` (transformers' order): min-p after
        top-p. docs/spec.md section 8.2.

    Returns
    -------
    Verification

    Examples
    --------
    >>> import numpy as np, specaccept
    >>> logits = np.log(np.array([[[0.6, 0.3, 0.1], [0.2, 0.2, 0.6]]]))    # [1, K+1=2, V=3]
    >>> r = specaccept.verify_logits(np.array([[2]]), logits, top_k=2, rng=0)
    >>> r.tokens(0).tolist()   # token 2 is outside the top 2 at position 0: never kept
    [0]
    """
    convert = like_converter(like)
    isolate = isolating(errors)
    ids = int_array(draft_token_ids, "draft_token_ids")
    rule = chain_rule(method, ids.shape[1] if ids.ndim == 2 else 0)
    target = float_array(target_logits, "target_logits")
    draft = None if draft_logits is None else float_array(draft_logits, "draft_logits")
    if ids.ndim != 2:
        raise InputError(
            f"draft_token_ids must be 2-D [B, K], got shape {ids.shape}", argument="draft_token_ids"
        )
    batch = ids.shape[0]
    temperatures = per_row(temperature, "temperature", batch, np.float64)
    top_ks = per_row(top_k, "top_k", batch, np.int64)
    top_ps = per_row(top_p, "top_p", batch, np.float64)
    min_ps = per_row(min_p, "min_p", batch, np.float64)
    last = check_flag(min_p_last, "min_p_last")
    counts = None if num_draft_tokens is None else int_array(num_draft_tokens, "num_draft_tokens")
    u = None if uniforms is None else float_array(uniforms, "uniforms")
    ru = None if recovery_uniforms is None else float_array(recovery_uniforms, "recovery_uniforms")
    if seeds is not None or offsets is not None:
        u, ru = draw_missing(rng, ids, counts, u, ru, seeds, offsets)
    elif (u is None or ru is None) and (temperatures != 0).any():
        u, ru = draw_missing(rng, ids, counts, u, ru)
    given_q = (
        None if draft_token_probs is None else float_array(draft_token_probs, "draft_token_probs")
    )
    result = _native.verify_logits(
        ids,
        target,
        draft,
        temperatures,
        top_ks,
        top_ps,
        counts,
        u,
        ru,
        isolate,
        rule,
        given_q,
        min_ps,
        last,
    )
    return finish(result, convert)
