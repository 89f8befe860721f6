//! Measured costs (`torusrec calibrate`): micro-benchmarks of the kernels the planner
//! prices, the file that keeps them with the conditions they were measured under, the
//! fit that turns them into a [`CostModel`], and the predicted seconds of a step.
//!
//! # What is measured
//!
//! On every rank at once (as training runs them), with the rank's thread count:
//!
//! - **gather-pool** ([`row_kernels::pool_bags`]) and **scatter-update**
//!   ([`row_kernels::scatter_bags`] into the table) per embedding width, pooling factor
//!   (ids per example) and id distribution (`uniform`, or `zipf` with exponent
//!   [`ZIPF_S`], ranks scattered over the rows by a hash as the click generator does),
//!   over tables of [`CalibOptions::table_bytes`] each, alone (`tables` 1) and several
//!   tables one after another per call (`tables` k: what a rank holding k tables does
//!   each step); and single tables of the [`CalibOptions::sizes`] (uniform ids, pooling
//!   [`CalibOptions::size_pooling`], every width): the table-size points;
//! - the **MLP step** ([`Mlp::forward_backward`]) per shape (the presets' MLPs) and
//!   batch;
//! - **all-to-all-v** (uniform, `bytes` per rank in total) and **all-reduce** (`bytes`
//!   of f32 per rank) through the [`Comm`] trait at the launched rank count;
//! - **pooled training steps** ([`PooledPoint`], measured by `torusrec calibrate`
//!   through the real training step, at 2 ranks or more): `P` pooled tables whole,
//!   in `P` column pieces and in `P` row blocks, the same whole in the `rows` mode,
//!   whole tables of other sizes, and the together points
//!   ([`CalibOptions::pooled_together`] whole tables on every rank, both modes),
//!   each interleaved with its partner ([`PooledPoint::partner`]: one such table a
//!   rank).
//!
//! Each kernel point is the median of `reps` timed calls after one untimed call; the
//! MLP points are timed together in interleaved rounds (one call of each per round)
//! and each is the slowest rank's seconds of a round, averaged over the rounds (what
//! a synchronized step pays: [`synchronized_seconds`]); a kernel point's seconds are
//! the mean over ranks of each rank's median, a collective's the slowest rank's
//! mean.
//!
//! # The fit ([`fit`])
//!
//! Every fit but the size factor uses only the points at the reference size
//! (`table_bytes`). From the uniform single-table points (cache misses, as the
//! owners' distinct rows are): per id, `seconds / ids = lookup_s + x / mem_bw` by
//! least squares, with `x` the bytes a row access moves (`a(d) = max(4 d, 64)` for
//! a gather, `2 a(d)` for a scatter: read and write). Each measured width then gets the factor
//! `measured / fitted` (their sums over its gather and scatter points), so the model's
//! seconds of a width it measured (a gather and a scatter per id, summed over the
//! pooling factors) are the measured ones ([`CostModel::width_factor`]). A rank with
//! `k` pieces of `B` bytes together costs `1 + beta x` times their sum, `x` the size
//! factor at `B` over the one at the pieces' cost-weighted mean size, less 1
//! ([`CostModel::interference_x_sized`]: the pieces share the caches as one table of
//! their bytes; `1 - 1/k` without size points). The together points' tables are of
//! one size, `B / k`. With together points, `beta` ([`CostModel::interference`]) is the
//! least-squares slope through the origin of `measured / modelled - 1` against `x`
//! over them (`modelled` without interference; clamped at 0; points where an
//! interference of 1 would add under 5 % to the price say nothing of it and are
//! left out, as are kernel points with `x` under 0.05; a together point with a
//! partner has both prices scaled first by the partner's measured over modelled
//! seconds, so that a slow minute moving both does not move `beta`), fitted in turn with
//! the pooled and `rows` coefficients, which depend on it, until it settles
//! (`together_fit`). Without them it is the same slope of `(per-id seconds of k
//! tables together) / (per-id seconds alone) - 1` over the kernel points of several
//! tables ([`Fit::kernel_interference`], kept in every fit; [`Fit::together_ratio`]
//! reports the ratios). The same per-id seconds price the asking side of a `rows`
//! table: a gather and a scatter of a row per occurrence
//! ([`CostModel::ask_row_access`], set by the fit). The collectives
//! fit `seconds = latency + x / bandwidth` by least relative squares, with `x` the
//! bytes that cross to other ranks (`bytes (P - 1) / P` for all-to-all,
//! `2 bytes (P - 1) / P` for all-reduce); on one rank nothing crosses, and the
//! defaults' rates are kept. An MLP point's rate is its flops over its seconds, with
//! `6 b sum_l in_l out_l` flops (forward one product per layer, backward two); the
//! step prediction takes a measured shape's own and interpolates between shapes
//! ([`Costs::mlp_rate`]); [`Fit::mlp_flops`] is `sum flops / sum seconds`.
//!
//! Each table size measured gets the geometric mean over its points (gather and
//! scatter, every width) of their per-id seconds over the reference size's point of
//! the same kernel, width and pooling ([`CostModel::size_factor`], the reference at
//! 1). The pooled points give the pooled owner side's coefficients
//! ([`CostModel::pooled_occ_s`], [`CostModel::pooled_occ_float_s`],
//! [`CostModel::pooled_example_s`], [`CostModel::pooled_size_factor`]; see
//! `pooled_fit`). `shard_s` and `line_bytes` are not measured; they keep the
//! defaults.
//!
//! # Reading ([`Costs::from_file`])
//!
//! Every field is checked (type, range, known names); the error names the field by
//! its path (e.g. `gather[3].seconds`) and the file, and is an input error (exit 2).
//! The fit is recomputed from the points on read (the file's `fit` is checked and
//! kept for people to read, not used), so editing a point changes the plan.

use std::path::Path;
use std::time::Instant;

use serde::Serialize;
use serde_json::{Map, Value};

use super::CostModel;
use crate::comm::Comm;
use crate::embed::dense::mlp::{Mlp, Workspace};
use crate::embed::tables::placement::{ColumnShard, OutputMode, Placement, Plan};
use crate::embed::tables::row_kernels::{self, Bags, Isa};
use crate::embed::tables::store::TableOpt;
use crate::embed::train::batch_stats::synthetic_stats;
use crate::error::{Error, Result};
use crate::lsq::nonneg_least_squares;
use crate::rng::{mix64, SplitMix64};
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
        let state = POOLED_TABLE_OPT.state_per_row() as u64;
        let rep = super::evaluate(&spec, &stats, &plan, m, state);
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
        let state = POOLED_TABLE_OPT.state_per_row() as u64;
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
    fn per_rank_work(&self, world: usize) -> (f64, f64) {
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

/// How much to measure.
#[derive(Clone, Debug, PartialEq)]
pub struct CalibOptions {
    pub quick: bool,
    pub reps: usize,
    pub table_bytes: u64,
    /// Ids per table per call.
    pub ids: usize,
    pub dims: Vec<usize>,
    pub poolings: Vec<usize>,
    /// Table counts of the interference points.
    pub together: Vec<usize>,
    /// Bytes of the table-size points (single tables of every width in `dims`,
    /// uniform ids, pooling `size_pooling`), besides `table_bytes` itself.
    pub sizes: Vec<u64>,
    pub size_pooling: usize,
    /// Widths and pooling of the interference points.
    pub together_dims: Vec<usize>,
    pub together_pooling: usize,
    pub mlp_shapes: Vec<Vec<usize>>,
    pub mlp_batches: Vec<usize>,
    /// Interleaved rounds of the MLP points (`global_mlp_points`), over all passes.
    pub mlp_rounds: usize,
    /// Passes of the MLP and collective points, spread over the calibration (one
    /// after the kernel points, the others between the pooled rounds; `calibrate`):
    /// each point keeps the median of its passes ([`median_over_passes`]), so that
    /// one slow or fast minute of a shared machine is not the whole snapshot.
    pub spread: usize,
    /// Rounds of the gather and scatter points: every point is timed once per round
    /// (`reps` calls, their median), in order, and keeps the median of its rounds.
    pub kernel_rounds: usize,
    /// Bytes per rank of the collectives.
    pub coll_bytes: Vec<u64>,
    /// Pooled training steps ([`PooledPoint`]): widths, ids per example, examples
    /// per rank, untimed and timed steps per run, runs per placement (interleaved;
    /// the median is kept).
    pub pooled_dims: Vec<usize>,
    pub pooled_poolings: Vec<usize>,
    pub pooled_batch: usize,
    pub pooled_warmup: u64,
    pub pooled_steps: u64,
    pub pooled_reps: usize,
    /// Least seconds of timed steps of a pooled run (more steps than
    /// `pooled_steps` when its steps are short).
    pub pooled_min_seconds: f64,
    /// Table sizes (bytes) of whole-table pooled points at width `pooled_size_dim`
    /// and pooling `pooled_size_pooling`, besides `table_bytes`.
    pub pooled_sizes: Vec<u64>,
    pub pooled_size_dim: usize,
    pub pooled_size_pooling: usize,
    /// Tables per rank of the together points: that many whole tables of
    /// `table_bytes` on every rank, width `pooled_size_dim`, pooling
    /// `pooled_together_pooling`, in both output modes (what
    /// [`CostModel::interference`] is fitted to when measured; 0: none).
    pub pooled_together: usize,
    pub pooled_together_pooling: usize,
    pub seed: u64,
}

impl CalibOptions {
    /// The full setting (about a minute on 2 cores) or the quick one (seconds).
    pub fn new(quick: bool) -> Self {
        let mut shapes: Vec<Vec<usize>> = ["torchrec-peer", "dlrm-synthetic", "tiny"]
            .iter()
            .filter_map(|p| crate::spec::preset(p, 0.1).ok())
            .map(|s| s.mlp_layers())
            .collect();
        // A mid-sized MLP between tiny's and the peers': the rate of a shape not
        // measured is interpolated between measured ones (`Costs::mlp_rate`).
        shapes.push(vec![512, 256, 128, 1]);
        if quick {
            CalibOptions {
                quick,
                reps: 3,
                table_bytes: 1 << 20,
                ids: 1 << 13,
                dims: vec![8, 32],
                poolings: vec![1, 8],
                together: vec![2],
                sizes: vec![1 << 18, 1 << 22],
                size_pooling: 8,
                together_dims: vec![32],
                together_pooling: 8,
                mlp_shapes: vec![vec![32, 16, 1]],
                mlp_batches: vec![64],
                mlp_rounds: 3,
                spread: 1,
                kernel_rounds: 1,
                coll_bytes: vec![4 << 10, 64 << 10],
                pooled_dims: vec![8],
                pooled_poolings: vec![1, 8],
                pooled_batch: 64,
                pooled_warmup: 1,
                pooled_steps: 2,
                pooled_reps: 1,
                pooled_min_seconds: 0.0,
                pooled_sizes: vec![1 << 18],
                pooled_size_dim: 8,
                pooled_size_pooling: 8,
                pooled_together: 2,
                pooled_together_pooling: 8,
                seed: 1,
            }
        } else {
            CalibOptions {
                quick,
                reps: 5,
                table_bytes: 64 << 20,
                ids: 1 << 18,
                dims: vec![8, 16, 32, 64, 128],
                poolings: vec![1, 8, 32],
                together: vec![2, 4, 8],
                sizes: vec![1 << 20, 8 << 20, 256 << 20],
                size_pooling: 8,
                together_dims: vec![16, 64],
                together_pooling: 8,
                mlp_shapes: shapes,
                mlp_batches: vec![512, 2048],
                mlp_rounds: 15,
                // The MLP point of torchrec-peer's shape measured 0.1891, 0.1857 and
                // 0.2260 s, and the 8 MiB all-to-all 4.50, 2.90 and 4.55 ms, in three
                // calibrations (each in one burst) at 2 ranks on one evening
                // (2026-12-01).
                spread: 3,
                kernel_rounds: 3,
                coll_bytes: vec![4 << 10, 64 << 10, 1 << 20, 8 << 20],
                pooled_dims: vec![16, 64],
                pooled_poolings: vec![1, 32],
                pooled_batch: 2048,
                pooled_warmup: 3,
                pooled_steps: 10,
                pooled_reps: 3,
                pooled_min_seconds: 0.5,
                // 1 MiB: torchrec-peer has 10 tables below 4 MiB with 154 of its 392
                // ids per example, and below the smallest size point the factor is
                // clamped to that point's (1 MiB measured 0.14-0.15, 4 MiB 0.32-0.42).
                // 256 KiB: three of them (310, 646 and 693 kB, 48 ids per example)
                // are below 1 MiB, within a core's L2 (512 kB here) or near it, where
                // 1 MiB's factor, from a table in L3, is not theirs. (2026-12-01, at 2
                // and 4 ranks: its step measured below the model's floor, the terms
                // not scaled by size, so its factor sits at the 0.05 clamp.)
                pooled_sizes: vec![256 << 10, 1 << 20, 4 << 20, 256 << 20],
                pooled_size_dim: 64,
                pooled_size_pooling: 32,
                pooled_together: 8,
                pooled_together_pooling: 8,
                seed: 1,
            }
        }
    }
}

/// The median of `v` (the mean of the middle two for an even count; 0 when empty).
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        0.0
    } else if n % 2 == 1 {
        v[n / 2]
    } else {
        0.5 * (v[n / 2 - 1] + v[n / 2])
    }
}

/// Each point's seconds over passes of the same points (`passes[pass][point]`, the
/// points in the same order in every pass): the median of its passes'. A point
/// missing from a pass (a shorter pass) is the median of the passes that have it.
pub fn median_over_passes(passes: &[Vec<f64>]) -> Vec<f64> {
    let n = passes.iter().map(Vec::len).max().unwrap_or(0);
    (0..n)
        .map(|i| median(passes.iter().filter_map(|p| p.get(i).copied()).collect()))
        .collect()
}

