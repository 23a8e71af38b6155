"""What ``AdaptiveK`` costs per step: ``choose``, ``observe`` and ``observe_cost``,
timed apart from any model (no torch), at a few batch sizes, with its step-time fit
and choice in Rust (``specaccept.AdaptiveK``) and in NumPy
(``specaccept.reference.AdaptiveK``), in one run.

    python benches/bench_controller.py

Each batch size: the controller is run 300 steps on a simulated step cost (so its
history is full, as in a long-running engine), then timed over 1000 more steps:
the cost refit (``observe_cost`` then the first ``choose`` refits the line), the
choice from a fitted line, the acceptance update, and the three together as a
serving loop calls them each step.
"""

from __future__ import annotations

import platform
import time
from datetime import date

import numpy as np
import specaccept
import specaccept.reference

STEPS = 1000


def simulated_seconds(batch: int, width: int) -> float:
    """A step's time on a simulated machine: fixed, per target token, per draft forward."""
    return 0.05 + 0.002 * batch * (1 + width) + 0.01 * width


def warmed(batch: int, kind: type = specaccept.AdaptiveK) -> tuple[specaccept.AdaptiveK, list[int]]:
    schedule = kind()
    ids = list(range(batch))
    rng = np.random.default_rng(0)
    for _ in range(300):
        choice = schedule.choose(ids, [40] * batch, remaining=[40] * batch)
        schedule.observe(ids, choice.k.tolist(), rng.integers(0, choice.k + 1).tolist())
        width = choice.width
        schedule.observe_cost(simulated_seconds(batch, width), batch * (1 + width), width)
    return schedule, ids


def per_step(call) -> float:
    start = time.perf_counter()
    for _ in range(STEPS):
        call()
    return (time.perf_counter() - start) / STEPS * 1e3


def row(batch: int, kind: type) -> list[float]:
    """Milliseconds per step: a refit, a choice, an update, the three together."""
    schedule, ids = warmed(batch, kind)
    available, remaining = [40] * batch, [40] * batch
    choice = schedule.choose(ids, available, remaining=remaining)
    drafted, accepted = choice.k.tolist(), [0] * batch

    widths = iter(np.tile([0, 1, 2, 4], STEPS).tolist())  # steps that differ: a refit each

    def measured() -> None:
        width = next(widths)
        schedule.observe_cost(simulated_seconds(batch, width), batch * (1 + width), width)

    def refit() -> None:
        measured()
        schedule.cost_model()

    def step() -> None:
        measured()
        made = schedule.choose(ids, available, remaining=remaining)
        schedule.observe(ids, made.k.tolist(), accepted)

    return [
        per_step(refit),
        per_step(lambda: schedule.choose(ids, available, remaining=remaining)),
        per_step(lambda: schedule.observe(ids, drafted, accepted)),
        per_step(step),
    ]


def main() -> None:
    print(
        f"# {date.today()}, {platform.processor() or platform.machine()}, "
        "python benches/bench_controller.py\n"
    )
    print(
        "| batch | numbers in | refit (ms) | choose, fitted (ms) | observe (ms) "
        "| a whole step (ms) | NumPy / Rust, a whole step |"
    )
    print("|---|---|---|---|---|---|---|")
    kinds = {"Rust": specaccept.AdaptiveK, "NumPy": specaccept.reference.AdaptiveK}
    for batch in (1, 8, 64, 256):
        rows = {name: row(batch, kind) for name, kind in kinds.items()}
        for name, cells in rows.items():
            ratio = rows["NumPy"][3] / rows["Rust"][3]
            print(
                f"| {batch} | {name} | "
                + " | ".join(f"{c:.3f}" for c in cells)
                + (f" | {ratio:.1f}x |" if name == "NumPy" else " | |")
            )


if __name__ == "__main__":
    main()
