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

use rayon::prelude::*;
use std::os::raw::{c_char, c_int};

use super::cg::gram_term_body;
use super::kernels::Isa;

/// Rows per block of [`rotate_rows`] (the unit of parallel work; each block is copied
/// once and multiplied in cache).
const ROTATE_BLOCK: usize = 256;

/// The eigendecomposition of a symmetric `d x d` matrix `g` (row-major, f64): the
/// eigenvectors as the columns of a row-major `d x d` matrix `V` (`g = V diag(l) V^T`,
/// `V` orthogonal) and the eigenvalues `l` in ascending order. LAPACK `dsyevd` (divide
/// and conquer: several times faster than `dsyev`'s QR iteration at d = 128; it runs
/// twice per epoch on one thread), single-threaded: the same input bits give the same
/// output bits. Errors (a LAPACK failure, or a non-finite input) name what failed.
pub fn eigenbasis(g: &[f64], d: usize) -> Result<(Vec<f64>, Vec<f64>), String> {
    assert_eq!(g.len(), d * d, "eigenbasis: g is not d x d");
    if d == 0 {
        return Ok((Vec::new(), Vec::new()));
    }
    if let Some(x) = g.iter().find(|x| !x.is_finite()) {
        return Err(format!("the Gramian holds {x}"));
    }
    crate::cpu::blas_single_thread();
    let n = c_int::try_from(d).map_err(|_| format!("d = {d} is too large for LAPACK"))?;
    let (jobz, uplo) = (b'V' as c_char, b'L' as c_char);
    // `g` is symmetric, so its row-major array is also its column-major one.
    let mut a = g.to_vec();
    let mut w = vec![0.0f64; d];
    // One call of dsyevd on `a` and `w` with the given work arrays; returns `info`.
    let mut syevd = |work: &mut [f64], lwork: c_int, iwork: &mut [c_int], liwork: c_int| {
        let mut info: c_int = 0;
        // SAFETY: `a` is d x d (lda = n), `w` has d values, and `work` / `iwork` hold
        // at least `lwork` / `liwork` values, or one each for the workspace query
        // (lwork = liwork = -1).
        unsafe {
            dsyevd_(
                &jobz,
                &uplo,
                &n,
                a.as_mut_ptr(),
                &n,
                w.as_mut_ptr(),
                work.as_mut_ptr(),
                &lwork,
                iwork.as_mut_ptr(),
                &liwork,
                &mut info,
            );
        }
        info
    };
    let (mut work_len, mut iwork_len) = ([0.0f64], [0 as c_int]);
    let info = syevd(&mut work_len, -1, &mut iwork_len, -1);
    if info != 0 {
        return Err(format!(
            "the eigendecomposition's workspace query failed (info {info})"
        ));
    }
    let lwork = (work_len[0] as c_int).max(1);
    let liwork = iwork_len[0].max(1);
    let mut work = vec![0.0f64; lwork as usize];
    let mut iwork: Vec<c_int> = vec![0; liwork as usize];
    let info = syevd(&mut work, lwork, &mut iwork, liwork);
    if info != 0 {
        return Err(format!(
            "the eigendecomposition of the Gramian failed (LAPACK dsyevd info {info})"
        ));
    }
    // Column j of the column-major result is eigenvector j: row-major, that is V^T.
    Ok((transpose64(&a, d), w))
}

extern "C" {
    fn dsyevd_(
        jobz: *const c_char,
        uplo: *const c_char,
        n: *const c_int,
        a: *mut f64,
        lda: *const c_int,
        w: *mut f64,
        work: *mut f64,
        lwork: *const c_int,
        iwork: *mut c_int,
        liwork: *const c_int,
        info: *mut c_int,
    );
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
