"""Errors a serving loop can act on: ``InputError`` names the argument, the index
and the request, and ``errors="isolate"`` verifies the good rows of a batch with
bad ones exactly as a batch without them. Also vLLM's ``-1`` draft placeholders."""

from __future__ import annotations

import numpy as np
import pytest
import specaccept
from conftest import random_rows
from specaccept import InputError
from specaccept.compat import vllm

B, K, V = 10, 4, 40
# Thread counts to run at: one thread, and a pool (the batches below are above
# PARALLEL_MIN_ELEMENTS when V is large enough; see large_case).
THREADS = (1, 2)


@pytest.fixture
def restore_threads():
    before = specaccept.get_num_threads()
    yield
    specaccept.set_num_threads(before)


def chain_case(seed: int, batch: int = B, vocab: int = V) -> dict:
    rng = np.random.default_rng(seed)
    target = random_rows(rng, (batch, K + 1, vocab), np.float32)
    draft = random_rows(rng, (batch, K, vocab), np.float32)
    ids = rng.integers(0, vocab, size=(batch, K))
    # Half the drafts are the target's favourite: rows accept a few.
    ids = np.where(rng.random((batch, K)) < 0.5, target[:, :K].argmax(axis=2), ids)
    return dict(
        draft_token_ids=ids,
        target_probs=target,
        draft_probs=draft,
        num_draft_tokens=rng.integers(0, K + 1, size=batch),
        uniforms=rng.random((batch, K)),
        recovery_uniforms=rng.random(batch),
    )


# Ways to make one row bad, each read by the row's verification.
def bad_id(case, b):
    case["draft_token_ids"][b, 0] = V + 3
    case["num_draft_tokens"][b] = K
    return "draft_token_ids", (b, 0)


def bad_count(case, b):
    case["num_draft_tokens"][b] = K + 2
    return "num_draft_tokens", (b,)


def bad_uniform(case, b):
    case["num_draft_tokens"][b] = K
    case["uniforms"][b, K - 1] = 1.5
    return "uniforms", (b, K - 1)


def bad_recovery(case, b):
    case["recovery_uniforms"][b] = np.nan
    return "recovery_uniforms", (b,)


def bad_probability(case, b):
    # Every position's p(x) is NaN: the first one read is position 0.
    case["num_draft_tokens"][b] = K
    x = case["draft_token_ids"][b, 0]
    case["target_probs"][b, :, :] = np.nan
    return "target_probs", (b, 0, int(x))


BREAKERS = [bad_id, bad_count, bad_uniform, bad_recovery, bad_probability]


def drop_rows(case: dict, bad: list[int]) -> dict:
    keep = [b for b in range(len(case["draft_token_ids"])) if b not in bad]
    return {k: (v[keep] if isinstance(v, np.ndarray) else v) for k, v in case.items()}


@pytest.mark.parametrize("threads", THREADS)
@pytest.mark.parametrize("breaker", BREAKERS, ids=lambda f: f.__name__)
def test_isolated_rows_leave_the_others_as_a_batch_without_them(breaker, threads, restore_threads):
    specaccept.set_num_threads(threads)
    case = chain_case(seed=1)
    bad = [2, 7]
    where = {b: breaker(case, b) for b in bad}
    before = {k: v.copy() for k, v in case.items()}
    result = specaccept.verify(**case, errors="isolate")
    for k, v in case.items():
        np.testing.assert_array_equal(v, before[k], err_msg=f"{k} was modified")
    alone = specaccept.verify(**drop_rows(case, bad))
    good = [b for b in range(B) if b not in bad]
    np.testing.assert_array_equal(result.output_token_ids[good], alone.output_token_ids)
    np.testing.assert_array_equal(result.num_accepted[good], alone.num_accepted)
    np.testing.assert_array_equal(result.num_emitted[good], alone.num_emitted)
    assert sorted(result.errors) == bad
    for b in bad:
        error = result.errors[b]
        assert isinstance(error, InputError)
        assert (error.argument, error.index, error.row) == (*where[b], b)
        assert (result.output_token_ids[b] == -1).all()
        assert result.num_accepted[b] == 0 and result.num_emitted[b] == 0
        assert result.tokens(b).tolist() == []
    # Raising instead: the first bad row's error, with the same fields.
    with pytest.raises(InputError) as info:
        specaccept.verify(**case)
    assert (info.value.argument, info.value.index, info.value.row) == (*where[2], 2)
    assert str(info.value) == str(result.errors[2])


def test_isolation_holds_on_the_worker_pool(restore_threads):
    # Large enough for the pool: rows are split into runs, each run isolates its own.
    case = chain_case(seed=2, batch=64, vocab=8000)
    assert 64 * 8000 >= specaccept.PARALLEL_MIN_ELEMENTS
    bad = [0, 31, 63]
    for b in bad:
        case["recovery_uniforms"][b] = -0.5
    alone = specaccept.verify(**drop_rows(case, bad))
    results = []
    for n in (1, 2, 4):
        specaccept.set_num_threads(n)
        results.append(specaccept.verify(**case, errors="isolate"))
    good = [b for b in range(64) if b not in bad]
    for r in results:
        assert sorted(r.errors) == bad
        np.testing.assert_array_equal(r.output_token_ids[good], alone.output_token_ids)


