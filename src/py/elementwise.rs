//! The elementwise primitives: `rejection_probability`, `acceptance_mask`, and the
//! analytic `acceptance_rate`.

use ndarray::{ArrayD, IxDyn};
use numpy::{Element, PyArray, PyArrayDyn, PyArrayMethods};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use super::arrays::{zeros, FloatArg};
use crate::rate;
use crate::rule;
use crate::view::FloatView;

pub(super) fn shaped<'py, T: Element>(
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
pub(super) fn rejection_probability<'py>(
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
pub(super) fn acceptance_mask<'py>(
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
pub(super) fn acceptance_rate<'py>(
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
