//! Numeric kernels of one iALS half-epoch (ALX / Rendle): the Gramian of the fixed
//! table, the batched conjugate-gradient solve, the exact Cholesky solve, and the pieces
//! of the exact loss.
//!
//! Solving the rows `u` of one side against the fixed other side `H` (`n_other x d`):
//!
//! ```text
//! A_u = sum_{i in I_u} h_i h_i^T + alpha0 * G + lambda * (|I_u| + alpha0 * n_other) * I
//! b_u = sum_{i in I_u} h_i,        w_u = A_u^{-1} b_u,        G = H^T H
//! ```
//!
//! Everything here is local: no I/O, no communication. Parallelism is rayon over a
//! work partition that depends only on the input (never on the thread count), and every
//! floating-point sum has a fixed order, so results are bitwise independent of the
//! number of rayon threads.
//!
//! The fixed table (the other side, read through `&[T]` with `T:` [`TableElem`]) may be
//! stored in f32 or bf16: every kernel widens its rows to f32 as it reads them (exact)
//! and computes in f32/f64 exactly as for an f32 table, so a bf16 table gives bitwise the
//! result of the f32 kernel on the widened table, reading half the bytes.
//!
//! The Gramian term of the CG matvec (`alpha0 * P G`, the dominant cost at d = 128) is a
//! register-blocked kernel of this module ([`gram_term_body`]) whose per-element summation
//! order is fixed (k = 0..d in order), so each row's result does not depend on the
//! batch it is in. The Cholesky `A_u` products go through [`gemm`], which routes them to
//! the pure-Rust `matrixmultiply` kernels (single-threaded, fixed summation order)
//! rather than to OpenBLAS: this crate enables ndarray's `blas` feature (through
//! ndarray-linalg), so a plain `general_mat_mul` on contiguous f32/f64 arrays would call
//! `cblas_sgemm`, whose own thread pool would fight rayon's unless
//! `OPENBLAS_NUM_THREADS=1` is set. [`cholesky_solve`] calls LAPACK (`potrf`/`potrs` of
//! ndarray-linalg) and [`gramian`] calls `cblas_dsyrk`, both kept single-threaded.

use std::any::TypeId;
use std::ops::Range;

use ndarray::linalg::general_mat_mul;
use ndarray::{s, Array1, Array2, ArrayView2, ArrayViewMut2, LinalgScalar, ShapeBuilder};
use ndarray_linalg::{FactorizeCInto, SolveC, UPLO};
use rayon::prelude::*;

use crate::bf16::TableElem;

/// Hyper-parameters of one half-epoch's solve.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SolveParams {
    /// `lambda`, the regularization weight (`--reg`).
    pub reg: f32,
    /// `alpha0`, the weight of the unobserved (all-pairs) term (`--unobserved-weight`).
    pub alpha0: f32,
    /// The number of rows of the full fixed table (all ranks), `n_other` in `A_u`.
    pub n_other: f64,
}

/// The rows to solve, in CSR over *local* indices into the fixed table.
///
/// `indptr.len()` is the number of rows + 1. The view may be a window of a bigger CSR:
/// `indptr[0]` may be nonzero, and row `r` is `indices[indptr[r]..indptr[r + 1]]`
/// (absolute positions into `indices`).
#[derive(Debug, Clone, Copy)]
pub struct RowsView<'a> {
    pub indptr: &'a [u64],
    pub indices: &'a [u32],
}

impl RowsView<'_> {
    /// The number of rows (`indptr.len() - 1`, or 0 for an empty `indptr`).
    pub fn num_rows(&self) -> usize {
        self.indptr.len().saturating_sub(1)
    }

    /// Positions of row `r` in `indices`, checked against the CSR invariants.
    fn try_range(&self, r: usize) -> Result<Range<usize>, String> {
        let (a, b) = (self.indptr[r], self.indptr[r + 1]);
        if b < a {
            return Err(format!("indptr decreases ({a} then {b})"));
        }
        let (a, b) = match (usize::try_from(a), usize::try_from(b)) {
            (Ok(a), Ok(b)) if b <= self.indices.len() => (a, b),
            _ => {
                return Err(format!(
                    "indptr {b} is past the end of indices (length {})",
                    self.indices.len()
                ))
            }
        };
        Ok(a..b)
    }

    /// Positions of row `r`; only after [`RowsView::validate`] succeeded.
    #[inline]
    fn range(&self, r: usize) -> Range<usize> {
        self.indptr[r] as usize..self.indptr[r + 1] as usize
    }

    /// Checks the CSR invariants and that every index is below `n_fixed`.
    /// Returns the first bad row and what is wrong with it.
    fn validate(&self, n_fixed: usize) -> Result<(), (usize, String)> {
        for r in 0..self.num_rows() {
            let range = self.try_range(r).map_err(|m| (r, m))?;
            check_indices(&self.indices[range], n_fixed).map_err(|m| (r, m))?;
        }
        Ok(())
    }
}

fn check_indices(idx: &[u32], n_fixed: usize) -> Result<(), String> {
    match idx.iter().find(|&&i| i as usize >= n_fixed) {
        Some(i) => Err(format!(
            "index {i} out of range of the fixed table ({n_fixed} rows)"
        )),
        None => Ok(()),
    }
}

/// An error of [`cholesky_solve`], naming the failing row (local index).
#[derive(Debug, thiserror::Error)]
pub enum SolveError {
    #[error("row {row}: {msg}")]
    Row { row: usize, msg: String },
}

impl SolveError {
    fn row(&self) -> usize {
        match self {
            SolveError::Row { row, .. } => *row,
        }
    }
}

// ---------------------------------------------------------------------------------------
// Matrix products and small vector kernels.

/// `c = alpha * a b + beta * c` through `matrixmultiply` (see the module docs).
///
/// The shared axis of `a` and `b` is traversed backwards: the product is the same, but
/// the negative strides make ndarray skip its BLAS path (which only takes positive
/// strides) for `matrixmultiply`, which accepts any stride. The order of summation is
/// fixed by the shapes, so the result is deterministic.
fn gemm<T: LinalgScalar>(
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
fn view2<T>(v: &[T], rows: usize, cols: usize) -> ArrayView2<'_, T> {
    ArrayView2::from_shape((rows, cols), &v[..rows * cols])
        .expect("invariant: a contiguous prefix of the right length")
}

/// A mutable row-major `rows x cols` view of the front of `v`.
#[cfg(test)]
fn view2_mut<T>(v: &mut [T], rows: usize, cols: usize) -> ArrayViewMut2<'_, T> {
    ArrayViewMut2::from_shape((rows, cols), &mut v[..rows * cols])
        .expect("invariant: a contiguous prefix of the right length")
}

/// `s` as `&[f32]` when `T` is `f32` (the fast path that reads the table in place).
#[inline(always)]
fn as_f32<T: TableElem>(s: &[T]) -> Option<&[f32]> {
    if TypeId::of::<T>() == TypeId::of::<f32>() {
        // SAFETY: T is f32, so the slice is a slice of f32 of the same length.
        Some(unsafe { std::slice::from_raw_parts(s.as_ptr().cast::<f32>(), s.len()) })
    } else {
        None
    }
}

/// Widen one row of the fixed table into `dst` (exact).
#[inline(always)]
fn widen_row<T: TableElem>(src: &[T], dst: &mut [f32]) {
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
const PREFETCH_AHEAD: usize = 8;

#[inline(always)]
fn madd<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
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
trait Items {
    fn len(&self) -> usize;
    fn row(&self, k: usize) -> &[f32];
    fn prefetch(&self, k: usize);
}

struct Gathered<'a> {
    buf: &'a [f32],
    d: usize,
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

struct Indexed<'a> {
    idx: &'a [u32],
    fixed: &'a [f32],
    d: usize,
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
fn prefetch_rows<T>(h: &[T]) {
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

/// The observed term: `out += sum_k h_k * (c + s * (h_k . v))`, items in order.
/// `(c, s) = (0, 1)` gives `sum_k h_k (h_k . v)`; `(1, -1)` gives `sum_k h_k (1 - h_k . v)`.
#[inline(always)]
fn observed_body<const FMA: bool>(items: &impl Items, v: &[f32], out: &mut [f32], c: f32, s: f32) {
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
        let t = dot_rows::<FMA, GROUP>(hs, v).map(|dt| c + s * dt);
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
        let t = c + s * dt;
        for (o, &hv) in out.iter_mut().zip(h) {
            *o = madd::<FMA>(t, hv, *o);
        }
        k += 1;
    }
}

/// Which compiled variant of the observed-term kernel to run (detected once per call).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Isa {
    Plain,
    #[cfg(target_arch = "x86_64")]
    Avx2Fma,
}

impl Isa {
    fn detect() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
                return Isa::Avx2Fma;
            }
        }
        Isa::Plain
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn observed_fma(items: &impl Items, v: &[f32], out: &mut [f32], c: f32, s: f32) {
    observed_body::<true>(items, v, out, c, s)
}

/// [`observed_body`] compiled for the detected instruction set.
fn observed(isa: Isa, items: &impl Items, v: &[f32], out: &mut [f32], c: f32, s: f32) {
    match isa {
        // SAFETY: `Isa::Avx2Fma` is only constructed after detecting avx2 and fma.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2Fma => unsafe { observed_fma(items, v, out, c, s) },
        Isa::Plain => observed_body::<false>(items, v, out, c, s),
    }
}

