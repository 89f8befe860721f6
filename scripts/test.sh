#!/usr/bin/env bash
# Format check, clippy, and the full test suite (unit, thread-communicator and
# end-to-end mpirun tests). Extra arguments go to `cargo test`, e.g. one feature's
# integration tests (tests/it, a module per feature), or the tests that plant faults
# through the environment (tests/faults, a binary of their own):
#   scripts/test.sh --test it cli::
#   scripts/test.sh --test faults
#   scripts/test.sh -- --nocapture
# Budget: well under 30 minutes on 2 cores, including the release build.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/install_deps.sh
if ! command -v cargo >/dev/null 2>&1 && [[ -f "${CARGO_HOME:-$HOME/.cargo}/env" ]]; then
    # shellcheck disable=SC1091
    . "${CARGO_HOME:-$HOME/.cargo}/env"
fi

# Same MPI environment as scripts/run.sh (the integration tests launch mpirun themselves).
# shellcheck source=scripts/mpi_env.sh
. scripts/mpi_env.sh
export OPENBLAS_NUM_THREADS=1
export RUST_BACKTRACE="${RUST_BACKTRACE:-1}"

# What a log must say to be read against another machine's: the CPU, its vector
# extensions (the kernels dispatch on AVX-512 and AVX2) and the OpenBLAS kernels
# asked for (OpenBLAS itself picks by CPU model: Haswell, SkylakeX, Zen, ...).
# shellcheck source=scripts/cpu_line.sh
. scripts/cpu_line.sh
echo "== $(cpu_line), $(nproc) cores"

# rustfmt and clippy are rustup components; add them if missing (needs rustup's network).
if { ! cargo fmt --version >/dev/null 2>&1 || ! cargo clippy --version >/dev/null 2>&1; } \
    && command -v rustup >/dev/null 2>&1; then
    rustup component add rustfmt clippy \
        || echo "test.sh: WARNING: could not add rustfmt/clippy components" >&2
fi

if cargo fmt --version >/dev/null 2>&1; then
    echo "== cargo fmt --check"
    cargo fmt --check
else
    echo "test.sh: WARNING: rustfmt not installed; skipping format check" >&2
fi

if cargo clippy --version >/dev/null 2>&1; then
    echo "== cargo clippy"
    cargo clippy --all-targets --features testing -- -D warnings
else
    echo "test.sh: WARNING: clippy not installed; skipping lints" >&2
fi

# Backstop so a hang fails well inside CI's limit (each mpirun test has its own timeout).
echo "== cargo test --release --features testing $*"
timeout --kill-after=30 "${TORUSREC_TEST_TIMEOUT:-1500}" \
    cargo test --release --features testing "$@"

# The job scripts against a real Slurm (installs slurm-wlm and munge if missing): on one
# node, submit, preempt with USR1, requeue, resume to the uninterrupted result; on two
# namespace hosts (scripts/slurm-cluster.sh), a 2-node job equals the 1-node bits and a
# lost node is excluded, the job requeued and resumed exactly (docs/cluster.md).
# It uses the binary `cargo test` just built (the integration tests run it too), rather
# than building again without the `testing` feature.
echo "== scripts/test_slurm.sh"
TORUSREC="$PWD/target/release/torusrec" timeout --kill-after=30 900 bash scripts/test_slurm.sh
