//! Tree verification from logits (docs/spec.md section 7.7): the walkers of
//! [`crate::tree`] over the probability rows of section 8.2's transform,
//! `p_i = w_i / W` in float64, each row transformed the first time the walk
//! reads it (a batch row reads its path's target rows and the draft rows of
//! the children it tries, not the whole `[N, V]`). Greedy rows (temperature 0)
//! take the argmax of the raw logits and transform nothing. The looks of
//! `verify_logits` (screens, top-k's candidates, the certified passes) may
//! decide without transforming the rows: the token rule's first children, and
//! a node's only child whole, its residual draw included
//! (`NodeRows::surely_decides`); a node's children tried in turn, the rounds'
//! residuals on the certified passes' kept terms (`NodeRows::surely_children`);
//! traversal's first leaf, from the screens' bounds on the rates down to it
//! (`NodeRows::surely_bounds`); and both methods' draws from an unchanged
//! target row (`NodeRows::surely_draws`).

use std::cell::{Cell, OnceCell, RefCell};

use ndarray::{s, ArrayView1, ArrayView3, Axis, Ix1, Ix2};

use super::certified::{self, Certified, CertifiedScratch};
use super::screen;
use super::sparse::{top_k_accepts, SparseScratch};
use super::{argmax_logits, params, transform, LogitsRow, Params, SamplingViews, Scratch};
use crate::checks::{expect_shape, Pos, RowAt};
use crate::error::{CoreError, RowErrors};
use crate::memory;
use crate::prob::Prob;
use crate::sample::SUM_BLOCK;
use crate::tree::{
    self, NodeRows, Surely, SurelyChildren, TreeLinks, TreeMethod, TreeOutputs, TreeParts,
    TreeSource,
};
use crate::view::{FloatView, IntView};

/// The inputs of `verify_tree_logits` (per-row parameters already broadcast to `[B]`).
pub struct TreeLogitsInputs<'a, P, Q> {
    /// `[B, N]`: node `n`'s token (node 0 is the root: its token is ignored).
    pub node_token_ids: IntView<'a, Ix2>,
    /// `[B, N]`: the parent links, as for `verify_tree`.
    pub parent_ids: IntView<'a, Ix2>,
    /// `[B, N, V]`: row `n` scores the token after node `n`.
    pub target_logits: ArrayView3<'a, P>,
    /// `[B, N, V]`: row `c` scores the distribution child `c` was drawn from;
    /// `None`: deterministic proposals (one-hot).
    pub draft_logits: Option<ArrayView3<'a, Q>>,
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
    /// `[B, N]`: entry `c` is used when child `c` is tried.
    pub uniforms: Option<FloatView<'a, Ix2>>,
    /// `[B]`: the draw of the replacement or bonus token.
    pub recovery_uniforms: Option<FloatView<'a, Ix1>>,
    pub method: TreeMethod,
}

impl<P: Prob, Q: Prob> TreeLogitsInputs<'_, P, Q> {
    /// Checks every shape against `node_token_ids [B, N]`; returns `(B, N, V)`.
    pub fn dims(&self) -> Result<(usize, usize, usize), CoreError> {
        let parts = self.parts();
        let draft = self
            .draft_logits
            .as_ref()
            .map(|q| ("draft_logits", q.shape()));
        let (batch, nodes, vocab) =
            parts.rows_shape(("target_logits", self.target_logits.shape()), draft)?;
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
        parts.draws_shape(batch, nodes)?;
        Ok((batch, nodes, vocab))
    }
}

/// Tree verification from logits of a batch: [`crate::tree::verify_tree`] on the
/// transformed rows (outputs, widths and [`RowErrors`] as there).
pub fn verify_tree_logits<P: Prob, Q: Prob>(
    inputs: &TreeLogitsInputs<'_, P, Q>,
    out: &mut TreeOutputs<'_>,
    errors: RowErrors<'_>,
) -> Result<(), CoreError> {
    tree::verify_source(inputs, out, errors)
}

