//! The backward exchange, by phases: the request of the gradients, the pooled
//! tables' backward, the owners' sums over sources, the row statistics of row-wise
//! Adagrad and the update.

use std::collections::HashMap;

use rayon::prelude::*;

use super::request::{global_send_request, protocol_violation, route, split_message};
use super::{is_pooled_table, ExchangeCounts, Index, StepGrads};
use crate::allocs::reserve_with_room as reserve_total;
use crate::comm::{Comm, Received};
use crate::embed::sharding::pooled::{self, Served};
use crate::embed::tables::placement::Placement;
use crate::embed::tables::row_kernels::{prefetch_distinct_ahead, sq_sums, Isa};
use crate::embed::tables::store::{sq_sum, LocalShard, Store, TableOpt};
use crate::{Error, Result};

/// An owner's sum of one slot's gradients over sources (rows in first-seen order, or
/// ascending when asked).
#[cfg(test)]
struct SlotSum {
    rows: Vec<u32>,
    grads: Vec<f32>,
}

/// A row id on the wire: u32, or u32 bits carried in an f32 message.
trait IdBits: Copy + Sync {
    fn bits(self) -> u32;
}
impl IdBits for u32 {
    fn bits(self) -> u32 {
        self
    }
}
impl IdBits for f32 {
    fn bits(self) -> u32 {
        self.to_bits()
    }
}

/// Add `g` to the sum of `row` in a first-seen list (`rows`, and `grads` with `w`
/// values per row, positions in `index`). A new row's sum starts from +0.0, as every
/// sum does (`0.0 + x` is `x` except that it turns -0.0 into +0.0).
#[inline]
fn add_to_sum(
    index: &mut Index,
    rows: &mut Vec<u32>,
    grads: &mut Vec<f32>,
    w: usize,
    row: u32,
    g: &[f32],
) {
    let n = rows.len() as u32;
    let p = index.get_or_insert(row, n) as usize;
    if p == n as usize {
        rows.push(row);
        grads.extend(g.iter().map(|&x| 0.0 + x));
    } else {
        for (d, &x) in grads[p * w..(p + 1) * w].iter_mut().zip(g) {
            *d += x;
        }
    }
}

/// Sum one slot's gradients over its sources' pieces (in order; within a piece in
/// order) into `rows` and `grads` (refilled), with `index` (empty before and after;
/// made for this shard on first use). Rows ascending when `sorted`.
#[allow(clippy::too_many_arguments)]
fn sum_slot_into<I: IdBits>(
    pieces: &[(&[I], &[f32])],
    w: usize,
    dedup: bool,
    shard_rows: u64,
    sorted: bool,
    index: &mut Option<Index>,
    rows: &mut Vec<u32>,
    grads: &mut Vec<f32>,
    scratch: &mut SortScratch,
) -> Result<()> {
    let total: usize = pieces.iter().map(|(ids, _)| ids.len()).sum();
    let index = index.get_or_insert_with(|| Index::new(shard_rows, total));
    // At most `total` rows: reserved once (growing would copy the sums again).
    rows.clear();
    grads.clear();
    reserve_total(rows, total);
    reserve_total(grads, total * w);
    let check = |row: u32| {
        if row as u64 >= shard_rows {
            protocol_violation(format!(
                "gradient for row {row} of a {shard_rows}-row shard"
            ))
        } else {
            Ok::<u32, Error>(row)
        }
    };
    // Per source: the positions of its rows in `lrows` (no-dedup only).
    let mut local = if dedup {
        None
    } else {
        Some(Index::new(shard_rows, total))
    };
    for &(ids, gs) in pieces {
        match local.as_mut() {
            None => {
                for (k, id) in ids.iter().enumerate() {
                    let row = check(id.bits())?;
                    add_to_sum(index, rows, grads, w, row, &gs[k * w..(k + 1) * w]);
                }
            }
            Some(lindex) => {
                // Sum this source's occurrences first, in order, then add the source.
                let mut lrows: Vec<u32> = Vec::new();
                let mut lg: Vec<f32> = Vec::new();
                for (k, id) in ids.iter().enumerate() {
                    let row = check(id.bits())?;
                    let n = lrows.len() as u32;
                    let p = lindex.get_or_insert(row, n) as usize;
                    if p == n as usize {
                        lrows.push(row);
                        lg.resize(lg.len() + w, 0.0);
                    }
                    for (d, &x) in lg[p * w..(p + 1) * w]
                        .iter_mut()
                        .zip(&gs[k * w..(k + 1) * w])
                    {
                        *d += x;
                    }
                }
                for (p, &row) in lrows.iter().enumerate() {
                    add_to_sum(index, rows, grads, w, row, &lg[p * w..(p + 1) * w]);
                }
                lindex.clear(&lrows);
            }
        }
    }
    index.clear(rows);
    if !sorted {
        return Ok(());
    }
    // Ascending rows: the order every column shard of a table agrees on. Written into
    // the scratch buffers, which are then swapped in (both kept from step to step).
    let SortScratch {
        order,
        rows: sorted_rows,
        grads: sorted_grads,
    } = scratch;
    order.clear();
    reserve_total(order, rows.len());
    order.extend(0..rows.len() as u32);
    order.sort_unstable_by_key(|&p| rows[p as usize]);
    sorted_rows.clear();
    reserve_total(sorted_rows, rows.len());
    sorted_rows.extend(order.iter().map(|&p| rows[p as usize]));
    sorted_grads.clear();
    reserve_total(sorted_grads, grads.len());
    for &p in order.iter() {
        let p = p as usize;
        sorted_grads.extend_from_slice(&grads[p * w..(p + 1) * w]);
    }
    std::mem::swap(rows, sorted_rows);
    std::mem::swap(grads, sorted_grads);
    Ok(())
}

