//! Verification from logits: the sampling transform (temperature, softmax,
//! top-k, top-p) applied only to the rows a batch row reads, with early exit.
//!
//! The transform of a logits row `l` with temperature `T > 0`:
//! `e_i = exp((l_i - max l) / T)` (softmax's `exp(z_i - max z)` of `z = l / T`,
//! without overflow for small `T`); top-k keeps the entries with `e_i` at
//! least the k-th largest (ties kept); top-p keeps, in decreasing order, the
//! shortest prefix whose mass reaches `top_p` of what top-k kept, plus every
//! entry tied with the last one kept. Both filters are thresholds on `e`, so the
//! result is `w_i = e_i` for `e_i >= theta`, else 0, normalised by `sum(w)`. The
//! thresholds come from selection (`select_nth_unstable`) on the candidates,
//! never a sort of the vocabulary; top-p sorts only a growing head of them.
//! `T = 0` makes the row greedy (the argmax of the logits, which every filter keeps).
//!
//! Where the work goes, per position up to the first rejection:
//! - unfiltered f16/f32 rows: first the *screen* (one read of each row, `f32`
//!   `exp`, a certified bound on `sum(w)`; see [`SCREEN_EXP_ERROR`]), which
//!   proves most accepted positions accepted without the exact pass;
//! - otherwise the exact pass: a max pass ([`row_max`]), then the float64
//!   `exp` and canonical sum ([`row_exp_sum`], [`exp_nonpositive`]), then the
//!   filters ([`transform`]);
//! - a rejection: the residual of the two exact rows, sampled; all accepted:
//!   the bonus row, exact, sampled.

use std::cell::RefCell;
use std::sync::LazyLock;

use ndarray::{s, ArrayView1, ArrayView3, ArrayViewMut1, Ix1, Ix2};

use crate::chain::{check_token, draft_len, expect_shape, ChainOutputs, Pos};
use crate::error::{show, CoreError};
use crate::rule::{check_uniform, is_accepted};
use crate::sample::SUM_BLOCK;
use crate::sample::{self, BufferWeights, RowAt};
use crate::simd::{Kernel, PairOp, Residual};
use crate::threads;
use crate::view::{FloatView, IntView, Prob};

/// The inputs of `verify_logits` (per-row parameters already broadcast to `[B]`).
pub struct LogitsInputs<'a, P, Q> {
    /// `[B, K]` drafted tokens.
    pub draft_token_ids: IntView<'a, Ix2>,
    /// `[B, K+1, V]` target logits.
    pub target_logits: ArrayView3<'a, P>,
    /// `[B, K, V]` draft logits, or `None` for deterministic drafts.
    pub draft_logits: Option<ArrayView3<'a, Q>>,
    /// `[B]` temperatures, `>= 0` (0: greedy).
    pub temperature: FloatView<'a, Ix1>,
    /// `[B]` top-k, `>= 0` (0: off).
    pub top_k: IntView<'a, Ix1>,
    /// `[B]` top-p in `(0, 1]` (1: off).
    pub top_p: FloatView<'a, Ix1>,
    pub num_draft_tokens: Option<IntView<'a, Ix1>>,
    pub uniforms: Option<FloatView<'a, Ix2>>,
    pub recovery_uniforms: Option<FloatView<'a, Ix1>>,
}

#[derive(Clone, Copy)]
struct Params {
    temperature: f64,
    top_k: usize,
    top_p: f64,
}

/// `a * b + c`: one fused operation where the caller runs with FMA enabled
/// (`FMA = true`), else a product and a sum (never a libm call).
#[inline(always)]
fn mul_add<const FMA: bool>(a: f64, b: f64, c: f64) -> f64 {
    if FMA {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

/// `2^(j / 256)` for `j` in `0..256`, the table of [`exp_nonpositive`].
static EXP2_TABLE: LazyLock<[f64; 256]> =
    LazyLock::new(|| std::array::from_fn(|j| (j as f64 / 256.0).exp2()));

/// `exp(x)` for `x <= 0` (`-inf` included), within an ulp of libm, written
/// without branches or calls so a row's loop runs in SIMD registers (Tang's
/// method): `x = (256 k + j) ln2 / 256 + r` with `|r| <= ln2 / 512`, so
/// `exp(x) = 2^k * 2^(j/256) * exp(r)`, `2^(j/256)` from [`EXP2_TABLE`], `2^k`
/// built from the bits of the rounding constant, and `exp(r) - 1` a degree-4
/// polynomial (its truncation error is below 4e-17). `FMA`: fused
/// multiply-adds (the same error bound).
#[inline(always)]
fn exp_nonpositive<const FMA: bool>(x: f64, table: &[f64; 256]) -> f64 {
    const N_LOG2E: f64 = 256.0 * std::f64::consts::LOG2_E;
    // ln 2 / 256 split in two (fdlibm's split of ln 2, divided exactly by
    // 256): n * LN2_HI is exact for |n| < 2^21, and n >= -708 * 370 here.
    const LN2_HI: f64 = f64::from_bits(0x3fe6_2e42_fee0_0000) / 256.0;
    const LN2_LO: f64 = f64::from_bits(0x3dea_39ef_3579_3c76) / 256.0;
    const ROUND: f64 = 6_755_399_441_055_744.0; // 1.5 * 2^52: adding it rounds to an integer
    let underflow = x < -708.0;
    let x = if underflow { -708.0 } else { x };
    let shifted = mul_add::<FMA>(x, N_LOG2E, ROUND);
    let n = shifted - ROUND;
    let r = mul_add::<FMA>(-n, LN2_LO, mul_add::<FMA>(-n, LN2_HI, x));
    // exp(r) - 1 = r + r^2 (1/2 + r/6 + r^2/24), in two independent halves.
    let r2 = r * r;
    let low = mul_add::<FMA>(r, 1.0 / 6.0, 0.5);
    let high = mul_add::<FMA>(r2, 1.0 / 24.0, low);
    let expm1 = mul_add::<FMA>(r2, high, r);
    // The bits of `shifted` end in n = 256 k + j (two's complement): the low
    // 8 bits are j; shifted right by 8 they end in k, and (k + 1023) << 52 is
    // 2^k (k >= -1022 here; the higher bits are shifted out).
    let bits = shifted.to_bits();
    let t = table[(bits & 255) as usize];
    let scale = f64::from_bits(((bits >> 8).wrapping_add(1023)) << 52);
    let e = mul_add::<FMA>(t, expm1, t) * scale;
    if underflow {
        0.0
    } else {
        e
    }
}

/// Lanes of the row loops: four `f64x4` registers of independent work, so
/// the long dependency chain of one `exp` overlaps three others.
const LANES: usize = 16;

/// Pass 1 over a row: whether every logit is finite or `-inf`, and the
/// largest logit.
#[inline(always)]
fn max_row<L: Prob>(values: &[L]) -> (bool, f64) {
    let mut max = [f64::NEG_INFINITY; LANES];
    let mut ok = [1u64; LANES];
    let (chunks, tail) = values.as_chunks::<LANES>();
    for chunk in chunks {
        for j in 0..LANES {
            let v = chunk[j].to_f64();
            ok[j] &= u64::from(v < f64::INFINITY); // 0 for NaN and +inf
            max[j] = if v > max[j] { v } else { max[j] };
        }
    }
    for (j, l) in tail.iter().enumerate() {
        let v = l.to_f64();
        ok[j] &= u64::from(v < f64::INFINITY);
        max[j] = if v > max[j] { v } else { max[j] };
    }
    let top = max.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v));
    (ok.iter().all(|&o| o == 1), top)
}

