//! Checkpoints of the embedding model: every table and its optimizer state by global
//! row id (so a run resumes on any rank count and any plan), the MLP and its optimizer
//! state, the step (the data cursor: examples are a function of the step), and a
//! manifest with the configuration hash and a placement-independent checksum.
//!
//! Layout of `ckpt-<step>.h5`: `/tables/<t>/rows` [vocab, dim] f32,
//! `/tables/<t>/state` [vocab, s] f32 (s = optimizer floats per row, absent for SGD),
//! `/mlp/params` [n] f32, `/mlp/state` [m] f32 (the layout and the writer of
//! [`super::model_file`]); root attributes `format` ("torusrec-checkpoint") and `manifest`
//! (JSON). Committed and verified by the shared protocol of [`crate::ckpt::commit`]:
//! written through `*.partial` (rank 0 creates it, every rank writes its shards in
//! turn, replicas: rank 0; rank 0 renames it); restore checks the manifest and the
//! checksum (exit 76 otherwise). With `--checkpoint-full-every N > 1` most checkpoints
//! are deltas on the previous one ([`super::delta`]); restore applies the chain.

use std::path::{Path, PathBuf};

use ndarray::s;
use serde::{Deserialize, Serialize};

use super::config_hash::config_hash;
use super::delta::{Chain, DeltaDtype, DeltaInfo};
use super::hashio::{Restored, RowsFrom};
use super::model_file::{global_write_state, row_slab};
use crate::ckpt::commit::{self, corrupt, Header};
use crate::ckpt::{self, SCHEMA};
use crate::comm::Comm;
use crate::embed::dense::mlp::DenseOptState;
use crate::embed::train::trainer::EmbedTrainer;
use crate::spec::{ModelSpec, VocabKind};
use crate::{Error, Result};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EmbedManifest {
    pub schema: u32,
    pub workload: String,
    /// Hash of the configuration a resume must keep (see [`config_hash`]); the bits
    /// also depend on the rank count, plan, thread count and the MLP's GEMM kernel.
    pub config_hash: String,
    pub spec_digest: String,
    /// Optimizer steps done; the next step's examples follow from it.
    pub step: u64,
    pub dense_step: u64,
    pub world_size: usize,
    pub seed: u64,
    pub checksum: String,
    pub written_at: u64,
    /// The MLP's GEMM kernel of the writing run (`Gemm::name`; empty in older files).
    #[serde(default)]
    pub dense_gemm: String,
    /// An incremental checkpoint's chain (absent in a full checkpoint, [`super::delta`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delta: Option<Box<DeltaInfo>>,
}

impl commit::Manifest for EmbedManifest {
    const WORKLOAD: &'static str = "embed";
    fn header(&self) -> Header<'_> {
        Header {
            schema: self.schema,
            workload: &self.workload,
            config_hash: &self.config_hash,
        }
    }
}

/// Collective: every rank must call. Writes the full checkpoint `ckpt-<step>.h5`
/// into `dir` and applies the retention policy (`keep`).
pub fn global_write_checkpoint<C: Comm>(
    comm: &C,
    tr: &EmbedTrainer,
    dir: &Path,
    keep: usize,
) -> Result<PathBuf> {
    global_write(comm, tr, dir, keep, None).map(|(p, _)| p)
}

/// Collective: every rank must call. Writes `ckpt-<step>.h5` into `dir`, full or a
/// delta on `chain`'s base (as its policy says), and applies the retention policy
/// (`keep`, never breaking a retained checkpoint's chain). On success the changed
/// rows are forgotten and `chain` moves to the new checkpoint.
pub fn global_write_checkpoint_on<C: Comm>(
    comm: &C,
    tr: &mut EmbedTrainer,
    dir: &Path,
    keep: usize,
    chain: &mut Chain,
) -> Result<PathBuf> {
    if let Some(d) = &mut tr.dirty {
        d.absorb_renewed(&mut tr.store);
    }
    let mut delta = chain.next(tr.step);
    if let Some(d) = &mut delta {
        d.rows = super::delta::global_delta_rows(comm, tr);
    }
    let n = delta.as_ref().map_or(0, |d| d.chain);
    let (path, json) = global_write(comm, tr, dir, keep, delta)?;
    chain.committed(&path, &json, n);
    if let Some(d) = &mut tr.dirty {
        d.clear();
    }
    Ok(path)
}

