"""What a vLLM server meets, with the plugin on (the ``vllm`` CI stage; docs/serving.md
"What each case meets").

The serving matrix: one engine with speculative decoding (n-gram, k = 4) and the
plugin, chunked prefill (a 64-token budget per step), prefix caching and a KV cache
small enough that vLLM preempts, against one engine without speculative decoding
or the plugin, with the same settings.
Greedy requests must give the same tokens; each case's own promise (words never
emitted, ids in the allowed set, JSON that parses, at least ``min_tokens``) is
checked on both. Sampled cases are checked against what defines them (``n > 1``
against its children served one by one). The drafts are shown verified by the
plugin. tests/test_vllm_plugin.py covers the law, seeds under preemption, logprobs
modes and errors.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

vllm = pytest.importorskip("vllm")

pytestmark = pytest.mark.filterwarnings(
    "ignore::DeprecationWarning", "ignore::FutureWarning", "ignore::UserWarning"
)

from vllm_runs import NGRAM, run_engine, smollm2_folder, texts  # noqa: E402

PROMPTS = [
    "1, 2, 3, 4, 5, 6, 7, 8,",
    "Once upon a time there was a king. Once upon a time there was a",
    "The capital of France is Paris. The capital of France is",
    "Roses are red, violets are blue. Roses are red,",
]
#: Longer than the step's token budget (64): its prefill is chunked. The second
#: prompt shares it as a prefix: served from the prefix cache.
LONG = "Here are the numbers from one to fifty: " + ", ".join(str(i) for i in range(1, 51)) + "."
LONG_PROMPTS = [LONG, LONG + " Now count back from fifty:"]
GREEDY = {"temperature": 0.0, "max_tokens": 24}
BAD_WORDS = [" king", " Paris", " 9"]
#: Only the first 2000 token ids (SmolLM2's most common pieces).
ALLOWED = 2000
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
JSON_PROMPT = "Give me a person as a JSON object with a name and an age:"
#: Eight requests of up to about 120 tokens in a KV cache of 384 (12 blocks of
#: 32): vLLM must preempt some.
CROWD = [
    "Tell me a story about a dragon.",
    "List three colours:",
    "Write a poem about the sea.",
    "Explain photosynthesis briefly.",
    "Name five animals:",
    "Describe a sunny day in the park.",
    "Once upon a time there was a king. Once upon a time there was a",
    "The capital of France is Paris. The capital of France is",
]
SETTINGS = {
    "enable_chunked_prefill": True,
    "max_num_batched_tokens": 64,
    "max_num_seqs": 8,
    "enable_prefix_caching": True,
    "block_size": 32,
    "num_gpu_blocks_override": 12,
    "max_model_len": 256,
    "disable_log_stats": False,
}
#: Each case: its requests, and whether the engines must agree token for token.
GREEDY_CASES = {
    "plain": (PROMPTS, GREEDY),
    "chunked_and_cached": (LONG_PROMPTS, GREEDY),
    "penalties": (
        PROMPTS,
        {**GREEDY, "repetition_penalty": 1.3, "presence_penalty": 0.5, "frequency_penalty": 0.5},
    ),
    "bad_words": (PROMPTS, {**GREEDY, "bad_words": BAD_WORDS}),
    "allowed_token_ids": (PROMPTS, {**GREEDY, "allowed_token_ids": list(range(ALLOWED))}),
    "preempted": (CROWD, {**GREEDY, "max_tokens": 96}),
    # Greedy ends this one after 5 tokens (" 50." and the end of sequence).
    "min_tokens": (LONG_PROMPTS[1:], {**GREEDY, "min_tokens": 12}),
    "stop": (PROMPTS, {**GREEDY, "stop": [".", "\n"]}),
    "json": (
        [JSON_PROMPT],
        {**GREEDY, "max_tokens": 64, "structured_outputs": {"json": PERSON}},
    ),
    "logprobs": (PROMPTS[:2], {**GREEDY, "logprobs": 3}),
}
SAMPLED_JSON = {
    "temperature": 0.8,
    "max_tokens": 64,
    "structured_outputs": {"json": PERSON},
}
N_SEED = 5


@pytest.fixture(scope="module")
def engines(tmp_path_factory) -> dict:
    model = smollm2_folder()
    runs = [
        {"name": name, "prompts": prompts, "sampling": sampling}
        for name, (prompts, sampling) in GREEDY_CASES.items()
    ]
    sampled = [
        {"name": "sampled_json", "prompts": [JSON_PROMPT] * 6, "sampling": SAMPLED_JSON},
        {
            "name": "n3",
            "prompts": [PROMPTS[1]],
            "sampling": {"temperature": 0.8, "max_tokens": 16, "n": 3, "seed": N_SEED},
        },
        {
            "name": "n3_children",
            "prompts": [PROMPTS[1]] * 3,
            "sampling": [
                {"temperature": 0.8, "max_tokens": 16, "seed": N_SEED + i} for i in range(3)
            ],
        },
    ]
    tmp = tmp_path_factory.mktemp("matrix")
    spec = {"llm": {**SETTINGS, "speculative_config": NGRAM}}
    plain = {"llm": SETTINGS}
    return {
        "spec": run_engine(model, tmp, "spec", runs + sampled, **spec),
        "plain": run_engine(model, tmp, "plain", runs, method=None, **plain),
        "model": model,
    }


def test_the_plugin_verified_the_drafts(engines):
    spec = engines["spec"]
    assert spec["patched"]
    verified = [k for step in spec["steps"] for k in step[0]]
    assert sum(verified) > 100, sum(verified)
    assert spec["counters"].get("vllm:spec_decode_num_accepted_tokens", 0) > 0


@pytest.mark.parametrize("case", list(GREEDY_CASES))
def test_greedy_equals_vllm_without_speculative_decoding(engines, case):
    got, want = texts(engines["spec"], case), texts(engines["plain"], case)
    assert got == want
    assert all(ids for ids in got)


def test_preemption_happened(engines):
    for name in ("spec", "plain"):
        assert engines[name]["counters"].get("vllm:num_preemptions", 0) > 0, name
        assert any(r["preempted"] for r in engines[name]["runs"]["preempted"]), name


def test_chunked_prefill_and_prefix_caching_happened(engines):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(engines["model"])
    assert len(tokenizer(LONG).input_ids) > SETTINGS["max_num_batched_tokens"]
    for name in ("spec", "plain"):
        assert engines[name]["counters"].get("vllm:prefix_cache_hits", 0) > 0, name


def test_each_processor_s_promise_holds(engines):
    for name in ("spec", "plain"):
        runs = engines[name]["runs"]
        for r in runs["bad_words"]:
            assert not any(w in r["text"] for w in BAD_WORDS), (name, r["text"])
        assert all(t < ALLOWED for r in runs["allowed_token_ids"] for t in r["token_ids"])
        (answer,) = runs["min_tokens"]
        assert len(answer["token_ids"]) >= 12
        assert runs["chunked_and_cached"][1]["finish_reason"] == "stop"
        assert len(runs["chunked_and_cached"][1]["token_ids"]) < 12  # min_tokens mattered
        for r in runs["stop"]:
            assert r["finish_reason"] == "stop" or len(r["token_ids"]) == GREEDY["max_tokens"]
            assert "." not in r["text"] and "\n" not in r["text"]
        person = json.loads(runs["json"][0]["text"])
        assert set(person) == {"name", "age"} and isinstance(person["age"], int)
    # Without the processors, the same prompts say what they forbid.
    plain = " ".join(r["text"] for r in engines["spec"]["runs"]["plain"])
    assert any(w in plain for w in BAD_WORDS)
    assert max(t for r in engines["spec"]["runs"]["plain"] for t in r["token_ids"]) >= ALLOWED


def test_logprobs_are_vllm_s(engines):
    spec, plain = (engines[n]["runs"]["logprobs"] for n in ("spec", "plain"))
    for a, b in zip(spec, plain, strict=True):
        for x, y in zip(a["logprobs"], b["logprobs"], strict=True):
            assert x.keys() == y.keys()
            for token in x:
                assert abs(x[token][0] - y[token][0]) < 1e-3
                assert x[token][1] == y[token][1]


def test_sampled_structured_output_parses(engines):
    for r in engines["spec"]["runs"]["sampled_json"]:
        person = json.loads(r["text"])
        assert set(person) == {"name", "age"} and isinstance(person["age"], int), r["text"]


def test_n_completions_are_their_children_served_alone(engines):
    """``n = 3`` with seed s: vLLM gives child i the seed s + i, and a seeded
    request draws by position, so each completion is that seed's request alone."""
    (parent,) = engines["spec"]["runs"]["n3"]
    children = [r["token_ids"] for r in engines["spec"]["runs"]["n3_children"]]
    assert sorted(parent["outputs"]) == sorted(children)
    assert len({tuple(c) for c in children}) > 1


