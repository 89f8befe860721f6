//! The one commit protocol of a file every rank writes part of (checkpoints and trained
//! models of every workload), and the checkpoint manifest around it.
//!
//! Commit ([`global_write_atomic`]): rank 0 creates `<path>.partial` with every dataset
//! and attribute; every rank in rank order writes its slab (barrier between turns: one
//! HDF5 writer at a time); rank 0 commits it ([`crate::io::outfile::commit`]: fsync, rename,
//! directory fsync). Each stage is agreed, so all ranks fail or none; on failure `path`
//! is untouched and rank 0 removes the temporary.
//!
//! Checkpoint ([`global_write_checkpoint`]): the file `ckpt-<step>.h5` committed this
//! way with the root attributes `format = "torusrec-checkpoint"` and `manifest` (JSON
//! of the workload's [`Manifest`]), then retention. On restore,
//! [`local_read_manifest`] checks the format, [`check_workload`] the schema and
//! workload, [`check_config_hash`] the configuration and [`check_checksum`] the data:
//! a file of another run is a hold ([`Error::Hold`]), a damaged one corrupt
//! ([`Error::Corrupt`]); both exit 76 naming the file and both values.

use super::{apply_retention, file_name, SCHEMA};
use crate::comm::Comm;
use crate::error::{Error, Result};
use crate::io::h5::{self, open_h5, Attr};
use crate::io::outfile::temp_path;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::path::{Path, PathBuf};

/// The `format` attribute of a checkpoint file.
pub const FORMAT: &str = "torusrec-checkpoint";

/// Collective: every rank must call. Write `path` atomically (see the module docs):
/// rank 0 runs `create` on the temporary, then every rank in turn runs `write` on it
/// (its own slab), then rank 0 commits it.
pub fn global_write_atomic<C: Comm>(
    comm: &C,
    path: &Path,
    create: impl FnOnce(&Path) -> Result<()>,
    write: impl FnOnce(&Path) -> Result<()>,
) -> Result<()> {
    let tmp = temp_path(path);
    let created = if comm.rank() == 0 {
        create(&tmp)
    } else {
        Ok(())
    };
    let mut result = comm.agree(created);
    if result.is_ok() {
        let mut write = Some(write);
        let mut mine = Ok(());
        for turn in 0..comm.size() {
            comm.barrier();
            if turn == comm.rank() {
                if let Some(w) = write.take() {
                    mine = w(&tmp);
                }
                super::faults::point("after-shard-write", comm.rank());
            }
        }
        result = comm.agree(mine);
        if result.is_ok() && comm.rank() == 0 {
            super::faults::point("before-commit", 0);
            result = crate::io::outfile::commit(&tmp, path);
        }
        result = comm.agree(result);
    }
    if result.is_err() && comm.rank() == 0 {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// A workload's checkpoint manifest (stored as JSON).
pub trait Manifest: Serialize + DeserializeOwned {
    /// The workload that writes it (`"als"`, `"embed"`).
    const WORKLOAD: &'static str;
    /// The fields every workload's manifest carries, as written.
    fn header(&self) -> Header<'_>;
}

/// What every manifest says about itself.
pub struct Header<'a> {
    pub schema: u32,
    pub workload: &'a str,
    /// Hash of everything the trained bits depend on besides the rank count.
    pub config_hash: &'a str,
}

/// Collective: every rank must call. Commit the checkpoint of `step` into `dir` (see
/// the module docs), then delete what the retention policy (`keep`) drops. `manifest`
/// is built first (it may be collective, e.g. global checksums); `write` is the
/// workload's collective writer of its state to the given path with the given root
/// attributes (itself built on [`global_write_atomic`]). `describe` names the position
/// in the log line (e.g. "step 12").
pub fn global_write_checkpoint<C: Comm, M: Manifest>(
    comm: &C,
    dir: &Path,
    step: u64,
    keep: usize,
    describe: &str,
    manifest: impl FnOnce() -> Result<M>,
    write: impl FnOnce(&Path, &[(&str, Attr)]) -> Result<()>,
) -> Result<PathBuf> {
    let t0 = std::time::Instant::now();
    let _p = comm.stats().phase("io");
    let path = dir.join(file_name(step));
    let json = serde_json::to_string(&manifest()?).map_err(|e| Error::Config(e.to_string()))?;
    let made = if comm.rank() == 0 {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))
    } else {
        Ok(())
    };
    comm.agree(made)?;
    write(
        &path,
        &[
            ("format", Attr::Str(FORMAT.into())),
            ("manifest", Attr::Str(json)),
        ],
    )?;
    let retained = if comm.rank() == 0 {
        apply_retention(dir, step, keep).map(|_| ())
    } else {
        Ok(())
    };
    comm.agree(retained)?;
    if comm.rank() == 0 {
        let secs = t0.elapsed().as_secs_f64();
        let bytes = std::fs::metadata(&path).map_or(0, |m| m.len());
        log::info!(
            "checkpoint {} ({describe}): {:.1} MB in {secs:.3} s, {:.0} MB/s",
            path.display(),
            bytes as f64 / 1e6,
            bytes as f64 / 1e6 / secs.max(1e-9)
        );
    }
    Ok(path)
}

