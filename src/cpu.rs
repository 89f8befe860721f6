//! What this process's CPU and BLAS can do: AVX-512F for the kernels of our own, the
//! kernels OpenBLAS chose, and one BLAS thread per rank.

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

/// Whether this CPU has AVX-512F, which the dense GEMM's kernel and the iALS scorer's
/// fused kernel need.
pub fn avx512f() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}
