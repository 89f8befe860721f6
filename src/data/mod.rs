//! Input graphs, the variant filter and split, and the prepared-dataset file.

pub mod dataset;
pub mod graph;
pub mod graph_stats;
pub mod prepare;
pub mod readers;
pub mod stats_pass;
pub mod stream;
pub mod webgraph_copy;
pub mod webgraph_fit;
pub mod webgraph_gen;
