//! Hyper-parameter search for iALS (`torusrec tune`): `reg` x `unobserved_weight` scored
//! by Recall@20 on a validation split carved from the training rows.
//!
//! **Validation split.** Among the training rows that have arcs (test rows are empty in
//! `/train`, so they are never candidates), the `floor(r * fraction)` rows with the
//! smallest `(hash3(val_seed, VAL_ROWS, row), row)` are validation rows — the test
//! split's rule (`data::prepare::global_select_rows_by`) with its own stream and count.
//! A validation row's arcs are shuffled by `(val_seed, VAL_HOLDOUT_SHUFFLE, row)` and
//! `max(1, floor(n/4))` are held out; the rest are its visible (fold-in) arcs, exactly as
//! for a test row. During the search a validation row is what a test row is during
//! `als`: empty in training (its arcs leave both `/train` and `/train_t`), folded in
//! from its visible arcs at evaluation, scored against its held-out arcs. The choice
//! depends only on the dataset, the fraction and the seed, so it is the same at any
//! rank count; the test rows are not read by the search at all (the derived shards hold
//! the validation rows where the test rows were).
//!
//! **Why in memory.** The derived split is built from each rank's loaded shards: the
//! row side drops the validation rows' arcs locally, the column side drops them after
//! one all-gather of the validation row ids (4 bytes per validation row), and the
//! validation fold-in/holdout CSRs take the test set's place in [`Shards`]. No second
//! dataset is written, so there is no temporary file to clean up after a crash or a
//! preemption, no extra disk traffic, and nothing to keep consistent with the source
//! file; the cost is one extra copy of the CSRs in memory (the full shards are dropped
//! before the search trains).
//!
//! **Search.** Every point trains from the same initial tables (from `--seed`) for its
//! epochs and is scored once on the validation rows. `grid` gives every point
//! `min(budget / points, max_epochs)` epochs. `halving` (successive halving) runs rungs:
//! rung 0 trains every point, each later rung keeps the best `floor(n / eta)` of the
//! previous rung (while at least two are left) and trains them `eta` times longer; the
//! last rung trains `top` epochs and rung k `max(1, top / eta^(last - k))`, where `top`
//! is `max_epochs` or, when the budget is smaller than that schedule needs, the largest
//! that fits (a rung that would train no longer than the one before is dropped). A survivor is retrained
//! from the initial tables (its tables are not kept between rungs, so the memory stays
//! that of one model); the budget counts every epoch run. The best point is the
//! arg-max of validation Recall@20 (then Recall@50, then the earlier point) over the
//! last rung.
//!
//! `refine` (the default) searches in (log10 reg, log10 weight) inside the grid's box
//! (from its smallest to its largest value on each axis), every point for `max_epochs`,
//! `budget / max_epochs` trainings in all ([`Refiner`]). It first trains the centres of
//! the grid's cells (in log space: the geometric mean of each pair of neighbouring
//! values; an axis with one value keeps it), a 2 x 2 design for the default 3 x 3 grid,
//! so that most of the budget is left for the search; then it runs an opportunistic
//! compass search: it polls the best point so far at plus and minus one step on each
//! axis (the first step half the grid's spacing, so a centre's poll reaches the grid's
//! points around it; after a move the direction that succeeded is tried first again,
//! the rest of the poll ordered by the score of the nearest point already trained, best
//! first; points outside the box or trained already are skipped), moves to the first
//! poll point that beats every earlier point and polls again from there at the same
//! step, and halves the steps when a whole poll finds nothing better. Every point trains
//! the same epochs, so the best is the arg-max over all of them. Recall surfaces of iALS
//! are steep in the unobserved weight (a decade apart, the best of a grid depends on
//! where the grid happens to fall), which is why the search spends its trainings on
//! steps rather than on the edges and corners of a wide box, where the optimum seldom
//! is (a poll still reaches them).
//!
//! A preemption signal, between or inside points, stops every rank with
//! [`Error::Interrupted`] (exit 1, not 75: a tune writes no checkpoint, so there is
//! nothing to resume and a rerun starts over).

use super::eval::Recall;
use super::shard::{CsrShard, Shards};
use super::train::{global_gramian, TableScalar, Trainer};
use super::AlsConfig;
use crate::ckpt::signals::Preemption;
use crate::comm::{prefix_offsets, Comm};
use crate::data::prepare::{global_select_rows_by, split_row_in};
use crate::error::{Error, Result};
use crate::rng::stream;
use serde::{Deserialize, Serialize};
use std::time::Instant;

/// One setting of the search.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Point {
    pub reg: f32,
    pub unobserved_weight: f32,
}

