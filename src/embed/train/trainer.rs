//! The training loop of the sharded embedding model.
//!
//! An optimizer step covers a window of global examples (see [`Schedule`]), cut into
//! `K = --accumulate` micro-batches of `M` examples, each cut over the ranks in
//! contiguous blocks (a rank may get none). Per micro-batch: lookup exchange, pooling,
//! MLP forward/backward with the loss weighted by `1 / examples in the step`, dense
//! gradients added into one local buffer, embedding gradients summed per id at the
//! source. Per step: one backward exchange (tables updated once per id), one fused
//! all-reduce (MLP gradients and the data-parallel tables' gradients), the status
//! (non-finite values, preemption) agreed as every workload does
//! ([`crate::ckpt::status`]), one small f64 all-reduce of the loss. The result equals
//! one step on the concatenated batch.

use std::time::Instant;

use ndarray::ArrayView2;

use crate::blocks::block_range;
pub use crate::ckpt::status::StepStatus;
use crate::comm::{Comm, Timer};
use crate::data::clicks::batch::Batch;
use crate::data::clicks::gen::ClickGen;
use crate::data::clicks::source::Source;
use crate::embed::dense::arch::{DenseModel, DenseWorkspace as Workspace};
use crate::embed::dense::auc::{auc, logloss};
use crate::embed::dense::gemm::Gemm;
use crate::embed::dense::mlp::{DenseOpt, DenseOptState};
use crate::embed::sharding::exchange::{
    global_backward, global_lookup, global_lookup_into, local_apply_replicated, pool, BackwardBufs,
    ExchangeCounts, Lookup, StepGrads,
};
use crate::embed::tables::keys::{global_resolve, IdMap, Resolve, ResolveBufs, ResolveCounts};
use crate::embed::tables::placement::Plan;
use crate::embed::tables::store::{Store, TableOpt};
use crate::embed::train::schedule::LrSchedule;
use crate::rng::mix64;
use crate::spec::ModelSpec;
use crate::Result;

/// Which global examples each optimizer step trains on.
///
/// A step takes `K * M` consecutive examples. With a finite log of `N` training
/// examples, windows never straddle the end of a pass: the last window of a pass
/// takes what is left (`N mod KM` examples, so fewer or shorter micro-batches), its
/// loss is the mean over those examples, and the next step starts the next pass
/// at example 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Schedule {
    pub micro: u64,
    pub accumulate: u64,
    pub train_examples: Option<u64>,
}

impl Schedule {
    /// `(first, count)`: the global examples of step `s`.
    pub fn window(&self, s: u64) -> (u64, u64) {
        let w = self.micro * self.accumulate;
        match self.train_examples {
            None => (s * w, w),
            Some(n) => {
                let per_pass = n.div_ceil(w);
                let j = s % per_pass;
                (j * w, w.min(n - j * w))
            }
        }
    }

    /// The micro-batches of a window: `(first, count)` each.
    pub fn micro_batches(&self, s: u64) -> Vec<(u64, u64)> {
        let (first, count) = self.window(s);
        (0..count.div_ceil(self.micro))
            .map(|m| {
                let lo = m * self.micro;
                (first + lo, self.micro.min(count - lo))
            })
            .collect()
    }
}

/// Everything `embed` needs, validated.
#[derive(Clone, Debug)]
pub struct EmbedConfig {
    pub spec: ModelSpec,
    pub seed: u64,
    /// Examples per micro-batch over all ranks.
    pub micro: usize,
    pub accumulate: usize,
    pub steps: u64,
    pub table_opt: TableOpt,
    pub dense_opt: DenseOpt,
    /// The MLP's weight decay (L2 for sgd and adagrad, decoupled for adam; 0: none).
    pub dense_wd: f32,
    /// The learning-rate multiplier of every step, shared by the tables and the MLP.
    pub lr_schedule: LrSchedule,
    /// The kernel of the MLP's matrix products.
    pub dense_gemm: Gemm,
    pub dedup: bool,
    pub pipeline: bool,
    pub eval_examples: u64,
    pub eval_every: u64,
    pub log_every: u64,
    pub mem_per_rank: Option<u64>,
    /// How the data's ids become rows (identity unless a table is `modulo` or `hash`,
    /// or smaller than the data's id space, or the data holds 64-bit keys).
    pub ids: IdMap,
}

impl EmbedConfig {
    /// `steps` steps of `spec` from `seed`, `micro` examples per micro-batch over all
    /// ranks, the tables under `table_opt`; and the rest plain: one micro-batch a step, Adagrad (0.01) for the MLP, the fastest
    /// GEMM this CPU runs ([`Gemm::auto`]), ids deduplicated, no pipelining, no
    /// held-out examples, no interval reports (`log_every` 0), no memory limit of
    /// the plan's, the data's ids as rows. Set the others with struct update syntax.
    pub fn new(spec: ModelSpec, seed: u64, micro: usize, steps: u64, table_opt: TableOpt) -> Self {
        EmbedConfig {
            spec,
            seed,
            micro,
            accumulate: 1,
            steps,
            table_opt,
            dense_opt: DenseOpt::adagrad(0.01),
            dense_wd: 0.0,
            lr_schedule: LrSchedule::default(),
            dense_gemm: Gemm::auto(),
            dedup: true,
            pipeline: false,
            eval_examples: 0,
            eval_every: 0,
            log_every: 0,
            mem_per_rank: None,
            ids: IdMap::default(),
        }
    }
}

