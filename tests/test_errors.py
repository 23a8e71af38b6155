"""Bad input raises a clear Python exception naming the argument (docs/spec.md section 5).

Each case mutates one argument of a valid call and checks: the exception type,
that the message names the argument (and the index, for values), that the
reference raises the same type, and that no input was modified.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import specaccept
from specaccept import reference

B, K, V = 3, 4, 16


def valid_call() -> dict:
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(V), size=(B, K + 1)).astype(np.float32)
    q = rng.dirichlet(np.ones(V), size=(B, K))
    ids = rng.integers(0, V, size=(B, K))
    # Make every draft rejected at position 0 so the residual rows are read.
    for b in range(B):
        p[b, 0, ids[b, 0]] = 0.01
        q[b, 0, ids[b, 0]] = 0.9
    return dict(
        draft_token_ids=ids,
        target_probs=p,
        draft_probs=q,
        num_draft_tokens=np.array([4, 2, 3]),
        uniforms=np.full((B, K), 0.5),
        recovery_uniforms=np.full(B, 0.5),
    )


def with_value(name, index, value, dtype=None):
    def mutate(call):
        arr = call[name].astype(dtype or call[name].dtype)
        arr[index] = value
        call[name] = arr

    return mutate


def replace(name, value):
    def mutate(call):
        call[name] = value(call) if callable(value) else value

    return mutate


CASES = {
    # --- TypeError: not an array, or a dtype outside the lists ---
    "ids as list": (replace("draft_token_ids", [[1, 2, 3, 4]] * 3), TypeError, "draft_token_ids"),
    "ids float": (
        replace("draft_token_ids", lambda c: c["draft_token_ids"].astype(float)),
        TypeError,
        "draft_token_ids",
    ),
    "ids bool": (replace("draft_token_ids", np.ones((B, K), bool)), TypeError, "draft_token_ids"),
    "target int": (
        replace("target_probs", lambda c: c["target_probs"].astype(np.int64)),
        TypeError,
        "target_probs",
    ),
    "target complex": (
        replace("target_probs", lambda c: c["target_probs"].astype(complex)),
        TypeError,
        "target_probs",
    ),
    "target object": (
        replace("target_probs", lambda c: c["target_probs"].astype(object)),
        TypeError,
        "target_probs",
    ),
    "target scalar": (replace("target_probs", 0.5), TypeError, "target_probs"),
    "draft str": (replace("draft_probs", np.array([["a"]])), TypeError, "draft_probs"),
    "counts float": (
        replace("num_draft_tokens", np.array([1.0, 2.0, 3.0])),
        TypeError,
        "num_draft_tokens",
    ),
    "uniforms int": (replace("uniforms", np.zeros((B, K), int)), TypeError, "uniforms"),
    "recovery list": (replace("recovery_uniforms", [0.5] * B), TypeError, "recovery_uniforms"),
    "greedy int": (replace("greedy", 1), TypeError, "greedy"),
    "greedy int array": (replace("greedy", np.ones(B, int)), TypeError, "greedy"),
    # --- ValueError: shapes ---
    "ids 1-D": (replace("draft_token_ids", np.zeros(K, int)), ValueError, "draft_token_ids"),
    "target K rows": (
        replace("target_probs", lambda c: c["target_probs"][:, :K]),
        ValueError,
        "target_probs",
    ),
    "target 2-D": (
        replace("target_probs", lambda c: c["target_probs"][0]),
        ValueError,
        "target_probs",
    ),
    "draft other V": (
        replace("draft_probs", lambda c: c["draft_probs"][:, :, :-1]),
        ValueError,
        "draft_probs",
    ),
    "counts [B+1]": (
        replace("num_draft_tokens", np.array([1, 1, 1, 1])),
        ValueError,
        "num_draft_tokens",
    ),
    "uniforms [B, K-1]": (replace("uniforms", np.full((B, K - 1), 0.5)), ValueError, "uniforms"),
    "recovery [B, 1]": (
        replace("recovery_uniforms", np.full((B, 1), 0.5)),
        ValueError,
        "recovery_uniforms",
    ),
    "greedy [B+1]": (replace("greedy", np.zeros(B + 1, bool)), ValueError, "greedy"),
    # --- ValueError: values that are read ---
    "id = V": (with_value("draft_token_ids", (1, 1), V), ValueError, "draft_token_ids[1, 1]"),
    "id = -1 inside k_b": (
        with_value("draft_token_ids", (0, 3), -1),
        ValueError,
        "draft_token_ids[0, 3]",
    ),
    "id = -2**63": (
        with_value("draft_token_ids", (2, 0), -(2**63)),
        ValueError,
        "draft_token_ids[2, 0]",
    ),
    "id int32 = V": (
        with_value("draft_token_ids", (0, 0), V, np.int32),
        ValueError,
        "draft_token_ids[0, 0]",
    ),
    "id uint64 huge": (
        with_value("draft_token_ids", (0, 0), 2**64 - 1, np.uint64),
        ValueError,
        "draft_token_ids[0, 0]",
    ),
    "k_b = K+1": (with_value("num_draft_tokens", 1, K + 1), ValueError, "num_draft_tokens[1]"),
    "k_b = -1": (with_value("num_draft_tokens", 2, -1), ValueError, "num_draft_tokens[2]"),
    "k_b int64 huge": (with_value("num_draft_tokens", 0, 2**62), ValueError, "num_draft_tokens[0]"),
    "u = 1": (with_value("uniforms", (0, 0), 1.0), ValueError, "uniforms[0, 0]"),
    "u < 0": (with_value("uniforms", (1, 1), -0.25), ValueError, "uniforms[1, 1]"),
    "u NaN": (with_value("uniforms", (2, 2), np.nan), ValueError, "uniforms[2, 2]"),
    "recovery = 1": (with_value("recovery_uniforms", 1, 1.0), ValueError, "recovery_uniforms[1]"),
    "recovery inf": (
        with_value("recovery_uniforms", 0, np.inf),
        ValueError,
        "recovery_uniforms[0]",
    ),
}


def gathered(name, value):
    """Plant ``value`` at p(x_0) or q(x_0) of row 1, which is always read."""

    def mutate(call):
        arr = call[name].copy()
        arr[1, 0, call["draft_token_ids"][1, 0]] = value
        call[name] = arr

    return mutate


def in_residual_row(name, value):
    """Plant ``value`` in row 1's residual row at a token that is not the draft."""

    def mutate(call):
        arr = call[name].copy()
        other = (call["draft_token_ids"][1, 0] + 1) % V
        arr[1, 0, other] = value
        call[name] = arr

    return mutate


