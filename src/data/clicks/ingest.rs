//! Writing a keyed click log (schema `torusrec-clicks-v2`, see [`super::log_file`])
//! from any [`ExampleSource`] — Criteo text files split over ranks
//! ([`super::textlog::TextFiles`]) or the Criteo-format generator
//! ([`super::criteo_gen`]) — collectively, in two streaming passes.
//!
//! The log is cut into *segments*: day `d`'s share of rank `r`, in the order
//! `(d, r)` = (0, 0), (0, 1), ..., (1, 0), ...: the examples of day `d` are those of its
//! segments, rank by rank. Every rank streams its segments in [`Block`]s (bounded by the
//! source, never the whole input):
//!
//! 1. **count**: examples, lines and ids per table of each segment, a HyperLogLog
//!    sketch per table ([`super::hll`]), and the bad lines (counted; the first
//!    [`FIRST_BAD`] of each rank kept with their reason). Then, collectively: the
//!    counts are all-gathered (so each rank knows where its segments start, and the
//!    line number in its file of a bad line — the lines of the file's earlier
//!    segments plus its own), the sketches merged, the bad lines gathered. Too many
//!    bad lines, or no example at all, stop every rank here (exit 2, nothing written):
//!    the rank holding the first bad line reports it with file and line.
//! 2. **write**: rank 0 creates `<out>.partial` with every dataset at its final shape,
//!    contiguous and allocated at once ([`crate::io::positional`]), and broadcasts
//!    their byte offsets; every rank streams its segments again and writes each block
//!    with positional writes into its disjoint ranges; then every rank syncs, and rank 0
//!    commits (`crate::io::outfile::commit`: fsync, rename, directory fsync).
//!    A segment that yields other counts than in pass 1 (a file changed meanwhile) is an
//!    input error.
//!
//! Every step is agreed ([`Comm::agree`]): all ranks fail or none, and on failure
//! rank 0 removes the temporary, so `out` is never half-written and an existing `out`
//! is untouched. A preemption signal (or `TORUSREC_PREEMPT_IN=count|write`) stops a
//! pass at the next block with exit 1 and nothing written.
//!
//! Memory per rank: the source's blocks (for text, [`super::textlog::BLOCK_BYTES`] of
//! text and its parsed columns), one sketch per table (16 KiB) and, on every rank, the
//! gathered counts (`(2 + T)` u64 per segment) and sketches (`P T` 16 KiB while they
//! are merged): nothing grows with the number of examples.

use std::path::{Path, PathBuf};
use std::time::Instant;

use super::batch::{Bags, KeyBags};
use super::hll::{Hll, HLL_REGISTERS};
use super::log_file::{ids_name, offsets_name, weights_name, SCHEMA_V2};
use crate::ckpt::signals::check_preempted;
use crate::comm::Comm;
use crate::error::{Error, Result};
use crate::io::h5::{ctx as h5, write_attrs, Attr};
use crate::io::outfile::temp_path;
use crate::io::positional::{create_allocated, PositionalFile, NO_OFFSET};
use crate::spec::{ModelSpec, Pooling, TableSpec, ValencyDist, VocabKind, MAX_DIM, MAX_VOCAB};

/// Bad lines each rank keeps the reason of (the rest are counted).
pub const FIRST_BAD: usize = 8;

/// Examples in columnar form as a source yields them: labels, transformed dense
/// values, and each table's keys (a bag per example, offsets from 0), plus what the
/// block cost in input (lines, bytes) and the bad lines it skipped.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Block {
    pub n: usize,
    pub n_dense: usize,
    /// 0.0 or 1.0.
    pub labels: Vec<f32>,
    /// `n * n_dense`, row-major.
    pub dense: Vec<f32>,
    /// One per table.
    pub keys: Vec<KeyBags>,
    /// One per table: the per-id weights of a weighted table (one per id of
    /// `keys[t]`), empty for the others (see [`ExampleSource::weighted`]).
    pub weights: Vec<Vec<f32>>,
    /// Input lines the block covers: its examples and its bad lines.
    pub lines: u64,
    /// Input bytes the block covers (text; 0 for a generator).
    pub bytes: u64,
    /// Bad lines skipped.
    pub bad: u64,
    /// The first [`FIRST_BAD`] of them: the line's index in the block (0-based over
    /// `lines`) and the reason.
    pub first_bad: Vec<(u64, String)>,
}

