//! Block kernels of the canonical summation (see [`crate::sample`]): a portable
//! version, an AVX2 one chosen at run time on x86-64, and a NEON one on aarch64
//! (always: NEON is part of its baseline). All compute the same bits: lane `l`
//! of the [`SUM_LANES`] accumulators adds the elements with
//! `i % SUM_LANES == l` in index order; the AVX2 kernel holds four lanes per
//! register and the NEON kernel two, so each register add is four (two) of the
//! portable adds. Sixteen lanes make four independent chains of adds (eight
//! with NEON), enough to hide the add latency while reading the row front to
//! back (what the hardware prefetcher follows best).
//!
//! Each kernel also reports whether every value it read is surely finite and
//! non-negative, by keeping the largest bit pattern seen (see [`Prob`]);
//! `false` sends the caller to the exact, slower check.

use crate::prob::Prob;

/// Accumulators per block of the canonical summation (a power of two).
pub const SUM_LANES: usize = 16;
const _: () = assert!(SUM_LANES.is_power_of_two() && SUM_LANES.is_multiple_of(8));

/// The sums a block needs, for unit-stride rows.
pub(crate) trait Kernel {
    /// The canonical sum of `p`, and whether every value is surely valid.
    fn dense<P: Prob>(p: &[P]) -> (f64, bool);
    /// The canonical sum of `O(p_i, q_i)` (`p`, `q` of equal length), and
    /// whether every value of both is surely valid.
    fn pair<O: PairOp, P: Prob, Q: Prob>(op: O, p: &[P], q: &[Q]) -> (f64, bool);
    /// [`Kernel::pair`] where `p` is a float64 buffer a round just wrote (in
    /// cache) and `q` a row read from memory: the same sum, with `q`'s lines
    /// asked for ahead where the kernel can (AVX2). The validity flag covers
    /// `q`; it may or may not cover `p`, whose values the caller does not
    /// check (the AVX2 kernel leaves them out).
    fn pair_ahead<O: PairOp, P: Prob, Q: Prob>(op: O, p: &[P], q: &[Q]) -> (f64, bool) {
        Self::pair(op, p, q)
    }
    /// [`Kernel::pair`], also writing each `O(p_i, q_i)` to `out[i]` (`out` as
    /// long as `p`): a residual and its canonical sum in one pass.
    fn pair_store<O: PairOp, P: Prob, Q: Prob>(
        op: O,
        p: &[P],
        q: &[Q],
        out: &mut [f64],
    ) -> (f64, bool);
    /// [`Kernel::pair_store`] in place: `w[i] = O(w[i], q_i)` (a later round of
    /// a residual, one buffer instead of two). Only `q` is checked: `w` holds the
    /// caller's own finite, non-negative values (an earlier round's output).
    fn pair_update<O: PairOp, Q: Prob>(op: O, w: &mut [f64], q: &[Q]) -> (f64, bool);
}

/// What a pair of rows is summed as, elementwise.
pub(crate) trait PairOp: Copy + Sync {
    fn apply(self, p: f64, q: f64) -> f64;
    /// [`PairOp::apply`] on four lanes, the same bits.
    ///
    /// # Safety
    /// The CPU has AVX2.
    #[cfg(target_arch = "x86_64")]
    unsafe fn apply4(
        self,
        p: std::arch::x86_64::__m256d,
        q: std::arch::x86_64::__m256d,
    ) -> std::arch::x86_64::__m256d;
    /// [`PairOp::apply`] on two lanes, the same bits.
    ///
    /// # Safety
    /// None beyond NEON, which every aarch64 target has (`unsafe` for the
    /// intrinsics' sake).
    #[cfg(target_arch = "aarch64")]
    unsafe fn apply2(
        self,
        p: std::arch::aarch64::float64x2_t,
        q: std::arch::aarch64::float64x2_t,
    ) -> std::arch::aarch64::float64x2_t;
}

/// [`positive_part`] on two lanes: `d` where `d > 0`, else `+0.0`. A compare
/// and a select, not `vmaxq_f64`, which returns NaN for a NaN `d` where
/// `positive_part` (and x86's `maxpd(d, 0)`) give `+0.0`.
#[cfg(target_arch = "aarch64")]
#[inline(always)]
unsafe fn positive_part2(d: std::arch::aarch64::float64x2_t) -> std::arch::aarch64::float64x2_t {
    use std::arch::aarch64::*;
    let zero = vdupq_n_f64(0.0);
    vbslq_f64(vcgtq_f64(d, zero), d, zero)
}

/// `max(0, p - q)`: the residual after a rejection.
#[derive(Clone, Copy)]
pub(crate) struct Residual;

/// `max(0, rho * p - q)`, the product rounded before the difference (no fused
/// multiply-add): block verification's residual and its mass `Z` (docs/spec.md
/// section 2.6). `rho = 1` gives [`Residual`]'s bits.
#[derive(Clone, Copy)]
pub(crate) struct ScaledResidual(pub f64);

/// `min(p, q)`: the overlap of two distributions, whose sum is the acceptance rate.
#[derive(Clone, Copy)]
pub(crate) struct Overlap;

impl PairOp for Residual {
    #[inline(always)]
    fn apply(self, p: f64, q: f64) -> f64 {
        positive_part(p - q)
    }
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn apply4(
        self,
        p: std::arch::x86_64::__m256d,
        q: std::arch::x86_64::__m256d,
    ) -> std::arch::x86_64::__m256d {
        use std::arch::x86_64::*;
        // MAXPD(d, 0) returns d when d > 0, else 0: `positive_part`.
        _mm256_max_pd(_mm256_sub_pd(p, q), _mm256_setzero_pd())
    }
    #[cfg(target_arch = "aarch64")]
    #[inline(always)]
    unsafe fn apply2(
        self,
        p: std::arch::aarch64::float64x2_t,
        q: std::arch::aarch64::float64x2_t,
    ) -> std::arch::aarch64::float64x2_t {
        positive_part2(std::arch::aarch64::vsubq_f64(p, q))
    }
}

impl PairOp for ScaledResidual {
    #[inline(always)]
    fn apply(self, p: f64, q: f64) -> f64 {
        positive_part(self.0 * p - q)
    }
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn apply4(
        self,
        p: std::arch::x86_64::__m256d,
        q: std::arch::x86_64::__m256d,
    ) -> std::arch::x86_64::__m256d {
        use std::arch::x86_64::*;
        let scaled = _mm256_mul_pd(_mm256_set1_pd(self.0), p);
        _mm256_max_pd(_mm256_sub_pd(scaled, q), _mm256_setzero_pd())
    }
    #[cfg(target_arch = "aarch64")]
    #[inline(always)]
    unsafe fn apply2(
        self,
        p: std::arch::aarch64::float64x2_t,
        q: std::arch::aarch64::float64x2_t,
    ) -> std::arch::aarch64::float64x2_t {
        use std::arch::aarch64::*;
        // A product, then a difference: two roundings, as `apply` (LLVM does
        // not fuse separate intrinsics into FMLS).
        let scaled = vmulq_f64(vdupq_n_f64(self.0), p);
        positive_part2(vsubq_f64(scaled, q))
    }
}

