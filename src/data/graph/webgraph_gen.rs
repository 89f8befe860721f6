//! Deterministic synthetic WebGraph-like directed link graphs.
//!
//! This stands in for ALX's WebGraph benchmarks (Common Crawl link graphs
//! filtered to nodes with at least K in- and out-links) when the real data is not
//! available. The model:
//!
//! * **Hosts.** Nodes `0..nodes` are partitioned into hosts, contiguous id
//!   ranges whose sizes are log-normal (sigma [`HOST_SIZE_SIGMA`], mean
//!   `mean_host_size`, at least [`MIN_HOST_SIZE`] nodes, at most
//!   [`MAX_HOST_FACTOR`] x the mean). The partition depends on `seed` only
//!   ([`HostLayout`]).
//! * **Out-degrees.** Node `u` draws its out-degree from a Pareto law with tail
//!   exponent `degree_exponent` (default 2.1), capped at
//!   `min(nodes - 1, 50 x mean degree)` and rescaled so that the mean of the capped
//!   law equals `arcs / nodes`; it is rounded stochastically, so the expected arc
//!   count is `arcs`.
//! * **Intra-host links.** A fraction `intra_host` (default 0.8) of a node's links
//!   point inside its own host, drawn from a Zipf law (exponent
//!   [`HOST_ZIPF_EXPONENT`]) over the host's members in id order, so the first node
//!   of a host is its "home page" and low offsets are its popular pages. This part
//!   is capped at `host size - 1`; the excess goes to the global part, so the
//!   measured fraction of intra-host arcs is a few points below `intra_host`
//!   (high-degree nodes in small hosts).
//! * **Global links.** The rest point outside the host, to globally popular
//!   nodes: a Zipf law with exponent `zipf_exponent` (default 1) over a popularity
//!   rank, mapped to node ids by the bijection `rank -> (rank * a + c) mod nodes`
//!   (`a` close to `nodes` times the golden ratio, coprime with `nodes`), so popular
//!   nodes are spread over all hosts. In-degrees come out heavy-tailed.
//! * **Rows.** Targets within a row are distinct (rejection on duplicates with a
//!   bounded number of attempts, then uniform fallback draws; rows that need more
//!   than half of the candidates are built by excluding random ones), never the
//!   node itself, and sorted increasing.
//!
//! Zipf laws are sampled with the inverse CDF of the continuous bounded power law
//! (no tables). Everything is a function of `(seed, node id)`: node `u`'s row only
//! uses `SplitMix64::for_id(seed, stream::WEBGRAPH_NODE, u)` plus the host layout
//! and the rank bijection, both derived from `seed` alone with
//! `stream::WEBGRAPH_HOSTS`. Any split of the node range, and any rayon thread
//! count, yields the same rows.

use crate::rng::{hash3, stream, SplitMix64};
use rayon::prelude::*;

/// Smallest host size.
pub const MIN_HOST_SIZE: u64 = 4;
/// Sigma of the log-normal host-size law.
pub const HOST_SIZE_SIGMA: f64 = 1.2;
/// Hosts are capped at this multiple of the mean host size.
pub const MAX_HOST_FACTOR: f64 = 64.0;
/// Zipf exponent of the popularity of a host's members (by offset in the host).
pub const HOST_ZIPF_EXPONENT: f64 = 1.0;
/// Out-degrees are capped at this multiple of the mean degree (and at nodes - 1).
pub const DEGREE_CAP_FACTOR: f64 = 50.0;
/// Default fraction of a node's links inside its own host.
pub const DEFAULT_INTRA_HOST: f64 = 0.8;
/// Default Pareto tail exponent of out-degrees.
pub const DEFAULT_DEGREE_EXPONENT: f64 = 2.1;
/// Default Zipf exponent of global popularity.
pub const DEFAULT_ZIPF_EXPONENT: f64 = 1.0;

/// A named size of ALX's WebGraph benchmark family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WebGraphPreset {
    pub name: &'static str,
    pub nodes: u64,
    pub arcs: u64,
}

/// ALX's WebGraph variants with their sizes:
/// in-dense (0.5M nodes, 122M arcs), in-sparse (1.5M, 149M), de-dense (5.7M, 824M),
/// de-sparse (19.7M, 1.19B), dense (136.5M, 22.2B), sparse (365.4M, 29.9B).
pub const PRESETS: &[WebGraphPreset] = &[
    WebGraphPreset {
        name: "in-dense",
        nodes: 500_000,
        arcs: 122_000_000,
    },
    WebGraphPreset {
        name: "in-sparse",
        nodes: 1_500_000,
        arcs: 149_000_000,
    },
    WebGraphPreset {
        name: "de-dense",
        nodes: 5_700_000,
        arcs: 824_000_000,
    },
    WebGraphPreset {
        name: "de-sparse",
        nodes: 19_700_000,
        arcs: 1_190_000_000,
    },
    WebGraphPreset {
        name: "dense",
        nodes: 136_500_000,
        arcs: 22_200_000_000,
    },
    WebGraphPreset {
        name: "sparse",
        nodes: 365_400_000,
        arcs: 29_900_000_000,
    },
];

