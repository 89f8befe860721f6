//! The embedding exchange: per step, each rank deduplicates its batch's ids per
//! table, sends them to the shards' owners in one all-to-all-v for all tables
//! (a header of counts per slot, then the local rows), gets the rows back in a second
//! one, and pools them per example. Backward: gradients summed per id at the source
//! (over every micro-batch of the optimizer step) travel to the owners in one
//! all-to-all-v; owners sum over sources in rank order and apply the optimizer once
//! per row. With `dedup = false` every occurrence travels instead; the owners then
//! sum each source's occurrences in order before adding sources, which gives the
//! same bits as deduplicating at the source.
//!
//! Column-wise tables under row-wise Adagrad need the squared norm of each row's
//! full gradient: each column shard's owner sends its partial sums to the other
//! owners of the table in one more all-to-all-v.

use std::collections::HashMap;

use rayon::prelude::*;

use super::clicks::Batch;
use super::kernels::{pool as pool_kernel, prefetch_distinct_ahead, scatter, sq_sums, Bag, Isa};
use super::placement::{OutputMode, Placement};
use super::pooled::{self, Served};
use super::spec::Pooling;
use super::tables::{sq_sum, LocalShard, Store, TableOpt};
use crate::allocs::{reserve_with_room as reserve_total, resize_for_overwrite};
use crate::comm::{Comm, Elem, Received};
use crate::{Error, Result};

/// A map from ids (below `u32::MAX`, which marks an empty slot) to positions: open
/// addressing with linear probing in a power-of-two table at most half full.
#[derive(Debug)]
pub(super) struct OpenMap {
    keys: Vec<u32>,
    vals: Vec<u32>,
    shift: u32,
    len: usize,
}

impl OpenMap {
    fn with_capacity(n: usize) -> OpenMap {
        let cap = (2 * n.max(8)).next_power_of_two();
        OpenMap {
            keys: vec![u32::MAX; cap],
            vals: vec![0; cap],
            shift: 64 - cap.trailing_zeros(),
            len: 0,
        }
    }

    #[inline(always)]
    fn slot(&self, id: u32) -> usize {
        ((id as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> self.shift) as usize
    }

    #[inline]
    fn get_or_insert(&mut self, id: u32, next: u32) -> u32 {
        debug_assert!(id != u32::MAX);
        let mask = self.keys.len() - 1;
        let mut h = self.slot(id);
        loop {
            let k = self.keys[h];
            if k == id {
                return self.vals[h];
            }
            if k == u32::MAX {
                self.keys[h] = id;
                self.vals[h] = next;
                self.len += 1;
                if 2 * self.len > self.keys.len() {
                    self.grow();
                }
                return next;
            }
            h = (h + 1) & mask;
        }
    }

    fn grow(&mut self) {
        let old = std::mem::replace(self, OpenMap::with_capacity(self.keys.len()));
        for (&k, &v) in old.keys.iter().zip(&old.vals) {
            if k != u32::MAX {
                self.get_or_insert(k, v);
            }
        }
    }

    fn clear(&mut self) {
        self.keys.fill(u32::MAX);
        self.len = 0;
    }
}

/// How many ids ahead a dedup pass asks the cache for its index entry.
const INDEX_PREFETCH_AHEAD: usize = 16;

/// Position of each id in a first-seen list: a dense array for tables (or shards)
/// of up to 2^25 rows, an open-addressing map beyond.
#[derive(Debug)]
pub(super) enum Index {
    Dense(Vec<u32>),
    Sparse(OpenMap),
}

impl Index {
    const DENSE_MAX: u64 = 1 << 25;

    /// An index for up to `inserts` ids out of `rows`: dense when that costs at most
    /// a few times the inserts (filling it is O(rows)), hashed otherwise.
    fn new(rows: u64, inserts: usize) -> Index {
        if rows <= Self::DENSE_MAX && rows <= 8 * inserts.max(4096) as u64 {
            Index::Dense(vec![u32::MAX; rows as usize])
        } else {
            Index::Sparse(OpenMap::with_capacity(inserts))
        }
    }

    /// The position of `id`, or `next` (recorded) when it is new.
    #[inline]
    fn get_or_insert(&mut self, id: u32, next: u32) -> u32 {
        match self {
            Index::Dense(v) => {
                let slot = &mut v[id as usize];
                if *slot == u32::MAX {
                    *slot = next;
                }
                *slot
            }
            Index::Sparse(m) => m.get_or_insert(id, next),
        }
    }

