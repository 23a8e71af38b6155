//! Chain verification: per row, decide drafted positions in order with the
//! acceptance rule (or by argmax for greedy rows), stop at the first rejection,
//! then emit one more token: a residual sample where the row was rejected, the
//! bonus token where every draft was accepted. Also the accepted-prefix scan and
//! greedy verification on precomputed target ids.

use ndarray::{s, ArrayView1, ArrayView2, ArrayView3, ArrayViewMut1, ArrayViewMut2, Ix1, Ix2};

use crate::block;
use crate::checks::{
    check_counts_shape, check_gathered, check_token, check_uniform, draft_len, expect_shape, Pos,
    RowAt,
};
use crate::error::{CoreError, RowErrors};
use crate::lossy::TypicalRow;
use crate::memory;
use crate::method::Method;
use crate::prob::Prob;
use crate::rule::is_accepted;
use crate::sample::{
    argmax_of, residual_mass, sample_residual, sample_target, zero_row, SUM_BLOCK,
};
use crate::threads;
use crate::view::{FloatView, Greedy, IntView};

/// The inputs of `verify`, as docs/spec.md section 2.1 names them.
pub struct ChainInputs<'a, P, Q> {
    /// `[B, K]` drafted tokens.
    pub draft_token_ids: IntView<'a, Ix2>,
    /// `[B, K+1, V]` target probabilities; row `k_b` is the bonus distribution.
    pub target_probs: ArrayView3<'a, P>,
    /// `[B, K, V]` draft probabilities, or `None` for deterministic (one-hot) drafts.
    pub draft_probs: Option<ArrayView3<'a, Q>>,
    /// `[B]` drafts per row, `0 <= k_b <= K`; `None` means `K` for every row.
    pub num_draft_tokens: Option<IntView<'a, Ix1>>,
    /// `[B, K]` uniform draws `u_t` (needed by rows verified by sampling).
    pub uniforms: Option<FloatView<'a, Ix2>>,
    /// `[B]` uniform draws for the replacement or bonus sample.
    pub recovery_uniforms: Option<FloatView<'a, Ix1>>,
    pub greedy: Greedy<'a>,
    pub method: Method<'a>,
}

/// The flattened ragged layout serving engines use (vLLM's `SpecDecodeMetadata`):
/// the drafts of every row back to back, row `b` owning entries
/// `start_b .. start_b + k_b` with `start_b = k_0 + .. + k_{b-1}`, and the bonus
/// token given rather than sampled. Output rows have `K + 1 = max(k_b) + 1`
/// entries. A draft id of [`PLACEHOLDER_TOKEN_ID`] (`-1`, vLLM's padding of
/// unused draft slots) ends its row's drafts there: the slots from it on are
/// not read, and when every draft before it is accepted, the next token comes
/// from the target's row at the placeholder's slot (sampled, or its argmax for
/// a greedy row) instead of `bonus_token_ids`.
pub struct FlatChainInputs<'a, P, Q> {
    /// `[T]` drafted tokens, `T = sum(k_b)`.
    pub draft_token_ids: IntView<'a, Ix1>,
    /// `[B]` drafts per row, `k_b >= 0`.
    pub num_draft_tokens: IntView<'a, Ix1>,
    /// `[T, V]` target probabilities at each drafted position.
    pub target_probs: ArrayView2<'a, P>,
    /// `[T, V]` draft probabilities, or `None` for deterministic drafts.
    pub draft_probs: Option<ArrayView2<'a, Q>>,
    /// `[B]` the token emitted after a row whose drafts were all accepted.
    pub bonus_token_ids: IntView<'a, Ix1>,
    /// `[T]` uniform draws `u_t` (needed by rows verified by sampling).
    pub uniforms: Option<FloatView<'a, Ix1>>,
    /// `[B]` uniform draws for the replacement sample.
    pub recovery_uniforms: Option<FloatView<'a, Ix1>>,
    pub greedy: Greedy<'a>,
    pub method: Method<'a>,
}

/// Where `verify` writes its result.
pub struct ChainOutputs<'a> {
    /// `[B, K+1]`: the `n_b + 1` emitted tokens, then `-1`.
    pub output_token_ids: ArrayViewMut2<'a, i64>,
    /// `[B]`: `n_b`, the accepted prefix length.
    pub num_accepted: ArrayViewMut1<'a, i64>,
    /// `[B]`: `n_b + 1`.
    pub num_emitted: ArrayViewMut1<'a, i64>,
}

threads::rows_of_views!(ChainOutputs {
    output_token_ids,
    num_accepted,
    num_emitted,
});

/// `B`, `K` and `V` of a chain batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChainDims {
    pub batch: usize,
    pub num_draft: usize,
    pub vocab: usize,
}

impl<P: Prob, Q: Prob> ChainInputs<'_, P, Q> {
    /// Checks every shape against `draft_token_ids [B, K]` and `target_probs [B, K+1, V]`.
    pub fn dims(&self) -> Result<ChainDims, CoreError> {
        let &[batch, num_draft] = self.draft_token_ids.shape() else {
            return Err(CoreError::shape("draft_token_ids", "must be 2-D [B, K]"));
        };
        let &[_, _, vocab] = self.target_probs.shape() else {
            unreachable!("ArrayView3 has three axes")
        };
        expect_shape(
            "target_probs",
            self.target_probs.shape(),
            &[batch, num_draft + 1, vocab],
            "[B, K+1, V] with B, K from draft_token_ids",
        )?;
        if let Some(q) = &self.draft_probs {
            expect_shape(
                "draft_probs",
                q.shape(),
                &[batch, num_draft, vocab],
                "[B, K, V]",
            )?;
        }
        check_counts_shape(self.num_draft_tokens.as_ref(), batch)?;
        if let Some(u) = &self.uniforms {
            expect_shape("uniforms", u.shape(), &[batch, num_draft], "[B, K]")?;
        }
        if let Some(u) = &self.recovery_uniforms {
            expect_shape("recovery_uniforms", u.shape(), &[batch], "[B]")?;
        }
        if let Greedy::PerRow(g) = &self.greedy {
            expect_shape("greedy", g.shape(), &[batch], "[B] or a scalar")?;
        }
        Ok(ChainDims {
            batch,
            num_draft,
            vocab,
        })
    }
}

