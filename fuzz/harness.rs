//! The fuzz harness: arbitrary bytes become a batch for the core (verify, also
//! isolating bad rows; the flat layout with vLLM's placeholders; greedy ids; the
//! elementwise rule; the acceptance rate; verify_logits and verify_tree), in any layout,
//! dtype and value (NaN, infinities, negatives, ids out of range, counts past K,
//! uniforms outside [0, 1)). Every entry point must return `Ok` with the
//! invariants below or `Err`, never panic; a panic is a finding.
//!
//! Shared by the cargo-fuzz target (`fuzz/fuzz_targets/verify.rs`, nightly) and
//! the corpus replay test (`tests/fuzz_corpus.rs`, stable, in CI).

use half::f16;
use ndarray::{s, Array1, Array2, Array3, ArrayView3, Axis};
use specaccept::chain::{self, ChainInputs, ChainOutputs, FlatChainInputs, GreedyIdsInputs};
use specaccept::error::RowErrors;
use specaccept::logits::tree::TreeLogitsInputs;
use specaccept::logits::{self, Draft, LogitsInputs, Rows};
use specaccept::method::Method;
use specaccept::prob::Prob;
use specaccept::rate;
use specaccept::rule;
use specaccept::tree::{self, TreeInputs, TreeMethod, TreeOutputs};
use specaccept::view::{FloatView, Greedy, IntView};

/// Reads the input front to back; past the end it yields zeros.
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn byte(&mut self) -> u8 {
        let (first, rest) = self.0.split_first().map_or((0, &[][..]), |(f, r)| (*f, r));
        self.0 = rest;
        first
    }
    fn below(&mut self, n: usize) -> usize {
        self.byte() as usize % n
    }
    fn float(&mut self) -> f64 {
        // Edge values half of the time, a fraction otherwise.
        const EDGES: [f64; 12] = [
            0.0,
            -0.0,
            1.0,
            0.5,
            1e-300,
            5e-324,
            f64::NAN,
            f64::INFINITY,
            -1.0,
            2.0,
            1e-8,
            0.999_999_999_999_999_9,
        ];
        let b = self.byte();
        if b & 1 == 0 {
            EDGES[(b as usize >> 1) % EDGES.len()]
        } else {
            (b >> 1) as f64 / 127.0
        }
    }
    fn id(&mut self, vocab: usize) -> i64 {
        match self.byte() {
            255 => i64::MIN,
            254 => -1,
            253 => vocab as i64,
            b => (b as usize % vocab.max(1)) as i64,
        }
    }
}

trait FromF64: Prob {
    fn from_f64(v: f64) -> Self;
}
impl FromF64 for f64 {
    fn from_f64(v: f64) -> Self {
        v
    }
}
impl FromF64 for f32 {
    fn from_f64(v: f64) -> Self {
        v as f32
    }
}
impl FromF64 for f16 {
    fn from_f64(v: f64) -> Self {
        f16::from_f64(v)
    }
}

/// Checks what a caller relies on in a successful result.
fn check_result(ids: &Array2<i64>, counts: &[usize], vocab: usize, out: &Outputs) {
    for b in 0..out.accepted.len() {
        let n = out.accepted[b];
        assert!(n >= 0 && n as usize <= counts[b], "row {b}: n = {n}");
        let n = n as usize;
        assert_eq!(out.emitted[b], n as i64 + 1);
        for t in 0..n {
            assert_eq!(
                out.ids[[b, t]],
                ids[[b, t]],
                "accepted tokens are the drafts"
            );
        }
        let next = out.ids[[b, n]];
        assert!(
            next >= 0 && (next as usize) < vocab,
            "row {b}: token {next}"
        );
        assert!(out.ids.row(b).iter().skip(n + 1).all(|&x| x == -1));
    }
}

struct Outputs {
    ids: Array2<i64>,
    accepted: Array1<i64>,
    emitted: Array1<i64>,
}

