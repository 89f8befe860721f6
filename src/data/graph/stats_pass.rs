//! `inspect --stats`: the collective pass that computes [`super::stats`] over a
//! graph input, streamed and parallel over ranks.
//!
//! Every rank owns the contiguous block [`block_range`] of the rows and reads it in
//! chunks of about [`StatsOpts::chunk_arcs`] arcs, each cleaned (sorted, distinct, no
//! self-loop; the copy is skipped when a chunk already is) as `prepare --min-links 0`
//! cleans it. The sources:
//!
//! - **bv**: [`BvRows`], decoded again on each pass (the first pass decodes the whole
//!   stream and checks it against the properties);
//! - **tsv / mtx**: the edge list read whole on every rank, as `prepare` reads it, and
//!   the rank's block kept ([`MemoryRows`]); the graph has the nodes the reader says
//!   (`max id + 1`, or the matrix's larger side);
//! - **h5**: a prepared dataset's variant graph: every row's training arcs, and each
//!   test row whole (its visible and held-out arcs merged). A rank reads only its
//!   rows' ranges of `/train/indptr`, `/train/indices`, the test CSRs (and all of
//!   `/test/rows`, 4 bytes a test row), and checks what it reads (ids in range, rows
//!   sorted and distinct, monotone offsets, test rows empty in `/train` with a
//!   non-empty holdout disjoint from the fold); the transpose is not read.
//!
//! Passes:
//!
//! 1. **rows**: [`RowStats::add_chunk`] per chunk (out-degrees, locality, adjacent
//!    Jaccard), in-degrees into one `u64` per node (then all-reduced), and each arc's
//!    canonical pair key counted into `256 P` hash buckets (all-reduced too). Keys are
//!    kept in memory as long as they fit the budget.
//! 2. **reciprocity**: bucket `b` belongs to owner rank `b mod P`; its keys go there in
//!    pass `(b div P) mod k`, with `k` (a power of two, at most 256) the fewest passes
//!    in which every rank's keys to send, and every owner's keys to receive, stay
//!    within [`StatsOpts::key_budget_bytes`]. The bucket counts make that exact, and
//!    every rank computes the same `k`. With `k = 1` the keys kept from pass 1 are
//!    exchanged (no second read); otherwise each of the `k` passes reads the block
//!    again and sends only its buckets' keys (`all_to_all_v`). Owners sort what they
//!    receive and count the keys that occur twice ([`mutual_pairs`]); the counts are
//!    summed over ranks.
//! 3. **merge**: every rank's [`RowStats`] (histogram, counters, its first and last
//!    row) is all-gathered as `u64` words and merged in rank order, so every rank
//!    ends with the same [`GraphProfile`].
//!
//! The same numbers at any rank count, bit for bit: everything is an integer count
//! except the adjacent-Jaccard sum, which is accumulated here exactly (each pair's
//! `f64` similarity in fixed point with 90 fraction bits, where it is exact; the
//! sum as a `u128`) and replaces [`RowStats`]'s float sum, whose rounding would
//! depend on where the blocks start.
//!
//! Memory per rank: 8 bytes a node (in-degrees), the chunk being read (about
//! `chunk_arcs` arcs, a few copies), at most the key budget for the keys sent and as
//! much for the keys received in a pass, the `256 P` bucket counts, and for tsv/mtx
//! the whole edge list (8 bytes an arc, as `prepare`).
//!
//! Failures: every rank-local step that can fail (opening and checking the input,
//! each pass over it) ends in [`Comm::agree`] before the next collective, so one
//! rank's error (exit 2 for bad input, naming the file and line where the reader
//! gives it) stops every rank. A preemption signal stops a pass at the next chunk
//! (exit 1: nothing to save).

use super::dataset::{check_fold_disjoint, check_id_space, check_rows, read_meta};
use super::readers::{bv_info, read_mtx_pairs, read_tsv_pairs};
use super::rows::LocalRows;
use super::stats::{
    add_far_in, jaccard, mutual_pairs, pair_key, profile, sink_in_arcs, GraphProfile, RowStats,
};
use super::stream::sources::{BvRows, MemoryRows, RowSource};
use crate::blocks::block_range;
use crate::comm::{prefix_offsets, Comm, Received};
use crate::error::{Error, Result};
use crate::io::h5::dataset_len;
use rayon::prelude::*;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// How the graph of `inspect --stats G` is stored (the data layer's own copy of the
/// command line's `GraphFormat`, which `app` converts: `data` does not import `cli`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GraphFormat {
    /// WebGraph BV: G is the basename (G.graph + G.properties).
    Bv,
    /// SNAP-style edge list, `src dst` per line, `#`/`%` comments, optional .gz.
    Tsv,
    /// Matrix Market coordinate file (1-based ids).
    Mtx,
    /// A prepared dataset: the variant's graph (training rows and test rows whole).
    H5,
}

impl GraphFormat {
    /// The name the command line uses.
    pub fn name(self) -> &'static str {
        match self {
            GraphFormat::Bv => "bv",
            GraphFormat::Tsv => "tsv",
            GraphFormat::Mtx => "mtx",
            GraphFormat::H5 => "h5",
        }
    }
}

