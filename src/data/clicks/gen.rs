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
//! With the planted model [`Planted::Fm`] (`generate clicks --planted fm`), labels need
//! pairwise feature interactions: the logit gains a factorization machine of the
//! tables' pooled planted factors,
//!
//! ```text
//! logit += c * sum_{s < t} <u_s, u_t>,    u_t = mean_{id in bag t} v_t[id],
//! c = scale / sqrt(k P),                   P = T (T - 1) / 2 pairs of the T tables,
//! ```
//!
//! with `v_t[id]` `k` standard normals drawn in order from
//! `(seed, stream::PLANTED_FM, (t << 40) ^ id)` (an empty bag's `u_t` is zero). For
//! one-id bags each `<u_s, u_t>` has variance `k`, so the interaction term has standard
//! deviation `scale`; the default scale is `sqrt(T)`, the standard deviation of the
//! tables' linear part for one-id bags, so neither part dominates. The linear part and
//! the draw order of the examples are unchanged: an fm log has the linear log's dense
//! features and ids, only its labels differ. The interaction term is added after the
//! linear logit, in f64, pairs in order `(0, 1), (0, 2), ..., (T - 2, T - 1)`.
//!
//! Nothing depends on how a range of examples is cut or on the rayon thread count.

use rayon::prelude::*;

use super::batch::{to_u32_offset, Bags, Batch};
use super::sample::{logistic, Poisson, Zipf};
use crate::rng::{stream, SplitMix64};
use crate::spec::{ModelSpec, ValencyDist};
use crate::{Error, Result};

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

/// Largest rank of the planted factorization machine.
pub const MAX_FM_RANK: usize = 256;

/// How the generator plants its labels (module doc).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum Planted {
    /// The logistic model of the dense features and per-id weights (the default; its
    /// bits are those of every log generated before the option existed).
    #[default]
    Linear,
    /// The linear model plus a factorization machine of rank `rank` over the tables'
    /// pooled planted factors; `scale` is the interaction term's standard deviation for
    /// one-id bags (`None`: `sqrt(T)`).
    Fm { rank: usize, scale: Option<f64> },
}

impl Planted {
    /// Parse `linear`, `fm`, `fm:RANK` or `fm:RANK:SCALE` (rank 8 by default).
    pub fn parse(s: &str) -> Result<Planted> {
        let bad = |why: &str| {
            Err(Error::Config(format!(
                "--planted {s:?}: {why} (linear, fm, fm:RANK or fm:RANK:SCALE)"
            )))
        };
        let mut parts = s.split(':');
        match parts.next() {
            Some("linear") if parts.next().is_none() => return Ok(Planted::Linear),
            Some("fm") => {}
            _ => return bad("unknown planted model"),
        }
        let rank = match parts.next() {
            None => 8,
            Some(r) => match r.parse::<usize>() {
                Ok(r) if (1..=MAX_FM_RANK).contains(&r) => r,
                _ => return bad(&format!("the rank must be in 1..={MAX_FM_RANK}")),
            },
        };
        let scale = match parts.next() {
            None => None,
            Some(c) => match c.parse::<f64>() {
                Ok(c) if c.is_finite() && c >= 0.0 => Some(c),
                _ => return bad("the scale must be a finite number >= 0"),
            },
        };
        if parts.next().is_some() {
            return bad("too many fields");
        }
        Ok(Planted::Fm { rank, scale })
    }

    /// The canonical text (what [`Planted::parse`] reads back), the scale resolved for
    /// `tables` tables.
    pub fn describe(&self, tables: usize) -> String {
        match *self {
            Planted::Linear => "linear".into(),
            Planted::Fm { rank, scale } => {
                format!("fm:{rank}:{}", scale.unwrap_or(default_fm_scale(tables)))
            }
        }
    }
}

/// The default interaction scale of `tables` tables: `sqrt(T)`.
pub fn default_fm_scale(tables: usize) -> f64 {
    (tables as f64).sqrt()
}

/// The planted factor `v_t[id]` (`rank` standard normals) into `out`.
pub fn planted_factor(seed: u64, table: usize, id: u32, out: &mut [f64]) {
    let mut r = SplitMix64::for_id(seed, stream::PLANTED_FM, ((table as u64) << 40) ^ id as u64);
    for x in out {
        *x = r.next_normal();
    }
}

