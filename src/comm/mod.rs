//! The communicator: the only way algorithms talk to other ranks.
//!
//! [`Comm`] has typed collectives and three backends: MPI on a periodic Cartesian
//! torus ([`mpi_backend`], used by `main`), a single process ([`single`]) and threads
//! simulating N ranks in one process ([`threads`], for tests). Backends implement the
//! `raw_*` methods; algorithms call the counted wrappers, which add the bytes each rank
//! sends to and receives from *other* ranks, the calls and the time to the current
//! phase of [`CommStats`].
//!
//! Every collective must be called by every rank in the same order ("Collective" in
//! the doc comments); `local_*` helpers never communicate.

pub mod mpi_backend;
pub mod selftest;
pub mod single;
mod stats;
#[cfg(any(test, feature = "testing"))]
pub mod threads;
mod torus;

pub use stats::{CommStats, PhaseGuard, PhaseStats};
pub use torus::{dims_create, parse_torus, Torus};

use crate::error::{Error, Result};
use std::time::Instant;

/// The element types that collectives move.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ElemKind {
    U8,
    U16,
    U32,
    U64,
    F32,
    F64,
}

mod sealed {
    pub trait Sealed {}
}

/// A plain element type a collective can move (sealed: u8, u16, bf16, u32, u64, f32, f64).
pub trait Elem: sealed::Sealed + Copy + Default + Send + Sync + 'static {
    const KIND: ElemKind;
    /// Element-wise sum used by reductions (wrapping for integers).
    fn add(self, other: Self) -> Self;
}

macro_rules! elem {
    ($t:ty, $k:ident, int) => {
        impl sealed::Sealed for $t {}
        impl Elem for $t {
            const KIND: ElemKind = ElemKind::$k;
            #[inline]
            fn add(self, other: Self) -> Self {
                self.wrapping_add(other)
            }
        }
    };
    ($t:ty, $k:ident, float) => {
        impl sealed::Sealed for $t {}
        impl Elem for $t {
            const KIND: ElemKind = ElemKind::$k;
            #[inline]
            fn add(self, other: Self) -> Self {
                self + other
            }
        }
    };
}
elem!(u8, U8, int);
elem!(u16, U16, int);
elem!(u32, U32, int);
elem!(u64, U64, int);
elem!(f32, F32, float);
elem!(f64, F64, float);

// bf16 travels as its 16-bit pattern (never summed by a collective: not `Summable`).
impl sealed::Sealed for crate::bf16::Bf16 {}
impl Elem for crate::bf16::Bf16 {
    const KIND: ElemKind = ElemKind::U16;
    #[inline]
    fn add(self, other: Self) -> Self {
        Self::from_f32(self.to_f32() + other.to_f32())
    }
}

/// Element types that may be summed by [`Comm::all_reduce_sum`]: f32, f64, u64.
pub trait Summable: Elem {}
impl Summable for f32 {}
impl Summable for f64 {}
impl Summable for u64 {}

/// The received side of an all-to-all-v or all-gather-v: a flat buffer and how many
/// elements came from each rank, in rank order.
#[derive(Debug, Clone, PartialEq)]
pub struct Received<T> {
    pub data: Vec<T>,
    pub counts: Vec<usize>,
}

impl<T> Received<T> {
    /// The part that came from rank `r`.
    pub fn from_rank(&self, r: usize) -> &[T] {
        let start: usize = self.counts[..r].iter().sum();
        &self.data[start..start + self.counts[r]]
    }

    /// Offsets (exclusive prefix sums) of each rank's part, `size + 1` entries.
    pub fn offsets(&self) -> Vec<usize> {
        prefix_offsets(&self.counts)
    }
}

/// Exclusive prefix sums with the total appended: `[0, c0, c0+c1, ...]`.
pub fn prefix_offsets(counts: &[usize]) -> Vec<usize> {
    let mut out = Vec::with_capacity(counts.len() + 1);
    let mut acc = 0;
    out.push(0);
    for &c in counts {
        acc += c;
        out.push(acc);
    }
    out
}

fn bytes_of<T>(n: usize) -> u64 {
    (n * std::mem::size_of::<T>()) as u64
}

