//! The copying web-graph model: synthetic link graphs whose structure is fitted to
//! a real crawl (`generate webgraph --like G`, [`super::webgraph_fit`]).
//!
//! A crawl in URL order is a sequence of hosts, each a run of consecutive ids, and a
//! host's pages are built from a few templates, so neighbours in id order share most
//! of their links (Kumar et al.'s copying model; this is what lets BV compress a crawl
//! to 2-3 bits a link). The model, every part a function of `(seed, node id)` given
//! the seed-derived layout and degree arrays:
//!
//! * **Hosts** are runs of consecutive ids with log-normal sizes (mean `host_mean`,
//!   sigma `host_sigma`, at most `host_max` and at least 1 page). **Directories**
//!   are runs inside a host: a page other than the host's first starts a new
//!   directory with probability `1 / dir_mean`. A directory's **index** is its first
//!   page with links. A host's pages have a **popularity order**, a seeded bijection
//!   of its offsets: its popular pages (the template pages and the heads of the Zipf
//!   draws over the host below) lie anywhere in it, not at its start, so that its
//!   long links point backward and forward alike, as in a crawl in URL order (where
//!   in-link mass follows out-link mass along the ids, which keeps a row-block
//!   partition's traffic small).
//! * **Hidden pages**: each page is hidden with probability `hidden` (a seeded
//!   bitmap); the copy, local and global draws skip hidden pages, so a hidden page
//!   gets in-links only from its parent, template and mutual links (and the last
//!   fallback): most of a crawl's pages have in-degree 1 while the other links
//!   concentrate on the visible pages. A draw that lands on a hidden page moves to
//!   the nearest visible page (forward; local draws away from `u`) within 64 pages,
//!   else is dropped.
//! * **Clones**: a page with links other than its directory's first is, with
//!   probability `clone`, a clone of the previous page with links of its directory
//!   that is not a clone (its source): it takes the source's degree and parent and
//!   fills its row as the source does (the source's generator and children, its
//!   own length, itself replaced by the source). Runs of clones
//!   are the runs of identical link lists of a crawl (pages of one template).
//! * **Out-degrees**: a fraction `zero_out` of the pages has no links (the first
//!   pages of a seeded order that puts first the hidden pages (each with
//!   probability `zero_hidden`) and the template pages last, so the count is exact
//!   and the pages without links are, as in a crawl, mostly barely linked ones
//!   (`zero_hidden` sets how barely: the share of arcs into them): documents and pages not fetched, never a host's
//!   home page or navigation; so `--min-links 1` removes pages of about one in-link
//!   and few arcs, as on the real crawl); the others take a survival
//!   level, with probability `degree_corr` the one of their directory (pages of
//!   one template have one degree), else their own. The levels are replaced by
//!   their ranks (the `i`-th largest of `m` becomes `s = 1 - (i + 1/2) / m`), so the
//!   degrees follow the law exactly however they are correlated, and a page's degree
//!   is `round(f x mean x q(s))` in `1..=out_cap x mean`, where `mean` is the mean
//!   positive degree and `q` the quantile function of `out_knots` (pairs of a
//!   survival and a degree over the mean): constant between two knots of the same
//!   degree (the law's atoms stay atoms), log-linear between knots that differ, a
//!   Pareto tail of exponent `out_tail` past the last knot. A clone takes its
//!   source's. The factor `f` (near 1) is found by bisection so that the sum comes
//!   closest to the arcs asked for; the remainder is spread one link at a time over
//!   pages in a seeded order, so the graph has exactly the arcs asked for. No degree
//!   is changed after that.
//! * **Discovery**, first in a row: a directory's index lists its directory's pages
//!   in order, as many as its degree allows. Every other page (but a host's first)
//!   has a **parent**, the page that found it: a clone's is its source's; else a
//!   page with links of its host, not a clone, with room left for a child, at a gap
//!   `1 + Zipf(parent_zipf)` after the page (probability `parent_back`) or before
//!   it, moved to the nearest such page (towards the page, then away; the pages of a
//!   host are assigned in id order, so the room is known). A page links to its
//!   children first (nearest first), then, with probability `up_link`, back to its
//!   parent (or, without one, to its index). Every page but a few then has an
//!   in-link, as in a crawl, and parents and children link both ways.
//! * **The other links** of page `u` (`r` slots left) are, by stochastic rounding of
//!   the shares, in this order:
//!   - `template x r` **template links** to the host's most popular pages in order
//!     (its home page and navigation, `ceil(template_pages x mean)` of them): a
//!     prefix shared by every page of the host;
//!   - `copy x r` **copied links**: the first distinct entries of its directory's
//!     link list, a sequence drawn from the directory's own generator (each entry a
//!     sibling in the directory, Zipf over its offsets with exponent `host_zipf`,
//!     with probability `copy_sibling`, else a page of the host past the template
//!     pages, Zipf over its popularity order). Two pages of a directory share the shorter
//!     of their prefixes, the copying model's "copy the prototype's list";
//!   - `mutual x r` **mutual links**: the pair `{v, v + g}` of pages with links is
//!     a neighbour pair with probability `exp(-(g - 1) / local_gap)` (a hash of the
//!     pair, so both rows agree: these links are reciprocated wherever both rows
//!     have room), nearest first, up to a gap of 256;
//!   - **global links** out of the host by preferential attachment, on the outward
//!     pages only (each page is one with probability `global_pages`, a hash of its
//!     id: a crawl's long links come from a few hub pages, which is what keeps the
//!     rows a row-block partition fetches few): `G x r` of them, `G` the global
//!     share `1 - template - copy - mutual - local` over `global_pages` (at most 1;
//!     the other shares of the page scale by `(1 - G)` over their sum, and a page
//!     that is not outward has `G = 0`): a host drawn from a Zipf law (exponent
//!     `global_zipf`) over hosts in a seeded pseudo-random order, then a page of it,
//!     Zipf over its popularity order (never more: what the parts above could not
//!     place is not made global);
//!   - the rest (the local share, the rounding and whatever the parts above could
//!     not place: repeats in small hosts or directories) **local links** at a gap of
//!     `1 + Geometric(mean local_gap)` either way; what is still missing goes to the
//!     nearest visible pages not linked yet, then to the nearest pages of any kind
//!     (a bounded scan, so small hosts and directories fall back gracefully).
//!
//!   A row has no duplicates and no self-loop (a draw that repeats is redrawn within
//!   a budget of about 1.5 draws a link); rows are sorted. Counts scale with the mean
//!   degree (`template_pages`, the degrees), so one parameter set serves any size.
//!
//! The host and directory layout, the hidden pages, the degrees and the parents
//! depend on `seed` only (every rank computes them whole: about 17 bytes a node);
//! row `u` on `SplitMix64::for_id(seed, COPY_NODE, u)` (its source's, for a clone),
//! its directory's list generator and those arrays, so any split of the node range
//! and any thread count give the same graph.
//!
//! Parameter files of an earlier version (2: before parents, clones, popularity
//! orders and `host_max`; 3: before `global_pages`, when every page placed global
//! links) are refused: refit with `--like`.

