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
from specaccept import generation, lab, lossy, ngram, reference
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

    def __init__(self, vocab_size=4, answer=None, onehot=None):
        self.vocab_size = vocab_size
        self.answer = answer
        self.onehot = onehot

    def next_token_probs(self, sequences, num_positions):
        if self.answer is not None or self.onehot == "none":
            return self.answer
        if self.onehot is not None:
            out = np.zeros((len(sequences), num_positions, self.vocab_size))
            out[:, :, self.onehot] = 1.0
            return out
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
    "vocab_size",
    "seeds",
    "offsets",
    "num_positions",
    "epsilon",
    "delta",
    "acceptance_rate",
    "samples",
    "methods",
    "draft_token_probs",
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
    "verify_tree: method traversal": (
        "r = sa.verify_tree(np.array([[0, 1, 2, 0]]), np.array([-1, 0, 0, 2]), "
        "np.full((1, 4, 3), 1 / 3), np.full((1, 4, 3), 1 / 3), rng=0, method='traversal')\n"
        "assert r.num_emitted[0] == r.num_accepted[0] + 1",
        "ok",
    ),
    "verify_tree: method bogus": (
        "sa.verify_tree(np.array([[0, 1]]), np.array([-1, 0]), np.full((1, 2, 3), 1 / 3), "
        "rng=0, method='block')",
        "ValueError",
    ),
    "verify_tree: method None": (
        "sa.verify_tree(np.array([[0, 1]]), np.array([-1, 0]), np.full((1, 2, 3), 1 / 3), "
        "rng=0, method=None)",
        "TypeError",
    ),
    "verify_tree: traversal, NaN draft row": (
        "q = np.full((1, 2, 3), 1 / 3); q[0, 1] = [0.2, 0.6, np.nan]\n"
        "sa.verify_tree(np.array([[0, 1]]), np.array([-1, 0]), np.full((1, 2, 3), 1 / 3), q, "
        "uniforms=np.full((1, 2), 0.999), recovery_uniforms=np.array([0.5]), method='traversal')",
        "ValueError",
    ),
    "verify_tree: traversal, huge stride-0 rows": (
        "sa.verify_tree(np.zeros((1, 3), np.int64), np.array([-1, 0, 1]), "
        "np.broadcast_to(0.5, (1, 3, 2**29)), np.broadcast_to(0.5, (1, 3, 2**29)), "
        "uniforms=np.full((1, 3), 0.999), recovery_uniforms=np.array([0.5]), method='traversal')",
        "ok|MemoryError",
    ),
    "expected_num_accepted_tree: valid": (
        "e = lab.expected_num_accepted_tree(np.array([[0, 1, 2]]), np.array([-1, 0, 1]), "
        "np.full((1, 3, 3), 1 / 3), method='traversal')\nassert 0 <= e[0] <= 2",
        "ok",
    ),
    "expected_num_accepted_tree: bad parent": (
        "lab.expected_num_accepted_tree(np.array([[0, 1]]), np.array([-1, 5]), np.full((1, 2, 3), 1 / 3))",
        "ValueError",
    ),
    "expected_num_accepted_tree: too deep": (
        "n = 400\nlab.expected_num_accepted_tree(np.zeros((1, n), np.int64), np.arange(-1, n - 1), "
        "np.full((1, n, 2), 0.5))",
        "ValueError",
    ),
    "verify_logits: method block": (
        "ok_ver(sa.verify_logits(w(IDS()), w(np.log(P())), w(np.log(Q())), rng=0, method='block'))",
        "ok",
    ),
    "verify_logits: method bogus": (
        "sa.verify_logits(IDS(), np.log(P()), rng=0, method='traversal')",
        "ValueError",
    ),
    "vllm.verify: rejection_sample_method block": (
        "r = vllm.verify(np.array([1, 2]), [2], np.full((2, 5), 0.2), np.full((2, 5), 0.2), "
        "np.array([3]), rng=0, rejection_sample_method='block')\nassert r.num_emitted[0] >= 1",
        "ok",
    ),
    "vllm.verify: rejection_sample_method synthetic": (
        "vllm.verify(np.array([1]), [1], np.full((1, 5), 0.2), None, np.array([3]), rng=0, "
        "rejection_sample_method='synthetic')",
        "ValueError",
    ),
    "vllm.verify: rejection_sample_method int": (
        "vllm.verify(np.array([1]), [1], np.full((1, 5), 0.2), None, np.array([3]), rng=0, "
        "rejection_sample_method=1)",
        "TypeError",
    ),
    "vllm.verify: methods disagree": (
        "vllm.verify(np.array([1]), [1], np.full((1, 5), 0.2), None, np.array([3]), rng=0, "
        "method='block', rejection_sample_method='standard')",
        "ValueError",
    ),
    "ngram.drafted_tree: parent after child": (
        "from specaccept.ngram import builtin_models, drafted_tree\n"
        "t, d, v = builtin_models()\n"
        "drafted_tree(t, d, [1, 2], [-1, 2, 0], np.random.default_rng(0))",
        "ValueError",
    ),
    "ngram.drafted_block: k = 0": (
        "from specaccept.ngram import builtin_models, drafted_block\n"
        "t, d, v = builtin_models()\n"
        "ids, p, q = drafted_block(t, d, [1, 2], 0, np.random.default_rng(0))\n"
        "assert ids.shape == (1, 0) and p.shape[1] == 1",
        "ok",
    ),
    "verify: method block": (
        "ok_ver(sa.verify(w(IDS()), w(P()), w(Q()), rng=0, method='block'))",
        "ok",
    ),
    "verify: method block, one-hot": (
        "ok_ver(sa.verify(w(IDS()), w(P()), rng=0, method='block'))",
        "ok",
    ),
    "verify: method bogus": ("sa.verify(IDS(), P(), rng=0, method='tree')", "ValueError"),
    "verify: method None": ("sa.verify(IDS(), P(), rng=0, method=None)", "TypeError"),
    "verify: method block, NaN row": (
        "p = P(); p[:, 1, :] = np.nan\nsa.verify(IDS(), p, Q(), uniforms=np.full((2, 3), 0.999), "
        "recovery_uniforms=np.full(2, 0.5), method='block')",
        "ValueError",
    ),
    "verify: method block, huge stride-0 rows": (
        "sa.verify(np.zeros((1, 2), np.int64), np.broadcast_to(0.5, (1, 3, 2**29)), "
        "np.broadcast_to(0.5, (1, 2, 2**29)), uniforms=np.full((1, 2), 0.999), "
        "recovery_uniforms=np.full(1, 0.5), method='block')",
        "ok|MemoryError",
    ),
    "expected_num_accepted: valid": (
        "e = lab.expected_num_accepted(IDS(), P(), Q(), method='block')\nassert e.shape == (2,)",
        "ok",
    ),
    "expected_num_accepted: bad method": (
        "lab.expected_num_accepted(IDS(), P(), method=1)",
        "TypeError",
    ),
    "expected_num_accepted: shape": ("lab.expected_num_accepted(IDS(), P()[:, :2])", "ValueError"),
    "expected_num_accepted: id >= V": (
        "lab.expected_num_accepted(np.full((2, 3), 99), P())",
        "ValueError",
    ),
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
    # --- AdaptiveK, HeuristicK (docs/spec.md section 13) -------------------------------
    "AdaptiveK: max_k 2**64": ("sa.AdaptiveK(max_k=2**64)", "ValueError"),
    "AdaptiveK: max_k past MAX_K": ("sa.AdaptiveK(max_k=10**9)", "ValueError"),
    "AdaptiveK: max_k MAX_K, available huge": (
        "s = sa.AdaptiveK(max_k=4096)\n"
        "s.observe([0], [2**62], [2**62])\n"
        "s.choose([0, 1], [2**62, 5], remaining=[2**62, 1])",
        "ok",
    ),
    "AdaptiveK: choose remaining 0": (
        "sa.AdaptiveK().choose([0], [1], remaining=[0])",
        "ValueError",
    ),
    "AdaptiveK: choose available 2**64 - 1": (
        "sa.AdaptiveK().choose([0], np.array([2**64 - 1], np.uint64))",
        "ValueError",
    ),
    "AdaptiveK: choose available Python 2**70": (
        "sa.AdaptiveK().choose([0], [2**70])",
        "ValueError",
    ),
    "AdaptiveK: memory inf": ("sa.AdaptiveK(memory=math.inf, cost_memory=math.inf)", "ok"),
    "AdaptiveK: memory nan": ("sa.AdaptiveK(memory=math.nan)", "ValueError"),
    "AdaptiveK: prior_weight inf": ("sa.AdaptiveK(prior_weight=math.inf).acceptance(0)", "ok"),
    "AdaptiveK: min_k above max_k": ("sa.AdaptiveK(max_k=1, min_k=2)", "ValueError"),
    "AdaptiveK: choose 2-D available": (
        "sa.AdaptiveK().choose([0], np.array([[1]]))",
        "TypeError",
    ),
    "AdaptiveK: choose float available": (
        "sa.AdaptiveK().choose([0], np.array([1.0]))",
        "TypeError",
    ),
    "AdaptiveK: choose unhashable request": ("sa.AdaptiveK().choose([{}], [1])", "TypeError"),
    "AdaptiveK: choose generator": ("sa.AdaptiveK().choose(iter([0]), [1])", "TypeError"),
    "AdaptiveK: choose nothing": ("sa.AdaptiveK().choose([], [])", "ok"),
    "AdaptiveK: observe huge counts": (
        "sa.AdaptiveK().observe([0], [2**62], [2**62])",
        "ok",
    ),
    "AdaptiveK: observe uint64 past int64": (
        "sa.AdaptiveK().observe([0], np.array([2**64 - 1], np.uint64), [0])",
        "ValueError",
    ),
    "AdaptiveK: observe inf acceptance": (
        "sa.AdaptiveK().observe([0], [1], [0], acceptances=[[math.inf]])",
        "ValueError",
    ),
    "AdaptiveK: observe acceptances None rows": (
        "sa.AdaptiveK().observe([0, 1], [2, 1], [1, 0], acceptances=[None, None])",
        "ok",
    ),
    "AdaptiveK: observe ragged acceptances": (
        "sa.AdaptiveK().observe([0, 1], [1, 1], [0, 0], acceptances=[[0.5] * 10**5, []])",
        "ok",
    ),
    "AdaptiveK: observe_cost huge": (
        "s = sa.AdaptiveK()\n"
        "for i in range(3): s.observe_cost(1e300, 2**62 + i, 2**62)\n"
        "s.choose([0], [4])",
        "ok",
    ),
    "AdaptiveK: observe_cost bool": ("sa.AdaptiveK().observe_cost(True, 1)", "TypeError"),
    "AdaptiveK: observe_cost seconds 10**400": (
        "sa.AdaptiveK().observe_cost(10**400, 1)",
        "ValueError",
    ),
    "AdaptiveK: predict_seconds huge": (
        "sa.AdaptiveK().predict_seconds(10**400, 0)",
        "ValueError",
    ),
    "AdaptiveK: predict_seconds nan": (
        "sa.AdaptiveK().predict_seconds(math.nan, 0)",
        "ValueError",
    ),
    "AdaptiveK: predict_seconds str": ("sa.AdaptiveK().predict_seconds('1', 0)", "TypeError"),
    "AdaptiveK: cost_memory 1, prior_weight inf": (
        "s = sa.AdaptiveK(cost_memory=1, prior_weight=math.inf)\n"
        "for i in range(4): s.choose([0, 1], [4, 4], remaining=[3, 9]); "
        "s.observe_cost(0.01 * (i + 1), 2 + i)\n"
        "s.choose([0, 1], [4, 4], remaining=[3, 9])",
        "ok",
    ),
    "HeuristicK: start 2**63": ("sa.HeuristicK(start=2**63).choose([0], [2**62])", "ok"),
    "HeuristicK: observe mismatched": ("sa.HeuristicK().observe([0, 1], [1], [1])", "ValueError"),
    "HeuristicK: finish unknown": ("sa.HeuristicK().finish([5, 'x'])", "ok"),
    "generate: k schedule object of the wrong kind": (
        "sa.generate(ngram.builtin_models()[0], sa.PromptLookup(), [[1]], k=object())",
        "TypeError",
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
    "vllm.verify_logits: valid greedy, a zero-draft request": (
        "l = w(np.log(np.eye(4)[[1, 3, 0, 2]] + 1e-9))\n"
        "r = vllm.verify_logits(w(np.array([1, 2])), [2, 0], l, temperature=0.0)\n"
        "assert r.output_token_ids.tolist() == [[1, 3, -1], [2, -1, -1]], r",
        "ok",
    ),
    "vllm.verify_logits: valid sampled, draft probabilities, block": (
        "l = w(np.log(probs(5, 8)))\n"
        "r = vllm.verify_logits(w(np.array([1, 2, 3])), [2, 1], l, w(probs(3, 8, seed=1)),"
        " temperature=0.8, top_k=3, rng=0, method='block')\n"
        "assert all(((0 <= r.tokens(b)) & (r.tokens(b) < 8)).all() for b in range(2))",
        "ok",
    ),
    "vllm.verify_logits: placeholder ends the drafts": (
        "l = w(np.log(probs(4, 8)))\n"
        "r = vllm.verify_logits(w(np.array([3, -1, 5])), [3], l, rng=0)\n"
        "assert int(r.num_accepted[0]) <= 1",
        "ok",
    ),
    "vllm.verify_logits: empty step": (
        "r = vllm.verify_logits(np.zeros(0, np.int64), [], np.zeros((0, 8)), rng=0)\n"
        "assert r.output_token_ids.shape[0] == 0",
        "ok",
    ),
    "vllm.verify_logits: NaN row isolated": (
        "l = np.log(probs(5, 8)); l[3, 2] = np.nan\n"
        "r = vllm.verify_logits(np.array([1, 2, 3]), [2, 1], w(l), rng=0, errors='isolate')\n"
        "assert 1 in r.errors and 'logits[3, 2]' in str(r.errors[1])",
        "ok",
    ),
    "vllm.verify_logits: rows do not match the counts": (
        "vllm.verify_logits(np.array([1, 2, 3]), [2, 1], np.zeros((4, 8)), rng=0)",
        "ValueError",
    ),
    "vllm.verify_logits: draft_probs rows do not match": (
        "vllm.verify_logits(np.array([1, 2, 3]), [2, 1], np.zeros((5, 8)), probs(2, 8), rng=0)",
        "ValueError",
    ),
    "vllm.verify_logits: negative draft probability": (
        "q = probs(3, 8); q[0, 1] = -1.0\n"
        "vllm.verify_logits(np.array([1, 2, 3]), [2, 1], np.zeros((5, 8)), w(q), rng=0,"
        " temperature=1.0)",
        "ValueError",
    ),
    "vllm.verify_logits: count 2**40": (
        "vllm.verify_logits(np.array([0]), [2**40], np.zeros((2, 2)), rng=0)",
        "ValueError",
    ),
    "vllm.verify_logits: negative count": (
        "vllm.verify_logits(np.array([0]), [2, -1], np.zeros((3, 2)), rng=0)",
        "ValueError",
    ),
    "vllm.verify_logits: 3-D logits": (
        "vllm.verify_logits(np.array([0]), [1], np.zeros((1, 2, 2)), rng=0)",
        "ValueError",
    ),
    "vllm.verify_logits: int logits": (
        "vllm.verify_logits(np.array([0]), [1], np.zeros((2, 2), np.int64), rng=0)",
        "TypeError",
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

# A valid tree: root with two children (tokens 1 and 2); child 2 has a child (token 0).
_TREE = (
    "np.array([[0, 1, 2, 0]]), np.array([-1, 0, 0, 2]), "
    "np.array([[[0.0, 0.0, 1.0], [1, 0, 0], [1.0, 0.0, 0.0], [0, 1, 0]]])"
)
_TREE_IDS = "np.array([[0, 1, 2, 0]])"
_TREE_PARENTS = "np.array([-1, 0, 0, 2])"
_TREE_P = "np.full((1, 4, 3), 1 / 3)"
_LOGITS = "np.log(P())"

CASES.update(
    {
        # --- verify_logits ---------------------------------------------------------------
        "verify_logits: valid": (
            f"ok_ver(sa.verify_logits(w(IDS()), w({_LOGITS}), w(np.log(Q())), rng=0))",
            "ok",
        ),
        "verify_logits: filters": (
            f"ok_ver(sa.verify_logits(w(IDS()), w({_LOGITS}), temperature=0.7, top_k=2,"
            " top_p=0.9, rng=0))",
            "ok",
        ),
        "verify_logits: greedy rows": (
            f"ok_ver(sa.verify_logits(w(IDS()), w({_LOGITS}), temperature=0.0))",
            "ok",
        ),
        "verify_logits: per-row settings": (
            f"ok_ver(sa.verify_logits(IDS(), {_LOGITS}, temperature=w(np.array([0.0, 2.0])),"
            " top_k=w(np.array([0, 1])), top_p=w(np.array([1.0, 0.5])), rng=0))",
            "ok",
        ),
        "verify_logits: min_p both orders, per row": (
            f"l = w({_LOGITS}); m = w(np.array([0.0, 0.9]))\n"
            "ok_ver(sa.verify_logits(w(IDS()), l, temperature=0.7, top_p=0.8, min_p=m, rng=0))\n"
            "ok_ver(sa.verify_logits(w(IDS()), l, top_k=2, min_p=1.0, min_p_last=True, rng=0))",
            "ok",
        ),
        "verify_logits: min_p NaN": (
            f"sa.verify_logits(IDS(), {_LOGITS}, min_p=np.nan, rng=0)",
            "ValueError",
        ),
        "verify_logits: min_p -0.0 and 1 + eps": (
            f"sa.verify_logits(IDS(), {_LOGITS}, min_p=np.array([-0.0, 1 + 2**-52]), rng=0)",
            "ValueError",
        ),
        "verify_logits: min_p 2**2000": (
            f"sa.verify_logits(IDS(), {_LOGITS}, min_p=2**2000, rng=0)",
            "ValueError",
        ),
        "verify_logits: min_p wrong length": (
            f"sa.verify_logits(IDS(), {_LOGITS}, min_p=np.zeros(3), rng=0)",
            "ValueError",
        ),
        "verify_logits: min_p str": (
            f"sa.verify_logits(IDS(), {_LOGITS}, min_p='low', rng=0)",
            "TypeError",
        ),
        "verify_logits: min_p_last not a bool": (
            f"sa.verify_logits(IDS(), {_LOGITS}, min_p=0.1, min_p_last='yes', rng=0)",
            "TypeError",
        ),
        "verify_tree_logits: min_p and traversal": (
            f"ok_tree(sa.verify_tree_logits(w(np.array([[0, 1, 2, 0]])), {_TREE_PARENTS},"
            f" w(np.log({_TREE_P})), min_p=w(np.array([0.5])), method='traversal', rng=0), 1, 3)",
            "ok",
        ),
        "verify_tree_logits: min_p out of range": (
            f"sa.verify_tree_logits(np.array([[0, 1, 2, 0]]), {_TREE_PARENTS},"
            f" np.log({_TREE_P}), min_p=1.5, rng=0)",
            "ValueError",
        ),
        "vllm.verify_logits: min_p": (
            "r = vllm.verify_logits(w(np.array([1, 2])), [2, 0], w(np.log(np.eye(4)[[1, 3, 0, 2]]"
            " + 1e-3)), temperature=0.5, min_p=w(np.array([0.2, 1.0])), rng=0)\n"
            "assert r.output_token_ids.shape == (2, 3)",
            "ok",
        ),
        "verify_logits: -inf masks": (
            "l = np.log(P()); l[:, :, 4] = -np.inf\n"
            "ok_ver(sa.verify_logits(w(np.array([[0, 1, 2], [3, 2, 0]])), w(l), rng=0))",
            "ok",
        ),
        "verify_logits: negative temperature": (
            f"sa.verify_logits(IDS(), {_LOGITS}, temperature=-1.0, rng=0)",
            "ValueError",
        ),
        "verify_logits: NaN temperature": (
            f"sa.verify_logits(IDS(), {_LOGITS}, temperature=np.nan, rng=0)",
            "ValueError",
        ),
        "verify_logits: inf temperature": (
            f"sa.verify_logits(IDS(), {_LOGITS}, temperature=np.inf, rng=0)",
            "ValueError",
        ),
        "verify_logits: tiny temperature": (
            f"ok_ver(sa.verify_logits(IDS(), {_LOGITS}, temperature=1e-300, rng=0))",
            "ok",
        ),
        "verify_logits: subnormal temperature": (
            f"sa.verify_logits(IDS(), {_LOGITS}, temperature=5e-324, rng=0)",
            "ValueError",
        ),
        "verify_logits: temperature 2**2000": (
            f"sa.verify_logits(IDS(), {_LOGITS}, temperature=2**2000, rng=0)",
            "ValueError",
        ),
        "verify_logits: temperature str": (
            f"sa.verify_logits(IDS(), {_LOGITS}, temperature='hot', rng=0)",
            "TypeError",
        ),
        "verify_logits: temperature None": (
            f"sa.verify_logits(IDS(), {_LOGITS}, temperature=None, rng=0)",
            "TypeError",
        ),
        "verify_logits: temperature wrong length": (
            f"sa.verify_logits(IDS(), {_LOGITS}, temperature=np.ones(3), rng=0)",
            "ValueError",
        ),
        "verify_logits: top_k negative": (
            f"sa.verify_logits(IDS(), {_LOGITS}, top_k=-1, rng=0)",
            "ValueError",
        ),
        "verify_logits: top_k -2**63": (
            f"sa.verify_logits(IDS(), {_LOGITS}, top_k=-(2**63), rng=0)",
            "ValueError",
        ),
        "verify_logits: top_k 2**63": (
            f"ok_ver(sa.verify_logits(IDS(), {_LOGITS}, top_k=2**63, rng=0))",
            "ok|ValueError",
        ),
        "verify_logits: top_k 2**64": (
            f"ok_ver(sa.verify_logits(IDS(), {_LOGITS}, top_k=2**64, rng=0))",
            "ok|ValueError",
        ),
        "verify_logits: top_k 2**200": (
            f"ok_ver(sa.verify_logits(IDS(), {_LOGITS}, top_k=2**200, rng=0))",
            "ok|ValueError",
        ),
        "verify_logits: top_k float": (
            f"sa.verify_logits(IDS(), {_LOGITS}, top_k=1.5, rng=0)",
            "TypeError",
        ),
        "verify_logits: top_k uint64 array above int64 max": (
            f"ok_ver(sa.verify_logits(IDS(), {_LOGITS},"
            " top_k=np.array([2**64 - 1, 1], np.uint64), rng=0))",
            "ok|ValueError",
        ),
        "verify_logits: top_p 0": (
            f"sa.verify_logits(IDS(), {_LOGITS}, top_p=0.0, rng=0)",
            "ValueError",
        ),
        "verify_logits: top_p 1.5": (
            f"sa.verify_logits(IDS(), {_LOGITS}, top_p=1.5, rng=0)",
            "ValueError",
        ),
        "verify_logits: top_p NaN": (
            f"sa.verify_logits(IDS(), {_LOGITS}, top_p=np.nan, rng=0)",
            "ValueError",
        ),
        "verify_logits: NaN logit": (
            "l = np.log(P()); l[0, 0, 1] = np.nan\nsa.verify_logits(IDS(), w(l), rng=0)",
            "ValueError",
        ),
        "verify_logits: +inf logit": (
            "l = np.log(P()); l[0, 0, 1] = np.inf\nsa.verify_logits(IDS(), w(l), rng=0)",
            "ValueError",
        ),
        "verify_logits: all -inf row": (
            "l = np.log(P()); l[0, 0] = -np.inf\nsa.verify_logits(IDS(), w(l), rng=0)",
            "ValueError",
        ),
        "verify_logits: huge finite logits": (
            "l = np.full((2, 4, 5), 1e308); l[:, :, 0] = -1e308\n"
            "ok_ver(sa.verify_logits(IDS(), w(l), temperature=1e-300, rng=0))",
            "ok",
        ),
        "verify_logits: id >= V": (
            f"sa.verify_logits(np.array([[0, 1, 5], [0, 0, 0]]), {_LOGITS}, rng=0)",
            "ValueError",
        ),
        "verify_logits: 1-D ids": (
            f"sa.verify_logits(np.array([0, 1, 2]), {_LOGITS}, rng=0)",
            "ValueError",
        ),
        "verify_logits: logits shape": (
            "sa.verify_logits(IDS(), np.zeros((2, 3, 5)), rng=0)",
            "ValueError",
        ),
        "verify_logits: int logits": (
            "sa.verify_logits(IDS(), np.zeros((2, 4, 5), np.int64), rng=0)",
            "TypeError",
        ),
        "verify_logits: errors bogus": (
            f"sa.verify_logits(IDS(), {_LOGITS}, rng=0, errors='ignore')",
            "ValueError",
        ),
        "verify_logits: errors isolate, NaN row": (
            "l = np.log(P()); l[1, 0, :] = np.nan\n"
            "r = sa.verify_logits(w(IDS()), w(l), rng=0, errors='isolate')\n"
            "assert set(r.errors) == {1}, r.errors\n"
            "assert r.errors[1].argument",
            "ok",
        ),
        "verify_logits: huge stride-0 vocabulary": (
            "ok_ver(sa.verify_logits(np.zeros((1, 1), np.int64),"
            " np.broadcast_to(0.0, (1, 2, 2**29)), rng=0), 1, 1, 2**29)",
            "ok|MemoryError",
        ),
        "verify_logits: huge stride-0 ids": (
            "sa.verify_logits(huge_ids(1, 2**40), np.broadcast_to(0.0, (1, 2**40 + 1, 1)), rng=0)",
            "MemoryError",
        ),
        # --- verify_tree ----------------------------------------------------------------
        "verify_tree: docstring tree": (
            f"r = sa.verify_tree({_TREE}, greedy=True)\n"
            "assert r.output_token_ids.tolist() == [[2, 0, 1]], r\n"
            "assert r.accepted_node_ids.tolist() == [[2, 3]], r",
            "ok",
        ),
        "verify_tree: sampled": (
            f"ok_tree(sa.verify_tree(w({_TREE_IDS}), w({_TREE_PARENTS}), w({_TREE_P}), rng=0),"
            " 1, 3)",
            "ok",
        ),
        "verify_tree: with draft probs": (
            f"ok_tree(sa.verify_tree(w({_TREE_IDS}), w({_TREE_PARENTS}), w({_TREE_P}),"
            f" w({_TREE_P}), rng=0), 1, 3)",
            "ok",
        ),
        "verify_tree: root only": (
            "ok_tree(sa.verify_tree(np.zeros((2, 1), np.int64), np.array([-1]),"
            " np.full((2, 1, 3), 1 / 3), rng=0), 2, 3)",
            "ok",
        ),
        "verify_tree: empty batch": (
            "sa.verify_tree(np.zeros((0, 2), np.int64), np.array([-1, 0]), np.zeros((0, 2, 3)),"
            " rng=0)",
            "ok",
        ),
        "verify_tree: no nodes": (
            "sa.verify_tree(np.zeros((1, 0), np.int64), np.zeros(0, np.int64),"
            " np.zeros((1, 0, 3)), rng=0)",
            "ok|ValueError",
        ),
        "verify_tree: forward parent": (
            f"sa.verify_tree({_TREE_IDS}, np.array([-1, 0, 3, 2]), {_TREE_P}, rng=0)",
            "ValueError",
        ),
        "verify_tree: self parent": (
            f"sa.verify_tree({_TREE_IDS}, np.array([-1, 1, 0, 2]), {_TREE_P}, rng=0)",
            "ValueError",
        ),
        "verify_tree: root with a parent": (
            f"sa.verify_tree({_TREE_IDS}, np.array([0, 0, 0, 2]), {_TREE_P}, rng=0)",
            "ValueError",
        ),
        "verify_tree: parent -2": (
            f"sa.verify_tree({_TREE_IDS}, np.array([-1, 0, -2, 2]), {_TREE_P}, rng=0)",
            "ValueError",
        ),
        "verify_tree: parent uint64 above int64 max": (
            f"sa.verify_tree({_TREE_IDS}, np.array([2**64 - 1, 0, 0, 2], np.uint64),"
            f" {_TREE_P}, rng=0)",
            "ValueError",
        ),
        "verify_tree: parents shape": (
            f"sa.verify_tree({_TREE_IDS}, np.array([-1, 0, 0]), {_TREE_P}, rng=0)",
            "ValueError",
        ),
        "verify_tree: token >= V": (
            f"sa.verify_tree(np.array([[0, 1, 3, 0]]), {_TREE_PARENTS}, {_TREE_P},"
            " uniforms=np.full((1, 4), 0.99), recovery_uniforms=np.array([0.5]))",
            "ValueError",
        ),
        "verify_tree: 1-D tokens": (
            f"sa.verify_tree(np.array([0, 1, 2, 0]), {_TREE_PARENTS}, {_TREE_P}, rng=0)",
            "ValueError",
        ),
        "verify_tree: str tokens": (
            f"sa.verify_tree('tree', {_TREE_PARENTS}, {_TREE_P}, rng=0)",
            "TypeError",
        ),
        "verify_tree: float parents": (
            f"sa.verify_tree({_TREE_IDS}, np.array([-1.0, 0, 0, 2]), {_TREE_P}, rng=0)",
            "TypeError",
        ),
        "verify_tree: NaN target": (
            f"p = {_TREE_P}; p[0, 0] = np.nan\nsa.verify_tree({_TREE_IDS}, {_TREE_PARENTS},"
            " w(p), rng=0)",
            "ValueError",
        ),
        "verify_tree: uniforms shape": (
            f"sa.verify_tree({_TREE}, uniforms=np.zeros((1, 3)), rng=0)",
            "ValueError",
        ),
        "verify_tree: uniform 1.0": (
            f"sa.verify_tree({_TREE_IDS}, {_TREE_PARENTS}, {_TREE_P}, uniforms=np.ones((1, 4)),"
            " rng=0)",
            "ValueError",
        ),
        "verify_tree: greedy wrong length": (
            f"sa.verify_tree({_TREE}, greedy=np.array([True, True]))",
            "ValueError",
        ),
        "verify_tree: rng str": (f"sa.verify_tree({_TREE}, rng='seed')", "TypeError"),
        "verify_tree: errors bogus": (
            f"sa.verify_tree({_TREE}, rng=0, errors='skip')",
            "ValueError",
        ),
        "verify_tree: errors None": (f"sa.verify_tree({_TREE}, rng=0, errors=None)", "TypeError"),
        "verify_tree: isolate a NaN root row": (
            "p = np.full((2, 4, 3), 1 / 3); p[1, 0, 0] = np.nan\n"
            "r = sa.verify_tree(np.array([[0, 1, 2, 0]] * 2), np.array([-1, 0, 0, 2]), p, rng=0,"
            " errors='isolate')\n"
            "assert list(r.errors) == [1] and r.num_emitted[1] == 0, r",
            "ok",
        ),
        "verify_tree: isolate bad parent links": (
            "r = sa.verify_tree(np.array([[0, 1, 2, 0]] * 2), np.array([[-1, 0, 0, 2], [-1, 0, 3, 0]]),"
            " np.full((2, 4, 3), 1 / 3), rng=0, errors='isolate')\n"
            "assert list(r.errors) == [1] and r.accepted_node_ids.shape == (2, 2), r",
            "ok",
        ),
        "verify_tree: out str": (
            f"sa.verify_tree({_TREE}, greedy=True, out='buffers')",
            "TypeError",
        ),
        "verify_tree: out too narrow": (
            f"sa.verify_tree({_TREE}, greedy=True, out=(np.zeros((1, 2), np.int64),"
            " np.zeros(1, np.int64), None, np.zeros((1, 1), np.int64)))",
            "ValueError",
        ),
        "verify_tree: out huge width": (
            f"sa.verify_tree({_TREE}, greedy=True, out=(huge_ids(1, 2**40 + 1),"
            " np.zeros(1, np.int64), None, huge_ids(1, 2**40)))",
            "ValueError",
        ),
        "verify_tree: out stride-0": (
            "o = np.lib.stride_tricks.as_strided(np.zeros(4, np.int64), (2, 3), (0, 8))\n"
            "sa.verify_tree(np.array([[0, 1, 2, 0]] * 2), np.array([-1, 0, 0, 2]),"
            " np.full((2, 4, 3), 1 / 3), greedy=True,"
            " out=(o, np.zeros(2, np.int64), None, np.zeros((2, 2), np.int64)))",
            "ValueError",
        ),
        "verify_tree: out aliases the tokens": (
            "t = np.array([[0, 1, 2, 0]])\n"
            "sa.verify_tree(t, np.array([-1, 0, 0, 2]), np.full((1, 4, 3), 1 / 3), greedy=True,"
            " out=(t[:, :3], np.zeros(1, np.int64), None, np.zeros((1, 2), np.int64)))",
            "ValueError",
        ),
        # --- verify_tree_logits ---------------------------------------------------------
        "verify_tree_logits: valid": (
            f"r = sa.verify_tree_logits(w({_TREE_IDS}), {_TREE_PARENTS}, w(np.log({_TREE_P})),"
            " rng=0, top_k=2)\nassert r.num_emitted[0] >= 1, r",
            "ok",
        ),
        "verify_tree_logits: greedy": (
            f"r = sa.verify_tree_logits({_TREE_IDS}, {_TREE_PARENTS}, np.log({_TREE_P}),"
            " temperature=0.0)\nassert r.output_token_ids.tolist() == [[0, -1, -1]], r",
            "ok",
        ),
        "verify_tree_logits: NaN logit read": (
            f"l = np.log({_TREE_P}); l[0, 0, 1] = np.nan\n"
            f"sa.verify_tree_logits({_TREE_IDS}, {_TREE_PARENTS}, l, rng=0)",
            "ValueError",
        ),
        "verify_tree_logits: +inf logit": (
            f"l = np.log({_TREE_P}); l[0, 0, 2] = np.inf\n"
            f"sa.verify_tree_logits({_TREE_IDS}, {_TREE_PARENTS}, l, temperature=0.0)",
            "ValueError",
        ),
        "verify_tree_logits: all -inf row": (
            f"l = np.full((1, 4, 3), -np.inf)\nsa.verify_tree_logits({_TREE_IDS}, {_TREE_PARENTS}, l, rng=0)",
            "ValueError",
        ),
        "verify_tree_logits: temperature -1": (
            f"sa.verify_tree_logits({_TREE_IDS}, {_TREE_PARENTS}, np.log({_TREE_P}), temperature=-1.0,"
            " rng=0)",
            "ValueError",
        ),
        "verify_tree_logits: temperature str": (
            f"sa.verify_tree_logits({_TREE_IDS}, {_TREE_PARENTS}, np.log({_TREE_P}), temperature='hot',"
            " rng=0)",
            "TypeError",
        ),
        "verify_tree_logits: top_k float": (
            f"sa.verify_tree_logits({_TREE_IDS}, {_TREE_PARENTS}, np.log({_TREE_P}), top_k=1.5, rng=0)",
            "TypeError",
        ),
        "verify_tree_logits: top_p 0": (
            f"sa.verify_tree_logits({_TREE_IDS}, {_TREE_PARENTS}, np.log({_TREE_P}), top_p=0.0, rng=0)",
            "ValueError",
        ),
        "verify_tree_logits: temperature for another batch": (
            f"sa.verify_tree_logits({_TREE_IDS}, {_TREE_PARENTS}, np.log({_TREE_P}),"
            " temperature=np.ones(3), rng=0)",
            "ValueError",
        ),
        "verify_tree_logits: draft shape": (
            f"sa.verify_tree_logits({_TREE_IDS}, {_TREE_PARENTS}, np.log({_TREE_P}), np.zeros((1, 3, 3)),"
            " rng=0)",
            "ValueError",
        ),
        "verify_tree_logits: int logits": (
            f"sa.verify_tree_logits({_TREE_IDS}, {_TREE_PARENTS}, np.zeros((1, 4, 3), np.int64), rng=0)",
            "TypeError",
        ),
        "verify_tree_logits: method bogus": (
            f"sa.verify_tree_logits({_TREE_IDS}, {_TREE_PARENTS}, np.log({_TREE_P}), rng=0,"
            " method='block')",
            "ValueError",
        ),
        "verify_tree_logits: isolate": (
            "l = np.zeros((2, 4, 3)); l[1, 0, 0] = np.nan\n"
            "r = sa.verify_tree_logits(np.array([[0, 1, 2, 0]] * 2), np.array([-1, 0, 0, 2]), l,"
            " rng=0, errors='isolate')\nassert list(r.errors) == [1], r",
            "ok",
        ),
        "verify_tree_logits: out too narrow": (
            f"sa.verify_tree_logits({_TREE_IDS}, {_TREE_PARENTS}, np.log({_TREE_P}), rng=0,"
            " out=(np.zeros((1, 2), np.int64), np.zeros(1, np.int64), None, np.zeros((1, 1), np.int64)))",
            "ValueError",
        ),
        "verify_tree_logits: huge stride-0 vocabulary": (
            f"sa.verify_tree_logits({_TREE_IDS}, {_TREE_PARENTS}, np.broadcast_to(0.0, (1, 4, 2**40)),"
            " rng=0)",
            "MemoryError|ValueError",
        ),
        "verify_tree_logits: huge stride-0 nodes": (
            "sa.verify_tree_logits(huge_ids(1, 2**40), np.broadcast_to(-1, (2**40,)),"
            " np.broadcast_to(0.0, (1, 2**40, 2)), temperature=0.0)",
            "MemoryError|ValueError",
        ),
        "verify_tree_logits: bfloat16": (
            "import ml_dtypes\n"
            f"l = np.log({_TREE_P}).astype(ml_dtypes.bfloat16)\n"
            f"r = sa.verify_tree_logits({_TREE_IDS}, {_TREE_PARENTS}, l, l, rng=0)\n"
            "assert r.num_emitted[0] >= 1",
            "ok",
        ),
        "reference.verify_tree_logits: valid": (
            f"r = reference.verify_tree_logits({_TREE_IDS}, {_TREE_PARENTS}, np.log({_TREE_P}),"
            " rng=0, top_p=0.9)\nassert r.num_emitted[0] >= 1, r",
            "ok",
        ),
        "reference.verify_tree_logits: NaN logit read": (
            f"l = np.log({_TREE_P}); l[0, 0, 1] = np.nan\n"
            f"reference.verify_tree_logits({_TREE_IDS}, {_TREE_PARENTS}, l, rng=0)",
            "ValueError",
        ),
        "reference.verify_tree_logits: temperature str": (
            f"reference.verify_tree_logits({_TREE_IDS}, {_TREE_PARENTS}, np.log({_TREE_P}),"
            " temperature='hot', rng=0)",
            "TypeError",
        ),
        "reference.verify_tree: out too narrow": (
            f"reference.verify_tree({_TREE}, greedy=True, out=(np.zeros((1, 2), np.int64),"
            " np.zeros(1, np.int64), None, np.zeros((1, 1), np.int64)))",
            "ValueError",
        ),
        "reference.verify_tree: isolate": (
            "p = np.full((2, 4, 3), 1 / 3); p[1, 0, 0] = np.nan\n"
            "r = reference.verify_tree(np.array([[0, 1, 2, 0]] * 2), np.array([-1, 0, 0, 2]), p,"
            " rng=0, errors='isolate')\n"
            "assert list(r.errors) == [1], r",
            "ok",
        ),
        "verify_tree: huge stride-0 vocabulary": (
            "ok_tree(sa.verify_tree(np.zeros((1, 2), np.int64), np.array([-1, 0]),"
            " np.broadcast_to(2.0**-29, (1, 2, 2**29)), rng=0), 1, 2**29)",
            "ok|MemoryError",
        ),
        "verify_tree: huge stride-0 nodes": (
            "sa.verify_tree(huge_ids(1, 2**40), np.broadcast_to(np.int64(0), (1, 2**40)),"
            " np.broadcast_to(0.5, (1, 2**40, 1)), rng=0)",
            "ValueError|MemoryError",
        ),
        # --- acceptance_mask ---------------------------------------------------------------
        "acceptance_mask: scalars": (
            "assert bool(sa.acceptance_mask(0.6, 0.8, 0.74))"
            " and not bool(sa.acceptance_mask(0.6, 0.8, 0.75))",
            "ok",
        ),
        "acceptance_mask: arrays broadcast": (
            "m = sa.acceptance_mask(w(np.full((2, 3), 0.5)), w(np.full(3, 0.6)), w(np.zeros((2, 1))))\n"
            "assert m.shape == (2, 3) and m.dtype == bool",
            "ok",
        ),
        "acceptance_mask: empty": (
            "sa.acceptance_mask(np.zeros(0), np.zeros(0), np.zeros(0))",
            "ok",
        ),
        "acceptance_mask: uniform 1.0": ("sa.acceptance_mask(0.5, 0.6, 1.0)", "ValueError"),
        "acceptance_mask: uniform NaN": ("sa.acceptance_mask(0.5, 0.6, np.nan)", "ValueError"),
        "acceptance_mask: negative q": ("sa.acceptance_mask(0.5, -0.6, 0.1)", "ValueError"),
        "acceptance_mask: inf p": ("sa.acceptance_mask(np.inf, 0.6, 0.1)", "ValueError"),
        "acceptance_mask: bool p": ("sa.acceptance_mask(True, 0.6, 0.1)", "TypeError"),
        "acceptance_mask: None u": ("sa.acceptance_mask(0.5, 0.6, None)", "TypeError"),
        "acceptance_mask: complex": ("sa.acceptance_mask(0.5, 0.6, 0.1 + 0j)", "TypeError"),
        "acceptance_mask: int 2**64 p": ("sa.acceptance_mask(2**64, 0.6, 0.1)", "ValueError"),
        "acceptance_mask: no broadcast": (
            "sa.acceptance_mask(np.zeros(2), np.zeros(3), np.zeros(2))",
            "ValueError",
        ),
        "acceptance_mask: huge stride-0": (
            "sa.acceptance_mask(np.broadcast_to(0.5, (2**40,)), 0.5, 0.1)",
            "MemoryError",
        ),
        # --- rejection_probability (more) ------------------------------------------------
        "rejection_probability: arrays": (
            "r = sa.rejection_probability(w(np.array([0.0, 0.5, 0.9])), w(np.array([0.5, 0.5, 0.1])))\n"
            "assert r.tolist() == [1.0, 0.0, 0.0], r",
            "ok",
        ),
        "rejection_probability: empty": ("sa.rejection_probability(np.zeros((0, 3)), 0.5)", "ok"),
        "rejection_probability: negative": ("sa.rejection_probability(-0.1, 0.5)", "ValueError"),
        "rejection_probability: -inf": ("sa.rejection_probability(0.5, -np.inf)", "ValueError"),
        "rejection_probability: None": ("sa.rejection_probability(None, 0.5)", "TypeError"),
        "rejection_probability: bool": ("sa.rejection_probability(0.5, False)", "TypeError"),
        "rejection_probability: object array": (
            "sa.rejection_probability(np.array([0.5], dtype=object), 0.5)",
            "TypeError",
        ),
        "rejection_probability: 2**64": ("sa.rejection_probability(0.5, 2**64)", "ValueError"),
        "rejection_probability: -2**63": ("sa.rejection_probability(-(2**63), 0.5)", "ValueError"),
        "rejection_probability: no broadcast": (
            "sa.rejection_probability(np.zeros((2, 2)), np.zeros(3))",
            "ValueError",
        ),
        # --- acceptance_rate ---------------------------------------------------------------
        "acceptance_rate: valid": (
            "a = sa.acceptance_rate(w(P()), w(P()))\nassert np.allclose(a, 1.0), a",
            "ok",
        ),
        "acceptance_rate: one row": (
            "a = sa.acceptance_rate(np.array([0.6, 0.4, 0.0]), np.array([0.8, 0.1, 0.1]))\n"
            "assert abs(float(a) - 0.7) < 1e-12, a",
            "ok",
        ),
        "acceptance_rate: shape mismatch": (
            "sa.acceptance_rate(np.zeros((2, 3)), np.zeros((2, 4)))",
            "ValueError",
        ),
        "acceptance_rate: NaN": (
            "p = P(); p[0, 0, 0] = np.nan\nsa.acceptance_rate(w(p), P())",
            "ValueError",
        ),
        "acceptance_rate: negative": (
            "p = P(); p[0, 0, 0] = -1.0\nsa.acceptance_rate(w(p), P())",
            "ValueError",
        ),
        "acceptance_rate: int arrays": (
            "sa.acceptance_rate(np.ones((2, 3), np.int64), np.ones((2, 3), np.int64))",
            "TypeError",
        ),
        "acceptance_rate: lists": ("sa.acceptance_rate([0.5, 0.5], [0.5, 0.5])", "TypeError"),
        "acceptance_rate: 0-d": (
            "sa.acceptance_rate(np.float64(0.5), np.float64(0.5))",
            "ValueError",
        ),
        "acceptance_rate: empty vocabulary": (
            "a = sa.acceptance_rate(np.zeros((2, 0)), np.zeros((2, 0)))\nassert a.shape == (2,)",
            "ok|ValueError",
        ),
        "acceptance_rate: huge stride-0 rows": (
            "sa.acceptance_rate(np.broadcast_to(0.5, (2**40, 1)), np.broadcast_to(0.5, (2**40, 1)))",
            "MemoryError",
        ),
        # --- accepted_prefix_length ----------------------------------------------------------
        "accepted_prefix_length: valid": (
            "n = sa.accepted_prefix_length(w(np.array([[True, False, True], [True, True, True]])),"
            " w(np.array([3, 2])))\nassert n.tolist() == [1, 2], n",
            "ok",
        ),
        "accepted_prefix_length: empty": (
            "n = sa.accepted_prefix_length(np.zeros((0, 3), bool))\nassert n.shape == (0,)",
            "ok",
        ),
        "accepted_prefix_length: int mask": (
            "sa.accepted_prefix_length(np.array([[1, 0]]))",
            "TypeError",
        ),
        "accepted_prefix_length: 1-D mask": (
            "sa.accepted_prefix_length(np.array([True, False]))",
            "ValueError",
        ),
        "accepted_prefix_length: count above K": (
            "sa.accepted_prefix_length(np.array([[True, False]]), np.array([3]))",
            "ValueError",
        ),
        "accepted_prefix_length: negative count": (
            "sa.accepted_prefix_length(np.array([[True, False]]), np.array([-1]))",
            "ValueError",
        ),
        "accepted_prefix_length: uint64 count above int64 max": (
            "sa.accepted_prefix_length(np.array([[True, False]]), np.array([2**63], np.uint64))",
            "ValueError",
        ),
        "accepted_prefix_length: counts shape": (
            "sa.accepted_prefix_length(np.array([[True, False]]), np.array([1, 1]))",
            "ValueError",
        ),
        "accepted_prefix_length: huge stride-0": (
            "sa.accepted_prefix_length(np.broadcast_to(np.True_, (2**40, 1)))",
            "MemoryError",
        ),
    }
)

_STATS_DICT = (
    "dict(num_steps=2, total_draft_tokens=6, num_accepted_tokens=4, num_emitted_tokens=6,"
    " num_tried_tokens=5, drafted_per_position=[2, 2, 2], accepted_per_position=[2, 1, 1],"
    " accepted_length_histogram=[0, 1, 0, 1])"
)
_FLASH = "np.array([[[0.1, 0.2, 0.3, 0.4], [0.2, 0.3, 0.4, 0.1]]]), np.array([[2, 1]], np.int32)"
_FLASH_U = "np.array([[0.8823, 0.9150, 0.3829]])"
_FLASH_P = "np.array([[[0.0, 0.1, 0.6, 0.3], [1.0, 0.0, 0.0, 0.0], [0.7, 0.1, 0.1, 0.1]]])"
_VLLM = "np.array([1, 2, 3]), [2, 1], np.eye(8)[[1, 2, 3]], None, np.array([5, 4])"

CASES.update(
    {
        # --- expected_tokens_per_step, expected_speedup, best_num_draft_tokens ------------
        "expected_tokens_per_step: valid": (
            "assert sa.expected_tokens_per_step(0.5, 1) == 1.5",
            "ok",
        ),
        "expected_tokens_per_step: k 2**64": (
            "assert sa.expected_tokens_per_step(0.5, 2**64) == 2.0",
            "ok",
        ),
        "expected_tokens_per_step: a 1, k 2**200": (
            "assert sa.expected_tokens_per_step(1.0, 2**200) > 1e60",
            "ok",
        ),
        "expected_tokens_per_step: a 1, k 2**2000": (
            "sa.expected_tokens_per_step(1.0, 2**2000)",
            "ValueError",
        ),
        "expected_tokens_per_step: a NaN": ("sa.expected_tokens_per_step(np.nan, 4)", "ValueError"),
        "expected_tokens_per_step: a -0.5": ("sa.expected_tokens_per_step(-0.5, 4)", "ValueError"),
        "expected_tokens_per_step: a 2**64": (
            "sa.expected_tokens_per_step(2**64, 4)",
            "ValueError",
        ),
        "expected_tokens_per_step: a str": ("sa.expected_tokens_per_step('0.5', 4)", "TypeError"),
        "expected_tokens_per_step: a bool": ("sa.expected_tokens_per_step(True, 4)", "TypeError"),
        "expected_tokens_per_step: a array": (
            "sa.expected_tokens_per_step(np.array([0.5]), 4)",
            "TypeError|ok",
        ),
        "expected_tokens_per_step: k -1": ("sa.expected_tokens_per_step(0.5, -1)", "ValueError"),
        "expected_tokens_per_step: k -2**63": (
            "sa.expected_tokens_per_step(0.5, -(2**63))",
            "ValueError",
        ),
        "expected_tokens_per_step: k float": ("sa.expected_tokens_per_step(0.5, 4.0)", "TypeError"),
        "expected_tokens_per_step: k None": ("sa.expected_tokens_per_step(0.5, None)", "TypeError"),
        "expected_speedup: valid": ("assert sa.expected_speedup(0.8, 4, 0.05) > 1", "ok"),
        "expected_speedup: c 0, k 2**64": (
            "assert sa.expected_speedup(0.5, 2**64, 0.0) == 2.0",
            "ok",
        ),
        "expected_speedup: c huge, k 2**200": (
            "assert 0 <= sa.expected_speedup(1.0, 2**200, 1e300) < 1",
            "ok",
        ),
        "expected_speedup: c negative": ("sa.expected_speedup(0.5, 4, -1.0)", "ValueError"),
        "expected_speedup: c inf": ("sa.expected_speedup(0.5, 4, np.inf)", "ValueError"),
        "expected_speedup: c NaN": ("sa.expected_speedup(0.5, 4, np.nan)", "ValueError"),
        "expected_speedup: c 2**2000": ("sa.expected_speedup(0.5, 4, 2**2000)", "ValueError"),
        "expected_speedup: c str": ("sa.expected_speedup(0.5, 4, 'cheap')", "TypeError"),
        "expected_speedup: k 2**64, a 1, c 0": (
            "s = sa.expected_speedup(1.0, 2**64, 0.0)\nassert s > 1e19, s",
            "ok",
        ),
        "best_num_draft_tokens: valid": (
            "assert sa.best_num_draft_tokens(0.8, 0.05) == 8",
            "ok",
        ),
        "best_num_draft_tokens: max_k 2**200": (
            "assert 0 <= sa.best_num_draft_tokens(0.9, 0.01, 2**200) < 10**4",
            "ok",
        ),
        "best_num_draft_tokens: a 1, max_k 2**64": (
            "assert sa.best_num_draft_tokens(1.0, 0.5, 2**64) == 2**64",
            "ok",
        ),
        "best_num_draft_tokens: tiny c, max_k 2**64": (
            "k = sa.best_num_draft_tokens(0.999999, 1e-300, 2**64)\nassert 0 < k <= 2**64, k",
            "ok",
        ),
        "best_num_draft_tokens: c 0, max_k 2**63": (
            "k = sa.best_num_draft_tokens(0.5, 0.0, 2**63)\nassert 0 < k <= 2**63, k",
            "ok",
        ),
        "best_num_draft_tokens: max_k 0": (
            "assert sa.best_num_draft_tokens(0.9, 0.1, 0) == 0",
            "ok",
        ),
        "best_num_draft_tokens: max_k -2**63": (
            "sa.best_num_draft_tokens(0.5, 0.1, -(2**63))",
            "ValueError",
        ),
        "best_num_draft_tokens: max_k float": (
            "sa.best_num_draft_tokens(0.5, 0.1, 64.0)",
            "TypeError",
        ),
        "best_num_draft_tokens: a NaN": ("sa.best_num_draft_tokens(np.nan, 0.1)", "ValueError"),
        "best_num_draft_tokens: c -inf": ("sa.best_num_draft_tokens(0.5, -np.inf)", "ValueError"),
        "best_num_draft_tokens: c None": ("sa.best_num_draft_tokens(0.5, None)", "TypeError"),
        # --- threads ---------------------------------------------------------------------
        "set_num_threads: -1": ("sa.set_num_threads(-1)", "ValueError"),
        "set_num_threads: -2**63": ("sa.set_num_threads(-(2**63))", "ValueError"),
        "set_num_threads: 2**200": ("sa.set_num_threads(2**200)", "ValueError"),
        "set_num_threads: str": ("sa.set_num_threads('2')", "TypeError"),
        "set_num_threads: None": ("sa.set_num_threads(None)", "TypeError"),
        "set_num_threads: bool": ("sa.set_num_threads(True)", "TypeError"),
        "set_num_threads: max_num_threads + 1": (
            "sa.set_num_threads(sa.max_num_threads() + 1)",
            "ValueError",
        ),
        "set_num_threads: np.int64(1)": (
            "sa.set_num_threads(np.int64(1)); assert sa.get_num_threads() == 1",
            "ok",
        ),
        "set_num_threads: uint64 max": (
            "sa.set_num_threads(np.uint64(2**64 - 1))",
            "ValueError",
        ),
        "set_num_threads: max_num_threads": (
            "n = sa.max_num_threads(); sa.set_num_threads(n)\n"
            "assert sa.get_num_threads() == n\n"
            "ok_ver(sa.verify(IDS(), P(), rng=0))",
            "ok",
        ),
        "get_num_threads: sane": (
            "assert 1 <= sa.get_num_threads() <= sa.max_num_threads() < 2**20",
            "ok",
        ),
        "get_num_threads: an argument": ("sa.get_num_threads(1)", "TypeError"),
        "max_num_threads: an argument": ("sa.max_num_threads(1)", "TypeError"),
        # --- Verification, TreeVerification ---------------------------------------------------
        "Verification.tokens: valid and negative row": (
            "r = sa.verify_greedy(np.array([[5, 7]]), np.array([[5, 9, 2]]))\n"
            "assert r.tokens(0).tolist() == r.tokens(-1).tolist() == [5, 9]",
            "ok",
        ),
        "Verification.tokens: row B": (
            "sa.verify_greedy(np.array([[5, 7]]), np.array([[5, 9, 2]])).tokens(1)",
            "ValueError",
        ),
        "Verification.tokens: row -B-1": (
            "sa.verify_greedy(np.array([[5, 7]]), np.array([[5, 9, 2]])).tokens(-2)",
            "ValueError",
        ),
        "Verification.tokens: row 2**64": (
            "sa.verify_greedy(np.array([[5, 7]]), np.array([[5, 9, 2]])).tokens(2**64)",
            "ValueError",
        ),
        "Verification.tokens: row -2**200": (
            "sa.verify_greedy(np.array([[5, 7]]), np.array([[5, 9, 2]])).tokens(-(2**200))",
            "ValueError",
        ),
        "Verification.tokens: row float": (
            "sa.verify_greedy(np.array([[5, 7]]), np.array([[5, 9, 2]])).tokens(0.0)",
            "TypeError",
        ),
        "Verification.tokens: row str": (
            "sa.verify_greedy(np.array([[5, 7]]), np.array([[5, 9, 2]])).tokens('0')",
            "TypeError",
        ),
        "Verification.tokens: row None": (
            "sa.verify_greedy(np.array([[5, 7]]), np.array([[5, 9, 2]])).tokens(None)",
            "TypeError",
        ),
        "Verification.tokens: empty batch": (
            "sa.Verification.empty(0, 2).tokens(0)",
            "ValueError",
        ),
        "Verification.to_lists: corrupt num_emitted": (
            "sa.Verification(np.zeros((1, 2), np.int64), np.zeros(1, np.int64),"
            " np.array([99])).to_lists()",
            "ValueError",
        ),
        "Verification.to_lists: negative num_emitted": (
            "sa.Verification(np.zeros((1, 2), np.int64), np.zeros(1, np.int64),"
            " np.array([-1])).to_lists()",
            "ValueError",
        ),
        "Verification.to_lists: None fields": (
            "sa.Verification(None, None, None).to_lists()",
            "TypeError",
        ),
        "Verification.to_lists: float num_emitted": (
            "sa.Verification(np.zeros((1, 2), np.int64), np.zeros(1, np.int64),"
            " np.array([np.nan])).to_lists()",
            "TypeError|ValueError",
        ),
        "Verification.batch_size: 0-d arrays": (
            "sa.Verification(np.int64(0), np.int64(0), np.int64(0)).batch_size",
            "TypeError",
        ),
        "Verification.empty: valid": (
            "o = sa.Verification.empty(3, 2)\n"
            "assert o.output_token_ids.shape == (3, 3) and o.num_accepted.shape == (3,)",
            "ok",
        ),
        "Verification.empty: zero": (
            "assert sa.Verification.empty(0, 0).output_token_ids.shape == (0, 1)",
            "ok",
        ),
        "Verification.empty: negative batch": ("sa.Verification.empty(-1, 2)", "ValueError"),
        "Verification.empty: negative K": ("sa.Verification.empty(1, -2)", "ValueError"),
        "Verification.empty: batch 2**64": ("sa.Verification.empty(2**64, 1)", "ValueError"),
        "Verification.empty: K 2**63 - 1": ("sa.Verification.empty(1, 2**63 - 1)", "ValueError"),
        "Verification.empty: batch 2**40": ("sa.Verification.empty(2**40, 0)", "MemoryError"),
        "Verification.empty: 2**31 by 2**31": (
            "sa.Verification.empty(2**31, 2**31)",
            "MemoryError",
        ),
        "Verification.empty: float size": ("sa.Verification.empty(1.0, 2)", "TypeError"),
        "Verification.empty: bool size": ("sa.Verification.empty(1, True)", "TypeError"),
        "TreeVerification: tokens": (
            f"r = sa.verify_tree({_TREE}, greedy=True)\n"
            "assert r.tokens(0).tolist() == [2, 0, 1]\nassert r.to_lists() == [[2, 0, 1]]",
            "ok",
        ),
        "TreeVerification: row out of range": (
            f"sa.verify_tree({_TREE}, greedy=True).tokens(1)",
            "ValueError",
        ),
        # --- AcceptanceStats -----------------------------------------------------------------
        "AcceptanceStats: update valid": (
            "s = stats()\nassert s.num_accepted_tokens == 4 and s.accepted_length_histogram"
            " == [0, 1, 0, 1]",
            "ok",
        ),
        "AcceptanceStats: update with counts": (
            "s = sa.AcceptanceStats()\n"
            "r = sa.verify_greedy(np.array([[3, 4, 5]]), np.array([[3, 4, 5, 6]]),"
            " num_draft_tokens=np.array([2]))\n"
            "s.update(r, w(np.array([2])))\nassert s.total_draft_tokens == 2",
            "ok",
        ),
        "AcceptanceStats: update counts above K": (
            "s = sa.AcceptanceStats()\n"
            "s.update(sa.verify_greedy(np.array([[3]]), np.array([[3, 4]])), np.array([5]))",
            "ValueError",
        ),
        "AcceptanceStats: update uint64 counts": (
            "s = sa.AcceptanceStats()\n"
            "s.update(sa.verify_greedy(np.array([[3]]), np.array([[3, 4]])),"
            " np.array([2**63 + 1], np.uint64))",
            "ValueError",
        ),
        "AcceptanceStats: update float counts": (
            "s = sa.AcceptanceStats()\n"
            "s.update(sa.verify_greedy(np.array([[3]]), np.array([[3, 4]])), np.array([1.0]))",
            "TypeError",
        ),
        "AcceptanceStats: update refused leaves stats": (
            "s = stats(); before = s.to_dict()\n"
            "try:\n    s.update(sa.verify_greedy(np.array([[3]]), np.array([[3, 4]])),"
            " np.array([5]))\nexcept ValueError:\n    pass\n"
            "assert s.to_dict() == before",
            "ok",
        ),
        "AcceptanceStats: update corrupt result": (
            "r = sa.Verification(np.zeros((1, 2), np.int64), np.array([-3]), np.array([1]))\n"
            "sa.AcceptanceStats().update(r)",
            "ValueError",
        ),
        "AcceptanceStats: update result of floats": (
            "r = sa.Verification(np.zeros((1, 2)), np.zeros(1), np.ones(1))\n"
            "sa.AcceptanceStats().update(r)",
            "TypeError",
        ),
        "AcceptanceStats: update zero-width result": (
            "r = sa.Verification(np.zeros((1, 0), np.int64), np.zeros(1, np.int64),"
            " np.ones(1, np.int64))\nsa.AcceptanceStats().update(r)",
            "ValueError",
        ),
        "AcceptanceStats: update str": ("sa.AcceptanceStats().update('result')", "TypeError"),
        "AcceptanceStats: merge": (
            "s = stats() + stats()\nassert s.num_steps == 4",
            "ok",
        ),
        "AcceptanceStats: merge None": ("stats().merge(None)", "TypeError"),
        "AcceptanceStats: merge dict": ("stats() + stats().to_dict()", "TypeError"),
        "AcceptanceStats: merge past 2**63 - 1": (
            "sa.AcceptanceStats(num_steps=2**63 - 1).merge(sa.AcceptanceStats(num_steps=1))",
            "ValueError",
        ),
        "AcceptanceStats: json round trip": (
            "s = stats()\nassert sa.AcceptanceStats.from_json(s.to_json()) == s",
            "ok",
        ),
        "AcceptanceStats: json bytes": (
            "s = stats()\nassert sa.AcceptanceStats.from_json(s.to_json().encode()) == s",
            "ok",
        ),
        "AcceptanceStats: from_dict valid": (
            f"s = sa.AcceptanceStats.from_dict(w({_STATS_DICT}))\nassert s.num_steps == 2",
            "ok",
        ),
        "AcceptanceStats: from_dict old key": (
            f"d = {_STATS_DICT}; d['num_draft_tokens'] = d.pop('total_draft_tokens')\n"
            "assert sa.AcceptanceStats.from_dict(w(d)).total_draft_tokens == 6",
            "ok",
        ),
        "AcceptanceStats: from_dict empty": ("sa.AcceptanceStats.from_dict({})", "ValueError"),
        "AcceptanceStats: from_dict None": ("sa.AcceptanceStats.from_dict(None)", "TypeError"),
        "AcceptanceStats: from_dict list": ("sa.AcceptanceStats.from_dict([1, 2])", "TypeError"),
        "AcceptanceStats: from_dict negative count": (
            f"d = {_STATS_DICT}; d['num_steps'] = -1\nsa.AcceptanceStats.from_dict(w(d))",
            "ValueError",
        ),
        "AcceptanceStats: from_dict 2**64 count": (
            f"d = {_STATS_DICT}; d['num_tried_tokens'] = 2**64\nsa.AcceptanceStats.from_dict(w(d))",
            "ValueError",
        ),
        "AcceptanceStats: from_dict str count": (
            f"d = {_STATS_DICT}; d['num_steps'] = '2'\nsa.AcceptanceStats.from_dict(w(d))",
            "TypeError",
        ),
        "AcceptanceStats: from_dict float count": (
            f"d = {_STATS_DICT}; d['num_steps'] = 2.0\nsa.AcceptanceStats.from_dict(w(d))",
            "TypeError",
        ),
        "AcceptanceStats: from_dict None in list": (
            f"d = {_STATS_DICT}; d['drafted_per_position'] = [2, None, 2]\n"
            "sa.AcceptanceStats.from_dict(w(d))",
            "TypeError",
        ),
        "AcceptanceStats: from_dict list is a str": (
            f"d = {_STATS_DICT}; d['accepted_per_position'] = '211'\n"
            "sa.AcceptanceStats.from_dict(w(d))",
            "TypeError",
        ),
        "AcceptanceStats: from_dict mismatched lists": (
            f"d = {_STATS_DICT}; d['accepted_per_position'] = [2, 1]\n"
            "sa.AcceptanceStats.from_dict(w(d))",
            "ValueError",
        ),
        "AcceptanceStats: from_dict short histogram": (
            f"d = {_STATS_DICT}; d['accepted_length_histogram'] = [0, 1]\n"
            "sa.AcceptanceStats.from_dict(w(d))",
            "ValueError",
        ),
        "AcceptanceStats: from_json not JSON": (
            "sa.AcceptanceStats.from_json('nope')",
            "ValueError",
        ),
        "AcceptanceStats: from_json bad UTF-8": (
            "sa.AcceptanceStats.from_json(b'\\xff\\xfe{')",
            "ValueError",
        ),
        "AcceptanceStats: from_json a list": ("sa.AcceptanceStats.from_json('[]')", "TypeError"),
        "AcceptanceStats: from_json None": ("sa.AcceptanceStats.from_json(None)", "TypeError"),
        "AcceptanceStats: from_json nested dicts": (
            "sa.AcceptanceStats.from_json('{\"a\": ' * 100000 + '1' + '}' * 100000)",
            "ValueError",
        ),
        "AcceptanceStats: from_json 1e400 count": (
            f"d = json.dumps({_STATS_DICT}).replace('\"num_steps\": 2', '\"num_steps\": 1e400')\n"
            "sa.AcceptanceStats.from_json(d)",
            "TypeError",
        ),
        "AcceptanceStats: from_json 5000-digit count": (
            f"d = json.dumps({_STATS_DICT}).replace('\"num_steps\": 2', '\"num_steps\": ' + '9' * 5000)\n"
            "sa.AcceptanceStats.from_json(d)",
            "ValueError",
        ),
        "AcceptanceStats: from_json NaN count": (
            f"d = json.dumps({_STATS_DICT}).replace('\"num_steps\": 2', '\"num_steps\": NaN')\n"
            "sa.AcceptanceStats.from_json(d)",
            "TypeError",
        ),
        "AcceptanceStats: constructor negative": (
            "sa.AcceptanceStats(num_steps=-1)",
            "ValueError",
        ),
        "AcceptanceStats: summary of empty": (
            "d = sa.AcceptanceStats().summary()\nassert math.isnan(d['alpha'])",
            "ok",
        ),
    }
)

CASES.update(
    {
        # --- compat.vllm ------------------------------------------------------------------
        "vllm.verify: valid greedy": (
            f"r = vllm.verify({_VLLM}, greedy=True)\n"
            "assert r.output_token_ids.tolist() == [[1, 2, 5], [3, 4, -1]], r",
            "ok",
        ),
        "vllm.verify: valid sampled": (
            "r = vllm.verify(w(np.array([1, 2, 3])), w(np.array([2, 1])), w(probs(3, 8)),"
            " w(probs(3, 8, seed=1)), w(np.array([[5], [4]])), rng=0)\n"
            "assert r.output_token_ids.shape == (2, 3)\n"
            "assert all(((0 <= r.tokens(b)) & (r.tokens(b) < 8)).all() for b in range(2))",
            "ok",
        ),
        "vllm.verify: zero drafts": (
            "r = vllm.verify(np.zeros(0, np.int64), [0], np.zeros((0, 8)), None, np.array([3]),"
            " rng=0)\nassert r.to_lists() == [[3]], r",
            "ok",
        ),
        "vllm.verify: empty step": (
            "r = vllm.verify(np.zeros(0, np.int64), [], np.zeros((0, 8)), None,"
            " np.zeros(0, np.int64), rng=0)\nassert r.output_token_ids.shape[0] == 0",
            "ok",
        ),
        "vllm.verify: counts sum above T": (
            "vllm.verify(np.array([1, 2, 3]), [2, 2], np.eye(8)[[1, 2, 3]], None,"
            " np.array([5, 4]), rng=0)",
            "ValueError",
        ),
        "vllm.verify: counts sum below T": (
            "vllm.verify(np.array([1, 2, 3]), [1, 1], np.eye(8)[[1, 2, 3]], None,"
            " np.array([5, 4]), rng=0)",
            "ValueError",
        ),
        "vllm.verify: negative count": (
            "vllm.verify(np.array([1, 2, 3]), [4, -1], np.eye(8)[[1, 2, 3]], None,"
            " np.array([5, 4]), rng=0)",
            "ValueError",
        ),
        "vllm.verify: count 2**64": (
            "vllm.verify(np.array([1]), [2**64], np.eye(8)[[1]], None, np.array([5]), rng=0)",
            "ValueError",
        ),
        "vllm.verify: count -2**63": (
            "vllm.verify(np.array([1]), [-(2**63), 1], np.eye(8)[[1]], None,"
            " np.array([5, 4]), rng=0)",
            "ValueError",
        ),
        "vllm.verify: counts uint64 max": (
            "vllm.verify(np.array([1]), np.array([2**64 - 1], np.uint64), np.eye(8)[[1]], None,"
            " np.array([5]), rng=0)",
            "ValueError",
        ),
        "vllm.verify: counts list of str": (
            "vllm.verify(np.array([1]), ['1'], np.eye(8)[[1]], None, np.array([5]), rng=0)",
            "TypeError|ValueError",
        ),
        "vllm.verify: counts list of floats": (
            "vllm.verify(np.array([1]), [1.5], np.eye(8)[[1]], None, np.array([5]), rng=0)",
            "TypeError|ValueError",
        ),
        "vllm.verify: counts None": (
            "vllm.verify(np.array([1]), None, np.eye(8)[[1]], None, np.array([5]), rng=0)",
            "TypeError",
        ),
        "vllm.verify: counts nested list": (
            "vllm.verify(np.array([1]), [[1]], np.eye(8)[[1]], None, np.array([5]), rng=0)",
            "TypeError",
        ),
        "vllm.verify: id >= V": (
            "vllm.verify(np.array([8]), [1], np.eye(8)[[1]], None, np.array([5]), rng=0)",
            "ValueError",
        ),
        "vllm.verify: id -2": (
            "vllm.verify(np.array([-2]), [1], np.eye(8)[[1]], None, np.array([5]), rng=0)",
            "ValueError",
        ),
        "vllm.verify: id uint64 above int64 max": (
            "vllm.verify(np.array([2**63], np.uint64), [1], np.eye(8)[[1]], None,"
            " np.array([5]), rng=0)",
            "ValueError",
        ),
        "vllm.verify: 2-D ids": (
            "vllm.verify(np.array([[1]]), [1], np.eye(8)[[1]], None, np.array([5]), rng=0)",
            "ValueError",
        ),
        "vllm.verify: bonus id >= V": (
            "vllm.verify(np.array([1]), [1], np.eye(8)[[1]], None, np.array([8]), greedy=True)",
            "ValueError",
        ),
        "vllm.verify: bonus shape": (
            "vllm.verify(np.array([1]), [1], np.eye(8)[[1]], None, np.array([[5, 6]]), rng=0)",
            "ValueError",
        ),
        "vllm.verify: bonus list": (
            "vllm.verify(np.array([1]), [1], np.eye(8)[[1]], None, [5], rng=0)",
            "TypeError",
        ),
        "vllm.verify: bonus float": (
            "vllm.verify(np.array([1]), [1], np.eye(8)[[1]], None, np.array([5.0]), rng=0)",
            "TypeError",
        ),
        "vllm.verify: target 1-D": (
            "vllm.verify(np.array([1]), [1], np.eye(8)[1], None, np.array([5]), rng=0)",
            "ValueError",
        ),
        "vllm.verify: draft shape": (
            "vllm.verify(np.array([1]), [1], np.eye(8)[[1]], np.eye(7)[[1]], np.array([5]), rng=0)",
            "ValueError",
        ),
        "vllm.verify: uniforms length": (
            "vllm.verify(np.array([1]), [1], np.eye(8)[[1]], None, np.array([5]),"
            " uniforms=np.zeros(2), recovery_uniforms=np.zeros(1))",
            "ValueError",
        ),
        "vllm.verify: rng str": (
            "vllm.verify(np.array([1]), [1], np.eye(8)[[1]], None, np.array([5]), rng='x')",
            "TypeError",
        ),
        "vllm.verify: errors bogus": (
            f"vllm.verify({_VLLM}, rng=0, errors='skip')",
            "ValueError",
        ),
        "vllm.verify: errors isolate": (
            "r = vllm.verify(w(np.array([1, 2, 9])), [2, 1], w(np.eye(8)[[1, 2, 3]]), None,"
            " w(np.array([5, 4])), rng=0, errors='isolate')\n"
            "assert set(r.errors) == {1} and r.errors[1].argument, r.errors\n"
            "assert r.to_lists()[0] == [1, 2, 5], r",
            "ok",
        ),
        "vllm.verify: placeholder first": (
            "r = vllm.verify(np.array([-1, 4]), [2], probs(2, 8), None, np.array([7]), rng=0)\n"
            "assert int(r.num_accepted[0]) == 0 and len(r.tokens(0)) == 1",
            "ok",
        ),
        "vllm.verify: huge stride-0 drafts": (
            "vllm.verify(np.broadcast_to(np.int64(0), (2**40,)), [2**40],"
            " np.broadcast_to(0.5, (2**40, 1)), None, np.array([0]), greedy=True)",
            "MemoryError",
        ),
        "vllm.verify: huge stride-0 drafts, sampled": (
            "vllm.verify(np.broadcast_to(np.int64(0), (2**40,)), [2**40],"
            " np.broadcast_to(0.5, (2**40, 1)), None, np.array([0]), rng=0)",
            "MemoryError",
        ),
        "vllm.rejection_sample: valid": (
            "o = vllm.rejection_sample(np.array([1, 2, 3]), [3], np.eye(8)[[1, 5, 3]], None,"
            " np.array([[4]]), greedy=True)\n"
            "assert o.dtype == np.int32 and o.tolist() == [[1, 5, -1, -1]], o",
            "ok",
        ),
        "vllm.rejection_sample: count 2**63": (
            "vllm.rejection_sample(np.array([0]), [2**63], np.ones((1, 2)) / 2, None,"
            " np.array([[0]]), rng=0)",
            "ValueError",
        ),
        "vllm.rejection_sample: like str": (
            f"vllm.rejection_sample({_VLLM}, rng=0, like='torch')",
            "TypeError",
        ),
        "vllm.parse_output: valid": (
            "assert vllm.parse_output(w(np.array([[1, 5, -1], [3, 4, 9]])), vocab_size=8)"
            " == [[1, 5], [3, 4]]",
            "ok",
        ),
        "vllm.parse_output: empty": (
            "assert vllm.parse_output(np.zeros((0, 3), np.int64), 8) == []",
            "ok",
        ),
        "vllm.parse_output: vocab 2**200": (
            "assert vllm.parse_output(np.array([[1, 2, -1]]), 2**200) == [[1, 2]]",
            "ok",
        ),
        "vllm.parse_output: vocab negative": (
            "vllm.parse_output(np.array([[1, 2, -1]]), -1)",
            "ok|ValueError",
        ),
        "vllm.parse_output: vocab str": ("vllm.parse_output(np.array([[1, 2]]), '8')", "TypeError"),
        "vllm.parse_output: vocab None": (
            "vllm.parse_output(np.array([[1, 2]]), None)",
            "TypeError",
        ),
        "vllm.parse_output: vocab float": (
            "vllm.parse_output(np.array([[1, 2]]), 8.5)",
            "TypeError",
        ),
        "vllm.parse_output: 1-D": ("vllm.parse_output(np.array([1, 2, -1]), 8)", "ValueError"),
        "vllm.parse_output: 0-d": ("vllm.parse_output(np.int64(3), 8)", "TypeError|ValueError"),
        "vllm.parse_output: 3-D": (
            "vllm.parse_output(np.zeros((2, 2, 2), np.int64), 8)",
            "ValueError",
        ),
        "vllm.parse_output: str": ("vllm.parse_output('abc', 8)", "TypeError"),
        "vllm.parse_output: None": ("vllm.parse_output(None, 8)", "TypeError"),
        "vllm.parse_output: floats": ("vllm.parse_output(np.array([[1.0, 2.5]]), 8)", "TypeError"),
        "vllm.parse_output: object array": (
            "vllm.parse_output(np.array([[1, None]], dtype=object), 8)",
            "TypeError",
        ),
        "vllm.parse_output: huge stride-0": (
            "vllm.parse_output(np.broadcast_to(np.int64(-1), (2**40, 1)), 8)",
            "MemoryError",
        ),
        # --- compat.flashinfer ------------------------------------------------------------
        "flashinfer: docstring example": (
            f"ids, acc, em = flashinfer.chain_speculative_sampling({_FLASH}, w({_FLASH_U}),"
            f" w({_FLASH_P}))\n"
            "assert (ids.tolist(), acc.tolist(), em.tolist()) == ([[2, 0, -1]], [1], [1])",
            "ok",
        ),
        "flashinfer: adds to given counts": (
            "a, e = np.array([10], np.int64), np.array([20], np.int64)\n"
            f"flashinfer.chain_speculative_sampling({_FLASH}, {_FLASH_U}, {_FLASH_P}, a, e)\n"
            "assert (a.tolist(), e.tolist()) == ([11], [21]), (a, e)",
            "ok",
        ),
        "flashinfer: 1-D ids": (
            "flashinfer.chain_speculative_sampling(np.full((1, 1, 2), 0.5), np.array([0]),"
            " np.zeros((1, 2)), np.full((1, 2, 2), 0.5))",
            "ValueError",
        ),
        "flashinfer: uniform_samples shape": (
            f"flashinfer.chain_speculative_sampling({_FLASH}, np.zeros((1, 2)), {_FLASH_P})",
            "ValueError",
        ),
        "flashinfer: uniform_samples NaN": (
            f"flashinfer.chain_speculative_sampling({_FLASH}, np.full((1, 3), np.nan), {_FLASH_P})",
            "ValueError",
        ),
        "flashinfer: id >= V": (
            "flashinfer.chain_speculative_sampling(np.full((1, 2, 4), 0.25), np.array([[2, 4]]),"
            f" {_FLASH_U}, {_FLASH_P})",
            "ValueError",
        ),
        "flashinfer: negative id": (
            "flashinfer.chain_speculative_sampling(np.full((1, 2, 4), 0.25), np.array([[-1, 0]]),"
            f" {_FLASH_U}, {_FLASH_P})",
            "ValueError",
        ),
        "flashinfer: draft_probs None": (
            f"flashinfer.chain_speculative_sampling(None, np.array([[2, 1]]), {_FLASH_U},"
            f" {_FLASH_P})",
            "TypeError",
        ),
        "flashinfer: draft_probs shape": (
            "flashinfer.chain_speculative_sampling(np.full((1, 1, 4), 0.25), np.array([[2, 1]]),"
            f" {_FLASH_U}, {_FLASH_P})",
            "ValueError",
        ),
        "flashinfer: target_probs shape": (
            f"flashinfer.chain_speculative_sampling({_FLASH}, {_FLASH_U}, np.full((1, 2, 4), 0.25))",
            "ValueError",
        ),
        "flashinfer: count buffer shape": (
            f"flashinfer.chain_speculative_sampling({_FLASH}, {_FLASH_U}, {_FLASH_P},"
            " np.zeros(2, np.int64))",
            "ValueError",
        ),
        "flashinfer: count buffer read-only": (
            "a = np.zeros(1, np.int64); a.flags.writeable = False\n"
            f"flashinfer.chain_speculative_sampling({_FLASH}, {_FLASH_U}, {_FLASH_P}, a)",
            "ValueError",
        ),
        "flashinfer: count buffer float": (
            f"flashinfer.chain_speculative_sampling({_FLASH}, {_FLASH_U}, {_FLASH_P}, np.zeros(1))",
            "TypeError",
        ),
        "flashinfer: count buffer str": (
            f"flashinfer.chain_speculative_sampling({_FLASH}, {_FLASH_U}, {_FLASH_P}, 'counts')",
            "TypeError",
        ),
        "flashinfer: count buffer aliases the ids": (
            "ids = np.array([[2, 1]], np.int64)\n"
            f"flashinfer.chain_speculative_sampling({_FLASH.split(', np.array')[0]}, w(ids),"
            f" {_FLASH_U}, {_FLASH_P}, ids[0, :1])",
            "ValueError",
        ),
        "flashinfer: empty batch": (
            "o = flashinfer.chain_speculative_sampling(np.zeros((0, 2, 4)),"
            " np.zeros((0, 2), np.int64), np.zeros((0, 3)), np.zeros((0, 3, 4)))\n"
            "assert o[0].shape == (0, 3)",
            "ok",
        ),
        "flashinfer: huge stride-0": (
            "flashinfer.chain_speculative_sampling(np.broadcast_to(1.0, (1, 2**40, 1)),"
            " huge_ids(1, 2**40), np.broadcast_to(0.5, (1, 2**40 + 1)),"
            " np.broadcast_to(1.0, (1, 2**40 + 1, 1)))",
            "MemoryError",
        ),
        # --- reference: same exception types as the native functions ----------------------
        "reference.verify: valid": (
            "ok_ver(reference.verify(w(IDS()), w(P()), w(Q()), rng=0))",
            "ok",
        ),
        "reference.verify: id >= V": (
            "reference.verify(np.array([[0, 1, 2], [3, 5, 0]]), P(), Q(), rng=0)",
            "ValueError",
        ),
        "reference.verify: str ids": ("reference.verify('abc', P(), rng=0)", "TypeError"),
        "reference.verify: NaN uniform": (
            "u = U(); u[0, 0] = np.nan\nreference.verify(IDS(), P(), Q(), uniforms=u, rng=0)",
            "ValueError",
        ),
        "reference.verify: count above K": (
            "reference.verify(IDS(), P(), num_draft_tokens=np.array([4, 0]), rng=0)",
            "ValueError",
        ),
        "reference.verify: target shape": ("reference.verify(IDS(), P(k=2), rng=0)", "ValueError"),
        "reference.verify: out aliases the ids": (
            "ids = np.zeros((2, 4), np.int64)\n"
            "reference.verify(ids[:, :3], P(), rng=0, out=(ids, np.zeros(2, np.int64)))",
            "ValueError",
        ),
        "reference.verify: out stride-0": (
            "o = np.lib.stride_tricks.as_strided(np.zeros(4, np.int64), (2, 4), (0, 8))\n"
            "reference.verify(w(IDS()), w(P()), rng=0, out=(o, np.zeros(2, np.int64)))",
            "ValueError",
        ),
        "reference.verify: rng str": ("reference.verify(IDS(), P(), rng='x')", "TypeError"),
        "reference.verify_greedy: valid": (
            "r = reference.verify_greedy(np.array([[3, 4, 5]]), np.array([[3, 4, 9, 6]]))\n"
            "assert r.to_lists() == [[3, 4, 9]]",
            "ok",
        ),
        "reference.verify_greedy: shape mismatch": (
            "reference.verify_greedy(np.array([[3, 4, 5]]), np.array([[3, 4, 5]]))",
            "ValueError",
        ),
        "reference.verify_greedy: huge stride-0": (
            "reference.verify_greedy(huge_ids(1, 2**40), huge_ids(1, 2**40 + 1))",
            "MemoryError",
        ),
        "reference.verify_tree: forward parent": (
            f"reference.verify_tree({_TREE_IDS}, np.array([-1, 0, 3, 2]), {_TREE_P}, rng=0)",
            "ValueError",
        ),
        "reference.verify_tree: token >= V": (
            f"reference.verify_tree(np.array([[0, 1, 3, 0]]), {_TREE_PARENTS}, {_TREE_P},"
            " uniforms=np.full((1, 4), 0.99), recovery_uniforms=np.array([0.5]))",
            "ValueError",
        ),
        "reference.verify_tree: valid": (
            f"r = reference.verify_tree({_TREE}, greedy=True)\n"
            "assert r.output_token_ids.tolist() == [[2, 0, 1]]",
            "ok",
        ),
        "reference.verify_logits: top_p 0": (
            f"reference.verify_logits(IDS(), {_LOGITS}, top_p=0.0, rng=0)",
            "ValueError",
        ),
        "reference.verify_logits: NaN logit": (
            "l = np.log(P()); l[0, 0, 1] = np.nan\nreference.verify_logits(IDS(), l, rng=0)",
            "ValueError",
        ),
        "reference.verify_logits: temperature str": (
            f"reference.verify_logits(IDS(), {_LOGITS}, temperature='hot', rng=0)",
            "TypeError",
        ),
        "reference.verify_logits: valid": (
            f"ok_ver(reference.verify_logits(w(IDS()), w({_LOGITS}), top_k=2, rng=0))",
            "ok",
        ),
        "reference.rejection_probability: 2**2000": (
            "reference.rejection_probability(2**2000, 0.5)",
            "ValueError",
        ),
        "reference.rejection_probability: NaN": (
            "reference.rejection_probability(np.nan, 0.5)",
            "ValueError",
        ),
        "reference.rejection_probability: str": (
            "reference.rejection_probability('a', 0.5)",
            "TypeError",
        ),
        "reference.acceptance_mask: uniform 1.0": (
            "reference.acceptance_mask(0.5, 0.6, 1.0)",
            "ValueError",
        ),
        "reference.acceptance_mask: None": (
            "reference.acceptance_mask(0.5, None, 0.1)",
            "TypeError",
        ),
        "reference.acceptance_mask: valid": (
            "assert bool(reference.acceptance_mask(0.6, 0.8, 0.74))",
            "ok",
        ),
    }
)

CASES.update(
    {
        # --- generate --------------------------------------------------------------------
        "generate: valid sampled": (
            "prompts = w([[0, 1], [2]])\n"
            "g = sa.generate(Model(), Model(), prompts, k=2, max_new_tokens=5, rng=0)\n"
            "assert [len(t) for t in g.tokens] == [5, 5], g.tokens\n"
            "assert all(0 <= x < 4 for t in g.tokens for x in t)",
            "ok",
        ),
        "generate: valid greedy": (
            "g = sa.generate(Model(), Model(), [[0]], k=3, max_new_tokens=4, greedy=True)\n"
            "assert len(g.tokens[0]) == 4",
            "ok",
        ),
        "generate: no prompts": (
            "assert sa.generate(Model(), Model(), [], k=2, max_new_tokens=3, rng=0).tokens == []",
            "ok",
        ),
        "generate: prompts from a generator": (
            "g = sa.generate(Model(), Model(), ([0] for _ in range(2)), k=1, max_new_tokens=2,"
            " rng=0)\nassert len(g.tokens) == 2",
            "ok",
        ),
        "generate: k 2**64": (
            "g = sa.generate(Model(), Model(), [[0]], k=2**64, max_new_tokens=3, rng=0)\n"
            "assert len(g.tokens[0]) == 3",
            "ok",
        ),
        "generate: max_new_tokens 2**64 with eos": (
            "m = Model(onehot=2)\n"
            "g = sa.generate(m, m, [[0]], k=2, max_new_tokens=2**64, eos_token_id=2, rng=0)\n"
            "assert g.tokens[0][-1] == 2",
            "ok",
        ),
        "generate: k and max_new_tokens 2**40": (
            "sa.generate(Model(), Model(), [[0]], k=2**40, max_new_tokens=2**40, rng=0)",
            "MemoryError",
        ),
        "generate: k -1": ("sa.generate(Model(), Model(), [[0]], k=-1, rng=0)", "ValueError"),
        "generate: k -2**63": (
            "sa.generate(Model(), Model(), [[0]], k=-(2**63), rng=0)",
            "ValueError",
        ),
        "generate: k float": ("sa.generate(Model(), Model(), [[0]], k=2.0, rng=0)", "TypeError"),
        "generate: k bool": ("sa.generate(Model(), Model(), [[0]], k=True, rng=0)", "TypeError"),
        "generate: max_new_tokens -1": (
            "sa.generate(Model(), Model(), [[0]], max_new_tokens=-1, rng=0)",
            "ValueError",
        ),
        "generate: max_new_tokens str": (
            "sa.generate(Model(), Model(), [[0]], max_new_tokens='5', rng=0)",
            "TypeError",
        ),
        "generate: eos str": (
            "sa.generate(Model(), Model(), [[0]], eos_token_id='eos', rng=0)",
            "TypeError",
        ),
        "generate: eos -1": (
            "sa.generate(Model(), Model(), [[0]], max_new_tokens=2, eos_token_id=-1, rng=0)",
            "ok|ValueError",
        ),
        "generate: eos 2**64": (
            "sa.generate(Model(), Model(), [[0]], max_new_tokens=2, eos_token_id=2**64, rng=0)",
            "ok|ValueError",
        ),
        "generate: eos list with a str": (
            "sa.generate(Model(), Model(), [[0]], eos_token_id=[1, 'eos'], rng=0)",
            "TypeError",
        ),
        "generate: eos 2-D array": (
            "sa.generate(Model(), Model(), [[0]], max_new_tokens=2, eos_token_id=np.ones((2, 2), int), rng=0)",
            "TypeError",
        ),
        "generate: eos empty list": (
            "g = sa.generate(Model(), Model(), [[0]], max_new_tokens=3, eos_token_id=[], rng=0)\n"
            "assert len(g.tokens[0]) == 3",
            "ok",
        ),
        "generate: on_tokens int": (
            "sa.generate(Model(), Model(), [[0]], on_tokens=5, rng=0)",
            "TypeError",
        ),
        "generate: on_tokens streams the tokens": (
            "got = {}\n"
            "g = sa.generate(Model(), Model(), [[0], [1]], k=2, max_new_tokens=4, rng=0,\n"
            "                on_tokens=lambda b, t, done: got.setdefault(b, []).extend(t))\n"
            "assert got == dict(enumerate(g.tokens))",
            "ok",
        ),
        "generate: greedy str": (
            "sa.generate(Model(), Model(), [[0]], greedy='yes', rng=0)",
            "TypeError",
        ),
        "generate: rng str": ("sa.generate(Model(), Model(), [[0]], rng='seed')", "TypeError"),
        "generate: rng negative": ("sa.generate(Model(), Model(), [[0]], rng=-1)", "ValueError"),
        "generate: progress int": (
            "sa.generate(Model(), Model(), [[0]], progress=5, rng=0)",
            "TypeError",
        ),
        "generate: prompts str": ("sa.generate(Model(), Model(), 'abc', rng=0)", "TypeError"),
        "generate: prompts None": ("sa.generate(Model(), Model(), None, rng=0)", "TypeError"),
        "generate: empty prompt": ("sa.generate(Model(), Model(), [[]], rng=0)", "ValueError"),
        "generate: negative token": ("sa.generate(Model(), Model(), [[-1]], rng=0)", "ValueError"),
        "generate: token 2**64": ("sa.generate(Model(), Model(), [[2**64]], rng=0)", "ValueError"),
        "generate: float token": ("sa.generate(Model(), Model(), [[1.0]], rng=0)", "TypeError"),
        "generate: bool token": ("sa.generate(Model(), Model(), [[True]], rng=0)", "TypeError"),
        "generate: target None": ("sa.generate(None, Model(), [[0]], rng=0)", "TypeError"),
        "generate: draft str": ("sa.generate(Model(), 'draft', [[0]], rng=0)", "TypeError"),
        "generate: vocab_size str": (
            "sa.generate(Model(vocab_size='4'), Model(), [[0]], rng=0)",
            "TypeError",
        ),
        "generate: vocab_size 0": (
            "sa.generate(Model(vocab_size=0), Model(vocab_size=0), [[0]], rng=0)",
            "ValueError",
        ),
        "generate: vocab_size 2**64": (
            "sa.generate(Model(vocab_size=2**64), Model(vocab_size=2**64), [[0]], k=2, rng=0)",
            "ValueError|MemoryError",
        ),
        "generate: vocabularies differ": (
            "sa.generate(Model(4), Model(5), [[0]], rng=0)",
            "ValueError",
        ),
        "generate: model answers the wrong shape": (
            "sa.generate(Model(answer=np.full((1, 1, 3), 1 / 3)), Model(), [[0]], rng=0)",
            "ValueError",
        ),
        "generate: model answers a str": (
            "sa.generate(Model(), Model(answer='probs'), [[0]], rng=0)",
            "TypeError",
        ),
        "generate: model answers None": (
            "sa.generate(Model(), Model(answer=None, onehot='none'), [[0]], rng=0)",
            "TypeError",
        ),
        "generate: model answers ints": (
            "sa.generate(Model(), Model(answer=np.ones((1, 1, 4), np.int64)), [[0]], rng=0)",
            "TypeError",
        ),
        "generate: a tree from a stateless draft": (
            "g = sa.generate(Model(), Model(), w([[0, 1], [2]]), tree=[2, 1], max_new_tokens=5,"
            " rng=0)\nassert [len(t) for t in g.tokens] == [5, 5]",
            "ok",
        ),
        "generate: traversal tree, seeded, with filters": (
            "g = generation.generate(Model(), Model(), [[0]], tree=[3], method='traversal',"
            " temperature=0.5, top_k=2, top_p=0.9, max_new_tokens=4, seed=2**64 - 1)\n"
            "assert len(g.tokens[0]) == 4",
            "ok",
        ),
        "generate: block, PromptLookup, per-prompt temperatures": (
            "g = sa.generate(Model(), sa.PromptLookup(), [[0, 1, 0], [2]], k=3, method='block',"
            " temperature=[0.0, 2.0], max_new_tokens=6, rng=0)\n"
            "assert [len(t) for t in g.tokens] == [6, 6]",
            "ok",
        ),
        "generate: tree empty": (
            "sa.generate(Model(), Model(), [[0]], tree=[], rng=0)",
            "ValueError",
        ),
        "generate: tree 0": (
            "sa.generate(Model(), Model(), [[0]], tree=[2, 0], rng=0)",
            "ValueError",
        ),
        "generate: tree str": (
            "sa.generate(Model(), Model(), [[0]], tree='3,2', rng=0)",
            "TypeError",
        ),
        "generate: tree float": (
            "sa.generate(Model(), Model(), [[0]], tree=[2.0], rng=0)",
            "TypeError",
        ),
        "generate: tree 2**64 wide": (
            "sa.generate(Model(), Model(), [[0]], tree=[2**64], rng=0)",
            "ValueError",
        ),
        "generate: tree with PromptLookup": (
            "sa.generate(Model(), sa.PromptLookup(), [[0]], tree=[2], rng=0)",
            "ValueError",
        ),
        "generate: tree with record": (
            "sa.generate(Model(), Model(), [[0]], tree=[2], record='steps.npz', rng=0)",
            "ValueError",
        ),
        "generate: method traversal for chains": (
            "sa.generate(Model(), Model(), [[0]], method='traversal', rng=0)",
            "ValueError",
        ),
        "generate: method block for trees": (
            "sa.generate(Model(), Model(), [[0]], tree=[2], method='block', rng=0)",
            "ValueError",
        ),
        "generate: method int": (
            "sa.generate(Model(), Model(), [[0]], method=1, rng=0)",
            "TypeError",
        ),
        "generate: temperature NaN": (
            "sa.generate(Model(), Model(), [[0]], temperature=float('nan'), rng=0)",
            "ValueError",
        ),
        "generate: temperature -1": (
            "sa.generate(Model(), Model(), [[0]], temperature=-1, rng=0)",
            "ValueError",
        ),
        "generate: temperature subnormal": (
            "sa.generate(Model(), Model(), [[0]], temperature=5e-324, rng=0)",
            "ValueError",
        ),
        "generate: temperature 10**400": (
            "sa.generate(Model(), Model(), [[0]], temperature=10**400, rng=0)",
            "ValueError",
        ),
        "generate: temperature str": (
            "sa.generate(Model(), Model(), [[0]], temperature='hot', rng=0)",
            "TypeError",
        ),
        "generate: temperature per prompt, wrong count": (
            "sa.generate(Model(), Model(), [[0], [1]], temperature=[1.0], rng=0)",
            "ValueError",
        ),
        "generate: temperature 2-D": (
            "sa.generate(Model(), Model(), [[0]], temperature=np.ones((1, 1)), rng=0)",
            "TypeError",
        ),
        "generate: top_k -1": (
            "sa.generate(Model(), Model(), [[0]], top_k=-1, rng=0)",
            "ValueError",
        ),
        "generate: top_k float": (
            "sa.generate(Model(), Model(), [[0]], top_k=1.5, rng=0)",
            "TypeError",
        ),
        "generate: top_k 2**70": (
            "g = sa.generate(Model(), Model(), [[0]], top_k=2**70, max_new_tokens=2, rng=0)\n"
            "assert len(g.tokens[0]) == 2",
            "ok",
        ),
        "generate: top_p 0": (
            "sa.generate(Model(), Model(), [[0]], top_p=0.0, rng=0)",
            "ValueError",
        ),
        "generate: top_p 1.5": (
            "sa.generate(Model(), Model(), [[0]], top_p=1.5, rng=0)",
            "ValueError",
        ),
        "generate: errors str": (
            "sa.generate(Model(), Model(), [[0]], errors='ignore', rng=0)",
            "ValueError",
        ),
        "generate: errors None": (
            "sa.generate(Model(), Model(), [[0]], errors=None, rng=0)",
            "TypeError",
        ),
        "generate: record in a missing folder": (
            "sa.generate(Model(), Model(), [[0]], record='/no/such/folder/s.npz', rng=0)",
            "ValueError",
        ),
        "generate: record int": (
            "sa.generate(Model(), Model(), [[0]], record=5, rng=0)",
            "TypeError",
        ),
        "generate: isolate ends the empty prompt alone": (
            "g = sa.generate(Model(), Model(), [[0], []], max_new_tokens=3, errors='isolate',"
            " rng=0)\nassert list(g.errors) == [1] and len(g.tokens[0]) == 3",
            "ok",
        ),
        "generate: isolate with a NaN model": (
            "g = sa.generate(Model(answer=np.full((1, 3, 4), np.nan)), Model(), [[0]], k=2,"
            " errors='isolate', rng=0)\nassert list(g.errors) == [0]",
            "ok",
        ),
        "verify_tree: one Generator per row": (
            "gs = [np.random.default_rng(b) for b in range(2)]\n"
            "r = sa.verify_tree(w(np.array([[0, 1, 2], [0, 3, 4]])), w(np.array([-1, 0, 0])),"
            " w(probs(2, 3, 5)), w(probs(2, 3, 5, seed=1)), rng=gs)\n"
            "assert r.output_token_ids.shape[0] == 2",
            "ok",
        ),
        "verify_tree: Generators for another batch": (
            "sa.verify_tree(np.array([[0, 1, 2]]), np.array([-1, 0, 0]), probs(1, 3, 5),"
            " rng=[np.random.default_rng(), np.random.default_rng()])",
            "ValueError",
        ),
        "verify_tree: a seed among the Generators": (
            "sa.verify_tree(np.array([[0, 1, 2]]), np.array([-1, 0, 0]), probs(1, 3, 5), rng=[7])",
            "TypeError",
        ),
        "vllm.rejection_sample: isolate": (
            "t = probs(3, 5); t[0] = np.nan\n"
            "r = vllm.rejection_sample(w(np.array([1, 2, 3])), [2, 1], w(t), None,"
            " w(np.array([4, 4])), rng=0, errors='isolate')\nassert r[0].tolist() == [-1, -1, -1]",
            "ok",
        ),
        "vllm.rejection_sample: errors bogus": (
            "vllm.rejection_sample(np.array([1]), [1], probs(1, 5), None, np.array([4]),"
            " errors='bogus')",
            "ValueError",
        ),
        "load_steps: valid": (
            "import tempfile\nf = tempfile.mktemp(suffix='.npz')\n"
            "np.savez(f, draft_token_ids=IDS(), target_probs=P(), draft_probs=Q())\n"
            "ids, p, q, counts = lab.load_steps(f)\nassert ids.shape == (2, 3) and counts is None",
            "ok",
        ),
        "load_steps: missing file": ("lab.load_steps('/no/such/steps.npz')", "ValueError"),
        "load_steps: not an npz": (
            "import tempfile\nf = tempfile.mktemp()\nopen(f, 'w').write('text')\nlab.load_steps(f)",
            "ValueError",
        ),
        "load_steps: one array": (
            "import tempfile\nf = tempfile.mktemp(suffix='.npy')\nnp.save(f, P())\nlab.load_steps(f)",
            "ValueError",
        ),
        "load_steps: no target_probs": (
            "import tempfile\nf = tempfile.mktemp(suffix='.npz')\nnp.savez(f, draft_token_ids=IDS())\n"
            "lab.load_steps(f)",
            "ValueError",
        ),
        "load_steps: float ids": (
            "import tempfile\nf = tempfile.mktemp(suffix='.npz')\n"
            "np.savez(f, draft_token_ids=IDS() * 1.0, target_probs=P())\nlab.load_steps(f)",
            "ValueError",
        ),
        "load_steps: pickled objects": (
            "import tempfile\nf = tempfile.mktemp(suffix='.npz')\n"
            "np.savez(f, draft_token_ids=np.array([object()]), target_probs=P())\nlab.load_steps(f)",
            "ValueError",
        ),
        "load_steps: path int": ("lab.load_steps(5)", "TypeError|ValueError"),
        "PromptLookup: max_ngram 0": ("sa.PromptLookup(max_ngram=0)", "ValueError"),
        "PromptLookup: min_ngram above max_ngram": (
            "sa.PromptLookup(max_ngram=1, min_ngram=2)",
            "ValueError",
        ),
        "PromptLookup: max_ngram str": ("sa.PromptLookup(max_ngram='2')", "TypeError"),
        "PromptLookup: max_ngram 2**64": (
            "assert sa.PromptLookup(max_ngram=2**64).lookup([1, 2, 1], 2) == [2, 1]",
            "ok",
        ),
        "generate: model answers NaN": (
            "sa.generate(Model(answer=np.full((1, 3, 4), np.nan)), Model(), [[0]], k=2, rng=0)",
            "ValueError",
        ),
        "generate: model answers negative": (
            "sa.generate(Model(), Model(answer=np.full((1, 1, 4), -0.25)), [[0]], k=2, rng=0)",
            "ValueError",
        ),
        "generate: drafter token out of range": (
            "class D:\n"
            "    vocab_size = 4\n"
            "    def propose(self, sequences, k, rng, greedy):\n"
            "        return np.full((len(sequences), k), 9), np.full((len(sequences), k, 4), 0.25)\n"
            "sa.generate(Model(), D(), [[0]], k=2, rng=0)",
            "ValueError",
        ),
        "generate: drafter answers None": (
            "class D:\n"
            "    vocab_size = 4\n"
            "    def propose(self, sequences, k, rng, greedy):\n"
            "        return None\n"
            "sa.generate(Model(), D(), [[0]], k=2, rng=0)",
            "TypeError",
        ),
        # --- CLI ----------------------------------------------------------------------------
        "cli: unknown flag": ("cli('--bogus')", "ok"),
        "cli: demo --k -1": ("cli('demo', '--k', '-1')", "ok"),
        "cli: demo --k abc": ("cli('demo', '--k', 'abc')", "ok"),
        "cli: demo --max-new-tokens huge": (
            "cli('demo', '--max-new-tokens', '99999999999999999999999')",
            "ok",
        ),
        "cli: demo --k huge": ("cli('demo', '--k', str(2**64), '--max-new-tokens', '3')", "ok"),
        "cli: example --batch huge": ("cli('example', '--batch', '99999999999999999999')", "ok"),
        "cli: example --k huge": ("cli('example', '--k', '99999999999999999999')", "ok"),
        "cli: example --batch -1": ("cli('example', '--batch', '-1')", "ok"),
        "cli: example --seed -1": ("cli('example', '--seed', '-1')", "ok"),
        "cli: example --seed huge": ("cli('example', '--seed', str(2**200), ok=True)", "ok"),
        "cli: check --samples 0": ("cli('check', '--samples', '0')", "ok"),
        "cli: check --samples huge": ("cli('check', '--samples', '99999999999999999999')", "ok"),
        "cli: bench --budget nan": ("cli('bench', '--budget', 'nan')", "ok"),
        "cli: bench --budget -1": ("cli('bench', '--budget', '-1')", "ok"),
        # --- like=, array-likes -----------------------------------------------------------------
        "verify: like int": ("sa.verify(IDS(), P(), rng=0, like=5)", "TypeError"),
        "verify: like from module torch, torch not importable": (
            "Fake = type('Tensor', (), {'__module__': 'torch'})\n"
            "saved = sys.modules.get('torch')\n"
            "sys.modules['torch'] = None  # import torch raises ImportError\n"
            "try:\n"
            "    sa.verify(IDS(), P(), rng=0, like=Fake())\n"
            "finally:\n"
            "    if saved is None:\n"
            "        del sys.modules['torch']\n"
            "    else:\n"
            "        sys.modules['torch'] = saved",
            "TypeError",
        ),
        "verify: like from module torch, not a tensor": (
            "Fake = type('Size', (), {'__module__': 'torch'})\nsa.verify(IDS(), P(), rng=0, like=Fake())",
            "TypeError",
        ),
        "verify: memoryview probs": (
            "ok_ver(sa.verify(IDS(), memoryview(P()), rng=0))",
            "ok",
        ),
        "verify: bytes ids": ("sa.verify(b'abc', P(), rng=0)", "TypeError"),
        "verify: array interface without data": (
            "class A:\n"
            "    __array_interface__ = {'shape': (2**40, 2**20), 'typestr': '<i8', 'version': 3}\n"
            "sa.verify(A(), P(), rng=0)",
            "ValueError|MemoryError",
        ),
        "verify: __dlpack_device__ bogus": (
            "class T:\n"
            "    def __dlpack__(self, **kw):\n"
            "        raise RuntimeError('no')\n"
            "    def __dlpack_device__(self):\n"
            "        return 'cpu'\n"
            "sa.verify(T(), P(), rng=0)",
            "TypeError",
        ),
        "verify: dlpack on an accelerator": (
            "class T:\n"
            "    def __dlpack__(self, **kw):\n"
            "        raise RuntimeError('no')\n"
            "    def __dlpack_device__(self):\n"
            "        return (2, 0)\n"
            "sa.verify(IDS(), T(), rng=0)",
            "TypeError",
        ),
        "verify: byte-swapped float probs": (
            "ok_ver(sa.verify(w(IDS()), w(P().astype('>f8')), rng=0))",
            "ok",
        ),
        "verify: longdouble probs": (
            "ok_ver(sa.verify(w(IDS()), w(P().astype(np.longdouble)), rng=0))",
            "ok",
        ),
        "verify: uint8 ids": ("ok_ver(sa.verify(w(IDS().astype(np.uint8)), w(P()), rng=0))", "ok"),
        "verify: Fortran order probs": (
            "ok_ver(sa.verify(w(IDS()), w(np.asfortranarray(P())), w(Q()[:, :, ::-1]), rng=0))",
            "ok",
        ),
    }
)

CASES.update(
    {
        "verify out: aliases the target probabilities": (
            "p = P(); o = p.reshape(2, 20).view(np.int64)[:, :4]\n"
            "sa.verify(w(IDS()), w(p), rng=0, out=(o, np.zeros(2, np.int64)))",
            "ValueError",
        ),
        "verify out: num_accepted aliases the counts": (
            "c = np.array([3, 1])\n"
            "sa.verify(w(IDS()), w(P()), num_draft_tokens=w(c), rng=0,"
            " out=(np.zeros((2, 4), np.int64), c))",
            "ValueError",
        ),
        "verify out: num_emitted is num_accepted": (
            "o = sa.Verification.empty(2, 3)\n"
            "sa.verify(w(IDS()), w(P()), rng=0, out=(o.output_token_ids, o.num_accepted,"
            " o.num_accepted))",
            "ValueError",
        ),
        "verify out: Verification of another size": (
            "sa.verify(IDS(), P(), rng=0, out=sa.Verification.empty(3, 3))",
            "ValueError",
        ),
        "verify out: list of lists": (
            "sa.verify(IDS(), P(), rng=0, out=[[0] * 4] * 2)",
            "TypeError",
        ),
        "verify_greedy: out Verification": (
            "o = sa.Verification.empty(1, 2)\n"
            "r = sa.verify_greedy(w(np.array([[5, 7]])), w(np.array([[5, 9, 2]])), out=o)\n"
            "assert r.output_token_ids is o.output_token_ids and r.to_lists() == [[5, 9]]",
            "ok",
        ),
        "verify_greedy: out ids alias draft": (
            "d = np.zeros((1, 3), np.int64)\n"
            "sa.verify_greedy(d[:, :2], np.array([[0, 0, 1]]), out=(d, np.zeros(1, np.int64)))",
            "ValueError",
        ),
        "verify_greedy: empty": (
            "r = sa.verify_greedy(np.zeros((0, 2), np.int64), np.zeros((0, 3), np.int64))\n"
            "assert r.output_token_ids.shape == (0, 3)",
            "ok",
        ),
        "verify_greedy: str": ("sa.verify_greedy('ab', 'abc')", "TypeError"),
        "verify_greedy: negative count": (
            "sa.verify_greedy(np.array([[3]]), np.array([[3, 4]]), num_draft_tokens=np.array([-1]))",
            "ValueError",
        ),
    }
)

CASES.update(
    {
        # --- seeds and offsets (docs/spec.md section 4.6) ------------------------------
        "counter_uniforms: valid": (
            "u, ru = sa.counter_uniforms(w(np.array([0, 2**64 - 1], np.uint64)), w([3, 4]), 5)\n"
            "assert u.shape == (2, 5) and ru.shape == (2,)",
            "ok",
        ),
        "counter_uniforms: 2**32 + 1 positions": (
            "sa.counter_uniforms([1], [0], 2**32 + 1)",
            "ValueError",
        ),
        "counter_uniforms: output too large": (
            "sa.counter_uniforms(np.zeros(2**24, np.uint64), 0, 2**32)",
            "MemoryError",
        ),
        "counter_uniforms: broadcast 2**40 seeds": (
            "sa.counter_uniforms(np.broadcast_to(np.uint64(1), (2**40,)), 0, 1)",
            "MemoryError",
        ),
        "counter_uniforms: float positions": ("sa.counter_uniforms([1], [0], 2.0)", "TypeError"),
        "counter_uniforms: None seeds": ("sa.counter_uniforms(None, [0], 2)", "TypeError"),
        "counter_uniforms: dict seeds": ("sa.counter_uniforms({1: 2}, [0], 2)", "TypeError"),
        "counter_uniforms: 2-D seeds": ("sa.counter_uniforms([[1]], [0], 2)", "TypeError"),
        "counter_uniforms: seed 2**64": ("sa.counter_uniforms([2**64], [0], 2)", "ValueError"),
        "counter_uniforms: object array": (
            "sa.counter_uniforms(np.array([1, 'a'], object), [0, 0], 2)",
            "TypeError",
        ),
        "verify: seeds and offsets": (
            "ok_ver(sa.verify(w(IDS()), w(P()), w(Q()), seeds=w(np.array([5, 6])), offsets=w([1, 2])))",
            "ok",
        ),
        "verify: seeds without offsets": ("sa.verify(IDS(), P(), seeds=[1, 2])", "ValueError"),
        "verify: seeds with rng": (
            "sa.verify(IDS(), P(), seeds=[1, 2], offsets=0, rng=0)",
            "ValueError",
        ),
        "verify: seeds of the wrong length": (
            "sa.verify(IDS(), P(), seeds=[1, 2, 3], offsets=0)",
            "ValueError",
        ),
        "verify: negative offsets": (
            "sa.verify(IDS(), P(), seeds=[1, 2], offsets=[-1, 0])",
            "ValueError",
        ),
        "verify: float seeds": ("sa.verify(IDS(), P(), seeds=np.ones(2), offsets=0)", "TypeError"),
        "verify: seeds on a [2**40, 1] broadcast batch": (
            "sa.verify(huge_ids(2**40, 1), np.broadcast_to(P(1, 1)[0], (2**40, 2, 5)),"
            " seeds=np.broadcast_to(np.uint64(1), (2**40,)), offsets=0)",
            "MemoryError",
        ),
        "verify_logits: seeds": (
            "ok_ver(sa.verify_logits(w(IDS()), w(np.log(P())), seeds=[1, 2], offsets=7, top_k=2))",
            "ok",
        ),
        "verify_logits: seeds with uniforms": (
            "sa.verify_logits(IDS(), np.log(P()), seeds=[1, 2], offsets=7, uniforms=U())",
            "ValueError",
        ),
        "verify_tree: seeds": (
            "ok_tree(sa.verify_tree(w(np.array([[0, 1, 2]] * 2)), w(np.array([-1, 0, 0])),"
            " w(probs(2, 3, 5)), seeds=[1, 2], offsets=[0, 0]), 2, 5)",
            "ok",
        ),
        "verify_tree: offsets without seeds": (
            "sa.verify_tree(np.array([[0, 1]]), np.array([-1, 0]), probs(1, 2, 5), offsets=[0])",
            "ValueError",
        ),
        "vllm.verify: seeds": (
            "r = vllm.verify(w(np.array([1, 2, 3])), [2, 1], w(probs(3, 5)), None,"
            " w(np.array([4, 4])), seeds=[1, 2], offsets=[3, 4])\n"
            "assert r.output_token_ids.shape == (2, 3)",
            "ok",
        ),
        "vllm.verify: seeds with counts not summing to T": (
            "vllm.verify(np.array([1, 2, 3]), [2, 2], probs(3, 5), None, np.array([4, 4]),"
            " seeds=[1, 2], offsets=0)",
            "ValueError",
        ),
        "vllm.verify: seeds with huge counts": (
            "vllm.verify(np.array([1, 2, 3]), [2**62, 2**62, 2**63 - 1], probs(3, 5), None,"
            " np.array([4, 4, 4]), seeds=[1, 2, 3], offsets=0)",
            "ValueError",
        ),
        "flashinfer: seeds": (
            "flashinfer.chain_speculative_sampling(w(Q()), w(IDS()), None, w(P()), seeds=[1, 2],"
            " offsets=0)",
            "ok",
        ),
        "flashinfer: neither uniforms nor seeds": (
            "flashinfer.chain_speculative_sampling(Q(), IDS(), None, P())",
            "ValueError",
        ),
        "generate: seed": (
            "from specaccept.ngram import builtin_models\n"
            "t, d, v = builtin_models()\n"
            "out = sa.generate(t, d, w([v.encode('She')]), k=2, max_new_tokens=4, seed=2**64 - 1)\n"
            "assert len(out.tokens[0]) == 4",
            "ok",
        ),
        "generate: seed 2**64": (
            "from specaccept.ngram import builtin_models\n"
            "t, d, v = builtin_models()\n"
            "sa.generate(t, d, [v.encode('She')], seed=2**64)",
            "ValueError",
        ),
        "reference.counter_uniforms: negative seed": (
            "reference.counter_uniforms([-1], [0], 1)",
            "ValueError",
        ),
        "reference.verify: seeds": (
            "ok_ver(reference.verify(w(IDS()), w(P()), w(Q()), seeds=[1, 2], offsets=0))",
            "ok",
        ),
        # --- bfloat16 (ml_dtypes) ---------------------------------------------------------
        "verify: bfloat16 probs": (
            "import ml_dtypes\n"
            "ok_ver(sa.verify(w(IDS()), w(P().astype(ml_dtypes.bfloat16)),"
            " w(Q().astype(ml_dtypes.bfloat16)), rng=0))",
            "ok",
        ),
        "verify: bfloat16 NaN target": (
            "import ml_dtypes\n"
            "p = P().astype(ml_dtypes.bfloat16); p[:, :, :] = np.nan\n"
            "sa.verify(w(IDS()), w(p), rng=0)",
            "ValueError",
        ),
        "verify: float8 probs": (
            "import ml_dtypes\nsa.verify(IDS(), P().astype(ml_dtypes.float8_e5m2), rng=0)",
            "TypeError",
        ),
        "verify: int4 probs": (
            "import ml_dtypes\nsa.verify(IDS(), np.zeros((2, 4, 5), ml_dtypes.int4), rng=0)",
            "TypeError",
        ),
        "verify: bfloat16 broadcast 2**40 rows": (
            "import ml_dtypes\n"
            "sa.verify(huge_ids(2**40, 1), np.broadcast_to(P(1, 1)[0].astype(ml_dtypes.bfloat16),"
            " (2**40, 2, 5)), rng=0)",
            "MemoryError",
        ),
        "verify_logits: bfloat16 logits": (
            "import ml_dtypes\n"
            "ok_ver(sa.verify_logits(w(IDS()), w(np.log(P()).astype(ml_dtypes.bfloat16)), rng=0,"
            " top_p=0.9))",
            "ok",
        ),
        "verify_tree: bfloat16": (
            "import ml_dtypes\n"
            "ok_tree(sa.verify_tree(w(np.array([[0, 1, 2]])), w(np.array([-1, 0, 0])),"
            " w(probs(1, 3, 5).astype(ml_dtypes.bfloat16)), rng=0), 1, 5)",
            "ok",
        ),
        "acceptance_rate: bfloat16 against float16": (
            "import ml_dtypes\n"
            "r = sa.acceptance_rate(w(Q().astype(ml_dtypes.bfloat16)), w(Q(). astype(np.float16)))\n"
            "assert r.shape == (2, 3)",
            "ok",
        ),
        "rejection_probability: bfloat16 inf": (
            "import ml_dtypes\n"
            "sa.rejection_probability(np.array([np.inf], ml_dtypes.bfloat16), np.array([0.5]))",
            "ValueError",
        ),
    }
)

CASES.update(
    {
        # --- the lossy methods (docs/spec.md sections 2.7, 2.8) ------------------------
        "verify: typical": (
            "ok_ver(sa.verify(w(IDS()), w(P()), w(Q()), method='typical', rng=0))",
            "ok",
        ),
        "verify: typical, float16 strided": (
            "ok_ver(sa.verify(w(IDS()), w(P().astype(np.float16)[:, :, ::-1]),"
            " method=lossy.Typical(epsilon=0.5, delta=2.0), rng=0))",
            "ok",
        ),
        "verify: typical, a zero row": (
            "sa.verify(IDS(), np.zeros((2, 4, 5)), method='typical', rng=0)",
            "ValueError",
        ),
        "verify: typical, NaN row": (
            "p = P(); p[0, 0, 4] = np.nan\nsa.verify(IDS(), p, method='typical', rng=0)",
            "ValueError",
        ),
        "lossy.Typical: epsilon inf": ("lossy.Typical(epsilon=np.inf)", "ValueError"),
        "lossy.Typical: delta list": ("lossy.Typical(delta=[0.3])", "TypeError"),
        "lossy.Typical: epsilon 10**400": ("lossy.Typical(epsilon=10**400)", "ValueError"),
        "verify: a (name, parameters) pair as method": (
            "sa.verify(IDS(), P(), method=('typical', {'epsilon': 0.1}), rng=0)",
            "TypeError",
        ),
        "verify: typical, broadcast 2**40 rows": (
            "sa.verify(huge_ids(2**40, 1), np.broadcast_to(P(1, 1)[0], (2**40, 2, 5)),"
            " method='typical', rng=0)",
            "MemoryError",
        ),
        "verify: typical isolates a bad row": (
            "p = P(); p[1, 0, :] = -1\n"
            "r = sa.verify(w(IDS()), w(p), method='typical', rng=0, errors='isolate')\n"
            "assert list(r.errors) == [1]",
            "ok",
        ),
        "verify: synthetic": (
            "ok_ver(sa.verify(w(IDS()), w(P()), method=lossy.Synthetic(rate=w(np.array("
            "[0.5, 0.2, 0.9]))), seeds=[1, 2], offsets=0))",
            "ok",
        ),
        "verify: synthetic without a rate": (
            "sa.verify(IDS(), P(), method='synthetic', rng=0)",
            "ValueError",
        ),
        "lossy.Synthetic: rate NaN": ("lossy.Synthetic(rate=np.nan)", "ValueError"),
        "lossy.Synthetic: rates 2-D": ("lossy.Synthetic(rate=np.ones((3, 1)))", "TypeError"),
        "lossy.Synthetic: rates of objects": ("lossy.Synthetic(rate=[None, 1, 2])", "TypeError"),
        "lossy.Synthetic: rate str": ("lossy.Synthetic(rate='high')", "TypeError"),
        "verify: synthetic rates for another K": (
            "sa.verify(IDS(), P(), method=lossy.Synthetic(rate=[0.5, 0.5]), rng=0)",
            "ValueError",
        ),
        "lossy.Synthetic: huge rate array": (
            "lossy.Synthetic(rate=np.broadcast_to(0.5, (2**30,)))",
            "ValueError",
        ),
        "vllm.verify: synthetic with rates": (
            "r = vllm.verify(w(np.array([1, 2, 3])), [2, 1], w(probs(3, 5)), None,"
            " w(np.array([4, 4])), rejection_sample_method='synthetic',"
            " method=lossy.Synthetic(rate=0.5), rng=0)\nassert r.output_token_ids.shape == (2, 3)",
            "ok",
        ),
        "reference.verify: typical": (
            "ok_ver(reference.verify(w(IDS()), w(P()), w(Q()), method='typical', rng=0))",
            "ok",
        ),
        # --- verify_logits(draft_token_probs=) -----------------------------------------
        "verify_logits: draft_token_probs": (
            "ok_ver(sa.verify_logits(w(IDS()), w(np.log(P())), w(np.log(Q())),"
            " draft_token_probs=w(np.full((2, 3), 0.2)), rng=0))",
            "ok|ValueError",
        ),
        "verify_logits: draft_token_probs broadcast": (
            "sa.verify_logits(IDS(), np.log(P()), np.log(Q()),"
            " draft_token_probs=np.broadcast_to(0.2, (2, 3)), rng=0)",
            "ok|ValueError",
        ),
        "verify_logits: draft_token_probs without draft_logits": (
            "sa.verify_logits(IDS(), np.log(P()), draft_token_probs=np.full((2, 3), 0.2), rng=0)",
            "ValueError",
        ),
        "verify_logits: draft_token_probs of ints": (
            "sa.verify_logits(IDS(), np.log(P()), np.log(Q()), draft_token_probs=[[1, 1, 1]] * 2,"
            " rng=0)",
            "TypeError",
        ),
        "verify_logits: draft_token_probs infinite": (
            "sa.verify_logits(IDS(), np.log(P()), np.log(Q()),"
            " draft_token_probs=np.full((2, 3), np.inf), rng=0)",
            "ValueError",
        ),
        # --- compare_methods -------------------------------------------------------------
        "compare_methods: valid": (
            "c = lab.compare_methods(w(IDS()), w(P()), w(Q()), samples=3)\n"
            "assert [r.name for r in c.results] == ['token', 'block', 'typical']",
            "ok",
        ),
        "compare_methods: one-hot drafts, ragged": (
            "lab.compare_methods(w(IDS()), w(P()), None, num_draft_tokens=w(np.array([0, 3])),"
            " samples=2, methods=['token', lossy.Synthetic(rate=0.5)])",
            "ok",
        ),
        "compare_methods: bad probabilities": (
            "p = P(); p[0, 0, 0] = np.nan\nlab.compare_methods(IDS(), p, Q(), samples=2)",
            "ValueError",
        ),
        "compare_methods: methods a dict": (
            "lab.compare_methods(IDS(), P(), Q(), methods={'token': {}})",
            "TypeError",
        ),
        "compare_methods: samples 10**12": (
            "lab.compare_methods(IDS(), P(), Q(), samples=10**12)",
            "ValueError|MemoryError",
        ),
        "compare_methods: broadcast 2**40 steps": (
            "lab.compare_methods(huge_ids(2**40, 1), np.broadcast_to(P(1, 1)[0], (2**40, 2, 5)),"
            " samples=2)",
            "MemoryError",
        ),
        "cli: compare on an empty file": ("cli('compare', '--from', os.devnull)", "ok"),
        "cli: compare with K 0": ("cli('compare', '--k', '0')", "ok"),
        "cli: compare with K text": ("cli('compare', '--k', 'two')", "ok"),
        "cli: compare with one sample": ("cli('compare', '--samples', '1')", "ok"),
        # --- the reference's helpers and the n-gram module ---------------------------------
        "reference.acceptance_rate: valid": (
            "assert reference.acceptance_rate(w(Q()), w(Q())).shape == (2, 3)",
            "ok",
        ),
        "reference.acceptance_rate: shapes differ": (
            "reference.acceptance_rate(Q(), P())",
            "ValueError",
        ),
        "reference.accepted_prefix_length: valid": (
            "r = reference.accepted_prefix_length(w(np.array([[True, False, True]])))\n"
            "assert r.tolist() == [1]",
            "ok",
        ),
        "reference.accepted_prefix_length: ints": (
            "reference.accepted_prefix_length(np.array([[1, 0]]))",
            "TypeError",
        ),
        "reference.philox4x32_10: known answer": (
            "assert reference.philox4x32_10((0, 0, 0, 0), (0, 0))[0] == 0x6627E8D5",
            "ok",
        ),
        "reference.philox4x32_10: short counter": (
            "reference.philox4x32_10((0, 0), (0, 0))",
            "ValueError",
        ),
        "reference.counter_uniform: valid": (
            "assert 0 <= reference.counter_uniform(2**64 - 1, 2**64 - 1, 2**32 - 1, 1) < 1",
            "ok",
        ),
        "reference.sample_index: valid": (
            "assert reference.sample_index([0.0, 1.0, 1.0], 0.75) == 2",
            "ok",
        ),
        "reference.sample_index: all zero": (
            "assert reference.sample_index([0.0, 0.0], 0.5) is None",
            "ok",
        ),
        "reference.transform_logits: valid": (
            "r = reference.transform_logits(w(np.array([0.0, 1.0, 2.0])), 1.0, 2, 1.0)\n"
            "assert abs(sum(r) - 1) < 1e-12 and r[0] == 0",
            "ok",
        ),
        "reference.transform_logits: NaN": (
            "reference.transform_logits(np.array([0.0, np.nan]), 1.0, 0, 1.0)",
            "ValueError",
        ),
        "reference.transform_logits: temperature 0": (
            "r = reference.transform_logits(np.array([0.0, 2.0, 2.0]), 0.0, 0, 1.0)\n"
            "assert r == [0.0, 1.0, 0.0], r",
            "ok",
        ),
        "reference.transform_logits: temperature NaN": (
            "reference.transform_logits(np.array([0.0, 1.0]), float('nan'), 0, 1.0)",
            "ValueError",
        ),
        "reference.transform_logits: temperature subnormal": (
            "reference.transform_logits(np.array([0.0, 1.0]), 5e-324, 0, 1.0)",
            "ValueError",
        ),
        "reference.transform_logits: temperature str": (
            "reference.transform_logits(np.array([0.0, 1.0]), 'hot', 0, 1.0)",
            "TypeError",
        ),
        "reference.transform_logits: top_k float": (
            "reference.transform_logits(np.array([0.0, 1.0]), 1.0, 1.5, 1.0)",
            "TypeError",
        ),
        "reference.transform_logits: top_k -1": (
            "reference.transform_logits(np.array([0.0, 1.0]), 1.0, -1, 1.0)",
            "ValueError",
        ),
        "reference.transform_logits: top_p 2": (
            "reference.transform_logits(np.array([0.0, 1.0]), 1.0, 0, 2.0)",
            "ValueError",
        ),
        "ngram.builtin_text": ("assert 'Elliot' in ngram.builtin_text()", "ok"),
        "ngram.builtin_models: orders": (
            "t, d, v = ngram.builtin_models(3, 1)\nassert t.vocab_size == d.vocab_size",
            "ok",
        ),
        "ngram.builtin_models: order 0": ("ngram.builtin_models(0, 1)", "ValueError"),
        "ngram.builtin_models: str order": ("ngram.builtin_models('4')", "TypeError"),
        "ngram.drafted_block: valid": (
            "t, d, v = ngram.builtin_models()\n"
            "ids, p, q = ngram.drafted_block(t, d, w(v.encode('She')), 3, np.random.default_rng(0))\n"
            "assert ids.shape == (1, 3) and p.shape == (1, 4, t.vocab_size)",
            "ok",
        ),
        "ngram.drafted_block: negative k": (
            "t, d, v = ngram.builtin_models()\n"
            "ngram.drafted_block(t, d, v.encode('She'), -1, np.random.default_rng(0))",
            "ValueError",
        ),
        "ngram.drafted_block: unseen context token": (
            "t, d, v = ngram.builtin_models()\n"
            "ids, p, q = ngram.drafted_block(t, d, [10**9], 2, np.random.default_rng(0))\n"
            "assert ids.shape == (1, 2)",  # an unseen context backs off to shorter ones
            "ok",
        ),
        "ngram.drafted_tree: valid": (
            "t, d, v = ngram.builtin_models()\n"
            "ids, p, q = ngram.drafted_tree(t, d, w(v.encode('She')), w([-1, 0, 0, 1]),"
            " np.random.default_rng(0))\n"
            "assert ids.shape == (1, 4)",
            "ok",
        ),
        "ngram.drafted_tree: parent after child": (
            "t, d, v = ngram.builtin_models()\n"
            "ngram.drafted_tree(t, d, v.encode('She'), [-1, 2, 0], np.random.default_rng(0))",
            "ValueError",
        ),
    }
)

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
        elif case not in CASES:
            report.update(outcome="unknown case", message="")
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