impl PairOp for Overlap {
    #[inline(always)]
    fn apply(self, p: f64, q: f64) -> f64 {
        // MINPD's rule: the first operand when it is smaller, else the second.
        if p < q {
            p
        } else {
            q
        }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn apply4(
        self,
        p: std::arch::x86_64::__m256d,
        q: std::arch::x86_64::__m256d,
    ) -> std::arch::x86_64::__m256d {
        std::arch::x86_64::_mm256_min_pd(p, q)
    }
    #[cfg(target_arch = "aarch64")]
    #[inline(always)]
    unsafe fn apply2(
        self,
        p: std::arch::aarch64::float64x2_t,
        q: std::arch::aarch64::float64x2_t,
    ) -> std::arch::aarch64::float64x2_t {
        use std::arch::aarch64::*;
        // MINPD's rule by compare and select (`vminq_f64` differs for NaN and
        // for -0.0 against +0.0).
        vbslq_f64(vcltq_f64(p, q), p, q)
    }
}

/// Plain Rust, for every target: the bits every SIMD kernel matches (on
/// aarch64, where NEON is baseline, only the tests run it).
#[cfg_attr(all(target_arch = "aarch64", not(test)), allow(dead_code))]
pub(crate) struct Portable;

/// The kernel every CPU of the target runs: `Neon` on aarch64, else
/// [`Portable`] (on x86-64 the callers pick `Avx2` at run time on top).
#[cfg(target_arch = "aarch64")]
pub(crate) type Baseline = Neon;
/// The kernel every CPU of the target runs: `Neon` on aarch64, else
/// [`Portable`] (on x86-64 the callers pick `Avx2` at run time on top).
#[cfg(not(target_arch = "aarch64"))]
pub(crate) type Baseline = Portable;

/// `max(0, d)` for a finite `d`, written as x86's `maxpd(d, 0)` computes it.
#[inline(always)]
pub(crate) fn positive_part(d: f64) -> f64 {
    if d > 0.0 {
        d
    } else {
        0.0
    }
}

/// The lanes added pairwise: `l0 + l1`, `l2 + l3`, ..., then those sums
/// pairwise, down to one (for 8 lanes: `((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7))`).
#[inline(always)]
pub(crate) fn combine_lanes(mut l: [f64; SUM_LANES]) -> f64 {
    let mut n = SUM_LANES;
    while n > 1 {
        n /= 2;
        for i in 0..n {
            l[i] = l[2 * i] + l[2 * i + 1];
        }
    }
    l[0]
}

impl Kernel for Portable {
    #[inline(always)]
    fn dense<P: Prob>(p: &[P]) -> (f64, bool) {
        let mut lanes = [0.0f64; SUM_LANES];
        let mut high = [P::Bits::default(); SUM_LANES];
        let (chunks, tail) = p.as_chunks::<SUM_LANES>();
        for c in chunks {
            for l in 0..SUM_LANES {
                high[l] = high[l].max(c[l].bits());
                lanes[l] += c[l].to_f64();
            }
        }
        add_dense_tail(&mut lanes, &mut high, tail);
        let ok = high.iter().all(|&h| h <= P::LARGEST_FINITE);
        (combine_lanes(lanes), ok)
    }

    #[inline(always)]
    fn pair<O: PairOp, P: Prob, Q: Prob>(op: O, p: &[P], q: &[Q]) -> (f64, bool) {
        let mut lanes = [0.0f64; SUM_LANES];
        let mut high_p = [P::Bits::default(); SUM_LANES];
        let mut high_q = [Q::Bits::default(); SUM_LANES];
        let (p_chunks, p_tail) = p.as_chunks::<SUM_LANES>();
        let (q_chunks, q_tail) = q.as_chunks::<SUM_LANES>();
        for (pc, qc) in p_chunks.iter().zip(q_chunks) {
            for l in 0..SUM_LANES {
                high_p[l] = high_p[l].max(pc[l].bits());
                high_q[l] = high_q[l].max(qc[l].bits());
                lanes[l] += op.apply(pc[l].to_f64(), qc[l].to_f64());
            }
        }
        add_pair_tail::<O, P, Q>(op, &mut lanes, &mut high_p, &mut high_q, p_tail, q_tail);
        let ok = high_p.iter().all(|&h| h <= P::LARGEST_FINITE)
            & high_q.iter().all(|&h| h <= Q::LARGEST_FINITE);
        (combine_lanes(lanes), ok)
    }

    #[inline(always)]
    fn pair_store<O: PairOp, P: Prob, Q: Prob>(
        op: O,
        p: &[P],
        q: &[Q],
        out: &mut [f64],
    ) -> (f64, bool) {
        let mut lanes = [0.0f64; SUM_LANES];
        let mut high_p = [P::Bits::default(); SUM_LANES];
        let mut high_q = [Q::Bits::default(); SUM_LANES];
        let (p_chunks, p_tail) = p.as_chunks::<SUM_LANES>();
        let (q_chunks, q_tail) = q.as_chunks::<SUM_LANES>();
        let (o_chunks, o_tail) = out.as_chunks_mut::<SUM_LANES>();
        for ((pc, qc), oc) in p_chunks.iter().zip(q_chunks).zip(o_chunks) {
            for l in 0..SUM_LANES {
                high_p[l] = high_p[l].max(pc[l].bits());
                high_q[l] = high_q[l].max(qc[l].bits());
                oc[l] = op.apply(pc[l].to_f64(), qc[l].to_f64());
                lanes[l] += oc[l];
            }
        }
        store_pair_tail::<O, P, Q>(
            op,
            &mut lanes,
            &mut high_p,
            &mut high_q,
            p_tail,
            q_tail,
            o_tail,
        );
        let ok = high_p.iter().all(|&h| h <= P::LARGEST_FINITE)
            & high_q.iter().all(|&h| h <= Q::LARGEST_FINITE);
        (combine_lanes(lanes), ok)
    }

