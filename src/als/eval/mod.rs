//! Evaluation: fold in each evaluated test row from its visible arcs (an exact solve
//! against H), score every column shard by shard, drop the visible arcs, take a
//! distributed exact top-K, and average Recall@20 and Recall@50 over the evaluated rows:
//! `recall = |topK ∩ holdout| / min(K, |holdout|)` (docs/design.md).
//!
//! The evaluated rows are all test rows (`--eval-rows all`) or a seeded sample of `N`
//! of them (`--eval-rows N`): the `N` rows with the smallest
//! `(hash3(split seed, EVAL_ROWS, row), row)`. Every rank chooses from the gathered list
//! of test row ids, so the sample is the same at any rank count, and it depends only on
//! the dataset (not on `--seed`), so runs that differ in training are compared on the
//! same rows. The sample of `N` is the first `N` of one order of all test rows, so a
//! smaller sample is a prefix of a larger one.
//!
//! `--eval-rows auto` (the default) takes the first `N` of that order with `N` chosen
//! once, at the run's first evaluation, so that an evaluation takes at most a quarter
//! of an epoch's training time: the first [`AUTO_PROBE_ROWS`] rows are evaluated and
//! timed, rank 0 divides a fifth ([`AUTO_EPOCH_AIM`], leaving room for the variation
//! of epochs and rates) of its epoch's seconds by its seconds per probed row
//! ([`choose_eval_rows`], at least [`AUTO_MIN_ROWS`]) and broadcasts `N`, and every
//! later evaluation scores the same `N` rows. Its recall is that of `--eval-rows N`.
//!
//! Recall sums are exact: hits are counted per denominator `min(K, |holdout|)` in
//! integers, all-reduced, and divided once in a fixed order, so the reported recall has
//! the same bits at every rank count (given the same scores). The same pass over the
//! merged lists gives Precision, MAP, NDCG and Recall at every K up to [`MAX_K`] from
//! integer sums too (`metrics.rs`; all-reduced with the recall sums as one buffer).

mod metrics;
mod score;

use metrics::RankingSums;
pub use metrics::{ranking_metrics_ref, AtK, KList, Ranking};
pub use score::{
    local_score_topk, local_score_topk_ref, local_score_topk_tiled, local_score_topk_with, Cand,
    ScoreRows, Scorer, TopK, COL_BLOCK, ROW_BLOCK,
};

use super::shard::bounds::owner_of;
use super::shard::exchange::{ExchangeKind, ExchangePlan};
use super::shard::read::Shards;
use super::solve::{cholesky_solve, RowsView, SolveParams};
use crate::bf16::TableElem;
use crate::blocks::block_range;
use crate::comm::{prefix_offsets, process_cpu_seconds, Comm, Received};
use crate::error::{Error, Result};
use crate::rng::{hash3, stream};
use serde::{Deserialize, Serialize};
use std::time::Instant;

/// The largest K reported.
pub const MAX_K: usize = 50;

/// `--eval-rows`'s default: a seeded sample of this many test rows (all when fewer), a
/// function of the dataset alone.
pub const DEFAULT_EVAL_ROWS: u64 = 10_000;

/// `--eval-rows auto`: the share of an epoch's training time an evaluation may take.
pub const AUTO_EPOCH_SHARE: f64 = 0.25;
/// `--eval-rows auto`: the share it aims at. Below [`AUTO_EPOCH_SHARE`] because the
/// choice rests on one epoch and a 256-row probe: a later epoch may be faster, and the
/// full sample may score slower per row than the probe (measured on de-sparse at P = 2:
/// aiming at exactly a quarter gave 25.8 % of the mean epoch).
pub const AUTO_EPOCH_AIM: f64 = 0.2;
/// `--eval-rows auto`: the fewest rows it evaluates (all of them when there are fewer).
pub const AUTO_MIN_ROWS: u64 = 100;
/// `--eval-rows auto`: the rows the first evaluation times (the first of the sample).
pub const AUTO_PROBE_ROWS: u64 = 256;
/// `--eval-rows auto` when no epoch of this process was timed (a run resumed after its
/// last epoch evaluates the restored tables): the former default.
pub const AUTO_UNTIMED_ROWS: u64 = 10_000;

/// The rows `--eval-rows auto` is assumed to score by the memory estimate.
pub const AUTO_ESTIMATE_ROWS: u64 = 10_000;

/// Which test rows an evaluation scores.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum EvalRows {
    /// Every test row (the exact full evaluation).
    All,
    /// A seeded sample of this many rows (all of them when there are fewer).
    Sample(u64),
    /// The first rows of the sample that an evaluation scores in at most a quarter of
    /// an epoch, chosen at the first evaluation (see the module doc).
    #[default]
    Auto,
}

impl std::str::FromStr for EvalRows {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        if s.eq_ignore_ascii_case("all") {
            return Ok(EvalRows::All);
        }
        if s.eq_ignore_ascii_case("auto") {
            return Ok(EvalRows::Auto);
        }
        match s.parse::<u64>() {
            Ok(0) => Err("0 rows: evaluate at least one row (or `all`, or `auto`)".into()),
            Ok(n) => Ok(EvalRows::Sample(n)),
            Err(_) => Err(format!("`{s}`: expected a row count, `all` or `auto`")),
        }
    }
}

