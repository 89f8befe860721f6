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
//! backward exchange, by phases), `owner_sums.rs` (the owners' sums over sources and
//! their updates), `request.rs` (the all-to-all request every exchange builds the same
//! way, and its parsing), `index.rs` (the dedup index) and `counts.rs` (what an
//! exchange moved). The last four sit below [`super::pooled`] too, which uses them.
//! This file keeps pooling and the step's gradients.

use rayon::prelude::*;

use super::pooled::{self, is_pooled_table};
use crate::allocs::{reserve_with_room as reserve_total, resize_for_overwrite};
use crate::data::clicks::batch::Batch;
use crate::embed::tables::row_kernels::{
    pool as pool_kernel, pool_weighted, scatter, scatter_weighted, Bag, Isa,
};
use crate::embed::tables::store::{input_offsets, Store};
use crate::spec::Pooling;

mod backward;
pub(super) mod counts;
pub(super) mod index;
mod lookup;
pub(super) mod owner_sums;
pub(super) mod request;

pub use backward::{global_backward, local_apply_replicated, BackwardBufs};
pub use counts::ExchangeCounts;
pub use lookup::{global_lookup, global_lookup_into, Lookup};
pub use owner_sums::SortScratch;

/// The MLP input of a batch (`n x (sum of dims + n_dense)`, row-major) into `lk.x`:
/// each `rows` table's pooled vector (sum or mean of its bag's rows, each row times
/// its weight for a weighted table, the mean dividing by the bag's length; zeros for
/// an empty bag) and the dense features; the `pooled` tables' columns are the lookup's.
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
                match batch.weights_of(t) {
                    Some(w) => pool_weighted(&rows[t], dim, bag, &w[lo..hi], out),
                    None => pool_kernel(isa, &rows[t], dim, bag, out),
                }
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
    /// Each occurrence's gradient is added in occurrence order, times its weight for
    /// a weighted table.
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
            let wts = batch.weights_of(t);
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
                    match wts {
                        Some(w) => scatter_weighted(&gs, dim, bag, &w[lo..hi], acc),
                        None => scatter(isa, &gs, dim, bag, acc),
                    }
                    continue;
                }
                // Without dedup every occurrence is its own entry.
                for k in lo..hi {
                    tg.ids.push(b.ids[k]);
                    let n = tg.grads.len();
                    tg.grads.resize(n + dim, 0.0);
                    let dst = &mut tg.grads[n..n + dim];
                    match wts {
                        Some(w) => dst
                            .iter_mut()
                            .zip(g)
                            .for_each(|(d, &gi)| *d += w[k] * (scale * gi)),
                        None => dst.iter_mut().zip(g).for_each(|(d, &gi)| *d += scale * gi),
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
mod tests;
