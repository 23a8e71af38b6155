//! Traversal verification (docs/spec.md sections 7.6 and 7.7) from the
//! certified passes: the float64 walk of [`crate::tree`], every number of it
//! in a proven interval, no row transformed.
//!
//! The walk is the float64 one, step for step: the nodes in post-order, each
//! child entered with the rate `next_rho(a, Mb(x), q(x))`, a node with no
//! child left accepted iff its uniform is below its rate, a removed node's
//! parent updated (or, by step 3's rule, rejected without the update). Each
//! decision is taken where the intervals decide it; anything they leave open
//! returns `None`, and the float64 walk runs from the start.
//!
//! A node's weights after `k` rounds are `R_k = A_k / K_k`, in units `K_k`
//! as in [`super::children`], here with the rate in them: `K_0 = W_p` (so
//! `A_0` is the target's weights), and with draft rows `K_k = K_{k-1} /
//! f_k`, `f_k = fl(a_{k-1} / T_{k-1})` the round's factor, so that `A_k =
//! max(0, A_{k-1} - v rho_k)` up to the roundings with `rho_k = K_k / W_q`
//! (the removed child's draft weights `v`). Since `K_{k-1} T_{k-1}` is the
//! sum of `A_{k-1}` within the canonical sum's error (`Sigma`, its
//! interval), `K_k = Sigma / a` within a rounding: every `rho` is an
//! interval from the blocks' totals and the rates. One-hot drafts only set
//! the removed token's entry to 0 and track `T` as the float64 walk does
//! (`T := T (1 - Mb(x))`), so `K` stays `W_p` and `Sigma = W_p T`. In both,
//! `Mb(x) = A(x) / Sigma` within a rounding, `A(x)` from the exact weights
//! through the rounds ([`element`]).

use ndarray::{ArrayView2, Axis};

use super::{
    draft_round, draw, whole_row_draw, Blocks, CertifiedScratch, Interval, Row, Widening, STEP,
    TINY,
};
use crate::memory;
use crate::prob::Prob;
use crate::sample::SUM_BLOCK;
use crate::tree::TreeLinks;

/// The storage of one level of the walk's stack: the residual's terms and
/// blocks of the node there, and the kept terms and blocks of its own draft
/// row (read when it was entered, used when it is removed).
#[derive(Default)]
pub(in crate::logits) struct Level {
    terms: Vec<f32>,
    blocks: Blocks,
    draft_terms: Vec<f32>,
    draft_blocks: Blocks,
}

impl Level {
    fn reserve(&mut self, vocab: usize) -> Option<()> {
        for terms in [&mut self.terms, &mut self.draft_terms] {
            memory::reserve(terms, vocab, "target_logits").ok()?;
            if terms.len() < vocab {
                terms.resize(vocab, 0.0);
            }
        }
        self.blocks.reserve(vocab).ok()?;
        self.draft_blocks.reserve(vocab).ok()
    }
}

/// A round made at a node, as [`element`] replays it.
#[derive(Clone, Copy)]
enum Round<'a, Q> {
    /// `A := max(0, A - v rho)`: the removed child's draft row, `rho`, and the
    /// absolute error of an operation whose float64 result is below the
    /// normal range, in these units ([`tiny`]).
    Draft(Row<'a, Q>, Interval, f64),
    /// One-hot drafts: the removed child's token's entry set to 0.
    Zero(usize),
}