/// The preset with this name (ASCII case-insensitive), if any.
pub fn preset(name: &str) -> Option<&'static WebGraphPreset> {
    let name = name.trim();
    PRESETS.iter().find(|p| p.name.eq_ignore_ascii_case(name))
}

/// Parameters of the generator; see the module documentation.
#[derive(Debug, Clone, PartialEq)]
pub struct WebGraphSpec {
    /// Number of nodes, `2..=u32::MAX`.
    pub nodes: u64,
    /// Target number of arcs (after removing self-loops and duplicates).
    pub arcs: u64,
    /// Fraction of a node's links inside its host, in `[0, 1]`.
    pub intra_host: f64,
    /// Mean number of nodes per host, `>= 1`.
    pub mean_host_size: f64,
    /// Pareto tail exponent of out-degrees, `> 0`.
    pub degree_exponent: f64,
    /// Zipf exponent of global popularity, `>= 0`.
    pub zipf_exponent: f64,
}

impl WebGraphSpec {
    /// A spec with default parameters for the given sizes.
    ///
    /// The default mean host size is `max(64, 4 x arcs / nodes)`, so that hosts are
    /// comfortably larger than typical out-degrees.
    pub fn new(nodes: u64, arcs: u64) -> Result<Self, String> {
        check_sizes(nodes, arcs)?;
        let mean_degree = arcs as f64 / nodes as f64;
        let spec = Self {
            nodes,
            arcs,
            intra_host: DEFAULT_INTRA_HOST,
            mean_host_size: (4.0 * mean_degree).max(64.0),
            degree_exponent: DEFAULT_DEGREE_EXPONENT,
            zipf_exponent: DEFAULT_ZIPF_EXPONENT,
        };
        spec.validate()?;
        Ok(spec)
    }

    /// The sizes of preset `name` multiplied by `scale` (rounded), default parameters.
    pub fn from_preset(name: &str, scale: f64) -> Result<Self, String> {
        let p = preset(name).ok_or_else(|| {
            let names: Vec<&str> = PRESETS.iter().map(|p| p.name).collect();
            format!(
                "unknown webgraph preset {}; valid presets: {}",
                crate::error::quote(name),
                names.join(", ")
            )
        })?;
        if !(scale.is_finite() && scale > 0.0) {
            return Err(format!(
                "webgraph preset {}: scale must be a positive finite number (got {scale})",
                p.name
            ));
        }
        let nodes = (p.nodes as f64 * scale).round();
        let arcs = (p.arcs as f64 * scale).round();
        if nodes < 2.0 {
            return Err(format!(
                "webgraph preset {} at scale {scale} has {nodes} nodes; need at least 2",
                p.name
            ));
        }
        if nodes > u32::MAX as f64 {
            return Err(format!(
                "webgraph preset {} at scale {scale} has {nodes} nodes; at most {} are supported",
                p.name,
                u32::MAX
            ));
        }
        Self::new(nodes as u64, arcs as u64)
            .map_err(|e| format!("webgraph preset {} at scale {scale}: {e}", p.name))
    }

    /// Mean out-degree `arcs / nodes`.
    pub fn mean_degree(&self) -> f64 {
        self.arcs as f64 / self.nodes as f64
    }

    /// Checks sizes and parameters; `Err` with a message naming the bad field.
    pub fn validate(&self) -> Result<(), String> {
        check_sizes(self.nodes, self.arcs)?;
        if !(self.intra_host.is_finite() && (0.0..=1.0).contains(&self.intra_host)) {
            return Err(format!(
                "webgraph spec: intra_host must be in [0, 1] (got {})",
                self.intra_host
            ));
        }
        if !(self.mean_host_size.is_finite() && self.mean_host_size >= 1.0) {
            return Err(format!(
                "webgraph spec: mean_host_size must be >= 1 (got {})",
                self.mean_host_size
            ));
        }
        if !(self.degree_exponent.is_finite() && self.degree_exponent > 0.0) {
            return Err(format!(
                "webgraph spec: degree_exponent must be > 0 (got {})",
                self.degree_exponent
            ));
        }
        if !(self.zipf_exponent.is_finite() && self.zipf_exponent >= 0.0) {
            return Err(format!(
                "webgraph spec: zipf_exponent must be >= 0 (got {})",
                self.zipf_exponent
            ));
        }
        Ok(())
    }
}

fn check_sizes(nodes: u64, arcs: u64) -> Result<(), String> {
    if nodes < 2 {
        return Err(format!("webgraph spec: nodes must be >= 2 (got {nodes})"));
    }
    if nodes > u32::MAX as u64 {
        return Err(format!(
            "webgraph spec: nodes must be <= {} (got {nodes})",
            u32::MAX
        ));
    }
    let max_arcs = nodes * (nodes - 1); // < 2^64 since nodes < 2^32
    if arcs > max_arcs {
        return Err(format!(
            "webgraph spec: {arcs} arcs exceed the {max_arcs} possible without self-loops on {nodes} nodes"
        ));
    }
    if arcs < nodes {
        return Err(format!(
            "webgraph spec: mean degree must be >= 1 ({arcs} arcs on {nodes} nodes)"
        ));
    }
    Ok(())
}