def test_per_row_generators_make_the_isolated_batch_reproduce_the_clean_one():
    case = chain_case(seed=3)
    del case["uniforms"], case["recovery_uniforms"]
    bad_row = 4
    case["draft_token_ids"][bad_row, 0] = -7
    case["num_draft_tokens"][bad_row] = K
    seeds = range(100, 100 + B)
    result = specaccept.verify(
        **case, rng=[np.random.default_rng(s) for s in seeds], errors="isolate"
    )
    keep = [b for b in range(B) if b != bad_row]
    clean = specaccept.verify(
        **drop_rows(case, [bad_row]), rng=[np.random.default_rng(seeds[b]) for b in keep]
    )
    np.testing.assert_array_equal(result.output_token_ids[keep], clean.output_token_ids)
    assert list(result.errors) == [bad_row]
    assert result.errors[bad_row].argument == "draft_token_ids"


def test_a_bad_count_with_per_row_generators_is_the_native_error():
    case = chain_case(seed=4)
    del case["uniforms"], case["recovery_uniforms"]
    case["num_draft_tokens"][3] = -1
    rngs = [np.random.default_rng(s) for s in range(B)]
    with pytest.raises(InputError, match=r"num_draft_tokens\[3\] = -1 is outside \[0, K\]") as e:
        specaccept.verify(**case, rng=rngs)
    assert (e.value.argument, e.value.index, e.value.row) == ("num_draft_tokens", (3,), 3)
    result = specaccept.verify(
        **case, rng=[np.random.default_rng(s) for s in range(B)], errors="isolate"
    )
    assert list(result.errors) == [3]


def test_shape_errors_fail_the_call_even_when_isolating():
    case = chain_case(seed=5)
    case["uniforms"] = case["uniforms"][:, :2]
    with pytest.raises(InputError, match=r"uniforms: has shape \[10, 2\], expected \[10, 4\]") as e:
        specaccept.verify(**case, errors="isolate")
    assert (e.value.argument, e.value.index, e.value.row) == ("uniforms", None, None)


@pytest.mark.parametrize(
    ("errors", "kind"), [("bogus", InputError), (1, TypeError), (None, TypeError)]
)
def test_the_errors_mode_is_checked(errors, kind):
    with pytest.raises(kind, match="errors must be"):
        specaccept.verify(**chain_case(seed=6), errors=errors)


def test_a_clean_batch_has_no_errors():
    result = specaccept.verify(**chain_case(seed=7), errors="isolate")
    assert dict(result.errors) == {}
    assert dict(specaccept.verify(**chain_case(seed=7)).errors) == {}