/// The hash tables over all ranks: their state at the end of an interval (counters
/// since the run or its resume started) and the interval's keys.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct HashReport {
    /// Rows of all hash tables.
    pub capacity: u64,
    /// Keys held (admitted or counted).
    pub entries: u64,
    /// Keys with a trained row.
    pub admitted: u64,
    pub inserted: u64,
    pub evicted: u64,
    pub expired: u64,
    /// Keys turned away because their table was full of keys of the current step.
    pub refused: u64,
    /// Distinct keys sent to owners in the interval, and those without a row.
    pub keys_sent: u64,
    pub keys_without_row: u64,
}

/// What one reporting interval measured (rank 0's view of global sums).
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct IntervalReport {
    pub step: u64,
    pub steps: u64,
    pub examples: u64,
    pub seconds: f64,
    pub examples_per_s: f64,
    /// Mean training log loss over the interval's examples.
    pub loss: f64,
    /// Bytes sent by all ranks in the interval (lookup, backward, all-reduce) per step.
    pub bytes_per_step: f64,
    pub lookup_bytes_per_step: f64,
    pub backward_bytes_per_step: f64,
    pub allreduce_bytes_per_step: f64,
    /// Hash tables: keys to owners and rows back, per step.
    #[serde(default)]
    pub resolve_bytes_per_step: f64,
    /// Hash tables only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hash: Option<HashReport>,
    /// Ids in the batches over ids sent to owners.
    pub dedup_ratio: f64,
    /// `P * max / sum` of the rows each owner served and updated.
    pub owner_imbalance: f64,
    /// Over the interval, the slowest rank's seconds in: the lookup exchange (with the
    /// owners' pooling of pooled tables), pooling the MLP input, the dense step, the
    /// backward exchange (with the owners' summing, and the update of the pooled
    /// slots they update as soon as they are summed), the other slots' table update,
    /// the all-reduce. With `--pipeline` the lookup is the next step's, and only its
    /// part not hidden behind the dense step is counted (its ids and bytes count in
    /// the step that looked them up).
    pub seconds_lookup: f64,
    pub seconds_pool: f64,
    pub seconds_dense: f64,
    pub seconds_backward: f64,
    pub seconds_update: f64,
    pub seconds_allreduce: f64,
    pub eval_auc: Option<f64>,
    pub eval_logloss: Option<f64>,
    /// Allocations of at least 64 KiB per step ([`crate::allocs::LARGE`]), on the
    /// rank (process) that made the most: 0 once a run's buffers have grown (the
    /// first steps size them).
    #[serde(default)]
    pub large_allocs_per_step: f64,
    /// Per communication phase, the link traffic since the run started (busiest
    /// outgoing link, mean over links, all-to-all hops).
    #[serde(default)]
    pub links: Vec<(String, crate::comm::LinkSummary)>,
    /// Per rank, the seconds of the interval it was busy in the embedding phases:
    /// its lookup, pooling and backward seconds (the owners' work and its own) less
    /// the seconds it spent inside their collectives (sending and waiting).
    #[serde(default)]
    pub busy_per_rank: Vec<f64>,
    /// Per rank, the same in CPU seconds of the rank's process: its CPU seconds in
    /// the embedding phases less those inside their collectives. Time the rank was
    /// not running (ranks sharing cores, other processes) is not in it, so it is the
    /// rank's own work where ranks oversubscribe the cores. Empty with `--pipeline`
    /// (the lookup overlaps the MLP, whose CPU time cannot be told apart).
    #[serde(default)]
    pub busy_cpu_per_rank: Vec<f64>,
}

/// A micro-batch with its rows, fetched ahead.
struct Fetched {
    batch: Batch,
    lookup: Lookup,
}

/// This rank's examples of the micro-batch `(first, count)`: a contiguous block.
fn local_range(p: usize, r: usize, first: u64, count: u64) -> (u64, usize) {
    let (lo, hi) = block_range(count, p, r);
    (first + lo, (hi - lo) as usize)
}

/// How a step reads and resolves its examples.
struct FetchCtx<'a> {
    source: &'a Source,
    ids: &'a IdMap,
    dedup: bool,
    /// The optimizer step the examples train (hash tables count and age by it).
    step: u64,
}

/// Collective: every rank must call. Read this rank's examples of a step (`parts`:
/// one contiguous range per micro-batch, possibly empty), resolve the keys of hash
/// tables and fetch their rows, into `reuse` (a finished step's, whose buffers are
/// kept) when given.
fn fetch<C: Comm>(
    comm: &C,
    cx: FetchCtx<'_>,
    store: &mut Store,
    keys: &mut ResolveBufs,
    parts: &[(u64, usize)],
    reuse: Option<Fetched>,
) -> Result<(Fetched, ExchangeCounts, ResolveCounts)> {
    let mut f = reuse.unwrap_or_else(|| Fetched {
        batch: Batch::empty(&store.spec),
        lookup: Lookup::default(),
    });
    let read = |batch: &mut Batch| -> Result<()> {
        batch.clear();
        cx.source.reserve(parts, batch);
        for &(a, n) in parts {
            cx.source.batch_into(a, n, batch)?;
        }
        cx.ids.apply(batch, &|| cx.source.describe())
    };
    comm.agree(read(&mut f.batch))?;
    let r = global_resolve(
        comm,
        store,
        &mut f.batch,
        Resolve::Train { step: cx.step },
        keys,
    )?;
    let c = global_lookup_into(comm, store, &f.batch, cx.dedup, &mut f.lookup)?;
    Ok((f, c, r))
}

