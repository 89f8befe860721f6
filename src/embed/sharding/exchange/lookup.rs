//! The forward exchange (the lookup), by phases: dedup, the pooled tables'
//! exchange, the request, the owners' response and the placement of the rows.

use rayon::prelude::*;

use super::counts::ExchangeCounts;
use super::index::Index;
use super::request::{global_send_request, protocol_violation, route, split_message};
use crate::allocs::{reserve_with_room as reserve_total, resize_for_overwrite};
use crate::comm::{Comm, Elem, Received};
use crate::data::clicks::batch::Batch;
use crate::embed::sharding::pooled::{self, is_pooled_table, Served};
use crate::embed::tables::row_kernels::{prefetch_distinct_ahead, Isa};
use crate::embed::tables::store::{LocalShard, Store};
use crate::Result;

/// The rows fetched for one step. A lookup into a used value refills it in place
/// (keeping its buffers), so that a step allocates none of its payloads.
#[derive(Debug, Default)]
pub struct Lookup {
    /// Per table: the ids whose rows were fetched (unique, in first-seen order, with
    /// dedup; every occurrence in order without).
    pub ids: Vec<Vec<u32>>,
    /// Per table: occurrence k of the batch -> index into `ids`.
    pub occ: Vec<Vec<u32>>,
    /// Per table in the `rows` mode: `ids.len() x dim` rows (empty for pooled tables).
    pub rows: Vec<Vec<f32>>,
    /// The batch's MLP input (`n x` [`ModelSpec::mlp_input`], row-major): the columns
    /// of the `pooled` tables are filled by the lookup, the rest by [`pool`](super::pool).
    pub x: Vec<f32>,
    /// The bags this rank pooled as an owner, for the backward.
    pub served: Served,
    bufs: LookupBufs,
}

/// The lookup's working buffers (empty dedup indices between lookups).
#[derive(Debug, Default)]
struct LookupBufs {
    index: Vec<Option<Index>>,
    members: Vec<Vec<u32>>,
    send: Vec<u32>,
    req: Received<u32>,
    resp: Vec<f32>,
    got: Received<f32>,
    /// `resp` and `got` of bf16 and f16 tables (rows travel at 2 bytes a value).
    resp16: Vec<u16>,
    got16: Received<u16>,
    pooled: pooled::ForwardBufs,
}

/// Collective: every rank must call (with its own batch, possibly empty). Fetches
/// the rows of every id of `batch`.
pub fn global_lookup<C: Comm>(
    comm: &C,
    store: &Store,
    batch: &Batch,
    dedup: bool,
) -> Result<(Lookup, ExchangeCounts)> {
    let mut lk = Lookup::default();
    let counts = global_lookup_into(comm, store, batch, dedup, &mut lk)?;
    Ok((lk, counts))
}

/// [`global_lookup`] into `lk`, reusing its buffers. Phases: dedup the batch's ids
/// per table ([`local_dedup`]), the pooled tables' exchange
/// ([`pooled::global_forward`]), the request of the rows ([`global_send_request`]),
/// the owners' response ([`global_serve_rows`]) and the placement of the rows
/// ([`local_place_rows`]).
pub fn global_lookup_into<C: Comm>(
    comm: &C,
    store: &Store,
    batch: &Batch,
    dedup: bool,
    lk: &mut Lookup,
) -> Result<ExchangeCounts> {
    let spec = &store.spec;
    let nt = spec.tables.len();
    let Lookup {
        ids,
        occ,
        rows,
        x,
        served,
        bufs,
    } = lk;
    // Every value of `x` is written, here or by `pool` (a reused buffer needs no zero
    // fill).
    let len = batch.n * spec.mlp_input();
    resize_for_overwrite(x, len);
    local_dedup(store, batch, dedup, ids, occ, &mut bufs.index);
    let mut counts = ExchangeCounts::default();
    for t in 0..nt {
        if !store.is_replicated(t) {
            counts.occurrences += batch.bags[t].ids.len() as u64;
        }
    }
    let members = &mut bufs.members;
    route(store, ids, members);
    pooled::global_forward(
        comm,
        store,
        batch,
        ids,
        occ,
        &mut counts,
        &mut bufs.pooled,
        x,
        served,
    )?;

    // Requests: per destination, the counts of the slots it owns, then local rows.
    let members = &*members;
    let ids_ref = &*ids;
    global_send_request(
        comm,
        "lookup",
        &store.owned,
        &mut bufs.send,
        |s| 1 + members[s].len(),
        |owned, send| {
            send.extend(owned.iter().map(|&s| members[s].len() as u32));
            for &s in owned {
                let t = store.slots[s].table;
                let rows = store.slots[s].rows;
                send.extend(
                    members[s]
                        .iter()
                        .map(|&i| rows.local(ids_ref[t][i as usize] as u64) as u32),
                );
                counts.sent += members[s].len() as u64;
            }
        },
        &mut bufs.req,
    )?;
    let dtype = spec.table_dtype;
    if dtype.is_f32() {
        counts.owner_rows +=
            global_serve_rows(comm, store, &bufs.req, &mut bufs.resp, &mut bufs.got, row32)?;
        let place = |src: &[f32], dst: &mut [f32]| dst.copy_from_slice(src);
        local_place_rows(store, ids, members, &bufs.got, rows, place);
    } else {
        counts.owner_rows += global_serve_rows(
            comm,
            store,
            &bufs.req,
            &mut bufs.resp16,
            &mut bufs.got16,
            row16,
        )?;
        let place = |src: &[u16], dst: &mut [f32]| dtype.widen(src, dst);
        local_place_rows(store, ids, members, &bufs.got16, rows, place);
    }
    Ok(counts)
}