    #[inline(always)]
    fn pair_update<O: PairOp, Q: Prob>(op: O, w: &mut [f64], q: &[Q]) -> (f64, bool) {
        let mut lanes = [0.0f64; SUM_LANES];
        let mut high_q = [Q::Bits::default(); SUM_LANES];
        let (w_chunks, w_tail) = w.as_chunks_mut::<SUM_LANES>();
        let (q_chunks, q_tail) = q.as_chunks::<SUM_LANES>();
        for (wc, qc) in w_chunks.iter_mut().zip(q_chunks) {
            for l in 0..SUM_LANES {
                high_q[l] = high_q[l].max(qc[l].bits());
                wc[l] = op.apply(wc[l], qc[l].to_f64());
                lanes[l] += wc[l];
            }
        }
        update_pair_tail::<O, Q>(op, &mut lanes, &mut high_q, w_tail, q_tail);
        let ok = high_q.iter().all(|&h| h <= Q::LARGEST_FINITE);
        (combine_lanes(lanes), ok)
    }
}

/// [`store_pair_tail`] in place.
#[inline(always)]
fn update_pair_tail<O: PairOp, Q: Prob>(
    op: O,
    lanes: &mut [f64; SUM_LANES],
    high_q: &mut [Q::Bits; SUM_LANES],
    w_tail: &mut [f64],
    q_tail: &[Q],
) {
    for (l, (wv, qv)) in w_tail.iter_mut().zip(q_tail).enumerate() {
        high_q[l] = high_q[l].max(qv.bits());
        *wv = op.apply(*wv, qv.to_f64());
        lanes[l] += *wv;
    }
}

/// [`add_pair_tail`], also writing each value to `out`.
#[inline(always)]
fn store_pair_tail<O: PairOp, P: Prob, Q: Prob>(
    op: O,
    lanes: &mut [f64; SUM_LANES],
    high_p: &mut [P::Bits; SUM_LANES],
    high_q: &mut [Q::Bits; SUM_LANES],
    p_tail: &[P],
    q_tail: &[Q],
    out: &mut [f64],
) {
    for (l, ((pv, qv), o)) in p_tail.iter().zip(q_tail).zip(out).enumerate() {
        high_p[l] = high_p[l].max(pv.bits());
        high_q[l] = high_q[l].max(qv.bits());
        *o = op.apply(pv.to_f64(), qv.to_f64());
        lanes[l] += *o;
    }
}

/// The last `len % 16` elements go to lanes `0..` in order.
#[inline(always)]
fn add_dense_tail<P: Prob>(
    lanes: &mut [f64; SUM_LANES],
    high: &mut [P::Bits; SUM_LANES],
    tail: &[P],
) {
    for (l, v) in tail.iter().enumerate() {
        high[l] = high[l].max(v.bits());
        lanes[l] += v.to_f64();
    }
}

#[inline(always)]
fn add_pair_tail<O: PairOp, P: Prob, Q: Prob>(
    op: O,
    lanes: &mut [f64; SUM_LANES],
    high_p: &mut [P::Bits; SUM_LANES],
    high_q: &mut [Q::Bits; SUM_LANES],
    p_tail: &[P],
    q_tail: &[Q],
) {
    for (l, (pv, qv)) in p_tail.iter().zip(q_tail).enumerate() {
        high_p[l] = high_p[l].max(pv.bits());
        high_q[l] = high_q[l].max(qv.bits());
        lanes[l] += op.apply(pv.to_f64(), qv.to_f64());
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) use x86::{has_avx2, has_avx512vl, Avx2};

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{
        add_dense_tail, add_pair_tail, combine_lanes, store_pair_tail, update_pair_tail, Kernel,
        PairOp, SUM_LANES,
    };
    use crate::prob::Prob;

    /// Whether this CPU runs the AVX2 kernels (cached by std after the first call).
    #[inline]
    pub(crate) fn has_avx2() -> bool {
        std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("f16c")
    }

    /// Whether this CPU has AVX-512F and AVX-512VL: kernels with many live
    /// vectors are compiled for them too, for the 32 registers (their
    /// intrinsics stay 256-bit; every build gives the same bits).
    #[inline]
    pub(crate) fn has_avx512vl() -> bool {
        std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("avx512vl")
    }

    /// The AVX2 kernels. Only reachable through functions compiled with
    /// `#[target_feature(enable = "avx2,f16c")]` that run after [`has_avx2`].
    pub(crate) struct Avx2;

    impl Kernel for Avx2 {
        #[inline(always)]
        fn dense<P: Prob>(p: &[P]) -> (f64, bool) {
            // SAFETY: `Avx2` is only used on CPUs where `has_avx2()` holds.
            unsafe { dense(p) }
        }
        #[inline(always)]
        fn pair<O: PairOp, P: Prob, Q: Prob>(op: O, p: &[P], q: &[Q]) -> (f64, bool) {
            // SAFETY: as above; `p` and `q` have equal lengths (checked shapes).
            unsafe { pair::<O, P, Q, false>(op, p, q) }
        }
        #[inline(always)]
        fn pair_ahead<O: PairOp, P: Prob, Q: Prob>(op: O, p: &[P], q: &[Q]) -> (f64, bool) {
            // SAFETY: as above.
            unsafe { pair::<O, P, Q, true>(op, p, q) }
        }
        #[inline(always)]
        fn pair_store<O: PairOp, P: Prob, Q: Prob>(
            op: O,
            p: &[P],
            q: &[Q],
            out: &mut [f64],
        ) -> (f64, bool) {
            // SAFETY: as above; `out` is at least as long as `p` (asserted there).
            unsafe { pair_store::<O, P, Q>(op, p, q, out) }
        }
        #[inline(always)]
        fn pair_update<O: PairOp, Q: Prob>(op: O, w: &mut [f64], q: &[Q]) -> (f64, bool) {
            // SAFETY: as above; `q` is as long as `w` (asserted there).
            unsafe { pair_update::<O, Q>(op, w, q) }
        }
    }

    /// `f64x4` registers holding the lanes: register `r` holds lanes `4r..4r+4`.
    const REGS: usize = SUM_LANES / 4;

    /// How far ahead of a step [`ahead`] asks for a row's line.
    const PREFETCH_BYTES: usize = 2048;

    /// Asks for the line [`PREFETCH_BYTES`] past the start of `chunk`, once per
    /// step of [`SUM_LANES`] entries (every line of a float32 row, every other
    /// line of a float64 one), in the kernels that write or update a
    /// residual (`pair_store`, `pair_update`: the rounds of a tree, which stream
    /// their input rows next to a float64 buffer that does not stay in L2). The
    /// hint keeps more of the rows' misses in flight than the hardware
    /// prefetcher alone: 3% to 14% faster on `bench_tree.py`'s fully rejected
    /// trees, measured side by side in one process (`benches/ab.py`). `pair`,
    /// which streams two cold rows and nothing else, keeps none: with it a
    /// chain's residual measured 3% slower and `acceptance_rate` 10%.
    /// `pair_ahead` (a round's float64 buffer, in cache, summed against a draft
    /// row read from memory: the last round of a tree) asks for the draft
    /// row's lines only: 4% to 5% faster on the fully rejected token tree, on
    /// one thread and on two (`ab.py tree-token`, 2026-12-02). Callers
    /// pass one block at a time, so the line asked for is usually the next
    /// block's; past a row's end it is a line nobody reads. The NEON kernels
    /// have none: ARM speed is not measured.
    #[inline(always)]
    fn ahead<T>(chunk: &[T]) {
        let line = chunk.as_ptr().cast::<i8>().wrapping_add(PREFETCH_BYTES);
        // SAFETY: a prefetch is only a hint: it reads nothing the program sees
        // and never faults, whatever the address (SSE, part of x86-64).
        unsafe { _mm_prefetch::<_MM_HINT_T0>(line) };
    }

    /// [`combine_lanes`] of the lanes in `acc`, the same bits, in registers:
    /// a block without a tail returns without a round trip through memory
    /// (whose reloads, wider than or straddling the stores, stall
    /// store-to-load forwarding).
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn combine(acc: [__m256d; REGS]) -> f64 {
        const _: () = assert!(REGS == 4, "the pairing below is for 16 lanes");
        // Level 1: [l0+l1, l4+l5, l2+l3, l6+l7] and the same for lanes 8..16.
        let h01 = _mm256_hadd_pd(acc[0], acc[1]);
        let h23 = _mm256_hadd_pd(acc[2], acc[3]);
        // Level 2: [(l0+l1)+(l2+l3), (l4+l5)+(l6+l7)] and lanes 8..16's.
        let t01 = _mm_add_pd(_mm256_castpd256_pd128(h01), _mm256_extractf128_pd::<1>(h01));
        let t23 = _mm_add_pd(_mm256_castpd256_pd128(h23), _mm256_extractf128_pd::<1>(h23));
        // Level 3, then the last sum.
        let u = _mm_hadd_pd(t01, t23);
        _mm_cvtsd_f64(_mm_add_sd(u, _mm_unpackhi_pd(u, u)))
    }

    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn spill(acc: [__m256d; REGS]) -> [f64; SUM_LANES] {
        let mut lanes = [0.0f64; SUM_LANES];
        for (r, reg) in acc.into_iter().enumerate() {
            _mm256_storeu_pd(lanes.as_mut_ptr().add(4 * r), reg);
        }
        lanes
    }

    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn dense<P: Prob>(p: &[P]) -> (f64, bool) {
        let mut acc = [_mm256_setzero_pd(); REGS];
        let mut high = _mm256_setzero_si256();
        let (chunks, tail) = p.as_chunks::<SUM_LANES>();
        for c in chunks {
            for (r, eight) in c.as_chunks::<8>().0.iter().enumerate() {
                let (a, b) = P::load8(eight.as_ptr(), &mut high);
                acc[2 * r] = _mm256_add_pd(acc[2 * r], a);
                acc[2 * r + 1] = _mm256_add_pd(acc[2 * r + 1], b);
            }
        }
        let body_ok = P::all_valid(high);
        if tail.is_empty() {
            return (combine(acc), body_ok);
        }
        let mut lanes = spill(acc);
        let mut high = [P::Bits::default(); SUM_LANES];
        add_dense_tail(&mut lanes, &mut high, tail);
        let ok = body_ok & high.iter().all(|&h| h <= P::LARGEST_FINITE);
        (combine_lanes(lanes), ok)
    }

    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn pair<O: PairOp, P: Prob, Q: Prob, const AHEAD: bool>(
        op: O,
        p: &[P],
        q: &[Q],
    ) -> (f64, bool) {
        let mut acc = [_mm256_setzero_pd(); REGS];
        let (mut high_p, mut high_q) = (_mm256_setzero_si256(), _mm256_setzero_si256());
        let (p_chunks, p_tail) = p.as_chunks::<SUM_LANES>();
        let (q_chunks, q_tail) = q.as_chunks::<SUM_LANES>();
        for (pc, qc) in p_chunks.iter().zip(q_chunks) {
            if AHEAD {
                ahead(qc);
            }
            let eights = pc.as_chunks::<8>().0.iter().zip(qc.as_chunks::<8>().0);
            for (r, (p8, q8)) in eights.enumerate() {
                // AHEAD: `p` is a buffer the caller does not check; its flag
                // is computed into a value nothing reads (and so not at all).
                let mut unread = _mm256_setzero_si256();
                let p_high = if AHEAD { &mut unread } else { &mut high_p };
                let (pa, pb) = P::load8(p8.as_ptr(), p_high);
                let (qa, qb) = Q::load8(q8.as_ptr(), &mut high_q);
                acc[2 * r] = _mm256_add_pd(acc[2 * r], op.apply4(pa, qa));
                acc[2 * r + 1] = _mm256_add_pd(acc[2 * r + 1], op.apply4(pb, qb));
            }
        }
        let body_ok = P::all_valid(high_p) & Q::all_valid(high_q);
        if p_tail.is_empty() {
            return (combine(acc), body_ok);
        }
        let mut lanes = spill(acc);
        let mut high_p = [P::Bits::default(); SUM_LANES];
        let mut high_q = [Q::Bits::default(); SUM_LANES];
        add_pair_tail::<O, P, Q>(op, &mut lanes, &mut high_p, &mut high_q, p_tail, q_tail);
        let ok = body_ok
            & high_p.iter().all(|&h| h <= P::LARGEST_FINITE)
            & high_q.iter().all(|&h| h <= Q::LARGEST_FINITE);
        (combine_lanes(lanes), ok)
    }

    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn pair_update<O: PairOp, Q: Prob>(op: O, w: &mut [f64], q: &[Q]) -> (f64, bool) {
        assert!(q.len() == w.len());
        let mut acc = [_mm256_setzero_pd(); REGS];
        let mut high_q = _mm256_setzero_si256();
        let (w_chunks, w_tail) = w.as_chunks_mut::<SUM_LANES>();
        let (q_chunks, q_tail) = q.as_chunks::<SUM_LANES>();
        for (wc, qc) in w_chunks.iter_mut().zip(q_chunks) {
            ahead(qc);
            for (r, q8) in qc.as_chunks::<8>().0.iter().enumerate() {
                let at = wc.as_mut_ptr().add(8 * r);
                // Both loads of these 8 weights come before their stores.
                let (wa, wb) = (_mm256_loadu_pd(at), _mm256_loadu_pd(at.add(4)));
                let (qa, qb) = Q::load8(q8.as_ptr(), &mut high_q);
                let (na, nb) = (op.apply4(wa, qa), op.apply4(wb, qb));
                _mm256_storeu_pd(at, na);
                _mm256_storeu_pd(at.add(4), nb);
                acc[2 * r] = _mm256_add_pd(acc[2 * r], na);
                acc[2 * r + 1] = _mm256_add_pd(acc[2 * r + 1], nb);
            }
        }
        let body_ok = Q::all_valid(high_q);
        if w_tail.is_empty() {
            return (combine(acc), body_ok);
        }
        let mut lanes = spill(acc);
        let mut high_q = [Q::Bits::default(); SUM_LANES];
        update_pair_tail::<O, Q>(op, &mut lanes, &mut high_q, w_tail, q_tail);
        let ok = body_ok & high_q.iter().all(|&h| h <= Q::LARGEST_FINITE);
        (combine_lanes(lanes), ok)
    }

    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn pair_store<O: PairOp, P: Prob, Q: Prob>(
        op: O,
        p: &[P],
        q: &[Q],
        out: &mut [f64],
    ) -> (f64, bool) {
        assert!(q.len() == p.len() && out.len() == p.len());
        let mut acc = [_mm256_setzero_pd(); REGS];
        let (mut high_p, mut high_q) = (_mm256_setzero_si256(), _mm256_setzero_si256());
        let (p_chunks, p_tail) = p.as_chunks::<SUM_LANES>();
        let (q_chunks, q_tail) = q.as_chunks::<SUM_LANES>();
        let (o_chunks, o_tail) = out.as_chunks_mut::<SUM_LANES>();
        for ((pc, qc), oc) in p_chunks.iter().zip(q_chunks).zip(o_chunks) {
            ahead(pc);
            ahead(qc);
            let eights = pc.as_chunks::<8>().0.iter().zip(qc.as_chunks::<8>().0);
            for (r, (p8, q8)) in eights.enumerate() {
                let (pa, pb) = P::load8(p8.as_ptr(), &mut high_p);
                let (qa, qb) = Q::load8(q8.as_ptr(), &mut high_q);
                let (wa, wb) = (op.apply4(pa, qa), op.apply4(pb, qb));
                _mm256_storeu_pd(oc.as_mut_ptr().add(8 * r), wa);
                _mm256_storeu_pd(oc.as_mut_ptr().add(8 * r + 4), wb);
                acc[2 * r] = _mm256_add_pd(acc[2 * r], wa);
                acc[2 * r + 1] = _mm256_add_pd(acc[2 * r + 1], wb);
            }
        }
        let body_ok = P::all_valid(high_p) & Q::all_valid(high_q);
        if p_tail.is_empty() {
            return (combine(acc), body_ok);
        }
        let mut lanes = spill(acc);
        let mut high_p = [P::Bits::default(); SUM_LANES];
        let mut high_q = [Q::Bits::default(); SUM_LANES];
        store_pair_tail::<O, P, Q>(
            op,
            &mut lanes,
            &mut high_p,
            &mut high_q,
            p_tail,
            q_tail,
            o_tail,
        );
        let ok = body_ok
            & high_p.iter().all(|&h| h <= P::LARGEST_FINITE)
            & high_q.iter().all(|&h| h <= Q::LARGEST_FINITE);
        (combine_lanes(lanes), ok)
    }
}

#[cfg(target_arch = "aarch64")]
pub(crate) use aarch64::Neon;

#[cfg(target_arch = "aarch64")]
mod aarch64 {
    use std::arch::aarch64::*;