impl std::fmt::Display for EvalRows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EvalRows::All => f.write_str("all"),
            EvalRows::Sample(n) => write!(f, "{n}"),
            EvalRows::Auto => f.write_str("auto"),
        }
    }
}

/// `--eval-rows auto`'s count: as many rows as fit in [`AUTO_EPOCH_AIM`] of
/// `epoch_seconds` at `per_row_seconds` each, at least `floor` and at most
/// `available` (all of them when there are at most `floor`). A per-row cost that is
/// not positive and finite (nothing measurable) means all rows; an epoch time that
/// is not finite means `floor`.
pub fn choose_eval_rows(
    epoch_seconds: f64,
    per_row_seconds: f64,
    available: u64,
    floor: u64,
) -> u64 {
    if available <= floor {
        return available;
    }
    if !(per_row_seconds > 0.0 && per_row_seconds.is_finite()) {
        return available;
    }
    if !epoch_seconds.is_finite() {
        return floor;
    }
    let fit = (AUTO_EPOCH_AIM * epoch_seconds.max(0.0) / per_row_seconds).floor();
    if fit >= available as f64 {
        available
    } else {
        (fit as u64).max(floor)
    }
}

/// How `--eval-rows auto` chose its rows (the same on every rank: rank 0's numbers).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct AutoChoice {
    /// The rows chosen, of `available` test rows.
    pub rows: u64,
    pub available: u64,
    /// Training seconds of the epoch the choice was made after (`None`: none timed).
    pub epoch_seconds: Option<f64>,
    /// Rows timed and their seconds (0 when there was nothing to choose).
    pub probe_rows: u64,
    pub probe_seconds: f64,
    /// Whether this evaluation made the choice (and so also ran the probe).
    pub first: bool,
}

/// What one evaluation did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EvalReport {
    pub recall: Recall,
    /// Precision, MAP, NDCG and Recall at every K up to [`MAX_K`] (metrics.rs).
    pub ranking: Ranking,
    /// This rank's seconds per part (of the evaluation whose recall this is).
    pub times: EvalTimes,
    /// Scoring rate over all ranks: `2 d` flops per scored cell over the slowest
    /// rank's scoring seconds.
    pub score_flops_per_second: f64,
    /// `--eval-rows auto`: how the rows were chosen.
    pub auto: Option<AutoChoice>,
}

/// Rank-local: the positions (in `/test/rows` order, increasing) of the rows that
/// `which` evaluates, given every test row id in order. (`Auto` is resolved to a count
/// before rows are picked; here it means [`AUTO_UNTIMED_ROWS`].)
pub fn local_pick_rows(test_rows: &[u32], seed: u64, which: EvalRows) -> Vec<usize> {
    let t = test_rows.len();
    let n = match which {
        EvalRows::All => return (0..t).collect(),
        EvalRows::Sample(n) => n,
        EvalRows::Auto => AUTO_UNTIMED_ROWS,
    };
    if n >= t as u64 {
        return (0..t).collect();
    }
    let n = n as usize;
    let mut keys: Vec<(u64, u32, usize)> = test_rows
        .iter()
        .enumerate()
        .map(|(i, &r)| (hash3(seed, stream::EVAL_ROWS, r as u64), r, i))
        .collect();
    if n > 0 {
        keys.select_nth_unstable(n - 1);
    }
    let mut pos: Vec<usize> = keys[..n].iter().map(|k| k.2).collect();
    pos.sort_unstable();
    pos
}

/// Recall@K of one ranking (best first) against a sorted holdout.
pub fn recall_at(ranking: &[Cand], holdout: &[u32], k: usize) -> f64 {
    let (hits, den) = hits_at(ranking, holdout, k);
    if den == 0 {
        return 0.0;
    }
    hits as f64 / den as f64
}

/// `(|top-k ∩ holdout|, min(k, |holdout|))`.
fn hits_at(ranking: &[Cand], holdout: &[u32], k: usize) -> (u64, usize) {
    let hits = ranking
        .iter()
        .take(k)
        .filter(|c| holdout.binary_search(&c.col).is_ok())
        .count();
    (hits as u64, k.min(holdout.len()))
}

/// Exact recall sums: hits per denominator (1..=MAX_K) for K = 20 and K = 50, then
/// the row count. Integers, so the all-reduce is exact in any order.
struct RecallSums(Vec<u64>);

impl RecallSums {
    fn new() -> Self {
        Self(vec![0; 2 * (MAX_K + 1) + 1])
    }
    fn add(&mut self, ranking: &[Cand], holdout: &[u32]) {
        let (h20, d20) = hits_at(ranking, holdout, 20);
        let (h50, d50) = hits_at(ranking, holdout, 50);
        self.0[d20] += h20;
        self.0[MAX_K + 1 + d50] += h50;
        self.0[2 * (MAX_K + 1)] += 1;
    }
    /// The recall of these (already all-reduced) sums.
    fn local_finish(&self) -> Recall {
        let n = self.0[2 * (MAX_K + 1)];
        let mean = |part: &[u64]| {
            let s: f64 = (1..=MAX_K).map(|den| part[den] as f64 / den as f64).sum();
            s / n.max(1) as f64
        };
        Recall {
            at20: mean(&self.0[..=MAX_K]),
            at50: mean(&self.0[MAX_K + 1..2 * (MAX_K + 1)]),
            test_rows: n,
        }
    }
}

