"""``SPECACCEPT_VLLM_K=auto`` (specaccept/compat/vllm_schedule.py, docs/serving.md
"Choosing k each step in vLLM") without vLLM: the trimmer between vLLM's hooks,
driven with objects of the shapes vLLM 0.32 hands it. vLLM's engine running it
is tested in tests/test_vllm_plugin.py (the ``vllm`` CI stage)."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import pytest
from specaccept import AdaptiveK, KChoice
from specaccept.compat import vllm_plugin, vllm_schedule
from specaccept.compat.vllm_schedule import _Trimmer


@dataclass
class DraftTokenIds:  # vllm.v1.outputs.DraftTokenIds
    req_ids: list[str]
    draft_token_ids: list[list[int]]


def scheduled(
    drafts: dict[str, list[int]],
    tokens: dict[str, int] | None = None,
    finished=(),
    waiting: int | None = None,
):
    """A ``SchedulerOutput``: ``drafts`` verified per request, ``tokens`` computed
    (default: each request's last token and its drafts); ``waiting``: what the
    plugin's scheduler hook set (``None``: not set)."""
    tokens = tokens or {r: 1 + len(d) for r, d in drafts.items()}
    output = SimpleNamespace(
        scheduled_spec_decode_tokens={r: d for r, d in drafts.items() if d},
        num_scheduled_tokens=tokens,
        total_num_scheduled_tokens=sum(tokens.values()),
        finished_req_ids=set(finished),
    )
    if waiting is not None:
        setattr(output, vllm_schedule.WAITING, waiting)
    return output


def emitted(tokens: dict[str, list[int]]):
    """A ``ModelRunnerOutput``: the tokens each request emitted this step."""
    ids = list(tokens)
    return SimpleNamespace(
        req_ids=ids,
        req_id_to_index={r: i for i, r in enumerate(ids)},
        sampled_token_ids=[tokens[r] for r in ids],
    )


class Spy(AdaptiveK):
    """An AdaptiveK that keeps what it was told."""

    def __post_init__(self):
        super().__post_init__()
        self.told: list[tuple] = []
        self.costs: list[tuple] = []
        self.remaining: list = []

    def choose(self, requests, available, *, padded=True, remaining=None):
        self.remaining.append(None if remaining is None else list(remaining))
        return super().choose(requests, available, padded=padded, remaining=remaining)

    def observe(self, requests, drafted, accepted, *, acceptances=None):
        self.told.append((list(requests), list(drafted), list(accepted), acceptances))
        super().observe(requests, drafted, accepted, acceptances=acceptances)

    def observe_cost(self, seconds, target_tokens, draft_forwards=0):
        self.costs.append((seconds, target_tokens, draft_forwards))
        super().observe_cost(seconds, target_tokens, draft_forwards)


def trimmer(max_k=4, record=None, method="ngram") -> _Trimmer:
    t = _Trimmer(max_k, record, method)
    t.schedule = Spy(max_k=max_k)
    return t


def test_the_proposals_are_trimmed_to_the_choice_and_left_as_they_were():
    t = trimmer()
    proposals = [[1, 2, 3, 4], [5], []]
    drafts = DraftTokenIds(["a", "b", "c"], proposals)
    out = t.trim(drafts)
    # The first choice is AdaptiveK's start: max_k // 2 = 2 drafts, capped by each proposal.
    assert isinstance(out, DraftTokenIds)
    assert out.req_ids == ["a", "b", "c"]
    assert out.draft_token_ids == [[1, 2], [5], []]
    assert proposals == [[1, 2, 3, 4], [5], []]  # vLLM's own lists untouched
    assert t.proposals == {"a": [1, 2, 3, 4], "b": [5]}


def test_the_whole_proposal_is_observed_against_the_emitted_tokens():
    t = trimmer()
    t.trim(DraftTokenIds(["a", "b", "c"], [[1, 2, 3, 4], [5, 6], []]))  # kept: [1, 2], [5, 6]
    t.start(scheduled({"a": [1, 2], "b": [5, 6], "c": []}))
    # a: both drafts accepted and the bonus token is the proposal's third (3);
    # b: its first draft rejected; c: nothing drafted or proposed.
    t.observe(emitted({"a": [1, 2, 3], "b": [7], "c": [9]}))
    assert t.schedule.told == [(["a", "b"], [2, 2], [2, 0], [[1.0, 1.0, 1.0], [0.0]])]
    # The same observation spelled out gives the same estimates; the verifier's
    # counts alone would know nothing of a's third depth.
    spelled = AdaptiveK(max_k=4)
    spelled.observe(["a", "b"], [2, 2], [2, 0], acceptances=[[1, 1, 1], [0]])
    counts = AdaptiveK(max_k=4)
    counts.observe(["a", "b"], [2, 2], [2, 0])
    np.testing.assert_array_equal(t.schedule.acceptance("a"), spelled.acceptance("a"))
    assert t.schedule.acceptance("a")[2] > counts.acceptance("a")[2]


def test_a_request_trimmed_to_no_drafts_is_still_observed():
    t = trimmer()
    t.schedule.choose = lambda requests, available, **_: SimpleNamespace(  # type: ignore[method-assign]
        k=np.zeros(len(requests), dtype=np.int64),
        requests=tuple(requests),
        available=np.asarray(available),
    )
    t.trim(DraftTokenIds(["a"], [[4, 5]]))
    t.start(scheduled({"a": []}))
    t.observe(emitted({"a": [4]}))  # the one token emitted is the proposal's first
    assert t.schedule.told == [(["a"], [0], [0], [[1.0]])]


def test_only_whole_decoding_steps_are_timed():
    t = trimmer()
    t.start(scheduled({"a": []}, tokens={"a": 40}))  # the prompt
    t.trim(DraftTokenIds(["a"], [[1, 2, 3]]))  # no step before it: not timed
    t.start(scheduled({"a": [1, 2]}))
    t.trim(DraftTokenIds(["a"], [[3]]))
    t.start(scheduled({"a": [3], "b": []}, tokens={"a": 2, "b": 17}))  # b's prompt joins
    t.trim(DraftTokenIds(["a", "b"], [[], []]))
    assert [c[1:] for c in t.schedule.costs] == [(3, 0)]
    assert 0 < t.schedule.costs[0][0] < 60


def test_finished_requests_are_forgotten():
    t = trimmer()
    t.trim(DraftTokenIds(["a", "b"], [[1], [2]]))
    t.start(scheduled({"a": [1], "b": [2]}))
    t.observe(emitted({"a": [1, 5], "b": [3]}))
    assert t.schedule.acceptance("a")[0] > t.schedule.pooled()
    t.start(scheduled({"b": []}, finished={"a"}))
    assert "a" not in t.proposals
    np.testing.assert_array_equal(t.schedule.acceptance("a"), np.full(4, t.schedule.pooled()))


def test_a_failure_stops_the_trimming_and_leaves_vllm_s_drafts(caplog):
    t = trimmer()

    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    t.schedule.choose = broken  # type: ignore[method-assign]
    drafts = DraftTokenIds(["a"], [[1, 2]])
    with caplog.at_level(logging.ERROR, logger="vllm.specaccept"):
        assert t.guarded("choose", t.trim, drafts) is None
        assert t.guarded("observe", t.observe, emitted({"a": [1]})) is None
    assert t.broken
    assert sum("SPECACCEPT_VLLM_K=auto stopped" in r.getMessage() for r in caplog.records) == 1


def test_each_choice_is_recorded(tmp_path):
    path = tmp_path / "k.jsonl"
    t = trimmer(record=str(path))
    t.trim(DraftTokenIds(["a", "b"], [[1, 2, 3], []]))
    t.start(scheduled({"a": [1, 2]}))
    t.observe(emitted({"a": [1, 9]}))
    t.trim(DraftTokenIds(["a", "b"], [[4], [5, 6]]))
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2]
    assert lines[0]["k"] == [2, 0] and lines[0]["available"] == [3, 0]
    assert lines[0]["reason"] == "start" and lines[0]["previous_step_seconds"] is None
    assert [line["proposed"] for line in lines] == [3, 2]
    assert lines[1]["requests"] == ["a", "b"] and lines[1]["available"] == [1, 2]
    assert lines[1]["previous_step_seconds"] > 0
    assert len(lines[1]["acceptance"]) == 2 and len(lines[1]["acceptance"][0]) == 4
    first, second = lines[1]["acceptance"][0][:2]
    assert second < 0.6 < first  # a: its first draft accepted, its second rejected


