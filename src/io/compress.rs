//! Which inputs are compressed: a `.gz` name means gzip.

use std::path::Path;

/// Whether `path` names a gzip-compressed file (by its `.gz` extension).
pub fn is_gz(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "gz")
}