for _name in ("target_probs", "draft_probs"):
    for _label, _value in (("NaN", np.nan), ("inf", np.inf), ("negative", -0.5), ("above 1", 1.5)):
        CASES[f"gathered {_name} {_label}"] = (
            gathered(_name, _value),
            ValueError,
            f"{_name}[1, 0, ",
        )
    for _label, _value in (("NaN", np.nan), ("inf", np.inf), ("negative", -1e-30)):
        CASES[f"residual {_name} {_label}"] = (
            in_residual_row(_name, _value),
            ValueError,
            f"{_name}[1, 0, ",
        )


def zero_residual_and_target(call):
    # Row 0 is rejected at 0; make its residual and its p row sum to zero.
    p = call["target_probs"].copy()
    p[0, 0] = 0.0
    call["target_probs"] = p


CASES["row to sample sums to 0"] = (zero_residual_and_target, ValueError, "target_probs[0, 0]")


def zero_bonus_row(call):
    p = call["target_probs"].copy()
    p[1, 0] = 1.0
    p[1, 1] = 0.0  # row 1 has 2 drafts... make them accepted, then the bonus row 2 is zero
    p[1, 2] = 0.0
    call["target_probs"] = p
    call["draft_probs"] = None
    ids = call["draft_token_ids"].copy()
    ids[1, :2] = 0
    p[1, 1, 0] = 1.0
    call["draft_token_ids"] = ids


CASES["bonus row sums to 0"] = (zero_bonus_row, ValueError, "target_probs[1, 2]")


def snapshot(call):
    return {k: copy.deepcopy(v) for k, v in call.items()}


