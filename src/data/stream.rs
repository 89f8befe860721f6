//! Streaming variant filter, split and dataset writing: the same output as
//! [`global_prepare`](super::prepare::global_prepare) followed by
//! [`global_write_dataset`](super::dataset::global_write_dataset), bit for bit, with
//! memory near O(nodes) per rank plus bounded buffers.
//!
//! A [`RowSource`] hands out a rank's block of rows in chunks and can do so several
//! times (the synthetic generator re-runs: row `u` depends only on `(seed, u)`).
//! Passes over the owned block:
//!
//! 1. **degrees**: clean each chunk (sort, dedup, drop self-loops), count in-degrees
//!    (all-reduced, u64 per node) and keep the out-degree of each owned row (with
//!    K = 0 no in-degrees, and no pass at all for the generator, whose out-degrees
//!    come without its arcs);
//!    the kept mask is all-gathered and turned into the renumbering;
//! 2. **filter**: the length of each kept row after dropping arcs to removed nodes
//!    (no pass when every node is kept: the cleaned out-degrees), which decides the test rows (`global_select_test_rows_by`) and every size of
//!    the output, so rank 0 creates the file with its final shapes;
//! 3. **split + write**: each chunk is filtered, renumbered and split, and written
//!    straight into the contiguous HDF5 datasets; the column counts of the training
//!    arcs are accumulated;
//! 4. **transpose**: each rank owns a block of columns; it fills sub-blocks of at most
//!    `transpose_arcs` arcs by reading `/train` back from the partial file in chunks of
//!    rows (rows come in increasing order, so each column's rows come out sorted),
//!    and writes them.
//!
//! Writes: rank 0 creates every dataset contiguous with early allocation, so each has
//! a fixed byte offset in the file; the offsets are broadcast and all ranks then
//! `pwrite` their disjoint ranges at the same time ([`crate::io::positional`]; native little-endian u32/u64, as
//! HDF5 stores `new_dataset::<u32>()` on this platform). No HDF5 handle is open while
//! the ranks write, and the file is renamed into place only after every rank agrees.
//! This needs every rank to see the same file (one node, or a shared file system
//! with coherent writes to disjoint ranges).

use super::dataset::{create_layout, dataset_name, Storage, NUM_DATASETS};
use super::graph::{block_range, LocalRows};
use super::prepare::{global_renumber, global_select_test_rows_by, split_test_row, SplitMeta};
use super::readers::{bv_for_each_chunk, SourceInfo};
use super::webgraph_copy::CopyModel;
use super::webgraph_gen::{generate_degrees, generate_rows, HostLayout, WebGraphSpec};
use crate::comm::{prefix_offsets, Comm};
use crate::error::{Error, Result};
use crate::io::positional::{PositionalFile, NO_OFFSET};
use crate::io::signals::check_preempted;
use crate::outfile::temp_path;
use rayon::prelude::*;
use std::path::Path;
use std::time::Instant;

/// Buffer sizes of the streaming path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamOpts {
    /// Arcs per chunk of rows in passes 1-3 (a chunk holds at least one row).
    pub chunk_arcs: usize,
    /// Arcs of `/train_t` a rank builds in memory at once (at least one column).
    pub transpose_arcs: usize,
}

impl Default for StreamOpts {
    /// 16M arcs per chunk (64 MB of targets, a few copies live at once) and 64M arcs
    /// (256 MB) per transpose block.
    fn default() -> Self {
        Self {
            chunk_arcs: 1 << 24,
            transpose_arcs: 1 << 26,
        }
    }
}

/// Stop a pass when a preemption signal arrived: a prepare has no checkpoint, so it
/// ends with nothing written (the temporary is removed) and exit 1. Checked per chunk;
/// every rank then meets the others at the pass's agreement.
fn check_signal(pass: &str) -> Result<()> {
    check_preempted(pass, || {
        format!(
        "signal received during the {pass} pass of prepare; nothing was written (a prepare saves nothing to resume, exit 1)"
    )
    })
}

/// A rank's block of source rows, readable several times in chunks.
pub trait RowSource: Sync {
    /// The owned block `lo..hi` of source nodes.
    fn block(&self) -> (u64, u64);
    /// One pass over the block: `f` gets consecutive chunks of rows, in order,
    /// covering `lo..hi`, each of about `chunk_arcs` arcs (rows as given, not cleaned).
    fn for_each_chunk(
        &self,
        chunk_arcs: usize,
        f: &mut dyn FnMut(LocalRows) -> Result<()>,
    ) -> Result<()>;
    /// The out-degree of each row of the block after cleaning, when the source knows
    /// it without producing the arcs (then the rows it yields are already clean).
    fn clean_out_degrees(&self) -> Option<Vec<u32>> {
        None
    }
    /// True when the input's arc count is what the passes read (the generator's);
    /// otherwise `SourceInfo::arcs` is taken as given.
    fn counts_arcs(&self) -> bool {
        false
    }
}

/// Rows held in memory (the TSV and MTX readers: an edge list in arbitrary order
/// must be gathered whole before its rows exist, so these keep the reader that
/// materializes the block and stream only the later stages).
pub struct MemoryRows(pub LocalRows);

impl RowSource for MemoryRows {
    fn block(&self) -> (u64, u64) {
        (self.0.lo, self.0.lo + self.0.num_rows() as u64)
    }

