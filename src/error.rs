//! Typed errors with context, and their mapping to the exit codes of docs/design.md.

use std::path::PathBuf;

/// The exit codes that are the contract with Slurm and with users.
pub mod exit {
    pub const OK: i32 = 0;
    pub const OTHER: i32 = 1;
    pub const USAGE: i32 = 2;
    pub const PREEMPTED: i32 = 75;
    pub const HOLD: i32 = 76;
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Bad command line or configuration (exit 2).
    #[error("{0}")]
    Config(String),

    /// Malformed input at a known line of a text file (exit 2).
    #[error("{path}:{line}: {msg}")]
    Parse {
        path: PathBuf,
        line: u64,
        msg: String,
    },

    /// Bad or unusable input file or dataset (exit 2).
    #[error("{path}: {msg}")]
    Input { path: PathBuf, msg: String },

    /// An HDF5 dataset that does not match the layout (exit 2).
    #[error("{path}: dataset {dataset}: {msg}")]
    Layout {
        path: PathBuf,
        dataset: String,
        msg: String,
    },

    /// The output exists and `--force` was not given (exit 2).
    #[error("{0}: output exists (pass --force to overwrite)")]
    OutputExists(PathBuf),

    /// Operating-system I/O with the path it concerned (exit 1).
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// HDF5 library failure with the file and object it concerned (exit 1).
    #[error("{path}: {what}: {source}")]
    Hdf5 {
        path: PathBuf,
        what: String,
        #[source]
        source: hdf5::Error,
    },

    /// Communication failure or a collective used wrongly (exit 1).
    #[error("communicator: {0}")]
    Comm(String),

    /// A permanent training error: NaN/Inf, divergence, a corrupt or mismatched
    /// checkpoint, or a hold left by an earlier run (exit 76).
    #[error("training hold: {0}")]
    Hold(String),

    /// A checkpoint that fails verification: unreadable, not a checkpoint, a dataset
    /// missing or misshapen, a checksum that does not match (exit 76, like a hold;
    /// `--resume auto` falls back to an older checkpoint instead).
    #[error("corrupt checkpoint: {0}")]
    Corrupt(String),

    /// Stopped on a preemption signal after writing a complete checkpoint (exit 75).
    #[error("preempted: {0}")]
    Preempted(String),

    /// Stopped on a preemption signal with nothing saved (no `--checkpoint-dir`):
    /// exit 1, not 75, so that a job script does not requeue a run that would start
    /// over from scratch.
    #[error("interrupted: {0}")]
    Interrupted(String),

    /// Another rank failed; it printed the reason. Carries the agreed exit code.
    #[error("stopping because rank {rank} failed (exit code {code})")]
    Remote { rank: usize, code: i32 },
}

impl Error {
    /// The process exit code for this error (docs/design.md).
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::Config(_)
            | Error::Parse { .. }
            | Error::Input { .. }
            | Error::Layout { .. }
            | Error::OutputExists(_) => exit::USAGE,
            Error::Io { .. } | Error::Hdf5 { .. } | Error::Comm(_) | Error::Interrupted(_) => {
                exit::OTHER
            }
            Error::Hold(_) | Error::Corrupt(_) => exit::HOLD,
            Error::Preempted(_) => exit::PREEMPTED,
            Error::Remote { code, .. } => *code,
        }
    }

    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }

    pub fn input(path: impl Into<PathBuf>, msg: impl Into<String>) -> Self {
        Error::Input {
            path: path.into(),
            msg: msg.into(),
        }
    }

    pub fn hdf5(path: impl Into<PathBuf>, what: impl Into<String>, source: hdf5::Error) -> Self {
        Error::Hdf5 {
            path: path.into(),
            what: what.into(),
            source,
        }
    }

    pub fn layout(
        path: impl Into<PathBuf>,
        dataset: impl Into<String>,
        msg: impl Into<String>,
    ) -> Self {
        Error::Layout {
            path: path.into(),
            dataset: dataset.into(),
            msg: msg.into(),
        }
    }
}

/// A user-supplied token for an error message, quoted, and cut to its first 100
/// characters (with the length of the rest) so that one bad line cannot flood a log.
pub fn quote(token: &str) -> String {
    const MAX: usize = 100;
    match token.char_indices().nth(MAX) {
        None => format!("{token:?}"),
        Some((cut, _)) => format!("{:?}... ({} more bytes)", &token[..cut], token.len() - cut),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quote_cuts_long_tokens_at_a_char_boundary() {
        assert_eq!(quote("abc"), "\"abc\"");
        let long = "é".repeat(150);
        let q = quote(&long);
        assert!(q.starts_with(&format!("{:?}", "é".repeat(100))), "{q}");
        assert!(q.ends_with("... (100 more bytes)"), "{q}");
    }
}
