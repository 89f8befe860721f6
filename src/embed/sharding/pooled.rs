//! The `pooled` output mode: the bags go to the rows' owners, which pool them.
//!
//! Forward, per step: for every shard ("slot") of a pooled table, the asking rank
//! sends the slot's owner the distinct ids of its batch that the slot holds (local
//! rows, in first-seen order), the number of the batch's occurrences each example has
//! in the slot, and per occurrence the index of its id in that list. The owner pools
//! every example's rows of its slot in one fused gather-pool kernel and returns one
//! partial pooled vector per example (`n x width`). The asking rank adds a row-wise
//! table's partials in the order of their owners' ranks (slot order within a rank) and
//! places a column-wise table's slices side by side.
//!
//! Backward: the asking rank sends each slot's owner the pooled gradient of every
//! example (scaled by `1 / bag length` for mean pooling, as the `rows` mode scales it
//! at the source); the owner adds it to the rows of the example's bag, in bag order,
//! per source, then sums the sources' sums and applies the optimizer with the same
//! functions as the `rows` mode. With dedup it does both for each slot right after
//! the slot's scatter, while the sums are in cache (not for a column shard under
//! row-wise Adagrad, whose row statistics need the other shards'). The per-id sums
//! are therefore the same bits in both modes; the forward's sum is the same bits for
//! a table held by one shard and differs by summation order only when a bag's rows
//! are split over row shards.

use std::ops::Range;

use rayon::prelude::*;

use super::exchange::counts::ExchangeCounts;
use super::exchange::index::Index;
use super::exchange::owner_sums::{apply_rows, sum_sources_into};
use super::exchange::request::{global_send_request, protocol_violation};
use crate::allocs::{reserve_with_room as reserve_total, resize_for_overwrite};
use crate::comm::{Comm, Received};
use crate::data::clicks::batch::Batch;
use crate::embed::tables::placement::{OutputMode, Placement};
use crate::embed::tables::row_kernels::{
    pool_bags, pool_bags_half, scatter_bags, scatter_bags_fresh, sq_sums, Bags, Isa,
};
use crate::embed::tables::store::{input_offsets, LocalShard, Store, TableOpt};
use crate::spec::Pooling;
use crate::Result;

/// One source's bags of one slot, as its owner received them: where its distinct
/// rows and its indices lie in the request buffer, and its example offsets.
#[derive(Clone, Debug, Default)]
struct ServedBags {
    /// Distinct local rows, in the source's first-seen order.
    rows: Range<usize>,
    /// Per occurrence: its row's index in `rows`.
    idx: Range<usize>,
    /// `n + 1` offsets into `idx` (example `e` is `idx[offsets[e]..offsets[e + 1]]`).
    offsets: Vec<u32>,
}

/// What an owner keeps of one step's pooled lookups for the backward: the requests
/// as they arrived, and per slot it owns (the order of `store.owned[me]`; none for
/// `rows` slots) per source rank, where that source's bags lie in them. Refilled in
/// place by the next lookup into it (its buffers are kept).
#[derive(Debug, Default)]
pub struct Served {
    req: Received<u32>,
    bags: Vec<Vec<ServedBags>>,
}

impl Served {
    /// Every source's distinct rows of my slot `j`, in rank order ([`Self::rows`]).
    pub fn source_rows(&self, j: usize) -> Vec<&[u32]> {
        (0..self.sources(j)).map(|q| self.rows(j, q)).collect()
    }

    /// Source `q`'s distinct rows of my slot `j` (an index into `store.owned[me]`).
    pub fn rows(&self, j: usize, q: usize) -> &[u32] {
        &self.req.data[self.bags[j][q].rows.clone()]
    }

    /// Sources that asked for my slot `j` (every rank for a pooled slot, else none).
    pub fn sources(&self, j: usize) -> usize {
        self.bags.get(j).map_or(0, |b| b.len())
    }

    /// Source `q`'s bags of my slot `j`, each index mapped through its rows (`true`)
    /// or into them (`false`).
    fn bags(&self, j: usize, q: usize, mapped: bool) -> Bags<'_> {
        let b = &self.bags[j][q];
        Bags {
            offsets: &b.offsets,
            idx: &self.req.data[b.idx.clone()],
            map: mapped.then(|| self.rows(j, q)),
        }
    }

    fn examples(&self, j: usize, q: usize) -> usize {
        self.bags[j][q].offsets.len().saturating_sub(1)
    }
}

