//! Solving one run of rows with the configured solver (CG, with or without its fused
//! loss pieces, or Cholesky), through an f32 copy for bf16 tables, and the check that
//! every solved value is finite.

use crate::als::solve::{
    cg_solve, cg_solve_with_loss, cholesky_solve, LossTerms, RowsView, SolveError, SolveParams,
};
use crate::als::{AlsConfig, SolverKind};
use crate::bf16::TableElem;

/// Whether every value is finite (in parallel; a branch-free scan per block).
pub(super) fn all_finite(x: &[f32]) -> bool {
    use rayon::prelude::*;
    x.par_chunks(1 << 16)
        .all(|c| c.iter().fold(true, |ok, v| ok & v.is_finite()))
}

/// Solve the rows of `out` (a run of the solved table in its element type): in place
/// for f32; through an f32 copy, rounded back once, for bf16.
pub(super) fn solve_rows<T: TableElem>(
    out: &mut [T],
    scratch: &mut Vec<f32>,
    f: impl FnOnce(&mut [f32]),
) {
    if let Some(x) = T::as_f32_mut(out) {
        f(x);
        return;
    }
    scratch.clear();
    scratch.extend(out.iter().map(|v| v.to_f32()));
    f(scratch);
    crate::bf16::narrow(scratch, out);
}

/// Solve one run of rows (`out`, in the solved table's element type) against the
/// gathered `fixed` rows with the configured solver, adding CG's loss pieces to
/// `fused` when it is kept. Returns whether every value is finite, and Cholesky's
/// error. `nan` plants a NaN (fault injection).
#[allow(clippy::too_many_arguments)]
pub(super) fn solve_range<T: TableElem>(
    cfg: &AlsConfig,
    out: &mut [T],
    scratch: &mut Vec<f32>,
    view: RowsView,
    fixed: &[T],
    g32: &[f32],
    gram_fixed: &[f64],
    params: SolveParams,
    nan: bool,
    fused: &mut Option<LossTerms>,
) -> (bool, std::result::Result<(), SolveError>) {
    let d = cfg.dim;
    let (solver, cg_steps, hub_chunk) = (cfg.solver, cfg.cg_steps, cfg.hub_chunk);
    let mut finite = true;
    let mut solve_err = Ok(());
    let keep = fused.is_some();
    let mut terms = LossTerms::default();
    solve_rows(out, scratch, |x| {
        match solver {
            SolverKind::Cg if keep => {
                terms = cg_solve_with_loss(x, view, fixed, d, g32, params, cg_steps, hub_chunk);
            }
            SolverKind::Cg => cg_solve(x, view, fixed, d, g32, params, cg_steps, hub_chunk),
            SolverKind::Cholesky => {
                solve_err = cholesky_solve(x, view, fixed, d, gram_fixed, params);
            }
        }
        if nan && !x.is_empty() {
            x[0] = f32::NAN;
        }
        finite = all_finite(x);
    });
    if let Some(acc) = fused {
        acc.observed += terms.observed;
        acc.reg += terms.reg;
    }
    (finite, solve_err)
}
