//! The backward exchange, by phases: the request of the gradients, the pooled
//! tables' backward, the owners' sums over sources (in `owner_sums.rs`), the row
//! statistics of row-wise Adagrad and the update.

use std::collections::HashMap;

use rayon::prelude::*;

use super::counts::ExchangeCounts;
use super::index::Index;
use super::owner_sums::{apply_rows, sum_slot_into, SortScratch};
use super::request::{global_send_request, protocol_violation, route, split_message};
use super::StepGrads;
use crate::allocs::reserve_with_room as reserve_total;
use crate::comm::{Comm, Received};
use crate::embed::sharding::pooled::{self, is_pooled_table, Served};
use crate::embed::tables::placement::Placement;
use crate::embed::tables::row_kernels::{sq_sums, Isa};
use crate::embed::tables::store::{sq_sum, LocalShard, Store, TableOpt};
use crate::Result;

/// The backward's buffers, kept from step to step.
#[derive(Debug, Default)]
pub struct BackwardBufs {
    members: Vec<Vec<u32>>,
    send: Vec<f32>,
    got: Received<f32>,
    pooled: pooled::BackwardBufs,
    /// Per slot this rank owns: the index summing its rows (empty between steps),
    /// its summed rows and (`rows` slots) their gradients, and its rows' squared
    /// norms (row-wise Adagrad).
    index: Vec<Option<Index>>,
    rows: Vec<Vec<u32>>,
    grads: Vec<Vec<f32>>,
    sort: Vec<SortScratch>,
    stats: Vec<Vec<f64>>,
    col: ColumnBufs,
}

impl BackwardBufs {
    /// Per slot this rank owns (`store.owned[me]`): the local rows the last backward
    /// updated (for incremental checkpoints).
    pub fn owned_rows(&self) -> &[Vec<u32>] {
        &self.rows
    }
}

/// Column shards under row-wise Adagrad: the partial statistics sent, received, and
/// per slot the full rows' totals.
#[derive(Debug, Default)]
struct ColumnBufs {
    send: Vec<f64>,
    got: Received<f64>,
    totals: Vec<Vec<f64>>,
}

/// What the backward needs to know of each slot this rank owns (`j` indexes
/// `store.owned[me]`).
struct OwnedInfo {
    widths: Vec<usize>,
    /// Rows of the slot's shard.
    shard_rows: Vec<u64>,
    /// Column shards under row-wise Adagrad exchange row statistics in ascending
    /// row order; other slots keep their rows in first-seen order.
    needs_order: Vec<bool>,
    pooled_slot: Vec<bool>,
    /// A pooled slot with dedup sums its sources in place (into its first source's
    /// sums) and is updated right after they are scattered, while they are in cache
    /// ("fused"); other slots are summed into their own buffers and updated later.
    /// (Not a column shard under row-wise Adagrad: its statistics need the other
    /// shards'.)
    fused: Vec<bool>,
    /// The slot's table's `dim`.
    dims: Vec<f64>,
}

impl OwnedInfo {
    fn new(store: &Store, me: usize, dedup: bool) -> Self {
        let mine = &store.owned[me];
        let widths: Vec<usize> = mine.iter().map(|&s| store.slots[s].width()).collect();
        let shard_rows: Vec<u64> = mine
            .iter()
            .map(|&s| store.local[store.slot_local[s].expect("owned slot is local")].rows)
            .collect();
        let needs_order: Vec<bool> = mine
            .iter()
            .map(|&s| {
                store.opt.needs_row_stat()
                    && matches!(
                        store.plan.tables[store.slots[s].table],
                        Placement::Column { .. }
                    )
            })
            .collect();
        let pooled_slot: Vec<bool> = mine.iter().map(|&s| pooled::is_pooled(store, s)).collect();
        let fused: Vec<bool> = (0..mine.len())
            .map(|j| pooled_slot[j] && dedup && !needs_order[j])
            .collect();
        let dims: Vec<f64> = mine
            .iter()
            .map(|&s| store.spec.tables[store.slots[s].table].dim as f64)
            .collect();
        OwnedInfo {
            widths,
            shard_rows,
            needs_order,
            pooled_slot,
            fused,
            dims,
        }
    }
}

