//! Click logs: the batch type every consumer takes, the samplers, the synthetic
//! generator, the Criteo and text parsers, ingestion into a keyed log, the click-log
//! file and the source a run reads its examples from.
//!
//! Below the embedding model: nothing here imports `embed`; the tables these logs are
//! drawn for are described by [`crate::spec`].

pub mod batch;
pub mod columns;
pub mod criteo;
pub mod criteo_gen;
pub mod gen;
pub mod hll;
pub mod ingest;
pub mod log_file;
pub mod sample;
pub mod source;
pub mod textlog;
