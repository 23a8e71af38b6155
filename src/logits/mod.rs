//! Verification from logits: the sampling transform (temperature, softmax,
//! top-k, top-p) applied only to the rows a batch row reads, with early exit.
//!
//! The transform of a logits row `l` with temperature `T > 0`:
//! `e_i = exp((l_i - max l) / T)` (softmax's `exp(z_i - max z)` of `z = l / T`,
//! without overflow for small `T`); top-k keeps the entries with `e_i` at
//! least the k-th largest (ties kept); top-p keeps, in decreasing order, the
//! shortest prefix whose mass reaches `top_p` of what top-k kept, plus every
//! entry tied with the last one kept; min-p keeps `e_i >= min_p` (`p_i >= min_p *
//! max p`), before top-k and top-p (vLLM's order: top-p then reaches `top_p` of
//! what min-p and top-k kept) or after them (`min_p_last`, transformers' order).
//! Every filter is a threshold on `e`, so the
//! result is `w_i = e_i` for `e_i >= theta`, else 0, normalised by `sum(w)`.
//! `T = 0` makes the row greedy (the argmax of the logits, which every filter keeps).
//!
//! Where each number is computed, per position up to the first rejection:
//! - `screen.rs` (unfiltered f16/f32 rows): one read of each row, an `f32`
//!   `exp` and a certified bound on `sum(w)`, which proves most accepted
//!   positions accepted without the exact pass;
//! - `sparse.rs` (top-k rows): `p(x)` exactly from top-k's few candidates,
//!   which decides accepted positions without the dense transform;
//! - `exact.rs`: otherwise, the max, the float64 `exp` and the canonical sum
//!   (`w` and `sum(w)`), then in this module the filters of `transform`,
//!   whose thresholds come from `filters.rs` (selection among a few
//!   candidates, never a sort of the vocabulary);
//! - here: the rule, and on a rejection the residual of the two exact rows,
//!   sampled; when all are accepted, the bonus row, exact, sampled.

pub mod certified;
pub mod exact;
mod filters;
pub mod flat;
pub mod screen;
mod sparse;
pub mod tree;

use std::cell::RefCell;

use ndarray::{s, ArrayView1, ArrayView2, ArrayView3, ArrayViewMut1, Ix1, Ix2};

use certified::{Certified, CertifiedScratch};
use exact::{row_exp_sum, row_max};
use filters::{kth_largest, kth_largest_block_max, top_p_floor, top_p_threshold};
use sparse::{top_k_accepts, SparseScratch};

use crate::block;
use crate::chain::ChainOutputs;
use crate::checks::{
    check_gathered, check_token, check_uniform, draft_len, expect_shape, Pos, RowAt,
};
use crate::error::{show, CoreError, RowErrors};
use crate::lossy::TypicalRow;
use crate::memory;
use crate::method::Method;
use crate::prob::Prob;
use crate::rule::is_accepted;
use crate::sample::{self, BufferWeights, SUM_BLOCK};
use crate::simd::{PairOp, Residual, ScaledResidual};
use crate::threads;
use crate::view::{FloatView, IntView};

/// The inputs of `verify_logits` (per-row parameters already broadcast to `[B]`).
pub struct LogitsInputs<'a, P, Q> {
    /// `[B, K]` drafted tokens.
    pub draft_token_ids: IntView<'a, Ix2>,
    /// Target logits: `[B, K+1, V]`, or the flat layout's rows.
    pub target_logits: Rows<'a, P>,
    /// Draft logits `[B, K, V]` (or flat), draft probabilities, or none
    /// (deterministic drafts).
    pub draft: Draft<'a, Q>,
    /// `[B]` temperatures, `>= 0` (0: greedy).
    pub temperature: FloatView<'a, Ix1>,
    /// `[B]` top-k, `>= 0` (0: off).
    pub top_k: IntView<'a, Ix1>,
    /// `[B]` top-p in `(0, 1]` (1: off).
    pub top_p: FloatView<'a, Ix1>,
    /// `[B]` min-p in `[0, 1]` (0: off); `None`: off for every row.
    pub min_p: Option<FloatView<'a, Ix1>>,
    /// Min-p after top-k and top-p (transformers' order), else before (vLLM's).
    pub min_p_last: bool,
    pub num_draft_tokens: Option<IntView<'a, Ix1>>,
    pub uniforms: Option<FloatView<'a, Ix2>>,
    pub recovery_uniforms: Option<FloatView<'a, Ix1>>,
    /// `[B, K]` the drafter's own `q_t(x_t)`, or `None`: with them an accepted
    /// position reads no draft row (docs/spec.md section 8.7).
    pub draft_token_probs: Option<FloatView<'a, Ix2>>,
    /// How sampled rows decide their prefix (see [`crate::method::Method`]).
    pub method: Method<'a>,
}

/// Where the rows `(b, t)` of a logits (or draft probabilities) input are.
#[derive(Clone, Copy)]
pub enum Rows<'a, L> {
    /// `[B, K(+1), V]`: row `(b, t)` is `[b, t, :]`.
    Padded(ArrayView3<'a, L>),
    /// The flat layout of serving engines, `[R, V]`: row `(b, t)` is
    /// `[starts[b] + t, :]`, request `b`'s rows back to back (vLLM's logits:
    /// its drafted positions, then its bonus position). Each request's rows
    /// are checked to lie inside `[0, R)` before any is read
    /// ([`Rows::check_fits`]).
    Flat {
        rows: ArrayView2<'a, L>,
        starts: IntView<'a, Ix1>,
        /// The argument's name, for errors (the flat layout's callers name
        /// their arrays differently: vLLM's `logits`, `draft_probs`).
        arg: &'static str,
    },
}

impl<'a, L> Rows<'a, L> {
    /// The number of entries of a row.
    pub fn vocab(&self) -> usize {
        match self {
            Rows::Padded(a) => a.shape()[2],
            Rows::Flat { rows, .. } => rows.shape()[1],
        }
    }

