"""``python -m specaccept example``: the acceptance rule on a built-in batch."""

from __future__ import annotations

import argparse

import numpy as np

from .. import __version__, acceptance_mask, reference, rejection_probability, verify

WORDS = ["the", "cat", "sat", "on", "a", "mat", "dog", "ran", "learning", "fast"]


def run_example(args: argparse.Namespace) -> int:
    print(f"specaccept {__version__}: the verification step of speculative decoding\n")
    print('Worked example: the draft proposes "learning" with q = 0.8; the target gives p = 0.6.')
    reject = float(rejection_probability(0.6, 0.8))
    print(f"  rejection probability 1 - p/q = {reject:.2f}: accepted iff u < p/q = 0.75")
    for draw in (0.70, 0.75, 0.80):
        verdict = "accepted" if acceptance_mask(0.6, 0.8, draw) else "rejected"
        print(f"  u = {draw:.2f} -> {verdict}")

    rng = np.random.default_rng(args.seed)
    batch, num_draft, vocab = args.batch, args.k, len(WORDS)
    # A target and a draft model that mostly agree, as a well-matched pair does.
    target = rng.dirichlet(np.full(vocab, 0.3), size=(batch, num_draft + 1))
    draft = 0.6 * target[:, :num_draft] + 0.4 * rng.dirichlet(
        np.ones(vocab), size=(batch, num_draft)
    )
    cdf = np.cumsum(draft, axis=-1)
    drafts = (cdf < rng.random((batch, num_draft, 1))).sum(axis=-1).clip(max=vocab - 1)
    counts = rng.integers(1, num_draft + 1, size=batch)

    result = verify(drafts, target, draft, num_draft_tokens=counts, rng=rng)

    print(f"\nA batch of B = {batch} rows, up to K = {num_draft} drafts each, V = {vocab} words:")
    for b in range(batch):
        k = int(counts[b])
        proposed = " ".join(WORDS[x] for x in drafts[b, :k])
        emitted = " ".join(WORDS[x] for x in result.tokens(b))
        n = int(result.num_accepted[b])
        end = "bonus" if n == k else "replacement"
        print(f"  row {b}: drafted [{proposed}]")
        print(f"         accepted prefix {n} of {k}, emitted [{emitted}] (last one: {end})")
    print(f"\naccepted prefix lengths: {result.num_accepted.tolist()}")
    print(f"emitted tokens per row:  {result.num_emitted.tolist()}")
    print(f"output_token_ids:\n{result.output_token_ids}")
    # The pure-Python oracle gives the same tokens on the same uniforms.
    g = np.random.default_rng(args.seed + 1)
    u, ru = g.random((batch, num_draft)), g.random(batch)
    native = verify(
        drafts, target, draft, num_draft_tokens=counts, uniforms=u, recovery_uniforms=ru
    )
    oracle = reference.verify(
        drafts, target, draft, num_draft_tokens=counts, uniforms=u, recovery_uniforms=ru
    )
    same = native.to_lists() == oracle.to_lists()
    print(f"\nnative == specaccept.reference on the same uniforms: {same}")
    return 0 if same else 1
