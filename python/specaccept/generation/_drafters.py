"""Drafters: what proposes the tokens a step verifies.

- :class:`PromptLookup`: n-gram lookup in each row's own context (Hugging Face's
  ``prompt_lookup_num_tokens``); deterministic proposals (``draft_probs=None``).
- :class:`ModelDrafter`: a draft model run as a :class:`Session` (an
  :class:`~specaccept.generation.hf.HFModel` with its own key-value cache, or a
  stateless :class:`LanguageModel`): ``k`` drafts cost ``k`` one-token forward
  calls for the whole batch; trees cost one call per level.
- :class:`ProposeDrafter`: a user's :class:`Drafter` (``propose``).

Each keeps what it needs between steps and is told, after every step, the rows'
committed sequences (:meth:`advance`) and which rows go on (:meth:`select`).
The contract is docs/spec.md section 12.3.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from .._errors import InputError
from ._answers import model_probs, model_tokens
from ._sampling import (
    BLOCK_VALUES,
    Sampling,
    log,
    sample_logits,
    sample_rows,
    transform,
    without,
)
from ._session import Session, StatelessSession, TrackedSession

__all__ = [
    "Chain",
    "Drafter",
    "ModelDrafter",
    "PromptLookup",
    "ProposeDrafter",
    "Tree",
    "drafting_for",
    "fits",
    "too_large",
    "tree_parents",
]


@runtime_checkable
class Drafter(Protocol):
    """A drafter of your own: ``propose(sequences, k, rng, greedy)`` returns
    ``(tokens [B, k], probs [B, k, V])``, the drafted tokens and, for each, the
    distribution it was drawn from (for a greedy draft, any distribution whose
    argmax is the token). It gets copies of the sequences."""

    def propose(
        self,
        sequences: Sequence[Sequence[int]],
        k: int,
        rng: np.random.Generator,
        greedy: bool,
    ) -> tuple[Any, Any]: ...


@dataclass
class Chain:
    """A step's chain drafts: ``tokens[r]`` (at most the row's count) and the
    rows they were drawn from, ``scores [R, K, V]`` in the verifier's ``space``
    (``"logits"`` or ``"probs"``; ``None``: deterministic drafts)."""

    tokens: list[list[int]]
    scores: np.ndarray | None
    errors: dict[int, Exception]
    space: str = "probs"


@dataclass
class Tree:
    """A step's drafted trees in :func:`specaccept.verify_tree`'s layout: node 0 is
    the root (the last committed token), ``parents [R, N]`` (``-1`` for the root
    and for padding), ``tokens [R, N]`` and ``probs [R, N, V]`` (row ``c``: the
    law child ``c`` was drawn from)."""

    tokens: np.ndarray
    parents: np.ndarray
    probs: np.ndarray
    errors: dict[int, Exception]


def tree_parents(branching: Sequence[int]) -> list[int]:
    """The parents of a full tree with ``branching[d]`` children under every node of
    depth ``d``, in breadth-first order (node 0 the root)."""
    parents, level = [-1], [0]
    for count in branching:
        next_level = []
        for node in level:
            for _ in range(count):
                parents.append(node)
                next_level.append(len(parents) - 1)
        level = next_level
    return parents


class PromptLookup:
    """Drafts by n-gram lookup in each row's own context (prompt lookup decoding,
    Hugging Face's ``prompt_lookup_num_tokens``).

    The row's last ``n`` tokens, for ``n`` from ``max_ngram`` down to
    ``min_ngram``, are searched for earlier in the row; the first (leftmost)
    match followed by at least one token proposes the tokens that followed it, up
    to the step's ``k``. No match: nothing is drafted for the row this step (the
    target still emits one token). Proposals are deterministic
    (``draft_probs=None``), so sampling stays exact.

    Parameters
    ----------
    max_ngram : int
        The longest n-gram matched (Hugging Face's ``max_matching_ngram_size``,
        default 2).
    min_ngram : int
        The shortest.

    Examples
    --------
    >>> import specaccept
    >>> lookup = specaccept.PromptLookup()
    >>> lookup.lookup([5, 6, 7, 8, 9, 1, 6, 7], k=3)   # "6 7" was followed by "8 9 1"
    [8, 9, 1]
    >>> lookup.lookup([1, 2, 3], k=3)                  # no earlier match: nothing to draft
    []
    """

    def __init__(self, max_ngram: int = 2, min_ngram: int = 1):
        for name, value in (("max_ngram", max_ngram), ("min_ngram", min_ngram)):
            if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
                raise TypeError(f"{name} must be an int >= 1, got {type(value).__name__}")
            if value < 1:
                raise InputError(f"{name} must be an int >= 1, got {value}", argument=name)
        if min_ngram > max_ngram:
            raise InputError(
                f"min_ngram = {min_ngram} is larger than max_ngram = {max_ngram}",
                argument="min_ngram",
            )
        self.max_ngram, self.min_ngram = int(max_ngram), int(min_ngram)

    def __repr__(self) -> str:
        return f"PromptLookup(max_ngram={self.max_ngram}, min_ngram={self.min_ngram})"

    def lookup(self, sequence: Sequence[int], k: int) -> list[int]:
        """Up to ``k`` tokens proposed after ``sequence``."""
        seq = list(sequence)
        length = len(seq)
        if k <= 0:
            return []
        for n in range(min(self.max_ngram, length - 1), self.min_ngram - 1, -1):
            tail = seq[-n:]
            first = tail[0]
            for start in range(length - n):
                if seq[start] == first and seq[start : start + n] == tail:
                    follow = seq[start + n : start + n + k]
                    if follow:
                        return follow
        return []


class _LookupDrafting:
    """:class:`PromptLookup` in the loop: deterministic drafts, nothing sampled."""

    space = "logits"

    def __init__(self, lookup: PromptLookup):
        self.lookup = lookup

    def propose(self, sequences, counts, sampling, uniforms) -> Chain:
        tokens = [self.lookup.lookup(seq, k) for seq, k in zip(sequences, counts, strict=True)]
        return Chain(tokens, None, {}, self.space)

    def advance(self, sequences, failed) -> None:
        pass

    def select(self, rows) -> None:
        pass


class ModelDrafter:
    """A draft model as a :class:`Session` of its own (see the module's docstring).

    ``space`` is what the verifier reads: ``"logits"`` (chains from a logits
    session, drawn through :func:`sample_logits`) or ``"probs"``.
    """

    def __init__(
        self,
        open_session: Callable[[list[list[int]]], Session],
        vocab_size: int,
        scores: str | None,
        prompts: list[list[int]],
        isolate: bool,
    ):
        self._open = open_session
        self._tracked: TrackedSession | None = None
        self.space, self.isolate, self.vocab_size = "probs", isolate, vocab_size
        if scores not in ("logits", "probs"):
            scores = self._session(prompts).scores  # the model does not say: ask a session
        self.scores = scores

    def _session(self, sequences: list[list[int]]) -> TrackedSession:
        """The draft session, opened (and prefilled) at its first use: a run that
        never drafts (``k = 0``) never runs the draft model."""
        if self._tracked is None:
            opened = self._open([[] for _ in sequences])
            self._tracked = TrackedSession(opened, "draft", len(sequences), self.vocab_size)
        return self._tracked

    @property
    def tracked(self) -> TrackedSession:
        assert self._tracked is not None
        return self._tracked

    @property
    def forwards(self) -> int:
        return 0 if self._tracked is None else self._tracked.forwards

    def _extend(
        self, tokens: list[list[int]], parents: list[list[int]] | None, errors: dict[int, Exception]
    ) -> np.ndarray:
        scored = [1 if row else 0 for row in tokens] if parents is None else None
        scores, failed = self.tracked.extend(tokens, parents, scored=scored, isolate=self.isolate)
        if parents is None:
            scores = scores[:, 0] if scores.shape[1] else np.zeros((len(tokens), self.vocab_size))
        for b, error in failed.items():
            errors.setdefault(b, error)
        return scores

    def propose(
        self,
        sequences: list[list[int]],
        counts: list[int],
        sampling: Sampling,
        uniforms: np.ndarray | None,
    ) -> Chain:
        rows, width, vocab = len(sequences), max(counts, default=0), self.vocab_size
        tokens: list[list[int]] = [[] for _ in sequences]
        errors: dict[int, Exception] = {}
        if width == 0:
            return Chain(tokens, None, errors, self.space)
        self._session(sequences)
        from_logits = self.scores == "logits"
        scores_out: np.ndarray | None = None
        feed = [
            self.tracked.pending(b, seq) if counts[b] else [] for b, seq in enumerate(sequences)
        ]
        for i in range(width):
            step = self._extend(feed, None, errors)
            if scores_out is None:
                dtype = step.dtype if self.space == "logits" else np.float64
                try:
                    scores_out = np.zeros((rows, width, vocab), dtype=dtype)
                except MemoryError:
                    raise too_large(rows, width, vocab) from None
            u = None if uniforms is None else uniforms[:, i]
            bad: dict[int, Exception] = {}
            if from_logits and self.space == "logits":
                chosen, found = sample_logits(step, sampling, u, "draft logits")
                bad.update(found)
                scores_out[:, i] = step
            else:
                probs = np.asarray(step, np.float64)
                if from_logits or not sampling.plain:
                    probs, found = transform(
                        step if from_logits else log(probs), sampling, name="draft"
                    )
                    bad.update(found)
                chosen = sample_rows(probs, u, sampling.greedy)
                scores_out[:, i] = probs
            for b in range(rows):
                if counts[b] > i and b not in errors:
                    if b in bad:
                        errors[b] = bad[b]
                    else:
                        tokens[b].append(int(chosen[b]))
            feed = [
                [tokens[b][-1]] if counts[b] > i + 1 and b not in errors else []
                for b in range(rows)
            ]
        return Chain(tokens, scores_out, errors, self.space)

    def propose_tree(
        self,
        sequences: list[list[int]],
        branching: list[int],
        depths: list[int],
        sampling: Sampling,
        uniforms: np.ndarray | None,
    ) -> Tree:
        """Trees of ``branching`` cut at each row's ``depths[r]`` (deeper nodes are
        padding). A node's children are drawn without replacement from the
        transformed draft row after it (a greedy row takes the most likely
        tokens), and each level is fed in one call to score the next."""
        rows, vocab = len(sequences), self.vocab_size
        shape = tree_parents(branching)
        nodes = len(shape)
        depth = [0] * nodes
        children: list[list[int]] = [[] for _ in range(nodes)]
        for n in range(1, nodes):
            depth[n] = depth[shape[n]] + 1
            children[shape[n]].append(n)
        tokens = np.zeros((rows, nodes), dtype=np.int64)
        try:
            probs = np.zeros((rows, nodes, vocab))
        except MemoryError:
            raise too_large(rows, nodes, vocab, "tree") from None
        alive = np.array([[depth[n] <= depths[b] for n in range(nodes)] for b in range(rows)])
        errors: dict[int, Exception] = {}
        # The session's provisional index of each fed node, and the row scored after it.
        pending = [self._session(sequences).pending(b, seq) for b, seq in enumerate(sequences)]
        first = self._extend(pending, None, errors)
        slot = [{0: len(pending[b]) - 1} for b in range(rows)]
        after: list[dict[int, np.ndarray]] = [{0: first[b]} for b in range(rows)]
        level = [0]
        for d in range(len(branching)):
            if d > 0:
                fed = [[n for n in level if alive[b, n] and b not in errors] for b in range(rows)]
                if not any(fed):
                    break
                base = [len(self.tracked.fed_tokens[b]) for b in range(rows)]
                scored = self._extend(
                    [[int(tokens[b, n]) for n in fed[b]] for b in range(rows)],
                    [[slot[b][shape[n]] for n in fed[b]] for b in range(rows)],
                    errors,
                )
                for b in range(rows):
                    for j, n in enumerate(fed[b]):
                        slot[b][n] = base[b] + j
                        after[b][n] = scored[b, j]
            # A row whose law fails ends with the level's first error of its own;
            # the level's errors join the others in row order.
            failed = dict(errors)
            for n in level:
                self._draw_children(
                    n, children, after, alive, failed, sampling, uniforms, tokens, probs
                )
            for b in sorted(set(failed) - set(errors)):
                errors[b] = failed[b]
            level = [c for n in level for c in children[n]]
        parents = np.tile(np.array(shape, dtype=np.int64), (rows, 1))
        parents[~alive] = -1
        tokens[~alive] = 0
        return Tree(tokens, parents, probs, errors)

    def _draw_children(
        self,
        n: int,
        children: list[list[int]],
        after: list[dict[int, np.ndarray]],
        alive: np.ndarray,
        failed: dict[int, Exception],
        sampling: Sampling,
        uniforms: np.ndarray | None,
        tokens: np.ndarray,
        probs: np.ndarray,
    ) -> None:
        """Node ``n``'s live children in every row that has one (none in ``failed``,
        where a row whose law fails is added), drawn in order without replacement
        from the law after ``n``; a child with nothing left to draw is cut with
        its subtree. Rows go in blocks of :data:`BLOCK_VALUES` values."""
        kids = children[n]
        if not kids:
            return
        rows = np.array(
            [b for b in range(len(after)) if b not in failed and alive[b, kids].any()],
            dtype=np.int64,
        )
        step = max(1, BLOCK_VALUES // max(1, self.vocab_size))
        for first in range(0, rows.size, step):
            block = rows[first : first + step]
            scores = np.stack([after[b][n] for b in block])
            law, rank, bad = self._laws(scores, sampling.rows(block), block)
            for j, error in bad.items():
                failed[int(block[j])] = error
            ok = np.array([j not in bad for j in range(len(block))], dtype=bool)
            self._draw(
                block[ok],
                law[ok],
                rank[ok],
                kids,
                children,
                alive,
                sampling,
                uniforms,
                tokens,
                probs,
            )

    @staticmethod
    def _draw(
        rows: np.ndarray,
        law: np.ndarray,
        rank: np.ndarray,
        kids: list[int],
        children: list[list[int]],
        alive: np.ndarray,
        sampling: Sampling,
        uniforms: np.ndarray | None,
        tokens: np.ndarray,
        probs: np.ndarray,
    ) -> None:
        """``kids`` drawn in order for ``rows`` from ``law`` (a greedy row takes
        the top of ``rank``), each removed from both before the next."""
        greedy = sampling.greedy[rows]
        for c in kids:
            live = alive[rows, c]
            empty = np.where(greedy, rank.sum(axis=1), law.sum(axis=1)) <= 0
            for b in rows[live & empty]:
                alive[b, _subtree(children, c)] = False  # nothing left to draw
            draw = live & ~empty
            if not draw.any():
                continue
            at = rows[draw]
            u = None if uniforms is None else uniforms[at, c]
            x = np.where(
                greedy[draw],
                rank[draw].argmax(axis=1),
                sample_rows(law[draw], u, np.zeros(len(at), bool)),
            )
            tokens[at, c], probs[at, c] = x, law[draw]
            law[draw] = without(law[draw], x)
            rank[draw] = without(rank[draw], x)

    def _laws(
        self, scores: np.ndarray, sampling: Sampling, rows: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, dict[int, InputError]]:
        """The laws the children of one node are drawn from (``scores [B, V]``,
        the batch's ``rows``), the order a greedy row ranks them by, and the rows
        whose law fails, by index in ``scores``. Probability scores of a row that
        is greedy or at temperature 1 without filters are its law and its rank as
        they are; other rows are transformed, a greedy one ranked at temperature 1
        (its transform is one-hot)."""
        greedy = sampling.greedy
        raw = np.zeros(len(scores), dtype=bool)
        if self.scores != "logits":
            scores = np.asarray(scores, np.float64)
            raw = greedy | (
                (sampling.temperature == 1)
                & (sampling.top_k == 0)
                & (sampling.top_p == 1)
                & (sampling.min_p == 0)
            )
        law = np.array(scores, dtype=np.float64)
        rank = law.copy()
        bad: dict[int, InputError] = {}
        moved = np.flatnonzero(~raw)
        if moved.size:
            logits = scores[moved] if self.scores == "logits" else log(scores[moved])
            subset = sampling.rows(moved)
            law[moved], found = transform(logits, subset, name="draft", numbers=rows[moved])
            bad = {int(moved[j]): error for j, error in found.items()}
            rank[moved] = law[moved]
            ranked = np.flatnonzero(greedy[moved])
            if ranked.size:
                plain = subset.rows(ranked).with_temperature(np.ones(ranked.size))
                rank[moved[ranked]], _ = transform(logits[ranked], plain, name="draft")
        return law, rank, bad

    def advance(self, sequences: list[list[int]], failed: Any) -> None:
        if self._tracked is not None:
            self._tracked.advance(sequences, failed)

    def select(self, rows: list[int]) -> None:
        if self._tracked is not None:
            self._tracked.select(rows)


class ProposeDrafter:
    """A user's :class:`Drafter` in the loop: ``propose`` on copies of the
    sequences; with ``seed=``, each request alone with a Generator of its own key
    and offset and its own greedy flag (docs/spec.md section 12.3). With
    ``isolate``, a proposal that raises or answers wrongly is retried row by row
    (seeded: it already is), and the rows whose proposal fails alone end."""

    space = "probs"

    def __init__(self, drafter: Any, vocab_size: int, isolate: bool):
        self.drafter, self.vocab_size, self.isolate = drafter, vocab_size, isolate

    def _one(self, sequences, k, rng, greedy):
        proposal = self.drafter.propose([list(s) for s in sequences], k, rng, greedy)
        if not isinstance(proposal, (tuple, list)) or len(proposal) != 2:
            raise TypeError(
                "draft.propose must return (tokens [B, k], probs [B, k, V]), got "
                f"{type(proposal).__name__}"
            )
        tokens = model_tokens(proposal[0], (len(sequences), k), self.vocab_size, "draft.propose")
        if proposal[1] is None:
            raise TypeError("draft.propose must return (tokens, probs): probs is None")
        probs = model_probs(proposal[1], (len(sequences), k, self.vocab_size), "draft.propose")
        return tokens, np.asarray(probs, dtype=np.float64)

    def propose(self, sequences, counts, sampling, uniforms, generator=None, keys=None) -> Chain:
        rows, width = len(sequences), max(counts, default=0)
        tokens = np.zeros((rows, width), dtype=np.int64)
        try:
            probs = np.zeros((rows, width, self.vocab_size))
        except MemoryError:
            raise too_large(rows, width, self.vocab_size) from None
        errors: dict[int, Exception] = {}
        if keys is None:
            try:
                tokens[:], probs[:] = self._one(
                    sequences, width, generator, bool(sampling.greedy.all())
                )
            except Exception:
                if not self.isolate or rows <= 1:
                    raise
                alone = range(rows)  # retried row by row, with the same Generator
            else:
                alone = range(0)
            requests = [(b, generator) for b in alone]
        else:
            requests = [
                (b, np.random.default_rng([int(keys[0][b]), int(keys[1][b])])) for b in range(rows)
            ]
        for b, rng in requests:
            try:
                tokens[b : b + 1], probs[b : b + 1] = self._one(
                    [sequences[b]], width, rng, bool(sampling.greedy[b])
                )
            except InputError as error:
                if not self.isolate:
                    raise InputError(
                        f"request row {b}: {error}", argument=error.argument, row=b
                    ) from None
                errors[b] = error
            except Exception as error:
                if not self.isolate:
                    raise
                errors[b] = error
        if keys is None and requests and len(errors) == rows:
            raise next(iter(errors.values()))
        drafted = [[] if b in errors else tokens[b, : counts[b]].tolist() for b in range(rows)]
        return Chain(drafted, probs, errors, self.space)

    def advance(self, sequences, failed) -> None:
        pass

    def select(self, rows) -> None:
        pass


def _subtree(children: list[list[int]], node: int) -> list[int]:
    """``node`` and every node below it."""
    out, stack = [], [node]
    while stack:
        n = stack.pop()
        out.append(n)
        stack += children[n]
    return out


def fits(rows: int, width: int, vocab: int, what: str = "k") -> None:
    """Draft rows ``[rows, width, V]`` must fit in memory: checked before any draw."""
    if rows * width * vocab * 8 > sys.maxsize:
        raise too_large(rows, width, vocab, what)


def too_large(batch: int, width: int, vocab: int, what: str = "k") -> MemoryError:
    """Draft scores ``[B, width, V]`` this process cannot hold, naming the argument the
    size comes from: ``what`` (``k``, or ``tree`` for a tree's nodes), or
    ``draft.vocab_size`` when ``V`` is the larger."""
    name = what if width >= vocab else "draft.vocab_size"
    return MemoryError(
        f"{name}: drafting {width} tokens over a vocabulary of {vocab} for {batch} rows needs "
        f"a buffer of {batch * width * vocab} values, which cannot be allocated"
    )


def drafting_for(draft: Any, kind: str, prompts: list[list[int]], vocab: int, isolate: bool) -> Any:
    """The loop's drafter for ``draft`` of ``kind`` (``"lookup"``, ``"session"``,
    ``"propose"`` or ``"stateless"``); the loop sets its ``space``."""
    if kind == "lookup":
        return _LookupDrafting(draft)
    if kind == "propose":
        return ProposeDrafter(draft, vocab, isolate)
    if kind == "session":
        return ModelDrafter(draft.session, vocab, getattr(draft, "scores", None), prompts, isolate)
    return ModelDrafter(
        lambda prefixes: StatelessSession(draft, prefixes, "draft"),
        vocab,
        "probs",
        prompts,
        isolate,
    )
