"""The speculative decoding loop: draft, score in one target call, verify, keep.

One step, for every unfinished row at once: the drafter proposes a chain of up
to ``k`` tokens (or a tree); the target session scores the row's pending token
and the drafts in one forward call; a verifier from :mod:`specaccept` keeps the
accepted prefix and one more token; each session commits the tokens the new
sequences confirm and forgets the rest; finished rows leave the batch. The
contract is docs/spec.md section 12.
"""

from __future__ import annotations

import math
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from .._api import acceptance_rate, verify, verify_greedy
from .._errors import InputError
from .._logits import verify_logits
from .._schedule import AdaptiveK, KChoice, KSchedule
from .._stats import AcceptanceStats
from .._tree import verify_tree
from ._drafters import (
    Chain,
    PromptLookup,
    ProposeDrafter,
    Tree,
    drafting_for,
    fits,
    too_large,
)
from ._options import MAX_TOKEN, OnTokens, Options
from ._randomness import Randomness
from ._record import Recorder
from ._sampling import Sampling, log, sample_logits, transform
from ._session import StatelessSession, TrackedSession

__all__ = ["Generation", "context_of", "generate", "run"]


@dataclass
class Generation:
    """The result of :func:`generate`.

    Attributes
    ----------
    tokens : list of list of int
        The new tokens of each prompt (the end-of-sequence token included when it
        ended the row; never a token past it, past ``max_new_tokens`` or past the
        models' context).
    stats : AcceptanceStats
        What each verification step kept.
    stop_reasons : list of str
        Why each row ended: ``"eos"``, ``"max_new_tokens"``, ``"context"`` (the
        models' context is full) or ``"error"`` (see ``errors``).
    errors : dict of int to Exception
        With ``errors="isolate"``: the requests that ended on an error (a bad
        prompt, a model row with NaN logits, a model call that failed for that
        request alone), with it. Their ``tokens`` are those emitted before.
    target_calls, draft_calls : int
        Rows scored by the target (one per row per step; plain decoding needs one
        per token) and rows run through the draft model (one per row per draft
        forward call).
    target_forwards, draft_forwards : int
        Batched calls to each model (the first one, with the prompts, included).
    seconds : float
        Wall time of the loop (opening the sessions included).
    timings : dict of str to float
        Where ``seconds`` went: ``"open"`` (opening the sessions; the prompts are
        fed with the first step), ``"draft"`` (drafting, the draft model's
        forwards included), ``"target"`` (the target's forwards),
        ``"verify"`` (verification, and the softmax where a tree or a
        probability model needs one) and ``"loop"`` (the rest: bookkeeping).
    step_seconds, step_tokens : list
        Each step's wall time and the tokens it emitted over all rows (the
        first step also feeds the prompts: its time is the time to first token).
    schedule : list of KChoice
        With ``k="auto"`` or a schedule: each step's choice (its requests are
        request indices), what it estimated and predicted (docs/spec.md section
        13); empty otherwise.
    """

    tokens: list[list[int]]
    stats: AcceptanceStats = field(default_factory=AcceptanceStats)
    stop_reasons: list[str] = field(default_factory=list)
    errors: dict[int, Exception] = field(default_factory=dict)
    target_calls: int = 0
    draft_calls: int = 0
    target_forwards: int = 0
    draft_forwards: int = 0
    seconds: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)
    step_seconds: list[float] = field(default_factory=list)
    step_tokens: list[int] = field(default_factory=list)
    schedule: list[KChoice] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        """Tokens generated over all rows."""
        return sum(len(t) for t in self.tokens)

    @property
    def target_calls_saved(self) -> int:
        """Target-model calls plain decoding would have made, minus those made."""
        return self.num_tokens - self.target_calls

    @property
    def tokens_per_second(self) -> float:
        """Generated tokens per second of :attr:`seconds`."""
        return self.num_tokens / self.seconds if self.seconds > 0 else 0.0


def _prompts(prompts: Any, isolate: bool) -> tuple[list[list[int]], dict[int, InputError]]:
    """The prompts as lists of Python ints (copies), and the empty ones as errors
    when isolating (else the first is raised)."""
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Iterable):
        raise TypeError(
            f"prompts must be a sequence of token-id sequences, got {type(prompts).__name__}"
        )
    sequences, errors = [], {}
    for b, prompt in enumerate(prompts):
        if isinstance(prompt, (str, bytes)) or not isinstance(prompt, Iterable):
            raise TypeError(
                f"prompts[{b}] must be a sequence of int token ids, got {type(prompt).__name__}"
            )
        tokens = list(prompt)
        for i, token in enumerate(tokens):
            if isinstance(token, (bool, np.bool_)) or not isinstance(token, (int, np.integer)):
                raise TypeError(
                    f"prompts[{b}][{i}] must be an int token id, got {type(token).__name__}"
                )
            if not 0 <= token <= MAX_TOKEN:
                raise InputError(
                    f"prompts[{b}][{i}] = {token}: token ids must lie in [0, 2**63)",
                    argument="prompts",
                    index=(b, i),
                    row=b,
                )
        if not tokens:
            error = InputError(
                f"prompts[{b}] is empty: a prompt needs at least one token (a BOS token, say)",
                argument="prompts",
                row=b,
            )
            if not isolate:
                raise error
            errors[b] = error
        sequences.append([int(t) for t in tokens])
    return sequences, errors


