//! The streaming prepare's first three passes over a rank's rows (see the
//! [module doc](super)): **degrees** ([`global_degrees`]), **filter**
//! ([`global_filter_lengths`]) and the output's sizes ([`global_layout`]), and
//! **split + write** ([`local_split_write`]); with what every pass shares: the rows and
//! buffer sizes ([`Passes`]), rank 0's progress lines ([`Progress`]), the preemption
//! check and the index of each dataset in the offset table.

use super::budget::StreamOpts;
use super::sources::RowSource;
use crate::ckpt::signals::check_preempted;
use crate::comm::{prefix_offsets, Comm};
use crate::data::graph::dataset::NUM_DATASETS;
use crate::data::graph::prepare::{global_select_test_rows_by, split_test_row, SplitMeta};
use crate::data::graph::readers::SourceInfo;
use crate::error::{Error, Result};
use crate::io::positional::PositionalFile;
use rayon::prelude::*;
use std::time::Instant;

/// Stop a pass when a preemption signal arrived: a prepare has no checkpoint, so it
/// ends with nothing written (the temporary is removed) and exit 1. Checked per chunk;
/// every rank then meets the others at the pass's agreement.
pub(super) fn check_signal(pass: &str) -> Result<()> {
    check_preempted(pass, || {
        format!(
        "signal received during the {pass} pass of prepare; nothing was written (a prepare saves nothing to resume, exit 1)"
    )
    })
}

/// Renumbered arcs of a row (dropping arcs to removed nodes), appended to `out`.
pub(super) fn renumber_into(row: &[u32], new_id: &[u32], out: &mut Vec<u32>) {
    out.extend(
        row.iter()
            .map(|&t| new_id[t as usize])
            .filter(|&v| v != u32::MAX),
    );
}

/// Rank 0 logs progress of a pass: rows done / total and arcs per second.
pub(super) struct Progress {
    on: bool,
    what: &'static str,
    total_rows: u64,
    rows: u64,
    arcs: u64,
    t0: Instant,
    last: Instant,
}

impl Progress {
    pub(super) fn new(on: bool, what: &'static str, total_rows: u64) -> Self {
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

    pub(super) fn add(&mut self, rows: u64, arcs: u64) {
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

    pub(super) fn seconds(&self) -> f64 {
        self.t0.elapsed().as_secs_f64()
    }
}

/// Index of each dataset in the offset table: the u64 datasets, then the u32 ones.
pub(super) const TRAIN_INDPTR: usize = 0;
pub(super) const TRAIN_T_INDPTR: usize = 1;
pub(super) const FOLD_INDPTR: usize = 2;
pub(super) const HOLDOUT_INDPTR: usize = 3;
pub(super) const NODE_IDS: usize = 4;
pub(super) const TRAIN_INDICES: usize = 5;
pub(super) const TRAIN_T_INDICES: usize = 6;
pub(super) const TEST_ROWS: usize = 7;
pub(super) const FOLD_INDICES: usize = 8;
pub(super) const HOLDOUT_INDICES: usize = 9;

/// A kept row after the split: its training arcs, or (fold, holdout) of a test row.
type SplitRow = (Vec<u32>, Option<(Vec<u32>, Vec<u32>)>);

/// What every pass reads: the rank's rows, the buffer sizes, and whether it logs
/// progress (rank 0).
pub(super) struct Passes<'a, S> {
    pub(super) src: &'a S,
    pub(super) opts: &'a StreamOpts,
    pub(super) log_on: bool,
}

/// Collective: every rank must call. Pass 1, degrees: the all-reduced in-degrees of
/// the `n` nodes (empty with K = 0, where every node is kept), the cleaned
/// out-degree of each owned row, the arcs the source yielded and the pass's
/// seconds. A source that knows its cleaned out-degrees (the generator) skips the
/// pass at K = 0.
pub(super) fn global_degrees<C: Comm, S: RowSource>(
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
pub(super) fn global_filter_lengths<C: Comm, S: RowSource>(
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
pub(super) struct Layout {
    pub(super) meta: SplitMeta,
    /// Per kept owned row: whether it is a test row.
    pub(super) is_test: Vec<bool>,
    /// This rank's train arcs, test rows, fold arcs, holdout arcs, kept rows.
    pub(super) sizes: [u64; 5],
    /// Where this rank's train arcs, test rows, fold arcs and holdout arcs start.
    pub(super) offs: [u64; 4],
    /// The renumbered id of this rank's first kept row.
    pub(super) row_lo: u64,
    /// The datasets' shapes, in offset-table order.
    pub(super) shapes: [usize; NUM_DATASETS],
}

/// Collective: every rank must call. The split's test rows
/// (`global_select_test_rows_by`) and every size of the output, from the filtered
/// lengths `flen` of this rank's kept rows (the first renumbered `row_lo`);
/// `source_nodes` is the input's id space, recorded in the metadata. A filter
/// that keeps no arc is an input error, the same on every rank.
#[allow(clippy::too_many_arguments)]
pub(super) fn global_layout<C: Comm>(
    comm: &C,
    info: &SourceInfo,
    source_nodes: u64,
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
        source_nodes,
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
pub(super) fn local_split_write<S: RowSource>(
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
