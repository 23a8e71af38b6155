//! The binding module: every `#[pyfunction]`, the dtype dispatch and the one
//! error mapping. Arrays are borrowed read-only in place (no copy), checked for
//! dtype and rank here (for clear messages), and handed to the core with the
//! GIL released. Nothing a caller controls is unwrapped.

use half::{bf16, f16};
use ndarray::{ArrayD, ArrayView, ArrayView1, ArrayView2, Axis, Dimension, Ix1, Ix2, Ix3, IxDyn};
use numpy::{
    dtype, npyffi, Element, PyArray, PyArray1, PyArray2, PyArrayDescrMethods, PyArrayDyn,
    PyArrayMethods, PyUntypedArray, PyUntypedArrayMethods,
};
use pyo3::exceptions::{PyMemoryError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyList};
use pyo3::IntoPyObjectExt;

use crate::chain::{self, ChainInputs, ChainOutputs, FlatChainInputs, GreedyIdsInputs};
use crate::error::{CoreError, RowErrors};
use crate::logits::{self, LogitsInputs};
use crate::method::Method;
use crate::philox;
use crate::prob::Prob;
use crate::rate;
use crate::rule;
use crate::threads;
use crate::tree::{self, TreeInputs, TreeMethod, TreeOutputs};
use crate::view::{FloatView, Greedy, IntView};

impl From<CoreError> for PyErr {
    fn from(err: CoreError) -> PyErr {
        Python::attach(|py| py_error(py, &err))
    }
}

/// `specaccept.InputError` (a `ValueError` naming the argument, the index and
/// the batch row) for a shape or value error; `MemoryError` for a buffer too
/// large.
fn py_error(py: Python<'_>, err: &CoreError) -> PyErr {
    if let CoreError::Memory { .. } = err {
        return PyMemoryError::new_err(err.to_string());
    }
    let index = match err {
        CoreError::Value { .. } => Some(err.index().to_vec()),
        _ => None,
    };
    // Every value error of a batched argument is in the row its index starts
    // with, or the one the row loop named (the flat layout's requests).
    let row = err.row().or_else(|| match err.arg() {
        "n" => None,
        _ => index.as_ref().and_then(|i| i.first().copied()),
    });
    make_input_error(py, err.to_string(), err.arg(), index, row)
}

/// `specaccept.InputError(message, argument, index, row)`.
fn make_input_error(
    py: Python<'_>,
    message: String,
    arg: &str,
    index: Option<Vec<usize>>,
    row: Option<usize>,
) -> PyErr {
    let made = py
        .import("specaccept._errors")
        .and_then(|m| m.getattr("InputError"))
        .and_then(|class| class.call1((message.as_str(), arg, index, row)));
    match made {
        Ok(instance) => PyErr::from_value(instance),
        Err(_) => PyValueError::new_err(message),
    }
}

/// An `InputError` about argument `arg` as a whole (a shape, a layout).
fn input_error(arg: &str, message: String) -> PyErr {
    Python::attach(|py| make_input_error(py, message, arg, None, None))
}

/// A fresh zeroed array of `shape`, or a `MemoryError` naming `arg`
/// (and where its size comes from) when it cannot be allocated. Shapes are
/// validated against the inputs before this is called.
fn zeros<'py, T: Element, D: Dimension>(
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

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".to_string())
}

/// `obj` as an aligned, native-byte-order array of rank `D`.
fn ndarray_arg<'a, 'py, D: Dimension>(
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
struct Input<'py, T, D>(Bound<'py, PyArray<T, D>>);

impl<T: Element, D: Dimension> Input<'_, T, D> {
    fn as_array(&self) -> ArrayView<'_, T, D> {
        // SAFETY: aligned and native-endian (checked in `ndarray_arg` and by the
        // dtype), and not written while the view lives (see the type's docs).
        unsafe { self.0.as_array() }
    }

    /// The elements as one slice, when the array is C-contiguous.
    fn as_slice(&self) -> Option<&[T]> {
        // SAFETY: as for `as_array`.
        unsafe { self.0.as_slice() }.ok()
    }
}

fn borrow<'py, T: Element, D: Dimension>(
    arr: &Bound<'py, PyUntypedArray>,
    name: &str,
) -> PyResult<Input<'py, T, D>> {
    let typed = arr.cast::<PyArray<T, D>>().map_err(|_| {
        PyTypeError::new_err(format!("{name} has an unsupported dtype {}", arr.dtype()))
    })?;
    Ok(Input(typed.clone()))
}

