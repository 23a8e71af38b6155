//! Dividing a row by one number with the bits of IEEE division, `w_i / total`
//! rounded to nearest, in fewer cycles than the division instruction: a
//! product by the rounded reciprocal and two corrections by fused
//! multiply-adds (Markstein's method). Where the CPU has no FMA, and for the
//! rare values outside the range the proof below covers, the division
//! instruction itself.
//!
//! Why the bits are the division's, for `total` in `[1, 2^60]`, `y =
//! RN(1 / total)` (one IEEE division) and `a` in `[2^-900, 2^900]`, with `x =
//! a / total` exactly, `u = 2^-53` and `ulp` the spacing of the floats in
//! `x`'s binade:
//! 1. `q0 = RN(a y)`: `a y = x (1 + e)` with `|e| < u`, so `|q0 - x| <= 2 ulp`
//!    (half an ulp of `a y`, at most two of `x`'s, plus `x u < ulp`).
//! 2. `q1 = RN(q0 + RN(a - total q0) y)` (two FMAs): the remainder's rounding
//!    and `y`'s error scale the correction by `(1 + d)(1 + e)`, so `q1` rounds
//!    a number within `2 ulp (2u + u^2) < ulp / 4` of `x`: it is one of the two
//!    floats around `x` (a faithful rounding).
//! 3. `q2 = RN(q1 + RN(a - total q1) y)`: with `q1` faithful and `y` within
//!    half an ulp of `1 / total`, the remainder `a - total q1` is a float (the
//!    FMA computes it exactly) and `q2 = RN(x)`: Markstein's theorem (P.
//!    Markstein, "Computation of elementary functions on the IBM RISC
//!    System/6000 processor", IBM J. Res. Dev. 34(1), 1990; J.-M. Muller et
//!    al., *Handbook of Floating-Point Arithmetic*, on division with an FMA).
//!
//! The ranges keep every step away from underflow and overflow (`x >=
//! 2^-960`; the remainders are multiples of `2^-1065` or coarser, so exact
//! where the theorem needs it), and `+0` gives `+0` at every step. Everything
//! else (subnormal, `-0`, larger, infinite or NaN values; a `total` outside
//! its range) is divided by the instruction. `tests` compares the bits with
//! the division on random and on the hardest inputs (quotients next to a
//! midpoint between two floats, where the product alone is wrong).

/// The smallest `a` the corrected product divides, `2^-900`.
#[cfg(any(target_arch = "x86_64", test))]
const SMALLEST: f64 = f64::from_bits((1023 - 900) << 52);
/// The largest `a` the corrected product divides, `2^900`.
#[cfg(any(target_arch = "x86_64", test))]
const LARGEST: f64 = f64::from_bits((1023 + 900) << 52);
/// The largest `total` the corrected product divides by, `2^60`.
#[cfg(any(target_arch = "x86_64", test))]
const LARGEST_TOTAL: f64 = f64::from_bits((1023 + 60) << 52);

/// `w_i = w_i / total` for every `i`, each with the bits of the IEEE division.
pub fn divide_row(w: &mut [f64], total: f64) {
    #[cfg(target_arch = "x86_64")]
    if (1.0..=LARGEST_TOTAL).contains(&total)
        && crate::simd::has_avx2()
        && std::is_x86_feature_detected!("fma")
    {
        // SAFETY: the CPU supports AVX2 and FMA, checked just above.
        return unsafe { x86::divide_row(w, total) };
    }
    divide_row_by_instruction(w, total);
}

/// The portable loop: the division instruction, element by element (vectorised
/// by the compiler where it can).
fn divide_row_by_instruction(w: &mut [f64], total: f64) {
    for v in w.iter_mut() {
        *v /= total;
    }
}

/// Whether [`corrected`] gives `a`'s quotient the division's bits.
#[cfg(any(target_arch = "x86_64", test))]
#[inline(always)]
fn in_range(a: f64) -> bool {
    a.to_bits() == 0 || (SMALLEST..=LARGEST).contains(&a)
}

