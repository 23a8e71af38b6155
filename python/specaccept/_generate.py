"""Speculative decoding end to end: draft, verify, append, repeat.

The models are plain objects following a small protocol (:class:`LanguageModel`),
so the loop runs with the built-in n-gram models (:mod:`specaccept.ngram`), a
Hugging Face model (:mod:`specaccept.hf`) or anything else that returns
next-token probabilities.
"""

from __future__ import annotations

import hashlib
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from . import _native
from ._api import verify
from ._arrays import as_numpy, is_float
from ._errors import InputError
from ._stats import AcceptanceStats
from ._uniforms import DRAFTING_STREAM, as_generator, counter_keys

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


def _sample_rows(probs: np.ndarray, uniforms: np.ndarray | None, greedy: bool) -> np.ndarray:
    """One token per row of ``probs [B, V]``: argmax, or an inverse-CDF draw with
    ``uniforms [B]``."""
    if greedy or uniforms is None:
        return probs.argmax(axis=1)
    cdf = np.cumsum(probs, axis=1, dtype=np.float64)
    u = uniforms[:, None] * cdf[:, -1:]
    return np.minimum((cdf <= u).sum(axis=1), probs.shape[1] - 1)


@dataclass
class _Randomness:
    """Where a run's draws come from: one Generator shared by every row (``rng``),
    or, with ``seed=``, each request's own counter-based streams (docs/spec.md
    section 4.6): its key is a hash of the seed and its prompt, its offset the
    number of tokens it has generated, so its text does not depend on the batch."""

    generator: np.random.Generator | None
    request_seeds: np.ndarray | None = None

    @classmethod
    def of(cls, rng: Any, seed: Any, prompts: list[list[int]]) -> _Randomness:
        if seed is None:
            return cls(as_generator(rng))
        if rng is not None:
            raise InputError("rng: give seed or rng, not both", argument="rng")
        if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)):
            raise TypeError(f"seed must be None or an int, got {type(seed).__name__}")
        if not 0 <= int(seed) < 2**64:
            raise InputError(f"seed = {int(seed)} is outside [0, 2**64)", argument="seed")
        return cls(None, np.array([_request_seed(int(seed), p) for p in prompts], np.uint64))

    def step(self, rows: list[int], emitted: list[int]) -> tuple[np.ndarray, np.ndarray] | None:
        """The seeds and offsets of ``rows`` this step (``None``: the Generator draws)."""
        if self.request_seeds is None:
            return None
        return counter_keys(self.request_seeds[rows], np.array(emitted, dtype=np.uint64))

    def draft_uniforms(self, keys: tuple[np.ndarray, np.ndarray] | None, shape: tuple[int, int]):
        """The uniforms the drafts of a step are sampled with, ``[rows, width]``."""
        if keys is None:
            assert self.generator is not None
            # Position by position, as the drafts are sampled.
            return self.generator.random(shape[::-1]).T
        return _native.counter_stream(keys[0], keys[1], shape[1], DRAFTING_STREAM)


def _request_seed(seed: int, prompt: list[int]) -> int:
    """A request's 64-bit key: a hash of the run's seed and the prompt's tokens."""
    data = seed.to_bytes(8, "little") + np.asarray(prompt, dtype="<u8").tobytes()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def _too_large(batch: int, width: int, vocab: int) -> MemoryError:
    """Draft probabilities ``[B, k, V]`` this process cannot hold, naming the
    argument the size comes from."""
    name = "k" if width >= vocab else "draft.vocab_size"
    return MemoryError(
        f"{name}: drafting {width} tokens over a vocabulary of {vocab} for {batch} rows needs "
        f"a buffer of {batch * width * vocab} values, which cannot be allocated"
    )


def _model_array(value: Any, name: str, what: str) -> np.ndarray:
    """A model's answer as a NumPy array (in place when it can be), or a TypeError."""
    array = as_numpy(value, name)
    if isinstance(array, np.ndarray):
        return array
    try:
        return np.asarray(array)
    except (TypeError, ValueError) as error:
        raise TypeError(f"{name} must return {what}, got {type(value).__name__}") from error


def _model_probs(value: Any, shape: tuple[int, ...], name: str) -> np.ndarray:
    """A model's answer as a float array of ``shape`` (read in place when it can be)."""
    array = _model_array(value, name, "a float array")
    if not is_float(array.dtype):
        raise TypeError(f"{name} must return a float array, got dtype {array.dtype}")
    if array.shape != shape:
        raise InputError(
            f"{name} returned shape {array.shape}, expected {shape}", argument=name.split(".")[0]
        )
    return array