/// The project's communicator. Backends implement the `raw_*` methods; everything
/// else is provided and counted.
pub trait Comm {
    fn rank(&self) -> usize;
    fn size(&self) -> usize;
    /// This rank's place in the periodic torus.
    fn torus(&self) -> &Torus;
    /// Per-phase traffic and time counters of this rank.
    fn stats(&self) -> &CommStats;

    // ---- backend primitives (not counted; algorithms use the wrappers below) ----
    fn raw_barrier(&self);
    fn raw_all_reduce_sum<T: Summable>(&self, buf: &mut [T]);
    fn raw_all_reduce_max_u64(&self, value: u64) -> u64;
    /// Exchange one count with every rank: `recv[r]` is what rank r put at `send[self]`.
    fn raw_all_to_all_counts(&self, send: &[usize]) -> Result<Vec<usize>>;
    fn raw_all_to_all_v<T: Elem>(
        &self,
        send: &[T],
        send_counts: &[usize],
        recv_counts: &[usize],
    ) -> Result<Vec<T>>;
    fn raw_all_gather_u64(&self, value: u64) -> Vec<u64>;
    fn raw_all_gather_v<T: Elem>(&self, send: &[T], counts: &[usize]) -> Result<Vec<T>>;
    fn raw_broadcast<T: Elem>(&self, root: usize, buf: &mut [T]) -> Result<()>;

    // ---- counted collectives ----

    /// Collective: every rank must call. Waits for all ranks.
    fn barrier(&self) {
        let t = Instant::now();
        self.raw_barrier();
        self.stats().record(0, 0, t.elapsed());
    }

    /// Collective: every rank must call with a buffer of the same length.
    /// Element-wise sum over ranks, in place.
    fn all_reduce_sum<T: Summable>(&self, buf: &mut [T]) {
        let t = Instant::now();
        self.raw_all_reduce_sum(buf);
        let b = if self.size() > 1 {
            bytes_of::<T>(buf.len())
        } else {
            0
        };
        self.stats().record(b, b, t.elapsed());
    }

    /// Collective: every rank must call. The maximum of `value` over ranks.
    fn all_reduce_max(&self, value: u64) -> u64 {
        let t = Instant::now();
        let v = self.raw_all_reduce_max_u64(value);
        let b = if self.size() > 1 { 8 } else { 0 };
        self.stats().record(b, b, t.elapsed());
        v
    }

    /// Collective: every rank must call. `send` holds, in rank order, `send_counts[r]`
    /// elements for each rank r; returns what every rank sent here. Counts are
    /// exchanged first, then the payload; nothing is dropped.
    fn all_to_all_v<T: Elem>(&self, send: &[T], send_counts: &[usize]) -> Result<Received<T>> {
        let p = self.size();
        if send_counts.len() != p || send_counts.iter().sum::<usize>() != send.len() {
            return Err(Error::Comm(format!(
                "all_to_all_v: {} counts summing to {} for {} ranks and {} elements",
                send_counts.len(),
                send_counts.iter().sum::<usize>(),
                p,
                send.len()
            )));
        }
        if p == 1 {
            // Nothing to exchange: one copy, no library call.
            return Ok(Received {
                data: send.to_vec(),
                counts: send_counts.to_vec(),
            });
        }
        let t = Instant::now();
        let recv_counts = self.raw_all_to_all_counts(send_counts)?;
        let data = self.raw_all_to_all_v(send, send_counts, &recv_counts)?;
        let me = self.rank();
        let off = |c: &[usize]| {
            c.iter()
                .enumerate()
                .filter(|&(r, _)| r != me)
                .map(|(_, &n)| n)
                .sum::<usize>()
        };
        let counts_bytes = if p > 1 { 8 * (p as u64 - 1) } else { 0 };
        self.stats().record(
            bytes_of::<T>(off(send_counts)) + counts_bytes,
            bytes_of::<T>(off(&recv_counts)) + counts_bytes,
            t.elapsed(),
        );
        Ok(Received {
            data,
            counts: recv_counts,
        })
    }

