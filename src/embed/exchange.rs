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
use std::hash::{BuildHasherDefault, Hasher};

use rayon::prelude::*;

use super::clicks::Batch;
use super::kernels::{pool as pool_kernel, prefetch_row, scatter, Bag, Isa, PREFETCH_AHEAD};
use super::placement::{OutputMode, Placement};
use super::pooled::{self, Served};
use super::spec::Pooling;
use super::tables::{sq_sum, Store};
use crate::comm::Comm;
use crate::{Error, Result};

/// A hasher for u32 ids (Fibonacci hashing of the key): the default SipHash costs
/// more than the rest of the lookup.
#[derive(Default)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ b as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u32(&mut self, v: u32) {
        self.0 = (v as u64 ^ 0x5851_F42D_4C95_7F2D).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 ^= self.0 >> 29;
    }
}

type IdMap = HashMap<u32, u32, BuildHasherDefault<IdHasher>>;

/// A map from ids (below `u32::MAX`, which marks an empty slot) to positions: open
/// addressing with linear probing in a power-of-two table at most half full.
struct OpenMap {
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

/// Position of each id in a first-seen list: a dense array for tables (or shards)
/// of up to 2^25 rows, an open-addressing map beyond.
enum Index {
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

    /// Forget `ids` (which must be all the ids inserted).
    fn clear(&mut self, ids: &[u32]) {
        match self {
            Index::Dense(v) => ids.iter().for_each(|&id| v[id as usize] = u32::MAX),
            Index::Sparse(m) => m.clear(),
        }
    }
}

/// The rows fetched for one step.
#[derive(Clone, Debug, Default)]
pub struct Lookup {
    /// Per table: the ids whose rows were fetched (unique, in first-seen order, with
    /// dedup; every occurrence in order without).
    pub ids: Vec<Vec<u32>>,
    /// Per table: occurrence k of the batch -> index into `ids`.
    pub occ: Vec<Vec<u32>>,
    /// Per table in the `rows` mode: `ids.len() x dim` rows (empty for pooled tables).
    pub rows: Vec<Vec<f32>>,
    /// Per table in the `pooled` mode: the batch's pooled sums, `n x dim`, before the
    /// mean's scaling (empty for `rows` tables).
    pub pooled: Vec<Vec<f32>>,
    /// The bags this rank pooled as an owner, for the backward.
    pub served: Served,
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
    /// Seconds this rank spent applying the optimizer to its rows.
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

/// For every slot, the indices (into `ids[table]`) of the ids it holds.
fn route(store: &Store, ids: &[Vec<u32>]) -> Vec<Vec<u32>> {
    let mut members: Vec<Vec<u32>> = vec![Vec::new(); store.slots.len()];
    for (t, ids) in ids.iter().enumerate() {
        if store.is_replicated(t) || store.plan.mode(t) == OutputMode::Pooled {
            continue;
        }
        if let Placement::Column { .. } = store.plan.tables[t] {
            let all: Vec<u32> = (0..ids.len() as u32).collect();
            for &s in &store.table_slots[t] {
                members[s] = all.clone();
            }
        } else {
            for (i, &id) in ids.iter().enumerate() {
                let s = store.row_slot(t, id as u64).expect("row placement");
                members[s].push(i as u32);
            }
        }
    }
    members
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
    let p = comm.size();
    let me = comm.rank();
    let spec = &store.spec;
    let nt = spec.tables.len();
    let per: Vec<(Vec<u32>, Vec<u32>)> = (0..nt)
        .into_par_iter()
        .map(|t| {
            let ids = &batch.bags[t].ids;
            if dedup {
                let mut index = Index::new(spec.tables[t].vocab, ids.len());
                let mut u = Vec::new();
                let occ = ids
                    .iter()
                    .map(|&id| {
                        let p = index.get_or_insert(id, u.len() as u32);
                        if p as usize == u.len() {
                            u.push(id);
                        }
                        p
                    })
                    .collect();
                (u, occ)
            } else {
                (ids.clone(), (0..ids.len() as u32).collect())
            }
        })
        .collect();
    let (ids, occ): (Vec<Vec<u32>>, Vec<Vec<u32>>) = per.into_iter().unzip();
    let mut counts = ExchangeCounts::default();
    for t in 0..nt {
        if !store.is_replicated(t) {
            counts.occurrences += batch.bags[t].ids.len() as u64;
        }
    }
    let members = route(store, &ids);
    let (pooled, served) = pooled::global_forward(comm, store, batch, &ids, &occ, &mut counts)?;

    // Requests: per destination, the counts of the slots it owns, then local rows.
    let total: usize = store
        .owned
        .iter()
        .flatten()
        .map(|&s| 1 + members[s].len())
        .sum();
    let mut send: Vec<u32> = Vec::with_capacity(total);
    let mut send_counts = vec![0usize; p];
    for (d, owned) in store.owned.iter().enumerate() {
        let start = send.len();
        send.extend(owned.iter().map(|&s| members[s].len() as u32));
        for &s in owned {
            let t = store.slots[s].table;
            let rows = store.slots[s].rows;
            send.extend(
                members[s]
                    .iter()
                    .map(|&i| rows.local(ids[t][i as usize] as u64) as u32),
            );
            counts.sent += members[s].len() as u64;
        }
        send_counts[d] = send.len() - start;
    }
    let req = {
        let _p = comm.stats().phase("lookup");
        comm.all_to_all_v(&send, &send_counts)?
    };

    // Serve: the rows asked for, slot by slot; the (source, slot) blocks in parallel,
    // each into its own part of the response.
    let isa = Isa::detect();
    let mine = &store.owned[me];
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
        counts.owner_rows += rows.len() as u64;
    }
    let mut resp = vec![0.0f32; resp_counts.iter().sum()];
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
                if let Some(&ahead) = asked.get(i + PREFETCH_AHEAD) {
                    if (ahead as u64) < ls.rows {
                        prefetch_row(isa, &ls.data, w, ahead as usize);
                    }
                }
                if r as u64 >= ls.rows {
                    protocol_violation(format!(
                        "rank {q} asked for row {r} of a {}-row shard of table {}",
                        ls.rows, ls.shard.table
                    ));
                }
                o.copy_from_slice(ls.row(r as u64));
            }
        });
    let got = {
        let _p = comm.stats().phase("lookup");
        comm.all_to_all_v(&resp, &resp_counts)?
    };

    // Place the rows where the batch will pool them: tables in parallel, each from
    // its slots' parts of the response.
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
    let mut rows: Vec<Vec<f32>> = (0..nt)
        .map(|t| {
            if pooled[t].is_empty() {
                vec![0.0f32; ids[t].len() * spec.tables[t].dim]
            } else {
                Vec::new()
            }
        })
        .collect();
    rows.par_iter_mut()
        .zip(&per_table)
        .enumerate()
        .for_each(|(t, (rows_t, parts))| {
            let dim = spec.tables[t].dim;
            for &(s, data) in parts {
                let sh = &store.slots[s];
                let (w, c0) = (sh.width(), sh.cols.start);
                for (&i, src) in members[s].iter().zip(data.chunks_exact(w.max(1))) {
                    let o = i as usize * dim + c0;
                    rows_t[o..o + w].copy_from_slice(src);
                }
            }
        });
    for t in 0..nt {
        if let Some(li) = store.replica[t] {
            let ls = &store.local[li];
            let dim = spec.tables[t].dim;
            for (i, &id) in ids[t].iter().enumerate() {
                rows[t][i * dim..(i + 1) * dim].copy_from_slice(ls.row(id as u64));
            }
        }
    }
    Ok((
        Lookup {
            ids,
            occ,
            rows,
            pooled,
            served,
        },
        counts,
    ))
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

