"""The rule of docs/spec.md section 5, as a property over the public entry points:
for any arguments, the outcome is a valid result, a ``TypeError``, an
``InputError`` (a ``ValueError``) naming its argument, or a ``MemoryError`` naming
one; inputs are never modified; a result keeps the invariants a caller relies on.

hypothesis draws every argument from a wide space: arrays of any dtype a caller
might pass (ints of every width and sign, floats, bool, complex, object), shapes
from 0 to 4 per axis and of the wrong rank, values including NaN, infinities,
negatives and huge magnitudes, and non-arrays (None, lists, scalars, strings).
``tests/test_hostile_api.py`` holds the hand-made cases of the same rule.
"""

from __future__ import annotations

import numpy as np
import specaccept
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import array_shapes, arrays
from specaccept.compat import vllm

RULE = settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))

DTYPES = [
    np.int8,
    np.int32,
    np.int64,
    np.uint8,
    np.uint64,
    np.float16,
    np.float32,
    np.float64,
    np.bool_,
    np.complex64,
]
SPECIAL = [0.0, 0.5, 1.0, -1.0, 2.0, 1e300, -0.0, float("nan"), float("inf"), float("-inf")]


@st.composite
def array_arg(draw, min_dims=0, max_dims=4):
    dtype = np.dtype(draw(st.sampled_from(DTYPES)))
    shape = draw(array_shapes(min_dims=min_dims, max_dims=max_dims, min_side=0, max_side=4))
    if dtype.kind == "f":
        largest = float(np.finfo(dtype).max)
        special = [
            v if abs(v) <= largest or v != v or abs(v) == float("inf") else largest for v in SPECIAL
        ]
        elements = st.sampled_from(special) | st.floats(0, 1, width=dtype.itemsize * 8)
    elif dtype.kind == "c":
        elements = st.complex_numbers(max_magnitude=2, width=dtype.itemsize * 8)
    elif dtype.kind == "b":
        elements = st.booleans()
    else:
        info = np.iinfo(dtype)
        lo, hi = int(info.min), int(info.max)
        edges = sorted({v for v in (0, 1, 2, -1, 2**31, 2**63 - 1, lo, hi) if lo <= v <= hi})
        elements = st.sampled_from(edges) | st.integers(lo, hi) | st.integers(max(-1, lo), 5)
    return draw(arrays(dtype, shape, elements=elements))


def argument(min_dims=0, max_dims=4):
    other = st.sampled_from([None, [1, 2], 3, 0.5, "x", object()])
    return array_arg(min_dims, max_dims) | other


