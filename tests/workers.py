"""Functions that child processes run in ``tests/test_reliability.py`` (importable by
``spawn`` children, which start a fresh interpreter)."""

from __future__ import annotations

import numpy as np
import specaccept


def big_batch(seed: int) -> dict:
    """A batch large enough to run on the worker pool."""
    rng = np.random.default_rng(seed)
    batch, num_draft, vocab = 24, 4, 20000
    p = rng.random((batch, num_draft + 1, vocab), dtype=np.float32)
    q = rng.random((batch, num_draft, vocab), dtype=np.float32)
    return dict(
        draft_token_ids=rng.integers(0, vocab, size=(batch, num_draft)),
        target_probs=p / p.sum(-1, keepdims=True),
        draft_probs=q / q.sum(-1, keepdims=True),
        uniforms=rng.random((batch, num_draft)),
        recovery_uniforms=rng.random(batch),
    )


def verify_big_batch(seed: int) -> list[list[int]]:
    return specaccept.verify(**big_batch(seed)).to_lists()
