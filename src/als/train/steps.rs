//! The steps of a half: in memory or from the spilled CSR's chunks (read ahead on a
//! thread), catching up the rows an earlier layout had not reached after a resume, and
//! the agreement at every step boundary on preemption and non-finite values.

use super::ranges::{merge_ranges, uncovered};
use super::report::PhaseTimes;
use super::side::Side;
use super::solve_range::solve_range;
use super::trainer::Trainer;
use crate::als::model::TableScalar;
use crate::als::shard::spill::{read_ahead_chunks, step_chunks, Chunk, ChunkReader};
use crate::als::solve::{add_loss_terms_to_chunks, RowsView, SolveError, SolveParams, LOSS_CHUNK};
use crate::ckpt::driver::{Boundary, Status};
use crate::ckpt::{faults, status::StepStatus};
use crate::comm::Comm;
use crate::error::{Error, Result};
use std::time::Instant;

impl<T: TableScalar> Trainer<T> {
    /// Collective: every rank must call. The remaining steps of a half whose CSR is in
    /// memory: one gather, then each step solves the rows of steps `0..=j` not yet done
    /// (after a resume on another rank count that catches up what the old layout had
    /// not reached).
    pub(super) fn global_steps_in_memory<C: Comm>(
        &mut self,
        comm: &C,
        times: &mut PhaseTimes,
        params: SolveParams,
        boundary: &Boundary<'_>,
    ) -> Result<Option<Status>> {
        let d = self.cfg.dim;
        let half = self.pos.half;
        if self.gathered.rows.is_none() {
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
            let fixed: &[T] = match &self.gathered.rows {
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
                    weights: side.shard.weights(),
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
                    &mut self.half_loss.fused,
                );
                if let Err(e) = r {
                    solve_err = Err(e);
                }
                non_finite |= solve_err.is_err() || !finite;
            }
            let secs = t.elapsed().as_secs_f64();
            times.solve += secs;
            log::debug!(
                "rank {} epoch {} half {half} step {j}: solved rows {a}..{b} in {secs:.3} s",
                comm.rank(),
                self.pos.epoch + 1
            );
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
    pub(super) fn global_step_end<C: Comm>(
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
                self.chunks.reader = None;
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
                self.chunks.reader = None;
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
    pub(super) fn global_steps_spilled<C: Comm>(
        &mut self,
        comm: &C,
        times: &mut PhaseTimes,
        params: SolveParams,
        want_loss: bool,
        boundary: &Boundary<'_>,
    ) -> Result<Option<Status>> {
        let multi = self.side().plan.is_none();
        if multi && want_loss && self.half_loss.fused.is_none() && self.half_loss.per_step.is_none()
        {
            let chunks = self.side().shard.num_rows().div_ceil(LOSS_CHUNK);
            self.half_loss.per_step = Some(vec![(0.0, 0.0); chunks]);
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
            let want = (self.gathered.block != Some(k)).then_some(k);
            self.global_gather_round(comm, want, times)?;
        } else if self.gathered.rows.is_none() {
            self.global_fetch_whole(comm, times)?;
        }
        let steps = self.steps_per_half;
        let buffers = std::mem::take(&mut self.chunks.spares);
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
            self.chunks.reader = Some(reader);
            self.chunks.current = None;
        }
        let g32 = self.gram32();
        while self.pos.step < steps {
            let j = self.pos.step;
            if multi && j > start && self.side().rounds.binary_search(&j).is_ok() {
                let k = self.own_block(j);
                let want = (self.gathered.block != Some(k)).then_some(k);
                self.global_gather_round(comm, want, times)?;
            }
            let t = Instant::now();
            let mut failed = None;
            if self.chunks.current.as_ref().is_none_or(|c| j >= c.s1) {
                if let (Some(c), Some(r)) =
                    (self.chunks.current.take(), self.chunks.reader.as_ref())
                {
                    r.recycle(c);
                }
                let waited = Instant::now();
                let next = self.chunks.reader.as_ref().map(|r| r.next());
                times.spill_wait += waited.elapsed().as_secs_f64();
                match next {
                    Some(Ok(c)) => self.chunks.current = Some(c),
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
        if let Some(r) = self.chunks.reader.take() {
            self.chunks.spares = r.finish(self.chunks.current.take());
        }
        Ok(None)
    }

    /// Indices in one chunk of a streamed side (the same for both sides, so that the
    /// buffers kept from half to half fit either).
    pub(super) fn chunk_elems(&self) -> u64 {
        let nnz = |s: &Side| s.shard.indptr.last().copied().unwrap_or(0);
        self.shards
            .layout
            .chunk_elems(nnz(&self.rows).max(nnz(&self.cols)))
    }

    /// Rank-local: solve the rows of step `j` not yet done from the current chunk,
    /// and add the loss terms of all its rows when gathering in blocks without fused
    /// terms. Returns whether a value was non-finite, and a solve's error.
    pub(super) fn local_solve_step(
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
        let fixed: &[T] = match &self.gathered.rows {
            Some(Some(v)) => v,
            _ => fixed_local,
        };
        let chunk = self.chunks.current.as_ref().expect("the chunk of step j");
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
                weights: None,
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
                &mut self.half_loss.fused,
            );
            if let Err(e) = r {
                solve_err = Err(e);
            }
            non_finite |= solve_err.is_err() || !finite;
        }
        if let Some(accs) = &mut self.half_loss.per_step {
            let view = RowsView {
                indptr: &ip,
                indices: &chunk.indices,
                weights: None,
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
    pub(super) fn global_catch_up<C: Comm>(
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
        if !multi && self.gathered.rows.is_none() {
            self.global_fetch_whole(comm, times)?;
        }
        let g32 = self.gram32();
        let (mut failed, mut non_finite, mut solve_err) = (None, false, Ok(()));
        for (u0, u1) in spans {
            let lo = self.side().shard.lo;
            let (r0, r1) = self.side().step_rows(u0, u1);
            let todo = uncovered(lo + r0 as u64, lo + r1 as u64, &self.local_done);
            let need = failed.is_none() && (!todo.is_empty() || self.half_loss.per_step.is_some());
            if multi {
                if comm.all_reduce_max(u64::from(need)) == 0 {
                    continue;
                }
                let k = self.own_block(u0);
                let want = (need && self.gathered.block != Some(k)).then_some(k);
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
                let idle = self.half_loss.per_step.is_none()
                    && uncovered(lo + c0 as u64, lo + c1 as u64, &self.local_done).is_empty();
                if idle || failed.is_some() {
                    continue;
                }
                match self.side().read_rows(c0, c1) {
                    Err(e) => failed = Some(e),
                    Ok((_, indices)) => {
                        self.chunks.current = Some(Chunk {
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
                        self.chunks.current = None;
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
}
