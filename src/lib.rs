//! torusrec: ALX-style distributed iALS and sharded embedding training over an MPI
//! torus. Algorithms are generic over [`comm::Comm`]; only `comm::mpi_backend` and the
//! binary touch MPI.

// Link the system OpenBLAS that ndarray's `blas` feature and ndarray-linalg call.
extern crate openblas_src as _;

pub mod allocs;
pub mod als;
pub mod app;
pub mod bf16;
pub mod ckpt;
pub mod cli;
pub mod comm;
pub mod data;
pub mod embed;
pub mod error;
pub mod faults;
pub mod h5;
pub mod hugepages;
pub mod metrics;
pub mod outfile;
pub mod panic_guard;
pub mod project;
pub mod rng;

pub use error::{Error, Result};

extern "C" {
    fn openblas_set_num_threads(n: std::os::raw::c_int);
}

/// Keep OpenBLAS single-threaded: parallelism comes from rayon and from ranks, and
/// one BLAS thread keeps results independent of the machine's core count.
pub fn blas_single_thread() {
    // SAFETY: a plain setter in the OpenBLAS that this crate links.
    unsafe { openblas_set_num_threads(1) }
}
