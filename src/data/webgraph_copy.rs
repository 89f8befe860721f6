//! The copying web-graph model: synthetic link graphs whose structure is fitted to
//! a real crawl (`generate webgraph --like G`, [`super::webgraph_fit`]).
//!
//! A crawl in URL order is a sequence of hosts, each a run of consecutive ids, and a
//! host's pages are built from a few templates, so neighbours in id order share most
//! of their links (Kumar et al.'s copying model; this is what lets BV compress a crawl
//! to 2-3 bits a link). The model, every part a function of `(seed, node id)`:
//!
//! * **Hosts** are runs of consecutive ids with log-normal sizes (mean `host_mean`,
//!   sigma `host_sigma`, at least 1 page). **Directories** are runs inside a host: a
//!   page other than the host's first starts a new directory with probability
//!   `1 / dir_mean`.
//! * **Out-degrees**: a fraction `zero_out` of the pages has no links; the others
//!   draw a degree from the quantile function given by `out_knots` (pairs of a
//!   survival probability and a degree in units of the mean positive degree,
//!   log-linear between knots) with a Pareto tail of exponent `out_tail` beyond the
//!   last knot, capped at `out_cap` x the mean. The degrees are then scaled (and
//!   the remainder spread one link at a time over pages in a fixed pseudo-random
//!   order) so that the graph has exactly the arcs asked for.
//! * **Discovery links**: a crawler found every page through a link, so a page with
//!   links first links to the pages after it up to the next page with links (those
//!   without links of their own, then that one; as many as its degree allows), and
//!   the last page with links to the first pages. Every page but a few then has an
//!   in-link, as in a crawl.
//! * **The other links** of page `u` (degree `k`) are, by stochastic rounding of the
//!   fractions:
//!   - `template x k` **template links** to the host's first pages (its home page and
//!     navigation, `ceil(template_pages x mean degree)` of them), Zipf-distributed
//!     (exponent `host_zipf`) over them: shared by every page of the host;
//!   - `copy x k` **copied links**: the first distinct entries of its directory's
//!     link list, a sequence drawn from the directory's own generator (each entry a
//!     sibling in the directory with probability `copy_sibling`, else a page of the
//!     host, Zipf over its offsets). Two pages of a directory share the shorter of
//!     their prefixes, the copying model's "copy the prototype's list";
//!   - `local x k` **fresh local links** at a gap of `1 + Geometric(mean local_gap)`
//!     either way;
//!   - the rest **out of the host by preferential attachment**: a host drawn from a
//!     Zipf law (exponent `global_zipf`) over hosts in a seeded pseudo-random order,
//!     then a page of it, Zipf over its offsets (home pages collect most in-links).
//!
//!   A row has no duplicates and no self-loop: a draw that repeats is redrawn
//!   within a budget, then replaced by a uniform draw over all nodes; rows are sorted.
//!
//! The host layout, the directory starts and the degree adjustment depend on `seed`
//! only; row `u` on `SplitMix64::for_id(seed, COPY_NODE, u)` and its directory's
//! list generator, so any split of the node range and any thread count give the same
//! graph.

use super::webgraph_gen::{gcd, IdSet, Zipf};
use crate::rng::{hash3, stream, SplitMix64};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

/// Format version of the parameter file.
pub const PARAMS_VERSION: u32 = 1;

/// The copying model's shape, independent of the graph's size; see the module doc.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CopyingParams {
    /// [`PARAMS_VERSION`].
    pub version: u32,
    /// What the parameters were fitted to (informational).
    #[serde(default)]
    pub fitted_to: String,
    pub zero_out: f64,
    /// `[survival, degree / mean positive degree]`, survival decreasing from 1.
    pub out_knots: Vec<[f64; 2]>,
    pub out_tail: f64,
    pub out_cap: f64,
    pub host_mean: f64,
    pub host_sigma: f64,
    pub dir_mean: f64,
    /// Probability that a page takes its directory's degree draw.
    pub degree_corr: f64,
    pub template: f64,
    pub template_pages: f64,
    pub copy: f64,
    pub copy_sibling: f64,
    /// Probability that a page links to its directory's index.
    pub up_link: f64,
    pub local: f64,
    pub local_gap: f64,
    pub host_zipf: f64,
    pub global_zipf: f64,
}