use super::webgraph_gen::{gcd, row_chunks, IdSet, Zipf};
use crate::rng::{hash3, stream, SplitMix64};
use rayon::prelude::*;

mod params;
pub use params::{cnr2000_params, CopyingParams, PARAMS_VERSION};

/// How far a draw that lands on a hidden page walks to a visible one.
const VISIBLE_WALK: usize = 64;
/// The largest gap of a mutual link.
const MUTUAL_REACH: u64 = 256;
/// Marks a directory without a page with links.
const NO_INDEX: u64 = u64::MAX;
/// How many pages the search for a parent looks at.
const PARENT_WALK: usize = 4096;

/// A graph of the copying model: parameters, sizes, seed and everything derived from
/// them alone (the host and directory starts, each directory's index and every
/// node's out-degree).
#[derive(Debug, Clone)]
pub struct CopyModel {
    pub params: CopyingParams,
    pub nodes: u64,
    pub arcs: u64,
    pub seed: u64,
    /// `starts[i]..starts[i + 1]` is host `i`.
    starts: Vec<u64>,
    /// `dirs[j]..dirs[j + 1]` is directory `j` (every host start is a directory start;
    /// the last entry is `nodes`).
    dirs: Vec<u64>,
    /// The first page with links of each directory, or [`NO_INDEX`].
    index: Vec<u64>,
    degrees: Vec<u32>,
    template_pages: u64,
    host_perm: (u64, u64),
    /// Per host, the bijection from a page's popularity rank to its offset (a
    /// host's popular pages lie anywhere in it, not at its start).
    host_bij: Vec<(u64, u64)>,
    global: Zipf,
    /// Bit `v % 64` of word `v / 64` is set when page `v` is hidden.
    hidden_bits: Vec<u64>,
    /// `children[child_off[u]..child_off[u + 1]]` are the pages whose parent is `u`,
    /// nearest first.
    child_off: Vec<u32>,
    children: Vec<u32>,
    /// Each page's parent, or `u32::MAX`.
    parents: Vec<u32>,
}

/// Stochastic rounding of `x >= 0` with a uniform draw.
#[inline]
fn sround(x: f64, rng: &mut SplitMix64) -> u64 {
    let f = x.floor();
    f as u64 + u64::from(rng.next_f64() < x - f)
}

/// Degree in units of the mean positive degree at survival `s` in (0, 1]: the knots'
/// value where two neighbouring knots agree (an atom of the law), log-linear between
/// knots that differ, a Pareto tail of exponent `out_tail` past the last knot.
fn quantile(p: &CopyingParams, s: f64) -> f64 {
    let k = &p.out_knots;
    if s >= k[0][0] {
        return k[0][1];
    }
    for w in k.windows(2) {
        let ([s0, d0], [s1, d1]) = (w[0], w[1]);
        if s >= s1 {
            if d1 <= d0 {
                return d0;
            }
            let t = (s.ln() - s0.ln()) / (s1.ln() - s0.ln());
            return (d0.ln() + t * (d1.ln() - d0.ln())).exp();
        }
    }
    let [sl, dl] = k[k.len() - 1];
    dl * (s / sl).powf(-1.0 / p.out_tail)
}

fn host_starts(p: &CopyingParams, nodes: u64, seed: u64) -> Vec<u64> {
    let sigma = p.host_sigma;
    let mu = p.host_mean.ln() - 0.5 * sigma * sigma;
    let mut rng = SplitMix64::for_id(seed, stream::COPY_HOSTS, 0);
    let mut starts = vec![0u64];
    let mut pos = 0u64;
    while pos < nodes {
        let size = ((mu + sigma * rng.next_normal())
            .exp()
            .min(p.host_max)
            .round() as u64)
            .max(1);
        pos = (pos + size).min(nodes);
        starts.push(pos);
    }
    starts
}

