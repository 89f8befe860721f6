//! The synthetic click log: a deterministic function of `(seed, example index)`,
//! mirroring the TorchRec peer's workload (`bench/peers/torchrec_peer.py`).
//!
//! Example `e` is drawn from one generator, `SplitMix64::for_id(seed, stream::CLICKS, e)`,
//! in this fixed order:
//!
//! 1. `n_dense` dense features, each `N(0, 1)` ([`SplitMix64::next_normal`], stored as f32);
//! 2. for each table `t` in spec order: the bag length `L` (nothing is drawn for
//!    [`ValencyDist::Fixed`], `L = round(valency)`; for [`ValencyDist::Poisson`],
//!    `L = 1 + Poisson(valency - 1)` by [`Poisson::sample`]), then `L` Zipf ranks
//!    `r` in `0..vocab` ([`Zipf::sample`], `P(r) ∝ (r + 1)^-zipf`, rank 0 most
//!    frequent), each scattered to the id `(r * 1000003 + 12345) mod vocab`;
//! 3. the label: one uniform `u`, label `1.0` if `u < sigmoid(logit)`, else `0.0`.
//!
//! The planted logit is `sum_j dense_j w_j + sum_t mean_{id in bag t} h_t[id] + b`
//! (summed in that order, in f64, from the stored f32 dense values), with
//! `h_t[id] = N(0, 1)` drawn from `(seed, stream::PLANTED, (t << 40) ^ id)` (no
//! per-table memory), `w_j = 0.3 N(0, 1)` drawn from
//! `(seed, stream::PLANTED, 2^63 | j)` and `b = -1`. The pool is the mean over the
//! bag whatever the table's [`Pooling`](super::spec::Pooling), as the peer does.
//!
//! Nothing depends on how a range of examples is cut or on the rayon thread count.

use rayon::prelude::*;

use super::spec::{ModelSpec, ValencyDist};
use crate::allocs::reserve_with_room as reserve_total;
use crate::rng::{stream, SplitMix64};

/// Ranks are scattered over a table by `id = (r * SCATTER_MUL + SCATTER_ADD) mod vocab`.
pub const SCATTER_MUL: u64 = 1_000_003;
pub const SCATTER_ADD: u64 = 12_345;
/// Bias of the planted logistic model.
pub const PLANTED_BIAS: f64 = -1.0;
/// Standard deviation of the planted dense weights.
pub const PLANTED_DENSE_SD: f64 = 0.3;
/// Marks the planted dense weights' ids in `stream::PLANTED` (table keys `t << 40 ^ id`
/// never set bit 63).
const DENSE_WEIGHT_KEY: u64 = 1 << 63;
/// Examples per rayon task.
const CHUNK: usize = 256;

/// One feature's bags: example e has ids[offsets[e]..offsets[e+1]]. Rows of a table
/// are `u32` ids; the raw 64-bit feature ids of a hash-table vocabulary are
/// [`KeyBags`] until they are resolved to rows.
#[derive(Clone, Debug, PartialEq)]
pub struct Bags<I = u32> {
    pub offsets: Vec<u32>,
    pub ids: Vec<I>,
}

/// Bags of raw 64-bit feature ids (keys of a hash-table vocabulary).
pub type KeyBags = Bags<u64>;

impl<I> Default for Bags<I> {
    fn default() -> Self {
        Bags {
            offsets: Vec::new(),
            ids: Vec::new(),
        }
    }
}

impl<I: Copy> Bags<I> {
    /// Examples held (`offsets.len() - 1`; 0 for a default value).
    pub fn len(&self) -> usize {
        self.offsets.len().saturating_sub(1)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The ids of example `e`.
    pub fn bag(&self, e: usize) -> &[I] {
        &self.ids[self.offsets[e] as usize..self.offsets[e + 1] as usize]
    }

    /// No examples (one offset), keeping the buffers.
    fn clear(&mut self) {
        self.offsets.clear();
        self.offsets.push(0);
        self.ids.clear();
    }

    /// Make room for `others` appended.
    fn reserve_for<'a>(&mut self, others: impl Iterator<Item = &'a Bags<I>> + Clone)
    where
        I: 'a,
    {
        let (no, ni) = (self.offsets.len(), self.ids.len());
        reserve_total(
            &mut self.offsets,
            no + others.clone().map(|b| b.offsets.len()).sum::<usize>(),
        );
        reserve_total(
            &mut self.ids,
            ni + others.map(|b| b.ids.len()).sum::<usize>(),
        );
    }

