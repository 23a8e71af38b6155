"""Model sessions: a model's state over a batch of growing token sequences.

A session holds one row per request. A row's tokens are *committed* (kept for
good) or, between :meth:`Session.extend` and the next :meth:`Session.commit`,
*provisional*: drafts under test. Provisional tokens are numbered from 0 in the
order they were added since the last commit; each has a parent, the provisional
token it follows (``-1``: the last committed token), so a row's provisional
tokens form a chain or a tree. ``commit(keep)`` keeps, per row, a chain of them
(``keep[b]``: their indices, root first) and forgets the others.

:class:`Ledger` is that bookkeeping, shared by every session here;
:class:`StatelessSession` runs a stateless :class:`LanguageModel` (the n-gram
models, any ``next_token_probs``) as a session by recomputing each sequence.
The Hugging Face session with a key-value cache is in :mod:`specaccept.generation.hf`.
The contract is docs/spec.md section 12.2.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np

from .._errors import InputError
from ._answers import model_probs

__all__ = [
    "ColumnSession",
    "LanguageModel",
    "Ledger",
    "LedgerSession",
    "Session",
    "SessionModel",
    "StatelessSession",
    "TrackedSession",
    "longest_match",
]

Scores = Literal["logits", "probs"]


@runtime_checkable
class LanguageModel(Protocol):
    """A stateless model: its vocabulary size and its next-token probabilities.

    ``next_token_probs(sequences, num_positions)`` returns an array
    ``[len(sequences), num_positions, vocab_size]`` whose entry ``[b, j]`` is the
    distribution of the token that follows the prefix
    ``sequences[b][: len(sequences[b]) - num_positions + 1 + j]``: with
    ``num_positions = 1``, the next token after the whole sequence; with
    ``k + 1``, the distributions a target model scores ``k`` drafted tokens with,
    in one call. Any float dtype or framework array (read in place).
    :func:`specaccept.generate` runs it through a :class:`StatelessSession`.
    """

    vocab_size: int

    def next_token_probs(self, sequences: Sequence[Sequence[int]], num_positions: int) -> Any: ...


@runtime_checkable
class Session(Protocol):
    """A model's state over a batch of token sequences, one row per request.

    ``scores`` says what :meth:`extend` returns: ``"logits"`` (verified with
    temperature, top-k and top-p by :func:`specaccept.verify_logits`) or
    ``"probs"`` (next-token probabilities).
    """

    vocab_size: int
    scores: Scores

    @property
    def num_rows(self) -> int:
        """Rows (requests) in the session."""
        ...

    def extend(
        self,
        tokens: Sequence[Sequence[int]],
        parents: Sequence[Sequence[int]] | None = None,
        *,
        scored: Sequence[int] | None = None,
    ) -> Any:
        """Add ``tokens[b]`` to row ``b`` as provisional tokens and return the
        scores of the token after each of the last ``scored[b]`` of them
        (``None``: all): ``[B, S, V]`` with ``S = max(scored)``, row ``b``'s in its
        first ``scored[b]`` entries. ``parents[b][i]``: the provisional index of
        token ``i``'s parent, or ``-1`` for the last committed token; ``None``:
        each token follows the row's previous provisional token (a chain)."""
        ...

    def commit(self, keep: Sequence[Sequence[int]]) -> None:
        """Keep the provisional tokens ``keep[b]`` of each row (a chain from the
        committed end, root first) and drop the other provisional tokens."""
        ...

    def select(self, rows: Sequence[int]) -> None:
        """Keep only ``rows``, in that order (a row may repeat)."""
        ...


@runtime_checkable
class SessionModel(Protocol):
    """A model that opens :class:`Session` objects: ``session(prefixes)`` starts
    one with ``prefixes[b]`` committed in row ``b`` (possibly empty)."""

    vocab_size: int

    def session(self, prefixes: Sequence[Sequence[int]]) -> Session: ...