    /// Ask the cache for the entry of `id` (a later insert then finds it near): the
    /// ids of a batch are mostly spread over large tables, and each would otherwise
    /// wait for memory in turn.
    #[inline(always)]
    fn prefetch(&self, id: u32) {
        let p: *const u32 = match self {
            Index::Dense(v) => match v.get(id as usize) {
                Some(slot) => slot,
                None => return,
            },
            Index::Sparse(m) => &m.keys[m.slot(id)],
        };
        #[cfg(target_arch = "x86_64")]
        // SAFETY: a prefetch reads nothing (and `p` points into a live buffer); SSE
        // is part of every x86_64 CPU.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast())
        };
        let _ = p;
    }

    /// [`Index::prefetch`] of the id [`INDEX_PREFETCH_AHEAD`] past position `k` of
    /// `ids` (none past the end), for a pass that inserts `ids` in order.
    #[inline(always)]
    fn prefetch_ahead(&self, ids: &[u32], k: usize) {
        if let Some(&ahead) = ids.get(k + INDEX_PREFETCH_AHEAD) {
            self.prefetch(ahead);
        }
    }

    /// Forget `ids` (which must be all the ids inserted).
    fn clear(&mut self, ids: &[u32]) {
        match self {
            Index::Dense(v) => ids.iter().for_each(|&id| v[id as usize] = u32::MAX),
            Index::Sparse(m) => m.clear(),
        }
    }
}

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
    /// of the `pooled` tables are filled by the lookup, the rest by [`pool`].
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
    pooled: pooled::ForwardBufs,
}

/// What one exchange moved, for the per-interval report.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ExchangeCounts {
    /// Ids in the local batches (of tables that are not replicated).
    pub occurrences: u64,
    /// Ids sent to owners by the lookup (a column-wise table sends an id to each of
    /// its shards); the backward sends the same ids once more.
    pub sent: u64,
    /// Rows this rank served (pooled: rows it pooled) or updated as an owner.
    pub owner_rows: u64,
    /// Seconds this rank spent applying the optimizer to its rows, but for the pooled
    /// slots updated within the pooled backward (counted in the backward).
    pub update_seconds: f64,
}

impl std::ops::AddAssign for ExchangeCounts {
    fn add_assign(&mut self, o: Self) {
        self.occurrences += o.occurrences;
        self.sent += o.sent;
        self.owner_rows += o.owner_rows;
        self.update_seconds += o.update_seconds;
    }
}

/// A message that breaks the exchange protocol is a bug, not an input error: panic
/// (the panic hook aborts every rank) rather than return on one rank between
/// collectives the others are still in.
pub(super) fn protocol_violation(msg: String) -> ! {
    panic!("embedding exchange protocol violated: {msg}")
}

/// For every slot, the indices (into `ids[table]`) of the ids it holds (`rows`
/// tables; into `members`, refilled).
fn route<V: AsRef<[u32]>>(store: &Store, ids: &[V], members: &mut Vec<Vec<u32>>) {
    members.resize_with(store.slots.len(), Vec::new);
    members.iter_mut().for_each(Vec::clear);
    for (t, ids) in ids.iter().enumerate() {
        let ids = ids.as_ref();
        if store.is_replicated(t) || store.plan.mode(t) == OutputMode::Pooled {
            continue;
        }
        if let Placement::Column { .. } = store.plan.tables[t] {
            for &s in &store.table_slots[t] {
                members[s].extend(0..ids.len() as u32);
            }
        } else {
            for (i, &id) in ids.iter().enumerate() {
                let s = store.row_slot(t, id as u64).expect("row placement");
                members[s].push(i as u32);
            }
        }
    }
}

