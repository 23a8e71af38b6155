"""Small random Llama models for the generation tests (no downloads).

In float64 a row's logits in a batch and alone agree to about 1e-15, so greedy
outputs agree token for token and any mismatch is a bug, not rounding.
:func:`halves` wraps a model so that every next-token distribution is made of
halves (each token 0, 1/2 or 1): the law tests can then enumerate the uniforms
exactly (every threshold the verifiers compare a uniform with is a small
fraction).
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import torch
import transformers


def llama(
    seed: int,
    layers: int = 2,
    vocab: int = 64,
    dtype=torch.float64,
    positions: int = 512,
    eos: int | None = None,
) -> transformers.LlamaForCausalLM:
    """A random Llama (hidden 32, 4 heads, 2 key-value heads) in ``dtype``."""
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=positions,
        eos_token_id=eos,
        bos_token_id=None,
        pad_token_id=None,
    )
    model = transformers.LlamaForCausalLM(config).to(dtype).eval()
    # Larger weights than the default initialisation: sharper, more varied rows.
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.ndim == 2:
                parameter.mul_(6.0)
    return model


def hf_greedy(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    """``model.generate(do_sample=False)`` on one row alone (batch 1)."""
    ids = torch.tensor([prompt])
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        max_new_tokens=max_new_tokens,
    )
    return out[0, len(prompt) :].tolist()


def full_logits(model, sequence: list[int]) -> np.ndarray:
    """The logits after every prefix of ``sequence``, in one uncached forward call."""
    with torch.no_grad():
        return model(input_ids=torch.tensor([sequence])).logits[0].double().numpy()


class Halves(transformers.LlamaForCausalLM):
    """A Llama whose logits are ``log`` of a distribution in halves: the two most
    likely tokens get 1/2 each, or the most likely one gets 1 when it has more
    than 3/4 (``-inf`` for the rest). ``exp(l - max l)`` is then exactly 1 or 0."""

    def forward(self, *args, **kwargs):
        output = super().forward(*args, **kwargs)
        output.logits = halves_logits(output.logits)
        return output


def halves_logits(logits: torch.Tensor) -> torch.Tensor:
    probs = torch.softmax(logits.double(), dim=-1)
    top2, index = probs.topk(2, dim=-1)
    out = torch.full_like(logits, -torch.inf)
    single = top2[..., 0] > 0.75
    half = torch.tensor(np.log(0.5), dtype=logits.dtype)
    first = torch.where(single, torch.zeros((), dtype=logits.dtype), half)
    out.scatter_(-1, index[..., :1], first[..., None])
    second = torch.where(single, torch.full((), -torch.inf, dtype=logits.dtype), half)
    out.scatter_(-1, index[..., 1:2], second[..., None])
    return out


def halves(seed: int, vocab: int = 4, layers: int = 2) -> Halves:
    base = llama(seed, layers=layers, vocab=vocab)
    model = Halves(base.config).to(torch.float64).eval()
    model.load_state_dict(base.state_dict())
    return model


def law(model: Halves, prefix: list[int]) -> list[Fraction]:
    """The exact next-token distribution of a :class:`Halves` model after ``prefix``."""
    row = full_logits(model, prefix)[-1]
    return [Fraction(0) if v == -np.inf else Fraction(1, 2) if v < 0 else Fraction(1) for v in row]
