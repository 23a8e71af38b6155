//! Top-k rows without the dense transform. With top-k on, only the weights at
//! least the k-th largest are kept, so `p(x) = w_x / sum(kept)` needs `exp`
//! of a few candidates, not of the vocabulary. Found from the logits:
//!
//! - `x_i = (l_i - max) / T` is non-decreasing in `l_i`, so the k-th largest
//!   logit gives `x_k`, and at least k weights are `>= exp(x_k) (1 - e)`,
//!   where `e = 4.5e-16` bounds the float64 `exp`'s error ([`super::exact`]);
//! - a weight with `x_i < x_k - 1e-13` is below `exp(x_k) (1 - e)` (the gap is
//!   far above `2e`), so below the k-th largest weight: never kept;
//! - the candidates, `x_i >= x_k - 1e-13`, therefore hold every kept weight
//!   and the k-th largest itself. Their weights are computed exactly, and top-k
//!   and top-p run on them as the dense path runs on its candidates (the same
//!   arrays in the same order). The sum of the kept weights is the canonical
//!   sum of the dense row: zeros change no lane and no block total.
//!
//! So `p(x)` is the dense path's, bits and all. Where a row does not fit (a
//! strided row, fewer blocks than k, an invalid row, a weight that underflows
//! to 0, or more than [`MAX_CANDIDATES`] candidates) the caller runs the dense
//! path.

use ndarray::ArrayView1;

use super::exact::{exact_weight, row_max};
use super::filters::{kth_largest, top_p_threshold};
use super::{Look, Params};
use crate::error::CoreError;
use crate::memory;
use crate::prob::Prob;
use crate::rule::is_accepted;
use crate::sample::{self, BufferWeights, SUM_BLOCK};
use crate::simd::{combine_lanes, SUM_LANES};

/// Above this many candidates (many ties at the k-th logit) the dense path
/// is as cheap.
const MAX_CANDIDATES: usize = 4096;

/// Scratch space of the sparse path (a few entries per candidate).
#[derive(Default)]
pub(super) struct SparseScratch {
    block_maxima: Vec<f64>,
    /// `(index, logit)` of the logits at least the floor, in index order.
    above: Vec<(usize, f64)>,
    logits: Vec<f64>,
    /// `(index, weight)` of the candidates, in index order.
    candidates: Vec<(usize, f64)>,
    weights: Vec<f64>,
    block_sums: Vec<f64>,
}

impl SparseScratch {
    /// Room for rows of `vocab` logits (see `Buffers::reserve`).
    pub(super) fn reserve(&mut self, vocab: usize) -> Result<(), CoreError> {
        let (blocks, arg) = (vocab.div_ceil(SUM_BLOCK), "target_logits");
        memory::reserve(&mut self.block_maxima, blocks, arg)?;
        memory::reserve(&mut self.above, vocab, arg)?;
        memory::reserve(&mut self.logits, vocab, arg)?;
        memory::reserve(&mut self.candidates, vocab, arg)?;
        memory::reserve(&mut self.weights, vocab, arg)?;
        memory::reserve(&mut self.block_sums, blocks, arg)
    }
}

/// What the sparse path found in a row with top-k on.
#[derive(Default)]
struct TopKLook {
    /// The row's max, where it read the whole row and found it valid (the
    /// dense path's `row_max` would give the same).
    max: Option<f64>,
    /// `p(x)` exactly as the dense transform gives it, where the sparse path
    /// applies (else the dense path must run).
    probability: Option<f64>,
}

/// Whether the token rule surely accepts drafted `x` with uniform `u`, from
/// top-k's candidates: `p(x)` of the target row, then `q(x)`: `given_q` where
/// the drafter gave it, else the draft row's (`None`: one-hot, 1). `p(x) = 0`
/// rejects whatever `q` is, so the draft row is then not read. Not accepted
/// leaves the decision to the dense path: a rejection, or a row the sparse
/// path does not apply to.
pub(super) fn top_k_accepts<P: Prob, Q: Prob>(
    target: ArrayView1<'_, P>,
    draft_row: Option<ArrayView1<'_, Q>>,
    given_q: Option<f64>,
    params: Params,
    (x, u): (usize, f64),
    scratch: &mut SparseScratch,
) -> Look {
    let p = top_k_probability(target, params, x, scratch);
    let mut look = Look {
        target_max: p.max,
        ..Look::default()
    };
    let Some(p) = p.probability.filter(|&p| p > 0.0) else {
        return look;
    };
    let q = match (given_q, draft_row) {
        (Some(q), _) => Some(q),
        (None, Some(row)) => {
            let q = top_k_probability(row, params, x, scratch);
            look.draft_max = q.max;
            q.probability
        }
        (None, None) => Some(1.0),
    };
    look.accepted = q.is_some_and(|q| is_accepted(p, q, u));
    look
}

