//! Streaming variant filter, split and dataset writing: the same output as
//! [`global_prepare`](super::prepare::global_prepare) followed by
//! [`global_write_dataset`](super::dataset::global_write_dataset), bit for bit, with
//! memory near O(nodes) per rank plus bounded buffers. This file runs the passes in
//! order ([`global_prepare_stream`]); each has its home:
//!
//! - [`sources`]: a [`RowSource`] hands out a rank's block of rows in chunks and can
//!   do so several times (the synthetic generator re-runs: row `u` depends only on
//!   `(seed, u)`);
//! - [`budget`]: the buffer sizes ([`StreamOpts`]) and the memory check;
//! - `passes`: passes 1-3 below; `transpose`: pass 4.
//!
//! Passes over the owned block:
//!
//! 1. **degrees**: clean each chunk (sort, dedup, drop self-loops), count in-degrees
//!    (all-reduced, u64 per node) and keep the out-degree of each owned row (with
//!    K = 0 no in-degrees, and no pass at all for the generator, whose out-degrees
//!    come without its arcs);
//!    the kept mask is all-gathered and turned into the renumbering;
//! 2. **filter**: the length of each kept row after dropping arcs to removed nodes
//!    (no pass when every node is kept: the cleaned out-degrees), which decides the
//!    test rows (`global_select_test_rows_by`) and every size of the output, so
//!    rank 0 creates the file with its final shapes;
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
//! `pwrite` their disjoint ranges at the same time ([`crate::io::positional`]: native
//! little-endian u32/u64, as HDF5 stores `new_dataset::<u32>()` on this platform). No
//! HDF5 handle is open while the ranks write, and the file is renamed into place only
//! after every rank agrees. This needs every rank to see the same file (one node, or a
//! shared file system with coherent writes to disjoint ranges).

pub mod budget;
mod passes;
pub mod sources;
mod transpose;

use crate::blocks::block_range;
use crate::comm::Comm;
use crate::data::graph::dataset::{create_layout, dataset_name, Storage, NUM_DATASETS};
use crate::data::graph::prepare::{global_renumber, SplitMeta};
use crate::data::graph::readers::SourceInfo;
use crate::error::{Error, Result};
use crate::io::outfile::temp_path;
use crate::io::positional::{PositionalFile, NO_OFFSET};
use budget::{check_memory, StreamOpts};
use passes::{
    global_degrees, global_filter_lengths, global_layout, local_split_write, Layout, Passes,
    Progress,
};
use sources::RowSource;
use std::path::Path;
use transpose::local_transpose;

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

/// [`global_prepare_stream`] of a renumbered source: `ids` (when given) maps its
/// nodes back to the input's ids for `/node_ids` and `source_nodes`. The passes of
/// the module doc: [`global_degrees`] and the renumbering (`global_keep`),
/// [`global_filter_lengths`], the output's layout ([`global_layout`]), then
/// [`local_split_write`] and [`local_transpose`] into the created file
/// (`global_write_passes`), each pass ending in an agreement of every rank.
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
    let orig = |u: u64| -> u64 { ids.map_or(u, |m| m.ids[u as usize] as u64) };

    // Pass 1: degrees, then the kept mask and the renumbering.
    let (info, kept, t_degrees) = global_keep(comm, &pass, info, n, min_links)?;
    let (new_id, num_kept, row_lo) = (kept.new_id, kept.num_kept, kept.row_lo);

    // Pass 2: kept row lengths after the filter.
    let keep_all = num_kept == info.nodes;
    let (flen, node_ids, t_filter) =
        global_filter_lengths(comm, &pass, &new_id, &orig, kept.out_deg, keep_all)?;
    let source_nodes = ids.map_or(info.nodes, |m| m.source_nodes);
    let mut lay = global_layout(
        comm,
        &info,
        source_nodes,
        &flen,
        row_lo,
        num_kept,
        min_links,
        seed,
    )?;

    // Passes 3 and 4 into the created file, then the commit.
    let tmp = temp_path(out);
    let created = if me == 0 {
        create_layout(&tmp, &lay.meta, &lay.shapes, Storage::Early)
    } else {
        Ok([NO_OFFSET; NUM_DATASETS])
    };
    let ds_offs = comm.agree(created)?;
    let result = global_write_passes(
        comm,
        &pass,
        (&tmp, out),
        ds_offs,
        new_id,
        (flen, node_ids),
        &mut lay,
    );
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

