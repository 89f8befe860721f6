//! The training loop: alternating half-epochs over the distributed tables, cut into
//! steps (row batches) at whose boundaries the ranks agree on preemption and on
//! non-finite values.

use super::checkpoint::{
    global_restore, global_write_checkpoint, Basis, BasisState, Manifest, Position, RunState,
};
use super::eval::{AutoChoice, EvalReport, EvalSet, Recall};
use super::model::{
    data_checksum_hex, global_write_tables, local_checksum, TablePart, DATA_CHECKSUM,
};
use super::shard::bounds::balance_by_nnz;
use super::shard::csr::{global_check_transpose, CsrShard};
use super::shard::exchange::ExchangePlan;
use super::shard::memory::{Layout, ShardSizes};
use super::shard::read::{global_read_shards_admitted, Shards};
use super::shard::spill::{
    local_spill_side, read_ahead_chunks, step_chunks, Chunk, ChunkReader, SpillSpec, SpilledSide,
};
use super::solve::{
    add_loss_terms_to_chunks, all_pairs_term, cg_solve, cg_solve_with_loss, cholesky_solve,
    eigenbasis, fold_loss_chunks, gramian, local_loss_terms, local_loss_terms_from, matmul64,
    rotate_rows, transpose64, LossTerms, RowsView, SolveError, SolveParams, LOSS_CHUNK,
};
use super::{AlsConfig, SolverKind};
use crate::bf16::TableElem;
use crate::ckpt::driver::{self as drive, Boundary, Status, Workload};
use crate::ckpt::{self, faults, signals::Preemption, status::StepStatus};
use crate::comm::Comm;
use crate::error::{Error, Result};
use crate::h5::Attr;
use crate::rng::{stream, SplitMix64};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Seconds per phase of one epoch (this rank's wall time; rank 0 reports its own).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct PhaseTimes {
    pub gramian: f64,
    pub exchange: f64,
    pub solve: f64,
    pub loss: f64,
    pub eval: f64,
    pub checkpoint: f64,
    /// `--basis eigen`: the eigendecompositions and the rotations of both tables (and,
    /// after the last epoch, the rotation back).
    #[serde(default)]
    pub basis: f64,
    /// Of `solve`: the seconds the solver waited for the spill's chunk reader (0 when
    /// the CSR is in memory). Near 0 means the disk keeps up.
    #[serde(default)]
    pub spill_wait: f64,
}

/// What one epoch did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EpochReport {
    pub epoch: usize,
    /// The loss after the row half-epoch and after the column half-epoch.
    /// `None` unless `--loss-every-half`.
    pub loss_rows: Option<f64>,
    pub loss: f64,
    pub recall: Option<Recall>,
    /// Training seconds: evaluation and checkpoints excluded.
    pub seconds: f64,
    pub edges_per_second: f64,
    /// Seconds of this epoch's evaluation (0 when it did not evaluate).
    #[serde(default)]
    pub eval_seconds: f64,
    /// Test rows the evaluation scored (0 when it did not evaluate).
    #[serde(default)]
    pub eval_rows: u64,
    /// The evaluation's scoring rate over all ranks, flop/s (0 when it did not
    /// evaluate).
    #[serde(default)]
    pub eval_flops_per_second: f64,
    /// `--eval-rows auto`: how the evaluated rows were chosen.
    #[serde(default)]
    pub eval_auto: Option<AutoChoice>,
    /// Bytes sent to other ranks by the embedding exchange this epoch, all ranks.
    pub exchange_bytes: u64,
    pub phases: PhaseTimes,
    /// The largest rank's peak resident memory so far (bytes).
    #[serde(default)]
    pub peak_rss_bytes: u64,
    /// Bytes this epoch read by system calls (the spilled CSR: all ranks), and the part
    /// of them fetched from storage rather than the page cache.
    #[serde(default)]
    pub read_bytes: u64,
    #[serde(default)]
    pub storage_read_bytes: u64,
    /// Per communication phase, the link traffic since the run started (busiest
    /// outgoing link, mean over links, all-to-all hops).
    #[serde(default)]
    pub links: Vec<(String, crate::comm::LinkSummary)>,
}

/// The end of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainReport {
    pub epochs: Vec<EpochReport>,
    pub recall: Option<Recall>,
    pub loss: f64,
    pub checksum: u64,
    pub row_imbalance: f64,
    pub col_imbalance: f64,
    /// The epoch the run started from (0 when fresh).
    pub resumed_from: Option<Position>,
}

pub use super::model::TableScalar;

/// Initial embedding of global id `id`: N(0, (init_std / sqrt(d))^2), from (seed, id),
/// rounded to the table's element type.
pub fn init_table<T: TableElem>(
    lo: u64,
    n: usize,
    d: usize,
    seed: u64,
    which: u64,
    init_std: f32,
) -> Vec<T> {
    let scale = init_std as f64 / (d as f64).sqrt();
    let mut t = crate::hugepages::huge_vec(n * d, T::default());
    for (i, row) in t.chunks_exact_mut(d.max(1)).enumerate() {
        let mut g = SplitMix64::for_id(seed, which, lo + i as u64);
        for x in row {
            *x = T::from_f32((g.next_normal() * scale) as f32);
        }
    }
    t
}

/// One side of the alternation on this rank: the rows it solves (their observed ids
/// rewritten to positions in the gathered fixed table, so the CSR is held once, in
/// memory or in a spill file), the plan that gathers the fixed rows, and its steps.
pub struct Side {
    /// The rows; `indices` empty when spilled.
    pub shard: CsrShard,
    /// The plan of the whole half's gather (`None` when the half gathers in blocks:
    /// each gather round builds its block's plan).
    pub plan: Option<ExchangePlan>,
    pub counts: Vec<u32>,
    /// `steps + 1` local row boundaries of the steps, balanced by non-zeros.
    pub step_bounds: Vec<u64>,
    /// The CSR's indices out of core (`None`: in `shard.indices`).
    pub spill: Option<SpilledSide>,
    /// The steps at which every rank runs a gather round: the union of every rank's
    /// gather-block starts (`[0]`: one gather per half).
    pub rounds: Vec<usize>,
}

impl Side {
    fn global_build<C: Comm>(
        comm: &C,
        cfg: &AlsConfig,
        mut shard: CsrShard,
        fixed_bounds: &[u64],
        steps: usize,
    ) -> Result<Self> {
        let plan =
            ExchangePlan::global_build(comm, cfg.exchange, &mut shard.indices, fixed_bounds)?;
        let counts = shard.counts();
        let step_bounds = balance_by_nnz(&shard.indptr, steps);
        Ok(Self {
            shard,
            plan: Some(plan),
            counts,
            step_bounds,
            spill: None,
            rounds: vec![0],
        })
    }

    /// Collective: every rank must call. [`Side::global_build`] for a shard left in
    /// the file: write its spill (checking and checksumming its arcs, which are
    /// returned), then agree on the gather rounds.
    #[allow(clippy::too_many_arguments)]
    fn global_build_spilled<C: Comm>(
        comm: &C,
        cfg: &AlsConfig,
        shard: CsrShard,
        fixed_bounds: &[u64],
        steps: usize,
        layout: &Layout,
        name: &str,
        transposed: bool,
    ) -> Result<(Self, [u64; 2])> {
        let step_bounds = balance_by_nnz(&shard.indptr, steps);
        let dir = cfg
            .memory
            .spill_dir
            .clone()
            .unwrap_or_else(std::env::temp_dir);
        let spec = SpillSpec {
            path: &cfg.data,
            name,
            shard: &shard,
            step_bounds: &step_bounds,
            bound: *fixed_bounds.last().unwrap_or(&0),
            transposed,
            gather_rows: (comm.size() > 1).then(|| layout.gather_rows.unwrap_or(u64::MAX)),
            chunk_elems: (layout.csr_buffer / 8).max(1),
            dir: &dir,
            rank: comm.rank(),
        };
        let spill = {
            let _p = comm.stats().phase("io");
            comm.agree(local_spill_side(&spec))?
        };
        let starts: Vec<u64> = spill.block_starts.iter().map(|&s| s as u64).collect();
        let mut rounds: Vec<usize> = {
            // Setup, as the spill itself (not a phase the projection prices).
            let _p = comm.stats().phase("io");
            comm.all_gather_v(&starts)?
                .data
                .into_iter()
                .map(|s| s as usize)
                .collect()
        };
        rounds.sort_unstable();
        rounds.dedup();
        let plan = if rounds.len() == 1 {
            let needed = if comm.size() > 1 {
                comm.agree(spill.needed(0))?
            } else {
                Vec::new()
            };
            Some(ExchangePlan::global_from_needed(
                comm,
                cfg.exchange,
                needed,
                fixed_bounds,
            )?)
        } else {
            None
        };
        let checksum = spill.checksum;
        let counts = shard.counts();
        Ok((
            Self {
                shard,
                plan,
                counts,
                step_bounds,
                spill: Some(spill),
                rounds,
            },
            checksum,
        ))
    }

    /// Rows of local steps `s0..s1`.
    fn step_rows(&self, s0: usize, s1: usize) -> (usize, usize) {
        (self.step_bounds[s0] as usize, self.step_bounds[s1] as usize)
    }

