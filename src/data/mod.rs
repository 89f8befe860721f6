//! The two kinds of input, each in its own room: link graphs for iALS ([`graph`]: the
//! readers, the variant filter and split, the prepared-dataset file, the streaming
//! prepare, the synthetic generators and the graph statistics) and click logs for the
//! embedding model ([`clicks`]). Below both workloads: nothing here imports `als` or
//! `embed`.

pub mod clicks;
pub mod graph;
pub mod useritem;
