"""Property tests: any valid input of docs/spec.md section 2 keeps the invariants.

hypothesis draws shapes, dtypes, memory layouts (strided, reversed, Fortran),
values (including 0, 1 and other exact boundaries), ragged counts and greedy
masks; the native result must equal the
reference's (or both must raise the same error) and satisfy the invariants a
caller relies on. CI runs the default profile; ``HYPOTHESIS_PROFILE=deep``
runs many more examples.
"""

from __future__ import annotations

import os

import numpy as np
import specaccept
from conftest import LAYOUTS, strided_layout
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from specaccept import reference
from test_parity import outcome

settings.register_profile(
    "ci", max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "deep", max_examples=20_000, deadline=None, suppress_health_check=list(HealthCheck)
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

FLOATS = {np.float16: 16, np.float32: 32, np.float64: 64}


def probs(dtype, shape):
    width = FLOATS[dtype]
    element = st.sampled_from([0.0, 0.125, 0.25, 0.5, 1.0]) | st.floats(0, 1, width=width)
    return arrays(dtype, shape, elements=element)


@st.composite
def chain_inputs(draw):
    batch = draw(st.integers(0, 4))
    num_draft = draw(st.integers(0, 4))
    vocab = draw(st.integers(1, 40))
    p_dtype = draw(st.sampled_from(list(FLOATS)))
    q_dtype = draw(st.sampled_from(list(FLOATS)))
    ids = draw(
        arrays(
            draw(st.sampled_from([np.int32, np.int64])),
            (batch, num_draft),
            elements=st.integers(0, vocab - 1),
        )
    )
    uniform = st.sampled_from([0.0, 0.5, float(np.nextafter(1, 0))]) | st.floats(
        0, 1, exclude_max=True
    )
    kwargs = dict(
        draft_token_ids=ids,
        target_probs=draw(probs(p_dtype, (batch, num_draft + 1, vocab))),
        draft_probs=draw(st.none() | probs(q_dtype, (batch, num_draft, vocab))),
        uniforms=draw(arrays(np.float64, (batch, num_draft), elements=uniform)),
        recovery_uniforms=draw(arrays(np.float64, (batch,), elements=uniform)),
        greedy=draw(st.booleans() | arrays(np.bool_, (batch,))),
    )
    if draw(st.booleans()):
        kwargs["num_draft_tokens"] = draw(
            arrays(np.int64, (batch,), elements=st.integers(0, num_draft))
        )
    # Any memory layout: sliced, reversed, Fortran-ordered, per array.
    for name in ("draft_token_ids", "target_probs", "draft_probs", "uniforms"):
        if kwargs[name] is not None:
            kwargs[name] = strided_layout(None, kwargs[name], draw(st.sampled_from(LAYOUTS)))
    return kwargs


@given(chain_inputs())
def test_verify_matches_reference_and_keeps_its_invariants(kwargs):
    native = outcome(specaccept.verify, **kwargs)
    assert native == outcome(reference.verify, **kwargs)
    if isinstance(native[0], type):
        assert issubclass(native[0], ValueError)  # only value errors are possible here
        return
    tokens, accepted, emitted = (np.array(x) for x in native)
    ids = kwargs["draft_token_ids"]
    batch, num_draft = ids.shape
    vocab = kwargs["target_probs"].shape[2]
    counts = kwargs.get("num_draft_tokens", np.full(batch, num_draft))
    for b in range(batch):
        n = accepted[b]
        assert 0 <= n <= counts[b]
        assert emitted[b] == n + 1
        assert (tokens[b, :n] == ids[b, :n]).all(), "accepted tokens are the drafts"
        assert 0 <= tokens[b, n] < vocab
        assert (tokens[b, n + 1 :] == -1).all()


@given(
    st.integers(0, 3).flatmap(
        lambda ndim: st.tuples(*[st.integers(0, 4)] * ndim).flatmap(
            lambda shape: st.tuples(
                probs(np.float32, shape), probs(np.float64, shape), probs(np.float16, shape)
            )
        )
    )
)
def test_primitives_match_reference(arrays_):
    p, q, u = arrays_
    u = np.where(u >= 1, 0.5, u).astype(u.dtype)
    np.testing.assert_array_equal(
        specaccept.rejection_probability(p, q), reference.rejection_probability(p, q)
    )
    np.testing.assert_array_equal(
        specaccept.acceptance_mask(p, q, u), reference.acceptance_mask(p, q, u)
    )
