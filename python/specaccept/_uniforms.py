"""Where the uniforms come from when the caller does not give them: the ``rng``
forms, the counter-based ``seeds``/``offsets`` form and the draw order fixed by
docs/spec.md section 4.

One Generator (or a seed, or ``None`` for fresh entropy) draws ``B*K + B``
values in one call (the acceptance uniforms, then the recovery uniforms); a
sequence of ``B`` Generators gives each row its own stream. ``seeds`` and
``offsets`` (one per request) key Philox4x32-10 (``src/philox.rs``): a row's
uniforms are a function of its seed, offset and position only. A count of
uniforms too large for the process is a ``MemoryError`` naming where it comes
from.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from . import _native
from ._arrays import as_numpy, int_array
from ._errors import InputError

__all__ = [
    "CounterLike",
    "RngLike",
    "SeedLike",
    "as_generator",
    "counter_given",
    "counter_keys",
    "counter_uniforms",
    "draw",
    "draw_missing",
    "draw_uniforms",
    "request_seed",
    "seeded",
]

#: What ``rng`` accepts: ``None`` (fresh entropy), an int seed, a Generator, or
#: one Generator per batch row.
RngLike = int | np.random.Generator | Sequence[np.random.Generator] | None

#: What ``rng`` accepts where rows have no streams of their own (``verify_tree``,
#: the vLLM layer): ``None``, an int seed or a Generator.
SeedLike = int | np.random.Generator | None

#: What ``seeds`` and ``offsets`` accept: integers in ``[0, 2**64)``, as an
#: integer array or a sequence of ints (``offsets`` also as one int for all rows).
CounterLike = Any

#: The Philox streams of docs/spec.md section 4.6 (``src/philox.rs``).
ACCEPTANCE_STREAM, RECOVERY_STREAM, DRAFTING_STREAM = 0, 1, 2

_TWO_POW_64 = 1 << 64
_TWO_POW_32 = 1 << 32


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
    source: str = "draft_token_ids [B, K]",
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Draws the missing uniforms from ``rng`` in the order docs/spec.md fixes
    (``source``: where their count comes from, for a ``MemoryError``)."""
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
        uniforms = _zeros((batch, num_draft), source) if need_uniforms else None
        recovery = _zeros((batch,), source) if need_recovery else None
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
        drawn = draw_uniforms(g, split + batch, None, source)
        return drawn[:split].reshape(batch, num_draft), drawn[split:]
    uniforms = draw_uniforms(g, split, (batch, num_draft), source) if need_uniforms else None
    recovery = draw_uniforms(g, batch, None, source) if need_recovery else None
    return uniforms, recovery


def _zeros(shape: tuple[int, ...], source: str) -> np.ndarray:
    try:
        return np.zeros(shape)
    except (MemoryError, ValueError):
        raise MemoryError(
            f"uniforms: {shape} float64 uniforms drawn from rng cannot be allocated; "
            f"the size comes from {source}"
        ) from None


def draw_missing(
    rng: Any,
    draft_token_ids: Any,
    num_draft_tokens: Any,
    u: Any,
    ru: Any,
    seeds: CounterLike = None,
    offsets: CounterLike = None,
) -> tuple[Any, Any]:
    """A chain call's uniforms: given, from ``seeds``/``offsets``, or drawn from ``rng``."""
    ids = int_array(draft_token_ids, "draft_token_ids")
    if ids.ndim != 2:
        raise InputError(
            f"draft_token_ids must be 2-D [B, K], got shape {ids.shape}", argument="draft_token_ids"
        )
    counter = seeded(seeds, offsets, ids.shape[0], ids.shape[1], u, ru, rng)
    if counter is not None:
        return counter
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