    /// Row `(b, t)`; inside the array for every `t < n` once
    /// `check_fits(b, n)` has passed.
    #[inline]
    pub fn row(&self, b: usize, t: usize) -> ArrayView1<'_, L> {
        match self {
            Rows::Padded(a) => a.slice(s![b, t, ..]),
            Rows::Flat { rows, starts, .. } => rows.row(starts.get(b) as usize + t),
        }
    }

    /// The argument's name in errors: `padded`, or the flat layout's own.
    pub(crate) fn arg(&self, padded: &'static str) -> &'static str {
        match self {
            Rows::Padded(_) => padded,
            Rows::Flat { arg, .. } => arg,
        }
    }

    /// Where row `(b, t)` is, to name it in errors.
    #[inline]
    pub(crate) fn pos(&self, b: usize, t: usize) -> Pos {
        match self {
            Rows::Padded(_) => Pos::Padded { b, t },
            Rows::Flat { starts, .. } => Pos::Flat {
                row: starts.get(b) as usize + t,
            },
        }
    }

    /// Row `b`'s first `n` rows lie inside the array (the padded layout's
    /// shape was checked with the other shapes).
    fn check_fits(&self, b: usize, n: usize) -> Result<(), CoreError> {
        let Rows::Flat { rows, starts, arg } = self else {
            return Ok(());
        };
        let start = starts.get(b);
        let total = rows.shape()[0];
        if start < 0 || (start as u64).saturating_add(n as u64) > total as u64 {
            return Err(CoreError::value(
                arg,
                &[b],
                format!("= {start}: request {b}'s {n} rows do not lie inside the {total} rows"),
            ));
        }
        Ok(())
    }
}

/// The draft side of `verify_logits`.
#[derive(Clone, Copy)]
pub enum Draft<'a, Q> {
    /// Deterministic drafts: `q` one-hot at the draft.
    OneHot,
    /// Logits, transformed as the target's are (docs/spec.md section 8.2).
    Logits(Rows<'a, Q>),
    /// The drafter's probabilities, read as they are (docs/spec.md section
    /// 9.1's `verify_logits`): vLLM's drafter samples from
    /// `softmax(logits / T)` without the target's filters.
    Probs(Rows<'a, Q>),
}

impl<'a, Q> Draft<'a, Q> {
    fn rows(&self) -> Option<&Rows<'a, Q>> {
        match self {
            Draft::OneHot => None,
            Draft::Logits(rows) | Draft::Probs(rows) => Some(rows),
        }
    }

    fn arg(&self) -> &'static str {
        match self {
            Draft::Probs(_) => "draft_probs",
            _ => "draft_logits",
        }
    }
}

/// How far a given `q_t(x_t)` may lie from the draft row's own value at the
/// position where the row is read (relative, and absolute for tiny values):
/// a drafter's float32 or float16 softmax differs from the float64 transform
/// by far less; a wrong position, temperature or filter by far more.
pub const DRAFT_PROB_TOLERANCE: (f64, f64) = (1e-2, 1e-6);

#[derive(Clone, Copy)]
struct Params {
    temperature: f64,
    top_k: usize,
    top_p: f64,
    /// `0` (off) to `1`: keeps `e_i >= min_p`, the largest `e` being 1.
    min_p: f64,
    /// Min-p after top-k and top-p (transformers), else before them (vLLM).
    min_p_last: bool,
}

impl Params {
    /// No filter applies: the screens and the certified draws may decide.
    fn unfiltered(&self) -> bool {
        self.top_k == 0 && self.top_p >= 1.0 && self.min_p == 0.0
    }

    /// The weight floor min-p sets before top-k and top-p (0 when it comes last).
    fn min_p_first(&self) -> f64 {
        if self.min_p_last {
            0.0
        } else {
            self.min_p
        }
    }

    /// The weight floor min-p sets after top-k and top-p (0 when it came first).
    fn min_p_after(&self) -> f64 {
        if self.min_p_last {
            self.min_p
        } else {
            0.0
        }
    }
}

/// Row `b`'s sampling parameters, checked (the inputs' `[B]` arrays; `min_p`
/// `None`: off).
pub(crate) struct SamplingViews<'v, 'a> {
    pub temperature: &'v FloatView<'a, Ix1>,
    pub top_k: &'v IntView<'a, Ix1>,
    pub top_p: &'v FloatView<'a, Ix1>,
    pub min_p: Option<&'v FloatView<'a, Ix1>>,
    pub min_p_last: bool,
}

/// Scratch space of one thread: block sums and the selection buffer.
#[derive(Default)]
struct Scratch {
    block_sums: Vec<f64>,
    /// Top-k's candidates in index order (the weights at least its floor).
    candidates: Vec<f64>,
    /// Values being selected or sorted.
    selection: Vec<f64>,
    /// Mass per bucket of weights (see [`top_p_floor`]).
    histogram: Vec<f64>,
}

/// The row buffers of one thread: the transformed target and draft rows, the
/// residual and the scratch space, `O(V)` each.
#[derive(Default)]
struct Buffers {
    wp: Vec<f64>,
    wq: Vec<f64>,
    residual: Vec<f64>,
    scratch: Scratch,
    sparse: SparseScratch,
    certified: CertifiedScratch,
}

impl Buffers {
    /// Room for rows of `vocab` logits in every buffer that grows with `V`,
    /// so that a row too large for this process is a `MemoryError` up front.
    fn reserve(&mut self, vocab: usize) -> Result<(), CoreError> {
        let blocks = vocab.div_ceil(SUM_BLOCK);
        let arg = "target_logits";
        memory::reserve(&mut self.wp, vocab, arg)?;
        memory::reserve(&mut self.wq, vocab, arg)?;
        memory::reserve(&mut self.residual, vocab, arg)?;
        memory::reserve(&mut self.scratch.block_sums, blocks, arg)?;
        memory::reserve(&mut self.scratch.candidates, vocab, arg)?;
        memory::reserve(&mut self.scratch.selection, vocab, arg)?;
        self.certified.reserve(vocab)?;
        self.sparse.reserve(vocab)
    }
}

