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
//!
//! Files: `lookup.rs` (the forward exchange, by phases), `backward.rs` (the
//! backward exchange, by phases, and the owners' sums and updates), `request.rs`
//! (the all-to-all request every exchange builds the same way, and its parsing).
//! This file keeps what both directions share: the dedup index, the counts, pooling
//! and the step's gradients.

use rayon::prelude::*;

use super::pooled;
use crate::allocs::{reserve_with_room as reserve_total, resize_for_overwrite};
use crate::clicks::batch::Batch;
use crate::embed::tables::placement::OutputMode;
use crate::embed::tables::row_kernels::{pool as pool_kernel, scatter, Bag, Isa};
use crate::embed::tables::store::Store;
use crate::spec::Pooling;

mod backward;
mod lookup;
mod request;

pub(super) use backward::{apply_rows, sum_sources_into};
pub use backward::{global_backward, local_apply_replicated, BackwardBufs, SortScratch};
pub use lookup::{global_lookup, global_lookup_into, Lookup};
pub(super) use request::{global_send_request, protocol_violation};

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

#[cfg(test)]
mod tests {
    use super::*;

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
