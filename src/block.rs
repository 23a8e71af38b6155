//! Block verification (Sun et al., "Block Verification Accelerates
//! Speculative Decoding", ICLR 2025): the accepted prefix of a drafted block
//! decided jointly, never shorter in expectation than the token rule's and
//! optimal among verifiers that see the drafted path; the output still follows
//! the target exactly. The quantities of docs/spec.md section 2.6, in float64:
//!
//! - `rho_0 = 1`, `rho_i = min(1, rho_{i-1} * p_{i-1}(x_{i-1}) / q_{i-1}(x_{i-1}))`:
//!   how much of the drafted path the target still supports;
//! - `Z_i = sum_v max(0, rho_i * p_i(v) - q_i(v))`, the residual mass at `i`;
//! - `h_i = Z_i / (Z_i + 1 - rho_i)` for `i < k`, `h_k = rho_k`;
//! - `tau`, the largest `i` with `eta_i < h_i` (0 if none): keep `tau` drafts,
//!   then sample the residual `max(0, rho_tau * p_tau - q_tau)` (or the bonus).
//!
//! [`crate::chain`] walks a row; this module holds the arithmetic, so that the
//! reference (`specaccept.reference`) and the closed forms match it to the bit.

/// `rho_i` from `rho_{i-1}` and the gathered `p`, `q` of position `i - 1`: a
/// path the target rules out stays ruled out (`p = 0` or `rho_{i-1} = 0` give
/// 0), and `q = 0 < p` gives 1 (the ratio is infinite).
#[inline]
pub(crate) fn next_rho(previous: f64, p: f64, q: f64) -> f64 {
    if previous == 0.0 || p == 0.0 {
        0.0
    } else if q == 0.0 {
        1.0
    } else {
        (previous * p / q).min(1.0)
    }
}

/// `h_i = Z_i / ((Z_i + 1) - rho_i)`, and 1 where the denominator is 0.
#[inline]
pub(crate) fn h(z: f64, rho: f64) -> f64 {
    let denominator = (z + 1.0) - rho;
    if denominator == 0.0 {
        1.0
    } else {
        z / denominator
    }
}

/// `Z_i` for a one-hot draft at `x_i`: `rho_i * (1 - p_i(x_i))`, read from the
/// gathered value alone (target rows taken to sum to 1).
#[inline]
pub(crate) fn one_hot_mass(rho: f64, p_drafted: f64) -> f64 {
    rho * (1.0 - p_drafted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_weights_follow_the_ratio_and_its_edge_cases() {
        assert_eq!(next_rho(1.0, 0.25, 0.5), 0.5);
        assert_eq!(next_rho(0.5, 0.9, 0.3), 1.0, "capped at 1");
        assert_eq!(next_rho(0.0, 0.9, 0.3), 0.0, "ruled out stays ruled out");
        assert_eq!(next_rho(0.7, 0.0, 0.0), 0.0, "p = 0 rules the path out");
        assert_eq!(next_rho(0.7, 0.2, 0.0), 1.0, "q = 0 < p: infinite ratio");
        assert_eq!(h(0.0, 1.0), 1.0, "0/0 is 1");
        assert_eq!(h(0.5, 0.5), 0.5);
        assert_eq!(one_hot_mass(0.5, 0.25), 0.375);
    }
}
