//! `torusrec prepare` and `torusrec generate webgraph`: input graph -> variant filter
//! -> split -> prepared HDF5 dataset, streamed in chunks of rows
//! (`crate::data::graph::stream`): memory per rank is O(nodes) plus bounded buffers for the
//! generator and BV graphs; TSV and MTX edge lists are read whole first.

use super::group;
use crate::cli::{GenerateWebgraphArgs, InputFormat, PrepareArgs, WebgraphModel};
use crate::comm::Comm;
use crate::data::graph::prepare::SplitMeta;
use crate::data::graph::readers::{bv_info, read_mtx_pairs, read_tsv_pairs, SourceInfo};
use crate::data::graph::stats_pass::{global_graph_profile, resolve_format, GraphFormat};
use crate::data::graph::stream::budget::{check_memory, StreamOpts};
use crate::data::graph::stream::sources::{BvRows, CopyingRows, MemoryRows, SyntheticRows};
use crate::data::graph::stream::{
    global_prepare_stream, global_prepare_stream_mapped, IdMap, StreamReport,
};
use crate::data::graph::webgraph_copy::{cnr2000_params, CopyModel, CopyingParams};
use crate::data::graph::webgraph_fit::fit;
use crate::data::graph::webgraph_gen::WebGraphSpec;
use crate::error::{Error, Result};
use crate::io::outfile::{check_apart, check_output};
use crate::metrics::{human_bytes, peak_rss_bytes};
use std::path::{Path, PathBuf};
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
    /// The copying model with these parameters and sizes; `name` says where they
    /// came from (a preset, a fitted graph, a parameter file).
    Copying {
        name: String,
        params: Box<CopyingParams>,
        nodes: u64,
        arcs: u64,
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

fn check_scale(scale: f64) -> Result<()> {
    if !(scale > 0.0 && scale.is_finite()) {
        return Err(Error::Config(format!(
            "--scale {scale}: must be a positive number"
        )));
    }
    Ok(())
}

fn synthetic(preset: &str, scale: f64) -> Result<Source> {
    check_scale(scale)?;
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
        super::prepare_useritem::refuse_user_item_flags(a)?;
        let source = match a.format {
            InputFormat::Synthetic => synthetic(&a.input.to_string_lossy(), a.scale)?,
            InputFormat::Csv => {
                return Err(Error::Config(
                    "--format csv is for --matrix user-item (a graph is tsv, mtx or bv)".into(),
                ))
            }
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
        if let Source::File { path, .. } = &source {
            check_apart_from_graph(&a.out, "--input", path)?;
        }
        Ok(Self {
            source,
            min_links: a.min_links.unwrap_or(default_k),
            seed: a.seed,
            out: a.out.clone(),
            force: a.force,
        })
    }
}

/// Refuse an output (or its temporary) that is the graph `path` or, for a BV
/// basename, one of its files.
fn check_apart_from_graph(out: &Path, flag: &str, path: &Path) -> Result<()> {
    let files: Vec<PathBuf> = std::iter::once(path.to_path_buf())
        .chain([".graph", ".properties", ".offsets"].iter().map(|ext| {
            let mut s = path.as_os_str().to_owned();
            s.push(ext);
            PathBuf::from(s)
        }))
        .collect();
    let inputs: Vec<(&str, &Path)> = files.iter().map(|f| (flag, f.as_path())).collect();
    check_apart(out, &inputs)
}

/// Sizes the copying model can hold: 2..=u32::MAX nodes, at least one arc a node
/// on average, no more than `nodes x (nodes - 1)`.
fn check_copying_sizes(nodes: u64, arcs: u64) -> std::result::Result<(), String> {
    if !(2..=u32::MAX as u64).contains(&nodes) {
        return Err(format!("nodes must be in 2..={} (got {nodes})", u32::MAX));
    }
    if arcs < nodes || arcs > nodes.saturating_mul(nodes - 1) {
        return Err(format!(
            "{arcs} arcs on {nodes} nodes: need between one a node and nodes x (nodes - 1)"
        ));
    }
    Ok(())
}

/// Where `generate webgraph`'s shape and sizes come from, after rank-local checks.
#[derive(Debug, Clone, PartialEq)]
pub enum GenerateShape {
    /// `--model independent --preset P`: the old model, today's bits.
    Independent(Source),
    /// `--like G`: fit to G (collective), then G's sizes.
    Like { path: PathBuf, format: GraphFormat },
    /// Given parameters (a file, or cnr-2000's) and sizes.
    Given {
        name: String,
        params: Box<CopyingParams>,
        nodes: u64,
        arcs: u64,
    },
}

/// A validated `generate webgraph` configuration (rank-local; the caller agrees).
#[derive(Debug, Clone, PartialEq)]
pub struct GenerateConfig {
    pub shape: GenerateShape,
    pub params_out: Option<PathBuf>,
    pub min_links: u64,
    pub seed: u64,
    pub out: PathBuf,
    pub force: bool,
}

impl GenerateConfig {
    /// Validate `generate webgraph` flags (reads `--params`).
    pub fn from_args(a: &GenerateWebgraphArgs) -> Result<Self> {
        check_output(&a.out, a.force)?;
        if let Some(po) = &a.params_out {
            check_output(po, a.force)?;
            if po == &a.out {
                return Err(Error::Config(
                    "--params-out and --out name the same file".into(),
                ));
            }
        }
        for out in std::iter::once(&a.out).chain(&a.params_out) {
            if let Some(g) = &a.like {
                check_apart_from_graph(out, "--like", g)?;
            }
            if let Some(f) = &a.params {
                check_apart(out, &[("--params", f)])?;
            }
        }
        let sizes = match (&a.preset, a.nodes, a.arcs) {
            (Some(p), None, None) => {
                check_scale(a.scale)?;
                let spec = WebGraphSpec::from_preset(p, a.scale).map_err(Error::Config)?;
                Some((format!("{}:scale={}", p, a.scale), spec.nodes, spec.arcs))
            }
            (None, Some(n), Some(m)) => {
                if a.scale != 1.0 {
                    return Err(Error::Config("--scale applies only to --preset".into()));
                }
                Some((format!("nodes={n}:arcs={m}"), n, m))
            }
            _ => None,
        };
        let shape = match a.model {
            WebgraphModel::Independent => {
                if a.like.is_some() || a.params.is_some() || a.nodes.is_some() {
                    return Err(Error::Config(
                        "--model independent takes --preset [--scale] only (not --like, --params or --nodes)"
                            .into(),
                    ));
                }
                if a.params_out.is_some() {
                    return Err(Error::Config(
                        "--params-out writes the copying model's parameters; --model independent has none"
                            .into(),
                    ));
                }
                let preset = a.preset.as_deref().ok_or_else(|| {
                    Error::Config("generate webgraph --model independent: give --preset".into())
                })?;
                GenerateShape::Independent(synthetic(preset, a.scale)?)
            }
            WebgraphModel::Copying => match (&a.like, sizes) {
                (Some(g), _) => {
                    if a.scale != 1.0 {
                        return Err(Error::Config(
                            "--scale applies only to --preset (a --like twin has G's sizes)".into(),
                        ));
                    }
                    GenerateShape::Like {
                        path: g.clone(),
                        format: resolve_format(g, a.format.map(GraphFormat::from))?,
                    }
                }
                (None, Some((what, nodes, arcs))) => {
                    let (source, params) = match &a.params {
                        Some(f) => {
                            let text = crate::error::read_text(f)?;
                            let params = CopyingParams::parse(&text)
                                .map_err(|e| Error::input(f, format!("not copying-model parameters: {e}")))?;
                            (crate::error::short_path(f), params)
                        }
                        None => ("cnr-2000".to_string(), cnr2000_params()),
                    };
                    // Refuse sizes the model cannot hold now, naming them.
                    check_copying_sizes(nodes, arcs)
                        .map_err(|e| Error::Config(format!("generate webgraph {what}: {e}")))?;
                    GenerateShape::Given {
                        name: format!("synthetic:webgraph:copying:{what}:params={source}"),
                        params: Box::new(params),
                        nodes,
                        arcs,
                    }
                }
                (None, None) => {
                    return Err(Error::Config(
                        "generate webgraph: give --preset P [--scale F], --nodes N --arcs M, or --like G"
                            .into(),
                    ))
                }
            },
        };
        Ok(Self {
            shape,
            params_out: a.params_out.clone(),
            min_links: a.min_links,
            seed: a.seed,
            out: a.out.clone(),
            force: a.force,
        })
    }
}

/// Collective: every rank must call. `generate webgraph`: resolves the model (fitting
/// it to `--like`'s graph from its statistics: rank 0 fits, every rank gets the same
/// parameters), writes `--params-out`, then prepares the graph as `prepare` does.
pub fn global_generate<C: Comm>(comm: &C, cfg: &GenerateConfig) -> Result<PrepareReport> {
    let source = match &cfg.shape {
        GenerateShape::Independent(src) => src.clone(),
        GenerateShape::Given {
            name,
            params,
            nodes,
            arcs,
        } => Source::Copying {
            name: name.clone(),
            params: params.clone(),
            nodes: *nodes,
            arcs: *arcs,
        },
        GenerateShape::Like { path, format } => {
            let t0 = Instant::now();
            let profile = global_graph_profile(comm, path, *format)?;
            let name = crate::error::short_path(path);
            // The parameter file records the graph's own name, not where it lay.
            let base = path
                .file_name()
                .map_or_else(|| name.clone(), |f| f.to_string_lossy().into_owned());
            if comm.rank() == 0 {
                log::info!(
                    "statistics of {name}: {} nodes, {} arcs in {:.2} s; fitting the copying model",
                    group(profile.stats.nodes),
                    group(profile.stats.arcs),
                    t0.elapsed().as_secs_f64()
                );
            }
            let fitted = if comm.rank() == 0 {
                fit(&profile, &base, |r| {
                    log::debug!("fit round {}: loss {:.4}", r.round, r.loss)
                })
                .map_err(|e| Error::input(path, format!("cannot fit the copying model: {e}")))
                .map(|p| p.render(true).into_bytes())
            } else {
                Ok(Vec::new())
            };
            let mut bytes = comm.agree(fitted)?;
            comm.broadcast_vec(0, &mut bytes)?;
            let params = CopyingParams::parse(&String::from_utf8_lossy(&bytes))
                .map_err(|e| Error::Config(format!("fitted parameters: {e}")))?;
            if comm.rank() == 0 {
                log::info!("fitted to {name} in {:.1} s", t0.elapsed().as_secs_f64());
            }
            Source::Copying {
                name: format!("synthetic:webgraph:copying:like={name}"),
                params: Box::new(params),
                nodes: profile.stats.nodes,
                arcs: profile.stats.arcs,
            }
        }
    };
    if let (Some(po), Source::Copying { params, .. }) = (&cfg.params_out, &source) {
        let json = po
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("json"));
        let written = if comm.rank() == 0 {
            crate::io::outfile::write(po, params.render(json).as_bytes())
        } else {
            Ok(())
        };
        comm.agree(written)?;
        if comm.rank() == 0 {
            println!("wrote the model's parameters to {}", po.display());
        }
    }
    let pcfg = PrepareConfig {
        source,
        min_links: cfg.min_links,
        seed: cfg.seed,
        out: cfg.out.clone(),
        force: cfg.force,
    };
    global_run(comm, &pcfg)
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
    /// Rank 0's seconds per pass: degrees, filter, split+write, transpose (synthetic
    /// sources generate their rows in each of the first three).
    pub pass_seconds: [f64; 4],
    /// Peak resident set size, the maximum over ranks.
    pub peak_rss_bytes: u64,
}

