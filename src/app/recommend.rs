//! `torusrec recommend`: the top-K columns of rows of a trained model, as TSV or HDF5
//! (the algorithm is [`crate::als::recommend`]; this file is the command line and the
//! output files).
//!
//! Output: TSV `node rank neighbour score` (`user rank item score` on a user x item
//! dataset; `... rank similar score` for `--similar`; header line first; ranks from 1;
//! original ids; a row with fewer than K columns to recommend has fewer lines), on
//! stdout when there is no `--out`; or HDF5 with `/rows` (u64 [n], original ids;
//! `u64::MAX` for `--history`), `/topk` (u64 [n, K], original ids, best first;
//! `u64::MAX` pads) and `/scores` (f32 [n, K]; NaN pads; refused when the ids are
//! strings),
//! root attributes `format = "torusrec-recommendations"`, `k`, `model`, `data`. Files
//! are written by rank 0 under `<out>.partial` and renamed when complete.
//!
//! The model must be of `--data`: a model records the checksum of its dataset's
//! training arcs (`data_checksum`), and another dataset (or other row and column
//! counts) is refused with exit 2 naming both. A model written before torusrec
//! recorded the checksum is accepted with a warning (only its shape can be checked):
//! it was trained correctly, and retraining to add one attribute would be a cost
//! without a gain for the model's many correct uses.

use super::output::RunOutput;
use crate::als::model::TableScalar;
use crate::als::recommend::{
    list_ids, local_read_model_info, parse_id_list, read_id_file, ColFilter, IdMap, IdTok, Kind,
    Queries, RecBlock, RecSink, Recommender, Which, HISTORY_ROW,
};
use crate::bf16::{Bf16, TableDtype};
use crate::ckpt::signals::Preemption;
use crate::comm::Comm;
use crate::error::{quote, Error, Result};
use crate::io::h5::{ctx as h5, write_attrs, Attr};
use crate::io::outfile::{check_output, commit, temp_path};
use crate::metrics::{human_bytes, peak_rss_bytes};
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// The `format` attribute of an HDF5 recommendations file.
pub const FORMAT: &str = "torusrec-recommendations";

use crate::cli::RecommendArgs;

/// The output's kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OutKind {
    Tsv,
    H5,
}

/// A validated `recommend` command line.
#[derive(Debug, Clone)]
struct Config {
    which: Which,
    filter: ColFilter,
    out: Option<(PathBuf, OutKind)>,
}

/// Original ids from `flag` (tokens separated by commas or blanks); with `ints`,
/// every token must be an integer (node ids).
fn parse_list(flag: &str, list: &str, ints: bool) -> Result<Vec<IdTok>> {
    let ids = parse_id_list(list);
    let bad: Vec<String> = ids
        .iter()
        .filter(|t| ints && t.id.parse::<u64>().is_err())
        .map(|t| quote(&t.id))
        .collect();
    if !bad.is_empty() {
        return Err(Error::Config(format!(
            "{flag}: {} token(s) are not node ids: {}",
            bad.len(),
            list_ids(&bad)
        )));
    }
    if ids.is_empty() {
        return Err(Error::Config(format!("{flag}: no ids given")));
    }
    Ok(ids)
}

/// Original ids from a file (one per line, `#` comments, blank lines skipped); with
/// `ints`, every id must be an integer (node ids); `nonempty`: a file without ids
/// is refused.
fn read_list_file(path: &Path, ints: bool, nonempty: bool) -> Result<Vec<IdTok>> {
    let ids = read_id_file(path)?;
    if let Some(t) = ids.iter().find(|t| ints && t.id.parse::<u64>().is_err()) {
        return Err(Error::Parse {
            path: path.into(),
            line: t.at.as_ref().map_or(0, |a| a.1),
            msg: format!("not a node id: {}", quote(&t.id)),
        });
    }
    if nonempty && ids.is_empty() {
        return Err(Error::input(path, "no ids in the file"));
    }
    Ok(ids)
}

/// `--history ID[:W],...`: ids and raw weights (default 1; finite and >= 0).
fn parse_history(list: &str) -> Result<Vec<(IdTok, f32)>> {
    let mut out = Vec::new();
    for t in parse_list("--history", list, false)? {
        let (id, w) = match t.id.rsplit_once(':') {
            Some((id, w)) => {
                let w = w.parse::<f32>().ok().filter(|w| w.is_finite() && *w >= 0.0);
                match w {
                    Some(w) if !id.is_empty() => (id, w),
                    _ => {
                        return Err(Error::Config(format!(
                            "--history: {}: want ID or ID:WEIGHT with a weight >= 0",
                            quote(&t.id)
                        )))
                    }
                }
            }
            None => (t.id.as_str(), 1.0),
        };
        out.push((IdTok::arg(id), w));
    }
    Ok(out)
}

