"""The options of a generation run, checked once: :class:`Options`.

:func:`specaccept.generate` and the ``custom_generate`` entry of Hugging Face's
``generate`` (:func:`specaccept.generation.hf.speculative`) both build one
:class:`Options` and hand it to the same loop (``_loop.run``). Every check here
runs before any model is called; the per-request sampling values are checked
against the number of prompts by :meth:`Options.sampling`. The contract is
docs/spec.md section 12.1.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._checks import check_flag, check_int
from .._errors import InputError
from .._schedule import KSchedule
from ._record import check_path
from ._sampling import Sampling

__all__ = ["MAX_TREE_NODES", "Options"]

CHAIN_METHODS = ("token", "block")
TREE_METHODS = ("token", "traversal")
_SMALLEST_TEMPERATURE = 2.2250738585072014e-308
MAX_TOKEN = 2**63 - 1
#: Nodes a drafted tree may have (root included).
MAX_TREE_NODES = 4096

#: ``on_tokens(request, tokens, finished)``: see :func:`specaccept.generate`.
OnTokens = Callable[[int, list[int], bool], None]


def _float(value: Any) -> float:
    """A number as a float; an int too large for one as infinity (refused later)."""
    try:
        return float(value)
    except OverflowError:
        return math.inf


def _per_request(value: Any, name: str, integer: bool) -> Any:
    """A sampling parameter: one number for every prompt, or a sequence of one per
    prompt (its length checked by :meth:`Options.sampling`), as an int or float,
    or an ``int64`` / ``float64`` array."""
    number = (int, np.integer) if integer else (int, float, np.integer, np.floating)
    kind = "an int" if integer else "a number"
    if isinstance(value, number) and not isinstance(value, (bool, np.bool_)):
        values = [value]
        scalar = True
    elif isinstance(value, (list, tuple, np.ndarray)):
        if isinstance(value, np.ndarray) and value.ndim != 1:
            raise TypeError(f"{name} must be a number or a sequence of one per prompt")
        values = list(value)
        scalar = False
        for i, v in enumerate(values):
            if isinstance(v, (bool, np.bool_)) or not isinstance(v, number):
                raise TypeError(f"{name}[{i}] must be {kind}, got {type(v).__name__}")
    else:
        raise TypeError(
            f"{name} must be {kind} or a sequence of one per prompt, got {type(value).__name__}"
        )
    if integer:
        if any(int(v) < 0 for v in values):
            raise InputError(f"{name} must be >= 0 (0: off)", argument=name)
        checked = np.array([min(int(v), MAX_TOKEN) for v in values], dtype=np.int64)
    else:
        checked = np.array([_float(v) for v in values], dtype=np.float64)
    return checked[0].item() if scalar else checked


def _temperature(value: Any) -> Any:
    temperature = _per_request(value, "temperature", integer=False)
    values = np.atleast_1d(np.asarray(temperature, dtype=np.float64))
    bad = ~((values == 0) | ((values >= _SMALLEST_TEMPERATURE) & np.isfinite(values)))
    if bad.any():
        raise InputError(
            f"temperature = {values[bad][0]}: 0 (greedy) or a finite number >= "
            f"{_SMALLEST_TEMPERATURE}",
            argument="temperature",
        )
    return temperature


def _top_p(value: Any) -> Any:
    top_p = _per_request(value, "top_p", integer=False)
    values = np.atleast_1d(np.asarray(top_p, dtype=np.float64))
    if not ((values > 0) & (values <= 1)).all():
        raise InputError("top_p must lie in (0, 1] (1: off)", argument="top_p")
    return top_p


def _min_p(value: Any) -> Any:
    min_p = _per_request(value, "min_p", integer=False)
    values = np.atleast_1d(np.asarray(min_p, dtype=np.float64))
    if not ((values >= 0) & (values <= 1)).all():
        raise InputError("min_p must lie in [0, 1] (0: off)", argument="min_p")
    return min_p


def _tree(tree: Any) -> tuple[int, ...] | None:
    if tree is None:
        return None
    if isinstance(tree, (str, bytes)) or not isinstance(tree, Iterable):
        raise TypeError(f"tree must be None or a sequence of ints, got {type(tree).__name__}")
    branching = []
    for i, count in enumerate(tree):
        branching.append(check_int(count, f"tree[{i}]", 1))
    if not branching:
        raise InputError("tree must have at least one level", argument="tree")
    nodes, width = 1, 1
    for count in branching:
        width *= count
        nodes += width
        if nodes > MAX_TREE_NODES:
            raise InputError(
                f"tree {branching} has more than {MAX_TREE_NODES} nodes", argument="tree"
            )
    return tuple(branching)


def _eos(eos_token_id: Any) -> frozenset[int]:
    """``eos_token_id``: ``None``, an int, or a sequence of ints."""
    if eos_token_id is None:
        return frozenset()
    if isinstance(eos_token_id, (int, np.integer)) and not isinstance(
        eos_token_id, (bool, np.bool_)
    ):
        return frozenset((int(eos_token_id),))
    if isinstance(eos_token_id, (list, tuple, np.ndarray)):
        if isinstance(eos_token_id, np.ndarray) and eos_token_id.ndim != 1:
            raise TypeError(
                f"eos_token_id must be None, an int or a 1-D sequence of ints, got an array of "
                f"{eos_token_id.ndim} dimensions"
            )
        ids = list(eos_token_id)
        for i, token in enumerate(ids):
            if isinstance(token, (bool, np.bool_)) or not isinstance(token, (int, np.integer)):
                raise TypeError(f"eos_token_id[{i}] must be an int, got {type(token).__name__}")
        return frozenset(int(t) for t in ids)
    raise TypeError(
        f"eos_token_id must be None, an int or a sequence of ints, got {type(eos_token_id).__name__}"
    )


def _k(k: Any) -> tuple[int, KSchedule | str | None]:
    """``k``: an int, ``"auto"`` (the run takes the :class:`~specaccept.AdaptiveK`
    kept for its models, ``_loop.auto_schedule``) or a schedule (an object with ``choose``, ``observe``, ``observe_cost`` and
    ``finish``: :class:`~specaccept.AdaptiveK`, :class:`~specaccept.HeuristicK`)."""
    if isinstance(k, str):
        if k != "auto":
            raise InputError(
                f"k must be an int >= 0, 'auto' or a schedule (AdaptiveK, HeuristicK), got {k!r}",
                argument="k",
            )
        return 0, "auto"  # resolved by the run: the AdaptiveK kept for its models
    if isinstance(k, KSchedule):
        return 0, k
    if isinstance(k, (int, np.integer)) or isinstance(k, (bool, np.bool_)):
        return check_int(k, "k"), None
    raise TypeError(
        f"k must be an int >= 0, 'auto' or a schedule (AdaptiveK, HeuristicK), got "
        f"{type(k).__name__}"
    )


def _callable(value: Any, name: str) -> Any:
    if value is not None and not callable(value):
        raise TypeError(f"{name} must be None or a callable, got {type(value).__name__}")
    return value


@dataclass(frozen=True)
class Options:
    """A generation run's checked options (see :func:`specaccept.generate` for each).

    ``temperature``, ``top_k``, ``top_p`` and ``min_p`` are one value for every
    prompt, or an array of one per prompt whose length :meth:`sampling` checks. ``eos_token_ids``
    is the set of tokens that end a row; ``isolate`` is ``errors="isolate"``;
    ``record`` the checked path, or ``None``. ``schedule`` chooses each step's
    drafts when ``k`` was ``"auto"`` or a schedule (``k`` is then 0, unused).
    """

    k: int = 4
    schedule: KSchedule | str | None = None
    tree: tuple[int, ...] | None = None
    max_new_tokens: int = 32
    eos_token_ids: frozenset[int] = frozenset()
    greedy: bool = False
    temperature: Any = 1.0
    top_k: Any = 0
    top_p: Any = 1.0
    min_p: Any = 0.0
    min_p_last: bool = False
    method: str = "token"
    rng: Any = None
    seed: Any = None
    isolate: bool = False
    record: str | None = None
    progress: Callable[[int, int], None] | None = None
    on_tokens: OnTokens | None = None

    @classmethod
    def check(
        cls,
        *,
        k: Any = 4,
        tree: Any = None,
        max_new_tokens: Any = 32,
        eos_token_id: Any = None,
        greedy: Any = False,
        temperature: Any = 1.0,
        top_k: Any = 0,
        top_p: Any = 1.0,
        min_p: Any = 0.0,
        min_p_last: Any = False,
        method: Any = "token",
        rng: Any = None,
        seed: Any = None,
        errors: Any = "raise",
        record: Any = None,
        progress: Any = None,
        on_tokens: Any = None,
    ) -> Options:
        """The options of :func:`specaccept.generate`, checked: a wrong type is a
        ``TypeError``, a wrong value an ``InputError`` naming the argument."""
        k, schedule = _k(k)
        max_new_tokens = check_int(max_new_tokens, "max_new_tokens")
        branching = _tree(tree)
        eos = _eos(eos_token_id)
        progress = _callable(progress, "progress")
        on_tokens = _callable(on_tokens, "on_tokens")
        if errors not in ("raise", "isolate"):
            if not isinstance(errors, str):
                raise TypeError(f"errors must be 'raise' or 'isolate', got {type(errors).__name__}")
            raise InputError(
                f"errors must be 'raise' or 'isolate', got {errors!r}", argument="errors"
            )
        if not isinstance(method, str):
            raise TypeError(f"method must be a string, got {type(method).__name__}")
        methods = CHAIN_METHODS if branching is None else TREE_METHODS
        if method not in methods:
            raise InputError(
                f"method must be one of {methods} for "
                f"{'chains' if branching is None else 'trees'}, got {method!r}",
                argument="method",
            )
        if branching is not None and schedule is not None:
            raise InputError(
                "k: a schedule chooses chain drafts; trees have the shape tree gives",
                argument="k",
            )
        record_path = check_path(record)
        if branching is not None and record_path is not None:
            raise InputError(
                "record writes chain steps (python -m specaccept compare reads chains); "
                "run without tree to record",
                argument="record",
            )
        if not isinstance(greedy, (bool, np.bool_)):
            raise TypeError(f"greedy must be a bool, got {type(greedy).__name__}")
        return cls(
            k=k,
            schedule=schedule,
            tree=branching,
            max_new_tokens=max_new_tokens,
            eos_token_ids=eos,
            greedy=bool(greedy),
            temperature=_temperature(temperature),
            top_k=_per_request(top_k, "top_k", integer=True),
            top_p=_top_p(top_p),
            min_p=_min_p(min_p),
            min_p_last=check_flag(min_p_last, "min_p_last"),
            method=method,
            rng=rng,
            seed=seed,
            isolate=errors == "isolate",
            record=record_path,
            progress=progress,
            on_tokens=on_tokens,
        )

    def sampling(self, batch: int) -> Sampling:
        """Each of ``batch`` prompts' temperature, top-k, top-p and min-p
        (temperature 0 for every row with ``greedy``)."""
        columns = []
        for name, value, dtype in (
            ("temperature", self.temperature, np.float64),
            ("top_k", self.top_k, np.int64),
            ("top_p", self.top_p, np.float64),
            ("min_p", self.min_p, np.float64),
        ):
            if isinstance(value, np.ndarray):
                if len(value) != batch:
                    raise InputError(
                        f"{name} has {len(value)} values for {batch} prompts", argument=name
                    )
                columns.append(value.copy())
            else:
                columns.append(np.full(batch, value, dtype=dtype))
        temperature, top_k, top_p, min_p = columns
        if self.greedy:
            temperature = np.zeros(batch)
        return Sampling(temperature, top_k, top_p, min_p, self.min_p_last)
