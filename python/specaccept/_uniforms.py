"""Where the uniforms come from when the caller does not give them: the ``rng``
forms and the draw order fixed by docs/spec.md section 4.

One Generator (or a seed, or ``None`` for fresh entropy) draws ``B*K + B``
values in one call (the acceptance uniforms, then the recovery uniforms); a
sequence of ``B`` Generators gives each row its own stream. A count of uniforms
too large for the process is a ``MemoryError`` naming where it comes from.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ._arrays import int_array
from ._errors import InputError

__all__ = ["RngLike", "SeedLike", "as_generator", "draw", "draw_missing", "draw_uniforms"]

#: What ``rng`` accepts: ``None`` (fresh entropy), an int seed, a Generator, or
#: one Generator per batch row.
RngLike = int | np.random.Generator | Sequence[np.random.Generator] | None

#: What ``rng`` accepts where rows have no streams of their own (``verify_tree``,
#: the vLLM layer): ``None``, an int seed or a Generator.
SeedLike = int | np.random.Generator | None


def as_generator(rng: Any, per_row: bool = True) -> np.random.Generator:
    """``rng`` as one Generator (``per_row``: the caller also takes a sequence of
    Generators, which the message then mentions)."""
    if isinstance(rng, np.random.Generator):
        return rng
    if rng is None:
        return np.random.default_rng()
    if isinstance(rng, (int, np.integer)) and not isinstance(rng, (bool, np.bool_)):
        if rng < 0:
            raise InputError(f"rng: a seed must be >= 0, got {rng}", argument="rng")
        return np.random.default_rng(rng)
    also = " or a sequence of B Generators" if per_row else ""
    raise TypeError(
        f"rng must be None, an int seed, a numpy.random.Generator{also}, got {type(rng).__name__}"
    )


def draw(
    rng: Any,
    batch: int,
    num_draft: int,
    counts: np.ndarray | None,
    need_uniforms: bool,
    need_recovery: bool,
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Draws the missing uniforms from ``rng`` in the order docs/spec.md fixes."""
    if isinstance(rng, Sequence) and not isinstance(rng, (str, bytes)):
        if len(rng) != batch:
            raise InputError(
                f"rng: a sequence of Generators must have one per row (B = {batch}), got {len(rng)}",
                argument="rng",
            )
        for b, g in enumerate(rng):
            if not isinstance(g, np.random.Generator):
                raise TypeError(
                    f"rng[{b}] must be a numpy.random.Generator, got {type(g).__name__}"
                )
        uniforms = _zeros((batch, num_draft)) if need_uniforms else None
        recovery = _zeros((batch,)) if need_recovery else None
        for b, g in enumerate(rng):
            k = num_draft if counts is None else int(counts[b])
            if not 0 <= k <= num_draft:
                continue  # a bad count: the native code names it (or isolates the row)
            # Row b's stream: its k_b acceptance uniforms, then its recovery uniform.
            if uniforms is not None:
                uniforms[b, :k] = g.random(k)
            if recovery is not None:
                recovery[b] = g.random()
        return uniforms, recovery
    g = as_generator(rng)
    split = batch * num_draft
    if need_uniforms and need_recovery:
        # One call, the same stream as g.random((B, K)) then g.random(B).
        drawn = draw_uniforms(g, split + batch)
        return drawn[:split].reshape(batch, num_draft), drawn[split:]
    uniforms = draw_uniforms(g, split, (batch, num_draft)) if need_uniforms else None
    recovery = draw_uniforms(g, batch) if need_recovery else None
    return uniforms, recovery


def _zeros(shape: tuple[int, ...]) -> np.ndarray:
    try:
        return np.zeros(shape)
    except (MemoryError, ValueError):
        raise MemoryError(
            f"uniforms: {shape} float64 uniforms drawn from rng cannot be allocated; "
            "the size comes from draft_token_ids [B, K]"
        ) from None


def draw_missing(
    rng: Any, draft_token_ids: Any, num_draft_tokens: Any, u: Any, ru: Any
) -> tuple[Any, Any]:
    ids = int_array(draft_token_ids, "draft_token_ids")
    if ids.ndim != 2:
        raise InputError(
            f"draft_token_ids must be 2-D [B, K], got shape {ids.shape}", argument="draft_token_ids"
        )
    counts = None
    if num_draft_tokens is not None and not isinstance(rng, np.random.Generator):
        # Only per-row Generators need the counts before the native call.
        counts = int_array(num_draft_tokens, "num_draft_tokens")
        if counts.shape != ids.shape[:1]:
            raise InputError(
                f"num_draft_tokens: has shape {counts.shape}, expected {ids.shape[:1]} ([B])",
                argument="num_draft_tokens",
            )
    drawn_u, drawn_ru = draw(rng, ids.shape[0], ids.shape[1], counts, u is None, ru is None)
    return (drawn_u if u is None else u), (drawn_ru if ru is None else ru)


def draw_uniforms(
    g: np.random.Generator,
    n: int,
    shape: tuple[int, ...] | None = None,
    source: str = "draft_token_ids [B, K]",
) -> np.ndarray:
    """``g.random(n)`` (reshaped), or a ``MemoryError`` naming where ``n`` comes from."""
    try:
        drawn = g.random(n)
    except (MemoryError, ValueError):
        raise MemoryError(
            f"uniforms: the {n} uniforms ({n * 8} bytes) to draw from rng cannot be "
            f"allocated; their count comes from {source}"
        ) from None
    return drawn if shape is None else drawn.reshape(shape)
