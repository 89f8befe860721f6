//! Checkpoint machinery shared by every workload: the directory of committed
//! checkpoints, the commit protocol and the manifest ([`commit`]), the training hold,
//! the agreement on how a step ended ([`status`]), preemption signals, retention and
//! fault injection.
//!
//! A checkpoint is one HDF5 file `ckpt-<global step>.h5` holding the tables by global
//! id and a JSON manifest attribute. It is written as `<name>.partial` and committed by
//! an atomic rename, so a visible checkpoint is always complete; older checkpoints are
//! deleted (retention) only after the new one is committed, and never one that a kept
//! incremental checkpoint (a delta on a base, the embedding model's) still needs.

pub mod commit;
pub mod driver;
/// The test hooks (moved below every module: [`crate::io::outfile`] has a fault point too).
pub use crate::faults;
pub mod policy;
pub mod signals;
pub mod status;

use crate::comm::Comm;
use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

pub const SCHEMA: u32 = 1;

/// Where to resume from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Resume {
    /// Start fresh.
    No,
    /// The newest committed checkpoint in the directory, or fresh if there is none.
    Auto,
    /// This checkpoint file.
    Path(PathBuf),
}

/// Checkpointing, preemption and hold settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckpointConfig {
    pub dir: Option<PathBuf>,
    /// Checkpoint every N half-epochs (0: only on preemption and at the end).
    pub every: u64,
    pub keep: usize,
    pub resume: Resume,
    pub release_hold: bool,
    /// Wait up to this many seconds for the dataset to appear.
    pub wait_for_data: f64,
}

impl Default for CheckpointConfig {
    fn default() -> Self {
        Self {
            dir: None,
            every: 2,
            keep: 3,
            resume: Resume::No,
            release_hold: false,
            wait_for_data: 0.0,
        }
    }
}

impl CheckpointConfig {
    /// Refuse (exit 2) settings no run can use; call on every rank before any work.
    pub fn validate(&self) -> Result<()> {
        if self.dir.is_none() && self.resume != Resume::No {
            return Err(Error::Config(
                "--resume needs --checkpoint-dir (where the resumed run writes its checkpoints and its hold)"
                    .into(),
            ));
        }
        if self.keep == 0 {
            return Err(Error::Config(
                "--keep 0: must be at least 1 (the checkpoint just written is always kept)".into(),
            ));
        }
        let wait = self.wait_for_data;
        if !(wait.is_finite() && (0.0..=MAX_WAIT_SECS).contains(&wait)) {
            return Err(Error::Config(format!(
                "--wait-for-data {wait}: must be a number of seconds from 0 to {MAX_WAIT_SECS} (a week)"
            )));
        }
        if let Resume::Path(p) = &self.resume {
            if !p.is_file() {
                return Err(Error::Config(format!(
                    "--resume {}: no such checkpoint file",
                    p.display()
                )));
            }
        }
        Ok(())
    }

    /// Whether this run continues an earlier attempt: `--resume PATH`, or `--resume
    /// auto` with a committed checkpoint in the directory. Only then may it replace
    /// an existing `--out` without `--force` (the model its first attempt wrote).
    pub fn continues_a_run(&self) -> bool {
        match (&self.resume, &self.dir) {
            (Resume::No, _) => false,
            (Resume::Path(_), _) => true,
            (Resume::Auto, Some(dir)) => list(dir).is_ok_and(|l| !l.is_empty()),
            (Resume::Auto, None) => false,
        }
    }
}

/// The longest `--wait-for-data` (a week).
pub const MAX_WAIT_SECS: f64 = 7.0 * 24.0 * 3600.0;

pub const HOLD_FILE: &str = "HOLD.json";

/// The file name of the checkpoint at `step`.
pub fn file_name(step: u64) -> String {
    format!("ckpt-{step:010}.h5")
}

/// The step of a committed checkpoint file name.
pub fn parse_step(name: &str) -> Option<u64> {
    name.strip_prefix("ckpt-")?
        .strip_suffix(".h5")?
        .parse()
        .ok()
}

/// Committed checkpoints in `dir`, oldest first.
pub fn list(dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let mut out = Vec::new();
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(Error::io(dir, e)),
    };
    for entry in rd {
        let entry = entry.map_err(|e| Error::io(dir, e))?;
        if let Some(step) = entry.file_name().to_str().and_then(parse_step) {
            out.push((step, entry.path()));
        }
    }
    out.sort();
    Ok(out)
}