/// The MLP's forward and backward over `x` (`n x width`) cut into one block of rows
/// per workspace, in parallel; gradients are added into `grad` in block order.
#[allow(clippy::too_many_arguments)]
fn dense_chunked(
    mlp: &DenseModel,
    x: &[f32],
    labels: &[f32],
    weight: f32,
    width: usize,
    grad: &mut [f32],
    dx: &mut [f32],
    chunk_ws: &mut [(Workspace, Vec<f32>)],
) -> f64 {
    use rayon::prelude::*;
    let n = labels.len();
    let k = chunk_ws.len();
    let bounds: Vec<(usize, usize)> = (0..k)
        .map(|j| {
            let (a, b) = block_range(n as u64, k, j);
            (a as usize, b as usize)
        })
        .collect();
    let mut dx_parts: Vec<&mut [f32]> = Vec::with_capacity(k);
    let mut rest = dx;
    for &(a, b) in &bounds {
        let (head, tail) = rest.split_at_mut((b - a) * width);
        dx_parts.push(head);
        rest = tail;
    }
    let losses: Vec<f64> = chunk_ws
        .par_iter_mut()
        .zip(dx_parts)
        .zip(&bounds)
        .map(|(((ws, g), dxp), &(a, b))| {
            g.iter_mut().for_each(|v| *v = 0.0);
            let xv = ArrayView2::from_shape((b - a, width), &x[a * width..b * width])
                .expect("the MLP input is n x width by construction");
            mlp.forward_backward(xv, &labels[a..b], weight, g, dxp, ws)
        })
        .collect();
    for (_, g) in chunk_ws.iter() {
        grad.par_chunks_mut(1 << 16)
            .zip(g.par_chunks(1 << 16))
            .for_each(|(d, s)| d.iter_mut().zip(s).for_each(|(d, s)| *d += s));
    }
    losses.iter().sum()
}

/// The state of a run on one rank.
pub struct EmbedTrainer {
    pub cfg: EmbedConfig,
    pub source: Source,
    pub schedule: Schedule,
    pub store: Store,
    /// The dense model (`--arch`): the MLP, DLRM or DCN-v2.
    pub mlp: DenseModel,
    /// Scratch of the dense optimizer's flat view of a multi-part model.
    flat: Vec<f32>,
    pub dense_state: DenseOptState,
    /// Optimizer steps done.
    pub step: u64,
    ws: Workspace,
    /// Per thread: a workspace and a gradient buffer for the chunked dense step.
    chunk_ws: Vec<(Workspace, Vec<f32>)>,
    /// With `--pipeline`: the next step's lookup (all its micro-batches), done before
    /// this step's update (one step stale).
    prefetched: Option<Fetched>,
    /// A finished step's batch and lookup, refilled by the next fetch (their buffers
    /// kept: a step allocates none of its payloads).
    spare: Option<Fetched>,
    /// The step's embedding gradients and the fused dense all-reduce buffer, kept.
    grads: StepGrads,
    fused: Vec<f32>,
    bwd: BackwardBufs,
    /// Rows updated since the last checkpoint (incremental checkpoints only).
    pub dirty: Option<crate::embed::tables::dirty::DirtyRows>,
    /// The gradient of the MLP input (`n x width`; the input is the lookup's), kept
    /// across steps: a fresh buffer per step cost a zero fill that the MLP overwrites.
    dx: Vec<f32>,
    acc: Accum,
    keys: ResolveBufs,
}

/// Counters summed over an interval on this rank.
#[derive(Clone, Debug, Default)]
struct Accum {
    steps: u64,
    examples: u64,
    loss: f64,
    counts: ExchangeCounts,
    t_lookup: f64,
    t_pool: f64,
    t_dense: f64,
    t_backward: f64,
    t_allreduce: f64,
    keys: ResolveCounts,
    start: Option<Instant>,
    bytes0: [u64; 4],
    /// Seconds inside the embedding phases' collectives when the interval started.
    comm0: f64,
    /// This process's CPU seconds in the embedding phases (lookup, pooling,
    /// backward), collectives included.
    cpu_phases: f64,
    /// CPU seconds inside the embedding phases' collectives when the interval
    /// started.
    comm_cpu0: f64,
    /// A lookup ran beside the MLP (`--pipeline`): `cpu_phases` is not the phases'.
    overlapped: bool,
    large_allocs: u64,
}

const PHASES: [&str; 4] = ["lookup", "backward", "allreduce", "resolve"];

fn phase_bytes<C: Comm>(comm: &C) -> [u64; 4] {
    PHASES.map(|p| comm.stats().get(p).bytes_sent)
}

/// Seconds this rank spent inside the collectives of the embedding phases: wall and
/// process CPU seconds.
fn embedding_comm_seconds<C: Comm>(comm: &C) -> (f64, f64) {
    let mut t = crate::comm::PhaseStats::default();
    for p in ["lookup", "backward", "resolve"] {
        t.merge(&comm.stats().get(p));
    }
    (t.seconds, t.cpu_seconds)
}