/// What pass 1 decided: the renumbering of every node (`u32::MAX`: removed), the
/// kept count, the renumbered id of this rank's first kept row, and the cleaned
/// out-degree of each owned row.
struct Kept {
    new_id: Vec<u32>,
    num_kept: u64,
    row_lo: u64,
    out_deg: Vec<u32>,
}

/// Collective: every rank must call. Pass 1 ([`global_degrees`]), then the kept mask
/// and the renumbering ([`global_renumber`]); returns `info` with the arcs the source
/// yielded when it counts them, what was kept, and the pass's seconds.
fn global_keep<C: Comm, S: RowSource>(
    comm: &C,
    pass: &Passes<S>,
    info: &SourceInfo,
    n: usize,
    min_links: u64,
) -> Result<(SourceInfo, Kept, f64)> {
    let (blo, bhi) = pass.src.block();
    let block_rows = (bhi - blo) as usize;
    let (in_deg, out_deg, raw_arcs, t_degrees) = global_degrees(comm, pass, n, min_links)?;
    let mut info = info.clone();
    if pass.src.counts_arcs() {
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
    let kept = Kept {
        new_id,
        num_kept,
        row_lo,
        out_deg,
    };
    Ok((info, kept, t_degrees))
}

/// Collective: every rank must call. Passes 3 and 4 into the partial file `tmp`
/// (created by rank 0 with the datasets at byte offsets `ds_offs`, broadcast here):
/// [`local_split_write`], which is the last to need the renumbering, the filtered
/// lengths, the original ids and the test rows (dropped after it), then
/// [`local_transpose`]; then the commit to `out`. Returns the two passes' seconds.
fn global_write_passes<C: Comm, S: RowSource>(
    comm: &C,
    pass: &Passes<S>,
    (tmp, out): (&Path, &Path),
    mut ds_offs: [u64; NUM_DATASETS],
    new_id: Vec<u32>,
    (flen, node_ids): (Vec<u32>, Vec<u64>),
    lay: &mut Layout,
) -> Result<[f64; 2]> {
    let (me, p) = (comm.rank(), comm.size());
    let (blo, bhi) = pass.src.block();
    let block_rows = (bhi - blo) as usize;
    let num_kept = lay.meta.num_rows;
    comm.broadcast(0, &mut ds_offs)?;
    let opened = PositionalFile::open(tmp, ds_offs.to_vec()).map(|f| f.naming(dataset_name));
    let file = comm.agree(opened)?;

    // Pass 3: split and write the owned rows; count training arcs per column.
    let mut prog = Progress::new(pass.log_on, "split+write", block_rows as u64);
    let mut col_count = vec![0u64; num_kept as usize];
    let written = local_split_write(
        pass,
        &file,
        &new_id,
        &node_ids,
        lay,
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
    let transposed = local_transpose(pass, &file, num_kept, (clo, chi), col_count, &mut prog);
    comm.agree(transposed)?;
    let t_transpose = prog.seconds();
    // The commit protocol (docs/design.md): durable before it is visible, then
    // the rename and the directory made durable.
    comm.agree(file.sync())?;
    drop(file);
    let renamed = if me == 0 {
        crate::io::outfile::commit(tmp, out)
    } else {
        Ok(())
    };
    comm.agree(renamed)?;
    Ok([t_write, t_transpose])
}