/// `RN(a / total)` for `a` [`in_range`], `total` in `[1, 2^60]` and `y =
/// RN(1 / total)`: the product and its two corrections of the module's proof.
/// `mul_add` must be one instruction where this is called (FMA enabled).
#[cfg(any(target_arch = "x86_64", test))]
#[inline(always)]
fn corrected(a: f64, total: f64, y: f64) -> f64 {
    let q0 = a * y;
    let q1 = (-q0).mul_add(total, a).mul_add(y, q0);
    (-q1).mul_add(total, a).mul_add(y, q1)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{corrected, in_range, LARGEST, SMALLEST};

    /// [`super::divide_row`] with AVX2 and FMA: eight values a step; a step
    /// with any value outside [`in_range`] divides all eight by the instruction.
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn divide_row(w: &mut [f64], total: f64) {
        let y = 1.0 / total;
        let (chunks, tail) = w.as_chunks_mut::<8>();
        let (b, r) = (_mm256_set1_pd(total), _mm256_set1_pd(y));
        let (lo, hi) = (_mm256_set1_pd(SMALLEST), _mm256_set1_pd(LARGEST));
        let zero = _mm256_setzero_si256();
        for chunk in chunks {
            let p = chunk.as_mut_ptr();
            // SAFETY: `chunk` holds 8 f64: lanes 0..4 and 4..8 are in bounds.
            let (a0, a1) = unsafe { (_mm256_loadu_pd(p), _mm256_loadu_pd(p.add(4))) };
            let in_range = |a: __m256d| {
                let between = _mm256_and_pd(
                    _mm256_cmp_pd::<_CMP_GE_OQ>(a, lo),
                    _mm256_cmp_pd::<_CMP_LE_OQ>(a, hi),
                );
                let plus_zero =
                    _mm256_castsi256_pd(_mm256_cmpeq_epi64(_mm256_castpd_si256(a), zero));
                _mm256_or_pd(between, plus_zero)
            };
            let all = _mm256_and_pd(in_range(a0), in_range(a1));
            let (q0, q1) = if _mm256_movemask_pd(all) == 0b1111 {
                let quotient = |a: __m256d| {
                    let q = _mm256_mul_pd(a, r);
                    let q = _mm256_fmadd_pd(_mm256_fnmadd_pd(q, b, a), r, q);
                    _mm256_fmadd_pd(_mm256_fnmadd_pd(q, b, a), r, q)
                };
                (quotient(a0), quotient(a1))
            } else {
                (_mm256_div_pd(a0, b), _mm256_div_pd(a1, b))
            };
            // SAFETY: as for the loads.
            unsafe {
                _mm256_storeu_pd(p, q0);
                _mm256_storeu_pd(p.add(4), q1);
            }
        }
        for v in tail {
            *v = if in_range(*v) {
                corrected(*v, total, y)
            } else {
                *v / total
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// xorshift64: reproducible bits for the random cases.
    struct Bits(u64);
    impl Bits {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        /// A float with exponent `2^e` and random significand bits.
        fn float(&mut self, e: i64) -> f64 {
            f64::from_bits(((1023 + e) as u64) << 52 | (self.next() >> 12))
        }
    }

    /// Divisors: integers (sums of weights are often near one), powers of
    /// two, significands of all ones, random ones in `[1, 2^60]`.
    fn totals(bits: &mut Bits) -> Vec<f64> {
        let mut t = vec![1.0, 2.0, 3.0, 7.0, 10.0, 49152.0, 128256.0, 151936.0];
        t.extend([1.0f64, 2.0, 1024.0, 2f64.powi(60)].map(|v| f64::from_bits(v.to_bits() - 1)));
        t.retain(|&v| v >= 1.0);
        t.extend((0..40).map(|i| bits.float(i % 61)));
        t
    }

    /// A row of dividends for `total`: half with quotients next to a midpoint
    /// between two floats (`RN(total (q + ulp / 2))`, a few ulps either side),
    /// half random over `[2^-900, 1]`; then, each alone in a step of eight
    /// otherwise in range, the values outside the range (random ones down to
    /// the subnormals among them) and the edges.
    fn dividends(bits: &mut Bits, total: f64, n: usize) -> Vec<f64> {
        let mut w = Vec::with_capacity(n + 16);
        while w.len() < n {
            let e = -((bits.next() % 120) as i64) - 1;
            let q = bits.float(e);
            let half_ulp = (f64::from_bits(q.to_bits() + 1) - q) / 2.0;
            let near = total.mul_add(q, total * half_ulp);
            let step = (bits.next() % 5) as i64 - 2;
            w.push(f64::from_bits((near.to_bits() as i64 + step) as u64));
            let e = -((bits.next() % 900) as i64);
            w.push(bits.float(e));
        }
        let mut odd = vec![
            0.0,
            -0.0,
            1.0,
            SMALLEST,
            f64::from_bits(SMALLEST.to_bits() - 1),
            f64::MIN_POSITIVE,
            f64::from_bits(1),
            5e-324 * 3.0,
            LARGEST,
            f64::from_bits(LARGEST.to_bits() + 1),
            f64::MAX,
            f64::INFINITY,
            f64::NAN,
            -1.0,
            -SMALLEST,
        ];
        for _ in 0..64 {
            let e = -900 - ((bits.next() % 122) as i64) - 1; // 2^-1022 ..= 2^-901
            odd.push(bits.float(e));
            odd.push(f64::from_bits(bits.next() >> 12)); // subnormal
        }
        for v in odd {
            w.extend(std::iter::repeat_n(0.5, 7));
            w.push(v);
        }
        w
    }

    /// `divide_row` against the division instruction, bit for bit, on every
    /// path this CPU has (rows of odd length reach the tail; each row mixes
    /// chunks inside and outside the range).
    #[test]
    fn divide_row_has_the_bits_of_the_division() {
        let mut bits = Bits(0x9e37_79b9_7f4a_7c15);
        let mut checked = 0usize;
        for total in totals(&mut bits) {
            for n in [8, 4096, 10_007] {
                let w = dividends(&mut bits, total, n);
                let mut got = w.clone();
                divide_row(&mut got, total);
                for (i, (&a, &g)) in w.iter().zip(&got).enumerate() {
                    let want = a / total;
                    assert!(
                        g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan()),
                        "{a:e} / {total:e} at {i}: {g:e}, the division gives {want:e}"
                    );
                }
                checked += w.len();
            }
        }
        assert!(checked > 500_000);
    }

    /// [`corrected`] alone on the hard cases, in its range, millions of them:
    /// the bits of the division, where the product by the reciprocal alone
    /// (the step a plausible faster variant would stop at) is wrong on many.
    #[test]
    fn corrected_product_is_the_division_where_the_product_is_not() {
        #[cfg(target_arch = "x86_64")]
        if !std::is_x86_feature_detected!("fma") {
            return; // `corrected` needs a fused `mul_add`; the row falls back
        }
        let mut bits = Bits(0x2545_f491_4f6c_dd1d);
        let (mut checked, mut product_wrong) = (0usize, 0usize);
        for total in totals(&mut bits) {
            let y = 1.0 / total;
            for a in dividends(&mut bits, total, 40_000) {
                if !in_range(a) || !(1.0..=LARGEST_TOTAL).contains(&total) {
                    continue;
                }
                let want = a / total;
                assert_eq!(
                    fused(a, total, y).to_bits(),
                    want.to_bits(),
                    "{a:e} / {total:e}"
                );
                product_wrong += usize::from((a * y).to_bits() != want.to_bits());
                checked += 1;
            }
        }
        assert!(checked > 1_500_000);
        assert!(product_wrong > checked / 10, "{product_wrong} of {checked}");
    }

    /// [`corrected`] compiled with FMA on x86 (`mul_add` one instruction).
    #[cfg(target_arch = "x86_64")]
    fn fused(a: f64, total: f64, y: f64) -> f64 {
        #[target_feature(enable = "fma")]
        fn with_fma(a: f64, total: f64, y: f64) -> f64 {
            corrected(a, total, y)
        }
        // SAFETY: the caller checked that the CPU supports FMA.
        unsafe { with_fma(a, total, y) }
    }

    #[cfg(not(target_arch = "x86_64"))]
    fn fused(a: f64, total: f64, y: f64) -> f64 {
        corrected(a, total, y)
    }
}
