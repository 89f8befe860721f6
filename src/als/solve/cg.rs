//! Conjugate gradient.

use rayon::prelude::*;

use super::kernels::{
    as_f32, dot64, madd, observed, observed_body, prefetch_rows, widen_row, Gathered, Indexed, Isa,
    PREFETCH_AHEAD,
};
use super::loss::local_loss_terms;
use super::{LossTerms, RowsView, SolveParams};
use crate::bf16::TableElem;

/// How the rows are cut into batches (fixed by the input alone).
#[derive(Debug, Clone, Copy)]
pub(super) struct Plan {
    /// Most rows in one batch (the `B` of the `[B x d] x [d x d]` Gramian product).
    pub(super) batch_rows: usize,
    /// Most floats of item vectors gathered for one batch of several rows; a row with
    /// more items than fit is a batch on its own.
    pub(super) gather_floats: usize,
    /// Most floats of item vectors gathered for a batch of one long row; a longer row
    /// of an f32 table reads the table in place at every step (a bf16 table is always
    /// widened into a copy).
    pub(super) long_gather_floats: usize,
}

pub(super) const CG_PLAN: Plan = Plan {
    batch_rows: 128,
    gather_floats: GATHER_FLOATS,
    long_gather_floats: LONG_GATHER_FLOATS,
};

/// [`Plan::gather_floats`] of the solves (512 KiB of f32 per thread).
pub const GATHER_FLOATS: usize = 1 << 17;

