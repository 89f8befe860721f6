//! The exact loss after a half: its observed and regularization pieces (fused into the
//! CG solves, per step, or by a separate pass over the observed cells in memory or
//! spilled), the fixed side's norms, and their all-reduced assembly with the
//! all-pairs term.

use super::side::Side;
use crate::als::shard::csr::CsrShard;
use crate::als::solve::{
    all_pairs_term, local_loss_terms, local_loss_terms_from, RowsView, SolveParams,
};
use crate::bf16::TableElem;
use crate::comm::Comm;
use crate::error::Result;

/// Rows per block of the loss pass over a solved shard ([`loss_pass`]).
pub(super) const LOSS_BLOCK: usize = 1 << 14;

/// `sum_u (|I_u| + alpha0 n_other) |x_u|^2` over a table shard: in parallel over blocks
/// of a fixed size whose sums are added in block order (the same bits at any thread
/// count).
pub(super) fn reg_norms<T: TableElem>(
    table: &[T],
    counts: &[u32],
    d: usize,
    alpha0: f32,
    n_other: f64,
) -> f64 {
    use rayon::prelude::*;
    pub(super) const BLOCK: usize = 4096;
    let parts: Vec<f64> = table
        .par_chunks(BLOCK * d.max(1))
        .zip(counts.par_chunks(BLOCK))
        .map(|(rows, counts)| {
            rows.chunks_exact(d)
                .zip(counts)
                .map(|(x, &c)| (c as f64 + alpha0 as f64 * n_other) * sq_norm64(x))
                .sum()
        })
        .collect();
    parts.into_iter().sum()
}

/// `|x|^2` in f64 (products of f32 values are exact in f64), over 8 lanes so that it
/// vectorizes; the lanes are added in a fixed order.
pub(super) fn sq_norm64<T: TableElem>(x: &[T]) -> f64 {
    let mut acc = [0.0f64; 8];
    let mut chunks = x.chunks_exact(8);
    for c in &mut chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            let f = f64::from(v.to_f32());
            *a += f * f;
        }
    }
    for (a, &v) in acc.iter_mut().zip(chunks.remainder()) {
        let f = f64::from(v.to_f32());
        *a += f * f;
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]))
}

/// The loss pieces of a solved table shard by a separate pass over its observed cells
/// (bf16 rows widened a block at a time, so memory stays bounded).
pub(super) fn loss_pass<T: TableElem, U: TableElem>(
    solved: &[U],
    shard: &CsrShard,
    fixed: &[T],
    d: usize,
    params: SolveParams,
) -> (f64, f64) {
    let view = |r0: usize, r1: usize| RowsView {
        indptr: &shard.indptr[r0..=r1],
        indices: &shard.indices,
        weights: shard.weights(),
    };
    let n = shard.num_rows();
    if let Some(x) = U::as_f32(solved) {
        return local_loss_terms(x, view(0, n), fixed, d, params.alpha0, params.n_other);
    }
    let mut buf = Vec::new();
    let mut acc = (0.0, 0.0);
    for r0 in (0..n).step_by(LOSS_BLOCK) {
        let r1 = (r0 + LOSS_BLOCK).min(n);
        buf.clear();
        buf.extend(solved[r0 * d..r1 * d].iter().map(|v| v.to_f32()));
        let (o, r) = local_loss_terms(&buf, view(r0, r1), fixed, d, params.alpha0, params.n_other);
        acc.0 += o;
        acc.1 += r;
    }
    acc
}

/// Rank-local: the loss pieces of a spilled side gathered once (`solved` its table,
/// `fixed` the gathered rows), as [`loss_pass`] computes them in memory (blocks of
/// 16,384 rows; f32 terms folded chunk by chunk across blocks), so the loss has the
/// same bits.
pub(super) fn local_loss_pass_spilled<T: TableElem>(
    side: &Side,
    solved: &[T],
    fixed: &[T],
    d: usize,
    params: SolveParams,
) -> Result<(f64, f64)> {
    let n = side.shard.num_rows();
    let mut acc = (0.0, 0.0);
    let mut buf = Vec::new();
    for r0 in (0..n).step_by(LOSS_BLOCK) {
        let r1 = (r0 + LOSS_BLOCK).min(n);
        let (ip, indices) = side.read_rows(r0, r1)?;
        let view = RowsView {
            indptr: &ip,
            indices: &indices,
            weights: None,
        };
        let rows = &solved[r0 * d..r1 * d];
        match T::as_f32(rows) {
            Some(x) => {
                acc = local_loss_terms_from(acc, x, view, fixed, d, params.alpha0, params.n_other)
            }
            None => {
                buf.clear();
                buf.extend(rows.iter().map(|v| v.to_f32()));
                let (o, r) = local_loss_terms(&buf, view, fixed, d, params.alpha0, params.n_other);
                acc.0 += o;
                acc.1 += r;
            }
        }
    }
    Ok(acc)
}

/// Collective: every rank must call. The loss after a half from this rank's pieces of
/// the solved side (`obs`, `reg_solved`): the fixed side's regularization norms added,
/// both all-reduced, and the all-pairs term of the two Gramians (`n_solved` rows on
/// the solved side).
#[allow(clippy::too_many_arguments)]
pub(super) fn global_assemble_loss<C: Comm, T: TableElem>(
    comm: &C,
    (obs, reg_solved): (f64, f64),
    fixed_local: &[T],
    fixed_counts: &[u32],
    n_solved: u64,
    gram_solved: &[f64],
    gram_fixed: &[f64],
    d: usize,
    params: SolveParams,
    reg: f32,
) -> f64 {
    let reg_fixed = reg_norms(fixed_local, fixed_counts, d, params.alpha0, n_solved as f64);
    let mut parts = [obs, reg_solved + reg_fixed];
    {
        let _p = comm.stats().phase("loss");
        comm.all_reduce_sum(&mut parts);
    }
    parts[0]
        + params.alpha0 as f64 * all_pairs_term(gram_solved, gram_fixed, d)
        + reg as f64 * parts[1]
}
