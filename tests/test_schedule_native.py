"""AdaptiveK's numbers in Rust (src/schedule.rs) against the NumPy reference
(``specaccept.reference.AdaptiveK``, docs/spec.md section 13.3): the same choice at
every step of random and adversarial runs, the same cost fit, and only
``TypeError``/``ValueError`` from the private kernels on anything else."""

from __future__ import annotations

import math

import numpy as np
import pytest
from specaccept import AdaptiveK, _native, reference

# --------------------------------------------------------------------------
# The two classes driven through the same steps
# --------------------------------------------------------------------------


def drive(make, seed, *, steps=60, padded, with_remaining, times):
    """``steps`` steps of a random batch (requests joining and finishing) through
    a schedule made by ``make()``; each step's choice, the fitted line and the
    predicted seconds. ``times(rng, step, x, f)``: the measured step time."""
    rng = np.random.default_rng(seed)
    schedule = make()
    live = list(range(int(rng.integers(1, 9))))
    next_id = len(live)
    acceptance = {r: rng.uniform(0, 1) for r in live}
    out = []
    for step in range(steps):
        available = rng.integers(0, schedule.max_k + 2, size=len(live)).tolist()
        remaining = rng.integers(1, 40, size=len(live)).tolist() if with_remaining else None
        choice = schedule.choose(live, available, padded=padded, remaining=remaining)
        out.append(
            (
                choice.k.tolist(),
                choice.reason,
                schedule.cost_model(),
                choice.predicted_seconds,
                choice.expected_tokens,
            )
        )
        k = choice.k.tolist()
        accepted = [int(rng.binomial(j, acceptance[r])) for r, j in zip(live, k, strict=True)]
        schedule.observe(live, k, accepted)
        width = max(k, default=0)
        x = len(live) * (1 + width) if padded else len(live) + sum(k)
        schedule.observe_cost(times(rng, step, x, width), x, width)
        if rng.random() < 0.2 and len(live) > 1:  # a request finishes
            gone = live.pop(int(rng.integers(len(live))))
            schedule.finish([gone])
        if rng.random() < 0.2:  # one joins
            live.append(next_id)
            acceptance[next_id] = rng.uniform(0, 1)
            next_id += 1
    return out


def linear(rng, step, x, f):
    return 0.03 + 0.002 * x + 0.004 * f + 0.003 * rng.standard_normal() ** 2


def cheap_drafts(rng, step, x, f):
    return 0.05 * (1 + 0.05 * rng.standard_normal()) + 1e-5 * x


def not_linear(rng, step, x, f):  # a CPU forward of 3 tokens can cost more than one of 5
    return (0.054, 0.09, 0.107, 0.069, 0.08)[min(x, 4)] * (1 + 0.01 * rng.random())


def constant(rng, step, x, f):
    return 0.05


def zero(rng, step, x, f):
    return 0.0


def one_off_pauses(rng, step, x, f):
    return 0.02 + 0.001 * x + (2.0 if step % 17 == 5 else 0.0)


def huge(rng, step, x, f):
    return 1e300 * (1 + rng.random())


def tiny(rng, step, x, f):
    return 1e-300 * (1 + x)


TIMES = [linear, cheap_drafts, not_linear, constant, zero, one_off_pauses, huge, tiny]


def same(native, expected):
    """Each step's choice equal; the line, predicted seconds and tokens within
    rounding (the two sum in different orders)."""
    assert len(native) == len(expected)
    for step, (n, e) in enumerate(zip(native, expected, strict=True)):
        assert n[:2] == e[:2], f"step {step}: native {n[:2]}, reference {e[:2]}"
        if e[2] is None:
            assert n[2] is None, f"step {step}"
        else:
            assert n[2] == pytest.approx(e[2], rel=1e-9, abs=1e-12), f"step {step}"
        for a, b in zip(n[3:], e[3:], strict=True):
            assert (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=1e-9), step


#: Options of the runs compared, by seed: defaults, and the extremes allowed.
OPTIONS = (
    dict(probe_every=5),
    dict(probe_every=5, cost_memory=1.0, memory=1.0),
    dict(probe_every=5, prior_weight=math.inf),
    dict(probe_every=0, cost_memory=math.inf, memory=math.inf, min_k=1),
)