/// [`TopKLook`] of `row` for token `x`.
fn top_k_probability<L: Prob>(
    row: ArrayView1<'_, L>,
    params: Params,
    x: usize,
    scratch: &mut SparseScratch,
) -> TopKLook {
    let mut look = TopKLook::default();
    let Some(values) = row.as_slice() else {
        return look;
    };
    let k = params.top_k;
    if k == 0 || k > values.len().div_ceil(SUM_BLOCK) {
        return look;
    }
    // One pass: validity and the max of each block (and so of the row).
    scratch.block_maxima.clear();
    let mut valid = true;
    for block in values.chunks(SUM_BLOCK) {
        let (ok, block_max) = row_max(block);
        valid &= ok;
        scratch.block_maxima.push(block_max);
    }
    let max = scratch
        .block_maxima
        .iter()
        .fold(f64::NEG_INFINITY, |m, &v| m.max(v));
    if !valid || max == f64::NEG_INFINITY {
        return look; // the dense path names the error
    }
    look.max = Some(max);
    look.probability = probability(values, params, x, max, scratch);
    look
}

/// `p(x)` from top-k's candidates in a valid row of maximum `max`.
fn probability<L: Prob>(
    values: &[L],
    params: Params,
    x: usize,
    max: f64,
    scratch: &mut SparseScratch,
) -> Option<f64> {
    let k = params.top_k;
    let inverse = 1.0 / params.temperature;
    // The k-th largest logit: among those at least the k-th largest block
    // maximum (k blocks hold a logit that large), as in `filters`.
    let floor = kth_largest(&mut scratch.block_maxima, k);
    scratch.above.clear();
    for (i, l) in values.iter().enumerate() {
        let l = l.to_f64();
        if l >= floor {
            scratch.above.push((i, l));
        }
    }
    if scratch.above.len() < k {
        return None;
    }
    scratch.logits.clear();
    scratch.logits.extend(scratch.above.iter().map(|&(_, l)| l));
    let reach = (kth_largest(&mut scratch.logits, k) - max) * inverse - 1e-13;
    // The candidates, x_i >= reach, and their exact weights, in index order.
    // x is non-decreasing in l: when the floor itself is below the reach, no
    // logit under the floor is a candidate, and the logits above it suffice.
    let x_of = |l: f64| (l - max) * inverse;
    scratch.candidates.clear();
    if x_of(floor) < reach {
        for &(i, l) in &scratch.above {
            if x_of(l) >= reach {
                scratch
                    .candidates
                    .push((i, exact_weight(values[i], max, inverse)));
            }
        }
    } else {
        for (i, l) in values.iter().enumerate() {
            if x_of(l.to_f64()) >= reach {
                if scratch.candidates.len() == MAX_CANDIDATES {
                    return None;
                }
                scratch.candidates.push((i, exact_weight(*l, max, inverse)));
            }
        }
    }
    if scratch.candidates.len() > MAX_CANDIDATES
        || scratch.candidates.iter().any(|&(_, w)| w == 0.0)
    {
        return None;
    }
    if scratch.candidates.len() < k {
        return None;
    }
    // Top-k: the k-th largest weight, or min-p's floor where it comes first
    // and is larger (both keep a head of the sorted row).
    scratch.weights.clear();
    scratch
        .weights
        .extend(scratch.candidates.iter().map(|&(_, w)| w));
    let mut threshold = kth_largest(&mut scratch.weights, k).max(params.min_p_first());
    // Top-p over what top-k kept, in index order, as the dense path does.
    if params.top_p < 1.0 {
        scratch.weights.clear();
        let kept = scratch.candidates.iter().map(|&(_, w)| w);
        scratch.weights.extend(kept.filter(|&w| w >= threshold));
        let kept_total = sample::canonical_sum(
            &BufferWeights {
                w: &scratch.weights,
            },
            &mut scratch.block_sums,
        )
        .ok()?;
        let target = params.top_p * kept_total;
        threshold = threshold.max(top_p_threshold(&mut scratch.weights, target));
    }
    threshold = threshold.max(params.min_p_after());
    let kept = scratch
        .candidates
        .iter()
        .copied()
        .filter(|&(_, w)| w >= threshold);
    let total = canonical_sum_of_sparse(kept);
    let w_x = scratch
        .candidates
        .iter()
        .find(|&&(i, _)| i == x)
        .map_or(0.0, |&(_, w)| if w >= threshold { w } else { 0.0 });
    Some(w_x / total)
}