fn is<T: Element>(arr: &Bound<'_, PyUntypedArray>) -> bool {
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
fn input_arg<'a, 'py, D: Dimension>(
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
enum FloatArg<'py, D: Dimension> {
    F16(Input<'py, f16, D>),
    BF16(Input<'py, bf16, D>),
    F32(Input<'py, f32, D>),
    F64(Input<'py, f64, D>),
}

impl<'py, D: Dimension> FloatArg<'py, D> {
    fn extract(obj: &Bound<'py, PyAny>, name: &str) -> PyResult<Self> {
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

    fn view(&self) -> FloatView<'_, D> {
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
fn is_bf16(arr: &Bound<'_, PyUntypedArray>) -> bool {
    let dtype = arr.dtype();
    dtype.itemsize() == 2
        && dtype.kind() == b'V'
        && dtype
            .typeobj()
            .name()
            .is_ok_and(|n| n.to_str().is_ok_and(|n| n == "bfloat16"))
}

/// A borrowed integer array of either id dtype.
enum IntArg<'py, D: Dimension> {
    I32(Input<'py, i32, D>),
    I64(Input<'py, i64, D>),
}

impl<'py, D: Dimension> IntArg<'py, D> {
    fn extract(obj: &Bound<'py, PyAny>, name: &str) -> PyResult<Self> {
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

    fn view(&self) -> IntView<'_, D> {
        match self {
            IntArg::I32(a) => IntView::I32(a.as_array()),
            IntArg::I64(a) => IntView::I64(a.as_array()),
        }
    }
}

fn bool_arg<'py, D: Dimension>(
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

fn optional<'py, T>(
    obj: Option<&Bound<'py, PyAny>>,
    extract: impl FnOnce(&Bound<'py, PyAny>) -> PyResult<T>,
) -> PyResult<Option<T>> {
    match obj {
        Some(o) if !o.is_none() => extract(o).map(Some),
        _ => Ok(None),
    }
}

type ChainResult<'py> = (
    Bound<'py, PyArray2<i64>>,
    Bound<'py, PyArray1<i64>>,
    Bound<'py, PyArray1<i64>>,
);

/// The bytes an array's elements occupy, `[first, last]` (`None` when empty).
fn byte_span(arr: &Bound<'_, PyUntypedArray>) -> Option<(isize, isize)> {
    if arr.len() == 0 {
        return None;
    }
    // SAFETY: `arr` is a live ndarray; reading its data pointer reads no element.
    let start = unsafe { (*arr.as_array_ptr()).data } as isize;
    let (mut first, mut last) = (start, start);
    for (&extent, &stride) in arr.shape().iter().zip(arr.strides()) {
        // Saturating: a crafted view's reach past the address space covers all.
        let reach = (extent as isize - 1).saturating_mul(stride);
        if reach < 0 {
            first = first.saturating_add(reach);
        } else {
            last = last.saturating_add(reach);
        }
    }
    Some((
        first,
        last.saturating_add(arr.dtype().itemsize() as isize - 1),
    ))
}

/// Whether two elements of `arr` share bytes (a stride-0 or crafted view):
/// with the axes in order of stride, each stride must step past everything
/// the smaller ones reach. Conservative: an exotic interleaving is refused too.
fn overlaps_itself(arr: &Bound<'_, PyUntypedArray>) -> bool {
    let mut axes: Vec<(usize, usize)> = arr
        .shape()
        .iter()
        .zip(arr.strides())
        .filter(|(&extent, _)| extent > 1)
        .map(|(&extent, &stride)| (extent, stride.unsigned_abs()))
        .collect();
    axes.sort_by_key(|&(_, stride)| stride);
    let mut reach = arr.dtype().itemsize();
    for (extent, stride) in axes {
        if stride < reach {
            return true;
        }
        reach = stride.saturating_mul(extent - 1).saturating_add(reach);
    }
    false
}

/// The bytes a named argument occupies, for the overlap checks of `out`.
type Span<'a> = (&'a str, (isize, isize));

/// One caller-provided output array: int64, rank `D`, writeable, sharing no
/// memory with any input or with the outputs before it (`taken`, to which it
/// is added).
fn out_array<'py, 'a, D: Dimension>(
    obj: &Bound<'py, PyAny>,
    name: &'a str,
    taken: &mut Vec<Span<'a>>,
) -> PyResult<Bound<'py, PyArray<i64, D>>> {
    let arr = ndarray_arg::<D>(obj, name)?;
    if !is::<i64>(arr) {
        return Err(PyTypeError::new_err(format!(
            "{name} must have dtype int64, got {}",
            arr.dtype()
        )));
    }
    if let Some((first, last)) = byte_span(arr) {
        if let Some((other, _)) = taken.iter().find(|(_, (f, l))| first <= *l && *f <= last) {
            return Err(input_error(
                name,
                format!("{name} shares memory with {other}; outputs need buffers of their own"),
            ));
        }
        taken.push((name, (first, last)));
    }
    // SAFETY: `arr` is a live ndarray; its flags are plain data.
    let flags = unsafe { (*arr.as_array_ptr()).flags };
    if flags & numpy::npyffi::NPY_ARRAY_WRITEABLE == 0 {
        return Err(input_error(
            name,
            format!("{name} is read-only; outputs need writeable buffers"),
        ));
    }
    if overlaps_itself(arr) {
        return Err(input_error(
            name,
            format!("{name} has elements that share memory (a stride-0 or overlapping view); outputs need one element per value"),
        ));
    }
    Ok(arr.cast::<PyArray<i64, D>>()?.clone())
}

/// The output buffers: the caller's (`out`, a tuple `(output_token_ids,
/// num_accepted, num_emitted or None)`) or fresh ones. `inputs` are the
/// arguments the outputs must not overlap. Called once the inputs' shapes
/// are validated (so `batch`, `num_draft` are consistent); the shapes of the
/// caller's buffers are checked by the core.
fn outputs<'py>(
    py: Python<'py>,
    batch: usize,
    num_draft: usize,
    out: Option<&Bound<'py, PyAny>>,
    inputs: &[(&str, Option<&Bound<'py, PyAny>>)],
) -> PyResult<ChainResult<'py>> {
    let sized_by = "draft_token_ids [B, K] (output_token_ids is [B, K+1])";
    let Some(out) = out.filter(|o| !o.is_none()) else {
        return Ok((
            zeros(py, &[batch, num_draft + 1], "output_token_ids", sized_by)?,
            zeros(py, &[batch], "num_accepted", sized_by)?,
            zeros(py, &[batch], "num_emitted", sized_by)?,
        ));
    };
    let (ids, accepted, emitted): (
        Bound<'py, PyAny>,
        Bound<'py, PyAny>,
        Option<Bound<'py, PyAny>>,
    ) = out.extract().map_err(|_| {
        PyTypeError::new_err(
            "out must be a tuple (output_token_ids, num_accepted, num_emitted or None)",
        )
    })?;
    let mut taken: Vec<Span<'_>> = inputs
        .iter()
        .filter_map(|&(name, value)| {
            let arr = value?.cast::<PyUntypedArray>().ok()?;
            Some((name, byte_span(arr)?))
        })
        .collect();
    let ids = out_array::<Ix2>(&ids, "out.output_token_ids", &mut taken)?;
    let accepted = out_array::<Ix1>(&accepted, "out.num_accepted", &mut taken)?;
    let emitted = match emitted.filter(|e| !e.is_none()) {
        Some(e) => out_array::<Ix1>(&e, "out.num_emitted", &mut taken)?,
        None => zeros(py, &[batch], "num_emitted", sized_by)?,
    };
    Ok((ids, accepted, emitted))
}

/// `method=` as the Python layer passes it (see `method::Method`): `"token"`,
/// `"block"`, `("typical", epsilon, delta)` or `("synthetic", rates)` with
/// `rates` a float64 array `[K]` (kept borrowed while the call runs).
enum MethodArg<'py> {
    Plain(Method<'static>),
    Synthetic(Input<'py, f64, Ix1>),
}

impl<'py> MethodArg<'py> {
    fn extract(method: Option<&Bound<'py, PyAny>>) -> PyResult<Self> {
        let Some(method) = method else {
            return Ok(MethodArg::Plain(Method::Token));
        };
        if let Ok(name) = method.extract::<String>() {
            return match name.as_str() {
                "token" => Ok(MethodArg::Plain(Method::Token)),
                "block" => Ok(MethodArg::Plain(Method::Block)),
                other => Err(input_error(
                    "method",
                    format!("method must be \"token\" or \"block\", got {other:?}"),
                )),
            };
        }
        if let Ok((name, epsilon, delta)) = method.extract::<(String, f64, f64)>() {
            if name == "typical" {
                return Ok(MethodArg::Plain(Method::Typical { epsilon, delta }));
            }
        }
        if let Ok((name, rates)) = method.extract::<(String, Bound<'py, PyAny>)>() {
            if name == "synthetic" {
                let arr = ndarray_arg::<Ix1>(&rates, "acceptance_rate")?;
                if !is::<f64>(arr) {
                    return Err(PyTypeError::new_err("acceptance_rate must be float64"));
                }
                return Ok(MethodArg::Synthetic(borrow(arr, "acceptance_rate")?));
            }
        }
        Err(PyTypeError::new_err(
            "method must be \"token\", \"block\", (\"typical\", epsilon, delta) or \
             (\"synthetic\", rates)",
        ))
    }

    fn method(&self) -> PyResult<Method<'_>> {
        match self {
            MethodArg::Plain(m) => Ok(*m),
            MethodArg::Synthetic(rates) => rates
                .as_slice()
                .map(Method::Synthetic)
                .ok_or_else(|| PyTypeError::new_err("acceptance_rate must be contiguous")),
        }
    }
}

/// The outputs returned to Python: the three arrays, and with `isolate` the
/// bad rows as a list of `(row, InputError)`.
type ChainReturn<'py> = (ChainResult<'py>, Option<Bound<'py, PyList>>);

/// Runs `work` on the output buffers with the GIL released, isolating bad
/// rows when asked (see `RowErrors`).
fn with_outputs<'py>(
    py: Python<'py>,
    buffers: ChainResult<'py>,
    isolate: bool,
    work: impl FnOnce(&mut ChainOutputs<'_>, RowErrors<'_>) -> Result<(), CoreError> + Send,
) -> PyResult<ChainReturn<'py>> {
    let (ids, accepted, emitted) = buffers;
    let batch = accepted.len();
    let mut slots: Vec<Option<CoreError>> = Vec::new();
    if isolate {
        crate::memory::reserve(&mut slots, batch, "draft_token_ids")?;
        slots.resize(batch, None);
    }
    {
        // SAFETY: fresh arrays, or caller buffers that `outputs` checked to be
        // writeable, aligned int64 and disjoint from each other and every input.
        let mut out = unsafe {
            ChainOutputs {
                output_token_ids: ids.as_array_mut(),
                num_accepted: accepted.as_array_mut(),
                num_emitted: emitted.as_array_mut(),
            }
        };
        let errors = if isolate {
            RowErrors::Isolate(&mut slots)
        } else {
            RowErrors::Raise
        };
        py.detach(|| work(&mut out, errors))?;
    }
    let bad = if isolate {
        let list = PyList::empty(py);
        for (b, error) in slots.iter().enumerate() {
            if let Some(error) = error {
                list.append((b, py_error(py, error).into_value(py)))?;
            }
        }
        Some(list)
    } else {
        None
    };
    Ok(((ids, accepted, emitted), bad))
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

/// Where the outputs go: the caller's `out` (checked against the `inputs`
/// it must not overlap) or fresh arrays, allocated once the inputs' shapes
/// are validated; and whether bad rows are isolated.
struct OutPlan<'a, 'py> {
    out: Option<&'a Bound<'py, PyAny>>,
    inputs: Vec<(&'static str, Option<&'a Bound<'py, PyAny>>)>,
    isolate: bool,
}

/// The inputs `out` must not overlap, listed only when there is an `out`.
fn given<'a, 'py>(
    out: Option<&Bound<'py, PyAny>>,
    inputs: impl FnOnce() -> Vec<(&'static str, Option<&'a Bound<'py, PyAny>>)>,
) -> Vec<(&'static str, Option<&'a Bound<'py, PyAny>>)> {
    match out {
        Some(o) if !o.is_none() => inputs(),
        _ => Vec::new(),
    }
}

impl<'py> OutPlan<'_, 'py> {
    /// Allocates (or checks) the outputs of a `[B, K]` batch and runs `work`.
    fn run(
        &self,
        py: Python<'py>,
        batch: usize,
        num_draft: usize,
        work: impl FnOnce(&mut ChainOutputs<'_>, RowErrors<'_>) -> Result<(), CoreError> + Send,
    ) -> PyResult<Bound<'py, PyAny>> {
        let buffers = outputs(py, batch, num_draft, self.out, &self.inputs)?;
        let (arrays, bad) = with_outputs(py, buffers, self.isolate, work)?;
        match bad {
            Some(bad) => (arrays.0, arrays.1, arrays.2, bad).into_bound_py_any(py),
            None => arrays.into_bound_py_any(py),
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn run_chain<'py, 'a, P: Prob, Q: Prob>(
    py: Python<'py>,
    draft_token_ids: IntView<'a, Ix2>,
    target_probs: ndarray::ArrayView3<'a, P>,
    draft_probs: Option<ndarray::ArrayView3<'a, Q>>,
    num_draft_tokens: Option<IntView<'a, Ix1>>,
    uniforms: Option<FloatView<'a, Ix2>>,
    recovery_uniforms: Option<FloatView<'a, Ix1>>,
    greedy: Greedy<'a>,
    method: Method<'a>,
    plan: &OutPlan<'_, 'py>,
) -> PyResult<Bound<'py, PyAny>> {
    let inputs = ChainInputs {
        draft_token_ids,
        target_probs,
        draft_probs,
        num_draft_tokens,
        uniforms,
        recovery_uniforms,
        greedy,
        method,
    };
    let dims = inputs.dims()?;
    plan.run(py, dims.batch, dims.num_draft, |out, errors| {
        chain::verify(&inputs, out, errors)
    })
}

/// Chain verification (see `specaccept.verify`); every argument already normalised:
/// `uniforms`/`recovery_uniforms` present for rows verified by sampling (or
/// `draws`, float64 `[B*K + B]`: the uniforms then the recovery uniforms, as one
/// Generator call returns them), `greedy` a bool or a bool array `[B]`, `out`
/// None or `(output_token_ids, num_accepted, num_emitted or None)`. Returns
/// `(output_token_ids, num_accepted, num_emitted)`, and with `isolate` a fourth
/// item: the bad rows as a list of `(row, InputError)`.
#[pyfunction]
#[pyo3(signature = (draft_token_ids, target_probs, draft_probs, num_draft_tokens, uniforms, recovery_uniforms, greedy, out=None, draws=None, isolate=false, method=None))]
#[allow(clippy::too_many_arguments)]
fn verify<'py>(
    py: Python<'py>,
    draft_token_ids: &Bound<'py, PyAny>,
    target_probs: &Bound<'py, PyAny>,
    draft_probs: Option<&Bound<'py, PyAny>>,
    num_draft_tokens: Option<&Bound<'py, PyAny>>,
    uniforms: Option<&Bound<'py, PyAny>>,
    recovery_uniforms: Option<&Bound<'py, PyAny>>,
    greedy: &Bound<'py, PyAny>,
    out: Option<&Bound<'py, PyAny>>,
    draws: Option<&Bound<'py, PyAny>>,
    isolate: bool,
    method: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let method_arg = MethodArg::extract(method)?;
    let method = method_arg.method()?;
    let ids = IntArg::<Ix2>::extract(draft_token_ids, "draft_token_ids")?;
    let target = FloatArg::<Ix3>::extract(target_probs, "target_probs")?;
    let draft = optional(draft_probs, |o| FloatArg::<Ix3>::extract(o, "draft_probs"))?;
    let counts = optional(num_draft_tokens, |o| {
        IntArg::<Ix1>::extract(o, "num_draft_tokens")
    })?;
    let u = optional(uniforms, |o| FloatArg::<Ix2>::extract(o, "uniforms"))?;
    let ru = optional(recovery_uniforms, |o| {
        FloatArg::<Ix1>::extract(o, "recovery_uniforms")
    })?;
    let greedy_rows = GreedyArg::extract(greedy)?;
    let greedy_view = greedy_rows.view();
    let &[batch, num_draft] = ids.view().shape() else {
        return Err(input_error(
            "draft_token_ids",
            "draft_token_ids must be 2-D".into(),
        ));
    };
    let plan = OutPlan {
        out,
        inputs: given(out, || {
            vec![
                ("draft_token_ids", Some(draft_token_ids)),
                ("target_probs", Some(target_probs)),
                ("draft_probs", draft_probs),
                ("num_draft_tokens", num_draft_tokens),
                ("uniforms", uniforms),
                ("recovery_uniforms", recovery_uniforms),
                ("greedy", Some(greedy)),
            ]
        }),
        isolate,
    };
    let (ids, counts) = (ids.view(), counts.as_ref().map(IntArg::view));
    let draws = optional(draws, |o| {
        ndarray_arg::<Ix1>(o, "draws").and_then(|a| borrow(a, "draws"))
    })?;
    let (u, ru) = match &draws {
        Some(d) => {
            let (u, ru) = split_draws(d.as_array(), batch, num_draft)?;
            (Some(FloatView::F64(u)), Some(FloatView::F64(ru)))
        }
        None => (
            u.as_ref().map(FloatArg::view),
            ru.as_ref().map(FloatArg::view),
        ),
    };

    macro_rules! run {
        ($p:expr, $q:expr) => {
            run_chain(py, ids, $p, $q, counts, u, ru, greedy_view, method, &plan)
        };
    }
    each_dtype_pair!(&target, &draft, ndarray::ArrayView3<'_, f64>, run)
}

/// `draws [B*K + B]` as `uniforms [B, K]` and `recovery_uniforms [B]`.
fn split_draws(
    draws: ArrayView1<'_, f64>,
    batch: usize,
    num_draft: usize,
) -> PyResult<(ArrayView2<'_, f64>, ArrayView1<'_, f64>)> {
    let split = batch.saturating_mul(num_draft);
    if Some(draws.len()) != split.checked_add(batch) {
        return Err(input_error(
            "draws",
            format!(
                "draws must hold B*K + B = {} values, got {}",
                split.saturating_add(batch),
                draws.len()
            ),
        ));
    }
    let (u, ru) = draws.split_at(Axis(0), split);
    let u = u
        .into_shape_with_order((batch, num_draft))
        .map_err(|e| input_error("draws", format!("draws: {e}")))?;
    Ok((u, ru))
}

/// `greedy`: a Python bool (every row) or a bool array `[B]` (per row).
enum GreedyArg<'py> {
    All(bool),
    PerRow(Input<'py, bool, Ix1>),
}

impl<'py> GreedyArg<'py> {
    fn extract(greedy: &Bound<'py, PyAny>) -> PyResult<Self> {
        match greedy.cast::<PyBool>() {
            Ok(flag) => Ok(GreedyArg::All(flag.is_true())),
            Err(_) => Ok(GreedyArg::PerRow(bool_arg::<Ix1>(greedy, "greedy")?)),
        }
    }

    fn view(&self) -> Greedy<'_> {
        match self {
            GreedyArg::All(flag) => Greedy::All(*flag),
            GreedyArg::PerRow(rows) => Greedy::PerRow(rows.as_array()),
        }
    }
}

/// Chain verification in the flat ragged layout (see `specaccept.compat.vllm`):
/// `draft_token_ids [T]`, `num_draft_tokens [B]`, `target_probs [T, V]`,
/// `draft_probs [T, V]` or None, `bonus_token_ids [B]`, `uniforms [T]`,
/// `recovery_uniforms [B]`. Output rows have `max(num_draft_tokens) + 1` entries.
#[pyfunction]
#[pyo3(signature = (draft_token_ids, num_draft_tokens, target_probs, draft_probs, bonus_token_ids, uniforms, recovery_uniforms, greedy, out=None, isolate=false, method=None))]
#[allow(clippy::too_many_arguments)]
fn verify_flat<'py>(
    py: Python<'py>,
    draft_token_ids: &Bound<'py, PyAny>,
    num_draft_tokens: &Bound<'py, PyAny>,
    target_probs: &Bound<'py, PyAny>,
    draft_probs: Option<&Bound<'py, PyAny>>,
    bonus_token_ids: &Bound<'py, PyAny>,
    uniforms: Option<&Bound<'py, PyAny>>,
    recovery_uniforms: Option<&Bound<'py, PyAny>>,
    greedy: &Bound<'py, PyAny>,
    out: Option<&Bound<'py, PyAny>>,
    isolate: bool,
    method: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let method_arg = MethodArg::extract(method)?;
    let method = method_arg.method()?;
    let ids = IntArg::<Ix1>::extract(draft_token_ids, "draft_token_ids")?;
    let counts = IntArg::<Ix1>::extract(num_draft_tokens, "num_draft_tokens")?;
    let target = FloatArg::<Ix2>::extract(target_probs, "target_probs")?;
    let draft = optional(draft_probs, |o| FloatArg::<Ix2>::extract(o, "draft_probs"))?;
    let bonus = IntArg::<Ix1>::extract(bonus_token_ids, "bonus_token_ids")?;
    let u = optional(uniforms, |o| FloatArg::<Ix1>::extract(o, "uniforms"))?;
    let ru = optional(recovery_uniforms, |o| {
        FloatArg::<Ix1>::extract(o, "recovery_uniforms")
    })?;
    let greedy_rows = GreedyArg::extract(greedy)?;
    let counts_view = counts.view();
    let plan = OutPlan {
        out,
        inputs: given(out, || {
            vec![
                ("draft_token_ids", Some(draft_token_ids)),
                ("num_draft_tokens", Some(num_draft_tokens)),
                ("target_probs", Some(target_probs)),
                ("draft_probs", draft_probs),
                ("bonus_token_ids", Some(bonus_token_ids)),
                ("uniforms", uniforms),
                ("recovery_uniforms", recovery_uniforms),
                ("greedy", Some(greedy)),
            ]
        }),
        isolate,
    };
    macro_rules! run {
        ($p:expr, $q:expr) => {{
            let inputs = FlatChainInputs {
                draft_token_ids: ids.view(),
                num_draft_tokens: counts_view,
                target_probs: $p,
                draft_probs: $q,
                bonus_token_ids: bonus.view(),
                uniforms: u.as_ref().map(FloatArg::view),
                recovery_uniforms: ru.as_ref().map(FloatArg::view),
                greedy: greedy_rows.view(),
                method,
            };
            let dims = inputs.dims()?;
            plan.run(py, dims.batch, dims.num_draft, |out, errors| {
                chain::verify_flat(&inputs, out, errors)
            })
        }};
    }
    each_dtype_pair!(&target, &draft, ArrayView2<'_, f64>, run)
}

/// Verification from logits (see `specaccept.verify_logits`); `temperature`,
/// `top_k`, `top_p` already broadcast to `[B]`.
#[pyfunction]
#[pyo3(signature = (draft_token_ids, target_logits, draft_logits, temperature, top_k, top_p, num_draft_tokens, uniforms, recovery_uniforms, isolate=false, method=None, draft_token_probs=None))]
#[allow(clippy::too_many_arguments)]
fn verify_logits<'py>(
    py: Python<'py>,
    draft_token_ids: &Bound<'py, PyAny>,
    target_logits: &Bound<'py, PyAny>,
    draft_logits: Option<&Bound<'py, PyAny>>,
    temperature: &Bound<'py, PyAny>,
    top_k: &Bound<'py, PyAny>,
    top_p: &Bound<'py, PyAny>,
    num_draft_tokens: Option<&Bound<'py, PyAny>>,
    uniforms: Option<&Bound<'py, PyAny>>,
    recovery_uniforms: Option<&Bound<'py, PyAny>>,
    isolate: bool,
    method: Option<&Bound<'py, PyAny>>,
    draft_token_probs: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let method_arg = MethodArg::extract(method)?;
    let method = method_arg.method()?;
    let ids = IntArg::<Ix2>::extract(draft_token_ids, "draft_token_ids")?;
    let target = FloatArg::<Ix3>::extract(target_logits, "target_logits")?;
    let given_q = optional(draft_token_probs, |o| {
        FloatArg::<Ix2>::extract(o, "draft_token_probs")
    })?;
    let draft = optional(draft_logits, |o| {
        FloatArg::<Ix3>::extract(o, "draft_logits")
    })?;
    let temperature = FloatArg::<Ix1>::extract(temperature, "temperature")?;
    let top_k = IntArg::<Ix1>::extract(top_k, "top_k")?;
    let top_p = FloatArg::<Ix1>::extract(top_p, "top_p")?;
    let counts = optional(num_draft_tokens, |o| {
        IntArg::<Ix1>::extract(o, "num_draft_tokens")
    })?;
    let u = optional(uniforms, |o| FloatArg::<Ix2>::extract(o, "uniforms"))?;
    let ru = optional(recovery_uniforms, |o| {
        FloatArg::<Ix1>::extract(o, "recovery_uniforms")
    })?;
    let plan = OutPlan {
        out: None,
        inputs: Vec::new(),
        isolate,
    };
    macro_rules! run {
        ($p:expr, $q:expr) => {{
            let inputs = LogitsInputs {
                draft_token_ids: ids.view(),
                target_logits: $p,
                draft_logits: $q,
                temperature: temperature.view(),
                top_k: top_k.view(),
                top_p: top_p.view(),
                num_draft_tokens: counts.as_ref().map(IntArg::view),
                uniforms: u.as_ref().map(FloatArg::view),
                recovery_uniforms: ru.as_ref().map(FloatArg::view),
                draft_token_probs: given_q.as_ref().map(FloatArg::view),
                method,
            };
            let (batch, num_draft, _) = inputs.dims()?;
            plan.run(py, batch, num_draft, |out, errors| {
                logits::verify_logits(&inputs, out, errors)
            })
        }};
    }
    each_dtype_pair!(&target, &draft, ndarray::ArrayView3<'_, f64>, run)
}

type TreeResult<'py> = (
    Bound<'py, PyArray2<i64>>,
    Bound<'py, PyArray1<i64>>,
    Bound<'py, PyArray1<i64>>,
    Bound<'py, PyArray2<i64>>,
);

/// Tree verification (see `specaccept.verify_tree`); `parent_ids` already `[B, N]`
/// (a broadcast view when shared). Returns `(output_token_ids, num_accepted,
/// num_emitted, accepted_node_ids)`.
#[pyfunction]
#[pyo3(signature = (node_token_ids, parent_ids, target_probs, draft_probs, uniforms, recovery_uniforms, greedy, method="token"))]
#[allow(clippy::too_many_arguments)]
fn verify_tree<'py>(
    py: Python<'py>,
    node_token_ids: &Bound<'py, PyAny>,
    parent_ids: &Bound<'py, PyAny>,
    target_probs: &Bound<'py, PyAny>,
    draft_probs: Option<&Bound<'py, PyAny>>,
    uniforms: Option<&Bound<'py, PyAny>>,
    recovery_uniforms: Option<&Bound<'py, PyAny>>,
    greedy: &Bound<'py, PyAny>,
    method: &str,
) -> PyResult<TreeResult<'py>> {
    let method = match method {
        "token" => TreeMethod::Token,
        "traversal" => TreeMethod::Traversal,
        other => {
            return Err(input_error(
                "method",
                format!("method must be \"token\" or \"traversal\", got {other:?}"),
            ))
        }
    };
    let ids = IntArg::<Ix2>::extract(node_token_ids, "node_token_ids")?;
    let parents = IntArg::<Ix2>::extract(parent_ids, "parent_ids")?;
    let target = FloatArg::<Ix3>::extract(target_probs, "target_probs")?;
    let draft = optional(draft_probs, |o| FloatArg::<Ix3>::extract(o, "draft_probs"))?;
    let u = optional(uniforms, |o| FloatArg::<Ix2>::extract(o, "uniforms"))?;
    let ru = optional(recovery_uniforms, |o| {
        FloatArg::<Ix1>::extract(o, "recovery_uniforms")
    })?;
    let greedy_rows = GreedyArg::extract(greedy)?;
    macro_rules! run {
        ($p:expr, $q:expr) => {
            run_tree(
                py,
                TreeInputs {
                    node_token_ids: ids.view(),
                    parent_ids: parents.view(),
                    target_probs: $p,
                    draft_probs: $q,
                    uniforms: u.as_ref().map(FloatArg::view),
                    recovery_uniforms: ru.as_ref().map(FloatArg::view),
                    greedy: greedy_rows.view(),
                    method,
                },
            )
        };
    }
    each_dtype_pair!(&target, &draft, ndarray::ArrayView3<'_, f64>, run)
}

/// Shapes first, then the walk over the parent links, then the outputs, then the work.
fn run_tree<'py, P: Prob, Q: Prob>(
    py: Python<'py>,
    inputs: TreeInputs<'_, P, Q>,
) -> PyResult<TreeResult<'py>> {
    let (batch, _, _) = inputs.dims()?;
    let deepest = tree::tree_depth(&inputs.parent_ids)?;
    let sized_by = "node_token_ids [B, N] and the deepest path D of parent_ids";
    let outputs = (
        zeros::<i64, Ix2>(py, &[batch, deepest + 1], "output_token_ids", sized_by)?,
        zeros::<i64, Ix1>(py, &[batch], "num_accepted", sized_by)?,
        zeros::<i64, Ix1>(py, &[batch], "num_emitted", sized_by)?,
        zeros::<i64, Ix2>(py, &[batch, deepest], "accepted_node_ids", sized_by)?,
    );
    {
        // SAFETY: fresh arrays, shared with nothing.
        let mut out = unsafe {
            TreeOutputs {
                output_token_ids: outputs.0.as_array_mut(),
                num_accepted: outputs.1.as_array_mut(),
                num_emitted: outputs.2.as_array_mut(),
                accepted_node_ids: outputs.3.as_array_mut(),
            }
        };
        py.detach(|| tree::verify_tree(&inputs, &mut out))?;
    }
    Ok(outputs)
}

/// Greedy verification on target argmax ids (see `specaccept.verify_greedy`).
#[pyfunction]
#[pyo3(signature = (draft_token_ids, target_token_ids, num_draft_tokens, out=None))]
fn verify_greedy<'py>(
    py: Python<'py>,
    draft_token_ids: &Bound<'py, PyAny>,
    target_token_ids: &Bound<'py, PyAny>,
    num_draft_tokens: Option<&Bound<'py, PyAny>>,
    out: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let ids = IntArg::<Ix2>::extract(draft_token_ids, "draft_token_ids")?;
    let targets = IntArg::<Ix2>::extract(target_token_ids, "target_token_ids")?;
    let counts = optional(num_draft_tokens, |o| {
        IntArg::<Ix1>::extract(o, "num_draft_tokens")
    })?;
    let inputs = GreedyIdsInputs {
        draft_token_ids: ids.view(),
        target_token_ids: targets.view(),
        num_draft_tokens: counts.as_ref().map(IntArg::view),
    };
    let (batch, num_draft) = inputs.dims()?;
    let plan = OutPlan {
        out,
        inputs: given(out, || {
            vec![
                ("draft_token_ids", Some(draft_token_ids)),
                ("target_token_ids", Some(target_token_ids)),
                ("num_draft_tokens", num_draft_tokens),
            ]
        }),
        isolate: false,
    };
    plan.run(py, batch, num_draft, |out, _| {
        chain::verify_greedy(&inputs, out)
    })
}

