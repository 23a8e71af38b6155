"""The public chain functions (``verify``, ``verify_greedy``) and the
elementwise primitives: arguments normalised in Python (``_arrays``,
``_options``, ``_uniforms``), the work in Rust (``specaccept._native``), which
reads every array in place and checks shapes and the values it reads.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from . import _native
from ._arrays import bool_array, float_array, int_array, like_converter
from ._errors import InputError
from ._options import as_greedy, chain_rule, isolating, out_buffers
from ._result import Verification, finish
from ._uniforms import CounterLike, RngLike, draw_missing, draw_uniforms
from .lossy import Synthetic, Typical

#: What ``method=`` takes: a method's name, or a :mod:`specaccept.lossy` value.
Method = Literal["token", "block", "typical"] | Typical | Synthetic

__all__ = [
    "Method",
    "RngLike",
    "acceptance_mask",
    "acceptance_rate",
    "accepted_prefix_length",
    "rejection_probability",
    "verify",
    "verify_greedy",
]


def verify(
    draft_token_ids: npt.ArrayLike,
    target_probs: npt.ArrayLike,
    draft_probs: npt.ArrayLike | None = None,
    *,
    num_draft_tokens: npt.ArrayLike | None = None,
    uniforms: npt.ArrayLike | None = None,
    recovery_uniforms: npt.ArrayLike | None = None,
    rng: RngLike = None,
    seeds: CounterLike = None,
    offsets: CounterLike = None,
    greedy: bool | npt.ArrayLike = False,
    out: Verification | tuple[npt.NDArray[np.int64], ...] | None = None,
    like: Any = None,
    errors: Literal["raise", "isolate"] = "raise",
    method: Method = "token",
) -> Verification:
    """Verify drafted tokens against the target model (speculative sampling).

    Per row ``b``, position ``t`` with drafted token ``x_t`` is accepted outright
    when ``q(x_t) <= p(x_t)`` (and ``p(x_t) > 0``), otherwise accepted iff
    ``u_t < p(x_t) / q(x_t)``; ``p(x_t) == 0`` always rejects. The row stops at its
    first rejection ``n_b`` and emits ``x_0 .. x_{n_b-1}`` plus one token sampled
    from the residual ``max(0, p - q)`` at ``n_b``, or, when all ``k_b`` drafts
    are accepted, a bonus token from ``p`` at ``k_b``. The emitted tokens follow
    the target distribution exactly.

    Parameters
    ----------
    draft_token_ids : ndarray of int, shape ``[B, K]``
        The drafted tokens (int32/int64 read in place).
    target_probs : ndarray of float16/bfloat16/float32/float64, shape ``[B, K+1, V]``
        Target probabilities ``p`` at each draft position; row ``k_b`` is the
        bonus distribution. Rows need not sum to 1.
    draft_probs : ndarray of float16/bfloat16/float32/float64, shape ``[B, K, V]``, optional
        The probabilities ``q`` the drafts were sampled from. ``None``: the drafts
        are deterministic proposals (n-gram, prompt lookup, top-1 drafter), so
        ``q`` is one-hot at ``x_t``.
    num_draft_tokens : ndarray of int, shape ``[B]``, optional
        Ragged batches: row ``b`` has ``k_b <= K`` drafts; entries at positions
        ``>= k_b`` are ignored (any value, ``-1`` included).
    uniforms : ndarray of float, shape ``[B, K]``, optional
        The acceptance draws ``u_t`` in ``[0, 1)``. Drawn from ``rng`` if missing.
    recovery_uniforms : ndarray of float, shape ``[B]``, optional
        One more draw per row for the replacement or bonus sample. Drawn from
        ``rng`` if missing.
    rng : None, int, Generator or sequence of B Generators
        Where missing uniforms come from. One Generator (or a seed, or ``None`` for
        fresh entropy) draws ``uniforms = g.random((B, K))`` then
        ``recovery_uniforms = g.random(B)``. A sequence gives each row its own
        stream: row ``b`` draws ``g_b.random(k_b)`` then ``g_b.random()``, so a
        row's result does not depend on the rest of the batch. When ``greedy`` is
        the scalar ``True`` nothing is drawn.
    seeds, offsets : int arrays ``[B]`` (``offsets`` also one int), optional
        Counter-based uniforms instead of ``uniforms``/``recovery_uniforms``/``rng``
        (give both, and none of those): row ``b`` uses
        ``counter_uniforms(seeds, offsets, K)``, Philox4x32-10 keyed by its seed
        (a request's own, any value in ``[0, 2**64)``) at its offset (e.g. the
        request's step or token count). A row's tokens then depend only on its
        seed, offset and probability rows: not on the batch, the row's place in
        it, the thread count or earlier calls. See :func:`counter_uniforms`.
    greedy : bool or ndarray of bool, shape ``[B]``
        Rows verified by argmax: accept iff ``x_t == argmax p_t`` (first maximal
        index); the next token is the argmax too.
    out : Verification or tuple of int64 arrays, optional
        Buffers to write the result into instead of allocating:
        ``(output_token_ids [B, K+1], num_accepted [B])``, optionally with
        ``num_emitted [B]``, or a previous :class:`Verification` (e.g. from
        :meth:`Verification.empty`), whose arrays are then overwritten. They must
        be writeable int64 arrays that share no memory with an input or with each
        other. The returned :class:`Verification` holds these arrays. If the call
        raises, their contents are unspecified.
    like : array or tensor, optional
        Return the results in this object's framework (``torch.Tensor`` in, tensors
        out, as views of the same memory); default NumPy. Inputs may be NumPy
        arrays or any CPU array exporting DLPack or the buffer protocol (PyTorch,
        JAX, ...), read in place; arrays on an accelerator raise ``TypeError``.
    errors : ``"raise"`` or ``"isolate"``
        What a bad row does. ``"raise"`` (default): the call raises the first bad
        row's :class:`InputError`. ``"isolate"``: each row with a bad value (an
        id, a count, a uniform, a probability it reads) is marked instead: its
        error is in ``result.errors[b]``, its tokens are ``-1`` and its counts 0,
        and every other row gets exactly the tokens it gets in a batch without
        the bad rows (given the same uniforms: pass ``uniforms`` or one Generator
        per row to make a row's draws its own). Shape errors still raise.
    method : ``"token"``, ``"block"``, or a lossy method
        How sampled rows decide their accepted prefix. ``"token"`` (default):
        position by position, stopping at the first rejection. ``"block"``:
        block verification (Sun et al., ICLR 2025), which decides the prefix of
        the whole block jointly: the output still follows the target exactly,
        and the expected number of accepted drafts is never smaller (it is
        optimal among verifiers that see the drafted path). It reads every
        gathered ``p_t(x_t)``, ``q_t(x_t)`` of a row and, going down from the
        last position, one more pair of rows per step. The same uniforms serve:
        ``uniforms[b, i-1]`` is the draw of ``h_i``. With ``draft_probs=None``
        it gives the same accepted-length law as ``"token"``. Greedy rows are
        verified by argmax either way. See docs/spec.md section 2.6.

        Two **lossy** methods, for comparison and load tests only (their output
        does not follow the target; docs/methods.md), as :mod:`specaccept.lossy`
        values: ``lossy.Typical(epsilon=0.09, delta=0.3)`` (or ``"typical"``),
        Medusa's typical acceptance (Cai et al., 2024): ``x_t`` is accepted iff
        ``p_t(x_t) / S > min(epsilon, delta * exp(-H))`` with ``S`` the row's
        sum and ``H`` the entropy of ``p_t / S``, and the next token is drawn
        from the row at the stop restricted to the entries at or above that
        threshold (docs/spec.md section 2.7). ``lossy.Synthetic(rate)``:
        position ``t`` is accepted iff ``u_t < rate[t]``, whatever the
        probabilities, and the next token is drawn from the target row at the
        stop (section 2.8).

    Returns
    -------
    Verification
        ``output_token_ids [B, K+1]`` (emitted tokens, ``-1`` padded),
        ``num_accepted [B]``, ``num_emitted [B]``, and ``errors`` (the isolated
        rows, ``{row: InputError}``).

    Raises
    ------
    TypeError
        A non-array argument or an unsupported dtype (``out``: not int64).
    InputError
        (a ``ValueError``) Wrong shapes, ``out`` read-only or overlapping an
        input, ids outside ``[0, V)``, ``k_b`` outside ``[0, K]``, uniforms
        outside ``[0, 1)``, probabilities that are read and are NaN, infinite,
        negative or (for ``p(x_t)``, ``q(x_t)``) above 1, or a row that must be
        sampled but sums to 0. ``argument``, ``index`` and ``row`` say where.
    MemoryError
        An output (or the uniforms drawn for it) too large to allocate, with
        the argument whose size asks for it.

    Examples
    --------
    >>> import numpy as np, specaccept
    >>> p = np.array([[[0.6, 0.4], [0.5, 0.5]]])       # target, [B=1, K+1=2, V=2]
    >>> q = np.array([[[0.8, 0.2]]])                   # draft,  [B=1, K=1,   V=2]
    >>> r = specaccept.verify(np.array([[0]]), p, q, uniforms=np.array([[0.7]]),
    ...                       recovery_uniforms=np.array([0.9]))
    >>> int(r.num_accepted[0]), r.tokens(0).tolist()   # 0.7 < 0.6/0.8: accepted
    (1, [0, 1])
    """
    convert = like_converter(like)
    isolate = isolating(errors)
    if method == "token":
        rule: Any = None  # the serving loop's case: nothing to normalise
    else:
        rule = chain_rule(method, _num_draft(draft_token_ids))
    greedy_rows = as_greedy(greedy)
    buffers = out_buffers(out)
    ids, u, ru, draws = draft_token_ids, uniforms, recovery_uniforms, None
    if seeds is not None or offsets is not None:
        u, ru = draw_missing(rng, ids, num_draft_tokens, u, ru, seeds, offsets)
    elif (u is None or ru is None) and greedy_rows is not True:
        if u is None and ru is None and type(rng) is np.random.Generator:
            # The serving loop's case: one Generator call, split by the native code.
            if type(ids) is not np.ndarray:
                ids = int_array(ids, "draft_token_ids")
            if ids.ndim == 2:
                batch, num_draft = ids.shape
                draws = draw_uniforms(rng, batch * num_draft + batch)
        if draws is None:
            u, ru = draw_missing(rng, ids, num_draft_tokens, u, ru)
    try:
        # Arrays the native code reads in place go straight through; it refuses
        # any other before it does any work (NotInPlace), and they are converted.
        result = _native.verify(
            ids,
            target_probs,
            draft_probs,
            num_draft_tokens,
            u,
            ru,
            greedy_rows,
            buffers,
            draws,
            isolate,
            rule,
        )
    except _native.NotInPlace:
        ids, target, draft, counts, u, ru = _converted(
            ids, target_probs, draft_probs, num_draft_tokens, u, ru
        )
        result = _native.verify(
            ids, target, draft, counts, u, ru, greedy_rows, buffers, draws, isolate, rule
        )
    return finish(result, convert)


def _num_draft(draft_token_ids: Any) -> int:
    """``K`` of ``draft_token_ids [B, K]`` (0 when it is not 2-D: the native
    layer then names the shape)."""
    ids = int_array(draft_token_ids, "draft_token_ids")
    return int(ids.shape[1]) if ids.ndim == 2 else 0


def _converted(
    ids: Any, target: Any, draft: Any, counts: Any, u: Any, ru: Any
) -> tuple[Any, Any, Any, Any, Any, Any]:
    """verify()'s arrays converted to what the native code reads in place."""
    return (
        int_array(ids, "draft_token_ids"),
        float_array(target, "target_probs"),
        None if draft is None else float_array(draft, "draft_probs"),
        None if counts is None else int_array(counts, "num_draft_tokens"),
        None if u is None else float_array(u, "uniforms"),
        None if ru is None else float_array(ru, "recovery_uniforms"),
    )


def verify_greedy(
    draft_token_ids: npt.ArrayLike,
    target_token_ids: npt.ArrayLike,
    *,
    num_draft_tokens: npt.ArrayLike | None = None,
    out: Verification | tuple[npt.NDArray[np.int64], ...] | None = None,
    like: Any = None,
) -> Verification:
    """Greedy verification when the target's argmax ids were computed elsewhere.

    Row ``b`` accepts drafts while ``draft_token_ids[b, t] == target_token_ids[b, t]``
    (for ``t < k_b``), then emits ``target_token_ids[b, n_b]``: the correction at
    the first mismatch, or the bonus token when all drafts match. Integer
    compares and a prefix scan; no probabilities are read.

    Parameters
    ----------
    draft_token_ids : ndarray of int, shape ``[B, K]``
    target_token_ids : ndarray of int, shape ``[B, K+1]``
        The target model's argmax token at each position (e.g. computed on a GPU).
    num_draft_tokens : ndarray of int, shape ``[B]``, optional
        Drafts per row, ``0 <= k_b <= K``.
    out : Verification or tuple of int64 arrays, optional
        Buffers to write into, as for :func:`verify`.
    like : array or tensor, optional
        The framework of the results, as for :func:`verify`.

    Returns
    -------
    Verification

    Examples
    --------
    >>> import numpy as np, specaccept
    >>> r = specaccept.verify_greedy(np.array([[3, 4, 5], [3, 4, 5]]),
    ...                              np.array([[3, 4, 5, 6], [3, 8, 5, 6]]))
    >>> r.to_lists(), r.num_accepted.tolist()
    ([[3, 4, 5, 6], [3, 8]], [3, 1])
    """
    convert = like_converter(like)
    buffers = out_buffers(out)
    try:
        result = _native.verify_greedy(draft_token_ids, target_token_ids, num_draft_tokens, buffers)
    except _native.NotInPlace:  # found before any work: convert, then the one call
        result = _native.verify_greedy(
            int_array(draft_token_ids, "draft_token_ids"),
            int_array(target_token_ids, "target_token_ids"),
            None if num_draft_tokens is None else int_array(num_draft_tokens, "num_draft_tokens"),
            buffers,
        )
    return finish(result, convert)


def _elementwise(*args: tuple[Any, str]) -> tuple[list[np.ndarray], bool]:
    """Float arrays (or scalars) broadcast to one shape, and whether all were scalars."""
    arrays = []
    for x, name in args:
        if isinstance(x, (float, int, np.floating, np.integer)) and not isinstance(
            x, (bool, np.bool_)
        ):
            try:
                x = np.asarray(x, dtype=np.float64 if isinstance(x, (int, np.integer)) else None)
            except OverflowError:
                # An int past float64's range: no probability or uniform.
                raise InputError(
                    f"{name}: an int of {x.bit_length()} bits is past float64's range "
                    "(probabilities and uniforms lie in [0, 1])",
                    argument=name,
                ) from None
        arrays.append(float_array(x, name))
    scalar = all(a.ndim == 0 for a in arrays)
    shapes = {a.shape for a in arrays}
    if len(shapes) > 1:
        try:
            arrays = list(np.broadcast_arrays(*arrays))
        except ValueError:
            names = ", ".join(
                f"{name} {a.shape}" for a, (_, name) in zip(arrays, args, strict=True)
            )
            raise InputError(
                f"shapes do not broadcast together: {names}", argument=args[0][1]
            ) from None
    return arrays, scalar


def _output(out: np.ndarray, scalar: bool, convert: Any) -> Any:
    out = out[()] if scalar else out
    return out if convert is None else convert(np.asarray(out))


def rejection_probability(
    target_prob: npt.ArrayLike, draft_prob: npt.ArrayLike, *, like: Any = None
) -> Any:
    """Probability that a drafted token is rejected, elementwise.

    ``0`` where accepted outright (``q <= p`` and ``p > 0``), ``1`` where
    ``p == 0``, else ``1 - p/q``, computed in float64.

    Parameters
    ----------
    target_prob, draft_prob : float arrays (any rank, broadcastable) or scalars
        ``p(x_t)`` and ``q(x_t)``, each in ``[0, 1]``.
    like : array or tensor, optional
        The framework of the result, as for :func:`verify`.

    Returns
    -------
    ndarray of float64, or a float64 scalar when both inputs are scalars.

    Examples
    --------
    >>> import specaccept
    >>> round(float(specaccept.rejection_probability(0.6, 0.8)), 12)  # 1 - 0.6/0.8
    0.25
    """
    convert = like_converter(like)
    (p, q), scalar = _elementwise((target_prob, "target_prob"), (draft_prob, "draft_prob"))
    return _output(_native.rejection_probability(p, q), scalar, convert)


def acceptance_mask(
    target_prob: npt.ArrayLike,
    draft_prob: npt.ArrayLike,
    uniform: npt.ArrayLike,
    *,
    like: Any = None,
) -> Any:
    """The acceptance rule applied to every element (also after a rejection).

    ``True`` where ``p > 0`` and (``q <= p`` or ``uniform < p/q``).

    Parameters
    ----------
    target_prob, draft_prob : float arrays (any rank, broadcastable) or scalars
        ``p(x_t)`` and ``q(x_t)``, each in ``[0, 1]``.
    uniform : float array or scalar
        The draws ``u_t`` in ``[0, 1)``.
    like : array or tensor, optional
        The framework of the result, as for :func:`verify`.

    Returns
    -------
    ndarray of bool, or a bool scalar when all inputs are scalars.

    Examples
    --------
    >>> import specaccept
    >>> bool(specaccept.acceptance_mask(0.6, 0.8, 0.74)), bool(specaccept.acceptance_mask(0.6, 0.8, 0.75))
    (True, False)
    """
    convert = like_converter(like)
    (p, q, u), scalar = _elementwise(
        (target_prob, "target_prob"), (draft_prob, "draft_prob"), (uniform, "uniform")
    )
    return _output(_native.acceptance_mask(p, q, u), scalar, convert)


def acceptance_rate(
    target_probs: npt.ArrayLike, draft_probs: npt.ArrayLike, *, like: Any = None
) -> Any:
    """The analytic acceptance rate ``alpha = sum_x min(p(x), q(x))`` of each row.

    The probability that a token drawn from the draft distribution ``q`` is
    accepted against the target ``p`` (Leviathan et al., 2023): the ``a`` of
    :func:`expected_tokens_per_step` and :func:`best_num_draft_tokens`. Rows
    need not be normalised. Summed in float64 in the canonical order, in
    parallel for large inputs; read in place like every input.

    Parameters
    ----------
    target_probs, draft_probs : float16/bfloat16/float32/float64 arrays of the same shape ``[..., V]``
    like : array or tensor, optional
        The framework of the result, as for :func:`verify`.

    Returns
    -------
    ndarray of float64, shape ``[...]`` (a float64 scalar for one row ``[V]``).

    Examples
    --------
    >>> import numpy as np, specaccept
    >>> p = np.array([0.6, 0.4, 0.0])
    >>> q = np.array([0.8, 0.1, 0.1])
    >>> round(float(specaccept.acceptance_rate(p, q)), 12)   # 0.6 + 0.1 + 0.0
    0.7
    """
    convert = like_converter(like)
    p = float_array(target_probs, "target_probs")
    q = float_array(draft_probs, "draft_probs")
    out = _native.acceptance_rate(p, q)
    return _output(out, out.ndim == 0, convert)


def accepted_prefix_length(
    accepted: npt.ArrayLike, num_draft_tokens: npt.ArrayLike | None = None, *, like: Any = None
) -> npt.NDArray[np.int64]:
    """The accepted prefix length of each row: leading ``True`` among the first ``k_b``.

    Parameters
    ----------
    accepted : ndarray of bool, shape ``[B, K]``
        Per-position decisions, e.g. from :func:`acceptance_mask`.
    num_draft_tokens : ndarray of int, shape ``[B]``, optional
        Drafts per row, ``0 <= k_b <= K``; later positions are ignored.
    like : array or tensor, optional
        The framework of the result, as for :func:`verify`.

    Returns
    -------
    ndarray of int64, shape ``[B]``

    Examples
    --------
    >>> import numpy as np, specaccept
    >>> specaccept.accepted_prefix_length(np.array([[True, False, True], [True, True, True]])).tolist()
    [1, 3]
    """
    convert = like_converter(like)
    mask = bool_array(accepted, "accepted")
    counts = None if num_draft_tokens is None else int_array(num_draft_tokens, "num_draft_tokens")
    return _output(_native.accepted_prefix_length(mask, counts), False, convert)
