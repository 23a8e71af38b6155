"""The verifiers' arguments that are not arrays of values: ``greedy=``,
``errors=``, ``out=`` and ``method=``, normalised once for every entry point."""

from __future__ import annotations

from typing import Any

import numpy as np

from ._arrays import as_numpy, bool_array
from ._errors import InputError
from ._result import TreeVerification, Verification

__all__ = [
    "CHAIN_METHODS",
    "LOSSY_METHODS",
    "TREE_METHODS",
    "as_greedy",
    "as_method",
    "chain_rule",
    "isolating",
    "out_buffers",
    "per_row",
    "tree_out_buffers",
]

#: The verification methods of chains (``verify``, ``verify_logits``, the vLLM
#: layer): ``"token"`` (token by token) and ``"block"`` (the block jointly).
CHAIN_METHODS = ("token", "block")

#: The lossy methods of ``verify`` and the vLLM layer (docs/spec.md sections 2.7,
#: 2.8): their output does not follow the target distribution. Their values are
#: :mod:`specaccept.lossy`'s; ``"typical"`` is a shorthand for ``Typical()``.
LOSSY_METHODS = ("typical", "synthetic")

#: The verification methods of trees (``verify_tree``): ``"token"`` (top-down
#: multi-round rejection sampling) and ``"traversal"`` (leaves first, path rates).
TREE_METHODS = ("token", "traversal")


def as_greedy(greedy: Any) -> bool | np.ndarray:
    """``greedy=``: a bool for every row, or a bool array ``[B]`` read in place."""
    if greedy is True or greedy is False:
        return greedy
    if isinstance(greedy, np.bool_):
        return bool(greedy)
    greedy = as_numpy(greedy, "greedy")
    if isinstance(greedy, np.ndarray) and greedy.dtype.kind == "b":
        return bool(greedy) if greedy.ndim == 0 else bool_array(greedy, "greedy")
    got = f"an array of {greedy.dtype}" if isinstance(greedy, np.ndarray) else type(greedy).__name__
    raise TypeError(f"greedy must be a bool or a bool array of shape [B], got {got}")


def as_method(method: Any, methods: tuple[str, ...] = CHAIN_METHODS, name: str = "method") -> str:
    """``method=``: one of ``methods``."""
    if not isinstance(method, str):
        raise TypeError(f"{name} must be one of {methods}, got {type(method).__name__}")
    if method not in methods:
        raise InputError(f"{name} must be one of {methods}, got {method!r:.40}", argument=name)
    return method


def chain_rule(method: Any, num_draft: int, methods: tuple[str, ...] = CHAIN_METHODS) -> Any:
    """``method=`` as the native layer takes it: ``"token"``, ``"block"``,
    ``("typical", epsilon, delta)`` or ``("synthetic", rates [K])``. A string names
    a method without parameters (``"typical"`` is ``lossy.Typical()``); the lossy
    methods with parameters are :mod:`specaccept.lossy` values."""
    from .lossy import Synthetic, Typical

    if isinstance(method, Typical):
        return ("typical", method.epsilon, method.delta)
    if isinstance(method, Synthetic):
        return ("synthetic", method.rates(num_draft))
    if not isinstance(method, str):
        raise TypeError(
            f"method must be one of {(*methods, 'typical')} or a specaccept.lossy value "
            f"(Typical, Synthetic), got {type(method).__name__}"
        )
    if method == "typical":
        default = Typical()
        return ("typical", default.epsilon, default.delta)
    if method == "synthetic":
        raise InputError(
            "method='synthetic' needs a rate: method=specaccept.lossy.Synthetic(rate=...)",
            argument="method",
        )
    return as_method(method, (*methods, "typical"))


def isolating(errors: Any) -> bool:
    """``errors=``: ``"raise"`` (the first bad row fails the call) or ``"isolate"``."""
    if not isinstance(errors, str):
        raise TypeError(f'errors must be "raise" or "isolate", got {type(errors).__name__}')
    if errors == "raise":
        return False
    if errors == "isolate":
        return True
    raise InputError(f'errors must be "raise" or "isolate", got {errors!r:.40}', argument="errors")