/// Pass 2: `w_i = exp((l_i - max) * (1 / T))` (`z_i - max z` of the module
/// docs, without overflow for small `T`; the product with `1 / T` is within an
/// ulp of the quotient, where a division per element would cost as much as the
/// `exp`), summed in the canonical order block by block while the block is
/// still in L1 (the same bits as summing `w` after).
#[inline(always)]
fn exp_row_sum<K: Kernel, L: Prob, const FMA: bool>(
    values: &[L],
    inverse: f64,
    max: f64,
    w: &mut [f64],
) -> f64 {
    let table: &[f64; 256] = &EXP2_TABLE;
    let exp = |l: L| exp_nonpositive::<FMA>((l.to_f64() - max) * inverse, table);
    let mut total = 0.0;
    for (src, dst) in values.chunks(SUM_BLOCK).zip(w.chunks_mut(SUM_BLOCK)) {
        let (src_lanes, src_tail) = src.as_chunks::<LANES>();
        let (dst_lanes, dst_tail) = dst.as_chunks_mut::<LANES>();
        for (s, d) in src_lanes.iter().zip(dst_lanes) {
            for j in 0..LANES {
                d[j] = exp(s[j]);
            }
        }
        for (d, &l) in dst_tail.iter_mut().zip(src_tail) {
            *d = exp(l);
        }
        total += K::dense(dst).0;
    }
    total
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
fn max_row_avx2<L: Prob>(values: &[L]) -> (bool, f64) {
    max_row(values)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
fn exp_row_sum_avx2<L: Prob>(values: &[L], inverse: f64, max: f64, w: &mut [f64]) -> f64 {
    exp_row_sum::<crate::simd::Avx2, L, false>(values, inverse, max, w)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c,fma")]
fn exp_row_sum_fma<L: Prob>(values: &[L], inverse: f64, max: f64, w: &mut [f64]) -> f64 {
    exp_row_sum::<crate::simd::Avx2, L, true>(values, inverse, max, w)
}

/// The two passes of the softmax, AVX2 when the CPU has it: `(valid, max)`.
fn row_max(values: &[impl Prob]) -> (bool, f64) {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::has_avx2() {
        // SAFETY: the CPU supports AVX2 and F16C, checked just above.
        return unsafe { max_row_avx2(values) };
    }
    max_row(values)
}

/// `w_i = exp((l_i - max) / T)`; returns `sum(w)`.
fn row_exp_sum(values: &[impl Prob], inverse: f64, max: f64, w: &mut [f64]) -> f64 {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::has_avx2() {
        if std::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU supports AVX2, F16C and FMA, checked here.
            return unsafe { exp_row_sum_fma(values, inverse, max, w) };
        }
        // SAFETY: as above.
        return unsafe { exp_row_sum_avx2(values, inverse, max, w) };
    }
    exp_row_sum::<crate::simd::Portable, _, false>(values, inverse, max, w)
}

/// The screen: a cheap pass that often proves a draft accepted without the
/// float64 transform of its rows. An accepted position needs only
/// `p(x) = w_x / sum(w)` and `q(x)`, not `w`; the screen bounds `sum(w)` (the
/// exact pass's value, bits and all) by an `f32` estimate with a certified
/// error, and `w_x` is computed exactly. Where the bounds decide the rule, the
/// decision is the exact pass's; anywhere else (`u` within about `1e-3` of
/// `p/q`, a rejection, f64 logits, filters on) the exact pass runs. So the
/// output is unchanged, bit for bit; only the work is.
///
/// Error budget of one term `e = exp_screen(x')`, `x' = fl32(fl32(l - max) *
/// fl32(1 / T))`, against the exact `exp(x)`, `x = (l - max) / T`:
/// - three roundings to f32 give `|x' - x| <= 3u |x'| (1 + 3u)`, `u = 2^-24`,
///   so a factor `exp(|x' - x|)`: [`SCREEN_ARG_ERROR`] per unit of `|x'|`;
/// - [`exp_screen`] itself: [`SCREEN_EXP_ERROR`] (analysis at the function,
///   measured by a unit test over every f32 in `[-87, 0]`);
/// - the f32 lane sums, 128 terms per lane per chunk: [`SCREEN_SUM_ERROR`]
///   (`128u` is `7.6e-6`);
/// - terms below `exp(-87)` are taken as `exp(-87)`: `1e-37` each at most;
/// - the exact pass's own error (float64 `exp`, product and sum, and the
///   rescaling below): under `1e-9` of the sum.
const SCREEN_EXP_ERROR: f64 = 2e-4;
const SCREEN_ARG_ERROR: f64 = 4e-7;
const SCREEN_SUM_ERROR: f64 = 1e-5;

/// `a * b + c` in `f32`: fused where the caller runs with FMA (`FMA = true`).
#[inline(always)]
fn mul_add32<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

/// `exp(x)` in `f32` for `-87 <= x <= 0`, within `1e-4` relative.
/// `x = n ln2 + r`, `|r| <= ln2 / 2 + 6e-6` (the product `n * LN_2` in f32,
/// `|n| <= 126`), and a degree-4 Taylor polynomial: truncation
/// `e^|r| |r|^5 / 120 / e^-|r| <= 8.6e-5`, reduction `6e-6`, roundings
/// `5u`: `9.2e-5` in all, half of [`SCREEN_EXP_ERROR`]. `FMA` only removes
/// roundings.
#[inline(always)]
fn exp_screen<const FMA: bool>(x: f32) -> f32 {
    const ROUND: f32 = 12_582_912.0; // 1.5 * 2^23: adding it rounds to an integer
    let shifted = mul_add32::<FMA>(x, std::f32::consts::LOG2_E, ROUND);
    let n = shifted - ROUND;
    let r = mul_add32::<FMA>(-n, std::f32::consts::LN_2, x);
    // 1 + r + r^2 (1/2 + r/6 + r^2/24), Estrin's scheme.
    let r2 = r * r;
    let low = mul_add32::<FMA>(r, 1.0 / 6.0, 0.5);
    let high = mul_add32::<FMA>(r2, 1.0 / 24.0, low);
    let p = mul_add32::<FMA>(r2, high, 1.0 + r);
    // The low bits of `shifted` hold n >= -126; (n + 127) << 23 is 2^n.
    p * f32::from_bits(shifted.to_bits().wrapping_add(127) << 23)
}

/// Lanes of the screen's loops: two `f32x8` registers of sums and two of
/// moments (more spill registers).
const SCREEN_LANES: usize = 16;

/// Logits per step of the screen's online max: a max pass and an `exp` pass
/// over a chunk in L1, then its lane sums go to `f64` (128 terms per lane).
const SCREEN_CHUNK: usize = 2048;

/// Validity and max of a chunk of f16/f32 logits, in `f32` (exact).
#[inline(always)]
fn max_chunk_f32<L: Prob>(chunk: &[L]) -> (bool, f32) {
    let mut max = [f32::NEG_INFINITY; SCREEN_LANES];
    // 0 while every value is below +inf (NaN and +inf make it 1).
    let mut bad = [0.0f32; SCREEN_LANES];
    let (groups, tail) = chunk.as_chunks::<SCREEN_LANES>();
    for group in groups {
        for j in 0..SCREEN_LANES {
            let v = group[j].to_f32();
            bad[j] = if v < f32::INFINITY { bad[j] } else { 1.0 };
            max[j] = if v > max[j] { v } else { max[j] };
        }
    }
    for (j, l) in tail.iter().enumerate() {
        let v = l.to_f32();
        bad[j] = if v < f32::INFINITY { bad[j] } else { 1.0 };
        max[j] = if v > max[j] { v } else { max[j] };
    }
    let top = max.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    (bad.iter().all(|&b| b == 0.0), top)
}

/// `(sum e, sum e |x'|)` of one chunk, `e = exp_screen(x')`, `x'` clamped to
/// `[-87, 0]` (see [`exp_screen`]).
#[inline(always)]
fn screen_chunk<L: Prob, const FMA: bool>(chunk: &[L], max: f32, inverse: f32) -> (f64, f64) {
    let (mut sum, mut moment) = ([0.0f32; SCREEN_LANES], [0.0f32; SCREEN_LANES]);
    let mut add = |j: usize, l: L| {
        let x = (l.to_f32() - max) * inverse;
        let x = if x < -87.0 { -87.0 } else { x };
        let e = exp_screen::<FMA>(x);
        sum[j] += e;
        moment[j] = mul_add32::<FMA>(-e, x, moment[j]);
    };
    let (groups, tail) = chunk.as_chunks::<SCREEN_LANES>();
    for group in groups {
        for (j, &l) in group.iter().enumerate() {
            add(j, l);
        }
    }
    for (j, &l) in tail.iter().enumerate() {
        add(j, l);
    }
    let total = |lanes: [f32; SCREEN_LANES]| lanes.iter().map(|&v| f64::from(v)).sum::<f64>();
    (total(sum), total(moment))
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
    let (mut max, mut sum, mut moment) = (f64::NEG_INFINITY, 0.0f64, 0.0f64);
    for chunk in values.chunks(SCREEN_CHUNK) {
        let (ok, chunk_max) = max_chunk_f32(chunk);
        if !ok {
            return None;
        }
        let chunk_max = f64::from(chunk_max);
        if chunk_max > max {
            // Earlier terms were relative to the old max: rescale them (their
            // error bounds scale with them).
            let factor = ((max - chunk_max) * inverse).exp();
            (sum, moment) = (sum * factor, moment * factor);
            max = chunk_max;
        }
        if max > f64::NEG_INFINITY {
            // `max` is a logit, so an exact f32.
            let (s, m) = screen_chunk::<L, FMA>(chunk, max as f32, inverse as f32);
            sum += s;
            moment += m;
        }
    }
    if max == f64::NEG_INFINITY {
        return None;
    }
    let bound = 1.01 * ((SCREEN_EXP_ERROR + SCREEN_SUM_ERROR) * sum + SCREEN_ARG_ERROR * moment)
        + 1e-9 * sum
        + 1e-37 * values.len() as f64;
    Some(Screened { max, sum, bound })
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

/// The screen of a contiguous f16/f32 row, `None` where it does not apply.
fn screen(row: ArrayView1<'_, impl Prob>, inverse: f64) -> Option<Screened> {
    // 1 / T must be a normal f32, far from overflow, for the error budget.
    if !(1e-30..=1e30).contains(&inverse) {
        return None;
    }
    screen_values(row.as_slice()?, inverse)
}

fn screen_values<L: Prob>(values: &[L], inverse: f64) -> Option<Screened> {
    if !L::EXACT_IN_F32 {
        return None;
    }
    #[cfg(target_arch = "x86_64")]
    if crate::simd::has_avx2() {
        if std::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU supports AVX2, F16C and FMA, checked here.
            return unsafe { screen_row_fma(values, inverse) };
        }
        // SAFETY: the CPU supports AVX2 and F16C, checked just above.
        return unsafe { screen_row_avx2(values, inverse) };
    }
    screen_row::<L, false>(values, inverse)
}

/// `w_x = exp((l_x - max) / T)` with the bits the exact pass gives it (the
/// same `exp` variant as [`row_exp_sum`] picks).
fn exact_weight(l: impl Prob, max: f64, inverse: f64) -> f64 {
    let x = (l.to_f64() - max) * inverse;
    if uses_fma() {
        exp_nonpositive::<true>(x, &EXP2_TABLE)
    } else {
        exp_nonpositive::<false>(x, &EXP2_TABLE)
    }
}

/// Whether [`row_exp_sum`] runs its FMA variant.
fn uses_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::has_avx2() {
        return std::is_x86_feature_detected!("fma");
    }
    false
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

/// What the screen found at one position: whether it proves the draft
/// accepted, and the maxima of the rows it read (for the exact pass).
#[derive(Default)]
struct Screening {
    accepted: bool,
    target_max: Option<f64>,
    draft_max: Option<f64>,
}

/// Whether the screen proves position `t` accepted: [`is_accepted`] on the
/// exact pass's `p` and `q` would return true. `accepted == false` means
/// "run the exact pass", never "rejected".
fn screened_accept<P: Prob, Q: Prob>(
    target: ArrayView1<'_, P>,
    draft: Option<ArrayView1<'_, Q>>,
    x: usize,
    inverse: f64,
    u: f64,
) -> Screening {
    let mut found = Screening::default();
    let Some(screened_p) = screen(target, inverse) else {
        return found;
    };
    found.target_max = Some(screened_p.max);
    let w_p = exact_weight(target[x], screened_p.max, inverse);
    let Some((p_low, _)) = probability_bounds(w_p, screened_p) else {
        return found;
    };
    // is_accepted rejects p == 0; a p this small may round to 0 in the exact pass.
    if p_low <= 1e-300 {
        return found;
    }
    let q_high = match draft {
        None => 1.0,
        Some(draft) => {
            let Some(screened_q) = screen(draft, inverse) else {
                return found;
            };
            found.draft_max = Some(screened_q.max);
            let w_q = exact_weight(draft[x], screened_q.max, inverse);
            if w_q == 0.0 {
                0.0 // q = 0 <= p exactly
            } else {
                match probability_bounds(w_q, screened_q) {
                    Some((_, q_high)) => q_high,
                    None => return found,
                }
            }
        }
    };
    // is_accepted: q <= p accepts; else u < p / q.
    found.accepted = q_high <= p_low || u < p_low / q_high * (1.0 - 1e-15);
    found
}

/// The exact pass alone over a row of logits (max, then float64 `exp` and
/// canonical sum into `w`): `sum(w)`, or `None` for a row with NaN, `+inf` or
/// no finite logit. For benchmarks of the `exp` throughput
/// (`cargo bench --bench core`) and tests.
pub fn exact_pass<L: Prob>(values: &[L], temperature: f64, w: &mut [f64]) -> Option<f64> {
    let (ok, max) = row_max(values);
    (ok && max > f64::NEG_INFINITY && w.len() == values.len())
        .then(|| row_exp_sum(values, 1.0 / temperature, max, w))
}

/// The screen alone over a row of f16/f32 logits: `(sum, bound)` with the
/// exact pass's `sum(w)` in `sum +- bound`, or `None` where the screen does
/// not apply. For benchmarks and tests, as [`exact_pass`].
pub fn screen_pass<L: Prob>(values: &[L], temperature: f64) -> Option<(f64, f64)> {
    let inverse = 1.0 / temperature;
    if !(1e-30..=1e30).contains(&inverse) {
        return None;
    }
    screen_values(values, inverse).map(|s| (s.sum, s.bound))
}

/// Scratch space of one thread: block sums and the selection buffer.
#[derive(Default)]
struct Scratch {
    block_sums: Vec<f64>,
    /// Top-k's candidates in index order (the weights at least its floor).
    candidates: Vec<f64>,
    /// Values being selected or sorted.
    selection: Vec<f64>,
    /// Mass per bucket of weights (see [`top_p_floor`]).
    histogram: Vec<f64>,
}

/// The row buffers of one thread: the transformed target and draft rows, the
/// residual and the scratch space, `O(V)` each.
#[derive(Default)]
struct Buffers {
    wp: Vec<f64>,
    wq: Vec<f64>,
    residual: Vec<f64>,
    scratch: Scratch,
}

thread_local! {
    /// Kept between calls (on the caller's thread and each worker): buffers of
    /// a megabyte or more are fresh pages from the OS when allocated per call,
    /// and faulting them in cost more than a small batch's `exp`s. About
    /// `4 V` float64 values stay allocated per thread.
    static BUFFERS: RefCell<Buffers> = RefCell::default();
}

/// The `k`-th largest of the maxima of `w`'s blocks of [`SUM_BLOCK`], or 0
/// where there are fewer than `k` blocks. `buffer` is scratch space.
fn kth_largest_block_max(w: &[f64], k: usize, buffer: &mut Vec<f64>) -> f64 {
    let blocks = w.len().div_ceil(SUM_BLOCK);
    if k > blocks {
        return 0.0;
    }
    buffer.clear();
    buffer.extend(w.chunks(SUM_BLOCK).map(block_max));
    let (_, kth, _) = buffer.select_nth_unstable_by(k - 1, |a, b| b.total_cmp(a));
    *kth
}

/// The max of non-negative weights (0 for none), in lanes so it vectorises.
fn block_max(block: &[f64]) -> f64 {
    let mut max = [0.0f64; LANES];
    let (groups, tail) = block.as_chunks::<LANES>();
    for group in groups {
        for (m, &e) in max.iter_mut().zip(group) {
            *m = if e > *m { e } else { *m };
        }
    }
    for (m, &e) in max.iter_mut().zip(tail) {
        *m = if e > *m { e } else { *m };
    }
    max.iter().fold(0.0, |a, &b| a.max(b))
}

/// Weights in `(0, 1]` by the top bits of their pattern (exponent and three
/// mantissa bits): buckets of values within a factor `2^(1/8)`, in order.
const HISTOGRAM_SHIFT: u32 = 49;

/// A lower bound of top-p's threshold for `target` mass, from one pass: the
/// lower edge of the bucket where the mass of the buckets above, in
/// decreasing order, first exceeds `target` (with a `1e-6` margin over
/// rounding). The top-p prefix reaches `target` before any weight below that
/// edge, so its last weight is at least the edge. 0 where no bucket does.
fn top_p_floor(w: &[f64], target: f64, histogram: &mut Vec<f64>) -> f64 {
    let top = (1.0f64.to_bits() >> HISTOGRAM_SHIFT) as usize;
    histogram.clear();
    histogram.resize(top + 1, 0.0);
    for &e in w {
        // Weights are at most 1 (the max is exp(0)); 0 lands in bucket 0.
        let bucket = ((e.to_bits() >> HISTOGRAM_SHIFT) as usize).min(top);
        histogram[bucket] += e;
    }
    let mut mass = 0.0;
    for bucket in (1..=top).rev() {
        mass += histogram[bucket];
        if mass > target * (1.0 + 1e-6) {
            return f64::from_bits((bucket as u64) << HISTOGRAM_SHIFT);
        }
    }
    0.0
}

/// One logits row `arg[b, t, :]` and, where the screen has read it, its
/// max (the screen also found it valid).
struct LogitsRow<'a, L> {
    logits: ArrayView1<'a, L>,
    arg: &'static str,
    b: usize,
    t: usize,
    max: Option<f64>,
}

/// Transforms logits row `row` into weights `w` (`e_i` kept, else 0) and
/// returns `sum(w)`. Errors name `arg[b, t, i]`.
fn transform<L: Prob>(
    row: LogitsRow<'_, L>,
    params: Params,
    w: &mut Vec<f64>,
    scratch: &mut Scratch,
) -> Result<f64, CoreError> {
    let LogitsRow {
        logits: row,
        arg,
        b,
        t,
        max,
    } = row;
    // Every entry is written below (pass 2), so only the length matters.
    w.resize(row.len(), 0.0);
    let inverse = 1.0 / params.temperature;
    let strided: Vec<L>;
    let values: &[L] = match row.as_slice() {
        Some(values) => values,
        None => {
            strided = row.iter().copied().collect();
            &strided
        }
    };
    let (ok, max) = match max {
        Some(max) => (true, max), // the screen's: the row is valid
        None => row_max(values),
    };
    if !ok {
        let (i, v) = values
            .iter()
            .map(|l| l.to_f64())
            .enumerate()
            .find(|(_, v)| v.is_nan() || *v == f64::INFINITY)
            .unwrap_or((0, f64::NAN));
        return Err(CoreError::value(
            arg,
            &[b, t, i],
            format!("= {}: logits must be finite or -inf", show(v)),
        ));
    }
    if max == f64::NEG_INFINITY {
        return Err(CoreError::value(
            arg,
            &[b, t],
            "has no finite logit: there is no token to choose",
        ));
    }
    let total = row_exp_sum(values, inverse, max, w);
    if params.top_k == 0 && params.top_p >= 1.0 {
        return Ok(total);
    }
    // Top-k: the k-th largest weight is the first threshold.
    let mut threshold = 0.0f64;
    if params.top_k > 0 {
        // The k-th largest of the block maxima is a lower bound of the k-th
        // largest weight (k blocks each hold a weight at least that large), so
        // selecting among the weights above it finds the same value from a
        // few candidates instead of V.
        let floor = kth_largest_block_max(w, params.top_k, &mut scratch.selection);
        scratch.candidates.clear();
        scratch
            .candidates
            .extend(w.iter().copied().filter(|&e| e > 0.0 && e >= floor));
        // A positive floor leaves at least k candidates; without one, fewer
        // than k positive weights keep them all.
        if floor > 0.0 || params.top_k < scratch.candidates.len() {
            scratch.selection.clear();
            scratch.selection.extend_from_slice(&scratch.candidates);
            let (_, kth, _) = scratch
                .selection
                .select_nth_unstable_by(params.top_k - 1, |a, b| b.total_cmp(a));
            threshold = *kth;
        }
    }
    // Top-p over what top-k kept: a growing sorted head until the mass is reached.
    if params.top_p < 1.0 {
        // What top-k kept, in index order, and its mass: from top-k's
        // candidates (every weight at least the threshold is one), or without
        // top-k every positive weight, of mass `total`; of those, only the
        // weights above a floor from a histogram can be in the top-p set.
        scratch.selection.clear();
        let kept_total = if params.top_k > 0 {
            let kept = |&e: &f64| e >= threshold;
            let candidates = scratch.candidates.iter().copied();
            scratch.selection.extend(candidates.filter(kept));
            sample::canonical_sum(
                &BufferWeights {
                    w: &scratch.selection,
                },
                &mut scratch.block_sums,
            )?
        } else {
            let floor = top_p_floor(w, params.top_p * total, &mut scratch.histogram);
            let kept = |&e: &f64| e > 0.0 && e >= floor;
            scratch.selection.extend(w.iter().copied().filter(kept));
            total
        };
        let target = params.top_p * kept_total;
        let count = scratch.selection.len();
        let mut head = count.min(64);
        loop {
            if head < count {
                scratch
                    .selection
                    .select_nth_unstable_by(head - 1, |a, b| b.total_cmp(a));
            }
            scratch.selection[..head].sort_unstable_by(|a, b| b.total_cmp(a));
            let mut cumulative = 0.0;
            let reached = scratch.selection[..head].iter().position(|&e| {
                cumulative += e;
                cumulative >= target
            });
            match reached {
                Some(j) => {
                    threshold = threshold.max(scratch.selection[j]);
                    break;
                }
                None if head == count => break, // rounding: keep everything top-k kept
                None => head = (head * 4).min(count),
            }
        }
    }
    if threshold > 0.0 {
        for e in w.iter_mut() {
            *e = if *e < threshold { 0.0 } else { *e }; // branchless: it vectorises
        }
    }
    sample::canonical_sum(&BufferWeights { w }, &mut scratch.block_sums)
}

fn params(
    inputs_t: &FloatView<'_, Ix1>,
    k: &IntView<'_, Ix1>,
    p: &FloatView<'_, Ix1>,
    b: usize,
) -> Result<Params, CoreError> {
    let temperature = inputs_t.get(b);
    // A subnormal temperature is refused: its inverse overflows.
    if !(temperature == 0.0 || (temperature.is_normal() && temperature > 0.0)) {
        return Err(CoreError::value(
            "temperature",
            &[b],
            format!(
                "= {}: a temperature must be 0 or at least {:e} (the smallest normal float64)",
                show(temperature),
                f64::MIN_POSITIVE
            ),
        ));
    }
    let top_k = k.get(b);
    if top_k < 0 {
        return Err(CoreError::value(
            "top_k",
            &[b],
            format!("= {top_k}: top_k must be >= 0"),
        ));
    }
    let top_p = p.get(b);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(CoreError::value(
            "top_p",
            &[b],
            format!("= {}: top_p must lie in (0, 1]", show(top_p)),
        ));
    }
    Ok(Params {
        temperature,
        top_k: usize::try_from(top_k).unwrap_or(usize::MAX),
        top_p,
    })
}