/// Survival level of a zero page and of a clone in [`raw_degrees`].
const ZERO_LEVEL: f32 = -1.0;
const CLONE_LEVEL: f32 = -2.0;

/// Every page's degree in units of the mean (0 for the pages without links). The
/// zero pages are the first `nodes - positive` of [`zero_pages`]' order, so the
/// count is exact. A page takes a survival level, with probability `degree_corr` its
/// directory's (pages of one template have one degree), else its own; the levels
/// are then replaced by their ranks (the `i`-th largest of `m` becomes
/// `1 - (i + 1/2) / m`), so the degrees follow the quantile function exactly
/// however the levels are correlated. A clone takes its source's degree.
/// Whether bit `v` of bitmap `bits` is set (an empty bitmap has none).
#[inline]
fn bit(bits: &[u64], v: u64) -> bool {
    bits.get((v / 64) as usize)
        .is_some_and(|w| w >> (v % 64) & 1 == 1)
}

/// The pages without links: the first `nodes - positive` of a seeded order that
/// puts first the hidden pages drawn (probability `zero_hidden`, a hash of the id)
/// and the template pages last, as a bitmap. In a crawl
/// the pages without links are mostly the ones barely linked (documents, pages not
/// fetched), never a host's home page or navigation: so the variant filter
/// (`--min-links`) removes pages with about one in-link, as it does on the real crawl.
fn zero_pages(
    (nodes, positive): (u64, u64),
    seed: u64,
    zero_hidden: f64,
    hidden: &[u64],
    template: &[u64],
) -> Vec<u64> {
    let zb = bijection(nodes, seed, 10);
    let below = (zero_hidden * 2f64.powi(64)).min(u64::MAX as f64) as u64;
    let key = |u: u64| -> u64 {
        let tier = if bit(template, u) {
            2
        } else if bit(hidden, u) && hash3(seed, stream::COPY_DIRS, u ^ (1 << 58)) < below {
            0
        } else {
            1
        };
        tier * nodes + apply(zb, u, nodes)
    };
    let zeros = (nodes - positive) as usize;
    let mut bits = vec![0u64; nodes.div_ceil(64) as usize];
    if zeros == 0 {
        return bits;
    }
    let mut keys: Vec<u64> = (0..nodes).into_par_iter().map(key).collect();
    let (_, &mut cut, _) = keys.select_nth_unstable(zeros - 1);
    drop(keys);
    bits.par_iter_mut().enumerate().for_each(|(i, w)| {
        for b in 0..64u64 {
            let u = i as u64 * 64 + b;
            if u < nodes && key(u) <= cut {
                *w |= 1 << b;
            }
        }
    });
    bits
}

fn raw_degrees(
    p: &CopyingParams,
    dirs: &[u64],
    nodes: u64,
    positive: u64,
    seed: u64,
    hidden: &[u64],
    template: &[u64],
) -> Vec<f32> {
    let zero = &zero_pages((nodes, positive), seed, p.zero_hidden, hidden, template);
    let levels: Vec<f32> = (0..dirs.len() - 1)
        .into_par_iter()
        .with_min_len(256)
        .flat_map_iter(|j| {
            let (ds, de) = (dirs[j], dirs[j + 1]);
            let shared = 1.0 - SplitMix64::for_id(seed, stream::COPY_DIRS, ds).next_f64();
            let mut first = true;
            (ds..de).map(move |u| {
                if bit(zero, u) {
                    return ZERO_LEVEL;
                }
                if !first && clone_flag(seed, p.clone, u) {
                    return CLONE_LEVEL;
                }
                first = false;
                let mut rng = SplitMix64::for_id(seed, stream::COPY_NODE, u);
                let own = 1.0 - rng.next_f64();
                (if rng.next_f64() < p.degree_corr {
                    shared
                } else {
                    own
                }) as f32
            })
        })
        .collect();
    let mut order: Vec<(f32, u32)> = levels
        .par_iter()
        .enumerate()
        .filter(|(_, &s)| s >= 0.0)
        .map(|(u, &s)| (s, u as u32))
        .collect();
    order.par_sort_unstable_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    let m = order.len() as f64;
    let mut own = vec![0f32; nodes as usize];
    for (i, &(_, u)) in order.iter().enumerate() {
        own[u as usize] = quantile(p, 1.0 - (i as f64 + 0.5) / m) as f32;
    }
    drop(order);
    (0..dirs.len() - 1)
        .into_par_iter()
        .with_min_len(256)
        .flat_map_iter(|j| {
            let (levels, own) = (&levels, &own);
            let mut source = 0f32;
            (dirs[j]..dirs[j + 1]).map(move |u| {
                let u = u as usize;
                if levels[u] == CLONE_LEVEL {
                    source
                } else {
                    if levels[u] != ZERO_LEVEL {
                        source = own[u];
                    }
                    own[u]
                }
            })
        })
        .collect()
}

/// Whether page `u` (not its host's first) starts a directory.
fn is_dir_start(seed: u64, dir_mean: f64, u: u64) -> bool {
    let x = hash3(seed, stream::COPY_DIRS, u);
    (x >> 11) as f64 * (1.0 / (1u64 << 53) as f64) < 1.0 / dir_mean
}

/// Whether page `u` is drawn to be a clone (it is one if it has links and a page
/// with links before it in its directory).
#[inline]
fn clone_flag(seed: u64, clone: f64, u: u64) -> bool {
    let x = hash3(seed, stream::COPY_DIRS, u ^ (1 << 60));
    (x >> 11) as f64 * (1.0 / (1u64 << 53) as f64) < clone
}

