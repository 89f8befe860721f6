//! What a calibration holds: the conditions it ran under, its measured points (kernels,
//! MLP steps, collectives, pooled training steps) and their fit, as the costs file
//! keeps them ([`Costs`]); what a pooled point's tables and plan are.

use serde::Serialize;

use crate::embed::planner::{evaluate, CostModel};
use crate::embed::tables::placement::{ColumnShard, OutputMode, Placement, Plan};
use crate::embed::tables::store::TableOpt;
use crate::embed::train::batch_stats::synthetic_stats;
use crate::spec::{Evict, ModelSpec, Pooling, TableSpec, ValencyDist, VocabKind};

/// The file's schema name.
pub const SCHEMA: &str = "torusrec-costs-v1";

/// Exponent of the Zipf id distribution measured.
pub const ZIPF_S: f64 = 1.05;

/// The conditions of a calibration.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Conditions {
    pub ranks: usize,
    pub torus: String,
    /// Rayon threads per rank.
    pub threads: usize,
    pub cpu: String,
    pub avx512: bool,
    pub avx2: bool,
    /// `git rev-parse --short HEAD` where it ran (`unknown` outside a checkout).
    pub commit: String,
    /// The quick setting (few, small points: for tests).
    pub quick: bool,
    pub reps: usize,
    /// Bytes of each table the kernels ran on.
    pub table_bytes: u64,
}

/// One kernel measurement: `tables` tables of `rows` rows of width `dim`, `ids`
/// ids in all (over the tables), `pooling` per example, in `seconds` per call.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct KernelPoint {
    pub dim: usize,
    pub pooling: usize,
    pub dist: String,
    pub tables: usize,
    pub rows: u64,
    pub ids: u64,
    pub seconds: f64,
}

/// The MLP's forward and backward over `batch` examples.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MlpPoint {
    pub layers: Vec<usize>,
    pub batch: usize,
    pub seconds: f64,
}

/// A collective of `bytes` per rank.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CollPoint {
    pub bytes: u64,
    pub seconds: f64,
}

/// Training steps of `tables` tables (one per rank, `rows` x `dim`, `pooling` Zipf
/// ids per example, `batch` examples per rank) in output mode `mode` (`pooled`, or
/// `rows`: the asking ranks pool the rows they receive) under one placement: `table`
/// (each whole on its rank), `column` (`pieces` column pieces each, on successive
/// ranks) or `row_block` (`pieces` row blocks each); `seconds` per step in the
/// embedding phases (lookup, pooling, backward, update; collectives included; each
/// phase the slowest rank's), the median over the repetitions.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PooledPoint {
    pub dim: usize,
    pub pooling: usize,
    pub tables: usize,
    pub rows: u64,
    pub batch: usize,
    pub placement: String,
    pub pieces: usize,
    /// `pooled` or `rows` ([`POOLED_MODES`]; files from before the `rows` points
    /// have no field: `pooled`).
    pub mode: String,
    pub seconds: f64,
}

/// The placements a [`PooledPoint`] may have.
pub const POOLED_PLACEMENTS: [&str; 3] = ["table", "column", "row_block"];

/// The output modes a [`PooledPoint`] may have.
pub const POOLED_MODES: [&str; 2] = ["pooled", "rows"];

impl PooledPoint {
    /// The model of the point's tables (Zipf ids with exponent [`ZIPF_S`]; a small
    /// MLP, which the embedding phases do not time).
    pub fn spec(&self) -> ModelSpec {
        let tables = (0..self.tables)
            .map(|t| TableSpec {
                name: format!("t{t}"),
                vocab: self.rows,
                dim: self.dim,
                pooling: Pooling::Sum,
                valency: self.pooling as f64,
                valency_dist: ValencyDist::Poisson,
                vocab_kind: VocabKind::Fixed,
                admit_after: 1,
                evict: Evict::Lfu,
            })
            .collect();
        ModelSpec {
            table_dtype: Default::default(),
            arch: Default::default(),
            n_dense: 1,
            hidden: vec![16],
            zipf: ZIPF_S,
            tables,
        }
    }

