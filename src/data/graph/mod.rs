//! Link graphs: a rank's rows ([`rows`]), the readers of BV, TSV and MTX inputs
//! ([`readers`]), the variant filter and split of docs/design.md ([`prepare`]) and the
//! prepared-dataset file ([`dataset`]), the streaming prepare that never holds the
//! whole graph ([`stream`]), the synthetic generators (the independent model
//! [`webgraph_gen`], the copying model [`webgraph_copy`] and its fit to a real graph
//! [`webgraph_fit`]) and the structural statistics ([`stats`], computed over ranks by
//! [`stats_pass`]).

pub mod dataset;
pub mod prepare;
pub mod readers;
pub mod rows;
pub mod stats;
pub mod stats_pass;
pub mod stream;
pub mod webgraph_copy;
pub mod webgraph_fit;
pub mod webgraph_gen;