/// The directory starts of every host, then `nodes`.
fn dir_starts(p: &CopyingParams, starts: &[u64], seed: u64) -> Vec<u64> {
    let mut dirs: Vec<u64> = starts
        .par_windows(2)
        .with_min_len(64)
        .flat_map_iter(|h| {
            std::iter::once(h[0])
                .chain((h[0] + 1..h[1]).filter(move |&u| is_dir_start(seed, p.dir_mean, u)))
        })
        .collect();
    dirs.push(*starts.last().expect("at least one start"));
    dirs
}

/// Each page is hidden with probability `hidden` (a hash of its id), as a bitmap.
fn hidden_bits(seed: u64, hidden: f64, nodes: u64) -> Vec<u64> {
    let below = (hidden * 2f64.powi(64)).min(u64::MAX as f64) as u64;
    (0..nodes.div_ceil(64) as usize)
        .into_par_iter()
        .with_min_len(1024)
        .map(|i| {
            let i = i as u64;
            let mut x = 0u64;
            for b in 0..64 {
                let v = i * 64 + b;
                if v < nodes && hash3(seed, stream::COPY_DIRS, v ^ (1 << 62)) < below {
                    x |= 1 << b;
                }
            }
            x
        })
        .collect()
}

/// The template pages (each host's `template_pages` most popular) as a bitmap.
fn template_bits(
    starts: &[u64],
    host_bij: &[(u64, u64)],
    template_pages: u64,
    nodes: u64,
) -> Vec<u64> {
    let mut bits = vec![0u64; nodes.div_ceil(64) as usize];
    for (hi, h) in starts.windows(2).enumerate() {
        let size = h[1] - h[0];
        for r in 0..template_pages.min(size) {
            let v = h[0] + apply(host_bij[hi], r, size);
            bits[(v / 64) as usize] |= 1 << (v % 64);
        }
    }
    bits
}

/// A bijection `r -> (r a + c) mod n` of `0..n` from `(seed, salt)`.
fn bijection(n: u64, seed: u64, salt: u64) -> (u64, u64) {
    if n <= 1 {
        return (1, 0);
    }
    let mut a = ((n as f64 * 0.618_033_988_749_894_9) as u64
        + hash3(seed, stream::COPY_ADJUST, salt) % (n / 64 + 1))
        % n;
    a = a.max(1);
    while gcd(a, n) != 1 {
        a = if a + 1 >= n { 1 } else { a + 1 };
    }
    (a, hash3(seed, stream::COPY_ADJUST, salt + 1) % n)
}

#[inline]
fn apply(b: (u64, u64), r: u64, n: u64) -> u64 {
    ((r as u128 * b.0 as u128 + b.1 as u128) % n as u128) as u64
}

/// A row being filled by [`CopyModel::fill_row`]: its `k` slots, the first `w` taken,
/// and the ids already in it.
struct RowFill<'a> {
    out: &'a mut [u32],
    set: &'a mut IdSet,
    w: usize,
    k: usize,
    /// The row's own node (never linked).
    me: u32,
}

impl RowFill<'_> {
    /// Append `v` unless it is the row's node, already in the row, or the row is
    /// full.
    fn push(&mut self, v: u64) {
        let v = v as u32;
        if v != self.me && self.w < self.k && self.set.insert(v) {
            self.out[self.w] = v;
            self.w += 1;
        }
    }
}

impl CopyModel {
    /// The model of `nodes` nodes and exactly `arcs` arcs. O(nodes) time (parallel)
    /// and about 4 bytes a node.
    pub fn new(params: &CopyingParams, nodes: u64, arcs: u64, seed: u64) -> Result<Self, String> {
        params.validate()?;
        if nodes < 2 || nodes > u32::MAX as u64 {
            return Err(format!("nodes must be in 2..={} (got {nodes})", u32::MAX));
        }
        let positive = ((1.0 - params.zero_out) * nodes as f64).round().max(1.0) as u64;
        let max_deg = nodes - 1;
        if arcs > positive.saturating_mul(max_deg) {
            return Err(format!(
                "{arcs} arcs do not fit on {nodes} nodes ({positive} with links, at most {max_deg} each)"
            ));
        }
        if arcs < positive {
            return Err(format!(
                "{arcs} arcs are fewer than the {positive} pages that have links (zero_out {})",
                params.zero_out
            ));
        }
        let mean = arcs as f64 / positive as f64;
        let cap = ((params.out_cap * mean).ceil() as u64).clamp(1, max_deg);
        let starts = host_starts(params, nodes, seed);
        let dirs = dir_starts(params, &starts, seed);
        let host_bij: Vec<(u64, u64)> = starts
            .par_windows(2)
            .enumerate()
            .map(|(i, h)| bijection(h[1] - h[0], seed, (1 << 40) + 2 * i as u64))
            .collect();
        let template_pages = (params.template_pages * mean).ceil().max(1.0) as u64;
        let hidden = hidden_bits(seed, params.hidden, nodes);
        let template = template_bits(&starts, &host_bij, template_pages, nodes);
        let raw = raw_degrees(params, &dirs, nodes, positive, seed, &hidden, &template);
        drop(template);
        let degrees = scaled_degrees(&raw, mean, cap, arcs);
        drop(raw);
        let index: Vec<u64> = dirs
            .par_windows(2)
            .map(|d| {
                (d[0]..d[1])
                    .find(|&v| degrees[v as usize] > 0)
                    .unwrap_or(NO_INDEX)
            })
            .collect();
        let hosts = starts.len() as u64 - 1;
        let mut model = Self {
            params: params.clone(),
            nodes,
            arcs,
            seed,
            starts,
            dirs,
            index,
            degrees,
            template_pages,
            host_perm: bijection(hosts, seed, 20),
            host_bij,
            global: Zipf::new(hosts, params.global_zipf),
            hidden_bits: hidden,
            child_off: Vec::new(),
            children: Vec::new(),
            parents: Vec::new(),
        };
        model.adjust_degrees(cap)?;
        model.assign_parents();
        Ok(model)
    }