impl<'a, P: Prob, Q: Prob> TreeSource<'a> for TreeLogitsInputs<'a, P, Q> {
    type Rows<'s>
        = LogitsRows<'s, 'a, P, Q>
    where
        Self: 's;
    const TARGET: &'static str = "target_logits";

    fn parts(&self) -> TreeParts<'a> {
        TreeParts {
            node_token_ids: self.node_token_ids,
            parent_ids: self.parent_ids,
            uniforms: self.uniforms,
            recovery_uniforms: self.recovery_uniforms,
            method: self.method,
        }
    }

    fn shape(&self) -> Result<(usize, usize, usize), CoreError> {
        self.dims()
    }

    fn rows(&self, b: usize) -> Result<(Self::Rows<'_>, bool), CoreError> {
        let views = SamplingViews {
            temperature: &self.temperature,
            top_k: &self.top_k,
            top_p: &self.top_p,
            min_p: self.min_p.as_ref(),
            min_p_last: self.min_p_last,
        };
        let params = params(&views, b)?;
        let &[_, nodes, vocab] = self.target_logits.shape() else {
            unreachable!("ArrayView3 has three axes")
        };
        let cells = |arg| -> Result<Vec<OnceCell<Vec<f64>>>, CoreError> {
            let mut cells = memory::with_capacity(nodes, arg)?;
            cells.resize_with(nodes, OnceCell::new);
            Ok(cells)
        };
        let maxima = |arg| -> Result<Vec<Cell<Option<f64>>>, CoreError> {
            let mut maxima = memory::with_capacity(nodes, arg)?;
            maxima.resize_with(nodes, Cell::default);
            Ok(maxima)
        };
        // This thread's scratch, reserved once and reused (given back on drop).
        let mut scratch = SCRATCH.with(|s| std::mem::take(&mut *s.borrow_mut()));
        let arg = "target_logits";
        memory::reserve(&mut scratch.block_sums, vocab.div_ceil(SUM_BLOCK), arg)?;
        memory::reserve(&mut scratch.candidates, vocab, arg)?;
        memory::reserve(&mut scratch.selection, vocab, arg)?;
        let mut looks = LOOKS.with(|s| std::mem::take(&mut *s.borrow_mut()));
        if params.temperature > 0.0 && params.unfiltered() {
            looks.certified.reserve(vocab)?; // the certified looks apply
        }
        if params.temperature > 0.0 && params.top_k > 0 {
            looks.sparse.reserve(vocab)?;
        }
        let rows = LogitsRows {
            inputs: self,
            b,
            params,
            target: cells("node_token_ids")?,
            draft: cells("node_token_ids")?,
            scratch: RefCell::new(scratch),
            looks: RefCell::new(looks),
            target_max: maxima("node_token_ids")?,
            draft_max: maxima("node_token_ids")?,
        };
        Ok((rows, params.temperature == 0.0))
    }
}

/// Row `b`'s probability rows, each transformed once, when first read.
pub(crate) struct LogitsRows<'s, 'a, P, Q> {
    inputs: &'s TreeLogitsInputs<'a, P, Q>,
    b: usize,
    params: Params,
    target: Vec<OnceCell<Vec<f64>>>,
    draft: Vec<OnceCell<Vec<f64>>>,
    scratch: RefCell<Scratch>,
    looks: RefCell<Looks>,
    /// Each row's max where a look read the row whole and found it valid
    /// (the screens, top-k's candidates), for its transform.
    target_max: Vec<Cell<Option<f64>>>,
    draft_max: Vec<Cell<Option<f64>>>,
}

/// The scratch space of the looks that spare a row's transform: the screens'
/// and certified draws', and top-k's candidates'.
#[derive(Default)]
struct Looks {
    certified: CertifiedScratch,
    sparse: SparseScratch,
}

impl<P: Prob, Q: Prob> LogitsRows<'_, '_, P, Q> {
    /// `cell`'s probabilities, `w_i / W` of the transformed `logits` (errors name
    /// `arg[b, n, i]`), computed the first time; `max`: the row's max, where
    /// a look found it.
    fn probabilities<'c, L: Prob>(
        &self,
        cell: &'c OnceCell<Vec<f64>>,
        logits: ArrayView1<'_, L>,
        (arg, n): (&'static str, usize),
        max: Option<f64>,
    ) -> Result<&'c [f64], CoreError> {
        if let Some(p) = cell.get() {
            return Ok(p);
        }
        let mut w = match ROWS.with(|pool| pool.borrow_mut().pop()) {
            Some(w) => w,
            None => memory::with_capacity(logits.len(), arg)?,
        };
        memory::reserve(&mut w, logits.len(), arg)?;
        let row = LogitsRow {
            logits,
            arg,
            pos: Pos::Padded { b: self.b, t: n },
            max,
        };
        let total = transform(row, self.params, &mut w, &mut self.scratch.borrow_mut())?;
        // The largest weight is exp(0) = 1, so `total >= 1`.
        crate::division::divide_row(&mut w, total);
        Ok(cell.get_or_init(|| w))
    }
}

