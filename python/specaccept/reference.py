"""The pure-Python reference: what specaccept computes, written to be read.

Every public function of :mod:`specaccept` is here with the same signature and
the same exceptions, in plain loops over Python floats. It is the oracle of the
parity tests: the Rust code must return the same tokens and counts on every
valid input, and raise the same exception types on bad input. It is slow; use it
to read the rules or to check a result, not to serve.

All arithmetic is IEEE float64, like the native code. The one place where the
order of float operations matters, the sum of a row of weights, follows the
canonical summation order (blocks of ``SUM_BLOCK`` elements, ``SUM_LANES``
accumulators each) so that both sides round identically.
"""

from __future__ import annotations

import math
import numbers
import sys
from collections.abc import Sequence
from types import MappingProxyType
from typing import Any

import numpy as np

from . import _schedule
from ._arrays import as_numpy, is_bfloat16, like_converter
from ._checks import check_flag
from ._errors import InputError
from ._options import chain_rule
from ._result import _NO_ERRORS, TreeVerification, Verification, _verification
from ._uniforms import counter_given, counter_keys

__all__ = [
    "SUM_BLOCK",
    "SUM_LANES",
    "AdaptiveK",
    "acceptance_mask",
    "acceptance_rate",
    "accepted_prefix_length",
    "counter_uniform",
    "counter_uniforms",
    "philox4x32_10",
    "rejection_probability",
    "sample_index",
    "transform_logits",
    "verify",
    "verify_greedy",
    "verify_logits",
    "verify_tree",
    "verify_tree_logits",
]

SUM_BLOCK = 256
SUM_LANES = 16


# --------------------------------------------------------------------------
# docs/spec.md section 1: the acceptance rule for one drafted token.
# --------------------------------------------------------------------------


def _rejection_probability(p: float, q: float) -> float:
    if p == 0.0:
        return 1.0  # the target rules the token out
    if q <= p:
        return 0.0  # accepted outright
    return 1.0 - p / q


def _is_accepted(p: float, q: float, u: float) -> bool:
    if p == 0.0:
        return False  # even when q == 0: a token the target rules out is never emitted
    if q <= p:
        return True  # accepted outright; u is not consulted
    if q == 0.0:
        # Only a NaN p gets here (a residual after a round whose factor
        # overflowed, docs/spec.md section 7.3): NaN / 0 is NaN in float64, and
        # u < NaN is false. Python's division would raise instead.
        return False
    return u < p / q  # rejected with probability 1 - p/q


# --------------------------------------------------------------------------
# Checking what is read. Messages name the argument and the index.
# --------------------------------------------------------------------------


def _where(name: str, index: tuple[int, ...]) -> str:
    return f"{name}[{', '.join(str(i) for i in index)}]"


def _bad(message: str, name: str, index: tuple[int, ...] | None = None) -> InputError:
    """The error for a bad value of ``name`` at ``index``; its row is the index's
    first entry (the batch row), none for a scalar or a shape."""
    row = index[0] if index else None
    return InputError(message, argument=name, index=index, row=row)


def _gathered(value: Any, name: str, index: tuple[int, ...]) -> float:
    """A drafted token's probability p(x_t) or q(x_t): must lie in [0, 1]."""
    v = float(value)
    if not 0.0 <= v <= 1.0:
        raise _bad(
            f"{_where(name, index)} = {v!r}: the probability of a drafted token must lie in [0, 1]",
            name,
            index,
        )
    return v


def _uniform(value: Any, name: str, index: tuple[int, ...]) -> float:
    u = float(value)
    if not 0.0 <= u < 1.0:
        raise _bad(f"{_where(name, index)} = {u!r}: a uniform draw must lie in [0, 1)", name, index)
    return u


def _entry(value: Any, name: str, index: tuple[int, ...]) -> float:
    """One entry of a probability row that is read: finite and >= 0."""
    v = float(value)
    if not (v >= 0.0 and v != float("inf")):
        raise _bad(
            f"{_where(name, index)} = {v!r}: probabilities must be finite and non-negative",
            name,
            index,
        )
    return v


def _row(values: np.ndarray, name: str, b: int, t: int) -> list[float]:
    """A whole probability row that is read, checked entry by entry."""
    return [_entry(v, name, (b, t, i)) for i, v in enumerate(values)]


def _array(x: Any, name: str, kinds: str, what: str) -> np.ndarray:
    x = as_numpy(x, name)  # tensors and other CPU arrays: the same memory, as NumPy
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name} must be a numpy.ndarray of {what}, got {type(x).__name__}")
    if x.dtype.kind not in kinds:
        raise TypeError(f"{name} must have dtype {what}, got {x.dtype}")
    return x


def _floats(x: Any, name: str) -> np.ndarray:
    x = as_numpy(x, name)
    if isinstance(x, np.ndarray) and is_bfloat16(x.dtype):
        return x.astype(np.float64)  # exact: every bfloat16 is a float64
    return _array(x, name, "f", "float16, bfloat16, float32 or float64")


_INT64_MAX = 2**63 - 1


def _ints(x: Any, name: str) -> np.ndarray:
    x = _array(x, name, "iu", "integers")
    if x.dtype.kind == "u" and x.dtype.itemsize == 8 and x.size and int(x.max()) > _INT64_MAX:
        # Past int64 no id, count or output fits: refused when read, as natively.
        index = tuple(int(i) for i in np.unravel_index(int(np.argmax(x > _INT64_MAX)), x.shape))
        raise InputError(
            f"{_where(name, index)} = {int(x[index])} is above the int64 range (2**63 - 1)",
            argument=name,
            index=index,
            row=index[0] if x.ndim >= 2 else None,
        )
    return x


def _ndim(x: np.ndarray, name: str, ndim: int) -> None:
    if x.ndim != ndim:
        raise InputError(f"{name} must be {ndim}-D, got shape {x.shape}", argument=name)


def _shape(x: np.ndarray | None, name: str, shape: tuple[int, ...]) -> None:
    if x is not None and x.shape != shape:
        raise InputError(f"{name}: has shape {x.shape}, expected {shape}", argument=name)


def _chain_shapes(target, target_name, draft, draft_name, counts, u, ru, batch, num_draft) -> int:
    """A chain's arrays checked against ``[B, K]``: ranks first, then shapes
    (``target [B, K+1, V]``, ``draft [B, K, V]``, ``[B]``, ``[B, K]``); returns ``V``."""
    _ndim(target, target_name, 3)
    vocab = target.shape[2]
    for x, name, ndim in (
        (draft, draft_name, 3),
        (counts, "num_draft_tokens", 1),
        (u, "uniforms", 2),
        (ru, "recovery_uniforms", 1),
    ):
        if x is not None:
            _ndim(x, name, ndim)
    _shape(target, target_name, (batch, num_draft + 1, vocab))
    _shape(draft, draft_name, (batch, num_draft, vocab))
    _shape(counts, "num_draft_tokens", (batch,))
    _shape(u, "uniforms", (batch, num_draft))
    _shape(ru, "recovery_uniforms", (batch,))
    return vocab


def _draft_len(counts: np.ndarray | None, b: int, num_draft: int) -> int:
    if counts is None:
        return num_draft
    k = int(counts[b])
    if not 0 <= k <= num_draft:
        raise _bad(
            f"num_draft_tokens[{b}] = {k} is outside [0, K] with K = {num_draft}",
            "num_draft_tokens",
            (b,),
        )
    return k


# --------------------------------------------------------------------------
# Sizes: every buffer whose size comes from an argument is asked for before
# any loop runs, so a size no process can hold is a MemoryError naming the
# argument (as natively), never hours of Python loops.
# --------------------------------------------------------------------------


def _show_bytes(nbytes: float) -> str:
    units = ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")
    value, unit = float(nbytes), 0
    while value >= 1024.0 and unit + 1 < len(units):
        value, unit = value / 1024.0, unit + 1
    return f"{int(nbytes)} bytes" if unit == 0 else f"{value:.1f} {units[unit]}"


def _reserve(n: int, argument: str) -> None:
    """Room for ``n`` float64 values (a row of ``V``, a tree of ``N`` nodes), or a
    ``MemoryError`` naming the argument the size comes from."""
    try:
        np.empty(n, dtype=np.float64)
    except (MemoryError, ValueError):
        raise MemoryError(
            f"{argument}: needs a buffer of {n} values ({_show_bytes(n * 8.0)}), "
            "which cannot be allocated"
        ) from None


def _full(shape: tuple[int, ...], fill: Any, dtype: Any, output: str, source: str) -> np.ndarray:
    """An output array, or a ``MemoryError`` naming it and where its size comes from."""
    try:
        return np.full(shape, fill, dtype=dtype)
    except (MemoryError, ValueError):
        n = math.prod(shape)
        raise MemoryError(
            f"{output}: an output of shape {list(shape)} ({_show_bytes(n * 8.0)}) cannot be "
            f"allocated; its size comes from {source}"
        ) from None


def _random(g: np.random.Generator, shape: Any, source: str = "draft_token_ids [B, K]") -> Any:
    """``g.random(shape)``, or a ``MemoryError`` naming the uniforms and their source."""
    try:
        return g.random(shape)
    except (MemoryError, ValueError):
        n = math.prod(shape) if isinstance(shape, tuple) else shape
        raise MemoryError(
            f"uniforms: the {n} uniforms ({n * 8} bytes) to draw from rng cannot be "
            f"allocated; their count comes from {source}"
        ) from None


def _generator(rng: Any) -> np.random.Generator:
    """``rng`` as one Generator: itself, a fresh one (``None``), or a seed's."""
    if isinstance(rng, np.random.Generator):
        return rng
    if rng is None:
        return np.random.default_rng()
    if isinstance(rng, (int, np.integer)) and not isinstance(rng, (bool, np.bool_)):
        if rng < 0:
            raise InputError(f"rng: a seed must be >= 0, got {rng}", argument="rng")
        return np.random.default_rng(rng)
    raise TypeError("rng must be None, an int seed or a numpy.random.Generator")


def _isolating(errors: Any) -> bool:
    """``errors=``: ``"raise"`` (a bad row fails the call) or ``"isolate"`` (it is set aside)."""
    if not isinstance(errors, str):
        raise TypeError(f'errors must be "raise" or "isolate", got {type(errors).__name__}')
    if errors not in ("raise", "isolate"):
        raise InputError(
            f'errors must be "raise" or "isolate", got {errors!r:.40}', argument="errors"
        )
    return errors == "isolate"


# --------------------------------------------------------------------------
# Sampling from weights (docs/spec.md section 3) and argmax.
# --------------------------------------------------------------------------


def _block_sum(block: list[float]) -> float:
    """One block of the canonical summation: lane l adds the elements i % SUM_LANES == l
    in order; then the lanes are added pairwise (l0 + l1, l2 + l3, ...), and those
    sums pairwise, down to one."""
    lanes = [0.0] * SUM_LANES
    for j, w in enumerate(block):
        lanes[j % SUM_LANES] += w
    while len(lanes) > 1:
        lanes = [lanes[i] + lanes[i + 1] for i in range(0, len(lanes), 2)]
    return lanes[0]


def sample_index(weights: Sequence[float], u: float) -> int | None:
    """Inverse-CDF draw from non-negative weights with uniform ``u`` in ``[0, 1)``.

    Returns the smallest ``i`` with ``w_i > 0`` and ``w_0 + .. + w_i > u * T``
    (``T = sum(w)``); if rounding leaves none, the last ``i`` with ``w_i > 0``;
    ``None`` when every weight is 0. The sums follow the canonical order: block
    sums, their running total, and one block rescanned element by element.
    """
    blocks = [list(weights[s : s + SUM_BLOCK]) for s in range(0, len(weights), SUM_BLOCK)]
    block_sums = [_block_sum(block) for block in blocks]
    total = 0.0
    for s in block_sums:
        total += s
    if total == 0.0:
        return None
    threshold = u * total
    running = 0.0
    for j, s in enumerate(block_sums):
        if running + s > threshold:
            cumulative = running
            for i, w in enumerate(blocks[j]):
                cumulative += w
                if w > 0.0 and cumulative > threshold:
                    return j * SUM_BLOCK + i
        running += s
    return max(i for i, w in enumerate(weights) if w > 0.0)


