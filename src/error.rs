//! Typed errors with context, and their mapping to the exit codes of docs/design.md.

use std::path::PathBuf;

/// The exit codes that are the contract with Slurm and with users.
pub mod exit {
    pub const OK: i32 = 0;
    pub const OTHER: i32 = 1;
    pub const USAGE: i32 = 2;
    pub const PREEMPTED: i32 = 75;
    pub const HOLD: i32 = 76;
    /// A peer rank or its host stopped answering (`--comm-timeout`, docs/cluster.md).
    pub const PEER_LOST: i32 = 77;
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Bad command line or configuration (exit 2).
    #[error("{0}")]
    Config(String),

    /// Malformed input at a known line of a text file (exit 2).
    #[error("{}:{line}: {msg}", short_path(path))]
    Parse {
        path: PathBuf,
        line: u64,
        msg: String,
    },

    /// Bad or unusable input file or dataset (exit 2).
    #[error("{}: {msg}", short_path(path))]
    Input { path: PathBuf, msg: String },

    /// An HDF5 dataset that does not match the layout (exit 2).
    #[error("{}: dataset {dataset}: {msg}", short_path(path))]
    Layout {
        path: PathBuf,
        dataset: String,
        msg: String,
    },

    /// The output exists and `--force` was not given (exit 2).
    #[error("{}: output exists (pass --force to overwrite)", short_path(.0))]
    OutputExists(PathBuf),

    /// Operating-system I/O with the path it concerned (exit 1).
    #[error("{}: {source}", short_path(path))]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// HDF5 library failure with the file and object it concerned (exit 1).
    #[error("{}: {what}: {source}", short_path(path))]
    Hdf5 {
        path: PathBuf,
        what: String,
        #[source]
        source: hdf5::Error,
    },

    /// A self-check that failed: what was computed disagrees with what was measured
    /// (exit 1).
    #[error("check failed: {0}")]
    Check(String),

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
            Error::Io { .. }
            | Error::Hdf5 { .. }
            | Error::Comm(_)
            | Error::Check(_)
            | Error::Interrupted(_) => exit::OTHER,
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

/// A path for an error message: whole when it has at most 100 characters, else its
/// first 30 and last 60 (the file name), so that one absurd argument cannot flood a log.
pub fn short_path(path: &std::path::Path) -> String {
    let s = path.to_string_lossy();
    let n = s.chars().count();
    if n <= 100 {
        return s.into_owned();
    }
    let head: String = s.chars().take(30).collect();
    let tail: String = s.chars().skip(n - 60).collect();
    format!("{head}...({} characters)...{tail}", n - 90)
}

/// The whole of a user-supplied text file (a `.properties`, TOML or JSON file). A
/// file that is missing, a directory, not readable by this user, a path that cannot
/// name a file, or not text (not UTF-8) is the user's input error (exit 2); other
/// failures are I/O errors (exit 1).
pub fn read_text(path: &std::path::Path) -> Result<String> {
    use std::io::ErrorKind;
    // ENOTDIR and ENAMETOOLONG: a path that cannot name a file.
    const PATH_ERRORS: [i32; 2] = [libc::ENOTDIR, libc::ENAMETOOLONG];
    let bytes = std::fs::read(path).map_err(|e| match e.kind() {
        ErrorKind::NotFound => Error::input(path, "no such file"),
        ErrorKind::IsADirectory => Error::input(path, "is a directory, not a file"),
        ErrorKind::PermissionDenied => Error::input(path, format!("cannot read: {e}")),
        _ if e.raw_os_error().is_some_and(|c| PATH_ERRORS.contains(&c)) => {
            Error::input(path, format!("cannot read: {e}"))
        }
        _ => Error::io(path, e),
    })?;
    String::from_utf8(bytes).map_err(|e| {
        let at = e.utf8_error().valid_up_to();
        let line = e.as_bytes()[..at].iter().filter(|&&b| b == b'\n').count() as u64 + 1;
        Error::Parse {
            path: path.into(),
            line,
            msg: "not valid UTF-8 text".into(),
        }
    })
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

    #[test]
    fn long_paths_keep_their_head_and_file_name() {
        let p = std::path::PathBuf::from(format!("/d/{}/file.tsv", "x".repeat(500)));
        let e = Error::input(&p, "no such file").to_string();
        assert!(e.len() < 130, "{e}");
        assert!(
            e.starts_with("/d/xx") && e.ends_with("xx/file.tsv: no such file"),
            "{e}"
        );
        assert_eq!(short_path(std::path::Path::new("/a/b.h5")), "/a/b.h5");
    }
}
