//! The worker threads: rows of a large batch are verified in parallel on a
//! pool owned by specaccept (not rayon's global pool, so a host application's
//! own rayon settings are left alone). Small batches never touch it.
//!
//! The pool is built on first use with [`num_threads`] workers and rebuilt
//! after [`set_num_threads`]. A process forked while a pool existed does not
//! inherit its threads, so the child builds a fresh pool (the parent's is
//! leaked in the child, never joined).

use std::cell::RefCell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::LocalKey;

use ndarray::{ArrayViewMut1, Axis};
use rayon::{ThreadPool, ThreadPoolBuilder};

use crate::error::{CoreError, RowErrors};

/// Below this many probability elements to read (at least `V` per row, `(K+1) V`
/// per greedy row), verification stays on the calling thread: about 50 µs of
/// work on one thread, where waking the workers stops costing more than it saves
/// (measured on a 2-core VM: `benches/bench_verify.py`).
pub const PARALLEL_MIN_ELEMENTS: usize = 400_000;

struct State {
    /// Requested worker count; `None` = the number of CPUs available.
    requested: Option<usize>,
    /// The pool, the worker count it was built with, and the process it belongs to.
    pool: Option<(Arc<ThreadPool>, usize, u32)>,
}

static STATE: Mutex<State> = Mutex::new(State {
    requested: None,
    pool: None,
});

fn state() -> MutexGuard<'static, State> {
    // The state stays consistent even if a holder panicked: every write is one assignment.
    STATE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The default: the number of CPUs this process may run on.
pub fn default_num_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The number of threads verification uses for large batches.
pub fn num_threads() -> usize {
    state().requested.unwrap_or_else(default_num_threads)
}

/// At most this many threads per CPU: more only adds switching, and a huge
/// count would start that many OS threads on the next large batch.
pub const MAX_THREADS_PER_CPU: usize = 8;

/// The largest thread count [`set_num_threads`] takes.
pub fn max_num_threads() -> usize {
    MAX_THREADS_PER_CPU * default_num_threads()
}

/// Sets the number of threads for large batches (`1` = always the calling
/// thread), at most [`max_num_threads`]. Takes effect from the next call;
/// calls already running finish on the pool they started with.
pub fn set_num_threads(n: usize) -> Result<(), CoreError> {
    let most = max_num_threads();
    if n == 0 || n > most {
        return Err(CoreError::value(
            "n",
            &[],
            format!(
                "= {n}: the thread count must lie in [1, {most}] ({MAX_THREADS_PER_CPU} per CPU, {} CPUs)",
                default_num_threads()
            ),
        ));
    }
    state().requested = Some(n);
    Ok(())
}

/// The pool to verify `rows` rows reading about `elements` probabilities in
/// all on, or `None` to stay on the calling thread.
pub(crate) fn pool_for(rows: usize, elements: usize) -> Option<Arc<ThreadPool>> {
    if rows < 2 || elements < PARALLEL_MIN_ELEMENTS {
        return None;
    }
    let mut state = state();
    let threads = state.requested.unwrap_or_else(default_num_threads);
    if threads < 2 {
        return None;
    }
    let pid = std::process::id();
    match &state.pool {
        Some((pool, built_with, owner)) if *built_with == threads && *owner == pid => {
            return Some(Arc::clone(pool));
        }
        Some((pool, _, owner)) if *owner != pid => {
            // A forked child: the parent's workers do not exist here. Dropping
            // the pool would signal threads that are not there; leak it instead.
            std::mem::forget(Arc::clone(pool));
        }
        _ => {}
    }
    let pool = ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("specaccept-{i}"))
        .build()
        .ok()?;
    let pool = Arc::new(pool);
    state.pool = Some((Arc::clone(&pool), threads, pid));
    Some(pool)
}

/// Outputs with one entry (or row) per batch row, split along that axis.
pub(crate) trait Rows: Send + Sized {
    /// Rows in `self`.
    fn len(&self) -> usize;
    /// Rows `..at` and `at..`.
    fn split_at(self, at: usize) -> (Self, Self);
}