    /// Append `other`'s bags (an empty `other`, without offsets, appends nothing).
    fn append(&mut self, other: &Bags<I>) {
        if other.offsets.is_empty() {
            return;
        }
        if self.offsets.is_empty() {
            self.offsets.push(0);
        }
        let base = self.ids.len();
        let first = other.offsets.first().copied().unwrap_or(0) as usize;
        let last = other.offsets.last().copied().unwrap_or(0) as usize;
        let no = self.offsets.len();
        reserve_total(&mut self.offsets, no + other.offsets.len());
        reserve_total(&mut self.ids, base + (last - first));
        self.offsets.extend(
            other
                .offsets
                .iter()
                .skip(1)
                .map(|&o| to_u32_offset(base + (o as usize - first))),
        );
        self.ids.extend_from_slice(&other.ids[first..last]);
    }

    /// Examples `lo..hi` (offsets start at 0); an empty `self` gives an empty value.
    fn slice(&self, lo: usize, hi: usize) -> Bags<I> {
        if self.offsets.is_empty() {
            return Bags::default();
        }
        let (a, z) = (self.offsets[lo], self.offsets[hi]);
        Bags {
            offsets: self.offsets[lo..=hi].iter().map(|&o| o - a).collect(),
            ids: self.ids[a as usize..z as usize].to_vec(),
        }
    }
}

/// Examples in columnar form.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Batch {
    pub n: usize,
    pub n_dense: usize,
    /// `n * n_dense`, row-major.
    pub dense: Vec<f32>,
    /// 0.0 or 1.0.
    pub labels: Vec<f32>,
    /// One per table: the rows looked up (for a hash-table vocabulary, filled when
    /// the step's keys are resolved to rows).
    pub bags: Vec<Bags>,
    /// The raw 64-bit ids of the tables with a hash-table vocabulary, one per table
    /// (default, without offsets, for every other table); empty when no table has one.
    pub keys: Vec<KeyBags>,
}

fn to_u32_offset(x: usize) -> u32 {
    u32::try_from(x).expect("more than u32::MAX ids of one table in one batch")
}

impl Batch {
    /// No examples, shaped for `spec`.
    pub fn empty(spec: &ModelSpec) -> Batch {
        Batch {
            n: 0,
            n_dense: spec.n_dense,
            dense: Vec::new(),
            labels: Vec::new(),
            bags: vec![
                Bags {
                    offsets: vec![0],
                    ids: Vec::new(),
                };
                spec.tables.len()
            ],
            keys: Vec::new(),
        }
    }

    /// No examples, keeping the shape and the buffers.
    pub fn clear(&mut self) {
        self.n = 0;
        self.dense.clear();
        self.labels.clear();
        for b in &mut self.bags {
            b.clear();
        }
        for k in &mut self.keys {
            if !k.offsets.is_empty() {
                k.clear();
            }
        }
    }

    /// Make room for `others` appended after this batch's examples.
    pub fn reserve_for(&mut self, others: &[&Batch]) {
        let (nd, nl) = (self.dense.len(), self.labels.len());
        reserve_total(
            &mut self.dense,
            nd + others.iter().map(|b| b.dense.len()).sum::<usize>(),
        );
        reserve_total(
            &mut self.labels,
            nl + others.iter().map(|b| b.labels.len()).sum::<usize>(),
        );
        for (t, mine) in self.bags.iter_mut().enumerate() {
            mine.reserve_for(others.iter().filter_map(|b| b.bags.get(t)));
        }
        for (t, mine) in self.keys.iter_mut().enumerate() {
            mine.reserve_for(others.iter().filter_map(|b| b.keys.get(t)));
        }
    }

    /// Append `other`'s examples after this batch's. A default (shapeless) batch
    /// takes `other`'s shape.
    ///
    /// Panics if the shapes differ or one table's ids would exceed `u32::MAX`.
    pub fn append(&mut self, other: &Batch) {
        if self.n == 0 && self.bags.is_empty() && self.dense.is_empty() {
            self.n_dense = other.n_dense;
            self.bags = vec![Bags::default(); other.bags.len()];
        }
        assert_eq!(self.n_dense, other.n_dense, "appending batches: n_dense");
        assert_eq!(
            self.bags.len(),
            other.bags.len(),
            "appending batches: table count"
        );
        self.n += other.n;
        let (nd, nl) = (self.dense.len(), self.labels.len());
        reserve_total(&mut self.dense, nd + other.dense.len());
        reserve_total(&mut self.labels, nl + other.labels.len());
        self.dense.extend_from_slice(&other.dense);
        self.labels.extend_from_slice(&other.labels);
        for (mine, theirs) in self.bags.iter_mut().zip(&other.bags) {
            if mine.offsets.is_empty() {
                mine.offsets.push(0);
            }
            mine.append(theirs);
        }
        if self.keys.len() < other.keys.len() {
            self.keys.resize_with(other.keys.len(), Bags::default);
        }
        for (mine, theirs) in self.keys.iter_mut().zip(&other.keys) {
            mine.append(theirs);
        }
    }