# --- the OpenAI server, as people run it (docs/serving.md "vLLM") -----------------

SERVER_START_SECONDS = 300


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> tuple[int, str]:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode()
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return 0, ""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """vLLM's OpenAI server (the module docs/serving.md runs) on the loopback
    address, SmolLM2 with n-gram drafts, the plugin on (``token``; the block
    method's engine runs are in tests/test_vllm_plugin.py)."""
    import os
    import subprocess
    import sys
    import time

    method = "token"
    port = _free_port()
    log_path = tmp_path_factory.mktemp("server") / f"{method}.log"
    env = {
        **os.environ,
        "SPECACCEPT_VLLM": method,
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "HF_HUB_OFFLINE": "1",
    }
    for name in ("SPECACCEPT_VLLM_RECORD", "SPECACCEPT_VLLM_K"):
        env.pop(name, None)
    command = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        *("--model", smollm2_folder(), "--served-model-name", "smollm2"),
        *("--host", "127.0.0.1", "--port", str(port)),
        *("--dtype", "float32", "--max-model-len", "512", "--enforce-eager", "--seed", "0"),
        *("--speculative-config", json.dumps(NGRAM)),
    ]
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + SERVER_START_SECONDS
        while _get(base + "/health")[0] != 200:
            assert process.poll() is None, log_path.read_text()[-6000:]
            assert time.monotonic() < deadline, "the server did not start in time"
            time.sleep(1)
        yield {"base": base, "method": method, "log": log_path, "process": process}
    finally:
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _accepted_drafts(metrics: str) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("vllm:spec_decode_num_accepted_tokens_total")
    )


