//! What leaves the trainer: the tables' checksum, the state a checkpoint holds, a
//! checkpoint of the current position, and the model file.

use super::ranges::merge_ranges;
use super::report::TrainReport;
use super::trainer::Trainer;
use crate::als::checkpoint::{global_write_checkpoint, BasisState, RunState};
use crate::als::model::{
    data_checksum_hex, global_write_tables, local_checksum, TablePart, TableScalar, DATA_CHECKSUM,
};
use crate::comm::Comm;
use crate::error::{Error, Result};
use crate::io::h5::Attr;
use std::path::Path;

impl<T: TableScalar> Trainer<T> {
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
}
