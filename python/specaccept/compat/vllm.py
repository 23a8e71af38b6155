"""vLLM's layout: flattened ragged drafts, given bonus tokens, ``-1`` padded output.

vLLM's v1 ``RejectionSampler`` verifies all requests of a step at once, their
drafts back to back: request ``b`` owns entries ``cu[b-1] .. cu[b]`` of
``draft_token_ids [T]``, ``target_probs [T, V]`` and ``draft_probs [T, V]``
(``cu`` the inclusive cumulative sum of ``num_draft_tokens``), and its bonus
token, sampled separately from the target's last position, comes in
``bonus_token_ids [B, 1]``. The result is ``output_token_ids [B, max_spec_len + 1]``
(int32) holding the accepted drafts, then the recovered token (at the first
rejection) or the bonus token (when all were accepted), then
``PLACEHOLDER_TOKEN_ID = -1``.

:func:`rejection_sample` takes that layout and returns that array, read in place
and verified by the same native kernel as :func:`specaccept.verify` (the flat
layout is a second way of addressing rows, not a second implementation).

Differences from vLLM, all on events of probability 0 or by design:

- The rule is specaccept's: accept iff ``q <= p`` (with ``p > 0``) or ``u < p/q``.
  vLLM accepts iff ``q > 0 and p / q >= u``: it differs when ``u == p/q`` exactly,
  when ``q == 0 < p`` (vLLM rejects, here accepted: the target allows the
  token), and when ``p == 0`` with ``u == 0`` (vLLM accepts a token the target
  rules out; here it is rejected).
- The recovered token is an inverse-CDF draw from ``max(0, p - q)`` with one
  uniform per request (``recovery_uniforms``); vLLM draws it by an exponential
  race. Both follow the same distribution, so outputs agree in law, not token for
  token.
- Uniforms are float64 from a NumPy ``Generator`` (or given), not torch's.
- ``num_draft_tokens`` entries may be 0 (the request emits its bonus token).
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from .. import _native
from .._api import Method
from .._arrays import as_numpy, float_array, int_array, like_converter
from .._errors import InputError
from .._options import as_greedy, chain_rule, isolating, per_row
from .._result import Verification, finish
from .._uniforms import CounterLike, as_generator, draw_uniforms, seeded

__all__ = ["PLACEHOLDER_TOKEN_ID", "parse_output", "rejection_sample", "verify", "verify_logits"]

#: The padding of ``output_token_ids``, as vLLM's ``PLACEHOLDER_TOKEN_ID``.
PLACEHOLDER_TOKEN_ID = -1


def _counts(num_draft_tokens: Any) -> np.ndarray:
    if isinstance(num_draft_tokens, (list, tuple)):  # vLLM keeps them in a list
        if not all(
            isinstance(k, (int, np.integer)) and not isinstance(k, (bool, np.bool_))
            for k in num_draft_tokens
        ):
            raise TypeError("num_draft_tokens must be a list of ints")
        try:
            num_draft_tokens = np.asarray(num_draft_tokens, dtype=np.int64).reshape(-1)
        except OverflowError:
            raise InputError(
                "num_draft_tokens: a count is outside the int64 range",
                argument="num_draft_tokens",
            ) from None
    return int_array(num_draft_tokens, "num_draft_tokens")


def verify(
    draft_token_ids: npt.ArrayLike,
    num_draft_tokens: npt.ArrayLike | list[int],
    target_probs: npt.ArrayLike,
    draft_probs: npt.ArrayLike | None,
    bonus_token_ids: npt.ArrayLike,
    *,
    uniforms: npt.ArrayLike | None = None,
    recovery_uniforms: npt.ArrayLike | None = None,
    rng: Any = None,
    seeds: CounterLike = None,
    offsets: CounterLike = None,
    greedy: bool | npt.ArrayLike = False,
    like: Any = None,
    errors: Literal["raise", "isolate"] = "raise",
    method: Method = "token",
    rejection_sample_method: str | None = None,
) -> Verification:
    """Verify a step in vLLM's flat layout; the full :class:`~specaccept.Verification`.

    Parameters
    ----------
    draft_token_ids : int array ``[T]``
        The drafts of all requests back to back, ``T = sum(num_draft_tokens)``.
        ``PLACEHOLDER_TOKEN_ID`` (-1) pads a request's unused slots and ends its
        drafts there, as in vLLM's sampler: the slots from it on are not read,
        and if every draft before it is accepted, the next token is drawn from
        the target's row at the placeholder's slot (its argmax when greedy)
        instead of taking ``bonus_token_ids``.
    num_draft_tokens : int array or list ``[B]``
        Drafts per request (0 allowed).
    target_probs : float array ``[T, V]``
        Target probabilities at each drafted position.
    draft_probs : float array ``[T, V]`` or None
        Draft probabilities; ``None`` for deterministic drafts (n-gram, EAGLE
        top-1): ``q`` is one-hot at the draft.
    bonus_token_ids : int array ``[B]`` or ``[B, 1]``
        The token a request emits after all its drafts are accepted.
    uniforms : float array ``[T]``, optional
        One acceptance uniform per draft. Drawn from ``rng`` if missing.
    recovery_uniforms : float array ``[B]``, optional
        One uniform per request for the recovered token. Drawn from ``rng`` if missing.
    rng : None, int or Generator
        Draws ``uniforms = g.random(T)`` then ``recovery_uniforms = g.random(B)``.
    seeds, offsets : int arrays ``[B]`` (``offsets`` also one int), optional
        Counter-based uniforms per request instead of ``uniforms``/``rng``
        (vLLM's per-request ``seed``): request ``b``'s ``j``-th draft uses
        ``counter_uniforms(seeds, offsets, max_k)[0][b, j]``, so its tokens do
        not depend on the other requests of the step.
    greedy : bool or bool array ``[B]``
        Requests verified by argmax (vLLM: temperature 0): accept while the draft
        is the target's argmax, emit the argmax at the first mismatch.
    like : array or tensor, optional
        The framework of the results, as for :func:`specaccept.verify`.
    method : ``"token"``, ``"block"`` or a :mod:`specaccept.lossy` value
        As for :func:`specaccept.verify` (a per-position synthetic rate has one
        value per position of the longest request, ``[max_k]``).
    rejection_sample_method : ``"standard"``, ``"block"`` or ``"synthetic"``, optional
        vLLM's name of the same option (its ``SpeculativeConfig``):
        ``"standard"`` is ``method="token"``; ``"synthetic"`` (a load generator,
        lossy) takes its rate from ``method=lossy.Synthetic(rate=...)``.
    errors : ``"raise"`` or ``"isolate"``
        As for :func:`specaccept.verify`; an isolated request's error is in
        ``result.errors[b]`` (``b`` the request; its ``index`` is into the flat
        arrays) and its row is ``-1``.

    Returns
    -------
    Verification
        ``output_token_ids [B, max_k + 1]`` (int64), ``num_accepted``, ``num_emitted``.

    Examples
    --------
    >>> import numpy as np
    >>> from specaccept.compat import vllm
    >>> # Two requests, greedy: [1, 2] against argmax [1, 2] (bonus 5), [3] against [3] (bonus 4).
    >>> target = np.eye(8)[[1, 2, 3]]                       # [T=3, V=8]
    >>> r = vllm.verify(np.array([1, 2, 3]), [2, 1], target, None, np.array([5, 4]), greedy=True)
    >>> r.output_token_ids.tolist()
    [[1, 2, 5], [3, 4, -1]]
    """
    convert = like_converter(like)
    isolate = isolating(errors)
    named = _method(method, rejection_sample_method)
    ids = int_array(draft_token_ids, "draft_token_ids")
    counts = _counts(num_draft_tokens)
    k_max = _max_count(counts, ids)
    rule = chain_rule(named, k_max)
    target = float_array(target_probs, "target_probs")
    draft = None if draft_probs is None else float_array(draft_probs, "draft_probs")
    bonus = int_array(as_numpy(bonus_token_ids, "bonus_token_ids"), "bonus_token_ids")
    if bonus.ndim == 2 and bonus.shape[1:] == (1,):
        bonus = bonus[:, 0]  # vLLM's [B, 1]
    greedy_rows = as_greedy(greedy)
    u, ru = _flat_draws(
        ids,
        counts,
        k_max,
        uniforms,
        recovery_uniforms,
        rng,
        seeds,
        offsets,
        greedy_rows is not True,
    )
    result = _native.verify_flat(
        ids, counts, target, draft, bonus, u, ru, greedy_rows, None, isolate, rule
    )
    return finish(result, convert)


def _max_count(counts: np.ndarray, ids: np.ndarray) -> int:
    """The longest request's draft count; 0 for counts the native code refuses
    (not ``[B]``, negative, or not summing to ``T``), so its error names them."""
    total = ids.shape[0] if ids.ndim == 1 else -1
    if counts.ndim != 1 or not counts.size or int(counts.min()) < 0:
        return 0
    if sum(counts.tolist()) != total:  # Python ints: no wrap
        return 0
    return int(counts.max())


def _flat_draws(
    ids: np.ndarray,
    counts: np.ndarray,
    k_max: int,
    uniforms: Any,
    recovery_uniforms: Any,
    rng: Any,
    seeds: CounterLike,
    offsets: CounterLike,
    sampled: bool,
) -> tuple[Any, Any]:
    """The flat layout's uniforms ``[T]`` and recovery uniforms ``[B]``: given,
    from ``seeds``/``offsets`` (request ``b``'s ``j``-th draft taking entry
    ``[b, j]`` of ``k_max``, :func:`_max_count`), or drawn from ``rng``
    (``uniforms`` then ``recovery_uniforms``) when some request is ``sampled``."""
    u = None if uniforms is None else float_array(uniforms, "uniforms")
    ru = None if recovery_uniforms is None else float_array(recovery_uniforms, "recovery_uniforms")
    batch = counts.shape[0] if counts.ndim == 1 else 0
    counter = seeded(seeds, offsets, batch, k_max, u, ru, rng)
    if counter is not None:
        return _flat_uniforms(counter[0], counts, ids), counter[1]
    if (u is None or ru is None) and sampled:
        g = as_generator(rng, per_row=False)
        source = "draft_token_ids [T] and num_draft_tokens [B]"
        total = ids.shape[0] if ids.ndim == 1 else 0
        u = draw_uniforms(g, total, None, source) if u is None else u
        ru = draw_uniforms(g, batch, None, source) if ru is None else ru
    return u, ru


def _flat_uniforms(per_row: np.ndarray, counts: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Request ``b``'s first ``k_b`` uniforms back to back: the flat ``[T]`` layout
    (``T`` zeros where :func:`_max_count` found the counts unusable)."""
    if _max_count(counts, ids) == 0:
        return np.zeros(ids.shape[0] if ids.ndim == 1 else 0)
    return per_row[np.arange(per_row.shape[1]) < counts[:, None]]


def verify_logits(
    draft_token_ids: npt.ArrayLike,
    num_draft_tokens: npt.ArrayLike | list[int],
    logits: npt.ArrayLike,
    draft_probs: npt.ArrayLike | None = None,
    *,
    temperature: float | npt.ArrayLike = 1.0,
    top_k: int | npt.ArrayLike = 0,
    top_p: float | npt.ArrayLike = 1.0,
    uniforms: npt.ArrayLike | None = None,
    recovery_uniforms: npt.ArrayLike | None = None,
    rng: Any = None,
    seeds: CounterLike = None,
    offsets: CounterLike = None,
    like: Any = None,
    errors: Literal["raise", "isolate"] = "raise",
    method: Method = "token",
    min_p: float | npt.ArrayLike = 0.0,
) -> Verification:
    """Verify a step from the target's logits in vLLM's layout, bonus rows included.

    This is what vLLM's ``RejectionSampler.forward`` receives: ``logits
    [T + B, V]`` holds, for each request ``b`` in order, the target's rows at its
    ``k_b`` drafted positions and then its bonus position (row ``start_b + k_b``,
    ``start_b = sum(k_c + 1 for c < b)``). The result is
    :func:`specaccept.verify_logits` on those rows, read in place: temperature,
    top-k and top-p are applied only to the rows a request reads (its positions up
    to its first rejection, and its bonus row when every draft is accepted), and
    the bonus token is drawn here (no ``bonus_token_ids``). Min-p comes before
    top-k and top-p, as vLLM's sampler applies it (its ``MinPLogitsProcessor``
    after the temperature, then top-k and top-p).

    Parameters
    ----------
    draft_token_ids : int array ``[T]``
        The drafts back to back. ``PLACEHOLDER_TOKEN_ID`` (-1) ends a request's
        drafts at its slot ``j``: slots from ``j`` on are not read, and if every
        draft before it is accepted the next token is drawn from the target row
        at slot ``j``.
    num_draft_tokens : int array or list ``[B]``
        Drafts per request (0 allowed); they place the rows.
    logits : float16/bfloat16/float32/float64 array ``[T + B, V]``
    draft_probs : float array ``[T, V]``, optional
        The drafter's probabilities, read as they are (vLLM's draft model samples
        from ``softmax(draft_logits / T)`` without top-k or top-p). ``None``:
        deterministic drafts (n-gram, greedy drafters), ``q`` one-hot.
    temperature, top_k, top_p, min_p : scalar or ``[B]``
        As :func:`specaccept.verify_logits` (temperature 0: a greedy request;
        ``min_p_last=False``, vLLM's order).
    uniforms : float array ``[T]``, optional
        One acceptance uniform per slot.
    recovery_uniforms : float array ``[B]``, optional
        One per request: the recovered or the bonus token's draw.
    rng, seeds, offsets, like, errors, method
        As :func:`verify` (``method``: ``"token"`` or ``"block"`` with
        ``draft_probs``; the lossy methods without).

    Returns
    -------
    Verification
        ``output_token_ids [B, max_k + 1]`` (int64, ``-1`` padded),
        ``num_accepted``, ``num_emitted``.

    Examples
    --------
    >>> import numpy as np
    >>> from specaccept.compat import vllm
    >>> # Request 0 drafts [1, 2] (rows 0-1, bonus row 2); request 1 drafts nothing (row 3).
    >>> logits = np.log(np.eye(4)[[1, 3, 0, 2]] + 1e-9)
    >>> r = vllm.verify_logits(np.array([1, 2]), [2, 0], logits, temperature=0.0)
    >>> r.output_token_ids.tolist()   # 2 rejected against argmax 3; request 1 its argmax
    [[1, 3, -1], [2, -1, -1]]
    """
    convert = like_converter(like)
    isolate = isolating(errors)
    ids = int_array(draft_token_ids, "draft_token_ids")
    counts = _counts(num_draft_tokens)
    k_max = _max_count(counts, ids)
    rule = chain_rule(method, k_max)
    target = float_array(logits, "logits")
    draft = None if draft_probs is None else float_array(draft_probs, "draft_probs")
    batch = counts.shape[0] if counts.ndim == 1 else 0
    temperatures = per_row(temperature, "temperature", batch, np.float64)
    top_ks = per_row(top_k, "top_k", batch, np.int64)
    top_ps = per_row(top_p, "top_p", batch, np.float64)
    min_ps = per_row(min_p, "min_p", batch, np.float64)
    u, ru = _flat_draws(
        ids,
        counts,
        k_max,
        uniforms,
        recovery_uniforms,
        rng,
        seeds,
        offsets,
        bool(temperatures.any()),
    )
    result = _native.verify_flat_logits(
        ids, counts, target, draft, temperatures, top_ks, top_ps, u, ru, isolate, rule, min_ps
    )
    return finish(result, convert)


def rejection_sample(
    draft_token_ids: npt.ArrayLike,
    num_draft_tokens: npt.ArrayLike | list[int],
    target_probs: npt.ArrayLike,
    draft_probs: npt.ArrayLike | None,
    bonus_token_ids: npt.ArrayLike,
    *,
    uniforms: npt.ArrayLike | None = None,
    recovery_uniforms: npt.ArrayLike | None = None,
    rng: Any = None,
    seeds: CounterLike = None,
    offsets: CounterLike = None,
    greedy: bool | npt.ArrayLike = False,
    like: Any = None,
    errors: Literal["raise", "isolate"] = "raise",
    method: Method = "token",
    rejection_sample_method: str | None = None,
) -> Any:
    """vLLM's ``rejection_sample``: ``output_token_ids [B, max_spec_len + 1]``, int32.

    The arguments are those of :func:`verify`. Each row holds the accepted drafts,
    the recovered or bonus token, then ``PLACEHOLDER_TOKEN_ID`` (-1). With
    ``errors="isolate"`` a request with a bad value is set aside: its row is all
    ``-1`` (call :func:`verify` for the errors themselves).

    Examples
    --------
    >>> import numpy as np
    >>> from specaccept.compat import vllm
    >>> # vLLM's own greedy case: draft [1, 2, 3], target argmax [1, 5, 3], bonus 4.
    >>> target = np.eye(8)[[1, 5, 3]]
    >>> vllm.rejection_sample(np.array([1, 2, 3]), [3], target, None, np.array([[4]]),
    ...                       greedy=True).tolist()
    [[1, 5, -1, -1]]
    """
    result = verify(
        draft_token_ids,
        num_draft_tokens,
        target_probs,
        draft_probs,
        bonus_token_ids,
        uniforms=uniforms,
        recovery_uniforms=recovery_uniforms,
        rng=rng,
        seeds=seeds,
        offsets=offsets,
        greedy=greedy,
        errors=errors,
        method=method,
        rejection_sample_method=rejection_sample_method,
    )
    ids = result.output_token_ids.astype(np.int32)
    convert = like_converter(like)
    return ids if convert is None else convert(ids)


#: vLLM's names of the verification methods (``rejection_sample_method``).
VLLM_METHODS = {"standard": "token", "block": "block", "synthetic": "synthetic"}


def _method(method: Any, rejection_sample_method: Any) -> Any:
    """``method=`` or vLLM's ``rejection_sample_method=``, as one method (a name or
    a :mod:`specaccept.lossy` value)."""
    if rejection_sample_method is None:
        return method
    names = "'standard', 'block' or 'synthetic'"
    if not isinstance(rejection_sample_method, str):
        raise TypeError(
            f"rejection_sample_method must be {names}, got {type(rejection_sample_method).__name__}"
        )
    if rejection_sample_method not in VLLM_METHODS:
        raise InputError(
            f"rejection_sample_method must be {names}, got {rejection_sample_method!r:.40}",
            argument="rejection_sample_method",
        )
    named = VLLM_METHODS[rejection_sample_method]
    given = getattr(method, "name", method)  # a lossy value's method name
    if isinstance(given, str) and given == named:
        return method
    if isinstance(method, str) and method == "token":
        if named == "synthetic":
            raise InputError(
                "rejection_sample_method='synthetic' needs its rate: "
                "method=specaccept.lossy.Synthetic(rate=...)",
                argument="method",
            )
        return named
    raise InputError(
        f"method={method!r} and rejection_sample_method={rejection_sample_method!r} disagree",
        argument="rejection_sample_method",
    )


def parse_output(output_token_ids: npt.ArrayLike, vocab_size: int) -> list[list[int]]:
    """vLLM's ``parse_output``: each row's tokens, without placeholders or ids ``>= vocab_size``.

    Examples
    --------
    >>> import numpy as np
    >>> from specaccept.compat import vllm
    >>> vllm.parse_output(np.array([[1, 5, -1], [3, 4, 9]]), vocab_size=8)
    [[1, 5], [3, 4]]
    """
    ids = int_array(output_token_ids, "output_token_ids")
    if ids.ndim != 2:
        raise InputError(
            f"output_token_ids must be 2-D [B, max_spec_len + 1], got shape {ids.shape}",
            argument="output_token_ids",
        )
    if not isinstance(vocab_size, (int, np.integer)) or isinstance(vocab_size, (bool, np.bool_)):
        raise TypeError(f"vocab_size must be an int, got {type(vocab_size).__name__}")
    try:
        valid = (ids != PLACEHOLDER_TOKEN_ID) & (ids < vocab_size)
    except MemoryError:
        # The lists returned would be larger still.
        raise MemoryError(
            f"output_token_ids: the tokens of {ids.shape[0]} rows of {ids.shape[1]} "
            "cannot be gathered in this process's memory"
        ) from None
    return [row[mask].tolist() for row, mask in zip(ids, valid, strict=True)]
