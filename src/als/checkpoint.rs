//! iALS checkpoints: both tables by global id plus a manifest with everything exact
//! resume needs, committed and verified by the shared protocol of
//! [`crate::ckpt::commit`]. Restores on any number of ranks; refuses (training hold)
//! when the manifest, the data or a checksum does not match.

use super::model::{global_write_tables, local_checksum, local_read_rows, TablePart, TableScalar};
use super::AlsConfig;
use crate::ckpt::commit::{self, Header};
use crate::ckpt::{self, SCHEMA};
use crate::comm::Comm;
use crate::data::graph::prepare::SplitMeta;
use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Where training stands: completed epochs, the half-epoch under way (0 rows, 1
/// columns), completed steps of it and the rows of its solved side already done.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Position {
    pub epoch: usize,
    pub half: u8,
    pub step: usize,
    pub done: Vec<(u64, u64)>,
    /// The loss after this epoch's row half, when `half == 1`.
    pub loss_rows: Option<f64>,
    /// The loss after the last completed epoch (reported by a run resumed after its
    /// last epoch, which trains none).
    #[serde(default)]
    pub loss: Option<f64>,
}

/// The basis the tables of a checkpoint are in, when training in the eigenbasis
/// (`--basis eigen`, see `solve::basis`), as f64 bit patterns (an exact JSON round
/// trip). Both empty: the starting basis (and every checkpoint written before this
/// existed).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BasisState {
    /// The accumulated rotation `R` (row-major `d x d`): the tables are the
    /// starting-basis tables times `R`.
    #[serde(default)]
    pub rotation: Vec<u64>,
    /// The fixed side's Gramian, diagonal in this basis, of the half under way once its
    /// rotation is done.
    #[serde(default)]
    pub fixed_diag: Vec<u64>,
}

/// The basis the tables are in, in memory (see [`BasisState`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Basis {
    /// The accumulated rotation `R` (row-major `d x d`; `None`: the starting basis).
    pub rotation: Option<Vec<f64>>,
    /// The fixed side's diagonal Gramian, once the half under way has rotated.
    pub fixed_diag: Option<Vec<f64>>,
}

impl BasisState {
    pub fn new(b: &Basis) -> Self {
        let bits = |v: &Option<Vec<f64>>| {
            v.as_ref()
                .map_or(Vec::new(), |v| v.iter().map(|x| x.to_bits()).collect())
        };
        BasisState {
            rotation: bits(&b.rotation),
            fixed_diag: bits(&b.fixed_diag),
        }
    }

    /// The basis in memory, its lengths checked against `d`.
    pub fn to_basis(&self, d: usize) -> std::result::Result<Basis, String> {
        let val = |v: &[u64], n: usize, what: &str| match v.len() {
            0 => Ok(None),
            k if k == n => Ok(Some(v.iter().map(|&b| f64::from_bits(b)).collect())),
            k => Err(format!(
                "the manifest's basis {what} has {k} values, expected {n}"
            )),
        };
        Ok(Basis {
            rotation: val(&self.rotation, d * d, "rotation")?,
            fixed_diag: val(&self.fixed_diag, d, "diagonal")?,
        })
    }
}

/// What identifies the prepared data a checkpoint belongs to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DataIdentity {
    pub num_rows: u64,
    pub num_cols: u64,
    pub train_nnz: u64,
    pub split_seed: u64,
    pub source: String,
}

/// A checksum per dataset of the file, by global id (independent of the rank count).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DatasetSum {
    pub name: String,
    pub rows: u64,
    pub cols: usize,
    pub checksum: String,
}

/// The manifest, stored as the JSON attribute `manifest` of the checkpoint file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub schema: u32,
    pub workload: String,
    pub config: super::AlsConfig,
    pub config_hash: String,
    pub data: DataIdentity,
    pub position: Position,
    pub global_step: u64,
    pub steps_per_half: usize,
    pub world_size: usize,
    /// The seed every random value derives from (with the global id); iALS draws no
    /// other random numbers, so this is its whole RNG state.
    pub seed: u64,
    pub datasets: Vec<DatasetSum>,
    pub written_at: u64,
    /// The basis the tables are in (`--basis eigen`).
    #[serde(default)]
    pub basis: BasisState,
}

impl commit::Manifest for Manifest {
    const WORKLOAD: &'static str = "als";
    fn header(&self) -> Header<'_> {
        Header {
            schema: self.schema,
            workload: &self.workload,
            config_hash: &self.config_hash,
        }
    }
}

/// What a checkpoint holds of a training run, lent by the trainer (this module does
/// not depend on the training loop): its configuration, data, position, and this
/// rank's rows `w_rows` of W and `h_rows` of H.
pub struct RunState<'a, T> {
    pub cfg: &'a AlsConfig,
    pub meta: &'a SplitMeta,
    pub pos: &'a Position,
    pub steps_per_half: usize,
    /// This rank's training arcs (their sum over ranks identifies the data).
    pub train_nnz: u64,
    pub w_rows: std::ops::Range<u64>,
    pub h_rows: std::ops::Range<u64>,
    pub w: &'a [T],
    pub h: &'a [T],
    pub basis: BasisState,
}

fn identity<C: Comm, T>(comm: &C, tr: &RunState<T>) -> DataIdentity {
    let m = tr.meta;
    let mut nnz = [tr.train_nnz];
    comm.all_reduce_sum(&mut nnz);
    DataIdentity {
        num_rows: m.num_rows,
        num_cols: m.num_cols,
        train_nnz: nnz[0],
        split_seed: m.seed,
        source: m.source.clone(),
    }
}

