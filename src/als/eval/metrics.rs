//! Ranking metrics at every K in `1..=MAX_K` from one pass over the merged top-`MAX_K`
//! lists, with the definitions of benfred/implicit's `ranking_metrics_at_k`
//! (docs/als.md states them and where torusrec differs). For a row with held-out set
//! `R` (`|R|` clipped to `MAX_K`: `r`), `m = min(K, r)`, and hits at 0-based positions
//! `i < K` of its ranking, the `h`-th hit at position `i`:
//!
//! - Precision@K (pooled): `sum_rows hits / sum_rows m`;
//! - MAP@K: the mean over rows of `AP = sum_hits (h / (i + 1)) / m`;
//! - NDCG@K (binary gains): the mean over rows of
//!   `sum_hits 1 / log2(i + 2) / sum_{j < m} 1 / log2(j + 2)`;
//! - Recall@K: the mean over rows of `hits / m` (the Recall@20/50 of [`super::Recall`],
//!   the same bits).
//!
//! Rows with an empty held-out set count in the means with 0 (as Recall always did).
//!
//! The sums are integers, so the all-reduce is exact in any order: per `r`, the rows
//! (`N[r]`), per `(r, i)` the rows with a hit at `i` (`H[r][i]`) and the sum of those
//! hits' `h` (`S[r][i]`). Every metric at every K is then a fixed-order function of
//! them: the same bits at every rank count (given the same rankings).

use super::{Cand, MAX_K};

/// The metrics at one K (means over the evaluated rows; precision pooled).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct AtK {
    pub k: usize,
    pub precision: f64,
    pub map: f64,
    pub ndcg: f64,
    pub recall: f64,
}

/// The metrics at every K in `1..=MAX_K` over `rows` evaluated rows.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ranking {
    at: [AtK; MAX_K],
    pub rows: u64,
}

impl Ranking {
    /// The metrics at `k` (`None` outside `1..=MAX_K`).
    pub fn at(&self, k: usize) -> Option<AtK> {
        (1..=MAX_K).contains(&k).then(|| self.at[k - 1])
    }
}

/// `--k`: the K the metrics are printed at, each in `1..=MAX_K`, increasing, without
/// repeats (given in any order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KList(pub Vec<usize>);

impl Default for KList {
    /// Today's K: 20 and 50.
    fn default() -> Self {
        KList(vec![20, 50])
    }
}

impl std::str::FromStr for KList {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let mut ks = Vec::new();
        for part in s.split(',') {
            let k: usize = part
                .trim()
                .parse()
                .map_err(|_| format!("`{part}`: expected a K in 1..={MAX_K} (e.g. 10,20,50)"))?;
            if !(1..=MAX_K).contains(&k) {
                return Err(format!(
                    "K = {k}: each K must be in 1..={MAX_K} (the evaluation keeps each row's top {MAX_K})"
                ));
            }
            ks.push(k);
        }
        ks.sort_unstable();
        ks.dedup();
        Ok(KList(ks))
    }
}

impl std::fmt::Display for KList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s: Vec<String> = self.0.iter().map(|k| k.to_string()).collect();
        f.write_str(&s.join(","))
    }
}

/// Offsets in [`RankingSums`]: `N[r]` (r in `0..=MAX_K`), then `H[r][i]`, then
/// `S[r][i]` (i in `0..MAX_K`).
const CLASSES: usize = MAX_K + 1;
const H_AT: usize = CLASSES;
const S_AT: usize = H_AT + CLASSES * MAX_K;
const LEN: usize = S_AT + CLASSES * MAX_K;

/// The exact integer sums behind [`Ranking`] (see the module doc).
pub(crate) struct RankingSums(Vec<u64>);

impl RankingSums {
    pub(crate) fn new() -> Self {
        Self(vec![0; LEN])
    }

    /// Adds one row: its ranking (best first, at least `MAX_K` long or shorter) and its
    /// sorted held-out columns.
    pub(crate) fn add(&mut self, ranking: &[Cand], holdout: &[u32]) {
        let r = holdout.len().min(MAX_K);
        self.0[r] += 1;
        let mut h = 0;
        for (i, c) in ranking.iter().take(MAX_K).enumerate() {
            if holdout.binary_search(&c.col).is_ok() {
                h += 1;
                self.0[H_AT + r * MAX_K + i] += 1;
                self.0[S_AT + r * MAX_K + i] += h;
            }
        }
    }

