//! `AdaptiveK`'s numbers (docs/spec.md sections 13.2 and 13.3): each request's
//! acceptance per draft depth ([`acceptance_rows`]), the step time fitted to the
//! measured steps ([`fit`], giving a [`StepCost`]), and the choice of each
//! request's drafts that is worth the most under it ([`best_width`] for a backend
//! that pads every row to the widest, [`best_ragged`] for one that does not).
//!
//! The Python class keeps the state (the measured steps, each request's counts)
//! and hands these the arrays; `specaccept.reference.AdaptiveK` is the same class
//! with these written in Python and NumPy, the oracle they are tested against.

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, HashMap};

/// The column subsets the fit tries, in its order of preference: fixed cost,
/// per target token, per draft forward.
const SUBSETS: [[bool; 3]; 7] = [
    [true, false, false],
    [false, true, false],
    [false, false, true],
    [true, true, false],
    [true, false, true],
    [false, true, true],
    [true, true, true],
];

/// Relative ridge added to the Gram matrix's diagonal.
const RIDGE: f64 = 1e-9;
/// A later subset replaces the best so far only when its residual is lower by
/// more than this share of `sum w t^2`.
const BETTER: f64 = 1e-9;
/// The Huber step's tuning constant (in robust standard deviations).
const HUBER: f64 = 2.5;
/// The median absolute deviation's scale to a normal standard deviation.
const MAD_SCALE: f64 = 1.4826;
/// A choice's worth must beat the best so far by this share to replace it.
const TIE: f64 = 1e-12;
/// The shortest predicted step (seconds).
const MIN_SECONDS: f64 = 1e-9;

/// A fitted step time: `coef[0] + coef[1] x + coef[2] f`, plus each measured
/// `(x, f)` point's shrunk mean residual.
#[derive(Clone, Debug, PartialEq)]
pub struct StepCost {
    /// Seconds: fixed, per target token, per draft forward (each `>= 0`).
    pub coef: [f64; 3],
    /// `(target tokens, draft forwards, correction)`, one per measured point, in
    /// the order of the points' keys.
    pub cells: Vec<(f64, f64, f64)>,
    lookup: HashMap<(u64, u64), f64>,
}

impl StepCost {
    /// A cost from its parts (the cells' points distinct).
    pub fn new(coef: [f64; 3], cells: Vec<(f64, f64, f64)>) -> Self {
        let lookup = cells
            .iter()
            .map(|&(x, f, c)| ((x.to_bits(), f.to_bits()), c))
            .collect();
        Self {
            coef,
            cells,
            lookup,
        }
    }

    /// The predicted seconds of a step that computes `x` target tokens and `f`
    /// draft forwards: the line, plus the point's correction where it was
    /// measured; at least a nanosecond.
    pub fn seconds(&self, x: f64, f: f64) -> f64 {
        let [c0, c1, c2] = self.coef;
        let line = c0 + c1 * x + c2 * f;
        // (+ 0.0: a key of -0.0 is the point 0.0)
        let key = ((x + 0.0).to_bits(), (f + 0.0).to_bits());
        let shift = self.lookup.get(&key).copied().unwrap_or(0.0);
        (line + shift).max(MIN_SECONDS)
    }
}