/// Rename a checkpoint that failed verification to `<name>.corrupt` (never deleted:
/// it may still hold what someone needs), so that the next `--resume auto` skips it.
pub fn set_aside_corrupt(path: &Path) -> Result<PathBuf> {
    let mut to = path.as_os_str().to_owned();
    to.push(".corrupt");
    let to = PathBuf::from(to);
    std::fs::rename(path, &to).map_err(|e| Error::io(path, e))?;
    Ok(to)
}

/// Collective: every rank must call, with the same `candidates` (newest first).
/// Restores the newest one that verifies with `restore` (itself collective). With
/// `fall_back` (`--resume auto`), a candidate that fails as corrupt
/// ([`Error::Corrupt`] on any rank) is logged, renamed to `<name>.corrupt` and the next
/// older one tried; when none verifies the run stops with a hold (76). Any other
/// failure (e.g. a checkpoint of another configuration) stops at once: an older
/// checkpoint of the same run would fail the same way.
pub fn global_restore_newest<C: Comm, R>(
    comm: &C,
    candidates: &[PathBuf],
    fall_back: bool,
    mut restore: impl FnMut(&Path) -> Result<R>,
) -> Result<Option<(PathBuf, R)>> {
    for path in candidates {
        let err = match restore(path) {
            Ok(r) => return Ok(Some((path.clone(), r))),
            Err(e) => e,
        };
        // 1: corrupt, 2: anything else; the worst over ranks decides.
        let kind = match &err {
            Error::Corrupt(_) => 1,
            Error::Remote { .. } => 0,
            _ => 2,
        };
        let worst = comm.all_reduce_max(kind);
        if worst != 1 {
            return Err(err);
        }
        if !fall_back {
            // Corrupt on every rank, not only where it was seen: rank 0 writes the
            // hold whichever rank's part failed.
            return Err(match err {
                Error::Remote { rank, .. } => Error::Corrupt(format!(
                    "{}: rank {rank}'s part does not verify (its log says why)",
                    path.display()
                )),
                other => other,
            });
        }
        if let Error::Corrupt(reason) = &err {
            log::warn!("skipping checkpoint {}: {reason}", path.display());
        }
        let renamed = if comm.rank() == 0 {
            set_aside_corrupt(path).map(|to| {
                log::warn!("renamed the corrupt checkpoint to {}", to.display());
            })
        } else {
            Ok(())
        };
        comm.agree(renamed)?;
    }
    if candidates.is_empty() {
        return Ok(None);
    }
    Err(Error::Corrupt(format!(
        "none of the {} checkpoint(s) verifies (each was renamed to *.corrupt, see the log); restart with --release-hold to train from scratch",
        candidates.len()
    )))
}

/// Collective: every rank must call. Refuse to start under a hold (unless released),
/// clear leftovers, and list the checkpoints to resume from, newest first (`--resume
/// auto`: every committed one, to fall back on; `--resume PATH`: that one).
pub fn global_prepare_checkpoints<C: Comm>(
    comm: &C,
    ck: &CheckpointConfig,
) -> Result<Vec<std::path::PathBuf>> {
    let Some(dir) = &ck.dir else {
        return Ok(Vec::new());
    };
    let local = if comm.rank() == 0 {
        (|| -> Result<Vec<std::path::PathBuf>> {
            create_dir(dir)?;
            if let Some(h) = read_hold(dir)? {
                if !ck.release_hold {
                    return Err(Error::Hold(format!(
                        "{} exists: {} (rank {}, {}); fix the cause, then restart with --release-hold",
                        dir.join(HOLD_FILE).display(),
                        h.reason,
                        h.rank.map_or("?".into(), |r| r.to_string()),
                        h.position()
                    )));
                }
                if let Some(to) = release_hold(dir)? {
                    log::warn!("hold released (kept as {}): {}", to.display(), h.reason);
                }
            }
            for p in remove_leftovers(dir)? {
                log::warn!(
                    "removed an incomplete checkpoint left by a crash: {}",
                    p.display()
                );
            }
            let committed = list(dir)?;
            // Retention keeps the newest steps of the directory, so checkpoints of
            // another run there would be deleted by this one, or (above this run's
            // steps) outlive its own and be what `--resume auto` picks next.
            let from = match &ck.resume {
                Resume::No => Some(0),
                Resume::Auto => None,
                Resume::Path(p) => Some(
                    p.file_name()
                        .and_then(|n| parse_step(&n.to_string_lossy()))
                        .unwrap_or(0),
                ),
            };
            if let Some(from) = from {
                let above: Vec<String> = committed
                    .iter()
                    .filter(|(s, _)| *s > from)
                    .map(|(_, p)| p.display().to_string())
                    .collect();
                if let Some(newest) = above.last() {
                    return Err(Error::Config(format!(
                        "--checkpoint-dir {} holds {} checkpoint(s) {} (newest {newest}): continue that run with --resume auto, or give this run a directory of its own (its retention would delete them, or they would be resumed instead of its own)",
                        dir.display(),
                        above.len(),
                        if from == 0 { "of an earlier run".to_string() } else { format!("past step {from}, the one resumed from") },
                    )));
                }
            }
            Ok(match &ck.resume {
                Resume::No => Vec::new(),
                Resume::Auto => committed.into_iter().rev().map(|(_, p)| p).collect(),
                Resume::Path(p) => vec![p.clone()],
            })
        })()
    } else {
        Ok(Vec::new())
    };
    let found = comm.agree(local)?;
    // Rank 0's list, NUL-separated, to every rank.
    let mut names: Vec<u8> = found
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join("\0")
        .into_bytes();
    comm.broadcast_vec(0, &mut names)?;
    if names.is_empty() {
        return Ok(Vec::new());
    }
    Ok(String::from_utf8_lossy(&names)
        .split('\0')
        .map(std::path::PathBuf::from)
        .collect())
}