/// Collective: every rank must call. Sends this step's gradients to the owners and
/// applies the table optimizer once per updated row. Data-parallel tables are not
/// touched here (see [`local_apply_replicated`]). Phases: the request of the
/// gradients ([`global_send_request`]), the pooled tables' backward
/// ([`global_pooled_backward`], which also updates the fused slots), the sums per
/// slot over sources ([`local_sum_slots`]), the row statistics of row-wise Adagrad
/// ([`local_row_norms`], [`global_column_totals`]) and the update
/// ([`local_apply_owned`]).
pub fn global_backward<C: Comm>(
    comm: &C,
    store: &mut Store,
    grads: &mut StepGrads,
    served: &Served,
    bufs: &mut BackwardBufs,
) -> Result<ExchangeCounts> {
    let me = comm.rank();
    let ids: Vec<&[u32]> = grads.tables.iter().map(|t| t.ids.as_slice()).collect();
    route(store, &ids, &mut bufs.members);
    let members = &bufs.members;
    let mut counts = ExchangeCounts::default();

    // Per destination: counts of its slots, then per slot the local rows (as bits)
    // and their gradients' column slices.
    {
        let store = &*store;
        let grads = &*grads;
        global_send_request(
            comm,
            "backward",
            &store.owned,
            &mut bufs.send,
            |s| 1 + members[s].len() * (1 + store.slots[s].width()),
            |owned, send| {
                send.extend(
                    owned
                        .iter()
                        .map(|&s| f32::from_bits(members[s].len() as u32)),
                );
                for &s in owned {
                    let sh = &store.slots[s];
                    let t = sh.table;
                    let dim = store.spec.tables[t].dim;
                    send.extend(
                        members[s].iter().map(|&i| {
                            f32::from_bits(sh.rows.local(ids[t][i as usize] as u64) as u32)
                        }),
                    );
                    let g = &grads.tables[t].grads;
                    for &i in &members[s] {
                        let o = i as usize * dim;
                        send.extend_from_slice(&g[o + sh.cols.start..o + sh.cols.end]);
                    }
                }
            },
            &mut bufs.got,
        )?;
    }
    let info = OwnedInfo::new(store, me, grads.dedup);
    let nj = info.widths.len();
    bufs.index.resize_with(nj, || None);
    bufs.rows.resize_with(nj, Vec::new);
    bufs.stats.resize_with(nj, Vec::new);
    global_pooled_backward(comm, store, &info, grads, served, bufs)?;
    local_sum_slots(comm.size(), &info, grads.dedup, served, bufs)?;
    for rows in &bufs.rows {
        counts.owner_rows += rows.len() as u64;
    }
    // Per slot not yet updated: its summed rows and their gradients (none for the
    // fused slots).
    let sums: Vec<(&[u32], &[f32])> = (0..nj)
        .map(|j| {
            if info.fused[j] {
                (&[][..], &[][..])
            } else {
                (bufs.rows[j].as_slice(), bufs.grads[j].as_slice())
            }
        })
        .collect();
    let isa = Isa::detect();
    local_row_norms(isa, store.opt, &mut bufs.stats, &sums, &info.widths);
    let partial = &bufs.stats;
    let is_total = global_column_totals(comm, store, &sums, partial, &mut bufs.col)?;
    let totals: Vec<&[f64]> = (0..nj)
        .map(|j| {
            if is_total[j] {
                bufs.col.totals[j].as_slice()
            } else {
                partial[j].as_slice()
            }
        })
        .collect();
    counts.update_seconds += local_apply_owned(isa, store, me, &info, &sums, &totals);
    Ok(counts)
}

/// Collective: every rank must call. The pooled tables' backward
/// ([`pooled::global_backward`]): each fused slot is lent its shard for the step and
/// summed and updated there; the other pooled slots' per-source sums are left in
/// `bufs.pooled.sums`.
fn global_pooled_backward<C: Comm>(
    comm: &C,
    store: &mut Store,
    info: &OwnedInfo,
    grads: &mut StepGrads,
    served: &Served,
    bufs: &mut BackwardBufs,
) -> Result<()> {
    let mine = &store.owned[comm.rank()];
    let owned = pooled::Owned {
        slots: mine,
        widths: &info.widths,
        pooled: &info.pooled_slot,
        any_pooled: (0..store.spec.tables.len()).any(|t| is_pooled_table(store, t)),
    };
    // Lend each fused slot its shard for the step.
    let mut shards: Vec<Option<&mut LocalShard>> = store.local.iter_mut().map(Some).collect();
    let fused_slots: Vec<Option<pooled::Fused>> = bufs
        .index
        .iter_mut()
        .zip(bufs.rows.iter_mut())
        .zip(bufs.stats.iter_mut())
        .enumerate()
        .map(|(j, ((index, rows), stats))| {
            info.fused[j].then(|| pooled::Fused {
                shard: shards[store.slot_local[mine[j]].expect("owned slot is local")]
                    .take()
                    .expect("one shard per slot"),
                dim: info.dims[j],
                index,
                rows,
                stats,
            })
        })
        .collect();
    pooled::global_backward(
        comm,
        &owned,
        &mut grads.pooled_send,
        &grads.pooled_counts,
        served,
        &mut bufs.pooled,
        pooled::InPlace {
            opt: store.opt,
            isa: Isa::detect(),
            slots: fused_slots,
        },
    )
}

