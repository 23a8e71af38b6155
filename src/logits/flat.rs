//! vLLM's flat layout worked out for [`super::verify_logits`] (docs/spec.md
//! section 9.1.1): drafts back to back `[T]`, logits `[T + B, V]` (each
//! request's drafted rows, then its bonus row), drafter rows `[T, V]`. The
//! verifier reads rows in place through [`super::Rows::Flat`]; this module
//! makes the small per-request arrays: padded ids, the count up to a
//! placeholder, where each request's rows start, padded uniforms.

use ndarray::{Array1, Array2, Ix1};

use crate::error::CoreError;
use crate::memory;
use crate::view::{FloatView, IntView};

/// vLLM's `PLACEHOLDER_TOKEN_ID`: a draft slot that ends the request's drafts.
pub const PLACEHOLDER: i64 = -1;

/// The flat step's per-request arrays.
pub struct FlatLayout {
    /// `[B, K]`, `K = max k_b`: each request's drafts up to its first
    /// placeholder, then 0 (never read).
    pub ids: Array2<i64>,
    /// `[B]`: the drafts before the first placeholder.
    pub counts: Array1<i64>,
    /// `[B]`: request `b`'s first row of the logits, `sum(k_c + 1 for c < b)`.
    pub target_starts: Array1<i64>,
    /// `[B]`: its first drafted slot, `sum(k_c for c < b)`.
    pub draft_starts: Array1<i64>,
    /// `[B, K]`: the given uniforms of each request's slots, else 0.
    pub uniforms: Option<Array2<f64>>,
}

/// Checks the flat step's sizes (not isolatable: they place every request's
/// rows) and lays out its per-request arrays. `logits_rows`: the logits'
/// row count, `draft_rows`: the drafter's, if given.
pub fn flat_layout(
    draft_token_ids: IntView<'_, Ix1>,
    num_draft_tokens: IntView<'_, Ix1>,
    logits_rows: usize,
    draft_rows: Option<usize>,
    uniforms: Option<FloatView<'_, Ix1>>,
) -> Result<FlatLayout, CoreError> {
    let total = draft_token_ids.shape()[0];
    let batch = num_draft_tokens.shape()[0];
    let mut sum: u128 = 0;
    let mut k_max = 0usize;
    for b in 0..batch {
        let k = num_draft_tokens.get(b);
        if k < 0 {
            return Err(CoreError::value(
                "num_draft_tokens",
                &[b],
                format!("= {k}: a draft count cannot be negative"),
            ));
        }
        sum += k as u128;
        k_max = k_max.max(usize::try_from(k).unwrap_or(usize::MAX));
    }
    if sum != total as u128 {
        return Err(CoreError::shape(
            "num_draft_tokens",
            format!("sums to {sum}, but draft_token_ids has {total} entries"),
        ));
    }
    let expected = total + batch; // sum == total: no overflow
    if logits_rows != expected {
        return Err(CoreError::shape(
            "logits",
            format!(
                "has {logits_rows} rows, expected T + B = {expected} \
                 ({total} drafts, {batch} requests: each request's rows, then its bonus row)"
            ),
        ));
    }
    if let Some(rows) = draft_rows {
        if rows != total {
            return Err(CoreError::shape(
                "draft_probs",
                format!("has {rows} rows, expected T = {total} (one per draft)"),
            ));
        }
    }
    if let Some(u) = &uniforms {
        if u.shape()[0] != total {
            return Err(CoreError::shape(
                "uniforms",
                format!("has shape {:?}, expected [{total}] ([T])", u.shape()),
            ));
        }
    }
    // k_max <= total here, so B * K is at most B * T: checked all the same.
    let cells = batch
        .checked_mul(k_max)
        .ok_or_else(|| memory::too_large("draft_token_ids", usize::MAX, 8))?;
    let mut ids = memory::with_capacity::<i64>(cells, "draft_token_ids")?;
    ids.resize(cells, 0);
    let mut padded_u = match uniforms {
        Some(_) => {
            let mut u = memory::with_capacity::<f64>(cells, "uniforms")?;
            u.resize(cells, 0.0);
            Some(u)
        }
        None => None,
    };
    let mut counts = Array1::zeros(batch);
    let mut target_starts = Array1::zeros(batch);
    let mut draft_starts = Array1::zeros(batch);
    let mut slot = 0usize;
    for b in 0..batch {
        let k = num_draft_tokens.get(b) as usize;
        target_starts[b] = (slot + b) as i64;
        draft_starts[b] = slot as i64;
        let mut effective = k;
        for t in 0..k {
            let x = draft_token_ids.get(slot + t);
            if x == PLACEHOLDER {
                effective = t;
                break;
            }
            ids[b * k_max + t] = x;
        }
        if let (Some(padded), Some(u)) = (&mut padded_u, &uniforms) {
            for t in 0..k {
                padded[b * k_max + t] = u.get(slot + t);
            }
        }
        counts[b] = effective as i64;
        slot += k;
    }
    let shape = (batch, k_max);
    Ok(FlatLayout {
        ids: grid(shape, ids),
        counts,
        target_starts,
        draft_starts,
        uniforms: padded_u.map(|u| grid(shape, u)),
    })
}

/// `values` (`B * K` of them, row-major) as `[B, K]`.
fn grid<T>(shape: (usize, usize), values: Vec<T>) -> Array2<T> {
    Array2::from_shape_vec(shape, values).expect("B * K values, made above")
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;

    #[test]
    fn the_layout_places_rows_and_ends_drafts_at_a_placeholder() {
        let ids = array![5i64, 6, 7, -1, 9, 4];
        let counts = array![2i64, 0, 3, 1];
        let u = array![0.1, 0.2, 0.3, 0.4, 0.5, 0.6];
        let layout = flat_layout(
            IntView::I64(ids.view()),
            IntView::I64(counts.view()),
            10,
            Some(6),
            Some(FloatView::F64(u.view())),
        )
        .unwrap();
        assert_eq!(
            layout.ids,
            array![[5, 6, 0], [0, 0, 0], [7, 0, 0], [4, 0, 0]]
        );
        assert_eq!(layout.counts, array![2, 0, 1, 1]);
        assert_eq!(layout.target_starts, array![0, 3, 4, 8]);
        assert_eq!(layout.draft_starts, array![0, 2, 2, 5]);
        let padded = layout.uniforms.unwrap();
        assert_eq!(padded.row(2).to_vec(), vec![0.3, 0.4, 0.5]);
        assert_eq!(padded.row(3).to_vec(), vec![0.6, 0.0, 0.0]);
    }

    #[test]
    fn sizes_that_do_not_fit_are_errors_naming_the_argument() {
        let ids = array![1i64, 2];
        let check = |counts: ndarray::Array1<i64>, rows: usize, draft: Option<usize>| {
            flat_layout(
                IntView::I64(ids.view()),
                IntView::I64(counts.view()),
                rows,
                draft,
                None,
            )
            .err()
            .map(|e| e.to_string())
        };
        assert!(check(array![2, -1], 4, None)
            .unwrap()
            .contains("num_draft_tokens"));
        assert!(check(array![1, 2], 5, None).unwrap().contains("sums to 3"));
        assert!(check(array![i64::MAX, i64::MAX], 4, None)
            .unwrap()
            .contains("sums to"));
        assert!(check(array![2, 0], 3, None).unwrap().contains("logits"));
        assert!(check(array![2, 0], 4, Some(3))
            .unwrap()
            .contains("draft_probs"));
        assert!(check(array![2, 0], 4, Some(2)).is_none());
    }
}
