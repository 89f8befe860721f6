//! HDF5 helpers every reader and writer shares: error context, scalar attributes and
//! element-type checks.

use crate::error::{Error, Result};
use hdf5::types::VarLenUnicode;
use hdf5::H5Type;
use std::path::Path;

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
