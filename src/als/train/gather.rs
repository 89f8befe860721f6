//! Gathering the fixed table's rows for a half: once for the whole half, or one block
//! at a time in gather rounds when the spilled CSR is gathered in blocks.

use super::report::PhaseTimes;
use super::trainer::Trainer;
use crate::als::model::TableScalar;
use crate::als::shard::exchange::ExchangePlan;
use crate::comm::Comm;
use crate::error::Result;
use std::time::Instant;

impl<T: TableScalar> Trainer<T> {
    /// Collective: every rank must call. Gather the whole half's fixed rows once.
    pub(super) fn global_fetch_whole<C: Comm>(
        &mut self,
        comm: &C,
        times: &mut PhaseTimes,
    ) -> Result<()> {
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
        let spare = std::mem::take(&mut self.gathered.spare);
        self.gathered.rows =
            Some(plan.global_fetch_reusing(comm, fixed_local, self.cfg.dim, spare)?);
        times.exchange += t.elapsed().as_secs_f64();
        Ok(())
    }

    /// Collective: every rank must call. One gather round of a half gathered in
    /// blocks: a rank given `Some(k)` replaces its gathered rows by its block `k`'s,
    /// the others only serve theirs.
    pub(super) fn global_gather_round<C: Comm>(
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
            let spare = std::mem::take(&mut self.gathered.spare);
            self.gathered.rows =
                Some(plan.global_fetch_reusing(comm, fixed_local, self.cfg.dim, spare)?);
            self.gathered.block = Some(k);
        } else {
            plan.global_fetch(comm, fixed_local, self.cfg.dim)?;
        }
        times.exchange += t.elapsed().as_secs_f64();
        Ok(())
    }

    /// The own gather block holding step `s` (0 when the half gathers once).
    pub(super) fn own_block(&self, s: usize) -> usize {
        self.side().spill.as_ref().map_or(0, |sp| sp.block_of(s))
    }
}
