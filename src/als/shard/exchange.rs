//! Moving the fixed table's rows to the ranks that need them, once per half-epoch.
//!
//! `Dedup` (default): a plan built once from the data — the distinct remote ids each
//! rank's rows reference, grouped by owner — then an all-to-all-v per half-epoch that
//! moves each needed row exactly once. A rank's own rows are copied, never sent, and
//! the all-to-all goes in rounds of at most [`FETCH_ROUND_BYTES`] sent per rank, so the
//! send buffer stays small next to the gathered table.
//! `Allgather`: ALX's scheme, kept as the baseline — every rank all-gathers every rank's
//! ids, owners fill the rows they own into a dense `[all ids x d]` buffer (zeros
//! elsewhere) and a sum-all-reduce gives every rank every row; each keeps its part.
//! Both give bitwise the same gathered table (adding zeros is exact). Rows travel in the
//! tables' element type (f32 or bf16); the all-gather baseline sums in f32 (widening
//! and rounding back a bf16 value is exact), as a TPU's bf16 all-reduce would not.

use super::bounds::owner_of;
use crate::bf16::TableElem;
use crate::comm::{prefix_offsets, Comm, Elem, Received};
use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};

/// The most a rank sends in one round of a dedup fetch (split over the other ranks).
/// Tests lower it with `TORUSREC_FETCH_ROUND_BYTES` to exercise many rounds ([`round_bytes`]).
///
/// Small enough that the round buffers (one send, one receive, reused from round to
/// round) cost little to fault in: blocks of this size go back to the kernel when
/// freed (see `main.rs`), so every fetch maps them afresh. With 128 MiB rounds the
/// exchange phase of in-dense f32 at P = 2 took 0.6-0.8 s per epoch on 2 cores,
/// against 0.21-0.27 s with 16 MiB (and the peak RSS 39 MB lower).
pub const FETCH_ROUND_BYTES: usize = 16 << 20;

pub fn round_bytes() -> usize {
    std::env::var("TORUSREC_FETCH_ROUND_BYTES")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|&b| b > 0)
        .unwrap_or(FETCH_ROUND_BYTES)
}

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

/// The distinct ids of `indices` (all below `n_ids`), increasing; with `rewrite`, each
/// index is replaced by its id's position in that list. One pass to mark the ids used,
/// a scan of the marks, one pass to rewrite: O(nnz + n_ids) time and `4 n_ids` bytes,
/// for id spaces not much larger than the indices.
fn distinct_by_marks(indices: &mut [u32], n_ids: usize, rewrite: bool) -> Vec<u32> {
    const UNUSED: u32 = u32::MAX;
    let mut pos = vec![UNUSED; n_ids];
    for &x in indices.iter() {
        pos[x as usize] = 0;
    }
    let mut needed = Vec::new();
    for (id, p) in pos.iter_mut().enumerate() {
        if *p != UNUSED {
            *p = needed.len() as u32;
            needed.push(id as u32);
        }
    }
    if rewrite {
        for x in indices.iter_mut() {
            *x = pos[*x as usize];
        }
    }
    needed
}