    /// The point's plan at `world` ranks: table `t`'s piece `j` on rank
    /// `(t + j) % world`, every table in the point's mode.
    pub fn plan(&self, spec: &ModelSpec, world: usize) -> Plan {
        let k = self.pieces.max(1);
        let d = self.dim;
        let tables = (0..self.tables)
            .map(|t| match self.placement.as_str() {
                "column" => Placement::Column {
                    shards: (0..k)
                        .map(|j| ColumnShard {
                            rank: (t + j) % world,
                            cols: [j * d / k, (j + 1) * d / k],
                        })
                        .collect(),
                },
                "row_block" => Placement::RowBlock {
                    ranks: (0..k).map(|j| (t + j) % world).collect(),
                },
                _ => Placement::Table { rank: t % world },
            })
            .collect();
        Plan {
            world,
            spec_digest: spec.digest(),
            tables,
            modes: vec![self.output_mode(); self.tables],
        }
    }

    /// The point's output mode.
    pub fn output_mode(&self) -> OutputMode {
        if self.mode == "rows" {
            OutputMode::Rows
        } else {
            OutputMode::Pooled
        }
    }

    /// The mean over the `world` ranks of what model `m` prices the point's plan at
    /// per step (synthetic batch statistics of its spec).
    pub fn modelled(&self, m: &CostModel, world: usize) -> f64 {
        let spec = self.spec();
        let stats = synthetic_stats(&spec, world, self.batch);
        let plan = self.plan(&spec, world);
        let state = POOLED_TABLE_OPT.state_fixed_per_row() as u64;
        let rep = evaluate(&spec, &stats, &plan, m, state);
        rep.cost_per_rank.iter().sum::<f64>() / world.max(1) as f64
    }

    /// Pieces on each rank (the most on any rank).
    pub fn pieces_per_rank(&self, world: usize) -> usize {
        (self.tables * self.pieces.max(1)).div_ceil(world.max(1))
    }

    /// The multiplier of a rank's seconds that `m`'s interference gives the point
    /// (its pieces per rank and the bytes of the busiest rank, optimizer state
    /// included, as the planner counts them).
    pub fn interference(&self, m: &CostModel, world: usize) -> f64 {
        let spec = self.spec();
        let state = POOLED_TABLE_OPT.state_fixed_per_row() as u64;
        let bytes = self.plan(&spec, world).bytes_per_rank(&spec, state);
        let b = bytes.iter().copied().max().unwrap_or(0) as f64;
        m.with_interference_mode(1.0, self.pieces_per_rank(world), b, self.mode == "rows")
    }

    /// Whether the point is a together point: several whole tables on every rank
    /// (what the interference is fitted to), not one piece of each of `world` tables.
    pub fn together(&self, world: usize) -> bool {
        self.placement == "table" && self.tables > world.max(1)
    }

    /// The point `together`'s tables alone: one whole table a rank of the same width,
    /// pooling, rows, batch and mode (`torusrec calibrate` times the two in the same
    /// rounds; the interference is fitted to their ratio).
    pub fn partner(together: &PooledPoint, world: usize) -> PooledPoint {
        PooledPoint {
            tables: world.max(1),
            seconds: 0.0,
            ..together.clone()
        }
    }

    /// Whether this point is [`PooledPoint::partner`] of `together`.
    pub fn is_partner_of(&self, together: &PooledPoint, world: usize) -> bool {
        together.together(world)
            && self.placement == "table"
            && self.tables == world.max(1)
            && self.dim == together.dim
            && self.pooling == together.pooling
            && self.rows == together.rows
            && self.batch == together.batch
            && self.mode == together.mode
    }

    /// Width of one of the point's pieces.
    pub fn piece_width(&self) -> usize {
        if self.placement == "column" {
            self.dim / self.pieces.max(1)
        } else {
            self.dim
        }
    }

    /// Bytes of one of the point's tables (the variable of
    /// [`CostModel::pooled_size_factor`]).
    pub fn span_bytes(&self) -> f64 {
        self.rows as f64 * self.dim as f64 * 4.0
    }

