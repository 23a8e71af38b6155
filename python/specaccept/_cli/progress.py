"""A progress bar on stderr for long command-line runs (``generate``'s and
``compare_methods``' ``progress`` callbacks)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

__all__ = ["progress_bar"]


def progress_bar(label: str, stream: Any = None) -> Callable[[int, int], None]:
    """A progress callback for :func:`generate` that draws a bar on ``stream`` (stderr)
    once the run has taken more than a second."""
    stream = stream or sys.stderr
    start = time.perf_counter()

    def update(done: int, total: int) -> None:
        if time.perf_counter() - start < 1.0 or total == 0:
            return
        width = 30
        filled = int(width * done / total)
        stream.write(f"\r{label} [{'#' * filled}{'.' * (width - filled)}] {done}/{total}")
        if done >= total:
            stream.write("\n")
        stream.flush()

    return update
