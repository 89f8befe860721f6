//! Matrix products and small vector kernels.

use std::any::TypeId;

use ndarray::linalg::general_mat_mul;
use ndarray::{s, ArrayView2, ArrayViewMut2, LinalgScalar};

use crate::bf16::TableElem;

/// `c = alpha * a b + beta * c` through `matrixmultiply` (see the docs of the `solve` module).
///
/// The shared axis of `a` and `b` is traversed backwards: the product is the same, but
/// the negative strides make ndarray skip its BLAS path (which only takes positive
/// strides) for `matrixmultiply`, which accepts any stride. The order of summation is
/// fixed by the shapes, so the result is deterministic.
pub(super) fn gemm<T: LinalgScalar>(
    alpha: T,
    a: ArrayView2<'_, T>,
    b: ArrayView2<'_, T>,
    beta: T,
    c: &mut ArrayViewMut2<'_, T>,
) {
    let a = a.slice_move(s![.., ..;-1]);
    let b = b.slice_move(s![..;-1, ..]);
    general_mat_mul(alpha, &a, &b, beta, c);
}

/// A row-major `rows x cols` view of the front of `v` (`v.len() >= rows * cols`).
pub(super) fn view2<T>(v: &[T], rows: usize, cols: usize) -> ArrayView2<'_, T> {
    ArrayView2::from_shape((rows, cols), &v[..rows * cols])
        .expect("invariant: a contiguous prefix of the right length")
}

/// `s` as `&[f32]` when `T` is `f32` (the fast path that reads the table in place).
#[inline(always)]
pub(super) fn as_f32<T: TableElem>(s: &[T]) -> Option<&[f32]> {
    if TypeId::of::<T>() == TypeId::of::<f32>() {
        // SAFETY: T is f32, so the slice is a slice of f32 of the same length.
        Some(unsafe { std::slice::from_raw_parts(s.as_ptr().cast::<f32>(), s.len()) })
    } else {
        None
    }
}

/// Widen one row of the fixed table into `dst` (exact).
#[inline(always)]
pub(super) fn widen_row<T: TableElem>(src: &[T], dst: &mut [f32]) {
    for (o, &v) in dst.iter_mut().zip(src) {
        *o = v.to_f32();
    }
}

/// Width of the independent accumulators of the f32 dot products.
const LANES: usize = 16;
/// Items per group of the observed-term kernel: their dot products run interleaved and
/// `out` is loaded and stored once per group. Every element still sees the operations
/// of one item after the other, so the grouping does not change the result.
const GROUP: usize = 4;
/// How many items ahead the indexed kernel prefetches.
pub(super) const PREFETCH_AHEAD: usize = 8;

#[inline(always)]
pub(super) fn madd<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

/// Fixed reduction tree over the lanes.
#[inline(always)]
fn reduce_lanes(mut acc: [f32; LANES]) -> f32 {
    let mut w = LANES;
    while w > 1 {
        w /= 2;
        let (lo, hi) = acc.split_at_mut(w);
        for (l, h) in lo.iter_mut().zip(hi.iter()) {
            *l += *h;
        }
    }
    acc[0]
}

/// f32 dot products of `N` rows with `v`: `LANES` independent accumulators per row, a
/// fixed reduction tree, then the scalar tail. The same arithmetic for every `N`.
#[inline(always)]
fn dot_rows<const FMA: bool, const N: usize>(hs: [&[f32]; N], v: &[f32]) -> [f32; N] {
    let mut acc = [[0.0f32; LANES]; N];
    let full = v.len() / LANES * LANES;
    for c in (0..full).step_by(LANES) {
        let vc = &v[c..c + LANES];
        for (a, h) in acc.iter_mut().zip(&hs) {
            for ((s, &hv), &vv) in a.iter_mut().zip(&h[c..c + LANES]).zip(vc) {
                *s = madd::<FMA>(hv, vv, *s);
            }
        }
    }
    let mut out = [0.0f32; N];
    for ((o, a), h) in out.iter_mut().zip(acc).zip(&hs) {
        let mut tail = 0.0f32;
        for (&hv, &vv) in h[full..].iter().zip(&v[full..]) {
            tail = madd::<FMA>(hv, vv, tail);
        }
        *o = reduce_lanes(a) + tail;
    }
    out
}

/// The item vectors of one row: gathered into a contiguous block, or rows of `fixed`.
pub(super) trait Items {
    fn len(&self) -> usize;
    fn row(&self, k: usize) -> &[f32];
    fn prefetch(&self, k: usize);
}

pub(super) struct Gathered<'a> {
    pub(super) buf: &'a [f32],
    pub(super) d: usize,
}

