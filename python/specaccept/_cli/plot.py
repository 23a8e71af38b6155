"""``python -m specaccept compare --plot FILE.png``: the laboratory's figure.

The panels follow what the data has:

- one ``K`` (steps recorded from a model, ``--from``, or ``--k`` with one value):
  the law of the accepted length per method (observed frequencies over ``0..K``,
  each method's exact expectation marked), the acceptance of each draft position
  (exact where the laboratory has a closed form, observed otherwise, labelled),
  and speed against fidelity;
- several ``K`` (the built-in models' sweep): accepted drafts against ``K``, and
  speed against fidelity.

Drawn with matplotlib's object API (no pyplot, no global backend switch);
:func:`draw` returns the figure so that tests can read what it shows.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import numpy as np

from ..lab import MethodComparison, MethodResult

if TYPE_CHECKING:
    from matplotlib.figure import Figure

#: One colour per method, in the order the methods were compared.
COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b")


def draw(chain: list[tuple[int, MethodComparison]], path: str, *, source: str) -> Figure | None:
    """Writes the figure for ``chain`` (``(K, comparison)`` pairs) to ``path`` as a
    PNG and returns the matplotlib ``Figure``; without matplotlib, says so on
    standard error and returns ``None``. ``source`` names where the steps came from
    (the titles say it)."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        print(f"matplotlib is not installed: no plot written to {path}", file=sys.stderr)
        return None
    if len(chain) == 1:
        k, comparison = chain[0]
        fig = Figure(figsize=(15, 4.9), layout="constrained")
        _one_k(fig, k, comparison, source)
    else:
        fig = Figure(figsize=(11, 4.5), layout="constrained")
        _sweep(fig, chain, source)
    fig.savefig(path, dpi=100, format="png")
    return fig


def legend_label(result: MethodResult) -> str:
    """A method's name in the legends: its label, marked when lossy."""
    return result.method if result.lossless else f"{result.method}, lossy"


def _one_k(fig: Figure, k: int, comparison: MethodComparison, source: str) -> None:
    lengths, positions, speed = fig.subplots(1, 3, width_ratios=(1.25, 1, 1))
    results = comparison.results
    width = 0.8 / len(results)
    counts = np.arange(k + 1)
    runs = comparison.steps * comparison.samples
    for m, result in enumerate(results):
        colour = COLOURS[m % len(COLOURS)]
        law = comparison.lengths[result.method]
        lengths.bar(
            counts + (m - (len(results) - 1) / 2) * width,
            law.histogram / max(runs, 1),
            width=width,
            color=colour,
            hatch=None if result.lossless else "//",
            edgecolor="white",
            linewidth=0.5,
            label=f"{legend_label(result)}: E[n] = {result.expected_accepted:.3f}",
        )
        lengths.axvline(result.expected_accepted, color=colour, linestyle="--", linewidth=1.5)
        exact = law.exact_per_position
        shares = law.observed_per_position if exact is None else exact
        positions.plot(
            counts[1:],
            shares,
            "-o" if exact is not None else "--s",
            color=colour,
            label=f"{legend_label(result)}: {'exact' if exact is not None else 'observed'}",
        )
        speed.errorbar(
            [result.tv_distance],
            [result.tokens_per_call],
            xerr=[
                [result.tv_distance - result.tv_interval[0]],
                [result.tv_interval[1] - result.tv_distance],
            ],
            yerr=[
                [result.tokens_per_call - result.tokens_interval[0]],
                [result.tokens_interval[1] - result.tokens_per_call],
            ],
            fmt="o" if result.lossless else "D",
            markersize=8,
            capsize=3,
            color=colour,
            label=legend_label(result),
        )
    lengths.set(
        xticks=counts,
        xlabel=f"accepted drafts n in a step (of K = {k})",
        ylabel=f"share of {comparison.steps} steps x {comparison.samples} runs",
        title="Accepted length: observed law; dashed: exact E[n]",
    )
    positions.set(
        xticks=counts[1:],
        ylim=(0, 1.04),
        xlabel="draft position i",
        ylabel="share of steps whose i-th draft is accepted",
        title="Acceptance per draft position",
    )
    speed.set(
        xlabel="next token's TV distance to the target (0: lossless)",
        ylabel="tokens per target call (accepted + 1)",
        title="Speed against fidelity (95% intervals)"
        if comparison.confidence == 0.95
        else f"Speed against fidelity ({comparison.confidence:.0%} intervals)",
    )
    # From 1 token per call (no draft accepted), so that heights compare honestly.
    top = max(r.tokens_interval[1] for r in results)
    right = max(r.tv_interval[1] for r in results)
    speed.set_xlim(-0.02 - 0.05 * right, 0.02 + 1.1 * right)
    speed.set_ylim(1.0, top + 0.1 * (top - 1.0) + 0.02)
    for axis in (lengths, positions, speed):
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    vocab = comparison.meta.get("vocab")
    full = int(comparison.lengths[results[0].method].drafted[-1]) if k else comparison.steps
    drafts = f"K = {k}" if full == comparison.steps else f"K = {k} ({full} drafting all {k})"
    fig.suptitle(
        f"{source}: {comparison.steps} verified steps, {drafts}"
        + (f", V = {vocab:,}" if vocab else "")
        + f"; {comparison.samples} runs per step, the same uniforms for every method",
        fontsize=11,
    )


def _sweep(fig: Figure, chain: list[tuple[int, MethodComparison]], source: str) -> None:
    left, right = fig.subplots(1, 2)
    first = chain[0][1]
    for m, result in enumerate(first.results):
        colour = COLOURS[m % len(COLOURS)]
        mine = [(k, c[result.method]) for k, c in chain]
        ks = [k for k, _ in mine]
        style = "-o" if result.lossless else "--D"
        left.plot(
            ks, [r.mean_accepted for _, r in mine], style, color=colour, label=legend_label(result)
        )
        left.plot(ks, [r.expected_accepted for _, r in mine], "_", color="black", markersize=12)
        right.scatter(
            [r.tv_distance for _, r in mine],
            [r.tokens_per_call for _, r in mine],
            color=colour,
            marker="o" if result.lossless else "D",
            label=legend_label(result),
        )
        for k, r in mine:
            right.annotate(
                f"K={k}",
                (r.tv_distance, r.tokens_per_call),
                textcoords="offset points",
                xytext=(5, -3),
                fontsize=7,
                color=colour,
            )
    left.set(
        xticks=[k for k, _ in chain],
        xlabel="K (drafts per step)",
        ylabel="accepted drafts per step (black ticks: exact)",
        title="Accepted length against K",
    )
    right.set(
        xlabel="next token's TV distance to the target (0: lossless)",
        ylabel="tokens per target call (accepted + 1)",
        title="Speed against fidelity",
    )
    for axis in (left, right):
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    fig.suptitle(
        f"{source}: {first.steps} steps per K, {first.samples} runs per step, "
        "the same uniforms for every method",
        fontsize=11,
    )
