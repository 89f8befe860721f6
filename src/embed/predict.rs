//! Scoring examples with a trained model (`torusrec predict`): the model file's header
//! checked against the click log, the model loaded onto this run's ranks (any rank
//! count: fixed and modulo tables by row, hash tables by key), and every example of
//! the log scored in input order.
//!
//! Phases: the header ([`local_read_header`]) and its check against the data
//! ([`local_check_data`]); the scoring model's spec ([`scoring_spec`]: hash tables
//! re-sharded onto another rank count get room for every entry); the load
//! ([`global_load`]); the scores ([`global_score`]: the examples in chunks fixed by
//! their index, rank `r` the contiguous block `r` of the chunks, with the lookups and
//! pooling of evaluation).
//!
//! The score of an example is the model's logit `z` and its click probability
//! `sigmoid(z) = 1 / (1 + exp(-z))` ([`probability`]). An id a hash table does not
//! hold (never seen, not yet admitted, or expired at the model's step) looks up no
//! row: it is left out of its bag (a sum pools zeros for it, a mean is taken over the
//! rows found; [`crate::embed::tables::keys`]).
//! A weighted click log's ids (`/tables/<t>/weights`) pool as in training: every
//! table is served in the `rows` mode here, whose pooling ([`pool`]) takes
//! `sum_i w_i row_i` (a mean divides it by the rows found); an id without a row
//! drops its weight with it.
//! A fixed-vocabulary id at or above the vocabulary is an error naming the log and
//! the example.

use std::path::Path;

use ndarray::ArrayView2;

use crate::blocks::block_range;
use crate::comm::Comm;
use crate::data::clicks::source::Source;
use crate::embed::dense::arch::DenseWorkspace;
use crate::embed::io::model_file::{FORMAT, VERSION};
use crate::embed::sharding::exchange::{global_lookup, pool};
use crate::embed::tables::keys::{global_resolve, IdMap, Resolve, ResolveBufs};
use crate::embed::tables::placement::Plan;
use crate::embed::tables::store::TableOpt;
use crate::embed::train::trainer::{EmbedConfig, EmbedTrainer};
use crate::io::h5::{open_h5, read_str_attr, read_u64_attr};
use crate::spec::{ModelSpec, VocabKind};
use crate::{Error, Result};

/// What a model file says about itself (its root attributes and hash-table headers).
#[derive(Clone, Debug)]
pub struct ModelHeader {
    pub spec: ModelSpec,
    /// Optimizer steps the model was trained for: the step its hash tables' expiry
    /// (`ttl`) is judged at.
    pub step: u64,
    pub seed: u64,
    /// Per table: the hash table's entries over all ranks (0 for other tables).
    pub hash_entries: Vec<u64>,
    /// Per table: how many ranks wrote the hash table's entries (0 for other tables).
    pub hash_writers: Vec<usize>,
    /// The held-out AUC and log loss the training run recorded, when it did.
    pub auc: Option<f64>,
    pub logloss: Option<f64>,
}

