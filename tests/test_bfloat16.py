"""bfloat16 in place (issue 17): every probability and logit argument takes
``ml_dtypes.bfloat16`` arrays (JAX's NumPy type) and ``torch.bfloat16`` tensors,
and the results equal those for the same values given as float32 (bfloat16 ->
float32 is exact), token for token, contiguous or strided.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import specaccept as sa
from specaccept import lab, reference
from specaccept.compat import flashinfer, vllm

BF16 = ml_dtypes.bfloat16


def _bf16(x: np.ndarray) -> np.ndarray:
    return np.asarray(x).astype(BF16)


def _f32(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float32)


def _problem(batch: int, num_draft: int, vocab: int, seed: int = 0):
    """Probabilities rounded to bfloat16 (so both forms hold the same values)."""
    rng = np.random.default_rng(seed)
    p = _bf16(rng.dirichlet(np.full(vocab, 0.4), size=(batch, num_draft + 1)))
    q = _bf16(rng.dirichlet(np.full(vocab, 0.4), size=(batch, num_draft)))
    ids = rng.integers(0, vocab, (batch, num_draft))
    # Half the drafts where q is large, so some positions are accepted.
    top = q.astype(np.float32).argmax(axis=-1)
    ids[:, ::2] = top[:, ::2]
    return ids, p, q


LAYOUTS = {
    "contiguous": lambda a: a,
    # Every other vocabulary entry, read through a stride of 2 elements.
    "strided": lambda a: np.repeat(a, 2, axis=-1)[..., ::2],
    # Fortran order: the vocabulary axis is the slowest.
    "fortran": np.asfortranarray,
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("method", ["token", "block"])
def test_verify(layout: str, method: str) -> None:
    ids, p, q = _problem(16, 4, 300)
    view = LAYOUTS[layout]
    kwargs = dict(uniforms=np.random.default_rng(1).random((16, 4)), rng=2, method=method)
    bf = sa.verify(ids, view(p), view(q), **kwargs)
    f32 = sa.verify(ids, _f32(p), _f32(q), **kwargs)
    assert np.array_equal(bf.output_token_ids, f32.output_token_ids)
    assert bf.num_accepted.sum() > 0  # the comparison covers accepted positions
    one_hot = sa.verify(ids, view(p), None, **kwargs)
    assert np.array_equal(
        one_hot.output_token_ids, sa.verify(ids, _f32(p), **kwargs).output_token_ids
    )
    greedy = sa.verify(ids, view(p), view(q), greedy=True)
    assert np.array_equal(
        greedy.output_token_ids, sa.verify(ids, _f32(p), greedy=True).output_token_ids
    )
    ref = reference.verify(ids, p, q, **kwargs)
    assert np.array_equal(bf.output_token_ids, ref.output_token_ids)


def test_mixed_dtypes_and_bfloat16_uniforms() -> None:
    ids, p, q = _problem(8, 3, 64, seed=3)
    u = _bf16(np.random.default_rng(4).random((8, 3)) * 0.99)
    ru = _bf16(np.random.default_rng(5).random(8) * 0.99)
    for draft in (q.astype(np.float16), _f32(q), q.astype(np.float64)):
        mixed = sa.verify(ids, p, draft, uniforms=u, recovery_uniforms=ru)
        plain = sa.verify(ids, _f32(p), _f32(draft), uniforms=_f32(u), recovery_uniforms=_f32(ru))
        assert np.array_equal(mixed.output_token_ids, plain.output_token_ids)
    target_f16 = sa.verify(ids, p.astype(np.float16), q, uniforms=u, recovery_uniforms=ru)
    plain = sa.verify(
        ids,
        p.astype(np.float16).astype(np.float32),
        _f32(q),
        uniforms=_f32(u),
        recovery_uniforms=_f32(ru),
    )
    assert np.array_equal(target_f16.output_token_ids, plain.output_token_ids)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize(
    "transform",
    [dict(), dict(temperature=0.7), dict(top_k=20), dict(top_p=0.8), dict(temperature=0.0)],
    ids=["plain", "temperature", "top_k", "top_p", "greedy"],
)
def test_verify_logits(layout: str, transform: dict) -> None:
    ids, p, q = _problem(12, 3, 257, seed=6)
    target = _bf16(np.log(_f32(p)) * 3.0)
    draft = _bf16(np.log(_f32(q)) * 3.0)
    view = LAYOUTS[layout]
    kwargs = dict(seeds=np.arange(12), offsets=4, **transform)
    bf = sa.verify_logits(ids, view(target), view(draft), **kwargs)
    f32 = sa.verify_logits(ids, _f32(target), _f32(draft), **kwargs)
    assert np.array_equal(bf.output_token_ids, f32.output_token_ids)
    ref = reference.verify_logits(ids, target, draft, **kwargs)
    assert np.array_equal(bf.output_token_ids, ref.output_token_ids)


@pytest.mark.parametrize("method", ["token", "traversal"])
def test_verify_tree(method: str) -> None:
    rng = np.random.default_rng(7)
    parents = np.array([-1, 0, 0, 1, 2, 2])
    p = _bf16(rng.dirichlet(np.full(20, 0.3), size=(6, 6)))
    q = _bf16(rng.dirichlet(np.full(20, 0.3), size=(6, 6)))
    ids = rng.integers(0, 20, (6, 6))
    kwargs = dict(seeds=np.arange(6), offsets=0, method=method)
    bf = sa.verify_tree(ids, parents, p, q, **kwargs)
    f32 = sa.verify_tree(ids, parents, _f32(p), _f32(q), **kwargs)
    ref = reference.verify_tree(ids, parents, p, q, **kwargs)
    for other in (f32, ref):
        assert np.array_equal(bf.output_token_ids, other.output_token_ids)
        assert np.array_equal(bf.accepted_node_ids, other.accepted_node_ids)


def test_primitives_and_expectations() -> None:
    ids, p, q = _problem(5, 3, 40, seed=8)
    u = np.random.default_rng(9).random((5, 3, 40))
    pk = p[:, :3]
    assert np.array_equal(
        sa.rejection_probability(pk, q), sa.rejection_probability(_f32(pk), _f32(q))
    )
    assert np.array_equal(
        sa.acceptance_mask(pk, q, _bf16(u)), sa.acceptance_mask(_f32(pk), _f32(q), _f32(_bf16(u)))
    )
    assert np.array_equal(sa.acceptance_rate(pk, q), sa.acceptance_rate(_f32(pk), _f32(q)))
    assert np.array_equal(
        sa.acceptance_rate(pk[..., ::2], q[..., ::2]),
        sa.acceptance_rate(_f32(pk[..., ::2]), _f32(q[..., ::2])),
    )
    assert np.array_equal(sa.acceptance_rate(pk, q), reference.acceptance_rate(pk, q))
    for method in ("token", "block"):
        assert np.array_equal(
            lab.expected_num_accepted(ids, p, q, method=method),
            lab.expected_num_accepted(ids, _f32(p), _f32(q), method=method),
        )
    parents = np.array([-1, 0, 0, 1])
    tree_ids = ids[:, :4] if ids.shape[1] >= 4 else np.concatenate([ids, ids[:, :1]], axis=1)
    tp, tq = p[:, :4], _bf16(np.concatenate([q, q[:, :1]], axis=1))
    assert np.array_equal(
        lab.expected_num_accepted_tree(tree_ids, parents, tp, tq),
        lab.expected_num_accepted_tree(tree_ids, parents, _f32(tp), _f32(tq)),
    )


def test_compat_layers() -> None:
    ids, p, q = _problem(3, 4, 33, seed=10)
    counts = np.array([4, 2, 3])
    flat = np.concatenate([ids[b, : counts[b]] for b in range(3)])
    target = np.concatenate([p[b, : counts[b]] for b in range(3)])
    draft = np.concatenate([q[b, : counts[b]] for b in range(3)])
    bonus = np.array([[1], [2], [3]])
    kwargs = dict(seeds=[1, 2, 3], offsets=[0, 0, 0])
    bf = vllm.rejection_sample(flat, counts, target, draft, bonus, **kwargs)
    f32 = vllm.rejection_sample(flat, counts, _f32(target), _f32(draft), bonus, **kwargs)
    assert np.array_equal(bf, f32)
    samples = np.random.default_rng(11).random((3, 5))
    bf = flashinfer.chain_speculative_sampling(q, ids, samples, p)
    f32 = flashinfer.chain_speculative_sampling(_f32(q), ids, samples, _f32(p))
    for a, b in zip(bf, f32, strict=True):
        assert np.array_equal(a, b)


def test_bad_bfloat16_values_are_named() -> None:
    ids, p, q = _problem(2, 2, 8, seed=12)
    for bad in (np.nan, np.inf, -0.25):
        broken = p.copy()
        broken[1, 0, ids[1, 0]] = bad
        with pytest.raises(ValueError) as caught:
            sa.verify(ids, broken, q, uniforms=np.zeros((2, 2)), recovery_uniforms=np.zeros(2))
        assert caught.value.argument == "target_probs"
        assert caught.value.index == (1, 0, int(ids[1, 0]))
        with pytest.raises(ValueError):
            reference.verify(
                ids, broken, q, uniforms=np.zeros((2, 2)), recovery_uniforms=np.zeros(2)
            )
    logits = _bf16(np.zeros((2, 3, 8)))
    logits[0, 0, 3] = np.nan  # position 0: always read
    with pytest.raises(ValueError) as caught:
        sa.verify_logits(ids, logits, uniforms=np.full((2, 2), 0.99), recovery_uniforms=np.zeros(2))
    assert caught.value.argument == "target_logits"


def test_unaligned_bfloat16_is_read_through_a_copy() -> None:
    ids, p, _ = _problem(2, 2, 16, seed=13)
    raw = np.zeros(p.nbytes + 1, np.uint8)
    unaligned = raw[1:].view(BF16).reshape(p.shape)
    unaligned[...] = p
    assert not unaligned.flags.aligned
    kwargs = dict(uniforms=np.full((2, 2), 0.3), recovery_uniforms=np.full(2, 0.6))
    got = sa.verify(ids, unaligned, **kwargs)
    assert np.array_equal(got.output_token_ids, sa.verify(ids, _f32(p), **kwargs).output_token_ids)


def test_other_ml_dtypes_are_refused() -> None:
    ids, p, _ = _problem(1, 1, 4)
    for dtype in (ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2):
        with pytest.raises(TypeError, match="floating dtype"):
            sa.verify(ids, p.astype(dtype), rng=0)


def test_torch_bfloat16_tensors_in_place() -> None:
    torch = pytest.importorskip("torch")
    ids, p, q = _problem(6, 3, 128, seed=14)
    tp = torch.from_numpy(_f32(p)).to(torch.bfloat16)
    tq = torch.from_numpy(_f32(q)).to(torch.bfloat16)
    kwargs = dict(seeds=np.arange(6), offsets=1)
    got = sa.verify(torch.from_numpy(ids), tp, tq, like=tp, **kwargs)
    assert isinstance(got.output_token_ids, torch.Tensor)
    want = sa.verify(ids, _f32(p), _f32(q), **kwargs)
    assert np.array_equal(got.output_token_ids.numpy(), want.output_token_ids)
    # Strided tensors (a slice of the vocabulary) and logits.
    wide = tp.repeat_interleave(2, dim=-1)[..., ::2]
    assert np.array_equal(
        sa.verify(ids, wide, **kwargs).output_token_ids,
        sa.verify(ids, _f32(p), **kwargs).output_token_ids,
    )
    logits = torch.log(tp.float()).to(torch.bfloat16)
    got = sa.verify_logits(ids, logits, top_k=10, **kwargs)
    want = sa.verify_logits(ids, logits.float().numpy(), top_k=10, **kwargs)
    assert np.array_equal(got.output_token_ids, want.output_token_ids)
    # The same memory: the view NumPy gets shares the tensor's storage.
    from specaccept._arrays import as_numpy

    view = as_numpy(tp, "target_probs")
    assert view.dtype == BF16 and view.ctypes.data == tp.data_ptr()
    with pytest.raises(TypeError, match="detach"):
        sa.verify(ids, tp.clone().requires_grad_(True), rng=0)