fn check_outputs(out: &ChainOutputs<'_>, batch: usize, num_draft: usize) -> Result<(), CoreError> {
    expect_shape(
        "out.output_token_ids",
        out.output_token_ids.shape(),
        &[batch, num_draft + 1],
        "[B, K+1]",
    )?;
    expect_shape(
        "out.num_accepted",
        out.num_accepted.shape(),
        &[batch],
        "[B]",
    )?;
    expect_shape("out.num_emitted", out.num_emitted.shape(), &[batch], "[B]")
}

/// What verifying one row reads, whatever the layout of the batch.
trait Chain<P: Prob, Q: Prob>: Sync {
    fn dims(&self) -> Result<ChainDims, CoreError>;
    fn method(&self) -> Method<'_>;
    fn is_greedy(&self, b: usize) -> bool;
    /// `k_b`, checked against `[0, K]`.
    fn draft_len(&self, b: usize, dims: ChainDims) -> Result<usize, CoreError>;
    fn pos(&self, b: usize, t: usize) -> Pos;
    /// Where target row `t` of row `b` lives, to name a bad value in it.
    fn target_at(&self, b: usize, t: usize) -> RowAt {
        RowAt {
            arg: "target_probs",
            pos: self.pos(b, t),
        }
    }
    fn draft_id(&self, b: usize, t: usize) -> i64;
    /// Target row `t` of row `b`; `t = k_b` (the bonus row) only when [`Chain::bonus`] is `None`.
    fn target_row(&self, b: usize, t: usize) -> ArrayView1<'_, P>;
    fn draft_row(&self, b: usize, t: usize) -> Option<ArrayView1<'_, Q>>;
    fn has_uniforms(&self) -> bool;
    fn uniform(&self, b: usize, t: usize) -> Option<f64>;
    fn recovery(&self, b: usize) -> Option<f64>;
    /// The bonus token when it is given rather than sampled from the target.
    fn bonus(&self, b: usize) -> Option<i64>;
}

impl<P: Prob, Q: Prob> Chain<P, Q> for ChainInputs<'_, P, Q> {
    fn dims(&self) -> Result<ChainDims, CoreError> {
        ChainInputs::dims(self)
    }
    fn method(&self) -> Method<'_> {
        self.method
    }
    fn is_greedy(&self, b: usize) -> bool {
        self.greedy.row(b)
    }
    fn draft_len(&self, b: usize, dims: ChainDims) -> Result<usize, CoreError> {
        draft_len(self.num_draft_tokens.as_ref(), b, dims.num_draft)
    }
    fn pos(&self, b: usize, t: usize) -> Pos {
        Pos::Padded { b, t }
    }
    fn draft_id(&self, b: usize, t: usize) -> i64 {
        self.draft_token_ids.get(b, t)
    }
    fn target_row(&self, b: usize, t: usize) -> ArrayView1<'_, P> {
        self.target_probs.slice(s![b, t, ..])
    }
    fn draft_row(&self, b: usize, t: usize) -> Option<ArrayView1<'_, Q>> {
        self.draft_probs.as_ref().map(|q| q.slice(s![b, t, ..]))
    }
    fn has_uniforms(&self) -> bool {
        self.uniforms.is_some()
    }
    fn uniform(&self, b: usize, t: usize) -> Option<f64> {
        self.uniforms.as_ref().map(|u| u.get(b, t))
    }
    fn recovery(&self, b: usize) -> Option<f64> {
        self.recovery_uniforms.as_ref().map(|u| u.get(b))
    }
    fn bonus(&self, _b: usize) -> Option<i64> {
        None
    }
}

