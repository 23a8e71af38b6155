//! The probability element types (f16, bf16, f32, f64) and how they are read:
//! [`Prob`] (one value: as `f64` exactly, its bit pattern for the validity
//! check) and [`Load8`] (eight values into AVX2 or NEON registers). The input views
//! ([`crate::view`]) and the kernels ([`crate::simd`], [`crate::logits`]) are
//! generic over them; this module depends on neither.

/// A probability element: read as `f64`, exactly (every f16/bf16/f32 is an f64).
///
/// `bits` gives the hot loops a one-instruction validity check: for values with
/// the sign bit clear, the bit patterns order like the values, so
/// `bits() <= LARGEST_FINITE` holds exactly for `+0.0 ..= MAX`. NaN, infinities,
/// negatives and `-0.0` lie above it (`-0.0` is valid: the slow check says so).
pub trait Prob: Copy + Send + Sync + 'static + Load8 {
    /// The bit pattern as an unsigned integer of the same width.
    type Bits: Copy + Ord + Default + Send + Sync;
    /// The bit pattern of the largest finite value.
    const LARGEST_FINITE: Self::Bits;
    fn bits(self) -> Self::Bits;
    fn to_f64(self) -> f64;
    /// Whether every value is an `f32` ([`Prob::to_f32`] exact: f16, bf16, f32).
    const EXACT_IN_F32: bool;
    /// The value as `f32`: exact where [`Prob::EXACT_IN_F32`], else rounded.
    fn to_f32(self) -> f32;
}

impl Prob for f64 {
    type Bits = u64;
    const LARGEST_FINITE: u64 = 0x7fef_ffff_ffff_ffff;
    #[inline(always)]
    fn bits(self) -> u64 {
        self.to_bits()
    }
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self
    }
    const EXACT_IN_F32: bool = false;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self as f32
    }
}

impl Prob for f32 {
    type Bits = u32;
    const LARGEST_FINITE: u32 = 0x7f7f_ffff;
    #[inline(always)]
    fn bits(self) -> u32 {
        self.to_bits()
    }
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self as f64
    }
    const EXACT_IN_F32: bool = true;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
}

impl Prob for half::f16 {
    type Bits = u16;
    const LARGEST_FINITE: u16 = 0x7bff;
    #[inline(always)]
    fn bits(self) -> u16 {
        self.to_bits()
    }
    #[inline(always)]
    fn to_f64(self) -> f64 {
        f16_bits_to_f32(self.to_bits()) as f64
    }
    const EXACT_IN_F32: bool = true;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16_bits_to_f32(self.to_bits())
    }
}

impl Prob for half::bf16 {
    type Bits = u16;
    const LARGEST_FINITE: u16 = 0x7f7f;
    #[inline(always)]
    fn bits(self) -> u16 {
        self.to_bits()
    }
    #[inline(always)]
    fn to_f64(self) -> f64 {
        bf16_bits_to_f32(self.to_bits()) as f64
    }
    const EXACT_IN_F32: bool = true;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        bf16_bits_to_f32(self.to_bits())
    }
}

/// Exact bf16 -> f32 conversion: bfloat16 is the high half of an f32, so the
/// bits move up 16 places (no arithmetic: subnormals stay exact under
/// flush-to-zero, NaN stays NaN).
#[inline(always)]
pub(crate) fn bf16_bits_to_f32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// Exact f16 -> f32 conversion without branches (so a row converts in SIMD
/// registers) and without subnormal arithmetic (so it is exact even where a
/// library has set flush-to-zero): normals and inf/NaN rebias the exponent,
/// subnormals are `mantissa * 2^-24` computed from an integer.
#[inline(always)]
pub(crate) fn f16_bits_to_f32(h: u16) -> f32 {
    let h = h as u32;
    let sign = (h & 0x8000) << 16;
    let magnitude = h & 0x7fff;
    let normal = (magnitude << 13) + ((127 - 15) << 23);
    let inf_nan = (magnitude << 13) | 0x7f80_0000;
    let subnormal = ((magnitude as i32) as f32 * (1.0 / 16_777_216.0)).to_bits();
    let bits = if magnitude < 0x0400 {
        subnormal
    } else if magnitude >= 0x7c00 {
        inf_nan
    } else {
        normal
    };
    f32::from_bits(bits | sign)
}

#[cfg(target_arch = "x86_64")]
pub use x86::Load8;

