"""``compat.vllm.verify_logits``: vLLM's flat logits layout (bonus rows included),
the verifier behind the vLLM plugin, against the padded ``verify_logits`` and,
with the drafter's probabilities, against ``verify`` on the transformed rows."""

from __future__ import annotations

import numpy as np
import pytest
import specaccept
from conftest import random_rows
from specaccept import reference
from specaccept.compat import vllm


def _step(rng, counts, vocab, dtype=np.float32):
    """A flat step: drafts ``[T]``, logits ``[T + B, V]``, uniforms ``[T]``, ``[B]``."""
    total = sum(counts)
    logits = (rng.standard_normal((total + len(counts), vocab)) * 3).astype(dtype)
    ids = rng.integers(0, vocab, size=total)
    # Some drafts are each row's argmax, so that positions get accepted.
    rows = np.concatenate([s + np.arange(k) for s, k in zip(_starts(counts), counts, strict=True)])
    take = rng.random(total) < 0.6
    if total:
        ids[take] = logits[rows[take]].argmax(axis=-1)
    return ids, logits, rng.random(total), rng.random(len(counts))


def _starts(counts):
    """Each request's first row in the flat logits (its k + 1 rows back to back)."""
    return np.concatenate([[0], np.cumsum(np.asarray(counts) + 1)[:-1]]).astype(int)


def _padded(ids, logits, u, counts):
    """The same step in verify_logits's padded layout (unread slots: copies)."""
    k_max = max(counts) if counts else 0
    batch, vocab = len(counts), logits.shape[1]
    pids = np.zeros((batch, k_max), np.int64)
    plogits = np.zeros((batch, k_max + 1, vocab), logits.dtype)
    pu = np.zeros((batch, k_max))
    d = 0
    for b, (s, k) in enumerate(zip(_starts(counts), counts, strict=True)):
        pids[b, :k] = ids[d : d + k]
        pu[b, :k] = u[d : d + k]
        plogits[b, : k + 1] = logits[s : s + k + 1]
        plogits[b, k + 1 :] = logits[s + k]
        d += k
    return pids, plogits, pu


COUNTS = [[4, 0, 2, 4], [0], [3], [1, 1, 1, 0, 5], [0, 0]]


@pytest.mark.parametrize("method", ["token", "block"])
@pytest.mark.parametrize(
    "params",
    [
        {"temperature": 1.0},
        {"temperature": 0.7, "top_k": 5},
        {"temperature": 1.3, "top_p": 0.8},
        {"temperature": np.array([0.0, 0.8, 0.0, 1.2, 0.5])},
    ],
)
@pytest.mark.parametrize("seed", range(6))
def test_flat_logits_equal_the_padded_call(seed, params, method):
    rng = np.random.default_rng(seed)
    for counts in COUNTS:
        ids, logits, u, ru = _step(rng, counts, vocab=300)
        p = dict(params)
        if isinstance(p["temperature"], np.ndarray):
            p["temperature"] = p["temperature"][: len(counts)]
        flat = vllm.verify_logits(
            ids, counts, logits, uniforms=u, recovery_uniforms=ru, method=method, **p
        )
        pids, plogits, pu = _padded(ids, logits, u, counts)
        padded = specaccept.verify_logits(
            pids,
            plogits,
            num_draft_tokens=np.array(counts),
            uniforms=pu,
            recovery_uniforms=ru,
            method=method,
            **p,
        )
        assert flat.to_lists() == padded.to_lists(), (counts, p)


@pytest.mark.parametrize("seed", range(10))
def test_a_placeholder_draws_the_next_token_from_its_slot(seed):
    """A -1 at slot j of a request: j drafts, and the target row at slot j is the
    next token's row (as if the request had j drafts and that row as its bonus)."""
    rng = np.random.default_rng(seed)
    counts = [4, 3]
    ids, logits, u, ru = _step(rng, counts, vocab=50)
    ids[1:4] = -1  # request 0: one draft, then placeholders
    flat = vllm.verify_logits(ids, counts, logits, uniforms=u, recovery_uniforms=ru)
    # Request 0 alone, one draft, its row 1 as the bonus row.
    alone = vllm.verify_logits(ids[:1], [1], logits[:2], uniforms=u[:1], recovery_uniforms=ru[:1])
    assert flat.tokens(0).tolist() == alone.tokens(0).tolist()
    assert flat.output_token_ids.shape == (2, 5)


