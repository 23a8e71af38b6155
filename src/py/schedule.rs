//! `AdaptiveK`'s numbers (docs/spec.md sections 13.2 and 13.3):
//! `acceptance_rows`, `fit_step_cost` (a [`StepCost`]), `best_width` and
//! `best_ragged`. Private to
//! `specaccept._schedule`, which validates what it passes; anything else is a
//! `TypeError` or `InputError` here, never a panic.

use numpy::{Ix1, Ix2, PyArray1, PyArray2, PyArrayMethods, PyUntypedArrayMethods};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::arrays::{borrow, is, ndarray_arg, zeros, Input};
use super::errors::input_error;
use crate::schedule::{self, Rows};

/// A fitted step time (docs/spec.md section 13.3): the line `coef` and each
/// measured point's correction.
#[pyclass(frozen, module = "specaccept._native")]
pub(super) struct StepCost(schedule::StepCost);

#[pymethods]
impl StepCost {
    /// A cost from its line and its points' corrections (as `fit_step_cost`
    /// makes one; for tests and for costs measured elsewhere).
    #[new]
    fn new(coef: &Bound<'_, PyAny>, cells: &Bound<'_, PyDict>) -> PyResult<Self> {
        let coef = floats_of::<3>(coef, "coef")?;
        let mut points: Vec<(f64, f64, f64)> = Vec::with_capacity(cells.len());
        for (key, value) in cells.iter() {
            let [x, f] = floats_of::<2>(&key, "cells")?;
            let (x, f) = (x + 0.0, f + 0.0); // -0.0 is the point 0.0
            let shift = float(&value, "cells")?;
            points.retain(|&(px, pf, _)| (px, pf) != (x, f));
            points.push((x, f, shift));
        }
        Ok(Self(schedule::StepCost::new(coef, points)))
    }

    /// `(fixed, per_target_token, per_draft_forward)` seconds.
    #[getter]
    fn coef(&self) -> (f64, f64, f64) {
        let [a, b, c] = self.0.coef;
        (a, b, c)
    }

    /// `{(target_tokens, draft_forwards): seconds}`: each measured point's
    /// correction to the line.
    #[getter]
    fn cells<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let cells = PyDict::new(py);
        for &(x, f, c) in &self.0.cells {
            cells.set_item((x, f), c)?;
        }
        Ok(cells)
    }

    /// The predicted seconds of a step computing `target_tokens` and
    /// `draft_forwards` (at least a nanosecond).
    fn seconds(
        &self,
        target_tokens: &Bound<'_, PyAny>,
        draft_forwards: &Bound<'_, PyAny>,
    ) -> PyResult<f64> {
        let x = float(target_tokens, "target_tokens")?;
        let f = float(draft_forwards, "draft_forwards")?;
        Ok(self.0.seconds(x, f))
    }

    fn __repr__(&self) -> String {
        let [a, b, c] = self.0.coef;
        format!(
            "StepCost(coef=({a}, {b}, {c}), cells={})",
            self.0.cells.len()
        )
    }
}

/// `(alpha [R, D], reach [R, D + 1], cumulative [R, D + 1])`.
type Acceptance<'py> = (
    Bound<'py, PyArray2<f64>>,
    Bound<'py, PyArray2<f64>>,
    Bound<'py, PyArray2<f64>>,
);

/// Each request's acceptance per draft depth from its discounted counts
/// (`accepted`, `tried`: `[R, D]`), `pooled` the prior at depth 0 and
/// `prior_weight` its weight: `(alpha, reach, cumulative)` (docs/spec.md section
/// 13.2).
#[pyfunction]
pub(super) fn acceptance_rows<'py>(
    py: Python<'py>,
    accepted: &Bound<'py, PyAny>,
    tried: &Bound<'py, PyAny>,
    pooled: &Bound<'py, PyAny>,
    prior_weight: &Bound<'py, PyAny>,
) -> PyResult<Acceptance<'py>> {
    let pooled = float(pooled, "pooled")?;
    let prior_weight = float(prior_weight, "prior_weight")?;
    let (accepted, shape) = floats::<Ix2>(accepted, "accepted")?;
    let (tried, tried_shape) = floats::<Ix2>(tried, "tried")?;
    if tried_shape != shape {
        let message = format!("tried has shape {tried_shape:?}, accepted {shape:?}");
        return Err(input_error("tried", message));
    }
    let (rows, depths) = (shape[0], shape[1]);
    let sized_by = "accepted [R, D]";
    let wide = [rows, depths + 1];
    let alpha = zeros::<f64, Ix2>(py, &[rows, depths], "alpha", sized_by)?;
    let reach = zeros::<f64, Ix2>(py, &wide, "reach", sized_by)?;
    let cumulative = zeros::<f64, Ix2>(py, &wide, "cumulative", sized_by)?;
    {
        // SAFETY: fresh arrays, shared with nothing.
        let (mut a, mut r, mut c) = unsafe {
            (
                alpha.as_array_mut(),
                reach.as_array_mut(),
                cumulative.as_array_mut(),
            )
        };
        if let (Some(a), Some(r), Some(c)) = (a.as_slice_mut(), r.as_slice_mut(), c.as_slice_mut())
        {
            let out = schedule::AcceptanceRows {
                alpha: a,
                reach: r,
                cumulative: c,
            };
            let (accepted, tried) = (slice(&accepted, "accepted")?, slice(&tried, "tried")?);
            schedule::acceptance_rows(accepted, tried, depths, pooled, prior_weight, out);
        }
    }
    Ok((alpha, reach, cumulative))
}

