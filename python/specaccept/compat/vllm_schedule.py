"""``SPECACCEPT_VLLM_K=auto``: vLLM's drafts chosen each step by :class:`AdaptiveK`.

Part of the vLLM plugin (:mod:`specaccept.compat.vllm_plugin` installs it, with
the plugin on, when ``SPECACCEPT_VLLM_K=auto``; off by default). vLLM's engine
(V1, no asynchronous scheduling: the CPU platform's) runs per step::

    scheduler.schedule -> runner.execute_model -> runner.sample_tokens
    (verification, then runner.propose_draft_token_ids: the proposer)
    -> runner.take_draft_token_ids -> scheduler.update_draft_token_ids
    (the next step's drafts)

Here, in the process of vLLM's model runner (``GPUModelRunner``, which the CPU
runner is):

- ``execute_model``: the requests vLLM finished since the previous step are
  forgotten (``AdaptiveK.finish``);
- ``sample_tokens``: what verification kept, per request, is observed: the drafts
  it verified, the accepted ones, and the whole proposal of the previous step
  (before it was trimmed) compared with the tokens the step emitted (docs/spec.md
  section 13.2: the proposal is deterministic, so a draft trimmed away is still
  observed);
- with a draft model (``method="draft_model"``), ``propose_draft_token_ids``:
  ``AdaptiveK`` chooses each request's drafts *before* the draft model runs, and
  the drafter runs the widest request's count (``num_spec_tokens_to_schedule``,
  vLLM's own per-step width, lowered for the call): a draft not chosen is a
  forward not paid. vLLM's drafter still runs one forward over the step's tokens
  when nothing is drafted (its cache kept in step), so a request the model gives
  no drafts (:data:`PARK_AFTER` steps running) is *parked*: it drafts nothing until
  it finishes, and a step whose requests are all parked skips the drafter (no
  forward at all: plain decoding's cost). A parked request's drafter cache falls
  behind, which is why it never drafts again; every other request was in every
  step the drafter ran since its prompt, so its drafter cache is whole;
- ``take_draft_token_ids``: the step's wall time (from the previous step's
  drafts to this one's: the whole engine step, scheduling included) is observed
  against the tokens the target computed (``total_num_scheduled_tokens``; not for
  a step that also processed prompts) and the draft model's forwards; then, with
  n-gram drafts, ``AdaptiveK(max_k=num_speculative_tokens)`` chooses, per
  request, how many of the proposer's drafts are kept (ragged: vLLM computes
  each request's own positions), and the proposals are trimmed; with a draft
  model, each request's drafts are trimmed to the count chosen before drafting.

``num_speculative_tokens`` is the most a request drafts. The objective
(docs/spec.md section 13.3) is the step's expected emitted tokens per second
(continuous batching) while requests wait for a slot; when none waits, the
batch is run to its end before another request joins, so each request's
``remaining`` tokens (its ``max_tokens`` less what it emitted) are passed and the
choice maximises the rate at which the slowest request finishes
(``SPECACCEPT_VLLM_K_OBJECTIVE=step``: each step's tokens per second always). vLLM's
scheduler, in the engine's process, says how many wait: ``Scheduler.schedule``
is wrapped to set :data:`WAITING` on the ``SchedulerOutput`` it hands the
runner (pickled with it to a worker process). Verification is untouched: a
trimmed draft is simply not drafted. ``SPECACCEPT_VLLM_K_RECORD=path.jsonl``
writes each step's choice (one JSON line: requests, k, available, acceptance
per depth, expected tokens, predicted and measured seconds, reason, waiting,
remaining). Any failure here logs once and leaves vLLM's drafts
as they were for the rest of the run: never takes vLLM down.

docs/serving.md ("Choosing k each step in vLLM") documents it.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from typing import Any

from .._schedule import AdaptiveK, KChoice

__all__ = ["VALUES", "install"]

#: ``SPECACCEPT_VLLM_K``'s values.
VALUES = ("auto",)

#: ``SPECACCEPT_VLLM_K_OBJECTIVE``'s values. ``auto`` (the default): each step's
#: expected tokens per second while requests wait for a slot, the batch's end
#: (each request's remaining tokens) when none waits. ``step``: each step's
#: tokens per second always, for a server whose requests keep arriving (a slot
#: left empty is soon filled).
OBJECTIVES = ("auto", "step")

#: The speculative methods whose drafts it chooses. ``ngram``: deterministic
#: proposals that cost nothing to make, chosen after proposing (a trimmed draft
#: costs nothing and is still observed). ``draft_model``: chosen before the draft
#: model runs (:data:`BEFORE_DRAFTING`).
METHODS = ("ngram", "draft_model")
#: The methods whose drafter runs a model per draft: the choice is made before it.
BEFORE_DRAFTING = ("draft_model",)
#: The ``SchedulerOutput`` attribute that carries the number of requests waiting
#: for a slot (vLLM's ``Scheduler.get_request_counts()``) at that step.
WAITING = "specaccept_waiting"
#: A draft model's request given no drafts this many modelled steps running is
#: parked (never drafts again; the drafter is skipped where every request is).
#: While it drafts nothing its acceptance is not observed, so a later step decides
#: from the same estimate: 1 parks it at once, its prompt's drafter pass included
#: when the prior already says drafts cannot pay.
PARK_AFTER = 1

logger = logging.getLogger("vllm.specaccept")


def install(value: str) -> bool:
    """Wraps vLLM's ``GPUModelRunner`` (every runner of this process) so that its
    n-gram drafts are chosen by :class:`AdaptiveK`. ``value`` is
    ``SPECACCEPT_VLLM_K``; a value not in :data:`VALUES` is refused in the log.
    Returns whether it installed."""
    if value not in VALUES:
        logger.warning(
            "specaccept: SPECACCEPT_VLLM_K=%r is not one of %s; vLLM drafts "
            "num_speculative_tokens as configured",
            value,
            VALUES,
        )
        return False
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    if getattr(GPUModelRunner.take_draft_token_ids, "_specaccept", False):
        return True  # installed twice in this process
    schedule = Scheduler.schedule
    execute_model = GPUModelRunner.execute_model
    sample_tokens = GPUModelRunner.sample_tokens
    propose_draft_token_ids = GPUModelRunner.propose_draft_token_ids
    take_draft_token_ids = GPUModelRunner.take_draft_token_ids

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        output = schedule(self, *args, **kwargs)
        _count_waiting(self, output)
        return output

    def execute(self: Any, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        trimmer = _trimmer(self)
        if trimmer is not None:
            trimmer.guarded("start", trimmer.start, scheduler_output)
        return execute_model(self, scheduler_output, *args, **kwargs)

    def sample(self: Any, *args: Any, **kwargs: Any) -> Any:
        output = sample_tokens(self, *args, **kwargs)
        trimmer = _trimmer(self)
        if trimmer is not None:
            trimmer.guarded("observe", trimmer.observe, output)
        return output

    def propose(self: Any, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        trimmer = _trimmer(self)
        if trimmer is None or not trimmer.before_drafting:
            return propose_draft_token_ids(self, scheduler_output, *args, **kwargs)
        most = scheduler_output.num_spec_tokens_to_schedule
        sampled = args[0] if args else kwargs.get("sampled_token_ids")
        width = trimmer.guarded("choose", trimmer.choose_before, self, most, sampled)
        if width is None:
            return propose_draft_token_ids(self, scheduler_output, *args, **kwargs)
        if trimmer.skipped:  # every request parked: no drafter forward
            none = trimmer.guarded("park", _no_drafts, self)
            if none is not None:
                return none
            trimmer.skipped = False  # (broken now: vLLM's drafter runs)
        # The runner hands this width to the drafter; the scheduler's own is restored.
        scheduler_output.num_spec_tokens_to_schedule = width
        try:
            return propose_draft_token_ids(self, scheduler_output, *args, **kwargs)
        finally:
            scheduler_output.num_spec_tokens_to_schedule = most

    def take(self: Any) -> Any:
        drafts = take_draft_token_ids(self)
        trimmer = _trimmer(self)
        if trimmer is None or drafts is None:
            return drafts
        trimmed = trimmer.guarded("choose", trimmer.trim, drafts, self)
        return drafts if trimmed is None else trimmed

    take._specaccept = True  # type: ignore[attr-defined]
    Scheduler.schedule = counted  # type: ignore[method-assign]
    GPUModelRunner.execute_model = execute  # type: ignore[method-assign]
    GPUModelRunner.sample_tokens = sample  # type: ignore[method-assign]
    GPUModelRunner.propose_draft_token_ids = propose  # type: ignore[method-assign]
    GPUModelRunner.take_draft_token_ids = take  # type: ignore[method-assign]
    return True


_LOCK = threading.Lock()
_COUNT_FAILED: list[bool] = []  # the waiting count failed once (logged once)


def _count_waiting(scheduler: Any, output: Any) -> None:
    """Sets :data:`WAITING` on the scheduler's output: the requests waiting for a
    slot. A failure logs once and leaves it unset (the runner then keeps the
    continuous-batching objective); never reaches vLLM."""
    try:
        setattr(output, WAITING, int(scheduler.get_request_counts()[1]))
    except Exception as error:
        if not _COUNT_FAILED:
            _COUNT_FAILED.append(True)
            logger.warning(
                "specaccept: SPECACCEPT_VLLM_K=auto cannot count vLLM's waiting requests "
                "(%r); each step's tokens per second is maximised throughout",
                error,
            )


def _trimmer(runner: Any) -> _Trimmer | None:
    """The runner's trimmer, made at its first step; ``None`` where it does not
    apply (no speculative decoding, another method: said once in the log)."""
    trimmer = runner.__dict__.get("_specaccept_k", False)
    if trimmer is not False:
        return trimmer
    with _LOCK:
        trimmer = runner.__dict__.get("_specaccept_k", False)
        if trimmer is False:
            trimmer = _Trimmer.for_runner(runner)
            runner._specaccept_k = trimmer
    return trimmer


class _Trimmer:
    """One model runner's schedule, and what it remembers between the hooks."""

    def __init__(
        self, max_k: int, record: str | None, method: str = "ngram", objective: str = "auto"
    ):
        self.schedule = AdaptiveK(max_k=max_k)
        self.before_drafting = method in BEFORE_DRAFTING
        self.objective = objective  # one of OBJECTIVES
        self.chosen: KChoice | None = None  # a draft model's choice, made before it ran
        self.ended: float | None = None  # when the previous step's drafts were taken
        self.scheduled: Any = None  # the step's SchedulerOutput
        self.waiting: int | None = None  # requests waiting at the step (None: not said)
        self.remaining: list[int] | None = None  # the last choice's, when it had them
        self.proposals: dict[str, list[int]] = {}  # request -> last step's whole proposal
        self.choice: KChoice | None = None
        self.parked: set[str] = set()  # requests that never draft again
        self.idle: dict[str, int] = {}  # request -> modelled steps running with no drafts
        self.skipped = False  # this step's drafter skipped (every request parked)
        self.broken = False
        self.record = record
        self.steps = 0

    @classmethod
    def for_runner(cls, runner: Any) -> _Trimmer | None:
        config = getattr(runner, "speculative_config", None)
        max_k = int(getattr(runner, "num_spec_tokens", 0) or 0)
        if config is None or max_k <= 0:
            logger.warning(
                "specaccept: SPECACCEPT_VLLM_K=auto has no effect: speculative decoding is off"
            )
            return None
        if config.method not in METHODS:
            logger.warning(
                "specaccept: SPECACCEPT_VLLM_K=auto has no effect with method=%r (only %s: "
                "another drafter's cost per draft is not tested here); vLLM drafts "
                "num_speculative_tokens=%d",
                config.method,
                ", ".join(METHODS),
                max_k,
            )
            return None
        record = os.environ.get("SPECACCEPT_VLLM_K_RECORD") or None
        objective = os.environ.get("SPECACCEPT_VLLM_K_OBJECTIVE") or "auto"
        if objective not in OBJECTIVES:
            logger.warning(
                "specaccept: SPECACCEPT_VLLM_K_OBJECTIVE=%r is not one of %s; 'auto' is used",
                objective,
                OBJECTIVES,
            )
            objective = "auto"
        logger.info(
            "specaccept: SPECACCEPT_VLLM_K=auto: each request's %s drafts chosen per "
            "step by AdaptiveK(max_k=%d)%s%s",
            "draft model's" if config.method in BEFORE_DRAFTING else "n-gram",
            max_k,
            "; each step's tokens per second (objective 'step')" if objective == "step" else "",
            f"; choices recorded to {record}" if record else "",
        )
        return cls(max_k, record, config.method, objective)

    def guarded(self, what: str, call: Any, *args: Any) -> Any:
        """``call(*args)``; a failure logs once and stops the trimming (vLLM's
        drafts stay as proposed), never reaching vLLM."""
        if self.broken:
            return None
        try:
            return call(*args)
        except Exception as error:
            self.broken = True
            logger.exception(
                "specaccept: SPECACCEPT_VLLM_K=auto stopped (%s failed: %r); vLLM drafts "
                "num_speculative_tokens from now on",
                what,
                error,
            )
            return None

    def start(self, scheduler_output: Any) -> None:
        self.scheduled = scheduler_output
        waiting = getattr(scheduler_output, WAITING, None)
        self.waiting = waiting if isinstance(waiting, int) else None
        finished = list(getattr(scheduler_output, "finished_req_ids", ()) or ())
        if finished:
            self.schedule.finish(finished)
            for request in finished:
                self.proposals.pop(request, None)
                self.parked.discard(request)
                self.idle.pop(request, None)

    def observe(self, output: Any) -> None:
        """What the step's verification kept, per request that emitted tokens."""
        scheduled = self.scheduled
        sampled = getattr(output, "sampled_token_ids", None)
        if scheduled is None or not isinstance(sampled, list):
            return
        drafts = scheduled.scheduled_spec_decode_tokens
        requests: list[str] = []
        drafted: list[int] = []
        accepted: list[int] = []
        acceptances: list[list[float] | None] = []
        for request, index in output.req_id_to_index.items():
            emitted = sampled[index] if index < len(sampled) else []
            proposal = self.proposals.get(request)
            count = sum(1 for t in drafts.get(request, ()) if t >= 0)
            if not emitted or (not count and not proposal):
                continue  # a prompt's chunk, or nothing drafted or proposed
            emitted = list(emitted)
            requests.append(request)
            drafted.append(count)
            accepted.append(min(max(len(emitted) - 1, 0), count))
            if proposal:
                seen = min(len(proposal), len(emitted))
                matched = next((j for j in range(seen) if proposal[j] != emitted[j]), seen)
                acceptances.append([1.0] * matched + [0.0] * (matched < seen))
            else:
                acceptances.append(None)
        if requests:
            self.schedule.observe(requests, drafted, accepted, acceptances=acceptances)

    def choose_before(self, runner: Any, most: int, sampled: Any = None) -> int:
        """A draft model's step: each request's drafts chosen before the drafter
        runs (at most ``most``, the scheduler's width; none for a parked request);
        requests parked; the width the drafter runs (``skipped``: not at all).
        ``sampled``: the step's sampled tokens vLLM hands its drafter, not yet in
        its request states (the drafter runs before vLLM's bookkeeping)."""
        requests = list(runner.input_batch.req_ids)
        available = [0 if r in self.parked else int(most) for r in requests]
        chosen = self._choose(requests, available, runner, sampled)
        if chosen.reason != "start":  # the first steps alternate to fit the cost
            for request, k in zip(requests, chosen.k.tolist(), strict=True):
                if k or request in self.parked:
                    self.idle.pop(request, None)
                    continue
                self.idle[request] = self.idle.get(request, 0) + 1
                if self.idle[request] >= PARK_AFTER:
                    self.parked.add(request)
                    del self.idle[request]
        self.skipped = bool(requests) and all(r in self.parked for r in requests)
        self.chosen = chosen
        return chosen.width

    def _choose(
        self, requests: list[str], available: list[int], runner: Any, sampled: Any = None
    ) -> KChoice:
        """``AdaptiveK.choose`` for the requests, ragged; with each request's
        remaining tokens when no request waits for a slot (and they are known;
        ``sampled``: a draft model's step, the tokens it sampled, which the
        request states may not hold yet)."""
        self.remaining = None
        if self.objective == "auto" and self.waiting == 0:
            if not self.before_drafting:
                self.remaining = _remaining(runner, requests)
            elif (pending := _pending(runner, sampled, len(requests))) is not None:
                self.remaining = _remaining(runner, requests, pending)
        return self.schedule.choose(requests, available, padded=False, remaining=self.remaining)

    def trim(self, drafts: Any, runner: Any = None) -> Any:
        """The step's cost observed; the proposals trimmed to the choice (``runner``:
        vLLM's model runner, whose request states give the remaining tokens)."""
        now, seconds = time.perf_counter(), None
        scheduled, chosen, skipped = self.scheduled, self.chosen, self.skipped
        # The drafter's forwards: its first pass (over the step's tokens, drafting
        # the first token) and one per further draft; none when it was skipped.
        forwards = 0 if chosen is None or skipped else max(chosen.width, 1)
        if self.ended is not None and scheduled is not None and _decode_only(scheduled):
            # The whole engine step, scheduling and output included: from the
            # previous step's drafts to this one's (an engine that idled, with no
            # request, next runs a step that processes a prompt: not measured).
            seconds = now - self.ended
            self.schedule.observe_cost(seconds, int(scheduled.total_num_scheduled_tokens), forwards)
        self.ended, self.scheduled, self.chosen, self.skipped = now, None, None, False
        requests = list(drafts.req_ids)
        proposed = [list(t) for t in drafts.draft_token_ids]
        if not requests or len(proposed) != len(requests):
            return None
        if self.before_drafting:
            if chosen is None or list(chosen.requests) != requests:
                return None  # drafts this trimmer did not choose: left as they are
            choice = chosen
        else:
            choice = self._choose(requests, [len(t) for t in proposed], runner)
            self.proposals = {r: t for r, t in zip(requests, proposed, strict=True) if t}
        self.steps += 1
        if self.record:
            self._record(choice, seconds, max(map(len, proposed), default=0), skipped)
        kept = [t[:k] for t, k in zip(proposed, choice.k.tolist(), strict=True)]
        return type(drafts)(requests, kept)

    def _record(self, choice: KChoice, seconds: float | None, proposed: int, skipped: bool) -> None:
        line = {
            "step": self.steps,
            "requests": list(choice.requests),
            "k": choice.k.tolist(),
            "available": choice.available.tolist(),
            "acceptance": [[round(a, 4) for a in row] for row in choice.acceptance.tolist()],
            "expected_tokens": _number(choice.expected_tokens),
            "predicted_seconds": _number(choice.predicted_seconds),
            "previous_step_seconds": seconds,  # null: not measured
            "reason": choice.reason,
            "waiting": self.waiting,  # null: not said by the scheduler
            "remaining": self.remaining,  # null: the step's tokens per second maximised
            "proposed": proposed,  # the longest proposal (a draft model: its forwards)
            "parked": sum(r in self.parked for r in choice.requests),
            "drafter_skipped": skipped,
        }
        assert self.record is not None
        with open(self.record, "a") as file:
            file.write(json.dumps(line) + "\n")