thread_local! {
    /// See [`threads::with_buffers`]: about `4 V` float64 values stay
    /// allocated per thread.
    static BUFFERS: RefCell<Buffers> = RefCell::default();
}

/// One logits row of `arg` at `pos` and, where the screen has read it, its
/// max (the screen also found it valid).
struct LogitsRow<'a, L> {
    logits: ArrayView1<'a, L>,
    arg: &'static str,
    pos: Pos,
    max: Option<f64>,
}

/// What a look at a drafted token found without transforming its rows (the
/// screens, or top-k's candidates): whether the token rule surely accepts it,
/// and the maxima of the rows it read whole (each found valid), for the
/// transforms that follow where it is not accepted.
#[derive(Clone, Copy, Default)]
struct Look {
    accepted: bool,
    target_max: Option<f64>,
    draft_max: Option<f64>,
}

/// Transforms logits row `row` into weights `w` (`e_i` kept, else 0) and
/// returns `sum(w)`. Errors name `arg` at `pos` (and element `i`).
fn transform<L: Prob>(
    row: LogitsRow<'_, L>,
    params: Params,
    w: &mut Vec<f64>,
    scratch: &mut Scratch,
) -> Result<f64, CoreError> {
    let LogitsRow {
        logits: row,
        arg,
        pos,
        max,
    } = row;
    // Every entry is written below (pass 2), so only the length matters.
    w.resize(row.len(), 0.0);
    let inverse = 1.0 / params.temperature;
    let mut strided: Vec<L>;
    let values: &[L] = match row.as_slice() {
        Some(values) => values,
        None => {
            strided = memory::with_capacity(row.len(), arg)?;
            strided.extend(row.iter().copied());
            &strided
        }
    };
    let (ok, max) = match max {
        Some(max) => (true, max), // the screen's: the row is valid
        None => row_max(values),
    };
    if !ok {
        let (i, v) = values
            .iter()
            .map(|l| l.to_f64())
            .enumerate()
            .find(|(_, v)| v.is_nan() || *v == f64::INFINITY)
            .unwrap_or((0, f64::NAN));
        return Err(CoreError::value(
            arg,
            &pos.element(i),
            format!("= {}: logits must be finite or -inf", show(v)),
        ));
    }
    if max == f64::NEG_INFINITY {
        return Err(CoreError::value(
            arg,
            &pos.index(),
            "has no finite logit: there is no token to choose",
        ));
    }
    let total = row_exp_sum(values, inverse, max, w);
    if params.unfiltered() {
        return Ok(total);
    }
    // Min-p first (vLLM's order), then top-k: thresholds, the larger one wins
    // (both keep a head of the weights in decreasing order).
    let mut threshold = params.min_p_first();
    if params.top_k > 0 {
        // The k-th largest of the block maxima is a lower bound of the k-th
        // largest weight (k blocks each hold a weight at least that large), so
        // selecting among the weights above it finds the same value from a
        // few candidates instead of V.
        let floor = kth_largest_block_max(w, params.top_k, &mut scratch.selection);
        scratch.candidates.clear();
        scratch
            .candidates
            .extend(w.iter().copied().filter(|&e| e > 0.0 && e >= floor));
        // A positive floor leaves at least k candidates; without one, fewer
        // than k positive weights keep them all.
        if floor > 0.0 || params.top_k < scratch.candidates.len() {
            scratch.selection.clear();
            scratch.selection.extend_from_slice(&scratch.candidates);
            threshold = threshold.max(kth_largest(&mut scratch.selection, params.top_k));
        }
    }
    // Top-p over what top-k kept: a growing sorted head until the mass is reached.
    if params.top_p < 1.0 {
        // What top-k (and min-p, first) kept, in index order, and its mass:
        // from top-k's candidates (every weight at least the threshold is
        // one), or without top-k every positive weight at least min-p's floor
        // (of mass `total` without min-p); of those, only the weights above a
        // floor from a histogram can be in the top-p set (the kept weights are
        // a head of the sorted row, so the floor of the whole row holds).
        scratch.selection.clear();
        let kept_total = if params.top_k > 0 {
            let kept = |&e: &f64| e >= threshold;
            let candidates = scratch.candidates.iter().copied();
            scratch.selection.extend(candidates.filter(kept));
            sample::canonical_sum(
                &BufferWeights {
                    w: &scratch.selection,
                },
                &mut scratch.block_sums,
            )?
        } else {
            let kept_total = if threshold > 0.0 {
                let kept = |&e: &f64| e > 0.0 && e >= threshold;
                scratch.selection.extend(w.iter().copied().filter(kept));
                let kept_total = sample::canonical_sum(
                    &BufferWeights {
                        w: &scratch.selection,
                    },
                    &mut scratch.block_sums,
                )?;
                scratch.selection.clear();
                kept_total
            } else {
                total
            };
            let floor =
                top_p_floor(w, params.top_p * kept_total, &mut scratch.histogram).max(threshold);
            let kept = |&e: &f64| e > 0.0 && e >= floor;
            scratch.selection.extend(w.iter().copied().filter(kept));
            kept_total
        };
        let target = params.top_p * kept_total;
        threshold = threshold.max(top_p_threshold(&mut scratch.selection, target));
    }
    // Min-p last (transformers' order): its floor over what top-k and top-p kept.
    threshold = threshold.max(params.min_p_after());
    if threshold > 0.0 {
        for e in w.iter_mut() {
            *e = if *e < threshold { 0.0 } else { *e }; // branchless: it vectorises
        }
    }
    sample::canonical_sum(&BufferWeights { w }, &mut scratch.block_sums)
}

fn params(views: &SamplingViews<'_, '_>, b: usize) -> Result<Params, CoreError> {
    let temperature = views.temperature.get(b);
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
    let top_k = views.top_k.get(b);
    if top_k < 0 {
        return Err(CoreError::value(
            "top_k",
            &[b],
            format!("= {top_k}: top_k must be >= 0"),
        ));
    }
    let top_p = views.top_p.get(b);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(CoreError::value(
            "top_p",
            &[b],
            format!("= {}: top_p must lie in (0, 1]", show(top_p)),
        ));
    }
    let min_p = views.min_p.map_or(0.0, |m| m.get(b));
    if !(0.0..=1.0).contains(&min_p) {
        return Err(CoreError::value(
            "min_p",
            &[b],
            format!("= {}: min_p must lie in [0, 1]", show(min_p)),
        ));
    }
    Ok(Params {
        temperature,
        top_k: usize::try_from(top_k).unwrap_or(usize::MAX),
        top_p,
        min_p,
        min_p_last: views.min_p_last,
    })
}

