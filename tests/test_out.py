"""``out=``: results written into caller buffers, checked like every other argument."""

from __future__ import annotations

import copy
import tracemalloc

import numpy as np
import pytest
import specaccept
from conftest import random_rows
from specaccept import reference

B, K, V = 3, 4, 50


def call() -> dict:
    rng = np.random.default_rng(7)
    return dict(
        draft_token_ids=rng.integers(0, V, size=(B, K)),
        target_probs=random_rows(rng, (B, K + 1, V), np.float32),
        draft_probs=random_rows(rng, (B, K, V), np.float32),
        uniforms=rng.random((B, K)),
        recovery_uniforms=rng.random(B),
    )


def buffers(batch=B, num_draft=K):
    return (
        np.full((batch, num_draft + 1), 99, dtype=np.int64),
        np.full(batch, 99, dtype=np.int64),
        np.full(batch, 99, dtype=np.int64),
    )


@pytest.mark.parametrize("impl", [specaccept, reference], ids=["native", "reference"])
@pytest.mark.parametrize("form", ["tuple3", "tuple2", "list", "verification"])
def test_results_land_in_the_buffers(impl, form):
    expected = specaccept.verify(**call())
    ids, accepted, emitted = buffers()
    out = {
        "tuple3": (ids, accepted, emitted),
        "tuple2": (ids, accepted),
        "list": [ids, accepted, emitted],
        "verification": specaccept.Verification(ids, accepted, emitted),
    }[form]
    got = impl.verify(**call(), out=out)
    assert got.output_token_ids is ids and got.num_accepted is accepted
    if form != "tuple2":
        assert got.num_emitted is emitted
    np.testing.assert_array_equal(ids, expected.output_token_ids)
    np.testing.assert_array_equal(accepted, expected.num_accepted)
    np.testing.assert_array_equal(got.num_emitted, expected.num_emitted)


def test_strided_buffers_are_written_in_place():
    expected = specaccept.verify(**call())
    big = np.zeros((2 * B, 2 * (K + 1)), dtype=np.int64)
    ids = big[::2, ::-2]  # strided and reversed
    accepted = np.zeros(2 * B, dtype=np.int64)[1::2]
    got = specaccept.verify(**call(), out=(ids, accepted))
    np.testing.assert_array_equal(got.output_token_ids, expected.output_token_ids)
    np.testing.assert_array_equal(big[::2, ::-2], expected.output_token_ids)
    np.testing.assert_array_equal(got.num_accepted, expected.num_accepted)


@pytest.mark.parametrize("impl", [specaccept, reference], ids=["native", "reference"])
def test_verify_greedy_takes_out_too(impl):
    drafts = np.array([[3, 4, 5], [3, 4, 5]])
    targets = np.array([[3, 4, 5, 6], [3, 8, 5, 6]])
    out = specaccept.Verification.empty(2, 3)
    got = impl.verify_greedy(drafts, targets, out=out)
    assert got.output_token_ids is out.output_token_ids
    assert out.to_lists() == [[3, 4, 5, 6], [3, 8]]
    assert out.output_token_ids[1].tolist() == [3, 8, -1, -1]


def output_over_the_drafts(c):
    ids = np.zeros((B, K + 1), dtype=np.int64)
    ids[:, :K] = c["draft_token_ids"]
    c["draft_token_ids"] = ids[:, :K]  # the drafts are a view of the output buffer
    return (ids, buffers()[1])


def accepted_inside_the_ids(c):
    ids = buffers()[0]
    return (ids, ids[:, 0])


def read_only(c):
    accepted = np.zeros(B, dtype=np.int64)
    accepted.flags.writeable = False
    return (buffers()[0], accepted)


BAD_OUT = {
    "not a tuple": (lambda c: np.zeros((B, K + 1), dtype=np.int64), TypeError, "out must be"),
    "one array": (lambda c: (buffers()[0],), TypeError, "out must be"),
    "a list inside": (
        lambda c: ([[0] * (K + 1)] * B, buffers()[1]),
        TypeError,
        "out.output_token_ids",
    ),
    "int32 ids": (
        lambda c: (buffers()[0].astype(np.int32), buffers()[1]),
        TypeError,
        "out.output_token_ids must have dtype int64",
    ),
    "float accepted": (
        lambda c: (buffers()[0], buffers()[1].astype(float)),
        TypeError,
        "out.num_accepted must have dtype int64",
    ),
    "1-D ids": (
        lambda c: (buffers()[1], buffers()[1]),
        ValueError,
        "out.output_token_ids must be 2-D",
    ),
    "short ids": (
        lambda c: (buffers(num_draft=K - 1)[0], buffers()[1]),
        ValueError,
        "out.output_token_ids",
    ),
    "long accepted": (
        lambda c: (buffers()[0], buffers(batch=B + 1)[1]),
        ValueError,
        "out.num_accepted",
    ),
    "wrong emitted": (
        lambda c: (*buffers()[:2], buffers(batch=1)[2]),
        ValueError,
        "out.num_emitted",
    ),
    "read-only": (read_only, ValueError, "out.num_accepted is read-only"),
    "aliases an input": (
        output_over_the_drafts,
        ValueError,
        "out.output_token_ids shares memory with draft_token_ids",
    ),
    "outputs overlap": (
        accepted_inside_the_ids,
        ValueError,
        "out.num_accepted shares memory with out.output_token_ids",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_OUT))
def test_bad_out_raises_naming_it_and_leaves_inputs_alone(case):
    make, error, fragment = BAD_OUT[case]
    c = call()
    out = make(c)
    before = copy.deepcopy(c)
    with pytest.raises(error, match=fragment):
        specaccept.verify(**c, out=out)
    with pytest.raises(error):
        reference.verify(**c, out=out)
    for name, value in before.items():
        np.testing.assert_array_equal(c[name], value, err_msg=name)


def test_a_steady_loop_allocates_no_arrays():
    batch, num_draft = 256, 4
    rng = np.random.default_rng(0)
    drafts = rng.integers(0, 8, size=(batch, num_draft))
    targets = np.concatenate([drafts, rng.integers(0, 8, size=(batch, 1))], axis=1)
    out = specaccept.Verification.empty(batch, num_draft)
    output_bytes = out.output_token_ids.nbytes

    def peak_during(loop) -> int:
        loop()  # warm up
        tracemalloc.start()
        try:
            loop()
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    def steps(**kwargs) -> None:
        for _ in range(50):
            specaccept.verify_greedy(drafts, targets, **kwargs)  # the result is dropped

    with_out, fresh = peak_during(lambda: steps(out=out)), peak_during(steps)
    assert fresh >= output_bytes, "the measure sees a fresh output array"
    assert with_out < output_bytes / 4, f"{with_out} bytes traced with out="


@pytest.mark.parametrize(("args", "error"), [((-1, 2), ValueError), ((2, 1.0), TypeError)])
def test_empty_checks_its_sizes(args, error):
    with pytest.raises(error):
        specaccept.Verification.empty(*args)
