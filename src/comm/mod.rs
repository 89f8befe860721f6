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
pub mod torus_coll;
pub mod watchdog;

pub use stats::{
    link_name, process_cpu_seconds, CommStats, LinkStats, Links, PhaseGuard, PhaseStats, Timer,
    MAX_DIMS,
};
pub use torus::{coords_to_rank, dims_create, parse_torus, rank_to_coords, Torus};
pub use torus_coll::Collectives;

use crate::error::{Error, Result};

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

impl<T> Default for Received<T> {
    fn default() -> Self {
        Received {
            data: Vec::new(),
            counts: Vec::new(),
        }
    }
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
    /// Every rank's part for this rank (`recv_counts[r]` from rank r, in rank order)
    /// into `recv`, whose allocation is reused when it is large enough.
    fn raw_all_to_all_v_into<T: Elem>(
        &self,
        send: &[T],
        send_counts: &[usize],
        recv_counts: &[usize],
        recv: &mut Vec<T>,
    ) -> Result<()>;
    fn raw_all_gather_u64(&self, value: u64) -> Vec<u64>;
    fn raw_all_gather_v<T: Elem>(&self, send: &[T], counts: &[usize]) -> Result<Vec<T>>;
    fn raw_broadcast<T: Elem>(&self, root: usize, buf: &mut [T]) -> Result<()>;
    /// Collective: every rank must call. Send `send` to the neighbour one step along
    /// `dim` (up: `+1`, else `-1`) and return what the neighbour one step the other
    /// way sent here (lengths may differ between ranks).
    fn raw_shift<T: Elem>(&self, dim: usize, up: bool, send: &[T]) -> Result<Vec<T>>;

    /// The start of a counted collective's time. With [`CommStats::set_sync_timing`],
    /// after an uncounted barrier, so that a rank's wait for slower ones is not
    /// counted as communication (for `project measure`).
    fn timer_start(&self) -> Timer {
        if self.stats().sync_timing() {
            self.raw_barrier();
        }
        Timer::start()
    }

    /// The end of a counted collective's time: the call's bytes and seconds added to
    /// the current phase. With [`CommStats::set_sync_timing`], then an uncounted
    /// barrier, so that no rank goes on computing while a slower one is still in the
    /// call: with more ranks than cores (or cores sharing a physical core) a rank that
    /// leaves a collective early takes the CPU the others need to end it, and their
    /// seconds would count its computation as communication.
    fn timer_stop(&self, bytes_sent: u64, bytes_recv: u64, t: Timer) {
        self.stats().record(bytes_sent, bytes_recv, t);
        if self.stats().sync_timing() {
            self.raw_barrier();
        }
    }

    /// Whether the counted collectives run on neighbour exchanges.
    fn on_torus(&self) -> bool {
        self.size() > 1 && self.stats().collectives() == Collectives::Torus
    }

    // ---- counted collectives ----

    /// Collective: every rank must call. Waits for all ranks.
    fn barrier(&self) {
        let t = self.timer_start();
        self.raw_barrier();
        self.timer_stop(0, 0, t);
    }

    /// Collective: every rank must call with a buffer of the same length.
    /// Element-wise sum over ranks, in place.
    fn all_reduce_sum<T: Summable>(&self, buf: &mut [T]) {
        let t = self.timer_start();
        if self.on_torus() {
            // A failed neighbour exchange is a broken job, not an input error.
            torus_coll::all_reduce_sum(self, buf).expect("torus all-reduce");
        } else {
            self.raw_all_reduce_sum(buf);
            if self.size() > 1 {
                torus_coll::record_all_reduce_links(self, buf.len(), std::mem::size_of::<T>());
            }
        }
        let b = if self.size() > 1 {
            bytes_of::<T>(buf.len())
        } else {
            0
        };
        self.timer_stop(b, b, t);
    }

    /// Collective: every rank must call. The maximum of `value` over ranks.
    fn all_reduce_max(&self, value: u64) -> u64 {
        let t = self.timer_start();
        let v = if self.on_torus() {
            torus_coll::all_reduce_max_u64(self, value).expect("torus all-reduce max")
        } else {
            self.raw_all_reduce_max_u64(value)
        };
        let b = if self.size() > 1 { 8 } else { 0 };
        self.timer_stop(b, b, t);
        v
    }

