//! Arrays in: borrowed read-only in place (no copy), their dtype and rank checked here
//! for clear messages, and the dtype dispatch into generic core calls.

use half::{bf16, f16};
use ndarray::{ArrayView, Dimension};
use numpy::{
    dtype, npyffi, Element, PyArray, PyArrayDescrMethods, PyArrayMethods, PyUntypedArray,
    PyUntypedArrayMethods,
};
use pyo3::exceptions::{PyMemoryError, PyTypeError, PyValueError};
use pyo3::prelude::*;

use super::errors::input_error;
use crate::view::{FloatView, IntView};

/// A fresh zeroed array of `shape`, or a `MemoryError` naming `arg`
/// (and where its size comes from) when it cannot be allocated. Shapes are
/// validated against the inputs before this is called.
pub(super) fn zeros<'py, T: Element, D: Dimension>(
    py: Python<'py>,
    shape: &[usize],
    arg: &str,
    sized_by: &str,
) -> PyResult<Bound<'py, PyArray<T, D>>> {
    let too_large = |bytes: f64| {
        PyMemoryError::new_err(format!(
            "{arg}: an output of shape {shape:?} ({}) cannot be allocated; its size comes from {sized_by}",
            crate::memory::show_bytes(bytes)
        ))
    };
    let elements = shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
    let size = std::mem::size_of::<T>();
    let bytes = shape.iter().map(|&d| d as f64).product::<f64>() * size as f64;
    match elements.and_then(|n| n.checked_mul(size)) {
        Some(b) if b <= isize::MAX as usize => {}
        _ => return Err(too_large(bytes)),
    }
    let mut dims: Vec<npyffi::npy_intp> = shape.iter().map(|&d| d as npyffi::npy_intp).collect();
    // SAFETY: `dims` holds `shape.len()` extents whose product fits in isize;
    // PyArray_Zeros steals the dtype reference and returns a new reference or
    // null with a Python error set.
    let made = unsafe {
        let ptr = npyffi::PY_ARRAY_API.PyArray_Zeros(
            py,
            shape.len() as std::os::raw::c_int,
            dims.as_mut_ptr(),
            dtype::<T>(py).into_dtype_ptr(),
            0,
        );
        Bound::from_owned_ptr_or_err(py, ptr)
    };
    match made {
        Ok(array) => Ok(array.cast_into::<PyArray<T, D>>()?),
        Err(e) if e.is_instance_of::<PyMemoryError>(py) || e.is_instance_of::<PyValueError>(py) => {
            Err(too_large(bytes))
        }
        Err(e) => Err(e),
    }
}

pub(super) fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".to_string())
}

/// `obj` as an aligned, native-byte-order array of rank `D`.
pub(super) fn ndarray_arg<'a, 'py, D: Dimension>(
    obj: &'a Bound<'py, PyAny>,
    name: &str,
) -> PyResult<&'a Bound<'py, PyUntypedArray>> {
    let arr = obj.cast::<PyUntypedArray>().map_err(|_| {
        PyTypeError::new_err(format!(
            "{name} must be a numpy.ndarray, got {}",
            type_name(obj)
        ))
    })?;
    if let Some(ndim) = D::NDIM {
        if arr.ndim() != ndim {
            return Err(input_error(
                name,
                format!("{name} must be {ndim}-D, got shape {:?}", arr.shape()),
            ));
        }
    }
    if !arr.is_aligned() {
        return Err(PyTypeError::new_err(format!(
            "{name} is not aligned in memory; pass a copy (numpy.array({name}))"
        )));
    }
    Ok(arr)
}

/// An input array, read in place while the GIL is released.
///
/// Reading without rust-numpy's borrow tracking (a global registry that costs
/// a lock per array, a third of a small call) is sound here because the core
/// never writes an input, and the only arrays written are outputs that
/// [`out_array`] proves disjoint from every input. Another Python thread
/// writing an input during the call races with the kernel, as it would with
/// any NumPy function that releases the GIL.
pub(super) struct Input<'py, T, D>(Bound<'py, PyArray<T, D>>);