def out_buffers(out: Any) -> tuple[Any, Any, Any] | None:
    """``out`` as the native layer takes it: ``(ids, num_accepted, num_emitted or None)``."""
    if out is None:
        return None
    ids: Any
    accepted: Any
    emitted: Any
    if isinstance(out, Verification):
        ids, accepted, emitted = out.output_token_ids, out.num_accepted, out.num_emitted
    elif isinstance(out, (tuple, list)) and len(out) in (2, 3):
        ids, accepted, emitted = out[0], out[1], (out[2] if len(out) == 3 else None)
    else:
        raise TypeError(
            "out must be a Verification or a tuple (output_token_ids, num_accepted[, num_emitted]),"
            f" got {type(out).__name__}"
        )
    return (
        as_numpy(ids, "out.output_token_ids"),
        as_numpy(accepted, "out.num_accepted"),
        None if emitted is None else as_numpy(emitted, "out.num_emitted"),
    )


def tree_out_buffers(out: Any) -> tuple[Any, Any, Any, Any] | None:
    """A tree's ``out`` as the native layer takes it: ``(ids, num_accepted,
    num_emitted or None, accepted_node_ids)``."""
    if out is None:
        return None
    if isinstance(out, TreeVerification):
        parts = (out.output_token_ids, out.num_accepted, out.num_emitted, out.accepted_node_ids)
    elif isinstance(out, (tuple, list)) and len(out) == 4:
        parts = tuple(out)
    else:
        raise TypeError(
            "out must be a TreeVerification or a tuple (output_token_ids, num_accepted,"
            f" num_emitted or None, accepted_node_ids), got {type(out).__name__}"
        )
    names = ("out.output_token_ids", "out.num_accepted", "out.num_emitted", "out.accepted_node_ids")
    ids, accepted, emitted, nodes = (
        None if a is None and n == "out.num_emitted" else as_numpy(a, n)
        for a, n in zip(parts, names, strict=True)
    )
    return ids, accepted, emitted, nodes


def _broadcast(scalar: np.ndarray, batch: int) -> np.ndarray:
    """A 0-d array as a read-only ``[batch]`` view with stride 0 (``np.broadcast_to``
    without its Python-level cost: this runs on every call, for three parameters)."""
    view = np.ndarray((batch,), scalar.dtype, buffer=scalar, strides=(0,))
    view.flags.writeable = False
    return view


# Read-only stride-0 views of plain numbers, by (value, batch, dtype): a
# serving loop passes the same few temperatures and filters on every call. Equal
# keys give equal arrays (1 and 1.0 are both 1.0 in float64; a zero read as float64,
# whose sign shows in messages, and NaN are never cached); bounded, cleared when full.
_PER_ROW_CACHE: dict[tuple[Any, int, type], np.ndarray] = {}
_PER_ROW_CACHE_SIZE = 256


def per_row(value: Any, name: str, batch: int, dtype: type) -> np.ndarray:
    """A sampling parameter (``temperature``, ``top_k``, ``top_p``) as ``[B]``: a
    number for every row (a stride-0 view), or the caller's ``[B]`` array."""
    plain = type(value) is int and value.bit_length() <= 63
    if plain or (type(value) is float and dtype is np.float64):
        # The common case, a plain Python number: no conversion to inspect.
        # Not NaN, nor a zero read as float64 (-0.0 == 0 == 0.0, with one key).
        if value != value or (not value and dtype is np.float64):
            return _broadcast(np.array(value, dtype=dtype), batch)
        key = (value, batch, dtype)
        view = _PER_ROW_CACHE.get(key)
        if view is None:
            view = _broadcast(np.array(value, dtype=dtype), batch)
            if len(_PER_ROW_CACHE) >= _PER_ROW_CACHE_SIZE:
                _PER_ROW_CACHE.clear()
            _PER_ROW_CACHE[key] = view
        return view
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 63:
        # A Python int past int64: top-k that large keeps everything; a float
        # parameter that large has no float64 value.
        if dtype is np.int64 and value > 0:
            value = np.iinfo(np.int64).max
        else:
            raise InputError(
                f"{name} = an int of {value.bit_length()} bits: outside its range", argument=name
            )
    array = np.asarray(as_numpy(value, name))
    kind = "iu" if dtype is np.int64 else "iuf"
    if array.dtype.kind not in kind or array.ndim > 1:
        raise TypeError(f"{name} must be a number or a [B] array of numbers, got {array.dtype}")
    if dtype is np.int64 and array.dtype.kind == "u" and array.size:
        # Counts past int64 are as large as any: keep them large, not wrapped.
        array = np.minimum(array, np.iinfo(np.int64).max)
    array = array.astype(dtype, copy=False)
    # A scalar for every row: a stride-0 view, whatever B is.
    return _broadcast(np.ascontiguousarray(array), batch) if array.ndim == 0 else array