/// Parse `--reg` / `--unobserved-weight`: one value, a comma-separated list, or
/// `LO:HI:N` (N log-spaced points from LO to HI, both included). Values must be finite
/// and >= 0 (ranges > 0); duplicates are dropped, the order kept.
pub fn parse_values(s: &str) -> std::result::Result<Vec<f32>, String> {
    let q = crate::error::quote(s);
    let num = |t: &str| -> std::result::Result<f64, String> {
        let v: f64 = t
            .trim()
            .parse()
            .map_err(|_| format!("{q}: `{}` is not a number", t.trim()))?;
        if !v.is_finite() || v < 0.0 {
            return Err(format!("{q}: {v} must be a finite number >= 0"));
        }
        Ok(v)
    };
    let mut out: Vec<f32> = Vec::new();
    if s.contains(':') {
        let parts: Vec<&str> = s.split(':').collect();
        if parts.len() != 3 {
            return Err(format!("{q}: a range is LO:HI:N, e.g. 1e-5:1e-2:4"));
        }
        let (lo, hi) = (num(parts[0])?, num(parts[1])?);
        let n: usize = parts[2]
            .trim()
            .parse()
            .map_err(|_| format!("{q}: N must be a point count"))?;
        if n == 0 {
            return Err(format!("{q}: N = 0 makes an empty grid"));
        }
        if lo <= 0.0 || hi < lo {
            return Err(format!("{q}: a log range needs 0 < LO <= HI"));
        }
        if n > 1000 {
            return Err(format!("{q}: at most 1000 points per axis"));
        }
        for i in 0..n {
            let v = if i == 0 {
                lo
            } else if i == n - 1 {
                hi
            } else {
                let t = i as f64 / (n - 1) as f64;
                10f64.powf(lo.log10() + t * (hi.log10() - lo.log10()))
            };
            out.push(v as f32);
        }
    } else {
        for t in s.split(',') {
            if t.trim().is_empty() {
                continue;
            }
            out.push(num(t)? as f32);
        }
    }
    let mut seen: Vec<f32> = Vec::new();
    out.retain(|v| {
        let new = !seen.contains(v);
        seen.push(*v);
        new
    });
    if out.is_empty() {
        return Err(format!("{q}: an empty list of values"));
    }
    Ok(out)
}

/// One axis of the grid as given on the command line (see [`parse_values`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Values(pub Vec<f32>);

impl std::str::FromStr for Values {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        parse_values(s).map(Values)
    }
}

/// The grid: every (reg, weight) pair, reg major.
pub fn grid_points(regs: &[f32], weights: &[f32]) -> Vec<Point> {
    regs.iter()
        .flat_map(|&reg| {
            weights.iter().map(move |&w| Point {
                reg,
                unobserved_weight: w,
            })
        })
        .collect()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
pub enum Strategy {
    /// Every point for budget / points epochs.
    Grid,
    /// Successive halving over epochs: keep the best 1/eta per rung.
    Halving,
    /// The grid, then a compass search in log space around the best point so far.
    Refine,
}

/// One rung of a schedule: how many points train, for how many epochs each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rung {
    pub points: usize,
    pub epochs: usize,
}

/// Epochs the schedule runs in all.
pub fn total_epochs(rungs: &[Rung]) -> usize {
    rungs.iter().map(|r| r.points * r.epochs).sum()
}

/// The rungs of a search over `points` settings within `budget` epochs (`None`: as
/// many as the schedule needs to reach `max_epochs`), each point training at most
/// `max_epochs` (see the module doc). Pure; refuses (exit 2) a budget too small for one
/// epoch per point.
pub fn schedule(
    strategy: Strategy,
    points: usize,
    budget: Option<usize>,
    max_epochs: usize,
    eta: usize,
) -> Result<Vec<Rung>> {
    if points == 0 {
        return Err(Error::Config("an empty grid: nothing to search".into()));
    }
    if max_epochs == 0 {
        return Err(Error::Config("--epochs 0: train at least one epoch".into()));
    }
    let too_small = |need: usize, b: usize| {
        Error::Config(format!(
            "--budget {b}: too small; {strategy:?} over {points} points needs at least {need} epochs (one per point)"
        ))
    };
    match strategy {
        Strategy::Refine => {
            let t = refine_trainings(points, budget, max_epochs)?;
            Ok(vec![Rung {
                points: t,
                epochs: max_epochs,
            }])
        }
        Strategy::Grid => {
            let b = budget.unwrap_or(points.saturating_mul(max_epochs));
            let e = (b / points).min(max_epochs);
            if e == 0 {
                return Err(too_small(points, b));
            }
            Ok(vec![Rung { points, epochs: e }])
        }
        Strategy::Halving => {
            if eta < 2 {
                return Err(Error::Config(format!("--eta {eta}: must be at least 2")));
            }
            // Rung sizes: n, n/eta, ... while at least two points are left to compare.
            let mut sizes = vec![points];
            while sizes[sizes.len() - 1] / eta >= 2 {
                sizes.push(sizes[sizes.len() - 1] / eta);
            }
            let last = sizes.len() - 1;
            // The last rung trains `top` epochs, rung k top / eta^(last - k) (at least
            // one); a rung that would train no longer than the one before is dropped.
            let build = |top: usize| -> Vec<Rung> {
                let mut rungs: Vec<Rung> = Vec::new();
                for (k, &n) in sizes.iter().enumerate() {
                    let div = (eta as u128).saturating_pow((last - k) as u32);
                    let e = ((top as u128 / div) as usize).max(1);
                    if rungs.last().is_some_and(|r| r.epochs >= e) {
                        continue;
                    }
                    rungs.push(Rung {
                        points: n,
                        epochs: e,
                    });
                }
                rungs
            };
            let Some(b) = budget else {
                return Ok(build(max_epochs));
            };
            (1..=max_epochs)
                .rev()
                .map(build)
                .find(|r| total_epochs(r) <= b)
                .ok_or_else(|| too_small(total_epochs(&build(1)), b))
        }
    }
}

/// Trainings of a refine search whose first design ([`refine_design`]) has `points`:
/// `budget / max_epochs` (every training runs `max_epochs`), by default three times the
/// design (12 for the default 2 x 2); refused (exit 2) when the budget does not cover
/// the design.
pub fn refine_trainings(points: usize, budget: Option<usize>, max_epochs: usize) -> Result<usize> {
    let t = match budget {
        None => points.saturating_mul(3),
        Some(b) => b / max_epochs,
    };
    if t < points {
        return Err(Error::Config(format!(
            "--budget {}: too small; refine trains the {points} centres of the grid's cells first, {max_epochs} epochs each, so it needs at least {} epochs",
            budget.unwrap_or(0),
            points.saturating_mul(max_epochs)
        )));
    }
    Ok(t)
}