impl<P: Prob, Q: Prob> FlatChainInputs<'_, P, Q> {
    /// The first flat entry of each row, and `T`; checks `k_b >= 0`.
    fn starts(&self) -> Result<(Vec<usize>, usize), CoreError> {
        let &[batch] = self.num_draft_tokens.shape() else {
            unreachable!("IntView<Ix1> has one axis")
        };
        let mut starts = memory::with_capacity(batch, "num_draft_tokens")?;
        let mut total = 0usize;
        for b in 0..batch {
            let k = self.num_draft_tokens.get(b);
            if k < 0 {
                return Err(CoreError::value(
                    "num_draft_tokens",
                    &[b],
                    format!("= {k} is negative"),
                ));
            }
            starts.push(total);
            total = total.saturating_add(k as usize);
        }
        Ok((starts, total))
    }

    /// Checks every shape against `num_draft_tokens [B]` (`T` their sum) and
    /// `target_probs [T, V]`; `K` is the largest count.
    pub fn dims(&self) -> Result<ChainDims, CoreError> {
        let i = self;
        // The `[B]` arguments first: a cheap check before the walk over the counts.
        let batch = i.num_draft_tokens.shape()[0];
        expect_shape(
            "bonus_token_ids",
            i.bonus_token_ids.shape(),
            &[batch],
            "[B]",
        )?;
        if let Some(u) = &i.recovery_uniforms {
            expect_shape("recovery_uniforms", u.shape(), &[batch], "[B]")?;
        }
        if let Greedy::PerRow(g) = &i.greedy {
            expect_shape("greedy", g.shape(), &[batch], "[B] or a scalar")?;
        }
        let (_, total) = i.starts()?;
        let num_draft = (0..batch)
            .map(|b| i.num_draft_tokens.get(b) as usize)
            .max()
            .unwrap_or(0);
        let &[_, vocab] = i.target_probs.shape() else {
            unreachable!("ArrayView2 has two axes")
        };
        expect_shape(
            "draft_token_ids",
            i.draft_token_ids.shape(),
            &[total],
            "[T], T = sum(num_draft_tokens)",
        )?;
        expect_shape(
            "target_probs",
            i.target_probs.shape(),
            &[total, vocab],
            "[T, V]",
        )?;
        if let Some(q) = &i.draft_probs {
            expect_shape("draft_probs", q.shape(), &[total, vocab], "[T, V]")?;
        }
        if let Some(u) = &i.uniforms {
            expect_shape("uniforms", u.shape(), &[total], "[T]")?;
        }
        Ok(ChainDims {
            batch,
            num_draft,
            vocab,
        })
    }
}

/// [`FlatChainInputs`] with its row starts worked out.
struct Flat<'i, 'a, P, Q> {
    inputs: &'i FlatChainInputs<'a, P, Q>,
    starts: Vec<usize>,
}

/// vLLM's padding of draft slots: a draft id equal to it ends its row's drafts.
pub const PLACEHOLDER_TOKEN_ID: i64 = -1;

impl<P, Q> Flat<'_, '_, P, Q> {
    /// Row `b`'s drafts: its slot up to the first [`PLACEHOLDER_TOKEN_ID`].
    fn drafts(&self, b: usize) -> usize {
        let slot = self.inputs.num_draft_tokens.get(b) as usize;
        let start = self.starts[b];
        (0..slot)
            .position(|t| self.inputs.draft_token_ids.get(start + t) == PLACEHOLDER_TOKEN_ID)
            .unwrap_or(slot)
    }
}

impl<P: Prob, Q: Prob> Chain<P, Q> for Flat<'_, '_, P, Q> {
    fn dims(&self) -> Result<ChainDims, CoreError> {
        self.inputs.dims()
    }
    fn method(&self) -> Method<'_> {
        self.inputs.method
    }
    fn is_greedy(&self, b: usize) -> bool {
        self.inputs.greedy.row(b)
    }
    fn draft_len(&self, b: usize, _dims: ChainDims) -> Result<usize, CoreError> {
        Ok(self.drafts(b))
    }
    fn pos(&self, b: usize, t: usize) -> Pos {
        Pos::Flat {
            row: self.starts[b] + t,
        }
    }
    fn draft_id(&self, b: usize, t: usize) -> i64 {
        self.inputs.draft_token_ids.get(self.starts[b] + t)
    }
    fn target_row(&self, b: usize, t: usize) -> ArrayView1<'_, P> {
        self.inputs.target_probs.row(self.starts[b] + t)
    }
    fn draft_row(&self, b: usize, t: usize) -> Option<ArrayView1<'_, Q>> {
        let row = self.starts[b] + t;
        self.inputs.draft_probs.as_ref().map(|q| q.row(row))
    }
    fn has_uniforms(&self) -> bool {
        self.inputs.uniforms.is_some()
    }
    fn uniform(&self, b: usize, t: usize) -> Option<f64> {
        self.inputs
            .uniforms
            .as_ref()
            .map(|u| u.get(self.starts[b] + t))
    }
    fn recovery(&self, b: usize) -> Option<f64> {
        self.inputs.recovery_uniforms.as_ref().map(|u| u.get(b))
    }
    fn bonus(&self, b: usize) -> Option<i64> {
        // Drafts cut short by a placeholder continue from the target's row
        // after the last real draft; the given bonus follows the whole slot.
        let slot = self.inputs.num_draft_tokens.get(b) as usize;
        (self.drafts(b) == slot).then(|| self.inputs.bonus_token_ids.get(b))
    }
}

/// Chain verification of a batch (docs/spec.md section 2). Large batches are
/// split into runs of rows verified in parallel (see [`threads`]); the result
/// is the same bits either way, and an error names the first bad row (or,
/// isolating, each bad row's error is stored: see [`RowErrors`]). On error
/// the outputs hold partial results and must be discarded.
pub fn verify<P: Prob, Q: Prob>(
    inputs: &ChainInputs<'_, P, Q>,
    out: &mut ChainOutputs<'_>,
    errors: RowErrors<'_>,
) -> Result<(), CoreError> {
    run(inputs, out, errors)
}

/// Chain verification of a batch in the flat layout ([`FlatChainInputs`]):
/// the same rule and the same kernel as [`verify`], rows read from their
/// offsets, and the given bonus token emitted after a fully accepted row.
pub fn verify_flat<P: Prob, Q: Prob>(
    inputs: &FlatChainInputs<'_, P, Q>,
    out: &mut ChainOutputs<'_>,
    errors: RowErrors<'_>,
) -> Result<(), CoreError> {
    let (starts, _) = inputs.starts()?;
    run(&Flat { inputs, starts }, out, errors)
}