/// Free bytes on the file system that holds `dir` (None if unknown).
fn free_bytes(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs writes only into `st`; `c` is a valid NUL-terminated path.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    Some((st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
}

/// Refuse (exit 2) an output that cannot fit on its file system: the dataset holds
/// every arc twice (`/train` and `/train_t`, u32) and a few u64 per node; the
/// temporary file is written next to `out`.
fn check_disk(out: &Path, nodes: u64, arcs: u64) -> Result<()> {
    let need = arcs
        .saturating_mul(8)
        .saturating_add(nodes.saturating_mul(24));
    let dir = match out.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    match free_bytes(dir) {
        Some(free) if need > free => Err(Error::input(
            out,
            format!(
                "{} nodes and {} arcs need an estimated {} of disk, more than the {} free in {}",
                group(nodes),
                group(arcs),
                human_bytes(need),
                human_bytes(free),
                dir.display()
            ),
        )),
        _ => Ok(()),
    }
}

/// Collective: every rank must call. Reads (or generates) this rank's block of the
/// graph, applies the protocol and writes the dataset with the streaming path
/// (`crate::data::graph::stream`). Rank 0 prints a summary.
pub fn global_run<C: Comm>(comm: &C, cfg: &PrepareConfig) -> Result<PrepareReport> {
    global_run_with(comm, cfg, &StreamOpts::default())
}

/// [`global_run`] with explicit buffer sizes (tests use small ones): the source's
/// streaming run (`global_stream_bv`, `global_stream_edge_list`,
/// `global_stream_synthetic` or `global_stream_copying`), then rank 0's summary
/// (`print_summary`).
pub fn global_run_with<C: Comm>(
    comm: &C,
    cfg: &PrepareConfig,
    opts: &StreamOpts,
) -> Result<PrepareReport> {
    let t0 = Instant::now();
    let (report, t_read) = match &cfg.source {
        Source::File {
            path,
            format: InputFormat::Bv,
        } => (global_stream_bv(comm, cfg, path, opts)?, 0.0),
        Source::File { path, format } => {
            global_stream_edge_list(comm, cfg, path, *format, opts, t0)?
        }
        Source::Synthetic {
            preset,
            scale,
            spec,
        } => (
            global_stream_synthetic(comm, cfg, preset, *scale, spec, opts)?,
            0.0,
        ),
        Source::Copying {
            name,
            params,
            nodes,
            arcs,
        } => (
            global_stream_copying(comm, cfg, name, params, (*nodes, *arcs), opts)?,
            0.0,
        ),
    };
    let peak = comm.all_reduce_max(peak_rss_bytes().unwrap_or(0));
    let report = PrepareReport {
        kept_arcs: report.train_arcs + report.fold_arcs + report.holdout_arcs,
        meta: report.meta,
        train_arcs: report.train_arcs,
        test_rows: report.test_rows,
        fold_arcs: report.fold_arcs,
        holdout_arcs: report.holdout_arcs,
        seconds: t0.elapsed().as_secs_f64(),
        pass_seconds: report.pass_seconds,
        peak_rss_bytes: peak,
    };
    if comm.rank() == 0 {
        print_summary(cfg, &report, t_read, comm.size());
    }
    Ok(report)
}

/// Collective: every rank must call. A BV graph: its rows stream from the file, every
/// pass decoding the stream again (the first one whole, checking it).
fn global_stream_bv<C: Comm>(
    comm: &C,
    cfg: &PrepareConfig,
    path: &Path,
    opts: &StreamOpts,
) -> Result<StreamReport> {
    let (rank, size) = (comm.rank(), comm.size());
    let info = comm.agree(bv_info(path))?;
    comm.agree(check_memory(
        &info.name,
        info.nodes,
        size,
        cfg.min_links,
        opts,
    ))?;
    comm.agree(check_disk(&cfg.out, info.nodes, info.arcs))?;
    let src = BvRows::new(path, &info, rank, size);
    global_prepare_stream(comm, &src, &info, cfg.min_links, cfg.seed, &cfg.out, opts)
}

/// Collective: every rank must call. An edge list (TSV or MTX): in arbitrary order it
/// has no rows until it is read whole, so the reader materializes the rank's block;
/// filter, split, transpose and writing stream from it. Returns the report and the
/// seconds since `t0` the read took.
fn global_stream_edge_list<C: Comm>(
    comm: &C,
    cfg: &PrepareConfig,
    path: &Path,
    format: InputFormat,
    opts: &StreamOpts,
    t0: Instant,
) -> Result<(StreamReport, f64)> {
    let (rank, size) = (comm.rank(), comm.size());
    let read = match format {
        InputFormat::Tsv => read_tsv_pairs(path),
        InputFormat::Mtx => read_mtx_pairs(path),
        InputFormat::Bv | InputFormat::Synthetic | InputFormat::Csv => {
            unreachable!("handled above / Source::Synthetic / refused")
        }
    };
    let mut edges = comm.agree(read)?;
    // With K >= 1 only ids that occur can be kept: renumber them densely so
    // that memory follows the arcs, not the largest id (same dataset). With
    // K = 0 every id up to the largest is a node: check that they fit.
    let source_nodes = edges.info.nodes;
    let ids = if cfg.min_links > 0 {
        edges
            .renumber_dense()
            .map(|ids| IdMap { ids, source_nodes })
    } else {
        None
    };
    let opts_ok = check_memory(
        &edges.info.name,
        edges.info.nodes,
        size,
        cfg.min_links,
        opts,
    );
    comm.agree(opts_ok)?;
    comm.agree(check_disk(&cfg.out, edges.info.nodes, edges.info.arcs))?;
    let (info, rows) = edges.into_block(rank, size);
    let t_read = t0.elapsed().as_secs_f64();
    if rank == 0 {
        log::info!(
            "read {} ({} nodes, {} arcs) in {t_read:.2} s",
            info.name,
            group(info.nodes),
            group(info.arcs)
        );
    }
    let src = MemoryRows(rows);
    let r = global_prepare_stream_mapped(
        comm,
        &src,
        &info,
        ids.as_ref(),
        cfg.min_links,
        cfg.seed,
        &cfg.out,
        opts,
    )?;
    Ok((r, t_read))
}

/// Collective: every rank must call. The independent web graph generator's preset
/// `preset` at `scale`, regenerated on each pass.
fn global_stream_synthetic<C: Comm>(
    comm: &C,
    cfg: &PrepareConfig,
    preset: &str,
    scale: f64,
    spec: &WebGraphSpec,
    opts: &StreamOpts,
) -> Result<StreamReport> {
    let (rank, size) = (comm.rank(), comm.size());
    let name = format!("synthetic:webgraph:{preset}:scale={scale}");
    comm.agree(check_memory(&name, spec.nodes, size, cfg.min_links, opts))?;
    comm.agree(check_disk(&cfg.out, spec.nodes, spec.arcs))?;
    let src = SyntheticRows::new(spec, cfg.seed, rank, size);
    let info = SourceInfo {
        name: format!(
            "synthetic:webgraph:{preset}:scale={scale}:seed={}",
            cfg.seed
        ),
        nodes: spec.nodes,
        arcs: 0, // counted by the first pass
    };
    global_prepare_stream(comm, &src, &info, cfg.min_links, cfg.seed, &cfg.out, opts)
}

/// Collective: every rank must call. The copying model `name` with `params` at
/// `(nodes, arcs)`, regenerated on each pass.
fn global_stream_copying<C: Comm>(
    comm: &C,
    cfg: &PrepareConfig,
    name: &str,
    params: &CopyingParams,
    (nodes, arcs): (u64, u64),
    opts: &StreamOpts,
) -> Result<StreamReport> {
    let (rank, size) = (comm.rank(), comm.size());
    comm.agree(check_memory(name, nodes, size, cfg.min_links, opts))?;
    comm.agree(check_disk(&cfg.out, nodes, arcs))?;
    let model = CopyModel::new(params, nodes, arcs, cfg.seed).map_err(Error::Config);
    let model = std::sync::Arc::new(comm.agree(model)?);
    let src = CopyingRows::new(model, rank, size);
    let info = SourceInfo {
        name: format!("{name}:seed={}", cfg.seed),
        nodes,
        arcs: 0, // counted by the first pass
    };
    global_prepare_stream(comm, &src, &info, cfg.min_links, cfg.seed, &cfg.out, opts)
}

/// Rank 0's summary of a prepare on `size` ranks (`t_read`: the edge list's read).
fn print_summary(cfg: &PrepareConfig, report: &PrepareReport, t_read: f64, size: usize) {
    let peak = report.peak_rss_bytes;
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
        group(report.test_rows),
        group(report.fold_arcs),
        group(report.holdout_arcs),
        group(report.train_arcs)
    );
    let [deg, filt, write, tr] = report.pass_seconds;
    println!(
        "wrote {} in {:.2} s (read {t_read:.2} s, degrees {deg:.2} s, filter {filt:.2} s, split+write {write:.2} s, transpose {tr:.2} s; rank 0) on {size} rank(s), peak RSS {} per rank",
        cfg.out.display(),
        report.seconds,
        human_bytes(peak)
    );
    println!(
        "prepare: seconds {:.2}, peak_rss_bytes {peak} (max over ranks)",
        report.seconds
    );
}