/// The step time fitted to the measured steps (seconds `t`, target tokens `x`,
/// draft forwards `f`, oldest first; each weighted `keep**age`), or `None` while
/// they do not tell a fixed cost from a per-token one.
#[pyfunction]
pub(super) fn fit_step_cost(
    t: &Bound<'_, PyAny>,
    x: &Bound<'_, PyAny>,
    f: &Bound<'_, PyAny>,
    keep: &Bound<'_, PyAny>,
) -> PyResult<Option<StepCost>> {
    let keep = float(keep, "keep")?;
    let (t, x, f) = (
        floats::<Ix1>(t, "t")?.0,
        floats::<Ix1>(x, "x")?.0,
        floats::<Ix1>(f, "f")?.0,
    );
    let (t, x, f) = (slice(&t, "t")?, slice(&x, "x")?, slice(&f, "f")?);
    if x.len() != t.len() || f.len() != t.len() {
        return Err(input_error(
            "x",
            format!(
                "t, x and f must have one value per step, got {}, {} and {}",
                t.len(),
                x.len(),
                f.len()
            ),
        ));
    }
    if !(0.0..=1.0).contains(&keep) {
        return Err(input_error(
            "keep",
            format!("keep must lie in [0, 1], got {keep}"),
        ));
    }
    Ok(schedule::fit(t, x, f, keep).map(StepCost))
}

/// A padded backend's choice: each request's drafts (`min(cap, w)` for the best
/// width `w`), from `cumulative [R, D + 1]` (each request's expected tokens per
/// number of drafts) and `cap [R]`, with `remaining [R]` or `None`.
#[pyfunction]
#[pyo3(signature = (cost, cumulative, cap, min_k, remaining=None))]
pub(super) fn best_width<'py>(
    py: Python<'py>,
    cost: &StepCost,
    cumulative: &Bound<'py, PyAny>,
    cap: &Bound<'py, PyAny>,
    min_k: &Bound<'py, PyAny>,
    remaining: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyArray1<i64>>> {
    let min_k = fewest(min_k)?;
    let inputs = RowsInput::new(cumulative, cap, remaining)?;
    let rows = inputs.rows()?;
    Ok(PyArray1::from_vec(
        py,
        schedule::best_width(&rows, min_k, &cost.0),
    ))
}

/// A ragged backend's choice (see `best_width`; `reach [R, D + 1]`: the expected
/// tokens each request's `j`-th draft adds).
#[pyfunction]
#[pyo3(signature = (cost, reach, cumulative, cap, min_k, remaining=None))]
pub(super) fn best_ragged<'py>(
    py: Python<'py>,
    cost: &StepCost,
    reach: &Bound<'py, PyAny>,
    cumulative: &Bound<'py, PyAny>,
    cap: &Bound<'py, PyAny>,
    min_k: &Bound<'py, PyAny>,
    remaining: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyArray1<i64>>> {
    let min_k = fewest(min_k)?;
    let inputs = RowsInput::new(cumulative, cap, remaining)?;
    let rows = inputs.rows()?;
    let (reach, reach_shape) = floats::<Ix2>(reach, "reach")?;
    if reach_shape != inputs.cumulative_shape {
        let message = format!(
            "reach has shape {reach_shape:?}, cumulative {:?}: they must be the same",
            inputs.cumulative_shape
        );
        return Err(input_error("reach", message));
    }
    let reach = slice(&reach, "reach")?;
    Ok(PyArray1::from_vec(
        py,
        schedule::best_ragged(&rows, reach, min_k, &cost.0),
    ))
}

/// The arrays a choice reads, borrowed.
struct RowsInput<'py> {
    cumulative: Input<'py, f64, Ix2>,
    cumulative_shape: Vec<usize>,
    cap: Input<'py, i64, Ix1>,
    remaining: Option<Input<'py, f64, Ix1>>,
}