def runner(method="ngram", k=4):
    config = None if method is None else SimpleNamespace(method=method)
    return SimpleNamespace(speculative_config=config, num_spec_tokens=k)


def test_a_runner_it_cannot_serve_keeps_its_drafts_and_the_log_says_why(caplog):
    with caplog.at_level(logging.WARNING, logger="vllm.specaccept"):
        assert _Trimmer.for_runner(runner(None, 0)) is None
        assert _Trimmer.for_runner(runner("eagle")) is None
    text = caplog.text
    assert "speculative decoding is off" in text
    assert "method='eagle'" in text and "num_speculative_tokens=4" in text
    made = _Trimmer.for_runner(runner("ngram", 8))
    assert made is not None and made.schedule.max_k == 8 and not made.before_drafting
    made = _Trimmer.for_runner(runner("draft_model", 8))
    assert made is not None and made.schedule.max_k == 8 and made.before_drafting


def model_runner(requests, states=None, max_model_len=512):
    """vLLM's model runner: its batch's requests, and ``states``: request ->
    ``(max_tokens, output tokens, prompt tokens)`` as its ``CachedRequestState``s."""
    return SimpleNamespace(
        input_batch=SimpleNamespace(req_ids=list(requests)),
        requests={
            r: SimpleNamespace(
                sampling_params=SimpleNamespace(max_tokens=most),
                output_token_ids=[7] * out,
                num_tokens=prompt + out,
            )
            for r, (most, out, prompt) in (states or {}).items()
        },
        max_model_len=max_model_len,
    )


