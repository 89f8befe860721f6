//! The embedding model on disk: the trained model's file ([`model_file`]), checkpoints
//! ([`checkpoint`]) and hash tables by key in both ([`hashio`]).

pub mod checkpoint;
pub mod hashio;
pub mod model_file;