fn shaped<'py, T: Element>(
    py: Python<'py>,
    shape: &[usize],
    values: Vec<T>,
) -> PyResult<Bound<'py, PyArrayDyn<T>>> {
    let array = ArrayD::from_shape_vec(IxDyn(shape), values)
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    Ok(PyArray::from_owned_array(py, array))
}

/// Elementwise rejection probability of same-shape arrays (see `specaccept.rejection_probability`).
#[pyfunction]
fn rejection_probability<'py>(
    py: Python<'py>,
    target_prob: &Bound<'py, PyAny>,
    draft_prob: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyArrayDyn<f64>>> {
    let p = FloatArg::<IxDyn>::extract(target_prob, "target_prob")?;
    let q = FloatArg::<IxDyn>::extract(draft_prob, "draft_prob")?;
    let (pv, qv) = (p.view(), q.view());
    let values = py.detach(|| rule::rejection_probability_array(&pv, &qv))?;
    shaped(py, pv.shape(), values)
}

/// Elementwise acceptance decisions of same-shape arrays (see `specaccept.acceptance_mask`).
#[pyfunction]
fn acceptance_mask<'py>(
    py: Python<'py>,
    target_prob: &Bound<'py, PyAny>,
    draft_prob: &Bound<'py, PyAny>,
    uniform: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyArrayDyn<bool>>> {
    let p = FloatArg::<IxDyn>::extract(target_prob, "target_prob")?;
    let q = FloatArg::<IxDyn>::extract(draft_prob, "draft_prob")?;
    let u = FloatArg::<IxDyn>::extract(uniform, "uniform")?;
    let (pv, qv, uv) = (p.view(), q.view(), u.view());
    let values = py.detach(|| rule::acceptance_mask_array(&pv, &qv, &uv))?;
    shaped(py, pv.shape(), values)
}