fn argmax_logits<L: Prob>(
    row: ArrayView1<'_, L>,
    arg: &'static str,
    pos: Pos,
) -> Result<usize, CoreError> {
    // A contiguous valid row: the vectorised max, then its first index (the
    // same index as the loop below, which also finds the errors).
    if let Some(values) = row.as_slice() {
        let (ok, max) = row_max(values);
        if ok && max > f64::NEG_INFINITY {
            if let Some(i) = values.iter().position(|l| l.to_f64() == max) {
                return Ok(i);
            }
        }
    }
    let mut best: Option<(usize, f64)> = None;
    for (i, l) in row.iter().enumerate() {
        let v = l.to_f64();
        if v.is_nan() || v == f64::INFINITY {
            return Err(CoreError::value(
                arg,
                &pos.element(i),
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
            &pos.index(),
            "has no finite logit: there is no token to choose",
        )
    })
}

impl<'a, P: Prob, Q: Prob> LogitsInputs<'a, P, Q> {
    /// The per-row sampling parameters, for [`params`].
    fn sampling(&self) -> SamplingViews<'_, 'a> {
        SamplingViews {
            temperature: &self.temperature,
            top_k: &self.top_k,
            top_p: &self.top_p,
            min_p: self.min_p.as_ref(),
            min_p_last: self.min_p_last,
        }
    }

    /// Checks every shape against `draft_token_ids [B, K]` and
    /// `target_logits [B, K+1, V]` (or the flat layout's `[R, V]` with
    /// `[B]` starts); returns `(B, K, V)`.
    pub fn dims(&self) -> Result<(usize, usize, usize), CoreError> {
        let &[batch, k_max] = self.draft_token_ids.shape() else {
            unreachable!("IntView<Ix2> has two axes")
        };
        let vocab = self.target_logits.vocab();
        fn rows_shape<L>(
            arg: &'static str,
            rows: &Rows<'_, L>,
            (batch, padded, vocab): (usize, usize, usize),
            what: &str,
        ) -> Result<(), CoreError> {
            match rows {
                Rows::Padded(a) => expect_shape(arg, a.shape(), &[batch, padded, vocab], what),
                Rows::Flat { rows, starts, arg } => {
                    expect_shape(arg, rows.shape(), &[rows.shape()[0], vocab], "[R, V]")?;
                    expect_shape(arg, starts.shape(), &[batch], "[B]")
                }
            }
        }
        let target = (batch, k_max + 1, vocab);
        rows_shape("target_logits", &self.target_logits, target, "[B, K+1, V]")?;
        if let Some(rows) = self.draft.rows() {
            rows_shape(self.draft.arg(), rows, (batch, k_max, vocab), "[B, K, V]")?;
        }
        for (arg, shape) in [
            ("temperature", self.temperature.shape()),
            ("top_k", self.top_k.shape()),
            ("top_p", self.top_p.shape()),
        ] {
            expect_shape(arg, shape, &[batch], "a scalar or [B]")?;
        }
        if let Some(m) = &self.min_p {
            expect_shape("min_p", m.shape(), &[batch], "a scalar or [B]")?;
        }
        if let Some(c) = &self.num_draft_tokens {
            expect_shape("num_draft_tokens", c.shape(), &[batch], "[B]")?;
        }
        if let Some(u) = &self.uniforms {
            expect_shape("uniforms", u.shape(), &[batch, k_max], "[B, K]")?;
        }
        if let Some(u) = &self.recovery_uniforms {
            expect_shape("recovery_uniforms", u.shape(), &[batch], "[B]")?;
        }
        if let Some(q) = &self.draft_token_probs {
            expect_shape("draft_token_probs", q.shape(), &[batch, k_max], "[B, K]")?;
            if !matches!(self.draft, Draft::Logits(_)) {
                return Err(CoreError::shape(
                    "draft_token_probs",
                    "needs draft_logits (the rows the drafts were sampled from)",
                ));
            }
            if self.method != Method::Token {
                return Err(CoreError::shape(
                    "draft_token_probs",
                    "applies to method=\"token\"",
                ));
            }
        }
        Ok((batch, k_max, vocab))
    }
}

/// Verification from logits (see the module docs); the same rule, outputs and
/// [`RowErrors`] as [`crate::chain::verify`] on the transformed probabilities.
pub fn verify_logits<P: Prob, Q: Prob>(
    inputs: &LogitsInputs<'_, P, Q>,
    out: &mut ChainOutputs<'_>,
    errors: RowErrors<'_>,
) -> Result<(), CoreError> {
    let (batch, k_max, vocab) = inputs.dims()?;
    inputs.method.check(k_max)?;
    if out.output_token_ids.shape() != [batch, k_max + 1] {
        return Err(CoreError::shape(
            "out",
            "output shapes do not match [B, K+1]",
        ));
    }
    errors.check(batch)?;
    // Each row transforms at least one target row (and a draft row) of V.
    let rows_read = if inputs.draft.rows().is_some() { 2 } else { 1 };
    let out = ChainOutputs {
        output_token_ids: out.output_token_ids.view_mut(),
        num_accepted: out.num_accepted.view_mut(),
        num_emitted: out.num_emitted.view_mut(),
    };
    threads::in_runs(
        batch.saturating_mul(rows_read * vocab),
        (out, errors),
        |first_row, (mut part, mut errors)| {
            threads::with_buffers(&BUFFERS, |buffers| {
                verify_rows(inputs, first_row, &mut part, &mut errors, buffers)
            })
        },
    )
}

/// Verifies rows `first_row..` into `out` (which holds exactly those rows).
fn verify_rows<P: Prob, Q: Prob>(
    inputs: &LogitsInputs<'_, P, Q>,
    first_row: usize,
    out: &mut ChainOutputs<'_>,
    errors: &mut RowErrors<'_>,
    buffers: &mut Buffers,
) -> Result<(), CoreError> {
    let vocab = inputs.target_logits.vocab();
    buffers.reserve(vocab)?;
    for i in 0..out.num_accepted.len() {
        let b = first_row + i;
        let mut row: ArrayViewMut1<'_, i64> = out.output_token_ids.row_mut(i);
        row.fill(-1);
        match verify_row(inputs, b, buffers) {
            Ok((ids, n, next)) => {
                for (t, &x) in ids.iter().take(n).enumerate() {
                    row[t] = x as i64;
                }
                row[n] = next as i64;
                out.num_accepted[i] = n as i64;
                out.num_emitted[i] = n as i64 + 1;
            }
            Err(error) => {
                errors.record(i, error.in_row(b))?;
                out.num_accepted[i] = 0;
                out.num_emitted[i] = 0;
            }
        }
    }
    Ok(())
}

/// Verifies row `b`: its checked drafts, `n_b` and the next token.
fn verify_row<P: Prob, Q: Prob>(
    inputs: &LogitsInputs<'_, P, Q>,
    b: usize,
    buffers: &mut Buffers,
) -> Result<(Vec<usize>, usize, usize), CoreError> {
    let k_max = inputs.draft_token_ids.shape()[1];
    let vocab = inputs.target_logits.vocab();
    let params = params(&inputs.sampling(), b)?;
    let k = draft_len(inputs.num_draft_tokens.as_ref(), b, k_max)?;
    inputs.target_logits.check_fits(b, k + 1)?;
    if let Some(rows) = inputs.draft.rows() {
        rows.check_fits(b, k)?;
    }
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
    let argmax = |t: usize| {
        let rows = &inputs.target_logits;
        argmax_logits(rows.row(b, t), rows.arg("target_logits"), rows.pos(b, t))
    };
    let (n, next) = if params.temperature == 0.0 {
        let mut n = k;
        let mut next = None;
        for (t, &x) in ids.iter().enumerate() {
            let best = argmax(t)?;
            if best != x {
                n = t;
                next = Some(best);
                break;
            }
        }
        let next = match next {
            Some(best) => best,
            None => argmax(k)?,
        };
        (n, next)
    } else {
        let (Some(uniforms), Some(recovery)) = (&inputs.uniforms, &inputs.recovery_uniforms) else {
            return Err(CoreError::shape(
                "uniforms",
                "uniforms and recovery_uniforms are required for rows verified by sampling",
            ));
        };
        for t in 0..k {
            check_uniform(uniforms.get(b, t), "uniforms", &[b, t])?;
        }
        let recovery_u = check_uniform(recovery.get(b), "recovery_uniforms", &[b])?;
        match inputs.method {
            Method::Block => {
                let (n, next) = block_row(inputs, b, &ids, params, recovery_u, buffers)?;
                return Ok((ids, n, next));
            }
            Method::Typical { epsilon, delta } => {
                let (n, next) = typical_row(
                    inputs,
                    b,
                    &ids,
                    params,
                    (epsilon, delta),
                    recovery_u,
                    buffers,
                )?;
                return Ok((ids, n, next));
            }
            Method::Synthetic(rates) => {
                let n = (0..k)
                    .find(|&t| uniforms.get(b, t) >= rates[t])
                    .unwrap_or(k);
                let Buffers {
                    wp,
                    scratch,
                    certified,
                    ..
                } = buffers;
                let next =
                    draw_target_row(inputs, (b, n), params, recovery_u, certified, wp, scratch)?;
                return Ok((ids, n, next));
            }
            Method::Token => {}
        }
        // Position t < k: `None` accepted, `Some(token)` rejected with the
        // residual's draw; step k: the bonus draw.
        let step = |t: usize, buffers: &mut Buffers, dropped: &dyn Fn() -> bool| {
            buffers.reserve(vocab)?; // a worker's own, the first time
            if t < k {
                let at = Position {
                    b,
                    t,
                    x: ids[t],
                    u: uniforms.get(b, t),
                    recovery_u,
                };
                return token_position(inputs, at, params, buffers, dropped);
            }
            let Buffers {
                wp,
                scratch,
                certified,
                ..
            } = buffers;
            draw_target_row(inputs, (b, k), params, recovery_u, certified, wp, scratch).map(Some)
        };
        let ends = |outcome: &Result<Option<usize>, CoreError>| !matches!(outcome, Ok(None));
        // A single request's positions run on the workers (see
        // `threads::first_ending`) where each costs far more than waking a
        // worker: rows with filters, whose positions run the float64
        // transform. Without filters a position is a screen of about 0.2 ns a
        // logit, under the 60-70 us a sleeping worker takes to start on the
        // build machine (docs/design.md), so it stays on this thread.
        let filtered = !params.unfiltered();
        let pool = (filtered && inputs.draft_token_ids.shape()[0] == 1)
            .then(|| threads::pool_for(k + 1, (k + 1).saturating_mul(2 * vocab)))
            .flatten();
        let outcomes = threads::first_ending(pool, k + 1, buffers, &BUFFERS, step, ends);
        let last = outcomes.len() - 1;
        match outcomes.into_iter().last() {
            Some(Ok(Some(token))) => (last, token),
            Some(Err(error)) => return Err(error),
            _ => unreachable!("the steps end at a token or an error"),
        }
    };
    Ok((ids, n, next))
}

/// Where a position of the token rule is: row `b`, position `t`, drafted
/// token `x`, its uniform and the row's recovery uniform.
#[derive(Clone, Copy)]
struct Position {
    b: usize,
    t: usize,
    x: usize,
    u: f64,
    recovery_u: f64,
}

/// The token rule at one position of a sampled row: `None` where the draft
/// is accepted, else the residual's draw. Without filters the screen and the
/// certified pass decide most positions, and draw the residual, without the
/// float64 rows; elsewhere the float64 transform (and top-k's candidates).
/// Once `dropped()` (see `threads::first_ending`), it stops between rows
/// with an outcome nobody reads.
fn token_position<P: Prob, Q: Prob>(
    inputs: &LogitsInputs<'_, P, Q>,
    Position {
        b,
        t,
        x,
        u,
        recovery_u,
    }: Position,
    params: Params,
    buffers: &mut Buffers,
    dropped: &dyn Fn() -> bool,
) -> Result<Option<usize>, CoreError> {
    let Buffers {
        wp,
        wq,
        residual,
        scratch,
        sparse,
        certified,
    } = buffers;
    let target_row = inputs.target_logits.row(b, t);
    let draft_row = match &inputs.draft {
        Draft::Logits(rows) => Some(rows.row(b, t)),
        _ => None,
    };
    // The drafter's own q_t(x_t), when given: no draft row is read unless
    // the position is rejected.
    let given_q = match &inputs.draft_token_probs {
        Some(q) => Some(check_gathered(q.get(b, t), "draft_token_probs", &[b, t])?),
        None => None,
    };
    // q_t(x_t) known without transforming a draft row: the given one, or
    // the draft probabilities' entry (their row is read whole only at a
    // rejection, for the residual).
    let known_q = match &inputs.draft {
        Draft::Probs(rows) => Some(check_gathered(
            rows.row(b, t)[x].to_f64(),
            rows.arg("draft_probs"),
            &rows.pos(b, t).element(x),
        )?),
        _ => given_q,
    };
    if params.unfiltered() {
        let inverse = 1.0 / params.temperature;
        let found = certified::position(
            target_row,
            draft_row,
            known_q,
            x,
            inverse,
            (u, recovery_u),
            certified,
        );
        match found {
            Some(Certified::Accepted) => return Ok(None),
            Some(Certified::Drawn(token)) => return Ok(Some(token)),
            None => {} // the exact pass below
        }
    }
    // Top-k on: p(x) and q(x) from a few candidates, exactly; the dense path
    // only where they reject or do not apply, with the rows' maxima the look
    // found.
    let look = if params.top_k > 0 {
        let look = top_k_accepts(target_row, draft_row, known_q, params, (x, u), sparse);
        if look.accepted {
            return Ok(None);
        }
        look
    } else {
        Look::default()
    };
    if dropped() {
        return Ok(None);
    }
    let row = LogitsRow {
        max: look.target_max,
        ..target_logits_row(inputs, b, t)
    };
    let total_p = transform(row, params, wp, scratch)?;
    let p = wp[x] / total_p;
    if let Some(q) = known_q {
        if is_accepted(p, q, u) {
            return Ok(None);
        }
    }
    if dropped() {
        return Ok(None);
    }
    let total_q = draft_weights(inputs, (b, t), params, look.draft_max, wq, scratch)?;
    let q = total_q.map_or(1.0, |total| wq[x] / total);
    if let Some(given) = given_q {
        check_draft_prob(given, q, b, t)?;
    } else if known_q.is_none() && is_accepted(p, q, u) {
        return Ok(None);
    }
    if dropped() {
        return Ok(None);
    }
    // The residual max(0, p - q) of the transformed rows.
    residual_of(
        wp,
        total_p,
        total_q.map(|total| (&wq[..], total)),
        x,
        residual,
    );
    let token = match sample::sample(
        &BufferWeights { w: residual },
        recovery_u,
        &mut scratch.block_sums,
    )? {
        Some(token) => token,
        // Only rounding gets here: sample from p itself.
        None => sample_weights(wp, recovery_u, scratch, target_at(inputs, b, t))?,
    };
    Ok(Some(token))
}

/// Block verification of a sampled row (docs/spec.md section 2.6) on the
/// transformed rows: every position's `p_t(x_t)`, `q_t(x_t)` exactly (the
/// float64 transform; the screen and the top-k look prove token decisions,
/// not the values the path weights need), then `tau` from the top down, each
/// step transforming one more pair of rows for its residual mass. Returns
/// `(n_b, next token)`.
/// A given `q_t(x_t)` against the draft row's own value `q`, read at a
/// rejected position (see [`DRAFT_PROB_TOLERANCE`]).
fn check_draft_prob(given: f64, q: f64, b: usize, t: usize) -> Result<(), CoreError> {
    let (relative, absolute) = DRAFT_PROB_TOLERANCE;
    if (given - q).abs() <= relative * given.max(q) + absolute {
        return Ok(());
    }
    Err(CoreError::value(
        "draft_token_probs",
        &[b, t],
        format!(
            "= {} disagrees with the draft row, which gives {} to the drafted token \
             (the same temperature, filters and position?)",
            show(given),
            show(q)
        ),
    ))
}

/// The draw from row `t` of request `b`'s transformed target logits with
/// uniform `u`: by the certified pass where it applies (no filters) and
/// decides, else from the float64 transform in `wp`.
fn draw_target_row<P: Prob, Q: Prob>(
    inputs: &LogitsInputs<'_, P, Q>,
    (b, t): (usize, usize),
    params: Params,
    u: f64,
    certified: &mut CertifiedScratch,
    wp: &mut Vec<f64>,
    scratch: &mut Scratch,
) -> Result<usize, CoreError> {
    if params.unfiltered() {
        let row = inputs.target_logits.row(b, t);
        if let Some(token) = certified::bonus(row, 1.0 / params.temperature, u, certified) {
            return Ok(token);
        }
    }
    transform(target_logits_row(inputs, b, t), params, wp, scratch)?;
    sample_weights(wp, u, scratch, target_at(inputs, b, t))
}

/// The name and place of row `t` of request `b`'s target logits, for errors.
fn target_at<P: Prob, Q: Prob>(
    inputs: &LogitsInputs<'_, P, Q>,
    b: usize,
    t: usize,
) -> (&'static str, Pos) {
    let rows = &inputs.target_logits;
    (rows.arg("target_logits"), rows.pos(b, t))
}

/// Row `t` of request `b`'s target logits, to be transformed.
fn target_logits_row<'i, P: Prob, Q: Prob>(
    inputs: &'i LogitsInputs<'_, P, Q>,
    b: usize,
    t: usize,
) -> LogitsRow<'i, P> {
    LogitsRow {
        logits: inputs.target_logits.row(b, t),
        arg: inputs.target_logits.arg("target_logits"),
        pos: inputs.target_logits.pos(b, t),
        max: None,
    }
}

