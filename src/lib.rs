//! torusrec: ALX-style distributed iALS and sharded embedding training over an MPI
//! torus. Algorithms are generic over [`comm::Comm`]; only `comm::mpi_backend` and the
//! binary touch MPI.

pub mod app;
pub mod cli;
pub mod comm;
pub mod data;
pub mod error;
pub mod metrics;
pub mod panic_guard;
pub mod rng;

pub use error::{Error, Result};
