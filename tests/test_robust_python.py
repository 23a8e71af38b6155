"""Hostile inputs to the Python layer (issue 13): every call ends in a valid result,
a ``TypeError``, a ``ValueError`` (an :class:`specaccept.InputError` where an
argument is named) or a clean ``MemoryError``; never an ``IndexError``,
``AttributeError``, ``OverflowError``, ``RecursionError``, ``ZeroDivisionError``, a
hang, or a modified input."""

from __future__ import annotations

import numpy as np
import pytest
import specaccept
from specaccept import InputError, reference
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
