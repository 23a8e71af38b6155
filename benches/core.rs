//! The Rust core alone, without Python: `cargo bench --bench core`.
//!
//! Chain verification of float32 batches with draft probabilities, in the
//! three regimes of `benches/bench_verify.py`: `reject` (every row rejected at
//! position 0: the residual row pair is read), `accept` (every draft accepted:
//! the bonus row is read) and `greedy` (argmax of every row, all accepted), on
//! one thread and on the default number of threads. Criterion reports the
//! throughput in bytes of probabilities that must be read.
//!
//! `exp`: the two passes of `verify_logits` over one float32 logits row of
//! 128256 (one thread, in cache after the first call): the exact pass (max,
//! float64 `exp`, canonical sum) and the screen (max and `f32` `exp` with its
//! error bound). Criterion reports logits per second: the `exp` throughput.
//!
//! `tree`: `verify_tree` (token rule) on one thread at `V = 128256`, a root with
//! three children, all rejected (the root's target row and three draft rows
//! read, two residual rounds written and a third summed), as
//! `benches/bench_tree.py` times it: 64 rows streamed from memory, and one row
//! again and again (its 2 MB of rows and 1 MB residual stay in L3), which
//! separates the rounds' float64 arithmetic from the reads. Criterion reports
//! the bytes of rows that must be read.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use ndarray::{s, Array1, Array2, Array3, Axis};
use specaccept::chain::{self, ChainInputs, ChainOutputs};
use specaccept::error::RowErrors;
use specaccept::logits;
use specaccept::method::Method;
use specaccept::threads;
use specaccept::tree::{self, TreeInputs, TreeMethod, TreeOutputs};
use specaccept::view::{FloatView, Greedy, IntView};

struct Batch {
    ids: Array2<i64>,
    p: Array3<f32>,
    q: Array3<f32>,
    u: Array2<f64>,
    ru: Array1<f64>,
}

/// Deterministic rows in (0, 1], normalised; drafts and uniforms set for `regime`.
fn batch(b: usize, k: usize, v: usize, regime: &str) -> Batch {
    let value = |x: usize| ((x.wrapping_mul(2654435761) >> 7) % 1000 + 1) as f32;
    let mut p = Array3::from_shape_fn((b, k + 1, v), |(i, t, j)| value(i * 31 + t * 7 + j));
    let mut q = Array3::from_shape_fn((b, k, v), |(i, t, j)| value(i * 17 + t * 5 + j * 3));
    for mut row in p.lanes_mut(Axis(2)).into_iter().chain(q.lanes_mut(Axis(2))) {
        let total: f32 = row.sum();
        row.mapv_inplace(|x| x / total);
    }
    // reject: a token where q > p, and u just below 1 rejects it; accept: a
    // token where q <= p; greedy: the target's argmax.
    let ids = Array2::from_shape_fn((b, k), |(i, t)| {
        let (pr, qr) = (p.slice(s![i, t, ..]), q.slice(s![i, t, ..]));
        let pick = match regime {
            "reject" => (0..v).find(|&j| qr[j] > pr[j]),
            "accept" => (0..v).find(|&j| qr[j] <= pr[j]),
            _ => (0..v).reduce(|best, j| if pr[j] > pr[best] { j } else { best }),
        };
        pick.unwrap_or(0) as i64
    });
    let u = Array2::from_elem((b, k), if regime == "reject" { 1.0 - 1e-12 } else { 0.0 });
    Batch {
        ids,
        p,
        q,
        u,
        ru: Array1::from_elem(b, 0.5),
    }
}

fn run(batch: &Batch, greedy: bool, out: &mut (Array2<i64>, Array1<i64>, Array1<i64>)) {
    let inputs = ChainInputs {
        draft_token_ids: IntView::I64(batch.ids.view()),
        target_probs: batch.p.view(),
        draft_probs: Some(batch.q.view()),
        num_draft_tokens: None,
        uniforms: Some(FloatView::F64(batch.u.view())),
        recovery_uniforms: Some(FloatView::F64(batch.ru.view())),
        greedy: Greedy::All(greedy),
        method: Method::Token,
    };
    let mut outputs = ChainOutputs {
        output_token_ids: out.0.view_mut(),
        num_accepted: out.1.view_mut(),
        num_emitted: out.2.view_mut(),
    };
    chain::verify(&inputs, &mut outputs, RowErrors::Raise).expect("valid inputs");
}

