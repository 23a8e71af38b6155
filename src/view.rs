//! How the core reads its inputs: probability rows generic over [`Prob`]
//! ([`crate::prob`])
//! (f16/bf16/f32/f64, monomorphized: this is where the bytes are), and the small
//! per-row arrays (ids, counts, uniforms) through dtype enums, which cost one
//! predictable branch per element and keep the number of kernel instances small.

use ndarray::{ArrayView, ArrayView1, Dimension, Ix1, Ix2};

use crate::prob::Prob;

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
