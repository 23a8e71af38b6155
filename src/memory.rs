//! Fallible buffers. Every buffer whose size comes from the caller (a row of
//! `V`, a batch of `B`, an output of `B * (K + 1)`) is reserved with
//! `try_reserve` before it is written, so a size this process cannot hold is
//! [`CoreError::Memory`] naming the argument the size comes from (a
//! `MemoryError` in Python), never an abort. Sizes are validated against the
//! inputs first (see each module's `dims`); what remains is genuinely large.

use crate::error::CoreError;

/// Makes room for `n` elements in `buffer` (its length unchanged), or says
/// which argument asked for too many.
pub(crate) fn reserve<T>(
    buffer: &mut Vec<T>,
    n: usize,
    arg: &'static str,
) -> Result<(), CoreError> {
    let more = n.saturating_sub(buffer.len());
    buffer
        .try_reserve(more)
        .map_err(|_| too_large(arg, n, std::mem::size_of::<T>()))
}

/// An empty vector with room for `n` elements.
pub(crate) fn with_capacity<T>(n: usize, arg: &'static str) -> Result<Vec<T>, CoreError> {
    let mut buffer = Vec::new();
    reserve(&mut buffer, n, arg)?;
    Ok(buffer)
}

/// The error for a buffer of `n` elements of `size` bytes sized from `arg`.
pub fn too_large(arg: &'static str, n: usize, size: usize) -> CoreError {
    CoreError::Memory {
        arg,
        message: format!(
            "needs a buffer of {n} values ({}), which cannot be allocated",
            show_bytes(n as f64 * size as f64)
        ),
    }
}

/// `bytes` in the largest binary unit that keeps the number at least 1.
pub fn show_bytes(bytes: f64) -> String {
    const UNITS: [&str; 7] = ["bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut value = bytes;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} bytes")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_impossible_size_is_an_error_naming_the_argument() {
        let mut v: Vec<f64> = Vec::new();
        let e = reserve(&mut v, usize::MAX / 4, "target_probs").unwrap_err();
        assert_eq!(e.arg(), "target_probs");
        assert!(e.to_string().contains("cannot be allocated"), "{e}");
        assert!(e.to_string().contains("EiB"), "{e}");
        assert!(with_capacity::<u8>(1 << 20, "x").unwrap().capacity() >= 1 << 20);
    }

    #[test]
    fn sizes_read_in_binary_units() {
        assert_eq!(show_bytes(512.0), "512 bytes");
        assert_eq!(show_bytes(8.0 * (1u64 << 40) as f64), "8.0 TiB");
    }
}