/// Rank-local: the header of the model file at `path`, checked: an HDF5 file whose
/// `format` is a model's (`torusrec-embed-model`, not a checkpoint's), of a version
/// this build reads, with its spec. Refused otherwise (exit 2, naming the file).
pub fn local_read_header(path: &Path) -> Result<ModelHeader> {
    if !path.exists() {
        return Err(Error::input(path, "--model: no such file"));
    }
    let f = open_h5(path)?;
    let bad = |msg: String| Error::input(path, msg);
    let format = read_str_attr(&f, path, "format")
        .map_err(|_| bad("not a torusrec model (no root attribute `format`)".into()))?;
    if format != FORMAT {
        return Err(bad(format!(
            "not a torusrec model: its format is {format:?}, a model's is {FORMAT:?} (`embed --out M.h5` writes one)"
        )));
    }
    let version = read_u64_attr(&f, path, "version")?;
    if version > VERSION {
        return Err(bad(format!(
            "model version {version}; this build reads version {VERSION} and older"
        )));
    }
    let json = read_str_attr(&f, path, "spec")?;
    let spec: ModelSpec = serde_json::from_str(&json)
        .map_err(|e| bad(format!("root attribute spec is not a model spec: {e}")))?;
    spec.validate(&crate::error::short_path(path))?;
    let step = read_u64_attr(&f, path, "step")?;
    let seed = read_u64_attr(&f, path, "seed")?;
    let f64_attr = |name: &str| f.attr(name).ok().and_then(|a| a.read_scalar::<f64>().ok());
    let (auc, logloss) = (f64_attr("auc"), f64_attr("logloss"));
    let mut hash_entries = vec![0; spec.tables.len()];
    let mut hash_writers = vec![0; spec.tables.len()];
    for (t, ts) in spec.tables.iter().enumerate() {
        if ts.vocab_kind != VocabKind::Hash {
            continue;
        }
        let name = format!("/tables/{t}/entries_per_rank");
        let per_rank: Vec<u64> = f
            .dataset(&name)
            .and_then(|d| d.read_raw())
            .map_err(|_| bad(format!("hash table {t}: dataset {name} is missing")))?;
        hash_entries[t] = per_rank.iter().sum();
        hash_writers[t] = per_rank.len();
    }
    Ok(ModelHeader {
        spec,
        step,
        seed,
        hash_entries,
        hash_writers,
        auc,
        logloss,
    })
}

/// The model's tables and dense features against the click log's (`data`, at
/// `data_path`): the same number of tables with the same names in the same order,
/// the same number of dense features. Refused otherwise (exit 2, naming both files).
pub fn local_check_data(
    model: &ModelSpec,
    model_path: &Path,
    data: &ModelSpec,
    data_path: &Path,
) -> Result<()> {
    let (m, d) = (
        crate::error::short_path(model_path),
        crate::error::short_path(data_path),
    );
    let names =
        |s: &ModelSpec| -> Vec<String> { s.tables.iter().map(|t| t.name.clone()).collect() };
    if model.n_dense != data.n_dense {
        return Err(Error::Config(format!(
            "the model {m} has {} dense features, the click log {d} {}",
            model.n_dense, data.n_dense
        )));
    }
    if names(model) != names(data) {
        return Err(Error::Config(format!(
            "the model {m} has tables {:?}, the click log {d} {:?} (the same tables in the same order are needed)",
            names(model),
            names(data)
        )));
    }
    Ok(())
}

/// The spec to score with on `world` ranks: the model's, but a hash table written by
/// another rank count (re-sharded by key on load) gets room for all of its entries on
/// any rank (capacity `max(capacity, 2 E + 64 P)`: a lookup finds the same rows
/// whatever the capacity).
pub fn scoring_spec(h: &ModelHeader, world: usize) -> ModelSpec {
    let mut spec = h.spec.clone();
    for (t, ts) in spec.tables.iter_mut().enumerate() {
        if ts.vocab_kind == VocabKind::Hash && h.hash_writers[t] != world {
            ts.vocab = ts.vocab.max(2 * h.hash_entries[t] + 64 * world as u64);
        }
    }
    spec
}

/// Collective: every rank must call. The model of `h` (from the file at `path`) on
/// this run's ranks (every table row-cyclic over all ranks), scoring the examples of
/// `source` (all of them held out: [`Source::eval_batch`]) with `ids` in chunks of
/// `chunk` examples per rank.
pub fn global_load<C: Comm>(
    comm: &C,
    h: &ModelHeader,
    path: &Path,
    source: Source,
    ids: IdMap,
    chunk: usize,
) -> Result<EmbedTrainer> {
    let spec = scoring_spec(h, comm.size());
    let examples = source.eval_examples().unwrap_or(0);
    let cfg = EmbedConfig {
        eval_examples: examples,
        ids,
        ..EmbedConfig::new(
            spec.clone(),
            h.seed,
            chunk.max(1),
            0,
            TableOpt::Sgd { lr: 0.0, wd: 0.0 },
        )
    };
    let plan = Plan::uniform(&spec, comm.size(), "row_cyclic")?;
    let mut tr = comm.agree(EmbedTrainer::new(cfg, source, &plan, comm.rank()))?;
    let loaded = crate::embed::io::checkpoint::local_load_model(&mut tr, path);
    let (_, dropped) = comm.agree(loaded)?;
    let dropped = comm.all_reduce_max(dropped);
    if dropped > 0 {
        return Err(Error::Check(format!(
            "{}: {dropped} hash-table entries did not fit a rank's share on {} rank(s)",
            path.display(),
            comm.size()
        )));
    }
    tr.step = h.step;
    Ok(tr)
}