fn run<P: Prob, Q: Prob, C: Chain<P, Q>>(
    chain: &C,
    out: &mut ChainOutputs<'_>,
    errors: RowErrors<'_>,
) -> Result<(), CoreError> {
    let dims = chain.dims()?;
    chain.method().check(dims.num_draft)?;
    check_outputs(out, dims.batch, dims.num_draft)?;
    errors.check(dims.batch)?;
    // Every row reads at least one row of V (bonus or residual); a greedy row
    // reads up to K + 1 of them.
    let rows_read: usize = (0..dims.batch)
        .map(|b| {
            if chain.is_greedy(b) {
                dims.num_draft + 1
            } else {
                1
            }
        })
        .sum();
    let out = ChainOutputs {
        output_token_ids: out.output_token_ids.view_mut(),
        num_accepted: out.num_accepted.view_mut(),
        num_emitted: out.num_emitted.view_mut(),
    };
    threads::in_runs(
        rows_read.saturating_mul(dims.vocab),
        (out, errors),
        |first_row, (mut part, mut errors)| {
            verify_rows(chain, dims, first_row, &mut part, &mut errors)
        },
    )
}

/// Verifies rows `first_row..` into `out` (which holds exactly those rows).
fn verify_rows<P: Prob, Q: Prob, C: Chain<P, Q>>(
    chain: &C,
    dims: ChainDims,
    first_row: usize,
    out: &mut ChainOutputs<'_>,
    errors: &mut RowErrors<'_>,
) -> Result<(), CoreError> {
    let mut scratch = memory::with_capacity(dims.vocab.div_ceil(SUM_BLOCK), "target_probs")?;
    for (i, mut row) in out.output_token_ids.rows_mut().into_iter().enumerate() {
        let b = first_row + i;
        let n = match verify_row(chain, dims, b, &mut row, &mut scratch) {
            Ok(n) => n as i64,
            Err(error) => {
                errors.record(i, error.in_row(b))?;
                row.fill(-1);
                out.num_accepted[i] = 0;
                out.num_emitted[i] = 0;
                continue;
            }
        };
        out.num_accepted[i] = n;
        out.num_emitted[i] = n + 1;
    }
    Ok(())
}

/// Verifies row `b`, writes its emitted tokens and `-1` padding, returns `n_b`.
fn verify_row<P: Prob, Q: Prob, C: Chain<P, Q>>(
    chain: &C,
    dims: ChainDims,
    b: usize,
    out_row: &mut ArrayViewMut1<'_, i64>,
    scratch: &mut Vec<f64>,
) -> Result<usize, CoreError> {
    let k = chain.draft_len(b, dims)?;
    for t in 0..k {
        let (index, len) = chain.pos(b, t).buf(None);
        check_token(
            "draft_token_ids",
            &index[..len],
            chain.draft_id(b, t),
            dims.vocab,
        )?;
    }
    let bonus = match chain.bonus(b) {
        Some(x) => Some(check_token("bonus_token_ids", &[b], x, dims.vocab)?),
        None => None,
    };
    let target_at = |t: usize| chain.target_at(b, t);

    let (n, next) = if chain.is_greedy(b) {
        let mut n = k;
        let mut choice = None;
        for t in 0..k {
            let best = argmax_of(chain.target_row(b, t), target_at(t))?;
            if best != chain.draft_id(b, t) as usize {
                n = t;
                choice = Some(best);
                break;
            }
        }
        let next = match (choice, bonus) {
            (Some(best), _) => best,
            (None, Some(given)) => given,
            (None, None) => argmax_of(chain.target_row(b, k), target_at(k))?,
        };
        (n, next)
    } else {
        let (true, Some(recovery_u)) = (chain.has_uniforms(), chain.recovery(b)) else {
            return Err(missing_uniforms());
        };
        // Every uniform the row owns is checked, also past its first rejection.
        for t in 0..k {
            let u = chain.uniform(b, t).ok_or_else(missing_uniforms)?;
            let (index, len) = chain.pos(b, t).buf(None);
            check_uniform(u, "uniforms", &index[..len])?;
        }
        let recovery_u = check_uniform(recovery_u, "recovery_uniforms", &[b])?;
        match chain.method() {
            Method::Token => {
                let decision = token_prefix(chain, b, k)?;
                exact_next(chain, b, k, decision, bonus, recovery_u, scratch)?
            }
            Method::Block => {
                let decision = block_prefix(chain, b, k, scratch)?;
                exact_next(chain, b, k, decision, bonus, recovery_u, scratch)?
            }
            Method::Typical { epsilon, delta } => {
                typical_row(chain, b, k, (epsilon, delta), bonus, recovery_u, scratch)?
            }
            Method::Synthetic(rates) => {
                let n = (0..k)
                    .find(|&t| chain.uniform(b, t).is_some_and(|u| u >= rates[t]))
                    .unwrap_or(k);
                let next = match bonus {
                    Some(given) if n == k => given,
                    _ => draw_from_target(chain, b, n, recovery_u, scratch)?,
                };
                (n, next)
            }
        }
    };
    for t in 0..n {
        out_row[t] = chain.draft_id(b, t);
    }
    out_row[n] = next as i64;
    for t in n + 1..out_row.len() {
        out_row[t] = -1;
    }
    Ok(n)
}