    use super::{
        add_dense_tail, add_pair_tail, combine_lanes, store_pair_tail, update_pair_tail, Kernel,
        PairOp, SUM_LANES,
    };
    use crate::prob::Prob;

    /// The NEON kernels. NEON is part of the aarch64 baseline: no run-time
    /// check, every CPU of the target runs them.
    pub(crate) struct Neon;

    impl Kernel for Neon {
        #[inline(always)]
        fn dense<P: Prob>(p: &[P]) -> (f64, bool) {
            // SAFETY: NEON is always present on aarch64; the loads stay in `p`.
            unsafe { dense(p) }
        }
        #[inline(always)]
        fn pair<O: PairOp, P: Prob, Q: Prob>(op: O, p: &[P], q: &[Q]) -> (f64, bool) {
            // SAFETY: as above; `p` and `q` have equal lengths (checked shapes).
            unsafe { pair::<O, P, Q>(op, p, q) }
        }
        #[inline(always)]
        fn pair_store<O: PairOp, P: Prob, Q: Prob>(
            op: O,
            p: &[P],
            q: &[Q],
            out: &mut [f64],
        ) -> (f64, bool) {
            // SAFETY: as above; `out` is as long as `p` (asserted there).
            unsafe { pair_store::<O, P, Q>(op, p, q, out) }
        }
        #[inline(always)]
        fn pair_update<O: PairOp, Q: Prob>(op: O, w: &mut [f64], q: &[Q]) -> (f64, bool) {
            // SAFETY: as above; `q` is as long as `w` (asserted there).
            unsafe { pair_update::<O, Q>(op, w, q) }
        }
    }

