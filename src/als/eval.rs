//! Evaluation: fold in every test row from its visible arcs (an exact solve against
//! H), score every column shard by shard, drop the visible arcs, take a distributed
//! exact top-K, and average Recall@20 and Recall@50 over the full test set:
//! `recall = |topK ∩ holdout| / min(K, |holdout|)` (DESIGN.md).

use super::exchange::{ExchangeKind, ExchangePlan};
use super::shard::Shards;
use super::solve::{cholesky_solve, RowsView, SolveParams};
use crate::comm::{prefix_offsets, Comm};
use crate::data::graph::block_range;
use crate::error::{Error, Result};
use rayon::prelude::*;

/// The largest K reported.
pub const MAX_K: usize = 50;

/// A scored column. Better = higher score, then lower column id (deterministic ties).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cand {
    pub score: f32,
    pub col: u32,
}

impl Cand {
    const NONE: Cand = Cand {
        score: f32::NEG_INFINITY,
        col: u32::MAX,
    };
    #[inline]
    fn better(&self, o: &Cand) -> bool {
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
    #[inline]
    pub fn push(&mut self, c: Cand) {
        if c.score.is_nan() || c.col == u32::MAX {
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
    /// Best first, padded with "no candidate" up to `k`.
    pub fn into_padded(mut self) -> Vec<Cand> {
        self.items.resize(self.k, Cand::NONE);
        self.items
    }
    pub fn into_sorted(self) -> Vec<Cand> {
        self.items
    }
}

/// Recall@K of one ranking (best first) against a sorted holdout.
pub fn recall_at(ranking: &[Cand], holdout: &[u32], k: usize) -> f64 {
    if holdout.is_empty() {
        return 0.0;
    }
    let hits = ranking
        .iter()
        .take(k)
        .filter(|c| holdout.binary_search(&c.col).is_ok())
        .count();
    hits as f64 / k.min(holdout.len()) as f64
}

/// The test set as one rank sees it.
pub struct EvalSet {
    /// Owned test rows' visible arcs as positions in `plan`'s gathered H.
    fold_indptr: Vec<u64>,
    fold_local: Vec<u32>,
    plan: ExchangePlan,
    /// Every test row's visible arcs (global column ids), to mask while scoring.
    all_fold_indptr: Vec<usize>,
    all_fold: Vec<u32>,
    num_test: usize,
    /// Owned test rows' held-out arcs.
    holdout_indptr: Vec<u64>,
    holdout: Vec<u32>,
}

/// Recall averaged over the full test set.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Recall {
    pub at20: f64,
    pub at50: f64,
    pub test_rows: u64,
}

use serde::{Deserialize, Serialize};

impl EvalSet {
    /// Collective: every rank must call.
    pub fn global_build<C: Comm>(comm: &C, s: &Shards) -> Result<Self> {
        let mut fold_local = s.fold.indices.clone();
        let plan =
            ExchangePlan::global_build(comm, ExchangeKind::Dedup, &mut fold_local, &s.col_bounds)?;
        let lens: Vec<u64> = s.fold.indptr.windows(2).map(|w| w[1] - w[0]).collect();
        let all_lens = comm.all_gather_v(&lens)?.data;
        let all_fold = comm.all_gather_v(&s.fold.indices)?.data;
        let all_fold_indptr =
            prefix_offsets(&all_lens.iter().map(|&l| l as usize).collect::<Vec<_>>());
        Ok(Self {
            fold_indptr: s.fold.indptr.clone(),
            fold_local,
            plan,
            all_fold_indptr,
            all_fold,
            num_test: s.num_test as usize,
            holdout_indptr: s.holdout.indptr.clone(),
            holdout: s.holdout.indices.clone(),
        })
    }

    /// Collective: every rank must call. `h_local` is this rank's H shard (columns
    /// `col_lo..`), `gram_h` the all-reduced Gramian of H.
    #[allow(clippy::too_many_arguments)]
    pub fn global_evaluate<C: Comm>(
        &self,
        comm: &C,
        h_local: &[f32],
        col_lo: u64,
        d: usize,
        gram_h: &[f64],
        params: SolveParams,
    ) -> Result<Recall> {
        // Scoring calls BLAS from rayon threads: keep BLAS itself single-threaded.
        crate::blas_single_thread();
        let fetched = self.plan.global_fetch(comm, h_local, d)?;
        let h_fold = fetched.as_deref().unwrap_or(h_local);
        let _p = comm.stats().phase("eval");
        // Fold-in: the exact solve against H from zero.
        let t_local = self.fold_indptr.len() - 1;
        let mut x = vec![0f32; t_local * d];
        let view = RowsView {
            indptr: &self.fold_indptr,
            indices: &self.fold_local,
        };
        let solved = cholesky_solve(&mut x, view, h_fold, d, gram_h, params)
            .map_err(|e| Error::Comm(format!("fold-in: {e}")));
        comm.agree(solved)?;
        let x_all = comm.all_gather_v(&x)?.data;

        // Score this rank's columns for every test row, best MAX_K per row.
        let n_local = h_local.len() / d;
        let col_hi = col_lo + n_local as u64;
        const BLOCK: usize = 64;
        let t = self.num_test;
        let cands: Vec<Cand> = (0..t.div_ceil(BLOCK))
            .into_par_iter()
            .flat_map_iter(|b| {
                let r0 = b * BLOCK;
                let r1 = (r0 + BLOCK).min(t);
                let mut scores = vec![0f32; (r1 - r0) * n_local];
                if n_local > 0 {
                    let xb = ndarray::ArrayView2::from_shape((r1 - r0, d), &x_all[r0 * d..r1 * d])
                        .expect("shape");
                    let hb = ndarray::ArrayView2::from_shape((n_local, d), h_local).expect("shape");
                    let mut sb =
                        ndarray::ArrayViewMut2::from_shape((r1 - r0, n_local), &mut scores)
                            .expect("shape");
                    ndarray::linalg::general_mat_mul(1.0, &xb, &hb.t(), 0.0, &mut sb);
                }
                let mut out = Vec::with_capacity((r1 - r0) * MAX_K);
                for r in r0..r1 {
                    let row = &mut scores[(r - r0) * n_local..(r - r0 + 1) * n_local];
                    for &c in &self.all_fold[self.all_fold_indptr[r]..self.all_fold_indptr[r + 1]] {
                        if (c as u64) >= col_lo && (c as u64) < col_hi {
                            row[(c as u64 - col_lo) as usize] = f32::NEG_INFINITY;
                        }
                    }
                    let mut top = TopK::new(MAX_K);
                    for (j, &s) in row.iter().enumerate() {
                        if s != f32::NEG_INFINITY {
                            top.push(Cand {
                                score: s,
                                col: (col_lo + j as u64) as u32,
                            });
                        }
                    }
                    out.extend(top.into_padded());
                }
                out.into_iter()
            })
            .collect();

        // Send every row's candidates to the rank that owns the row.
        let p = comm.size();
        let counts: Vec<usize> = (0..p)
            .map(|r| {
                let (a, b) = block_range(t as u64, p, r);
                (b - a) as usize * MAX_K
            })
            .collect();
        let scores: Vec<f32> = cands.iter().map(|c| c.score).collect();
        let cols: Vec<u32> = cands.iter().map(|c| c.col).collect();
        drop(cands);
        let got_s = comm.all_to_all_v(&scores, &counts)?;
        let got_c = comm.all_to_all_v(&cols, &counts)?;
        let mut sums = [0f64, 0f64, t_local as f64];
        for i in 0..t_local {
            let mut top = TopK::new(MAX_K);
            for src in 0..p {
                let s = got_s.from_rank(src);
                let c = got_c.from_rank(src);
                for k in i * MAX_K..(i + 1) * MAX_K {
                    top.push(Cand {
                        score: s[k],
                        col: c[k],
                    });
                }
            }
            let ranking = top.into_sorted();
            let h =
                &self.holdout[self.holdout_indptr[i] as usize..self.holdout_indptr[i + 1] as usize];
            sums[0] += recall_at(&ranking, h, 20);
            sums[1] += recall_at(&ranking, h, 50);
        }
        comm.all_reduce_sum(&mut sums);
        let n = sums[2].max(1.0);
        Ok(Recall {
            at20: sums[0] / n,
            at50: sums[1] / n,
            test_rows: sums[2] as u64,
        })
    }
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
        let v: Vec<(f32, u32)> = t.into_sorted().iter().map(|c| (c.score, c.col)).collect();
        assert_eq!(v, vec![(0.9, 0), (0.9, 1), (0.5, 2)]);
        let p = TopK::new(4).into_padded();
        assert_eq!(p.len(), 4);
        assert!(p.iter().all(|c| c.col == u32::MAX));
    }

    #[test]
    fn recall_divides_by_min_k_holdout() {
        let r: Vec<Cand> = (0..50).map(|c| Cand { score: 1.0, col: c }).collect();
        assert_eq!(recall_at(&r, &[3, 30, 100], 20), 1.0 / 3.0);
        assert_eq!(recall_at(&r, &[3, 30, 100], 50), 2.0 / 3.0);
        let many: Vec<u32> = (0..40).collect();
        assert_eq!(recall_at(&r, &many, 20), 1.0);
        assert_eq!(recall_at(&r, &[], 20), 0.0);
    }
}
