"""What ``python -m specaccept compare --plot`` draws (issue 44): the law of the
accepted length per method with its exact expectation, the acceptance of each
draft position, and speed against fidelity, on recorded steps at one ``K``; the
accepted length against ``K`` on a sweep. The numbers come from
``MethodComparison.lengths``, checked here where they are known in closed form.

The figure tests need matplotlib (the ``plot`` extra) and skip without it.
"""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest
from specaccept import lab
from specaccept._cli import compare as compare_cli
from specaccept._cli import main
from specaccept.lossy import Synthetic


def _toy_model():
    """The block paper's toy model (as in test_compare.py): V = 2, p = (1/3, 2/3),
    q = (2/3, 1/3), k = 2, each block logged as often as q draws it."""
    ids = np.array([[0, 0]] * 4 + [[0, 1]] * 2 + [[1, 0]] * 2 + [[1, 1]])
    p = np.tile([1 / 3, 2 / 3], (9, 3, 1))
    q = np.tile([2 / 3, 1 / 3], (9, 2, 1))
    return ids, p, q


def test_the_accepted_length_law_of_each_method() -> None:
    # Token: the first draft is accepted with a_0 (1/2 for x = 0, 1 for x = 1),
    # averaged over the logged blocks: 6/9 * 1/2 + 3/9 = 2/3; both with a_0 a_1: 4/9.
    ids, p, q = _toy_model()
    samples = 400
    c = lab.compare_methods(
        ids, p, q, methods=["token", "block", "typical", Synthetic(rate=0.5)], samples=samples
    )
    token = c.lengths["token"]
    np.testing.assert_allclose(token.exact_per_position, [2 / 3, 4 / 9], rtol=1e-12)
    assert token.drafted.tolist() == [9, 9]
    # Typical accepts both tokens everywhere (p >= 1/3 > epsilon); synthetic a^i.
    np.testing.assert_array_equal(
        c.lengths["typical(epsilon=0.09, delta=0.3)"].histogram, [0, 0, 9 * samples]
    )
    np.testing.assert_allclose(
        c.lengths["typical(epsilon=0.09, delta=0.3)"].exact_per_position, [1, 1]
    )
    np.testing.assert_allclose(c.lengths["synthetic(rate=0.5)"].exact_per_position, [0.5, 0.25])
    # Block's decision at a position depends on the later drafts: no closed form kept.
    assert c.lengths["block"].exact_per_position is None
    for r in c.results:
        law = c.lengths[r.method]
        # The bars are the runs' own counts: their mean is the reported mean.
        assert law.histogram.sum() == 9 * samples
        assert law.histogram @ np.arange(3) / (9 * samples) == pytest.approx(r.mean_accepted)
        # With every step drafting K, P(n >= i) summed over i is E[n].
        assert law.observed_per_position.sum() == pytest.approx(r.mean_accepted)
        if law.exact_per_position is not None:
            assert law.exact_per_position.sum() == pytest.approx(r.expected_accepted)
            np.testing.assert_allclose(law.observed_per_position, law.exact_per_position, atol=0.05)


def test_positions_count_only_the_steps_that_drafted_them() -> None:
    # Ragged steps (as generate's recordings near max_new_tokens): the share at
    # position i is over the steps with k_s >= i, not over all steps.
    rng = np.random.default_rng(5)
    p = rng.dirichlet(np.full(12, 0.5), size=(30, 4))
    ids = p[:, :3].argmax(-1)  # deterministic drafts: a_t = p_t(x_t)
    counts = np.array([3] * 10 + [2] * 10 + [1] * 5 + [0] * 5)
    c = lab.compare_methods(ids, p, None, num_draft_tokens=counts, methods=["token"], samples=20)
    law = c.lengths["token"]
    assert law.drafted.tolist() == [25, 20, 10]
    a = np.take_along_axis(p[:, :3], ids[:, :, None], axis=2)[:, :, 0]
    reach = np.cumprod(a, axis=1)  # P(n >= i) for a step drafting i
    expected = [reach[counts >= i, i - 1].mean() for i in (1, 2, 3)]
    np.testing.assert_allclose(law.exact_per_position, expected, rtol=1e-12)
    assert law.histogram.sum() == 30 * 20
    assert law.histogram[1:].sum() <= 25 * 20  # steps without drafts accept none


