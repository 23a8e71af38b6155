"""The engine layouts reproduce their engines' conventions and agree with ``verify``."""

from __future__ import annotations

import numpy as np
import pytest
import specaccept
from conftest import random_rows
from specaccept.compat import flashinfer, vllm

# --- vLLM ----------------------------------------------------------------------------


def vllm_greedy(drafts: list[list[int]], outputs: list[list[int]], vocab: int = 16):
    """vLLM's greedy test cases: ``outputs[b]`` = target argmax at each draft, then the bonus."""
    flat = [x for row in drafts for x in row]
    argmax = [y for row in outputs for y in row[:-1]]
    bonus = np.array([[row[-1]] for row in outputs])
    target = np.eye(vocab)[argmax] if argmax else np.zeros((0, vocab))
    return vllm.rejection_sample(
        np.array(flat, dtype=np.int64), [len(r) for r in drafts], target, None, bonus, greedy=True
    )


@pytest.mark.parametrize(
    ("drafts", "outputs", "expected"),
    [
        ([[1, 2, 3]], [[1, 5, 3, 4]], [[1, 5, -1, -1]]),
        ([[1, 2], [3]], [[1, 2, 5], [3, 4]], [[1, 2, 5], [3, 4, -1]]),
        ([[]], [[5]], [[5]]),
        ([[1]], [[2, 3]], [[2, -1]]),
        ([[1, 2, 3], [4, 5, 6]], [[1, 2, 3, 7], [4, 5, 6, 8]], [[1, 2, 3, 7], [4, 5, 6, 8]]),
    ],
    ids=["mismatch", "ragged", "no drafts", "first rejected", "all accepted"],
)
def test_vllm_greedy_cases_of_its_own_test_suite(drafts, outputs, expected):
    got = vllm_greedy(drafts, outputs)
    assert got.dtype == np.int32
    assert got.tolist() == expected


def ragged_case(seed: int, with_draft_probs: bool):
    rng = np.random.default_rng(seed)
    batch, vocab = 6, 30
    counts = rng.integers(0, 5, size=batch)
    counts[0] = 0
    total = int(counts.sum())
    target = random_rows(rng, (total, vocab), np.float32)
    draft = random_rows(rng, (total, vocab), np.float32) if with_draft_probs else None
    ids = rng.integers(0, vocab, size=total)
    favourite = target.argmax(axis=1)
    ids = np.where(rng.random(total) < 0.6, favourite, ids)  # some rows accept everything
    bonus = rng.integers(0, vocab, size=(batch, 1))
    return dict(
        draft_token_ids=ids,
        num_draft_tokens=counts,
        target_probs=target,
        draft_probs=draft,
        bonus_token_ids=bonus,
        uniforms=rng.random(total),
        recovery_uniforms=rng.random(batch),
        greedy=rng.random(batch) < 0.3,
    )


def padded(case):
    """The same step in verify's padded layout; the bonus row is one-hot at the bonus token."""
    counts = case["num_draft_tokens"]
    batch, width = len(counts), int(counts.max())
    vocab = case["target_probs"].shape[1]
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    ids = np.zeros((batch, width), dtype=np.int64)
    p = np.zeros((batch, width + 1, vocab), dtype=np.float32)
    q = None if case["draft_probs"] is None else np.full((batch, width, vocab), 1 / vocab)
    u = np.zeros((batch, width))
    for b, (s, k) in enumerate(zip(starts, counts, strict=True)):
        ids[b, :k] = case["draft_token_ids"][s : s + k]
        p[b, :k] = case["target_probs"][s : s + k]
        p[b, k, case["bonus_token_ids"][b, 0]] = 1.0
        if q is not None:
            q[b, :k] = case["draft_probs"][s : s + k]
        u[b, :k] = case["uniforms"][s : s + k]
    return dict(
        draft_token_ids=ids,
        target_probs=p,
        draft_probs=q,
        num_draft_tokens=counts,
        uniforms=u,
        recovery_uniforms=case["recovery_uniforms"],
        greedy=case["greedy"],
    )


