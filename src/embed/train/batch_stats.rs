//! Batch statistics that the planner's cost model reads: how many ids an example
//! carries per table, and how many of them are distinct in one rank's batch and in the
//! global batch (feedback-directed partitioning: profile a few batches, then plan).
//!
//! Two sources: [`from_samples`] measures sampled batches of the real generator, and
//! [`synthetic_stats`] estimates the same numbers from the model spec alone (the
//! expected number of distinct values among `m` Zipf draws), so that many table tasks
//! can be planned without generating data. Measured stats are kept in a JSON file
//! ([`BatchStats::save`], [`BatchStats::load`]) and reused only when
//! [`BatchStats::matches`] the model, seed, batch size and world
//! ([`load_or_measure_stats`]).

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::blocks::block_range;
use crate::data::clicks::batch::Batch;
use crate::data::clicks::source::Source;
use crate::embed::tables::keys::{pseudo_rows, IdMap};
use crate::spec::ModelSpec;
use crate::{Error, Result};

/// The `schema` of a stats file.
pub const SCHEMA: &str = "torusrec-batch-stats-v1";

/// Statistics for the planner: the file's when it matches, else measured on
/// `sample` sampled global batches (and written to the file when one is named).
#[allow(clippy::too_many_arguments)]
pub fn load_or_measure_stats(
    spec: &ModelSpec,
    source: &Source,
    ids: &IdMap,
    seed: u64,
    world: usize,
    batch_per_rank: usize,
    sample: usize,
    path: Option<&Path>,
) -> Result<(BatchStats, &'static str)> {
    let digest = spec.digest();
    if let Some(p) = path {
        if let Some(s) = BatchStats::load(p)? {
            if s.matches(&digest, &source.identity(), seed, batch_per_rank, world) {
                return Ok((s, "reused"));
            }
        }
    }
    let g = (world * batch_per_rank) as u64;
    let mut batches = Vec::with_capacity(sample);
    for b in 0..sample as u64 {
        // Sampled from the training examples; a finite log is read around its end
        // (also when it is shorter than one global batch), so every sample has `g`.
        let batch = match source.train_examples() {
            None => source.batch(b * g, g as usize)?,
            Some(0) => {
                return Err(Error::Config(
                    "batch stats: the click log has no training examples".into(),
                ))
            }
            Some(n) => {
                let mut out = Batch::empty(spec);
                let (mut at, mut left) = ((b * g) % n, g);
                while left > 0 {
                    let take = left.min(n - at);
                    source.batch_into(at, take as usize, &mut out)?;
                    left -= take;
                    at = (at + take) % n;
                }
                out
            }
        };
        let mut batch = batch;
        // The model's rows: hash tables' keys spread over rows as over owners.
        ids.apply(&mut batch, &|| source.describe())?;
        pseudo_rows(spec, &mut batch);
        batches.push(batch);
    }
    let sampled: Vec<SampledBatch> = batches
        .iter()
        .map(|b| SampledBatch {
            n: b.n,
            tables: b
                .bags
                .iter()
                .map(|bg| SampledTable {
                    offsets: bg.offsets.iter().map(|&o| o as usize).collect(),
                    ids: bg.ids.clone(),
                })
                .collect(),
        })
        .collect();
    let s = BatchStats {
        source: source.identity(),
        ..from_samples(spec, seed, world, batch_per_rank, &sampled)?
    };
    if let Some(p) = path {
        s.save(p)?;
    }
    Ok((s, "measured"))
}

/// The statistics of one table.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TableStats {
    /// Ids per example (measured, or the spec's mean valency).
    pub mean_valency: f64,
    /// Mean number of distinct ids in one rank's batch of `batch_per_rank` examples.
    pub unique_per_rank_batch: f64,
    /// Mean number of distinct ids in a global batch of `world * batch_per_rank`
    /// examples.
    pub unique_per_global_batch: f64,
}

/// Statistics of every table of one model, for one batch size and world.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BatchStats {
    /// Always [`SCHEMA`].
    pub schema: String,
    /// [`ModelSpec::digest`] of the model measured.
    pub spec_digest: String,
    /// Seed of the generator that was sampled (0 for [`synthetic_stats`]).
    pub seed: u64,
    pub batch_per_rank: usize,
    pub world: usize,
    /// Global batches measured; 0 when the numbers are analytic estimates.
    pub sampled_batches: usize,
    /// What was sampled (`Source::identity`: generated, or which click log); empty
    /// for analytic estimates and for files written before it was recorded.
    #[serde(default)]
    pub source: String,
    /// One entry per table of the model, in order.
    pub tables: Vec<TableStats>,
}