/// Draft row `(b, t)`'s weights into `wq`, and their total (`None`: one-hot
/// drafts, nothing read): draft logits transformed as the target's
/// (`max`: the row's, where a look found it), draft probabilities read as
/// they are (each checked finite and non-negative), of total 1.
fn draft_weights<P: Prob, Q: Prob>(
    inputs: &LogitsInputs<'_, P, Q>,
    (b, t): (usize, usize),
    params: Params,
    max: Option<f64>,
    wq: &mut Vec<f64>,
    scratch: &mut Scratch,
) -> Result<Option<f64>, CoreError> {
    match &inputs.draft {
        Draft::OneHot => Ok(None),
        Draft::Logits(rows) => {
            let row = LogitsRow {
                logits: rows.row(b, t),
                arg: rows.arg("draft_logits"),
                pos: rows.pos(b, t),
                max,
            };
            transform(row, params, wq, scratch).map(Some)
        }
        Draft::Probs(rows) => {
            let at = RowAt {
                arg: rows.arg("draft_probs"),
                pos: rows.pos(b, t),
            };
            let row = rows.row(b, t);
            memory::reserve(wq, row.len(), at.arg)?;
            wq.clear();
            for (i, v) in row.iter().enumerate() {
                let v = v.to_f64();
                if !(v.is_finite() && v >= 0.0) {
                    return Err(at.bad_value(i, v));
                }
                wq.push(v);
            }
            Ok(Some(1.0))
        }
    }
}

