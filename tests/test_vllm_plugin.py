"""specaccept inside vLLM's engine (the ``vllm`` CI stage; docs/serving.md "vLLM").

Each engine configuration runs in a process of its own (tests/vllm_engine.py):
vLLM loads its plugins once per process. SmolLM2-135M-Instruct in float32, n-gram
drafts with k = 4, as the issue's recipe runs it. The references are Hugging
Face's greedy decoding of the same checkpoint and, for sampling, the target's law
computed with transformers and docs/spec.md section 8.2's transform.
"""

from __future__ import annotations

import functools
import itertools
import json
import pathlib
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest

vllm = pytest.importorskip("vllm")

# vLLM's and torch's own imports warn (torch.jit, torch.distributed.reduce_op),
# which pyproject.toml's filterwarnings=error would fail; not this library's.
pytestmark = pytest.mark.filterwarnings(
    "ignore::DeprecationWarning", "ignore::FutureWarning", "ignore::UserWarning"
)

from scipy import stats  # noqa: E402
from specaccept import reference  # noqa: E402
from vllm_runs import (  # noqa: E402
    NGRAM,
    draft_folder,
    run_engine,
    same_until_eos,
    smollm2_folder,
    texts,
    with_draft_model,
    with_spec,
)

HERE = pathlib.Path(__file__).parent
GREEDY_PROMPTS = [
    "1, 2, 3, 4, 5, 6, 7, 8,",
    "Once upon a time there was a king. Once upon a time there was a",
    "The capital of France is Paris. The capital of France is",
    "Roses are red, violets are blue. Roses are red,",
]
GREEDY = {"temperature": 0.0, "max_tokens": 32}
#: The sampled position: after the prompt and its first token " king" (about 92%),
#: n-gram drafts "." and more (from "king. Once"), verified at temperature 0.8, top-k 20.
LAW_PROMPT = "Once upon a time there was a king. Once upon a time there was a"
LAW = {"temperature": 0.8, "top_k": 20, "max_tokens": 2}
#: Requests per law run: what power >= 0.99 at ALPHA against the wrong variants
#: of test_sampled_tokens_follow_the_target_law needs, with a margin (the
#: temperature ignored is the hardest to tell: 0.997 at 900; min-p's variants
#: are told apart at 300).
LAW_REQUESTS = {"law": 900, "min_p_law": 300, "seeded_law": 900}
#: The chi-square tests' false-failure rate.
ALPHA = 1e-3
SEEDED = {"temperature": 0.8, "top_k": 20, "max_tokens": 24, "seed": 1234}
#: A longer seeded request, and a crowd it is preempted in: CROWD's 8 requests of
#: about 110 tokens each (96 generated, `ignore_eos`, so that no text ends early and
#: frees the cache) in a KV cache of 12 blocks of 32 tokens (384 tokens), the seeded
#: one last (vLLM preempts the latest request first). The others are seeded too, so
#: that the crowd's run is the same on every machine.
SEEDED_LONG = {**SEEDED, "max_tokens": 96}
CROWD = [
    "Tell me a story about a dragon.",
    "List three colours:",
    "What is 2 + 2?",
    "Write a poem about the sea.",
    "Explain photosynthesis briefly.",
    "Name five animals:",
    "Describe a sunny day in the park.",
    LAW_PROMPT,
]
CROWD_SAMPLING = [
    {"temperature": 0.8, "max_tokens": 96, "ignore_eos": True, "seed": s} for s in range(7)
] + [SEEDED_LONG]
PREEMPTING = {"block_size": 32, "num_gpu_blocks_override": 12, "max_model_len": 256}
#: The same position with min-p on (vLLM refuses min_p with speculative decoding;
#: the plugin lifts that refusal and applies it before top-k, as vLLM's sampler).
MIN_P_LAW = {**LAW, "min_p": 0.15}
#: Greedy with a logit bias against the tokens the greedy texts start with.
BIASED_WORDS = [" 9", " king", " not", " violets"]


@pytest.fixture(scope="module")
def model() -> str:
    return smollm2_folder()


def biased(model) -> dict:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    bias = {str(tokenizer(w).input_ids[-1]): -100.0 for w in BIASED_WORDS}
    return {**GREEDY, "logit_bias": bias}


#: A prompt whose requests get NaN logits from their first verification step on
#: (tests/vllm_engine.py's ``poison``), in token_run's process: no other run has it.
POISONED = "Count with me: 1, 2, 3, 4, 5, 6,"


@pytest.fixture(scope="module")
def token_run(model, tmp_path_factory):
    """SPECACCEPT_VLLM=token, one process: greedy batch, a seeded request alone and
    in a batch, the sampled law's requests, and a poisoned request among greedy
    ones; recorded."""
    others = ["Tell me a story about a dragon.", "List three colours:", "What is 2 + 2?"]
    runs = [
        {"name": "greedy", "prompts": GREEDY_PROMPTS, "sampling": GREEDY},
        {"name": "seed_alone", "prompts": [LAW_PROMPT], "sampling": SEEDED},
        {
            "name": "seed_batch",
            "prompts": [*others[:2], LAW_PROMPT, others[2]],
            "sampling": [{**SEEDED, "seed": None}] * 2 + [SEEDED] + [{**SEEDED, "seed": None}],
        },
        {"name": "law", "prompts": [LAW_PROMPT] * LAW_REQUESTS["law"], "sampling": LAW},
        {
            "name": "min_p_law",
            "prompts": [LAW_PROMPT] * LAW_REQUESTS["min_p_law"],
            "sampling": MIN_P_LAW,
        },
        {
            "name": "seeded_law",
            "prompts": [LAW_PROMPT] * LAW_REQUESTS["seeded_law"],
            "sampling": [{**LAW, "seed": s} for s in range(LAW_REQUESTS["seeded_law"])],
        },
        {"name": "logit_bias", "prompts": GREEDY_PROMPTS, "sampling": biased(model)},
        {"name": "logprobs", "prompts": GREEDY_PROMPTS[:2], "sampling": {**GREEDY, "logprobs": 2}},
        {"name": "poisoned", "prompts": [*GREEDY_PROMPTS, POISONED], "sampling": GREEDY},
        {"name": "after_poisoned", "prompts": GREEDY_PROMPTS, "sampling": GREEDY},
    ]
    tmp = tmp_path_factory.mktemp("token")
    return run_engine(model, tmp, "token", runs, record=True, poison=POISONED, **with_spec())