impl Block {
    /// No examples, for `n_dense` dense features and `tables` tables.
    pub fn new(n_dense: usize, tables: usize) -> Block {
        Block {
            n_dense,
            keys: vec![
                Bags {
                    offsets: vec![0],
                    ids: Vec::new()
                };
                tables
            ],
            weights: vec![Vec::new(); tables],
            ..Block::default()
        }
    }

    /// No examples, keeping the buffers.
    pub fn clear(&mut self) {
        self.n = 0;
        self.labels.clear();
        self.dense.clear();
        for k in &mut self.keys {
            k.offsets.clear();
            k.offsets.push(0);
            k.ids.clear();
        }
        for w in &mut self.weights {
            w.clear();
        }
        self.lines = 0;
        self.bytes = 0;
        self.bad = 0;
        self.first_bad.clear();
    }

    /// Count a bad line at index `line` of the block; its reason is built only for
    /// the first few.
    pub fn push_bad(&mut self, line: u64, reason: impl FnOnce() -> String) {
        self.bad += 1;
        if self.first_bad.len() < FIRST_BAD {
            self.first_bad.push((line, reason()));
        }
    }
}

/// Where a log's examples come from, split over ranks by day and rank (see the
/// module doc). Everything but [`ExampleSource::for_each_block`] is the same on
/// every rank.
pub trait ExampleSource {
    /// Days of the log, in order.
    fn days(&self) -> usize;
    /// The file errors about day `d` name.
    fn day_path(&self, d: usize) -> &Path;
    /// Dense features per example.
    fn n_dense(&self) -> usize;
    /// Tables (categorical features).
    fn tables(&self) -> usize;
    /// Per table: whether its blocks carry per-id weights (none by default).
    fn weighted(&self) -> Vec<bool> {
        vec![false; self.tables()]
    }
    /// Rank-local: stream this rank's share of day `d`, in order, handing each block
    /// to `f`. Each call must yield the same examples.
    fn for_each_block(&self, d: usize, f: &mut dyn FnMut(&Block) -> Result<()>) -> Result<()>;
}

/// The root attributes and spec of the log (identical on every rank).
#[derive(Clone, Debug, PartialEq)]
pub struct LogHeader {
    /// `criteo` or `tsv`.
    pub format: String,
    /// The column layout of a `tsv` input (attribute `columns`).
    pub columns: Option<String>,
    /// One entry per day: the input file as given (attribute `source`, a JSON array).
    pub source: Vec<String>,
    /// Attribute `seed` (0 for a log prepared from files).
    pub seed: u64,
    /// Width of every table in the spec.
    pub dim: usize,
    /// Table names, in order.
    pub table_names: Vec<String>,
}

/// A bad line: day, line in its file (1-based), reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BadLine {
    pub path: PathBuf,
    pub line: u64,
    pub reason: String,
}

/// What [`global_write_log`] did (identical on every rank but the seconds).
#[derive(Clone, Debug, PartialEq)]
pub struct IngestReport {
    pub examples: u64,
    /// `day_offsets` as written: `days + 1` entries.
    pub day_offsets: Vec<u64>,
    /// Ids (keys) of each table over the log.
    pub ids_per_table: Vec<u64>,
    /// The HyperLogLog estimate of each table's distinct keys (at least 1).
    pub distinct: Vec<u64>,
    /// Input bytes read in the count pass, over all ranks.
    pub bytes: u64,
    /// Bad lines skipped over all ranks, and the first of them in input order.
    pub bad_lines: u64,
    pub first_bad: Vec<BadLine>,
    /// This rank's seconds in the count and write passes (the write pass includes
    /// creating and committing the file).
    pub pass_seconds: [f64; 2],
    pub positive_rate: f64,
}