def _vocab(model: Any, name: str) -> int:
    vocab = getattr(model, "vocab_size", None)
    if isinstance(vocab, (bool, np.bool_)) or not isinstance(vocab, (int, np.integer)):
        raise TypeError(f"{name}.vocab_size must be an int, got {type(vocab).__name__}")
    if vocab < 1:
        raise InputError(f"{name}.vocab_size must be >= 1, got {vocab}", argument=name)
    return int(vocab)


def _context(model: Any, name: str) -> int | None:
    limit = getattr(model, "max_length", None)
    if limit is None:
        return None
    if isinstance(limit, (bool, np.bool_)) or not isinstance(limit, (int, np.integer)):
        raise TypeError(f"{name}.max_length must be None or an int, got {type(limit).__name__}")
    if limit < 1:
        raise InputError(f"{name}.max_length must be >= 1, got {limit}", argument=name)
    return int(limit)


def _kind(model: Any, name: str, drafter: bool = False) -> str:
    """``"session"``, ``"propose"`` (drafters only) or ``"stateless"``, by what
    ``model`` has, in that order of preference."""
    if callable(getattr(model, "session", None)):
        return "session"
    if drafter and callable(getattr(model, "propose", None)):
        return "propose"
    if callable(getattr(model, "next_token_probs", None)):
        return "stateless"
    what = (
        "a session model (session), a LanguageModel (next_token_probs), a Drafter (propose) "
        "or a PromptLookup"
        if drafter
        else "a session model (session) or a LanguageModel (next_token_probs)"
    )
    raise TypeError(f"{name} must be {what}, got {type(model).__name__}")


def generate(
    target: Any,
    draft: Any,
    prompts: Sequence[Sequence[int]],
    *,
    k: int = 4,
    tree: Sequence[int] | None = None,
    max_new_tokens: int = 32,
    eos_token_id: int | Sequence[int] | None = None,
    greedy: bool = False,
    temperature: float | Sequence[float] = 1.0,
    top_k: int | Sequence[int] = 0,
    top_p: float | Sequence[float] = 1.0,
    method: str = "token",
    rng: Any = None,
    seed: int | None = None,
    errors: str = "raise",
    record: Any = None,
    progress: Callable[[int, int], None] | None = None,
    on_tokens: OnTokens | None = None,
    min_p: float | Sequence[float] = 0.0,
    min_p_last: bool = False,
) -> Generation:
    """Generate continuations of ``prompts`` by speculative decoding, batched.

    Each step, every unfinished row drafts up to ``k`` tokens (or a ``tree``),
    the target scores them in one forward call for the whole batch, and a
    verifier keeps the accepted prefix and one more token: the output follows
    the target model exactly, token for token for greedy decoding and in
    distribution for sampling, for every row whatever the others accept.
    Models with sessions (:class:`~specaccept.generation.hf.HFModel`) keep a
    key-value cache per row; see docs/generation.md.

    Parameters
    ----------
    target : session model or LanguageModel
        The model whose distribution the output follows:
        :class:`~specaccept.generation.hf.HFModel` (logits, cached), any object
        with ``session(prefixes)`` (:class:`~specaccept.generation.SessionModel`),
        or a stateless :class:`~specaccept.LanguageModel`.
    draft : PromptLookup, session model, LanguageModel or Drafter
        What proposes tokens: :class:`~specaccept.PromptLookup` (n-gram lookup
        in the row's context), a draft model (its own cache when it has
        sessions), or a :class:`~specaccept.Drafter` of your own.
    prompts : sequence of sequences of int
        One prompt per row, any lengths (at least one token each).
    k : int
        Tokens drafted per step for chains (fewer near ``max_new_tokens`` or the
        context; never scored past them).
    tree : sequence of int, optional
        Draft trees instead of chains, e.g. ``[3, 2, 1]``: 3 children of the
        root, 2 under each, 1 under each of those, drawn without replacement
        from a draft model and verified in one target call with a tree
        attention mask by :func:`specaccept.verify_tree`. ``k`` is then unused.
    max_new_tokens : int
        New tokens per row at most.
    eos_token_id : int or sequence of int, optional
        A row ends after emitting this token (any of these tokens).
    greedy : bool
        Greedy decoding (temperature 0 for every row).
    temperature, top_k, top_p, min_p : number, or one per prompt
        The sampling transform (docs/spec.md section 8.2): temperature 0 is
        greedy; ``top_k = 0``, ``top_p = 1`` and ``min_p = 0`` are off.
        Applied to the draft's rows too, which the drafts are drawn from.
    min_p_last : bool
        Min-p after top-k and top-p (transformers' order) instead of before
        them (vLLM's); they differ only where min-p and top-p are both on.
    method : str
        ``"token"`` (default) or ``"block"`` for chains; ``"token"`` or
        ``"traversal"`` for trees.
    rng : None, int or Generator
        The randomness of drafting and verification, one stream for the batch.
    seed : int, optional
        Instead of ``rng``: per-request counter-based randomness (docs/spec.md
        section 12.4): a request's text does not depend on the batch (given
        models that score each row as they would alone). In ``[0, 2**64)``.
    errors : ``"raise"`` or ``"isolate"``
        With ``"isolate"``, a bad request (an empty prompt, one longer than the
        context, a model row with NaN logits, a model call that fails for that
        request alone) ends with its error in ``Generation.errors``; the others
        go on as without it.
    record : path, optional
        Write the verified chain steps to this ``.npz`` file, in the layout
        ``python -m specaccept compare --from`` reads.
    progress : callable, optional
        Called as ``progress(done_tokens, total_tokens)`` after each step.
    on_tokens : callable, optional
        Streaming: called as ``on_tokens(request, tokens, finished)`` after each
        step for every request that emitted tokens or ended in it, in request
        order: ``tokens`` the new tokens (a fresh list; empty when the request
        ended without any, on an error or before its first step), ``finished``
        whether the request has ended (its last call). Joined, a request's
        ``tokens`` are its ``Generation.tokens``. An exception it raises stops
        the run and propagates.

    Returns
    -------
    Generation

    Raises
    ------
    TypeError, ValueError
        A bad argument (checked before any model is called), or a model answer
        of the wrong type or shape (naming ``target`` or ``draft``). An
        exception raised by a model itself propagates as it is (with
        ``errors="isolate"``, only when it is not one request's alone).
    MemoryError
        ``k`` drafts over the vocabulary are more than this process can hold.

    Examples
    --------
    >>> import specaccept
    >>> from specaccept.ngram import builtin_models
    >>> target, draft, vocab = builtin_models()
    >>> out = specaccept.generate(target, draft, [vocab.encode("Anne Elliot was")],
    ...                           k=4, max_new_tokens=8, greedy=True)
    >>> vocab.decode(out.tokens[0])
    'not done for her. Miss Elliot,'
    """
    options = Options.check(
        k=k,
        tree=tree,
        max_new_tokens=max_new_tokens,
        eos_token_id=eos_token_id,
        greedy=greedy,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        min_p=min_p,
        min_p_last=min_p_last,
        method=method,
        rng=rng,
        seed=seed,
        errors=errors,
        record=record,
        progress=progress,
        on_tokens=on_tokens,
    )
    return run(target, draft, prompts, options)