/// Split one source's message into its header (one count per slot the receiver
/// owns) and body, checking that they agree.
fn split_message<T: Copy>(
    msg: &[T],
    slots: usize,
    per_item: impl Fn(usize) -> usize,
    count: impl Fn(T) -> usize,
    from: usize,
) -> Result<(Vec<usize>, &[T])> {
    if msg.len() < slots {
        protocol_violation(format!(
            "rank {from} sent {} values, fewer than the {slots}-slot header",
            msg.len()
        ));
    }
    let (hdr, body) = msg.split_at(slots);
    let counts: Vec<usize> = hdr.iter().map(|&c| count(c)).collect();
    let want: usize = counts
        .iter()
        .enumerate()
        .map(|(j, &c)| c * per_item(j))
        .sum();
    if want != body.len() {
        protocol_violation(format!(
            "rank {from}: header announces {want} values, body has {}",
            body.len()
        ));
    }
    Ok((counts, body))
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

/// Collective: every rank must call. Sends one all-to-all-v request in the layout
/// every exchange uses (the lookup's ids, the backward's gradients, the pooled
/// lookup's bags): per destination rank in rank order, the message `write` appends
/// for the slots that rank owns (`owned[d]`). `send` is cleared and reserved once for
/// `size(s)` values per owned slot `s`, and left with unspecified contents; the
/// messages arrive in `recv`, timed under the communication phase `phase`.
pub(super) fn global_send_request<C: Comm, T: Elem>(
    comm: &C,
    phase: &'static str,
    owned: &[Vec<usize>],
    send: &mut Vec<T>,
    size: impl Fn(usize) -> usize,
    mut write: impl FnMut(&[usize], &mut Vec<T>),
    recv: &mut Received<T>,
) -> Result<()> {
    send.clear();
    let total: usize = owned.iter().flatten().map(|&s| size(s)).sum();
    reserve_total(send, total);
    let mut send_counts = vec![0usize; comm.size()];
    for (d, owned) in owned.iter().enumerate() {
        let start = send.len();
        write(owned, send);
        send_counts[d] = send.len() - start;
    }
    let _p = comm.stats().phase(phase);
    comm.all_to_all_v_move(send, &send_counts, recv)
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
    counts.owner_rows += global_serve_rows(comm, store, &bufs.req, &mut bufs.resp, &mut bufs.got)?;
    local_place_rows(store, ids, members, &bufs.got, rows);
    Ok(counts)
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
/// each into its own part of `resp`), sent back into `got`. Returns the rows served.
fn global_serve_rows<C: Comm>(
    comm: &C,
    store: &Store,
    req: &Received<u32>,
    resp: &mut Vec<f32>,
    got: &mut Received<f32>,
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
    let mut parts: Vec<&mut [f32]> = Vec::with_capacity(blocks.len());
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
                prefetch_distinct_ahead(isa, &ls.data, w, asked, i);
                if r as u64 >= ls.rows {
                    protocol_violation(format!(
                        "rank {q} asked for row {r} of a {}-row shard of table {}",
                        ls.rows, ls.shard.table
                    ));
                }
                o.copy_from_slice(ls.row(r as u64));
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
/// response (checked against what was asked) or from its replica.
fn local_place_rows(
    store: &Store,
    ids: &[Vec<u32>],
    members: &[Vec<u32>],
    got: &Received<f32>,
    rows: &mut Vec<Vec<f32>>,
) {
    let spec = &store.spec;
    let nt = spec.tables.len();
    rows.resize_with(nt, Vec::new);
    let mut per_table: Vec<Vec<(usize, &[f32])>> = vec![Vec::new(); nt];
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
                    rows_t[o..o + w].copy_from_slice(src);
                }
            }
            if let Some(li) = store.replica[t] {
                let ls = &store.local[li];
                for (i, &id) in ids[t].iter().enumerate() {
                    rows_t[i * dim..(i + 1) * dim].copy_from_slice(ls.row(id as u64));
                }
            }
        });
}

/// Whether table `t` is sharded and in the `pooled` output mode.
pub fn is_pooled_table(store: &Store, t: usize) -> bool {
    !store.is_replicated(t) && store.plan.mode(t) == OutputMode::Pooled
}

/// Column offset of each table's pooled vector in the MLP input.
pub fn input_offsets(store: &Store) -> Vec<usize> {
    let mut o = 0;
    store
        .spec
        .tables
        .iter()
        .map(|t| {
            let at = o;
            o += t.dim;
            at
        })
        .collect()
}