/// The host partition, computed from `(spec, seed)` alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostLayout {
    nodes: u64,
    /// `starts[i]..starts[i + 1]` is host `i`; `starts[num_hosts] == nodes`.
    starts: Vec<u64>,
}

impl HostLayout {
    /// Draws host sizes sequentially from `SplitMix64::for_id(seed, WEBGRAPH_HOSTS, 0)`.
    pub fn new(spec: &WebGraphSpec, seed: u64) -> Self {
        let nodes = spec.nodes;
        assert!(nodes >= 1, "webgraph host layout needs at least one node");
        let mean = if spec.mean_host_size.is_finite() {
            spec.mean_host_size.max(MIN_HOST_SIZE as f64)
        } else {
            MIN_HOST_SIZE as f64
        };
        let sigma = HOST_SIZE_SIGMA;
        let mu = mean.ln() - 0.5 * sigma * sigma;
        let max_size = ((MAX_HOST_FACTOR * mean).round() as u64).max(MIN_HOST_SIZE);
        let mut rng = SplitMix64::for_id(seed, stream::WEBGRAPH_HOSTS, 0);
        let mut starts = Vec::with_capacity((nodes as f64 / mean * 1.1) as usize + 2);
        starts.push(0u64);
        let mut pos = 0u64;
        while pos < nodes {
            let z = rng.next_normal();
            let size = ((mu + sigma * z).exp().round() as u64).clamp(MIN_HOST_SIZE, max_size);
            let remaining = nodes - pos;
            // The last host absorbs a remainder too small to form a host of its own.
            let size = if size + MIN_HOST_SIZE > remaining {
                remaining
            } else {
                size
            };
            pos += size;
            starts.push(pos);
        }
        Self { nodes, starts }
    }

    /// Number of hosts.
    pub fn num_hosts(&self) -> usize {
        self.starts.len() - 1
    }

    /// Number of nodes the layout covers.
    pub fn nodes(&self) -> u64 {
        self.nodes
    }

    /// Index of the host containing node `u`.
    pub fn host_index(&self, u: u64) -> usize {
        assert!(u < self.nodes, "node {u} out of range 0..{}", self.nodes);
        self.starts.partition_point(|&s| s <= u) - 1
    }

    /// `(start, end)` node range of host `i`.
    pub fn host_range(&self, i: usize) -> (u64, u64) {
        (self.starts[i], self.starts[i + 1])
    }

    /// `(start, end)` node range of the host containing node `u` (binary search).
    pub fn host_of(&self, u: u64) -> (u64, u64) {
        self.host_range(self.host_index(u))
    }
}

/// Bounded Zipf law over ranks `0..m`, sampled by inverting the CDF of the
/// continuous density `x^-s` on `[1, m + 1)`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Zipf {
    m: u64,
    one: bool,
    /// `ln(m + 1)` when `s == 1`, else `(m + 1)^(1 - s) - 1`.
    c: f64,
    /// `1 / (1 - s)`.
    inv: f64,
}

impl Zipf {
    pub(super) fn new(m: u64, s: f64) -> Self {
        let top = m as f64 + 1.0;
        if (s - 1.0).abs() < 1e-9 {
            Self {
                m,
                one: true,
                c: top.ln(),
                inv: 0.0,
            }
        } else {
            Self {
                m,
                one: false,
                c: top.powf(1.0 - s) - 1.0,
                inv: 1.0 / (1.0 - s),
            }
        }
    }

    /// A rank in `0..m` from `u` uniform in `[0, 1)`.
    #[inline]
    pub(super) fn sample(&self, u: f64) -> u64 {
        let x = if self.one {
            (u * self.c).exp()
        } else {
            (1.0 + u * self.c).powf(self.inv)
        };
        // x >= 1 up to rounding; `as` saturates negatives/NaN to 0.
        (x as u64).saturating_sub(1).min(self.m - 1)
    }
}

/// Open-addressing set of `u32` (linear probing, `u32::MAX` marks empty slots),
/// reused across rows.
pub(super) struct IdSet {
    table: Vec<u32>,
    mask: usize,
    shift: u32,
}

const EMPTY: u32 = u32::MAX;

impl IdSet {
    pub(super) fn new() -> Self {
        Self {
            table: Vec::new(),
            mask: 0,
            shift: 64,
        }
    }

    /// Empties the set and sizes it for up to `n` entries (load <= 1/2).
    pub(super) fn reset(&mut self, n: usize) {
        let cap = (2 * n).next_power_of_two().max(16);
        if self.table.len() < cap {
            self.table.resize(cap, EMPTY);
        }
        self.table[..cap].fill(EMPTY);
        self.mask = cap - 1;
        self.shift = 64 - cap.trailing_zeros();
    }