def _counter_array(x: Any, name: str) -> np.ndarray:
    """``x`` as a uint64 array (contiguous; a copy unless it is one already), every
    entry checked to lie in ``[0, 2**64)``."""
    if type(x) is np.ndarray and x.dtype == np.uint64 and x.flags.c_contiguous:
        return x  # the serving loop's case: read in place, never written
    if isinstance(x, (bool, np.bool_)):
        raise TypeError(f"{name} must be integers, got bool")
    if isinstance(x, (int, np.integer)):
        if not 0 <= int(x) < _TWO_POW_64:
            raise InputError(f"{name} = {int(x)} is outside [0, 2**64)", argument=name)
        return np.array(int(x), dtype=np.uint64)
    if isinstance(x, (list, tuple)):
        for i, v in enumerate(x):
            if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
                raise TypeError(f"{name}[{i}] must be an int, got {type(v).__name__}")
            if not 0 <= int(v) < _TWO_POW_64:
                raise InputError(
                    f"{name}[{i}] = {int(v)} is outside [0, 2**64)", argument=name, index=(i,)
                )
        return np.array([int(v) for v in x], dtype=np.uint64)
    arr = as_numpy(x, name)
    if not isinstance(arr, np.ndarray):
        raise TypeError(
            f"{name} must be an integer array or a sequence of ints, got {type(x).__name__}"
        )
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{name} must have an integer dtype, got {arr.dtype}")
    if arr.dtype.kind == "i" and arr.size and int(arr.min()) < 0:
        index = tuple(int(i) for i in np.unravel_index(int(np.argmin(arr)), arr.shape))
        raise InputError(
            f"{name}[{', '.join(map(str, index))}] = {int(arr[index])} is negative "
            "(seeds and offsets lie in [0, 2**64))",
            argument=name,
            index=index,
        )
    return _as_uint64(arr, name)


def _as_uint64(arr: Any, name: str) -> np.ndarray:
    """A contiguous uint64 copy, or a ``MemoryError`` naming ``name``."""
    try:
        return np.array(arr, dtype=np.uint64)
    except (MemoryError, ValueError):
        raise MemoryError(
            f"{name}: {arr.size} entries ({arr.size * 8} bytes as uint64) cannot be allocated"
        ) from None