impl BatchStats {
    /// Read a stats file; `None` if it does not exist.
    pub fn load(path: &Path) -> Result<Option<BatchStats>> {
        if !path.exists() {
            return Ok(None);
        }
        let text = crate::error::read_text(path)?;
        let stats: BatchStats = serde_json::from_str(&text)
            .map_err(|e| Error::input(path, format!("not a batch stats file: {e}")))?;
        if stats.schema != SCHEMA {
            return Err(Error::input(
                path,
                format!("schema {:?}, expected {SCHEMA:?}", stats.schema),
            ));
        }
        Ok(Some(stats))
    }

    /// Write the stats as JSON to `path.partial`, then rename it to `path`. (Numbers
    /// read back may differ from those written in the last bit.)
    pub fn save(&self, path: &Path) -> Result<()> {
        // A cache, replaced when stale: only where it goes is checked.
        crate::io::outfile::check_output(path, true)?;
        let text = serde_json::to_string_pretty(self).map_err(|e| Error::Config(e.to_string()))?;
        crate::io::outfile::write(path, (text + "\n").as_bytes())
    }

    /// Whether these stats were made for this model, generator seed, batch size and
    /// world (the only case in which a stats file may be reused).
    pub fn matches(
        &self,
        spec_digest: &str,
        source: &str,
        seed: u64,
        batch_per_rank: usize,
        world: usize,
    ) -> bool {
        self.schema == SCHEMA
            && self.spec_digest == spec_digest
            && self.source == source
            && self.seed == seed
            && self.batch_per_rank == batch_per_rank
            && self.world == world
    }
}

/// The ids of one table in a sampled global batch, as a CSR over examples.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SampledTable {
    /// `n + 1` offsets into `ids`; example `e` has ids `offsets[e]..offsets[e + 1]`.
    pub offsets: Vec<usize>,
    pub ids: Vec<u32>,
}

/// One sampled global batch: `n = world * batch_per_rank` examples in global order
/// (rank `r` owns examples `block_range(n, world, r)`), one CSR per table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SampledBatch {
    pub n: usize,
    pub tables: Vec<SampledTable>,
}

fn distinct(ids: &[u32], scratch: &mut Vec<u32>) -> usize {
    scratch.clear();
    scratch.extend_from_slice(ids);
    scratch.sort_unstable();
    scratch.dedup();
    scratch.len()
}

/// Measure sampled global batches: mean ids per example, and mean distinct ids per
/// rank batch (over every batch and rank) and per global batch (over every batch).
pub fn from_samples(
    spec: &ModelSpec,
    seed: u64,
    world: usize,
    batch_per_rank: usize,
    batches: &[SampledBatch],
) -> Result<BatchStats> {
    let bad = |msg: String| Err(Error::Config(format!("batch stats: {msg}")));
    if world == 0 || batch_per_rank == 0 {
        return bad(format!(
            "world ({world}) and batch per rank ({batch_per_rank}) must be positive"
        ));
    }
    if batches.is_empty() {
        return bad("no sampled batches".into());
    }
    let n = world * batch_per_rank;
    let n_tables = spec.tables.len();
    for (b, batch) in batches.iter().enumerate() {
        if batch.n != n {
            return bad(format!(
                "batch {b} has {} examples, expected world * batch per rank = {n}",
                batch.n
            ));
        }
        if batch.tables.len() != n_tables {
            return bad(format!(
                "batch {b} has {} tables, the model {n_tables}",
                batch.tables.len()
            ));
        }
        for (t, st) in batch.tables.iter().enumerate() {
            let ok = st.offsets.len() == n + 1
                && st.offsets[0] == 0
                && st.offsets.windows(2).all(|w| w[0] <= w[1])
                && st.offsets[n] == st.ids.len();
            if !ok {
                return bad(format!(
                    "batch {b} table {t}: offsets must be {} nondecreasing values from 0 \
                     to the id count {}",
                    n + 1,
                    st.ids.len()
                ));
            }
        }
    }
    let mut scratch = Vec::new();
    let tables = (0..n_tables)
        .map(|t| {
            let (mut ids, mut rank_distinct, mut global_distinct) = (0usize, 0usize, 0usize);
            for batch in batches {
                let st = &batch.tables[t];
                ids += st.ids.len();
                global_distinct += distinct(&st.ids, &mut scratch);
                for r in 0..world {
                    let (lo, hi) = block_range(n as u64, world, r);
                    let ids_r = &st.ids[st.offsets[lo as usize]..st.offsets[hi as usize]];
                    rank_distinct += distinct(ids_r, &mut scratch);
                }
            }
            let nb = batches.len() as f64;
            TableStats {
                mean_valency: ids as f64 / (nb * n as f64),
                unique_per_rank_batch: rank_distinct as f64 / (nb * world as f64),
                unique_per_global_batch: global_distinct as f64 / nb,
            }
        })
        .collect();
    Ok(BatchStats {
        schema: SCHEMA.into(),
        spec_digest: spec.digest(),
        seed,
        batch_per_rank,
        world,
        sampled_batches: batches.len(),
        source: String::new(),
        tables,
    })
}

