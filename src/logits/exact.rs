//! The exact pass of `verify_logits`: `w_i = exp((l_i - max) / T)` in
//! float64 and its canonical sum, the numbers every decision rests on.

use std::sync::LazyLock;

use crate::prob::Prob;
use crate::sample::SUM_BLOCK;
use crate::simd::Kernel;

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
pub(super) const LANES: usize = 16;

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

/// The two passes of the softmax, AVX2 when the CPU has it (aarch64: the
/// baseline NEON build, FMA and the NEON kernel): `(valid, max)`.
pub(super) fn row_max(values: &[impl Prob]) -> (bool, f64) {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::has_avx2() {
        // SAFETY: the CPU supports AVX2 and F16C, checked just above.
        return unsafe { max_row_avx2(values) };
    }
    max_row(values)
}

/// `w_i = exp((l_i - max) / T)`; returns `sum(w)`.
pub(super) fn row_exp_sum(values: &[impl Prob], inverse: f64, max: f64, w: &mut [f64]) -> f64 {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::has_avx2() {
        if std::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU supports AVX2, F16C and FMA, checked here.
            return unsafe { exp_row_sum_fma(values, inverse, max, w) };
        }
        // SAFETY: as above.
        return unsafe { exp_row_sum_avx2(values, inverse, max, w) };
    }
    exp_row_sum::<crate::simd::Baseline, _, BASELINE_FMA>(values, inverse, max, w)
}

/// Whether every CPU of the target fuses `mul_add` in one instruction, so
/// the baseline pass runs the FMA variant: aarch64 (FMADD is part of its
/// base instruction set). Elsewhere `mul_add` could be a library call.
const BASELINE_FMA: bool = cfg!(target_arch = "aarch64");

/// `w_x = exp((l_x - max) / T)` with the bits the exact pass gives it (the
/// same `exp` variant as [`row_exp_sum`] picks).
pub(super) fn exact_weight(l: impl Prob, max: f64, inverse: f64) -> f64 {
    let x = (l.to_f64() - max) * inverse;
    if uses_fma() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the CPU supports FMA, checked by `uses_fma`.
        return unsafe { exp_fma(x) };
        // Baseline FMA: `mul_add` is one instruction without a target feature.
        #[cfg(not(target_arch = "x86_64"))]
        return exp_nonpositive::<true>(x, &EXP2_TABLE);
    }
    exp_nonpositive::<false>(x, &EXP2_TABLE)
}

/// The FMA variant compiled with FMA: `mul_add` is one instruction here,
/// where elsewhere it would call the C library's `fma`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma")]
fn exp_fma(x: f64) -> f64 {
    exp_nonpositive::<true>(x, &EXP2_TABLE)
}

/// Whether [`row_exp_sum`] runs its FMA variant.
fn uses_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::has_avx2() {
        return std::is_x86_feature_detected!("fma");
    }
    BASELINE_FMA
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_with_fma_keeps_the_bound() {
        // Where FMA is not an instruction, `mul_add` is the C library's `fma`:
        // the same bits, only slower.
        let mut worst = 0.0f64;
        let mut x = 0.0f64;
        while x > -700.0 {
            let ours = exp_nonpositive::<true>(x, &EXP2_TABLE);
            worst = worst.max(((ours - x.exp()) / x.exp()).abs());
            x -= 0.000_913;
        }
        assert!(worst < 4.5e-16, "relative error {worst}");
    }

    /// [`exact_weight`] gives each weight the bits [`row_exp_sum`] writes (the
    /// same `exp` variant: FMA or not), and the sum is the canonical sum of
    /// them. The variants differ on about one input in 2000: the row holds
    /// some of those, so a mismatch would show.
    #[test]
    fn exact_weight_has_the_bits_of_the_exact_pass() {
        let values: Vec<f64> = (0..40_000)
            .map(|i| f64::from(i) * -0.000_913)
            .chain([f64::NEG_INFINITY, -1e-30])
            .collect();
        let table: &[f64; 256] = &EXP2_TABLE;
        for temperature in [1.0, 0.7] {
            let inverse = 1.0 / temperature;
            let (ok, max) = row_max(&values);
            assert!(ok && max == 0.0);
            let differ = values.iter().filter(|&&l| {
                let x = (l - max) * inverse;
                exp_nonpositive::<true>(x, table) != exp_nonpositive::<false>(x, table)
            });
            assert!(differ.count() > 5);
            let mut w = vec![f64::NAN; values.len()];
            let total = row_exp_sum(&values, inverse, max, &mut w);
            for (&l, &wi) in values.iter().zip(&w) {
                assert_eq!(exact_weight(l, max, inverse).to_bits(), wi.to_bits(), "{l}");
            }
            let weights = crate::sample::BufferWeights { w: &w };
            let canonical = crate::sample::canonical_sum(&weights, &mut Vec::new()).unwrap();
            assert_eq!(canonical.to_bits(), total.to_bits());
        }
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
