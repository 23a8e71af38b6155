"""Hostile inputs to every public entry point (issue 13), run in child processes.

``CASES`` maps ``"entry_point: description"`` to ``(source, expected)``: the
source performs one call (an expression, or statements) in a namespace built by
``SETUP``; ``expected`` is ``"ok"``, ``"TypeError"``, ``"ValueError"`` (an
``InputError`` whose ``argument`` is set), ``"MemoryError"`` (whose message
names an argument), or several of them joined by ``|``. Cases listed in ``ENV``
run alone, in a child whose ``SPECACCEPT_NUM_THREADS`` is set before import.

``python tests/hostile_api.py CASE_ID...`` runs cases under a 4 GiB address
space limit and prints one JSON line per case: ``case``, ``outcome`` (``"ok"``
or the exception's kind), ``message`` and ``inputs_unchanged`` (``None`` when
the case watched no input).
"""

from __future__ import annotations

import json
import re
import resource
import sys

SETUP = r'''
import copy, json, math, os, subprocess, sys
import numpy as np
import specaccept as sa
from specaccept import reference
from specaccept.compat import flashinfer, vllm

B, K, V = 2, 3, 5
_watched = []


def w(x):
    """Watch ``x``: it must be unchanged after the call, whatever the outcome."""
    if isinstance(x, np.ndarray):
        _watched.append((x, x.copy()))
    else:
        _watched.append((x, copy.deepcopy(x)))
    return x


def probs(*shape, seed=0):
    x = np.random.default_rng(seed).random(shape) + 0.1
    return x / x.sum(-1, keepdims=True)


def P(b=B, k=K, v=V):
    return probs(b, k + 1, v)


def Q(b=B, k=K, v=V):
    return probs(b, k, v, seed=1)


def IDS():
    return np.array([[0, 1, 2], [3, 4, 0]])


def U():
    return np.full((B, K), 0.5)


def RU():
    return np.full(B, 0.5)


def huge_ids(b, k):
    return np.broadcast_to(np.int64(0), (b, k))


def ok_ver(r, b=B, k=K, v=V, counts=None):
    """The invariants of a Verification with ``b`` rows of ``k`` drafts over ``v`` tokens."""
    assert isinstance(r, sa.Verification), type(r)
    assert r.output_token_ids.shape == (b, k + 1), r.output_token_ids.shape
    assert r.num_accepted.shape == r.num_emitted.shape == (b,)
    assert (r.num_emitted == r.num_accepted + 1).all()
    counts = np.full(b, k) if counts is None else np.asarray(counts)
    assert ((0 <= r.num_accepted) & (r.num_accepted <= counts)).all()
    for row in range(b):
        n = int(r.num_emitted[row])
        assert ((0 <= r.output_token_ids[row, :n]) & (r.output_token_ids[row, :n] < v)).all()
        assert (r.output_token_ids[row, n:] == -1).all()
    return r


def ok_tree(r, b, v):
    assert isinstance(r, sa.TreeVerification), type(r)
    assert (r.num_emitted == r.num_accepted + 1).all()
    for row in range(b):
        t = r.tokens(row)
        assert ((0 <= t) & (t < v)).all(), t
    return r


def cli(*args, ok=False):
    """``python -m specaccept ARGS``: no traceback; exit 1 or 2 (or 0 when ``ok``)."""
    done = subprocess.run(
        [sys.executable, "-m", "specaccept", *args],
        capture_output=True, text=True, timeout=30,
    )
    assert "Traceback" not in done.stderr, done.stderr[-300:]
    allowed = (0, 1, 2) if ok else (1, 2)
    assert done.returncode in allowed, (done.returncode, done.stderr[-300:])
    return done.returncode


class Model:
    """A tiny language model: fixed next-token probabilities over ``vocab_size`` tokens."""

    def __init__(self, vocab_size=4, answer=None):
        self.vocab_size = vocab_size
        self.answer = answer

    def next_token_probs(self, sequences, num_positions):
        if self.answer is not None:
            return self.answer
        return np.full((len(sequences), num_positions, self.vocab_size), 1.0 / self.vocab_size)


def stats():
    s = sa.AcceptanceStats()
    s.update(sa.verify_greedy(np.array([[3, 4, 5], [3, 4, 5]]), np.array([[3, 4, 5, 6], [3, 8, 5, 6]])))
    return s
'''