def request_seed(seed: int, prompt: Sequence[int]) -> int:
    """A request's 64-bit Philox key from a user's seed and its prompt's tokens:
    the first 8 bytes (little-endian) of the BLAKE2b digest (``digest_size=8``) of
    the seed's 8 little-endian bytes followed by the tokens as little-endian
    uint64 (docs/spec.md sections 9.3 and 12.4). Two prompts with one seed draw
    unrelated streams."""
    data = int(seed).to_bytes(8, "little") + np.asarray(prompt, dtype="<u8").tobytes()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def counter_keys(
    seeds: CounterLike, offsets: CounterLike, batch: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """``seeds [B]`` and ``offsets`` (``[B]``, or one int for every row) as two
    contiguous uint64 arrays of ``B`` entries; ``batch``, when given, is the ``B``
    they must have."""
    keys = _counter_array(seeds, "seeds")
    steps = _counter_array(offsets, "offsets")
    if keys.ndim != 1:
        raise InputError(
            f"seeds must be 1-D [B] (one per request), got shape {keys.shape}", argument="seeds"
        )
    if batch is not None and keys.shape[0] != batch:
        raise InputError(
            f"seeds: has shape {keys.shape}, expected ({batch},) ([B], one per request)",
            argument="seeds",
        )
    if steps.ndim == 0:
        try:
            steps = np.full(keys.shape, steps, dtype=np.uint64)
        except (MemoryError, ValueError):
            raise MemoryError(
                f"offsets: one per seed ({keys.size * 8} bytes as uint64) cannot be allocated"
            ) from None
    elif steps.shape != keys.shape:
        raise InputError(
            f"offsets: has shape {steps.shape}, expected {keys.shape} ([B], as seeds) or one int",
            argument="offsets",
        )
    return keys, steps


def counter_uniforms(
    seeds: CounterLike, offsets: CounterLike, num_positions: int
) -> tuple[np.ndarray, np.ndarray]:
    """The uniforms a call with ``seeds`` and ``offsets`` uses, for replaying a step.

    Row ``b``'s uniforms come from Philox4x32-10 keyed by ``seeds[b]`` (key =
    its low and high 32 bits) with counter ``(offsets[b]`` low, high 32 bits,
    ``index``, ``stream)``; a float64 uniform is ``((x0 << 32 | x1) >> 11) *
    2**-53`` from the first two 32-bit outputs. ``uniforms[b, i]`` is stream 0 at
    index ``i`` (draft position or tree node ``i``); ``recovery_uniforms[b]`` is
    stream 1 at index 0. So a row's draws depend on its seed, offset and
    position only: not on the batch, the row's place in it, the thread count or
    earlier calls. See docs/spec.md section 4.6.

    Parameters
    ----------
    seeds : int array or sequence of ints ``[B]``
        One per request, each in ``[0, 2**64)``.
    offsets : int array or sequence of ints ``[B]``, or an int
        One per request (e.g. its step or token count), in ``[0, 2**64)``; one
        int gives every row the same offset.
    num_positions : int
        ``K`` for a chain, ``N`` for a tree (at most ``2**32``).

    Returns
    -------
    (uniforms [B, num_positions], recovery_uniforms [B]), float64

    Examples
    --------
    >>> import numpy as np, specaccept
    >>> u, ru = specaccept.counter_uniforms([7, 8], [0, 0], 3)
    >>> u.shape, ru.shape
    ((2, 3), (2,))
    >>> v, rv = specaccept.counter_uniforms([8], [0], 3)   # row 1 alone: the same draws
    >>> bool((v[0] == u[1]).all() and rv[0] == ru[1])
    True
    """
    keys, steps = counter_keys(seeds, offsets)
    if isinstance(num_positions, (bool, np.bool_)) or not isinstance(
        num_positions, (int, np.integer)
    ):
        raise TypeError(f"num_positions must be an int, got {type(num_positions).__name__}")
    if not 0 <= int(num_positions) <= _TWO_POW_32:
        raise InputError(
            f"num_positions = {int(num_positions)} is outside [0, 2**32] "
            "(a position index has 32 bits)",
            argument="num_positions",
        )
    return _counter_uniforms(keys, steps, int(num_positions))


def _counter_uniforms(
    keys: np.ndarray, steps: np.ndarray, num_positions: int
) -> tuple[np.ndarray, np.ndarray]:
    # Streams ACCEPTANCE_STREAM and RECOVERY_STREAM, in one native call.
    return _native.counter_uniforms(keys, steps, num_positions)  # type: ignore[no-any-return]


def counter_given(
    seeds: CounterLike, offsets: CounterLike, uniforms: Any, recovery_uniforms: Any, rng: Any
) -> bool:
    """Whether a call takes its uniforms from ``seeds``/``offsets``. They go
    together and replace ``uniforms``, ``recovery_uniforms`` and ``rng``: any
    other combination is an :class:`InputError` naming the argument."""
    if seeds is None and offsets is None:
        return False
    if seeds is None or offsets is None:
        missing = "seeds" if seeds is None else "offsets"
        raise InputError(
            f"{missing}: seeds and offsets go together (a request's draws are keyed by both)",
            argument=missing,
        )
    for name, given in (
        ("uniforms", uniforms),
        ("recovery_uniforms", recovery_uniforms),
        ("rng", rng),
    ):
        if given is not None:
            raise InputError(
                f"{name}: give seeds/offsets or {name}, not both (seeds and offsets "
                "determine every uniform of the call)",
                argument=name,
            )
    return True


def seeded(
    seeds: CounterLike,
    offsets: CounterLike,
    batch: int,
    num_positions: int,
    uniforms: Any,
    recovery_uniforms: Any,
    rng: Any,
) -> tuple[np.ndarray, np.ndarray] | None:
    """The counter-based uniforms of a call of ``batch`` rows with
    ``num_positions`` positions, or ``None`` when it has no ``seeds``/``offsets``
    (see :func:`counter_given`)."""
    if not counter_given(seeds, offsets, uniforms, recovery_uniforms, rng):
        return None
    keys, steps = counter_keys(seeds, offsets, batch)
    return counter_uniforms(keys, steps, num_positions)
