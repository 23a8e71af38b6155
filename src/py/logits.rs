//! Verification from logits: `verify_logits`.

use ndarray::{Ix1, Ix2, Ix3};
use pyo3::prelude::*;

use super::arrays::{each_dtype_pair, optional, FloatArg, IntArg};
use super::chain::MethodArg;
use super::outputs::OutPlan;
use crate::logits::{self, LogitsInputs};

/// Verification from logits (see `specaccept.verify_logits`); `temperature`,
/// `top_k`, `top_p` already broadcast to `[B]`.
#[pyfunction]
#[pyo3(signature = (draft_token_ids, target_logits, draft_logits, temperature, top_k, top_p, num_draft_tokens, uniforms, recovery_uniforms, isolate=false, method=None, draft_token_probs=None))]
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
