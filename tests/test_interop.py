"""Any CPU array in (DLPack, buffer protocol), read in place; results as the caller's type.

The DLPack tests use a small wrapper that exports a NumPy array through
``__dlpack__`` (what PyTorch, JAX and CuPy do); the PyTorch tests run where
``torch`` is installed.
"""

from __future__ import annotations

import tracemalloc
import types

import numpy as np
import pytest
import specaccept
from conftest import random_rows
from specaccept import reference
from specaccept._arrays import as_numpy


class DLPackOnly:
    """An array from 'another framework': only the DLPack protocol, on a chosen device."""

    def __init__(self, array: np.ndarray, device: tuple[int, int] = (1, 0)):
        self._array = array
        self._device = device

    def __dlpack__(self, **kwargs):
        return self._array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._device


def call(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    batch, num_draft, vocab = 3, 4, 40
    return dict(
        draft_token_ids=rng.integers(0, vocab, size=(batch, num_draft)),
        target_probs=random_rows(rng, (batch, num_draft + 1, vocab), np.float32),
        draft_probs=random_rows(rng, (batch, num_draft, vocab), np.float32),
        num_draft_tokens=np.array([4, 1, 3]),
        uniforms=rng.random((batch, num_draft)),
        recovery_uniforms=rng.random(batch),
    )


def same(a, b) -> None:
    for name in ("output_token_ids", "num_accepted", "num_emitted"):
        np.testing.assert_array_equal(np.asarray(getattr(a, name)), np.asarray(getattr(b, name)))


@pytest.mark.parametrize("impl", [specaccept, reference], ids=["native", "reference"])
def test_dlpack_inputs_give_the_numpy_result(impl):
    expected = impl.verify(**call())
    wrapped = {k: DLPackOnly(v) for k, v in call().items()}
    same(impl.verify(**wrapped), expected)


def test_dlpack_and_buffer_inputs_are_views_not_copies():
    base = np.arange(12.0).reshape(3, 4)
    for wrapped in (DLPackOnly(base), memoryview(base)):
        view = as_numpy(wrapped, "x")
        assert isinstance(view, np.ndarray) and np.shares_memory(view, base)
    # End to end: a 40 MB target behind DLPack costs no Python-side allocation.
    ids = np.zeros((2, 3), dtype=np.int64)
    target = DLPackOnly(np.full((2, 4, 1_250_000), 1e-6, dtype=np.float32))
    specaccept.verify(ids, target, rng=0)
    tracemalloc.start()
    try:
        specaccept.verify(ids, target, rng=0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000, peak


@pytest.mark.parametrize("impl", [specaccept, reference], ids=["native", "reference"])
@pytest.mark.parametrize("device", [(2, 0), (10, 1), (13, 0)], ids=["cuda", "rocm", "managed"])
def test_arrays_on_an_accelerator_are_refused_not_copied(impl, device):
    c = call()
    c["target_probs"] = DLPackOnly(c["target_probs"], device=device)
    with pytest.raises(TypeError, match=r"target_probs is on a .* device: move it to the CPU"):
        impl.verify(**c)


def test_buffer_protocol_inputs_are_accepted():
    expected = specaccept.verify(**call())
    c = call()
    c["draft_token_ids"] = memoryview(c["draft_token_ids"])
    c["uniforms"] = memoryview(c["uniforms"])
    same(specaccept.verify(**c), expected)
    assert specaccept.rejection_probability(memoryview(np.array([0.6])), 0.8)[0] == pytest.approx(
        0.25
    )


def test_lists_are_still_refused():
    c = call()
    c["draft_token_ids"] = c["draft_token_ids"].tolist()
    with pytest.raises(TypeError, match="draft_token_ids"):
        specaccept.verify(**c)


class Namespace:
    """A minimal array-API namespace: results come back through ``from_dlpack``."""

    def __init__(self):
        self.converted: list[np.ndarray] = []

    def from_dlpack(self, x):
        self.converted.append(x)
        return ("converted", x)


def test_like_an_array_api_array_converts_every_output():
    namespace = Namespace()
    like = types.SimpleNamespace(__array_namespace__=lambda: namespace)
    result = specaccept.verify(**call(), like=like)
    assert result.output_token_ids[0] == "converted"
    assert len(namespace.converted) == 3
    mask = specaccept.acceptance_mask(np.array([0.6]), np.array([0.8]), np.array([0.1]), like=like)
    assert mask[0] == "converted" and mask[1].tolist() == [True]


@pytest.mark.parametrize("impl", [specaccept, reference], ids=["native", "reference"])
def test_like_numpy_is_numpy_and_unknown_like_is_refused(impl):
    result = impl.verify(**call(), like=np.zeros(1))
    assert type(result.output_token_ids) is np.ndarray
    with pytest.raises(TypeError, match="like must be"):
        impl.verify(**call(), like=[1, 2])


# --- PyTorch, where it is installed --------------------------------------------------


def torch_call(torch):
    return {k: torch.from_numpy(v) for k, v in call().items()}


def test_torch_tensors_in_and_out():
    torch = pytest.importorskip("torch")
    expected = specaccept.verify(**call())
    tensors = torch_call(torch)
    result = specaccept.verify(**tensors, like=tensors["target_probs"])
    assert isinstance(result.output_token_ids, torch.Tensor)
    assert result.output_token_ids.dtype == torch.int64
    same(result, expected)
    assert result.tokens(0).tolist() == expected.tokens(0).tolist()
    rate = specaccept.rejection_probability(
        torch.tensor([0.6, 0.0]), torch.tensor([0.8, 0.5]), like=torch.zeros(1)
    )
    assert isinstance(rate, torch.Tensor) and rate.tolist() == pytest.approx([0.25, 1.0])


def test_torch_inputs_are_read_in_place_and_out_tensors_written_in_place():
    torch = pytest.importorskip("torch")
    tensors = torch_call(torch)
    assert np.shares_memory(as_numpy(tensors["target_probs"], "t"), tensors["target_probs"].numpy())
    out = (torch.full((3, 5), 7, dtype=torch.int64), torch.zeros(3, dtype=torch.int64))
    result = specaccept.verify(**tensors, out=out)
    same(result, specaccept.verify(**call()))
    assert out[0].tolist() == specaccept.verify(**call()).output_token_ids.tolist()


@pytest.mark.parametrize("problem", ["requires_grad", "float8"])
def test_torch_tensors_that_cannot_be_read_in_place_are_refused(problem):
    # bfloat16 is read in place (tests/test_bfloat16.py); float8 has no NumPy view.
    torch = pytest.importorskip("torch")
    tensors = torch_call(torch)
    p = tensors["target_probs"]
    tensors["target_probs"] = (
        p.clone().requires_grad_(True) if problem == "requires_grad" else p.to(torch.float8_e5m2)
    )
    with pytest.raises(TypeError, match="target_probs cannot be read in place"):
        specaccept.verify(**tensors)


def test_cuda_tensors_are_refused():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    tensors = torch_call(torch)
    tensors["target_probs"] = tensors["target_probs"].cuda()
    with pytest.raises(TypeError, match="move it to the CPU first"):
        specaccept.verify(**tensors)