impl EmbedTrainer {
    /// This rank's part of a fresh model.
    pub fn new(cfg: EmbedConfig, source: Source, plan: &Plan, rank: usize) -> Result<Self> {
        // One BLAS thread: the MLP's bits must not depend on OpenBLAS's threading.
        crate::cpu::blas_single_thread();
        if cfg.pipeline && !crate::embed::tables::keys::hash_tables(&cfg.spec).is_empty() {
            // The next step's keys would be admitted and evicted (and counted)
            // before this step's gradients are applied and before a checkpoint.
            return Err(crate::Error::Config(
                "pipelining with hash tables: refused (their keys are resolved once per step, before its lookup)".into(),
            ));
        }
        let store = Store::new(
            &cfg.spec,
            plan,
            rank,
            cfg.table_opt,
            cfg.seed,
            cfg.mem_per_rank,
        )?;
        let mut mlp = DenseModel::new(&cfg.spec, cfg.seed)?;
        mlp.set_gemm(cfg.dense_gemm)?;
        let dense_state = cfg.dense_opt.new_state(mlp.n_params());
        let schedule = Schedule {
            micro: cfg.micro as u64,
            accumulate: cfg.accumulate as u64,
            train_examples: source.train_examples(),
        };
        let grads = StepGrads::new(&store, cfg.dedup);
        Ok(EmbedTrainer {
            cfg,
            source,
            schedule,
            store,
            mlp,
            flat: Vec::new(),
            dense_state,
            step: 0,
            ws: Workspace::default(),
            chunk_ws: Vec::new(),
            prefetched: None,
            spare: None,
            grads,
            fused: Vec::new(),
            bwd: BackwardBufs::default(),
            dirty: None,
            dx: Vec::new(),
            acc: Accum::default(),
            keys: ResolveBufs::default(),
        })
    }

    /// Read this rank's examples of steps `from..to` into memory now (`--preload`).
    pub fn local_preload(&mut self, p: usize, rank: usize, from: u64, to: u64) -> Result<()> {
        let mut cache = std::collections::HashMap::new();
        for s in from..to {
            for (a, n) in self.local_parts(p, rank, s) {
                if let std::collections::hash_map::Entry::Vacant(e) = cache.entry((a, n)) {
                    e.insert(self.source.batch(a, n)?);
                }
            }
        }
        let placeholder = Source::Generated(ClickGen::new(&self.cfg.spec, 0));
        let inner = std::mem::replace(&mut self.source, placeholder);
        self.source = Source::Preloaded {
            inner: Box::new(inner),
            cache,
        };
        Ok(())
    }

    /// Forget the pipelined lookup of the next step, so that it is looked up again
    /// on the updated tables (after a checkpoint: a run resumed from it has no stale
    /// lookup to use, and this keeps the two runs' bits equal).
    pub fn drop_prefetched(&mut self) {
        if let Some(f) = self.prefetched.take() {
            self.spare = Some(f);
        }
    }

    /// This rank's examples of each micro-batch of step `s`.
    fn local_parts(&self, comm_size: usize, rank: usize, s: u64) -> Vec<(u64, usize)> {
        self.schedule
            .micro_batches(s)
            .into_iter()
            .map(|(f, c)| local_range(comm_size, rank, f, c))
            .collect()
    }

    /// Collective: every rank must call. One optimizer step: one lookup exchange for
    /// all of the step's micro-batches (the tables do not change within a step, and
    /// the ids are deduplicated over the whole step), the MLP micro-batch by
    /// micro-batch, one backward exchange, one fused all-reduce.
    ///
    /// Phases: the step's rows, pooled ([`Self::global_fetch_pooled`]); the dense step
    /// (with the next step's lookup meanwhile when pipelined,
    /// [`Self::global_dense_step`]); the tables' gradients and the agreed status; the
    /// backward exchange, the all-reduce and the optimizers ([`Self::global_update`]).
    pub fn global_step<C: Comm>(&mut self, comm: &C, preempt_flag: bool) -> Result<StepStatus> {
        let t_step = Instant::now();
        let allocs0 = crate::allocs::large_allocations();
        if self.acc.start.is_none() {
            self.acc.start = Some(t_step);
            self.acc.bytes0 = phase_bytes(comm);
            (self.acc.comm0, self.acc.comm_cpu0) = embedding_comm_seconds(comm);
        }
        let (p, rank) = (comm.size(), comm.rank());
        let (_, count) = self.schedule.window(self.step);
        let weight = 1.0 / count as f32;
        let n_params = self.mlp.n_params();
        self.grads.reset();
        // The MLP's part accumulates from zero; the replicated tables' part is copied
        // in whole before the all-reduce.
        crate::allocs::resize_for_overwrite(&mut self.fused, n_params + self.grads.dense_len());
        self.fused[..n_params].fill(0.0);
        let mut counts = ExchangeCounts::default();

        let parts = self.local_parts(p, rank, self.step);
        let current = self.global_fetch_pooled(comm, &parts, &mut counts)?;
        let mut loss = self.global_dense_step(comm, &current, &parts, weight, &mut counts)?;
        // Expanding d loss / d input into the tables' gradients is the backward's.
        let t = Timer::start();
        self.grads
            .accumulate(&self.store, &current.batch, &current.lookup, &self.dx);
        self.acc.t_backward += t.elapsed().as_secs_f64();
        self.acc.cpu_phases += t.cpu_elapsed();

        if crate::ckpt::faults::inject_nan(self.step as usize + 1, comm.rank()) {
            loss = f64::NAN;
        }
        if crate::ckpt::faults::inject_nan_grad(self.step as usize + 1, comm.rank()) {
            self.grads.plant_nan();
        }
        // Status first: nothing is applied when any rank saw a non-finite value.
        let finite = loss.is_finite()
            && self.fused[..n_params].iter().all(|v| v.is_finite())
            && self.grads.all_finite();
        let status = StepStatus::global_agree(comm, !finite, preempt_flag);
        if let StepStatus::NonFinite { .. } = status {
            return Ok(status);
        }
        let mut loss_sum = [loss];
        comm.all_reduce_sum(&mut loss_sum);

        self.global_update(comm, current, n_params, &mut counts)?;

        self.step += 1;
        self.acc.steps += 1;
        self.acc.large_allocs += crate::allocs::large_allocations() - allocs0;
        self.acc.examples += count;
        self.acc.loss += loss_sum[0];
        self.acc.counts += counts;
        Ok(status)
    }