/// The step time fitted to the measured steps `(t[j], x[j], f[j])` (seconds,
/// target tokens, draft forwards), oldest first, weighted `keep^age`; `None`
/// with fewer than two steps, steps of unequal lengths, or while every step
/// computed the same `(x, f)`.
pub fn fit(t: &[f64], x: &[f64], f: &[f64], keep: f64) -> Option<StepCost> {
    let n = t.len();
    if n < 2 || x.len() != n || f.len() != n {
        return None;
    }
    let spread = |v: &[f64]| v.iter().any(|&a| a != v[0]);
    if !spread(x) && !spread(f) {
        return None;
    }
    let recent: Vec<f64> = (0..n).map(|j| keep.powf((n - 1 - j) as f64)).collect();
    let mut coef = fit_line(t, x, f, &recent);
    let mut residual = residuals(t, x, f, coef);
    // One Huber step: a step far off the line weighs less.
    let scale = MAD_SCALE * median(residual.iter().map(|r| r.abs()).collect());
    if 1e-6 * median(t.to_vec()) < scale && scale < f64::INFINITY {
        let weights: Vec<f64> = recent
            .iter()
            .zip(&residual)
            .map(|(&w, &r)| w * (HUBER * scale / r.abs().max(1e-300)).min(1.0))
            .collect();
        coef = fit_line(t, x, f, &weights);
        residual = residuals(t, x, f, coef);
    }
    // Each point's mean residual weighted by age alone, shrunk by a weight of 1,
    // the points in the order of their keys `x (max f + 1) + f`.
    let top = f.iter().copied().fold(f64::NEG_INFINITY, f64::max) + 1.0;
    let mut sums: Vec<(f64, f64, f64, f64, f64)> = Vec::new(); // key, x, f, sum w r, sum w
    let mut at: HashMap<u64, usize> = HashMap::new();
    for j in 0..n {
        let key = x[j] * top + f[j] + 0.0;
        let i = *at.entry(key.to_bits()).or_insert_with(|| {
            sums.push((key, x[j], f[j], 0.0, 0.0));
            sums.len() - 1
        });
        sums[i].3 += recent[j] * residual[j];
        sums[i].4 += recent[j];
    }
    sums.sort_by(|a, b| a.0.total_cmp(&b.0));
    let cells = sums
        .into_iter()
        .map(|(_, px, pf, wr, w)| (px + 0.0, pf + 0.0, wr / (w + 1.0)))
        .filter(|c| c.2.is_finite())
        .collect();
    Some(StepCost::new(coef, cells))
}

fn residuals(t: &[f64], x: &[f64], f: &[f64], [c0, c1, c2]: [f64; 3]) -> Vec<f64> {
    (0..t.len())
        .map(|j| t[j] - (c0 + c1 * x[j] + c2 * f[j]))
        .collect()
}

