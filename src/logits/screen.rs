//! The screen of `verify_logits`: a float32 pass with a certified error
//! bound that proves most accepted positions accepted without the exact pass.

use ndarray::ArrayView1;

use super::exact::exact_weight;
use crate::prob::Prob;

/// The screen: a cheap pass that often proves a draft accepted without the
/// float64 transform of its rows. An accepted position needs only
/// `p(x) = w_x / sum(w)` and `q(x)`, not `w`; the screen bounds `sum(w)` (the
/// exact pass's value, bits and all) by an `f32` estimate with a certified
/// error, and `w_x` is computed exactly. Where the bounds decide the rule, the
/// decision is the exact pass's; anywhere else (`u` within about `5e-4` of
/// `p/q`, a rejection, f64 logits, filters on) the exact pass runs. So the
/// output is unchanged, bit for bit; only the work is.
///
/// Error budget of one term `e = exp2_screen(y')`, `y' = fl32(fl32(l - max) *
/// fl32(log2(e) / T))`, against the exact `exp(x) = 2^y`, `x = (l - max) / T`,
/// `y = x log2(e)`:
/// - three roundings to f32 give `|y' - y| <= 3u |y| (1 + 2u)`, `u = 2^-24`,
///   and `|y'| <= 125` where not clamped: a factor `2^|y' - y|` within
///   `1.56e-5` of 1, so [`SCREEN_ARG_ERROR`];
/// - [`exp2_screen`] itself: [`SCREEN_EXP_ERROR`] (analysis at the function,
///   measured by a unit test over every f32 in `[-125, 0]`);
/// - the f32 lane sums, 128 terms per lane per chunk: [`SCREEN_SUM_ERROR`]
///   (`128u` is `7.6e-6`);
/// - terms below `2^-125` are taken as `2^-125` (times at most `1.42`):
///   `1e-37` each at most;
/// - the exact pass's own error (float64 `exp`, product and sum, and the
///   rescaling below): under `1e-9` of the sum.
const SCREEN_EXP_ERROR: f64 = 1e-4;
const SCREEN_ARG_ERROR: f64 = 2e-5;
const SCREEN_SUM_ERROR: f64 = 1e-5;

/// `a * b + c` in `f32`: fused where the caller runs with FMA (`FMA = true`).
#[inline(always)]
pub(super) fn mul_add32<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

/// The coefficients of [`exp2_screen`]'s polynomial for `2^r`, `|r| <= 1/2`:
/// degree 3, minimax in relative error (a linear program on 4001 points,
/// rounded to `f32`): `7.48e-5`.
const SCREEN_POLY: [f32; 4] = [0.999_928_06, 0.693_260_85, 0.242_611_15, 0.055_172_22];

/// The clamp of the arguments `y'` of the float32 passes (the screen and the
/// certified pass): `2^-125` and below are taken as `2^-125`, so `2^n` stays
/// normal (`n >= -125`).
pub(super) const EXP2_FLOOR: f32 = -125.0;

/// `2^y` in `f32` for `-125 <= y <= 0`, within [`SCREEN_EXP_ERROR`] relative.
/// `y = n + r`, `n` the integer nearest to `y` (adding `1.5 * 2^23` rounds to
/// it, ties to even, as `vroundps` does), `r = y - n` exact, `|r| <= 1/2`;
/// `2^r` is the degree-3 polynomial [`SCREEN_POLY`] (`7.48e-5`) in Horner's
/// scheme: three roundings, each at most `u` of a value above `0.7`, with the
/// lower ones scaled by `|r| <= 1/2` (`2.5u` in all); `2^n` is exact, added to
/// the exponent bits of `p` (`0.7 < p < 1.42`, so the result is normal for
/// `n >= -125`). `FMA` only removes roundings. `7.5e-5` in all, against
/// [`SCREEN_EXP_ERROR`]'s `1e-4`.
#[inline(always)]
fn exp2_screen<const FMA: bool>(y: f32) -> f32 {
    exp2_by(y, |r| {
        let [c0, c1, c2, c3] = SCREEN_POLY;
        mul_add32::<FMA>(mul_add32::<FMA>(mul_add32::<FMA>(c3, r, c2), r, c1), r, c0)
    })
}

/// `2^y` for `-125 <= y <= 0` from `two_r(r)`, a value of `2^r` in
/// `(0.7, 1.42)` for `|r| <= 1/2`: `n` the integer nearest to `y` (adding
/// `1.5 * 2^23` rounds to it, ties to even, as `vroundps` does), `r = y - n`
/// exact, and `2^n` added to the exponent bits of `2^r` (the result stays
/// normal for `n >= -125`). The float32 passes' `exp`, with their polynomials.
#[inline(always)]
pub(super) fn exp2_by(y: f32, two_r: impl Fn(f32) -> f32) -> f32 {
    const ROUND: f32 = 12_582_912.0; // 1.5 * 2^23
    let shifted = y + ROUND;
    let r = y - (shifted - ROUND);
    // The low bits of `shifted` hold n (two's complement, |n| < 2^22), and
    // the bits of 1.5 * 2^23 above them shift out: `<< 23` is `n << 23`.
    f32::from_bits(two_r(r).to_bits().wrapping_add(shifted.to_bits() << 23))
}

/// `y' = fl32(fl32(l - max) * log2e_inverse)`, clamped to [`EXP2_FLOOR`]
/// (`NaN` stays `NaN`): the argument of `2^y'` in the float32 passes.
#[inline(always)]
pub(super) fn exp2_arg(l: f32, max: f32, log2e_inverse: f32) -> f32 {
    let y = (l - max) * log2e_inverse;
    if y < EXP2_FLOOR {
        EXP2_FLOOR
    } else {
        y
    }
}

/// `log2(e) / T` in `f32`, rounded once.
pub(super) fn log2e_inverse(inverse: f64) -> f32 {
    (inverse * std::f64::consts::LOG2_E) as f32
}

/// Lanes of the screen's loops: two `f32x8` registers of sums (more spill
/// registers).
const SCREEN_LANES: usize = 16;

/// Logits per step of the screen's online max: a max pass and an `exp` pass
/// over a chunk in L1, then its lane sums go to `f64` (128 terms per lane).
const SCREEN_CHUNK: usize = 2048;

/// Validity (no NaN, no `+inf`) and max of f16/bf16/f32 logits, in `f32`
/// (exact): the AVX2 kernel where the CPU has it, the NEON kernel on aarch64
/// (the same bits as [`max_chunk_f32`]).
pub(super) fn max_of<L: Prob>(values: &[L]) -> (bool, f32) {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::has_avx2() {
        // SAFETY: the CPU supports AVX2 and F16C, checked just above.
        return unsafe { x86::max_of(values) };
    }
    #[cfg(target_arch = "aarch64")]
    // SAFETY: NEON is part of the aarch64 baseline.
    return unsafe { neon::max_of(values) };
    #[cfg(not(target_arch = "aarch64"))]
    return max_chunk_f32(values);
}

/// [`max_of`], portable: element `j` of every group of [`SCREEN_LANES`]
/// goes to lane `j`, then the tail's (see [`max_lanes_finish`]).
#[cfg_attr(target_arch = "aarch64", allow(dead_code))] // the NEON kernel's twin there
#[inline(always)]
fn max_chunk_f32<L: Prob>(chunk: &[L]) -> (bool, f32) {
    let mut max = [f32::NEG_INFINITY; SCREEN_LANES];
    // 0 while every value is below +inf (NaN and +inf make it 1).
    let mut bad = [0.0f32; SCREEN_LANES];
    let (groups, tail) = chunk.as_chunks::<SCREEN_LANES>();
    for group in groups {
        for j in 0..SCREEN_LANES {
            max_lane(&mut max[j], &mut bad[j], group[j]);
        }
    }
    max_lanes_finish(max, bad, tail)
}