def _model_tokens(value: Any, shape: tuple[int, ...], vocab: int, name: str) -> np.ndarray:
    """Drafted tokens as an int array of ``shape``, each in ``[0, V)``."""
    array = _model_array(value, name, "int tokens")
    if array.dtype.kind not in "iu":
        raise TypeError(f"{name} must return int tokens, got dtype {array.dtype}")
    if array.shape != shape:
        raise InputError(
            f"{name} returned tokens of shape {array.shape}, expected {shape}",
            argument=name.split(".")[0],
        )
    bad = (array < 0) | (array >= vocab)
    if bad.any():
        b, t = (int(i) for i in np.argwhere(bad)[0])
        raise InputError(
            f"{name} returned token {int(array[b, t])} at [{b}, {t}], outside [0, V) with "
            f"V = {vocab}",
            argument=name.split(".")[0],
            index=(b, t),
            row=b,
        )
    return array.astype(np.int64, copy=False)


def _propose(
    draft: Any,
    sequences: list[list[int]],
    k: int,
    randomness: _Randomness,
    greedy: bool,
    vocab: int | None = None,
    keys: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """``k`` drafted tokens per row and the distributions they came from."""
    batch = len(sequences)
    vocab = int(draft.vocab_size) if vocab is None else vocab
    if batch * k * vocab * 8 > sys.maxsize:  # refused before any model is called
        raise _too_large(batch, k, vocab)
    if isinstance(draft, Drafter):
        # The drafter gets copies: whatever it does to them, the run's sequences stay.
        if keys is None:
            assert randomness.generator is not None
            return _proposal(
                draft, [list(s) for s in sequences], k, randomness.generator, greedy, vocab
            )
        # seed=: each request proposes alone, with a Generator of its own seed and offset.
        parts = [
            _proposal(
                draft, [list(s)], k, np.random.default_rng([int(key), int(step)]), greedy, vocab
            )
            for s, key, step in zip(sequences, keys[0], keys[1], strict=True)
        ]
        if not parts:
            return np.zeros((0, k), dtype=np.int64), np.zeros((0, k, vocab))
        return (
            np.concatenate([t for t, _ in parts]),
            np.concatenate([_model_probs(p, (1, k, vocab), "draft.propose") for _, p in parts]),
        )
    extended = [list(s) for s in sequences]
    try:
        tokens = np.zeros((batch, k), dtype=np.int64)
        probs = np.zeros((batch, k, vocab))
    except MemoryError:
        raise _too_large(batch, k, vocab) from None
    uniforms = None if greedy else randomness.draft_uniforms(keys, (batch, k))
    for i in range(k):
        answer = draft.next_token_probs(extended, 1)
        step = _model_probs(answer, (batch, 1, vocab), "draft.next_token_probs")[:, 0]
        chosen = _sample_rows(step, None if uniforms is None else uniforms[:, i], greedy)
        tokens[:, i], probs[:, i] = chosen, step
        for seq, token in zip(extended, chosen.tolist(), strict=True):
            seq.append(token)
    return tokens, probs


def _proposal(
    draft: Any,
    sequences: list[list[int]],
    k: int,
    rng: np.random.Generator,
    greedy: bool,
    vocab: int,
) -> tuple[np.ndarray, Any]:
    """``draft.propose``'s answer, checked: tokens ``[B, k]`` and the probabilities."""
    proposal = draft.propose(sequences, k, rng, greedy)
    if not isinstance(proposal, (tuple, list)) or len(proposal) != 2:
        raise TypeError(
            "draft.propose must return (tokens [B, k], probs [B, k, V]), got "
            f"{type(proposal).__name__}"
        )
    tokens = _model_tokens(proposal[0], (len(sequences), k), vocab, "draft.propose")
    if proposal[1] is None:
        raise TypeError("draft.propose must return (tokens, probs): probs is None")
    return tokens, proposal[1]  # verify reads and checks it, as draft_probs


def _check_model(model: Any, name: str, drafter: bool = False) -> int:
    """``model.vocab_size``, checked, for a model that follows the protocol."""
    methods = ("next_token_probs", "propose") if drafter else ("next_token_probs",)
    if not any(callable(getattr(model, m, None)) for m in methods):
        what = "a LanguageModel or a Drafter" if drafter else "a LanguageModel"
        raise TypeError(
            f"{name} must be {what} (with {' or '.join(methods)}), got {type(model).__name__}"
        )
    vocab = getattr(model, "vocab_size", None)
    if isinstance(vocab, (bool, np.bool_)) or not isinstance(vocab, (int, np.integer)):
        raise TypeError(f"{name}.vocab_size must be an int, got {type(vocab).__name__}")
    if vocab < 1:
        raise InputError(f"{name}.vocab_size must be >= 1, got {vocab}", argument=name)
    return int(vocab)


def _prompts(prompts: Any) -> list[list[int]]:
    """The prompts as lists of Python ints (copies: the caller's are never modified)."""
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Iterable):
        raise TypeError(
            f"prompts must be a sequence of token-id sequences, got {type(prompts).__name__}"
        )
    sequences = []
    for b, prompt in enumerate(prompts):
        if isinstance(prompt, (str, bytes)) or not isinstance(prompt, Iterable):
            raise TypeError(
                f"prompts[{b}] must be a sequence of int token ids, got {type(prompt).__name__}"
            )
        tokens = list(prompt)
        for i, token in enumerate(tokens):
            if isinstance(token, (bool, np.bool_)) or not isinstance(token, (int, np.integer)):
                raise TypeError(
                    f"prompts[{b}][{i}] must be an int token id, got {type(token).__name__}"
                )
            if not 0 <= token <= _MAX_TOKEN:
                raise InputError(
                    f"prompts[{b}][{i}] = {token}: token ids must lie in [0, 2**63)",
                    argument="prompts",
                    index=(b, i),
                    row=b,
                )
        if not tokens:
            raise InputError(
                f"prompts[{b}] is empty: a prompt needs at least one token",
                argument="prompts",
                row=b,
            )
        sequences.append([int(t) for t in tokens])
    return sequences