impl<'py> RowsInput<'py> {
    fn new(
        cumulative: &Bound<'py, PyAny>,
        cap: &Bound<'py, PyAny>,
        remaining: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Self> {
        let (cumulative, cumulative_shape) = floats::<Ix2>(cumulative, "cumulative")?;
        let cap_arr = ndarray_arg::<Ix1>(cap, "cap")?;
        if !is::<i64>(cap_arr) {
            return Err(PyTypeError::new_err("cap must have dtype int64"));
        }
        let cap = borrow::<i64, Ix1>(cap_arr, "cap")?;
        let remaining = match remaining {
            Some(obj) if !obj.is_none() => Some(floats::<Ix1>(obj, "remaining")?.0),
            _ => None,
        };
        Ok(Self {
            cumulative,
            cumulative_shape,
            cap,
            remaining,
        })
    }

    fn rows(&self) -> PyResult<Rows<'_>> {
        let rows = Rows {
            cumulative: slice(&self.cumulative, "cumulative")?,
            depths: self.cumulative_shape[1],
            cap: slice(&self.cap, "cap")?,
            remaining: match &self.remaining {
                Some(left) => Some(slice(left, "remaining")?),
                None => None,
            },
        };
        if !schedule::rows_consistent(&rows) {
            return Err(input_error(
                "cap",
                "cumulative must be [R, D + 1] with D + 1 >= 1, cap [R] in [0, D], remaining [R]"
                    .to_string(),
            ));
        }
        if rows
            .remaining
            .is_some_and(|left| left.iter().any(|&v| v.is_nan() || v < 1.0))
        {
            return Err(input_error(
                "remaining",
                "remaining must be >= 1".to_string(),
            ));
        }
        Ok(rows)
    }
}

/// An `OverflowError` (a Python int past the native type) as an `InputError`
/// (a `ValueError`) naming `name`; any other error as it is.
fn in_range(obj: &Bound<'_, PyAny>, name: &str, err: PyErr) -> PyErr {
    if err.is_instance_of::<pyo3::exceptions::PyOverflowError>(obj.py()) {
        input_error(name, format!("{name} is out of range: {err}"))
    } else {
        err
    }
}

/// `obj` as a float (see [`in_range`]).
fn float(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<f64> {
    obj.extract::<f64>().map_err(|err| in_range(obj, name, err))
}

/// `obj` as a pair or triple of floats (see [`in_range`]).
fn floats_of<const N: usize>(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<[f64; N]> {
    let items: Vec<Bound<'_, PyAny>> = obj
        .extract::<Vec<Bound<'_, PyAny>>>()
        .map_err(|_| PyTypeError::new_err(format!("{name} must be a tuple of {N} numbers")))?;
    if items.len() != N {
        return Err(input_error(
            name,
            format!("{name} must have {N} numbers, got {}", items.len()),
        ));
    }
    let mut out = [0.0; N];
    for (slot, item) in out.iter_mut().zip(&items) {
        *slot = float(item, name)?;
    }
    Ok(out)
}

/// `min_k`, `>= 0`.
fn fewest(obj: &Bound<'_, PyAny>) -> PyResult<i64> {
    let min_k: i64 = obj
        .extract::<i64>()
        .map_err(|err| in_range(obj, "min_k", err))?;
    if min_k < 0 {
        return Err(input_error(
            "min_k",
            format!("min_k must be >= 0, got {min_k}"),
        ));
    }
    Ok(min_k)
}

/// A float64 array of rank `D` in C order (a Fortran-ordered one is contiguous
/// too, but its rows are not runs of the slice), borrowed, and its shape; else a
/// `TypeError` (dtype, order) or an `InputError` (rank).
fn floats<'py, D: ndarray::Dimension>(
    obj: &Bound<'py, PyAny>,
    name: &str,
) -> PyResult<(Input<'py, f64, D>, Vec<usize>)> {
    let arr = ndarray_arg::<D>(obj, name)?;
    if !is::<f64>(arr) {
        return Err(PyTypeError::new_err(format!(
            "{name} must have dtype float64, got {}",
            arr.dtype()
        )));
    }
    if !arr.is_c_contiguous() {
        return Err(PyTypeError::new_err(format!("{name} must be C-contiguous")));
    }
    Ok((borrow(arr, name)?, arr.shape().to_vec()))
}

/// The array's elements as one slice (contiguous), else a `TypeError`.
fn slice<'a, T: numpy::Element, D: ndarray::Dimension>(
    input: &'a Input<'_, T, D>,
    name: &str,
) -> PyResult<&'a [T]> {
    input
        .as_slice()
        .ok_or_else(|| PyTypeError::new_err(format!("{name} must be C-contiguous")))
}