/// Rank-local: open a checkpoint file; one that cannot be opened is corrupt.
pub fn local_open(path: &Path) -> Result<hdf5::File> {
    open_h5(path).map_err(|e| Error::Corrupt(format!("checkpoint {e}")))
}

/// Rank-local: the manifest of the checkpoint at `path`, after checking its format.
pub fn local_read_manifest<M: Manifest>(path: &Path) -> Result<M> {
    let f = local_open(path)?;
    let attr =
        |name: &str| h5::read_str_attr(&f, path, name).map_err(|e| Error::Corrupt(e.to_string()));
    let format = attr("format")?;
    if format != FORMAT {
        return Err(corrupt(
            path,
            format!("not a torusrec checkpoint (format {format:?})"),
        ));
    }
    serde_json::from_str(&attr("manifest")?)
        .map_err(|e| corrupt(path, format!("unreadable manifest: {e}")))
}

/// Rank-local: the step of the checkpoint that the incremental checkpoint at `path`
/// was written on: its manifest's `delta.file` (a checkpoint file name in the same
/// directory). `None` for a full checkpoint, or a file that cannot be read.
pub fn local_read_base(path: &Path) -> Option<u64> {
    let f = local_open(path).ok()?;
    let json = h5::read_str_attr(&f, path, "manifest").ok()?;
    let v: serde_json::Value = serde_json::from_str(&json).ok()?;
    super::parse_step(v.get("delta")?.get("file")?.as_str()?)
}

/// A checkpoint written by another schema or workload is a hold naming both.
pub fn check_workload<M: Manifest>(path: &Path, m: &M) -> Result<()> {
    let h = m.header();
    if h.schema != SCHEMA || h.workload != M::WORKLOAD {
        return Err(hold(
            path,
            format!(
                "schema {} workload {:?}, expected {SCHEMA} {:?}",
                h.schema,
                h.workload,
                M::WORKLOAD
            ),
        ));
    }
    Ok(())
}

/// A checkpoint of another configuration (`want`: this run's hash) is a hold naming
/// both hashes and `must_match`, what the hash covers.
pub fn check_config_hash<M: Manifest>(
    path: &Path,
    m: &M,
    want: &str,
    must_match: &str,
) -> Result<()> {
    let got = m.header().config_hash;
    if got != want {
        return Err(hold(
            path,
            format!(
                "the checkpoint's configuration (hash {got}) differs from this run's ({want}): {must_match} must match"
            ),
        ));
    }
    Ok(())
}

/// Data whose checksum `got` (after restoring) is not the manifest's `want` is corrupt.
pub fn check_checksum(path: &Path, what: &str, got: &str, want: &str) -> Result<()> {
    if got != want {
        return Err(corrupt(
            path,
            format!(
                "{what}: checksum {got} does not match the manifest's {want}: the file is corrupt"
            ),
        ));
    }
    Ok(())
}

/// A hold (exit 76) naming the checkpoint file.
pub fn hold(path: &Path, msg: impl std::fmt::Display) -> Error {
    Error::Hold(format!("{}: {msg}", path.display()))
}

/// A corrupt checkpoint (exit 76, skipped by `--resume auto`) naming the file.
pub fn corrupt(path: &Path, msg: impl std::fmt::Display) -> Error {
    Error::Corrupt(format!("{}: {msg}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::threads::run as run_threads;

    #[test]
    fn a_failing_rank_leaves_nothing_and_every_rank_sees_the_error() {
        let d = tempfile::tempdir().unwrap();
        let out = d.path().join("x.h5");
        let results = run_threads(3, |comm| {
            global_write_atomic(
                &comm,
                &out,
                |tmp| std::fs::write(tmp, b"").map_err(|e| Error::io(tmp, e)),
                |_| {
                    if comm.rank() == 1 {
                        Err(Error::Config("rank 1 failed".into()))
                    } else {
                        Ok(())
                    }
                },
            )
        });
        assert!(results.iter().all(|r| r.is_err()), "{results:?}");
        assert!(!out.exists() && !temp_path(&out).exists());
    }

    #[test]
    fn every_rank_writes_in_rank_order_then_the_file_appears() {
        let d = tempfile::tempdir().unwrap();
        let out = d.path().join("x.txt");
        let results = run_threads(4, |comm| {
            global_write_atomic(
                &comm,
                &out,
                |tmp| std::fs::write(tmp, b"").map_err(|e| Error::io(tmp, e)),
                |tmp| {
                    use std::io::Write;
                    let mut f = std::fs::OpenOptions::new()
                        .append(true)
                        .open(tmp)
                        .map_err(|e| Error::io(tmp, e))?;
                    write!(f, "{}", comm.rank()).map_err(|e| Error::io(tmp, e))
                },
            )
        });
        assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "0123");
        assert!(!temp_path(&out).exists());
    }
}
