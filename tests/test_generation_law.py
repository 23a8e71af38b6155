"""The law of generated tokens is the target's, by exact enumeration (issue 25).

The target and the draft are small random Llamas whose every next-token
distribution is made of halves (:class:`tiny_llama.Halves`: each token 0, 1/2 or
1, exact in floating point). Every threshold a verifier compares a uniform with
is then one of a few fractions: 1/2 for the token rule, for trees of one level
(token and traversal) and for drawing drafts; 1/4, 1/3, 1/2 for block
verification's ``h`` and ``rho`` (``rho`` in {1/2, 1}). So each uniform can be
replaced by the midpoint of each cell between those fractions, with the cell's
length as its weight, and every combination run: one row per combination, all
rows in one batched ``generate`` call (rows at different lengths, accepting
different numbers of drafts, on one cache). The weighted law of the first
generated tokens must equal the target's, exactly, in rational arithmetic.

The enumeration covers the first two steps (the second token comes from the
second step when the first emitted one token), so a cache entry left over from a
rejected draft, or a position id that counts it, changes the law; the tests at
the end show that it does.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import specaccept  # noqa: E402
from enumeration import (  # noqa: E402
    BLOCK,
    HALVES,
    Scripted,
    cells,
    chain_coordinates,
    scripted_rows,
    sequence_law,
    weighted_law,
)
from specaccept.generation.hf import HFModel, HFSession  # noqa: E402
from tiny_llama import halves, law  # noqa: E402


@pytest.fixture(scope="module")
def models():
    return halves(10, vocab=4), halves(11, vocab=4, layers=1)


def enumerate_law(monkeypatch, target, draft, prompts, options, coordinates, length=2):
    """The exact law of the first ``length`` tokens per prompt: every combination of
    the ``coordinates`` (step, role, index, cells) as one row of a batch."""
    rows = scripted_rows(monkeypatch, prompts, coordinates)
    out = specaccept.generate(
        HFModel(target),
        HFModel(draft),
        [prompts[p] for p, _ in rows],
        max_new_tokens=3,
        **options,
    )
    return weighted_law(rows, out.tokens, len(prompts), length), out


def target_law(target, prompt: list[int], length: int) -> dict[tuple[int, ...], Fraction]:
    """The target's exact law of the next ``length`` tokens after ``prompt``."""
    return sequence_law(lambda prefix: law(target, prefix), prompt, length)


def tree_coordinates(nodes=2):
    coords = []
    for step in (0, 1):
        coords += [(step, "draft", n, cells(HALVES)) for n in range(1, nodes + 1)]
        coords += [(step, "accept", n, cells(HALVES)) for n in range(1, nodes + 1)]
        coords.append((step, "recovery", 0, cells(HALVES)))
    return coords


PROMPTS = [[1, 2, 3], [3, 0, 2, 1, 1, 0, 2]]


def lookup_coordinates(k=2):
    """Seeded deterministic drafts: each step's uniform at every position."""
    coords = []
    for step in (0, 1):
        coords.append((step, "recovery", 0, cells(HALVES)))
        coords += [(step, "position", t, cells(HALVES)) for t in range(1, k + 1)]
    return coords


CASES = {
    "chain, token": (dict(k=2, method="token"), lambda: chain_coordinates(HALVES)),
    # k chosen per row from the row's own first step (transformers' heuristic: a
    # row that accepted both drafts keeps 2, one that rejected drafts 1), and per
    # batch from measured time (AdaptiveK): docs/spec.md section 13.
    "chain, token, HeuristicK": (
        dict(k=specaccept.HeuristicK(start=2, max_k=2), method="token"),
        lambda: chain_coordinates(HALVES),
    ),
    "chain, block, AdaptiveK": (
        dict(k=specaccept.AdaptiveK(max_k=2, start=2), method="block"),
        lambda: chain_coordinates(BLOCK),
    ),
    "chain, block": (dict(k=2, method="block"), lambda: chain_coordinates(BLOCK)),
    "tree [2], token": (dict(tree=[2], method="token"), tree_coordinates),
    "tree [2], traversal": (dict(tree=[2], method="traversal"), tree_coordinates),
}


