"""Choosing k each step (docs/spec.md section 13): AdaptiveK on a simulator whose
optimum is known, HeuristicK as transformers defines it, and both inside
``generate``, where k changes what is drafted and never what is emitted."""

from __future__ import annotations

import itertools
import math
import types

import numpy as np
import pytest
import specaccept
from specaccept import AdaptiveK, HeuristicK, InputError, reference
from specaccept import expected_tokens_per_step as expected_emitted
from test_generate import Markov, plain_greedy

# --------------------------------------------------------------------------
# The simulator: a batch whose acceptance and step cost are known
# --------------------------------------------------------------------------


def step_seconds(cost, rows, k, padded):
    """The simulated step time: fixed + per target token + per draft forward."""
    fixed, per_token, per_forward = cost
    width = int(max(k, default=0))
    computed = rows * (1 + width) if padded else rows + int(sum(k))
    return fixed + per_token * computed + per_forward * width


def rate(alpha, cost, k, padded=True):
    """Expected emitted tokens per second of the choice ``k`` (one count per row)."""
    tokens = sum(expected_emitted(a, int(j)) for a, j in zip(alpha, k, strict=True))
    return tokens / step_seconds(cost, len(alpha), k, padded)


def best_fixed(alpha, cost, max_k):
    """The best k shared by every row, by enumeration."""
    return max(range(max_k + 1), key=lambda k: rate(alpha, cost, [k] * len(alpha)))


def run_simulator(schedule, alpha, cost, steps, *, padded=True, exact=True, noise=0.0, seed=0):
    """``steps`` steps of a batch of ``len(alpha)`` requests: the schedule chooses,
    acceptance is observed (the exact probabilities, or Bernoulli counts), the
    step's time is observed (with relative Gaussian ``noise``). Returns the
    choices and the expected tokens per second the choices earned."""
    rng = np.random.default_rng(seed)
    requests = list(range(len(alpha)))
    choices, tokens, seconds = [], 0.0, 0.0
    for step in range(steps):
        choice = schedule.choose(requests, [schedule.max_k] * len(alpha), padded=padded)
        k = choice.k.tolist()
        choices.append(choice)
        if exact:
            schedule.observe(
                requests,
                k,
                [0] * len(k),
                acceptances=[[a] * j for a, j in zip(alpha, k, strict=True)],
            )
        else:
            accepted = []
            for a, j in zip(alpha, k, strict=True):
                n = 0
                while n < j and rng.random() < a:
                    n += 1
                accepted.append(n)
            schedule.observe(requests, k, accepted)
        true = step_seconds(cost, len(alpha), k, padded)
        if step:  # the first step feeds the prompts: not a cost the schedule sees
            schedule.observe_cost(
                true * (1 + noise * rng.standard_normal()),
                len(alpha) * (1 + max(k)) if padded else len(alpha) + sum(k),
                max(k),
            )
        tokens += sum(expected_emitted(a, j) for a, j in zip(alpha, k, strict=True))
        seconds += true
    return choices, tokens / seconds


# Each: the rows' acceptance, (fixed, per target token, per draft forward) seconds.
# Chosen so that the best shared k is interior, 0, or the most allowed.
SCENARIOS = {
    "batch 1, cheap tokens: the most drafts": ([0.8], (0.04, 0.0005, 0.0)),
    "batch 8, compute-bound: a few": ([0.8] * 8, (0.04, 0.004, 0.0)),
    "batch 8, low acceptance: none": ([0.3] * 8, (0.04, 0.004, 0.0)),
    "batch 16 with a draft model: none": ([0.5] * 16, (0.04, 0.004, 0.01)),
    "batch 4, mixed rows, a draft model": ([0.95, 0.9, 0.6, 0.2], (0.03, 0.002, 0.004)),
    "batch 2, expensive drafts": ([0.9, 0.9], (0.02, 0.0002, 0.015)),
}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_adaptive_k_picks_the_best_width_the_simulator_knows(scenario):
    alpha, cost = SCENARIOS[scenario]
    schedule = AdaptiveK(max_k=8, probe_every=0, prior_weight=1e-6)
    choices, _ = run_simulator(schedule, alpha, cost, 60)
    optimum = best_fixed(alpha, cost, 8)
    # Exact acceptance and exact times: after its two start steps the schedule has
    # both right, and chooses the best width at every later step.
    assert [c.reason for c in choices[:2]] == ["start", "start"]
    late = choices[10:]
    assert all(c.reason == "model" for c in late)
    assert {c.width for c in late} == {optimum}
    # The fitted cost predicts every width's time (the split between target tokens
    # and draft forwards is not identified at a constant batch, and not needed).
    for w in range(9):
        rows = len(alpha)
        predicted = schedule.predict_seconds(rows * (1 + w), w)
        assert predicted == pytest.approx(step_seconds(cost, rows, [w] * rows, True), rel=1e-6)
    if optimum:  # with drafting off nothing more is observed
        first = [schedule.acceptance(r)[0] for r in range(len(alpha))]
        np.testing.assert_allclose(first, alpha, rtol=1e-4)


