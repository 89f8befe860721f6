//! A training run on the run driver ([`drive::global_drive`]): iALS as its workload
//! (a unit is one half-epoch), the events a caller prints, and the runs that save
//! checkpoints and those that keep nothing (`tune`, `project measure`).

use super::epoch::EpochAcc;
use super::report::{EpochReport, PhaseTimes, TrainReport};
use super::tables::global_gramian;
use super::trainer::Trainer;
use crate::als::checkpoint::{global_restore, Manifest};
use crate::als::model::TableScalar;
use crate::als::AlsConfig;
use crate::ckpt::driver::{self as drive, Boundary, Status, Workload};
use crate::ckpt::{self, signals::Preemption};
use crate::comm::Comm;
use crate::error::{Error, Result};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Collective: every rank must call. [`global_train_as`] with f32 tables.
pub fn global_train<C: Comm>(
    comm: &C,
    cfg: &AlsConfig,
    preempt: Preemption,
    on_event: impl FnMut(TrainEvent),
) -> Result<(Trainer, TrainReport)> {
    global_train_as::<C, f32>(comm, cfg, preempt, on_event)
}

/// iALS as a workload of the run driver ([`crate::ckpt::driver`]): a unit of work is
/// one half-epoch; its steps run inside it, and at every step boundary the ranks
/// agree on how the step ended (asking the driver's [`Boundary`] whether to preempt).
struct AlsWork<T: TableScalar> {
    tr: Trainer<T>,
    /// The epoch in progress (from its first half run by this process).
    acc: Option<EpochAcc>,
    /// Which epochs are evaluated.
    eval: EvalAt,
}

/// Which epochs of a run evaluate Recall@K.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EvalAt {
    /// The last, and every `--eval-every` epochs.
    Config,
    /// The last only.
    Last,
    /// None.
    Never,
}

impl<T: TableScalar> Workload for AlsWork<T> {
    type Restored = (Manifest, usize);
    type Report = EpochReport;
    type Note = std::convert::Infallible;
    const UNIT: &'static str = "half-epoch";

    fn position(&self) -> u64 {
        self.tr.pos.epoch as u64 * 2 + self.tr.pos.half as u64
    }

    fn total(&self) -> u64 {
        self.tr.cfg.epochs as u64 * 2
    }

    fn describe_position(&self) -> String {
        let p = &self.tr.pos;
        format!("at epoch {}, half {}, step {}", p.epoch, p.half, p.step)
    }

    fn stamp_hold(&self, hold: ckpt::Hold) -> ckpt::Hold {
        ckpt::Hold {
            epoch: Some(self.tr.pos.epoch + 1),
            ..hold
        }
    }

    fn past_the_end(&self, path: &Path) -> Option<String> {
        let (at, epochs) = (&self.tr.pos, self.tr.cfg.epochs);
        (at.epoch > epochs || (at.epoch == epochs && (at.half > 0 || at.step > 0))).then(|| {
            format!(
                "{}: the checkpoint is past --epochs {epochs} (epoch {}, half {}, step {}); give --epochs {} or more to continue it",
                path.display(),
                at.epoch,
                at.half,
                at.step,
                at.epoch + 1
            )
        })
    }

    fn global_restore<C: Comm>(&mut self, comm: &C, path: &Path) -> Result<(Manifest, usize)> {
        let (manifest, w, h): (Manifest, Vec<T>, Vec<T>) =
            global_restore(comm, &self.tr.run_state(), path)?;
        let d = self.tr.cfg.dim;
        let basis = manifest.basis.to_basis(d).map_err(Error::Corrupt)?;
        let gram_w = global_gramian(comm, &w, d);
        let gram_h = global_gramian(comm, &h, d);
        self.tr
            .restore(manifest.position.clone(), w, h, gram_w, gram_h);
        self.tr.restore_basis(basis);
        Ok((manifest, self.tr.steps_per_half))
    }

    fn global_step<C: Comm>(
        &mut self,
        comm: &C,
        boundary: &Boundary<'_>,
    ) -> Result<(Status, Option<EpochReport>)> {
        let tr = &mut self.tr;
        let acc = self.acc.get_or_insert_with(|| EpochAcc::start(comm, tr));
        let half = tr.pos.half;
        let (status, loss) = tr.global_half(comm, &mut acc.times, boundary)?;
        if status != Status::Done || half == 0 {
            return Ok((status, None));
        }
        acc.loss = loss;
        tr.global_end_of_training(comm, &mut acc.times);
        let Some(acc) = self.acc.take() else {
            return Ok((status, None));
        };
        let (e, cfg) = (tr.pos.epoch, &tr.cfg);
        let evaluate = match self.eval {
            EvalAt::Config => e == cfg.epochs || (cfg.eval_every > 0 && e % cfg.eval_every == 0),
            EvalAt::Last => e == cfg.epochs,
            EvalAt::Never => false,
        };
        let report = tr.global_epoch_report(comm, acc, evaluate)?;
        Ok((status, Some(report)))
    }

    fn global_checkpoint<C: Comm>(
        &mut self,
        comm: &C,
        _dir: &Path,
        _keep: usize,
    ) -> Result<PathBuf> {
        // The trainer writes into its own `cfg.checkpoint` (the driver's).
        let t = Instant::now();
        let path = self.tr.global_checkpoint(comm)?;
        if let Some(acc) = &mut self.acc {
            acc.times.checkpoint += t.elapsed().as_secs_f64();
        }
        Ok(path)
    }
}

