//! `torusrec inspect`: sizes, degree statistics and split of a prepared dataset, after
//! validating it against the layout.

use super::group;
use crate::comm::Comm;
use crate::data::dataset::Dataset;
use crate::data::graph::LocalRows;
use crate::error::Result;
use std::path::Path;

/// Degree summary of the rows of a CSR.
#[derive(Debug, Clone, PartialEq)]
pub struct DegreeStats {
    pub nonempty: u64,
    pub min: u64,
    pub median: u64,
    pub mean: f64,
    pub p99: u64,
    pub max: u64,
}

impl DegreeStats {
    /// Over the non-empty rows of `csr` (all zero if there are none).
    pub fn of(csr: &LocalRows) -> Self {
        let mut d: Vec<u64> = csr
            .indptr
            .windows(2)
            .map(|w| w[1] - w[0])
            .filter(|&x| x > 0)
            .collect();
        if d.is_empty() {
            return Self {
                nonempty: 0,
                min: 0,
                median: 0,
                mean: 0.0,
                p99: 0,
                max: 0,
            };
        }
        d.sort_unstable();
        let n = d.len();
        Self {
            nonempty: n as u64,
            min: d[0],
            median: d[n / 2],
            mean: d.iter().sum::<u64>() as f64 / n as f64,
            p99: d[((n as f64 * 0.99) as usize).min(n - 1)],
            max: d[n - 1],
        }
    }

    fn line(&self, what: &str) -> String {
        format!(
            "{what}: {} non-empty; min {}, median {}, mean {:.1}, p99 {}, max {}",
            group(self.nonempty),
            self.min,
            self.median,
            self.mean,
            self.p99,
            self.max
        )
    }
}

/// Collective: every rank must call. Rank 0 reads, validates and prints; the result
/// (valid or the first violation) is agreed on every rank.
pub fn global_run<C: Comm>(comm: &C, path: &Path) -> Result<()> {
    let local = if comm.rank() == 0 {
        Dataset::read(path).map(|d| report(path, &d))
    } else {
        Ok(Vec::new())
    };
    let lines = comm.agree(local)?;
    for l in lines {
        println!("{l}");
    }
    Ok(())
}

/// The human-readable report of a valid dataset.
pub fn report(path: &Path, d: &Dataset) -> Vec<String> {
    let m = &d.meta;
    vec![
        format!("{}: torusrec dataset v1, valid", path.display()),
        format!(
            "source: {} ({} nodes, {} arcs)",
            m.source,
            group(m.source_nodes),
            group(m.source_arcs)
        ),
        format!(
            "variant: K = {}, seed {}: {} nodes, {} arcs",
            m.min_links,
            m.seed,
            group(m.num_rows),
            group(d.num_arcs())
        ),
        format!(
            "train: {} arcs; test: {} rows, {} visible + {} held-out arcs",
            group(d.train.num_arcs()),
            group(d.test_rows.len() as u64),
            group(d.fold.num_arcs()),
            group(d.holdout.num_arcs())
        ),
        DegreeStats::of(&d.train).line("train out-degree"),
        DegreeStats::of(&d.train_t).line("train in-degree"),
    ]
}