def assert_unchanged(before, after):
    for key, value in before.items():
        if isinstance(value, np.ndarray):
            np.testing.assert_array_equal(after[key], value, err_msg=key)
            assert after[key].dtype == value.dtype


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_raises_naming_the_argument(case):
    mutate, error, fragment = CASES[case]
    call = valid_call()
    mutate(call)
    before = snapshot(call)
    with pytest.raises(error) as info:
        specaccept.verify(**call)
    assert fragment in str(info.value)
    assert_unchanged(before, call)
    with pytest.raises(error):
        reference.verify(**call)


def test_the_valid_call_is_valid():
    call = valid_call()
    r = specaccept.verify(**call)
    assert (r.num_accepted == 0).all(), "every row is rejected at 0, so residual rows are read"


@pytest.mark.parametrize(
    "where",
    ["after the first rejection", "past k_b", "in an unread target row"],
)
def test_values_that_are_never_read_are_not_checked(where):
    call = valid_call()
    p, q, u = call["target_probs"].copy(), call["draft_probs"].copy(), call["uniforms"].copy()
    ids = call["draft_token_ids"].copy()
    if where == "after the first rejection":
        p[0, 2, :] = np.nan  # row 0 stops at 0; positions 1.. are not read
        q[0, 2, :] = np.inf
    elif where == "past k_b":
        ids[1, 2:] = -7  # row 1 has k_b = 2
        u[1, 2:] = np.nan
    else:
        p[2, 3, :] = -1.0  # row 2 is rejected at 0; the bonus row 3 is not read
    call.update(target_probs=p, draft_probs=q, uniforms=u, draft_token_ids=ids)
    assert specaccept.verify(**call).to_lists() == reference.verify(**call).to_lists()


@pytest.mark.parametrize(
    ("kwargs", "error", "fragment"),
    [
        (dict(rng="seed"), TypeError, "rng"),
        (dict(rng=True), TypeError, "rng"),
        (dict(rng=[np.random.default_rng(0)] * (B - 1)), ValueError, "rng"),
        (dict(rng=[np.random.default_rng(0), 3, np.random.default_rng(1)]), TypeError, "rng[1]"),
    ],
)
def test_bad_rng(kwargs, error, fragment):
    call = valid_call()
    del call["uniforms"]
    with pytest.raises(error, match=fragment.replace("[", r"\[")):
        specaccept.verify(**call, **kwargs)
    with pytest.raises(error):
        reference.verify(**call, **kwargs)


def test_greedy_rows_check_the_whole_row_they_read():
    call = valid_call()
    p = call["target_probs"].copy()
    p[0, 0, 5] = np.nan
    with pytest.raises(ValueError, match=r"target_probs\[0, 0, 5\]"):
        specaccept.verify(call["draft_token_ids"], p, greedy=True)


@pytest.mark.parametrize(
    ("args", "error", "fragment"),
    [
        ((np.array([[1, 2]]), [[1, 2, 3]]), TypeError, "target_token_ids"),
        ((np.array([[1.0, 2.0]]), np.array([[1, 2, 3]])), TypeError, "draft_token_ids"),
        ((np.array([[1, 2]]), np.array([[1, 2]])), ValueError, "target_token_ids"),
        ((np.array([[1, -2]]), np.array([[1, 2, 3]])), ValueError, "draft_token_ids[0, 1]"),
        ((np.array([[1, 2]]), np.array([[-1, 2, 3]])), ValueError, "target_token_ids[0, 0]"),
    ],
)
def test_verify_greedy_errors(args, error, fragment):
    with pytest.raises(error) as info:
        specaccept.verify_greedy(*args)
    assert fragment in str(info.value)
    with pytest.raises(error):
        reference.verify_greedy(*args)