    fn for_each_chunk(
        &self,
        chunk_arcs: usize,
        f: &mut dyn FnMut(LocalRows) -> Result<()>,
    ) -> Result<()> {
        let r = &self.0;
        let n = r.num_rows();
        let mut a = 0;
        while a < n {
            // The most whole rows within chunk_arcs arcs, at least one.
            let end = r.indptr[a] + chunk_arcs as u64;
            let b = a + r.indptr[a + 1..=n].partition_point(|&x| x <= end).max(1);
            let base = r.indptr[a];
            f(LocalRows {
                lo: r.lo + a as u64,
                indptr: r.indptr[a..=b].iter().map(|&x| x - base).collect(),
                targets: r.targets[base as usize..r.indptr[b] as usize].to_vec(),
            })?;
            a = b;
        }
        Ok(())
    }
}

/// A BV graph's rows of one block, decoded again on each pass. The first pass
/// decodes the whole stream and checks it (as `read_bv` does); later ones stop at
/// the end of the block.
pub struct BvRows {
    basename: std::path::PathBuf,
    info: SourceInfo,
    lo: u64,
    hi: u64,
    validated: std::sync::atomic::AtomicBool,
}

impl BvRows {
    /// Rank `rank` of `size`'s block of the graph `info` (from `bv_info`) describes.
    pub fn new(basename: &Path, info: &SourceInfo, rank: usize, size: usize) -> Self {
        let (lo, hi) = block_range(info.nodes, size, rank);
        Self {
            basename: basename.to_path_buf(),
            info: info.clone(),
            lo,
            hi,
            validated: std::sync::atomic::AtomicBool::new(false),
        }
    }
}

impl RowSource for BvRows {
    fn block(&self) -> (u64, u64) {
        (self.lo, self.hi)
    }

    fn for_each_chunk(
        &self,
        chunk_arcs: usize,
        f: &mut dyn FnMut(LocalRows) -> Result<()>,
    ) -> Result<()> {
        use std::sync::atomic::Ordering;
        let validate = !self.validated.load(Ordering::Relaxed);
        bv_for_each_chunk(
            &self.basename,
            &self.info,
            (self.lo, self.hi),
            validate,
            chunk_arcs,
            f,
        )?;
        self.validated.store(true, Ordering::Relaxed);
        Ok(())
    }
}

/// The generators' passes: rows `lo..hi` in chunks of `per` rows made by `gen(a, b)`
/// (CSR offsets and targets), handed to `f` in order. One producer thread generates
/// the next chunk while `f` handles the current one (a channel of one chunk: at most
/// three chunks alive).
fn produce_chunks(
    lo: u64,
    hi: u64,
    per: u64,
    f: &mut dyn FnMut(LocalRows) -> Result<()>,
    gen: impl Fn(u64, u64) -> (Vec<u64>, Vec<u32>) + Sync,
) -> Result<()> {
    std::thread::scope(|scope| {
        let (tx, rx) = std::sync::mpsc::sync_channel::<LocalRows>(1);
        let gen = &gen;
        scope.spawn(move || {
            let mut a = lo;
            while a < hi {
                let b = (a + per).min(hi);
                let (indptr, targets) = gen(a, b);
                if tx
                    .send(LocalRows {
                        lo: a,
                        indptr,
                        targets,
                    })
                    .is_err()
                {
                    return; // the consumer stopped on an error
                }
                a = b;
            }
        });
        for chunk in rx {
            f(chunk)?;
        }
        Ok(())
    })
}

/// The synthetic web graph generator's rows of one block, regenerated on each pass.
pub struct SyntheticRows {
    spec: WebGraphSpec,
    layout: HostLayout,
    seed: u64,
    lo: u64,
    hi: u64,
}

impl SyntheticRows {
    /// Rank `rank` of `size`'s block of `spec`'s nodes.
    pub fn new(spec: &WebGraphSpec, seed: u64, rank: usize, size: usize) -> Self {
        let (lo, hi) = block_range(spec.nodes, size, rank);
        Self {
            spec: spec.clone(),
            layout: HostLayout::new(spec, seed),
            seed,
            lo,
            hi,
        }
    }
}

impl RowSource for SyntheticRows {
    fn block(&self) -> (u64, u64) {
        (self.lo, self.hi)
    }

    /// The generator's rows are clean (sorted, distinct, no self-loop), and their
    /// lengths are the first draws of each row's generator.
    fn clean_out_degrees(&self) -> Option<Vec<u32>> {
        Some(generate_degrees(&self.spec, self.seed, self.lo, self.hi))
    }

    fn counts_arcs(&self) -> bool {
        true
    }

    fn for_each_chunk(
        &self,
        chunk_arcs: usize,
        f: &mut dyn FnMut(LocalRows) -> Result<()>,
    ) -> Result<()> {
        let per = ((chunk_arcs as f64 / self.spec.mean_degree()) as u64).max(1);
        produce_chunks(self.lo, self.hi, per, f, |a, b| {
            generate_rows(&self.spec, &self.layout, self.seed, a, b)
        })
    }
}