/// Dot product of an f32 vector and a table row, accumulated in f64 (8 accumulators,
/// fixed order; the row is widened exactly).
#[inline(always)]
fn dot64<T: TableElem>(a: &[f32], b: &[T]) -> f64 {
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

// ---------------------------------------------------------------------------------------
// Gramian.

/// Rows per block of the Gramian (the unit of work and of the fixed summation order).
const GRAM_BLOCK: usize = 4096;
/// Blocks computed in parallel before their partial sums are added (bounds memory).
const GRAM_WAVE: usize = 16;

/// Gramian `T^T T` of a row-major table (`n x d`, f32 or bf16): `d * d`, row-major,
/// exactly symmetric.
///
/// Blocks of [`GRAM_BLOCK`] rows are converted to f64 and multiplied with f64 gemm,
/// in parallel; the block sums are added in block order, so the result does not
/// depend on the thread count. Panics if `table.len()` is not a multiple of `d`.
pub fn gramian<T: TableElem>(table: &[T], d: usize) -> Vec<f64> {
    crate::blas_single_thread();
    if d == 0 {
        assert!(table.is_empty(), "gramian: d = 0 with a non-empty table");
        return Vec::new();
    }
    assert_eq!(
        table.len() % d,
        0,
        "gramian: table length is not a multiple of d"
    );
    let mut g = vec![0.0f64; d * d];
    let blocks: Vec<&[T]> = table.chunks(GRAM_BLOCK * d).collect();
    let mut parts = vec![0.0f64; GRAM_WAVE.min(blocks.len()) * d * d];
    for wave in blocks.chunks(GRAM_WAVE) {
        let parts = &mut parts[..wave.len() * d * d];
        parts
            .par_chunks_mut(d * d)
            .zip(wave.par_iter())
            .for_each_init(Vec::new, |buf, (out, block)| {
                block_gramian(block, d, buf, out)
            });
        for part in parts.chunks_exact(d * d) {
            for (a, b) in g.iter_mut().zip(part) {
                *a += *b;
            }
        }
    }
    // Exact symmetry: mirror the upper triangle.
    for k in 0..d {
        for l in 0..k {
            g[k * d + l] = g[l * d + k];
        }
    }
    g
}

/// `out = B^T B` (f64) for one block `B` of rows, through an f64 copy in `buf`.
fn block_gramian<T: TableElem>(block: &[T], d: usize, buf: &mut Vec<f64>, out: &mut [f64]) {
    let nb = block.len() / d;
    buf.clear();
    buf.extend(block.iter().map(|&v| f64::from(v.to_f32())));
    if nb == 0 {
        out.fill(0.0);
        return;
    }
    // Symmetric rank-k update: half the flops of a general product. OpenBLAS is kept
    // single-threaded (crate::blas_single_thread), so the result is deterministic.
    let (n, k) = (d as c_int, nb as c_int);
    // SAFETY: `buf` holds nb x d row-major f64 (lda = d) and `out` d x d (ldc = d), as
    // cblas_dsyrk reads and writes them.
    unsafe {
        cblas_dsyrk(
            CBLAS_ROW_MAJOR,
            CBLAS_UPPER,
            CBLAS_TRANS,
            n,
            k,
            1.0,
            buf.as_ptr(),
            n,
            0.0,
            out.as_mut_ptr(),
            n,
        );
    }
    for i in 0..d {
        for j in 0..i {
            out[i * d + j] = out[j * d + i];
        }
    }
}

use std::os::raw::c_int;
const CBLAS_ROW_MAJOR: c_int = 101;
const CBLAS_UPPER: c_int = 121;
const CBLAS_TRANS: c_int = 112;
extern "C" {
    fn cblas_dsyrk(
        order: c_int,
        uplo: c_int,
        trans: c_int,
        n: c_int,
        k: c_int,
        alpha: f64,
        a: *const f64,
        lda: c_int,
        beta: f64,
        c: *mut f64,
        ldc: c_int,
    );
}

/// Reference Gramian: a naive triple loop in f64.
pub fn gramian_ref<T: TableElem>(table: &[T], d: usize) -> Vec<f64> {
    let mut g = vec![0.0f64; d * d];
    if d == 0 {
        return g;
    }
    for row in table.chunks_exact(d) {
        for k in 0..d {
            for l in 0..d {
                g[k * d + l] += f64::from(row[k].to_f32()) * f64::from(row[l].to_f32());
            }
        }
    }
    g
}

// ---------------------------------------------------------------------------------------
// Conjugate gradient.

/// How the rows are cut into batches (fixed by the input alone).
#[derive(Debug, Clone, Copy)]
struct Plan {
    /// Most rows in one batch (the `B` of the `[B x d] x [d x d]` Gramian product).
    batch_rows: usize,
    /// Most floats of item vectors gathered for one batch; a row with more items than
    /// fit is a batch on its own and reads the fixed table in place.
    gather_floats: usize,
}

const CG_PLAN: Plan = Plan {
    batch_rows: 128,
    gather_floats: 1 << 17,
};

/// The plan of the solves: [`CG_PLAN`], or its gather budget from
/// `TORUSREC_CG_GATHER_KB` (for experiments; results are the same, only speed changes).
fn cg_plan() -> Plan {
    static PLAN: std::sync::OnceLock<Plan> = std::sync::OnceLock::new();
    *PLAN.get_or_init(|| {
        match std::env::var("TORUSREC_CG_GATHER_KB")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
        {
            Some(kb) => Plan {
                gather_floats: (kb * 256).max(1),
                ..CG_PLAN
            },
            None => CG_PLAN,
        }
    })
}

/// A batch: rows `r0..r1`; `gathered` if its item vectors are copied into scratch.
#[derive(Debug, Clone, Copy)]
struct Batch {
    r0: usize,
    r1: usize,
    gathered: bool,
}

/// Cuts the rows into batches. A row longer than the gather budget, or a hub row (more
/// than `hub_chunk` items), forms a batch of its own.
fn plan_batches(rows: &RowsView, d: usize, hub_chunk: usize, plan: Plan) -> Vec<Batch> {
    let cap_items = (plan.gather_floats / d.max(1)).max(1);
    let mut out = Vec::new();
    let (mut r0, mut items) = (0usize, 0usize);
    for r in 0..rows.num_rows() {
        let n = rows.range(r).len();
        let alone = n > cap_items || (hub_chunk > 0 && n > hub_chunk);
        if r > r0 && (alone || r - r0 == plan.batch_rows || items + n > cap_items) {
            out.push(Batch {
                r0,
                r1: r,
                gathered: true,
            });
            r0 = r;
            items = 0;
        }
        if alone {
            out.push(Batch {
                r0: r,
                r1: r + 1,
                gathered: false,
            });
            r0 = r + 1;
        } else {
            items += n;
        }
    }
    if rows.num_rows() > r0 {
        out.push(Batch {
            r0,
            r1: rows.num_rows(),
            gathered: true,
        });
    }
    out
}

/// Per-batch scratch, reused across the batches a rayon job runs.
#[derive(Default)]
struct CgScratch {
    r: Vec<f32>,
    p: Vec<f32>,
    q: Vec<f32>,
    gathered: Vec<f32>,
    partial: Vec<f32>,
    lam: Vec<f32>,
    rs: Vec<f64>,
    rs0: Vec<f64>,
    active: Vec<bool>,
}

/// Everything a batch needs that is shared by all batches.
struct CgShared<'a, T> {
    rows: RowsView<'a>,
    fixed: &'a [T],
    /// `fixed` itself when `T` is f32: rows too long to gather are read in place.
    fixed32: Option<&'a [f32]>,
    d: usize,
    gram: &'a [f32],
    p: SolveParams,
    steps: usize,
    hub_chunk: usize,
    isa: Isa,
    /// Also compute the observed loss terms of the final rows.
    loss: bool,
}

impl<T> CgShared<'_, T> {
    /// Whether batch `b` works on a widened f32 copy of its item vectors (gathered
    /// batches always; a lone long row too when the table is not f32).
    fn widened(&self, b: Batch) -> bool {
        b.gathered || self.fixed32.is_none()
    }
}

/// Stop a row once `|r|^2 <= CG_TOL2 * |r_0|^2`: the residual is at the f32 rounding
/// level of the starting one and further steps would only add noise.
const CG_TOL2: f64 = (f32::EPSILON as f64) * (f32::EPSILON as f64);

/// The loss pieces of a set of solved rows (see [`local_loss_terms`]), in f64.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LossTerms {
    /// `sum_{u, i in I_u} (1 - w_u . h_i)^2`.
    pub observed: f64,
    /// `sum_u (|I_u| + alpha0 * n_other) * |w_u|^2` (not multiplied by `lambda`).
    pub reg: f64,
}

impl LossTerms {
    fn add(self, o: LossTerms) -> LossTerms {
        LossTerms {
            observed: self.observed + o.observed,
            reg: self.reg + o.reg,
        }
    }
}

/// Conjugate gradient for `A_u w_u = b_u` on every row, warm-started from `x`
/// (`rows x d`, row-major, updated in place), `steps` iterations, never forming `A_u`:
/// `A p = sum_{i in I_u} h_i (h_i . p) + alpha0 * G p + lambda (|I_u| + alpha0 n_other) p`.
///
/// The fixed table is `&[T]` (f32 or bf16, see the module docs); with bf16 the result
/// is bitwise that of the f32 kernel on the widened table.
///
/// Rows are processed in batches (at most 128 rows and 512 KiB of gathered item
/// vectors) in parallel with rayon; the Gramian term of a batch is one
/// `[B x d] x [d x d]` product per matvec ([`gram_term_body`]), and the batch's item vectors
/// are gathered (widened to f32) once, during the initial residual, and stay hot in
/// cache across the steps. A row with more than `hub_chunk` items (`hub_chunk = 0`:
/// never) computes its observed term in chunks of `hub_chunk` items in parallel, adding
/// the partial sums in chunk order. The batch and chunk partition depend only on the
/// input, so the result is bitwise independent of the thread count, and each row's
/// arithmetic does not depend on the batch it falls in.
///
/// `steps + 1` matvecs are done (one for the initial residual: the fixed table and `G`
/// change between half-epochs, so `A x` cannot be carried over). Rows with no items
/// have `b_u = 0`, so their solution is exactly 0, written directly. A row stops early
/// when its residual is exactly zero or reaches the f32 rounding level of the initial
/// one, or when `p . A p` is not positive (`A_u` not positive definite): nothing is
/// ever divided by zero. `steps = 0` leaves `x` untouched.
///
/// `gram` is the symmetric `G` as f32, `d * d`. Panics if the shapes disagree (`x.len() != rows * d`,
/// `fixed.len()` not a multiple of `d`, `gram.len() != d * d`) or if `rows` is not a
/// valid CSR over `fixed` (the caller validates its input when loading it).
#[allow(clippy::too_many_arguments)]
pub fn cg_solve<T: TableElem>(
    x: &mut [f32],
    rows: RowsView,
    fixed: &[T],
    d: usize,
    gram: &[f32],
    p: SolveParams,
    steps: usize,
    hub_chunk: usize,
) {
    cg_solve_planned(
        x,
        rows,
        fixed,
        d,
        gram,
        p,
        steps,
        hub_chunk,
        cg_plan(),
        Isa::detect(),
        false,
    );
}

/// [`cg_solve`], and the loss pieces of the rows it solved, computed from the final
/// `x` while each batch's item vectors are still in cache: the same values as
/// [`local_loss_terms`]`(x, rows, fixed, d, p.alpha0, p.n_other)` after the solve, up
/// to the order of the f64 sums (per batch here, then the batches in order; so
/// deterministic and independent of the thread count, but not bitwise equal to
/// [`local_loss_terms`]). This replaces the separate pass over the observed cells.
/// With `steps = 0` nothing is solved and the terms of the unchanged `x` are returned
/// (computed by [`local_loss_terms`]). Panics as [`cg_solve`] does.
#[allow(clippy::too_many_arguments)]
pub fn cg_solve_with_loss<T: TableElem>(
    x: &mut [f32],
    rows: RowsView,
    fixed: &[T],
    d: usize,
    gram: &[f32],
    p: SolveParams,
    steps: usize,
    hub_chunk: usize,
) -> LossTerms {
    cg_solve_planned(
        x,
        rows,
        fixed,
        d,
        gram,
        p,
        steps,
        hub_chunk,
        cg_plan(),
        Isa::detect(),
        true,
    )
}

#[allow(clippy::too_many_arguments)]
fn cg_solve_planned<T: TableElem>(
    x: &mut [f32],
    rows: RowsView,
    fixed: &[T],
    d: usize,
    gram: &[f32],
    p: SolveParams,
    steps: usize,
    hub_chunk: usize,
    plan: Plan,
    isa: Isa,
    loss: bool,
) -> LossTerms {
    let n_rows = rows.num_rows();
    assert_eq!(x.len(), n_rows * d, "cg_solve: x is not rows x d");
    assert_eq!(gram.len(), d * d, "cg_solve: gram is not d x d");
    if d == 0 || steps == 0 || n_rows == 0 {
        if !loss {
            return LossTerms::default();
        }
        let (observed, reg) = local_loss_terms(x, rows, fixed, d, p.alpha0, p.n_other);
        return LossTerms { observed, reg };
    }
    assert_eq!(fixed.len() % d, 0, "cg_solve: fixed is not n x d");
    if let Err((r, msg)) = rows.validate(fixed.len() / d) {
        panic!("cg_solve: row {r}: {msg}");
    }
    let shared = CgShared {
        rows,
        fixed,
        fixed32: as_f32(fixed),
        d,
        gram,
        p,
        steps,
        hub_chunk,
        isa,
        loss,
    };
    let batches = plan_batches(&rows, d, hub_chunk, plan);
    let mut jobs = Vec::with_capacity(batches.len());
    let mut rest: &mut [f32] = x;
    for b in batches {
        let (head, tail) = std::mem::take(&mut rest).split_at_mut((b.r1 - b.r0) * d);
        jobs.push((b, head));
        rest = tail;
    }
    let parts: Vec<LossTerms> = jobs
        .into_par_iter()
        .map_init(CgScratch::default, |s, (b, xb)| cg_batch(&shared, b, xb, s))
        .collect();
    parts.into_iter().fold(LossTerms::default(), LossTerms::add)
}