/// The MLP input of a batch (`n x (sum of dims + n_dense)`, row-major): each table's
/// pooled vector (sum or mean of its bag's rows; zeros for an empty bag), then the
/// dense features.
pub fn pool(store: &Store, batch: &Batch, lk: &Lookup, x: &mut Vec<f32>) {
    let spec = &store.spec;
    let width = spec.mlp_input();
    let offs = input_offsets(store);
    let isa = Isa::detect();
    // Every value below is written (pooled or copied), so a reused buffer needs no
    // zero fill.
    x.resize(batch.n * width, 0.0);
    x.par_chunks_mut(width.max(1))
        .enumerate()
        .for_each(|(e, xr)| {
            for (t, ts) in spec.tables.iter().enumerate() {
                let dim = ts.dim;
                let out = &mut xr[offs[t]..offs[t] + dim];
                let b = &batch.bags[t];
                let (lo, hi) = (b.offsets[e] as usize, b.offsets[e + 1] as usize);
                let mean = ts.pooling == Pooling::Mean && hi > lo;
                let s = if mean { 1.0 / (hi - lo) as f32 } else { 1.0 };
                if is_pooled_table(store, t) {
                    let src = &lk.pooled[t][e * dim..(e + 1) * dim];
                    if mean {
                        out.iter_mut().zip(src).for_each(|(o, &v)| *o = v * s);
                    } else {
                        out.copy_from_slice(src);
                    }
                    continue;
                }
                let bag = Bag {
                    idx: &lk.occ[t][lo..hi],
                    map: None,
                };
                pool_kernel(isa, &lk.rows[t], dim, bag, out);
                if mean {
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
    index: IdMap,
    /// A data-parallel table's dense `vocab x dim` gradient.
    pub dense: Vec<f32>,
    /// A pooled table's gradient per example, `n x dim`, scaled like the rows'
    /// gradients (`1 / bag length` for mean pooling); summed per id by the owners.
    pub pooled: Vec<f32>,
}

/// The embedding gradients of one optimizer step, summed per id at the source.
#[derive(Clone, Debug, Default)]
pub struct StepGrads {
    pub dedup: bool,
    pub tables: Vec<TableGrad>,
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
        StepGrads { dedup, tables }
    }

    /// Add one micro-batch's gradients: `dx` is d loss / d MLP input (`n x width`).
    /// Each occurrence's gradient is added in occurrence order.
    pub fn accumulate(&mut self, store: &Store, batch: &Batch, lk: &Lookup, dx: &[f32]) {
        let spec = &store.spec;
        let width = spec.mlp_input();
        let offs = input_offsets(store);
        let dedup = self.dedup;
        let isa = Isa::detect();
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
                // One lookup per step (see `global_step`): this is the step's batch.
                assert!(
                    tg.pooled.is_empty(),
                    "a pooled table accumulates once per step"
                );
                tg.pooled = Vec::with_capacity(batch.n * dim);
                for e in 0..batch.n {
                    let scale = scale_of(e);
                    let g = &dx[e * width + offs[t]..e * width + offs[t] + dim];
                    tg.pooled.extend(g.iter().map(|&gi| scale * gi));
                }
                return;
            }
            // Micro-batch id index -> position in the step's list.
            let pos: Vec<u32> = if replicated || !dedup {
                Vec::new()
            } else if tg.ids.is_empty() {
                // The step's first (usually only) lookup: its ids are the list.
                tg.ids = lk.ids[t].clone();
                tg.grads = vec![0.0; tg.ids.len() * dim];
                (0..tg.ids.len() as u32).collect()
            } else {
                if tg.index.len() != tg.ids.len() {
                    tg.index = tg
                        .ids
                        .iter()
                        .enumerate()
                        .map(|(p, &id)| (id, p as u32))
                        .collect();
                }
                lk.ids[t]
                    .iter()
                    .map(|&id| {
                        let n = tg.ids.len() as u32;
                        let p = *tg.index.entry(id).or_insert(n);
                        if p == n {
                            tg.ids.push(id);
                            tg.grads.resize(tg.grads.len() + dim, 0.0);
                        }
                        p
                    })
                    .collect()
            };
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
                                map: Some(&pos),
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

    /// Length of the data-parallel gradients (for the fused all-reduce buffer).
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

    pub fn copy_dense_from(&mut self, src: &[f32]) {
        let mut o = 0;
        for t in &mut self.tables {
            let n = t.dense.len();
            t.dense.copy_from_slice(&src[o..o + n]);
            o += n;
        }
    }
}

/// An owner's sum of one slot's gradients over sources, rows ascending.
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

fn sum_slot<I: IdBits>(
    pieces: &[(&[I], &[f32])],
    w: usize,
    dedup: bool,
    shard_rows: u64,
    sorted: bool,
) -> Result<SlotSum> {
    let total: usize = pieces.iter().map(|(ids, _)| ids.len()).sum();
    let mut index = Index::new(shard_rows, total);
    // At most `total` rows: reserved once (growing would copy the sums again).
    let mut rows: Vec<u32> = Vec::with_capacity(total);
    let mut grads: Vec<f32> = Vec::with_capacity(total * w);
    let mut add = |row: u32, g: &[f32], index: &mut Index| {
        add_to_sum(index, &mut rows, &mut grads, w, row, g)
    };
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
                    add(check(id.bits())?, &gs[k * w..(k + 1) * w], &mut index);
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
                    add(row, &lg[p * w..(p + 1) * w], &mut index);
                }
                lindex.clear(&lrows);
            }
        }
    }
    if !sorted {
        return Ok(SlotSum { rows, grads });
    }
    // Ascending rows: the order every column shard of a table agrees on.
    let mut order: Vec<usize> = (0..rows.len()).collect();
    order.sort_unstable_by_key(|&p| rows[p]);
    Ok(SlotSum {
        rows: order.iter().map(|&p| rows[p]).collect(),
        grads: order
            .iter()
            .flat_map(|&p| grads[p * w..(p + 1) * w].iter().copied())
            .collect(),
    })
}

