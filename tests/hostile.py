"""The hostile-input matrix, run by ``tests/test_hostile.py`` in a child process.

Every case builds one call of a public function from a valid batch and one
hostile change, runs it, and reports what happened: the exception type and
message, or success with the result, and whether any input was modified. Run
in its own interpreter so that a crash (a segfault, an abort, a Rust panic that
escaped) fails the test instead of ending the run: ``python tests/hostile.py``
prints one JSON line per case.
"""

from __future__ import annotations

import copy
import json
import mmap
import sys
import tempfile
from collections.abc import Callable

import numpy as np
import specaccept

B, K, V = 3, 4, 16


def valid() -> dict:
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(V), size=(B, K + 1)).astype(np.float32)
    q = rng.dirichlet(np.ones(V), size=(B, K)).astype(np.float32)
    ids = rng.integers(0, V, size=(B, K))
    for b in range(B):  # row b rejects at position 1 (so positions 2.. are never read)
        p[b, 0, ids[b, 0]], q[b, 0, ids[b, 0]] = 0.5, 0.1
        p[b, 1, ids[b, 1]], q[b, 1, ids[b, 1]] = 0.01, 0.9
    return dict(
        draft_token_ids=ids,
        target_probs=p,
        draft_probs=q,
        num_draft_tokens=np.array([4, 2, 3]),
        uniforms=np.full((B, K), 0.5),
        recovery_uniforms=np.full(B, 0.5),
    )


def unaligned(array: np.ndarray) -> np.ndarray:
    buffer = bytearray(array.nbytes + 1)
    out = np.frombuffer(buffer, dtype=array.dtype, offset=1).reshape(array.shape)
    out[...] = array
    assert not out.flags.aligned
    return out


def read_only(array: np.ndarray) -> np.ndarray:
    out = array.copy()
    out.flags.writeable = False
    return out


def memory_mapped(array: np.ndarray) -> np.ndarray:
    handle = tempfile.TemporaryFile()
    handle.write(array.tobytes())
    handle.flush()
    mapped = mmap.mmap(handle.fileno(), array.nbytes, access=mmap.ACCESS_READ)
    return np.frombuffer(mapped, dtype=array.dtype).reshape(array.shape)


def at(name: str, index: tuple, value) -> Callable[[dict], None]:
    def change(call: dict) -> None:
        call[name] = call[name].copy()
        call[name][index] = value

    return change


def put(name: str, value) -> Callable[[dict], None]:
    def change(call: dict) -> None:
        call[name] = value(call[name]) if callable(value) else value

    return change


def read_position(row: int, t: int):
    return lambda call: (row, t, int(call["draft_token_ids"][row, t]))


def at_read(name: str, row: int, t: int, value) -> Callable[[dict], None]:
    """``value`` at the drafted token of (row, t): a value verify reads."""

    def change(call: dict) -> None:
        index = read_position(row, t)(call)
        call[name] = call[name].copy()
        call[name][index] = value

    return change


def residual_entry(value) -> Callable[[dict], None]:
    """``value`` in row 0's residual row (position 1, read after the rejection)."""

    def change(call: dict) -> None:
        x = int(call["draft_token_ids"][0, 1])
        call["target_probs"] = call["target_probs"].copy()
        call["target_probs"][0, 1, (x + 1) % V] = value

    return change


