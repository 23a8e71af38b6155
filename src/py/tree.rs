//! Tree verification: `verify_tree` and `verify_tree_logits`.

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
use crate::logits::tree::{verify_tree_logits as verify_logits_source, TreeLogitsInputs};
use crate::tree::{self, TreeInputs, TreeMethod, TreeOutputs};
use crate::view::IntView;

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
    let method = tree_method(method)?;
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
        ($p:expr, $q:expr) => {{
            let inputs = TreeInputs {
                node_token_ids: ids.view(),
                parent_ids: parents.view(),
                target_probs: $p,
                draft_probs: $q,
                uniforms: u.as_ref().map(FloatArg::view),
                recovery_uniforms: ru.as_ref().map(FloatArg::view),
                greedy: greedy_rows.view(),
                method,
            };
            let (batch, _, _) = inputs.dims()?;
            plan.run(py, batch, &inputs.parent_ids, |out, errors| {
                tree::verify_tree(&inputs, out, errors)
            })
        }};
    }
    each_dtype_pair!(&target, &draft, ndarray::ArrayView3<'_, f64>, run)
}

/// Tree verification from logits (see `specaccept.verify_tree_logits`);
/// `parent_ids` already `[B, N]`, `temperature`, `top_k`, `top_p` already `[B]`;
/// `out` and the result as for `verify_tree`.
#[pyfunction]
#[pyo3(signature = (node_token_ids, parent_ids, target_logits, draft_logits, temperature, top_k, top_p, uniforms, recovery_uniforms, method="token", out=None, isolate=false, min_p=None, min_p_last=false))]
#[allow(clippy::too_many_arguments)]
pub(super) fn verify_tree_logits<'py>(
    py: Python<'py>,
    node_token_ids: &Bound<'py, PyAny>,
    parent_ids: &Bound<'py, PyAny>,
    target_logits: &Bound<'py, PyAny>,
    draft_logits: Option<&Bound<'py, PyAny>>,
    temperature: &Bound<'py, PyAny>,
    top_k: &Bound<'py, PyAny>,
    top_p: &Bound<'py, PyAny>,
    uniforms: Option<&Bound<'py, PyAny>>,
    recovery_uniforms: Option<&Bound<'py, PyAny>>,
    method: &str,
    out: Option<&Bound<'py, PyAny>>,
    isolate: bool,
    min_p: Option<&Bound<'py, PyAny>>,
    min_p_last: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let method = tree_method(method)?;
    let ids = IntArg::<Ix2>::extract(node_token_ids, "node_token_ids")?;
    let parents = IntArg::<Ix2>::extract(parent_ids, "parent_ids")?;
    let target = FloatArg::<Ix3>::extract(target_logits, "target_logits")?;
    let draft = optional(draft_logits, |o| {
        FloatArg::<Ix3>::extract(o, "draft_logits")
    })?;
    let temperature_rows = FloatArg::<Ix1>::extract(temperature, "temperature")?;
    let top_k_rows = IntArg::<Ix1>::extract(top_k, "top_k")?;
    let top_p_rows = FloatArg::<Ix1>::extract(top_p, "top_p")?;
    let min_p_rows = optional(min_p, |o| FloatArg::<Ix1>::extract(o, "min_p"))?;
    let u = optional(uniforms, |o| FloatArg::<Ix2>::extract(o, "uniforms"))?;
    let ru = optional(recovery_uniforms, |o| {
        FloatArg::<Ix1>::extract(o, "recovery_uniforms")
    })?;
    let plan = TreeOutPlan {
        out,
        inputs: given(out, || {
            vec![
                ("node_token_ids", Some(node_token_ids)),
                ("parent_ids", Some(parent_ids)),
                ("target_logits", Some(target_logits)),
                ("draft_logits", draft_logits),
                ("temperature", Some(temperature)),
                ("top_k", Some(top_k)),
                ("top_p", Some(top_p)),
                ("min_p", min_p),
                ("uniforms", uniforms),
                ("recovery_uniforms", recovery_uniforms),
            ]
        }),
        isolate,
    };
    macro_rules! run {
        ($p:expr, $q:expr) => {{
            let inputs = TreeLogitsInputs {
                node_token_ids: ids.view(),
                parent_ids: parents.view(),
                target_logits: $p,
                draft_logits: $q,
                temperature: temperature_rows.view(),
                top_k: top_k_rows.view(),
                top_p: top_p_rows.view(),
                min_p: min_p_rows.as_ref().map(FloatArg::view),
                min_p_last,
                uniforms: u.as_ref().map(FloatArg::view),
                recovery_uniforms: ru.as_ref().map(FloatArg::view),
                method,
            };
            let (batch, _, _) = inputs.dims()?;
            plan.run(py, batch, &inputs.parent_ids, |out, errors| {
                verify_logits_source(&inputs, out, errors)
            })
        }};
    }
    each_dtype_pair!(&target, &draft, ndarray::ArrayView3<'_, f64>, run)
}

fn tree_method(method: &str) -> PyResult<TreeMethod> {
    match method {
        "token" => Ok(TreeMethod::Token),
        "traversal" => Ok(TreeMethod::Traversal),
        other => Err(input_error(
            "method",
            format!("method must be \"token\" or \"traversal\", got {other:?}"),
        )),
    }
}

/// Where a tree's outputs go (the caller's `out`, checked against `inputs`, or
/// fresh arrays) and whether bad rows are isolated.
struct TreeOutPlan<'a, 'py> {
    out: Option<&'a Bound<'py, PyAny>>,
    inputs: Vec<(&'static str, Option<&'a Bound<'py, PyAny>>)>,
    isolate: bool,
}

impl<'py> TreeOutPlan<'_, 'py> {
    /// After the shapes (`batch` from them): the walk over the parent links
    /// (which sizes fresh outputs: `D` over the rows not set aside), then the
    /// outputs, then `work` with the GIL released.
    fn run(
        &self,
        py: Python<'py>,
        batch: usize,
        parent_ids: &IntView<'_, Ix2>,
        work: impl FnOnce(&mut TreeOutputs<'_>, RowErrors<'_>) -> Result<(), CoreError> + Send,
    ) -> PyResult<Bound<'py, PyAny>> {
        let mut slots = error_slots(self.isolate, batch)?;
        let isolate = self.isolate;
        let deepest = tree::tree_depth(parent_ids, &mut row_errors(isolate, &mut slots))?;
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
            py.detach(|| work(&mut out, errors))?;
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