def test_the_scenarios_cover_none_some_and_all():
    optima = {best_fixed(alpha, cost, 8) for alpha, cost in SCENARIOS.values()}
    assert 0 in optima and 8 in optima and optima - {0, 8}


def test_adaptive_k_turns_drafting_off_when_it_cannot_pay():
    alpha, cost = [0.05] * 8, (0.01, 0.004, 0.0)
    choices, earned = run_simulator(AdaptiveK(max_k=8, probe_every=0), alpha, cost, 200)
    assert all(c.width == 0 for c in choices[4:])
    assert earned >= 0.97 * rate(alpha, cost, [0] * 8)


@pytest.mark.parametrize("alpha", [[0.95, 0.5, 0.1], [0.7, 0.7, 0.7], [0.99, 0.2, 0.0]])
@pytest.mark.parametrize("cost", [(0.03, 0.002, 0.0), (0.01, 0.004, 0.002), (0.05, 0.0001, 0.0)])
def test_ragged_choice_is_the_best_of_every_count_vector(alpha, cost):
    """Ragged backends: the choice equals the best of all 5**3 count vectors."""
    schedule = AdaptiveK(max_k=4, probe_every=0, prior_weight=1e-6)
    choices, _ = run_simulator(schedule, alpha, cost, 40, padded=False)
    best = max(
        itertools.product(range(5), repeat=3),
        key=lambda k: (rate(alpha, cost, k, padded=False), -sum(k)),
    )
    assert choices[-1].k.tolist() == list(best)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_with_noise_and_counted_acceptance_it_earns_what_the_best_k_earns(scenario):
    """Bernoulli acceptance (counts only), 5% timing noise, probes on: over 400
    steps, at least 0.95 of the best fixed k's expected rate, and at least 0.97 of
    plain decoding's. Seeded: the same numbers every run."""
    alpha, cost = SCENARIOS[scenario]
    _, earned = run_simulator(AdaptiveK(max_k=8), alpha, cost, 400, exact=False, noise=0.05)
    best = rate(alpha, cost, [best_fixed(alpha, cost, 8)] * len(alpha))
    assert earned >= 0.95 * best
    assert earned >= 0.97 * rate(alpha, cost, [0] * len(alpha))


def test_acceptance_estimate_is_the_discounted_counts_per_depth_with_the_pooled_prior():
    schedule = AdaptiveK(max_k=3, memory=math.inf, prior_weight=2.0)
    assert schedule.acceptance("new").tolist() == [0.5, 0.5, 0.5]  # nothing seen by anyone
    # 4 drafted, 2 accepted: depths 0 and 1 accepted, depth 2 tried and rejected.
    schedule.observe(["a"], [4], [2])
    pooled = (1 + 0.5) / (1 + 1)  # depth 0 over all requests
    np.testing.assert_allclose(schedule.acceptance("b"), [pooled] * 3)
    d0 = (1 + 2 * pooled) / 3
    d1 = (1 + 2 * d0) / 3  # a deeper depth's prior: the request's depth above it
    d2 = (0 + 2 * d1) / 3
    np.testing.assert_allclose(schedule.acceptance("a"), [d0, d1, d2])
    # All 4 accepted: depths 0, 1, 2 (past max_k ignored) tried and accepted.
    schedule.observe(["a"], [4], [4])
    pooled = (2 + 0.5) / (2 + 1)
    d0 = (2 + 2 * pooled) / 4
    d1 = (2 + 2 * d0) / 4
    d2 = (1 + 2 * d1) / 4
    np.testing.assert_allclose(schedule.acceptance("a"), [d0, d1, d2])
    forgetting = AdaptiveK(max_k=1, memory=2.0, prior_weight=2.0)
    forgetting.observe(["a"], [1], [1])
    forgetting.observe(["a"], [1], [0])  # the older step weighs half
    pooled = (0.5 + 0.5) / (1.5 + 1)
    np.testing.assert_allclose(forgetting.acceptance("a"), [(0.5 + 2 * pooled) / (1.5 + 2)])
    forgetting.finish(["a"])
    np.testing.assert_allclose(forgetting.acceptance("a"), [pooled])


