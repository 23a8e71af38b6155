//! The analytic acceptance rate `alpha = sum_x min(p(x), q(x))`: the
//! probability that a token drawn from the draft `q` is accepted against the
//! target `p` (Leviathan et al., 2023, section 3.1), per row of `[..., V]`.
//! Rows are summed in the canonical order of [`crate::sample`] (the reference
//! follows it to the bit) and run on the worker pool when large.

use std::marker::PhantomData;

use ndarray::{ArrayView1, ArrayViewD, ArrayViewMut1, Axis};

use crate::error::CoreError;
use crate::memory;
use crate::prob::Prob;
use crate::sample::{self, Locate, PairWeights, SUM_BLOCK};
use crate::simd::Overlap;
use crate::threads;
use crate::view::unravel;

/// Row `row` of the leading axes: errors name `[leading index..., i]`.
#[derive(Clone, Copy)]
struct RateRow<'s> {
    row: usize,
    leading: &'s [usize],
}

impl Locate for RateRow<'_> {
    fn element(self, i: usize) -> Vec<usize> {
        let mut index = unravel(self.row, self.leading);
        index.push(i);
        index
    }
}

fn row_rate<P: Prob, Q: Prob>(
    p: ArrayView1<'_, P>,
    q: ArrayView1<'_, Q>,
    row: usize,
    leading: &[usize],
    scratch: &mut Vec<f64>,
) -> Result<f64, CoreError> {
    let at = RateRow { row, leading };
    match (p.as_slice(), q.as_slice()) {
        (Some(p), Some(q)) => sample::sum_blocks(
            &PairWeights {
                op: Overlap,
                p,
                q,
                at,
                buffer: false,
                _elem: PhantomData,
            },
            scratch,
        ),
        _ => sample::sum_blocks(
            &PairWeights {
                op: Overlap,
                p,
                q,
                at,
                buffer: false,
                _elem: PhantomData,
            },
            scratch,
        ),
    }
}

/// Checks `target_probs [..., V]` against `draft_probs` (the same shape).
pub fn check_shapes(target: &[usize], draft: &[usize]) -> Result<(), CoreError> {
    if target.is_empty() {
        return Err(CoreError::shape(
            "target_probs",
            "must have at least one axis [..., V]",
        ));
    }
    if draft != target {
        return Err(CoreError::shape(
            "draft_probs",
            format!("has shape {draft:?}, expected {target:?} (the shape of target_probs)"),
        ));
    }
    Ok(())
}

/// `sum(min(p, q))` over the last axis of two same-shape arrays, into `out`
/// (one entry per row, rows in C order of the leading axes).
pub fn acceptance_rate<P: Prob, Q: Prob>(
    target_probs: ArrayViewD<'_, P>,
    draft_probs: ArrayViewD<'_, Q>,
    out: ArrayViewMut1<'_, f64>,
) -> Result<(), CoreError> {
    check_shapes(target_probs.shape(), draft_probs.shape())?;
    let last = Axis(target_probs.ndim() - 1);
    let leading = &target_probs.shape()[..last.index()];
    let lanes = target_probs.lanes(last).into_iter();
    if out.len() != lanes.len() {
        return Err(CoreError::shape("out", "must have one entry per row"));
    }
    let vocab = target_probs.shape()[last.index()];
    let mut rows = memory::with_capacity(out.len(), "target_probs")?;
    rows.extend(lanes.zip(draft_probs.lanes(last)));
    threads::in_runs(
        rows.len().saturating_mul(vocab),
        out,
        |first, mut out: ArrayViewMut1<'_, f64>| {
            let mut scratch = memory::with_capacity(vocab.div_ceil(SUM_BLOCK), "target_probs")?;
            for (i, (p, q)) in rows[first..first + out.len()].iter().enumerate() {
                out[i] = row_rate(p.view(), q.view(), first + i, leading, &mut scratch)?;
            }
            Ok(())
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::{array, Array1, ArrayD, IxDyn};

    fn rate(p: &ArrayD<f64>, q: &ArrayD<f64>) -> Result<Vec<f64>, CoreError> {
        let rows = p.len() / p.shape().last().copied().unwrap_or(1).max(1);
        let mut out = Array1::zeros(rows);
        acceptance_rate(p.view(), q.view(), out.view_mut())?;
        Ok(out.to_vec())
    }

    #[test]
    fn overlap_of_two_distributions() {
        let p = array![[0.6, 0.4, 0.0], [1.0, 0.0, 0.0]].into_dyn();
        let q = array![[0.8, 0.1, 0.1], [0.0, 0.5, 0.5]].into_dyn();
        // min: [0.6, 0.1, 0.0] and [0.0, 0.0, 0.0].
        assert_eq!(rate(&p, &q).unwrap(), vec![0.6 + 0.1, 0.0]);
        assert_eq!(
            rate(&p, &p).unwrap(),
            vec![1.0, 1.0],
            "a draft equal to the target"
        );
    }

    #[test]
    fn errors_name_the_full_index() {
        let mut p = ArrayD::from_elem(IxDyn(&[2, 3, 4]), 0.25);
        let q = p.clone();
        p[[1, 2, 3]] = f64::NAN;
        assert_eq!(
            rate(&p, &q).unwrap_err().to_string(),
            "target_probs[1, 2, 3] = nan: probabilities must be finite and non-negative"
        );
        let short = ArrayD::from_elem(IxDyn(&[2, 3, 5]), 0.2);
        assert!(rate(&short, &q)
            .unwrap_err()
            .to_string()
            .starts_with("draft_probs"));
    }
}