/// [`global_write_checkpoint_on`] of a full checkpoint (`delta` `None`) or of the
/// delta `delta`: the path and the manifest's JSON.
fn global_write<C: Comm>(
    comm: &C,
    tr: &EmbedTrainer,
    dir: &Path,
    keep: usize,
    delta: Option<DeltaInfo>,
) -> Result<(PathBuf, String)> {
    let m = EmbedManifest {
        schema: SCHEMA,
        workload: "embed".into(),
        config_hash: config_hash(tr),
        spec_digest: tr.cfg.spec.digest(),
        step: tr.step,
        dense_step: tr.dense_state.step(),
        world_size: comm.size(),
        seed: tr.cfg.seed,
        checksum: format!("{:016x}", tr.global_checksum(comm)?),
        written_at: ckpt::now_secs(),
        dense_gemm: tr.cfg.dense_gemm.name().to_string(),
        delta: delta.clone().map(Box::new),
    };
    let json = serde_json::to_string(&m).map_err(|e| Error::Config(e.to_string()))?;
    let describe = match &delta {
        None => format!("step {}", tr.step),
        Some(d) => format!(
            "step {}, delta {} on {}: {} changed rows, {:?}",
            tr.step, d.chain, d.file, d.rows, d.dtype
        ),
    };
    let t = tr;
    let path = commit::global_write_checkpoint(
        comm,
        dir,
        t.step,
        keep,
        &describe,
        || Ok(m),
        |path, attrs| {
            // The model, for a warm start from this checkpoint (`--init-from`).
            let spec = serde_json::to_string(&t.cfg.spec)
                .map_err(|e| Error::Config(format!("spec to JSON: {e}")))?;
            let mut attrs = attrs.to_vec();
            attrs.push(("spec", crate::io::h5::Attr::Str(spec)));
            match &delta {
                None => global_write_state(comm, t, path, &attrs),
                Some(d) => super::delta::global_write_delta(comm, t, path, &attrs, d.dtype),
            }
        },
    )?;
    Ok((path, json))
}

/// Rank-local: the manifest of a checkpoint file (format checked).
pub fn local_read_manifest(path: &Path) -> Result<EmbedManifest> {
    commit::local_read_manifest(path)
}

/// Collective: every rank must call. Load the checkpoint into `tr` (whose plan and
/// rank count may differ from the writer's) and verify it.
pub fn global_restore<C: Comm>(
    comm: &C,
    tr: &mut EmbedTrainer,
    path: &Path,
) -> Result<EmbedManifest> {
    let _p = comm.stats().phase("io");
    let want_hash = config_hash(tr);
    let local = (|| -> Result<(EmbedManifest, Option<DeltaDtype>)> {
        let m = local_read_manifest(path)?;
        commit::check_workload(path, &m)?;
        super::model_file::check_table_dtype(path, tr.cfg.spec.table_dtype)?;
        commit::check_config_hash(
            path,
            &m,
            &want_hash,
            "model, seed, batch, accumulation, optimizers and pipelining",
        )?;
        let (r, lossy) = local_load(tr, path, Some(m.dense_step), false)?;
        if r.dropped > 0 {
            return Err(Error::Config(format!(
                "{}: on {} rank(s), {} hash-table entries of this rank do not fit its share of the capacity (the keys spread unevenly over owners); resume with a larger --capacity through --init-from, or on the writer's {} rank(s)",
                path.display(),
                tr.store.plan.world,
                r.dropped,
                m.world_size
            )));
        }
        Ok((m, lossy))
    })();
    let (m, lossy) = comm.agree(local)?;
    tr.step = m.step;
    let got = format!("{:016x}", tr.global_checksum(comm)?);
    if let Some(dtype) = lossy {
        // The rows were rounded: the checksum of the writer's state cannot match.
        if comm.rank() == 0 {
            let d = dtype.name();
            log::warn!(
                "{}: restored from a chain with {d} deltas (--ckpt-delta-dtype {d}, lossy): the rows are rounded, this run is not the uninterrupted one's bit for bit (checksum {got}, the writer's {})",
                path.display(),
                m.checksum
            );
        }
    } else {
        commit::check_checksum(path, "the tables and MLP", &got, &m.checksum)?;
    }
    Ok(m)
}

