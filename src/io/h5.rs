//! HDF5 helpers every reader and writer shares: error context, scalar attributes and
//! element-type checks.

use crate::error::{Error, Result};
use hdf5::types::VarLenUnicode;
use hdf5::H5Type;
use std::path::Path;

/// The builder every torusrec file is opened through: without HDF5's own `flock` file
/// locks. torusrec never shares a file while it is written (every writer writes a
/// temporary name and renames it into place), so the locks protect nothing here, and
/// they hurt: a process forked while a file is open (a launcher, a test's child) inherits
/// the lock and holds it until it exits, so a later open of that file fails with
/// `EAGAIN`; and `flock` fails outright on some parallel file systems, where HPC sites
/// set `HDF5_USE_FILE_LOCKING=FALSE` for the same reason.
fn unlocked() -> hdf5::FileBuilder {
    let mut b = hdf5::File::with_options();
    b.with_fapl(|p| p.file_locking(false));
    b
}

/// Create (truncate) `path` for writing, without file locks.
pub fn create(path: impl AsRef<Path>) -> hdf5::Result<hdf5::File> {
    unlocked().create(path)
}

/// Open `path` read-only, without file locks.
pub fn open(path: impl AsRef<Path>) -> hdf5::Result<hdf5::File> {
    unlocked().open(path)
}

/// Open `path` for reading and writing, without file locks.
pub fn open_rw(path: impl AsRef<Path>) -> hdf5::Result<hdf5::File> {
    unlocked().open_rw(path)
}

/// Open an HDF5 file read-only, with a clear error (exit 2) when it is missing or not
/// HDF5.
pub fn open_h5(path: &Path) -> Result<hdf5::File> {
    if path.is_dir() {
        return Err(Error::input(path, "is a directory, not an HDF5 file"));
    }
    if !path.is_file() {
        return Err(Error::input(path, "no such file"));
    }
    let mut magic = [0u8; 8];
    let is_h5 = std::fs::File::open(path)
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic))
        .is_ok()
        && magic == *b"\x89HDF\r\n\x1a\n";
    if !is_h5 {
        return Err(Error::input(path, "not an HDF5 file"));
    }
    open(path).map_err(|e| Error::input(path, format!("cannot open as HDF5: {e}")))
}

/// An HDF5 result with the file and what was being done, for the error message.
pub fn ctx<T>(path: &Path, what: impl Into<String>, r: hdf5::Result<T>) -> Result<T> {
    r.map_err(|e| Error::hdf5(path, what, e))
}

/// A scalar attribute's value.
#[derive(Clone, Debug, PartialEq)]
pub enum Attr {
    Str(String),
    U64(u64),
    F64(f64),
}

/// Write the scalar attribute `k = v` on `loc` (a file, group or dataset) of the file
/// at `path` (for the error message).
pub fn write_attr(loc: &hdf5::Location, path: &Path, k: &str, v: &Attr) -> Result<()> {
    let r = match v {
        Attr::Str(s) => {
            let v: VarLenUnicode = s
                .parse()
                .map_err(|e| Error::Config(format!("attribute {k}: {e}")))?;
            loc.new_attr::<VarLenUnicode>()
                .create(k)
                .and_then(|a| a.write_scalar(&v))
        }
        Attr::U64(x) => loc
            .new_attr::<u64>()
            .create(k)
            .and_then(|a| a.write_scalar(x)),
        Attr::F64(x) => loc
            .new_attr::<f64>()
            .create(k)
            .and_then(|a| a.write_scalar(x)),
    };
    ctx(path, format!("attribute {k}"), r)
}

/// Write every attribute of `attrs` on `loc`, in order.
pub fn write_attrs(loc: &hdf5::Location, path: &Path, attrs: &[(&str, Attr)]) -> Result<()> {
    attrs
        .iter()
        .try_for_each(|(k, v)| write_attr(loc, path, k, v))
}