@pytest.mark.parametrize("times", TIMES, ids=lambda f: f.__name__)
@pytest.mark.parametrize("padded", [True, False], ids=["padded", "ragged"])
@pytest.mark.parametrize("with_remaining", [False, True], ids=["step", "fixed batch"])
def test_native_choices_are_the_reference_s_step_for_step(times, padded, with_remaining):
    for seed, extra in enumerate(OPTIONS):
        max_k = int(np.random.default_rng(seed).integers(1, 9))
        options = dict(max_k=max_k, **extra)
        runs = [
            drive(
                lambda c=c, options=options: c(**options),
                seed,
                padded=padded,
                with_remaining=with_remaining,
                times=times,
            )
            for c in (AdaptiveK, reference.AdaptiveK)
        ]
        same(*runs)


def test_a_run_past_the_steps_kept_is_the_reference_s():
    """300 steps: the ring of measured steps wraps, rows of finished requests are
    reused."""
    runs = [
        drive(c, 7, steps=300, padded=False, with_remaining=False, times=linear)
        for c in (AdaptiveK, reference.AdaptiveK)
    ]
    same(*runs)


def test_the_runs_compared_reach_the_model_and_draft_some_and_none():
    """The comparison above is not vacuous: its runs are fitted, and choose
    both drafts and none."""
    run = drive(AdaptiveK, 0, padded=False, with_remaining=False, times=linear)
    reasons = {r for _, r, *_ in run}
    assert {"start", "model", "probe"} <= reasons
    drafted = [sum(k) for k, r, *_ in run if r == "model"]
    assert min(drafted) == 0 and max(drafted) > 0


@pytest.mark.parametrize("seed", range(20))
def test_the_native_fit_is_the_reference_s(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 300))
    x = rng.choice([4.0, 8.0, 12.0, 16.0, 40.0], size=n)
    f = rng.choice([0.0, 1.0, 2.0, 4.0], size=n)
    t = 0.01 + 0.002 * x * rng.uniform(0, 1) + 0.003 * f * rng.uniform(0, 1)
    t *= 1 + 0.1 * rng.standard_normal(n)
    t = np.abs(t)
    keep = float(rng.choice([1.0, 0.97, 0.5]))
    native, expected = _native.fit_step_cost(t, x, f, keep), reference.fit_step_cost(t, x, f, keep)
    assert native.coef == pytest.approx(expected.coef, rel=1e-9, abs=1e-15)
    assert native.cells.keys() == expected.cells.keys()
    for point, shift in expected.cells.items():
        assert native.cells[point] == pytest.approx(shift, rel=1e-7, abs=1e-15)
        assert native.seconds(*point) == pytest.approx(expected.seconds(*point), rel=1e-9)
    assert native.seconds(1e6, 0.0) == pytest.approx(expected.seconds(1e6, 0.0), rel=1e-9)


def test_no_fit_while_the_steps_do_not_tell_costs_apart():
    one = np.array([0.1])
    assert _native.fit_step_cost(one, one, one, 0.9) is None
    t, same_point = np.array([0.1, 0.2]), np.array([8.0, 8.0])
    assert _native.fit_step_cost(t, same_point, np.zeros(2), 0.9) is None
    assert reference.fit_step_cost(t, same_point, np.zeros(2), 0.9) is None


@pytest.mark.parametrize("seed", range(40))
def test_native_choice_kernels_are_the_reference_s(seed):
    """Random rows and costs, including rows alike (ties everywhere), caps of 0,
    a cost of 0 per token (every draft pays) and per-point corrections."""
    rng = np.random.default_rng(seed)
    rows, depth = int(rng.integers(0, 12)), int(rng.integers(1, 9))
    alpha = rng.uniform(0, 1, size=(rows, depth))
    if seed % 3 == 0 and rows:
        alpha[:] = alpha[0]
    reach = np.concatenate([np.ones((rows, 1)), np.cumprod(alpha, axis=1)], axis=1)
    cumulative = np.cumsum(reach, axis=1)
    cap = rng.integers(0, depth + 1, size=rows).astype(np.int64)
    coef = tuple(float(c) for c in rng.uniform(0, 0.01, size=3) * (rng.random(3) < 0.8))
    cells = {(float(rows + j), float(j)): float(rng.normal(0, 0.003)) for j in range(4)}
    native_cost, expected_cost = _native.StepCost(coef, cells), reference.StepCost(coef, cells)
    for min_k in (0, 1, depth):
        for remaining in (None, rng.integers(1, 30, size=rows).astype(np.float64)):
            assert np.array_equal(
                _native.best_width(native_cost, cumulative, cap, min_k, remaining),
                reference.best_width(expected_cost, cumulative, cap, min_k, remaining),
            )
            assert np.array_equal(
                _native.best_ragged(native_cost, reach, cumulative, cap, min_k, remaining),
                reference.best_ragged(expected_cost, reach, cumulative, cap, min_k, remaining),
            )