/// The copying model's rows of one block ([`super::webgraph_copy`]), regenerated on
/// each pass. The model (its host starts and every degree) is shared by the passes.
pub struct CopyingRows {
    model: std::sync::Arc<CopyModel>,
    lo: u64,
    hi: u64,
}

impl CopyingRows {
    /// Rank `rank` of `size`'s block of `model`'s nodes.
    pub fn new(model: std::sync::Arc<CopyModel>, rank: usize, size: usize) -> Self {
        let (lo, hi) = block_range(model.nodes, size, rank);
        Self { model, lo, hi }
    }
}

impl RowSource for CopyingRows {
    fn block(&self) -> (u64, u64) {
        (self.lo, self.hi)
    }

    /// The model's rows are clean and their lengths are its degrees.
    fn clean_out_degrees(&self) -> Option<Vec<u32>> {
        Some(self.model.degrees(self.lo, self.hi))
    }

    fn counts_arcs(&self) -> bool {
        true
    }

    fn for_each_chunk(
        &self,
        chunk_arcs: usize,
        f: &mut dyn FnMut(LocalRows) -> Result<()>,
    ) -> Result<()> {
        let mean = (self.model.arcs as f64 / self.model.nodes as f64).max(1.0);
        let per = ((chunk_arcs as f64 / mean) as u64).max(1);
        produce_chunks(self.lo, self.hi, per, f, |a, b| {
            self.model.generate_rows(a, b)
        })
    }
}

/// Renumbered arcs of a row (dropping arcs to removed nodes), appended to `out`.
fn renumber_into(row: &[u32], new_id: &[u32], out: &mut Vec<u32>) {
    out.extend(
        row.iter()
            .map(|&t| new_id[t as usize])
            .filter(|&v| v != u32::MAX),
    );
}

/// Rank 0 logs progress of a pass: rows done / total and arcs per second.
struct Progress {
    on: bool,
    what: &'static str,
    total_rows: u64,
    rows: u64,
    arcs: u64,
    t0: Instant,
    last: Instant,
}

impl Progress {
    fn new(on: bool, what: &'static str, total_rows: u64) -> Self {
        let now = Instant::now();
        Self {
            on,
            what,
            total_rows,
            rows: 0,
            arcs: 0,
            t0: now,
            last: now,
        }
    }

    fn add(&mut self, rows: u64, arcs: u64) {
        self.rows += rows;
        self.arcs += arcs;
        if self.on && (self.last.elapsed().as_secs_f64() >= 5.0 || self.rows == self.total_rows) {
            self.last = Instant::now();
            let s = self.t0.elapsed().as_secs_f64().max(1e-9);
            log::info!(
                "{}: rank 0 row {} / {}, {} arcs, {:.1} M arcs/s",
                self.what,
                self.rows,
                self.total_rows,
                self.arcs,
                self.arcs as f64 / s / 1e6
            );
        }
    }

    fn seconds(&self) -> f64 {
        self.t0.elapsed().as_secs_f64()
    }
}

/// Index of each dataset in the offset table: the u64 datasets, then the u32 ones.
const TRAIN_INDPTR: usize = 0;
const TRAIN_T_INDPTR: usize = 1;
const FOLD_INDPTR: usize = 2;
const HOLDOUT_INDPTR: usize = 3;
const NODE_IDS: usize = 4;
const TRAIN_INDICES: usize = 5;
const TRAIN_T_INDICES: usize = 6;
const TEST_ROWS: usize = 7;
const FOLD_INDICES: usize = 8;
const HOLDOUT_INDICES: usize = 9;

/// Columns per bucket of the transpose scatter: a bucket's fill pointers and the
/// output lines it writes stay in cache.
const BUCKET_SHIFT: u32 = 8;

/// Reusable buffers of [`local_scatter_columns`].
#[derive(Default)]
struct Scatter {
    counts: Vec<usize>,
    pairs: Vec<(u32, u32)>,
}

/// Appends the arcs into columns `ca..cb` of rows `r0, r0 + 1, ..` (row `i`'s sorted
/// targets are `idx[ip[i] - ip[0] .. ip[i + 1] - ip[0]]`) to their columns: the arc
/// `r -> c` goes to `buf[fill[c - ca]]`, which then advances. Rows are visited in
/// order, so each column receives its rows increasing. The arcs are first grouped by
/// bucket of `2^BUCKET_SHIFT` columns (a stable counting sort), so the scattered
/// writes of each group touch few cache lines.
fn local_scatter_columns(
    idx: &[u32],
    ip: &[u64],
    r0: u64,
    (ca, cb): (u32, u32),
    fill: &mut [u64],
    buf: &mut [u32],
    scratch: &mut Scatter,
) {
    let base = ip[0];
    let rows = ip.len() - 1;
    let range = |i: usize| -> (usize, usize) {
        let row = &idx[(ip[i] - base) as usize..(ip[i + 1] - base) as usize];
        let from = row.partition_point(|&c| c < ca);
        let to = from + row[from..].partition_point(|&c| c < cb);
        ((ip[i] - base) as usize + from, (ip[i] - base) as usize + to)
    };
    let nb = ((cb - ca) >> BUCKET_SHIFT) as usize + 1;
    let counts = &mut scratch.counts;
    counts.clear();
    counts.resize(nb + 1, 0);
    for i in 0..rows {
        let (f, t) = range(i);
        for &c in &idx[f..t] {
            counts[((c - ca) >> BUCKET_SHIFT) as usize + 1] += 1;
        }
    }
    for b in 0..nb {
        counts[b + 1] += counts[b];
    }
    let pairs = &mut scratch.pairs;
    pairs.clear();
    pairs.resize(counts[nb], (0, 0));
    for i in 0..rows {
        let (f, t) = range(i);
        let r = (r0 + i as u64) as u32;
        for &c in &idx[f..t] {
            let slot = &mut counts[((c - ca) >> BUCKET_SHIFT) as usize];
            pairs[*slot] = (c, r);
            *slot += 1;
        }
    }
    for &(c, r) in pairs.iter() {
        let slot = &mut fill[(c - ca) as usize];
        buf[*slot as usize] = r;
        *slot += 1;
    }
}

