"""Paired ratios: two columns timed call for call, seconds apart, and the ratio of
their speeds with a confidence interval.

This machine's speed drifts by more than a few percent between calls minutes apart,
so a ratio of two columns' totals, each measured in its own stretch of time, cannot
decide a goal such as "at least 0.97x". Paired, each call of one column runs next to
the same call of the other (the order alternated), and the drift between pairs
cancels in each pair's ratio. The estimate is the geometric mean of the pairs'
speed ratios; its interval is Student's t on their logarithms (pairs independent,
log-ratios roughly normal). A goal is *met* when the interval's lower end is at or
above it, *missed* when the upper end is below it, and *undecided* otherwise.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

#: Two-sided confidence of every interval reported.
CONFIDENCE = 0.95


def ratio_interval(ratios: Sequence[float]) -> tuple[float, float, float]:
    """The geometric mean of ``ratios`` and its ``CONFIDENCE`` interval (NaN ends
    with fewer than two pairs)."""
    from scipy import stats

    logs = [math.log(r) for r in ratios]
    mean = statistics.fmean(logs)
    if len(logs) < 2:
        return math.exp(mean), math.nan, math.nan
    half = stats.t.ppf((1 + CONFIDENCE) / 2, len(logs) - 1) * statistics.stdev(logs)
    half /= math.sqrt(len(logs))
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def verdict(low: float, high: float, goal: float) -> str:
    """``met``, ``missed`` or ``undecided``: where the interval lies against ``goal``."""
    if low >= goal:
        return "met"
    if high < goal:
        return "missed"
    return "undecided"


def ratio_cell(ratios: Sequence[float], goal: float) -> str:
    """``1.02x [0.99, 1.05] met``: the estimate, its interval and the verdict."""
    estimate, low, high = ratio_interval(ratios)
    return f"{estimate:.3f}x [{low:.3f}, {high:.3f}] {verdict(low, high, goal)}"