/// One element into a lane of [`max_chunk_f32`]: `bad` becomes 1 for NaN or
/// `+inf` (not below `+inf`), `max` takes a value above it (never NaN).
#[inline(always)]
fn max_lane<L: Prob>(max: &mut f32, bad: &mut f32, l: L) {
    let v = l.to_f32();
    *bad = if v < f32::INFINITY { *bad } else { 1.0 };
    *max = if v > *max { v } else { *max };
}

/// The end of [`max_chunk_f32`] (and of its NEON twin): the tail's element
/// `j` into lane `j`, then the lanes folded in order: `(valid, max)`.
#[inline(always)]
fn max_lanes_finish<L: Prob>(
    mut max: [f32; SCREEN_LANES],
    mut bad: [f32; SCREEN_LANES],
    tail: &[L],
) -> (bool, f32) {
    for (j, &l) in tail.iter().enumerate() {
        max_lane(&mut max[j], &mut bad[j], l);
    }
    let top = max.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    (bad.iter().all(|&b| b == 0.0), top)
}

/// `sum e` of one chunk, `e = exp2_screen(y')` (see [`exp2_arg`]): element
/// `j` of every group of [`SCREEN_LANES`] into the float32 sum of lane `j`,
/// then the tail's (see [`sum_lanes_finish`]).
#[inline(always)]
fn screen_chunk<L: Prob, const FMA: bool>(chunk: &[L], max: f32, log2e_inverse: f32) -> f64 {
    let mut sum = [0.0f32; SCREEN_LANES];
    let (groups, tail) = chunk.as_chunks::<SCREEN_LANES>();
    for group in groups {
        for (j, &l) in group.iter().enumerate() {
            sum[j] += exp2_screen::<FMA>(exp2_arg(l.to_f32(), max, log2e_inverse));
        }
    }
    sum_lanes_finish::<L, FMA>(sum, tail, max, log2e_inverse)
}

/// The end of [`screen_chunk`] (and of its NEON twin): the tail's term `j`
/// into lane `j`, then the lanes summed in float64, in order.
#[inline(always)]
fn sum_lanes_finish<L: Prob, const FMA: bool>(
    mut sum: [f32; SCREEN_LANES],
    tail: &[L],
    max: f32,
    log2e_inverse: f32,
) -> f64 {
    for (j, &l) in tail.iter().enumerate() {
        sum[j] += exp2_screen::<FMA>(exp2_arg(l.to_f32(), max, log2e_inverse));
    }
    sum.iter().map(|&v| f64::from(v)).sum()
}

/// A row's normaliser as the screen sees it: the exact pass's `sum(w)` lies
/// in `sum +- bound`; `max` is the largest logit (the exact pass's too).
#[derive(Clone, Copy)]
struct Screened {
    max: f64,
    sum: f64,
    bound: f64,
}

/// One pass over a row of f16/f32 logits: validity, max and the screened
/// sum, with the max found chunk by chunk and the sums rescaled when it
/// grows (online softmax), so the row is read once. `None` for a row the
/// exact pass must see (an invalid or all `-inf` row: it names the error).
#[inline(always)]
fn screen_row<L: Prob, const FMA: bool>(values: &[L], inverse: f64) -> Option<Screened> {
    #[cfg(target_arch = "x86_64")]
    if FMA {
        // SAFETY: FMA is on only in `screen_row_fma`, compiled for (and
        // called on) CPUs with AVX2, F16C and FMA.
        match unsafe { x86::screen_row(values, inverse) } {
            x86::Fused::Row(max, sum) => {
                let bound = screen_bound(sum, values.len());
                return Some(Screened { max, sum, bound });
            }
            x86::Fused::Invalid => return None,
            x86::Fused::MaskedStart => {} // below, chunk by chunk
        }
    }
    #[cfg(target_arch = "aarch64")]
    if FMA {
        // SAFETY: NEON (and FMA) are part of the aarch64 baseline.
        let (max, sum) = unsafe { neon::screen_row(values, inverse) }?;
        let bound = screen_bound(sum, values.len());
        return Some(Screened { max, sum, bound });
    }
    screen_chunked::<L, FMA>(values, inverse)
}

/// [`screen_row`], portable: chunk by chunk, a max pass and an `exp` pass
/// over each.
#[inline(always)]
fn screen_chunked<L: Prob, const FMA: bool>(values: &[L], inverse: f64) -> Option<Screened> {
    let (mut max, mut sum) = (f64::NEG_INFINITY, 0.0f64);
    for chunk in values.chunks(SCREEN_CHUNK) {
        let (ok, chunk_max) = max_of(chunk);
        if !ok {
            return None;
        }
        let chunk_max = f64::from(chunk_max);
        if chunk_max > max {
            // Earlier terms were relative to the old max: rescale them (their
            // relative error bounds hold as they are).
            sum *= ((max - chunk_max) * inverse).exp();
            max = chunk_max;
        }
        if max > f64::NEG_INFINITY {
            // `max` is a logit, so an exact f32.
            sum += screen_chunk::<L, FMA>(chunk, max as f32, log2e_inverse(inverse));
        }
    }
    if max == f64::NEG_INFINITY {
        return None;
    }
    let bound = screen_bound(sum, values.len());
    Some(Screened { max, sum, bound })
}