/// Collective: every rank must call. Record the hold `hold` (rank 0 writes it next to
/// the checkpoints, when there is a directory) and return the error that stops every
/// rank with exit 76.
pub fn global_hold<C: Comm>(comm: &C, dir: Option<&Path>, hold: Hold) -> Error {
    if comm.rank() == 0 {
        write_hold_logged(dir, &hold);
    }
    Error::Hold(hold.reason)
}

/// Rank 0 of a failing run: write the hold next to the checkpoints (when there is a
/// directory) and log where, or why it could not be written.
pub fn write_hold_logged(dir: Option<&Path>, hold: &Hold) {
    if let Some(dir) = dir {
        match write_hold(dir, hold) {
            Ok(p) => log::error!("training hold written to {}", p.display()),
            Err(e) => log::error!("could not write the hold file: {e}"),
        }
    }
}

/// Remove temporaries left by a run that died while writing (rank 0, at start).
pub fn remove_leftovers(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut removed = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for entry in rd.flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            let hold_tmp = format!("{HOLD_FILE}.partial");
            if (name.starts_with("ckpt-") && name.ends_with(".partial")) || name == hold_tmp {
                std::fs::remove_file(entry.path()).map_err(|e| Error::io(entry.path(), e))?;
                removed.push(entry.path());
            }
        }
    }
    Ok(removed)
}

/// Delete the checkpoints the retention policy drops after the commit of step `just`
/// (never one that a kept incremental checkpoint's chain needs,
/// [`commit::local_read_base`]).
pub fn apply_retention(dir: &Path, just: u64, keep: usize) -> Result<Vec<u64>> {
    let all = list(dir)?;
    let steps: Vec<u64> = all.iter().map(|(s, _)| *s).collect();
    let base_of = |s: u64| {
        let (_, p) = all.iter().find(|(t, _)| *t == s)?;
        commit::local_read_base(p)
    };
    let drop = policy::to_delete_chained(&steps, just, keep, base_of);
    for (s, p) in &all {
        if drop.contains(s) {
            std::fs::remove_file(p).map_err(|e| Error::io(p, e))?;
        }
    }
    Ok(drop)
}

/// What `HOLD.json` says.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hold {
    pub reason: String,
    pub rank: Option<usize>,
    /// The ALS epoch (1-based) the hold happened in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<usize>,
    /// The embedding model's optimizer step (1-based) the hold happened in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<u64>,
    /// Seconds since the Unix epoch.
    pub time: u64,
}

impl Hold {
    /// Where the run was, for messages: "step 5" (embedding model), "epoch 2" (iALS).
    pub fn position(&self) -> String {
        match (self.step, self.epoch) {
            (Some(s), _) => format!("step {s}"),
            (None, Some(e)) => format!("epoch {e}"),
            (None, None) => "position unknown".into(),
        }
    }

    /// A hold for `reason` (seen on `rank`, if one), now; the caller adds the position.
    pub fn new(reason: String, rank: Option<usize>) -> Self {
        Hold {
            reason,
            rank,
            epoch: None,
            step: None,
            time: now_secs(),
        }
    }
}