    /// Examples `lo..hi` as a batch of their own (offsets start at 0).
    pub fn slice(&self, lo: usize, hi: usize) -> Batch {
        assert!(lo <= hi && hi <= self.n, "slice {lo}..{hi} of {}", self.n);
        let nd = self.n_dense;
        Batch {
            n: hi - lo,
            n_dense: nd,
            dense: self.dense[lo * nd..hi * nd].to_vec(),
            labels: self.labels[lo..hi].to_vec(),
            bags: self.bags.iter().map(|b| b.slice(lo, hi)).collect(),
            keys: self.keys.iter().map(|k| k.slice(lo, hi)).collect(),
        }
    }

    /// Ids over all tables and examples.
    pub fn ids_total(&self) -> usize {
        self.bags.iter().map(|b| b.ids.len()).sum()
    }
}

/// The planted model's hidden weight `h_t[id]` (standard normal).
#[inline]
pub fn planted_id_weight(seed: u64, table: usize, id: u32) -> f64 {
    SplitMix64::for_id(seed, stream::PLANTED, ((table as u64) << 40) ^ id as u64).next_normal()
}

/// The planted model's weight of dense feature `j` (`N(0, 0.3^2)`).
pub fn planted_dense_weight(seed: u64, j: usize) -> f64 {
    PLANTED_DENSE_SD
        * SplitMix64::for_id(seed, stream::PLANTED, DENSE_WEIGHT_KEY | j as u64).next_normal()
}