/// The median (the mean of the middle two of an even count); NaN of none.
fn median(mut values: Vec<f64>) -> f64 {
    let n = values.len();
    if n == 0 {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

#[allow(clippy::needless_range_loop)] // 3 x 3 moments: indices read as the algebra
/// Weighted least squares of `t` on `[1, x, f]` with every coefficient `>= 0`:
/// of the subsets of the columns whose own fit is finite and non-negative, the
/// one with the least residual, a later one only where it is lower by more than
/// `BETTER * sum w t^2`; zeros where none fits.
fn fit_line(t: &[f64], x: &[f64], f: &[f64], w: &[f64]) -> [f64; 3] {
    let mut gram = [[0.0; 3]; 3];
    let mut moment = [0.0; 3];
    let mut total = 0.0;
    for j in 0..t.len() {
        let row = [1.0, x[j], f[j]];
        for a in 0..3 {
            let weighted = row[a] * w[j];
            for b in 0..3 {
                gram[b][a] += row[b] * weighted;
            }
            moment[a] += weighted * t[j];
        }
        total += w[j] * t[j] * t[j];
    }
    let finite = gram.iter().flatten().all(|v| v.is_finite())
        && moment.iter().all(|v| v.is_finite())
        && total.is_finite();
    if !finite {
        return [0.0; 3];
    }
    let mut best: Option<(f64, [f64; 3])> = None;
    for on in SUBSETS {
        if (0..3).any(|i| on[i] && gram[i][i] == 0.0) {
            continue; // a column of zeros
        }
        let mut system = [[0.0; 3]; 3];
        let mut rhs = [0.0; 3];
        for i in 0..3 {
            for j in 0..3 {
                system[i][j] = if on[i] && on[j] {
                    gram[i][j] + if i == j { RIDGE * gram[i][i] } else { 0.0 }
                } else if i == j {
                    1.0
                } else {
                    0.0
                };
            }
            rhs[i] = if on[i] { moment[i] } else { 0.0 };
        }
        let Some(mut coef) = solve3(system, rhs) else {
            continue;
        };
        for i in 0..3 {
            if !on[i] {
                coef[i] = 0.0;
            }
        }
        let mut quadratic = 0.0;
        for i in 0..3 {
            for j in 0..3 {
                quadratic += coef[i] * gram[i][j] * coef[j];
            }
        }
        let linear: f64 = (0..3).map(|i| coef[i] * moment[i]).sum();
        let residual = total - 2.0 * linear + quadratic;
        let fits = coef.iter().all(|c| c.is_finite() && *c >= 0.0) && residual.is_finite();
        if fits && best.is_none_or(|(r, _)| residual < r - BETTER * total) {
            best = Some((residual, coef));
        }
    }
    best.map_or([0.0; 3], |(_, coef)| coef)
}

#[allow(clippy::needless_range_loop)] // a 3 x 3 system: indices read as the algebra
/// `a z = b` by Gaussian elimination with partial pivoting; `None` when a pivot
/// is zero (singular).
fn solve3(mut a: [[f64; 3]; 3], mut b: [f64; 3]) -> Option<[f64; 3]> {
    for col in 0..3 {
        let pivot = (col..3)
            .max_by(|&i, &j| a[i][col].abs().total_cmp(&a[j][col].abs()).then(j.cmp(&i)))
            .unwrap_or(col);
        if a[pivot][col] == 0.0 {
            return None;
        }
        a.swap(col, pivot);
        b.swap(col, pivot);
        for row in col + 1..3 {
            let factor = a[row][col] / a[col][col];
            for k in col..3 {
                a[row][k] -= factor * a[col][k];
            }
            b[row] -= factor * b[col];
        }
    }
    let mut z = [0.0; 3];
    for row in (0..3).rev() {
        let mut sum = b[row];
        for k in row + 1..3 {
            sum -= a[row][k] * z[k];
        }
        z[row] = sum / a[row][row];
    }
    Some(z)
}

/// What [`acceptance_rows`] writes, each request's row in turn.
pub struct AcceptanceRows<'a> {
    /// `[R, D]`: the acceptance per depth.
    pub alpha: &'a mut [f64],
    /// `[R, D + 1]`: column `j` the product of the first `j` depths' acceptance,
    /// the expected tokens the `j`-th draft adds (column 0 is 1).
    pub reach: &'a mut [f64],
    /// `[R, D + 1]`: the running sum of `reach`, the expected emitted tokens
    /// with `j` drafts.
    pub cumulative: &'a mut [f64],
}

/// Each request's acceptance per draft depth (docs/spec.md section 13.2) and
/// what it makes of drafts, from `accepted` and `tried` (`[R, D]` row-major, the
/// discounted counts): at depth `i`, `a[i] = (accepted[i] + w p) / (tried[i] +
/// w)` with `p` the estimate one depth shallower (`pooled` at depth 0; an
/// infinite `w`: `p` itself, the limit, at every depth). The
/// outputs hold `R` rows (`R = out.reach.len() / (D + 1)`); the inputs `R D`.
pub fn acceptance_rows(
    accepted: &[f64],
    tried: &[f64],
    depths: usize,
    pooled: f64,
    w: f64,
    out: AcceptanceRows<'_>,
) {
    let wide = depths + 1;
    let rows = out.reach.len() / wide;
    for r in 0..rows {
        let mut prior = pooled;
        let (reach, cumulative) = (
            &mut out.reach[r * wide..(r + 1) * wide],
            &mut out.cumulative[r * wide..(r + 1) * wide],
        );
        reach[0] = 1.0;
        cumulative[0] = 1.0;
        for i in 0..depths {
            let at = r * depths + i;
            if w.is_finite() {
                prior = (accepted[at] + w * prior) / (tried[at] + w);
            } // an infinite weight: the prior alone, at every depth
            out.alpha[at] = prior;
            reach[i + 1] = reach[i] * prior;
            cumulative[i + 1] = cumulative[i] + reach[i + 1];
        }
    }
}

/// The requests' expected tokens per number of drafts, and what each may still
/// emit: what a choice is weighed by.
pub struct Rows<'a> {
    /// `[R, D + 1]` row-major: `cumulative[r][j]` is request `r`'s expected
    /// emitted tokens with `j` drafts (1 with none).
    pub cumulative: &'a [f64],
    /// `D + 1`.
    pub depths: usize,
    /// `[R]`: the most each request drafts (`<= D`).
    pub cap: &'a [i64],
    /// `[R]`, each `>= 1`: the tokens each request may still emit (a fixed batch
    /// run to its end), or `None` (continuous batching).
    pub remaining: Option<&'a [f64]>,
}