/// [`Rows`] for a struct of output views whose first axis is the batch row:
/// `rows_of_views!(Outputs { first_field, other_field, ... })`.
macro_rules! rows_of_views {
    ($outputs:ident { $first:ident $(, $field:ident)* $(,)? }) => {
        impl $crate::threads::Rows for $outputs<'_> {
            fn len(&self) -> usize {
                self.$first.len_of(::ndarray::Axis(0))
            }
            fn split_at(self, at: usize) -> (Self, Self) {
                let $first = self.$first.split_at(::ndarray::Axis(0), at);
                $(let $field = self.$field.split_at(::ndarray::Axis(0), at);)*
                (
                    $outputs { $first: $first.0 $(, $field: $field.0)* },
                    $outputs { $first: $first.1 $(, $field: $field.1)* },
                )
            }
        }
    };
}
pub(crate) use rows_of_views;

impl<O: Rows> Rows for (O, RowErrors<'_>) {
    fn len(&self) -> usize {
        self.0.len()
    }
    fn split_at(self, at: usize) -> (Self, Self) {
        let (head, tail) = self.0.split_at(at);
        match self.1 {
            RowErrors::Raise => ((head, RowErrors::Raise), (tail, RowErrors::Raise)),
            RowErrors::Isolate(slots) => {
                let (first, second) = slots.split_at_mut(at);
                (
                    (head, RowErrors::Isolate(first)),
                    (tail, RowErrors::Isolate(second)),
                )
            }
        }
    }
}

impl Rows for ArrayViewMut1<'_, f64> {
    fn len(&self) -> usize {
        ArrayViewMut1::len(self)
    }
    fn split_at(self, at: usize) -> (Self, Self) {
        ArrayViewMut1::split_at(self, Axis(0), at)
    }
}

/// Runs `verify_rows(first_row, part)` over all rows of `out`: on the
/// calling thread for small work (see [`PARALLEL_MIN_ELEMENTS`]), else split
/// into a few runs of rows per worker, so rows that read more (greedy,
/// all-accepted) do not leave the other workers idle. The result is the same
/// either way, and an error is the first bad row's (runs are in row order).
/// On error `out` holds partial results.
pub(crate) fn in_runs<O: Rows>(
    elements: usize,
    out: O,
    verify_rows: impl Fn(usize, O) -> Result<(), CoreError> + Sync,
) -> Result<(), CoreError> {
    let rows = out.len();
    let Some(pool) = pool_for(rows, elements) else {
        return verify_rows(0, out);
    };
    let run = rows.div_ceil(4 * pool.current_num_threads()).max(1);
    let mut parts = Vec::with_capacity(rows.div_ceil(run));
    let (mut first, mut rest) = (0, out);
    while rest.len() > run {
        let (part, tail) = rest.split_at(run);
        parts.push((first, part));
        (first, rest) = (first + run, tail);
    }
    parts.push((first, rest));
    let mut results: Vec<Result<(), CoreError>> = Vec::new();
    results.resize_with(parts.len(), || Ok(()));
    let verify_rows = &verify_rows;
    pool.scope(|scope| {
        for ((first, part), result) in parts.into_iter().zip(&mut results) {
            scope.spawn(move |_| *result = verify_rows(first, part));
        }
    });
    results.into_iter().collect()
}