/// Vocabularies up to this size are summed exactly in [`expected_distinct`]; beyond,
/// ranks up to this one are summed exactly and the tail is integrated, which agrees
/// with the exact sum to about 1e-12 (see the tests) at a fraction of the cost.
pub const EXACT_VOCAB: u64 = 1 << 16;
/// Simpson intervals (on a log scale) for the tail integrals.
const TAIL_STEPS: usize = 4096;

/// Simpson's rule for `f` over `[a, b]` after the substitution `x = e^u`.
fn integrate_log(a: f64, b: f64, f: impl Fn(f64) -> f64) -> f64 {
    let (la, lb) = (a.ln(), b.ln());
    let h = (lb - la) / TAIL_STEPS as f64;
    let g = |u: f64| {
        let x = u.exp();
        f(x) * x
    };
    let mut s = g(la) + g(lb);
    for i in 1..TAIL_STEPS {
        s += g(la + i as f64 * h) * if i % 2 == 1 { 4.0 } else { 2.0 };
    }
    s * h / 3.0
}

/// The expected number of distinct values among `draws` independent draws from the
/// Zipf law `p_k = k^-s / H(V, s)` over `k = 1..=V`: `sum_k 1 - (1 - p_k)^draws`.
/// Exact sums for `V <= EXACT_VOCAB`; beyond, exact up to rank `EXACT_VOCAB` and a
/// midpoint integral (`k -> [k - 1/2, k + 1/2]`) of the smooth tail, for both the sum
/// and the normalization `H`. `draws` may be fractional (a mean number of draws).
pub fn expected_distinct(vocab: u64, s: f64, draws: f64) -> f64 {
    expected_distinct_many(vocab, s, &[draws])[0]
}

/// [`expected_distinct`] for several numbers of draws, in one pass over the ranks.
pub fn expected_distinct_many(vocab: u64, s: f64, draws: &[f64]) -> Vec<f64> {
    expected_distinct_with(vocab, s, draws, EXACT_VOCAB)
}

fn expected_distinct_with(vocab: u64, s: f64, draws: &[f64], exact_vocab: u64) -> Vec<f64> {
    let mut e = vec![0.0; draws.len()];
    if vocab == 0 {
        return e;
    }
    let head = if vocab <= exact_vocab {
        vocab
    } else {
        EXACT_VOCAB.min(vocab)
    };
    let pw: Vec<f64> = (1..=head).map(|k| (k as f64).powf(-s)).collect();
    let (a, b) = (head as f64 + 0.5, vocab as f64 + 0.5);
    let tail = head < vocab;
    let h = pw.iter().sum::<f64>()
        + if tail {
            integrate_log(a, b, |x| x.powf(-s))
        } else {
            0.0
        };
    // 1 - (1 - p)^m = -expm1(m ln1p(-p)), without cancellation for tiny p.
    for &x in &pw {
        let l = (-x / h).ln_1p();
        for (ei, &m) in e.iter_mut().zip(draws) {
            *ei -= (m.max(0.0) * l).exp_m1();
        }
    }
    if tail {
        for (ei, &m) in e.iter_mut().zip(draws) {
            *ei += integrate_log(a, b, |x| -(m.max(0.0) * (-x.powf(-s) / h).ln_1p()).exp_m1());
        }
    }
    e
}