    /// `f64x2` registers holding the lanes: register `r` holds lanes `2r, 2r + 1`.
    const REGS: usize = SUM_LANES / 2;

    /// The accumulators' lanes in order, for the scalar tail and [`combine_lanes`].
    #[inline(always)]
    unsafe fn spill(acc: [float64x2_t; REGS]) -> [f64; SUM_LANES] {
        let mut lanes = [0.0f64; SUM_LANES];
        for (r, reg) in acc.into_iter().enumerate() {
            vst1q_f64(lanes.as_mut_ptr().add(2 * r), reg);
        }
        lanes
    }

    /// [`Kernel::dense`]: each chunk of 16 is two loads of 8, each feeding
    /// four registers (lanes `8h .. 8h + 8`).
    #[inline(always)]
    unsafe fn dense<P: Prob>(p: &[P]) -> (f64, bool) {
        let mut acc = [vdupq_n_f64(0.0); REGS];
        let mut high = P::no_high();
        let (chunks, tail) = p.as_chunks::<SUM_LANES>();
        for c in chunks {
            for (h, eight) in c.as_chunks::<8>().0.iter().enumerate() {
                let v = P::load8(eight.as_ptr(), &mut high);
                for (k, x) in v.into_iter().enumerate() {
                    acc[4 * h + k] = vaddq_f64(acc[4 * h + k], x);
                }
            }
        }
        let body_ok = P::all_valid(high);
        let mut lanes = spill(acc);
        let mut high = [P::Bits::default(); SUM_LANES];
        add_dense_tail(&mut lanes, &mut high, tail);
        let ok = body_ok & high.iter().all(|&h| h <= P::LARGEST_FINITE);
        (combine_lanes(lanes), ok)
    }

