//! Measured costs (`torusrec calibrate`): micro-benchmarks of the kernels the planner
//! prices, the file that keeps them with the conditions they were measured under, the
//! fit that turns them into a [`CostModel`], and the predicted seconds of a step.
//!
//! # Files
//!
//! - `points.rs`: what a calibration holds: its [`Conditions`], the measured points
//!   ([`KernelPoint`], [`MlpPoint`], [`CollPoint`], [`PooledPoint`]), their [`Fit`]
//!   and the whole [`Costs`];
//! - `options.rs`: how much to measure ([`CalibOptions`]);
//! - `reduce.rs`: how timed seconds become a point's (medians of calls, rounds and
//!   passes; the slowest rank's per round);
//! - `timing/`: the only impure module: it times the kernels, the MLP, the
//!   collectives and pooled training steps on every rank ([`global_calibrate`]);
//! - `fit/`: the points to a [`CostModel`] ([`fit()`]);
//! - `predict.rs`: the predicted step ([`StepPrediction`], [`Costs::predict`]);
//! - `measured.rs`: the measured step of a training run it is compared with;
//! - `json.rs` and `file.rs`: the costs file, every field checked on reading
//!   ([`Costs::from_file`]).
//!
//! The modules but `timing/` are pure: they neither time nor communicate (`file.rs`
//! reads the one file it is given).
//!
//! # What is measured
//!
//! On every rank at once (as training runs them), with the rank's thread count:
//!
//! - **gather-pool** ([`pool_bags`]) and **scatter-update**
//!   ([`scatter_bags`] into the table) per embedding width, pooling factor
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
//! # The fit ([`fit()`])
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
//!
//! [`pool_bags`]: crate::embed::tables::row_kernels::pool_bags
//! [`scatter_bags`]: crate::embed::tables::row_kernels::scatter_bags
//! [`Mlp::forward_backward`]: crate::embed::dense::mlp::Mlp::forward_backward
//! [`Comm`]: crate::comm::Comm
//! [`CostModel`]: crate::embed::planner::CostModel
//! [`CostModel::width_factor`]: crate::embed::planner::CostModel::width_factor
//! [`CostModel::interference_x_sized`]: crate::embed::planner::CostModel::interference_x_sized
//! [`CostModel::interference`]: crate::embed::planner::CostModel::interference
//! [`CostModel::ask_row_access`]: crate::embed::planner::CostModel::ask_row_access
//! [`CostModel::size_factor`]: crate::embed::planner::CostModel::size_factor
//! [`CostModel::pooled_occ_s`]: crate::embed::planner::CostModel::pooled_occ_s
//! [`CostModel::pooled_occ_float_s`]: crate::embed::planner::CostModel::pooled_occ_float_s
//! [`CostModel::pooled_example_s`]: crate::embed::planner::CostModel::pooled_example_s
//! [`CostModel::pooled_size_factor`]: crate::embed::planner::CostModel::pooled_size_factor

pub mod file;
pub mod fit;
mod json;
pub mod measured;
pub mod options;
pub mod points;
pub mod predict;
pub mod reduce;
pub mod timing;

#[cfg(test)]
mod tests;

pub use fit::fit;
pub use options::CalibOptions;
pub use points::{
    rows_of, CollPoint, Conditions, Costs, Fit, KernelPoint, MlpPoint, PooledPoint, POOLED_MODES,
    POOLED_PLACEMENTS, POOLED_TABLE_OPT, SCHEMA, ZIPF_S,
};
pub use predict::StepPrediction;
pub use reduce::{median, median_over_passes, synchronized_seconds};
pub use timing::global_calibrate;