/// Steps below this (in decades) are not refined further.
pub const MIN_STEP_DECADES: f64 = 1e-3;

/// The centres of the cells between neighbouring values of one axis, in log space (the
/// geometric means, increasing); one value: itself. Values must be > 0.
fn cell_centres(v: &[f32]) -> Vec<f32> {
    let mut s: Vec<f64> = v.iter().map(|&x| x as f64).collect();
    s.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    s.dedup();
    if s.len() == 1 {
        return vec![s[0] as f32];
    }
    s.windows(2).map(|w| (w[0] * w[1]).sqrt() as f32).collect()
}

/// The points a refine search trains first: the centres of the grid's cells (module
/// doc), reg major. Values must be > 0.
pub fn refine_design(regs: &[f32], weights: &[f32]) -> Vec<Point> {
    grid_points(&cell_centres(regs), &cell_centres(weights))
}

/// The refine strategy's proposals (module doc): the centres of the grid's cells first,
/// then an opportunistic compass search in (log10 reg, log10 weight) inside the grid's
/// box. Pure and deterministic: the same scores give the same points.
#[derive(Debug, Clone)]
pub struct Refiner {
    design: Vec<Point>,
    trainings: usize,
    /// The box, in the values themselves (f32) and in decades.
    lo: [f32; 2],
    hi: [f32; 2],
    /// The grid's spacing per axis in decades (0: one value, the axis is not searched).
    spacing: [f64; 2],
    step: [f64; 2],
    tried: Vec<(Point, Recall)>,
    queue: Vec<Point>,
    /// A poll is under way (its points are queued or were tried without improving).
    polling: bool,
    /// The axis and sign of the last move (tried first in the next poll).
    last_move: Option<(usize, f64)>,
}

fn coords(p: Point) -> [f64; 2] {
    [(p.reg as f64).log10(), (p.unobserved_weight as f64).log10()]
}

fn better(a: &Recall, b: &Recall) -> bool {
    (a.at20, a.at50) > (b.at20, b.at50)
}

impl Refiner {
    /// Refine around the grid `regs` x `weights` (reg major) with `trainings` in all.
    pub fn new(regs: &[f32], weights: &[f32], trainings: usize) -> Result<Self> {
        let axes = [regs, weights];
        let mut lo = [0f32; 2];
        let mut hi = [0f32; 2];
        let mut spacing = [0f64; 2];
        for (k, v) in axes.iter().enumerate() {
            if v.iter().any(|&x| x <= 0.0) {
                return Err(Error::Config(format!(
                    "--strategy refine searches in log space: every {} value must be > 0",
                    ["--reg", "--unobserved-weight"][k]
                )));
            }
            lo[k] = v.iter().copied().fold(f32::INFINITY, f32::min);
            hi[k] = v.iter().copied().fold(0.0, f32::max);
            if v.len() > 1 {
                spacing[k] =
                    ((hi[k] as f64).log10() - (lo[k] as f64).log10()) / (v.len() - 1) as f64;
            }
        }
        if spacing == [0.0, 0.0] {
            return Err(Error::Config(
                "--strategy refine needs at least two values of --reg or --unobserved-weight (the box it refines in)".into(),
            ));
        }
        let design = refine_design(regs, weights);
        if trainings < design.len() {
            return Err(Error::Config(format!(
                "refine: {trainings} trainings do not cover the {} centres of the grid's cells",
                design.len()
            )));
        }
        Ok(Refiner {
            design,
            trainings,
            lo,
            hi,
            spacing,
            step: [spacing[0] / 2.0, spacing[1] / 2.0],
            tried: Vec::new(),
            queue: Vec::new(),
            polling: false,
            last_move: None,
        })
    }

    /// The first design: the centres of the grid's cells, reg major.
    pub fn design(&self) -> &[Point] {
        &self.design
    }

    /// Whether `p` lies in the box.
    pub fn inside(&self, p: Point) -> bool {
        (self.lo[0]..=self.hi[0]).contains(&p.reg)
            && (self.lo[1]..=self.hi[1]).contains(&p.unobserved_weight)
    }

    fn best(&self) -> Option<usize> {
        let mut b: Option<usize> = None;
        for (i, (_, r)) in self.tried.iter().enumerate() {
            if b.is_none_or(|j| better(r, &self.tried[j].1)) {
                b = Some(i);
            }
        }
        b
    }

    fn known(&self, p: Point) -> bool {
        self.tried.iter().any(|(q, _)| *q == p) || self.queue.contains(&p)
    }

    /// The score expected at `c`: that of the nearest tried point other than `center`
    /// (distance in grid spacings), for the order of a poll.
    fn predicted(&self, c: [f64; 2], center: usize) -> (f64, f64) {
        let mut best: Option<(f64, usize)> = None;
        for (i, (q, _)) in self.tried.iter().enumerate() {
            if i == center {
                continue;
            }
            let x = coords(*q);
            let d: f64 = (0..2)
                .filter(|&k| self.spacing[k] > 0.0)
                .map(|k| ((x[k] - c[k]) / self.spacing[k]).powi(2))
                .sum();
            if best.is_none_or(|(bd, _)| d < bd) {
                best = Some((d, i));
            }
        }
        best.map_or((f64::NEG_INFINITY, f64::NEG_INFINITY), |(_, i)| {
            let r = &self.tried[i].1;
            (r.at20, r.at50)
        })
    }