/// This source's bags of one slot, before they are sent.
#[derive(Clone, Debug, Default)]
struct LocalBags {
    rows: Vec<u32>,
    offsets: Vec<u32>,
    idx: Vec<u32>,
}

impl LocalBags {
    fn clear(&mut self) {
        self.rows.clear();
        self.offsets.clear();
        self.idx.clear();
    }
}

/// The pooled forward's buffers, kept from one lookup to the next (see
/// [`super::exchange::Lookup`]): the exchanges' payloads and the per-slot bags.
#[derive(Debug, Default)]
pub struct ForwardBufs {
    /// Per table, per slot of the table: this source's bags.
    local: Vec<Vec<LocalBags>>,
    /// Per table: scratch of a row-sharded table (per distinct id: its slot and its
    /// position there; per slot: rows so far).
    scratch: Vec<(Vec<u32>, Vec<u32>, Vec<u32>)>,
    send: Vec<u32>,
    resp: Vec<f32>,
    got: Received<f32>,
}

/// The first `k` values of `msg`, which moves past them.
fn take<'a>(msg: &mut &'a [u32], k: usize, q: usize, s: usize) -> &'a [u32] {
    if msg.len() < k {
        protocol_violation(format!("rank {q}: short pooled request for slot {s}"));
    }
    let (a, b) = msg.split_at(k);
    *msg = b;
    a
}

/// Whether table `t` is sharded and in the `pooled` output mode.
pub fn is_pooled_table(store: &Store, t: usize) -> bool {
    !store.is_replicated(t) && store.plan.mode(t) == OutputMode::Pooled
}

/// Whether slot `s` is served in the pooled mode.
pub fn is_pooled(store: &Store, s: usize) -> bool {
    is_pooled_table(store, store.slots[s].table)
}

/// Per pooled table, per slot of it, this source's bags (into `local`): `ids[t]` are
/// table `t`'s ids in first-seen order (distinct with dedup), `occ[t][k]` occurrence
/// `k`'s index in it. Tables in parallel (each table's slots are its own).
fn local_bags(
    store: &Store,
    batch: &Batch,
    ids: &[Vec<u32>],
    occ: &[Vec<u32>],
    bufs: &mut ForwardBufs,
) {
    let nt = ids.len();
    bufs.local.resize_with(nt, Vec::new);
    bufs.scratch.resize_with(nt, Default::default);
    bufs.local
        .par_iter_mut()
        .zip(&mut bufs.scratch)
        .enumerate()
        .for_each(|(t, (out, scratch))| {
            if is_pooled_table(store, t) {
                table_bags(store, batch, t, &ids[t], &occ[t], out, scratch);
            } else {
                out.clear();
            }
        });
}

/// [`local_bags`] of one pooled table `t`: its slots' bags, in the order of
/// `store.table_slots[t]`.
fn table_bags(
    store: &Store,
    batch: &Batch,
    t: usize,
    ids_t: &[u32],
    occ_t: &[u32],
    out: &mut Vec<LocalBags>,
    (slot_of, pos, next): &mut (Vec<u32>, Vec<u32>, Vec<u32>),
) {
    let n = batch.n;
    let slots = &store.table_slots[t];
    let b = &batch.bags[t];
    out.resize_with(slots.len(), Default::default);
    let occurrences = (b.offsets[n] - b.offsets[0]) as usize;
    for o in out.iter_mut() {
        o.clear();
        reserve_total(&mut o.rows, ids_t.len());
        reserve_total(&mut o.offsets, n + 1);
        reserve_total(&mut o.idx, occurrences);
    }
    if let [s] = slots[..] {
        // The whole table in one slot (table-wise): the bags are the batch's.
        let rows = store.slots[s].rows;
        let o = &mut out[0];
        o.rows
            .extend(ids_t.iter().map(|&id| rows.local(id as u64) as u32));
        o.offsets
            .extend(b.offsets[..=n].iter().map(|&x| x - b.offsets[0]));
        o.idx
            .extend_from_slice(&occ_t[b.offsets[0] as usize..b.offsets[n] as usize]);
        return;
    }
    // Per distinct id: its slot (index into `slots`) and position there.
    let column = matches!(store.plan.tables[t], Placement::Column { .. });
    slot_of.clear();
    pos.clear();
    if column {
        for (j, &s) in slots.iter().enumerate() {
            let rows = store.slots[s].rows;
            out[j]
                .rows
                .extend(ids_t.iter().map(|&id| rows.local(id as u64) as u32));
        }
        slot_of.resize(ids_t.len(), 0);
        pos.extend(0..ids_t.len() as u32);
    } else {
        next.clear();
        next.resize(slots.len(), 0);
        for &id in ids_t {
            let s = store.row_slot(t, id as u64).expect("row placement");
            let j = slots.iter().position(|&x| x == s).expect("slot of table");
            out[j]
                .rows
                .push(store.slots[s].rows.local(id as u64) as u32);
            slot_of.push(j as u32);
            pos.push(next[j]);
            next[j] += 1;
        }
    }
    for o in out.iter_mut() {
        o.offsets.push(0);
    }
    for e in 0..n {
        for &i in &occ_t[b.offsets[e] as usize..b.offsets[e + 1] as usize] {
            let i = i as usize;
            if column {
                for o in out.iter_mut() {
                    o.idx.push(pos[i]);
                }
            } else {
                out[slot_of[i] as usize].idx.push(pos[i]);
            }
        }
        for o in out.iter_mut() {
            let len = o.idx.len() as u32;
            o.offsets.push(len);
        }
    }
}

