//! The `pooled` output mode: the bags go to the rows' owners, which pool them.
//!
//! Forward, per step: for every shard ("slot") of a pooled table, the asking rank
//! sends the slot's owner the distinct ids of its batch that the slot holds (local
//! rows, in first-seen order), the number of the batch's occurrences each example has
//! in the slot, and per occurrence the index of its id in that list. The owner pools
//! every example's rows of its slot in one fused gather-pool kernel and returns one
//! partial pooled vector per example (`n x width`). The asking rank adds a row-wise
//! table's partials in slot order and places a column-wise table's slices side by side.
//!
//! Backward: the asking rank sends each slot's owner the pooled gradient of every
//! example (scaled by `1 / bag length` for mean pooling, as the `rows` mode scales it
//! at the source); the owner adds it to the rows of the example's bag, in bag order,
//! per source, and hands the per-source sums to the same owner-side summation and
//! optimizer update as the `rows` mode. The per-id sums are therefore the same bits
//! in both modes; the forward's sum is the same bits for a table held by one shard
//! and differs by summation order only when a bag's rows are split over row shards.

use rayon::prelude::*;

use super::clicks::Batch;
use super::exchange::{is_pooled_table, protocol_violation, ExchangeCounts, TableGrad};
use super::kernels::{pool_bags, scatter_bags, scatter_bags_fresh, Bags, Isa};
use super::placement::Placement;
use super::tables::Store;
use crate::comm::Comm;
use crate::Result;

/// One source's bags of one slot, as its owner received them.
#[derive(Clone, Debug, Default)]
pub struct ServedBags {
    /// Distinct local rows, in the source's first-seen order.
    pub rows: Vec<u32>,
    /// `n + 1` offsets into `idx` (example `e` is `idx[offsets[e]..offsets[e + 1]]`).
    pub offsets: Vec<u32>,
    /// Per occurrence: its row's index in `rows`.
    pub idx: Vec<u32>,
}

impl ServedBags {
    /// The bags, each index mapped through `rows` (`true`) or into `rows` (`false`).
    fn bags(&self, mapped: bool) -> Bags<'_> {
        Bags {
            offsets: &self.offsets,
            idx: &self.idx,
            map: mapped.then_some(&self.rows[..]),
        }
    }
    fn examples(&self) -> usize {
        self.offsets.len().saturating_sub(1)
    }
}

