//! How the core reads its inputs: probability rows generic over [`Prob`]
//! (f16/bf16/f32/f64, monomorphized: this is where the bytes are), and the small
//! per-row arrays (ids, counts, uniforms) through dtype enums, which cost one
//! predictable branch per element and keep the number of kernel instances small.

use ndarray::{ArrayView, ArrayView1, Dimension, Ix1, Ix2};

/// A probability element: read as `f64`, exactly (every f16/bf16/f32 is an f64).
///
/// `bits` gives the hot loops a one-instruction validity check: for values with
/// the sign bit clear, the bit patterns order like the values, so
/// `bits() <= LARGEST_FINITE` holds exactly for `+0.0 ..= MAX`. NaN, infinities,
/// negatives and `-0.0` lie above it (`-0.0` is valid: the slow check says so).
pub trait Prob: Copy + Send + Sync + 'static + crate::simd::Load8 {
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

/// One row of `V` probabilities: a unit-stride slice (the fast path) or a
/// strided view (slices, transposes, reversed strides), read in place.
pub trait Row<P>: Copy + Send + Sync {
    fn len(&self) -> usize;
    fn at(&self, i: usize) -> P;
    /// The row as a slice when it has unit stride: the SIMD paths read those.
    fn contiguous(&self) -> Option<&[P]>;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<P: Prob> Row<P> for &[P] {
    #[inline(always)]
    fn len(&self) -> usize {
        <[P]>::len(self)
    }
    #[inline(always)]
    fn at(&self, i: usize) -> P {
        self[i]
    }
    #[inline(always)]
    fn contiguous(&self) -> Option<&[P]> {
        Some(self)
    }
}

impl<P: Prob> Row<P> for ArrayView1<'_, P> {
    #[inline(always)]
    fn len(&self) -> usize {
        ArrayView1::len(self)
    }
    #[inline(always)]
    fn at(&self, i: usize) -> P {
        self[i]
    }
    #[inline(always)]
    fn contiguous(&self) -> Option<&[P]> {
        // Strided views take the generic path; callers pass unit-stride rows as slices.
        None
    }
}

/// Which rows are verified greedily (by argmax) instead of by sampling.
#[derive(Clone, Copy)]
pub enum Greedy<'a> {
    All(bool),
    PerRow(ArrayView1<'a, bool>),
}

impl Greedy<'_> {
    #[inline]
    pub(crate) fn row(&self, b: usize) -> bool {
        match self {
            Greedy::All(g) => *g,
            Greedy::PerRow(g) => g[b],
        }
    }
}

/// An integer array of either id dtype, read in place.
#[derive(Clone, Copy)]
pub enum IntView<'a, D: Dimension> {
    I32(ArrayView<'a, i32, D>),
    I64(ArrayView<'a, i64, D>),
}

/// A float array of any probability dtype, read in place.
#[derive(Clone, Copy)]
pub enum FloatView<'a, D: Dimension> {
    F16(ArrayView<'a, half::f16, D>),
    BF16(ArrayView<'a, half::bf16, D>),
    F32(ArrayView<'a, f32, D>),
    F64(ArrayView<'a, f64, D>),
}

impl<D: Dimension> IntView<'_, D> {
    pub fn shape(&self) -> &[usize] {
        match self {
            IntView::I32(a) => a.shape(),
            IntView::I64(a) => a.shape(),
        }
    }
}

impl<D: Dimension> FloatView<'_, D> {
    pub fn shape(&self) -> &[usize] {
        match self {
            FloatView::F16(a) => a.shape(),
            FloatView::BF16(a) => a.shape(),
            FloatView::F32(a) => a.shape(),
            FloatView::F64(a) => a.shape(),
        }
    }

    /// The elements in logical (C) order, as f64.
    pub fn values(&self) -> Box<dyn Iterator<Item = f64> + '_> {
        match self {
            FloatView::F16(a) => Box::new(a.iter().map(|v| v.to_f64())),
            FloatView::BF16(a) => Box::new(a.iter().map(|v| v.to_f64())),
            FloatView::F32(a) => Box::new(a.iter().map(|&v| v as f64)),
            FloatView::F64(a) => Box::new(a.iter().copied()),
        }
    }
}

impl IntView<'_, Ix1> {
    #[inline]
    pub fn get(&self, i: usize) -> i64 {
        match self {
            IntView::I32(a) => a[i] as i64,
            IntView::I64(a) => a[i],
        }
    }
}

impl IntView<'_, Ix2> {
    /// Whether every row is the same memory (a broadcast view, stride 0).
    pub fn rows_shared(&self) -> bool {
        let stride = match self {
            IntView::I32(a) => a.strides()[0],
            IntView::I64(a) => a.strides()[0],
        };
        stride == 0
    }

    #[inline]
    pub fn get(&self, i: usize, j: usize) -> i64 {
        match self {
            IntView::I32(a) => a[[i, j]] as i64,
            IntView::I64(a) => a[[i, j]],
        }
    }
}

impl FloatView<'_, Ix1> {
    #[inline]
    pub fn get(&self, i: usize) -> f64 {
        match self {
            FloatView::F16(a) => a[i].to_f64(),
            FloatView::BF16(a) => a[i].to_f64(),
            FloatView::F32(a) => a[i] as f64,
            FloatView::F64(a) => a[i],
        }
    }
}

impl FloatView<'_, Ix2> {
    #[inline]
    pub fn get(&self, i: usize, j: usize) -> f64 {
        match self {
            FloatView::F16(a) => a[[i, j]].to_f64(),
            FloatView::BF16(a) => a[[i, j]].to_f64(),
            FloatView::F32(a) => a[[i, j]] as f64,
            FloatView::F64(a) => a[[i, j]],
        }
    }
}

/// The multi-index of the `flat`-th element in C order of an array of `shape`.
pub(crate) fn unravel(mut flat: usize, shape: &[usize]) -> Vec<usize> {
    let mut index = vec![0; shape.len()];
    for (slot, &extent) in index.iter_mut().zip(shape).rev() {
        if extent > 0 {
            *slot = flat % extent;
            flat /= extent;
        }
    }
    index
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
