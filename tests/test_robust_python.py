"""Hostile inputs to the Python layer (issue 13): every call ends in a valid result,
a ``TypeError``, a ``ValueError`` (an :class:`specaccept.InputError` where an
argument is named) or a clean ``MemoryError``; never an ``IndexError``,
``AttributeError``, ``OverflowError``, ``RecursionError``, ``ZeroDivisionError``, a
hang, or a modified input."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import numpy as np
import pytest
import specaccept
from specaccept import AcceptanceStats, InputError, Verification, reference
from specaccept._arrays import as_numpy, like_converter

# --------------------------------------------------------------------------
# _arrays: DLPack devices, like= namespaces, __array_interface__
# --------------------------------------------------------------------------


class BadDevice:
    """Exports DLPack, but its ``__dlpack_device__`` answer is not ``(int, int)``."""

    def __init__(self, device):
        self._device = device

    def __dlpack__(self, **kwargs):
        return np.zeros(2).__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._device


@pytest.mark.parametrize(
    "device", [(), 5, None, "cpu", [1, 0], ("a", 0), (None, 0), (1.5, 0), (True, 0), (1, 0, 0)]
)
def test_dlpack_device_that_is_not_a_pair_of_ints_is_a_type_error(device):
    with pytest.raises(TypeError, match="target_probs") as error:
        as_numpy(BadDevice(device), "target_probs")
    assert "__dlpack_device__" in str(error.value)


def test_dlpack_device_error_reaches_verify_as_a_type_error():
    p = np.full((1, 2, 2), 0.5)
    with pytest.raises(TypeError, match="draft_token_ids"):
        specaccept.verify(BadDevice(()), p, rng=0)
    with pytest.raises(TypeError, match="draft_token_ids"):
        reference.verify(BadDevice(()), p, rng=0)


class OwnError(Exception):
    pass


def test_an_exception_of_the_callers_own_dlpack_device_propagates():
    class Raises(BadDevice):
        def __dlpack_device__(self):
            raise OwnError("mine")

    with pytest.raises(OwnError):
        as_numpy(Raises(None), "x")


class NoFromDlpack:
    def __array_namespace__(self, api_version=None):
        return object()


class NamespaceRaises:
    def __array_namespace__(self, api_version=None):
        raise KeyError("no namespace")


class NamespaceNotCallable:
    __array_namespace__ = 5


@pytest.mark.parametrize("like", [NoFromDlpack(), NamespaceRaises(), NamespaceNotCallable()])
def test_like_with_an_unusable_namespace_is_a_type_error_up_front(like):
    with pytest.raises(TypeError, match="like"):
        like_converter(like)
    ids, p = np.zeros((1, 1), dtype=np.int64), np.full((1, 2, 2), 0.5)
    for impl in (specaccept, reference):
        with pytest.raises(TypeError, match="like"):
            impl.verify(ids, p, rng=0, like=like)


def test_array_interface_that_numpy_would_allocate_is_a_value_error():
    class Huge:
        __array_interface__ = {  # noqa: RUF012
            "shape": (2**40,),
            "typestr": "<f8",
            "data": (0, True),
            "version": 3,
        }

    with pytest.raises(InputError, match="target_probs") as error:
        as_numpy(Huge(), "target_probs")
    assert error.value.argument == "target_probs"


@pytest.mark.parametrize(
    "interface", [5, {"shape": "garbage"}, {"shape": (2,), "typestr": "zz", "data": (0, True)}]
)
def test_array_interface_garbage_is_numpys_value_or_type_error(interface):
    class Garbage:
        __array_interface__ = interface

    with pytest.raises((TypeError, ValueError)):
        as_numpy(Garbage(), "x")


# --------------------------------------------------------------------------
# _result: Verification and TreeVerification methods
# --------------------------------------------------------------------------


def one_row() -> Verification:
    return specaccept.verify_greedy(np.array([[5, 7]]), np.array([[5, 9, 2]]))


@pytest.mark.parametrize("row", [1, -2, 2**70, np.uint64(2**63), np.int64(7)])
def test_tokens_of_a_row_past_the_batch_is_an_input_error(row):
    with pytest.raises(InputError, match=r"row .* B = 1") as error:
        one_row().tokens(row)
    assert error.value.argument == "row"


@pytest.mark.parametrize("row", [1.0, "0", None, True, np.bool_(False), [0]])
def test_tokens_of_a_row_that_is_not_an_int_is_a_type_error(row):
    with pytest.raises(TypeError, match="row"):
        one_row().tokens(row)


def test_tokens_of_valid_rows_and_negative_indexing_still_work():
    r = one_row()
    assert r.tokens(0).tolist() == r.tokens(-1).tolist() == r.tokens(np.int32(0)).tolist() == [5, 9]
    assert r.to_lists() == [[5, 9]]


def test_tree_verification_tokens_past_the_batch_is_an_input_error():
    t = specaccept.verify_tree(
        np.array([[0, 1]]), np.array([-1, 0]), np.full((1, 2, 3), 1 / 3), greedy=True
    )
    assert t.to_lists() == [t.tokens(0).tolist()]
    with pytest.raises(InputError, match="row"):
        t.tokens(5)


def test_tokens_with_an_inconsistent_num_emitted_is_an_input_error():
    r = Verification(np.zeros((1, 3), dtype=np.int64), np.zeros(1, np.int64), np.array([5]))
    with pytest.raises(InputError, match="num_emitted") as error:
        r.tokens(0)
    assert (error.value.argument, error.value.index, error.value.row) == ("num_emitted", (0,), 0)
    with pytest.raises(InputError, match="num_emitted"):
        r.to_lists()


def test_methods_of_a_verification_built_from_non_arrays_are_type_errors():
    r = Verification(1, 2, 3)
    for method in (lambda: r.batch_size, lambda: r.tokens(0), r.to_lists):
        with pytest.raises(TypeError, match="num_accepted"):
            method()


@pytest.mark.parametrize(
    ("sizes", "argument"),
    [((2**62, 1), "batch_size"), ((1, 2**62), "num_draft"), ((10**6, 10**6), "num_draft")],
)
def test_empty_too_large_is_a_memory_error_naming_the_argument(sizes, argument):
    for cls in (Verification, specaccept.TreeVerification):
        with pytest.raises(MemoryError, match=argument):
            cls.empty(*sizes)


@pytest.mark.parametrize(
    ("sizes", "argument"),
    [
        ((2**70, 1), "batch_size"),
        ((1, 2**63 - 1), "num_draft"),
        ((0, 2**70), "num_draft"),
        ((np.uint64(2**64 - 1), 0), "batch_size"),
        ((1, np.int64(2**63 - 1)), "num_draft"),
        ((-1, 1), "batch_size"),
        ((1, -5), "num_draft"),
    ],
)
def test_empty_with_an_impossible_size_is_an_input_error(sizes, argument):
    with pytest.raises(InputError, match=argument) as error:
        Verification.empty(*sizes)
    assert error.value.argument == argument


@pytest.mark.parametrize("sizes", [(1.0, 1), (1, "2"), (True, 1), (1, None), (np.float64(1), 1)])
def test_empty_with_non_int_sizes_is_a_type_error(sizes):
    with pytest.raises(TypeError, match=r"batch_size|num_draft"):
        Verification.empty(*sizes)


def test_empty_of_zero_rows_or_zero_drafts():
    assert Verification.empty(0, 3).output_token_ids.shape == (0, 4)
    assert Verification.empty(2, 0).output_token_ids.shape == (2, 1)


# --------------------------------------------------------------------------
# _stats: AcceptanceStats and the closed forms
# --------------------------------------------------------------------------


def some_stats() -> AcceptanceStats:
    s = AcceptanceStats()
    s.update(specaccept.verify_greedy(np.array([[5, 7], [1, 2]]), np.array([[5, 9, 2], [1, 2, 3]])))
    return s


@pytest.mark.parametrize("result", [None, 5, "result", object(), [1, 2]])
def test_update_with_a_non_result_is_a_type_error(result):
    with pytest.raises(TypeError, match="result"):
        AcceptanceStats().update(result)


def test_update_with_a_result_without_columns_is_an_input_error():
    class Empty:
        num_accepted = np.array([0])
        output_token_ids = np.zeros((1, 0), dtype=np.int64)

    with pytest.raises(InputError, match="output_token_ids") as error:
        AcceptanceStats().update(Empty())
    assert error.value.argument == "result.output_token_ids"


def test_update_refusals_leave_the_stats_and_inputs_unchanged():
    s = some_stats()
    before = s.to_dict()
    counts = np.array([5, -1])
    r = specaccept.verify_greedy(np.array([[5, 7], [1, 2]]), np.array([[5, 9, 2], [1, 2, 3]]))
    with pytest.raises(ValueError, match="num_draft_tokens"):
        s.update(r, counts)
    assert s.to_dict() == before and counts.tolist() == [5, -1]


@pytest.mark.parametrize("other", [None, 5, {"num_steps": 1}])
def test_merge_with_a_non_stats_is_a_type_error(other):
    with pytest.raises(TypeError, match="AcceptanceStats"):
        some_stats().merge(other)
    with pytest.raises(TypeError):
        some_stats() + other


def test_total_draft_tokens_is_the_running_total_and_old_dicts_still_load():
    s = some_stats()
    assert s.total_draft_tokens == 4
    d = s.to_dict()
    assert "total_draft_tokens" in d and "num_draft_tokens" not in d
    old = dict(d)
    old["num_draft_tokens"] = old.pop("total_draft_tokens")
    assert AcceptanceStats.from_dict(old) == s
    with pytest.warns(DeprecationWarning, match="total_draft_tokens"):
        assert s.num_draft_tokens == 4


@pytest.mark.parametrize(
    ("key", "value", "error"),
    [
        ("num_steps", -1, InputError),
        ("num_steps", "a", TypeError),
        ("num_steps", float("nan"), TypeError),
        ("num_steps", 1.5, TypeError),
        ("num_steps", True, TypeError),
        ("num_steps", None, TypeError),
        ("num_steps", 2**200, InputError),
        ("total_draft_tokens", 2**64, InputError),
        ("num_accepted_tokens", -(2**70), InputError),
        ("drafted_per_position", [1, "a"], TypeError),
        ("drafted_per_position", "ab", TypeError),
        ("drafted_per_position", [1, -1], InputError),
        ("drafted_per_position", [1, 2, 3, 4, 5], InputError),
        ("accepted_per_position", [], InputError),
        ("accepted_length_histogram", None, TypeError),
        ("accepted_length_histogram", [1], InputError),
        ("accepted_length_histogram", [1, float("inf"), 0], TypeError),
    ],
)
def test_from_dict_with_a_corrupt_entry_names_it(key, value, error):
    d = some_stats().to_dict()
    d[key] = value
    with pytest.raises(error, match=key):
        AcceptanceStats.from_dict(d)
    with pytest.raises(error, match=key):
        AcceptanceStats.from_json(json.dumps(d))


@pytest.mark.parametrize("data", [None, [1], "text", 5])
def test_from_dict_of_a_non_dict_is_a_type_error(data):
    with pytest.raises(TypeError, match="dict"):
        AcceptanceStats.from_dict(data)


def test_from_dict_missing_keys_keeps_its_message():
    with pytest.raises(ValueError, match=r"AcceptanceStats\.from_dict: missing num_steps"):
        AcceptanceStats.from_dict({})


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("[" * 100_000 + "]" * 100_000, ValueError),
        ('{"a": ' * 50_000 + "1" + "}" * 50_000, ValueError),
        ("{", ValueError),
        ("[1, 2]", TypeError),
        (5, TypeError),
        (None, TypeError),
        ('{"num_steps": 1' + "0" * 5000 + "}", ValueError),
    ],
)
def test_from_json_of_corrupt_text_is_a_clean_error(text, error):
    with pytest.raises(error):
        AcceptanceStats.from_json(text)


def test_from_json_accepts_bytes():
    s = some_stats()
    assert AcceptanceStats.from_json(s.to_json().encode()) == s


def test_constructor_validates_like_from_dict():
    with pytest.raises(InputError, match="num_steps"):
        AcceptanceStats(num_steps=-3)
    with pytest.raises(TypeError, match="num_steps"):
        AcceptanceStats(num_steps=1.0)


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        (lambda: specaccept.expected_tokens_per_step(0.5, 2**200), 2.0),
        (lambda: specaccept.expected_tokens_per_step(0.5, 2**2000), 2.0),
        (lambda: specaccept.expected_tokens_per_step(1.0, 2**64), float(2**64 + 1)),
        (lambda: specaccept.expected_speedup(0.5, 2**64, 0.0), 2.0),
        (lambda: specaccept.expected_speedup(1.0, 2**1100, 1e-300), 1e300),
        (lambda: specaccept.expected_speedup(0.5, 2**2000, 0.1), 0.0),
        (lambda: specaccept.expected_speedup(1.0, 2**52, 1e300), 2**52 / (2**52 * 1e300)),
    ],
)
def test_closed_forms_with_huge_ints_are_correct(call, expected):
    assert call() == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(
    ("call", "error", "name"),
    [
        (lambda: specaccept.expected_tokens_per_step(2**2000, 1), ValueError, "a"),
        (lambda: specaccept.expected_tokens_per_step(1.0, 2**1100), ValueError, "k"),
        (lambda: specaccept.expected_speedup(1.0, 2**1100, 0.0), ValueError, "k"),
        (lambda: specaccept.expected_speedup(0.5, 1, 2**2000), ValueError, "c"),
        (lambda: specaccept.expected_speedup(0.5, 1, "a"), TypeError, "c"),
        (lambda: specaccept.expected_speedup(0.5, 1, None), TypeError, "c"),
        (lambda: specaccept.expected_speedup(0.5, 1, True), TypeError, "c"),
        (lambda: specaccept.expected_speedup(0.5, 1, float("nan")), ValueError, "c"),
        (lambda: specaccept.expected_speedup(0.5, 1, -1), ValueError, "c"),
        (lambda: specaccept.best_num_draft_tokens(0.5, float("inf")), ValueError, "c"),
        (lambda: specaccept.best_num_draft_tokens(float("nan"), 0.1), ValueError, "a"),
        (lambda: specaccept.best_num_draft_tokens(0.5, 0.1, True), TypeError, "max_k"),
        (lambda: specaccept.best_num_draft_tokens(0.5, 0.1, -1), ValueError, "max_k"),
        (lambda: specaccept.best_num_draft_tokens(0.5, 0.1, 1.5), TypeError, "max_k"),
    ],
)
def test_closed_forms_refuse_bad_arguments_by_name(call, error, name):
    with pytest.raises(error, match=rf"\b{name}\b"):
        call()


def brute_force(a: float, c: float, max_k: int) -> int:
    values = [specaccept.expected_speedup(a, k, c) for k in range(max_k + 1)]
    return values.index(max(values))


@pytest.mark.parametrize(
    ("a", "c", "max_k"),
    [
        (0.5, 0.1, 2**62),
        (0.99, 0.0, 2**62),
        (1.0, 0.0, 2**62),
        (1.0, 0.01, 2**62),
        (1.0, 1.0, 2**62),
        (0.0, 0.1, 2**62),
        (0.0, 0.0, 2**200),
        (0.9999999, 1e-9, 10**8),
        (1 - 2**-53, 5e-324, 2**200),
        (0.999, 2.0, 10**9),
    ],
)
def test_best_num_draft_tokens_returns_quickly_for_a_huge_max_k(a, c, max_k):
    start = time.perf_counter()
    best = specaccept.best_num_draft_tokens(a, c, max_k)
    assert time.perf_counter() - start < 0.5
    assert 0 <= best <= max_k
    if a == 1.0:
        assert best == (max_k if c < 1 else 0)
    elif a == 0.0 or c >= 1:
        assert best == 0
    else:  # no k near the answer does better, and the answer beats both ends
        value = specaccept.expected_speedup(a, best, c)
        for k in range(max(0, best - 200), min(max_k, best + 200) + 1):
            assert specaccept.expected_speedup(a, k, c) <= value
        assert value >= specaccept.expected_speedup(a, max_k, c)
        assert value >= specaccept.expected_speedup(a, 0, c)


@pytest.mark.parametrize("max_k", [5000, 20_000])
@pytest.mark.parametrize(("a", "c"), [(0.999, 1e-4), (0.9999, 0.0), (0.8, 0.05), (0.9995, 1e-6)])
def test_best_num_draft_tokens_matches_the_brute_force_past_the_exhaustive_range(a, c, max_k):
    assert specaccept.best_num_draft_tokens(a, c, max_k) == brute_force(a, c, max_k)


# --------------------------------------------------------------------------
# _generate: bad arguments and misbehaving models
# --------------------------------------------------------------------------


class Uniform:
    """A model whose answer can be replaced by a hostile one."""

    def __init__(self, vocab: int = 5, answer=None, vocab_size=None):
        self.vocab = vocab
        self.vocab_size = vocab if vocab_size is None else vocab_size
        self.answer = answer

    def next_token_probs(self, sequences, num_positions):
        out = np.full((len(sequences), num_positions, self.vocab), 1.0 / self.vocab)
        return out if self.answer is None else self.answer(out)


class Proposer:
    """A Drafter whose proposal can be replaced by a hostile one."""

    vocab_size = 5

    def __init__(self, proposal):
        self.proposal = proposal

    def propose(self, sequences, k, rng, greedy):
        sequences[0].append(99)  # a careless drafter: must not reach the run's sequences
        return self.proposal(len(sequences), k)

    def next_token_probs(self, sequences, num_positions):
        return np.full((len(sequences), num_positions, 5), 0.2)


def run(target=None, draft=None, prompts=((1,), (2, 3)), **kwargs):
    kwargs = {"k": 2, "max_new_tokens": 4, "rng": 0, **kwargs}
    return specaccept.generate(target or Uniform(), draft or Uniform(), prompts, **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "error", "name"),
    [
        ({"k": "a"}, InputError, "k"),
        ({"k": 1.0}, TypeError, "k"),
        ({"k": True}, TypeError, "k"),
        ({"k": -1}, InputError, "k"),
        ({"max_new_tokens": -1}, InputError, "max_new_tokens"),
        ({"max_new_tokens": 2.0}, TypeError, "max_new_tokens"),
        ({"greedy": "yes"}, TypeError, "greedy"),
        ({"greedy": None}, TypeError, "greedy"),
        ({"eos_token_id": "a"}, TypeError, "eos_token_id"),
        ({"eos_token_id": [1, "a"]}, TypeError, r"eos_token_id\[1\]"),
        ({"eos_token_id": np.ones((2, 2), int)}, TypeError, "eos_token_id"),
        ({"progress": 5}, TypeError, "progress"),
        ({"prompts": "abc"}, TypeError, "prompts"),
        ({"prompts": None}, TypeError, "prompts"),
        ({"prompts": [None]}, TypeError, r"prompts\[0\]"),
        ({"prompts": [[1.5]]}, TypeError, r"prompts\[0\]\[0\]"),
        ({"prompts": [["a"]]}, TypeError, r"prompts\[0\]\[0\]"),
        ({"prompts": [[1], [True]]}, TypeError, r"prompts\[1\]\[0\]"),
        ({"prompts": [[1], [-1]]}, InputError, r"prompts\[1\]\[0\]"),
        ({"prompts": [[2**70]]}, InputError, r"prompts\[0\]\[0\]"),
        ({"target": object()}, TypeError, "target"),
        ({"draft": None, "target": None, "prompts": 5}, TypeError, "prompts"),
        ({"target": Uniform(vocab_size="a")}, TypeError, "target.vocab_size"),
        ({"target": Uniform(vocab_size=0)}, InputError, "target.vocab_size"),
        ({"target": Uniform(vocab_size=5.0)}, TypeError, "target.vocab_size"),
        ({"draft": Uniform(vocab=6)}, InputError, "vocabularies differ"),
    ],
)
def test_generate_refuses_bad_arguments_before_any_model_call(kwargs, error, name):
    class Counting(Uniform):
        calls = 0

        def next_token_probs(self, sequences, num_positions):
            Counting.calls += 1
            return super().next_token_probs(sequences, num_positions)

    kwargs = {"target": kwargs.get("target") or Counting(), **kwargs}
    with pytest.raises(error, match=name):
        run(**kwargs)
    assert Counting.calls == 0


def test_generate_with_a_draft_that_is_neither_model_nor_drafter_is_a_type_error():
    with pytest.raises(TypeError, match="draft"):
        specaccept.generate(Uniform(), 5, [[1]])


@pytest.mark.parametrize("max_new_tokens", [2**62, 2**70, np.uint64(2**64 - 1)])
def test_generate_with_a_huge_max_new_tokens_allocates_per_step(max_new_tokens):
    out = run(max_new_tokens=max_new_tokens, eos_token_id=0, prompts=[[1]])
    assert out.tokens[0][-1] == 0


@pytest.mark.parametrize("k", [2**62, 2**70])
def test_generate_with_a_huge_k_drafts_only_what_max_new_tokens_allows(k):
    assert len(run(k=k, max_new_tokens=3).tokens[0]) == 3


def test_generate_with_a_huge_k_and_max_new_tokens_is_a_memory_error_naming_k():
    with pytest.raises(MemoryError, match=r"^k: "):
        run(k=2**62, max_new_tokens=2**62)
    with pytest.raises(MemoryError, match=r"draft\.vocab_size"):
        run(target=Uniform(vocab_size=2**62), draft=Uniform(vocab_size=2**62))


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (lambda o: o[:, 0], InputError),  # 2-D
        (lambda o: o[:0], InputError),  # no rows
        (lambda o: o[:, :, :3], InputError),  # V too small
        (lambda o: np.concatenate([o, o], axis=1), InputError),  # extra positions
        (lambda o: o.astype(int), TypeError),
        (lambda o: o > 0, TypeError),
        (lambda o: o.astype(complex), TypeError),
        (lambda o: o.astype(object), TypeError),
        (lambda o: "abc", TypeError),
        (lambda o: None, TypeError),
        (lambda o: 0.5, InputError),
        (lambda o: [[1.0], [1.0, 2.0]], TypeError),  # ragged
    ],
)
@pytest.mark.parametrize("greedy", [False, True])
def test_a_draft_model_with_a_bad_answer_is_named(answer, error, greedy):
    with pytest.raises(error, match=r"draft\.next_token_probs") as caught:
        run(draft=Uniform(answer=answer), greedy=greedy)
    if error is InputError:
        assert caught.value.argument == "draft"


@pytest.mark.parametrize(
    ("answer", "error", "fragment"),
    [
        (lambda o: o[:, 0], InputError, r"target\.next_token_probs returned shape"),
        (lambda o: o[:, :, :3], InputError, r"target\.next_token_probs returned shape"),
        (lambda o: o[:, :1], InputError, r"target\.next_token_probs returned shape"),
        (lambda o: o.astype(int), TypeError, r"target\.next_token_probs"),
        (lambda o: None, TypeError, r"target\.next_token_probs"),
        (lambda o: "abc", TypeError, r"target\.next_token_probs"),
        (lambda o: o * np.nan, ValueError, r"target_probs\[0, 0, \d\] = nan"),
        (lambda o: -o, ValueError, r"target_probs\[0, 0, \d\] = -0\.2"),
    ],
)
@pytest.mark.parametrize("greedy", [False, True])
def test_a_target_model_with_a_bad_answer_is_named(answer, error, fragment, greedy):
    with pytest.raises(error, match=fragment):
        run(target=Uniform(answer=answer), greedy=greedy)


def test_an_exception_of_the_models_own_propagates():
    def raises(out):
        raise OwnError("the model's own")

    with pytest.raises(OwnError):
        run(target=Uniform(answer=raises))
    with pytest.raises(OwnError):
        run(draft=Uniform(answer=raises))


def good_tokens(batch, k):
    return np.zeros((batch, k), dtype=np.int64)


def good_probs(batch, k):
    return np.full((batch, k, 5), 0.2)


@pytest.mark.parametrize(
    ("proposal", "error", "fragment"),
    [
        (lambda b, k: (np.full((b, k), 9), good_probs(b, k)), InputError, "outside"),
        (lambda b, k: (np.full((b, k), -1), good_probs(b, k)), InputError, "outside"),
        (lambda b, k: (np.ones((b, k)), good_probs(b, k)), TypeError, "int tokens"),
        (lambda b, k: (np.zeros(b, dtype=int), good_probs(b, k)), InputError, "shape"),
        (lambda b, k: (good_tokens(b, k + 1), good_probs(b, k + 1)), InputError, "shape"),
        (lambda b, k: (None, None), TypeError, "int tokens"),
        (lambda b, k: (1, 2, 3), TypeError, "must return"),
        (lambda b, k: None, TypeError, "must return"),
        (lambda b, k: "ab", TypeError, "must return"),
        (lambda b, k: (good_tokens(b, k), None), TypeError, "probs"),
    ],
)
def test_a_drafter_with_a_bad_proposal_is_named(proposal, error, fragment):
    with pytest.raises(error, match=fragment) as caught:
        run(draft=Proposer(proposal))
    assert "draft" in str(caught.value)


def test_a_drafter_that_modifies_its_sequences_does_not_change_the_run():
    prompts = [[1], [2, 3]]
    out = run(draft=Proposer(lambda b, k: (good_tokens(b, k), good_probs(b, k))), prompts=prompts)
    assert prompts == [[1], [2, 3]]
    assert all(0 <= t < 5 for row in out.tokens for t in row)
    assert [len(t) for t in out.tokens] == [4, 4]


# --------------------------------------------------------------------------
# __main__: the command line refuses bad options with argparse's exit 2
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (["example", "--k", "0"], "--k"),
        (["example", "--k", str(2**62)], "--k"),
        (["example", "--batch", str(2**62)], "--batch"),
        (["example", "--batch", "-1"], "--batch"),
        (["example", "--seed", "-1"], "--seed"),
        (["example", "--seed", "1e3"], "--seed"),
        (["demo", "--k", str(2**62)], "--k"),
        (["demo", "--max-new-tokens", str(2**62)], "--max-new-tokens"),
        (["demo", "--max-new-tokens", "0"], "--max-new-tokens"),
        (["demo", "--samples", str(10**11)], "--samples"),
        (["demo", "--target-order", "0"], "--target-order"),
        (["demo", "--draft-order", str(10**9)], "--draft-order"),
        (["demo", "--seed", "-5"], "--seed"),
        (["demo", "--prompt", "   "], "--prompt"),
        (["check", "--samples", str(10**11)], "--samples"),
        (["check", "--show", "-5"], "--show"),
        (["check", "--k", str(2**62)], "--k"),
        (["demo", "--temperature", "-1"], "--temperature"),
        (["demo", "--top-p", "nan"], "--top-p"),
        (["demo", "--record", "/dev/null/steps.npz"], "--record"),
        (["demo", "--record", "."], "--record"),
        (["demo", "--tree", "2,0"], "--tree"),
        (["demo", "--tree", "a"], "--tree"),
        (["demo", "--model", "gpt"], "--model"),
        (["bench"], "bench"),
        (["--bogus"], "--bogus"),
    ],
)
def test_command_line_refuses_bad_options_with_exit_2(argv, option, capsys):
    from specaccept.__main__ import main

    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert option in err and "Traceback" not in err


def test_command_line_bad_option_in_a_child_process_has_no_traceback():
    run = subprocess.run(
        [sys.executable, "-m", "specaccept", "demo", "--max-new-tokens", str(2**62)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2 and "--max-new-tokens" in run.stderr
    assert "Traceback" not in run.stderr


# --------------------------------------------------------------------------
# ngram: the built-in models refuse bad arguments by name
# --------------------------------------------------------------------------


def small_model(order=2):
    from specaccept.ngram import NGramModel, Vocabulary, tokenize

    text = "the cat sat. the cat ran."
    vocab = Vocabulary.from_tokens(tokenize(text))
    return NGramModel(order, vocab.encode(text), vocab), vocab


@pytest.mark.parametrize(
    ("order", "error"),
    [(0, InputError), (65, InputError), (10**9, InputError), (1.5, TypeError), (True, TypeError)],
)
def test_ngram_order_is_checked_up_front(order, error):
    start = time.perf_counter()
    with pytest.raises(error, match="order"):
        small_model(order)
    assert time.perf_counter() - start < 1


def test_ngram_order_past_the_text_trains_quickly():
    model, _ = small_model(60)
    assert model.next_token_probs([[1, 2]], 1).shape == (1, 1, model.vocab_size)


@pytest.mark.parametrize(
    ("token_ids", "error"), [([-1, 2], InputError), ([99, 2], InputError), ([1.5], TypeError)]
)
def test_ngram_training_ids_are_checked(token_ids, error):
    from specaccept.ngram import NGramModel

    _, vocab = small_model()
    with pytest.raises(error, match="token_ids"):
        NGramModel(2, token_ids, vocab)


@pytest.mark.parametrize(
    ("num_positions", "error"),
    [(-1, InputError), (2**62, InputError), (1.5, TypeError), (None, TypeError)],
)
def test_ngram_next_token_probs_checks_before_allocating(num_positions, error):
    model, _ = small_model()
    with pytest.raises(error, match=r"num_positions|sequences"):
        model.next_token_probs([[1, 2]], num_positions)


@pytest.mark.parametrize(
    ("ids", "error"), [([99], InputError), ([-1], InputError), ([1.5], TypeError)]
)
def test_vocabulary_decode_refuses_ids_outside_it(ids, error):
    _, vocab = small_model()
    with pytest.raises(error, match=r"ids\[0\]"):
        vocab.decode(ids)


@pytest.mark.parametrize("text", ["nope", b"\xff\xfe{", '{"num_steps": 1' + "0" * 5000 + "}"])
def test_from_json_errors_are_input_errors_naming_the_text(text):
    with pytest.raises(InputError) as error:
        AcceptanceStats.from_json(text)
    assert error.value.argument == "text"


def test_from_dict_missing_keys_names_the_first():
    with pytest.raises(InputError) as error:
        AcceptanceStats.from_dict({})
    assert error.value.argument == "num_steps"


# --------------------------------------------------------------------------
# compat.flashinfer: the count buffers it adds into
# --------------------------------------------------------------------------


def flashinfer_call(**changes):
    from specaccept.compat import flashinfer

    args = dict(
        draft_probs=np.array([[[0.1, 0.2, 0.3, 0.4], [0.2, 0.3, 0.4, 0.1]]]),
        draft_token_ids=np.array([[2, 1]], dtype=np.int64),
        uniform_samples=np.array([[0.8823, 0.9150, 0.3829]]),
        target_probs=np.array([[[0.0, 0.1, 0.6, 0.3], [1.0, 0.0, 0.0, 0.0], [0.7, 0.1, 0.1, 0.1]]]),
    )
    args.update(changes)
    return flashinfer.chain_speculative_sampling(**args), args


@pytest.mark.parametrize(
    "alias",
    [
        lambda a: a["draft_token_ids"][:, 0],
        lambda a: a["draft_token_ids"].ravel()[1:],
        lambda a: a["draft_token_ids"].view(np.int64)[0, :1],
    ],
)
@pytest.mark.parametrize(
    "which", ["maybe_output_accepted_token_num", "maybe_output_emitted_draft_token_num"]
)
def test_flashinfer_count_buffer_aliasing_the_ids_is_refused_naming_both(alias, which):
    from specaccept.compat import flashinfer

    ids = np.array([[2, 1]], dtype=np.int64)
    args = dict(
        draft_probs=np.array([[[0.1, 0.2, 0.3, 0.4], [0.2, 0.3, 0.4, 0.1]]]),
        draft_token_ids=ids,
        uniform_samples=np.array([[0.8823, 0.9150, 0.3829]]),
        target_probs=np.array([[[0.0, 0.1, 0.6, 0.3], [1.0, 0.0, 0.0, 0.0], [0.7, 0.1, 0.1, 0.1]]]),
    )
    args[which] = alias(args)
    with pytest.raises(InputError, match=rf"{which} shares memory with draft_token_ids") as error:
        flashinfer.chain_speculative_sampling(**args)
    assert error.value.argument == which
    assert ids.tolist() == [[2, 1]], "the input is unchanged"


def test_flashinfer_count_buffers_aliasing_each_other_or_the_uniforms_are_refused():
    shared = np.zeros(1, dtype=np.int64)
    with pytest.raises(InputError, match="shares memory with maybe_output_accepted_token_num"):
        flashinfer_call(
            maybe_output_accepted_token_num=shared, maybe_output_emitted_draft_token_num=shared
        )
    assert shared.tolist() == [0], "nothing written when the second buffer is refused"
    u = np.array([[0.8823, 0.9150, 0.3829]])
    with pytest.raises(InputError, match="shares memory with uniform_samples"):
        flashinfer_call(uniform_samples=u, maybe_output_accepted_token_num=u[0, :1].view(np.int64))


def test_flashinfer_refusing_the_second_buffer_leaves_the_first_unchanged():
    first = np.array([10], dtype=np.int64)
    with pytest.raises(InputError, match="maybe_output_emitted_draft_token_num"):
        flashinfer_call(
            maybe_output_accepted_token_num=first,
            maybe_output_emitted_draft_token_num=np.zeros(2, dtype=np.int64),
        )
    assert first.tolist() == [10]


@pytest.mark.parametrize(
    ("buffer", "error"),
    [
        (np.zeros(1), TypeError),
        ("counts", TypeError),
        (np.zeros(2, dtype=np.int64), InputError),
        (np.zeros((1, 1), dtype=np.int64), InputError),
    ],
)
def test_flashinfer_count_buffer_of_the_wrong_kind_is_named(buffer, error):
    with pytest.raises(error, match="maybe_output_accepted_token_num"):
        flashinfer_call(maybe_output_accepted_token_num=buffer)


def test_flashinfer_read_only_count_buffer_is_an_input_error():
    buffer = np.zeros(1, dtype=np.int64)
    buffer.flags.writeable = False
    with pytest.raises(InputError, match="read-only"):
        flashinfer_call(maybe_output_accepted_token_num=buffer)


def test_flashinfer_values_verify_does_not_read_are_checked_for_the_non_causal_count():
    # Position 0 is rejected (p(x_0) = 0), so verify never reads position 1; the
    # non-causal count does, and names the bad p(x_1) as target_probs.
    p = np.array([[[0.1, 0.1, 0.0, 0.8], [0.0, 1.5, 0.0, 0.0], [0.7, 0.1, 0.1, 0.1]]])
    with pytest.raises(InputError, match=r"target_probs\[0, 1, 1\] = 1\.5") as error:
        flashinfer_call(target_probs=p)
    assert (error.value.argument, error.value.index, error.value.row) == (
        "target_probs",
        (0, 1, 1),
        0,
    )
    p[0, 1, 1] = 0.5
    with pytest.raises(InputError, match=r"uniform_samples\[0, 1\]") as error:
        flashinfer_call(target_probs=p, uniform_samples=np.array([[0.5, np.nan, 0.5]]))
    assert error.value.argument == "uniform_samples"


@pytest.mark.parametrize(
    ("changes", "argument"),
    [
        ({"draft_token_ids": np.array([0])}, "draft_token_ids"),
        ({"uniform_samples": np.zeros((1, 2))}, "uniform_samples"),
    ],
)
def test_flashinfer_shape_errors_are_input_errors(changes, argument):
    with pytest.raises(InputError) as error:
        flashinfer_call(**changes)
    assert error.value.argument == argument


def test_flashinfer_names_a_bad_recovery_column_as_uniform_samples():
    with pytest.raises(InputError, match=r"uniform_samples\[0, 2\] = 1\.5") as error:
        flashinfer_call(uniform_samples=np.array([[0.5, 0.5, 1.5]]))
    assert (error.value.argument, error.value.index, error.value.row) == (
        "uniform_samples",
        (0, 2),
        0,
    )


# --------------------------------------------------------------------------
# reference: the native exception types, InputError's attributes, sizes first
# --------------------------------------------------------------------------


def chain_batch():
    rng = np.random.default_rng(0)
    p = rng.random((2, 4, 5)) + 0.1
    q = rng.random((2, 3, 5)) + 0.1
    return (
        np.array([[0, 1, 2], [3, 4, 0]]),
        p / p.sum(-1, keepdims=True),
        q / q.sum(-1, keepdims=True),
    )


def changed(array, index, value):
    array = array.astype(float if array.dtype.kind == "f" else array.dtype, copy=True)
    array[index] = value
    return array


def outcome_of(fn, *args, **kwargs):
    try:
        result = fn(*args, **kwargs)
    except (TypeError, ValueError, MemoryError) as error:
        if isinstance(error, ValueError):
            assert isinstance(error, InputError), f"a bare {type(error).__name__}: {error}"
            return ("InputError", error.argument, error.index, error.row)
        return (type(error).__name__,)
    if isinstance(result, Verification):
        return (
            "ok",
            np.asarray(result.output_token_ids).tolist(),
            np.asarray(result.num_emitted).tolist(),
            sorted((b, e.argument, e.index) for b, e in result.errors.items()),
        )
    return ("ok", np.asarray(result).tolist())


IDS, P, Q = chain_batch()
L = np.log(P)
HUGE = np.broadcast_to(np.int64(0), (1, 2**40))
PARITY = {
    "verify: id >= V": ("verify", (changed(IDS, (1, 1), 5), P, Q), {"rng": 0}),
    "verify: NaN p, greedy": ("verify", (IDS, changed(P, (0, 0, 1), np.nan)), {"greedy": True}),
    "verify: p above 1": ("verify", (IDS, changed(P, (0, 0, 0), 2.0), Q), {"rng": 0}),
    "verify: row sums to 0": ("verify", (IDS, np.zeros((2, 4, 5))), {"rng": 0}),
    "verify: rows of 1e308": ("verify", (IDS, np.full((2, 4, 5), 1e308), Q), {"rng": 0}),
    "verify: subnormal rows": (
        "verify",
        (IDS, np.full((2, 4, 5), 5e-324), np.full((2, 3, 5), 5e-324)),
        {"rng": 0},
    ),
    "verify: q = 0": ("verify", (IDS, P, np.zeros((2, 3, 5))), {"rng": 0}),
    "verify: count above K": ("verify", (IDS, P, Q), {"num_draft_tokens": np.array([4, 0])}),
    "verify: uint64 count": (
        "verify",
        (IDS, P, Q),
        {"num_draft_tokens": np.array([2**64 - 1, 0], np.uint64), "rng": 0},
    ),
    "verify: uniform 1.0": (
        "verify",
        (IDS, P, Q),
        {"uniforms": np.ones((2, 3)), "recovery_uniforms": np.zeros(2)},
    ),
    "verify: negative seed": ("verify", (IDS, P, Q), {"rng": -1}),
    "verify: rng str": ("verify", (IDS, P, Q), {"rng": "seed"}),
    "verify: target shape": ("verify", (IDS, P[:, :3]), {"rng": 0}),
    "verify: 1-D ids": ("verify", (IDS[0], P), {"rng": 0}),
    "verify: isolate a bad id": (
        "verify",
        (changed(IDS, (1, 1), 5), P, Q),
        {"rng": 0, "errors": "isolate"},
    ),
    "verify: isolate NaN, greedy": (
        "verify",
        (IDS, changed(P, (0, 0, 1), np.nan)),
        {"greedy": True, "errors": "isolate"},
    ),
    "verify: errors bogus": ("verify", (IDS, P, Q), {"rng": 0, "errors": "bogus"}),
    "verify: errors int": ("verify", (IDS, P, Q), {"rng": 0, "errors": 1}),
    "verify: huge stride-0 ids": (
        "verify",
        (HUGE, np.broadcast_to(0.5, (1, 2**40 + 1, 1))),
        {"rng": 0},
    ),
    "verify: huge stride-0 vocabulary": (
        "verify",
        (np.zeros((1, 1), np.int64), np.broadcast_to(0.5, (1, 2, 2**50))),
        {"greedy": True},
    ),
    "verify_greedy: negative id": (
        "verify_greedy",
        (changed(IDS, (0, 1), -2), np.zeros((2, 4), int)),
        {},
    ),
    "verify_greedy: uint64 id": (
        "verify_greedy",
        (np.array([[2**63 + 5, 1]], np.uint64), np.zeros((1, 3), int)),
        {},
    ),
    "verify_greedy: huge stride-0": (
        "verify_greedy",
        (HUGE, np.broadcast_to(np.int64(0), (1, 2**40 + 1))),
        {},
    ),
    "verify_tree: forward parent": (
        "verify_tree",
        (np.array([[0, 1, 2, 0]]), np.array([-1, 0, 3, 2]), np.full((1, 4, 3), 1 / 3)),
        {"rng": 0},
    ),
    "verify_tree: huge batch, wrong shape": (
        "verify_tree",
        (np.broadcast_to(np.int64(0), (2**40, 1)), np.array([-1]), np.full((1, 1, 2), 0.5)),
        {"greedy": True},
    ),
    "verify_tree: huge stride-0 vocabulary": (
        "verify_tree",
        (np.zeros((1, 2), np.int64), np.array([-1, 0]), np.broadcast_to(2.0**-50, (1, 2, 2**50))),
        {"greedy": True},
    ),
    "verify_logits: target shape": ("verify_logits", (IDS, L[:, :2]), {"rng": 0}),
    "verify_logits: NaN logit": ("verify_logits", (IDS, changed(L, (0, 0, 1), np.nan)), {"rng": 0}),
    "verify_logits: temperature str": ("verify_logits", (IDS, L), {"temperature": "hot", "rng": 0}),
    "verify_logits: temperature 2**2000": (
        "verify_logits",
        (IDS, L),
        {"temperature": 2**2000, "rng": 0},
    ),
    "verify_logits: temperature bool": ("verify_logits", (IDS, L), {"temperature": True}),
    "verify_logits: top_k float": ("verify_logits", (IDS, L), {"top_k": 2.5, "rng": 0}),
    "verify_logits: top_k 2**64": ("verify_logits", (IDS, L), {"top_k": 2**64, "rng": 0}),
    "verify_logits: top_p 0": ("verify_logits", (IDS, L), {"top_p": 0.0, "rng": 0}),
    "verify_logits: top_p of the wrong length": (
        "verify_logits",
        (IDS, L),
        {"top_p": np.array([0.5]), "rng": 0},
    ),
    "verify_logits: isolate": (
        "verify_logits",
        (IDS, changed(L, (1, 0, 1), np.nan)),
        {"rng": 0, "errors": "isolate"},
    ),
    "verify_logits: huge stride-0 vocabulary": (
        "verify_logits",
        (np.zeros((1, 1), np.int64), np.broadcast_to(0.0, (1, 2, 2**50))),
        {"rng": 0},
    ),
    "rejection_probability: 2**2000": ("rejection_probability", (2**2000, 0.5), {}),
    "rejection_probability: NaN in a 2-D array": (
        "rejection_probability",
        (np.array([[0.5, 0.2]]), np.array([[0.1, np.nan]])),
        {},
    ),
    "rejection_probability: no broadcast": (
        "rejection_probability",
        (np.zeros(3), np.zeros(4)),
        {},
    ),
    "rejection_probability: huge stride-0": (
        "rejection_probability",
        (np.broadcast_to(0.5, (2**40,)), 0.5),
        {},
    ),
    "acceptance_mask: uniform 1.0": ("acceptance_mask", (0.5, 0.6, 1.0), {}),
    "acceptance_mask: uniform 2**2000": ("acceptance_mask", (0.5, 0.6, 2**2000), {}),
    "acceptance_rate: huge stride-0 row": (
        "acceptance_rate",
        (np.broadcast_to(0.5, (1, 2**50)), np.broadcast_to(0.5, (1, 2**50))),
        {},
    ),
    "acceptance_rate: scalar": ("acceptance_rate", (np.float64(0.5), np.float64(0.5)), {}),
    "accepted_prefix_length: uint64 count": (
        "accepted_prefix_length",
        (np.ones((2, 2), bool), np.array([2**64 - 1, 0], np.uint64)),
        {},
    ),
    "accepted_prefix_length: huge stride-0 rows": (
        "accepted_prefix_length",
        (np.broadcast_to(np.True_, (2**40, 1)),),
        {},
    ),
}


@pytest.mark.parametrize("case", list(PARITY))
def test_reference_raises_what_the_native_code_raises(case):
    fn, args, kwargs = PARITY[case]
    start = time.perf_counter()
    expected = outcome_of(getattr(specaccept, fn), *args, **kwargs)
    got = outcome_of(getattr(reference, fn), *args, **kwargs)
    assert time.perf_counter() - start < 2, "sizes are checked before any loop"
    assert got == expected


def test_reference_input_error_keeps_its_message_and_names_the_row():
    with pytest.raises(InputError) as error:
        reference.verify(changed(IDS, (1, 1), 5), P, Q, rng=0)
    assert str(error.value) == "draft_token_ids[1, 1] = 5 is outside [0, V) with V = 5"
    assert (error.value.argument, error.value.index, error.value.row) == (
        "draft_token_ids",
        (1, 1),
        1,
    )
    with pytest.raises(InputError) as error:
        reference.verify(IDS, np.zeros((2, 4, 5)), rng=0)
    assert str(error.value) == "target_probs[0, 0] sums to 0, but a token must be sampled from it"
    assert (error.value.argument, error.value.index, error.value.row) == ("target_probs", (0, 0), 0)
    with pytest.raises(InputError) as error:
        reference.verify_logits(IDS, L, top_p=np.array([0.5, 2.0]), rng=0)
    assert str(error.value) == "top_p[1] = 2.0: top_p must lie in (0, 1]"
    assert (error.value.argument, error.value.index, error.value.row) == ("top_p", (1,), 1)


def test_reference_huge_outputs_are_memory_errors_naming_the_argument():
    with pytest.raises(MemoryError, match=r"output_token_ids.*draft_token_ids"):
        reference.verify_greedy(HUGE, np.broadcast_to(np.int64(0), (1, 2**40 + 1)))
    with pytest.raises(MemoryError, match=r"^target_prob: "):
        reference.acceptance_mask(np.broadcast_to(0.5, (2**40,)), 0.5, 0.1)
    with pytest.raises(MemoryError, match=r"^target_probs: "):
        reference.verify(np.zeros((1, 1), np.int64), np.broadcast_to(0.5, (1, 2, 2**50)), rng=0)


def test_reference_accepted_prefix_length_of_a_broadcast_row_is_immediate():
    mask = np.broadcast_to(np.True_, (2, 2**40))
    assert reference.accepted_prefix_length(mask, np.array([2**40, 5])).tolist() == [2**40, 5]


def test_reference_with_per_row_generators_names_a_bad_count_in_its_row():
    rngs = [np.random.default_rng(0), np.random.default_rng(1)]
    with pytest.raises(InputError) as error:
        reference.verify(IDS, P, Q, rng=rngs, num_draft_tokens=np.array([3, 9]))
    assert (error.value.argument, error.value.row) == ("num_draft_tokens", 1)


# --------------------------------------------------------------------------
# hf: arguments checked by name (a stub stands in for torch, which is not needed to refuse)
# --------------------------------------------------------------------------


class StubModel:
    config = type("Config", (), {"vocab_size": 7})()

    def __call__(self, **kwargs):
        return self.forward(**kwargs)

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None):
        raise AssertionError("the model must not run")

    def eval(self):
        return self

    def get_output_embeddings(self):
        return type("Head", (), {"weight": np.zeros((7, 4))})()


@pytest.mark.parametrize("model", [object(), 5, "gpt2", None])
def test_hf_model_refuses_what_is_not_a_causal_lm(model, monkeypatch):
    import types

    monkeypatch.setitem(sys.modules, "torch", sys.modules.get("torch") or types.ModuleType("torch"))
    from specaccept.generation.hf import HFModel

    assert HFModel(StubModel()).vocab_size == 7
    with pytest.raises(TypeError, match="model must be a transformers causal LM"):
        HFModel(model)


@pytest.mark.parametrize(
    ("config", "fragment"),
    [
        ({"layer_types": ["full_attention", "linear_attention"]}, "linear_attention layers"),
        ({"_attn_implementation": "flash_attention_2"}, "attn_implementation='sdpa'"),
    ],
)
def test_hf_model_refuses_caches_it_cannot_roll_back(config, fragment, monkeypatch):
    import types

    monkeypatch.setitem(sys.modules, "torch", sys.modules.get("torch") or types.ModuleType("torch"))
    from specaccept.generation.hf import HFModel

    model = StubModel()
    model.config = type("Config", (), {"vocab_size": 7, **config})()
    with pytest.raises(InputError, match=fragment) as error:
        HFModel(model)
    assert error.value.argument == "model"


@pytest.mark.parametrize(
    ("num_positions", "error"), [(0, InputError), (5, InputError), (1.0, TypeError)]
)
def test_hf_model_next_token_probs_checks_before_running_the_model(
    num_positions, error, monkeypatch
):
    import types

    monkeypatch.setitem(sys.modules, "torch", sys.modules.get("torch") or types.ModuleType("torch"))
    from specaccept.generation.hf import HFModel

    with pytest.raises(error, match=r"num_positions|sequences"):
        HFModel(StubModel()).next_token_probs([[1, 2]], num_positions)
    with pytest.raises(InputError, match="tokenizer"):
        HFModel(StubModel()).decode([1])


def test_array_interface_numpy_refuses_is_an_input_error_naming_the_argument():
    class NoData:
        __array_interface__ = {"shape": (2**40, 2**20), "typestr": "<i8", "version": 3}  # noqa: RUF012

    with pytest.raises(InputError, match="draft_token_ids") as error:
        specaccept.verify(NoData(), P, rng=0)
    assert error.value.argument == "draft_token_ids"

    class OwnValueError(ValueError):
        pass

    class Raises:
        def __array__(self, dtype=None, copy=None):
            raise OwnValueError("mine")

    with pytest.raises(OwnValueError):
        as_numpy(Raises(), "x")


# --------------------------------------------------------------------------
# generate: session models whose sessions answer wrongly are named
# --------------------------------------------------------------------------


class SessionModel:
    """A session model over ``Uniform`` whose ``session()`` can be replaced by a hostile one."""

    vocab_size = 5

    def __init__(self, opened=None):
        self.opened = opened

    def session(self, prefixes):
        from specaccept.generation import StatelessSession

        if self.opened is not None:
            return self.opened(prefixes)
        return StatelessSession(Uniform(), prefixes)


@pytest.mark.parametrize("which", ["target", "draft"])
@pytest.mark.parametrize(
    ("opened", "error", "fragment"),
    [
        (lambda prefixes: None, TypeError, r"session must return a Session"),
        (lambda prefixes: object(), TypeError, r"session must return a Session"),
        (
            lambda prefixes: __import__("specaccept").generation.StatelessSession(
                Uniform(), prefixes[:1]
            ),
            InputError,
            r"session of 1 rows for 2 prompts",
        ),
        (
            lambda prefixes: __import__("specaccept").generation.StatelessSession(
                Uniform(vocab=6), prefixes
            ),
            InputError,
            r"over 6 tokens, the model 5",
        ),
    ],
)
def test_a_session_model_answering_wrongly_is_named(which, opened, error, fragment):
    models = {"target": SessionModel(), "draft": SessionModel()}
    models[which] = SessionModel(opened)
    with pytest.raises(error, match=fragment) as caught:
        run(**models, prompts=[[1], [2, 3]])
    assert which in str(caught.value)
    if error is InputError:
        assert caught.value.argument == which


def test_session_models_run_the_loop():
    out = run(target=SessionModel(), draft=SessionModel(), prompts=[[1], [2, 3]], tree=[2])
    assert [len(t) for t in out.tokens] == [4, 4]


class FlakyProposer:
    """A Drafter that raises, or answers out of the vocabulary, for sequences that
    start with 3 (a prompt's mark: what is generated does not change it)."""

    vocab_size = 5

    def __init__(self, mode):
        self.mode = mode

    def propose(self, sequences, k, rng, greedy):
        tokens = np.zeros((len(sequences), k), dtype=np.int64)
        bad = [s[0] == 3 for s in sequences]
        if any(bad):
            if self.mode == "raise":
                raise RuntimeError("poisoned request")
            tokens[bad] = 7
        return tokens, np.full((len(sequences), k, 5), 0.2)


@pytest.mark.parametrize("mode", ["raise", "outside"])
@pytest.mark.parametrize("randomness", [dict(rng=0), dict(rng=None, seed=3)])
def test_a_drafter_failing_for_one_request_ends_it_alone_with_isolate(mode, randomness):
    prompts = [[1, 2], [3, 4], [0]]
    out = run(draft=FlakyProposer(mode), prompts=prompts, errors="isolate", **randomness)
    assert set(out.errors) == {1} and out.stop_reasons[1] == "error"
    assert [len(t) for t in out.tokens] == [4, 0, 4]
    with pytest.raises(RuntimeError if mode == "raise" else InputError) as error:
        run(draft=FlakyProposer(mode), prompts=prompts, **randomness)
    if mode == "outside" and "seed" in randomness:
        assert error.value.row == 1 and "request row 1" in str(error.value)


def test_a_prompt_token_past_the_vocabulary_is_named_before_any_model_call():
    class Counting(Uniform):
        calls = 0

        def next_token_probs(self, sequences, num_positions):
            Counting.calls += 1
            return super().next_token_probs(sequences, num_positions)

    with pytest.raises(InputError, match=r"prompts\[1\]\[1\] = 5 is outside the vocabulary") as e:
        run(target=Counting(), prompts=[[1], [2, 5]])
    assert (e.value.argument, e.value.index, e.value.row) == ("prompts", (1, 1), 1)
    assert Counting.calls == 0
    out = run(prompts=[[1], [2, 5]], errors="isolate")
    assert list(out.errors) == [1] and len(out.tokens[0]) == 4


def test_recording_pads_to_the_widest_step_not_k(tmp_path):
    from specaccept.lab import load_steps

    out = run(k=2**62, max_new_tokens=3, record=tmp_path / "a.npz")
    ids, p, q, counts = load_steps(str(tmp_path / "a.npz"))
    assert ids.shape[1] == 2 and p.shape[1] == 3 and q.shape[1] == 2
    assert counts.sum() == out.stats.total_draft_tokens


@pytest.mark.parametrize(
    ("record", "fragment"),
    [
        ("a\0b.npz", "NUL"),
        ("x" * 300 + ".npz", "longer than"),
        ("no/such/folder/a.npz", "does not exist"),
        (".", "is a folder"),
    ],
)
def test_a_record_path_that_cannot_be_written_is_refused_before_any_model_call(
    tmp_path, record, fragment
):
    path = record if record == "." else str(tmp_path / record)
    with pytest.raises(InputError, match=fragment) as error:
        run(record=path)
    assert error.value.argument == "record"


@pytest.mark.parametrize("kwargs", [dict(k=0), dict(max_new_tokens=1)])
def test_a_recorded_run_that_drafted_nothing_is_refused(tmp_path, kwargs):
    with pytest.raises(InputError, match="verified no drafted token") as error:
        run(record=tmp_path / "a.npz", **kwargs)
    assert error.value.argument == "record"
