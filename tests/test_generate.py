"""``generate``: exact for greedy decoding, lossless for sampling, and exact about where it stops."""

from __future__ import annotations

import itertools
import subprocess
import sys

import numpy as np
import pytest
import specaccept
from scipy import stats


class Markov:
    """A random order-``n`` Markov model over a small vocabulary, vectorised."""

    def __init__(self, vocab: int, order: int, seed: int, concentration: float = 0.7):
        rng = np.random.default_rng(seed)
        self.vocab_size, self.order = vocab, order
        self.table = rng.dirichlet(np.full(vocab, concentration), size=(vocab,) * (order - 1))
        self.calls = 0

    def distribution(self, prefix) -> np.ndarray:
        context = ([0] * self.order + list(prefix))[len(prefix) + 1 :]  # the last order - 1
        return self.table[tuple(context)]

    def next_token_probs(self, sequences, num_positions):
        self.calls += 1
        return np.array(
            [
                [
                    self.distribution(s[: len(s) - num_positions + 1 + j])
                    for j in range(num_positions)
                ]
                for s in sequences
            ]
        )


def plain_greedy(model, prompt, max_new_tokens, eos=None):
    seq, new = list(prompt), []
    while len(new) < max_new_tokens:
        token = int(np.argmax(model.next_token_probs([seq], 1)[0, 0]))
        seq.append(token)
        new.append(token)
        if token == eos:
            break
    return new


@pytest.mark.parametrize("k", [0, 1, 2, 3, 5, 8])
def test_greedy_equals_plain_greedy_decoding_for_every_k(k):
    target, draft = Markov(7, 3, seed=1), Markov(7, 2, seed=2)
    prompts = [[0, 1], [3, 3, 3, 2], [6, 0, 5]]
    out = specaccept.generate(target, draft, prompts, k=k, max_new_tokens=25, greedy=True)
    assert out.tokens == [plain_greedy(target, p, 25) for p in prompts]
    assert out.stats.num_steps == out.target_calls


def test_greedy_with_the_builtin_models_equals_plain_greedy():
    from specaccept.ngram import builtin_models

    target, draft, vocab = builtin_models()
    prompts = [vocab.encode("Anne Elliot was"), vocab.encode("It was a very")]
    for k in (1, 3, 6):
        out = specaccept.generate(target, draft, prompts, k=k, max_new_tokens=20, greedy=True)
        assert out.tokens == [plain_greedy(target, p, 20) for p in prompts]
        assert out.target_calls < out.num_tokens, "speculation saved target calls"


SHAPES = {
    "chain": dict(k=2),
    "chain, block": dict(k=2, method="block"),
    "tree [2, 1]": dict(tree=[2, 1]),
    "tree [3], traversal": dict(tree=[3], method="traversal"),
}


