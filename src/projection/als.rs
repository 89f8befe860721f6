//! The iALS workload of a projection: per rank, the rows it solves, their non-zeros
//! and the distinct rows of the fixed table it needs from every other rank, for both
//! halves of an epoch; and from those, one epoch's link traffic, work and memory.
//!
//! Two sources:
//! - [`AlsModel::from_csr`]: exact, from a prepared dataset's `/train` and
//!   `/train_t/indptr`, sharded exactly as training shards it (rows and columns
//!   balanced by non-zeros, `als::shard::bounds::balance_by_nnz`).
//! - [`AlsModel::from_webgraph`]: expected values under the synthetic generator's
//!   degree model (`data::webgraph_gen`), for sizes that cannot be built here. Row and
//!   column shards are taken as equal node ranges (the generator spreads popular nodes
//!   over the whole id space, so nnz-balanced ranges are nearly equal ones); a shard's
//!   intra-host links point into its own range, so they are fetched locally and only
//!   the global links cross ranks. A row shard with `G / P` global arcs, each drawn
//!   from the popularity law `pi`, references `sum_r 1 - exp(-(G / P) pi_r)` distinct
//!   targets; a column shard's `G / P` global in-arcs come from sources weighted by
//!   their global out-degree `k_g`, so it references `sum_u 1 - exp(-k_g(u) / P)`
//!   distinct sources (`k_g` from the generator's own degree draws on a sample of
//!   nodes). Both spread evenly over the owners. `project` prints the model's totals
//!   beside the exact ones for a generated graph that fits (scripts/bench_torus.sh).

use super::traffic::{self, Traffic};
use crate::als::shard::bounds::balance_by_nnz;
use crate::als::ExchangeKind;
use crate::data::graph::webgraph_gen::{generate_degrees, HostLayout, WebGraphSpec};

/// What every rank does in one epoch, by half (0: the row table W is solved against
/// the column table H; 1: H against W).
#[derive(Debug, Clone)]
pub struct AlsModel {
    /// Where the numbers come from (a file, or a preset under the degree model).
    pub source: String,
    /// Exact (from data) or expected (degree model).
    pub exact: bool,
    pub rows: u64,
    pub cols: u64,
    pub nnz: u64,
    pub ranks: usize,
    /// Per half, per rank: rows solved.
    pub solved: [Vec<u64>; 2],
    /// Per half, per rank: non-zeros of the solved rows.
    pub nnz_of: [Vec<u64>; 2],
    /// Per half, `P x P` row-major: distinct fixed-table rows rank `p` needs from `q`.
    pub need: [Vec<u64>; 2],
}

/// The settings of the run being projected.
#[derive(Debug, Clone, Copy)]
pub struct AlsParams {
    pub dim: usize,
    /// Bytes of a table element (4: f32, 2: bf16).
    pub elem: u64,
    pub exchange: ExchangeKind,
    pub cg_steps: usize,
    pub step_nnz: u64,
    /// Bytes a rank sends in one round of the dedup fetch (`als::shard::exchange::round_bytes`).
    pub round_bytes: u64,
}

