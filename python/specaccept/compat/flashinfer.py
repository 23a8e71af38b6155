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

from .._api import _floats, _ints, acceptance_mask, verify
from .._arrays import as_numpy, like_converter

__all__ = ["chain_speculative_sampling"]


def chain_speculative_sampling(
    draft_probs: npt.ArrayLike,
    draft_token_ids: npt.ArrayLike,
    uniform_samples: npt.ArrayLike,
    target_probs: npt.ArrayLike,
    maybe_output_accepted_token_num: Any = None,
    maybe_output_emitted_draft_token_num: Any = None,
    deterministic: bool = True,
    *,
    like: Any = None,
) -> tuple[Any, Any, Any]:
    """FlashInfer's chain speculative sampling: output ids, accepted and emitted counts.

    Parameters
    ----------
    draft_probs : float array ``[B, K, V]``
    draft_token_ids : int array ``[B, K]``
    uniform_samples : float array ``[B, K+1]``
        Column ``i < K`` tests position ``i``; column ``K`` draws the replacement
        or bonus token.
    target_probs : float array ``[B, K+1, V]``
    maybe_output_accepted_token_num, maybe_output_emitted_draft_token_num : int arrays ``[B]``, optional
        When given, the counts are added to them in place (and they are returned).
    deterministic : bool
        Accepted for compatibility; the result is always deterministic.
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
    ids = _ints(draft_token_ids, "draft_token_ids")
    p = _floats(target_probs, "target_probs")
    q = _floats(draft_probs, "draft_probs")
    u = _floats(uniform_samples, "uniform_samples")
    if ids.ndim != 2:
        raise ValueError(f"draft_token_ids must be 2-D [B, K], got shape {ids.shape}")
    batch, num_draft = ids.shape
    if u.shape != (batch, num_draft + 1):
        raise ValueError(
            f"uniform_samples: has shape {u.shape}, expected {(batch, num_draft + 1)} ([B, K+1])"
        )
    result = verify(ids, p, q, uniforms=u[:, :num_draft], recovery_uniforms=u[:, num_draft])
    # Non-causal: every position tested on its own, with its own uniform.
    rows = np.arange(batch)[:, None]
    positions = np.arange(num_draft)[None, :]
    gathered_p = p[rows, positions, ids]
    gathered_q = q[rows, positions, ids]
    accepted = acceptance_mask(gathered_p, gathered_q, u[:, :num_draft]).sum(axis=1)
    emitted = result.num_accepted
    counts = []
    for given, value, name in (
        (maybe_output_accepted_token_num, accepted, "maybe_output_accepted_token_num"),
        (maybe_output_emitted_draft_token_num, emitted, "maybe_output_emitted_draft_token_num"),
    ):
        if given is None:
            counts.append(value.astype(np.int32))
            continue
        target = as_numpy(given, name)
        if not isinstance(target, np.ndarray) or target.shape != (batch,):
            raise ValueError(f"{name} must be an integer array of shape ({batch},)")
        target += value.astype(target.dtype)  # FlashInfer adds in place
        counts.append(given)
    output_token_ids = result.output_token_ids.astype(np.int32)
    if convert is None:
        return output_token_ids, counts[0], counts[1]
    return tuple(
        c if not isinstance(c, np.ndarray) else convert(c)
        for c in (output_token_ids, counts[0], counts[1])
    )  # type: ignore[return-value]