impl Items for Gathered<'_> {
    #[inline(always)]
    fn len(&self) -> usize {
        self.buf.len() / self.d
    }
    #[inline(always)]
    fn row(&self, k: usize) -> &[f32] {
        &self.buf[k * self.d..][..self.d]
    }
    #[inline(always)]
    fn prefetch(&self, _k: usize) {}
}

pub(super) struct Indexed<'a> {
    pub(super) idx: &'a [u32],
    pub(super) fixed: &'a [f32],
    pub(super) d: usize,
}

impl Items for Indexed<'_> {
    #[inline(always)]
    fn len(&self) -> usize {
        self.idx.len()
    }
    #[inline(always)]
    fn row(&self, k: usize) -> &[f32] {
        &self.fixed[self.idx[k] as usize * self.d..][..self.d]
    }
    #[inline(always)]
    fn prefetch(&self, k: usize) {
        if let Some(&i) = self.idx.get(k) {
            if let Some(h) = self
                .fixed
                .get(i as usize * self.d..(i as usize + 1) * self.d)
            {
                prefetch_rows(h);
            }
        }
    }
}

/// Hint the cache lines of `h` into L1 (no effect on results).
#[inline(always)]
pub(super) fn prefetch_rows<T>(h: &[T]) {
    #[cfg(target_arch = "x86_64")]
    for line in h.chunks((64 / std::mem::size_of::<T>().max(1)).max(1)) {
        // SAFETY: a prefetch is only a hint; it never faults and `line` is a live slice.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                line.as_ptr().cast::<i8>(),
            )
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = h;
}

/// The observed term: `out += sum_k h_k * (c + s * (h_k . v))`, items in order, each
/// term times its confidence `w[k]` when `w` is given (`w_k * (c + s * (h_k . v))`, in
/// f32; `None` is the unweighted arithmetic, bit for bit).
/// `(c, s) = (0, 1)` gives `sum_k h_k (h_k . v)`; `(1, -1)` gives `sum_k h_k (1 - h_k . v)`.
#[inline(always)]
pub(super) fn observed_body<const FMA: bool>(
    items: &impl Items,
    v: &[f32],
    out: &mut [f32],
    w: Option<&[f32]>,
    c: f32,
    s: f32,
) {
    let n = items.len();
    let mut k = 0;
    while k + GROUP <= n {
        for a in 0..GROUP {
            items.prefetch(k + PREFETCH_AHEAD + a);
        }
        let hs = [
            items.row(k),
            items.row(k + 1),
            items.row(k + 2),
            items.row(k + 3),
        ];
        let mut t = dot_rows::<FMA, GROUP>(hs, v).map(|dt| c + s * dt);
        if let Some(w) = w {
            for (a, ta) in t.iter_mut().enumerate() {
                *ta *= w[k + a];
            }
        }
        for ((((o, &h0), &h1), &h2), &h3) in
            out.iter_mut().zip(hs[0]).zip(hs[1]).zip(hs[2]).zip(hs[3])
        {
            let mut acc = madd::<FMA>(t[0], h0, *o);
            acc = madd::<FMA>(t[1], h1, acc);
            acc = madd::<FMA>(t[2], h2, acc);
            *o = madd::<FMA>(t[3], h3, acc);
        }
        k += GROUP;
    }
    while k < n {
        let h = items.row(k);
        let [dt] = dot_rows::<FMA, 1>([h], v);
        let t = match w {
            None => c + s * dt,
            Some(w) => w[k] * (c + s * dt),
        };
        for (o, &hv) in out.iter_mut().zip(h) {
            *o = madd::<FMA>(t, hv, *o);
        }
        k += 1;
    }
}

/// Which compiled variant of the observed-term kernel to run (detected once per call).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Isa {
    Plain,
    #[cfg(target_arch = "x86_64")]
    Avx2Fma,
    /// The same arithmetic as `Avx2Fma` (every kernel's result is defined element by
    /// element, not by vector width), compiled with AVX-512 enabled: twice the lanes
    /// per instruction for the f64 dot products and the widening of bf16 rows.
    #[cfg(target_arch = "x86_64")]
    Avx512Fma,
}

impl Isa {
    /// Detected once per process (`TORUSREC_NO_AVX512` is read then).
    pub(super) fn detect() -> Isa {
        static ISA: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
        *ISA.get_or_init(Isa::probe)
    }