fn argmax_logits<L: Prob>(
    row: ArrayView1<'_, L>,
    arg: &'static str,
    b: usize,
    t: usize,
) -> Result<usize, CoreError> {
    let mut best: Option<(usize, f64)> = None;
    for (i, l) in row.iter().enumerate() {
        let v = l.to_f64();
        if v.is_nan() || v == f64::INFINITY {
            return Err(CoreError::value(
                arg,
                &[b, t, i],
                format!("= {}: logits must be finite or -inf", show(v)),
            ));
        }
        if v > f64::NEG_INFINITY && best.is_none_or(|(_, m)| v > m) {
            best = Some((i, v));
        }
    }
    best.map(|(i, _)| i).ok_or_else(|| {
        CoreError::value(
            arg,
            &[b, t],
            "has no finite logit: there is no token to choose",
        )
    })
}

/// Verification from logits (see the module docs); the same rule and outputs as
/// [`crate::chain::verify`] on the transformed probabilities.
pub fn verify_logits<P: Prob, Q: Prob>(
    inputs: &LogitsInputs<'_, P, Q>,
    out: &mut ChainOutputs<'_>,
) -> Result<(), CoreError> {
    let &[batch, k_max] = inputs.draft_token_ids.shape() else {
        unreachable!("IntView<Ix2> has two axes")
    };
    let vocab = inputs.target_logits.shape()[2];
    expect_shape(
        "target_logits",
        inputs.target_logits.shape(),
        &[batch, k_max + 1, vocab],
        "[B, K+1, V]",
    )?;
    if let Some(q) = &inputs.draft_logits {
        expect_shape(
            "draft_logits",
            q.shape(),
            &[batch, k_max, vocab],
            "[B, K, V]",
        )?;
    }
    for (arg, shape) in [
        ("temperature", inputs.temperature.shape()),
        ("top_k", inputs.top_k.shape()),
        ("top_p", inputs.top_p.shape()),
    ] {
        expect_shape(arg, shape, &[batch], "a scalar or [B]")?;
    }
    if let Some(c) = &inputs.num_draft_tokens {
        expect_shape("num_draft_tokens", c.shape(), &[batch], "[B]")?;
    }
    if let Some(u) = &inputs.uniforms {
        expect_shape("uniforms", u.shape(), &[batch, k_max], "[B, K]")?;
    }
    if let Some(u) = &inputs.recovery_uniforms {
        expect_shape("recovery_uniforms", u.shape(), &[batch], "[B]")?;
    }
    if out.output_token_ids.shape() != [batch, k_max + 1] {
        return Err(CoreError::shape(
            "out",
            "output shapes do not match [B, K+1]",
        ));
    }
    // Each row transforms at least one target row (and a draft row) of V.
    let rows_read = if inputs.draft_logits.is_some() { 2 } else { 1 };
    let out = ChainOutputs {
        output_token_ids: out.output_token_ids.view_mut(),
        num_accepted: out.num_accepted.view_mut(),
        num_emitted: out.num_emitted.view_mut(),
    };
    threads::in_runs(
        batch.saturating_mul(rows_read * vocab),
        out,
        |first_row, mut part| verify_rows(inputs, first_row, &mut part),
    )
}

