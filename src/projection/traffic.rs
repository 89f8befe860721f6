//! The link traffic of the torus collectives (`comm::torus_coll`), computed without
//! running them: for every rank and outgoing link the bytes and messages the
//! algorithm puts on it, and the chain of synchronous shifts that bounds its time.
//!
//! Each function mirrors one algorithm step for step (same chunks, same halves, same
//! 24-byte packet headers, the same forwarding rank for every hop), so a measured run
//! with `--collectives torus` counts exactly these bytes and messages (tested in
//! tests/faults/project.rs). Time: every shift is synchronous over the torus (each rank sends
//! one message to one neighbour and waits for one), so a collective's time is the sum
//! over its shifts of `latency + (largest message of that shift) / bandwidth`; the
//! model keeps the two sums ([`Traffic::serial_messages`], [`Traffic::serial_bytes`])
//! apart from the link parameters.

use crate::comm::torus_coll::{chunk, ring_steps};
use crate::comm::{coords_to_rank, rank_to_coords};
use crate::comm::{Links, MAX_DIMS};

/// Bytes of a routed packet's header (`[source, destination, length]` as u64).
pub const HEADER_BYTES: u64 = 24;

/// The traffic of some collectives on a torus: per rank and link, and along the
/// critical chain of shifts.
#[derive(Debug, Clone, PartialEq)]
pub struct Traffic {
    pub dims: Vec<usize>,
    /// Per rank, per link (`2 d` for `+d`, `2 d + 1` for `-d`).
    pub links: Vec<Links>,
    /// Shifts one after the other (each costs one latency).
    pub serial_messages: u64,
    /// Sum over those shifts of the largest message of each.
    pub serial_bytes: u64,
}

impl Traffic {
    pub fn new(dims: &[usize]) -> Self {
        assert!(
            dims.len() <= MAX_DIMS,
            "at most {MAX_DIMS} torus dimensions"
        );
        let p: usize = dims.iter().product();
        Traffic {
            dims: dims.to_vec(),
            links: vec![Links::default(); p],
            serial_messages: 0,
            serial_bytes: 0,
        }
    }

    pub fn size(&self) -> usize {
        self.links.len()
    }

    fn put(&mut self, rank: usize, link: usize, bytes: u64) {
        let s = &mut self.links[rank][link];
        s.bytes += bytes;
        s.messages += 1;
    }

    /// One synchronous shift whose largest message has `max_bytes`.
    fn step(&mut self, max_bytes: u64) {
        self.serial_messages += 1;
        self.serial_bytes += max_bytes;
    }

    /// Add another traffic on the same torus (collectives one after the other).
    pub fn add(&mut self, o: &Traffic) {
        assert_eq!(self.dims, o.dims, "traffic of different tori");
        for (a, b) in self.links.iter_mut().zip(&o.links) {
            for (x, y) in a.iter_mut().zip(b) {
                x.bytes += y.bytes;
                x.messages += y.messages;
            }
        }
        self.serial_messages += o.serial_messages;
        self.serial_bytes += o.serial_bytes;
    }

    /// This traffic `k` times over.
    pub fn times(&self, k: u64) -> Traffic {
        let mut t = self.clone();
        for l in t.links.iter_mut().flatten() {
            l.bytes *= k;
            l.messages *= k;
        }
        t.serial_messages *= k;
        t.serial_bytes *= k;
        t
    }

    /// Seconds on links of `latency` seconds per message and `bandwidth` bytes/s.
    pub fn seconds(&self, latency: f64, bandwidth: f64) -> f64 {
        self.serial_messages as f64 * latency + self.serial_bytes as f64 / bandwidth
    }

    /// The bytes on every link of every rank, summed.
    pub fn total_bytes(&self) -> u64 {
        self.links.iter().flatten().map(|l| l.bytes).sum()
    }

