"""How many threads verification uses for large batches.

Rows of a batch that reads at least ``PARALLEL_MIN_ELEMENTS`` probabilities
(counting ``V`` per row and ``(K+1) V`` per greedy row) are verified in parallel
on a pool owned by specaccept; smaller batches run on the calling thread. The result is the same bits either way.
The default is the number of CPUs the process may run on, or the value of the
environment variable ``SPECACCEPT_NUM_THREADS`` when it is set at import.
"""

from __future__ import annotations

import os
import warnings

import numpy as np

from . import _native
from ._errors import InputError

__all__ = [
    "MAX_THREADS_PER_CPU",
    "PARALLEL_MIN_ELEMENTS",
    "get_num_threads",
    "max_num_threads",
    "set_num_threads",
]

#: Batches reading fewer probabilities than this (``V`` per row, ``(K+1) V`` per
#: greedy row) stay on the calling thread.
PARALLEL_MIN_ELEMENTS: int = _native.PARALLEL_MIN_ELEMENTS

#: At most this many threads per CPU (see :func:`max_num_threads`).
MAX_THREADS_PER_CPU: int = _native.MAX_THREADS_PER_CPU

ENVIRONMENT_VARIABLE = "SPECACCEPT_NUM_THREADS"


def get_num_threads() -> int:
    """The number of threads large batches are verified on.

    Examples
    --------
    >>> import specaccept
    >>> specaccept.get_num_threads() >= 1
    True
    """
    return _native.get_num_threads()


def set_num_threads(n: int) -> None:
    """Verify large batches on ``n`` threads from now on (``1``: the calling thread only).

    Calls already running finish with the threads they started with. The setting
    is process-wide; the environment variable ``SPECACCEPT_NUM_THREADS`` sets it
    at import.

    Examples
    --------
    >>> import specaccept
    >>> before = specaccept.get_num_threads()
    >>> specaccept.set_num_threads(1)
    >>> specaccept.get_num_threads()
    1
    >>> specaccept.set_num_threads(before)
    """
    if isinstance(n, np.integer):
        n = int(n)
    if not isinstance(n, int) or isinstance(n, bool):
        raise TypeError(f"n must be an int, got {type(n).__name__}")
    if n < 1:
        raise InputError(f"n must be at least 1, got {n}", argument="n")
    most = max_num_threads()
    if n > most:
        raise InputError(
            f"n must be at most {most} ({MAX_THREADS_PER_CPU} per CPU), got {n}",
            argument="n",
        )
    _native.set_num_threads(n)


def max_num_threads() -> int:
    """The most threads :func:`set_num_threads` takes: ``MAX_THREADS_PER_CPU`` (8) per CPU.

    More threads than that only add switching, and a huge count would start that
    many OS threads on the next large batch.
    """
    return _native.max_num_threads()


def _apply_environment() -> None:
    value = os.environ.get(ENVIRONMENT_VARIABLE, "").strip()
    if not value:
        return
    try:
        n = int(value)
        if n < 1:
            raise ValueError
    except ValueError:
        warnings.warn(
            f"{ENVIRONMENT_VARIABLE}={value!r} is not a positive integer; "
            f"using {get_num_threads()} threads",
            RuntimeWarning,
            stacklevel=3,
        )
        return
    most = max_num_threads()
    if n > most:
        warnings.warn(
            f"{ENVIRONMENT_VARIABLE}={value!r} is above the limit of {most} threads "
            f"({MAX_THREADS_PER_CPU} per CPU); using {most}",
            RuntimeWarning,
            stacklevel=3,
        )
        n = most
    _native.set_num_threads(n)