@dataclass(frozen=True)
class _Models:
    """What the loop needs to know of the two models: how each is driven
    (``"session"``, ``"stateless"``; the draft also ``"propose"`` or ``"lookup"``),
    the vocabulary and the context (the smaller ``max_length``, or ``None``)."""

    target_kind: str
    draft_kind: str
    vocab: int
    context: int | None


def _models(target: Any, draft: Any, options: Options) -> _Models:
    target_kind = _kind(target, "target")
    vocab = _vocab(target, "target")
    if isinstance(draft, PromptLookup):
        draft_kind = "lookup"
    else:
        draft_kind = _kind(draft, "draft", drafter=True)
        if draft_kind == "propose" and getattr(draft, "vocab_size", None) is None:
            draft_vocab = vocab  # a drafter need not say: it drafts in the target's vocabulary
        else:
            draft_vocab = _vocab(draft, "draft")
        if draft_vocab != vocab:
            raise InputError(
                f"target and draft vocabularies differ: {vocab} vs {draft_vocab}", argument="draft"
            )
    if options.tree is not None and draft_kind not in ("session", "stateless"):
        raise InputError(
            "tree drafts come from a draft model (a session model or a LanguageModel)",
            argument="tree",
        )
    return _Models(target_kind, draft_kind, vocab, context_of(target, draft))


def context_of(target: Any, draft: Any) -> int | None:
    """The run's context: the smaller ``max_length`` of the two models (``None``:
    neither has one). A row ends when its sequence reaches it."""
    limits = [c for c in (_context(target, "target"), _context(draft, "draft")) if c is not None]
    return min(limits) if limits else None


def _admit(
    result: Generation,
    sequences: list[list[int]],
    prompt_errors: dict[int, InputError],
    models: _Models,
    options: Options,
) -> list[int]:
    """The requests that start generating; the others end now (an error, or no
    room), with their stop reason (and error) in ``result``."""
    context, vocab = models.context, models.vocab
    live = []
    for b, seq in enumerate(sequences):
        error = prompt_errors.get(b)
        if error is None and context is not None and len(seq) > context:
            error = InputError(
                f"prompts[{b}] has {len(seq)} tokens, more than the models' context of {context}",
                argument="prompts",
                row=b,
            )
        if (
            error is None
            and options.max_new_tokens > 0
            and not (context is not None and len(seq) >= context)
        ):
            i = next((i for i, token in enumerate(seq) if token >= vocab), None)
            if i is not None:
                error = InputError(
                    f"prompts[{b}][{i}] = {seq[i]} is outside the vocabulary [0, {vocab})",
                    argument="prompts",
                    index=(b, i),
                    row=b,
                )
        if error is not None:
            if not options.isolate:
                raise error
            result.errors[b] = error
            result.stop_reasons[b] = "error"
        elif options.max_new_tokens == 0:
            result.stop_reasons[b] = "max_new_tokens"
        elif context is not None and len(seq) >= context:
            result.stop_reasons[b] = "context"
        else:
            live.append(b)
    return live


