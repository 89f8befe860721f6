//! Input graphs, the variant filter and split, and the prepared-dataset file.

pub mod dataset;
pub mod graph;
pub mod prepare;
pub mod readers;
pub mod stream;
pub mod webgraph_gen;