impl Rows<'_> {
    fn len(&self) -> usize {
        self.cap.len()
    }

    fn emitted(&self, r: usize, k: i64) -> f64 {
        self.cumulative[r * self.depths + k as usize]
    }

    /// The choice's value: its expected tokens, or with `remaining` the share of
    /// the slowest request's remaining tokens it emits.
    fn value(&self, k: &[i64]) -> f64 {
        match self.remaining {
            None => (0..self.len()).map(|r| self.emitted(r, k[r])).sum(),
            Some(left) => (0..self.len())
                .map(|r| self.emitted(r, k[r]) / left[r])
                .fold(f64::INFINITY, f64::min),
        }
    }
}

/// Whether the rows are consistent: `cumulative` is `[R, depths]`, every cap in
/// `0 .. depths`, `remaining` (if given) `[R]`.
pub fn rows_consistent(rows: &Rows<'_>) -> bool {
    let r = rows.len();
    rows.depths >= 1
        && r.checked_mul(rows.depths) == Some(rows.cumulative.len())
        && rows
            .cap
            .iter()
            .all(|&c| c >= 0 && (c as u64) < rows.depths as u64)
        && rows.remaining.is_none_or(|left| left.len() == r)
}

fn worth(value: f64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        value / seconds
    } else {
        f64::INFINITY
    }
}

/// A padded backend: the width `w` (each request drafting `min(cap, w)`) whose
/// value per predicted second (`x = R (1 + W)`, `f = W`) is the largest, the
/// smallest on ties, from `min(min_k, max cap)` up.
pub fn best_width(rows: &Rows<'_>, min_k: i64, cost: &StepCost) -> Vec<i64> {
    let min_k = min_k.max(0); // (a negative min_k is none)
    let top = rows.cap.iter().copied().max().unwrap_or(0);
    let mut best: Vec<i64> = rows.cap.iter().map(|&c| c.min(min_k)).collect();
    let mut best_worth = f64::NEG_INFINITY;
    let batch = rows.len() as f64;
    let mut k = vec![0; rows.len()];
    for w in min_k.min(top)..=top {
        for (kr, &c) in k.iter_mut().zip(rows.cap) {
            *kr = c.min(w);
        }
        let width = k.iter().copied().max().unwrap_or(0) as f64;
        let current = worth(rows.value(&k), cost.seconds(batch * (1.0 + width), width));
        if current > best_worth * (1.0 + TIE) {
            best.clone_from(&k);
            best_worth = current;
        }
    }
    best
}

