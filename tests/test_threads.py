"""Threads: large batches run on a worker pool with the same result, the GIL is
released around the kernel, and the thread count is settable."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import specaccept
from conftest import random_rows
from specaccept import reference


@pytest.fixture
def restore_threads():
    before = specaccept.get_num_threads()
    yield
    specaccept.set_num_threads(before)


def large_batch(
    seed: int, batch: int = 24, num_draft: int = 4, vocab: int = 20000, dtype=np.float32
):
    """A batch above PARALLEL_MIN_ELEMENTS (see :func:`any_batch`)."""
    assert batch * vocab >= specaccept.PARALLEL_MIN_ELEMENTS
    return any_batch(seed, batch, num_draft, vocab, dtype)


def any_batch(seed: int, batch: int, num_draft: int = 4, vocab: int = 20000, dtype=np.float32):
    """A batch with ragged rows, greedy rows and a mix of accepted and rejected positions."""
    rng = np.random.default_rng(seed)
    p = random_rows(rng, (batch, num_draft + 1, vocab), dtype)
    q = random_rows(rng, (batch, num_draft, vocab), dtype)
    ids = rng.integers(0, vocab, size=(batch, num_draft))
    # Half the drafts are the target's favourite token: those rows accept further.
    favourite = np.argmax(p[:, :num_draft], axis=-1)
    ids = np.where(rng.random((batch, num_draft)) < 0.5, favourite, ids)
    return dict(
        draft_token_ids=ids,
        target_probs=p,
        draft_probs=q,
        num_draft_tokens=rng.integers(0, num_draft + 1, size=batch),
        uniforms=rng.random((batch, num_draft)),
        recovery_uniforms=rng.random(batch),
        greedy=rng.random(batch) < 0.25,
    )


def same(a: specaccept.Verification, b: specaccept.Verification) -> None:
    np.testing.assert_array_equal(a.output_token_ids, b.output_token_ids)
    np.testing.assert_array_equal(a.num_accepted, b.num_accepted)
    np.testing.assert_array_equal(a.num_emitted, b.num_emitted)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_every_thread_count_gives_the_reference_result(dtype, restore_threads):
    case = large_batch(seed=3, dtype=dtype)
    expected = reference.verify(**case)
    assert 0 < expected.num_accepted.sum() < case["num_draft_tokens"].sum(), "a mixed batch"
    for n in (1, 2, 3, 8):
        specaccept.set_num_threads(n)
        same(specaccept.verify(**case), expected)


def test_errors_name_the_first_bad_row_on_any_thread_count(restore_threads):
    case = large_batch(seed=4)
    case["num_draft_tokens"][:] = 4
    case["greedy"][:] = False
    case["target_probs"][20, 0, :] = np.nan  # a late row: read on another worker
    case["target_probs"][5, 0, :] = -1.0  # the first bad row
    messages = set()
    for n in (1, 2, 4):
        specaccept.set_num_threads(n)
        with pytest.raises(ValueError, match=r"target_probs\[5, 0, \d+\] = -1\.0") as info:
            specaccept.verify(**case)
        messages.add(str(info.value))
    assert len(messages) == 1


def test_set_num_threads_checks_its_argument(restore_threads):
    for bad, error in ((0, ValueError), (-2, ValueError), (1.5, TypeError), (True, TypeError)):
        with pytest.raises(error, match="n must"):
            specaccept.set_num_threads(bad)
    specaccept.set_num_threads(3)
    assert specaccept.get_num_threads() == 3


@pytest.mark.parametrize(
    ("value", "expected", "warns"), [("1", "1", False), ("5", "5", False), ("zero", None, True)]
)
def test_environment_variable_sets_the_thread_count(value, expected, warns):
    script = "import specaccept; print(specaccept.get_num_threads())"
    env = {**os.environ, "SPECACCEPT_NUM_THREADS": value, "PYTHONWARNINGS": "default"}
    run = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    if expected is not None:
        assert run.stdout.strip() == expected
    else:
        assert int(run.stdout) == len(os.sched_getaffinity(0))
    assert ("SPECACCEPT_NUM_THREADS='zero' is not a positive integer" in run.stderr) == warns


def test_python_threads_verify_concurrently_with_the_same_results(restore_threads):
    specaccept.set_num_threads(2)
    cases = [large_batch(seed=s, batch=12, vocab=40000) for s in range(6)]
    expected = [specaccept.verify(**c) for c in cases]
    failures: list[str] = []

    def worker(i: int) -> None:
        for _ in range(5):
            got = specaccept.verify(**cases[i])
            if not np.array_equal(got.output_token_ids, expected[i].output_token_ids):
                failures.append(f"case {i}")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(cases))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a verifying thread hung"
    assert failures == []


def test_the_gil_is_released_while_the_kernel_runs(restore_threads):
    # One long call (all drafts accepted greedily: every row is scanned K+1 times).
    specaccept.set_num_threads(1)
    rng = np.random.default_rng(0)
    p = rng.random((16, 6, 400_000), dtype=np.float32)
    ids = np.argmax(p[:, :5], axis=-1)
    start = time.perf_counter()
    specaccept.verify(ids, p, greedy=True)
    one_call = time.perf_counter() - start

    done = threading.Event()

    def polls_per_second(deadline: float) -> float:
        """How fast this thread runs Python until ``done`` or ``deadline``."""
        count, start = 0, time.perf_counter()
        while not done.is_set() and time.perf_counter() < deadline:
            count += 1
        return count / (time.perf_counter() - start)

    def verify_repeatedly() -> None:
        for _ in range(3):
            specaccept.verify(ids, p, greedy=True)
        done.set()

    # A short switch interval hands the GIL back between the worker's calls at
    # once: held through the kernel, this thread then runs ~3% of the time
    # (measured with the release removed); released, ~100%.
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-4)
    try:
        alone = polls_per_second(time.perf_counter() + 3 * one_call)
        worker = threading.Thread(target=verify_repeatedly)
        worker.start()
        during = polls_per_second(float("inf"))
        worker.join()
    finally:
        sys.setswitchinterval(interval)
    # Rates over whole windows, not the longest gap, so that a busy machine
    # descheduling this thread once does not fail it.
    assert during > alone / 4, (during, alone, one_call)


FORK_SCRIPT = """
import os, sys
import numpy as np, specaccept
sys.path.insert(0, {tests!r})
from test_threads import large_batch
case = large_batch(seed=5)
specaccept.set_num_threads(2)
parent = specaccept.verify(**case)  # the pool's workers now exist in the parent
pid = os.fork()
if pid == 0:
    child = specaccept.verify(**case)  # the child has no workers: a fresh pool
    same = np.array_equal(child.output_token_ids, parent.output_token_ids)
    os._exit(0 if same else 3)