/// `sum(min(p, q))` over the last axis (see `specaccept.acceptance_rate`): float64
/// of the leading shape.
#[pyfunction]
fn acceptance_rate<'py>(
    py: Python<'py>,
    target_probs: &Bound<'py, PyAny>,
    draft_probs: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyArrayDyn<f64>>> {
    let p = FloatArg::<IxDyn>::extract(target_probs, "target_probs")?;
    let q = FloatArg::<IxDyn>::extract(draft_probs, "draft_probs")?;
    let shape = p.view().shape().to_vec();
    rate::check_shapes(&shape, q.view().shape())?;
    let leading = &shape[..shape.len().saturating_sub(1)];
    let out = zeros::<f64, IxDyn>(py, leading, "acceptance_rate", "target_probs [..., V]")?;
    {
        // SAFETY: a fresh array, shared with nothing.
        let mut out_view = unsafe { out.as_array_mut() };
        let flat = out_view
            .as_slice_mut()
            .map(ndarray::ArrayViewMut1::from)
            .ok_or_else(|| PyValueError::new_err("out: a fresh array is contiguous"))?;
        let (pv, qv) = (p.view(), q.view());
        macro_rules! run {
            ($p:expr) => {
                match qv {
                    FloatView::F16(q) => py.detach(|| rate::acceptance_rate($p, q, flat)),
                    FloatView::BF16(q) => py.detach(|| rate::acceptance_rate($p, q, flat)),
                    FloatView::F32(q) => py.detach(|| rate::acceptance_rate($p, q, flat)),
                    FloatView::F64(q) => py.detach(|| rate::acceptance_rate($p, q, flat)),
                }
            };
        }
        match pv {
            FloatView::F16(p) => run!(p),
            FloatView::BF16(p) => run!(p),
            FloatView::F32(p) => run!(p),
            FloatView::F64(p) => run!(p),
        }?;
    }
    Ok(out)
}

