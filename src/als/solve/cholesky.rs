//! Exact solve.

use ndarray::{Array1, Array2, ArrayView2, ShapeBuilder};
use ndarray_linalg::{FactorizeCInto, SolveC, UPLO};
use rayon::prelude::*;

use super::kernels::{gemm, view2};
use super::{check_indices, RowsView, SolveError, SolveParams};
use crate::bf16::TableElem;

/// Items per f64 gemm when forming `A_u` (bounds the gather buffer of a hub row).
pub(super) const CHOL_CHUNK: usize = 256;

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
    if let Some(w) = rows.weights {
        assert_eq!(
            w.len(),
            rows.indices.len(),
            "cholesky_solve: weights beside indices"
        );
    }
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
    if let Some(wts) = rows.weights {
        // A_u += sum_i c_ui h_i h_i^T, b_u += sum_i c_ui h_i (in f64).
        let wts = &wts[rows.range(u)];
        let mut cbuf = Vec::new();
        for (chunk, cw) in idx.chunks(CHOL_CHUNK).zip(wts.chunks(CHOL_CHUNK)) {
            buf.clear();
            cbuf.clear();
            for (&i, &c) in chunk.iter().zip(cw) {
                let h = &fixed[i as usize * d..][..d];
                let c = f64::from(c);
                buf.extend(h.iter().map(|&v| f64::from(v.to_f32())));
                cbuf.extend(h.iter().map(|&v| c * f64::from(v.to_f32())));
                for (bv, &hv) in b.iter_mut().zip(h) {
                    *bv += c * f64::from(hv.to_f32());
                }
            }
            let hv = view2(buf, chunk.len(), d);
            let ch = view2(&cbuf, chunk.len(), d);
            gemm(1.0, ch.t(), hv, 1.0, &mut a.view_mut());
        }
    } else {
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