/// The token after an exact rule's prefix: from the residual at `n_b < k_b`
/// (`max(0, scale * p - q)`, or `p` with the draft zeroed for one-hot drafts),
/// else the bonus token (given, or drawn from `p_{k_b}`).
fn exact_next<P: Prob, Q: Prob, C: Chain<P, Q>>(
    chain: &C,
    b: usize,
    k: usize,
    decision: Decision,
    bonus: Option<usize>,
    recovery_u: f64,
    scratch: &mut Vec<f64>,
) -> Result<(usize, usize), CoreError> {
    let target_at = |t: usize| chain.target_at(b, t);
    let n = decision.accepted;
    let next = if n < k {
        let x = chain.draft_id(b, n) as usize;
        let residual = match chain.draft_row(b, n) {
            Some(q) => sample_residual(
                chain.target_row(b, n),
                q,
                chain.pos(b, n),
                decision.scale,
                recovery_u,
                scratch,
                decision.residual_mass,
            )?,
            // One-hot drafts: p with the draft zeroed (any scale gives the same law).
            None => sample_target(
                chain.target_row(b, n),
                Some(x),
                target_at(n),
                recovery_u,
                scratch,
            )?,
        };
        match residual {
            Some(token) => token,
            // Only rounding or unnormalised rows get here: sample from p itself.
            None => draw_from_target(chain, b, n, recovery_u, scratch)?,
        }
    } else if let Some(given) = bonus {
        given
    } else {
        draw_from_target(chain, b, k, recovery_u, scratch)?
    };
    Ok((n, next))
}

/// A draw from the target row `p_t` itself: the bonus token, and the fallbacks;
/// a row summing to 0 is an error.
fn draw_from_target<P: Prob, Q: Prob, C: Chain<P, Q>>(
    chain: &C,
    b: usize,
    t: usize,
    u: f64,
    scratch: &mut Vec<f64>,
) -> Result<usize, CoreError> {
    let at = chain.target_at(b, t);
    sample_target(chain.target_row(b, t), None, at, u, scratch)?.ok_or_else(|| zero_row(at))
}

/// Typical acceptance (docs/spec.md section 2.7; lossy): each position against
/// its row's threshold until the first failure, then a draw from the row at
/// `n_b` restricted to its typical entries (a given bonus token at `k_b`).
fn typical_row<P: Prob, Q: Prob, C: Chain<P, Q>>(
    chain: &C,
    b: usize,
    k: usize,
    (epsilon, delta): (f64, f64),
    bonus: Option<usize>,
    recovery_u: f64,
    scratch: &mut Vec<f64>,
) -> Result<(usize, usize), CoreError> {
    let target_at = |t: usize| chain.target_at(b, t);
    let mut terms = Vec::new();
    for t in 0..=k {
        if t == k {
            if let Some(given) = bonus {
                return Ok((k, given));
            }
        }
        let row = chain.target_row(b, t);
        let typical = TypicalRow::of(row, target_at(t), epsilon, delta, scratch, &mut terms)?;
        if t < k {
            let (p, _) = gathered(chain, b, t)?;
            if typical.accepts(p) {
                continue;
            }
        }
        let next = typical.sample(row, target_at(t), recovery_u, scratch, &mut terms)?;
        return Ok((t, next));
    }
    unreachable!("the loop returns at t = k")
}

/// What a sampled row's rule decided: `n_b`, and the residual to sample at
/// `n_b < k_b`: `max(0, scale * p - q)`, whose mass is already summed into the
/// scratch block sums when `residual_mass` is known.
struct Decision {
    accepted: usize,
    scale: f64,
    residual_mass: Option<f64>,
}

/// The token rule: accept position by position, stop at the first rejection
/// (docs/spec.md section 2.2).
fn token_prefix<P: Prob, Q: Prob, C: Chain<P, Q>>(
    chain: &C,
    b: usize,
    k: usize,
) -> Result<Decision, CoreError> {
    let mut n = k;
    for t in 0..k {
        let (p, q) = gathered(chain, b, t)?;
        let u = chain.uniform(b, t).ok_or_else(missing_uniforms)?;
        if !is_accepted(p, q, u) {
            n = t;
            break;
        }
    }
    Ok(Decision {
        accepted: n,
        scale: 1.0,
        residual_mass: None,
    })
}

/// `p_t(x_t)` and `q_t(x_t)` (1 for one-hot drafts), checked against `[0, 1]`.
fn gathered<P: Prob, Q: Prob, C: Chain<P, Q>>(
    chain: &C,
    b: usize,
    t: usize,
) -> Result<(f64, f64), CoreError> {
    let x = chain.draft_id(b, t) as usize;
    let (index, len) = chain.pos(b, t).buf(Some(x));
    let index = &index[..len];
    let p = check_gathered(chain.target_row(b, t)[x].to_f64(), "target_probs", index)?;
    let q = match chain.draft_row(b, t) {
        Some(row) => check_gathered(row[x].to_f64(), "draft_probs", index)?,
        None => 1.0,
    };
    Ok((p, q))
}

