"""Built-in language models: word n-grams with Witten-Bell smoothing.

Real (if small) language models, so that speculative decoding can be seen end
to end without downloads: :func:`builtin_models` trains a 4-gram target and a
bigram draft on Jane Austen's *Persuasion* (public domain, shipped in
``specaccept/data``; see ``SOURCE.md`` there) in about a second.

Both follow the model protocol of :func:`specaccept.generate`:
``vocab_size`` and ``next_token_probs(sequences, num_positions)``.

Smoothing (Witten-Bell interpolation): with ``c(h, w)`` the count of word ``w``
after context ``h``, ``c(h)`` its total and ``T(h)`` the number of distinct
words seen after it,

    p(w | h) = (c(h, w) + T(h) p(w | h')) / (c(h) + T(h)),

``h'`` being ``h`` without its oldest word, down to an add-``0.01`` unigram, so
every word of the vocabulary keeps a positive probability.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib import resources

import numpy as np

from ._errors import InputError

__all__ = [
    "NGramModel",
    "Vocabulary",
    "builtin_models",
    "builtin_text",
    "drafted_block",
    "drafted_tree",
]

# Words (with an inner apostrophe), numbers, single punctuation marks, and a
# paragraph break, which the models use as their end-of-sequence token.
_TOKEN = re.compile(r"[A-Za-z]+(?:'[A-Za-z]+)?|\d+|\n\s*\n|[^\sA-Za-z\d]")
PARAGRAPH = "\n\n"
UNKNOWN = "<unk>"
_NO_SPACE_BEFORE = set(".,;:!?)'") | {PARAGRAPH}
_NO_SPACE_AFTER = set("(") | {PARAGRAPH}
#: The largest n-gram order: training builds one table per context length.
MAX_ORDER = 64


def builtin_text() -> str:
    """The shipped training text: *Persuasion* by Jane Austen (public domain)."""
    return (resources.files("specaccept") / "data" / "persuasion.txt").read_text("utf-8")


def tokenize(text: str) -> list[str]:
    """Words, numbers, punctuation marks and paragraph breaks, in order."""
    return [PARAGRAPH if t.strip() == "" else t for t in _TOKEN.findall(text)]


@dataclass(frozen=True)
class Vocabulary:
    """Token strings and their ids (id 0 is ``<unk>`` for words never seen)."""

    tokens: tuple[str, ...]

    @classmethod
    def from_tokens(cls, tokens: Iterable[str]) -> Vocabulary:
        seen = dict.fromkeys([UNKNOWN, PARAGRAPH])
        seen.update(dict.fromkeys(tokens))
        return cls(tuple(seen))

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def _ids(self) -> dict[str, int]:
        ids = self.__dict__.get("_id_map")
        if ids is None:
            ids = {t: i for i, t in enumerate(self.tokens)}
            object.__setattr__(self, "_id_map", ids)
        return ids

    @property
    def paragraph_id(self) -> int:
        """The id of the paragraph break, the built-in models' end of sequence."""
        return self._ids[PARAGRAPH]

    def encode(self, text: str) -> list[int]:
        """``text`` as token ids (unknown words map to ``<unk>``)."""
        ids = self._ids
        return [ids.get(t, 0) for t in tokenize(text)]

    def decode(self, ids: Iterable[int]) -> str:
        """Token ids back to text, with the usual spacing around punctuation."""
        out: list[str] = []
        quote_open = False  # straight quotes alternate: opening, then closing
        for n, i in enumerate(ids):
            if isinstance(i, (bool, np.bool_)) or not isinstance(i, (int, np.integer)):
                raise TypeError(f"ids[{n}] must be an int token id, got {type(i).__name__}")
            if not 0 <= i < len(self.tokens):
                raise InputError(
                    f"ids[{n}] = {i} is outside [0, V) with V = {len(self.tokens)}",
                    argument="ids",
                    index=(n,),
                )
            token = self.tokens[int(i)]
            closing = token == '"' and quote_open
            after_opening = bool(out) and out[-1] == '"' and quote_open
            space = (
                out
                and token not in _NO_SPACE_BEFORE
                and out[-1] not in _NO_SPACE_AFTER
                and not closing
                and not after_opening
            )
            if space:
                out.append(" ")
            if token == '"':
                quote_open = not quote_open
            out.append(token)
        return "".join(out)


