//! The acceptance rule for one drafted token, and the elementwise primitives
//! (`rejection_probability`, `acceptance_mask`) built on it. All arithmetic is
//! in f64, so the native code and `specaccept.reference` agree to the bit.

use ndarray::IxDyn;

use crate::checks::{check_gathered, check_uniform};
use crate::error::CoreError;
use crate::memory;
use crate::view::{unravel, FloatView};

/// Probability that a drafted token with target probability `p` and draft
/// probability `q` is rejected: 0 when accepted outright (`q <= p`, `p > 0`),
/// 1 when the target rules the token out (`p == 0`), else `1 - p / q`.
#[inline]
pub fn rejection_probability(p: f64, q: f64) -> f64 {
    if p == 0.0 {
        1.0
    } else if q <= p {
        0.0
    } else {
        1.0 - p / q
    }
}

/// Whether the drafted token is accepted, with `u ~ U[0, 1)` for this position.
/// `u` is consulted only when `q > p > 0`; `u == p / q` rejects.
#[inline]
pub fn is_accepted(p: f64, q: f64, u: f64) -> bool {
    if p == 0.0 {
        false
    } else if q <= p {
        true
    } else {
        u < p / q
    }
}

fn same_shape(arg: &'static str, shape: &[usize], expected: &[usize]) -> Result<(), CoreError> {
    if shape == expected {
        Ok(())
    } else {
        Err(CoreError::shape(
            arg,
            format!("has shape {shape:?}, expected {expected:?} (the shape of target_prob)"),
        ))
    }
}

/// [`rejection_probability`] for every element of same-shape arrays, in C order.
pub fn rejection_probability_array(
    target_prob: &FloatView<'_, IxDyn>,
    draft_prob: &FloatView<'_, IxDyn>,
) -> Result<Vec<f64>, CoreError> {
    let shape = target_prob.shape();
    same_shape("draft_prob", draft_prob.shape(), shape)?;
    let mut out = memory::with_capacity(shape.iter().product(), "target_prob")?;
    for (flat, (p, q)) in target_prob.values().zip(draft_prob.values()).enumerate() {
        let index = || unravel(flat, shape);
        let p = check_gathered(p, "target_prob", &index())?;
        let q = check_gathered(q, "draft_prob", &index())?;
        out.push(rejection_probability(p, q));
    }
    Ok(out)
}

/// [`is_accepted`] for every element of same-shape arrays, in C order. Every
/// position is evaluated, also after a rejection, and every uniform is checked.
pub fn acceptance_mask_array(
    target_prob: &FloatView<'_, IxDyn>,
    draft_prob: &FloatView<'_, IxDyn>,
    uniform: &FloatView<'_, IxDyn>,
) -> Result<Vec<bool>, CoreError> {
    let shape = target_prob.shape();
    same_shape("draft_prob", draft_prob.shape(), shape)?;
    same_shape("uniform", uniform.shape(), shape)?;
    let mut out = memory::with_capacity(shape.iter().product(), "target_prob")?;
    let values = target_prob
        .values()
        .zip(draft_prob.values())
        .zip(uniform.values());
    for (flat, ((p, q), u)) in values.enumerate() {
        let index = || unravel(flat, shape);
        let p = check_gathered(p, "target_prob", &index())?;
        let q = check_gathered(q, "draft_prob", &index())?;
        let u = check_uniform(u, "uniform", &index())?;
        out.push(is_accepted(p, q, u));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worked_example_of_the_spec() {
        // Draft q = 0.8, target p = 0.6: rejected with probability 0.25, accepted iff u < 0.75.
        assert_eq!(rejection_probability(0.6, 0.8), 1.0 - 0.6 / 0.8);
        assert!((rejection_probability(0.6, 0.8) - 0.25).abs() < 1e-15);
        assert!(is_accepted(0.6, 0.8, 0.7499));
        assert!(!is_accepted(0.6, 0.8, 0.75));
        assert!(!is_accepted(0.6, 0.8, 0.9));
    }

    #[test]
    fn accepted_outright_ignores_the_uniform() {
        for u in [0.0, 0.5, 1.0 - f64::EPSILON / 2.0] {
            assert!(is_accepted(0.5, 0.5, u));
            assert!(is_accepted(0.9, 0.1, u));
            assert!(is_accepted(0.1, 0.0, u), "q == 0 < p accepts");
            assert!(!is_accepted(0.0, 0.0, u), "p == 0 rejects even when q == 0");
            assert!(!is_accepted(0.0, 0.3, u));
        }
        assert_eq!(rejection_probability(0.0, 0.0), 1.0);
        assert_eq!(rejection_probability(0.2, 0.0), 0.0);
        assert_eq!(rejection_probability(0.2, 0.2), 0.0);
    }

    #[test]
    fn uniform_equal_to_the_ratio_rejects() {
        let (p, q) = (0.3_f64, 0.7_f64);
        let ratio = p / q;
        assert!(!is_accepted(p, q, ratio));
        assert!(is_accepted(p, q, ratio - f64::EPSILON * ratio));
    }

    #[test]
    fn out_of_domain_values_are_reported_with_their_index() {
        let e = check_gathered(f64::NAN, "target_prob", &[1, 2]).unwrap_err();
        assert_eq!(e.arg(), "target_prob");
        assert!(e.to_string().starts_with("target_prob[1, 2] = nan"), "{e}");
        assert!(check_gathered(1.0 + 1e-12, "draft_prob", &[0]).is_err());
        assert!(check_gathered(-0.0, "draft_prob", &[0]).is_ok());
        assert!(check_uniform(1.0, "uniform", &[0]).is_err());
        assert!(check_uniform(-1e-300, "uniform", &[0]).is_err());
        assert!(check_uniform(0.0, "uniform", &[0]).is_ok());
    }
}
