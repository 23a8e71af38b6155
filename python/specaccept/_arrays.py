"""Arrays in from any framework without a copy; results out as the caller's type.

Inputs: a NumPy array is used as it is. Any other object that exports DLPack
(PyTorch, JAX, CuPy host arrays, ...) is viewed through ``numpy.from_dlpack``,
and one that exposes the buffer protocol or ``__array_interface__`` through
``numpy.asarray``: the same memory, no copy. An array on an accelerator is
refused with a ``TypeError`` instead of being copied to the host behind the
caller's back. Anything else (lists, scalars) is left for the caller's own
checks to refuse.

Outputs: ``like=`` names the framework results come back in (a tensor or array
of that framework, as NumPy's own ``like=``): NumPy arrays are returned as they
are, a ``torch.Tensor`` gets ``torch.from_numpy`` views, an array-API array
(JAX, CuPy, ...) its namespace's ``from_dlpack``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ._errors import InputError

__all__ = ["as_numpy", "like_converter"]

# DLPack device types whose memory the CPU reads directly: CPU, CUDA pinned
# host memory, ROCm pinned host memory.
_HOST_DEVICES = {1: "cpu", 3: "cuda_host", 11: "rocm_host"}
_DEVICE_NAMES = {
    2: "cuda",
    4: "opencl",
    7: "vulkan",
    8: "metal",
    9: "vpi",
    10: "rocm",
    12: "ext_dev",
    13: "cuda_managed",
    14: "oneapi",
    15: "webgpu",
    16: "hexagon",
}


def _device_type(x: Any, name: str) -> int:
    """The DLPack device type of ``x`` (1, the CPU, when it does not say).

    ``__dlpack_device__()`` must return ``(device_type, device_id)``, two ints;
    anything else is a ``TypeError`` naming ``name``. An exception raised by the
    object's own method propagates as it is.
    """
    method = getattr(x, "__dlpack_device__", None)
    if method is None:
        return 1
    device = method() if callable(method) else method
    if (
        not callable(method)
        or not isinstance(device, tuple)
        or len(device) != 2
        or not all(isinstance(v, (int, np.integer)) for v in device)
        or any(isinstance(v, (bool, np.bool_)) for v in device)
    ):
        raise TypeError(
            f"{name}: __dlpack_device__() must return (device_type, device_id), two ints, "
            f"got {device!r:.80}"
        )
    return int(device[0])


def as_numpy(x: Any, name: str) -> Any:
    """``x`` as a NumPy array sharing its memory, or ``x`` itself if it is not an array.

    Raises ``TypeError`` naming ``name`` for arrays that cannot be read in place:
    on an accelerator, requiring grad, or of a dtype NumPy lacks (bfloat16).
    """
    if isinstance(x, np.ndarray):
        return x
    if hasattr(type(x), "__dlpack__"):
        device = _device_type(x, name)
        if device not in _HOST_DEVICES:
            where = _DEVICE_NAMES.get(device, f"DLPack device type {device}")
            raise TypeError(
                f"{name} is on a {where} device: move it to the CPU first (e.g. tensor.cpu()); "
                "specaccept reads memory in place and does not copy behind your back"
            )
        try:
            return np.from_dlpack(x)
        except (BufferError, RuntimeError, TypeError, ValueError) as error:
            raise TypeError(
                f"{name} cannot be read in place as a NumPy array: {error} "
                "(convert it first, e.g. tensor.detach() or tensor.float())"
            ) from None
    if hasattr(x, "__array_interface__") or hasattr(x, "__array__") or _exports_buffer(x):
        # The buffer and array-interface protocols share memory; ``__array__``
        # does when the object allows it. An interface without a data pointer
        # makes NumPy allocate the whole described array: refused by name.
        try:
            return np.asarray(x)
        except MemoryError as error:
            raise InputError(
                f"{name} describes an array NumPy cannot allocate ({error}); "
                "pass an array backed by memory",
                argument=name,
            ) from None
        except ValueError as error:
            if type(error) is not ValueError:
                raise  # the object's own exception, as it is
            # NumPy refusing what the object describes (a garbage interface, a
            # size past any array): named.
            raise InputError(
                f"{name} cannot be read as an array: {error}", argument=name
            ) from error
    return x


def _exports_buffer(x: Any) -> bool:
    if isinstance(x, (str, int, float, complex, bool)):
        return False
    try:
        memoryview(x).release()
    except TypeError:
        return False
    return True


def like_converter(like: Any) -> Callable[[np.ndarray], Any] | None:
    """How to hand a NumPy result back in ``like``'s framework (``None``: as NumPy)."""
    if like is None or isinstance(like, np.ndarray):
        return None
    if type(like).__module__.split(".")[0] == "torch":
        import torch

        return torch.from_numpy
    namespace = getattr(like, "__array_namespace__", None)
    if namespace is not None:
        # Checked up front, so an unusable like= fails before any work.
        try:
            from_dlpack = getattr(namespace(), "from_dlpack", None)
        except Exception as error:
            raise TypeError(
                f"like: {type(like).__name__}.__array_namespace__() failed: "
                f"{type(error).__name__}: {error}"
            ) from error
        if not callable(from_dlpack):
            raise TypeError(
                f"like: the array namespace of {type(like).__name__} has no from_dlpack, "
                "so results cannot be handed back in its framework"
            )
        return from_dlpack
    raise TypeError(
        "like must be None, a numpy.ndarray, a torch.Tensor or an array-API array "
        f"(JAX, CuPy, ...), got {type(like).__name__}"
    )
