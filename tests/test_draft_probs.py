"""``verify_logits(..., draft_token_probs=)`` (issue 19; docs/spec.md section 8.7):
the drafter's own ``q_t(x_t)`` decide accepted positions, which then read no
draft row; a rejected position reads its draft row and checks the value.
"""

from __future__ import annotations

import numpy as np
import pytest
import specaccept as sa
from specaccept import reference


def _problem(batch: int, k: int, vocab: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    target = rng.standard_normal((batch, k + 1, vocab)) * 2
    draft = target[:, :k] + rng.standard_normal((batch, k, vocab))
    ids = rng.integers(0, vocab, (batch, k))
    ids[::2] = target[::2, :k].argmax(-1)  # some rows keep their drafts
    return ids, target, draft


def _row_probs(ids, draft, **transform) -> np.ndarray:
    """q_t(x_t) as the transform gives it (the reference's, the native one's to the bit)."""
    params = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, **transform}
    return np.array(
        [
            [
                reference.transform_logits(draft[b, t], **params)[ids[b, t]]
                for t in range(ids.shape[1])
            ]
            for b in range(ids.shape[0])
        ]
    )


@pytest.mark.parametrize(
    "transform",
    [
        dict(),
        dict(temperature=0.7),
        dict(top_k=5),
        dict(top_p=0.8),
        dict(temperature=1.3, top_k=9, top_p=0.9),
    ],
    ids=str,
)
def test_the_row_values_give_the_same_tokens(transform) -> None:
    ids, target, draft = _problem(12, 4, 64, seed=1)
    counts = np.array([4, 0, 3, 4, 1, 4, 2, 4, 4, 3, 4, 4])
    q = _row_probs(ids, draft, **transform)
    common = dict(num_draft_tokens=counts, seeds=np.arange(12), offsets=3, **transform)
    plain = sa.verify_logits(ids, target, draft, **common)
    given = sa.verify_logits(ids, target, draft, draft_token_probs=q, **common)
    ref = reference.verify_logits(ids, target, draft, draft_token_probs=q, **common)
    assert np.array_equal(plain.output_token_ids, given.output_token_ids)
    assert np.array_equal(given.output_token_ids, ref.output_token_ids)
    assert 0 < plain.num_accepted.sum() < counts.sum()  # both decisions occur
    # float32 and strided logits, float32 values.
    wide = np.repeat(target.astype(np.float32), 2, axis=-1)[..., ::2]
    q32 = _row_probs(ids, draft.astype(np.float32), **transform)
    a = sa.verify_logits(
        ids, wide, draft.astype(np.float32), draft_token_probs=q32.astype(np.float32), **common
    )
    b = sa.verify_logits(ids, target.astype(np.float32), draft.astype(np.float32), **common)
    assert np.array_equal(a.output_token_ids, b.output_token_ids)


def test_the_given_values_decide_acceptance() -> None:
    # A uniform between p/q_given and p/q_row: the given value (0.5% off, inside
    # the tolerance) decides, natively and in the reference.
    ids, target, draft = _problem(1, 1, 16, seed=2)
    p = reference.transform_logits(target[0, 0], 1.0, 0, 1.0)[ids[0, 0]]
    q = reference.transform_logits(draft[0, 0], 1.0, 0, 1.0)[ids[0, 0]]
    if q <= p:  # make q > p so that the uniform matters
        ids[0, 0] = int(
            np.argmax(
                np.array(reference.transform_logits(draft[0, 0], 1.0, 0, 1.0))
                - np.array(reference.transform_logits(target[0, 0], 1.0, 0, 1.0))
            )
        )
        p = reference.transform_logits(target[0, 0], 1.0, 0, 1.0)[ids[0, 0]]
        q = reference.transform_logits(draft[0, 0], 1.0, 0, 1.0)[ids[0, 0]]
    assert q > p
    given = q * 1.005
    u = np.array([[(p / q + p / given) / 2]])  # p/given < u < p/q
    common = dict(uniforms=u, recovery_uniforms=np.array([0.3]))
    assert sa.verify_logits(ids, target, draft, **common).num_accepted[0] == 1
    for verify in (sa.verify_logits, reference.verify_logits):
        r = verify(ids, target, draft, draft_token_probs=np.array([[given]]), **common)
        assert r.num_accepted[0] == 0, verify


def test_a_value_far_from_its_row_is_an_error_where_the_row_is_read() -> None:
    ids, target, draft = _problem(4, 3, 32, seed=3)
    q = _row_probs(ids, draft)
    u = np.full((4, 3), np.nextafter(1.0, 0.0))  # every position with q > p rejects
    common = dict(uniforms=u, recovery_uniforms=np.full(4, 0.5))
    rejected_at = sa.verify_logits(ids, target, draft, **common).num_accepted
    row = int(np.argmax(rejected_at < 3))
    t = int(rejected_at[row])
    wrong = q.copy()
    wrong[row, t] *= 1.2
    for verify in (sa.verify_logits, reference.verify_logits):
        with pytest.raises(ValueError) as caught:
            verify(ids, target, draft, draft_token_probs=wrong, **common)
        assert caught.value.argument == "draft_token_probs"
        assert caught.value.index == (row, t)
    isolated = sa.verify_logits(
        ids, target, draft, draft_token_probs=wrong, errors="isolate", **common
    )
    assert list(isolated.errors) == [row]
    # Within the tolerance (1%): accepted as given.
    near = q.copy()
    near[row, t] *= 1.009
    sa.verify_logits(ids, target, draft, draft_token_probs=near, **common)


@pytest.mark.parametrize(
    ("kwargs", "error", "argument"),
    [
        (dict(draft_token_probs=np.full((2, 3), 0.5)), ValueError, "draft_token_probs"),
        (dict(draft_token_probs=np.full((2, 2), np.nan)), ValueError, "draft_token_probs"),
        (dict(draft_token_probs=np.full((2, 2), 1.5)), ValueError, "draft_token_probs"),
        (dict(draft_token_probs=np.full((2, 2), -0.5)), ValueError, "draft_token_probs"),
        (
            dict(draft_token_probs=np.full((2, 2), 0.5), method="block"),
            ValueError,
            "draft_token_probs",
        ),
        (dict(draft_token_probs=np.ones((2, 2), np.int64)), TypeError, None),
        (dict(draft_token_probs="0.5"), TypeError, None),
    ],
)
def test_bad_draft_token_probs(kwargs, error, argument) -> None:
    ids, target, draft = _problem(2, 2, 8)
    for verify in (sa.verify_logits, reference.verify_logits):
        with pytest.raises(error) as caught:
            verify(
                ids,
                target,
                draft,
                uniforms=np.zeros((2, 2)),
                recovery_uniforms=np.zeros(2),
                **kwargs,
            )
        if argument is not None:
            assert caught.value.argument == argument, verify


def test_without_draft_logits_it_is_refused() -> None:
    ids, target, _ = _problem(2, 2, 8)
    for verify in (sa.verify_logits, reference.verify_logits):
        with pytest.raises(ValueError, match="draft_logits"):
            verify(ids, target, None, draft_token_probs=np.full((2, 2), 0.5), rng=0)
