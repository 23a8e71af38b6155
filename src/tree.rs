//! Tree verification (EAGLE, Medusa, SpecInfer, multi-draft): at each node the
//! children are tried in index order by multi-round rejection sampling, which
//! keeps the output distribution exactly the target's.
//!
//! Per row, from the root with `P` the node's target row (used as given, like
//! the chain's rows, normaliser `S = 1`): child `c` with token `x` is accepted by
//! the chain rule applied to `P(x) / S` and `q_c(x)` with uniform `u_c`. On
//! acceptance the walk moves to `c` (`P` := its target row); on rejection
//! `P := max(0, P * (1 / S) - q_c)` with `S := sum(P)` in the canonical order (the factor
//! 0 when `S = 0`) and the next child is tried. When no child is accepted, a
//! token is sampled from `P` (from the node's target row if `P` sums to 0); at a
//! leaf, the bonus token is sampled from the leaf's target row. A single-path
//! tree is therefore exactly the chain of [`crate::chain::verify`].

use std::cell::RefCell;

use ndarray::{s, ArrayView1, ArrayView3, ArrayViewMut1, ArrayViewMut2, Ix1, Ix2};

use crate::block;
use crate::checks::{check_gathered, check_token, check_uniform, expect_shape, Pos, RowAt};
use crate::error::{CoreError, RowErrors};
use crate::memory;
use crate::prob::Prob;
use crate::rule::is_accepted;
use crate::sample::{self, argmax_of, sample_target, zero_row, BufferWeights, SUM_BLOCK};
use crate::simd::{PairOp, ScaledResidual};
use crate::threads;
use crate::view::{FloatView, Greedy, IntView};

/// The inputs of `verify_tree`.
pub struct TreeInputs<'a, P, Q> {
    /// `[B, N]`: node `n`'s token (node 0 is the root: its token is ignored).
    pub node_token_ids: IntView<'a, Ix2>,
    /// `[B, N]`: `parent_ids[b, 0] = -1`; a node `n >= 1` has `0 <= parent < n`,
    /// or `-1` for padding.
    pub parent_ids: IntView<'a, Ix2>,
    /// `[B, N, V]`: row `n` is the target's distribution of the token after node `n`.
    pub target_probs: ArrayView3<'a, P>,
    /// `[B, N, V]`: row `c` is the distribution child `c`'s token was drawn from;
    /// `None`: deterministic proposals (one-hot).
    pub draft_probs: Option<ArrayView3<'a, Q>>,
    /// `[B, N]`: entry `c` is used when child `c` is tried.
    pub uniforms: Option<FloatView<'a, Ix2>>,
    /// `[B]`: the draw of the replacement or bonus token.
    pub recovery_uniforms: Option<FloatView<'a, Ix1>>,
    pub greedy: Greedy<'a>,
    pub method: TreeMethod,
}

/// How the sampled rows of a tree are verified.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TreeMethod {
    /// Top-down multi-round rejection sampling (SpecInfer; docs/spec.md section 7.3).
    #[default]
    Token,
    /// Traversal verification (Weng et al., NeurIPS 2025; docs/spec.md section 7.6).
    Traversal,
}

/// One node on the traversal's stack: its rate `a`, whether its target weights
/// were replaced by a residual (held in the stack level's buffer) and their
/// total, and the next child to visit.
#[derive(Clone, Copy)]
struct Frame {
    node: usize,
    rate: f64,
    residual: bool,
    total: f64,
    child: usize,
    /// After its last child's removal, the node's weights are left unwritten:
    /// `max(0, base * factor - q_child)`, `base` its target row (`on_target`) or
    /// its level's buffer; they are computed only if the node is accepted.
    pending: Option<Pending>,
}

#[derive(Clone, Copy)]
struct Pending {
    child: usize,
    factor: f64,
    on_target: bool,
}

/// Where `verify_tree` writes.
pub struct TreeOutputs<'a> {
    /// `[B, D+1]`: the accepted tokens, then the replacement or bonus, then `-1`.
    pub output_token_ids: ArrayViewMut2<'a, i64>,
    /// `[B]`: accepted tokens (the depth reached).
    pub num_accepted: ArrayViewMut1<'a, i64>,
    /// `[B]`: `num_accepted + 1`.
    pub num_emitted: ArrayViewMut1<'a, i64>,
    /// `[B, D]`: the node of each accepted token, then `-1`.
    pub accepted_node_ids: ArrayViewMut2<'a, i64>,
}

threads::rows_of_views!(TreeOutputs {
    output_token_ids,
    num_accepted,
    num_emitted,
    accepted_node_ids,
});

/// Each node's depth (root 0, padding `None`), with the parent links checked.
fn depths(
    parents: &IntView<'_, Ix2>,
    b: usize,
    nodes: usize,
) -> Result<Vec<Option<usize>>, CoreError> {
    let mut depth = memory::with_capacity(nodes, "parent_ids")?;
    depth.resize(nodes, None);
    if nodes == 0 {
        return Ok(depth);
    }
    let root = parents.get(b, 0);
    if root != -1 {
        return Err(CoreError::value(
            "parent_ids",
            &[b, 0],
            format!("= {root}: the root's parent must be -1"),
        ));
    }
    depth[0] = Some(0);
    for n in 1..nodes {
        let parent = parents.get(b, n);
        if parent == -1 {
            continue; // padding
        }
        if parent < 0 || parent as u64 >= n as u64 {
            return Err(CoreError::value(
                "parent_ids",
                &[b, n],
                format!(
                    "= {parent}: a parent must come before its child (0 <= parent < {n}) or be -1"
                ),
            ));
        }
        match depth[parent as usize] {
            Some(d) => depth[n] = Some(d + 1),
            None => {
                return Err(CoreError::value(
                    "parent_ids",
                    &[b, n],
                    format!("= {parent}: the parent is padding"),
                ))
            }
        }
    }
    Ok(depth)
}

/// `D`, the deepest path of the batch (checks every parent link). Isolating,
/// a row whose links are bad is recorded in `errors` and left out of `D`; links
/// shared by every row (one `[N]`, a broadcast view) are checked once, and their
/// error fails the call (it is every row's).
pub fn tree_depth(
    parent_ids: &IntView<'_, Ix2>,
    errors: &mut RowErrors<'_>,
) -> Result<usize, CoreError> {
    let &[batch, nodes] = parent_ids.shape() else {
        unreachable!("IntView<Ix2> has two axes")
    };
    if parent_ids.rows_shared() {
        // The work follows the memory, not the logical size.
        let d = if batch == 0 {
            0
        } else {
            row_depth(parent_ids, 0, nodes)?
        };
        return Ok(d);
    }
    let mut deepest = 0;
    for b in 0..batch {
        match row_depth(parent_ids, b, nodes) {
            Ok(d) => deepest = deepest.max(d),
            Err(error) => errors.record(b, error.in_row(b))?,
        }
    }
    Ok(deepest)
}

/// The deepest node of row `b` (its links checked).
fn row_depth(parent_ids: &IntView<'_, Ix2>, b: usize, nodes: usize) -> Result<usize, CoreError> {
    Ok(depths(parent_ids, b, nodes)?
        .into_iter()
        .flatten()
        .max()
        .unwrap_or(0))
}