impl<T: Element, D: Dimension> Input<'_, T, D> {
    pub(super) fn as_array(&self) -> ArrayView<'_, T, D> {
        // SAFETY: aligned and native-endian (checked in `ndarray_arg` and by the
        // dtype), and not written while the view lives (see the type's docs).
        unsafe { self.0.as_array() }
    }

    /// The elements as one slice, when the array is C-contiguous.
    pub(super) fn as_slice(&self) -> Option<&[T]> {
        // SAFETY: as for `as_array`.
        unsafe { self.0.as_slice() }.ok()
    }
}

pub(super) fn borrow<'py, T: Element, D: Dimension>(
    arr: &Bound<'py, PyUntypedArray>,
    name: &str,
) -> PyResult<Input<'py, T, D>> {
    let typed = arr.cast::<PyArray<T, D>>().map_err(|_| {
        PyTypeError::new_err(format!("{name} has an unsupported dtype {}", arr.dtype()))
    })?;
    Ok(Input(typed.clone()))
}

pub(super) fn is<T: Element>(arr: &Bound<'_, PyUntypedArray>) -> bool {
    arr.dtype().is_equiv_to(&dtype::<T>(arr.py()))
}

pyo3::create_exception!(
    _native,
    NotInPlace,
    PyTypeError,
    "An input the native code cannot read in place (not an ndarray, another dtype, \
     byte order or alignment), found before any work: the Python layer converts \
     the inputs and calls again."
);

