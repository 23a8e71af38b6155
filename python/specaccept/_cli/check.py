"""``python -m specaccept check``: plain against speculative sampling of the next
token, with chi-square p-values against the target's distribution."""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from .. import generate
from .._errors import InputError
from .demo import load_models


def first_speculative_tokens(target, draft, prompt, rows, k, rng) -> np.ndarray:
    """The first token of a speculative run from ``prompt`` (its first step drafts
    ``k`` tokens), ``rows`` times over."""
    out = generate(target, draft, [prompt] * rows, k=k, max_new_tokens=k + 1, rng=rng)
    return np.array([tokens[0] for tokens in out.tokens])


def run_check(args: argparse.Namespace) -> int:
    target, draft, vocab = load_models(args)
    prompt = vocab.encode(args.prompt)
    n = args.samples
    rng = np.random.default_rng(args.seed)
    p = target.next_token_probs([prompt], 1)[0, 0]
    # Plain sampling from the target, and the first token of a speculative step.
    cdf = np.cumsum(p)
    plain = np.minimum(np.searchsorted(cdf, rng.random(n) * cdf[-1], side="right"), len(p) - 1)
    start = time.perf_counter()
    speculative = np.concatenate(
        [
            first_speculative_tokens(target, draft, prompt, min(500, n - done), args.k, rng)
            for done in range(0, n, 500)
        ]
    )
    seconds = time.perf_counter() - start
    print(
        f'Next token after "{args.prompt}": {n} samples by plain target sampling, {n} by '
        f"speculative decoding (k = {args.k}, {seconds:.1f} s)."
    )
    # Tokens the target expects at least 5 times are tested alone, the rest pooled.
    expected = p * n
    kept = np.flatnonzero(expected >= 5)
    order = kept[np.argsort(-expected[kept])]
    print(f"\n  {'token':<16} {'target p':>9} {'plain':>8} {'speculative':>12}")
    plain_counts = np.bincount(plain, minlength=len(p))
    spec_counts = np.bincount(speculative, minlength=len(p))
    for token in order[: args.show]:
        print(
            f"  {vocab.tokens[token]!r:<16} {p[token]:9.4f} {plain_counts[token] / n:8.4f} "
            f"{spec_counts[token] / n:12.4f}"
        )
    rest = np.ones(len(p), dtype=bool)
    rest[kept] = False
    verdicts = []
    for name, counts in (("plain", plain_counts), ("speculative", spec_counts)):
        observed = np.append(counts[kept], counts[rest].sum())
        wanted = np.append(expected[kept], expected[rest].sum())
        keep = wanted > 0
        statistic = float((((observed - wanted) ** 2)[keep] / wanted[keep]).sum())
        dof = int(keep.sum()) - 1
        pvalue = chi_square_sf(statistic, dof) if dof > 0 else 1.0
        verdicts.append(pvalue)
        print(
            f"\n  {name}: chi-square {statistic:.1f} on {dof} degrees of freedom, "
            f"p-value {pvalue:.3f}"
        )
    ok = verdicts[1] > 1e-3
    print(
        "\nSpeculative decoding follows the target's distribution"
        + (" (no evidence against it at the 0.001 level)." if ok else ": REJECTED at 0.001.")
    )
    return 0 if ok else 1


def chi_square_sf(statistic: float, dof: int) -> float:
    """``P(X >= statistic)`` for ``X`` chi-square with ``dof`` degrees of freedom.

    The regularized upper incomplete gamma function ``Q(dof/2, statistic/2)``, by
    its series below ``a + 1`` and its continued fraction above (Numerical Recipes
    6.2), so the command-line check needs no SciPy.

    Examples
    --------
    >>> from specaccept._cli.check import chi_square_sf
    >>> round(chi_square_sf(3.841458820694124, 1), 6)   # the 5% point of chi2(1)
    0.05
    """
    if dof < 1:
        raise InputError(f"dof must be >= 1, got {dof}", argument="dof")
    if statistic <= 0:
        return 1.0
    a, x = dof / 2.0, statistic / 2.0
    log_prefix = -x + a * math.log(x) - math.lgamma(a)
    if x < a + 1.0:  # P by its series, Q = 1 - P
        term = total = 1.0 / a
        n = a
        for _ in range(10_000):
            n += 1.0
            term *= x / n
            total += term
            if abs(term) < abs(total) * 1e-16:
                break
        return max(0.0, 1.0 - total * math.exp(log_prefix))
    # Q by Lentz's continued fraction.
    tiny = 1e-300
    b = x + 1.0 - a
    c, d = 1.0 / tiny, 1.0 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1.0 / d
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-16:
            break
    return math.exp(log_prefix) * h
