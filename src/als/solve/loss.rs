//! Loss pieces.

use rayon::prelude::*;

use super::kernels::dot64;
use super::RowsView;
use crate::bf16::TableElem;

/// Rows per unit of work of [`local_loss_terms`] (fixed, so the sum order is fixed).
pub const LOSS_CHUNK: usize = 1024;

/// Loss pieces of the rows just solved, all in f64:
/// `(sum_{u, i in I_u} c_ui (1 - w_u . h_i)^2, sum_u (|I_u| + alpha0 * n_other) * |w_u|^2)`
/// (`c_ui` the confidences of `rows.weights`, 1 when `None`).
///
/// The fixed table may be f32 or bf16 (widened exactly). The regularization piece is
/// not multiplied by `lambda`. [`cg_solve_with_loss`](super::cg_solve_with_loss) computes the same pieces during the
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
    local_loss_terms_from((0.0, 0.0), x, rows, fixed, d, alpha0, n_other)
}

/// [`local_loss_terms`] added to `init` chunk by chunk: the terms of consecutive row
/// blocks (each a multiple of [`LOSS_CHUNK`] rows but the last) folded through this
/// have the bits of one call over all of them.
pub fn local_loss_terms_from<T: TableElem>(
    init: (f64, f64),
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
        // Every prediction is 0: each observed cell contributes c (1 - 0)^2.
        let (a, b) = match (rows.indptr.first(), rows.indptr.last()) {
            (Some(&a), Some(&b)) => (a as usize, (b as usize).max(a as usize)),
            _ => (0, 0),
        };
        let obs = match rows.weights {
            None => (b - a) as f64,
            Some(c) => c[a..b].iter().map(|&c| f64::from(c)).sum(),
        };
        return (init.0 + obs, init.1);
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
                let wts = rows.row_weights(u);
                for (k, &i) in idx.iter().enumerate() {
                    let e = 1.0 - dot64(w, &fixed[i as usize * d..][..d]);
                    obs += wts.map_or(1.0, |c| f64::from(c[k])) * e * e;
                }
                reg += (idx.len() as f64 + f64::from(alpha0) * n_other) * dot64(w, w);
            }
            (obs, reg)
        })
        .collect();
    parts.iter().fold(init, |(a, b), &(o, r)| (a + o, b + r))
}

/// Add the loss pieces of rows `first..first + rows.num_rows()` of a shard to their
/// [`LOSS_CHUNK`]-row chunks' sums `accs` (indexed by shard chunk), each row's terms in
/// the order [`local_loss_terms`] adds them. Rows fed in increasing order, in any runs,
/// leave in `accs` the chunk sums of one call over the whole shard; [`fold_loss_chunks`]
/// then adds them as it does. Parallel over the chunks the rows touch.
#[allow(clippy::too_many_arguments)]
pub fn add_loss_terms_to_chunks<T: TableElem>(
    accs: &mut [(f64, f64)],
    first: usize,
    x: &[f32],
    rows: RowsView,
    fixed: &[T],
    d: usize,
    alpha0: f32,
    n_other: f64,
) {
    let n_rows = rows.num_rows();
    assert_eq!(
        x.len(),
        n_rows * d,
        "add_loss_terms_to_chunks: x is not rows x d"
    );
    if n_rows == 0 {
        return;
    }
    if let Some(n_fixed) = fixed.len().checked_div(d) {
        if let Err((r, msg)) = rows.validate(n_fixed) {
            panic!("add_loss_terms_to_chunks: row {r}: {msg}");
        }
    }
    let (c0, c1) = (first / LOSS_CHUNK, (first + n_rows - 1) / LOSS_CHUNK + 1);
    accs[c0..c1]
        .par_iter_mut()
        .enumerate()
        .for_each(|(k, acc)| {
            let c = c0 + k;
            let lo = (c * LOSS_CHUNK).max(first) - first;
            let hi = ((c + 1) * LOSS_CHUNK).min(first + n_rows) - first;
            for u in lo..hi {
                let idx = &rows.indices[rows.range(u)];
                let wts = rows.row_weights(u);
                if d == 0 {
                    acc.0 += match wts {
                        None => idx.len() as f64,
                        Some(c) => c.iter().map(|&c| f64::from(c)).sum(),
                    };
                    continue;
                }
                let w = &x[u * d..][..d];
                for (k, &i) in idx.iter().enumerate() {
                    let e = 1.0 - dot64(w, &fixed[i as usize * d..][..d]);
                    acc.0 += wts.map_or(1.0, |c| f64::from(c[k])) * e * e;
                }
                acc.1 += (idx.len() as f64 + f64::from(alpha0) * n_other) * dot64(w, w);
            }
        });
}

/// The loss pieces from chunk sums, added as a pass over the whole shard adds them:
/// in order (f32 tables), or per block of `block` rows and then the blocks in order
/// (bf16 tables, widened a block at a time).
pub fn fold_loss_chunks(accs: &[(f64, f64)], block: Option<usize>) -> (f64, f64) {
    let add = |(a, b): (f64, f64), &(o, r): &(f64, f64)| (a + o, b + r);
    match block {
        None => accs.iter().fold((0.0, 0.0), add),
        Some(rows) => accs
            .chunks((rows / LOSS_CHUNK).max(1))
            .map(|blk| blk.iter().fold((0.0, 0.0), add))
            .fold((0.0, 0.0), |acc, (o, r)| (acc.0 + o, acc.1 + r)),
    }
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
