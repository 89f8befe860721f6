//! `torusrec prepare` and `torusrec generate webgraph`: input graph -> variant filter
//! -> split -> prepared HDF5 dataset.

use super::group;
use crate::cli::{GenerateWebgraphArgs, InputFormat, PrepareArgs};
use crate::comm::Comm;
use crate::data::dataset::{check_output, global_write_dataset};
use crate::data::graph::{block_range, LocalRows};
use crate::data::prepare::{global_prepare, SplitMeta};
use crate::data::readers::{read_bv, read_mtx, read_tsv, SourceInfo};
use crate::data::webgraph_gen::{generate_rows, HostLayout, WebGraphSpec};
use crate::error::{Error, Result};
use crate::metrics::{human_bytes, peak_rss_bytes};
use std::path::PathBuf;
use std::time::Instant;

/// Where the graph comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum Source {
    File {
        path: PathBuf,
        format: InputFormat,
    },
    Synthetic {
        preset: String,
        scale: f64,
        spec: WebGraphSpec,
    },
}

/// A validated `prepare` / `generate webgraph` configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct PrepareConfig {
    pub source: Source,
    pub min_links: u64,
    pub seed: u64,
    pub out: PathBuf,
    pub force: bool,
}

fn synthetic(preset: &str, scale: f64) -> Result<Source> {
    if !(scale > 0.0 && scale.is_finite()) {
        return Err(Error::Config(format!(
            "--scale {scale}: must be a positive number"
        )));
    }
    let spec = WebGraphSpec::from_preset(preset, scale).map_err(Error::Config)?;
    Ok(Source::Synthetic {
        preset: preset.to_string(),
        scale,
        spec,
    })
}

impl PrepareConfig {
    /// Validate `prepare` flags (rank-local; the caller agrees on the result).
    pub fn from_prepare_args(a: &PrepareArgs) -> Result<Self> {
        let source = match a.format {
            InputFormat::Synthetic => synthetic(&a.input.to_string_lossy(), a.scale)?,
            format => {
                if a.scale != 1.0 {
                    return Err(Error::Config(
                        "--scale applies only to --format synthetic".into(),
                    ));
                }
                Source::File {
                    path: a.input.clone(),
                    format,
                }
            }
        };
        let default_k = if matches!(source, Source::Synthetic { .. }) {
            0
        } else {
            1
        };
        check_output(&a.out, a.force)?;
        Ok(Self {
            source,
            min_links: a.min_links.unwrap_or(default_k),
            seed: a.seed,
            out: a.out.clone(),
            force: a.force,
        })
    }

    /// Validate `generate webgraph` flags.
    pub fn from_generate_args(a: &GenerateWebgraphArgs) -> Result<Self> {
        let source = synthetic(&a.preset, a.scale)?;
        check_output(&a.out, a.force)?;
        Ok(Self {
            source,
            min_links: a.min_links,
            seed: a.seed,
            out: a.out.clone(),
            force: a.force,
        })
    }
}

/// What a run produced, for people and tests.
#[derive(Debug, Clone, PartialEq)]
pub struct PrepareReport {
    pub meta: SplitMeta,
    pub kept_arcs: u64,
    pub train_arcs: u64,
    pub test_rows: u64,
    pub fold_arcs: u64,
    pub holdout_arcs: u64,
    pub seconds: f64,
}

/// Collective: every rank must call. Reads (or generates) this rank's block of the
/// graph, applies the protocol and writes the dataset. Rank 0 prints a summary.
pub fn global_run<C: Comm>(comm: &C, cfg: &PrepareConfig) -> Result<PrepareReport> {
    let t0 = Instant::now();
    let (rank, size) = (comm.rank(), comm.size());
    let (info, rows) = match &cfg.source {
        Source::File { path, format } => {
            let read = match format {
                InputFormat::Bv => read_bv(path, rank, size),
                InputFormat::Tsv => read_tsv(path, rank, size),
                InputFormat::Mtx => read_mtx(path, rank, size),
                InputFormat::Synthetic => unreachable!("synthetic sources are Source::Synthetic"),
            };
            comm.agree(read)?
        }
        Source::Synthetic {
            preset,
            scale,
            spec,
        } => global_generate(comm, preset, *scale, spec, cfg.seed)?,
    };
    let t_read = t0.elapsed().as_secs_f64();
    if rank == 0 {
        log::info!(
            "read {} ({} nodes, {} arcs) in {t_read:.2} s",
            info.name,
            group(info.nodes),
            group(info.arcs)
        );
    }

    let t1 = Instant::now();
    let (meta, part) = global_prepare(comm, &info, rows, cfg.min_links, cfg.seed)?;
    let t_split = t1.elapsed().as_secs_f64();
    let mut counts = [
        part.train.num_arcs(),
        part.test_rows.len() as u64,
        part.fold.num_arcs(),
        part.holdout.num_arcs(),
    ];
    comm.all_reduce_sum(&mut counts);

    let t2 = Instant::now();
    global_write_dataset(comm, &cfg.out, &meta, &part)?;
    drop(part);
    let t_write = t2.elapsed().as_secs_f64();
    let peak = comm.all_reduce_max(peak_rss_bytes().unwrap_or(0));
    let [train_arcs, test_rows, fold_arcs, holdout_arcs] = counts;
    let report = PrepareReport {
        kept_arcs: train_arcs + fold_arcs + holdout_arcs,
        meta,
        train_arcs,
        test_rows,
        fold_arcs,
        holdout_arcs,
        seconds: t0.elapsed().as_secs_f64(),
    };
    if rank == 0 {
        let m = &report.meta;
        println!(
            "{}: {} nodes, {} arcs -> K = {}: {} nodes, {} arcs",
            m.source,
            group(m.source_nodes),
            group(m.source_arcs),
            m.min_links,
            group(m.num_rows),
            group(report.kept_arcs)
        );
        println!(
            "split (seed {}): {} test rows ({} visible + {} held-out arcs), {} training arcs",
            m.seed,
            group(test_rows),
            group(fold_arcs),
            group(holdout_arcs),
            group(train_arcs)
        );
        println!(
            "wrote {} in {:.2} s (read {t_read:.2} s, filter+split {t_split:.2} s, write {t_write:.2} s) on {size} rank(s), peak RSS {} per rank",
            cfg.out.display(),
            report.seconds,
            human_bytes(peak)
        );
    }
    Ok(report)
}

/// Collective: every rank must call. Generates this rank's block of a synthetic web
/// graph (rows depend only on the seed and the node id).
fn global_generate<C: Comm>(
    comm: &C,
    preset: &str,
    scale: f64,
    spec: &WebGraphSpec,
    seed: u64,
) -> Result<(SourceInfo, LocalRows)> {
    let layout = HostLayout::new(spec, seed);
    let (lo, hi) = block_range(spec.nodes, comm.size(), comm.rank());
    let (indptr, targets) = generate_rows(spec, &layout, seed, lo, hi);
    let rows = LocalRows {
        lo,
        indptr,
        targets,
    };
    let mut arcs = [rows.num_arcs()];
    comm.all_reduce_sum(&mut arcs);
    let info = SourceInfo {
        name: format!("synthetic:webgraph:{preset}:scale={scale}:seed={seed}"),
        nodes: spec.nodes,
        arcs: arcs[0],
    };
    Ok((info, rows))
}