fn verify(c: &mut Criterion) {
    let default_threads = threads::num_threads();
    let mut group = c.benchmark_group("verify_f32");
    group.sample_size(20);
    for &(b, k, v) in &[(1, 5, 32000), (1, 5, 128256), (64, 5, 128256)] {
        for regime in ["reject", "accept", "greedy"] {
            let data = batch(b, k, v, regime);
            let rows_read = match regime {
                "reject" => 2,
                "accept" => 1,
                _ => k + 1,
            };
            group.throughput(Throughput::Bytes((b * rows_read * v * 4) as u64));
            let mut out = (
                Array2::zeros((b, k + 1)),
                Array1::zeros(b),
                Array1::zeros(b),
            );
            run(&data, regime == "greedy", &mut out); // checked below, filtered or not
            for threads_used in [1, default_threads] {
                if b == 1 && threads_used > 1 {
                    continue; // one row never leaves the calling thread
                }
                threads::set_num_threads(threads_used).expect("at least one thread");
                let id =
                    BenchmarkId::new(format!("{regime}/{threads_used}t"), format!("{b}x{k}x{v}"));
                group.bench_function(id, |bench| {
                    bench.iter(|| run(&data, regime == "greedy", &mut out))
                });
            }
            let expected = match regime {
                "reject" => 0,
                _ => k as i64,
            };
            assert!(
                out.1.iter().all(|&n| n == expected),
                "{regime}: {:?}",
                out.1
            );
        }
    }
    threads::set_num_threads(default_threads).expect("at least one thread");
    group.finish();
}

fn exp(c: &mut Criterion) {
    let v = 128_256;
    let logits: Vec<f32> = (0..v)
        .map(|j: usize| ((j.wrapping_mul(2654435761) >> 7) % 2000) as f32 / 100.0 - 10.0)
        .collect();
    let mut w = vec![0.0f64; v];
    let mut group = c.benchmark_group("exp");
    group.sample_size(50);
    group.throughput(Throughput::Elements(v as u64));
    group.bench_function(BenchmarkId::new("exact_f64", v), |bench| {
        bench.iter(|| logits::exact::exact_pass(&logits, 0.8, &mut w).expect("a valid row"))
    });
    group.bench_function(BenchmarkId::new("screen_f32", v), |bench| {
        bench.iter(|| logits::screen::screen_pass(&logits, 0.8).expect("an f32 row"))
    });
    // A draw from the row: the certified pass, and the exact pass with its draw.
    let mut u = 0.0f64;
    group.bench_function(BenchmarkId::new("draw_certified", v), |bench| {
        bench.iter(|| {
            u = (u + 0.618_033_988_75) % 1.0;
            logits::certified::certified_draw(&logits, 0.8, u)
        })
    });
    group.finish();
}

fn token_tree(c: &mut Criterion) {
    let (v, children) = (128_256, 3);
    let default_threads = threads::num_threads();
    threads::set_num_threads(1).expect("one thread");
    let mut group = c.benchmark_group("tree");
    group.sample_size(20);
    for b in [64, 1] {
        // `batch`'s target rows; child c's draft row is 1 at its token, which
        // a uniform just under 1 rejects (as `bench_tree.rejected_rows`).
        let rows = batch(b, children, v, "reject");
        let ids = Array2::from_shape_fn((b, children + 1), |(i, n)| ((i + 1) * 997 * n % v) as i64);
        let mut q = Array3::<f32>::zeros((b, children + 1, v));
        for ((i, n), &x) in ids.indexed_iter() {
            q[[i, n, x as usize]] = 1.0;
        }
        let u = Array2::from_elem((b, children + 1), 1.0 - 1e-12);
        let parents = Array2::from_shape_fn((b, children + 1), |(_, n)| n.min(1) as i64 - 1);
        let inputs = TreeInputs {
            node_token_ids: IntView::I64(ids.view()),
            parent_ids: IntView::I64(parents.view()),
            target_probs: rows.p.view(),
            draft_probs: Some(q.view()),
            uniforms: Some(FloatView::F64(u.view())),
            recovery_uniforms: Some(FloatView::F64(rows.ru.view())),
            greedy: Greedy::All(false),
            method: TreeMethod::Token,
        };
        // -1 everywhere: the checks below fail unless a call wrote them.
        let mut out = (
            Array2::<i64>::from_elem((b, 2), -1),
            Array1::<i64>::from_elem(b, -1),
            Array1::<i64>::from_elem(b, -1),
            Array2::<i64>::from_elem((b, 1), -1),
        );
        let call = |out: &mut (Array2<i64>, Array1<i64>, Array1<i64>, Array2<i64>)| {
            let mut outputs = TreeOutputs {
                output_token_ids: out.0.view_mut(),
                num_accepted: out.1.view_mut(),
                num_emitted: out.2.view_mut(),
                accepted_node_ids: out.3.view_mut(),
            };
            tree::verify_tree(&inputs, &mut outputs, RowErrors::Raise).expect("valid inputs");
        };
        // Checked here, whether criterion's filter runs the group or not.
        call(&mut out);
        assert!(out.1.iter().all(|&n| n == 0), "every child is rejected");
        assert!(out.2.iter().all(|&n| n == 1), "one token emitted");
        group.throughput(Throughput::Bytes((b * (children + 1) * v * 4) as u64));
        let id = if b == 1 { "in_cache" } else { "streamed" };
        group.bench_function(BenchmarkId::new(id, format!("B={b}")), |bench| {
            bench.iter(|| call(&mut out))
        });
    }
    threads::set_num_threads(default_threads).expect("at least one thread");
    group.finish();
}

criterion_group!(benches, verify, exp, token_tree);
criterion_main!(benches);
