//! Counter-based uniforms: `counter_stream`, `counter_uniforms` (Philox4x32-10).

use ndarray::{Ix1, Ix2};
use numpy::{PyArray1, PyArray2, PyArrayMethods, PyUntypedArrayMethods};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;

use super::arrays::{borrow, is, ndarray_arg, zeros, Input};
use crate::error::CoreError;
use crate::philox;

/// Stream `stream` of each row's counter-based uniforms: `[B, num_positions]`
/// float64 (docs/spec.md section 4.6; `generate` draws its drafts from stream 2).
#[pyfunction]
pub(super) fn counter_stream<'py>(
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
pub(super) type CounterUniforms<'py> = (Bound<'py, PyArray2<f64>>, Bound<'py, PyArray1<f64>>);

/// A call's counter-based uniforms (see `specaccept.counter_uniforms`):
/// `(uniforms [B, num_positions], recovery_uniforms [B])`, streams 0 and 1.
#[pyfunction]
pub(super) fn counter_uniforms<'py>(
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
pub(super) fn counter_keys<'a>(
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
pub(super) fn u64_arg<'py>(obj: &Bound<'py, PyAny>, name: &str) -> PyResult<Input<'py, u64, Ix1>> {
    let arr = ndarray_arg::<Ix1>(obj, name)?;
    if !is::<u64>(arr) {
        return Err(PyTypeError::new_err(format!(
            "{name} must have dtype uint64, got {}",
            arr.dtype()
        )));
    }
    borrow(arr, name)
}