/// The certified error of a screened sum `sum` of `len` terms.
fn screen_bound(sum: f64, len: usize) -> f64 {
    let relative = 1.01 * (SCREEN_EXP_ERROR + SCREEN_ARG_ERROR + SCREEN_SUM_ERROR) + 1e-9;
    relative * sum + 1e-37 * len as f64
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
fn screen_row_avx2<L: Prob>(values: &[L], inverse: f64) -> Option<Screened> {
    screen_row::<L, false>(values, inverse)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c,fma")]
fn screen_row_fma<L: Prob>(values: &[L], inverse: f64) -> Option<Screened> {
    screen_row::<L, true>(values, inverse)
}

/// [`screen_row_fma`] compiled with AVX-512VL: the same operations on the
/// same 256-bit registers, 32 of them (fewer spills), the same bits
/// (`the_wide_screen_is_the_fma_screen`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c,fma,avx512f,avx512vl")]
fn screen_row_wide<L: Prob>(values: &[L], inverse: f64) -> Option<Screened> {
    screen_row::<L, true>(values, inverse)
}

/// The screen of a contiguous f16/f32 row, `None` where it does not apply.
fn screen(values: &[impl Prob], inverse: f64) -> Option<Screened> {
    // 1 / T must be a normal f32, far from overflow, for the error budget.
    if !(1e-30..=1e30).contains(&inverse) {
        return None;
    }
    screen_values(values, inverse)
}

fn screen_values<L: Prob>(values: &[L], inverse: f64) -> Option<Screened> {
    if !L::EXACT_IN_F32 {
        return None;
    }
    #[cfg(target_arch = "x86_64")]
    if crate::simd::has_avx2() {
        if std::is_x86_feature_detected!("fma") {
            if crate::simd::has_avx512vl() {
                // SAFETY: the CPU supports AVX2, F16C, FMA and AVX-512F/VL.
                return unsafe { screen_row_wide(values, inverse) };
            }
            // SAFETY: the CPU supports AVX2, F16C and FMA, checked here.
            return unsafe { screen_row_fma(values, inverse) };
        }
        // SAFETY: the CPU supports AVX2 and F16C, checked just above.
        return unsafe { screen_row_avx2(values, inverse) };
    }
    // aarch64 always has FMA (and NEON): the FMA variant, as the certified
    // pass's there.
    #[cfg(target_arch = "aarch64")]
    return screen_row::<L, true>(values, inverse);
    #[cfg(not(target_arch = "aarch64"))]
    return screen_row::<L, false>(values, inverse);
}

/// `p = w_x / sum` as the exact pass computes it lies in `(low, high)`.
fn probability_bounds(w_x: f64, screened: Screened) -> Option<(f64, f64)> {
    let low_sum = screened.sum - screened.bound;
    if low_sum <= 0.0 {
        return None;
    }
    let slack = 1e-15; // the exact pass's division, and ours
    Some((
        w_x / (screened.sum + screened.bound) * (1.0 - slack),
        w_x / low_sum * (1.0 + slack),
    ))
}

/// `p(x)` of a row (a target or a draft row) as the screen bounds it: the
/// exact pass's `p(x) = w_x / sum(w)` lies in `(low, high)`, within about
/// `2e-4` relative; and the row's max (valid rows only). `None` where the
/// screen does not apply (see [`screen`]) or cannot bound it.
pub(super) fn probability(
    row: ArrayView1<'_, impl Prob>,
    x: usize,
    inverse: f64,
) -> Option<(f64, f64, f32)> {
    let screened = screen(row.as_slice()?, inverse)?;
    let (low, high) = probability_bounds(exact_weight(row[x], screened.max, inverse), screened)?;
    // The max is a logit of a float16/bfloat16/float32 row: an exact f32.
    Some((low, high, screened.max as f32))
}

/// Whether a draft row's first chunk alone proves the position accepted:
/// `accepts` on an upper bound of `q(x)`, `q(x) = exp((l_x - m) / T) /
/// sum_i exp((l_i - m) / T)` for any `m`, the chunk's sum being a lower bound
/// of the whole row's. It proves most accepted positions whose draft the
/// drafter found unlikely, for a sixtieth of a row's `exp` at `V = 128256`.
/// Once it does, the rest of the row is read without `exp`, only to check it
/// (docs/spec.md section 8.5: each row read is checked in full): `false`
/// where it holds a NaN or `+inf` (the caller's passes find the row invalid,
/// and the exact pass names the entry), for a row of one chunk (the caller
/// reads the whole row anyway), a drafted logit above the chunk's max, or
/// where the screen does not apply.
pub(super) fn draft_prefix_accepts(
    draft: ArrayView1<'_, impl Prob>,
    x: usize,
    inverse: f64,
    accepts: impl Fn(f64) -> bool,
) -> bool {
    let Some(values) = draft.as_slice() else {
        return false;
    };
    let Some(prefix) = values
        .get(..SCREEN_CHUNK)
        .filter(|p| p.len() < values.len())
    else {
        return false;
    };
    let Some(screened) = screen(prefix, inverse) else {
        return false;
    };
    let l_x = draft[x].to_f64();
    let low_sum = screened.sum - screened.bound;
    if l_x > screened.max || low_sum <= 0.0 {
        return false;
    }
    // exp in f64 and the exact pass's own error: far below 1e-8.
    let q_high = ((l_x - screened.max) * inverse).exp() * (1.0 + 1e-8) / low_sum;
    accepts(q_high) && max_of(&values[SCREEN_CHUNK..]).0
}

/// The screen alone over a row of f16/f32 logits: `(sum, bound)` with the
/// exact pass's `sum(w)` in `sum +- bound`, or `None` where the screen does
/// not apply. For benchmarks and tests, as [`super::exact_pass`].
pub fn screen_pass<L: Prob>(values: &[L], temperature: f64) -> Option<(f64, f64)> {
    let inverse = 1.0 / temperature;
    if !(1e-30..=1e30).contains(&inverse) {
        return None;
    }
    let screened = screen_values(values, inverse)?;
    Some((screened.sum, screened.bound))
}

/// The screen's kernels in AVX2 registers: the max and validity of logits,
/// and the screen of a row in one read (FMA), four vectors a step with the
/// same operations as [`exp2_screen`]`::<true>` per term.
#[cfg(target_arch = "x86_64")]
pub(super) mod x86 {
    use std::arch::x86_64::*;

    use super::{exp2_arg, exp2_screen, SCREEN_POLY};
    use crate::prob::Prob;

    /// [`super::max_of`]: four running maxima (`max(v, m)` keeps `m` where
    /// `v` is NaN), and a flag of the lanes that met NaN or `+inf` (not less
    /// than `+inf`, unordered).
    ///
    /// # Safety
    /// The CPU has AVX2 and F16C.
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn max_of<L: Prob>(values: &[L]) -> (bool, f32) {
        let low = _mm256_set1_ps(f32::NEG_INFINITY);
        let inf = _mm256_set1_ps(f32::INFINITY);
        let mut m = [low; 4];
        let mut bad = _mm256_setzero_ps();
        let (quads, rest) = values.as_chunks::<32>();
        for quad in quads {
            for (k, m) in m.iter_mut().enumerate() {
                let v = L::load8_ps(quad.as_ptr().add(8 * k));
                *m = _mm256_max_ps(v, *m);
                bad = _mm256_or_ps(bad, _mm256_cmp_ps::<_CMP_NLT_UQ>(v, inf));
            }
        }
        let m = _mm256_max_ps(_mm256_max_ps(m[0], m[1]), _mm256_max_ps(m[2], m[3]));
        let mut lanes = [0.0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), m);
        let (ok, tail) = super::max_chunk_f32(rest);
        let max = lanes.iter().fold(tail, |a, &b| a.max(b));
        (ok && _mm256_movemask_ps(bad) == 0, max)
    }

    /// [`super::exp2_arg`] of eight logits: NaN stays NaN (the clamp
    /// returns its second operand then).
    #[inline]
    #[target_feature(enable = "avx2,f16c,fma")]
    pub(in crate::logits) unsafe fn exp2_arg8(
        l: __m256,
        max: __m256,
        log2e_inverse: __m256,
    ) -> __m256 {
        _mm256_max_ps(
            _mm256_set1_ps(super::EXP2_FLOOR),
            _mm256_mul_ps(_mm256_sub_ps(l, max), log2e_inverse),
        )
    }

    /// [`super::exp2_by`] of eight arguments: `vroundps` rounds as its
    /// `1.5 * 2^23` does, and `n` converts exactly. NaN stays NaN: `n`
    /// converts to `i32::MIN`, whose `<< 23` is 0.
    #[inline]
    #[target_feature(enable = "avx2,f16c,fma")]
    pub(in crate::logits) unsafe fn exp2_by8(
        y: __m256,
        two_r: impl Fn(__m256) -> __m256,
    ) -> __m256 {
        let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(y);
        let p = two_r(_mm256_sub_ps(y, n));
        let two_n = _mm256_slli_epi32::<23>(_mm256_cvtps_epi32(n));
        _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), two_n))
    }

    /// `exp2_screen::<true>(exp2_arg(l))` of eight logits `l`.
    #[inline]
    #[target_feature(enable = "avx2,f16c,fma")]
    pub(super) unsafe fn term8(l: __m256, max: __m256, log2e_inverse: __m256) -> __m256 {
        let [c0, c1, c2, c3] = SCREEN_POLY.map(|c| _mm256_set1_ps(c));
        exp2_by8(exp2_arg8(l, max, log2e_inverse), |r| {
            _mm256_fmadd_ps(_mm256_fmadd_ps(_mm256_fmadd_ps(c3, r, c2), r, c1), r, c0)
        })
    }

    /// Adds the terms of `quads` to `acc`, a step of 32 logits at a time,
    /// up to the first step with a logit above `max` (NaN is never above:
    /// it reaches the sum): the number of steps added. No call in the loop,
    /// so its registers stay put.
    #[inline]
    #[target_feature(enable = "avx2,f16c,fma")]
    unsafe fn add_steps<L: Prob>(
        quads: &[[L; 32]],
        max: __m256,
        log2e_inverse: __m256,
        acc: &mut (__m256, __m256),
    ) -> usize {
        for (k, quad) in quads.iter().enumerate() {
            let p = quad.as_ptr();
            let (v0, v1) = (L::load8_ps(p), L::load8_ps(p.add(8)));
            let (v2, v3) = (L::load8_ps(p.add(16)), L::load8_ps(p.add(24)));
            let top = _mm256_max_ps(_mm256_max_ps(v0, v1), _mm256_max_ps(v2, v3));
            if _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_GT_OQ>(top, max)) != 0 {
                return k;
            }
            let (e0, e1) = (term8(v0, max, log2e_inverse), term8(v1, max, log2e_inverse));
            let (e2, e3) = (term8(v2, max, log2e_inverse), term8(v3, max, log2e_inverse));
            acc.0 = _mm256_add_ps(acc.0, _mm256_add_ps(e0, e1));
            acc.1 = _mm256_add_ps(acc.1, _mm256_add_ps(e2, e3));
        }
        quads.len()
    }

    /// The float64 sum of the lanes of `acc`, which is cleared.
    #[inline]
    #[target_feature(enable = "avx2,f16c,fma")]
    unsafe fn total(acc: &mut (__m256, __m256)) -> f64 {
        let mut lanes = [0.0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), _mm256_add_ps(acc.0, acc.1));
        *acc = (_mm256_setzero_ps(), _mm256_setzero_ps());
        lanes.iter().map(|&v| f64::from(v)).sum()
    }

    /// What [`screen_row`] found.
    pub(super) enum Fused {
        /// A valid row: its max and screened sum.
        Row(f64, f64),
        /// NaN, `+inf`, or no finite logit: the exact pass names it.
        Invalid,
        /// The first chunk is all `-inf`: left to the chunked screen.
        MaskedStart,
    }

    /// [`super::screen_row`] in one read of the row: the max of the first
    /// chunk starts a running max, each step of 32 logits checks its own max
    /// against it (rarely larger: then the sum so far is rescaled, as the
    /// chunked screen does), and adds its terms; the float32 sums go to
    /// float64 every [`super::SCREEN_CHUNK`] logits (each term rounded at most
    /// 66 times in float32, within the 128 of [`super::SCREEN_SUM_ERROR`]).
    /// NaN reaches the sum; `+inf` raises the max.
    ///
    /// # Safety
    /// The CPU has AVX2, F16C and FMA. Not compiled alone: inlined into its
    /// callers, compiled for AVX2 and FMA with 16 vector registers or with 32
    /// (AVX-512VL), the same operations either way.
    #[inline(always)]
    pub(super) unsafe fn screen_row<L: Prob>(values: &[L], inverse: f64) -> Fused {
        let first = &values[..values.len().min(super::SCREEN_CHUNK)];
        let (ok, first_max) = max_of(first);
        if !ok {
            return Fused::Invalid;
        }
        if first_max == f32::NEG_INFINITY {
            return Fused::MaskedStart;
        }
        let (mut max, mut sum) = (first_max, 0.0f64);
        let log2e_inverse = super::log2e_inverse(inverse);
        let vinv = _mm256_set1_ps(log2e_inverse);
        for chunk in values.chunks(super::SCREEN_CHUNK) {
            let (quads, rest) = chunk.as_chunks::<32>();
            let mut acc = (_mm256_setzero_ps(), _mm256_setzero_ps());
            let mut done = 0;
            loop {
                done += add_steps(&quads[done..], _mm256_set1_ps(max), vinv, &mut acc);
                let Some(quad) = quads.get(done) else { break };
                // A logit above the max: the terms so far were relative to
                // the old one. The step runs again with the new max.
                let new = quad.iter().fold(max, |a, &l| a.max(l.to_f32()));
                if new == f32::INFINITY {
                    return Fused::Invalid;
                }
                sum += total(&mut acc);
                sum *= ((f64::from(max) - f64::from(new)) * inverse).exp();
                max = new;
            }
            sum += total(&mut acc);
            for &l in rest {
                let l = l.to_f32();
                if l > max {
                    if l == f32::INFINITY {
                        return Fused::Invalid;
                    }
                    sum *= ((f64::from(max) - f64::from(l)) * inverse).exp();
                    max = l;
                }
                if l.is_nan() {
                    // Not through `exp2_screen`: a NaN's payload bits may
                    // reach its exponent there.
                    return Fused::Invalid;
                }
                sum += f64::from(exp2_screen::<true>(exp2_arg(l, max, log2e_inverse)));
            }
        }
        if sum.is_nan() {
            return Fused::Invalid;
        }
        Fused::Row(f64::from(max), sum)
    }
}