    fn probe() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            let avx2 =
                std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma");
            if avx2
                && std::is_x86_feature_detected!("avx512f")
                && std::is_x86_feature_detected!("avx512bw")
                && std::is_x86_feature_detected!("avx512vl")
                && std::env::var_os("TORUSREC_NO_AVX512").is_none()
            {
                return Isa::Avx512Fma;
            }
            if avx2 {
                return Isa::Avx2Fma;
            }
        }
        Isa::Plain
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn observed_fma(
    items: &impl Items,
    v: &[f32],
    out: &mut [f32],
    w: Option<&[f32]>,
    c: f32,
    s: f32,
) {
    observed_body::<true>(items, v, out, w, c, s)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
#[allow(clippy::incompatible_msrv)]
unsafe fn observed_avx512(
    items: &impl Items,
    v: &[f32],
    out: &mut [f32],
    w: Option<&[f32]>,
    c: f32,
    s: f32,
) {
    observed_body::<true>(items, v, out, w, c, s)
}

/// [`observed_body`] compiled for the detected instruction set.
pub(super) fn observed(
    isa: Isa,
    items: &impl Items,
    v: &[f32],
    out: &mut [f32],
    w: Option<&[f32]>,
    c: f32,
    s: f32,
) {
    match isa {
        // SAFETY: `Isa::Avx2Fma` is only constructed after detecting avx2 and fma.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2Fma => unsafe { observed_fma(items, v, out, w, c, s) },
        // SAFETY: `Isa::Avx512Fma` is only constructed after detecting its features.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512Fma => unsafe { observed_avx512(items, v, out, w, c, s) },
        Isa::Plain => observed_body::<false>(items, v, out, w, c, s),
    }
}

/// Dot product of an f32 vector and a table row, accumulated in f64 (8 accumulators,
/// fixed order; the row is widened exactly).
///
/// Accumulator `l` sums the products of the elements `l, l + 8, l + 16, ...` in order;
/// the accumulators are combined as `((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7))`
/// and the tail (the elements past the last multiple of 8, summed in order) added last.
/// The product of two f32 values is exact in f64, so a fused multiply-add gives the
/// same bits as a multiply and an add: the AVX2 kernel ([`dot64_avx2`]) returns the
/// bits of the plain one.
#[inline(always)]
pub(super) fn dot64<T: TableElem>(a: &[f32], b: &[T]) -> f64 {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
        // SAFETY: avx2 and fma were detected.
        return unsafe { dot64_avx2(a, b) };
    }
    dot64_plain(a, b)
}

/// [`dot64`] in plain Rust (the reference the vector kernel is tested against).
#[inline(always)]
pub(super) fn dot64_plain<T: TableElem>(a: &[f32], b: &[T]) -> f64 {
    let mut acc = [0.0f64; 8];
    let ca = a.chunks_exact(8);
    let cb = b.chunks_exact(8);
    let mut tail = 0.0f64;
    for (x, y) in ca.remainder().iter().zip(cb.remainder()) {
        tail += f64::from(*x) * f64::from(y.to_f32());
    }
    for (x, y) in ca.zip(cb) {
        for ((s, &xv), &yv) in acc.iter_mut().zip(x).zip(y) {
            *s += f64::from(xv) * f64::from(yv.to_f32());
        }
    }
    ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7])) + tail
}

/// [`dot64`] with AVX2: accumulators 0-3 in one register and 4-7 in another, eight
/// elements (f32 or bf16, widened exactly) per step.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn dot64_avx2<T: TableElem>(a: &[f32], b: &[T]) -> f64 {
    debug_assert_eq!(a.len(), b.len());
    use std::arch::x86_64::*;
    let n = a.len().min(b.len());
    let full = n / 8 * 8;
    let is_f32 = TypeId::of::<T>() == TypeId::of::<f32>();
    let is_bf16 = TypeId::of::<T>() == TypeId::of::<crate::bf16::Bf16>();
    if !(is_f32 || is_bf16) {
        return dot64_plain(a, b);
    }
    let (mut lo, mut hi) = (_mm256_setzero_pd(), _mm256_setzero_pd());
    let ap = a.as_ptr();
    for c in (0..full).step_by(8) {
        let x = _mm256_loadu_ps(ap.add(c));
        let y = if is_f32 {
            _mm256_loadu_ps(b.as_ptr().cast::<f32>().add(c))
        } else {
            // bf16 -> f32: the 16 bits become the top half of the f32 (exact).
            let h = _mm_loadu_si128(b.as_ptr().cast::<u16>().add(c).cast::<__m128i>());
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
        };
        lo = _mm256_fmadd_pd(
            _mm256_cvtps_pd(_mm256_castps256_ps128(x)),
            _mm256_cvtps_pd(_mm256_castps256_ps128(y)),
            lo,
        );
        hi = _mm256_fmadd_pd(
            _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(x)),
            _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(y)),
            hi,
        );
    }
    let mut tail = 0.0f64;
    for (x, y) in a[full..n].iter().zip(&b[full..n]) {
        tail += f64::from(*x) * f64::from(y.to_f32());
    }
    // s[l] = acc[l] + acc[l + 4]
    let mut s = [0.0f64; 4];
    _mm256_storeu_pd(s.as_mut_ptr(), _mm256_add_pd(lo, hi));
    ((s[0] + s[2]) + (s[1] + s[3])) + tail
}