def _token_lists(value: Any, rows: int, name: str) -> list[list[int]]:
    """``value`` as ``rows`` lists of Python ints (a TypeError or InputError naming ``name``)."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise TypeError(f"{name} must be a sequence of int sequences, got {type(value).__name__}")
    lists = []
    for b, row in enumerate(value):
        if isinstance(row, (str, bytes)) or not isinstance(row, Iterable):
            raise TypeError(f"{name}[{b}] must be a sequence of ints, got {type(row).__name__}")
        items = []
        for i, item in enumerate(row):
            if isinstance(item, (bool, np.bool_)) or not isinstance(item, (int, np.integer)):
                raise TypeError(f"{name}[{b}][{i}] must be an int, got {type(item).__name__}")
            items.append(int(item))
        lists.append(items)
    if len(lists) != rows:
        raise InputError(f"{name} has {len(lists)} rows, the session {rows}", argument=name)
    return lists


class Ledger:
    """The committed count and the provisional tokens of every row: what each
    session checks and remembers between :meth:`extend` and :meth:`commit`.

    ``tokens[b]``, ``parents[b]`` and ``depths[b]`` list row ``b``'s provisional
    tokens, each one's parent (a provisional index, ``-1`` for the committed end)
    and its depth (provisional ancestors: its position is ``committed[b] + depth``).
    """

    def __init__(self, committed: list[int], vocab_size: int, max_length: int | None = None):
        self.committed = committed
        self.vocab_size = vocab_size
        self.max_length = max_length
        self.tokens: list[list[int]] = [[] for _ in committed]
        self.parents: list[list[int]] = [[] for _ in committed]
        self.depths: list[list[int]] = [[] for _ in committed]

    @property
    def num_rows(self) -> int:
        return len(self.committed)

    def check(
        self, tokens: Any, parents: Any
    ) -> tuple[list[list[int]], list[list[int]], list[list[int]]]:
        """The new tokens, their parents and depths, checked (nothing is recorded)."""
        rows = self.num_rows
        new = _token_lists(tokens, rows, "tokens")
        for b, row in enumerate(new):
            for i, token in enumerate(row):
                if not 0 <= token < self.vocab_size:
                    raise InputError(
                        f"tokens[{b}][{i}] = {token} is outside [0, V) with V = {self.vocab_size}",
                        argument="tokens",
                        index=(b, i),
                        row=b,
                    )
        if parents is None:
            links = [
                [len(self.tokens[b]) + i - 1 for i in range(len(row))] for b, row in enumerate(new)
            ]
        else:
            links = _token_lists(parents, rows, "parents")
        depths = []
        for b, (row, link) in enumerate(zip(new, links, strict=True)):
            if len(link) != len(row):
                raise InputError(
                    f"parents[{b}] has {len(link)} entries for {len(row)} tokens",
                    argument="parents",
                    row=b,
                )
            start, known = len(self.tokens[b]), self.depths[b]
            row_depths: list[int] = []
            for i, parent in enumerate(link):
                if not -1 <= parent < start + i:
                    raise InputError(
                        f"parents[{b}][{i}] = {parent}: a parent is -1 (the committed end) or an "
                        f"earlier provisional token, in [0, {start + i})",
                        argument="parents",
                        index=(b, i),
                        row=b,
                    )
                if parent < 0:
                    depth = 0
                elif parent < start:
                    depth = known[parent] + 1
                else:
                    depth = row_depths[parent - start] + 1
                if self.max_length is not None and self.committed[b] + depth >= self.max_length:
                    raise InputError(
                        f"tokens[{b}][{i}] would be at position {self.committed[b] + depth}, past "
                        f"the model's context of {self.max_length} tokens",
                        argument="tokens",
                        index=(b, i),
                        row=b,
                    )
                row_depths.append(depth)
            depths.append(row_depths)
        return new, links, depths

    def check_scored(self, scored: Any, new: list[list[int]]) -> list[int]:
        """``scored`` checked: per row, how many of its last new tokens to score."""
        if scored is None:
            return [len(row) for row in new]
        counts = _token_lists([scored], 1, "scored")[0]
        if len(counts) != len(new):
            raise InputError(
                f"scored has {len(counts)} entries, the session {len(new)} rows",
                argument="scored",
            )
        for b, (count, row) in enumerate(zip(counts, new, strict=True)):
            if not 0 <= count <= len(row):
                raise InputError(
                    f"scored[{b}] = {count}: between 0 and the row's {len(row)} new tokens",
                    argument="scored",
                    index=(b,),
                    row=b,
                )
        return counts

    def record(self, new: list[list[int]], links: list[list[int]], depths: list[list[int]]) -> None:
        """Adds what :meth:`check` returned (after the model ran)."""
        for b in range(self.num_rows):
            self.tokens[b] += new[b]
            self.parents[b] += links[b]
            self.depths[b] += depths[b]

    def check_keep(self, keep: Any) -> list[list[int]]:
        """``keep`` checked: per row, a chain of provisional indices from the committed end."""
        paths = _token_lists(keep, self.num_rows, "keep")
        for b, path in enumerate(paths):
            parent = -1
            for j, index in enumerate(path):
                if not 0 <= index < len(self.tokens[b]) or self.parents[b][index] != parent:
                    raise InputError(
                        f"keep[{b}][{j}] = {index}: keep lists a chain of provisional tokens, each "
                        f"the child of the one before (the first a child of the committed end)",
                        argument="keep",
                        index=(b, j),
                        row=b,
                    )
                parent = index
        return paths

    def commit(self, paths: list[list[int]]) -> None:
        for b, path in enumerate(paths):
            self.committed[b] += len(path)
            self.tokens[b], self.parents[b], self.depths[b] = [], [], []

    def chain_keep(self, lengths: Any) -> list[list[int]]:
        """The ``keep`` of ``rollback(lengths)``: each row's first provisional tokens."""
        counts = _token_lists([lengths], 1, "lengths")[0]
        if len(counts) != self.num_rows:
            raise InputError(
                f"lengths has {len(counts)} entries, the session {self.num_rows} rows",
                argument="lengths",
            )
        keep = []
        for b, length in enumerate(counts):
            extra = length - self.committed[b]
            if not 0 <= extra <= len(self.tokens[b]):
                raise InputError(
                    f"lengths[{b}] = {length}: a row rolls back to between its committed "
                    f"{self.committed[b]} tokens and its {self.committed[b] + len(self.tokens[b])} "
                    "with the provisional ones",
                    argument="lengths",
                    index=(b,),
                    row=b,
                )
            keep.append(list(range(extra)))
        return keep

    def check_rows(self, rows: Any) -> list[int]:
        selected = _token_lists([rows], 1, "rows")[0]
        for i, row in enumerate(selected):
            if not 0 <= row < self.num_rows:
                raise InputError(
                    f"rows[{i}] = {row} is not a row of the session ({self.num_rows} rows)",
                    argument="rows",
                    index=(i,),
                )
        return selected

    def truncate(self, known: list[int]) -> None:
        """Forget every row's provisional tokens past its first ``known[b]`` (a call
        that failed after recording some)."""
        for b, count in enumerate(known):
            del self.tokens[b][count:], self.parents[b][count:], self.depths[b][count:]

    def select(self, rows: list[int]) -> None:
        self.committed = [self.committed[r] for r in rows]
        self.tokens = [list(self.tokens[r]) for r in rows]
        self.parents = [list(self.parents[r]) for r in rows]
        self.depths = [list(self.depths[r]) for r in rows]


