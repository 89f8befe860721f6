//! Collectives built from neighbour exchanges only, as a TPU's torus interconnect runs
//! them: every message moves one hop along one dimension of the torus per step
//! ([`Comm::raw_shift`]).
//!
//! - **All-reduce**: per dimension in turn, a bidirectional ring: the buffer's first
//!   half is reduce-scattered and all-gathered around the ring in the `+` direction,
//!   the second half in the `-` direction (`2 (n - 1)` steps per dimension of size
//!   `n`). Each chunk is reduced in a fixed order (its ring position order) and then
//!   copied, so every rank ends with the same bits, and the same shape gives the same
//!   bits on every run.
//! - **All-gather**: per dimension in turn, a bidirectional ring: every block's first
//!   half is forwarded around the ring in the `+` direction, its second half in the
//!   `-` direction, each step passing on what arrived in the previous one.
//! - **All-to-all-v**: dimension-ordered routing: messages travel along dimension 0
//!   until their coordinate matches the destination's, then along dimension 1, ...;
//!   each hop goes the shorter way around the ring (ties: `+`). A rank forwards what
//!   passes through it. The receiver orders what it got by source rank.
//!
//! Every shift is counted on its link (`+d`/`-d`) by [`super::CommStats`].

use super::{Comm, Elem, Summable};
use crate::error::{Error, Result};

/// Which algorithms the counted collectives use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Collectives {
    /// The MPI library's own (link counters computed from the traffic under
    /// dimension-ordered routing).
    #[default]
    Mpi,
    /// Neighbour exchanges only (this module).
    Torus,
}

impl std::str::FromStr for Collectives {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "mpi" => Ok(Collectives::Mpi),
            "torus" => Ok(Collectives::Torus),
            _ => Err(format!(
                "expected torus or mpi, got {}",
                crate::error::quote(s)
            )),
        }
    }
}

/// One counted hop: [`Comm::raw_shift`], its bytes added to the link it used.
fn shift<C: Comm + ?Sized, T: Elem>(comm: &C, dim: usize, up: bool, data: &[T]) -> Result<Vec<T>> {
    let got = comm.raw_shift(dim, up, data)?;
    comm.stats()
        .record_link(dim, up, std::mem::size_of_val(data) as u64);
    Ok(got)
}

/// Chunk `i` of `n` of a buffer of `len` elements (contiguous, sizes differing by 1).
pub fn chunk(len: usize, n: usize, i: usize) -> std::ops::Range<usize> {
    let (q, r) = (len / n, len % n);
    let start = i * q + i.min(r);
    start..start + q + usize::from(i < r)
}

/// Ring all-reduce of `buf` over dimension `dim` (size `n > 1`) in direction `up`.
fn ring_all_reduce<C: Comm + ?Sized, T: Summable>(
    comm: &C,
    dim: usize,
    up: bool,
    buf: &mut [T],
) -> Result<()> {
    let n = comm.torus().dims[dim];
    let me = comm.torus().coords[dim];
    // Position along the ring in the direction of travel.
    let pos = if up { me } else { (n - me) % n };
    let len = buf.len();
    // Reduce-scatter: at step s send chunk (pos - s), receive chunk (pos - s - 1).
    for s in 0..n - 1 {
        let send_c = chunk(len, n, (pos + n - s) % n);
        let recv_c = chunk(len, n, (pos + 2 * n - s - 1) % n);
        let got = shift(comm, dim, up, &buf[send_c])?;
        if got.len() != recv_c.len() {
            return Err(Error::Comm(format!(
                "torus all-reduce: got {} values for a chunk of {}",
                got.len(),
                recv_c.len()
            )));
        }
        for (b, g) in buf[recv_c].iter_mut().zip(got) {
            // The incoming partial sum first: the order of a chunk's additions follows
            // the ring, the same on every run.
            *b = g.add(*b);
        }
    }
    // All-gather: rank at `pos` owns the full chunk (pos + 1).
    for s in 0..n - 1 {
        let send_c = chunk(len, n, (pos + 1 + n - s) % n);
        let recv_c = chunk(len, n, (pos + 2 * n - s) % n);
        let got = shift(comm, dim, up, &buf[send_c])?;
        if got.len() != recv_c.len() {
            return Err(Error::Comm(
                "torus all-gather step: chunk size mismatch".into(),
            ));
        }
        buf[recv_c].copy_from_slice(&got);
    }
    Ok(())
}