    /// Rank-local: read the indices of local rows `r0..r1` of a spilled side; returns
    /// the rows' `indptr` from 0 and the indices.
    fn read_rows(&self, r0: usize, r1: usize) -> Result<(Vec<u64>, Vec<u32>)> {
        let ip = &self.shard.indptr;
        let (a, b) = (ip[r0], ip[r1]);
        let mut indices = Vec::new();
        if let Some(sp) = &self.spill {
            sp.file.read_at(a, (b - a) as usize, &mut indices)?;
        }
        Ok((ip[r0..=r1].iter().map(|x| x - a).collect(), indices))
    }
}

/// Collective: every rank must call. The Gramian of a distributed table.
pub fn global_gramian<C: Comm, T: TableElem>(comm: &C, local: &[T], d: usize) -> Vec<f64> {
    let mut g = gramian(local, d);
    let _p = comm.stats().phase("gramian");
    comm.all_reduce_sum(&mut g);
    g
}

/// `sum_u (|I_u| + alpha0 n_other) |x_u|^2` over a table shard: in parallel over blocks
/// of a fixed size whose sums are added in block order (the same bits at any thread
/// count).
fn reg_norms<T: TableElem>(
    table: &[T],
    counts: &[u32],
    d: usize,
    alpha0: f32,
    n_other: f64,
) -> f64 {
    use rayon::prelude::*;
    const BLOCK: usize = 4096;
    let parts: Vec<f64> = table
        .par_chunks(BLOCK * d.max(1))
        .zip(counts.par_chunks(BLOCK))
        .map(|(rows, counts)| {
            rows.chunks_exact(d)
                .zip(counts)
                .map(|(x, &c)| (c as f64 + alpha0 as f64 * n_other) * sq_norm64(x))
                .sum()
        })
        .collect();
    parts.into_iter().sum()
}

/// `|x|^2` in f64 (products of f32 values are exact in f64), over 8 lanes so that it
/// vectorizes; the lanes are added in a fixed order.
fn sq_norm64<T: TableElem>(x: &[T]) -> f64 {
    let mut acc = [0.0f64; 8];
    let mut chunks = x.chunks_exact(8);
    for c in &mut chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            let f = f64::from(v.to_f32());
            *a += f * f;
        }
    }
    for (a, &v) in acc.iter_mut().zip(chunks.remainder()) {
        let f = f64::from(v.to_f32());
        *a += f * f;
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]))
}

/// Whether every value is finite (in parallel; a branch-free scan per block).
fn all_finite(x: &[f32]) -> bool {
    use rayon::prelude::*;
    x.par_chunks(1 << 16)
        .all(|c| c.iter().fold(true, |ok, v| ok & v.is_finite()))
}

/// The loss pieces of a solved table shard by a separate pass over its observed cells
/// (bf16 rows widened a block at a time, so memory stays bounded).
fn loss_pass<T: TableElem, U: TableElem>(
    solved: &[U],
    shard: &CsrShard,
    fixed: &[T],
    d: usize,
    params: SolveParams,
) -> (f64, f64) {
    let view = |r0: usize, r1: usize| RowsView {
        indptr: &shard.indptr[r0..=r1],
        indices: &shard.indices,
    };
    let n = shard.num_rows();
    if let Some(x) = U::as_f32(solved) {
        return local_loss_terms(x, view(0, n), fixed, d, params.alpha0, params.n_other);
    }
    let mut buf = Vec::new();
    let mut acc = (0.0, 0.0);
    for r0 in (0..n).step_by(LOSS_BLOCK) {
        let r1 = (r0 + LOSS_BLOCK).min(n);
        buf.clear();
        buf.extend(solved[r0 * d..r1 * d].iter().map(|v| v.to_f32()));
        let (o, r) = local_loss_terms(&buf, view(r0, r1), fixed, d, params.alpha0, params.n_other);
        acc.0 += o;
        acc.1 += r;
    }
    acc
}

/// Solve the rows of `out` (a run of the solved table in its element type): in place
/// for f32; through an f32 copy, rounded back once, for bf16.
fn solve_rows<T: TableElem>(out: &mut [T], scratch: &mut Vec<f32>, f: impl FnOnce(&mut [f32])) {
    if let Some(x) = T::as_f32_mut(out) {
        f(x);
        return;
    }
    scratch.clear();
    scratch.extend(out.iter().map(|v| v.to_f32()));
    f(scratch);
    crate::bf16::narrow(scratch, out);
}

/// Rows per block of the loss pass over a solved shard ([`loss_pass`]).
const LOSS_BLOCK: usize = 1 << 14;

/// Solve one run of rows (`out`, in the solved table's element type) against the
/// gathered `fixed` rows with the configured solver, adding CG's loss pieces to
/// `fused` when it is kept. Returns whether every value is finite, and Cholesky's
/// error. `nan` plants a NaN (fault injection).
#[allow(clippy::too_many_arguments)]
fn solve_range<T: TableElem>(
    cfg: &AlsConfig,
    out: &mut [T],
    scratch: &mut Vec<f32>,
    view: RowsView,
    fixed: &[T],
    g32: &[f32],
    gram_fixed: &[f64],
    params: SolveParams,
    nan: bool,
    fused: &mut Option<LossTerms>,
) -> (bool, std::result::Result<(), SolveError>) {
    let d = cfg.dim;
    let (solver, cg_steps, hub_chunk) = (cfg.solver, cfg.cg_steps, cfg.hub_chunk);
    let mut finite = true;
    let mut solve_err = Ok(());
    let keep = fused.is_some();
    let mut terms = LossTerms::default();
    solve_rows(out, scratch, |x| {
        match solver {
            SolverKind::Cg if keep => {
                terms = cg_solve_with_loss(x, view, fixed, d, g32, params, cg_steps, hub_chunk);
            }
            SolverKind::Cg => cg_solve(x, view, fixed, d, g32, params, cg_steps, hub_chunk),
            SolverKind::Cholesky => {
                solve_err = cholesky_solve(x, view, fixed, d, gram_fixed, params);
            }
        }
        if nan && !x.is_empty() {
            x[0] = f32::NAN;
        }
        finite = all_finite(x);
    });
    if let Some(acc) = fused {
        acc.observed += terms.observed;
        acc.reg += terms.reg;
    }
    (finite, solve_err)
}

/// Intersect `[a, b)` with a sorted list of disjoint ranges; returns the parts of
/// `[a, b)` *not* covered.
pub fn uncovered(a: u64, b: u64, done: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut cur = a;
    for &(x, y) in done {
        if y <= cur || x >= b {
            continue;
        }
        if x > cur {
            out.push((cur, x.min(b)));
        }
        cur = cur.max(y);
        if cur >= b {
            break;
        }
    }
    if cur < b {
        out.push((cur, b));
    }
    out
}

/// Merge ranges into a sorted list of disjoint ones.
pub fn merge_ranges(mut r: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    r.retain(|(a, b)| a < b);
    r.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(r.len());
    for (a, b) in r {
        match out.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => out.push((a, b)),
        }
    }
    out
}

/// Collective: every rank must call. Reads this rank's shards of `cfg.data`, refusing
/// (before the large arrays are read) a share whose estimated memory exceeds the limit.
pub fn global_read_shards_for<C: Comm>(comm: &C, cfg: &AlsConfig) -> Result<Shards> {
    let root = comm.rank() == 0;
    let admit = |all: &[ShardSizes], rank: usize| -> Result<Layout> {
        let limit = crate::node::mem_limit(cfg.mem_per_rank);
        let choose = |s: &ShardSizes| {
            super::shard::memory::layout(
                s,
                cfg.dim,
                cfg.table_dtype,
                cfg.exchange == super::ExchangeKind::Allgather,
                cfg.step_nnz,
                rayon::current_num_threads(),
                cfg.memory.csr_buffer,
                cfg.hub_chunk as u64,
                cfg.memory.gather_buffer,
                limit,
            )
        };
        // The evaluation folds in the sampled test rows only (their share of the
        // visible arcs, in expectation).
        let sized = |s: &ShardSizes| {
            let n = match cfg.eval_rows {
                super::eval::EvalRows::Sample(n) => s.test_rows.min(n),
                super::eval::EvalRows::All => s.test_rows,
                // A quarter of an epoch scores far fewer rows than this on the graphs
                // where memory matters.
                super::eval::EvalRows::Auto => s.test_rows.min(super::eval::AUTO_ESTIMATE_ROWS),
            };
            ShardSizes {
                test_rows: n,
                fold_nnz_local: (s.fold_nnz_local as u128 * n as u128)
                    .div_ceil(s.test_rows.max(1) as u128) as u64,
                ..*s
            }
        };
        let all: Vec<ShardSizes> = all.iter().map(sized).collect();
        let (mut lay, mut est) = choose(&all[rank]);
        // The CSR stays in memory only if it does on every rank.
        if lay.csr_in_memory && !all.iter().all(|s| choose(s).0.csr_in_memory) {
            lay.csr_in_memory = false;
            est = super::shard::memory::estimate_with(
                &all[rank],
                cfg.dim,
                cfg.table_dtype,
                cfg.exchange == super::ExchangeKind::Allgather,
                cfg.step_nnz,
                rayon::current_num_threads(),
                &lay,
            );
        }
        if root {
            log::info!(
                "memory estimate for rank 0: {}; limit {}; CSR {}; gather {}",
                est.describe(),
                limit.map_or("none".into(), crate::metrics::human_bytes),
                if lay.csr_in_memory {
                    "in memory".to_string()
                } else {
                    format!(
                        "spilled, read in chunks of {}",
                        crate::metrics::human_bytes(
                            4 * lay.chunk_elems(all[rank].nnz_rows.max(all[rank].nnz_cols))
                        )
                    )
                },
                match lay.gather_rows {
                    None => "once per half".to_string(),
                    Some(r) => format!("in blocks of at most {r} rows"),
                }
            );
        }
        super::shard::memory::check(&est, limit, cfg.mem_per_rank.is_some())
            .map_err(Error::Config)?;
        Ok(lay)
    };
    global_read_shards_admitted(comm, &cfg.data, &admit)
}