/// Median seconds of `reps` calls of `f` after one untimed call.
fn time_median(reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    let t: Vec<f64> = (0..reps.max(1))
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64()
        })
        .collect();
    median(t)
}

/// Rows `ids` of a table of `rows` rows under `dist` (deterministic from `seed`).
fn local_ids(dist: &str, rows: u64, n: usize, seed: u64) -> Vec<u32> {
    let mut rng = SplitMix64::new(seed);
    if dist == "zipf" {
        let z = crate::clicks::sample::Zipf::new(rows, ZIPF_S);
        (0..n)
            .map(|_| (mix64(z.sample(&mut rng) ^ seed) % rows) as u32)
            .collect()
    } else {
        (0..n).map(|_| rng.below(rows) as u32).collect()
    }
}

/// Rows of a table of `bytes` bytes of width `dim` (f32).
pub fn rows_of(bytes: u64, dim: usize) -> u64 {
    (bytes / (4 * dim as u64)).max(1)
}

/// One kernel setting: `k` tables of `bytes` bytes each, width `dim`, `pooling` ids
/// per example, ids under `dist`.
#[derive(Clone, Copy)]
struct Setting<'a> {
    bytes: u64,
    dim: usize,
    pooling: usize,
    dist: &'a str,
    k: usize,
}

/// Rank-local: the gather-pool and scatter-update points of setting `st`.
fn local_kernel_pair(o: &CalibOptions, st: Setting<'_>) -> (KernelPoint, KernelPoint) {
    let Setting {
        bytes,
        dim,
        pooling,
        dist,
        k,
    } = st;
    let isa = Isa::detect();
    let rows = rows_of(bytes, dim);
    let examples = (o.ids / pooling).max(1);
    let n_ids = examples * pooling;
    // On huge pages where the kernel allows it, as the shards of a training run are
    // (`huge_vec`): on 4 KiB pages every random row would also miss the TLB, and
    // the points would price a kernel training never runs.
    let mut tables: Vec<Vec<f32>> = (0..k)
        .map(|j| {
            let mut t = crate::hugepages::huge_vec(rows as usize * dim, 0.0f32);
            for (i, x) in t.iter_mut().enumerate() {
                *x = ((i + j) % 97) as f32 * 1e-3;
            }
            t
        })
        .collect();
    let ids: Vec<Vec<u32>> = (0..k)
        .map(|j| local_ids(dist, rows, n_ids, o.seed ^ mix64(j as u64 + 1)))
        .collect();
    let offsets: Vec<u32> = (0..=examples).map(|e| (e * pooling) as u32).collect();
    let mut out = vec![0.0f32; examples * dim];
    let g = vec![1e-6f32; examples * dim];
    let gather = time_median(o.reps, || {
        for (tab, id) in tables.iter().zip(&ids) {
            let bags = Bags {
                offsets: &offsets,
                idx: id,
                map: None,
            };
            row_kernels::pool_bags(isa, tab, dim, bags, &mut out);
        }
        std::hint::black_box(&out);
    });
    let scatter = time_median(o.reps, || {
        for (tab, id) in tables.iter_mut().zip(&ids) {
            let bags = Bags {
                offsets: &offsets,
                idx: id,
                map: None,
            };
            row_kernels::scatter_bags(isa, &g, dim, bags, tab);
        }
        std::hint::black_box(&tables);
    });
    let point = |seconds| KernelPoint {
        dim,
        pooling,
        dist: dist.to_string(),
        tables: k,
        rows,
        ids: (n_ids * k) as u64,
        seconds,
    };
    (point(gather), point(scatter))
}

/// Collective: every rank must call. The MLP step (forward and backward) of every
/// shape of `o.mlp_shapes` over every batch of `o.mlp_batches`, timed in
/// `o.mlp_rounds` interleaved rounds (one call of each point per round, after one
/// untimed call of each). A slow spell of a shared machine lasting a second or two
/// then falls on one round of every point, not on all the calls of the point timed
/// during it. Every call starts after a barrier, as a training step's dense phase
/// starts after the lookup's collectives: the ranks run it together, as they do there
/// (unsynchronized, 4 ranks on 2 cores measured a third less than training's rate).
///
/// A point's seconds are what a step pays for it ([`synchronized_seconds`]): the
/// slowest rank's seconds of each round, averaged over the rounds. A step's dense
/// phase ends in a collective, so the step waits for the slowest rank, and a
/// training run's seconds per step are a mean over its steps, slow ones included.
/// (With each rank's median of its rounds, averaged over ranks, the dense phase of
/// three costs benches measured, in the median over their runs, 1.11, 1.18 and 1.27
/// times its prediction; docs/calibrate.md.)
///
/// One pass of `o.spread`: `o.mlp_rounds / o.spread` rounds (at least one).
pub fn global_mlp_points<C: Comm>(comm: &C, o: &CalibOptions) -> Result<Vec<MlpPoint>> {
    struct Case {
        mlp: Mlp,
        batch: usize,
        x: Vec<f32>,
        labels: Vec<f32>,
        grad: Vec<f32>,
        dx: Vec<f32>,
        ws: Workspace,
        times: Vec<f64>,
    }
    impl Case {
        fn call(&mut self) -> f64 {
            let n_in = self.mlp.n_in();
            let xv = ndarray::ArrayView2::from_shape((self.batch, n_in), &self.x)
                .expect("the input is batch x n_in by construction");
            let s = Instant::now();
            let l = self.mlp.forward_backward(
                xv,
                &self.labels,
                1.0 / self.batch as f32,
                &mut self.grad,
                &mut self.dx,
                &mut self.ws,
            );
            std::hint::black_box(l);
            s.elapsed().as_secs_f64()
        }
    }
    let made: Result<Vec<Case>> = o
        .mlp_shapes
        .iter()
        .flat_map(|layers| o.mlp_batches.iter().map(move |&batch| (layers, batch)))
        .map(|(layers, batch)| {
            let mlp = Mlp::new(layers, o.seed)?;
            let n_in = mlp.n_in();
            Ok(Case {
                grad: vec![0.0f32; mlp.n_params()],
                mlp,
                batch,
                x: (0..batch * n_in).map(|i| (i % 13) as f32 * 0.01).collect(),
                labels: (0..batch).map(|i| (i % 2) as f32).collect(),
                dx: vec![0.0f32; batch * n_in],
                ws: Workspace::default(),
                times: Vec::new(),
            })
        })
        .collect();
    let mut cases = comm.agree(made)?;
    // Round 0 is the untimed call of each point.
    for round in 0..=o.mlp_rounds.div_ceil(o.spread.max(1)).max(1) {
        for c in cases.iter_mut() {
            comm.barrier();
            let t = c.call();
            if round > 0 {
                c.times.push(t);
            }
        }
    }
    // Every rank's rounds of every point, point-major: [rank][point][round].
    let rounds = cases.first().map_or(0, |c| c.times.len());
    let mine: Vec<f64> = cases.iter().flat_map(|c| c.times.iter().copied()).collect();
    let all = comm.all_gather_v(&mine)?;
    let per_rank: Vec<&[f64]> = (0..comm.size()).map(|r| all.from_rank(r)).collect();
    Ok(cases
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let of_point: Vec<&[f64]> = per_rank
                .iter()
                .map(|t| &t[i * rounds..(i + 1) * rounds])
                .collect();
            MlpPoint {
                layers: c.mlp.layers().to_vec(),
                batch: c.batch,
                seconds: synchronized_seconds(&of_point),
            }
        })
        .collect())
}

/// The seconds a synchronized step pays for a phase timed in rounds on every rank
/// (`per_rank[r][round]`): the slowest rank's seconds of each round, averaged over
/// the rounds (0 without rounds).
pub fn synchronized_seconds(per_rank: &[&[f64]]) -> f64 {
    let rounds = per_rank.iter().map(|t| t.len()).min().unwrap_or(0);
    if rounds == 0 {
        return 0.0;
    }
    let sum: f64 = (0..rounds)
        .map(|k| per_rank.iter().map(|t| t[k]).fold(0.0, f64::max))
        .sum();
    sum / rounds as f64
}

/// Collective: every rank must call. The mean over ranks of each value.
fn global_mean<C: Comm>(comm: &C, v: &mut [f64]) {
    comm.all_reduce_sum(v);
    let n = comm.size() as f64;
    v.iter_mut().for_each(|x| *x /= n);
}

/// Collective: every rank must call. The slowest rank's mean seconds of `reps` calls
/// of `f`, started together after a barrier (one untimed call first).
fn global_time<C: Comm>(comm: &C, reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    comm.barrier();
    let t = Instant::now();
    for _ in 0..reps.max(1) {
        f();
    }
    let mine = t.elapsed().as_secs_f64() / reps.max(1) as f64;
    f64::from_bits(comm.all_reduce_max(mine.to_bits()))
}

/// Collective: every rank must call. All-to-all-v and all-reduce per message size.
pub fn global_collectives<C: Comm>(
    comm: &C,
    o: &CalibOptions,
) -> Result<(Vec<CollPoint>, Vec<CollPoint>)> {
    let _phase = comm.stats().phase("calibrate");
    let p = comm.size();
    let (mut a2a, mut ar) = (Vec::new(), Vec::new());
    for &bytes in &o.coll_bytes {
        let per = ((bytes / 4) as usize / p).max(1);
        let send = vec![1.0f32; per * p];
        let counts = vec![per; p];
        let mut err = Ok(());
        let s = global_time(comm, o.reps, || {
            if let Err(e) = comm.all_to_all_v(&send, &counts) {
                err = Err(e);
            }
        });
        err?;
        a2a.push(CollPoint {
            bytes: (per * p * 4) as u64,
            seconds: s,
        });
        let mut buf = vec![1.0f32; (bytes / 4).max(1) as usize];
        let s = global_time(comm, o.reps, || comm.all_reduce_sum(&mut buf));
        ar.push(CollPoint {
            bytes: buf.len() as u64 * 4,
            seconds: s,
        });
    }
    Ok((a2a, ar))
}

/// Collective: every rank must call. Measure everything of `o` (see the module doc)
/// and fit it; `cond` are the conditions (the caller's: CPU, commit, threads).
pub fn global_calibrate<C: Comm>(comm: &C, o: &CalibOptions, cond: Conditions) -> Result<Costs> {
    let (mut gather, mut scatter) = (Vec::new(), Vec::new());
    let mut settings: Vec<Setting> = Vec::new();
    let at = |dim, pooling, dist, k| Setting {
        bytes: o.table_bytes,
        dim,
        pooling,
        dist,
        k,
    };
    for &d in &o.dims {
        for &pl in &o.poolings {
            for dist in ["uniform", "zipf"] {
                settings.push(at(d, pl, dist, 1));
            }
        }
    }
    for &d in &o.together_dims {
        for dist in ["uniform", "zipf"] {
            if !o.poolings.contains(&o.together_pooling) || !o.dims.contains(&d) {
                settings.push(at(d, o.together_pooling, dist, 1));
            }
            for &k in &o.together {
                settings.push(at(d, o.together_pooling, dist, k));
            }
        }
    }
    // Table sizes: against the reference size's point of the same width and pooling.
    let size_ref = !o.poolings.contains(&o.size_pooling);
    for &d in &o.dims {
        if size_ref {
            settings.push(at(d, o.size_pooling, "uniform", 1));
        }
        for &bytes in o.sizes.iter().filter(|&&b| b != o.table_bytes) {
            settings.push(Setting {
                bytes,
                ..at(d, o.size_pooling, "uniform", 1)
            });
        }
    }
    // Every point once per round, the rounds one after another: a slow spell of a
    // shared machine (a second or two) then falls on one round of the points timed
    // during it, and the median of the rounds leaves it out. Every point starts after
    // a barrier, so that all ranks time the same kernel together, sharing the memory
    // system as the ranks of a training step do (unsynchronized, one rank's 8-table
    // point ran beside another's small one, and the interference fit moved from 0.02
    // to 0.68 between two calibrations).
    let rounds = o.kernel_rounds.max(1);
    let mut secs_of: Vec<[Vec<f64>; 2]> = vec![[Vec::new(), Vec::new()]; settings.len()];
    for round in 0..rounds {
        for (i, &st) in settings.iter().enumerate() {
            comm.barrier();
            let (g, s) = local_kernel_pair(o, st);
            secs_of[i][0].push(g.seconds);
            secs_of[i][1].push(s.seconds);
            if round + 1 == rounds {
                gather.push(KernelPoint {
                    seconds: median(std::mem::take(&mut secs_of[i][0])),
                    ..g
                });
                scatter.push(KernelPoint {
                    seconds: median(std::mem::take(&mut secs_of[i][1])),
                    ..s
                });
            }
        }
    }
    let mlp = global_mlp_points(comm, o)?;
    // Kernel seconds: the mean over ranks (the MLP points are the ranks' already).
    let mut secs: Vec<f64> = gather.iter().chain(&scatter).map(|p| p.seconds).collect();
    global_mean(comm, &mut secs);
    let ng = gather.len();
    for (p, s) in gather.iter_mut().zip(&secs[..ng]) {
        p.seconds = *s;
    }
    for (p, s) in scatter.iter_mut().zip(&secs[ng..]) {
        p.seconds = *s;
    }
    let (all_to_all, all_reduce) = global_collectives(comm, o)?;
    let mut c = Costs {
        schema: SCHEMA.to_string(),
        conditions: cond,
        gather,
        scatter,
        mlp,
        all_to_all,
        all_reduce,
        pooled: Vec::new(),
        fit: Fit {
            model: CostModel::default(),
            all_to_all_latency_s: 0.0,
            all_reduce_latency_s: 0.0,
            mlp_flops: 1.0,
            zipf_ratio: Vec::new(),
            together_ratio: Vec::new(),
            kernel_interference: 0.0,
        },
    };
    // Seconds too small to time (a clock tick) would fit nothing: at least 1 ns.
    for p in c.gather.iter_mut().chain(c.scatter.iter_mut()) {
        p.seconds = p.seconds.max(1e-9);
    }
    for p in c.mlp.iter_mut() {
        p.seconds = p.seconds.max(1e-9);
    }
    for p in c.all_to_all.iter_mut().chain(c.all_reduce.iter_mut()) {
        p.seconds = p.seconds.max(1e-9);
    }
    c.fit = fit(&c);
    Ok(c)
}