/// The MLP input of a batch (`n x (sum of dims + n_dense)`, row-major) into `lk.x`:
/// each `rows` table's pooled vector (sum or mean of its bag's rows; zeros for an
/// empty bag) and the dense features; the `pooled` tables' columns are the lookup's.
pub fn pool(store: &Store, batch: &Batch, lk: &mut Lookup) {
    let spec = &store.spec;
    let width = spec.mlp_input();
    let offs = input_offsets(store);
    let isa = Isa::detect();
    let Lookup { occ, rows, x, .. } = lk;
    assert_eq!(x.len(), batch.n * width, "pool: the lookup sized the input");
    x.par_chunks_mut(width.max(1))
        .enumerate()
        .for_each(|(e, xr)| {
            for (t, ts) in spec.tables.iter().enumerate() {
                if is_pooled_table(store, t) {
                    continue;
                }
                let dim = ts.dim;
                let out = &mut xr[offs[t]..offs[t] + dim];
                let b = &batch.bags[t];
                let (lo, hi) = (b.offsets[e] as usize, b.offsets[e + 1] as usize);
                let bag = Bag {
                    idx: &occ[t][lo..hi],
                    map: None,
                };
                pool_kernel(isa, &rows[t], dim, bag, out);
                if ts.pooling == Pooling::Mean && hi > lo {
                    let s = 1.0 / (hi - lo) as f32;
                    out.iter_mut().for_each(|o| *o *= s);
                }
            }
            let nd = batch.n_dense;
            xr[width - nd..].copy_from_slice(&batch.dense[e * nd..(e + 1) * nd]);
        });
}

/// One table's gradient over an optimizer step, at the source.
#[derive(Clone, Debug, Default)]
pub struct TableGrad {
    /// Ids in first-seen order (unique with dedup, every occurrence without).
    pub ids: Vec<u32>,
    pub grads: Vec<f32>,
    /// A data-parallel table's dense `vocab x dim` gradient.
    pub dense: Vec<f32>,
}

/// The embedding gradients of one optimizer step, summed per id at the source.
#[derive(Clone, Debug, Default)]
pub struct StepGrads {
    pub dedup: bool,
    pub tables: Vec<TableGrad>,
    /// The pooled tables' gradients per example (scaled like the rows' gradients:
    /// `1 / bag length` for mean pooling), laid out as the backward sends them: per
    /// destination rank, per pooled slot it owns, `n x width` (the slot's columns).
    pub pooled_send: Vec<f32>,
    /// Values of `pooled_send` per destination rank (empty until accumulated).
    pub pooled_counts: Vec<usize>,
}

impl StepGrads {
    pub fn new(store: &Store, dedup: bool) -> Self {
        let tables = store
            .spec
            .tables
            .iter()
            .enumerate()
            .map(|(t, ts)| TableGrad {
                dense: if store.is_replicated(t) {
                    vec![0.0; ts.vocab as usize * ts.dim]
                } else {
                    Vec::new()
                },
                ..Default::default()
            })
            .collect();
        StepGrads {
            dedup,
            tables,
            pooled_send: Vec::new(),
            pooled_counts: Vec::new(),
        }
    }

    /// Empty for the next step, keeping the buffers (a data-parallel table's
    /// gradient back to zeros).
    pub fn reset(&mut self) {
        for tg in &mut self.tables {
            tg.ids.clear();
            tg.grads.clear();
            tg.dense.fill(0.0);
        }
        // `pooled_send` keeps its length: the next step overwrites it whole (a
        // cleared buffer would be zero-filled again, 13.6 MB per step for the
        // torchrec-peer workload); `pooled_counts` says what is valid.
        self.pooled_counts.clear();
    }