impl CopyingParams {
    /// Checks every field; `Err` names the first bad one.
    pub fn validate(&self) -> Result<(), String> {
        if self.version != PARAMS_VERSION {
            return Err(format!(
                "version {} (this build reads version {PARAMS_VERSION})",
                self.version
            ));
        }
        let unit = |name: &str, x: f64| -> Result<(), String> {
            if x.is_finite() && (0.0..=1.0).contains(&x) {
                Ok(())
            } else {
                Err(format!("{name} must be in [0, 1] (got {x})"))
            }
        };
        let pos = |name: &str, x: f64, min: f64| -> Result<(), String> {
            if x.is_finite() && x >= min {
                Ok(())
            } else {
                Err(format!("{name} must be a finite number >= {min} (got {x})"))
            }
        };
        unit("zero_out", self.zero_out)?;
        if self.zero_out >= 1.0 {
            return Err("zero_out must be below 1 (some page needs links)".into());
        }
        unit("template", self.template)?;
        unit("copy", self.copy)?;
        unit("local", self.local)?;
        unit("copy_sibling", self.copy_sibling)?;
        unit("degree_corr", self.degree_corr)?;
        unit("up_link", self.up_link)?;
        if self.template + self.copy + self.local > 1.0 + 1e-9 {
            return Err(format!(
                "template + copy + local must be at most 1 (got {})",
                self.template + self.copy + self.local
            ));
        }
        pos("out_tail", self.out_tail, 0.05)?;
        pos("out_cap", self.out_cap, 1.0)?;
        pos("host_mean", self.host_mean, 1.0)?;
        pos("host_sigma", self.host_sigma, 0.0)?;
        pos("dir_mean", self.dir_mean, 1.0)?;
        pos("template_pages", self.template_pages, 0.0)?;
        pos("local_gap", self.local_gap, 0.0)?;
        pos("host_zipf", self.host_zipf, 0.0)?;
        pos("global_zipf", self.global_zipf, 0.0)?;
        if self.out_knots.is_empty() {
            return Err("out_knots must not be empty".into());
        }
        let mut prev = (f64::INFINITY, 0.0);
        for (i, &[s, d]) in self.out_knots.iter().enumerate() {
            if !(s.is_finite() && s > 0.0 && s <= 1.0 && s < prev.0) {
                return Err(format!(
                    "out_knots[{i}]: survival {s} must be in (0, 1] and decreasing"
                ));
            }
            if !(d.is_finite() && d > 0.0 && d >= prev.1) {
                return Err(format!(
                    "out_knots[{i}]: degree {d} must be positive and non-decreasing"
                ));
            }
            prev = (s, d);
        }
        Ok(())
    }

    /// Parses a parameter file (TOML, or JSON when it starts with `{`).
    pub fn parse(text: &str) -> Result<Self, String> {
        let p: Self = if text.trim_start().starts_with('{') {
            serde_json::from_str(text).map_err(|e| e.to_string())?
        } else {
            toml::from_str(text).map_err(|e| e.to_string())?
        };
        p.validate()?;
        Ok(p)
    }

    /// The parameters as TOML (`json == false`) or pretty JSON.
    pub fn render(&self, json: bool) -> String {
        if json {
            serde_json::to_string_pretty(self).expect("params serialize") + "\n"
        } else {
            toml::to_string(self).expect("params serialize")
        }
    }
}

/// The parameters fitted to cnr-2000 (`generate webgraph --like
/// ../shared/data/cnr-2000/cnr-2000 --params-out`), the shape of the presets.
pub fn cnr2000_params() -> CopyingParams {
    CopyingParams::parse(include_str!("cnr2000_params.toml")).expect("built-in params are valid")
}

/// A graph of the copying model: parameters, sizes, seed and everything derived from
/// them alone (the host starts and every node's out-degree).
#[derive(Debug, Clone)]
pub struct CopyModel {
    pub params: CopyingParams,
    pub nodes: u64,
    pub arcs: u64,
    pub seed: u64,
    /// `starts[i]..starts[i + 1]` is host `i`.
    starts: Vec<u64>,
    degrees: Vec<u32>,
    template_pages: u64,
    host_perm: (u64, u64),
    global: Zipf,
}

/// Stochastic rounding of `x >= 0` with a uniform draw.
#[inline]
fn sround(x: f64, rng: &mut SplitMix64) -> u64 {
    let f = x.floor();
    f as u64 + u64::from(rng.next_f64() < x - f)
}

