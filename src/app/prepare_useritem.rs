//! `torusrec prepare --matrix user-item`: an interaction file -> renumbered users x
//! items matrix (duplicates summed) -> the minimum-interaction filter to a fixed point
//! -> a split (`strong`, `last` or `random`) -> a prepared dataset with weights
//! (`crate::data::useritem`). Every rank reads the whole file and computes the same
//! matrix; rank 0 writes the file.

use super::group;
use crate::cli::{HeaderArg, InputFormat, PrepareArgs, SplitArg};
use crate::comm::Comm;
use crate::data::useritem::filter::{build_matrix, min_count_filter, FilterReport};
use crate::data::useritem::parse::{parse_columns, read_interactions, Column, Header, TextFormat};
use crate::data::useritem::split::{split, SplitKind};
use crate::data::useritem::write::{global_write, Provenance};
use crate::error::{Error, Result};
use crate::io::outfile::check_output;
use crate::metrics::peak_rss_bytes;
use std::path::PathBuf;
use std::time::Instant;

/// A validated `prepare --matrix user-item`.
#[derive(Debug, Clone, PartialEq)]
pub struct UserItemConfig {
    pub input: PathBuf,
    pub format: TextFormat,
    pub columns: Option<Vec<Column>>,
    pub header: Header,
    pub min_user: u64,
    pub min_item: u64,
    pub split: SplitKind,
    pub seed: u64,
    pub out: PathBuf,
}

/// Refuse, for a graph, the flags that only a user-item matrix reads.
pub fn refuse_user_item_flags(a: &PrepareArgs) -> Result<()> {
    let set: Vec<&str> = [
        (a.columns.is_some(), "--columns"),
        (a.header != HeaderArg::Auto, "--header"),
        (a.min_user_interactions != 1, "--min-user-interactions"),
        (a.min_item_interactions != 1, "--min-item-interactions"),
        (a.split != SplitArg::Strong, "--split"),
    ]
    .into_iter()
    .filter_map(|(on, f)| on.then_some(f))
    .collect();
    if set.is_empty() {
        Ok(())
    } else {
        Err(Error::Config(format!(
            "{} appl{} only to --matrix user-item",
            set.join(", "),
            if set.len() == 1 { "ies" } else { "y" }
        )))
    }
}

impl UserItemConfig {
    /// Validate the flags (rank-local; the caller agrees on the result).
    pub fn from_args(a: &PrepareArgs) -> Result<Self> {
        let format = match a.format {
            InputFormat::Tsv => TextFormat::Tsv,
            InputFormat::Csv => TextFormat::Csv,
            InputFormat::Mtx => TextFormat::Mtx,
            f => {
                return Err(Error::Config(format!(
                    "--matrix user-item reads --format tsv, csv or mtx, not {f:?}"
                )))
            }
        };
        if a.min_links.is_some() {
            return Err(Error::Config(
                "--min-links is for graphs; a user-item matrix uses --min-user-interactions and --min-item-interactions".into(),
            ));
        }
        if a.scale != 1.0 {
            return Err(Error::Config(
                "--scale applies only to --format synthetic".into(),
            ));
        }
        let columns = a
            .columns
            .as_deref()
            .map(parse_columns)
            .transpose()
            .map_err(Error::Config)?;
        if format == TextFormat::Mtx && columns.is_some() {
            return Err(Error::Config(
                "--columns does not apply to --format mtx (user item [weight])".into(),
            ));
        }
        let has_time = columns.as_ref().is_none_or(|c| c.contains(&Column::Time));
        let split = match a.split {
            SplitArg::Strong => SplitKind::Strong,
            SplitArg::Last => SplitKind::Last,
            SplitArg::Random => SplitKind::Random,
        };
        if split == SplitKind::Last && (!has_time || format == TextFormat::Mtx) {
            return Err(Error::Config(
                "--split last needs a time column (--columns ...,time)".into(),
            ));
        }
        check_output(&a.out, a.force)?;
        if a.out == a.input {
            return Err(Error::Config("--out is the --input file".into()));
        }
        Ok(Self {
            input: a.input.clone(),
            format,
            columns,
            header: match a.header {
                HeaderArg::Auto => Header::Auto,
                HeaderArg::Yes => Header::Yes,
                HeaderArg::No => Header::No,
            },
            min_user: a.min_user_interactions,
            min_item: a.min_item_interactions,
            split,
            seed: a.seed,
            out: a.out.clone(),
        })
    }
}