@pytest.mark.parametrize("method", ["token", "block"])
@pytest.mark.parametrize("seed", range(8))
def test_draft_probabilities_equal_verify_on_the_transformed_rows(seed, method):
    """Draft rows given as probabilities (vLLM's drafter): the target rows transformed
    (docs/spec.md section 8.2, here by the reference), the draft rows as they are."""
    rng = np.random.default_rng(seed)
    counts = [3, 0, 2]
    vocab, temperature, top_k = 40, 0.9, 12
    ids, logits, u, ru = _step(rng, counts, vocab, np.float64)
    q = random_rows(rng, (sum(counts), vocab), np.float64)
    flat = vllm.verify_logits(
        ids,
        counts,
        logits,
        q,
        temperature=temperature,
        top_k=top_k,
        uniforms=u,
        recovery_uniforms=ru,
        method=method,
    )
    _, plogits, pu = _padded(ids, logits, u, counts)
    pids, _, _ = _padded(ids, logits, u, counts)
    p = np.array(
        [
            [reference.transform_logits(row, temperature, top_k, 1.0) for row in rows]
            for rows in plogits
        ]
    )
    pq = np.zeros((len(counts), max(counts), vocab))
    d = 0
    for b, k in enumerate(counts):
        pq[b, :k] = q[d : d + k]
        pq[b, k:] = 1.0 / vocab
        d += k
    want = specaccept.verify(
        pids,
        p,
        pq,
        num_draft_tokens=np.array(counts),
        uniforms=pu,
        recovery_uniforms=ru,
        method=method,
    )
    assert flat.to_lists() == want.to_lists()


def test_draft_probabilities_change_the_verdict():
    """The draft rows are read (a test that would pass with q ignored fails here):
    a draft the target allows at 0.5 is accepted for sure with q(x) = 0.5 and
    rejected at u = 0.9 with q(x) = 1."""
    logits = np.log(np.array([[0.5, 0.5, 1e-12], [1 / 3, 1 / 3, 1 / 3]]))
    sure = vllm.verify_logits(
        np.array([0]),
        [1],
        logits,
        np.array([[0.5, 0.5, 0.0]]),
        uniforms=np.array([0.9]),
        recovery_uniforms=np.array([0.2]),
    )
    one_hot = vllm.verify_logits(
        np.array([0]),
        [1],
        logits,
        np.array([[1.0, 0.0, 0.0]]),
        uniforms=np.array([0.9]),
        recovery_uniforms=np.array([0.2]),
    )
    assert sure.tokens(0).tolist()[0] == 0 and int(sure.num_accepted[0]) == 1
    assert int(one_hot.num_accepted[0]) == 0 and one_hot.tokens(0).tolist() == [1]


def test_a_bad_row_is_isolated_and_named_by_its_flat_index():
    rng = np.random.default_rng(0)
    counts = [2, 1, 3]
    ids, logits, u, ru = _step(rng, counts, vocab=20)
    logits[_starts(counts)[1], 7] = np.nan  # request 1's first row
    r = vllm.verify_logits(ids, counts, logits, uniforms=u, recovery_uniforms=ru, errors="isolate")
    assert list(r.errors) == [1]
    assert str(r.errors[1]).startswith("logits[3, 7] = nan"), str(r.errors[1])
    good = vllm.verify_logits(ids, counts, np.nan_to_num(logits), uniforms=u, recovery_uniforms=ru)
    assert r.tokens(0).tolist() == good.tokens(0).tolist()
    assert r.tokens(2).tolist() == good.tokens(2).tolist()
    with pytest.raises(specaccept.InputError, match=r"logits\[3, 7\]"):
        vllm.verify_logits(ids, counts, logits, uniforms=u, recovery_uniforms=ru)


def test_seeds_make_a_request_independent_of_its_batch():
    rng = np.random.default_rng(3)
    counts = [3, 2]
    ids, logits, _, _ = _step(rng, counts, vocab=30)
    both = vllm.verify_logits(ids, counts, logits, seeds=[11, 12], offsets=5)
    alone = vllm.verify_logits(ids[3:], [2], logits[4:], seeds=[12], offsets=5)
    assert both.tokens(1).tolist() == alone.tokens(0).tolist()