/// Accepted prefix length of a `[B, K]` bool mask (see `specaccept.accepted_prefix_length`).
#[pyfunction]
#[pyo3(signature = (accepted, num_draft_tokens))]
fn accepted_prefix_length<'py>(
    py: Python<'py>,
    accepted: &Bound<'py, PyAny>,
    num_draft_tokens: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyArray1<i64>>> {
    let mask = bool_arg::<Ix2>(accepted, "accepted")?;
    let counts = optional(num_draft_tokens, |o| {
        IntArg::<Ix1>::extract(o, "num_draft_tokens")
    })?;
    let mask_view = mask.as_array();
    let out = zeros::<i64, Ix1>(
        py,
        &[mask_view.shape()[0]],
        "accepted_prefix_length",
        "accepted [B, K]",
    )?;
    {
        // SAFETY: a fresh array, shared with nothing.
        let out_view = unsafe { out.as_array_mut() };
        let counts_view = counts.as_ref().map(IntArg::view);
        py.detach(|| chain::accepted_prefix_length(mask_view, counts_view, out_view))?;
    }
    Ok(out)
}

/// Stream `stream` of each row's counter-based uniforms: `[B, num_positions]`
/// float64 (docs/spec.md section 4.6; `generate` draws its drafts from stream 2).
#[pyfunction]
fn counter_stream<'py>(
    py: Python<'py>,
    seeds: &Bound<'py, PyAny>,
    offsets: &Bound<'py, PyAny>,
    num_positions: usize,
    stream: u32,
) -> PyResult<Bound<'py, PyArray2<f64>>> {
    let (seeds, offsets) = (u64_arg(seeds, "seeds")?, u64_arg(offsets, "offsets")?);
    let (seeds, offsets) = counter_keys(&seeds, &offsets, num_positions)?;
    let shape = [seeds.len(), num_positions];
    let out = zeros::<f64, Ix2>(py, &shape, "uniforms", "seeds [B] and num_positions")?;
    // SAFETY: a fresh array, shared with nothing.
    let mut view = unsafe { out.as_array_mut() };
    if let Some(flat) = view.as_slice_mut() {
        py.detach(|| philox::fill(seeds, offsets, stream, num_positions, flat));
    }
    Ok(out)
}