    /// Collective: every rank must call. Concatenation, in rank order, of every
    /// rank's `send` (which may be empty); the counts are gathered first.
    fn all_gather_v<T: Elem>(&self, send: &[T]) -> Result<Received<T>> {
        let t = Instant::now();
        let counts: Vec<usize> = self
            .raw_all_gather_u64(send.len() as u64)
            .into_iter()
            .map(|c| c as usize)
            .collect();
        let data = self.raw_all_gather_v(send, &counts)?;
        let p = self.size() as u64;
        let sent = bytes_of::<T>(send.len()) * (p - 1) + 8 * (p - 1);
        let recv = bytes_of::<T>(data.len() - send.len()) + 8 * (p - 1);
        self.stats().record(sent, recv, t.elapsed());
        Ok(Received { data, counts })
    }

    /// Collective: every rank must call. Rank `root`'s `buf` is copied into every
    /// rank's `buf` (all must have the same length).
    fn broadcast<T: Elem>(&self, root: usize, buf: &mut [T]) -> Result<()> {
        let t = Instant::now();
        self.raw_broadcast(root, buf)?;
        let (s, r) = match (self.size(), self.rank() == root) {
            (1, _) => (0, 0),
            (p, true) => (bytes_of::<T>(buf.len()) * (p as u64 - 1), 0),
            (_, false) => (0, bytes_of::<T>(buf.len())),
        };
        self.stats().record(s, r, t.elapsed());
        Ok(())
    }

    /// Collective: every rank must call. Rank `root`'s vector, whatever its length,
    /// on every rank.
    fn broadcast_vec<T: Elem>(&self, root: usize, v: &mut Vec<T>) -> Result<()> {
        let mut len = [v.len() as u64];
        self.broadcast(root, &mut len)?;
        v.resize(len[0] as usize, T::default());
        self.broadcast(root, v)
    }

    /// Collective: every rank must call. Agree on success after rank-local work:
    /// if any rank failed, every rank returns an error with the same exit code. The
    /// lowest failing rank (among those with the highest exit code) keeps its own
    /// error, to be printed once; every other rank gets [`Error::Remote`] naming it.
    fn agree<T>(&self, local: Result<T>) -> Result<T> {
        let code = match &local {
            Ok(_) => 0u64,
            Err(e) => e.exit_code().clamp(1, 255) as u64,
        };
        let mine = if code == 0 {
            0
        } else {
            (code << 32) | (u32::MAX as u64 - self.rank() as u64)
        };
        let worst = self.all_reduce_max(mine);
        if worst == 0 {
            return local;
        }
        if worst == mine {
            return local;
        }
        Err(Error::Remote {
            rank: (u32::MAX as u64 - (worst & 0xffff_ffff)) as usize,
            code: (worst >> 32) as i32,
        })
    }
}

/// Collective: every rank must call. Every phase's counters summed over ranks
/// (calls are rank 0's; seconds are the maximum over ranks), for the end-of-run
/// summary. Not itself counted.
pub fn global_stats_summary<C: Comm>(comm: &C) -> Result<Vec<(String, PhaseStats)>> {
    let mine = serde_json::to_vec(&comm.stats().snapshot())
        .map_err(|e| Error::Comm(format!("stats: {e}")))?;
    let counts: Vec<usize> = comm
        .raw_all_gather_u64(mine.len() as u64)
        .into_iter()
        .map(|c| c as usize)
        .collect();
    let all = comm.raw_all_gather_v(&mine, &counts)?;
    let mut merged: Vec<(String, PhaseStats)> = Vec::new();
    let mut at = 0;
    for (r, &c) in counts.iter().enumerate() {
        let part: Vec<(String, PhaseStats)> = serde_json::from_slice(&all[at..at + c])
            .map_err(|e| Error::Comm(format!("stats from rank {r}: {e}")))?;
        at += c;
        for (name, s) in part {
            match merged.iter_mut().find(|(n, _)| *n == name) {
                Some((_, m)) => {
                    m.bytes_sent += s.bytes_sent;
                    m.bytes_recv += s.bytes_recv;
                    m.seconds = m.seconds.max(s.seconds);
                    if r == 0 {
                        m.calls = s.calls;
                    }
                }
                None => merged.push((name, s)),
            }
        }
    }
    Ok(merged)
}
