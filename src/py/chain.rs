//! Chain verification: `verify`, `verify_flat` (vLLM's layout), `verify_greedy`, the
//! accepted-prefix scan, and `method=` as the native layer takes it.

use ndarray::{ArrayView1, ArrayView2, Axis, Ix1, Ix2, Ix3};
use numpy::{PyArray1, PyArrayMethods};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyBool;

use super::arrays::{
    bool_arg, borrow, each_dtype_pair, is, ndarray_arg, optional, zeros, FloatArg, Input, IntArg,
};
use super::errors::input_error;
use super::outputs::{given, OutPlan};
use crate::chain::{self, ChainInputs, FlatChainInputs, GreedyIdsInputs};
use crate::method::Method;
use crate::prob::Prob;
use crate::view::{FloatView, Greedy, IntView};

/// `method=` as the Python layer passes it (see `method::Method`): `"token"`,
/// `"block"`, `("typical", epsilon, delta)` or `("synthetic", rates)` with
/// `rates` a float64 array `[K]` (kept borrowed while the call runs).
pub(super) enum MethodArg<'py> {
    Plain(Method<'static>),
    Synthetic(Input<'py, f64, Ix1>),
}

impl<'py> MethodArg<'py> {
    pub(super) fn extract(method: Option<&Bound<'py, PyAny>>) -> PyResult<Self> {
        let Some(method) = method else {
            return Ok(MethodArg::Plain(Method::Token));
        };
        if let Ok(name) = method.extract::<String>() {
            return match name.as_str() {
                "token" => Ok(MethodArg::Plain(Method::Token)),
                "block" => Ok(MethodArg::Plain(Method::Block)),
                other => Err(input_error(
                    "method",
                    format!("method must be \"token\" or \"block\", got {other:?}"),
                )),
            };
        }
        if let Ok((name, epsilon, delta)) = method.extract::<(String, f64, f64)>() {
            if name == "typical" {
                return Ok(MethodArg::Plain(Method::Typical { epsilon, delta }));
            }
        }
        if let Ok((name, rates)) = method.extract::<(String, Bound<'py, PyAny>)>() {
            if name == "synthetic" {
                let arr = ndarray_arg::<Ix1>(&rates, "acceptance_rate")?;
                if !is::<f64>(arr) {
                    return Err(PyTypeError::new_err("acceptance_rate must be float64"));
                }
                return Ok(MethodArg::Synthetic(borrow(arr, "acceptance_rate")?));
            }
        }
        Err(PyTypeError::new_err(
            "method must be \"token\", \"block\", (\"typical\", epsilon, delta) or \
             (\"synthetic\", rates)",
        ))
    }

    pub(super) fn method(&self) -> PyResult<Method<'_>> {
        match self {
            MethodArg::Plain(m) => Ok(*m),
            MethodArg::Synthetic(rates) => rates
                .as_slice()
                .map(Method::Synthetic)
                .ok_or_else(|| PyTypeError::new_err("acceptance_rate must be contiguous")),
        }
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) fn run_chain<'py, 'a, P: Prob, Q: Prob>(
    py: Python<'py>,
    draft_token_ids: IntView<'a, Ix2>,
    target_probs: ndarray::ArrayView3<'a, P>,
    draft_probs: Option<ndarray::ArrayView3<'a, Q>>,
    num_draft_tokens: Option<IntView<'a, Ix1>>,
    uniforms: Option<FloatView<'a, Ix2>>,
    recovery_uniforms: Option<FloatView<'a, Ix1>>,
    greedy: Greedy<'a>,
    method: Method<'a>,
    plan: &OutPlan<'_, 'py>,
) -> PyResult<Bound<'py, PyAny>> {
    let inputs = ChainInputs {
        draft_token_ids,
        target_probs,
        draft_probs,
        num_draft_tokens,
        uniforms,
        recovery_uniforms,
        greedy,
        method,
    };
    let dims = inputs.dims()?;
    plan.run(py, dims.batch, dims.num_draft, |out, errors| {
        chain::verify(&inputs, out, errors)
    })
}