/// The exact sums of one evaluation: [`RecallSums`] and [`RankingSums`], all-reduced
/// as one buffer.
struct EvalSums {
    recall: RecallSums,
    ranking: RankingSums,
}

impl EvalSums {
    fn new() -> Self {
        Self {
            recall: RecallSums::new(),
            ranking: RankingSums::new(),
        }
    }
    fn add(&mut self, ranking: &[Cand], holdout: &[u32]) {
        self.recall.add(ranking, holdout);
        self.ranking.add(ranking, holdout);
    }
    /// Collective: every rank must call.
    fn global_finish<C: Comm>(self, comm: &C) -> (Recall, Ranking) {
        let EvalSums {
            recall: RecallSums(mut buf),
            mut ranking,
        } = self;
        let cut = buf.len();
        buf.extend_from_slice(ranking.as_mut_slice());
        comm.all_reduce_sum(&mut buf);
        ranking.as_mut_slice().copy_from_slice(&buf[cut..]);
        buf.truncate(cut);
        (RecallSums(buf).local_finish(), ranking.local_metrics())
    }
}

/// Recall averaged over the evaluated test rows.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Recall {
    pub at20: f64,
    pub at50: f64,
    /// How many test rows were evaluated.
    pub test_rows: u64,
}

/// Seconds of one evaluation's parts on this rank.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct EvalTimes {
    /// Fetching the fold-in rows of H.
    pub fetch: f64,
    /// The exact fold-in solves.
    pub fold_in: f64,
    /// All-gathering the folded-in rows.
    pub gather: f64,
    /// Scoring this rank's columns and keeping the top K.
    pub score: f64,
    /// Moving candidates to the rows' owners and merging them.
    pub merge: f64,
    /// CPU seconds (user + system, all threads of this process) of the fold-in and of
    /// the scoring: on a shared machine, the cost that their wall times hide.
    pub fold_in_cpu: f64,
    pub score_cpu: f64,
}

/// The fold-in of some rows from their visible arcs: the exact solve against H from
/// zero, with the rows of H it needs fetched from their owners (each distinct column
/// once). Shared by evaluation and by `recommend`.
pub struct FoldPlan {
    /// The rows' visible arcs as positions in `needed` (arc order of the input).
    fold_indptr: Vec<u64>,
    fold_pos: Vec<u32>,
    /// The confidences beside `fold_pos` (empty: all 1, `--confidence binary`).
    fold_weights: Vec<f32>,
    /// Distinct columns the fold-in needs, increasing (so grouped by owner), and how
    /// many each rank owns.
    needed_counts: Vec<usize>,
    /// The columns every rank asked this rank for, in its order.
    serve: Received<u32>,
    col_bounds: Vec<u64>,
}

/// This rank's seconds of one fold-in.
#[derive(Debug, Clone, Copy, Default)]
pub struct FoldTimes {
    pub fetch: f64,
    pub solve: f64,
    pub solve_cpu: f64,
}

impl FoldPlan {
    /// Collective: every rank must call. Plans the fold-in of this rank's rows, whose
    /// visible arcs (global column ids) are `fold[fold_indptr[i]..fold_indptr[i + 1]]`;
    /// `col_bounds` are the boundaries of H over ranks.
    pub fn global_build<C: Comm>(
        comm: &C,
        fold_indptr: Vec<u64>,
        fold: &[u32],
        col_bounds: &[u64],
    ) -> Result<Self> {
        let mut needed = fold.to_vec();
        needed.sort_unstable();
        needed.dedup();
        let fold_pos: Vec<u32> = fold
            .iter()
            .map(|c| needed.partition_point(|v| v < c) as u32)
            .collect();
        let mut needed_counts = vec![0usize; comm.size()];
        for &c in &needed {
            needed_counts[owner_of(col_bounds, c as u64)] += 1;
        }
        let serve = comm.all_to_all_v(&needed, &needed_counts)?;
        Ok(Self {
            fold_indptr,
            fold_pos,
            fold_weights: Vec::new(),
            needed_counts,
            serve,
            col_bounds: col_bounds.to_vec(),
        })
    }

    /// The plan with the confidences of its visible arcs (beside `fold` in
    /// [`FoldPlan::global_build`]'s order; empty: all 1). Panics on a length mismatch.
    pub fn with_weights(mut self, weights: Vec<f32>) -> Self {
        assert!(
            weights.is_empty() || weights.len() == self.fold_pos.len(),
            "FoldPlan::with_weights: {} weights beside {} arcs",
            weights.len(),
            self.fold_pos.len()
        );
        self.fold_weights = weights;
        self
    }

    /// How many rows this rank folds in.
    pub fn num_rows(&self) -> usize {
        self.fold_indptr.len().saturating_sub(1)
    }

    /// Collective: every rank must call. The fold-in rows of H, widened to f32, in
    /// `needed` order. `h_local` is this rank's shard (`col_bounds[rank]..`).
    fn global_fetch<C: Comm, T: TableElem>(
        &self,
        comm: &C,
        h_local: &[T],
        d: usize,
    ) -> Result<Vec<f32>> {
        let lo = self.col_bounds[comm.rank()];
        let mut send = vec![0f32; self.serve.data.len() * d];
        for (k, &id) in self.serve.data.iter().enumerate() {
            let i = (id as u64 - lo) as usize;
            crate::bf16::widen(&h_local[i * d..(i + 1) * d], &mut send[k * d..(k + 1) * d]);
        }
        let counts: Vec<usize> = self.serve.counts.iter().map(|c| c * d).collect();
        let got = comm.all_to_all_v(&send, &counts)?;
        let want: Vec<usize> = self.needed_counts.iter().map(|c| c * d).collect();
        if got.counts != want {
            return Err(Error::Comm(format!(
                "fold-in fetch: received {:?} values per rank, expected {want:?}",
                got.counts
            )));
        }
        Ok(got.data)
    }