impl Outputs {
    fn new(batch: usize, width: usize) -> Self {
        Outputs {
            ids: Array2::zeros((batch, width + 1)),
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

/// `values` laid out as `layout` asks: contiguous, every other element, or reversed.
fn laid_out<P: FromF64>(values: &Array3<f64>, layout: usize) -> (Array3<P>, usize) {
    let (b, t, v) = values.dim();
    let mut big = Array3::<P>::from_elem((b, t, 2 * v.max(1)), P::from_f64(0.0));
    match layout {
        1 => big
            .slice_mut(s![.., .., ..;2])
            .zip_mut_with(values, |d, &x| *d = P::from_f64(x)),
        2 => big
            .slice_mut(s![.., .., ..v;-1])
            .zip_mut_with(values, |d, &x| *d = P::from_f64(x)),
        _ => return (values.mapv(P::from_f64), 0),
    }
    (big, layout)
}

fn view<P: Prob>(array: &Array3<P>, layout: usize, v: usize) -> ArrayView3<'_, P> {
    match layout {
        1 => array.slice(s![.., .., ..;2]),
        2 => array.slice(s![.., .., ..v;-1]),
        _ => array.view(),
    }
}

/// Runs every entry point on one decoded batch; `true` when `verify` succeeded.
fn run_typed<P: FromF64, Q: FromF64>(input: &mut Bytes<'_>) -> bool {
    let batch = input.below(5);
    let k = input.below(5);
    let vocab = 1 + input.below(300);
    let p_values = Array3::from_shape_fn((batch, k + 1, vocab), |_| input.float());
    let q_values = Array3::from_shape_fn((batch, k, vocab), |_| input.float());
    let ids = Array2::from_shape_fn((batch, k), |_| input.id(vocab));
    let counts: Vec<i64> = (0..batch)
        .map(|_| match input.byte() {
            255 => k as i64 + 1,
            254 => -1,
            b => (b as usize % (k + 1)) as i64,
        })
        .collect();
    let uniforms = Array2::from_shape_fn((batch, k), |_| input.float());
    let recovery = Array1::from_shape_fn(batch, |_| input.float());
    let greedy_rows = Array1::from_shape_fn(batch, |_| input.byte() & 1 == 1);
    let flags = input.byte();
    let (p_array, p_layout) = laid_out::<P>(&p_values, input.below(3));
    let (q_array, q_layout) = laid_out::<Q>(&q_values, input.below(3));
    let counts_array = Array1::from(counts.clone());
    let greedy = match flags % 3 {
        0 => Greedy::All(false),
        1 => Greedy::All(true),
        _ => Greedy::PerRow(greedy_rows.view()),
    };
    let inputs = ChainInputs {
        draft_token_ids: IntView::I64(ids.view()),
        target_probs: view(&p_array, p_layout, vocab),
        draft_probs: (flags & 4 == 0).then(|| view(&q_array, q_layout, vocab)),
        num_draft_tokens: (flags & 8 == 0).then(|| IntView::I64(counts_array.view())),
        uniforms: (flags & 16 == 0).then(|| FloatView::F64(uniforms.view())),
        recovery_uniforms: (flags & 32 == 0).then(|| FloatView::F64(recovery.view())),
        greedy,
        method: Method::Token,
    };
    let mut out = Outputs::new(batch, k);
    let verified = chain::verify(&inputs, &mut out.views(), RowErrors::Raise).is_ok();
    if verified {
        let used: Vec<usize> = if flags & 8 == 0 {
            counts.iter().map(|&c| c as usize).collect()
        } else {
            vec![k; batch]
        };
        check_result(&ids, &used, vocab, &out);
        // Deterministic: the same inputs give the same bits.
        let mut again = Outputs::new(batch, k);
        chain::verify(&inputs, &mut again.views(), RowErrors::Raise).expect("ran once");
        assert_eq!(out.ids, again.ids);
    }
    // Block verification of the same rows: the same invariants.
    let block = ChainInputs {
        method: Method::Block,
        ..inputs
    };
    let mut block_out = Outputs::new(batch, k);
    if chain::verify(&block, &mut block_out.views(), RowErrors::Raise).is_ok() {
        let used: Vec<usize> = match &block.num_draft_tokens {
            Some(_) => counts.iter().map(|&c| c as usize).collect(),
            None => vec![k; batch],
        };
        check_result(&ids, &used, vocab, &block_out);
    }

    // The lossy methods on the same rows, with parameters from the input (any
    // value: out-of-domain ones must be errors): the same invariants.
    let used: Vec<usize> = match &inputs.num_draft_tokens {
        Some(_) => counts.iter().map(|&c| c as usize).collect(),
        None => vec![k; batch],
    };
    let rates: Vec<f64> = (0..k).map(|_| input.float()).collect();
    let (epsilon, delta) = (input.float(), input.float() * 4.0);
    for method in [
        Method::Typical { epsilon, delta },
        Method::Synthetic(&rates),
    ] {
        let lossy = ChainInputs { method, ..inputs };
        let mut lossy_out = Outputs::new(batch, k);
        if chain::verify(&lossy, &mut lossy_out.views(), RowErrors::Raise).is_ok() {
            check_result(&ids, &used, vocab, &lossy_out);
        }
    }

    // Isolating: each row's outcome is that row's alone (a bad row marked,
    // a good row as verified by itself), whatever the other rows hold.
    let mut slots = vec![None; batch];
    let mut isolated = Outputs::new(batch, k);
    let run = chain::verify(
        &inputs,
        &mut isolated.views(),
        RowErrors::Isolate(&mut slots),
    );
    if run.is_ok() {
        for (b, slot) in slots.iter().enumerate() {
            let alone = ChainInputs {
                draft_token_ids: IntView::I64(ids.slice(s![b..b + 1, ..])),
                target_probs: inputs.target_probs.slice_move(s![b..b + 1, .., ..]),
                draft_probs: inputs
                    .draft_probs
                    .map(|q| q.slice_move(s![b..b + 1, .., ..])),
                num_draft_tokens: inputs
                    .num_draft_tokens
                    .map(|_| IntView::I64(counts_array.slice(s![b..b + 1]))),
                uniforms: inputs
                    .uniforms
                    .map(|_| FloatView::F64(uniforms.slice(s![b..b + 1, ..]))),
                recovery_uniforms: inputs
                    .recovery_uniforms
                    .map(|_| FloatView::F64(recovery.slice(s![b..b + 1]))),
                greedy: match greedy {
                    Greedy::PerRow(_) => Greedy::All(greedy_rows[b]),
                    all => all,
                },
                method: Method::Token,
            };
            let mut one = Outputs::new(1, k);
            match (
                chain::verify(&alone, &mut one.views(), RowErrors::Raise),
                slot,
            ) {
                (Ok(()), None) => {
                    assert_eq!(one.ids.row(0), isolated.ids.row(b), "row {b} as alone");
                    assert_eq!(one.accepted[0], isolated.accepted[b]);
                }
                (Err(e), Some(kept)) => {
                    // The same error, at row 0 of the one-row batch.
                    assert_eq!(e.arg(), kept.arg(), "row {b}'s own error");
                    assert_eq!(e.index().get(1..), kept.index().get(1..));
                    assert_eq!(kept.index().first(), Some(&b));
                    assert_eq!(kept.row(), Some(b));
                    assert!(isolated.ids.row(b).iter().all(|&x| x == -1));
                    assert_eq!((isolated.accepted[b], isolated.emitted[b]), (0, 0));
                }
                (alone, kept) => panic!("row {b}: alone {alone:?}, isolated {kept:?}"),
            }
        }
    }

    // The flat layout over the same rows (the first k_b positions of each).
    let flat_counts: Vec<i64> = counts.iter().map(|&c| c.clamp(0, k as i64)).collect();
    let total: usize = flat_counts.iter().map(|&c| c as usize).sum();
    let rows: Vec<(usize, usize)> = (0..batch)
        .flat_map(|b| (0..flat_counts[b] as usize).map(move |t| (b, t)))
        .collect();
    let flat_p = Array2::from_shape_fn((total, vocab), |(r, i)| {
        let (b, t) = rows[r];
        P::from_f64(p_values[[b, t, i]])
    });
    // Sometimes vLLM's placeholder (-1) ends a row's drafts early.
    let flat_ids = Array1::from_shape_fn(total, |r| {
        let (b, t) = rows[r];
        if flags & 128 != 0 && (b + t) % 3 == 2 {
            chain::PLACEHOLDER_TOKEN_ID
        } else {
            ids[[b, t]]
        }
    });
    let bonus = Array1::from_shape_fn(batch, |b| (b * 7 % vocab) as i64);
    let flat_counts = Array1::from(flat_counts);
    let flat_u = Array1::from_shape_fn(total, |r| uniforms[[rows[r].0, rows[r].1]]);
    let flat = FlatChainInputs::<P, Q> {
        draft_token_ids: IntView::I64(flat_ids.view()),
        num_draft_tokens: IntView::I64(flat_counts.view()),
        target_probs: flat_p.view(),
        draft_probs: None,
        bonus_token_ids: IntView::I64(bonus.view()),
        uniforms: Some(FloatView::F64(flat_u.view())),
        recovery_uniforms: Some(FloatView::F64(recovery.view())),
        greedy: Greedy::All(flags & 64 == 0),
        method: Method::Token,
    };
    let mut flat_out = Outputs::new(batch, k);
    if chain::verify_flat(&flat, &mut flat_out.views(), RowErrors::Raise).is_ok() {
        // Each row keeps its drafts up to the first placeholder, then one token.
        let mut start = 0;
        for b in 0..batch {
            let slot = flat_counts[b] as usize;
            let drafts = (0..slot)
                .position(|t| flat_ids[start + t] == chain::PLACEHOLDER_TOKEN_ID)
                .unwrap_or(slot);
            let n = flat_out.accepted[b] as usize;
            assert!(n <= drafts, "row {b}: {n} accepted past its placeholder");
            for t in 0..n {
                assert_eq!(flat_out.ids[[b, t]], flat_ids[start + t]);
            }
            let next = flat_out.ids[[b, n]];
            assert!(
                next >= 0 && (next as usize) < vocab,
                "row {b}: token {next}"
            );
            start += slot;
        }
    }

    // The elementwise primitives over the gathered values of the same rows.
    let p_flat = p_values.slice(s![.., ..k, ..]).to_owned().into_dyn();
    let q_flat = q_values.view().into_dyn();
    let u_flat = Array3::from_shape_fn(q_values.dim(), |(b, t, i)| {
        uniforms[[b, t]] * (i % 2) as f64
    })
    .into_dyn();
    let (pv, qv, uv) = (
        FloatView::F64(p_flat.view()),
        FloatView::F64(q_flat.view()),
        FloatView::F64(u_flat.view()),
    );
    if let Ok(values) = rule::rejection_probability_array(&pv, &qv) {
        assert_eq!(values.len(), p_flat.len());
        assert!(
            values.iter().all(|v| (0.0..=1.0).contains(v)),
            "a probability"
        );
        if let Ok(mask) = rule::acceptance_mask_array(&pv, &qv, &uv) {
            // Accepted outright (rejection probability 0) is accepted whatever u.
            for (m, r) in mask.iter().zip(&values) {
                assert!(*m || *r > 0.0, "rejected with rejection probability 0");
            }
        }
    }

    // Greedy on ids, and the acceptance rate of the same rows.
    let targets =
        Array2::from_shape_fn((batch, k + 1), |(b, t)| if t < k { ids[[b, t]] } else { 0 });
    let greedy_ids = GreedyIdsInputs {
        draft_token_ids: IntView::I64(ids.view()),
        target_token_ids: IntView::I64(targets.view()),
        num_draft_tokens: Some(IntView::I64(counts_array.view())),
    };
    let mut greedy_out = Outputs::new(batch, k);
    let _ = chain::verify_greedy(&greedy_ids, &mut greedy_out.views());
    let q_rows = view(&q_array, q_layout, vocab);
    let p_rows = view(&p_array, p_layout, vocab)
        .slice_axis(Axis(1), (0..k).into())
        .to_owned();
    let mut rates = Array1::zeros(batch * k);
    let _ = rate::acceptance_rate(
        p_rows.view().into_dyn(),
        q_rows.into_dyn(),
        rates.view_mut(),
    );
    run_logits::<P, Q>(input, &p_values, &q_values, &ids, &counts, flags);
    run_tree::<P, Q>(input, &p_array, p_layout, &q_values, flags);
    verified
}

/// `verify_tree` over the `K + 1` target rows as nodes, with parents from the
/// input (sometimes invalid). On success: the accepted nodes form a path from
/// the root, their tokens are the output, and the next token is in `[0, V)`.
fn run_tree<P: FromF64, Q: FromF64>(
    input: &mut Bytes<'_>,
    p_array: &Array3<P>,
    p_layout: usize,
    q_values: &Array3<f64>,
    flags: u8,
) {
    let (batch, k, vocab) = q_values.dim();
    let nodes = k + 1;
    let parents = Array1::from_shape_fn(nodes, |n| match (n, input.byte()) {
        (0, _) => -1,
        (_, 255) => n as i64, // invalid: not before the node
        (_, b) => (b as usize % (n + 1)) as i64 - 1, // -1 (padding) or an earlier node
    });
    let row_parents = parents;
    let parents = Array2::from_shape_fn((batch, nodes), |(_, n)| row_parents[n]);
    let tokens = Array2::from_shape_fn((batch, nodes), |_| input.id(vocab));
    // The draft row of node c is q's row c - 1 (the root's is never read;
    // with K = 0 there is only the root).
    let draft = Array3::from_shape_fn((batch, nodes, vocab), |(b, n, i)| {
        Q::from_f64(match n {
            0 => 0.5,
            n => q_values[[b, n - 1, i]],
        })
    });
    let uniforms = Array2::from_shape_fn((batch, nodes), |_| input.float());
    let recovery = Array1::from_shape_fn(batch, |_| input.float());
    let mut depth = vec![0usize; nodes];
    for n in 1..nodes {
        let parent = row_parents[n];
        if (0..n as i64).contains(&parent) {
            depth[n] = depth[parent as usize] + 1;
        }
    }
    let deepest = depth.iter().copied().max().unwrap_or(0);
    // The target rows read as logits for verify_tree_logits (0 is -inf; NaN and
    // other bad values stay bad), with a temperature from the input.
    let logits = Array3::from_shape_fn((batch, nodes, vocab), |(b, n, i)| {
        let v = p_array[[b, n, i]].to_f64();
        if v == 0.0 {
            f64::NEG_INFINITY
        } else {
            v.ln()
        }
    });
    let temperature = Array1::from_elem(batch, [1.0, 0.0, 0.5, -1.0][usize::from(flags >> 6)]);
    let top_k = Array1::from_elem(batch, i64::from(flags & 8 != 0) * 2);
    let top_p = Array1::from_elem(batch, if flags & 2 != 0 { 0.9 } else { 1.0 });
    // Both tree methods, raising and isolating, the same invariants; from
    // probabilities and from logits.
    for (method, isolate, from_logits) in [
        (TreeMethod::Token, false, false),
        (TreeMethod::Traversal, false, false),
        (TreeMethod::Token, true, false),
        (TreeMethod::Traversal, true, false),
        (TreeMethod::Token, false, true),
        (TreeMethod::Traversal, true, true),
    ] {
        let inputs = TreeInputs {
            node_token_ids: IntView::I64(tokens.view()),
            parent_ids: IntView::I64(parents.view()),
            target_probs: view(p_array, p_layout, vocab),
            draft_probs: (flags & 4 == 0).then(|| draft.view()),
            uniforms: (flags & 16 == 0).then(|| FloatView::F64(uniforms.view())),
            recovery_uniforms: (flags & 32 == 0).then(|| FloatView::F64(recovery.view())),
            greedy: Greedy::All(flags % 3 == 1),
            method,
        };
        let mut ids = Array2::zeros((batch, deepest + 1));
        let mut accepted = Array1::zeros(batch);
        let mut emitted = Array1::zeros(batch);
        let mut path = Array2::zeros((batch, deepest));
        let mut out = TreeOutputs {
            output_token_ids: ids.view_mut(),
            num_accepted: accepted.view_mut(),
            num_emitted: emitted.view_mut(),
            accepted_node_ids: path.view_mut(),
        };
        let mut slots = vec![None; batch];
        let errors = if isolate {
            RowErrors::Isolate(&mut slots)
        } else {
            RowErrors::Raise
        };
        let verified = if from_logits {
            let inputs: TreeLogitsInputs<'_, f64, f64> = TreeLogitsInputs {
                node_token_ids: inputs.node_token_ids,
                parent_ids: inputs.parent_ids,
                target_logits: logits.view(),
                draft_logits: None,
                temperature: FloatView::F64(temperature.view()),
                top_k: IntView::I64(top_k.view()),
                top_p: FloatView::F64(top_p.view()),
                min_p: None,
                min_p_last: false,
                uniforms: inputs.uniforms,
                recovery_uniforms: inputs.recovery_uniforms,
                method,
            };
            logits::tree::verify_tree_logits(&inputs, &mut out, errors)
        } else {
            tree::verify_tree(&inputs, &mut out, errors)
        };
        if verified.is_err() {
            continue;
        }
        for b in 0..batch {
            if slots[b].is_some() {
                // Set aside: the row is marked, and its error names its row.
                assert_eq!(slots[b].as_ref().and_then(|e| e.row()), Some(b));
                assert!(accepted[b] == 0 && emitted[b] == 0);
                assert!(ids.row(b).iter().chain(path.row(b)).all(|&x| x == -1));
                continue;
            }
            let n = accepted[b] as usize;
            assert!(n <= deepest && emitted[b] == n as i64 + 1);
            let mut node = 0i64;
            for d in 0..n {
                let child = path[[b, d]];
                assert_eq!(parents[[b, child as usize]], node, "a path from the root");
                assert_eq!(ids[[b, d]], tokens[[b, child as usize]]);
                node = child;
            }
            assert!((0..vocab as i64).contains(&ids[[b, n]]));
            assert!(ids.row(b).iter().skip(n + 1).all(|&x| x == -1));
            assert!(path.row(b).iter().skip(n).all(|&x| x == -1));
        }
    }
}

/// `verify_logits` on the same rows read as logits (`-1` becomes `-inf`, other
/// finite values spread over [-20, 20]; NaN and `+inf` stay), with sampling
/// parameters from the input, valid or not. On success: the invariants, and
/// unfiltered rows (which may take the screen) give the same tokens with
/// `top_k = V` (which always takes the exact pass).
fn run_logits<P: FromF64, Q: FromF64>(
    input: &mut Bytes<'_>,
    p_values: &Array3<f64>,
    q_values: &Array3<f64>,
    ids: &Array2<i64>,
    counts: &[i64],
    flags: u8,
) {
    let (batch, k) = ids.dim();
    let vocab = p_values.dim().2;
    let logit = |v: f64| match v {
        -1.0 => f64::NEG_INFINITY,
        v if v.is_finite() => (v - 0.5) * 40.0,
        v => v,
    };
    let target = p_values.mapv(|v| P::from_f64(logit(v)));
    let draft = q_values.mapv(|v| Q::from_f64(logit(v)));
    const TEMPERATURES: [f64; 10] = [
        0.0,
        1.0,
        0.5,
        1e-300,
        2.2250738585072014e-308,
        5e-324,
        1e30,
        1e-30,
        f64::NAN,
        -1.0,
    ];
    let temperature = Array1::from_shape_fn(batch, |_| TEMPERATURES[input.below(10)]);
    let top_k = Array1::from_shape_fn(batch, |_| match input.below(6) {
        0 | 1 => 0,
        2 => 1,
        3 => 3,
        4 => vocab as i64 + 5,
        _ => -1,
    });
    let top_p = Array1::from_shape_fn(batch, |_| match input.below(6) {
        0 | 1 => 1.0,
        2 => 0.9,
        3 => 1e-9,
        4 => 0.0,
        _ => f64::NAN,
    });
    let min_p = Array1::from_shape_fn(batch, |_| match input.below(6) {
        0 | 1 => 0.0,
        2 => 0.05,
        3 => 1.0,
        4 => -0.5,
        _ => f64::NAN,
    });
    let min_p_last = flags & 64 != 0;
    let uniforms = Array2::from_shape_fn((batch, k), |_| input.float());
    let recovery = Array1::from_shape_fn(batch, |_| input.float());
    let counts_array = Array1::from(counts.to_vec());
    let given_q = Array2::from_shape_fn((batch, k), |_| input.float());
    let run_with = |top_k: &Array1<i64>, method: Method, given: Option<&Array2<f64>>| {
        let inputs = LogitsInputs {
            draft_token_ids: IntView::I64(ids.view()),
            target_logits: Rows::Padded(target.view()),
            draft: match flags & 128 {
                0 => Draft::Logits(Rows::Padded(draft.view())),
                _ => Draft::OneHot,
            },
            temperature: FloatView::F64(temperature.view()),
            top_k: IntView::I64(top_k.view()),
            top_p: FloatView::F64(top_p.view()),
            min_p: Some(FloatView::F64(min_p.view())),
            min_p_last,
            num_draft_tokens: (flags & 8 == 0).then(|| IntView::I64(counts_array.view())),
            uniforms: (flags & 16 == 0).then(|| FloatView::F64(uniforms.view())),
            recovery_uniforms: (flags & 32 == 0).then(|| FloatView::F64(recovery.view())),
            draft_token_probs: given.map(|q| FloatView::F64(q.view())),
            method,
        };
        let mut out = Outputs::new(batch, k);
        let result =
            logits::verify_logits(&inputs, &mut out.views(), RowErrors::Raise).map(|()| out);
        result.map_err(|e| e.to_string())
    };
    let run = |top_k: &Array1<i64>, method: Method| run_with(top_k, method, None);
    let used: Vec<usize> = if flags & 8 == 0 {
        counts.iter().map(|&c| c as usize).collect()
    } else {
        vec![k; batch]
    };
    if let Ok(block) = run(&top_k, Method::Block) {
        check_result(ids, &used, vocab, &block);
    }
    // The lossy methods, and the drafter's own probabilities (any values from
    // the input: where they are read and wrong, an error).
    let rate = given_q.iter().next().copied().unwrap_or(0.5);
    let rates = vec![rate; k];
    for method in [
        Method::Typical {
            epsilon: 0.09,
            delta: 0.3,
        },
        Method::Synthetic(&rates),
    ] {
        if let Ok(lossy) = run(&top_k, method) {
            check_result(ids, &used, vocab, &lossy);
        }
    }
    if let Ok(given) = run_with(&top_k, Method::Token, Some(&given_q)) {
        check_result(ids, &used, vocab, &given);
    }
    let Ok(out) = run(&top_k, Method::Token) else {
        return;
    };
    check_result(ids, &used, vocab, &out);
    let exact_k = top_k.mapv(|t| if t == 0 { vocab as i64 } else { t });
    let exact = run(&exact_k, Method::Token).expect("the same rows, through the exact pass");
    if top_p.iter().all(|&p| p == 1.0) || exact_k == top_k {
        assert_eq!(out.ids, exact.ids, "the screen decides as the exact pass");
    }
}

/// One fuzz input; `true` when `verify` accepted it (the success path ran).
pub fn run(data: &[u8]) -> bool {
    let mut input = Bytes(data);
    match input.below(9) {
        0 => run_typed::<f64, f64>(&mut input),
        1 => run_typed::<f64, f32>(&mut input),
        2 => run_typed::<f64, f16>(&mut input),
        3 => run_typed::<f32, f64>(&mut input),
        4 => run_typed::<f32, f32>(&mut input),
        5 => run_typed::<f32, f16>(&mut input),
        6 => run_typed::<f16, f64>(&mut input),
        7 => run_typed::<f16, f32>(&mut input),
        _ => run_typed::<f16, f16>(&mut input),
    }
}
