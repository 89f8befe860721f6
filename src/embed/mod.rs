//! The sharded embedding model: tables placed by table, row or column across ranks,
//! looked up through one deduplicated all-to-all per step, and an MLP trained
//! data-parallel with gradient accumulation.

pub mod placement;
pub mod spec;