def holds_the_rule(call, *inputs):
    """Runs ``call``; returns its result, or None after an allowed exception."""
    before = [np.array(x, copy=True) for x in inputs if isinstance(x, np.ndarray)]
    try:
        result = call()
    except specaccept.InputError as error:
        assert error.argument, f"an InputError names its argument: {error}"
        result = None
    except ValueError as error:
        raise AssertionError(f"a ValueError that is not an InputError: {error!r}") from None
    except TypeError:
        result = None
    except MemoryError as error:
        assert ":" in str(error), f"a MemoryError names its argument: {error}"
        result = None
    after = [x for x in inputs if isinstance(x, np.ndarray)]
    for a, b in zip(before, after, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"), "an input was modified"
    return result


def check_verification(result, ids):
    if result is None:
        return
    out = result.output_token_ids
    for b in range(result.batch_size):
        n = int(result.num_accepted[b])
        if b in result.errors:
            assert n == 0 and int(result.num_emitted[b]) == 0
            continue
        assert int(result.num_emitted[b]) == n + 1
        assert out[b, :n].tolist() == np.asarray(ids)[b, :n].tolist()
        assert out[b, n] >= 0
        assert (out[b, n + 1 :] == -1).all()


@RULE
@given(
    ids=argument(),
    p=argument(),
    q=argument() | st.none(),
    counts=argument() | st.none(),
    method=st.sampled_from(["token", "block"]),
    errors=st.sampled_from(["raise", "isolate"]),
    greedy=st.booleans(),
)
def test_verify(ids, p, q, counts, method, errors, greedy):
    result = holds_the_rule(
        lambda: specaccept.verify(
            ids, p, q, num_draft_tokens=counts, rng=0, method=method, errors=errors, greedy=greedy
        ),
        ids,
        p,
        q,
        counts,
    )
    check_verification(result, ids)


@RULE
@given(ids=argument(), targets=argument(), counts=argument() | st.none())
def test_verify_greedy(ids, targets, counts):
    result = holds_the_rule(
        lambda: specaccept.verify_greedy(ids, targets, num_draft_tokens=counts), ids, targets
    )
    if result is not None:
        for b in range(result.batch_size):
            n = int(result.num_accepted[b])
            assert result.output_token_ids[b, :n].tolist() == np.asarray(ids)[b, :n].tolist()


@RULE
@given(
    ids=argument(),
    target=argument(),
    draft=argument() | st.none(),
    temperature=st.sampled_from([0.0, 0.7, 1.0, -1.0, float("nan"), 5e-324]) | argument(),
    top_k=st.sampled_from([0, 1, 3, -2]) | argument(),
    top_p=st.sampled_from([1.0, 0.9, 0.0, 2.0]) | argument(),
    method=st.sampled_from(["token", "block"]),
)
def test_verify_logits(ids, target, draft, temperature, top_k, top_p, method):
    result = holds_the_rule(
        lambda: specaccept.verify_logits(
            ids,
            target,
            draft,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            rng=0,
            method=method,
        ),
        ids,
        target,
        draft,
    )
    check_verification(result, ids)


@RULE
@given(ids=argument(), parents=argument(), p=argument(), q=argument() | st.none())
def test_verify_tree(ids, parents, p, q):
    result = holds_the_rule(lambda: specaccept.verify_tree(ids, parents, p, q, rng=0), ids, p, q)
    if result is not None:
        for b in range(result.batch_size):
            n = int(result.num_accepted[b])
            nodes = result.accepted_node_ids[b, :n].tolist()
            assert result.output_token_ids[b, :n].tolist() == [
                int(np.asarray(ids)[b, c]) for c in nodes
            ]


@RULE
@given(
    flat_ids=argument(),
    counts=argument() | st.lists(st.integers(-2, 4), max_size=4),
    p=argument(),
    q=argument() | st.none(),
    bonus=argument(),
    method=st.sampled_from(["token", "block"]),
)
def test_vllm_verify(flat_ids, counts, p, q, bonus, method):
    holds_the_rule(
        lambda: vllm.verify(flat_ids, counts, p, q, bonus, rng=0, method=method),
        flat_ids,
        p,
        q,
        bonus,
    )


@RULE
@given(p=argument(), q=argument(), u=argument())
def test_elementwise_primitives(p, q, u):
    result = holds_the_rule(lambda: specaccept.rejection_probability(p, q), p, q)
    if result is not None:
        values = np.asarray(result, dtype=np.float64)
        assert ((values >= 0) & (values <= 1)).all()
    holds_the_rule(lambda: specaccept.acceptance_mask(p, q, u), p, q, u)
    result = holds_the_rule(lambda: specaccept.acceptance_rate(p, q), p, q)
    if result is not None:
        assert (np.asarray(result) >= 0).all()


@RULE
@given(accepted=argument(), counts=argument() | st.none())
def test_accepted_prefix_length(accepted, counts):
    result = holds_the_rule(
        lambda: specaccept.accepted_prefix_length(accepted, counts), accepted, counts
    )
    if result is not None:
        assert (np.asarray(result) >= 0).all()


@RULE
@given(
    ids=argument(),
    p=argument(),
    q=argument() | st.none(),
    method=st.sampled_from(["token", "block"]),
)
def test_expected_num_accepted(ids, p, q, method):
    result = holds_the_rule(
        lambda: specaccept.lab.expected_num_accepted(ids, p, q, method=method), ids, p, q
    )
    if result is not None:
        k = np.asarray(ids).shape[1]
        assert ((np.asarray(result) >= 0) & (np.asarray(result) <= k + 1e-9)).all()