/// Typical acceptance from logits (docs/spec.md section 2.7, lossy): the rule on
/// the transformed rows `p_t = wp / total_p` (section 8.2), position by position.
fn typical_row<P: Prob, Q: Prob>(
    inputs: &LogitsInputs<'_, P, Q>,
    b: usize,
    ids: &[usize],
    params: Params,
    (epsilon, delta): (f64, f64),
    recovery_u: f64,
    buffers: &mut Buffers,
) -> Result<(usize, usize), CoreError> {
    let Buffers {
        wp,
        wq,
        residual,
        scratch,
        ..
    } = buffers;
    let k = ids.len();
    for t in 0..=k {
        let total = transform(target_logits_row(inputs, b, t), params, wp, scratch)?;
        // The probabilities themselves, as the reference's transform returns them.
        residual.clear();
        memory::reserve(residual, wp.len(), "target_logits")?;
        residual.extend_from_slice(wp);
        crate::division::divide_row(residual, total);
        let p = ArrayView1::from(&residual[..]);
        let at = RowAt {
            arg: inputs.target_logits.arg("target_logits"),
            pos: inputs.target_logits.pos(b, t),
        };
        let typical = TypicalRow::of(p, at, epsilon, delta, &mut scratch.block_sums, wq)?;
        if t < k && typical.accepts(residual[ids[t]]) {
            continue;
        }
        let next = typical.sample(p, at, recovery_u, &mut scratch.block_sums, wq)?;
        return Ok((t, next));
    }
    unreachable!("the loop returns at t = k")
}