/// Rank-local: load the tables, their optimizer state, the MLP and its optimizer
/// state from the checkpoint at `path` into `tr` (whose plan and rank count may
/// differ from the writer's): a full checkpoint or model file, or a delta's chain
/// (its full checkpoint, then each delta in order). `warm`: a warm start (hash
/// tables' entries count as seen at step 0). `dense_step` `None`: the dense
/// optimizer's state is not read (a model to score with, [`local_load_model`]).
/// Also returns the dtype of the chain's first lossy (bf16, int8) delta, if any.
fn local_load(
    tr: &mut EmbedTrainer,
    path: &Path,
    dense_step: Option<u64>,
    warm: bool,
) -> Result<(Restored, Option<DeltaDtype>)> {
    let chain = super::delta::local_chain(path)?;
    let base = &chain[0].0;
    let deltas: Vec<(PathBuf, DeltaDtype)> = chain[1..]
        .iter()
        .map(|(p, d)| (p.clone(), d.as_ref().map_or(DeltaDtype::F32, |d| d.dtype)))
        .collect();
    let lossy = deltas.iter().map(|d| d.1).find(|d| d.is_lossy());
    let mut restored = local_load_full(tr, base, dense_step, warm, deltas.is_empty())?;
    for (p, dtype) in &deltas {
        let f = super::delta::local_apply(&mut tr.store, p, *dtype)?;
        local_read_dense(tr, &f, p, dense_step)?;
    }
    if let Some((last, _)) = deltas.last() {
        // A chain's hash tables: the entries of its last checkpoint, each row from
        // the newest checkpoint that holds it.
        let f = commit::local_open(last)?;
        let rows = RowsFrom::Chain {
            base,
            deltas: &deltas,
        };
        restored = restored.and(local_load_hash(tr, &f, last, warm, rows)?);
    }
    restored.exact &= lossy.is_none();
    Ok((restored, lossy))
}