def _argmax(values: np.ndarray, b: int, t: int) -> int:
    """The first index of the largest target probability (greedy decoding)."""
    if len(values) == 0:
        raise _bad(
            f"target_probs[{b}, {t}] is empty (V = 0): there is no token to choose",
            "target_probs",
            (b, t),
        )
    row = _row(values, "target_probs", b, t)
    best = 0
    for i, v in enumerate(row):
        if v > row[best]:
            best = i
    return best


def _sample_target(p: np.ndarray, b: int, t: int, u: float) -> int:
    token = sample_index(_row(p[b, t], "target_probs", b, t), u)
    if token is None:
        raise _bad(
            f"target_probs[{b}, {t}] sums to 0, but a token must be sampled from it",
            "target_probs",
            (b, t),
        )
    return token


def _residual(p: np.ndarray, q: np.ndarray | None, b: int, t: int, x: int) -> list[float]:
    """``max(0, p - q)`` at position t; with ``q`` one-hot at ``x``: ``p`` with ``x`` zeroed."""
    if q is None:
        weights = _row(p[b, t], "target_probs", b, t)
        weights[x] = 0.0
        return weights
    weights = []
    for i in range(p.shape[2]):
        # Entry by entry, p_i before q_i: the first bad value is the one reported.
        p_i = _entry(p[b, t, i], "target_probs", (b, t, i))
        q_i = _entry(q[b, t, i], "draft_probs", (b, t, i))
        weights.append(max(0.0, p_i - q_i))
    return weights


# --------------------------------------------------------------------------
# Counter-based uniforms (docs/spec.md section 4.6): Philox4x32-10 in Python
# integers (Salmon et al., SC 2011), keyed by a request's seed and offset.
# --------------------------------------------------------------------------

_PHILOX_M0, _PHILOX_M1 = 0xD2511F53, 0xCD9E8D57
_PHILOX_W0, _PHILOX_W1 = 0x9E3779B9, 0xBB67AE85
_MASK32 = 0xFFFFFFFF


def philox4x32_10(counter: Sequence[int], key: Sequence[int]) -> tuple[int, int, int, int]:
    """The four 32-bit outputs of Philox4x32-10 for ``counter`` (4 words) and ``key``
    (2), each word an int in ``[0, 2**32)``."""
    words = []
    for name, given, size in (("counter", counter, 4), ("key", key, 2)):
        if not isinstance(given, (Sequence, np.ndarray)) or len(given) != size:
            raise InputError(f"{name} must be {size} 32-bit words", argument=name)
        for w in given:
            if isinstance(w, (bool, np.bool_)) or not isinstance(w, (int, np.integer)):
                raise TypeError(f"{name} words must be ints, got {type(w).__name__}")
            if not 0 <= int(w) <= _MASK32:
                raise InputError(f"{name} word {int(w)} is outside [0, 2**32)", argument=name)
            words.append(int(w))
    c0, c1, c2, c3, k0, k1 = words
    for round_ in range(10):
        if round_:
            k0, k1 = (k0 + _PHILOX_W0) & _MASK32, (k1 + _PHILOX_W1) & _MASK32
        p0, p1 = _PHILOX_M0 * c0, _PHILOX_M1 * c2
        c0, c1, c2, c3 = (p1 >> 32) ^ c1 ^ k0, p1 & _MASK32, (p0 >> 32) ^ c3 ^ k1, p0 & _MASK32
    return c0, c1, c2, c3


def counter_uniform(seed: int, offset: int, index: int, stream: int) -> float:
    """The uniform of a request's ``(seed, offset)`` at ``index`` of ``stream``:
    ``((x0 << 32 | x1) >> 11) * 2**-53`` from the first two outputs of Philox with
    key ``(seed low, seed high)`` and counter ``(offset low, offset high, index, stream)``."""
    x0, x1, _, _ = philox4x32_10(
        (offset & _MASK32, offset >> 32, index, stream), (seed & _MASK32, seed >> 32)
    )
    return ((x0 << 32 | x1) >> 11) * 2.0**-53


def counter_uniforms(seeds, offsets, num_positions):
    """Reference of :func:`specaccept.counter_uniforms`."""
    if isinstance(num_positions, (bool, np.bool_)) or not isinstance(
        num_positions, (int, np.integer)
    ):
        raise TypeError(f"num_positions must be an int, got {type(num_positions).__name__}")
    if not 0 <= int(num_positions) <= 1 << 32:
        raise InputError(
            f"num_positions = {int(num_positions)} is outside [0, 2**32]",
            argument="num_positions",
        )
    keys, steps = counter_keys(seeds, offsets)
    return _counter_uniforms(keys, steps, int(num_positions))


def _counter_uniforms(keys: np.ndarray, steps: np.ndarray, num_positions: int):
    batch = keys.shape[0]
    source = "seeds [B] and num_positions"
    uniforms = _full((batch, num_positions), 0.0, np.float64, "uniforms", source)
    recovery = _full((batch,), 0.0, np.float64, "recovery_uniforms", source)
    for b in range(batch):
        seed, offset = int(keys[b]), int(steps[b])
        for i in range(num_positions):
            uniforms[b, i] = counter_uniform(seed, offset, i, 0)
        recovery[b] = counter_uniform(seed, offset, 0, 1)
    return uniforms, recovery


def _seeded(seeds, offsets, batch, num_positions, uniforms, recovery_uniforms, rng):
    """The counter-based uniforms of a call, or ``None`` without seeds/offsets."""
    if not counter_given(seeds, offsets, uniforms, recovery_uniforms, rng):
        return None
    keys, steps = counter_keys(seeds, offsets, batch)
    return _counter_uniforms(keys, steps, num_positions)


# --------------------------------------------------------------------------
# Randomness: what is missing is drawn from rng, in this order.
# --------------------------------------------------------------------------


def _draw_uniforms(
    rng, batch, num_draft, counts, uniforms, recovery_uniforms, source="draft_token_ids [B, K]"
):
    if uniforms is not None and recovery_uniforms is not None:
        return uniforms, recovery_uniforms
    if isinstance(rng, Sequence) and not isinstance(rng, (str, bytes)):
        # One stream per row: row b draws its k_b uniforms, then its recovery uniform.
        if len(rng) != batch:
            raise InputError(
                f"rng: a sequence of Generators must have one per row (B = {batch})",
                argument="rng",
            )
        for b, g in enumerate(rng):
            if not isinstance(g, np.random.Generator):
                raise TypeError(f"rng[{b}] must be a numpy.random.Generator")
        if counts is not None:
            _shape(counts, "num_draft_tokens", (batch,))
        new_uniforms = _random_zeros((batch, num_draft), source)
        new_recovery = _random_zeros((batch,), source)
        for b, g in enumerate(rng):
            k = num_draft if counts is None else int(counts[b])
            if not 0 <= k <= num_draft:
                continue  # a bad count draws nothing: its row names it (or is set aside)
            if uniforms is None:
                new_uniforms[b, :k] = g.random(k)
            if recovery_uniforms is None:
                new_recovery[b] = g.random()
    else:
        g = _generator(rng)
        # One stream for the batch: all acceptance uniforms, then the recovery uniforms.
        new_uniforms = _random(g, (batch, num_draft), source) if uniforms is None else None
        new_recovery = _random(g, batch, source) if recovery_uniforms is None else None
    return (
        new_uniforms if uniforms is None else uniforms,
        new_recovery if recovery_uniforms is None else recovery_uniforms,
    )


def _random_zeros(shape: tuple[int, ...], source: str) -> np.ndarray:
    try:
        return np.zeros(shape)
    except (MemoryError, ValueError):
        raise MemoryError(
            f"uniforms: {shape} float64 uniforms drawn from rng cannot be allocated; "
            f"the size comes from {source}"
        ) from None


def _out_buffers(out: Any, inputs: dict[str, Any]) -> list[Any] | None:
    """``out=`` checked in the native order: per array its type, rank, dtype, that
    it shares no memory with an input or an earlier output, and that it is writeable."""
    if out is None:
        return None
    arrays: list[Any]
    if isinstance(out, Verification):
        arrays = [out.output_token_ids, out.num_accepted, out.num_emitted]
    elif isinstance(out, (tuple, list)) and len(out) in (2, 3):
        arrays = [out[0], out[1], out[2] if len(out) == 3 else None]
    else:
        raise TypeError(
            "out must be a Verification or a tuple (output_token_ids, num_accepted[, num_emitted]),"
            f" got {type(out).__name__}"
        )
    names = ("out.output_token_ids", "out.num_accepted", "out.num_emitted")
    arrays = [None if a is None else as_numpy(a, n) for a, n in zip(arrays, names, strict=True)]
    return _checked_out(arrays, names, (2, 1, 1), inputs)


_TREE_OUT = ("out.output_token_ids", "out.num_accepted", "out.num_emitted", "out.accepted_node_ids")


def _tree_out_arrays(out: Any) -> list[Any] | None:
    """A tree's ``out=`` as arrays (the container checked; the arrays later, in
    :func:`_checked_out`, once the parent links are read, as natively)."""
    if out is None:
        return None
    if isinstance(out, TreeVerification):
        parts = [out.output_token_ids, out.num_accepted, out.num_emitted, out.accepted_node_ids]
    elif isinstance(out, (tuple, list)) and len(out) == 4:
        parts = list(out)
    else:
        raise TypeError(
            "out must be a TreeVerification or a tuple (output_token_ids, num_accepted,"
            f" num_emitted or None, accepted_node_ids), got {type(out).__name__}"
        )
    return [
        None if a is None and n == "out.num_emitted" else as_numpy(a, n)
        for a, n in zip(parts, _TREE_OUT, strict=True)
    ]


def _checked_out(
    arrays: list[Any], names: tuple[str, ...], ndims: tuple[int, ...], inputs: dict[str, Any]
) -> list[Any]:
    seen = [(name, x) for name, x in inputs.items() if isinstance(x, np.ndarray)]
    for arr, name, ndim in zip(arrays, names, ndims, strict=True):
        if arr is None:
            continue
        if not isinstance(arr, np.ndarray):
            raise TypeError(f"{name} must be a numpy.ndarray, got {type(arr).__name__}")
        _ndim(arr, name, ndim)
        if arr.dtype != np.int64:
            raise TypeError(f"{name} must have dtype int64, got {arr.dtype}")
        for other, x in seen:
            if np.may_share_memory(arr, x):
                raise InputError(
                    f"{name} shares memory with {other}; outputs need buffers of their own",
                    argument=name,
                )
        if not arr.flags.writeable:
            raise InputError(f"{name} is read-only; outputs need writeable buffers", argument=name)
        if _overlaps_itself(arr):
            raise InputError(
                f"{name} has elements that share memory (a stride-0 or overlapping view);"
                " outputs need one element per value",
                argument=name,
            )
        seen.append((name, arr))
    return arrays


def _overlaps_itself(arr: np.ndarray) -> bool:
    """Whether two elements of ``arr`` share bytes: with the axes in order of
    stride, each stride must step past everything the smaller ones reach
    (conservative, as the native check)."""
    axes = sorted(
        (
            (extent, abs(stride))
            for extent, stride in zip(arr.shape, arr.strides, strict=True)
            if extent > 1
        ),
        key=lambda axis: axis[1],
    )
    reach = arr.itemsize
    for extent, stride in axes:
        if stride < reach:
            return True
        reach += stride * (extent - 1)
    return False