/// Buffer sizes of the pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatsOpts {
    /// Arcs per chunk of rows read at once (a chunk holds at least one row).
    pub chunk_arcs: usize,
    /// The most bytes of pair keys (8 bytes an arc) a rank sends in one reciprocity
    /// pass, and the most an owner receives; more keys take more passes over the input.
    pub key_budget_bytes: u64,
}

impl Default for StatsOpts {
    /// 16M arcs per chunk (64 MB of targets) and 256 MB of keys per pass.
    fn default() -> Self {
        Self {
            chunk_arcs: 1 << 24,
            key_budget_bytes: 256 << 20,
        }
    }
}

impl StatsOpts {
    /// The defaults, or `TORUSREC_STATS_KEY_BYTES` (bytes, `64k`/`256M` style) and
    /// `TORUSREC_STATS_CHUNK_ARCS` when set (tests force several passes with them).
    pub fn from_env() -> Result<Self> {
        let mut o = Self::default();
        if let Ok(v) = std::env::var("TORUSREC_STATS_KEY_BYTES") {
            o.key_budget_bytes = crate::metrics::parse_bytes(&v)
                .ok()
                .filter(|&b| b > 0)
                .ok_or_else(|| {
                    Error::Config(format!(
                        "TORUSREC_STATS_KEY_BYTES={v:?}: expected a positive size such as 256M"
                    ))
                })?;
        }
        if let Ok(v) = std::env::var("TORUSREC_STATS_CHUNK_ARCS") {
            o.chunk_arcs = v
                .trim()
                .parse::<usize>()
                .ok()
                .filter(|&n| n > 0)
                .ok_or_else(|| {
                    Error::Config(format!(
                        "TORUSREC_STATS_CHUNK_ARCS={v:?}: expected a positive number of arcs"
                    ))
                })?;
        }
        Ok(o)
    }
}

/// The profile and how it was computed.
#[derive(Debug, Clone, PartialEq)]
pub struct StatsRun {
    pub profile: GraphProfile,
    /// Passes over the input that exchanged reciprocity keys (1 when the keys of the
    /// first pass fit the budget and no second read was needed: then `reread` is false).
    pub key_passes: usize,
    /// Whether the reciprocity passes read the input again.
    pub reread: bool,
    /// This rank's seconds in the rows pass, the reciprocity passes and the merge.
    pub seconds: [f64; 3],
}

/// How `path` is stored: `format` when given; else `.h5` is a prepared dataset, a
/// path with `path.graph` beside it a BV basename, `.mtx` (or `.mtx.gz`) Matrix
/// Market, anything else an edge list. Without `format`, a path that names no file
/// (and no BV graph) is an input error.
pub fn resolve_format(path: &Path, format: Option<GraphFormat>) -> Result<GraphFormat> {
    if let Some(f) = format {
        return Ok(f);
    }
    let name = path.to_string_lossy();
    let ends = |s: &str| name.to_ascii_lowercase().ends_with(s);
    let mut graph = path.as_os_str().to_owned();
    graph.push(".graph");
    if ends(".h5") {
        Ok(GraphFormat::H5)
    } else if Path::new(&graph).is_file() {
        Ok(GraphFormat::Bv)
    } else if !path.exists() {
        Err(Error::input(
            path,
            "no such file (nor a BV graph with this basename: no .graph file)",
        ))
    } else if ends(".mtx") || ends(".mtx.gz") {
        Ok(GraphFormat::Mtx)
    } else {
        Ok(GraphFormat::Tsv)
    }
}

/// Collective: every rank must call, with the same arguments. The statistics of the
/// graph `path` stored as `format`, with the default buffer sizes; every rank
/// returns the same profile.
pub fn global_graph_profile<C: Comm>(
    comm: &C,
    path: &Path,
    format: GraphFormat,
) -> Result<GraphProfile> {
    global_graph_profile_with(comm, path, format, &StatsOpts::default()).map(|r| r.profile)
}

/// Collective: every rank must call, with the same arguments. [`global_graph_profile`]
/// with explicit buffer sizes, and how the passes went.
pub fn global_graph_profile_with<C: Comm>(
    comm: &C,
    path: &Path,
    format: GraphFormat,
    opts: &StatsOpts,
) -> Result<StatsRun> {
    let _phase = comm.stats().phase("stats");
    let (rank, size) = (comm.rank(), comm.size());
    match format {
        GraphFormat::Bv => {
            let info = comm.agree(bv_info(path))?;
            let src = BvRows::new(path, &info, rank, size);
            global_profile_of(comm, &src, info.nodes, path, opts)
        }
        GraphFormat::Tsv | GraphFormat::Mtx => {
            let read = if format == GraphFormat::Tsv {
                read_tsv_pairs(path)
            } else {
                read_mtx_pairs(path)
            };
            let edges = comm.agree(read)?;
            let (info, rows) = edges.into_block(rank, size);
            global_profile_of(comm, &MemoryRows(rows), info.nodes, path, opts)
        }
        GraphFormat::H5 => {
            let src = comm.agree(H5Rows::open(path, rank, size))?;
            let nodes = src.nodes;
            global_profile_of(comm, &src, nodes, path, opts)
        }
    }
}