def test_observed_acceptances_replace_the_counts():
    schedule = AdaptiveK(max_k=3, memory=math.inf, prior_weight=1e-9)
    schedule.observe(["a"], [3], [0], acceptances=[[0.9, 0.8, 0.5]])
    np.testing.assert_allclose(schedule.acceptance("a"), [0.9, 0.8, 0.5], rtol=1e-6)
    # Deterministic drafts compared past the verified ones: 2 matched, then a miss.
    schedule.observe(["b"], [0], [0], acceptances=[[1.0, 1.0, 0.0]])
    np.testing.assert_allclose(schedule.acceptance("b"), [1.0, 1.0, 0.0], atol=1e-6)
    # A row given as None is observed by its counts (1 accepted of 3: depth 0
    # accepted, depth 1 rejected), beside a row given its probabilities.
    mixed, spelled = AdaptiveK(max_k=3), AdaptiveK(max_k=3)
    mixed.observe(["c", "d"], [3, 3], [1, 3], acceptances=[None, [0.5, 0.5, 0.5]])
    spelled.observe(["c", "d"], [3, 3], [1, 3], acceptances=[[1.0, 0.0], [0.5, 0.5, 0.5]])
    for request in "cd":
        np.testing.assert_allclose(mixed.acceptance(request), spelled.acceptance(request))
    assert mixed.acceptance("d")[2] < 0.6  # the given probabilities, not its counts (all 3)


def test_a_deeper_acceptance_changes_the_choice():
    """Prompt lookup: a first draft often wrong, later ones right once the first is
    (a copied span). The per-depth estimate sees it; one rate for all depths
    would not (the same total accepted over the same drafts)."""
    cost = (0.04, 0.002, 0.0)
    alpha = [0.4, 0.95, 0.95, 0.95]
    schedule = AdaptiveK(max_k=4, probe_every=0, prior_weight=1e-6)
    requests = list(range(4))
    for step in range(40):
        choice = schedule.choose(requests, [4] * 4)
        k = choice.k.tolist()
        schedule.observe(requests, k, [0] * 4, acceptances=[alpha[:j] for j in k])
        if step:
            schedule.observe_cost(step_seconds(cost, 4, k, True), 4 * (1 + max(k)), max(k))
    reach = np.cumprod([1.0, *alpha])
    rates = [4 * reach[: w + 1].sum() / step_seconds(cost, 4, [w] * 4, True) for w in range(5)]
    assert choice.width == int(np.argmax(rates)) == 4


def test_a_schedule_reused_across_runs_keeps_its_cost_fit():
    schedule = AdaptiveK(max_k=8, probe_every=0)
    run_simulator(schedule, [0.8] * 8, (0.04, 0.004, 0.0), 20)
    schedule.finish(range(8))
    assert schedule.choose([0, 1], [8, 8]).reason == "model"


def fitted(points, schedule_class=AdaptiveK):
    """``cost_model()`` after one measured step per ``(seconds, target tokens,
    draft forwards)``."""
    schedule = schedule_class(cost_memory=math.inf)
    for seconds, tokens, forwards in points:
        schedule.observe_cost(seconds, tokens, forwards)
    return schedule.cost_model()