def extend_in_chunks(
    run: Callable[[list[list[int]], list[list[int]], list[list[int]], list[int]], Any],
    new: list[list[int]],
    links: list[list[int]],
    depths: list[list[int]],
    wanted: list[int],
    lead: list[int],
    chunk: int,
    ahead: int | None = None,
) -> Any:
    """One ``extend`` of a session on one cache (``HFSession``, ``MLXSession``) as
    forward calls ``run(new, links, depths, wanted)``: each row's first ``lead[b]``
    new tokens (unscored, a chain from its end: a prompt) go ahead in calls of at
    most ``chunk`` tokens per row, scoring nothing; the last call scores. With
    ``ahead``: a lead of at least ``ahead`` tokens in some row goes ahead whole, so
    that the scoring call holds the scored tokens alone (for a model that computes
    its head over every position of a call)."""
    rows = len(new)
    while max(lead, default=0) > chunk or (ahead is not None and max(lead, default=0) >= ahead):
        take = [min(n, chunk) for n in lead]
        run(
            [row[:t] for row, t in zip(new, take, strict=True)],
            [link[:t] for link, t in zip(links, take, strict=True)],
            [d[:t] for d, t in zip(depths, take, strict=True)],
            [0] * rows,
        )
        new = [row[t:] for row, t in zip(new, take, strict=True)]
        links = [link[t:] for link, t in zip(links, take, strict=True)]
        depths = [d[t:] for d, t in zip(depths, take, strict=True)]
        lead = [n - t for n, t in zip(lead, take, strict=True)]
    return run(new, links, depths, wanted)