    /// Collective: every rank must call. `send` holds, in rank order, `send_counts[r]`
    /// elements for each rank r; returns what every rank sent here. Counts are
    /// exchanged first, then the payload; nothing is dropped.
    fn all_to_all_v<T: Elem>(&self, send: &[T], send_counts: &[usize]) -> Result<Received<T>> {
        let mut out = Received::default();
        self.all_to_all_v_into(send, send_counts, &mut out)?;
        Ok(out)
    }

    /// [`Comm::all_to_all_v_into`] that may take `send`'s buffer: on one rank the two
    /// buffers are swapped instead of copied. `send` is left with unspecified contents
    /// (a buffer to refill).
    fn all_to_all_v_move<T: Elem>(
        &self,
        send: &mut Vec<T>,
        send_counts: &[usize],
        out: &mut Received<T>,
    ) -> Result<()> {
        if self.size() == 1 && send_counts == [send.len()] {
            std::mem::swap(send, &mut out.data);
            out.counts.clear();
            out.counts.extend_from_slice(send_counts);
            return Ok(());
        }
        self.all_to_all_v_into(send, send_counts, out)
    }

    /// [`Comm::all_to_all_v`] into `out`, reusing its buffers: a step that exchanges
    /// the same amounts every time allocates nothing once they have grown.
    fn all_to_all_v_into<T: Elem>(
        &self,
        send: &[T],
        send_counts: &[usize],
        out: &mut Received<T>,
    ) -> Result<()> {
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
        out.counts.clear();
        if p == 1 {
            // Nothing to exchange: one copy, no library call.
            out.data.clear();
            crate::allocs::reserve_with_room(&mut out.data, send.len());
            out.data.extend_from_slice(send);
            out.counts.extend_from_slice(send_counts);
            return Ok(());
        }
        let t = self.timer_start();
        if self.on_torus() {
            let (data, recv_counts) = torus_coll::all_to_all_v(self, send, send_counts)?;
            out.data = data;
            out.counts = recv_counts;
        } else {
            out.counts = self.raw_all_to_all_counts(send_counts)?;
            self.raw_all_to_all_v_into(send, send_counts, &out.counts, &mut out.data)?;
            torus_coll::record_routed_links(self, send_counts, std::mem::size_of::<T>());
        }
        let me = self.rank();
        let off = |c: &[usize]| {
            c.iter()
                .enumerate()
                .filter(|&(r, _)| r != me)
                .map(|(_, &n)| n)
                .sum::<usize>()
        };
        let (hop_elems, elems) = torus_coll::routed_hops(&self.torus().dims, me, send_counts);
        let size = std::mem::size_of::<T>() as u64;
        self.stats().record_hops(hop_elems * size, elems * size);
        let counts_bytes = if p > 1 { 8 * (p as u64 - 1) } else { 0 };
        self.timer_stop(
            bytes_of::<T>(off(send_counts)) + counts_bytes,
            bytes_of::<T>(off(&out.counts)) + counts_bytes,
            t,
        );
        Ok(())
    }

    /// Collective: every rank must call. Concatenation, in rank order, of every
    /// rank's `send` (which may be empty); the counts are gathered first.
    fn all_gather_v<T: Elem>(&self, send: &[T]) -> Result<Received<T>> {
        let t = self.timer_start();
        let (data, counts) = if self.on_torus() {
            torus_coll::all_gather_v(self, send)?
        } else {
            let counts: Vec<usize> = self
                .raw_all_gather_u64(send.len() as u64)
                .into_iter()
                .map(|c| c as usize)
                .collect();
            let data = self.raw_all_gather_v(send, &counts)?;
            if self.size() > 1 {
                torus_coll::record_all_gather_links(self, &counts, std::mem::size_of::<T>());
            }
            (data, counts)
        };
        let p = self.size() as u64;
        let sent = bytes_of::<T>(send.len()) * (p - 1) + 8 * (p - 1);
        let recv = bytes_of::<T>(data.len() - send.len()) + 8 * (p - 1);
        self.timer_stop(sent, recv, t);
        Ok(Received { data, counts })
    }

