//! The one error type of the core. The binding maps `Shape` and `Value` to
//! `specaccept.InputError` (a `ValueError` carrying the argument, the index and
//! the batch row) and `Memory` to `MemoryError`; dtype errors never reach the core.

use std::fmt;

/// Bad input, found before any result is returned.
#[derive(Debug, Clone, PartialEq)]
pub enum CoreError {
    /// An argument has the wrong number of dimensions or the wrong extents.
    Shape { arg: &'static str, message: String },
    /// A value that was read lies outside its domain. `index` locates it in `arg`.
    Value {
        arg: &'static str,
        index: Vec<usize>,
        message: String,
        /// The batch row the value belongs to, set by the row loop that read it
        /// ([`CoreError::in_row`]); `None` outside a row (a scalar argument).
        row: Option<usize>,
    },
    /// A buffer sized from `arg` cannot be allocated (the request is refused
    /// before anything is written; see `memory`).
    Memory { arg: &'static str, message: String },
}

impl CoreError {
    pub(crate) fn shape(arg: &'static str, message: impl Into<String>) -> Self {
        CoreError::Shape {
            arg,
            message: message.into(),
        }
    }

    pub(crate) fn value(arg: &'static str, index: &[usize], message: impl Into<String>) -> Self {
        CoreError::Value {
            arg,
            index: index.to_vec(),
            message: message.into(),
            row: None,
        }
    }

    /// This error, found while verifying batch row `b` (a `Value` error gets its row).
    pub fn in_row(mut self, b: usize) -> Self {
        if let CoreError::Value { row, .. } = &mut self {
            row.get_or_insert(b);
        }
        self
    }

    /// The batch row of a `Value` error found in a row.
    pub fn row(&self) -> Option<usize> {
        match self {
            CoreError::Value { row, .. } => *row,
            _ => None,
        }
    }

    /// The index of the bad value (`Value` errors), empty otherwise.
    pub fn index(&self) -> &[usize] {
        match self {
            CoreError::Value { index, .. } => index,
            _ => &[],
        }
    }

    /// The argument the error is about, as named in the Python API.
    pub fn arg(&self) -> &'static str {
        match self {
            CoreError::Shape { arg, .. }
            | CoreError::Value { arg, .. }
            | CoreError::Memory { arg, .. } => arg,
        }
    }
}

impl fmt::Display for CoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CoreError::Shape { arg, message } | CoreError::Memory { arg, message } => {
                write!(f, "{arg}: {message}")
            }
            CoreError::Value {
                arg,
                index,
                message,
                ..
            } => {
                write!(f, "{arg}[")?;
                for (i, ix) in index.iter().enumerate() {
                    if i > 0 {
                        write!(f, ", ")?;
                    }
                    write!(f, "{ix}")?;
                }
                write!(f, "] {message}")
            }
        }
    }
}

impl std::error::Error for CoreError {}

/// What a bad row does to a batch (`errors=` in Python).
pub enum RowErrors<'a> {
    /// The call fails with the first bad row's error; the outputs are then
    /// unspecified.
    Raise,
    /// Row `b`'s value error is stored at `[b]` (its row of the outputs marked:
    /// `-1` tokens, 0 accepted, 0 emitted) and the other rows are verified as in
    /// a batch without it. Shape and memory errors still fail the call.
    Isolate(&'a mut [Option<CoreError>]),
}

impl RowErrors<'_> {
    /// Handles row `i`'s error: `Ok` when it was isolated, else the error.
    pub(crate) fn record(&mut self, i: usize, error: CoreError) -> Result<(), CoreError> {
        match (self, &error) {
            (RowErrors::Isolate(slots), CoreError::Value { .. }) => {
                slots[i] = Some(error);
                Ok(())
            }
            _ => Err(error),
        }
    }

    /// Whether row `i`'s error was already recorded (isolating).
    pub(crate) fn is_recorded(&self, i: usize) -> bool {
        matches!(self, RowErrors::Isolate(slots) if slots[i].is_some())
    }

    /// Checks an isolating slice against the batch.
    pub(crate) fn check(&self, batch: usize) -> Result<(), CoreError> {
        match self {
            RowErrors::Isolate(slots) if slots.len() != batch => Err(CoreError::shape(
                "errors",
                format!("has {} slots for a batch of {batch} rows", slots.len()),
            )),
            _ => Ok(()),
        }
    }
}

/// Formats a float the way Python's `repr` does for the common cases
/// (`nan`, `inf`, `-inf`, `0.5`), so messages read the same from both sides.
pub(crate) fn show(v: f64) -> String {
    if v.is_nan() {
        "nan".to_string()
    } else if v.is_infinite() {
        if v > 0.0 { "inf" } else { "-inf" }.to_string()
    } else {
        format!("{v:?}")
    }
}
