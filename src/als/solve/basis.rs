//! The eigenbasis of the fixed side's Gramian.
//!
//! The model `(W, H)` and the iALS objective are invariant under one orthogonal change
//! of basis `Q` applied to both tables (`w.h = (w Q).(h Q)`, `|w Q| = |w|`,
//! `(H Q)^T (H Q) = Q^T G Q`), and CG is equivariant under it. Rotating both tables into
//! the eigenbasis of `G = H^T H` before a half-epoch makes the fixed side's Gramian
//! diagonal, so every CG matvec's Gramian term costs `d` multiplies per row instead of
//! a `d x d` product: with `s` CG steps a solved row costs one rotation instead of `s + 1`
//! Gramian products, and each fixed row one rotation. The trainer keeps the accumulated
//! rotation and turns the tables back into the starting basis when training ends.

use ndarray::Array2;
use ndarray_linalg::{Eigh, UPLO};
use rayon::prelude::*;

use super::cg::gram_term_body;
use super::kernels::Isa;

/// Rows per block of [`rotate_rows`] (the unit of parallel work; each block is copied
/// once and multiplied in cache).
const ROTATE_BLOCK: usize = 256;

/// The eigendecomposition of a symmetric `d x d` matrix `g` (row-major, f64): the
/// eigenvectors as the columns of a row-major `d x d` matrix `V` (`g = V diag(l) V^T`,
/// `V` orthogonal) and the eigenvalues `l` in ascending order. LAPACK `syev` on the
/// lower triangle, single-threaded: the same input bits give the same output bits.
/// Errors (a LAPACK failure, or a non-finite input) name what failed.
pub fn eigenbasis(g: &[f64], d: usize) -> Result<(Vec<f64>, Vec<f64>), String> {
    assert_eq!(g.len(), d * d, "eigenbasis: g is not d x d");
    if d == 0 {
        return Ok((Vec::new(), Vec::new()));
    }
    if let Some(x) = g.iter().find(|x| !x.is_finite()) {
        return Err(format!("the Gramian holds {x}"));
    }
    crate::blas_single_thread();
    let a = Array2::from_shape_vec((d, d), g.to_vec()).expect("invariant: d x d");
    let (vals, vecs) = a
        .eigh(UPLO::Lower)
        .map_err(|e| format!("eigendecomposition of the Gramian failed: {e}"))?;
    let v: Vec<f64> = vecs.iter().copied().collect();
    Ok((v, vals.to_vec()))
}

/// `table <- table M` in place for a row-major `n x d` f32 table and a row-major
/// `d x d` f32 matrix `m`: each new element is one fused multiply-add chain over
/// `k = 0..d` in order (the Gramian term's kernel with weight 1), so the result does not
/// depend on the thread count. In parallel over blocks of rows.
pub fn rotate_rows(table: &mut [f32], d: usize, m: &[f32]) {
    if d == 0 {
        return;
    }
    assert_eq!(m.len(), d * d, "rotate_rows: m is not d x d");
    assert_eq!(table.len() % d, 0, "rotate_rows: table is not n x d");
    let isa = Isa::detect();
    table
        .par_chunks_mut(ROTATE_BLOCK * d)
        .for_each_init(Vec::new, |copy: &mut Vec<f32>, block| {
            copy.clear();
            copy.extend_from_slice(block);
            let nb = block.len() / d;
            match isa {
                Isa::Plain => gram_term_body::<false>(copy, m, block, nb, d, 1.0),
                #[cfg(target_arch = "x86_64")]
                _ => gram_term_body::<true>(copy, m, block, nb, d, 1.0),
            }
        });
}

/// `a b` for row-major `d x d` f64 matrices (the accumulated rotation; `d^3` is small).
pub fn matmul64(a: &[f64], b: &[f64], d: usize) -> Vec<f64> {
    let mut c = vec![0.0f64; d * d];
    for i in 0..d {
        for k in 0..d {
            let aik = a[i * d + k];
            for (cj, &bkj) in c[i * d..][..d].iter_mut().zip(&b[k * d..][..d]) {
                *cj += aik * bkj;
            }
        }
    }
    c
}

/// The transpose of a row-major `d x d` matrix.
pub fn transpose64(a: &[f64], d: usize) -> Vec<f64> {
    let mut t = vec![0.0f64; d * d];
    for i in 0..d {
        for j in 0..d {
            t[j * d + i] = a[i * d + j];
        }
    }
    t
}