/// [`sum_slot`] of a pooled slot's per-source sums (`grads[q]`: one row of `w` per
/// row of `rows[q]`, distinct within each source): the same rows in the same order
/// and the same bits, without copying the first source's sums (every sum starts
/// from +0.0, so it is never -0.0 and `0.0 + x == x`).
fn sum_sources(rows: &[&[u32]], grads: Vec<Vec<f32>>, w: usize, shard_rows: u64) -> SlotSum {
    if let Some(&row) = rows
        .iter()
        .flat_map(|r| r.iter())
        .find(|&&r| r as u64 >= shard_rows)
    {
        protocol_violation(format!(
            "gradient for row {row} of a {shard_rows}-row shard"
        ));
    }
    let mut sources = rows.iter().zip(grads);
    let Some((&r0, mut sum)) = sources.next() else {
        return SlotSum {
            rows: Vec::new(),
            grads: Vec::new(),
        };
    };
    let total: usize = rows.iter().map(|r| r.len()).sum();
    let mut out: Vec<u32> = Vec::with_capacity(total);
    out.extend_from_slice(r0);
    if rows.len() == 1 {
        return SlotSum {
            rows: out,
            grads: sum,
        };
    }
    sum.reserve((total - r0.len()) * w);
    let mut index = Index::new(shard_rows, total);
    for (p, &r) in r0.iter().enumerate() {
        index.get_or_insert(r, p as u32);
    }
    for (&rq, gq) in sources {
        for (&row, g) in rq.iter().zip(gq.chunks_exact(w.max(1))) {
            add_to_sum(&mut index, &mut out, &mut sum, w, row, g);
        }
    }
    SlotSum {
        rows: out,
        grads: sum,
    }
}