@pytest.mark.parametrize("shape", [(0, 4), (3, 0), (1, 1), (7, 8), (2, 4096)])
def test_native_acceptance_rows_are_the_reference_s_to_the_bit(shape):
    """The same operations in the same order: equal bits."""
    rng = np.random.default_rng(shape[0] * 31 + shape[1])
    tried = rng.uniform(0, 20, size=shape) * (rng.random(shape) < 0.7)
    accepted = tried * rng.uniform(0, 1, size=shape)
    for pooled, weight in ((0.5, 2.0), (0.0, 1e-300), (0.3, math.inf)):
        native = _native.acceptance_rows(accepted, tried, pooled, weight)
        expected = reference.acceptance_rows(accepted, tried, pooled, weight)
        for n, e in zip(native, expected, strict=True):
            assert n.shape == e.shape and n.dtype == np.float64
            np.testing.assert_array_equal(n, e)
        if weight == math.inf:  # the limit: the prior alone at every depth
            assert (native[0] == pooled).all()


@pytest.mark.parametrize("remaining", [None, [3.0, 3.0, 3.0]])
def test_exact_ties_choose_the_fewest_drafts(remaining):
    """Drafts that are never accepted, at a step cost that does not grow: every
    choice is worth the same, and the fewest drafts are chosen (a later choice
    must be worth 1e-12 more)."""
    rows = 3
    reach = np.zeros((rows, 5))
    reach[:, 0] = 1.0
    cumulative = np.cumsum(reach, axis=1)
    cap = np.array([4, 2, 3], np.int64)
    left = None if remaining is None else np.array(remaining)
    for kernels, cost in (
        (_native, _native.StepCost((0.05, 0.0, 0.0), {})),
        (reference, reference.StepCost((0.05, 0.0, 0.0), {})),
    ):
        for min_k in (0, 1):
            fewest = np.minimum(cap, min_k)
            assert (
                kernels.best_width(cost, cumulative, cap, min_k, left).tolist() == fewest.tolist()
            )
            assert (
                kernels.best_ragged(cost, reach, cumulative, cap, min_k, left).tolist()
                == fewest.tolist()
            )
    # Every draft accepted and free: the most drafts that raise the value (the
    # tie rule does not always pick none). With remaining, the slowest request
    # (capped at 2) sets the value: wider is a tie, and 2 is chosen.
    reach[:] = 1.0
    cumulative = np.cumsum(reach, axis=1)
    cost = _native.StepCost((0.05, 0.0, 0.0), {})
    most = cap.tolist() if left is None else [2, 2, 2]
    assert _native.best_width(cost, cumulative, cap, 0, left).tolist() == most
    if left is None:
        assert _native.best_ragged(cost, reach, cumulative, cap, 0, left).tolist() == most


def test_the_fit_is_of_the_last_steps_oldest_first():
    """After 300 measured steps, the fit is the one of the last 256 in order."""
    schedule = AdaptiveK()
    rng = np.random.default_rng(1)
    x = rng.choice([8.0, 16.0, 40.0], size=300)
    f = rng.choice([0.0, 1.0, 4.0], size=300)
    t = 0.01 + 0.002 * x + 0.003 * f + rng.uniform(0, 0.01, size=300)
    for seconds, tokens, forwards in zip(t, x, f, strict=True):
        schedule.observe_cost(float(seconds), int(tokens), int(forwards))
    keep = 1 - 1 / schedule.cost_memory
    expected = _native.fit_step_cost(t[-256:], x[-256:], f[-256:], keep)
    assert schedule.cost_model() == expected.coef
    shuffled = _native.fit_step_cost(
        t[-256:][::-1].copy(), x[-256:][::-1].copy(), f[-256:][::-1].copy(), keep
    )
    assert shuffled.coef != expected.coef  # the order matters: the test can fail


