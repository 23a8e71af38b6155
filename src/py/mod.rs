//! The binding: every `#[pyfunction]`, one file per concern: [`errors`] (the one
//! error mapping), [`arrays`] (inputs read in place, the dtype dispatch),
//! [`outputs`] (`out=` and its aliasing proofs), then the entry points by
//! family ([`chain`], [`logits`], [`tree`], [`elementwise`], [`counter`],
//! [`schedule`]; the thread count here). Arrays are borrowed read-only in place
//! (no copy), checked for dtype and rank here (for clear messages), and handed
//! to the core with the GIL released. Nothing a caller controls is unwrapped.

mod arrays;
mod chain;
mod counter;
mod elementwise;
mod errors;
mod logits;
mod outputs;
mod schedule;
mod tree;

use pyo3::prelude::*;

use crate::threads;

/// The number of threads large batches are verified on.
#[pyfunction]
fn get_num_threads() -> usize {
    threads::num_threads()
}

/// Sets the number of threads for large batches (`1 <= n <= max_num_threads()`).
#[pyfunction]
fn set_num_threads(n: usize) -> PyResult<()> {
    Ok(threads::set_num_threads(n)?)
}

/// The largest thread count `set_num_threads` takes.
#[pyfunction]
fn max_num_threads() -> usize {
    threads::max_num_threads()
}

#[pymodule(gil_used = false)]
mod _native {
    #[pymodule_export]
    use super::arrays::NotInPlace;
    #[pymodule_export]
    use super::chain::{accepted_prefix_length, verify, verify_flat, verify_greedy};
    #[pymodule_export]
    use super::counter::{counter_stream, counter_uniforms};
    #[pymodule_export]
    use super::elementwise::{acceptance_mask, acceptance_rate, rejection_probability};
    #[pymodule_export]
    use super::logits::{verify_flat_logits, verify_logits};
    #[pymodule_export]
    use super::schedule::{acceptance_rows, best_ragged, best_width, fit_step_cost, StepCost};
    #[pymodule_export]
    use super::tree::{verify_tree, verify_tree_logits};
    #[pymodule_export]
    use super::{get_num_threads, max_num_threads, set_num_threads};

    #[pymodule_export]
    const PARALLEL_MIN_ELEMENTS: usize = crate::threads::PARALLEL_MIN_ELEMENTS;
    #[pymodule_export]
    const MAX_THREADS_PER_CPU: usize = crate::threads::MAX_THREADS_PER_CPU;
    #[pymodule_export]
    const SUM_BLOCK: usize = crate::sample::SUM_BLOCK;
    #[pymodule_export]
    const SUM_LANES: usize = crate::simd::SUM_LANES;
}
