"""The lossy methods of the laboratory (issue 18; docs/spec.md sections 2.7, 2.8):
typical acceptance (Medusa) and synthetic acceptance. Their output does not
follow the target; these tests hold them to their stated rules, to the
reference, and (synthetic) to the law of the accepted length it promises.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import specaccept as sa
from scipy import stats
from specaccept import reference
from specaccept.compat import vllm
from specaccept.lossy import Synthetic, Typical

ALPHA = 1e-6  # false-failure rate of each chi-square test (the draws are fixed by seeds)


def _problem(batch: int, num_draft: int, vocab: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.full(vocab, 0.3), size=(batch, num_draft + 1))
    q = rng.dirichlet(np.full(vocab, 0.3), size=(batch, num_draft))
    ids = rng.integers(0, vocab, (batch, num_draft))
    ids[::2] = p[::2, :num_draft].argmax(-1)  # some rows drafted where p is large
    return ids, p, q


# --- synthetic acceptance -------------------------------------------------------------


def _accepted_lengths(rate, num_draft: int, rows: int = 40_000) -> np.ndarray:
    ids, p, _ = _problem(1, num_draft, 6)
    result = sa.verify(
        np.broadcast_to(ids, (rows, num_draft)),
        np.broadcast_to(p, (rows, num_draft + 1, 6)),
        method=Synthetic(rate),
        seeds=np.arange(rows),
        offsets=3,
    )
    return result.num_accepted


@pytest.mark.parametrize("wrong", [False, True])
def test_synthetic_accepted_length_is_geometric(wrong: bool) -> None:
    # P(n = j) = a^j (1 - a) for j < K, P(n = K) = a^K. The wrong variant (each
    # position accepted with probability 1 - a) is rejected by the same test.
    a, num_draft = 0.7, 5
    lengths = _accepted_lengths(1 - a if wrong else a, num_draft)
    law = np.array([a**j * (1 - a) for j in range(num_draft)] + [a**num_draft])
    observed = np.bincount(lengths, minlength=num_draft + 1)
    pvalue = stats.chisquare(observed, law * lengths.size).pvalue
    assert (pvalue < ALPHA) if wrong else (pvalue > ALPHA)


def test_synthetic_per_position_rates() -> None:
    rates = np.array([0.9, 0.5, 1.0, 0.2])
    lengths = _accepted_lengths(rates, 4)
    survive = np.concatenate([[1.0], np.cumprod(rates)])  # P(n >= j)
    law = survive[:-1] - survive[1:]
    law = np.append(law, survive[-1])
    observed = np.bincount(lengths, minlength=5)
    assert observed[2] == 0 and law[2] == 0  # rate 1 at position 2: it never stops a row
    kept = law > 0
    assert stats.chisquare(observed[kept], law[kept] * lengths.size).pvalue > ALPHA


def test_synthetic_next_token_is_drawn_from_the_target_row() -> None:
    # Rate 0: every row stops at position 0, and the token comes from p_0 itself
    # (not the residual: the draft probabilities play no part).
    rows = 40_000
    p = np.array([[[0.5, 0.3, 0.15, 0.05], [0.25, 0.25, 0.25, 0.25]]])
    q = np.array([[[0.05, 0.15, 0.3, 0.5]]])
    result = sa.verify(
        np.zeros((rows, 1), np.int64),
        np.broadcast_to(p, (rows, 2, 4)),
        np.broadcast_to(q, (rows, 1, 4)),
        method=Synthetic(0.0),
        seeds=np.arange(rows),
        offsets=0,
    )
    assert (result.num_accepted == 0).all()
    observed = np.bincount(result.output_token_ids[:, 0], minlength=4)
    assert stats.chisquare(observed, p[0, 0] * rows).pvalue > ALPHA
    # Rate 1: every draft kept, then the bonus row's draw.
    ones = sa.verify(
        np.zeros((5, 1), np.int64),
        np.broadcast_to(p, (5, 2, 4)),
        method=Synthetic(1.0),
        rng=0,
    )
    assert (ones.num_accepted == 1).all()


# --- typical acceptance -----------------------------------------------------------------


def _entropy(row) -> float:
    return -sum(v * math.log(v) for v in row if v > 0)


def test_typical_rule_on_hand_made_rows() -> None:
    # p_0 = [0.5, 0.3, 0.2]: H = 1.0297, delta * exp(-H) = 0.107 > epsilon = 0.09, so
    # the threshold is 0.09: token 2 (0.2) is accepted. p_1 = [0.94, 0.03, 0.03]:
    # H = 0.2715, 0.3 * exp(-H) = 0.2286 > 0.09; token 1 (0.03) is rejected.
    p = np.array([[[0.5, 0.3, 0.2], [0.94, 0.03, 0.03], [0.2, 0.3, 0.5]]])
    assert 0.3 * math.exp(-_entropy(p[0, 0])) > 0.09
    for u in np.linspace(0, 0.999, 50):
        r = sa.verify(
            np.array([[2, 1]]),
            p,
            method="typical",
            uniforms=np.zeros((1, 2)),
            recovery_uniforms=np.array([u]),
        )
        assert r.num_accepted[0] == 1
        # The next token comes from p_1 without its entries below 0.09: always 0.
        assert r.tokens(0).tolist() == [2, 0]
    # Strict: a drafted token exactly at the threshold is rejected.
    at = np.array([[[0.09, 0.91], [0.5, 0.5]]])
    assert at[0, 0].sum() == 1.0
    r = sa.verify(np.array([[0]]), at, method="typical", rng=0)
    assert r.num_accepted[0] == 0
    # delta = 0 makes the threshold 0: every drafted token with p > 0 is kept.
    r = sa.verify(np.array([[1, 2]]), p, method=Typical(delta=0.0), rng=0)
    assert r.num_accepted[0] == 2


def test_typical_draw_after_a_stop_is_the_truncated_row() -> None:
    # p_0 = [0.5, 0.45, 0.05] with threshold 0.09: the draw after a rejection at 0
    # is token 0 or 1 with probabilities 0.5/0.95 and 0.45/0.95, never token 2,
    # whatever the recovery uniform (a grid of 1,000 spans the inverse CDF).
    p = np.array([[[0.5, 0.45, 0.05], [1 / 3, 1 / 3, 1 / 3]]])
    grid = (np.arange(1000) + 0.5) / 1000
    tokens = [
        sa.verify(
            np.array([[2]]),
            p,
            method="typical",
            uniforms=np.zeros((1, 1)),
            recovery_uniforms=np.array([u]),
        ).output_token_ids[0, 0]
        for u in grid
    ]
    counts = np.bincount(tokens, minlength=3)
    assert counts[2] == 0
    assert abs(counts[0] / 1000 - 0.5 / 0.95) < 0.002


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(),
        dict(epsilon=0.3, delta=0.5),
        dict(epsilon=0.0),
        dict(delta=5.0, epsilon=2.0),  # a threshold above every entry: the whole row
    ],
    ids=["defaults", "medusa-like", "epsilon 0", "above every entry"],
)
@pytest.mark.parametrize("draft", ["probs", "one-hot"])
def test_typical_matches_the_reference(kwargs: dict, draft: str) -> None:
    ids, p, q = _problem(12, 4, 40, seed=3)
    counts = np.array([4, 0, 2, 4, 1, 3, 4, 4, 0, 2, 3, 4])
    greedy = np.arange(12) % 5 == 0
    common = dict(
        method=Typical(**kwargs),
        num_draft_tokens=counts,
        seeds=np.arange(12),
        offsets=1,
        greedy=greedy,
    )
    qq = q if draft == "probs" else None
    got = sa.verify(ids, p, qq, **common)
    want = reference.verify(ids, p, qq, **common)
    assert np.array_equal(got.output_token_ids, want.output_token_ids)
    # Strided float32 rows: the same tokens as contiguous ones.
    wide = np.repeat(p.astype(np.float32), 2, axis=-1)[..., ::2]
    strided = sa.verify(ids, wide, qq, **common)
    plain = sa.verify(ids, p.astype(np.float32), qq, **common)
    assert np.array_equal(strided.output_token_ids, plain.output_token_ids)


def test_synthetic_matches_the_reference() -> None:
    ids, p, q = _problem(10, 3, 20, seed=4)
    for rate in (0.0, 0.5, [0.9, 0.1, 1.0], 1.0):
        common = dict(method=Synthetic(rate), seeds=np.arange(10), offsets=2)
        got = sa.verify(ids, p, q, **common)
        want = reference.verify(ids, p, q, **common)
        assert np.array_equal(got.output_token_ids, want.output_token_ids)


def test_typical_is_lossy() -> None:
    # Exactly: with the draft sampled from q and a typical stop, the first token's
    # law is not p_0 when p_0 has mass below the threshold (that mass is never
    # emitted after a stop). The exact rule's first token follows p_0.
    rows = 40_000
    p = np.array([[[0.6, 0.35, 0.05], [1 / 3, 1 / 3, 1 / 3]]])
    q = np.array([[[1 / 3, 1 / 3, 1 / 3]]])
    ids = np.random.default_rng(0).integers(0, 3, (rows, 1))
    kwargs = dict(seeds=np.arange(rows), offsets=0)
    big_p = np.broadcast_to(p, (rows, 2, 3))
    big_q = np.broadcast_to(q, (rows, 1, 3))
    exact = sa.verify(ids, big_p, big_q, **kwargs).output_token_ids[:, 0]
    lossy = sa.verify(ids, big_p, big_q, method="typical", **kwargs).output_token_ids[:, 0]
    expected = p[0, 0] * rows
    assert stats.chisquare(np.bincount(exact, minlength=3), expected).pvalue > ALPHA
    assert stats.chisquare(np.bincount(lossy, minlength=3), expected).pvalue < ALPHA


def test_vllm_layer_takes_the_lossy_methods() -> None:
    ids, p, q = _problem(3, 2, 10, seed=5)
    flat, target, draft = ids.reshape(-1), p[:, :2].reshape(-1, 10), q.reshape(-1, 10)
    bonus = np.array([7, 8, 9])
    synthetic = vllm.verify(
        flat,
        [2, 2, 2],
        target,
        draft,
        bonus,
        rejection_sample_method="synthetic",
        method=Synthetic(rate=1.0),
        rng=0,
    )
    assert synthetic.output_token_ids.tolist() == [[*ids[b], 7 + b] for b in range(3)]
    never = vllm.rejection_sample(
        flat, [2, 2, 2], target, draft, bonus, method=Synthetic(0.0), rng=0
    )
    assert (never[:, 1:] == -1).all()
    typical = vllm.verify(flat, [2, 2, 2], target, draft, bonus, method="typical", rng=0)
    assert typical.num_accepted.shape == (3,)


@pytest.mark.parametrize(
    ("make", "error", "argument"),
    [
        (lambda: Typical(epsilon=-0.1), ValueError, "epsilon"),
        (lambda: Typical(delta=float("nan")), ValueError, "delta"),
        (lambda: Typical(epsilon=True), TypeError, None),
        (lambda: Typical(delta="0.3"), TypeError, None),
        (lambda: Typical(epsilon=10**400), ValueError, "epsilon"),
        (lambda: Synthetic(rate=1.5), ValueError, "rate"),
        (lambda: Synthetic(rate=[0.5, -0.1, 0.5]), ValueError, "rate"),
        (lambda: Synthetic(rate="high"), TypeError, None),
        (lambda: Synthetic(rate=np.nan), ValueError, "rate"),
        (lambda: Synthetic(rate=np.ones((2, 2))), TypeError, None),
        (lambda: Synthetic(rate=[None]), TypeError, None),
    ],
)
def test_lossy_values_are_checked_when_made(make, error, argument) -> None:
    with pytest.raises(error) as caught:
        make()
    if argument is not None:
        assert caught.value.argument == argument


def test_lossy_values_are_frozen_and_shown_as_their_label() -> None:
    assert repr(Typical()) == "typical(epsilon=0.09, delta=0.3)"
    assert repr(Synthetic(0.6)) == "synthetic(rate=0.6)"
    assert repr(Synthetic([0.9, 0.5])) == "synthetic(rate=[0.9, 0.5])"
    assert Typical() == Typical(0.09, 0.3) and hash(Synthetic([0.5])) == hash(Synthetic((0.5,)))
    with pytest.raises(AttributeError):
        Typical().epsilon = 1.0  # type: ignore[misc]


@pytest.mark.parametrize(
    ("method", "error", "argument"),
    [
        ("synthetic", ValueError, "method"),
        (Synthetic(rate=[0.5, 0.5]), ValueError, "method"),  # two rates for K = 3
        ("medusa", ValueError, "method"),
        (("typical", {"epsilon": 0.1}), TypeError, None),
        (0.5, TypeError, None),
    ],
)
def test_bad_methods(method, error, argument) -> None:
    ids, p, q = _problem(2, 3, 5)
    for verify in (sa.verify, reference.verify):
        with pytest.raises(error) as caught:
            verify(ids, p, q, rng=0, method=method)
        if argument is not None:
            assert caught.value.argument == argument, (verify, caught.value)


@pytest.mark.parametrize(
    "transform", [dict(), dict(temperature=0.6, top_k=8), dict(top_p=0.7)], ids=str
)
@pytest.mark.parametrize(
    "method",
    [
        dict(method="typical"),
        dict(method=Typical(epsilon=0.02, delta=0.5)),
        dict(method=Synthetic(rate=[0.8, 0.5, 0.3])),
    ],
    ids=str,
)
def test_from_logits_the_rules_run_on_the_transformed_rows(transform, method) -> None:
    ids, p, q = _problem(8, 3, 25, seed=6)
    logits = np.log(p) * 2.0
    draft_logits = np.log(q)
    common = dict(seeds=np.arange(8), offsets=5, **method)
    got = sa.verify_logits(ids, logits, draft_logits, **transform, **common)
    want = reference.verify_logits(ids, logits, draft_logits, **transform, **common)
    assert np.array_equal(got.output_token_ids, want.output_token_ids)
    # The same as verify on the transformed target rows (the draft rows play no part).
    rows = np.array(
        [
            [
                reference.transform_logits(
                    logits[b, t], **{"temperature": 1.0, "top_k": 0, "top_p": 1.0, **transform}
                )
                for t in range(4)
            ]
            for b in range(8)
        ]
    )
    on_probs = sa.verify(ids, rows, None, **common)
    assert np.array_equal(got.output_token_ids, on_probs.output_token_ids)