    #[inline]
    fn slot(&self, v: u32) -> usize {
        ((v as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> self.shift) as usize
    }

    /// Inserts `v` (never `u32::MAX`); true if it was not present.
    #[inline]
    pub(super) fn insert(&mut self, v: u32) -> bool {
        let mut i = self.slot(v);
        loop {
            let t = self.table[i];
            if t == EMPTY {
                self.table[i] = v;
                return true;
            }
            if t == v {
                return false;
            }
            i = (i + 1) & self.mask;
        }
    }

    #[inline]
    fn contains(&self, v: u32) -> bool {
        let mut i = self.slot(v);
        loop {
            let t = self.table[i];
            if t == v {
                return true;
            }
            if t == EMPTY {
                return false;
            }
            i = (i + 1) & self.mask;
        }
    }
}

/// Fills `out` with distinct values from a candidate space of size `m >= out.len()`.
///
/// `propose` draws from the skewed law (`None` for an invalid draw); `map` maps an
/// index in `0..m` to its candidate, uniformly. If more than half of the space is
/// needed, random candidates are excluded instead. Otherwise skewed proposals are
/// tried (rejecting duplicates) for a bounded number of attempts, then uniform ones.
fn sample_distinct(
    out: &mut [u32],
    set: &mut IdSet,
    rng: &mut SplitMix64,
    m: u64,
    mut propose: impl FnMut(&mut SplitMix64) -> Option<u32>,
    map: impl Fn(u64) -> u32,
) {
    let k = out.len();
    if k == 0 {
        return;
    }
    debug_assert!(k as u64 <= m);
    if 2 * k as u64 > m {
        let excluded = (m - k as u64) as usize;
        set.reset(excluded);
        let mut n = 0;
        while n < excluded {
            if set.insert(rng.below(m) as u32) {
                n += 1;
            }
        }
        let mut w = 0;
        for j in 0..m {
            if !set.contains(j as u32) {
                out[w] = map(j);
                w += 1;
            }
        }
        debug_assert_eq!(w, k);
    } else {
        set.reset(k);
        let budget = 4 * k + 64;
        let mut tries = 0;
        let mut w = 0;
        while w < k {
            let cand = if tries < budget {
                tries += 1;
                match propose(rng) {
                    Some(v) => v,
                    None => continue,
                }
            } else {
                map(rng.below(m))
            };
            if set.insert(cand) {
                out[w] = cand;
                w += 1;
            }
        }
    }
}

/// Derived parameters shared by all rows.
struct Model {
    nodes: u64,
    seed: u64,
    intra: f64,
    /// Pareto scale (minimum) and `1 / alpha`.
    xm: f64,
    inv_alpha: f64,
    /// Out-degree cap, `min(nodes - 1, ceil(50 x mean degree))`.
    cap: u64,
    global: Zipf,
    perm_a: u64,
    perm_c: u64,
}

pub(super) fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// The popularity-rank bijection `r -> (r * a + c) mod nodes`, from `seed` alone.
fn global_perm(nodes: u64, seed: u64) -> (u64, u64) {
    let golden = (nodes as f64 * 0.618_033_988_749_894_9) as u64;
    let jitter = hash3(seed, stream::WEBGRAPH_HOSTS, 1) % (nodes / 64 + 1);
    let mut a = (golden + jitter) % nodes;
    if a == 0 {
        a = 1;
    }
    while gcd(a, nodes) != 1 {
        a += 1;
        if a >= nodes {
            a = 1;
        }
    }
    let c = hash3(seed, stream::WEBGRAPH_HOSTS, 2) % nodes;
    (a, c)
}

/// `E[min(X, c)]` for `X ~ Pareto(xm, alpha)`.
fn capped_pareto_mean(xm: f64, alpha: f64, c: f64) -> f64 {
    if xm <= 0.0 {
        return 0.0;
    }
    if xm >= c {
        return c;
    }
    if (alpha - 1.0).abs() < 1e-9 {
        xm + xm * (c / xm).ln()
    } else {
        xm + xm.powf(alpha) * (c.powf(1.0 - alpha) - xm.powf(1.0 - alpha)) / (1.0 - alpha)
    }
}

impl Model {
    fn new(spec: &WebGraphSpec, seed: u64) -> Self {
        if let Err(e) = spec.validate() {
            panic!("invalid webgraph spec: {e}");
        }
        let nodes = spec.nodes;
        let mean = spec.mean_degree();
        let cap = ((DEGREE_CAP_FACTOR * mean).ceil() as u64).min(nodes - 1);
        let alpha = spec.degree_exponent;
        let capf = cap as f64;
        // Solve E[min(X, cap)] = mean for the Pareto scale (increasing in xm).
        let (mut lo, mut hi) = (0.0f64, capf);
        for _ in 0..200 {
            let mid = 0.5 * (lo + hi);
            if capped_pareto_mean(mid, alpha, capf) < mean {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        let (perm_a, perm_c) = global_perm(nodes, seed);
        Self {
            nodes,
            seed,
            intra: spec.intra_host,
            xm: 0.5 * (lo + hi),
            inv_alpha: 1.0 / alpha,
            cap,
            global: Zipf::new(nodes, spec.zipf_exponent),
            perm_a,
            perm_c,
        }
    }

    #[inline]
    fn rank_to_node(&self, r: u64) -> u64 {
        // r, a < nodes <= u32::MAX, so r * a fits in u64.
        ((r * self.perm_a) % self.nodes + self.perm_c) % self.nodes
    }

    fn rng(&self, u: u64) -> SplitMix64 {
        SplitMix64::for_id(self.seed, stream::WEBGRAPH_NODE, u)
    }

    /// The first draws of a row's generator: its out-degree.
    #[inline]
    fn draw_degree(&self, rng: &mut SplitMix64) -> u64 {
        let u = 1.0 - rng.next_f64(); // (0, 1]
        let x = (self.xm * u.powf(-self.inv_alpha)).min(self.cap as f64);
        let f = x.floor();
        let mut d = f as u64;
        if rng.next_f64() < x - f {
            d += 1;
        }
        d.min(self.cap)
    }

    /// Fills node `u`'s row (of length its degree) in host `hs..he`; `rng` has
    /// already drawn the degree.
    fn fill_row(
        &self,
        u: u64,
        (hs, he): (u64, u64),
        rng: &mut SplitMix64,
        out: &mut [u32],
        set: &mut IdSet,
    ) {
        let deg = out.len() as u64;
        let h = he - hs;
        let off = u - hs;
        let x = self.intra * deg as f64;
        let f = x.floor();
        let mut k_in = f as u64;
        if rng.next_f64() < x - f {
            k_in += 1;
        }
        // deg <= nodes - 1 keeps both bounds consistent.
        let k_in = k_in.min(h - 1).max(deg.saturating_sub(self.nodes - h));
        let (intra_out, global_out) = out.split_at_mut(k_in as usize);
        if k_in > 0 {
            let z = Zipf::new(h, HOST_ZIPF_EXPONENT);
            sample_distinct(
                intra_out,
                set,
                rng,
                h - 1,
                |rng| {
                    let r = z.sample(rng.next_f64());
                    (r != off).then(|| (hs + r) as u32)
                },
                |j| (hs + if j < off { j } else { j + 1 }) as u32,
            );
        }
        if !global_out.is_empty() {
            sample_distinct(
                global_out,
                set,
                rng,
                self.nodes - h,
                |rng| {
                    let v = self.rank_to_node(self.global.sample(rng.next_f64()));
                    (v < hs || v >= he).then_some(v as u32)
                },
                |j| (if j < hs { j } else { j + h }) as u32,
            );
        }
        out.sort_unstable();
    }
}

/// Splits `targets` (of `indptr`'s rows) into disjoint slices of whole rows of about
/// `total / (16 x threads)` arcs each (at least 32k), for filling in parallel:
/// `(first row, one past the last, the rows' targets)`.
pub(super) fn row_chunks<'a>(
    indptr: &[u64],
    targets: &'a mut [u32],
) -> Vec<(usize, usize, &'a mut [u32])> {
    let rows = indptr.len() - 1;
    let total = indptr[rows];
    let per_chunk = (total / (rayon::current_num_threads() as u64 * 16)).max(1 << 15);
    let mut chunks = Vec::new();
    let mut rest = targets;
    let mut r0 = 0;
    while r0 < rows {
        let mut r1 = r0 + 1;
        while r1 < rows && indptr[r1] - indptr[r0] < per_chunk {
            r1 += 1;
        }
        let len = (indptr[r1] - indptr[r0]) as usize;
        let (head, tail) = std::mem::take(&mut rest).split_at_mut(len);
        chunks.push((r0, r1, head));
        rest = tail;
        r0 = r1;
    }
    chunks
}

/// Out-degrees of rows `[lo, hi)`: the row lengths `generate_rows` produces, without
/// drawing the arcs (the first draws of each row's generator). Parallel with rayon.
///
/// Panics if `spec` is invalid or `lo > hi` or `hi > spec.nodes`.
pub fn generate_degrees(spec: &WebGraphSpec, seed: u64, lo: u64, hi: u64) -> Vec<u32> {
    let model = Model::new(spec, seed);
    assert!(
        lo <= hi && hi <= spec.nodes,
        "bad row range {lo}..{hi} for {} nodes",
        spec.nodes
    );
    let mut d = vec![0u32; (hi - lo) as usize];
    d.par_iter_mut()
        .with_min_len(4096)
        .enumerate()
        .for_each(|(i, x)| *x = model.draw_degree(&mut model.rng(lo + i as u64)) as u32);
    d
}

/// Rows `[lo, hi)` as CSR: `indptr` has `hi - lo + 1` entries starting at 0; targets
/// are sorted and distinct within a row, never the row's node, all `< spec.nodes`.
///
/// Row `u` depends only on `(spec, seed, u)` and the layout, so any split of the
/// node range gives the same rows. Parallel with rayon; memory is the output plus
/// small per-task buffers.
///
/// Panics if `spec` is invalid, `layout` does not cover `spec.nodes` nodes, or
/// `lo > hi` or `hi > spec.nodes`.
pub fn generate_rows(
    spec: &WebGraphSpec,
    layout: &HostLayout,
    seed: u64,
    lo: u64,
    hi: u64,
) -> (Vec<u64>, Vec<u32>) {
    let model = Model::new(spec, seed);
    assert_eq!(
        layout.nodes, spec.nodes,
        "host layout covers {} nodes but the spec has {}",
        layout.nodes, spec.nodes
    );
    assert!(
        lo <= hi && hi <= spec.nodes,
        "bad row range {lo}..{hi} for {} nodes",
        spec.nodes
    );
    let rows = (hi - lo) as usize;

    // Pass 1: degrees (the first draws of each row's generator), then offsets.
    let mut indptr = vec![0u64; rows + 1];
    indptr[1..]
        .par_iter_mut()
        .with_min_len(4096)
        .enumerate()
        .for_each(|(i, d)| *d = model.draw_degree(&mut model.rng(lo + i as u64)));
    for i in 0..rows {
        indptr[i + 1] += indptr[i];
    }
    let total = indptr[rows];

    // Pass 2: fill disjoint slices of the target array, chunked by arc count.
    let mut targets = vec![0u32; total as usize];
    let indptr_ref = &indptr;
    row_chunks(&indptr, &mut targets)
        .into_par_iter()
        .for_each(|(r0, r1, buf)| {
            let mut set = IdSet::new();
            let base = indptr_ref[r0];
            let mut host = layout.host_index(lo + r0 as u64);
            let mut range = layout.host_range(host);
            for r in r0..r1 {
                let u = lo + r as u64;
                while u >= range.1 {
                    host += 1;
                    range = layout.host_range(host);
                }
                let mut rng = model.rng(u);
                let deg = model.draw_degree(&mut rng);
                let a = (indptr_ref[r] - base) as usize;
                let b = (indptr_ref[r + 1] - base) as usize;
                debug_assert_eq!(deg as usize, b - a);
                model.fill_row(u, range, &mut rng, &mut buf[a..b], &mut set);
            }
        });
    (indptr, targets)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn build(spec: &WebGraphSpec, seed: u64, lo: u64, hi: u64) -> (Vec<u64>, Vec<u32>) {
        let layout = HostLayout::new(spec, seed);
        generate_rows(spec, &layout, seed, lo, hi)
    }

    fn check_invariants(spec: &WebGraphSpec, lo: u64, indptr: &[u64], targets: &[u32]) {
        assert_eq!(indptr[0], 0);
        assert_eq!(*indptr.last().unwrap() as usize, targets.len());
        for (i, w) in indptr.windows(2).enumerate() {
            assert!(w[0] <= w[1], "indptr decreases at row {i}");
            let u = lo + i as u64;
            let row = &targets[w[0] as usize..w[1] as usize];
            for pair in row.windows(2) {
                assert!(pair[0] < pair[1], "row {u} not sorted/distinct");
            }
            for &v in row {
                assert!((v as u64) < spec.nodes, "row {u}: target {v} out of range");
                assert_ne!(v as u64, u, "self-loop at {u}");
            }
        }
    }

    fn in_degrees(spec: &WebGraphSpec, targets: &[u32]) -> Vec<u64> {
        let mut d = vec![0u64; spec.nodes as usize];
        for &v in targets {
            d[v as usize] += 1;
        }
        d
    }

    #[test]
    fn split_invariance_and_thread_invariance() {
        let spec = WebGraphSpec::new(20_000, 400_000).unwrap();
        let seed = 11;
        let n = spec.nodes;
        let (ip, tg) = build(&spec, seed, 0, n);
        check_invariants(&spec, 0, &ip, &tg);
        for k in [1, 777, 10_000, 19_999] {
            let (ip_a, tg_a) = build(&spec, seed, 0, k);
            let (ip_b, tg_b) = build(&spec, seed, k, n);
            let mut cat_ip = ip_a.clone();
            let off = *ip_a.last().unwrap();
            cat_ip.extend(ip_b[1..].iter().map(|x| x + off));
            let mut cat_tg = tg_a;
            cat_tg.extend_from_slice(&tg_b);
            assert_eq!(cat_ip, ip, "indptr differs for split at {k}");
            assert_eq!(cat_tg, tg, "targets differ for split at {k}");
        }
        // A middle slice equals the corresponding part of the full graph.
        let (lo, hi) = (3_333u64, 12_345u64);
        let (ip_m, tg_m) = build(&spec, seed, lo, hi);
        let a = ip[lo as usize] as usize;
        let b = ip[hi as usize] as usize;
        assert_eq!(&tg_m[..], &tg[a..b]);
        let shifted: Vec<u64> = ip[lo as usize..=hi as usize]
            .iter()
            .map(|x| x - ip[lo as usize])
            .collect();
        assert_eq!(ip_m, shifted);
        // Empty range.
        let (ip_e, tg_e) = build(&spec, seed, 500, 500);
        assert_eq!(ip_e, vec![0]);
        assert!(tg_e.is_empty());
        // Thread count does not matter.
        for threads in [1, 3] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let (ip_t, tg_t) = pool.install(|| build(&spec, seed, 0, n));
            assert_eq!(ip_t, ip, "{threads} threads");
            assert_eq!(tg_t, tg, "{threads} threads");
        }
    }