/// Sum phase of the backward: per slot this rank owns (in parallel), the gradients
/// the `p` sources sent (`bufs.got`; for a pooled slot, its per-source sums) summed
/// per row over sources in rank order into `bufs.rows` and `bufs.grads` (left empty
/// for the fused slots, already updated).
fn local_sum_slots(
    p: usize,
    info: &OwnedInfo,
    dedup: bool,
    served: &Served,
    bufs: &mut BackwardBufs,
) -> Result<()> {
    let nj = info.widths.len();
    let widths = &info.widths;
    let mut pieces: Vec<Vec<(&[f32], &[f32])>> = vec![Vec::new(); nj];
    for q in 0..p {
        let (hdr, mut body) = split_message(
            bufs.got.from_rank(q),
            nj,
            |j| 1 + widths[j],
            |c: f32| c.to_bits() as usize,
            q,
        )?;
        for (j, &c) in hdr.iter().enumerate() {
            let (ids, rest) = body.split_at(c);
            let (gs, rest) = rest.split_at(c * widths[j]);
            pieces[j].push((ids, gs));
            body = rest;
        }
    }
    bufs.grads.resize_with(nj, Vec::new);
    bufs.sort.resize_with(nj, SortScratch::default);
    bufs.index
        .par_iter_mut()
        .zip(bufs.rows.par_iter_mut())
        .zip(bufs.grads.par_iter_mut())
        .zip(bufs.sort.par_iter_mut())
        .zip(bufs.pooled.sums.par_iter_mut())
        .enumerate()
        .try_for_each(|(j, ((((index, rows), gs), sort), per_source))| {
            let (w, n, sorted) = (widths[j], info.shard_rows[j], info.needs_order[j]);
            if !info.pooled_slot[j] {
                return sum_slot_into(&pieces[j], w, dedup, n, sorted, index, rows, gs, sort);
            }
            if info.fused[j] {
                // Summed and updated by the pooled backward.
                gs.clear();
                return Ok(());
            }
            let src_rows = served.source_rows(j);
            // The owner's per-source sums of each source's distinct rows, summed like
            // the rows mode's.
            let pc: Vec<(&[u32], &[f32])> = src_rows
                .iter()
                .zip(per_source.iter())
                .map(|(&r, g)| (r, g.as_slice()))
                .collect();
            sum_slot_into(&pc, w, dedup, n, sorted, index, rows, gs, sort)
        })
}

/// Row statistics for row-wise Adagrad (into `stats`, per slot; cleared otherwise):
/// the squared norms of the summed gradients' rows of `sums`.
fn local_row_norms(
    isa: Isa,
    opt: TableOpt,
    stats: &mut [Vec<f64>],
    sums: &[(&[u32], &[f32])],
    widths: &[usize],
) {
    stats
        .par_iter_mut()
        .zip(sums)
        .zip(widths)
        .for_each(|((st, (_, g)), &w)| {
            st.clear();
            if opt.needs_row_stat() {
                reserve_total(st, g.len() / w.max(1));
                sq_sums(isa, g, w, st);
            }
        });
}