def test_a_draft_model_drafts_the_widest_choice_and_each_request_keeps_its_own():
    """With a draft model the choice comes before drafting: the drafter runs the
    widest request's count, each request keeps its own, and the step's cost is
    observed with the draft model's forwards."""
    t = trimmer(max_k=4, method="draft_model")
    t.schedule = Spy(max_k=4, start=3)
    width = t.choose_before(model_runner(["a", "b"]), 4)
    assert width == 3  # nothing measured: AdaptiveK's start
    out = t.trim(DraftTokenIds(["a", "b"], [[1, 2, 3], [4, 5, 6]]))
    assert out.draft_token_ids == [[1, 2, 3], [4, 5, 6]]
    # The scheduler's width caps the choice; the choice is per request.
    t.schedule.choose = lambda requests, available, padded=True, remaining=None: KChoice(
        tuple(requests), np.array([2, 0]), np.array(available), np.zeros((2, 4)), 1.0, 1.0, "model"
    )
    t.start(scheduled({"a": [1, 2, 3], "b": [4, 5, 6]}))
    t.observe(emitted({"a": [1, 2, 7], "b": [4, 9]}))
    assert t.schedule.told[-1][:3] == (["a", "b"], [3, 3], [2, 1])
    assert t.choose_before(model_runner(["a", "b"]), 2) == 2
    out = t.trim(DraftTokenIds(["a", "b"], [[8, 9], [10, 11]]))
    assert out.draft_token_ids == [[8, 9], []]
    # The step measured: the target verified 1 + 3 tokens per request, and the
    # draft model then ran 2 forwards for the next step's drafts.
    assert t.schedule.costs[-1][1:] == (8, 2)


def scripted_choices(t, script):
    """``t``'s schedule answering each ``choose`` with the next ``(k, reason)`` of
    ``script`` (capped by what is available); the available counts it was given."""
    given = []
    answers = iter(script)

    def choose(requests, available, padded=True, remaining=None):
        given.append(list(available))
        k, reason = next(answers)
        k = np.minimum(np.array(k), np.array(available))
        n = len(requests)
        return KChoice(tuple(requests), k, np.array(available), np.zeros((n, 4)), 1.0, 1.0, reason)

    t.schedule.choose = choose
    return given