#[cfg(target_arch = "aarch64")]
pub use aarch64::Load8;

/// Elsewhere `Prob` needs nothing more.
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
pub trait Load8 {}
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
impl<T> Load8 for T {}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::Prob;

    /// Eight elements at a time into two `f64x4` registers, keeping the
    /// largest bit pattern seen in `high` (per element type).
    pub trait Load8: Sized {
        /// # Safety
        /// `ptr` points at 8 readable elements; the CPU has AVX2 and F16C.
        unsafe fn load8(ptr: *const Self, high: &mut __m256i) -> (__m256d, __m256d);
        /// Eight elements as `f32` (exact for f16, bf16 and f32; f64 rounds).
        ///
        /// # Safety
        /// `ptr` points at 8 readable elements; the CPU has AVX2 and F16C.
        unsafe fn load8_ps(ptr: *const Self) -> __m256;
        /// # Safety
        /// The CPU has AVX2.
        unsafe fn all_valid(high: __m256i) -> bool;
    }

    impl Load8 for f32 {
        #[inline]
        #[target_feature(enable = "avx2,f16c")]
        unsafe fn load8_ps(ptr: *const f32) -> __m256 {
            _mm256_loadu_ps(ptr)
        }
        #[inline]
        #[target_feature(enable = "avx2,f16c")]
        unsafe fn load8(ptr: *const f32, high: &mut __m256i) -> (__m256d, __m256d) {
            let raw = _mm256_loadu_si256(ptr.cast());
            *high = _mm256_max_epu32(*high, raw);
            let v = _mm256_castsi256_ps(raw);
            (
                _mm256_cvtps_pd(_mm256_castps256_ps128(v)),
                _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(v)),
            )
        }
        #[inline]
        #[target_feature(enable = "avx2,f16c")]
        unsafe fn all_valid(high: __m256i) -> bool {
            let limit = _mm256_set1_epi32(f32::LARGEST_FINITE as i32);
            _mm256_movemask_epi8(_mm256_cmpeq_epi32(_mm256_max_epu32(high, limit), limit)) == -1
        }
    }

    impl Load8 for half::f16 {
        #[inline]
        #[target_feature(enable = "avx2,f16c")]
        unsafe fn load8_ps(ptr: *const half::f16) -> __m256 {
            _mm256_cvtph_ps(_mm_loadu_si128(ptr.cast()))
        }
        #[inline]
        #[target_feature(enable = "avx2,f16c")]
        unsafe fn load8(ptr: *const half::f16, high: &mut __m256i) -> (__m256d, __m256d) {
            let raw = _mm_loadu_si128(ptr.cast());
            let kept = _mm_max_epu16(_mm256_castsi256_si128(*high), raw);
            *high = _mm256_castsi128_si256(kept);
            // VCVTPH2PS is exact (f32 holds every f16) and ignores MXCSR.DAZ.
            let v = _mm256_cvtph_ps(raw);
            (
                _mm256_cvtps_pd(_mm256_castps256_ps128(v)),
                _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(v)),
            )
        }
        #[inline]
        #[target_feature(enable = "avx2,f16c")]
        unsafe fn all_valid(high: __m256i) -> bool {
            let limit = _mm_set1_epi16(half::f16::LARGEST_FINITE as i16);
            let low = _mm256_castsi256_si128(high);
            _mm_movemask_epi8(_mm_cmpeq_epi16(_mm_max_epu16(low, limit), limit)) == 0xffff
        }
    }

    impl Load8 for half::bf16 {
        #[inline]
        #[target_feature(enable = "avx2,f16c")]
        unsafe fn load8_ps(ptr: *const half::bf16) -> __m256 {
            let raw = _mm_loadu_si128(ptr.cast());
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(raw)))
        }
        #[inline]
        #[target_feature(enable = "avx2,f16c")]
        unsafe fn load8(ptr: *const half::bf16, high: &mut __m256i) -> (__m256d, __m256d) {
            let raw = _mm_loadu_si128(ptr.cast());
            let kept = _mm_max_epu16(_mm256_castsi256_si128(*high), raw);
            *high = _mm256_castsi128_si256(kept);
            // bfloat16 is the high half of an f32: widen and shift, exactly.
            let v = _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(raw)));
            (
                _mm256_cvtps_pd(_mm256_castps256_ps128(v)),
                _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(v)),
            )
        }
        #[inline]
        #[target_feature(enable = "avx2,f16c")]
        unsafe fn all_valid(high: __m256i) -> bool {
            let limit = _mm_set1_epi16(half::bf16::LARGEST_FINITE as i16);
            let low = _mm256_castsi256_si128(high);
            _mm_movemask_epi8(_mm_cmpeq_epi16(_mm_max_epu16(low, limit), limit)) == 0xffff
        }
    }

    impl Load8 for f64 {
        #[inline]
        #[target_feature(enable = "avx2,f16c")]
        unsafe fn load8_ps(ptr: *const f64) -> __m256 {
            let (lo, hi) = (_mm256_loadu_pd(ptr), _mm256_loadu_pd(ptr.add(4)));
            _mm256_set_m128(_mm256_cvtpd_ps(hi), _mm256_cvtpd_ps(lo))
        }
        #[inline]
        #[target_feature(enable = "avx2,f16c")]
        unsafe fn load8(ptr: *const f64, high: &mut __m256i) -> (__m256d, __m256d) {
            let (lo, hi) = (_mm256_loadu_pd(ptr), _mm256_loadu_pd(ptr.add(4)));
            // No unsigned 64-bit max in AVX2: flag values above LARGEST_FINITE as
            // signed integers (inf, NaN) and below 0 (sign bit set) instead.
            let limit = _mm256_set1_epi64x(f64::LARGEST_FINITE as i64);
            let zero = _mm256_setzero_si256();
            for raw in [_mm256_castpd_si256(lo), _mm256_castpd_si256(hi)] {
                let bad = _mm256_or_si256(
                    _mm256_cmpgt_epi64(raw, limit),
                    _mm256_cmpgt_epi64(zero, raw),
                );
                *high = _mm256_or_si256(*high, bad);
            }
            (lo, hi)
        }
        #[inline]
        #[target_feature(enable = "avx2,f16c")]
        unsafe fn all_valid(high: __m256i) -> bool {
            _mm256_testz_si256(high, high) == 1
        }
    }
}