/// Stop a pass when a preemption signal arrived (or `TORUSREC_PREEMPT_IN=stats`):
/// statistics save nothing, so the run ends with exit 1. Checked per chunk; every
/// rank then meets the others at the pass's agreement.
fn check_signal() -> Result<()> {
    crate::ckpt::signals::check_preempted("stats", || {
        "signal received during inspect --stats; statistics save nothing to resume (exit 1)".into()
    })
}

/// Fraction bits of the exact Jaccard sum. A similarity `i / u` of two rows with
/// `u <= 2^33` is, as an `f64`, at least `2^-33` when non-zero, so its last mantissa
/// bit is worth at least `2^-85`: it is an integer times `2^-90`, and fewer than 2^32
/// pairs sum to less than `2^122`.
const JACCARD_FRAC_BITS: i32 = 90;

/// A similarity as an exact fixed-point integer.
fn fixed(j: f64) -> u128 {
    (j * 2f64.powi(JACCARD_FRAC_BITS)) as u128
}

/// The fixed-point sum as the nearest `f64`.
fn unfixed(s: u128) -> f64 {
    s as f64 / 2f64.powi(JACCARD_FRAC_BITS)
}

/// The fixed-point similarity of two adjacent rows (0 unless both are non-empty, as
/// [`RowStats`] counts pairs).
fn pair_jaccard(a: &[u32], b: &[u32]) -> u128 {
    if a.is_empty() || b.is_empty() {
        0
    } else {
        fixed(jaccard(a, b))
    }
}

/// Hash buckets per rank: a bucket's keys go to one owner in one pass, so this is
/// also the most passes.
const SUBS: usize = 256;

/// The bucket of a pair key among `buckets`.
#[inline]
fn bucket_of(key: u64, buckets: usize) -> usize {
    ((crate::rng::mix64(key) as u128 * buckets as u128) >> 64) as usize
}

/// The fewest passes `k` (a power of two, at most [`SUBS`]) in which this rank sends
/// at most `budget` keys in every pass and every owner receives at most `budget`,
/// from this rank's bucket counts `local` and everyone's `global` (bucket `b`: owner
/// `b % size`, pass `(b / size) % k`). The sets of a pass at `2k` are subsets of
/// those at `k`, so a `k` that fits here fits every rank whose own answer is smaller.
fn passes_needed(local: &[u64], global: &[u64], size: usize, budget: u64) -> usize {
    let mut k = 1;
    loop {
        let mut fits = true;
        for j in 0..k {
            let subs = || (j..SUBS).step_by(k);
            let send: u64 = subs()
                .map(|s| local[s * size..(s + 1) * size].iter().sum::<u64>())
                .sum();
            let recv_max = (0..size)
                .map(|r| subs().map(|s| global[s * size + r]).sum::<u64>())
                .max()
                .unwrap_or(0);
            if send > budget || recv_max > budget {
                fits = false;
                break;
            }
        }
        if fits || k == SUBS {
            return k;
        }
        k *= 2;
    }
}

/// Collective: every rank must call. The passes of the module doc over `src`, this
/// rank's block of a graph of `nodes` nodes read from `path` (for messages): the
/// node arrays ([`global_node_array`]), pass 1 ([`local_first_pass`]), pass 2
/// ([`global_mutual_pairs`]) and the merge of the row statistics
/// ([`global_merge_rows`]).
fn global_profile_of<C: Comm, S: RowSource>(
    comm: &C,
    src: &S,
    nodes: u64,
    path: &Path,
    opts: &StatsOpts,
) -> Result<StatsRun> {
    let size = comm.size();
    let t0 = Instant::now();
    let n = usize::try_from(nodes)
        .map_err(|_| Error::input(path, format!("{nodes} nodes do not fit this machine")))?;
    let mut in_degree = global_node_array(comm, path, nodes, n, "in-degrees")?;
    let mut far_in = global_node_array(comm, path, nodes, n, "far in-links")?;

    // Pass 1: rows, in-degrees, bucket counts; keys kept while they fit the budget.
    let buckets = SUBS * size;
    let budget = (opts.key_budget_bytes / 8).max(1);
    let pass1 = local_first_pass(src, opts, size, budget, &mut in_degree, &mut far_in);
    let mut first = comm.agree(pass1)?;
    comm.all_reduce_sum(&mut in_degree);
    comm.all_reduce_sum(&mut far_in);
    let mut global_hist = first.local_hist.clone();
    comm.all_reduce_sum(&mut global_hist);
    let t1 = Instant::now();

    // Pass 2: reciprocity keys to their owners, in as few passes as the budget allows.
    let k_local = passes_needed(&first.local_hist, &global_hist, size, budget) as u64;
    let k = comm.all_reduce_max(k_local) as usize;
    let all_kept = comm.all_reduce_max(u64::from(first.kept.is_none())) == 0;
    let reread = !(k == 1 && all_kept);
    let mutual = global_mutual_pairs(comm, src, path, opts, &mut first, buckets, k, reread)?;
    let mut m = [mutual];
    comm.all_reduce_sum(&mut m);
    let t2 = Instant::now();

    // Merge: every rank's row statistics, in rank order, on every rank.
    let rows = global_merge_rows(comm, &first.st, first.exact, nodes, path)?;
    let mut sink = [sink_in_arcs(first.empty.iter().copied(), &in_degree)];
    comm.all_reduce_sum(&mut sink);
    let profile = profile(&rows, &in_degree, &far_in, m[0], sink[0]);
    let t3 = Instant::now();
    Ok(StatsRun {
        profile,
        key_passes: k,
        reread,
        seconds: [
            (t1 - t0).as_secs_f64(),
            (t2 - t1).as_secs_f64(),
            (t3 - t2).as_secs_f64(),
        ],
    })
}