impl RecommendArgs {
    /// Rank-local, identical on every rank: check everything that does not need the
    /// model or the dataset.
    fn validate(&self) -> Result<Config> {
        if self.k == 0 {
            return Err(Error::Config("--k 0: recommend at least one column".into()));
        }
        if self.block_rows == 0 {
            return Err(Error::Config("--block-rows 0: must be positive".into()));
        }
        let out = match &self.out {
            None => None,
            Some(p) => {
                let ext = p.extension().and_then(|e| e.to_str()).unwrap_or("");
                let kind = match ext.to_ascii_lowercase().as_str() {
                    "tsv" => OutKind::Tsv,
                    "h5" | "hdf5" => OutKind::H5,
                    _ => {
                        return Err(Error::Config(format!(
                            "--out {}: expected a .tsv or .h5 file",
                            crate::error::short_path(p)
                        )))
                    }
                };
                Some((p.clone(), kind))
            }
        };
        if let Some((p, _)) = &out {
            check_output(p, self.force)?;
            let mut inputs = vec![("--model", self.model.as_path()), ("--data", &self.data)];
            for (flag, f) in [
                ("--nodes-file", &self.nodes_file),
                ("--user-file", &self.user_file),
                ("--exclude", &self.exclude),
                ("--allow", &self.allow),
            ] {
                if let Some(f) = f {
                    inputs.push((flag, f));
                }
            }
            crate::io::outfile::check_apart(p, &inputs)?;
        }
        let which = if let Some(list) = &self.nodes {
            Which::Nodes(parse_list("--nodes", list, true)?)
        } else if let Some(f) = &self.nodes_file {
            Which::Nodes(read_list_file(f, true, true)?)
        } else if let Some(list) = &self.user {
            Which::Nodes(parse_list("--user", list, false)?)
        } else if let Some(f) = &self.user_file {
            Which::Nodes(read_list_file(f, false, true)?)
        } else if let Some(list) = &self.history {
            Which::History(parse_history(list)?)
        } else if let Some(list) = &self.similar {
            Which::Similar(parse_list("--similar", list, false)?)
        } else if self.test {
            Which::Test
        } else {
            Which::All
        };
        let filter = ColFilter {
            exclude: match &self.exclude {
                Some(f) => read_list_file(f, false, false)?,
                None => Vec::new(),
            },
            allow: self
                .allow
                .as_deref()
                .map(|f| read_list_file(f, false, true))
                .transpose()?,
        };
        Ok(Config { which, filter, out })
    }

    /// Refuse the flags of the other kind of dataset (identical on every rank).
    fn check_kind(&self, kind: Kind) -> Result<()> {
        let (wrong, right) = match kind {
            Kind::Graph => (
                [
                    ("--user", self.user.is_some()),
                    ("--user-file", self.user_file.is_some()),
                ],
                "--nodes or --nodes-file",
            ),
            Kind::UserItem => (
                [
                    ("--nodes", self.nodes.is_some()),
                    ("--nodes-file", self.nodes_file.is_some()),
                ],
                "--user or --user-file",
            ),
        };
        match wrong.iter().find(|w| w.1) {
            Some((flag, _)) => Err(Error::Config(format!(
                "{flag}: {} is a {}; give {right}",
                crate::error::short_path(&self.data),
                match kind {
                    Kind::Graph => "graph",
                    Kind::UserItem => "user x item dataset",
                }
            ))),
            None => Ok(()),
        }
    }
}

/// Where rank 0 writes: TSV (a file or stdout) or HDF5, and the progress bar.
enum Writer {
    Tsv(std::io::BufWriter<Box<dyn Write>>),
    H5 {
        file: hdf5::File,
        rows: hdf5::Dataset,
        topk: hdf5::Dataset,
        scores: hdf5::Dataset,
    },
}

struct Sink<'a> {
    writer: Writer,
    /// The temporary being written (None: stdout).
    tmp: Option<PathBuf>,
    k: usize,
    out: &'a RunOutput,
    done: usize,
    /// The ids of the queries (rows, or columns for `--similar`) and of the columns.
    rows: &'a IdMap,
    cols: &'a IdMap,
}

