//! Output files: every file torusrec writes reaches its name complete or not at all,
//! and durably. A file is written under a temporary name next to it
//! ([`temp_path`], `<out>.partial`), flushed to disk (`fsync`), renamed into place
//! (atomic within a directory) and the directory is flushed so that the rename itself
//! survives a crash ([`commit`]). Small files (JSON, SVG, plans, the hold) go through
//! [`write`]; large ones (HDF5, streamed) are written by their own code under
//! [`temp_path`] and committed with [`commit`]. Before any work, [`check_output`]
//! refuses an output that exists (without `--force`), cannot be created, or whose
//! temporary name is taken by a directory or a symbolic link; [`check_apart`]
//! refuses an output, or its temporary, that is one of the command's inputs (writing
//! the temporary would overwrite the input, and a failure would then delete it).

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
    check_temp(out)?;
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        if !dir.is_dir() {
            return Err(Error::input(dir, "output directory does not exist"));
        }
    }
    probe_writable(out)
}

/// The temporary name of `out` must be free for a file: a directory there would fail
/// the write only after the work, and a symbolic link would be written through
/// (overwriting, then deleting, what it points to). A stale regular file there (a
/// run that crashed) is replaced. Called by [`check_output`].
pub fn check_temp(out: &Path) -> Result<()> {
    let tmp = temp_path(out);
    match std::fs::symlink_metadata(&tmp) {
        Ok(m) if m.is_dir() => Err(Error::input(
            &tmp,
            format!(
                "is a directory, in the way of the temporary output ({} is written under this name first); remove or rename it",
                crate::error::short_path(out)
            ),
        )),
        Ok(m) if m.file_type().is_symlink() => Err(Error::input(
            &tmp,
            format!(
                "is a symbolic link, in the way of the temporary output ({} is written under this name first and the link's target would be overwritten); remove or rename it",
                crate::error::short_path(out)
            ),
        )),
        _ => Ok(()),
    }
}

/// Whether `a` and `b` name the same existing file (the same device and inode, so
/// symbolic and hard links count as the same file).
fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        _ => false,
    }
}

/// Refuse an output `out` that is one of `inputs` (each `(flag, path)`, the flag for
/// the message, e.g. `"--input"`), or whose temporary name ([`temp_path`]) is one:
/// writing would overwrite the input (with `--force`) or write the temporary over it
/// and delete it on failure. Inputs that do not exist are skipped (they are reported
/// by their readers). Rank-local; call on every rank before any work, with
/// [`check_output`].
pub fn check_apart(out: &Path, inputs: &[(&str, &Path)]) -> Result<()> {
    let tmp = temp_path(out);
    for &(flag, input) in inputs {
        if same_file(out, input) {
            return Err(Error::input(
                out,
                format!(
                    "is also an input ({flag} {}): an output must not replace what is read",
                    crate::error::short_path(input)
                ),
            ));
        }
        if same_file(&tmp, input) {
            // The input by this name, or by another (a link to it).
            let other = if input == tmp {
                String::new()
            } else {
                format!(" {}", crate::error::short_path(input))
            };
            return Err(Error::input(
                &tmp,
                format!(
                    "is an input ({flag}{other}) named like the temporary output of {}, which is written under this name first; rename the input or choose another output",
                    crate::error::short_path(out)
                ),
            ));
        }
    }
    Ok(())
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

    #[test]
    fn a_directory_or_link_at_the_temporary_name_is_refused_up_front() {
        let d = tempfile::tempdir().unwrap();
        let out = d.path().join("o.h5");
        // A stale temporary file is no obstacle.
        std::fs::write(temp_path(&out), "stale").unwrap();
        check_output(&out, false).unwrap();
        std::fs::remove_file(temp_path(&out)).unwrap();
        std::fs::create_dir(temp_path(&out)).unwrap();
        let e = check_output(&out, false).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        let m = e.to_string();
        assert!(m.contains("o.h5.partial: is a directory"), "{m}");
        std::fs::remove_dir(temp_path(&out)).unwrap();
        let target = d.path().join("t");
        std::fs::write(&target, "keep").unwrap();
        std::os::unix::fs::symlink(&target, temp_path(&out)).unwrap();
        let m = check_output(&out, true).unwrap_err().to_string();
        assert!(m.contains("o.h5.partial: is a symbolic link"), "{m}");
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");
    }

    #[test]
    fn an_output_or_its_temporary_that_is_an_input_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let input = d.path().join("in.tsv");
        std::fs::write(&input, "data").unwrap();
        let other = d.path().join("other.tsv");
        std::fs::write(&other, "x").unwrap();
        let ins = [("--input", other.as_path()), ("--input", input.as_path())];
        // Not yet written: nothing to refuse.
        check_apart(&d.path().join("new.h5"), &ins).unwrap();
        // The output is an input, by its name or through a link.
        let e = check_apart(&input, &ins).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().contains("is also an input (--input"), "{e}");
        let link = d.path().join("link.h5");
        std::fs::hard_link(&input, &link).unwrap();
        assert!(check_apart(&link, &ins).is_err());
        // The temporary of `out` is an input.
        let out = d.path().join("in");
        let tmp_input = temp_path(&out);
        std::fs::write(&tmp_input, "precious").unwrap();
        let ins = [("--data", tmp_input.as_path())];
        let m = check_apart(&out, &ins).unwrap_err().to_string();
        assert!(
            m.contains("in.partial: is an input (--data) named like the temporary output"),
            "{m}"
        );
        assert_eq!(std::fs::read_to_string(&tmp_input).unwrap(), "precious");
    }
}