/// Verifies rows `first_row..` into `out` (which holds exactly those rows).
fn verify_rows<P: Prob, Q: Prob>(
    inputs: &LogitsInputs<'_, P, Q>,
    first_row: usize,
    out: &mut ChainOutputs<'_>,
) -> Result<(), CoreError> {
    BUFFERS.with(|buffers| match buffers.try_borrow_mut() {
        Ok(mut buffers) => verify_rows_with(inputs, first_row, out, &mut buffers),
        // Not reached (nothing here re-enters), but never a panic.
        Err(_) => verify_rows_with(inputs, first_row, out, &mut Buffers::default()),
    })
}

fn verify_rows_with<P: Prob, Q: Prob>(
    inputs: &LogitsInputs<'_, P, Q>,
    first_row: usize,
    out: &mut ChainOutputs<'_>,
    buffers: &mut Buffers,
) -> Result<(), CoreError> {
    let k_max = inputs.draft_token_ids.shape()[1];
    let vocab = inputs.target_logits.shape()[2];
    let Buffers {
        wp,
        wq,
        residual,
        scratch,
    } = buffers;
    for i in 0..out.num_accepted.len() {
        let b = first_row + i;
        let params = params(&inputs.temperature, &inputs.top_k, &inputs.top_p, b)?;
        let k = draft_len(inputs.num_draft_tokens.as_ref(), b, k_max)?;
        let ids: Vec<usize> = (0..k)
            .map(|t| {
                check_token(
                    "draft_token_ids",
                    &[b, t],
                    inputs.draft_token_ids.get(b, t),
                    vocab,
                )
            })
            .collect::<Result<_, _>>()?;
        let target_row = |t: usize| inputs.target_logits.slice(s![b, t, ..]);
        let (n, next) = if params.temperature == 0.0 {
            let mut n = k;
            let mut next = None;
            for (t, &x) in ids.iter().enumerate() {
                let best = argmax_logits(target_row(t), "target_logits", b, t)?;
                if best != x {
                    n = t;
                    next = Some(best);
                    break;
                }
            }
            let next = match next {
                Some(best) => best,
                None => argmax_logits(target_row(k), "target_logits", b, k)?,
            };
            (n, next)
        } else {
            let (Some(uniforms), Some(recovery)) = (&inputs.uniforms, &inputs.recovery_uniforms)
            else {
                return Err(CoreError::shape(
                    "uniforms",
                    "uniforms and recovery_uniforms are required for rows verified by sampling",
                ));
            };
            for t in 0..k {
                check_uniform(uniforms.get(b, t), "uniforms", &[b, t])?;
            }
            let recovery_u = check_uniform(recovery.get(b), "recovery_uniforms", &[b])?;
            let mut outcome = None;
            let screenable = params.top_k == 0 && params.top_p >= 1.0;
            let inverse = 1.0 / params.temperature;
            for (t, &x) in ids.iter().enumerate() {
                let draft_row = inputs.draft_logits.as_ref().map(|d| d.slice(s![b, t, ..]));
                let screening = if screenable {
                    screened_accept(target_row(t), draft_row, x, inverse, uniforms.get(b, t))
                } else {
                    Screening::default()
                };
                if screening.accepted {
                    continue;
                }
                let total_p = transform(
                    LogitsRow {
                        logits: target_row(t),
                        arg: "target_logits",
                        b,
                        t,
                        max: screening.target_max,
                    },
                    params,
                    wp,
                    scratch,
                )?;
                let p = wp[x] / total_p;
                let (q, total_q) = match draft_row {
                    Some(draft_row) => {
                        let total = transform(
                            LogitsRow {
                                logits: draft_row,
                                arg: "draft_logits",
                                b,
                                t,
                                max: screening.draft_max,
                            },
                            params,
                            wq,
                            scratch,
                        )?;
                        (wq[x] / total, Some(total))
                    }
                    None => (1.0, None),
                };
                if is_accepted(p, q, uniforms.get(b, t)) {
                    continue;
                }
                // The residual max(0, p - q) of the transformed rows.
                residual.clear();
                match total_q {
                    Some(total_q) => residual.extend(
                        wp.iter()
                            .zip(wq.iter())
                            .map(|(&a, &c)| Residual::apply(a / total_p, c / total_q)),
                    ),
                    None => residual.extend(wp.iter().enumerate().map(|(i, &a)| {
                        if i == x {
                            0.0
                        } else {
                            a / total_p
                        }
                    })),
                }
                let token = match sample::sample(
                    &BufferWeights { w: residual },
                    recovery_u,
                    &mut scratch.block_sums,
                )? {
                    Some(token) => token,
                    // Only rounding gets here: sample from p itself.
                    None => sample_weights(wp, recovery_u, scratch, b, t)?,
                };
                outcome = Some((t, token));
                break;
            }
            match outcome {
                Some(found) => found,
                None => {
                    transform(
                        LogitsRow {
                            logits: target_row(k),
                            arg: "target_logits",
                            b,
                            t: k,
                            max: None,
                        },
                        params,
                        wp,
                        scratch,
                    )?;
                    (k, sample_weights(wp, recovery_u, scratch, b, k)?)
                }
            }
        };
        let mut row: ArrayViewMut1<'_, i64> = out.output_token_ids.row_mut(i);
        row.fill(-1);
        for (t, &x) in ids.iter().take(n).enumerate() {
            row[t] = x as i64;
        }
        row[n] = next as i64;
        out.num_accepted[i] = n as i64;
        out.num_emitted[i] = n as i64 + 1;
    }
    Ok(())
}