    /// Collective: every rank must call. Phase 1 of [`Self::global_step`]: this step's
    /// examples and rows (`parts`: this rank's micro-batches), prefetched by the last
    /// step or looked up now, pooled into the MLP input.
    fn global_fetch_pooled<C: Comm>(
        &mut self,
        comm: &C,
        parts: &[(u64, usize)],
        counts: &mut ExchangeCounts,
    ) -> Result<Fetched> {
        let mut current = match self.prefetched.take() {
            Some(f) => f,
            None => {
                let t = Timer::start();
                let spare = self.spare.take();
                let cx = FetchCtx {
                    source: &self.source,
                    ids: &self.cfg.ids,
                    dedup: self.cfg.dedup,
                    step: self.step,
                };
                let (f, c, r) = fetch(comm, cx, &mut self.store, &mut self.keys, parts, spare)?;
                *counts += c;
                self.acc.keys += r;
                self.acc.t_lookup += t.elapsed().as_secs_f64();
                self.acc.cpu_phases += t.cpu_elapsed();
                f
            }
        };
        let t = Timer::start();
        pool(&self.store, &current.batch, &mut current.lookup);
        self.acc.t_pool += t.elapsed().as_secs_f64();
        self.acc.cpu_phases += t.cpu_elapsed();
        Ok(current)
    }

    /// Collective when pipelined (the next step's lookup), local otherwise. Phase 2 of
    /// [`Self::global_step`]: the MLP's forward and backward micro-batch by
    /// micro-batch (`parts`), its gradient summed into the fused buffer and d loss /
    /// d input into `self.dx`. Returns this rank's loss.
    fn global_dense_step<C: Comm>(
        &mut self,
        comm: &C,
        current: &Fetched,
        parts: &[(u64, usize)],
        weight: f32,
        counts: &mut ExchangeCounts,
    ) -> Result<f64> {
        let (p, rank) = (comm.size(), comm.rank());
        let n_params = self.mlp.n_params();
        let width = self.cfg.spec.mlp_input();
        let n = current.batch.n;
        // Every value is overwritten by the MLP's backward (its last product has beta 0).
        self.dx.resize(n * width, 0.0);

        // The dense step, micro-batch by micro-batch (dense gradients summed locally).
        let next_parts = (self.cfg.pipeline && self.step + 1 < self.cfg.steps)
            .then(|| self.local_parts(p, rank, self.step + 1));
        let mlp = &self.mlp;
        let threads = rayon::current_num_threads();
        if self.chunk_ws.len() != threads {
            self.chunk_ws = (0..threads)
                .map(|_| (Workspace::default(), vec![0.0; n_params]))
                .collect();
        }
        let ws = &mut self.ws;
        let chunk_ws = &mut self.chunk_ws;
        let (x, dx) = (&current.lookup.x, &mut self.dx);
        let labels = &current.batch.labels;
        let sizes: Vec<usize> = parts.iter().map(|&(_, c)| c).collect();
        let grad_dense = &mut self.fused[..n_params];
        let mut dense = || -> Result<(f64, f64)> {
            let t = Instant::now();
            let mut loss = 0.0;
            let mut lo = 0;
            for &c in &sizes {
                let xs = &x[lo * width..(lo + c) * width];
                let ls = &labels[lo..lo + c];
                let dxs = &mut dx[lo * width..(lo + c) * width];
                if chunk_ws.len() > 1 && c >= 64 * chunk_ws.len() {
                    // Several threads: one block of rows each, gradients summed in
                    // block order (the bits depend on the thread count, as promised).
                    loss += dense_chunked(mlp, xs, ls, weight, width, grad_dense, dxs, chunk_ws);
                } else {
                    let xv = ArrayView2::from_shape((c, width), xs)
                        .expect("the MLP input is n x width by construction");
                    loss += mlp.forward_backward(xv, ls, weight, grad_dense, dxs, ws);
                }
                lo += c;
            }
            Ok((loss, t.elapsed().as_secs_f64()))
        };
        let t = Instant::now();
        let (dense_res, prefetched) = match &next_parts {
            // Pipelined: the next step's lookup (one step stale) runs meanwhile.
            Some(np) => {
                let cx = FetchCtx {
                    source: &self.source,
                    ids: &self.cfg.ids,
                    dedup: self.cfg.dedup,
                    step: self.step + 1,
                };
                let (store, keys) = (&mut self.store, &mut self.keys);
                let spare = self.spare.take();
                std::thread::scope(|s| {
                    let h = s.spawn(dense);
                    let f = fetch(comm, cx, store, keys, np, spare);
                    (h.join().expect("MLP thread panicked"), Some(f))
                })
            }
            None => (dense(), None),
        };
        let wall = t.elapsed().as_secs_f64();
        let (loss, t_dense) = dense_res?;
        self.acc.t_dense += t_dense;
        if let Some(f) = prefetched {
            let (f, c, r) = f?;
            *counts += c;
            self.acc.keys += r;
            self.acc.t_lookup += (wall - t_dense).max(0.0);
            self.acc.overlapped = true;
            self.prefetched = Some(f);
        }
        Ok(loss)
    }