fn block_row<P: Prob, Q: Prob>(
    inputs: &LogitsInputs<'_, P, Q>,
    b: usize,
    ids: &[usize],
    params: Params,
    recovery_u: f64,
    buffers: &mut Buffers,
) -> Result<(usize, usize), CoreError> {
    let Buffers {
        wp,
        wq,
        residual,
        scratch,
        ..
    } = buffers;
    let k = ids.len();
    let target = |t: usize| target_logits_row(inputs, b, t);
    let at = |t: usize| target_at(inputs, b, t);
    // The transformed rows of position t: `wp` (and `wq`) and their totals.
    let rows = |t: usize, wp: &mut Vec<f64>, wq: &mut Vec<f64>, scratch: &mut Scratch| {
        let total_p = transform(target(t), params, wp, scratch)?;
        let total_q = draft_weights(inputs, (b, t), params, None, wq, scratch)?;
        Ok::<_, CoreError>((total_p, total_q))
    };
    let mut rho = Vec::with_capacity(k + 1);
    let mut p_drafted = Vec::with_capacity(k);
    rho.push(1.0);
    for (t, &x) in ids.iter().enumerate() {
        let (total_p, total_q) = rows(t, wp, wq, scratch)?;
        let p = wp[x] / total_p;
        let q = total_q.map_or(1.0, |total| wq[x] / total);
        p_drafted.push(p);
        rho.push(block::next_rho(rho[t], p, q));
    }
    let uniforms = inputs.uniforms.as_ref().ok_or_else(|| {
        CoreError::shape(
            "uniforms",
            "uniforms and recovery_uniforms are required for rows verified by sampling",
        )
    })?;
    let eta = |i: usize| uniforms.get(b, i - 1);
    // h_k = rho_k; with no drafts, tau = 0 = k.
    if k == 0 || eta(k) < rho[k] {
        transform(target(k), params, wp, scratch)?;
        return Ok((k, sample_weights(wp, recovery_u, scratch, at(k))?));
    }
    // Down from k - 1: the residual max(0, rho_i p_i - q_i) of the transformed rows.
    let mut tau = 0;
    let mut known_mass = None;
    for i in (1..k).rev() {
        if eta(i) >= rho[i] {
            continue; // h_i <= rho_i: fails without its round (docs/spec.md section 2.6)
        }
        let z = match inputs.draft.rows() {
            Some(_) => {
                let (total_p, total_q) = rows(i, wp, wq, scratch)?;
                let total_q = total_q.unwrap_or(1.0);
                scaled_residual(wp, total_p, wq, total_q, rho[i], residual);
                let z =
                    sample::canonical_sum(&BufferWeights { w: residual }, &mut scratch.block_sums)?;
                known_mass = Some(z);
                z
            }
            None => block::one_hot_mass(rho[i], p_drafted[i]),
        };
        if eta(i) < block::h(z, rho[i]) {
            tau = i;
            break;
        }
        known_mass = None;
    }
    // The residual at tau (tau = 0: the token rule's, rho_0 = 1).
    let scale = rho[tau];
    if known_mass.is_none() {
        let (total_p, total_q) = rows(tau, wp, wq, scratch)?;
        match total_q {
            Some(total_q) => scaled_residual(wp, total_p, wq, total_q, scale, residual),
            None => residual_of(wp, total_p, None, ids[tau], residual),
        }
    }
    let weights = BufferWeights { w: residual };
    let token = match known_mass {
        Some(z) => sample::search(&weights, recovery_u, &scratch.block_sums, z),
        None => sample::sample(&weights, recovery_u, &mut scratch.block_sums)?,
    };
    let token = match token {
        Some(token) => token,
        // Only rounding gets here: sample from p itself.
        None => {
            transform(target(tau), params, wp, scratch)?;
            sample_weights(wp, recovery_u, scratch, at(tau))?
        }
    };
    Ok((tau, token))
}