@pytest.mark.parametrize("with_draft_probs", [True, False])
@pytest.mark.parametrize("seed", range(25))
def test_vllm_layout_equals_verify_on_the_same_step(seed, with_draft_probs):
    case = ragged_case(seed, with_draft_probs)
    flat = vllm.verify(**case)
    expected = specaccept.verify(**padded(case))
    np.testing.assert_array_equal(flat.output_token_ids, expected.output_token_ids)
    np.testing.assert_array_equal(flat.num_accepted, expected.num_accepted)
    ids = vllm.rejection_sample(**case)
    assert ids.dtype == np.int32 and ids.shape == (6, case["num_draft_tokens"].max() + 1)
    np.testing.assert_array_equal(ids, expected.output_token_ids)


def test_vllm_rng_draws_uniforms_then_recovery_uniforms():
    case = ragged_case(3, True)
    total, batch = len(case["draft_token_ids"]), len(case["num_draft_tokens"])
    g = np.random.default_rng(42)
    case.update(uniforms=g.random(total), recovery_uniforms=g.random(batch))
    explicit = vllm.verify(**case)
    del case["uniforms"], case["recovery_uniforms"]
    drawn = vllm.verify(**case, rng=42)
    np.testing.assert_array_equal(drawn.output_token_ids, explicit.output_token_ids)


@pytest.mark.parametrize(
    ("change", "error", "fragment"),
    [
        (
            lambda c: c.update(draft_token_ids=c["draft_token_ids"][:-1]),
            ValueError,
            r"draft_token_ids: has shape \[\d+\], expected \[\d+\] \(\[T\]",
        ),
        (lambda c: c.update(target_probs=c["target_probs"][:-1]), ValueError, "target_probs"),
        (
            lambda c: c["num_draft_tokens"].__setitem__(0, -1),
            ValueError,
            r"num_draft_tokens\[0\] = -1 is negative",
        ),
        (
            lambda c: c["bonus_token_ids"].__setitem__((2, 0), 30),
            ValueError,
            r"bonus_token_ids\[2\] = 30 is outside \[0, V\)",
        ),
        (
            lambda c: c["target_probs"].__setitem__((3, c["draft_token_ids"][3]), np.nan),
            ValueError,
            r"target_probs\[3, \d+\] = nan",
        ),
        (lambda c: c["uniforms"].__setitem__(1, 1.0), ValueError, r"uniforms\[1\] = 1\.0"),
        (
            lambda c: c.update(bonus_token_ids=c["bonus_token_ids"][:2]),
            ValueError,
            "bonus_token_ids",
        ),
    ],
    ids=[
        "short ids",
        "short target",
        "negative count",
        "bad bonus",
        "nan",
        "uniform 1",
        "bonus shape",
    ],
)
def test_vllm_layout_errors_name_the_flat_index(change, error, fragment):
    case = ragged_case(5, True)
    case["greedy"] = False
    case["draft_token_ids"] = case["target_probs"].argmax(axis=1)  # every row reads every row
    case["draft_probs"] = case["target_probs"].copy()
    change(case)
    with pytest.raises(error, match=fragment):
        vllm.verify(**case)


def test_vllm_parse_output():
    out = np.array([[1, 5, -1, -1], [3, 4, 99, -1]], dtype=np.int32)
    assert vllm.parse_output(out, vocab_size=50) == [[1, 5], [3, 4]]


# --- FlashInfer ------------------------------------------------------------------------

FLASHINFER_EXAMPLE = dict(
    draft_probs=np.array([[[0.1, 0.2, 0.3, 0.4], [0.2, 0.3, 0.4, 0.1]]], dtype=np.float32),
    draft_token_ids=np.array([[2, 1]], dtype=np.int32),
    target_probs=np.array(
        [[[0.0, 0.1, 0.6, 0.3], [1.0, 0.0, 0.0, 0.0], [0.7, 0.1, 0.1, 0.1]]], dtype=np.float32
    ),
)


@pytest.mark.parametrize("seed", range(5))
def test_flashinfer_docstring_example(seed):
    # Accepted at 0 (q 0.3 < p 0.6), rejected at 1 (p = 0), residual [0.8, 0, 0, 0]: token 0.
    u = np.random.default_rng(seed).random((1, 3))
    ids, accepted, emitted = flashinfer.chain_speculative_sampling(
        FLASHINFER_EXAMPLE["draft_probs"],
        FLASHINFER_EXAMPLE["draft_token_ids"],
        u,
        FLASHINFER_EXAMPLE["target_probs"],
    )
    assert ids.dtype == np.int32 and ids.tolist() == [[2, 0, -1]]
    assert accepted.tolist() == [1] and emitted.tolist() == [1]