    #[test]
    fn degrees_are_the_row_lengths() {
        let spec = WebGraphSpec::new(3000, 60_000).unwrap();
        let (indptr, _) = build(&spec, 11, 100, 2100);
        let lens: Vec<u32> = indptr.windows(2).map(|w| (w[1] - w[0]) as u32).collect();
        assert_eq!(generate_degrees(&spec, 11, 100, 2100), lens);
        assert!(lens.iter().any(|&d| d > 0));
    }

    #[test]
    fn same_seed_same_graph_different_seed_different_graph() {
        let spec = WebGraphSpec::new(5_000, 60_000).unwrap();
        let a = build(&spec, 1, 0, spec.nodes);
        let b = build(&spec, 1, 0, spec.nodes);
        let c = build(&spec, 2, 0, spec.nodes);
        assert_eq!(a, b);
        assert_ne!(a.1, c.1);
        assert_eq!(HostLayout::new(&spec, 1), HostLayout::new(&spec, 1));
        assert_ne!(HostLayout::new(&spec, 1), HostLayout::new(&spec, 2));
    }

    #[test]
    fn invariants_hold_including_tiny_and_complete_graphs() {
        for (nodes, arcs, seed) in [
            (2, 2, 1),
            (3, 6, 2),
            (10, 90, 3),
            (10, 45, 4),
            (50, 1_000, 5),
            (300, 3_000, 6),
            (2_000, 100_000, 7),
        ] {
            let spec = WebGraphSpec::new(nodes, arcs).unwrap();
            let (ip, tg) = build(&spec, seed, 0, nodes);
            check_invariants(&spec, 0, &ip, &tg);
            if arcs == nodes * (nodes - 1) {
                assert_eq!(tg.len() as u64, arcs, "complete graph {nodes}");
            }
        }
        // Non-default parameters.
        let mut spec = WebGraphSpec::new(3_000, 60_000).unwrap();
        spec.intra_host = 1.0;
        spec.zipf_exponent = 0.7;
        spec.degree_exponent = 1.5;
        spec.mean_host_size = 10.0;
        let (ip, tg) = build(&spec, 9, 0, spec.nodes);
        check_invariants(&spec, 0, &ip, &tg);
        spec.intra_host = 0.0;
        spec.zipf_exponent = 1.6;
        let (ip, tg) = build(&spec, 9, 0, spec.nodes);
        check_invariants(&spec, 0, &ip, &tg);
    }