/// Local row `r` of an f32 shard, as stored.
fn row32(ls: &LocalShard, r: u64) -> &[f32] {
    ls.row(r)
}

/// Local row `r` of a bf16 or f16 shard, as stored (bit patterns).
fn row16(ls: &LocalShard, r: u64) -> &[u16] {
    let w = ls.shard.width();
    &ls.half[r as usize * w..(r as usize + 1) * w]
}

/// Dedup phase of the lookup: per table (in parallel), the ids to fetch (`ids`:
/// unique in first-seen order with `dedup`, every occurrence without) and each
/// occurrence's index into them (`occ`); `index` keeps the dedup indices (empty
/// between lookups).
fn local_dedup(
    store: &Store,
    batch: &Batch,
    dedup: bool,
    ids: &mut Vec<Vec<u32>>,
    occ: &mut Vec<Vec<u32>>,
    index: &mut Vec<Option<Index>>,
) {
    let spec = &store.spec;
    let nt = spec.tables.len();
    ids.resize_with(nt, Vec::new);
    occ.resize_with(nt, Vec::new);
    index.resize_with(nt, || None);
    ids.par_iter_mut()
        .zip(occ.par_iter_mut())
        .zip(index.par_iter_mut())
        .enumerate()
        .for_each(|(t, ((u, occ), index))| {
            let bag_ids = &batch.bags[t].ids;
            u.clear();
            occ.clear();
            reserve_total(u, bag_ids.len());
            reserve_total(occ, bag_ids.len());
            if dedup {
                let index =
                    index.get_or_insert_with(|| Index::new(spec.tables[t].vocab, bag_ids.len()));
                occ.extend(bag_ids.iter().enumerate().map(|(k, &id)| {
                    index.prefetch_ahead(bag_ids, k);
                    let p = index.get_or_insert(id, u.len() as u32);
                    if p as usize == u.len() {
                        u.push(id);
                    }
                    p
                }));
                index.clear(u);
            } else {
                u.extend_from_slice(bag_ids);
                occ.extend(0..bag_ids.len() as u32);
            }
        });
}