def _out_shapes(out: list[np.ndarray | None] | None, batch: int, num_draft: int) -> None:
    if out is not None:
        _shape(out[0], "out.output_token_ids", (batch, num_draft + 1))
        _shape(out[1], "out.num_accepted", (batch,))
        _shape(out[2], "out.num_emitted", (batch,))


def _row_drafts(ids: np.ndarray, counts, b: int, num_draft: int, vocab: int) -> list[int]:
    """Row ``b``'s first ``k_b`` drafts, each checked against ``[0, V)``."""
    drafts = [int(x) for x in ids[b, : _draft_len(counts, b, num_draft)]]
    for t, x in enumerate(drafts):
        if not 0 <= x < vocab:
            raise _bad(
                f"draft_token_ids[{b}, {t}] = {x} is outside [0, V) with V = {vocab}",
                "draft_token_ids",
                (b, t),
            )
    return drafts


def _result(
    out: list[np.ndarray | None] | None,
    output_token_ids: np.ndarray,
    num_accepted: np.ndarray,
    like: Any,
    isolated: dict[int, InputError] | None = None,
) -> Verification:
    """The result, written into the ``out`` buffers when given (their shapes checked),
    in ``like``'s framework; the rows in ``isolated`` (set aside by
    ``errors="isolate"``) have tokens ``-1`` and counts 0."""
    convert = like_converter(like) or (lambda a: a)
    num_emitted = num_accepted + 1
    for b in isolated or ():
        output_token_ids[b] = -1
        num_accepted[b] = num_emitted[b] = 0
    values: tuple[np.ndarray, ...] = (output_token_ids, num_accepted, num_emitted)
    if out is not None:
        values = tuple(
            value.copy() if buffer is None else buffer
            for buffer, value in zip(out, values, strict=True)
        )
        for buffer, value in zip(
            values, (output_token_ids, num_accepted, num_emitted), strict=True
        ):
            buffer[...] = value
    ids, accepted, emitted = (convert(v) for v in values)
    return _verification(ids, accepted, emitted, errors=isolated)


def _verify_rows(batch: int, isolate: bool, verify_row: Any) -> dict[int, InputError]:
    """``verify_row(b)`` for every row; with ``isolate``, a row whose values are
    bad is set aside with its error instead of failing the call."""
    isolated: dict[int, InputError] = {}
    for b in range(batch):
        try:
            verify_row(b)
        except InputError as error:
            if not isolate or error.row != b:
                raise
            isolated[b] = error
    return isolated


def _greedy_rows(greedy: Any, batch: int) -> list[bool]:
    if isinstance(greedy, (bool, np.bool_)):
        return [bool(greedy)] * batch
    greedy = as_numpy(greedy, "greedy")
    if isinstance(greedy, np.ndarray) and greedy.dtype.kind == "b":
        if greedy.ndim == 0:
            return [bool(greedy)] * batch
        _shape(greedy, "greedy", (batch,))
        return [bool(g) for g in greedy]
    raise TypeError(
        f"greedy must be a bool or a bool array of shape [B], got {type(greedy).__name__}"
    )


# --------------------------------------------------------------------------
# Section 2: chain verification.
# --------------------------------------------------------------------------


def verify(
    draft_token_ids,
    target_probs,
    draft_probs=None,
    *,
    num_draft_tokens=None,
    uniforms=None,
    recovery_uniforms=None,
    rng=None,
    seeds=None,
    offsets=None,
    greedy=False,
    out=None,
    like=None,
    errors="raise",
    method="token",
) -> Verification:
    """Reference of :func:`specaccept.verify`: the same arguments, the same result.

    Sizes are asked for before any loop: a buffer no process can hold is a
    ``MemoryError`` naming the argument, as natively. ``errors="isolate"`` sets
    aside each row with a bad value (its error in ``result.errors``)."""
    like_converter(like)  # an unusable like= fails before any work
    isolate = _isolating(errors)
    # Types of every argument first, then shapes, then values row by row.
    ids = _ints(draft_token_ids, "draft_token_ids")
    rule = chain_rule(method, ids.shape[1] if ids.ndim == 2 else 0)
    p = _floats(target_probs, "target_probs")
    q = None if draft_probs is None else _floats(draft_probs, "draft_probs")
    counts = None if num_draft_tokens is None else _ints(num_draft_tokens, "num_draft_tokens")
    u = None if uniforms is None else _floats(uniforms, "uniforms")
    ru = None if recovery_uniforms is None else _floats(recovery_uniforms, "recovery_uniforms")
    if not (
        isinstance(greedy, (bool, np.bool_))
        or (isinstance(greedy, np.ndarray) and greedy.dtype.kind == "b")
    ):
        raise TypeError(
            f"greedy must be a bool or a bool array of shape [B], got {type(greedy).__name__}"
        )
    all_greedy = isinstance(greedy, (bool, np.bool_)) and bool(greedy)
    _ndim(ids, "draft_token_ids", 2)
    buffers = _out_buffers(
        out,
        {
            "draft_token_ids": ids,
            "target_probs": p,
            "draft_probs": q,
            "num_draft_tokens": counts,
            "uniforms": u,
            "recovery_uniforms": ru,
            "greedy": greedy,
        },
    )

    batch, num_draft = ids.shape
    counter = _seeded(seeds, offsets, batch, num_draft, u, ru, rng)
    if counter is not None:
        u, ru = counter
    elif not all_greedy:
        u, ru = _draw_uniforms(rng, batch, num_draft, counts, u, ru)
    vocab = _chain_shapes(p, "target_probs", q, "draft_probs", counts, u, ru, batch, num_draft)
    greedy_rows = _greedy_rows(greedy, batch)
    _out_shapes(buffers, batch, num_draft)
    source = "draft_token_ids [B, K]"
    output_token_ids = _full((batch, num_draft + 1), -1, np.int64, "output_token_ids", source)
    num_accepted = _full((batch,), 0, np.int64, "num_accepted", source)
    if batch:
        _reserve(vocab, "target_probs")  # every row reads a whole row of V

    def verify_row(b: int) -> None:
        drafts = _row_drafts(ids, counts, b, num_draft, vocab)
        if greedy_rows[b]:
            n, next_token = _verify_row_greedy(p, b, drafts)
        elif rule == "block":
            n, next_token = _verify_row_block(p, q, u, ru, b, drafts)
        elif rule[0] == "typical":
            n, next_token = _verify_row_typical(p, q, u, ru, b, drafts, rule[1], rule[2])
        elif rule[0] == "synthetic":
            n, next_token = _verify_row_synthetic(p, u, ru, b, drafts, rule[1])
        else:
            n, next_token = _verify_row_sampled(p, q, u, ru, b, drafts)
        output_token_ids[b, :n] = drafts[:n]
        output_token_ids[b, n] = next_token
        num_accepted[b] = n

    isolated = _verify_rows(batch, isolate, verify_row)
    return _result(buffers, output_token_ids, num_accepted, like, isolated)


def _verify_row_greedy(p: np.ndarray, b: int, drafts: list[int]) -> tuple[int, int]:
    """Accept while the draft is the target's argmax; then emit the argmax."""
    for t, x in enumerate(drafts):
        best = _argmax(p[b, t], b, t)
        if best != x:
            return t, best
    k = len(drafts)
    return k, _argmax(p[b, k], b, k)


def _verify_row_sampled(p, q, u, ru, b: int, drafts: list[int]) -> tuple[int, int]:
    """Speculative sampling of one row: accept a prefix, then one sampled token."""
    if u is None or ru is None:
        raise InputError(
            "uniforms: uniforms and recovery_uniforms are required for rows verified by sampling",
            argument="uniforms",
        )
    k = len(drafts)
    row_uniforms = [_uniform(u[b, t], "uniforms", (b, t)) for t in range(k)]
    recovery = _uniform(ru[b], "recovery_uniforms", (b,))
    for t, x in enumerate(drafts):
        p_x = _gathered(p[b, t, x], "target_probs", (b, t, x))
        q_x = 1.0 if q is None else _gathered(q[b, t, x], "draft_probs", (b, t, x))
        if not _is_accepted(p_x, q_x, row_uniforms[t]):
            # Rejected at t: the replacement comes from the residual max(0, p - q).
            token = sample_index(_residual(p, q, b, t, x), recovery)
            if token is None:
                # Only rounding or unnormalised rows get here: sample from p itself.
                token = _sample_target(p, b, t, recovery)
            return t, token
    # Every draft accepted: the bonus token comes from the target's next row.
    return k, _sample_target(p, b, k, recovery)


# --------------------------------------------------------------------------
# The lossy methods (docs/spec.md sections 2.7 and 2.8): for comparison and
# load tests; their output does not follow the target distribution.
# --------------------------------------------------------------------------


def _row_uniforms(u, ru, b: int, k: int) -> tuple[list[float], float]:
    """A sampled row's uniforms, each checked (also past its first rejection)."""
    if u is None or ru is None:
        raise InputError(
            "uniforms: uniforms and recovery_uniforms are required for rows verified by sampling",
            argument="uniforms",
        )
    row = [_uniform(u[b, t], "uniforms", (b, t)) for t in range(k)]
    return row, _uniform(ru[b], "recovery_uniforms", (b,))


def _typical_stop(row_at, drafts: list[int], recovery: float, epsilon, delta, drafted=None):
    """Typical acceptance over the rows ``row_at(t)`` (lists of probabilities, none
    summing to 0): the accepted prefix and the next token. ``drafted(t, x)`` reads
    and checks ``p_t(x)`` (default: the row's entry)."""
    k = len(drafts)
    for t in range(k + 1):
        row = row_at(t)
        total = _canonical_total(row)
        ratios = [v / total for v in row]
        entropy = _canonical_total([-(r * math.log(r)) if 0.0 < r < 1.0 else 0.0 for r in ratios])
        threshold = min(epsilon, delta * math.exp(-entropy))
        if t < k:
            x = drafts[t]
            p_x = row[x] if drafted is None else drafted(t, x)
            if p_x / total > threshold:
                continue
        token = sample_index([v if v / total >= threshold else 0.0 for v in row], recovery)
        return t, (sample_index(row, recovery) if token is None else token)
    raise AssertionError("unreachable: the loop returns at t = k")


def _verify_row_typical(p, q, u, ru, b: int, drafts: list[int], epsilon: float, delta: float):
    """Typical acceptance (Medusa): accept while ``p(x_t) / S`` is above the row's
    threshold; then draw from the row at the stop, its entries below the
    threshold removed (all of it if none remains)."""
    _, recovery = _row_uniforms(u, ru, b, len(drafts))

    def drafted(t: int, x: int) -> float:
        p_x = _gathered(p[b, t, x], "target_probs", (b, t, x))
        if q is not None:
            _gathered(q[b, t, x], "draft_probs", (b, t, x))
        return p_x

    def row_at(t: int) -> list[float]:
        row = _row(p[b, t], "target_probs", b, t)
        if _canonical_total(row) <= 0.0:
            raise _bad(
                f"target_probs[{b}, {t}] sums to 0, but a token must be sampled from it",
                "target_probs",
                (b, t),
            )
        return row

    return _typical_stop(row_at, drafts, recovery, epsilon, delta, drafted)


def _verify_row_synthetic(p, u, ru, b: int, drafts: list[int], rates) -> tuple[int, int]:
    """Synthetic acceptance: position ``t`` accepted iff ``u_t < rates[t]``; then a
    draw from the target row at the stop."""
    k = len(drafts)
    row_uniforms, recovery = _row_uniforms(u, ru, b, k)
    n = next((t for t in range(k) if row_uniforms[t] >= rates[t]), k)
    return n, _sample_target(p, b, n, recovery)


