//! The one run driver of every training workload (iALS, the embedding model): the
//! checkpoint directory and its hold, waiting for the data, the restore of the newest
//! checkpoint (with fall-back), the loop over units of work with its one
//! fault-injection point, the end of a unit (a hold, a preemption exit), periodic and
//! final checkpoints. A workload says what a unit of work is ([`Workload`]); the
//! driver prints nothing: it reports through [`Event`]s, and `app/` prints them.

use std::path::{Path, PathBuf};
use std::time::Instant;

use super::signals::Preemption;
use super::{CheckpointConfig, Hold, Resume};
use crate::comm::Comm;
use crate::error::{Error, Result};

/// How a unit of work ended, the same on every rank (the workload agreed on it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Status {
    Done,
    /// A preemption signal reached some rank: the driver checkpoints and exits 75.
    Preempt,
    /// A non-finite value, a failed solve: the driver writes a hold and exits 76.
    Hold {
        reason: String,
        rank: Option<usize>,
    },
}

/// What a workload sees of the driver while it runs a unit of work.
pub struct Boundary<'a> {
    preempt: &'a Preemption,
}

impl Boundary<'_> {
    /// Whether this rank asks for a preemption at the step boundary after which
    /// `done` steps of the workload's global step counter are complete: a signal
    /// arrived, or (the one fault-injection point of training, for tests)
    /// `TORUSREC_PREEMPT_AT=done`. The workload agrees on the answer over ranks.
    pub fn preempt_requested(&self, done: u64) -> bool {
        self.preempt.is_set() || super::faults::preempt_at() == Some(done)
    }
}

/// What the driver reports as it goes, on every rank (printing is the caller's).
pub enum Event<'a, W: Workload> {
    /// Restored from the checkpoint at `path`.
    Resumed {
        path: &'a Path,
        restored: &'a W::Restored,
        seconds: f64,
    },
    /// A unit of work ended without a report: `done` of `total`.
    Progress { done: u64, total: u64 },
    /// A unit of work ended with a report.
    Report(&'a W::Report),
    /// Something the workload itself reports (e.g. a warm start).
    Note(W::Note),
}

/// A training workload, as the driver runs it. Every `global_` method is collective:
/// every rank calls it.
pub trait Workload {
    /// What a restore returns (e.g. the checkpoint's manifest), for [`Event::Resumed`].
    type Restored;
    /// What a unit of work may report (an epoch, a reporting interval).
    type Report;
    /// What [`Workload::global_start`] reports.
    type Note;
    /// The name of a unit of position in messages ("half-epoch", "step").
    const UNIT: &'static str;
    /// Units done.
    fn position(&self) -> u64;
    /// Units of the whole run.
    fn total(&self) -> u64;
    /// Where the run is, for messages: "after step 5", "at epoch 2, half 1, step 3".
    fn describe_position(&self) -> String;
    /// `hold` with the position of the unit in progress (epoch or step).
    fn stamp_hold(&self, hold: Hold) -> Hold;
    /// Why the restored checkpoint (at `path`) is past the end of this run, if it is.
    fn past_the_end(&self, path: &Path) -> Option<String>;
    /// Collective. Restore the checkpoint at `path` (it is verified).
    fn global_restore<C: Comm>(&mut self, comm: &C, path: &Path) -> Result<Self::Restored>;
    /// Collective. Before the first unit (after a restore if `resumed`).
    fn global_start<C: Comm>(
        &mut self,
        _comm: &C,
        _resumed: bool,
        _note: &mut dyn FnMut(Self::Note),
    ) -> Result<()> {
        Ok(())
    }
    /// Collective. Run one unit of work; at its step boundaries the ranks agree on
    /// how it ended (ask `boundary` whether to preempt).
    fn global_step<C: Comm>(
        &mut self,
        comm: &C,
        boundary: &Boundary<'_>,
    ) -> Result<(Status, Option<Self::Report>)>;
    /// Collective. Write a checkpoint of the current position into `dir`, keeping
    /// `keep` checkpoints.
    fn global_checkpoint<C: Comm>(&mut self, comm: &C, dir: &Path, keep: usize) -> Result<PathBuf>;
    /// After a periodic checkpoint (a run resumed from it may have to do afresh what
    /// this one did ahead).
    fn after_periodic_checkpoint(&mut self) {}
}