/// A kept row after the split: its training arcs, or (fold, holdout) of a test row.
type SplitRow = (Vec<u32>, Option<(Vec<u32>, Vec<u32>)>);

/// What the streaming run produced.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamReport {
    pub meta: SplitMeta,
    pub train_arcs: u64,
    pub test_rows: u64,
    pub fold_arcs: u64,
    pub holdout_arcs: u64,
    /// Seconds of each pass on this rank: degrees, filter, split+write, transpose.
    pub pass_seconds: [f64; 4],
}

/// Collective: every rank must call, with its block of `src`. Applies the variant
/// filter and split of docs/design.md and writes the dataset to `out` (through
/// `out.partial`, renamed when every rank succeeded). `info.arcs` is the input's arc
/// count, unless `src.counts_arcs()`: then it is the arcs the source yields.
/// The file equals the one `global_prepare` + `global_write_dataset` write.
pub fn global_prepare_stream<C: Comm, S: RowSource>(
    comm: &C,
    src: &S,
    info: &SourceInfo,
    min_links: u64,
    seed: u64,
    out: &Path,
    opts: &StreamOpts,
) -> Result<StreamReport> {
    global_prepare_stream_mapped(comm, src, info, None, min_links, seed, out, opts)
}

/// The original ids of a densely renumbered source (an edge list with a sparse id
/// space, `EdgeList::renumber_dense`): `ids[u]` is node `u`'s id in the input, and
/// `source_nodes` the input's id space (`max id + 1`), recorded as `source_nodes`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdMap {
    pub ids: Vec<u32>,
    pub source_nodes: u64,
}

/// Bytes one rank of [`global_prepare_stream`] holds for a graph of `nodes` nodes of
/// which it owns `block_rows`: the arrays by node (in-degrees when `min_links > 0`,
/// the renumbering, the kept mask, the column counts), the arrays by owned row, and
/// the chunk and transpose buffers of `opts`. Pure arithmetic, no overflow.
pub fn estimate_bytes(nodes: u64, block_rows: u64, min_links: u64, opts: &StreamOpts) -> u64 {
    let per_node = if min_links > 0 { 8 } else { 0 } + 4 + 1 + 8;
    let per_row = 4 + 4 + 8 + 1 + 1 + 8;
    let buffers = opts.chunk_arcs as u64 * 12 * 3 + opts.transpose_arcs as u64 * 4;
    nodes
        .saturating_mul(per_node)
        .saturating_add(block_rows.saturating_mul(per_row))
        .saturating_add(buffers)
}

/// Refuse (exit 2) a preparation whose [`estimate_bytes`] exceeds the node's memory
/// divided by the ranks on it, before anything sized by the input is allocated.
/// Rank-local and identical on every rank.
pub fn check_memory(
    name: &str,
    nodes: u64,
    ranks: usize,
    min_links: u64,
    opts: &StreamOpts,
) -> Result<()> {
    let block = nodes.div_ceil(ranks.max(1) as u64);
    let need = estimate_bytes(nodes, block, min_links, opts);
    match crate::node::mem_limit(None) {
        Some(limit) if need > limit => Err(Error::Input {
            path: name.into(),
            msg: format!(
                "{} nodes (K = {min_links}) need an estimated {} per rank to prepare, more than {} (the node's memory divided by the {} rank(s) on it)",
                crate::metrics::group(nodes),
                crate::metrics::human_bytes(need),
                crate::metrics::human_bytes(limit),
                crate::node::ranks_on_node()
            ),
        }),
        _ => Ok(()),
    }
}

/// What every pass reads: the rank's rows, the buffer sizes, and whether it logs
/// progress (rank 0).
struct Passes<'a, S> {
    src: &'a S,
    opts: &'a StreamOpts,
    log_on: bool,
}

