//! The embedding model on the shared run driver ([`crate::ckpt::driver`]), like
//! iALS's [`crate::als::train::global_train`]: its unit of work is one optimizer step
//! (with the reporting intervals and evaluations that end at it); the driver does the
//! checkpoints, the hold and preemption. Then the evaluation and the trained model.
//! It prints nothing: what happens is reported through [`Event`]s, and `app/` turns
//! them into lines.

use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::ckpt::driver::{self as drive, Boundary, Status, Workload};
use crate::ckpt::signals::Preemption;
use crate::ckpt::{CheckpointConfig, Hold};
use crate::comm::Comm;
use crate::data::clicks::source::Source;
use crate::embed::io::checkpoint::{
    global_init_from, global_restore, global_write_checkpoint_on, init_from_path, EmbedManifest,
    WarmStart,
};
use crate::embed::io::delta::{local_raw_manifest, Chain, DeltaPolicy};
use crate::embed::io::model_file::{global_write_model, Evaluation};
use crate::embed::tables::dirty::DirtyRows;
use crate::embed::tables::placement::Plan;
use crate::embed::train::trainer::{EmbedConfig, EmbedTrainer, IntervalReport, StepStatus};
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
    /// Incremental checkpoints (`--checkpoint-full-every`, `--ckpt-delta-dtype`).
    pub delta: DeltaPolicy,
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

/// The embedding model as a workload of the run driver: a unit is one optimizer step.
struct EmbedWork<'r> {
    tr: EmbedTrainer,
    steps: u64,
    log_every: u64,
    eval_every: u64,
    run: &'r RunConfig,
    /// The checkpoint the next one may be a delta of.
    chain: Chain,
}

/// What [`EmbedWork::global_start`] reports.
enum Note {
    WarmStarted(WarmStart, f64),
    Preloaded { from: u64, to: u64, seconds: f64 },
}

impl Workload for EmbedWork<'_> {
    type Restored = EmbedManifest;
    type Report = IntervalReport;
    type Note = Note;
    const UNIT: &'static str = "step";

    fn position(&self) -> u64 {
        self.tr.step
    }

    fn total(&self) -> u64 {
        self.steps
    }

    fn describe_position(&self) -> String {
        format!("after step {}", self.tr.step)
    }

    fn stamp_hold(&self, hold: Hold) -> Hold {
        Hold {
            step: Some(self.tr.step + 1),
            ..hold
        }
    }

    fn past_the_end(&self, _path: &Path) -> Option<String> {
        let (step, steps) = (self.tr.step, self.steps);
        (step > steps).then(|| format!(
            "the checkpoint resumed is at step {step}, past --steps {steps}; give --steps {step} or more to continue it"
        ))
    }

    fn global_restore<C: Comm>(&mut self, comm: &C, path: &Path) -> Result<EmbedManifest> {
        let m = global_restore(comm, &mut self.tr, path)?;
        if let Some(d) = &mut self.tr.dirty {
            d.clear();
        }
        // The next checkpoint may be a delta of this one if it is in this run's
        // directory (retention keeps the chains of one directory).
        let same_dir = |dir: &Path| {
            let parent = path.parent().and_then(|p| p.canonicalize().ok());
            parent.is_some() && parent == dir.canonicalize().ok()
        };
        self.chain.base = None;
        if self.run.checkpoint.dir.as_deref().is_some_and(same_dir) {
            let raw = comm.agree(local_raw_manifest(path))?.unwrap_or_default();
            let since = m.delta.as_ref().map_or(0, |d| d.chain);
            self.chain.committed(path, &raw, since);
        }
        Ok(m)
    }

    fn global_start<C: Comm>(
        &mut self,
        comm: &C,
        resumed: bool,
        note: &mut dyn FnMut(Note),
    ) -> Result<()> {
        if let (false, Some(from)) = (resumed, &self.run.init_from) {
            let t = Instant::now();
            let path = comm.agree(init_from_path(from))?;
            let start = global_init_from(comm, &mut self.tr, &path).map_err(|e| match e {
                // Another run's checkpoint is this run's input: exit 2, no hold.
                Error::Corrupt(r) | Error::Hold(r) => Error::input(&path, r),
                e => e,
            })?;
            note(Note::WarmStarted(start, t.elapsed().as_secs_f64()));
        }
        if self.run.preload {
            let t = Instant::now();
            let (p, r, from) = (comm.size(), comm.rank(), self.tr.step);
            comm.agree(self.tr.local_preload(p, r, from, self.steps))?;
            note(Note::Preloaded {
                from,
                to: self.steps,
                seconds: t.elapsed().as_secs_f64(),
            });
        }
        Ok(())
    }

    fn global_step<C: Comm>(
        &mut self,
        comm: &C,
        boundary: &Boundary<'_>,
    ) -> Result<(Status, Option<IntervalReport>)> {
        let tr = &mut self.tr;
        let flag = boundary.preempt_requested(tr.step + 1);
        let status = tr.global_step(comm, flag)?;
        let preempted = match status {
            StepStatus::NonFinite { rank } => {
                let reason = format!(
                    "non-finite loss or gradient on rank {rank} at step {}",
                    tr.step + 1
                );
                return Ok((
                    Status::Hold {
                        reason,
                        rank: Some(rank),
                    },
                    None,
                ));
            }
            StepStatus::Failed { rank } => return Err(Error::Remote { rank, code: 1 }),
            StepStatus::Preempt => true,
            StepStatus::Done => false,
        };
        let done = tr.step;
        let mut report = None;
        if done.is_multiple_of(self.log_every) || done == self.steps || preempted {
            let mut r = tr.global_interval(comm)?;
            if self.eval_every > 0 && done.is_multiple_of(self.eval_every) && done != self.steps {
                let (auc, ll) = tr.global_evaluate(comm)?;
                r.eval_auc = auc;
                r.eval_logloss = ll;
            }
            report = Some(r);
        }
        let status = if preempted {
            Status::Preempt
        } else {
            Status::Done
        };
        Ok((status, report))
    }

    fn global_checkpoint<C: Comm>(&mut self, comm: &C, dir: &Path, keep: usize) -> Result<PathBuf> {
        global_write_checkpoint_on(comm, &mut self.tr, dir, keep, &mut self.chain)
    }

    fn after_periodic_checkpoint(&mut self) {
        // A run resumed from this checkpoint looks the next step up afresh.
        self.tr.drop_prefetched();
    }
}