impl<P: Prob, Q: Prob> TreeInputs<'_, P, Q> {
    /// Checks every shape against `node_token_ids [B, N]`; returns `(B, N, V)`.
    pub fn dims(&self) -> Result<(usize, usize, usize), CoreError> {
        let parts = self.parts();
        let draft = self
            .draft_probs
            .as_ref()
            .map(|q| ("draft_probs", q.shape()));
        let (batch, nodes, vocab) =
            parts.rows_shape(("target_probs", self.target_probs.shape()), draft)?;
        parts.draws_shape(batch, nodes)?;
        if let Greedy::PerRow(g) = &self.greedy {
            expect_shape("greedy", g.shape(), &[batch], "[B] or a scalar")?;
        }
        Ok((batch, nodes, vocab))
    }
}

/// The tree, the randomness and the method: what every source of rows shares.
#[derive(Clone, Copy)]
pub(crate) struct TreeParts<'a> {
    pub node_token_ids: IntView<'a, Ix2>,
    pub parent_ids: IntView<'a, Ix2>,
    pub uniforms: Option<FloatView<'a, Ix2>>,
    pub recovery_uniforms: Option<FloatView<'a, Ix1>>,
    pub method: TreeMethod,
}

impl TreeParts<'_> {
    /// Checks `parent_ids` and the rows (`(argument, shape)` of the target rows
    /// and of the draft rows, if any) against `node_token_ids [B, N]`; returns
    /// `(B, N, V)`.
    pub(crate) fn rows_shape(
        &self,
        target: (&'static str, &[usize]),
        draft: Option<(&'static str, &[usize])>,
    ) -> Result<(usize, usize, usize), CoreError> {
        let &[batch, nodes] = self.node_token_ids.shape() else {
            unreachable!("IntView<Ix2> has two axes")
        };
        let vocab = target.1.get(2).copied().unwrap_or(0);
        expect_shape(
            "parent_ids",
            self.parent_ids.shape(),
            &[batch, nodes],
            "[B, N] or [N]",
        )?;
        for (arg, shape) in std::iter::once(target).chain(draft) {
            expect_shape(arg, shape, &[batch, nodes, vocab], "[B, N, V]")?;
        }
        Ok((batch, nodes, vocab))
    }

    /// Checks the uniforms' shapes, then that the tree has its root (`N >= 1`).
    pub(crate) fn draws_shape(&self, batch: usize, nodes: usize) -> Result<(), CoreError> {
        if let Some(u) = &self.uniforms {
            expect_shape("uniforms", u.shape(), &[batch, nodes], "[B, N]")?;
        }
        if let Some(u) = &self.recovery_uniforms {
            expect_shape("recovery_uniforms", u.shape(), &[batch], "[B]")?;
        }
        if nodes == 0 {
            return Err(CoreError::shape(
                "node_token_ids",
                "needs at least the root node (N >= 1)",
            ));
        }
        Ok(())
    }
}

/// Where a tree's rows come from: probabilities as given ([`TreeInputs`]), or
/// logits transformed when first read (`crate::logits::tree`).
pub(crate) trait TreeSource<'a>: Sync {
    type Rows<'s>: NodeRows
    where
        Self: 's;
    /// The argument the target rows come from (for messages).
    const TARGET: &'static str;
    /// Copies of the views (ndarray's views are invariant in their lifetime).
    fn parts(&self) -> TreeParts<'a>;
    /// Checks every shape against `node_token_ids [B, N]`; returns `(B, N, V)`.
    fn shape(&self) -> Result<(usize, usize, usize), CoreError>;
    /// Row `b`'s rows, and whether it is greedy (the row's own parameters checked).
    fn rows(&self, b: usize) -> Result<(Self::Rows<'_>, bool), CoreError>;
}

/// What a source proved of a node's first child without its rows
/// ([`NodeRows::surely_decides`]).
pub(crate) enum Surely {
    /// The token rule accepts the child.
    Accepted,
    /// The child, its node's only one, is rejected, and the residual's draw
    /// is this token.
    Drawn(usize),
}

/// What a source proved of a node's children tried in turn without their
/// rows ([`NodeRows::surely_children`]).
pub(crate) enum SurelyChildren {
    /// The child at this index of the list is accepted, those before it
    /// rejected.
    Accepted(usize),
    /// Every child is rejected, and the last residual's draw is this token.
    Drawn(usize),
}

/// A batch row's tree as a look at the whole walk reads it: the children
/// in index order as linked lists, and each node's token and uniform where
/// they are valid (`None`: bad, left to the walk to name).
pub(crate) struct TreeLinks<'t> {
    pub first_child: &'t [usize],
    pub next_sibling: &'t [usize],
    /// Node `n`'s token, where it is in `[0, V)`.
    pub token: &'t dyn Fn(usize) -> Option<usize>,
    /// Node `n`'s uniform, where it is in `[0, 1)`.
    pub uniform: &'t dyn Fn(usize) -> Option<f64>,
}

/// The rows of one batch row: node `n`'s target distribution, child `c`'s draft
/// distribution, each a probability row (checked where read), and the argmax a
/// greedy row takes.
pub(crate) trait NodeRows {
    type P: Prob;
    type Q: Prob;
    fn target_row(&self, n: usize) -> Result<ArrayView1<'_, Self::P>, CoreError>;
    /// `p_n(x)`, checked as a gathered value.
    fn target_at(&self, n: usize, x: usize) -> Result<f64, CoreError>;
    /// `None`: one-hot drafts.
    fn draft_row(&self, c: usize) -> Result<Option<ArrayView1<'_, Self::Q>>, CoreError>;
    /// `q_c(x)`, checked as a gathered value (1 with one-hot drafts).
    fn draft_at(&self, c: usize, x: usize) -> Result<f64, CoreError>;
    /// The token rule at child `c` (token `x`, uniform `u`), node `n`'s first
    /// child, tried on `n`'s target row, decided without the rows where the
    /// source can: [`Surely::Accepted`], or where `recovery` is given (`c` is
    /// `n`'s only child, so a rejection ends the walk with the residual's draw
    /// with that uniform) [`Surely::Drawn`]. `None` leaves it to the rows.
    fn surely_decides(
        &self,
        _n: usize,
        _c: usize,
        _x: usize,
        _u: f64,
        _recovery: Option<f64>,
    ) -> Option<Surely> {
        None
    }
    /// The token rule over node `n`'s children in turn (`(c, x, u)`: each
    /// child, its token in `[0, V)` and its uniform in `[0, 1)`, in index
    /// order; two or more), decided without the rows where the source can:
    /// the child accepted, or every child rejected and the last residual's
    /// draw with `recovery`. `None` leaves the node to the rows.
    fn surely_children(
        &self,
        _n: usize,
        _children: &[(usize, usize, f64)],
        _recovery: f64,
    ) -> Option<SurelyChildren> {
        None
    }
    /// Bounds `(low, high)` on `p_n(x)` (node `n`'s target row) and on `q_c(x)`
    /// (child `c`'s draft row; 1 with one-hot drafts), found without the rows
    /// where the source can, each row read whole and found valid (`None`: left
    /// to the rows).
    fn surely_bounds(&self, _n: usize, _c: usize, _x: usize) -> Option<[(f64, f64); 2]> {
        None
    }
    /// Traversal verification of the whole row (docs/spec.md section 7.6),
    /// decided without the rows where the source can: the accepted node (its
    /// path from the root is the accepted path) and the next token, drawn
    /// with `recovery`. `None` leaves the row to the walk.
    fn surely_traverses(&self, _links: &TreeLinks<'_>, _recovery: f64) -> Option<(usize, usize)> {
        None
    }
    /// The draw with uniform `u` from node `n`'s target row, made without the
    /// row where the source can (`None`: left to the row).
    fn surely_draws(&self, _n: usize, _u: f64) -> Option<usize> {
        None
    }
    /// The greedy choice after node `n`.
    fn argmax(&self, n: usize) -> Result<usize, CoreError>;
    /// Where node `n`'s target row lives, for messages.
    fn at(&self, n: usize) -> RowAt;
}

