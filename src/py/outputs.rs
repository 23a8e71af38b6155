//! Arrays out: the caller's `out=` buffers (proved disjoint from every input and from
//! each other) or fresh ones, and the GIL released while the core writes them.

use ndarray::{Dimension, Ix1, Ix2};
use numpy::{
    PyArray, PyArray1, PyArray2, PyArrayDescrMethods, PyArrayMethods, PyUntypedArray,
    PyUntypedArrayMethods,
};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyList;
use pyo3::IntoPyObjectExt;

use super::arrays::{is, ndarray_arg, zeros};
use super::errors::{input_error, py_error};
use crate::chain::ChainOutputs;
use crate::error::{CoreError, RowErrors};

pub(super) type ChainResult<'py> = (
    Bound<'py, PyArray2<i64>>,
    Bound<'py, PyArray1<i64>>,
    Bound<'py, PyArray1<i64>>,
);

/// The bytes an array's elements occupy, `[first, last]` (`None` when empty).
pub(super) fn byte_span(arr: &Bound<'_, PyUntypedArray>) -> Option<(isize, isize)> {
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
pub(super) fn overlaps_itself(arr: &Bound<'_, PyUntypedArray>) -> bool {
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
pub(super) type Span<'a> = (&'a str, (isize, isize));

/// One caller-provided output array: int64, rank `D`, writeable, sharing no
/// memory with any input or with the outputs before it (`taken`, to which it
/// is added).
pub(super) fn out_array<'py, 'a, D: Dimension>(
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
pub(super) fn outputs<'py>(
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
    let mut taken = input_spans(inputs);
    let ids = out_array::<Ix2>(&ids, "out.output_token_ids", &mut taken)?;
    let accepted = out_array::<Ix1>(&accepted, "out.num_accepted", &mut taken)?;
    let emitted = match emitted.filter(|e| !e.is_none()) {
        Some(e) => out_array::<Ix1>(&e, "out.num_emitted", &mut taken)?,
        None => zeros(py, &[batch], "num_emitted", sized_by)?,
    };
    Ok((ids, accepted, emitted))
}

/// The bytes of each input array an output must not overlap.
pub(super) fn input_spans<'a>(inputs: &[(&'a str, Option<&Bound<'_, PyAny>>)]) -> Vec<Span<'a>> {
    inputs
        .iter()
        .filter_map(|&(name, value)| {
            let arr = value?.cast::<PyUntypedArray>().ok()?;
            Some((name, byte_span(arr)?))
        })
        .collect()
}

/// Room for one error slot per row when isolating (none otherwise).
pub(super) fn error_slots(isolate: bool, batch: usize) -> PyResult<Vec<Option<CoreError>>> {
    let mut slots = Vec::new();
    if isolate {
        crate::memory::reserve(&mut slots, batch, "draft_token_ids")?;
        slots.resize(batch, None);
    }
    Ok(slots)
}

/// The isolated rows as a list of `(row, InputError)`.
pub(super) fn isolated_rows<'py>(
    py: Python<'py>,
    slots: &[Option<CoreError>],
) -> PyResult<Bound<'py, PyList>> {
    let list = PyList::empty(py);
    for (b, error) in slots.iter().enumerate() {
        if let Some(error) = error {
            list.append((b, py_error(py, error).into_value(py)))?;
        }
    }
    Ok(list)
}

/// The outputs returned to Python: the three arrays, and with `isolate` the
/// bad rows as a list of `(row, InputError)`.
pub(super) type ChainReturn<'py> = (ChainResult<'py>, Option<Bound<'py, PyList>>);

/// Runs `work` on the output buffers with the GIL released, isolating bad
/// rows when asked (see `RowErrors`).
pub(super) fn with_outputs<'py>(
    py: Python<'py>,
    buffers: ChainResult<'py>,
    isolate: bool,
    work: impl FnOnce(&mut ChainOutputs<'_>, RowErrors<'_>) -> Result<(), CoreError> + Send,
) -> PyResult<ChainReturn<'py>> {
    let (ids, accepted, emitted) = buffers;
    let mut slots = error_slots(isolate, accepted.len())?;
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
        Some(isolated_rows(py, &slots)?)
    } else {
        None
    };
    Ok(((ids, accepted, emitted), bad))
}

/// Where the outputs go: the caller's `out` (checked against the `inputs`
/// it must not overlap) or fresh arrays, allocated once the inputs' shapes
/// are validated; and whether bad rows are isolated.
pub(super) struct OutPlan<'a, 'py> {
    pub(super) out: Option<&'a Bound<'py, PyAny>>,
    pub(super) inputs: Vec<(&'static str, Option<&'a Bound<'py, PyAny>>)>,
    pub(super) isolate: bool,
}

/// The inputs `out` must not overlap, listed only when there is an `out`.
pub(super) fn given<'a, 'py>(
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
    pub(super) fn run(
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