/// The block rule (docs/spec.md section 2.6): the path weights `rho_i` from
/// every gathered value, then `tau`, the largest `i` with `eta_i < h_i`,
/// searched from the top down so that a row accepted whole reads no full row
/// and each step down reads one more pair of rows, except a step whose
/// `eta_i >= rho_i` (then `h_i <= rho_i` fails it without a round).
fn block_prefix<P: Prob, Q: Prob, C: Chain<P, Q>>(
    chain: &C,
    b: usize,
    k: usize,
    scratch: &mut Vec<f64>,
) -> Result<Decision, CoreError> {
    // rho_0 = 1, and the gathered p_i(x_i) (k is at most K: small).
    let mut rho = Vec::with_capacity(k + 1);
    let mut p_drafted = Vec::with_capacity(k);
    rho.push(1.0);
    for t in 0..k {
        let (p, q) = gathered(chain, b, t)?;
        p_drafted.push(p);
        rho.push(block::next_rho(rho[t], p, q));
    }
    let eta = |i: usize| chain.uniform(b, i - 1).ok_or_else(missing_uniforms);
    if k > 0 && eta(k)? < rho[k] {
        return Ok(Decision {
            accepted: k,
            scale: rho[k],
            residual_mass: None,
        });
    }
    for i in (1..k).rev() {
        if eta(i)? >= rho[i] {
            continue; // h_i <= rho_i: fails without its round
        }
        let (z, mass) = match chain.draft_row(b, i) {
            Some(q) => {
                let z = residual_mass(
                    chain.target_row(b, i),
                    q,
                    chain.pos(b, i),
                    rho[i],
                    scratch,
                    false,
                )?;
                (z, Some(z))
            }
            None => (block::one_hot_mass(rho[i], p_drafted[i]), None),
        };
        if eta(i)? < block::h(z, rho[i]) {
            return Ok(Decision {
                accepted: i,
                scale: rho[i],
                residual_mass: mass,
            });
        }
    }
    Ok(Decision {
        accepted: 0,
        scale: 1.0,
        residual_mass: None,
    })
}

fn missing_uniforms() -> CoreError {
    CoreError::shape(
        "uniforms",
        "uniforms and recovery_uniforms are required for rows verified by sampling",
    )
}

/// Accepted prefix length per row of a `[B, K]` acceptance mask: the number of
/// leading `true` among the first `k_b` positions.
pub fn accepted_prefix_length(
    accepted: ArrayView2<'_, bool>,
    num_draft_tokens: Option<IntView<'_, Ix1>>,
    mut out: ArrayViewMut1<'_, i64>,
) -> Result<(), CoreError> {
    let &[batch, num_draft] = accepted.shape() else {
        unreachable!("ArrayView2 has two axes")
    };
    check_counts_shape(num_draft_tokens.as_ref(), batch)?;
    expect_shape("out", out.shape(), &[batch], "[B]")?;
    for b in 0..batch {
        let k = draft_len(num_draft_tokens.as_ref(), b, num_draft)?;
        let row = accepted.row(b);
        let n = (0..k).position(|t| !row[t]).unwrap_or(k);
        out[b] = n as i64;
    }
    Ok(())
}

/// The inputs of `verify_greedy`: drafts checked against target argmax ids
/// computed elsewhere.
pub struct GreedyIdsInputs<'a> {
    /// `[B, K]` drafted tokens.
    pub draft_token_ids: IntView<'a, Ix2>,
    /// `[B, K+1]` the target's argmax token at each position; column `k_b` is the bonus.
    pub target_token_ids: IntView<'a, Ix2>,
    pub num_draft_tokens: Option<IntView<'a, Ix1>>,
}

impl GreedyIdsInputs<'_> {
    /// Checks every shape against `draft_token_ids [B, K]`; returns `(B, K)`.
    pub fn dims(&self) -> Result<(usize, usize), CoreError> {
        let &[batch, num_draft] = self.draft_token_ids.shape() else {
            return Err(CoreError::shape("draft_token_ids", "must be 2-D [B, K]"));
        };
        expect_shape(
            "target_token_ids",
            self.target_token_ids.shape(),
            &[batch, num_draft + 1],
            "[B, K+1] with B, K from draft_token_ids",
        )?;
        check_counts_shape(self.num_draft_tokens.as_ref(), batch)?;
        Ok((batch, num_draft))
    }
}