    /// The sums as one buffer, to all-reduce with others.
    pub(crate) fn as_mut_slice(&mut self) -> &mut [u64] {
        &mut self.0
    }

    /// The metrics of these (already reduced) sums.
    pub(crate) fn local_metrics(&self) -> Ranking {
        let n: u64 = self.0[..CLASSES].iter().sum();
        // cg[i] = 1 / log2(i + 2); idcg[m] = sum_{j < m} cg[j], summed in order.
        let cg: Vec<f64> = (0..MAX_K).map(|i| 1.0 / ((i + 2) as f64).log2()).collect();
        let mut idcg = vec![0f64; MAX_K + 1];
        for m in 1..=MAX_K {
            idcg[m] = idcg[m - 1] + cg[m - 1];
        }
        let mut at = [AtK::default(); MAX_K];
        for (k, slot) in (1..=MAX_K).zip(at.iter_mut()) {
            *slot = self.at_k(k, n, &cg, &idcg);
        }
        Ranking { at, rows: n }
    }

    /// The metrics at `k` over `n` rows.
    fn at_k(&self, k: usize, n: u64, cg: &[f64], idcg: &[f64]) -> AtK {
        let h = |r: usize, i: usize| self.0[H_AT + r * MAX_K + i];
        let s = |r: usize, i: usize| self.0[S_AT + r * MAX_K + i];
        // Hits per denominator m = min(k, r), as RecallSums keeps them.
        let mut part = [0u64; MAX_K + 1];
        let mut pr_div = 0u64;
        let (mut ndcg, mut map) = (0f64, 0f64);
        for r in 1..=MAX_K {
            let m = k.min(r);
            part[m] += (0..k).map(|i| h(r, i)).sum::<u64>();
            pr_div += self.0[r] * m as u64;
            let dcg: f64 = (0..k).map(|i| h(r, i) as f64 * cg[i]).sum();
            ndcg += dcg / idcg[m];
            let ap: f64 = (0..k).map(|i| s(r, i) as f64 / (i + 1) as f64).sum();
            map += ap / m as f64;
        }
        let hits: u64 = part.iter().sum();
        let rows = n.max(1) as f64;
        // The same expression as RecallSums::global_finish (so the same bits).
        let recall: f64 = (1..=MAX_K)
            .map(|den| part[den] as f64 / den as f64)
            .sum::<f64>()
            / rows;
        AtK {
            k,
            precision: if pr_div == 0 {
                0.0
            } else {
                hits as f64 / pr_div as f64
            },
            map: map / rows,
            ndcg: ndcg / rows,
            recall,
        }
    }
}

/// The metrics of the rankings `rankings[j]` against the sorted held-out sets
/// `holdouts[j]`, row by row in floating point as implicit's `ranking_metrics_at_k`
/// computes them (empty held-out sets counted as 0 in the means): the slow reference
/// for [`RankingSums`].
pub fn ranking_metrics_ref(rankings: &[&[Cand]], holdouts: &[&[u32]], k: usize) -> AtK {
    let (mut hits, mut pr_div) = (0u64, 0u64);
    let (mut map, mut ndcg, mut recall) = (0f64, 0f64, 0f64);
    for (ranking, holdout) in rankings.iter().zip(holdouts) {
        let m = k.min(holdout.len());
        if m == 0 {
            continue;
        }
        pr_div += m as u64;
        let idcg: f64 = (0..m).map(|j| 1.0 / ((j + 2) as f64).log2()).sum();
        let (mut hit, mut ap, mut dcg) = (0u64, 0f64, 0f64);
        for (i, c) in ranking.iter().take(k).enumerate() {
            if holdout.binary_search(&c.col).is_ok() {
                hit += 1;
                ap += hit as f64 / (i + 1) as f64;
                dcg += 1.0 / ((i + 2) as f64).log2();
            }
        }
        hits += hit;
        map += ap / m as f64;
        ndcg += dcg / idcg;
        recall += hit as f64 / m as f64;
    }
    let rows = rankings.len().max(1) as f64;
    AtK {
        k,
        precision: if pr_div == 0 {
            0.0
        } else {
            hits as f64 / pr_div as f64
        },
        map: map / rows,
        ndcg: ndcg / rows,
        recall: recall / rows,
    }
}

#[cfg(test)]
mod tests;