    #[test]
    fn host_layout_partitions_nodes() {
        let spec = WebGraphSpec::new(200_000, 4_000_000).unwrap();
        let layout = HostLayout::new(&spec, 5);
        let h = layout.num_hosts();
        let mut sizes = Vec::with_capacity(h);
        for i in 0..h {
            let (s, e) = layout.host_range(i);
            assert!(e - s >= MIN_HOST_SIZE);
            sizes.push(e - s);
            assert_eq!(layout.host_of(s), (s, e));
            assert_eq!(layout.host_of(e - 1), (s, e));
        }
        assert_eq!(layout.host_range(0).0, 0);
        assert_eq!(layout.host_range(h - 1).1, spec.nodes);
        let mean = spec.nodes as f64 / h as f64;
        assert!(
            (mean / spec.mean_host_size - 1.0).abs() < 0.15,
            "mean host size {mean} vs {}",
            spec.mean_host_size
        );
        let max = *sizes.iter().max().unwrap() as f64;
        assert!(
            max > 8.0 * mean,
            "host sizes not heavy-tailed: max {max} mean {mean}"
        );
    }

    #[test]
    fn arc_count_close_to_target() {
        for (spec, seed) in [
            (WebGraphSpec::new(20_000, 400_000).unwrap(), 3),
            (WebGraphSpec::from_preset("in-dense", 0.02).unwrap(), 4),
            (WebGraphSpec::new(30_000, 90_000).unwrap(), 5),
        ] {
            let (_, tg) = build(&spec, seed, 0, spec.nodes);
            let ratio = tg.len() as f64 / spec.arcs as f64;
            eprintln!(
                "nodes {} target arcs {} actual {} ratio {ratio:.4}",
                spec.nodes,
                spec.arcs,
                tg.len()
            );
            assert!((ratio - 1.0).abs() < 0.03, "arc ratio {ratio}");
        }
    }