/// Collective: every rank must call. A zeroed array of one u64 per node (`what`
/// names it in the error), allocated on every rank or on none.
fn global_node_array<C: Comm>(
    comm: &C,
    path: &Path,
    nodes: u64,
    n: usize,
    what: &str,
) -> Result<Vec<u64>> {
    let mut v: Vec<u64> = Vec::new();
    let alloc = v.try_reserve_exact(n).map_err(|_| {
        Error::input(
            path,
            format!(
                "cannot allocate the {what} of {} nodes ({} per rank)",
                crate::metrics::group(nodes),
                crate::metrics::human_bytes(8 * nodes)
            ),
        )
    });
    comm.agree(alloc)?;
    v.resize(n, 0);
    Ok(v)
}

/// What pass 1 found on this rank: the row statistics and the exact Jaccard sum of
/// its consecutive rows, the arcs of each key bucket, and the reciprocity keys by
/// owner while they fit the budget (`None` once they did not).
struct FirstPass {
    st: RowStats,
    exact: u128,
    local_hist: Vec<u64>,
    kept: Option<Vec<Vec<u64>>>,
    /// This rank's rows without out-links.
    empty: Vec<u64>,
}

/// Pass 1 (rank-local): rows, in-degrees and far in-links (into the node arrays),
/// bucket counts of the `SUBS * size` buckets; keys kept while `budget` keys fit.
fn local_first_pass<S: RowSource>(
    src: &S,
    opts: &StatsOpts,
    size: usize,
    budget: u64,
    in_degree: &mut [u64],
    far_in: &mut [u64],
) -> Result<FirstPass> {
    let buckets = SUBS * size;
    let (blo, _) = src.block();
    let mut st = RowStats::new(blo);
    let mut exact: u128 = 0;
    let mut local_hist = vec![0u64; buckets];
    let mut kept: Option<Vec<Vec<u64>>> = Some(vec![Vec::new(); size]);
    let mut kept_n = 0u64;
    let mut empty = Vec::new();
    src.for_each_chunk(opts.chunk_arcs, &mut |mut rows| {
        check_signal()?;
        rows.local_clean_if_needed();
        empty.extend(
            (0..rows.num_rows())
                .filter(|&i| rows.row(i).is_empty())
                .map(|i| rows.lo + i as u64),
        );
        if rows.num_rows() > 0 {
            if let Some(prev) = &st.last_row {
                exact += pair_jaccard(prev, rows.row(0));
            }
            exact += (1..rows.num_rows())
                .into_par_iter()
                .map(|i| pair_jaccard(rows.row(i - 1), rows.row(i)))
                .sum::<u128>();
        }
        add_far_in(&rows, far_in);
        st.add_chunk(&rows, in_degree, |u, v| {
            let key = pair_key(u, v);
            let b = bucket_of(key, buckets);
            local_hist[b] += 1;
            if let Some(k) = kept.as_mut() {
                if kept_n < budget {
                    k[b % size].push(key);
                    kept_n += 1;
                } else {
                    kept = None;
                }
            }
        });
        Ok(())
    })?;
    Ok(FirstPass {
        st,
        exact,
        local_hist,
        kept,
        empty,
    })
}

/// Collective: every rank must call. Pass 2: this rank's mutual pairs among the
/// reciprocity keys it owns. Without `reread` the keys pass 1 kept are sent at once;
/// otherwise the graph is read again `k` times, round `j` sending the keys of every
/// `k`-th group of buckets from `j` ([`local_round_keys`]).
#[allow(clippy::too_many_arguments)]
fn global_mutual_pairs<C: Comm, S: RowSource>(
    comm: &C,
    src: &S,
    path: &Path,
    opts: &StatsOpts,
    first: &mut FirstPass,
    buckets: usize,
    k: usize,
    reread: bool,
) -> Result<u64> {
    let size = comm.size();
    let mut mutual = 0u64;
    let mut out = Received::default();
    if !reread {
        let parts = first.kept.take().unwrap_or_default();
        let counts: Vec<usize> = parts.iter().map(Vec::len).collect();
        let mut send: Vec<u64> = if size == 1 {
            parts.into_iter().next().unwrap_or_default()
        } else {
            let mut s = Vec::with_capacity(counts.iter().sum());
            for p in parts {
                s.extend_from_slice(&p);
            }
            s
        };
        comm.all_to_all_v_move(&mut send, &counts, &mut out)?;
        drop(send);
        out.data.par_sort_unstable();
        mutual += mutual_pairs(&mut out.data);
    } else {
        drop(first.kept.take());
        for j in 0..k {
            let counts: Vec<usize> = (0..size)
                .map(|r| {
                    (j..SUBS)
                        .step_by(k)
                        .map(|s| first.local_hist[s * size + r] as usize)
                        .sum()
                })
                .collect();
            let round = local_round_keys(src, path, opts, &counts, buckets, size, (j, k));
            let mut send = comm.agree(round)?;
            comm.all_to_all_v_move(&mut send, &counts, &mut out)?;
            drop(send);
            out.data.par_sort_unstable();
            mutual += mutual_pairs(&mut out.data);
        }
    }
    drop(out);
    Ok(mutual)
}

