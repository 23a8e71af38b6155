//! Verification from logits: `verify_logits`.

use ndarray::{Ix1, Ix2, Ix3};
use pyo3::prelude::*;

use super::arrays::{each_dtype_pair, optional, FloatArg, IntArg};
use super::chain::MethodArg;
use super::outputs::OutPlan;
use crate::error::CoreError;
use crate::logits::{self, Draft, LogitsInputs, Rows};

/// Verification from logits (see `specaccept.verify_logits`); `temperature`,
/// `top_k`, `top_p` already broadcast to `[B]`. With `target_row_starts` the
/// logits are in the flat layout (`specaccept.compat.vllm.verify_logits`):
/// `target_logits [R, V]`, request `b`'s rows from `target_row_starts[b]`,
/// and `draft_logits [T, V]` from `draft_row_starts[b]`. `draft_probs`: the
/// draft rows are probabilities, read as they are.
#[pyfunction]
#[pyo3(signature = (draft_token_ids, target_logits, draft_logits, temperature, top_k, top_p, num_draft_tokens, uniforms, recovery_uniforms, isolate=false, method=None, draft_token_probs=None, target_row_starts=None, draft_row_starts=None, draft_probs=false))]
#[allow(clippy::too_many_arguments)]
pub(super) fn verify_logits<'py>(
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
    target_row_starts: Option<&Bound<'py, PyAny>>,
    draft_row_starts: Option<&Bound<'py, PyAny>>,
    draft_probs: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let method_arg = MethodArg::extract(method)?;
    let method = method_arg.method()?;
    let ids = IntArg::<Ix2>::extract(draft_token_ids, "draft_token_ids")?;
    let given_q = optional(draft_token_probs, |o| {
        FloatArg::<Ix2>::extract(o, "draft_token_probs")
    })?;
    let draft_arg = if draft_probs {
        "draft_probs"
    } else {
        "draft_logits"
    };
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
    let target_starts = optional(target_row_starts, |o| {
        IntArg::<Ix1>::extract(o, "target_row_starts")
    })?;
    let draft_starts = optional(draft_row_starts, |o| {
        IntArg::<Ix1>::extract(o, "draft_row_starts")
    })?;
    let plan = OutPlan {
        out: None,
        inputs: Vec::new(),
        isolate,
    };
    macro_rules! run {
        ($target:expr, $draft:expr) => {{
            let inputs = LogitsInputs {
                draft_token_ids: ids.view(),
                target_logits: $target,
                draft: $draft,
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
    let Some(target_starts) = target_starts else {
        let target = FloatArg::<Ix3>::extract(target_logits, "target_logits")?;
        let draft = optional(draft_logits, |o| FloatArg::<Ix3>::extract(o, draft_arg))?;
        macro_rules! padded {
            ($p:expr, $q:expr) => {
                run!(
                    Rows::Padded($p),
                    draft_of($q.map(Rows::Padded), draft_probs)
                )
            };
        }
        return each_dtype_pair!(&target, &draft, ndarray::ArrayView3<'_, f64>, padded);
    };
    let target = FloatArg::<Ix2>::extract(target_logits, "target_logits")?;
    let draft = optional(draft_logits, |o| FloatArg::<Ix2>::extract(o, draft_arg))?;
    let draft_starts = match (&draft, draft_starts) {
        (None, _) => None,
        (Some(_), Some(starts)) => Some(starts),
        (Some(_), None) => {
            return Err(CoreError::shape(
                "draft_row_starts",
                "is needed with draft rows in the flat layout",
            )
            .into())
        }
    };
    let (t_starts, t_arg) = (target_starts.view(), "target_row_starts");
    let d_starts = draft_starts
        .as_ref()
        .map(|s| (s.view(), "draft_row_starts"));
    macro_rules! flat {
        ($p:expr, $q:expr) => {{
            let draft = $q
                .zip(d_starts)
                .map(|(rows, (starts, starts_arg))| Rows::Flat {
                    rows,
                    starts,
                    starts_arg,
                });
            let target = Rows::Flat {
                rows: $p,
                starts: t_starts,
                starts_arg: t_arg,
            };
            run!(target, draft_of(draft, draft_probs))
        }};
    }
    each_dtype_pair!(&target, &draft, ndarray::ArrayView2<'_, f64>, flat)
}

/// The draft side: rows of logits, of probabilities (`probs`), or none.
fn draft_of<Q>(rows: Option<Rows<'_, Q>>, probs: bool) -> Draft<'_, Q> {
    match rows {
        None => Draft::OneHot,
        Some(rows) if probs => Draft::Probs(rows),
        Some(rows) => Draft::Logits(rows),
    }
}