    /// [`Kernel::pair`].
    #[inline(always)]
    unsafe fn pair<O: PairOp, P: Prob, Q: Prob>(op: O, p: &[P], q: &[Q]) -> (f64, bool) {
        let mut acc = [vdupq_n_f64(0.0); REGS];
        let (mut high_p, mut high_q) = (P::no_high(), Q::no_high());
        let (p_chunks, p_tail) = p.as_chunks::<SUM_LANES>();
        let (q_chunks, q_tail) = q.as_chunks::<SUM_LANES>();
        for (pc, qc) in p_chunks.iter().zip(q_chunks) {
            let eights = pc.as_chunks::<8>().0.iter().zip(qc.as_chunks::<8>().0);
            for (h, (p8, q8)) in eights.enumerate() {
                let pv = P::load8(p8.as_ptr(), &mut high_p);
                let qv = Q::load8(q8.as_ptr(), &mut high_q);
                for k in 0..4 {
                    acc[4 * h + k] = vaddq_f64(acc[4 * h + k], op.apply2(pv[k], qv[k]));
                }
            }
        }
        let body_ok = P::all_valid(high_p) & Q::all_valid(high_q);
        let mut lanes = spill(acc);
        let mut high_p = [P::Bits::default(); SUM_LANES];
        let mut high_q = [Q::Bits::default(); SUM_LANES];
        add_pair_tail::<O, P, Q>(op, &mut lanes, &mut high_p, &mut high_q, p_tail, q_tail);
        let ok = body_ok
            & high_p.iter().all(|&h| h <= P::LARGEST_FINITE)
            & high_q.iter().all(|&h| h <= Q::LARGEST_FINITE);
        (combine_lanes(lanes), ok)
    }

    /// [`Kernel::pair_update`]: each register of weights is loaded, combined
    /// with `q`, stored back and added.
    #[inline(always)]
    unsafe fn pair_update<O: PairOp, Q: Prob>(op: O, w: &mut [f64], q: &[Q]) -> (f64, bool) {
        assert!(q.len() == w.len());
        let mut acc = [vdupq_n_f64(0.0); REGS];
        let mut high_q = Q::no_high();
        let (w_chunks, w_tail) = w.as_chunks_mut::<SUM_LANES>();
        let (q_chunks, q_tail) = q.as_chunks::<SUM_LANES>();
        for (wc, qc) in w_chunks.iter_mut().zip(q_chunks) {
            for (h, q8) in qc.as_chunks::<8>().0.iter().enumerate() {
                let qv = Q::load8(q8.as_ptr(), &mut high_q);
                for (k, qk) in qv.into_iter().enumerate() {
                    let at = wc.as_mut_ptr().add(8 * h + 2 * k);
                    let n = op.apply2(vld1q_f64(at), qk);
                    vst1q_f64(at, n);
                    acc[4 * h + k] = vaddq_f64(acc[4 * h + k], n);
                }
            }
        }
        let body_ok = Q::all_valid(high_q);
        let mut lanes = spill(acc);
        let mut high_q = [Q::Bits::default(); SUM_LANES];
        update_pair_tail::<O, Q>(op, &mut lanes, &mut high_q, w_tail, q_tail);
        let ok = body_ok & high_q.iter().all(|&h| h <= Q::LARGEST_FINITE);
        (combine_lanes(lanes), ok)
    }