/// Chain verification (see `specaccept.verify`); every argument already normalised:
/// `uniforms`/`recovery_uniforms` present for rows verified by sampling (or
/// `draws`, float64 `[B*K + B]`: the uniforms then the recovery uniforms, as one
/// Generator call returns them), `greedy` a bool or a bool array `[B]`, `out`
/// None or `(output_token_ids, num_accepted, num_emitted or None)`. Returns
/// `(output_token_ids, num_accepted, num_emitted)`, and with `isolate` a fourth
/// item: the bad rows as a list of `(row, InputError)`.
#[pyfunction]
#[pyo3(signature = (draft_token_ids, target_probs, draft_probs, num_draft_tokens, uniforms, recovery_uniforms, greedy, out=None, draws=None, isolate=false, method=None))]
#[allow(clippy::too_many_arguments)]
pub(super) fn verify<'py>(
    py: Python<'py>,
    draft_token_ids: &Bound<'py, PyAny>,
    target_probs: &Bound<'py, PyAny>,
    draft_probs: Option<&Bound<'py, PyAny>>,
    num_draft_tokens: Option<&Bound<'py, PyAny>>,
    uniforms: Option<&Bound<'py, PyAny>>,
    recovery_uniforms: Option<&Bound<'py, PyAny>>,
    greedy: &Bound<'py, PyAny>,
    out: Option<&Bound<'py, PyAny>>,
    draws: Option<&Bound<'py, PyAny>>,
    isolate: bool,
    method: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let method_arg = MethodArg::extract(method)?;
    let method = method_arg.method()?;
    let ids = IntArg::<Ix2>::extract(draft_token_ids, "draft_token_ids")?;
    let target = FloatArg::<Ix3>::extract(target_probs, "target_probs")?;
    let draft = optional(draft_probs, |o| FloatArg::<Ix3>::extract(o, "draft_probs"))?;
    let counts = optional(num_draft_tokens, |o| {
        IntArg::<Ix1>::extract(o, "num_draft_tokens")
    })?;
    let u = optional(uniforms, |o| FloatArg::<Ix2>::extract(o, "uniforms"))?;
    let ru = optional(recovery_uniforms, |o| {
        FloatArg::<Ix1>::extract(o, "recovery_uniforms")
    })?;
    let greedy_rows = GreedyArg::extract(greedy)?;
    let greedy_view = greedy_rows.view();
    let &[batch, num_draft] = ids.view().shape() else {
        return Err(input_error(
            "draft_token_ids",
            "draft_token_ids must be 2-D".into(),
        ));
    };
    let plan = OutPlan {
        out,
        inputs: given(out, || {
            vec![
                ("draft_token_ids", Some(draft_token_ids)),
                ("target_probs", Some(target_probs)),
                ("draft_probs", draft_probs),
                ("num_draft_tokens", num_draft_tokens),
                ("uniforms", uniforms),
                ("recovery_uniforms", recovery_uniforms),
                ("greedy", Some(greedy)),
            ]
        }),
        isolate,
    };
    let (ids, counts) = (ids.view(), counts.as_ref().map(IntArg::view));
    let draws = optional(draws, |o| {
        ndarray_arg::<Ix1>(o, "draws").and_then(|a| borrow(a, "draws"))
    })?;
    let (u, ru) = match &draws {
        Some(d) => {
            let (u, ru) = split_draws(d.as_array(), batch, num_draft)?;
            (Some(FloatView::F64(u)), Some(FloatView::F64(ru)))
        }
        None => (
            u.as_ref().map(FloatArg::view),
            ru.as_ref().map(FloatArg::view),
        ),
    };

    macro_rules! run {
        ($p:expr, $q:expr) => {
            run_chain(py, ids, $p, $q, counts, u, ru, greedy_view, method, &plan)
        };
    }
    each_dtype_pair!(&target, &draft, ndarray::ArrayView3<'_, f64>, run)
}