def test_the_openai_server_serves_concurrent_streamed_cut_and_seeded_requests(server):
    """Through the ``openai`` client: greedy answers one at a time; then 17
    concurrent requests (completions and chat, streamed, two cut after three
    chunks, a seeded one and a min-p one); greedy answers equal to those served one
    at a time, streamed text equal to it too, the seeded text equal to it alone,
    accepted drafts counted in /metrics, and the server answering the same after."""
    from concurrent.futures import ThreadPoolExecutor

    import openai

    client = openai.OpenAI(
        base_url=server["base"] + "/v1", api_key="none", timeout=180, max_retries=0
    )

    def complete(prompt: str, **options) -> str:
        options = {"temperature": 0.0, "max_tokens": 24, **options}
        answer = client.completions.create(model="smollm2", prompt=prompt, **options)
        return answer.choices[0].text

    def chat(content: str, **options) -> str:
        options = {"temperature": 0.0, "max_tokens": 24, **options}
        answer = client.chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": content}], **options
        )
        return answer.choices[0].message.content or ""

    def streamed(prompt: str, cut_after: int | None = None) -> str:
        stream = client.completions.create(
            model="smollm2", prompt=prompt, temperature=0.0, max_tokens=24, stream=True
        )
        parts = []
        for i, chunk in enumerate(stream):
            parts.append(chunk.choices[0].text if chunk.choices else "")
            if cut_after is not None and i + 1 >= cut_after:
                stream.close()  # the client goes away mid-answer
                break
        return "".join(parts)

    seeded = {"temperature": 0.8, "seed": 11, "extra_body": {"top_k": 20}}
    alone = [complete(p) for p in PROMPTS]
    chat_alone = chat("Name three colours.")
    seeded_alone = chat("Tell me a short story about a king.", **seeded)
    before = _accepted_drafts(_get(server["base"] + "/metrics")[1])
    with ThreadPoolExecutor(17) as pool:
        jobs = {
            "greedy": [pool.submit(complete, p) for p in PROMPTS],
            "stream": [pool.submit(streamed, p) for p in PROMPTS],
            "cut": [pool.submit(streamed, p, 3) for p in PROMPTS[:2]],
            "chat": [pool.submit(chat, "Name three colours.") for _ in range(4)],
            "seeded": [pool.submit(chat, "Tell me a short story about a king.", **seeded)],
            "min_p": [
                pool.submit(complete, PROMPTS[1], temperature=0.8, extra_body={"min_p": 0.1})
                for _ in range(2)
            ],
        }
        done = {name: [f.result() for f in futures] for name, futures in jobs.items()}
    assert done["greedy"] == alone
    assert done["stream"] == alone
    assert all(alone[i].startswith(cut) for i, cut in enumerate(done["cut"]))
    assert done["chat"] == [chat_alone] * 4
    assert done["seeded"] == [seeded_alone]
    assert all(done["min_p"])
    status, metrics = _get(server["base"] + "/metrics")
    assert status == 200 and _accepted_drafts(metrics) > before
    assert [complete(p) for p in PROMPTS] == alone  # alive, and the same
    assert server["process"].poll() is None
    log = server["log"].read_text()
    assert f"replaced by specaccept's {server['method']} verification" in log
    assert "Traceback" not in log