def _png_size(data: bytes) -> tuple[int, int]:
    """Width and height of a PNG, its signature and IHDR chunk checked."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", data[:8]
    length, kind = struct.unpack(">I4s", data[8:16])
    assert (length, kind) == (13, b"IHDR")
    header = data[16:29]
    (crc,) = struct.unpack(">I", data[29:33])
    assert zlib.crc32(kind + header) == crc
    width, height, depth, colour = struct.unpack(">IIBB", header[:10])
    assert depth == 8 and colour in (2, 6)  # 8-bit RGB or RGBA
    return width, height


def _suptitle(fig) -> str:
    getter = getattr(fig, "get_suptitle", None)  # matplotlib >= 3.8
    return getter() if getter is not None else fig._suptitle.get_text()


def _legends(fig) -> list[list[str]]:
    return [[t.get_text() for t in axis.get_legend().get_texts()] for axis in fig.axes]


def _run_plot(monkeypatch, *argv: str):
    """Runs ``python -m specaccept compare ... --plot`` in this process and returns
    the figure it drew."""
    figures = []
    draw = compare_cli.draw

    def keep(*args, **kwargs):
        figures.append(draw(*args, **kwargs))
        return figures[-1]

    monkeypatch.setattr(compare_cli, "draw", keep)
    assert main(["compare", *argv]) == 0
    assert len(figures) == 1
    return figures[0]


def test_the_figure_of_recorded_steps(tmp_path, monkeypatch, capsys) -> None:
    pytest.importorskip("matplotlib")
    ids, p, q = _toy_model()
    steps = tmp_path / "toy-steps.npz"
    np.savez(steps, draft_token_ids=ids, target_probs=p, draft_probs=q)
    target = tmp_path / "compare.png"
    argv = ("--from", str(steps), "--samples", "40", "--synthetic", "0.5", "--plot", str(target))
    fig = _run_plot(monkeypatch, *argv)
    width, height = _png_size(target.read_bytes())
    assert 1000 <= width <= 2000 and 300 <= height <= 800, (width, height)
    labels = ["token", "block", "typical(epsilon=0.09, delta=0.3)", "synthetic(rate=0.5)"]
    named = ["token", "block", f"{labels[2]}, lossy", f"{labels[3]}, lossy"]
    lengths, positions, speed = _legends(fig)
    # Each panel's legend names every method, in order (lossy ones marked), with
    # the exact expectation, and how the per-position values were obtained.
    assert lengths == [
        f"{name}: E[n] = {e:.3f}"
        for name, e in zip(named, (10 / 9, 11 / 9, 2.0, 0.75), strict=True)
    ]
    assert positions == [
        f"{name}: {how}"
        for name, how in zip(named, ("exact", "observed", "exact", "exact"), strict=True)
    ]
    assert speed == named
    # The dashed marks sit at the exact expectations; the token line at 2/3, 4/9.
    marks = [line.get_xdata()[0] for line in fig.axes[0].lines]
    np.testing.assert_allclose(marks, [10 / 9, 11 / 9, 2.0, 0.75])
    np.testing.assert_allclose(fig.axes[1].lines[0].get_ydata(), [2 / 3, 4 / 9])
    title = _suptitle(fig)
    assert "toy-steps.npz" in title and "9 verified steps" in title and "K = 2" in title
    assert "40 runs per step" in title
    out = capsys.readouterr()
    assert "1.111" in out.out and "not installed" not in out.err


def test_the_figure_of_a_sweep(tmp_path, monkeypatch) -> None:
    pytest.importorskip("matplotlib")
    target = tmp_path / "sweep.png"
    argv = ("--steps", "6", "--samples", "3", "--k", "2,3", "--plot", str(target))
    fig = _run_plot(monkeypatch, *argv)
    width, height = _png_size(target.read_bytes())
    assert 800 <= width <= 2000 and 300 <= height <= 800, (width, height)
    named = ["token", "block", "typical(epsilon=0.09, delta=0.3), lossy"]
    assert _legends(fig) == [named, named]
    assert list(fig.axes[0].get_xticks()) == [2, 3]
    assert "6 steps per K" in _suptitle(fig)