/// What an owner keeps of one step's pooled lookups for the backward: per slot it
/// owns (the order of `store.owned[me]`; empty for `rows` slots), per source rank.
#[derive(Clone, Debug, Default)]
pub struct Served {
    pub bags: Vec<Vec<ServedBags>>,
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

/// Whether slot `s` is served in the pooled mode.
pub fn is_pooled(store: &Store, s: usize) -> bool {
    is_pooled_table(store, store.slots[s].table)
}

/// Per slot of a pooled table, this source's bags: `ids[t]` are table `t`'s ids in
/// first-seen order (distinct with dedup), `occ[t][k]` occurrence `k`'s index in it.
/// Tables in parallel (each table's slots are its own).
fn local_bags(store: &Store, batch: &Batch, ids: &[Vec<u32>], occ: &[Vec<u32>]) -> Vec<ServedBags> {
    let per_table: Vec<Vec<(usize, ServedBags)>> = ids
        .par_iter()
        .enumerate()
        .map(|(t, ids_t)| {
            if is_pooled_table(store, t) {
                table_bags(store, batch, t, ids_t, &occ[t])
            } else {
                Vec::new()
            }
        })
        .collect();
    let mut out: Vec<ServedBags> = vec![ServedBags::default(); store.slots.len()];
    for (s, sb) in per_table.into_iter().flatten() {
        out[s] = sb;
    }
    out
}

/// [`local_bags`] of one pooled table `t`: `(slot, bags)` for each of its slots.
fn table_bags(
    store: &Store,
    batch: &Batch,
    t: usize,
    ids_t: &[u32],
    occ_t: &[u32],
) -> Vec<(usize, ServedBags)> {
    let n = batch.n;
    let slots = &store.table_slots[t];
    let b = &batch.bags[t];
    if let [s] = slots[..] {
        // The whole table in one slot (table-wise): the bags are the batch's.
        let rows = store.slots[s].rows;
        let bags = ServedBags {
            rows: ids_t
                .iter()
                .map(|&id| rows.local(id as u64) as u32)
                .collect(),
            offsets: b.offsets[..=n].iter().map(|&o| o - b.offsets[0]).collect(),
            idx: occ_t[b.offsets[0] as usize..b.offsets[n] as usize].to_vec(),
        };
        return vec![(s, bags)];
    }
    let mut out: Vec<ServedBags> = vec![ServedBags::default(); slots.len()];
    // Per distinct id: its slot (index into `slots`) and position there.
    let (slot_of, pos): (Vec<u32>, Vec<u32>) = match store.plan.tables[t] {
        Placement::Column { .. } => {
            for (j, &s) in slots.iter().enumerate() {
                let rows = store.slots[s].rows;
                out[j].rows = ids_t
                    .iter()
                    .map(|&id| rows.local(id as u64) as u32)
                    .collect();
            }
            (vec![0; ids_t.len()], (0..ids_t.len() as u32).collect())
        }
        _ => {
            let mut next = vec![0u32; slots.len()];
            ids_t
                .iter()
                .map(|&id| {
                    let s = store.row_slot(t, id as u64).expect("row placement");
                    let j = slots.iter().position(|&x| x == s).expect("slot of table");
                    out[j]
                        .rows
                        .push(store.slots[s].rows.local(id as u64) as u32);
                    next[j] += 1;
                    (j as u32, next[j] - 1)
                })
                .unzip()
        }
    };
    let column = matches!(store.plan.tables[t], Placement::Column { .. });
    for o in out.iter_mut() {
        o.offsets = Vec::with_capacity(n + 1);
        o.offsets.push(0);
        if !column && slots.len() == 1 {
            o.idx = Vec::with_capacity(occ_t.len());
        }
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
    slots.iter().copied().zip(out).collect()
}

/// Collective: every rank must call. The pooled tables' forward: returns, per table,
/// the batch's pooled sums (`n x dim`, unscaled; empty for `rows` tables) and what
/// this rank served as an owner.
pub fn global_forward<C: Comm>(
    comm: &C,
    store: &Store,
    batch: &Batch,
    ids: &[Vec<u32>],
    occ: &[Vec<u32>],
    counts: &mut ExchangeCounts,
) -> Result<(Vec<Vec<f32>>, Served)> {
    let spec = &store.spec;
    let nt = spec.tables.len();
    let n = batch.n;
    let any = (0..nt).any(|t| is_pooled_table(store, t));
    if !any {
        return Ok((vec![Vec::new(); nt], Served::default()));
    }
    let p = comm.size();
    let me = comm.rank();
    let mine = &store.bags_order(me);
    let bags = local_bags(store, batch, ids, occ);

    // Requests: per destination, per slot it owns that is pooled:
    // [n, distinct, occurrences], rows, per-example counts, indices.
    let total: usize = store
        .owned
        .iter()
        .flatten()
        .filter(|&&s| is_pooled(store, s))
        .map(|&s| 3 + bags[s].rows.len() + n + bags[s].idx.len())
        .sum();
    let mut send: Vec<u32> = Vec::with_capacity(total);
    let mut send_counts = vec![0usize; p];
    for (d, owned) in store.owned.iter().enumerate() {
        let start = send.len();
        for &s in owned.iter().filter(|&&s| is_pooled(store, s)) {
            let sb = &bags[s];
            send.extend([n as u32, sb.rows.len() as u32, sb.idx.len() as u32]);
            send.extend_from_slice(&sb.rows);
            send.extend(sb.offsets.windows(2).map(|w| w[1] - w[0]));
            send.extend_from_slice(&sb.idx);
            counts.sent += sb.rows.len() as u64;
        }
        send_counts[d] = send.len() - start;
    }
    let req = {
        let _p = comm.stats().phase("lookup");
        comm.all_to_all_v(&send, &send_counts)?
    };

    // Parse what every source asked of each pooled slot of mine.
    let mut served = Served {
        bags: vec![Vec::new(); store.owned[me].len()],
    };
    for q in 0..p {
        let mut msg = req.from_rank(q);
        for &j in mine {
            let s = store.owned[me][j];
            let rows_in_shard = store.local[store.slot_local[s].expect("owned slot is local")].rows;

            let hdr = take(&mut msg, 3, q, s);
            let (nq, u, o) = (hdr[0] as usize, hdr[1] as usize, hdr[2] as usize);
            let rows = take(&mut msg, u, q, s).to_vec();
            if let Some(&r) = rows.iter().find(|&&r| r as u64 >= rows_in_shard) {
                protocol_violation(format!(
                    "rank {q} asked for row {r} of a {rows_in_shard}-row shard (slot {s})"
                ));
            }
            let per = take(&mut msg, nq, q, s);
            let mut offsets = Vec::with_capacity(nq + 1);
            offsets.push(0u32);
            let mut acc = 0u64;
            for &c in per {
                acc += c as u64;
                offsets.push(acc.min(u32::MAX as u64) as u32);
            }
            if acc != o as u64 {
                protocol_violation(format!(
                    "rank {q}: slot {s} counts {acc} occurrences, header {o}"
                ));
            }
            let idx = take(&mut msg, o, q, s).to_vec();
            if let Some(&i) = idx.iter().find(|&&i| i as usize >= u) {
                protocol_violation(format!(
                    "rank {q}: index {i} of {u} distinct ids (slot {s})"
                ));
            }
            counts.owner_rows += o as u64;
            served.bags[j].push(ServedBags { rows, offsets, idx });
        }
        if !msg.is_empty() {
            protocol_violation(format!(
                "rank {q}: {} values after the pooled requests",
                msg.len()
            ));
        }
    }

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
        resp_counts[q] += served.bags[j][q].examples() * width_of(j);
    }
    let mut resp = vec![0.0f32; resp_counts.iter().sum()];
    let mut parts: Vec<&mut [f32]> = Vec::with_capacity(tasks.len());
    let mut rest = &mut resp[..];
    for &(q, j) in &tasks {
        let (head, tail) = rest.split_at_mut(served.bags[j][q].examples() * width_of(j));
        parts.push(head);
        rest = tail;
    }
    tasks.par_iter().zip(parts).for_each(|(&(q, j), out)| {
        let s = store.owned[me][j];
        let ls = &store.local[store.slot_local[s].expect("owned slot is local")];
        let sb = &served.bags[j][q];
        pool_bags(isa, &ls.data, ls.shard.width(), sb.bags(true), out);
    });
    let got = {
        let _p = comm.stats().phase("lookup");
        comm.all_to_all_v(&resp, &resp_counts)?
    };

    // Combine: a row-wise table's partials added in slot order, a column-wise table's
    // slices placed. A full-width part that comes first is taken as it is (`0.0 + x`,
    // the bits of adding it to zeros); the others start from zeros.
    let mut pooled: Vec<Vec<f32>> = vec![Vec::new(); nt];
    for (d, owned) in store.owned.iter().enumerate() {
        let mut data = got.from_rank(d);
        for &s in owned.iter().filter(|&&s| is_pooled(store, s)) {
            let sh = &store.slots[s];
            let (t, w, c0) = (sh.table, sh.width(), sh.cols.start);
            let dim = spec.tables[t].dim;
            if data.len() < n * w {
                protocol_violation(format!(
                    "rank {d} returned too few pooled values for slot {s}"
                ));
            }
            let (part, rest) = data.split_at(n * w);
            data = rest;
            if pooled[t].is_empty() {
                if w == dim {
                    pooled[t] = part.iter().map(|&x| 0.0 + x).collect();
                    continue;
                }
                pooled[t] = vec![0.0f32; n * dim];
            }
            for (e, v) in part.chunks_exact(w.max(1)).enumerate() {
                for (o, &x) in pooled[t][e * dim + c0..e * dim + c0 + w].iter_mut().zip(v) {
                    *o += x;
                }
            }
        }
        if !data.is_empty() {
            protocol_violation(format!(
                "rank {d} returned {} extra pooled values",
                data.len()
            ));
        }
    }
    Ok((pooled, served))
}

/// Collective: every rank must call. The pooled tables' backward: sends every
/// pooled slot's owner the batch's pooled gradients (`grads[t]`, `n x dim`, already
/// scaled for mean pooling) and returns, per slot this rank owns (the order of
/// `store.owned[me]`; `None` for `rows` slots), per source rank, the summed
/// gradients of the source's distinct rows (`served.bags[j][q].rows`, in that order).
pub fn global_backward<C: Comm>(
    comm: &C,
    store: &Store,
    grads: &[TableGrad],
    served: &Served,
) -> Result<Vec<Option<Vec<Vec<f32>>>>> {
    let p = comm.size();
    let me = comm.rank();
    let nt = store.spec.tables.len();
    let mut out: Vec<Option<Vec<Vec<f32>>>> = vec![None; store.owned[me].len()];
    let any = (0..nt).any(|t| is_pooled_table(store, t));
    if !any {
        return Ok(out);
    }
    let mine = store.bags_order(me);
    let total: usize = store
        .owned
        .iter()
        .flatten()
        .filter(|&&s| is_pooled(store, s))
        .map(|&s| {
            grads[store.slots[s].table].pooled.len()
                / store.spec.tables[store.slots[s].table].dim.max(1)
                * store.slots[s].width()
        })
        .sum();
    let mut send: Vec<f32> = Vec::with_capacity(total);
    let mut send_counts = vec![0usize; p];
    for (d, owned) in store.owned.iter().enumerate() {
        let start = send.len();
        for &s in owned.iter().filter(|&&s| is_pooled(store, s)) {
            let sh = &store.slots[s];
            let dim = store.spec.tables[sh.table].dim;
            for g in grads[sh.table].pooled.chunks_exact(dim.max(1)) {
                send.extend_from_slice(&g[sh.cols.clone()]);
            }
        }
        send_counts[d] = send.len() - start;
    }
    let got = {
        let _p = comm.stats().phase("backward");
        comm.all_to_all_v(&send, &send_counts)?
    };
    let isa = Isa::detect();
    let mut msgs: Vec<&[f32]> = (0..p).map(|q| got.from_rank(q)).collect();
    // Per (slot, source): its gradients, cut from the source's message in slot order.
    let mut inputs: Vec<Vec<&[f32]>> = vec![Vec::new(); store.owned[me].len()];
    for (q, msg) in msgs.iter_mut().enumerate() {
        for &j in &mine {
            let s = store.owned[me][j];
            let w = store.slots[s].width();
            let k = served.bags[j][q].examples() * w;
            if msg.len() < k {
                protocol_violation(format!("rank {q}: short pooled gradients for slot {s}"));
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
    let sums: Vec<(usize, Vec<Vec<f32>>)> = mine
        .par_iter()
        .map(|&j| {
            let w = store.slots[store.owned[me][j]].width();
            let per_source = served.bags[j]
                .iter()
                .zip(&inputs[j])
                .map(|(sb, g)| {
                    // Rows numbered in first-seen order (dedup) need no zero fill.
                    let mut acc = Vec::with_capacity(sb.rows.len() * w);
                    let fresh = scatter_bags_fresh(isa, g, w, sb.bags(false), &mut acc);
                    if !fresh || acc.len() != sb.rows.len() * w {
                        acc.clear();
                        acc.resize(sb.rows.len() * w, 0.0);
                        scatter_bags(isa, g, w, sb.bags(false), &mut acc);
                    }
                    acc
                })
                .collect();
            (j, per_source)
        })
        .collect();
    for (j, v) in sums {
        out[j] = Some(v);
    }
    Ok(out)
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