# name -> (change, expected: "ok" | exception name, fragment the message must contain)
CASES: dict[str, tuple[Callable[[dict], None], str, str]] = {
    # Accepted as they are (read in place, or converted where the layout demands).
    "valid": (lambda c: None, "ok", ""),
    "unaligned float32 target": (put("target_probs", unaligned), "ok", ""),
    "unaligned int64 ids": (put("draft_token_ids", unaligned), "ok", ""),
    "byte-swapped >f4 target": (put("target_probs", lambda a: a.astype(">f4")), "ok", ""),
    "byte-swapped >i8 ids": (put("draft_token_ids", lambda a: a.astype(">i8")), "ok", ""),
    "read-only target": (put("target_probs", read_only), "ok", ""),
    "memory-mapped target": (put("target_probs", memory_mapped), "ok", ""),
    "memory-mapped draft": (put("draft_probs", memory_mapped), "ok", ""),
    "NaN never read (after the rejection)": (at("target_probs", (0, 3, 0), np.nan), "ok", ""),
    "NaN never read (past k_b)": (at("draft_probs", (1, 3, 5), np.nan), "ok", ""),
    "inf in an unread bonus row": (at("target_probs", (1, 4, 2), np.inf), "ok", ""),
    "counts past a rejection ignored": (at("draft_token_ids", (1, 3), 10**9), "ok", ""),
    # Wrong types: TypeError naming the argument.
    "object target": (put("target_probs", lambda a: a.astype(object)), "TypeError", "target_probs"),
    "bool target": (put("target_probs", lambda a: a > 0.1), "TypeError", "target_probs"),
    "complex draft": (put("draft_probs", lambda a: a.astype(complex)), "TypeError", "draft_probs"),
    "str ids": (put("draft_token_ids", lambda a: a.astype(str)), "TypeError", "draft_token_ids"),
    "float ids": (
        put("draft_token_ids", lambda a: a.astype(float)),
        "TypeError",
        "draft_token_ids",
    ),
    "list ids": (put("draft_token_ids", lambda a: a.tolist()), "TypeError", "draft_token_ids"),
    "list uniforms": (put("uniforms", lambda a: a.tolist()), "TypeError", "uniforms"),
    "None target": (put("target_probs", None), "TypeError", "target_probs"),
    "str rng (uniforms to draw)": (
        lambda c: c.update(uniforms=None, rng="seed"),
        "TypeError",
        "rng",
    ),
    # Shapes: ValueError naming the argument.
    "0-d target": (put("target_probs", np.float32(0.5)), "ValueError", "target_probs"),
    "0-d ids": (put("draft_token_ids", np.int64(3)), "ValueError", "draft_token_ids"),
    "target missing the bonus row": (
        put("target_probs", lambda a: a[:, :K]),
        "ValueError",
        "target_probs",
    ),
    "draft of another V": (put("draft_probs", lambda a: a[..., :-1]), "ValueError", "draft_probs"),
    "counts [B + 1]": (
        put("num_draft_tokens", np.array([1, 1, 1, 1])),
        "ValueError",
        "num_draft_tokens",
    ),
    # Values that are read: ValueError naming argument and index.
    "id = V": (at("draft_token_ids", (0, 0), V), "ValueError", "draft_token_ids[0, 0] = 16"),
    "id = -2**63": (
        at("draft_token_ids", (2, 1), -(2**63)),
        "ValueError",
        "draft_token_ids[2, 1] = -9223372036854775808",
    ),
    "k_b = K + 1": (at("num_draft_tokens", 1, K + 1), "ValueError", "num_draft_tokens[1] = 5"),
    "k_b = 2**62": (at("num_draft_tokens", 0, 2**62), "ValueError", "num_draft_tokens[0]"),
    "k_b = -1": (at("num_draft_tokens", 2, -1), "ValueError", "num_draft_tokens[2] = -1"),
    "u = 1": (at("uniforms", (0, 1), 1.0), "ValueError", "uniforms[0, 1] = 1.0"),
    "u NaN": (at("uniforms", (2, 0), np.nan), "ValueError", "uniforms[2, 0] = nan"),
    "recovery = -0.5": (at("recovery_uniforms", 1, -0.5), "ValueError", "recovery_uniforms[1]"),
    "p(x) NaN where read": (
        at_read("target_probs", 1, 0, np.nan),
        "ValueError",
        "target_probs[1, 0, ",
    ),
    "q(x) inf where read": (
        at_read("draft_probs", 2, 1, np.inf),
        "ValueError",
        "draft_probs[2, 1, ",
    ),
    "p(x) above 1": (at_read("target_probs", 0, 0, 1.5), "ValueError", "target_probs[0, 0, "),
    "residual entry NaN": (residual_entry(np.nan), "ValueError", "target_probs[0, 1, "),
    "residual entry negative": (residual_entry(-1e-3), "ValueError", "target_probs[0, 1, "),
    "residual sums to 0": (
        put(
            "target_probs",
            lambda a: np.where(np.arange(K + 1)[:, None] == 1, 0.0, a).astype(a.dtype),
        ),
        "ValueError",
        "sums to 0",
    ),
}


def valid_logits() -> dict:
    """The valid batch as float32 logits (log-probabilities: at temperature 1 the
    softmax renormalises them, keeping the decisions: row b rejects at position 1)."""
    call = valid()
    with np.errstate(divide="ignore"):
        target, draft = np.log(call.pop("target_probs")), np.log(call.pop("draft_probs"))
    return dict(call, target_logits=target.astype(np.float32), draft_logits=draft)


