//! Inverse-CDF sampling from unnormalised weights, and argmax.
//!
//! Sampling from weights `w` with a uniform `u` returns the smallest `i` with
//! `w_i > 0` and `w_0 + .. + w_i > u * T`, `T = sum(w)`; if rounding leaves
//! none, the last `i` with `w_i > 0`. Floating-point sums depend on their
//! order, so the order is fixed here and `specaccept.reference` follows it to
//! the bit (the canonical summation order):
//!
//! - the row is cut into blocks of [`SUM_BLOCK`] elements;
//! - a block sum uses [`SUM_LANES`] accumulators, lane `l` adding the elements
//!   with `i % SUM_LANES == l` in index order, then the lanes added pairwise
//!   (`l0 + l1`, `l2 + l3`, ..., then those sums pairwise, down to one). Sixteen
//!   lanes are four SIMD registers of independent adds: one chain would wait
//!   on add latency (see [`crate::simd`]);
//! - `T` adds the block sums in block order;
//! - the search walks the block sums with a running total and rescans only the
//!   block where the running total would pass `u * T`, adding its elements one
//!   by one onto the running total. So each weight is read once to sum, and
//!   one block is read a second time.

use std::marker::PhantomData;

use ndarray::ArrayView1;

use crate::checks::{bad_probability, Pos, RowAt};
use crate::error::CoreError;
use crate::prob::Prob;
use crate::simd::{self, combine_lanes, Kernel, PairOp, ScaledResidual, SUM_LANES};
use crate::view::Row;

/// Elements per block of the canonical summation.
pub const SUM_BLOCK: usize = 256;

/// Checks that `row[start..end]` holds finite, non-negative values.
#[inline]
fn check_probs<P: Prob, R: Row<P>>(
    row: R,
    at: RowAt,
    start: usize,
    end: usize,
) -> Result<(), CoreError> {
    // One predictable branch per block; the slow search only runs on bad input.
    let ok = (start..end).fold(true, |ok, i| {
        let v = row.at(i).to_f64();
        ok & (0.0..=f64::MAX).contains(&v)
    });
    if ok {
        return Ok(());
    }
    for i in start..end {
        let v = row.at(i).to_f64();
        if !(0.0..=f64::MAX).contains(&v) {
            return Err(at.bad_value(i, v));
        }
    }
    Ok(())
}

/// Non-negative weights read element by element, summed block by block.
pub(crate) trait Weights {
    fn len(&self) -> usize;
    /// The canonical sum of `w[start..end]`, a block starting at a multiple of
    /// [`SUM_BLOCK`], and whether every probability behind it is surely finite
    /// and non-negative; `false` means "run [`Weights::check`]" (bad input, or a
    /// harmless `-0.0`). Unit-stride rows take the SIMD-friendly paths here.
    fn block_sum<K: Kernel>(&self, start: usize, end: usize) -> (f64, bool);
    /// Checks the probabilities behind `w[start..end]`; the error names the first bad one.
    fn check(&self, start: usize, end: usize) -> Result<(), CoreError>;
    fn weight(&self, i: usize) -> f64;
}

/// `w = p`, optionally with one token zeroed. `excluded: None`: the bonus row, or
/// the fallback when a residual sums to 0. `excluded: Some(x)`: the residual when
/// the draft is a deterministic proposal (`draft_probs=None`, `q` one-hot at `x`).
pub(crate) struct TargetWeights<P, R> {
    pub p: R,
    pub excluded: Option<usize>,
    pub at: RowAt,
    pub _elem: PhantomData<P>,
}

impl<P: Prob, R: Row<P>> Weights for TargetWeights<P, R> {
    #[inline(always)]
    fn len(&self) -> usize {
        self.p.len()
    }
    #[inline(always)]
    fn block_sum<K: Kernel>(&self, start: usize, end: usize) -> (f64, bool) {
        let holds_excluded = self.excluded.is_some_and(|x| (start..end).contains(&x));
        match self.p.contiguous() {
            Some(p) if !holds_excluded => K::dense(&p[start..end]),
            _ => (lane_sum(start, end, |i| self.weight(i)), false),
        }
    }
    #[inline]
    fn check(&self, start: usize, end: usize) -> Result<(), CoreError> {
        check_probs(self.p, self.at, start, end)
    }
    #[inline(always)]
    fn weight(&self, i: usize) -> f64 {
        if self.excluded == Some(i) {
            0.0
        } else {
            self.p.at(i).to_f64()
        }
    }
}

