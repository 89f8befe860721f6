//! HDF5 helpers every reader and writer shares.

use crate::error::{Error, Result};
use std::path::Path;

/// An HDF5 result with the file and what was being done, for the error message.
pub fn ctx<T>(path: &Path, what: impl Into<String>, r: hdf5::Result<T>) -> Result<T> {
    r.map_err(|e| Error::hdf5(path, what, e))
}