    /// Add the step's gradients (its one lookup covers every micro-batch): `dx` is
    /// d loss / d MLP input (`n x width`).
    /// Each occurrence's gradient is added in occurrence order.
    pub fn accumulate(&mut self, store: &Store, batch: &Batch, lk: &Lookup, dx: &[f32]) {
        let spec = &store.spec;
        let width = spec.mlp_input();
        let offs = input_offsets(store);
        let dedup = self.dedup;
        let isa = Isa::detect();
        if (0..spec.tables.len()).any(|t| is_pooled_table(store, t)) {
            // One lookup per step (see `global_step`): this is the step's batch.
            assert!(
                self.pooled_counts.is_empty(),
                "the pooled tables accumulate once per step"
            );
            self.pooled_grads(store, batch, dx);
        }
        self.tables.par_iter_mut().enumerate().for_each(|(t, tg)| {
            let ts = &spec.tables[t];
            let dim = ts.dim;
            let b = &batch.bags[t];
            let replicated = store.is_replicated(t);
            let scale_of = |e: usize| {
                let (lo, hi) = (b.offsets[e] as usize, b.offsets[e + 1] as usize);
                if ts.pooling == Pooling::Mean && hi > lo {
                    1.0 / (hi - lo) as f32
                } else {
                    1.0
                }
            };
            if is_pooled_table(store, t) {
                return;
            }
            if !replicated && dedup {
                // One lookup per step (see `global_step`): its distinct ids are the
                // step's list, and an occurrence's index into them is its row here.
                assert!(tg.ids.is_empty(), "the tables accumulate once per step");
                reserve_total(&mut tg.ids, lk.ids[t].len());
                reserve_total(&mut tg.grads, lk.ids[t].len() * dim);
                tg.ids.extend_from_slice(&lk.ids[t]);
                tg.grads.resize(tg.ids.len() * dim, 0.0);
            }
            let mut gs = vec![0.0f32; dim];
            for e in 0..batch.n {
                let (lo, hi) = (b.offsets[e] as usize, b.offsets[e + 1] as usize);
                let scale = scale_of(e);
                let g = &dx[e * width + offs[t]..e * width + offs[t] + dim];
                if replicated || dedup {
                    // `scale * g` once, added to every row of the bag (the same bits
                    // as multiplying per row).
                    for (o, &gi) in gs.iter_mut().zip(g) {
                        *o = scale * gi;
                    }
                    let (bag, acc) = if replicated {
                        (
                            Bag {
                                idx: &b.ids[lo..hi],
                                map: None,
                            },
                            &mut tg.dense,
                        )
                    } else {
                        (
                            Bag {
                                idx: &lk.occ[t][lo..hi],
                                map: None,
                            },
                            &mut tg.grads,
                        )
                    };
                    scatter(isa, &gs, dim, bag, acc);
                    continue;
                }
                // Without dedup every occurrence is its own entry.
                for k in lo..hi {
                    tg.ids.push(b.ids[k]);
                    let n = tg.grads.len();
                    tg.grads.resize(n + dim, 0.0);
                    let dst = &mut tg.grads[n..n + dim];
                    for (d, &gi) in dst.iter_mut().zip(g) {
                        *d += scale * gi;
                    }
                }
            }
        });
    }

    /// The pooled tables' part of [`Self::accumulate`]: each pooled slot's columns
    /// of `dx`, scaled per example, into its place in `pooled_send` (slots in
    /// parallel).
    fn pooled_grads(&mut self, store: &Store, batch: &Batch, dx: &[f32]) {
        let spec = &store.spec;
        let (n, width) = (batch.n, spec.mlp_input());
        let offs = input_offsets(store);
        let slots: Vec<(usize, usize)> = store
            .owned
            .iter()
            .enumerate()
            .flat_map(|(d, owned)| owned.iter().map(move |&s| (d, s)))
            .filter(|&(_, s)| pooled::is_pooled(store, s))
            .collect();
        self.pooled_counts = vec![0; store.owned.len()];
        for &(d, s) in &slots {
            self.pooled_counts[d] += n * store.slots[s].width();
        }
        // Every value is written below (a reused buffer needs no zero fill).
        let total: usize = self.pooled_counts.iter().sum();
        resize_for_overwrite(&mut self.pooled_send, total);
        let mut parts: Vec<&mut [f32]> = Vec::with_capacity(slots.len());
        let mut rest = &mut self.pooled_send[..];
        for &(_, s) in &slots {
            let (head, tail) = rest.split_at_mut(n * store.slots[s].width());
            parts.push(head);
            rest = tail;
        }
        slots.par_iter().zip(parts).for_each(|(&(_, s), out)| {
            let sh = &store.slots[s];
            let (t, w) = (sh.table, sh.width());
            let ts = &spec.tables[t];
            let b = &batch.bags[t];
            let c0 = offs[t] + sh.cols.start;
            for (e, o) in out.chunks_exact_mut(w.max(1)).enumerate() {
                let len = b.offsets[e + 1] - b.offsets[e];
                let scale = if ts.pooling == Pooling::Mean && len > 0 {
                    1.0 / len as f32
                } else {
                    1.0
                };
                let g = &dx[e * width + c0..e * width + c0 + w];
                o.iter_mut().zip(g).for_each(|(o, &gi)| *o = scale * gi);
            }
        });
    }