impl Sink<'_> {
    fn path(&self) -> PathBuf {
        self.tmp
            .clone()
            .unwrap_or_else(|| PathBuf::from("<stdout>"))
    }
}

impl RecSink for Sink<'_> {
    fn block(&mut self, b: &RecBlock, total: usize) -> Result<()> {
        let k = self.k;
        let n = b.rows.len();
        let path = self.path();
        match &mut self.writer {
            Writer::Tsv(w) => {
                let (row_ids, col_ids) = (self.rows, self.cols);
                let mut write = || -> std::io::Result<()> {
                    for (i, &r) in b.rows.iter().enumerate() {
                        for j in 0..k {
                            let c = b.topk[i * k + j];
                            if c == u32::MAX {
                                break;
                            }
                            if r == HISTORY_ROW {
                                write!(w, "history")?;
                            } else {
                                write!(w, "{}", row_ids.display(r))?;
                            }
                            let score = b.scores[i * k + j];
                            writeln!(w, "\t{}\t{}\t{score}", j + 1, col_ids.display(c))?;
                        }
                    }
                    Ok(())
                };
                write().map_err(|e| Error::io(&path, e))?;
            }
            Writer::H5 {
                rows, topk, scores, ..
            } => {
                let (a, z) = (b.first, b.first + n);
                // String ids are refused for HDF5 output before any block.
                let int = |m: &IdMap, i: u32| match i {
                    u32::MAX => u64::MAX,
                    i => m.as_u64(i).unwrap_or(u64::MAX),
                };
                let row_ids: Vec<u64> = b.rows.iter().map(|&r| int(self.rows, r)).collect();
                let top: Vec<u64> = b.topk.iter().map(|&c| int(self.cols, c)).collect();
                h5(&path, "rows", rows.write_slice(&row_ids, a..z))?;
                let view = |v| ndarray::ArrayView2::from_shape((n, k), v);
                let t = view(&top).map_err(|e| Error::Comm(e.to_string()))?;
                h5(&path, "topk", topk.write_slice(t, ndarray::s![a..z, ..]))?;
                let s = ndarray::ArrayView2::from_shape((n, k), &b.scores[..])
                    .map_err(|e| Error::Comm(e.to_string()))?;
                h5(
                    &path,
                    "scores",
                    scores.write_slice(s, ndarray::s![a..z, ..]),
                )?;
            }
        }
        self.done += n;
        self.out.progress(self.done as u64, total as u64);
        Ok(())
    }
}

/// The TSV header line.
fn tsv_header(kind: Kind, similar: bool) -> &'static str {
    match (kind, similar) {
        (Kind::Graph, false) => "node\trank\tneighbour\tscore",
        (Kind::Graph, true) => "node\trank\tsimilar\tscore",
        (Kind::UserItem, false) => "user\trank\titem\tscore",
        (Kind::UserItem, true) => "item\trank\tsimilar\tscore",
    }
}

/// What rank 0 writes: the header and the two id maps.
struct Labels<'a> {
    header: &'static str,
    rows: &'a IdMap,
    cols: &'a IdMap,
}

/// Rank 0: open the output (a temporary next to `--out`, or stdout).
fn local_open<'a>(
    cfg: &Config,
    args: &RecommendArgs,
    (n, k): (usize, usize),
    labels: Labels<'a>,
    out: &'a RunOutput,
) -> Result<Sink<'a>> {
    let header = |w: &mut std::io::BufWriter<Box<dyn Write>>| writeln!(w, "{}", labels.header);
    let (writer, tmp) = match &cfg.out {
        None => {
            let mut w = std::io::BufWriter::new(Box::new(std::io::stdout()) as Box<dyn Write>);
            header(&mut w).map_err(|e| Error::io("<stdout>", e))?;
            (Writer::Tsv(w), None)
        }
        Some((p, OutKind::Tsv)) => {
            let tmp = temp_path(p);
            let f = std::fs::File::create(&tmp).map_err(|e| Error::io(&tmp, e))?;
            let mut w = std::io::BufWriter::new(Box::new(f) as Box<dyn Write>);
            header(&mut w).map_err(|e| Error::io(&tmp, e))?;
            (Writer::Tsv(w), Some(tmp))
        }
        Some((p, OutKind::H5)) => {
            let tmp = temp_path(p);
            let file = h5(&tmp, "create", crate::io::h5::create(&tmp))?;
            let rows = h5(
                &tmp,
                "rows",
                file.new_dataset::<u64>().shape(n).create("rows"),
            )?;
            let topk = h5(
                &tmp,
                "topk",
                file.new_dataset::<u64>().shape((n, k)).create("topk"),
            )?;
            let scores = h5(
                &tmp,
                "scores",
                file.new_dataset::<f32>().shape((n, k)).create("scores"),
            )?;
            write_attrs(
                &file,
                &tmp,
                &[
                    ("format", Attr::Str(FORMAT.into())),
                    ("k", Attr::U64(k as u64)),
                    ("model", Attr::Str(args.model.display().to_string())),
                    ("data", Attr::Str(args.data.display().to_string())),
                ],
            )?;
            (
                Writer::H5 {
                    file,
                    rows,
                    topk,
                    scores,
                },
                Some(tmp),
            )
        }
    };
    Ok(Sink {
        writer,
        tmp,
        k,
        out,
        done: 0,
        rows: labels.rows,
        cols: labels.cols,
    })
}

