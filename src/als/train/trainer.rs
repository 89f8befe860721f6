//! The distributed model state of one rank ([`Trainer`]): its construction from the
//! shards, its position, and one half-epoch run step by step (the steps in
//! `steps.rs`, the gathers in `gather.rs`, the loss in `loss.rs`).

use super::loss::{global_assemble_loss, local_loss_pass_spilled, loss_pass, LOSS_BLOCK};
use super::ranges::merge_ranges;
use super::report::PhaseTimes;
use super::shards::global_read_shards_for;
use super::side::Side;
use super::tables::{global_gramian, init_table};
use crate::als::checkpoint::{Basis, Position};
use crate::als::eval::{EvalReport, EvalSet, Recall};
use crate::als::model::TableScalar;
use crate::als::shard::csr::global_check_transpose;
use crate::als::shard::read::Shards;
use crate::als::shard::spill::{Chunk, ChunkReader};
use crate::als::solve::{fold_loss_chunks, LossTerms, SolveParams};
use crate::als::{AlsConfig, SolverKind};
use crate::ckpt::driver::{Boundary, Status};
use crate::ckpt::signals::Preemption;
use crate::comm::Comm;
use crate::error::Result;
use crate::rng::stream;
use std::time::Instant;

/// The distributed model state of one rank, with tables stored as `T` (f32 or bf16).
pub struct Trainer<T: TableScalar = f32> {
    pub cfg: AlsConfig,
    /// Sizes, bounds and the test set; its `rows`/`cols` CSRs live in the sides
    /// ([`Trainer::rows_side`], [`Trainer::cols_side`]) and are empty here.
    pub shards: Shards,
    pub(super) rows: Side,
    pub(super) cols: Side,
    pub w: Vec<T>,
    pub h: Vec<T>,
    pub(super) gram_w: Vec<f64>,
    pub(super) gram_h: Vec<f64>,
    pub(super) eval: EvalSet,
    pub steps_per_half: usize,
    pub pos: Position,
    /// Rows of the current half's solved side done on this rank (global ranges).
    pub(super) local_done: Vec<(u64, u64)>,
    /// The fixed table's rows gathered for the current half.
    pub(super) gathered: Gathered<T>,
    pub preempt: Preemption,
    /// The f32 copy of a step's rows when the tables are bf16 (reused).
    pub(super) scratch: Vec<f32>,
    /// A spilled side's chunks of the current half.
    pub(super) chunks: Chunks,
    /// The loss pieces of the current half, as its solves compute them.
    pub(super) half_loss: HalfLoss,
    /// With `--basis eigen`: the rotation the tables are in, relative to the starting
    /// basis, and the diagonal of the fixed side's Gramian once this half rotated the
    /// tables into its eigenbasis.
    pub(super) basis: Basis,
}

/// The fixed table's rows gathered for the current half, and the buffer kept for the
/// next gather.
pub(super) struct Gathered<T> {
    /// The gathered fixed table of the current half, once fetched (`Some(None)`: the
    /// local table itself, on one rank).
    pub(super) rows: Option<Option<Vec<T>>>,
    /// Gathering in blocks: the own block whose rows `rows` holds.
    pub(super) block: Option<usize>,
    /// The buffer of the last gathered rows, kept for the next gather (a fresh one
    /// of hundreds of MB is page-faulted and zeroed by the kernel again); freed
    /// before an evaluation or a checkpoint, which may need the memory, and when
    /// training is over.
    pub(super) spare: Vec<T>,
}

impl<T> Default for Gathered<T> {
    fn default() -> Self {
        Self {
            rows: None,
            block: None,
            spare: Vec::new(),
        }
    }
}

/// A spilled side's chunks of the current half: read ahead, the one in use, and the
/// buffers of the last half's reader.
#[derive(Default)]
pub(super) struct Chunks {
    /// The reader of the chunks read ahead.
    pub(super) reader: Option<ChunkReader>,
    /// The chunk in use.
    pub(super) current: Option<Chunk>,
    /// The chunk buffers of the last half's reader, for the next one (freed with the
    /// gathered rows' spare, [`Trainer::free_spares`]).
    pub(super) spares: Vec<Vec<u32>>,
}