    /// Length of the data-parallel gradients (for the fused all-reduce buffer).
    /// Whether every gradient value of the step is finite: the per-id rows, the
    /// pooled per-example values and the data-parallel tables' dense gradients. One
    /// pass over what the backward is about to send (checked before the step's status
    /// agreement, so a non-finite one is never applied).
    pub fn all_finite(&self) -> bool {
        let valid: usize = self.pooled_counts.iter().sum();
        self.tables
            .iter()
            .all(|t| all_finite(&t.grads) && all_finite(&t.dense))
            && all_finite(&self.pooled_send[..valid])
    }

    /// Test hook ([`crate::ckpt::faults::inject_nan_grad`]): a NaN in the first
    /// gradient value this rank holds (per-id rows, pooled per-example values, or a
    /// data-parallel table's dense gradient). False when it holds none.
    pub fn plant_nan(&mut self) -> bool {
        let valid: usize = self.pooled_counts.iter().sum();
        let slot = if let Some(t) = self.tables.iter_mut().find(|t| !t.grads.is_empty()) {
            &mut t.grads[0]
        } else if valid > 0 {
            &mut self.pooled_send[0]
        } else if let Some(t) = self.tables.iter_mut().find(|t| !t.dense.is_empty()) {
            &mut t.dense[0]
        } else {
            return false;
        };
        *slot = f32::NAN;
        true
    }

    pub fn dense_len(&self) -> usize {
        self.tables.iter().map(|t| t.dense.len()).sum()
    }

    pub fn copy_dense_into(&self, out: &mut [f32]) {
        let mut o = 0;
        for t in &self.tables {
            out[o..o + t.dense.len()].copy_from_slice(&t.dense);
            o += t.dense.len();
        }
    }
}

/// Whether every value is finite: the largest exponent field, branch-free, so that
/// the scan vectorizes (a NaN or infinity has every exponent bit set).
pub fn all_finite(v: &[f32]) -> bool {
    const EXP: u32 = 0x7f80_0000;
    v.chunks(4096)
        .all(|c| c.iter().fold(0u32, |m, x| m.max(x.to_bits() & EXP)) != EXP)
}

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
pub(super) fn sum_sources_into(
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
pub(super) fn apply_rows(
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

    #[test]
    fn the_open_map_keeps_first_positions_through_growth_and_clear() {
        // Capacity for 8, then 10,000 distinct ids (grows many times), each seen twice.
        let mut m = OpenMap::with_capacity(8);
        let ids: Vec<u32> = (0..10_000u32)
            .map(|i| i.wrapping_mul(2_654_435_761) % (u32::MAX - 1))
            .collect();
        for (p, &id) in ids.iter().enumerate() {
            assert_eq!(m.get_or_insert(id, p as u32), p as u32);
        }
        for (p, &id) in ids.iter().enumerate() {
            assert_eq!(m.get_or_insert(id, 99), p as u32, "id {id}");
        }
        assert_eq!(m.len, ids.len());
        m.clear();
        assert_eq!(m.get_or_insert(ids[5], 7), 7);
        // The dense and the hashed index agree.
        let mut d = Index::new(100, 1 << 20);
        let mut h = Index::new(1 << 30, 4);
        assert!(matches!(d, Index::Dense(_)) && matches!(h, Index::Sparse(_)));
        for (k, id) in [5u32, 9, 5, 0, 9, 99].into_iter().enumerate() {
            // A prefetch changes nothing, also for an id past a dense index's end
            // (the id after the last of a batch may be any value).
            for ix in [&d, &h] {
                ix.prefetch(id);
                ix.prefetch(id + 1000);
                ix.prefetch_ahead(&[id; INDEX_PREFETCH_AHEAD + 1], k);
            }
            assert_eq!(d.get_or_insert(id, k as u32), h.get_or_insert(id, k as u32));
        }
        assert_eq!(d.get_or_insert(99, 50), 5);
        assert_eq!(h.get_or_insert(99, 50), 5);
    }
}