def test_a_request_given_no_drafts_is_parked_and_a_step_of_parked_requests_skips_the_drafter():
    """A request the model gave no drafts PARK_AFTER modelled steps running never
    drafts again (nothing available to it); the start's alternation does not
    count; a step whose requests are all parked skips the drafter, and its cost
    is observed with no draft forward (a step that drafted nothing but ran the
    drafter's pass: one); a finished request is forgotten, a new one drafts."""
    park = vllm_schedule.PARK_AFTER
    t = trimmer(max_k=4, method="draft_model")
    script = [([0, 0], "start")] * 3 + [([0, 2], "model")] * park + [([3, 0], "model")] * park
    script += [([1, 1], "model")]
    given = scripted_choices(t, script)
    requests = ["a", "b"]
    costs = []
    for step in range(len(script) - 1):
        t.start(scheduled({r: [] for r in requests}))
        t.observe(emitted({r: [7] for r in requests}))
        t.choose_before(model_runner(requests), 4)
        skipped = t.skipped
        drafts = [[] for _ in requests] if skipped else [[1, 2, 3, 4] for _ in requests]
        t.trim(DraftTokenIds(requests, drafts))
        costs.append((step, skipped, t.schedule.costs[-1][2] if t.schedule.costs else None))
    start, a_idle, b_idle = 3, 3 + park, 3 + 2 * park
    # Not parked by the start's choices; "a" parked at its park-th idle step.
    assert given[start] == [4, 4] and given[a_idle - 1] == [4, 4]
    assert given[a_idle] == [0, 4]
    assert t.parked == {"a", "b"}
    skipped_steps = [step for step, skipped, _ in costs if skipped]
    assert skipped_steps == [b_idle - 1]  # "b" parked there: every request parked
    # Each step's cost is observed at its take, with the drafter's forwards of
    # its own choice: none where skipped, one where the widest choice was 0 but
    # the drafter ran its pass, else the width.
    forwards = {step: f for step, _, f in costs}
    assert forwards[b_idle - 1] == 0
    assert forwards[1] == 1  # the start's [0, 0]: the drafter's pass alone
    assert forwards[start] == 2  # [0, 2]
    # "b" finishes; "c" joins: not parked, so the drafter runs for its prompt.
    t.start(scheduled({"a": []}, finished=["b"]))
    assert t.parked == {"a"}
    t.choose_before(model_runner(["a", "c"]), 4)
    assert given[-1] == [0, 4] and not t.skipped


def test_a_draft_model_s_drafts_it_did_not_choose_are_left_as_they_are():
    t = trimmer(method="draft_model")
    t.choose_before(model_runner(["a", "b"]), 4)
    drafts = DraftTokenIds(["b", "a"], [[1, 2], [3, 4]])
    assert t.trim(drafts) is None  # another order: not the requests it chose for
    assert t.trim(DraftTokenIds(["a"], [[1]])) is None  # nothing chosen before drafting


def test_a_value_other_than_auto_is_refused_in_the_log(caplog):
    with caplog.at_level(logging.WARNING, logger="vllm.specaccept"):
        assert vllm_schedule.install("4") is False
    assert "SPECACCEPT_VLLM_K='4' is not one of ('auto',)" in caplog.text


def test_the_switch_without_the_plugin_is_said(monkeypatch, caplog):
    monkeypatch.delenv("SPECACCEPT_VLLM", raising=False)
    monkeypatch.setenv("SPECACCEPT_VLLM_K", "auto")
    with caplog.at_level(logging.WARNING, logger="vllm.specaccept"):
        vllm_plugin.register()
    assert "SPECACCEPT_VLLM_K is set but SPECACCEPT_VLLM is not" in caplog.text


@pytest.mark.parametrize(
    "tokens, drafts, expected",
    [
        ({"a": 3, "b": 1}, {"a": [1, 2]}, True),
        ({"a": 3, "b": 5}, {"a": [1, 2]}, False),  # b processes a prompt chunk
        ({}, {}, False),
    ],
)
def test_a_decoding_step_is_one_token_and_the_drafts_per_request(tokens, drafts, expected):
    assert vllm_schedule._decode_only(scheduled(drafts, tokens)) is expected


