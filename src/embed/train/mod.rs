//! Training the embedding model: the optimizer step ([`trainer`]), the memory one rank
//! needs ([`footprint`]), and the batch statistics the planner reads ([`batch_stats`]).

pub mod batch_stats;
pub mod footprint;
pub mod schedule;
pub mod trainer;