/// Buffers of [`sum_slot_into`]'s sort into ascending rows, kept from step to step.
#[derive(Debug, Default)]
pub struct SortScratch {
    order: Vec<u32>,
    rows: Vec<u32>,
    grads: Vec<f32>,
}

/// [`sum_slot_into`] into fresh buffers.
#[cfg(test)]
fn sum_slot<I: IdBits>(
    pieces: &[(&[I], &[f32])],
    w: usize,
    dedup: bool,
    shard_rows: u64,
    sorted: bool,
) -> Result<SlotSum> {
    let (mut rows, mut grads) = (Vec::new(), Vec::new());
    sum_slot_into(
        pieces,
        w,
        dedup,
        shard_rows,
        sorted,
        &mut None,
        &mut rows,
        &mut grads,
        &mut SortScratch::default(),
    )?;
    Ok(SlotSum { rows, grads })
}

/// [`sum_slot_into`] of a pooled slot's per-source sums (`sums[q]`: one row of `w`
/// per row of `rows[q]`, distinct within each source), in place: the first source's
/// sums become the slot's (the same rows in the same order and the same bits as
/// `sum_slot_into`, without copying them: every sum starts from +0.0, so it is never
/// -0.0 and `0.0 + x == x`); `out` gets the rows.
pub(in crate::embed) fn sum_sources_into(
    rows: &[&[u32]],
    sums: &mut [Vec<f32>],
    w: usize,
    shard_rows: u64,
    index: &mut Option<Index>,
    out: &mut Vec<u32>,
) {
    if let Some(&row) = rows
        .iter()
        .flat_map(|r| r.iter())
        .find(|&&r| r as u64 >= shard_rows)
    {
        protocol_violation(format!(
            "gradient for row {row} of a {shard_rows}-row shard"
        ));
    }
    out.clear();
    let Some((first, others)) = sums.split_first_mut() else {
        return;
    };
    let total: usize = rows.iter().map(|r| r.len()).sum();
    reserve_total(out, total);
    out.extend_from_slice(rows[0]);
    if others.is_empty() {
        return;
    }
    reserve_total(first, total * w);
    let index = index.get_or_insert_with(|| Index::new(shard_rows, total));
    for (p, &r) in rows[0].iter().enumerate() {
        index.prefetch_ahead(rows[0], p);
        index.get_or_insert(r, p as u32);
    }
    for (&rq, gq) in rows[1..].iter().zip(others.iter()) {
        for (k, (&row, g)) in rq.iter().zip(gq.chunks_exact(w.max(1))).enumerate() {
            index.prefetch_ahead(rq, k);
            add_to_sum(index, out, first, w, row, g);
        }
    }
    index.clear(out);
}

/// [`sum_sources_into`] into fresh buffers.
#[cfg(test)]
fn sum_sources(rows: &[&[u32]], mut grads: Vec<Vec<f32>>, w: usize, shard_rows: u64) -> SlotSum {
    let mut out = Vec::new();
    sum_sources_into(rows, &mut grads, w, shard_rows, &mut None, &mut out);
    SlotSum {
        rows: out,
        grads: grads.into_iter().next().unwrap_or_default(),
    }
}

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