/// Least squares `y = a + b x`; `None` with fewer than two distinct `x`.
fn line(pts: &[(f64, f64)]) -> Option<(f64, f64)> {
    let w = vec![1.0; pts.len()];
    weighted_line(pts, &w)
}

/// Weighted least squares `y = a + b x` (weights `w`); `None` with fewer than two
/// distinct `x`.
fn weighted_line(pts: &[(f64, f64)], w: &[f64]) -> Option<(f64, f64)> {
    let sw: f64 = w.iter().sum();
    if pts.len() < 2 || sw <= 0.0 {
        return None;
    }
    let mx = pts.iter().zip(w).map(|(p, w)| w * p.0).sum::<f64>() / sw;
    let my = pts.iter().zip(w).map(|(p, w)| w * p.1).sum::<f64>() / sw;
    let sxx: f64 = pts
        .iter()
        .zip(w)
        .map(|(p, w)| w * (p.0 - mx) * (p.0 - mx))
        .sum();
    if sxx <= 0.0 {
        return None;
    }
    let sxy: f64 = pts
        .iter()
        .zip(w)
        .map(|(p, w)| w * (p.0 - mx) * (p.1 - my))
        .sum();
    let b = sxy / sxx;
    Some((my - b * mx, b))
}

/// `(latency, bandwidth)` of `seconds = latency + x / bandwidth` by least relative
/// squares (weights `1 / seconds^2`, so that the small messages that show the
/// latency count as much as the large ones); `None` when the points give no
/// positive slope. A negative intercept is clamped to 0.
fn link_fit(pts: &[(f64, f64)]) -> Option<(f64, f64)> {
    let w: Vec<f64> = pts.iter().map(|p| 1.0 / (p.1 * p.1).max(1e-300)).collect();
    let (a, b) = weighted_line(pts, &w)?;
    (b > 0.0).then_some((a.max(0.0), 1.0 / b))
}

/// Most rounds of the interference and the training steps' coefficients fitted in
/// turn ([`fit`]).
const TOGETHER_ROUNDS: usize = 50;

/// Least share of a point's price that an interference of 1 must add for the point
/// to say anything about the interference. Where the law's variable is near 0 (the
/// tables' bytes together fall within one size factor), the slope through such
/// points is the ratio of two small numbers: a quick calibration's kernel points
/// (two tables of 1 MB, sizes measured to 4 MB, factors within 2 %) measured 1.24
/// times alone and gave an interference of 26, under which two pieces of 128 kB
/// cost 6 times their sum.
const IDENTIFIES: f64 = 0.05;

/// Bytes a row access of `w` floats moves (as [`CostModel`] counts it).
fn access(m: &CostModel, w: usize) -> f64 {
    (4.0 * w as f64).max(m.line_bytes)
}

/// The model and rates the points give (see the module doc).
pub fn fit(c: &Costs) -> Fit {
    let mut m = CostModel::default();
    let p = c.conditions.ranks.max(1) as f64;
    // The points at the reference table size (the others are the size points).
    let tb = c.conditions.table_bytes;
    let at_ref = |q: &KernelPoint| q.rows == rows_of(tb, q.dim);
    // Per id: (bytes a row access moves, seconds), uniform single-table points.
    let single = |pts: &[KernelPoint], mult: f64| -> Vec<(usize, f64, f64)> {
        pts.iter()
            .filter(|q| q.tables == 1 && q.dist == "uniform" && at_ref(q))
            .map(|q| {
                (
                    q.dim,
                    mult * access(&m, q.dim),
                    q.seconds / q.ids.max(1) as f64,
                )
            })
            .collect()
    };
    let mut per_id = single(&c.gather, 1.0);
    per_id.extend(single(&c.scatter, 2.0));
    let xy: Vec<(f64, f64)> = per_id.iter().map(|&(_, x, y)| (x, y)).collect();
    match line(&xy) {
        Some((a, b)) if b > 0.0 => {
            m.mem_bw = 1.0 / b;
            m.lookup_s = a.max(0.0);
        }
        _ => {
            // One width (or a slope <= 0): memory at the default rate, the rest
            // per lookup.
            let n = xy.len().max(1) as f64;
            let mean_rest = xy.iter().map(|&(x, y)| y - x / m.mem_bw).sum::<f64>() / n;
            m.lookup_s = mean_rest.max(0.0);
        }
    }
    let mut widths: Vec<usize> = per_id.iter().map(|q| q.0).collect();
    widths.sort_unstable();
    widths.dedup();
    m.width_factor = widths
        .iter()
        .map(|&w| {
            let (mut measured, mut fitted) = (0.0, 0.0);
            for &(_, x, y) in per_id.iter().filter(|q| q.0 == w) {
                measured += y;
                fitted += m.lookup_s + x / m.mem_bw;
            }
            [w as f64, (measured / fitted.max(1e-15)).max(1e-6)]
        })
        .collect();
    // Interference: per-id seconds of k tables together over alone, against the
    // law's variable (the size factor of their bytes together over one's; without
    // size points the saturating 1 - 1/k).
    m.size_factor = size_factor(c, &at_ref);
    let mut num = 0.0;
    let mut den = 0.0;
    // Per table count: the sum and number of the ratios (for the report).
    let mut by_k: std::collections::BTreeMap<usize, (f64, usize)> = Default::default();
    for pts in [&c.gather, &c.scatter] {
        for q in pts.iter().filter(|q| q.tables > 1) {
            let alone = pts.iter().find(|a| {
                a.tables == 1
                    && a.dim == q.dim
                    && a.pooling == q.pooling
                    && a.dist == q.dist
                    && a.rows == q.rows
            });
            if let Some(a) = alone {
                let r = (q.seconds / q.ids.max(1) as f64) / (a.seconds / a.ids.max(1) as f64);
                let bytes = q.tables as f64 * q.rows as f64 * q.dim as f64 * 4.0;
                let x = m.interference_x(q.tables, bytes);
                if x >= IDENTIFIES {
                    num += (r - 1.0) * x;
                    den += x * x;
                }
                let e = by_k.entry(q.tables).or_default();
                e.0 += r;
                e.1 += 1;
            }
        }
    }
    m.interference = if den > 0.0 { (num / den).max(0.0) } else { 0.0 };
    let together_ratio = by_k
        .iter()
        .map(|(&k, &(r, n))| [k as f64, r / n as f64])
        .collect();
    m.ask_row_access = true;
    // Collectives.
    let cross = if p > 1.0 { (p - 1.0) / p } else { 1.0 };
    let a2a: Vec<(f64, f64)> = c
        .all_to_all
        .iter()
        .map(|q| (q.bytes as f64 * cross, q.seconds))
        .collect();
    let ar: Vec<(f64, f64)> = c
        .all_reduce
        .iter()
        .map(|q| (2.0 * q.bytes as f64 * cross, q.seconds))
        .collect();
    let (mut a2a_lat, mut ar_lat) = (0.0, 0.0);
    if p > 1.0 {
        if let Some((lat, bw)) = link_fit(&a2a) {
            m.net_bw = bw;
            a2a_lat = lat;
        }
        if let Some((lat, bw)) = link_fit(&ar) {
            m.allreduce_bw = bw;
            ar_lat = lat;
        }
    }
    // MLP: flops over seconds.
    let (mut f, mut s) = (0.0, 0.0);
    for q in &c.mlp {
        f += mlp_flops(&q.layers, q.batch);
        s += q.seconds;
    }
    // Per width: the mean over (kernel, pooling) of Zipf's per-id seconds over
    // uniform ids', single tables.
    let zipf_ratio: Vec<[f64; 2]> = widths
        .iter()
        .filter_map(|&w| {
            let mut r = Vec::new();
            for pts in [&c.gather, &c.scatter] {
                for z in pts
                    .iter()
                    .filter(|q| q.tables == 1 && q.dim == w && q.dist == "zipf" && at_ref(q))
                {
                    let u = pts.iter().find(|q| {
                        q.tables == 1
                            && q.dim == w
                            && q.pooling == z.pooling
                            && q.dist == "uniform"
                            && at_ref(q)
                    });
                    if let Some(u) = u {
                        r.push((z.seconds / z.ids as f64) / (u.seconds / u.ids as f64));
                    }
                }
            }
            (!r.is_empty()).then(|| [w as f64, r.iter().sum::<f64>() / r.len() as f64])
        })
        .collect();
    // The asking side of a `rows` table at the Zipf ids' rate: only with the pooled
    // points (files from before them keep their plans).
    if !c.pooled.is_empty() {
        m.ask_zipf_factor = zipf_ratio.iter().map(|&[w, r]| [w, r.min(1.0)]).collect();
    }
    // The training steps' coefficients at the interference, then the interference
    // the together points give with them, until it settles (the coefficients of the
    // points with pieces of several tables on a rank depend on it).
    let kernel_interference = m.interference;
    for round in 0..=TOGETHER_ROUNDS {
        if let Some(([occ, occ_float, ex], sizes)) = pooled_fit(c, &m) {
            m.pooled_measured = true;
            m.pooled_occ_s = occ;
            m.pooled_occ_float_s = occ_float;
            m.pooled_example_s = ex;
            m.pooled_size_factor = sizes;
        }
        if let Some([occ, occ_float, ex]) = rows_fit(c, &m) {
            m.ask_measured = true;
            m.ask_occ_s = occ;
            m.ask_occ_float_s = occ_float;
            m.ask_example_s = ex;
        }
        if round == TOGETHER_ROUNDS {
            break;
        }
        let (beta, rows) = match together_fit(c, &m) {
            Some(betas) => betas,
            // The size law has no variable at the together points (their bytes cost
            // no more per row access than one table's on this machine's size
            // points), yet their steps may cost more than their pieces' sum: the
            // table count's law prices what they measure, if it identifies it.
            None if round == 0 && !m.interference_count => {
                m.interference_count = true;
                match together_fit(c, &m) {
                    // Above rounding: a slope of 2e-16 is none.
                    Some(betas) if betas.0 > 1e-9 || betas.1.is_some_and(|b| b > 1e-9) => betas,
                    _ => {
                        m.interference_count = false;
                        break;
                    }
                }
            }
            None => break,
        };
        let near = |a: f64, b: f64| (a - b).abs() <= 1e-6 * a.max(1e-3);
        let settled = near(beta, m.interference)
            && near(rows.unwrap_or(beta), m.rows_interference())
            && rows.is_some() == m.interference_rows.is_some();
        m.interference = beta;
        m.interference_rows = rows;
        if settled {
            break;
        }
    }
    // One `rows` table a rank: no interference, so after the loop.
    m.rows_size_factor = rows_size_fit(c, &m);
    Fit {
        kernel_interference,
        model: m,
        all_to_all_latency_s: a2a_lat,
        all_reduce_latency_s: ar_lat,
        mlp_flops: if s > 0.0 && f > 0.0 { f / s } else { 1e9 },
        zipf_ratio,
        together_ratio,
    }
}

/// `[pooled_occ_s, pooled_occ_float_s, pooled_example_s]` and the pooled size
/// factor from the pooled points (`None` without them). The coefficients: least
/// relative squares through the origin, over the points at the reference size, of
/// each point's measured seconds less what `m` models for its plan with the
/// measured path at zero coefficients (the asking side, the exchange, `shard_s`),
/// over its rank's interference multiplier, against the occurrences its pieces see,
/// the same times their width, and the examples they serve, per rank; kept >= 0
/// (of the subsets of the three terms whose fit has no negative coefficient, the
/// one with the least residual). The size factor: per other size, the factor of
/// the occurrence terms that explains its point (at least 0.05), with 1 at the
/// reference; empty without other sizes.
fn pooled_fit(c: &Costs, m: &CostModel) -> Option<([f64; 3], Vec<[f64; 2]>)> {
    let world = c.conditions.ranks.max(1);
    let pooled: Vec<&PooledPoint> = c
        .pooled
        .iter()
        .filter(|q| q.mode == "pooled" && !q.together(world) && !a_partner(c, q, world))
        .collect();
    if pooled.is_empty() {
        return None;
    }
    let zero = CostModel {
        pooled_measured: true,
        pooled_occ_s: 0.0,
        pooled_occ_float_s: 0.0,
        pooled_example_s: 0.0,
        pooled_size_factor: Vec::new(),
        ..m.clone()
    };
    let tb = c.conditions.table_bytes;
    // Per point: the three terms' work and the seconds to explain, each divided by
    // the point's measured seconds (relative errors: a pooling-1 step is a tenth of
    // a pooling-32 one).
    let terms = |q: &PooledPoint| -> ([f64; 3], f64) {
        let (o, e) = q.per_rank_work(world);
        let w = q.piece_width() as f64;
        let mult = q.interference(m, world);
        let y = (q.seconds - q.modelled(&zero, world)) / mult;
        let s = q.seconds;
        ([o / s, o * w / s, e / s], y / s)
    };
    let at_ref = |q: &&PooledPoint| q.rows == rows_of(tb, q.dim);
    let size_pts: Vec<&PooledPoint> = pooled.iter().copied().filter(|q| !at_ref(q)).collect();
    let ref_pts: Vec<&PooledPoint> = pooled.iter().copied().filter(at_ref).collect();
    // The coefficients from the reference size; then per size measured, the
    // occurrences' factor that explains its point.
    let rows: Vec<([f64; 3], f64)> = ref_pts.iter().map(|q| terms(q)).collect();
    let coef = nonneg_least_squares(&rows, 0);
    let mut sizes: Vec<[f64; 2]> = size_pts
        .iter()
        .filter_map(|q| {
            let (a, y) = terms(q);
            let occ = a[0] * coef[0] + a[1] * coef[1];
            (occ > 0.0).then(|| [q.span_bytes(), ((y - a[2] * coef[2]) / occ).max(0.05)])
        })
        .collect();
    with_reference(&mut sizes, tb);
    Some((coef, sizes))
}