@pytest.fixture(scope="module")
def off_run(model, tmp_path_factory):
    """Speculative decoding on and the plugin off, one process: the greedy batch,
    and a min-p request (which vLLM refuses)."""
    runs = [
        {"name": "greedy", "prompts": GREEDY_PROMPTS, "sampling": GREEDY},
        {"name": "min_p", "prompts": [LAW_PROMPT], "sampling": MIN_P_LAW, "expect_error": True},
    ]
    tmp = tmp_path_factory.mktemp("off")
    return run_engine(model, tmp, "off", runs, method=None, **with_spec())


@pytest.fixture(scope="module")
def hf_greedy(model):
    """Hugging Face's greedy decoding of GREEDY_PROMPTS (float32), token ids."""
    import torch
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    hf_model = _hf_model(model)
    out = []
    for prompt in GREEDY_PROMPTS:
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            generated = hf_model.generate(
                ids,
                do_sample=False,
                max_new_tokens=GREEDY["max_tokens"],
                eos_token_id=None,
                pad_token_id=tokenizer.eos_token_id,
            )
        out.append(generated[0, ids.shape[1] :].tolist())
    return out


def test_the_plugin_replaces_the_sampler_and_says_so(token_run):
    assert token_run["patched"]
    assert "vllm_plugin" in token_run["forward"]
    assert (
        "RejectionSampler.forward replaced by specaccept's token verification" in (token_run["log"])
    )


def test_greedy_token_equals_hugging_face(token_run, hf_greedy):
    for got, want in zip(texts(token_run, "greedy"), hf_greedy, strict=True):
        assert same_until_eos(got, want), (got, want)


def test_greedy_drafts_were_verified_and_accepted(token_run):
    rec = token_run["recording"]
    ids, p, counts = rec["draft_token_ids"], rec["target_probs"], rec["num_draft_tokens"]
    drafted = int(counts.sum())
    slots = np.arange(ids.shape[1]) < counts[:, None]
    accepted = (ids == p[:, : ids.shape[1]].argmax(axis=-1)) & slots
    assert drafted > 50
    assert accepted.sum() > drafted // 4


def test_logprobs_are_vllm_s_for_the_emitted_tokens(token_run, hf_greedy):
    """vLLM computes the logprobs of the emitted tokens (its raw log-softmax) after
    the plugin's verification: greedy tokens are each position's top one."""
    for r, want in zip(token_run["runs"]["logprobs"], hf_greedy, strict=False):
        assert same_until_eos(r["token_ids"], want)
        assert len(r["logprobs"]) == len(r["token_ids"])
        for token, position in zip(r["token_ids"], r["logprobs"], strict=True):
            logprob, rank = position[str(token)]
            assert rank == 1 and logprob <= 0.0
            assert logprob == max(value for value, _ in position.values())


def test_a_seeded_request_gives_the_same_text_alone_and_in_a_batch(token_run):
    alone = token_run["runs"]["seed_alone"][0]["token_ids"]
    batch = token_run["runs"]["seed_batch"][2]["token_ids"]
    assert len(alone) == SEEDED["max_tokens"]
    assert alone == batch


def test_a_seeded_request_s_text_depends_on_neither_k_the_batch_nor_preemption(
    model, tmp_path, token_run
):
    """SEEDED_LONG's text with k = 4 (token_run), with k chosen each step
    (SPECACCEPT_VLLM_K=auto) alone and in a crowd that vLLM preempts it in, and
    with the plugin on and no speculative decoding: one text. vLLM's own
    generator-based draws give another text once preempted (the issue's report).
    The choices weighed each request's remaining tokens exactly at the steps
    when vLLM's scheduler had no request waiting (preempted requests wait)."""
    runs = [
        {"name": "alone", "prompts": [LAW_PROMPT], "sampling": SEEDED_LONG},
        {"name": "crowd", "prompts": CROWD, "sampling": CROWD_SAMPLING},
    ]
    choices = tmp_path / "k.jsonl"
    auto = run_engine(
        model,
        tmp_path,
        "preempted",
        runs,
        env={"SPECACCEPT_VLLM_K": "auto", "SPECACCEPT_VLLM_K_RECORD": str(choices)},
        **with_spec(**PREEMPTING),
    )
    plain = run_engine(model, tmp_path, "no-drafts", runs[:1])
    alone = auto["runs"]["alone"][0]["token_ids"]
    assert len(alone) == SEEDED_LONG["max_tokens"]
    seeded = auto["runs"]["crowd"][-1]
    assert seeded["preempted"] >= 1, [r["preempted"] for r in auto["runs"]["crowd"]]
    assert seeded["token_ids"] == alone
    assert plain["runs"]["alone"][0]["token_ids"] == alone
    assert token_run["runs"]["seed_alone"][0]["token_ids"] == alone[: SEEDED["max_tokens"]]
    drafted = [k for step in auto["steps"] for k in step[0]]
    assert 0 < sum(drafted) and len(set(drafted)) > 1  # verified, with k varying
    assert not plain["steps"]  # no verification step without speculative decoding
    lines = [json.loads(line) for line in choices.read_text().splitlines()]
    assert all(isinstance(line["waiting"], int) for line in lines)  # the scheduler's hook ran
    fixed = [line for line in lines if line["waiting"] == 0]
    assert fixed and len(fixed) < len(lines)
    assert all((line["remaining"] is None) == (line["waiting"] > 0) for line in lines)
    most = max(sampling["max_tokens"] for sampling in CROWD_SAMPLING)
    assert all(1 <= m <= most for line in fixed for m in line["remaining"])


@functools.cache
def _hf_model(model):
    """Hugging Face's SmolLM2 in float32 (loaded once per process)."""
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)