#: ``k="auto"``: one AdaptiveK per target model, drafter and ``max_k``, for the process.
_AUTO: weakref.WeakKeyDictionary[Any, dict[tuple[Any, int], AdaptiveK]] = (
    weakref.WeakKeyDictionary()
)
#: ``max_k`` of ``generate(k="auto")``.
AUTO_MAX_K = 8


def drafter_key(draft: Any) -> Any:
    """What ``k="auto"`` tells drafters apart by: every :class:`PromptLookup`
    alike, a model by the module it wraps."""
    if isinstance(draft, PromptLookup):
        return "lookup"
    return id(getattr(draft, "model", draft))


def auto_schedule(model: Any, drafter: Any, max_k: int = AUTO_MAX_K) -> AdaptiveK:
    """The :class:`~specaccept.AdaptiveK` that ``k="auto"`` uses for ``model``
    (the target; an :class:`~specaccept.generation.hf.HFModel` counts as the
    module it wraps) and ``drafter`` (a :func:`drafter_key`): kept for the
    process, so a later call starts from what earlier ones measured (docs/spec.md
    section 13.5). A model that cannot be weakly referenced gets a new one each
    time."""
    owner = getattr(model, "model", model)
    key = (drafter, int(max_k))
    # A draft model's start steps pay for each draft (prompt lookup's cost nothing).
    start = None if drafter == "lookup" else 1
    try:
        kept = _AUTO.setdefault(owner, {})
    except TypeError:
        return AdaptiveK(max_k=max_k, start=start)
    if key not in kept:
        kept[key] = AdaptiveK(max_k=max_k, start=start)
    return kept[key]


def run(target: Any, draft: Any, prompts: Any, options: Options) -> Generation:
    """:func:`generate` with its options checked (the entry points share it)."""
    *_, result = run_steps(target, draft, prompts, options)
    return result


def run_steps(target: Any, draft: Any, prompts: Any, options: Options) -> Iterator[Generation]:
    """:func:`run` one step at a time: the run's :class:`Generation` (one object,
    growing) after each step, and once more when the run is done (its forwards,
    recording and time then filled in). Stopping early leaves the rows as they
    are (an engine that streams and stops at a stop string)."""
    start = time.perf_counter()
    models = _models(target, draft, options)
    schedule = options.schedule
    if isinstance(schedule, str):  # "auto"
        schedule = auto_schedule(target, drafter_key(draft))
    sequences, prompt_errors = _prompts(prompts, options.isolate)
    batch = len(sequences)
    sampling = options.sampling(batch)
    randomness = Randomness.of(options.rng, options.seed, sequences)

    if schedule is not None:
        schedule.finish(list(range(batch)))  # a schedule reused from another run
    result = Generation(tokens=[[] for _ in sequences], stop_reasons=[""] * batch)
    result.timings = dict.fromkeys(("open", "draft", "target", "verify", "loop"), 0.0)
    live = _admit(result, sequences, prompt_errors, models, options)
    if options.on_tokens is not None:
        for b in range(batch):
            if result.stop_reasons[b]:
                options.on_tokens(b, [], True)
    if not live:
        result.seconds = time.perf_counter() - start
        yield result
        return

    prompts_live = [sequences[b] for b in live]
    opened = time.perf_counter()
    empty: list[list[int]] = [[] for _ in live]
    session = (
        target.session(empty)
        if models.target_kind == "session"
        else StatelessSession(target, empty, "target")
    )
    scorer = TrackedSession(session, "target", len(live), models.vocab)
    drafter = drafting_for(draft, models.draft_kind, prompts_live, models.vocab, options.isolate)
    # What the verifier reads: logits (verify_logits) for chains whose target
    # gives logits and whose drafter gives logits or nothing; else probabilities.
    target_logits = scorer.scores == "logits"
    if options.tree is not None or models.draft_kind == "propose" or not target_logits:
        drafter.space = "probs"
    elif models.draft_kind == "lookup":
        drafter.space = "logits"
    else:
        drafter.space = "logits" if drafter.scores == "logits" else "probs"
    result.timings["open"] = time.perf_counter() - opened
    run = _Run(
        result=result,
        sequences=sequences,
        live=live,
        scorer=scorer,
        drafter=drafter,
        settings=_Settings(
            options=options,
            context=models.context,
            sampling=sampling,
            randomness=randomness,
            vocab=models.vocab,
            target_logits=target_logits,
            deterministic=models.draft_kind == "lookup",
            schedule=schedule,
        ),
        recorder=(
            None
            if options.record is None
            else Recorder(options.record, models.draft_kind == "lookup")
        ),
    )
    total = options.max_new_tokens * batch
    while run.live:
        run.step()
        if options.progress is not None:
            done = total - sum(options.max_new_tokens - len(result.tokens[b]) for b in run.live)
            options.progress(done, total)
        if run.live:
            yield result
    result.target_forwards = scorer.forwards
    result.draft_forwards = getattr(drafter, "forwards", 0)
    if run.recorder is not None:
        run.recorder.save()
    result.seconds = time.perf_counter() - start
    yield result