/// Round `j` of `k` of pass 2's rereads (rank-local): the keys of this rank's arcs
/// whose bucket group is `j` modulo `k`, by owner (`counts[r]` for rank `r`, from
/// pass 1's bucket counts). Other arcs than pass 1's are an input error.
fn local_round_keys<S: RowSource>(
    src: &S,
    path: &Path,
    opts: &StatsOpts,
    counts: &[usize],
    buckets: usize,
    size: usize,
    (j, k): (usize, usize),
) -> Result<Vec<u64>> {
    let offs = prefix_offsets(counts);
    let mut send = vec![0u64; offs[size]];
    let mut at = offs[..size].to_vec();
    let changed = || {
        Error::input(
            path,
            "changed while it was read: a pass saw other arcs than the first",
        )
    };
    src.for_each_chunk(opts.chunk_arcs, &mut |mut rows| {
        check_signal()?;
        rows.local_clean_if_needed();
        for i in 0..rows.num_rows() {
            let u = (rows.lo + i as u64) as u32;
            for &v in rows.row(i) {
                let key = pair_key(u, v);
                let b = bucket_of(key, buckets);
                if (b / size) % k == j {
                    let r = b % size;
                    if at[r] == offs[r + 1] {
                        return Err(changed());
                    }
                    send[at[r]] = key;
                    at[r] += 1;
                }
            }
        }
        Ok(())
    })?;
    if (0..size).all(|r| at[r] == offs[r + 1]) {
        Ok(send)
    } else {
        Err(changed())
    }
}

/// Collective: every rank must call. Every rank's row statistics `st` (with its exact
/// Jaccard sum), merged in rank order on every rank; they must cover the graph's
/// `nodes` rows.
fn global_merge_rows<C: Comm>(
    comm: &C,
    st: &RowStats,
    exact: u128,
    nodes: u64,
    path: &Path,
) -> Result<RowStats> {
    let size = comm.size();
    let all = comm.all_gather_v(&encode(st, exact))?;
    let mut merged: Option<(RowStats, u128)> = None;
    for r in 0..size {
        let (part, part_exact) = decode(all.from_rank(r))
            .map_err(|e| Error::Comm(format!("row statistics of rank {r}: {e}")))?;
        merged = Some(match merged {
            None => (part, part_exact),
            Some((acc, acc_exact)) => {
                // The pair across the boundary, exactly as `merge` counts it.
                let boundary = match (&acc.last_row, &part.first_row) {
                    (Some(a), Some(b)) if acc.lo < acc.hi && part.lo < part.hi => {
                        pair_jaccard(a, b)
                    }
                    _ => 0,
                };
                (acc.merge(part), acc_exact + part_exact + boundary)
            }
        });
    }
    let (mut rows, exact) = merged.unwrap_or((RowStats::new(0), 0));
    if rows.hi != nodes {
        return Err(Error::Check(format!(
            "{}: the ranks' blocks cover rows {}..{}, not the graph's {nodes}",
            path.display(),
            rows.lo,
            rows.hi
        )));
    }
    rows.jaccard_sum = unfixed(exact);
    Ok(rows)
}

/// Marks a missing first or last row in [`encode`].
const NO_ROW: u64 = u64::MAX;

/// A rank's row statistics (and its exact Jaccard sum) as `u64` words for the
/// all-gather.
fn encode(st: &RowStats, exact: u128) -> Vec<u64> {
    let mut w = vec![st.lo, st.hi, st.arcs];
    w.extend_from_slice(&st.gap_counts);
    w.extend_from_slice(&st.gap_log2);
    w.push(st.jaccard_sum.to_bits());
    w.push(st.jaccard_pairs);
    w.push(st.far_sources);
    w.push(exact as u64);
    w.push((exact >> 64) as u64);
    w.push(st.out_hist.len() as u64);
    for (&d, &c) in &st.out_hist {
        w.push(d);
        w.push(c);
    }
    for row in [&st.first_row, &st.last_row] {
        match row {
            None => w.push(NO_ROW),
            Some(r) => {
                w.push(r.len() as u64);
                w.extend(r.iter().map(|&t| t as u64));
            }
        }
    }
    w
}