/// The table optimizer applied once to each of `rows` (local rows of `ls`, distinct)
/// with its summed gradient (`gs`, row after row, `ls`'s width each) and, for
/// row-wise Adagrad, its full row's sum of squared gradients (`totals`; divided by
/// the table's `dim` here).
pub(in crate::embed) fn apply_rows(
    isa: Isa,
    opt: TableOpt,
    ls: &mut LocalShard,
    dim: f64,
    rows: &[u32],
    gs: &[f32],
    totals: &[f64],
) {
    let w = ls.shard.width();
    let sp = opt.state_per_row();
    for (k, &row) in rows.iter().enumerate() {
        let r = row as usize;
        prefetch_distinct_ahead(isa, &ls.data, w, rows, k);
        if sp > 0 {
            prefetch_distinct_ahead(isa, &ls.state, sp, rows, k);
        }
        let stat = if sp > 0 { totals[k] / dim } else { 0.0 };
        opt.apply(
            &mut ls.data[r * w..(r + 1) * w],
            &mut ls.state[r * sp..(r + 1) * sp],
            &gs[k * w..(k + 1) * w],
            stat,
        );
    }
}

/// Apply the all-reduced gradients of the data-parallel tables to this rank's
/// replicas: every row with a non-zero gradient, the same on every rank. `reduced`
/// holds them as [`StepGrads::copy_dense_into`] laid them out (table after table).
pub fn local_apply_replicated(store: &mut Store, reduced: &[f32]) {
    let opt = store.opt;
    let sp = opt.state_per_row();
    let mut rest = reduced;
    for t in 0..store.spec.tables.len() {
        let Some(li) = store.replica[t] else { continue };
        let ts = &store.spec.tables[t];
        let dim = ts.dim;
        let (dense, tail) = rest.split_at(ts.vocab as usize * dim);
        rest = tail;
        let ls = &mut store.local[li];
        for (r, g) in dense.chunks(dim).enumerate() {
            if g.iter().all(|&x| x == 0.0) {
                continue;
            }
            let stat = if sp > 0 { sq_sum(g) / dim as f64 } else { 0.0 };
            opt.apply(
                &mut ls.data[r * dim..(r + 1) * dim],
                &mut ls.state[r * sp..(r + 1) * sp],
                g,
                stat,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summing_pooled_sources_in_place_gives_sum_slots_rows_and_bits() {
        let mut r = crate::rng::SplitMix64::new(5);
        for &(sources, w, shard_rows) in &[
            (1usize, 64usize, 1000u64),
            (2, 64, 1000),
            (3, 8, 50),
            (2, 16, 3_000_000),
            (4, 64, 200),
        ] {
            // Per source: distinct rows (overlapping across sources) and their sums,
            // negative zeros and values of mixed magnitude included.
            let mut rows: Vec<Vec<u32>> = Vec::new();
            let mut grads: Vec<Vec<f32>> = Vec::new();
            for q in 0..sources {
                let n = (r.next_u64() % 300) as usize + q;
                let mut seen = std::collections::HashSet::new();
                let rq: Vec<u32> = (0..n)
                    .map(|_| (r.next_u64() % shard_rows.min(400)) as u32)
                    .filter(|&x| seen.insert(x))
                    .collect();
                let gq: Vec<f32> = (0..rq.len() * w)
                    .map(|i| match i % 7 {
                        0 => 0.0,
                        1 => (r.next_f64() as f32 - 0.5) * 1e-6,
                        _ => (r.next_f64() as f32 - 0.5) * 1e3,
                    })
                    .collect();
                rows.push(rq);
                grads.push(gq);
            }
            let refs: Vec<&[u32]> = rows.iter().map(|v| v.as_slice()).collect();
            let pieces: Vec<(&[u32], &[f32])> = rows
                .iter()
                .zip(&grads)
                .map(|(a, b)| (a.as_slice(), b.as_slice()))
                .collect();
            let want = sum_slot(&pieces, w, true, shard_rows, false).unwrap();
            let got = sum_sources(&refs, grads.clone(), w, shard_rows);
            assert_eq!(got.rows, want.rows, "{sources} sources, w {w}");
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&got.grads),
                bits(&want.grads),
                "{sources} sources, w {w}"
            );
        }
        // No source at all: nothing.
        let none = sum_sources(&[], Vec::new(), 8, 10);
        assert!(none.rows.is_empty() && none.grads.is_empty());
    }
}
