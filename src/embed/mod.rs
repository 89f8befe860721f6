//! The sharded embedding model: tables placed by table, row or column across ranks,
//! looked up through one deduplicated all-to-all per step, and an MLP trained
//! data-parallel with gradient accumulation.

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

/// The old paths of the click-data modules (now [`crate::clicks`]) and of the model
/// spec (now [`crate::spec`]), kept only for `tests/it/data/clicks_ingest.rs`, which
/// this change does not edit. Remove once it imports the new paths.
#[doc(hidden)]
pub use crate::clicks::{criteo, criteo_gen, ingest, log_file as clicklog, textlog};
#[doc(hidden)]
pub use crate::spec;
/// See above: the old home of [`crate::clicks::batch::Batch`].
#[doc(hidden)]
pub mod clicks {
    pub use crate::clicks::batch::Batch;
}
