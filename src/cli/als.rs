//! The flags of `als`.

use super::{parse_mem, parse_threads, CheckpointArgs};
use crate::als::defaults;
use clap::Args;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct AlsArgs {
    /// Prepared dataset (.h5), from `prepare` or `generate webgraph`.
    #[arg(long, value_name = "D.h5")]
    pub data: PathBuf,
    /// Embedding dimension d.
    #[arg(long, default_value_t = defaults::DIM)]
    pub dim: usize,
    /// Epochs (each solves rows, then columns).
    #[arg(long, default_value_t = defaults::EPOCHS)]
    pub epochs: usize,
    /// lambda: regularization, scaled per row by (|I_u| + alpha0 * n) [default: 0.001
    /// on a link graph, 0.01 on a user-item dataset; see docs/als.md, "Defaults"].
    #[arg(long)]
    pub reg: Option<f32>,
    /// alpha0: the weight of every (unobserved) cell [default: 0.001 on a link graph,
    /// 0.1 on a user-item dataset].
    #[arg(long, value_name = "A0")]
    pub unobserved_weight: Option<f32>,
    /// Confidence of an observed cell from its stored weight r (user-item datasets
    /// with weights): `binary` (c = 1, weights ignored), `linear:ALPHA`
    /// (c = 1 + ALPHA r) or `log:ALPHA,EPS` (c = 1 + ALPHA ln(1 + r / EPS)); ALPHA,
    /// EPS > 0. Refused on a dataset without weights. See docs/als.md.
    #[arg(long, value_name = "SPEC", default_value = "binary")]
    pub confidence: crate::als::Confidence,
    /// Row solver.
    #[arg(long, value_enum, default_value_t = defaults::SOLVER)]
    pub solver: crate::als::SolverKind,
    /// CG iterations per half-epoch [default: 3] (CG only: refused with cholesky).
    #[arg(long, value_name = "CG_STEPS")]
    pub cg_steps: Option<usize>,
    /// Embedding exchange: deduplicated all-to-all, or ALX's all-gather baseline.
    #[arg(long, value_enum, default_value_t = defaults::EXCHANGE)]
    pub exchange: crate::als::ExchangeKind,
    /// Rayon threads per rank (default: cores divided by the ranks on this node; at
    /// most 8 per core).
    #[arg(long, value_parser = parse_threads)]
    pub threads: Option<usize>,
    /// Evaluate Recall@20/50 every E epochs (0: only after the last).
    #[arg(long, value_name = "E", default_value_t = defaults::EVAL_EVERY)]
    pub eval_every: usize,
    /// Test rows each evaluation scores: a seeded sample of N (default 10,000: the same
    /// rows on any machine and at any rank count, all of them when there are fewer;
    /// the count is printed on the first line), `all`, or `auto`: the first rows of the
    /// sample that the first evaluation finds it can score in a fifth of an epoch's
    /// training time, to stay within a quarter (at least 100 rows), kept for the whole
    /// run (so it depends on the machine's speed).
    #[arg(long, value_name = "N|all|auto", default_value = "10000")]
    pub eval_rows: crate::als::eval::EvalRows,
    /// The K at which the `final:` line and the metrics file give Precision, MAP, NDCG
    /// and Recall, comma-separated, each 1..=50 (Recall@20/50 are always printed);
    /// definitions in docs/als.md.
    #[arg(long = "k", value_name = "K,K,...", default_value = "20,50")]
    pub k: crate::als::eval::KList,
    /// Seed of the initial tables.
    #[arg(long, default_value_t = defaults::SEED)]
    pub seed: u64,
    /// Initial values are N(0, (init_std / sqrt(d))^2).
    #[arg(long, default_value_t = defaults::INIT_STD)]
    pub init_std: f32,
    /// Rows with more non-zeros are processed in parallel chunks of this many
    /// [default: 8192] (CG only: refused with cholesky).
    #[arg(long, value_name = "HUB_CHUNK")]
    pub hub_chunk: Option<usize>,
    /// Write the trained tables /W and /H here (HDF5).
    #[arg(long, value_name = "model.h5")]
    pub out: Option<PathBuf>,
    /// Append one JSON object per epoch (and a final one) to this file.
    #[arg(long, value_name = "run.jsonl")]
    pub metrics: Option<PathBuf>,
    /// Overwrite an existing --out.
    #[arg(long)]
    pub force: bool,
    /// A step (between preemption checks) covers about this many non-zeros.
    #[arg(long, value_name = "N", default_value_t = defaults::STEP_NNZ)]
    pub step_nnz: u64,
    /// Also compute the exact loss after each row half-epoch, not only per epoch.
    #[arg(long)]
    pub loss_every_half: bool,
    #[command(flatten)]
    pub checkpoint: CheckpointArgs,
    /// Checkpoint every N half-epochs (0: only on preemption and at the end).
    #[arg(
        long,
        value_name = "N",
        default_value_t = defaults::CHECKPOINT_EVERY,
        requires = "checkpoint_dir"
    )]
    pub checkpoint_every: u64,
    /// Wait up to SECS for the dataset to appear (or finish being written).
    #[arg(long, value_name = "SECS", default_value_t = 0.0)]
    pub wait_for_data: f64,
    /// Element type of the tables (stored, exchanged, checkpointed); solves and
    /// Gramians always compute in f32/f64.
    #[arg(long, value_enum, default_value_t = defaults::TABLE_DTYPE)]
    pub table_dtype: crate::bf16::TableDtype,
    /// Refuse (exit 2) a run whose estimated memory per rank exceeds this (e.g. 8G,
    /// 512M; default: the node's memory divided by the ranks on the node).
    #[arg(long, value_name = "BYTES", value_parser = parse_mem)]
    pub mem_per_rank: Option<u64>,
    /// The basis the tables are trained in: `eigen` rotates both tables into the
    /// eigenbasis of the fixed side's Gramian before each half-epoch (CG's Gramian term
    /// becomes diagonal; the same model, turned back into the starting basis at the end);
    /// `fixed` keeps the starting basis; `auto` is `eigen` for CG with f32 tables and at
    /// least 2 steps.
    #[arg(long, value_enum, default_value_t = defaults::BASIS)]
    pub basis: crate::als::BasisKind,
    /// Bytes of training CSR a rank holds (e.g. 256M): when every rank's CSR fits it
    /// is read into memory, else it is spilled once to a per-rank file in the layout
    /// the solver reads and streamed back in chunks (the next read while the current
    /// one is solved). Changes memory and I/O, never the numbers.
    #[arg(long, value_name = "BYTES", value_parser = parse_mem, default_value = "256M")]
    pub csr_buffer: u64,
    /// Bytes of the fixed table's rows a rank gathers at once: `auto` (what
    /// --mem-per-rank leaves after everything else), `all` (the whole half-epoch's
    /// rows, once), or a size: past it the half-epoch gathers in blocks of steps.
    /// Changes memory and bytes exchanged, never the numbers.
    #[arg(long, value_name = "BYTES|auto|all", default_value = "auto")]
    pub gather_buffer: crate::als::shard::memory::GatherBuffer,
    /// Directory for the per-rank spill files of the training CSR (default: the
    /// system's temporary directory; the files are unlinked at once and vanish with
    /// the process).
    #[arg(long, value_name = "DIR")]
    pub spill_dir: Option<PathBuf>,
}