# The same for verify_logits (its own arguments: logits and the sampling parameters).
LOGITS_CASES: dict[str, tuple[Callable[[dict], None], str, str]] = {
    "valid": (lambda c: None, "ok", ""),
    "unaligned float32 target": (put("target_logits", unaligned), "ok", ""),
    "byte-swapped >f4 target": (put("target_logits", lambda a: a.astype(">f4")), "ok", ""),
    "read-only target": (put("target_logits", read_only), "ok", ""),
    "memory-mapped draft": (put("draft_logits", memory_mapped), "ok", ""),
    "reversed target rows (strided)": (
        put("target_logits", lambda a: np.ascontiguousarray(a[..., ::-1])[..., ::-1]),
        "ok",
        "",
    ),
    "NaN never read (after the rejection)": (at("target_logits", (0, 3, 0), np.nan), "ok", ""),
    "+inf in an unread bonus row": (at("target_logits", (1, 4, 2), np.inf), "ok", ""),
    "object target": (
        put("target_logits", lambda a: a.astype(object)),
        "TypeError",
        "target_logits",
    ),
    "complex draft": (
        put("draft_logits", lambda a: a.astype(complex)),
        "TypeError",
        "draft_logits",
    ),
    "str temperature": (put("temperature", "hot"), "TypeError", "temperature"),
    "0-d target": (put("target_logits", np.float32(0.5)), "ValueError", "target_logits"),
    "target missing the bonus row": (
        put("target_logits", lambda a: a[:, :K]),
        "ValueError",
        "target_logits",
    ),
    "draft of another V": (
        put("draft_logits", lambda a: a[..., :-1]),
        "ValueError",
        "draft_logits",
    ),
    "temperature [B + 1]": (put("temperature", np.ones(B + 1)), "ValueError", "temperature"),
    "temperature NaN": (put("temperature", np.nan), "ValueError", "temperature[0] = nan"),
    "temperature -1": (put("temperature", -1.0), "ValueError", "temperature[0] = -1.0"),
    "temperature subnormal": (put("temperature", 1e-310), "ValueError", "smallest normal"),
    "top_k = -1": (put("top_k", -1), "ValueError", "top_k[0] = -1"),
    "top_p = 0": (put("top_p", 0.0), "ValueError", "top_p[0]"),
    "top_p NaN": (put("top_p", np.nan), "ValueError", "top_p[0]"),
    "id = V": (at("draft_token_ids", (0, 0), V), "ValueError", "draft_token_ids[0, 0] = 16"),
    "u = 1": (at("uniforms", (0, 1), 1.0), "ValueError", "uniforms[0, 1] = 1.0"),
    "target NaN where read": (
        at("target_logits", (1, 0, 5), np.nan),
        "ValueError",
        "target_logits[1, 0, 5] = nan",
    ),
    "target +inf where read": (
        at("target_logits", (2, 1, 0), np.inf),
        "ValueError",
        "target_logits[2, 1, 0] = inf",
    ),
    "draft row all -inf where read": (
        at("draft_logits", (2, 0), -np.inf),
        "ValueError",
        "draft_logits[2, 0] has no finite logit",
    ),
}


def edge_calls() -> dict[str, dict]:
    """Edge shapes that are valid: B = 0, K = 0, V = 1."""
    rng = np.random.default_rng(1)
    return {
        "B = 0": dict(
            draft_token_ids=np.zeros((0, 3), dtype=np.int64),
            target_probs=np.zeros((0, 4, 5), dtype=np.float32),
            rng=0,
        ),
        "K = 0": dict(
            draft_token_ids=np.zeros((2, 0), dtype=np.int64),
            target_probs=rng.dirichlet(np.ones(5), size=(2, 1)),
            draft_probs=np.zeros((2, 0, 5)),
            rng=0,
        ),
        "V = 1": dict(
            draft_token_ids=np.zeros((2, 3), dtype=np.int64),
            target_probs=np.ones((2, 4, 1)),
            draft_probs=np.ones((2, 3, 1)),
            rng=0,
        ),
    }


def outcome(call: dict, verify: Callable = specaccept.verify) -> dict:
    before = copy.deepcopy({k: v for k, v in call.items() if isinstance(v, np.ndarray)})
    try:
        result = verify(**call)
        report = {"type": "ok", "tokens": result.to_lists()}
    # Every exception is reported, panics included.
    except Exception as error:
        # specaccept's ValueErrors are InputErrors naming the argument; a bare
        # ValueError is reported as such and fails the expectation.
        name = type(error).__name__
        if isinstance(error, specaccept.InputError) and error.argument:
            name = "ValueError"
        elif name == "ValueError":
            name = "ValueError without an argument"
        report = {"type": name, "message": str(error)}
    report["inputs_unchanged"] = all(
        np.array_equal(call[k], v, equal_nan=v.dtype.kind == "f") for k, v in before.items()
    )
    return report


def main() -> int:
    for name, (change, _, _) in CASES.items():
        call = valid()
        change(call)
        print(json.dumps({"case": name, **outcome(call)}), flush=True)
    for name, call in edge_calls().items():
        print(json.dumps({"case": name, **outcome(call)}), flush=True)
    for name, (change, _, _) in LOGITS_CASES.items():
        call = valid_logits()
        change(call)
        report = outcome(call, specaccept.verify_logits)
        print(json.dumps({"case": f"logits: {name}", **report}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
