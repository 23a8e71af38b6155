"""The verifier laboratory (issue 18): ``compare_methods`` and ``python -m
specaccept compare``, checked where the answers are known in closed form.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import specaccept as sa
from scipy import stats
from specaccept import lab, reference
from specaccept.lossy import Synthetic, Typical

# Intervals checked at this level so that a correct implementation fails one
# run in a million (the seeds are fixed, so a pass is reproducible).
STRICT = 1 - 1e-6


def _toy_model():
    """The block paper's toy model: V = 2, p = (1/3, 2/3), q = (2/3, 1/3), k = 2,
    each block logged as often as q draws it (4 : 2 : 2 : 1)."""
    ids = np.array([[0, 0]] * 4 + [[0, 1]] * 2 + [[1, 0]] * 2 + [[1, 1]])
    p = np.tile([1 / 3, 2 / 3], (9, 3, 1))
    q = np.tile([2 / 3, 1 / 3], (9, 2, 1))
    return ids, p, q


def test_the_toy_model_of_the_block_paper() -> None:
    ids, p, q = _toy_model()
    c = lab.compare_methods(ids, p, q, methods=["token", "block"], samples=400, confidence=STRICT)
    assert c["token"].expected_accepted == pytest.approx(10 / 9, abs=1e-12)
    assert c["block"].expected_accepted == pytest.approx(11 / 9, abs=1e-12)
    for name in ("token", "block"):
        r = c[name]
        low, high = r.accepted_interval
        assert low <= r.expected_accepted <= high, r
        assert r.tokens_per_call == pytest.approx(r.mean_accepted + 1)
        assert r.lossless and r.tv_distance == 0 and r.tv_interval == (0.0, 0.0)
    # The same uniforms for both methods: block never accepts fewer in expectation.
    assert c["block"].mean_accepted > c["token"].mean_accepted


def test_the_lossy_methods_on_the_toy_model() -> None:
    ids, p, q = _toy_model()
    c = lab.compare_methods(
        ids,
        p,
        q,
        methods=["typical", Synthetic(rate=0.5)],
        samples=400,
        confidence=STRICT,
    )
    typical = c["typical"]
    assert not typical.lossless
    # Both tokens clear the threshold (p >= 1/3 > 0.09): everything is accepted, and
    # the first token follows q: TV(q, p) = 1/3.
    assert typical.expected_accepted == typical.mean_accepted == 2.0
    assert typical.tv_distance == pytest.approx(1 / 3)
    synthetic = c["synthetic(rate=0.5)"]
    assert synthetic.expected_accepted == pytest.approx(0.5 + 0.25)
    low, high = synthetic.accepted_interval
    assert low <= synthetic.expected_accepted <= high
    assert synthetic.tv_distance == pytest.approx(0.5 / 3)  # a * TV(q, p)
    table = c.table()
    assert table.count("**lossy**") == 2 and "lossless" not in table


def _first_token_law(method, p0, q0, rows: int) -> np.ndarray:
    """Monte Carlo: drafts x_0 ~ q_0, the method's first emitted token."""
    ids = np.random.default_rng(1).choice(p0.size, p=q0, size=(rows, 1))
    result = sa.verify(
        ids,
        np.broadcast_to(np.stack([p0, p0]), (rows, 2, p0.size)),
        np.broadcast_to(q0, (rows, 1, p0.size)),
        method=method,
        seeds=np.arange(rows),
        offsets=0,
    )
    return np.bincount(result.output_token_ids[:, 0], minlength=p0.size)


@pytest.mark.parametrize("method", [Typical(epsilon=0.2, delta=0.3), Synthetic(rate=0.4)])
def test_the_closed_form_tv_matches_simulation(method) -> None:
    # The law behind the reported TV, checked against 60,000 simulated steps
    # (chi-square, alpha = 1e-6): a wrong closed form would disagree.
    p0 = np.array([0.42, 0.3, 0.15, 0.08, 0.05])
    q0 = np.array([0.1, 0.2, 0.2, 0.3, 0.2])
    rows = 60_000
    observed = _first_token_law(method, p0, q0, rows)
    from specaccept.lab._compare import _next_token_tv, _typical_part, _typical_threshold

    if isinstance(method, Typical):
        kept = p0 > _typical_threshold(p0, method)
        law = np.where(kept, q0, 0) + (1 - q0[kept].sum()) * _typical_part(p0, method)
    else:
        law = 0.4 * q0 + 0.6 * p0
    mask = law > 0
    assert observed[~mask].sum() == 0
    assert stats.chisquare(observed[mask], law[mask] * rows).pvalue > 1e-6
    tv = _next_token_tv(method, np.array([[0]]), np.stack([p0, p0])[None], q0[None, None], [1])
    assert tv[0] == pytest.approx(0.5 * np.abs(law - p0).sum())
    assert tv[0] > 0.01


