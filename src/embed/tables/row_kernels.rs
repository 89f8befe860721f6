//! The embedding hot paths: pooling a bag of rows, adding one gradient to the rows
//! of a bag, and row-wise Adagrad's row statistics.
//!
//! Each kernel has a scalar reference ([`pool_ref`], [`scatter_ref`],
//! [`sq_sums_into`](crate::embed::tables::store::sq_sums_into)) and an AVX2 body chosen at
//! run time. Both do the same arithmetic in the same order per element (a sum from
//! +0.0 over the bag's rows in bag order; a row's squares in column order), so they
//! give the same bits; the SIMD body keeps up to 64 columns of the sum in registers
//! across the bag, loads each row once and prefetches the next one.

use crate::bf16::{Bf16, EmbDtype, F16};

/// The rows of a bag: `idx[k]` is a row of `base` (`map` absent), or `map[idx[k]]` is.
#[derive(Clone, Copy, Debug)]
pub struct Bag<'a> {
    pub idx: &'a [u32],
    pub map: Option<&'a [u32]>,
}

impl Bag<'_> {
    #[inline(always)]
    fn row(&self, k: usize) -> usize {
        let i = self.idx[k] as usize;
        match self.map {
            Some(m) => m[i] as usize,
            None => i,
        }
    }
}

/// The instruction set the kernels run with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// Made only by [`Isa::detect`] on a CPU with AVX2 ([`Detected`] cannot be built
    /// elsewhere), so the safe kernels below may run AVX2 code on it.
    Avx2(Detected),
    Plain,
}

/// Proof that the CPU was checked for the instruction set (a private field).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Detected(());

impl Isa {
    pub fn detect() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            static AVX2: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
            if *AVX2.get_or_init(|| std::is_x86_feature_detected!("avx2")) {
                return Isa::Avx2(Detected(()));
            }
        }
        Isa::Plain
    }
}

/// `out = sum over k of base[row(k)]` (rows of `w` floats), each element summed from
/// +0.0 in bag order. Scalar reference.
pub fn pool_ref(base: &[f32], w: usize, bag: Bag, out: &mut [f32]) {
    out[..w].fill(0.0);
    for k in 0..bag.idx.len() {
        let r = bag.row(k);
        for (o, &v) in out[..w].iter_mut().zip(&base[r * w..(r + 1) * w]) {
            *o += v;
        }
    }
}

/// [`pool_ref`], fast: the same bits.
#[inline]
pub fn pool(isa: Isa, base: &[f32], w: usize, bag: Bag, out: &mut [f32]) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Avx2` is only made after detecting avx2.
        Isa::Avx2(_) if w.is_multiple_of(8) => unsafe { avx2::pool(base, w, bag, out) },
        _ => pool_ref(base, w, bag, out),
    }
}

/// `acc[row(k)] += g` for every row of the bag, in bag order. Scalar reference.
pub fn scatter_ref(g: &[f32], w: usize, bag: Bag, acc: &mut [f32]) {
    for k in 0..bag.idx.len() {
        let r = bag.row(k);
        for (a, &v) in acc[r * w..(r + 1) * w].iter_mut().zip(&g[..w]) {
            *a += v;
        }
    }
}

/// [`scatter_ref`], fast: the same bits.
#[inline]
pub fn scatter(isa: Isa, g: &[f32], w: usize, bag: Bag, acc: &mut [f32]) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Avx2` is only made after detecting avx2.
        Isa::Avx2(_) if w.is_multiple_of(8) && w <= 64 => unsafe { avx2::scatter(g, w, bag, acc) },
        _ => scatter_ref(g, w, bag, acc),
    }
}

/// Bags of many examples: example `e` is `idx[offsets[e]..offsets[e + 1]]`, each
/// index a row of `base` (or of `map`, as in [`Bag`]).
#[derive(Clone, Copy, Debug)]
pub struct Bags<'a> {
    pub offsets: &'a [u32],
    pub idx: &'a [u32],
    pub map: Option<&'a [u32]>,
}