# --- tensor parallelism 2 on the CPU --------------------------------------------

TP_PROMPTS = [
    "1, 2, 3, 4, 5, 6, 7, 8,",
    "Once upon a time there was a king. Once upon a time there was a",
    "The capital of France is Paris. The capital of France is",
    "Roses are red, violets are blue. Roses are red,",
    "a b c a b c a b c a b c",
    "red green blue red green blue red",
]


@pytest.fixture(scope="module")
def tp_model(tmp_path_factory) -> str:
    """A small Llama with random weights whose heads divide by 2 (4 query heads, 2
    key-value heads, head size 64; SmolLM2's 9 do not), SmolLM2's tokenizer, saved
    as a folder vLLM reads."""
    import shutil

    import torch
    import transformers

    folder = tmp_path_factory.mktemp("tp-llama")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=49152,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
    )
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():  # sharper rows than the default initialisation
        for parameter in model.parameters():
            if parameter.ndim == 2:
                parameter.mul_(4.0)
    model.save_pretrained(folder)
    source = smollm2_folder()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(f"{source}/{name}", folder / name)
    return str(folder)


def test_tensor_parallel_2_gives_tensor_parallel_1_s_text_and_the_ranks_agree(tp_model, tmp_path):
    """Greedy and seeded sampled requests at tensor parallelism 2 (two CPU workers,
    each verifying with the plugin) give the texts of tensor parallelism 1. Every
    rank samples and feeds its own tokens back, so the ranks must draw alike: both
    ranks' recordings (unseeded sampled requests included, from torch's global
    generator) hold the same drafts and the same rows at every verified step; a
    rank that drew another token would draft and score another history."""
    sampled = {"temperature": 0.8, "max_tokens": 48}
    runs = [
        {"name": "greedy", "prompts": TP_PROMPTS, "sampling": {**GREEDY, "max_tokens": 48}},
        {
            "name": "seeded",
            "prompts": TP_PROMPTS[:3],
            "sampling": [{**sampled, "seed": 21 + i} for i in range(3)],
        },
        {"name": "unseeded", "prompts": TP_PROMPTS, "sampling": sampled},
        {
            "name": "mixed",
            "prompts": TP_PROMPTS,
            "sampling": [{**GREEDY, "max_tokens": 48}, sampled] * 3,
        },
    ]
    one = run_engine(tp_model, tmp_path, "tp1", runs, llm={"speculative_config": NGRAM})
    two = run_engine(
        tp_model,
        tmp_path,
        "tp2",
        runs,
        record=True,
        llm={
            "speculative_config": NGRAM,
            "tensor_parallel_size": 2,
            "distributed_executor_backend": "mp",
        },
    )
    assert "Worker_TP1" in two["log"]
    assert texts(two, "greedy") == texts(one, "greedy")
    assert texts(two, "seeded") == texts(one, "seeded")
    # Unseeded requests draw from torch's global generator, which vLLM seeds alike
    # in every worker: the same draws as one worker, if every rank draws alike.
    assert texts(two, "unseeded") == texts(one, "unseeded")
    assert texts(two, "mixed") == texts(one, "mixed")
    rank0 = two["recording"]
    with np.load(tmp_path / "tp2.rank1.npz") as data:
        rank1 = {k: data[k] for k in data.files}
    assert int(rank0["num_draft_tokens"].sum()) >= 20
    np.testing.assert_array_equal(rank0["num_draft_tokens"], rank1["num_draft_tokens"])
    np.testing.assert_array_equal(rank0["draft_token_ids"], rank1["draft_token_ids"])
    np.testing.assert_allclose(rank0["target_probs"], rank1["target_probs"], atol=1e-6)
