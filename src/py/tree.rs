//! Tree verification: `verify_tree`.

use ndarray::{Ix1, Ix2, Ix3};
use numpy::{PyArray1, PyArray2, PyArrayMethods};
use pyo3::prelude::*;

use super::arrays::{each_dtype_pair, optional, zeros, FloatArg, IntArg};
use super::chain::GreedyArg;
use super::errors::input_error;
use crate::prob::Prob;
use crate::tree::{self, TreeInputs, TreeMethod, TreeOutputs};

pub(super) type TreeResult<'py> = (
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
pub(super) fn run_tree<'py, P: Prob, Q: Prob>(
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