def test_a_finished_request_s_counts_are_not_inherited():
    schedule = AdaptiveK(max_k=4)
    for _ in range(10):
        schedule.observe(["a", "b"], [4, 4], [4, 0])
    fresh = schedule.acceptance("never seen")
    schedule.finish(["a"])
    assert schedule.acceptance("a").tolist() == fresh.tolist()
    schedule.observe(["c"], [0], [0])  # "c" takes the row "a" had
    assert schedule.acceptance("c").tolist() == fresh.tolist()
    assert schedule.acceptance("b")[0] < fresh[0]  # "b"'s own counts kept


def test_a_fitted_schedule_pickles_and_copies():
    import copy
    import pickle

    schedule = AdaptiveK(max_k=4)
    drive_steps = drive(
        lambda: schedule, 3, steps=20, padded=True, with_remaining=False, times=linear
    )
    assert drive_steps[-1][2] is not None  # fitted
    for twin in (pickle.loads(pickle.dumps(schedule)), copy.deepcopy(schedule)):
        assert twin.cost_model() == schedule.cost_model()
        a, b = twin.choose([0, 1, 2], [4, 4, 4]), schedule.choose([0, 1, 2], [4, 4, 4])
        assert a.k.tolist() == b.k.tolist() and a.acceptance.tolist() == b.acceptance.tolist()


def test_a_step_cost_predicts_its_line_and_its_points():
    cost = _native.StepCost((0.01, 0.002, 0.005), {(8.0, 1.0): 0.5, (-0.0, 0.0): 1.0})
    assert cost.seconds(8, 1) == pytest.approx(0.01 + 0.016 + 0.005 + 0.5)
    assert cost.seconds(8, 2) == pytest.approx(0.01 + 0.016 + 0.010)
    assert cost.seconds(0.0, 0.0) == pytest.approx(1.01)  # -0.0 is the point 0
    assert _native.StepCost((0.0, 0.0, 0.0), {}).seconds(5, 5) == 1e-9  # at least 1 ns
    assert cost.coef == (0.01, 0.002, 0.005)
    assert cost.cells == {(8.0, 1.0): 0.5, (0.0, 0.0): 1.0}


# --------------------------------------------------------------------------
# The private kernels on anything else: TypeError or ValueError, never a panic
# --------------------------------------------------------------------------

GOOD = dict(
    cumulative=np.array([[1.0, 1.5, 1.7], [1.0, 1.2, 1.3]]),
    reach=np.array([[1.0, 0.5, 0.2], [1.0, 0.2, 0.1]]),
    cap=np.array([2, 1], np.int64),
    remaining=np.array([3.0, 5.0]),
)