fn global_sums<C: Comm>(comm: &C, w: u64, h: u64) -> [u64; 2] {
    let mut c = [w, h];
    comm.all_reduce_sum(&mut c);
    c
}

/// Collective: every rank must call. Writes `ckpt-<step>.h5` atomically into the
/// checkpoint directory, then applies the retention policy ([`ckpt::commit`]).
pub fn global_write_checkpoint<C: Comm, T: TableScalar>(
    comm: &C,
    tr: &RunState<T>,
    step: u64,
) -> Result<PathBuf> {
    let dir = tr
        .cfg
        .checkpoint
        .dir
        .clone()
        .ok_or_else(|| Error::Config("no --checkpoint-dir".into()))?;
    let d = tr.cfg.dim;
    let m = tr.meta;
    let manifest = || -> Result<Manifest> {
        let cw = local_checksum(tr.w, tr.w_rows.start, d, 1);
        let ch = local_checksum(tr.h, tr.h_rows.start, d, 2);
        let [sw, sh] = global_sums(comm, cw, ch);
        Ok(Manifest {
            schema: SCHEMA,
            workload: "als".into(),
            config: tr.cfg.clone(),
            config_hash: tr.cfg.result_hash(),
            data: identity(comm, tr),
            position: tr.pos.clone(),
            global_step: step,
            steps_per_half: tr.steps_per_half,
            world_size: comm.size(),
            seed: tr.cfg.seed,
            datasets: vec![
                DatasetSum {
                    name: "W".into(),
                    rows: m.num_rows,
                    cols: d,
                    checksum: format!("{sw:016x}"),
                },
                DatasetSum {
                    name: "H".into(),
                    rows: m.num_cols,
                    cols: d,
                    checksum: format!("{sh:016x}"),
                },
            ],
            written_at: ckpt::now_secs(),
            basis: tr.basis.clone(),
        })
    };
    let tables = [
        TablePart {
            name: "W",
            n: m.num_rows,
            lo: tr.w_rows.start,
            data: tr.w,
        },
        TablePart {
            name: "H",
            n: m.num_cols,
            lo: tr.h_rows.start,
            data: tr.h,
        },
    ];
    let p = tr.pos;
    commit::global_write_checkpoint(
        comm,
        &dir,
        step,
        tr.cfg.checkpoint.keep,
        &format!("epoch {}, half {}, step {}", p.epoch, p.half, p.step),
        manifest,
        |path, attrs| global_write_tables(comm, path, d, &tables, attrs),
    )
}

/// Rank-local: read the manifest of `path` (format checked).
pub fn local_read_manifest(path: &Path) -> Result<Manifest> {
    commit::local_read_manifest(path)
}

/// Collective: every rank must call. Read the checkpoint at `path` for this trainer's
/// shards (any world size), verifying the manifest against the run and every
/// dataset's checksum. Errors (exit 76) name the file and dataset: `Error::Corrupt`
/// for a file that fails verification, `Error::Hold` for one written by another run.
pub fn global_restore<C: Comm, T: TableScalar>(
    comm: &C,
    tr: &RunState<T>,
    path: &Path,
) -> Result<(Manifest, Vec<T>, Vec<T>)> {
    let _p = comm.stats().phase("io");
    let d = tr.cfg.dim;
    let want_data = identity(comm, tr);
    let local = (|| -> Result<(Manifest, Vec<T>, Vec<T>)> {
        let m = local_read_manifest(path)?;
        commit::check_workload(path, &m)?;
        if m.config.table_dtype != tr.cfg.table_dtype {
            return Err(commit::hold(path, format!(
                "the checkpoint's tables are {}, this run asks for {} (--table-dtype {}); resume with --table-dtype {}",
                m.config.table_dtype,
                tr.cfg.table_dtype,
                tr.cfg.table_dtype,
                m.config.table_dtype
            )));
        }
        commit::check_config_hash(
            path,
            &m,
            &tr.cfg.result_hash(),
            "dim, reg, unobserved weight, confidence, solver, CG steps, seed, init std, hub chunk, step size and basis",
        )?;
        if m.data != want_data {
            return Err(commit::hold(
                path,
                format!(
                    "written for data {:?}, but this run's data is {want_data:?}",
                    m.data
                ),
            ));
        }
        if let Err(e) = m.basis.to_basis(d) {
            return Err(Error::Corrupt(format!("{}: {e}", path.display())));
        }
        if m.steps_per_half != tr.steps_per_half {
            return Err(commit::hold(
                path,
                format!(
                    "{} steps per half-epoch, this run has {}",
                    m.steps_per_half, tr.steps_per_half
                ),
            ));
        }
        let f = commit::local_open(path)?;
        let w = local_read_rows(&f, path, "W", tr.w_rows.start, tr.w_rows.end, d)?;
        let h = local_read_rows(&f, path, "H", tr.h_rows.start, tr.h_rows.end, d)?;
        Ok((m, w, h))
    })();
    let (m, w, h) = comm.agree(local)?;
    let cw = local_checksum(&w, tr.w_rows.start, d, 1);
    let ch = local_checksum(&h, tr.h_rows.start, d, 2);
    let [sw, sh] = global_sums(comm, cw, ch);
    for (name, got) in [("W", sw), ("H", sh)] {
        let want = m
            .datasets
            .iter()
            .find(|x| x.name == name)
            .map(|x| x.checksum.clone())
            .unwrap_or_default();
        commit::check_checksum(
            path,
            &format!("dataset /{name}"),
            &format!("{got:016x}"),
            &want,
        )?;
    }
    Ok((m, w, h))
}