def scored_order(wanted: list[int], keep: int) -> list[list[int]]:
    """Per row, the indices into a call's last ``keep`` positions that left-align
    its own last ``wanted[b]`` (rows are right-aligned in a call; a row that
    scores nothing reads index 0)."""
    return [[keep - w + min(j, w - 1) if w else 0 for j in range(keep)] for w in wanted]


def _path(tokens: list[int], parents: list[int], index: int) -> list[int]:
    """The provisional tokens from the committed end down to ``index`` (root first)."""
    chain = []
    while index >= 0:
        chain.append(tokens[index])
        index = parents[index]
    return chain[::-1]


class LedgerSession:
    """What the sessions here share: rows and committed counts kept by a
    :class:`Ledger` (``_ledger``), and :meth:`rollback` by :meth:`commit`."""

    _ledger: Ledger

    @property
    def num_rows(self) -> int:
        return self._ledger.num_rows

    @property
    def lengths(self) -> list[int]:
        """Committed tokens per row."""
        return list(self._ledger.committed)

    def commit(self, keep: Any) -> None:
        raise NotImplementedError

    def rollback(self, lengths: Any) -> None:
        """Roll each row back to ``lengths[b]`` tokens (committed and the first provisional ones)."""
        self.commit(self._ledger.chain_keep(lengths))


#: A session on one cache compacts it when holes are more than this share of its
#: columns (and there are at least ``COMPACT_MIN_COLUMNS``).
COMPACT_SHARE = 0.5
COMPACT_MIN_COLUMNS = 32


