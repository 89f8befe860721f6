//! `torusrec inspect`: sizes, degree statistics and split of a prepared dataset, after
//! validating it against the layout; and `inspect --stats G`, the structural
//! statistics of any graph input (docs/inspect.md#graph-statistics), computed by
//! [`crate::data::graph::stats_pass`].

use super::group;
use crate::comm::Comm;
use crate::data::graph::dataset::Dataset;
use crate::data::graph::rows::LocalRows;
use crate::data::graph::stats::{DegreeSummary, GraphStats, GAP_BITS};
use crate::data::graph::stats_pass::{
    global_graph_profile_with, resolve_format, GraphFormat, StatsOpts, StatsRun,
};
use crate::error::{Error, Result};
use std::path::Path;

impl From<crate::cli::GraphFormat> for GraphFormat {
    fn from(f: crate::cli::GraphFormat) -> Self {
        use crate::cli::GraphFormat as C;
        match f {
            C::Bv => GraphFormat::Bv,
            C::Tsv => GraphFormat::Tsv,
            C::Mtx => GraphFormat::Mtx,
            C::H5 => GraphFormat::H5,
        }
    }
}

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

/// Collective: every rank must call. `inspect PATH` or `inspect --stats G`.
pub fn global_command<C: Comm>(comm: &C, args: &crate::cli::InspectArgs) -> Result<()> {
    match (&args.path, &args.stats) {
        (Some(p), None) => global_run(comm, p).map(|_| ()),
        (None, Some(g)) => {
            let format = args.format.map(GraphFormat::from);
            global_stats(comm, g, format, args.json).map(|_| ())
        }
        _ => Err(Error::Config(
            "inspect: give a prepared dataset PATH, or --stats G (not both)".into(),
        )),
    }
}

/// Collective: every rank must call. `inspect --stats G`: the statistics of the graph
/// `path` (stored as `format`, else as [`resolve_format`] guesses), printed by rank 0
/// as a table, or with `json` as one JSON object of [`GraphStats`] (nothing else on
/// stdout). Returns the lines printed (on every rank). Buffer sizes:
/// [`StatsOpts::from_env`].
pub fn global_stats<C: Comm>(
    comm: &C,
    path: &Path,
    format: Option<GraphFormat>,
    json: bool,
) -> Result<Vec<String>> {
    let format = comm.agree(resolve_format(path, format))?;
    let opts = comm.agree(StatsOpts::from_env())?;
    if comm.rank() == 0 {
        log::info!(
            "inspect --stats {} as {} on {} rank(s): chunks of {} arcs, {} of reciprocity keys per pass",
            path.display(),
            format.name(),
            comm.size(),
            group(opts.chunk_arcs as u64),
            crate::metrics::human_bytes(opts.key_budget_bytes)
        );
    }
    let t0 = std::time::Instant::now();
    let run = global_graph_profile_with(comm, path, format, &opts)?;
    let seconds = t0.elapsed().as_secs_f64();
    let lines = if json {
        let s = serde_json::to_string(&run.profile.stats)
            .map_err(|e| Error::Check(format!("statistics as JSON: {e}")))?;
        vec![s]
    } else {
        stats_table(path, format, &run, seconds, comm.size())
    };
    if comm.rank() == 0 {
        for l in &lines {
            println!("{l}");
        }
    }
    Ok(lines)
}

/// A fraction with 4 significant digits (`0` as `0`).
fn frac(x: f64) -> String {
    if x == 0.0 {
        "0".into()
    } else if x >= 0.001 {
        format!("{x:.4}")
    } else {
        format!("{x:.3e}")
    }
}

/// The readable report of `inspect --stats` (rank 0's seconds, on `ranks` ranks).
pub fn stats_table(
    path: &Path,
    format: GraphFormat,
    run: &StatsRun,
    seconds: f64,
    ranks: usize,
) -> Vec<String> {
    let s: &GraphStats = &run.profile.stats;
    let (o, i) = (&s.out_degree, &s.in_degree);
    let row = |name: &str, f: &dyn Fn(&DegreeSummary) -> String| {
        format!("  {name:<16}{:>16}{:>16}", f(o), f(i))
    };
    let q = |k: usize| move |d: &DegreeSummary| group(d.quantiles[k]);
    let mut lines = vec![
        format!(
            "{} ({}): {} nodes, {} arcs (clean: sorted, distinct, no self-loops)",
            path.display(),
            format.name(),
            group(s.nodes),
            group(s.arcs)
        ),
        format!("  {:<16}{:>16}{:>16}", "", "out-degree", "in-degree"),
        row("mean", &|d| format!("{:.3}", d.mean)),
        row("max", &|d| group(d.max)),
        row("zero fraction", &|d| frac(d.zero_fraction)),
        row("q50", &q(0)),
        row("q90", &q(1)),
        row("q99", &q(2)),
        row("q99.9", &q(3)),
        row("tail exponent", &|d| format!("{:.3}", d.tail_exponent)),
        row("  its x_min", &|d| group(d.tail_min)),
    ];
    let gaps: Vec<String> = GAP_BITS
        .iter()
        .zip(&s.gap_below)
        .map(|(&b, &f)| format!("< {} {}", group(1u64 << b), frac(f)))
        .collect();
    lines.push(format!("locality: arcs with |v - u| {}", gaps.join(", ")));
    lines.push(format!(
        "reciprocity: {} (pair keys in {} pass(es){})",
        frac(s.reciprocity),
        run.key_passes,
        if run.reread {
            ", reading the input again"
        } else {
            ""
        }
    ));
    lines.push(format!(
        "adjacent Jaccard: {} (mean over node pairs u, u + 1 with both rows non-empty)",
        frac(s.adjacent_jaccard)
    ));
    lines.push(format!(
        "top-1 % in-degree share: {} (the {} nodes of largest in-degree)",
        frac(s.top1_in_share),
        group(s.nodes.div_ceil(100))
    ));
    lines.push(format!(
        "far-target share: {} (distinct targets of the arcs with gap >= 2^16, over those arcs)",
        frac(s.far_target_share)
    ));
    lines.push(format!(
        "sink in-link share: {} (arcs into nodes without out-links, over all arcs)",
        frac(s.sink_in_share)
    ));
    lines.push(format!(
        "far-source share: {} (distinct sources of the arcs with gap >= 2^16, over those arcs)",
        frac(s.far_source_share)
    ));
    let [a, b, c] = run.seconds;
    lines.push(format!(
        "seconds {seconds:.2} on {ranks} rank(s) (rank 0: rows {a:.2}, reciprocity {b:.2}, merge {c:.2})"
    ));
    lines
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
