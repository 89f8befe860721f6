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

extern "C" {
    fn openblas_set_num_threads(n: std::os::raw::c_int);
    fn openblas_get_corename() -> *const std::os::raw::c_char;
}

/// The name of the kernels OpenBLAS chose for this process (from the CPU, or from
/// `OPENBLAS_CORETYPE`), e.g. `Prescott`, `Haswell`, `SkylakeX`.
pub fn openblas_core() -> String {
    // SAFETY: OpenBLAS returns a static NUL-terminated string (or null).
    let p = unsafe { openblas_get_corename() };
    if p.is_null() {
        return String::new();
    }
    // SAFETY: non-null, NUL-terminated, static.
    unsafe { std::ffi::CStr::from_ptr(p) }
        .to_string_lossy()
        .into_owned()
}

/// Whether OpenBLAS's `sgemm` kernels for this process use fused multiply-adds (the
/// x86 cores from Haswell and Bulldozer on); the kernels of older cores round each
/// product and each sum.
pub fn openblas_sgemm_fma() -> bool {
    static FMA: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *FMA.get_or_init(|| {
        let core = openblas_core().to_ascii_lowercase();
        [
            "haswell",
            "zen",
            "skylakex",
            "cooperlake",
            "sapphirerapids",
            "bulldozer",
            "piledriver",
            "steamroller",
            "excavator",
        ]
        .iter()
        .any(|c| core.starts_with(c))
    })
}

/// Keep OpenBLAS single-threaded: parallelism comes from rayon and from ranks, and
/// one BLAS thread keeps results independent of the machine's core count.
pub fn blas_single_thread() {
    // SAFETY: a plain setter in the OpenBLAS that this crate links.
    unsafe { openblas_set_num_threads(1) }
}