@dataclass
class _Settings:
    """A run's checked options, and what the run derived from them and the models,
    as the steps use them."""

    options: Options
    context: int | None
    sampling: Sampling
    randomness: Randomness
    vocab: int
    target_logits: bool
    deterministic: bool
    schedule: KSchedule | None = None


@dataclass
class _Drafted:
    """One step's drafts and what the target is fed: per step row, its tokens
    (pending, then drafts), their parents (``None``: chains), how many of them the
    target scores, the drafts counted for the statistics, the rows that failed."""

    feed: list[list[int]]
    links: list[list[int]] | None
    wanted: list[int]
    counts: list[int]
    failed: dict[int, Exception]
    chain: Chain | None = None
    tree: Tree | None = None
    proposed: list[list[int]] | None = None
    choice: KChoice | None = None
    # With a schedule, for sampled rows verified from probabilities: each draft's
    # exact acceptance probability given the ones before it, by step row.
    exact: dict[int, list[float]] = field(default_factory=dict)


@dataclass
class _Run:
    """The loop's state: the rows still generating (``live``: request indices), their
    sequences, the target's session and the drafter."""

    result: Generation
    sequences: list[list[int]]
    live: list[int]
    scorer: TrackedSession
    drafter: Any
    settings: _Settings
    recorder: Recorder | None

    def step(self) -> None:
        """One step for every live row: draft, score, verify, keep, select."""
        result, settings = self.result, self.settings
        begun = time.perf_counter()
        rows, stepped = len(self.live), self.live
        seqs = [self.sequences[b] for b in self.live]
        emitted = [len(result.tokens[b]) for b in self.live]
        rooms = [settings.options.max_new_tokens - e for e in emitted]
        if settings.context is not None:
            rooms = [
                min(room, settings.context - len(q)) for room, q in zip(rooms, seqs, strict=True)
            ]
        keys = settings.randomness.step(self.live, emitted)
        sampling = settings.sampling.rows(self.live)
        forwards = getattr(self.drafter, "forwards", 0)
        drafted = self._draft(seqs, rooms, keys, sampling)
        if not settings.options.isolate and drafted.failed:
            raise next(iter(drafted.failed.values()))
        scoring = time.perf_counter()
        result.timings["draft"] += scoring - begun

        # One target call for the batch.
        scores, bad = self.scorer.extend(
            drafted.feed, drafted.links, scored=drafted.wanted, isolate=settings.options.isolate
        )
        failed = {**drafted.failed, **bad}
        result.target_calls += rows
        verifying = time.perf_counter()
        result.timings["target"] += verifying - scoring

        ok = [r for r in range(rows) if r not in failed]
        verified: Any = None
        order: list[int] = []
        if ok:
            verified, order, found = _verify(
                scores, drafted, ok, sampling, keys, settings, self.recorder
            )
            failed.update(found)
        if not settings.options.isolate and failed:
            raise next(iter(failed.values()))
        keeping = time.perf_counter()
        result.timings["verify"] += keeping - verifying

        before = result.num_tokens
        schedule = settings.schedule
        if schedule is not None and verified is not None:
            self._observe(schedule, drafted, verified, order, failed)
        going = self._keep(verified, order, failed)
        if verified is not None:
            counts = np.array([drafted.counts[r] for r in order], dtype=np.int64)
            result.stats.update(verified, counts)
        self.scorer.advance(seqs, failed)
        self.drafter.advance(seqs, failed)
        if len(going) < rows:
            self.scorer.select(going)
            self.drafter.select(going)
        if schedule is not None and len(going) < rows:
            kept = set(going)
            schedule.finish([self.live[r] for r in range(rows) if r not in kept])
        self.live = [self.live[r] for r in going]
        ended = time.perf_counter()
        result.timings["loop"] += ended - keeping
        if schedule is not None:
            if result.step_seconds:  # the first step also fed the prompts
                schedule.observe_cost(
                    ended - begun,
                    rows * max((len(f) for f in drafted.feed), default=0),
                    getattr(self.drafter, "forwards", 0) - forwards,
                )
            if drafted.choice is not None:
                result.schedule.append(drafted.choice)
        result.step_seconds.append(ended - begun)
        result.step_tokens.append(result.num_tokens - before)
        if settings.options.on_tokens is not None:
            for b, e in zip(stepped, emitted, strict=True):
                new, finished = result.tokens[b][e:], bool(result.stop_reasons[b])
                if new or finished:
                    settings.options.on_tokens(b, new, finished)

    def _draft(
        self, seqs: list[list[int]], rooms: list[int], keys: Any, sampling: Sampling
    ) -> _Drafted:
        """The step's drafts (a chain of at most ``min(k, room - 1)`` tokens per row,
        or a tree cut at depth ``room - 1``) and the target's feed."""
        settings, drafter, rows = self.settings, self.drafter, len(seqs)
        sampled = not bool(sampling.greedy.all())
        if settings.options.tree is not None:
            branching = list(settings.options.tree)
            depths = [min(len(branching), room - 1) for room in rooms]
            nodes = 1 + sum(math.prod(branching[: d + 1]) for d in range(len(branching)))
            uniforms = self._draft_uniforms(keys, rows, nodes, sampled)
            tree = drafter.propose_tree(seqs, branching, depths, sampling, uniforms)
            failed = dict(tree.errors)
            self.result.draft_calls += rows * max(max(depths), 0)
            # Per row: its pending tokens (a chain ending at the root, node 0), then
            # the nodes under their tree parents (padding under the root).
            feed: list[list[int]] = []
            links: list[list[int]] = []
            wanted: list[int] = []
            for r in range(rows):
                if r in failed:
                    feed.append([])
                    links.append([])
                    wanted.append(0)
                    continue
                pending = self.scorer.pending(r, seqs[r])
                root = len(pending) - 1
                feed.append(pending + tree.tokens[r, 1:].tolist())
                links.append(
                    list(range(-1, root)) + [root + max(int(p), 0) for p in tree.parents[r, 1:]]
                )
                wanted.append(nodes)
            return _Drafted(feed, links, wanted, depths, failed, tree=tree)
        schedule, choice, proposed = settings.schedule, None, None
        bounds = [max(room - 1, 0) for room in rooms]
        if schedule is None:
            counts = [min(settings.options.k, bound) for bound in bounds]
        elif settings.deterministic:
            # Proposed first (cheap), then the schedule chooses among the proposals.
            most = getattr(schedule, "max_k", None)
            counts = bounds if most is None else [min(most, bound) for bound in bounds]
        else:
            choice = schedule.choose(self.live, bounds, remaining=rooms)
            counts = choice.k.tolist()
        width = max(counts)
        samples_ours = not settings.deterministic and not isinstance(drafter, ProposeDrafter)
        uniforms = self._draft_uniforms(keys, rows, width, sampled and width > 0 and samples_ours)
        if isinstance(drafter, ProposeDrafter):
            generator = settings.randomness.generator
            chain = drafter.propose(seqs, counts, sampling, uniforms, generator, keys)
        else:
            chain = drafter.propose(seqs, counts, sampling, uniforms)
        if schedule is not None and settings.deterministic:
            proposed = chain.tokens
            choice = schedule.choose(self.live, [len(t) for t in proposed], remaining=rooms)
            chain.tokens = [t[:k] for t, k in zip(proposed, choice.k.tolist(), strict=True)]
        failed = dict(chain.errors)
        if not settings.deterministic:
            self.result.draft_calls += rows * width
        drafts = [[] if r in failed else chain.tokens[r] for r in range(rows)]
        feed = [
            [] if r in failed else self.scorer.pending(r, seqs[r]) + drafts[r] for r in range(rows)
        ]
        wanted = [0 if r in failed else 1 + len(drafts[r]) for r in range(rows)]
        return _Drafted(
            feed,
            None,
            wanted,
            [len(d) for d in drafts],
            failed,
            chain=chain,
            proposed=proposed,
            choice=choice,
        )

    def _observe(
        self,
        schedule: KSchedule,
        drafted: _Drafted,
        verified: Any,
        order: list[int],
        failed: dict[int, Exception],
    ) -> None:
        """Tells the schedule what the step's verification kept (docs/spec.md section
        13.2): per verified row its drafts and accepted count, and per depth what
        was seen: for deterministic drafts how far the whole proposal matched the
        emitted tokens (a proposal past the drafts kept is compared with the bonus
        token); for sampled rows verified from probabilities each draft's exact
        acceptance probability; else the accepted drafts and the first rejection."""
        rows = [(i, r) for i, r in enumerate(order) if r not in failed]
        requests = [self.live[r] for _, r in rows]
        counts = [drafted.counts[r] for _, r in rows]
        accepted = [int(verified.num_accepted[i]) for i, _ in rows]
        acceptances: list[list[float] | None] = []
        for i, r in rows:
            if drafted.proposed is not None:
                proposal, emitted = drafted.proposed[r], verified.tokens(i).tolist()
                seen = min(len(proposal), len(emitted))
                matched = next((j for j in range(seen) if proposal[j] != emitted[j]), seen)
                acceptances.append([1.0] * matched + [0.0] * (matched < seen))
            else:
                acceptances.append(drafted.exact.get(r))  # None: the verifier's counts
        schedule.observe(requests, counts, accepted, acceptances=acceptances)

    def _draft_uniforms(self, keys: Any, rows: int, width: int, needed: bool) -> np.ndarray | None:
        """The draft uniforms ``[rows, width]`` (``None`` when nothing is sampled),
        with a size past memory named ``k`` (or ``tree``)."""
        what = "k" if self.settings.options.tree is None else "tree"
        fits(rows, width, self.settings.vocab, what)
        if not needed:
            return None
        try:
            return self.settings.randomness.draft_uniforms(keys, (rows, width))
        except MemoryError:
            raise too_large(rows, width, self.settings.vocab, what) from None

    def _keep(self, verified: Any, order: list[int], failed: dict[int, Exception]) -> list[int]:
        """Appends each row's emitted tokens (stopping at ``eos_token_id``,
        ``max_new_tokens`` and the context), ends the failed rows; the step rows
        that go on."""
        result, settings = self.result, self.settings
        going = []
        index = {r: i for i, r in enumerate(order)}
        for r, b in enumerate(self.live):
            if r in failed:
                result.errors[b] = failed[r]
                result.stop_reasons[b] = "error"
                continue
            for token in verified.tokens(index[r]).tolist():
                self.sequences[b].append(token)
                result.tokens[b].append(token)
                if token in settings.options.eos_token_ids:
                    result.stop_reasons[b] = "eos"
                elif len(result.tokens[b]) == settings.options.max_new_tokens:
                    result.stop_reasons[b] = "max_new_tokens"
                elif settings.context is not None and len(self.sequences[b]) >= settings.context:
                    result.stop_reasons[b] = "context"
                else:
                    continue
                break
            if not result.stop_reasons[b]:
                going.append(r)
        return going