/// All-reduce (sum) from neighbour exchanges: per dimension, two rings (the buffer's
/// halves in opposite directions).
pub fn all_reduce_sum<C: Comm + ?Sized, T: Summable>(comm: &C, buf: &mut [T]) -> Result<()> {
    let dims = comm.torus().dims.clone();
    for (d, &n) in dims.iter().enumerate() {
        if n < 2 {
            continue;
        }
        let half = buf.len() / 2;
        let (lo, hi) = buf.split_at_mut(half);
        ring_all_reduce(comm, d, true, hi)?;
        ring_all_reduce(comm, d, false, lo)?;
    }
    Ok(())
}

/// Maximum over ranks from neighbour exchanges (one value around each ring).
pub fn all_reduce_max_u64<C: Comm + ?Sized>(comm: &C, value: u64) -> Result<u64> {
    let dims = comm.torus().dims.clone();
    let mut v = value;
    for (d, &n) in dims.iter().enumerate() {
        let mut carry = v;
        for _ in 0..n.saturating_sub(1) {
            let got = shift(comm, d, true, &[carry])?;
            carry = *got
                .first()
                .ok_or_else(|| Error::Comm("torus max: empty".into()))?;
            v = v.max(carry);
        }
    }
    Ok(v)
}

/// For MPI's all-reduce: the link bytes the torus algorithm would have put on this
/// rank's links (`len` elements of `size` bytes), recorded on the current phase.
pub fn record_all_reduce_links<C: Comm + ?Sized>(comm: &C, len: usize, size: usize) {
    let t = comm.torus();
    let mut adds = Vec::new();
    for (d, &n) in t.dims.iter().enumerate() {
        if n < 2 {
            continue;
        }
        let half = len / 2;
        for (up, part) in [(true, len - half), (false, half)] {
            let me = t.coords[d];
            let pos = if up { me } else { (n - me) % n };
            let mut bytes = 0u64;
            for s in 0..n - 1 {
                bytes += chunk(part, n, (pos + n - s) % n).len() as u64;
                bytes += chunk(part, n, (pos + 1 + n - s) % n).len() as u64;
            }
            let link = 2 * d + usize::from(!up);
            adds.push((link, bytes * size as u64, 2 * (n as u64 - 1)));
        }
    }
    comm.stats().record_links(&adds);
}

/// For MPI's all-to-all-v: each of this rank's messages attributed, hop by hop, to
/// the links dimension-ordered routing would carry it over (all hops counted at the
/// source), recorded on the current phase.
pub fn record_routed_links<C: Comm + ?Sized>(comm: &C, send_counts: &[usize], size: usize) {
    let t = comm.torus();
    let mut adds = Vec::new();
    for (dst, &c) in send_counts.iter().enumerate() {
        if c == 0 || dst == comm.rank() {
            continue;
        }
        let to = super::torus::rank_to_coords(&t.dims, dst);
        for (d, &n) in t.dims.iter().enumerate() {
            let s = ring_steps(t.coords[d], to[d], n);
            if s != 0 {
                let link = 2 * d + usize::from(s < 0);
                adds.push((
                    link,
                    (c * size) as u64 * s.unsigned_abs() as u64,
                    s.unsigned_abs() as u64,
                ));
            }
        }
    }
    comm.stats().record_links(&adds);
}

