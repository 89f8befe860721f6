//! `torusrec prepare clicks` (text click logs -> keyed click log) and `torusrec
//! generate clicks --format criteo` (Criteo-format day files, or their keyed log):
//! flags validated on every rank, then the library's collective writer
//! (`crate::data::clicks::ingest`); rank 0 prints the summary.

use std::path::{Path, PathBuf};
use std::time::Instant;

use super::group;
use crate::cli::{ClicksFormat, GenerateClicksArgs, HeaderArg, PrepareClicksArgs};
use crate::comm::Comm;
use crate::data::clicks::columns::{header_names, ColumnLayout, Dialect};
use crate::data::clicks::criteo::Layout;
use crate::data::clicks::criteo_gen::{CriteoGen, GenSource, MAX_DAYS, MAX_PER_DAY};
use crate::data::clicks::ingest::{global_write_log, IngestReport, LogHeader};
use crate::data::clicks::textlog::{first_line, LineFormat, TextFiles};
use crate::error::{Error, Result};
use crate::io::outfile::{check_apart, check_output, check_temp};
use crate::metrics::{human_bytes, peak_rss_bytes};

/// Bad lines printed with their file, line and reason.
const SHOW_BAD: usize = 5;
/// `--dim` when not given.
const DEFAULT_DIM: usize = 16;

/// A validated `prepare clicks`.
#[derive(Clone, Debug)]
pub struct PrepareClicksConfig {
    pub inputs: Vec<PathBuf>,
    pub layout: LineFormat,
    pub format: &'static str,
    pub out: PathBuf,
    pub skip_bad_lines: u64,
    pub dim: usize,
}

impl PrepareClicksConfig {
    /// Rank-local and identical on every rank.
    pub fn from_args(a: &PrepareClicksArgs) -> Result<Self> {
        let (layout, format) = line_format(a)?;
        check_dim(a.dim)?;
        check_output(&a.out, a.force)?;
        let inputs: Vec<(&str, &Path)> = a.input.iter().map(|p| ("--input", p.as_path())).collect();
        check_apart(&a.out, &inputs)?;
        Ok(Self {
            inputs: a.input.clone(),
            layout,
            format,
            out: a.out.clone(),
            skip_bad_lines: a.skip_bad_lines,
            dim: a.dim,
        })
    }
}

fn check_dim(dim: usize) -> Result<()> {
    let max = crate::spec::MAX_DIM;
    if (1..=max).contains(&dim) {
        Ok(())
    } else {
        Err(Error::Config(format!(
            "--dim must be in 1..={max}, got {dim}"
        )))
    }
}

/// The parser of `prepare clicks --format --columns --header` (reads each input's
/// first line when a header may be there; rank-local and identical on every rank).
fn line_format(a: &PrepareClicksArgs) -> Result<(LineFormat, &'static str)> {
    let dialect = match (a.format, &a.columns) {
        (ClicksFormat::Criteo, None) => {
            if a.header.is_some_and(|h| h != HeaderArg::No) {
                return Err(Error::Config(
                    "--header applies only to --format csv|tsv (Criteo files have none)".into(),
                ));
            }
            return Ok((Layout::criteo().into(), "criteo"));
        }
        (ClicksFormat::Criteo, Some(_)) => {
            return Err(Error::Config(
                "--columns applies only to --format tsv and csv (criteo has its own)".into(),
            ))
        }
        (ClicksFormat::Tsv | ClicksFormat::Csv, None) => {
            return Err(Error::Config(
                "--format csv|tsv needs --columns (e.g. label,log*13,hex*26)".into(),
            ))
        }
        (ClicksFormat::Tsv, Some(_)) => Dialect::Tsv,
        (ClicksFormat::Csv, Some(_)) => Dialect::Csv,
    };
    let spec = a.columns.as_deref().unwrap_or_default();
    let bad = |e: String| Error::Config(format!("--columns: {e}"));
    let named = !spec.trim().is_empty()
        && spec
            .split(',')
            .all(|e| e.split_once('=').is_some_and(|(n, _)| !n.contains(':')));
    let first = match a.input.first() {
        Some(p) => first_line(p)?,
        None => None,
    };
    let header = match a.header.unwrap_or(HeaderArg::Auto) {
        HeaderArg::Yes => true,
        HeaderArg::No => false,
        HeaderArg::Auto => {
            named
                || first
                    .as_deref()
                    .is_some_and(|l| !ColumnLayout::label_is_valid(spec, l, dialect))
        }
    };
    // A tsv SPEC of the old grammar (label, dense, cat, skip) without a header keeps
    // its meaning and the fast parser.
    if dialect == Dialect::Tsv && !header {
        if let Ok(l) = Layout::parse(spec) {
            return Ok((l.into(), "tsv"));
        }
    }
    let names = if header {
        let (Some(p0), Some(l0)) = (a.input.first(), first.as_deref()) else {
            return Err(Error::input(
                a.input.first().map_or(Path::new("-"), |p| p.as_path()),
                "empty file: no header row",
            ));
        };
        for p in &a.input[1..] {
            if first_line(p)?.as_deref() != Some(l0) {
                return Err(Error::input(
                    p,
                    format!(
                        "line 1: not the header of {} (every file must start with the same header)",
                        p0.display()
                    ),
                ));
            }
        }
        Some(header_names(l0, dialect).map_err(|e| Error::input(p0, format!("line 1: {e}")))?)
    } else {
        None
    };
    let cols = ColumnLayout::new(spec, names.as_deref(), dialect).map_err(bad)?;
    Ok((LineFormat::Columns(cols), dialect.name()))
}