/// What [`global_train_as`] reports while it runs, for the caller to print (the
/// library prints nothing; every rank sees every event).
#[derive(Debug)]
pub enum TrainEvent<'a> {
    /// Restored from the checkpoint at `path` (written by `manifest.world_size` ranks)
    /// in `seconds`, read and verified.
    Resumed {
        path: &'a std::path::Path,
        manifest: &'a Manifest,
        steps_per_half: usize,
        seconds: f64,
    },
    /// An epoch ended.
    Epoch(&'a EpochReport),
}

/// Collective: every rank must call. Trains until `cfg.epochs` are complete (resuming
/// if asked) on the run driver ([`drive::global_drive`]), calling `on_event` on every
/// rank when it resumes and after each epoch, and writes the model if `cfg.out` is set. `T` must be the
/// element type `cfg.table_dtype` names.
pub fn global_train_as<C: Comm, T: TableScalar>(
    comm: &C,
    cfg: &AlsConfig,
    preempt: Preemption,
    mut on_event: impl FnMut(TrainEvent),
) -> Result<(Trainer<T>, TrainReport)> {
    comm.agree(cfg.validate())?;
    if cfg.table_dtype != T::DTYPE {
        return comm.agree(Err(Error::Config(format!(
            "--table-dtype {} but the trainer stores {}",
            cfg.table_dtype,
            T::DTYPE
        ))));
    }
    let mut resumed_from = None;
    let mut epochs = Vec::with_capacity(cfg.epochs);
    let make = || {
        Ok(AlsWork {
            tr: Trainer::<T>::global_new(comm, cfg, preempt.clone())?,
            acc: None,
            eval: EvalAt::Config,
        })
    };
    let work = drive::global_drive(
        comm,
        &cfg.checkpoint,
        &preempt,
        Some(cfg.data.as_path()),
        make,
        |e| match e {
            drive::Event::Resumed {
                path,
                restored: (manifest, steps_per_half),
                seconds,
            } => {
                on_event(TrainEvent::Resumed {
                    path,
                    manifest,
                    steps_per_half: *steps_per_half,
                    seconds,
                });
                resumed_from = Some(manifest.position.clone());
            }
            drive::Event::Progress { .. } => {}
            drive::Event::Report(r) => {
                on_event(TrainEvent::Epoch(r));
                epochs.push(r.clone());
            }
            drive::Event::Note(n) => match n {},
        },
    )?;
    let mut tr = work.tr;
    // Resumed from a checkpoint inside the run with fewer --epochs than it had reached:
    // no epoch ran to undo the rotation (a no-op otherwise).
    tr.global_to_starting_basis(comm);
    let recall = match epochs.last().and_then(|e| e.recall) {
        Some(r) => Some(r),
        None => {
            // Resumed after the last epoch: evaluate the restored tables.
            let mut t = PhaseTimes::default();
            Some(tr.global_evaluate(comm, &mut t)?)
        }
    };
    // Resumed after the last epoch: the loss the checkpoint recorded for it.
    let loss = epochs
        .last()
        .map_or(tr.pos.loss.unwrap_or(f64::NAN), |e| e.loss);
    let report = TrainReport {
        recall,
        loss,
        checksum: tr.global_checksum(comm),
        row_imbalance: tr.shards.row_imbalance,
        col_imbalance: tr.shards.col_imbalance,
        epochs,
        resumed_from,
    };
    if let Some(out) = &cfg.out {
        tr.global_write_model(comm, out, &report)?;
    }
    Ok((tr, report))
}

/// Collective: every rank must call. Trains `tr` from its position until
/// `tr.cfg.epochs` are complete on the run driver ([`drive::global_drive`]) with no
/// checkpoint directory, whatever `tr.cfg.checkpoint` says: for callers that train a
/// model they do not keep (a `tune` point, the measured epochs of `project measure`).
/// `eval` says which epochs evaluate. A preemption signal stops every rank with
/// [`Error::Interrupted`] (nothing is saved), a non-finite value or failed solve with
/// [`Error::Hold`] (no hold file: there is no directory). Returns the trainer and
/// each epoch's report.
pub fn global_train_unsaved<C: Comm, T: TableScalar>(
    comm: &C,
    tr: Trainer<T>,
    eval: EvalAt,
) -> Result<(Trainer<T>, Vec<EpochReport>)> {
    global_train_unsaved_between(comm, tr, eval, || ())
}

/// [`global_train_unsaved`], calling `between` on every rank after each epoch's
/// report (every rank calls it at the same point, so it may communicate; it has no
/// error to return: a failure inside it must stop the job, as one rank's error there
/// would leave the others in its collectives).
pub fn global_train_unsaved_between<C: Comm, T: TableScalar>(
    comm: &C,
    tr: Trainer<T>,
    eval: EvalAt,
    mut between: impl FnMut(),
) -> Result<(Trainer<T>, Vec<EpochReport>)> {
    let preempt = tr.preempt.clone();
    let mut epochs = Vec::new();
    let make = || {
        Ok(AlsWork {
            tr,
            acc: None,
            eval,
        })
    };
    let no_checkpoints = ckpt::CheckpointConfig::default();
    let work = drive::global_drive(comm, &no_checkpoints, &preempt, None, make, |e| {
        if let drive::Event::Report(r) = e {
            epochs.push(r.clone());
            between();
        }
    })?;
    Ok((work.tr, epochs))
}