/// The outcomes of steps `0, 1, ...` of a sequence that ends at its first
/// step whose outcome `ends` (a rejected position, an error; the last step
/// always does): the outcomes of steps `0..=` that one. Without `pool`, on the
/// calling thread, one step after another. With one, the calling thread and
/// the workers each take the next step not yet taken, and stop taking once a
/// step before it has ended; steps past the end may run, and are dropped (the
/// first step runs on the calling thread before any worker starts). Every
/// step up to the first end runs (the steps are taken in order), so the
/// result is the one-thread result. `step(t, buffers, dropped)` gets the
/// buffers of the thread that runs it (`buffers` on the calling thread,
/// `key`'s on a worker) and `dropped`, true once its outcome is sure to be
/// dropped (an earlier step ended): it may return any outcome from then on.
pub(crate) fn first_ending<T: Default, R: Send>(
    pool: Option<Arc<ThreadPool>>,
    steps: usize,
    buffers: &mut T,
    key: &'static LocalKey<RefCell<T>>,
    step: impl Fn(usize, &mut T, &dyn Fn() -> bool) -> R + Sync,
    ends: impl Fn(&R) -> bool + Sync,
) -> Vec<R> {
    let Some(pool) = pool else {
        let mut outcomes = Vec::with_capacity(steps);
        for t in 0..steps {
            let outcome = step(t, buffers, &|| false);
            let done = ends(&outcome);
            outcomes.push(outcome);
            if done {
                break;
            }
        }
        return outcomes;
    };
    // The first step on the calling thread alone: a sequence that ends there
    // (a rejected first draft) wakes no worker, and pays nothing for them.
    if steps == 0 {
        return Vec::new();
    }
    let first = step(0, buffers, &|| false);
    if steps == 1 || ends(&first) {
        return vec![first];
    }
    let next = AtomicUsize::new(1);
    // The first step known to end, or `usize::MAX`.
    let end = AtomicUsize::new(usize::MAX);
    let slots: Vec<Mutex<Option<R>>> = (0..steps).map(|_| Mutex::new(None)).collect();
    *slots[0].lock().unwrap_or_else(|p| p.into_inner()) = Some(first);
    // Threads inside a step (counted before they take one).
    let busy = AtomicUsize::new(0);
    let run = |buffers: &mut T| loop {
        busy.fetch_add(1, Ordering::AcqRel);
        let t = next.fetch_add(1, Ordering::AcqRel);
        if t >= steps || t > end.load(Ordering::Acquire) {
            busy.fetch_sub(1, Ordering::AcqRel);
            break;
        }
        let outcome = step(t, buffers, &|| end.load(Ordering::Acquire) < t);
        if ends(&outcome) {
            end.fetch_min(t, Ordering::AcqRel);
        }
        *slots[t].lock().unwrap_or_else(|p| p.into_inner()) = Some(outcome);
        busy.fetch_sub(1, Ordering::AcqRel);
    };
    let helpers = pool.current_num_threads().min(steps).saturating_sub(1);
    pool.in_place_scope(|scope| {
        for _ in 0..helpers {
            scope.spawn(|_| with_buffers(key, run));
        }
        run(buffers);
        // The workers in a step finish it soon (one position): spin for them
        // rather than sleep in the scope's wait, where a thread takes tens of
        // µs to wake. A worker that has not started yet finds no step left,
        // and is not waited for here; 20 ms caps the spin.
        let start = std::time::Instant::now();
        while busy.load(Ordering::Acquire) > 0
            && start.elapsed() < std::time::Duration::from_millis(20)
        {
            std::hint::spin_loop();
        }
    });
    let mut outcomes = Vec::with_capacity(steps);
    for slot in slots {
        let Some(outcome) = slot.into_inner().unwrap_or_else(|p| p.into_inner()) else {
            break; // not reached: every step up to the end ran
        };
        let done = ends(&outcome);
        outcomes.push(outcome);
        if done {
            break;
        }
    }
    outcomes
}

/// Runs `f` on this thread's buffers `T`, kept between calls (on the caller's
/// thread and on each worker). Buffers of a megabyte or more come back from
/// the OS as fresh pages when allocated per call, and faulting them in cost
/// more than a small batch's work. A re-entered borrow (not reached: nothing
/// here calls back into Python) gets fresh buffers instead of a panic.
pub(crate) fn with_buffers<T: Default, R>(
    key: &'static LocalKey<RefCell<T>>,
    f: impl FnOnce(&mut T) -> R,
) -> R {
    key.with(|cell| match cell.try_borrow_mut() {
        Ok(mut buffers) => f(&mut buffers),
        Err(_) => f(&mut T::default()),
    })
}
