//! Top-k and top-p thresholds of `verify_logits` from a few candidates: the
//! same thresholds as a full selection, without reading the vocabulary twice.

use super::exact::LANES;
use crate::sample::SUM_BLOCK;

/// The `k`-th largest of the maxima of `w`'s blocks of [`SUM_BLOCK`], or 0
/// where there are fewer than `k` blocks. `buffer` is scratch space.
pub(super) fn kth_largest_block_max(w: &[f64], k: usize, buffer: &mut Vec<f64>) -> f64 {
    let blocks = w.len().div_ceil(SUM_BLOCK);
    if k > blocks {
        return 0.0;
    }
    buffer.clear();
    buffer.extend(w.chunks(SUM_BLOCK).map(block_max));
    kth_largest(buffer, k)
}

/// The `k`-th largest of `values` (`1 <= k <= len`), by selection; `values`
/// is reordered.
pub(super) fn kth_largest(values: &mut [f64], k: usize) -> f64 {
    *values
        .select_nth_unstable_by(k - 1, |a, b| b.total_cmp(a))
        .1
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
pub(super) fn top_p_floor(w: &[f64], target: f64, histogram: &mut Vec<f64>) -> f64 {
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

/// Top-p's threshold among `selection` (what top-k kept, in index order;
/// reordered here): the weight at which the running sum in decreasing order
/// first reaches `target`, from a sorted head that grows until it does (0
/// where rounding keeps the sum of all below `target`: everything is kept).
pub(super) fn top_p_threshold(selection: &mut [f64], target: f64) -> f64 {
    let count = selection.len();
    let mut head = count.min(64);
    loop {
        if head < count {
            selection.select_nth_unstable_by(head - 1, |a, b| b.total_cmp(a));
        }
        selection[..head].sort_unstable_by(|a, b| b.total_cmp(a));
        let mut cumulative = 0.0;
        let reached = selection[..head].iter().position(|&e| {
            cumulative += e;
            cumulative >= target
        });
        match reached {
            Some(j) => return selection[j],
            None if head == count => return 0.0,
            None => head = (head * 4).min(count),
        }
    }
}
