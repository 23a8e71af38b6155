"""The hostile-input matrix (``tests/hostile.py``) in a child process: no case may
crash the interpreter or raise a Rust ``PanicException``; each raises exactly the
expected exception, naming the argument (and the index for values), or succeeds
with the result of the equivalent well-formed call; no input is ever modified."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hostile import CASES, LOGITS_CASES, edge_calls

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def reports() -> dict[str, dict]:
    run = subprocess.run(
        [sys.executable, str(HERE / "hostile.py")], capture_output=True, text=True, timeout=300
    )
    # A crash shows as a signal (negative return code) or a missing report.
    assert run.returncode == 0, f"the matrix process died ({run.returncode}): {run.stderr[-2000:]}"
    return {r["case"]: r for r in map(json.loads, run.stdout.splitlines())}


# (report prefix, matrix): verify's cases, then verify_logits'.
MATRICES = {"": CASES, "logits: ": LOGITS_CASES}


@pytest.mark.parametrize(
    ("prefix", "case"), [(prefix, case) for prefix, cases in MATRICES.items() for case in cases]
)
def test_hostile_case(reports, prefix, case):
    _, expected, fragment = MATRICES[prefix][case]
    report = reports[prefix + case]
    assert report["type"] != "PanicException"
    assert report["inputs_unchanged"], "an input was modified"
    if expected == "ok":
        assert report["type"] == "ok", report
        valid = reports[prefix + "valid"]["tokens"]
        assert report["tokens"] == valid, "the same tokens as the valid call"
    else:
        assert report["type"] == expected, report
        assert fragment in report["message"], report["message"]


def test_logits_decide_as_the_probabilities(reports):
    # The logits batch is the probability batch in log space (renormalised by the
    # softmax): the same accept/reject decisions, so rows of the same lengths.
    lengths = [len(t) for t in reports["logits: valid"]["tokens"]]
    assert lengths == [len(t) for t in reports["valid"]["tokens"]] == [2, 2, 2]


@pytest.mark.parametrize("case", list(edge_calls()))
def test_edge_shapes_succeed(reports, case):
    report = reports[case]
    assert report["type"] == "ok", report
    tokens = report["tokens"]
    if case == "B = 0":
        assert tokens == []
    elif case == "K = 0":
        assert [len(t) for t in tokens] == [1, 1]
    else:  # V = 1: every draft is token 0, accepted, and the bonus is token 0
        assert tokens == [[0, 0, 0, 0], [0, 0, 0, 0]]