/// The distributed model state of one rank, with tables stored as `T` (f32 or bf16).
pub struct Trainer<T: TableScalar = f32> {
    pub cfg: AlsConfig,
    /// Sizes, bounds and the test set; its `rows`/`cols` CSRs live in the sides
    /// ([`Trainer::rows_side`], [`Trainer::cols_side`]) and are empty here.
    pub shards: Shards,
    rows: Side,
    cols: Side,
    pub w: Vec<T>,
    pub h: Vec<T>,
    gram_w: Vec<f64>,
    gram_h: Vec<f64>,
    eval: EvalSet,
    pub steps_per_half: usize,
    pub pos: Position,
    /// Rows of the current half's solved side done on this rank (global ranges).
    local_done: Vec<(u64, u64)>,
    /// The gathered fixed table of the current half, once fetched (`Some(None)`: the
    /// local table itself, on one rank).
    fixed: Option<Option<Vec<T>>>,
    /// The buffer of the last gathered rows, kept for the next gather (a fresh one
    /// of hundreds of MB is page-faulted and zeroed by the kernel again); freed
    /// before an evaluation or a checkpoint, which may need the memory, and when
    /// training is over.
    spare: Vec<T>,
    pub preempt: Preemption,
    /// The f32 copy of a step's rows when the tables are bf16 (reused).
    scratch: Vec<f32>,
    /// Gathering in blocks: the own block whose rows `fixed` holds.
    fixed_block: Option<usize>,
    /// A spilled side's chunks of the current half, read ahead, and the one in use.
    reader: Option<ChunkReader>,
    chunk: Option<Chunk>,
    /// The chunk buffers of the last half's reader, for the next one (freed with
    /// `spare`, [`Trainer::free_spares`]).
    chunk_spares: Vec<Vec<u32>>,
    /// Gathering in blocks without fused loss terms: the terms of the steps so far.
    step_loss: Option<Vec<(f64, f64)>>,
    /// The loss pieces the CG solves of this half computed on the fly, when the whole
    /// half runs in this process (`None` after resuming inside a half: then the loss
    /// takes a separate pass over the observed cells).
    fused: Option<LossTerms>,
    /// With `--basis eigen`: the rotation the tables are in, relative to the starting
    /// basis, and the diagonal of the fixed side's Gramian once this half rotated the
    /// tables into its eigenbasis.
    basis: Basis,
}

/// What an epoch measured so far (it may span two units of the run driver).
struct EpochAcc {
    t0: Instant,
    bytes0: u64,
    io0: (u64, u64),
    times: PhaseTimes,
    /// The loss after the column half.
    loss: Option<f64>,
}

impl EpochAcc {
    fn start<C: Comm, T: TableScalar>(comm: &C, _tr: &Trainer<T>) -> Self {
        EpochAcc {
            t0: Instant::now(),
            bytes0: comm.stats().get("exchange").bytes_sent,
            io0: crate::metrics::io_read_bytes().unwrap_or_default(),
            times: PhaseTimes::default(),
            loss: None,
        }
    }
}

/// A row-major `d x d` matrix with `diag` on its diagonal.
fn diag_matrix(diag: &[f64]) -> Vec<f64> {
    let d = diag.len();
    let mut m = vec![0.0f64; d * d];
    for (k, &x) in diag.iter().enumerate() {
        m[k * d + k] = x;
    }
    m
}

impl<T: TableScalar> Trainer<T> {
    /// Collective: every rank must call. Reads the shards, builds the exchange plans
    /// and initializes both tables from (seed, global id).
    pub fn global_new<C: Comm>(comm: &C, cfg: &AlsConfig, preempt: Preemption) -> Result<Self> {
        let shards = global_read_shards_for(comm, cfg)?;
        Self::global_from_shards(comm, cfg, shards, preempt)
    }

    /// Collective: every rank must call. [`Trainer::global_new`] on shards already read
    /// (or derived from them, as `tune`'s validation split is).
    pub fn global_from_shards<C: Comm>(
        comm: &C,
        cfg: &AlsConfig,
        shards: Shards,
        preempt: Preemption,
    ) -> Result<Self> {
        let d = cfg.dim;
        let mut shards = shards;
        // The training CSRs move into the two sides (no second copy stays in `shards`).
        let (row_shard, col_shard) = (
            std::mem::take(&mut shards.rows),
            std::mem::take(&mut shards.cols),
        );
        let mut total = [row_shard.nnz()];
        comm.all_reduce_sum(&mut total);
        let steps = total[0].div_ceil(cfg.step_nnz).clamp(1, 4096) as usize;
        let (rows, cols) = if row_shard.on_disk.is_some() {
            let t = Instant::now();
            let lay = shards.layout;
            let (rows, a) = Side::global_build_spilled(
                comm,
                cfg,
                row_shard,
                &shards.col_bounds,
                steps,
                &lay,
                "train",
                false,
            )?;
            let (cols, b) = Side::global_build_spilled(
                comm,
                cfg,
                col_shard,
                &shards.row_bounds,
                steps,
                &lay,
                "train_t",
                true,
            )?;
            shards.arcs_checksum = global_check_transpose(comm, &cfg.data, a, b)?;
            if comm.rank() == 0 {
                let blocks = |s: &Side| s.spill.as_ref().map_or(1, |x| x.block_starts.len());
                log::info!(
                    "training CSR spilled to {} in {:.1} s; gather rounds per half: rows {}, columns {} (rank 0's blocks: {}, {})",
                    cfg.memory.spill_dir.clone().unwrap_or_else(std::env::temp_dir).display(),
                    t.elapsed().as_secs_f64(),
                    rows.rounds.len(),
                    cols.rounds.len(),
                    blocks(&rows),
                    blocks(&cols)
                );
            }
            (rows, cols)
        } else {
            (
                Side::global_build(comm, cfg, row_shard, &shards.col_bounds, steps)?,
                Side::global_build(comm, cfg, col_shard, &shards.row_bounds, steps)?,
            )
        };
        let eval = EvalSet::global_build(comm, &shards, cfg.eval_rows)?;
        let w = init_table(
            rows.shard.lo,
            rows.shard.num_rows(),
            d,
            cfg.seed,
            stream::INIT_ROWS,
            cfg.init_std,
        );
        let h = init_table(
            cols.shard.lo,
            cols.shard.num_rows(),
            d,
            cfg.seed,
            stream::INIT_COLS,
            cfg.init_std,
        );
        let gram_h = global_gramian(comm, &h, d);
        Ok(Self {
            cfg: cfg.clone(),
            shards,
            rows,
            cols,
            w,
            h,
            gram_w: Vec::new(),
            gram_h,
            eval,
            steps_per_half: steps,
            pos: Position::default(),
            local_done: Vec::new(),
            fixed: None,
            spare: Vec::new(),
            chunk_spares: Vec::new(),
            preempt,
            scratch: Vec::new(),
            fixed_block: None,
            reader: None,
            chunk: None,
            step_loss: None,
            fused: None,
            basis: Basis::default(),
        })
    }

    fn params(&self, n_other: u64) -> SolveParams {
        SolveParams {
            reg: self.cfg.reg,
            alpha0: self.cfg.unobserved_weight,
            n_other: n_other as f64,
        }
    }

    /// The global step counter (the same at every rank count).
    pub fn global_step(&self) -> u64 {
        ((self.pos.epoch as u64 * 2 + self.pos.half as u64) * self.steps_per_half as u64)
            + self.pos.step as u64
    }

    /// Continue from a restored position and tables.
    pub fn restore(
        &mut self,
        pos: Position,
        w: Vec<T>,
        h: Vec<T>,
        gram_w: Vec<f64>,
        gram_h: Vec<f64>,
    ) {
        let side = if pos.half == 0 {
            &self.rows
        } else {
            &self.cols
        };
        let (lo, hi) = (side.shard.lo, side.shard.hi);
        self.local_done = merge_ranges(
            pos.done
                .iter()
                .map(|&(a, b)| (a.max(lo), b.min(hi)))
                .collect(),
        );
        self.pos = pos;
        self.w = w;
        self.h = h;
        self.gram_w = gram_w;
        self.gram_h = gram_h;
        self.fixed = None;
        self.fixed_block = None;
        self.reader = None;
        self.chunk = None;
        self.step_loss = None;
        self.fused = None;
        self.basis = Basis::default();
    }