# --------------------------------------------------------------------------
# Block verification (docs/spec.md section 2.6; Sun et al., ICLR 2025).
# --------------------------------------------------------------------------


def _block_method(method: Any) -> bool:
    """``method=``: ``"token"`` (False) or ``"block"`` (True)."""
    if not isinstance(method, str):
        raise TypeError(f"method must be one of ('token', 'block'), got {type(method).__name__}")
    if method not in ("token", "block"):
        raise InputError(
            f"method must be one of ('token', 'block'), got {method!r:.40}", argument="method"
        )
    return method == "block"


def _next_rho(previous: float, p: float, q: float) -> float:
    """rho_i from rho_{i-1} and position i-1's gathered p, q."""
    if previous == 0.0 or p == 0.0:
        return 0.0  # a path the target rules out stays ruled out
    if q == 0.0:
        return 1.0  # q = 0 < p: the ratio is infinite
    return min(1.0, previous * p / q)


def _block_h(z: float, rho: float) -> float:
    """h_i = Z_i / ((Z_i + 1) - rho_i), 1 where the denominator is 0."""
    denominator = (z + 1.0) - rho
    return 1.0 if denominator == 0.0 else z / denominator


def _scaled_residual(p: np.ndarray, q: np.ndarray, b: int, t: int, rho: float) -> list[float]:
    """``max(0, rho * p - q)`` at position t, entry by entry (p_i before q_i)."""
    weights = []
    for i in range(p.shape[2]):
        p_i = _entry(p[b, t, i], "target_probs", (b, t, i))
        q_i = _entry(q[b, t, i], "draft_probs", (b, t, i))
        weights.append(max(0.0, rho * p_i - q_i))
    return weights


def _verify_row_block(p, q, u, ru, b: int, drafts: list[int]) -> tuple[int, int]:
    """Block verification of one row: tau, the largest i with eta_i < h_i (eta_i the
    uniform of position i - 1), searched from i = k down; then one sampled token."""
    if u is None or ru is None:
        raise InputError(
            "uniforms: uniforms and recovery_uniforms are required for rows verified by sampling",
            argument="uniforms",
        )
    k = len(drafts)
    row_uniforms = [_uniform(u[b, t], "uniforms", (b, t)) for t in range(k)]
    recovery = _uniform(ru[b], "recovery_uniforms", (b,))
    # The path weights rho_0 .. rho_k, from every gathered value.
    rho, p_drafted = [1.0], []
    for t, x in enumerate(drafts):
        p_x = _gathered(p[b, t, x], "target_probs", (b, t, x))
        q_x = 1.0 if q is None else _gathered(q[b, t, x], "draft_probs", (b, t, x))
        p_drafted.append(p_x)
        rho.append(_next_rho(rho[t], p_x, q_x))
    tau = 0
    if k > 0 and row_uniforms[k - 1] < rho[k]:
        tau = k  # h_k = rho_k
    else:
        for i in range(k - 1, 0, -1):
            if row_uniforms[i - 1] >= rho[i]:
                continue  # h_i <= rho_i: fails without its round (docs/spec.md section 2.6)
            if q is None:
                z = rho[i] * (1.0 - p_drafted[i])  # one-hot drafts: no row is read
            else:
                z = _canonical_total(_scaled_residual(p, q, b, i, rho[i]))
            if row_uniforms[i - 1] < _block_h(z, rho[i]):
                tau = i
                break
    if tau == k:
        return k, _sample_target(p, b, k, recovery)
    if q is None:
        weights = _residual(p, None, b, tau, drafts[tau])  # p with the draft zeroed
    else:
        weights = _scaled_residual(p, q, b, tau, rho[tau])
    token = sample_index(weights, recovery)
    if token is None:
        # Only rounding or unnormalised rows get here: sample from p itself.
        token = _sample_target(p, b, tau, recovery)
    return tau, token


def verify_greedy(
    draft_token_ids, target_token_ids, *, num_draft_tokens=None, out=None, like=None
) -> Verification:
    """Reference of :func:`specaccept.verify_greedy`."""
    like_converter(like)
    ids = _ints(draft_token_ids, "draft_token_ids")
    targets = _ints(target_token_ids, "target_token_ids")
    counts = None if num_draft_tokens is None else _ints(num_draft_tokens, "num_draft_tokens")
    _ndim(ids, "draft_token_ids", 2)
    _ndim(targets, "target_token_ids", 2)
    if counts is not None:
        _ndim(counts, "num_draft_tokens", 1)
    buffers = _out_buffers(
        out,
        {"draft_token_ids": ids, "target_token_ids": targets, "num_draft_tokens": counts},
    )
    batch, num_draft = ids.shape
    _shape(targets, "target_token_ids", (batch, num_draft + 1))
    _shape(counts, "num_draft_tokens", (batch,))
    _out_shapes(buffers, batch, num_draft)
    source = "draft_token_ids [B, K]"
    output_token_ids = _full((batch, num_draft + 1), -1, np.int64, "output_token_ids", source)
    num_accepted = _full((batch,), 0, np.int64, "num_accepted", source)
    for b in range(batch):
        k = _draft_len(counts, b, num_draft)
        drafts = [int(x) for x in ids[b, :k]]
        for t, x in enumerate(drafts):
            if x < 0:
                raise _bad(
                    f"draft_token_ids[{b}, {t}] = {x} is negative; token ids must be >= 0",
                    "draft_token_ids",
                    (b, t),
                )
        n = 0
        while n < k and drafts[n] == int(targets[b, n]):
            n += 1
        for t in range(n + 1):
            y = int(targets[b, t])
            if y < 0:
                raise _bad(
                    f"target_token_ids[{b}, {t}] = {y} is negative; token ids must be >= 0",
                    "target_token_ids",
                    (b, t),
                )
            output_token_ids[b, t] = y
        num_accepted[b] = n
    return _result(buffers, output_token_ids, num_accepted, like)


# --------------------------------------------------------------------------
# Tree verification: many candidates per position (EAGLE, Medusa, SpecInfer).
# --------------------------------------------------------------------------


def _tree_depths(parents: list[int], b: int) -> list[int]:
    """Depth of each node (root 0; padding -1), checking the parent links."""
    depths = [0] * len(parents)
    if parents and parents[0] != -1:
        raise _bad(
            f"parent_ids[{b}, 0] = {parents[0]}: the root's parent must be -1", "parent_ids", (b, 0)
        )
    for n in range(1, len(parents)):
        parent = parents[n]
        if parent == -1:
            depths[n] = -1  # padding
        elif not 0 <= parent < n:
            raise _bad(
                f"parent_ids[{b}, {n}] = {parent}: a parent must come before its child "
                f"(0 <= parent < {n}) or be -1",
                "parent_ids",
                (b, n),
            )
        elif depths[parent] == -1:
            raise _bad(
                f"parent_ids[{b}, {n}] = {parent}: the parent is padding", "parent_ids", (b, n)
            )
        else:
            depths[n] = depths[parent] + 1
    return depths


def verify_tree(
    node_token_ids,
    parent_ids,
    target_probs,
    draft_probs=None,
    *,
    uniforms=None,
    recovery_uniforms=None,
    rng=None,
    seeds=None,
    offsets=None,
    greedy=False,
    like=None,
    method="token",
    errors="raise",
    out=None,
):
    """Reference of :func:`specaccept.verify_tree`: multi-round rejection sampling
    (``method="token"``) or traversal verification (``"traversal"``)."""
    convert = like_converter(like) or (lambda a: a)
    _tree_method(method)
    ids = _ints(node_token_ids, "node_token_ids")
    parents = _ints(parent_ids, "parent_ids")
    isolate = _isolating(errors)
    out_arrays = _tree_out_arrays(out)
    p = _floats(target_probs, "target_probs")
    q = None if draft_probs is None else _floats(draft_probs, "draft_probs")
    u = None if uniforms is None else _floats(uniforms, "uniforms")
    ru = None if recovery_uniforms is None else _floats(recovery_uniforms, "recovery_uniforms")
    _ndim(ids, "node_token_ids", 2)
    batch, nodes = ids.shape
    if parents.ndim == 1 and parents.shape == (nodes,):
        parents = np.broadcast_to(parents, ids.shape)
    _ndim(parents, "parent_ids", 2)
    _ndim(p, "target_probs", 3)
    for x, name, ndim in ((q, "draft_probs", 3), (u, "uniforms", 2), (ru, "recovery_uniforms", 1)):
        if x is not None:
            _ndim(x, name, ndim)
    if not (
        isinstance(greedy, (bool, np.bool_))
        or (isinstance(greedy, np.ndarray) and greedy.dtype.kind == "b")
    ):
        raise TypeError(
            f"greedy must be a bool or a bool array of shape [B], got {type(greedy).__name__}"
        )
    all_greedy = isinstance(greedy, (bool, np.bool_)) and bool(greedy)
    counter = _seeded(seeds, offsets, batch, nodes, u, ru, rng)
    if counter is not None:
        u, ru = counter
    elif (u is None or ru is None) and not all_greedy:
        u, ru = _draw_uniforms(rng, batch, nodes, None, u, ru, "node_token_ids [B, N]")
    # Every shape before any loop: the loops below are as long as the arrays.
    vocab = p.shape[2]
    _shape(parents, "parent_ids", (batch, nodes))
    _shape(p, "target_probs", (batch, nodes, vocab))
    _shape(q, "draft_probs", (batch, nodes, vocab))
    _shape(u, "uniforms", (batch, nodes))
    _shape(ru, "recovery_uniforms", (batch,))
    if nodes == 0:
        raise InputError(
            "node_token_ids: needs at least the root node (N >= 1)", argument="node_token_ids"
        )
    greedy_rows = _greedy_rows(greedy, batch)
    if batch:
        _reserve(nodes, "parent_ids")  # the depths and children of one tree
        _reserve(vocab, "target_probs")  # a row of V
    inputs = {
        "node_token_ids": ids,
        "parent_ids": parents,
        "target_probs": p,
        "draft_probs": q,
        "uniforms": u,
        "recovery_uniforms": ru,
        "greedy": greedy,
    }
    return _tree_batch(
        ids, parents, p, q, u, ru, greedy_rows, method, isolate, out_arrays, inputs, convert
    )


def _tree_method(method: Any) -> None:
    """``method=`` of a tree: ``"token"`` or ``"traversal"``."""
    if not isinstance(method, str):
        raise TypeError(
            f"method must be one of ('token', 'traversal'), got {type(method).__name__}"
        )
    if method not in ("token", "traversal"):
        raise InputError(
            f"method must be one of ('token', 'traversal'), got {method!r:.40}", argument="method"
        )