    /// Collective: every rank must call. Rank `root`'s `buf` is copied into every
    /// rank's `buf` (all must have the same length).
    fn broadcast<T: Elem>(&self, root: usize, buf: &mut [T]) -> Result<()> {
        let t = self.timer_start();
        self.raw_broadcast(root, buf)?;
        let (s, r) = match (self.size(), self.rank() == root) {
            (1, _) => (0, 0),
            (p, true) => (bytes_of::<T>(buf.len()) * (p as u64 - 1), 0),
            (_, false) => (0, bytes_of::<T>(buf.len())),
        };
        self.timer_stop(s, r, t);
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

/// Collective: every rank must call. Every rank's `value` (as JSON), in rank order,
/// through the uncounted primitives (for summaries of the counters themselves).
pub fn raw_gather_json<C: Comm, T: serde::Serialize + serde::de::DeserializeOwned>(
    comm: &C,
    value: &T,
) -> Result<Vec<T>> {
    let mine = serde_json::to_vec(value).map_err(|e| Error::Comm(format!("stats: {e}")))?;
    let counts: Vec<usize> = comm
        .raw_all_gather_u64(mine.len() as u64)
        .into_iter()
        .map(|c| c as usize)
        .collect();
    let all = comm.raw_all_gather_v(&mine, &counts)?;
    let mut at = 0;
    counts
        .iter()
        .enumerate()
        .map(|(r, &c)| {
            let part = serde_json::from_slice(&all[at..at + c])
                .map_err(|e| Error::Comm(format!("stats from rank {r}: {e}")));
            at += c;
            part
        })
        .collect()
}

/// Collective: every rank must call. Every phase's counters summed over ranks
/// (calls are rank 0's; seconds are the maximum over ranks), for the end-of-run
/// summary. Not itself counted.
pub fn global_stats_summary<C: Comm>(comm: &C) -> Result<Vec<(String, PhaseStats)>> {
    let parts: Vec<Vec<(String, PhaseStats)>> = raw_gather_json(comm, &comm.stats().snapshot())?;
    let mut merged: Vec<(String, PhaseStats)> = Vec::new();
    for (r, part) in parts.into_iter().enumerate() {
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

/// The link traffic of one phase over the whole job (so far).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LinkSummary {
    /// The busiest outgoing link: its rank, name (`+x`, ...) and bytes.
    pub busiest_rank: usize,
    pub busiest_link: String,
    pub busiest_bytes: u64,
    /// Mean bytes over the links the torus has (2 per dimension of size > 1, per rank).
    pub mean_bytes: f64,
    pub messages: u64,
    /// Mean hops of the phase's all-to-all bytes under dimension-ordered routing.
    pub mean_hops: Option<f64>,
}

/// Collective: every rank must call. Per phase, the link traffic of all ranks (for
/// the end-of-run summary and the final metrics). Not itself counted.
pub fn global_link_summary<C: Comm>(comm: &C) -> Result<Vec<(String, LinkSummary)>> {
    #[allow(clippy::type_complexity)]
    let parts: Vec<(Vec<(String, Links)>, Vec<(String, [u64; 2])>)> =
        raw_gather_json(comm, &(comm.stats().links(), comm.stats().hops()))?;
    let live = 2 * comm.torus().dims.iter().filter(|&&n| n > 1).count();
    let mut out: Vec<(String, LinkSummary, f64, [u64; 2])> = Vec::new();
    for (r, (links, hops)) in parts.into_iter().enumerate() {
        let entry = |out: &mut Vec<(String, LinkSummary, f64, [u64; 2])>, name: &str| -> usize {
            match out.iter().position(|(n, ..)| n == name) {
                Some(i) => i,
                None => {
                    out.push((name.to_string(), LinkSummary::default(), 0.0, [0, 0]));
                    out.len() - 1
                }
            }
        };
        for (name, l) in links {
            let i = entry(&mut out, &name);
            for (k, s) in l.iter().enumerate() {
                let e = &mut out[i];
                e.2 += s.bytes as f64;
                e.1.messages += s.messages;
                if s.bytes > e.1.busiest_bytes {
                    e.1.busiest_bytes = s.bytes;
                    e.1.busiest_rank = r;
                    e.1.busiest_link = link_name(k);
                }
            }
        }
        for (name, h) in hops {
            let i = entry(&mut out, &name);
            out[i].3[0] += h[0];
            out[i].3[1] += h[1];
        }
    }
    let links_total = (live * comm.size()).max(1) as f64;
    Ok(out
        .into_iter()
        .map(|(n, mut s, total, h)| {
            s.mean_bytes = total / links_total;
            s.mean_hops = (h[1] > 0).then(|| h[0] as f64 / h[1] as f64);
            (n, s)
        })
        .collect())
}