/// The screen's kernels in NEON registers (aarch64, where NEON and FMA are
/// part of the baseline): the max and validity of logits, and the screen of a
/// row in one read of each chunk where the max does not grow there. Sixteen
/// logits a step in four `f32x4`: lane `j` of the portable code's
/// [`SCREEN_LANES`] is lane `j % 4` of register `j / 4`, each lane sees the
/// same float32 operations in the same order (per term those of
/// [`exp2_screen`]`::<true>`), and the tails and the ends are the portable
/// functions themselves ([`max_lanes_finish`], [`sum_lanes_finish`]): the
/// same bits as [`max_chunk_f32`] and [`screen_chunked`]`::<_, true>`, not
/// merely within the bound. float16 logits load through [`Prob`]'s NEON
/// `load8_ps` (integer steps: the stable NEON API has no float16 conversion),
/// exactly, as bfloat16 (a 16-bit shift) and float32.
#[cfg(target_arch = "aarch64")]
pub(super) mod neon {
    use std::arch::aarch64::*;

    use super::{max_lanes_finish, sum_lanes_finish, EXP2_FLOOR, SCREEN_LANES, SCREEN_POLY};
    use crate::prob::Prob;

    /// Sixteen logits as `f32` (exact for f16, bf16 and f32): element `j` in
    /// lane `j % 4` of register `j / 4`.
    ///
    /// # Safety
    /// `p` points at 16 readable elements.
    #[inline(always)]
    unsafe fn load16<L: Prob>(p: *const L) -> [float32x4_t; 4] {
        let [a, b] = L::load8_ps(p);
        let [c, d] = L::load8_ps(p.add(8));
        [a, b, c, d]
    }