/// [`local_load`] of one full checkpoint or model file (its hash tables too when
/// `hash`).
fn local_load_full(
    tr: &mut EmbedTrainer,
    path: &Path,
    dense_step: Option<u64>,
    warm: bool,
    hash: bool,
) -> Result<Restored> {
    let f = commit::local_open(path)?;
    // Into the shards' own buffers (kept: they are on huge pages).
    let read_into = |name: &str,
                     vocab: usize,
                     sel: (usize, usize, usize),
                     cols: std::ops::Range<usize>,
                     width: usize,
                     dst: &mut [f32]|
     -> Result<()> {
        let ds = f
            .dataset(name)
            .map_err(|_| corrupt(path, format!("dataset {name} is missing")))?;
        let shape = ds.shape();
        if shape != [vocab, width] {
            return Err(corrupt(
                path,
                format!("dataset {name} has shape {shape:?}, the model {vocab} x {width}"),
            ));
        }
        let (a, step, n) = sel;
        if n == 0 {
            return Ok(());
        }
        let x = ds
            .read_slice_2d::<f32, _>(s![a..a + (n - 1) * step + 1;step, cols])
            .map_err(|e| corrupt(path, format!("dataset {name} is unreadable: {e}")))?;
        if x.len() != dst.len() {
            return Err(corrupt(
                path,
                format!(
                    "dataset {name}: {} values for a shard of {}",
                    x.len(),
                    dst.len()
                ),
            ));
        }
        dst.iter_mut().zip(x.iter()).for_each(|(d, &v)| *d = v);
        Ok(())
    };
    let spec = &tr.store.spec;
    for ls in tr.store.local.iter_mut() {
        let t = ls.shard.table;
        if spec.tables[t].vocab_kind == VocabKind::Hash {
            continue;
        }
        let sp = tr.store.opt.state_per_row(spec.tables[t].dim);
        let (dim, vocab) = (
            tr.cfg.spec.tables[t].dim,
            tr.cfg.spec.tables[t].vocab as usize,
        );
        let sel = row_slab(ls.shard.rows, ls.rows);
        let name = format!("/tables/{t}/rows");
        let cols = ls.shard.cols.clone();
        ls.fill_rows_f32(|rows| read_into(&name, vocab, sel, cols, dim, rows))?;
        if sp > 0 {
            let name = format!("/tables/{t}/state");
            read_into(&name, vocab, sel, 0..sp, sp, &mut ls.state)?;
        }
    }
    let restored = match hash {
        true => local_load_hash(tr, &f, path, warm, RowsFrom::Here)?,
        false => Restored {
            exact: true,
            ..Default::default()
        },
    };
    local_read_dense(tr, &f, path, dense_step)?;
    Ok(restored)
}

/// The hash tables this rank holds a shard of, from the checkpoint `f` at `path`
/// (the entries; their rows from `rows`).
fn local_load_hash(
    tr: &mut EmbedTrainer,
    f: &hdf5::File,
    path: &Path,
    warm: bool,
    rows: RowsFrom<'_>,
) -> Result<Restored> {
    let mut restored = Restored {
        exact: true,
        ..Default::default()
    };
    for t in 0..tr.cfg.spec.tables.len() {
        if tr.store.hash[t].is_some() {
            let r = super::hashio::local_restore(f, path, &mut tr.store, t, warm, rows)?;
            restored = restored.and(r);
        }
    }
    Ok(restored)
}

/// Rank-local: the MLP's parameters (and with `dense_step`, its optimizer's state at
/// that step) from the checkpoint `f` at `path`.
fn local_read_dense(
    tr: &mut EmbedTrainer,
    f: &hdf5::File,
    path: &Path,
    dense_step: Option<u64>,
) -> Result<()> {
    let read1 = |name: &str, n: usize| -> Result<Vec<f32>> {
        let ds = f
            .dataset(name)
            .map_err(|_| corrupt(path, format!("dataset {name} is missing")))?;
        let v: Vec<f32> = ds
            .read_raw()
            .map_err(|e| corrupt(path, format!("dataset {name} is unreadable: {e}")))?;
        if v.len() != n {
            return Err(corrupt(
                path,
                format!("dataset {name} has {} values, expected {n}", v.len()),
            ));
        }
        Ok(v)
    };
    let params = read1("/mlp/params", tr.mlp.n_params())?;
    tr.mlp.set_flat(&params);
    if let Some(dense_step) = dense_step {
        let st = read1("/mlp/state", tr.dense_state.state().len())?;
        tr.dense_state = DenseOptState::from_parts(st, dense_step);
    }
    Ok(())
}

/// Rank-local: the tables' rows (and, when `tr`'s table optimizer keeps any, their
/// state), the hash tables' entries as they were (not a warm start: their counts and
/// last-seen steps kept) and the dense parameters of the model file or checkpoint at
/// `path`, into `tr`, whose plan and rank count may differ from the writer's. The
/// dense optimizer's state is not read. Returns the hash-table entries placed and
/// those that did not fit this rank's share (`(entries, dropped)`).
pub fn local_load_model(tr: &mut EmbedTrainer, path: &Path) -> Result<(u64, u64)> {
    let (r, _) = local_load(tr, path, None, false)?;
    Ok((r.entries, r.dropped))
}

