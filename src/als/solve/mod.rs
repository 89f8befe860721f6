//! Numeric kernels of one iALS half-epoch (ALX / Rendle): the Gramian of the fixed
//! table, the batched conjugate-gradient solve, the exact Cholesky solve, and the pieces
//! of the exact loss.
//!
//! Solving the rows `u` of one side against the fixed other side `H` (`n_other x d`):
//!
//! ```text
//! A_u = sum_{i in I_u} c_ui h_i h_i^T + alpha0 * G + lambda * (|I_u| + alpha0 * n_other) * I
//! b_u = sum_{i in I_u} c_ui h_i,        w_u = A_u^{-1} b_u,        G = H^T H
//! ```
//!
//! with the confidences `c_ui` of [`RowsView::weights`] (all 1 when `None`, the binary
//! objective, whose code path is unchanged).
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
//! register-blocked kernel of this module ([`cg::gram_term_body`]) whose per-element summation
//! order is fixed (k = 0..d in order), so each row's result does not depend on the
//! batch it is in. The Cholesky `A_u` products go through [`kernels::gemm`], which routes them to
//! the pure-Rust `matrixmultiply` kernels (single-threaded, fixed summation order)
//! rather than to OpenBLAS: this crate enables ndarray's `blas` feature (through
//! ndarray-linalg), so a plain `general_mat_mul` on contiguous f32/f64 arrays would call
//! `cblas_sgemm`, whose own thread pool would fight rayon's unless
//! `OPENBLAS_NUM_THREADS=1` is set. [`cholesky_solve`] calls LAPACK (`potrf`/`potrs` of
//! ndarray-linalg) and [`gramian`] calls `cblas_dsyrk`, both kept single-threaded.
//!
//! The files, one per operation:
//!
//! - `mod.rs`: the public types ([`SolveParams`], [`RowsView`], [`SolveError`],
//!   [`LossTerms`]) and the re-exports of the public functions.
//! - `kernels.rs`: the matrix product and small vector kernels (f32 dot products and
//!   multiply-adds, the observed term over gathered or indexed items, the instruction
//!   set detection, prefetch, widening of table rows, the f64 dot product).
//! - `gramian.rs`: the Gramian of the fixed table ([`gramian`], [`gramian_ref`]).
//! - `cg.rs`: the batched conjugate gradient ([`cg_solve`], [`cg_solve_with_loss`]): the
//!   batch plan, scratch, the register-blocked Gramian term kernels, one batch's CG.
//! - `basis.rs`: the eigenbasis of the fixed side's Gramian ([`eigenbasis`]) and the
//!   rotation of a table into it ([`rotate_rows`]), which makes the Gramian term diagonal.
//! - `cholesky.rs`: the exact solve ([`cholesky_solve`]).
//! - `loss.rs`: the pieces of the exact loss ([`local_loss_terms`], [`all_pairs_term`]).
//! - `tests.rs`: the unit tests (kernels against slow references, CG against Cholesky).
//!
//! [`TableElem`]: crate::bf16::TableElem

use std::ops::Range;

mod basis;
mod cg;
mod cholesky;
mod gramian;
mod kernels;
mod loss;
#[cfg(test)]
mod tests;

pub use basis::{eigenbasis, matmul64, rotate_rows, transpose64};
pub use cg::{cg_solve, cg_solve_with_loss, GATHER_FLOATS, LONG_GATHER_FLOATS};
pub use cholesky::cholesky_solve;
pub use gramian::{gramian, gramian_ref};
pub use loss::{
    add_loss_terms_to_chunks, all_pairs_term, fold_loss_chunks, local_loss_terms,
    local_loss_terms_from, LOSS_CHUNK,
};

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
    /// The confidence `c_ui` beside each index (same positions as `indices`), or
    /// `None`: every confidence 1, the binary objective's code path, bit for bit.
    pub weights: Option<&'a [f32]>,
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

    /// The confidences of row `r`'s indices (after [`RowsView::validate`]).
    #[inline]
    fn row_weights(&self, r: usize) -> Option<&[f32]> {
        self.weights.map(|w| &w[self.range(r)])
    }

    /// Checks the CSR invariants and that every index is below `n_fixed`.
    /// Returns the first bad row and what is wrong with it.
    fn validate(&self, n_fixed: usize) -> Result<(), (usize, String)> {
        if let Some(w) = self.weights {
            if w.len() != self.indices.len() {
                return Err((
                    0,
                    format!("{} weights beside {} indices", w.len(), self.indices.len()),
                ));
            }
        }
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
/// The loss pieces of a set of solved rows (see [`local_loss_terms`]), in f64.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LossTerms {
    /// `sum_{u, i in I_u} c_ui (1 - w_u . h_i)^2`.
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