def _verify(
    scores: np.ndarray,
    drafted: _Drafted,
    ok: list[int],
    sampling: Sampling,
    keys: Any,
    settings: _Settings,
    recorder: Recorder | None,
) -> tuple[Any, list[int], dict[int, Exception]]:
    """One verification of the step rows ``ok``: the result, the step row of each
    of its rows, and the rows that failed."""
    every = len(ok) == scores.shape[0]
    if not every:
        scores = scores[ok]
        sampling = sampling.rows(ok)
    keys = None if keys is None else (keys[0][ok], keys[1][ok])
    if drafted.tree is not None:
        return _verify_trees(scores, drafted.tree, ok, every, sampling, keys, settings)
    return _verify_chains(
        scores, drafted.chain, ok, every, sampling, keys, settings, recorder, drafted
    )


def _target_probs(
    rows: np.ndarray, sampling: Sampling, logits: bool, read: list[int] | None
) -> tuple[np.ndarray, dict[int, InputError]]:
    """The target's rows as the probabilities the verifier reads (docs/spec.md
    section 12.3): logits transformed; probabilities as given, or, with a
    temperature or a filter on a sampled row, the transform of their logarithms."""
    if logits:
        return transform(rows, sampling, read)
    if sampling.plain:
        return rows, {}
    return transform(log(rows), sampling, read)


