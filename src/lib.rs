//! torusrec: ALX-style distributed iALS and sharded embedding training over an MPI
//! torus. Algorithms are generic over [`comm::Comm`]; only `comm::mpi_backend` and the
//! binary touch MPI.

// Link the system OpenBLAS that ndarray's `blas` feature and ndarray-linalg call.
extern crate openblas_src as _;

pub mod allocs;
pub mod als;
pub mod app;
pub mod bf16;
pub mod blocks;
pub mod ckpt;
pub mod cli;
pub mod comm;
pub mod cpu;
pub mod data;
pub mod embed;
pub mod error;
pub mod faults;
pub mod hugepages;
pub mod io;
pub mod lsq;
pub mod mem_estimate;
pub mod metrics;
pub mod node;
pub mod panic_guard;
pub mod plot;
pub mod projection;
pub mod rng;
pub mod spec;

pub use error::{Error, Result};
