"""Inputs are read in place: never copied, never written."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import tracemalloc

import numpy as np
import specaccept


def big_strided_batch(vocab: int):
    """A non-contiguous [B, K+1, V] target view (every other float of a larger buffer)."""
    rng = np.random.default_rng(0)
    buffer = rng.random((2, 4, 2 * vocab), dtype=np.float32)
    target = buffer[:, :, ::2]
    draft = buffer[:, :3, ::-2]  # reversed strides
    ids = np.zeros((2, 3), dtype=np.int64)
    return ids, target, draft


def test_python_layer_allocates_nothing_proportional_to_the_input():
    ids, target, draft = big_strided_batch(vocab=1_000_000)  # a copy would be 16+ MB
    assert not target.flags.c_contiguous and not draft.flags.c_contiguous
    specaccept.verify(ids, target, draft, rng=0)  # warm up
    tracemalloc.start()
    try:
        specaccept.verify(ids, target, draft, rng=0)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000, f"peak traced allocation {peak} bytes"


def test_native_layer_does_not_copy_large_strided_inputs():
    # Resident memory of a fresh process is the honest measure for the Rust side,
    # whose allocations tracemalloc cannot see. The views below total ~320 MB.
    script = textwrap.dedent(
        """
        import resource, sys, numpy as np, specaccept
        buffer = np.full((2, 5, 2 * 4_000_000), 1e-7, dtype=np.float32)
        target = buffer[:, :, ::2]
        draft = buffer[:, :4, 1::2]
        ids = np.zeros((2, 4), dtype=np.int64)
        for greedy in (False, True):
            specaccept.verify(ids, target, draft, rng=0, greedy=greedy)  # reads whole rows
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        for greedy in (False, True):
            specaccept.verify(ids, target, draft, rng=1, greedy=greedy)
            specaccept.verify(ids, target[:, :, ::-1], None, rng=1, greedy=greedy)
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print((after - before) * (1 if sys.platform == "darwin" else 1024))  # bytes on macOS
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    growth = int(out.stdout.strip())
    assert growth < 16_000_000, f"resident memory grew by {growth} bytes"


def test_inputs_are_not_modified_and_read_only_arrays_are_accepted():
    rng = np.random.default_rng(1)
    p = rng.dirichlet(np.ones(50), size=(4, 4)).astype(np.float32)
    q = rng.dirichlet(np.ones(50), size=(4, 3))
    ids = rng.integers(0, 50, size=(4, 3)).astype(np.int32)
    counts = np.array([3, 0, 2, 1])
    u = rng.random((4, 3))
    ru = rng.random(4)
    arrays = [p, q, ids, counts, u, ru]
    copies = [a.copy() for a in arrays]
    for a in arrays:
        a.flags.writeable = False
    r = specaccept.verify(ids, p, q, num_draft_tokens=counts, uniforms=u, recovery_uniforms=ru)
    assert r.num_emitted.tolist() == (r.num_accepted + 1).tolist()
    for a, c in zip(arrays, copies, strict=True):
        np.testing.assert_array_equal(a, c)


def test_memory_mapped_inputs(tmp_path):
    rng = np.random.default_rng(2)
    path = tmp_path / "target.f32"
    values = rng.dirichlet(np.ones(64), size=(3, 3)).astype(np.float32)
    values.tofile(path)
    target = np.memmap(path, dtype=np.float32, mode="r", shape=(3, 3, 64))
    ids = rng.integers(0, 64, size=(3, 2))
    mapped = specaccept.verify(ids, target, rng=5)
    in_memory = specaccept.verify(ids, np.array(target), rng=5)
    assert mapped.to_lists() == in_memory.to_lists()


def test_results_are_fresh_arrays_owned_by_the_caller():
    r = specaccept.verify_greedy(np.array([[1, 2]]), np.array([[1, 2, 3]]))
    assert r.output_token_ids.flags.writeable and r.output_token_ids.flags.c_contiguous
    r2 = specaccept.verify_greedy(np.array([[1, 2]]), np.array([[1, 2, 3]]))
    assert not np.shares_memory(r.output_token_ids, r2.output_token_ids)
