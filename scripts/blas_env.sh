# Sourced by the run, benchmark and job scripts: BLAS settings for torusrec's ranks.
#
# One BLAS thread per rank: the ranks (and rayon inside them) own the cores.
# Debian 12's OpenBLAS 0.3.21 does not recognise AMD Zen 4/5 and falls back to its
# Haswell (AVX2) kernels; on a CPU with AVX-512 (F, BW, DQ, VL) its SkylakeX kernels
# run sgemm about 1.7x faster. A value already set by the user is kept.
export OPENBLAS_NUM_THREADS=1
if [[ -z "${OPENBLAS_CORETYPE:-}" ]] && grep -qw avx512f /proc/cpuinfo 2>/dev/null \
    && grep -qw avx512bw /proc/cpuinfo && grep -qw avx512dq /proc/cpuinfo \
    && grep -qw avx512vl /proc/cpuinfo; then
    export OPENBLAS_CORETYPE=SkylakeX
fi
# `mpirun "${BLAS_MPI_ENV[@]}" ...` passes them to every rank.
BLAS_MPI_ENV=(-x OPENBLAS_NUM_THREADS)
if [[ -n "${OPENBLAS_CORETYPE:-}" ]]; then BLAS_MPI_ENV+=(-x OPENBLAS_CORETYPE); fi