/// Collective: every rank must call. The pooled tables' forward: writes every pooled
/// table's pooled vectors (sum or mean; zeros for an empty bag) into its columns of
/// the MLP input `x` (`n x width`, sized by the caller) and fills `served` with what
/// this rank served as an owner. Every buffer is refilled in place: a step of the
/// same shape allocates nothing once they have grown.
#[allow(clippy::too_many_arguments)]
pub fn global_forward<C: Comm>(
    comm: &C,
    store: &Store,
    batch: &Batch,
    ids: &[Vec<u32>],
    occ: &[Vec<u32>],
    counts: &mut ExchangeCounts,
    bufs: &mut ForwardBufs,
    x: &mut [f32],
    served: &mut Served,
) -> Result<()> {
    let spec = &store.spec;
    let nt = spec.tables.len();
    let n = batch.n;
    let any = (0..nt).any(|t| is_pooled_table(store, t));
    if !any {
        served.bags.clear();
        return Ok(());
    }
    debug_assert_eq!((store.owned.len(), store.rank), (comm.size(), comm.rank()));
    local_bags(store, batch, ids, occ, bufs);
    // A slot's index among its table's slots.
    let in_table = |s: usize| -> usize {
        let t = store.slots[s].table;
        store.table_slots[t]
            .iter()
            .position(|&x| x == s)
            .expect("slot of its table")
    };
    let local = &bufs.local;
    let local_of = |s: usize| &local[store.slots[s].table][in_table(s)];

    // Requests: per destination, per slot it owns that is pooled:
    // [n, distinct, occurrences], rows, per-example counts, indices.
    global_send_request(
        comm,
        "lookup",
        &store.owned,
        &mut bufs.send,
        |s| {
            if is_pooled(store, s) {
                3 + local_of(s).rows.len() + n + local_of(s).idx.len()
            } else {
                0
            }
        },
        |owned, send| {
            for &s in owned.iter().filter(|&&s| is_pooled(store, s)) {
                let sb = local_of(s);
                send.extend([n as u32, sb.rows.len() as u32, sb.idx.len() as u32]);
                send.extend_from_slice(&sb.rows);
                send.extend(sb.offsets.windows(2).map(|w| w[1] - w[0]));
                send.extend_from_slice(&sb.idx);
                counts.sent += sb.rows.len() as u64;
            }
        },
        &mut served.req,
    )?;

    local_parse_requests(store, served, counts);
    let resp_counts = local_pool(store, served, &mut bufs.resp);
    {
        let _p = comm.stats().phase("lookup");
        comm.all_to_all_v_move(&mut bufs.resp, &resp_counts, &mut bufs.got)?;
    }

    local_combine(store, batch, &bufs.got, x);
    Ok(())
}