    /// Spreads the difference between the degrees' sum and `arcs` one link at a time
    /// over positive pages in a seeded order.
    fn adjust_degrees(&mut self, cap: u64) -> Result<(), String> {
        let mut sum: u64 = self.degrees.par_iter().map(|&d| d as u64).sum();
        let n = self.nodes;
        let b = bijection(n, self.seed, 30);
        let mut r = 0u64;
        let mut idle = 0u64;
        while sum != self.arcs {
            let u = apply(b, r % n, n) as usize;
            r += 1;
            let d = self.degrees[u] as u64;
            let moved = if sum < self.arcs && d > 0 && d < cap {
                self.degrees[u] += 1;
                sum += 1;
                true
            } else if sum > self.arcs && d > 1 {
                self.degrees[u] -= 1;
                sum -= 1;
                true
            } else {
                false
            };
            idle = if moved { 0 } else { idle + 1 };
            if idle > n {
                return Err(format!(
                    "cannot place {} arcs on {n} nodes within the degree cap {cap}",
                    self.arcs
                ));
            }
        }
        Ok(())
    }

    /// The page whose list clone `u` takes (`None` when `u` is not a clone): the
    /// previous page with links of its directory that is not a clone.
    fn clone_source(&self, u: u64) -> Option<u64> {
        if self.params.clone == 0.0
            || self.degrees[u as usize] == 0
            || !clone_flag(self.seed, self.params.clone, u)
        {
            return None;
        }
        let ds = self.dirs[self.dir_index(u)];
        let mut v = u;
        while v > ds {
            v -= 1;
            if self.degrees[v as usize] > 0 && !clone_flag(self.seed, self.params.clone, v) {
                return Some(v);
            }
        }
        // The first page with links of a directory is never a clone; a flagged one
        // is the source of the clones after it.
        (ds..u).find(|&x| self.degrees[x as usize] > 0)
    }

    /// The parent of page `v` of host `(hs, he)`, given the parents of the host's
    /// pages before `v` and the children counts so far (both indexed from `hs`): a
    /// clone's is its source's; else a page with links, not a clone and with room
    /// for another child, at a gap `1 + Zipf(parent_zipf)` after `v` (probability
    /// `parent_back`) or before it, moved to the nearest such page (towards `v`,
    /// then away from it, [`PARENT_WALK`] pages at most). None for a host's first
    /// page, a page its index lists, or when no page qualifies.
    fn parent(&self, v: u64, (hs, he): (u64, u64), parents: &[u32], count: &[u32]) -> Option<u64> {
        if v == hs || self.listed(v) {
            return None;
        }
        let room = |y: u64| count[(y - hs) as usize] < self.degrees[y as usize];
        if let Some(c) = self.clone_source(v) {
            let x = parents[(c - hs) as usize];
            if x != u32::MAX && room(x as u64) {
                return Some(x as u64);
            }
        }
        let p = &self.params;
        let mut rng = SplitMix64::for_id(self.seed, stream::COPY_NODE, v ^ (1 << 61));
        let mut back = rng.next_f64() < p.parent_back;
        let u = rng.next_f64();
        if (back && v + 1 >= he) || (!back && v == hs) {
            back = !back;
        }
        let span = if back { he - 1 - v } else { v - hs };
        if span == 0 {
            return None;
        }
        let g = 1 + Zipf::new(span, p.parent_zipf).sample(u);
        let x = if back { v + g } else { v - g };
        let fits = |y: u64| {
            y != v && self.degrees[y as usize] > 0 && room(y) && self.clone_source(y).is_none()
        };
        // Towards v, then away from it, within the host.
        let toward = (1..=g).map(|t| if back { x - t + 1 } else { x + t - 1 });
        let away = (1..).map_while(|t| {
            if back {
                Some(x + t).filter(|&y| y < he)
            } else {
                x.checked_sub(t).filter(|&y| y >= hs)
            }
        });
        toward.chain(away).take(PARENT_WALK).find(|&y| fits(y))
    }

    /// Every page's parent (host by host in parallel, each host's pages in order),
    /// then the children lists (nearest first).
    fn assign_parents(&mut self) {
        let n = self.nodes as usize;
        let me = &*self;
        let parents: Vec<u32> = me
            .starts
            .par_windows(2)
            .with_min_len(16)
            .flat_map_iter(|h| {
                let (hs, he) = (h[0], h[1]);
                let size = (he - hs) as usize;
                let mut parents = vec![u32::MAX; size];
                let mut count = vec![0u32; size];
                for v in hs..he {
                    if let Some(x) = me.parent(v, (hs, he), &parents, &count) {
                        parents[(v - hs) as usize] = x as u32;
                        count[(x - hs) as usize] += 1;
                    }
                }
                parents
            })
            .collect();
        let mut off = vec![0u32; n + 1];
        for &x in &parents {
            if x != u32::MAX {
                off[x as usize + 1] += 1;
            }
        }
        for i in 0..n {
            off[i + 1] += off[i];
        }
        let mut fill = off.clone();
        let mut children = vec![0u32; off[n] as usize];
        for (v, &x) in parents.iter().enumerate() {
            if x != u32::MAX {
                children[fill[x as usize] as usize] = v as u32;
                fill[x as usize] += 1;
            }
        }
        self.parents = parents;
        for u in 0..n {
            let (a, b) = (off[u] as usize, off[u + 1] as usize);
            if b - a > 1 {
                children[a..b].sort_unstable_by_key(|&c| ((c as u64).abs_diff(u as u64), c));
            }
        }
        self.child_off = off;
        self.children = children;
    }