/// The resolved factorization machine of [`Planted::Fm`].
#[derive(Clone, Copy, Debug)]
struct Fm {
    rank: usize,
    /// The resolved scale.
    scale: f64,
    /// `c = scale / sqrt(k P)` (0 with fewer than two tables).
    coef: f64,
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
    fm: Option<Fm>,
}

impl ClickGen {
    /// `spec` must be valid ([`ModelSpec::validate`]); the linear planted model.
    pub fn new(spec: &ModelSpec, seed: u64) -> ClickGen {
        Self::with_planted(spec, seed, Planted::Linear)
    }

    /// The generator of `(spec, seed)` with the planted model `planted`.
    pub fn with_planted(spec: &ModelSpec, seed: u64, planted: Planted) -> ClickGen {
        let n = spec.tables.len();
        let fm = match planted {
            Planted::Linear => None,
            Planted::Fm { rank, scale } => {
                let pairs = (n * n.saturating_sub(1) / 2) as f64;
                let scale = scale.unwrap_or(default_fm_scale(n));
                Some(Fm {
                    rank,
                    scale,
                    coef: if pairs > 0.0 {
                        scale / (rank as f64 * pairs).sqrt()
                    } else {
                        0.0
                    },
                })
            }
        };
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
            fm,
        }
    }

    /// The planted model this generator draws labels with.
    pub fn planted(&self) -> Planted {
        match self.fm {
            None => Planted::Linear,
            Some(f) => Planted::Fm {
                rank: f.rank,
                scale: Some(f.scale),
            },
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
        logit += PLANTED_BIAS;
        match self.fm {
            None => logit,
            Some(fm) => logit + self.interaction(fm, b, e),
        }
    }

    /// The factorization machine's term of example `e` (module doc).
    fn interaction(&self, fm: Fm, b: &Batch, e: usize) -> f64 {
        let k = fm.rank;
        let mut u = vec![0.0f64; b.bags.len() * k];
        let mut v = vec![0.0f64; k];
        for (t, bags) in b.bags.iter().enumerate() {
            let bag = bags.bag(e);
            let ut = &mut u[t * k..(t + 1) * k];
            for &id in bag {
                planted_factor(self.seed, t, id, &mut v);
                for (a, x) in ut.iter_mut().zip(&v) {
                    *a += x;
                }
            }
            if !bag.is_empty() {
                let inv = bag.len() as f64;
                ut.iter_mut().for_each(|a| *a /= inv);
            }
        }
        let mut sum = 0.0;
        for s in 0..b.bags.len() {
            for t in s + 1..b.bags.len() {
                let (us, ut) = (&u[s * k..(s + 1) * k], &u[t * k..(t + 1) * k]);
                sum += us.iter().zip(ut).map(|(x, y)| x * y).sum::<f64>();
            }
        }
        fm.coef * sum
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
            table_dtype: Default::default(),
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

    #[test]
    fn planted_models_parse_and_refuse_bad_text() {
        assert_eq!(Planted::parse("linear").unwrap(), Planted::Linear);
        let fm = |rank, scale| Planted::Fm { rank, scale };
        assert_eq!(Planted::parse("fm").unwrap(), fm(8, None));
        assert_eq!(Planted::parse("fm:3").unwrap(), fm(3, None));
        assert_eq!(Planted::parse("fm:3:0.5").unwrap(), fm(3, Some(0.5)));
        assert_eq!(fm(3, None).describe(4), "fm:3:2");
        assert_eq!(
            Planted::parse(&fm(3, Some(0.5)).describe(9)).unwrap(),
            fm(3, Some(0.5))
        );
        for bad in [
            "", "lin", "linear:2", "fm:0", "fm:257", "fm:x", "fm:2:-1", "fm:2:nan", "fm:2:1:3",
        ] {
            let e = Planted::parse(bad).unwrap_err().to_string();
            assert!(e.contains("--planted"), "{bad}: {e}");
        }
    }

    /// Two one-id tables and one bag-of-three table, for the interaction term.
    fn fm_spec() -> ModelSpec {
        let t = |name: &str, vocab, valency, dist| TableSpec {
            name: name.into(),
            vocab,
            dim: 4,
            pooling: Pooling::Sum,
            valency,
            valency_dist: dist,
            vocab_kind: VocabKind::Fixed,
            admit_after: 1,
            evict: Evict::Lfu,
        };
        ModelSpec {
            table_dtype: Default::default(),
            n_dense: 2,
            hidden: vec![4],
            zipf: 1.05,
            arch: Default::default(),
            tables: vec![
                t("a", 500, 1.0, ValencyDist::Fixed),
                t("b", 300, 1.0, ValencyDist::Fixed),
                t("c", 200, 3.0, ValencyDist::Fixed),
            ],
        }
    }

    #[test]
    fn the_fm_term_is_the_factorization_machine_of_the_module_doc() {
        let spec = fm_spec();
        let (rank, scale) = (3, 1.5);
        let lin = ClickGen::new(&spec, 4);
        let fm = ClickGen::with_planted(
            &spec,
            4,
            Planted::Fm {
                rank,
                scale: Some(scale),
            },
        );
        let (bl, bf) = (lin.batch(0, 200), fm.batch(0, 200));
        // The same dense features and ids: only the labels differ.
        assert_eq!(bl.dense, bf.dense);
        assert_eq!(bl.bags, bf.bags);
        assert_ne!(bl.labels, bf.labels);
        // c = scale / sqrt(k P), P = 3 pairs; u_t the mean of the bag's factors.
        let c = scale / ((rank * 3) as f64).sqrt();
        for e in 0..200 {
            let u: Vec<Vec<f64>> = (0..3)
                .map(|t| {
                    let bag = bf.bags[t].bag(e);
                    let mut m = vec![0.0; rank];
                    for &id in bag {
                        let mut v = vec![0.0; rank];
                        planted_factor(4, t, id, &mut v);
                        for i in 0..rank {
                            m[i] += v[i] / bag.len() as f64;
                        }
                    }
                    m
                })
                .collect();
            let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
            let want = c * (dot(&u[0], &u[1]) + dot(&u[0], &u[2]) + dot(&u[1], &u[2]));
            let got = fm.planted_logit(&bf, e) - lin.planted_logit(&bf, e);
            assert!(
                (got - want).abs() < 1e-9 * (1.0 + want.abs()),
                "{e}: {got} vs {want}"
            );
        }
        // A factor is `rank` standard normals of its own stream: other tables and ids
        // give other factors.
        let (mut a, mut b) = (vec![0.0; 4], vec![0.0; 4]);
        planted_factor(4, 0, 7, &mut a);
        planted_factor(4, 1, 7, &mut b);
        assert_ne!(a, b);
        assert_eq!(
            fm.planted(),
            Planted::Fm {
                rank,
                scale: Some(scale)
            }
        );
    }

    #[test]
    fn one_id_bags_give_the_interaction_term_the_scale_as_its_spread() {
        let mut spec = fm_spec();
        spec.tables[2].valency = 1.0;
        let n = 20_000;
        let lin = ClickGen::new(&spec, 9);
        let fm = ClickGen::with_planted(
            &spec,
            9,
            Planted::Fm {
                rank: 8,
                scale: None,
            },
        );
        let b = fm.batch(0, n);
        let d: Vec<f64> = (0..n)
            .map(|e| fm.planted_logit(&b, e) - lin.planted_logit(&b, e))
            .collect();
        let mean = d.iter().sum::<f64>() / n as f64;
        let sd = (d.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64).sqrt();
        // Default scale sqrt(3). Zipf repeats make pairs share ids, so the spread is not
        // exactly the scale; it must be near it.
        let want = 3f64.sqrt();
        assert!((sd / want - 1.0).abs() < 0.15, "sd {sd} vs {want}");
    }

    #[test]
    fn fm_labels_need_the_interactions() {
        // The planted logits with and without the interaction term: the labels of an
        // fm log are predicted markedly better by the whole model than by its linear
        // part alone (and its linear part is still informative).
        let spec = preset("tiny", 1.0).unwrap();
        let n = 30_000;
        let lin = ClickGen::new(&spec, 1);
        let fm = ClickGen::with_planted(
            &spec,
            1,
            Planted::Fm {
                rank: 8,
                scale: None,
            },
        );
        let b = fm.batch(0, n);
        let whole: Vec<f64> = (0..n).map(|e| fm.planted_logit(&b, e)).collect();
        let linear: Vec<f64> = (0..n).map(|e| lin.planted_logit(&b, e)).collect();
        let (aw, al) = (auc(&whole, &b.labels), auc(&linear, &b.labels));
        assert!(aw > al + 0.05, "AUC whole {aw} vs linear part {al}");
        assert!(al > 0.55, "linear part AUC {al}");
    }
}