/// `draws [B*K + B]` as `uniforms [B, K]` and `recovery_uniforms [B]`.
pub(super) fn split_draws(
    draws: ArrayView1<'_, f64>,
    batch: usize,
    num_draft: usize,
) -> PyResult<(ArrayView2<'_, f64>, ArrayView1<'_, f64>)> {
    let split = batch.saturating_mul(num_draft);
    if Some(draws.len()) != split.checked_add(batch) {
        return Err(input_error(
            "draws",
            format!(
                "draws must hold B*K + B = {} values, got {}",
                split.saturating_add(batch),
                draws.len()
            ),
        ));
    }
    let (u, ru) = draws.split_at(Axis(0), split);
    let u = u
        .into_shape_with_order((batch, num_draft))
        .map_err(|e| input_error("draws", format!("draws: {e}")))?;
    Ok((u, ru))
}

/// `greedy`: a Python bool (every row) or a bool array `[B]` (per row).
pub(super) enum GreedyArg<'py> {
    All(bool),
    PerRow(Input<'py, bool, Ix1>),
}

impl<'py> GreedyArg<'py> {
    pub(super) fn extract(greedy: &Bound<'py, PyAny>) -> PyResult<Self> {
        match greedy.cast::<PyBool>() {
            Ok(flag) => Ok(GreedyArg::All(flag.is_true())),
            Err(_) => Ok(GreedyArg::PerRow(bool_arg::<Ix1>(greedy, "greedy")?)),
        }
    }

    pub(super) fn view(&self) -> Greedy<'_> {
        match self {
            GreedyArg::All(flag) => Greedy::All(*flag),
            GreedyArg::PerRow(rows) => Greedy::PerRow(rows.as_array()),
        }
    }
}

/// Chain verification in the flat ragged layout (see `specaccept.compat.vllm`):
/// `draft_token_ids [T]`, `num_draft_tokens [B]`, `target_probs [T, V]`,
/// `draft_probs [T, V]` or None, `bonus_token_ids [B]`, `uniforms [T]`,
/// `recovery_uniforms [B]`. Output rows have `max(num_draft_tokens) + 1` entries.
#[pyfunction]
#[pyo3(signature = (draft_token_ids, num_draft_tokens, target_probs, draft_probs, bonus_token_ids, uniforms, recovery_uniforms, greedy, out=None, isolate=false, method=None))]
#[allow(clippy::too_many_arguments)]
pub(super) fn verify_flat<'py>(
    py: Python<'py>,
    draft_token_ids: &Bound<'py, PyAny>,
    num_draft_tokens: &Bound<'py, PyAny>,
    target_probs: &Bound<'py, PyAny>,
    draft_probs: Option<&Bound<'py, PyAny>>,
    bonus_token_ids: &Bound<'py, PyAny>,
    uniforms: Option<&Bound<'py, PyAny>>,
    recovery_uniforms: Option<&Bound<'py, PyAny>>,
    greedy: &Bound<'py, PyAny>,
    out: Option<&Bound<'py, PyAny>>,
    isolate: bool,
    method: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let method_arg = MethodArg::extract(method)?;
    let method = method_arg.method()?;
    let ids = IntArg::<Ix1>::extract(draft_token_ids, "draft_token_ids")?;
    let counts = IntArg::<Ix1>::extract(num_draft_tokens, "num_draft_tokens")?;
    let target = FloatArg::<Ix2>::extract(target_probs, "target_probs")?;
    let draft = optional(draft_probs, |o| FloatArg::<Ix2>::extract(o, "draft_probs"))?;
    let bonus = IntArg::<Ix1>::extract(bonus_token_ids, "bonus_token_ids")?;
    let u = optional(uniforms, |o| FloatArg::<Ix1>::extract(o, "uniforms"))?;
    let ru = optional(recovery_uniforms, |o| {
        FloatArg::<Ix1>::extract(o, "recovery_uniforms")
    })?;
    let greedy_rows = GreedyArg::extract(greedy)?;
    let counts_view = counts.view();
    let plan = OutPlan {
        out,
        inputs: given(out, || {
            vec![
                ("draft_token_ids", Some(draft_token_ids)),
                ("num_draft_tokens", Some(num_draft_tokens)),
                ("target_probs", Some(target_probs)),
                ("draft_probs", draft_probs),
                ("bonus_token_ids", Some(bonus_token_ids)),
                ("uniforms", uniforms),
                ("recovery_uniforms", recovery_uniforms),
                ("greedy", Some(greedy)),
            ]
        }),
        isolate,
    };
    macro_rules! run {
        ($p:expr, $q:expr) => {{
            let inputs = FlatChainInputs {
                draft_token_ids: ids.view(),
                num_draft_tokens: counts_view,
                target_probs: $p,
                draft_probs: $q,
                bonus_token_ids: bonus.view(),
                uniforms: u.as_ref().map(FloatArg::view),
                recovery_uniforms: ru.as_ref().map(FloatArg::view),
                greedy: greedy_rows.view(),
                method,
            };
            let dims = inputs.dims()?;
            plan.run(py, dims.batch, dims.num_draft, |out, errors| {
                chain::verify_flat(&inputs, out, errors)
            })
        }};
    }
    each_dtype_pair!(&target, &draft, ArrayView2<'_, f64>, run)
}