def _tree_batch(
    ids,
    parents,
    p,
    q,
    u,
    ru,
    greedy_rows,
    method,
    isolate,
    out_arrays,
    inputs,
    convert,
    check_row=None,
    argmax=None,
):
    """The batch part of :func:`verify_tree` (and :func:`verify_tree_logits`):
    the parent links, the buffers, then each row; ``check_row(b)`` checks a row's
    own parameters first, ``argmax(b, node)`` is a greedy row's choice."""
    batch, nodes = ids.shape
    vocab = p.shape[2]
    # The parent links of every row first; isolating, a row with bad links is set
    # aside (links shared by every row, a stride-0 view, are checked once and raise).
    shared = batch > 1 and parents.strides[0] == 0
    isolated: dict[int, InputError] = {}
    deepest = 0
    for b in range(1 if shared else batch):
        try:
            deepest = max(deepest, max(_tree_depths([int(x) for x in parents[b]], b)))
        except InputError as error:
            if not isolate or shared:
                raise
            isolated[b] = error
    width = deepest
    if out_arrays is not None:
        out_arrays = _checked_out(out_arrays, _TREE_OUT, (2, 1, 1, 2), inputs)
        width = out_arrays[3].shape[1]
        shapes = [a.shape for a in out_arrays if a is not None]
        expected = [(batch, width + 1), (batch,), (batch,), (batch, width)]
        if out_arrays[2] is None:
            expected.pop(2)
        if shapes != expected:
            raise InputError(
                f"out: output shapes must be [B, W+1], [B], [B], [B, W] with B = {batch}"
                f" (W >= D = {deepest})",
                argument="out",
            )
        if width < deepest:
            raise InputError(
                f"out: out.accepted_node_ids has {width} columns, fewer than the deepest path"
                f" D = {deepest}",
                argument="out",
            )
    source = "node_token_ids [B, N]"
    out_ids = _full((batch, width + 1), -1, np.int64, "output_token_ids", source)
    out_nodes = _full((batch, width), -1, np.int64, "accepted_node_ids", source)
    accepted_counts = _full((batch,), 0, np.int64, "num_accepted", source)

    def verify_row(b: int) -> None:
        if b in isolated:
            raise isolated[b]
        if check_row is not None:
            check_row(b)
        children: list[list[int]] = [[] for _ in range(nodes)]
        for n in range(1, nodes):
            if int(parents[b, n]) >= 0:
                children[int(parents[b, n])].append(n)
        if method == "traversal" and not greedy_rows[b]:
            path, next_token = _traverse_tree_row(p, q, u, ru, ids, children, b, vocab)
        else:
            path, next_token = _verify_tree_row(
                p, q, u, ru, ids, children, b, vocab, greedy_rows[b], argmax
            )
        for i, (c, x) in enumerate(path):
            out_ids[b, i], out_nodes[b, i] = x, c
        out_ids[b, len(path)] = next_token
        accepted_counts[b] = len(path)

    isolated = _verify_rows(batch, isolate, verify_row)
    emitted = accepted_counts + 1
    for b in isolated:
        out_ids[b] = out_nodes[b] = -1
        accepted_counts[b] = emitted[b] = 0
    values = [out_ids, accepted_counts, emitted, out_nodes]
    if out_arrays is not None:
        for i, buffer in enumerate(out_arrays):
            if buffer is not None:
                buffer[...] = values[i]
                values[i] = buffer
    return TreeVerification(
        *(convert(v) for v in values), errors=MappingProxyType(isolated) if isolated else _NO_ERRORS
    )


class _TransformedRows:
    """The rows of a ``[B, N, V]`` logits array as probabilities (section 8.2),
    each transformed the first time it is read: ``rows[b, n]`` a row,
    ``rows[b, n, x]`` one entry."""

    def __init__(self, logits: np.ndarray, arg: str, params: Any) -> None:
        self.logits, self.arg, self.params = logits, arg, params
        self.shape = logits.shape
        self.rows: dict[tuple[int, int], np.ndarray] = {}

    def row(self, b: int, n: int) -> np.ndarray:
        if (b, n) not in self.rows:
            t, k, p, m, last = self.params(b)
            where = f"{self.arg}[{b}, {n}"
            row = transform_logits(self.logits[b, n], t, k, p, where, min_p=m, min_p_last=last)
            self.rows[b, n] = np.array(row)
        return self.rows[b, n]

    def __getitem__(self, index: tuple[int, ...]) -> Any:
        if len(index) == 2:
            return self.row(*index)
        b, n, x = index
        return self.row(b, n)[x]


def verify_tree_logits(
    node_token_ids,
    parent_ids,
    target_logits,
    draft_logits=None,
    *,
    temperature=1.0,
    top_k=0,
    top_p=1.0,
    uniforms=None,
    recovery_uniforms=None,
    rng=None,
    seeds=None,
    offsets=None,
    method="token",
    errors="raise",
    out=None,
    like=None,
    min_p=0.0,
    min_p_last=False,
):
    """Reference of :func:`specaccept.verify_tree_logits`: :func:`verify_tree` on
    the rows of :func:`transform_logits`, each transformed when first read; a
    temperature-0 row takes the argmax of the raw logits."""
    convert = like_converter(like) or (lambda a: a)
    _tree_method(method)
    isolate = _isolating(errors)
    ids = _ints(node_token_ids, "node_token_ids")
    _ndim(ids, "node_token_ids", 2)
    batch, nodes = ids.shape
    parents = _ints(parent_ids, "parent_ids")
    if parents.ndim == 1 and parents.shape == (nodes,):
        parents = np.broadcast_to(parents, ids.shape)
    logits = _floats(target_logits, "target_logits")
    draft = None if draft_logits is None else _floats(draft_logits, "draft_logits")
    temperatures = _per_row(temperature, "temperature", batch, np.float64)
    top_ks = _per_row(top_k, "top_k", batch, np.int64)
    top_ps = _per_row(top_p, "top_p", batch, np.float64)
    min_ps = _per_row(min_p, "min_p", batch, np.float64)
    last = check_flag(min_p_last, "min_p_last")
    u = None if uniforms is None else _floats(uniforms, "uniforms")
    ru = None if recovery_uniforms is None else _floats(recovery_uniforms, "recovery_uniforms")
    counter = _seeded(seeds, offsets, batch, nodes, u, ru, rng)
    if counter is not None:
        u, ru = counter
    elif (u is None or ru is None) and bool((temperatures != 0).any()):
        u, ru = _draw_uniforms(rng, batch, nodes, None, u, ru, "node_token_ids [B, N]")
    out_arrays = _tree_out_arrays(out)
    _ndim(parents, "parent_ids", 2)
    _ndim(logits, "target_logits", 3)
    for x, name, ndim in (
        (draft, "draft_logits", 3),
        (u, "uniforms", 2),
        (ru, "recovery_uniforms", 1),
    ):
        if x is not None:
            _ndim(x, name, ndim)
    vocab = logits.shape[2]
    _shape(parents, "parent_ids", (batch, nodes))
    _shape(logits, "target_logits", (batch, nodes, vocab))
    _shape(draft, "draft_logits", (batch, nodes, vocab))
    for values, name in (
        (temperatures, "temperature"),
        (top_ks, "top_k"),
        (top_ps, "top_p"),
        (min_ps, "min_p"),
    ):
        _shape(values, name, (batch,))
    _shape(u, "uniforms", (batch, nodes))
    _shape(ru, "recovery_uniforms", (batch,))
    if nodes == 0:
        raise InputError(
            "node_token_ids: needs at least the root node (N >= 1)", argument="node_token_ids"
        )
    if batch:
        _reserve(nodes, "parent_ids")
        _reserve(vocab, "target_logits")

    def params(b: int) -> tuple[float, int, float, float, bool]:
        return float(temperatures[b]), int(top_ks[b]), float(top_ps[b]), float(min_ps[b]), last

    def check_row(b: int) -> None:
        t, k, p, m, _ = params(b)
        _check_sampling(t, k, p, (b,), m)

    def argmax(b: int, node: int) -> int:
        return _argmax_list(logits[b, node], f"target_logits[{b}, {node}")

    p = _TransformedRows(logits, "target_logits", params)
    q = None if draft is None else _TransformedRows(draft, "draft_logits", params)
    greedy_rows = [float(t) == 0 for t in temperatures]
    inputs = {
        "node_token_ids": ids,
        "parent_ids": parents,
        "target_logits": logits,
        "draft_logits": draft,
        "temperature": temperatures,
        "top_k": top_ks,
        "top_p": top_ps,
        "min_p": min_ps,
        "uniforms": u,
        "recovery_uniforms": ru,
    }
    return _tree_batch(
        ids,
        parents,
        p,
        q,
        u,
        ru,
        greedy_rows,
        method,
        isolate,
        out_arrays,
        inputs,
        convert,
        check_row=check_row,
        argmax=argmax,
    )


def _traverse_tree_row(p, q, u, ru, ids, children, b: int, vocab: int):
    """Traversal verification of one row (docs/spec.md section 7.6): post-order, children
    in index order. A node's state is its rate ``a`` and its target weights ``w`` with
    total ``T`` (``None``: its target row as given, ``T = 1``); a rejected child ``c``
    (token ``x``, draft row ``q_c``) turns them into the residual
    ``max(0, w * (a / T) - q_c)`` with ``T = S`` its sum, and ``a`` into
    ``S / ((S + 1) - a)``. The root is always accepted."""
    if u is None or ru is None:
        raise InputError(
            "uniforms: uniforms and recovery_uniforms are required for rows verified by sampling",
            argument="uniforms",
        )
    recovery = _uniform(ru[b], "recovery_uniforms", (b,))
    # Frames: [node, rate, weights or None, total, index of the next child].
    stack: list[list[Any]] = [[0, 1.0, None, 1.0, 0]]
    while True:
        node, a, w, total, i = stack[-1]
        kids = children[node]
        if i < len(kids):
            c = kids[i]
            x = _tree_token(ids, b, c, vocab)
            mb_x = _target_share(p, b, node, x, w, total)
            ms_x = 1.0 if q is None else _gathered(q[b, c, x], "draft_probs", (b, c, x))
            rate = _next_rho(a, mb_x, ms_x)
            # Rate 0: its subtree is not visited (docs/spec.md section 7.6, step 1).
            stack.append([c, rate, None, 1.0, 0 if rate else len(children[c])])
            continue
        if node == 0 or _uniform(u[b, node], "uniforms", (b, node)) < a:
            weights = w if w is not None else _row(p[b, node], "target_probs", b, node)
            token = sample_index(weights, recovery)
            if token is None:  # rounding or unnormalised rows: the node's target row
                token = _sample_target(p, b, node, recovery)
            path = [(frame[0], _tree_token(ids, b, frame[0], vocab)) for frame in stack[1:]]
            return path, token
        # Node rejected: its parent removes it and takes the residual.
        stack.pop()
        parent = stack[-1]
        _, pa, pw, ptotal, pi = parent
        x = _tree_token(ids, b, node, vocab)
        siblings = children[parent[0]]
        if (
            parent[0] != 0
            and _uniform(u[b, parent[0]], "uniforms", (b, parent[0])) >= pa
            and not any(
                _entry_after(p, q, b, parent, node, x, _tree_token(ids, b, j, vocab)) > 0
                for j in siblings[pi + 1 :]
            )
        ):
            # The update can only lower the rate, which already rejects the parent, and
            # every later child would enter with rate 0 (docs/spec.md section 7.6, step 3).
            parent[4] = len(siblings)
            continue
        if q is None:
            mb_x = _target_share(p, b, parent[0], x, pw, ptotal)
            mass = pa * (1.0 - mb_x)
            weights = (
                list(pw) if pw is not None else _row(p[b, parent[0]], "target_probs", b, parent[0])
            )
            weights[x] = 0.0
            new_total = ptotal * (1.0 - mb_x)
        else:
            weights = []
            factor = pa / ptotal if ptotal > 0 else 0.0  # a / T
            for v in range(vocab):
                w_v = (
                    _entry(p[b, parent[0], v], "target_probs", (b, parent[0], v))
                    if pw is None
                    else pw[v]
                )
                q_v = _entry(q[b, node, v], "draft_probs", (b, node, v))
                weights.append(max(0.0, w_v * factor - q_v))
            mass = _canonical_total(weights)
            new_total = mass
        parent[1] = 1.0 if parent[0] == 0 else _block_h(mass, pa)
        parent[2], parent[3], parent[4] = weights, new_total, pi + 1


def _entry_after(p, q, b: int, parent, c: int, x: int, x_j: int) -> float:
    """The entry at ``x_j`` of the parent's weights after removing child ``c`` (token
    ``x``), as the update computes it, from single entries (docs/spec.md section 7.6)."""
    v, a, w, total = parent[0], parent[1], parent[2], parent[3]
    w_x = _entry(p[b, v, x_j], "target_probs", (b, v, x_j)) if w is None else w[x_j]
    if q is None:
        return 0.0 if x_j == x else w_x
    factor = a / total if total > 0 else 0.0
    return max(0.0, w_x * factor - _entry(q[b, c, x_j], "draft_probs", (b, c, x_j)))