/// `(uniforms [B, n], recovery_uniforms [B])`.
type CounterUniforms<'py> = (Bound<'py, PyArray2<f64>>, Bound<'py, PyArray1<f64>>);

/// A call's counter-based uniforms (see `specaccept.counter_uniforms`):
/// `(uniforms [B, num_positions], recovery_uniforms [B])`, streams 0 and 1.
#[pyfunction]
fn counter_uniforms<'py>(
    py: Python<'py>,
    seeds: &Bound<'py, PyAny>,
    offsets: &Bound<'py, PyAny>,
    num_positions: usize,
) -> PyResult<CounterUniforms<'py>> {
    let (seeds, offsets) = (u64_arg(seeds, "seeds")?, u64_arg(offsets, "offsets")?);
    let (seeds, offsets) = counter_keys(&seeds, &offsets, num_positions)?;
    let sized_by = "seeds [B] and num_positions";
    let shape = [seeds.len(), num_positions];
    let uniforms = zeros::<f64, Ix2>(py, &shape, "uniforms", sized_by)?;
    let recovery = zeros::<f64, Ix1>(py, &[seeds.len()], "recovery_uniforms", sized_by)?;
    // SAFETY: fresh arrays, shared with nothing.
    let (mut u, mut r) = unsafe { (uniforms.as_array_mut(), recovery.as_array_mut()) };
    if let (Some(u), Some(r)) = (u.as_slice_mut(), r.as_slice_mut()) {
        py.detach(|| {
            philox::fill(seeds, offsets, philox::ACCEPTANCE, num_positions, u);
            philox::fill(seeds, offsets, philox::RECOVERY, 1, r);
        });
    }
    Ok((uniforms, recovery))
}