    /// Collective: every rank must call. Last phase of [`Self::global_step`]: the
    /// backward exchange (the tables' updates at their owners), the fused all-reduce
    /// of the MLP's and the replicated tables' gradients, and their optimizers.
    /// `current`'s buffers are kept for the next fetch.
    fn global_update<C: Comm>(
        &mut self,
        comm: &C,
        current: Fetched,
        n_params: usize,
        counts: &mut ExchangeCounts,
    ) -> Result<()> {
        // The tables' optimizer at this step's rate (and Adam's bias corrections).
        let mult = self.cfg.lr_schedule.mult(self.step);
        self.store.opt = self.cfg.table_opt.at_step(mult, self.step);
        let t = Timer::start();
        *counts += global_backward(
            comm,
            &mut self.store,
            &mut self.grads,
            &current.lookup.served,
            &mut self.bwd,
        )?;
        self.acc.t_backward += t.elapsed().as_secs_f64();
        self.acc.cpu_phases += t.cpu_elapsed();
        if let Some(d) = &mut self.dirty {
            d.mark_owned(&self.store, comm.rank(), self.bwd.owned_rows());
        }
        self.spare = Some(current);

        let t = Instant::now();
        self.grads.copy_dense_into(&mut self.fused[n_params..]);
        {
            let _p = comm.stats().phase("allreduce");
            comm.all_reduce_sum(&mut self.fused);
        }
        self.acc.t_allreduce += t.elapsed().as_secs_f64();
        let (opt, grad, st) = (
            &self.cfg.dense_opt,
            &self.fused[..n_params],
            &mut self.dense_state,
        );
        let (mult, wd) = (self.cfg.lr_schedule.mult(self.step), self.cfg.dense_wd);
        self.mlp
            .with_flat_mut(&mut self.flat, |p| opt.apply_at(p, grad, st, mult, wd));
        local_apply_replicated(&mut self.store, &self.fused[n_params..]);
        if let Some(d) = &mut self.dirty {
            d.mark_replicated(&self.store, &self.fused[n_params..]);
        }
        Ok(())
    }

    /// Collective: every rank must call (a no-op without hash tables). The hash
    /// tables' state over all ranks, with the interval's keys sent and keys without
    /// a row.
    fn global_hash_report<C: Comm>(&self, comm: &C, sent: u64, no_row: u64) -> Option<HashReport> {
        if self.store.hash.iter().all(Option::is_none) {
            return None;
        }
        let st = crate::embed::tables::keys::local_stats(&self.store);
        let (mut entries, mut admitted) = (0u64, 0u64);
        for h in self.store.hash.iter().flatten() {
            entries += h.len() as u64;
            admitted += h.admitted() as u64;
        }
        let mut v = [
            entries,
            admitted,
            st.inserted,
            st.evicted,
            st.expired,
            st.refused,
        ];
        comm.all_reduce_sum(&mut v);
        let capacity = crate::embed::tables::keys::hash_tables(&self.store.spec)
            .iter()
            .map(|&t| self.store.spec.tables[t].vocab)
            .sum();
        Some(HashReport {
            capacity,
            entries: v[0],
            admitted: v[1],
            inserted: v[2],
            evicted: v[3],
            expired: v[4],
            refused: v[5],
            keys_sent: sent,
            keys_without_row: no_row,
        })
    }

    /// Collective: every rank must call. The interval's report (global sums), and
    /// reset the counters.
    pub fn global_interval<C: Comm>(&mut self, comm: &C) -> Result<IntervalReport> {
        let a = std::mem::take(&mut self.acc);
        let seconds = a.start.map(|s| s.elapsed().as_secs_f64()).unwrap_or(0.0);
        let b1 = phase_bytes(comm);
        let mut sums = [
            a.counts.occurrences,
            a.counts.sent,
            b1[0] - a.bytes0[0],
            b1[1] - a.bytes0[1],
            b1[2] - a.bytes0[2],
            b1[3] - a.bytes0[3],
            a.keys.sent,
            a.keys.no_row,
        ];
        comm.all_reduce_sum(&mut sums);
        let hash = self.global_hash_report(comm, sums[6], sums[7]);
        let owner = comm.all_gather_v(&[a.counts.owner_rows])?.data;
        let (comm_wall, comm_cpu) = embedding_comm_seconds(comm);
        let in_comm = comm_wall - a.comm0;
        let busy = (a.t_lookup + a.t_pool + a.t_backward - in_comm).max(0.0);
        let busy_cpu = (a.cpu_phases - (comm_cpu - a.comm_cpu0)).max(0.0);
        // Per rank [wall, CPU]; the CPU seconds are dropped on every rank alike when
        // a lookup overlapped the MLP (--pipeline is the run's).
        let both = comm.all_gather_v(&[busy, busy_cpu])?.data;
        let busy_per_rank: Vec<f64> = both.iter().step_by(2).copied().collect();
        let busy_cpu_per_rank: Vec<f64> = if a.overlapped {
            Vec::new()
        } else {
            both.iter().skip(1).step_by(2).copied().collect()
        };
        let update = a.counts.update_seconds;
        let mut times = [
            a.t_lookup,
            a.t_dense,
            a.t_backward - update,
            a.t_allreduce,
            seconds,
            a.t_pool,
            update,
        ];
        let mut tmax = times;
        // Seconds: the slowest rank's.
        for v in tmax.iter_mut() {
            *v = comm.all_reduce_max(v.to_bits()) as f64;
        }
        for (v, m) in times.iter_mut().zip(tmax) {
            *v = f64::from_bits(m as u64);
        }
        let steps = a.steps.max(1) as f64;
        let allocs = comm.all_reduce_max(a.large_allocs);
        let owner_sum: u64 = owner.iter().sum();
        let owner_max = owner.iter().copied().max().unwrap_or(0);
        Ok(IntervalReport {
            step: self.step,
            steps: a.steps,
            examples: a.examples,
            seconds: times[4],
            examples_per_s: a.examples as f64 / times[4].max(1e-9),
            loss: a.loss / a.examples.max(1) as f64,
            bytes_per_step: (sums[2] + sums[3] + sums[4] + sums[5]) as f64 / steps,
            resolve_bytes_per_step: sums[5] as f64 / steps,
            hash,
            lookup_bytes_per_step: sums[2] as f64 / steps,
            backward_bytes_per_step: sums[3] as f64 / steps,
            allreduce_bytes_per_step: sums[4] as f64 / steps,
            dedup_ratio: sums[0] as f64 / sums[1].max(1) as f64,
            owner_imbalance: if owner_sum == 0 {
                1.0
            } else {
                comm.size() as f64 * owner_max as f64 / owner_sum as f64
            },
            seconds_lookup: times[0],
            seconds_pool: times[5],
            seconds_dense: times[1],
            seconds_backward: times[2],
            seconds_update: times[6],
            seconds_allreduce: times[3],
            eval_auc: None,
            eval_logloss: None,
            large_allocs_per_step: allocs as f64 / steps,
            links: if comm.size() > 1 {
                crate::comm::global_link_summary(comm)?
            } else {
                Vec::new()
            },
            busy_per_rank,
            busy_cpu_per_rank,
        })
    }

