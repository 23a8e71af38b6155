"""FlashInfer's ``chain_speculative_sampling``, with explicit uniforms.

FlashInfer (the ``uniform_samples`` form of its API) verifies a padded batch:
``draft_probs [B, K, V]``, ``draft_token_ids [B, K]``, ``uniform_samples
[B, K+1]`` and ``target_probs [B, K+1, V]``, and returns

- ``output_token_ids [B, K+1]`` (int32): accepted drafts, the replacement or bonus
  token, then ``-1``;
- ``output_accepted_token_num [B]``: the drafts that would be accepted if each
  were tested on its own, ignoring the stop at the first rejection (a measure of
  draft/target alignment, "non-causal");
- ``output_emitted_draft_token_num [B]``: the drafts actually emitted, the
  accepted prefix length (not counting the bonus token).

Both counts are added in place to ``maybe_output_*`` tensors when given, as
FlashInfer does. The verification is :func:`specaccept.verify` on the same
arrays (read in place); the non-causal count is :func:`specaccept.acceptance_mask`
on the gathered probabilities.

Differences from FlashInfer:

- Position ``i`` uses ``uniform_samples[:, i]`` as in FlashInfer; the replacement
  or bonus sample uses ``uniform_samples[:, K]`` for every row. FlashInfer uses
  column ``min(pos + 1, K)``: the same column for the bonus and for a rejection
  at ``K - 1``, another (equally independent) column for earlier rejections, so
  the replacement token can differ there, with the same distribution.
- The test is specaccept's ``u < p/q`` (``q <= p`` accepted outright) in float64;
  FlashInfer tests ``u * q < p`` in float32. They agree except within rounding
  of the boundary ``u == p/q``. Both accept ``q == 0 < p`` and reject ``p == 0``.
- Uniforms must lie in ``[0, 1)``; ``deterministic`` has no effect (this is
  always deterministic).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from .._api import acceptance_mask, verify
from .._arrays import as_numpy, float_array, int_array, like_converter
from .._errors import InputError
from .._uniforms import CounterLike, seeded

__all__ = ["chain_speculative_sampling"]


def chain_speculative_sampling(
    draft_probs: npt.ArrayLike,
    draft_token_ids: npt.ArrayLike,
    uniform_samples: npt.ArrayLike | None,
    target_probs: npt.ArrayLike,
    maybe_output_accepted_token_num: Any = None,
    maybe_output_emitted_draft_token_num: Any = None,
    deterministic: bool = True,
    *,
    seeds: CounterLike = None,
    offsets: CounterLike = None,
    like: Any = None,
) -> tuple[Any, Any, Any]:
    """FlashInfer's chain speculative sampling: output ids, accepted and emitted counts.

    Parameters
    ----------
    draft_probs : float array ``[B, K, V]``
    draft_token_ids : int array ``[B, K]``
    uniform_samples : float array ``[B, K+1]``, or None with ``seeds``/``offsets``
        Column ``i < K`` tests position ``i``; column ``K`` draws the replacement
        or bonus token.
    target_probs : float array ``[B, K+1, V]``
    maybe_output_accepted_token_num, maybe_output_emitted_draft_token_num : int arrays ``[B]``, optional
        When given, the counts are added to them in place (and they are returned).
        They must be writeable and share no memory with an input or with each
        other (an :class:`~specaccept.InputError` naming both otherwise); both are
        checked before anything is written.
    deterministic : bool
        Accepted for compatibility; the result is always deterministic.
    seeds, offsets : int arrays ``[B]`` (``offsets`` also one int), optional
        Per-request counter-based uniforms instead of ``uniform_samples`` (as
        FlashInfer's ``seed``/``offset``, but one per request): column ``i < K``
        is ``counter_uniforms(seeds, offsets, K)[0][:, i]`` and column ``K`` the
        recovery uniforms.
    like : array or tensor, optional
        The framework of the results (default: ``target_probs``'s when it is not NumPy).

    Returns
    -------
    (output_token_ids [B, K+1] int32, output_accepted_token_num [B], output_emitted_draft_token_num [B])

    Examples
    --------
    >>> import numpy as np
    >>> from specaccept.compat import flashinfer
    >>> # FlashInfer's docstring example: its result does not depend on the uniforms.
    >>> draft_probs = np.array([[[0.1, 0.2, 0.3, 0.4], [0.2, 0.3, 0.4, 0.1]]])
    >>> draft_token_ids = np.array([[2, 1]], dtype=np.int32)
    >>> target_probs = np.array([[[0.0, 0.1, 0.6, 0.3], [1.0, 0.0, 0.0, 0.0],
    ...                           [0.7, 0.1, 0.1, 0.1]]])
    >>> uniform_samples = np.array([[0.8823, 0.9150, 0.3829]])
    >>> ids, accepted, emitted = flashinfer.chain_speculative_sampling(
    ...     draft_probs, draft_token_ids, uniform_samples, target_probs)
    >>> ids.tolist(), accepted.tolist(), emitted.tolist()
    ([[2, 0, -1]], [1], [1])
    """
    if like is None and not isinstance(target_probs, np.ndarray):
        like = target_probs
    convert = like_converter(like)
    inputs = {
        "draft_probs": draft_probs,
        "draft_token_ids": draft_token_ids,
        "uniform_samples": uniform_samples,
        "target_probs": target_probs,
    }
    ids = int_array(draft_token_ids, "draft_token_ids")
    p = float_array(target_probs, "target_probs")
    q = float_array(draft_probs, "draft_probs")
    if ids.ndim != 2:
        raise InputError(
            f"draft_token_ids must be 2-D [B, K], got shape {ids.shape}", argument="draft_token_ids"
        )
    batch, num_draft = ids.shape
    if uniform_samples is not None and (seeds is not None or offsets is not None):
        raise InputError(
            "uniform_samples: give seeds/offsets or uniform_samples, not both",
            argument="uniform_samples",
        )
    counter = seeded(seeds, offsets, batch, num_draft, None, None, None)
    if counter is not None:
        u = np.concatenate([counter[0], counter[1][:, None]], axis=1)
        del inputs["uniform_samples"]
    elif uniform_samples is None:
        raise InputError(
            "uniform_samples: give uniform_samples [B, K+1], or seeds and offsets",
            argument="uniform_samples",
        )
    else:
        u = float_array(uniform_samples, "uniform_samples")
    if u.shape != (batch, num_draft + 1):
        raise InputError(
            f"uniform_samples: has shape {u.shape}, expected {(batch, num_draft + 1)} ([B, K+1])",
            argument="uniform_samples",
        )
    # The count buffers, all checked before anything is computed or written.
    seen = [
        (name, a)
        for name, a in (
            ("draft_token_ids", ids),
            ("target_probs", p),
            ("draft_probs", q),
            ("uniform_samples", u),
        )
    ]
    seen += [
        (name, a)
        for name, a in ((n, as_numpy(x, n)) for n, x in inputs.items())
        if isinstance(a, np.ndarray)
    ]
    buffers: list[np.ndarray | None] = []
    for given, name in (
        (maybe_output_accepted_token_num, "maybe_output_accepted_token_num"),
        (maybe_output_emitted_draft_token_num, "maybe_output_emitted_draft_token_num"),
    ):
        if given is None:
            buffers.append(None)
            continue
        checked = _count_buffer(given, name, batch, seen)
        buffers.append(checked)
        seen.append((name, checked))
    try:
        result = verify(ids, p, q, uniforms=u[:, :num_draft], recovery_uniforms=u[:, num_draft])
    except InputError as error:
        raise _as_uniform_samples(error, num_draft) from None
    # Non-causal: every position tested on its own, with its own uniform. verify
    # checked every id and shape; the values it did not read are checked here.
    rows = np.arange(batch)[:, None]
    positions = np.arange(num_draft)[None, :]
    gathered_p = p[rows, positions, ids]
    gathered_q = q[rows, positions, ids]
    _check_read(gathered_p, ids, "target_probs")
    _check_read(gathered_q, ids, "draft_probs")
    tests = u[:, :num_draft]
    bad = ~((tests >= 0.0) & (tests < 1.0))
    if bad.any():
        b, t = (int(i) for i in np.argwhere(bad)[0])
        raise InputError(
            f"uniform_samples[{b}, {t}] = {float(tests[b, t])!r}: a uniform draw must lie in "
            "[0, 1)",
            argument="uniform_samples",
            index=(b, t),
            row=b,
        )
    accepted = acceptance_mask(gathered_p, gathered_q, tests).sum(axis=1)
    emitted = result.num_accepted
    counts = []
    for given, buffer, value in (
        (maybe_output_accepted_token_num, buffers[0], accepted),
        (maybe_output_emitted_draft_token_num, buffers[1], emitted),
    ):
        if buffer is None:
            counts.append(value.astype(np.int32))
            continue
        buffer += value.astype(buffer.dtype)  # FlashInfer adds in place
        counts.append(given)
    output_token_ids = result.output_token_ids.astype(np.int32)
    if convert is None:
        return output_token_ids, counts[0], counts[1]
    return tuple(
        c if not isinstance(c, np.ndarray) else convert(c)
        for c in (output_token_ids, counts[0], counts[1])
    )  # type: ignore[return-value]


def _count_buffer(
    given: Any, name: str, batch: int, seen: list[tuple[str, np.ndarray]]
) -> np.ndarray:
    """An output count buffer: a writeable integer array ``[B]`` that shares no
    memory with an input or the other buffer (FlashInfer adds to it in place)."""
    buffer = as_numpy(given, name)
    if not isinstance(buffer, np.ndarray):
        raise TypeError(
            f"{name} must be an integer array of shape ({batch},), got {type(given).__name__}"
        )
    if buffer.dtype.kind not in "iu":
        raise TypeError(f"{name} must be an integer array, got dtype {buffer.dtype}")
    if buffer.shape != (batch,):
        raise InputError(f"{name} must be an integer array of shape ({batch},)", argument=name)
    if not buffer.flags.writeable:
        raise InputError(f"{name} is read-only; outputs need writeable buffers", argument=name)
    for other, array in seen:
        if np.may_share_memory(buffer, array):
            raise InputError(
                f"{name} shares memory with {other}; outputs need buffers of their own",
                argument=name,
            )
    return buffer


def _as_uniform_samples(error: InputError, num_draft: int) -> InputError:
    """verify's error about the uniforms it was given, named as this function's
    ``uniform_samples`` (``recovery_uniforms[b]`` is ``uniform_samples[b, K]``)."""
    message = str(error)
    if error.argument == "uniforms" and message.startswith("uniforms"):
        message = "uniform_samples" + message[len("uniforms") :]
        index = error.index
    elif error.argument == "recovery_uniforms" and error.index is not None:
        b = error.index[0]
        message = f"uniform_samples[{b}, {num_draft}]" + message.partition("]")[2]
        index = (b, num_draft)
    else:
        return error
    return InputError(message, argument="uniform_samples", index=index, row=error.row)


def _check_read(gathered: np.ndarray, ids: np.ndarray, name: str) -> None:
    """``p(x_t)`` or ``q(x_t)`` of every position: each in ``[0, 1]``."""
    bad = ~((gathered >= 0.0) & (gathered <= 1.0))
    if bad.any():
        b, t = (int(i) for i in np.argwhere(bad)[0])
        x = int(ids[b, t])
        raise InputError(
            f"{name}[{b}, {t}, {x}] = {float(gathered[b, t])!r}: the probability of a drafted "
            "token must lie in [0, 1]",
            argument=name,
            index=(b, t, x),
            row=b,
        )
