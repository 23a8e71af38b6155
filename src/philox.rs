//! Counter-based uniforms: Philox4x32-10 (Salmon, Moraes, Dror and Shaw,
//! "Parallel random numbers: as easy as 1, 2, 3", SC 2011), the generator of
//! cuRAND and of PyTorch's and Triton's GPU sampling.
//!
//! A request's uniforms are a pure function of its seed, its offset, the
//! position and the stream (docs/spec.md section 4.6):
//!
//! - key = (seed's low 32 bits, seed's high 32 bits);
//! - counter = (offset's low 32 bits, offset's high 32 bits, index, stream);
//! - the uniform is `((x0 << 32 | x1) >> 11) * 2**-53` from the first two
//!   outputs: 53 random bits, every value in `[0, 1)`, exactly representable.
//!
//! Stream [`ACCEPTANCE`] at index `i` is the acceptance uniform of draft
//! position (or tree node) `i`; stream [`RECOVERY`] at index 0 is the draw of
//! the replacement or bonus token. Nothing depends on the batch, the thread
//! count or earlier calls.

/// The multipliers and Weyl key increments of Philox4x32 (Random123's
/// `PHILOX_M4x32_0/1` and `PHILOX_W32_0/1`).
const M0: u32 = 0xD251_1F53;
const M1: u32 = 0xCD9E_8D57;
const W0: u32 = 0x9E37_79B9;
const W1: u32 = 0xBB67_AE85;

/// The stream of the acceptance uniforms (index: draft position or tree node).
pub const ACCEPTANCE: u32 = 0;
/// The stream of the recovery uniform (index 0).
pub const RECOVERY: u32 = 1;
/// The stream `specaccept.generate` samples its drafts from (index: position).
pub const DRAFTING: u32 = 2;

#[inline(always)]
fn mulhilo(a: u32, b: u32) -> (u32, u32) {
    let product = a as u64 * b as u64;
    ((product >> 32) as u32, product as u32)
}

/// Philox4x32 with 10 rounds: the four 32-bit outputs of `counter` under `key`.
#[inline]
pub fn philox4x32_10(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let [mut c0, mut c1, mut c2, mut c3] = counter;
    let [mut k0, mut k1] = key;
    for round in 0..10 {
        if round > 0 {
            k0 = k0.wrapping_add(W0);
            k1 = k1.wrapping_add(W1);
        }
        let (hi0, lo0) = mulhilo(M0, c0);
        let (hi1, lo1) = mulhilo(M1, c2);
        (c0, c1, c2, c3) = (hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0);
    }
    [c0, c1, c2, c3]
}

/// The float64 uniform in `[0, 1)` made from two 32-bit outputs.
#[inline(always)]
pub fn to_uniform(x0: u32, x1: u32) -> f64 {
    const TWO_POW_MINUS_53: f64 = 1.0 / (1u64 << 53) as f64;
    ((((x0 as u64) << 32) | x1 as u64) >> 11) as f64 * TWO_POW_MINUS_53
}

/// The uniform of `(seed, offset)` at `index` of `stream`.
#[inline]
pub fn uniform(seed: u64, offset: u64, index: u32, stream: u32) -> f64 {
    let key = [seed as u32, (seed >> 32) as u32];
    let [x0, x1, _, _] = philox4x32_10([offset as u32, (offset >> 32) as u32, index, stream], key);
    to_uniform(x0, x1)
}

/// Fills `out` (`[B, num_positions]`, row-major) with stream `stream` of each
/// row: `out[b * num_positions + i] = uniform(seeds[b], offsets[b], i, stream)`.
///
/// The caller checks `num_positions <= 2**32` (an index has 32 bits) and the
/// lengths: `seeds` and `offsets` have `B` entries, `out` `B * num_positions`.
pub fn fill(seeds: &[u64], offsets: &[u64], stream: u32, num_positions: usize, out: &mut [f64]) {
    debug_assert!(num_positions as u64 <= 1 << 32);
    debug_assert_eq!(seeds.len(), offsets.len());
    debug_assert_eq!(out.len(), seeds.len() * num_positions);
    if num_positions == 0 {
        return;
    }
    for ((&seed, &offset), row) in seeds
        .iter()
        .zip(offsets)
        .zip(out.chunks_exact_mut(num_positions))
    {
        for (i, u) in row.iter_mut().enumerate() {
            *u = uniform(seed, offset, i as u32, stream);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The known-answer vectors of Philox4x32-10 published with Random123
    /// (`kat_vectors`: counter, key, expected output).
    #[test]
    fn known_answers() {
        let cases: [([u32; 4], [u32; 2], [u32; 4]); 3] = [
            (
                [0; 4],
                [0; 2],
                [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8],
            ),
            (
                [u32::MAX; 4],
                [u32::MAX; 2],
                [0x408f_276d, 0x41c8_3b0e, 0xa20b_c7c6, 0x6d54_51fd],
            ),
            (
                [0x243f_6a88, 0x85a3_08d3, 0x1319_8a2e, 0x0370_7344],
                [0xa409_3822, 0x299f_31d0],
                [0xd16c_fe09, 0x94fd_cceb, 0x5001_e420, 0x2412_6ea1],
            ),
        ];
        for (counter, key, expected) in cases {
            assert_eq!(
                philox4x32_10(counter, key),
                expected,
                "counter {counter:08x?}"
            );
        }
    }

    #[test]
    fn uniforms_span_zero_to_just_below_one() {
        assert_eq!(to_uniform(0, 0), 0.0);
        assert_eq!(to_uniform(u32::MAX, u32::MAX), 1.0 - f64::EPSILON / 2.0);
        assert_eq!(to_uniform(0x8000_0000, 0), 0.5);
        // The low 11 bits of x1 are dropped.
        assert_eq!(to_uniform(0, 0x7ff), 0.0);
        assert_eq!(to_uniform(0, 0x800), 2f64.powi(-53));
    }

    #[test]
    fn seed_and_offset_are_split_into_low_and_high_words() {
        let seed = 0x0123_4567_89ab_cdef_u64;
        let offset = 0xfedc_ba98_7654_3210_u64;
        let [x0, x1, _, _] =
            philox4x32_10([0x7654_3210, 0xfedc_ba98, 3, 1], [0x89ab_cdef, 0x0123_4567]);
        assert_eq!(uniform(seed, offset, 3, 1), to_uniform(x0, x1));
    }

    #[test]
    fn fill_is_row_wise_and_independent_of_the_batch() {
        let (seeds, offsets) = ([7u64, 1 << 40, u64::MAX], [0u64, 5, u64::MAX]);
        let mut u = vec![0.0; 3 * 4];
        fill(&seeds, &offsets, ACCEPTANCE, 4, &mut u);
        for b in 0..3 {
            let mut one = vec![0.0; 4];
            fill(&seeds[b..=b], &offsets[b..=b], ACCEPTANCE, 4, &mut one);
            assert_eq!(&u[b * 4..(b + 1) * 4], &one[..]);
            for (i, &v) in one.iter().enumerate() {
                assert_eq!(v, uniform(seeds[b], offsets[b], i as u32, ACCEPTANCE));
            }
        }
        let mut r = vec![0.0; 3];
        fill(&seeds, &offsets, RECOVERY, 1, &mut r);
        assert_eq!(r[1], uniform(seeds[1], offsets[1], 0, RECOVERY));
        assert_ne!(r[1], u[4]);
        assert_ne!(u[0], u[1]);
    }
}