/// [`distinct_by_marks`] by sorting a copy (for sparse use of a huge id space).
fn distinct_by_sort(indices: &mut [u32], rewrite: bool) -> Vec<u32> {
    let mut needed = indices.to_vec();
    needed.sort_unstable();
    needed.dedup();
    if rewrite {
        for x in indices.iter_mut() {
            // `needed` holds every index, so the search always succeeds.
            *x = needed.partition_point(|&v| v < *x) as u32;
        }
    }
    needed
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
        let n_ids = bounds.last().copied().unwrap_or(0);
        let rewrite = comm.size() > 1;
        let needed = if n_ids <= (indices.len() as u64).saturating_mul(4).max(1 << 20) {
            distinct_by_marks(indices, n_ids as usize, rewrite)
        } else {
            distinct_by_sort(indices, rewrite)
        };
        Self::global_from_needed(comm, kind, needed, bounds)
    }

    /// Collective: every rank must call. The plan that gathers `needed` (distinct
    /// global ids of the fixed side, increasing; empty for a rank that only serves).
    pub fn global_from_needed<C: Comm>(
        comm: &C,
        kind: ExchangeKind,
        needed: Vec<u32>,
        bounds: &[u64],
    ) -> Result<Self> {
        let _p = comm.stats().phase("plan");
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
        self.global_fetch_reusing(comm, local, d, Vec::new())
    }

    /// Collective: every rank must call. [`ExchangePlan::global_fetch`] into `out`, a
    /// buffer kept from an earlier fetch (refilled; reused when it is large enough: a
    /// fresh one of hundreds of MB costs its page faults and the kernel's zeroing
    /// again, at in-dense f32, P = 2, about 0.3 s per half on 2 cores).
    pub fn global_fetch_reusing<C: Comm, T: Elem + TableElem>(
        &self,
        comm: &C,
        local: &[T],
        d: usize,
        out: Vec<T>,
    ) -> Result<Option<Vec<T>>> {
        if self.identity {
            return Ok(None);
        }
        let _p = comm.stats().phase("exchange");
        match self.kind {
            ExchangeKind::Dedup => self.global_fetch_dedup(comm, local, d, out).map(Some),
            ExchangeKind::Allgather => self.global_fetch_allgather(comm, local, d, out).map(Some),
        }
    }

    /// Collective: every rank must call. [`ExchangePlan::global_fetch_reusing`] of a
    /// `Dedup` plan: the own rows copied, the others' moved in rounds of at most
    /// [`round_bytes`] sent per rank, into `out`.
    fn global_fetch_dedup<C: Comm, T: Elem + TableElem>(
        &self,
        comm: &C,
        local: &[T],
        d: usize,
        mut out: Vec<T>,
    ) -> Result<Vec<T>> {
        let lo = self.bounds[comm.rank()];
        let row = |id: u32| {
            let i = (id as u64 - lo) as usize;
            &local[i * d..(i + 1) * d]
        };
        let (me, p) = (comm.rank(), comm.size());
        let need_off = prefix_offsets(&self.need_counts);
        let n = self.needed.len() * d;
        if out.capacity() >= n {
            out.clear();
            out.resize(n, T::default());
        } else {
            // The old buffer goes before the new one is made.
            drop(std::mem::take(&mut out));
            out = crate::hugepages::huge_vec(n, T::default());
        }
        // Our own rows: a copy (they are `needed[need_off[me]..]`, in the order
        // we asked ourselves for them).
        for (k, &id) in self.serve.from_rank(me).iter().enumerate() {
            let at = (need_off[me] + k) * d;
            out[at..at + d].copy_from_slice(row(id));
        }
        // The others' rows in rounds; every rank runs the same number of them.
        let per_rank = (round_bytes() / (p - 1)).max(1);
        let chunk = (per_rank / (d.max(1) * std::mem::size_of::<T>())).max(1);
        let local_rounds = (0..p)
            .filter(|&r| r != me)
            .map(|r| {
                self.serve.counts[r]
                    .max(self.need_counts[r])
                    .div_ceil(chunk)
            })
            .max()
            .unwrap_or(0);
        let rounds = comm.all_reduce_max(local_rounds as u64) as usize;
        let part = |total: usize, round: usize| total.saturating_sub(round * chunk).min(chunk);
        let serve_off = self.serve.offsets();
        // The round buffers, reused from round to round.
        let mut send = Vec::new();
        let mut got = Received::default();
        for round in 0..rounds {
            send.clear();
            let mut counts = vec![0usize; p];
            for (r, c) in counts.iter_mut().enumerate() {
                if r == me {
                    continue;
                }
                let n = part(self.serve.counts[r], round);
                if n == 0 {
                    continue;
                }
                let first = serve_off[r] + round * chunk;
                for &id in &self.serve.data[first..first + n] {
                    send.extend_from_slice(row(id));
                }
                *c = n * d;
            }
            if round == 0 {
                crate::ckpt::faults::point("mid-alltoall", comm.rank());
            }
            comm.all_to_all_v_into(&send, &counts, &mut got)?;
            let want: Vec<usize> = (0..p)
                .map(|r| {
                    if r == me {
                        0
                    } else {
                        part(self.need_counts[r], round) * d
                    }
                })
                .collect();
            if got.counts != want {
                return Err(Error::Comm(format!(
                    "exchange round {round}: received {:?} values per rank, expected {want:?}",
                    got.counts
                )));
            }
            for r in (0..p).filter(|&r| r != me) {
                let src = got.from_rank(r);
                if src.is_empty() {
                    continue;
                }
                let at = (need_off[r] + round * chunk) * d;
                out[at..at + src.len()].copy_from_slice(src);
            }
        }
        Ok(out)
    }

    /// Collective: every rank must call. [`ExchangePlan::global_fetch_reusing`] of an
    /// `Allgather` plan (ALX's): every rank's ids gathered, the owners' rows summed into
    /// a dense f32 buffer, this rank's part kept in `out`.
    fn global_fetch_allgather<C: Comm, T: Elem + TableElem>(
        &self,
        comm: &C,
        local: &[T],
        d: usize,
        mut out: Vec<T>,
    ) -> Result<Vec<T>> {
        let lo = self.bounds[comm.rank()];
        let row = |id: u32| {
            let i = (id as u64 - lo) as usize;
            &local[i * d..(i + 1) * d]
        };
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
        out.clear();
        out.extend(
            dense[start * d..(start + self.needed.len()) * d]
                .iter()
                .map(|&x| T::from_f32(x)),
        );
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distinct_ids_by_marks_equal_by_sort() {
        let base: Vec<u32> = vec![7, 3, 3, 9, 0, 7, 12, 3, 1];
        for rewrite in [false, true] {
            let (mut a, mut b) = (base.clone(), base.clone());
            let na = distinct_by_marks(&mut a, 13, rewrite);
            let nb = distinct_by_sort(&mut b, rewrite);
            assert_eq!(na, vec![0, 1, 3, 7, 9, 12]);
            assert_eq!(na, nb);
            assert_eq!(a, b);
            if rewrite {
                assert_eq!(a, vec![3, 2, 2, 4, 0, 3, 5, 2, 1]);
            } else {
                assert_eq!(a, base);
            }
        }
    }
}