/// Collective: every rank must call, with the same `cfg`, `plan` and `run`. Trains
/// until `cfg.steps` optimizer steps are done (resuming if asked) on the run driver
/// ([`drive::global_drive`]), calling `on_event` on every rank as it goes, and writes
/// the model if `run.out` is set. Stops with [`Error::Hold`] (a hold is written next
/// to the checkpoints) on a non-finite value or a checkpoint that cannot be resumed,
/// and with [`Error::Preempted`] after checkpointing on a preemption signal.
pub fn global_train<C: Comm>(
    comm: &C,
    cfg: EmbedConfig,
    source: Source,
    plan: &Plan,
    run: &RunConfig,
    preempt: Preemption,
    mut on_event: impl FnMut(Event<'_>),
) -> Result<Summary> {
    let (steps, log_every, eval_every) = (cfg.steps, cfg.log_every, cfg.eval_every);
    let mut last = None;
    let make = || {
        comm.agree(run.delta.validate())?;
        let mut tr = comm.agree(EmbedTrainer::new(cfg, source, plan, comm.rank()))?;
        if run.delta.full_every > 1 {
            tr.dirty = Some(DirtyRows::new(&tr.store));
        }
        Ok(EmbedWork {
            tr,
            steps,
            log_every,
            eval_every,
            run,
            chain: Chain {
                policy: run.delta,
                ..Chain::default()
            },
        })
    };
    let w = drive::global_drive(comm, &run.checkpoint, &preempt, None, make, |e| match e {
        drive::Event::Resumed {
            path,
            restored,
            seconds,
        } => on_event(Event::Resumed {
            path,
            manifest: restored,
            seconds,
        }),
        drive::Event::Progress { done, total } => on_event(Event::Step { done, steps: total }),
        drive::Event::Report(r) => {
            on_event(Event::Interval(r));
            last = Some(r.clone());
        }
        drive::Event::Note(Note::WarmStarted(start, seconds)) => on_event(Event::WarmStarted {
            start: &start,
            seconds,
        }),
        drive::Event::Note(Note::Preloaded { from, to, seconds }) => {
            on_event(Event::Preloaded { from, to, seconds })
        }
    })?;
    let mut tr = w.tr;
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