def test_the_cost_fit_recovers_a_line_and_stays_non_negative(monkeypatch):
    """docs/spec.md section 13.3: the line through exact steps; never a negative
    coefficient; columns that moved together explained by the target's tokens."""
    line = [(0.01 + 0.002 * x + 0.005 * f, x, f) for x in (8, 16, 24, 40) for f in (0, 1, 3)]
    assert fitted(line) == pytest.approx((0.01, 0.002, 0.005), rel=1e-6)
    # A step that got cheaper with more tokens: no negative slope, the fixed cost.
    falling = [(0.05 - 0.001 * x, x, 0) for x in (8, 16, 24)]
    c0, c1, c2 = fitted(falling)
    assert min(c0, c1, c2) >= 0 and c1 == 0 and c0 == pytest.approx(0.034)
    # Batch 8, draft forwards f and target tokens 8 (1 + f): the target's tokens.
    together = [(0.02 + 0.003 * 8 * (1 + f), 8 * (1 + f), f) for f in (0, 1, 2, 4)]
    assert fitted(together) == pytest.approx((0.02, 0.003, 0.0), abs=1e-9)
    # The reference's subsets' systems solved one by one where the stacked solve
    # refuses.
    assert fitted(line, reference.AdaptiveK) == pytest.approx((0.01, 0.002, 0.005), rel=1e-6)
    solve = np.linalg.solve

    def refusing(a, b):
        if np.ndim(a) == 3:
            raise np.linalg.LinAlgError("Singular matrix")
        return solve(a, b)

    monkeypatch.setattr(np.linalg, "solve", refusing)
    assert fitted(line, reference.AdaptiveK) == pytest.approx((0.01, 0.002, 0.005), rel=1e-6)


# --------------------------------------------------------------------------
# HeuristicK: transformers' schedule
# --------------------------------------------------------------------------


def test_heuristic_k_is_transformers_rule():
    schedule = HeuristicK(start=4)
    ks = []
    for accepted in (4, 6, 3, 0, 0, 0, 0, 1, 1):
        k = int(schedule.choose(["r"], [100]).k[0])
        ks.append(k)
        schedule.observe(["r"], [k], [accepted])
    # +2 after a fully accepted step, -1 otherwise, never below 1
    assert ks == [4, 6, 8, 7, 6, 5, 4, 3, 2]
    assert int(schedule.choose(["r"], [100]).k[0]) == 1
    assert int(schedule.choose(["r"], [0]).k[0]) == 0  # the room cuts it
    schedule.observe(["r"], [0], [0])  # nothing drafted: unchanged
    assert schedule.current("r") == 1
    assert HeuristicK(start=20, max_k=6).choose(["x"], [100]).k.tolist() == [6]


# --------------------------------------------------------------------------
# Inside generate
# --------------------------------------------------------------------------

PROMPTS = [[0, 1, 2, 0, 1], [3, 3, 3, 2], [6, 0, 5, 6, 0, 5]]
SCHEDULES = {
    "auto": lambda: "auto",
    "AdaptiveK(max_k=5)": lambda: AdaptiveK(max_k=5),
    "HeuristicK(start=3)": lambda: HeuristicK(start=3),
}


@pytest.fixture
def steady_clock(monkeypatch):
    """``generate``'s clock, advancing 1 ms a reading: every step takes as long
    whatever it drafts (drafting is free, so AdaptiveK drafts), and what a
    schedule chooses does not hang on this machine's load."""
    from specaccept.generation import _loop

    ticks = itertools.count()
    monkeypatch.setattr(
        _loop, "time", types.SimpleNamespace(perf_counter=lambda: next(ticks) / 1e3)
    )


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("drafter", ["model", "lookup"])
@pytest.mark.usefixtures("steady_clock")
def test_greedy_with_a_schedule_equals_plain_greedy(schedule, drafter):
    target = Markov(7, 3, seed=1)
    draft = Markov(7, 2, seed=2) if drafter == "model" else specaccept.PromptLookup()
    out = specaccept.generate(
        target, draft, PROMPTS, k=SCHEDULES[schedule](), max_new_tokens=30, greedy=True
    )
    assert out.tokens == [plain_greedy(target, p, 30) for p in PROMPTS]
    # One choice per step, within what each row could draft, and what was drafted.
    assert len(out.schedule) == len(out.step_seconds)
    assert all((c.k <= c.available).all() for c in out.schedule)
    drafted = sum(int(c.k.sum()) for c in out.schedule)
    assert drafted == out.stats.total_draft_tokens > 0


@pytest.mark.parametrize("schedule", [*SCHEDULES, 0, 1, 2, 4, 8])
@pytest.mark.usefixtures("steady_clock")
def test_a_seeded_request_with_lookup_drafts_has_its_plain_decoding_text(schedule):
    """Seeded deterministic drafts: the text is the request's plain decoding (k = 0)
    text, whatever k a schedule picks and whatever else is in the batch."""
    target = Markov(7, 3, seed=1)
    options = dict(max_new_tokens=40, seed=3, temperature=0.9)
    plain = specaccept.generate(target, specaccept.PromptLookup(), PROMPTS, k=0, **options)
    k = SCHEDULES[schedule]() if isinstance(schedule, str) else schedule
    out = specaccept.generate(target, specaccept.PromptLookup(), PROMPTS, k=k, **options)
    assert out.tokens == plain.tokens
    if schedule:
        assert out.stats.num_accepted_tokens > 0  # drafts were kept, not just tried
    alone = specaccept.generate(target, specaccept.PromptLookup(), PROMPTS[1:2], k=k, **options)
    assert alone.tokens == plain.tokens[1:2]