/// `residual_i = max(0, scale * (wp_i / total_p) - wq_i / total_q)`: the block
/// rule's residual of transformed rows (`scale = 1`: [`residual_of`]'s bits).
fn scaled_residual(
    wp: &[f64],
    total_p: f64,
    wq: &[f64],
    total_q: f64,
    scale: f64,
    residual: &mut Vec<f64>,
) {
    residual.resize(wp.len(), 0.0); // every entry is written below
    let op = ScaledResidual(scale);
    for ((r, &a), &c) in residual.iter_mut().zip(wp).zip(wq) {
        *r = op.apply(a / total_p, c / total_q);
    }
}

/// `residual_i = max(0, wp_i / total_p - wq_i / total_q)`, or with `q`
/// one-hot at `x` for deterministic drafts (`None`): `wp_i / total_p` except
/// 0 at `x`. The divisions are the reference's (no reciprocal), 4 to a
/// register where the CPU has AVX2.
fn residual_of(
    wp: &[f64],
    total_p: f64,
    q: Option<(&[f64], f64)>,
    x: usize,
    residual: &mut Vec<f64>,
) {
    residual.resize(wp.len(), 0.0); // every entry is written below
    match q {
        Some((wq, total_q)) => residual_pair(wp, total_p, wq, total_q, residual),
        None => {
            for (r, &a) in residual.iter_mut().zip(wp) {
                *r = a / total_p;
            }
            residual[x] = 0.0;
        }
    }
}

/// [`residual_pair_with`]: compiled for AVX2 where the CPU has it. On
/// aarch64 NEON is part of the baseline, and the portable loop is vectorised
/// as it stands (`fdiv` on `f64x2`, as seen in the assembly): the same bits,
/// as on x86 (the divisions and the difference are IEEE operations in any
/// register).
fn residual_pair(wp: &[f64], total_p: f64, wq: &[f64], total_q: f64, out: &mut [f64]) {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::has_avx2() {
        // SAFETY: the CPU supports AVX2, checked just above.
        return unsafe { residual_pair_avx2(wp, total_p, wq, total_q, out) };
    }
    residual_pair_with(wp, total_p, wq, total_q, out);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn residual_pair_avx2(wp: &[f64], total_p: f64, wq: &[f64], total_q: f64, out: &mut [f64]) {
    residual_pair_with(wp, total_p, wq, total_q, out);
}

#[inline(always)]
fn residual_pair_with(wp: &[f64], total_p: f64, wq: &[f64], total_q: f64, out: &mut [f64]) {
    for ((r, &a), &c) in out.iter_mut().zip(wp).zip(wq) {
        *r = Residual.apply(a / total_p, c / total_q);
    }
}

/// The draw from target weights `w` with `u`; a row that keeps nothing is an
/// error naming the row at `pos`.
fn sample_weights(
    w: &[f64],
    u: f64,
    scratch: &mut Scratch,
    (arg, pos): (&'static str, Pos),
) -> Result<usize, CoreError> {
    sample::sample(&BufferWeights { w }, u, &mut scratch.block_sums)?.ok_or_else(|| {
        CoreError::value(
            arg,
            &pos.index(),
            "leaves no token after the filters".to_string(),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The greedy argmax the loop defines: the first index of the largest
    /// logit above -inf.
    fn first_largest(values: &[f32]) -> Option<usize> {
        let mut best: Option<(usize, f32)> = None;
        for (i, &v) in values.iter().enumerate() {
            if v > f32::NEG_INFINITY && best.is_none_or(|(_, m)| v > m) {
                best = Some((i, v));
            }
        }
        best.map(|(i, _)| i)
    }

    #[test]
    fn greedy_argmax_is_the_first_largest_logit() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let pos = Pos::Padded { b: 0, t: 0 };
        for len in [1usize, 3, 7, 8, 9, 31, 64, 257, 1000] {
            for _ in 0..50 {
                // Few distinct values (ties), -inf, and both zeros.
                let row: Vec<f32> = (0..len)
                    .map(|_| match next() % 6 {
                        0 => f32::NEG_INFINITY,
                        1 => 0.0,
                        2 => -0.0,
                        k => (k as f32) - 3.5,
                    })
                    .collect();
                let got = argmax_logits(ArrayView1::from(&row[..]), "target_logits", pos).ok();
                assert_eq!(got, first_largest(&row), "{row:?}");
                // Strided rows take the loop: the same index.
                let doubled: Vec<f32> = row.iter().flat_map(|&v| [v, f32::NAN]).collect();
                let strided = ArrayView1::from(&doubled[..]).slice_move(s![..;2]);
                assert_eq!(argmax_logits(strided, "target_logits", pos).ok(), got);
            }
        }
        let bad = [1.0f32, f32::NAN, 2.0];
        assert!(argmax_logits(ArrayView1::from(&bad[..]), "target_logits", pos).is_err());
    }
}