def _verify_trees(
    scores: np.ndarray,
    tree: Tree,
    ok: list[int],
    every: bool,
    sampling: Sampling,
    keys: Any,
    settings: _Settings,
) -> tuple[Any, list[int], dict[int, Exception]]:
    """``verify_tree`` on the transformed target rows; with isolation, a row it
    refuses is set aside and the others verified again (their uniforms are
    their own)."""
    failed: dict[int, Exception] = {}
    probs, bad = _target_probs(scores, sampling, settings.target_logits, None)
    nodes, parents, draft = (
        (tree.tokens, tree.parents, tree.probs)
        if every
        else (tree.tokens[ok], tree.parents[ok], tree.probs[ok])
    )
    alive = [i for i in range(len(ok)) if i not in bad]
    for i, error in bad.items():
        failed[ok[i]] = error
    uniforms, recovery = settings.randomness.verify_uniforms(keys, nodes.shape)
    while alive:
        try:
            verified = verify_tree(
                nodes[alive],
                parents[alive],
                probs[alive],
                draft[alive],
                uniforms=uniforms[alive],
                recovery_uniforms=recovery[alive],
                greedy=sampling.greedy[alive],
                method=cast(Any, settings.options.method),
            )
        except InputError as error:
            if not settings.options.isolate or error.row is None:
                raise
            failed[ok[alive[error.row]]] = error
            del alive[error.row]
            continue
        return verified, [ok[i] for i in alive], failed
    return None, [], failed