/// Size-factor pairs `sizes` (when any) with the reference size `tb` at factor 1
/// added, sorted by bytes, sizes within 5 % of one another kept once.
fn with_reference(sizes: &mut Vec<[f64; 2]>, tb: u64) {
    if !sizes.is_empty() {
        sizes.push([tb as f64, 1.0]);
        sizes.sort_by(|a, b| a[0].total_cmp(&b[0]));
        sizes.dedup_by(|b, a| (b[0] / a[0] - 1.0).abs() < 0.05);
    }
}

/// `[ask_occ_s, ask_occ_float_s, ask_example_s]` from the `rows` points (`None`
/// without them): what each point's step took beyond what `m` prices with a free
/// asking side (the owners' pieces), against the occurrences the rank asked for, the
/// same times the width, and its examples per table; least squares of the relative
/// errors with coefficients >= 0, as [`pooled_fit`]'s.
fn rows_fit(c: &Costs, m: &CostModel) -> Option<[f64; 3]> {
    let world = c.conditions.ranks.max(1);
    let tb = c.conditions.table_bytes;
    // At the reference size: the other sizes' points are the rows size factor's
    // ([`rows_size_fit`]).
    let rows: Vec<&PooledPoint> = c
        .pooled
        .iter()
        .filter(|q| q.mode == "rows" && !q.together(world) && !a_partner(c, q, world))
        .filter(|q| q.rows == rows_of(tb, q.dim))
        .collect();
    if rows.is_empty() {
        return None;
    }
    let free = CostModel {
        ask_measured: true,
        ask_occ_s: 0.0,
        ask_occ_float_s: 0.0,
        ask_example_s: 0.0,
        ..m.clone()
    };
    let pts: Vec<([f64; 3], f64)> = rows
        .iter()
        .map(|q| {
            let (o, e) = q.per_rank_work(world);
            let w = q.dim as f64;
            // The asking side is not under the interference (it works on the rows
            // it received, not on the rank's tables).
            let y = q.seconds - q.modelled(&free, world);
            let s = q.seconds;
            ([o / s, o * w / s, e / s], y / s)
        })
        .collect();
    Some(nonneg_least_squares(&pts, 0))
}

/// The `rows` size factor ([`CostModel::rows_size_factor`]) from the `rows` points
/// of whole tables larger than the reference (empty without them): per size, the
/// factor of the owners' row accesses and lookups that makes `m` price the point at
/// its measured seconds (at least 0.05, at most 50), with 1 at the reference and
/// below it. The price is linear in that factor, so two prices (at factor 1 and 2)
/// give it. A point where what the factor multiplies is under [`IDENTIFIES`] of its
/// measured seconds is left out. The smaller tables' points are not used: what they
/// save is the asking side's (it pools from few distinct rows, which stay in cache),
/// and charged to the owners it priced them at the clamp (4 ranks, 4 MiB: 0.05).
fn rows_size_fit(c: &Costs, m: &CostModel) -> Vec<[f64; 2]> {
    let world = c.conditions.ranks.max(1);
    let tb = c.conditions.table_bytes;
    let at = |f: f64| CostModel {
        rows_size_factor: vec![[1.0, f]],
        ..m.clone()
    };
    let (one, two) = (at(1.0), at(2.0));
    let mut sizes: Vec<[f64; 2]> = c
        .pooled
        .iter()
        .filter(|q| q.mode == "rows" && q.placement == "table" && !q.together(world))
        .filter(|q| !a_partner(c, q, world) && q.rows > rows_of(tb, q.dim))
        .filter_map(|q| {
            let g1 = q.modelled(&one, world);
            let slope = q.modelled(&two, world) - g1;
            // A point where the factor moves under `IDENTIFIES` of its price does
            // not identify it.
            (slope.is_finite() && slope >= IDENTIFIES * q.seconds).then(|| {
                [
                    q.span_bytes(),
                    (1.0 + (q.seconds - g1) / slope).clamp(0.05, 50.0),
                ]
            })
        })
        .collect();
    with_reference(&mut sizes, tb);
    sizes
}

/// The together point's partner: one table a rank of the same width, pooling, rows,
/// batch and mode, measured in the same rounds ([`PooledPoint::partner`]).
fn partner_of<'a>(c: &'a Costs, q: &PooledPoint, world: usize) -> Option<&'a PooledPoint> {
    c.pooled.iter().find(|a| a.is_partner_of(q, world))
}

/// Whether `q` is a together point's partner: it serves as that point's reference
/// only ([`together_fit`]), not in the coefficients' fits, so that they are what
/// they were without partners.
fn a_partner(c: &Costs, q: &PooledPoint, world: usize) -> bool {
    c.pooled.iter().any(|t| q.is_partner_of(t, world))
}

/// The interference from the together points (`None` without them): the
/// least-squares slope through the origin, relative to each point's seconds, of
/// its seconds less what `m` prices it at without interference against what an
/// interference of 1 adds to that price (its owners' seconds times the law's
/// variable, [`CostModel::interference_x`]); at least 0. Points where that
/// addition is under [`IDENTIFIES`] of the price are left out. Where the point has a
/// partner (one table a rank, otherwise the same, timed in the same rounds), both
/// prices are first scaled by the partner's measured over modelled seconds: the
/// interference is then what the tables together cost beyond one table each as
/// measured in the same minutes, and a slow or fast minute of a shared machine,
/// which moves both points, does not move it. The slope is fitted per output mode,
/// over the mode's points: `(pooled, Some(rows))` when both modes' points identify
/// one, else `(the one fitted, None)`, which prices both modes.
fn together_fit(c: &Costs, m: &CostModel) -> Option<(f64, Option<f64>)> {
    let world = c.conditions.ranks.max(1);
    let free = CostModel {
        interference: 0.0,
        interference_rows: None,
        ..m.clone()
    };
    let one = CostModel {
        interference: 1.0,
        interference_rows: None,
        ..m.clone()
    };
    // Per point, relative to its seconds: what is left to explain without
    // interference, and what an interference of 1 adds (the owners' seconds times
    // the law's variable; the asking side is not multiplied). Per mode: [pooled,
    // rows].
    let (mut num, mut den) = ([0.0; 2], [0.0; 2]);
    for q in c.pooled.iter().filter(|q| q.together(world)) {
        let scale = partner_of(c, q, world)
            .map(|a| a.seconds / a.modelled(m, world))
            .filter(|r| r.is_finite() && *r > 0.0)
            .unwrap_or(1.0);
        let base = q.modelled(&free, world) * scale;
        let a = (q.modelled(&one, world) * scale - base) / q.seconds;
        if a < IDENTIFIES {
            continue;
        }
        let y = (q.seconds - base) / q.seconds;
        let k = usize::from(q.mode == "rows");
        num[k] += a * y;
        den[k] += a * a;
    }
    let beta = |k: usize| (den[k] > 0.0).then(|| (num[k] / den[k]).max(0.0));
    match (beta(0), beta(1)) {
        (Some(p), Some(r)) => Some((p, Some(r))),
        (Some(b), None) | (None, Some(b)) => Some((b, None)),
        (None, None) => None,
    }
}

/// The optimizer of the pooled points' tables (row-wise Adagrad, as `embed` trains
/// by default); its state per row counts in their modelled seconds.
pub const POOLED_TABLE_OPT: TableOpt = TableOpt::RowWiseAdagrad {
    lr: 0.01,
    eps: 1e-8,
};

/// Per table size measured: the per-id seconds of the single-table uniform points of
/// that size over those of the reference size (same kernel, width and pooling),
/// their geometric mean, as `[bytes, factor]` sorted by bytes with the reference at
/// factor 1; empty without size points. Sizes within 5 % of each other (the same
/// nominal size at widths that do not divide it) are one size.
fn size_factor(c: &Costs, at_ref: &dyn Fn(&KernelPoint) -> bool) -> Vec<[f64; 2]> {
    // (bytes, ln ratio) of every size point with its reference.
    let mut r: Vec<(f64, f64)> = Vec::new();
    for pts in [&c.gather, &c.scatter] {
        for q in pts
            .iter()
            .filter(|q| q.tables == 1 && q.dist == "uniform" && !at_ref(q))
        {
            let reference = pts.iter().find(|a| {
                a.tables == 1
                    && a.dist == "uniform"
                    && a.dim == q.dim
                    && a.pooling == q.pooling
                    && at_ref(a)
            });
            if let Some(a) = reference {
                let ratio = (q.seconds / q.ids.max(1) as f64) / (a.seconds / a.ids.max(1) as f64);
                r.push((q.rows as f64 * q.dim as f64 * 4.0, ratio.ln()));
            }
        }
    }
    if r.is_empty() {
        return Vec::new();
    }
    r.sort_by(|a, b| a.0.total_cmp(&b.0));
    // Groups of sizes within 5 % of the group's first: mean bytes, mean ln ratio.
    let mut out: Vec<[f64; 2]> = Vec::new();
    let mut i = 0;
    while i < r.len() {
        let first = r[i].0;
        let j = i + r[i..].iter().take_while(|x| x.0 <= first * 1.05).count();
        let n = (j - i) as f64;
        let bytes = r[i..j].iter().map(|x| x.0).sum::<f64>() / n;
        let ln = r[i..j].iter().map(|x| x.1).sum::<f64>() / n;
        out.push([bytes, ln.exp()]);
        i = j;
    }
    let tb = c.conditions.table_bytes as f64;
    out.retain(|x| (x[0] / tb - 1.0).abs() > 0.05);
    out.push([tb, 1.0]);
    out.sort_by(|a, b| a[0].total_cmp(&b[0]));
    out
}

/// Flops of the MLP's forward and backward over `batch` examples.
pub fn mlp_flops(layers: &[usize], batch: usize) -> f64 {
    6.0 * batch as f64 * layers.windows(2).map(|w| (w[0] * w[1]) as f64).sum::<f64>()
}

/// The predicted seconds of one training step.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StepPrediction {
    /// The planner's cost per rank (embedding lookups, exchange, update).
    pub embedding_per_rank: Vec<f64>,
    pub embedding_max: f64,
    /// The MLP's forward and backward over the rank's examples.
    pub dense: f64,
    /// The all-reduce of the MLP's gradient.
    pub allreduce: f64,
    pub step: f64,
}

impl Costs {
    /// The predicted step of a rank holding `batch_per_rank` examples with the MLP
    /// `layers`, under `world` ranks, whose embedding costs are `embedding_per_rank`
    /// (a [`super::PlanReport`]'s `cost_per_rank` under [`Costs::model`]).
    pub fn predict(
        &self,
        embedding_per_rank: Vec<f64>,
        layers: &[usize],
        batch_per_rank: usize,
        world: usize,
    ) -> StepPrediction {
        let f = &self.fit;
        let embedding_max = embedding_per_rank.iter().copied().fold(0.0, f64::max);
        let threads = self.conditions.threads.max(1) as f64;
        let dense =
            mlp_flops(layers, batch_per_rank) / self.mlp_rate(layers, batch_per_rank) / threads;
        let n = world as f64;
        let params: f64 = layers.windows(2).map(|w| (w[0] * w[1] + w[1]) as f64).sum();
        let allreduce = if world > 1 {
            f.all_reduce_latency_s + 2.0 * params * 4.0 * (n - 1.0) / n / f.model.allreduce_bw
        } else {
            0.0
        };
        StepPrediction {
            embedding_per_rank,
            embedding_max,
            dense,
            allreduce,
            step: embedding_max + dense + allreduce,
        }
    }

    /// FLOP/s of the MLP step of `layers` over `batch` examples: a measured shape's
    /// own rate at the measured batch nearest `batch` (in log scale); another shape's
    /// interpolated linearly in the log of the flops per example between the measured
    /// shapes around it (each at its batch nearest `batch`), the nearest one's beyond
    /// them; the overall rate ([`Fit::mlp_flops`]) without points.
    pub fn mlp_rate(&self, layers: &[usize], batch: usize) -> f64 {
        struct Shape<'a> {
            layers: &'a [usize],
            /// ln of the flops per example.
            x: f64,
            /// |ln batch - ln `batch`| of the point kept, and its rate.
            dist: f64,
            rate: f64,
        }
        let lb = (batch.max(1) as f64).ln();
        let mut shapes: Vec<Shape> = Vec::new();
        for q in &self.mlp {
            let rate = mlp_flops(&q.layers, q.batch) / q.seconds;
            let dist = ((q.batch.max(1) as f64).ln() - lb).abs();
            match shapes.iter_mut().find(|s| s.layers == q.layers.as_slice()) {
                Some(s) if dist < s.dist => {
                    s.dist = dist;
                    s.rate = rate;
                }
                Some(_) => {}
                None => shapes.push(Shape {
                    layers: &q.layers,
                    x: mlp_flops(&q.layers, 1).max(1.0).ln(),
                    dist,
                    rate,
                }),
            }
        }
        if let Some(s) = shapes.iter().find(|s| s.layers == layers) {
            return s.rate;
        }
        shapes.sort_by(|a, b| a.x.total_cmp(&b.x));
        let (Some(first), Some(last)) = (shapes.first(), shapes.last()) else {
            return self.fit.mlp_flops;
        };
        let x = mlp_flops(layers, 1).max(1.0).ln();
        if x <= first.x {
            return first.rate;
        }
        for w in shapes.windows(2) {
            let (a, b) = (&w[0], &w[1]);
            if x <= b.x {
                let t = if b.x > a.x {
                    (x - a.x) / (b.x - a.x)
                } else {
                    1.0
                };
                return a.rate + t * (b.rate - a.rate);
            }
        }
        last.rate
    }

    /// The planner's model (the fit of the points).
    pub fn model(&self) -> CostModel {
        self.fit.model.clone()
    }

    /// The calibration in file `path`, every field checked (see the module doc); the
    /// fit recomputed from the points.
    pub fn from_file(path: &Path) -> Result<Costs> {
        let text = crate::error::read_text(path)?;
        let v: Value = serde_json::from_str(&text)
            .map_err(|e| Error::input(path, format!("not a costs file (JSON): {e}")))?;
        let mut c = parse(&v).map_err(|msg| Error::input(path, msg))?;
        c.fit = fit(&c);
        c.fit
            .model
            .check()
            .map_err(|msg| Error::input(path, format!("the fit of the points: {msg}")))?;
        Ok(c)
    }

    /// JSON text of the calibration.
    pub fn to_json(&self) -> Result<String> {
        serde_json::to_string_pretty(self).map_err(|e| Error::Config(format!("costs: {e}")))
    }
}