    #[test]
    fn intra_host_fraction_matches() {
        for (intra, seed) in [(0.8, 1), (0.5, 2)] {
            let mut spec = WebGraphSpec::new(20_000, 400_000).unwrap();
            spec.intra_host = intra;
            let layout = HostLayout::new(&spec, seed);
            let (ip, tg) = generate_rows(&spec, &layout, seed, 0, spec.nodes);
            let mut inside = 0u64;
            for u in 0..spec.nodes {
                let (s, e) = layout.host_of(u);
                inside += tg[ip[u as usize] as usize..ip[u as usize + 1] as usize]
                    .iter()
                    .filter(|&&v| (v as u64) >= s && (v as u64) < e)
                    .count() as u64;
            }
            let frac = inside as f64 / tg.len() as f64;
            eprintln!("intra_host {intra}: measured {frac:.4}");
            assert!(
                (frac - intra).abs() < 0.04,
                "intra fraction {frac} vs {intra}"
            );
        }
    }

    #[test]
    fn degrees_are_heavy_tailed_and_popular_ranks_are_popular() {
        let spec = WebGraphSpec::new(20_000, 400_000).unwrap();
        let seed = 8;
        let (ip, tg) = build(&spec, seed, 0, spec.nodes);
        let mean = tg.len() as f64 / spec.nodes as f64;
        let max_out = ip.windows(2).map(|w| w[1] - w[0]).max().unwrap() as f64;
        let indeg = in_degrees(&spec, &tg);
        let max_in = *indeg.iter().max().unwrap() as f64;
        eprintln!("mean {mean:.1} max out {max_out} max in {max_in}");
        assert!(
            max_out > 10.0 * mean,
            "max out-degree {max_out}, mean {mean}"
        );
        assert!(max_in > 10.0 * mean, "max in-degree {max_in}, mean {mean}");
        let model = Model::new(&spec, seed);
        for r in 0..5 {
            let v = model.rank_to_node(r) as usize;
            assert!(
                indeg[v] as f64 > 20.0 * mean,
                "global rank {r} (node {v}) has in-degree {}",
                indeg[v]
            );
        }
        // Out-degrees: a sizable fraction of arcs comes from rows > 3x the mean.
        let heavy: u64 = ip
            .windows(2)
            .map(|w| w[1] - w[0])
            .filter(|&d| d as f64 > 3.0 * mean)
            .sum();
        assert!(heavy as f64 > 0.05 * tg.len() as f64);
        // The rank bijection is a permutation.
        let mut seen = vec![false; spec.nodes as usize];
        for r in 0..spec.nodes {
            let v = model.rank_to_node(r) as usize;
            assert!(!seen[v]);
            seen[v] = true;
        }
    }

