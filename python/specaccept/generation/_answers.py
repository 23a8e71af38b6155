"""What a model or a drafter returns, checked: arrays of the promised dtype and
shape, read in place where they can be, with errors that name the method."""

from __future__ import annotations

from typing import Any

import numpy as np

from .._arrays import as_numpy, is_float
from .._errors import InputError

__all__ = ["model_array", "model_probs", "model_tokens"]


def model_array(value: Any, name: str, what: str) -> np.ndarray:
    """A model's answer as a NumPy array (in place when it can be), or a TypeError."""
    array = as_numpy(value, name)
    if isinstance(array, np.ndarray):
        return array
    try:
        return np.asarray(array)
    except (TypeError, ValueError) as error:
        raise TypeError(f"{name} must return {what}, got {type(value).__name__}") from error


def model_probs(value: Any, shape: tuple[int, ...], name: str) -> np.ndarray:
    """A model's answer as a float array of ``shape`` (read in place when it can be)."""
    array = model_array(value, name, "a float array")
    if not is_float(array.dtype):
        raise TypeError(f"{name} must return a float array, got dtype {array.dtype}")
    if array.shape != shape:
        raise InputError(
            f"{name} returned shape {array.shape}, expected {shape}", argument=name.split(".")[0]
        )
    return array


def model_tokens(value: Any, shape: tuple[int, ...], vocab: int, name: str) -> np.ndarray:
    """Drafted tokens as an int array of ``shape``, each in ``[0, V)``."""
    array = model_array(value, name, "int tokens")
    if array.dtype.kind not in "iu":
        raise TypeError(f"{name} must return int tokens, got dtype {array.dtype}")
    if array.shape != shape:
        raise InputError(
            f"{name} returned tokens of shape {array.shape}, expected {shape}",
            argument=name.split(".")[0],
        )
    bad = (array < 0) | (array >= vocab)
    if bad.any():
        b, t = (int(i) for i in np.argwhere(bad)[0])
        raise InputError(
            f"{name} returned token {int(array[b, t])} at [{b}, {t}], outside [0, V) with "
            f"V = {vocab}",
            argument=name.split(".")[0],
            index=(b, t),
            row=b,
        )
    return array.astype(np.int64, copy=False)