    /// After [`Trainer::restore`]: the basis a checkpoint's tables are in. A restored
    /// diagonal replaces the fixed side's recomputed Gramian (the run it continues
    /// solved and measured its loss with exactly that diagonal).
    pub fn restore_basis(&mut self, basis: Basis) {
        if let Some(diag) = &basis.fixed_diag {
            let g = diag_matrix(diag);
            if self.pos.half == 0 {
                self.gram_h = g;
            } else {
                self.gram_w = g;
            }
        }
        self.basis = basis;
    }

    /// Collective: every rank must call (no communication: `G` is the same on every
    /// rank). Rotates both tables into the eigenbasis of the fixed side's Gramian
    /// `G = V diag V^T`: `W <- W V`, `H <- H V`, so the fixed side's Gramian becomes the
    /// diagonal `V^T G V` (computed in f64 with the f32 `V` applied; its off-diagonal
    /// elements are at f32 rounding and dropped) and the solved side's warm start is in
    /// the same basis. The model and the objective do not change (see `solve::basis`).
    fn rotate_into_eigenbasis(&mut self) -> std::result::Result<(), String> {
        let d = self.cfg.dim;
        let g = if self.pos.half == 0 {
            &self.gram_h
        } else {
            &self.gram_w
        };
        let (v, _) = eigenbasis(g, d)?;
        let v32: Vec<f32> = v.iter().map(|&x| x as f32).collect();
        let applied: Vec<f64> = v32.iter().map(|&x| f64::from(x)).collect();
        // diag(V^T G V): column c is sum_k V[k, c] (G V)[k, c].
        let gv = matmul64(g, &applied, d);
        let mut diag = vec![0.0f64; d];
        for (vk, gvk) in applied.chunks_exact(d).zip(gv.chunks_exact(d)) {
            for ((s, &v), &x) in diag.iter_mut().zip(vk).zip(gvk) {
                *s += v * x;
            }
        }
        for table in [&mut self.w, &mut self.h] {
            let t = T::as_f32_mut(table).ok_or("the eigenbasis needs f32 tables")?;
            rotate_rows(t, d, &v32);
        }
        self.basis.rotation = Some(match &self.basis.rotation {
            Some(r) => matmul64(r, &applied, d),
            None => applied,
        });
        let gd = diag_matrix(&diag);
        if self.pos.half == 0 {
            self.gram_h = gd;
        } else {
            self.gram_w = gd;
        }
        self.basis.fixed_diag = Some(diag);
        Ok(())
    }

    /// Collective: every rank must call. Turns the tables back into the starting basis
    /// (`T <- T R^T`) and their Gramians with them.
    pub fn global_to_starting_basis<C: Comm>(&mut self, comm: &C) {
        let Some(r) = self.basis.rotation.take() else {
            return;
        };
        let d = self.cfg.dim;
        let back: Vec<f32> = transpose64(&r, d).iter().map(|&x| x as f32).collect();
        for table in [&mut self.w, &mut self.h] {
            if let Some(t) = T::as_f32_mut(table) {
                rotate_rows(t, d, &back);
            }
        }
        // H's Gramian as a restore computes it, the bits of `global_gramian` (the
        // evaluation folds test rows in against H, and a run resumed after its last
        // epoch evaluates the restored tables), its all-reduce counted as the
        // once-per-run phase "basis"; W's, which nothing uses after the last epoch,
        // turned in f64.
        let mut gram_h = gramian(&self.h, d);
        {
            let _p = comm.stats().phase("basis");
            comm.all_reduce_sum(&mut gram_h);
        }
        self.gram_h = gram_h;
        self.gram_w = matmul64(&matmul64(&r, &self.gram_w, d), &transpose64(&r, d), d);
        self.basis.fixed_diag = None;
    }

    /// Collective: every rank must call. Runs the remaining steps of the current half;
    /// at every step boundary the ranks agree on preemption and non-finite values.
    /// Returns the loss after the half (`None` after a row half unless `--loss-every-half`).
    fn global_half<C: Comm>(
        &mut self,
        comm: &C,
        times: &mut PhaseTimes,
        boundary: &Boundary<'_>,
    ) -> Result<(Status, Option<f64>)> {
        let d = self.cfg.dim;
        let half = self.pos.half;
        let (nr, nc) = (self.shards.meta.num_rows, self.shards.meta.num_cols);
        let (params, n_solved) = if half == 0 {
            (self.params(nc), nr)
        } else {
            (self.params(nr), nc)
        };
        // The loss is wanted after every column half (and row half when asked); the
        // solves compute its pieces if they cover the whole half here.
        let want_loss = half == 1 || self.cfg.loss_every_half;
        if self.pos.step == 0 && self.local_done.is_empty() {
            self.fused = (want_loss && self.cfg.solver == SolverKind::Cg).then(LossTerms::default);
            if self.cfg.eigenbasis() && self.basis.fixed_diag.is_none() {
                let t = Instant::now();
                let rotated = self.rotate_into_eigenbasis();
                times.basis += t.elapsed().as_secs_f64();
                if let Err(e) = rotated {
                    let reason = format!(
                        "{e} (the {} table's Gramian, epoch {})",
                        if half == 0 { "column (H)" } else { "row (W)" },
                        self.pos.epoch + 1
                    );
                    return Ok((Status::Hold { reason, rank: None }, None));
                }
            }
        }
        let stopped = if self.side().spill.is_some() {
            self.global_steps_spilled(comm, times, params, want_loss, boundary)?
        } else {
            self.global_steps_in_memory(comm, times, params, boundary)?
        };
        if let Some(status) = stopped {
            return Ok((status, None));
        }
        // The half is complete: Gramian of the solved side and the exact loss.
        let t = Instant::now();
        let solved = if half == 0 { &self.w } else { &self.h };
        let gram_solved = global_gramian(comm, solved, d);
        times.gramian += t.elapsed().as_secs_f64();
        // The exact loss after every epoch; after the row half too when asked (it costs
        // a second pass over the observed cells unless the solves computed its pieces).
        let loss = if want_loss {
            let t = Instant::now();
            let f32_tables = T::as_f32(&self.w[..0]).is_some();
            let (obs, reg_solved) = match (self.fused.take(), self.step_loss.take()) {
                (Some(f), _) => (f.observed, f.reg),
                (None, Some(accs)) => fold_loss_chunks(&accs, (!f32_tables).then_some(LOSS_BLOCK)),
                (None, None) if self.side().spill.is_some() => {
                    comm.agree(self.local_loss_pass_spilled(params))?
                }
                (None, None) => {
                    let (side, solved, fixed) = self.solved_and_fixed();
                    loss_pass(solved, &side.shard, fixed, d, params)
                }
            };
            let (fixed_local, fixed_counts) = if half == 0 {
                (&self.h, &self.cols.counts)
            } else {
                (&self.w, &self.rows.counts)
            };
            let reg_fixed = reg_norms(fixed_local, fixed_counts, d, params.alpha0, n_solved as f64);
            let mut parts = [obs, reg_solved + reg_fixed];
            {
                let _p = comm.stats().phase("loss");
                comm.all_reduce_sum(&mut parts);
            }
            let gram_fixed = if half == 0 {
                &self.gram_h
            } else {
                &self.gram_w
            };
            let loss = parts[0]
                + params.alpha0 as f64 * all_pairs_term(&gram_solved, gram_fixed, d)
                + self.cfg.reg as f64 * parts[1];
            times.loss += t.elapsed().as_secs_f64();
            Some(loss)
        } else {
            None
        };
        if half == 0 {
            self.gram_w = gram_solved;
            self.pos.half = 1;
            self.pos.loss_rows = loss;
        } else {
            self.gram_h = gram_solved;
            self.pos.half = 0;
            self.pos.epoch += 1;
            self.pos.loss = loss;
        }
        self.pos.step = 0;
        self.pos.done.clear();
        self.local_done.clear();
        self.keep_fixed_as_spare();
        if self.pos.epoch >= self.cfg.epochs {
            // Training is over: nothing gathers or reads again.
            self.free_spares();
        }
        self.fixed_block = None;
        self.reader = None;
        self.chunk = None;
        self.basis.fixed_diag = None;
        match loss {
            Some(l) if !l.is_finite() => Ok((
                Status::Hold {
                    reason: format!("the loss is {l} after epoch {}", self.pos.epoch),
                    rank: None,
                },
                loss,
            )),
            _ => Ok((Status::Done, loss)),
        }
    }

    /// Free the buffers kept for the next half (`spare`, `chunk_spares`): before an
    /// evaluation or a checkpoint, which may need the memory, and when training is
    /// over.
    fn free_spares(&mut self) {
        self.spare = Vec::new();
        self.chunk_spares = Vec::new();
    }

    /// Drop the gathered rows, keeping their buffer for the next gather.
    fn keep_fixed_as_spare(&mut self) {
        if let Some(Some(v)) = self.fixed.take() {
            self.spare = v;
        }
    }

    /// The side solved in the current half.
    fn side(&self) -> &Side {
        if self.pos.half == 0 {
            &self.rows
        } else {
            &self.cols
        }
    }

    /// The solved side, its table, and the gathered fixed rows (or the local fixed
    /// table itself on one rank).
    fn solved_and_fixed(&self) -> (&Side, &[T], &[T]) {
        let (side, solved, fixed_local) = if self.pos.half == 0 {
            (&self.rows, &self.w, &self.h)
        } else {
            (&self.cols, &self.h, &self.w)
        };
        let fixed: &[T] = match &self.fixed {
            Some(Some(v)) => v,
            _ => fixed_local,
        };
        (side, solved, fixed)
    }

