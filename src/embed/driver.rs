//! The training driver of the embedding model, as a library function like iALS's
//! [`crate::als::train::global_train`]: checkpoints (prepare, restore with fall-back,
//! periodic, on preemption, final), the training hold, the optimizer steps with their
//! reporting intervals and evaluations, and the trained model. It prints nothing: what
//! happens is reported through [`Event`]s, and `app/` turns them into lines.

use std::path::{Path, PathBuf};
use std::time::Instant;

use super::checkpoint::{
    global_init_from, global_restore, global_write_checkpoint, init_from_path, EmbedManifest,
    WarmStart,
};
use super::model::{global_write_model, Evaluation};
use super::placement::Plan;
use super::train::{EmbedConfig, EmbedTrainer, IntervalReport, Source, StepStatus};
use crate::ckpt::signals::Preemption;
use crate::ckpt::{self, CheckpointConfig, Hold, Resume};
use crate::comm::Comm;
use crate::{Error, Result};

/// How a run is driven, besides the model's configuration.
#[derive(Clone, Debug, Default)]
pub struct RunConfig {
    pub checkpoint: CheckpointConfig,
    /// Read this rank's examples of every remaining step before training (`--preload`).
    pub preload: bool,
    /// Write the trained model here (`--out`).
    pub out: Option<PathBuf>,
    /// Warm start from another run's checkpoint (`--init-from`), unless this run
    /// resumes a checkpoint of its own.
    pub init_from: Option<PathBuf>,
}