def test_with_no_request_waiting_the_choice_weighs_each_request_s_remaining_tokens():
    """The scheduler's hook says how many requests wait; with none waiting the
    choice is given each request's max_tokens less its output (at most its room
    below max_model_len, at least 1), and recorded; with some waiting, or not
    said, none (each step's tokens per second)."""
    states = {"a": (64, 10, 20), "b": (64, 60, 20), "c": (600, 0, 500), "d": (8, 8, 3)}
    runner = model_runner(list(states), states, max_model_len=512)
    drafts = DraftTokenIds(list(states), [[1, 2]] * 4)
    t = trimmer()
    for waiting in (0, 3, None, 0):
        t.start(scheduled({r: [] for r in states}, waiting=waiting))
        t.trim(drafts, runner)
    assert t.schedule.remaining == [[54, 4, 12, 1], None, None, [54, 4, 12, 1]]
    # Without the runner's request states (or one request's, or its output), nothing
    # is passed, and the choosing goes on.
    t.start(scheduled({"a": []}, waiting=0))
    t.trim(DraftTokenIds(["a", "e"], [[1], [2]]), runner)
    t.trim(DraftTokenIds(["a"], [[1]]))
    del runner.requests["b"].output_token_ids
    t.trim(drafts, runner)
    assert t.schedule.remaining[-3:] == [None, None, None] and not t.broken
    # A draft model's choice, before drafting (before vLLM's bookkeeping), is given
    # them less the tokens sampled this step (ids >= 0 of each row, none for a row
    # vLLM discards); without the sampled rows, none.
    d = trimmer(method="draft_model")
    runner = model_runner(list(states), states, max_model_len=512)
    sampled = np.array([[5, 0, -1], [0, -1, -1], [5, 6, 7], [5, 6, -1]])  # (0: a token)
    for discard in (None, [False, True, False, False]):
        if discard is not None:
            runner.discard_request_mask = SimpleNamespace(np=np.array(discard + [True] * 4))
        d.start(scheduled({r: [] for r in states}, waiting=0))
        d.choose_before(runner, 4, sampled)
    d.choose_before(runner, 4)
    d.choose_before(runner, 4, sampled[:2])
    d.choose_before(runner, 4, sampled[:, 0])
    # (disable_padded_drafter_batch: lists, after vLLM's bookkeeping.)
    d.choose_before(runner, 4, [[5, 0], [0], [5, 6, 7], [5, 6]])
    assert d.schedule.remaining == [
        [52, 3, 9, 1],
        [52, 4, 9, 1],
        None,
        None,
        None,
        [54, 4, 12, 1],
    ]
    assert not d.broken


def test_the_step_objective_never_weighs_the_remaining_tokens(monkeypatch, caplog):
    """SPECACCEPT_VLLM_K_OBJECTIVE=step: each step's tokens per second, with no
    request waiting too; a value it does not know is said and 'auto' used."""
    states = {"a": (64, 10, 20), "b": (64, 60, 20)}
    runner = model_runner(list(states), states)
    config = SimpleNamespace(method="ngram")
    made = {}
    with caplog.at_level(logging.INFO, logger="vllm.specaccept"):
        for value in ("step", "", "fastest"):
            monkeypatch.setenv("SPECACCEPT_VLLM_K_OBJECTIVE", value)
            made[value] = _Trimmer.for_runner(
                SimpleNamespace(speculative_config=config, num_spec_tokens=4)
            )
    assert [made[v].objective for v in ("step", "", "fastest")] == ["step", "auto", "auto"]
    messages = [r.getMessage() for r in caplog.records]
    assert sum("objective 'step'" in m for m in messages) == 1
    assert sum("SPECACCEPT_VLLM_K_OBJECTIVE='fastest' is not one of" in m for m in messages) == 1
    for value, want in (("step", None), ("", [54, 4])):
        t = made[value]
        t.schedule = Spy(max_k=4)
        t.start(scheduled({r: [] for r in states}, waiting=0))
        t.trim(DraftTokenIds(list(states), [[1, 2]] * 2), runner)
        assert t.schedule.remaining == [want]


def test_the_waiting_and_remaining_tokens_are_recorded(tmp_path):
    path = tmp_path / "k.jsonl"
    t = trimmer(record=str(path))
    runner = model_runner(["a"], {"a": (16, 4, 9)})
    t.start(scheduled({"a": []}, waiting=0))
    t.trim(DraftTokenIds(["a"], [[1, 2]]), runner)
    t.start(scheduled({"a": []}, waiting=2))
    t.trim(DraftTokenIds(["a"], [[1, 2]]), runner)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(line["waiting"], line["remaining"]) for line in lines] == [(0, [12]), (2, None)]


def test_the_scheduler_hook_counts_vllm_s_waiting_requests_and_a_failure_is_said_once(caplog):
    output = SimpleNamespace()
    vllm_schedule._count_waiting(SimpleNamespace(get_request_counts=lambda: (16, 5)), output)
    assert getattr(output, vllm_schedule.WAITING) == 5

    def broken():
        raise AttributeError("no queue")

    vllm_schedule._COUNT_FAILED.clear()
    with caplog.at_level(logging.WARNING, logger="vllm.specaccept"):
        for _ in range(3):
            unset = SimpleNamespace()
            vllm_schedule._count_waiting(SimpleNamespace(get_request_counts=broken), unset)
            assert not hasattr(unset, vllm_schedule.WAITING)
    assert (
        sum("cannot count vLLM's waiting requests" in r.getMessage() for r in caplog.records) == 1
    )
    vllm_schedule._COUNT_FAILED.clear()