    /// [`Kernel::pair_store`].
    #[inline(always)]
    unsafe fn pair_store<O: PairOp, P: Prob, Q: Prob>(
        op: O,
        p: &[P],
        q: &[Q],
        out: &mut [f64],
    ) -> (f64, bool) {
        assert!(q.len() == p.len() && out.len() == p.len());
        let mut acc = [vdupq_n_f64(0.0); REGS];
        let (mut high_p, mut high_q) = (P::no_high(), Q::no_high());
        let (p_chunks, p_tail) = p.as_chunks::<SUM_LANES>();
        let (q_chunks, q_tail) = q.as_chunks::<SUM_LANES>();
        let (o_chunks, o_tail) = out.as_chunks_mut::<SUM_LANES>();
        for ((pc, qc), oc) in p_chunks.iter().zip(q_chunks).zip(o_chunks) {
            let eights = pc.as_chunks::<8>().0.iter().zip(qc.as_chunks::<8>().0);
            for (h, (p8, q8)) in eights.enumerate() {
                let pv = P::load8(p8.as_ptr(), &mut high_p);
                let qv = Q::load8(q8.as_ptr(), &mut high_q);
                for k in 0..4 {
                    let w = op.apply2(pv[k], qv[k]);
                    vst1q_f64(oc.as_mut_ptr().add(8 * h + 2 * k), w);
                    acc[4 * h + k] = vaddq_f64(acc[4 * h + k], w);
                }
            }
        }
        let body_ok = P::all_valid(high_p) & Q::all_valid(high_q);
        let mut lanes = spill(acc);
        let mut high_p = [P::Bits::default(); SUM_LANES];
        let mut high_q = [Q::Bits::default(); SUM_LANES];
        store_pair_tail::<O, P, Q>(
            op,
            &mut lanes,
            &mut high_p,
            &mut high_q,
            p_tail,
            q_tail,
            o_tail,
        );
        let ok = body_ok
            & high_p.iter().all(|&h| h <= P::LARGEST_FINITE)
            & high_q.iter().all(|&h| h <= Q::LARGEST_FINITE);
        (combine_lanes(lanes), ok)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `$body` once for each SIMD kernel this target and CPU run, with
    /// `$k` naming it: `Avx2` on x86-64 where the CPU has it, `Neon` on
    /// aarch64; nothing elsewhere. One test body covers both architectures.
    macro_rules! for_simd_kernels {
        ($k:ident => $body:expr) => {{
            #[cfg(target_arch = "x86_64")]
            if has_avx2() {
                type $k = Avx2;
                $body;
            }
            #[cfg(target_arch = "aarch64")]
            {
                type $k = Neon;
                $body;
            }
        }};
    }

    fn rows(len: usize, seed: u64) -> (Vec<f64>, Vec<f64>) {
        // A small LCG: varied magnitudes, exact zeros, equal pairs.
        let mut s = seed;
        let mut next = || {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (s >> 11) as f64 / (1u64 << 53) as f64
        };
        let p: Vec<f64> = (0..len)
            .map(|_| {
                let x = next();
                if x < 0.1 {
                    0.0
                } else {
                    x.powi(8)
                }
            })
            .collect();
        let q = p
            .iter()
            .map(|&v| if next() < 0.2 { v } else { next().powi(8) })
            .collect();
        (p, q)
    }

    /// The same sum bits (any NaN alike) and the same validity flag.
    fn assert_same(a: (f64, bool), b: (f64, bool), what: &str) {
        let same = a.0.to_bits() == b.0.to_bits() || (a.0.is_nan() && b.0.is_nan());
        assert!(same && a.1 == b.1, "{what}: {a:?} against {b:?}");
    }

    /// Every kernel of the target gives `Portable`'s sums and flags on `p`, `q`.
    fn check_same<P: Prob, Q: Prob>(p: &[P], q: &[Q]) {
        for_simd_kernels!(K => check_same_as::<K, P, Q>(p, q));
    }

    fn check_same_as<K: Kernel, P: Prob, Q: Prob>(p: &[P], q: &[Q]) {
        let len = p.len();
        assert_same(
            Portable::dense(p),
            K::dense(p),
            &format!("dense, len {len}"),
        );
        for (op, a, b) in [
            (
                "residual",
                Portable::pair(Residual, p, q),
                K::pair(Residual, p, q),
            ),
            (
                "overlap",
                Portable::pair(Overlap, p, q),
                K::pair(Overlap, p, q),
            ),
            (
                "scaled residual",
                Portable::pair(ScaledResidual(0.3), p, q),
                K::pair(ScaledResidual(0.3), p, q),
            ),
        ] {
            assert_same(a, b, &format!("{op}, len {len}"));
        }
        // `pair_ahead`: the same sum; its flag covers `q`, and may leave `p` (a
        // round's buffer, never checked) out: true where both rows are surely
        // valid, false where `q` is not.
        let want = Portable::pair(ScaledResidual(0.3), p, q);
        let got = K::pair_ahead(ScaledResidual(0.3), p, q);
        let what = format!("scaled residual, q asked for ahead, len {len}");
        assert_same((want.0, true), (got.0, true), &what);
        let q_ok = Portable::dense(q).1;
        assert!(
            if want.1 { got.1 } else { !got.1 || q_ok },
            "{what}: {want:?} against {got:?}"
        );
    }

    /// `pair_store` writes `op(p_i, q_i)` and sums them as `pair` does, on
    /// every kernel of the target.
    fn check_store<O: PairOp, P: Prob, Q: Prob>(op: O, p: &[P], q: &[Q]) {
        check_store_as::<Portable, O, P, Q>(op, p, q);
        for_simd_kernels!(K => check_store_as::<K, O, P, Q>(op, p, q));
    }

    fn check_store_as<K: Kernel, O: PairOp, P: Prob, Q: Prob>(op: O, p: &[P], q: &[Q]) {
        let want: Vec<u64> = p
            .iter()
            .zip(q)
            .map(|(a, b)| op.apply(a.to_f64(), b.to_f64()).to_bits())
            .collect();
        let sum = Portable::pair(op, p, q);
        let mut out = vec![f64::NAN; p.len()];
        let got = K::pair_store(op, p, q, &mut out);
        assert_same(got, sum, &format!("len {}", p.len()));
        let bits: Vec<u64> = out.iter().map(|v| v.to_bits()).collect();
        assert_eq!(bits, want, "len {}", p.len());
    }

    /// `pair_update` on `w`: the values and sum `pair_store` writes from
    /// `p = w`, and only `q` checked: a bad value anywhere in it (vector body
    /// or tail) clears the flag.
    fn check_update_as<K: Kernel>(p: &[f64], q: &[f32]) {
        let len = p.len();
        for op in [ScaledResidual(1.0), ScaledResidual(0.3 / 0.7)] {
            let mut want = vec![0.0; len];
            let sum = Portable::pair_store(op, p, q, &mut want);
            let mut w = p.to_vec();
            assert_same(K::pair_update(op, &mut w, q), sum, &format!("len {len}"));
            let (w, want): (Vec<u64>, Vec<u64>) = (
                w.iter().map(|v| v.to_bits()).collect(),
                want.iter().map(|v| v.to_bits()).collect(),
            );
            assert_eq!(w, want, "len {len}");
        }
        for at in 0..len {
            for bad in [f32::NAN, -1.0, f32::INFINITY, -0.0] {
                let mut q_bad = q.to_vec();
                q_bad[at] = bad;
                let mut w = p.to_vec();
                assert!(
                    K::pair_update(ScaledResidual(0.5), &mut w, q).1,
                    "len {len}"
                );
                let mut w = p.to_vec();
                let got = K::pair_update(ScaledResidual(0.5), &mut w, &q_bad);
                let mut w = p.to_vec();
                let want = Portable::pair_update(ScaledResidual(0.5), &mut w, &q_bad);
                assert!(!got.1, "{bad} at {at} of {len}");
                assert_same(got, want, &format!("{bad} at {at} of {len}"));
            }
        }
    }

    #[test]
    fn pair_store_writes_and_sums_as_pair() {
        for (len, seed) in (0..70)
            .map(|n| (n, n as u64 + 7))
            .chain([(1000, 5), (1100, 6)])
        {
            let (p, q) = rows(len, seed);
            let q32: Vec<f32> = q.iter().map(|&v| v as f32).collect();
            let p16: Vec<half::bf16> = p.iter().map(|&v| half::bf16::from_f64(v)).collect();
            for op in [
                ScaledResidual(1.0),
                ScaledResidual(0.3 / 0.7),
                ScaledResidual(0.0),
            ] {
                check_store(op, &p, &q);
                check_store(op, &p, &q32);
                check_store(op, &p16, &q32);
            }
            check_store(Residual, &p, &q32);
            check_store(Overlap, &p16, &q);
            // In place: the same values and sums as writing elsewhere, and
            // only the draft row checked.
            check_update_as::<Portable>(&p, &q32);
            for_simd_kernels!(K => check_update_as::<K>(&p, &q32));
            // The scale 1 is the residual, bit for bit.
            let mut a = vec![0.0; len];
            let mut b = vec![0.0; len];
            let one = ScaledResidual(1.0);
            assert_eq!(
                Portable::pair_store(one, &p, &q32, &mut a).0.to_bits(),
                Portable::pair_store(Residual, &p, &q32, &mut b).0.to_bits()
            );
            assert_eq!(a, b);
        }
    }

    #[test]
    fn simd_kernels_compute_the_portable_bits() {
        for (len, seed) in (0..70)
            .map(|n| (n, n as u64))
            .chain([(256, 1), (1000, 2), (1100, 3)])
        {
            let (p, q) = rows(len, seed);
            check_same(&p, &q);
            let (p32, q32): (Vec<f32>, Vec<f32>) = (
                p.iter().map(|&v| v as f32).collect(),
                q.iter().map(|&v| v as f32).collect(),
            );
            check_same(&p32, &q32);
            check_same(&p32, &q);
            let p16: Vec<half::f16> = p.iter().map(|&v| half::f16::from_f64(v)).collect();
            check_same(&p16, &q32);
            check_same(&q, &p16);
            let pb16: Vec<half::bf16> = p.iter().map(|&v| half::bf16::from_f64(v)).collect();
            check_same(&pb16, &q32);
            check_same(&p16, &pb16);
            // One bad or doubtful value anywhere, body or tail, must be flagged.
            for bad in [f64::NAN, -1e-30, f64::INFINITY, -0.0] {
                for at in [0, len / 2, len.saturating_sub(1)] {
                    if len == 0 {
                        continue;
                    }
                    let mut pb = p.clone();
                    pb[at] = bad;
                    check_same(&pb, &q);
                    check_same(&q, &pb);
                    assert!(!Portable::dense(&pb).1, "{bad} at {at} of {len}");
                    let pb32: Vec<f32> = pb.iter().map(|&v| v as f32).collect();
                    check_same(&pb32, &q32);
                    assert!(!Portable::pair(Residual, &q32, &pb32).1);
                    let pb16: Vec<half::f16> = pb.iter().map(|&v| half::f16::from_f64(v)).collect();
                    check_same(&pb16, &p16);
                    assert!(!Portable::dense(&pb16).1);
                    let pbb: Vec<half::bf16> =
                        pb.iter().map(|&v| half::bf16::from_f64(v)).collect();
                    check_same(&pbb, &q32);
                    check_same(&p16, &pbb);
                    assert!(!Portable::dense(&pbb).1);
                }
            }
        }
    }

    /// The differences `Residual` and `Overlap` must round as the portable
    /// ones do: `+0.0` for `p - q = -0.0` or `+0.0`, `min` of equal zeros of
    /// either sign, ties, and (from bad input) NaN and infinities, in each
    /// lane of a register (position `at` in a row of `SUM_LANES`).
    #[test]
    fn simd_pair_ops_keep_the_portable_bits_at_zeros_and_ties() {
        let specials = [
            0.0,
            -0.0,
            1.0,
            -1.0,
            0.5,
            f64::MIN_POSITIVE,
            5e-324,
            f64::MAX,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
        ];
        for &a in &specials {
            for &b in &specials {
                for at in 0..SUM_LANES {
                    let (mut p, mut q) = ([0.0f64; SUM_LANES], [0.0f64; SUM_LANES]);
                    (p[at], q[at]) = (a, b);
                    check_store(Residual, &p, &q);
                    check_store(ScaledResidual(0.75), &p, &q);
                    check_store(Overlap, &p, &q);
                    check_same(&p, &q);
                }
            }
        }
    }

    /// Every 16-bit pattern through the target's SIMD and the portable
    /// kernels: each value summed alone (the others zero) in a row of exactly
    /// `SUM_LANES` elements, so it goes through the vector body (`load8`),
    /// never the scalar tail; the pattern's position cycles over every lane,
    /// so both loads of a chunk and every register of each load are used.
    /// Same sum, same validity.
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    fn every_16_bit_pattern<K: Kernel, P: Prob>(from_bits: fn(u16) -> P, zero: P) {
        for bits in 0..=u16::MAX {
            let mut row = [zero; SUM_LANES];
            row[usize::from(bits) % SUM_LANES] = from_bits(bits);
            assert_same(
                Portable::dense(&row),
                K::dense(&row),
                &format!("dense {bits:#06x}"),
            );
            // Each operand of a pair kernel: max(0, x - 0) and max(0, 0 - x).
            let zeros = [zero; SUM_LANES];
            for (p, q) in [(&row, &zeros), (&zeros, &row)] {
                let what = format!("pair {bits:#06x}");
                assert_same(
                    Portable::pair(Residual, p, q),
                    K::pair(Residual, p, q),
                    &what,
                );
            }
        }
        // The float32 loads of the screens (`load8_ps`): each lane exact.
        let all: Vec<P> = (0..=u16::MAX).map(from_bits).collect();
        check_load8_ps(&all);
    }

    /// `load8_ps` of each 8 elements of `row` gives `x as f32` in each lane.
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    fn check_load8_ps<P: Prob>(row: &[P]) {
        for (n, eight) in row.chunks_exact(8).enumerate() {
            let got = load8_ps(eight);
            for (i, (&g, &x)) in got.iter().zip(eight).enumerate() {
                let want = x.to_f64() as f32;
                let same = g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan());
                assert!(same, "load8_ps at {}: {g:e} for {want:e}", n * 8 + i);
            }
        }
    }

