//! Rank 0's output of a training run, shared by every workload: the concise lines for
//! people, a progress bar while stderr is a terminal, and the JSON-lines metrics file.

use crate::comm::Comm;
use crate::error::{Error, Result};
use std::io::{IsTerminal, Write};
use std::path::Path;

/// Width of the progress bar in characters.
const BAR: u64 = 30;

/// What rank 0 prints and records; on other ranks every method does nothing.
pub struct RunOutput {
    root: bool,
    tty: bool,
    metrics: Option<std::fs::File>,
}

impl RunOutput {
    /// Collective: every rank must call. Rank 0 opens `metrics` for appending (a file
    /// that cannot be opened stops every rank with exit 2, before any work).
    pub fn global_open<C: Comm>(comm: &C, metrics: Option<&Path>) -> Result<Self> {
        let root = comm.rank() == 0;
        let opened = match (metrics, root) {
            (Some(p), true) => check_appendable(p).and_then(|()| {
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(p)
                    .map(Some)
                    .map_err(|e| Error::input(p, format!("cannot open the metrics file: {e}")))
            }),
            _ => Ok(None),
        };
        Ok(Self {
            root,
            tty: root && std::io::stderr().is_terminal(),
            metrics: comm.agree(opened)?,
        })
    }

    /// Whether this rank prints (rank 0).
    pub fn is_root(&self) -> bool {
        self.root
    }

    /// Redraw the progress bar at `done` of `total` (terminal only).
    pub fn progress(&self, done: u64, total: u64) {
        if self.tty {
            let k = (done * BAR / total.max(1)).min(BAR) as usize;
            eprint!(
                "\r[{}{}] {done}/{total}\x1b[K",
                "=".repeat(k),
                " ".repeat(BAR as usize - k)
            );
        }
    }

    /// Print a line for people on stdout (clearing the progress bar first).
    pub fn line(&self, text: &str) {
        if !self.root {
            return;
        }
        if self.tty {
            eprint!("\r\x1b[K");
        }
        println!("{text}");
    }

    /// Append one JSON object to the metrics file, if there is one.
    pub fn record(&mut self, value: &impl serde::Serialize) {
        if let Some(m) = self.metrics.as_mut() {
            if let Ok(s) = serde_json::to_string(value) {
                let _ = writeln!(m, "{s}");
            }
        }
    }
}

/// `--metrics` appends: refuse an existing file that is not JSON lines (a dataset or a
/// model given by mistake would be damaged), judged by its first byte.
fn check_appendable(p: &Path) -> Result<()> {
    use std::io::Read;
    let Ok(mut f) = std::fs::File::open(p) else {
        return Ok(()); // absent (or unreadable: the open for appending says why)
    };
    let mut first = [0u8; 1];
    match f.read(&mut first) {
        Ok(0) => Ok(()),
        Ok(_) if first[0] == b'{' => Ok(()),
        _ => Err(Error::input(
            p,
            "exists and is not a JSON-lines metrics file; --metrics appends, give a new file",
        )),
    }
}