/// Adds the observed term of local batch row `j` (global row `u`) to `out`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn batch_observed<const FMA: bool, T: TableElem>(
    sh: &CgShared<T>,
    b: Batch,
    u: usize,
    gathered: &[f32],
    partial: &mut Vec<f32>,
    v: &[f32],
    out: &mut [f32],
    c: f32,
    s: f32,
) {
    let d = sh.d;
    let range = sh.rows.range(u);
    let hub = sh.hub_chunk > 0 && range.len() > sh.hub_chunk;
    let n_chunks = range.len().div_ceil(sh.hub_chunk.max(1));
    match sh.fixed32 {
        _ if sh.widened(b) => {
            let base = sh.rows.range(b.r0).start;
            let g = &gathered[(range.start - base) * d..(range.end - base) * d];
            if !hub {
                observed_body::<FMA>(&Gathered { buf: g, d }, v, out, c, s);
                return;
            }
            // Hub row: chunks of `hub_chunk` items in parallel, partial sums added in
            // order (the same arithmetic as the in-place chunks below).
            partial.resize(n_chunks * d, 0.0);
            partial
                .par_chunks_mut(d)
                .zip(g.par_chunks(sh.hub_chunk * d))
                .for_each(|(part, chunk)| {
                    part.fill(0.0);
                    observed(sh.isa, &Gathered { buf: chunk, d }, v, part, c, s);
                });
        }
        Some(fixed) => {
            let idx = &sh.rows.indices[range];
            if !hub {
                observed_body::<FMA>(&Indexed { idx, fixed, d }, v, out, c, s);
                return;
            }
            partial.resize(n_chunks * d, 0.0);
            partial
                .par_chunks_mut(d)
                .zip(idx.par_chunks(sh.hub_chunk))
                .for_each(|(part, chunk)| {
                    part.fill(0.0);
                    let items = Indexed {
                        idx: chunk,
                        fixed,
                        d,
                    };
                    observed(sh.isa, &items, v, part, c, s);
                });
        }
        None => unreachable!("a non-f32 table is always widened"),
    }
    for part in partial.chunks_exact(d) {
        for (o, &pv) in out.iter_mut().zip(part) {
            *o += pv;
        }
    }
}

/// Rows per register block of the Gramian term (AVX2 kernel).
const GT_ROWS: usize = 6;
/// Columns per register block of the Gramian term (two 8-float vectors).
const GT_COLS: usize = 16;

/// `q = alpha0 * v G` for the first `nb` rows of `v` (`G` symmetric `d x d`):
/// `q[r, c] = alpha0 * s` with `s` one multiply-add chain `s = v[r, k] * G[k, c] + s`
/// over `k = 0..d` in order from 0 (fused when `FMA`). The arithmetic of an element does
/// not depend on `nb` or on the other rows, so a row gets the same bits in any batch.
#[inline(always)]
fn gram_term_body<const FMA: bool>(
    v: &[f32],
    g: &[f32],
    q: &mut [f32],
    nb: usize,
    d: usize,
    alpha0: f32,
) {
    if alpha0 == 0.0 {
        q[..nb * d].fill(0.0);
        return;
    }
    assert!(v.len() >= nb * d && q.len() >= nb * d && g.len() == d * d);
    #[cfg(target_arch = "x86_64")]
    if FMA {
        if std::is_x86_feature_detected!("avx512f") {
            // SAFETY: avx512f was detected; the lengths are checked above.
            unsafe { gram_term_avx512(v, g, q, nb, d, alpha0) };
        } else {
            // SAFETY: FMA = true is only compiled into the avx2+fma variant (cg_batch_fma,
            // reached only after detecting both); the lengths are checked above.
            unsafe { gram_term_avx2(v, g, q, nb, d, alpha0) };
        }
        return;
    }
    for r in 0..nb {
        let (vr, qr) = (&v[r * d..][..d], &mut q[r * d..][..d]);
        qr.fill(0.0);
        for (&vk, gk) in vr.iter().zip(g.chunks_exact(d)) {
            for (o, &gv) in qr.iter_mut().zip(gk) {
                *o = madd::<FMA>(vk, gv, *o);
            }
        }
        for o in qr.iter_mut() {
            *o *= alpha0;
        }
    }
}