#[cfg(target_arch = "aarch64")]
mod aarch64 {
    use std::arch::aarch64::*;

    use super::Prob;

    /// Eight elements at a time into four `f64x2` registers (elements `2k`,
    /// `2k + 1` in register `k`), keeping the largest bit pattern seen in
    /// `high`: the NEON counterpart of the x86 `Load8`. NEON is part of the
    /// aarch64 baseline, so nothing is checked at run time.
    pub trait Load8: Sized {
        /// What `high` holds: unsigned maxima of the bit patterns (`u16`
        /// lanes for f16 and bf16, `u32` for f32), or for f64 (no unsigned
        /// 64-bit max in NEON) a mask of the lanes that saw a pattern above
        /// [`Prob::LARGEST_FINITE`].
        type High: Copy;
        /// `high` before any element: nothing seen.
        ///
        /// # Safety
        /// None beyond NEON, which every aarch64 target has (`unsafe` for the
        /// intrinsics' sake).
        unsafe fn no_high() -> Self::High;
        /// # Safety
        /// `ptr` points at 8 readable elements.
        unsafe fn load8(ptr: *const Self, high: &mut Self::High) -> [float64x2_t; 4];
        /// Eight elements as `f32` (exact for f16, bf16 and f32; f64 rounds as
        /// `as f32` does).
        ///
        /// # Safety
        /// `ptr` points at 8 readable elements.
        unsafe fn load8_ps(ptr: *const Self) -> [float32x4_t; 2];
        /// Whether every pattern `high` saw is at most [`Prob::LARGEST_FINITE`].
        ///
        /// # Safety
        /// As for [`Load8::no_high`].
        unsafe fn all_valid(high: Self::High) -> bool;
    }

    /// Four `f32` lanes widened to two `f64x2` registers (exact).
    #[inline(always)]
    unsafe fn widen(v: float32x4_t) -> [float64x2_t; 2] {
        [vcvt_f64_f32(vget_low_f32(v)), vcvt_high_f64_f32(v)]
    }