class ColumnSession(LedgerSession):
    """What the sessions on one key-value cache share (``HFSession``,
    ``MLXSession``; docs/spec.md section 12.2): every row's tokens sit in the
    columns of one key and value array per layer. ``_columns[b]`` are the columns
    of row ``b``'s provisional tokens, in order; ``_valid`` (host booleans
    ``[B, columns]``) marks the columns that hold a row's committed tokens; any
    other column of a row is a hole. This class keeps that bookkeeping (commit,
    row selection, the trailing cut, compaction, the undo of a failed extend);
    a subclass runs the forward calls and changes its arrays through
    :meth:`_cut`, :meth:`_take_rows` and :meth:`_gather`."""

    _columns: list[list[int]]
    _valid: np.ndarray

    def _open(self, rows: int) -> None:
        self._columns = [[] for _ in range(rows)]
        self._valid = np.zeros((rows, 0), dtype=bool)

    @property
    def columns(self) -> int:
        """Columns of the cache (committed, provisional and holes)."""
        return int(self._valid.shape[1])

    # -- the backend's arrays ----------------------------------------------------

    def _cut(self, end: int) -> None:
        """Every layer's keys and values to their first ``end`` columns (those
        with fewer left as they are)."""
        raise NotImplementedError

    def _take_rows(self, rows: list[int]) -> None:
        """Every layer's keys and values to rows ``rows`` (in that order)."""
        raise NotImplementedError

    def _gather(self, order: np.ndarray) -> None:
        """Every layer's keys and values to columns ``order[b]`` of each row
        (``int32 [B, width]``)."""
        raise NotImplementedError

    # -- the bookkeeping ---------------------------------------------------------

    def _book(self, new: list[list[int]], start: int, width: int) -> None:
        """After a forward call of ``width`` right-aligned columns from ``start``:
        each row's new tokens are provisional in its columns, the padding holes."""
        batch = len(new)
        self._valid = np.concatenate([self._valid, np.zeros((batch, width), dtype=bool)], axis=1)
        for b, row in enumerate(new):
            pad = width - len(row)
            self._columns[b] += [start + pad + i for i in range(len(row))]

    def _forget(self, columns: int, known: list[int]) -> None:
        """Back to ``columns`` cache columns and ``known[b]`` provisional tokens per
        row (a failed extend, the chunks that went ahead included)."""
        self._cut(columns)
        self._valid = self._valid[:, :columns]
        self._ledger.truncate(known)
        for b, count in enumerate(known):
            del self._columns[b][count:]

    def commit(self, keep: Any) -> None:
        ledger = self._ledger
        paths = ledger.check_keep(keep)
        for b, path in enumerate(paths):
            self._valid[b, [self._columns[b][i] for i in path]] = True
        ledger.commit(paths)
        self._columns = [[] for _ in paths]
        self._tidy()

    def select(self, rows: Any) -> None:
        selected = self._ledger.check_rows(rows)
        self._take_rows(selected)
        self._valid = self._valid[selected]
        self._ledger.select(selected)
        self._columns = [list(self._columns[r]) for r in selected]
        self._tidy()

    def _tidy(self) -> None:
        """Cut the columns no row uses at the end; compact when holes dominate.
        Only between steps (no provisional token)."""
        if any(self._columns):
            return
        valid = self._valid
        used = np.flatnonzero(valid.any(axis=0))
        end = int(used[-1]) + 1 if used.size else 0
        if end < valid.shape[1]:
            self._cut(end)
            self._valid = valid = valid[:, :end]
        if end < COMPACT_MIN_COLUMNS or not valid.size:
            return
        counts = valid.sum(axis=1)
        if float(counts.sum()) >= (1 - COMPACT_SHARE) * valid.size:
            return
        # Each row's committed columns, in order, gathered to the left.
        width = int(counts.max())
        self._gather(np.argsort(~valid, axis=1, kind="stable")[:, :width].astype(np.int32))
        self._valid = np.arange(width)[None, :] < counts[:, None]


