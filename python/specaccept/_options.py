"""The verifiers' arguments that are not arrays of values: ``greedy=``,
``errors=`` and ``out=``, normalised once for every entry point."""

from __future__ import annotations

from typing import Any

import numpy as np

from ._arrays import as_numpy, bool_array
from ._errors import InputError
from ._result import Verification

__all__ = [
    "CHAIN_METHODS",
    "LOSSY_METHODS",
    "TREE_METHODS",
    "as_greedy",
    "as_method",
    "chain_rule",
    "isolating",
    "out_buffers",
]

#: The verification methods of chains (``verify``, ``verify_logits``, the vLLM
#: layer): ``"token"`` (token by token) and ``"block"`` (the block jointly).
CHAIN_METHODS = ("token", "block")

#: The lossy methods of ``verify`` and the vLLM layer (docs/spec.md sections 2.7,
#: 2.8): their output does not follow the target distribution.
LOSSY_METHODS = ("typical", "synthetic")

#: Medusa's defaults of typical acceptance (vLLM's former defaults).
TYPICAL_EPSILON, TYPICAL_DELTA = 0.09, 0.3

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


def chain_rule(method: Any, epsilon: Any, delta: Any, acceptance_rate: Any, num_draft: int) -> Any:
    """``method=`` with its parameters, as the native layer takes it: ``"token"``,
    ``"block"``, ``("typical", epsilon, delta)`` or ``("synthetic", rates [K])``.
    A parameter given to a method that has none is an :class:`InputError`."""
    rule = as_method(method, CHAIN_METHODS + LOSSY_METHODS)
    for name, value, owner in (
        ("epsilon", epsilon, "typical"),
        ("delta", delta, "typical"),
        ("acceptance_rate", acceptance_rate, "synthetic"),
    ):
        if value is not None and rule != owner:
            raise InputError(
                f"{name} applies to method={owner!r}, not method={rule!r}", argument=name
            )
    if rule == "typical":
        return (
            "typical",
            _non_negative(TYPICAL_EPSILON if epsilon is None else epsilon, "epsilon"),
            _non_negative(TYPICAL_DELTA if delta is None else delta, "delta"),
        )
    if rule == "synthetic":
        if acceptance_rate is None:
            raise InputError(
                "acceptance_rate: method='synthetic' needs it (a rate in [0, 1], or one per "
                "draft position)",
                argument="acceptance_rate",
            )
        return ("synthetic", _rates(acceptance_rate, num_draft))
    return rule


def _non_negative(value: Any, name: str) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.number)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    number = float(value)
    if not (np.isfinite(number) and number >= 0):
        raise InputError(f"{name} must be a finite number >= 0, got {number!r}", argument=name)
    return number


def _rates(acceptance_rate: Any, num_draft: int) -> np.ndarray:
    """The synthetic rates as a float64 array ``[K]`` (a scalar: the same at every position)."""
    if isinstance(acceptance_rate, (bool, np.bool_)):
        raise TypeError("acceptance_rate must be a number or an array of numbers, got bool")
    rates = as_numpy(acceptance_rate, "acceptance_rate")
    if isinstance(rates, (int, float, np.number)):
        rates = np.full(num_draft, float(rates))
    elif isinstance(rates, (list, tuple)):
        if not all(
            isinstance(a, (int, float, np.number)) and not isinstance(a, (bool, np.bool_))
            for a in rates
        ):
            raise TypeError("acceptance_rate must be a number or a sequence of numbers")
        rates = np.asarray(rates, dtype=np.float64)
    if not isinstance(rates, np.ndarray) or rates.dtype.kind not in "fiu":
        raise TypeError(
            "acceptance_rate must be a number or an array of numbers, got "
            f"{type(acceptance_rate).__name__}"
        )
    if rates.ndim == 0:
        rates = np.full(num_draft, float(rates))
    if rates.shape != (num_draft,):
        raise InputError(
            f"acceptance_rate: has shape {rates.shape}, expected ({num_draft},) (one per draft "
            "position) or a scalar",
            argument="acceptance_rate",
        )
    return np.ascontiguousarray(rates, dtype=np.float64)


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
