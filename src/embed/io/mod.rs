//! The embedding model on disk: the trained model's file ([`model_file`]), checkpoints
//! ([`checkpoint`]) and their incremental form ([`delta`]), hash tables by key in both
//! ([`hashio`]), and the configuration hash both record ([`config_hash`]). Imports
//! point down: checkpoint, delta, model_file, hashio, rowcodec (how deltas store rows), config_hash.

pub mod checkpoint;
pub mod config_hash;
pub mod delta;
pub mod hashio;
pub mod model_file;
pub mod rowcodec;