    /// Out-degree of node `u`.
    pub fn degree(&self, u: u64) -> u32 {
        self.degrees[u as usize]
    }

    /// Out-degrees of rows `lo..hi`.
    pub fn degrees(&self, lo: u64, hi: u64) -> Vec<u32> {
        self.degrees[lo as usize..hi as usize].to_vec()
    }

    /// Number of hosts.
    pub fn num_hosts(&self) -> usize {
        self.starts.len() - 1
    }

    fn host_index(&self, u: u64) -> usize {
        self.starts.partition_point(|&s| s <= u) - 1
    }

    fn dir_index(&self, u: u64) -> usize {
        self.dirs.partition_point(|&s| s <= u) - 1
    }

    /// Whether page `v` takes only discovery links (its index's listing, the chain,
    /// up-links, prev links) and template links.
    #[inline]
    fn hidden(&self, v: u64) -> bool {
        self.hidden_bits[(v / 64) as usize] >> (v % 64) & 1 == 1
    }

    /// The first page at or after `v` (`back`: at or before) in `lo..hi` that is not
    /// hidden, looking at most [`VISIBLE_WALK`] pages.
    #[inline]
    fn visible(&self, v: u64, back: bool, lo: u64, hi: u64) -> Option<u64> {
        // Word by word: the nearest clear bit of the hidden bitmap.
        let bits = &self.hidden_bits;
        let mut i = (v / 64) as usize;
        let b = (v % 64) as u32;
        let found = if back {
            let mut word = !bits[i] << (63 - b);
            let mut top = v;
            let mut steps = 0;
            loop {
                if word != 0 {
                    break top.checked_sub(word.leading_zeros() as u64);
                }
                steps += 1;
                if i == 0 || steps > VISIBLE_WALK / 64 {
                    break None;
                }
                top = (i as u64) * 64 - 1;
                i -= 1;
                word = !bits[i];
            }
        } else {
            let mut word = !bits[i] >> b;
            let mut base = v;
            let mut steps = 0;
            loop {
                if word != 0 {
                    break Some(base + word.trailing_zeros() as u64);
                }
                steps += 1;
                i += 1;
                if i >= bits.len() || steps > VISIBLE_WALK / 64 {
                    break None;
                }
                base = (i as u64) * 64;
                word = !bits[i];
            }
        };
        found.filter(|&x| x >= lo && x < hi && x.abs_diff(v) < VISIBLE_WALK as u64)
    }

    /// Whether page `v` is on its directory index's listing.
    fn listed(&self, v: u64) -> bool {
        let j = self.dir_index(v);
        let x = self.index[j];
        if x == NO_INDEX || v == x {
            return false;
        }
        let rank = v - self.dirs[j] - u64::from(v > x);
        rank < self.degrees[x as usize] as u64
    }

    /// Fills node `u`'s row (of its degree) in host `h = (hs, he)`, sorted. The parts
    /// in order, each drawing from `u`'s generator (or, the copied links, from the
    /// directory's) as it always has: the directory's index or the up-link
    /// ([`Self::fill_directory`]), discovery ([`Self::fill_discovery`]), the split of
    /// what is left into template, copied, mutual, local and global links, then
    /// [`Self::fill_template`], [`Self::fill_copied`], [`Self::fill_mutual`],
    /// [`Self::fill_global`], [`Self::fill_local`] and [`Self::fill_nearest`].
    fn fill_row(&self, me: u64, hi: usize, out: &mut [u32], set: &mut IdSet) {
        let h = (self.starts[hi], self.starts[hi + 1]);
        let p = &self.params;
        let k = out.len();
        if k == 0 {
            return;
        }
        // A clone fills its source's list (its own length) with itself replaced by
        // the source.
        let u = self.clone_source(me).unwrap_or(me);
        let mut rng = SplitMix64::for_id(self.seed, stream::COPY_NODE, u ^ (1 << 63));
        set.reset(k);
        let mut row = RowFill {
            out,
            set,
            w: 0,
            k,
            me: u as u32,
        };
        let j = self.dir_index(u);
        let dir = (self.dirs[j], self.dirs[j + 1]);
        // The index lists its directory first; then a page's children (a clone's
        // are its source's: a clone of the source's degree has the source's row).
        let is_index = self.index[j] == u;
        if is_index {
            self.fill_directory(u, j, &mut row, &mut rng);
        }
        self.fill_children(u, &mut row);
        if !is_index {
            self.fill_directory(u, j, &mut row, &mut rng);
        }
        let w = row.w;
        let r = (k - w) as f64;
        let (g, scale) = self.global_share(u);
        let k_t = (sround(p.template * scale * r, &mut rng) as usize).min(k - w);
        let k_c = (sround(p.copy * scale * r, &mut rng) as usize).min(k - w - k_t);
        let k_m = (sround(p.mutual * scale * r, &mut rng) as usize).min(k - w - k_t - k_c);
        let k_g = (sround(g * r, &mut rng) as usize).min(k - w - k_t - k_c - k_m);
        self.fill_template(hi, k_t, &mut row);
        self.fill_copied(dir, hi, k_c, &mut row);
        self.fill_mutual(u, k_m, &mut row);
        self.fill_global(h.0, row.w + k_g, k_g, &mut row, &mut rng);
        self.fill_local(u, &mut row, &mut rng);
        self.fill_nearest(u, &mut row);
        if u != me {
            if let Some(x) = row.out.iter_mut().find(|x| **x as u64 == me) {
                *x = u as u32;
            }
        }
        row.out.sort_unstable();
    }

