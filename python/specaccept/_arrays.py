"""Arrays in from any framework without a copy; results out as the caller's type.

``float_array``, ``int_array`` and ``bool_array`` give an argument as an array of
a dtype the native code reads in place, converting only what must be (another
dtype of the same kind, byte order, alignment), and name the argument when it
cannot be.

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

__all__ = [
    "as_numpy",
    "bool_array",
    "float_array",
    "int_array",
    "is_bfloat16",
    "is_float",
    "like_converter",
]

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

    A bfloat16 tensor (which DLPack exports but NumPy cannot import) comes back
    as an ``ml_dtypes.bfloat16`` array over the same memory. Raises ``TypeError``
    naming ``name`` for arrays that cannot be read in place: on an accelerator,
    requiring grad, or of another dtype NumPy lacks.
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
            bits = _bfloat16_bits(x)
            if bits is not None:
                return bits
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


def _bfloat16_bits(x: Any) -> np.ndarray | None:
    """A bfloat16 tensor as an ``ml_dtypes.bfloat16`` array over its memory
    (through its bits as int16, which DLPack carries), or ``None`` for anything else."""
    if str(getattr(x, "dtype", "")) != "torch.bfloat16" or getattr(x, "requires_grad", False):
        return None  # a tensor requiring grad is refused, as in other dtypes
    try:
        import ml_dtypes
        import torch
    except ImportError:
        return None  # claims torch's dtype without torch: not a tensor we can read
    try:
        bits = np.from_dlpack(x.view(torch.int16))
    except (BufferError, RuntimeError, TypeError, ValueError):
        return None  # requires grad, ...: the caller's message says what to do
    return bits.view(ml_dtypes.bfloat16)


def is_bfloat16(dtype: np.dtype) -> bool:
    """Whether ``dtype`` is bfloat16 (``ml_dtypes.bfloat16``, JAX's NumPy type)."""
    return dtype.kind == "V" and dtype.itemsize == 2 and dtype.name == "bfloat16"


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
        try:
            import torch
        except ImportError as error:
            raise TypeError(
                f"like: {type(like).__name__} comes from module {type(like).__module__!r}, "
                f"but torch cannot be imported ({error}), so results cannot be handed back "
                "as torch tensors"
            ) from error
        if isinstance(like, torch.Tensor):
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


_PROB_CHARS = "efd"  # float16, float32, float64: read in place
_PROB_TYPES = tuple(np.dtype(c) for c in _PROB_CHARS)
_ID_TYPES = (np.dtype(np.int32), np.dtype(np.int64))  # read in place
_INT64_MAX = int(np.iinfo(np.int64).max)


def _not_array(x: object, name: str, what: str) -> TypeError:
    return TypeError(f"{name} must be a numpy.ndarray of {what}, got {type(x).__name__}")


def float_array(x: Any, name: str) -> np.ndarray:
    """``x`` as a float16/bfloat16/float32/float64 array: in place, or converted
    from another float dtype."""
    if type(x) is np.ndarray and x.dtype in _PROB_TYPES and x.flags.aligned:
        return x  # the serving loop's case, first
    x = as_numpy(x, name)
    if not isinstance(x, np.ndarray):
        raise _not_array(x, name, "float16, bfloat16, float32 or float64")
    dt = x.dtype
    if ((dt.char in _PROB_CHARS and dt.isnative) or is_bfloat16(dt)) and x.flags.aligned:
        return x
    if is_bfloat16(dt):
        return x.copy()  # unaligned: the one case that is copied
    if dt.kind != "f" or dt.char not in "efdg":  # not float8 and other ml_dtypes types
        raise TypeError(
            f"{name} must have a floating dtype (float16, bfloat16, float32, float64), got {dt}"
        )
    # Byte-swapped, unaligned or extended precision: the one case that is converted.
    return x.astype(dt.newbyteorder("=") if dt.itemsize <= 8 else np.float64)


def is_float(dtype: np.dtype) -> bool:
    """Whether ``dtype`` holds floating-point values (NumPy's kinds, or bfloat16)."""
    return dtype.kind == "f" or is_bfloat16(dtype)


def int_array(x: Any, name: str) -> np.ndarray:
    """``x`` as an int32/int64 array: in place, or converted from another integer dtype."""
    if type(x) is np.ndarray and x.dtype in _ID_TYPES and x.flags.aligned:
        return x  # the serving loop's case, first
    x = as_numpy(x, name)
    if not isinstance(x, np.ndarray):
        raise _not_array(x, name, "integers")
    dt = x.dtype
    if (dt is _ID_TYPES[1] or dt is _ID_TYPES[0] or dt in _ID_TYPES) and x.flags.aligned:
        return x
    if dt.kind not in "iu":
        raise TypeError(f"{name} must have an integer dtype, got {dt}")
    if dt.kind == "u" and dt.itemsize == 8 and x.size and int(x.max()) > _INT64_MAX:
        # Past int64 no id, count or output fits: refuse rather than wrap or clamp.
        index = tuple(int(i) for i in np.unravel_index(int(np.argmax(x > _INT64_MAX)), x.shape))
        shown = ", ".join(map(str, index))
        raise InputError(
            f"{name}[{shown}] = {int(x[index])} is above the int64 range (2**63 - 1)",
            argument=name,
            index=index,
            row=index[0] if x.ndim >= 2 else None,  # [B, ...]: the request
        )
    return x.astype(np.int64)


def bool_array(x: Any, name: str) -> np.ndarray:
    x = as_numpy(x, name)
    if not isinstance(x, np.ndarray):
        raise _not_array(x, name, "bool")
    if x.dtype.kind != "b":
        raise TypeError(f"{name} must have dtype bool, got {x.dtype}")
    return x if x.flags.aligned else x.copy()