/// [`Plan::long_gather_floats`] of the solves (64 MiB of f32 per thread).
pub const LONG_GATHER_FLOATS: usize = 1 << 24;

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
            // A long row is still gathered once (read from the table once, then
            // streamed from the contiguous copy by every step) unless the copy would
            // pass `long_gather_floats`; such a row is read in place at every step.
            out.push(Batch {
                r0: r,
                r1: r + 1,
                gathered: n * d <= plan.long_gather_floats,
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

thread_local! {
    /// Each thread's batch scratch, kept across solves: a half-epoch runs many solves
    /// (one per step), and a fresh scratch would fault its pages in again every time
    /// (up to [`LONG_GATHER_FLOATS`] floats for a long row).
    static SCRATCH: std::cell::RefCell<CgScratch> = std::cell::RefCell::new(CgScratch::default());
    /// A hub chunk of a bf16 table widened to f32 (`hub_chunk x d`).
    static CHUNK: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Per-batch scratch, reused across the batches a thread runs.
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
        b.gathered || (self.fixed32.is_none() && !self.chunk_widened(b))
    }

    /// Whether batch `b` is a lone hub row too long to gather of a non-f32 table: its
    /// items are widened one hub chunk at a time, inside the chunks' parallel work
    /// (the same values and arithmetic as a widened copy of the whole row, in bounded
    /// memory).
    fn chunk_widened(&self, b: Batch) -> bool {
        !b.gathered
            && self.fixed32.is_none()
            && self.hub_chunk > 0
            && self.rows.range(b.r0).len() > self.hub_chunk
    }
}

/// Stop a row once `|r|^2 <= CG_TOL2 * |r_0|^2`: the residual is at the f32 rounding
/// level of the starting one and further steps would only add noise.
const CG_TOL2: f64 = (f32::EPSILON as f64) * (f32::EPSILON as f64);

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
/// `gram` is the symmetric `G` as f32: `d * d`, or `d` (its diagonal) when `G` is
/// diagonal in the tables' basis ([`super::basis`]). Panics if the shapes disagree (`x.len() != rows * d`,
/// `fixed.len()` not a multiple of `d`, `gram` neither `d * d` nor `d`) or if `rows` is not a
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
pub(super) fn cg_solve_planned<T: TableElem>(
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
    assert!(
        gram.len() == d * d || gram.len() == d,
        "cg_solve: gram is neither d x d nor its diagonal"
    );
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
        .map(|(b, xb)| {
            SCRATCH.with(|cell| match cell.try_borrow_mut() {
                Ok(mut s) => cg_batch(&shared, b, xb, &mut s),
                // A batch that rayon started on this thread while it waited inside
                // another batch's parallel hub row: a scratch of its own.
                Err(_) => cg_batch(&shared, b, xb, &mut CgScratch::default()),
            })
        })
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
    let wts = sh.rows.row_weights(u);
    // The confidences of hub chunk `k` (the same cut as the items').
    let chunk_w =
        |k: usize| wts.map(|w| &w[k * sh.hub_chunk..((k + 1) * sh.hub_chunk).min(w.len())]);
    match sh.fixed32 {
        _ if sh.widened(b) => {
            let base = sh.rows.range(b.r0).start;
            let g = &gathered[(range.start - base) * d..(range.end - base) * d];
            if !hub {
                observed_body::<FMA>(&Gathered { buf: g, d }, v, out, wts, c, s);
                return;
            }
            // Hub row: chunks of `hub_chunk` items in parallel, partial sums added in
            // order (the same arithmetic as the in-place chunks below).
            partial.resize(n_chunks * d, 0.0);
            partial
                .par_chunks_mut(d)
                .zip(g.par_chunks(sh.hub_chunk * d))
                .enumerate()
                .for_each(|(k, (part, chunk))| {
                    part.fill(0.0);
                    let items = Gathered { buf: chunk, d };
                    observed(sh.isa, &items, v, part, chunk_w(k), c, s);
                });
        }
        Some(fixed) => {
            let idx = &sh.rows.indices[range];
            if !hub {
                observed_body::<FMA>(&Indexed { idx, fixed, d }, v, out, wts, c, s);
                return;
            }
            partial.resize(n_chunks * d, 0.0);
            partial
                .par_chunks_mut(d)
                .zip(idx.par_chunks(sh.hub_chunk))
                .enumerate()
                .for_each(|(k, (part, chunk))| {
                    part.fill(0.0);
                    let items = Indexed {
                        idx: chunk,
                        fixed,
                        d,
                    };
                    observed(sh.isa, &items, v, part, chunk_w(k), c, s);
                });
        }
        None => {
            // A hub row of a bf16 table too long to gather: each chunk widened apart.
            let idx = &sh.rows.indices[range];
            partial.resize(n_chunks * d, 0.0);
            partial
                .par_chunks_mut(d)
                .zip(idx.par_chunks(sh.hub_chunk))
                .enumerate()
                .for_each(|(k, (part, chunk))| {
                    part.fill(0.0);
                    CHUNK.with(|buf| {
                        let mut buf = buf.borrow_mut();
                        buf.resize(chunk.len() * d, 0.0);
                        // The rows are read at random, as the gathers above: prefetched
                        // a few ahead.
                        for (k, h) in buf.chunks_exact_mut(d).enumerate() {
                            if let Some(&a) = chunk.get(k + PREFETCH_AHEAD) {
                                prefetch_rows(&sh.fixed[a as usize * d..][..d]);
                            }
                            widen_row(&sh.fixed[chunk[k] as usize * d..][..d], h);
                        }
                        observed(
                            sh.isa,
                            &Gathered { buf: &buf, d },
                            v,
                            part,
                            chunk_w(k),
                            c,
                            s,
                        );
                    });
                });
        }
    }
    for part in partial.chunks_exact(d) {
        for (o, &pv) in out.iter_mut().zip(part) {
            *o += pv;
        }
    }
}

/// The rows `from..nb` left after the full register blocks, cut greedily into blocks of
/// the `sizes` (largest first, ending with 1): `(first row, rows)`. A batch of long rows
/// has only a few rows, and one-row blocks would load `G` once per row.
fn tail_blocks(from: usize, nb: usize, sizes: &[usize]) -> Vec<(usize, usize)> {
    let mut r0 = from;
    let mut out = Vec::with_capacity(sizes.len());
    for &size in sizes {
        if nb.saturating_sub(r0) >= size {
            out.push((r0, size));
            r0 += size;
        }
    }
    out
}

/// Rows per register block of the Gramian term (AVX2 kernel).
const GT_ROWS: usize = 6;
/// Columns per register block of the Gramian term (two 8-float vectors).
const GT_COLS: usize = 16;

/// `q = alpha0 * v G` for the first `nb` rows of `v` (`G` a `d x d` matrix, or its
/// diagonal when `g.len() == d`): `q[r, c] = alpha0 * s` with `s` one multiply-add chain
/// `s = v[r, k] * G[k, c] + s` over `k = 0..d` in order from 0 (fused when `FMA`; for a
/// diagonal `G` the chain is the one product `v[r, c] * G[c, c]`). The arithmetic of an
/// element does not depend on `nb` or on the other rows, so a row gets the same bits in
/// any batch.
#[inline(always)]
pub(super) fn gram_term_body<const FMA: bool>(
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
    assert!(v.len() >= nb * d && q.len() >= nb * d);
    if g.len() != d * d {
        // A diagonal G (the tables are in the eigenbasis of the Gramian: see
        // `basis.rs`): `g` holds the diagonal, and the chain above has one term.
        assert_eq!(g.len(), d, "gram_term: G is neither d x d nor its diagonal");
        for (vr, qr) in v[..nb * d].chunks_exact(d).zip(q.chunks_exact_mut(d)) {
            for ((o, &x), &gc) in qr.iter_mut().zip(vr).zip(g) {
                *o = alpha0 * (x * gc);
            }
        }
        return;
    }
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
    let tail = tail_blocks(full_r, nb, &[3, 2, 1]);
    for c0 in (0..full_c).step_by(GT_COLS) {
        for r0 in (0..full_r).step_by(GT_ROWS) {
            gram_block_avx2::<GT_ROWS>(v, g, q, r0, c0, d, alpha0);
        }
        for &(r0, rows) in &tail {
            match rows {
                3 => gram_block_avx2::<3>(v, g, q, r0, c0, d, alpha0),
                2 => gram_block_avx2::<2>(v, g, q, r0, c0, d, alpha0),
                _ => gram_block_avx2::<1>(v, g, q, r0, c0, d, alpha0),
            }
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
    let tail = tail_blocks(full_r, nb, &[4, 2, 1]);
    for c0 in (0..full_c).step_by(GT512_COLS) {
        for r0 in (0..full_r).step_by(GT512_ROWS) {
            gram_block_avx512::<GT512_ROWS>(v, g, q, r0, c0, d, alpha0);
        }
        for &(r0, rows) in &tail {
            match rows {
                4 => gram_block_avx512::<4>(v, g, q, r0, c0, d, alpha0),
                2 => gram_block_avx512::<2>(v, g, q, r0, c0, d, alpha0),
                _ => gram_block_avx512::<1>(v, g, q, r0, c0, d, alpha0),
            }
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
pub(super) fn gram_term_ref<const FMA: bool>(
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
        // SAFETY: `Isa::Avx512Fma` is only constructed after detecting its features.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512Fma => unsafe { cg_batch_avx512(sh, b, xb, s) },
        Isa::Plain => cg_batch_body::<false, T>(sh, b, xb, s),
    }
}

/// [`cg_batch_body`] compiled with AVX-512: the same arithmetic, so the same bits.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
#[allow(clippy::incompatible_msrv)]
unsafe fn cg_batch_avx512<T: TableElem>(
    sh: &CgShared<T>,
    b: Batch,
    xb: &mut [f32],
    s: &mut CgScratch,
) -> LossTerms {
    cg_batch_body::<true, T>(sh, b, xb, s)
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
        // Grown to the size asked, not doubled: the memory estimate counts one long
        // row's copy per thread, not twice that.
        let n = idx_all.len() * d;
        if n > s.gathered.capacity() {
            crate::allocs::regrow_exact(&mut s.gathered, n.max(GATHER_FLOATS));
        }
        s.gathered.resize(n, 0.0);
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
        let wts = sh.rows.row_weights(b.r0 + j);
        // The confidence of item `k` of the row (1 when unweighted: `c * e * e` is
        // then `e * e`, bit for bit).
        let c = |k: usize| wts.map_or(1.0, |w| f64::from(w[k]));
        match sh.fixed32 {
            _ if sh.widened(b) => {
                let g = &gathered[(range.start - base) * d..(range.end - base) * d];
                for (k, h) in g.chunks_exact(d).enumerate() {
                    let e = 1.0 - dot64(w, h);
                    obs += c(k) * e * e;
                }
            }
            Some(fixed) => {
                for (k, &i) in sh.rows.indices[range].iter().enumerate() {
                    let e = 1.0 - dot64(w, &fixed[i as usize * d..][..d]);
                    obs += c(k) * e * e;
                }
            }
            None => {
                let mut h = vec![0f32; d];
                let idx = &sh.rows.indices[range];
                for (k, &i) in idx.iter().enumerate() {
                    if let Some(&a) = idx.get(k + PREFETCH_AHEAD) {
                        prefetch_rows(&sh.fixed[a as usize * d..][..d]);
                    }
                    widen_row(&sh.fixed[i as usize * d..][..d], &mut h);
                    let e = 1.0 - dot64(w, &h);
                    obs += c(k) * e * e;
                }
            }
        }
        reg += (n as f64 + f64::from(sh.p.alpha0) * sh.p.n_other) * dot64(w, w);
    }
    LossTerms { observed: obs, reg }
}