/// The seeds and offsets as slices of equal length, and `num_positions` checked
/// to fit a 32-bit index.
fn counter_keys<'a>(
    seeds: &'a Input<'_, u64, Ix1>,
    offsets: &'a Input<'_, u64, Ix1>,
    num_positions: usize,
) -> PyResult<(&'a [u64], &'a [u64])> {
    let (Some(s), Some(o)) = (seeds.as_slice(), offsets.as_slice()) else {
        return Err(PyTypeError::new_err("seeds and offsets must be contiguous"));
    };
    if s.len() != o.len() {
        let message = format!(
            "has shape ({},), expected ({},) (one per seed)",
            o.len(),
            s.len()
        );
        return Err(CoreError::shape("offsets", message).into());
    }
    if num_positions as u64 > 1 << 32 {
        let message = format!("{num_positions} is above 2**32 (a position index has 32 bits)");
        return Err(CoreError::shape("num_positions", message).into());
    }
    Ok((s, o))
}

/// A 1-D uint64 array (the Python layer converts seeds and offsets to one).
fn u64_arg<'py>(obj: &Bound<'py, PyAny>, name: &str) -> PyResult<Input<'py, u64, Ix1>> {
    let arr = ndarray_arg::<Ix1>(obj, name)?;
    if !is::<u64>(arr) {
        return Err(PyTypeError::new_err(format!(
            "{name} must have dtype uint64, got {}",
            arr.dtype()
        )));
    }
    borrow(arr, name)
}