/// [`global_prepare_stream`] of a renumbered source: `ids` (when given) maps its
/// nodes back to the input's ids for `/node_ids` and `source_nodes`. The passes of
/// the module doc: [`global_degrees`], then the renumbering
/// ([`global_renumber`](super::prepare::global_renumber)), [`global_filter_lengths`],
/// the output's layout ([`global_layout`]), [`local_split_write`] and
/// [`local_transpose`], each pass ending in an agreement of every rank.
#[allow(clippy::too_many_arguments)]
pub fn global_prepare_stream_mapped<C: Comm, S: RowSource>(
    comm: &C,
    src: &S,
    info: &SourceInfo,
    ids: Option<&IdMap>,
    min_links: u64,
    seed: u64,
    out: &Path,
    opts: &StreamOpts,
) -> Result<StreamReport> {
    let _phase = comm.stats().phase("prepare");
    let me = comm.rank();
    let p = comm.size();
    let pass = Passes {
        src,
        opts,
        log_on: me == 0,
    };
    comm.agree(check_memory(&info.name, info.nodes, p, min_links, opts))?;
    let n = usize::try_from(info.nodes)
        .map_err(|_| Error::input(&info.name, "too many nodes for this platform"))?;
    let (blo, bhi) = src.block();
    let block_rows = (bhi - blo) as usize;
    let orig = |u: u64| -> u64 { ids.map_or(u, |m| m.ids[u as usize] as u64) };

    // Pass 1: degrees, then the kept mask and the renumbering.
    let (in_deg, out_deg, raw_arcs, t_degrees) = global_degrees(comm, &pass, n, min_links)?;
    let mut info = info.clone();
    if src.counts_arcs() {
        let mut a = [raw_arcs];
        comm.all_reduce_sum(&mut a);
        info.arcs = a[0];
    }
    let local_kept: Vec<u8> = (0..block_rows)
        .map(|i| {
            u8::from(
                min_links == 0
                    || (out_deg[i] as u64 >= min_links && in_deg[blo as usize + i] >= min_links),
            )
        })
        .collect();
    drop(in_deg);
    let (new_id, num_kept) = global_renumber(comm, local_kept, n, &info.name, min_links)?;
    let row_lo = new_id[blo as usize..]
        .iter()
        .find(|&&v| v != u32::MAX)
        .map_or(num_kept, |&v| v as u64);

    // Pass 2: kept row lengths after the filter.
    let keep_all = num_kept == info.nodes;
    let (flen, node_ids, t_filter) =
        global_filter_lengths(comm, &pass, &new_id, &orig, out_deg, keep_all)?;
    let mut lay = global_layout(comm, &info, ids, &flen, row_lo, num_kept, min_links, seed)?;

    let tmp = temp_path(out);
    let created = if me == 0 {
        create_layout(&tmp, &lay.meta, &lay.shapes, Storage::Early)
    } else {
        Ok([NO_OFFSET; NUM_DATASETS])
    };
    let mut ds_offs = comm.agree(created)?;
    let result = (|| -> Result<[f64; 2]> {
        comm.broadcast(0, &mut ds_offs)?;
        let opened = PositionalFile::open(&tmp, ds_offs.to_vec()).map(|f| f.naming(dataset_name));
        let file = comm.agree(opened)?;

        // Pass 3: split and write the owned rows; count training arcs per column.
        let mut prog = Progress::new(pass.log_on, "split+write", block_rows as u64);
        let mut col_count = vec![0u64; num_kept as usize];
        let written = local_split_write(
            &pass,
            &file,
            &new_id,
            &node_ids,
            &lay,
            &mut col_count,
            &mut prog,
        );
        comm.agree(written)?;
        let t_write = prog.seconds();
        drop(new_id);
        drop(std::mem::take(&mut lay.is_test));
        drop(flen);
        drop(node_ids);

        // Pass 4: the transpose, by blocks of columns, reading /train back.
        comm.all_reduce_sum(&mut col_count);
        let (clo, chi) = block_range(num_kept, p, me);
        let mut prog = Progress::new(pass.log_on, "transpose", chi - clo);
        let transposed = local_transpose(&pass, &file, num_kept, (clo, chi), col_count, &mut prog);
        comm.agree(transposed)?;
        let t_transpose = prog.seconds();
        // The commit protocol (docs/design.md): durable before it is visible, then
        // the rename and the directory made durable.
        comm.agree(file.sync())?;
        drop(file);
        let renamed = if me == 0 {
            crate::outfile::commit(&tmp, out)
        } else {
            Ok(())
        };
        comm.agree(renamed)?;
        Ok([t_write, t_transpose])
    })();
    let [t_write, t_transpose] = match result {
        Ok(t) => t,
        Err(e) => {
            if me == 0 {
                let _ = std::fs::remove_file(&tmp);
            }
            return Err(e);
        }
    };
    let sizes = lay.sizes;
    let mut counts = [sizes[0], sizes[1], sizes[2], sizes[3]];
    comm.all_reduce_sum(&mut counts);
    Ok(StreamReport {
        meta: lay.meta,
        train_arcs: counts[0],
        test_rows: counts[1],
        fold_arcs: counts[2],
        holdout_arcs: counts[3],
        pass_seconds: [t_degrees, t_filter, t_write, t_transpose],
    })
}