def hostile_calls():
    cost = _native.StepCost((0.01, 0.001, 0.0), {})
    t = np.array([0.1, 0.2, 0.3])

    def choose(kernel, **change):
        args = {**GOOD, **change}
        if kernel == "width":
            return lambda: _native.best_width(
                cost, args["cumulative"], args["cap"], 0, args["remaining"]
            )
        return lambda: _native.best_ragged(
            cost, args["reach"], args["cumulative"], args["cap"], 0, args["remaining"]
        )

    calls = {
        "fit: list": (lambda: _native.fit_step_cost([0.1, 0.2], t, t, 0.9), TypeError),
        "fit: float32": (lambda: _native.fit_step_cost(t.astype(np.float32), t, t, 0.9), TypeError),
        "fit: 2-D": (lambda: _native.fit_step_cost(t[None], t, t, 0.9), ValueError),
        "fit: lengths": (lambda: _native.fit_step_cost(t, t[:2], t, 0.9), ValueError),
        "fit: strided": (lambda: _native.fit_step_cost(t[::2], t[:2], t[:2], 0.9), TypeError),
        "fit: keep negative": (lambda: _native.fit_step_cost(t, t, t, -0.5), ValueError),
        "fit: keep nan": (lambda: _native.fit_step_cost(t, t, t, math.nan), ValueError),
        "fit: keep 2": (lambda: _native.fit_step_cost(t, t, t, 2.0), ValueError),
        "fit: keep str": (lambda: _native.fit_step_cost(t, t, t, "x"), TypeError),
        "cost: bad coef": (lambda: _native.StepCost((1.0, 2.0), {}), ValueError),
        "cost: coef str": (lambda: _native.StepCost("abc", {}), TypeError),
        "cost: bad cells": (lambda: _native.StepCost((1.0, 2.0, 3.0), {1: 2.0}), TypeError),
        "acceptance: shapes": (
            lambda: _native.acceptance_rows(np.ones((2, 3)), np.ones((2, 2)), 0.5, 2.0),
            ValueError,
        ),
        "acceptance: 1-D": (
            lambda: _native.acceptance_rows(np.ones(3), np.ones(3), 0.5, 2.0),
            ValueError,
        ),
        "acceptance: float32": (
            lambda: _native.acceptance_rows(np.ones((2, 3), np.float32), np.ones((2, 3)), 0.5, 2),
            TypeError,
        ),
        "acceptance: Fortran": (
            lambda: _native.acceptance_rows(
                np.asfortranarray(np.ones((2, 3))), np.ones((2, 3)), 0.5, 2.0
            ),
            TypeError,
        ),
        "acceptance: pooled str": (
            lambda: _native.acceptance_rows(np.ones((2, 3)), np.ones((2, 3)), "x", 2.0),
            TypeError,
        ),
        "fit: keep huge": (lambda: _native.fit_step_cost(t, t, t, 10**400), ValueError),
        "cost: coef huge": (lambda: _native.StepCost((10**400, 0.0, 0.0), {}), ValueError),
        "cost: seconds huge": (
            lambda: _native.StepCost((1.0, 0.0, 0.0), {}).seconds(10**400, 0),
            ValueError,
        ),
        "width: min_k negative": (
            lambda: _native.best_width(cost, GOOD["cumulative"], GOOD["cap"], -1),
            ValueError,
        ),
        "ragged: min_k negative": (
            lambda: _native.best_ragged(cost, GOOD["reach"], GOOD["cumulative"], GOOD["cap"], -1),
            ValueError,
        ),
        "width: min_k 2**63": (
            lambda: _native.best_width(cost, GOOD["cumulative"], GOOD["cap"], 2**63),
            ValueError,
        ),
        "acceptance: weight huge": (
            lambda: _native.acceptance_rows(np.ones((2, 3)), np.ones((2, 3)), 0.5, 10**400),
            ValueError,
        ),
        "choose: not a cost": (
            lambda: _native.best_width(None, GOOD["cumulative"], GOOD["cap"], 0),
            TypeError,
        ),
    }
    for kernel in ("width", "ragged"):
        for name, change, kind in (
            ("cap past the depths", dict(cap=np.array([3, 1], np.int64)), ValueError),
            ("cap negative", dict(cap=np.array([-1, 1], np.int64)), ValueError),
            ("cap int32", dict(cap=np.array([1, 1], np.int32)), TypeError),
            ("cap 2-D", dict(cap=np.array([[1, 1]], np.int64)), ValueError),
            ("cap of 3 rows", dict(cap=np.array([1, 1, 1], np.int64)), ValueError),
            ("remaining 0", dict(remaining=np.array([0.0, 1.0])), ValueError),
            ("remaining nan", dict(remaining=np.array([math.nan, 1.0])), ValueError),
            ("remaining of 1 row", dict(remaining=np.array([1.0])), ValueError),
            ("remaining list", dict(remaining=[1.0, 1.0]), TypeError),
            ("cumulative 1-D", dict(cumulative=np.ones(6)), ValueError),
            ("cumulative no column", dict(cumulative=np.ones((2, 0))), ValueError),
            (
                "cumulative Fortran",
                dict(cumulative=np.asfortranarray(GOOD["cumulative"])),
                TypeError,
            ),
            ("cumulative int", dict(cumulative=np.ones((2, 3), np.int64)), TypeError),
            ("reach other shape", dict(reach=np.ones((2, 2))), ValueError),
            ("reach float32", dict(reach=np.ones((2, 3), np.float32)), TypeError),
        ):
            if kernel == "width" and name.startswith("reach"):
                continue
            calls[f"{kernel}: {name}"] = (choose(kernel, **change), kind)
    return calls


@pytest.mark.parametrize("case", list(hostile_calls()))
def test_the_private_kernels_refuse_what_they_cannot_read(case):
    call, kind = hostile_calls()[case]
    inputs = {k: v.copy() for k, v in GOOD.items()}
    with pytest.raises(kind):
        call()
    for name, value in GOOD.items():  # nothing written
        assert np.array_equal(value, inputs[name])