/// Parses what every source asked of each pooled slot of this rank (checked, then kept
/// where it arrived, in `served`).
fn local_parse_requests(store: &Store, served: &mut Served, counts: &mut ExchangeCounts) {
    let (p, me) = (store.owned.len(), store.rank);
    let mine = &store.bags_order(me);
    served.bags.resize_with(store.owned[me].len(), Vec::new);
    for (j, b) in served.bags.iter_mut().enumerate() {
        b.resize_with(if mine.contains(&j) { p } else { 0 }, Default::default);
    }
    let offsets = served.req.offsets();
    for (q, &base) in offsets[..p].iter().enumerate() {
        let whole = served.req.from_rank(q);
        let mut msg = whole;
        let at = |rest: &[u32]| base + whole.len() - rest.len();
        for &j in mine {
            let s = store.owned[me][j];
            let rows_in_shard = store.local[store.slot_local[s].expect("owned slot is local")].rows;

            let hdr = take(&mut msg, 3, q, s);
            let (nq, u, o) = (hdr[0] as usize, hdr[1] as usize, hdr[2] as usize);
            let r0 = at(msg);
            let rows = take(&mut msg, u, q, s);
            if let Some(&r) = rows.iter().find(|&&r| r as u64 >= rows_in_shard) {
                protocol_violation(format!(
                    "rank {q} asked for row {r} of a {rows_in_shard}-row shard (slot {s})"
                ));
            }
            let per = take(&mut msg, nq, q, s);
            let sb = &mut served.bags[j][q];
            sb.rows = r0..r0 + u;
            sb.offsets.clear();
            sb.offsets.push(0u32);
            let mut acc = 0u64;
            for &c in per {
                acc += c as u64;
                sb.offsets.push(acc.min(u32::MAX as u64) as u32);
            }
            if acc != o as u64 {
                protocol_violation(format!(
                    "rank {q}: slot {s} counts {acc} occurrences, header {o}"
                ));
            }
            let i0 = at(msg);
            let idx = take(&mut msg, o, q, s);
            if let Some(&i) = idx.iter().find(|&&i| i as usize >= u) {
                protocol_violation(format!(
                    "rank {q}: index {i} of {u} distinct ids (slot {s})"
                ));
            }
            sb.idx = i0..i0 + o;
            counts.owner_rows += o as u64;
        }
        if !msg.is_empty() {
            protocol_violation(format!(
                "rank {q}: {} values after the pooled requests",
                msg.len()
            ));
        }
    }
}

/// Pools every source's bags of each pooled slot of this rank into `resp`, in the
/// response's order (per source rank, its slots in order); returns the values per
/// destination.
fn local_pool(store: &Store, served: &Served, resp: &mut Vec<f32>) -> Vec<usize> {
    let (p, me) = (store.owned.len(), store.rank);
    let mine = &store.bags_order(me);
    // Pool: one task per (source, slot), examples in order.
    let isa = Isa::detect();
    let tasks: Vec<(usize, usize)> = (0..p)
        .flat_map(|q| mine.iter().map(move |&j| (q, j)))
        .collect();
    // Each task pools straight into its part of the response (tasks are in its order).
    let width_of = |j: usize| {
        let s = store.owned[me][j];
        store.local[store.slot_local[s].expect("owned slot is local")]
            .shard
            .width()
    };
    let mut resp_counts = vec![0usize; p];
    for &(q, j) in &tasks {
        resp_counts[q] += served.examples(j, q) * width_of(j);
    }
    // Every value is written by the pooling (a reused buffer needs no zero fill).
    resize_for_overwrite(resp, resp_counts.iter().sum());
    let mut parts: Vec<&mut [f32]> = Vec::with_capacity(tasks.len());
    let mut rest = &mut resp[..];
    for &(q, j) in &tasks {
        let (head, tail) = rest.split_at_mut(served.examples(j, q) * width_of(j));
        parts.push(head);
        rest = tail;
    }
    let sv = served;
    // Run slot by slot (every source's bags of a slot one after another): the rows
    // the sources share are still in cache for the second. The parts stay in the
    // response's order.
    let mut work: Vec<((usize, usize), &mut [f32])> = tasks.iter().copied().zip(parts).collect();
    work.sort_by_key(|&((q, j), _)| (j, q));
    work.into_par_iter().for_each(|((q, j), out)| {
        let s = store.owned[me][j];
        let ls = &store.local[store.slot_local[s].expect("owned slot is local")];
        if ls.dtype.is_f32() {
            pool_bags(isa, &ls.data, ls.shard.width(), sv.bags(j, q, true), out);
        } else {
            pool_bags_half(
                ls.dtype,
                &ls.half,
                ls.shard.width(),
                sv.bags(j, q, true),
                out,
            );
        }
    });
    resp_counts
}