/// Row `b` of probability inputs.
pub(crate) struct ProbRows<'s, 'a, P, Q> {
    inputs: &'s TreeInputs<'a, P, Q>,
    b: usize,
}

impl<P: Prob, Q: Prob> NodeRows for ProbRows<'_, '_, P, Q> {
    type P = P;
    type Q = Q;
    fn target_row(&self, n: usize) -> Result<ArrayView1<'_, P>, CoreError> {
        Ok(self.inputs.target_probs.slice(s![self.b, n, ..]))
    }
    fn target_at(&self, n: usize, x: usize) -> Result<f64, CoreError> {
        let v = self.inputs.target_probs[[self.b, n, x]].to_f64();
        check_gathered(v, "target_probs", &[self.b, n, x])
    }
    fn draft_row(&self, c: usize) -> Result<Option<ArrayView1<'_, Q>>, CoreError> {
        Ok(self
            .inputs
            .draft_probs
            .as_ref()
            .map(|dp| dp.slice(s![self.b, c, ..])))
    }
    fn draft_at(&self, c: usize, x: usize) -> Result<f64, CoreError> {
        match &self.inputs.draft_probs {
            Some(dp) => check_gathered(dp[[self.b, c, x]].to_f64(), "draft_probs", &[self.b, c, x]),
            None => Ok(1.0),
        }
    }
    fn argmax(&self, n: usize) -> Result<usize, CoreError> {
        argmax_of(
            self.inputs.target_probs.slice(s![self.b, n, ..]),
            self.at(n),
        )
    }
    fn at(&self, n: usize) -> RowAt {
        RowAt {
            arg: "target_probs",
            pos: Pos::Padded { b: self.b, t: n },
        }
    }
}

impl<'a, P: Prob, Q: Prob> TreeSource<'a> for TreeInputs<'a, P, Q> {
    type Rows<'s>
        = ProbRows<'s, 'a, P, Q>
    where
        Self: 's;
    const TARGET: &'static str = "target_probs";
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
        Ok((ProbRows { inputs: self, b }, self.greedy.row(b)))
    }
}

/// Tree verification of a batch (docs/spec.md section 7): the outputs are
/// `[B, W+1]`, `[B]`, `[B]`, `[B, W]` for any width `W >= D` (the columns past a
/// row's path are `-1`). Isolating, a bad row's error is stored and its row
/// marked (`-1` tokens and nodes, 0 accepted, 0 emitted); see [`RowErrors`]. On
/// error the outputs hold partial results.
pub fn verify_tree<P: Prob, Q: Prob>(
    inputs: &TreeInputs<'_, P, Q>,
    out: &mut TreeOutputs<'_>,
    errors: RowErrors<'_>,
) -> Result<(), CoreError> {
    verify_source(inputs, out, errors)
}

/// [`verify_tree`] over any source of rows.
pub(crate) fn verify_source<'a, S: TreeSource<'a>>(
    inputs: &S,
    out: &mut TreeOutputs<'_>,
    mut errors: RowErrors<'_>,
) -> Result<(), CoreError> {
    let (batch, nodes, vocab) = inputs.shape()?;
    errors.check(batch)?;
    let deepest = tree_depth(&inputs.parts().parent_ids, &mut errors)?;
    let width = out.accepted_node_ids.shape()[1];
    if out.output_token_ids.shape() != [batch, width + 1]
        || out.accepted_node_ids.shape()[0] != batch
        || out.num_accepted.len() != batch
        || out.num_emitted.len() != batch
    {
        return Err(CoreError::shape(
            "out",
            format!(
                "output shapes must be [B, W+1], [B], [B], [B, W] with B = {batch} (W >= D = {deepest})"
            ),
        ));
    }
    if width < deepest {
        return Err(CoreError::shape(
            "out",
            format!(
                "out.accepted_node_ids has {width} columns, fewer than the deepest path D = {deepest}"
            ),
        ));
    }
    // Rows run in parallel when large, as in the chain (see `threads`): each
    // row reads at least one row of V per level it visits.
    let out = TreeOutputs {
        output_token_ids: out.output_token_ids.view_mut(),
        num_accepted: out.num_accepted.view_mut(),
        num_emitted: out.num_emitted.view_mut(),
        accepted_node_ids: out.accepted_node_ids.view_mut(),
    };
    threads::in_runs(
        batch.saturating_mul(vocab),
        (out, errors),
        |first_row, (mut part, mut errors)| {
            threads::with_buffers(&BUFFERS, |buffers| {
                verify_rows(
                    inputs,
                    nodes,
                    vocab,
                    first_row,
                    &mut part,
                    &mut errors,
                    buffers,
                )
            })
        },
    )
}

/// The buffers of one thread: the residual of the current round and the next
/// (`V` float64 values each), block sums, and the per-row tree links.
#[derive(Default)]
struct Buffers {
    residual: Vec<f64>,
    next_residual: Vec<f64>,
    scratch: Vec<f64>,
    first_child: Vec<usize>,
    next_sibling: Vec<usize>,
    accepted: Vec<(usize, i64)>,
    /// A node's children with their tokens and uniforms, for a look at them all.
    children: Vec<(usize, usize, f64)>,
    frames: Vec<Frame>,
    /// The traversal's residual rows, one per stack level (`V` each, as needed).
    levels: Vec<Vec<f64>>,
}

impl Buffers {
    /// Room for trees of `nodes` nodes over rows of `vocab`, reserved up front
    /// so that a size too large for this process is a `MemoryError`.
    fn reserve(&mut self, nodes: usize, vocab: usize, rows: &'static str) -> Result<(), CoreError> {
        memory::reserve(&mut self.residual, vocab, rows)?;
        memory::reserve(&mut self.next_residual, vocab, rows)?;
        memory::reserve(&mut self.scratch, vocab.div_ceil(SUM_BLOCK), rows)?;
        memory::reserve(&mut self.first_child, nodes, "node_token_ids")?;
        memory::reserve(&mut self.next_sibling, nodes, "node_token_ids")?;
        memory::reserve(&mut self.accepted, nodes, "node_token_ids")?;
        memory::reserve(&mut self.children, nodes, "node_token_ids")?;
        memory::reserve(&mut self.frames, nodes, "node_token_ids")
    }
}