impl<P, Q> LogitsRows<'_, '_, P, Q> {
    /// Keeps the maxima a look found: node `n`'s target row's, child `c`'s
    /// draft row's.
    fn keep_maxima(&self, n: usize, target: Option<f64>, c: usize, draft: Option<f64>) {
        if target.is_some() {
            self.target_max[n].set(target);
        }
        if draft.is_some() {
            self.draft_max[c].set(draft);
        }
    }

    /// `1 / T` for a row without filters (the screens and certified draws
    /// apply), else `None`.
    fn unfiltered_inverse(&self) -> Option<f64> {
        self.params
            .unfiltered()
            .then(|| 1.0 / self.params.temperature)
    }
}

impl<P, Q> Drop for LogitsRows<'_, '_, P, Q> {
    /// The transformed rows and the scratch go back to this thread, for the next batch row.
    fn drop(&mut self) {
        SCRATCH.with(|s| *s.borrow_mut() = std::mem::take(self.scratch.get_mut()));
        LOOKS.with(|s| *s.borrow_mut() = std::mem::take(self.looks.get_mut()));
        ROWS.with(|pool| {
            let mut pool = pool.borrow_mut();
            for cell in self.target.iter_mut().chain(self.draft.iter_mut()) {
                match cell.take() {
                    Some(row) if (pool.len() + 1) * row.capacity() <= POOLED_VALUES => {
                        pool.push(row)
                    }
                    _ => {}
                }
            }
        });
    }
}

/// How many float64 values of transformed rows a thread keeps between batch
/// rows and calls (32 MiB: 32 rows of a 128256-token vocabulary).
const POOLED_VALUES: usize = 4 << 20;

thread_local! {
    /// Row buffers reused across batch rows and calls (see [`POOLED_VALUES`]).
    static ROWS: RefCell<Vec<Vec<f64>>> = const { RefCell::new(Vec::new()) };
    /// The transform's scratch (`O(V)`), reused across batch rows and calls.
    static SCRATCH: RefCell<Scratch> = RefCell::default();
    /// The scratch of the looks that spare transforms, reused across batch
    /// rows and calls.
    static LOOKS: RefCell<Looks> = RefCell::default();
}

impl<P: Prob, Q: Prob> NodeRows for LogitsRows<'_, '_, P, Q> {
    type P = f64;
    type Q = f64;

