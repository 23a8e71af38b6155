"""Hostile inputs to the Python layer (issue 13): every call ends in a valid result,
a ``TypeError``, a ``ValueError`` (an :class:`specaccept.InputError` where an
argument is named) or a clean ``MemoryError``; never an ``IndexError``,
``AttributeError``, ``OverflowError``, ``RecursionError``, ``ZeroDivisionError``, a
hang, or a modified input."""

from __future__ import annotations

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
    with pytest.raises(TypeError, match="batch_size|num_draft"):
        Verification.empty(*sizes)


def test_empty_of_zero_rows_or_zero_drafts():
    assert Verification.empty(0, 3).output_token_ids.shape == (0, 4)
    assert Verification.empty(2, 0).output_token_ids.shape == (2, 1)
