"""Hugging Face ``transformers`` causal language models as :func:`specaccept.generate` models.

Needs ``torch`` and ``transformers`` (``pip install 'specaccept[hf]'``); nothing
is downloaded here: wrap a model (and tokenizer) you already have.

Examples
--------
A sketch with models on disk (not run here)::

    from transformers import AutoModelForCausalLM, AutoTokenizer
    import specaccept
    from specaccept.hf import HFModel

    tokenizer = AutoTokenizer.from_pretrained("path/to/target")
    target = HFModel(AutoModelForCausalLM.from_pretrained("path/to/target"), tokenizer)
    draft = HFModel(AutoModelForCausalLM.from_pretrained("path/to/draft"), tokenizer)
    out = specaccept.generate(target, draft, [target.encode("The capital of France is")],
                              k=4, max_new_tokens=32, eos_token_id=tokenizer.eos_token_id)
    print(target.decode(out.tokens[0]), out.stats.mean_emitted_tokens)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ._errors import InputError

__all__ = ["HFModel"]


class HFModel:
    """A causal LM (``model(input_ids, attention_mask).logits``) in the model protocol.

    Parameters
    ----------
    model : transformers.PreTrainedModel
        Any causal language model; put in eval mode, run without gradients.
    tokenizer : transformers tokenizer, optional
        Only for :meth:`encode` and :meth:`decode`.
    temperature : float
        Logits are divided by it before the softmax (the distribution sampled from).

    Each call runs the model once on the batch, right-padded with an attention
    mask, and returns the softmax at the requested positions as float32 NumPy.
    No key-value cache is kept between calls: simple, and right for small models
    and tests; a serving engine keeps its own caches and calls
    :func:`specaccept.verify` directly.
    """

    def __init__(self, model: Any, tokenizer: Any = None, *, temperature: float = 1.0):
        import torch  # noqa: F401  (fail early, with the real error, if torch is missing)

        if isinstance(temperature, (bool, np.bool_)) or not isinstance(
            temperature, (int, float, np.integer, np.floating)
        ):
            raise TypeError(f"temperature must be a number, got {type(temperature).__name__}")
        if not (temperature > 0 and math.isfinite(temperature)):
            raise InputError(f"temperature must be > 0, got {temperature}", argument="temperature")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.temperature = float(temperature)
        embeddings = model.get_output_embeddings()
        self.vocab_size = int(
            embeddings.weight.shape[0] if embeddings is not None else model.config.vocab_size
        )

    def next_token_probs(
        self, sequences: Sequence[Sequence[int]], num_positions: int
    ) -> np.ndarray:
        """``[B, num_positions, V]``: the distributions after each of the last
        ``num_positions`` prefixes of every sequence (see :class:`specaccept.LanguageModel`)."""
        import torch

        if isinstance(num_positions, (bool, np.bool_)) or not isinstance(
            num_positions, (int, np.integer)
        ):
            raise TypeError(f"num_positions must be an int, got {type(num_positions).__name__}")
        if num_positions < 1:
            raise InputError(
                f"num_positions must be >= 1, got {num_positions}", argument="num_positions"
            )
        lengths = [len(s) for s in sequences]
        for b, n in enumerate(lengths):
            if n < num_positions:
                raise InputError(
                    f"sequences[{b}] has {n} tokens; scoring {num_positions} positions needs "
                    "at least as many",
                    argument="sequences",
                    row=b,
                )
        batch, width = len(sequences), max(lengths, default=0)
        device = next(self.model.parameters()).device
        input_ids = torch.zeros((batch, width), dtype=torch.long)
        attention_mask = torch.zeros((batch, width), dtype=torch.long)
        for b, seq in enumerate(sequences):
            input_ids[b, : len(seq)] = torch.as_tensor(list(seq), dtype=torch.long)
            attention_mask[b, : len(seq)] = 1
        with torch.no_grad():
            logits = self.model(
                input_ids=input_ids.to(device), attention_mask=attention_mask.to(device)
            ).logits
        # The logits at position i score the token after the prefix of length i + 1.
        index = torch.tensor(
            [[n - num_positions + j for j in range(num_positions)] for n in lengths],
            dtype=torch.long,
            device=logits.device,
        )
        rows = torch.arange(batch, device=logits.device)[:, None]
        probs = torch.softmax(logits[rows, index].float() / self.temperature, dim=-1)
        return probs.cpu().numpy()

    def encode(self, text: str) -> list[int]:
        """``text`` as token ids (needs the tokenizer)."""
        if self.tokenizer is None:
            raise InputError("HFModel.encode needs a tokenizer", argument="tokenizer")
        return list(self.tokenizer.encode(text))

    def decode(self, ids: Sequence[int]) -> str:
        """Token ids as text (needs the tokenizer)."""
        if self.tokenizer is None:
            raise InputError("HFModel.decode needs a tokenizer", argument="tokenizer")
        return self.tokenizer.decode(list(ids))