/// What a model needs to match to start from another run's checkpoint: its tables
/// (names, widths, vocabulary kinds, and the rows of fixed and modulo tables), its
/// dense features and MLP. Hash tables may change capacity, admission and eviction.
fn warm_start_key(spec: &ModelSpec) -> String {
    let tables: Vec<String> = spec
        .tables
        .iter()
        .map(|t| {
            let rows = if t.vocab_kind == VocabKind::Hash {
                0
            } else {
                t.vocab
            };
            format!("{}:{}:{:?}:{rows}", t.name, t.dim, t.vocab_kind)
        })
        .collect();
    format!(
        "{} | {} | {:?}",
        tables.join(","),
        spec.n_dense,
        spec.hidden
    )
}

/// Rank-local: the model a checkpoint (or model file) was written for (`None` for
/// files written before it was recorded).
pub fn local_read_spec(path: &Path) -> Result<Option<ModelSpec>> {
    let f = commit::local_open(path)?;
    let Ok(json) = crate::io::h5::read_str_attr(&f, path, "spec") else {
        return Ok(None);
    };
    serde_json::from_str(&json)
        .map(Some)
        .map_err(|e| corrupt(path, format!("the model's spec is unreadable: {e}")))
}

/// The checkpoint `--init-from` names: a file, or the newest checkpoint in a directory.
pub fn init_from_path(p: &Path) -> Result<PathBuf> {
    if p.is_dir() {
        let newest = ckpt::list(p)?
            .into_iter()
            .max_by_key(|(step, _)| *step)
            .ok_or_else(|| Error::input(p, "--init-from: no checkpoint in this directory"))?;
        Ok(newest.1)
    } else if p.exists() {
        Ok(p.to_path_buf())
    } else {
        Err(Error::input(
            p,
            "--init-from: no such checkpoint file or directory",
        ))
    }
}

/// What a warm start loaded.
#[derive(Clone, Debug)]
pub struct WarmStart {
    pub path: PathBuf,
    pub manifest: EmbedManifest,
    /// Hash-table entries placed on this rank count and those that did not fit (over
    /// all ranks).
    pub entries: u64,
    pub dropped: u64,
}

/// Collective: every rank must call. `--init-from`: load another run's checkpoint
/// `path` (any rank count and plan, verified by its checksum when the tables go back
/// as they were) into `tr` as the start of a new run: step 0, this run's data.
pub fn global_init_from<C: Comm>(
    comm: &C,
    tr: &mut EmbedTrainer,
    path: &Path,
) -> Result<WarmStart> {
    let _p = comm.stats().phase("io");
    let local = (|| -> Result<(EmbedManifest, Restored)> {
        let m = local_read_manifest(path)?;
        commit::check_workload(path, &m)?;
        if let Some(theirs) = local_read_spec(path)? {
            let (a, b) = (warm_start_key(&theirs), warm_start_key(&tr.cfg.spec));
            if a != b {
                return Err(Error::Config(format!(
                    "--init-from {}: its model differs from this run's (tables name:dim:vocabulary:rows, dense features, hidden layers)\n  checkpoint: {a}\n  this run:   {b}",
                    path.display()
                )));
            }
        }
        let (r, _) = local_load(tr, path, Some(m.dense_step), true)?;
        Ok((m, r))
    })();
    let (m, r) = comm.agree(local)?;
    let mut v = [r.entries, r.dropped];
    comm.all_reduce_sum(&mut v);
    tr.step = 0;
    Ok(WarmStart {
        path: path.to_path_buf(),
        manifest: m,
        entries: v[0],
        dropped: v[1],
    })
}
