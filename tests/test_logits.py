"""``verify_logits``: the transform of the reference, ``verify`` on transformed rows,
lossless with top-k and top-p on, and masked tokens never emitted."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
import specaccept
from conftest import FLOAT_DTYPES
from scipy import stats
from specaccept import reference

ALPHA = 1e-6


def logits_case(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    batch, k, vocab = (
        int(rng.integers(1, 6)),
        int(rng.integers(0, 5)),
        int(rng.choice([2, 7, 50, 300])),
    )
    dtype = FLOAT_DTYPES[rng.integers(3)]
    target = (rng.normal(size=(batch, k + 1, vocab)) * 2).astype(dtype)
    target[rng.random(target.shape) < 0.05] = -np.inf
    target[..., 0] = np.where(np.isinf(target[..., 0]), 0.0, target[..., 0])  # one finite logit
    draft = None
    if rng.random() < 0.7:
        draft = (target[:, :k].astype(np.float64) + rng.normal(size=(batch, k, vocab))).astype(
            FLOAT_DTYPES[rng.integers(3)]
        )
    ids = rng.integers(0, vocab, size=(batch, k))
    ids = np.where(rng.random((batch, k)) < 0.5, np.argmax(target[:, :k], axis=-1), ids)
    return dict(
        draft_token_ids=ids,
        target_logits=target,
        draft_logits=draft,
        temperature=rng.choice([0.0, 0.5, 1.0, 2.0], size=batch),
        top_k=rng.choice([0, 1, 3, 40], size=batch),
        top_p=rng.choice([1.0, 0.95, 0.6, 0.1], size=batch),
        num_draft_tokens=rng.integers(0, k + 1, size=batch),
        uniforms=rng.random((batch, k)),
        recovery_uniforms=rng.random(batch),
    )


def outcome(fn, **kwargs):
    try:
        r = fn(**kwargs)
    except (TypeError, ValueError) as e:
        return (type(e), str(e))
    return (r.output_token_ids.tolist(), r.num_accepted.tolist())


@pytest.mark.parametrize("block", range(4))
def test_matches_the_reference(block):
    # Random logits put no decision within 1e-9 of a boundary except with
    # probability ~1e-9 each; the seeds are fixed.
    for seed in range(block * 100, (block + 1) * 100):
        case = logits_case(seed)
        assert outcome(specaccept.verify_logits, **case) == outcome(
            reference.verify_logits, **case
        ), f"seed {seed}"


@pytest.mark.parametrize("seed", range(20))
def test_equals_verify_on_the_transformed_rows(seed):
    case = logits_case(1000 + seed)
    case["temperature"] = np.where(case["temperature"] == 0, 1.0, case["temperature"])
    batch, k1, vocab = case["target_logits"].shape
    t, tk, tp = case["temperature"], case["top_k"], case["top_p"]
    p = np.array(
        [
            [
                reference.transform_logits(case["target_logits"][b, i], t[b], tk[b], tp[b])
                for i in range(k1)
            ]
            for b in range(batch)
        ]
    ).reshape(batch, k1, vocab)
    q = None
    if case["draft_logits"] is not None:
        q = np.array(
            [
                [
                    reference.transform_logits(case["draft_logits"][b, i], t[b], tk[b], tp[b])
                    for i in range(k1 - 1)
                ]
                for b in range(batch)
            ]
        ).reshape(batch, k1 - 1, vocab)
    expected = specaccept.verify(
        case["draft_token_ids"],
        p,
        q,
        num_draft_tokens=case["num_draft_tokens"],
        uniforms=case["uniforms"],
        recovery_uniforms=case["recovery_uniforms"],
    )
    got = specaccept.verify_logits(**case)
    np.testing.assert_array_equal(got.output_token_ids, expected.output_token_ids)


# float32 unfiltered rows go through the screen (src/logits/screen.rs); float64 never do.
# Min-p in both orders (docs/spec.md section 8.2), with top-p.
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize(
    ("top_k", "top_p", "min_p", "min_p_last"),
    [
        (0, 1.0, 0.0, False),
        (5, 1.0, 0.0, False),
        (0, 0.8, 0.0, False),
        (6, 0.7, 0.0, False),
        (0, 0.9, 0.2, False),
        (0, 0.9, 0.2, True),
    ],
)
def test_lossless_and_masked_tokens_never_emitted(top_k, top_p, min_p, min_p_last, dtype):
    rng = np.random.default_rng(top_k + int(top_p * 10) + int(min_p_last))
    rows, vocab, temperature = 100_000, 12, 0.8
    target = rng.normal(size=vocab) * 1.5
    target[3] = -np.inf  # a masked token
    draft = (target + rng.normal(size=vocab) * 0.7).astype(dtype)
    target = target.astype(dtype)
    filters = dict(min_p=min_p, min_p_last=min_p_last)
    p = np.array(reference.transform_logits(target, temperature, top_k, top_p, **filters))
    q = np.array(reference.transform_logits(draft, temperature, top_k, top_p, **filters))
    if min_p:  # min-p removed tokens that top-p alone keeps
        alone = np.array(reference.transform_logits(target, temperature, top_k, top_p))
        assert (p == 0).sum() > (alone == 0).sum()
    drafts = rng.choice(vocab, p=q, size=(rows, 1))
    result = specaccept.verify_logits(
        drafts,
        np.broadcast_to(target, (rows, 2, vocab)),
        np.broadcast_to(draft, (rows, 1, vocab)),
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        rng=rng,
        **filters,
    )
    first = result.output_token_ids[:, 0]
    counts = np.bincount(first, minlength=vocab)
    assert counts[p == 0].sum() == 0, "a filtered or masked token was emitted"
    kept = p > 0
    assert stats.chisquare(counts[kept], p[kept] * rows).pvalue > ALPHA
    if top_k:
        assert kept.sum() <= top_k
    assert 0 < result.num_accepted.mean() < 1


def test_greedy_rows_take_the_argmax_of_the_logits():
    logits = np.array([[[0.0, 3.0, -np.inf, 3.0], [5.0, 1.0, 0.0, 0.0]]])
    r = specaccept.verify_logits(np.array([[1]]), logits, temperature=0.0)
    assert r.to_lists() == [[1, 0]], "first maximal index; then the bonus argmax"


@pytest.mark.parametrize(
    ("change", "error", "fragment"),
    [
        (
            lambda c: c["target_logits"].__setitem__((0, 0, 1), np.nan),
            ValueError,
            r"target_logits\[0, 0, 1\] = nan",
        ),
        (
            lambda c: c["target_logits"].__setitem__((0, 0, 2), np.inf),
            ValueError,
            r"target_logits\[0, 0, 2\] = inf",
        ),
        (lambda c: c["target_logits"].__setitem__((0, 0), -np.inf), ValueError, "no finite logit"),
        (lambda c: c.update(temperature=-1.0), ValueError, r"temperature\[0\]"),
        (lambda c: c.update(top_k=-2), ValueError, r"top_k\[0\]"),
        (lambda c: c.update(top_p=0.0), ValueError, r"top_p\[0\]"),
        (lambda c: c.update(top_p=1.5), ValueError, r"top_p\[0\]"),
        (lambda c: c.update(top_k=2.5), TypeError, "top_k"),
        (lambda c: c.update(target_logits=c["target_logits"][:, :1]), ValueError, "target_logits"),
    ],
)
def test_bad_input_names_the_argument(change, error, fragment):
    case = dict(
        draft_token_ids=np.array([[1]]),
        target_logits=np.zeros((1, 2, 4)),
        draft_logits=np.zeros((1, 1, 4)),
        uniforms=np.array([[0.5]]),
        recovery_uniforms=np.array([0.5]),
    )
    change(case)
    with pytest.raises(error, match=fragment):
        specaccept.verify_logits(**case)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
@pytest.mark.parametrize("where", [1000, 2048, 4999])
def test_a_bad_draft_logit_is_an_error_where_the_first_chunk_proves_acceptance(dtype, bad, where):
    # The drafted token is unlikely under the draft, likely under the target: the
    # draft row's first 2048 logits already bound q(x) far below p(x)
    # (src/logits/screen.rs, draft_prefix_accepts). The rest of the row is still
    # checked (docs/spec.md section 8.5), as the reference checks it. At 1000 the
    # bad value is inside the first chunk, which then proves nothing (a control).
    vocab = 5000
    target = np.zeros((1, 2, vocab), dtype)
    target[0, 0, 100] = 10
    draft = np.zeros((1, 1, vocab), dtype)
    draft[0, 0, :2048] = 5
    draft[0, 0, 100] = 0
    draft[0, 0, where] = bad
    case = dict(
        draft_token_ids=np.array([[100]]),
        target_logits=target,
        draft_logits=draft,
        uniforms=np.array([[0.5]]),
        recovery_uniforms=np.array([0.5]),
    )
    named = rf"draft_logits\[0, 0, {where}\] = {'nan' if np.isnan(bad) else 'inf'}"
    for verify in (specaccept.verify_logits, reference.verify_logits):
        with pytest.raises(ValueError, match=named):
            verify(**case)
    draft[0, 0, where] = -np.inf  # a masked token: valid, and the draft is accepted
    for verify in (specaccept.verify_logits, reference.verify_logits):
        assert verify(**case).num_accepted.tolist() == [1]


@pytest.fixture
def restore_threads():
    before = specaccept.get_num_threads()
    yield
    specaccept.set_num_threads(before)


def large_logits_case(seed: int, batch: int = 24, vocab: int = 20000) -> dict:
    """Above the parallel threshold: rows split into runs on the worker pool."""
    assert batch * 2 * vocab >= specaccept.PARALLEL_MIN_ELEMENTS
    case = logits_case(seed)
    rng = np.random.default_rng(seed)
    target = (rng.normal(size=(batch, 4, vocab)) * 3).astype(np.float32)
    draft = (target[:, :3] + rng.normal(size=(batch, 3, vocab))).astype(np.float32)
    ids = np.where(
        rng.random((batch, 3)) < 0.7,
        np.argmax(target[:, :3], axis=-1),
        rng.integers(0, vocab, size=(batch, 3)),
    )
    case.update(
        draft_token_ids=ids,
        target_logits=target,
        draft_logits=draft,
        temperature=rng.choice([0.0, 0.7, 1.0], size=batch),
        top_k=rng.choice([0, 50], size=batch),
        top_p=rng.choice([1.0, 0.9], size=batch),
        num_draft_tokens=rng.integers(0, 4, size=batch),
        uniforms=rng.random((batch, 3)),
        recovery_uniforms=rng.random(batch),
    )
    return case


def test_every_thread_count_gives_the_reference_result(restore_threads):
    case = large_logits_case(7)
    expected = outcome(reference.verify_logits, **case)
    accepted = sum(expected[1])
    assert 0 < accepted < case["num_draft_tokens"].sum(), "a mixed batch"
    for n in (1, 2, 3, 8):
        specaccept.set_num_threads(n)
        assert outcome(specaccept.verify_logits, **case) == expected, f"{n} threads"


def test_errors_name_the_first_bad_row_on_any_thread_count(restore_threads):
    case = large_logits_case(8)
    case["num_draft_tokens"][:] = 3
    case["temperature"][:] = 1.0
    case["target_logits"][20, 0, 7] = np.nan  # a late row: read on another worker
    case["target_logits"][5, 0, 3] = np.inf  # the first bad row
    for n in (1, 2, 4):
        specaccept.set_num_threads(n)
        with pytest.raises(ValueError, match=r"^target_logits\[5, 0, 3\] = inf"):
            specaccept.verify_logits(**case)


@pytest.mark.parametrize("temperature", [1e-300, np.finfo(np.float64).smallest_normal])
def test_a_tiny_temperature_samples_among_the_largest_logits(temperature):
    # l / T overflows; the softmax is exp((l - max l) / T): the tied maxima share it.
    target = np.array([[[1.0, 2.0, 2.0, -np.inf], [0.0, 0.0, 5.0, 5.0]]] * 4)
    u = np.array([[0.99], [0.0], [0.99], [0.0]])
    recovery = np.array([0.25, 0.25, 0.75, 0.75])
    kwargs = dict(temperature=temperature, uniforms=u, recovery_uniforms=recovery)
    ids = np.array([[0], [1], [0], [2]])
    got = specaccept.verify_logits(ids, target, **kwargs)
    # Token 0 has p = 0: replaced by 1 or 2 (p = 1/2 each); tokens 1 and 2 are accepted
    # (q = 1 > p = 1/2, u = 0), then the bonus is 2 or 3.
    assert got.to_lists() == [[1], [1, 2], [2], [2, 3]]
    assert outcome(
        specaccept.verify_logits, draft_token_ids=ids, target_logits=target, **kwargs
    ) == (outcome(reference.verify_logits, draft_token_ids=ids, target_logits=target, **kwargs))


@pytest.mark.parametrize("temperature", [5e-324, 1e-310, np.inf, np.nan])
def test_temperatures_whose_inverse_overflows_are_refused(temperature):
    case = dict(
        draft_token_ids=np.array([[1]]),
        target_logits=np.zeros((1, 2, 4)),
        uniforms=np.array([[0.5]]),
        recovery_uniforms=np.array([0.5]),
        temperature=temperature,
    )
    for fn in (specaccept.verify_logits, reference.verify_logits):
        with pytest.raises(ValueError, match=r"temperature\[0\] = .*smallest normal"):
            fn(**case)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("with_draft", [True, False])
def test_the_screen_decides_as_the_exact_pass_next_to_the_boundary(dtype, with_draft):
    # Unfiltered f16/f32 rows first go through the screen, which accepts a draft
    # only where its certified bounds on p/q prove it. Put u at relative distances
    # 1e-2 .. 1e-12 from p/q (either side) and at it: the tokens must equal those of
    # the exact pass, forced by top_k = V (it keeps every token, and filtered rows
    # skip the screen). Distances below ~2e-4 are inside the screen's band.
    rng = np.random.default_rng(11)
    batch, k, vocab = 64, 3, 3000
    target = (rng.normal(size=(batch, k + 1, vocab)) * 2).astype(dtype)
    noise = rng.normal(size=(batch, k, vocab)) * 0.5
    draft = (target[:, :k].astype(np.float64) + noise).astype(dtype) if with_draft else None
    ids = np.argmax(target[:, :k].astype(np.float64) + noise, axis=-1)
    temperature = rng.choice([0.7, 1.3], size=batch)
    ratio = np.ones((batch, k))
    for b in range(batch):
        for t in range(k):
            p = reference.transform_logits(target[b, t], temperature[b], 0, 1.0)[ids[b, t]]
            q = 1.0
            if with_draft:
                q = reference.transform_logits(draft[b, t], temperature[b], 0, 1.0)[ids[b, t]]
            ratio[b, t] = p / q
    assert (ratio < 0.99).mean() > 0.5, "most decisions depend on u"
    distances = np.array([1e-2, 1e-4, 1e-5, 1e-6, 1e-8, 1e-10, 1e-12, 0.0])
    signs = np.where(np.arange(batch) % 2 == 0, 1.0, -1.0)[:, None]
    u = np.minimum(ratio * (1 + signs * distances[np.arange(batch) % 8][:, None]), 0.999)
    kwargs = dict(
        draft_token_ids=ids,
        target_logits=target,
        draft_logits=draft,
        temperature=temperature,
        uniforms=u,
        recovery_uniforms=rng.random(batch),
    )
    screened = specaccept.verify_logits(**kwargs)
    exact = specaccept.verify_logits(**kwargs, top_k=vocab)
    np.testing.assert_array_equal(screened.output_token_ids, exact.output_token_ids)
    assert 0 < screened.num_accepted.sum() < batch * k, "both outcomes occur"
    # Away from the boundary the reference agrees too (within 1e-9 it may not).
    far = np.abs(distances[np.arange(batch) % 8]) >= 1e-8
    expected = reference.verify_logits(**kwargs)
    np.testing.assert_array_equal(screened.output_token_ids[far], expected.output_token_ids[far])


@pytest.mark.parametrize("top_k", [0, 7, 700])
@pytest.mark.parametrize("top_p", [0.3, 0.9, 0.999])
@pytest.mark.parametrize("shape", ["peaked", "flat", "ties"])
def test_top_k_and_top_p_thresholds_on_a_large_vocabulary(top_k, top_p, shape):
    # Large rows take the fast paths: top-k among the weights above the k-th
    # largest block max, top-p among those above a histogram floor, and with k
    # at most the number of blocks (20 here), p(x) from top-k's candidates only.
    rng = np.random.default_rng(zlib.crc32(f"{top_k} {top_p} {shape}".encode()))
    batch, k, vocab = 4, 2, 5000
    scale = {"peaked": 4.0, "flat": 0.05, "ties": 1.0}[shape]
    target = (rng.normal(size=(batch, k + 1, vocab)) * scale).astype(np.float32)
    draft = (target[:, :k] + rng.normal(size=(batch, k, vocab)) * 0.3).astype(np.float32)
    if shape == "ties":  # few distinct values: every threshold sits in a tie
        target, draft = np.round(target), np.round(draft)
    kwargs = dict(
        draft_token_ids=np.argmax(draft, axis=-1),
        target_logits=target,
        draft_logits=draft,
        temperature=0.9,
        top_k=top_k,
        top_p=top_p,
        uniforms=rng.random((batch, k)),
        recovery_uniforms=rng.random(batch),
    )
    assert outcome(specaccept.verify_logits, **kwargs) == outcome(reference.verify_logits, **kwargs)


def test_plain_number_parameters_equal_their_per_row_arrays_call_after_call():
    """Plain-number temperature/top-k/top-p reuse cached per-row views across calls:
    each call must still read its own values, at every batch size, and ``-0.0``
    must not stand in for ``0.0`` (or the reverse)."""
    for seed, temperature, top_k, top_p in [
        (2, 0.8, 0, 1.0),
        (3, 0.8, 0, 1.0),
        (3, 1, 5, 1),
        (3, 1.0, 5, 0.9),
        (2, 0.0, 3, 0.5),
        (2, -0.0, 3, 0.5),
        (4, 2.0, 1, 0.5),
        (2, 0.8, 0, 1.0),
    ]:
        case = logits_case(seed)
        batch = case["draft_token_ids"].shape[0]
        for key in ("temperature", "top_k", "top_p"):
            case.pop(key)
        scalars = dict(temperature=temperature, top_k=top_k, top_p=top_p)
        arrays = {
            key: np.full(batch, value, dtype=np.int64 if key == "top_k" else np.float64)
            for key, value in scalars.items()
        }
        assert outcome(specaccept.verify_logits, **case, **scalars) == outcome(
            specaccept.verify_logits, **case, **arrays
        ), scalars
    # A zero read as float64 keeps its sign, whatever was passed before it.
    ids = np.array([[1]])
    logits = np.log(np.array([[[0.5, 0.3, 0.2], [0.3, 0.3, 0.4]]]))
    for value, shown in [(0, r"0\.0"), (-0.0, r"-0\.0"), (0.0, r"0\.0")]:
        with pytest.raises(ValueError, match=rf"top_p\[0\] = {shown}: "):
            specaccept.verify_logits(ids, logits, top_p=value, rng=0)