/// A ragged backend: drafts added one at a time from `min(cap, min_k)` each,
/// without `remaining` in decreasing order of their expected tokens (request
/// `r`'s `j`-th draft adds `reach[r][j]`; stable), with `remaining` always to the
/// request slowest to finish (`min emitted / remaining`, the first of equals)
/// while it can draft; of every prefix of that order, the one of the largest
/// value per predicted second (`x = R + sum k`, `f = max k`), the fewest drafts
/// on ties.
pub fn best_ragged(rows: &Rows<'_>, reach: &[f64], min_k: i64, cost: &StepCost) -> Vec<i64> {
    let min_k = min_k.max(0); // (a negative min_k is none)
    let n = rows.len();
    let d = rows.depths;
    let mut k: Vec<i64> = rows.cap.iter().map(|&c| c.min(min_k)).collect();
    let steps: Vec<usize> = match rows.remaining {
        None => {
            let mut order: Vec<(f64, usize)> = (0..n)
                .flat_map(|r| (k[r] + 1..=rows.cap[r]).map(move |j| (reach[r * d + j as usize], r)))
                .collect();
            order.sort_by(|a, b| b.0.partial_cmp(&a.0).unwrap_or(Ordering::Equal));
            order.into_iter().map(|(_, r)| r).collect()
        }
        Some(left) => {
            // A min-heap of (emitted / remaining, request): the first of equals.
            let mut counts = k.clone();
            let mut heap: BinaryHeap<Reverse<(Ordered, usize)>> = (0..n)
                .map(|r| Reverse((Ordered(rows.emitted(r, counts[r]) / left[r]), r)))
                .collect();
            let mut steps = Vec::new();
            while let Some(Reverse((_, r))) = heap.pop() {
                if counts[r] >= rows.cap[r] {
                    break; // the slowest cannot draft more: nothing else helps
                }
                counts[r] += 1;
                steps.push(r);
                heap.push(Reverse((Ordered(rows.emitted(r, counts[r]) / left[r]), r)));
            }
            steps
        }
    };
    let batch = n as f64;
    // What the prefix computes, kept as drafts are added: the drafts, the widest.
    let mut drafts: i64 = k.iter().sum();
    let mut width = k.iter().copied().max().unwrap_or(0);
    let seconds = |drafts: i64, width: i64| cost.seconds(batch + drafts as f64, width as f64);
    let mut best = k.clone();
    let mut best_worth = worth(rows.value(&k), seconds(drafts, width));
    // The value kept as drafts are added: the sum without `remaining`; with it,
    // the minimum over requests, from a heap of the current ratios.
    let mut total: f64 = (0..n).map(|r| rows.emitted(r, k[r])).sum();
    let mut ratios: Option<BinaryHeap<Reverse<(Ordered, usize)>>> = rows.remaining.map(|left| {
        (0..n)
            .map(|r| Reverse((Ordered(rows.emitted(r, k[r]) / left[r]), r)))
            .collect()
    });
    for r in steps {
        let before = rows.emitted(r, k[r]);
        k[r] += 1;
        drafts += 1;
        width = width.max(k[r]);
        let value = match (&mut ratios, rows.remaining) {
            (Some(heap), Some(left)) => {
                heap.push(Reverse((Ordered(rows.emitted(r, k[r]) / left[r]), r)));
                // Drop stale entries (a request's ratio before its last draft).
                while let Some(Reverse((Ordered(v), top))) = heap.peek() {
                    if *v == rows.emitted(*top, k[*top]) / left[*top] {
                        break;
                    }
                    heap.pop();
                }
                heap.peek()
                    .map_or(f64::INFINITY, |Reverse((Ordered(v), _))| *v)
            }
            _ => {
                total += rows.emitted(r, k[r]) - before;
                total
            }
        };
        let current = worth(value, seconds(drafts, width));
        if current > best_worth * (1.0 + TIE) {
            best.clone_from(&k);
            best_worth = current;
        }
    }
    best
}

/// An `f64` ordered by `total_cmp` (the values here are finite).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Ordered(f64);

impl Eq for Ordered {}

