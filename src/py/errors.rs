//! The error mapping: every `CoreError` to the Python exception a caller can act on
//! (`specaccept.InputError`, `MemoryError`), naming the argument, index and row.

use pyo3::exceptions::{PyMemoryError, PyValueError};
use pyo3::prelude::*;

use crate::error::CoreError;

impl From<CoreError> for PyErr {
    fn from(err: CoreError) -> PyErr {
        Python::attach(|py| py_error(py, &err))
    }
}

/// `specaccept.InputError` (a `ValueError` naming the argument, the index and
/// the batch row) for a shape or value error; `MemoryError` for a buffer too
/// large.
pub(super) fn py_error(py: Python<'_>, err: &CoreError) -> PyErr {
    if let CoreError::Memory { .. } = err {
        return PyMemoryError::new_err(err.to_string());
    }
    let index = match err {
        CoreError::Value { .. } => Some(err.index().to_vec()),
        _ => None,
    };
    // Every value error of a batched argument is in the row its index starts
    // with, or the one the row loop named (the flat layout's requests).
    let row = err.row().or_else(|| match err.arg() {
        "n" => None,
        _ => index.as_ref().and_then(|i| i.first().copied()),
    });
    make_input_error(py, err.to_string(), err.arg(), index, row)
}

/// `specaccept.InputError(message, argument, index, row)`.
pub(super) fn make_input_error(
    py: Python<'_>,
    message: String,
    arg: &str,
    index: Option<Vec<usize>>,
    row: Option<usize>,
) -> PyErr {
    let made = py
        .import("specaccept._errors")
        .and_then(|m| m.getattr("InputError"))
        .and_then(|class| class.call1((message.as_str(), arg, index, row)));
    match made {
        Ok(instance) => PyErr::from_value(instance),
        Err(_) => PyValueError::new_err(message),
    }
}

/// An `InputError` about argument `arg` as a whole (a shape, a layout).
pub(super) fn input_error(arg: &str, message: String) -> PyErr {
    Python::attach(|py| make_input_error(py, message, arg, None, None))
}