def _no_drafts(runner: Any) -> Any:
    """What vLLM's ``propose_draft_token_ids`` returns when its drafter drafts
    nothing (``[requests, 0]``), without the drafter's forward."""
    import torch

    runner._draft_probs = None
    runner._draft_prob_req_ids = None
    return torch.empty(
        (len(runner.input_batch.req_ids), 0), dtype=torch.int64, device=runner.device
    )


def _remaining(
    runner: Any, requests: list[str], pending: list[int] | None = None
) -> list[int] | None:
    """Each request's tokens still to emit, at least 1: its ``max_tokens`` less
    the output tokens of vLLM's request state and its ``pending`` ones (emitted
    this step, not in the state yet), and no more than its room below
    ``max_model_len``; ``None`` when one of them is not known."""
    states = getattr(runner, "requests", None)
    limit = getattr(runner, "max_model_len", None)
    if not isinstance(states, dict):
        return None
    out = []
    for i, request in enumerate(requests):
        state = states.get(request)
        most = getattr(getattr(state, "sampling_params", None), "max_tokens", None)
        output = getattr(state, "output_token_ids", None)
        tokens = getattr(state, "num_tokens", None)
        if not isinstance(most, int) or not isinstance(output, list):
            return None
        step = 0 if pending is None else pending[i]
        left = most - len(output) - step
        if isinstance(limit, int) and isinstance(tokens, int):
            left = min(left, limit - tokens - step)
        out.append(max(left, 1))
    return out