    /// CG takes G as f32: its diagonal in the eigenbasis, else in full (empty for
    /// Cholesky, which takes the f64 Gramian).
    fn gram32(&self) -> Vec<f32> {
        let gram_fixed = if self.pos.half == 0 {
            &self.gram_h
        } else {
            &self.gram_w
        };
        match (&self.basis.fixed_diag, self.cfg.solver) {
            (Some(diag), _) => diag.iter().map(|&x| x as f32).collect(),
            (None, SolverKind::Cg) => gram_fixed.iter().map(|&x| x as f32).collect(),
            (None, SolverKind::Cholesky) => Vec::new(),
        }
    }

    /// Collective: every rank must call. Gather the whole half's fixed rows once.
    fn global_fetch_whole<C: Comm>(&mut self, comm: &C, times: &mut PhaseTimes) -> Result<()> {
        let t = Instant::now();
        let (side, fixed_local) = if self.pos.half == 0 {
            (&self.rows, &self.h)
        } else {
            (&self.cols, &self.w)
        };
        let plan = side
            .plan
            .as_ref()
            .expect("a side gathered once has its plan");
        let spare = std::mem::take(&mut self.spare);
        self.fixed = Some(plan.global_fetch_reusing(comm, fixed_local, self.cfg.dim, spare)?);
        times.exchange += t.elapsed().as_secs_f64();
        Ok(())
    }

    /// Collective: every rank must call. One gather round of a half gathered in
    /// blocks: a rank given `Some(k)` replaces its gathered rows by its block `k`'s,
    /// the others only serve theirs.
    fn global_gather_round<C: Comm>(
        &mut self,
        comm: &C,
        block: Option<usize>,
        times: &mut PhaseTimes,
    ) -> Result<()> {
        let t = Instant::now();
        if block.is_some() {
            // The old block's rows go before the new ones arrive (into their buffer).
            self.keep_fixed_as_spare();
        }
        let (side, fixed_local, bounds) = if self.pos.half == 0 {
            (&self.rows, &self.h, &self.shards.col_bounds)
        } else {
            (&self.cols, &self.w, &self.shards.row_bounds)
        };
        let spill = side
            .spill
            .as_ref()
            .expect("gather rounds are for spilled sides");
        let needed = comm.agree(match block {
            Some(k) => spill.needed(k),
            None => Ok(Vec::new()),
        })?;
        let plan = ExchangePlan::global_from_needed(comm, self.cfg.exchange, needed, bounds)?;
        if let Some(k) = block {
            let spare = std::mem::take(&mut self.spare);
            self.fixed = Some(plan.global_fetch_reusing(comm, fixed_local, self.cfg.dim, spare)?);
            self.fixed_block = Some(k);
        } else {
            plan.global_fetch(comm, fixed_local, self.cfg.dim)?;
        }
        times.exchange += t.elapsed().as_secs_f64();
        Ok(())
    }

    /// Collective: every rank must call. The remaining steps of a half whose CSR is in
    /// memory: one gather, then each step solves the rows of steps `0..=j` not yet done
    /// (after a resume on another rank count that catches up what the old layout had
    /// not reached).
    fn global_steps_in_memory<C: Comm>(
        &mut self,
        comm: &C,
        times: &mut PhaseTimes,
        params: SolveParams,
        boundary: &Boundary<'_>,
    ) -> Result<Option<Status>> {
        let d = self.cfg.dim;
        let half = self.pos.half;
        if self.fixed.is_none() {
            self.global_fetch_whole(comm, times)?;
        }
        let g32 = self.gram32();
        while self.pos.step < self.steps_per_half {
            let j = self.pos.step;
            let t = Instant::now();
            let (side, solved, fixed_local, gram_fixed) = if half == 0 {
                (&self.rows, &mut self.w, &self.h, &self.gram_h)
            } else {
                (&self.cols, &mut self.h, &self.w, &self.gram_w)
            };
            let fixed: &[T] = match &self.fixed {
                Some(Some(v)) => v,
                _ => fixed_local,
            };
            let lo = side.shard.lo;
            let (a, b) = (lo, lo + side.step_bounds[j + 1]);
            let mut non_finite = false;
            let mut solve_err = Ok(());
            for (x, y) in uncovered(a, b, &self.local_done) {
                let (r0, r1) = ((x - lo) as usize, (y - lo) as usize);
                let view = RowsView {
                    indptr: &side.shard.indptr[r0..=r1],
                    indices: &side.shard.indices,
                };
                let nan = faults::inject_nan(self.pos.epoch + 1, comm.rank()) && j == 0;
                let (finite, r) = solve_range(
                    &self.cfg,
                    &mut solved[r0 * d..r1 * d],
                    &mut self.scratch,
                    view,
                    fixed,
                    &g32,
                    gram_fixed,
                    params,
                    nan,
                    &mut self.fused,
                );
                if let Err(e) = r {
                    solve_err = Err(e);
                }
                non_finite |= solve_err.is_err() || !finite;
            }
            times.solve += t.elapsed().as_secs_f64();
            self.local_done = merge_ranges([self.local_done.clone(), vec![(a, b)]].concat());
            self.pos.step += 1;
            let end = self.global_step_end(comm, None, non_finite, solve_err, boundary)?;
            if end.is_some() {
                return Ok(end);
            }
        }
        Ok(None)
    }

    /// Collective: every rank must call. After a step: agree on how it ended (a local
    /// failure: the error; a non-finite value, a preemption: the status that stops
    /// the half; `None`: go on).
    fn global_step_end<C: Comm>(
        &mut self,
        comm: &C,
        failed: Option<Error>,
        non_finite: bool,
        solve_err: std::result::Result<(), SolveError>,
        boundary: &Boundary<'_>,
    ) -> Result<Option<Status>> {
        let half = self.pos.half;
        let flag = boundary.preempt_requested(self.global_step());
        let status = StepStatus::global_agree_all(comm, failed.is_some(), non_finite, flag);
        match status {
            StepStatus::Failed { rank } => {
                self.reader = None;
                Err(match failed {
                    Some(e) if rank == comm.rank() => e,
                    _ => Error::Remote { rank, code: 1 },
                })
            }
            StepStatus::NonFinite { rank } => {
                let what = match &solve_err {
                    Err(e) if comm.rank() == rank => e.to_string(),
                    _ => "a non-finite value".to_string(),
                };
                let reason = format!(
                    "{what} in the {} table on rank {rank} in epoch {}, step {}",
                    if half == 0 { "row (W)" } else { "column (H)" },
                    self.pos.epoch + 1,
                    self.pos.step
                );
                Ok(Some(Status::Hold {
                    reason,
                    rank: Some(rank),
                }))
            }
            StepStatus::Preempt => {
                self.reader = None;
                Ok(Some(Status::Preempt))
            }
            StepStatus::Done => Ok(None),
        }
    }

    /// Collective: every rank must call. The remaining steps of a half whose CSR is
    /// spilled: after a resume, first the rows of earlier steps not yet done (with
    /// their gather blocks); then step by step, the chunks read ahead on a thread and
    /// a gather round wherever any rank's next block starts. Every row's solve is the
    /// arithmetic of the in-memory layout, so the tables have the same bits.
    fn global_steps_spilled<C: Comm>(
        &mut self,
        comm: &C,
        times: &mut PhaseTimes,
        params: SolveParams,
        want_loss: bool,
        boundary: &Boundary<'_>,
    ) -> Result<Option<Status>> {
        let multi = self.side().plan.is_none();
        if multi && want_loss && self.fused.is_none() && self.step_loss.is_none() {
            let chunks = self.side().shard.num_rows().div_ceil(LOSS_CHUNK);
            self.step_loss = Some(vec![(0.0, 0.0); chunks]);
        }
        let start = self.pos.step;
        if start > 0 || !self.local_done.is_empty() {
            let end = self.global_catch_up(comm, times, params, multi, boundary)?;
            if end.is_some() {
                return Ok(end);
            }
        }
        // The gather for the first step.
        if multi {
            let k = self.own_block(start);
            let want = (self.fixed_block != Some(k)).then_some(k);
            self.global_gather_round(comm, want, times)?;
        } else if self.fixed.is_none() {
            self.global_fetch_whole(comm, times)?;
        }
        let steps = self.steps_per_half;
        let buffers = std::mem::take(&mut self.chunk_spares);
        {
            let side = self.side();
            let spill = side.spill.as_ref().expect("a spilled side");
            let chunk_elems = self.chunk_elems();
            let ranges = read_ahead_chunks(
                &side.step_bounds,
                &side.shard.indptr,
                start,
                steps,
                chunk_elems,
            );
            let reader = ChunkReader::start(
                spill,
                &side.shard.indptr,
                &side.step_bounds,
                ranges,
                comm.rank(),
                buffers,
            );
            self.reader = Some(reader);
            self.chunk = None;
        }
        let g32 = self.gram32();
        while self.pos.step < steps {
            let j = self.pos.step;
            if multi && j > start && self.side().rounds.binary_search(&j).is_ok() {
                let k = self.own_block(j);
                let want = (self.fixed_block != Some(k)).then_some(k);
                self.global_gather_round(comm, want, times)?;
            }
            let t = Instant::now();
            let mut failed = None;
            if self.chunk.as_ref().is_none_or(|c| j >= c.s1) {
                if let (Some(c), Some(r)) = (self.chunk.take(), self.reader.as_ref()) {
                    r.recycle(c);
                }
                let waited = Instant::now();
                let next = self.reader.as_ref().map(|r| r.next());
                times.spill_wait += waited.elapsed().as_secs_f64();
                match next {
                    Some(Ok(c)) => self.chunk = Some(c),
                    Some(Err(e)) => failed = Some(e),
                    None => failed = Some(Error::Comm("no spill reader".into())),
                }
            }
            let (mut non_finite, mut solve_err) = (false, Ok(()));
            if failed.is_none() {
                let nan = faults::inject_nan(self.pos.epoch + 1, comm.rank()) && j == 0;
                (non_finite, solve_err) = self.local_solve_step(j, &g32, params, nan);
            }
            times.solve += t.elapsed().as_secs_f64();
            let lo = self.side().shard.lo;
            let (r0, r1) = self.side().step_rows(j, j + 1);
            self.local_done = merge_ranges(
                [
                    self.local_done.clone(),
                    vec![(lo + r0 as u64, lo + r1 as u64)],
                ]
                .concat(),
            );
            self.pos.step += 1;
            let end = self.global_step_end(comm, failed, non_finite, solve_err, boundary)?;
            if end.is_some() {
                return Ok(end);
            }
        }
        if let Some(r) = self.reader.take() {
            self.chunk_spares = r.finish(self.chunk.take());
        }
        Ok(None)
    }