/// Collective: every rank must call. Pass 1, degrees: the all-reduced in-degrees of
/// the `n` nodes (empty with K = 0, where every node is kept), the cleaned
/// out-degree of each owned row, the arcs the source yielded and the pass's
/// seconds. A source that knows its cleaned out-degrees (the generator) skips the
/// pass at K = 0.
fn global_degrees<C: Comm, S: RowSource>(
    comm: &C,
    pass: &Passes<S>,
    n: usize,
    min_links: u64,
) -> Result<(Vec<u64>, Vec<u32>, u64, f64)> {
    let (blo, bhi) = pass.src.block();
    let block_rows = (bhi - blo) as usize;
    let mut prog = Progress::new(pass.log_on, "degrees", block_rows as u64);
    let known = if min_links == 0 {
        pass.src.clean_out_degrees()
    } else {
        None
    };
    let (in_deg, out_deg, raw_arcs) = match known {
        Some(d) => {
            let arcs = d.iter().map(|&x| x as u64).sum::<u64>();
            (Vec::new(), d, arcs)
        }
        None => {
            let mut in_deg = vec![0u64; if min_links == 0 { 0 } else { n }];
            let mut out_deg: Vec<u32> = Vec::with_capacity(block_rows);
            let mut raw_arcs = 0u64;
            let pass1 = pass
                .src
                .for_each_chunk(pass.opts.chunk_arcs, &mut |mut rows| {
                    check_signal("degrees")?;
                    raw_arcs += rows.num_arcs();
                    rows.local_clean_if_needed();
                    if min_links > 0 {
                        for &t in &rows.targets {
                            in_deg[t as usize] += 1;
                        }
                    }
                    out_deg.extend(rows.indptr.windows(2).map(|w| (w[1] - w[0]) as u32));
                    prog.add(rows.num_rows() as u64, rows.num_arcs());
                    Ok(())
                });
            comm.agree(pass1)?;
            comm.all_reduce_sum(&mut in_deg);
            (in_deg, out_deg, raw_arcs)
        }
    };
    Ok((in_deg, out_deg, raw_arcs, prog.seconds()))
}

/// Collective: every rank must call. Pass 2, filter: the length of each kept owned
/// row after dropping arcs to removed nodes, and its original id (through `orig`),
/// with the pass's seconds. When the filter keeps every node (`keep_all`: K = 0, the
/// default of synthetic graphs) they are the cleaned out-degrees, without a pass.
fn global_filter_lengths<C: Comm, S: RowSource>(
    comm: &C,
    pass: &Passes<S>,
    new_id: &[u32],
    orig: &dyn Fn(u64) -> u64,
    out_deg: Vec<u32>,
    keep_all: bool,
) -> Result<(Vec<u32>, Vec<u64>, f64)> {
    let (blo, bhi) = pass.src.block();
    let mut prog = Progress::new(pass.log_on, "filter", bhi - blo);
    let (flen, node_ids) = if keep_all {
        (out_deg, (blo..bhi).map(orig).collect::<Vec<u64>>())
    } else {
        drop(out_deg);
        let mut flen: Vec<u32> = Vec::new();
        let mut node_ids: Vec<u64> = Vec::new();
        let pass2 = pass
            .src
            .for_each_chunk(pass.opts.chunk_arcs, &mut |mut rows| {
                check_signal("filter")?;
                rows.local_clean_if_needed();
                let lens: Vec<Option<u32>> = (0..rows.num_rows())
                    .into_par_iter()
                    .map(|i| {
                        let u = rows.lo as usize + i;
                        (new_id[u] != u32::MAX).then(|| {
                            rows.row(i)
                                .iter()
                                .filter(|&&t| new_id[t as usize] != u32::MAX)
                                .count() as u32
                        })
                    })
                    .collect();
                for (i, l) in lens.into_iter().enumerate() {
                    if let Some(l) = l {
                        node_ids.push(orig(rows.lo + i as u64));
                        flen.push(l);
                    }
                }
                prog.add(rows.num_rows() as u64, rows.num_arcs());
                Ok(())
            });
        comm.agree(pass2)?;
        (flen, node_ids)
    };
    Ok((flen, node_ids, prog.seconds()))
}

/// Every size and offset of the output, decided by the filtered row lengths.
struct Layout {
    meta: SplitMeta,
    /// Per kept owned row: whether it is a test row.
    is_test: Vec<bool>,
    /// This rank's train arcs, test rows, fold arcs, holdout arcs, kept rows.
    sizes: [u64; 5],
    /// Where this rank's train arcs, test rows, fold arcs and holdout arcs start.
    offs: [u64; 4],
    /// The renumbered id of this rank's first kept row.
    row_lo: u64,
    /// The datasets' shapes, in offset-table order.
    shapes: [usize; NUM_DATASETS],
}