    /// Four registers as the portable code's lanes (the inverse of [`load16`]).
    #[inline(always)]
    unsafe fn lanes(v: [float32x4_t; 4]) -> [f32; SCREEN_LANES] {
        let mut out = [0.0f32; SCREEN_LANES];
        for (k, v) in v.into_iter().enumerate() {
            vst1q_f32(out.as_mut_ptr().add(4 * k), v);
        }
        out
    }

    /// The running maxima of [`max_of`]'s lanes, and their validity.
    struct MaxLanes {
        max: [float32x4_t; 4],
        /// All ones while every value read is below `+inf`: one register
        /// for the sixteen lanes (their flags only reach an `all`), so the
        /// fused loop keeps more in registers.
        good: uint32x4_t,
    }

    impl MaxLanes {
        #[inline(always)]
        unsafe fn new() -> Self {
            MaxLanes {
                max: [vdupq_n_f32(f32::NEG_INFINITY); 4],
                good: vdupq_n_u32(u32::MAX),
            }
        }

        /// [`super::max_lane`] on sixteen lanes: `v > max` selects `v`
        /// (compare and select, not `vmaxq_f32`: NaN never enters, and a
        /// zero max keeps the sign it had first, as the portable `if`);
        /// NaN and `+inf` (not below `+inf`) clear `good`.
        #[inline(always)]
        unsafe fn add(&mut self, v: [float32x4_t; 4]) {
            let inf = vdupq_n_f32(f32::INFINITY);
            let below = |v| vcltq_f32(v, inf);
            let all = vandq_u32(
                vandq_u32(below(v[0]), below(v[1])),
                vandq_u32(below(v[2]), below(v[3])),
            );
            self.good = vandq_u32(self.good, all);
            for (max, v) in self.max.iter_mut().zip(v) {
                *max = vbslq_f32(vcgtq_f32(v, *max), v, *max);
            }
        }

        /// [`max_lanes_finish`] with the tail: `(valid, max)`.
        #[inline(always)]
        unsafe fn finish<L: Prob>(self, tail: &[L]) -> (bool, f32) {
            // The portable lanes' `bad` (of which only `all == 0` counts):
            // 1 in the first four where `good` was cleared, else 0.
            let one = vreinterpretq_u32_f32(vdupq_n_f32(1.0));
            let flags = vreinterpretq_f32_u32(vbicq_u32(one, self.good));
            let zero = vdupq_n_f32(0.0);
            max_lanes_finish(lanes(self.max), lanes([flags, zero, zero, zero]), tail)
        }
    }

    /// [`super::max_of`]: [`super::max_chunk_f32`]'s lanes and operations,
    /// the same bits.
    ///
    /// # Safety
    /// None beyond NEON, which every aarch64 target has.
    pub(super) unsafe fn max_of<L: Prob>(values: &[L]) -> (bool, f32) {
        let mut max = MaxLanes::new();
        let (groups, tail) = values.as_chunks::<SCREEN_LANES>();
        for group in groups {
            max.add(load16(group.as_ptr()));
        }
        max.finish(tail)
    }

    /// [`super::exp2_arg`] of four logits: `vmaxq_f32` is the clamp (`y`
    /// where `y >= EXP2_FLOOR`, the floor below it, and NaN stays the same
    /// NaN, as the portable `if` returns it).
    #[inline(always)]
    pub(in crate::logits) unsafe fn exp2_arg4(
        l: float32x4_t,
        max: float32x4_t,
        log2e_inverse: float32x4_t,
    ) -> float32x4_t {
        let y = vmulq_f32(vsubq_f32(l, max), log2e_inverse);
        vmaxq_f32(y, vdupq_n_f32(EXP2_FLOOR))
    }

    /// [`super::exp2_by`] of four arguments, its operations one for one:
    /// `n` from adding and subtracting `1.5 * 2^23`, `r = y - n`, and the
    /// low bits of `y + 1.5 * 2^23` shifted into the exponent of `2^r`.
    #[inline(always)]
    pub(in crate::logits) unsafe fn exp2_by4(
        y: float32x4_t,
        two_r: impl Fn(float32x4_t) -> float32x4_t,
    ) -> float32x4_t {
        let round = vdupq_n_f32(12_582_912.0); // 1.5 * 2^23
        let shifted = vaddq_f32(y, round);
        let r = vsubq_f32(y, vsubq_f32(shifted, round));
        let two_n = vshlq_n_u32::<23>(vreinterpretq_u32_f32(shifted));
        vreinterpretq_f32_u32(vaddq_u32(vreinterpretq_u32_f32(two_r(r)), two_n))
    }

    /// `exp2_screen::<true>(exp2_arg(l))` of four logits `l`: Horner's
    /// scheme in fused multiply-adds, `vfmaq_f32(c, a, b)` being
    /// `a.mul_add(b, c)`.
    #[inline(always)]
    pub(super) unsafe fn term4(
        l: float32x4_t,
        max: float32x4_t,
        log2e_inverse: float32x4_t,
    ) -> float32x4_t {
        let [c0, c1, c2, c3] = SCREEN_POLY.map(|c| vdupq_n_f32(c));
        exp2_by4(exp2_arg4(l, max, log2e_inverse), |r| {
            vfmaq_f32(c0, vfmaq_f32(c1, vfmaq_f32(c2, c3, r), r), r)
        })
    }

    /// Adds the terms of sixteen logits to the lanes of `sum`.
    #[inline(always)]
    unsafe fn add_terms(
        sum: &mut [float32x4_t; 4],
        v: [float32x4_t; 4],
        max: float32x4_t,
        log2e_inverse: float32x4_t,
    ) {
        for (sum, v) in sum.iter_mut().zip(v) {
            *sum = vaddq_f32(*sum, term4(v, max, log2e_inverse));
        }
    }

    /// [`super::screen_chunk`]`::<L, true>`: the same bits.
    ///
    /// # Safety
    /// None beyond NEON.
    unsafe fn screen_chunk<L: Prob>(chunk: &[L], max: f32, log2e_inverse: f32) -> f64 {
        let (vmax, vinv) = (vdupq_n_f32(max), vdupq_n_f32(log2e_inverse));
        let mut sum = [vdupq_n_f32(0.0); 4];
        let (groups, tail) = chunk.as_chunks::<SCREEN_LANES>();
        for group in groups {
            add_terms(&mut sum, load16(group.as_ptr()), vmax, vinv);
        }
        sum_lanes_finish::<L, true>(lanes(sum), tail, max, log2e_inverse)
    }

    /// One read of a chunk: its validity and max (as [`max_of`]) and the sum
    /// of its terms against `max`, the row's max before it (as
    /// [`screen_chunk`]), in `(valid, chunk max, sum)`. Where the chunk's
    /// max is above `max`, the sum is not the one the row needs. NaN and
    /// `+inf` give garbage terms, but an invalid chunk.
    ///
    /// # Safety
    /// None beyond NEON.
    unsafe fn fused_chunk<L: Prob>(chunk: &[L], max: f32, log2e_inverse: f32) -> (bool, f32, f64) {
        let (vmax, vinv) = (vdupq_n_f32(max), vdupq_n_f32(log2e_inverse));
        let mut top = MaxLanes::new();
        let mut sum = [vdupq_n_f32(0.0); 4];
        let (groups, tail) = chunk.as_chunks::<SCREEN_LANES>();
        for group in groups {
            let v = load16(group.as_ptr());
            top.add(v);
            add_terms(&mut sum, v, vmax, vinv);
        }
        let (ok, chunk_max) = top.finish(tail);
        let sum = sum_lanes_finish::<L, true>(lanes(sum), tail, max, log2e_inverse);
        (ok, chunk_max, sum)
    }