/// The scalar attribute `name` of `loc` as a `T`; a missing one, or one of another
/// type, is a layout error naming the attribute and `kind` (e.g. "u64").
pub fn read_attr<T: H5Type>(
    loc: &hdf5::Location,
    path: &Path,
    name: &str,
    kind: &str,
) -> Result<T> {
    loc.attr(name)
        .and_then(|a| a.read_scalar::<T>())
        .map_err(|_| {
            Error::layout(
                path,
                format!("/ attribute {name}"),
                format!("missing or not a {kind} scalar"),
            )
        })
}

/// The string attribute `name` of `loc` (see [`read_attr`]).
pub fn read_str_attr(loc: &hdf5::Location, path: &Path, name: &str) -> Result<String> {
    read_attr::<VarLenUnicode>(loc, path, name, "string").map(|s| s.as_str().to_string())
}

/// The u64 attribute `name` of `loc` (see [`read_attr`]).
pub fn read_u64_attr(loc: &hdf5::Location, path: &Path, name: &str) -> Result<u64> {
    read_attr::<u64>(loc, path, name, "u64")
}

/// Refuse (layout error) a dataset whose element type is not `T`, naming both.
pub fn check_elem_type<T: H5Type>(ds: &hdf5::Dataset, path: &Path, name: &str) -> Result<()> {
    let want = T::type_descriptor();
    let have = ds
        .dtype()
        .and_then(|t| t.to_descriptor())
        .map_err(|e| Error::layout(path, name, format!("unreadable type: {e}")))?;
    if have != want {
        return Err(Error::layout(
            path,
            name,
            format!("element type {have}, expected {want}"),
        ));
    }
    Ok(())
}

/// Read elements `lo..hi` of a 1-D dataset, checking its element type.
pub fn read_range<T: H5Type>(
    f: &hdf5::File,
    path: &Path,
    name: &str,
    lo: u64,
    hi: u64,
) -> Result<Vec<T>> {
    let ds = f
        .dataset(name)
        .map_err(|_| Error::layout(path, name, "missing"))?;
    if ds.ndim() != 1 {
        return Err(Error::layout(
            path,
            name,
            format!("expected 1 dimension, found {}", ds.ndim()),
        ));
    }
    check_elem_type::<T>(&ds, path, name)?;
    let len = ds.size() as u64;
    if lo > hi || hi > len {
        return Err(Error::layout(
            path,
            name,
            format!("range {lo}..{hi} outside its {len} entries"),
        ));
    }
    if lo == hi {
        return Ok(Vec::new());
    }
    ds.read_slice_1d::<T, _>(lo as usize..hi as usize)
        .map(|a| a.into_raw_vec_and_offset().0)
        .map_err(|e| Error::layout(path, name, format!("unreadable: {e}")))
}

/// The length of a 1-D dataset (missing: a layout error naming it).
pub fn dataset_len(f: &hdf5::File, path: &Path, name: &str) -> Result<u64> {
    f.dataset(name)
        .map(|d| d.size() as u64)
        .map_err(|_| Error::layout(path, name, "missing"))
}

#[cfg(test)]
mod tests {
    /// A process forked while a file is open inherits its descriptor; HDF5's default
    /// `flock` then locks the file out of a later open for as long as the child lives.
    #[test]
    fn a_child_forked_while_a_file_is_open_does_not_lock_it_out() {
        let dir = tempfile::tempdir().unwrap();
        let (ours, locked) = (dir.path().join("ours.h5"), dir.path().join("locked.h5"));
        let files = (
            super::create(&ours).unwrap(),
            hdf5::File::create(&locked).unwrap(),
        );
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        drop(files);
        let reopened = (
            super::open_rw(&ours).map(drop),
            hdf5::File::open_rw(&locked).map(drop),
        );
        child.kill().unwrap();
        child.wait().unwrap();
        reopened.0.unwrap();
        // The control: the hazard is real where the environment leaves locks on.
        if std::env::var_os("HDF5_USE_FILE_LOCKING").is_none() {
            let e = reopened
                .1
                .expect_err("a locked file reopened beside its child");
            assert!(e.to_string().contains("unable to lock file"), "{e}");
        }
    }
}