    /// Collective: every rank must call. The folded-in rows (`num_rows x d`): each
    /// row's exact solve against H (`h_local`: this rank's shard, f32 or bf16;
    /// `gram_h`: the all-reduced Gramian of H) from zero, its visible arcs as `I_u`.
    pub fn global_fold_in<C: Comm, T: TableElem>(
        &self,
        comm: &C,
        h_local: &[T],
        d: usize,
        gram_h: &[f64],
        params: SolveParams,
    ) -> Result<(Vec<f32>, FoldTimes)> {
        let mut times = FoldTimes::default();
        let t = Instant::now();
        let h_fold = {
            let _p = comm.stats().phase("exchange");
            self.global_fetch(comm, h_local, d)?
        };
        times.fetch = t.elapsed().as_secs_f64();
        let _p = comm.stats().phase("eval");
        let t = Instant::now();
        let cpu0 = process_cpu_seconds();
        let mut x = vec![0f32; self.num_rows() * d];
        let view = RowsView {
            indptr: &self.fold_indptr,
            indices: &self.fold_pos,
            weights: (!self.fold_weights.is_empty()).then_some(&self.fold_weights[..]),
        };
        crate::cpu::blas_single_thread();
        let solved = cholesky_solve(&mut x, view, &h_fold, d, gram_h, params)
            .map_err(|e| Error::Comm(format!("fold-in: {e}")));
        times.solve_cpu = process_cpu_seconds() - cpu0;
        comm.agree(solved)?;
        times.solve = t.elapsed().as_secs_f64();
        Ok((x, times))
    }
}

/// The evaluated test rows as one rank sees them, once chosen.
struct RowSet {
    /// The evaluated test rows this rank owns (global row ids).
    rows: Vec<u32>,
    /// Their fold-in.
    fold: FoldPlan,
    /// Every evaluated row's visible arcs (global column ids, increasing per row), in
    /// row order over all ranks: the mask while scoring.
    all_fold_indptr: Vec<usize>,
    all_fold: Vec<u32>,
    /// Evaluated rows owned by each rank.
    rows_per_rank: Vec<usize>,
    /// Owned evaluated rows' held-out arcs.
    holdout_indptr: Vec<usize>,
    holdout: Vec<u32>,
}

impl RowSet {
    /// Collective: every rank must call. Chooses the evaluated rows (`which`) and
    /// plans the fetch of their fold-in rows of H.
    fn global_build<C: Comm>(comm: &C, s: &Shards, which: EvalRows) -> Result<Self> {
        let all_rows = comm.all_gather_v(&s.test_rows)?.data;
        let picked = local_pick_rows(&all_rows, s.meta.seed, which);
        let lo = s.test_lo as usize;
        let hi = lo + s.test_rows.len();
        let mine: Vec<usize> = picked
            .iter()
            .filter(|&&p| p >= lo && p < hi)
            .map(|&p| p - lo)
            .collect();
        let csr_row = |c: &super::shard::csr::CsrShard, i: usize| -> Vec<u32> {
            c.indices[c.indptr[i] as usize..c.indptr[i + 1] as usize].to_vec()
        };
        let mut fold_indptr = vec![0u64];
        let mut fold = Vec::new();
        let mut fold_w = Vec::new();
        let mut holdout_indptr = vec![0usize];
        let mut holdout = Vec::new();
        let mut mask_lens = Vec::with_capacity(mine.len());
        let mut mask = Vec::new();
        for &i in &mine {
            let f = csr_row(&s.fold, i);
            let mut sorted = f.clone();
            sorted.sort_unstable();
            mask_lens.push(sorted.len() as u64);
            mask.extend_from_slice(&sorted);
            fold.extend_from_slice(&f);
            if let Some(w) = s.fold.weights() {
                fold_w.extend_from_slice(
                    &w[s.fold.indptr[i] as usize..s.fold.indptr[i + 1] as usize],
                );
            }
            fold_indptr.push(fold.len() as u64);
            let mut h = csr_row(&s.holdout, i);
            h.sort_unstable();
            holdout.extend_from_slice(&h);
            holdout_indptr.push(holdout.len());
        }
        let rows: Vec<u32> = mine.iter().map(|&i| s.test_rows[i]).collect();
        let fold =
            FoldPlan::global_build(comm, fold_indptr, &fold, &s.col_bounds)?.with_weights(fold_w);
        let lens = comm.all_gather_v(&mask_lens)?;
        let rows_per_rank = lens.counts.clone();
        let all_fold_indptr =
            prefix_offsets(&lens.data.iter().map(|&l| l as usize).collect::<Vec<_>>());
        let all_fold = comm.all_gather_v(&mask)?.data;
        Ok(Self {
            rows,
            fold,
            all_fold_indptr,
            all_fold,
            rows_per_rank,
            holdout_indptr,
            holdout,
        })
    }