/// Weights already computed into a buffer (tree verification's residuals):
/// finite and non-negative by construction.
pub(crate) struct BufferWeights<'w> {
    pub w: &'w [f64],
}

impl Weights for BufferWeights<'_> {
    #[inline(always)]
    fn len(&self) -> usize {
        self.w.len()
    }
    #[inline(always)]
    fn block_sum<K: Kernel>(&self, start: usize, end: usize) -> (f64, bool) {
        K::dense(&self.w[start..end])
    }
    fn check(&self, _start: usize, _end: usize) -> Result<(), CoreError> {
        Ok(())
    }
    #[inline(always)]
    fn weight(&self, i: usize) -> f64 {
        self.w[i]
    }
}

/// Where element `i` of a row lives, to name a bad value in an error.
pub(crate) trait Locate: Copy {
    fn element(self, i: usize) -> Vec<usize>;
}

impl Locate for Pos {
    fn element(self, i: usize) -> Vec<usize> {
        Pos::element(self, i)
    }
}

/// `w = O(p, q)` elementwise over a target row `p` and a draft row `q`: the
/// residual `max(0, p - q)` after a rejection ([`Residual`]) or the overlap
/// `min(p, q)` of the acceptance rate (`Overlap`). A bad value is reported in
/// the order the reference reads them, `p_i` then `q_i`, as `target_probs` or
/// `draft_probs` at `at.element(i)`.
pub(crate) struct PairWeights<O, P, Q, RP, RQ, L> {
    pub op: O,
    pub p: RP,
    pub q: RQ,
    pub at: L,
    /// `p` is a round's float64 buffer, `q` a row read from memory. The
    /// buffer holds the library's own values, in cache: the sums go through
    /// [`Kernel::pair_ahead`] (the same bits), and only `q` is checked. Its
    /// values are what float64 gives, an infinity included where a round's
    /// factor `1 / S` overflowed (`S` below the normal range, docs/spec.md
    /// section 7.3): not a bad input.
    pub buffer: bool,
    pub _elem: PhantomData<(P, Q)>,
}

impl<O, P, Q, RP, RQ, L> Weights for PairWeights<O, P, Q, RP, RQ, L>
where
    O: PairOp,
    P: Prob,
    Q: Prob,
    RP: Row<P>,
    RQ: Row<Q>,
    L: Locate,
{
    #[inline(always)]
    fn len(&self) -> usize {
        self.p.len()
    }
    #[inline(always)]
    fn block_sum<K: Kernel>(&self, start: usize, end: usize) -> (f64, bool) {
        match (self.p.contiguous(), self.q.contiguous()) {
            (Some(p), Some(q)) if self.buffer => {
                K::pair_ahead(self.op, &p[start..end], &q[start..end])
            }
            (Some(p), Some(q)) => K::pair(self.op, &p[start..end], &q[start..end]),
            _ => (lane_sum(start, end, |i| self.weight(i)), false),
        }
    }
    #[inline]
    fn check(&self, start: usize, end: usize) -> Result<(), CoreError> {
        let valid = |v: f64| (0.0..=f64::MAX).contains(&v);
        for i in start..end {
            let (p, q) = (self.p.at(i).to_f64(), self.q.at(i).to_f64());
            if !valid(p) && !self.buffer {
                return Err(bad_probability("target_probs", self.at.element(i), p));
            }
            if !valid(q) {
                return Err(bad_probability("draft_probs", self.at.element(i), q));
            }
        }
        Ok(())
    }
    #[inline(always)]
    fn weight(&self, i: usize) -> f64 {
        self.op.apply(self.p.at(i).to_f64(), self.q.at(i).to_f64())
    }
}

/// The canonical sum of `weight(start..end)` for any row layout; `start` is a
/// multiple of [`SUM_LANES`].
#[inline(always)]
pub(crate) fn lane_sum(start: usize, end: usize, weight: impl Fn(usize) -> f64) -> f64 {
    let mut lanes = [0.0f64; SUM_LANES];
    let mut i = start;
    while i + SUM_LANES <= end {
        for (l, lane) in lanes.iter_mut().enumerate() {
            *lane += weight(i + l);
        }
        i += SUM_LANES;
    }
    for (lane, j) in lanes.iter_mut().zip(i..end) {
        *lane += weight(j);
    }
    combine_lanes(lanes)
}