thread_local! {
    /// See [`threads::with_buffers`].
    static BUFFERS: RefCell<Buffers> = RefCell::default();
}

/// Verifies rows `first_row..` into `out` (which holds exactly those rows).
fn verify_rows<'a, S: TreeSource<'a>>(
    inputs: &S,
    nodes: usize,
    vocab: usize,
    first_row: usize,
    out: &mut TreeOutputs<'_>,
    errors: &mut RowErrors<'_>,
    buffers: &mut Buffers,
) -> Result<(), CoreError> {
    buffers.reserve(nodes, vocab, S::TARGET)?;
    for i in 0..out.num_accepted.len() {
        let b = first_row + i;
        let mut ids = out.output_token_ids.row_mut(i);
        let mut path = out.accepted_node_ids.row_mut(i);
        ids.fill(-1);
        path.fill(-1);
        out.num_accepted[i] = 0;
        out.num_emitted[i] = 0;
        if errors.is_recorded(i) {
            continue; // its parent links are bad (`tree_depth`)
        }
        let walked = inputs.rows(b).and_then(|(rows, greedy)| {
            verify_row(inputs.parts(), &rows, greedy, nodes, vocab, b, buffers)
        });
        let next = match walked {
            Ok(next) => next,
            Err(error) => {
                errors.record(i, error.in_row(b))?;
                continue;
            }
        };
        let accepted = &buffers.accepted;
        let n = accepted.len();
        for (depth, &(c, x)) in accepted.iter().enumerate() {
            ids[depth] = x;
            path[depth] = c as i64;
        }
        ids[n] = next as i64;
        out.num_accepted[i] = n as i64;
        out.num_emitted[i] = n as i64 + 1;
    }
    Ok(())
}

/// Verifies row `b`: returns the next token, the accepted path left in
/// `buffers.accepted`.
fn verify_row<R: NodeRows>(
    inputs: TreeParts<'_>,
    rows: &R,
    greedy: bool,
    nodes: usize,
    vocab: usize,
    b: usize,
    buffers: &mut Buffers,
) -> Result<usize, CoreError> {
    let Buffers {
        residual,
        next_residual,
        scratch,
        first_child,
        next_sibling,
        accepted,
        children,
        frames,
        levels,
    } = buffers;
    {
        // Children in index order, as linked lists: first child, next sibling.
        first_child.clear();
        first_child.resize(nodes, usize::MAX);
        next_sibling.clear();
        next_sibling.resize(nodes, usize::MAX);
        for n in (1..nodes).rev() {
            let parent = inputs.parent_ids.get(b, n);
            if parent >= 0 {
                next_sibling[n] = first_child[parent as usize];
                first_child[parent as usize] = n;
            }
        }
        let recovery = if greedy {
            0.0
        } else {
            let (Some(_), Some(r)) = (inputs.uniforms, inputs.recovery_uniforms) else {
                return Err(CoreError::shape(
                    "uniforms",
                    "uniforms and recovery_uniforms are required for rows verified by sampling",
                ));
            };
            check_uniform(r.get(b), "recovery_uniforms", &[b])?
        };
        let mut node = 0usize;
        accepted.clear();
        let traversal = !greedy && inputs.method == TreeMethod::Traversal;
        let next = 'walk: loop {
            if traversal {
                break traverse_row(
                    inputs,
                    rows,
                    b,
                    vocab,
                    first_child,
                    next_sibling,
                    recovery,
                    scratch,
                    frames,
                    levels,
                    accepted,
                )?;
            }
            let mut child = first_child[node];
            if child == usize::MAX {
                // A leaf: the bonus token from its target row.
                break if greedy {
                    rows.argmax(node)?
                } else {
                    draw_from_target(rows, node, recovery, scratch)?
                };
            }
            if greedy {
                let best = rows.argmax(node)?;
                let mut found = None;
                while child != usize::MAX {
                    if check_token(
                        "node_token_ids",
                        &[b, child],
                        inputs.node_token_ids.get(b, child),
                        vocab,
                    )? == best
                    {
                        found = Some(child);
                        break;
                    }
                    child = next_sibling[child];
                }
                match found {
                    Some(c) => {
                        accepted.push((c, best as i64));
                        node = c;
                        continue;
                    }
                    None => break best,
                }
            }
            // Multi-round rejection sampling over the children.
            let mut scale: Option<f64> = None; // None: P is the node's target row, S = 1
            let mut taken = None;
            while child != usize::MAX {
                let x = check_token(
                    "node_token_ids",
                    &[b, child],
                    inputs.node_token_ids.get(b, child),
                    vocab,
                )?;
                let u = match inputs.uniforms {
                    Some(u) => check_uniform(u.get(b, child), "uniforms", &[b, child])?,
                    None => unreachable!("checked above"),
                };
                if scale.is_none() {
                    let only = (next_sibling[child] == usize::MAX).then_some(recovery);
                    match rows.surely_decides(node, child, x, u, only) {
                        Some(Surely::Accepted) => {
                            taken = Some((child, x));
                            break;
                        }
                        Some(Surely::Drawn(token)) => break 'walk token,
                        None => {}
                    }
                    if only.is_none()
                        && gather_children(inputs, b, vocab, child, next_sibling, children)
                    {
                        match rows.surely_children(node, children, recovery) {
                            Some(SurelyChildren::Accepted(k)) => {
                                let (c, x, _) = children[k];
                                taken = Some((c, x));
                                break;
                            }
                            Some(SurelyChildren::Drawn(token)) => break 'walk token,
                            None => {}
                        }
                    }
                }
                let p = match scale {
                    None => rows.target_at(node, x)?,
                    Some(total) => normalised(residual[x], total),
                };
                let q = rows.draft_at(child, x)?;
                if is_accepted(p, q, u) {
                    taken = Some((child, x));
                    break;
                }
                // P := max(0, P * (1 / S) - q_c), then S := sum(P), in one pass.
                let q_row = rows.draft_row(child)?;
                if let (Some(q_row), usize::MAX) = (q_row, next_sibling[child]) {
                    // The last child: its residual is only drawn from, so it is
                    // summed without being written, and the draw recomputes the
                    // weights of the one block it lands in (as the chain's residual).
                    let f = scale.map_or(1.0, |total| factor(1.0, total));
                    let drawn = match scale {
                        None => {
                            last_draw(rows.target_row(node)?, q_row, f, recovery, scratch, false)
                        }
                        Some(_) => {
                            let w = ArrayView1::from(&residual[..]);
                            last_draw(w, q_row, f, recovery, scratch, true)
                        }
                    };
                    let Ok(drawn) = drawn else {
                        let p_row = if scale.is_none() {
                            Some(rows.target_row(node)?)
                        } else {
                            None
                        };
                        return Err(first_bad_entry(p_row, Some(q_row), b, node, child));
                    };
                    break 'walk match drawn {
                        Some(token) => token,
                        None => {
                            sample_row(rows.target_row(node)?, rows.at(node), recovery, scratch)?
                        }
                    };
                }
                let total = match scale {
                    None => residual_round(
                        rows.target_row(node)?,
                        None,
                        q_row,
                        x,
                        next_residual,
                        scratch,
                    ),
                    Some(total) => later_round(residual, total, q_row, x, next_residual, scratch),
                };
                let Some(total) = total else {
                    let p_row = if scale.is_none() {
                        Some(rows.target_row(node)?)
                    } else {
                        None
                    };
                    return Err(first_bad_entry(p_row, q_row, b, node, child));
                };
                if scale.is_none() {
                    std::mem::swap(residual, next_residual); // later rounds update in place
                }
                scale = Some(total);
                child = next_sibling[child];
            }
            match taken {
                Some((c, x)) => {
                    accepted.push((c, x as i64));
                    node = c;
                }
                None => {
                    // `scratch` holds the last round's block sums, `scale` its total.
                    let total = scale.expect("a rejected child ran a round");
                    let from_residual =
                        sample::search(&BufferWeights { w: residual }, recovery, scratch, total);
                    break match from_residual {
                        Some(token) => token,
                        None => {
                            sample_row(rows.target_row(node)?, rows.at(node), recovery, scratch)?
                        }
                    };
                }
            }
        };
        Ok(next)
    }
}