def _target_law(model, prefix_ids, temperature, top_k, min_p=0.0):
    import torch

    hf_model = _hf_model(model)
    with torch.no_grad():
        logits = hf_model(torch.tensor([prefix_ids])).logits[0, -1].double().numpy()
    return np.asarray(reference.transform_logits(logits, temperature, top_k, 1.0, min_p=min_p))


def _chi_square(counts: dict[int, int], law: np.ndarray) -> tuple[float, int, float]:
    """The statistic, degrees of freedom and p-value of counts against ``law``:
    tokens expected at least 5 times are their own cells, the rest one cell."""
    n = sum(counts.values())
    expected = law * n
    cells = np.flatnonzero(expected >= 5)
    observed = [counts.get(int(t), 0) for t in cells]
    rest_observed = n - sum(observed)
    rest_expected = n - expected[cells].sum()
    obs = np.array([*observed, rest_observed], dtype=float)
    exp = np.array([*expected[cells], rest_expected])
    keep = exp > 0
    if (obs[~keep] > 0).any():
        return np.inf, int(keep.sum()) - 1, 0.0
    statistic = float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum())
    df = int(keep.sum()) - 1
    return statistic, df, float(stats.chi2.sf(statistic, df))


@pytest.mark.parametrize(
    "run, sampling", [("law", LAW), ("min_p_law", MIN_P_LAW), ("seeded_law", LAW)]
)
def test_sampled_tokens_follow_the_target_law(token_run, model, run, sampling):
    """The second token (the first emitted by the verification step, accepted draft
    or recovered) after the modal first token, against the target's law at T=0.8,
    top-k 20 (and min-p 0.15; and seeded requests, one seed each, drawn by the
    position-keyed rule of docs/spec.md section 9.3). False-failure rate ALPHA. The same sample size has
    power >= 0.99 at ALPHA against a plugin ignoring the temperature (the law at
    T=1), one accepting every draft (the draft token always) and one ignoring
    min-p."""
    from transformers import AutoTokenizer

    results = token_run["runs"][run]
    first = Counter(r["token_ids"][0] for r in results).most_common(1)[0][0]
    seconds = Counter(r["token_ids"][1] for r in results if r["token_ids"][0] == first)
    n = sum(seconds.values())
    assert n > LAW_REQUESTS[run] // 2
    prefix = [*AutoTokenizer.from_pretrained(model)(LAW_PROMPT).input_ids, first]
    min_p = sampling.get("min_p", 0.0)
    law = _target_law(model, prefix, sampling["temperature"], sampling["top_k"], min_p)
    statistic, df, p_value = _chi_square(seconds, law)
    assert p_value > ALPHA, (statistic, df, p_value, seconds.most_common(8))
    # Power against the wrong variants, at this n (noncentral chi-square).
    critical = stats.chi2.isf(ALPHA, df)
    cells = np.flatnonzero(law * n >= 5)
    wrongs = [
        ("temperature ignored", _target_law(model, prefix, 1.0, sampling["top_k"], min_p)),
        ("every draft accepted", np.eye(law.size)[prefix[prefix.index(first) + 1]]),
    ]
    if min_p:
        wrongs.append(("min_p ignored", _target_law(model, prefix, 0.8, sampling["top_k"])))
    for name, wrong in wrongs:
        grouped = np.append(wrong[cells], 1 - wrong[cells].sum())
        expected = np.append(law[cells], 1 - law[cells].sum())
        # Over the cells the law gives mass; a law with none left over (min-p)
        # rejects any draw outside its cells (_chi_square's p-value 0).
        positive = expected > 1e-12
        noncentrality = n * float(
            ((grouped[positive] - expected[positive]) ** 2 / expected[positive]).sum()
        )
        power = stats.ncx2.sf(critical, df, noncentrality)
        if not positive[-1]:
            power = max(power, 1 - (1 - max(grouped[-1], 0.0)) ** n)
        assert power >= 0.99, (name, power)


def test_processed_logprobs_are_those_of_the_law_each_token_was_drawn_from(model, tmp_path):
    """logprobs_mode="processed_logprobs" (vLLM's logprobs of the rows it samples
    from): with the plugin on, each emitted token's logprob is the log of its
    probability under the target's law at temperature 0.8, top-k 20 along the
    emitted text (transformers' logits, the reference's transform), at verified
    positions too. vLLM's own forward would run its broken CPU path here; raw
    logprobs (the law at T=1, no top-k) fail this test."""
    import torch
    from transformers import AutoTokenizer

    sampling = {"temperature": 0.8, "top_k": 20, "max_tokens": 12, "logprobs": 1}
    runs = [{"name": "processed", "prompts": GREEDY_PROMPTS, "sampling": sampling}]
    options = with_spec(logprobs_mode="processed_logprobs")
    out = run_engine(model, tmp_path, "processed", runs, **options)
    assert "vLLM's own rejection sampler" not in out["log"]
    assert sum(k for step in out["steps"] for k in step[0]) > 0  # drafts verified
    tokenizer = AutoTokenizer.from_pretrained(model)
    hf_model = _hf_model(model)
    checked = 0
    for prompt, result in zip(GREEDY_PROMPTS, out["runs"]["processed"], strict=True):
        ids = tokenizer(prompt).input_ids + result["token_ids"]
        with torch.no_grad():
            logits = hf_model(torch.tensor([ids])).logits[0].double().numpy()
        start = len(ids) - len(result["token_ids"]) - 1
        for t, (token, position) in enumerate(
            zip(result["token_ids"], result["logprobs"], strict=True)
        ):
            law = np.asarray(reference.transform_logits(logits[start + t], 0.8, 20, 1.0))
            assert law[token] > 0
            np.testing.assert_allclose(position[str(token)][0], np.log(law[token]), atol=2e-3)
            checked += 1
    assert checked >= 2 * sampling["max_tokens"]  # (a request may end early)