/// The AVX2 Gramian term: blocks of `R` rows x 16 columns in 2R registers, one fused
/// multiply-add per element and `k`, `k` in order; a scalar fused tail for the columns
/// past the last multiple of 16 (the same arithmetic).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn gram_term_avx2(v: &[f32], g: &[f32], q: &mut [f32], nb: usize, d: usize, alpha0: f32) {
    let full_c = d / GT_COLS * GT_COLS;
    let full_r = nb / GT_ROWS * GT_ROWS;
    for c0 in (0..full_c).step_by(GT_COLS) {
        for r0 in (0..full_r).step_by(GT_ROWS) {
            gram_block_avx2::<GT_ROWS>(v, g, q, r0, c0, d, alpha0);
        }
        for r0 in full_r..nb {
            gram_block_avx2::<1>(v, g, q, r0, c0, d, alpha0);
        }
    }
    for r in 0..nb {
        for c in full_c..d {
            let mut s = 0.0f32;
            for k in 0..d {
                s = v[r * d + k].mul_add(g[k * d + c], s);
            }
            q[r * d + c] = alpha0 * s;
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn gram_block_avx2<const R: usize>(
    v: &[f32],
    g: &[f32],
    q: &mut [f32],
    r0: usize,
    c0: usize,
    d: usize,
    alpha0: f32,
) {
    use std::arch::x86_64::*;
    debug_assert!((r0 + R) * d <= v.len() && c0 + GT_COLS <= d && g.len() == d * d);
    let mut acc = [[_mm256_setzero_ps(); 2]; R];
    let (vp, gp) = (v.as_ptr().add(r0 * d), g.as_ptr().add(c0));
    for k in 0..d {
        let g0 = _mm256_loadu_ps(gp.add(k * d));
        let g1 = _mm256_loadu_ps(gp.add(k * d + 8));
        for (r, a) in acc.iter_mut().enumerate() {
            let vk = _mm256_broadcast_ss(&*vp.add(r * d + k));
            a[0] = _mm256_fmadd_ps(vk, g0, a[0]);
            a[1] = _mm256_fmadd_ps(vk, g1, a[1]);
        }
    }
    let al = _mm256_set1_ps(alpha0);
    let qp = q.as_mut_ptr().add(r0 * d + c0);
    for (r, a) in acc.iter().enumerate() {
        _mm256_storeu_ps(qp.add(r * d), _mm256_mul_ps(al, a[0]));
        _mm256_storeu_ps(qp.add(r * d + 8), _mm256_mul_ps(al, a[1]));
    }
}

/// Rows per register block of the AVX-512 Gramian term.
const GT512_ROWS: usize = 8;
/// Columns per register block of the AVX-512 Gramian term (two 16-float vectors).
const GT512_COLS: usize = 32;

/// [`gram_term_avx2`] with 512-bit vectors (32 registers: blocks of 8 rows x 32
/// columns). The same fused multiply-add chain per element, so the same bits.
///
/// The AVX-512 intrinsics and `target_feature(enable = "avx512f")` are stable since
/// Rust 1.89 (the crate's declared MSRV is older: building this needs rustc >= 1.89).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
#[allow(clippy::incompatible_msrv)]
unsafe fn gram_term_avx512(v: &[f32], g: &[f32], q: &mut [f32], nb: usize, d: usize, alpha0: f32) {
    let full_c = d / GT512_COLS * GT512_COLS;
    let full_r = nb / GT512_ROWS * GT512_ROWS;
    for c0 in (0..full_c).step_by(GT512_COLS) {
        for r0 in (0..full_r).step_by(GT512_ROWS) {
            gram_block_avx512::<GT512_ROWS>(v, g, q, r0, c0, d, alpha0);
        }
        for r0 in full_r..nb {
            gram_block_avx512::<1>(v, g, q, r0, c0, d, alpha0);
        }
    }
    if full_c < d {
        // The remaining columns (fewer than 32): the scalar fused chain.
        for r in 0..nb {
            for c in full_c..d {
                let mut s = 0.0f32;
                for k in 0..d {
                    s = v[r * d + k].mul_add(g[k * d + c], s);
                }
                q[r * d + c] = alpha0 * s;
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline]
#[allow(clippy::incompatible_msrv)]
unsafe fn gram_block_avx512<const R: usize>(
    v: &[f32],
    g: &[f32],
    q: &mut [f32],
    r0: usize,
    c0: usize,
    d: usize,
    alpha0: f32,
) {
    use std::arch::x86_64::*;
    debug_assert!((r0 + R) * d <= v.len() && c0 + GT512_COLS <= d && g.len() == d * d);
    let mut acc = [[_mm512_setzero_ps(); 2]; R];
    let (vp, gp) = (v.as_ptr().add(r0 * d), g.as_ptr().add(c0));
    for k in 0..d {
        let g0 = _mm512_loadu_ps(gp.add(k * d));
        let g1 = _mm512_loadu_ps(gp.add(k * d + 16));
        for (r, a) in acc.iter_mut().enumerate() {
            let vk = _mm512_set1_ps(*vp.add(r * d + k));
            a[0] = _mm512_fmadd_ps(vk, g0, a[0]);
            a[1] = _mm512_fmadd_ps(vk, g1, a[1]);
        }
    }
    let al = _mm512_set1_ps(alpha0);
    let qp = q.as_mut_ptr().add(r0 * d + c0);
    for (r, a) in acc.iter().enumerate() {
        _mm512_storeu_ps(qp.add(r * d), _mm512_mul_ps(al, a[0]));
        _mm512_storeu_ps(qp.add(r * d + 16), _mm512_mul_ps(al, a[1]));
    }
}

/// Reference for the Gramian term: `q[r, c] = alpha0 * sum_k v[r, k] G[k, c]`, the
/// same chain of multiply-adds per element, one element at a time.
#[cfg(test)]
fn gram_term_ref<const FMA: bool>(
    v: &[f32],
    g: &[f32],
    nb: usize,
    d: usize,
    alpha0: f32,
) -> Vec<f32> {
    let mut q = vec![0.0f32; nb * d];
    if alpha0 == 0.0 {
        return q;
    }
    for r in 0..nb {
        for c in 0..d {
            let mut s = 0.0f32;
            for k in 0..d {
                s = madd::<FMA>(v[r * d + k], g[k * d + c], s);
            }
            q[r * d + c] = alpha0 * s;
        }
    }
    q
}

/// CG on the rows of one batch; `xb` is their slice of `x`.
fn cg_batch<T: TableElem>(
    sh: &CgShared<T>,
    b: Batch,
    xb: &mut [f32],
    s: &mut CgScratch,
) -> LossTerms {
    match sh.isa {
        // SAFETY: `Isa::Avx2Fma` is only constructed after detecting avx2 and fma.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2Fma => unsafe { cg_batch_fma(sh, b, xb, s) },
        Isa::Plain => cg_batch_body::<false, T>(sh, b, xb, s),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn cg_batch_fma<T: TableElem>(
    sh: &CgShared<T>,
    b: Batch,
    xb: &mut [f32],
    s: &mut CgScratch,
) -> LossTerms {
    cg_batch_body::<true, T>(sh, b, xb, s)
}

#[inline(always)]
fn cg_batch_body<const FMA: bool, T: TableElem>(
    sh: &CgShared<T>,
    b: Batch,
    xb: &mut [f32],
    s: &mut CgScratch,
) -> LossTerms {
    let d = sh.d;
    let nb = b.r1 - b.r0;
    let bd = nb * d;
    s.r.resize(bd, 0.0);
    s.p.resize(bd, 0.0);
    s.q.resize(bd, 0.0);
    s.lam.resize(nb, 0.0);
    s.rs.resize(nb, 0.0);
    s.rs0.resize(nb, 0.0);
    s.active.resize(nb, false);
    let (reg, alpha0) = (f64::from(sh.p.reg), f64::from(sh.p.alpha0));
    // The batch's item vectors, gathered (widened to f32) row by row during the initial
    // residual, so that each is used while still in L1, and read from the gathered copy
    // afterwards.
    let base = sh.rows.range(b.r0).start;
    let idx_all = &sh.rows.indices[base..sh.rows.range(b.r1 - 1).end];
    let widened = sh.widened(b);
    if widened {
        s.gathered.resize(idx_all.len() * d, 0.0);
    }
    // Empty rows: b = 0, the solution is 0.
    for j in 0..nb {
        let n = sh.rows.range(b.r0 + j).len();
        s.lam[j] = (reg * (n as f64 + alpha0 * sh.p.n_other)) as f32;
        if n == 0 {
            xb[j * d..][..d].fill(0.0);
        }
    }

    // Initial residual r = b - A x = sum_i h_i (1 - h_i . x) - alpha0 x G - lam x.
    gram_term_body::<FMA>(xb, sh.gram, &mut s.q, nb, d, sh.p.alpha0);
    for j in 0..nb {
        let u = b.r0 + j;
        let rj = &mut s.r[j * d..][..d];
        let pj = &mut s.p[j * d..][..d];
        let xj = &xb[j * d..][..d];
        if sh.rows.range(u).is_empty() {
            rj.fill(0.0);
            pj.fill(0.0);
            s.active[j] = false;
            continue;
        }
        let lam = s.lam[j];
        for ((r, &q), &xv) in rj.iter_mut().zip(&s.q[j * d..][..d]).zip(xj) {
            *r = -q - lam * xv;
        }
        if widened {
            let range = sh.rows.range(u);
            let dst = &mut s.gathered[(range.start - base) * d..(range.end - base) * d];
            for (k, h) in (range.start - base..).zip(dst.chunks_exact_mut(d)) {
                if let Some(&i) = idx_all.get(k + PREFETCH_AHEAD) {
                    prefetch_rows(&sh.fixed[i as usize * d..][..d]);
                }
                widen_row(&sh.fixed[idx_all[k] as usize * d..][..d], h);
            }
        }
        batch_observed::<FMA, T>(sh, b, u, &s.gathered, &mut s.partial, xj, rj, 1.0, -1.0);
        pj.copy_from_slice(rj);
        let rs = dot64(rj, rj);
        s.rs[j] = rs;
        s.rs0[j] = rs;
        s.active[j] = rs > 0.0 && rs.is_finite();
        if !s.active[j] {
            pj.fill(0.0);
        }
    }

    for step in 0..sh.steps {
        if !s.active.iter().any(|&a| a) {
            break;
        }
        let last = step + 1 == sh.steps;
        gram_term_body::<FMA>(&s.p, sh.gram, &mut s.q, nb, d, sh.p.alpha0);
        for j in 0..nb {
            if !s.active[j] {
                continue;
            }
            let u = b.r0 + j;
            let pj = &mut s.p[j * d..][..d];
            let qj = &mut s.q[j * d..][..d];
            let lam = s.lam[j];
            for (q, &pv) in qj.iter_mut().zip(pj.iter()) {
                *q += lam * pv;
            }
            batch_observed::<FMA, T>(sh, b, u, &s.gathered, &mut s.partial, pj, qj, 0.0, 1.0);
            let pq = dot64(pj, qj);
            let alpha = s.rs[j] / pq;
            if !(pq > 0.0 && alpha.is_finite()) {
                s.active[j] = false;
                pj.fill(0.0);
                continue;
            }
            let alpha = alpha as f32;
            for (xv, &pv) in xb[j * d..][..d].iter_mut().zip(pj.iter()) {
                *xv += alpha * pv;
            }
            if last {
                continue;
            }
            let rj = &mut s.r[j * d..][..d];
            for (r, &q) in rj.iter_mut().zip(qj.iter()) {
                *r -= alpha * q;
            }
            let rs_new = dot64(rj, rj);
            if !(rs_new > CG_TOL2 * s.rs0[j] && rs_new.is_finite()) {
                s.active[j] = false;
                pj.fill(0.0);
                continue;
            }
            let beta = (rs_new / s.rs[j]) as f32;
            for (pv, &r) in pj.iter_mut().zip(rj.iter()) {
                *pv = r + beta * *pv;
            }
            s.rs[j] = rs_new;
        }
    }
    if sh.loss {
        batch_loss(sh, b, xb, &s.gathered)
    } else {
        LossTerms::default()
    }
}

/// The loss pieces of the final rows of batch `b`, from its gathered item vectors (or
/// the f32 table in place for a lone long row), in row and item order.
#[inline(always)]
fn batch_loss<T: TableElem>(sh: &CgShared<T>, b: Batch, xb: &[f32], gathered: &[f32]) -> LossTerms {
    let d = sh.d;
    let base = sh.rows.range(b.r0).start;
    let (mut obs, mut reg) = (0.0f64, 0.0f64);
    for (j, w) in xb.chunks_exact(d).enumerate() {
        let range = sh.rows.range(b.r0 + j);
        let n = range.len();
        match sh.fixed32 {
            _ if sh.widened(b) => {
                let g = &gathered[(range.start - base) * d..(range.end - base) * d];
                for h in g.chunks_exact(d) {
                    let e = 1.0 - dot64(w, h);
                    obs += e * e;
                }
            }
            Some(fixed) => {
                for &i in &sh.rows.indices[range] {
                    let e = 1.0 - dot64(w, &fixed[i as usize * d..][..d]);
                    obs += e * e;
                }
            }
            None => unreachable!("a non-f32 table is always widened"),
        }
        reg += (n as f64 + f64::from(sh.p.alpha0) * sh.p.n_other) * dot64(w, w);
    }
    LossTerms { observed: obs, reg }
}

// ---------------------------------------------------------------------------------------
// Exact solve.

/// Items per f64 gemm when forming `A_u` (bounds the gather buffer of a hub row).
const CHOL_CHUNK: usize = 256;

/// Exact solve of every row (fixed table f32 or bf16, widened exactly): forms `A_u` and
/// `b_u` in f64 (item vectors converted to
/// f64, `A_u` accumulated with f64 gemm over chunks of items) and solves by Cholesky
/// (LAPACK through ndarray-linalg), in parallel over rows with rayon. LAPACK runs on
/// the calling rayon thread: run with `OPENBLAS_NUM_THREADS=1`, or OpenBLAS's own
/// threads oversubscribe the cores (about 6x slower on 2 cores).
///
/// Writes all rows of `x` on success; rows with no items get exactly 0 (`b_u = 0`)
/// without a factorization. On failure returns the error of the first (lowest) failing
/// row: an invalid CSR row or index, an `A_u` that is not positive definite, or a
/// solution that is not finite; failing rows are left unchanged, the others are written.
///
/// `gram` is the symmetric `G`, `d * d` f64. Panics if the shapes disagree (`x.len() != rows * d`,
/// `fixed.len()` not a multiple of `d`, `gram.len() != d * d`).
pub fn cholesky_solve<T: TableElem>(
    x: &mut [f32],
    rows: RowsView,
    fixed: &[T],
    d: usize,
    gram: &[f64],
    p: SolveParams,
) -> Result<(), SolveError> {
    let n_rows = rows.num_rows();
    assert_eq!(x.len(), n_rows * d, "cholesky_solve: x is not rows x d");
    assert_eq!(gram.len(), d * d, "cholesky_solve: gram is not d x d");
    if d == 0 {
        return Ok(());
    }
    assert_eq!(fixed.len() % d, 0, "cholesky_solve: fixed is not n x d");
    let g = view2(gram, d, d);
    let first_err = x
        .par_chunks_mut(d)
        .enumerate()
        .map_init(Vec::new, |buf, (u, xu)| {
            cholesky_row(u, xu, &rows, fixed, d, &g, &p, buf).err()
        })
        .flatten()
        .min_by_key(SolveError::row);
    match first_err {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

#[allow(clippy::too_many_arguments)]
fn cholesky_row<T: TableElem>(
    u: usize,
    xu: &mut [f32],
    rows: &RowsView,
    fixed: &[T],
    d: usize,
    g: &ArrayView2<f64>,
    p: &SolveParams,
    buf: &mut Vec<f64>,
) -> Result<(), SolveError> {
    let err = |msg: String| SolveError::Row { row: u, msg };
    let idx = &rows.indices[rows.try_range(u).map_err(err)?];
    if idx.is_empty() {
        xu.fill(0.0);
        return Ok(());
    }
    check_indices(idx, fixed.len() / d).map_err(err)?;
    // Column-major, so that LAPACK works in place (no transposed copies).
    let mut a = Array2::<f64>::zeros((d, d).f());
    let mut b = Array1::<f64>::zeros(d);
    for chunk in idx.chunks(CHOL_CHUNK) {
        buf.clear();
        for &i in chunk {
            let h = &fixed[i as usize * d..][..d];
            buf.extend(h.iter().map(|&v| f64::from(v.to_f32())));
            for (bv, &hv) in b.iter_mut().zip(h) {
                *bv += f64::from(hv.to_f32());
            }
        }
        let hv = view2(buf, chunk.len(), d);
        gemm(1.0, hv.t(), hv, 1.0, &mut a.view_mut());
    }
    let lam = f64::from(p.reg) * (idx.len() as f64 + f64::from(p.alpha0) * p.n_other);
    // G is symmetric: adding its transpose walks both arrays in memory order.
    a.scaled_add(f64::from(p.alpha0), &g.t());
    for k in 0..d {
        a[[k, k]] += lam;
    }
    let factor = a
        .factorizec_into(UPLO::Lower)
        .map_err(|e| err(format!("A_u is not positive definite or not finite ({e})")))?;
    factor
        .solvec_inplace(&mut b)
        .map_err(|e| err(format!("Cholesky solve failed ({e})")))?;
    if let Some(k) = b.iter().position(|&v| !(v as f32).is_finite()) {
        return Err(err(format!(
            "solution is not finite in f32 (component {k} = {})",
            b[k]
        )));
    }
    for (xv, &bv) in xu.iter_mut().zip(b.iter()) {
        *xv = bv as f32;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Loss pieces.

/// Rows per unit of work of [`local_loss_terms`] (fixed, so the sum order is fixed).
const LOSS_CHUNK: usize = 1024;

/// Loss pieces of the rows just solved, all in f64:
/// `(sum_{u, i in I_u} (1 - w_u . h_i)^2, sum_u (|I_u| + alpha0 * n_other) * |w_u|^2)`.
///
/// The fixed table may be f32 or bf16 (widened exactly). The regularization piece is
/// not multiplied by `lambda`. [`cg_solve_with_loss`] computes the same pieces during the
/// solve without this separate pass. Parallel over fixed chunks of
/// rows, added in order (independent of the thread count). Panics if the shapes
/// disagree or `rows` is not a valid CSR over `fixed`.
pub fn local_loss_terms<T: TableElem>(
    x: &[f32],
    rows: RowsView,
    fixed: &[T],
    d: usize,
    alpha0: f32,
    n_other: f64,
) -> (f64, f64) {
    let n_rows = rows.num_rows();
    assert_eq!(x.len(), n_rows * d, "local_loss_terms: x is not rows x d");
    if d == 0 {
        // Every prediction is 0: each observed cell contributes (1 - 0)^2.
        let nnz = match (rows.indptr.first(), rows.indptr.last()) {
            (Some(&a), Some(&b)) => b.saturating_sub(a),
            _ => 0,
        };
        return (nnz as f64, 0.0);
    }
    assert_eq!(fixed.len() % d, 0, "local_loss_terms: fixed is not n x d");
    if let Err((r, msg)) = rows.validate(fixed.len() / d) {
        panic!("local_loss_terms: row {r}: {msg}");
    }
    let parts: Vec<(f64, f64)> = (0..n_rows.div_ceil(LOSS_CHUNK))
        .into_par_iter()
        .map(|c| {
            let (mut obs, mut reg) = (0.0f64, 0.0f64);
            for u in c * LOSS_CHUNK..((c + 1) * LOSS_CHUNK).min(n_rows) {
                let w = &x[u * d..][..d];
                let idx = &rows.indices[rows.range(u)];
                for &i in idx {
                    let e = 1.0 - dot64(w, &fixed[i as usize * d..][..d]);
                    obs += e * e;
                }
                reg += (idx.len() as f64 + f64::from(alpha0) * n_other) * dot64(w, w);
            }
            (obs, reg)
        })
        .collect();
    parts
        .iter()
        .fold((0.0, 0.0), |(a, b), &(o, r)| (a + o, b + r))
}

/// `trace(G_w G_h) = sum_{u,i} (w_u . h_i)^2` over all pairs, from the two Gramians
/// (`d * d` each, row-major). Panics if a length is not `d * d`.
pub fn all_pairs_term(gw: &[f64], gh: &[f64], d: usize) -> f64 {
    assert_eq!(gw.len(), d * d, "all_pairs_term: gw is not d x d");
    assert_eq!(gh.len(), d * d, "all_pairs_term: gh is not d x d");
    let mut t = 0.0f64;
    for k in 0..d {
        for l in 0..d {
            t += gw[k * d + l] * gh[l * d + k];
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SplitMix64;

    /// A random problem: a fixed table and CSR rows over it, stored as a window of a
    /// bigger CSR (`indptr[0] > 0`, the leading `indices` are poison never to be read).
    struct Problem {
        d: usize,
        n_fixed: usize,
        fixed: Vec<f32>,
        indptr: Vec<u64>,
        indices: Vec<u32>,
    }

    const POISON: usize = 5;

    impl Problem {
        fn new(seed: u64, d: usize, n_fixed: usize, lens: &[usize]) -> Problem {
            let mut rng = SplitMix64::new(seed);
            let scale = 1.0 / (d.max(1) as f64).sqrt();
            let fixed = (0..n_fixed * d)
                .map(|_| (rng.next_normal() * scale) as f32)
                .collect();
            let mut indices = vec![u32::MAX; POISON];
            let mut indptr = vec![POISON as u64];
            for &n in lens {
                for _ in 0..n {
                    indices.push(rng.below(n_fixed as u64) as u32);
                }
                indptr.push(indices.len() as u64);
            }
            Problem {
                d,
                n_fixed,
                fixed,
                indptr,
                indices,
            }
        }

        fn rows(&self) -> RowsView<'_> {
            RowsView {
                indptr: &self.indptr,
                indices: &self.indices,
            }
        }

        fn n_rows(&self) -> usize {
            self.indptr.len() - 1
        }

        fn items(&self, u: usize) -> &[u32] {
            &self.indices[self.indptr[u] as usize..self.indptr[u + 1] as usize]
        }

        fn h(&self, i: u32) -> &[f32] {
            &self.fixed[i as usize * self.d..][..self.d]
        }

        /// Naive dense `A_u`, `b_u` in f64.
        fn dense_system(&self, u: usize, gram: &[f64], p: SolveParams) -> (Vec<f64>, Vec<f64>) {
            let d = self.d;
            let mut a = vec![0.0f64; d * d];
            let mut b = vec![0.0f64; d];
            for &i in self.items(u) {
                let h = self.h(i);
                for k in 0..d {
                    b[k] += f64::from(h[k]);
                    for l in 0..d {
                        a[k * d + l] += f64::from(h[k]) * f64::from(h[l]);
                    }
                }
            }
            let n = self.items(u).len() as f64;
            let lam = f64::from(p.reg) * (n + f64::from(p.alpha0) * p.n_other);
            for k in 0..d {
                for l in 0..d {
                    a[k * d + l] += f64::from(p.alpha0) * gram[k * d + l];
                }
                a[k * d + k] += lam;
            }
            (a, b)
        }

        fn params(&self) -> SolveParams {
            SolveParams {
                reg: 0.05,
                alpha0: 0.1,
                n_other: self.n_fixed as f64,
            }
        }
    }

    /// Textbook Cholesky `A = L L^T` and two triangular solves, in f64.
    fn chol_solve_ref(a: &[f64], b: &[f64], d: usize) -> Vec<f64> {
        let mut l = vec![0.0f64; d * d];
        for j in 0..d {
            let mut s = a[j * d + j];
            for k in 0..j {
                s -= l[j * d + k] * l[j * d + k];
            }
            assert!(s > 0.0, "reference: not positive definite");
            l[j * d + j] = s.sqrt();
            for i in j + 1..d {
                let mut s = a[i * d + j];
                for k in 0..j {
                    s -= l[i * d + k] * l[j * d + k];
                }
                l[i * d + j] = s / l[j * d + j];
            }
        }
        let mut y = vec![0.0f64; d];
        for i in 0..d {
            let mut s = b[i];
            for k in 0..i {
                s -= l[i * d + k] * y[k];
            }
            y[i] = s / l[i * d + i];
        }
        let mut x = vec![0.0f64; d];
        for i in (0..d).rev() {
            let mut s = y[i];
            for k in i + 1..d {
                s -= l[k * d + i] * x[k];
            }
            x[i] = s / l[i * d + i];
        }
        x
    }

    fn matvec(a: &[f64], x: &[f32], d: usize) -> Vec<f64> {
        (0..d)
            .map(|k| (0..d).map(|l| a[k * d + l] * f64::from(x[l])).sum())
            .collect()
    }

    fn norm_inf(v: impl IntoIterator<Item = f64>) -> f64 {
        v.into_iter().fold(0.0, |m, x| m.max(x.abs()))
    }

    fn to_f32(v: &[f64]) -> Vec<f32> {
        v.iter().map(|&x| x as f32).collect()
    }

    fn in_pool<T: Send>(threads: usize, f: impl FnOnce() -> T + Send) -> T {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .expect("test thread pool")
            .install(f)
    }

    fn random_x(seed: u64, len: usize, scale: f64) -> Vec<f32> {
        let mut rng = SplitMix64::new(seed);
        (0..len)
            .map(|_| (rng.next_normal() * scale) as f32)
            .collect()
    }

    /// Row lengths with empty rows, short rows, long rows and two hubs.
    fn mixed_lens(seed: u64, n: usize, hub: usize) -> Vec<usize> {
        let mut rng = SplitMix64::new(seed);
        let mut lens: Vec<usize> = (0..n)
            .map(|_| {
                let u = 1.0 - rng.next_f64();
                (1.5 * u.powf(-0.8)) as usize
            })
            .map(|n| n.min(200))
            .collect();
        lens[0] = 0;
        lens[n / 3] = hub;
        lens[n / 2] = 0;
        lens[n - 1] = hub + 7;
        lens
    }

    #[test]
    fn gramian_matches_reference() {
        let cases = [
            (0, 5),
            (1, 1),
            (3, 3),
            (7, 1),
            (100, 64),
            (GRAM_BLOCK, 4),
            (GRAM_BLOCK * 2 + 13, 16),
            (GRAM_BLOCK * (GRAM_WAVE + 1) + 1, 2),
        ];
        for (seed, &(n, d)) in cases.iter().enumerate() {
            let mut rng = SplitMix64::new(100 + seed as u64);
            let t: Vec<f32> = (0..n * d).map(|_| rng.next_normal() as f32).collect();
            let g = gramian(&t, d);
            let r = gramian_ref(&t, d);
            assert_eq!(g.len(), d * d);
            // |error| of an f64 sum of n products of magnitude <= max|t|^2.
            let tmax = norm_inf(t.iter().map(|&v| f64::from(v)));
            let tol = 1e-13 * (n as f64 + 1.0) * tmax * tmax;
            for k in 0..d {
                for l in 0..d {
                    let (a, b) = (g[k * d + l], r[k * d + l]);
                    assert!((a - b).abs() <= tol, "n={n} d={d} ({k},{l}): {a} vs {b}");
                    assert_eq!(a.to_bits(), g[l * d + k].to_bits(), "not symmetric");
                }
            }
            let g3 = in_pool(3, || gramian(&t, d));
            let g1 = in_pool(1, || gramian(&t, d));
            assert_eq!(g1, g3, "gramian depends on the thread count");
            assert_eq!(g1, g, "gramian depends on the thread count");
        }
        assert!(gramian::<f32>(&[], 0).is_empty());
    }

    #[test]
    fn cholesky_matches_dense_reference() {
        for (case, &d) in [1usize, 3, 16, 64].iter().enumerate() {
            let n_fixed = 300;
            // Row 3 is a hub: several CHOL_CHUNKs of items.
            let lens = [4, 0, 1, 2 * CHOL_CHUNK + 37, 2 * d + 3, 17, 0];
            let pb = Problem::new(10 + case as u64, d, n_fixed, &lens);
            let p = pb.params();
            let gram = gramian(&pb.fixed, d);
            let mut x = vec![7.0f32; pb.n_rows() * d];
            cholesky_solve(&mut x, pb.rows(), &pb.fixed, d, &gram, p).expect("SPD systems");
            for u in 0..pb.n_rows() {
                let xu = &x[u * d..][..d];
                if pb.items(u).is_empty() {
                    assert!(xu.iter().all(|&v| v == 0.0), "empty row {u} must be 0");
                    continue;
                }
                let (a, b) = pb.dense_system(u, &gram, p);
                let xr = chol_solve_ref(&a, &b, d);
                let scale = norm_inf(xr.iter().copied());
                let err = norm_inf(xu.iter().zip(&xr).map(|(&v, &r)| f64::from(v) - r));
                assert!(
                    err <= 1e-5 * scale,
                    "d={d} row {u}: error {err} vs |x| {scale}"
                );
                // Round trip b = A x, to the accuracy of an f32 x.
                let ax = matvec(&a, xu, d);
                let res = norm_inf(ax.iter().zip(&b).map(|(p, q)| p - q));
                let a_inf = norm_inf((0..d).map(|k| (0..d).map(|l| a[k * d + l].abs()).sum()));
                let x_inf = norm_inf(xu.iter().map(|&v| f64::from(v)));
                let tol = 1e-6 * (a_inf * x_inf + norm_inf(b.iter().copied()));
                assert!(res <= tol, "d={d} row {u}: |Ax - b| = {res} > {tol}");
            }
        }
    }

    #[test]
    fn cholesky_reports_the_first_failing_row() {
        let d = 4;
        let mut pb = Problem::new(20, d, 40, &[0, 3, 0, 5, 2]);
        let gram = gramian(&pb.fixed, d);
        let mut x = vec![0.0f32; pb.n_rows() * d];
        // Indefinite A (negative regularization): the first non-empty row fails.
        let p = SolveParams {
            reg: -10.0,
            alpha0: 0.0,
            n_other: 40.0,
        };
        let e = cholesky_solve(&mut x, pb.rows(), &pb.fixed, d, &gram, p).unwrap_err();
        assert_eq!(e.row(), 1, "{e}");
        assert!(e.to_string().starts_with("row 1: "), "{e}");

        // A NaN in a table row that only row 3 uses (item 39: rewire row 3 to it and
        // every other row away from it); the other rows are still solved.
        let p = pb.params();
        for u in 0..pb.n_rows() {
            let range = pb.indptr[u] as usize..pb.indptr[u + 1] as usize;
            for i in &mut pb.indices[range] {
                *i = if u == 3 { 39 } else { *i % 39 };
            }
        }
        pb.fixed[39 * d + 1] = f32::NAN;
        x.fill(-1.0);
        let e = cholesky_solve(&mut x, pb.rows(), &pb.fixed, d, &gram, p).unwrap_err();
        assert_eq!(e.row(), 3, "{e}");
        assert!(
            x[3 * d..4 * d].iter().all(|&v| v == -1.0),
            "failed row left unchanged"
        );
        assert!(
            x[4 * d..].iter().all(|&v| v != -1.0 && v.is_finite()),
            "later rows solved"
        );

        // Index out of range and a decreasing indptr.
        let pb = Problem::new(21, d, 40, &[2, 2, 2]);
        let mut indices = pb.indices.clone();
        indices[pb.indptr[2] as usize] = 40;
        let rows = RowsView {
            indptr: &pb.indptr,
            indices: &indices,
        };
        let mut x = vec![0.0f32; 3 * d];
        let e = cholesky_solve(&mut x, rows, &pb.fixed, d, &gram, p).unwrap_err();
        assert_eq!(e.row(), 2, "{e}");
        let indptr = [POISON as u64, POISON as u64 + 2, POISON as u64 + 1];
        let rows = RowsView {
            indptr: &indptr,
            indices: &pb.indices,
        };
        let mut x = vec![0.0f32; 2 * d];
        let e = cholesky_solve(&mut x, rows, &pb.fixed, d, &gram, p).unwrap_err();
        assert_eq!(e.row(), 1, "{e}");
    }

    /// Small batches and a small gather budget, to exercise every batching path.
    const SMALL_PLAN: Plan = Plan {
        batch_rows: 5,
        gather_floats: 16 * 40,
    };

    #[test]
    fn cg_converges_to_the_cholesky_solution() {
        for (case, &d) in [1usize, 3, 16, 64].iter().enumerate() {
            let lens = mixed_lens(30 + case as u64, 120, 300);
            let pb = Problem::new(40 + case as u64, d, 500, &lens);
            let p = pb.params();
            let gram = gramian(&pb.fixed, d);
            let gram32 = to_f32(&gram);
            let mut exact = vec![0.0f32; pb.n_rows() * d];
            cholesky_solve(&mut exact, pb.rows(), &pb.fixed, d, &gram, p).expect("SPD");
            for plan in [CG_PLAN, SMALL_PLAN] {
                for hub_chunk in [0, 64] {
                    let mut x = vec![0.0f32; pb.n_rows() * d];
                    let (rows, fx) = (pb.rows(), &pb.fixed);
                    cg_solve_planned(
                        &mut x,
                        rows,
                        fx,
                        d,
                        &gram32,
                        p,
                        50,
                        hub_chunk,
                        plan,
                        Isa::detect(),
                        false,
                    );
                    for u in 0..pb.n_rows() {
                        let (xu, eu) = (&x[u * d..][..d], &exact[u * d..][..d]);
                        let diff: Vec<f32> = xu.iter().zip(eu).map(|(a, b)| a - b).collect();
                        let (err, scale) = (dot64(&diff, &diff).sqrt(), dot64(eu, eu).sqrt());
                        assert!(
                            err <= 1e-4 * scale,
                            "d={d} hub_chunk={hub_chunk} row {u} (n={}): {err} vs {scale}",
                            pb.items(u).len()
                        );
                        if pb.items(u).is_empty() {
                            assert!(xu.iter().all(|&v| v == 0.0));
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn cg_is_exact_after_d_steps() {
        // Ill-conditioned small systems (few items, weak regularization): conjugate
        // directions reach the solution in d steps, steepest descent would not.
        let d = 4;
        let lens: Vec<usize> = (0..40).map(|u| 1 + u % 6).collect();
        let pb = Problem::new(45, d, 50, &lens);
        let p = SolveParams {
            reg: 0.002,
            alpha0: 0.01,
            n_other: 50.0,
        };
        let gram = gramian(&pb.fixed, d);
        let mut exact = vec![0.0f32; pb.n_rows() * d];
        cholesky_solve(&mut exact, pb.rows(), &pb.fixed, d, &gram, p).expect("SPD");
        let mut x = vec![0.0f32; pb.n_rows() * d];
        cg_solve(&mut x, pb.rows(), &pb.fixed, d, &to_f32(&gram), p, d, 0);
        for u in 0..pb.n_rows() {
            let (xu, eu) = (&x[u * d..][..d], &exact[u * d..][..d]);
            let diff: Vec<f32> = xu.iter().zip(eu).map(|(a, b)| a - b).collect();
            let (err, scale) = (dot64(&diff, &diff).sqrt(), dot64(eu, eu).sqrt());
            assert!(err <= 1e-3 * scale, "row {u}: {err} vs {scale}");
        }
    }

    #[test]
    fn cg_three_steps_from_a_warm_start_improve_the_residual() {
        let d = 32;
        let lens = mixed_lens(50, 200, 400);
        let pb = Problem::new(51, d, 600, &lens);
        let p = pb.params();
        let gram = gramian(&pb.fixed, d);
        let mut exact = vec![0.0f32; pb.n_rows() * d];
        cholesky_solve(&mut exact, pb.rows(), &pb.fixed, d, &gram, p).expect("SPD");
        let noise = random_x(52, exact.len(), 0.05);
        let x0: Vec<f32> = exact
            .iter()
            .zip(&noise)
            .map(|(&e, &n)| e * (1.0 + n) + 0.01 * n)
            .collect();
        let mut x = x0.clone();
        cg_solve(&mut x, pb.rows(), &pb.fixed, d, &to_f32(&gram), p, 3, 64);
        let (mut res0, mut res1) = (0.0f64, 0.0f64);
        for u in 0..pb.n_rows() {
            let (a, b) = pb.dense_system(u, &gram, p);
            let r = |xu: &[f32]| {
                let ax = matvec(&a, xu, d);
                ax.iter()
                    .zip(&b)
                    .map(|(p, q)| (p - q) * (p - q))
                    .sum::<f64>()
            };
            let (r0, r1) = (r(&x0[u * d..][..d]), r(&x[u * d..][..d]));
            res0 += r0;
            res1 += r1;
            // CG decreases the A-norm of the error at every step.
            let e_a = |xu: &[f32]| {
                let e: Vec<f32> = xu
                    .iter()
                    .zip(&exact[u * d..][..d])
                    .map(|(a, b)| a - b)
                    .collect();
                dot64(&e, &to_f32(&matvec(&a, &e, d)))
            };
            let (e0, e1) = (e_a(&x0[u * d..][..d]), e_a(&x[u * d..][..d]));
            assert!(
                e1 <= e0 * 1.01 + 1e-12,
                "row {u}: A-norm error {e0} -> {e1}"
            );
            if pb.items(u).is_empty() {
                assert!(x[u * d..][..d].iter().all(|&v| v == 0.0));
            }
        }
        assert!(res1 < 0.01 * res0, "residual {res0} -> {res1}");
        assert!(x.iter().all(|v| v.is_finite()));
    }

    #[test]
    fn cg_is_deterministic_and_hub_chunking_agrees() {
        let d = 24;
        let lens = mixed_lens(60, 300, 1000);
        let pb = Problem::new(61, d, 800, &lens);
        let p = pb.params();
        let gram = to_f32(&gramian(&pb.fixed, d));
        let x0 = random_x(62, pb.n_rows() * d, 0.1);
        let run_isa = |threads: usize, hub_chunk: usize, plan: Plan, isa: Isa| {
            let mut x = x0.clone();
            let (rows, fx, g) = (pb.rows(), &pb.fixed, &gram);
            in_pool(threads, || {
                cg_solve_planned(&mut x, rows, fx, d, g, p, 3, hub_chunk, plan, isa, false)
            });
            x
        };
        let run = |threads, hub_chunk, plan| run_isa(threads, hub_chunk, plan, Isa::detect());
        for plan in [CG_PLAN, SMALL_PLAN] {
            let chunked = run(1, 50, plan);
            assert_eq!(chunked, run(2, 50, plan), "1 vs 2 threads");
            assert_eq!(chunked, run(3, 50, plan), "1 vs 3 threads");
            let whole = run(3, 0, plan);
            assert_eq!(whole, run(1, 0, plan), "1 vs 3 threads, no chunking");
            assert_eq!(whole, run(1, usize::MAX, plan), "hub_chunk 0 = never");
            for u in 0..pb.n_rows() {
                let (a, b) = (&chunked[u * d..][..d], &whole[u * d..][..d]);
                let diff: Vec<f32> = a.iter().zip(b).map(|(x, y)| x - y).collect();
                let (err, scale) = (dot64(&diff, &diff).sqrt(), dot64(b, b).sqrt());
                assert!(
                    err <= 1e-5 * scale,
                    "row {u}: chunked vs whole {err} vs {scale}"
                );
            }
        }
        // The plan only regroups rows: each row's arithmetic is the same.
        assert_eq!(run(2, 50, CG_PLAN), run(2, 50, SMALL_PLAN));
        // The portable kernel (no FMA) agrees with the detected one, and is deterministic.
        let plain = run_isa(1, 50, CG_PLAN, Isa::Plain);
        assert_eq!(plain, run_isa(3, 50, CG_PLAN, Isa::Plain));
        let fast = run(1, 50, CG_PLAN);
        for u in 0..pb.n_rows() {
            let (a, b) = (&plain[u * d..][..d], &fast[u * d..][..d]);
            let diff: Vec<f32> = a.iter().zip(b).map(|(x, y)| x - y).collect();
            let (err, scale) = (dot64(&diff, &diff).sqrt(), dot64(b, b).sqrt());
            assert!(
                err <= 1e-5 * scale,
                "row {u}: plain vs detected {err} vs {scale}"
            );
        }
    }

    #[test]
    fn cg_edge_cases_stay_finite() {
        let d = 8;
        let pb = Problem::new(70, d, 30, &[0, 0, 3, 0]);
        let gram = to_f32(&gramian(&pb.fixed, d));
        let p = pb.params();
        // steps = 0 leaves x untouched, even empty rows.
        let mut x = vec![1.0f32; 4 * d];
        cg_solve(&mut x, pb.rows(), &pb.fixed, d, &gram, p, 0, 16);
        assert!(x.iter().all(|&v| v == 1.0));
        // Empty rows become exactly 0 from any start.
        let mut x = vec![1.0f32; 4 * d];
        cg_solve(&mut x, pb.rows(), &pb.fixed, d, &gram, p, 5, 16);
        for u in [0, 1, 3] {
            assert!(x[u * d..][..d].iter().all(|&v| v == 0.0));
        }
        assert!(x.iter().all(|v| v.is_finite()));
        // Residual exactly 0 (no 0/0): one item h = e_0, no regularization, so
        // A = e_0 e_0^T and b = e_0; from x = e_0 (exact) and from x = 0 (one step).
        let mut e0 = vec![0.0f32; 2 * d];
        e0[0] = 1.0;
        let one = RowsView {
            indptr: &[0, 1],
            indices: &[0],
        };
        let (g_e0, p_e0) = (
            to_f32(&gramian(&e0, d)),
            SolveParams {
                reg: 0.0,
                alpha0: 0.0,
                n_other: 2.0,
            },
        );
        for start in [1.0f32, 0.0] {
            let mut x = vec![0.0f32; d];
            x[0] = start;
            cg_solve(&mut x, one, &e0, d, &g_e0, p_e0, 5, 16);
            assert_eq!(x, e0[..d], "start {start}");
        }
        // No unobserved weight and no regularization: A = sum h h^T is singular (rank 3
        // < 8), CG stays finite, the empty rows are still 0.
        let p0 = SolveParams {
            reg: 0.0,
            alpha0: 0.0,
            n_other: 30.0,
        };
        let mut x = vec![0.5f32; 4 * d];
        cg_solve(&mut x, pb.rows(), &pb.fixed, d, &gram, p0, 20, 16);
        assert!(x.iter().all(|v| v.is_finite()));
        assert!(x[..d].iter().all(|&v| v == 0.0));
        // No rows at all.
        let empty = RowsView {
            indptr: &[3],
            indices: &[],
        };
        cg_solve(&mut [], empty, &pb.fixed, d, &gram, p, 3, 16);
        cholesky_solve(&mut [], empty, &pb.fixed, d, &gramian(&pb.fixed, d), p).expect("no rows");
        assert_eq!(
            local_loss_terms(&[], empty, &pb.fixed, d, 0.1, 30.0),
            (0.0, 0.0)
        );
    }

    /// The transpose of the problem's rows: for each fixed row, its (row) neighbours.
    fn transpose(pb: &Problem) -> (Vec<u64>, Vec<u32>) {
        let mut cols: Vec<Vec<u32>> = vec![Vec::new(); pb.n_fixed];
        for u in 0..pb.n_rows() {
            for &i in pb.items(u) {
                cols[i as usize].push(u as u32);
            }
        }
        let mut indptr = vec![0u64];
        let mut indices = Vec::new();
        for c in cols {
            indices.extend(c);
            indptr.push(indices.len() as u64);
        }
        (indptr, indices)
    }

    fn naive_loss_terms(pb: &Problem, w: &[f32], alpha0: f32) -> (f64, f64) {
        let d = pb.d;
        let (mut obs, mut reg) = (0.0, 0.0);
        for u in 0..pb.n_rows() {
            let wu = &w[u * d..][..d];
            for &i in pb.items(u) {
                let h = pb.h(i);
                let dot: f64 = (0..d).map(|k| f64::from(wu[k]) * f64::from(h[k])).sum();
                obs += (1.0 - dot) * (1.0 - dot);
            }
            let n2: f64 = wu.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
            reg += (pb.items(u).len() as f64 + f64::from(alpha0) * pb.n_fixed as f64) * n2;
        }
        (obs, reg)
    }

    #[test]
    fn loss_terms_match_naive_and_the_solve_decreases_the_loss() {
        let d = 8;
        let (n_rows, n_cols) = (60, 50);
        let mut rng = SplitMix64::new(80);
        let lens: Vec<usize> = (0..n_rows).map(|_| rng.below(12) as usize).collect();
        let pb = Problem::new(81, d, n_cols, &lens);
        let p = pb.params();
        let (t_indptr, t_indices) = transpose(&pb);
        let cols = RowsView {
            indptr: &t_indptr,
            indices: &t_indices,
        };
        let objective = |w: &[f32]| {
            let (obs, reg_w) =
                local_loss_terms(w, pb.rows(), &pb.fixed, d, p.alpha0, n_cols as f64);
            let (_, reg_h) = local_loss_terms(&pb.fixed, cols, w, d, p.alpha0, n_rows as f64);
            let all = all_pairs_term(&gramian(w, d), &gramian(&pb.fixed, d), d);
            obs + f64::from(p.alpha0) * all + f64::from(p.reg) * (reg_w + reg_h)
        };
        let w0 = random_x(82, n_rows * d, 0.5);

        // local_loss_terms and all_pairs_term against naive sums.
        let (obs, reg) = local_loss_terms(&w0, pb.rows(), &pb.fixed, d, p.alpha0, n_cols as f64);
        let (obs_n, reg_n) = naive_loss_terms(&pb, &w0, p.alpha0);
        assert!((obs - obs_n).abs() <= 1e-12 * obs_n, "{obs} vs {obs_n}");
        assert!((reg - reg_n).abs() <= 1e-12 * reg_n, "{reg} vs {reg_n}");
        let all = all_pairs_term(&gramian(&w0, d), &gramian(&pb.fixed, d), d);
        let mut all_n = 0.0f64;
        for u in 0..n_rows {
            for i in 0..n_cols {
                let dot: f64 = (0..d)
                    .map(|k| f64::from(w0[u * d + k]) * f64::from(pb.fixed[i * d + k]))
                    .sum();
                all_n += dot * dot;
            }
        }
        assert!((all - all_n).abs() <= 1e-10 * all_n, "{all} vs {all_n}");

        // The exact solve minimizes the objective over the rows.
        let l0 = objective(&w0);
        let gram = gramian(&pb.fixed, d);
        let mut w1 = w0.clone();
        cholesky_solve(&mut w1, pb.rows(), &pb.fixed, d, &gram, p).expect("SPD");
        let l1 = objective(&w1);
        assert!(l1 < l0, "exact solve: loss {l0} -> {l1}");
        // ... so any perturbation of the solution increases it,
        let w_pert: Vec<f32> = w1
            .iter()
            .zip(random_x(83, w1.len(), 0.01))
            .map(|(a, b)| a + b)
            .collect();
        assert!(objective(&w_pert) > l1);
        // ... and 3 CG steps from w0 land between.
        let mut w2 = w0.clone();
        cg_solve(&mut w2, pb.rows(), &pb.fixed, d, &to_f32(&gram), p, 3, 4);
        let l2 = objective(&w2);
        assert!(
            l2 < l0 && l2 >= l1 * (1.0 - 1e-6),
            "CG: {l0} -> {l2} (exact {l1})"
        );
    }

    #[test]
    fn gram_term_matches_the_per_element_reference_bitwise() {
        let mut rng = SplitMix64::new(80);
        for (nb, d) in [
            (1, 1),
            (5, 7),
            (6, 16),
            (13, 33),
            (128, 128),
            (7, 40),
            (12, 17),
        ] {
            let v: Vec<f32> = (0..nb * d).map(|_| rng.next_normal() as f32).collect();
            let g: Vec<f32> = (0..d * d).map(|_| rng.next_normal() as f32).collect();
            for alpha0 in [0.0f32, 0.37] {
                let mut q = vec![f32::NAN; nb * d];
                gram_term_body::<false>(&v, &g, &mut q, nb, d, alpha0);
                assert_eq!(
                    q,
                    gram_term_ref::<false>(&v, &g, nb, d, alpha0),
                    "plain {nb}x{d}"
                );
                #[cfg(target_arch = "x86_64")]
                if Isa::detect() == Isa::Avx2Fma {
                    let mut q = vec![f32::NAN; nb * d];
                    // SAFETY: avx2 and fma were detected.
                    unsafe { gram_term_fma_for_test(&v, &g, &mut q, nb, d, alpha0) };
                    assert_eq!(
                        q,
                        gram_term_ref::<true>(&v, &g, nb, d, alpha0),
                        "fma {nb}x{d}"
                    );
                }
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn gram_term_fma_for_test(
        v: &[f32],
        g: &[f32],
        q: &mut [f32],
        nb: usize,
        d: usize,
        a: f32,
    ) {
        gram_term_body::<true>(v, g, q, nb, d, a)
    }

    /// Relative Frobenius distance of two tables.
    fn rel_dist(a: &[f32], b: &[f32]) -> f64 {
        let diff: Vec<f32> = a.iter().zip(b).map(|(x, y)| x - y).collect();
        (dot64(&diff, &diff) / dot64(b, b)).sqrt()
    }

    #[test]
    fn bf16_tables_give_the_f32_result_on_the_widened_table() {
        use crate::bf16::{to_bf16, to_f32 as widen_all, Bf16};
        let d = 20;
        let lens = mixed_lens(90, 300, 700);
        let pb = Problem::new(91, d, 800, &lens);
        let p = pb.params();
        let fb: Vec<Bf16> = to_bf16(&pb.fixed);
        let fw: Vec<f32> = widen_all(&fb);
        // Gramians: bitwise.
        let (gb, gw) = (gramian(&fb, d), gramian(&fw, d));
        assert_eq!(gb, gw);
        assert_eq!(gramian_ref(&fb, d), gramian_ref(&fw, d));
        let g32 = to_f32(&gw);
        let x0 = random_x(92, pb.n_rows() * d, 0.1);
        let rows = pb.rows();
        for plan in [CG_PLAN, SMALL_PLAN] {
            for hub_chunk in [0, 64] {
                for threads in [1, 3] {
                    let run = |table: Either| {
                        let mut x = x0.clone();
                        let l = in_pool(threads, || match table {
                            Either::F(t) => cg_solve_planned(
                                &mut x,
                                rows,
                                t,
                                d,
                                &g32,
                                p,
                                3,
                                hub_chunk,
                                plan,
                                Isa::detect(),
                                true,
                            ),
                            Either::B(t) => cg_solve_planned(
                                &mut x,
                                rows,
                                t,
                                d,
                                &g32,
                                p,
                                3,
                                hub_chunk,
                                plan,
                                Isa::detect(),
                                true,
                            ),
                        });
                        (x, l)
                    };
                    let (xb, lb) = run(Either::B(&fb));
                    let (xw, lw) = run(Either::F(&fw));
                    assert_eq!(
                        xb, xw,
                        "plan {plan:?} hub_chunk {hub_chunk} threads {threads}"
                    );
                    assert_eq!(lb, lw);
                }
            }
        }
        // Exact solve and the loss pass: bitwise.
        let (mut cb, mut cw) = (x0.clone(), x0.clone());
        cholesky_solve(&mut cb, rows, &fb, d, &gw, p).expect("SPD");
        cholesky_solve(&mut cw, rows, &fw, d, &gw, p).expect("SPD");
        assert_eq!(cb, cw);
        assert_eq!(
            local_loss_terms(&cb, rows, &fb, d, p.alpha0, p.n_other),
            local_loss_terms(&cw, rows, &fw, d, p.alpha0, p.n_other)
        );
        // Against the unrounded f32 table: the exact solutions differ by the effect of
        // rounding H to 8 bits of mantissa (relative 2^-9 per entry).
        let mut cf = x0.clone();
        cholesky_solve(&mut cf, rows, &pb.fixed, d, &gramian(&pb.fixed, d), p).expect("SPD");
        let e = rel_dist(&cb, &cf);
        assert!(
            e > 0.0 && e < 2e-2,
            "bf16 vs f32 exact solutions: relative {e}"
        );
        let mut xf = x0.clone();
        cg_solve(
            &mut xf,
            rows,
            &pb.fixed,
            d,
            &to_f32(&gramian(&pb.fixed, d)),
            p,
            3,
            64,
        );
        let mut xb = x0.clone();
        cg_solve(&mut xb, rows, &fb, d, &g32, p, 3, 64);
        let e = rel_dist(&xb, &xf);
        assert!(e > 0.0 && e < 2e-2, "bf16 vs f32 CG: relative {e}");
    }

    #[derive(Clone, Copy)]
    enum Either<'a> {
        F(&'a [f32]),
        B(&'a [crate::bf16::Bf16]),
    }

    #[test]
    fn fused_loss_matches_the_loss_pass() {
        let d = 24;
        let lens = mixed_lens(100, 400, 900);
        let pb = Problem::new(101, d, 700, &lens);
        let p = pb.params();
        let g32 = to_f32(&gramian(&pb.fixed, d));
        let x0 = random_x(102, pb.n_rows() * d, 0.1);
        let rows = pb.rows();
        for steps in [0usize, 1, 3] {
            for (plan, hub_chunk) in [
                (CG_PLAN, 0),
                (CG_PLAN, 64),
                (SMALL_PLAN, 64),
                (SMALL_PLAN, 0),
            ] {
                let run = |threads: usize, loss: bool| {
                    let mut x = x0.clone();
                    let l = in_pool(threads, || {
                        cg_solve_planned(
                            &mut x,
                            rows,
                            &pb.fixed[..],
                            d,
                            &g32,
                            p,
                            steps,
                            hub_chunk,
                            plan,
                            Isa::detect(),
                            loss,
                        )
                    });
                    (x, l)
                };
                let (x, l) = run(1, true);
                // The fused loss does not change the solve; it is thread-count independent.
                assert_eq!(x, run(2, false).0);
                assert_eq!((x.clone(), l), run(3, true));
                if steps == 0 {
                    assert_eq!(x, x0);
                }
                let (obs, reg) = local_loss_terms(&x, rows, &pb.fixed, d, p.alpha0, p.n_other);
                let naive = naive_loss_terms(&pb, &x, p.alpha0);
                assert!(
                    (l.observed - obs).abs() <= 1e-12 * obs,
                    "{} vs {obs}",
                    l.observed
                );
                assert!((l.reg - reg).abs() <= 1e-12 * reg, "{} vs {reg}", l.reg);
                assert!((l.observed - naive.0).abs() <= 1e-9 * naive.0);
                assert!((l.reg - naive.1).abs() <= 1e-9 * naive.1);
            }
        }
    }

    /// CPU seconds (user + system) of this process so far, from /proc (Linux; bench only).
    fn cpu_seconds() -> f64 {
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
        let after_name = stat.rsplit(')').next().unwrap_or("");
        let fields: Vec<&str> = after_name.split_whitespace().collect();
        let ticks = |k: usize| fields.get(k).and_then(|v| v.parse::<f64>().ok());
        (ticks(11).unwrap_or(0.0) + ticks(12).unwrap_or(0.0)) / 100.0
    }

    /// Power-law-ish row lengths (Pareto tail, mean ~10) plus 12 hub rows of 5k-27k.
    fn bench_lens(rng: &mut SplitMix64, n_rows: usize) -> Vec<usize> {
        let mut lens: Vec<usize> = (0..n_rows)
            .map(|_| {
                let u = 1.0 - rng.next_f64();
                ((3.4 * u.powf(-1.0 / 1.5)) as usize).min(20_000)
            })
            .collect();
        for k in 0..12 {
            lens[k * 19_997 + 5] = 5_000 + 2_000 * k;
        }
        lens
    }

    /// CSR over `lens`: uniform random items, or web-graph-like locality (80% of the
    /// items within +-1000 of the row's own id).
    fn bench_csr(
        rng: &mut SplitMix64,
        lens: &[usize],
        n_fixed: usize,
        local: bool,
    ) -> (Vec<u64>, Vec<u32>) {
        let mut indptr = Vec::with_capacity(lens.len() + 1);
        indptr.push(0u64);
        let mut indices = Vec::with_capacity(lens.iter().sum());
        for (u, &n) in lens.iter().enumerate() {
            for _ in 0..n {
                let i = if local && rng.next_f64() < 0.8 {
                    (u + n_fixed + rng.below(2001) as usize - 1000) % n_fixed
                } else {
                    rng.below(n_fixed as u64) as usize
                };
                indices.push(i as u32);
            }
            indptr.push(indices.len() as u64);
        }
        (indptr, indices)
    }

    /// Timing on a cnr-2000-sized problem (240k rows, ~2.5M non-zeros, d = 128, 2 rayon
    /// threads): `cargo test --release --lib als::solve -- --ignored --nocapture`
    /// (with `OPENBLAS_NUM_THREADS=1` for the Cholesky part).
    #[test]
    #[ignore]
    fn bench_cnr2000_sized() {
        use std::time::Instant;
        let (n_rows, n_fixed, d, hub_chunk) = (240_000usize, 240_000usize, 128usize, 1024usize);
        let mut rng = SplitMix64::new(90);
        let lens = bench_lens(&mut rng, n_rows);
        let nnz: usize = lens.iter().sum();
        let hub_nnz: usize = lens.iter().filter(|&&n| n > hub_chunk).sum();
        let max_len = lens.iter().max().copied().unwrap_or(0);
        println!(
            "rows {n_rows}, n_fixed {n_fixed}, d {d}, nnz {nnz}, longest row {max_len}, \
             nnz in rows > {hub_chunk}: {hub_nnz}"
        );
        let scale = 1.0 / (d as f64).sqrt();
        let fixed: Vec<f32> = (0..n_fixed * d)
            .map(|_| ((rng.next_f64() - 0.5) * 3.4 * scale) as f32)
            .collect();
        let x0: Vec<f32> = (0..n_rows * d)
            .map(|_| ((rng.next_f64() - 0.5) * 0.2 * scale) as f32)
            .collect();
        let p = SolveParams {
            reg: 0.01,
            alpha0: 0.01,
            n_other: n_fixed as f64,
        };
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .expect("pool");
        pool.install(|| {
            let mut g = Vec::new();
            for _ in 0..3 {
                let (t, c0) = (Instant::now(), cpu_seconds());
                g = gramian(&fixed, d);
                let (tg, cpu) = (t.elapsed().as_secs_f64(), cpu_seconds() - c0);
                let gf = 2.0 * n_fixed as f64 * (d * d) as f64 * 1e-9;
                println!(
                    "gramian: {tg:.3} s wall, {cpu:.2} s cpu ({:.1} GFlop/s)",
                    gf / tg
                );
            }
            let g32 = to_f32(&g);
            let mut x = x0.clone();
            for local in [false, true] {
                let (indptr, indices) = bench_csr(&mut rng, &lens, n_fixed, local);
                let rows = RowsView {
                    indptr: &indptr,
                    indices: &indices,
                };
                for steps in [3usize, 3, 3, 1] {
                    x.copy_from_slice(&x0);
                    let (t, c0) = (Instant::now(), cpu_seconds());
                    cg_solve(&mut x, rows, &fixed, d, &g32, p, steps, hub_chunk);
                    let (tc, cpu) = (t.elapsed().as_secs_f64(), cpu_seconds() - c0);
                    let mv = (steps + 1) as f64;
                    let gram_gf = mv * 2.0 * n_rows as f64 * (d * d) as f64 * 1e-9;
                    let obs_gf = mv * 4.0 * nnz as f64 * d as f64 * 1e-9;
                    println!(
                        "cg_solve steps={steps} ({} items): {tc:.3} s wall, {cpu:.2} s cpu \
                         ({gram_gf:.1} GFlop Gramian + {obs_gf:.1} GFlop observed: {:.1} GFlop/s)",
                        if local { "local" } else { "uniform" },
                        (gram_gf + obs_gf) / tc
                    );
                    assert!(x.iter().all(|v| v.is_finite()));
                }
                if !local {
                    // Exact solve of the first 20k rows.
                    let sub = RowsView {
                        indptr: &indptr[..20_001],
                        indices: &indices,
                    };
                    let mut xs = x0[..20_000 * d].to_vec();
                    let (t, c0) = (Instant::now(), cpu_seconds());
                    cholesky_solve(&mut xs, sub, &fixed, d, &g, p).expect("SPD");
                    let (tc, cpu) = (t.elapsed().as_secs_f64(), cpu_seconds() - c0);
                    println!("cholesky_solve, 20k rows: {tc:.3} s wall, {cpu:.2} s cpu");
                }
            }
            // Raw rate of the Gramian product, one thread: matrixmultiply (the route of
            // `gemm`) vs ndarray's default route (OpenBLAS in this crate).
            let (b, reps) = (128usize, 1000usize);
            let pm = &x0[..b * d];
            let mut q = vec![0.0f32; b * d];
            let gflop = reps as f64 * 2.0 * (b * d * d) as f64 * 1e-9;
            let (pv, gv) = (view2(pm, b, d), view2(&g32, d, d));
            let t = Instant::now();
            for _ in 0..reps {
                gemm(0.5f32, pv, gv, 0.0, &mut view2_mut(&mut q, b, d));
            }
            let tm = t.elapsed().as_secs_f64();
            let t = Instant::now();
            for _ in 0..reps {
                general_mat_mul(0.5f32, &pv, &gv, 0.0, &mut view2_mut(&mut q, b, d));
            }
            let tb = t.elapsed().as_secs_f64();
            println!(
                "[{b}x{d}]x[{d}x{d}] sgemm, 1 thread: matrixmultiply {:.1} GFlop/s, \
                 ndarray default route (OpenBLAS) {:.1} GFlop/s",
                gflop / tm,
                gflop / tb
            );
        });
    }
}

#[cfg(test)]
mod gram_bench {
    use super::*;

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn gt_fma(v: &[f32], g: &[f32], q: &mut [f32], nb: usize, d: usize, a: f32) {
        gram_term_body::<true>(v, g, q, nb, d, a)
    }

    /// `cargo test --release --features testing --lib gram_bench -- --ignored --nocapture`
    #[test]
    #[ignore]
    fn bench_gram_term() {
        use std::time::Instant;
        let (b, d, reps) = (128usize, 128usize, 2000usize);
        let v: Vec<f32> = (0..b * d)
            .map(|i| ((i * 7919) % 1000) as f32 * 1e-3)
            .collect();
        let g: Vec<f32> = (0..d * d)
            .map(|i| ((i * 104729) % 997) as f32 * 1e-3)
            .collect();
        let mut q = vec![0.0f32; b * d];
        let gflop = reps as f64 * 2.0 * (b * d * d) as f64 * 1e-9;
        let t = Instant::now();
        for _ in 0..reps {
            unsafe { gt_fma(&v, &g, &mut q, b, d, 0.5) };
        }
        let tk = t.elapsed().as_secs_f64();
        let t = Instant::now();
        for _ in 0..reps {
            gemm(
                0.5f32,
                view2(&v, b, d),
                view2(&g, d, d),
                0.0,
                &mut view2_mut(&mut q, b, d),
            );
        }
        let tm = t.elapsed().as_secs_f64();
        println!(
            "gram term [{b}x{d}]x[{d}x{d}]: kernel {:.1} GFlop/s, matrixmultiply {:.1} GFlop/s",
            gflop / tk,
            gflop / tm
        );
    }
}