/// The number of threads large batches are verified on.
#[pyfunction]
fn get_num_threads() -> usize {
    threads::num_threads()
}

/// Sets the number of threads for large batches (`1 <= n <= max_num_threads()`).
#[pyfunction]
fn set_num_threads(n: usize) -> PyResult<()> {
    Ok(threads::set_num_threads(n)?)
}

/// The largest thread count `set_num_threads` takes.
#[pyfunction]
fn max_num_threads() -> usize {
    threads::max_num_threads()
}

#[pymodule(gil_used = false)]
mod _native {
    #[pymodule_export]
    use super::{
        acceptance_mask, acceptance_rate, accepted_prefix_length, counter_stream, counter_uniforms,
        get_num_threads, max_num_threads, rejection_probability, set_num_threads, verify,
        verify_flat, verify_greedy, verify_logits, verify_tree,
    };

    #[pymodule_export]
    use super::NotInPlace;

    #[pymodule_export]
    const PARALLEL_MIN_ELEMENTS: usize = crate::threads::PARALLEL_MIN_ELEMENTS;
    #[pymodule_export]
    const MAX_THREADS_PER_CPU: usize = crate::threads::MAX_THREADS_PER_CPU;
    #[pymodule_export]
    const SUM_BLOCK: usize = crate::sample::SUM_BLOCK;
    #[pymodule_export]
    const SUM_LANES: usize = crate::simd::SUM_LANES;
}