/// Node children from `first` on, each with its token and uniform, into
/// `out`, where every token is in `[0, V)` and every uniform in `[0, 1)` (a
/// look at them all must not raise: the walk names a bad one when it reaches
/// it); `false` otherwise.
fn gather_children(
    inputs: TreeParts<'_>,
    b: usize,
    vocab: usize,
    first: usize,
    next_sibling: &[usize],
    out: &mut Vec<(usize, usize, f64)>,
) -> bool {
    out.clear();
    let Some(uniforms) = inputs.uniforms else {
        return false;
    };
    let mut c = first;
    while c != usize::MAX {
        let x = check_token(
            "node_token_ids",
            &[b, c],
            inputs.node_token_ids.get(b, c),
            vocab,
        );
        let u = check_uniform(uniforms.get(b, c), "uniforms", &[b, c]);
        let (Ok(x), Ok(u)) = (x, u) else {
            return false;
        };
        out.push((c, x, u));
        c = next_sibling[c];
    }
    true
}

/// One round of the residual, into `next`: `max(0, P_i * (1 / S) - q_i)`, where
/// `P` is the node's target row (`S = None`: taken as 1) or the previous
/// round's residual of sum `S` (the factor 0 where `S` is not positive: a
/// residual that vanished by rounding); `q` is one-hot at `x` when `None`. Returns the new
/// residual's canonical sum (its block sums left in `scratch`), or `None` when a
/// `P_i` of the target row or a `q_i` read is not finite and non-negative (the
/// caller names it). A previous round's residual is the library's own values,
/// not checked ([`sample::PairWeights::buffer`]).
fn residual_round<A: Prob, Q: Prob>(
    p: ArrayView1<'_, A>,
    scale: Option<f64>,
    q: Option<ArrayView1<'_, Q>>,
    x: usize,
    next: &mut Vec<f64>,
    scratch: &mut Vec<f64>,
) -> Option<f64> {
    // Every entry is written below: only the length matters.
    next.resize(p.len(), 0.0);
    let op = ScaledResidual(match scale {
        None => 1.0,
        Some(total) => factor(1.0, total),
    });
    let valid = |v: f64| (0.0..=f64::MAX).contains(&v);
    let valid_p = |v: f64| scale.is_some() || valid(v);
    if let (Some(ps), Some(qs)) = (p.as_slice(), q.and_then(|q| q.to_slice())) {
        // The round and its sum in one pass.
        let (total, surely_valid) = sample::store_pair_blocks(op, ps, qs, next, scratch);
        let ok = surely_valid
            || (ps.iter().all(|v| valid_p(v.to_f64())) && qs.iter().all(|v| valid(v.to_f64())));
        return ok.then_some(total);
    }
    let mut ok = true;
    match q {
        Some(q) => {
            for ((n, p), q) in next.iter_mut().zip(p.iter()).zip(q.iter()) {
                let (p, q) = (p.to_f64(), q.to_f64());
                ok &= valid_p(p) & valid(q);
                *n = op.apply(p, q);
            }
        }
        None => {
            for (i, (n, p)) in next.iter_mut().zip(p.iter()).enumerate() {
                let p = p.to_f64();
                ok &= valid_p(p);
                *n = op.apply(p, f64::from(u8::from(i == x)));
            }
        }
    }
    if !ok {
        return None;
    }
    sample::canonical_sum(&BufferWeights { w: next }, scratch).ok()
}

/// The draw with uniform `u` from node `n`'s target row as given (no round has
/// changed it): by the source's look where it decides, else from the row.
fn draw_from_target<R: NodeRows>(
    rows: &R,
    n: usize,
    u: f64,
    scratch: &mut Vec<f64>,
) -> Result<usize, CoreError> {
    match rows.surely_draws(n, u) {
        Some(token) => Ok(token),
        None => sample_row(rows.target_row(n)?, rows.at(n), u, scratch),
    }
}

/// Relative slack per edge on a rate's bounds: the float64 walk's product and
/// quotient, and ours, each within half an ulp.
const RATE_SLACK: f64 = 1.0 / 281_474_976_710_656.0; // 2^-48

/// Traversal's first decision, where the source's bounds prove it an
/// acceptance (docs/spec.md section 7.7): the walk enters the first child of
/// each node from the root down to the first leaf, each with rate
/// `next_rho(a_v, p_v(x), q_c(x))` (no round has run, so `Mb_v(x)` is `p_v(x)`),
/// and that leaf is the first node decided. Where its uniform is below every
/// rate the bounds allow (a lower bound on each rate down the path, each step
/// rounded as the walk's and widened by [`RATE_SLACK`]), the walk accepts it:
/// returns the leaf. `None`: a bound the source does not give, a value out of
/// range, a rate that may be 0, or a decision the bounds leave open; the
/// float64 walk then decides (and names any error).
pub(crate) fn surely_first_leaf<R: NodeRows>(
    rows: &R,
    first_child: &[usize],
    token: impl Fn(usize) -> Result<usize, CoreError>,
    uniform: impl Fn(usize) -> Result<f64, CoreError>,
) -> Option<usize> {
    let (mut node, mut low) = (0, 1.0f64);
    while first_child[node] != usize::MAX {
        let c = first_child[node];
        let [(p_low, _), (_, q_high)] = rows.surely_bounds(node, c, token(c).ok()?)?;
        // p = 0 gives rate 0; a p this small may round to 0.
        if p_low <= 1e-300 {
            return None;
        }
        // min(1, a p / q) at its smallest over the bounds: q = 0 gives +inf,
        // so 1 (the walk's rate 1 for q = 0). A product that underflows to 0
        // (the walk's rate may be 0 too), or 0 / 0, decides nothing.
        let rate = low * p_low / q_high * (1.0 - RATE_SLACK);
        if rate.is_nan() || rate <= 0.0 {
            return None;
        }
        low = rate.min(1.0);
        node = c;
    }
    if node == 0 {
        return None; // no child: the walk draws at once
    }
    (uniform(node).ok()? < low).then_some(node)
}

