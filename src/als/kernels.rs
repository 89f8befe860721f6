//! The solve kernels as the training loop calls them, generic over the tables' element
//! type. TEMPORARY shim: widens a bf16 table to f32 before calling the f32 kernels of
//! [`super::solve`]; replaced by the kernels' own generic versions.

use super::solve::{self, RowsView, SolveError, SolveParams};
use crate::bf16::TableElem;
use std::borrow::Cow;

pub use super::solve::all_pairs_term;

fn f32s<T: TableElem>(t: &[T]) -> Cow<'_, [f32]> {
    match T::as_f32(t) {
        Some(x) => Cow::Borrowed(x),
        None => Cow::Owned(crate::bf16::to_f32(t)),
    }
}

pub fn gramian<T: TableElem>(table: &[T], d: usize) -> Vec<f64> {
    solve::gramian(&f32s(table), d)
}

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
    solve::cg_solve(x, rows, &f32s(fixed), d, gram, p, steps, hub_chunk)
}

pub fn cholesky_solve<T: TableElem>(
    x: &mut [f32],
    rows: RowsView,
    fixed: &[T],
    d: usize,
    gram: &[f64],
    p: SolveParams,
) -> Result<(), SolveError> {
    solve::cholesky_solve(x, rows, &f32s(fixed), d, gram, p)
}

pub fn local_loss_terms<T: TableElem>(
    x: &[T],
    rows: RowsView,
    fixed: &[T],
    d: usize,
    alpha0: f32,
    n_other: f64,
) -> (f64, f64) {
    solve::local_loss_terms(&f32s(x), rows, &f32s(fixed), d, alpha0, n_other)
}