_MAX_TOKEN = 2**63 - 1


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
    seed: int | None = None,
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
        The randomness of drafting and verification, one stream for the batch:
        a row's text then depends on the other rows.
    seed : int, optional
        Instead of ``rng``: per-request counter-based randomness (docs/spec.md
        section 4.6). Each request is keyed by a hash of ``seed`` and its
        prompt, and each step by the number of tokens it has generated, so the
        same prompt and seed give the same text whatever else is in the batch
        (given models that score each row on its own). In ``[0, 2**64)``.
    progress : callable, optional
        Called as ``progress(done_tokens, total_tokens)`` after each step.

    Returns
    -------
    Generation

    Raises
    ------
    TypeError, ValueError
        A bad argument (checked before any model is called), or a model answer
        of the wrong type or shape (named ``target``/``draft`` and its method).
        An exception raised by a model itself propagates as it is.
    MemoryError
        ``k`` drafts over the vocabulary are more than this process can hold.

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
    if isinstance(k, (bool, np.bool_)) or not isinstance(k, (int, np.integer)):
        raise TypeError(f"k must be an int >= 0, got {k!r:.40}")
    if k < 0:
        raise InputError(f"k must be an int >= 0, got {k!r}", argument="k")
    if isinstance(max_new_tokens, (bool, np.bool_)) or not isinstance(
        max_new_tokens, (int, np.integer)
    ):
        raise TypeError(f"max_new_tokens must be an int, got {type(max_new_tokens).__name__}")
    if max_new_tokens < 0:
        raise InputError(
            f"max_new_tokens must be >= 0, got {max_new_tokens}", argument="max_new_tokens"
        )
    if eos_token_id is not None and (
        isinstance(eos_token_id, (bool, np.bool_))
        or not isinstance(eos_token_id, (int, np.integer))
    ):
        raise TypeError(f"eos_token_id must be None or an int, got {type(eos_token_id).__name__}")
    if not isinstance(greedy, (bool, np.bool_)):
        raise TypeError(f"greedy must be a bool, got {type(greedy).__name__}")
    if progress is not None and not callable(progress):
        raise TypeError(f"progress must be None or a callable, got {type(progress).__name__}")
    k, max_new_tokens, greedy = int(k), int(max_new_tokens), bool(greedy)
    vocab = _check_model(target, "target")
    if isinstance(draft, Drafter) and getattr(draft, "vocab_size", None) is None:
        draft_vocab = vocab  # a drafter need not say: it drafts in the target's vocabulary
    else:
        draft_vocab = _check_model(draft, "draft", drafter=True)
    if draft_vocab != vocab:
        raise InputError(
            f"target and draft vocabularies differ: {vocab} vs {draft_vocab}", argument="draft"
        )
    sequences = _prompts(prompts)
    randomness = _Randomness.of(rng, seed, sequences)
    result = Generation(tokens=[[] for _ in sequences])
    active = [b for b in range(len(sequences)) if max_new_tokens > 0]
    start = time.perf_counter()
    total = max_new_tokens * len(sequences)
    while active:
        context = [sequences[b] for b in active]
        # Never draft past max_new_tokens: a step emits at most k_b + 1 tokens.
        counts = [min(k, max_new_tokens - len(result.tokens[b]) - 1) for b in active]
        width = max(counts)
        keys = randomness.step(active, [len(result.tokens[b]) for b in active])
        drafts, draft_probs = _propose(draft, context, width, randomness, greedy, vocab, keys)
        result.draft_calls += len(active) * width
        extended = [c + d.tolist() for c, d in zip(context, drafts, strict=True)]
        target_probs = _model_probs(
            target.next_token_probs(extended, width + 1),
            (len(active), width + 1, vocab),
            "target.next_token_probs",
        )
        result.target_calls += len(active)
        step_counts = np.array(counts, dtype=np.int64)
        step = verify(
            drafts,
            target_probs,
            draft_probs,
            num_draft_tokens=step_counts,
            rng=randomness.generator,
            seeds=None if keys is None else keys[0],
            offsets=None if keys is None else keys[1],
            greedy=greedy,
        )
        result.stats.update(step, step_counts)
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