/// Traversal verification of row `b` (docs/spec.md section 7.6): the tree in
/// post-order, children in index order, iteratively (a stack of [`Frame`]s, so a
/// deep tree costs memory, not call depth). Entering child `c` (token `x`) of a
/// node with rate `a` gives it the rate `next_rho(a, Mb(x), q_c(x))` of the path;
/// a node with no child left is accepted iff its uniform is below its rate (the
/// root always), and the next token comes from its target weights. A rejected
/// node is removed: its parent's weights become `max(0, w * (a / T) - q_c)` (with
/// one-hot drafts, `w` with `x` zeroed and mass `a * (1 - Mb(x))`), their sum
/// the new `T`, and its rate `h(S, a)` as in block verification. Returns the
/// next token; `accepted` holds the path.
#[allow(clippy::too_many_arguments)]
fn traverse_row<R: NodeRows>(
    inputs: TreeParts<'_>,
    rows: &R,
    b: usize,
    vocab: usize,
    first_child: &[usize],
    next_sibling: &[usize],
    recovery: f64,
    scratch: &mut Vec<f64>,
    frames: &mut Vec<Frame>,
    levels: &mut Vec<Vec<f64>>,
    accepted: &mut Vec<(usize, i64)>,
) -> Result<usize, CoreError> {
    let token = |c: usize| {
        check_token(
            "node_token_ids",
            &[b, c],
            inputs.node_token_ids.get(b, c),
            vocab,
        )
    };
    let uniform = |n: usize| match inputs.uniforms {
        Some(u) => check_uniform(u.get(b, n), "uniforms", &[b, n]),
        None => unreachable!("checked by the caller"),
    };
    // Whether every later sibling of the removed child `c` (token `x`) would enter
    // with rate 0: the parent's entry at its token after the update, computed from
    // single entries as the update computes it, is 0 (and stays 0 after later ones).
    let later_all_zero = |parent: &Frame,
                          levels: &[Vec<f64>],
                          d: usize,
                          c: usize,
                          x: usize|
     -> Result<bool, CoreError> {
        let mut j = next_sibling[c];
        if j == usize::MAX {
            return Ok(true);
        }
        let p_row = if parent.residual {
            None
        } else {
            Some(rows.target_row(parent.node)?)
        };
        let q_row = rows.draft_row(c)?;
        let scale = factor(parent.rate, parent.total);
        while j != usize::MAX {
            let xj = token(j)?;
            let w = match &p_row {
                None => levels[d][xj],
                Some(p) => entry(p[xj].to_f64(), "target_probs", b, parent.node, xj)?,
            };
            let e = match &q_row {
                None if xj == x => 0.0,
                None => w,
                Some(q) => {
                    let qj = entry(q[xj].to_f64(), "draft_probs", b, c, xj)?;
                    (w * scale - qj).max(0.0)
                }
            };
            if e > 0.0 {
                return Ok(false);
            }
            j = next_sibling[j];
        }
        Ok(true)
    };
    // Mb(x) at the frame on level `d`: its target row's p(x), or w[x] / T.
    let share = |f: &Frame, levels: &[Vec<f64>], d: usize, x: usize| -> Result<f64, CoreError> {
        if f.residual {
            Ok(normalised(levels[d][x], f.total))
        } else {
            rows.target_at(f.node, x)
        }
    };
    if let Some(leaf) = surely_first_leaf(rows, first_child, token, uniform) {
        let next = draw_from_target(rows, leaf, recovery, scratch)?;
        accepted.clear();
        let mut node = first_child[0];
        loop {
            accepted.push((node, token(node)? as i64));
            if node == leaf {
                return Ok(next);
            }
            node = first_child[node];
        }
    }
    let links = TreeLinks {
        first_child,
        next_sibling,
        token: &|c| token(c).ok(),
        uniform: &|n| uniform(n).ok(),
    };
    if let Some((node, next)) = rows.surely_traverses(&links, recovery) {
        accepted.clear();
        let mut n = node;
        while n != 0 {
            accepted.push((n, token(n)? as i64));
            n = inputs.parent_ids.get(b, n) as usize;
        }
        accepted.reverse();
        return Ok(next);
    }
    frames.clear();
    frames.push(Frame {
        node: 0,
        rate: 1.0,
        residual: false,
        total: 1.0,
        child: first_child[0],
        pending: None,
    });
    loop {
        let d = frames.len() - 1;
        let f = frames[d];
        if f.child != usize::MAX {
            let c = f.child;
            let x = token(c)?;
            let mb = share(&f, levels, d, x)?;
            let ms = rows.draft_at(c, x)?;
            let rate = block::next_rho(f.rate, mb, ms);
            frames.push(Frame {
                node: c,
                rate,
                residual: false,
                total: 1.0,
                // Rate 0: its subtree is not visited (docs/spec.md section 7.6, step 1).
                child: if rate == 0.0 {
                    usize::MAX
                } else {
                    first_child[c]
                },
                pending: None,
            });
            continue;
        }
        let accept = f.node == 0 || uniform(f.node)? < f.rate;
        if accept {
            let next = if f.pending.is_none() && !f.residual {
                draw_from_target(rows, f.node, recovery, scratch)?
            } else {
                let drawn = if let Some(last) = f.pending {
                    // `scratch` holds the block sums of the removal just made.
                    let q_row = rows
                        .draft_row(last.child)?
                        .expect("pending rounds have draft rows");
                    let at = Pos::Padded { b, t: last.child };
                    let (u, known) = (recovery, Some(f.total));
                    if last.on_target {
                        let p_row = rows.target_row(f.node)?;
                        sample::sample_residual(p_row, q_row, at, last.factor, u, scratch, known)?
                    } else {
                        let w = ArrayView1::from(&levels[d][..]);
                        sample::sample_residual(w, q_row, at, last.factor, u, scratch, known)?
                    }
                } else {
                    sample::sample(&BufferWeights { w: &levels[d] }, recovery, scratch)?
                };
                match drawn {
                    Some(token) => token,
                    None => {
                        sample_row(rows.target_row(f.node)?, rows.at(f.node), recovery, scratch)?
                    }
                }
            };
            accepted.clear();
            for frame in &frames[1..] {
                accepted.push((frame.node, token(frame.node)? as i64));
            }
            return Ok(next);
        }
        // Rejected: the parent takes the residual without this node.
        frames.pop();
        let pd = d - 1;
        let parent = frames[pd];
        let x = token(f.node)?;
        if parent.node != 0
            && uniform(parent.node)? >= parent.rate
            && later_all_zero(&parent, levels, pd, f.node, x)?
        {
            // The update can only lower the rate, which already rejects the parent,
            // and no later child can be accepted (docs/spec.md section 7.6, step 3).
            frames[pd].child = usize::MAX;
            continue;
        }
        if levels.len() <= pd {
            levels.resize_with(pd + 1, Vec::new);
        }
        let mut pending = None;
        let (mass, total) = match rows.draft_row(f.node)? {
            None => {
                let mb = share(&parent, levels, pd, x)?;
                if !parent.residual {
                    copy_row(
                        rows.target_row(parent.node)?,
                        &mut levels[pd],
                        b,
                        parent.node,
                    )?;
                }
                levels[pd][x] = 0.0;
                (parent.rate * (1.0 - mb), parent.total * (1.0 - mb))
            }
            Some(q_row) if next_sibling[f.node] == usize::MAX => {
                // The parent's last child: its new weights are needed only if
                // the parent is accepted next, so they are summed, not written.
                let scale = factor(parent.rate, parent.total);
                let at = Pos::Padded { b, t: f.node };
                let p_row = if parent.residual {
                    None
                } else {
                    Some(rows.target_row(parent.node)?)
                };
                let mass = match p_row {
                    Some(p) => sample::residual_mass(p, q_row, at, scale, scratch, false),
                    None => {
                        let w = ArrayView1::from(&levels[pd][..]);
                        sample::residual_mass(w, q_row, at, scale, scratch, true)
                    }
                }
                .map_err(|_| first_bad_entry(p_row, Some(q_row), b, parent.node, f.node))?;
                pending = Some(Pending {
                    child: f.node,
                    factor: scale,
                    on_target: p_row.is_some(),
                });
                (mass, mass)
            }
            Some(q_row) => {
                let p_row = if parent.residual {
                    None
                } else {
                    Some(rows.target_row(parent.node)?)
                };
                let mass = scaled_round(
                    p_row,
                    &mut levels[pd],
                    scratch,
                    parent.rate,
                    parent.total,
                    q_row,
                    (b, parent.node, f.node),
                )?;
                (mass, mass)
            }
        };
        let p = &mut frames[pd];
        p.rate = if p.node == 0 {
            1.0
        } else {
            block::h(mass, p.rate)
        };
        p.residual = true;
        p.total = total;
        p.child = next_sibling[f.node];
        p.pending = pending;
    }
}