/// This rank's scores: the logits and labels of its examples `first..first + n`.
#[derive(Clone, Debug, Default)]
pub struct Scored {
    pub first: u64,
    pub logits: Vec<f32>,
    pub labels: Vec<f32>,
}

/// Collective: every rank must call. Score every example of `tr`'s source in chunks
/// of `tr.cfg.micro` examples fixed by the global example index (chunk `c` is the
/// examples `c M .. (c + 1) M`), rank `r` the contiguous block `r` of the chunks
/// ([`block_range`]), one chunk per round (every rank takes part in the same number of
/// exchanges, an idle one with none); hash tables looked up at the model's step
/// without counting. Each chunk is scored alone, as the same rows whatever the rank
/// count: the scores' bits do not depend on it (they may on the chunk size, through
/// the blocking of the dense model's matrix products).
pub fn global_score<C: Comm>(comm: &C, tr: &mut EmbedTrainer) -> Result<Scored> {
    let total = tr.cfg.eval_examples;
    let chunk = tr.cfg.micro.max(1) as u64;
    let chunks = total.div_ceil(chunk);
    let (c_lo, c_hi) = block_range(chunks, comm.size(), comm.rank());
    let rounds = chunks.div_ceil(comm.size() as u64);
    let width = tr.cfg.spec.mlp_input();
    let mut ws = DenseWorkspace::default();
    let mut keys = ResolveBufs::default();
    let mut out = Scored {
        first: (c_lo * chunk).min(total),
        ..Scored::default()
    };
    for i in 0..rounds {
        let c = c_lo + i;
        let (a, n) = if c < c_hi {
            let a = c * chunk;
            (a, (total - a).min(chunk) as usize)
        } else {
            (total, 0)
        };
        let read = || -> Result<crate::data::clicks::batch::Batch> {
            let mut b = tr.source.eval_batch(a.min(total), n)?;
            let what = || format!("{} (examples {a}..{})", tr.source.describe(), a + n as u64);
            tr.cfg.ids.apply(&mut b, &what)?;
            Ok(b)
        };
        let mut batch = comm.agree(read())?;
        let how = Resolve::Lookup { step: tr.step };
        global_resolve(comm, &mut tr.store, &mut batch, how, &mut keys)?;
        let (mut lk, _) = global_lookup(comm, &tr.store, &batch, true)?;
        pool(&tr.store, &batch, &mut lk);
        let xv = ArrayView2::from_shape((batch.n, width), &lk.x)
            .map_err(|e| Error::Comm(format!("the MLP input: {e}")))?;
        out.logits.extend(tr.mlp.predict(xv, &mut ws));
        out.labels.extend_from_slice(&batch.labels);
    }
    Ok(out)
}

/// The click probability of a logit, `1 / (1 + exp(-z))` in f64.
pub fn probability(logit: f32) -> f64 {
    1.0 / (1.0 + (-(logit as f64)).exp())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probability_is_the_logistic_function() {
        assert_eq!(probability(0.0), 0.5);
        let p = probability(2.0);
        assert!((p - 0.880_797_077_977_882_3).abs() < 1e-15);
        assert!((probability(-2.0) - (1.0 - p)).abs() < 1e-15);
        assert!(probability(-800.0) >= 0.0 && probability(800.0) <= 1.0);
    }
}