def _target_share(p, b: int, node: int, x: int, w, total: float) -> float:
    """``Mb(x)`` at a node: its target row's ``p(x)`` (checked), or ``w[x] / T``."""
    if w is None:
        return _gathered(p[b, node, x], "target_probs", (b, node, x))
    return w[x] / total if total > 0 else 0.0


def _tree_token(ids, b: int, c: int, vocab: int) -> int:
    x = int(ids[b, c])
    if not 0 <= x < vocab:
        raise _bad(
            f"node_token_ids[{b}, {c}] = {x} is outside [0, V) with V = {vocab}",
            "node_token_ids",
            (b, c),
        )
    return x


def _verify_tree_row(p, q, u, ru, ids, children, b, vocab, greedy, argmax=None):
    if argmax is None:
        argmax = lambda b, node: _argmax(p[b, node], b, node)  # noqa: E731
    path: list[tuple[int, int]] = []
    node = 0
    if not greedy:
        if u is None or ru is None:
            raise InputError(
                "uniforms: uniforms and recovery_uniforms are required for rows "
                "verified by sampling",
                argument="uniforms",
            )
        recovery = _uniform(ru[b], "recovery_uniforms", (b,))
    while True:
        kids = children[node]
        if not kids:  # a leaf: the bonus token from its target row
            return path, (argmax(b, node) if greedy else _sample_target(p, b, node, recovery))
        if greedy:
            best = argmax(b, node)
            match = next((c for c in kids if _tree_token(ids, b, c, vocab) == best), None)
            if match is None:
                return path, best
            path.append((match, best))
            node = match
            continue
        weights = None  # None: P is the node's target row, used as given (S = 1)
        total = 1.0
        taken = None
        for c in kids:
            x = _tree_token(ids, b, c, vocab)
            u_c = _uniform(u[b, c], "uniforms", (b, c))
            if weights is None:
                p_x = _gathered(p[b, node, x], "target_probs", (b, node, x))
            else:
                p_x = weights[x] / total if total > 0 else 0.0
            q_x = 1.0 if q is None else _gathered(q[b, c, x], "draft_probs", (b, c, x))
            if _is_accepted(p_x, q_x, u_c):
                taken = (c, x)
                break
            # P = max(0, P * (1 / S) - q_c), then S = sum(P) in the canonical order.
            new = []
            factor = 1.0 / total if total > 0 else 0.0
            for i in range(vocab):
                if weights is None:
                    base = _entry(p[b, node, i], "target_probs", (b, node, i))
                else:
                    base = weights[i] * factor
                q_i = (
                    (1.0 if i == x else 0.0)
                    if q is None
                    else _entry(q[b, c, i], "draft_probs", (b, c, i))
                )
                new.append(max(0.0, base - q_i))
            weights = new
            total = 0.0
            for start in range(0, vocab, SUM_BLOCK):
                total += _block_sum(weights[start : start + SUM_BLOCK])
        if taken is not None:
            path.append(taken)
            node = taken[0]
            continue
        token = sample_index(weights, recovery)
        if token is None:
            token = _sample_target(p, b, node, recovery)
        return path, token


# --------------------------------------------------------------------------
# Verification from logits: the sampling transform, then the chain.
# --------------------------------------------------------------------------


def _canonical_total(weights: list[float]) -> float:
    total = 0.0
    for start in range(0, len(weights), SUM_BLOCK):
        total += _block_sum(weights[start : start + SUM_BLOCK])
    return total


def _logit_error(where: str, i: int | None, message: str) -> InputError:
    """The error for entry ``i`` (``None``: the whole row) of the row ``where``
    names (``"target_logits[b, t"``): its argument, index and batch row."""
    name, _, prefix = where.partition("[")
    index = tuple(int(x) for x in prefix.split(",") if x.strip())
    if i is not None:
        index += (i,)
    return _bad(message, name, index or None)