// ---------------------------------------------------------------------------------
// Reading, field by field.

type R<T> = std::result::Result<T, String>;

/// A JSON object at a path, for messages that name the field.
struct Obj<'a> {
    map: &'a Map<String, Value>,
    path: String,
}

impl<'a> Obj<'a> {
    fn of(v: &'a Value, path: &str) -> R<Obj<'a>> {
        match v {
            Value::Object(map) => Ok(Obj {
                map,
                path: path.to_string(),
            }),
            _ => Err(format!("{}: must be an object", name(path))),
        }
    }

    fn at(&self, k: &str) -> String {
        if self.path.is_empty() {
            k.to_string()
        } else {
            format!("{}.{k}", self.path)
        }
    }

    fn only(&self, known: &[&str]) -> R<()> {
        for k in self.map.keys() {
            if !known.contains(&k.as_str()) {
                return Err(format!(
                    "{}: unknown field (known: {})",
                    self.at(k),
                    known.join(", ")
                ));
            }
        }
        Ok(())
    }

    fn get(&self, k: &str) -> R<&'a Value> {
        self.map
            .get(k)
            .ok_or_else(|| format!("{}: missing", self.at(k)))
    }

    fn f64(&self, k: &str) -> R<f64> {
        self.get(k)?
            .as_f64()
            .ok_or_else(|| format!("{}: must be a number", self.at(k)))
    }

    /// A finite number > 0 (`positive`) or >= 0.
    fn num(&self, k: &str, positive: bool) -> R<f64> {
        let v = self.f64(k)?;
        let ok = v.is_finite() && if positive { v > 0.0 } else { v >= 0.0 };
        if ok {
            Ok(v)
        } else {
            Err(format!(
                "{} {v}: must be a finite number {}",
                self.at(k),
                if positive { "> 0" } else { ">= 0" }
            ))
        }
    }

    /// An integer >= `min`.
    fn int(&self, k: &str, min: u64) -> R<u64> {
        let v = self.get(k)?;
        let n = v
            .as_u64()
            .ok_or_else(|| format!("{} {v}: must be an integer >= {min}", self.at(k)))?;
        if n < min {
            return Err(format!("{} {n}: must be at least {min}", self.at(k)));
        }
        Ok(n)
    }

    fn usize(&self, k: &str, min: u64) -> R<usize> {
        let n = self.int(k, min)?;
        usize::try_from(n).map_err(|_| format!("{} {n}: too large", self.at(k)))
    }

    fn string(&self, k: &str) -> R<String> {
        match self.get(k)? {
            Value::String(s) if !s.is_empty() => Ok(s.clone()),
            v => Err(format!("{} {v}: must be a non-empty string", self.at(k))),
        }
    }

    fn bool(&self, k: &str) -> R<bool> {
        self.get(k)?
            .as_bool()
            .ok_or_else(|| format!("{}: must be true or false", self.at(k)))
    }

    /// A non-empty array of objects.
    fn objs(&self, k: &str) -> R<Vec<Obj<'a>>> {
        let v = self.get(k)?;
        let a = v
            .as_array()
            .ok_or_else(|| format!("{}: must be an array", self.at(k)))?;
        if a.is_empty() {
            return Err(format!("{}: must not be empty", self.at(k)));
        }
        a.iter()
            .enumerate()
            .map(|(i, x)| Obj::of(x, &format!("{}[{i}]", self.at(k))))
            .collect()
    }
}

fn name(path: &str) -> &str {
    if path.is_empty() {
        "the file"
    } else {
        path
    }
}