/// The spec of a keyed log: the default dense width and MLP (of an empty
/// [`ModelSpec`]), `n_dense`, and one hash-table vocabulary per table named as given,
/// `dim` wide, sum pooling, one id per example, capacity `vocab` (at least 1).
pub fn keyed_spec(
    n_dense: usize,
    names: &[String],
    dim: usize,
    vocab: &[u64],
) -> Result<ModelSpec> {
    if !(1..=MAX_DIM).contains(&dim) {
        return Err(Error::Config(format!(
            "--dim must be in 1..={MAX_DIM}, got {dim}"
        )));
    }
    let mut spec: ModelSpec = serde_json::from_str(r#"{"table": []}"#)
        .map_err(|e| Error::Config(format!("default model: {e}")))?;
    spec.n_dense = n_dense;
    spec.tables = names
        .iter()
        .zip(vocab)
        .map(|(name, &v)| TableSpec {
            name: name.clone(),
            vocab: v.clamp(1, MAX_VOCAB),
            dim,
            pooling: Pooling::Sum,
            valency: 1.0,
            valency_dist: ValencyDist::Fixed,
            vocab_kind: VocabKind::Hash,
            admit_after: 1,
            evict: Default::default(),
        })
        .collect();
    spec.validate("click log model")?;
    Ok(spec)
}

/// Stop a pass when a preemption signal arrived ([`check_preempted`]): nothing is
/// written, exit 1.
fn check_signal(pass: &str) -> Result<()> {
    check_preempted(pass, || {
        format!(
            "signal received during the {pass} pass of prepare clicks; nothing was written (exit 1)"
        )
    })
}

/// This rank's counts of one segment.
#[derive(Clone, Debug, Default, PartialEq)]
struct SegCount {
    examples: u64,
    lines: u64,
    nnz: Vec<u64>,
}

impl SegCount {
    fn new(tables: usize) -> Self {
        SegCount {
            nnz: vec![0; tables],
            ..Default::default()
        }
    }

    fn add(&mut self, b: &Block) {
        self.examples += b.n as u64;
        self.lines += b.lines;
        for (n, k) in self.nnz.iter_mut().zip(&b.keys) {
            *n += k.ids.len() as u64;
        }
    }
}

/// What pass 1 found on this rank.
struct LocalCount {
    segs: Vec<SegCount>,
    hll: Vec<Hll>,
    bytes: u64,
    bad: u64,
    positives: u64,
    /// (day, line index in this rank's share of the day, reason).
    first_bad: Vec<(usize, u64, String)>,
}

fn local_count<S: ExampleSource>(src: &S) -> Result<LocalCount> {
    let t = src.tables();
    let weighted = src.weighted();
    let mut c = LocalCount {
        segs: Vec::with_capacity(src.days()),
        hll: vec![Hll::new(); t],
        bytes: 0,
        bad: 0,
        positives: 0,
        first_bad: Vec::new(),
    };
    for d in 0..src.days() {
        let mut seg = SegCount::new(t);
        src.for_each_block(d, &mut |b| {
            check_signal("count")?;
            check_block(b, src.n_dense(), &weighted)?;
            for (hll, k) in c.hll.iter_mut().zip(&b.keys) {
                for &key in &k.ids {
                    hll.insert(key);
                }
            }
            for (line, reason) in &b.first_bad {
                if c.first_bad.len() < FIRST_BAD {
                    c.first_bad.push((d, seg.lines + line, reason.clone()));
                }
            }
            c.bad += b.bad;
            c.bytes += b.bytes;
            c.positives += b.labels.iter().filter(|&&l| l == 1.0).count() as u64;
            seg.add(b);
            Ok(())
        })?;
        c.segs.push(seg);
    }
    Ok(c)
}

/// A source's block must have the source's shape (a bug otherwise, not an input
/// error: checked because every rank's file offsets depend on it).
fn check_block(b: &Block, n_dense: usize, weighted: &[bool]) -> Result<()> {
    let tables = weighted.len();
    let weights_ok = b.weights.len() == tables
        && (0..tables)
            .all(|t| b.weights[t].len() == if weighted[t] { b.keys[t].ids.len() } else { 0 });
    let ok = weights_ok
        && b.labels.len() == b.n
        && b.dense.len() == b.n * n_dense
        && b.keys.len() == tables
        && b.keys.iter().all(|k| {
            k.offsets.len() == b.n + 1
                && k.offsets.first() == Some(&0)
                && k.offsets.last().map(|&o| o as usize) == Some(k.ids.len())
        });
    if ok {
        Ok(())
    } else {
        Err(Error::Check(format!(
            "a block of {} examples does not have {n_dense} dense values and {tables} tables per example",
            b.n
        )))
    }
}

/// The segments' counts gathered: `field(d, r)`.
struct Counts {
    p: usize,
    tables: usize,
    /// Per rank, per day: examples, lines, nnz per table.
    all: Vec<u64>,
}

impl Counts {
    const FIXED: usize = 2;

    fn width(&self) -> usize {
        Self::FIXED + self.tables
    }

    fn at(&self, d: usize, r: usize, days: usize) -> &[u64] {
        let w = self.width();
        let o = (r * days + d) * w;
        &self.all[o..o + w]
    }

    /// Rank `me`'s counts of each day's segment.
    fn of_rank(&self, me: usize, days: usize) -> Vec<SegCount> {
        (0..days)
            .map(|d| {
                let c = self.at(d, me, days);
                SegCount {
                    examples: c[0],
                    lines: c[1],
                    nnz: c[Self::FIXED..].to_vec(),
                }
            })
            .collect()
    }
}

/// Collective: every rank must call, with the same `src` (each its own share),
/// `header`, `out`, `force` and `skip_bad`. Streams `src` twice and writes the keyed
/// click log `out` (see the module doc). More than `skip_bad` bad lines, or no
/// example, is an input error (exit 2) on every rank, with nothing written.
pub fn global_write_log<C: Comm, S: ExampleSource>(
    comm: &C,
    src: &S,
    header: &LogHeader,
    out: &Path,
    skip_bad: u64,
) -> Result<IngestReport> {
    let _phase = comm.stats().phase("ingest");
    let (me, p) = (comm.rank(), comm.size());
    let (days, t, nd) = (src.days(), src.tables(), src.n_dense());
    if header.table_names.len() != t || header.source.len() != days {
        return Err(Error::Check(format!(
            "log header: {} table names for {t} tables, {} sources for {days} days",
            header.table_names.len(),
            header.source.len()
        )));
    }

    // Pass 1: count.
    let t0 = Instant::now();
    let local = comm.agree(local_count(src))?;
    let t_count = t0.elapsed().as_secs_f64();
    let mine: Vec<u64> = local
        .segs
        .iter()
        .flat_map(|s| {
            [s.examples, s.lines]
                .into_iter()
                .chain(s.nnz.iter().copied())
        })
        .collect();
    let counts = Counts {
        p,
        tables: t,
        all: comm.all_gather_v(&mine)?.data,
    };
    let mut totals = [local.bytes, local.bad, local.positives];
    comm.all_reduce_sum(&mut totals);
    let [bytes, bad_lines, positives] = totals;

    // Bad lines: gathered with their rank, placed at their line in the file.
    let first_bad = global_first_bad(comm, src, &counts, &local.first_bad)?;
    check_bad_lines(me, &first_bad, bad_lines, skip_bad)?;

    // Where every segment starts.
    let starts = SegStarts::of(&counts, days);
    let n = starts.examples;
    if n == 0 {
        return Err(from_owner(
            me,
            0,
            Error::input(
                src.day_path(0),
                format!(
                    "no examples in the input ({days} file{}{})",
                    if days == 1 { "" } else { "s" },
                    if bad_lines > 0 {
                        format!(", {bad_lines} bad lines skipped")
                    } else {
                        String::new()
                    }
                ),
            ),
        ));
    }
    if usize::try_from(n).is_err() || n.checked_mul(nd.max(1) as u64 * 4).is_none() {
        return Err(Error::input(
            src.day_path(0),
            format!("{n} examples is too many"),
        ));
    }

    // Distinct keys per table: the merged sketches.
    let distinct = global_distinct(comm, local.hll)?;
    let spec = comm.agree(keyed_spec(nd, &header.table_names, header.dim, &distinct))?;

    // Pass 2: create, write, commit.
    let t1 = Instant::now();
    let plan = Plan {
        out,
        n,
        nd,
        spec: &spec,
        header,
        day_offsets: &starts.day_offsets,
        nnz: &starts.nnz,
        distinct: &distinct,
        weighted: &src.weighted(),
    };
    let my_starts = starts.of_rank(me, p, t, days);
    let my_counts = counts.of_rank(me, days);
    global_create_write_commit(comm, src, &plan, &my_starts, &my_counts)?;
    let t_write = t1.elapsed().as_secs_f64();

    Ok(IngestReport {
        examples: n,
        day_offsets: starts.day_offsets,
        ids_per_table: starts.nnz,
        distinct,
        bytes,
        bad_lines,
        first_bad: first_bad.into_iter().map(|(_, b)| b).collect(),
        pass_seconds: [t_count, t_write],
        positive_rate: positives as f64 / n as f64,
    })
}

/// More than `skip_bad` bad lines (of `bad_lines` over all ranks) is an input error:
/// the first of `first_bad` (with the rank that read it), reported by that rank.
fn check_bad_lines(
    me: usize,
    first_bad: &[(usize, BadLine)],
    bad_lines: u64,
    skip_bad: u64,
) -> Result<()> {
    if bad_lines > skip_bad {
        let (owner, first) = &first_bad[0];
        let mut reason = first.reason.clone();
        if skip_bad > 0 || bad_lines > 1 {
            reason.push_str(&format!(
                " ({bad_lines} bad lines in all, more than --skip-bad-lines {skip_bad})"
            ));
        }
        return Err(from_owner(
            me,
            *owner,
            Error::Parse {
                path: first.path.clone(),
                line: first.line,
                msg: reason,
            },
        ));
    }
    Ok(())
}

/// Where every segment starts, from the gathered counts.
struct SegStarts {
    /// The first example of each segment, by `(d, r)`.
    seg_start: Vec<u64>,
    /// The first id of each segment in each table, by `(d, r, t)`.
    nnz_start: Vec<u64>,
    /// The first example of each day, and the total: `days + 1` entries.
    day_offsets: Vec<u64>,
    /// Examples over the log.
    examples: u64,
    /// Ids of each table over the log.
    nnz: Vec<u64>,
}

impl SegStarts {
    fn of(counts: &Counts, days: usize) -> Self {
        let (p, t) = (counts.p, counts.tables);
        let mut seg_start = vec![0u64; days * p]; // by (d, r)
        let mut nnz_start = vec![0u64; days * p * t]; // by (d, r, t)
        let mut day_offsets = Vec::with_capacity(days + 1);
        let mut n = 0u64;
        let mut nnz = vec![0u64; t];
        for d in 0..days {
            day_offsets.push(n);
            for r in 0..p {
                let c = counts.at(d, r, days);
                seg_start[d * p + r] = n;
                n += c[0];
                for k in 0..t {
                    nnz_start[(d * p + r) * t + k] = nnz[k];
                    nnz[k] += c[Counts::FIXED + k];
                }
            }
        }
        day_offsets.push(n);
        SegStarts {
            seg_start,
            nnz_start,
            day_offsets,
            examples: n,
            nnz,
        }
    }

    /// Where rank `me` (of `p`) starts its share of each day: the example and, per
    /// table (`t`), the id.
    fn of_rank(&self, me: usize, p: usize, t: usize, days: usize) -> Vec<(u64, Vec<u64>)> {
        (0..days)
            .map(|d| {
                let s = d * p + me;
                (
                    self.seg_start[s],
                    self.nnz_start[s * t..(s + 1) * t].to_vec(),
                )
            })
            .collect()
    }
}

/// Collective: every rank must call. Each table's distinct keys: every rank's
/// sketches `hll` (one per table) gathered and merged, at least 1.
fn global_distinct<C: Comm>(comm: &C, hll: Vec<Hll>) -> Result<Vec<u64>> {
    let (p, t) = (comm.size(), hll.len());
    let regs: Vec<u8> = hll
        .iter()
        .flat_map(|h| h.registers().iter().copied())
        .collect();
    drop(hll);
    let all_regs = comm.all_gather_v(&regs)?;
    drop(regs);
    let distinct: Vec<u64> = (0..t)
        .map(|k| {
            let mut h = Hll::new();
            for r in 0..p {
                let part = all_regs.from_rank(r);
                h.merge_registers(&part[k * HLL_REGISTERS..(k + 1) * HLL_REGISTERS]);
            }
            h.count().max(1)
        })
        .collect();
    drop(all_regs);
    Ok(distinct)
}

/// `err` on rank `owner`, [`Error::Remote`] naming it on every other rank: for a
/// failure every rank has detected identically from gathered data, printed once.
fn from_owner(me: usize, owner: usize, err: Error) -> Error {
    if me == owner {
        err
    } else {
        Error::Remote {
            rank: owner,
            code: err.exit_code(),
        }
    }
}

/// Collective. Every rank's first bad lines, with their line numbers in the file
/// (1-based) and the rank that read them, in input order (at most [`FIRST_BAD`]).
fn global_first_bad<C: Comm, S: ExampleSource>(
    comm: &C,
    src: &S,
    counts: &Counts,
    mine: &[(usize, u64, String)],
) -> Result<Vec<(usize, BadLine)>> {
    let days = src.days();
    let json = serde_json::to_vec(mine).map_err(|e| Error::Comm(format!("bad lines: {e}")))?;
    let all = comm.all_gather_v(&json)?;
    let mut out = Vec::new();
    for r in 0..counts.p {
        let part: Vec<(usize, u64, String)> = serde_json::from_slice(all.from_rank(r))
            .map_err(|e| Error::Comm(format!("bad lines of rank {r}: {e}")))?;
        for (d, line, reason) in part {
            if d >= days {
                return Err(Error::Comm(format!("bad line of rank {r} on day {d}")));
            }
            let before: u64 = (0..r).map(|q| counts.at(d, q, days)[1]).sum();
            out.push((
                r,
                d,
                BadLine {
                    path: src.day_path(d).to_path_buf(),
                    line: before + line + 1,
                    reason,
                },
            ));
        }
    }
    out.sort_by_key(|(_, d, b)| (*d, b.line));
    out.truncate(FIRST_BAD);
    Ok(out.into_iter().map(|(r, _, b)| (r, b)).collect())
}

/// What the write pass writes.
struct Plan<'a> {
    out: &'a Path,
    n: u64,
    nd: usize,
    spec: &'a ModelSpec,
    header: &'a LogHeader,
    day_offsets: &'a [u64],
    nnz: &'a [u64],
    distinct: &'a [u64],
    /// Per table: whether it has `/tables/<t>/weights`.
    weighted: &'a [bool],
}