class StatelessSession(LedgerSession):
    """A :class:`LanguageModel` as a :class:`Session`: every call scores whole
    sequences again (no cache). Chains of new tokens are scored with one
    ``next_token_probs`` call per distinct count; trees node by node."""

    scores: Scores = "probs"

    def __init__(self, model: Any, prefixes: Sequence[Sequence[int]], name: str = "model"):
        self.model, self.name = model, name
        self.vocab_size = int(model.vocab_size)
        rows = _token_lists(prefixes, len(prefixes), "prefixes")
        self._sequences = rows
        self._ledger = Ledger([len(r) for r in rows], self.vocab_size)
        self.calls = 0

    def extend(self, tokens: Any, parents: Any = None, *, scored: Any = None) -> np.ndarray:
        """Only the scored tokens are asked for: a row whose scored tokens follow one
        another in one ``next_token_probs(sequences, count)`` call per distinct
        count, the others node by node (``num_positions = 1``)."""
        ledger = self._ledger
        new, links, depths = ledger.check(tokens, parents)
        wanted = ledger.check_scored(scored, new)
        keep = max(wanted, default=0)
        try:
            scores = np.zeros((self.num_rows, keep, self.vocab_size))
        except MemoryError:
            raise MemoryError(
                f"{self.name}.vocab_size: scores [{self.num_rows}, {keep}, {self.vocab_size}] "
                "cannot be allocated"
            ) from None
        chains: dict[int, list[tuple[int, list[int]]]] = {}
        nodes: list[tuple[int, int, list[int]]] = []
        for b, row in enumerate(new):
            if not wanted[b]:
                continue
            every = ledger.tokens[b] + row
            every_link = ledger.parents[b] + links[b]
            last = len(every) - 1
            first = last - wanted[b] + 1
            committed = self._sequences[b]
            if all(every_link[i] == i - 1 for i in range(first + 1, last + 1)):
                chains.setdefault(wanted[b], []).append(
                    (b, committed + _path(every, every_link, last))
                )
            else:
                nodes += [
                    (b, i - first, committed + _path(every, every_link, i))
                    for i in range(first, last + 1)
                ]
        method = f"{self.name}.next_token_probs"
        for count, group in chains.items():
            answer = model_probs(
                self.model.next_token_probs([seq for _, seq in group], count),
                (len(group), count, self.vocab_size),
                method,
            )
            self.calls += 1
            scores[[b for b, _ in group], :count] = answer
        if nodes:
            answer = model_probs(
                self.model.next_token_probs([seq for _, _, seq in nodes], 1),
                (len(nodes), 1, self.vocab_size),
                method,
            )
            self.calls += 1
            for (b, j, _), row in zip(nodes, answer[:, 0], strict=True):
                scores[b, j] = row
        ledger.record(new, links, depths)
        return scores

    def commit(self, keep: Any) -> None:
        ledger = self._ledger
        paths = ledger.check_keep(keep)
        for b, path in enumerate(paths):
            self._sequences[b] += [ledger.tokens[b][i] for i in path]
        ledger.commit(paths)

    def select(self, rows: Any) -> None:
        selected = self._ledger.check_rows(rows)
        self._ledger.select(selected)
        self._sequences = [list(self._sequences[r]) for r in selected]


