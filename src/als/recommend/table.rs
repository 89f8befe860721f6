//! The columns a rank scores: its shard of H as trained (the default: no copy), or a
//! copy of it as f32 restricted to the columns a [`Cols`] filter leaves, and with
//! every row scaled to unit length for cosine similarity.

use super::{Cols, Recommender};
use crate::als::eval::{local_score_topk, Cand, ScoreRows};
use crate::als::model::TableScalar;

/// `row` widened to f32 and scaled to unit length (norm in f64; a zero row stays 0,
/// so that it ties every column at cosine 0).
pub(super) fn unit<T: TableScalar>(row: &[T], out: &mut [f32]) {
    crate::bf16::widen(row, out);
    let norm = out
        .iter()
        .map(|&v| f64::from(v) * f64::from(v))
        .sum::<f64>()
        .sqrt();
    if norm > 0.0 {
        for v in out.iter_mut() {
            *v = (f64::from(*v) / norm) as f32;
        }
    }
}

/// A rank's scored columns when they are not its shard of H as trained.
pub(super) struct Table {
    /// `n x d` f32.
    data: Vec<f32>,
    /// The global ids of the rows of `data` (increasing), when some of the shard's
    /// columns are filtered out; `None`: all of them, from the shard's first.
    cols: Option<Vec<u32>>,
}

impl<T: TableScalar> Recommender<T> {
    /// Rank-local: this rank's table for `cols` and `cosine` (`None`: the shard of H
    /// as it is, which is how the default scores).
    pub(super) fn local_table(&self, cols: &Cols, cosine: bool, rank: usize) -> Option<Table> {
        let filtered = cols.allow.is_some() || !cols.exclude.is_empty();
        if !filtered && !cosine {
            return None;
        }
        let d = self.d;
        let (lo, hi) = (self.h_bounds[rank] as u32, self.h_bounds[rank + 1] as u32);
        let keep: Vec<u32> = (lo..hi)
            .filter(|c| {
                cols.allow
                    .as_ref()
                    .is_none_or(|a| a.binary_search(c).is_ok())
                    && cols.exclude.binary_search(c).is_err()
            })
            .collect();
        let mut data = vec![0f32; keep.len() * d];
        for (j, &c) in keep.iter().enumerate() {
            let i = (c - lo) as usize;
            let (src, dst) = (&self.h[i * d..(i + 1) * d], &mut data[j * d..(j + 1) * d]);
            if cosine {
                unit(src, dst);
            } else {
                crate::bf16::widen(src, dst);
            }
        }
        Some(Table {
            data,
            cols: filtered.then_some(keep),
        })
    }

    /// Rank-local: the top `k` of each row of `rows` over this rank's columns
    /// (`table`, or the shard of H when `None`), global column ids.
    pub(super) fn local_score(
        &self,
        rows: ScoreRows,
        table: Option<&Table>,
        rank: usize,
        k: usize,
    ) -> Vec<Cand> {
        let (d, lo) = (self.d, self.h_bounds[rank]);
        let Some(t) = table else {
            return local_score_topk(rows, &self.h, lo, d, k);
        };
        let Some(cols) = &t.cols else {
            return local_score_topk(rows, &t.data, lo, d, k);
        };
        // Masks as positions in `cols` (a masked column that is filtered out anyway
        // is dropped); positions keep the order of the ids, so ties still go to the
        // smaller id.
        let mut indptr = vec![0usize];
        let mut pos = Vec::new();
        for r in 0..rows.num_rows() {
            let m = &rows.mask_cols[rows.mask_indptr[r]..rows.mask_indptr[r + 1]];
            pos.extend(
                m.iter()
                    .filter_map(|c| cols.binary_search(c).ok().map(|p| p as u32)),
            );
            indptr.push(pos.len());
        }
        let local = ScoreRows {
            x: rows.x,
            mask_indptr: &indptr,
            mask_cols: &pos,
        };
        let mut cands = local_score_topk(local, &t.data, 0, d, k);
        for c in cands.iter_mut().filter(|c| c.col != Cand::NONE.col) {
            c.col = cols[c.col as usize];
        }
        cands
    }
}

#[cfg(test)]
mod tests {
    use super::unit;

    #[test]
    fn unit_rows_have_length_one_and_zero_stays_zero() {
        let mut out = [0f32; 2];
        unit(&[3f32, 4.0], &mut out);
        assert_eq!(out, [0.6, 0.8]);
        unit(&[0f32, 0.0], &mut out);
        assert_eq!(out, [0.0, 0.0]);
    }
}