    /// Page `u`'s global share and the factor of its template, copy, mutual and local
    /// shares: an outward page (probability `global_pages`, a hash of its id) has
    /// the global share over `global_pages` (at most 1), any other none; the other
    /// shares scale so that the five still sum to 1.
    fn global_share(&self, u: u64) -> (f64, f64) {
        let p = &self.params;
        let all = (1.0 - p.template - p.copy - p.mutual - p.local).max(0.0);
        if all <= 0.0 {
            return (0.0, 1.0);
        }
        let x = hash3(self.seed, stream::COPY_DIRS, u ^ (1 << 59));
        let outward = (x >> 11) as f64 * (1.0 / (1u64 << 53) as f64) < p.global_pages;
        let g = if outward {
            (all / p.global_pages).min(1.0)
        } else {
            0.0
        };
        (g, (1.0 - g) / (1.0 - all).max(1e-12))
    }

    /// The directory's index lists its pages (as many as its degree allows); every
    /// other page links up to the index with probability `up_link` (one draw).
    fn fill_directory(&self, u: u64, j: usize, row: &mut RowFill, rng: &mut SplitMix64) {
        let (ds, de) = (self.dirs[j], self.dirs[j + 1]);
        let index = self.index[j];
        if index == u {
            for v in ds..de {
                if row.w >= row.k {
                    break;
                }
                row.push(v);
            }
        } else if rng.next_f64() < self.params.up_link {
            // Back to the page that links to it first: its parent, else its index.
            let x = self.parents[u as usize];
            row.push(if x == u32::MAX { index } else { x as u64 });
        }
    }

    /// Discovery: the pages whose parent is `u`, nearest first, as many as its
    /// degree allows.
    fn fill_children(&self, u: u64, row: &mut RowFill) {
        let (a, b) = (
            self.child_off[u as usize] as usize,
            self.child_off[u as usize + 1] as usize,
        );
        for &v in &self.children[a..b] {
            if row.w >= row.k {
                break;
            }
            row.push(v as u64);
        }
    }

    /// Page of popularity rank `r` of host `hi`.
    #[inline]
    fn host_page(&self, hi: usize, r: u64) -> u64 {
        let s = self.starts[hi];
        s + apply(self.host_bij[hi], r, self.starts[hi + 1] - s)
    }

    /// Template links: the most popular pages of host `hi` in order, `k_t` of them.
    fn fill_template(&self, hi: usize, k_t: usize, row: &mut RowFill) {
        if k_t > 0 {
            let goal = row.w + k_t;
            let hsize = self.starts[hi + 1] - self.starts[hi];
            for r in 0..self.template_pages.min(hsize) {
                if row.w >= goal {
                    break;
                }
                row.push(self.host_page(hi, r));
            }
        }
    }

    /// Copied links: a prefix of directory `(ds, de)`'s list (its own generator), each
    /// entry a sibling (Zipf over the directory's offsets) or a page of the host (Zipf
    /// over its offsets), hidden pages skipped.
    fn fill_copied(&self, (ds, de): (u64, u64), hi: usize, k_c: usize, row: &mut RowFill) {
        let p = &self.params;
        let (hs, he) = (self.starts[hi], self.starts[hi + 1]);
        let hsize = he - hs;
        if k_c > 0 {
            let mut list = SplitMix64::for_id(self.seed, stream::COPY_LIST, ds);
            let zd = Zipf::new(de - ds, p.host_zipf);
            let tp = self.template_pages.min(hsize - 1);
            let zh = Zipf::new(hsize - tp, p.host_zipf);
            let goal = row.w + k_c;
            for _ in 0..k_c + k_c / 2 + 8 {
                if row.w >= goal {
                    break;
                }
                let v = if list.next_f64() < p.copy_sibling {
                    ds + zd.sample(list.next_f64())
                } else {
                    self.host_page(hi, tp + zh.sample(list.next_f64()))
                };
                if let Some(v) = self.visible(v, false, hs, he) {
                    row.push(v);
                }
            }
        }
    }

    /// Mutual links: the pairs {v, v + g} with links at both ends are neighbours
    /// with probability exp(-(g - 1) / local_gap) (a hash of the pair, so both
    /// ends agree), nearest first; `k_m` of them at most.
    fn fill_mutual(&self, u: u64, k_m: usize, row: &mut RowFill) {
        if k_m > 0 {
            let goal = row.w + k_m;
            let decay = (-1.0 / self.params.local_gap.max(1e-3)).exp();
            let mut prob = 1.0f64;
            for g in 1..=MUTUAL_REACH {
                if row.w >= goal || prob < 1e-3 {
                    break;
                }
                let thr = (prob * 2f64.powi(64)).min(u64::MAX as f64) as u64;
                for v in [u.checked_sub(g), Some(u + g).filter(|&v| v < self.nodes)]
                    .into_iter()
                    .flatten()
                {
                    if row.w < goal
                        && self.degrees[v as usize] > 0
                        && hash3(self.seed ^ g, stream::COPY_LIST, u.min(v) | 1 << 62) < thr
                    {
                        row.push(v);
                    }
                }
                prob *= decay;
            }
        }
    }