    /// Indices in one chunk of a streamed side (the same for both sides, so that the
    /// buffers kept from half to half fit either).
    fn chunk_elems(&self) -> u64 {
        let nnz = |s: &Side| s.shard.indptr.last().copied().unwrap_or(0);
        self.shards
            .layout
            .chunk_elems(nnz(&self.rows).max(nnz(&self.cols)))
    }

    /// The own gather block holding step `s` (0 when the half gathers once).
    fn own_block(&self, s: usize) -> usize {
        self.side().spill.as_ref().map_or(0, |sp| sp.block_of(s))
    }

    /// Rank-local: solve the rows of step `j` not yet done from the current chunk,
    /// and add the loss terms of all its rows when gathering in blocks without fused
    /// terms. Returns whether a value was non-finite, and a solve's error.
    fn local_solve_step(
        &mut self,
        j: usize,
        g32: &[f32],
        params: SolveParams,
        nan: bool,
    ) -> (bool, std::result::Result<(), SolveError>) {
        let d = self.cfg.dim;
        let (side, solved, fixed_local, gram_fixed) = if self.pos.half == 0 {
            (&self.rows, &mut self.w, &self.h, &self.gram_h)
        } else {
            (&self.cols, &mut self.h, &self.w, &self.gram_w)
        };
        let fixed: &[T] = match &self.fixed {
            Some(Some(v)) => v,
            _ => fixed_local,
        };
        let chunk = self.chunk.as_ref().expect("the chunk of step j");
        let lo = side.shard.lo;
        let (r0, r1) = side.step_rows(j, j + 1);
        let ip: Vec<u64> = side.shard.indptr[r0..=r1]
            .iter()
            .map(|x| x - chunk.a)
            .collect();
        let (mut non_finite, mut solve_err) = (false, Ok(()));
        for (x, y) in uncovered(lo + r0 as u64, lo + r1 as u64, &self.local_done) {
            let (q0, q1) = ((x - lo) as usize, (y - lo) as usize);
            let view = RowsView {
                indptr: &ip[q0 - r0..=q1 - r0],
                indices: &chunk.indices,
            };
            let (finite, r) = solve_range(
                &self.cfg,
                &mut solved[q0 * d..q1 * d],
                &mut self.scratch,
                view,
                fixed,
                g32,
                gram_fixed,
                params,
                nan,
                &mut self.fused,
            );
            if let Err(e) = r {
                solve_err = Err(e);
            }
            non_finite |= solve_err.is_err() || !finite;
        }
        if let Some(accs) = &mut self.step_loss {
            let view = RowsView {
                indptr: &ip,
                indices: &chunk.indices,
            };
            let rows = &solved[r0 * d..r1 * d];
            let x: &[f32] = match T::as_f32(rows) {
                Some(x) => x,
                None => {
                    self.scratch.clear();
                    self.scratch.extend(rows.iter().map(|v| v.to_f32()));
                    &self.scratch
                }
            };
            add_loss_terms_to_chunks(accs, r0, x, view, fixed, d, params.alpha0, params.n_other);
        }
        (non_finite, solve_err)
    }

    /// Collective: every rank must call. After a resume inside a spilled half: solve
    /// the rows of the steps before the current one that no process has solved (a
    /// resume on another rank count leaves some), gathering each block they need; with
    /// per-step loss terms, add the terms of every row of those steps.
    fn global_catch_up<C: Comm>(
        &mut self,
        comm: &C,
        times: &mut PhaseTimes,
        params: SolveParams,
        multi: bool,
        boundary: &Boundary<'_>,
    ) -> Result<Option<Status>> {
        let start = self.pos.step;
        let spans: Vec<(usize, usize)> = if multi {
            let r = &self.side().rounds;
            (0..r.len())
                .map(|i| (r[i], r.get(i + 1).copied().unwrap_or(usize::MAX).min(start)))
                .filter(|&(a, b)| a < b)
                .collect()
        } else {
            vec![(0, start)]
        };
        if !multi && self.fixed.is_none() {
            self.global_fetch_whole(comm, times)?;
        }
        let g32 = self.gram32();
        let (mut failed, mut non_finite, mut solve_err) = (None, false, Ok(()));
        for (u0, u1) in spans {
            let lo = self.side().shard.lo;
            let (r0, r1) = self.side().step_rows(u0, u1);
            let todo = uncovered(lo + r0 as u64, lo + r1 as u64, &self.local_done);
            let need = failed.is_none() && (!todo.is_empty() || self.step_loss.is_some());
            if multi {
                if comm.all_reduce_max(u64::from(need)) == 0 {
                    continue;
                }
                let k = self.own_block(u0);
                let want = (need && self.fixed_block != Some(k)).then_some(k);
                self.global_gather_round(comm, want, times)?;
            }
            if !need {
                continue;
            }
            let t = Instant::now();
            let chunk_elems = self.chunk_elems();
            let side = self.side();
            let chunks = step_chunks(
                &side.step_bounds,
                &side.shard.indptr,
                u0,
                u1,
                chunk_elems,
                &[],
            );
            for (s0, s1) in chunks {
                let (c0, c1) = self.side().step_rows(s0, s1);
                let idle = self.step_loss.is_none()
                    && uncovered(lo + c0 as u64, lo + c1 as u64, &self.local_done).is_empty();
                if idle || failed.is_some() {
                    continue;
                }
                match self.side().read_rows(c0, c1) {
                    Err(e) => failed = Some(e),
                    Ok((_, indices)) => {
                        self.chunk = Some(Chunk {
                            s0,
                            s1,
                            a: self.side().shard.indptr[c0],
                            indices,
                        });
                        for j in s0..s1 {
                            let (nf, e) = self.local_solve_step(j, &g32, params, false);
                            non_finite |= nf;
                            if e.is_err() {
                                solve_err = e;
                            }
                        }
                        self.chunk = None;
                    }
                }
            }
            if failed.is_none() {
                self.local_done = merge_ranges(
                    [
                        self.local_done.clone(),
                        vec![(lo + r0 as u64, lo + r1 as u64)],
                    ]
                    .concat(),
                );
            }
            times.solve += t.elapsed().as_secs_f64();
        }
        self.global_step_end(comm, failed, non_finite, solve_err, boundary)
    }

    /// Rank-local: the loss pieces of a spilled side gathered once, as [`loss_pass`]
    /// computes them in memory (blocks of 16,384 rows; f32 terms folded chunk by chunk
    /// across blocks), so the loss has the same bits.
    fn local_loss_pass_spilled(&self, params: SolveParams) -> Result<(f64, f64)> {
        let d = self.cfg.dim;
        let (side, solved, fixed) = self.solved_and_fixed();
        let n = side.shard.num_rows();
        let mut acc = (0.0, 0.0);
        let mut buf = Vec::new();
        for r0 in (0..n).step_by(LOSS_BLOCK) {
            let r1 = (r0 + LOSS_BLOCK).min(n);
            let (ip, indices) = side.read_rows(r0, r1)?;
            let view = RowsView {
                indptr: &ip,
                indices: &indices,
            };
            let rows = &solved[r0 * d..r1 * d];
            match T::as_f32(rows) {
                Some(x) => {
                    acc =
                        local_loss_terms_from(acc, x, view, fixed, d, params.alpha0, params.n_other)
                }
                None => {
                    buf.clear();
                    buf.extend(rows.iter().map(|v| v.to_f32()));
                    let (o, r) =
                        local_loss_terms(&buf, view, fixed, d, params.alpha0, params.n_other);
                    acc.0 += o;
                    acc.1 += r;
                }
            }
        }
        Ok(acc)
    }

