"""Shared builders of verification inputs for the tests."""

from __future__ import annotations

import numpy as np
import pytest

FLOAT_DTYPES = (np.float16, np.float32, np.float64)
ID_DTYPES = (np.int32, np.int64)
LAST_UNIFORM = float(np.nextafter(1.0, 0.0))


def random_rows(rng: np.random.Generator, shape: tuple[int, ...], dtype) -> np.ndarray:
    """Random probability rows over the last axis (normalised in float64, then cast)."""
    raw = rng.gamma(0.5, size=shape)
    sums = raw.sum(axis=-1, keepdims=True)
    rows = np.divide(raw, sums, out=np.zeros_like(raw), where=sums > 0)
    return rows.astype(dtype)


def sample_rows(rng: np.random.Generator, probs: np.ndarray) -> np.ndarray:
    """One token per row of ``probs [..., V]`` by inverse CDF (vectorised)."""
    cdf = np.cumsum(probs.astype(np.float64), axis=-1)
    u = rng.random((*probs.shape[:-1], 1)) * cdf[..., -1:]
    return np.minimum((cdf <= u).sum(axis=-1), probs.shape[-1] - 1)


def strided_layout(rng: np.random.Generator, array: np.ndarray, layout: str) -> np.ndarray:
    """The same values as ``array``, laid out in memory another way (never contiguous C)."""
    if layout == "c":
        return array
    if layout == "fortran":
        return np.asfortranarray(array)
    if layout == "step":
        # A slice of a larger buffer: every other element of the last axis.
        big = np.zeros((*array.shape[:-1], 2 * array.shape[-1]), dtype=array.dtype)
        big[..., ::2] = array
        return big[..., ::2]
    if layout == "reversed":
        # Negative strides: the reversed view of a reversed copy.
        return np.ascontiguousarray(array[..., ::-1])[..., ::-1]
    raise ValueError(layout)


LAYOUTS = ("c", "fortran", "step", "reversed")


def random_case(seed: int) -> dict:
    """A random valid input of ``verify``, with adversarial values planted.

    Covers B in 0..9, K in 0..8, V in 1..300, mixed float dtypes for p and q,
    int32/int64 ids, ragged rows, mixed greedy rows, draft_probs=None, uniforms at
    0, at nextafter(1, 0) and exactly at p/q, p == q, p == 0, q == 0, one-hot rows,
    zero tails and non-contiguous layouts.
    """
    rng = np.random.default_rng(seed)
    batch = int(rng.integers(0, 10))
    num_draft = int(rng.integers(0, 9))
    vocab = int(rng.choice([1, 2, 3, 7, 16, 33, 64, 255, 256, 257, 300]))
    p_dtype = FLOAT_DTYPES[rng.integers(3)]
    q_dtype = FLOAT_DTYPES[rng.integers(3)]
    with_draft = rng.random() < 0.75

    p = random_rows(rng, (batch, num_draft + 1, vocab), np.float64)
    q = random_rows(rng, (batch, num_draft, vocab), np.float64)
    # Drafts mostly sampled from q (or from p, to get long accepted prefixes).
    source = q if rng.random() < 0.5 else p[:, :num_draft]
    ids = sample_rows(rng, source) if batch * num_draft else np.zeros((batch, num_draft), int)
    ids = ids.astype(np.int64)

    counts = None
    if rng.random() < 0.4:
        counts = rng.integers(0, num_draft + 1, size=batch)
        for b in range(batch):
            ids[b, counts[b] :] = rng.choice([-1, vocab, 10**9])  # ignored past k_b

    # Plant adversarial values on random positions (dyadic values: exact in f16 too).
    for b in range(batch):
        for t in range(num_draft):
            x = ids[b, t]
            if not 0 <= x < vocab:
                continue
            kind = rng.integers(0, 10)
            if kind == 0:
                p[b, t, x] = q[b, t, x] = 0.25  # p == q
            elif kind == 1 and vocab > 1:
                p[b, t, x] = 0.0  # p == 0: always rejected
            elif kind == 2:
                q[b, t, x] = 0.0  # q == 0 < p: accepted outright
            elif kind == 3:
                p[b, t] = 0.0
                p[b, t, x] = 1.0  # one-hot target at the draft
            elif kind == 4:
                cut = rng.integers(1, vocab + 1)
                p[b, t, cut:] = 0.0  # zero tail
                q[b, t, cut:] = 0.0
            elif kind == 5:
                p[b, t, x], q[b, t, x] = 0.375, 0.75  # u == p/q == 0.5 exactly
    if rng.random() < 0.2 and batch:
        p[0, -1] = 0.0
        p[0, -1, vocab - 1] = 1.0  # one-hot bonus at the last token

    p = p.astype(p_dtype)
    q = q.astype(q_dtype)
    u_dtype = FLOAT_DTYPES[1 + rng.integers(2)]
    uniforms = rng.random((batch, num_draft)).astype(u_dtype)
    specials = rng.integers(0, 6, size=(batch, num_draft))
    uniforms[specials == 0] = 0.0
    uniforms[specials == 1] = np.nextafter(u_dtype(1), u_dtype(0))  # the largest u < 1
    ratio_sites = specials == 2
    for b, t in zip(*np.nonzero(ratio_sites), strict=True):
        x = ids[b, t]
        if 0 <= x < vocab:
            pp, qq = float(p[b, t, x]), float(q[b, t, x]) if with_draft else 1.0
            if qq > pp > 0:
                uniforms[b, t] = pp / qq  # exactly at the boundary: rejects
                if float(uniforms[b, t]) != pp / qq:
                    uniforms[b, t] = 0.0  # p/q not representable in this dtype
    recovery = rng.random(batch)
    recovery[rng.random(batch) < 0.15] = 0.0
    recovery[rng.random(batch) < 0.15] = LAST_UNIFORM

    greedy: bool | np.ndarray = False
    mode = rng.integers(0, 4)
    if mode == 1:
        greedy = rng.random(batch) < 0.5
    elif mode == 2:
        greedy = True

    layout_p = LAYOUTS[rng.integers(4)]
    layout_q = LAYOUTS[rng.integers(4)]
    return dict(
        draft_token_ids=strided_layout(
            rng, ids.astype(ID_DTYPES[rng.integers(2)]), LAYOUTS[rng.integers(4)]
        ),
        target_probs=strided_layout(rng, p, layout_p),
        draft_probs=strided_layout(rng, q, layout_q) if with_draft else None,
        num_draft_tokens=counts,
        uniforms=strided_layout(rng, uniforms, LAYOUTS[rng.integers(4)]),
        recovery_uniforms=recovery,
        greedy=greedy,
    )


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(20261129)