/// Combines the pooled parts that came back (`got`) into the MLP input `x`.
fn local_combine(store: &Store, batch: &Batch, got: &Received<f32>, x: &mut [f32]) {
    let spec = &store.spec;
    let (nt, n) = (spec.tables.len(), batch.n);
    // Combine into the MLP input: a row-wise table's partials added in the order of
    // their owners' ranks (slot order within a rank), a column-wise table's slices placed. A full-width part that comes first is taken as
    // it is (`0.0 + x`, the bits of adding it to zeros); the others start from zeros.
    // Then the mean's scaling. Per table, its parts in order: (first column, width,
    // `n x width` values).
    let mut parts: Vec<Vec<(usize, usize, &[f32])>> = vec![Vec::new(); nt];
    for (d, owned) in store.owned.iter().enumerate() {
        let mut data = got.from_rank(d);
        for &s in owned.iter().filter(|&&s| is_pooled(store, s)) {
            let sh = &store.slots[s];
            let w = sh.width();
            if data.len() < n * w {
                protocol_violation(format!(
                    "rank {d} returned too few pooled values for slot {s}"
                ));
            }
            let (part, rest) = data.split_at(n * w);
            data = rest;
            parts[sh.table].push((sh.cols.start, w, part));
        }
        if !data.is_empty() {
            protocol_violation(format!(
                "rank {d} returned {} extra pooled values",
                data.len()
            ));
        }
    }
    let width = spec.mlp_input();
    let offs = input_offsets(store);
    x.par_chunks_mut(width.max(1))
        .enumerate()
        .for_each(|(e, xr)| {
            for (t, ps) in parts.iter().enumerate() {
                let Some(&(c0, w, p0)) = ps.first() else {
                    continue;
                };
                let ts = &spec.tables[t];
                let dim = ts.dim;
                let out = &mut xr[offs[t]..offs[t] + dim];
                let b = &batch.bags[t];
                let len = (b.offsets[e + 1] - b.offsets[e]) as usize;
                let scale = (ts.pooling == Pooling::Mean && len > 0).then(|| 1.0 / len as f32);
                let v0 = &p0[e * w..(e + 1) * w];
                if w == dim && ps.len() == 1 {
                    match scale {
                        Some(s) => out
                            .iter_mut()
                            .zip(v0)
                            .for_each(|(o, &v)| *o = (0.0 + v) * s),
                        None => out.iter_mut().zip(v0).for_each(|(o, &v)| *o = 0.0 + v),
                    }
                    continue;
                }
                if w == dim {
                    out.iter_mut().zip(v0).for_each(|(o, &v)| *o = 0.0 + v);
                } else {
                    out.fill(0.0);
                    out[c0..c0 + w]
                        .iter_mut()
                        .zip(v0)
                        .for_each(|(o, &v)| *o += v);
                }
                for &(c, w, p) in &ps[1..] {
                    let v = &p[e * w..(e + 1) * w];
                    out[c..c + w].iter_mut().zip(v).for_each(|(o, &v)| *o += v);
                }
                if let Some(s) = scale {
                    out.iter_mut().for_each(|o| *o *= s);
                }
            }
        });
}

/// The pooled backward's buffers, kept from step to step.
#[derive(Debug, Default)]
pub struct BackwardBufs {
    got: Received<f32>,
    /// Per slot this rank owns (the order of `store.owned[me]`), per source rank:
    /// the summed gradients of the source's distinct rows (`Served::rows`, in that
    /// order); empty for `rows` slots.
    pub sums: Vec<Vec<Vec<f32>>>,
}

