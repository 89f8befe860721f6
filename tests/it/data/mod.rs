//! Preparing datasets: the streaming prepare, click-log ingestion, outputs kept apart
//! from inputs, and bad inputs
//! (a table of cases and mutation fuzzing).

mod bad_inputs;
mod bad_inputs_fuzz;
mod clicks_columns;
mod clicks_ingest;
mod clicks_outputs;
pub(crate) mod clicks_weights;
mod graph_stats;
mod planted;
mod prepare_stream;
mod useritem;
mod webgraph_twin;