    /// The next point to train, or `None` when the trainings are spent (or every step
    /// has shrunk below [`MIN_STEP_DECADES`]).
    pub fn propose(&mut self) -> Option<Point> {
        let n = self.tried.len();
        if n >= self.trainings {
            return None;
        }
        if n < self.design.len() {
            return Some(self.design[n]);
        }
        loop {
            if !self.queue.is_empty() {
                return Some(self.queue.remove(0));
            }
            if self.polling {
                // The last poll found nothing better: look closer.
                self.step = [self.step[0] / 2.0, self.step[1] / 2.0];
            }
            if (0..2).all(|k| self.spacing[k] == 0.0 || self.step[k] < MIN_STEP_DECADES) {
                return None;
            }
            self.polling = true;
            let center = self.best().expect("the grid was tried");
            let c = coords(self.tried[center].0);
            let mut cands: Vec<(Point, (bool, f64, f64))> = Vec::new();
            for k in 0..2 {
                if self.spacing[k] == 0.0 {
                    continue;
                }
                for sign in [1.0, -1.0] {
                    let mut x = c;
                    x[k] += sign * self.step[k];
                    let mut p = self.tried[center].0;
                    let v = 10f64.powf(x[k]) as f32;
                    if k == 0 {
                        p.reg = v;
                    } else {
                        p.unobserved_weight = v;
                    }
                    if self.inside(p) && !self.known(p) && !cands.iter().any(|(q, _)| *q == p) {
                        let (s20, s50) = self.predicted(x, center);
                        cands.push((p, (self.last_move == Some((k, sign)), s20, s50)));
                    }
                }
            }
            // The last move's direction, then the most promising; ties keep the order
            // reg up, reg down, weight up, weight down.
            cands.sort_by(|a, b| b.1.partial_cmp(&a.1).unwrap_or(std::cmp::Ordering::Equal));
            self.queue = cands.into_iter().map(|(p, _)| p).collect();
        }
    }

    /// Record what `p` (the last proposal) scored. A refinement point that beats every
    /// earlier one becomes the centre of the next poll, at the same step, and the
    /// direction it moved in is tried first there.
    pub fn record(&mut self, p: Point, r: Recall) {
        let was = self.best();
        self.tried.push((p, r));
        if self.tried.len() > self.design.len() {
            if let Some(b) = was.filter(|&b| better(&r, &self.tried[b].1)) {
                let (from, to) = (coords(self.tried[b].0), coords(p));
                self.last_move = (0..2)
                    .find(|&k| from[k] != to[k])
                    .map(|k| (k, if to[k] > from[k] { 1.0 } else { -1.0 }));
                self.queue.clear();
                self.polling = false;
            }
        }
    }
}

/// Where `tune`'s validation rows come from.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ValSpec {
    /// Fraction of the non-empty training rows, in (0, 1).
    pub fraction: f64,
    pub seed: u64,
}

impl ValSpec {
    pub fn validate(&self) -> Result<()> {
        if !(self.fraction > 0.0 && self.fraction < 1.0) {
            return Err(Error::Config(format!(
                "--val-fraction {}: must be in (0, 1)",
                self.fraction
            )));
        }
        Ok(())
    }
    /// Validation rows among `r` non-empty training rows.
    pub fn count(&self, r: u64) -> u64 {
        (r as f64 * self.fraction).floor() as u64
    }
}

/// The sizes of a validation split (the same at every rank count).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ValStats {
    pub rows: u64,
    pub visible_arcs: u64,
    pub holdout_arcs: u64,
    /// Training arcs left for the search.
    pub train_arcs: u64,
    /// Wrapping sum of mixes of every validation row and held-out arc (src/als/tune.rs;
    /// scripts/tune_implicit.py computes the same): equal digests, equal splits.
    pub digest: u64,
}

fn csr_from_rows(lo: u64, rows: &[Vec<u32>]) -> CsrShard {
    let mut indptr = Vec::with_capacity(rows.len() + 1);
    indptr.push(0u64);
    let mut indices = Vec::new();
    for r in rows {
        indices.extend_from_slice(r);
        indptr.push(indices.len() as u64);
    }
    CsrShard {
        lo,
        hi: lo + rows.len() as u64,
        indptr,
        indices,
        on_disk: None,
    }
}

