# Sourced by the run, benchmark and job scripts: BLAS settings for torusrec's ranks.
#
# One BLAS thread per rank: the ranks (and rayon inside them) own the cores.
# OPENBLAS_CORETYPE, when the environment sets it, chooses OpenBLAS's kernels (e.g.
# Haswell = AVX2 only); unset, OpenBLAS picks them for the CPU it detects. Whatever
# it is, every rank gets the same. (It reaches iALS's products and solves; the
# embedding MLP runs on torusrec's own kernel on an AVX-512 CPU: `embed --dense-gemm`.)
export OPENBLAS_NUM_THREADS=1
# `mpirun "${BLAS_MPI_ENV[@]}" ...` passes them to every rank.
BLAS_MPI_ENV=(-x OPENBLAS_NUM_THREADS)
if [[ -n "${OPENBLAS_CORETYPE:-}" ]]; then BLAS_MPI_ENV+=(-x OPENBLAS_CORETYPE); fi
