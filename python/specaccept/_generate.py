"""Speculative decoding end to end: draft, verify, append, repeat.

The models are plain objects following a small protocol (:class:`LanguageModel`),
so the loop runs with the built-in n-gram models (:mod:`specaccept.ngram`), a
Hugging Face model (:mod:`specaccept.hf`) or anything else that returns
next-token probabilities.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ._api import _generator, verify
from ._stats import AcceptanceStats

__all__ = ["Drafter", "Generation", "LanguageModel", "generate"]


@runtime_checkable
class LanguageModel(Protocol):
    """What :func:`generate` needs of a model: its vocabulary size and its
    next-token probabilities.

    ``next_token_probs(sequences, num_positions)`` returns an array
    ``[len(sequences), num_positions, vocab_size]`` whose entry ``[b, j]`` is the
    distribution of the token that follows the prefix
    ``sequences[b][: len(sequences[b]) - num_positions + 1 + j]``: with
    ``num_positions = 1``, the next token after the whole sequence; with
    ``k + 1``, the distributions a target model scores ``k`` drafted tokens with,
    in one call. Any float dtype or framework array (read in place).
    """

    vocab_size: int

    def next_token_probs(self, sequences: Sequence[Sequence[int]], num_positions: int) -> Any: ...


@runtime_checkable
class Drafter(Protocol):
    """A draft model that proposes on its own (optional; otherwise :func:`generate`
    samples drafts from the model's :meth:`LanguageModel.next_token_probs`).

    ``propose(sequences, k, rng, greedy)`` returns ``(tokens [B, k], probs [B, k, V])``:
    the drafted tokens and, for each, the distribution it was drawn from (for a
    greedy draft, any distribution whose argmax is the token).
    """

    def propose(
        self,
        sequences: Sequence[Sequence[int]],
        k: int,
        rng: np.random.Generator,
        greedy: bool,
    ) -> tuple[Any, Any]: ...


@dataclass
class Generation:
    """The result of :func:`generate`.

    Attributes
    ----------
    tokens : list of list of int
        The new tokens of each prompt (the end-of-sequence token included when it
        ended the row; never a token past it or past ``max_new_tokens``).
    stats : AcceptanceStats
        What each verification step kept.
    target_calls : int
        Rows scored by the target model (one per row per step); plain decoding
        would have needed one per generated token.
    draft_calls : int
        Rows run through the draft model (``k`` per row per step).
    seconds : float
        Wall time of the loop.
    """

    tokens: list[list[int]]
    stats: AcceptanceStats = field(default_factory=AcceptanceStats)
    target_calls: int = 0
    draft_calls: int = 0
    seconds: float = 0.0

    @property
    def num_tokens(self) -> int:
        """Tokens generated over all rows."""
        return sum(len(t) for t in self.tokens)

    @property
    def target_calls_saved(self) -> int:
        """Target-model calls plain decoding would have made, minus those made."""
        return self.num_tokens - self.target_calls


def _sample_rows(probs: np.ndarray, rng: np.random.Generator, greedy: bool) -> np.ndarray:
    """One token per row of ``probs [B, V]``: argmax, or an inverse-CDF draw."""
    if greedy:
        return probs.argmax(axis=1)
    cdf = np.cumsum(probs, axis=1, dtype=np.float64)
    u = rng.random((probs.shape[0], 1)) * cdf[:, -1:]
    return np.minimum((cdf <= u).sum(axis=1), probs.shape[1] - 1)


def _propose(
    draft: Any, sequences: list[list[int]], k: int, rng: np.random.Generator, greedy: bool
) -> tuple[np.ndarray, np.ndarray]:
    if isinstance(draft, Drafter):
        tokens, probs = draft.propose(sequences, k, rng, greedy)
        return np.asarray(tokens), np.asarray(probs)
    extended = [list(s) for s in sequences]
    tokens = np.zeros((len(sequences), k), dtype=np.int64)
    probs = np.zeros((len(sequences), k, draft.vocab_size))
    for i in range(k):
        step = np.asarray(draft.next_token_probs(extended, 1))[:, 0]
        chosen = _sample_rows(step, rng, greedy)
        tokens[:, i], probs[:, i] = chosen, step
        for seq, token in zip(extended, chosen.tolist(), strict=True):
            seq.append(token)
    return tokens, probs


def generate(
    target: LanguageModel,
    draft: LanguageModel | Drafter,
    prompts: Sequence[Sequence[int]],
    *,
    k: int = 4,
    max_new_tokens: int = 32,
    eos_token_id: int | None = None,
    greedy: bool = False,
    rng: Any = None,
    progress: Callable[[int, int], None] | None = None,
) -> Generation:
    """Generate continuations of ``prompts`` by speculative decoding.

    Each step, every unfinished row drafts ``k`` tokens with ``draft``, the target
    scores them in one call (``k + 1`` positions), and :func:`specaccept.verify`
    keeps the accepted prefix and one more token. The output follows the target
    model exactly: token for token for greedy decoding (plain greedy decoding
    with the target), in distribution for sampling.

    Parameters
    ----------
    target : LanguageModel
        The model whose distribution the output follows.
    draft : LanguageModel or Drafter
        The cheaper model that proposes tokens.
    prompts : sequence of sequences of int
        One prompt per row, any lengths (at least one token each).
    k : int
        Tokens drafted per step (fewer near ``max_new_tokens``, never wasted past it).
    max_new_tokens : int
        New tokens per row at most.
    eos_token_id : int, optional
        A row ends after emitting this token.
    greedy : bool
        Greedy decoding (argmax drafts, argmax verification) instead of sampling.
    rng : None, int or Generator
        The randomness of drafting and verification.
    progress : callable, optional
        Called as ``progress(done_tokens, total_tokens)`` after each step.

    Returns
    -------
    Generation

    Examples
    --------
    >>> import specaccept
    >>> from specaccept.ngram import builtin_models
    >>> target, draft, vocab = builtin_models()
    >>> out = specaccept.generate(target, draft, [vocab.encode("Anne Elliot was")],
    ...                           k=4, max_new_tokens=8, greedy=True)
    >>> vocab.decode(out.tokens[0])
    'not done for her. Miss Elliot,'
    """
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 0:
        raise ValueError(f"k must be an int >= 0, got {k!r}")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, (int, np.integer)):
        raise TypeError(f"max_new_tokens must be an int, got {type(max_new_tokens).__name__}")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if target.vocab_size != getattr(draft, "vocab_size", target.vocab_size):
        raise ValueError(
            f"target and draft vocabularies differ: {target.vocab_size} vs {draft.vocab_size}"
        )
    sequences = [list(map(int, p)) for p in prompts]
    for b, p in enumerate(sequences):
        if not p:
            raise ValueError(f"prompts[{b}] is empty: a prompt needs at least one token")
    generator = _generator(rng)
    result = Generation(tokens=[[] for _ in sequences])
    active = [b for b in range(len(sequences)) if max_new_tokens > 0]
    start = time.perf_counter()
    total = max_new_tokens * len(sequences)
    while active:
        context = [sequences[b] for b in active]
        remaining = np.array([max_new_tokens - len(result.tokens[b]) for b in active])
        # Never draft past max_new_tokens: a step emits at most k_b + 1 tokens.
        counts = np.minimum(k, remaining - 1)
        width = int(counts.max())
        drafts, draft_probs = _propose(draft, context, width, generator, greedy)
        result.draft_calls += len(active) * width
        extended = [c + d.tolist() for c, d in zip(context, drafts, strict=True)]
        target_probs = target.next_token_probs(extended, width + 1)
        result.target_calls += len(active)
        step = verify(
            drafts,
            target_probs,
            draft_probs,
            num_draft_tokens=counts,
            rng=generator,
            greedy=greedy,
        )
        result.stats.update(step, counts)
        still_active = []
        for i, b in enumerate(active):
            done = False
            for token in step.tokens(i).tolist():
                sequences[b].append(token)
                result.tokens[b].append(token)
                if token == eos_token_id or len(result.tokens[b]) == max_new_tokens:
                    done = True
                    break
            if not done:
                still_active.append(b)
        active = still_active
        if progress is not None:
            finished = total - sum(max_new_tokens - len(result.tokens[b]) for b in active)
            progress(finished, total)
    result.seconds = time.perf_counter() - start
    return result


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