/// Collective: every rank must call. The split's test rows
/// (`global_select_test_rows_by`) and every size of the output, from the filtered
/// lengths `flen` of this rank's kept rows (the first renumbered `row_lo`). A filter
/// that keeps no arc is an input error, the same on every rank.
#[allow(clippy::too_many_arguments)]
fn global_layout<C: Comm>(
    comm: &C,
    info: &SourceInfo,
    ids: Option<&IdMap>,
    flen: &[u32],
    row_lo: u64,
    num_kept: u64,
    min_links: u64,
    seed: u64,
) -> Result<Layout> {
    let me = comm.rank();
    let p = comm.size();
    let kept_rows = flen.len();
    let num_arcs = {
        let mut a = [flen.iter().map(|&l| l as u64).sum::<u64>()];
        comm.all_reduce_sum(&mut a);
        a[0]
    };
    let has_arcs = if num_arcs == 0 {
        Err(Error::Input {
            path: info.name.clone().into(),
            msg: format!("the filter with K = {min_links} keeps {num_kept} nodes but no arcs"),
        })
    } else {
        Ok(())
    };
    comm.agree(has_arcs)?;

    // Split: test rows, and every size of the output.
    let nonempty_rows: Vec<bool> = flen.iter().map(|&l| l > 0).collect();
    let is_test = global_select_test_rows_by(comm, row_lo, &nonempty_rows, seed)?;
    drop(nonempty_rows);
    let holdout_len = |l: u32| (l / 4).max(1).min(l) as u64;
    let mut sizes = [0u64; 5]; // train nnz, tests, fold nnz, holdout nnz, rows
    for (&l, &t) in flen.iter().zip(&is_test) {
        if t {
            sizes[1] += 1;
            sizes[2] += l as u64 - holdout_len(l);
            sizes[3] += holdout_len(l);
        } else {
            sizes[0] += l as u64;
        }
    }
    sizes[4] = kept_rows as u64;
    let all_sizes = comm.all_gather_v(&sizes)?.data;
    let field =
        |f: usize| -> Vec<usize> { (0..p).map(|r| all_sizes[r * 5 + f] as usize).collect() };
    let offs: Vec<Vec<usize>> = (0..5).map(|f| prefix_offsets(&field(f))).collect();
    let total = |f: usize| offs[f][p];
    debug_assert_eq!(offs[4][me] as u64, row_lo);
    let meta = SplitMeta {
        num_rows: num_kept,
        num_cols: num_kept,
        min_links,
        seed,
        source: info.name.clone(),
        source_nodes: ids.map_or(info.nodes, |m| m.source_nodes),
        source_arcs: info.arcs,
    };
    let rows_n = num_kept as usize;
    let t = total(1);
    let shapes = [
        rows_n + 1,
        rows_n + 1,
        t + 1,
        t + 1,
        rows_n,
        total(0),
        total(0),
        t,
        total(2),
        total(3),
    ];
    Ok(Layout {
        meta,
        is_test,
        sizes,
        offs: [
            offs[0][me] as u64,
            offs[1][me] as u64,
            offs[2][me] as u64,
            offs[3][me] as u64,
        ],
        row_lo,
        shapes,
    })
}