/// `w` := the target row (checked entry by entry) as float64.
fn copy_row<P: Prob>(
    row: ArrayView1<'_, P>,
    w: &mut Vec<f64>,
    b: usize,
    node: usize,
) -> Result<(), CoreError> {
    memory::reserve(w, row.len(), "target_probs")?;
    w.clear();
    for (i, v) in row.iter().enumerate() {
        w.push(entry(v.to_f64(), "target_probs", b, node, i)?);
    }
    Ok(())
}

/// A later round of the token tree, in place where the draft row is unit-stride:
/// `w := max(0, w * (1 / S) - q)` (see [`residual_round`], whose buffer `spare`
/// serves the other layouts, swapped back into `w`).
fn later_round<Q: Prob>(
    w: &mut Vec<f64>,
    total: f64,
    q: Option<ArrayView1<'_, Q>>,
    x: usize,
    spare: &mut Vec<f64>,
    scratch: &mut Vec<f64>,
) -> Option<f64> {
    if let Some(qs) = q.as_ref().and_then(|q| q.as_slice()) {
        let op = ScaledResidual(factor(1.0, total));
        let (mass, surely_valid) = sample::update_pair_blocks(op, w, qs, scratch);
        let valid = |v: &Q| (0.0..=f64::MAX).contains(&v.to_f64());
        return (surely_valid || qs.iter().all(valid)).then_some(mass);
    }
    let mass = residual_round(ArrayView1::from(&w[..]), Some(total), q, x, spare, scratch);
    std::mem::swap(w, spare);
    mass
}

/// The draw from `max(0, p * f - q)` with uniform `u` (`None`: it sums to 0),
/// without writing the weights: one pass for the canonical sum, then the block
/// the draw lands in recomputed. An error means a bad value (the caller names it).
/// `buffer`: `p` is the residual buffer ([`sample::residual_mass`]).
fn last_draw<A: Prob, Q: Prob>(
    p: ArrayView1<'_, A>,
    q: ArrayView1<'_, Q>,
    f: f64,
    u: f64,
    scratch: &mut Vec<f64>,
    buffer: bool,
) -> Result<Option<usize>, CoreError> {
    let at = Pos::Padded { b: 0, t: 0 }; // errors are renamed by the caller
    let mass = sample::residual_mass(p, q, at, f, scratch, buffer)?;
    sample::sample_residual(p, q, at, f, u, scratch, Some(mass))
}

/// The traversal's residual round: `w_v := max(0, w_v * (a / T) - q_v)`, with
/// `w` the target row as given when `p` is `Some`; returns the new mass (the
/// canonical sum of `w`). A unit-stride draft row takes one pass that also sums,
/// in place after the first round; a bad value read is named as the reference
/// reads them (`p_v`, then `q_v`).
#[allow(clippy::too_many_arguments)]
fn scaled_round<P: Prob, Q: Prob>(
    p: Option<ArrayView1<'_, P>>,
    w: &mut Vec<f64>,
    scratch: &mut Vec<f64>,
    rate: f64,
    total: f64,
    q: ArrayView1<'_, Q>,
    at: (usize, usize, usize),
) -> Result<f64, CoreError> {
    let (b, node, child) = at;
    let op = ScaledResidual(factor(rate, total));
    let ok = |v: f64| (0.0..=f64::MAX).contains(&v);
    let len = q.len();
    let bad = || first_bad_entry(p, Some(q), b, node, child);
    if let Some(qs) = q.as_slice() {
        let (mass, surely_valid) = match p.as_ref().map(|p| p.as_slice()) {
            Some(Some(ps)) => {
                memory::reserve(w, len, "target_probs")?;
                w.resize(len, 0.0);
                sample::store_pair_blocks(op, ps, qs, w, scratch)
            }
            Some(None) => {
                // A strided target row: read it once into `w`, then the round
                // (which checks only the draft row).
                copy_unchecked(p.as_ref().expect("Some"), w)?;
                let read_ok = w.iter().all(|&v| ok(v));
                let (mass, surely_valid) = sample::update_pair_blocks(op, w, qs, scratch);
                (mass, surely_valid & read_ok)
            }
            None => sample::update_pair_blocks(op, w, qs, scratch),
        };
        let valid = surely_valid
            || (p.is_none_or(|p| p.iter().all(|v| ok(v.to_f64())))
                && qs.iter().all(|v| ok(v.to_f64())));
        if !valid {
            return Err(bad());
        }
        return Ok(mass);
    }
    let mut valid = true;
    match p {
        Some(p) => {
            memory::reserve(w, p.len(), "target_probs")?;
            w.clear();
            w.extend(p.iter().zip(q.iter()).map(|(pv, qv)| {
                let (pv, qv) = (pv.to_f64(), qv.to_f64());
                valid &= ok(pv) & ok(qv);
                op.apply(pv, qv)
            }));
        }
        None => {
            for (wv, qv) in w.iter_mut().zip(q.iter()) {
                let qv = qv.to_f64();
                valid &= ok(qv);
                *wv = op.apply(*wv, qv);
            }
        }
    }
    if !valid {
        return Err(bad());
    }
    sample::canonical_sum(&BufferWeights { w }, scratch)
}

