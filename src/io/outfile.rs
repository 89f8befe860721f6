//! Output files: every file torusrec writes reaches its name complete or not at all,
//! and durably. A file is written under a temporary name next to it
//! ([`temp_path`], `<out>.partial`), flushed to disk (`fsync`), renamed into place
//! (atomic within a directory) and the directory is flushed so that the rename itself
//! survives a crash ([`commit`]). Small files (JSON, SVG, plans, the hold) go through
//! [`write`]; large ones (HDF5, streamed) are written by their own code under
//! [`temp_path`] and committed with [`commit`]. Before any work, [`check_output`]
//! refuses an output that exists (without `--force`) or cannot be created.

use crate::error::{Error, Result};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The temporary name a file is written under before it is renamed into place.
pub fn temp_path(out: &Path) -> PathBuf {
    let mut s = out.as_os_str().to_owned();
    s.push(".partial");
    PathBuf::from(s)
}

/// Refuse an existing output unless `force` (call on every rank before any work).
pub fn check_output(out: &Path, force: bool) -> Result<()> {
    if out.is_dir() {
        return Err(Error::input(
            out,
            "is a directory: --out names the output file",
        ));
    }
    if out.exists() && !force {
        return Err(Error::OutputExists(out.to_path_buf()));
    }
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        if !dir.is_dir() {
            return Err(Error::input(dir, "output directory does not exist"));
        }
    }
    probe_writable(out)
}

/// Fail now, not after the work, when no file can be created next to `out` (a
/// read-only directory, `/proc`, ...): create and remove a probe file there. Each
/// process uses its own name, so ranks may probe at once.
pub fn probe_writable(out: &Path) -> Result<()> {
    let mut name = out.as_os_str().to_owned();
    name.push(format!(".probe{}", std::process::id()));
    let probe = std::path::PathBuf::from(name);
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
    {
        Ok(f) => {
            drop(f);
            let _ = std::fs::remove_file(&probe);
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(Error::input(
            out,
            format!("cannot write the output here: {e}"),
        )),
    }
}

/// Make the complete temporary `tmp` durable, rename it to `path`, and make the rename
/// durable (a directory that cannot be synced, as on some file systems, is not an
/// error: the rename itself is atomic). Fault point (tests): `before-rename`.
pub fn commit(tmp: &Path, path: &Path) -> Result<()> {
    std::fs::File::open(tmp)
        .and_then(|f| f.sync_all())
        .map_err(|e| Error::io(tmp, e))?;
    crate::faults::point("before-rename", 0);
    std::fs::rename(tmp, path).map_err(|e| Error::io(path, e))?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let _ = std::fs::File::open(dir).and_then(|d| d.sync_all());
    Ok(())
}

/// Write `bytes` to `out` through [`temp_path`] and [`commit`]. On failure `out` is
/// untouched and the temporary removed.
pub fn write(out: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = temp_path(out);
    let written = std::fs::File::create(&tmp)
        .and_then(|mut f| f.write_all(bytes))
        .map_err(|e| Error::io(&tmp, e))
        .and_then(|()| commit(&tmp, out));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_replaces_whole_and_leaves_no_temporary() {
        let d = tempfile::tempdir().unwrap();
        let out = d.path().join("a.json");
        write(&out, b"first\n").unwrap();
        assert_eq!(std::fs::read(&out).unwrap(), b"first\n");
        write(&out, b"second, longer\n").unwrap();
        assert_eq!(std::fs::read(&out).unwrap(), b"second, longer\n");
        assert!(!temp_path(&out).exists());
        // A symbolic link at the name is replaced, its target left alone.
        let target = d.path().join("target");
        std::fs::write(&target, "keep").unwrap();
        let link = d.path().join("link.json");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        write(&link, b"new").unwrap();
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");
        assert_eq!(std::fs::read_to_string(&link).unwrap(), "new");
    }

    #[test]
    fn a_failed_write_names_the_file_and_keeps_the_old_one() {
        let d = tempfile::tempdir().unwrap();
        // No such directory: the temporary cannot be created.
        let e = write(&d.path().join("missing/a.json"), b"x").unwrap_err();
        assert!(e.to_string().contains("a.json.partial"), "{e}");
        // The rename fails (a directory is in the way): nothing left behind.
        let out = d.path().join("dir");
        std::fs::create_dir(&out).unwrap();
        std::fs::write(out.join("inside"), "keep").unwrap();
        assert!(write(&out, b"x").is_err());
        assert!(!temp_path(&out).exists());
        assert_eq!(std::fs::read_to_string(out.join("inside")).unwrap(), "keep");
    }
}