def logits_case(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return dict(
        draft_token_ids=rng.integers(0, V, size=(B, K)),
        target_logits=rng.normal(size=(B, K + 1, V)).astype(np.float32),
        draft_logits=rng.normal(size=(B, K, V)).astype(np.float32),
        temperature=np.full(B, 0.8),
        top_k=np.full(B, 5),
        uniforms=rng.random((B, K)),
        recovery_uniforms=rng.random(B),
    )


def test_verify_logits_isolates_bad_rows():
    case = logits_case(seed=8)
    case["temperature"][1] = -1.0  # a bad parameter
    case["target_logits"][6, 0, :] = np.nan  # a bad row of logits
    case["draft_token_ids"][8, 2] = V  # a bad id
    bad = [1, 6, 8]
    result = specaccept.verify_logits(**case, errors="isolate")
    alone = specaccept.verify_logits(**drop_rows(case, bad))
    good = [b for b in range(B) if b not in bad]
    np.testing.assert_array_equal(result.output_token_ids[good], alone.output_token_ids)
    assert sorted(result.errors) == bad
    assert [result.errors[b].argument for b in bad] == [
        "temperature",
        "target_logits",
        "draft_token_ids",
    ]
    assert all(result.errors[b].row == b for b in bad)
    with pytest.raises(InputError, match=r"temperature\[1\]"):
        specaccept.verify_logits(**case)


# --- vLLM's layout -------------------------------------------------------------------


def flat_case(seed: int, counts: list[int]):
    rng = np.random.default_rng(seed)
    total = sum(counts)
    return dict(
        draft_token_ids=rng.integers(0, V, size=total),
        num_draft_tokens=np.array(counts),
        target_probs=random_rows(rng, (total, V), np.float64),
        draft_probs=random_rows(rng, (total, V), np.float64),
        bonus_token_ids=rng.integers(0, V, size=len(counts)),
        uniforms=rng.random(total),
        recovery_uniforms=rng.random(len(counts)),
    )


def test_vllm_layer_isolates_a_bad_request_and_names_it():
    counts = [3, 2, 4, 1]
    case = flat_case(seed=9, counts=counts)
    case["draft_token_ids"][3 + 2 + 1] = V + 1  # request 2's second draft
    result = vllm.verify(**case, errors="isolate")
    error = result.errors[2]
    assert (error.argument, error.index, error.row) == ("draft_token_ids", (6,), 2)
    assert list(result.errors) == [2]
    keep = np.r_[0:5, 9:10]  # the flat entries of requests 0, 1 and 3
    alone = vllm.verify(
        draft_token_ids=case["draft_token_ids"][keep],
        num_draft_tokens=np.array([3, 2, 1]),
        target_probs=case["target_probs"][keep],
        draft_probs=case["draft_probs"][keep],
        bonus_token_ids=case["bonus_token_ids"][[0, 1, 3]],
        uniforms=case["uniforms"][keep],
        recovery_uniforms=case["recovery_uniforms"][[0, 1, 3]],
    )
    got = result.output_token_ids[[0, 1, 3]][:, : alone.output_token_ids.shape[1]]
    np.testing.assert_array_equal(got, alone.output_token_ids)
    with pytest.raises(InputError) as info:
        vllm.verify(**case)
    assert (info.value.argument, info.value.index, info.value.row) == ("draft_token_ids", (6,), 2)


@pytest.mark.parametrize("greedy", [False, True])
@pytest.mark.parametrize("seed", range(4))
def test_a_placeholder_ends_a_requests_drafts(seed, greedy):
    # Request b's slot holds k_b entries; a -1 at t makes it a request of t drafts
    # whose next token comes from the target's row at slot t, as verify() with
    # num_draft_tokens = t and that row as the bonus distribution gives.
    counts = [4, 4, 3, 4]
    case = flat_case(seed=10 + seed, counts=counts)
    rng = np.random.default_rng(seed)
    target = case["target_probs"]
    ids = case["draft_token_ids"]
    starts = np.cumsum([0, *counts[:-1]])
    # Accept often: drafts are the target's argmax.
    ids[:] = target.argmax(axis=1)
    cut = [int(rng.integers(0, k + 1)) for k in counts]  # k = no placeholder
    for b, t in enumerate(cut):
        if t < counts[b]:
            ids[starts[b] + t] = -1
            ids[starts[b] + t + 1 : starts[b] + counts[b]] = rng.integers(-5, 2 * V)  # unread
    result = vllm.verify(**case, greedy=greedy)
    for b, t in enumerate(cut):
        rows = slice(starts[b], starts[b] + counts[b])
        padded_target = np.zeros((1, K + 1, V))
        padded_target[0, : counts[b]] = target[rows]
        padded_draft = np.zeros((1, K, V))
        padded_draft[0, : counts[b]] = case["draft_probs"][rows]
        padded_ids = np.zeros((1, K), np.int64)
        padded_ids[0, :t] = ids[starts[b] : starts[b] + t]
        u = np.zeros((1, K))
        u[0, : counts[b]] = case["uniforms"][rows]
        if t == counts[b]:
            # No placeholder: the given bonus token after a fully accepted row.
            if result.num_accepted[b] == t:
                assert result.tokens(b)[-1] == case["bonus_token_ids"][b]
                continue
        expected = specaccept.verify(
            padded_ids,
            padded_target,
            padded_draft,
            num_draft_tokens=np.array([t]),
            uniforms=u,
            recovery_uniforms=case["recovery_uniforms"][[b]],
            greedy=greedy,
        )
        assert result.tokens(b).tolist() == expected.tokens(0).tolist(), (b, t)
        assert result.num_accepted[b] == expected.num_accepted[0]


def test_a_placeholder_first_means_no_drafts_and_the_target_decides():
    target = np.eye(6)[[2, 3]]  # slot 0 of each request: argmax 2, then 3
    r = vllm.verify(np.array([-1, 3]), [1, 1], target, None, np.array([5, 4]), greedy=True)
    assert r.to_lists() == [[2], [3, 4]]
    assert r.num_accepted.tolist() == [0, 1]


def test_other_negative_drafts_are_still_errors():
    target = np.eye(6)[[2]]
    with pytest.raises(InputError, match=r"draft_token_ids\[0\] = -2 is outside \[0, V\)"):
        vllm.verify(np.array([-2]), [1], target, None, np.array([5]), greedy=True)


def test_statistics_leave_isolated_rows_out():
    case = chain_case(seed=11)
    bad = [3, 5]
    for b in bad:
        bad_count(case, b)
    result = specaccept.verify(**case, errors="isolate")
    clean = specaccept.verify(**drop_rows(case, bad))
    with_isolated = specaccept.AcceptanceStats()
    with_isolated.update(result, case["num_draft_tokens"])
    without = specaccept.AcceptanceStats()
    without.update(clean, drop_rows(case, bad)["num_draft_tokens"])
    assert with_isolated.to_dict() == without.to_dict()
    assert with_isolated.num_steps == B - len(bad)