/// The inverse of [`encode`].
fn decode(w: &[u64]) -> std::result::Result<(RowStats, u128), String> {
    let mut at = 0usize;
    let mut take = |n: usize| -> std::result::Result<&[u64], String> {
        let s = at
            .checked_add(n)
            .and_then(|end| w.get(at..end))
            .ok_or_else(|| format!("{} words, truncated at {at}", w.len()))?;
        at += n;
        Ok(s)
    };
    let head = take(3)?;
    let mut st = RowStats::new(head[0]);
    st.hi = head[1];
    st.arcs = head[2];
    let n = st.gap_counts.len();
    st.gap_counts.copy_from_slice(take(n)?);
    let n = st.gap_log2.len();
    st.gap_log2.copy_from_slice(take(n)?);
    let j = take(6)?;
    st.jaccard_sum = f64::from_bits(j[0]);
    st.jaccard_pairs = j[1];
    st.far_sources = j[2];
    let exact = (j[3] as u128) | ((j[4] as u128) << 64);
    let hist_len = usize::try_from(j[5]).map_err(|_| "histogram length".to_string())?;
    let hist_words = hist_len
        .checked_mul(2)
        .ok_or_else(|| "histogram length".to_string())?;
    for pair in take(hist_words)?.chunks_exact(2) {
        st.out_hist.insert(pair[0], pair[1]);
    }
    let mut rows = [None, None];
    for row in rows.iter_mut() {
        let len = take(1)?[0];
        if len != NO_ROW {
            let len = usize::try_from(len).map_err(|_| "row length".to_string())?;
            *row = Some(take(len)?.iter().map(|&t| t as u32).collect());
        }
    }
    let [first, last] = rows;
    st.first_row = first;
    st.last_row = last;
    if at != w.len() {
        return Err(format!("{} words, {} left over", w.len(), w.len() - at));
    }
    Ok((st, exact))
}

/// A prepared dataset's variant graph, the rows of one block: each row's training
/// arcs, or for a test row its visible and held-out arcs merged. Opened and checked
/// once; every pass reads the block's ranges again.
struct H5Rows {
    path: PathBuf,
    nodes: u64,
    lo: u64,
    hi: u64,
    /// `/train/indptr[lo..=hi]` (offsets into the whole `/train/indices`).
    train_ip: Vec<u64>,
    /// The test rows in `lo..hi`, and `/test/{fold,holdout}/indptr` over them (one more).
    test_rows: Vec<u32>,
    fold_ip: Vec<u64>,
    hold_ip: Vec<u64>,
}

/// Check a range `ip` of a dataset's `indptr` (entries `first..first + ip.len()` of
/// `total`): never decreasing, at most `nnz`, 0 at entry 0 and `nnz` at the last.
fn check_ip_range(
    path: &Path,
    name: &str,
    ip: &[u64],
    first: u64,
    total: u64,
    nnz: u64,
) -> Result<()> {
    let ds = format!("{name}/indptr");
    if let Some(i) = ip.windows(2).position(|w| w[0] > w[1]) {
        return Err(Error::layout(
            path,
            &ds,
            format!(
                "decreases at entry {} ({} after {})",
                first + i as u64 + 1,
                ip[i + 1],
                ip[i]
            ),
        ));
    }
    if let Some(&m) = ip.last().filter(|&&m| m > nnz) {
        return Err(Error::layout(
            path,
            &ds,
            format!("offset {m} beyond the {nnz} entries of {name}/indices"),
        ));
    }
    if first == 0 && ip.first().is_some_and(|&x| x != 0) {
        return Err(Error::layout(
            path,
            &ds,
            format!("starts at {}, expected 0", ip[0]),
        ));
    }
    if first + ip.len() as u64 == total && ip.last().is_some_and(|&x| x != nnz) {
        return Err(Error::layout(
            path,
            &ds,
            format!(
                "ends at {}, but {name}/indices has {nnz} entries",
                ip[ip.len() - 1]
            ),
        ));
    }
    Ok(())
}

impl H5Rows {
    /// Rank `rank` of `size`'s block of the dataset `path`, its offsets read and checked.
    fn open(path: &Path, rank: usize, size: usize) -> Result<Self> {
        let f = crate::io::h5::open_h5(path)?;
        if f.attr("format").is_err() {
            return Err(Error::input(
                path,
                "not a torusrec dataset: an HDF5 file without the format attribute that prepare writes",
            ));
        }
        let meta = read_meta(&f, path)?;
        check_id_space(path, &meta)?;
        if meta.num_rows != meta.num_cols {
            return Err(Error::layout(
                path,
                "/ attribute num_cols",
                format!(
                    "{} columns for {} rows: a variant graph is square",
                    meta.num_cols, meta.num_rows
                ),
            ));
        }
        let nodes = meta.num_rows;
        let (lo, hi) = block_range(nodes, size, rank);
        let range = |name: &str, total: u64, a: u64, b: u64| -> Result<Vec<u64>> {
            let ds = format!("{name}/indptr");
            let len = dataset_len(&f, path, &ds)?;
            if len != total + 1 {
                return Err(Error::layout(
                    path,
                    &ds,
                    format!("{len} entries, expected {}", total + 1),
                ));
            }
            let nnz = dataset_len(&f, path, &format!("{name}/indices"))?;
            let ip = crate::io::h5::read_range::<u64>(&f, path, &ds, a, b + 1)?;
            check_ip_range(path, name, &ip, a, total + 1, nnz)?;
            Ok(ip)
        };
        let train_ip = range("train", nodes, lo, hi)?;
        let num_test = dataset_len(&f, path, "test/rows")?;
        let all_tests = crate::io::h5::read_range::<u32>(&f, path, "test/rows", 0, num_test)?;
        let trained_tests = super::dataset::trains_test_rows(&f, path)?;
        super::dataset::check_test_rows(path, &all_tests, false, 0, nodes, |r| {
            // Only this block's rows are known here; the others' owners check theirs.
            let r = r as u64;
            !trained_tests
                && r >= lo
                && r < hi
                && train_ip[(r - lo) as usize + 1] != train_ip[(r - lo) as usize]
        })?;
        let ta = all_tests.partition_point(|&r| (r as u64) < lo);
        let tb = all_tests.partition_point(|&r| (r as u64) < hi);
        let test_rows = all_tests[ta..tb].to_vec();
        drop(all_tests);
        let fold_ip = range("test/fold", num_test, ta as u64, tb as u64)?;
        let hold_ip = range("test/holdout", num_test, ta as u64, tb as u64)?;
        if let Some(i) = hold_ip.windows(2).position(|w| w[0] == w[1]) {
            return Err(Error::layout(
                path,
                "test/holdout/indices",
                format!("test row {} has no held-out arc", test_rows[i]),
            ));
        }
        Ok(Self {
            path: path.to_path_buf(),
            nodes,
            lo,
            hi,
            train_ip,
            test_rows,
            fold_ip,
            hold_ip,
        })
    }