_, status = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(status))
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX-only")
def test_a_forked_child_verifies_on_a_fresh_pool():
    script = FORK_SCRIPT.format(tests=os.path.dirname(__file__))
    run = subprocess.run(
        [sys.executable, "-W", "ignore::DeprecationWarning", "-c", script],
        capture_output=True,
        text=True,
        timeout=120,  # a child waiting on the parent's workers would hang here
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "0", "the child's result differs from the parent's"


def test_eight_serving_threads_for_seconds_match_the_single_threaded_results(restore_threads):
    # A serving pattern: 8 Python threads, each verifying its own stream of batches
    # (small ones on the calling thread, large ones on the pool) for a few seconds.
    cases = [
        any_batch(seed=100 + i, batch=(1, 4, 24)[i % 3], vocab=(32000, 20000, 20000)[i % 3])
        for i in range(8)
    ]
    specaccept.set_num_threads(1)
    expected = [specaccept.verify(**c) for c in cases]
    specaccept.set_num_threads(2)
    deadline = time.monotonic() + 3.0
    calls = [0] * len(cases)
    failures: list[str] = []

    def serve(i: int) -> None:
        while time.monotonic() < deadline:
            got = specaccept.verify(**cases[i])
            calls[i] += 1
            if not (
                np.array_equal(got.output_token_ids, expected[i].output_token_ids)
                and np.array_equal(got.num_accepted, expected[i].num_accepted)
            ):
                failures.append(f"thread {i}, call {calls[i]}")

    threads = [threading.Thread(target=serve, args=(i,)) for i in range(len(cases))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a serving thread hung"
    assert failures == []
    assert min(calls) >= 3, calls


@pytest.mark.parametrize("stop", [0, 2, 5])
def test_one_request_on_several_threads_is_the_one_thread_result(stop, restore_threads):
    """B = 1 with filters runs its positions on the workers (rows of 128k logits): the
    tokens, the count and the errors are those of one thread, and a bad row past the
    first rejection is never reported (it is not read on one thread)."""
    rng = np.random.default_rng(stop)
    k, vocab = 5, 131_072
    target = (rng.standard_normal((1, k + 1, vocab)) * 3).astype(np.float32)
    draft = (target[:, :k] + rng.standard_normal((1, k, vocab))).astype(np.float32)
    best = np.argmax(target[:, :k], axis=-1)
    worst = np.argmin(target[:, :k], axis=-1)
    ids = np.where(np.arange(k) < stop, best, worst)
    for t in range(k):
        draft[0, t, ids[0, t]] += -50.0 if t < stop else 50.0
    u = np.where(np.arange(k) < stop, 0.0, np.nextafter(1.0, 0.0))[None, :]
    bad = target.copy()
    if stop < k:
        bad[0, stop + 1 :, 7] = np.nan  # rows past the rejection: never read
    calls = {
        "clean": dict(target_logits=target),
        "bad past the stop": dict(target_logits=bad),
    }
    results = {}
    for n in (1, 2, 4):
        specaccept.set_num_threads(n)
        for name, rows in calls.items():
            for ru in (0.1, 0.6, 0.95):
                r = specaccept.verify_logits(
                    ids,
                    draft_logits=draft,
                    **rows,
                    temperature=0.8,
                    top_k=50,
                    top_p=0.9,
                    uniforms=u,
                    recovery_uniforms=np.array([ru]),
                )
                assert int(r.num_accepted[0]) == stop
                results.setdefault((name, ru), []).append(r.output_token_ids.tolist())
    for key, outs in results.items():
        assert outs[0] == outs[1] == outs[2], key
    # A bad row before the stop is the error on every thread count.
    early = target.copy()
    early[0, max(stop - 1, 0), 3] = np.nan
    for n in (1, 2, 4):
        specaccept.set_num_threads(n)
        with pytest.raises(ValueError, match=rf"target_logits\[0, {max(stop - 1, 0)}, 3\]"):
            specaccept.verify_logits(
                ids,
                early,
                draft,
                temperature=0.8,
                top_k=50,
                top_p=0.9,
                uniforms=u,
                recovery_uniforms=np.array([0.5]),
            )