/// The loss pieces of the current half, gathered as its solves run.
#[derive(Default)]
pub(super) struct HalfLoss {
    /// Gathering in blocks without fused loss terms: the terms of the steps so far.
    pub(super) per_step: Option<Vec<(f64, f64)>>,
    /// The loss pieces the CG solves of this half computed on the fly, when the whole
    /// half runs in this process (`None` after resuming inside a half: then the loss
    /// takes a separate pass over the observed cells).
    pub(super) fused: Option<LossTerms>,
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
            gathered: Gathered::default(),
            chunks: Chunks::default(),
            preempt,
            scratch: Vec::new(),
            half_loss: HalfLoss::default(),
            basis: Basis::default(),
        })
    }

    pub(super) fn params(&self, n_other: u64) -> SolveParams {
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
        self.gathered.rows = None;
        self.gathered.block = None;
        self.chunks.reader = None;
        self.chunks.current = None;
        self.half_loss.per_step = None;
        self.half_loss.fused = None;
        self.basis = Basis::default();
    }

    /// Collective: every rank must call. Runs the remaining steps of the current half;
    /// at every step boundary the ranks agree on preemption and non-finite values.
    /// Returns the loss after the half (`None` after a row half unless `--loss-every-half`).
    pub(super) fn global_half<C: Comm>(
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
            self.half_loss.fused =
                (want_loss && self.cfg.solver == SolverKind::Cg).then(LossTerms::default);
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
            let loss = self.global_half_loss(comm, params, n_solved, &gram_solved)?;
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
        self.gathered.block = None;
        self.chunks.reader = None;
        self.chunks.current = None;
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

    /// Collective: every rank must call. The exact loss after the current half (its
    /// Gramian `gram_solved` computed): the solved side's pieces from the fused CG
    /// terms, the per-step terms, or a separate pass over the observed cells (in
    /// memory or spilled), then their assembly ([`global_assemble_loss`]).
    fn global_half_loss<C: Comm>(
        &mut self,
        comm: &C,
        params: SolveParams,
        n_solved: u64,
        gram_solved: &[f64],
    ) -> Result<f64> {
        let d = self.cfg.dim;
        let f32_tables = T::as_f32(&self.w[..0]).is_some();
        let pieces = match (self.half_loss.fused.take(), self.half_loss.per_step.take()) {
            (Some(f), _) => (f.observed, f.reg),
            (None, Some(accs)) => fold_loss_chunks(&accs, (!f32_tables).then_some(LOSS_BLOCK)),
            (None, None) if self.side().spill.is_some() => {
                let (side, solved, fixed) = self.solved_and_fixed();
                comm.agree(local_loss_pass_spilled(side, solved, fixed, d, params))?
            }
            (None, None) => {
                let (side, solved, fixed) = self.solved_and_fixed();
                loss_pass(solved, &side.shard, fixed, d, params)
            }
        };
        let (fixed_local, fixed_counts, gram_fixed) = if self.pos.half == 0 {
            (&self.h, &self.cols.counts, &self.gram_h)
        } else {
            (&self.w, &self.rows.counts, &self.gram_w)
        };
        Ok(global_assemble_loss(
            comm,
            pieces,
            fixed_local,
            fixed_counts,
            n_solved,
            gram_solved,
            gram_fixed,
            d,
            params,
            self.cfg.reg,
        ))
    }

    /// Free the buffers kept for the next half (the gathered rows' spare, the chunk
    /// buffers): before an
    /// evaluation or a checkpoint, which may need the memory, and when training is
    /// over.
    pub(super) fn free_spares(&mut self) {
        self.gathered.spare = Vec::new();
        self.chunks.spares = Vec::new();
    }

    /// Drop the gathered rows, keeping their buffer for the next gather.
    pub(super) fn keep_fixed_as_spare(&mut self) {
        if let Some(Some(v)) = self.gathered.rows.take() {
            self.gathered.spare = v;
        }
    }

    /// The side solved in the current half.
    pub(super) fn side(&self) -> &Side {
        if self.pos.half == 0 {
            &self.rows
        } else {
            &self.cols
        }
    }

    /// The solved side, its table, and the gathered fixed rows (or the local fixed
    /// table itself on one rank).
    pub(super) fn solved_and_fixed(&self) -> (&Side, &[T], &[T]) {
        let (side, solved, fixed_local) = if self.pos.half == 0 {
            (&self.rows, &self.w, &self.h)
        } else {
            (&self.cols, &self.h, &self.w)
        };
        let fixed: &[T] = match &self.gathered.rows {
            Some(Some(v)) => v,
            _ => fixed_local,
        };
        (side, solved, fixed)
    }

    /// CG takes G as f32: its diagonal in the eigenbasis, else in full (empty for
    /// Cholesky, which takes the f64 Gramian).
    pub(super) fn gram32(&self) -> Vec<f32> {
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

    /// Collective: every rank must call. Recall@20/50 of the current tables (with
    /// `--eval-rows auto`, no epoch timed: see [`crate::als::eval::AUTO_UNTIMED_ROWS`]).
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

    /// The ranking metrics of the last evaluation (`None` before the first).
    pub fn last_ranking(&self) -> Option<crate::als::eval::Ranking> {
        self.eval.last_ranking()
    }

    pub fn rows_side(&self) -> &Side {
        &self.rows
    }

    pub fn cols_side(&self) -> &Side {
        &self.cols
    }
}
