"""No leaks over a million calls (verify, verify_logits, verify_tree), and correct
results in forked and spawned processes."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
import textwrap

import pytest
import specaccept
from workers import verify_big_batch

LEAK_SCRIPT = textwrap.dedent(
    """
    import sys
    import numpy as np
    import specaccept

    successes, failures = int(sys.argv[1]), int(sys.argv[2])
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 50, size=(2, 3))
    p = rng.dirichlet(np.ones(50), size=(2, 4)).astype(np.float32)
    q = rng.dirichlet(np.ones(50), size=(2, 3)).astype(np.float32)
    bad = p.copy()
    bad[0, 0, ids[0, 0]] = np.nan  # read by every call: a ValueError each time
    # The same rows as logits (top-k on and off: both paths), and as a tree.
    logits_p, logits_q = np.log(p), np.log(q)
    bad_logits = logits_p.copy()
    bad_logits[0, 0, 7] = np.nan  # row 0's first target row is always read
    nodes = rng.integers(0, 50, size=(2, 4))
    parents = np.array([-1, 0, 0, 1])
    tree_q = rng.dirichlet(np.ones(50), size=(2, 4)).astype(np.float32)

    def rss_kb():
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith("VmRSS"))

    def run(n_ok, n_bad):
        g = np.random.default_rng(1)
        for i in range(n_ok):
            specaccept.verify(ids, p, q, rng=g)
            specaccept.verify_logits(ids, logits_p, logits_q, top_k=5 * (i % 2), rng=g)
            specaccept.verify_tree(nodes, parents, p, tree_q, rng=g)
        for _ in range(n_bad):
            for call in (
                lambda: specaccept.verify(ids, bad, q, rng=g),
                lambda: specaccept.verify_logits(ids, bad_logits, logits_q, rng=g),
            ):
                try:
                    call()
                except ValueError:
                    pass
                else:
                    raise AssertionError("the bad call succeeded")

    run(successes // 10, failures // 10)  # warm up: caches, allocator pools
    before = rss_kb()
    run(successes, failures)
    print(rss_kb() - before)
    """
)


def rss_growth_kb(successes: int, failures: int) -> int:
    run = subprocess.run(
        [sys.executable, "-c", LEAK_SCRIPT, str(successes), str(failures)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr
    return int(run.stdout.strip())


#: Resident memory is read from /proc/self/status: Linux only (macOS builds run the rest).
LINUX_RSS = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="resident memory from /proc/self/status"
)


@LINUX_RSS
def test_no_leak_short():
    growth = rss_growth_kb(100_000, 10_000)
    assert growth < 2048, f"resident memory grew by {growth} kB"


@pytest.mark.slow
@LINUX_RSS
def test_no_leak_over_a_million_calls():
    growth = rss_growth_kb(1_000_000, 100_000)
    assert growth < 4096, f"resident memory grew by {growth} kB"


@pytest.mark.parametrize("method", ["spawn", "fork", "forkserver"])
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # 3.12+: fork with threads running
def test_child_processes_verify_correctly(method):
    if method not in multiprocessing.get_all_start_methods():
        pytest.skip(f"{method} is not available on this platform")
    expected = [verify_big_batch(seed) for seed in range(4)]  # starts the pool here first
    assert specaccept.get_num_threads() >= 1
    with multiprocessing.get_context(method).Pool(2) as pool:
        got = pool.map_async(verify_big_batch, range(4)).get(timeout=300)
    assert got == expected
