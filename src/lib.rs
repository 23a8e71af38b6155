//! specaccept: the verification step of speculative decoding.
//!
//! The core (every module but `py`) knows nothing of Python: it reads
//! [`ndarray`] views in place, writes into caller-provided outputs and returns
//! [`error::CoreError`] on bad input. `py` (feature `python`) is the one binding module:
//! every `#[pyfunction]`, the dtype dispatch and the error mapping.
//!
//! Where each number is computed:
//! - [`rule`]: the acceptance rule for one drafted token (accept outright when
//!   `q <= p`, else accept iff `u < p / q`; `p == 0` rejects) and the
//!   elementwise primitives built on it.
//! - [`sample`]: inverse-CDF sampling with the canonical summation order that
//!   `specaccept.reference` mirrors to the bit; [`simd`] holds its block sums
//!   (portable, and AVX2 chosen at run time: the same bits).
//! - [`rate`]: the analytic acceptance rate `sum(min(p, q))` per row.
//! - [`lossy`]: the lossy methods of the laboratory (typical and synthetic
//!   acceptance), compared with the exact rules, never a default.
//! - [`philox`]: counter-based uniforms (Philox4x32-10) from per-request
//!   seeds and offsets.
//! - [`tree`]: tree verification (many candidates per position).
//! - [`logits`]: verification from logits (temperature, top-k, top-p).
//! - [`chain`]: chain verification (`verify`), greedy verification on ids
//!   (`verify_greedy`) and the accepted-prefix scan; [`threads`] decides when
//!   rows run in parallel.
//! - [`schedule`]: `AdaptiveK`'s numbers (choosing how many tokens each
//!   request drafts): the step-time fit and the choice it is worth the most
//!   under.
//!
//! Shared by all of them: [`checks`] (the input checks, and where a value
//! lives so errors can name it), [`prob`] (the probability element types and
//! their loaders), [`division`] (a row divided by its total with the bits of
//! the division instruction, faster), [`view`] (the input views: any dtype, any strides), [`error`] (the one error type, and what a bad row does to a
//! batch) and [`memory`] (fallible buffers: a size too large is an error, not
//! an abort). The contract they implement is `docs/spec.md`.

pub mod block;
pub mod chain;
pub mod checks;
pub mod division;
pub mod error;
pub mod logits;
pub mod lossy;
pub mod memory;
pub mod method;
pub mod philox;
pub mod prob;
pub mod rate;
pub mod rule;
pub mod sample;
pub mod schedule;
pub mod simd;
pub mod threads;
pub mod tree;
pub mod view;

#[cfg(feature = "python")]
mod py;