    /// [`Traffic::seconds`] plus, when the ranks share one machine's cores and memory
    /// (`node_bandwidth`, bytes/s over all links together), every link's bytes through
    /// it: the ranks of a chain's hop copy their messages on the same cores.
    pub fn seconds_on_node(
        &self,
        latency: f64,
        bandwidth: f64,
        node_bandwidth: Option<f64>,
    ) -> f64 {
        self.seconds(latency, bandwidth)
            + node_bandwidth.map_or(0.0, |nb| self.total_bytes() as f64 / nb)
    }

    /// The busiest outgoing link `(rank, link, bytes)` (first in rank, then link order)
    /// and the mean bytes over the links the torus has (2 per dimension of size > 1,
    /// per rank): the same summary as `comm::global_link_summary`.
    pub fn summary(&self) -> (usize, usize, u64, f64) {
        let mut best = (0, 0, 0u64);
        let mut total = 0f64;
        for (r, l) in self.links.iter().enumerate() {
            for (k, s) in l.iter().enumerate() {
                total += s.bytes as f64;
                if s.bytes > best.2 {
                    best = (r, k, s.bytes);
                }
            }
        }
        let live = 2 * self.dims.iter().filter(|&&n| n > 1).count();
        let mean = total / ((live * self.size()).max(1) as f64);
        (best.0, best.1, best.2, mean)
    }
}

/// `torus_coll::all_reduce_sum` of `len` elements of `elem` bytes.
pub fn all_reduce(dims: &[usize], len: usize, elem: u64) -> Traffic {
    let mut t = Traffic::new(dims);
    let p = t.size();
    for (d, &n) in dims.iter().enumerate() {
        if n < 2 {
            continue;
        }
        let half = len / 2;
        // The upper half around the + ring first, then the lower half around the -.
        for (up, part) in [(true, len - half), (false, half)] {
            let link = 2 * d + usize::from(!up);
            for phase in 0..2 {
                for s in 0..n - 1 {
                    let mut max = 0;
                    for r in 0..p {
                        let me = rank_to_coords(dims, r)[d];
                        let pos = if up { me } else { (n - me) % n };
                        // Reduce-scatter sends chunk (pos - s), all-gather (pos + 1 - s).
                        let c = (pos + phase + n - s) % n;
                        let b = chunk(part, n, c).len() as u64 * elem;
                        t.put(r, link, b);
                        max = max.max(b);
                    }
                    t.step(max);
                }
            }
        }
    }
    t
}

/// `torus_coll::all_reduce_max_u64`: one u64 around each ring in the `+` direction.
pub fn all_reduce_max(dims: &[usize]) -> Traffic {
    let mut t = Traffic::new(dims);
    for (d, &n) in dims.iter().enumerate() {
        for _ in 0..n.saturating_sub(1) {
            for r in 0..t.size() {
                t.put(r, 2 * d, 8);
            }
            t.step(8);
        }
    }
    t
}

/// `torus_coll::all_to_all_v` where rank `src` sends `bytes(src, dst)` bytes to `dst`
/// (a message, with its header, exists for every pair, empty or not).
pub fn all_to_all(dims: &[usize], bytes: &dyn Fn(usize, usize) -> u64) -> Traffic {
    let mut t = Traffic::new(dims);
    let p = t.size();
    let coords: Vec<Vec<usize>> = (0..p).map(|r| rank_to_coords(dims, r)).collect();
    for (d, &n) in dims.iter().enumerate() {
        if n < 2 {
            continue;
        }
        let rounds = n / 2;
        // Per round, direction and forwarding rank: header and data bytes.
        let mut head = vec![0u64; rounds * 2 * p];
        let mut data = vec![0u64; rounds * 2 * p];
        let at = |k: usize, down: bool, r: usize| (k * 2 + usize::from(down)) * p + r;
        let mut pos = vec![0usize; dims.len()];
        for src in 0..p {
            for dst in 0..p {
                if src == dst {
                    continue;
                }
                let s = ring_steps(coords[src][d], coords[dst][d], n);
                if s == 0 {
                    continue;
                }
                let b = bytes(src, dst);
                // Along dimension d the packet sits at the destination's coordinates
                // below d and the source's from d on.
                pos[..d].copy_from_slice(&coords[dst][..d]);
                pos[d..].copy_from_slice(&coords[src][d..]);
                let down = s < 0;
                for k in 0..s.unsigned_abs() {
                    let r = coords_to_rank(dims, &pos);
                    head[at(k, down, r)] += HEADER_BYTES;
                    data[at(k, down, r)] += b;
                    pos[d] = if down {
                        (pos[d] + n - 1) % n
                    } else {
                        (pos[d] + 1) % n
                    };
                }
            }
        }
        for k in 0..rounds {
            for down in [false, true] {
                let link = 2 * d + usize::from(down);
                // Every rank shifts its header list, then its data, every round.
                for part in [&head, &data] {
                    let mut max = 0;
                    for r in 0..p {
                        let b = part[at(k, down, r)];
                        t.put(r, link, b);
                        max = max.max(b);
                    }
                    t.step(max);
                }
            }
        }
    }
    t
}