def _pending(runner: Any, sampled: Any, rows: int) -> list[int] | None:
    """The tokens each request emitted this step that its state does not hold
    yet. vLLM hands a draft model the sampled ids before its bookkeeping (a
    tensor ``[rows, 1 + k]``, ``-1`` where nothing was sampled): the ids ``>= 0``
    per row, none for a request whose tokens vLLM discards (a prompt's chunk:
    ``discard_request_mask``). With ``disable_padded_drafter_batch`` it hands the
    kept ids as lists after its bookkeeping: none. ``None`` when they are not
    there to count."""
    if isinstance(sampled, list):
        return [0] * rows if len(sampled) == rows else None
    shape = getattr(sampled, "shape", None)
    if shape is None or len(shape) != 2 or int(shape[0]) != rows:
        return None
    counts = [int(n) for n in (sampled >= 0).sum(-1).tolist()]
    mask = getattr(getattr(runner, "discard_request_mask", None), "np", None)
    if mask is not None:
        counts = [0 if bool(mask[i]) else n for i, n in enumerate(counts)]
    return counts


def _decode_only(scheduled: Any) -> bool:
    """Whether every request of the step computed only its last token and its
    drafts (a step that also processed prompts is not a decoding step's cost)."""
    drafts = scheduled.scheduled_spec_decode_tokens
    return bool(scheduled.num_scheduled_tokens) and all(
        n == 1 + len(drafts.get(r, ())) for r, n in scheduled.num_scheduled_tokens.items()
    )


def _number(value: float) -> float | None:
    return None if value != value else float(value)  # NaN: null in JSON
