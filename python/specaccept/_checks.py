"""Argument checks shared by the Python layer: a wrong type is a ``TypeError``, a
wrong value an :class:`~specaccept.InputError` naming the argument (docs/spec.md
section 5.1)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ._errors import InputError

__all__ = ["check_flag", "check_int"]


def check_int(value: Any, name: str, minimum: int = 0) -> int:
    """An int ``>= minimum`` (not a bool)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int >= {minimum}, got {value!r:.40}")
    if value < minimum:
        raise InputError(f"{name} must be an int >= {minimum}, got {value!r}", argument=name)
    return int(value)


def check_flag(value: Any, name: str) -> bool:
    """A ``bool`` (NumPy's included; not an int that could be one)."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {value!r:.40}")
    return bool(value)
