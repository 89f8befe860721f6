//! Where a run's examples come from: the synthetic generator, a click-log file, or
//! either with this rank's ranges read ahead of time; training ranges and held-out
//! ranges of each.

use super::batch::Batch;
use super::gen::ClickGen;
use super::log_file::ClickLog;
use crate::Result;

/// Where examples come from.
pub enum Source {
    /// Another source with this rank's ranges read ahead of time (`--preload`, as
    /// benchmark peers time steps over data already in memory).
    Preloaded {
        inner: Box<Source>,
        cache: std::collections::HashMap<(u64, usize), Batch>,
    },
    /// Drawn on the fly from (seed, example index): unlimited.
    Generated(ClickGen),
    /// A click log (`generate clicks`, `prepare clicks`): the examples `eval` are held
    /// out (the last N, or one day of a log of several), training cycles over the
    /// others in order.
    Log {
        log: ClickLog,
        eval: std::ops::Range<u64>,
        /// The day held out (`--eval-day`), for the identity.
        eval_day: Option<usize>,
    },
}

/// First example index of the held-out examples of a generated source (training never
/// reaches it).
pub const EVAL_BASE: u64 = 1 << 50;

impl Source {
    /// Make room in `out` for the preloaded examples of `parts` (appended one
    /// micro-batch at a time, it would otherwise grow in steps that leave no room for
    /// a slightly larger step later).
    pub fn reserve(&self, parts: &[(u64, usize)], out: &mut Batch) {
        if let Source::Preloaded { cache, .. } = self {
            let batches: Vec<&Batch> = parts.iter().filter_map(|k| cache.get(k)).collect();
            out.reserve_for(&batches);
        }
    }

    /// Append training examples `first..first + n` to `out` (a preloaded batch
    /// without a copy of its own).
    pub fn batch_into(&self, first: u64, n: usize, out: &mut Batch) -> Result<()> {
        if let Source::Preloaded { cache, .. } = self {
            if let Some(b) = cache.get(&(first, n)) {
                out.append(b);
                return Ok(());
            }
        }
        out.append(&self.batch(first, n)?);
        Ok(())
    }

    /// Training examples `first..first + n` (indices among the training examples).
    pub fn batch(&self, first: u64, n: usize) -> Result<Batch> {
        match self {
            Source::Preloaded { inner, cache } => match cache.get(&(first, n)) {
                Some(b) => Ok(b.clone()),
                None => inner.batch(first, n),
            },
            Source::Generated(g) => Ok(g.batch(first, n)),
            Source::Log { log, eval, .. } => {
                // Training indices skip the held-out range.
                let (a, z) = (first, first + n as u64);
                if z <= eval.start || eval.is_empty() {
                    log.read(a, n)
                } else if a >= eval.start {
                    log.read(a + (eval.end - eval.start), n)
                } else {
                    let k = (eval.start - a) as usize;
                    let mut b = log.read(a, k)?;
                    b.append(&log.read(eval.end, n - k)?);
                    Ok(b)
                }
            }
        }
    }

    /// Held-out examples `first..first + n` (indices among the held-out examples).
    pub fn eval_batch(&self, first: u64, n: usize) -> Result<Batch> {
        match self {
            Source::Preloaded { inner, .. } => inner.eval_batch(first, n),
            Source::Generated(g) => Ok(g.batch(EVAL_BASE + first, n)),
            Source::Log { log, eval, .. } => log.read(eval.start + first, n),
        }
    }

    /// Examples available for training (`None`: unlimited).
    pub fn train_examples(&self) -> Option<u64> {
        match self {
            Source::Preloaded { inner, .. } => inner.train_examples(),
            Source::Generated(_) => None,
            Source::Log { log, eval, .. } => Some(log.examples() - (eval.end - eval.start)),
        }
    }

    /// Per table: whether its examples carry per-id weights (a weighted click log).
    pub fn weighted(&self) -> Vec<bool> {
        match self {
            Source::Preloaded { inner, .. } => inner.weighted(),
            Source::Generated(_) => Vec::new(),
            Source::Log { log, .. } => log.weighted().to_vec(),
        }
    }

    /// Held-out examples available (`None`: unlimited).
    pub fn eval_examples(&self) -> Option<u64> {
        match self {
            Source::Preloaded { inner, .. } => inner.eval_examples(),
            Source::Generated(_) => None,
            Source::Log { eval, .. } => Some(eval.end - eval.start),
        }
    }

    /// Where the examples come from, for an error about them: the click log's path
    /// (not [`Source::identity`], which names the texts the log was prepared from).
    pub fn describe(&self) -> String {
        match self {
            Source::Preloaded { inner, .. } => inner.describe(),
            Source::Generated(_) => "the generated examples".to_string(),
            Source::Log { log, .. } => crate::error::short_path(log.path()),
        }
    }

    /// What identifies the examples (for checkpoints).
    pub fn identity(&self) -> String {
        match self {
            Source::Preloaded { inner, .. } => inner.identity(),
            // A linear generator's identity predates the planted models (old
            // checkpoints keep their hash).
            Source::Generated(g) => match g.planted() {
                super::gen::Planted::Linear => "generated".to_string(),
                p => format!("generated, planted {}", p.describe(0)),
            },
            Source::Log {
                log,
                eval,
                eval_day,
            } => {
                let mut s = format!(
                    "log seed {} examples {} eval {}",
                    log.seed(),
                    log.examples(),
                    eval.end - eval.start
                );
                if let Some(d) = eval_day {
                    s.push_str(&format!(" eval-day {d}"));
                }
                if log.keyed() {
                    // The file names as a JSON array (explicit, not a `Debug` format).
                    let files = serde_json::Value::from(log.source_files().to_vec());
                    s.push_str(&format!(" files {files}"));
                }
                s
            }
        }
    }
}