/// For MPI's all-gather-v: the payload bytes the torus ring algorithm would put on
/// this rank's `+d` and `-d` links (`counts` elements of `size` bytes per rank).
pub fn record_all_gather_links<C: Comm + ?Sized>(comm: &C, counts: &[usize], size: usize) {
    let t = comm.torus();
    let dims = &t.dims;
    let mut adds = Vec::new();
    for (d, &n) in dims.iter().enumerate() {
        if n < 2 {
            continue;
        }
        // The + ring carries each block's first half, the - ring its second half.
        for (up, part) in [(true, 0usize), (false, 1)] {
            let mut bytes = 0u64;
            for s in 0..n - 1 {
                // At step s this rank forwards the halves held by its ring predecessor
                // at distance s before dimension d: ranks equal to it in dims >= d.
                let mut from = t.coords.clone();
                from[d] = if up {
                    (from[d] + n - s) % n
                } else {
                    (from[d] + s) % n
                };
                for (r, &c) in counts.iter().enumerate() {
                    let rc = super::torus::rank_to_coords(dims, r);
                    if (d..dims.len()).all(|k| rc[k] == from[k]) {
                        let h = if part == 0 { c / 2 } else { c - c / 2 };
                        bytes += (h * size) as u64;
                    }
                }
            }
            adds.push((2 * d + usize::from(!up), bytes, n as u64 - 1));
        }
    }
    comm.stats().record_links(&adds);
}

/// Hops of the all-to-all traffic `send_counts` (elements per destination) under
/// dimension-ordered routing: `(element-hops, elements)` over messages to others.
pub fn routed_hops(dims: &[usize], from: usize, send_counts: &[usize]) -> (u64, u64) {
    let me = super::torus::rank_to_coords(dims, from);
    let (mut hops, mut elems) = (0u64, 0u64);
    for (dst, &c) in send_counts.iter().enumerate() {
        if c == 0 || dst == from {
            continue;
        }
        let to = super::torus::rank_to_coords(dims, dst);
        let h: u64 = dims
            .iter()
            .enumerate()
            .map(|(d, &n)| ring_steps(me[d], to[d], n).unsigned_abs() as u64)
            .sum();
        hops += h * c as u64;
        elems += c as u64;
    }
    (hops, elems)
}

/// Blocks held by a rank during a gather or routing: `(header, data)` where the header
/// is `[source, destination, length]` per block.
struct Packets<T> {
    head: Vec<u64>,
    data: Vec<T>,
}

impl<T: Elem> Packets<T> {
    fn new() -> Self {
        Self::with_capacity(0)
    }
    fn with_capacity(values: usize) -> Self {
        Packets {
            head: Vec::new(),
            data: Vec::with_capacity(values),
        }
    }
    fn push(&mut self, src: usize, dst: usize, data: &[T]) {
        self.head
            .extend([src as u64, dst as u64, data.len() as u64]);
        self.data.extend_from_slice(data);
    }
    fn iter(&self) -> impl Iterator<Item = (usize, usize, &[T])> {
        let mut off = 0;
        self.head.chunks_exact(3).map(move |h| {
            let len = h[2] as usize;
            let d = &self.data[off..off + len];
            off += len;
            (h[0] as usize, h[1] as usize, d)
        })
    }
    fn check(&self) -> Result<()> {
        let want: u64 = self.head.chunks_exact(3).map(|h| h[2]).sum();
        if !self.head.len().is_multiple_of(3) || want != self.data.len() as u64 {
            return Err(Error::Comm(format!(
                "torus routing: headers announce {want} values, {} arrived",
                self.data.len()
            )));
        }
        Ok(())
    }
    /// Send these packets one hop along `dim` in direction `up`; return what arrived.
    fn shift<C: Comm + ?Sized>(&self, comm: &C, dim: usize, up: bool) -> Result<Packets<T>> {
        let head = shift(comm, dim, up, &self.head)?;
        let data = shift(comm, dim, up, &self.data)?;
        let p = Packets { head, data };
        p.check()?;
        Ok(p)
    }
}