class NGramModel:
    """A word n-gram language model with Witten-Bell interpolation.

    Parameters
    ----------
    order : int
        ``n``: the model conditions on the last ``n - 1`` tokens (1 = unigram; at
        most ``MAX_ORDER = 64``).
    token_ids : sequence of int
        The training text as ids of ``vocabulary``.
    vocabulary : Vocabulary

    Examples
    --------
    >>> from specaccept.ngram import NGramModel, Vocabulary, tokenize
    >>> words = tokenize("the cat sat. the cat ran. the dog sat.")
    >>> vocab = Vocabulary.from_tokens(words)
    >>> model = NGramModel(2, vocab.encode("the cat sat. the cat ran. the dog sat."), vocab)
    >>> p = model.next_token_probs([vocab.encode("the")], 1)[0, 0]
    >>> vocab.tokens[int(p.argmax())], round(float(p.sum()), 12)
    ('cat', 1.0)
    """

    def __init__(self, order: int, token_ids: Sequence[int], vocabulary: Vocabulary):
        if isinstance(order, (bool, np.bool_)) or not isinstance(order, (int, np.integer)):
            raise TypeError(f"order must be an int, got {type(order).__name__}")
        if order < 1:
            raise InputError(f"order must be at least 1, got {order}", argument="order")
        if order > MAX_ORDER:
            raise InputError(
                f"order must be at most {MAX_ORDER}, got {order} (a table per context length: "
                "time and memory grow with it)",
                argument="order",
            )
        if not isinstance(vocabulary, Vocabulary):
            raise TypeError(f"vocabulary must be a Vocabulary, got {type(vocabulary).__name__}")
        self.order = int(order)
        self.vocabulary = vocabulary
        self.vocab_size = len(vocabulary)
        ids = np.asarray(token_ids)
        if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
            raise TypeError(
                f"token_ids must be a sequence of int token ids, got {ids.dtype} of shape "
                f"{ids.shape}"
            )
        bad = np.flatnonzero((ids < 0) | (ids >= self.vocab_size))
        if bad.size:
            i = int(bad[0])
            raise InputError(
                f"token_ids[{i}] = {ids[i]} is outside [0, V) with V = {self.vocab_size}",
                argument="token_ids",
                index=(i,),
            )
        ids = ids.astype(np.int64)
        counts = np.bincount(ids, minlength=self.vocab_size).astype(np.float64)
        self._unigram = (counts + 0.01) / (counts.sum() + 0.01 * self.vocab_size)
        # For each context length m = 1 .. order-1: context -> (next ids, counts).
        self._tables: list[dict[tuple[int, ...], tuple[np.ndarray, np.ndarray]]] = []
        self._cache: dict[tuple[int, ...], np.ndarray] = {}
        seq = ids.tolist()
        # Contexts longer than the text never occur: no tables past it.
        for m in range(1, min(self.order, len(seq) + 1)):
            following: dict[tuple[int, ...], Counter[int]] = defaultdict(Counter)
            for i in range(m, len(seq)):
                following[tuple(seq[i - m : i])][seq[i]] += 1
            self._tables.append(
                {
                    h: (
                        np.fromiter(c.keys(), dtype=np.int64, count=len(c)),
                        np.fromiter(c.values(), dtype=np.float64, count=len(c)),
                    )
                    for h, c in following.items()
                }
            )

    def distribution(self, context: Sequence[int]) -> np.ndarray:
        """``p(. | context)`` over the vocabulary (float64, sums to 1; read-only: it
        may be shared with later calls on the same context)."""
        # Only the last order - 1 tokens matter; recent contexts are remembered.
        key = tuple(context[max(0, len(context) - self.order + 1) :])
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        p = self._compute(key)
        p.flags.writeable = False
        if len(self._cache) >= 256:
            self._cache.pop(next(iter(self._cache)))  # the oldest entry
        self._cache[key] = p
        return p

    def _compute(self, context: tuple[int, ...]) -> np.ndarray:
        p = self._unigram.copy()
        for m, table in enumerate(self._tables, start=1):
            if len(context) < m:
                break
            seen = table.get(tuple(context[len(context) - m :]))
            if seen is None:
                continue  # an unseen context adds nothing beyond the shorter one
            ids, counts = seen
            total, types = counts.sum(), len(ids)
            p *= types / (total + types)
            p[ids] += counts / (total + types)
        return p

    def next_token_probs(
        self, sequences: Sequence[Sequence[int]], num_positions: int
    ) -> np.ndarray:
        """The protocol of :func:`specaccept.generate`: ``[B, num_positions, V]``, entry
        ``[b, j]`` the distribution of the token after
        ``sequences[b][: len(sequences[b]) - num_positions + 1 + j]``."""
        if isinstance(num_positions, (bool, np.bool_)) or not isinstance(
            num_positions, (int, np.integer)
        ):
            raise TypeError(f"num_positions must be an int, got {type(num_positions).__name__}")
        if num_positions < 0:
            raise InputError(
                f"num_positions must be >= 0, got {num_positions}", argument="num_positions"
            )
        rows = [list(seq) for seq in sequences]
        for b, seq in enumerate(rows):  # every row checked before the output is allocated
            if len(seq) - num_positions + 1 < 0:
                raise InputError(
                    f"sequences[{b}] has {len(seq)} tokens, fewer than num_positions - 1 = "
                    f"{num_positions - 1}",
                    argument="sequences",
                    row=b,
                )
        out = np.empty((len(rows), int(num_positions), self.vocab_size))
        for b, seq in enumerate(rows):
            first = len(seq) - num_positions + 1
            for j in range(num_positions):
                out[b, j] = self.distribution(seq[: first + j])
        return out