/// A node on the walk's stack.
struct Visit<'a, P, Q> {
    node: usize,
    /// Its rate `a` (the root's is exactly 1).
    rate: Interval,
    /// The next child to enter (`usize::MAX`: none left).
    child: usize,
    /// Its target row and the interval of `W_p`, once read (terms and blocks
    /// in its level).
    target: Option<(Row<'a, P>, Interval)>,
    /// Its own draft row and the interval of its `W_q` (`None`: the root,
    /// or one-hot drafts).
    draft: Option<(Row<'a, Q>, Interval)>,
    /// Its rounds are `rounds[from..]` of the walk's list.
    from: usize,
    /// `Sigma = K T` (`W_p` before any round).
    sigma: Interval,
    /// With one-hot drafts, the float64 walk's `T` (1 before any round).
    total: Interval,
}

/// `u < a` for every `a` in the interval, or for none.
fn below(u: f64, Interval(low, high): Interval) -> Option<bool> {
    if u < low {
        Some(true)
    } else if u >= high {
        Some(false)
    } else {
        None
    }
}

/// `a * b` for non-negative intervals, widened by a rounding.
fn times(Interval(a0, a1): Interval, Interval(b0, b1): Interval) -> Interval {
    Interval(a0 * b0, a1 * b1).widened(STEP)
}

/// `a / b` for non-negative intervals, `b` above 0, widened by a rounding.
fn over(Interval(a0, a1): Interval, Interval(b0, b1): Interval) -> Interval {
    Interval(a0 / b1, a1 / b0).widened(STEP)
}

/// Values at most this are taken as possibly 0 (or below the normal range)
/// where a decision needs them above 0.
const SMALL: f64 = 1e-290;

/// The absolute error of one float64 operation of a round whose result lies
/// below the normal range (at most `2^-1075`), in units `K` at most `k_high`,
/// rounded far up: [`TINY`] where that is larger.
fn tiny(k_high: f64) -> f64 {
    (k_high * 4.0 * f64::from_bits(1)).max(TINY)
}

/// `next_rho(a, mb, q)` (block verification's rate, docs/spec.md section
/// 2.6) over the intervals: exactly 0 where `mb` is exactly 0, exactly 1
/// where `q` is, else `min(1, fl(fl(a mb) / q))`'s interval; `None` where
/// a value may be 0 or below the normal range.
fn next_rate(a: Interval, mb: Interval, q: Interval) -> Option<Interval> {
    if mb.1 == 0.0 {
        return Some(Interval(0.0, 0.0));
    }
    if a.0 <= SMALL || mb.0 <= SMALL {
        return None;
    }
    if q.1 == 0.0 {
        return Some(Interval(1.0, 1.0));
    }
    if q.0 <= SMALL {
        return None;
    }
    let Interval(low, high) = over(times(a, mb), q);
    let rate = Interval(low.min(1.0), high.min(1.0));
    (rate.0 > SMALL).then_some(rate)
}

/// `h(S, a) = fl(S / fl(fl(S + 1) - a))` over the intervals, its numerator
/// and denominator bounded apart (rates may exceed 1 by the roundings, so `h`
/// need not be monotone in `S`). The denominator's roundings are absolute, up
/// to `u (S + 1)` each: the slack. `None` where `S` may be 0 or the
/// denominator may be.
fn h(Interval(s0, s1): Interval, Interval(a0, a1): Interval) -> Option<Interval> {
    if s0 <= SMALL {
        return None;
    }
    let slack = STEP * (s1 + 2.0);
    let (low, high) = (s0 + (1.0 - a1), s1 + (1.0 - a0));
    let smallest = low - STEP * low.abs() - slack;
    let largest = high + STEP * high.abs() + slack;
    (smallest > 0.0).then(|| Interval(s0 / largest, s1 / smallest).widened(STEP))
}

/// `A(i)` of a node after `rounds` (and `extra`, a round not made), from the
/// exact weights of its target row and of each round's draft row: the float64
/// walk's weight is in the interval times `1 / K`. A weight exactly 0 stays
/// 0 (`max(0, 0 f - q)`); so does an entry proved 0 by a round.
fn element<P: Prob, Q: Prob>(
    p_row: &Row<'_, P>,
    rounds: &[Round<'_, Q>],
    extra: Option<Round<'_, Q>>,
    i: usize,
) -> Interval {
    let w = p_row.weight(i);
    if w == 0.0 {
        return Interval(0.0, 0.0);
    }
    // A_0 = W_p fl(w_i / W_p): one rounding (below the normal range, absolute).
    let mut a = Interval((w * (1.0 - STEP) - TINY).max(0.0), w * (1.0 + STEP) + TINY);
    for round in rounds.iter().copied().chain(extra) {
        match round {
            Round::Zero(x) if x == i => return Interval(0.0, 0.0),
            Round::Zero(_) => {}
            Round::Draft(..) if a.1 == 0.0 => {}
            Round::Draft(row, rho, tiny) => {
                // `fl(R f)`: `K` takes `f` exactly, so one rounding.
                a = a.widened(STEP).minus_rounded(row.weight(i), rho, tiny);
            }
        }
    }
    a
}

/// The deepest level the walk keeps (each level holds two float32 rows):
/// deeper trees run the float64 walk.
const DEEPEST: usize = 64;

/// Float32 values of the levels a thread keeps between batch rows and calls
/// (32 MiB), as `POOLED_VALUES` keeps transformed rows.
const RETAINED: usize = 8 << 20;

/// Traversal verification of one batch row from its logits (`target`,
/// `draft`: its `[N, V]` rows; `None`: one-hot drafts), `1 / T` = `inverse`,
/// no filters, decided from the certified passes: the accepted node and the
/// next token, the float64 walk's bit for bit. `None` leaves the row to the
/// float64 walk (a decision the intervals leave open, a row the passes do
/// not apply to, a bad token or uniform, a tree deeper than [`DEEPEST`],
/// memory).
pub(in crate::logits) fn traversal<P: Prob, Q: Prob>(
    target: ArrayView2<'_, P>,
    draft: Option<ArrayView2<'_, Q>>,
    links: &TreeLinks<'_>,
    inverse: f64,
    recovery: f64,
    scratch: &mut CertifiedScratch,
) -> Option<(usize, usize)> {
    let found = walk(target, draft, links, inverse, recovery, scratch);
    // Each level holds two rows of `V`: keep at most RETAINED values.
    let keep = RETAINED / (2 * target.shape()[1]).max(1);
    scratch.levels.truncate(keep.max(1));
    found
}

/// [`traversal`]'s walk.
fn walk<P: Prob, Q: Prob>(
    target: ArrayView2<'_, P>,
    draft: Option<ArrayView2<'_, Q>>,
    links: &TreeLinks<'_>,
    inverse: f64,
    recovery: f64,
    scratch: &mut CertifiedScratch,
) -> Option<(usize, usize)> {
    let len = target.shape()[1];
    let CertifiedScratch {
        target: draw_blocks,
        residual: spare,
        levels,
        ..
    } = scratch;
    let target_row = |n: usize| target.index_axis_move(Axis(0), n);
    let draft_row = |c: usize| draft.map(|d| d.index_axis_move(Axis(0), c));
    // The relative error of a canonical sum of non-negative terms.
    let sum_error = (2 * (len.div_ceil(SUM_BLOCK) + SUM_BLOCK) + 64) as f64 * STEP;
    let one = Interval(1.0, 1.0);
    let mut rounds: Vec<Round<'_, Q>> = Vec::new();
    let mut stack: Vec<Visit<'_, P, Q>> = Vec::new();
    let visit = |node, rate: Interval, draft, from| Visit {
        node,
        rate,
        // Rate 0: its subtree is not visited (docs/spec.md section 7.6, step 1).
        child: if rate.1 == 0.0 {
            usize::MAX
        } else {
            links.first_child[node]
        },
        target: None,
        draft,
        from,
        sigma: one,
        total: one,
    };
    stack.push(visit(0, one, None, 0));
    let level = |levels: &mut Vec<Level>, d: usize| -> Option<()> {
        if d > DEEPEST {
            return None;
        }
        if levels.len() <= d {
            levels.resize_with(d + 1, Level::default);
        }
        levels[d].reserve(len)
    };
    level(levels, 0)?;
    loop {
        let d = stack.len() - 1;
        if stack[d].child != usize::MAX {
            // Enter the next child: its rate from the node's weights at its token.
            let c = stack[d].child;
            let x = (links.token)(c)?;
            let v = &mut stack[d];
            if v.target.is_none() {
                let row = Row::of(target_row(v.node), inverse)?;
                let lvl = &mut levels[d];
                let total = Interval::of_total(row.total(&mut lvl.blocks, Some(&mut lvl.terms)))?;
                // A_0 = W_p fl(w_i / W_p): one rounding of each weight.
                lvl.blocks.widen(STEP, 0.0);
                v.target = Some((row, total));
                v.sigma = total;
            }
            let (p_row, _) = v.target.as_ref().expect("read above");
            let mb = over(element(p_row, &rounds[v.from..], None, x), v.sigma);
            level(levels, d + 1)?;
            let (q_draft, q) = match draft_row(c) {
                None => (None, one), // one-hot drafts
                Some(row) => {
                    let row = Row::of(row, inverse)?;
                    let lvl = &mut levels[d + 1];
                    let blocks = &mut lvl.draft_blocks;
                    let total = Interval::of_total(row.total(blocks, Some(&mut lvl.draft_terms)))?;
                    (Some((row, total)), Interval::quotient(row.weight(x), total))
                }
            };
            let rate = next_rate(v.rate, mb, q)?;
            stack.push(visit(c, rate, q_draft, rounds.len()));
            continue;
        }
        let v = &stack[d];
        let uniform = |n: usize| (links.uniform)(n);
        if v.node == 0 || below(uniform(v.node)?, v.rate)? {
            // Accepted: the path to it, and the draw from its weights.
            let next = match &v.target {
                // No round changed its weights: the target row's draw.
                _ if rounds.len() == v.from => {
                    let row = target_row(v.node);
                    whole_row_draw(row, inverse, recovery, draw_blocks, Widening::DIVIDED)?
                }
                None => return None,
                Some((p_row, _)) => {
                    let blocks = &mut levels[d].blocks;
                    let rounds = &rounds[v.from..];
                    if draft.is_none() {
                        // The float64 walk draws from its weights `p_i`:
                        // divided, and a second canonical sum.
                        let Widening {
                            block, absolute, ..
                        } = Widening::DIVIDED;
                        blocks.widen(block, absolute);
                    }
                    draw(blocks, len, recovery, |i| element(p_row, rounds, None, i))?
                }
            };
            return Some((v.node, next));
        }
        // Rejected: removed, and its parent updated.
        let removed = stack.pop().expect("not the root");
        rounds.truncate(removed.from);
        let x = (links.token)(removed.node)?;
        let pd = d - 1;
        let (p_row, total_p) = stack[pd].target.expect("read when the child was entered");
        let parent = &stack[pd];
        // The round the update would make, as `element` replays it.
        let scale_next = over(parent.sigma, parent.rate);
        let round = match &removed.draft {
            None => Round::Zero(x),
            Some((q_row, total_q)) => {
                let rho = over(scale_next, *total_q);
                // `rho'` a normal float32, every bound finite.
                if !(1e-30..=1e30).contains(&(0.5 * (rho.0 + rho.1))) || !rho.1.is_finite() {
                    return None;
                }
                Round::Draft(*q_row, rho, tiny(scale_next.1))
            }
        };
        if parent.node != 0 && !below(uniform(parent.node)?, parent.rate)? {
            // Step 3: no update where no later child can enter with a rate above 0.
            let mut later_all_zero = true;
            let mut j = links.next_sibling[removed.node];
            while j != usize::MAX {
                let xj = (links.token)(j)?;
                let e = element(&p_row, &rounds[parent.from..], Some(round), xj);
                if e.0 > 0.0 {
                    later_all_zero = false;
                    break;
                }
                if e.1 > 0.0 {
                    return None;
                }
                j = links.next_sibling[j];
            }
            if later_all_zero {
                stack[pd].child = usize::MAX;
                continue;
            }
        }
        let (lower, upper) = levels.split_at_mut(d);
        let lvl = &mut lower[pd];
        let from = parent.from;
        let (mass, sigma, total) = match round {
            Round::Zero(_) => {
                // One-hot: Mb(x) from the weights so far, x's entry 0, T and the
                // mass by the float64 walk's products.
                let mb = over(element(&p_row, &rounds[from..], None, x), parent.sigma);
                let rest = Interval(1.0 - mb.1, 1.0 - mb.0).widened(STEP);
                if rest.0 <= SMALL {
                    return None;
                }
                lvl.blocks.zero_entry(&mut lvl.terms[..len], x, 0.0);
                let total = times(parent.total, rest);
                (times(parent.rate, rest), times(total_p, total), total)
            }
            Round::Draft(q_row, rho, tiny) => {
                rounds.push(round);
                let x_high = element(&p_row, &rounds[from..], None, x).1;
                let q_level = &mut upper[0];
                let q_side = (
                    &q_row,
                    &mut q_level.draft_terms[..len],
                    &q_level.draft_blocks,
                );
                let a_side = (&mut lvl.terms[..len], &mut lvl.blocks);
                draft_round(a_side, q_side, spare, (rho, tiny), (x, x_high));
                let Interval(low, high) = Interval::of_total(lvl.blocks.total())?;
                let sigma = Interval(low * (1.0 - sum_error), high * (1.0 + sum_error));
                // The mass is the canonical sum, T = Sigma / K.
                let mass = over(sigma, scale_next);
                (mass, sigma, mass)
            }
        };
        if let Round::Zero(_) = round {
            rounds.push(round);
        }
        let p = &mut stack[pd];
        if p.node != 0 {
            p.rate = h(mass, p.rate)?;
        }
        p.sigma = sigma;
        p.total = total;
        p.child = links.next_sibling[removed.node];
    }
}

#[cfg(test)]
mod tests {
    use ndarray::{Array1, Array2, Array3};

    use super::*;
    use crate::error::RowErrors;
    use crate::logits::tree::{verify_tree_logits, TreeLogitsInputs};
    use crate::tree::{TreeMethod, TreeOutputs};
    use crate::view::{FloatView, IntView};

    /// splitmix64: uniforms in `[0, 1)` and normal draws, reproducibly.
    struct Draws(u64);

    impl Draws {
        fn unit(&mut self) -> f64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
        }

        fn normal(&mut self) -> f64 {
            let (a, b) = (self.unit().max(1e-300), self.unit());
            (-2.0 * a.ln()).sqrt() * (std::f64::consts::TAU * b).cos()
        }
    }

    /// The tree shapes of the benchmarks: 3 x 4, three chains of four, and a
    /// binary tree of depth 3.
    fn shapes() -> [Vec<i64>; 3] {
        let wide = [-1, 0, 0, 0]
            .into_iter()
            .chain((4..16).map(|n| 1 + (n - 4) / 4));
        [
            wide.collect(),
            vec![-1, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9],
            (0..15)
                .map(|n| if n == 0 { -1 } else { (n - 1) / 2 })
                .collect(),
        ]
    }

    /// One batch of trees: logits, drafted tokens (sampled from the draft
    /// rows), uniforms; the float64 walk's outputs (forced by `top_k = V`)
    /// against the walk from the certified passes row by row. Returns the rows
    /// it decided and the rows in all.
    fn compare(
        parents: &[i64],
        one_hot: bool,
        sigma: f64,
        low_u: bool,
        seed: u64,
    ) -> (usize, usize) {
        let (batch, nodes, vocab) = (12, parents.len(), 700);
        let mut draws = Draws(seed);
        let target =
            Array3::from_shape_fn((batch, nodes, vocab), |_| (2.0 * draws.normal()) as f32);
        // Draft row `c` is the distribution child `c` was drawn from: near its
        // parent's target row.
        let draft = Array3::from_shape_fn((batch, nodes, vocab), |(b, c, i)| {
            let parent = parents[c].max(0) as usize;
            let near = if sigma > 0.0 {
                target[[b, parent, i]]
            } else {
                0.0
            };
            near + (sigma.max(1.0) * draws.normal()) as f32
        });
        let temperature = 0.8;
        let mut tokens = Array2::<i64>::zeros((batch, nodes));
        for ((b, n), token) in tokens.indexed_iter_mut() {
            let row = draft.slice(ndarray::s![b, n, ..]);
            let weights: Vec<f64> = row
                .iter()
                .map(|&l| (f64::from(l) / temperature).exp())
                .collect();
            let mut r = draws.unit() * weights.iter().sum::<f64>();
            *token = weights
                .iter()
                .position(|&w| {
                    r -= w;
                    r < 0.0
                })
                .unwrap_or(vocab - 1) as i64;
        }
        let uniforms = Array2::from_shape_fn((batch, nodes), |_| {
            let u = draws.unit();
            if low_u {
                u * 0.1
            } else {
                u
            }
        });
        let recovery = Array1::from_shape_fn(batch, |_| draws.unit());
        let parent_ids = Array2::from_shape_fn((batch, nodes), |(_, n)| parents[n]);
        let (t, p) = (
            Array1::from_elem(batch, temperature),
            Array1::from_elem(batch, 1.0),
        );
        let k = Array1::from_elem(batch, vocab as i64); // keeps every token: no look
        let inputs = TreeLogitsInputs {
            node_token_ids: IntView::I64(tokens.view()),
            parent_ids: IntView::I64(parent_ids.view()),
            target_logits: target.view(),
            draft_logits: (!one_hot).then(|| draft.view()),
            temperature: FloatView::F64(t.view()),
            top_k: IntView::I64(k.view()),
            top_p: FloatView::F64(p.view()),
            min_p: None,
            min_p_last: false,
            uniforms: Some(FloatView::F64(uniforms.view())),
            recovery_uniforms: Some(FloatView::F64(recovery.view())),
            method: TreeMethod::Traversal,
        };
        let mut ids = Array2::<i64>::zeros((batch, nodes + 1));
        let mut accepted = Array2::<i64>::zeros((batch, nodes));
        let (mut num, mut emitted) = (Array1::<i64>::zeros(batch), Array1::<i64>::zeros(batch));
        let mut out = TreeOutputs {
            output_token_ids: ids.view_mut(),
            num_accepted: num.view_mut(),
            num_emitted: emitted.view_mut(),
            accepted_node_ids: accepted.view_mut(),
        };
        verify_tree_logits(&inputs, &mut out, RowErrors::Raise).expect("valid inputs");
        let mut scratch = CertifiedScratch::default();
        scratch.reserve(vocab).expect("memory");
        let mut decided = 0;
        for b in 0..batch {
            let (mut first_child, mut next_sibling) =
                (vec![usize::MAX; nodes], vec![usize::MAX; nodes]);
            for n in (1..nodes).rev() {
                let parent = parents[n] as usize;
                next_sibling[n] = first_child[parent];
                first_child[parent] = n;
            }
            let links = TreeLinks {
                first_child: &first_child,
                next_sibling: &next_sibling,
                token: &|c| Some(tokens[[b, c]] as usize),
                uniform: &|n| Some(uniforms[[b, n]]),
            };
            let rows = target.index_axis(Axis(0), b);
            let drafts = (!one_hot).then(|| draft.index_axis(Axis(0), b));
            let found = traversal(
                rows,
                drafts,
                &links,
                1.0 / temperature,
                recovery[b],
                &mut scratch,
            );
            let Some((node, next)) = found else { continue };
            decided += 1;
            let depth = num[b] as usize;
            assert_eq!(next as i64, ids[[b, depth]], "row {b}: the next token");
            let last = if depth == 0 {
                0
            } else {
                accepted[[b, depth - 1]]
            };
            assert_eq!(node as i64, last, "row {b}: the accepted node");
        }
        (decided, batch)
    }

    #[test]
    fn a_tree_deeper_than_the_levels_kept_runs_the_float64_walk() {
        // Chains: one of 70 nodes (down to depth 69) is left to the float64
        // walk, one of 40 decided; both agree with it.
        let chain = |nodes: i64| (0..nodes).map(|n| n - 1).collect::<Vec<_>>();
        assert_eq!(compare(&chain(70), false, 1.0, true, 99).0, 0);
        assert!(compare(&chain(40), false, 1.0, true, 98).0 > 0);
    }

    #[test]
    fn the_walk_from_the_certified_passes_is_the_float64_walk() {
        // Drafters: the target plus N(0, 1) noise, plus N(0, 3²), or
        // unrelated; draft rows or one-hot; uniforms in [0, 1) or [0, 0.1)
        // (more acceptances deep in the tree).
        let (mut decided, mut rows) = (0, 0);
        let mut seed = 0;
        for parents in shapes() {
            for one_hot in [false, true] {
                for sigma in [1.0, 3.0, 0.0] {
                    for low_u in [false, true] {
                        seed += 1;
                        let (d, n) = compare(&parents, one_hot, sigma, low_u, seed);
                        (decided, rows) = (decided + d, rows + n);
                    }
                }
            }
        }
        // The look must decide, not only agree where it does.
        assert!(decided * 10 >= rows * 9, "decided {decided} of {rows} rows");
    }
}