def test_schedule_options_are_checked():
    target, draft = Markov(5, 2, seed=1), Markov(5, 2, seed=2)
    for bad, kind in (("fast", InputError), (1.5, TypeError), (True, TypeError)):
        with pytest.raises(kind, match="k"):
            specaccept.generate(target, draft, [[1]], k=bad)
    with pytest.raises(InputError, match="tree") as raised:
        specaccept.generate(target, draft, [[1]], k="auto", tree=[2])
    assert raised.value.argument == "k"


def test_bad_schedule_arguments():
    for kwargs, kind, name in (
        (dict(max_k=-1), InputError, "max_k"),
        (dict(max_k=2, min_k=3), InputError, "min_k"),
        (dict(max_k=1.5), TypeError, "max_k"),
        (dict(memory=0.5), InputError, "memory"),
        (dict(memory=float("nan")), InputError, "memory"),
        (dict(cost_memory="x"), TypeError, "cost_memory"),
        (dict(prior_weight=0), InputError, "prior_weight"),
        (dict(start=9), InputError, "start"),
        (dict(probe_every=-1), InputError, "probe_every"),
    ):
        with pytest.raises(kind, match=name):
            AdaptiveK(**kwargs)
    with pytest.raises(InputError, match="start"):
        HeuristicK(start=-1)
    schedule = AdaptiveK()
    for call, kind in (
        (lambda: schedule.choose([1, 2], [1]), InputError),
        (lambda: schedule.choose([1, 1], [1, 1]), InputError),
        (lambda: schedule.choose([[1]], [1]), TypeError),
        (lambda: schedule.choose("ab", [1, 1]), TypeError),
        (lambda: schedule.choose([1], [-1]), InputError),
        (lambda: schedule.choose([1], [1.5]), TypeError),
        (lambda: schedule.observe([1], [2], [3]), InputError),
        (lambda: schedule.observe([1], [2], [1], acceptances=[[1.0], [1.0]]), InputError),
        (lambda: schedule.observe([1], [2], [1], acceptances=[[2.0]]), InputError),
        (lambda: schedule.observe([1], [2], [1], acceptances=[[math.nan]]), InputError),
        (lambda: schedule.observe([1], [2], [1], acceptances=[["x"]]), TypeError),
        (lambda: schedule.observe([1], [2], [1], acceptances=[[[0.5]]]), TypeError),
        (lambda: schedule.observe([1], [2], [1], acceptances="ab"), TypeError),
        (lambda: AdaptiveK(max_k=10**6), InputError),
        (lambda: schedule.observe_cost(-1.0, 4), InputError),
        (lambda: schedule.observe_cost(math.inf, 4), InputError),
        (lambda: schedule.observe_cost(1.0, -4), InputError),
        (lambda: schedule.observe_cost("1", 4), TypeError),
    ):
        with pytest.raises(kind):
            call()
    # Nothing bad was kept: the schedule still works.
    assert schedule.choose([1], [3]).k.tolist() == [3]  # start (4), capped


def test_deterministic_drafts_are_observed_even_when_none_is_verified():
    """Prompt lookup proposes every step; a schedule that verifies none (start 0,
    nothing fitted) still learns the proposals' acceptance from the emitted tokens
    (docs/spec.md section 13.2): greedy text that repeats itself is predictable."""
    target = Markov(7, 3, seed=1)
    schedule = AdaptiveK(max_k=4, start=0)
    out = specaccept.generate(
        target, specaccept.PromptLookup(), PROMPTS, k=schedule, max_new_tokens=40, greedy=True
    )
    assert out.stats.total_draft_tokens == 0  # nothing was verified
    last = out.schedule[-1]
    assert (last.acceptance > 0.7).all()  # from the prior of 0.5, by observation alone


