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
//! 3. the label: one uniform `u`, label `1.0` if `u < logistic(logit)`, else `0.0`.
//!
//! The planted logit is `sum_j dense_j w_j + sum_t mean_{id in bag t} h_t[id] + b`
//! (summed in that order, in f64, from the stored f32 dense values), with
//! `h_t[id] = N(0, 1)` drawn from `(seed, stream::PLANTED, (t << 40) ^ id)` (no
//! per-table memory), `w_j = 0.3 N(0, 1)` drawn from
//! `(seed, stream::PLANTED, 2^63 | j)` and `b = -1`. The pool is the mean over the
//! bag whatever the table's [`Pooling`](crate::spec::Pooling), as the peer does.
//!
//! Nothing depends on how a range of examples is cut or on the rayon thread count.

use rayon::prelude::*;

use super::batch::{to_u32_offset, Bags, Batch};
use super::sample::{logistic, Poisson, Zipf};
use crate::rng::{stream, SplitMix64};
use crate::spec::{ModelSpec, ValencyDist};

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
        let p = logistic(self.planted_logit(b, i));
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
    use super::super::sample::tests::{chi_bound, chi_square, exact_zipf_pmf};
    use super::*;
    use crate::spec::{preset, Evict, Pooling, TableSpec, VocabKind};

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
            arch: Default::default(),
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
        let p_mean = logits.iter().map(|&x| logistic(x)).sum::<f64>() / n as f64;
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