def _per_row(value: Any, name: str, batch: int, dtype: type) -> np.ndarray:
    """``temperature``, ``top_k`` or ``top_p`` as ``[B]``: a number for every row, or
    one per row (its shape checked with the others)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 63:
        # Past int64: top-k that large keeps everything; a float parameter that
        # large has no float64 value.
        if dtype is np.int64 and value > 0:
            value = _INT64_MAX
        else:
            raise InputError(
                f"{name} = an int of {value.bit_length()} bits: outside its range", argument=name
            )
    array = np.asarray(as_numpy(value, name))
    kind = "iu" if dtype is np.int64 else "iuf"
    if array.dtype.kind not in kind or array.ndim > 1:
        raise TypeError(f"{name} must be a number or a [B] array of numbers, got {array.dtype}")
    if dtype is np.int64 and array.dtype.kind == "u" and array.size:
        array = np.minimum(array, _INT64_MAX)  # counts past int64 keep everything
    array = array.astype(dtype, copy=False)
    return np.broadcast_to(array, (batch,)) if array.ndim == 0 else array


def _check_sampling(
    temperature: float, top_k: int, top_p: float, index: tuple[int, ...], min_p: float = 0.0
) -> None:
    """The sampling parameters of one row (docs/spec.md section 8.1); ``index`` is
    ``(b,)`` in a batch, ``()`` for one row."""
    at = "".join(f"[{i}]" for i in index)
    if not (temperature == 0 or (sys.float_info.min <= temperature and math.isfinite(temperature))):
        raise _bad(
            f"temperature{at} = {temperature!r}: a temperature must be 0 or at least "
            f"{sys.float_info.min!r} (the smallest normal float64)",
            "temperature",
            index,
        )
    if top_k < 0:
        raise _bad(f"top_k{at} = {top_k}: top_k must be >= 0", "top_k", index)
    if not 0 < top_p <= 1:
        raise _bad(f"top_p{at} = {top_p!r}: top_p must lie in (0, 1]", "top_p", index)
    if not 0 <= min_p <= 1:
        raise _bad(f"min_p{at} = {min_p!r}: min_p must lie in [0, 1]", "min_p", index)


def transform_logits(
    logits,
    temperature: float,
    top_k: int,
    top_p: float,
    where: str = "logits",
    *,
    min_p: float = 0.0,
    min_p_last: bool = False,
):
    """The sampling transform of one logits row, as :func:`specaccept.verify_logits`
    defines it: divide by ``temperature``; softmax; min-p (every entry whose
    softmax weight ``exp((l_i - max l) / T)`` is at least ``min_p``: probability at
    least ``min_p`` times the largest), renormalise; top-k (ties kept), renormalise;
    top-p (decreasing order, ties by lower index; the shortest prefix reaching
    ``top_p`` plus every entry tied with the last one kept), renormalise. With
    ``min_p_last`` min-p comes after top-p instead. Temperature 0 is a greedy row:
    one-hot at the first largest logit. Parameters outside section 8.1's domains
    are an error naming them."""
    for value, name in (
        (temperature, "temperature"),
        (top_k, "top_k"),
        (top_p, "top_p"),
        (min_p, "min_p"),
    ):
        integral = isinstance(value, numbers.Integral)
        if not isinstance(value, numbers.Real) or (name == "top_k" and not integral):
            kind = "an int" if name == "top_k" else "a real number"
            raise TypeError(f"{name} must be {kind}, got {type(value).__name__}")
    last = check_flag(min_p_last, "min_p_last")
    _check_sampling(float(temperature), int(top_k), float(top_p), (), float(min_p))
    values = [float(v) for v in logits]
    for i, v in enumerate(values):
        if math.isnan(v) or v == math.inf:
            raise _logit_error(where, i, f"{where}, {i}] = {v!r}: logits must be finite or -inf")
    if all(v == -math.inf for v in values):
        raise _logit_error(
            where, None, f"{where}] has no finite logit: there is no token to choose"
        )
    if temperature == 0:  # a greedy row (section 8.3): all mass on the first argmax
        first = values.index(max(values))
        return [1.0 if i == first else 0.0 for i in range(len(values))]
    # exp(z_i - max z) for z = l / T, written as exp((l_i - max l) / T): the
    # same numbers, without overflow when T is small.
    top = max(values)
    e = [math.exp((v - top) / temperature) if v != -math.inf else 0.0 for v in values]
    total = _canonical_total(e)
    probs = [v / total for v in e]

    def keep_min_p(probs: list[float]) -> list[float]:
        # The test on e, whose largest is exp(0) = 1: p_i >= min_p * max p.
        kept = [p if e_i >= min_p else 0.0 for p, e_i in zip(probs, e, strict=True)]
        total = _canonical_total(kept)
        return [p / total for p in kept]

    if min_p > 0 and not last:
        probs = keep_min_p(probs)
    positive = sorted((p for p in probs if p > 0), reverse=True)
    if 0 < top_k < len(positive):
        kth = positive[top_k - 1]
        probs = [p if p >= kth else 0.0 for p in probs]
        total = _canonical_total(probs)
        probs = [p / total for p in probs]
    if top_p < 1.0:
        order = sorted((i for i in range(len(probs)) if probs[i] > 0), key=lambda i: (-probs[i], i))
        cumulative, last_kept = 0.0, None
        for i in order:
            cumulative += probs[i]
            if cumulative >= top_p:
                last_kept = probs[i]
                break
        if last_kept is not None:
            probs = [p if p >= last_kept else 0.0 for p in probs]
            total = _canonical_total(probs)
            probs = [p / total for p in probs]
    if min_p > 0 and last:
        probs = keep_min_p(probs)
    return probs


def verify_logits(
    draft_token_ids,
    target_logits,
    draft_logits=None,
    *,
    temperature=1.0,
    top_k=0,
    top_p=1.0,
    num_draft_tokens=None,
    uniforms=None,
    recovery_uniforms=None,
    rng=None,
    seeds=None,
    offsets=None,
    like=None,
    errors="raise",
    method="token",
    draft_token_probs=None,
    min_p=0.0,
    min_p_last=False,
) -> Verification:
    """Reference of :func:`specaccept.verify_logits`: the transform, row by row, then
    the chain rule, the residual and the bonus exactly as :func:`verify`."""
    like_converter(like)
    isolate = _isolating(errors)
    ids = _ints(draft_token_ids, "draft_token_ids")
    rule = chain_rule(method, ids.shape[1] if ids.ndim == 2 else 0)
    block = rule == "block"
    logits = _floats(target_logits, "target_logits")
    given_q = None if draft_token_probs is None else _floats(draft_token_probs, "draft_token_probs")
    draft = None if draft_logits is None else _floats(draft_logits, "draft_logits")
    _ndim(ids, "draft_token_ids", 2)
    batch, num_draft = ids.shape
    temperatures = _per_row(temperature, "temperature", batch, np.float64)
    top_ks = _per_row(top_k, "top_k", batch, np.int64)
    top_ps = _per_row(top_p, "top_p", batch, np.float64)
    min_ps = _per_row(min_p, "min_p", batch, np.float64)
    last = check_flag(min_p_last, "min_p_last")
    counts = None if num_draft_tokens is None else _ints(num_draft_tokens, "num_draft_tokens")
    u = None if uniforms is None else _floats(uniforms, "uniforms")
    ru = None if recovery_uniforms is None else _floats(recovery_uniforms, "recovery_uniforms")
    counter = _seeded(seeds, offsets, batch, num_draft, u, ru, rng)
    if counter is not None:
        u, ru = counter
    elif (u is None or ru is None) and bool((temperatures != 0).any()):
        u, ru = _draw_uniforms(rng, batch, num_draft, counts, u, ru)
    # Every shape before any loop.
    vocab = _chain_shapes(
        logits, "target_logits", draft, "draft_logits", counts, u, ru, batch, num_draft
    )
    for values, name in (
        (temperatures, "temperature"),
        (top_ks, "top_k"),
        (top_ps, "top_p"),
        (min_ps, "min_p"),
    ):
        _shape(values, name, (batch,))
    if given_q is not None:
        _shape(given_q, "draft_token_probs", (batch, num_draft))
        if draft is None:
            raise InputError(
                "draft_token_probs: needs draft_logits (the rows the drafts were sampled from)",
                argument="draft_token_probs",
            )
        if rule != "token":
            raise InputError(
                'draft_token_probs: applies to method="token"', argument="draft_token_probs"
            )
    source = "draft_token_ids [B, K]"
    output_token_ids = _full((batch, num_draft + 1), -1, np.int64, "output_token_ids", source)
    num_accepted = _full((batch,), 0, np.int64, "num_accepted", source)
    if batch:
        _reserve(vocab, "target_logits")  # every row transforms a whole row of V

    def verify_row(b: int) -> None:
        t_b, k_b, p_b = float(temperatures[b]), int(top_ks[b]), float(top_ps[b])
        m_b = float(min_ps[b])
        _check_sampling(t_b, k_b, p_b, (b,), m_b)
        drafts = _row_drafts(ids, counts, b, num_draft, vocab)
        k = len(drafts)

        def transform(rows: np.ndarray, name: str, t: int) -> list[float]:
            where = f"{name}[{b}, {t}"
            return transform_logits(rows[b, t], t_b, k_b, p_b, where, min_p=m_b, min_p_last=last)

        def target(t: int) -> list[float]:
            return transform(logits, "target_logits", t)

        if t_b == 0:
            n, next_token = k, None
            for t, x in enumerate(drafts):
                best = _argmax_list(logits[b, t], f"target_logits[{b}, {t}")
                if best != x:
                    n, next_token = t, best
                    break
            if next_token is None:
                next_token = _argmax_list(logits[b, k], f"target_logits[{b}, {k}")
        else:
            if u is None or ru is None:  # drawn above whenever a row samples
                raise InputError(
                    "uniforms: uniforms and recovery_uniforms are required for rows verified "
                    "by sampling",
                    argument="uniforms",
                )
            row_u = [_uniform(u[b, t], "uniforms", (b, t)) for t in range(k)]
            recovery = _uniform(ru[b], "recovery_uniforms", (b,))
            n, next_token = k, None
            if block:

                def draft_row(t: int) -> list[float] | None:
                    if draft is None:
                        return None
                    return transform(draft, "draft_logits", t)

                n, next_token = _block_logits_row(
                    drafts, target, draft_row, draft is not None, row_u, recovery
                )
                drafts_to_check: list[int] = []
            elif isinstance(rule, tuple) and rule[0] == "typical":
                n, next_token = _typical_stop(target, drafts, recovery, rule[1], rule[2])
                drafts_to_check = []
            elif isinstance(rule, tuple) and rule[0] == "synthetic":
                n = next((t for t in range(k) if row_u[t] >= rule[1][t]), k)
                next_token = sample_index(target(n), recovery)
                drafts_to_check = []
            else:
                drafts_to_check = drafts
            for t, x in enumerate(drafts_to_check):
                p = target(t)
                if given_q is not None:
                    # The drafter's q(x): the draft row is read only on a rejection.
                    given = _gathered(given_q[b, t], "draft_token_probs", (b, t))
                    if _is_accepted(p[x], given, row_u[t]):
                        continue
                q = None if draft is None else transform(draft, "draft_logits", t)
                q_x = 1.0 if q is None else q[x]
                if given_q is not None:
                    _check_draft_prob(given, q_x, b, t)
                elif _is_accepted(p[x], q_x, row_u[t]):
                    continue
                if q is None:
                    residual = [0.0 if i == x else p_i for i, p_i in enumerate(p)]
                else:
                    residual = [max(0.0, p_i - q_i) for p_i, q_i in zip(p, q, strict=True)]
                token = sample_index(residual, recovery)
                n, next_token = t, (token if token is not None else sample_index(p, recovery))
                break
            if next_token is None:
                next_token = sample_index(target(k), recovery)
        output_token_ids[b, :n] = drafts[:n]
        output_token_ids[b, n] = next_token
        num_accepted[b] = n

    isolated = _verify_rows(batch, isolate, verify_row)
    return _result(None, output_token_ids, num_accepted, like, isolated)


#: How far a given draft probability may lie from its row's (relative, absolute).
DRAFT_PROB_TOLERANCE = (1e-2, 1e-6)


def _check_draft_prob(given: float, q: float, b: int, t: int) -> None:
    relative, absolute = DRAFT_PROB_TOLERANCE
    if abs(given - q) > relative * max(given, q) + absolute:
        raise _bad(
            f"draft_token_probs[{b}, {t}] = {given!r} disagrees with the draft row, which gives "
            f"{q!r} to the drafted token (the same temperature, filters and position?)",
            "draft_token_probs",
            (b, t),
        )


def _block_logits_row(drafts, target, draft_row, has_draft, row_u, recovery) -> tuple[int, int]:
    """Block verification of one row of transformed logits (docs/spec.md section
    2.6): ``target(t)`` and ``draft_row(t)`` (``None``: one-hot drafts) are the
    transformed rows, read position by position, then again from the top down."""
    k = len(drafts)
    rho, p_drafted = [1.0], []
    for t, x in enumerate(drafts):
        p = target(t)
        q = draft_row(t)
        p_drafted.append(p[x])
        rho.append(_next_rho(rho[t], p[x], 1.0 if q is None else q[x]))
    if k == 0 or row_u[k - 1] < rho[k]:  # h_k = rho_k; no drafts: tau = 0 = k
        return k, _drawn(sample_index(target(k), recovery))
    tau = 0
    for i in range(k - 1, 0, -1):
        if row_u[i - 1] >= rho[i]:
            continue  # h_i <= rho_i: fails without its round (docs/spec.md section 2.6)
        if not has_draft:
            z = rho[i] * (1.0 - p_drafted[i])
        else:
            p, q = target(i), draft_row(i)
            z = _canonical_total([max(0.0, rho[i] * a - c) for a, c in zip(p, q, strict=True)])
        if row_u[i - 1] < _block_h(z, rho[i]):
            tau = i
            break
    p, q = target(tau), draft_row(tau)
    if q is None:
        residual = [0.0 if i == drafts[tau] else p_i for i, p_i in enumerate(p)]
    else:
        residual = [max(0.0, rho[tau] * a - c) for a, c in zip(p, q, strict=True)]
    token = sample_index(residual, recovery)
    return tau, (token if token is not None else _drawn(sample_index(p, recovery)))


def _drawn(token: int | None) -> int:
    """A draw from a transformed row (never empty: the transform keeps a token)."""
    if token is None:
        raise InputError("a transformed row has no token left", argument="target_logits")
    return token


def _argmax_list(row, where: str) -> int:
    best = None
    for i, v in enumerate(float(x) for x in row):
        if math.isnan(v) or v == math.inf:
            raise _logit_error(where, i, f"{where}, {i}] = {v!r}: logits must be finite or -inf")
        if v > -math.inf and (best is None or v > best[1]):
            best = (i, v)
    if best is None:
        raise _logit_error(
            where, None, f"{where}] has no finite logit: there is no token to choose"
        )
    return best[0]


# --------------------------------------------------------------------------
# Section 3: the primitives, element by element.
# --------------------------------------------------------------------------


def _elementwise(*args: tuple[Any, str]) -> tuple[list[np.ndarray], bool]:
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
        arrays.append(_floats(x, name))
    scalar = all(a.ndim == 0 for a in arrays)
    try:
        arrays = list(np.broadcast_arrays(*arrays))
    except ValueError:
        raise InputError("shapes do not broadcast together", argument=args[0][1]) from None
    return arrays, scalar


def _zeros(shape: tuple[int, ...], dtype: Any, argument: str) -> np.ndarray:
    """An output of ``shape``, or a ``MemoryError`` naming the argument its size comes from."""
    try:
        return np.zeros(shape, dtype=dtype)
    except (MemoryError, ValueError):
        n = math.prod(shape)
        raise MemoryError(
            f"{argument}: needs a buffer of {n} values ({_show_bytes(n * 8.0)}), "
            "which cannot be allocated"
        ) from None


def _output(out: np.ndarray, scalar: bool, like: Any) -> Any:
    out = out[()] if scalar else out
    convert = like_converter(like)
    return out if convert is None else convert(np.asarray(out))


def rejection_probability(target_prob, draft_prob, *, like=None):
    """Reference of :func:`specaccept.rejection_probability`."""
    like_converter(like)
    (p, q), scalar = _elementwise((target_prob, "target_prob"), (draft_prob, "draft_prob"))
    out = _zeros(p.shape, np.float64, "target_prob")
    for index in np.ndindex(p.shape):
        p_i = _gathered(p[index], "target_prob", index)
        q_i = _gathered(q[index], "draft_prob", index)
        out[index] = _rejection_probability(p_i, q_i)
    return _output(out, scalar, like)


def acceptance_mask(target_prob, draft_prob, uniform, *, like=None):
    """Reference of :func:`specaccept.acceptance_mask`: every position is evaluated."""
    like_converter(like)
    (p, q, u), scalar = _elementwise(
        (target_prob, "target_prob"), (draft_prob, "draft_prob"), (uniform, "uniform")
    )
    out = _zeros(p.shape, bool, "target_prob")
    for index in np.ndindex(p.shape):
        p_i = _gathered(p[index], "target_prob", index)
        q_i = _gathered(q[index], "draft_prob", index)
        u_i = _uniform(u[index], "uniform", index)
        out[index] = _is_accepted(p_i, q_i, u_i)
    return _output(out, scalar, like)


def acceptance_rate(target_probs, draft_probs, *, like=None):
    """Reference of :func:`specaccept.acceptance_rate`: ``sum(min(p, q))`` per row,
    in the canonical summation order."""
    like_converter(like)
    p = _floats(target_probs, "target_probs")
    q = _floats(draft_probs, "draft_probs")
    if p.ndim == 0:
        raise InputError(
            "target_probs: must have at least one axis [..., V]", argument="target_probs"
        )
    if q.shape != p.shape:
        raise InputError(
            f"draft_probs: has shape {q.shape}, expected {p.shape} (the shape of target_probs)",
            argument="draft_probs",
        )
    out = _zeros(p.shape[:-1], np.float64, "target_probs")
    if out.size:
        _reserve(p.shape[-1], "target_probs")  # a row of V
    for index in np.ndindex(p.shape[:-1]):
        overlap = []
        for i in range(p.shape[-1]):
            at = (*index, i)
            p_i = _entry(p[at], "target_probs", at)
            q_i = _entry(q[at], "draft_probs", at)
            overlap.append(p_i if p_i < q_i else q_i)
        total = 0.0
        for start in range(0, len(overlap), SUM_BLOCK):
            total += _block_sum(overlap[start : start + SUM_BLOCK])
        out[index] = total
    return _output(out, out.ndim == 0, like)


def accepted_prefix_length(accepted, num_draft_tokens=None, *, like=None):
    """Reference of :func:`specaccept.accepted_prefix_length`."""
    like_converter(like)
    mask = _array(accepted, "accepted", "b", "bool")
    counts = None if num_draft_tokens is None else _ints(num_draft_tokens, "num_draft_tokens")
    _ndim(mask, "accepted", 2)
    batch, num_draft = mask.shape
    if counts is not None:
        _ndim(counts, "num_draft_tokens", 1)
    _shape(counts, "num_draft_tokens", (batch,))
    out = _zeros((batch,), np.int64, "accepted")
    for b in range(batch):
        k = _draft_len(counts, b, num_draft)
        row = mask[b, :k]
        if k and row.strides[0] == 0:
            out[b] = k if row[0] else 0  # a broadcast row: one value, k times
            continue
        rejected = np.flatnonzero(~row)  # the first False, or k when there is none
        out[b] = rejected[0] if rejected.size else k
    return _output(out, False, like)


# --------------------------------------------------------------------------
# docs/spec.md section 13.3: AdaptiveK's step-time fit and choice, in NumPy
# (the native fit_step_cost, best_width and best_ragged are tested against it).
# --------------------------------------------------------------------------


def acceptance_rows(
    accepted: np.ndarray, tried: np.ndarray, pooled: float, prior_weight: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each request's acceptance per depth from its discounted counts (``[R, D]``):
    at depth ``i`` its counts plus the estimate one depth shallower (``pooled`` at
    depth 0) with weight ``prior_weight`` (section 13.2); then ``reach [R, D + 1]``
    (column ``j``: the product of the first ``j`` depths' acceptance, the expected
    tokens the ``j``-th draft adds; column 0 is 1) and its running sum
    ``cumulative`` (the expected emitted tokens with ``j`` drafts). An infinite
    ``prior_weight`` gives the prior at every depth (the limit)."""
    rows, depths = accepted.shape
    alpha = np.empty((rows, depths))
    prior = np.full(rows, pooled)
    for i in range(depths):
        if math.isfinite(prior_weight):  # an infinite weight: the prior alone (the limit)
            prior = (accepted[:, i] + prior_weight * prior) / (tried[:, i] + prior_weight)
        alpha[:, i] = prior
    reach = np.concatenate([np.ones((rows, 1)), np.cumprod(alpha, axis=1)], axis=1)
    return alpha, reach, np.cumsum(reach, axis=1)