/// Index of each dataset in the offset table: dense, labels, then per table its
/// offsets and its ids.
const DENSE: usize = 0;
const LABELS: usize = 1;
fn table_offsets(t: usize) -> usize {
    2 + 2 * t
}
fn table_ids(t: usize) -> usize {
    3 + 2 * t
}
/// Table `t`'s weights, after every table's offsets and ids (of `tables`).
fn table_weights(tables: usize, t: usize) -> usize {
    2 + 2 * tables + t
}

/// Rank 0: the partial file with every dataset at its final shape, contiguous and
/// allocated now, the attributes and `/day_offsets`; returns the byte offset of each
/// dataset (in the order of [`table_offsets`] / [`table_ids`]).
fn create_layout(tmp: &Path, plan: &Plan) -> Result<Vec<u64>> {
    let (n, nd) = (plan.n as usize, plan.nd);
    let f = h5(tmp, "create", crate::io::h5::create(tmp))?;
    let json = serde_json::to_string(plan.spec)
        .map_err(|e| Error::Config(format!("click log: spec to JSON: {e}")))?;
    let source = serde_json::to_string(&plan.header.source)
        .map_err(|e| Error::Config(format!("click log: source to JSON: {e}")))?;
    let mut attrs = vec![
        ("schema", Attr::Str(SCHEMA_V2.into())),
        ("spec_json", Attr::Str(json)),
        ("seed", Attr::U64(plan.header.seed)),
        ("examples", Attr::U64(plan.n)),
        ("source", Attr::Str(source)),
        ("format", Attr::Str(plan.header.format.clone())),
    ];
    if let Some(c) = &plan.header.columns {
        attrs.push(("columns", Attr::Str(c.clone())));
    }
    write_attrs(&f, tmp, &attrs)?;
    let nt = plan.spec.tables.len();
    let mut offs = vec![NO_OFFSET; 2 + 3 * nt];
    let dense;
    (dense, offs[DENSE]) = create_allocated::<f32>(&f, tmp, "dense", "/dense", (n, nd))?;
    let labels;
    (labels, offs[LABELS]) = create_allocated::<f32>(&f, tmp, "labels", "/labels", n)?;
    let days = h5(
        tmp,
        "/day_offsets",
        f.new_dataset::<u64>()
            .shape(plan.day_offsets.len())
            .create("day_offsets"),
    )?;
    h5(tmp, "/day_offsets", days.write(plan.day_offsets))?;
    h5(tmp, "/tables", f.create_group("tables"))?;
    for t in 0..plan.spec.tables.len() {
        let g = h5(
            tmp,
            format!("/tables/{t}"),
            f.create_group(&format!("tables/{t}")),
        )?;
        write_attrs(
            &g,
            tmp,
            &[("distinct_estimate", Attr::U64(plan.distinct[t]))],
        )?;
        let (on, idn) = (offsets_name(t), ids_name(t));
        // Both handles are held until the table is done.
        let _o;
        (_o, offs[table_offsets(t)]) = create_allocated::<u64>(&f, tmp, &on, &on, n + 1)?;
        let k = plan.nnz[t] as usize;
        let _ids;
        (_ids, offs[table_ids(t)]) = create_allocated::<u64>(&f, tmp, &idn, &idn, k)?;
        if plan.weighted[t] {
            let wn = weights_name(t);
            let _w;
            (_w, offs[table_weights(nt, t)]) = create_allocated::<f32>(&f, tmp, &wn, &wn, k)?;
        }
    }
    drop(dense);
    drop(labels);
    drop(days);
    h5(tmp, "close", f.close())?;
    Ok(offs)
}