    /// Rows `a..b` of the block (local indices), test rows `ta..tb` among them, read
    /// from `f` and checked.
    fn read_chunk(
        &self,
        f: &hdf5::File,
        (a, b): (usize, usize),
        (ta, tb): (usize, usize),
    ) -> Result<LocalRows> {
        let path = &self.path;
        let read = |name: &str, ip: &[u64], first_row: u64| -> Result<(Vec<u64>, Vec<u32>)> {
            let (s, e) = (ip[0], ip[ip.len() - 1]);
            let idx = crate::io::h5::read_range::<u32>(f, path, &format!("{name}/indices"), s, e)?;
            let local: Vec<u64> = ip.iter().map(|&x| x - s).collect();
            check_rows(path, name, first_row, &local, &idx, self.nodes)?;
            Ok((local, idx))
        };
        let train = read("train", &self.train_ip[a..=b], self.lo + a as u64)?;
        if ta == tb {
            return Ok(LocalRows {
                lo: self.lo + a as u64,
                indptr: train.0,
                targets: train.1,
            });
        }
        let fold = read("test/fold", &self.fold_ip[ta..=tb], ta as u64)?;
        let hold = read("test/holdout", &self.hold_ip[ta..=tb], ta as u64)?;
        let part = |(ip, idx): &(Vec<u64>, Vec<u32>), i: usize| -> Vec<u32> {
            idx[ip[i] as usize..ip[i + 1] as usize].to_vec()
        };
        let mut t = ta;
        let mut rows = Vec::with_capacity(b - a);
        for i in a..b {
            let u = self.lo + i as u64;
            if t < tb && self.test_rows[t] as u64 == u {
                let (v, h) = (part(&fold, t - ta), part(&hold, t - ta));
                check_fold_disjoint(path, u as u32, &v, &h)?;
                let mut whole = [v, h].concat();
                whole.sort_unstable();
                rows.push(whole);
                t += 1;
            } else {
                rows.push(part(&train, i - a));
            }
        }
        Ok(LocalRows::from_rows(self.lo + a as u64, rows))
    }
}

impl RowSource for H5Rows {
    fn block(&self) -> (u64, u64) {
        (self.lo, self.hi)
    }