/// Pass 3, split + write (rank-local): each chunk's kept rows filtered, renumbered
/// and split, written straight into their ranges of `file`; the training arcs are
/// counted per column into `col_count`.
fn local_split_write<S: RowSource>(
    pass: &Passes<S>,
    file: &PositionalFile,
    new_id: &[u32],
    node_ids: &[u64],
    lay: &Layout,
    col_count: &mut [u64],
    prog: &mut Progress,
) -> Result<()> {
    let (row_lo, seed, is_test) = (lay.row_lo, lay.meta.seed, &lay.is_test);
    let kept_rows = lay.sizes[4] as usize;
    file.put(NODE_IDS, row_lo, node_ids)?;
    let mut k = 0usize; // kept rows done
    let [mut train_at, mut test_at, mut fold_at, mut hold_at] = lay.offs;
    pass.src
        .for_each_chunk(pass.opts.chunk_arcs, &mut |mut rows| {
            check_signal("split+write")?;
            rows.local_clean_if_needed();
            let kept_here: Vec<usize> = (0..rows.num_rows())
                .filter(|&i| new_id[rows.lo as usize + i] != u32::MAX)
                .collect();
            let k0 = k;
            k += kept_here.len();
            // Renumbered kept rows of the chunk, split, in parallel.
            let split: Vec<SplitRow> = kept_here
                .par_iter()
                .enumerate()
                .map(|(j, &i)| {
                    let mut r = Vec::new();
                    renumber_into(rows.row(i), new_id, &mut r);
                    if is_test[k0 + j] {
                        let (mut fold, mut hold) =
                            split_test_row(&r, seed, row_lo + (k0 + j) as u64);
                        fold.sort_unstable();
                        hold.sort_unstable();
                        (Vec::new(), Some((fold, hold)))
                    } else {
                        (r, None)
                    }
                })
                .collect();
            let mut t_indptr = Vec::with_capacity(split.len());
            let mut t_idx = Vec::new();
            let (mut test_ids, mut f_indptr, mut f_idx, mut h_indptr, mut h_idx) =
                (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
            let t_start = train_at;
            let (f_start, h_start, q_start) = (fold_at, hold_at, test_at);
            for (j, (train, test)) in split.into_iter().enumerate() {
                t_indptr.push(train_at);
                train_at += train.len() as u64;
                for &c in &train {
                    col_count[c as usize] += 1;
                }
                t_idx.extend_from_slice(&train);
                if let Some((fold, hold)) = test {
                    test_ids.push((row_lo + (k0 + j) as u64) as u32);
                    test_at += 1;
                    f_indptr.push(fold_at);
                    fold_at += fold.len() as u64;
                    f_idx.extend_from_slice(&fold);
                    h_indptr.push(hold_at);
                    hold_at += hold.len() as u64;
                    h_idx.extend_from_slice(&hold);
                }
            }
            file.put(TRAIN_INDPTR, row_lo + k0 as u64, &t_indptr)?;
            file.put(TRAIN_INDICES, t_start, &t_idx)?;
            file.put(TEST_ROWS, q_start, &test_ids)?;
            file.put(FOLD_INDPTR, q_start, &f_indptr)?;
            file.put(FOLD_INDICES, f_start, &f_idx)?;
            file.put(HOLDOUT_INDPTR, q_start, &h_indptr)?;
            file.put(HOLDOUT_INDICES, h_start, &h_idx)?;
            prog.add(rows.num_rows() as u64, rows.num_arcs());
            Ok(())
        })?;
    debug_assert_eq!(k, kept_rows);
    // Closing entries; neighbours agree on the shared boundary values.
    file.put(TRAIN_INDPTR, row_lo + kept_rows as u64, &[train_at])?;
    file.put(FOLD_INDPTR, test_at, &[fold_at])?;
    file.put(HOLDOUT_INDPTR, test_at, &[hold_at])?;
    Ok(())
}

/// Pass 4, transpose (rank-local): this rank's block `clo..chi` of columns of
/// `/train` (whose all-reduced column counts are `col_count`), filled in sub-blocks
/// of at most `transpose_arcs` arcs by reading `/train` back from `file` in chunks
/// of rows, and written.
fn local_transpose<S>(
    pass: &Passes<S>,
    file: &PositionalFile,
    num_kept: u64,
    (clo, chi): (u64, u64),
    col_count: Vec<u64>,
    prog: &mut Progress,
) -> Result<()> {
    let opts = pass.opts;
    let before: u64 = col_count[..clo as usize].iter().sum();
    let mine: Vec<u64> = col_count[clo as usize..chi as usize].to_vec();
    drop(col_count);
    let mut indptr = Vec::with_capacity(mine.len() + 1);
    let mut acc = before;
    indptr.push(acc);
    for &c in &mine {
        acc += c;
        indptr.push(acc);
    }
    file.put(TRAIN_T_INDPTR, clo, &indptr)?;
    let mut a = 0usize;
    while a < mine.len() {
        check_signal("transpose")?;
        // Columns a..b of the block, at most transpose_arcs arcs (>= 1 column).
        let mut b = a + 1;
        let mut arcs = mine[a];
        while b < mine.len() && arcs + mine[b] <= opts.transpose_arcs as u64 {
            arcs += mine[b];
            b += 1;
        }
        let (ca, cb) = ((clo + a as u64) as u32, (clo + b as u64) as u32);
        let mut fill: Vec<u64> = indptr[a..b].iter().map(|&x| x - indptr[a]).collect();
        let mut buf = vec![0u32; arcs as usize];
        let mut scratch = Scatter::default();
        // Rows are read back in pieces of at most a quarter chunk (plus one row):
        // the piece, its (column, row) pairs and the block are alive at once.
        let read_arcs = (opts.chunk_arcs as u64 / 4).max(1);
        let mut r0 = 0u64;
        while r0 < num_kept {
            // A chunk of /train rows of about chunk_arcs arcs.
            let step = 1 << 16;
            let r1 = (r0 + step).min(num_kept);
            let ip: Vec<u64> = file.get(TRAIN_INDPTR, r0, r1 + 1)?;
            let mut s = 0usize;
            while s < ip.len() - 1 {
                let mut e = s + 1;
                while e < ip.len() - 1 && ip[e + 1] - ip[s] <= read_arcs {
                    e += 1;
                }
                let idx: Vec<u32> = file.get(TRAIN_INDICES, ip[s], ip[e])?;
                local_scatter_columns(
                    &idx,
                    &ip[s..=e],
                    r0 + s as u64,
                    (ca, cb),
                    &mut fill,
                    &mut buf,
                    &mut scratch,
                );
                s = e;
            }
            r0 = r1;
        }
        file.put(TRAIN_T_INDICES, indptr[a], &buf)?;
        prog.add((b - a) as u64, arcs);
        a = b;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bucketed scatter equals the direct one, over several row pieces.
    #[test]
    fn scatter_matches_the_direct_transpose() {
        let mut rng = crate::rng::SplitMix64::new(5);
        let rows: Vec<Vec<u32>> = (0..300)
            .map(|_| {
                let mut r: Vec<u32> = (0..rng.below(40)).map(|_| rng.below(2000) as u32).collect();
                r.sort_unstable();
                r.dedup();
                r
            })
            .collect();
        let g = LocalRows::from_rows(0, rows);
        for (ca, cb) in [(0u32, 2000u32), (300, 1700), (999, 1000)] {
            let mut want: Vec<Vec<u32>> = vec![Vec::new(); (cb - ca) as usize];
            for i in 0..g.num_rows() {
                for &c in g.row(i).iter().filter(|&&c| c >= ca && c < cb) {
                    want[(c - ca) as usize].push(i as u32);
                }
            }
            let mut fill = vec![0u64; want.len()];
            let mut acc = 0;
            for (f, w) in fill.iter_mut().zip(&want) {
                *f = acc;
                acc += w.len() as u64;
            }
            let mut buf = vec![u32::MAX; acc as usize];
            let mut scratch = Scatter::default();
            for (a, b) in [(0usize, 7usize), (7, 150), (150, 300)] {
                let base = g.indptr[a] as usize;
                local_scatter_columns(
                    &g.targets[base..g.indptr[b] as usize],
                    &g.indptr[a..=b],
                    a as u64,
                    (ca, cb),
                    &mut fill,
                    &mut buf,
                    &mut scratch,
                );
            }
            assert_eq!(buf, want.concat(), "columns {ca}..{cb}");
        }
    }
}