/// One epoch on one torus shape.
#[derive(Debug, Clone)]
pub struct EpochProjection {
    pub dims: Vec<usize>,
    /// Per phase, the traffic of one epoch (`exchange`, `gramian`, `loss`, `status`).
    pub phases: Vec<(&'static str, Traffic)>,
    /// Once per run: the exchange plans.
    pub setup: Vec<(&'static str, Traffic)>,
    /// The busiest rank's floating-point operations per epoch.
    pub flops: f64,
    /// The busiest rank's bytes of fixed-table rows read by the solves per epoch
    /// (each CG step and the right-hand side read one row per non-zero).
    pub gather_bytes: f64,
    /// The largest rank's resident bytes while training.
    pub memory: u64,
}

impl EpochProjection {
    pub fn phase(&self, name: &str) -> Option<&Traffic> {
        self.phases
            .iter()
            .chain(&self.setup)
            .find(|(n, _)| *n == name)
            .map(|(_, t)| t)
    }

    /// All of one epoch's traffic.
    pub fn epoch_traffic(&self) -> Traffic {
        let mut t = Traffic::new(&self.dims);
        for (_, p) in &self.phases {
            t.add(p);
        }
        t
    }
}

impl AlsModel {
    /// Exact, from the training CSR (`indptr`, `indices`: rows -> columns) and the
    /// transpose's `indptr` (column degrees), at `p` ranks.
    pub fn from_csr(
        source: &str,
        indptr: &[u64],
        indices: &[u32],
        col_indptr: &[u64],
        p: usize,
    ) -> Self {
        let rows = (indptr.len() - 1) as u64;
        let cols = (col_indptr.len() - 1) as u64;
        let rb = balance_by_nnz(indptr, p);
        let cb = balance_by_nnz(col_indptr, p);
        let col_owner: Vec<u32> = {
            let mut o = vec![0u32; cols as usize];
            for q in 0..p {
                for c in cb[q]..cb[q + 1] {
                    o[c as usize] = q as u32;
                }
            }
            o
        };
        let mut need0 = vec![0u64; p * p];
        let mut need1 = vec![0u64; p * p];
        let mut seen = vec![u32::MAX; cols as usize];
        for (pr, w) in rb.windows(2).enumerate() {
            for u in w[0]..w[1] {
                let row = &indices[indptr[u as usize] as usize..indptr[u as usize + 1] as usize];
                let mut last_owner = u32::MAX;
                for &c in row {
                    let q = col_owner[c as usize];
                    if seen[c as usize] != pr as u32 {
                        seen[c as usize] = pr as u32;
                        need0[pr * p + q as usize] += 1;
                    }
                    // Targets are sorted, so their owners are non-decreasing: each
                    // column shard this row reaches needs the row once.
                    if q != last_owner {
                        last_owner = q;
                        need1[q as usize * p + pr] += 1;
                    }
                }
            }
        }
        let part = |ip: &[u64], b: &[u64]| -> (Vec<u64>, Vec<u64>) {
            b.windows(2)
                .map(|w| (w[1] - w[0], ip[w[1] as usize] - ip[w[0] as usize]))
                .unzip()
        };
        let (s0, n0) = part(indptr, &rb);
        let (s1, n1) = part(col_indptr, &cb);
        AlsModel {
            source: source.to_string(),
            exact: true,
            rows,
            cols,
            nnz: indptr[rows as usize],
            ranks: p,
            solved: [s0, s1],
            nnz_of: [n0, n1],
            need: [need0, need1],
        }
    }

    /// Expected values under the generator's degree model (see the module doc), at
    /// `p` ranks, from a [`DegreeSample`] of the same spec and seed.
    pub fn from_webgraph(
        source: &str,
        spec: &WebGraphSpec,
        sample: &DegreeSample,
        p: usize,
    ) -> Self {
        let (n, arcs) = (spec.nodes, spec.arcs);
        let g_total = sample.mean_global() * n as f64;
        // Rows side: distinct popular targets of G / P global arcs.
        let targets = distinct_zipf(n, spec.zipf_exponent, g_total / p as f64);
        // Columns side: distinct sources of G / P global in-arcs.
        let sources = sample.reach(p) * n as f64;
        let even = |total: u64, r: usize| -> Vec<u64> {
            (0..r)
                .map(|i| total * (i as u64 + 1) / r as u64 - total * i as u64 / r as u64)
                .collect()
        };
        let solved = even(n, p);
        let nnz_of = even(arcs, p);
        let need = |distinct: f64| -> Vec<u64> {
            let per = (distinct / p as f64).round() as u64;
            let mut m = vec![per; p * p];
            for r in 0..p {
                // Locally: its own share of the global targets and its intra-host
                // targets, at most its whole range (an upper bound, for memory).
                m[r * p + r] = solved[r];
            }
            m
        };
        AlsModel {
            source: source.to_string(),
            exact: false,
            rows: n,
            cols: n,
            nnz: arcs,
            ranks: p,
            solved: [solved.clone(), solved.clone()],
            nnz_of: [nnz_of.clone(), nnz_of],
            need: [need(targets), need(sources)],
        }
    }

    fn need(&self, half: usize, p: usize, q: usize) -> u64 {
        self.need[half][p * self.ranks + q]
    }

    /// Distinct rows one epoch sends to other ranks (both halves, all ranks).
    pub fn rows_sent(&self) -> u64 {
        let p = self.ranks;
        (0..2)
            .map(|h| {
                (0..p * p)
                    .filter(|i| i / p != i % p)
                    .map(|i| self.need[h][i])
                    .sum::<u64>()
            })
            .sum()
    }

    /// One epoch on torus `dims` (whose product must be the model's rank count).
    pub fn project(&self, dims: &[usize], a: &AlsParams) -> EpochProjection {
        let p = self.ranks;
        assert_eq!(
            dims.iter().product::<usize>(),
            p,
            "shape and model disagree"
        );
        let d = a.dim as u64;
        let mut exchange = Traffic::new(dims);
        let mut setup = Traffic::new(dims);
        let mut gramian = Traffic::new(dims);
        if p > 1 {
            for half in 0..2 {
                match a.exchange {
                    ExchangeKind::Dedup => {
                        // The plan: each rank sends the ids it needs to their owners.
                        setup.add(&traffic::all_to_all(dims, &|s, t| {
                            4 * self.need(half, s, t)
                        }));
                        let per_rank = (a.round_bytes as usize / (p - 1)).max(1) as u64;
                        let chunk = (per_rank / (d * a.elem).max(1)).max(1);
                        let rounds = (0..p)
                            .flat_map(|me| (0..p).filter(move |&r| r != me).map(move |r| (me, r)))
                            .map(|(me, r)| {
                                self.need(half, r, me)
                                    .max(self.need(half, me, r))
                                    .div_ceil(chunk)
                            })
                            .max()
                            .unwrap_or(0);
                        exchange.add(&traffic::all_reduce_max(dims));
                        for k in 0..rounds {
                            let part = |total: u64| total.saturating_sub(k * chunk).min(chunk);
                            exchange.add(&traffic::all_to_all(dims, &|owner, needer| {
                                part(self.need(half, needer, owner)) * d * a.elem
                            }));
                        }
                    }
                    ExchangeKind::Allgather => {
                        let needed = |r: usize| (0..p).map(|q| self.need(half, r, q)).sum::<u64>();
                        exchange.add(&traffic::all_gather(dims, &needed, 4));
                        let total: u64 = (0..p).map(needed).sum();
                        exchange.add(&traffic::all_reduce(dims, (total * d) as usize, 4));
                    }
                }
            }
            let g = traffic::all_reduce(dims, (d * d) as usize, 8);
            gramian.add(&g.times(2));
        }
        let loss = if p > 1 {
            traffic::all_reduce(dims, 2, 8)
        } else {
            Traffic::new(dims)
        };
        // One agreement (a u64 maximum) per step, `step_nnz` non-zeros a step.
        let steps = self.nnz.div_ceil(a.step_nnz.max(1)).clamp(1, 4096);
        let status = if p > 1 {
            traffic::all_reduce_max(dims).times(2 * steps)
        } else {
            Traffic::new(dims)
        };
        let flops = (0..p)
            .map(|r| {
                (0..2)
                    .map(|h| {
                        let (n, e) = (self.solved[h][r] as f64, self.nnz_of[h][r] as f64);
                        let df = d as f64;
                        (a.cg_steps as f64 + 1.0) * (2.0 * df * df * n + 4.0 * df * e)
                            + 2.0 * df * df * n
                    })
                    .sum::<f64>()
            })
            .fold(0.0, f64::max);
        let gather_bytes = (0..p)
            .map(|r| {
                (0..2)
                    .map(|h| (a.cg_steps as f64 + 1.0) * self.nnz_of[h][r] as f64)
                    .sum::<f64>()
                    * (d * a.elem) as f64
            })
            .fold(0.0, f64::max);
        EpochProjection {
            gather_bytes,
            dims: dims.to_vec(),
            phases: vec![
                ("exchange", exchange),
                ("gramian", gramian),
                ("loss", loss),
                ("status", status),
            ],
            setup: vec![("plan", setup)],
            flops,
            memory: (0..p).map(|r| self.memory(r, a)).max().unwrap_or(0),
        }
    }

    /// Resident bytes of rank `r`: both table shards, both CSR shards with their row
    /// counts, the exchange plans, the larger half's gathered rows and one round's
    /// send buffer (ALX's scheme: its dense sum buffer of every rank's ids).
    pub fn memory(&self, r: usize, a: &AlsParams) -> u64 {
        let p = self.ranks;
        let d = a.dim as u64;
        let mut m = 0u64;
        for h in 0..2 {
            m += self.solved[h][r] * d * a.elem; // table shard
            m += self.nnz_of[h][r] * 4 + (self.solved[h][r] + 1) * 8 + self.solved[h][r] * 4;
            let needed: u64 = (0..p).map(|q| self.need(h, r, q)).sum();
            let served: u64 = (0..p).map(|q| self.need(h, q, r)).sum();
            m += 4 * (needed + served);
        }
        let gathered = (0..2)
            .map(|h| {
                let needed: u64 = (0..p).map(|q| self.need(h, r, q)).sum();
                match a.exchange {
                    ExchangeKind::Dedup => {
                        let served: u64 =
                            (0..p).filter(|&q| q != r).map(|q| self.need(h, q, r)).sum();
                        needed * d * a.elem + (served * d * a.elem).min(a.round_bytes)
                    }
                    ExchangeKind::Allgather => {
                        let all: u64 = (0..p * p).map(|i| self.need[h][i]).sum();
                        all * d * 4 + needed * d * a.elem
                    }
                }
            })
            .max()
            .unwrap_or(0);
        m + if p > 1 { gathered } else { 0 }
    }
}

/// The global out-degrees (links outside the node's host) of a deterministic sample
/// of nodes: 64 blocks of 2048 consecutive ids spread over the id space, from the
/// generator's own degree draws and host layout.
#[derive(Debug, Clone)]
pub struct DegreeSample {
    pub global: Vec<f64>,
}

impl DegreeSample {
    pub fn new(spec: &WebGraphSpec, seed: u64) -> Self {
        let layout = HostLayout::new(spec, seed);
        let n = spec.nodes;
        let block = 2048u64.min(n);
        let blocks = 64u64.min(n / block).max(1);
        let mut global = Vec::new();
        for b in 0..blocks {
            let lo = if blocks > 1 {
                (n - block) * b / (blocks - 1)
            } else {
                0
            };
            let degs = generate_degrees(spec, seed, lo, lo + block);
            for (i, &k) in degs.iter().enumerate() {
                let (hs, he) = layout.host_of(lo + i as u64);
                let k = k as f64;
                let intra = (spec.intra_host * k).min((he - hs) as f64 - 1.0).max(0.0);
                global.push(k - intra);
            }
        }
        DegreeSample { global }
    }

    pub fn mean_global(&self) -> f64 {
        self.global.iter().sum::<f64>() / self.global.len().max(1) as f64
    }

    /// The mean over nodes of `1 - exp(-k_g / p)`: the chance a node is among the
    /// sources of one of `p` column shards' global in-arcs.
    pub fn reach(&self, p: usize) -> f64 {
        self.global
            .iter()
            .map(|&g| 1.0 - (-g / p as f64).exp())
            .sum::<f64>()
            / self.global.len().max(1) as f64
    }
}

/// Expected distinct ranks among `draws` independent draws of the bounded Zipf law
/// over `0..m` with exponent `s` (the generator's: the continuous density `x^-s` on
/// `[1, m + 1)`): `sum_r 1 - exp(-draws pi_r)`, exact for the first ranks and over
/// geometric buckets (ratio 1.0005) beyond.
pub fn distinct_zipf(m: u64, s: f64, draws: f64) -> f64 {
    let cdf_top = if (s - 1.0).abs() < 1e-9 {
        ((m + 1) as f64).ln()
    } else {
        (((m + 1) as f64).powf(1.0 - s) - 1.0) / (1.0 - s)
    };
    // The mass of ranks [a, b): the density's integral over [a + 1, b + 1).
    let mass = |a: f64, b: f64| -> f64 {
        if (s - 1.0).abs() < 1e-9 {
            ((b + 1.0) / (a + 1.0)).ln() / cdf_top
        } else {
            ((b + 1.0).powf(1.0 - s) - (a + 1.0).powf(1.0 - s)) / (1.0 - s) / cdf_top
        }
    };
    let exact = m.min(20_000);
    let mut total = 0.0;
    for r in 0..exact {
        total += 1.0 - (-draws * mass(r as f64, r as f64 + 1.0)).exp();
    }
    let mut a = exact as f64;
    let top = m as f64;
    while a < top {
        let b = (a * 1.0005).max(a + 1.0).min(top);
        let width = b - a;
        let per = mass(a, b) / width;
        total += width * (1.0 - (-draws * per).exp());
        a = b;
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distinct_zipf_is_bounded_by_draws_and_ranks() {
        let m = 1_000_000;
        for draws in [10.0, 1e4, 1e6, 1e8] {
            let u = distinct_zipf(m, 1.0, draws);
            assert!(u <= draws + 1e-6 && u <= m as f64 + 1e-6, "{draws}: {u}");
            assert!(u > 0.0);
        }
        // Few draws: almost all distinct. Very many: almost every rank.
        assert!(distinct_zipf(m, 1.0, 10.0) > 9.0);
        assert!(distinct_zipf(m, 1.0, 1e12) > 0.99 * m as f64);
    }

    #[test]
    fn csr_needs_count_distinct_ids_per_owner() {
        // 4 rows x 4 cols, 2 ranks.
        let indptr = [0u64, 2, 4, 5, 6];
        let indices = [0u32, 3, 0, 2, 3, 1];
        // Column degrees: 0:2, 1:1, 2:1, 3:2.
        let col_ip = [0u64, 2, 3, 4, 6];
        let m = AlsModel::from_csr("t", &indptr, &indices, &col_ip, 2);
        // Rows 0-1 (rank 0) need columns {0, 2, 3}; rows 2-3 need {3, 1}.
        let cb = balance_by_nnz(&col_ip, 2);
        assert_eq!(cb, vec![0, 2, 4]);
        assert_eq!(m.need[0], vec![1, 2, 1, 1]);
        // Column shard 0 (cols 0, 1) is reached by rows 0, 1 (rank 0) and 3 (rank 1).
        // Column shard 1 (cols 2, 3) by rows 0, 1 (rank 0) and 2 (rank 1).
        assert_eq!(m.need[1], vec![2, 1, 2, 1]);
        assert_eq!(m.solved[0], vec![2, 2]);
        assert_eq!(m.nnz_of[1], vec![3, 3]);
        assert_eq!(m.rows_sent(), (2 + 1) + (1 + 2));
    }
}

/// A published measurement a projection answers to.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Anchor {
    /// The WebGraph preset it is of.
    pub preset: &'static str,
    pub label: &'static str,
    pub source: &'static str,
    /// The claim, as published.
    pub claim: &'static str,
    pub chip: &'static str,
    pub cores: usize,
    /// Seconds the claim gives (per epoch, or for the whole run as a bound).
    pub seconds: f64,
    pub per_epoch: bool,
}

/// ALX's published points (Mehta et al., "ALX: Large Scale Matrix Factorization on
/// TPUs", 2021): WebGraph-sparse about 20 minutes per epoch on 256 TPU v3 cores;
/// WebGraph-dense in less than a day on 8 cores.
pub const ANCHORS: [Anchor; 2] = [
    Anchor {
        preset: "sparse",
        label: "WebGraph-sparse",
        source: "ALX, Mehta et al. 2021",
        claim: "about 20 min per epoch",
        chip: "TPU v3",
        cores: 256,
        seconds: 1200.0,
        per_epoch: true,
    },
    Anchor {
        preset: "dense",
        label: "WebGraph-dense",
        source: "ALX, Mehta et al. 2021",
        claim: "trained in less than a day",
        chip: "TPU v3",
        cores: 8,
        seconds: 86400.0,
        per_epoch: false,
    },
];
