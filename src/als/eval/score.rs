//! Rank-local scoring: for each folded-in row, the best `k` columns of this rank's H
//! shard, with the row's visible arcs removed.
//!
//! [`local_score_topk`] scores in tiles of [`ROW_BLOCK`] rows x [`COL_BLOCK`] columns
//! (one single-threaded sgemm per tile, rayon over row blocks), so its memory is
//! bounded by the tile size whatever the number of columns. A column tile of a bf16
//! table is widened into an f32 scratch first. Tiles are cut from the row index 0 and
//! the shard's first column, never by thread: every score, and so the result, is the
//! same at any thread count. [`local_score_topk_ref`] is the slow reference (every
//! score by a plain dot product, a full sort).

use crate::bf16::TableElem;
use rayon::prelude::*;

/// Rows per scoring tile.
pub const ROW_BLOCK: usize = 256;
/// Columns per scoring tile: a tile of scores is `ROW_BLOCK * COL_BLOCK` f32 (1 MiB,
/// about a core's L2, so the top-K scan reads it from cache).
pub const COL_BLOCK: usize = 1024;

/// A scored column. Better = higher score, then lower column id (deterministic ties).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cand {
    pub score: f32,
    pub col: u32,
}

impl Cand {
    /// "No candidate": pads a ranking with fewer than `k` columns.
    pub const NONE: Cand = Cand {
        score: f32::NEG_INFINITY,
        col: u32::MAX,
    };
    #[inline]
    pub fn better(&self, o: &Cand) -> bool {
        self.score > o.score || (self.score == o.score && self.col < o.col)
    }
}

/// The best `k` of a stream of candidates, kept sorted best first.
#[derive(Debug, Clone)]
pub struct TopK {
    k: usize,
    items: Vec<Cand>,
}

impl TopK {
    pub fn new(k: usize) -> Self {
        Self {
            k,
            items: Vec::with_capacity(k + 1),
        }
    }
    /// Add a candidate; NaN scores and "no candidate" are ignored.
    #[inline]
    pub fn push(&mut self, c: Cand) {
        if c.score.is_nan() || c.col == u32::MAX || self.k == 0 {
            return;
        }
        if self.items.len() == self.k {
            if !c.better(&self.items[self.k - 1]) {
                return;
            }
            self.items.pop();
        }
        let at = self.items.partition_point(|x| x.better(&c));
        self.items.insert(at, c);
    }
    /// A score that a candidate must exceed to enter when candidates arrive in
    /// increasing column order (a tie with the k-th best loses on the column id):
    /// the k-th best score when full, else -inf (so -inf, the mask, never enters).
    #[inline]
    pub fn threshold(&self) -> f32 {
        if self.k > 0 && self.items.len() == self.k {
            self.items[self.k - 1].score
        } else if self.k == 0 {
            f32::INFINITY
        } else {
            f32::NEG_INFINITY
        }
    }
    /// Best first, padded with "no candidate" up to `k`.
    pub fn into_padded(mut self) -> Vec<Cand> {
        self.items.resize(self.k, Cand::NONE);
        self.items
    }
    pub fn into_sorted(self) -> Vec<Cand> {
        self.items
    }
}

/// Rows to score: `x` is `rows x d`; `mask_cols[mask_indptr[r]..mask_indptr[r + 1]]`
/// are row `r`'s visible arcs (global column ids, increasing), which are never ranked.
#[derive(Debug, Clone, Copy)]
pub struct ScoreRows<'a> {
    pub x: &'a [f32],
    pub mask_indptr: &'a [usize],
    pub mask_cols: &'a [u32],
}

impl ScoreRows<'_> {
    pub fn num_rows(&self) -> usize {
        self.mask_indptr.len().saturating_sub(1)
    }
    fn mask(&self, r: usize) -> &[u32] {
        &self.mask_cols[self.mask_indptr[r]..self.mask_indptr[r + 1]]
    }
}

