//! The one error type of the core. The binding maps every variant to a Python
//! exception (`ValueError`); dtype errors never reach the core.

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
    },
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
        }
    }

    /// The argument the error is about, as named in the Python API.
    pub fn arg(&self) -> &'static str {
        match self {
            CoreError::Shape { arg, .. } | CoreError::Value { arg, .. } => arg,
        }
    }
}

impl fmt::Display for CoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CoreError::Shape { arg, message } => write!(f, "{arg}: {message}"),
            CoreError::Value {
                arg,
                index,
                message,
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