def _verify_chains(
    scores: np.ndarray,
    chain: Chain | None,
    ok: list[int],
    every: bool,
    sampling: Sampling,
    keys: Any,
    settings: _Settings,
    recorder: Recorder | None,
    drafted: _Drafted,
) -> tuple[Any, list[int], dict[int, Exception]]:
    """``verify_logits`` on the rows as they are, or ``verify`` on probabilities
    (docs/spec.md section 12.3); the verified rows recorded; with a schedule, the
    exact acceptance of drafts verified from probabilities kept in ``drafted``."""
    assert chain is not None
    choice = drafted.choice
    failed: dict[int, Exception] = {}
    drafts = [chain.tokens[r] for r in ok]
    width = max((len(d) for d in drafts), default=0)
    ids = np.zeros((len(ok), width), dtype=np.int64)
    for i, d in enumerate(drafts):
        ids[i, : len(d)] = d
    num = np.array([len(d) for d in drafts], dtype=np.int64)
    target_rows = scores[:, : width + 1]
    draft_rows = None
    if chain.scores is not None:
        draft_rows = (chain.scores if every else chain.scores[ok])[:, :width]
    errors: Any = "isolate" if settings.options.isolate else "raise"
    method: Any = settings.options.method
    read = [int(n) + 1 for n in num]  # the target rows a row's verification may read
    if keys is not None and draft_rows is None and method == "token":
        verified, unmatched = _match_samples(ids, target_rows, num, sampling, keys, settings)
        failed.update((ok[i], error) for i, error in unmatched.items())
        if recorder is not None:
            target_probs, draft_probs = transform(target_rows, sampling, read)[0], None
    elif chain.space == "logits":
        uniforms, recovery = settings.randomness.verify_uniforms(keys, (len(ok), width))
        verified = verify_logits(
            ids,
            target_rows,
            draft_rows,
            temperature=sampling.temperature,
            top_k=sampling.top_k,
            top_p=sampling.top_p,
            min_p=sampling.min_p,
            min_p_last=sampling.min_p_last,
            num_draft_tokens=num,
            uniforms=uniforms,
            recovery_uniforms=recovery,
            errors=errors,
            method=method,
        )
        if recorder is not None:
            target_probs = transform(target_rows, sampling, read)[0]
            draft_probs = (
                None if draft_rows is None else transform(draft_rows, sampling, num.tolist())[0]
            )
    else:
        uniforms, recovery = settings.randomness.verify_uniforms(keys, (len(ok), width))
        target_probs, bad = _target_probs(target_rows, sampling, settings.target_logits, read)
        failed.update((ok[i], error) for i, error in bad.items())
        draft_probs = draft_rows
        verified = verify(
            ids,
            target_probs,
            draft_probs,
            greedy=sampling.greedy,
            num_draft_tokens=num,
            uniforms=uniforms,
            recovery_uniforms=recovery,
            errors=errors,
            method=method,
        )
        if choice is not None and draft_probs is not None:
            drafted.exact.update(_exact_acceptances(target_probs, draft_probs, num, sampling, ok))
    for i, error in verified.errors.items():
        failed.setdefault(ok[int(i)], error)
    if recorder is not None:
        good = [i for i in range(len(ok)) if ok[i] not in failed]
        recorder.add(
            ids[good],
            np.asarray(target_probs)[good],
            None if draft_probs is None else np.asarray(draft_probs)[good],
            num[good],
            None if choice is None else (choice, [ok[i] for i in good]),
        )
    return verified, list(ok), failed


def _exact_acceptances(
    target_probs: np.ndarray,
    draft_probs: np.ndarray,
    num: np.ndarray,
    sampling: Sampling,
    ok: list[int],
) -> dict[int, list[float]]:
    """For each sampled row, each draft's probability of acceptance once the ones
    before it are: ``sum_x min(p_t(x), q_t(x))`` over the normalised rows
    (docs/spec.md section 13.2), by step row."""
    rows = [(i, t) for i in range(len(num)) if not sampling.greedy[i] for t in range(int(num[i]))]
    if not rows:
        return {}
    which = np.array([i for i, _ in rows], dtype=np.int64)
    at = np.array([t for _, t in rows], dtype=np.int64)
    p = np.asarray(target_probs[which, at], dtype=np.float64)
    q = np.asarray(draft_probs[which, at], dtype=np.float64)
    with np.errstate(all="ignore"):
        p = p / p.sum(axis=1, keepdims=True)
        q = q / q.sum(axis=1, keepdims=True)
    rates = np.nan_to_num(np.asarray(acceptance_rate(p, q)), nan=0.0).clip(0.0, 1.0)
    out: dict[int, list[float]] = {}
    for (i, _), rate in zip(rows, rates.tolist(), strict=True):
        out.setdefault(ok[i], []).append(rate)
    return out


def _match_samples(
    ids: np.ndarray,
    target_rows: np.ndarray,
    num: np.ndarray,
    sampling: Sampling,
    keys: tuple[np.ndarray, np.ndarray],
    settings: _Settings,
) -> tuple[Any, dict[int, Exception]]:
    """Seeded deterministic drafts (docs/spec.md section 12.4): at each position
    the target's own sample, drawn with the uniform plain decoding draws there
    (stream 1 of the request's key at offset = tokens emitted before it), and a
    draft accepted exactly while it equals that sample. So a request's text is
    its plain decoding's, whatever was drafted."""
    rows = [(i, t) for i in range(len(num)) for t in range(int(num[i]) + 1)]
    which = np.array([i for i, _ in rows], dtype=np.int64)
    positions = np.array([t for _, t in rows], dtype=np.int64)
    uniforms = settings.randomness.position_uniforms(keys, which, positions)
    flat = target_rows[which, positions]
    each = sampling.rows(which)
    found: dict[int, Exception] = {}  # by flat row
    if settings.target_logits:
        drawn, sampled_bad = sample_logits(flat, each, uniforms, "target logits")
        found.update(sampled_bad)
    else:
        probs, transformed = _target_probs(flat[:, None], each, False, None)
        found.update(transformed)
        bonus = verify(
            np.zeros((len(rows), 0), dtype=np.int64),
            probs,
            greedy=each.greedy,
            uniforms=np.zeros((len(rows), 0)),
            recovery_uniforms=uniforms,
            errors="isolate",
        )
        drawn = np.asarray(bonus.output_token_ids)[:, 0]
        for j, error in bonus.errors.items():
            found.setdefault(int(j), error)
    bad: dict[int, Exception] = {}
    for j, problem in found.items():
        bad.setdefault(int(which[j]), problem)
    sampled = np.zeros((len(num), ids.shape[1] + 1), dtype=np.int64)
    sampled[which, positions] = np.maximum(drawn, 0)
    return verify_greedy(ids, sampled, num_draft_tokens=num), bad