def builtin_models(
    target_order: int = 4, draft_order: int = 2
) -> tuple[NGramModel, NGramModel, Vocabulary]:
    """A target and a draft n-gram model trained on the shipped text, and their vocabulary.

    Examples
    --------
    >>> from specaccept.ngram import builtin_models
    >>> target, draft, vocab = builtin_models()
    >>> target.vocab_size == draft.vocab_size == len(vocab)
    True
    """
    text = builtin_text()
    words = tokenize(text)
    vocab = Vocabulary.from_tokens(words)
    ids = vocab.encode(text)
    return NGramModel(target_order, ids, vocab), NGramModel(draft_order, ids, vocab), vocab


def drafted_block(
    target: NGramModel,
    draft: NGramModel,
    context: Sequence[int],
    k: int,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``k`` tokens sampled from ``draft`` after ``context``, with the rows a verifier
    reads: ``(draft_token_ids [1, k], target_probs [1, k+1, V], draft_probs [1, k, V])``.

    Examples
    --------
    >>> import numpy as np
    >>> from specaccept.ngram import builtin_models, drafted_block
    >>> target, draft, vocab = builtin_models()
    >>> ids, p, q = drafted_block(target, draft, vocab.encode("It was"), 3, np.random.default_rng(0))
    >>> ids.shape, p.shape[:2], q.shape[:2]
    ((1, 3), (1, 4), (1, 3))
    """
    drafts: list[int] = []
    for _ in range(k):
        row = draft.distribution([*context, *drafts])
        drafts.append(int(rng.choice(len(row), p=row / row.sum())))
    sequence = [*context, *drafts]
    target_probs = target.next_token_probs([sequence], k + 1)
    draft_probs = draft.next_token_probs([sequence[:-1]], k)
    return np.array([drafts], dtype=np.int64), target_probs, draft_probs


def drafted_tree(
    target: NGramModel,
    draft: NGramModel,
    context: Sequence[int],
    parent_ids: Sequence[int],
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A tree of the shape ``parent_ids`` (parents before children) sampled from
    ``draft`` after ``context``, siblings without replacement, with the rows
    ``verify_tree`` reads: ``(node_token_ids [1, N], target_probs [1, N, V],
    draft_probs [1, N, V])``, row ``c`` of the draft rows the law child ``c`` was
    drawn from (the parent's, earlier siblings removed and renormalised).

    Examples
    --------
    >>> import numpy as np
    >>> from specaccept.ngram import builtin_models, drafted_tree
    >>> target, draft, vocab = builtin_models()
    >>> ids, p, q = drafted_tree(target, draft, vocab.encode("It was"), [-1, 0, 0, 1],
    ...                          np.random.default_rng(0))
    >>> ids.shape, p.shape[:2], bool(ids[0, 1] != ids[0, 2])
    ((1, 4), (1, 4), True)
    """
    nodes = len(parent_ids)
    vocab = target.vocab_size
    prefixes: list[list[int]] = [list(context)]
    ids = np.zeros((1, nodes), dtype=np.int64)
    draft_probs = np.zeros((1, nodes, vocab))
    for node in range(1, nodes):
        parent = int(parent_ids[node])
        if not 0 <= parent < node:
            raise InputError(
                f"parent_ids[{node}] = {parent}: a parent must be an earlier node",
                argument="parent_ids",
                index=(node,),
            )
        law = draft.distribution(prefixes[parent]).astype(np.float64)
        for sibling in range(1, node):
            if int(parent_ids[sibling]) == parent:
                law[int(ids[0, sibling])] = 0.0
        if law.sum() <= 0:
            raise InputError(
                f"parent_ids: node {parent} has more children than the draft has tokens",
                argument="parent_ids",
            )
        law /= law.sum()
        draft_probs[0, node] = law
        ids[0, node] = int(rng.choice(vocab, p=law))
        prefixes.append([*prefixes[parent], int(ids[0, node])])
    target_probs = np.array([[target.distribution(prefix) for prefix in prefixes]])
    return ids, target_probs, draft_probs
