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

/// Formats a float as Python's `repr` does (docs/spec.md section 5.8), so
/// messages read the same from both sides: the shortest digits that read back
/// to `v`, in positional notation for decimal exponents `-4 ..= 15` (`0.0001`,
/// `1e15` as `1000000000000000.0`) and scientific otherwise, with a signed
/// exponent of at least two digits (`1e-05`, `1e+16`); `nan`, `inf`, `-inf`.
pub(crate) fn show(v: f64) -> String {
    if v.is_nan() {
        return "nan".to_string();
    }
    if v.is_infinite() {
        return if v > 0.0 { "inf" } else { "-inf" }.to_string();
    }
    // Rust's `{:e}` gives the shortest round-trip digits: `d.ddde[-]x`.
    let scientific = format!("{:e}", v.abs());
    let (mantissa, exponent) = scientific.split_once('e').expect("`{:e}` has an exponent");
    let exponent: i32 = exponent.parse().expect("`{:e}`'s exponent is an integer");
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let sign = if v.is_sign_negative() { "-" } else { "" };
    // Digits before the decimal point, as Python's `decpt`.
    let point = exponent + 1;
    if !(-3..=16).contains(&point) {
        let (first, rest) = digits.split_at(1);
        let fraction = if rest.is_empty() {
            String::new()
        } else {
            format!(".{rest}")
        };
        let exp_sign = if exponent < 0 { '-' } else { '+' };
        return format!(
            "{sign}{first}{fraction}e{exp_sign}{:02}",
            exponent.unsigned_abs()
        );
    }
    let n = digits.len() as i32;
    let body = if point <= 0 {
        format!("0.{}{digits}", "0".repeat(point.unsigned_abs() as usize))
    } else if point >= n {
        format!("{digits}{}.0", "0".repeat((point - n) as usize))
    } else {
        let (whole, fraction) = digits.split_at(point as usize);
        format!("{whole}.{fraction}")
    };
    format!("{sign}{body}")
}

#[cfg(test)]
mod tests {
    use super::show;

    #[test]
    fn floats_print_as_python_s_repr() {
        // Python 3.11's `repr` of each value.
        for (v, python) in [
            (0.5, "0.5"),
            (0.0, "0.0"),
            (-0.0, "-0.0"),
            (1.5, "1.5"),
            (-2.0, "-2.0"),
            (0.0001, "0.0001"),
            (0.00012345, "0.00012345"),
            (1e-5, "1e-05"),
            (-1e-5, "-1e-05"),
            (1.5e-7, "1.5e-07"),
            (1e15, "1000000000000000.0"),
            (1234567890123456.0, "1234567890123456.0"),
            (1e16, "1e+16"),
            (1.2345678901234567e16, "1.2345678901234568e+16"),
            (9e307, "9e+307"),
            (f64::MAX, "1.7976931348623157e+308"),
            (f64::MIN_POSITIVE, "2.2250738585072014e-308"),
            (5e-324, "5e-324"),
            (2e-320, "2e-320"),
            (0.1, "0.1"),
            (1.0 / 3.0, "0.3333333333333333"),
            (123.456, "123.456"),
            (f64::NAN, "nan"),
            (f64::INFINITY, "inf"),
            (f64::NEG_INFINITY, "-inf"),
        ] {
            assert_eq!(show(v), python, "{v:e}");
        }
    }
}