/// Collective: every rank must call. The validation split of the training shards
/// `full` (module doc): shards whose training arcs exclude the validation rows and
/// whose "test" set is the validation rows. The real test rows are not carried over.
pub fn global_validation_shards<C: Comm>(
    comm: &C,
    full: &Shards,
    spec: ValSpec,
) -> Result<(Shards, ValStats)> {
    let rows = &full.rows;
    let nonempty: Vec<bool> = rows.indptr.windows(2).map(|w| w[1] > w[0]).collect();
    let is_val =
        global_select_rows_by(comm, rows.lo, &nonempty, spec.seed, stream::VAL_ROWS, |r| {
            spec.count(r)
        })?;
    let mut train_rows = Vec::with_capacity(rows.num_rows());
    let (mut val_rows, mut folds, mut holds) = (Vec::new(), Vec::new(), Vec::new());
    for (i, &v) in is_val.iter().enumerate() {
        let arcs = &rows.indices[rows.indptr[i] as usize..rows.indptr[i + 1] as usize];
        if !v {
            train_rows.push(arcs.to_vec());
            continue;
        }
        let id = rows.lo + i as u64;
        let (mut fold, mut hold) = split_row_in(arcs, spec.seed, stream::VAL_HOLDOUT_SHUFFLE, id);
        fold.sort_unstable();
        hold.sort_unstable();
        val_rows.push(id as u32);
        folds.push(fold);
        holds.push(hold);
        train_rows.push(Vec::new());
    }
    let gathered = comm.all_gather_v(&val_rows)?;
    let all_val = gathered.data; // increasing: ranks own increasing row blocks
    let val_lo = prefix_offsets(&gathered.counts)[comm.rank()] as u64;
    let is_val_id = |r: u32| all_val.binary_search(&r).is_ok();
    let cols = &full.cols;
    let col_rows: Vec<Vec<u32>> = cols
        .indptr
        .windows(2)
        .map(|w| {
            cols.indices[w[0] as usize..w[1] as usize]
                .iter()
                .copied()
                .filter(|&r| !is_val_id(r))
                .collect()
        })
        .collect();
    let new_rows = csr_from_rows(rows.lo, &train_rows);
    let new_cols = csr_from_rows(cols.lo, &col_rows);
    let fold = csr_from_rows(val_lo, &folds);
    let holdout = csr_from_rows(val_lo, &holds);
    let mut sums = [fold.nnz(), holdout.nnz(), new_rows.nnz(), new_cols.nnz()];
    comm.all_reduce_sum(&mut sums);
    if sums[2] != sums[3] {
        return Err(Error::Comm(format!(
            "validation split: {} arcs left by rows but {} by columns",
            sums[2], sums[3]
        )));
    }
    // Each rank's wrapping sum over its rows and held-out arcs, gathered and summed.
    let mut mine = 0u64;
    for (i, &r) in val_rows.iter().enumerate() {
        mine = mine.wrapping_add(crate::rng::mix64(r as u64 ^ 0x5851_f42d_4c95_7f2d));
        for &c in &holdout.indices[holdout.indptr[i] as usize..holdout.indptr[i + 1] as usize] {
            let arc = ((r as u64) << 32) | c as u64;
            mine = mine.wrapping_add(crate::rng::mix64(arc ^ 0x2545_f491_4f6c_dd1d));
        }
    }
    let digest = comm
        .all_gather_v(&[mine])?
        .data
        .iter()
        .fold(0u64, |a, &x| a.wrapping_add(x));
    let stats = ValStats {
        rows: all_val.len() as u64,
        visible_arcs: sums[0],
        holdout_arcs: sums[1],
        train_arcs: sums[2],
        digest,
    };
    let shards = Shards {
        meta: full.meta.clone(),
        row_bounds: full.row_bounds.clone(),
        col_bounds: full.col_bounds.clone(),
        rows: new_rows,
        cols: new_cols,
        row_imbalance: full.row_imbalance,
        col_imbalance: full.col_imbalance,
        test_lo: val_lo,
        test_rows: val_rows,
        fold,
        holdout,
        num_test: stats.rows,
        layout: full.layout,
        // The dataset's: a validation split is never written into a model.
        arcs_checksum: full.arcs_checksum,
    };
    Ok((shards, stats))
}

/// What one trained point scored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PointResult {
    /// Index in the grid (reg major).
    pub index: usize,
    pub rung: usize,
    pub point: Point,
    pub epochs: usize,
    /// Validation recall.
    pub recall: Recall,
    pub loss: f64,
    /// Training and validation seconds.
    pub seconds: f64,
}

/// The whole search.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SearchReport {
    pub rungs: Vec<Rung>,
    /// Every trained point, in the order trained.
    pub results: Vec<PointResult>,
    /// Position in `results` of the best (the last rung's arg-max).
    pub best: usize,
    pub epochs_run: usize,
    pub seconds: f64,
}

/// The arg-max over `results` by (Recall@20, Recall@50), ties to the earlier grid point;
/// `None` when empty.
pub fn arg_best(results: &[PointResult]) -> Option<usize> {
    let mut best: Option<usize> = None;
    for (i, r) in results.iter().enumerate() {
        let better = match best {
            None => true,
            Some(b) => {
                let o = &results[b];
                (r.recall.at20, r.recall.at50, std::cmp::Reverse(r.index))
                    > (o.recall.at20, o.recall.at50, std::cmp::Reverse(o.index))
            }
        };
        if better {
            best = Some(i);
        }
    }
    best
}

/// Collective: every rank must call. A preemption seen by any rank stops every rank.
fn global_check_preempt<C: Comm>(comm: &C, preempt: &Preemption, what: &str) -> Result<()> {
    if comm.all_reduce_max(u64::from(preempt.is_set())) != 0 {
        return Err(Error::Interrupted(format!(
            "signal received {what}; a tune saves nothing, a rerun starts over (exit 1, not 75: there is nothing to resume)"
        )));
    }
    Ok(())
}

/// One model, reset to the same initial tables for every point it trains.
struct PointTrainer<T: TableScalar> {
    tr: Trainer<T>,
    w0: Vec<T>,
    h0: Vec<T>,
    gram_h0: Vec<f64>,
    preempt: Preemption,
}

impl<T: TableScalar> PointTrainer<T> {
    /// Collective.
    fn global_new<C: Comm>(
        comm: &C,
        base: &AlsConfig,
        val: Shards,
        first: Point,
        preempt: Preemption,
    ) -> Result<Self> {
        let mut cfg = base.clone();
        cfg.out = None;
        cfg.metrics = None;
        cfg.eval_every = 0;
        cfg.checkpoint = Default::default();
        cfg.reg = first.reg;
        cfg.unobserved_weight = first.unobserved_weight;
        let tr = Trainer::<T>::global_from_shards(comm, &cfg, val, preempt.clone())?;
        let (w0, h0) = (tr.w.clone(), tr.h.clone());
        let gram_h0 = global_gramian(comm, &h0, cfg.dim);
        Ok(PointTrainer {
            tr,
            w0,
            h0,
            gram_h0,
            preempt,
        })
    }