    fn num_rows(&self) -> usize {
        self.rows_per_rank.iter().sum()
    }

    /// Collective: every rank must call. See [`EvalSet::global_evaluate_timed`].
    fn global_evaluate_timed<C: Comm, T: TableElem>(
        &self,
        comm: &C,
        h_local: &[T],
        col_lo: u64,
        d: usize,
        gram_h: &[f64],
        params: SolveParams,
    ) -> Result<Measured> {
        let mut times = EvalTimes::default();
        let (x, ft) = self.fold.global_fold_in(comm, h_local, d, gram_h, params)?;
        times.fetch = ft.fetch;
        times.fold_in = ft.solve;
        times.fold_in_cpu = ft.solve_cpu;
        let _p = comm.stats().phase("eval");
        let t = Instant::now();
        let x_all = comm.all_gather_v(&x)?.data;
        times.gather = t.elapsed().as_secs_f64();

        // Score this rank's columns for every evaluated row, best MAX_K per row.
        let t = Instant::now();
        let cpu0 = process_cpu_seconds();
        let rows = ScoreRows {
            x: &x_all,
            mask_indptr: &self.all_fold_indptr,
            mask_cols: &self.all_fold,
        };
        let cands = local_score_topk(rows, h_local, col_lo, d, MAX_K);
        drop(x_all);
        times.score = t.elapsed().as_secs_f64();
        times.score_cpu = process_cpu_seconds() - cpu0;

        let t = Instant::now();
        let counts: Vec<usize> = self.rows_per_rank.iter().map(|n| n * MAX_K).collect();
        let merged = global_merge_topk(comm, &cands, &counts, MAX_K)?;
        drop(cands);
        let mut sums = EvalSums::new();
        for (i, ranking) in merged.chunks_exact(MAX_K).enumerate() {
            sums.add(
                ranking,
                &self.holdout[self.holdout_indptr[i]..self.holdout_indptr[i + 1]],
            );
        }
        let (recall, ranking) = sums.global_finish(comm);
        times.merge = t.elapsed().as_secs_f64();
        Ok(Measured {
            recall,
            ranking,
            times,
        })
    }
}

/// What one evaluation of a chosen row set measured.
#[derive(Debug, Clone, Copy)]
struct Measured {
    recall: Recall,
    ranking: Ranking,
    times: EvalTimes,
}

/// The evaluated test rows: chosen at build time (`--eval-rows N|all`), or at the
/// first evaluation (`--eval-rows auto`).
pub struct EvalSet {
    which: EvalRows,
    set: Option<RowSet>,
    /// `auto`: how the rows were chosen, once they are.
    choice: Option<AutoChoice>,
    /// The ranking metrics of the last [`EvalSet::global_evaluate_epoch`].
    last: Option<Ranking>,
}

impl EvalSet {
    /// Collective: every rank must call. Chooses the evaluated rows (`which`) and
    /// plans the fetch of their fold-in rows of H; with `auto`, does nothing until
    /// [`EvalSet::global_evaluate_epoch`] (no communication).
    pub fn global_build<C: Comm>(comm: &C, s: &Shards, which: EvalRows) -> Result<Self> {
        let set = match which {
            EvalRows::Auto => None,
            _ => Some(RowSet::global_build(comm, s, which)?),
        };
        Ok(Self {
            which,
            set,
            choice: None,
            last: None,
        })
    }

    /// The evaluated test rows this rank owns (global row ids, in test order); none
    /// before `auto` chose them.
    pub fn local_rows(&self) -> &[u32] {
        self.set.as_ref().map_or(&[], |s| &s.rows)
    }

    /// How many rows an evaluation scores (all ranks); 0 before `auto` chose them.
    pub fn num_rows(&self) -> usize {
        self.set.as_ref().map_or(0, RowSet::num_rows)
    }

    /// Collective: every rank must call. `h_local` is this rank's H shard (columns
    /// `col_lo..`, f32 or bf16), `gram_h` the all-reduced Gramian of H.
    #[allow(clippy::too_many_arguments)]
    pub fn global_evaluate<C: Comm, T: TableElem>(
        &self,
        comm: &C,
        h_local: &[T],
        col_lo: u64,
        d: usize,
        gram_h: &[f64],
        params: SolveParams,
    ) -> Result<Recall> {
        self.global_evaluate_timed(comm, h_local, col_lo, d, gram_h, params)
            .map(|(r, _)| r)
    }

    /// [`EvalSet::global_evaluate`] with this rank's seconds per part. With `auto`,
    /// only once the rows are chosen ([`EvalSet::global_evaluate_epoch`]).
    #[allow(clippy::too_many_arguments)]
    pub fn global_evaluate_timed<C: Comm, T: TableElem>(
        &self,
        comm: &C,
        h_local: &[T],
        col_lo: u64,
        d: usize,
        gram_h: &[f64],
        params: SolveParams,
    ) -> Result<(Recall, EvalTimes)> {
        self.global_measure(comm, h_local, col_lo, d, gram_h, params)
            .map(|m| (m.recall, m.times))
    }