/// Degree in units of the mean positive degree at survival `s` in (0, 1].
fn quantile(p: &CopyingParams, s: f64) -> f64 {
    let k = &p.out_knots;
    if s >= k[0][0] {
        return k[0][1];
    }
    for w in k.windows(2) {
        let ([s0, d0], [s1, d1]) = (w[0], w[1]);
        if s >= s1 {
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
        let size = ((mu + sigma * rng.next_normal()).exp().round() as u64).max(1);
        pos = (pos + size).min(nodes);
        starts.push(pos);
    }
    starts
}

/// Whether page `u` (not its host's first) starts a directory.
fn is_dir_start(seed: u64, dir_mean: f64, u: u64) -> bool {
    let x = hash3(seed, stream::COPY_DIRS, u);
    (x >> 11) as f64 * (1.0 / (1u64 << 53) as f64) < 1.0 / dir_mean
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

impl CopyModel {
    /// The model of `nodes` nodes and exactly `arcs` arcs. O(nodes) time (parallel)
    /// and 4 bytes a node.
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
        // Raw degrees: the zero pages are the first `nodes - positive` of a seeded
        // order, so the count is exact.
        let zb = bijection(nodes, seed, 10);
        let starts = host_starts(params, nodes, seed);
        let dir_start_of = |u: u64| {
            let hs = starts[starts.partition_point(|&s| s <= u) - 1];
            let mut ds = u;
            while ds > hs && !is_dir_start(seed, params.dir_mean, ds) {
                ds -= 1;
            }
            ds
        };
        let degrees: Vec<u32> = (0..nodes as usize)
            .into_par_iter()
            .with_min_len(4096)
            .map(|u| {
                let u = u as u64;
                if apply(zb, u, nodes) < nodes - positive {
                    return 0;
                }
                let mut rng = SplitMix64::for_id(seed, stream::COPY_NODE, u);
                // With probability degree_corr the page takes its directory's draw
                // (pages of one template have one degree), else its own.
                let own = 1.0 - rng.next_f64();
                let s = if rng.next_f64() < params.degree_corr {
                    let ds = dir_start_of(u);
                    1.0 - SplitMix64::for_id(seed, stream::COPY_DIRS, ds).next_f64()
                } else {
                    own
                };
                let x = (mean * quantile(params, s)).min(cap as f64);
                sround(x, &mut rng).clamp(1, cap) as u32
            })
            .collect();
        // A directory's index (its first page with links) lists the directory's
        // pages: its degree is at least their number.
        let mut degrees = degrees;
        for hi in 0..starts.len() - 1 {
            let (hs, he) = (starts[hi], starts[hi + 1]);
            let mut ds = hs;
            while ds < he {
                let mut de = ds + 1;
                while de < he && !is_dir_start(seed, params.dir_mean, de) {
                    de += 1;
                }
                if let Some(x) = (ds..de).find(|&v| degrees[v as usize] > 0) {
                    let d = &mut degrees[x as usize];
                    *d = (*d).max(((de - ds - 1) as u32).min(cap as u32));
                }
                ds = de;
            }
        }
        let mut model = Self {
            params: params.clone(),
            nodes,
            arcs,
            seed,
            starts,
            degrees,
            template_pages: 0,
            host_perm: (1, 0),
            global: Zipf::new(1, 0.0),
        };
        model.adjust_degrees(cap)?;
        let hosts = model.starts.len() as u64 - 1;
        model.template_pages = (params.template_pages * mean).ceil().max(1.0) as u64;
        model.host_perm = bijection(hosts, seed, 20);
        model.global = Zipf::new(hosts, params.global_zipf);
        Ok(model)
    }

    /// Scales the positive degrees to sum to `arcs`, then spreads the remainder one
    /// link at a time over positive pages in a seeded order.
    fn adjust_degrees(&mut self, cap: u64) -> Result<(), String> {
        let sum: u64 = self.degrees.par_iter().map(|&d| d as u64).sum();
        let f = self.arcs as f64 / sum as f64;
        let seed = self.seed;
        self.degrees
            .par_iter_mut()
            .with_min_len(4096)
            .enumerate()
            .for_each(|(u, d)| {
                if *d > 0 {
                    let mut rng = SplitMix64::for_id(seed, stream::COPY_ADJUST, u as u64);
                    *d = sround(*d as f64 * f, &mut rng).clamp(1, cap) as u32;
                }
            });
        let mut sum: u64 = self.degrees.par_iter().map(|&d| d as u64).sum();
        let n = self.nodes;
        let b = bijection(n, seed, 30);
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

    fn is_dir_start(&self, u: u64) -> bool {
        is_dir_start(self.seed, self.params.dir_mean, u)
    }

    /// The directory `[ds, de)` of node `u` in host `[hs, he)`.
    fn directory(&self, u: u64, (hs, he): (u64, u64)) -> (u64, u64) {
        let mut ds = u;
        while ds > hs && !self.is_dir_start(ds) {
            ds -= 1;
        }
        let mut de = u + 1;
        while de < he && !self.is_dir_start(de) {
            de += 1;
        }
        (ds, de)
    }

    /// Fills node `u`'s row (of its degree) in host `h = (hs, he)`, sorted.
    fn fill_row(&self, u: u64, h: (u64, u64), out: &mut [u32], set: &mut IdSet) {
        let p = &self.params;
        let k = out.len();
        if k == 0 {
            return;
        }
        let (hs, he) = h;
        let hsize = he - hs;
        let mut rng = SplitMix64::for_id(self.seed, stream::COPY_NODE, u ^ (1 << 63));
        set.reset(k);
        let mut w = 0usize;
        let me = u as u32;
        let mut push = |v: u64, set: &mut IdSet, w: &mut usize| -> bool {
            let v = v as u32;
            if v != me && *w < k && set.insert(v) {
                out[*w] = v;
                *w += 1;
                true
            } else {
                false
            }
        };
        let (ds, de) = self.directory(u, h);
        // The directory's index (its first page with links) lists its pages; every
        // other page with links links up to the index with probability `up_link`,
        // and on to the pages after it up to the next one with links (discovery).
        let index = (ds..de).find(|&v| self.degrees[v as usize] > 0);
        if index == Some(u) {
            for v in ds..de {
                push(v, set, &mut w);
            }
        } else {
            let mut v = u;
            for _ in 0..k {
                v = if v + 1 == self.nodes { 0 } else { v + 1 };
                if v == u {
                    break;
                }
                push(v, set, &mut w);
                if self.degrees[v as usize] > 0 {
                    break;
                }
            }
            if let Some(x) = index {
                if rng.next_f64() < p.up_link {
                    push(x, set, &mut w);
                }
            }
        }
        let r = (k - w) as f64;
        let list_share = p.template + p.copy;
        let k_list = (sround(list_share * r, &mut rng) as usize).min(k - w);
        let k_l = (sround(p.local * r, &mut rng) as usize).min(k - w - k_list);
        // A prefix of the directory's list: template entries are the host's pages in
        // order (shared by every directory of the host), the others a sibling (Zipf
        // over the directory's offsets: its index pages first) or a page of the host
        // (Zipf over its offsets).
        if k_list > 0 {
            let mut list = SplitMix64::for_id(self.seed, stream::COPY_LIST, ds);
            let t_share = p.template / list_share.max(1e-12);
            let tp = self.template_pages.min(hsize);
            let zd = Zipf::new(de - ds, p.host_zipf);
            let zh = Zipf::new(hsize, p.host_zipf);
            let mut j = 0u64;
            let goal = w + k_list;
            for _ in 0..4 * k_list + 16 {
                if w >= goal {
                    break;
                }
                let v = if list.next_f64() < t_share && j < tp {
                    j += 1;
                    hs + j - 1
                } else if list.next_f64() < p.copy_sibling {
                    ds + zd.sample(list.next_f64())
                } else {
                    hs + zh.sample(list.next_f64())
                };
                push(v, set, &mut w);
            }
        }
        // Fresh local links.
        if k_l > 0 {
            let goal = w + k_l;
            let q = 1.0 / (1.0 + p.local_gap.max(1e-9));
            for _ in 0..4 * k_l + 16 {
                if w >= goal {
                    break;
                }
                let g = 1 + ((1.0 - rng.next_f64()).ln() / (1.0 - q).ln()) as u64;
                let v = if rng.next_u64() & 1 == 0 {
                    u.checked_sub(g)
                } else {
                    Some(u + g).filter(|&v| v < self.nodes)
                };
                if let Some(v) = v {
                    push(v, set, &mut w);
                }
            }
        }
        // Out of the host by preferential attachment.
        let hosts = self.num_hosts() as u64;
        let mut tries = 0usize;
        let budget = 4 * (k - w) + 16;
        while w < k && tries < budget {
            tries += 1;
            let r = self.global.sample(rng.next_f64());
            let hi = apply(self.host_perm, r, hosts) as usize;
            let (s, e) = (self.starts[hi], self.starts[hi + 1]);
            if s == hs {
                continue;
            }
            push(
                s + Zipf::new(e - s, p.host_zipf).sample(rng.next_f64()),
                set,
                &mut w,
            );
        }
        // What the parts could not place (repeats in small hosts or directories):
        // pages ever farther from u, then uniform draws.
        let mut spread = 2 * (k as u64) + 8;
        let mut tries = 0usize;
        while w < k {
            tries += 1;
            let v = if tries < 8 * k + 64 {
                if tries.is_multiple_of(2 * k + 8) {
                    spread *= 2;
                }
                let g = 1 + rng.below(spread);
                if rng.next_u64() & 1 == 0 {
                    u.checked_sub(g)
                } else {
                    Some(u + g).filter(|&v| v < self.nodes)
                }
            } else {
                Some(rng.below(self.nodes))
            };
            if let Some(v) = v {
                push(v, set, &mut w);
            }
        }
        out.sort_unstable();
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
        let per_chunk = (total / (rayon::current_num_threads() as u64 * 16)).max(1 << 15);
        let mut chunks: Vec<(usize, usize, &mut [u32])> = Vec::new();
        let mut rest: &mut [u32] = &mut targets;
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
        let indptr_ref = &indptr;
        chunks.into_par_iter().for_each(|(r0, r1, buf)| {
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
                let h = (self.starts[host], self.starts[host + 1]);
                self.fill_row(u, h, &mut buf[a..b], &mut set);
            }
        });
        (indptr, targets)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params() -> CopyingParams {
        cnr2000_params()
    }

    #[test]
    fn exact_arcs_and_clean_rows() {
        let p = params();
        let m = CopyModel::new(&p, 5_000, 51_234, 7).unwrap();
        let (indptr, targets) = m.generate_rows(0, 5_000);
        assert_eq!(targets.len(), 51_234);
        for (u, w) in indptr.windows(2).enumerate() {
            let row = &targets[w[0] as usize..w[1] as usize];
            assert!(
                row.windows(2).all(|x| x[0] < x[1]),
                "row {u} not sorted/distinct"
            );
            assert!(row.iter().all(|&v| v as usize != u && v < 5_000), "row {u}");
        }
    }

    #[test]
    fn any_split_and_thread_count_gives_the_same_rows() {
        let p = params();
        let m = CopyModel::new(&p, 3_001, 30_000, 3).unwrap();
        let (ip, t) = m.generate_rows(0, 3_001);
        for cut in [1u64, 977, 1500, 3000] {
            let (ia, ta) = m.generate_rows(0, cut);
            let (ib, tb) = m.generate_rows(cut, 3_001);
            let mut joined = ta.clone();
            joined.extend_from_slice(&tb);
            assert_eq!(joined, t, "cut {cut}");
            assert_eq!(ia.len() + ib.len() - 1, ip.len());
        }
        let one = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        let (_, t1) = one.install(|| m.generate_rows(0, 3_001));
        assert_eq!(t1, t);
        let other = CopyModel::new(&p, 3_001, 30_000, 4).unwrap();
        assert_ne!(other.generate_rows(0, 3_001).1, t);
    }

    #[test]
    fn params_round_trip_and_refuse_bad_fields() {
        let p = params();
        assert_eq!(CopyingParams::parse(&p.render(false)).unwrap(), p);
        assert_eq!(CopyingParams::parse(&p.render(true)).unwrap(), p);
        let mut bad = p.clone();
        bad.copy = 0.9;
        bad.template = 0.5;
        assert!(bad.validate().unwrap_err().contains("at most 1"));
        let text = p
            .render(false)
            .replace("version = 1", "version = 1\nbogus = 3");
        assert!(CopyingParams::parse(&text).is_err());
        assert!(CopyModel::new(&p, 10, 2, 1).is_err());
    }
}