    /// Collective: every rank must call. Write a checkpoint of the current position.
    pub fn global_checkpoint<C: Comm>(&mut self, comm: &C) -> Result<std::path::PathBuf> {
        self.free_spares();
        let mine: Vec<u64> = self.local_done.iter().flat_map(|&(a, b)| [a, b]).collect();
        let all = comm.all_gather_v(&mine)?.data;
        self.pos.done = merge_ranges(all.chunks_exact(2).map(|c| (c[0], c[1])).collect());
        let step = self.global_step();
        let path = global_write_checkpoint(comm, &self.run_state(), step)?;
        Ok(path)
    }

    /// Collective: every rank must call. After the last epoch's column half: the
    /// model leaves in the basis it started in.
    fn global_end_of_training<C: Comm>(&mut self, comm: &C, times: &mut PhaseTimes) {
        if self.pos.epoch >= self.cfg.epochs {
            let t = Instant::now();
            self.global_to_starting_basis(comm);
            times.basis += t.elapsed().as_secs_f64();
        }
    }

    /// Collective: every rank must call. The report of the epoch `acc` measured (and
    /// its evaluation when `evaluate`), once its column half is done.
    fn global_epoch_report<C: Comm>(
        &mut self,
        comm: &C,
        acc: EpochAcc,
        evaluate: bool,
    ) -> Result<EpochReport> {
        let EpochAcc {
            t0,
            bytes0,
            io0,
            mut times,
            loss,
        } = acc;
        let loss_rows = self.pos.loss_rows;
        let loss = loss.unwrap_or(f64::NAN);
        // Training traffic only: the evaluation's fold-in fetch is not counted here.
        let train_bytes = comm.stats().get("exchange").bytes_sent - bytes0;
        let eval = if evaluate {
            let trained = t0.elapsed().as_secs_f64() - times.checkpoint;
            Some(self.global_evaluate_after(comm, &mut times, Some(trained))?)
        } else {
            None
        };
        let recall = eval.map(|e| e.recall);
        let seconds = t0.elapsed().as_secs_f64() - times.eval - times.checkpoint;
        // Reads of the spilled CSR (nothing is read when it is in memory).
        let io1 = match self.rows.spill {
            Some(_) => crate::metrics::io_read_bytes().unwrap_or_default(),
            None => io0,
        };
        let mut sums = [
            train_bytes,
            self.rows.shard.nnz(),
            io1.0.saturating_sub(io0.0),
            io1.1.saturating_sub(io0.1),
        ];
        comm.all_reduce_sum(&mut sums);
        let rss = crate::metrics::peak_rss_bytes().unwrap_or(0);
        let (live, heap) = crate::allocs::large_bytes();
        log::debug!(
            "memory of rank {} after epoch {}: peak RSS {}, large allocations {} live, {} at peak",
            comm.rank(),
            self.pos.epoch,
            crate::metrics::human_bytes(rss),
            crate::metrics::human_bytes(live),
            crate::metrics::human_bytes(heap)
        );
        let peak_rss_bytes = comm.all_reduce_max(rss);
        let links = if comm.size() > 1 {
            crate::comm::global_link_summary(comm)?
        } else {
            Vec::new()
        };
        Ok(EpochReport {
            links,
            peak_rss_bytes,
            epoch: self.pos.epoch,
            loss_rows,
            loss,
            eval_rows: recall.map_or(0, |r| r.test_rows),
            recall,
            seconds,
            edges_per_second: sums[1] as f64 / seconds.max(1e-9),
            eval_seconds: times.eval,
            eval_flops_per_second: eval.map_or(0.0, |e| e.score_flops_per_second),
            eval_auto: eval.and_then(|e| e.auto),
            exchange_bytes: sums[0],
            read_bytes: sums[2],
            storage_read_bytes: sums[3],
            phases: times,
        })
    }

    /// Collective: every rank must call. Recall@20/50 of the current tables (with
    /// `--eval-rows auto`, no epoch timed: see [`super::eval::AUTO_UNTIMED_ROWS`]).
    pub fn global_evaluate<C: Comm>(&mut self, comm: &C, times: &mut PhaseTimes) -> Result<Recall> {
        self.global_evaluate_after(comm, times, None)
            .map(|e| e.recall)
    }

    /// Collective: every rank must call. Recall@20/50 of the current tables after an
    /// epoch that trained for `epoch_seconds` (`--eval-rows auto` sizes its first
    /// evaluation by it).
    pub fn global_evaluate_after<C: Comm>(
        &mut self,
        comm: &C,
        times: &mut PhaseTimes,
        epoch_seconds: Option<f64>,
    ) -> Result<EvalReport> {
        self.free_spares();
        let t = Instant::now();
        let params = self.params(self.shards.meta.num_cols);
        let r = self.eval.global_evaluate_epoch(
            comm,
            &self.shards,
            epoch_seconds,
            &self.h,
            self.cols.shard.lo,
            self.cfg.dim,
            &self.gram_h,
            params,
        );
        times.eval += t.elapsed().as_secs_f64();
        let r = r?;
        let e = r.times;
        log::debug!(
            "eval of {} rows on rank {}: fetch {:.3} s, fold-in {:.3} s ({:.3} CPU s), gather {:.3} s, score {:.3} s ({:.3} CPU s), merge {:.3} s",
            r.recall.test_rows, comm.rank(), e.fetch, e.fold_in, e.fold_in_cpu, e.gather, e.score, e.score_cpu, e.merge
        );
        Ok(r)
    }

    /// Collective: every rank must call. A checksum of both tables by global id.
    pub fn global_checksum<C: Comm>(&self, comm: &C) -> u64 {
        let mut c = [self
            .local_checksums()
            .0
            .wrapping_add(self.local_checksums().1)];
        comm.all_reduce_sum(&mut c);
        c[0]
    }

    /// This rank's contributions to the checksums of W and H.
    /// What a checkpoint holds of this run (lent to `checkpoint.rs`).
    pub fn run_state(&self) -> RunState<'_, T> {
        RunState {
            cfg: &self.cfg,
            meta: &self.shards.meta,
            pos: &self.pos,
            steps_per_half: self.steps_per_half,
            train_nnz: self.rows.shard.nnz(),
            w_rows: self.rows.shard.lo..self.rows.shard.hi,
            h_rows: self.cols.shard.lo..self.cols.shard.hi,
            w: &self.w,
            h: &self.h,
            basis: BasisState::new(&self.basis),
        }
    }

    pub fn local_checksums(&self) -> (u64, u64) {
        let d = self.cfg.dim;
        (
            local_checksum(&self.w, self.rows.shard.lo, d, 1),
            local_checksum(&self.h, self.cols.shard.lo, d, 2),
        )
    }

    /// Collective: every rank must call. Write `/W` and `/H` with attributes.
    pub fn global_write_model<C: Comm>(
        &self,
        comm: &C,
        out: &Path,
        report: &TrainReport,
    ) -> Result<()> {
        let cfg_json =
            serde_json::to_string(&self.cfg).map_err(|e| Error::Config(e.to_string()))?;
        let m = &self.shards.meta;
        let tables = [
            TablePart {
                name: "W",
                n: m.num_rows,
                lo: self.rows.shard.lo,
                data: &self.w,
            },
            TablePart {
                name: "H",
                n: m.num_cols,
                lo: self.cols.shard.lo,
                data: &self.h,
            },
        ];
        let mut attrs = vec![
            ("format", Attr::Str("torusrec-als-model".into())),
            ("config", Attr::Str(cfg_json)),
            ("checksum", Attr::Str(format!("{:016x}", report.checksum))),
            (
                DATA_CHECKSUM,
                Attr::Str(data_checksum_hex(self.shards.arcs_checksum)),
            ),
            ("epochs", Attr::F64(self.pos.epoch as f64)),
            ("loss", Attr::F64(report.loss)),
        ];
        if let Some(r) = report.recall {
            attrs.push(("recall_at_20", Attr::F64(r.at20)));
            attrs.push(("recall_at_50", Attr::F64(r.at50)));
        }
        global_write_tables(comm, out, self.cfg.dim, &tables, &attrs)
    }

    pub fn rows_side(&self) -> &Side {
        &self.rows
    }
    pub fn cols_side(&self) -> &Side {
        &self.cols
    }
}

/// Collective: every rank must call. [`global_train_as`] with f32 tables.
pub fn global_train<C: Comm>(
    comm: &C,
    cfg: &AlsConfig,
    preempt: Preemption,
    on_event: impl FnMut(TrainEvent),
) -> Result<(Trainer, TrainReport)> {
    global_train_as::<C, f32>(comm, cfg, preempt, on_event)
}

/// iALS as a workload of the run driver ([`crate::ckpt::driver`]): a unit of work is
/// one half-epoch; its steps run inside it, and at every step boundary the ranks
/// agree on how the step ended (asking the driver's [`Boundary`] whether to preempt).
struct AlsWork<T: TableScalar> {
    tr: Trainer<T>,
    /// The epoch in progress (from its first half run by this process).
    acc: Option<EpochAcc>,
    /// Which epochs are evaluated.
    eval: EvalAt,
}

/// Which epochs of a run evaluate Recall@K.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EvalAt {
    /// The last, and every `--eval-every` epochs.
    Config,
    /// The last only.
    Last,
    /// None.
    Never,
}

impl<T: TableScalar> Workload for AlsWork<T> {
    type Restored = (Manifest, usize);
    type Report = EpochReport;
    type Note = std::convert::Infallible;
    const UNIT: &'static str = "half-epoch";