/// Create the checkpoint directory (and its parents). A path where no directory
/// can be made is the user's error (exit 2), found before any work is done.
pub fn create_dir(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::input(dir, format!("cannot create the checkpoint directory: {e}")))?;
    crate::io::outfile::probe_writable(&dir.join("probe"))
}

/// Write `HOLD.json` into `dir` (atomically).
pub fn write_hold(dir: &Path, hold: &Hold) -> Result<PathBuf> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let path = dir.join(HOLD_FILE);
    let text = serde_json::to_string_pretty(hold).map_err(|e| Error::Config(e.to_string()))?;
    crate::io::outfile::write(&path, (text + "\n").as_bytes())?;
    Ok(path)
}

/// The hold in `dir`, if any.
pub fn read_hold(dir: &Path) -> Result<Option<Hold>> {
    let path = dir.join(HOLD_FILE);
    match std::fs::read_to_string(&path) {
        Ok(s) => Ok(Some(serde_json::from_str(&s).unwrap_or(Hold {
            reason: format!("unreadable {HOLD_FILE}: {}", s.trim()),
            rank: None,
            epoch: None,
            step: None,
            time: 0,
        }))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io(path, e)),
    }
}

/// Release a hold: keep it for the record as `HOLD.released-<time>.json`.
pub fn release_hold(dir: &Path) -> Result<Option<PathBuf>> {
    let path = dir.join(HOLD_FILE);
    if !path.exists() {
        return Ok(None);
    }
    let to = dir.join(format!("HOLD.released-{}.json", now_secs()));
    std::fs::rename(&path, &to).map_err(|e| Error::io(&path, e))?;
    Ok(Some(to))
}

pub fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A stable 64-bit hash of a string (FNV-1a), for config hashes.
pub fn hash_str(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_listing_ignores_partials() {
        assert_eq!(parse_step(&file_name(42)), Some(42));
        assert_eq!(parse_step("ckpt-0000000042.h5.partial"), None);
        let d = tempfile::tempdir().unwrap();
        for s in [3u64, 1, 20] {
            std::fs::write(d.path().join(file_name(s)), b"x").unwrap();
        }
        std::fs::write(d.path().join("ckpt-0000000099.h5.partial"), b"x").unwrap();
        std::fs::write(d.path().join("HOLD.json.partial"), b"{").unwrap();
        std::fs::write(d.path().join("notes.partial"), b"x").unwrap();
        let l: Vec<u64> = list(d.path()).unwrap().iter().map(|x| x.0).collect();
        assert_eq!(l, vec![1, 3, 20]);
        // The run's own temporaries, not a file of the user's.
        assert_eq!(remove_leftovers(d.path()).unwrap().len(), 2);
        assert!(d.path().join("notes.partial").exists());
        assert_eq!(apply_retention(d.path(), 20, 2).unwrap(), vec![1]);
        let l: Vec<u64> = list(d.path()).unwrap().iter().map(|x| x.0).collect();
        assert_eq!(l, vec![3, 20]);
    }

    #[test]
    fn a_part_that_fails_on_one_rank_is_corrupt_on_every_rank() {
        use crate::comm::threads::run;
        let path = PathBuf::from("ckpt-0000000004.h5");
        let got = run(3, |comm| {
            global_restore_newest(&comm, std::slice::from_ref(&path), false, |_| {
                let mine = if comm.rank() == 1 {
                    Err(Error::Corrupt("slab checksum".into()))
                } else {
                    Ok(())
                };
                comm.agree(mine)
            })
            .map(|_| ())
        });
        for (rank, r) in got.iter().enumerate() {
            match r {
                Err(Error::Corrupt(m)) if rank == 1 => assert_eq!(m, "slab checksum"),
                // Rank 0, which writes the hold, sees it as corrupt too.
                Err(Error::Corrupt(m)) => assert!(
                    m.contains("ckpt-0000000004.h5: rank 1's part does not verify"),
                    "{m}"
                ),
                other => panic!("rank {rank}: {other:?}"),
            }
        }
    }

    #[test]
    fn hold_round_trip_and_release() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(read_hold(d.path()).unwrap(), None);
        let h = Hold {
            reason: "NaN in W".into(),
            rank: Some(2),
            epoch: Some(3),
            step: None,
            time: 5,
        };
        write_hold(d.path(), &h).unwrap();
        assert_eq!(read_hold(d.path()).unwrap(), Some(h));
        assert!(release_hold(d.path()).unwrap().is_some());
        assert_eq!(read_hold(d.path()).unwrap(), None);
    }
}