    /// Out of the host (starting at `hs`) by preferential attachment, until the row
    /// holds `goal` links or `2 k_g + 8` tries are spent.
    fn fill_global(
        &self,
        hs: u64,
        goal: usize,
        k_g: usize,
        row: &mut RowFill,
        rng: &mut SplitMix64,
    ) {
        let hosts = self.num_hosts() as u64;
        let mut tries = 0usize;
        let budget = 2 * k_g + 8;
        while row.w < goal && tries < budget {
            tries += 1;
            let r = self.global.sample(rng.next_f64());
            let hi = apply(self.host_perm, r, hosts) as usize;
            let (s, e) = (self.starts[hi], self.starts[hi + 1]);
            if s == hs {
                continue;
            }
            let v = self.host_page(
                hi,
                Zipf::new(e - s, self.params.host_zipf).sample(rng.next_f64()),
            );
            if let Some(v) = self.visible(v, false, s, e) {
                row.push(v);
            }
        }
    }

    /// Fresh local links, and what the other parts could not place (repeats in
    /// small hosts or directories).
    fn fill_local(&self, u: u64, row: &mut RowFill, rng: &mut SplitMix64) {
        if row.w < row.k {
            let k_l = row.k - row.w;
            let goal = row.k;
            let q = 1.0 / (1.0 + self.params.local_gap.max(1e-9));
            let lq = (1.0 - q).ln();
            for _ in 0..k_l + k_l / 2 + 8 {
                if row.w >= goal {
                    break;
                }
                let g = 1 + ((1.0 - rng.next_f64()).ln() / lq) as u64;
                let back = rng.next_u64() & 1 == 0;
                let v = if back {
                    u.checked_sub(g)
                } else {
                    Some(u + g).filter(|&v| v < self.nodes)
                };
                if let Some(v) = v.and_then(|v| self.visible(v, back, 0, self.nodes)) {
                    row.push(v);
                }
            }
        }
    }

    /// What is still missing: the nearest visible pages not linked yet, both ways
    /// (a scan of the bitmap), then the nearest pages of any kind.
    fn fill_nearest(&self, u: u64, row: &mut RowFill) {
        for any in [false, true] {
            let mut g = 1u64;
            while row.w < row.k && (g <= u || u + g < self.nodes) {
                for v in [u.checked_sub(g), Some(u + g).filter(|&v| v < self.nodes)]
                    .into_iter()
                    .flatten()
                {
                    if any || !self.hidden(v) {
                        row.push(v);
                    }
                }
                g += 1;
            }
        }
    }

    /// Rows `[lo, hi)` as CSR (as `webgraph_gen::generate_rows`): targets sorted and
    /// distinct within a row, never the row's node. Parallel with rayon.
    pub fn generate_rows(&self, lo: u64, hi: u64) -> (Vec<u64>, Vec<u32>) {
        assert!(lo <= hi && hi <= self.nodes, "bad row range {lo}..{hi}");
        let rows = (hi - lo) as usize;
        let mut indptr = vec![0u64; rows + 1];
        for i in 0..rows {
            indptr[i + 1] = indptr[i] + self.degrees[lo as usize + i] as u64;
        }
        let total = indptr[rows];
        let mut targets = vec![0u32; total as usize];
        let indptr_ref = &indptr;
        row_chunks(&indptr, &mut targets)
            .into_par_iter()
            .for_each(|(r0, r1, buf)| {
                let mut set = IdSet::new();
                let base = indptr_ref[r0];
                let mut host = self.host_index(lo + r0 as u64);
                for r in r0..r1 {
                    let u = lo + r as u64;
                    while u >= self.starts[host + 1] {
                        host += 1;
                    }
                    let a = (indptr_ref[r] - base) as usize;
                    let b = (indptr_ref[r + 1] - base) as usize;
                    self.fill_row(u, host, &mut buf[a..b], &mut set);
                }
            });
        (indptr, targets)
    }
}

/// Degrees `round(f x mean x raw)` clamped to `1..=cap` (0 where `raw` is 0), with
/// the factor `f` found by bisection so that their sum is as close to `arcs` as it
/// gets (the atoms of the law stay atoms; `adjust_degrees` spreads the rest).
fn scaled_degrees(raw: &[f32], mean: f64, cap: u64, arcs: u64) -> Vec<u32> {
    let deg = |f: f64, x: f32| -> u32 {
        if x == 0.0 {
            0
        } else {
            (f * mean * x as f64).round().clamp(1.0, cap as f64) as u32
        }
    };
    let sum = |f: f64| -> u64 { raw.par_iter().map(|&x| deg(f, x) as u64).sum() };
    let (mut lo, mut hi) = (1e-2, 1e2);
    let mut f = 1.0;
    for _ in 0..48 {
        let s = sum(f);
        if s == arcs {
            break;
        }
        if s < arcs {
            lo = f;
        } else {
            hi = f;
        }
        f = (lo * hi).sqrt();
        if hi / lo < 1.0 + 1e-9 {
            break;
        }
    }
    raw.par_iter().map(|&x| deg(f, x)).collect()
}

#[cfg(test)]
mod tests;