    fn position(&self) -> u64 {
        self.tr.pos.epoch as u64 * 2 + self.tr.pos.half as u64
    }

    fn total(&self) -> u64 {
        self.tr.cfg.epochs as u64 * 2
    }

    fn describe_position(&self) -> String {
        let p = &self.tr.pos;
        format!("at epoch {}, half {}, step {}", p.epoch, p.half, p.step)
    }

    fn stamp_hold(&self, hold: ckpt::Hold) -> ckpt::Hold {
        ckpt::Hold {
            epoch: Some(self.tr.pos.epoch + 1),
            ..hold
        }
    }

    fn past_the_end(&self, path: &Path) -> Option<String> {
        let (at, epochs) = (&self.tr.pos, self.tr.cfg.epochs);
        (at.epoch > epochs || (at.epoch == epochs && (at.half > 0 || at.step > 0))).then(|| {
            format!(
                "{}: the checkpoint is past --epochs {epochs} (epoch {}, half {}, step {}); give --epochs {} or more to continue it",
                path.display(),
                at.epoch,
                at.half,
                at.step,
                at.epoch + 1
            )
        })
    }

    fn global_restore<C: Comm>(&mut self, comm: &C, path: &Path) -> Result<(Manifest, usize)> {
        let (manifest, w, h): (Manifest, Vec<T>, Vec<T>) =
            global_restore(comm, &self.tr.run_state(), path)?;
        let d = self.tr.cfg.dim;
        let basis = manifest.basis.to_basis(d).map_err(Error::Corrupt)?;
        let gram_w = global_gramian(comm, &w, d);
        let gram_h = global_gramian(comm, &h, d);
        self.tr
            .restore(manifest.position.clone(), w, h, gram_w, gram_h);
        self.tr.restore_basis(basis);
        Ok((manifest, self.tr.steps_per_half))
    }

    fn global_step<C: Comm>(
        &mut self,
        comm: &C,
        boundary: &Boundary<'_>,
    ) -> Result<(Status, Option<EpochReport>)> {
        let tr = &mut self.tr;
        let acc = self.acc.get_or_insert_with(|| EpochAcc::start(comm, tr));
        let half = tr.pos.half;
        let (status, loss) = tr.global_half(comm, &mut acc.times, boundary)?;
        if status != Status::Done || half == 0 {
            return Ok((status, None));
        }
        acc.loss = loss;
        tr.global_end_of_training(comm, &mut acc.times);
        let Some(acc) = self.acc.take() else {
            return Ok((status, None));
        };
        let (e, cfg) = (tr.pos.epoch, &tr.cfg);
        let evaluate = match self.eval {
            EvalAt::Config => e == cfg.epochs || (cfg.eval_every > 0 && e % cfg.eval_every == 0),
            EvalAt::Last => e == cfg.epochs,
            EvalAt::Never => false,
        };
        let report = tr.global_epoch_report(comm, acc, evaluate)?;
        Ok((status, Some(report)))
    }

    fn global_checkpoint<C: Comm>(
        &mut self,
        comm: &C,
        _dir: &Path,
        _keep: usize,
    ) -> Result<PathBuf> {
        // The trainer writes into its own `cfg.checkpoint` (the driver's).
        let t = Instant::now();
        let path = self.tr.global_checkpoint(comm)?;
        if let Some(acc) = &mut self.acc {
            acc.times.checkpoint += t.elapsed().as_secs_f64();
        }
        Ok(path)
    }
}

/// What [`global_train_as`] reports while it runs, for the caller to print (the
/// library prints nothing; every rank sees every event).
#[derive(Debug)]
pub enum TrainEvent<'a> {
    /// Restored from the checkpoint at `path` (written by `manifest.world_size` ranks)
    /// in `seconds`, read and verified.
    Resumed {
        path: &'a std::path::Path,
        manifest: &'a Manifest,
        steps_per_half: usize,
        seconds: f64,
    },
    /// An epoch ended.
    Epoch(&'a EpochReport),
}

/// Collective: every rank must call. Trains until `cfg.epochs` are complete (resuming
/// if asked) on the run driver ([`drive::global_drive`]), calling `on_event` on every
/// rank when it resumes and after each epoch, and writes the model if `cfg.out` is set. `T` must be the
/// element type `cfg.table_dtype` names.
pub fn global_train_as<C: Comm, T: TableScalar>(
    comm: &C,
    cfg: &AlsConfig,
    preempt: Preemption,
    mut on_event: impl FnMut(TrainEvent),
) -> Result<(Trainer<T>, TrainReport)> {
    comm.agree(cfg.validate())?;
    if cfg.table_dtype != T::DTYPE {
        return comm.agree(Err(Error::Config(format!(
            "--table-dtype {} but the trainer stores {}",
            cfg.table_dtype,
            T::DTYPE
        ))));
    }
    let mut resumed_from = None;
    let mut epochs = Vec::with_capacity(cfg.epochs);
    let make = || {
        Ok(AlsWork {
            tr: Trainer::<T>::global_new(comm, cfg, preempt.clone())?,
            acc: None,
            eval: EvalAt::Config,
        })
    };
    let work = drive::global_drive(
        comm,
        &cfg.checkpoint,
        &preempt,
        Some(cfg.data.as_path()),
        make,
        |e| match e {
            drive::Event::Resumed {
                path,
                restored: (manifest, steps_per_half),
                seconds,
            } => {
                on_event(TrainEvent::Resumed {
                    path,
                    manifest,
                    steps_per_half: *steps_per_half,
                    seconds,
                });
                resumed_from = Some(manifest.position.clone());
            }
            drive::Event::Progress { .. } => {}
            drive::Event::Report(r) => {
                on_event(TrainEvent::Epoch(r));
                epochs.push(r.clone());
            }
            drive::Event::Note(n) => match n {},
        },
    )?;
    let mut tr = work.tr;
    // Resumed from a checkpoint inside the run with fewer --epochs than it had reached:
    // no epoch ran to undo the rotation (a no-op otherwise).
    tr.global_to_starting_basis(comm);
    let recall = match epochs.last().and_then(|e| e.recall) {
        Some(r) => Some(r),
        None => {
            // Resumed after the last epoch: evaluate the restored tables.
            let mut t = PhaseTimes::default();
            Some(tr.global_evaluate(comm, &mut t)?)
        }
    };
    // Resumed after the last epoch: the loss the checkpoint recorded for it.
    let loss = epochs
        .last()
        .map_or(tr.pos.loss.unwrap_or(f64::NAN), |e| e.loss);
    let report = TrainReport {
        recall,
        loss,
        checksum: tr.global_checksum(comm),
        row_imbalance: tr.shards.row_imbalance,
        col_imbalance: tr.shards.col_imbalance,
        epochs,
        resumed_from,
    };
    if let Some(out) = &cfg.out {
        tr.global_write_model(comm, out, &report)?;
    }
    Ok((tr, report))
}

/// Collective: every rank must call. Trains `tr` from its position until
/// `tr.cfg.epochs` are complete on the run driver ([`drive::global_drive`]) with no
/// checkpoint directory, whatever `tr.cfg.checkpoint` says: for callers that train a
/// model they do not keep (a `tune` point, the measured epochs of `project measure`).
/// `eval` says which epochs evaluate. A preemption signal stops every rank with
/// [`Error::Interrupted`] (nothing is saved), a non-finite value or failed solve with
/// [`Error::Hold`] (no hold file: there is no directory). Returns the trainer and
/// each epoch's report.
pub fn global_train_unsaved<C: Comm, T: TableScalar>(
    comm: &C,
    tr: Trainer<T>,
    eval: EvalAt,
) -> Result<(Trainer<T>, Vec<EpochReport>)> {
    global_train_unsaved_between(comm, tr, eval, || ())
}

/// [`global_train_unsaved`], calling `between` on every rank after each epoch's
/// report (every rank calls it at the same point, so it may communicate; it has no
/// error to return: a failure inside it must stop the job, as one rank's error there
/// would leave the others in its collectives).
pub fn global_train_unsaved_between<C: Comm, T: TableScalar>(
    comm: &C,
    tr: Trainer<T>,
    eval: EvalAt,
    mut between: impl FnMut(),
) -> Result<(Trainer<T>, Vec<EpochReport>)> {
    let preempt = tr.preempt.clone();
    let mut epochs = Vec::new();
    let make = || {
        Ok(AlsWork {
            tr,
            acc: None,
            eval,
        })
    };
    let no_checkpoints = ckpt::CheckpointConfig::default();
    let work = drive::global_drive(comm, &no_checkpoints, &preempt, None, make, |e| {
        if let drive::Event::Report(r) = e {
            epochs.push(r.clone());
            between();
        }
    })?;
    Ok((work.tr, epochs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uncovered_and_merge() {
        assert_eq!(uncovered(0, 10, &[]), vec![(0, 10)]);
        assert_eq!(uncovered(0, 10, &[(2, 4), (6, 12)]), vec![(0, 2), (4, 6)]);
        assert_eq!(uncovered(5, 8, &[(0, 100)]), vec![]);
        assert_eq!(
            merge_ranges(vec![(5, 7), (0, 2), (2, 3), (7, 7), (6, 9)]),
            vec![(0, 3), (5, 9)]
        );
    }
}
