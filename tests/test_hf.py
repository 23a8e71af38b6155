"""The Hugging Face adapter on tiny randomly initialised models (no downloads)."""

from __future__ import annotations

import numpy as np
import pytest
import specaccept

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from specaccept.generation.hf import HFModel  # noqa: E402


def tiny(seed: int, layers: int) -> HFModel:
    torch.manual_seed(seed)
    config = transformers.GPT2Config(
        vocab_size=40, n_positions=64, n_embd=16, n_layer=layers, n_head=2
    )
    return HFModel(transformers.GPT2LMHeadModel(config))


def test_probs_of_a_padded_batch_equal_each_sequence_alone():
    model = tiny(0, 2)
    sequences = [[1, 2, 3, 4, 5], [7, 8, 9], [3, 3, 3, 3, 3, 3, 3]]
    batched = model.next_token_probs(sequences, 3)
    assert batched.shape == (3, 3, 40)
    np.testing.assert_allclose(batched.sum(-1), 1.0, rtol=1e-5)
    for b, seq in enumerate(sequences):
        with torch.no_grad():
            logits = model.model(input_ids=torch.tensor([seq])).logits[0]
        alone = torch.softmax(logits[-3:].float(), -1).numpy()
        np.testing.assert_allclose(batched[b], alone, rtol=1e-4, atol=1e-6)


def test_greedy_generation_through_the_adapter_equals_plain_greedy():
    target, draft = tiny(1, 2), tiny(2, 1)
    prompts = [[5, 6, 7], [1, 2]]
    out = specaccept.generate(target, draft, prompts, k=3, max_new_tokens=10, greedy=True)
    for prompt, tokens in zip(prompts, out.tokens, strict=True):
        seq = list(prompt)
        for _ in range(10):
            seq.append(int(target.next_token_probs([seq], 1)[0, 0].argmax()))
        assert tokens == seq[len(prompt) :]


def test_sampled_generation_runs_and_counts():
    target, draft = tiny(3, 2), tiny(4, 1)
    out = specaccept.generate(target, draft, [[1, 2, 3]] * 4, k=2, max_new_tokens=6, rng=0)
    assert [len(t) for t in out.tokens] == [6] * 4
    assert out.stats.num_steps == out.target_calls


def test_too_short_sequences_are_refused():
    with pytest.raises(ValueError, match=r"sequences\[0\] has 1 tokens"):
        tiny(0, 1).next_token_probs([[1]], 2)
