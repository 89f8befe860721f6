//! The sharded embedding model: tables placed by table, row or column across ranks,
//! looked up through one deduplicated all-to-all per step, and an MLP trained
//! data-parallel with gradient accumulation.
//!
//! By layer, lowest first:
//!
//! - [`tables`]: this rank's table pieces, where they live (the plan), hash tables and
//!   the resolution of keys to rows, the row kernels and the table optimizers;
//! - [`dense`]: the MLP, its matrix products and the quality measures (AUC, log loss);
//! - [`sharding`]: the exchange of rows and gradients between ranks, and the `pooled`
//!   output mode;
//! - [`train`]: the training step, the memory estimate and the batch statistics;
//! - [`io`]: model files and checkpoints (hash tables by key);
//! - [`planner`]: choosing a plan from a cost model;
//! - [`calibrate`]: measuring the cost model's coefficients on this machine (only its
//!   `timing` module runs kernels) and fitting them;
//! - [`driver`]: the run on the shared run driver, on top of all of it;
//! - [`predict`]: scoring examples with a trained model file, beside the driver.

pub mod calibrate;
pub mod dense;
pub mod driver;
pub mod io;
pub mod planner;
pub mod predict;
pub mod sharding;
pub mod tables;
pub mod train;