@pytest.mark.parametrize("seed", range(20))
def test_flashinfer_equals_verify_and_counts_non_causally(seed):
    rng = np.random.default_rng(seed)
    batch, k, vocab = 8, 5, 20
    p = random_rows(rng, (batch, k + 1, vocab), np.float32)
    q = random_rows(rng, (batch, k, vocab), np.float32)
    ids = np.where(
        rng.random((batch, k)) < 0.5, p[:, :k].argmax(-1), rng.integers(0, vocab, (batch, k))
    )
    u = rng.random((batch, k + 1))
    out_ids, accepted, emitted = flashinfer.chain_speculative_sampling(q, ids, u, p)
    expected = specaccept.verify(ids, p, q, uniforms=u[:, :k], recovery_uniforms=u[:, k])
    np.testing.assert_array_equal(out_ids, expected.output_token_ids)
    np.testing.assert_array_equal(emitted, expected.num_accepted)
    # FlashInfer's own invariant: emitted drafts + 1 = valid output tokens.
    np.testing.assert_array_equal(emitted + 1, (out_ids != -1).sum(axis=1))
    # Non-causal count by hand: each position tested on its own.
    by_hand = [
        sum(
            p[b, t, ids[b, t]] > 0
            and (
                q[b, t, ids[b, t]] <= p[b, t, ids[b, t]]
                or u[b, t] < p[b, t, ids[b, t]] / q[b, t, ids[b, t]]
            )
            for t in range(k)
        )
        for b in range(batch)
    ]
    assert accepted.tolist() == by_hand
    assert (accepted >= emitted).all()


def test_flashinfer_adds_counts_in_place():
    accepted = np.array([10], dtype=np.int32)
    emitted = np.array([20], dtype=np.int64)
    _, a, e = flashinfer.chain_speculative_sampling(
        FLASHINFER_EXAMPLE["draft_probs"],
        FLASHINFER_EXAMPLE["draft_token_ids"],
        np.full((1, 3), 0.5),
        FLASHINFER_EXAMPLE["target_probs"],
        accepted,
        emitted,
    )
    assert a is accepted and e is emitted
    assert accepted.tolist() == [11] and emitted.tolist() == [21]


def test_flashinfer_with_torch_tensors_returns_tensors():
    torch = pytest.importorskip("torch")
    tensors = {k: torch.from_numpy(v) for k, v in FLASHINFER_EXAMPLE.items()}
    ids, accepted, emitted = flashinfer.chain_speculative_sampling(
        tensors["draft_probs"],
        tensors["draft_token_ids"],
        torch.rand(1, 3),
        tensors["target_probs"],
    )
    assert isinstance(ids, torch.Tensor) and ids.dtype == torch.int32
    assert ids.tolist() == [[2, 0, -1]] and accepted.tolist() == [1] and emitted.tolist() == [1]


def test_rejection_sample_isolates_a_bad_request() -> None:
    rng = np.random.default_rng(4)
    counts = [2, 1, 3]
    target = rng.dirichlet(np.ones(6), size=6)
    draft = rng.dirichlet(np.ones(6), size=6)
    ids = rng.integers(0, 6, 6)
    bonus = np.array([5, 5, 5])
    bad = target.copy()
    bad[2] = np.nan  # request 1's only slot
    kwargs = dict(seeds=[1, 2, 3], offsets=0)
    isolated = vllm.rejection_sample(ids, counts, bad, draft, bonus, errors="isolate", **kwargs)
    clean = vllm.rejection_sample(ids, counts, target, draft, bonus, **kwargs)
    assert (isolated[1] == -1).all()
    assert isolated[[0, 2]].tolist() == clean[[0, 2]].tolist()
    assert isolated.dtype == np.int32
    with pytest.raises(specaccept.InputError, match="target_probs"):
        vllm.rejection_sample(ids, counts, bad, draft, bonus, **kwargs)