/// Collective: every rank must call. The pooled tables' backward: sends every
/// pooled slot's owner the batch's pooled gradients (`send`, `counts` per destination:
/// [`super::exchange::StepGrads::pooled_send`], already scaled for mean pooling; left with unspecified
/// contents) and fills `bufs.sums`; then sums and updates the fused slots
/// ([`InPlace`]).
pub(super) fn global_backward<C: Comm>(
    comm: &C,
    owned: &Owned,
    send: &mut Vec<f32>,
    counts: &[usize],
    served: &Served,
    bufs: &mut BackwardBufs,
    in_place: InPlace,
) -> Result<()> {
    let p = comm.size();
    let nj = owned.widths.len();
    bufs.sums.resize_with(nj, Vec::new);
    if !owned.any_pooled {
        bufs.sums.iter_mut().for_each(Vec::clear);
        return Ok(());
    }
    // Nothing accumulated (an empty step): nothing to send.
    let zeros = vec![0usize; p];
    let counts = if counts.is_empty() {
        send.clear();
        &zeros[..]
    } else {
        counts
    };
    {
        let _p = comm.stats().phase("backward");
        comm.all_to_all_v_move(send, counts, &mut bufs.got)?;
    }
    let InPlace { opt, isa, slots } = in_place;
    let mut msgs: Vec<&[f32]> = (0..p).map(|q| bufs.got.from_rank(q)).collect();
    // Per (slot, source): its gradients, cut from the source's message in slot order.
    let mut inputs: Vec<Vec<&[f32]>> = vec![Vec::new(); nj];
    for (q, msg) in msgs.iter_mut().enumerate() {
        for j in (0..nj).filter(|&j| owned.pooled[j]) {
            let k = served.examples(j, q) * owned.widths[j];
            if msg.len() < k {
                protocol_violation(format!(
                    "rank {q}: short pooled gradients for slot {}",
                    owned.slots[j]
                ));
            }
            let (a, b) = msg.split_at(k);
            inputs[j].push(a);
            *msg = b;
        }
        if !msg.is_empty() {
            protocol_violation(format!(
                "rank {q}: {} extra pooled gradient values",
                msg.len()
            ));
        }
    }
    bufs.sums
        .par_iter_mut()
        .zip(&inputs)
        .zip(slots)
        .enumerate()
        .for_each(|(j, ((per_source, inputs), fused))| {
            if inputs.is_empty() {
                // Not a pooled slot (so not fused either): no sums.
                per_source.clear();
                return;
            }
            let w = owned.widths[j];
            per_source.resize_with(inputs.len(), Vec::new);
            // Room for every source's rows in the first source's sums, which the
            // merge over sources extends in place.
            let total: usize = (0..inputs.len()).map(|q| served.rows(j, q).len()).sum();
            for (q, (acc, g)) in per_source.iter_mut().zip(inputs).enumerate() {
                let rows = served.rows(j, q).len();
                acc.clear();
                reserve_total(acc, if q == 0 { total * w } else { rows * w });
                // Rows numbered in first-seen order (dedup) need no zero fill.
                let fresh = scatter_bags_fresh(isa, g, w, served.bags(j, q, false), acc);
                if !fresh || acc.len() != rows * w {
                    acc.clear();
                    acc.resize(rows * w, 0.0);
                    scatter_bags(isa, g, w, served.bags(j, q, false), acc);
                }
            }
            let Some(f) = fused else { return };
            // While the slot's sums are still in cache: sum over sources, the rows'
            // statistics and the update.
            let src = served.source_rows(j);
            sum_sources_into(&src, per_source, w, f.shard.rows, f.index, f.rows);
            let gs = &per_source[0];
            f.stats.clear();
            if opt.needs_row_stat() {
                reserve_total(f.stats, f.rows.len());
                sq_sums(isa, gs, w, f.stats);
            }
            apply_rows(isa, opt, f.shard, f.dim, f.rows, gs, f.stats);
        });
    Ok(())
}

/// What the pooled backward needs of the slots this rank owns (`store.owned[me]`,
/// by index `j`): their slot numbers, their widths, which are pooled, and whether
/// any table is pooled (then every rank takes part in the exchange).
pub(super) struct Owned<'a> {
    pub(super) slots: &'a [usize],
    pub(super) widths: &'a [usize],
    pub(super) pooled: &'a [bool],
    pub(super) any_pooled: bool,
}

/// The owned slots that [`global_backward`] sums over sources in place and updates
/// (`slots[j]`, `None` for the others), and the optimizer.
pub(super) struct InPlace<'a> {
    pub(super) opt: TableOpt,
    pub(super) isa: Isa,
    pub(super) slots: Vec<Option<Fused<'a>>>,
}

/// One fused slot: its shard, lent for the step, the table's `dim` (the row
/// statistic's divisor), and the buffers of the summing: its index, and its
/// summed rows' list and their statistics (outputs).
pub(super) struct Fused<'a> {
    pub(super) shard: &'a mut LocalShard,
    pub(super) dim: f64,
    pub(super) index: &'a mut Option<Index>,
    pub(super) rows: &'a mut Vec<u32>,
    pub(super) stats: &'a mut Vec<f64>,
}

impl Store {
    /// Indices into `self.owned[rank]` of the pooled slots, ascending.
    pub fn bags_order(&self, rank: usize) -> Vec<usize> {
        self.owned[rank]
            .iter()
            .enumerate()
            .filter(|&(_, &s)| is_pooled(self, s))
            .map(|(j, _)| j)
            .collect()
    }
}