/// An input array of a dtype `supported` accepts, native byte order, aligned
/// and of rank `D`. What a conversion fixes (another type or dtype, alignment)
/// is [`NotInPlace`], and the dtype is checked before the rank.
pub(super) fn input_arg<'a, 'py, D: Dimension>(
    obj: &'a Bound<'py, PyAny>,
    name: &str,
    dtypes: &str,
    supported: impl Fn(&Bound<'py, PyUntypedArray>) -> bool,
) -> PyResult<&'a Bound<'py, PyUntypedArray>> {
    let Ok(arr) = obj.cast::<PyUntypedArray>() else {
        return Err(NotInPlace::new_err(format!(
            "{name} must be a numpy.ndarray, got {}",
            type_name(obj)
        )));
    };
    if !supported(arr) {
        return Err(NotInPlace::new_err(format!(
            "{name} must have dtype {dtypes} (native byte order), got {}",
            arr.dtype()
        )));
    }
    ndarray_arg::<D>(obj, name).map_err(|err| {
        Python::attach(|py| {
            if err.get_type(py).is(py.get_type::<PyTypeError>()) {
                NotInPlace::new_err(err.value(py).to_string()) // unaligned
            } else {
                err
            }
        })
    })
}

/// A borrowed float array of any probability dtype.
pub(super) enum FloatArg<'py, D: Dimension> {
    F16(Input<'py, f16, D>),
    BF16(Input<'py, bf16, D>),
    F32(Input<'py, f32, D>),
    F64(Input<'py, f64, D>),
}

impl<'py, D: Dimension> FloatArg<'py, D> {
    pub(super) fn extract(obj: &Bound<'py, PyAny>, name: &str) -> PyResult<Self> {
        let dtypes = "float16, bfloat16, float32 or float64";
        let arr = input_arg::<D>(obj, name, dtypes, |a| {
            is::<f64>(a) || is::<f32>(a) || is::<f16>(a) || is_bf16(a)
        })?;
        if is::<f64>(arr) {
            Ok(FloatArg::F64(borrow(arr, name)?))
        } else if is::<f32>(arr) {
            Ok(FloatArg::F32(borrow(arr, name)?))
        } else if is::<f16>(arr) {
            Ok(FloatArg::F16(borrow(arr, name)?))
        } else if is_bf16(arr) {
            // SAFETY: `is_bf16` found 2-byte bfloat16 elements, the layout of
            // `half::bf16`; `PyArray<bf16, D>` is a typed handle on the same
            // object, whose rank `input_arg` checked.
            let typed = unsafe { arr.cast_unchecked::<PyArray<bf16, D>>() };
            Ok(FloatArg::BF16(Input(typed.clone())))
        } else {
            unreachable!("input_arg checked the dtype")
        }
    }

    pub(super) fn view(&self) -> FloatView<'_, D> {
        match self {
            FloatArg::F16(a) => FloatView::F16(a.as_array()),
            FloatArg::BF16(a) => FloatView::BF16(a.as_array()),
            FloatArg::F32(a) => FloatView::F32(a.as_array()),
            FloatArg::F64(a) => FloatView::F64(a.as_array()),
        }
    }
}

/// Whether `arr` holds bfloat16 (the `ml_dtypes.bfloat16` NumPy type, JAX's):
/// told by its type's name and size, without asking NumPy for the type by name
/// (which needs `ml_dtypes` imported).
pub(super) fn is_bf16(arr: &Bound<'_, PyUntypedArray>) -> bool {
    let dtype = arr.dtype();
    dtype.itemsize() == 2
        && dtype.kind() == b'V'
        && dtype
            .typeobj()
            .name()
            .is_ok_and(|n| n.to_str().is_ok_and(|n| n == "bfloat16"))
}

/// A borrowed integer array of either id dtype.
pub(super) enum IntArg<'py, D: Dimension> {
    I32(Input<'py, i32, D>),
    I64(Input<'py, i64, D>),
}

impl<'py, D: Dimension> IntArg<'py, D> {
    pub(super) fn extract(obj: &Bound<'py, PyAny>, name: &str) -> PyResult<Self> {
        let arr = input_arg::<D>(obj, name, "int32 or int64", |a| {
            is::<i64>(a) || is::<i32>(a)
        })?;
        if is::<i64>(arr) {
            Ok(IntArg::I64(borrow(arr, name)?))
        } else if is::<i32>(arr) {
            Ok(IntArg::I32(borrow(arr, name)?))
        } else {
            unreachable!("input_arg checked the dtype")
        }
    }

    pub(super) fn view(&self) -> IntView<'_, D> {
        match self {
            IntArg::I32(a) => IntView::I32(a.as_array()),
            IntArg::I64(a) => IntView::I64(a.as_array()),
        }
    }
}

pub(super) fn bool_arg<'py, D: Dimension>(
    obj: &Bound<'py, PyAny>,
    name: &str,
) -> PyResult<Input<'py, bool, D>> {
    let arr = ndarray_arg::<D>(obj, name)?;
    if !is::<bool>(arr) {
        return Err(PyTypeError::new_err(format!(
            "{name} must have dtype bool, got {}",
            arr.dtype()
        )));
    }
    borrow(arr, name)
}

pub(super) fn optional<'py, T>(
    obj: Option<&Bound<'py, PyAny>>,
    extract: impl FnOnce(&Bound<'py, PyAny>) -> PyResult<T>,
) -> PyResult<Option<T>> {
    match obj {
        Some(o) if !o.is_none() => extract(o).map(Some),
        _ => Ok(None),
    }
}

/// Monomorphizes `$run!(p, q)` for every pair of target and draft dtypes: `p`
/// the target view, `q` an `Option` of the draft view (`$none`: the view type
/// named when there is no draft).
macro_rules! each_dtype_pair {
    ($target:expr, $draft:expr, $none:ty, $run:ident) => {
        match $target {
            FloatArg::F16(p) => each_dtype_pair!(@draft p.as_array(), $draft, $none, $run),
            FloatArg::BF16(p) => each_dtype_pair!(@draft p.as_array(), $draft, $none, $run),
            FloatArg::F32(p) => each_dtype_pair!(@draft p.as_array(), $draft, $none, $run),
            FloatArg::F64(p) => each_dtype_pair!(@draft p.as_array(), $draft, $none, $run),
        }
    };
    (@draft $p:expr, $draft:expr, $none:ty, $run:ident) => {
        match $draft {
            None => $run!($p, None::<$none>),
            Some(FloatArg::F16(q)) => $run!($p, Some(q.as_array())),
            Some(FloatArg::BF16(q)) => $run!($p, Some(q.as_array())),
            Some(FloatArg::F32(q)) => $run!($p, Some(q.as_array())),
            Some(FloatArg::F64(q)) => $run!($p, Some(q.as_array())),
        }
    };
}
pub(super) use each_dtype_pair;