    fn target_row(&self, n: usize) -> Result<ArrayView1<'_, f64>, CoreError> {
        let logits = self.inputs.target_logits.slice(s![self.b, n, ..]);
        let max = self.target_max[n].get();
        let p = self.probabilities(&self.target[n], logits, ("target_logits", n), max)?;
        Ok(ArrayView1::from(p))
    }

    fn target_at(&self, n: usize, x: usize) -> Result<f64, CoreError> {
        Ok(self.target_row(n)?[x])
    }

    fn draft_row(&self, c: usize) -> Result<Option<ArrayView1<'_, f64>>, CoreError> {
        let Some(draft) = &self.inputs.draft_logits else {
            return Ok(None);
        };
        let logits = draft.slice(s![self.b, c, ..]);
        let max = self.draft_max[c].get();
        let q = self.probabilities(&self.draft[c], logits, ("draft_logits", c), max)?;
        Ok(Some(ArrayView1::from(q)))
    }

    fn draft_at(&self, c: usize, x: usize) -> Result<f64, CoreError> {
        Ok(match self.draft_row(c)? {
            Some(q) => q[x],
            None => 1.0,
        })
    }

    /// Without filters, the certified passes of the node's target row and
    /// each child's draft row (one-hot drafts: none), the rounds on their
    /// kept terms (docs/spec.md section 7.7): no row transformed where they
    /// decide.
    fn surely_children(
        &self,
        n: usize,
        children: &[(usize, usize, f64)],
        recovery: f64,
    ) -> Option<SurelyChildren> {
        let inverse = self.unfiltered_inverse()?;
        let draft = self.inputs.draft_logits.as_ref();
        let target = self.inputs.target_logits.slice(s![self.b, n, ..]);
        let mut drafts = Vec::new();
        memory::reserve(&mut drafts, children.len(), "node_token_ids").ok()?;
        drafts.extend(
            children
                .iter()
                .map(|&(c, x, u)| (draft.map(|d| d.slice(s![self.b, c, ..])), x, u)),
        );
        let scratch = &mut self.looks.borrow_mut().certified;
        certified::children(target, &drafts, inverse, recovery, scratch)
    }

    /// Without filters, the whole walk from the certified passes of the rows
    /// it reads (docs/spec.md section 7.7): no row transformed where they
    /// decide.
    fn surely_traverses(&self, links: &TreeLinks<'_>, recovery: f64) -> Option<(usize, usize)> {
        let inverse = self.unfiltered_inverse()?;
        let target = self.inputs.target_logits.index_axis(Axis(0), self.b);
        let draft = self.inputs.draft_logits.as_ref();
        let draft = draft.map(|d| d.index_axis(Axis(0), self.b));
        let scratch = &mut self.looks.borrow_mut().certified;
        certified::traversal(target, draft, links, inverse, recovery, scratch)
    }

    /// Without filters, the screens of both rows, or for a node's only child
    /// the chain's whole position (the screens, the certified passes and the
    /// residual's draw from their kept terms); with top-k, `p(x)` and `q(x)`
    /// exactly from top-k's candidates (docs/spec.md section 7.7). A decided
    /// child needs neither row transformed; otherwise the rows are
    /// transformed next, with the maxima the screens or top-k found.
    fn surely_decides(
        &self,
        n: usize,
        c: usize,
        x: usize,
        u: f64,
        recovery: Option<f64>,
    ) -> Option<Surely> {
        let target = self.inputs.target_logits.slice(s![self.b, n, ..]);
        let draft = self.inputs.draft_logits.as_ref();
        let draft = draft.map(|d| d.slice(s![self.b, c, ..]));
        let look = match (self.unfiltered_inverse(), recovery) {
            (Some(inverse), Some(recovery)) => {
                let scratch = &mut self.looks.borrow_mut().certified;
                let found =
                    certified::position(target, draft, None, x, inverse, (u, recovery), scratch);
                return found.map(|found| match found {
                    Certified::Accepted => Surely::Accepted,
                    Certified::Drawn(token) => Surely::Drawn(token),
                });
            }
            (Some(inverse), None) => certified::screens_accept(target, draft, x, inverse, u),
            (None, _) if self.params.top_k > 0 => {
                let sparse = &mut self.looks.borrow_mut().sparse;
                top_k_accepts(target, draft, None, self.params, (x, u), sparse)
            }
            (None, _) => return None,
        };
        self.keep_maxima(n, look.target_max, c, look.draft_max);
        look.accepted.then_some(Surely::Accepted)
    }

    /// Without filters, the screens' bounds on `p_n(x)` and `q_c(x)`
    /// (docs/spec.md section 7.7), each row read whole and found valid.
    fn surely_bounds(&self, n: usize, c: usize, x: usize) -> Option<[(f64, f64); 2]> {
        let inverse = self.unfiltered_inverse()?;
        let target = self.inputs.target_logits.slice(s![self.b, n, ..]);
        let (p_low, p_high, max) = screen::probability(target, x, inverse)?;
        self.keep_maxima(n, Some(f64::from(max)), c, None);
        let q = match &self.inputs.draft_logits {
            None => (1.0, 1.0), // one-hot drafts
            Some(draft) => {
                let row = draft.slice(s![self.b, c, ..]);
                let (low, high, max) = screen::probability(row, x, inverse)?;
                self.keep_maxima(n, None, c, Some(f64::from(max)));
                (low, high)
            }
        };
        Some([(p_low, p_high), q])
    }

    /// Without filters, the certified draw (docs/spec.md section 7.7), unless
    /// the row is already transformed.
    fn surely_draws(&self, n: usize, u: f64) -> Option<usize> {
        let inverse = self.unfiltered_inverse()?;
        if self.target[n].get().is_some() {
            return None;
        }
        let target = self.inputs.target_logits.slice(s![self.b, n, ..]);
        let scratch = &mut self.looks.borrow_mut().certified;
        certified::draw_probabilities(target, inverse, u, scratch)
    }

    fn argmax(&self, n: usize) -> Result<usize, CoreError> {
        let logits = self.inputs.target_logits.slice(s![self.b, n, ..]);
        argmax_logits(logits, "target_logits", Pos::Padded { b: self.b, t: n })
    }

    fn at(&self, n: usize) -> RowAt {
        RowAt {
            arg: "target_logits",
            pos: Pos::Padded { b: self.b, t: n },
        }
    }
}

#[cfg(test)]
mod tests {
    use ndarray::{Array1, Array2, Array3};

    use super::*;