    /// Per rank and step: the occurrences its pooled pieces see and the examples
    /// they serve (over all ranks, divided by `world`); for a `rows` point, the
    /// occurrences and examples the rank asks for (its own batch in every table).
    pub(super) fn per_rank_work(&self, world: usize) -> (f64, f64) {
        if self.output_mode() == OutputMode::Rows {
            let examples = self.batch as f64 * self.tables as f64;
            return (examples * self.pooling as f64, examples);
        }
        let n = world as f64;
        let examples = n * self.batch as f64 * self.tables as f64;
        let k = self.pieces.max(1) as f64;
        let (occ_pieces, ex_pieces) = match self.placement.as_str() {
            "column" => (k, k),
            "row_block" => (1.0, k),
            _ => (1.0, 1.0),
        };
        (
            occ_pieces * examples * self.pooling as f64 / n,
            ex_pieces * examples / n,
        )
    }
}

/// The optimizer of the pooled points' tables (row-wise Adagrad, as `embed` trains
/// by default); its state per row counts in their modelled seconds.
pub const POOLED_TABLE_OPT: TableOpt = TableOpt::RowWiseAdagrad {
    lr: 0.01,
    eps: 1e-8,
    wd: 0.0,
};

/// What the points give (see the module doc).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Fit {
    pub model: CostModel,
    pub all_to_all_latency_s: f64,
    pub all_reduce_latency_s: f64,
    /// FLOP/s of the MLP step on one rank, over every shape (reported; the
    /// prediction uses each shape's own, [`Costs::mlp_rate`]).
    pub mlp_flops: f64,
    /// Per measured width: the Zipf points' per-id seconds over the uniform ones'
    /// (below 1: hot rows hit the caches). With pooled points, the asking side of a
    /// `rows` table is priced at it ([`CostModel::ask_zipf_factor`]); the owners'
    /// rows are the distinct ids of a batch (uniform misses).
    pub zipf_ratio: Vec<[f64; 2]>,
    /// Per table count `k` measured together: the mean over the points of the per-id
    /// seconds together over alone (what [`CostModel::interference`] is fitted to).
    /// Reported, not used.
    pub together_ratio: Vec<[f64; 2]>,
    /// The interference the kernel points give (`together_ratio`'s law); the model's
    /// is the together training steps' when they were measured, else this.
    pub kernel_interference: f64,
}

impl Fit {
    /// What a calibration holds until its points are fitted: the default model.
    pub fn unfitted() -> Fit {
        Fit {
            model: CostModel::default(),
            all_to_all_latency_s: 0.0,
            all_reduce_latency_s: 0.0,
            mlp_flops: 1.0,
            zipf_ratio: Vec::new(),
            together_ratio: Vec::new(),
            kernel_interference: 0.0,
        }
    }
}

/// A calibration: conditions, points and their fit.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Costs {
    pub schema: String,
    pub conditions: Conditions,
    pub gather: Vec<KernelPoint>,
    pub scatter: Vec<KernelPoint>,
    pub mlp: Vec<MlpPoint>,
    pub all_to_all: Vec<CollPoint>,
    pub all_reduce: Vec<CollPoint>,
    /// Pooled training steps (none in files written before they were measured).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub pooled: Vec<PooledPoint>,
    pub fit: Fit,
}

impl Costs {
    /// The planner's model (the fit of the points).
    pub fn model(&self) -> CostModel {
        self.fit.model.clone()
    }
}

/// Rows of a table of `bytes` bytes of width `dim` (f32).
pub fn rows_of(bytes: u64, dim: usize) -> u64 {
    (bytes / (4 * dim as u64)).max(1)
}

/// Flops of the MLP's forward and backward over `batch` examples.
pub fn mlp_flops(layers: &[usize], batch: usize) -> f64 {
    6.0 * batch as f64 * layers.windows(2).map(|w| (w[0] * w[1]) as f64).sum::<f64>()
}