/// The table as f32 without a copy when it is f32.
fn as_f32<T: TableElem>(h: &[T]) -> Option<&[f32]> {
    if std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>() {
        // SAFETY: T is f32 (same TypeId), so the slice is a slice of f32.
        Some(unsafe { std::slice::from_raw_parts(h.as_ptr().cast::<f32>(), h.len()) })
    } else {
        None
    }
}

/// Rank-local: for each row of `rows`, its best `k` columns of the shard `h`
/// (`n_local x d`, global ids `col_lo..`), visible arcs excluded, best first and padded
/// with [`Cand::NONE`] to `k` (row-major `rows x k`). Scores are `x_r . h_c` by sgemm.
pub fn local_score_topk<T: TableElem>(
    rows: ScoreRows,
    h: &[T],
    col_lo: u64,
    d: usize,
    k: usize,
) -> Vec<Cand> {
    local_score_topk_tiled(rows, h, col_lo, d, k, ROW_BLOCK, COL_BLOCK)
}

/// [`local_score_topk`] with other tile sizes (for tests and tuning).
#[doc(hidden)]
pub fn local_score_topk_tiled<T: TableElem>(
    rows: ScoreRows,
    h: &[T],
    col_lo: u64,
    d: usize,
    k: usize,
    row_block: usize,
    col_block: usize,
) -> Vec<Cand> {
    let t = rows.num_rows();
    assert_eq!(rows.x.len(), t * d, "local_score_topk: x is not rows x d");
    let mut out = vec![Cand::NONE; t * k];
    if t == 0 || k == 0 {
        return out;
    }
    let n_local = h.len().checked_div(d).unwrap_or(0);
    assert_eq!(h.len(), n_local * d, "local_score_topk: h is not n x d");
    if n_local == 0 {
        return out;
    }
    // Scoring calls BLAS from rayon threads: keep BLAS itself single-threaded.
    crate::blas_single_thread();
    let h32 = as_f32(h);
    out.par_chunks_mut(row_block * k)
        .enumerate()
        .for_each(|(b, out_b)| {
            let r0 = b * row_block;
            let rb = out_b.len() / k;
            let mut scores = vec![0f32; rb * col_block.min(n_local)];
            let mut wide = if h32.is_none() {
                vec![0f32; col_block.min(n_local) * d]
            } else {
                Vec::new()
            };
            let mut tops: Vec<TopK> = (0..rb).map(|_| TopK::new(k)).collect();
            // Per row, the next visible arc not yet masked (tiles go left to right).
            let mut cursor: Vec<usize> = (r0..r0 + rb).map(|r| rows.mask_indptr[r]).collect();
            let xb = ndarray::ArrayView2::from_shape((rb, d), &rows.x[r0 * d..(r0 + rb) * d])
                .expect("shape");
            for c0 in (0..n_local).step_by(col_block) {
                let cb = col_block.min(n_local - c0);
                let hb: &[f32] = match h32 {
                    Some(h32) => &h32[c0 * d..(c0 + cb) * d],
                    None => {
                        crate::bf16::widen(&h[c0 * d..(c0 + cb) * d], &mut wide[..cb * d]);
                        &wide[..cb * d]
                    }
                };
                let hv = ndarray::ArrayView2::from_shape((cb, d), hb).expect("shape");
                let sc = &mut scores[..rb * cb];
                let mut sv = ndarray::ArrayViewMut2::from_shape((rb, cb), &mut *sc).expect("shape");
                ndarray::linalg::general_mat_mul(1.0, &xb, &hv.t(), 0.0, &mut sv);
                let g0 = col_lo + c0 as u64;
                let g1 = g0 + cb as u64;
                for (i, top) in tops.iter_mut().enumerate() {
                    let row = &mut sc[i * cb..(i + 1) * cb];
                    let r = r0 + i;
                    let end = rows.mask_indptr[r + 1];
                    let cur = &mut cursor[i];
                    while *cur < end && (rows.mask_cols[*cur] as u64) < g1 {
                        let c = rows.mask_cols[*cur] as u64;
                        if c >= g0 {
                            row[(c - g0) as usize] = f32::NEG_INFINITY;
                        }
                        *cur += 1;
                    }
                    scan_row(row, g0, top);
                }
            }
            for (i, top) in tops.into_iter().enumerate() {
                out_b[i * k..(i + 1) * k].copy_from_slice(&top.into_padded());
            }
        });
    out
}