/// Collective: every rank must call, with the same `ck`. Prepares the checkpoint
/// directory (refusing to start under a hold), waits up to `ck.wait_for_data` for
/// `data` (when given), makes the workload with `make`, restores the newest
/// checkpoint (`--resume auto` falls back to older ones; none that verifies: a
/// hold), refuses one past the end, and runs units until the workload's total with
/// periodic checkpoints (every `ck.every` units) and a final one. Stops with
/// [`Error::Hold`] (a hold is written next to the checkpoints) or, after
/// checkpointing, with [`Error::Preempted`]. Returns the workload at its end.
pub fn global_drive<C: Comm, W: Workload>(
    comm: &C,
    ck: &CheckpointConfig,
    preempt: &Preemption,
    data: Option<&Path>,
    make: impl FnOnce() -> Result<W>,
    mut on_event: impl FnMut(Event<'_, W>),
) -> Result<W> {
    comm.agree(ck.validate())?;
    let resume = super::global_prepare_checkpoints(comm, ck)?;
    if let Some(data) = data {
        global_wait_for_data(comm, data, ck.wait_for_data, preempt)?;
    }
    let mut w = make()?;
    let dir = ck.dir.as_deref();
    let hold = |w: &W, reason: String, rank: Option<usize>| -> Error {
        super::global_hold(comm, dir, w.stamp_hold(Hold::new(reason, rank)))
    };
    let t = Instant::now();
    let fall_back = ck.resume == Resume::Auto;
    let restored =
        super::global_restore_newest(comm, &resume, fall_back, |p| w.global_restore(comm, p));
    let resumed = matches!(restored, Ok(Some(_)));
    match restored {
        Ok(Some((path, r))) => {
            if let Some(why) = w.past_the_end(&path) {
                // Every rank restored the same position and agrees (rank 0 reports it).
                return comm.agree(Err(Error::Config(why)));
            }
            on_event(Event::Resumed {
                path: &path,
                restored: &r,
                seconds: t.elapsed().as_secs_f64(),
            });
        }
        Ok(None) => {}
        Err(Error::Hold(r) | Error::Corrupt(r)) => return Err(hold(&w, r, None)),
        Err(e) => return Err(e),
    }
    w.global_start(comm, resumed, &mut |n| on_event(Event::Note(n)))?;
    let boundary = Boundary { preempt };
    // The position of the last checkpoint this run wrote.
    let mut saved_at = None;
    let total = w.total();
    while w.position() < total {
        let (status, report) = w.global_step(comm, &boundary)?;
        if let Status::Hold { reason, rank } = status {
            return Err(hold(&w, reason, rank));
        }
        let done = w.position();
        match &report {
            Some(r) => on_event(Event::Report(r)),
            None => on_event(Event::Progress { done, total }),
        }
        if status == Status::Preempt {
            let since = preempt
                .seconds_since()
                .map(|s| format!(", {s:.2} s after the signal"))
                .unwrap_or_default();
            let at = w.describe_position();
            return Err(match dir {
                Some(dir) => {
                    let p = w.global_checkpoint(comm, dir, ck.keep)?;
                    Error::Preempted(format!("checkpoint {} written {at}{since}", p.display()))
                }
                None => Error::Interrupted(format!(
                    "signal received {at}; no --checkpoint-dir, so nothing was saved (exit 1, not 75: there is nothing to resume)"
                )),
            });
        }
        if let Some(dir) = dir {
            if super::policy::due(done, ck.every) && done != total {
                let p = w.global_checkpoint(comm, dir, ck.keep)?;
                log::debug!("checkpoint {} after {done} {}(s)", p.display(), W::UNIT);
                saved_at = Some(done);
                w.after_periodic_checkpoint();
            }
        }
    }
    let end = w.position();
    if let Some(dir) = dir {
        if end > 0 && saved_at != Some(end) {
            w.global_checkpoint(comm, dir, ck.keep)?;
        }
    }
    Ok(w)
}

/// Collective: every rank must call. Wait up to `secs` for `path` to exist without a
/// `.partial` sibling (a dataset still being written). A preemption signal on any rank
/// ends the wait on every rank (exit 75: nothing had started, so a requeue is right).
pub fn global_wait_for_data<C: Comm>(
    comm: &C,
    path: &Path,
    secs: f64,
    preempt: &Preemption,
) -> Result<()> {
    if secs <= 0.0 {
        return Ok(());
    }
    let partial = crate::io::outfile::temp_path(path);
    let t = Instant::now();
    let mut waited = false;
    loop {
        let ready = u64::from(path.is_file() && !partial.exists());
        // Every rank must see it (shared file systems can lag); a signal stops all.
        let state = comm.all_reduce_max((1 - ready) | (u64::from(preempt.is_set()) << 1));
        if state & 2 != 0 {
            return Err(Error::Preempted(format!(
                "signal received while waiting for {}; training had not started",
                path.display()
            )));
        }
        if state == 0 {
            if waited && comm.rank() == 0 {
                log::info!(
                    "{} appeared after {:.1} s",
                    path.display(),
                    t.elapsed().as_secs_f64()
                );
            }
            return Ok(());
        }
        if t.elapsed().as_secs_f64() >= secs {
            return Ok(()); // reading it will report what is wrong
        }
        if !waited && comm.rank() == 0 {
            log::info!("waiting up to {secs} s for {}", path.display());
        }
        waited = true;
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}