class TrackedSession:
    """A session in the loop: each row's committed count (``cached``: the start of
    the row's sequence; the rest, at least its last token, is *pending*: fed with
    the next call), and what was fed since the last commit, so that
    :meth:`advance` can keep exactly the fed tokens the new committed sequences
    confirm (docs/spec.md section 12.2). The loop opens sessions empty: a row's
    first call feeds its whole prompt with its first drafts (one forward call,
    as Hugging Face's assisted generation does).

    With ``isolate``, a model call that raises is retried row by row, and the rows
    whose call still raises are returned as errors (their tokens not fed).
    """

    def __init__(self, session: Any, name: str, rows: int, vocab_size: int):
        """``session`` as ``name``'s ``session(prefixes)`` returned it for ``rows``
        empty prefixes, checked: a ``TypeError`` or ``InputError`` naming ``name``."""
        method = f"{name}.session"
        missing = [
            m for m in ("extend", "commit", "select") if not callable(getattr(session, m, None))
        ]
        if missing:
            raise TypeError(
                f"{method} must return a Session (with extend, commit and select), got "
                f"{type(session).__name__}"
            )
        scores = getattr(session, "scores", None)
        if scores not in ("logits", "probs"):
            raise TypeError(f"{method}(...).scores must be 'logits' or 'probs', got {scores!r:.40}")
        count = getattr(session, "num_rows", None)
        if isinstance(count, (bool, np.bool_)) or not isinstance(count, (int, np.integer)):
            raise TypeError(f"{method}(...).num_rows must be an int, got {type(count).__name__}")
        if count != rows:
            raise InputError(
                f"{method} returned a session of {count} rows for {rows} prompts", argument=name
            )
        vocab = getattr(session, "vocab_size", None)
        if vocab != vocab_size or isinstance(vocab, bool):
            raise InputError(
                f"{method} returned a session over {vocab!r:.40} tokens, the model {vocab_size}",
                argument=name,
            )
        self.session, self.name, self.vocab_size = session, name, vocab_size
        self._scores = str(scores)
        self.cached = [0] * rows  # opened empty
        self.fed_tokens: list[list[int]] = [[] for _ in range(rows)]
        self.fed_parents: list[list[int]] = [[] for _ in range(rows)]
        self.forwards = 0

    @property
    def scores(self) -> str:
        return self._scores

    def pending(self, b: int, sequence: list[int]) -> list[int]:
        """The tokens of ``sequence`` the session has not committed (at least the last)."""
        return sequence[self.cached[b] :]

    def extend(
        self,
        tokens: list[list[int]],
        parents: list[list[int]] | None = None,
        *,
        scored: list[int] | None = None,
        isolate: bool = False,
    ) -> tuple[np.ndarray, dict[int, Exception]]:
        """The scores of ``session.extend`` (``[R, S, V]``), checked, and the rows
        that failed."""
        rows, vocab = len(tokens), self.vocab_size
        wanted = [len(t) for t in tokens] if scored is None else scored
        shape = (rows, max(wanted, default=0), vocab)
        method = f"{self.name}.session.extend"
        try:
            scores = model_probs(self.session.extend(tokens, parents, scored=wanted), shape, method)
            self.forwards += 1
            self._record(range(rows), tokens, parents)
            return scores, {}
        except Exception as error:
            if not isolate or rows == 0:
                raise
            first = error
        # Row by row: the others add nothing.
        out: np.ndarray | None = None
        errors: dict[int, Exception] = {}
        for b in range(rows):
            if not tokens[b]:
                continue
            alone = [tokens[b] if r == b else [] for r in range(rows)]
            links = None if parents is None else [parents[b] if r == b else [] for r in range(rows)]
            counts = [wanted[b] if r == b else 0 for r in range(rows)]
            try:
                answer = model_probs(
                    self.session.extend(alone, links, scored=counts),
                    (rows, wanted[b], vocab),
                    method,
                )
            except Exception as error:  # the row's own failure
                errors[b] = error
                continue
            self.forwards += 1
            self._record([b], tokens, parents)
            if out is None:
                out = np.zeros(shape, dtype=answer.dtype)
            out[b, : wanted[b]] = answer[b]
        if len(errors) == sum(1 for t in tokens if t):
            raise first
        assert out is not None
        return out, errors

    def _record(self, rows: Any, tokens: list[list[int]], parents: list[list[int]] | None) -> None:
        for b in rows:
            start = len(self.fed_tokens[b])
            self.fed_tokens[b] += tokens[b]
            self.fed_parents[b] += (
                [start + i - 1 for i in range(len(tokens[b]))]
                if parents is None
                else list(parents[b])
            )

    def advance(self, sequences: list[list[int]], failed: Any = ()) -> None:
        """Commit, per row, the longest fed chain that ``sequences[b]`` (its committed
        sequence after the step) spells after the cached tokens, short of its last
        token; forget the rest. A key and value depend only on the token and what
        precedes it, so those entries are exactly the row's own."""
        keep = []
        for b, seq in enumerate(sequences):
            rest = seq[self.cached[b] :]
            path = (
                []
                if b in failed
                else longest_match(self.fed_tokens[b], self.fed_parents[b], rest, len(rest) - 1)
            )
            keep.append(path)
            self.cached[b] += len(path)
        self.session.commit(keep)
        self.fed_tokens = [[] for _ in sequences]
        self.fed_parents = [[] for _ in sequences]

    def select(self, rows: list[int]) -> None:
        self.session.select(rows)
        self.cached = [self.cached[r] for r in rows]
        self.fed_tokens = [self.fed_tokens[r] for r in rows]
        self.fed_parents = [self.fed_parents[r] for r in rows]


def longest_match(
    tokens: list[int], parents: list[int], sequence: list[int], limit: int
) -> list[int]:
    """The longest chain of fed tokens (``tokens``, ``parents``: provisional
    indices, ``-1`` for the committed end) that spells the start of ``sequence``,
    at most ``limit`` long."""
    path, node = [], -1
    for token in sequence[: max(limit, 0)]:
        child = next(
            (i for i in range(len(tokens)) if parents[i] == node and tokens[i] == token), None
        )
        if child is None:
            break
        path.append(child)
        node = child
    return path