    fn for_each_chunk(
        &self,
        chunk_arcs: usize,
        f: &mut dyn FnMut(LocalRows) -> Result<()>,
    ) -> Result<()> {
        let file = crate::io::h5::open_h5(&self.path)?;
        let n = (self.hi - self.lo) as usize;
        let (mut a, mut ta) = (0usize, 0usize);
        while a < n {
            // The whole rows from `a` until about chunk_arcs arcs (at least one row).
            let (mut b, mut tb, mut arcs) = (a, ta, 0u64);
            while b < n && (b == a || arcs < chunk_arcs as u64) {
                arcs += self.train_ip[b + 1] - self.train_ip[b];
                if tb < self.test_rows.len() && self.test_rows[tb] as u64 == self.lo + b as u64 {
                    arcs += self.fold_ip[tb + 1] - self.fold_ip[tb] + self.hold_ip[tb + 1]
                        - self.hold_ip[tb];
                    tb += 1;
                }
                b += 1;
            }
            f(self.read_chunk(&file, (a, b), (ta, tb))?)?;
            a = b;
            ta = tb;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::graph::stats::of_rows;

    #[test]
    fn fixed_point_jaccard_is_exact() {
        for (i, u) in [(1u64, 3u64), (2, 7), (1, 1 << 33), (5, 5), (3, 1000)] {
            let j = i as f64 / u as f64;
            assert_eq!(unfixed(fixed(j)), j);
        }
        // Sums in any order agree.
        let js: Vec<u128> = (1..200u64).map(|u| fixed(1.0 / u as f64)).collect();
        let fwd: u128 = js.iter().sum();
        let rev: u128 = js.iter().rev().sum();
        assert_eq!(fwd, rev);
    }

    #[test]
    fn row_stats_round_trip_through_words() {
        let rows = LocalRows::from_rows(3, vec![vec![0, 1], vec![], vec![7, 9, 11]]);
        let mut st = RowStats::new(3);
        let mut indeg = vec![0u64; 12];
        st.add_chunk(&rows, &mut indeg, |_, _| {});
        let exact = (7u128 << 90) + 12345;
        let (back, e) = decode(&encode(&st, exact)).unwrap();
        assert_eq!(back, st);
        assert_eq!(e, exact);
        let empty = RowStats::new(5);
        assert_eq!(decode(&encode(&empty, 0)).unwrap().0, empty);
        assert!(decode(&encode(&st, 0)[..10]).is_err());
    }

    #[test]
    fn passes_shrink_each_pass_and_fit_the_budget() {
        let size = 3;
        let local: Vec<u64> = (0..SUBS * size).map(|b| (b % 7) as u64).collect();
        let global: Vec<u64> = local.iter().map(|&x| 3 * x).collect();
        let total: u64 = local.iter().sum();
        assert_eq!(passes_needed(&local, &global, size, u64::MAX), 1);
        let k = passes_needed(&local, &global, size, total / 5);
        assert!(k.is_power_of_two() && k > 4, "{k}");
        // Budget below one bucket: the most passes.
        assert_eq!(passes_needed(&local, &global, size, 1), SUBS);
    }

    #[test]
    fn formats_resolve_by_name_and_files() {
        let d = tempfile::tempdir().unwrap();
        let p = |n: &str| d.path().join(n);
        std::fs::write(p("g.graph"), b"").unwrap();
        std::fs::write(p("e.mtx"), b"").unwrap();
        std::fs::write(p("e.mtx.gz"), b"").unwrap();
        std::fs::write(p("e.txt"), b"").unwrap();
        assert_eq!(resolve_format(&p("x.h5"), None).unwrap(), GraphFormat::H5);
        assert_eq!(resolve_format(&p("g"), None).unwrap(), GraphFormat::Bv);
        assert_eq!(resolve_format(&p("e.mtx"), None).unwrap(), GraphFormat::Mtx);
        assert_eq!(
            resolve_format(&p("e.mtx.gz"), None).unwrap(),
            GraphFormat::Mtx
        );
        assert_eq!(resolve_format(&p("e.txt"), None).unwrap(), GraphFormat::Tsv);
        assert_eq!(
            resolve_format(&p("e.txt"), Some(GraphFormat::Bv)).unwrap(),
            GraphFormat::Bv
        );
        let e = resolve_format(&p("missing"), None).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().contains("missing"), "{e}");
    }

    /// Thread ranks, tiny chunks and budgets: the same profile as the in-memory
    /// reference at every rank count and number of passes.
    #[test]
    fn memory_rows_match_the_reference_at_any_rank_count() {
        let mut rng = crate::rng::SplitMix64::new(9);
        let n = 300u64;
        let mut pairs = Vec::new();
        for u in 0..n {
            for _ in 0..rng.below(12) {
                let v = (u + rng.below(40)) % n;
                pairs.push((u as u32, v as u32));
                if rng.below(3) == 0 {
                    pairs.push((v as u32, u as u32));
                }
            }
        }
        let mut whole = LocalRows::from_pairs(0, n, &pairs);
        whole.local_clean();
        let want = of_rows(&whole, n);
        let mut first: Option<GraphProfile> = None;
        for p in 1..=4 {
            for budget in [1u64 << 30, 800, 8] {
                let opts = StatsOpts {
                    chunk_arcs: 37,
                    key_budget_bytes: budget,
                };
                let got = crate::comm::threads::run(p, |c| {
                    let (lo, hi) = block_range(n, c.size(), c.rank());
                    let mine: Vec<(u32, u32)> = pairs
                        .iter()
                        .copied()
                        .filter(|&(s, _)| (s as u64) >= lo && (s as u64) < hi)
                        .collect();
                    let src = MemoryRows(LocalRows::from_pairs(lo, hi, &mine));
                    global_profile_of(&c, &src, n, Path::new("t"), &opts).unwrap()
                });
                for r in &got {
                    assert_eq!(r.profile, got[0].profile);
                }
                // Bit for bit the same at every rank count and budget.
                let first = first.get_or_insert_with(|| got[0].profile.clone());
                assert_eq!(&got[0].profile, first, "p {p} budget {budget}");
                let s = &got[0].profile.stats;
                assert_eq!(s.nodes, want.nodes);
                assert_eq!(s.arcs, want.arcs);
                assert_eq!(s.reciprocity, want.reciprocity, "p {p} budget {budget}");
                assert!((s.adjacent_jaccard - want.adjacent_jaccard).abs() < 1e-12);
                assert_eq!(s.out_degree, want.out_degree);
                assert_eq!(s.in_degree, want.in_degree);
                assert_eq!(s.gap_below, want.gap_below);
                assert_eq!(s.top1_in_share, want.top1_in_share);
                if budget == 8 {
                    assert!(got[0].key_passes > 1 && got[0].reread);
                }
                if p == 1 && budget == 1 << 30 {
                    assert_eq!(got[0].key_passes, 1);
                    assert!(!got[0].reread);
                }
            }
        }
    }
}