/// The canonical sum (see `sample`) of a row that is zero except at
/// `entries` (`(index, value)`, in index order): each block's lanes get its
/// entries in order, lanes combine pairwise, block totals add in order. A
/// zero adds nothing anywhere, so this is the dense row's sum, bit for bit.
fn canonical_sum_of_sparse(entries: impl Iterator<Item = (usize, f64)>) -> f64 {
    let (mut total, mut block, mut lanes) = (0.0f64, usize::MAX, [0.0f64; SUM_LANES]);
    for (i, w) in entries {
        if i / SUM_BLOCK != block {
            if block != usize::MAX {
                total += combine_lanes(lanes);
            }
            (block, lanes) = (i / SUM_BLOCK, [0.0; SUM_LANES]);
        }
        lanes[i % SUM_BLOCK % SUM_LANES] += w;
    }
    if block != usize::MAX {
        total += combine_lanes(lanes);
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::logits::{transform, LogitsRow, Scratch};

    /// `p(x)` from the dense transform, the oracle.
    fn dense_probability(row: &[f32], params: Params, x: usize) -> f64 {
        let mut w = Vec::new();
        let row_view = LogitsRow {
            logits: ArrayView1::from(row),
            arg: "target_logits",
            pos: crate::checks::Pos::Padded { b: 0, t: 0 },
            max: None,
        };
        let total = transform(row_view, params, &mut w, &mut Scratch::default()).unwrap();
        w[x] / total
    }

    #[test]
    fn top_k_probability_is_the_dense_one_bit_for_bit() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let (mut compared, mut bound) = (0, 0);
        for case in 0..240 {
            let len: usize = [300, 1000, 4099, 20_000][case % 4];
            // Spread logits, logits rounded to few values (ties at every
            // threshold), and a few -inf.
            let rounding = [0.0f32, 1.0, 0.25][case % 3];
            let row: Vec<f32> = (0..len)
                .map(|_| {
                    let v = (next() >> 40) as f32 / (1u64 << 24) as f32 * 16.0 - 8.0;
                    match (next() % 97, rounding) {
                        (0, _) => f32::NEG_INFINITY,
                        (_, r) if r > 0.0 => (v / r).round() * r,
                        _ => v,
                    }
                })
                .collect();
            let blocks = len.div_ceil(SUM_BLOCK);
            let top_k = 1 + (next() as usize) % blocks;
            let top_p = [1.0, 0.9, 0.5, 0.05][case % 4 / 2 + case % 2];
            let temperature = [1.0, 0.3, 2.5][case % 3];
            // The row's best token, one near the k-th, and a random one.
            let mut order: Vec<usize> = (0..len).collect();
            order.sort_by(|&a, &b| row[b].total_cmp(&row[a]));
            // Min-p off, or at the weight halfway to top-k's floor (a tie
            // with it) or just above it: it decides the kept set; applied
            // before top-k and top-p, or after.
            let halfway =
                ((f64::from(row[order[top_k / 2]]) - f64::from(row[order[0]])) / temperature).exp();
            let params = Params {
                temperature,
                top_k,
                top_p,
                min_p: [0.0, halfway, (halfway * 1.0001).min(1.0)][case % 5 % 3],
                min_p_last: case % 7 < 3,
            };
            let mut scratch = SparseScratch::default();
            for x in [
                order[0],
                order[top_k - 1],
                order[top_k],
                next() as usize % len,
            ] {
                let look = top_k_probability(ArrayView1::from(&row[..]), params, x, &mut scratch);
                // The max the dense path then skips finding: its own.
                assert_eq!(look.max, Some(row_max(&row).1), "case {case}");
                if let Some(p) = look.probability {
                    let dense = dense_probability(&row, params, x);
                    let without = Params {
                        min_p: 0.0,
                        ..params
                    };
                    bound += usize::from(dense != dense_probability(&row, without, x));
                    assert_eq!(
                        p.to_bits(),
                        dense.to_bits(),
                        "case {case}, x {x}: {p} vs {dense}"
                    );
                    compared += 1;
                }
            }
        }
        assert!(compared > 600, "the sparse path ran: {compared}");
        assert!(bound > 40, "min-p decided the kept set: {bound}");
    }

    #[test]
    fn a_sparse_sum_is_the_dense_sum() {
        // Values of wildly different sizes, at scattered indices of a row
        // with a partial last block.
        let mut dense = vec![0.0f64; 3 * SUM_BLOCK + 37];
        let mut state = 7u64;
        let mut entries = Vec::new();
        for i in (0..dense.len()).step_by(13) {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1);
            let v = f64::from_bits(0x3000_0000_0000_0000 | (state >> 12)) * 1e10;
            dense[i] = v;
            entries.push((i, v));
        }
        let expected =
            sample::canonical_sum(&BufferWeights { w: &dense }, &mut Vec::new()).unwrap();
        let got = canonical_sum_of_sparse(entries.into_iter());
        assert_eq!(got.to_bits(), expected.to_bits());
        assert_eq!(canonical_sum_of_sparse(std::iter::empty()), 0.0);
    }
}