/// Collective: every rank must call. Under row-wise Adagrad with column-wise tables,
/// column shards add their partial row statistics (`partial`, per slot this rank
/// owns) across the table's owners, in slot order, into `col.totals`. Returns per
/// slot whether its totals are there (column slots; other slots use their own).
fn global_column_totals<C: Comm>(
    comm: &C,
    store: &Store,
    sums: &[(&[u32], &[f32])],
    partial: &[Vec<f64>],
    col: &mut ColumnBufs,
) -> Result<Vec<bool>> {
    let p = comm.size();
    let mine = &store.owned[comm.rank()];
    let nj = mine.len();
    let column_stats = store.opt.needs_row_stat()
        && store
            .plan
            .tables
            .iter()
            .any(|pl| matches!(pl, Placement::Column { .. }));
    let mut is_total = vec![false; nj];
    col.totals.resize_with(nj, Vec::new);
    if !column_stats {
        return Ok(is_total);
    }
    let is_col = |s: usize| {
        matches!(
            store.plan.tables[store.slots[s].table],
            Placement::Column { .. }
        )
    };
    let send = &mut col.send;
    send.clear();
    let mut send_counts = vec![0usize; p];
    for (d, theirs) in store.owned.iter().enumerate() {
        let start = send.len();
        for (j, &s) in mine.iter().enumerate() {
            if !is_col(s) {
                continue;
            }
            for &s2 in theirs {
                if store.slots[s2].table == store.slots[s].table {
                    send.extend_from_slice(&partial[j]);
                }
            }
        }
        send_counts[d] = send.len() - start;
    }
    let got = &mut col.got;
    {
        let _p = comm.stats().phase("backward");
        comm.all_to_all_v_into(send, &send_counts, got)?;
    }
    // (slot of the sender, my slot) -> partial sums.
    let mut from: HashMap<(usize, usize), &[f64]> = HashMap::new();
    for (q, theirs) in store.owned.iter().enumerate() {
        let mut data = got.from_rank(q);
        for &s in theirs {
            if !is_col(s) {
                continue;
            }
            for (j, &s2) in mine.iter().enumerate() {
                if store.slots[s2].table == store.slots[s].table {
                    let n = sums[j].0.len();
                    if data.len() < n {
                        protocol_violation(format!(
                            "rank {q}: short column statistics for table {}",
                            store.slots[s].table
                        ));
                    }
                    from.insert((s, s2), &data[..n]);
                    data = &data[n..];
                }
            }
        }
    }
    for (j, &s2) in mine.iter().enumerate() {
        if !is_col(s2) {
            continue;
        }
        let t = store.slots[s2].table;
        let tot = &mut col.totals[j];
        tot.clear();
        tot.resize(sums[j].0.len(), 0.0);
        for &s in &store.table_slots[t] {
            let part = from.get(&(s, s2)).unwrap_or_else(|| {
                protocol_violation(format!("no column statistics from slot {s}"))
            });
            for (a, &b) in tot.iter_mut().zip(part.iter()) {
                *a += b;
            }
        }
        is_total[j] = true;
    }
    Ok(is_total)
}

/// Update phase of the backward: the table optimizer applied once per summed row of
/// each slot not fused (rows were checked against their shard when summed), shards
/// in parallel. Returns the seconds it took.
fn local_apply_owned(
    isa: Isa,
    store: &mut Store,
    me: usize,
    info: &OwnedInfo,
    sums: &[(&[u32], &[f32])],
    totals: &[&[f64]],
) -> f64 {
    let opt = store.opt;
    let mut job: Vec<Option<usize>> = vec![None; store.local.len()];
    for (j, &s) in store.owned[me].iter().enumerate() {
        if !info.fused[j] {
            job[store.slot_local[s].expect("owned slot is local")] = Some(j);
        }
    }
    let t_update = std::time::Instant::now();
    store.local.par_iter_mut().zip(job).for_each(|(ls, j)| {
        let Some(j) = j else { return };
        let (rows, gs) = sums[j];
        apply_rows(isa, opt, ls, info.dims[j], rows, gs, totals[j]);
    });
    t_update.elapsed().as_secs_f64()
}

/// Apply the all-reduced gradients of the data-parallel tables to this rank's
/// replicas: every row with a non-zero gradient, the same on every rank. `reduced`
/// holds them as [`StepGrads::copy_dense_into`] laid them out (table after table).
pub fn local_apply_replicated(store: &mut Store, reduced: &[f32]) {
    let opt = store.opt;
    let mut rest = reduced;
    for t in 0..store.spec.tables.len() {
        let Some(li) = store.replica[t] else { continue };
        let ts = &store.spec.tables[t];
        let dim = ts.dim;
        let sp = opt.state_per_row(dim);
        let (dense, tail) = rest.split_at(ts.vocab as usize * dim);
        rest = tail;
        let ls = &mut store.local[li];
        let mut scratch = vec![0.0f32; dim];
        for (r, g) in dense.chunks(dim).enumerate() {
            if g.iter().all(|&x| x == 0.0) {
                continue;
            }
            let stat = if opt.needs_row_stat() {
                sq_sum(g) / dim as f64
            } else {
                0.0
            };
            ls.apply(opt, r, sp, g, stat, &mut scratch);
        }
    }
}
