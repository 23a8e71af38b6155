//! How the sampled rows of a chain decide their accepted prefix: the token rule,
//! block verification, or a lossy method (docs/spec.md sections 2.2, 2.6 to
//! 2.8). `chain` and `logits` verify with it; the binding builds it from what the
//! Python layer passes.

use crate::error::CoreError;
use crate::lossy;

/// How the sampled rows of a chain decide their accepted prefix.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum Method<'a> {
    /// Token by token, stopping at the first rejection (docs/spec.md section 2.2).
    #[default]
    Token,
    /// The whole block jointly (Sun et al., 2025; docs/spec.md section 2.6).
    Block,
    /// Typical acceptance (Medusa), **lossy**: docs/spec.md section 2.7, `lossy`.
    Typical { epsilon: f64, delta: f64 },
    /// Synthetic acceptance at these per-position rates (`[K]`), **lossy**: a
    /// load generator, docs/spec.md section 2.8, `lossy`.
    Synthetic(&'a [f64]),
}

impl Method<'_> {
    /// Checks the method's own parameters against `K`.
    pub(crate) fn check(&self, num_draft: usize) -> Result<(), CoreError> {
        match *self {
            Method::Token | Method::Block => Ok(()),
            Method::Typical { epsilon, delta } => lossy::check_typical(epsilon, delta),
            Method::Synthetic(rates) => lossy::check_rates(rates, num_draft),
        }
    }
}
