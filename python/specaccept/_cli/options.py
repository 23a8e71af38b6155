"""The command line's option types and limits: each refuses a bad value by name
(argparse exits with status 2 and the message, without a traceback)."""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable

# Bounds of the numeric options: this is a demonstration, and a value past them
# would only allocate or loop for hours before failing (argparse refuses it, exit 2).
MAX_EXAMPLE_BATCH = 1024


MAX_EXAMPLE_K = 256


MAX_K = 1024


MAX_NEW_TOKENS = 100_000


MAX_CONTINUATIONS = 1000


MAX_CHECK_SAMPLES = 1_000_000


MAX_ORDER = 16  # training takes seconds per order (8 s at 16 on the shipped text)


MAX_BUDGET_S = 3600.0


def int_in(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse type: an int in ``[low, high]`` (no upper bound when ``high`` is None)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid int value: {text!r:.40}") from None
        if value < low or (high is not None and value > high):
            bound = f">= {low}" if high is None else f"in [{low}, {high}]"
            raise argparse.ArgumentTypeError(f"must be an int {bound}, got {text:.40}")
        return value

    parse.__name__ = "int"
    return parse


def budget(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid float value: {text!r:.40}") from None
    if not (math.isfinite(value) and 0.0 < value <= MAX_BUDGET_S):
        raise argparse.ArgumentTypeError(
            f"must be a number of seconds in (0, {MAX_BUDGET_S:g}], got {text:.40}"
        )
    return value


def writable(text: str) -> str:
    """An argparse type: a file path (not a directory); see :func:`probe_writable`."""
    if not text or os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"must name a file, got {text!r:.80}")
    return text


def probe_writable(path: str) -> str | None:
    """Why ``path`` cannot be written (``None``: it can), found by creating its
    directories and opening it, before minutes of benchmarking; a file that did
    not exist is removed again."""
    existed = os.path.exists(path)
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "a"):
            pass
        if not existed:
            os.remove(path)
    except OSError as error:
        return error.strerror or str(error)
    return None


def prompt_text(text: str) -> str:
    from ..ngram import tokenize

    if not tokenize(text):
        raise argparse.ArgumentTypeError("must contain at least one word or mark")
    return text


def tree_shape(text: str) -> list[int]:
    try:
        shape = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid tree: {text!r:.40} (e.g. 3,2,1)") from None
    if not shape or min(shape) < 1 or len(shape) > 8:
        raise argparse.ArgumentTypeError(f"invalid tree: {text!r:.40} (e.g. 3,2,1)")
    return shape


def model_options(
    parser: argparse.ArgumentParser, prompt_default: str | None = "Anne Elliot was"
) -> None:
    parser.add_argument(
        "--prompt",
        type=prompt_text,
        default=prompt_default,
        help="text to continue (with --model smollm2: the user's message)",
    )
    parser.add_argument(
        "--k", type=int_in(0, MAX_K), default=4, help="tokens drafted per step (default 4)"
    )
    parser.add_argument("--seed", type=int_in(0), default=0, help="random seed (default 0)")
    parser.add_argument(
        "--target-order",
        type=int_in(1, MAX_ORDER),
        default=4,
        help="n of the target n-gram (default 4)",
    )
    parser.add_argument(
        "--draft-order",
        type=int_in(1, MAX_ORDER),
        default=2,
        help="n of the draft n-gram (default 2)",
    )