    /// [`super::screen_chunked`]`::<L, true>`: `(max, sum)`, the same
    /// operations chunk by chunk and so the same bits, `None` where it gives
    /// `None`. The chunked screen computes a chunk's terms against the max
    /// of the row up to and including that chunk; where the chunk does not
    /// raise it (all but a few chunks of a row), that is the max before the
    /// chunk, so the terms come in the read that finds the chunk's max and
    /// validity ([`fused_chunk`]); where it does, the chunk is read again
    /// with the new max. The first chunk (no max yet) is read twice.
    ///
    /// # Safety
    /// None beyond NEON.
    pub(super) unsafe fn screen_row<L: Prob>(values: &[L], inverse: f64) -> Option<(f64, f64)> {
        let log2e_inverse = super::log2e_inverse(inverse);
        let (mut max, mut sum) = (f64::NEG_INFINITY, 0.0f64);
        for chunk in values.chunks(super::SCREEN_CHUNK) {
            let (ok, chunk_max, mut terms) = if max > f64::NEG_INFINITY {
                // `max` is a logit, so an exact f32.
                let (ok, chunk_max, terms) = fused_chunk(chunk, max as f32, log2e_inverse);
                (ok, chunk_max, Some(terms))
            } else {
                let (ok, chunk_max) = max_of(chunk);
                (ok, chunk_max, None)
            };
            if !ok {
                return None;
            }
            let chunk_max = f64::from(chunk_max);
            if chunk_max > max {
                sum *= ((max - chunk_max) * inverse).exp();
                max = chunk_max;
                terms = None; // against the old max
            }
            if max > f64::NEG_INFINITY {
                sum += match terms {
                    Some(terms) => terms,
                    None => screen_chunk(chunk, max as f32, log2e_inverse),
                };
            }
        }
        if max == f64::NEG_INFINITY {
            return None;
        }
        Some((max, sum))
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::logits::exact::{row_exp_sum, row_max};
    use ndarray::s;

    /// The largest relative error of both variants of an f32 `2^y` over
    /// inputs in `[EXP2_FLOOR, 0]`, every `stride`-th bit pattern.
    pub(crate) fn worst_exp2_error(exp2: impl Fn(f32) -> [f32; 2], stride: usize) -> f64 {
        let (zero, end) = ((-0.0f32).to_bits(), EXP2_FLOOR.to_bits());
        let mut worst = 0.0f64;
        for bits in (zero..=end).step_by(stride).chain([end]) {
            let y = f32::from_bits(bits);
            let exact = f64::from(y).exp2();
            for e in exp2(y) {
                worst = worst.max((f64::from(e) - exact).abs() / exact);
            }
        }
        worst
    }

    fn worst_screen_error(stride: usize) -> f64 {
        let exp = |y| [exp2_screen::<false>(y), exp2_screen::<true>(y)];
        worst_exp2_error(exp, stride)
    }

    #[test]
    fn exp2_screen_is_within_its_budget() {
        // The analysis at exp2_screen: 7.5e-5; not loose either.
        let worst = worst_screen_error(4099);
        assert!(worst < 7.6e-5, "relative error {worst}");
        assert!(worst > 7.4e-5, "relative error {worst}");
        assert!(worst < SCREEN_EXP_ERROR);
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_kernel_terms_are_the_scalar_terms() {
        if !(crate::simd::has_avx2() && std::is_x86_feature_detected!("fma")) {
            return;
        }
        let logits = term_logits();
        for inverse in [1.25, 0.7, 1e-3, 40.0] {
            let (max, scale) = (-0.0f32, log2e_inverse(inverse));
            for eight in logits.chunks_exact(8) {
                let mut lanes = [0.0f32; 8];
                // SAFETY: the CPU has AVX2, F16C and FMA, checked above.
                unsafe {
                    use std::arch::x86_64::*;
                    let l = _mm256_loadu_ps(eight.as_ptr());
                    let e = x86::term8(l, _mm256_set1_ps(max), _mm256_set1_ps(scale));
                    _mm256_storeu_ps(lanes.as_mut_ptr(), e);
                }
                for (&l, &e) in eight.iter().zip(&lanes) {
                    let y = exp2_arg(l, max, scale);
                    assert_eq!(
                        e.to_bits(),
                        exp2_screen::<true>(y).to_bits(),
                        "{l} at {inverse}"
                    );
                }
            }
        }
    }

    /// Rows around the kernels' steps (16 logits, the 2048 of a chunk, the
    /// 256 of a certified block): spread, with `-inf`, with huge negatives
    /// (clamped terms), tied (whole numbers, zeros of both signs), a max
    /// that grows in every chunk (each read again), a first chunk all
    /// `-inf`, and the max in the tail.
    pub(crate) fn kernel_rows(seed: u64) -> Vec<Vec<f32>> {
        let lengths = [
            0, 1, 3, 4, 7, 8, 9, 15, 16, 17, 31, 33, 100, 255, 256, 257, 263, 2047, 2048, 2049,
            2065, 4111, 6000,
        ];
        let mut out = Vec::new();
        for (i, len) in lengths.into_iter().enumerate() {
            let case = seed as usize + i;
            let mut row = rows(seed * 97 + i as u64, len, 24.0, 3.0);
            for (k, v) in row.iter_mut().enumerate() {
                *v = match case % 6 {
                    0 => *v,
                    1 if k % 3 == 0 => f32::NEG_INFINITY,
                    2 if k % 4 == 1 => -1e30,
                    2 if k % 7 == 0 => -3e38,
                    3 if k % 5 == 0 => [0.0, -0.0][k % 2],
                    3 => v.round(),
                    4 => k as f32 * 0.01 - 20.0,
                    5 if k < 2048 && len > 2048 => f32::NEG_INFINITY,
                    _ => *v,
                };
            }
            if case.is_multiple_of(6) && len > 0 {
                row[len - 1] = 40.0; // the max in the tail
            }
            out.push(row);
        }
        // A max of zero, -0.0 met first in every lane.
        let mut zeros = vec![-0.0f32; 16];
        zeros.extend([0.0; 16]);
        zeros.extend(rows(seed, 300, 10.0, -6.0));
        out.push(zeros);
        out
    }

    /// `row` as float16 and as bfloat16 (each value rounded to nearest).
    pub(crate) fn narrowed(row: &[f32]) -> (Vec<half::f16>, Vec<half::bf16>) {
        (
            row.iter().map(|&v| half::f16::from_f32(v)).collect(),
            row.iter().map(|&v| half::bf16::from_f32(v)).collect(),
        )
    }

    /// Whether this CPU runs both builds of the FMA kernels: 16 registers
    /// (AVX2, FMA) and 32 (AVX-512VL).
    #[cfg(target_arch = "x86_64")]
    pub(crate) fn wide_cpu() -> bool {
        crate::simd::has_avx2()
            && std::is_x86_feature_detected!("fma")
            && crate::simd::has_avx512vl()
    }

    /// The screen compiled with 32 registers (AVX-512VL) against its
    /// 16-register build: the same `max`, `sum` and `bound`, bit for bit.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_wide_screen_is_the_fma_screen() {
        if !wide_cpu() {
            return;
        }
        fn bits(s: Option<Screened>) -> Option<[u64; 3]> {
            s.map(|s| [s.max.to_bits(), s.sum.to_bits(), s.bound.to_bits()])
        }
        fn check<L: Prob>(row: &[L], inverse: f64, what: &str) -> bool {
            // SAFETY: the CPU has AVX2, F16C, FMA and AVX-512F/VL, checked above.
            let (wide, fma) =
                unsafe { (screen_row_wide(row, inverse), screen_row_fma(row, inverse)) };
            assert_eq!(bits(wide), bits(fma), "{what}");
            fma.is_some()
        }
        let mut screened = 0;
        for seed in 0..3u64 {
            let mut cases = kernel_rows(seed);
            cases.extend(shaped_rows(seed).into_iter().map(|(row, _)| row));
            for row in cases {
                for inverse in [1e-3, 0.7, 1.25, 40.0] {
                    let what = format!("length {}, seed {seed}, 1/T {inverse}", row.len());
                    screened += usize::from(check(&row, inverse, &what));
                    let (halves, brains) = narrowed(&row);
                    check(&halves, inverse, &what);
                    check(&brains, inverse, &what);
                }
            }
        }
        assert!(screened > 200, "{screened} rows screened");
    }

    /// The NEON kernels against their portable twins, bit for bit.
    #[cfg(target_arch = "aarch64")]
    pub(crate) mod neon_twins {
        use super::super::*;
        use super::{kernel_rows, narrowed, rows, shaped_rows};

        /// Bit patterns of a screen's `(max, sum)`.
        fn bits(found: Option<(f64, f64)>) -> Option<(u64, u64)> {
            found.map(|(max, sum)| (max.to_bits(), sum.to_bits()))
        }

        fn check_kernels<L: Prob>(row: &[L], what: &str) {
            // SAFETY: NEON is part of the aarch64 baseline.
            let (ok, max) = unsafe { neon::max_of(row) };
            let (portable_ok, portable_max) = max_chunk_f32(row);
            assert_eq!(
                (ok, max.to_bits()),
                (portable_ok, portable_max.to_bits()),
                "max_of, {what}"
            );
            // The tiny temperatures (1e6, 1e30) clamp most terms.
            for inverse in [1e-30, 1e-3, 0.7, 1.25, 40.0, 1e6, 1e30] {
                // SAFETY: as above.
                let found = unsafe { neon::screen_row(row, inverse) };
                let portable = screen_chunked::<L, true>(row, inverse).map(|s| (s.max, s.sum));
                assert_eq!(bits(found), bits(portable), "screen at {inverse}, {what}");
            }
        }

        fn check_all_types(row: &[f32], what: &str) {
            check_kernels(row, what);
            let (halves, brains) = narrowed(row);
            check_kernels(&halves, what);
            check_kernels(&brains, what);
        }

        #[test]
        fn the_neon_screen_is_the_portable_screen() {
            let mut valid = 0;
            for seed in 0..3u64 {
                for row in kernel_rows(seed) {
                    let what = format!("length {}, seed {seed}", row.len());
                    check_all_types(&row, &what);
                    valid += usize::from(screen_chunked::<f32, true>(&row, 1.0).is_some());
                }
                for (row, _) in shaped_rows(seed) {
                    check_all_types(&row, "shaped");
                }
            }
            assert!(valid > 50, "{valid} rows screened");
        }

        #[test]
        fn the_neon_screen_declines_nan_and_inf() {
            // In a step and in the tail, of the first chunk and of a later one.
            for at in [0, 5, 16 * 20 + 3, 2040, 2047, 2048 + 100, 4095, 4100] {
                for bad in [f32::NAN, f32::INFINITY] {
                    let mut row = rows(at as u64, 4101, 8.0, 0.0);
                    row[at] = bad;
                    let what = format!("{bad} at {at}");
                    check_all_types(&row, &what);
                    // SAFETY: NEON is part of the aarch64 baseline.
                    unsafe {
                        assert!(!neon::max_of(&row).0, "{what}");
                        assert!(neon::screen_row(&row, 1.0).is_none(), "{what}");
                    }
                    assert!(screen_values(&row, 1.0).is_none(), "{what}");
                }
            }
            // A float16 NaN with payload bits, and bfloat16 +inf.
            let mut halves = vec![half::f16::from_f32(1.0); 40];
            halves[21] = half::f16::from_bits(0x7e01);
            assert!(screen_values(&halves, 1.0).is_none());
            let mut brains = vec![half::bf16::from_f32(1.0); 40];
            brains[3] = half::bf16::INFINITY;
            assert!(screen_values(&brains, 1.0).is_none());
        }

        #[test]
        fn the_neon_terms_are_the_scalar_terms() {
            use std::arch::aarch64::*;
            let logits = super::term_logits();
            for inverse in [1.25, 0.7, 1e-3, 40.0] {
                let (max, scale) = (-0.0f32, log2e_inverse(inverse));
                for four in logits.chunks_exact(4) {
                    let mut lanes = [0.0f32; 4];
                    // SAFETY: NEON is part of the aarch64 baseline; four
                    // readable and four writable f32.
                    unsafe {
                        let l = vld1q_f32(four.as_ptr());
                        let e = neon::term4(l, vdupq_n_f32(max), vdupq_n_f32(scale));
                        vst1q_f32(lanes.as_mut_ptr(), e);
                    }
                    for (&l, &e) in four.iter().zip(&lanes) {
                        let y = exp2_arg(l, max, scale);
                        assert_eq!(
                            e.to_bits(),
                            exp2_screen::<true>(y).to_bits(),
                            "{l} at {inverse}"
                        );
                    }
                }
            }
        }
    }

    /// Every f32 in [-125, 0]: `cargo test --release -- --ignored`.
    #[test]
    #[ignore = "a billion inputs: run in release"]
    fn exp2_screen_is_within_its_budget_everywhere() {
        let worst = worst_screen_error(1);
        println!("worst relative error of exp2_screen: {worst}");
        assert!(worst < 7.6e-5, "relative error {worst}");
    }

    /// The exact pass's `sum(w)` of a contiguous row.
    fn exact_sum<L: Prob>(values: &[L], inverse: f64) -> f64 {
        let (ok, max) = row_max(values);
        assert!(ok && max > f64::NEG_INFINITY);
        row_exp_sum(values, inverse, max, &mut vec![0.0; values.len()])
    }

    fn check_screen<L: Prob>(values: &[L], inverse: f64) -> f64 {
        let Some(screened) = screen_values(values, inverse) else {
            panic!("a valid f16/f32 row")
        };
        let exact = exact_sum(values, inverse);
        assert!(
            (screened.sum - exact).abs() <= screened.bound,
            "exact sum {exact} outside {} +- {}",
            screened.sum,
            screened.bound
        );
        assert_eq!(screened.max, row_max(values).1);
        screened.bound / screened.sum
    }

    /// A small xorshift generator: rows without a dependency.
    /// Logits at most the max 0 for the kernels' per-term tests: spread over
    /// the clamp, then signed zeros, -inf, huge and tiny, and ties at halves.
    pub(crate) fn term_logits() -> Vec<f32> {
        let mut logits = rows(9, 4000, 300.0, -150.0);
        logits.extend([
            0.0,
            -0.0,
            f32::NEG_INFINITY,
            -1e30,
            -1e-30,
            -0.5,
            -1.5,
            -2.5,
        ]);
        logits
    }

    pub(crate) fn rows(seed: u64, len: usize, scale: f32, offset: f32) -> Vec<f32> {
        let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..len)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let unit = (state >> 40) as f32 / (1u64 << 24) as f32;
                offset + scale * (unit - 0.5)
            })
            .collect()
    }

    /// Rows of several shapes, with their spreads: spreads of logits from
    /// tiny to huge, `-inf` entries, and the maximum last (a maximum that
    /// grows late: the rescaling).
    pub(crate) fn shaped_rows(seed: u64) -> Vec<(Vec<f32>, f32)> {
        [
            (1, 1.0, 0.0),
            (7, 3.0, 1.0),
            (300, 20.0, -5.0),
            (5000, 12.0, 100.0),
            (40_000, 2.0, 0.0),
            (40_000, 1e4, 3e4),
            (3000, 1e-6, 0.5),
        ]
        .into_iter()
        .map(|(len, scale, offset)| {
            let mut row = rows(seed, len, scale, offset);
            for i in (0..len).step_by(11) {
                row[i] = f32::NEG_INFINITY;
            }
            row[len - 1] = offset + scale;
            (row, scale)
        })
        .collect()
    }

    #[test]
    fn the_screened_sum_bounds_the_exact_sum() {
        let mut widest = 0.0f64;
        for seed in 0..6u64 {
            for (mut row, scale) in shaped_rows(seed) {
                let len = row.len();
                if seed == 5 && len > SCREEN_CHUNK {
                    // A first chunk all -inf (masked tokens).
                    row[..SCREEN_CHUNK].fill(f32::NEG_INFINITY);
                }
                for inverse in [1e-30, 1e-3, 0.7, 1.25, 40.0, 1e6, 1e30] {
                    let relative = check_screen(&row, inverse);
                    let halves: Vec<half::f16> =
                        row.iter().map(|&v| half::f16::from_f32(v)).collect();
                    if halves.iter().any(|h| h.to_f32() > f32::NEG_INFINITY) {
                        check_screen(&halves, inverse);
                    }
                    if (1e-3..=40.0).contains(&inverse) && scale <= 20.0 {
                        widest = widest.max(relative);
                    }
                }
            }
        }
        // Tight enough that the exact pass runs for about 1 u in 1000.
        assert!(widest < 5e-4, "relative bound {widest}");
    }

    #[test]
    fn the_bound_holds_where_every_error_has_the_same_sign() {
        // Random rows average the errors of exp2_screen out; a row whose
        // terms all sit at its worst input adds them up: the bound must
        // still hold. Logits `x <= 0` against a max of 0, at T = 1; the worst
        // input of each variant (aarch64 runs the FMA one, x86-64 either).
        let (low, high) = ((-0.0f32).to_bits(), (-2.0f32).to_bits());
        for fused in [false, true] {
            let error = |x: f32| {
                let exact = f64::from(x).exp();
                let y = exp2_arg(x, 0.0, log2e_inverse(1.0));
                let e = if fused {
                    exp2_screen::<true>(y)
                } else {
                    exp2_screen::<false>(y)
                };
                (f64::from(e) - exact).abs() / exact
            };
            let worst = (low..=high)
                .step_by(101)
                .map(f32::from_bits)
                .max_by(|&a, &b| error(a).total_cmp(&error(b)))
                .unwrap();
            assert!(error(worst) > SCREEN_EXP_ERROR / 2.0, "a coherent case");
            for len in [2, 100, 5000] {
                let mut row = vec![worst; len];
                row[0] = 0.0;
                check_screen(&row, 1.0);
            }
        }
    }

    #[test]
    fn the_screen_declines_what_the_exact_pass_must_report() {
        assert!(screen_values(&[1.0f32, f32::NAN], 1.0).is_none());
        assert!(screen_values(&[1.0f32, f32::INFINITY], 1.0).is_none());
        assert!(screen_values(&[f32::NEG_INFINITY; 3], 1.0).is_none());
        assert!(screen_values(&[1.0f64, 2.0], 1.0).is_none(), "f64 logits");
        // Past the first chunk (the one-read kernel finds them there
        // otherwise: NaN through the sum, +inf through the max).
        for (i, bad) in [(3000, f32::NAN), (3000, f32::INFINITY), (4999, f32::NAN)] {
            let mut row = rows(3, 5000, 4.0, 0.0);
            row[i] = bad;
            assert!(screen_values(&row, 1.0).is_none(), "{bad} at {i}");
        }
        let row = ArrayView1::from(&[1.0f32, 2.0][..]);
        assert!(probability(row, 0, 1e31).is_none(), "1 / T beyond f32");
        assert!(probability(row, 0, 1e-31).is_none());
        assert!(probability(row, 0, 1.0).is_some());
        assert!(
            probability(row.slice(s![..;-1]), 0, 1.0).is_none(),
            "not contiguous"
        );
    }

    #[test]
    fn the_prefix_bound_is_an_upper_bound_on_q() {
        for seed in 0..4u64 {
            for (len, scale) in [(SCREEN_CHUNK + 1, 4.0f32), (20_000, 12.0)] {
                let mut row = rows(seed, len, scale, 0.0);
                let x = len / 2;
                for lift in [-50.0f32, 0.0, 3.0] {
                    row[x] += lift;
                    for inverse in [0.7, 1.25] {
                        let (_, max) = row_max(&row[..]);
                        let w = |i: usize| exact_weight(row[i], max, inverse);
                        let q = w(x) / exact_sum(&row, inverse);
                        // w_x over the first chunk's part of the sum.
                        let q_prefix = w(x) / (0..SCREEN_CHUNK).map(w).sum::<f64>();
                        let view = ArrayView1::from(&row[..]);
                        let seen = std::cell::Cell::new(None);
                        let accepts = |bound| {
                            seen.set(Some(bound));
                            false
                        };
                        assert!(!draft_prefix_accepts(view, x, inverse, accepts));
                        if let Some(bound) = seen.get() {
                            assert!(q <= bound, "q = {q} above {bound}");
                            assert!(
                                bound <= q_prefix * 1.001,
                                "{bound} loose against {q_prefix}"
                            );
                        }
                    }
                    row[x] -= lift;
                }
            }
        }
        let short = rows(1, SCREEN_CHUNK, 1.0, 0.0);
        let asked = |_| panic!("a row of one chunk has no bound");
        assert!(!draft_prefix_accepts(
            ArrayView1::from(&short[..]),
            3,
            1.0,
            asked
        ));
    }

    /// Accepted from the first chunk only if the rest of the row is valid:
    /// a NaN or `+inf` anywhere after it (the vector body or the tail) says
    /// no, so that the exact pass names it (docs/spec.md section 8.5).
    #[test]
    fn the_prefix_accepts_only_a_row_valid_to_its_end() {
        let len = SCREEN_CHUNK + 100;
        let row = rows(2, len, 4.0, 0.0);
        let view = ArrayView1::from(&row[..]);
        assert!(draft_prefix_accepts(view, 7, 1.0, |_| true));
        for at in [SCREEN_CHUNK, SCREEN_CHUNK + 40, len - 1] {
            for bad in [f32::NAN, f32::INFINITY] {
                let mut row = row.clone();
                row[at] = bad;
                let view = ArrayView1::from(&row[..]);
                assert!(
                    !draft_prefix_accepts(view, 7, 1.0, |_| true),
                    "{bad} at {at}"
                );
            }
            let mut row = row.clone();
            row[at] = f32::NEG_INFINITY; // a masked token
            assert!(draft_prefix_accepts(
                ArrayView1::from(&row[..]),
                7,
                1.0,
                |_| true
            ));
        }
    }
}