    /// Collective: every rank must call. A checksum of every table value by (table,
    /// global row, column), of every row's optimizer state, of the MLP and of its
    /// optimizer state: independent of the placement and the rank count, equal when
    /// the model is bitwise equal.
    pub fn global_checksum<C: Comm>(&self, comm: &C) -> Result<u64> {
        use rayon::prelude::*;
        // Keys: table < 2^20, row < 2^32, column < 2^12 (MAX_DIM); the state of a row
        // takes column 4095 + its index in a separate salt.
        let term = |salt: u64, key: u64, v: f32| {
            mix64(salt ^ mix64(key ^ mix64(v.to_bits() as u64))) >> 24
        };
        let mut sum: u64 = 0;
        for ls in &self.store.local {
            if ls.shard.replica && comm.rank() != 0 {
                continue;
            }
            if let Some(h) = &self.store.hash[ls.shard.table] {
                // By key, not slot: the same entries give the same sum on any
                // rank count.
                let (w, sp) = (ls.shard.width(), self.store.state_per_row(ls.shard.table));
                let salt = mix64(ls.shard.table as u64 + 1);
                for e in h.entries() {
                    let base = mix64(e.key ^ salt);
                    let s = e.slot as usize;
                    let mut acc = term(5, base, f32::from_bits(e.count))
                        .wrapping_add(term(6, base, f32::from_bits(e.last_seen as u32)))
                        .wrapping_add(term(
                            6,
                            base ^ 1,
                            f32::from_bits((e.last_seen >> 32) as u32),
                        ));
                    for (j, &v) in ls.data[s * w..(s + 1) * w].iter().enumerate() {
                        acc = acc.wrapping_add(term(7, base.wrapping_add(j as u64), v));
                    }
                    for (j, &v) in ls.state[s * sp..(s + 1) * sp].iter().enumerate() {
                        acc = acc.wrapping_add(term(8, base.wrapping_add(j as u64), v));
                    }
                    sum = sum.wrapping_add(acc);
                }
                continue;
            }
            let t = ls.shard.table as u64;
            let w = ls.shard.width();
            let c0 = ls.shard.cols.start as u64;
            let rows = ls.shard.rows;
            let sp = self.store.state_per_row(ls.shard.table);
            // Column shards hold copies of one row statistic: the first one counts it.
            let count_state = ls.shard.cols.start == 0;
            // A bf16 or f16 table's values, widened (exactly): the sum a table of the
            // same values at f32 would have.
            let data = ls.rows_f32();
            let part: u64 = (0..ls.rows as usize)
                .into_par_iter()
                .map(|r| {
                    let g = rows.global(r as u64);
                    let base = (t << 44) | (g << 12);
                    let mut acc = data[r * w..(r + 1) * w]
                        .iter()
                        .enumerate()
                        .fold(0u64, |acc, (j, &v)| {
                            acc.wrapping_add(term(1, base | (c0 + j as u64), v))
                        });
                    if count_state {
                        for (j, &v) in ls.state[r * sp..(r + 1) * sp].iter().enumerate() {
                            acc = acc.wrapping_add(term(2, base | j as u64, v));
                        }
                    }
                    acc
                })
                .reduce(|| 0, u64::wrapping_add);
            sum = sum.wrapping_add(part);
        }
        if comm.rank() == 0 {
            for (i, &v) in self.mlp.flat().iter().enumerate() {
                sum = sum.wrapping_add(term(3, i as u64, v));
            }
            for (i, &v) in self.dense_state.state().iter().enumerate() {
                sum = sum.wrapping_add(term(4, i as u64, v));
            }
        }
        // Sum the 40-bit parts of every rank without overflow: low and high halves.
        let mut parts = [sum & 0xffff_ffff, sum >> 32];
        comm.all_reduce_sum(&mut parts);
        Ok(parts[0].wrapping_add(parts[1] << 32))
    }