/// Fills `block_sums` with the canonical block sums of `w` and returns their
/// total, checking every probability read. Compiled twice on x86-64: for AVX2
/// (chosen at run time) and for the baseline target; on aarch64 with the NEON
/// kernel ([`simd::Baseline`]). All compute the same bits.
pub(crate) fn sum_blocks<W: Weights>(w: &W, block_sums: &mut Vec<f64>) -> Result<f64, CoreError> {
    #[cfg(target_arch = "x86_64")]
    if simd::has_avx2() {
        // SAFETY: the CPU supports AVX2 and F16C, checked just above.
        return unsafe { sum_blocks_avx2(w, block_sums) };
    }
    sum_blocks_with::<simd::Baseline, W>(w, block_sums)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
fn sum_blocks_avx2<W: Weights>(w: &W, block_sums: &mut Vec<f64>) -> Result<f64, CoreError> {
    sum_blocks_with::<simd::Avx2, W>(w, block_sums)
}

#[inline(always)]
fn sum_blocks_with<K: Kernel, W: Weights>(
    w: &W,
    block_sums: &mut Vec<f64>,
) -> Result<f64, CoreError> {
    let n = w.len();
    block_sums.clear();
    let mut total = 0.0f64;
    for start in (0..n).step_by(SUM_BLOCK) {
        let end = (start + SUM_BLOCK).min(n);
        let (s, surely_valid) = w.block_sum::<K>(start, end);
        if !surely_valid {
            w.check(start, end)?;
        }
        block_sums.push(s);
        total += s;
    }
    Ok(total)
}

/// Writes `out[i] = O(p_i, q_i)` over the row (`out` as long as `p`) and fills
/// `block_sums` with the canonical block sums of what it wrote: one pass where
/// [`sum_blocks`] over the written buffer would be a second. Returns the total and
/// whether every value read is surely finite and non-negative (`false`: the
/// caller checks exactly; a `-0.0` reads as doubtful but is valid).
pub(crate) fn store_pair_blocks<O: PairOp, P: Prob, Q: Prob>(
    op: O,
    p: &[P],
    q: &[Q],
    out: &mut [f64],
    block_sums: &mut Vec<f64>,
) -> (f64, bool) {
    #[cfg(target_arch = "x86_64")]
    if simd::has_avx2() {
        // SAFETY: the CPU supports AVX2 and F16C, checked just above.
        return unsafe { store_pair_blocks_avx2(op, p, q, out, block_sums) };
    }
    store_pair_blocks_with::<simd::Baseline, O, P, Q>(op, p, q, out, block_sums)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
fn store_pair_blocks_avx2<O: PairOp, P: Prob, Q: Prob>(
    op: O,
    p: &[P],
    q: &[Q],
    out: &mut [f64],
    block_sums: &mut Vec<f64>,
) -> (f64, bool) {
    store_pair_blocks_with::<simd::Avx2, O, P, Q>(op, p, q, out, block_sums)
}

#[inline(always)]
fn store_pair_blocks_with<K: Kernel, O: PairOp, P: Prob, Q: Prob>(
    op: O,
    p: &[P],
    q: &[Q],
    out: &mut [f64],
    block_sums: &mut Vec<f64>,
) -> (f64, bool) {
    each_block(p.len(), block_sums, |start, end| {
        K::pair_store(op, &p[start..end], &q[start..end], &mut out[start..end])
    })
}

/// [`store_pair_blocks`] in place: `w[i] = O(w[i], q_i)`, one buffer.
pub(crate) fn update_pair_blocks<O: PairOp, Q: Prob>(
    op: O,
    w: &mut [f64],
    q: &[Q],
    block_sums: &mut Vec<f64>,
) -> (f64, bool) {
    #[cfg(target_arch = "x86_64")]
    if simd::has_avx2() {
        // SAFETY: the CPU supports AVX2 and F16C, checked just above.
        return unsafe { update_pair_blocks_avx2(op, w, q, block_sums) };
    }
    update_pair_blocks_with::<simd::Baseline, O, Q>(op, w, q, block_sums)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
fn update_pair_blocks_avx2<O: PairOp, Q: Prob>(
    op: O,
    w: &mut [f64],
    q: &[Q],
    block_sums: &mut Vec<f64>,
) -> (f64, bool) {
    update_pair_blocks_with::<simd::Avx2, O, Q>(op, w, q, block_sums)
}

#[inline(always)]
fn update_pair_blocks_with<K: Kernel, O: PairOp, Q: Prob>(
    op: O,
    w: &mut [f64],
    q: &[Q],
    block_sums: &mut Vec<f64>,
) -> (f64, bool) {
    each_block(w.len(), block_sums, |start, end| {
        K::pair_update(op, &mut w[start..end], &q[start..end])
    })
}

/// `block(start, end)` over the [`SUM_BLOCK`]s of a row of `n`, in order: their
/// sums into `block_sums`, their total (the canonical sum), and whether every
/// block's values were surely valid.
#[inline(always)]
fn each_block(
    n: usize,
    block_sums: &mut Vec<f64>,
    mut block: impl FnMut(usize, usize) -> (f64, bool),
) -> (f64, bool) {
    block_sums.clear();
    let (mut total, mut surely_valid) = (0.0f64, true);
    for start in (0..n).step_by(SUM_BLOCK) {
        let (s, ok) = block(start, (start + SUM_BLOCK).min(n));
        surely_valid &= ok;
        block_sums.push(s);
        total += s;
    }
    (total, surely_valid)
}

/// The canonical sum of `w` (the total [`sample`] uses).
pub(crate) fn canonical_sum<W: Weights>(
    w: &W,
    block_sums: &mut Vec<f64>,
) -> Result<f64, CoreError> {
    sum_blocks(w, block_sums)
}

/// Draws an index from `w` with uniform `u`; `None` when every weight is 0.
/// `block_sums` is scratch space (one entry per block, not per element).
pub(crate) fn sample<W: Weights>(
    w: &W,
    u: f64,
    block_sums: &mut Vec<f64>,
) -> Result<Option<usize>, CoreError> {
    let total = sum_blocks(w, block_sums)?;
    Ok(search(w, u, block_sums, total))
}

/// [`sample`]'s search, on the block sums and total [`sum_blocks`] gave for `w`
/// (a caller that needed the total first does not sum twice).
pub(crate) fn search<W: Weights>(w: &W, u: f64, block_sums: &[f64], total: f64) -> Option<usize> {
    let n = w.len();
    // Weights are >= 0, so the total is 0 exactly when no weight is positive.
    if total == 0.0 {
        return None;
    }
    let threshold = u * total;
    let mut running = 0.0f64;
    for (j, &s) in block_sums.iter().enumerate() {
        if running + s > threshold {
            let start = j * SUM_BLOCK;
            let end = (start + SUM_BLOCK).min(n);
            let mut cumulative = running;
            for i in start..end {
                let wi = w.weight(i);
                cumulative += wi;
                if wi > 0.0 && cumulative > threshold {
                    return Some(i);
                }
            }
        }
        running += s;
    }
    // Rounding left no index past the threshold: take the last positive weight.
    // A block sum is positive exactly when the block holds a positive weight.
    let j = block_sums.iter().rposition(|&s| s > 0.0).unwrap_or(0);
    let start = j * SUM_BLOCK;
    let end = (start + SUM_BLOCK).min(n);
    (start..end).rev().find(|&i| w.weight(i) > 0.0)
}

/// The first index of the largest value of a probability row (greedy decoding).
pub(crate) fn argmax<P: Prob, R: Row<P>>(row: R, at: RowAt) -> Result<usize, CoreError> {
    let n = row.len();
    if n == 0 {
        return Err(CoreError::value(
            at.arg,
            &at.pos.index(),
            "is empty (V = 0): there is no token to choose".to_string(),
        ));
    }
    if let Some(best) = row.contiguous().and_then(dense_argmax) {
        return Ok(best);
    }
    // Strided rows, and rows holding a value the fast path cannot vouch for.
    check_probs(row, at, 0, n)?;
    let mut best = 0;
    let mut best_value = row.at(0).to_f64();
    for i in 1..n {
        let v = row.at(i).to_f64();
        if v > best_value {
            best = i;
            best_value = v;
        }
    }
    Ok(best)
}

/// Elements per block of the argmax scan: each block's maximum is compared
/// with the best so far, and only a block that beats it is scanned again.
const ARGMAX_BLOCK: usize = SUM_BLOCK;

/// Argmax of a unit-stride row by bit patterns (which order like the values
/// for `+0.0 ..= MAX`); `None` if a value is outside that range. The block
/// maxima are integer reductions the compiler vectorizes: with AVX2 where the
/// CPU has it, with NEON (baseline) on aarch64; the result is the same.
fn dense_argmax<P: Prob>(p: &[P]) -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    if simd::has_avx2() {
        // SAFETY: the CPU supports AVX2, checked just above.
        return unsafe { dense_argmax_avx2(p) };
    }
    dense_argmax_portable(p)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
fn dense_argmax_avx2<P: Prob>(p: &[P]) -> Option<usize> {
    dense_argmax_portable(p)
}

#[inline(always)]
fn dense_argmax_portable<P: Prob>(p: &[P]) -> Option<usize> {
    // Starting from 0 bits: a row of +0.0 gives index 0, and any value above
    // LARGEST_FINITE raises its block's maximum past `best_bits`, so it is seen.
    let (mut best, mut best_bits) = (0, P::Bits::default());
    for (j, block) in p.chunks(ARGMAX_BLOCK).enumerate() {
        // Integer max is associative: the compiler vectorizes this reduction.
        let block_high = block
            .iter()
            .fold(P::Bits::default(), |m, v| m.max(v.bits()));
        // Strictly greater: on ties the earlier block keeps the first maximal index.
        if block_high > best_bits {
            if block_high > P::LARGEST_FINITE {
                return None;
            }
            best = j * ARGMAX_BLOCK + block.iter().position(|v| v.bits() == block_high)?;
            best_bits = block_high;
        }
    }
    Some(best)
}

/// Sampling and argmax on a row view: unit-stride rows as slices (the SIMD
/// paths), strided rows element by element.
pub(crate) fn argmax_of<P: Prob>(row: ArrayView1<'_, P>, at: RowAt) -> Result<usize, CoreError> {
    match row.as_slice() {
        Some(contiguous) => argmax(contiguous, at),
        None => argmax(row, at),
    }
}

pub(crate) fn zero_row(at: RowAt) -> CoreError {
    CoreError::value(
        at.arg,
        &at.pos.index(),
        "sums to 0, but a token must be sampled from it".to_string(),
    )
}

/// A draw from `p` (with `excluded` zeroed: the one-hot residual); `None` if it sums to 0.
pub(crate) fn sample_target<P: Prob>(
    row: ArrayView1<'_, P>,
    excluded: Option<usize>,
    at: RowAt,
    u: f64,
    scratch: &mut Vec<f64>,
) -> Result<Option<usize>, CoreError> {
    match row.as_slice() {
        Some(p) => sample(
            &TargetWeights {
                p,
                excluded,
                at,
                _elem: PhantomData,
            },
            u,
            scratch,
        ),
        None => sample(
            &TargetWeights {
                p: row,
                excluded,
                at,
                _elem: PhantomData,
            },
            u,
            scratch,
        ),
    }
}

pub(crate) fn sample_residual<P: Prob, Q: Prob>(
    p: ArrayView1<'_, P>,
    q: ArrayView1<'_, Q>,
    at: Pos,
    rho: f64,
    u: f64,
    scratch: &mut Vec<f64>,
    known_total: Option<f64>,
) -> Result<Option<usize>, CoreError> {
    // `max(0, rho * p - q)`; `rho = 1` is the token rule's `max(0, p - q)`, bit
    // for bit. `known_total`: the caller summed these weights into `scratch`.
    let op = ScaledResidual(rho);
    match (p.as_slice(), q.as_slice()) {
        (Some(p), Some(q)) => {
            let w = PairWeights {
                op,
                p,
                q,
                at,
                buffer: false,
                _elem: PhantomData,
            };
            sample_or_search(&w, u, scratch, known_total)
        }
        _ => {
            let w = PairWeights {
                op,
                p,
                q,
                at,
                buffer: false,
                _elem: PhantomData,
            };
            sample_or_search(&w, u, scratch, known_total)
        }
    }
}

/// The residual mass `Z = sum(max(0, rho * p - q))`, its block sums left in
/// `scratch` for [`sample_residual`] with `known_total`. `buffer`: `p` is a
/// round's float64 buffer ([`PairWeights::buffer`]: in cache, not checked).
pub(crate) fn residual_mass<P: Prob, Q: Prob>(
    p: ArrayView1<'_, P>,
    q: ArrayView1<'_, Q>,
    at: Pos,
    rho: f64,
    scratch: &mut Vec<f64>,
    buffer: bool,
) -> Result<f64, CoreError> {
    let op = ScaledResidual(rho);
    match (p.as_slice(), q.as_slice()) {
        (Some(p), Some(q)) => sum_blocks(
            &PairWeights {
                op,
                p,
                q,
                at,
                buffer,
                _elem: PhantomData,
            },
            scratch,
        ),
        _ => sum_blocks(
            &PairWeights {
                op,
                p,
                q,
                at,
                buffer,
                _elem: PhantomData,
            },
            scratch,
        ),
    }
}

fn sample_or_search<W: Weights>(
    w: &W,
    u: f64,
    scratch: &mut Vec<f64>,
    known_total: Option<f64>,
) -> Result<Option<usize>, CoreError> {
    match known_total {
        Some(total) => Ok(search(w, u, scratch, total)),
        None => sample(w, u, scratch),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(p: &[f64]) -> TargetWeights<f64, &[f64]> {
        TargetWeights {
            p,
            excluded: None,
            at: RowAt {
                arg: "target_probs",
                pos: Pos::Padded { b: 0, t: 0 },
            },
            _elem: PhantomData,
        }
    }

    fn draw(p: &[f64], u: f64) -> Option<usize> {
        sample(&target(p), u, &mut Vec::new()).unwrap()
    }

    #[test]
    fn inverse_cdf_picks_the_first_index_past_the_threshold() {
        let p = [0.0, 0.25, 0.0, 0.5, 0.25];
        assert_eq!(
            draw(&p, 0.0),
            Some(1),
            "u = 0 takes the first positive weight"
        );
        assert_eq!(draw(&p, 0.2499), Some(1));
        assert_eq!(
            draw(&p, 0.25),
            Some(3),
            "the cumulative sum must exceed u * T strictly"
        );
        assert_eq!(draw(&p, 0.7499), Some(3));
        assert_eq!(draw(&p, 0.75), Some(4));
        assert_eq!(draw(&p, 1.0 - f64::EPSILON / 2.0), Some(4));
    }

    #[test]
    fn unnormalised_rows_and_zero_rows() {
        assert_eq!(draw(&[2.0, 6.0], 0.24), Some(0));
        assert_eq!(draw(&[2.0, 6.0], 0.26), Some(1));
        assert_eq!(draw(&[0.0, 0.0, 0.0], 0.5), None);
        assert_eq!(draw(&[], 0.5), None);
    }

    #[test]
    fn draws_across_many_blocks_match_a_sequential_scan() {
        // A long row spanning several blocks, with a zero tail.
        let n = 5 * SUM_BLOCK + 37;
        let p: Vec<f64> = (0..n)
            .map(|i| {
                if i > n - 50 {
                    0.0
                } else {
                    ((i * 7919) % 101) as f64
                }
            })
            .collect();
        let total: f64 = p.iter().sum();
        for k in 0..200 {
            let u = k as f64 / 200.0;
            let got = draw(&p, u).unwrap();
            // The sequential cumulative sum agrees with the blocked one away from ties.
            let mut c = 0.0;
            let expected = p
                .iter()
                .position(|&w| {
                    c += w;
                    w > 0.0 && c > u * total
                })
                .unwrap();
            assert_eq!(got, expected, "u = {u}");
        }
    }

    #[test]
    fn rounding_falls_back_to_the_last_positive_weight() {
        // Lanes sum 2^-53 + 2^-53 exactly, the running sum loses each 2^-53 to 1.0:
        // T = 1 + 2^-52, u * T rounds to 1.0, and no cumulative sum exceeds 1.0.
        let tiny = f64::EPSILON / 2.0;
        let p = [1.0, 0.0, tiny, tiny];
        assert_eq!(draw(&p, 1.0 - f64::EPSILON / 2.0), Some(3));
        // A tiny last weight that rounding absorbs is simply never reached.
        assert_eq!(draw(&[1.0, 1e-30, 0.0], 1.0 - f64::EPSILON / 2.0), Some(0));
    }

    #[test]
    fn bad_values_name_their_index() {
        let p = [0.5, f64::NAN, 0.5];
        let e = sample(&target(&p), 0.5, &mut Vec::new()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "target_probs[0, 0, 1] = nan: probabilities must be finite and non-negative"
        );
        let at = RowAt {
            arg: "target_probs",
            pos: Pos::Padded { b: 2, t: 1 },
        };
        assert!(argmax(&[0.1, -0.5][..], at).is_err());
        assert!(argmax(&[0.1, f64::INFINITY][..], at).is_err());
        assert_eq!(
            argmax(&[0.1, 0.7, 0.7, 0.2][..], at).unwrap(),
            1,
            "first maximal index"
        );
        assert_eq!(argmax(&[0.0, 0.0][..], at).unwrap(), 0);
        assert!(argmax(&[0.0f64; 0][..], at).is_err());
    }
}