impl<'a> Bags<'a> {
    pub fn len(&self) -> usize {
        self.offsets.len().saturating_sub(1)
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    #[inline(always)]
    pub fn bag(&self, e: usize) -> Bag<'a> {
        Bag {
            idx: &self.idx[self.offsets[e] as usize..self.offsets[e + 1] as usize],
            map: self.map,
        }
    }
    #[inline(always)]
    fn row_at(&self, k: usize) -> usize {
        let i = self.idx[k] as usize;
        match self.map {
            Some(m) => m[i] as usize,
            None => i,
        }
    }
}

/// Rows ahead (occurrences, across example boundaries) that the pooling and
/// scattering loops prefetch into L1 (the dedup index's look-ahead is measured
/// apart).
pub const PREFETCH_AHEAD: usize = 16;

/// Rows ahead that a pass over distinct, scattered rows (the owners' update, the
/// rows mode's gather) prefetches into L2; [`DISTINCT_AHEAD`] ahead it prefetches
/// into L1. Every such row misses the caches, and L1 has too few fill buffers to keep
/// enough of them in flight: the L2 requests raise the misses in flight, the short L1
/// distance only hides L2's latency. On the torchrec-peer workload at 1x1 (SGD) the
/// update took 8.6-9.8 ms per step against 10.4-11.5 ms with L1 prefetches 16 rows
/// ahead alone (five alternating runs each); 24 or 48 rows ahead for L2, or 2 or 8
/// for L1, were no better.
pub const DISTINCT_AHEAD_L2: usize = 32;

/// See [`DISTINCT_AHEAD_L2`].
pub const DISTINCT_AHEAD: usize = 4;

/// Occurrences ahead that [`pool_bags`] prefetches into L2 besides (more misses in
/// flight than L1's fill buffers allow: with it the lookup went 25 -> 22 ms per step
/// at 2x1 on that workload).
pub const PREFETCH_AHEAD_L2: usize = 48;

/// [`pool`] for every example of `bags` into `out` (`bags.len() x w`), prefetching
/// the rows of the next occurrences whatever example they belong to. The same bits
/// as [`pool_ref`] per example.
pub fn pool_bags(isa: Isa, base: &[f32], w: usize, bags: Bags, out: &mut [f32]) {
    assert!(out.len() >= bags.len() * w);
    #[cfg(target_arch = "x86_64")]
    if matches!(isa, Isa::Avx2(_)) && w.is_multiple_of(8) && (8..=64).contains(&w) {
        // SAFETY: `Isa::Avx2` is only made after detecting avx2; the width is
        // checked; every index is checked inside.
        unsafe { avx2::pool_bags(base, w, bags, out) };
        return;
    }
    for (e, o) in out.chunks_exact_mut(w.max(1)).take(bags.len()).enumerate() {
        prefetch_ahead(isa, base, w, bags, e);
        pool(isa, base, w, bags.bag(e), o);
    }
}

/// [`pool_bags`] over a bf16 or f16 table (`base` holds its bit patterns): each
/// value widened to f32 (exactly) and summed from +0.0 in bag order, as
/// [`pool_ref`] sums an f32 table's, so a table of the same values pools to the same
/// bits at either width.
pub fn pool_bags_half(dtype: EmbDtype, base: &[u16], w: usize, bags: Bags, out: &mut [f32]) {
    assert!(out.len() >= bags.len() * w);
    match dtype {
        EmbDtype::F16 => pool_bags_with(base, w, bags, out, |b| F16(b).to_f32()),
        _ => pool_bags_with(base, w, bags, out, |b| Bf16(b).to_f32()),
    }
}

#[inline(always)]
fn pool_bags_with(base: &[u16], w: usize, bags: Bags, out: &mut [f32], widen: impl Fn(u16) -> f32) {
    for (e, o) in out.chunks_exact_mut(w.max(1)).take(bags.len()).enumerate() {
        o[..w].fill(0.0);
        let bag = bags.bag(e);
        for k in 0..bag.idx.len() {
            let r = bag.row(k);
            for (o, &v) in o[..w].iter_mut().zip(&base[r * w..(r + 1) * w]) {
                *o += widen(v);
            }
        }
    }
}