/// All-gather-v from neighbour exchanges: `(data in rank order, counts)`.
pub fn all_gather_v<C: Comm + ?Sized, T: Elem>(
    comm: &C,
    send: &[T],
) -> Result<(Vec<T>, Vec<usize>)> {
    let p = comm.size();
    let me = comm.rank();
    let dims = comm.torus().dims.clone();
    // Every block travels as two halves: the first around each ring in the `+`
    // direction, the second in the `-` direction (a bidirectional ring).
    let half = send.len() / 2;
    let mut have: [Vec<Option<Vec<T>>>; 2] = [vec![None; p], vec![None; p]];
    have[0][me] = Some(send[..half].to_vec());
    have[1][me] = Some(send[half..].to_vec());
    for (d, &n) in dims.iter().enumerate() {
        for (side, up) in [(0usize, true), (1, false)] {
            // Forward, n - 1 times, what arrived last (first: everything held).
            let mut last = Packets::new();
            for (r, b) in have[side].iter().enumerate() {
                if let Some(b) = b {
                    last.push(r, r, b);
                }
            }
            for _ in 0..n.saturating_sub(1) {
                let got = last.shift(comm, d, up)?;
                for (src, _, b) in got.iter() {
                    if src >= p || have[side][src].is_some() {
                        return Err(Error::Comm(format!("torus all-gather: block {src} twice")));
                    }
                    have[side][src] = Some(b.to_vec());
                }
                last = got;
            }
        }
    }
    let [lo, hi] = have;
    let mut data = Vec::new();
    let mut counts = Vec::with_capacity(p);
    for (r, (a, b)) in lo.into_iter().zip(hi).enumerate() {
        let missing = || Error::Comm(format!("torus all-gather: no block of {r}"));
        let (a, b) = (a.ok_or_else(missing)?, b.ok_or_else(missing)?);
        counts.push(a.len() + b.len());
        data.extend(a);
        data.extend(b);
    }
    Ok((data, counts))
}

/// The signed shortest step count from coordinate `a` to `b` on a ring of `n`
/// (ties go `+`).
pub fn ring_steps(a: usize, b: usize, n: usize) -> isize {
    let fwd = (b + n - a) % n;
    if fwd <= n / 2 {
        fwd as isize
    } else {
        fwd as isize - n as isize
    }
}

/// A block held by a rank during [`all_to_all_v`]'s routing: its source and
/// destination, and where its values are (`buf` 0: the caller's send buffer; `k > 0`:
/// the `k`-th data message that arrived here).
#[derive(Clone, Copy)]
struct Block {
    src: usize,
    dst: usize,
    buf: usize,
    at: usize,
    len: usize,
}