# The names a MemoryError's message may give for the argument whose size is too large.
ARGUMENT_NAMES = (
    "draft_token_ids",
    "target_token_ids",
    "target_probs",
    "draft_probs",
    "target_prob",
    "draft_prob",
    "uniform",
    "uniforms",
    "recovery_uniforms",
    "uniform_samples",
    "num_draft_tokens",
    "node_token_ids",
    "parent_ids",
    "target_logits",
    "draft_logits",
    "accepted",
    "output_token_ids",
    "bonus_token_ids",
    "batch_size",
    "num_draft",
    "prompts",
    "max_new_tokens",
    "k",
)
_NAMED = re.compile(r"\b(" + "|".join(ARGUMENT_NAMES) + r")\b")

CASES: dict[str, tuple[str, str]] = {
    # --- verify -------------------------------------------------------------------
    "verify: valid batch": ("ok_ver(sa.verify(w(IDS()), w(P()), w(Q()), rng=0))", "ok"),
    "verify: given uniforms": (
        "ok_ver(sa.verify(w(IDS()), w(P()), w(Q()), uniforms=w(U()), recovery_uniforms=w(RU())))",
        "ok",
    ),
    "verify: greedy, no rng": ("ok_ver(sa.verify(w(IDS()), w(P()), greedy=True))", "ok"),
    "verify: ragged counts": (
        "ok_ver(sa.verify(w(IDS()), w(P()), None, num_draft_tokens=w(np.array([3, 0])), rng=0),"
        " counts=[3, 0])",
        "ok",
    ),
    "verify: int32 ids, float16 probs": (
        "ok_ver(sa.verify(w(IDS().astype(np.int32)), w(P().astype(np.float16)), rng=0))",
        "ok",
    ),
    "verify: empty batch": (
        "ok_ver(sa.verify(np.zeros((0, 3), np.int64), np.zeros((0, 4, 5)), rng=0), b=0)",
        "ok",
    ),
    "verify: zero drafts": (
        "ok_ver(sa.verify(np.zeros((2, 0), np.int64), P(k=0), rng=0), k=0)",
        "ok",
    ),
    "verify: empty vocabulary": ("sa.verify(IDS(), np.zeros((2, 4, 0)), rng=0)", "ValueError"),
    "verify: id >= V": (
        "sa.verify(w(np.array([[0, 1, 2], [3, 5, 0]])), w(P()), w(Q()), rng=0)",
        "ValueError",
    ),
    "verify: negative id": (
        "sa.verify(w(np.array([[-1, 1, 2], [3, 4, 0]])), w(P()), rng=0)",
        "ValueError",
    ),
    "verify: uint64 id above int64 max": (
        "sa.verify(w(np.array([[2**63 + 5, 1, 2], [3, 4, 0]], np.uint64)), P(), rng=0)",
        "ValueError",
    ),
    "verify: float ids": ("sa.verify(IDS().astype(float), P(), rng=0)", "TypeError"),
    "verify: str ids": ("sa.verify('abc', P(), rng=0)", "TypeError"),
    "verify: None ids": ("sa.verify(None, P(), rng=0)", "TypeError"),
    "verify: object ids": ("sa.verify(IDS().astype(object), P(), rng=0)", "TypeError"),
    "verify: complex probs": ("sa.verify(IDS(), P().astype(complex), rng=0)", "TypeError"),
    "verify: list ids": ("sa.verify([[0, 1, 2], [3, 4, 0]], P(), rng=0)", "TypeError"),
    "verify: 1-D ids": ("sa.verify(np.array([0, 1, 2]), P(), rng=0)", "ValueError"),
    "verify: 3-D ids": ("sa.verify(IDS()[None], P(), rng=0)", "ValueError"),
    "verify: target shape": ("sa.verify(IDS(), P(k=2), rng=0)", "ValueError"),
    "verify: draft shape": ("sa.verify(IDS(), P(), Q(v=4), rng=0)", "ValueError"),
    "verify: NaN target": (
        "p = P(); p[:, 0] = np.nan; sa.verify(w(IDS()), w(p), w(Q()), rng=0)",
        "ValueError",
    ),
    "verify: inf target": (
        "p = P(); p[0, 0, 0] = np.inf; sa.verify(IDS(), w(p), rng=0)",
        "ValueError",
    ),
    "verify: negative target": (
        "p = P(); p[:, 0] = -0.2; sa.verify(IDS(), w(p), rng=0)",
        "ValueError",
    ),
    "verify: int target": ("sa.verify(IDS(), np.ones((2, 4, 5), np.int64), rng=0)", "TypeError"),
    "verify: count above K": (
        "sa.verify(IDS(), P(), num_draft_tokens=w(np.array([4, 0])), rng=0)",
        "ValueError",
    ),
    "verify: negative count": (
        "sa.verify(IDS(), P(), num_draft_tokens=w(np.array([-1, 0])), rng=0)",
        "ValueError",
    ),
    "verify: uint64 count above int64 max": (
        "sa.verify(IDS(), P(), num_draft_tokens=np.array([2**64 - 1, 0], np.uint64), rng=0)",
        "ValueError",
    ),
    "verify: counts shape": (
        "sa.verify(IDS(), P(), num_draft_tokens=np.array([1, 1, 1]), rng=0)",
        "ValueError",
    ),
    "verify: NaN uniform": (
        "u = U(); u[0, 0] = np.nan; sa.verify(IDS(), P(), Q(), uniforms=w(u), rng=0)",
        "ValueError",
    ),
    "verify: uniform 1.0": (
        "sa.verify(IDS(), P(), Q(), uniforms=np.ones((2, 3)), rng=0)",
        "ValueError",
    ),
    "verify: negative uniform": (
        "sa.verify(IDS(), P(), Q(), uniforms=np.full((2, 3), -0.1), rng=0)",
        "ValueError",
    ),
    "verify: uniforms shape": (
        "sa.verify(IDS(), P(), Q(), uniforms=np.zeros((2, 2)), rng=0)",
        "ValueError",
    ),
    "verify: inf recovery uniform": (
        "sa.verify(IDS(), P(), Q(), recovery_uniforms=np.array([np.inf, 0.5]), rng=0)",
        "ValueError",
    ),
    "verify: rng str": ("sa.verify(IDS(), P(), rng='abc')", "TypeError"),
    "verify: rng float": ("sa.verify(IDS(), P(), rng=1.5)", "TypeError"),
    "verify: rng negative seed": ("sa.verify(IDS(), P(), rng=-1)", "ValueError"),
    "verify: rng 2**200": ("ok_ver(sa.verify(IDS(), P(), rng=2**200))", "ok"),
    "verify: rng list wrong length": (
        "sa.verify(IDS(), P(), rng=[np.random.default_rng(0)])",
        "ValueError",
    ),
    "verify: rng list of ints": ("sa.verify(IDS(), P(), rng=[1, 2])", "TypeError"),
    "verify: greedy str": ("sa.verify(IDS(), P(), greedy='yes', rng=0)", "TypeError"),
    "verify: greedy wrong length": (
        "sa.verify(IDS(), P(), greedy=np.array([True, False, True]), rng=0)",
        "ValueError",
    ),
    "verify: greedy int array": (
        "sa.verify(IDS(), P(), greedy=np.array([1, 0]), rng=0)",
        "TypeError",
    ),
    "verify: errors bogus": ("sa.verify(IDS(), P(), rng=0, errors='bogus')", "ValueError"),
    "verify: errors None": ("sa.verify(IDS(), P(), rng=0, errors=None)", "TypeError"),
    "verify: errors isolate, one bad row": (
        "ids = np.array([[0, 1, 2], [3, 9, 0]])\n"
        "r = sa.verify(w(ids), w(P()), w(Q()), rng=0, errors='isolate')\n"
        "assert set(r.errors) == {1}, r.errors\n"
        "assert isinstance(r.errors[1], sa.InputError) and r.errors[1].argument\n"
        "assert r.output_token_ids[1].tolist() == [-1] * 4\n"
        "assert 0 <= r.output_token_ids[0, 0] < V",
        "ok",
    ),
    "verify: like str": ("sa.verify(IDS(), P(), rng=0, like='numpy')", "TypeError"),
    "verify: huge stride-0 ids, sampled": (
        "sa.verify(huge_ids(1, 2**40), np.broadcast_to(0.5, (1, 2**40 + 1, 1)), rng=0)",
        "MemoryError",
    ),
    "verify: huge stride-0 ids, greedy": (
        "sa.verify(huge_ids(1, 2**40), np.broadcast_to(0.5, (1, 2**40 + 1, 1)), greedy=True)",
        "MemoryError",
    ),
    "verify: huge stride-0 batch, target shape wrong": (
        "sa.verify(huge_ids(2**40, 1), np.full((1, 2, 2), 0.5), rng=0)",
        "ValueError|MemoryError",
    ),
    # --- verify, out= -----------------------------------------------------------------
    "verify out: valid buffers": (
        "o = sa.Verification.empty(2, 3)\n"
        "r = sa.verify(w(IDS()), w(P()), w(Q()), rng=0, out=o)\n"
        "assert r.output_token_ids is o.output_token_ids\n"
        "ok_ver(r)",
        "ok",
    ),
    "verify out: aliases the ids": (
        "ids = np.zeros((2, 4), np.int64)\n"
        "sa.verify(w(ids[:, :3]), P(), rng=0, out=(ids, np.zeros(2, np.int64)))",
        "ValueError",
    ),
    "verify out: buffers share memory": (
        "o = np.zeros((2, 4), np.int64)\nsa.verify(w(IDS()), w(P()), rng=0, out=(o, o[:, 0]))",
        "ValueError",
    ),
    "verify out: stride-0 writeable": (
        "o = np.lib.stride_tricks.as_strided(np.zeros(4, np.int64), (2, 4), (0, 8))\n"
        "sa.verify(w(IDS()), w(P()), rng=0, out=(o, np.zeros(2, np.int64)))",
        "ValueError",
    ),
    "verify out: int32": (
        "sa.verify(IDS(), P(), rng=0, out=(np.zeros((2, 4), np.int32), np.zeros(2, np.int32)))",
        "TypeError",
    ),
    "verify out: read-only": (
        "o = np.zeros((2, 4), np.int64); o.flags.writeable = False\n"
        "sa.verify(IDS(), P(), rng=0, out=(o, np.zeros(2, np.int64)))",
        "ValueError",
    ),
    "verify out: wrong shape": (
        "sa.verify(IDS(), P(), rng=0, out=(np.zeros((2, 3), np.int64), np.zeros(2, np.int64)))",
        "ValueError",
    ),
    "verify out: str": ("sa.verify(IDS(), P(), rng=0, out='buffers')", "TypeError"),
    "verify out: one-tuple": (
        "sa.verify(IDS(), P(), rng=0, out=(np.zeros((2, 4), np.int64),))",
        "TypeError",
    ),
    # --- verify_greedy ------------------------------------------------------------------
    "verify_greedy: valid": (
        "r = sa.verify_greedy(w(np.array([[3, 4, 5]])), w(np.array([[3, 4, 9, 6]])))\n"
        "assert r.to_lists() == [[3, 4, 9]], r.to_lists()",
        "ok",
    ),
    "verify_greedy: shape mismatch": (
        "sa.verify_greedy(np.array([[3, 4, 5]]), np.array([[3, 4, 5]]))",
        "ValueError",
    ),
    "verify_greedy: huge stride-0": (
        "sa.verify_greedy(huge_ids(1, 2**40), huge_ids(1, 2**40 + 1))",
        "MemoryError",
    ),
    "verify_greedy: float ids": (
        "sa.verify_greedy(np.array([[3.0]]), np.array([[3, 4]]))",
        "TypeError",
    ),
    "verify_greedy: uint64 ids above int64 max": (
        "big = np.array([[2**64 - 1]], np.uint64)\n"
        "sa.verify_greedy(big, np.array([[2**64 - 1, 2**64 - 2]], np.uint64))",
        "ValueError",
    ),
    "verify_greedy: count above K": (
        "sa.verify_greedy(np.array([[3]]), np.array([[3, 4]]), num_draft_tokens=np.array([2]))",
        "ValueError",
    ),
    "verify_greedy: out aliases target": (
        "t = np.array([[3, 4]])\n"
        "sa.verify_greedy(w(np.array([[3]])), t, out=(t, np.zeros(1, np.int64)))",
        "ValueError",
    ),
    "verify_greedy: out stride-0": (
        "o = np.lib.stride_tricks.as_strided(np.zeros(4, np.int64), (3, 4), (0, 8))\n"
        "sa.verify_greedy(np.zeros((3, 3), np.int64), np.zeros((3, 4), np.int64),"
        " out=(o, np.zeros(3, np.int64)))",
        "ValueError",
    ),
    # --- rejection_probability ---------------------------------------------------------
    "rejection_probability: scalars": (
        "assert abs(float(sa.rejection_probability(0.6, 0.8)) - 0.25) < 1e-12",
        "ok",
    ),
    "rejection_probability: NaN": ("sa.rejection_probability(np.nan, 0.5)", "ValueError"),
    "rejection_probability: above 1": ("sa.rejection_probability(1.5, 0.5)", "ValueError"),
    "rejection_probability: str": ("sa.rejection_probability('a', 0.5)", "TypeError"),
    "rejection_probability: 2**2000": ("sa.rejection_probability(2**2000, 0.5)", "ValueError"),
    "rejection_probability: huge stride-0": (
        "sa.rejection_probability(np.broadcast_to(0.5, (2**40,)), 0.5)",
        "MemoryError",
    ),
    # --- stats closed forms ---------------------------------------------------------
    "best_num_draft_tokens: max_k 2**62 fast": (
        "assert 0 <= sa.best_num_draft_tokens(0.5, 0.1, 2**62) <= 2**62",
        "ok",
    ),
    "best_num_draft_tokens: max_k -1": ("sa.best_num_draft_tokens(0.5, 0.1, -1)", "ValueError"),
    "expected_tokens_per_step: a 1.5": ("sa.expected_tokens_per_step(1.5, 4)", "ValueError"),
    # --- threads --------------------------------------------------------------------
    "set_num_threads: 2**64": ("sa.set_num_threads(2**64)", "ValueError"),
    "set_num_threads: 10**6": ("sa.set_num_threads(10**6)", "ValueError"),
    "set_num_threads: 0": ("sa.set_num_threads(0)", "ValueError"),
    "set_num_threads: float": ("sa.set_num_threads(1.5)", "TypeError"),
    # --- AcceptanceStats --------------------------------------------------------------
    "AcceptanceStats: update None": ("sa.AcceptanceStats().update(None)", "TypeError"),
    "AcceptanceStats: deeply nested JSON": (
        "sa.AcceptanceStats.from_json('[' * 100000 + ']' * 100000)",
        "ValueError",
    ),
    # --- compat.vllm -----------------------------------------------------------------
    "vllm.rejection_sample: count 2**40": (
        "vllm.rejection_sample(np.array([0]), [2**40], np.ones((1, 2)) / 2, None,"
        " np.array([[0]]), rng=0)",
        "ValueError",
    ),
    "vllm.rejection_sample: counts 2**40 and -2**40": (
        "vllm.rejection_sample(np.array([0]), [2**40, -2**40], np.ones((1, 2)) / 2, None,"
        " np.array([[0]]), rng=0)",
        "ValueError",
    ),
    "vllm.verify: placeholder ends the drafts": (
        "p = probs(3, 8)\n"
        "r = vllm.verify(w(np.array([3, -1, 5])), [3], w(p), None, w(np.array([7])), rng=0)\n"
        "assert r.output_token_ids.shape[0] == 1\n"
        "assert ((0 <= r.tokens(0)) & (r.tokens(0) < 8)).all()\n"
        "assert int(r.num_accepted[0]) <= 1",
        "ok",
    ),
    # --- verify_tree -------------------------------------------------------------------
    "verify_tree: huge stride-0 batch, target shape wrong": (
        "sa.verify_tree(huge_ids(2**40, 1), np.array([-1]), np.full((1, 1, 2), 0.5), greedy=True)",
        "ValueError",
    ),
    # --- CLI ------------------------------------------------------------------------------
    "cli: demo --max-new-tokens -5": ("cli('demo', '--max-new-tokens', '-5')", "ok"),
    "cli: compare --bogus": ("cli('compare', '--bogus')", "ok"),
}

