//! Training and scoring the points of a search.

use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::refine::Refiner;
use super::schedule::Rung;
use super::Point;
use crate::als::eval::Recall;
use crate::als::model::TableScalar;
use crate::als::shard::read::Shards;
use crate::als::train::run::{global_train_unsaved, EvalAt};
use crate::als::train::tables::global_gramian;
use crate::als::train::trainer::Trainer;
use crate::als::AlsConfig;
use crate::ckpt::signals::Preemption;
use crate::comm::Comm;
use crate::error::{Error, Result};

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

/// One model, reset to the same initial tables for every point it trains (`None`
/// only while a point trains: the run driver owns it then).
struct PointTrainer<T: TableScalar> {
    tr: Option<Trainer<T>>,
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
            tr: Some(tr),
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
        let mut tr = self
            .tr
            .take()
            .expect("the trainer is back after every point");
        tr.cfg.reg = p.reg;
        tr.cfg.unobserved_weight = p.unobserved_weight;
        tr.cfg.epochs = epochs;
        tr.restore(
            crate::als::checkpoint::Position::default(),
            self.w0.clone(),
            self.h0.clone(),
            Vec::new(),
            self.gram_h0.clone(),
        );
        let (tr, reports) =
            global_train_unsaved(comm, tr, EvalAt::Last).map_err(|e| match e {
                Error::Interrupted(_) => Error::Interrupted(format!(
                    "signal received while training tune point {} (reg {}, weight {}); a tune saves nothing, a rerun starts over (exit 1, not 75: there is nothing to resume)",
                    index + 1,
                    p.reg,
                    p.unobserved_weight
                )),
                other => other,
            })?;
        self.tr = Some(tr);
        let rep = reports.last().expect("a point trains at least one epoch");
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
