//! The flags of `tune` (validated into a tune config by `app::tune`).

use crate::als::tune::{Strategy, Values};
use crate::als::{defaults, SolverKind};
use crate::bf16::TableDtype;
use clap::Args;
use std::path::PathBuf;

/// `torusrec tune`.
///
/// Searches `--reg` x `--unobserved-weight` by validation Recall@20. The validation rows
/// are a seeded `--val-fraction` of the training rows with arcs, split into visible and
/// held-out arcs like the test rows (docs/design.md); they leave training during the
/// search and are folded in at evaluation. The test rows are read only by
/// `--train-final`, which trains the best setting on the full training rows and reports
/// its test Recall@20/50. Every point starts from the same initial tables (`--seed`).
///
/// A preemption signal stops the tune with exit 1 (not 75: nothing is saved, so there
/// is nothing to requeue): a tune cannot be resumed; a rerun starts the search over.
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct TuneArgs {
    /// Prepared dataset (.h5), from `prepare` or `generate webgraph`.
    #[arg(long, value_name = "D.h5")]
    pub data: PathBuf,
    /// lambda values: a list (1e-4,1e-3) or LO:HI:N, N log-spaced points (refine: its
    /// smallest and largest values bound the search, which starts from the centres of
    /// the grid's cells).
    #[arg(long, value_name = "LIST|LO:HI:N", default_value = "1e-8:1e-2:3")]
    pub reg: Values,
    /// alpha0 values: a list or LO:HI:N (log-spaced; refine: as for --reg).
    #[arg(long, value_name = "LIST|LO:HI:N", default_value = "1e-5:1:3")]
    pub unobserved_weight: Values,
    /// refine: the centres of the grid's cells, then a compass search in log space
    /// around the best point so far (steps of half the grid spacing, halved when a poll
    /// finds nothing better), inside the grid's box, budget / --epochs trainings in all; grid: every point for
    /// min(budget / points, --epochs) epochs; halving: successive halving over epochs,
    /// keeping the best 1/eta per rung, each rung eta times longer, the last --epochs (or
    /// less if --budget is short); survivors retrain from the initial tables and the
    /// budget counts every epoch run.
    #[arg(long, value_enum, default_value_t = Strategy::Refine)]
    pub strategy: Strategy,
    /// Epochs for the whole search, all points together (default: refine, three times
    /// the centres of the grid's cells x --epochs (12 x --epochs for the default grid); grid, points x --epochs; halving, what its rungs need
    /// for the last to train --epochs).
    #[arg(long, value_name = "EPOCHS")]
    pub budget: Option<usize>,
    /// The most epochs any one point trains (refine and grid: every point).
    #[arg(long, default_value_t = 8)]
    pub epochs: usize,
    /// Halving only: keep the best 1/eta of each rung (default 3).
    #[arg(long)]
    pub eta: Option<usize>,
    /// Fraction of the training rows with arcs that become validation rows, in (0, 1).
    #[arg(long, value_name = "F", default_value_t = 0.1)]
    pub val_fraction: f64,
    /// Seed of the validation rows and of their held-out arcs.
    #[arg(long, default_value_t = 1)]
    pub val_seed: u64,
    /// Write the table, the best setting and its command line (JSON) here.
    #[arg(long, value_name = "F.json")]
    pub out_json: Option<PathBuf>,
    /// Train the best setting on the full training rows and report its test recall.
    #[arg(long)]
    pub train_final: bool,
    /// Epochs of the final training (and of the printed command; default: --epochs).
    #[arg(long, value_name = "E")]
    pub final_epochs: Option<usize>,
    /// Test rows the final evaluation scores (and the printed command's --eval-rows;
    /// default: --eval-rows).
    #[arg(long, value_name = "N|all")]
    pub final_eval_rows: Option<crate::als::eval::EvalRows>,
    /// With --train-final: write the final model here (HDF5), as `als --out`.
    #[arg(long, value_name = "model.h5")]
    pub out: Option<PathBuf>,
    /// Overwrite an existing --out or --out-json.
    #[arg(long)]
    pub force: bool,
    // The options below mean what they mean for `als`.
    /// Embedding dimension d.
    #[arg(long, default_value_t = defaults::DIM)]
    pub dim: usize,
    /// Row solver.
    #[arg(long, value_enum, default_value_t = defaults::SOLVER)]
    pub solver: SolverKind,
    /// CG iterations per half-epoch.
    #[arg(long, default_value_t = defaults::CG_STEPS)]
    pub cg_steps: usize,
    /// Embedding exchange.
    #[arg(long, value_enum, default_value_t = defaults::EXCHANGE)]
    pub exchange: crate::als::ExchangeKind,
    /// Rayon threads per rank (default: cores divided by the ranks on this node).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Validation rows each point's evaluation scores: a seeded sample of N (the same
    /// rows for every point and at any rank count), or `all`.
    #[arg(long, value_name = "N|all", default_value = "10000")]
    pub eval_rows: crate::als::eval::EvalRows,
    /// Seed of the initial tables (the same for every point).
    #[arg(long, default_value_t = defaults::SEED)]
    pub seed: u64,
    /// Initial values are N(0, (init_std / sqrt(d))^2), drawn from (--seed, id).
    #[arg(long, default_value_t = defaults::INIT_STD)]
    pub init_std: f32,
    /// CG only (--solver cholesky ignores it): rows with more non-zeros are processed
    /// in parallel chunks of this many.
    #[arg(long, default_value_t = defaults::HUB_CHUNK)]
    pub hub_chunk: usize,
    /// A step (between preemption checks) covers about this many non-zeros: smaller
    /// stops a signalled tune sooner, at the cost of more agreements between ranks.
    #[arg(long, value_name = "N", default_value_t = defaults::STEP_NNZ)]
    pub step_nnz: u64,
    /// Element type of the tables.
    #[arg(long, value_enum, default_value_t = defaults::TABLE_DTYPE)]
    pub table_dtype: TableDtype,
}