    /// Collective: every rank must call. AUC and log loss of the held-out examples
    /// (pipelining never applies here: the tables are current).
    pub fn global_evaluate<C: Comm>(&mut self, comm: &C) -> Result<(Option<f64>, Option<f64>)> {
        let total = self.cfg.eval_examples;
        let mut logits = Vec::new();
        let mut labels = Vec::new();
        let width = self.cfg.spec.mlp_input();
        let mut done = 0;
        while done < total {
            let count = (self.schedule.micro).min(total - done);
            let (a, n) = local_range(comm.size(), comm.rank(), done, count);
            let read = || -> Result<Batch> {
                let mut b = self.source.eval_batch(a, n)?;
                self.cfg.ids.apply(&mut b, &|| self.source.describe())?;
                Ok(b)
            };
            let mut batch = comm.agree(read())?;
            let how = Resolve::Lookup { step: self.step };
            global_resolve(comm, &mut self.store, &mut batch, how, &mut self.keys)?;
            let (mut lk, _) = global_lookup(comm, &self.store, &batch, true)?;
            pool(&self.store, &batch, &mut lk);
            let xv = ArrayView2::from_shape((batch.n, width), &lk.x)
                .expect("the MLP input is n x width by construction");
            logits.extend(self.mlp.predict(xv, &mut self.ws));
            labels.extend_from_slice(&batch.labels);
            done += count;
        }
        let logits = comm.all_gather_v(&logits)?.data;
        let labels = comm.all_gather_v(&labels)?.data;
        Ok((auc(&logits, &labels), logloss(&logits, &labels)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn training_indices_skip_a_held_out_range_in_the_middle_of_a_log() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log.h5");
        let spec = crate::spec::preset("tiny", 1.0).unwrap();
        crate::data::clicks::log_file::write_click_log(&path, &spec, 3, 40, false, 7).unwrap();
        let log = crate::data::clicks::log_file::ClickLog::open(&path).unwrap();
        let whole = log.read(0, 40).unwrap();
        let src = Source::Log {
            log,
            eval: 10..25,
            eval_day: Some(1),
        };
        assert_eq!(src.train_examples(), Some(25));
        assert_eq!(src.eval_examples(), Some(15));
        // Before, across and after the held-out range.
        assert_eq!(src.batch(0, 10).unwrap(), whole.slice(0, 10));
        let mut across = whole.slice(5, 10);
        across.append(&whole.slice(25, 30));
        assert_eq!(src.batch(5, 10).unwrap(), across);
        assert_eq!(src.batch(12, 13).unwrap(), whole.slice(27, 40));
        assert_eq!(src.eval_batch(0, 15).unwrap(), whole.slice(10, 25));
        assert!(src.identity().contains("eval-day 1"));
    }

    #[test]
    fn the_chunked_dense_step_equals_the_whole_batch() {
        let layers = [20, 16, 8, 1];
        let mlp = DenseModel::Mlp(crate::embed::dense::mlp::Mlp::new(&layers, 3).unwrap());
        let n = 300;
        let mut rng = crate::rng::SplitMix64::new(9);
        let x: Vec<f32> = (0..n * 20).map(|_| rng.next_normal() as f32).collect();
        let y: Vec<f32> = (0..n).map(|i| (i % 3 == 0) as u8 as f32).collect();
        let w = 1.0 / n as f32;
        let mut g1 = vec![0.0; mlp.n_params()];
        let mut dx1 = vec![0.0; n * 20];
        let xv = ArrayView2::from_shape((n, 20), &x).unwrap();
        let l1 = mlp.forward_backward(xv, &y, w, &mut g1, &mut dx1, &mut Workspace::default());
        for k in [2, 3, 7] {
            let mut ws: Vec<(Workspace, Vec<f32>)> = (0..k)
                .map(|_| (Workspace::default(), vec![0.0; mlp.n_params()]))
                .collect();
            let mut g2 = vec![0.0; mlp.n_params()];
            let mut dx2 = vec![0.0; n * 20];
            let l2 = dense_chunked(&mlp, &x, &y, w, 20, &mut g2, &mut dx2, &mut ws);
            assert!((l1 - l2).abs() < 1e-6 * l1.abs().max(1.0), "{l1} {l2}");
            let scale = g1.iter().map(|v| v.abs()).fold(0.0, f32::max);
            for (a, b) in g1.iter().zip(&g2) {
                assert!((a - b).abs() <= 1e-5 * scale, "k={k}: {a} vs {b}");
            }
            assert_eq!(dx1.len(), dx2.len());
            for (a, b) in dx1.iter().zip(&dx2) {
                assert!((a - b).abs() <= 1e-6, "k={k}: dx {a} vs {b}");
            }
        }
    }

    #[test]
    fn windows_cover_a_pass_and_never_straddle_its_end() {
        let s = Schedule {
            micro: 4,
            accumulate: 3,
            train_examples: Some(30),
        };
        // 30 examples, windows of 12: 12, 12, 6, then the next pass.
        assert_eq!(s.window(0), (0, 12));
        assert_eq!(s.window(1), (12, 12));
        assert_eq!(s.window(2), (24, 6));
        assert_eq!(s.window(3), (0, 12));
        assert_eq!(s.micro_batches(2), vec![(24, 4), (28, 2)]);
        let g = Schedule {
            micro: 5,
            accumulate: 2,
            train_examples: None,
        };
        assert_eq!(g.micro_batches(3), vec![(30, 5), (35, 5)]);
    }
}