/// Collective. Pass 2: rank 0 creates the file, every rank writes its segments
/// (`starts[d]`: the example and per-table id index where its share of day `d` starts;
/// `want[d]`: the counts pass 1 saw), rank 0 commits; agreed at every step, the
/// temporary removed on failure.
fn global_create_write_commit<C: Comm, S: ExampleSource>(
    comm: &C,
    src: &S,
    plan: &Plan,
    starts: &[(u64, Vec<u64>)],
    want: &[SegCount],
) -> Result<()> {
    let me = comm.rank();
    let tmp = temp_path(plan.out);
    let t = plan.spec.tables.len();
    let created = if me == 0 {
        create_layout(&tmp, plan)
    } else {
        Ok(vec![NO_OFFSET; 2 + 3 * t])
    };
    let result = comm.agree(created).and_then(|mut offs| {
        comm.broadcast(0, &mut offs)?;
        let file = comm.agree(PositionalFile::open(&tmp, offs))?;
        let written = (|| -> Result<()> {
            if me == 0 {
                for k in 0..t {
                    file.put(table_offsets(k), 0, &[0u64])?;
                }
            }
            for (d, (start, nnz0)) in starts.iter().enumerate() {
                let mut e = *start;
                let mut at = nnz0.clone();
                let mut seen = SegCount::new(t);
                src.for_each_block(d, &mut |b| {
                    check_signal("write")?;
                    check_block(b, plan.nd, plan.weighted)?;
                    seen.add(b);
                    // Past what pass 1 counted: stop before writing out of the range.
                    if seen.examples > want[d].examples
                        || seen.nnz.iter().zip(&want[d].nnz).any(|(a, b)| a > b)
                    {
                        return Err(changed(src.day_path(d), &want[d], &seen));
                    }
                    file.put(DENSE, e * plan.nd as u64, &b.dense)?;
                    file.put(LABELS, e, &b.labels)?;
                    for (k, keys) in b.keys.iter().enumerate() {
                        let base = at[k];
                        file.put_iter(
                            table_offsets(k),
                            e + 1,
                            keys.offsets[1..].iter().map(|&o| base + o as u64),
                        )?;
                        file.put(table_ids(k), base, &keys.ids)?;
                        if plan.weighted[k] {
                            file.put(table_weights(t, k), base, &b.weights[k])?;
                        }
                        at[k] += keys.ids.len() as u64;
                    }
                    e += b.n as u64;
                    Ok(())
                })?;
                if seen != want[d] {
                    return Err(changed(src.day_path(d), &want[d], &seen));
                }
            }
            file.sync()
        })();
        comm.agree(written)?;
        drop(file);
        let committed = if me == 0 {
            crate::io::outfile::commit(&tmp, plan.out)
        } else {
            Ok(())
        };
        comm.agree(committed)
    });
    if result.is_err() && me == 0 {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

fn changed(path: &Path, want: &SegCount, seen: &SegCount) -> Error {
    Error::input(
        path,
        format!(
            "changed while it was read: {} examples and {} lines in the first pass, {} and {} (so far) in the second",
            want.examples, want.lines, seen.examples, seen.lines
        ),
    )
}