/// Scatter a popularity rank over a table of `vocab` rows.
#[inline]
pub fn scatter(rank: u64, vocab: u64) -> u64 {
    (rank * SCATTER_MUL + SCATTER_ADD) % vocab
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

// ---------------------------------------------------------------------------------
// Zipf

/// The bounded Zipf law over ranks `0..n`, `P(r) ∝ (r + 1)^-s`, sampled exactly in
/// O(1) expected time by rejection-inversion (Hörmann & Derflinger 1996, "Rejection-
/// inversion to generate variates from monotone discrete distributions"; the same
/// scheme as Apache Commons RNG's `RejectionInversionZipfSampler` and
/// `rand_distr::Zipf`). Works for any `s > 0`, including `s == 1` and `s` near 1
/// (through `log1p`/`expm1` helpers), and `n` up to 2^53.
#[derive(Clone, Copy, Debug)]
pub struct Zipf {
    n: f64,
    s: f64,
    /// `H(1.5) - h(1)`.
    h_x1: f64,
    /// `H(n + 0.5)`.
    h_n: f64,
    /// Squeeze: accept `k` at once when `k - x <= sv`.
    sv: f64,
}

/// `log1p(x) / x`, continuous at 0.
fn helper1(x: f64) -> f64 {
    if x.abs() > 1e-8 {
        x.ln_1p() / x
    } else {
        1.0 - x * (0.5 - x * (1.0 / 3.0 - 0.25 * x))
    }
}

/// `expm1(x) / x`, continuous at 0.
fn helper2(x: f64) -> f64 {
    if x.abs() > 1e-8 {
        x.exp_m1() / x
    } else {
        1.0 + x * 0.5 * (1.0 + x * (1.0 / 3.0) * (1.0 + 0.25 * x))
    }
}

impl Zipf {
    /// Panics unless `n >= 1` and `s > 0` (the spec validates both).
    pub fn new(n: u64, s: f64) -> Zipf {
        assert!(n >= 1, "Zipf over an empty range");
        assert!(s.is_finite() && s > 0.0, "Zipf exponent {s}");
        let mut z = Zipf {
            n: n as f64,
            s,
            h_x1: 0.0,
            h_n: 0.0,
            sv: 0.0,
        };
        z.h_x1 = z.h_integral(1.5) - 1.0;
        z.h_n = z.h_integral(n as f64 + 0.5);
        z.sv = 2.0 - z.h_integral_inv(z.h_integral(2.5) - z.h(2.0));
        z
    }

    /// `h(x) = x^-s`.
    #[inline]
    fn h(&self, x: f64) -> f64 {
        (-self.s * x.ln()).exp()
    }

    /// `H(x) = (x^(1-s) - 1) / (1 - s)` (`ln x` at `s == 1`), a primitive of `h`.
    #[inline]
    fn h_integral(&self, x: f64) -> f64 {
        let lx = x.ln();
        helper2((1.0 - self.s) * lx) * lx
    }

    /// The inverse of `H`.
    #[inline]
    fn h_integral_inv(&self, x: f64) -> f64 {
        let t = (x * (1.0 - self.s)).max(-1.0);
        (helper1(t) * x).exp()
    }

    /// A rank in `0..n`.
    #[inline]
    pub fn sample(&self, rng: &mut SplitMix64) -> u64 {
        loop {
            let u = self.h_n + rng.next_f64() * (self.h_x1 - self.h_n);
            let x = self.h_integral_inv(u);
            let k = (x + 0.5).floor();
            // Also maps a NaN (impossible for valid parameters) to rank 0.
            let k = if k >= 1.0 { k.min(self.n) } else { 1.0 };
            if k - x <= self.sv || u >= self.h_integral(k + 0.5) - self.h(k) {
                return k as u64 - 1;
            }
        }
    }
}

// ---------------------------------------------------------------------------------
// Poisson

/// The Poisson law with mean `mu`, sampled exactly: sequential inversion for
/// `mu < 10`, Hörmann's transformed rejection with squeeze (PTRS, "The transformed
/// rejection method for generating Poisson random variables", 1993; as in NumPy)
/// for larger means.
#[derive(Clone, Copy, Debug)]
pub struct Poisson {
    mu: f64,
    kind: PoissonKind,
}

#[derive(Clone, Copy, Debug)]
enum PoissonKind {
    Zero,
    Inversion {
        p0: f64,
    },
    Ptrs {
        ln_mu: f64,
        a: f64,
        b: f64,
        ln_inv_alpha: f64,
        vr: f64,
    },
}

/// Means from here on use PTRS.
const PTRS_MIN_MEAN: f64 = 10.0;

/// `ln Γ(x)` for `x >= 1` (Stirling series, shifted up to 7 for small `x`; NumPy's
/// `random_loggam`).
fn ln_gamma(x: f64) -> f64 {
    const A: [f64; 10] = [
        8.333333333333333e-02,
        -2.777777777777778e-03,
        7.936507936507937e-04,
        -5.952380952380952e-04,
        8.417508417508418e-04,
        -1.917526917526918e-03,
        6.41025641025641e-03,
        -2.955065359477124e-02,
        1.796443723688307e-01,
        -1.39243221690590e+00,
    ];
    if x == 1.0 || x == 2.0 {
        return 0.0;
    }
    let n = if x <= 7.0 { (7.0 - x).floor() } else { 0.0 };
    let mut x0 = x + n;
    let x2 = 1.0 / (x0 * x0);
    let mut gl0 = A[9];
    for &a in A[..9].iter().rev() {
        gl0 = gl0 * x2 + a;
    }
    let mut gl = gl0 / x0 + 0.5 * (2.0 * std::f64::consts::PI).ln() + (x0 - 0.5) * x0.ln() - x0;
    for _ in 0..n as u32 {
        gl -= (x0 - 1.0).ln();
        x0 -= 1.0;
    }
    gl
}

impl Poisson {
    /// Panics unless `mu` is finite and `>= 0`.
    pub fn new(mu: f64) -> Poisson {
        assert!(mu.is_finite() && mu >= 0.0, "Poisson mean {mu}");
        let kind = if mu == 0.0 {
            PoissonKind::Zero
        } else if mu < PTRS_MIN_MEAN {
            PoissonKind::Inversion { p0: (-mu).exp() }
        } else {
            let b = 0.931 + 2.53 * mu.sqrt();
            PoissonKind::Ptrs {
                ln_mu: mu.ln(),
                a: -0.059 + 0.02483 * b,
                b,
                ln_inv_alpha: (1.1239 + 1.1328 / (b - 3.4)).ln(),
                vr: 0.9277 - 3.6224 / (b - 2.0),
            }
        };
        Poisson { mu, kind }
    }

    pub fn mean(&self) -> f64 {
        self.mu
    }

    pub fn sample(&self, rng: &mut SplitMix64) -> u64 {
        match self.kind {
            PoissonKind::Zero => 0,
            PoissonKind::Inversion { p0 } => {
                let u = rng.next_f64();
                let (mut k, mut p, mut f) = (0u64, p0, p0);
                // Stops when the CDF passes u, or (rounding) when the terms vanish.
                while u >= f && p > 0.0 {
                    k += 1;
                    p *= self.mu / k as f64;
                    f += p;
                }
                k
            }
            PoissonKind::Ptrs {
                ln_mu,
                a,
                b,
                ln_inv_alpha,
                vr,
            } => loop {
                let u = rng.next_f64() - 0.5;
                let v = rng.next_f64();
                let us = 0.5 - u.abs();
                let k = ((2.0 * a / us + b) * u + self.mu + 0.43).floor();
                if us >= 0.07 && v <= vr {
                    return k as u64;
                }
                if k < 0.0 || (us < 0.013 && v > us) {
                    continue;
                }
                if v.ln() + ln_inv_alpha - (a / (us * us) + b).ln()
                    <= -self.mu + k * ln_mu - ln_gamma(k + 1.0)
                {
                    return k as u64;
                }
            },
        }
    }
}

// ---------------------------------------------------------------------------------
// The generator

#[derive(Clone, Copy, Debug)]
enum BagLen {
    Fixed(u64),
    /// `1 + Poisson`.
    OnePlusPoisson(Poisson),
}

#[derive(Clone, Copy, Debug)]
struct TableGen {
    vocab: u64,
    len: BagLen,
    zipf: Zipf,
}

/// Draws examples of the click log of one `(spec, seed)`.
#[derive(Clone, Debug)]
pub struct ClickGen {
    seed: u64,
    n_dense: usize,
    tables: Vec<TableGen>,
    /// Planted dense weights.
    w: Vec<f64>,
}

impl ClickGen {
    /// `spec` must be valid ([`ModelSpec::validate`]).
    pub fn new(spec: &ModelSpec, seed: u64) -> ClickGen {
        let tables = spec
            .tables
            .iter()
            .map(|t| TableGen {
                vocab: t.vocab,
                len: match t.valency_dist {
                    ValencyDist::Fixed => BagLen::Fixed((t.valency.round() as u64).max(1)),
                    ValencyDist::Poisson => {
                        BagLen::OnePlusPoisson(Poisson::new((t.valency - 1.0).max(0.0)))
                    }
                },
                zipf: Zipf::new(t.vocab, spec.zipf),
            })
            .collect();
        ClickGen {
            seed,
            n_dense: spec.n_dense,
            tables,
            w: (0..spec.n_dense)
                .map(|j| planted_dense_weight(seed, j))
                .collect(),
        }
    }

    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Examples first..first+n, in order. Deterministic: example e depends only on (seed, e), never on how the range is cut or on the thread count. Parallel with rayon over chunks.
    pub fn batch(&self, first: u64, n: usize) -> Batch {
        let chunks: Vec<Batch> = (0..n.div_ceil(CHUNK))
            .into_par_iter()
            .map(|c| {
                let lo = c * CHUNK;
                self.chunk(first + lo as u64, CHUNK.min(n - lo))
            })
            .collect();
        if chunks.len() == 1 {
            return chunks.into_iter().next().unwrap_or_default();
        }
        let mut out = self.empty();
        out.dense.reserve(n * self.n_dense);
        out.labels.reserve(n);
        for (t, b) in out.bags.iter_mut().enumerate() {
            b.offsets.reserve(n);
            b.ids
                .reserve(chunks.iter().map(|c| c.bags[t].ids.len()).sum());
        }
        for c in &chunks {
            out.append(c);
        }
        out
    }

    fn empty(&self) -> Batch {
        Batch {
            n: 0,
            n_dense: self.n_dense,
            dense: Vec::new(),
            labels: Vec::new(),
            bags: vec![
                Bags {
                    offsets: vec![0],
                    ids: Vec::new(),
                };
                self.tables.len()
            ],
            keys: Vec::new(),
        }
    }

    /// Examples `first..first + n` on this thread.
    fn chunk(&self, first: u64, n: usize) -> Batch {
        let mut b = self.empty();
        b.dense.reserve(n * self.n_dense);
        b.labels.reserve(n);
        for bag in &mut b.bags {
            bag.offsets.reserve(n);
        }
        for e in first..first + n as u64 {
            self.example(e, &mut b);
        }
        b
    }

    /// Append example `e` to `b` (draw order: module doc).
    fn example(&self, e: u64, b: &mut Batch) {
        let mut rng = SplitMix64::for_id(self.seed, stream::CLICKS, e);
        for _ in 0..self.n_dense {
            b.dense.push(rng.next_normal() as f32);
        }
        for (tg, bag) in self.tables.iter().zip(&mut b.bags) {
            let len = match tg.len {
                BagLen::Fixed(l) => l,
                BagLen::OnePlusPoisson(p) => 1 + p.sample(&mut rng),
            };
            for _ in 0..len {
                let r = tg.zipf.sample(&mut rng);
                bag.ids.push(scatter(r, tg.vocab) as u32);
            }
            bag.offsets.push(to_u32_offset(bag.ids.len()));
        }
        b.n += 1;
        b.labels.push(0.0);
        let i = b.n - 1;
        let p = sigmoid(self.planted_logit(b, i));
        b.labels[i] = if rng.next_f64() < p { 1.0 } else { 0.0 };
    }

    /// The planted model's logit of one example of a batch (for tests/diagnostics).
    pub fn planted_logit(&self, b: &Batch, e: usize) -> f64 {
        let dense = &b.dense[e * self.n_dense..(e + 1) * self.n_dense];
        let mut logit = dense
            .iter()
            .zip(&self.w)
            .map(|(&x, &w)| x as f64 * w)
            .sum::<f64>();
        for (t, bags) in b.bags.iter().enumerate() {
            let bag = bags.bag(e);
            if !bag.is_empty() {
                let s: f64 = bag
                    .iter()
                    .map(|&id| planted_id_weight(self.seed, t, id))
                    .sum();
                logit += s / bag.len() as f64;
            }
        }
        logit + PLANTED_BIAS
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::embed::spec::{preset, Evict, Pooling, TableSpec, VocabKind};

    fn exact_zipf_pmf(n: usize, s: f64) -> Vec<f64> {
        let w: Vec<f64> = (0..n).map(|r| (r as f64 + 1.0).powf(-s)).collect();
        let z: f64 = w.iter().sum();
        w.iter().map(|x| x / z).collect()
    }

    /// Pearson's statistic over cells with expected count >= 5 (the rest pooled);
    /// returns (statistic, degrees of freedom).
    fn chi_square(counts: &[u64], pmf: &[f64], samples: u64) -> (f64, usize) {
        let (mut stat, mut cells) = (0.0, 0usize);
        let (mut obs_rest, mut exp_rest) = (0.0, 0.0);
        for (&c, &p) in counts.iter().zip(pmf) {
            let e = p * samples as f64;
            if e >= 5.0 {
                stat += (c as f64 - e).powi(2) / e;
                cells += 1;
            } else {
                obs_rest += c as f64;
                exp_rest += e;
            }
        }
        if exp_rest > 0.0 {
            stat += (obs_rest - exp_rest).powi(2) / exp_rest.max(1e-300);
            cells += 1;
        }
        (stat, cells - 1)
    }

    /// A loose upper quantile of chi-square with `df` degrees of freedom (far beyond
    /// p = 1e-6 for the sizes used here).
    fn chi_bound(df: usize) -> f64 {
        let df = df as f64;
        df + 7.0 * (2.0 * df).sqrt() + 20.0
    }

    #[test]
    fn zipf_matches_the_exact_pmf() {
        let samples = 400_000u64;
        for (i, &s) in [0.5, 1.0, 1.0 + 1e-10, 1.0 - 1e-7, 1.05, 2.0]
            .iter()
            .enumerate()
        {
            for n in [2usize, 13, 200] {
                let z = Zipf::new(n as u64, s);
                let mut rng = SplitMix64::new(100 + i as u64 * 7 + n as u64);
                let mut counts = vec![0u64; n];
                for _ in 0..samples {
                    let r = z.sample(&mut rng);
                    assert!(r < n as u64);
                    counts[r as usize] += 1;
                }
                let (stat, df) = chi_square(&counts, &exact_zipf_pmf(n, s), samples);
                assert!(
                    stat < chi_bound(df),
                    "s={s} n={n}: chi2 {stat:.1} with {df} df"
                );
            }
        }
    }

    #[test]
    fn zipf_edge_cases() {
        // vocab = 1: always rank 0.
        for s in [0.5, 1.0, 1.05, 3.0] {
            let z = Zipf::new(1, s);
            let mut rng = SplitMix64::new(1);
            assert!((0..1000).all(|_| z.sample(&mut rng) == 0));
        }
        // The largest vocabulary: ranks stay below it, and rank 0 has its mass.
        let n = crate::embed::spec::MAX_VOCAB;
        for s in [0.5, 1.0, 1.05, 2.0] {
            let z = Zipf::new(n, s);
            let mut rng = SplitMix64::new(2);
            let m = 200_000;
            let mut zeros = 0;
            let mut max = 0;
            for _ in 0..m {
                let r = z.sample(&mut rng);
                assert!(r < n);
                zeros += (r == 0) as u64;
                max = max.max(r);
            }
            if s == 2.0 {
                // P(0) = 1 / zeta(2) = 0.6079...
                let p = zeros as f64 / m as f64;
                assert!(
                    (p - 6.0 / std::f64::consts::PI.powi(2)).abs() < 0.005,
                    "{p}"
                );
            }
            if s <= 1.0 {
                assert!(max > n / 1000, "s={s}: max rank {max}");
            }
        }
    }

    #[test]
    fn ln_gamma_matches_factorials() {
        let mut f = 0.0f64;
        for k in 1..200u32 {
            f += (k as f64).ln();
            let g = ln_gamma(k as f64 + 1.0);
            assert!((g - f).abs() < 1e-9 * f.max(1.0), "k={k}: {g} vs {f}");
        }
    }

    #[test]
    fn poisson_moments() {
        for (i, &mu) in [0.5, 3.0, 9.99, 10.0, 40.0, 500.0, 9999.0]
            .iter()
            .enumerate()
        {
            let p = Poisson::new(mu);
            let mut rng = SplitMix64::new(40 + i as u64);
            let n = 200_000;
            let xs: Vec<f64> = (0..n).map(|_| p.sample(&mut rng) as f64).collect();
            let mean = xs.iter().sum::<f64>() / n as f64;
            let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
            let se = (mu / n as f64).sqrt();
            assert!((mean - mu).abs() < 5.0 * se, "mu={mu}: mean {mean}");
            assert!((var / mu - 1.0).abs() < 0.03, "mu={mu}: var {var}");
        }
        let mut rng = SplitMix64::new(1);
        assert!((0..100).all(|_| Poisson::new(0.0).sample(&mut rng) == 0));
    }

    #[test]
    fn poisson_matches_the_exact_pmf() {
        for &mu in &[0.5, 3.0, 12.0, 40.0, 500.0] {
            let p = Poisson::new(mu);
            let mut rng = SplitMix64::new(mu.to_bits());
            let samples = 400_000u64;
            let top = (mu + 12.0 * mu.sqrt() + 20.0) as usize;
            let mut counts = vec![0u64; top + 1];
            for _ in 0..samples {
                let k = (p.sample(&mut rng) as usize).min(top);
                counts[k] += 1;
            }
            let pmf: Vec<f64> = (0..=top)
                .map(|k| (k as f64 * mu.ln() - mu - ln_gamma(k as f64 + 1.0)).exp())
                .collect();
            let (stat, df) = chi_square(&counts, &pmf, samples);
            assert!(stat < chi_bound(df), "mu={mu}: chi2 {stat:.1} with {df} df");
        }
    }

    fn tiny() -> ModelSpec {
        preset("tiny", 1.0).unwrap()
    }

    #[test]
    fn batches_do_not_depend_on_cuts_or_threads() {
        let spec = tiny();
        let g = ClickGen::new(&spec, 5);
        let whole = g.batch(0, 1000);
        assert_eq!(whole.n, 1000);
        let mut cut = g.batch(0, 37);
        cut.append(&g.batch(37, 63));
        cut.append(&g.batch(100, 900));
        assert_eq!(cut, whole);
        assert_eq!(g.batch(0, 100), whole.slice(0, 100));
        assert_eq!(g.batch(300, 517), whole.slice(300, 817));
        let mut from_empty = Batch::empty(&spec);
        from_empty.append(&whole.slice(0, 500));
        from_empty.append(&whole.slice(500, 500));
        let mut from_default = Batch::default();
        from_default.append(&from_empty);
        from_default.append(&whole.slice(500, 1000));
        assert_eq!(from_default, whole);
        assert_eq!(g.batch(10, 0), Batch::empty(&spec));

        let on = |threads| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap()
                .install(|| g.batch(123, 1000))
        };
        let one = on(1);
        assert_eq!(one, on(2));
        assert_eq!(one, g.batch(123, 1000));

        // Another seed gives another log.
        assert_ne!(ClickGen::new(&spec, 6).batch(0, 100), whole.slice(0, 100));
    }

    #[test]
    fn batches_have_consistent_shapes_and_ids_in_range() {
        let spec = tiny();
        let b = ClickGen::new(&spec, 1).batch(1000, 3000);
        assert_eq!(b.dense.len(), 3000 * spec.n_dense);
        assert_eq!(b.labels.len(), 3000);
        assert!(b.labels.iter().all(|&l| l == 0.0 || l == 1.0));
        assert!(b.dense.iter().all(|x| x.is_finite()));
        assert_eq!(b.bags.len(), spec.tables.len());
        for (t, bags) in spec.tables.iter().zip(&b.bags) {
            assert_eq!(bags.offsets.len(), 3001);
            assert_eq!(bags.offsets[0], 0);
            assert!(bags.offsets.windows(2).all(|w| w[0] < w[1]), "empty bag");
            assert_eq!(*bags.offsets.last().unwrap() as usize, bags.ids.len());
            assert!(bags.ids.iter().all(|&id| (id as u64) < t.vocab));
        }
        assert_eq!(
            b.ids_total(),
            b.bags.iter().map(|x| x.ids.len()).sum::<usize>()
        );
        // Dense features are standard normal.
        let m = b.dense.iter().map(|&x| x as f64).sum::<f64>() / b.dense.len() as f64;
        assert!(m.abs() < 0.05, "{m}");
    }

    #[test]
    fn ids_follow_the_scattered_zipf_law() {
        // One table with a small vocabulary: the most frequent id is scatter(0).
        let spec = ModelSpec {
            n_dense: 1,
            hidden: vec![2],
            zipf: 1.05,
            tables: vec![TableSpec {
                name: "x".into(),
                vocab: 97,
                dim: 2,
                pooling: Pooling::Sum,
                valency: 8.0,
                valency_dist: ValencyDist::Fixed,
                vocab_kind: VocabKind::Fixed,
                admit_after: 1,
                evict: Evict::Lfu,
            }],
        };
        let b = ClickGen::new(&spec, 3).batch(0, 20_000);
        let mut counts = vec![0u64; 97];
        for &id in &b.bags[0].ids {
            counts[id as usize] += 1;
        }
        let pmf = exact_zipf_pmf(97, 1.05);
        let mut by_id = vec![0.0; 97];
        for (r, p) in pmf.iter().enumerate() {
            by_id[scatter(r as u64, 97) as usize] += p;
        }
        let (stat, df) = chi_square(&counts, &by_id, b.bags[0].ids.len() as u64);
        assert!(stat < chi_bound(df), "chi2 {stat:.1} with {df} df");
    }

    /// AUC of `score` for the positives among `labels` (ties count half).
    fn auc(score: &[f64], labels: &[f32]) -> f64 {
        let mut idx: Vec<usize> = (0..score.len()).collect();
        idx.sort_by(|&a, &b| score[a].total_cmp(&score[b]));
        let (mut rank_sum, mut pos) = (0.0, 0.0);
        let mut i = 0;
        while i < idx.len() {
            let mut j = i;
            while j + 1 < idx.len() && score[idx[j + 1]] == score[idx[i]] {
                j += 1;
            }
            let mid = (i + j) as f64 / 2.0 + 1.0;
            for &k in &idx[i..=j] {
                if labels[k] == 1.0 {
                    rank_sum += mid;
                    pos += 1.0;
                }
            }
            i = j + 1;
        }
        let neg = score.len() as f64 - pos;
        (rank_sum - pos * (pos + 1.0) / 2.0) / (pos * neg)
    }

    #[test]
    fn peer_preset_valency_labels_and_planted_logit() {
        let spec = preset("torchrec-peer", 1.0).unwrap();
        let g = ClickGen::new(&spec, 1);
        let n = 20_000;
        let b = g.batch(0, n);
        for (t, (ts, bags)) in spec.tables.iter().zip(&b.bags).enumerate() {
            assert!(
                bags.ids.iter().all(|&id| (id as u64) < ts.vocab),
                "table {t}"
            );
            let mean = bags.ids.len() as f64 / n as f64;
            let se = ((ts.valency - 1.0) / n as f64).sqrt();
            assert!(
                (mean - ts.valency).abs() < 5.0 * se + 1e-9,
                "table {t}: valency {} measured {mean}",
                ts.valency
            );
        }
        let per_example = b.ids_total() as f64 / n as f64;
        let want: f64 = spec.tables.iter().map(|t| t.valency).sum();
        assert!((per_example / want - 1.0).abs() < 0.01, "{per_example}");

        let rate = b.labels.iter().map(|&l| l as f64).sum::<f64>() / n as f64;
        assert!((0.15..0.5).contains(&rate), "positive rate {rate}");
        let logits: Vec<f64> = (0..n).map(|e| g.planted_logit(&b, e)).collect();
        // The labels' mean matches the planted probabilities' mean.
        let p_mean = logits.iter().map(|&x| sigmoid(x)).sum::<f64>() / n as f64;
        assert!((rate - p_mean).abs() < 0.015, "rate {rate} vs {p_mean}");
        let a = auc(&logits, &b.labels);
        assert!(a > 0.7, "AUC {a}");
    }

    #[test]
    fn fixed_valency_is_exact() {
        let spec = tiny();
        let b = ClickGen::new(&spec, 2).batch(0, 500);
        for (ts, bags) in spec.tables.iter().zip(&b.bags) {
            if ts.valency_dist == ValencyDist::Fixed {
                let l = ts.valency.round() as usize;
                assert!((0..500).all(|e| bags.bag(e).len() == l));
            }
        }
    }
}