# Cases run alone with SPECACCEPT_NUM_THREADS set to this value before import.
ENV: dict[str, str] = {}
for _value in ("0", "-1", "abc", "1e23", "99999999999999999999999", "1000000"):
    _case = f"SPECACCEPT_NUM_THREADS: {_value!r}"
    CASES[_case] = ("n = sa.get_num_threads(); assert 1 <= n <= sa.max_num_threads(), n", "ok")
    ENV[_case] = _value


def _same(before: object, after: object) -> bool:
    import numpy as np

    if isinstance(after, np.ndarray):
        return (
            isinstance(before, np.ndarray)
            and before.dtype == after.dtype
            and before.shape == after.shape
            and before.tobytes() == after.tobytes()
        )
    try:
        return bool(before == after)
    except Exception:
        return False


def classify(error: BaseException) -> str:
    """The outcome a raised exception stands for."""
    if isinstance(error, TypeError):
        return "TypeError"
    if isinstance(error, ValueError):
        if getattr(error, "argument", None) and type(error).__name__ == "InputError":
            return "ValueError"
        return "ValueError-without-argument"
    if isinstance(error, MemoryError):
        return "MemoryError" if _NAMED.search(str(error)) else "MemoryError-unnamed"
    return type(error).__name__


def run_cases(case_ids: list[str]) -> None:
    """Runs the cases in this process, one JSON line each on stdout."""
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
    base: dict = {}
    try:
        exec(compile(SETUP, "SETUP", "exec"), base)
        setup_error = None
    except BaseException as error:
        setup_error = f"setup failed: {type(error).__name__}: {error}"
    for case in case_ids:
        report: dict = {"case": case, "inputs_unchanged": None}
        if setup_error is not None:
            report.update(outcome="setup-failed", message=setup_error[:300])
        else:
            watched: list = []
            base["_watched"] = watched  # where the setup's w() records inputs
            namespace = dict(base)
            source = CASES[case][0]
            try:
                try:
                    code, mode = compile(source, case, "eval"), "eval"
                except SyntaxError:
                    code, mode = compile(source, case, "exec"), "exec"
                if mode == "eval":
                    eval(code, namespace)
                else:
                    exec(code, namespace)
                report.update(outcome="ok", message="")
            except BaseException as error:
                report["outcome"] = classify(error)
                report["exception"] = type(error).__name__
                report["argument"] = getattr(error, "argument", None)
                report["message"] = str(error)[:300]
            if watched:
                report["inputs_unchanged"] = all(_same(b, a) for a, b in watched)
        print(json.dumps(report, default=repr), flush=True)


if __name__ == "__main__":
    run_cases(sys.argv[1:])