    /// `load8_ps` of f32 (exact) and f64 (rounded as `as f32`: ties, f32
    /// subnormals, overflow to infinity) rows, every lane.
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    #[test]
    fn simd_float32_loads_of_f32_and_f64_rows() {
        #[cfg(target_arch = "x86_64")]
        if !has_avx2() {
            return;
        }
        let (p, q) = rows(1024, 11);
        let specials = [
            0.0,
            -0.0,
            1.0 + f64::EPSILON,
            1.0 + 2f64.powi(-24),
            1.0 + 3.0 * 2f64.powi(-24),
            1e-40,
            1e-46,
            f64::MAX,
            -f64::MAX,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
            -1e300,
            3.0e38,
            f64::MIN_POSITIVE,
            0.1,
        ];
        let row: Vec<f64> = p
            .iter()
            .zip(&q)
            .map(|(&a, &b)| a * 1e6 - b * 3e5)
            .chain(specials.iter().cycle().take(8 * specials.len()).copied())
            .chain(specials.iter().rev().copied())
            .collect();
        check_load8_ps(&row);
        let row32: Vec<f32> = row.iter().map(|&v| v as f32).collect();
        check_load8_ps(&row32);
    }

    /// `P::load8_ps` of the first 8 elements of `eight`, stored.
    #[cfg(target_arch = "x86_64")]
    fn load8_ps<P: Prob>(eight: &[P]) -> [f32; 8] {
        assert!(eight.len() >= 8);
        let mut got = [0.0f32; 8];
        // SAFETY: 8 readable elements; the callers checked `has_avx2()`;
        // `got` holds 8 f32.
        unsafe {
            let v = P::load8_ps(eight.as_ptr());
            std::arch::x86_64::_mm256_storeu_ps(got.as_mut_ptr(), v);
        }
        got
    }

    /// `P::load8_ps` of the first 8 elements of `eight`, stored.
    #[cfg(target_arch = "aarch64")]
    fn load8_ps<P: Prob>(eight: &[P]) -> [f32; 8] {
        assert!(eight.len() >= 8);
        let mut got = [0.0f32; 8];
        // SAFETY: 8 readable elements; NEON is always present; `got` holds 8 f32.
        unsafe {
            let [a, b] = P::load8_ps(eight.as_ptr());
            std::arch::aarch64::vst1q_f32(got.as_mut_ptr(), a);
            std::arch::aarch64::vst1q_f32(got.as_mut_ptr().add(4), b);
        }
        got
    }

    #[test]
    fn simd_f16_loads_convert_every_bit_pattern_exactly() {
        for_simd_kernels!(K => every_16_bit_pattern::<K, _>(half::f16::from_bits, half::f16::ZERO));
    }

    #[test]
    fn simd_bf16_loads_convert_every_bit_pattern_exactly() {
        for_simd_kernels!(K => every_16_bit_pattern::<K, _>(half::bf16::from_bits, half::bf16::ZERO));
    }
}