@pytest.mark.parametrize("shape", SHAPES)
def test_sampled_continuations_follow_the_target(shape):
    # 3-token continuations of one prompt: 64 outcomes, each with its exact probability
    # under the target. Chi-square goodness of fit; a correct loop fails with prob. 1e-6.
    # Stateless models give probabilities: verification reads them as they are.
    vocab, rows, length = 4, 20_000, 3
    target, draft = Markov(vocab, 3, seed=5), Markov(vocab, 2, seed=6, concentration=2.0)
    prompt = [1, 2]
    out = specaccept.generate(
        target, draft, [prompt] * rows, max_new_tokens=length, rng=7, **SHAPES[shape]
    )
    outcomes = np.array(out.tokens) @ (vocab ** np.arange(length)[::-1])
    observed = np.bincount(outcomes, minlength=vocab**length)
    expected = np.zeros(vocab**length)
    for code in range(vocab**length):
        tokens = [(code // vocab**i) % vocab for i in reversed(range(length))]
        seq, prob = list(prompt), 1.0
        for t in tokens:
            prob *= target.distribution(seq)[t]
            seq.append(t)
        expected[code] = prob * rows
    assert stats.chisquare(observed, expected).pvalue > 1e-6
    assert out.stats.num_accepted_tokens > 0 and out.stats.acceptance_rate < 1


def test_eos_and_max_new_tokens_are_exact():
    vocab, eos = 6, 0
    target, draft = Markov(vocab, 2, seed=3), Markov(vocab, 2, seed=4)
    prompts = [[1 + b % 5] for b in range(300)]
    out = specaccept.generate(
        target, draft, prompts, k=4, max_new_tokens=9, eos_token_id=eos, rng=0
    )
    ended = 0
    for tokens in out.tokens:
        assert 1 <= len(tokens) <= 9
        if eos in tokens:
            assert tokens.index(eos) == len(tokens) - 1, "nothing after end-of-sequence"
            ended += 1
        else:
            assert len(tokens) == 9, "a row without end-of-sequence runs to max_new_tokens"
    assert 0 < ended < len(prompts)
    # No draft is ever scored past max_new_tokens: every step's k_b + 1 fits.
    assert out.stats.num_emitted_tokens >= out.num_tokens


def test_eos_token_id_may_name_several_tokens():
    vocab = 6
    target, draft = Markov(vocab, 2, seed=3), Markov(vocab, 2, seed=4)
    prompts = [[1 + b % 5] for b in range(200)]
    out = specaccept.generate(
        target, draft, prompts, k=3, max_new_tokens=9, eos_token_id=[0, 5], rng=0
    )
    reasons = {"eos": 0, "max_new_tokens": 0}
    for tokens, reason in zip(out.tokens, out.stop_reasons, strict=True):
        stops = [i for i, t in enumerate(tokens) if t in (0, 5)]
        if reason == "eos":
            assert stops == [len(tokens) - 1], "ends right after either token, nothing after"
        else:
            assert reason == "max_new_tokens" and not stops and len(tokens) == 9
        reasons[reason] += 1
    assert reasons["eos"] > 0 and reasons["max_new_tokens"] > 0
    assert {t[-1] for t, r in zip(out.tokens, out.stop_reasons, strict=True) if r == "eos"} == {
        0,
        5,
    }


def test_on_tokens_streams_every_request_s_tokens_as_they_are_accepted():
    """Joined, the streamed tokens are the returned ones, for every row, those that
    end early on EOS included; each request's last call says it finished, and only
    that one; calls come after each step (several tokens per call happen)."""
    vocab, eos = 6, 0
    target, draft = Markov(vocab, 2, seed=3), Markov(vocab, 2, seed=3)  # drafts accepted
    prompts = [[1 + b % 5] for b in range(40)] + [[]]  # the last: an empty prompt
    calls: list[tuple[int, list[int], bool]] = []
    steps: list[int] = []
    out = specaccept.generate(
        target,
        draft,
        prompts,
        k=4,
        max_new_tokens=9,
        eos_token_id=eos,
        rng=0,
        errors="isolate",
        progress=lambda done, total: steps.append(len(calls)),
        on_tokens=lambda b, tokens, finished: calls.append((b, tokens, finished)),
    )
    streamed: dict[int, list[int]] = {}
    finished: dict[int, int] = {}
    for i, (b, tokens, done) in enumerate(calls):
        assert b not in finished, "no call after a request's finished one"
        streamed.setdefault(b, []).extend(tokens)
        if done:
            finished[b] = i
        else:
            assert tokens, "a call that does not finish brings tokens"
    assert streamed == {b: t for b, t in enumerate(out.tokens)}
    assert set(finished) == set(range(len(prompts)))
    assert calls[0] == (len(prompts) - 1, [], True), "a request refused at the start"
    assert any(out.stop_reasons[b] == "eos" for b in range(40))
    assert any(len(tokens) > 1 for _, tokens, _ in calls)
    # Within a step, in request order; the steps' calls come before progress.
    bounds = [1, *steps]  # after the call at the start
    for a, b in itertools.pairwise(bounds):
        requests = [r for r, _, _ in calls[a:b]]
        assert requests == sorted(requests)


def test_prompts_of_different_lengths_and_progress():
    target, draft = Markov(5, 3, seed=8), Markov(5, 2, seed=9)
    seen = []
    out = specaccept.generate(
        target,
        draft,
        [[1], [1, 2, 3, 4, 0, 2], [4, 4]],
        k=3,
        max_new_tokens=5,
        rng=1,
        progress=lambda done, total: seen.append((done, total)),
    )
    assert [len(t) for t in out.tokens] == [5, 5, 5]
    assert seen[-1] == (15, 15)
    assert all(a[0] <= b[0] for a, b in itertools.pairwise(seen))


def test_bad_arguments():
    target, draft = Markov(5, 2, seed=0), Markov(4, 2, seed=0)
    with pytest.raises(ValueError, match="vocabularies differ"):
        specaccept.generate(target, draft, [[1]])
    with pytest.raises(ValueError, match=r"prompts\[1\] is empty"):
        specaccept.generate(target, target, [[1], []])
    with pytest.raises(ValueError, match="k must"):
        specaccept.generate(target, target, [[1]], k=-1)
    with pytest.raises(ValueError, match="max_new_tokens"):
        specaccept.generate(target, target, [[1]], max_new_tokens=-1)
    assert specaccept.generate(target, target, [[1]], max_new_tokens=0).tokens == [[]]


def test_a_drafter_that_proposes_on_its_own():
    class Proposer:
        vocab_size = 5

        def __init__(self):
            self.inner = Markov(5, 2, seed=11)

        def propose(self, sequences, k, rng, greedy):
            tokens = np.zeros((len(sequences), k), dtype=np.int64)
            probs = np.zeros((len(sequences), k, 5))
            for b, s in enumerate(sequences):
                s = list(s)
                for i in range(k):
                    probs[b, i] = self.inner.distribution(s)
                    tokens[b, i] = int(np.argmax(probs[b, i]))
                    s.append(int(tokens[b, i]))
            return tokens, probs

    target = Markov(5, 3, seed=12)
    assert isinstance(Proposer(), specaccept.Drafter)
    out = specaccept.generate(target, Proposer(), [[1, 2]], k=3, max_new_tokens=12, greedy=True)
    assert out.tokens == [plain_greedy(target, [1, 2], 12)]


def run_cli(*args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "specaccept", *args], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_cli_demo_prints_text_statistics_and_time():
    out = run_cli(
        "demo", "--prompt", "Captain Wentworth", "--max-new-tokens", "12", "--samples", "2"
    )
    assert 'Prompt: "Captain Wentworth"' in out
    assert (
        "== greedy decoding" in out and "== sampled decoding (2 continuations in one batch)" in out
    )
    assert out.count("  [") >= 3, "the continuations are shown"
    for promised in (
        "acceptance per draft position",
        "mean accepted length",
        "saved vs plain",
        " ms",
    ):
        assert promised in out


def test_the_demo_prints_the_greedy_text_as_it_is_accepted(monkeypatch, capsys):
    """The greedy continuation is printed while it is generated, step by step, and
    what was printed is the decoded greedy text."""
    from specaccept._cli import demo, main
    from specaccept.ngram import builtin_models

    during: list[str] = []
    real = demo.generate

    def spy(*args, on_tokens=None, **kwargs):
        if on_tokens is None:
            return real(*args, **kwargs)

        def watched(request, tokens, finished):
            on_tokens(request, tokens, finished)
            during.append(capsys.readouterr().out)  # printed before the run returns

        return real(*args, on_tokens=watched, **kwargs)

    monkeypatch.setattr(demo, "generate", spy)
    assert main(["demo", "--max-new-tokens", "30", "--samples", "1"]) == 0
    assert sum(1 for text in during if text.strip()) >= 5, "printed in many pieces"
    target, draft, vocab = builtin_models()
    greedy = specaccept.generate(
        target,
        draft,
        [vocab.encode("Anne Elliot was")],
        k=4,
        max_new_tokens=30,
        eos_token_id=vocab.paragraph_id,
        greedy=True,
    )
    before, streamed = "".join(during).split("== greedy decoding", 1)[1].split("  [1] ...", 1)
    assert "streamed as it is accepted" in before
    assert streamed.rstrip("\n") == vocab.decode(greedy.tokens[0]).strip()


def test_cli_check_prints_both_distributions_and_a_p_value():
    out = run_cli("check", "--samples", "1500", "--seed", "3")
    assert "target p" in out and "plain" in out and "speculative" in out
    assert out.count("p-value") == 2
    assert "follows the target's distribution" in out


def test_cli_demo_records_steps_the_laboratory_reads(tmp_path):
    path = tmp_path / "steps.npz"
    out = run_cli("demo", "--max-new-tokens", "12", "--samples", "4", "--record", str(path))
    assert "== sampled decoding (4 continuations in one batch)" in out
    compared = run_cli("compare", "--from", str(path), "--samples", "5")
    assert "| token | lossless |" in compared and "| block | lossless |" in compared


@pytest.mark.parametrize("command", ["demo", "check", "compare", "example"])
def test_cli_help_on_each_subcommand(command):
    assert "usage: python -m specaccept" in run_cli(command, "--help")


def test_a_probability_drafter_s_tree_laws_are_each_row_s_own():
    """A draft model scoring probabilities: a row that is greedy, or at
    temperature 1 without filters, draws its tree's children from its
    probabilities as they are (a greedy row ranks by them), whatever the other
    rows of the batch ask; a filtered row is transformed. (Deciding for the whole
    batch turned the greedy row's law one-hot and cut children it should keep.)"""
    from specaccept.generation._drafters import ModelDrafter
    from specaccept.generation._sampling import Sampling

    drafter = ModelDrafter.__new__(ModelDrafter)
    drafter.scores, drafter.vocab_size = "probs", 4
    scores = np.array([[0.1, 0.3, 0.2, 0.4], [0.3, 0.3, 0.15, 0.25], [0.4, 0.3, 0.2, 0.1]])
    sampling = Sampling(np.array([0.0, 1.0, 0.5]), np.array([2, 0, 2]), np.ones(3), np.zeros(3))
    law, rank, bad = drafter._laws(scores, sampling, np.array([4, 5, 6]))
    assert not bad
    np.testing.assert_array_equal(law[:2], scores[:2])
    np.testing.assert_array_equal(rank[:2], scores[:2])
    want = np.array([0.4, 0.3, 0.0, 0.0]) ** 2
    np.testing.assert_allclose(law[2], want / want.sum())