    /// [`EvalSet::global_evaluate`] with the ranking metrics at every K up to
    /// [`MAX_K`] (from the same rankings).
    #[allow(clippy::too_many_arguments)]
    pub fn global_evaluate_ranking<C: Comm, T: TableElem>(
        &self,
        comm: &C,
        h_local: &[T],
        col_lo: u64,
        d: usize,
        gram_h: &[f64],
        params: SolveParams,
    ) -> Result<(Recall, Ranking)> {
        self.global_measure(comm, h_local, col_lo, d, gram_h, params)
            .map(|m| (m.recall, m.ranking))
    }

    /// Collective: every rank must call. One evaluation of the chosen rows.
    #[allow(clippy::too_many_arguments)]
    fn global_measure<C: Comm, T: TableElem>(
        &self,
        comm: &C,
        h_local: &[T],
        col_lo: u64,
        d: usize,
        gram_h: &[f64],
        params: SolveParams,
    ) -> Result<Measured> {
        match &self.set {
            Some(set) => set.global_evaluate_timed(comm, h_local, col_lo, d, gram_h, params),
            None => Err(Error::Config(
                "--eval-rows auto: the rows are chosen by the first evaluation after an epoch"
                    .into(),
            )),
        }
    }

    /// The ranking metrics of the last [`EvalSet::global_evaluate_epoch`] (`None`
    /// before the first).
    pub fn last_ranking(&self) -> Option<Ranking> {
        self.last
    }

    /// Collective: every rank must call. One evaluation after an epoch whose training
    /// took `epoch_seconds` (`None`: no epoch timed). With `--eval-rows auto`, the
    /// first call chooses the rows (see the module doc) from `s`, the shards the set
    /// was built from; `num_cols` is the width of H (for the scoring rate).
    #[allow(clippy::too_many_arguments)]
    pub fn global_evaluate_epoch<C: Comm, T: TableElem>(
        &mut self,
        comm: &C,
        s: &Shards,
        epoch_seconds: Option<f64>,
        h_local: &[T],
        col_lo: u64,
        d: usize,
        gram_h: &[f64],
        params: SolveParams,
    ) -> Result<EvalReport> {
        let mut probed = None;
        if self.set.is_none() {
            let (set, choice, result) =
                self.global_choose(comm, s, epoch_seconds, h_local, col_lo, d, gram_h, params)?;
            self.set = Some(set);
            self.choice = Some(choice);
            probed = result;
        }
        let set = self.set.as_ref().expect("chosen above");
        let Measured {
            recall,
            ranking,
            times,
        } = match probed {
            Some(r) => r,
            None => set.global_evaluate_timed(comm, h_local, col_lo, d, gram_h, params)?,
        };
        self.last = Some(ranking);
        let score_ns = comm.all_reduce_max((times.score * 1e9) as u64);
        let flops = 2.0 * d as f64 * recall.test_rows as f64 * s.meta.num_cols as f64;
        // The choice is reported as new once.
        let auto = self.choice;
        if let Some(c) = &mut self.choice {
            c.first = false;
        }
        Ok(EvalReport {
            recall,
            ranking,
            times,
            score_flops_per_second: flops / (score_ns as f64 * 1e-9).max(1e-9),
            auto,
        })
    }

    /// Collective: every rank must call. `auto`'s choice: the rows, how they were
    /// chosen, and the probe's evaluation when the probe is the chosen set.
    #[allow(clippy::too_many_arguments, clippy::type_complexity)]
    fn global_choose<C: Comm, T: TableElem>(
        &self,
        comm: &C,
        s: &Shards,
        epoch_seconds: Option<f64>,
        h_local: &[T],
        col_lo: u64,
        d: usize,
        gram_h: &[f64],
        params: SolveParams,
    ) -> Result<(RowSet, AutoChoice, Option<Measured>)> {
        let available = s.num_test;
        let mut choice = AutoChoice {
            rows: available,
            available,
            epoch_seconds,
            probe_rows: 0,
            probe_seconds: 0.0,
            first: true,
        };
        let Some(epoch_s) = epoch_seconds else {
            choice.rows = available.min(AUTO_UNTIMED_ROWS);
            let set = RowSet::global_build(comm, s, EvalRows::Sample(choice.rows))?;
            return Ok((set, choice, None));
        };
        if available <= AUTO_PROBE_ROWS {
            // No fewer than the probe would be chosen: all of them.
            let set = RowSet::global_build(comm, s, EvalRows::All)?;
            return Ok((set, choice, None));
        }
        let probe = RowSet::global_build(comm, s, EvalRows::Sample(AUTO_PROBE_ROWS))?;
        let t = Instant::now();
        let result = probe.global_evaluate_timed(comm, h_local, col_lo, d, gram_h, params)?;
        // Rank 0 decides from its own clock; every rank uses its numbers.
        let mut secs = [epoch_s, t.elapsed().as_secs_f64()];
        comm.broadcast(0, &mut secs)?;
        let per_row = secs[1] / AUTO_PROBE_ROWS as f64;
        choice.epoch_seconds = Some(secs[0]);
        choice.probe_rows = AUTO_PROBE_ROWS;
        choice.probe_seconds = secs[1];
        // The first evaluation also pays for the probe: the aimed share of the epoch
        // covers both (`n * per_row + probe <= aim * epoch`).
        let budget_epoch = secs[0] - secs[1] / AUTO_EPOCH_AIM;
        choice.rows = choose_eval_rows(budget_epoch, per_row, available, AUTO_MIN_ROWS);
        if choice.rows == AUTO_PROBE_ROWS {
            return Ok((probe, choice, Some(result)));
        }
        drop(probe);
        let set = RowSet::global_build(comm, s, EvalRows::Sample(choice.rows))?;
        Ok((set, choice, None))
    }