/// Collective: every rank must call. Serve phase of the lookup: the rows every
/// source asked for in `req`, slot by slot (the (source, slot) blocks in parallel,
/// each into its own part of `resp`), sent back into `got`, at the table's dtype
/// (`row` gives a local row as stored). Returns the rows served.
fn global_serve_rows<C: Comm, T: Elem>(
    comm: &C,
    store: &Store,
    req: &Received<u32>,
    resp: &mut Vec<T>,
    got: &mut Received<T>,
    row: fn(&LocalShard, u64) -> &[T],
) -> Result<u64> {
    let p = comm.size();
    let isa = Isa::detect();
    let mine = &store.owned[comm.rank()];
    let mut served = 0u64;
    let mut blocks: Vec<(usize, usize, &[u32])> = Vec::new();
    let mut resp_counts = vec![0usize; p];
    for (q, rc) in resp_counts.iter_mut().enumerate() {
        let (hdr, rows) = split_message(req.from_rank(q), mine.len(), |_| 1, |c| c as usize, q)?;
        let mut k = 0;
        for (j, &s) in mine.iter().enumerate() {
            let ls = &store.local[store.slot_local[s].expect("owned slot is local")];
            blocks.push((q, j, &rows[k..k + hdr[j]]));
            *rc += hdr[j] * ls.shard.width();
            k += hdr[j];
        }
        served += rows.len() as u64;
    }
    // Every value is copied from a row below (a reused buffer needs no zero fill).
    resize_for_overwrite(resp, resp_counts.iter().sum());
    let mut parts: Vec<&mut [T]> = Vec::with_capacity(blocks.len());
    let mut rest = &mut resp[..];
    for &(_, j, asked) in &blocks {
        let ls = &store.local[store.slot_local[mine[j]].expect("owned slot is local")];
        let (head, tail) = rest.split_at_mut(asked.len() * ls.shard.width());
        parts.push(head);
        rest = tail;
    }
    blocks
        .par_iter()
        .zip(parts)
        .for_each(|(&(q, j, asked), out)| {
            let ls = &store.local[store.slot_local[mine[j]].expect("owned slot is local")];
            let w = ls.shard.width();
            for (i, (&r, o)) in asked.iter().zip(out.chunks_exact_mut(w.max(1))).enumerate() {
                if ls.dtype.is_f32() {
                    prefetch_distinct_ahead(isa, &ls.data, w, asked, i);
                } else {
                    prefetch_distinct_ahead(isa, &ls.half, w, asked, i);
                }
                if r as u64 >= ls.rows {
                    protocol_violation(format!(
                        "rank {q} asked for row {r} of a {}-row shard of table {}",
                        ls.rows, ls.shard.table
                    ));
                }
                o.copy_from_slice(row(ls, r as u64));
            }
        });
    drop(blocks);
    {
        let _p = comm.stats().phase("lookup");
        comm.all_to_all_v_move(resp, &resp_counts, got)?;
    }
    Ok(served)
}

/// Placement phase of the lookup: the rows of `got` where the batch will pool them
/// (`rows`, per `rows` table), tables in parallel, each from its slots' parts of the
/// response (checked against what was asked; `place` widens a received row) or from
/// its replica.
fn local_place_rows<T: Elem>(
    store: &Store,
    ids: &[Vec<u32>],
    members: &[Vec<u32>],
    got: &Received<T>,
    rows: &mut Vec<Vec<f32>>,
    place: impl Fn(&[T], &mut [f32]) + Sync,
) {
    let spec = &store.spec;
    let nt = spec.tables.len();
    rows.resize_with(nt, Vec::new);
    let mut per_table: Vec<Vec<(usize, &[T])>> = vec![Vec::new(); nt];
    for (d, owned) in store.owned.iter().enumerate() {
        let data = got.from_rank(d);
        let want: usize = owned
            .iter()
            .map(|&s| members[s].len() * store.slots[s].width())
            .sum();
        if data.len() != want {
            protocol_violation(format!(
                "rank {d} returned {} values for {want} requested",
                data.len()
            ));
        }
        let mut k = 0;
        for &s in owned {
            let len = members[s].len() * store.slots[s].width();
            per_table[store.slots[s].table].push((s, &data[k..k + len]));
            k += len;
        }
    }
    // Every value of a `rows` table's buffer is written below: each id's row comes
    // from its row slot, or its columns from the table's column slots, or from the
    // replica (a reused buffer needs no zero fill).
    rows.par_iter_mut()
        .zip(&per_table)
        .enumerate()
        .for_each(|(t, (rows_t, parts))| {
            let dim = spec.tables[t].dim;
            let len = if is_pooled_table(store, t) {
                0
            } else {
                ids[t].len() * dim
            };
            resize_for_overwrite(rows_t, len);
            for &(s, data) in parts {
                let sh = &store.slots[s];
                let (w, c0) = (sh.width(), sh.cols.start);
                for (&i, src) in members[s].iter().zip(data.chunks_exact(w.max(1))) {
                    let o = i as usize * dim + c0;
                    place(src, &mut rows_t[o..o + w]);
                }
            }
            if let Some(li) = store.replica[t] {
                let ls = &store.local[li];
                for (i, &id) in ids[t].iter().enumerate() {
                    ls.row_into(id as u64, &mut rows_t[i * dim..(i + 1) * dim]);
                }
            }
        });
}