/// Offer one row of scores (columns `g0..`, increasing) to `top`: a chunk whose
/// maximum does not beat the current threshold is skipped whole.
#[inline]
fn scan_row(row: &[f32], g0: u64, top: &mut TopK) {
    const CHUNK: usize = 16;
    let mut thr = top.threshold();
    for (ci, chunk) in row.chunks(CHUNK).enumerate() {
        // NaN compares false everywhere, so it neither raises the maximum nor enters.
        let m = chunk
            .iter()
            .fold(f32::NEG_INFINITY, |a, &s| if s > a { s } else { a });
        if m <= thr {
            continue;
        }
        for (j, &s) in chunk.iter().enumerate() {
            if s > thr {
                top.push(Cand {
                    score: s,
                    col: (g0 + (ci * CHUNK + j) as u64) as u32,
                });
                thr = top.threshold();
            }
        }
    }
}

/// The slow reference of [`local_score_topk`]: every score by a sequential f32 dot
/// product, visible arcs dropped, all columns sorted (score down, id up), first `k`.
pub fn local_score_topk_ref<T: TableElem>(
    rows: ScoreRows,
    h: &[T],
    col_lo: u64,
    d: usize,
    k: usize,
) -> Vec<Cand> {
    let t = rows.num_rows();
    let n_local = h.len().checked_div(d).unwrap_or(0);
    let mut out = Vec::with_capacity(t * k);
    for r in 0..t {
        let x = &rows.x[r * d..(r + 1) * d];
        let mask = rows.mask(r);
        let mut all: Vec<Cand> = (0..n_local)
            .filter(|&j| !mask.contains(&((col_lo + j as u64) as u32)))
            .map(|j| Cand {
                score: x
                    .iter()
                    .zip(&h[j * d..(j + 1) * d])
                    .map(|(&a, &b)| a * b.to_f32())
                    .sum(),
                col: (col_lo + j as u64) as u32,
            })
            .filter(|c| !c.score.is_nan() && c.score != f32::NEG_INFINITY)
            .collect();
        all.sort_by(|a, b| {
            b.score
                .partial_cmp(&a.score)
                .expect("no NaN")
                .then(a.col.cmp(&b.col))
        });
        all.truncate(k);
        all.resize(k, Cand::NONE);
        out.extend(all);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topk_keeps_the_best_with_deterministic_ties() {
        let mut t = TopK::new(3);
        for (s, c) in [
            (0.5, 4),
            (0.9, 1),
            (0.5, 2),
            (0.1, 0),
            (0.9, 0),
            (f32::NAN, 7),
        ] {
            t.push(Cand { score: s, col: c });
        }
        assert_eq!(t.threshold(), 0.5);
        let v: Vec<(f32, u32)> = t.into_sorted().iter().map(|c| (c.score, c.col)).collect();
        assert_eq!(v, vec![(0.9, 0), (0.9, 1), (0.5, 2)]);
        let p = TopK::new(4).into_padded();
        assert_eq!(p.len(), 4);
        assert!(p.iter().all(|c| c.col == u32::MAX));
        assert_eq!(TopK::new(4).threshold(), f32::NEG_INFINITY);
    }

    #[test]
    fn scan_skips_masked_and_nan_and_keeps_lowest_ids_on_ties() {
        let row = [
            1.0,
            f32::NEG_INFINITY,
            f32::NAN,
            2.0,
            1.0,
            2.0,
            f32::INFINITY,
        ];
        let mut top = TopK::new(3);
        scan_row(&row, 10, &mut top);
        let v: Vec<(f32, u32)> = top.into_sorted().iter().map(|c| (c.score, c.col)).collect();
        assert_eq!(v, vec![(f32::INFINITY, 16), (2.0, 13), (2.0, 15)]);
    }
}