/// [`scatter`] of `g`'s row `e` (`bags.len() x w`) to the rows of bag `e`, for every
/// example in order, prefetching ahead. The same bits as [`scatter_ref`] per example.
pub fn scatter_bags(isa: Isa, g: &[f32], w: usize, bags: Bags, acc: &mut [f32]) {
    assert!(g.len() >= bags.len() * w);
    for e in 0..bags.len() {
        prefetch_ahead(isa, acc, w, bags, e);
        scatter(isa, &g[e * w..(e + 1) * w], w, bags.bag(e), acc);
    }
}

/// [`scatter_bags`] into sums that start empty, without zero filling them first: a
/// row's first gradient is placed as `0.0 + g` (the bits [`scatter_bags`] gives on
/// zeros), later ones added. It needs the bags' rows to appear first in the order
/// 0, 1, 2, ... (rows numbered in first-seen order, as a deduplicated request has
/// them); on return `acc` holds one sum per row seen. Returns `false`, `acc`
/// unspecified, when a row appears before a lower one has (the caller falls back to
/// [`scatter_bags`] on zeros).
pub fn scatter_bags_fresh(isa: Isa, g: &[f32], w: usize, bags: Bags, acc: &mut Vec<f32>) -> bool {
    assert!(g.len() >= bags.len() * w);
    acc.clear();
    if w == 0 {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    if matches!(isa, Isa::Avx2(_)) && w.is_multiple_of(8) && (8..=64).contains(&w) {
        // SAFETY: `Isa::Avx2` is only made after detecting avx2; the width is
        // checked; every index is checked inside.
        return unsafe { avx2::scatter_bags_fresh(g, w, bags, acc) };
    }
    let _ = isa;
    for e in 0..bags.len() {
        let ge = &g[e * w..(e + 1) * w];
        for k in bags.offsets[e] as usize..bags.offsets[e + 1] as usize {
            let (r, n) = (bags.row_at(k), acc.len() / w);
            if r == n {
                acc.extend(ge.iter().map(|&x| 0.0 + x));
            } else if r < n {
                for (a, &v) in acc[r * w..(r + 1) * w].iter_mut().zip(ge) {
                    *a += v;
                }
            } else {
                return false;
            }
        }
    }
    true
}

/// The sum of the squares of every row of `g` (`w` floats each), in f64 and in column
/// order per row, appended to `out`: row-wise Adagrad's row statistics. The bits of
/// the scalar reference [`sq_sums_into`](crate::embed::tables::store::sq_sums_into); the
/// AVX2 body keeps one f64 lane per row (16 rows at a time, each still one chain of
/// additions in column order) and turns each 8 x 8 block of the rows into columns
/// with shuffles.
pub fn sq_sums(isa: Isa, g: &[f32], w: usize, out: &mut Vec<f64>) {
    #[cfg(target_arch = "x86_64")]
    if matches!(isa, Isa::Avx2(_)) && w > 0 && w.is_multiple_of(8) {
        let rows = g.len() / w;
        let done = rows - rows % 8;
        let mut block = [0.0f64; 16];
        let mut r = 0;
        while r < done {
            let n = if r + 16 <= done { 16 } else { 8 };
            let (rg, rb) = (&g[r * w..(r + n) * w], &mut block[..n]);
            // SAFETY: `Isa::Avx2` is only made after detecting avx2; `rg` holds
            // `n` rows of `w` floats and `rb` their `n` slots.
            unsafe {
                if n == 16 {
                    avx2::sq_sums_rows::<2>(rg, w, rb);
                } else {
                    avx2::sq_sums_rows::<1>(rg, w, rb);
                }
            }
            out.extend_from_slice(rb);
            r += n;
        }
        crate::embed::tables::store::sq_sums_into(&g[done * w..], w, out);
        return;
    }
    let _ = isa;
    crate::embed::tables::store::sq_sums_into(g, w, out);
}

/// Prefetch the rows of the occurrences [`PREFETCH_AHEAD`] past those of example `e`
/// (whatever example they belong to), if the CPU has the instruction.
#[inline(always)]
fn prefetch_ahead(isa: Isa, base: &[f32], w: usize, bags: Bags, e: usize) {
    let (k0, k1) = (bags.offsets[e] as usize, bags.offsets[e + 1] as usize);
    for k in k0 + PREFETCH_AHEAD..(k1 + PREFETCH_AHEAD).min(bags.idx.len()) {
        prefetch_row(isa, base, w, bags.row_at(k));
    }
}

/// The prefetches for position `k` of a pass over the distinct rows `rows` of `base`
/// (`w` floats each): row `rows[k + DISTINCT_AHEAD_L2]` into L2 and row
/// `rows[k + DISTINCT_AHEAD]` into L1, if the CPU has the instruction. Rows past
/// `base`'s end are skipped (the pass itself checks them).
#[inline(always)]
pub fn prefetch_distinct_ahead<T>(isa: Isa, base: &[T], w: usize, rows: &[u32], k: usize) {
    #[cfg(target_arch = "x86_64")]
    if matches!(isa, Isa::Avx2(_)) {
        if let Some(&r) = rows.get(k + DISTINCT_AHEAD_L2) {
            if (r as usize + 1) * w <= base.len() {
                // SAFETY: the prefetch reads nothing; the row is inside `base`.
                unsafe { avx2::prefetch_l2(base, w, r as usize) };
            }
        }
    }
    if let Some(&r) = rows.get(k + DISTINCT_AHEAD) {
        prefetch_row(isa, base, w, r as usize);
    }
}

/// Prefetch row `r` (`w` floats) of `base` if the CPU has the instruction.
#[inline(always)]
pub fn prefetch_row<T>(isa: Isa, base: &[T], w: usize, r: usize) {
    #[cfg(target_arch = "x86_64")]
    if matches!(isa, Isa::Avx2(_)) && (r + 1) * w <= base.len() {
        // SAFETY: the prefetch reads nothing; the row is inside `base`.
        unsafe { avx2::prefetch(base, w, r) };
    }
    let _ = (isa, base, w, r);
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{Bag, Bags};
    use std::arch::x86_64::*;

    /// `f::<N>(args)` for a row width `w` of `8 * N` floats, N in 1..=8 (the callers
    /// check the width).
    macro_rules! by_width {
        ($w:expr, $f:ident($($a:expr),*)) => {
            match $w {
                8 => $f::<1>($($a),*),
                16 => $f::<2>($($a),*),
                24 => $f::<3>($($a),*),
                32 => $f::<4>($($a),*),
                40 => $f::<5>($($a),*),
                48 => $f::<6>($($a),*),
                56 => $f::<7>($($a),*),
                64 => $f::<8>($($a),*),
                w => unreachable!("width {w} is not 8..=64 in steps of 8"),
            }
        };
    }

    /// Prefetch the cache lines of row `r` (`w` floats) of `base` (a hint: it reads
    /// nothing, so any `r` is sound).
    #[inline(always)]
    pub(super) unsafe fn prefetch<T>(base: &[T], w: usize, r: usize) {
        // Wrapping: a row past `base` (a bad id, caught by the pass itself) is
        // only an address to hint, never one to form with `add`.
        let p = base.as_ptr().wrapping_add(r * w).cast::<i8>();
        let mut off = 0;
        while off < w * std::mem::size_of::<T>() {
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(off));
            off += 64;
        }
    }

    /// Columns `c0..c0 + 8 * N` of the pooled sum, kept in `N` registers.
    #[inline(always)]
    unsafe fn pool_cols<const N: usize>(
        base: &[f32],
        w: usize,
        bag: Bag,
        c0: usize,
        out: &mut [f32],
    ) {
        let n = bag.idx.len();
        let mut acc = [_mm256_setzero_ps(); N];
        for k in 0..n {
            let r = bag.row(k);
            if k + 1 < n && c0 == 0 {
                prefetch(base, w, bag.row(k + 1));
            }
            let row = &base[r * w + c0..r * w + c0 + 8 * N];
            for (j, a) in acc.iter_mut().enumerate() {
                *a = _mm256_add_ps(*a, _mm256_loadu_ps(row.as_ptr().add(8 * j)));
            }
        }
        for (j, a) in acc.iter().enumerate() {
            _mm256_storeu_ps(out.as_mut_ptr().add(c0 + 8 * j), *a);
        }
    }

    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn pool(base: &[f32], w: usize, bag: Bag, out: &mut [f32]) {
        assert!(out.len() >= w && w.is_multiple_of(8));
        let mut c0 = 0;
        while c0 + 64 <= w {
            pool_cols::<8>(base, w, bag, c0, out);
            c0 += 64;
        }
        while c0 + 32 <= w {
            pool_cols::<4>(base, w, bag, c0, out);
            c0 += 32;
        }
        while c0 < w {
            pool_cols::<1>(base, w, bag, c0, out);
            c0 += 8;
        }
    }

    /// Prefetch the cache lines of row `r` (`w` floats) of `base` into L2.
    #[inline(always)]
    pub(super) unsafe fn prefetch_l2<T>(base: &[T], w: usize, r: usize) {
        // Wrapping: a row past `base` (a bad id, caught by the pass itself) is
        // only an address to hint, never one to form with `add`.
        let p = base.as_ptr().wrapping_add(r * w).cast::<i8>();
        let mut off = 0;
        while off < w * std::mem::size_of::<T>() {
            _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(off));
            off += 64;
        }
    }

    /// [`super::pool_bags`] for widths of 8..=64 (multiples of 8): example after
    /// example, the sum in `N` registers; the rows [`super::PREFETCH_AHEAD_L2`] and
    /// [`super::PREFETCH_AHEAD`] occurrences ahead (whatever example they belong to)
    /// prefetched into L2 and L1.
    #[inline(always)]
    unsafe fn pool_bags_n<const N: usize>(base: &[f32], bags: Bags, out: &mut [f32]) {
        let w = 8 * N;
        let total = bags.idx.len();
        for e in 0..bags.len() {
            let (k0, k1) = (bags.offsets[e] as usize, bags.offsets[e + 1] as usize);
            let mut acc = [_mm256_setzero_ps(); N];
            for k in k0..k1 {
                if k + super::PREFETCH_AHEAD_L2 < total {
                    let ahead = bags.row_at(k + super::PREFETCH_AHEAD_L2);
                    if (ahead + 1) * w <= base.len() {
                        prefetch_l2(base, w, ahead);
                    }
                }
                if k + super::PREFETCH_AHEAD < total {
                    let ahead = bags.row_at(k + super::PREFETCH_AHEAD);
                    if (ahead + 1) * w <= base.len() {
                        prefetch(base, w, ahead);
                    }
                }
                let r = bags.row_at(k);
                let row = &base[r * w..r * w + w];
                for (j, a) in acc.iter_mut().enumerate() {
                    *a = _mm256_add_ps(*a, _mm256_loadu_ps(row.as_ptr().add(8 * j)));
                }
            }
            let o = &mut out[e * w..e * w + w];
            for (j, a) in acc.iter().enumerate() {
                _mm256_storeu_ps(o.as_mut_ptr().add(8 * j), *a);
            }
        }
    }

    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn pool_bags(base: &[f32], w: usize, bags: Bags, out: &mut [f32]) {
        by_width!(w, pool_bags_n(base, bags, out))
    }

    /// [`super::scatter_bags_fresh`] for widths of 8..=64 (multiples of 8).
    #[inline(always)]
    unsafe fn scatter_bags_fresh_n<const N: usize>(
        g: &[f32],
        bags: Bags,
        acc: &mut Vec<f32>,
    ) -> bool {
        let w = 8 * N;
        let zero = _mm256_setzero_ps();
        for e in 0..bags.len() {
            let ge = &g[e * w..e * w + w];
            let mut gv = [zero; N];
            for (j, v) in gv.iter_mut().enumerate() {
                *v = _mm256_loadu_ps(ge.as_ptr().add(8 * j));
            }
            for k in bags.offsets[e] as usize..bags.offsets[e + 1] as usize {
                let (r, n) = (bags.row_at(k), acc.len() / w);
                if r == n {
                    let mut first = [0.0f32; 64];
                    for (j, v) in gv.iter().enumerate() {
                        _mm256_storeu_ps(first.as_mut_ptr().add(8 * j), _mm256_add_ps(zero, *v));
                    }
                    acc.extend_from_slice(&first[..w]);
                } else if r < n {
                    let dst = &mut acc[r * w..r * w + w];
                    for (j, v) in gv.iter().enumerate() {
                        let p = dst.as_mut_ptr().add(8 * j);
                        _mm256_storeu_ps(p, _mm256_add_ps(_mm256_loadu_ps(p), *v));
                    }
                } else {
                    return false;
                }
            }
        }
        true
    }

    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn scatter_bags_fresh(
        g: &[f32],
        w: usize,
        bags: Bags,
        acc: &mut Vec<f32>,
    ) -> bool {
        by_width!(w, scatter_bags_fresh_n(g, bags, acc))
    }

    /// The square sums of `8 * G` rows of `w` floats (`g`, `w` a multiple of 8) into
    /// `out`: lane `i` of accumulator pair `k` is row `8 k + i`, summed from +0.0 in
    /// column order, each square exact in f64 (the scalar reference's bits).
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn sq_sums_rows<const G: usize>(g: &[f32], w: usize, out: &mut [f64]) {
        debug_assert!(g.len() == 8 * G * w && out.len() == 8 * G && w.is_multiple_of(8));
        let p = g.as_ptr();
        let mut acc = [[_mm256_setzero_pd(); 2]; G];
        let mut c = 0;
        while c < w {
            for (k, a) in acc.iter_mut().enumerate() {
                let row = |i: usize| _mm256_loadu_ps(p.add((8 * k + i) * w + c));
                let (r0, r1, r2, r3) = (row(0), row(1), row(2), row(3));
                let (r4, r5, r6, r7) = (row(4), row(5), row(6), row(7));
                // Per 128-bit half: t0 = r0[0] r1[0] r0[1] r1[1], ...
                let (t0, t1) = (_mm256_unpacklo_ps(r0, r1), _mm256_unpackhi_ps(r0, r1));
                let (t2, t3) = (_mm256_unpacklo_ps(r2, r3), _mm256_unpackhi_ps(r2, r3));
                let (t4, t5) = (_mm256_unpacklo_ps(r4, r5), _mm256_unpackhi_ps(r4, r5));
                let (t6, t7) = (_mm256_unpacklo_ps(r6, r7), _mm256_unpackhi_ps(r6, r7));
                // lo[j]: column j (low half) and j + 4 (high half) of rows 0..4;
                // hi[j]: the same of rows 4..8.
                let lo = [
                    _mm256_shuffle_ps::<0x44>(t0, t2),
                    _mm256_shuffle_ps::<0xEE>(t0, t2),
                    _mm256_shuffle_ps::<0x44>(t1, t3),
                    _mm256_shuffle_ps::<0xEE>(t1, t3),
                ];
                let hi = [
                    _mm256_shuffle_ps::<0x44>(t4, t6),
                    _mm256_shuffle_ps::<0xEE>(t4, t6),
                    _mm256_shuffle_ps::<0x44>(t5, t7),
                    _mm256_shuffle_ps::<0xEE>(t5, t7),
                ];
                let mut add = |x: __m128, y: __m128| {
                    let (x, y) = (_mm256_cvtps_pd(x), _mm256_cvtps_pd(y));
                    a[0] = _mm256_add_pd(a[0], _mm256_mul_pd(x, x));
                    a[1] = _mm256_add_pd(a[1], _mm256_mul_pd(y, y));
                };
                for j in 0..4 {
                    add(_mm256_castps256_ps128(lo[j]), _mm256_castps256_ps128(hi[j]));
                }
                for j in 0..4 {
                    add(
                        _mm256_extractf128_ps::<1>(lo[j]),
                        _mm256_extractf128_ps::<1>(hi[j]),
                    );
                }
            }
            c += 8;
        }
        for (k, a) in acc.iter().enumerate() {
            _mm256_storeu_pd(out.as_mut_ptr().add(8 * k), a[0]);
            _mm256_storeu_pd(out.as_mut_ptr().add(8 * k + 4), a[1]);
        }
    }

    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn scatter(g: &[f32], w: usize, bag: Bag, acc: &mut [f32]) {
        assert!(g.len() >= w && w.is_multiple_of(8) && w <= 64);
        let mut gv = [_mm256_setzero_ps(); 8];
        for (j, v) in gv.iter_mut().enumerate().take(w / 8) {
            *v = _mm256_loadu_ps(g.as_ptr().add(8 * j));
        }
        for k in 0..bag.idx.len() {
            let r = bag.row(k);
            let dst = &mut acc[r * w..(r + 1) * w];
            for (j, v) in gv.iter().enumerate().take(w / 8) {
                let p = dst.as_mut_ptr().add(8 * j);
                _mm256_storeu_ps(p, _mm256_add_ps(_mm256_loadu_ps(p), *v));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SplitMix64;

    fn data(n: usize, seed: u64) -> Vec<f32> {
        let mut r = SplitMix64::new(seed);
        (0..n).map(|_| (r.next_f64() as f32 - 0.5) * 3.0).collect()
    }

    #[test]
    fn pool_and_scatter_give_the_reference_bits_at_every_width() {
        let isa = Isa::detect();
        let mut r = SplitMix64::new(7);
        for &w in &[8usize, 16, 24, 40, 64, 72, 128, 136, 3, 13] {
            let rows = 50;
            let base = data(rows * w, w as u64);
            for len in [0usize, 1, 2, 15, 40] {
                let idx: Vec<u32> = (0..len).map(|_| (r.next_u64() % 20) as u32).collect();
                let map: Vec<u32> = (0..20).map(|i| (i * 7 % rows) as u32).collect();
                for m in [None, Some(&map[..])] {
                    let bag = Bag { idx: &idx, map: m };
                    let (mut a, mut b) = (vec![9.0f32; w], vec![-9.0f32; w]);
                    pool_ref(&base, w, bag, &mut a);
                    pool(isa, &base, w, bag, &mut b);
                    assert_eq!(
                        a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        b.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        "pool w={w} len={len}"
                    );
                    let g = data(w, 99 + len as u64);
                    let mut a = data(rows * w, 5);
                    let mut b = a.clone();
                    scatter_ref(&g, w, bag, &mut a);
                    scatter(isa, &g, w, bag, &mut b);
                    assert_eq!(
                        a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        b.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        "scatter w={w} len={len}"
                    );
                }
            }
        }
        // Many bags at once (prefetching across examples): the same bits.
        for &w in &[8usize, 16, 24, 32, 40, 48, 56, 64, 13, 72] {
            let rows = 40;
            let base = data(rows * w, 3 + w as u64);
            let lens = [3usize, 0, 15, 1, 40, 7];
            let mut offsets = vec![0u32];
            let mut idx = Vec::new();
            for &l in &lens {
                idx.extend((0..l).map(|_| (r.next_u64() % rows as u64) as u32));
                offsets.push(idx.len() as u32);
            }
            let bags = Bags {
                offsets: &offsets,
                idx: &idx,
                map: None,
            };
            let mut a = vec![0.0f32; lens.len() * w];
            let mut b = vec![1.0f32; lens.len() * w];
            for e in 0..lens.len() {
                pool_ref(&base, w, bags.bag(e), &mut a[e * w..(e + 1) * w]);
            }
            pool_bags(isa, &base, w, bags, &mut b);
            assert_eq!(a, b, "pool_bags w={w}");
            // Through a map (the owners' distinct rows), as the pooled mode calls it.
            let map: Vec<u32> = (0..rows as u32).rev().collect();
            let mapped = Bags {
                map: Some(&map),
                ..bags
            };
            for e in 0..lens.len() {
                pool_ref(&base, w, mapped.bag(e), &mut a[e * w..(e + 1) * w]);
            }
            pool_bags(isa, &base, w, mapped, &mut b);
            assert_eq!(a, b, "pool_bags w={w} mapped");
            let g = data(lens.len() * w, 11);
            let mut a = data(rows * w, 12);
            let mut b = a.clone();
            for e in 0..lens.len() {
                scatter_ref(&g[e * w..(e + 1) * w], w, bags.bag(e), &mut a);
            }
            scatter_bags(isa, &g, w, bags, &mut b);
            assert_eq!(a, b, "scatter_bags w={w}");
        }
        // Sums that start empty: the bits of scatter_bags on zeros when rows first
        // appear in order 0, 1, 2, ...; refused otherwise.
        for &w in &[8usize, 16, 24, 32, 40, 48, 56, 64, 13, 72] {
            let lens = [3usize, 0, 15, 1, 40, 7];
            let mut offsets = vec![0u32];
            let mut idx = Vec::new();
            let mut seen = 0u32;
            for &l in &lens {
                for _ in 0..l {
                    // A new row (the next number) or one seen before.
                    let i = if seen == 0 || r.next_u64().is_multiple_of(3) {
                        seen += 1;
                        seen - 1
                    } else {
                        (r.next_u64() % seen as u64) as u32
                    };
                    idx.push(i);
                }
                offsets.push(idx.len() as u32);
            }
            let bags = Bags {
                offsets: &offsets,
                idx: &idx,
                map: None,
            };
            let g: Vec<f32> = data(lens.len() * w, 21)
                .into_iter()
                .enumerate()
                .map(|(i, v)| if i % 5 == 0 { -0.0 } else { v })
                .collect();
            let mut want = vec![0.0f32; seen as usize * w];
            scatter_bags(isa, &g, w, bags, &mut want);
            for isa in [isa, Isa::Plain] {
                let mut got = vec![5.0f32; 3];
                assert!(scatter_bags_fresh(isa, &g, w, bags, &mut got), "w={w}");
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "scatter_bags_fresh w={w} {isa:?}");
                // Row 1 before row 0: refused.
                let bad_idx = [1u32, 0];
                let bad = Bags {
                    offsets: &[0, 2],
                    idx: &bad_idx,
                    map: None,
                };
                assert!(!scatter_bags_fresh(isa, &g[..w], w, bad, &mut got));
            }
        }
        // The distinct-row prefetches read nothing and skip rows past the end (an
        // owner prefetches before it checks a request's rows).
        for &w in &[0usize, 8, 13, 64] {
            let base = data(10 * w, 31);
            let keep = base.clone();
            let rows = [3u32, 9, 10, u32::MAX, 0, 7];
            let far: Vec<u32> = (0..DISTINCT_AHEAD_L2 as u32 + 4).rev().collect();
            for k in 0..far.len() + 2 {
                prefetch_distinct_ahead(isa, &base, w, &rows, k);
                prefetch_distinct_ahead(isa, &base, w, &far, k);
            }
            assert_eq!(base, keep, "w={w}");
        }
        // Row square sums: the reference's bits at every width and row count (the
        // SIMD body's 16- and 8-row blocks and the scalar tail), appended.
        for &w in &[8usize, 16, 24, 64, 72, 13, 1] {
            for rows in [0usize, 1, 7, 8, 9, 16, 17, 24, 40, 41] {
                let g: Vec<f32> = data(rows * w, 40 + w as u64)
                    .into_iter()
                    .enumerate()
                    // Magnitudes 2^-20..2^20: squares 80 binades apart, so the
                    // f64 sums round and their order shows in the bits.
                    .map(|(i, v)| v * 2f32.powi((i * 7919 % 41) as i32 - 20))
                    .collect();
                let mut want = vec![-1.0f64];
                crate::embed::tables::store::sq_sums_into(&g, w, &mut want);
                for isa in [isa, Isa::Plain] {
                    let mut got = vec![-1.0f64];
                    sq_sums(isa, &g, w, &mut got);
                    let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&got), bits(&want), "sq_sums w={w} rows={rows} {isa:?}");
                }
            }
        }
        // The reference itself: a sum from zero, in bag order.
        let base = [1.0f32, 2.0, 10.0, 20.0, 100.0, 200.0];
        let mut out = [0.0f32; 2];
        pool_ref(
            &base,
            2,
            Bag {
                idx: &[2, 0, 2],
                map: None,
            },
            &mut out,
        );
        assert_eq!(out, [201.0, 402.0]);
    }
}
