# Sourced by the test and benchmark scripts: `cpu_line` prints the CPU as a log or a
# results table must name it. The kernels dispatch on AVX-512 and AVX2, OpenBLAS on its
# core type, and one model name ("AMD EPYC") covers generations with and without AVX-512.
cpu_field() { grep -m1 -E "^$1[[:space:]]*:" /proc/cpuinfo | cut -d: -f2 | xargs; }
cpu_line() {
    echo "$(cpu_field 'model name'), family $(cpu_field 'cpu family') model $(cpu_field model);" \
        "AVX-512 $(grep -qw avx512f /proc/cpuinfo && echo yes || echo no)," \
        "AVX2 $(grep -qw avx2 /proc/cpuinfo && echo yes || echo no);" \
        "OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-(unset)}"
}
