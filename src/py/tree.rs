//! Tree verification: `verify_tree`.

use ndarray::{Ix1, Ix2, Ix3};
use numpy::{PyArray1, PyArray2, PyArrayMethods};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::IntoPyObjectExt;

use super::arrays::{each_dtype_pair, optional, zeros, FloatArg, IntArg};
use super::chain::GreedyArg;
use super::errors::input_error;
use super::outputs::{error_slots, given, input_spans, isolated_rows, out_array};
use crate::error::{CoreError, RowErrors};
use crate::prob::Prob;
use crate::tree::{self, TreeInputs, TreeMethod, TreeOutputs};

pub(super) type TreeResult<'py> = (
    Bound<'py, PyArray2<i64>>,
    Bound<'py, PyArray1<i64>>,
    Bound<'py, PyArray1<i64>>,
    Bound<'py, PyArray2<i64>>,
);

/// Tree verification (see `specaccept.verify_tree`); `parent_ids` already `[B, N]`
/// (a broadcast view when shared); `out` a tuple `(output_token_ids, num_accepted,
/// num_emitted or None, accepted_node_ids)` or `None`. Returns `(output_token_ids,
/// num_accepted, num_emitted, accepted_node_ids)`, and with `isolate` the bad rows
/// as a list of `(row, InputError)`.
#[pyfunction]
#[pyo3(signature = (node_token_ids, parent_ids, target_probs, draft_probs, uniforms, recovery_uniforms, greedy, method="token", out=None, isolate=false))]
#[allow(clippy::too_many_arguments)]
pub(super) fn verify_tree<'py>(
    py: Python<'py>,
    node_token_ids: &Bound<'py, PyAny>,
    parent_ids: &Bound<'py, PyAny>,
    target_probs: &Bound<'py, PyAny>,
    draft_probs: Option<&Bound<'py, PyAny>>,
    uniforms: Option<&Bound<'py, PyAny>>,
    recovery_uniforms: Option<&Bound<'py, PyAny>>,
    greedy: &Bound<'py, PyAny>,
    method: &str,
    out: Option<&Bound<'py, PyAny>>,
    isolate: bool,
) -> PyResult<Bound<'py, PyAny>> {
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
    let plan = TreeOutPlan {
        out,
        inputs: given(out, || {
            vec![
                ("node_token_ids", Some(node_token_ids)),
                ("parent_ids", Some(parent_ids)),
                ("target_probs", Some(target_probs)),
                ("draft_probs", draft_probs),
                ("uniforms", uniforms),
                ("recovery_uniforms", recovery_uniforms),
                ("greedy", Some(greedy)),
            ]
        }),
        isolate,
    };
    macro_rules! run {
        ($p:expr, $q:expr) => {
            plan.run(
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

/// Where a tree's outputs go (the caller's `out`, checked against `inputs`, or
/// fresh arrays) and whether bad rows are isolated.
struct TreeOutPlan<'a, 'py> {
    out: Option<&'a Bound<'py, PyAny>>,
    inputs: Vec<(&'static str, Option<&'a Bound<'py, PyAny>>)>,
    isolate: bool,
}

impl<'py> TreeOutPlan<'_, 'py> {
    /// Shapes first, then the walk over the parent links (which sizes fresh
    /// outputs: `D` over the rows not set aside), then the outputs, then the work.
    fn run<P: Prob, Q: Prob>(
        &self,
        py: Python<'py>,
        inputs: TreeInputs<'_, P, Q>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let (batch, _, _) = inputs.dims()?;
        let mut slots = error_slots(self.isolate, batch)?;
        let isolate = self.isolate;
        let deepest = tree::tree_depth(&inputs.parent_ids, &mut row_errors(isolate, &mut slots))?;
        let outputs = self.outputs(py, batch, deepest)?;
        {
            // SAFETY: fresh arrays, or caller buffers that `outputs` checked to be
            // writeable, aligned int64 and disjoint from each other and every input.
            let mut out = unsafe {
                TreeOutputs {
                    output_token_ids: outputs.0.as_array_mut(),
                    num_accepted: outputs.1.as_array_mut(),
                    num_emitted: outputs.2.as_array_mut(),
                    accepted_node_ids: outputs.3.as_array_mut(),
                }
            };
            let errors = row_errors(isolate, &mut slots);
            py.detach(|| tree::verify_tree(&inputs, &mut out, errors))?;
        }
        if self.isolate {
            let bad = isolated_rows(py, &slots)?;
            (outputs.0, outputs.1, outputs.2, outputs.3, bad).into_bound_py_any(py)
        } else {
            outputs.into_bound_py_any(py)
        }
    }

    /// The caller's buffers (any width `W + 1` with `W >= D`, checked by the
    /// core) or fresh ones of width `D + 1`.
    fn outputs(&self, py: Python<'py>, batch: usize, deepest: usize) -> PyResult<TreeResult<'py>> {
        let sized_by = "node_token_ids [B, N] and the deepest path D of parent_ids";
        let Some(out) = self.out.filter(|o| !o.is_none()) else {
            return Ok((
                zeros::<i64, Ix2>(py, &[batch, deepest + 1], "output_token_ids", sized_by)?,
                zeros::<i64, Ix1>(py, &[batch], "num_accepted", sized_by)?,
                zeros::<i64, Ix1>(py, &[batch], "num_emitted", sized_by)?,
                zeros::<i64, Ix2>(py, &[batch, deepest], "accepted_node_ids", sized_by)?,
            ));
        };
        type Given<'py> = (
            Bound<'py, PyAny>,
            Bound<'py, PyAny>,
            Option<Bound<'py, PyAny>>,
            Bound<'py, PyAny>,
        );
        let (ids, accepted, emitted, nodes): Given<'py> = out.extract().map_err(|_| {
            PyTypeError::new_err(
                "out must be a tuple (output_token_ids, num_accepted, num_emitted or None, accepted_node_ids)",
            )
        })?;
        let mut taken = input_spans(&self.inputs);
        let ids = out_array::<Ix2>(&ids, "out.output_token_ids", &mut taken)?;
        let accepted = out_array::<Ix1>(&accepted, "out.num_accepted", &mut taken)?;
        let emitted = match emitted.filter(|e| !e.is_none()) {
            Some(e) => out_array::<Ix1>(&e, "out.num_emitted", &mut taken)?,
            None => zeros(py, &[batch], "num_emitted", sized_by)?,
        };
        let nodes = out_array::<Ix2>(&nodes, "out.accepted_node_ids", &mut taken)?;
        Ok((ids, accepted, emitted, nodes))
    }
}

/// What a bad row does: isolated into `slots`, or the call fails.
fn row_errors(isolate: bool, slots: &mut [Option<CoreError>]) -> RowErrors<'_> {
    if isolate {
        RowErrors::Isolate(slots)
    } else {
        RowErrors::Raise
    }
}