/// Rank 0: flush and close the output and rename it into place.
fn local_finish(sink: Sink<'_>, cfg: &Config) -> Result<()> {
    let path = sink.path();
    match sink.writer {
        Writer::Tsv(mut w) => {
            w.flush().map_err(|e| Error::io(&path, e))?;
            drop(w);
        }
        Writer::H5 {
            file,
            rows,
            topk,
            scores,
        } => {
            drop((rows, topk, scores));
            h5(&path, "close", file.close())?;
        }
    }
    match (&sink.tmp, &cfg.out) {
        (Some(tmp), Some((out, _))) => commit(tmp, out),
        _ => Ok(()),
    }
}

/// Collective: every rank must call.
pub fn global_run<C: Comm>(comm: &C, args: &RecommendArgs, preempt: Preemption) -> Result<()> {
    let cfg = comm.agree(args.validate())?;
    let threads = crate::node::resolve_threads(args.threads);
    comm.agree(crate::node::install_threads(threads))?;
    let info = comm.agree(local_read_model_info(&args.model))?;
    match info.dtype {
        TableDtype::F32 => run_as::<C, f32>(comm, args, &cfg, &info, threads, preempt),
        TableDtype::Bf16 => run_as::<C, Bf16>(comm, args, &cfg, &info, threads, preempt),
    }
}

fn run_as<C: Comm, T: TableScalar>(
    comm: &C,
    args: &RecommendArgs,
    cfg: &Config,
    info: &crate::als::recommend::ModelInfo,
    threads: usize,
    preempt: Preemption,
) -> Result<()> {
    let root = comm.rank() == 0;
    // Human lines go to stderr when the recommendations go to stdout.
    let say = |s: &str| {
        if !root {
        } else if cfg.out.is_none() {
            eprintln!("{s}");
        } else {
            println!("{s}");
        }
    };
    let t0 = Instant::now();
    let mut rec = Recommender::<T>::global_load(comm, &args.model, info, &args.data)?;
    if root && info.data_checksum.is_none() {
        eprintln!(
            "recommend: warning: {} does not record the dataset it was trained on (written by an older torusrec); only its row and column counts were checked against {}",
            crate::error::short_path(&args.model),
            crate::error::short_path(&args.data)
        );
    }
    rec.block_rows = args.block_rows;
    let k = args.k;
    let (queries, left_out, cols) = global_plan(comm, args, cfg, &rec)?;
    let load = t0.elapsed().as_secs_f64();
    say(&format!(
        "recommend: {} {} of {} (d={} tables={} rows={} cols={} test={}) k={k} on {} rank(s) x {threads} thread(s); loaded in {load:.2} s",
        queries.len(),
        match &queries {
            Queries::Rows(_) => "rows",
            Queries::History { .. } => "history",
            Queries::Items(_) => "items (similar)",
        },
        crate::error::short_path(&args.model),
        info.dim,
        info.dtype,
        rec.num_rows(),
        rec.num_cols(),
        rec.num_test(),
        comm.size()
    ));
    if left_out > 0 {
        say(&format!(
            "recommend: {left_out} row(s) with nothing to fold in (no training arc, not a test row) are left out"
        ));
    }
    let t1 = Instant::now();
    let times = global_write(comm, args, cfg, &rec, (&queries, &cols), preempt)?;
    let secs = t1.elapsed().as_secs_f64();
    let peak = comm.all_reduce_max(peak_rss_bytes().unwrap_or(0));
    if root && std::io::stderr().is_terminal() {
        // Clear the progress bar.
        eprint!("\r\x1b[K");
    }
    say(&format!(
        "recommend: {} rows in {secs:.2} s ({:.0} rows/s): fold-in {:.2} s, gather {:.2} s, score {:.2} s, merge {:.2} s, write {:.2} s (rank 0); peak RSS {} per rank{}",
        queries.len(),
        queries.len() as f64 / secs.max(1e-9),
        times.fold_in,
        times.gather,
        times.score,
        times.merge,
        times.sink,
        human_bytes(peak),
        cfg.out
            .as_ref()
            .map(|(p, _)| format!("; wrote {}", p.display()))
            .unwrap_or_default()
    ));
    Ok(())
}

