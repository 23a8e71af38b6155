//! Verification from logits: `verify_logits` (the padded layout) and
//! `verify_flat_logits` (vLLM's flat layout, `specaccept.compat.vllm`).

use ndarray::{Ix1, Ix2, Ix3};
use pyo3::prelude::*;

use super::arrays::{each_dtype_pair, optional, FloatArg, IntArg};
use super::chain::MethodArg;
use super::outputs::OutPlan;
use crate::logits::flat::flat_layout;
use crate::logits::{self, Draft, LogitsInputs, Rows};
use crate::view::{FloatView, IntView};

/// Verification from logits (see `specaccept.verify_logits`); `temperature`,
/// `top_k`, `top_p` already broadcast to `[B]`.
#[pyfunction]
#[pyo3(signature = (draft_token_ids, target_logits, draft_logits, temperature, top_k, top_p, num_draft_tokens, uniforms, recovery_uniforms, isolate=false, method=None, draft_token_probs=None, min_p=None, min_p_last=false))]
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
    min_p: Option<&Bound<'py, PyAny>>,
    min_p_last: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let method_arg = MethodArg::extract(method)?;
    let ids = IntArg::<Ix2>::extract(draft_token_ids, "draft_token_ids")?;
    let target = FloatArg::<Ix3>::extract(target_logits, "target_logits")?;
    let given_q = optional(draft_token_probs, |o| {
        FloatArg::<Ix2>::extract(o, "draft_token_probs")
    })?;
    let draft = optional(draft_logits, |o| {
        FloatArg::<Ix3>::extract(o, "draft_logits")
    })?;
    let params = Params::extract(temperature, top_k, top_p, min_p, min_p_last)?;
    let counts = optional(num_draft_tokens, |o| {
        IntArg::<Ix1>::extract(o, "num_draft_tokens")
    })?;
    let u = optional(uniforms, |o| FloatArg::<Ix2>::extract(o, "uniforms"))?;
    let ru = optional(recovery_uniforms, |o| {
        FloatArg::<Ix1>::extract(o, "recovery_uniforms")
    })?;
    let per_row = PerRow {
        ids: ids.view(),
        counts: counts.as_ref().map(IntArg::view),
        uniforms: u.as_ref().map(FloatArg::view),
        recovery_uniforms: ru.as_ref().map(FloatArg::view),
        draft_token_probs: given_q.as_ref().map(FloatArg::view),
    };
    macro_rules! padded {
        ($p:expr, $q:expr) => {
            run(
                py,
                &params,
                &per_row,
                &method_arg,
                isolate,
                Rows::Padded($p),
                $q.map(Rows::Padded).map_or(Draft::OneHot, Draft::Logits),
            )
        };
    }
    each_dtype_pair!(&target, &draft, ndarray::ArrayView3<'_, f64>, padded)
}

/// Verification from logits in vLLM's flat layout (see
/// `specaccept.compat.vllm.verify_logits`): `draft_token_ids [T]`,
/// `num_draft_tokens [B]`, `logits [T + B, V]`, `draft_probs [T, V]` (the
/// drafter's probabilities, read as given), `uniforms [T]`; the per-request
/// parameters already broadcast to `[B]`.
#[pyfunction]
#[pyo3(signature = (draft_token_ids, num_draft_tokens, logits, draft_probs, temperature, top_k, top_p, uniforms, recovery_uniforms, isolate=false, method=None, min_p=None, min_p_last=false))]
#[allow(clippy::too_many_arguments)]
pub(super) fn verify_flat_logits<'py>(
    py: Python<'py>,
    draft_token_ids: &Bound<'py, PyAny>,
    num_draft_tokens: &Bound<'py, PyAny>,
    logits: &Bound<'py, PyAny>,
    draft_probs: Option<&Bound<'py, PyAny>>,
    temperature: &Bound<'py, PyAny>,
    top_k: &Bound<'py, PyAny>,
    top_p: &Bound<'py, PyAny>,
    uniforms: Option<&Bound<'py, PyAny>>,
    recovery_uniforms: Option<&Bound<'py, PyAny>>,
    isolate: bool,
    method: Option<&Bound<'py, PyAny>>,
    min_p: Option<&Bound<'py, PyAny>>,
    min_p_last: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let method_arg = MethodArg::extract(method)?;
    let ids = IntArg::<Ix1>::extract(draft_token_ids, "draft_token_ids")?;
    let counts = IntArg::<Ix1>::extract(num_draft_tokens, "num_draft_tokens")?;
    let target = FloatArg::<Ix2>::extract(logits, "logits")?;
    let draft = optional(draft_probs, |o| FloatArg::<Ix2>::extract(o, "draft_probs"))?;
    let params = Params::extract(temperature, top_k, top_p, min_p, min_p_last)?;
    let u = optional(uniforms, |o| FloatArg::<Ix1>::extract(o, "uniforms"))?;
    let ru = optional(recovery_uniforms, |o| {
        FloatArg::<Ix1>::extract(o, "recovery_uniforms")
    })?;
    let rows = |a: &FloatArg<'_, Ix2>| a.view().shape()[0];
    let layout = flat_layout(
        ids.view(),
        counts.view(),
        rows(&target),
        draft.as_ref().map(rows),
        u.as_ref().map(FloatArg::view),
    )?;
    let per_row = PerRow {
        ids: IntView::I64(layout.ids.view()),
        counts: Some(IntView::I64(layout.counts.view())),
        uniforms: layout.uniforms.as_ref().map(|u| FloatView::F64(u.view())),
        recovery_uniforms: ru.as_ref().map(FloatArg::view),
        draft_token_probs: None,
    };
    let (t_starts, t_arg) = (IntView::I64(layout.target_starts.view()), "logits");
    let (d_starts, d_arg) = (IntView::I64(layout.draft_starts.view()), "draft_probs");
    macro_rules! flat_rows {
        ($p:expr, $q:expr) => {{
            let target = Rows::Flat {
                rows: $p,
                starts: t_starts,
                arg: t_arg,
            };
            let draft = $q.map(|rows| Rows::Flat {
                rows,
                starts: d_starts,
                arg: d_arg,
            });
            let draft = draft.map_or(Draft::OneHot, Draft::Probs);
            run(py, &params, &per_row, &method_arg, isolate, target, draft)
        }};
    }
    each_dtype_pair!(&target, &draft, ndarray::ArrayView2<'_, f64>, flat_rows)
}