@pytest.mark.parametrize(
    ("fn", "args", "error", "fragment"),
    [
        ("rejection_probability", (np.nan, 0.5), ValueError, "target_prob"),
        ("rejection_probability", (0.5, 1.5), ValueError, "draft_prob"),
        ("rejection_probability", (np.array([0.5, -0.1]), 0.5), ValueError, "target_prob[1]"),
        ("rejection_probability", ("0.5", 0.5), TypeError, "target_prob"),
        ("rejection_probability", (np.zeros(3), np.zeros(4)), ValueError, "broadcast"),
        ("acceptance_mask", (0.5, 0.5, 1.0), ValueError, "uniform"),
        ("acceptance_mask", (0.5, 0.5, np.array([[0.1, np.nan]])), ValueError, "uniform[0, 1]"),
        ("acceptance_mask", (0.5, np.array([1]), 0.5), TypeError, "draft_prob"),
        ("accepted_prefix_length", (np.ones((2, 2)),), TypeError, "accepted"),
        ("accepted_prefix_length", (np.ones(2, bool),), ValueError, "accepted"),
        (
            "accepted_prefix_length",
            (np.ones((2, 2), bool), np.array([1, 3])),
            ValueError,
            "num_draft_tokens[1]",
        ),
    ],
)
def test_primitive_errors(fn, args, error, fragment):
    with pytest.raises(error) as info:
        getattr(specaccept, fn)(*args)
    assert fragment in str(info.value)
    with pytest.raises(error):
        getattr(reference, fn)(*args)


def test_native_entry_points_refuse_bad_arguments_without_panicking():
    # The extension is reachable directly; it checks for itself.
    from specaccept import _native

    p = np.full((1, 2, 3), 1 / 3)
    with pytest.raises(TypeError, match="draft_token_ids"):
        _native.verify(np.zeros((1, 1), np.int16), p, None, None, None, None, False)
    with pytest.raises(TypeError, match="target_probs"):
        _native.verify(np.zeros((1, 1), np.int64), p.astype(">f8"), None, None, None, None, False)
    with pytest.raises(TypeError, match="not aligned"):
        buf = np.zeros(1 * 2 * 3 * 8 + 1, np.uint8)[1:].view(np.float64).reshape(1, 2, 3)
        _native.verify(np.zeros((1, 1), np.int64), buf, None, None, None, None, False)
    with pytest.raises(ValueError, match="uniforms"):
        _native.verify(np.zeros((1, 1), np.int64), p, None, None, None, None, False)
    with pytest.raises(TypeError, match="greedy"):
        _native.verify(np.zeros((1, 1), np.int64), p, None, None, None, None, np.zeros(1))


def test_values_in_messages_print_as_python_s_repr():
    # docs/spec.md section 5.8: a bad value prints as Python's repr, whatever its
    # magnitude (repr switches to exponents below 1e-4 and from 1e16, as in
    # 1e-05 and 1e+16). Bad values of many magnitudes in a target row the
    # residual reads, in a drafted token's gathered probability, in a uniform
    # and in a draft_token_probs entry: the native message is the reference's.
    rng = np.random.default_rng(5)
    magnitudes = 10.0 ** rng.uniform(-320, 308, 60)
    values = np.concatenate(
        [-magnitudes, magnitudes[magnitudes > 1], [-1e-5, 1e16, 1e15, -0.0001, -1.5e-7]]
    )
    ids = np.array([[1, 2]])
    p = np.full((1, 3, 4), 0.25)
    q = np.full((1, 2, 4), 0.25)
    q[0, 0, 1] = 0.5  # position 0 rejected: its residual reads the whole row
    u = np.array([[0.9, 0.5]])
    checked = 0
    for v in values:
        row = p.copy()
        row[0, 0, 3] = v  # a residual entry (negative: bad)
        gathered = p.copy()
        gathered[0, 0, 1] = v  # the drafted token's probability (outside [0, 1])
        cases = [
            dict(target_probs=gathered, uniforms=u),
            dict(target_probs=p, uniforms=np.array([[v, 0.5]])),
        ]
        if v < 0:  # a positive entry of a row is valid, however large
            cases.append(dict(target_probs=row, uniforms=u))
        for case in cases:
            messages = []
            for fn in (specaccept.verify, reference.verify):
                with pytest.raises(ValueError) as info:
                    fn(ids, draft_probs=q, recovery_uniforms=np.array([0.5]), **case)
                messages.append(str(info.value))
            assert messages[0] == messages[1]
            assert repr(float(v)) in messages[0]
            checked += 1
    assert checked == 2 * len(values) + (values < 0).sum()