#: The column subsets the cost fit tries, in its order of preference.
_SUBSETS = ((0,), (1,), (2,), (0, 1), (0, 2), (1, 2), (0, 1, 2))
#: The same, as a 0/1 mask per subset over the three columns.
_SUBSET_MASKS = np.array([[float(i in subset) for i in range(3)] for subset in _SUBSETS])


class StepCost:
    """A step's predicted time: the fitted line ``coef``, plus the shrunk mean
    residual of the measured point ``(target tokens, draft forwards)`` where
    there is one; at least a nanosecond."""

    def __init__(self, coef: tuple[float, float, float], cells: dict[tuple[float, float], float]):
        self.coef = coef
        self.cells = cells

    def seconds(self, target_tokens: float, draft_forwards: float) -> float:
        c0, c1, c2 = self.coef
        line = c0 + c1 * target_tokens + c2 * draft_forwards
        return max(line + self.cells.get((float(target_tokens), float(draft_forwards)), 0.0), 1e-9)


def fit_step_cost(t: np.ndarray, x: np.ndarray, f: np.ndarray, keep: float) -> StepCost | None:
    """The step time fitted to the measured steps (seconds ``t``, target tokens
    ``x``, draft forwards ``f``, oldest first, each weighted ``keep**age``): the
    line, one Huber reweighting, then each point's own correction; ``None`` with
    fewer than two steps or while every step computed the same ``(x, f)``."""
    if len(t) < 2:
        return None
    if np.ptp(x) == 0 and np.ptp(f) == 0:
        return None
    recent = keep ** np.arange(len(t) - 1, -1, -1, dtype=np.float64)
    w = recent
    design = np.stack([np.ones_like(x), x, f], axis=1)
    coef = _fit_line(design, t, w)
    # One Huber step: a step far off the line (a one-off cost: the first call
    # after the prompts, a pause of the machine) weighs less.
    with np.errstate(all="ignore"):
        residual = t - design @ np.array(coef)
        scale = 1.4826 * float(np.median(np.abs(residual)))
        if 1e-6 * float(np.median(t)) < scale < math.inf:
            w = w * np.minimum(1.0, 2.5 * scale / np.maximum(np.abs(residual), 1e-300))
            coef = _fit_line(design, t, w)
            residual = t - design @ np.array(coef)
    # A point's own mean residual (weighted by age only: a point off the line
    # is what this corrects), shrunk toward the line by a weight of 1: a
    # backend's time need not be linear (a kernel picked by the token count).
    # The points, as one key each (counts are whole numbers: exact in float64).
    _, first, where = np.unique(x * (f.max() + 1.0) + f, return_index=True, return_inverse=True)
    where = where.reshape(-1)
    with np.errstate(all="ignore"):
        shift = np.bincount(where, recent * residual) / (np.bincount(where, recent) + 1.0)
    cells = {
        (px, pf): c
        for px, pf, c in zip(x[first].tolist(), f[first].tolist(), shift.tolist(), strict=True)
        if math.isfinite(c)
    }
    return StepCost(coef, cells)


def _fit_line(design: np.ndarray, t: np.ndarray, w: np.ndarray) -> tuple[float, float, float]:
    """Weighted least squares with every coefficient ``>= 0`` (a step has no
    negative fixed cost and never gets cheaper for computing more): of the subsets
    of the three columns whose own fit is non-negative, the one with the least
    residual, a larger subset only where it fits better (so columns that moved
    together, as target tokens and draft forwards do at a constant batch, are
    explained by the first of them: the target's tokens). From the weighted
    moments, every subset's 3 x 3 system solved in one call (a subset's unused
    columns held at 0 by identity rows)."""
    with np.errstate(all="ignore"):
        weighted = design * w[:, None]
        gram = design.T @ weighted
        moment = weighted.T @ t
        total = float((w * t * t).sum())
    if not (np.isfinite(gram).all() and np.isfinite(moment).all() and math.isfinite(total)):
        return 0.0, 0.0, 0.0
    diagonal = np.diag(gram)
    usable = (_SUBSET_MASKS @ (diagonal == 0)) == 0  # no column of zeros in the subset
    if not usable.any():  # every time measured is 0
        return 0.0, 0.0, 0.0
    ridged = gram + np.diag(1e-9 * diagonal)
    on = _SUBSET_MASKS[usable]
    systems = on[:, :, None] * ridged[None] * on[:, None, :] + np.eye(3)[None] * (1.0 - on)[:, None]
    with np.errstate(all="ignore"):
        try:
            coefs = np.linalg.solve(systems, (on * moment[None])[:, :, None])[:, :, 0]
        except np.linalg.LinAlgError:
            rhs = on * moment[None]
            coefs = np.stack([_solve_or_nan(a, b) for a, b in zip(systems, rhs, strict=True)])
        coefs *= on
        residuals = total - 2.0 * coefs @ moment + np.einsum("si,ij,sj->s", coefs, gram, coefs)
        fits = np.isfinite(coefs).all(axis=1) & np.isfinite(residuals) & (coefs >= 0).all(axis=1)
    better = 1e-9 * total  # what counts as a better fit
    best: tuple[float, list[float]] | None = None
    for coef, residual, fit in zip(coefs.tolist(), residuals.tolist(), fits.tolist(), strict=True):
        if fit and (best is None or residual < best[0] - better):
            best = (residual, coef)
    if best is None:
        return 0.0, 0.0, 0.0
    return float(best[1][0]), float(best[1][1]), float(best[1][2])


def _solve_or_nan(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    try:
        return np.linalg.solve(a, b)
    except np.linalg.LinAlgError:
        return np.full(3, math.nan)


def _choice_worth(value: float, cost: Any, target_tokens: float, draft_forwards: float) -> float:
    """A choice's value per predicted second."""
    seconds = cost.seconds(target_tokens, draft_forwards)
    return value / seconds if seconds > 0 else math.inf


def _value(emitted: list[float], remaining: list[float] | None) -> float:
    """The expected tokens (summed left to right, as the native code sums them),
    or with ``remaining`` the least share of the remaining tokens."""
    if remaining is None:
        total = 0.0
        for e in emitted:
            total += e
        return total
    return min((e / left for e, left in zip(emitted, remaining, strict=True)), default=math.inf)


def best_width(
    cost: Any,
    cumulative: np.ndarray,
    cap: np.ndarray,
    min_k: int,
    remaining: np.ndarray | None = None,
) -> np.ndarray:
    """Padded backends: the width ``w`` (each request drafting ``min(w, cap)``)
    worth the most under ``cost`` (``x = R (1 + W)``, ``f = W``); the smaller on
    ties (a later width must be worth ``1e-12`` more)."""
    rows, caps = cumulative.tolist(), cap.tolist()
    left = None if remaining is None else remaining.tolist()
    best, best_worth = [min(c, min_k) for c in caps], -math.inf
    top = max(caps, default=0)
    for w in range(min(min_k, top), top + 1):
        k = [min(c, w) for c in caps]
        width = max(k, default=0)
        value = _value([row[j] for row, j in zip(rows, k, strict=True)], left)
        current = _choice_worth(value, cost, len(k) * (1.0 + width), float(width))
        if current > best_worth * (1 + 1e-12):
            best, best_worth = k, current
    return np.array(best, dtype=np.int64)


def best_ragged(
    cost: Any,
    reach: np.ndarray,
    cumulative: np.ndarray,
    cap: np.ndarray,
    min_k: int,
    remaining: np.ndarray | None = None,
) -> np.ndarray:
    """Ragged backends: drafts added one at a time, each time the one with the
    largest expected gain (request ``r``'s ``j``-th draft adds ``reach[r, j]``, the
    product of its first ``j`` depths' acceptance; stable); with ``remaining``,
    the next draft of the request slowest to finish (``min E_r / remaining_r``,
    the first of equals) while it can draft; of every prefix of that order, the
    one worth the most under ``cost`` (``x = R + sum k``, ``f = max k``; the fewest
    drafts on ties). The expected tokens are kept as a running total, as the
    native code keeps them."""
    rows, gains, caps = cumulative.tolist(), reach.tolist(), cap.tolist()
    left = None if remaining is None else remaining.tolist()
    n = len(caps)
    k = [min(c, min_k) for c in caps]
    if left is None:
        order = [(gains[r][j], r) for r in range(n) for j in range(k[r] + 1, caps[r] + 1)]
        order.sort(key=lambda g: -g[0])  # stable: a request's drafts stay in order
        steps = [r for _, r in order]
    else:
        steps, counts = [], list(k)
        while n:
            ratios = [rows[r][counts[r]] / left[r] for r in range(n)]
            r = ratios.index(min(ratios))
            if counts[r] >= caps[r]:
                break  # the slowest request cannot draft more: nothing else helps
            counts[r] += 1
            steps.append(r)
    drafts, width = sum(k), max(k, default=0)
    total = _value([rows[r][k[r]] for r in range(n)], None)
    value = total if left is None else _value([rows[r][k[r]] for r in range(n)], left)
    best, best_worth = list(k), _choice_worth(value, cost, n + float(drafts), float(width))
    for r in steps:
        before = rows[r][k[r]]
        k[r] += 1
        drafts += 1
        width = max(width, k[r])
        if left is None:
            total += rows[r][k[r]] - before
            value = total
        else:
            value = _value([rows[i][k[i]] for i in range(n)], left)
        current = _choice_worth(value, cost, n + float(drafts), float(width))
        if current > best_worth * (1 + 1e-12):
            best, best_worth = list(k), current
    return np.array(best, dtype=np.int64)


class _NumpyKernels:
    """:class:`AdaptiveK`'s numbers as above (the native module's names)."""

    acceptance_rows = staticmethod(acceptance_rows)
    fit_step_cost = staticmethod(fit_step_cost)
    best_width = staticmethod(best_width)
    best_ragged = staticmethod(best_ragged)


class AdaptiveK(_schedule.AdaptiveK):
    """Reference of :class:`specaccept.AdaptiveK`: the same class, its step-time
    fit and choice computed by the NumPy functions above."""

    _kernels = _NumpyKernels