/// Collective: check `-k` and the flags against the dataset, and resolve the queries
/// and the column filter (exit 2 on every rank for a bad id or flag).
fn global_plan<C: Comm, T: TableScalar>(
    comm: &C,
    args: &RecommendArgs,
    cfg: &Config,
    rec: &Recommender<T>,
) -> Result<(Queries, u64, crate::als::recommend::Cols)> {
    let k = args.k;
    comm.agree(if k as u64 > rec.num_cols() {
        Err(Error::Config(format!(
            "--k {k}: the dataset has only {} columns",
            rec.num_cols()
        )))
    } else {
        Ok(())
    })?;
    comm.agree(args.check_kind(rec.kind()))?;
    let (queries, left_out) = rec.global_resolve(comm, &cfg.which)?;
    let cols = comm.agree(rec.local_resolve_filter(&cfg.filter))?;
    let l = labels(rec, &queries);
    comm.agree(match &cfg.out {
        Some((p, OutKind::H5)) if l.rows.is_strings() || l.cols.is_strings() => {
            Err(Error::Config(format!(
                "--out {}: the dataset's ids are strings, which the HDF5 output (u64 ids) cannot hold; give --out F.tsv",
                crate::error::short_path(p)
            )))
        }
        _ => Ok(()),
    })?;
    Ok((queries, left_out, cols))
}

/// The header and id maps of `queries`' output.
fn labels<'a, T: TableScalar>(rec: &'a Recommender<T>, queries: &Queries) -> Labels<'a> {
    let similar = matches!(queries, Queries::Items(_));
    Labels {
        header: tsv_header(rec.kind(), similar),
        rows: if similar {
            rec.col_ids()
        } else {
            rec.row_ids()
        },
        cols: rec.col_ids(),
    }
}

/// Collective: run the queries, rank 0 writing the output; nothing is left under the
/// output name on failure.
fn global_write<C: Comm, T: TableScalar>(
    comm: &C,
    args: &RecommendArgs,
    cfg: &Config,
    rec: &Recommender<T>,
    (queries, cols): (&Queries, &crate::als::recommend::Cols),
    preempt: Preemption,
) -> Result<crate::als::recommend::RecTimes> {
    let k = args.k;
    let out = RunOutput::global_open(comm, None)?;
    let opened = if comm.rank() == 0 {
        local_open(cfg, args, (queries.len(), k), labels(rec, queries), &out).map(Some)
    } else {
        Ok(None)
    };
    let mut sink = comm.agree(opened)?;
    struct NoSink;
    impl RecSink for NoSink {
        fn block(&mut self, _: &RecBlock, _: usize) -> Result<()> {
            Ok(())
        }
    }
    let ran = match sink.as_mut() {
        Some(s) => rec.global_run(comm, queries, cols, k, &preempt, s),
        None => rec.global_run(comm, queries, cols, k, &preempt, &mut NoSink),
    };
    let finished = match (ran, sink) {
        (Ok(times), Some(s)) => {
            let tmp = s.tmp.clone();
            let r = local_finish(s, cfg).map(|_| times);
            if r.is_err() {
                if let Some(t) = tmp {
                    let _ = std::fs::remove_file(t);
                }
            }
            r
        }
        (Ok(times), None) => Ok(times),
        (Err(e), s) => {
            if let Some(t) = s.and_then(|s| s.tmp) {
                let _ = std::fs::remove_file(t);
            }
            Err(e)
        }
    };
    comm.agree(finished)
}