    /// [`super::f16_bits_to_f32`] on four `u32` lanes holding f16 patterns,
    /// the same integer steps (the stable NEON API has no f16 conversion):
    /// exact for every pattern, subnormals without subnormal arithmetic.
    #[inline(always)]
    unsafe fn f16_bits_to_f32x4(h: uint32x4_t) -> float32x4_t {
        let sign = vshlq_n_u32::<16>(vandq_u32(h, vdupq_n_u32(0x8000)));
        let magnitude = vandq_u32(h, vdupq_n_u32(0x7fff));
        let shifted = vshlq_n_u32::<13>(magnitude);
        let normal = vaddq_u32(shifted, vdupq_n_u32((127 - 15) << 23));
        let inf_nan = vorrq_u32(shifted, vdupq_n_u32(0x7f80_0000));
        // magnitude < 2^15 converts exactly; the product is a normal f32.
        let subnormal = vreinterpretq_u32_f32(vmulq_f32(
            vcvtq_f32_u32(magnitude),
            vdupq_n_f32(1.0 / 16_777_216.0),
        ));
        let is_subnormal = vcltq_u32(magnitude, vdupq_n_u32(0x0400));
        let is_inf_nan = vcgeq_u32(magnitude, vdupq_n_u32(0x7c00));
        let bits = vbslq_u32(
            is_subnormal,
            subnormal,
            vbslq_u32(is_inf_nan, inf_nan, normal),
        );
        vreinterpretq_f32_u32(vorrq_u32(bits, sign))
    }

    impl Load8 for f32 {
        type High = uint32x4_t;
        #[inline(always)]
        unsafe fn no_high() -> uint32x4_t {
            vdupq_n_u32(0)
        }
        #[inline(always)]
        unsafe fn load8(ptr: *const f32, high: &mut uint32x4_t) -> [float64x2_t; 4] {
            let [a, b] = Self::load8_ps(ptr);
            let (ra, rb) = (vreinterpretq_u32_f32(a), vreinterpretq_u32_f32(b));
            *high = vmaxq_u32(*high, vmaxq_u32(ra, rb));
            let ([a0, a1], [b0, b1]) = (widen(a), widen(b));
            [a0, a1, b0, b1]
        }
        #[inline(always)]
        unsafe fn load8_ps(ptr: *const f32) -> [float32x4_t; 2] {
            [vld1q_f32(ptr), vld1q_f32(ptr.add(4))]
        }
        #[inline(always)]
        unsafe fn all_valid(high: uint32x4_t) -> bool {
            vmaxvq_u32(high) <= f32::LARGEST_FINITE
        }
    }

    impl Load8 for half::f16 {
        type High = uint16x8_t;
        #[inline(always)]
        unsafe fn no_high() -> uint16x8_t {
            vdupq_n_u16(0)
        }
        #[inline(always)]
        unsafe fn load8(ptr: *const half::f16, high: &mut uint16x8_t) -> [float64x2_t; 4] {
            let raw = vld1q_u16(ptr.cast());
            *high = vmaxq_u16(*high, raw);
            let [a, b] = f16_halves(raw);
            let ([a0, a1], [b0, b1]) = (widen(a), widen(b));
            [a0, a1, b0, b1]
        }
        #[inline(always)]
        unsafe fn load8_ps(ptr: *const half::f16) -> [float32x4_t; 2] {
            f16_halves(vld1q_u16(ptr.cast()))
        }
        #[inline(always)]
        unsafe fn all_valid(high: uint16x8_t) -> bool {
            vmaxvq_u16(high) <= half::f16::LARGEST_FINITE
        }
    }

    /// Eight f16 patterns as two `f32x4` registers, exactly.
    #[inline(always)]
    unsafe fn f16_halves(raw: uint16x8_t) -> [float32x4_t; 2] {
        [
            f16_bits_to_f32x4(vmovl_u16(vget_low_u16(raw))),
            f16_bits_to_f32x4(vmovl_high_u16(raw)),
        ]
    }

    impl Load8 for half::bf16 {
        type High = uint16x8_t;
        #[inline(always)]
        unsafe fn no_high() -> uint16x8_t {
            vdupq_n_u16(0)
        }
        #[inline(always)]
        unsafe fn load8(ptr: *const half::bf16, high: &mut uint16x8_t) -> [float64x2_t; 4] {
            let raw = vld1q_u16(ptr.cast());
            *high = vmaxq_u16(*high, raw);
            let [a, b] = bf16_halves(raw);
            let ([a0, a1], [b0, b1]) = (widen(a), widen(b));
            [a0, a1, b0, b1]
        }
        #[inline(always)]
        unsafe fn load8_ps(ptr: *const half::bf16) -> [float32x4_t; 2] {
            bf16_halves(vld1q_u16(ptr.cast()))
        }
        #[inline(always)]
        unsafe fn all_valid(high: uint16x8_t) -> bool {
            vmaxvq_u16(high) <= half::bf16::LARGEST_FINITE
        }
    }