/// `generate clicks` without `--format criteo` takes none of its flags.
pub fn check_log_args(a: &GenerateClicksArgs) -> Result<()> {
    if a.days.is_some() || a.gzip || a.dim.is_some() {
        return Err(Error::Config(
            "--days, --gzip and --dim apply only to generate clicks --format criteo".into(),
        ));
    }
    Ok(())
}

/// Collective: every rank must call. `prepare clicks`: reads every input (each rank
/// its share), writes the keyed click log, and rank 0 prints what was done.
pub fn global_prepare_clicks<C: Comm>(comm: &C, a: &PrepareClicksArgs) -> Result<IngestReport> {
    let t0 = Instant::now();
    let cfg = comm.agree(PrepareClicksConfig::from_args(a))?;
    let src = comm.agree(TextFiles::new(
        &cfg.inputs,
        cfg.layout.clone(),
        comm.rank(),
        comm.size(),
    ))?;
    let header = LogHeader {
        format: cfg.format.into(),
        columns: match &cfg.layout {
            LineFormat::Fixed(l) => (cfg.format == "tsv").then(|| l.spec()),
            LineFormat::Columns(c) => Some(c.spec().to_string()),
        },
        source: cfg
            .inputs
            .iter()
            .map(|p| p.to_string_lossy().into_owned())
            .collect(),
        seed: 0,
        dim: cfg.dim,
        table_names: match &cfg.layout {
            LineFormat::Fixed(l) => l.table_names(),
            LineFormat::Columns(c) => c.table_names(),
        },
    };
    let rep = global_write_log(comm, &src, &header, &cfg.out, cfg.skip_bad_lines)?;
    let peak = comm.all_reduce_max(peak_rss_bytes().unwrap_or(0));
    if comm.rank() == 0 {
        print_skipped(&rep);
        let s = t0.elapsed().as_secs_f64();
        let mbs = rep.bytes as f64 / 1e6 / s.max(1e-9);
        println!(
            "prepare clicks: examples {}, days {}, bytes {} ({}), seconds {s:.2}, mb_per_s {mbs:.1}, mb_per_s_per_rank {:.1} ({} rank(s); count {:.2} s, write {:.2} s on rank 0), skipped {}, positive rate {:.4}, peak_rss_bytes {peak} ({}, max over ranks) -> {}",
            group(rep.examples),
            rep.day_offsets.len() - 1,
            rep.bytes,
            human_bytes(rep.bytes),
            mbs / comm.size() as f64,
            comm.size(),
            rep.pass_seconds[0],
            rep.pass_seconds[1],
            rep.bad_lines,
            rep.positive_rate,
            human_bytes(peak),
            cfg.out.display()
        );
    }
    Ok(rep)
}

fn print_skipped(rep: &IngestReport) {
    if rep.bad_lines == 0 {
        return;
    }
    println!(
        "skipped {} bad line{}{}:",
        rep.bad_lines,
        if rep.bad_lines == 1 { "" } else { "s" },
        if rep.bad_lines as usize > SHOW_BAD {
            format!(" (the first {SHOW_BAD})")
        } else {
            String::new()
        }
    );
    for b in rep.first_bad.iter().take(SHOW_BAD) {
        println!(
            "  {}:{}: {}",
            crate::error::short_path(&b.path),
            b.line,
            b.reason
        );
    }
}

/// A validated `generate clicks --format criteo`.
struct GenerateConfig {
    gen: CriteoGen,
    days: u64,
    per_day: u64,
    /// The keyed log, or the directory of day files.
    out: PathBuf,
    log: bool,
    gzip: bool,
    force: bool,
    dim: usize,
}