    /// Collective: train `p` from the initial tables for `epochs` and score it.
    fn global_train<C: Comm>(
        &mut self,
        comm: &C,
        index: usize,
        rung: usize,
        p: Point,
        epochs: usize,
    ) -> Result<PointResult> {
        global_check_preempt(comm, &self.preempt, "between tune points")?;
        let t = Instant::now();
        let tr = &mut self.tr;
        tr.cfg.reg = p.reg;
        tr.cfg.unobserved_weight = p.unobserved_weight;
        tr.cfg.epochs = epochs;
        tr.restore(
            super::checkpoint::Position::default(),
            self.w0.clone(),
            self.h0.clone(),
            Vec::new(),
            self.gram_h0.clone(),
        );
        let mut last = None;
        for e in 0..epochs {
            let rep = tr.global_epoch(comm, e + 1 == epochs).map_err(|e| match e {
                Error::Interrupted(_) => Error::Interrupted(format!(
                    "signal received while training tune point {} (reg {}, weight {}); a tune saves nothing, a rerun starts over (exit 1, not 75: there is nothing to resume)",
                    index + 1,
                    p.reg,
                    p.unobserved_weight
                )),
                other => other,
            })?;
            last = Some(rep);
        }
        let rep = last.expect("a point trains at least one epoch");
        Ok(PointResult {
            index,
            rung,
            point: p,
            epochs,
            recall: rep.recall.expect("the last epoch evaluates"),
            loss: rep.loss,
            seconds: t.elapsed().as_secs_f64(),
        })
    }
}

/// Collective: every rank must call. Runs the search on the validation shards `val`:
/// `base` gives every option but reg, weight and epochs; `on_point` sees every result
/// (on every rank) as it is scored.
pub fn global_search<C: Comm, T: TableScalar>(
    comm: &C,
    base: &AlsConfig,
    val: Shards,
    points: &[Point],
    rungs: &[Rung],
    preempt: Preemption,
    mut on_point: impl FnMut(&PointResult),
) -> Result<SearchReport> {
    let t0 = Instant::now();
    if points.is_empty() {
        return Err(Error::Config("an empty grid".into()));
    }
    let mut pt = PointTrainer::<T>::global_new(comm, base, val, points[0], preempt)?;
    let mut results: Vec<PointResult> = Vec::new();
    let mut alive: Vec<usize> = (0..points.len()).collect();
    let mut last_rung: Vec<usize> = Vec::new();
    let mut epochs_run = 0;
    for (k, rung) in rungs.iter().enumerate() {
        if k > 0 {
            // Keep the best `rung.points` of the previous rung.
            let mut prev: Vec<PointResult> =
                last_rung.iter().map(|&i| results[i].clone()).collect();
            let mut keep = Vec::new();
            while keep.len() < rung.points && !prev.is_empty() {
                let b = arg_best(&prev).expect("non-empty");
                keep.push(prev.remove(b).index);
            }
            keep.sort_unstable();
            alive = keep;
        }
        last_rung.clear();
        for &idx in &alive {
            let r = pt.global_train(comm, idx, k, points[idx], rung.epochs)?;
            epochs_run += rung.epochs;
            on_point(&r);
            last_rung.push(results.len());
            results.push(r);
        }
    }
    let in_last: Vec<PointResult> = last_rung.iter().map(|&i| results[i].clone()).collect();
    let b = arg_best(&in_last).ok_or_else(|| Error::Config("an empty grid".into()))?;
    Ok(SearchReport {
        rungs: rungs.to_vec(),
        best: last_rung[b],
        results,
        epochs_run,
        seconds: t0.elapsed().as_secs_f64(),
    })
}