/// All-to-all-v by dimension-ordered routing: `(data by source rank, counts)`.
///
/// A block is copied only to go on the wire and once into the result: a block that
/// stays on this rank for a hop, or arrives here, is held where it is (in the send
/// buffer or in the message it came in), not copied into a new buffer at every hop.
/// The bytes and messages on the links are the same either way
/// (`project::traffic::all_to_all`); what differs is the memory the ranks of one
/// machine copy and fault in on their shared cores (at 2x2 with 8 MB per rank, about
/// 56 MB copied per rank and call before, 24 MB now).
pub fn all_to_all_v<C: Comm + ?Sized, T: Elem>(
    comm: &C,
    send: &[T],
    send_counts: &[usize],
) -> Result<(Vec<T>, Vec<usize>)> {
    let p = comm.size();
    let me = comm.rank();
    let dims = comm.torus().dims.clone();
    let coords: Vec<Vec<usize>> = (0..p)
        .map(|r| super::torus::rank_to_coords(&dims, r))
        .collect();
    let mut held = Vec::with_capacity(p);
    let mut off = 0;
    for (dst, &c) in send_counts.iter().enumerate() {
        held.push(Block {
            src: me,
            dst,
            buf: 0,
            at: off,
            len: c,
        });
        off += c;
    }
    // The data messages that arrived; a slot is emptied once no held block is in it.
    let mut arrived: Vec<Vec<T>> = Vec::new();
    fn slice<'a, T>(send: &'a [T], arrived: &'a [Vec<T>], b: &Block) -> &'a [T] {
        let buf = if b.buf == 0 {
            send
        } else {
            &arrived[b.buf - 1][..]
        };
        &buf[b.at..b.at + b.len]
    }
    let my = &coords[me];
    for (d, &n) in dims.iter().enumerate() {
        if n < 2 {
            continue;
        }
        // Hops along d: at most n / 2 each way; every rank takes part in every hop.
        for _ in 0..n / 2 {
            let way = |b: &Block| ring_steps(my[d], coords[b.dst][d], n).signum();
            let (mut up_len, mut down_len) = (0, 0);
            for b in &held {
                match way(b) {
                    1 => up_len += b.len,
                    -1 => down_len += b.len,
                    _ => {}
                }
            }
            let mut up = Packets::with_capacity(up_len);
            let mut down = Packets::with_capacity(down_len);
            let mut stay = Vec::with_capacity(held.len());
            for b in held {
                match way(&b) {
                    0 => stay.push(b),
                    1 => up.push(b.src, b.dst, slice(send, &arrived, &b)),
                    _ => down.push(b.src, b.dst, slice(send, &arrived, &b)),
                }
            }
            let from_down = up.shift(comm, d, true)?;
            let from_up = down.shift(comm, d, false)?;
            drop((up, down));
            held = stay;
            // Free the messages no block is held in any more.
            let mut live = vec![false; arrived.len()];
            for b in held.iter().filter(|b| b.buf > 0) {
                live[b.buf - 1] = true;
            }
            for (slot, live) in arrived.iter_mut().zip(live) {
                if !live {
                    *slot = Vec::new();
                }
            }
            for got in [from_down, from_up] {
                let buf = arrived.len() + 1;
                let mut at = 0;
                for h in got.head.chunks_exact(3) {
                    let len = h[2] as usize;
                    held.push(Block {
                        src: h[0] as usize,
                        dst: h[1] as usize,
                        buf,
                        at,
                        len,
                    });
                    at += len;
                }
                arrived.push(got.data);
            }
        }
    }
    let mut by_src: Vec<Option<Block>> = vec![None; p];
    for b in held {
        if b.dst != me || b.src >= p || by_src[b.src].is_some() {
            return Err(Error::Comm(format!(
                "torus all-to-all: rank {me} holds a message {} -> {}",
                b.src, b.dst
            )));
        }
        by_src[b.src] = Some(b);
    }
    let mut counts = Vec::with_capacity(p);
    for (r, b) in by_src.iter().enumerate() {
        let b = b.ok_or_else(|| Error::Comm(format!("torus all-to-all: nothing from {r}")))?;
        counts.push(b.len);
    }
    let mut data = Vec::with_capacity(counts.iter().sum());
    for b in by_src.iter().flatten() {
        data.extend_from_slice(slice(send, &arrived, b));
    }
    Ok((data, counts))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_tile_the_buffer() {
        for len in [0usize, 1, 5, 64, 67] {
            for n in 1..6 {
                let mut next = 0;
                for i in 0..n {
                    let c = chunk(len, n, i);
                    assert_eq!(c.start, next);
                    next = c.end;
                }
                assert_eq!(next, len);
            }
        }
    }

    #[test]
    fn ring_steps_take_the_short_way() {
        assert_eq!(ring_steps(0, 1, 4), 1);
        assert_eq!(ring_steps(0, 3, 4), -1);
        assert_eq!(ring_steps(0, 2, 4), 2);
        assert_eq!(ring_steps(3, 1, 5), -2);
        assert_eq!(ring_steps(1, 3, 5), 2);
        assert_eq!(ring_steps(2, 2, 3), 0);
    }
}