def check_law(monkeypatch, models, case) -> tuple[bool, object]:
    target, draft = models
    options, coordinates = CASES[case]
    laws, out = enumerate_law(monkeypatch, target, draft, PROMPTS, options, coordinates())
    exact = all(laws[p] == target_law(target, prompt, 2) for p, prompt in enumerate(PROMPTS))
    return exact, out


def test_seeded_lookup_drafts_follow_the_target_exactly(monkeypatch, models):
    """Seeded deterministic drafts (docs/spec.md section 12.4): each position's
    token is the target's sample with that position's uniform, a draft accepted
    while it equals it. Prompt lookup drafts 2 a step on prompts that repeat."""
    target, _ = models
    prompts = [[2, 1, 2, 1, 2], [3, 0, 2, 1, 1, 0, 2]]

    def law_and_run():
        rows = scripted_rows(monkeypatch, prompts, lookup_coordinates())
        out = specaccept.generate(
            HFModel(target),
            specaccept.PromptLookup(),
            [prompts[p] for p, _ in rows],
            k=2,
            max_new_tokens=3,
        )
        return weighted_law(rows, out.tokens, len(prompts), 2), out

    laws, out = law_and_run()
    assert all(laws[p] == target_law(target, prompt, 2) for p, prompt in enumerate(prompts))
    assert 0 < out.stats.num_accepted_tokens < out.stats.total_draft_tokens
    # Every position drawing the step's first uniform (an offset not advanced per
    # position) changes the law: the enumeration tells it apart.
    monkeypatch.setattr(
        Scripted,
        "position_uniforms",
        lambda self, keys, rows, positions: np.array(
            [self.value(keys[0][r], keys[1][r], "recovery", 0) for r in rows]
        ),
    )
    laws, _ = law_and_run()
    assert not all(laws[p] == target_law(target, prompt, 2) for p, prompt in enumerate(prompts))


@pytest.mark.parametrize("case", CASES)
def test_the_first_two_tokens_follow_the_target_exactly(monkeypatch, models, case):
    exact, out = check_law(monkeypatch, models, case)
    assert exact
    # The enumeration saw both acceptances and rejections, in both steps.
    assert 0 < out.stats.num_accepted_tokens < out.stats.total_draft_tokens


def test_the_law_of_three_tokens_over_three_steps_is_the_targets(monkeypatch, models):
    target, draft = models
    coords = chain_coordinates(HALVES, k=1)
    coords += [(2, "draft", 0, cells(HALVES)), (2, "accept", 0, cells(HALVES))]
    coords.append((2, "recovery", 0, cells(HALVES)))
    laws, _ = enumerate_law(monkeypatch, target, draft, PROMPTS[:1], dict(k=1), coords, length=3)
    assert laws[0] == target_law(target, PROMPTS[0], 3)


# --------------------------------------------------------------------------
# The enumeration tells a plausibly wrong loop apart
# --------------------------------------------------------------------------


def keep_rejected_entries(self, keep):
    """A wrong commit: every provisional column stays attended (stale entries of
    rejected drafts), though the row's length counts only the kept tokens."""
    with torch.inference_mode():
        for b in range(self.num_rows):
            self._valid[b, self._columns[b]] = True
    keep = self._ledger.check_keep(keep)
    self._ledger.commit(keep)
    self._columns = [[] for _ in keep]


def positions_from_columns(original):
    """A wrong position id: the row's cache columns (holes included) instead of its length."""

    def run(self, new, links, depths, wanted):
        committed = self._ledger.committed
        saved = list(committed)
        holes = (~self._valid).sum(axis=1).tolist() if self._valid.size else [0] * len(saved)
        self._ledger.committed = [c + int(h) for c, h in zip(saved, holes, strict=True)]
        try:
            return original(self, new, links, depths, wanted)
        finally:
            self._ledger.committed = saved

    return run