/// Greedy verification on ids: integer compares and a prefix scan.
pub fn verify_greedy(
    inputs: &GreedyIdsInputs<'_>,
    out: &mut ChainOutputs<'_>,
) -> Result<(), CoreError> {
    let (batch, num_draft) = inputs.dims()?;
    check_outputs(out, batch, num_draft)?;
    let (drafts, targets) = (&inputs.draft_token_ids, &inputs.target_token_ids);
    for b in 0..batch {
        let k = draft_len(inputs.num_draft_tokens.as_ref(), b, num_draft)?;
        for t in 0..k {
            let x = drafts.get(b, t);
            if x < 0 {
                return Err(CoreError::value(
                    "draft_token_ids",
                    &[b, t],
                    format!("= {x} is negative; token ids must be >= 0"),
                ));
            }
        }
        let n = (0..k)
            .position(|t| drafts.get(b, t) != targets.get(b, t))
            .unwrap_or(k);
        let mut row = out.output_token_ids.row_mut(b);
        for t in 0..=n {
            let y = targets.get(b, t);
            if y < 0 {
                return Err(CoreError::value(
                    "target_token_ids",
                    &[b, t],
                    format!("= {y} is negative; token ids must be >= 0"),
                ));
            }
            row[t] = y;
        }
        for t in n + 1..=num_draft {
            row[t] = -1;
        }
        out.num_accepted[b] = n as i64;
        out.num_emitted[b] = n as i64 + 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::{array, Array1, Array2, Array3};

    #[derive(Debug)]
    struct Out {
        ids: Array2<i64>,
        accepted: Array1<i64>,
        emitted: Array1<i64>,
    }

    impl Out {
        fn new(batch: usize, num_draft: usize) -> Self {
            Out {
                ids: Array2::zeros((batch, num_draft + 1)),
                accepted: Array1::zeros(batch),
                emitted: Array1::zeros(batch),
            }
        }
        fn views(&mut self) -> ChainOutputs<'_> {
            ChainOutputs {
                output_token_ids: self.ids.view_mut(),
                num_accepted: self.accepted.view_mut(),
                num_emitted: self.emitted.view_mut(),
            }
        }
    }

    fn run(
        ids: &Array2<i64>,
        p: &Array3<f64>,
        q: Option<&Array3<f32>>,
        counts: Option<&Array1<i32>>,
        u: &Array2<f64>,
        ru: &Array1<f64>,
    ) -> Result<Out, CoreError> {
        let mut out = Out::new(ids.nrows(), ids.ncols());
        let inputs = ChainInputs {
            draft_token_ids: IntView::I64(ids.view()),
            target_probs: p.view(),
            draft_probs: q.map(|q| q.view()),
            num_draft_tokens: counts.map(|c| IntView::I32(c.view())),
            uniforms: Some(FloatView::F64(u.view())),
            recovery_uniforms: Some(FloatView::F64(ru.view())),
            greedy: Greedy::All(false),
            method: Method::Token,
        };
        verify(&inputs, &mut out.views(), RowErrors::Raise)?;
        Ok(out)
    }

    #[test]
    fn worked_example_accepts_below_three_quarters() {
        let p = array![[[0.6, 0.4], [0.0, 1.0]]];
        let q = array![[[0.8f32, 0.2]]];
        let ids = array![[0i64]];
        let accepted = run(&ids, &p, Some(&q), None, &array![[0.7]], &array![0.5]).unwrap();
        assert_eq!(
            accepted.ids,
            array![[0, 1]],
            "draft kept, bonus from [0, 1]"
        );
        assert_eq!(accepted.accepted, array![1]);
        let rejected = run(&ids, &p, Some(&q), None, &array![[0.75]], &array![0.0]).unwrap();
        // Residual max(0, p - q) = [0, 0.2]: token 1.
        assert_eq!(rejected.ids, array![[1, -1]]);
        assert_eq!(rejected.emitted, array![1]);
    }

    #[test]
    fn ragged_rows_ignore_positions_past_their_length() {
        let mut p = Array3::<f64>::zeros((2, 3, 4));
        p.slice_mut(s![.., .., 2]).fill(1.0); // drafts of token 2 always accepted
        p[[1, 1, 2]] = 0.0;
        p[[1, 1, 3]] = 1.0; // row 1 (k = 1): bonus row 1 is one-hot at 3
        let ids = array![[2i64, 2], [2, -1]];
        let out = run(
            &ids,
            &p,
            None,
            Some(&array![2, 1]),
            &Array2::zeros((2, 2)),
            &array![0.3, 0.3],
        )
        .unwrap();
        assert_eq!(out.ids, array![[2, 2, 2], [2, 3, -1]]);
        assert_eq!(out.accepted, array![2, 1]);
        assert_eq!(out.emitted, array![3, 2]);
    }

    #[test]
    fn strided_views_give_the_same_tokens_as_contiguous_ones() {
        let vocab = 600; // more than two summation blocks
        let p = Array3::from_shape_fn((2, 3, vocab), |(b, t, i)| {
            ((b * 31 + t * 7 + i * 13) % 97) as f64 / 97.0
        });
        let q = Array3::from_shape_fn((2, 2, vocab), |(b, t, i)| {
            ((b * 17 + t * 5 + i * 29) % 89) as f32 / 89.0
        });
        let ids = array![[5i64, 9], [400, 3]];
        let u = array![[0.9, 0.1], [0.99, 0.5]];
        let ru = array![0.37, 0.81];
        let contiguous = run(&ids, &p, Some(&q), None, &u, &ru).unwrap();
        // The same values behind reversed strides.
        let mut p_rev = Array3::<f64>::zeros((2, 3, vocab));
        p_rev.assign(&p.slice(s![.., .., ..;-1]));
        let p_view = p_rev.slice(s![.., .., ..;-1]);
        let mut out = Out::new(2, 2);
        let inputs = ChainInputs {
            draft_token_ids: IntView::I64(ids.view()),
            target_probs: p_view,
            draft_probs: Some(q.view()),
            num_draft_tokens: None,
            uniforms: Some(FloatView::F64(u.view())),
            recovery_uniforms: Some(FloatView::F64(ru.view())),
            greedy: Greedy::All(false),
            method: Method::Token,
        };
        verify(&inputs, &mut out.views(), RowErrors::Raise).unwrap();
        assert_eq!(out.ids, contiguous.ids);
        assert_eq!(out.accepted, contiguous.accepted);
    }

    #[test]
    fn parallel_rows_match_the_calling_thread_and_report_the_first_bad_row() {
        // Big enough for the pool: B * V >= PARALLEL_MIN_ELEMENTS.
        let (batch, k, vocab) = (37, 3, 12000);
        assert!(batch * vocab >= threads::PARALLEL_MIN_ELEMENTS);
        let hash = |x: usize| (x.wrapping_mul(2654435761) % 1000) as f64 / 1000.0;
        let mut p = Array3::from_shape_fn((batch, k + 1, vocab), |(b, t, i)| {
            hash(b * 7919 + t * 104729 + i)
        });
        let q = Array3::from_shape_fn((batch, k, vocab), |(b, t, i)| {
            hash(b * 31 + t * 17 + i * 3).powi(2) as f32
        });
        let ids = Array2::from_shape_fn((batch, k), |(b, t)| ((b * 131 + t * 71) % vocab) as i64);
        let u = Array2::from_shape_fn((batch, k), |(b, t)| hash(b * 13 + t * 7) * 0.999);
        let ru = Array1::from_shape_fn(batch, |b| hash(b * 3 + 1) * 0.999);
        let counts = Array1::from_shape_fn(batch, |b| (b % (k + 1)) as i32);
        let greedy = Array1::from_shape_fn(batch, |b| b % 5 == 0);
        let verify_with = |threads_wanted: usize, p: &Array3<f64>| {
            threads::set_num_threads(threads_wanted).unwrap();
            let mut out = Out::new(batch, k);
            let inputs = ChainInputs {
                draft_token_ids: IntView::I64(ids.view()),
                target_probs: p.view(),
                draft_probs: Some(q.view()),
                num_draft_tokens: Some(IntView::I32(counts.view())),
                uniforms: Some(FloatView::F64(u.view())),
                recovery_uniforms: Some(FloatView::F64(ru.view())),
                greedy: Greedy::PerRow(greedy.view()),
                method: Method::Token,
            };
            verify(&inputs, &mut out.views(), RowErrors::Raise).map(|()| out)
        };
        let one = verify_with(1, &p).unwrap();
        let many = verify_with(3, &p).unwrap();
        assert!(
            threads::pool_for(batch, batch * vocab).is_some(),
            "the batch ran on the pool"
        );
        assert_eq!(one.ids, many.ids);
        assert_eq!(one.accepted, many.accepted);
        assert_eq!(one.emitted, many.emitted);
        assert!(one.accepted.iter().any(|&n| n > 0) && one.accepted.iter().any(|&n| n == 0));
        // Bad rows in two runs: the error is the first row's, as on one thread.
        p[[30, 0, 5]] = f64::NAN;
        p.slice_mut(s![6, .., ..]).fill(-1.0);
        let first = verify_with(1, &p).unwrap_err().to_string();
        assert!(first.starts_with("target_probs[6, 0, "), "{first}");
        assert_eq!(verify_with(3, &p).unwrap_err().to_string(), first);
        threads::set_num_threads(threads::default_num_threads()).unwrap();
    }

    #[test]
    fn greedy_rows_accept_the_argmax_and_emit_it() {
        let p = array![[[0.1, 0.8, 0.1], [0.5, 0.2, 0.3], [0.0, 0.0, 1.0]]];
        let ids = array![[1i64, 2]];
        let mut out = Out::new(1, 2);
        let inputs = ChainInputs::<f64, f64> {
            draft_token_ids: IntView::I64(ids.view()),
            target_probs: p.view(),
            draft_probs: None,
            num_draft_tokens: None,
            uniforms: None,
            recovery_uniforms: None,
            greedy: Greedy::All(true),
            method: Method::Token,
        };
        verify(&inputs, &mut out.views(), RowErrors::Raise).unwrap();
        assert_eq!(out.ids, array![[1, 0, -1]], "mismatch at 1: emit argmax 0");
    }

    #[test]
    fn errors_name_the_argument_and_index() {
        let p = array![[[0.5, 0.5], [0.5, 0.5]]];
        let u = array![[0.5]];
        let ru = array![0.5];
        let e = run(&array![[2i64]], &p, None, None, &u, &ru).unwrap_err();
        assert_eq!(
            e.to_string(),
            "draft_token_ids[0, 0] = 2 is outside [0, V) with V = 2"
        );
        let e = run(&array![[0i64]], &p, None, Some(&array![3]), &u, &ru).unwrap_err();
        assert_eq!(e.arg(), "num_draft_tokens");
        let e = run(&array![[0i64]], &p, None, None, &array![[1.0]], &ru).unwrap_err();
        assert_eq!(
            e.to_string(),
            "uniforms[0, 0] = 1.0: a uniform draw must lie in [0, 1)"
        );
        let bad = array![[[f64::NAN, 0.5], [0.5, 0.5]]];
        let e = run(&array![[0i64]], &bad, None, None, &u, &ru).unwrap_err();
        assert!(
            e.to_string().starts_with("target_probs[0, 0, 0] = nan"),
            "{e}"
        );
        let zero = array![[[0.0, 0.0], [0.0, 0.0]]];
        let e = run(&array![[0i64]], &zero, None, None, &u, &ru).unwrap_err();
        assert_eq!(
            e.to_string(),
            "target_probs[0, 0] sums to 0, but a token must be sampled from it"
        );
        let short = Array3::<f64>::zeros((1, 1, 2));
        let e = run(&array![[0i64]], &short, None, None, &u, &ru).unwrap_err();
        assert_eq!(e.arg(), "target_probs");
    }

    #[test]
    fn prefix_scan_and_greedy_ids() {
        let mask = array![
            [true, true, false, true],
            [false, true, true, true],
            [true, true, true, true]
        ];
        let mut out = Array1::<i64>::zeros(3);
        accepted_prefix_length(mask.view(), None, out.view_mut()).unwrap();
        assert_eq!(out, array![2, 0, 4]);
        let counts = array![1i64, 4, 3];
        accepted_prefix_length(
            mask.view(),
            Some(IntView::I64(counts.view())),
            out.view_mut(),
        )
        .unwrap();
        assert_eq!(out, array![1, 0, 3]);

        let drafts = array![[3i32, 4], [3, 4]];
        let targets = array![[3i32, 4, 9], [3, 7, 9]];
        let mut o = Out::new(2, 2);
        let inputs = GreedyIdsInputs {
            draft_token_ids: IntView::I32(drafts.view()),
            target_token_ids: IntView::I32(targets.view()),
            num_draft_tokens: None,
        };
        verify_greedy(&inputs, &mut o.views()).unwrap();
        assert_eq!(o.ids, array![[3, 4, 9], [3, 7, -1]]);
        assert_eq!(o.accepted, array![2, 1]);
    }
}