def test_the_recording_holds_the_processed_law_and_compare_reads_it(token_run, tmp_path):
    rec = token_run["recording"]
    p, counts = rec["target_probs"], rec["num_draft_tokens"]
    assert "draft_probs" not in rec  # n-gram drafts: deterministic
    rows = np.arange(p.shape[1]) <= counts[:, None]
    sums = p.sum(axis=-1)[rows]
    np.testing.assert_allclose(sums, 1.0, atol=1e-4)
    # The law rows (top-k 20) keep at most 20 tokens; greedy rows are one-hot.
    assert ((p[rows] > 0).sum(axis=-1) <= 20).all()
    path = tmp_path / "steps.npz"
    np.savez(path, **rec)
    done = subprocess.run(
        [sys.executable, "-m", "specaccept", "compare", "--from", str(path), "--samples", "20"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "block" in done.stdout and "token" in done.stdout


def test_block_verification_in_vllm_equals_hugging_face_greedy(model, tmp_path, hf_greedy):
    runs = [{"name": "greedy", "prompts": GREEDY_PROMPTS, "sampling": GREEDY}]
    out = run_engine(model, tmp_path, "block", runs, method="block", record=True, **with_spec())
    assert "replaced by specaccept's block verification" in out["log"]
    for got, want in zip(texts(out, "greedy"), hf_greedy, strict=True):
        assert same_until_eos(got, want), (got, want)
    assert int(out["recording"]["num_draft_tokens"].sum()) > 50


def test_a_drafter_s_probabilities_are_read(model, tmp_path):
    """vLLM's draft-model method with probabilistic drafting: SmolLM2 drafts for
    itself, so the drafter's rows equal the target's (q = p, recorded) and the
    token rule accepts every draft (q <= p). A plugin that read the drafts as
    one-hot (q(x) = 1) would reject at rate 1 - p(x): most steps here."""
    spec = {
        "method": "draft_model",
        "model": model,
        "num_speculative_tokens": 4,
        "draft_sample_method": "probabilistic",
    }
    # No top-k: vLLM's drafter applies the temperature only (docs/spec.md 9.1.1).
    sampling = {"temperature": 0.8, "max_tokens": 24, "seed": 1234}
    runs = [{"name": "sampled", "prompts": [LAW_PROMPT, GREEDY_PROMPTS[0]], "sampling": sampling}]
    out = run_engine(model, tmp_path, "draft", runs, record=True, llm={"speculative_config": spec})
    rec = out["recording"]
    counts = rec["num_draft_tokens"]
    rows = np.arange(rec["draft_probs"].shape[1]) < counts[:, None]
    np.testing.assert_allclose(
        rec["draft_probs"][rows], rec["target_probs"][:, :-1][rows], atol=2e-4
    )
    verified = [(k, e) for step in out["steps"] for k, e in zip(*step, strict=True) if k]
    assert len(verified) >= 5
    assert all(emitted == k + 1 for k, emitted in verified), verified


def test_k_chosen_each_step_keeps_greedy_and_trims_the_drafts(model, tmp_path, hf_greedy):
    """SPECACCEPT_VLLM_K=auto with num_speculative_tokens=4: greedy text equal to
    Hugging Face's, and the drafts vLLM verified are the ones AdaptiveK kept
    (fewer than the n-gram proposer offered, per request)."""
    choices = tmp_path / "k.jsonl"
    runs = [{"name": "greedy", "prompts": GREEDY_PROMPTS, "sampling": GREEDY}]
    env = {"SPECACCEPT_VLLM_K": "auto", "SPECACCEPT_VLLM_K_RECORD": str(choices)}
    out = run_engine(model, tmp_path, "auto", runs, env=env, **with_spec())
    assert "n-gram drafts chosen per step by AdaptiveK(max_k=4)" in out["log"]
    for got, want in zip(texts(out, "greedy"), hf_greedy, strict=True):
        assert same_until_eos(got, want), (got, want)
    lines = [json.loads(line) for line in choices.read_text().splitlines()]
    k = [x for line in lines for x in line["k"]]
    available = [x for line in lines for x in line["available"]]
    assert all(0 <= a <= b <= 4 for a, b in zip(k, available, strict=True))
    assert {line["reason"] for line in lines} >= {"start", "model"}
    assert sum(k) < sum(available)  # trimmed
    assert any(0 < a < b for a, b in zip(k, available, strict=True))  # per request
    # What vLLM verified is what was kept: at most the kept drafts, and short of
    # them only by the last choices of requests that finished (4 requests, <= 4 each).
    verified = sum(sum(step[0]) for step in out["steps"])
    assert sum(k) - 16 <= verified <= sum(k), (verified, sum(k))
    assert max(max(step[0]) for step in out["steps"]) <= 4


def test_k_chosen_before_a_draft_model_drafts(model, tmp_path, hf_greedy):
    """SPECACCEPT_VLLM_K=auto with a draft model (SmolLM2's first 8 of 30 layers,
    num_speculative_tokens=4): greedy text equal to Hugging Face's; at every step
    the draft model ran exactly the widest count chosen (not vLLM's 4: a draft not
    chosen is a forward not paid), and fewer than 4 once the cost was fitted
    (its drafts are rarely accepted); vLLM verified at most what was kept. Its
    requests were parked (no drafts, steps running), and the steps whose requests
    were all parked ran no drafter pass at all (counted in vLLM's proposer). The
    remaining tokens of each choice count those the step just emitted."""
    choices = tmp_path / "k.jsonl"
    runs = [{"name": "greedy", "prompts": GREEDY_PROMPTS, "sampling": GREEDY}]
    env = {"SPECACCEPT_VLLM_K": "auto", "SPECACCEPT_VLLM_K_RECORD": str(choices)}
    draft = with_draft_model(draft_folder(8))
    out = run_engine(model, tmp_path, "draft-auto", runs, env=env, **draft)
    assert "draft model's drafts chosen per step by AdaptiveK(max_k=4)" in out["log"]
    for got, want in zip(texts(out, "greedy"), hf_greedy, strict=True):
        assert same_until_eos(got, want), (got, want)
    lines = [json.loads(line) for line in choices.read_text().splitlines()]
    assert [line["proposed"] for line in lines] == [max(line["k"]) for line in lines]
    assert {line["reason"] for line in lines} >= {"start", "model"}
    assert any(max(line["k"]) < 4 for line in lines if line["reason"] == "model")
    kept = sum(sum(line["k"]) for line in lines)
    verified = sum(sum(step[0]) for step in out["steps"])
    assert kept - 16 <= verified <= kept, (verified, kept)
    skipped = [line["drafter_skipped"] for line in lines]
    assert any(skipped) and not skipped[0]
    assert all(line["parked"] == len(line["requests"]) for line in lines if line["drafter_skipped"])
    assert out["drafter_runs"] == skipped.count(False), (out["drafter_runs"], len(skipped))
    # Each choice counts the tokens of the step just verified, which vLLM's
    # request state holds only after the drafter ran: the first choice follows the
    # prompt's token, and a request that ran to max_tokens has 1 left at its last.
    left: dict[str, list[int]] = {}
    for line in lines:
        assert line["waiting"] == 0
        for request, m in zip(line["requests"], line["remaining"], strict=True):
            left.setdefault(request, []).append(m)
    assert len(left) == len(GREEDY_PROMPTS)
    for counts in left.values():
        assert counts[0] == GREEDY["max_tokens"] - 1, counts
        assert all(b < a or a == b == 1 for a, b in itertools.pairwise(counts)), counts
    full = sum(len(ids) == GREEDY["max_tokens"] for ids in texts(out, "greedy"))
    assert sum(counts[-1] == 1 for counts in left.values()) >= full > 0, left


def test_without_the_switch_vllm_is_its_own(off_run, hf_greedy):
    out = off_run
    assert not out["patched"]
    assert out["forward"] == "vllm.v1.sample.rejection_sampler.RejectionSampler.forward"
    assert "RejectionSampler.forward replaced" not in out["log"]
    for got, want in zip(texts(out, "greedy"), hf_greedy, strict=True):
        assert same_until_eos(got, want), (got, want)


def test_greedy_equals_vllm_without_speculative_decoding(model, tmp_path, token_run):
    """Also with a logit bias, which vLLM refuses with speculative decoding unless
    the plugin verifies: the same tokens as vLLM without speculation."""
    runs = [
        {"name": "greedy", "prompts": GREEDY_PROMPTS, "sampling": GREEDY},
        {"name": "logit_bias", "prompts": GREEDY_PROMPTS, "sampling": biased(model)},
    ]
    out = run_engine(model, tmp_path, "plain", runs, method=None)
    assert texts(out, "greedy") == texts(token_run, "greedy")
    assert texts(out, "logit_bias") == texts(token_run, "logit_bias")
    assert texts(out, "logit_bias") != texts(out, "greedy")  # the bias changed the text
    banned = {int(t) for t in biased(model)["logit_bias"]}
    assert not banned & {t for ids in texts(token_run, "logit_bias") for t in ids}


def test_without_the_plugin_vllm_refuses_min_p_with_speculative_decoding(off_run):
    error = off_run["runs"]["min_p"]["error"]
    assert error is not None and "min_p and logit_bias sampling parameters" in error


def test_synthetic_acceptance_is_served_at_its_rates(model, tmp_path, hf_greedy):
    """vLLM's lossy ``rejection_sample_method="synthetic"`` (a load generator),
    which vLLM's CPU path cannot run (it stops the engine), served by specaccept's
    ``lossy.Synthetic`` with vLLM's rates: a sampled request with 4 drafts keeps at
    least j of them with probability ``synthetic_acceptance_rates[j - 1]``
    (binomial tests at ALPHA; a plugin reading the rates as conditional ones keeps
    all 4 with probability 0.30, not 0.6: power above 0.99 at this size), and
    greedy requests stay exact."""
    rates = [0.9, 0.8, 0.7, 0.6]
    synthetic = {
        **NGRAM,
        "rejection_sample_method": "synthetic",
        "synthetic_acceptance_rates": rates,
    }
    runs = [
        {"name": "greedy", "prompts": GREEDY_PROMPTS, "sampling": GREEDY},
        {"name": "sampled", "prompts": [LAW_PROMPT] * 400, "sampling": {**LAW, "max_tokens": 6}},
    ]
    out = run_engine(model, tmp_path, "synthetic", runs, llm={"speculative_config": synthetic})
    assert "vLLM's own rejection sampler" not in out["log"]
    for got, want in zip(texts(out, "greedy"), hf_greedy, strict=True):
        assert same_until_eos(got, want), (got, want)
    kept = [
        emitted - 1
        for drafts, emitted_row in out["run_steps"]["sampled"]
        for k, emitted in zip(drafts, emitted_row, strict=True)
        if k == 4
    ]
    assert len(kept) >= 300, len(kept)
    for j, rate in enumerate(rates, start=1):
        hits = sum(1 for a in kept if a >= j)
        assert stats.binomtest(hits, len(kept), rate).pvalue > ALPHA, (j, hits, len(kept))
    critical = stats.binom.ppf(ALPHA / 2, len(kept), 0.6)
    assert stats.binom.cdf(critical, len(kept), float(np.prod(rates))) > 0.99


def test_greedy_in_vllm_s_default_process_mode(model, tmp_path, hf_greedy):
    """Engine and worker spawned (VLLM_ENABLE_V1_MULTIPROCESSING=1): the plugin is
    loaded in the worker and verifies there, and records there; with
    SPECACCEPT_VLLM_K=auto, the engine's scheduler's count of waiting requests
    reaches the worker's choice (none waits: each request's remaining tokens,
    falling by what each step emitted)."""
    runs = [{"name": "greedy", "prompts": GREEDY_PROMPTS, "sampling": GREEDY}]
    choices = tmp_path / "k.jsonl"
    env = {"SPECACCEPT_VLLM_K": "auto", "SPECACCEPT_VLLM_K_RECORD": str(choices)}
    out = run_engine(
        model, tmp_path, "spawned", runs, multiprocessing="1", record=True, env=env, **with_spec()
    )
    assert "replaced by specaccept's token verification" in out["log"]
    # The engine's process wrote the recording when it ended: the drafts the
    # worker kept, short only by the last choices of requests that finished.
    lines = [json.loads(line) for line in choices.read_text().splitlines()]
    kept = sum(sum(line["k"]) for line in lines)
    recorded = int(out["recording"]["num_draft_tokens"].sum())
    assert 0 < recorded and kept - 4 * len(GREEDY_PROMPTS) <= recorded <= kept, (recorded, kept)
    assert lines and all(line["waiting"] == 0 for line in lines)
    left: dict[str, list[int]] = {}
    for line in lines:
        for request, m in zip(line["requests"], line["remaining"], strict=True):
            left.setdefault(request, []).append(m)
    assert len(left) == len(GREEDY_PROMPTS)
    for counts in left.values():  # each step emits at least one token (1: the last)
        assert counts[0] <= GREEDY["max_tokens"] - 1
        assert all(b < a or a == b == 1 for a, b in itertools.pairwise(counts)), counts
    for got, want in zip(texts(out, "greedy"), hf_greedy, strict=True):
        assert same_until_eos(got, want), (got, want)


def test_a_poisoned_request_ends_and_the_others_are_unchanged(token_run):
    """One request's logits turn NaN from its first verification step on (patched
    into vLLM's model runner, tests/vllm_engine.py): that request ends (its
    end-of-sequence token, the error logged); the engine goes on, and the other
    requests' tokens are those of the run without it."""
    healthy = texts(token_run, "greedy")
    assert texts(token_run, "poisoned")[: len(GREEDY_PROMPTS)] == healthy
    bad = token_run["runs"]["poisoned"][-1]
    assert len(bad["token_ids"]) < GREEDY["max_tokens"]
    assert bad["finish_reason"] == "stop"
    log = token_run["log"]
    assert "specaccept: request" in log and "logits must be finite" in log
    assert texts(token_run, "after_poisoned") == healthy


# --- the replaced function against vLLM's own, in law (no engine) --------------------

#: Layouts of one step: each request's drafts (-1: a placeholder), and top-k.
LAYOUTS = {
    "ragged, a zero-draft request": ([[1, 2], [], [3, 0, 4]], None),
    "ragged, top-k 4": ([[1, 2], [], [3, 0, 4]], 4),
    "no request has drafts": ([[], []], None),
    "a -1 placeholder": ([[2, -1, 5], [1]], None),
}


def _vllm_inputs(drafts, top_k, vocab, rng):
    import torch
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata
    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

    counts = [len(d) for d in drafts]
    batch = len(drafts)
    metadata = SpecDecodeMetadata.make_dummy(drafts, torch.device("cpu"))
    sampled = np.cumsum(np.array(counts) + 1)
    starts = sampled - np.array(counts) - 1
    metadata.target_logits_indices = torch.tensor(
        [int(s) + t for s, k in zip(starts, counts, strict=True) for t in range(k)],
        dtype=torch.int32,
    )
    metadata.bonus_logits_indices = torch.tensor(sampled - 1, dtype=torch.int32)
    logits = torch.tensor(
        rng.standard_normal((sum(counts) + batch, vocab)) * 1.5, dtype=torch.float32
    )
    sm = SamplingMetadata(
        temperature=torch.full((batch,), 0.8, dtype=torch.float32),
        all_greedy=False,
        all_random=True,
        top_p=None,
        top_k=None if top_k is None else torch.full((batch,), top_k, dtype=torch.int32),
        generators={},
        max_num_logprobs=None,
        no_penalties=True,
        prompt_token_ids=None,
        frequency_penalties=torch.zeros(batch),
        presence_penalties=torch.zeros(batch),
        repetition_penalties=torch.ones(batch),
        output_token_ids=[[] for _ in range(batch)],
        allowed_token_ids_mask=None,
        bad_words_token_ids={},
        logitsprocs=LogitsProcessors(),
    )
    return metadata, logits, sm


def _correct_expand(x, cu_num_tokens, num_tokens, replace_from=0, replace_to=0):
    """vLLM's expand_batch_to_tokens without its CPU bug (an int64 copy of the
    float32 output, written and dropped): only vLLM's side of these tests uses it."""
    import torch

    counts = torch.diff(cu_num_tokens, prepend=cu_num_tokens.new_zeros(1)).to(torch.long)
    out = x.repeat_interleave(counts, output_size=num_tokens)
    return torch.where(out == replace_from, out.new_tensor(replace_to), out)


def _laws(drafts, top_k, samples, monkeypatch):
    """Emitted sequences per request from vLLM's forward and from the plugin's, on
    the same inputs, ``samples`` calls each; and the inputs."""
    import torch
    from specaccept.compat import vllm_plugin
    from vllm.platforms import current_platform
    from vllm.v1.sample import rejection_sampler as rs
    from vllm.v1.sample.sampler import Sampler

    # What vLLM's worker does at start: its C++ ops, and their stand-ins for the
    # Triton kernels where Triton has no CPU backend.
    current_platform.import_kernels()
    current_platform.register_triton_kernel_overrides()
    rng = np.random.default_rng(7)
    metadata, logits, sm = _vllm_inputs(drafts, top_k, 6, rng)
    sampler = rs.RejectionSampler(Sampler())
    ours = vllm_plugin._Verifier("token", rs.RejectionSampler.forward, vllm.__version__)
    torch.manual_seed(0)
    got = {side: [Counter() for _ in drafts] for side in ("vllm", "ours")}
    with monkeypatch.context() as patch:
        patch.setattr(rs, "expand_batch_to_tokens", _correct_expand)
        for _ in range(samples):
            out = rs.RejectionSampler.forward(sampler, metadata, None, logits.clone(), sm)
            for b, row in enumerate(out.sampled_token_ids.tolist()):
                got["vllm"][b][tuple(t for t in row if t != -1)] += 1
    for _ in range(samples):
        out = ours.forward(sampler, metadata, None, logits, sm)
        for b, row in enumerate(out.sampled_token_ids.tolist()):
            got["ours"][b][tuple(t for t in row if t != -1)] += 1
    return got, logits.numpy()


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_the_plugin_s_step_has_vllm_s_law(layout, monkeypatch):
    """Per request, the emitted sequences of the plugin's forward and of vLLM's own
    (its kernels, with the expand bug worked around) on the same inputs: a chi-square
    test of homogeneity, and each side's first token against the target's law (the
    first row, transformed as docs/spec.md section 8.2 says). False-failure rate
    ALPHA per test."""
    drafts, top_k = LAYOUTS[layout]
    samples = 3000
    got, logits = _laws(drafts, top_k, samples, monkeypatch)
    start = 0
    for b, d in enumerate(drafts):
        cells = sorted(set(got["vllm"][b]) | set(got["ours"][b]))
        table = np.array([[got[side][b][c] for c in cells] for side in ("vllm", "ours")])
        rare = table.sum(axis=0) < 10
        table = np.column_stack([table[:, ~rare], table[:, rare].sum(axis=1)])
        table = table[:, table.sum(axis=0) > 0]
        if table.shape[1] > 1:
            p_value = stats.chi2_contingency(table).pvalue
            assert p_value > ALPHA, (layout, b, p_value, got["vllm"][b].most_common(5))
        law = np.asarray(
            reference.transform_logits(logits[start].astype(np.float64), 0.8, top_k or 0, 1.0)
        )
        for side in ("vllm", "ours"):
            first = Counter()
            for seq, n in got[side][b].items():
                first[seq[0]] += n
            _, _, p_value = _chi_square(first, law)
            assert p_value > ALPHA, (layout, side, b, p_value, first)
        start += len(d) + 1


def test_the_plugin_s_step_reads_bfloat16_logits():
    """A bfloat16 model's logits (which NumPy cannot hold) go through the plugin's
    step as they are: the same tokens as the same values in float32, greedy and
    sampled with the same seeds of torch's generator."""
    import dataclasses

    import torch
    from specaccept.compat import vllm_plugin
    from vllm.v1.sample import rejection_sampler as rs
    from vllm.v1.sample.sampler import Sampler

    drafts = [[1, 2], [], [3, 0, 4]]
    metadata, logits, sm = _vllm_inputs(drafts, None, 64, np.random.default_rng(3))
    half = logits.to(torch.bfloat16)
    sampler = rs.RejectionSampler(Sampler())
    ours = vllm_plugin._Verifier("token", rs.RejectionSampler.forward, vllm.__version__)
    greedy = dataclasses.replace(sm, temperature=None, all_greedy=True, all_random=False)
    for metadata_of_step in (greedy, sm):
        torch.manual_seed(1)
        got = ours.forward(sampler, metadata, None, half, metadata_of_step).sampled_token_ids
        torch.manual_seed(1)
        want = ours.forward(sampler, metadata, None, half.float(), metadata_of_step)
        assert got.tolist() == want.sampled_token_ids.tolist()


# --- seeded requests, keyed by position (no engine; docs/spec.md section 9.3) --------

#: A seeded request's key and the tokens it had generated before the step.
KEY, OFFSET = 0x9E3779B97F4A7C15, 7


def _position_tokens(rows: np.ndarray, temperature: float = 0.8) -> list[int]:
    """What plain decoding draws at offsets OFFSET, OFFSET + 1, ... from ``rows``:
    the reference's transform and inverse-CDF draw with the recovery uniform
    (stream 1, index 0) of KEY at each offset."""
    return [
        reference.sample_index(
            reference.transform_logits(row.astype(np.float64), temperature, 0, 1.0),
            reference.counter_uniform(KEY, OFFSET + t, 0, 1),
        )
        for t, row in enumerate(rows)
    ]


def _seeded_step(rows: np.ndarray, drafts: list[int], monkeypatch) -> list[int]:
    """The plugin's verification step for one seeded request (batch index 1, after
    an unseeded one with a draft) with ``drafts`` over ``rows[:k + 1]``: its emitted
    tokens."""
    import torch
    from specaccept.compat import vllm_plugin, vllm_seeds
    from vllm.v1.sample import rejection_sampler as rs
    from vllm.v1.sample.sampler import Sampler

    k = len(drafts)
    metadata, logits, sm = _vllm_inputs(
        [[1], drafts], None, rows.shape[1], np.random.default_rng(0)
    )
    logits[2 : 2 + k + 1] = torch.from_numpy(rows[: k + 1])
    step = vllm_seeds.SeededRows(
        np.array([1]), np.array([KEY], np.uint64), np.array([OFFSET], np.uint64), False
    )
    ours = vllm_plugin._Verifier("token", rs.RejectionSampler.forward, vllm.__version__)
    monkeypatch.setattr(vllm_seeds._STEP, "rows", step, raising=False)
    out = ours.forward(rs.RejectionSampler(Sampler()), metadata, None, logits, sm)
    return [t for t in out.sampled_token_ids[1].tolist() if t != -1]


def test_a_seeded_request_emits_each_position_s_own_draw_whatever_was_drafted(monkeypatch):
    """Each position's token is the one plain decoding draws there (the reference's
    draw with the counter uniform of its offset): drafts equal to those draws are
    kept, the first other one is replaced by the draw, whatever k. Fails for a
    plugin that decides by the token rule's acceptance uniforms, or draws every
    position with the step's first offset."""
    rng = np.random.default_rng(5)
    rows = (rng.standard_normal((4, 6)) * 0.7).astype(np.float32)
    y = _position_tokens(rows)
    other = [(t + 1) % 6 for t in y]
    cases = {
        "no drafts": [],
        "all drafts right": y[:3],
        "second draft wrong": [y[0], other[1], y[2]],
        "first draft wrong": [other[0]],
        "two right of two": y[:2],
    }
    for name, drafts in cases.items():
        kept = 0
        while kept < len(drafts) and drafts[kept] == y[kept]:
            kept += 1
        want = [*drafts[:kept], y[kept]]
        assert _seeded_step(rows, drafts, monkeypatch) == want, name


def test_a_seeded_request_without_drafts_draws_in_vllm_s_sampler(monkeypatch):
    """A step with no drafts anywhere (vLLM's Sampler): the seeded request's token
    is the reference's draw at its offset, the same as a verification step's first
    position; the unseeded request keeps vLLM's own draw (its law untouched)."""
    import torch
    from specaccept.compat import vllm_seeds
    from vllm.v1.sample.sampler import Sampler
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    # install() wraps both classes for this process; monkeypatch restores them.
    monkeypatch.setattr(GPUModelRunner, "_sample", GPUModelRunner._sample)
    monkeypatch.setattr(Sampler, "sample", Sampler.sample)
    vllm_seeds.install()
    rng = np.random.default_rng(11)
    rows = (rng.standard_normal((2, 6)) * 0.7).astype(np.float32)
    _, _, sm = _vllm_inputs([[], []], None, 6, rng)
    step = vllm_seeds.SeededRows(
        np.array([1]), np.array([KEY], np.uint64), np.array([OFFSET], np.uint64), True
    )
    monkeypatch.setattr(vllm_seeds._STEP, "rows", step, raising=False)
    want = _position_tokens(rows[1:])[0]
    firsts = Counter()
    for _ in range(200):
        sampled, _ = Sampler().sample(torch.from_numpy(rows.copy()), sm)
        assert int(sampled[1]) == want
        firsts[int(sampled[0])] += 1
    assert len(firsts) > 1  # the unseeded request still draws
    assert _seeded_step(np.concatenate([rows[1:], rows[1:]]), [], monkeypatch) == [want]


def test_seeded_requests_follow_the_target_law(monkeypatch):
    """Over 6000 keys, a seeded request with two deterministic drafts emits each
    sequence with the target's probability (the token rule's law for one-hot
    drafts: the product of the rows' probabilities up to and including the first
    token that differs from its draft). Chi-square, false-failure rate ALPHA;
    power >= 0.99 against a rule that draws every position with the step's first
    uniform."""
    import torch
    from specaccept.compat import vllm_plugin, vllm_seeds
    from vllm.v1.sample import rejection_sampler as rs
    from vllm.v1.sample.sampler import Sampler

    rng = np.random.default_rng(2)
    vocab, n = 4, 6000
    rows = (rng.standard_normal((3, vocab)) * 0.8).astype(np.float32)
    p = [np.asarray(reference.transform_logits(r.astype(np.float64), 0.8, 0, 1.0)) for r in rows]
    drafts = [int(np.argmax(p[0])), int(np.argmax(p[1]))]
    law: dict[tuple[int, ...], float] = {}
    for a in range(vocab):
        if a != drafts[0]:
            law[(a,)] = p[0][a]
        for b in range(vocab):
            if b != drafts[1]:
                law[(drafts[0], b)] = p[0][drafts[0]] * p[1][b]
        law[(*drafts, a)] = p[0][drafts[0]] * p[1][drafts[1]] * p[2][a]
    metadata, logits, sm = _vllm_inputs([drafts], None, vocab, rng)
    logits[:] = torch.from_numpy(rows)
    keys = np.random.default_rng(3).integers(0, 2**63, n, dtype=np.uint64)
    sampler = rs.RejectionSampler(Sampler())
    ours = vllm_plugin._Verifier("token", rs.RejectionSampler.forward, vllm.__version__)
    got = Counter()
    for key in keys:
        step = vllm_seeds.SeededRows(
            np.array([0]), np.array([key]), np.array([5], np.uint64), False
        )
        monkeypatch.setattr(vllm_seeds._STEP, "rows", step, raising=False)
        out = ours.forward(sampler, metadata, None, logits, sm).sampled_token_ids[0].tolist()
        got[tuple(t for t in out if t != -1)] += 1
    cells = sorted(law)
    expected = np.array([law[c] for c in cells]) * n
    observed = np.array([got[c] for c in cells])
    assert observed.sum() == n  # nothing outside the law's support
    big = expected >= 5
    rest = [observed[~big].sum()] if (~big).any() else []
    obs = np.append(observed[big], rest)
    exp = np.append(expected[big], [expected[~big].sum()] if rest else [])
    statistic = float(((obs - exp) ** 2 / exp).sum())
    df = len(obs) - 1
    assert stats.chi2.sf(statistic, df) > ALPHA, (statistic, df, got.most_common(6))
    # The wrong rule, one uniform for every position: each sequence's probability.
    u = np.linspace(0, 1, 20001)[:-1] + 0.5 / 20000
    cdfs = [np.cumsum(q) for q in p]
    draws = np.stack([np.searchsorted(c, u, side="right").clip(0, vocab - 1) for c in cdfs])
    wrong = Counter()
    for column in draws.T:
        seq = [int(column[0])]
        if seq[0] == drafts[0]:
            seq.append(int(column[1]))
            if seq[1] == drafts[1]:
                seq.append(int(column[2]))
        wrong[tuple(seq)] += 1
    w = np.array([wrong[c] for c in cells]) / 20000
    w_grouped = np.append(w[big], [w[~big].sum()] if rest else [])
    e_grouped = exp / n
    noncentrality = n * float(((w_grouped - e_grouped) ** 2 / e_grouped).sum())
    power = stats.ncx2.sf(stats.chi2.isf(ALPHA, df), df, noncentrality)
    assert power >= 0.99, power


def test_the_plugin_says_at_start_where_it_cannot_take_effect(caplog):
    """A worker whose model runner is vLLM's V2 one (no V1 RejectionSampler) gets
    a warning naming the runner and the way out; a V1 runner none (with
    speculative decoding off, an info line)."""
    import logging

    from specaccept.compat import vllm_plugin
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner as V2Runner
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    logger = logging.getLogger("vllm.specaccept")
    logger.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.INFO, logger="vllm.specaccept"):
            assert not vllm_plugin.check_runner(object.__new__(V2Runner), "token")
            v1 = object.__new__(GPUModelRunner)
            v1.speculative_config = object()
            assert vllm_plugin.check_runner(v1, "token")
    finally:
        logger.removeHandler(caplog.handler)
    # (A record may reach caplog twice: through the handler and by propagation.)
    warnings = {
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and r.name == "vllm.specaccept"
    }
    assert len(warnings) == 1, warnings
    (warning,) = warnings
    assert "vllm.v1.worker.gpu.model_runner.GPUModelRunner" in warning
    assert "VLLM_USE_V2_MODEL_RUNNER=0" in warning
