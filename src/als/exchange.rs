//! Moving the fixed table's rows to the ranks that need them, once per half-epoch.
//!
//! `Dedup` (default): a plan built once from the data — the distinct remote ids each
//! rank's rows reference, grouped by owner — then one all-to-all-v per half-epoch that
//! moves each needed row exactly once.
//! `Allgather`: ALX's scheme, kept as the baseline — every rank all-gathers every rank's
//! ids, owners fill the rows they own into a dense `[all ids x d]` buffer (zeros
//! elsewhere) and a sum-all-reduce gives every rank every row; each keeps its part.
//! Both give bitwise the same gathered table (adding zeros is exact). Rows travel in the
//! tables' element type (f32 or bf16); the all-gather baseline sums in f32 (widening
//! and rounding back a bf16 value is exact), as a TPU's bf16 all-reduce would not.

use super::shard::owner_of;
use crate::bf16::TableElem;
use crate::comm::{Comm, Elem, Received};
use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
pub enum ExchangeKind {
    /// Deduplicated all-to-all-v: each needed row moves once per half-epoch.
    Dedup,
    /// ALX's all-gather of ids and dense sum-reduce (the baseline).
    Allgather,
}

/// What a rank needs from the fixed table and how to get it.
#[derive(Debug, Clone)]
pub struct ExchangePlan {
    pub kind: ExchangeKind,
    /// Distinct global ids this rank needs, increasing (so grouped by owner).
    pub needed: Vec<u32>,
    /// How many of `needed` each rank owns.
    need_counts: Vec<usize>,
    /// Dedup: the ids every rank asked this rank for, in its order.
    serve: Received<u32>,
    /// Allgather: the lengths of every rank's `needed` list.
    all_counts: Vec<usize>,
    /// Owner boundaries of the fixed table.
    bounds: Vec<u64>,
    /// One rank: indices point straight into the local table and nothing moves.
    identity: bool,
}

impl ExchangePlan {
    /// Collective: every rank must call. `indices` are the global ids of the fixed
    /// side that this rank's rows reference (any order, repeats allowed); they are
    /// rewritten in place to positions in the gathered table.
    pub fn global_build<C: Comm>(
        comm: &C,
        kind: ExchangeKind,
        indices: &mut [u32],
        bounds: &[u64],
    ) -> Result<Self> {
        let _p = comm.stats().phase("plan");
        let mut needed = indices.to_vec();
        needed.sort_unstable();
        needed.dedup();
        if comm.size() == 1 {
            // The local table is the whole table: keep the global ids as positions.
            return Ok(Self {
                kind,
                need_counts: vec![needed.len()],
                needed,
                serve: Received {
                    data: Vec::new(),
                    counts: vec![0],
                },
                all_counts: Vec::new(),
                bounds: bounds.to_vec(),
                identity: true,
            });
        }
        for x in indices.iter_mut() {
            // `needed` holds every index, so the search always succeeds.
            *x = needed.partition_point(|&v| v < *x) as u32;
        }
        let p = comm.size();
        let mut need_counts = vec![0usize; p];
        for &id in &needed {
            need_counts[owner_of(bounds, id as u64)] += 1;
        }
        let (serve, all_counts) = match kind {
            ExchangeKind::Dedup => (comm.all_to_all_v(&needed, &need_counts)?, Vec::new()),
            ExchangeKind::Allgather => {
                let c = comm
                    .raw_all_gather_u64(needed.len() as u64)
                    .into_iter()
                    .map(|c| c as usize)
                    .collect();
                (
                    Received {
                        data: Vec::new(),
                        counts: vec![0; p],
                    },
                    c,
                )
            }
        };
        Ok(Self {
            kind,
            needed,
            need_counts,
            serve,
            all_counts,
            bounds: bounds.to_vec(),
            identity: false,
        })
    }

    /// Rows of the gathered table.
    pub fn len(&self) -> usize {
        self.needed.len()
    }

    pub fn is_empty(&self) -> bool {
        self.needed.is_empty()
    }

    /// Collective: every rank must call. The rows `needed` of the distributed table
    /// whose local shard (rows `bounds[rank]..bounds[rank+1]`, width `d`) is `local`;
    /// `None` on one rank, where the indices address `local` itself.
    pub fn global_fetch<C: Comm, T: Elem + TableElem>(
        &self,
        comm: &C,
        local: &[T],
        d: usize,
    ) -> Result<Option<Vec<T>>> {
        if self.identity {
            return Ok(None);
        }
        let _p = comm.stats().phase("exchange");
        let lo = self.bounds[comm.rank()];
        let row = |id: u32| {
            let i = (id as u64 - lo) as usize;
            &local[i * d..(i + 1) * d]
        };
        match self.kind {
            ExchangeKind::Dedup => {
                let mut send = Vec::with_capacity(self.serve.data.len() * d);
                for &id in &self.serve.data {
                    send.extend_from_slice(row(id));
                }
                let counts: Vec<usize> = self.serve.counts.iter().map(|c| c * d).collect();
                crate::ckpt::faults::point("mid-alltoall", comm.rank());
                let got = comm.all_to_all_v(&send, &counts)?;
                let want: Vec<usize> = self.need_counts.iter().map(|c| c * d).collect();
                if got.counts != want {
                    return Err(Error::Comm(format!(
                        "exchange: received {:?} values per rank, expected {want:?}",
                        got.counts
                    )));
                }
                Ok(Some(got.data))
            }
            ExchangeKind::Allgather => {
                // ALX: gather every rank's ids (every half-epoch, as its batches change).
                let ids = comm.all_gather_v(&self.needed)?;
                let total = ids.data.len();
                let mut dense = vec![0f32; total * d];
                let hi = self.bounds[comm.rank() + 1];
                for (k, &id) in ids.data.iter().enumerate() {
                    if (id as u64) >= lo && (id as u64) < hi {
                        crate::bf16::widen(row(id), &mut dense[k * d..(k + 1) * d]);
                    }
                }
                comm.all_reduce_sum(&mut dense);
                let start: usize = self.all_counts[..comm.rank()].iter().sum();
                Ok(Some(
                    dense[start * d..(start + self.needed.len()) * d]
                        .iter()
                        .map(|&x| T::from_f32(x))
                        .collect(),
                ))
            }
        }
    }
}
