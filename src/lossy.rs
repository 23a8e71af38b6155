//! The lossy methods of the verifier laboratory (docs/spec.md sections 2.7 and
//! 2.8): their output does **not** follow the target distribution. They exist to
//! be compared with the exact rules, and to drive load tests.
//!
//! - Typical acceptance (Cai et al., 2024, "Medusa", arXiv 2401.10774, section
//!   3.3.2): `x_t` is accepted iff `p_t(x_t) > min(epsilon, delta * exp(-H(p_t)))`,
//!   `H` the entropy of the normalised row; after the accepted prefix the next
//!   token is drawn from the row at `n_b`, restricted to the entries at or above
//!   that row's threshold (Medusa's `get_typical_one_token`).
//! - Synthetic acceptance: position `t` is accepted iff `u_t < a_t`, whatever
//!   the probabilities; the next token is drawn from the target row at `n_b`.

use ndarray::ArrayView1;

use crate::checks::RowAt;
use crate::error::{show, CoreError};
use crate::memory;
use crate::prob::Prob;
use crate::sample::{canonical_sum, sample, sample_target, zero_row, BufferWeights, TargetWeights};

/// One target row of the typical rule: its canonical sum `S` and the threshold
/// `min(epsilon, delta * exp(-H))` on the normalised values `p / S`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TypicalRow {
    pub total: f64,
    pub threshold: f64,
}

impl TypicalRow {
    /// Reads and checks the whole row (`scratch`: block sums; `terms`: a
    /// buffer of `V` values). A row summing to 0 has no distribution: an error.
    pub(crate) fn of<P: Prob>(
        row: ArrayView1<'_, P>,
        at: RowAt,
        epsilon: f64,
        delta: f64,
        scratch: &mut Vec<f64>,
        terms: &mut Vec<f64>,
    ) -> Result<Self, CoreError> {
        let total = match row.as_slice() {
            Some(p) => canonical_sum(&target(p, at), scratch)?,
            None => canonical_sum(&target(row, at), scratch)?,
        };
        if total <= 0.0 {
            return Err(zero_row(at));
        }
        fill(terms, row.len(), at.arg, |i| {
            let r = row[i].to_f64() / total;
            if r > 0.0 && r < 1.0 {
                -(r * r.ln())
            } else {
                0.0
            }
        })?;
        let entropy = canonical_sum(&BufferWeights { w: terms }, scratch)?;
        Ok(TypicalRow {
            total,
            threshold: epsilon.min(delta * (-entropy).exp()),
        })
    }

    /// Whether a drafted token of (gathered, checked) probability `p` is accepted.
    pub(crate) fn accepts(self, p: f64) -> bool {
        p / self.total > self.threshold
    }

    /// The token after the accepted prefix: a draw with `u` from the row's
    /// entries with `p / S >= threshold` (all of the row if none is).
    pub(crate) fn sample<P: Prob>(
        self,
        row: ArrayView1<'_, P>,
        at: RowAt,
        u: f64,
        scratch: &mut Vec<f64>,
        terms: &mut Vec<f64>,
    ) -> Result<usize, CoreError> {
        fill(terms, row.len(), at.arg, |i| {
            let v = row[i].to_f64();
            if v / self.total >= self.threshold {
                v
            } else {
                0.0
            }
        })?;
        match sample(&BufferWeights { w: terms }, u, scratch)? {
            Some(token) => Ok(token),
            None => sample_target(row, None, at, u, scratch)?.ok_or_else(|| zero_row(at)),
        }
    }
}

fn target<P: Prob, R: crate::view::Row<P>>(p: R, at: RowAt) -> TargetWeights<P, R> {
    TargetWeights {
        p,
        excluded: None,
        at,
        _elem: std::marker::PhantomData,
    }
}

/// `terms[i] = f(i)` for `i < n`, reserving the buffer fallibly.
fn fill(
    terms: &mut Vec<f64>,
    n: usize,
    arg: &'static str,
    f: impl Fn(usize) -> f64,
) -> Result<(), CoreError> {
    terms.clear();
    memory::reserve(terms, n, arg)?;
    terms.extend((0..n).map(f));
    Ok(())
}

/// Checks the synthetic acceptance rates: one per draft position, each in `[0, 1]`.
pub(crate) fn check_rates(rates: &[f64], num_draft: usize) -> Result<(), CoreError> {
    if rates.len() != num_draft {
        return Err(CoreError::shape(
            "acceptance_rate",
            format!(
                "has {} entries, expected {num_draft} (one per draft position, K)",
                rates.len()
            ),
        ));
    }
    for (t, &a) in rates.iter().enumerate() {
        if !(0.0..=1.0).contains(&a) {
            return Err(CoreError::value(
                "acceptance_rate",
                &[t],
                format!("= {}: an acceptance rate must lie in [0, 1]", show(a)),
            ));
        }
    }
    Ok(())
}

/// Checks typical acceptance's parameters: finite and non-negative.
pub(crate) fn check_typical(epsilon: f64, delta: f64) -> Result<(), CoreError> {
    for (name, v) in [("epsilon", epsilon), ("delta", delta)] {
        if !(v.is_finite() && v >= 0.0) {
            return Err(CoreError::shape(
                name,
                format!("must be a finite number >= 0, got {}", show(v)),
            ));
        }
    }
    Ok(())
}
