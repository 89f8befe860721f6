//! The sharded embedding model: tables placed by table, row or column across ranks,
//! looked up through one deduplicated all-to-all per step, and an MLP trained
//! data-parallel with gradient accumulation.

pub mod calibrate;
pub mod checkpoint;
pub mod driver;
pub mod exchange;
pub mod gemm;
pub mod hashio;
pub mod hashtab;
pub mod kernels;
pub mod keys;
pub mod memory;
pub mod metrics;
pub mod mlp;
pub mod model;
pub mod placement;
pub mod planner;
pub mod pooled;
pub mod stats;
pub mod tables;
pub mod train;