    #[test]
    fn presets_and_spec_errors() {
        assert_eq!(PRESETS.len(), 6);
        let p = preset("in-dense").unwrap();
        assert_eq!((p.nodes, p.arcs), (500_000, 122_000_000));
        assert_eq!(preset("sparse").unwrap().nodes, 365_400_000);
        assert_eq!(preset("de-sparse").unwrap().arcs, 1_190_000_000);
        assert!(preset("nope").is_none());
        for p in PRESETS {
            let s = WebGraphSpec::from_preset(p.name, 1.0).unwrap();
            assert_eq!((s.nodes, s.arcs), (p.nodes, p.arcs));
        }
        let s = WebGraphSpec::from_preset("in-sparse", 0.01).unwrap();
        assert_eq!((s.nodes, s.arcs), (15_000, 1_490_000));
        assert_eq!(s.intra_host, DEFAULT_INTRA_HOST);
        assert!(s.mean_host_size >= 4.0 * s.mean_degree() - 1e-9);
        let err = WebGraphSpec::from_preset("bogus", 1.0).unwrap_err();
        assert!(err.contains("in-dense") && err.contains("sparse"), "{err}");
        assert!(WebGraphSpec::from_preset("in-dense", 1e-9).is_err());
        assert!(WebGraphSpec::from_preset("in-dense", 0.0).is_err());
        assert!(WebGraphSpec::from_preset("in-dense", f64::NAN).is_err());
        assert!(WebGraphSpec::from_preset("sparse", 100.0).is_err());
        assert!(WebGraphSpec::new(1, 0).is_err());
        assert!(WebGraphSpec::new(0, 0).is_err());
        assert!(WebGraphSpec::new(u32::MAX as u64 + 1, 1 << 40).is_err());
        assert!(WebGraphSpec::new(10, 91).is_err());
        assert!(WebGraphSpec::new(10, 90).is_ok());
        assert!(WebGraphSpec::new(10, 9).is_err());
        assert!(WebGraphSpec::new(10, 10).is_ok());
        let mut bad = WebGraphSpec::new(100, 1000).unwrap();
        bad.intra_host = 1.5;
        assert!(bad.validate().is_err());
    }
}