    /// What `--eval-rows` asked for.
    pub fn which(&self) -> EvalRows {
        self.which
    }
}

/// Collective: every rank must call. Sends each row's `k` candidates (`cands`, rows
/// in order over all ranks, `counts` values per owner: `k` per row) to the row's
/// owner, which merges them into the row's exact top `k` over all columns. Returns
/// this rank's rows in order, `k` each, best first, padded with [`Cand::NONE`].
pub fn global_merge_topk<C: Comm>(
    comm: &C,
    cands: &[Cand],
    counts: &[usize],
    k: usize,
) -> Result<Vec<Cand>> {
    let p = comm.size();
    let scores: Vec<f32> = cands.iter().map(|c| c.score).collect();
    let cols: Vec<u32> = cands.iter().map(|c| c.col).collect();
    let got_s = comm.all_to_all_v(&scores, counts)?;
    let got_c = comm.all_to_all_v(&cols, counts)?;
    if k == 0 {
        return Ok(Vec::new());
    }
    let t_local = got_s.counts.first().copied().unwrap_or(0) / k;
    if got_s.counts.iter().any(|&c| c != t_local * k) {
        return Err(Error::Comm(format!(
            "top-k merge: received {:?} candidates per rank, expected {} from each",
            got_s.counts,
            t_local * k
        )));
    }
    let offsets = got_s.offsets();
    let mut out = Vec::with_capacity(t_local * k);
    for i in 0..t_local {
        let mut top = TopK::new(k);
        for &off in &offsets[..p] {
            for j in off + i * k..off + (i + 1) * k {
                top.push(Cand {
                    score: got_s.data[j],
                    col: got_c.data[j],
                });
            }
        }
        out.extend(top.into_padded());
    }
    Ok(out)
}

/// Collective: every rank must call. The reference evaluation over every test row,
/// as `torusrec als` did before `--eval-rows`: fold-in through the training exchange
/// plan, scoring of all columns in blocks of 64 rows by one sgemm each, a
/// partition-point top-K insertion per column. Slow; for tests.
pub fn global_evaluate_all_ref<C: Comm>(
    comm: &C,
    s: &Shards,
    h_local: &[f32],
    d: usize,
    gram_h: &[f64],
    params: SolveParams,
) -> Result<Recall> {
    global_evaluate_all_ref_ranking(comm, s, h_local, d, gram_h, params).map(|r| r.0)
}