/// Collective: every rank must call. The refine strategy: the centres of the cells of
/// the grid `regs` x `weights`, then the [`Refiner`]'s compass search, `trainings`
/// points in all, each trained `epochs`. A result's `index` is its place in the training
/// order, its `rung` 0 for a design point and 1 for a compass-search point; the best is the arg-max over all of them
/// (every point trains the same epochs). Every rank sees the same scores, so every rank
/// proposes the same points.
#[allow(clippy::too_many_arguments)]
pub fn global_refine<C: Comm, T: TableScalar>(
    comm: &C,
    base: &AlsConfig,
    val: Shards,
    regs: &[f32],
    weights: &[f32],
    trainings: usize,
    epochs: usize,
    preempt: Preemption,
    mut on_point: impl FnMut(&PointResult),
) -> Result<SearchReport> {
    let t0 = Instant::now();
    let mut rf = Refiner::new(regs, weights, trainings)?;
    let grid = rf.design().len();
    let first = rf.propose().expect("a design has a point");
    let mut pt = PointTrainer::<T>::global_new(comm, base, val, first, preempt)?;
    let mut results: Vec<PointResult> = Vec::new();
    let mut next = Some(first);
    while let Some(p) = next {
        let n = results.len();
        let r = pt.global_train(comm, n, usize::from(n >= grid), p, epochs)?;
        rf.record(p, r.recall);
        on_point(&r);
        results.push(r);
        next = rf.propose();
    }
    let best = arg_best(&results).ok_or_else(|| Error::Config("an empty grid".into()))?;
    let points = |rung: usize| results.iter().filter(|r| r.rung == rung).count();
    let rungs: Vec<Rung> = (0..2)
        .map(|k| Rung {
            points: points(k),
            epochs,
        })
        .filter(|r| r.points > 0)
        .collect();
    Ok(SearchReport {
        epochs_run: results.len() * epochs,
        rungs,
        best,
        results,
        seconds: t0.elapsed().as_secs_f64(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_lists_and_log_ranges() {
        assert_eq!(parse_values("0.1").unwrap(), vec![0.1]);
        assert_eq!(parse_values("1e-3, 1e-2,1e-3").unwrap(), vec![1e-3, 1e-2]);
        assert_eq!(
            parse_values("1e-5:1e-2:4").unwrap(),
            vec![1e-5, 1e-4, 1e-3, 1e-2]
        );
        assert_eq!(parse_values("2:2:1").unwrap(), vec![2.0]);
        for bad in [
            "",
            ",",
            "-1",
            "1e-3:1e-2:0",
            "0:1:3",
            "1:0.1:3",
            "a",
            "1:2",
            "nan",
        ] {
            assert!(parse_values(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn grid_schedule_divides_the_budget() {
        let r = schedule(Strategy::Grid, 12, Some(100), 16, 3).unwrap();
        assert_eq!(
            r,
            vec![Rung {
                points: 12,
                epochs: 8
            }]
        );
        let r = schedule(Strategy::Grid, 12, Some(1000), 16, 3).unwrap();
        assert_eq!(r[0].epochs, 16);
        assert_eq!(
            schedule(Strategy::Grid, 12, None, 16, 3).unwrap()[0].epochs,
            16
        );
        assert!(schedule(Strategy::Grid, 12, Some(11), 16, 3).is_err());
        assert!(schedule(Strategy::Grid, 0, Some(11), 16, 3).is_err());
    }

    #[test]
    fn halving_rungs_respect_the_budget() {
        for points in 1..40 {
            for eta in 2..5 {
                for max in [1, 2, 5, 8, 16] {
                    let full = schedule(Strategy::Halving, points, None, max, eta).unwrap();
                    assert_eq!(full[full.len() - 1].epochs, max);
                    for budget in [points, 2 * points, 5 * points, 20 * points] {
                        let Ok(r) = schedule(Strategy::Halving, points, Some(budget), max, eta)
                        else {
                            // Refused only when one epoch per point does not fit.
                            assert!(
                                budget
                                    < total_epochs(
                                        &schedule(Strategy::Halving, points, None, 1, eta).unwrap()
                                    )
                            );
                            continue;
                        };
                        assert!(total_epochs(&r) <= budget);
                        assert_eq!(r[0].points, points);
                        for w in r.windows(2) {
                            assert!(w[1].points <= w[0].points / eta);
                            assert!(w[1].points >= 2);
                            assert!(w[1].epochs > w[0].epochs);
                        }
                        assert!(r[r.len() - 1].epochs <= max);
                        // The whole schedule is used when the budget allows it.
                        if total_epochs(&full) <= budget {
                            assert_eq!(r, full);
                        }
                    }
                }
            }
        }
        let r = |p, b, m, eta| schedule(Strategy::Halving, p, b, m, eta).unwrap();
        let sizes = |v: Vec<Rung>| v.iter().map(|r| (r.points, r.epochs)).collect::<Vec<_>>();
        assert_eq!(sizes(r(12, Some(96), 8, 3)), vec![(12, 2), (4, 8)]);
        assert_eq!(sizes(r(12, Some(48), 8, 3)), vec![(12, 2), (4, 6)]);
        assert_eq!(sizes(r(12, None, 8, 3)), vec![(12, 2), (4, 8)]);
        assert_eq!(sizes(r(8, Some(30), 4, 2)), vec![(8, 1), (4, 2), (2, 4)]);
        assert_eq!(sizes(r(12, Some(12), 8, 3)), vec![(12, 1)]);
        assert!(schedule(Strategy::Halving, 12, Some(11), 8, 3).is_err());
        assert!(schedule(Strategy::Halving, 12, Some(96), 8, 1).is_err());
    }

    #[test]
    fn best_is_the_arg_max_with_ties_to_the_earlier_point() {
        let mk = |index, at20, at50| PointResult {
            index,
            rung: 0,
            point: Point {
                reg: 0.0,
                unobserved_weight: 1.0,
            },
            epochs: 1,
            recall: Recall {
                at20,
                at50,
                test_rows: 1,
            },
            loss: 0.0,
            seconds: 0.0,
        };
        let v = vec![
            mk(0, 0.5, 0.5),
            mk(1, 0.7, 0.1),
            mk(2, 0.7, 0.2),
            mk(3, 0.7, 0.2),
        ];
        assert_eq!(arg_best(&v), Some(2));
        assert_eq!(arg_best(&[]), None);
    }

    /// Drive a refiner with `score` until it stops; the points in proposal order.
    fn drive(rf: &mut Refiner, score: impl Fn(Point) -> f64) -> Vec<(Point, Recall)> {
        let mut out = Vec::new();
        while let Some(p) = rf.propose() {
            let s = score(p);
            let r = Recall {
                at20: s,
                at50: s / 2.0,
                test_rows: 1,
            };
            rf.record(p, r);
            out.push((p, r));
        }
        out
    }

    #[test]
    fn refine_design_is_the_centres_of_the_grid_cells() {
        let c = |v: &[f32]| cell_centres(v);
        let close = |a: &[f32], b: &[f64]| {
            a.len() == b.len()
                && a.iter()
                    .zip(b)
                    .all(|(x, y)| ((*x as f64) / y - 1.0).abs() < 1e-5)
        };
        assert!(close(
            &c(&parse_values("1e-8:1e-2:3").unwrap()),
            &[10f64.powf(-6.5), 10f64.powf(-3.5)]
        ));
        assert!(close(
            &c(&parse_values("1e-5:1:3").unwrap()),
            &[10f64.powf(-3.75), 10f64.powf(-1.25)]
        ));
        // Unsorted lists and duplicates: the cells between sorted neighbours.
        assert!(close(&c(&[1e-1, 1e-3, 1e-1]), &[1e-2]));
        assert!(close(&c(&[4.0, 1.0, 16.0]), &[2.0, 8.0]));
        assert_eq!(c(&[0.5]), vec![0.5]);
        let d = refine_design(&[1e-8, 1e-5, 1e-2], &[1e-5, 3.1622776e-3, 1.0]);
        assert_eq!(d.len(), 4);
        assert_eq!(d[0].reg, d[1].reg, "reg major");
        let rf = Refiner::new(&[1e-8, 1e-5, 1e-2], &[1e-5, 3.1622776e-3, 1.0], 4).unwrap();
        assert_eq!(rf.design(), d.as_slice());
        assert!(d.iter().all(|&p| rf.inside(p)));
    }

    /// A smooth peak at (log10 reg, log10 weight) = `at`, `steep` times steeper in weight.
    fn peak(at: [f64; 2], steep: f64) -> impl Fn(Point) -> f64 {
        move |p: Point| {
            let x = coords(p);
            1.0 - 0.02 * (x[0] - at[0]).powi(2) - 0.02 * steep * (x[1] - at[1]).powi(2)
        }
    }

    #[test]
    fn refine_trains_the_design_then_climbs_inside_the_box() {
        let regs = parse_values("1e-6:1e-2:3").unwrap();
        let weights = parse_values("1e-5:1e-2:3").unwrap();
        // A peak at reg 3e-5, weight 2e-4 (between the design's points), steep in weight.
        let f = peak([3e-5f64.log10(), 2e-4f64.log10()], 10.0);
        let mut rf = Refiner::new(&regs, &weights, 12).unwrap();
        let design = rf.design().to_vec();
        let got = drive(&mut rf, &f);
        assert_eq!(got.len(), 12, "one training per budgeted point");
        let ps: Vec<Point> = got.iter().map(|g| g.0).collect();
        assert_eq!(
            &ps[..4],
            design.as_slice(),
            "the design comes first, in order"
        );
        for (i, p) in ps.iter().enumerate() {
            assert!(rf.inside(*p), "{p:?} outside the box");
            assert!(!ps[..i].contains(p), "{p:?} trained twice");
        }
        let best_design = design.iter().map(|&p| f(p)).fold(f64::MIN, f64::max);
        let best = got.iter().map(|g| g.1.at20).fold(f64::MIN, f64::max);
        assert!(
            best > best_design,
            "the search found nothing better: {got:?}"
        );
        // The same scores propose the same points.
        let again = drive(&mut Refiner::new(&regs, &weights, 12).unwrap(), &f);
        assert_eq!(again, got);
        // A peak on the box's corner: the search reaches it, stays inside and stops
        // shrinking at MIN_STEP_DECADES, so a long budget can end early.
        let corner = |p: Point| -(p.reg as f64) - (p.unobserved_weight as f64);
        let mut rf = Refiner::new(&regs, &weights, 1000).unwrap();
        let got = drive(&mut rf, corner);
        assert!(got.len() < 1000 && got.len() > 4);
        assert!(got.iter().all(|g| rf.inside(g.0)));
        assert!(got
            .iter()
            .any(|g| g.0.reg == regs[0] && g.0.unobserved_weight == weights[0]));
    }

    #[test]
    fn refine_at_12_trainings_ends_above_the_3x3_grid_on_peaks_off_the_grid() {
        // The default box; peaks spread over it, none on a point of its 3 x 3 grid.
        let regs = parse_values("1e-8:1e-2:3").unwrap();
        let weights = parse_values("1e-5:1:3").unwrap();
        let grid = grid_points(&regs, &weights);
        let mut wins = 0;
        let mut cases = 0;
        for &x in &[-7.3, -5.7, -4.2, -2.9] {
            for &y in &[-4.4, -3.7, -2.0, -0.5] {
                for steep in [1.0, 10.0] {
                    let f = peak([x, y], steep);
                    let got = drive(&mut Refiner::new(&regs, &weights, 12).unwrap(), &f);
                    let best = got.iter().map(|g| g.1.at20).fold(f64::MIN, f64::max);
                    let grid_best = grid.iter().map(|&p| f(p)).fold(f64::MIN, f64::max);
                    cases += 1;
                    wins += usize::from(best > grid_best);
                }
            }
        }
        // 12 trainings from the 2 x 2 centres end above the best of the 9-point grid on
        // at least 90% of these peaks (the grid's points are not tried unless a poll
        // reaches them).
        assert!(wins * 10 >= cases * 9, "{wins} of {cases}");
    }

    #[test]
    fn refine_along_one_axis_and_refusals() {
        let regs = [1e-3f32];
        let weights = parse_values("1e-4:1:5").unwrap();
        let mut rf = Refiner::new(&regs, &weights, 9).unwrap();
        let got = drive(&mut rf, |p| {
            -((p.unobserved_weight as f64).log10() + 1.7).abs()
        });
        assert_eq!(got.len(), 9);
        assert!(got.iter().all(|g| g.0.reg == 1e-3));
        let best = got
            .iter()
            .max_by(|a, b| a.1.at20.partial_cmp(&b.1.at20).unwrap())
            .unwrap();
        assert!(((best.0.unobserved_weight as f64).log10() + 1.7).abs() < 0.3);
        assert!(
            Refiner::new(&[1e-3], &[1e-2], 4).is_err(),
            "nothing to refine"
        );
        assert!(
            Refiner::new(&[0.0, 1e-3], &[1e-2], 4).is_err(),
            "0 has no log"
        );
        assert!(
            Refiner::new(&[1e-3, 1e-2, 1e-1], &[1e-2, 1e-1], 1).is_err(),
            "budget under the design"
        );
        assert_eq!(refine_trainings(6, None, 8).unwrap(), 18);
        assert_eq!(refine_trainings(6, Some(100), 8).unwrap(), 12);
        assert!(refine_trainings(6, Some(47), 8).is_err());
        let r = schedule(Strategy::Refine, 6, Some(96), 8, 3).unwrap();
        assert_eq!(
            r,
            vec![Rung {
                points: 12,
                epochs: 8
            }]
        );
    }
}