/// Greedy verification on target argmax ids (see `specaccept.verify_greedy`).
#[pyfunction]
#[pyo3(signature = (draft_token_ids, target_token_ids, num_draft_tokens, out=None))]
pub(super) fn verify_greedy<'py>(
    py: Python<'py>,
    draft_token_ids: &Bound<'py, PyAny>,
    target_token_ids: &Bound<'py, PyAny>,
    num_draft_tokens: Option<&Bound<'py, PyAny>>,
    out: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let ids = IntArg::<Ix2>::extract(draft_token_ids, "draft_token_ids")?;
    let targets = IntArg::<Ix2>::extract(target_token_ids, "target_token_ids")?;
    let counts = optional(num_draft_tokens, |o| {
        IntArg::<Ix1>::extract(o, "num_draft_tokens")
    })?;
    let inputs = GreedyIdsInputs {
        draft_token_ids: ids.view(),
        target_token_ids: targets.view(),
        num_draft_tokens: counts.as_ref().map(IntArg::view),
    };
    let (batch, num_draft) = inputs.dims()?;
    let plan = OutPlan {
        out,
        inputs: given(out, || {
            vec![
                ("draft_token_ids", Some(draft_token_ids)),
                ("target_token_ids", Some(target_token_ids)),
                ("num_draft_tokens", num_draft_tokens),
            ]
        }),
        isolate: false,
    };
    plan.run(py, batch, num_draft, |out, _| {
        chain::verify_greedy(&inputs, out)
    })
}

/// Accepted prefix length of a `[B, K]` bool mask (see `specaccept.accepted_prefix_length`).
#[pyfunction]
#[pyo3(signature = (accepted, num_draft_tokens))]
pub(super) fn accepted_prefix_length<'py>(
    py: Python<'py>,
    accepted: &Bound<'py, PyAny>,
    num_draft_tokens: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyArray1<i64>>> {
    let mask = bool_arg::<Ix2>(accepted, "accepted")?;
    let counts = optional(num_draft_tokens, |o| {
        IntArg::<Ix1>::extract(o, "num_draft_tokens")
    })?;
    let mask_view = mask.as_array();
    let out = zeros::<i64, Ix1>(
        py,
        &[mask_view.shape()[0]],
        "accepted_prefix_length",
        "accepted [B, K]",
    )?;
    {
        // SAFETY: a fresh array, shared with nothing.
        let out_view = unsafe { out.as_array_mut() };
        let counts_view = counts.as_ref().map(IntArg::view);
        py.detach(|| chain::accepted_prefix_length(mask_view, counts_view, out_view))?;
    }
    Ok(out)
}
