//! Epoch reporting: what an epoch measured from its first half on (its clock, the
//! bytes exchanged and read), and its report once its column half is done, with its
//! evaluation when it evaluates.

use super::report::{EpochReport, PhaseTimes};
use super::trainer::Trainer;
use crate::als::model::TableScalar;
use crate::comm::Comm;
use crate::error::Result;
use std::time::Instant;

/// What an epoch measured so far (it may span two units of the run driver).
pub(super) struct EpochAcc {
    pub(super) t0: Instant,
    pub(super) bytes0: u64,
    pub(super) io0: (u64, u64),
    pub(super) times: PhaseTimes,
    /// The loss after the column half.
    pub(super) loss: Option<f64>,
}

impl EpochAcc {
    pub(super) fn start<C: Comm, T: TableScalar>(comm: &C, _tr: &Trainer<T>) -> Self {
        EpochAcc {
            t0: Instant::now(),
            bytes0: comm.stats().get("exchange").bytes_sent,
            io0: crate::metrics::io_read_bytes().unwrap_or_default(),
            times: PhaseTimes::default(),
            loss: None,
        }
    }
}

impl<T: TableScalar> Trainer<T> {
    /// Collective: every rank must call. The report of the epoch `acc` measured (and
    /// its evaluation when `evaluate`), once its column half is done.
    pub(super) fn global_epoch_report<C: Comm>(
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
}
