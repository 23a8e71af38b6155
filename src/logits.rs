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

/// Scratch space of one thread: the transformed row and the selection buffer.
#[derive(Default)]
struct Scratch {
    block_sums: Vec<f64>,
    selection: Vec<f64>,
}

/// Transforms logits row `row` into weights `w` (`e_i` kept, else 0) and
/// returns `sum(w)`. Errors name `arg[b, t, i]`.
fn transform<L: Prob>(
    row: ArrayView1<'_, L>,
    params: Params,
    arg: &'static str,
    b: usize,
    t: usize,
    w: &mut Vec<f64>,
    scratch: &mut Scratch,
) -> Result<f64, CoreError> {
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
    let (ok, max) = row_max(values);
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
    let candidates = || w.iter().copied().filter(|&e| e > 0.0);
    if params.top_k > 0 {
        scratch.selection.clear();
        scratch.selection.extend(candidates());
        if params.top_k < scratch.selection.len() {
            let (_, kth, _) = scratch
                .selection
                .select_nth_unstable_by(params.top_k - 1, |a, b| b.total_cmp(a));
            threshold = *kth;
        }
    }
    // Top-p over what top-k kept: a growing sorted head until the mass is reached.
    if params.top_p < 1.0 {
        scratch.selection.clear();
        scratch
            .selection
            .extend(w.iter().copied().filter(|&e| e > 0.0 && e >= threshold));
        let kept_total: f64 = sample::canonical_sum(
            &BufferWeights {
                w: &scratch.selection,
            },
            &mut scratch.block_sums,
        )?;
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
            if *e < threshold {
                *e = 0.0;
            }
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
    let k_max = inputs.draft_token_ids.shape()[1];
    let vocab = inputs.target_logits.shape()[2];
    let mut scratch = Scratch::default();
    let (mut wp, mut wq, mut residual) = (Vec::new(), Vec::new(), Vec::new());
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
            for (t, &x) in ids.iter().enumerate() {
                let total_p = transform(
                    target_row(t),
                    params,
                    "target_logits",
                    b,
                    t,
                    &mut wp,
                    &mut scratch,
                )?;
                let p = wp[x] / total_p;
                let (q, total_q) = match &inputs.draft_logits {
                    Some(dl) => {
                        let total = transform(
                            dl.slice(s![b, t, ..]),
                            params,
                            "draft_logits",
                            b,
                            t,
                            &mut wq,
                            &mut scratch,
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
                            .zip(&wq)
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
                    &BufferWeights { w: &residual },
                    recovery_u,
                    &mut scratch.block_sums,
                )? {
                    Some(token) => token,
                    // Only rounding gets here: sample from p itself.
                    None => sample_weights(&wp, recovery_u, &mut scratch, b, t)?,
                };
                outcome = Some((t, token));
                break;
            }
            match outcome {
                Some(found) => found,
                None => {
                    transform(
                        target_row(k),
                        params,
                        "target_logits",
                        b,
                        k,
                        &mut wp,
                        &mut scratch,
                    )?;
                    (k, sample_weights(&wp, recovery_u, &mut scratch, b, k)?)
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
}