@pytest.mark.parametrize("case", ["chain, token", "tree [2], token"])
@pytest.mark.parametrize("mutation", ["stale entry", "position off"])
def test_a_wrong_cache_or_position_changes_the_law(monkeypatch, models, case, mutation):
    if mutation == "stale entry":
        monkeypatch.setattr(HFSession, "commit", keep_rejected_entries)
    else:
        monkeypatch.setattr(HFSession, "_run", positions_from_columns(HFSession._run))
    exact, _ = check_law(monkeypatch, models, case)
    assert not exact


# --------------------------------------------------------------------------
# Temperature, top-k and top-p: a chi-square test against the transformed law
# --------------------------------------------------------------------------

FILTERS = dict(temperature=0.7, top_k=5, top_p=0.9)


def transformed_law(model, prefix: list[int]) -> np.ndarray:
    """The target's next-token law after HF's temperature, top-k and top-p (float64)."""
    from specaccept.generation._sampling import Sampling, transform
    from tiny_llama import full_logits

    row = full_logits(model, prefix)[-1]
    sampling = Sampling(np.array([0.7]), np.array([5]), np.array([0.9]))
    return transform(row[None, None], sampling)[0][0, 0]


@pytest.fixture(scope="module")
def smooth_models():
    from tiny_llama import llama

    return llama(20, vocab=8), llama(21, vocab=8, layers=1)


def first_two_counts(target, draft, options, rows=12_000, seed=3):
    out = specaccept.generate(
        HFModel(target), HFModel(draft), [[1, 2, 3]] * rows, max_new_tokens=3, rng=seed,
        **FILTERS, **options,
    )  # fmt: skip
    counts = np.zeros((8, 8))
    for tokens in out.tokens:
        counts[tokens[0], tokens[1]] += 1
    return counts, out


def chi_square_p(counts, target) -> float:
    from scipy import stats

    first = transformed_law(target, [1, 2, 3])
    expected = np.zeros((8, 8))
    for a in np.flatnonzero(first):
        expected[a] = first[a] * transformed_law(target, [1, 2, 3, int(a)])
    expected *= counts.sum()
    assert counts[expected == 0].sum() == 0, "a token the filters remove was emitted"
    keep = expected > 0
    return float(stats.chisquare(counts[keep], expected[keep]).pvalue)


SAMPLED = {
    "chain, token (verify_logits)": dict(k=2),
    "chain, block": dict(k=2, method="block"),
    "tree [3], traversal (probabilities)": dict(tree=[3], method="traversal"),
}


@pytest.mark.parametrize("case", SAMPLED)
def test_sampling_with_filters_follows_the_transformed_target(smooth_models, case):
    # 12,000 rows in one batch; a correct loop fails with probability 1e-6.
    target, draft = smooth_models
    counts, out = first_two_counts(target, draft, SAMPLED[case])
    assert chi_square_p(counts, target) > 1e-6
    assert 0 < out.stats.num_accepted_tokens < out.stats.total_draft_tokens


def test_drafts_drawn_without_the_filters_are_caught(smooth_models, monkeypatch):
    # A plausibly wrong loop: drafts drawn from the draft's plain softmax while
    # verification uses the filtered law as q.
    from specaccept.generation import _drafters
    from specaccept.generation._sampling import Sampling

    original = _drafters.sample_logits

    def unfiltered(logits, sampling, uniforms, name):
        plain = Sampling(np.ones(len(sampling.temperature)), 0 * sampling.top_k, sampling.top_p**0)
        return original(logits, plain, uniforms, name)

    monkeypatch.setattr(_drafters, "sample_logits", unfiltered)
    target, draft = smooth_models
    counts, _ = first_two_counts(target, draft, dict(k=2))
    assert chi_square_p(counts, target) < 1e-6