/// What the driver reports as it goes, on every rank (printing is the caller's).
pub enum Event<'a> {
    /// Restored from the checkpoint at `path`.
    Resumed {
        path: &'a Path,
        manifest: &'a EmbedManifest,
        seconds: f64,
    },
    /// Warm-started from another run's checkpoint (`--init-from`).
    WarmStarted { start: &'a WarmStart, seconds: f64 },
    /// The examples of steps `from..to` were read ahead.
    Preloaded { from: u64, to: u64, seconds: f64 },
    /// Step `done` of `steps` ended without a report.
    Step { done: u64, steps: u64 },
    /// A reporting interval ended (every `log_every` steps, at the end, on preemption).
    Interval(&'a IntervalReport),
}

/// What a finished run reports (the same on every rank).
#[derive(Clone, Debug, serde::Serialize)]
pub struct Summary {
    pub steps: u64,
    pub auc: Option<f64>,
    pub logloss: Option<f64>,
    /// The placement-independent checksum of the tables, their state and the MLP.
    pub checksum: String,
    pub last: Option<IntervalReport>,
    /// The largest peak resident set over ranks.
    pub peak_rss_bytes: u64,
}

/// Collective: every rank must call, with the same `cfg`, `plan` and `run`. Trains
/// until `cfg.steps` optimizer steps are done (resuming if asked), calling `on_event`
/// on every rank as it goes, and writes the model if `run.out` is set. Stops with
/// [`Error::Hold`] (a hold is written next to the checkpoints) on a non-finite value
/// or a checkpoint that cannot be resumed, and with [`Error::Preempted`] after
/// checkpointing on a preemption signal.
pub fn global_train<C: Comm>(
    comm: &C,
    cfg: EmbedConfig,
    source: Source,
    plan: &Plan,
    run: &RunConfig,
    preempt: Preemption,
    mut on_event: impl FnMut(Event<'_>),
) -> Result<Summary> {
    let ck = &run.checkpoint;
    comm.agree(ck.validate())?;
    let resume = ckpt::global_prepare_checkpoints(comm, ck)?;
    let steps = cfg.steps;
    let (log_every, eval_every) = (cfg.log_every, cfg.eval_every);
    let mut tr = comm.agree(EmbedTrainer::new(cfg, source, plan, comm.rank()))?;
    let hold = |reason: String, rank: Option<usize>, step: u64| -> Error {
        let h = Hold {
            step: Some(step),
            ..Hold::new(reason, rank)
        };
        ckpt::global_hold(comm, ck.dir.as_deref(), h)
    };
    let t = Instant::now();
    let fall_back = ck.resume == Resume::Auto;
    match ckpt::global_restore_newest(comm, &resume, fall_back, |p| {
        global_restore(comm, &mut tr, p)
    }) {
        Ok(Some((path, m))) => on_event(Event::Resumed {
            path: &path,
            manifest: &m,
            seconds: t.elapsed().as_secs_f64(),
        }),
        Ok(None) => {
            if let Some(from) = &run.init_from {
                let t = Instant::now();
                let path = comm.agree(init_from_path(from))?;
                let start = global_init_from(comm, &mut tr, &path).map_err(|e| match e {
                    // Another run's checkpoint is this run's input: exit 2, no hold.
                    Error::Corrupt(r) | Error::Hold(r) => Error::input(&path, r),
                    e => e,
                })?;
                on_event(Event::WarmStarted {
                    start: &start,
                    seconds: t.elapsed().as_secs_f64(),
                });
            }
        }
        Err(Error::Hold(r) | Error::Corrupt(r)) => return Err(hold(r, None, 0)),
        Err(e) => return Err(e),
    }
    if tr.step > steps {
        // Every rank restored the same step and agrees (rank 0 reports it).
        return comm.agree(Err(Error::Config(format!(
            "the checkpoint resumed is at step {}, past --steps {steps}; give --steps {} or more to continue it",
            tr.step, tr.step
        ))));
    }
    let checkpoint = |tr: &EmbedTrainer| -> Result<Option<PathBuf>> {
        match &ck.dir {
            Some(dir) => global_write_checkpoint(comm, tr, dir, ck.keep).map(Some),
            None => Ok(None),
        }
    };
    if run.preload {
        let t = Instant::now();
        let (p, r, from) = (comm.size(), comm.rank(), tr.step);
        comm.agree(tr.local_preload(p, r, from, steps))?;
        on_event(Event::Preloaded {
            from,
            to: steps,
            seconds: t.elapsed().as_secs_f64(),
        });
    }
    let mut last = None;
    while tr.step < steps {
        let flag = preempt.is_set() || ckpt::faults::preempt_at() == Some(tr.step + 1);
        let status = tr.global_step(comm, flag)?;
        if let StepStatus::NonFinite { rank } = status {
            return Err(hold(
                format!(
                    "non-finite loss or gradient on rank {rank} at step {}",
                    tr.step + 1
                ),
                Some(rank),
                tr.step + 1,
            ));
        }
        let done = tr.step;
        if done % log_every != 0 {
            on_event(Event::Step { done, steps });
        }
        if done % log_every == 0 || done == steps || status == StepStatus::Preempt {
            let mut r = tr.global_interval(comm)?;
            if eval_every > 0 && done % eval_every == 0 && done != steps {
                let (auc, ll) = tr.global_evaluate(comm)?;
                r.eval_auc = auc;
                r.eval_logloss = ll;
            }
            on_event(Event::Interval(&r));
            last = Some(r);
        }
        if status == StepStatus::Preempt {
            let since = preempt
                .seconds_since()
                .map(|s| format!(", {s:.2} s after the signal"))
                .unwrap_or_default();
            return Err(match checkpoint(&tr)? {
                Some(p) => Error::Preempted(format!(
                    "checkpoint {} written after step {done}{since}",
                    p.display()
                )),
                None => Error::Interrupted(format!(
                    "signal received after step {done}; no --checkpoint-dir, so nothing was saved (exit 1, not 75: there is nothing to resume)"
                )),
            });
        }
        if ck.every > 0 && done % ck.every == 0 && done != steps {
            checkpoint(&tr)?;
            // A run resumed from this checkpoint looks the next step up afresh.
            tr.drop_prefetched();
        }
    }
    if tr.step > 0 {
        checkpoint(&tr)?;
    }
    let (auc, logloss) = tr.global_evaluate(comm)?;
    let checksum = format!("{:016x}", tr.global_checksum(comm)?);
    if let Some(out) = &run.out {
        global_write_model(comm, &tr, out, Evaluation { auc, logloss })?;
    }
    let peak_rss_bytes = comm.all_reduce_max(crate::metrics::peak_rss_bytes().unwrap_or(0));
    Ok(Summary {
        steps: tr.step,
        auc,
        logloss,
        checksum,
        last,
        peak_rss_bytes,
    })
}
