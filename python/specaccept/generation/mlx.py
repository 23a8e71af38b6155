"""MLX-LM models (Apple Silicon's engine; MLX's CPU build elsewhere), with key-value caches.

:class:`MLXModel` wraps an ``mlx_lm`` model you already have (``mlx_lm.load``, or
one built from its ``ModelArgs``) and opens :class:`MLXSession` objects: a batch of
rows on one cache per layer, each row with its own length. Needs ``mlx`` and
``mlx-lm`` (``pip install 'specaccept[mlx]'``); written for mlx-lm 0.32
(:data:`MLX_LM_VERSIONS`).

How rows of different lengths stay exact is :mod:`specaccept.generation.hf`'s
way (docs/spec.md sections 12.2 and 12.9): every row's tokens sit in the columns of one
key and value array per layer; a column is *committed* to a row, *provisional*
(a draft under test) or a *hole* (padding, a rejected draft). Each forward call
hands the model's attention a boolean mask ``[B, 1, new, columns]``: a new token
attends to its row's committed columns, its provisional ancestors and itself,
nothing else. mlx-lm's models take their positions from the cache (one rotary
offset per row), so a row's new tokens are a chain: its position is the row's
committed length plus its depth. Tree drafts (tokens side by side at one depth)
are refused: mlx-lm's attention layers take no position per token. Holes are
never attended to; the trailing ones are cut after each commit, and the cache is
compacted (each row's committed columns gathered to the left) when holes are
more than half of it.

Examples
--------
A sketch with a model on disk (not run here)::

    import mlx_lm
    import specaccept
    from specaccept.generation.mlx import MLXModel

    model, tokenizer = mlx_lm.load("path/to/model")
    target = MLXModel(model, tokenizer)
    out = specaccept.generate(target, specaccept.PromptLookup(), [target.encode("Hello")],
                              k=4, max_new_tokens=32, eos_token_id=tokenizer.eos_token_id)
    print(target.decode(out.tokens[0]))
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .._errors import InputError
from ._session import (
    ColumnSession,
    Ledger,
    Scores,
    _token_lists,
    extend_in_chunks,
    scored_order,
)

__all__ = ["MLX_LM_VERSIONS", "MLXModel", "MLXSession"]

#: The mlx-lm versions this adapter was written for and is tested with.
MLX_LM_VERSIONS = ("0.32",)
#: Unscored chain tokens (a prompt) per forward call.
_PREFILL_CHUNK = 256
#: A row's unscored lead of at least this many tokens goes ahead of the scoring
#: call: mlx-lm's models compute their head (``[tokens, V]``, a fifth of
#: SmolLM2-135M's work per token) over every position of a call, so a prompt's
#: scoring call would pay it for every prompt token. Shorter leads (a drafter
#: catching up one or two tokens) stay in the call: a call costs more than that.
_AHEAD = 8


def _mlx() -> Any:
    import mlx.core as mx

    return mx


class MLXModel:
    """An mlx-lm causal LM as a :class:`~specaccept.generation.SessionModel`
    (key-value cached sessions, logits).

    Parameters
    ----------
    model : mlx.nn.Module
        An mlx-lm model (``model(inputs, cache=...)`` returns logits ``[B, L,
        V]``, ``model.layers`` its decoder layers), every layer full attention
        (mlx-lm's ``KVCache``): sliding-window, state-space and hybrid layers,
        whose caches cannot be rolled back by columns, are refused.
    tokenizer : optional
        Only for :meth:`encode` and :meth:`decode` (mlx-lm's ``TokenizerWrapper``
        or a ``transformers`` tokenizer).
    vocab_size : int, optional
        The logits' last dimension, where the model's ``args`` do not say it.
    process : callable, optional
        Applied to the scored logits (an ``mx.array [B, S, V]``) before the
        verifier reads them: what the sampler draws from where it is not
        temperature, top-k, top-p and min-p in specaccept's order (mlx-lm's own
        filters, :mod:`specaccept.compat.mlx_lm`). ``None``: the model's logits.
    prefill : int
        Unscored tokens (a prompt) per forward call, at most (default 256).

    Attributes
    ----------
    vocab_size : int
        The logits' last dimension.
    max_length : int or None
        The model's position limit (``max_position_embeddings``), where it says.
    forwards, positions : int
        Forward calls made by this model's sessions, and the token positions they
        processed (``rows x new tokens`` per call, padding included).
    """

    scores: Scores = "logits"

    def __init__(
        self,
        model: Any,
        tokenizer: Any = None,
        *,
        vocab_size: int | None = None,
        process: Callable[[Any], Any] | None = None,
        prefill: int = _PREFILL_CHUNK,
    ):
        from mlx_lm.models.cache import KVCache

        if not callable(model) or not hasattr(model, "layers"):
            raise TypeError(
                f"model must be an mlx-lm model (callable, with .layers), got {type(model).__name__}"
            )
        make_cache = getattr(model, "make_cache", None)
        if callable(make_cache):
            kinds = sorted({type(c).__name__ for c in make_cache() if type(c) is not KVCache})
            if kinds:
                raise InputError(
                    f"model's layers use {', '.join(kinds)}: MLXModel's sessions roll a cache "
                    "back by columns, which only full attention layers (KVCache) allow",
                    argument="model",
                )
        if tokenizer is not None and not (
            callable(getattr(tokenizer, "encode", None))
            and callable(getattr(tokenizer, "decode", None))
        ):
            raise TypeError(
                f"tokenizer must be None or have encode and decode, got {type(tokenizer).__name__}"
            )
        args = getattr(model, "args", None)
        if vocab_size is None:
            vocab_size = getattr(args, "vocab_size", None)
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1:
            raise InputError(
                "vocab_size: the model's args do not say it; pass vocab_size=",
                argument="vocab_size",
            )
        if process is not None and not callable(process):
            raise TypeError(f"process must be callable or None, got {type(process).__name__}")
        if isinstance(prefill, (bool, np.bool_)) or not isinstance(prefill, (int, np.integer)):
            raise TypeError(f"prefill must be an int, got {type(prefill).__name__}")
        if prefill < 1:
            raise InputError(f"prefill must be >= 1, got {prefill}", argument="prefill")
        self.prefill = int(prefill)
        limit = getattr(args, "max_position_embeddings", None)
        self.model = model
        self.process = process
        self.tokenizer = tokenizer
        self.vocab_size = int(vocab_size)
        self.max_length = limit if isinstance(limit, int) and limit > 0 else None
        self.forwards = 0
        self.positions = 0

    @property
    def num_layers(self) -> int:
        return len(self.model.layers)

    def early_exit(self, num_layers: int) -> MLXModel:
        """A draft made of this model's first ``num_layers`` decoder layers, its final
        norm and its output head, sharing their weights (no copy). Needs a model
        whose decoder layers are ``model.model.layers`` (mlx-lm's Llama, Mistral,
        Qwen and the like)."""
        if isinstance(num_layers, (bool, np.bool_)) or not isinstance(
            num_layers, (int, np.integer)
        ):
            raise TypeError(f"num_layers must be an int, got {type(num_layers).__name__}")
        inner: Any = getattr(self.model, "model", None)
        layers = getattr(inner, "layers", None)
        if not isinstance(layers, list):
            raise InputError(
                "early_exit needs a model whose decoder layers are model.model.layers",
                argument="model",
            )
        if not 1 <= num_layers <= len(layers):
            raise InputError(
                f"num_layers must lie in [1, {len(layers)}], got {num_layers}",
                argument="num_layers",
            )
        shallow_inner = copy.copy(inner)
        shallow_inner.layers = list(layers[: int(num_layers)])
        shallow = copy.copy(self.model)
        shallow.model = shallow_inner
        return MLXModel(
            shallow,
            self.tokenizer,
            vocab_size=self.vocab_size,
            process=self.process,
            prefill=self.prefill,
        )

    def with_process(self, process: Callable[[Any], Any] | None) -> MLXModel:
        """The same model (the same weights) whose sessions apply ``process``."""
        return MLXModel(
            self.model,
            self.tokenizer,
            vocab_size=self.vocab_size,
            process=process,
            prefill=self.prefill,
        )

    def session(self, prefixes: Sequence[Sequence[int]]) -> MLXSession:
        return MLXSession(self, prefixes)

    def encode(self, text: str) -> list[int]:
        if self.tokenizer is None:
            raise InputError("MLXModel.encode needs a tokenizer", argument="tokenizer")
        return [int(t) for t in self.tokenizer.encode(text)]

    def decode(self, ids: Sequence[int]) -> str:
        if self.tokenizer is None:
            raise InputError("MLXModel.decode needs a tokenizer", argument="tokenizer")
        return str(self.tokenizer.decode(list(ids)))


class _Columns:
    """One layer's keys and values ``[B, heads, columns, dim]``, as mlx-lm's
    attention layers call a cache: ``offset`` (each row's rotary position of the
    call's first column), ``update_and_fetch`` (the call's keys and values
    appended) and ``make_mask`` (the call's mask, set by the session)."""

    def __init__(self) -> None:
        self.keys: Any = None
        self.values: Any = None
        self.offset: Any = 0
        self.mask: Any = None

    def update_and_fetch(self, keys: Any, values: Any) -> tuple[Any, Any]:
        mx = _mlx()
        if self.keys is None:
            self.keys, self.values = keys, values
        else:
            self.keys = mx.concatenate([self.keys, keys], axis=2)
            self.values = mx.concatenate([self.values, values], axis=2)
        return self.keys, self.values

    def make_mask(self, n: int, **kwargs: Any) -> Any:
        return self.mask

    @property
    def state(self) -> tuple[Any, Any]:
        return self.keys, self.values

    def is_trimmable(self) -> bool:
        return False

    def columns(self) -> int:
        return 0 if self.keys is None else int(self.keys.shape[2])

    def apply(self, change: Any) -> None:
        if self.keys is not None:
            self.keys, self.values = change(self.keys), change(self.values)


class MLXSession(ColumnSession):
    """Rows of token sequences on one cache per layer of an mlx-lm model (see the
    module's docstring); a :class:`~specaccept.generation.Session`. Open one with
    :meth:`MLXModel.session`."""

    scores: Scores = "logits"

    def __init__(self, model: MLXModel, prefixes: Sequence[Sequence[int]]):
        self.owner = model
        self.vocab_size = model.vocab_size
        rows = _token_lists(prefixes, len(prefixes), "prefixes")
        self._ledger = Ledger([0] * len(rows), self.vocab_size, model.max_length)
        self._open(len(rows))
        self._caches = [_Columns() for _ in range(model.num_layers)]
        if any(rows):
            self.extend(rows, scored=[0] * len(rows))
            self.commit([list(range(len(r))) for r in rows])

    def extend(self, tokens: Any, parents: Any = None, *, scored: Any = None) -> np.ndarray:
        """See :meth:`specaccept.generation.Session.extend`; each row's new tokens a
        chain from its last provisional token (or its committed end). Long chains
        of unscored tokens (a prompt) are sent in calls of at most ``prefill``."""
        ledger = self._ledger
        new, links, depths = ledger.check(tokens, parents)
        for b, link in enumerate(links):
            have = len(ledger.tokens[b])
            for i, parent in enumerate(link):
                if parent != have + i - 1:
                    raise InputError(
                        f"parents[{b}][{i}] = {parent}: MLXSession takes chains (each new token "
                        "the child of the one before it): mlx-lm's attention takes one position "
                        "offset per row, so tree drafts cannot be scored",
                        argument="parents",
                        index=(b, i),
                        row=b,
                    )
        wanted = ledger.check_scored(scored, new)
        lead = [len(row) - w for row, w in zip(new, wanted, strict=True)]
        columns, known = self.columns, [len(t) for t in ledger.tokens]
        try:
            return extend_in_chunks(
                self._run, new, links, depths, wanted, lead, self.owner.prefill, _AHEAD
            )
        except BaseException:
            self._forget(columns, known)  # the chunks that went ahead, too
            raise

    def _cut(self, end: int) -> None:
        for cache in self._caches:
            cache.apply(lambda t: t[:, :, :end] if t.shape[2] > end else t)
            cache.mask = None  # (a failed call's)

    def _take_rows(self, rows: list[int]) -> None:
        index = _mlx().array(np.asarray(rows, dtype=np.int32))
        for cache in self._caches:
            cache.apply(lambda t: t[index])

    def _gather(self, order: np.ndarray) -> None:
        mx = _mlx()
        index = mx.array(order)[:, None, :, None]
        for cache in self._caches:
            cache.apply(lambda t: mx.take_along_axis(t, index, axis=2))

    def _run(
        self,
        new: list[list[int]],
        links: list[list[int]],
        depths: list[list[int]],
        wanted: list[int],
    ) -> np.ndarray:
        """One forward call over checked new tokens, right-aligned (row ``b``'s in the
        last ``len(new[b])`` columns, padding before them): the logits of each row's
        last ``wanted[b]`` tokens, ``[B, max(wanted), V]``, left-aligned."""
        mx = _mlx()
        ledger = self._ledger
        batch, width = self.num_rows, max((len(r) for r in new), default=0)
        keep = max(wanted, default=0)
        if width == 0:
            return np.zeros((batch, 0, self.vocab_size), dtype=np.float32)
        start = self.columns
        ids = np.zeros((batch, width), dtype=np.int32)
        # Each row's rotary offset: the position of the call's first column, so
        # that its first new token sits at its committed length plus its depth.
        offsets = np.zeros(batch, dtype=np.int32)
        for b, row in enumerate(new):
            pad = width - len(row)
            if row:
                ids[b, pad:] = row
                offsets[b] = ledger.committed[b] + depths[b][0] - pad
        mask, offset = self._mask(new, width), mx.array(offsets)
        for cache in self._caches:
            cache.offset, cache.mask = offset, mask
        # A failure here (even after some layers appended) is undone by extend.
        logits = self.owner.model(mx.array(ids), cache=self._caches)
        self.owner.forwards += 1
        self.owner.positions += batch * width
        if any(c.columns() != start + width for c in self._caches):
            raise TypeError(
                "the model did not append its new keys and values to the caches it was given: "
                "MLXModel needs an mlx-lm model whose attention calls cache.update_and_fetch"
            )
        for cache in self._caches:
            cache.mask = None
        self._book(new, start, width)
        ledger.record(new, links, depths)
        if keep == 0:
            return np.zeros((batch, 0, self.vocab_size), dtype=np.float32)
        last = logits[:, -keep:]
        if any(w != keep for w in wanted):
            # Left-align each row's scored tokens (the last ones of the call).
            order = np.array(scored_order(wanted, keep), dtype=np.int32)
            last = mx.take_along_axis(last, mx.array(order)[:, :, None], axis=1)
        if last.dtype != mx.float32:
            last = last.astype(mx.float32)
        if self.owner.process is not None:
            last = self.owner.process(last)
        return np.asarray(last)

    def _mask(self, new: list[list[int]], width: int) -> Any:
        """The boolean attention mask ``[B, 1, width, columns + width]`` of a call: a
        new token attends to its row's committed columns, its provisional tokens
        (its ancestors: the row is a chain) and the row's new tokens up to itself;
        a padding query to itself only."""
        mx = _mlx()
        batch, start = self.num_rows, self.columns
        allowed = np.zeros((batch, width, start + width), dtype=bool)
        allowed[:, :, :start] = self._valid[:, None, :]
        ends = np.arange(width)
        allowed[:, ends, start + ends] = True  # every query (padding too) sees itself
        lower = np.tril(np.ones((width, width), dtype=bool))
        for b, row in enumerate(new):
            pad = width - len(row)
            if self._columns[b]:
                allowed[b, pad:, self._columns[b]] = True
            allowed[b, pad:, start + pad :] = lower[pad:, pad:]
        return mx.array(allowed[:, None])