def test_deterministic_drafts_and_ragged_steps() -> None:
    rng = np.random.default_rng(3)
    p = rng.dirichlet(np.full(30, 0.3), size=(20, 5))
    ids = p[:, :4].argmax(-1)
    ids[::3, 1] = 0
    counts = rng.integers(0, 5, 20)
    c = lab.compare_methods(
        ids,
        p,
        None,
        num_draft_tokens=counts,
        samples=50,
        confidence=STRICT,
        methods=[
            "token",
            "block",
            "typical",
            Synthetic(rate=[0.9, 0.8, 0.7, 0.6]),
        ],
    )
    for r in c.results:
        assert r.accepted_interval[0] <= r.expected_accepted <= r.accepted_interval[1], r
        assert 0 <= r.mean_accepted <= 4
    # With one-hot drafts, block's accepted-length law is the token rule's.
    assert c["token"].expected_accepted == pytest.approx(c["block"].expected_accepted)
    # Typical's count is what the reference decides (no uniforms involved).
    ref = reference.verify(ids, p, None, num_draft_tokens=counts, method="typical", rng=0)
    assert c["typical"].expected_accepted == pytest.approx(ref.num_accepted.mean())
    rows = c.to_dicts()
    assert [r["lossless"] for r in rows] == [True, True, False, False]
    assert json.loads(c.to_json())["results"][0]["method"] == "token"
    assert c.to_csv().splitlines()[0].startswith("method,name,lossless")


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        (dict(methods="token"), TypeError),
        (dict(methods=[]), TypeError),
        (dict(methods=["medusa"]), ValueError),
        (dict(methods=["synthetic"]), ValueError),
        (dict(methods=[("typical", {"epsilon": 0.1})]), TypeError),
        (dict(methods=["token", "token"]), ValueError),
        (dict(methods=["typical", Typical()]), ValueError),
        (dict(methods=[Synthetic(rate=[0.5])]), ValueError),  # one rate for K = 2
        (dict(samples=1), ValueError),
        (dict(samples=2.5), TypeError),
        (dict(confidence=1.0), ValueError),
        (dict(seed=-1), ValueError),
    ],
)
def test_bad_arguments(kwargs, error) -> None:
    ids, p, q = _toy_model()
    with pytest.raises(error):
        lab.compare_methods(ids, p, q, **kwargs)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "specaccept", "compare", *args],
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_the_command_on_the_builtin_models(tmp_path) -> None:
    out = _cli(
        "--steps",
        "12",
        "--samples",
        "4",
        "--k",
        "2,3",
        "--json",
        str(tmp_path / "c.json"),
        "--csv",
        str(tmp_path / "c.csv"),
    )
    assert out.returncode == 0, out.stderr
    assert "lossy" in out.stdout and "traversal" in out.stdout
    data = json.loads((tmp_path / "c.json").read_text())
    assert {row["num_draft"] for row in data["chain"]} == {2, 3}
    assert (tmp_path / "c.csv").read_text().startswith("num_draft,")


def test_the_command_on_a_saved_file(tmp_path) -> None:
    ids, p, q = _toy_model()
    path = tmp_path / "steps.npz"
    np.savez(path, draft_token_ids=ids, target_probs=p, draft_probs=q)
    out = _cli("--from", str(path), "--samples", "20")
    assert out.returncode == 0, out.stderr
    assert "1.111" in out.stdout and "1.222" in out.stdout  # 10/9 and 11/9


@pytest.mark.parametrize(
    ("arrays", "message"),
    [
        (dict(target_probs=np.ones((2, 3, 4))), "draft_token_ids"),
        (dict(draft_token_ids=np.zeros((2, 2), np.int64)), "target_probs"),
        (
            dict(draft_token_ids=np.zeros((2, 2)), target_probs=np.ones((2, 3, 4))),
            "draft_token_ids",
        ),
        (
            dict(draft_token_ids=np.zeros((2, 2), np.int64), target_probs=np.ones((2, 2, 4))),
            "target_probs",
        ),
    ],
)
def test_the_command_refuses_a_malformed_file(tmp_path, arrays, message) -> None:
    path = tmp_path / "bad.npz"
    np.savez(path, **arrays)
    out = _cli("--from", str(path))
    assert out.returncode == 2
    assert message in out.stderr and "Traceback" not in out.stderr


def test_the_command_refuses_a_file_that_is_not_npz(tmp_path) -> None:
    path = tmp_path / "bad.npz"
    path.write_text("not a zip")
    out = _cli("--from", str(path))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    missing = _cli("--from", str(tmp_path / "missing.npz"))
    assert missing.returncode == 2 and "Traceback" not in missing.stderr


def test_the_plot_option(tmp_path) -> None:
    # With matplotlib the two plots are written; without it the command says so
    # and still prints its tables (exit status 0 either way).
    target = tmp_path / "compare.png"
    out = _cli("--steps", "6", "--samples", "2", "--k", "2", "--plot", str(target))
    assert out.returncode == 0, out.stderr
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "matplotlib is not installed" in out.stderr and not target.exists()
    else:
        assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