impl GenerateConfig {
    fn from_args(a: &GenerateClicksArgs) -> Result<Self> {
        let spec = super::embed::model::resolve_model(&a.model)?;
        if a.planted != crate::data::clicks::gen::Planted::Linear {
            return Err(Error::Config(
                "--planted applies to --format log; Criteo-format text has its own model".into(),
            ));
        }
        let days = a.days.unwrap_or(1);
        if !(1..=MAX_DAYS).contains(&days) {
            return Err(Error::Config(format!(
                "--days must be in 1..={MAX_DAYS}, got {days}"
            )));
        }
        if !(1..MAX_PER_DAY).contains(&a.examples) {
            return Err(Error::Config(format!(
                "--examples (per day) must be in 1..{MAX_PER_DAY}, got {}",
                a.examples
            )));
        }
        let log = a.out.extension().is_some_and(|e| e == "h5");
        if log && a.gzip {
            return Err(Error::Config(
                "--gzip applies to day files, not to an .h5 --out".into(),
            ));
        }
        if !log && a.dim.is_some() {
            return Err(Error::Config(
                "--dim applies to an .h5 --out (the log's model), not to day files".into(),
            ));
        }
        let dim = a.dim.unwrap_or(DEFAULT_DIM);
        check_dim(dim)?;
        let tables: Vec<(&str, &Path)> = a
            .model
            .tables
            .iter()
            .map(|t| ("--tables", t.as_path()))
            .collect();
        if log {
            check_output(&a.out, a.force)?;
            check_apart(&a.out, &tables)?;
        } else {
            if a.out.exists() && !a.out.is_dir() {
                return Err(Error::input(&a.out, "exists and is not a directory"));
            }
            for d in 0..days {
                let p = day_file(&a.out, d, a.gzip);
                if p.exists() && !a.force {
                    return Err(Error::OutputExists(p));
                }
                check_temp(&p)?;
                check_apart(&p, &tables)?;
            }
        }
        Ok(GenerateConfig {
            gen: CriteoGen::new(&spec, a.seed),
            days,
            per_day: a.examples,
            out: a.out.clone(),
            log,
            gzip: a.gzip,
            force: a.force,
            dim,
        })
    }
}

/// `DIR/day_D.tsv` (`.tsv.gz` with gzip).
pub fn day_file(dir: &Path, d: u64, gzip: bool) -> PathBuf {
    dir.join(format!("day_{d}.tsv{}", if gzip { ".gz" } else { "" }))
}

/// Collective: every rank must call. `generate clicks --format criteo`: the day files
/// (day `d` written by rank `d mod P`, in parallel inside), or the keyed log of them.
pub fn global_generate_criteo<C: Comm>(comm: &C, a: &GenerateClicksArgs) -> Result<()> {
    let t0 = Instant::now();
    let cfg = comm.agree(GenerateConfig::from_args(a))?;
    let (me, p) = (comm.rank(), comm.size());
    if cfg.log {
        let names: Vec<PathBuf> = (0..cfg.days)
            .map(|d| day_file(Path::new(""), d, false))
            .collect();
        let header = LogHeader {
            format: "criteo".into(),
            columns: None,
            source: names
                .iter()
                .map(|n| n.to_string_lossy().into_owned())
                .collect(),
            seed: cfg.gen.seed(),
            dim: cfg.dim,
            table_names: Layout::criteo().table_names(),
        };
        let src = GenSource::new(cfg.gen.clone(), names, cfg.per_day, me, p);
        let rep = global_write_log(comm, &src, &header, &cfg.out, 0)?;
        if me == 0 {
            println!(
                "generate clicks: {} examples over {} days, positive rate {:.4}, {} keys, {:.1} s -> {}",
                group(rep.examples),
                cfg.days,
                rep.positive_rate,
                group(rep.ids_per_table.iter().sum()),
                t0.elapsed().as_secs_f64(),
                cfg.out.display()
            );
        }
        return Ok(());
    }
    let made = if me == 0 {
        std::fs::create_dir_all(&cfg.out).map_err(|e| Error::io(&cfg.out, e))
    } else {
        Ok(())
    };
    comm.agree(made)?;
    let written = (|| -> Result<u64> {
        let mut bytes = 0;
        for d in (me as u64..cfg.days).step_by(p) {
            let path = day_file(&cfg.out, d, cfg.gzip);
            if path.exists() && !cfg.force {
                return Err(Error::OutputExists(path));
            }
            bytes += cfg.gen.write_day(d, cfg.per_day, &path, cfg.gzip)?;
        }
        Ok(bytes)
    })();
    let mut bytes = [comm.agree(written)?];
    comm.all_reduce_sum(&mut bytes);
    if me == 0 {
        let s = t0.elapsed().as_secs_f64();
        println!(
            "generate clicks: {} days x {} examples, {} ({}) in {s:.1} s, {:.1} MB/s -> {}",
            cfg.days,
            group(cfg.per_day),
            human_bytes(bytes[0]),
            if cfg.gzip { "gzip" } else { "text" },
            bytes[0] as f64 / 1e6 / s.max(1e-9),
            day_file(&cfg.out, 0, cfg.gzip).display()
        );
    }
    Ok(())
}
