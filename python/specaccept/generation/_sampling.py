"""Turning scores into drafted tokens, and logits into probabilities.

A drafter must sample each draft from exactly the distribution the verifier is
given for it (docs/spec.md section 12.3):

- chains verified from logits: :func:`sample_logits` draws through
  :func:`specaccept.verify_logits` itself (no drafts, the uniform as the bonus
  draw), so a draft comes from the very weights verification computes for it;
- everything verified from probabilities (trees, ``LanguageModel`` targets):
  :func:`transform` turns logits into float64 probabilities once, and
  :func:`sample_rows` draws from those rows, which are then handed to the
  verifier as they are.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._errors import InputError
from .._logits import verify_logits

__all__ = ["Sampling", "log", "sample_logits", "sample_rows", "transform", "without"]


def log(probs: np.ndarray) -> np.ndarray:
    """Probabilities as logits (``log 0 = -inf``): temperature and filters on a
    probability model mean the transform of its log-probabilities."""
    with np.errstate(divide="ignore"):
        return np.log(np.asarray(probs, np.float64))


class Sampling:
    """Per-row temperature, top-k, top-p and min-p (``[R]`` arrays) of the rows in
    a step, and where min-p applies (``min_p_last``: after top-p, transformers'
    order; else before top-k, vLLM's). Temperature 0 is a greedy row."""

    def __init__(
        self,
        temperature: np.ndarray,
        top_k: np.ndarray,
        top_p: np.ndarray,
        min_p: np.ndarray | None = None,
        min_p_last: bool = False,
    ):
        self.temperature, self.top_k, self.top_p = temperature, top_k, top_p
        self.min_p = np.zeros(len(temperature)) if min_p is None else min_p
        self.min_p_last = min_p_last

    def rows(self, rows: Any) -> Sampling:
        return Sampling(
            self.temperature[rows],
            self.top_k[rows],
            self.top_p[rows],
            self.min_p[rows],
            self.min_p_last,
        )

    def with_temperature(self, temperature: np.ndarray) -> Sampling:
        """The same filters at another temperature."""
        return Sampling(temperature, self.top_k, self.top_p, self.min_p, self.min_p_last)

    @property
    def greedy(self) -> np.ndarray:
        return self.temperature == 0

    @property
    def plain(self) -> bool:
        """Every row greedy, or at temperature 1 without filters: probabilities
        are used as they are (a greedy row takes their argmax)."""
        sampled = ~self.greedy
        return bool(
            (self.temperature[sampled] == 1).all()
            and (self.top_k[sampled] == 0).all()
            and (self.top_p[sampled] == 1).all()
            and (self.min_p[sampled] == 0).all()
        )


def sample_logits(
    logits: np.ndarray, sampling: Sampling, uniforms: np.ndarray | None, name: str
) -> tuple[np.ndarray, dict[int, InputError]]:
    """One token per row of ``logits [R, V]`` from the transformed row, by
    :func:`specaccept.verify_logits` with no drafts and ``uniforms [R]`` as the
    bonus draws (greedy rows: the argmax). Rows with bad logits are returned as
    errors (an :class:`InputError` naming ``name``), their token ``-1``."""
    rows = logits.shape[0]
    if uniforms is None:
        uniforms = np.zeros(rows)
    result = verify_logits(
        np.zeros((rows, 0), dtype=np.int64),
        logits[:, None, :],
        temperature=sampling.temperature,
        top_k=sampling.top_k,
        top_p=sampling.top_p,
        min_p=sampling.min_p,
        min_p_last=sampling.min_p_last,
        uniforms=np.zeros((rows, 0)),
        recovery_uniforms=uniforms,
        errors="isolate",
    )
    errors = {
        int(b): InputError(
            f"{name} row {b}: {error}".replace("target_logits", name),
            argument=name.split(".")[0],
            row=int(b),
        )
        for b, error in result.errors.items()
    }
    return np.asarray(result.output_token_ids)[:, 0].astype(np.int64), errors


#: :func:`transform` works on blocks of rows of at most this many values (512 KB
#: of float64: a block's passes stay in cache; a row of a large vocabulary is a
#: block alone).
BLOCK_VALUES = 1 << 16


def transform(
    logits: np.ndarray,
    sampling: Sampling,
    counts: list[int] | None = None,
    name: str = "target",
    numbers: np.ndarray | None = None,
) -> tuple[np.ndarray, dict[int, InputError]]:
    """``logits [R, ..., V]`` as float64 probabilities, row by row, with
    :func:`specaccept.verify_logits`'s (docs/spec.md section 8.2) temperature,
    min-p (before top-k, or after top-p with ``min_p_last``), top-k and top-p; a
    greedy row becomes one-hot at its first largest logit.
    With ``counts``, only the first ``counts[r]`` rows of ``r`` are read (the rest
    stay 0). Rows with NaN, ``+inf`` or no finite logit are returned as errors
    (an :class:`InputError` naming ``name`` and the row, ``numbers[r]`` where
    the rows are others' subset; the row stays zeros). Computed on
    blocks of rows at once (:data:`BLOCK_VALUES`), each value as a row alone
    would give it."""
    values = np.asarray(logits, dtype=np.float64)
    shape = values.shape
    flat = values.reshape(shape[0], -1, shape[-1])
    rows, positions, vocab = flat.shape
    out = np.zeros(flat.shape)
    read = np.ones((rows, positions), dtype=bool)
    if counts is not None:
        read = np.arange(positions) < np.asarray(counts, dtype=np.int64)[:, None]
    errors: dict[int, InputError] = {}
    step = max(1, BLOCK_VALUES // max(1, positions * vocab))
    for first in range(0, rows, step):
        block = slice(first, min(rows, first + step))
        errors.update(
            _transform_block(flat[block], read[block], sampling, first, name, numbers, out[block])
        )
    return out.reshape(shape), errors


def _transform_block(
    values: np.ndarray,
    read: np.ndarray,
    sampling: Sampling,
    first: int,
    name: str,
    numbers: np.ndarray | None,
    out: np.ndarray,
) -> dict[int, InputError]:
    """:func:`transform` of rows ``first ..`` (``values [B, P, V]``, ``read [B,
    P]``), written into ``out``; the rows' errors, by row (each named
    ``numbers[row]`` when given). A greedy row is its one-hot
    rows alone; top-k partitions the rows of each ``k`` together (as a row
    alone, no full sort)."""
    errors: dict[int, InputError] = {}
    bad = (np.isnan(values) | (values == np.inf)).any(axis=-1) & read
    empty = ~(values > -np.inf).any(axis=-1) & read
    failed = bad.any(axis=1) | empty.any(axis=1)
    for b in np.flatnonzero(failed):
        used = values[b, : int(read[b].sum())]
        where = np.argwhere(np.isnan(used) | (used == np.inf))
        detail = (
            f"logits must be finite or -inf (a {used[tuple(where[0])]} at {tuple(where[0])})"
            if len(where)
            else "a row has no finite logit"
        )
        row = first + int(b)
        label = row if numbers is None else int(numbers[row])
        errors[row] = InputError(f"{name} row {label}: {detail}", argument=name, row=label)
    index = np.arange(first, first + len(values))
    temperature = sampling.temperature[index]
    greedy = (temperature == 0) & ~failed
    if greedy.any():
        at = np.flatnonzero(greedy)
        arg = values.argmax(axis=-1)[at]
        which, position = np.nonzero(read[at])
        out[at[which], position, arg[which, position]] = 1.0
    rows = np.flatnonzero(~greedy & ~failed)
    if not rows.size:
        return errors
    v = values if rows.size == len(values) else values[rows]
    scale = 1.0 / temperature[rows].astype(np.float64)
    top = v.max(axis=-1, keepdims=True)
    with np.errstate(under="ignore", over="ignore", invalid="ignore"):
        weights = np.exp((v - top) * scale[:, None, None])
    weights[v == -np.inf] = 0.0
    keep = np.ones(weights.shape, dtype=bool)
    # Min-p: weights at least min_p (the largest weight is exp(0) = 1).
    min_p = sampling.min_p[index][rows]
    floor = None
    if (min_p > 0).any():
        floor = (min_p > 0)[:, None, None] & (weights < min_p[:, None, None])
    if floor is not None and not sampling.min_p_last:
        keep &= ~floor
    k = sampling.top_k[index][rows]
    for kk in np.unique(k[(k > 0) & (k < weights.shape[-1])]):
        group = np.flatnonzero(k == kk)
        kth = np.partition(weights[group], -int(kk), axis=-1)[..., -int(kk)]
        keep[group] &= weights[group] >= kth[..., None]
    top_p = sampling.top_p[index][rows]
    nucleus = np.flatnonzero(top_p < 1.0)
    if nucleus.size:
        kept = np.where(keep[nucleus], weights[nucleus], 0.0)
        ordered = -np.sort(-kept, axis=-1)
        cumulative = np.cumsum(ordered, axis=-1)
        reach = cumulative >= top_p[nucleus][:, None, None] * cumulative[..., -1:]
        last = np.where(reach.any(axis=-1), reach.argmax(axis=-1), ordered.shape[-1] - 1)
        bound = np.take_along_axis(ordered, last[..., None], -1)
        keep[nucleus] &= weights[nucleus] >= bound
    if floor is not None and sampling.min_p_last:
        keep &= ~floor
    weights = np.where(keep, weights, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        probs = weights / weights.sum(axis=-1, keepdims=True)
    unread = ~read[rows]
    if unread.any():
        probs[unread] = 0.0
    if rows.size == len(values):
        out[...] = probs
    else:
        out[rows] = probs
    return errors


def sample_rows(probs: np.ndarray, uniforms: np.ndarray | None, greedy: np.ndarray) -> np.ndarray:
    """One token per row of ``probs [R, V]``: the argmax for greedy rows (or
    without uniforms), else the first index whose cumulative weight passes
    ``u * total`` (never a zero-probability token)."""
    tokens = probs.argmax(axis=1)
    if uniforms is None:
        return tokens
    cdf = np.cumsum(probs, axis=1, dtype=np.float64)
    target = uniforms * cdf[:, -1]
    drawn = (cdf <= target[:, None]).sum(axis=1)
    positive = probs > 0
    last = probs.shape[1] - 1 - positive[:, ::-1].argmax(axis=1)
    drawn = np.minimum(drawn, last)
    return np.where(greedy, tokens, drawn)


def without(probs: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """``probs [R, V]`` with each row's ``tokens[r]`` removed and the rest
    renormalised (zeros where nothing is left): the law of a sibling drawn
    without replacement."""
    rest = probs.copy()
    rest[np.arange(len(tokens)), tokens] = 0.0
    total = rest.sum(axis=1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, rest / np.where(total > 0, total, 1.0), 0.0)
