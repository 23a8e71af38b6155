"""Where a generation run's draws come from (docs/spec.md section 12.4).

One Generator shared by every row (``rng``), or, with ``seed=``, each request's
own counter-based streams (section 4.6): its key is a hash of the seed and its
prompt, its offset the number of tokens it has generated, so its text does not
depend on the batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import _native
from .._errors import InputError
from .._uniforms import (
    DRAFTING_STREAM,
    as_generator,
    counter_keys,
    counter_uniforms,
    request_seed,
)

__all__ = ["Randomness"]


@dataclass
class Randomness:
    generator: np.random.Generator | None
    request_seeds: np.ndarray | None = None

    @classmethod
    def of(cls, rng: Any, seed: Any, prompts: list[list[int]]) -> Randomness:
        if seed is None:
            return cls(as_generator(rng))
        if rng is not None:
            raise InputError("rng: give seed or rng, not both", argument="rng")
        if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)):
            raise TypeError(f"seed must be None or an int, got {type(seed).__name__}")
        if not 0 <= int(seed) < 2**64:
            raise InputError(f"seed = {int(seed)} is outside [0, 2**64)", argument="seed")
        return cls(None, np.array([request_seed(int(seed), p) for p in prompts], np.uint64))

    def step(self, rows: list[int], emitted: list[int]) -> tuple[np.ndarray, np.ndarray] | None:
        """The seeds and offsets of ``rows`` this step (``None``: the Generator draws)."""
        if self.request_seeds is None:
            return None
        return counter_keys(self.request_seeds[rows], np.array(emitted, dtype=np.uint64))

    def draft_uniforms(
        self, keys: tuple[np.ndarray, np.ndarray] | None, shape: tuple[int, int]
    ) -> np.ndarray:
        """The uniforms the drafts of a step are sampled with, ``[rows, width]``
        (column ``i``: draft position ``i``, or tree node ``i``)."""
        if keys is None:
            assert self.generator is not None
            # Position by position, as the drafts are sampled.
            return self.generator.random(shape[::-1]).T
        return _native.counter_stream(keys[0], keys[1], shape[1], DRAFTING_STREAM)

    def verify_uniforms(
        self, keys: tuple[np.ndarray, np.ndarray] | None, shape: tuple[int, int]
    ) -> tuple[np.ndarray, np.ndarray]:
        """The uniforms ``[rows, width]`` and recovery uniforms ``[rows]`` of a
        verification: with ``seed``, exactly the verifier's own ``seeds``/``offsets``
        draws (docs/spec.md section 4.6); else from the Generator, acceptance
        uniforms first (the verifiers' own order)."""
        if keys is None:
            assert self.generator is not None
            uniforms = self.generator.random(shape)
            return uniforms, self.generator.random(shape[0])
        return counter_uniforms(keys[0], keys[1], shape[1])

    def position_uniforms(
        self, keys: tuple[np.ndarray, np.ndarray], rows: np.ndarray, positions: np.ndarray
    ) -> np.ndarray:
        """With ``seed``: for each ``(rows[j], positions[j])``, the uniform plain
        decoding draws for the token ``positions[j]`` places past the row's offset:
        the recovery uniform (stream 1, index 0) at that offset (docs/spec.md
        section 12.4)."""
        offsets = keys[1][rows].astype(np.uint64) + positions.astype(np.uint64)
        return counter_uniforms(keys[0][rows].astype(np.uint64), offsets, 0)[1]