fn sample_weights(
    w: &[f64],
    u: f64,
    scratch: &mut Scratch,
    b: usize,
    t: usize,
) -> Result<usize, CoreError> {
    sample::sample(&BufferWeights { w }, u, &mut scratch.block_sums)?.ok_or_else(|| {
        let at = RowAt {
            arg: "target_logits",
            pos: Pos::Padded { b, t },
        };
        CoreError::Value {
            arg: at.arg,
            index: at.pos.index(),
            message: "leaves no token after the filters".to_string(),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_with_fma_keeps_the_bound() {
        if !std::is_x86_feature_detected!("fma") {
            return;
        }
        let mut worst = 0.0f64;
        let mut x = 0.0f64;
        while x > -700.0 {
            let ours = exp_nonpositive::<true>(x, &EXP2_TABLE);
            worst = worst.max(((ours - x.exp()) / x.exp()).abs());
            x -= 0.000_913;
        }
        assert!(worst < 4.5e-16, "relative error {worst}");
    }

    #[test]
    fn exp_is_within_an_ulp_of_libm() {
        let mut worst = 0.0f64;
        let mut x = 0.0f64;
        while x > -760.0 {
            let (ours, theirs) = (exp_nonpositive::<false>(x, &EXP2_TABLE), x.exp());
            if theirs > 1e-300 {
                worst = worst.max(((ours - theirs) / theirs).abs());
            }
            x -= 0.000_731;
        }
        assert!(worst < 4.5e-16, "relative error {worst}");
        assert_eq!(exp_nonpositive::<false>(0.0, &EXP2_TABLE), 1.0);
        assert_eq!(
            exp_nonpositive::<false>(f64::NEG_INFINITY, &EXP2_TABLE),
            0.0
        );
    }

    /// The largest relative error of `exp_screen` over f32 inputs in
    /// `[-87, 0]`, every `stride`-th bit pattern (both variants).
    fn worst_screen_error(stride: usize) -> f64 {
        let (low, high) = ((-0.0f32).to_bits(), (-87.0f32).to_bits());
        let mut worst = 0.0f64;
        for bits in (low..=high).step_by(stride).chain([high]) {
            let x = f32::from_bits(bits);
            let exact = f64::from(x).exp();
            for e in [exp_screen::<false>(x), exp_screen::<true>(x)] {
                worst = worst.max((f64::from(e) - exact).abs() / exact);
            }
        }
        worst
    }

    #[test]
    fn exp_screen_is_within_its_budget() {
        // Half of SCREEN_EXP_ERROR, as the analysis at exp_screen says.
        let worst = worst_screen_error(4099);
        assert!(worst < SCREEN_EXP_ERROR / 2.0, "relative error {worst}");
        assert_eq!(exp_screen::<false>(0.0), 1.0);
    }

    /// Every f32 in [-87, 0]: `cargo test --release -- --ignored`.
    #[test]
    #[ignore = "a billion inputs: run in release"]
    fn exp_screen_is_within_its_budget_everywhere() {
        let worst = worst_screen_error(1);
        assert!(worst < SCREEN_EXP_ERROR / 2.0, "relative error {worst}");
    }

    /// The exact pass's `sum(w)` of a contiguous row.
    fn exact_sum<L: Prob>(values: &[L], inverse: f64) -> f64 {
        let (ok, max) = row_max(values);
        assert!(ok && max > f64::NEG_INFINITY);
        row_exp_sum(values, inverse, max, &mut vec![0.0; values.len()])
    }

    fn check_screen<L: Prob>(values: &[L], inverse: f64) -> f64 {
        let screened = screen_values(values, inverse).expect("a valid f16/f32 row");
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
    fn rows(seed: u64, len: usize, scale: f32, offset: f32) -> Vec<f32> {
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

    #[test]
    fn the_screened_sum_bounds_the_exact_sum() {
        let mut widest = 0.0f64;
        for seed in 0..6u64 {
            for (len, scale, offset) in [
                (1, 1.0, 0.0),
                (7, 3.0, 1.0),
                (300, 20.0, -5.0),
                (5000, 12.0, 100.0),
                (40_000, 2.0, 0.0),
                (40_000, 1e4, 3e4),
                (3000, 1e-6, 0.5),
            ] {
                let mut row = rows(seed, len, scale, offset);
                // -inf entries, and a maximum that grows late (the rescaling).
                for i in (0..len).step_by(11) {
                    row[i] = f32::NEG_INFINITY;
                }
                row[len - 1] = offset + scale;
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
        // Random rows average the errors of exp_screen out; a row whose terms
        // all sit at its worst input adds them up: the bound must still hold.
        let (low, high) = ((-0.0f32).to_bits(), (-2.0f32).to_bits());
        let error = |x: f32| {
            let exact = f64::from(x).exp();
            (f64::from(exp_screen::<false>(x)) - exact).abs() / exact
        };
        let worst = (low..=high)
            .step_by(101)
            .map(f32::from_bits)
            .max_by(|&a, &b| error(a).total_cmp(&error(b)))
            .unwrap();
        assert!(error(worst) > SCREEN_EXP_ERROR / 10.0, "a coherent case");
        for len in [2, 100, 5000] {
            let mut row = vec![worst; len];
            row[0] = 0.0;
            check_screen(&row, 1.0);
        }
    }

    #[test]
    fn the_screen_declines_what_the_exact_pass_must_report() {
        assert!(screen_values(&[1.0f32, f32::NAN], 1.0).is_none());
        assert!(screen_values(&[1.0f32, f32::INFINITY], 1.0).is_none());
        assert!(screen_values(&[f32::NEG_INFINITY; 3], 1.0).is_none());
        assert!(screen_values(&[1.0f64, 2.0], 1.0).is_none(), "f64 logits");
        let row = ArrayView1::from(&[1.0f32, 2.0][..]);
        assert!(screen(row, 1e31).is_none(), "1 / T beyond f32");
        assert!(screen(row, 1e-31).is_none());
        assert!(
            screen(row.slice(s![..;-1]), 1.0).is_none(),
            "not contiguous"
        );
    }
}