/// `torus_coll::all_gather_v` where rank `r` contributes `bytes(r)` bytes
/// (`elem`-byte elements: the `+` ring carries each block's first half, rounded down).
pub fn all_gather(dims: &[usize], elems: &dyn Fn(usize) -> u64, elem: u64) -> Traffic {
    let mut t = Traffic::new(dims);
    let p = t.size();
    let coords: Vec<Vec<usize>> = (0..p).map(|r| rank_to_coords(dims, r)).collect();
    for (d, &n) in dims.iter().enumerate() {
        for (up, first) in [(true, true), (false, false)] {
            let link = 2 * d + usize::from(!up);
            for s in 0..n.saturating_sub(1) {
                // At step s a rank forwards the blocks its ring neighbour at distance s
                // held before dimension d: those of ranks equal to it from d on.
                let mut head = vec![0u64; p];
                let mut data = vec![0u64; p];
                for (r, c) in coords.iter().enumerate() {
                    let mut from = c.clone();
                    from[d] = if up {
                        (c[d] + n - s) % n
                    } else {
                        (c[d] + s) % n
                    };
                    for (q, cq) in coords.iter().enumerate() {
                        if (d..dims.len()).all(|k| cq[k] == from[k]) {
                            let e = elems(q);
                            let h = if first { e / 2 } else { e - e / 2 };
                            head[r] += HEADER_BYTES;
                            data[r] += h * elem;
                        }
                    }
                }
                for part in [&head, &data] {
                    let mut max = 0;
                    for (r, &b) in part.iter().enumerate() {
                        t.put(r, link, b);
                        max = max.max(b);
                    }
                    t.step(max);
                }
            }
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_to_all_hops_take_the_short_way_with_headers() {
        // 1x4 ring... as dims [4]: 0 -> 2 is two hops +, 0 -> 3 one hop -.
        let t = all_to_all(&[4], &|s, d| if s == 0 && d == 2 { 100 } else { 0 });
        // Rank 0 forwards to +x: the headers of 0->1 and 0->2 and 0->2's 100 bytes
        // (round 0), then 3->1's header (round 1).
        assert_eq!(t.links[0][0].bytes, 3 * HEADER_BYTES + 100);
        // Rank 1 forwards 0->2 in round 1 (+ the headers of its own 1->2, 1->3).
        assert_eq!(t.links[1][0].bytes, 3 * HEADER_BYTES + 100);
        // Two rounds, two directions, a header and a data shift each.
        assert_eq!(t.links[2][1].messages, 4);
        assert_eq!(t.serial_messages, 8);
    }

    #[test]
    fn all_reduce_moves_two_n_minus_one_chunks_per_ring() {
        let t = all_reduce(&[4, 1], 800, 8);
        // Each half of 400 elements: 6 chunks of 100 elements on each ring.
        for r in 0..4 {
            assert_eq!(t.links[r][0].bytes, 6 * 100 * 8);
            assert_eq!(t.links[r][1].bytes, 6 * 100 * 8);
            assert_eq!(t.links[r][0].messages, 6);
        }
        assert_eq!(t.serial_messages, 12);
        assert_eq!(t.seconds(1.0, 1e9), 12.0 + 12.0 * 800.0 / 1e9);
    }
}