/// `w` := `row` as float64, unchecked (the caller checks).
fn copy_unchecked<P: Prob>(row: &ArrayView1<'_, P>, w: &mut Vec<f64>) -> Result<(), CoreError> {
    memory::reserve(w, row.len(), "target_probs")?;
    w.clear();
    w.extend(row.iter().map(|v| v.to_f64()));
    Ok(())
}

/// The first bad entry in reading order (`p_i`, then `q_i`), for the error.
fn first_bad_entry<P: Prob, Q: Prob>(
    p: Option<ArrayView1<'_, P>>,
    q: Option<ArrayView1<'_, Q>>,
    b: usize,
    node: usize,
    child: usize,
) -> CoreError {
    let len = p.map_or(0, |p| p.len()).max(q.map_or(0, |q| q.len()));
    for i in 0..len {
        if let Some(p) = p {
            if let Err(e) = entry(p[i].to_f64(), "target_probs", b, node, i) {
                return e;
            }
        }
        if let Some(q) = q {
            if let Err(e) = entry(q[i].to_f64(), "draft_probs", b, child, i) {
                return e;
            }
        }
    }
    CoreError::shape(
        "target_probs",
        "an entry failed the validity check but none is bad",
    )
}

/// The factor `a / T` a residual round scales its weights by (docs/spec.md
/// sections 7.3 and 7.6): 0 when `T` is not positive (a residual that vanished
/// by rounding). `T = 1` gives `a` itself, so a first round is block
/// verification's `rho * p` and, at `a = 1`, the token rule's `p`.
#[inline]
fn factor(rate: f64, total: f64) -> f64 {
    if total > 0.0 {
        rate / total
    } else {
        0.0
    }
}

/// `P(x) / S`, with `0 / 0` taken as 0 (a residual that vanished by rounding).
#[inline]
fn normalised(w: f64, total: f64) -> f64 {
    if total > 0.0 {
        w / total
    } else {
        0.0
    }
}

fn entry(v: f64, arg: &'static str, b: usize, n: usize, i: usize) -> Result<f64, CoreError> {
    if (0.0..=f64::MAX).contains(&v) {
        Ok(v)
    } else {
        let at = RowAt {
            arg,
            pos: Pos::Padded { b, t: n },
        };
        Err(at.bad_value(i, v))
    }
}

/// A draw from a target row; it must not sum to 0.
fn sample_row<P: Prob>(
    row: ArrayView1<'_, P>,
    at: RowAt,
    u: f64,
    scratch: &mut Vec<f64>,
) -> Result<usize, CoreError> {
    sample_target(row, None, at, u, scratch)?.ok_or_else(|| zero_row(at))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows known only by bounds on `p_v(x)` and `q_c(x)`, entry `c - 1` for
    /// the edge into node `c`: the float64 rows are never read.
    struct Bounded(Vec<[(f64, f64); 2]>);

    impl NodeRows for Bounded {
        type P = f64;
        type Q = f64;
        fn target_row(&self, _: usize) -> Result<ArrayView1<'_, f64>, CoreError> {
            unreachable!("the float64 rows are not read")
        }
        fn target_at(&self, _: usize, _: usize) -> Result<f64, CoreError> {
            unreachable!("the float64 rows are not read")
        }
        fn draft_row(&self, _: usize) -> Result<Option<ArrayView1<'_, f64>>, CoreError> {
            unreachable!("the float64 rows are not read")
        }
        fn draft_at(&self, _: usize, _: usize) -> Result<f64, CoreError> {
            unreachable!("the float64 rows are not read")
        }
        fn surely_bounds(&self, _: usize, c: usize, _: usize) -> Option<[(f64, f64); 2]> {
            Some(self.0[c - 1])
        }
        fn argmax(&self, _: usize) -> Result<usize, CoreError> {
            unreachable!("sampled rows")
        }
        fn at(&self, n: usize) -> RowAt {
            RowAt {
                arg: "target_probs",
                pos: Pos::Padded { b: 0, t: n },
            }
        }
    }

    /// `surely_first_leaf` on a chain, one edge per entry of `edges` (node 1's
    /// token `token`, the others 3), with the leaf's uniform `u`.
    fn first_leaf(edges: &[[(f64, f64); 2]], u: f64, token: i64) -> Option<usize> {
        let nodes = edges.len() + 1;
        let ids: Vec<i64> = (0..nodes).map(|n| if n == 1 { token } else { 3 }).collect();
        let first_child: Vec<usize> = (1..=nodes)
            .map(|c| if c < nodes { c } else { usize::MAX })
            .collect();
        let token = |c: usize| check_token("node_token_ids", &[0, c], ids[c], 10);
        let uniform = |n: usize| match n + 1 == nodes {
            true => check_uniform(u, "uniforms", &[0, n]),
            false => unreachable!("only the leaf's uniform is read"),
        };
        surely_first_leaf(&Bounded(edges.to_vec()), &first_child, token, uniform)
    }

    #[test]
    fn the_first_leaf_is_accepted_only_below_every_rate_the_bounds_allow() {
        // p = 0.2, q = 0.4 on each edge of root -> 1 -> 2: rates 0.5, then 0.25.
        let exact = [[(0.2, 0.2), (0.4, 0.4)]; 2];
        assert_eq!(first_leaf(&exact, 0.25 * (1.0 - 1e-12), 3), Some(2));
        assert_eq!(first_leaf(&exact, 0.25, 3), None); // u = rate: rejected

        // Bounds 1e-6 wide: the rate's low end is about 2e-6 below it.
        let wide = [[(0.2, 0.2 * (1.0 + 1e-6)), (0.4, 0.4 * (1.0 + 1e-6))]; 2];
        assert_eq!(first_leaf(&wide, 0.25 * (1.0 - 1e-5), 3), Some(2));
        assert_eq!(first_leaf(&wide, 0.25 * (1.0 - 1e-6), 3), None);

        // The rate is capped at 1, and q = 0 gives 1.
        assert_eq!(
            first_leaf(&[[(0.9, 0.9), (0.1, 0.1)]; 2], 0.999, 3),
            Some(2)
        );
        assert_eq!(
            first_leaf(&[[(0.9, 0.9), (0.0, 0.0)]; 2], 0.999, 3),
            Some(2)
        );
        assert_eq!(first_leaf(&[[(0.9, 0.9), (0.0, 0.0)]], 0.999, 3), Some(1));

        // p that may be 0 gives rate 0 at most; so does a rate that underflows
        // to 0, even where a later q = 0 would give 1 (0 / 0 decides nothing).
        assert_eq!(first_leaf(&[[(0.0, 0.1), (0.1, 0.1)]; 2], 0.0, 3), None);
        let tiny = [(1e-200, 1e-200), (1.0, 1.0)];
        assert_eq!(first_leaf(&[tiny, tiny], 0.0, 3), None);
        assert_eq!(
            first_leaf(&[tiny, tiny, [(0.5, 0.5), (0.0, 0.0)]], 0.5, 3),
            None
        );

        // A token out of range, or a uniform that is not one, leaves it to the
        // float64 walk (which names it).
        assert_eq!(first_leaf(&exact, 0.1, 10), None);
        assert_eq!(first_leaf(&exact, f64::NAN, 3), None);
        assert_eq!(first_leaf(&exact, 1.0, 3), None);
    }
}