    /// Eight bf16 patterns as two `f32x4` registers: bfloat16 is the high
    /// half of an f32, so widen and shift left 16 places, exactly.
    #[inline(always)]
    unsafe fn bf16_halves(raw: uint16x8_t) -> [float32x4_t; 2] {
        [
            vreinterpretq_f32_u32(vshll_n_u16::<16>(vget_low_u16(raw))),
            vreinterpretq_f32_u32(vshll_high_n_u16::<16>(raw)),
        ]
    }

    impl Load8 for f64 {
        type High = uint64x2_t;
        #[inline(always)]
        unsafe fn no_high() -> uint64x2_t {
            vdupq_n_u64(0)
        }
        #[inline(always)]
        unsafe fn load8(ptr: *const f64, high: &mut uint64x2_t) -> [float64x2_t; 4] {
            let v = [
                vld1q_f64(ptr),
                vld1q_f64(ptr.add(2)),
                vld1q_f64(ptr.add(4)),
                vld1q_f64(ptr.add(6)),
            ];
            // No unsigned 64-bit max in NEON: an unsigned compare with the
            // limit flags the lanes above it (NaN, inf, the sign bit set).
            let limit = vdupq_n_u64(f64::LARGEST_FINITE);
            for x in v {
                *high = vorrq_u64(*high, vcgtq_u64(vreinterpretq_u64_f64(x), limit));
            }
            v
        }
        #[inline(always)]
        unsafe fn load8_ps(ptr: *const f64) -> [float32x4_t; 2] {
            let [a, b, c, d] = [
                vld1q_f64(ptr),
                vld1q_f64(ptr.add(2)),
                vld1q_f64(ptr.add(4)),
                vld1q_f64(ptr.add(6)),
            ];
            [
                vcvt_high_f32_f64(vcvt_f32_f64(a), b),
                vcvt_high_f32_f64(vcvt_f32_f64(c), d),
            ]
        }
        #[inline(always)]
        unsafe fn all_valid(high: uint64x2_t) -> bool {
            vmaxvq_u32(vreinterpretq_u32_u64(high)) == 0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_conversion_is_exact_for_every_bit_pattern() {
        for h in 0..=u16::MAX {
            let ours = f16_bits_to_f32(h);
            let theirs = half::f16::from_bits(h).to_f32();
            if theirs.is_nan() {
                assert!(ours.is_nan(), "{h:#06x}");
            } else {
                assert_eq!(ours.to_bits(), theirs.to_bits(), "{h:#06x}");
            }
        }
    }

    #[test]
    fn bf16_conversion_is_exact_for_every_bit_pattern() {
        for h in 0..=u16::MAX {
            let ours = bf16_bits_to_f32(h);
            let theirs = half::bf16::from_bits(h).to_f32();
            if theirs.is_nan() {
                assert!(ours.is_nan(), "{h:#06x}");
            } else {
                assert_eq!(ours.to_bits(), theirs.to_bits(), "{h:#06x}");
            }
        }
    }

    #[test]
    fn bits_at_most_largest_finite_means_finite_and_non_negative() {
        for h in 0..=u16::MAX {
            let v = half::f16::from_bits(h);
            let fast = v.bits() <= half::f16::LARGEST_FINITE;
            let slow = (0.0..=f64::MAX).contains(&v.to_f64()) && h != 0x8000;
            assert_eq!(fast, slow, "{h:#06x}");
            let v = half::bf16::from_bits(h);
            let fast = v.bits() <= half::bf16::LARGEST_FINITE;
            let slow = (0.0..=f64::MAX).contains(&v.to_f64()) && h != 0x8000;
            assert_eq!(fast, slow, "bf16 {h:#06x}");
        }
        for v in [0.0f32, 1.0, f32::MAX, f32::MIN_POSITIVE, 1e-45] {
            assert!(v.bits() <= f32::LARGEST_FINITE && (v as f64).bits() <= f64::LARGEST_FINITE);
        }
        for v in [-0.0f32, -1e-45, f32::INFINITY, f32::NAN, -f32::NAN] {
            assert!(v.bits() > f32::LARGEST_FINITE && (v as f64).bits() > f64::LARGEST_FINITE);
        }
    }
}
