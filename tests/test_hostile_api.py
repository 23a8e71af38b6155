"""Issue 13: every public entry point answers any input with a result, a
``TypeError``, an ``InputError`` naming the argument, or a ``MemoryError`` naming
it; never a panic, an abort, a hang or an internal exception, and never by
changing an input. The cases (``tests/hostile_api.py``) run in child processes
so that a crash or a hang is attributed to its case instead of ending the run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from hostile_api import CASES, ENV  # noqa: E402

#: Each batch of cases runs under a 4 GiB address-space limit (RLIMIT_AS), which
#: Linux enforces and macOS does not offer: elsewhere the matrix is not run.
pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="runs its cases under Linux's RLIMIT_AS"
)

RUNNER = str(HERE / "hostile_api.py")
BATCH = 40
BATCH_TIMEOUT = 60
SINGLE_TIMEOUT = 20


def _run(cases: list[str], env_value: str | None, timeout: float) -> dict[str, dict]:
    """Runs ``cases`` in one child; the reports it printed, and a crash or timeout
    report for the first case without one when the child alone is running."""
    env = dict(os.environ)
    env.pop("SPECACCEPT_NUM_THREADS", None)
    if env_value is not None:
        env["SPECACCEPT_NUM_THREADS"] = env_value
    try:
        done = subprocess.run(
            [sys.executable, RUNNER, *cases],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
        )
        stdout, failure = done.stdout, None
        if done.returncode < 0:
            failure = f"crash: signal {-done.returncode} ({signal.Signals(-done.returncode).name})"
        elif done.returncode != 0:
            failure = f"crash: exit status {done.returncode}: {done.stderr[-300:]}"
    except subprocess.TimeoutExpired as error:
        out = error.stdout or b""
        stdout = out.decode(errors="replace") if isinstance(out, bytes) else out
        failure = f"timeout after {timeout} s"
    reports = {}
    for line in stdout.splitlines():
        try:
            report = json.loads(line)
        except ValueError:
            continue
        if isinstance(report, dict) and report.get("case") in cases:
            reports[report["case"]] = report
    missing = [c for c in cases if c not in reports]
    if failure is not None and len(cases) == 1 and missing:
        reports[missing[0]] = {"case": missing[0], "outcome": failure, "message": ""}
    return reports


@pytest.fixture(scope="module")
def reports() -> dict[str, dict]:
    plain = sorted(c for c in CASES if c not in ENV)
    count = max(1, -(-len(plain) // BATCH))
    jobs = [(plain[i::count], None, BATCH_TIMEOUT) for i in range(count)]
    jobs += [([case], value, BATCH_TIMEOUT) for case, value in sorted(ENV.items())]
    found: dict[str, dict] = {}
    with ThreadPoolExecutor(2) as pool:
        for result in pool.map(lambda job: _run(*job), jobs):
            found.update(result)
        # A child that died or hung: its cases without a report, one per child.
        again = [([c], ENV.get(c), SINGLE_TIMEOUT) for c in sorted(CASES) if c not in found]
        for result in pool.map(lambda job: _run(*job), again):
            found.update(result)
    return found


@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_input(reports: dict[str, dict], case: str) -> None:
    expected = CASES[case][1]
    report = reports.get(case, {"outcome": "no report", "message": ""})
    outcome = report["outcome"]
    detail = f"{case}: expected {expected}, got {outcome}"
    if report.get("exception") and report["exception"] != outcome:
        detail += f" ({report['exception']}, argument={report.get('argument')!r})"
    detail += f": {report.get('message', '')}"
    assert outcome in expected.split("|"), detail
    assert report.get("inputs_unchanged") is not False, f"{case}: an input was modified"


def test_every_public_function_is_in_the_matrix() -> None:
    # A new entry point without hostile cases fails here.
    import inspect

    import specaccept
    from specaccept import generation, lab, lossy, ngram, reference
    from specaccept.compat import flashinfer, vllm

    sources = "\n".join(source for source, _ in CASES.values())
    missing = []
    for module, prefix in (
        (specaccept, "sa."),
        (vllm, "vllm."),
        (flashinfer, "flashinfer."),
        (reference, "reference."),
        (ngram, "ngram."),
        (generation, "generation."),
        (lab, "lab."),
        (lossy, "lossy."),
    ):
        for name in module.__all__:
            value = getattr(module, name)
            if callable(value) and not inspect.isclass(value) and f"{prefix}{name}(" not in sources:
                missing.append(prefix + name)
    assert not missing, f"no hostile case calls {missing}"