/// Estimated stats without sampling: each table's spec valency as the mean, and the
/// expected distinct ids of `batch_per_rank * valency` (one rank) and
/// `world * batch_per_rank * valency` (global) Zipf(`spec.zipf`) draws. The seed is 0
/// and `sampled_batches` is 0, which marks the numbers as estimates.
pub fn synthetic_stats(spec: &ModelSpec, world: usize, batch_per_rank: usize) -> BatchStats {
    let tables = spec
        .tables
        .iter()
        .map(|t| {
            let m = batch_per_rank as f64 * t.valency;
            let u = expected_distinct_many(t.vocab, spec.zipf, &[m, world as f64 * m]);
            TableStats {
                mean_valency: t.valency,
                unique_per_rank_batch: u[0],
                unique_per_global_batch: u[1],
            }
        })
        .collect();
    BatchStats {
        schema: SCHEMA.into(),
        spec_digest: spec.digest(),
        seed: 0,
        batch_per_rank,
        world,
        sampled_batches: 0,
        source: String::new(),
        tables,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SplitMix64;
    use crate::spec::preset;

    /// A CSR from per-example id lists.
    fn csr(examples: &[&[u32]]) -> SampledTable {
        let mut offsets = vec![0];
        let mut ids = Vec::new();
        for e in examples {
            ids.extend_from_slice(e);
            offsets.push(ids.len());
        }
        SampledTable { offsets, ids }
    }

    fn two_tables() -> ModelSpec {
        let mut spec = preset("tiny", 1.0).unwrap();
        spec.tables.truncate(2);
        spec
    }

    #[test]
    fn from_samples_counts_by_hand() {
        let spec = two_tables();
        // world 2, 2 examples per rank: rank 0 owns examples 0-1, rank 1 owns 2-3.
        let b0 = SampledBatch {
            n: 4,
            tables: vec![
                csr(&[&[1, 2], &[2, 3], &[3], &[9, 9, 1]]),
                csr(&[&[5], &[5], &[5], &[6]]),
            ],
        };
        let b1 = SampledBatch {
            n: 4,
            tables: vec![
                csr(&[&[7], &[], &[7, 7], &[8]]),
                csr(&[&[0], &[1], &[2], &[3]]),
            ],
        };
        let s = from_samples(&spec, 3, 2, 2, &[b0, b1]).unwrap();
        assert_eq!(s.sampled_batches, 2);
        assert_eq!(s.spec_digest, spec.digest());
        // Table 0: 8 + 4 ids over 8 examples. Rank batches: {1,2,3}, {3,9,1}, {7}, {7,8}
        // = 3+3+1+2 over 4; global: {1,2,3,9}, {7,8} = 4+2 over 2.
        assert_eq!(
            s.tables[0],
            TableStats {
                mean_valency: 12.0 / 8.0,
                unique_per_rank_batch: 9.0 / 4.0,
                unique_per_global_batch: 3.0,
            }
        );
        // Table 1: {5}, {5,6}, {0,1}, {2,3}; global {5,6}, {0,1,2,3}.
        assert_eq!(
            s.tables[1],
            TableStats {
                mean_valency: 1.0,
                unique_per_rank_batch: 7.0 / 4.0,
                unique_per_global_batch: 3.0,
            }
        );
    }

    #[test]
    fn from_samples_refuses_malformed_batches() {
        let spec = two_tables();
        let good = || SampledBatch {
            n: 2,
            tables: vec![csr(&[&[1], &[2]]), csr(&[&[1], &[2]])],
        };
        assert!(from_samples(&spec, 0, 2, 1, &[good()]).is_ok());
        assert!(from_samples(&spec, 0, 2, 1, &[]).is_err());
        assert!(from_samples(&spec, 0, 1, 1, &[good()]).is_err());
        let mut b = good();
        b.tables.pop();
        assert!(from_samples(&spec, 0, 2, 1, &[b]).is_err());
        let mut b = good();
        b.tables[1].offsets[2] = 5;
        let e = from_samples(&spec, 0, 2, 1, &[b]).unwrap_err().to_string();
        assert!(e.contains("table 1"), "{e}");
    }

    #[test]
    fn save_load_round_trip_and_matches() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stats.json");
        assert_eq!(BatchStats::load(&path).unwrap(), None);
        let spec = two_tables();
        let mut s = synthetic_stats(&spec, 4, 64);
        s.seed = 17;
        s.save(&path).unwrap();
        assert!(!crate::io::outfile::temp_path(&path).exists());
        let back = BatchStats::load(&path).unwrap().unwrap();
        // serde_json's default float parser may be off by an ulp.
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-15 * b.abs();
        assert_eq!(back.tables.len(), s.tables.len());
        for (x, y) in back.tables.iter().zip(&s.tables) {
            assert!(close(x.mean_valency, y.mean_valency), "{x:?} {y:?}");
            assert!(
                close(x.unique_per_rank_batch, y.unique_per_rank_batch),
                "{x:?} {y:?}"
            );
            assert!(
                close(x.unique_per_global_batch, y.unique_per_global_batch),
                "{x:?} {y:?}"
            );
        }
        assert_eq!(
            BatchStats {
                tables: s.tables.clone(),
                ..back.clone()
            },
            s
        );
        let d = spec.digest();
        let src = back.source.as_str();
        assert!(back.matches(&d, src, 17, 64, 4));
        assert!(!back.matches(&d, src, 18, 64, 4));
        assert!(!back.matches(&d, src, 17, 32, 4));
        assert!(!back.matches(&d, src, 17, 64, 2));
        assert!(!back.matches("0000", src, 17, 64, 4));
        assert!(!back.matches(&d, "log seed 1 examples 9 eval 1", 17, 64, 4));

        std::fs::write(&path, "{ not json").unwrap();
        let e = BatchStats::load(&path).unwrap_err();
        assert_eq!(e.exit_code(), crate::error::exit::USAGE);
        assert!(e.to_string().contains("stats.json"), "{e}");
        std::fs::write(
            &path,
            serde_json::to_string(&BatchStats {
                schema: "v0".into(),
                ..s
            })
            .unwrap(),
        )
        .unwrap();
        assert!(BatchStats::load(&path)
            .unwrap_err()
            .to_string()
            .contains("schema"));
    }

    #[test]
    fn expected_distinct_matches_enumeration() {
        // Every sequence of 3 draws over 4 values, weighted by its probability.
        let (v, s) = (4u64, 1.05);
        let h: f64 = (1..=v).map(|k| (k as f64).powf(-s)).sum();
        let p: Vec<f64> = (1..=v).map(|k| (k as f64).powf(-s) / h).collect();
        let mut want = 0.0;
        for a in 0..4 {
            for b in 0..4 {
                for c in 0..4 {
                    let mut d = vec![a, b, c];
                    d.sort_unstable();
                    d.dedup();
                    want += p[a] * p[b] * p[c] * d.len() as f64;
                }
            }
        }
        let got = expected_distinct(v, s, 3.0);
        assert!((got - want).abs() < 1e-12, "{got} vs {want}");
    }

    #[test]
    fn expected_distinct_matches_simulation() {
        let (v, s, m) = (1000u64, 1.05, 500usize);
        let h: f64 = (1..=v).map(|k| (k as f64).powf(-s)).sum();
        let mut cdf = Vec::with_capacity(v as usize);
        let mut acc = 0.0;
        for k in 1..=v {
            acc += (k as f64).powf(-s) / h;
            cdf.push(acc);
        }
        let trials = 2000;
        let mut total = 0usize;
        let mut rng = SplitMix64::new(5);
        let mut seen = vec![0u32; v as usize];
        for trial in 1..=trials {
            let mut d = 0;
            for _ in 0..m {
                let u = rng.next_f64();
                let k = cdf.partition_point(|&c| c < u).min(v as usize - 1);
                if seen[k] != trial {
                    seen[k] = trial;
                    d += 1;
                }
            }
            total += d;
        }
        let sim = total as f64 / trials as f64;
        let got = expected_distinct(v, s, m as f64);
        // The standard error of the mean is well under 0.5 here.
        assert!((got - sim).abs() < 1.5, "{got} vs simulated {sim}");
    }

    #[test]
    fn tail_integral_agrees_with_the_exact_sum() {
        for (v, s, m) in [
            (3_000_000u64, 1.05, 20_000.0),
            (2_000_000, 0.8, 1e6),
            (1_000_000, 0.5, 3e5),
            (300_000, 1.2, 50.0),
            (200_000, 2.0, 1e7),
            (70_000, 1.05, 1e4),
        ] {
            let exact = expected_distinct_with(v, s, &[m], u64::MAX)[0];
            let approx = expected_distinct(v, s, m);
            assert!(
                (approx / exact - 1.0).abs() < 1e-9,
                "V={v} s={s} m={m}: {approx} vs {exact}"
            );
        }
    }

    #[test]
    fn synthetic_stats_are_sane() {
        let spec = preset("tiny", 1.0).unwrap();
        let s = synthetic_stats(&spec, 4, 128);
        assert_eq!(s.tables.len(), spec.tables.len());
        for (t, ts) in s.tables.iter().zip(&spec.tables) {
            assert_eq!(t.mean_valency, ts.valency);
            assert!(t.unique_per_rank_batch > 0.0);
            assert!(t.unique_per_rank_batch <= t.unique_per_global_batch);
            assert!(t.unique_per_global_batch <= ts.vocab as f64 + 1e-9);
            assert!(t.unique_per_rank_batch <= 128.0 * ts.valency + 1e-9);
        }
        // Table "e" has 7 rows and 256 draws per rank: every row is seen.
        assert!((s.tables[4].unique_per_rank_batch - 7.0).abs() < 1e-3);
    }
}