impl AlsArgs {
    /// `--cg-steps` when not given.
    pub const CG_STEPS: usize = defaults::CG_STEPS;
    /// `--hub-chunk` when not given.
    pub const HUB_CHUNK: usize = defaults::HUB_CHUNK;

    /// Refuses flags that the chosen solver would ignore: `--cg-steps` and
    /// `--hub-chunk` only tune CG (Cholesky solves each row exactly, whole).
    pub fn check_solver_flags(&self) -> crate::Result<()> {
        if self.solver == crate::als::SolverKind::Cholesky {
            let given: Vec<&str> = [
                ("--cg-steps", self.cg_steps.is_some()),
                ("--hub-chunk", self.hub_chunk.is_some()),
            ]
            .into_iter()
            .filter_map(|(f, on)| on.then_some(f))
            .collect();
            if !given.is_empty() {
                return Err(crate::Error::Config(format!(
                    "{} given with --solver cholesky, which ignores it: --cg-steps and --hub-chunk are for --solver cg",
                    given.join(" and ")
                )));
            }
        }
        Ok(())
    }

    /// The training configuration (validated later, on every rank), `--reg` and
    /// `--unobserved-weight` defaulting to those of a `kind` matrix.
    pub fn to_config(&self, kind: defaults::MatrixKind) -> crate::als::AlsConfig {
        let (reg, unobserved_weight) = defaults::for_matrix(kind);
        crate::als::AlsConfig {
            data: self.data.clone(),
            dim: self.dim,
            epochs: self.epochs,
            reg: self.reg.unwrap_or(reg),
            unobserved_weight: self.unobserved_weight.unwrap_or(unobserved_weight),
            confidence: self.confidence,
            solver: self.solver,
            cg_steps: self.cg_steps.unwrap_or(Self::CG_STEPS),
            exchange: self.exchange,
            eval_every: self.eval_every,
            eval_rows: self.eval_rows,
            seed: self.seed,
            init_std: self.init_std,
            hub_chunk: self.hub_chunk.unwrap_or(Self::HUB_CHUNK),
            out: self.out.clone(),
            metrics: self.metrics.clone(),
            force: self.force,
            step_nnz: self.step_nnz,
            loss_every_half: self.loss_every_half,
            checkpoint: self
                .checkpoint
                .config(self.checkpoint_every, self.wait_for_data),
            table_dtype: self.table_dtype,
            mem_per_rank: self.mem_per_rank,
            basis: self.basis,
            memory: crate::als::MemoryConfig {
                csr_buffer: self.csr_buffer,
                gather_buffer: self.gather_buffer,
                spill_dir: self.spill_dir.clone(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `AlsConfig::new` is what the command line gives with every flag at its default
    /// (the string defaults `auto` and `256M` included).
    #[test]
    fn default_flags_give_the_default_config() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct W {
            #[command(flatten)]
            als: AlsArgs,
        }
        let a = W::parse_from(["als", "--data", "d.h5"]).als;
        assert_eq!(
            a.to_config(defaults::MatrixKind::LinkGraph),
            crate::als::AlsConfig::new("d.h5")
        );
        let b = W::parse_from(["als", "--data", "d.h5", "--dim", "64", "--csr-buffer", "1M"]).als;
        assert_ne!(
            b.to_config(defaults::MatrixKind::LinkGraph),
            crate::als::AlsConfig::new("d.h5")
        );
    }
}