impl PartialOrd for Ordered {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Ordered {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.total_cmp(&other.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fits_a_line_exactly() {
        let x: Vec<f64> = (0..20).map(|j| [8.0, 16.0, 24.0, 40.0][j % 4]).collect();
        let f: Vec<f64> = (0..20).map(|j| [0.0, 1.0, 2.0, 4.0][j % 4]).collect();
        let t: Vec<f64> = (0..20).map(|j| 0.05 + 0.002 * x[j] + 0.01 * f[j]).collect();
        let cost = fit(&t, &x, &f, 1.0 - 1.0 / 32.0).unwrap();
        // x = 8 (1 + f) here: the target's tokens explain both (t = 0.04 +
        // 0.00325 x), up to the relative ridge of 1e-9.
        assert!((cost.coef[0] - 0.04).abs() < 1e-9, "{:?}", cost.coef);
        assert!((cost.coef[1] - 0.00325).abs() < 1e-9, "{:?}", cost.coef);
        assert_eq!(cost.coef[2], 0.0);
        assert!((cost.seconds(40.0, 4.0) - t[3]).abs() < 1e-9);
        assert_eq!(cost.cells.len(), 4);
    }

    #[test]
    fn acceptance_is_the_counts_with_the_shallower_estimate_as_prior() {
        // One request: depth 0 saw 3 of 4, depth 1 nothing; pooled 0.5, w = 2.
        let (mut alpha, mut reach, mut cumulative) = ([0.0; 2], [0.0; 3], [0.0; 3]);
        let out = AcceptanceRows {
            alpha: &mut alpha,
            reach: &mut reach,
            cumulative: &mut cumulative,
        };
        acceptance_rows(&[3.0, 0.0], &[4.0, 0.0], 2, 0.5, 2.0, out);
        let a0 = (3.0 + 2.0 * 0.5) / (4.0 + 2.0);
        assert_eq!(alpha, [a0, a0]);
        assert_eq!(reach, [1.0, a0, a0 * a0]);
        assert_eq!(cumulative, [1.0, 1.0 + a0, 1.0 + a0 + a0 * a0]);
    }

    #[test]
    fn no_fit_from_one_point() {
        assert_eq!(fit(&[1.0, 2.0], &[3.0, 3.0], &[0.0, 0.0], 0.9), None);
        assert_eq!(fit(&[1.0], &[3.0], &[0.0], 0.9), None);
        assert_eq!(fit(&[1.0, 2.0], &[3.0], &[0.0, 1.0], 0.9), None);
    }

    #[test]
    fn a_singular_system_is_skipped() {
        assert_eq!(
            solve3(
                [[1.0, 2.0, 0.0], [2.0, 4.0, 0.0], [0.0, 0.0, 1.0]],
                [1.0; 3]
            ),
            None
        );
        let z = solve3(
            [[2.0, 0.0, 0.0], [0.0, 4.0, 0.0], [0.0, 0.0, 1.0]],
            [2.0, 8.0, 3.0],
        );
        assert_eq!(z, Some([1.0, 2.0, 3.0]));
    }

    #[test]
    fn drafts_that_cannot_pay_are_not_made() {
        // Two requests, acceptance 0.1: a draft adds 0.1 tokens and costs as
        // much as a token.
        let reach = [1.0, 0.1, 0.01, 1.0, 0.1, 0.01];
        let cumulative = [1.0, 1.1, 1.11, 1.0, 1.1, 1.11];
        let cost = StepCost::new([0.0, 1.0, 0.0], vec![]);
        let rows = Rows {
            cumulative: &cumulative,
            depths: 3,
            cap: &[2, 2],
            remaining: None,
        };
        assert!(rows_consistent(&rows));
        assert_eq!(best_width(&rows, 0, &cost), vec![0, 0]);
        assert_eq!(best_ragged(&rows, &reach, 0, &cost), vec![0, 0]);
        // A fixed cost of 10 per step: every draft pays.
        let cost = StepCost::new([10.0, 0.0, 0.0], vec![]);
        assert_eq!(best_width(&rows, 0, &cost), vec![2, 2]);
        assert_eq!(best_ragged(&rows, &reach, 0, &cost), vec![2, 2]);
    }
}