/// Collective: every rank must call. [`global_evaluate_all_ref`] with the ranking
/// metrics at every K up to [`MAX_K`].
pub fn global_evaluate_all_ref_ranking<C: Comm>(
    comm: &C,
    s: &Shards,
    h_local: &[f32],
    d: usize,
    gram_h: &[f64],
    params: SolveParams,
) -> Result<(Recall, Ranking)> {
    use rayon::prelude::*;
    let mut fold_local = s.fold.indices.clone();
    let plan =
        ExchangePlan::global_build(comm, ExchangeKind::Dedup, &mut fold_local, &s.col_bounds)?;
    let lens: Vec<u64> = s.fold.indptr.windows(2).map(|w| w[1] - w[0]).collect();
    let all_lens = comm.all_gather_v(&lens)?.data;
    let all_fold = comm.all_gather_v(&s.fold.indices)?.data;
    let all_fold_indptr = prefix_offsets(&all_lens.iter().map(|&l| l as usize).collect::<Vec<_>>());
    let col_lo = s.col_bounds[comm.rank()];
    crate::cpu::blas_single_thread();
    let fetched = plan.global_fetch(comm, h_local, d)?;
    let h_fold = fetched.as_deref().unwrap_or(h_local);
    let t_local = s.fold.indptr.len() - 1;
    let mut x = vec![0f32; t_local * d];
    let view = RowsView {
        indptr: &s.fold.indptr,
        indices: &fold_local,
        weights: s.fold.weights(),
    };
    let solved = cholesky_solve(&mut x, view, h_fold, d, gram_h, params)
        .map_err(|e| Error::Comm(format!("fold-in: {e}")));
    comm.agree(solved)?;
    let x_all = comm.all_gather_v(&x)?.data;
    let n_local = h_local.len() / d;
    let col_hi = col_lo + n_local as u64;
    const BLOCK: usize = 64;
    let t = s.num_test as usize;
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
                let mut sb = ndarray::ArrayViewMut2::from_shape((r1 - r0, n_local), &mut scores)
                    .expect("shape");
                ndarray::linalg::general_mat_mul(1.0, &xb, &hb.t(), 0.0, &mut sb);
            }
            let mut out = Vec::with_capacity((r1 - r0) * MAX_K);
            for r in r0..r1 {
                let row = &mut scores[(r - r0) * n_local..(r - r0 + 1) * n_local];
                for &c in &all_fold[all_fold_indptr[r]..all_fold_indptr[r + 1]] {
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
    let p = comm.size();
    let counts: Vec<usize> = (0..p)
        .map(|r| {
            let (a, b) = block_range(t as u64, p, r);
            (b - a) as usize * MAX_K
        })
        .collect();
    let merged = global_merge_topk(comm, &cands, &counts, MAX_K)?;
    let mut sums = EvalSums::new();
    for (i, ranking) in merged.chunks_exact(MAX_K).enumerate() {
        sums.add(
            ranking,
            &s.holdout.indices[s.holdout.indptr[i] as usize..s.holdout.indptr[i + 1] as usize],
        );
    }
    Ok(sums.global_finish(comm))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recall_divides_by_min_k_holdout() {
        let r: Vec<Cand> = (0..50).map(|c| Cand { score: 1.0, col: c }).collect();
        assert_eq!(recall_at(&r, &[3, 30, 100], 20), 1.0 / 3.0);
        assert_eq!(recall_at(&r, &[3, 30, 100], 50), 2.0 / 3.0);
        let many: Vec<u32> = (0..40).collect();
        assert_eq!(recall_at(&r, &many, 20), 1.0);
        assert_eq!(recall_at(&r, &[], 20), 0.0);
    }

    #[test]
    fn eval_rows_parse_and_print() {
        assert_eq!("all".parse::<EvalRows>(), Ok(EvalRows::All));
        assert_eq!("ALL".parse::<EvalRows>(), Ok(EvalRows::All));
        assert_eq!("123".parse::<EvalRows>(), Ok(EvalRows::Sample(123)));
        assert!("0".parse::<EvalRows>().is_err());
        assert!("-3".parse::<EvalRows>().is_err());
        assert!("some".parse::<EvalRows>().is_err());
        assert_eq!("auto".parse::<EvalRows>(), Ok(EvalRows::Auto));
        assert_eq!(EvalRows::Auto.to_string(), "auto");
        assert_eq!(EvalRows::default(), EvalRows::Auto);
        assert_eq!(EvalRows::Sample(7).to_string(), "7");
        assert_eq!(EvalRows::All.to_string(), "all");
    }

    #[test]
    fn auto_fits_a_fifth_of_the_epoch_within_floor_and_available() {
        // A fifth of 100 s at 0.01 s per row: 2,000 rows.
        assert_eq!(choose_eval_rows(100.0, 0.01, 1_000_000, 100), 2_000);
        // A shorter epoch picks fewer rows, a longer one more, up to all.
        assert_eq!(choose_eval_rows(10.0, 0.01, 1_000_000, 100), 200);
        assert_eq!(choose_eval_rows(1e6, 0.01, 1_000_000, 100), 1_000_000);
        assert!(
            choose_eval_rows(5.0, 0.01, 10_000, 100) < choose_eval_rows(50.0, 0.01, 10_000, 100)
        );
        // Never below the floor, unless there are fewer rows than that.
        assert_eq!(choose_eval_rows(0.001, 0.01, 1_000_000, 100), 100);
        assert_eq!(choose_eval_rows(0.0, 0.01, 1_000_000, 100), 100);
        assert_eq!(choose_eval_rows(0.001, 0.01, 40, 100), 40);
        assert_eq!(choose_eval_rows(100.0, 0.01, 100, 100), 100);
        // Nothing measurable per row: all; no finite epoch: the floor.
        assert_eq!(choose_eval_rows(1.0, 0.0, 5_000, 100), 5_000);
        assert_eq!(choose_eval_rows(1.0, f64::NAN, 5_000, 100), 5_000);
        assert_eq!(choose_eval_rows(f64::NAN, 0.01, 5_000, 100), 100);
        assert_eq!(choose_eval_rows(f64::INFINITY, 0.01, 5_000, 100), 100);
        // Exactly at the boundary (powers of two): the count that fits.
        assert_eq!(choose_eval_rows(5.0, 0.0625, 1_000, 10), 16);
        assert_eq!(choose_eval_rows(5.0, 0.0625, 16, 10), 16);
        assert_eq!(choose_eval_rows(5.0, 0.0625, 15, 10), 15);
    }

    #[test]
    fn pick_is_the_n_smallest_hashes_and_all_when_fewer() {
        let rows: Vec<u32> = (0..1000).map(|i| i * 7 + 3).collect();
        let pick = local_pick_rows(&rows, 5, EvalRows::Sample(100));
        assert_eq!(pick.len(), 100);
        assert!(pick.windows(2).all(|w| w[0] < w[1]));
        let key = |p: usize| (hash3(5, stream::EVAL_ROWS, rows[p] as u64), rows[p]);
        let worst_in = pick.iter().map(|&p| key(p)).max().unwrap();
        for p in 0..rows.len() {
            if !pick.contains(&p) {
                assert!(key(p) > worst_in);
            }
        }
        // The same ids in another order pick the same ids.
        let mut shuffled = rows.clone();
        shuffled.reverse();
        let mut a: Vec<u32> = pick.iter().map(|&p| rows[p]).collect();
        let mut b: Vec<u32> = local_pick_rows(&shuffled, 5, EvalRows::Sample(100))
            .iter()
            .map(|&p| shuffled[p])
            .collect();
        a.sort_unstable();
        b.sort_unstable();
        assert_eq!(a, b);
        let all: Vec<usize> = (0..1000).collect();
        assert_eq!(local_pick_rows(&rows, 5, EvalRows::Sample(5000)), all);
        assert_eq!(local_pick_rows(&rows, 5, EvalRows::Sample(1000)), all);
        assert_eq!(local_pick_rows(&rows, 5, EvalRows::All), all);
    }
}