fn parse(v: &Value) -> R<Costs> {
    let top = Obj::of(v, "")?;
    top.only(&[
        "schema",
        "conditions",
        "gather",
        "scatter",
        "mlp",
        "all_to_all",
        "all_reduce",
        "pooled",
        "fit",
    ])?;
    let schema = top.string("schema")?;
    if schema != SCHEMA {
        return Err(format!("schema {schema:?}: must be {SCHEMA:?}"));
    }
    let c = Obj::of(top.get("conditions")?, "conditions")?;
    c.only(&[
        "ranks",
        "torus",
        "threads",
        "cpu",
        "avx512",
        "avx2",
        "commit",
        "quick",
        "reps",
        "table_bytes",
    ])?;
    let conditions = Conditions {
        ranks: c.usize("ranks", 1)?,
        torus: c.string("torus")?,
        threads: c.usize("threads", 1)?,
        cpu: c.string("cpu")?,
        avx512: c.bool("avx512")?,
        avx2: c.bool("avx2")?,
        commit: c.string("commit")?,
        quick: c.bool("quick")?,
        reps: c.usize("reps", 1)?,
        table_bytes: c.int("table_bytes", 4)?,
    };
    let kernel = |k: &str| -> R<Vec<KernelPoint>> {
        top.objs(k)?
            .iter()
            .map(|o| {
                o.only(&["dim", "pooling", "dist", "tables", "rows", "ids", "seconds"])?;
                let dist = o.string("dist")?;
                if dist != "uniform" && dist != "zipf" {
                    return Err(format!(
                        "{} {dist:?}: must be uniform or zipf",
                        o.at("dist")
                    ));
                }
                Ok(KernelPoint {
                    dim: o.usize("dim", 1)?,
                    pooling: o.usize("pooling", 1)?,
                    dist,
                    tables: o.usize("tables", 1)?,
                    rows: o.int("rows", 1)?,
                    ids: o.int("ids", 1)?,
                    seconds: o.num("seconds", true)?,
                })
            })
            .collect()
    };
    let gather = kernel("gather")?;
    let scatter = kernel("scatter")?;
    let mlp = top
        .objs("mlp")?
        .iter()
        .map(|o| {
            o.only(&["layers", "batch", "seconds"])?;
            let layers: Vec<usize> = o
                .get("layers")?
                .as_array()
                .filter(|a| a.len() >= 2)
                .and_then(|a| {
                    a.iter()
                        .map(|x| x.as_u64().filter(|&n| n >= 1).map(|n| n as usize))
                        .collect()
                })
                .ok_or_else(|| format!("{}: must be at least two widths >= 1", o.at("layers")))?;
            Ok(MlpPoint {
                layers,
                batch: o.usize("batch", 1)?,
                seconds: o.num("seconds", true)?,
            })
        })
        .collect::<R<Vec<_>>>()?;
    let coll = |k: &str| -> R<Vec<CollPoint>> {
        top.objs(k)?
            .iter()
            .map(|o| {
                o.only(&["bytes", "seconds"])?;
                Ok(CollPoint {
                    bytes: o.int("bytes", 1)?,
                    seconds: o.num("seconds", true)?,
                })
            })
            .collect()
    };
    let all_to_all = coll("all_to_all")?;
    let all_reduce = coll("all_reduce")?;
    // Optional: files written before the pooled steps were measured have none.
    let pooled = match top.map.get("pooled") {
        None => Vec::new(),
        Some(_) => top
            .objs("pooled")?
            .iter()
            .map(|o| {
                o.only(&[
                    "dim",
                    "pooling",
                    "tables",
                    "rows",
                    "batch",
                    "placement",
                    "pieces",
                    "mode",
                    "seconds",
                ])?;
                let placement = o.string("placement")?;
                let mode = match o.map.get("mode") {
                    None => "pooled".to_string(),
                    Some(_) => o.string("mode")?,
                };
                if !POOLED_MODES.contains(&mode.as_str()) {
                    return Err(format!(
                        "{} {mode:?}: must be one of {}",
                        o.at("mode"),
                        POOLED_MODES.join(", ")
                    ));
                }
                if !POOLED_PLACEMENTS.contains(&placement.as_str()) {
                    return Err(format!(
                        "{} {placement:?}: must be one of {}",
                        o.at("placement"),
                        POOLED_PLACEMENTS.join(", ")
                    ));
                }
                let q = PooledPoint {
                    dim: o.usize("dim", 1)?,
                    pooling: o.usize("pooling", 1)?,
                    tables: o.usize("tables", 1)?,
                    rows: o.int("rows", 1)?,
                    batch: o.usize("batch", 1)?,
                    placement,
                    pieces: o.usize("pieces", 1)?,
                    mode,
                    seconds: o.num("seconds", true)?,
                };
                if q.placement == "column" && (q.pieces > q.dim || !q.dim.is_multiple_of(q.pieces))
                {
                    return Err(format!(
                        "{} {}: must divide dim {}",
                        o.at("pieces"),
                        q.pieces,
                        q.dim
                    ));
                }
                if q.placement != "table" && q.pieces as u64 > q.rows {
                    return Err(format!(
                        "{} {}: more than the rows",
                        o.at("pieces"),
                        q.pieces
                    ));
                }
                Ok(q)
            })
            .collect::<R<Vec<_>>>()?,
    };
    let f = Obj::of(top.get("fit")?, "fit")?;
    f.only(&[
        "model",
        "all_to_all_latency_s",
        "all_reduce_latency_s",
        "mlp_flops",
        "zipf_ratio",
        "together_ratio",
        "kernel_interference",
    ])?;
    // Optional: files from before the together points have none.
    if f.map.contains_key("kernel_interference") {
        f.num("kernel_interference", false)?;
    }
    let m = Obj::of(f.get("model")?, "fit.model")?;
    m.only(&[
        "net_bw",
        "allreduce_bw",
        "mem_bw",
        "lookup_s",
        "shard_s",
        "line_bytes",
        "interference",
        "interference_count",
        "interference_rows",
        "ask_row_access",
        "width_factor",
        "size_factor",
        "pooled_measured",
        "pooled_occ_s",
        "pooled_occ_float_s",
        "pooled_example_s",
        "pooled_size_factor",
        "ask_zipf_factor",
        "ask_measured",
        "ask_occ_s",
        "ask_occ_float_s",
        "ask_example_s",
        "rows_size_factor",
    ])?;
    for k in ["net_bw", "allreduce_bw", "mem_bw", "line_bytes"] {
        m.num(k, true)?;
    }
    for k in ["lookup_s", "shard_s", "interference"] {
        m.num(k, false)?;
    }
    // Optional: files from before the `rows` mode's own interference have none.
    if m.map.contains_key("interference_rows") {
        m.num("interference_rows", false)?;
    }
    m.get("width_factor")?
        .as_array()
        .ok_or_else(|| format!("{}: must be an array", m.at("width_factor")))?;
    f.num("all_to_all_latency_s", false)?;
    f.num("all_reduce_latency_s", false)?;
    f.num("mlp_flops", true)?;
    f.get("zipf_ratio")?
        .as_array()
        .ok_or_else(|| format!("{}: must be an array", f.at("zipf_ratio")))?;
    let mut out = Costs {
        schema,
        conditions,
        gather,
        scatter,
        mlp,
        all_to_all,
        all_reduce,
        pooled,
        fit: Fit {
            model: CostModel::default(),
            all_to_all_latency_s: 0.0,
            all_reduce_latency_s: 0.0,
            mlp_flops: 1.0,
            zipf_ratio: Vec::new(),
            together_ratio: Vec::new(),
            kernel_interference: 0.0,
        },
    };
    if !out
        .gather
        .iter()
        .any(|p| p.tables == 1 && p.dist == "uniform")
    {
        return Err("gather: needs a uniform single-table point".into());
    }
    out.fit = fit(&out);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Conditions of a test file: `ranks` on `torus`, quick, one rep.
    fn test_conditions(ranks: usize, torus: &str) -> Conditions {
        Conditions {
            ranks,
            torus: torus.into(),
            threads: 1,
            cpu: "test".into(),
            avx512: false,
            avx2: true,
            commit: "abc".into(),
            quick: true,
            reps: 1,
            table_bytes: 1 << 20,
        }
    }

    #[test]
    fn kernel_rounds_keep_every_point_once_in_the_order_of_one_round() {
        let cond = || test_conditions(1, "1");
        let key = |c: &Costs| -> Vec<(usize, usize, String, usize, u64, u64)> {
            c.gather
                .iter()
                .chain(&c.scatter)
                .map(|p| (p.dim, p.pooling, p.dist.clone(), p.tables, p.rows, p.ids))
                .collect()
        };
        let comm = crate::comm::single::SingleComm::new();
        let one = CalibOptions {
            kernel_rounds: 1,
            reps: 1,
            ..CalibOptions::new(true)
        };
        let three = CalibOptions {
            kernel_rounds: 3,
            ..one.clone()
        };
        let a = global_calibrate(&comm, &one, cond()).unwrap();
        let b = global_calibrate(&comm, &three, cond()).unwrap();
        assert!(!a.gather.is_empty() && a.gather.len() == a.scatter.len());
        assert_eq!(key(&a), key(&b));
        assert!(b.gather.iter().chain(&b.scatter).all(|p| p.seconds > 0.0));
    }

    #[test]
    fn the_mlp_points_are_every_shape_at_every_batch_each_timed_in_every_round() {
        let o = CalibOptions {
            mlp_shapes: vec![vec![8, 4, 1], vec![16, 8, 1]],
            mlp_batches: vec![32, 64],
            mlp_rounds: 5,
            ..CalibOptions::new(true)
        };
        let pts = global_mlp_points(&crate::comm::single::SingleComm::new(), &o).unwrap();
        let got: Vec<(Vec<usize>, usize)> =
            pts.iter().map(|p| (p.layers.clone(), p.batch)).collect();
        let want = vec![
            (vec![8, 4, 1], 32),
            (vec![8, 4, 1], 64),
            (vec![16, 8, 1], 32),
            (vec![16, 8, 1], 64),
        ];
        assert_eq!(got, want);
        assert!(pts.iter().all(|p| p.seconds > 0.0), "{pts:?}");
        // A bad shape is refused as the MLP refuses it, not timed.
        let bad = CalibOptions {
            mlp_shapes: vec![vec![8]],
            ..o
        };
        assert!(global_mlp_points(&crate::comm::single::SingleComm::new(), &bad).is_err());
    }

    #[test]
    fn each_point_keeps_the_median_of_its_passes() {
        // Three passes of two points; the second pass was a slow minute.
        let passes = vec![vec![1.0, 10.0], vec![3.0, 30.0], vec![2.0, 11.0]];
        assert_eq!(median_over_passes(&passes), vec![2.0, 11.0]);
        // One pass is itself; a point missing from a pass is the median of the rest.
        assert_eq!(median_over_passes(&passes[..1]), vec![1.0, 10.0]);
        assert_eq!(
            median_over_passes(&[vec![1.0, 4.0], vec![3.0]]),
            vec![2.0, 4.0]
        );
        assert!(median_over_passes(&[]).is_empty());
    }

    #[test]
    fn a_synchronized_phase_costs_the_mean_over_rounds_of_the_slowest_rank() {
        // Rank 1 is slow in round 0, rank 0 in round 2: the step waits for each.
        let r0 = [1.0, 2.0, 5.0];
        let r1 = [3.0, 1.0, 4.0];
        let got = synchronized_seconds(&[&r0, &r1]);
        assert!((got - (3.0 + 2.0 + 5.0) / 3.0).abs() < 1e-12, "{got}");
        // One rank: the mean of its rounds (a slow round counts, as in training).
        assert!((synchronized_seconds(&[&r0]) - 8.0 / 3.0).abs() < 1e-12);
        assert_eq!(synchronized_seconds(&[]), 0.0);
        assert_eq!(synchronized_seconds(&[&[], &[]]), 0.0);
    }

    fn point(dim: usize, dist: &str, tables: usize, per_id: f64) -> KernelPoint {
        KernelPoint {
            dim,
            pooling: 8,
            dist: dist.into(),
            tables,
            rows: rows_of(1 << 20, dim),
            ids: 1000 * tables as u64,
            seconds: per_id * 1000.0 * tables as f64,
        }
    }

    fn costs() -> Costs {
        // Per id: 10 ns + bytes / 10 GB/s (gather), twice the bytes for a scatter;
        // k tables together 1 + 0.6 (1 - 1/k) times slower per id (k = 2, 4, 8).
        let g = |d: usize| 10e-9 + (4.0 * d as f64).max(64.0) / 10e9;
        let s = |d: usize| 10e-9 + 2.0 * (4.0 * d as f64).max(64.0) / 10e9;
        let mut gather = Vec::new();
        let mut scatter = Vec::new();
        for d in [16, 32, 64, 128] {
            gather.push(point(d, "uniform", 1, g(d)));
            gather.push(point(d, "zipf", 1, 0.5 * g(d)));
            scatter.push(point(d, "uniform", 1, s(d)));
        }
        for k in [2, 4, 8] {
            let r = 1.0 + 0.6 * (1.0 - 1.0 / k as f64);
            gather.push(point(32, "uniform", k, r * g(32)));
            scatter.push(point(32, "uniform", k, r * s(32)));
        }
        Costs {
            pooled: Vec::new(),
            schema: SCHEMA.into(),
            conditions: test_conditions(2, "2x1"),
            gather,
            scatter,
            mlp: vec![MlpPoint {
                layers: vec![10, 10, 1],
                batch: 100,
                seconds: mlp_flops(&[10, 10, 1], 100) / 1e9,
            }],
            all_to_all: vec![
                CollPoint {
                    bytes: 1000,
                    seconds: 1e-6 + 500.0 / 1e9,
                },
                CollPoint {
                    bytes: 100_000,
                    seconds: 1e-6 + 50_000.0 / 1e9,
                },
            ],
            all_reduce: vec![
                CollPoint {
                    bytes: 1000,
                    seconds: 2e-6 + 1000.0 / 2e9,
                },
                CollPoint {
                    bytes: 100_000,
                    seconds: 2e-6 + 100_000.0 / 2e9,
                },
            ],
            fit: Fit {
                model: CostModel::default(),
                all_to_all_latency_s: 0.0,
                all_reduce_latency_s: 0.0,
                mlp_flops: 1.0,
                zipf_ratio: Vec::new(),
                together_ratio: Vec::new(),
                kernel_interference: 0.0,
            },
        }
    }

    #[test]
    fn the_fit_recovers_the_constants_the_points_were_made_with() {
        let f = fit(&costs());
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-6 * b.abs();
        assert!(close(f.model.lookup_s, 10e-9), "{f:?}");
        assert!(close(f.model.mem_bw, 10e9), "{f:?}");
        assert!(close(f.model.interference, 0.6), "{f:?}");
        assert!(f.model.ask_row_access, "{f:?}");
        assert_eq!(f.together_ratio.len(), 3, "{f:?}");
        assert!(close(f.together_ratio[2][1], 1.525), "{f:?}");
        assert!(close(f.model.net_bw, 1e9), "{f:?}");
        assert!(close(f.all_to_all_latency_s, 1e-6), "{f:?}");
        assert!(close(f.model.allreduce_bw, 2e9), "{f:?}");
        assert!(close(f.all_reduce_latency_s, 2e-6), "{f:?}");
        assert!(close(f.mlp_flops, 1e9), "{f:?}");
        for [_, r] in &f.model.width_factor {
            assert!(close(*r, 1.0), "{f:?}");
        }
        // Zipf gathers were made twice as fast per id, at every width.
        assert_eq!(f.zipf_ratio.len(), 4, "{f:?}");
        for [_, r] in &f.zipf_ratio {
            assert!(close(*r, 0.5), "{f:?}");
        }
        // A width made ten times slower: its cost, and only its, grows tenfold.
        let mut c = costs();
        for q in c.gather.iter_mut().chain(c.scatter.iter_mut()) {
            if q.dim == 64 {
                q.seconds *= 10.0;
            }
        }
        let g = fit(&c);
        let per_width = |f: &Fit, w: usize| {
            let m = &f.model;
            // A gather and a scatter per id: two lookups, three row accesses.
            m.factor(w) * (2.0 * m.lookup_s + 3.0 * (4.0 * w as f64).max(64.0) / m.mem_bw)
        };
        for w in [16, 32, 128] {
            assert!(close(per_width(&g, w), per_width(&f, w)), "{w}: {g:?}");
        }
        assert!(close(per_width(&g, 64), 10.0 * per_width(&f, 64)), "{g:?}");
        // Without size points: no size factor (the model prices every size alike).
        assert!(f.model.size_factor.is_empty(), "{f:?}");
    }

    #[test]
    fn the_size_factor_is_the_per_id_ratio_to_the_reference_size() {
        let mut c = costs();
        let f0 = fit(&c);
        // Tables of 64 kB: 0.4 times the reference's per-id seconds (gather 0.3 and
        // scatter 0.533..: geometric mean 0.4); of 16 MB: 2 times, at every width.
        for d in [16, 32, 64, 128] {
            let at = |q: &KernelPoint, bytes: u64, r: f64| KernelPoint {
                rows: rows_of(bytes, d),
                seconds: q.seconds * r,
                ..q.clone()
            };
            let g = c
                .gather
                .iter()
                .find(|q| q.dim == d && q.dist == "uniform")
                .unwrap()
                .clone();
            let s = c
                .scatter
                .iter()
                .find(|q| q.dim == d && q.tables == 1)
                .unwrap()
                .clone();
            c.gather.push(at(&g, 1 << 16, 0.3));
            c.scatter.push(at(&s, 1 << 16, 0.16 / 0.3));
            c.gather.push(at(&g, 16 << 20, 2.0));
            c.scatter.push(at(&s, 16 << 20, 2.0));
        }
        let f = fit(&c);
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * b.abs();
        let sf = &f.model.size_factor;
        assert_eq!(sf.len(), 3, "{sf:?}");
        assert!(close(sf[0][0], 65536.0) && close(sf[0][1], 0.4), "{sf:?}");
        assert_eq!(sf[1], [1048576.0, 1.0], "{sf:?}");
        assert!(
            close(sf[2][0], 16777216.0) && close(sf[2][1], 2.0),
            "{sf:?}"
        );
        // The interference's variable is now the size factor of the tables'
        // bytes together over one's: 0.25, 0.5, 0.75 for 2, 4, 8 tables of 1 MB
        // (made 0.3, 0.45, 0.525 slower), so its least-squares slope is
        // 0.69375 / 0.875.
        assert!(
            close(f.model.interference, 0.69375 / 0.875),
            "{}",
            f.model.interference
        );
        // The size points leave the rest of the fit as it was.
        let mut m = f.model.clone();
        m.size_factor.clear();
        m.interference = f0.model.interference;
        assert_eq!(m, f0.model);
        assert_eq!(f.zipf_ratio, f0.zipf_ratio);
        assert_eq!(f.together_ratio, f0.together_ratio);
        // Between sizes: linear in ln bytes; beyond them: the end factors.
        let at = |b: f64| f.model.size_factor_at(b);
        assert!(close(at(4194304.0), 1.5), "{}", at(4194304.0));
        assert!(close(at(262144.0), 0.7), "{}", at(262144.0));
        assert!(close(at(1.0), 0.4) && close(at(1e12), 2.0));
        assert!(f.model.check().is_ok());
        let mut bad = f.model.clone();
        bad.size_factor.swap(0, 2);
        assert!(bad.check().unwrap_err().contains("size_factor[1]"));
    }

    #[test]
    fn the_mlp_rate_is_the_shapes_own_or_interpolated_between_shapes() {
        let mut c = costs();
        // Shape a at 1 and 2 GFLOP/s (batches 100 and 1000); shape b (92 times a's
        // flops per example) at 4 GFLOP/s.
        let (a, b) = (vec![10, 10, 1], vec![100, 100, 1]);
        let at = |l: &Vec<usize>, batch: usize, rate: f64| MlpPoint {
            layers: l.clone(),
            batch,
            seconds: mlp_flops(l, batch) / rate,
        };
        c.mlp = vec![at(&a, 100, 1e9), at(&a, 1000, 2e9), at(&b, 1000, 4e9)];
        let close = |x: f64, y: f64| (x - y).abs() <= 1e-9 * y;
        // A measured shape: its rate at the nearest batch (in log scale).
        assert!(close(c.mlp_rate(&a, 120), 1e9));
        assert!(close(c.mlp_rate(&a, 900), 2e9));
        assert!(close(c.mlp_rate(&b, 10), 4e9));
        // Between: linear in ln(flops per example), from a's rate at that batch.
        let (fa, fb) = (mlp_flops(&a, 1), mlp_flops(&b, 1));
        let mid = vec![1, (fa * 10.0 / 12.0) as usize, 1];
        assert!(close(mlp_flops(&mid, 1), fa * 10.0));
        let want = 2e9 + 10f64.ln() / (fb / fa).ln() * 2e9;
        let got = c.mlp_rate(&mid, 1000);
        assert!(close(got, want), "{got} {want}");
        // Beyond: the nearest shape's.
        assert!(close(c.mlp_rate(&[1, 1, 1], 1000), 2e9));
        assert!(close(c.mlp_rate(&[1000, 1000, 1], 1000), 4e9));
        // predict() prices the MLP at that rate.
        let p = c.predict(vec![0.0], &mid, 1000, 1);
        assert!(close(p.dense, mlp_flops(&mid, 1000) / want));
    }

    #[test]
    fn files_round_trip_and_bad_fields_are_named() {
        let c = costs();
        let text = c.to_json().unwrap();
        let v: Value = serde_json::from_str(&text).unwrap();
        let back = parse(&v).unwrap();
        assert_eq!(back.gather, c.gather);
        assert_eq!(back.conditions, c.conditions);
        let bad = |edit: &dyn Fn(&mut Value), want: &str| {
            let mut w = v.clone();
            edit(&mut w);
            let e = parse(&w).unwrap_err();
            assert!(e.contains(want), "{want}: {e}");
        };
        bad(
            &|w| w["gather"][2]["seconds"] = (-1.0).into(),
            "gather[2].seconds",
        );
        bad(
            &|w| w["scatter"][0]["dist"] = "normal".into(),
            "scatter[0].dist",
        );
        bad(&|w| w["conditions"]["ranks"] = 0.into(), "conditions.ranks");
        bad(
            &|w| {
                w["conditions"].as_object_mut().unwrap().remove("cpu");
            },
            "conditions.cpu: missing",
        );
        bad(
            &|w| w["mlp"][0]["layers"] = serde_json::json!([3]),
            "mlp[0].layers",
        );
        bad(
            &|w| w["all_reduce"][1]["bytes"] = "x".into(),
            "all_reduce[1].bytes",
        );
        bad(
            &|w| w["fit"]["model"]["mem_bw"] = 0.into(),
            "fit.model.mem_bw",
        );
        bad(&|w| w["extra"] = 1.into(), "extra: unknown field");
        bad(&|w| w["schema"] = "v0".into(), "schema");
        bad(
            &|w| w["all_to_all"] = serde_json::json!([]),
            "all_to_all: must not be empty",
        );
    }

    #[test]
    fn interference_raises_the_cost_of_a_rank_with_several_pieces() {
        // Without a size factor (the bytes do not count): 1 + beta (1 - 1/k).
        let mut m = CostModel::default();
        assert_eq!(m.with_interference(2.0, 3, 1e9), 2.0);
        m.interference = 0.25;
        assert_eq!(m.with_interference(2.0, 1, 1e9), 2.0);
        assert_eq!(m.with_interference(2.0, 2, 1e9), 2.25);
        assert_eq!(m.with_interference(2.0, 4, 1e9), 2.375);
        // Saturating: never above 1 + interference times the sum.
        assert!(m.with_interference(2.0, 1000, 1e9) < 2.5);
        assert!(m.with_interference(2.0, 1000, 1e9) > m.with_interference(2.0, 4, 1e9));
    }

    #[test]
    fn with_a_size_factor_pieces_interfere_as_one_table_of_their_bytes() {
        // Per row access: 0.5 at 1 MB, 1 at 100 MB, 1.5 at 1 GB (linear in ln bytes).
        let m = CostModel {
            interference: 2.0,
            size_factor: vec![[1e6, 0.5], [1e8, 1.0], [1e9, 1.5]],
            ..CostModel::default()
        };
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        // Ten tables of 1 MB share the caches as one of 10 MB: 0.75 / 0.5.
        assert!(
            close(m.interference_x(10, 1e7), 0.5),
            "{}",
            m.interference_x(10, 1e7)
        );
        assert!(close(
            m.with_interference(3.0, 10, 1e7),
            3.0 * (1.0 + 2.0 * 0.5)
        ));
        // Two of 100 MB: 1 + 0.5 ln 2 / ln 10 over 1.
        let x = 0.5 * 2f64.ln() / 10f64.ln();
        assert!(
            close(m.interference_x(2, 2e8), x),
            "{}",
            m.interference_x(2, 2e8)
        );
        // Tables past the largest size measured already miss alone: no more together.
        assert_eq!(m.interference_x(4, 8e9), 0.0);
        // One piece never interferes.
        assert_eq!(m.interference_x(1, 1e7), 0.0);
        assert_eq!(m.with_interference(3.0, 1, 1e7), 3.0);
    }

    #[test]
    fn interference_fitted_to_points_that_level_off_stays_within_them() {
        // The ratios measured at 2 ranks: 1.12, 1.30, 1.26 for 2, 4, 8 tables. A
        // rank holding 43 tables (dlrm-synthetic at 2 ranks) is priced near the
        // largest measured ratio, not extrapolated along a line in k (3.1 times).
        let mut c = costs();
        c.gather.retain(|q| q.tables == 1);
        c.scatter.retain(|q| q.tables == 1);
        let g = |d: usize| 10e-9 + (4.0 * d as f64).max(64.0) / 10e9;
        for (k, r) in [(2, 1.12), (4, 1.30), (8, 1.26)] {
            c.gather.push(point(32, "uniform", k, r * g(32)));
        }
        let f = fit(&c);
        let m = &f.model;
        let at = |k: usize| m.with_interference(1.0, k, 1e9);
        assert!(at(43) <= 1.35 && at(43) >= 1.26, "{}: {f:?}", at(43));
        for (k, r) in [(2, 1.12), (4, 1.30), (8, 1.26)] {
            assert!((at(k) - r).abs() < 0.1, "{k}: {} against {r}", at(k));
        }
        let want = [[2.0, 1.12], [4.0, 1.30], [8.0, 1.26]];
        assert_eq!(f.together_ratio.len(), 3, "{f:?}");
        for (got, w) in f.together_ratio.iter().zip(want) {
            assert!(got[0] == w[0] && (got[1] - w[1]).abs() < 1e-9, "{f:?}");
        }
    }

    /// Pooled points whose seconds are what `m` prices at zero pooled
    /// coefficients plus known ones: the fit gives the known ones back.
    #[test]
    fn the_pooled_fit_recovers_known_coefficients() {
        let mut c = costs();
        let m = fit(&c).model;
        let (occ, occ_w, ex) = (60e-9, 0.5e-9, 90e-9);
        let zero = CostModel {
            pooled_measured: true,
            ..m.clone()
        };
        let world = c.conditions.ranks;
        let tb = c.conditions.table_bytes;
        let mut pts = Vec::new();
        for (dim, pooling) in [(16, 1), (16, 32), (64, 1), (64, 32)] {
            for pl in POOLED_PLACEMENTS {
                pts.push(PooledPoint {
                    dim,
                    pooling,
                    tables: world,
                    rows: rows_of(tb, dim),
                    batch: 256,
                    placement: pl.into(),
                    pieces: if pl == "table" { 1 } else { world },
                    mode: "pooled".into(),
                    seconds: 0.0,
                });
            }
        }
        // A table 4 times the reference size, its occurrences 1.5 times as dear.
        pts.push(PooledPoint {
            rows: rows_of(4 * tb, 64),
            ..pts[9].clone()
        });
        for (i, q) in pts.iter_mut().enumerate() {
            let (o, e) = q.per_rank_work(world);
            let mult = q.interference(&m, world);
            let sf = if i == 12 { 1.5 } else { 1.0 };
            let w = q.piece_width() as f64;
            q.seconds = q.modelled(&zero, world) + mult * (o * sf * (occ + w * occ_w) + e * ex);
        }
        c.pooled = pts;
        let f = fit(&c).model;
        assert!(f.pooled_measured);
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-6 * b.abs().max(1e-12);
        assert!(close(f.pooled_occ_s, occ), "{f:?}");
        assert!(close(f.pooled_occ_float_s, occ_w), "{f:?}");
        assert!(close(f.pooled_example_s, ex), "{f:?}");
        let sizes = &f.pooled_size_factor;
        assert_eq!(sizes.len(), 2, "{sizes:?}");
        assert!(
            close(sizes[0][1], 1.0) && close(sizes[1][1], 1.5),
            "{sizes:?}"
        );
        // The model prices every point as it was made.
        for q in &c.pooled {
            let got = q.modelled(&f, world);
            assert!((got / q.seconds - 1.0).abs() < 1e-6, "{q:?}: {got}");
        }
        // Written and read back, the fit is the same.
        let path = std::env::temp_dir().join(format!("pooled-fit-{}.json", std::process::id()));
        std::fs::write(&path, c.to_json().unwrap()).unwrap();
        let back = Costs::from_file(&path).unwrap();
        std::fs::remove_file(&path).ok();
        // (JSON numbers come back to within a unit in the last place.)
        assert_eq!(back.pooled.len(), c.pooled.len());
        for (a, b) in back.pooled.iter().zip(&c.pooled) {
            assert!((a.seconds / b.seconds - 1.0).abs() < 1e-12, "{a:?} {b:?}");
        }
        let g = &back.fit.model;
        assert!(
            close(g.pooled_occ_s, occ) && close(g.pooled_example_s, ex),
            "{g:?}"
        );
        assert!(close(g.pooled_size_factor[1][1], 1.5), "{g:?}");
        // No `rows` points: the asking side keeps the kernels' price.
        assert!(!f.ask_measured && !g.ask_measured, "{f:?}");
    }

    /// `rows` points whose seconds are what `m` prices with a free asking side plus
    /// known per-occurrence and per-example seconds: the fit gives them back, the
    /// pooled fit is not moved, and the model prices every point as made.
    #[test]
    fn the_rows_fit_recovers_the_asking_sides_coefficients() {
        let mut c = costs();
        let m = fit(&c).model;
        let (occ, occ_w, ex) = (40e-9, 1.5e-9, 200e-9);
        let free = CostModel {
            ask_measured: true,
            ..m.clone()
        };
        let world = c.conditions.ranks;
        let tb = c.conditions.table_bytes;
        let mut pts = Vec::new();
        for (dim, pooling) in [(16, 1), (16, 32), (64, 1), (64, 32)] {
            let mut q = PooledPoint {
                dim,
                pooling,
                tables: world,
                rows: rows_of(tb, dim),
                batch: 256,
                placement: "table".into(),
                pieces: 1,
                mode: "rows".into(),
                seconds: 0.0,
            };
            // Each rank asks for its 256 examples in every table.
            let asked = 256.0 * world as f64;
            let w = dim as f64;
            q.seconds =
                q.modelled(&free, world) + asked * (pooling as f64 * (occ + w * occ_w) + ex);
            pts.push(q);
        }
        let before = fit(&c).model;
        c.pooled = pts;
        let f = fit(&c).model;
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-6 * b.abs().max(1e-12);
        assert!(f.ask_measured, "{f:?}");
        assert!(close(f.ask_occ_s, occ), "{f:?}");
        assert!(close(f.ask_occ_float_s, occ_w), "{f:?}");
        assert!(close(f.ask_example_s, ex), "{f:?}");
        // Only `rows` points: nothing pooled was measured.
        assert!(!f.pooled_measured && !before.pooled_measured, "{f:?}");
        for q in &c.pooled {
            let got = q.modelled(&f, world);
            assert!((got / q.seconds - 1.0).abs() < 1e-6, "{q:?}: {got}");
        }
        // A plan's `rows` asking side is the measured one: twice the pooling, twice
        // the occurrences' seconds.
        let spec = c.pooled[1].spec();
        let ctx_cost = |pooling: usize| {
            let q = PooledPoint {
                pooling,
                ..c.pooled[1].clone()
            };
            q.modelled(&f, world) - q.modelled(&free, world)
        };
        let (a, b) = (ctx_cost(8), ctx_cost(16));
        let per_occ = 256.0 * world as f64 * (occ + 16.0 * occ_w);
        assert!(close(b - a, 8.0 * per_occ), "{a} {b} {spec:?}");
    }

    /// `rows` points at the reference size priced by a model with known asking-side
    /// coefficients, and whole `rows` tables at a quarter and 4 times the reference
    /// whose owners' row accesses cost 0.5 and 1.8 times as much: the fit gives the
    /// coefficients from the reference points alone and the larger table's factor
    /// (the smaller one's is the asking side's to explain, and is left at 1), and a
    /// plan's `rows` piece of such a table is priced at it.
    #[test]
    fn the_rows_size_factor_is_what_the_other_sizes_owners_measure() {
        let mut c = costs();
        let kernel = fit(&c).model;
        let world = c.conditions.ranks;
        let tb = c.conditions.table_bytes;
        let truth = CostModel {
            ask_measured: true,
            ask_occ_s: 40e-9,
            ask_occ_float_s: 1.5e-9,
            ask_example_s: 200e-9,
            ..kernel.clone()
        };
        let point = |dim, pooling, bytes| PooledPoint {
            dim,
            pooling,
            tables: world,
            rows: rows_of(bytes, dim),
            batch: 256,
            placement: "table".into(),
            pieces: 1,
            mode: "rows".into(),
            seconds: 0.0,
        };
        let mut pts: Vec<PooledPoint> = [(16, 1), (16, 32), (64, 1), (64, 32)]
            .iter()
            .map(|&(d, p)| point(d, p, tb))
            .collect();
        pts.push(point(64, 32, tb / 4));
        pts.push(point(64, 32, 4 * tb));
        for q in pts.iter_mut() {
            let f = if q.rows < rows_of(tb, q.dim) {
                0.5
            } else if q.rows > rows_of(tb, q.dim) {
                1.8
            } else {
                1.0
            };
            let at = CostModel {
                rows_size_factor: vec![[1.0, f]],
                ..truth.clone()
            };
            q.seconds = q.modelled(&at, world);
        }
        c.pooled = pts;
        let f = fit(&c).model;
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-6 * b.abs().max(1e-12);
        // The asking side from the reference points only.
        assert!(close(f.ask_occ_s, 40e-9), "{f:?}");
        assert!(close(f.ask_occ_float_s, 1.5e-9), "{f:?}");
        assert!(close(f.ask_example_s, 200e-9), "{f:?}");
        let sizes = &f.rows_size_factor;
        assert_eq!(sizes.len(), 2, "{sizes:?}");
        let want = [(tb as f64, 1.0), (4.0 * tb as f64, 1.8)];
        for (got, (b, x)) in sizes.iter().zip(want) {
            assert!((got[0] / b - 1.0).abs() < 0.01, "{sizes:?}");
            assert!(close(got[1], x), "{sizes:?}");
        }
        let without = CostModel {
            rows_size_factor: Vec::new(),
            ..f.clone()
        };
        // Every point but the small table's priced as made; that one as at the
        // reference, above what it was made at; a bigger owner factor, a dearer
        // table.
        for (i, q) in c.pooled.iter().enumerate() {
            let got = q.modelled(&f, world);
            let made = if i == 4 {
                q.modelled(&without, world)
            } else {
                q.seconds
            };
            assert!((got / made - 1.0).abs() < 1e-6, "{q:?}: {got}");
        }
        assert!(c.pooled[4].modelled(&f, world) > 1.01 * c.pooled[4].seconds);
        let big = &c.pooled[5];
        assert!(big.modelled(&f, world) > 1.05 * big.modelled(&without, world));
        // A pooled table is not priced by it.
        let pooled = PooledPoint {
            mode: "pooled".into(),
            ..big.clone()
        };
        assert_eq!(pooled.modelled(&f, world), pooled.modelled(&without, world));
        // Written and read back, the fit is the same; a bad factor is named.
        let path = std::env::temp_dir().join(format!("rows-size-{}.json", std::process::id()));
        std::fs::write(&path, c.to_json().unwrap()).unwrap();
        let back = Costs::from_file(&path).unwrap();
        std::fs::remove_file(&path).ok();
        assert!(
            close(back.fit.model.rows_size_factor[1][1], 1.8),
            "{back:?}"
        );
        let bad = CostModel {
            rows_size_factor: vec![[4.0, 1.0], [2.0, 1.0]],
            ..f.clone()
        };
        let msg = bad.check().unwrap_err();
        assert!(msg.contains("rows_size_factor"), "{msg}");
    }

    /// The training-step points of the interference tests, unpriced: pooled steps in
    /// each placement and `rows` steps, a table a rank, at two widths and poolings;
    /// then one step of each mode with 8 tables a rank (the together points).
    fn step_points(world: usize, table_bytes: u64) -> Vec<PooledPoint> {
        let point = |dim, pooling, tables, placement: &str, mode: &str| PooledPoint {
            dim,
            pooling,
            tables,
            rows: rows_of(table_bytes, dim),
            batch: 256,
            placement: placement.into(),
            pieces: if placement == "table" { 1 } else { world },
            mode: mode.into(),
            seconds: 0.0,
        };
        let mut pts = Vec::new();
        for (dim, pooling) in [(16, 1), (16, 32), (64, 1), (64, 32)] {
            for pl in POOLED_PLACEMENTS {
                pts.push(point(dim, pooling, world, pl, "pooled"));
            }
            pts.push(point(dim, pooling, world, "table", "rows"));
        }
        for mode in POOLED_MODES {
            pts.push(point(64, 8, 8 * world, "table", mode));
        }
        pts
    }

    /// The step coefficients the interference tests price their points with.
    fn step_truth(kernel: &CostModel, interference: f64, count: bool) -> CostModel {
        CostModel {
            interference,
            interference_count: count,
            pooled_measured: true,
            pooled_occ_s: 60e-9,
            pooled_occ_float_s: 0.5e-9,
            pooled_example_s: 90e-9,
            ask_measured: true,
            ask_occ_s: 40e-9,
            ask_occ_float_s: 1.5e-9,
            ask_example_s: 200e-9,
            ..kernel.clone()
        }
    }

    /// Pooled, `rows` and together points priced by a model with known
    /// coefficients and interference: the fit, which fits the two in turn, gives
    /// both back; without the together points the kernel points' interference stays.
    #[test]
    fn the_together_points_give_the_interference_with_the_coefficients() {
        let mut c = costs();
        let kernel = fit(&c).model;
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-6 * b.abs().max(1e-12);
        // The kernel points were made with 0.6 (no size points: 1 - 1/k).
        assert!(close(kernel.interference, 0.6), "{kernel:?}");
        let truth = step_truth(&kernel, 0.25, false);
        let world = c.conditions.ranks;
        let mut pts = step_points(world, c.conditions.table_bytes);
        assert_eq!(pts.iter().filter(|q| q.together(world)).count(), 2);
        assert!(pts.iter().all(|q| q.together(world) == (q.tables > world)));
        for q in pts.iter_mut() {
            q.seconds = q.modelled(&truth, world);
        }
        c.pooled = pts;
        let f = fit(&c);
        let m = &f.model;
        assert!(close(m.interference, 0.25), "{m:?}");
        assert!(close(f.kernel_interference, 0.6), "{f:?}");
        for (got, want) in [
            (m.pooled_occ_s, truth.pooled_occ_s),
            (m.pooled_occ_float_s, truth.pooled_occ_float_s),
            (m.pooled_example_s, truth.pooled_example_s),
            (m.ask_occ_s, truth.ask_occ_s),
            (m.ask_occ_float_s, truth.ask_occ_float_s),
            (m.ask_example_s, truth.ask_example_s),
        ] {
            assert!(close(got, want), "{got} against {want}: {m:?}");
        }
        // The together points moved the interference: what it adds to 8 tables on
        // a rank (their owners' seconds; the asking side is not multiplied) is
        // 0.25 / 0.6 of what the kernel points' would add.
        let crowded = &c.pooled[c.pooled.len() - 2];
        let at = |beta: f64| {
            let b = CostModel {
                interference: beta,
                ..m.clone()
            };
            crowded.modelled(&b, world)
        };
        let r = (at(0.25) - at(0.0)) / (at(0.6) - at(0.0));
        assert!(close(r, 0.25 / 0.6), "{r}");
        assert!(
            close(at(0.25), crowded.seconds),
            "{} {}",
            at(0.25),
            crowded.seconds
        );
        // Without them: the kernel points' interference.
        c.pooled.retain(|q| !q.together(world));
        assert!(close(fit(&c).model.interference, 0.6));
    }

    /// Together points made with a larger interference in the `rows` mode than in the
    /// `pooled` mode: the fit gives each mode's back, and prices each together
    /// point at its measured seconds; with one mode's together point only, its
    /// interference prices both modes.
    #[test]
    fn each_output_mode_gets_the_interference_of_its_together_point() {
        let mut c = costs();
        let kernel = fit(&c).model;
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-6 * b.abs().max(1e-12);
        let truth = CostModel {
            interference_rows: Some(0.4),
            ..step_truth(&kernel, 0.1, false)
        };
        assert!(close(truth.rows_interference(), 0.4));
        let world = c.conditions.ranks;
        let mut pts = step_points(world, c.conditions.table_bytes);
        for q in pts.iter_mut() {
            q.seconds = q.modelled(&truth, world);
        }
        c.pooled = pts.clone();
        let m = fit(&c).model;
        assert!(close(m.interference, 0.1), "{m:?}");
        assert!(close(m.rows_interference(), 0.4), "{m:?}");
        for q in c.pooled.iter().filter(|q| q.together(world)) {
            assert!(close(q.modelled(&m, world), q.seconds), "{q:?}");
        }
        // One shared value prices the `rows` together point below what it measured.
        let shared = CostModel {
            interference_rows: None,
            ..m.clone()
        };
        let rows = c
            .pooled
            .iter()
            .find(|q| q.together(world) && q.mode == "rows")
            .unwrap();
        assert!(rows.modelled(&shared, world) < 0.99 * rows.seconds);
        // Written and read back, the fit keeps both.
        let path = std::env::temp_dir().join(format!("rows-beta-{}.json", std::process::id()));
        std::fs::write(&path, c.to_json().unwrap()).unwrap();
        let back = Costs::from_file(&path).unwrap();
        std::fs::remove_file(&path).ok();
        assert!(close(back.fit.model.rows_interference(), 0.4), "{back:?}");
        // Only the `rows` together point: its interference for both modes.
        c.pooled = pts
            .into_iter()
            .filter(|q| !(q.together(world) && q.mode == "pooled"))
            .collect();
        let only = fit(&c).model;
        assert_eq!(only.interference_rows, None, "{only:?}");
        assert!(close(only.interference, 0.4), "{only:?}");
        // A negative value in a file is refused, naming the field.
        let bad = CostModel {
            interference_rows: Some(-1.0),
            ..m
        };
        let msg = bad.check().unwrap_err();
        assert!(msg.contains("interference_rows"), "{msg}");
    }

    /// A slow minute of a shared machine during the together points' rounds (both
    /// modes' together points and their partners 1.3 times their truth): with the
    /// partners the fit keeps the interference near its truth; without them, the
    /// together points alone carry the slow minute into it.
    #[test]
    fn a_slow_minute_moves_the_together_points_and_their_partners_not_the_interference() {
        let mut c = costs();
        let kernel = fit(&c).model;
        let truth = step_truth(&kernel, 0.25, false);
        let world = c.conditions.ranks;
        let mut pts = step_points(world, c.conditions.table_bytes);
        let together: Vec<PooledPoint> =
            pts.iter().filter(|q| q.together(world)).cloned().collect();
        assert_eq!(together.len(), 2);
        for t in &together {
            let a = PooledPoint::partner(t, world);
            assert!(a.is_partner_of(t, world) && !a.together(world), "{a:?}");
            assert!(!t.is_partner_of(t, world));
            pts.push(a);
        }
        for q in pts.iter_mut() {
            q.seconds = q.modelled(&truth, world);
        }
        c.pooled = pts.clone();
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-6 * b.abs().max(1e-12);
        assert!(close(fit(&c).model.interference, 0.25));
        // The slow minute: the together points and their partners, 1.3 times.
        let slow = |q: &PooledPoint| {
            q.together(world) || together.iter().any(|t| q.is_partner_of(t, world))
        };
        for q in c.pooled.iter_mut().filter(|q| slow(q)) {
            q.seconds *= 1.3;
        }
        let with = fit(&c).model.interference;
        assert!((with / 0.25 - 1.0).abs() < 0.15, "{with}");
        // Without the partners: the together points' slow minute is read as
        // interference.
        c.pooled
            .retain(|q| !together.iter().any(|t| q.is_partner_of(t, world)));
        let without = fit(&c).model.interference;
        assert!(without > 2.0 * 0.25, "{without}");
    }

    #[test]
    fn together_steps_the_size_law_cannot_see_are_priced_by_the_table_count() {
        // Size points that fall beyond the reference size (a table of 16 MB at 0.6
        // times the reference's per-id seconds): k tables of the reference size
        // together have no variable under the size law. Their steps, made with an
        // interference of 0.25 under the count law (1 - 1/k), are priced by it.
        let mut c = costs();
        for d in [16, 32, 64, 128] {
            let at = |q: &KernelPoint, bytes: u64, r: f64| KernelPoint {
                rows: rows_of(bytes, d),
                seconds: q.seconds * r,
                ..q.clone()
            };
            let g = c
                .gather
                .iter()
                .find(|q| q.dim == d && q.dist == "uniform" && q.tables == 1)
                .unwrap()
                .clone();
            let s = c
                .scatter
                .iter()
                .find(|q| q.dim == d && q.tables == 1)
                .unwrap()
                .clone();
            c.gather.push(at(&g, 1 << 16, 0.4));
            c.scatter.push(at(&s, 1 << 16, 0.4));
            c.gather.push(at(&g, 16 << 20, 0.6));
            c.scatter.push(at(&s, 16 << 20, 0.6));
        }
        let kernel = fit(&c).model;
        let world = c.conditions.ranks;
        let tb = c.conditions.table_bytes as f64;
        assert!(!kernel.size_factor.is_empty());
        assert!(!kernel.interference_count);
        assert_eq!(
            kernel.interference_x(8 * world, 8.0 * world as f64 * tb),
            0.0
        );
        let truth = step_truth(&kernel, 0.25, true);
        let mut pts = step_points(world, c.conditions.table_bytes);
        for q in pts.iter_mut() {
            q.seconds = q.modelled(&truth, world);
        }
        let crowded = pts[pts.len() - 2].clone();
        let apart = CostModel {
            interference: 0.0,
            ..truth.clone()
        };
        assert!(crowded.seconds > 1.1 * crowded.modelled(&apart, world));
        c.pooled = pts;
        let m = fit(&c).model;
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-6 * b.abs().max(1e-12);
        assert!(m.interference_count, "{m:?}");
        assert!(close(m.interference, 0.25), "{m:?}");
        assert!(close(crowded.modelled(&m, world), crowded.seconds));
        for (got, want) in [
            (m.pooled_occ_s, truth.pooled_occ_s),
            (m.ask_occ_s, truth.ask_occ_s),
            (m.ask_example_s, truth.ask_example_s),
        ] {
            assert!(close(got, want), "{got} against {want}: {m:?}");
        }
        // Together steps that cost no more than their pieces: no interference, and
        // the size law kept.
        for q in c.pooled.iter_mut() {
            q.seconds = q.modelled(&apart, world);
        }
        let m = fit(&c).model;
        assert!(!m.interference_count && m.interference == 0.0, "{m:?}");
    }

    #[test]
    fn a_bad_pooled_point_is_refused_by_name() {
        let mut c = costs();
        c.pooled = vec![PooledPoint {
            dim: 16,
            pooling: 8,
            tables: 2,
            rows: 1000,
            batch: 64,
            placement: "column".into(),
            pieces: 2,
            mode: "pooled".into(),
            seconds: 1e-3,
        }];
        let good: Value = serde_json::from_str(&c.to_json().unwrap()).unwrap();
        assert!(parse(&good).is_ok());
        for (field, value, want) in [
            ("placement", Value::from("diagonal"), "pooled[0].placement"),
            (
                "pieces",
                Value::from(3),
                "pooled[0].pieces 3: must divide dim 16",
            ),
            ("seconds", Value::from(-1.0), "pooled[0].seconds"),
            (
                "mode",
                Value::from("both"),
                "pooled[0].mode \"both\": must be one of",
            ),
        ] {
            let mut v = good.clone();
            v["pooled"][0][field] = value;
            let err = parse(&v).unwrap_err();
            assert!(err.contains(want), "{field}: {err}");
        }
        // Points from before the `rows` points (no mode) are pooled.
        let mut no_mode = good.clone();
        no_mode["pooled"][0].as_object_mut().unwrap().remove("mode");
        assert_eq!(parse(&no_mode).unwrap().pooled[0].mode, "pooled");
        // Files from before the pooled points read as none.
        let mut old = good.clone();
        old.as_object_mut().unwrap().remove("pooled");
        assert!(parse(&old).unwrap().pooled.is_empty());
    }

    #[test]
    fn the_width_factor_is_the_nearest_measured_widths() {
        let m = CostModel {
            width_factor: vec![[8.0, 2.0], [64.0, 3.0]],
            ..CostModel::default()
        };
        assert_eq!(m.factor(8), 2.0);
        assert_eq!(m.factor(16), 2.0);
        assert_eq!(m.factor(32), 3.0);
        assert_eq!(m.factor(128), 3.0);
        assert_eq!(CostModel::default().factor(16), 1.0);
    }
}