/// `temperature`, `top_k`, `top_p`, `min_p` (or none), each `[B]`, and
/// where min-p applies.
struct Params<'py> {
    temperature: FloatArg<'py, Ix1>,
    top_k: IntArg<'py, Ix1>,
    top_p: FloatArg<'py, Ix1>,
    min_p: Option<FloatArg<'py, Ix1>>,
    min_p_last: bool,
}

impl<'py> Params<'py> {
    fn extract(
        temperature: &Bound<'py, PyAny>,
        top_k: &Bound<'py, PyAny>,
        top_p: &Bound<'py, PyAny>,
        min_p: Option<&Bound<'py, PyAny>>,
        min_p_last: bool,
    ) -> PyResult<Self> {
        Ok(Params {
            temperature: FloatArg::<Ix1>::extract(temperature, "temperature")?,
            top_k: IntArg::<Ix1>::extract(top_k, "top_k")?,
            top_p: FloatArg::<Ix1>::extract(top_p, "top_p")?,
            min_p: optional(min_p, |o| FloatArg::<Ix1>::extract(o, "min_p"))?,
            min_p_last,
        })
    }
}

/// The per-request arrays of a call, in the padded `[B, K]` layout.
struct PerRow<'a> {
    ids: IntView<'a, Ix2>,
    counts: Option<IntView<'a, Ix1>>,
    uniforms: Option<FloatView<'a, Ix2>>,
    recovery_uniforms: Option<FloatView<'a, Ix1>>,
    draft_token_probs: Option<FloatView<'a, Ix2>>,
}

/// One call of the core on `target` and `draft` rows.
fn run<'py, 'a, P: crate::prob::Prob, Q: crate::prob::Prob>(
    py: Python<'py>,
    params: &'a Params<'_>,
    per_row: &PerRow<'a>,
    method_arg: &'a MethodArg<'_>,
    isolate: bool,
    target: Rows<'a, P>,
    draft: Draft<'a, Q>,
) -> PyResult<Bound<'py, PyAny>> {
    let inputs = LogitsInputs {
        draft_token_ids: per_row.ids,
        target_logits: target,
        draft,
        temperature: params.temperature.view(),
        top_k: params.top_k.view(),
        top_p: params.top_p.view(),
        min_p: params.min_p.as_ref().map(FloatArg::view),
        min_p_last: params.min_p_last,
        num_draft_tokens: per_row.counts,
        uniforms: per_row.uniforms,
        recovery_uniforms: per_row.recovery_uniforms,
        draft_token_probs: per_row.draft_token_probs,
        method: method_arg.method()?,
    };
    let (batch, num_draft, _) = inputs.dims()?;
    let plan = OutPlan {
        out: None,
        inputs: Vec::new(),
        isolate,
    };
    plan.run(py, batch, num_draft, |out, errors| {
        logits::verify_logits(&inputs, out, errors)
    })
}