/// Collective: every rank must call. Sends this step's gradients to the owners and
/// applies the table optimizer once per updated row. Data-parallel tables are not
/// touched here (see [`local_apply_replicated`]).
pub fn global_backward<C: Comm>(
    comm: &C,
    store: &mut Store,
    grads: &StepGrads,
    served: &Served,
) -> Result<ExchangeCounts> {
    let p = comm.size();
    let me = comm.rank();
    let ids: Vec<Vec<u32>> = grads.tables.iter().map(|t| t.ids.clone()).collect();
    let members = route(store, &ids);
    let mut counts = ExchangeCounts::default();

    // Per destination: counts of its slots, then per slot the local rows (as bits)
    // and their gradients' column slices.
    let total: usize = store
        .owned
        .iter()
        .flatten()
        .map(|&s| 1 + members[s].len() * (1 + store.slots[s].width()))
        .sum();
    let mut send: Vec<f32> = Vec::with_capacity(total);
    let mut send_counts = vec![0usize; p];
    for (d, owned) in store.owned.iter().enumerate() {
        let start = send.len();
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
                members[s]
                    .iter()
                    .map(|&i| f32::from_bits(sh.rows.local(ids[t][i as usize] as u64) as u32)),
            );
            let g = &grads.tables[t].grads;
            for &i in &members[s] {
                let o = i as usize * dim;
                send.extend_from_slice(&g[o + sh.cols.start..o + sh.cols.end]);
            }
        }
        send_counts[d] = send.len() - start;
    }
    let got = {
        let _p = comm.stats().phase("backward");
        comm.all_to_all_v(&send, &send_counts)?
    };
    let from_bags = pooled::global_backward(comm, store, &grads.tables, served)?;

    // Sum per slot over sources in rank order.
    let mine = store.owned[me].clone();
    let widths: Vec<usize> = mine.iter().map(|&s| store.slots[s].width()).collect();
    let mut pieces: Vec<Vec<(&[f32], &[f32])>> = vec![Vec::new(); mine.len()];
    for q in 0..p {
        let (hdr, mut body) = split_message(
            got.from_rank(q),
            mine.len(),
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
    let dedup = grads.dedup;
    let shard_rows: Vec<u64> = mine
        .iter()
        .map(|&s| store.local[store.slot_local[s].expect("owned slot is local")].rows)
        .collect();
    // Column shards under row-wise Adagrad exchange row statistics in ascending row
    // order; other slots keep their rows in first-seen order.
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
    let sums: Vec<SlotSum> = pieces
        .par_iter()
        .zip(from_bags)
        .zip(&widths)
        .zip(&shard_rows)
        .zip(&needs_order)
        .enumerate()
        .map(|(j, ((((pc, bags), &w), &n), &sorted))| match bags {
            // A pooled slot with dedup: the first source's sums are the start.
            Some(per_source) if dedup && !sorted => {
                let rows: Vec<&[u32]> = served.bags[j].iter().map(|b| b.rows.as_slice()).collect();
                Ok(sum_sources(&rows, per_source, w, n))
            }
            // A pooled slot: the owner's per-source sums of each source's distinct
            // rows, summed like the rows mode's.
            Some(per_source) => {
                let pc: Vec<(&[u32], &[f32])> = served.bags[j]
                    .iter()
                    .zip(&per_source)
                    .map(|(b, g)| (b.rows.as_slice(), g.as_slice()))
                    .collect();
                sum_slot(&pc, w, dedup, n, sorted)
            }
            None => sum_slot(pc, w, dedup, n, sorted),
        })
        .collect::<Result<_>>()?;

    // Row statistics for row-wise Adagrad: squared norms of full rows; column shards
    // add their partial sums across the table's owners, in slot order.
    let opt = store.opt;
    let column_stats = opt.needs_row_stat()
        && store
            .plan
            .tables
            .iter()
            .any(|pl| matches!(pl, Placement::Column { .. }));
    let partial: Vec<Vec<f64>> = sums
        .iter()
        .zip(&widths)
        .map(|(ss, &w)| {
            if opt.needs_row_stat() {
                ss.grads.chunks(w).map(sq_sum).collect()
            } else {
                Vec::new()
            }
        })
        .collect();
    let mut totals: Vec<Vec<f64>> = partial.clone();
    if column_stats {
        let is_col = |s: usize| {
            matches!(
                store.plan.tables[store.slots[s].table],
                Placement::Column { .. }
            )
        };
        let mut send: Vec<f64> = Vec::new();
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
        let got = {
            let _p = comm.stats().phase("backward");
            comm.all_to_all_v(&send, &send_counts)?
        };
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
                        let n = sums[j].rows.len();
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
            let mut tot = vec![0.0f64; sums[j].rows.len()];
            for &s in &store.table_slots[t] {
                let part = from.get(&(s, s2)).unwrap_or_else(|| {
                    protocol_violation(format!("no column statistics from slot {s}"))
                });
                for (a, &b) in tot.iter_mut().zip(part.iter()) {
                    *a += b;
                }
            }
            totals[j] = tot;
        }
    }

    // Apply once per row (rows were checked against their shard in `sum_slot`);
    // shards in parallel.
    let sp = opt.state_per_row();
    let mut job: Vec<Option<usize>> = vec![None; store.local.len()];
    for (j, &s) in mine.iter().enumerate() {
        job[store.slot_local[s].expect("owned slot is local")] = Some(j);
        counts.owner_rows += sums[j].rows.len() as u64;
    }
    let dims: Vec<f64> = mine
        .iter()
        .map(|&s| store.spec.tables[store.slots[s].table].dim as f64)
        .collect();
    let t_update = std::time::Instant::now();
    let isa = Isa::detect();
    store.local.par_iter_mut().zip(job).for_each(|(ls, j)| {
        let Some(j) = j else { return };
        let (w, ss) = (widths[j], &sums[j]);
        for (k, &row) in ss.rows.iter().enumerate() {
            let r = row as usize;
            if let Some(&ahead) = ss.rows.get(k + PREFETCH_AHEAD) {
                prefetch_row(isa, &ls.data, w, ahead as usize);
                if sp > 0 {
                    prefetch_row(isa, &ls.state, sp, ahead as usize);
                }
            }
            let stat = if sp > 0 { totals[j][k] / dims[j] } else { 0.0 };
            opt.apply(
                &mut ls.data[r * w..(r + 1) * w],
                &mut ls.state[r * sp..(r + 1) * sp],
                &ss.grads[k * w..(k + 1) * w],
                stat,
            );
        }
    });
    counts.update_seconds += t_update.elapsed().as_secs_f64();
    Ok(counts)
}

/// Apply the (all-reduced) gradients of the data-parallel tables to this rank's
/// replicas: every row with a non-zero gradient, the same on every rank.
pub fn local_apply_replicated(store: &mut Store, grads: &StepGrads) {
    let opt = store.opt;
    let sp = opt.state_per_row();
    for (t, tg) in grads.tables.iter().enumerate() {
        let Some(li) = store.replica[t] else { continue };
        let dim = store.spec.tables[t].dim;
        let ls = &mut store.local[li];
        for (r, g) in tg.dense.chunks(dim).enumerate() {
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
            assert_eq!(d.get_or_insert(id, k as u32), h.get_or_insert(id, k as u32));
        }
    }
}