def test_k_auto_keeps_one_schedule_per_target_and_drafter():
    """k="auto" starts a later call from what earlier ones measured: the same
    AdaptiveK for the same target and drafter (every PromptLookup alike), another
    for another drafter or target."""
    from specaccept.generation._loop import auto_schedule, drafter_key

    target, draft = Markov(7, 3, seed=1), Markov(7, 2, seed=2)
    options = dict(k="auto", max_new_tokens=30, greedy=True)
    first = specaccept.generate(target, specaccept.PromptLookup(), PROMPTS, **options)
    assert first.schedule[0].reason == "start"
    again = specaccept.generate(target, specaccept.PromptLookup(max_ngram=3), PROMPTS, **options)
    assert again.schedule[0].reason == "model"  # its cost already fitted
    kept = auto_schedule(target, drafter_key(specaccept.PromptLookup()))
    assert kept is auto_schedule(target, "lookup")
    assert kept is not auto_schedule(target, drafter_key(draft))
    assert kept is not auto_schedule(Markov(7, 3, seed=1), "lookup")
    other = specaccept.generate(target, draft, PROMPTS, **options)
    assert other.schedule[0].reason == "start"
    # A draft model starts at one draft (each costs a forward); lookup at max_k // 2.
    assert other.schedule[0].k.tolist() == [1] * len(PROMPTS)
    start = first.schedule[0]
    assert start.k.tolist() == np.minimum(start.available, 4).tolist() and start.k.max() > 1


def test_recorded_steps_carry_each_choice(tmp_path):
    """record= with a schedule: per recorded row its request, step, what it could
    draft and the acceptance per depth the choice used; the laboratory still
    loads the file."""
    from specaccept.lab._steps import load_steps

    target, draft = Markov(7, 3, seed=1), Markov(7, 2, seed=2)
    path = tmp_path / "steps.npz"
    out = specaccept.generate(
        target, draft, PROMPTS, k=AdaptiveK(max_k=5), max_new_tokens=20, rng=0, record=path
    )
    data = np.load(path)
    rows = len(data["num_draft_tokens"])
    assert rows == sum(len(c.requests) for c in out.schedule)  # no row failed
    assert set(data["request"].tolist()) == {0, 1, 2}
    assert (data["num_draft_tokens"] <= data["available"]).all()
    assert data["estimated_acceptance"].shape == (rows, 5)
    first = out.schedule[0]
    np.testing.assert_allclose(data["estimated_acceptance"][:3], first.acceptance, rtol=1e-6)
    assert data["step"][:3].tolist() == [0, 0, 0] and data["step"][-1] == len(out.schedule) - 1
    ids, _, _, counts = load_steps(str(path))
    assert len(ids) == rows and (counts == data["num_draft_tokens"]).all()


class Spy(AdaptiveK):
    """An AdaptiveK that keeps what the loop tells it."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.seen: list[tuple[list, list, list, list]] = []

    def observe(self, requests, drafted, accepted, *, acceptances=None):
        self.seen.append((list(requests), list(drafted), list(accepted), acceptances))
        super().observe(requests, drafted, accepted, acceptances=acceptances)


def test_sampled_drafts_from_probabilities_are_observed_by_their_exact_acceptance():
    """Rows the verifier reads as probabilities: each draft's acceptance
    probability sum_x min(p(x), q(x)), computed here from the models' own tables
    at the drafted prefix; greedy rows are observed by what they accepted."""
    target, draft = Markov(7, 3, seed=1), Markov(7, 2, seed=2)
    spy = Spy(max_k=3, start=3)
    sequences = [list(p) for p in PROMPTS]
    out = specaccept.generate(
        target, draft, PROMPTS, k=spy, max_new_tokens=12, rng=5, temperature=[1.0, 1.0, 0.0]
    )
    first = spy.seen[0]
    assert first[0] == [0, 1, 2] and first[1] == [3, 3, 3]
    for b in (0, 1):
        tokens = out.tokens[b]
        drafts = tokens[: first[2][b]]  # the accepted drafts are the first tokens
        expected = []
        for t in range(3):
            prefix = sequences[b] + drafts[:t]
            if t > len(drafts):
                break
            p, q = target.distribution(prefix), draft.distribution(prefix)
            expected.append(float(np.minimum(p, q).sum()))
        got = first[3][b]
        assert len(got) == 3
        # The prefix is known up to the first rejection: the rates there must match.
        np.testing.assert_allclose(got[: len(expected)], expected, rtol=1e-9)
    assert first[3][2] is None  # the greedy row: observed by its counts