/// What a user-item prepare did.
#[derive(Debug, Clone, PartialEq)]
pub struct UserItemReport {
    pub lines: u64,
    pub users: u64,
    pub items: u64,
    pub interactions: u64,
    pub filter: FilterReport,
    pub test_rows: u64,
    pub fold: u64,
    pub holdout: u64,
    pub train: u64,
    pub seconds: f64,
}

/// Collective: every rank must call. Reads, filters, splits and writes; rank 0 prints.
pub fn global_run<C: Comm>(comm: &C, cfg: &UserItemConfig) -> Result<UserItemReport> {
    let t0 = Instant::now();
    let x = comm.agree(read_interactions(
        &cfg.input,
        cfg.format,
        cfg.columns.as_deref(),
        cfg.header,
    ))?;
    if cfg.split == SplitKind::Last && x.times.is_none() {
        // Default columns with 2 or 3 fields: no time to order by (the same on every rank).
        return Err(Error::input(
            &cfg.input,
            "--split last needs a time column; the lines have none",
        ));
    }
    let full = build_matrix(&x);
    let (m, filter) = min_count_filter(&full, cfg.min_user, cfg.min_item);
    if m.nnz() == 0 {
        return Err(Error::input(
            &cfg.input,
            format!(
                "no interaction is left after --min-user-interactions {} and --min-item-interactions {} ({} round(s))",
                cfg.min_user, cfg.min_item, filter.rounds
            ),
        ));
    }
    let s = split(&m, cfg.split, cfg.seed)?;
    let fmt = match cfg.format {
        TextFormat::Tsv => "tsv",
        TextFormat::Csv => "csv",
        TextFormat::Mtx => "mtx",
    };
    let prov = Provenance {
        source: format!("{fmt}:{}", cfg.input.display()),
        source_users: full.num_users() as u64,
        source_items: full.num_items as u64,
        source_lines: x.pairs.len() as u64,
        seed: cfg.seed,
        split: cfg.split,
        weighted: x.weighted,
        min_user: cfg.min_user,
        min_item: cfg.min_item,
    };
    global_write(comm, &cfg.out, &m, &s, &prov)?;
    let report = UserItemReport {
        lines: x.pairs.len() as u64,
        users: m.num_users() as u64,
        items: m.num_items as u64,
        interactions: m.nnz() as u64,
        filter,
        test_rows: s.test_rows.len() as u64,
        fold: s.fold.items.len() as u64,
        holdout: s.holdout.items.len() as u64,
        train: s.train.items.len() as u64,
        seconds: t0.elapsed().as_secs_f64(),
    };
    let peak = comm.all_reduce_max(peak_rss_bytes().unwrap_or(0));
    if comm.rank() == 0 {
        print_report(cfg, &prov, &report, peak);
    }
    Ok(report)
}

fn print_report(cfg: &UserItemConfig, prov: &Provenance, r: &UserItemReport, peak: u64) {
    let f = &r.filter;
    println!(
        "{}: {} lines, {} users x {} items, {} distinct interactions{}",
        prov.source,
        group(r.lines),
        group(prov.source_users),
        group(prov.source_items),
        group(r.interactions + f.removed_interactions as u64),
        if prov.weighted {
            " (weights summed)"
        } else {
            ""
        }
    );
    println!(
        "filter (users >= {}, items >= {}): fixed point after {} round(s), removed {} users, {} items, {} interactions -> {} users x {} items, {} interactions",
        cfg.min_user,
        cfg.min_item,
        f.rounds,
        group(f.removed_users as u64),
        group(f.removed_items as u64),
        group(f.removed_interactions as u64),
        group(r.users),
        group(r.items),
        group(r.interactions)
    );
    println!(
        "split {} (seed {}): {} test users ({} visible + {} held-out interactions), {} training interactions",
        cfg.split.name(),
        cfg.seed,
        group(r.test_rows),
        group(r.fold),
        group(r.holdout),
        group(r.train)
    );
    println!("wrote {} in {:.2} s", cfg.out.display(), r.seconds);
    println!(
        "prepare: seconds {:.2}, peak_rss_bytes {peak} (max over ranks)",
        r.seconds
    );
}
