//! Checks of the caller's inputs shared by every verifier (shapes, draft
//! counts, token ids, uniforms, gathered probabilities) and where a value
//! lives ([`Pos`], [`RowAt`]), so that every error names the argument and the
//! index the caller passed. See docs/spec.md section 5 (validation).

use crate::error::{show, CoreError};
use crate::view::IntView;
use ndarray::Ix1;

/// A shape, checked against the one the other arguments imply.
pub(crate) fn expect_shape(
    arg: &'static str,
    shape: &[usize],
    expected: &[usize],
    what: &str,
) -> Result<(), CoreError> {
    if shape == expected {
        Ok(())
    } else {
        Err(CoreError::shape(
            arg,
            format!("has shape {shape:?}, expected {expected:?} ({what})"),
        ))
    }
}

/// `k_b`, checked against `[0, K]`.
pub(crate) fn draft_len(
    num_draft_tokens: Option<&IntView<'_, Ix1>>,
    b: usize,
    k_max: usize,
) -> Result<usize, CoreError> {
    let Some(counts) = num_draft_tokens else {
        return Ok(k_max);
    };
    let k = counts.get(b);
    if k < 0 || k as u64 > k_max as u64 {
        return Err(CoreError::value(
            "num_draft_tokens",
            &[b],
            format!("= {k} is outside [0, K] with K = {k_max}"),
        ));
    }
    Ok(k as usize)
}

pub(crate) fn check_counts_shape(
    num_draft_tokens: Option<&IntView<'_, Ix1>>,
    batch: usize,
) -> Result<(), CoreError> {
    match num_draft_tokens {
        Some(counts) => expect_shape("num_draft_tokens", counts.shape(), &[batch], "[B]"),
        None => Ok(()),
    }
}

/// A token id, checked against `[0, V)`.
pub(crate) fn check_token(
    arg: &'static str,
    index: &[usize],
    x: i64,
    vocab: usize,
) -> Result<usize, CoreError> {
    if x < 0 || x as u64 >= vocab as u64 {
        return Err(CoreError::value(
            arg,
            index,
            format!("= {x} is outside [0, V) with V = {vocab}"),
        ));
    }
    Ok(x as usize)
}

/// A gathered probability `p(x_t)` or `q(x_t)` must lie in `[0, 1]` (NaN fails).
#[inline]
pub(crate) fn check_gathered(v: f64, arg: &'static str, index: &[usize]) -> Result<f64, CoreError> {
    if (0.0..=1.0).contains(&v) {
        Ok(v)
    } else {
        Err(CoreError::value(
            arg,
            index,
            format!(
                "= {}: the probability of a drafted token must lie in [0, 1]",
                show(v)
            ),
        ))
    }
}

/// A uniform draw must lie in `[0, 1)` (NaN fails).
#[inline]
pub(crate) fn check_uniform(u: f64, arg: &'static str, index: &[usize]) -> Result<f64, CoreError> {
    if (0.0..1.0).contains(&u) {
        Ok(u)
    } else {
        Err(CoreError::value(
            arg,
            index,
            format!("= {}: a uniform draw must lie in [0, 1)", show(u)),
        ))
    }
}

/// Where row `b`'s drafted position `t` lives, to name it in error messages:
/// `[b, t]` in the padded layout, `[start_b + t]` in the flat one.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Pos {
    Padded { b: usize, t: usize },
    Flat { row: usize },
}

impl Pos {
    /// The index of the position (`element: None`: a draft id, a uniform, a
    /// probability row) or of element `i` of its probability row, on the stack:
    /// the hot loop builds one per drafted position.
    pub(crate) fn buf(self, element: Option<usize>) -> ([usize; 3], usize) {
        let (mut buf, mut len) = match self {
            Pos::Padded { b, t } => ([b, t, 0], 2),
            Pos::Flat { row } => ([row, 0, 0], 1),
        };
        if let Some(i) = element {
            buf[len] = i;
            len += 1;
        }
        (buf, len)
    }
    pub(crate) fn index(self) -> Vec<usize> {
        let (buf, len) = self.buf(None);
        buf[..len].to_vec()
    }
    pub(crate) fn element(self, i: usize) -> Vec<usize> {
        let (buf, len) = self.buf(Some(i));
        buf[..len].to_vec()
    }
}

/// Which probability row is being read: for error messages.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RowAt {
    pub arg: &'static str,
    pub pos: Pos,
}

impl RowAt {
    /// The error for value `v` at element `i` of this row.
    pub(crate) fn bad_value(self, i: usize, v: f64) -> CoreError {
        bad_probability(self.arg, self.pos.element(i), v)
    }
}

/// The error for a probability `v` of a row that is not finite and non-negative.
pub(crate) fn bad_probability(arg: &'static str, index: Vec<usize>, v: f64) -> CoreError {
    CoreError::value(
        arg,
        &index,
        format!(
            "= {}: probabilities must be finite and non-negative",
            show(v)
        ),
    )
}