    /// A row of `vocab` float32 logits in `[-3, 3)`, from a hash.
    fn logits(seed: usize, vocab: usize) -> Vec<f32> {
        (0..vocab)
            .map(|j| {
                let h = (j + 1).wrapping_mul(2_654_435_761).wrapping_add(seed * 97) % 10_007;
                h as f32 / 10_007.0 * 6.0 - 3.0
            })
            .collect()
    }

    #[test]
    fn the_looks_decide_an_only_child_and_bound_a_rate_without_transforms() {
        // Root -> 1, float32 logits, no filters, temperature 1. The drafted token
        // `x` has q(x) far above p(x): u near 1 rejects it and the residual is
        // drawn; u = 0 accepts it. Neither row is transformed.
        let vocab = 3000;
        let target = logits(1, vocab);
        let mut draft = logits(2, vocab);
        let x = (0..vocab)
            .min_by(|&a, &b| target[a].total_cmp(&target[b]))
            .expect("a row");
        draft[x] = 20.0; // q(x) near 1, p(x) the row's least
        let mut rows3 = Array3::<f32>::zeros((1, 2, vocab));
        let mut drafts3 = Array3::<f32>::zeros((1, 2, vocab));
        for i in 0..vocab {
            rows3[[0, 0, i]] = target[i];
            rows3[[0, 1, i]] = target[i];
            drafts3[[0, 1, i]] = draft[i];
        }
        let ids = Array2::from_shape_vec((1, 2), vec![0i64, x as i64]).expect("shape");
        let parents = Array2::from_shape_vec((1, 2), vec![-1i64, 0]).expect("shape");
        let (t, k, p) = (
            Array1::from_elem(1, 1.0),
            Array1::from_elem(1, 0i64),
            Array1::from_elem(1, 1.0),
        );
        let inputs = TreeLogitsInputs {
            node_token_ids: IntView::I64(ids.view()),
            parent_ids: IntView::I64(parents.view()),
            target_logits: rows3.view(),
            draft_logits: Some(drafts3.view()),
            temperature: FloatView::F64(t.view()),
            top_k: IntView::I64(k.view()),
            top_p: FloatView::F64(p.view()),
            min_p: None,
            min_p_last: false,
            uniforms: None,
            recovery_uniforms: None,
            method: TreeMethod::Token,
        };
        let (rows, greedy) = inputs.rows(0).expect("valid parameters");
        assert!(!greedy);
        let near_one = 1.0 - 1e-9;
        let Some(Surely::Drawn(drawn)) = rows.surely_decides(0, 1, x, near_one, Some(0.5)) else {
            panic!("a rejection and its residual's draw")
        };
        assert!(matches!(
            rows.surely_decides(0, 1, x, 0.0, Some(0.5)),
            Some(Surely::Accepted)
        ));
        // With siblings (no recovery uniform) a rejection is left to the rows.
        assert!(rows.surely_decides(0, 1, x, near_one, None).is_none());
        let [(p_low, p_high), (q_low, q_high)] = rows.surely_bounds(0, 1, x).expect("bounds");
        assert!(0.0 < p_low && p_low < p_high && p_high < 1e-3);
        assert!(0.9 < q_low && q_low < q_high && q_high < 1.001);
        // Traversal's first leaf (node 1) below its rate's bounds: accepted.
        let rate_low = p_low / q_high;
        let token = |c: usize| Ok([0, x][c]);
        let uniform = |_| Ok(rate_low * 0.99);
        let leaf = tree::surely_first_leaf(&rows, &[1, usize::MAX], token, uniform);
        assert_eq!(leaf, Some(1));
        let untransformed = |row: &OnceCell<Vec<f64>>| row.get().is_none();
        assert!(rows.target.iter().chain(&rows.draft).all(untransformed));
        // The bounds hold the float64 path's values (which transform the rows).
        let p = rows.target_at(0, x).expect("a valid row");
        let q = rows.draft_at(1, x).expect("a valid row");
        assert!(p_low <= p && p <= p_high && q_low <= q && q <= q_high);
        // The draw is the float64 residual's, max(0, p - q) with the same uniform.
        let (p_row, q_row) = (rows.target_row(0).expect("valid"), rows.draft_row(1));
        let q_row = q_row.expect("valid").expect("draft rows");
        let at = Pos::Padded { b: 0, t: 1 };
        let exact = crate::sample::sample_residual(p_row, q_row, at, 1.0, 0.5, &mut vec![], None);
        assert_eq!(exact.expect("valid rows"), Some(drawn));
    }
}
