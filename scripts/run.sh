#!/usr/bin/env bash
# Build torusrec and run the main job on the bundled cnr-2000 data.
#
#   scripts/run.sh               # 2 ranks, outputs in ./out
#   NP=4 OUT=/tmp/o scripts/run.sh
#
# TODO(iALS issue): this currently prepares the WebGraph variants (K = 1, 10, 50) and
# inspects them. When iALS training lands, this script turns into the training run
# (prepare once, then `torusrec train ...` on the prepared files).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

NP="${NP:-2}"
OUT="${OUT:-out}"
DATA="tests/data/cnr-2000/cnr-2000"

bash scripts/install_deps.sh
# install_deps.sh may have sourced ~/.cargo/env for itself; do the same here.
if ! command -v cargo >/dev/null 2>&1 && [[ -f "${CARGO_HOME:-$HOME/.cargo}/env" ]]; then
    # shellcheck disable=SC1091
    . "${CARGO_HOME:-$HOME/.cargo}/env"
fi

# --- MPI launch settings: the one place they are defined -------------------------------
if [[ $(id -u) -eq 0 ]]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
export OPENBLAS_NUM_THREADS=1   # one BLAS thread per rank: ranks and rayon own the cores
MPIRUN=(mpirun --oversubscribe --bind-to none -x OPENBLAS_NUM_THREADS -np "$NP")
# ---------------------------------------------------------------------------------------

cargo build --release
BIN=target/release/torusrec
mkdir -p "$OUT"

for K in 1 10 50; do
    out_file="$OUT/cnr-2000-k$K.h5"
    echo "== prepare cnr-2000 K=$K on $NP ranks -> $out_file"
    "${MPIRUN[@]}" "$BIN" prepare --input "$DATA" --format bv --min-links "$K" \
        --seed 42 --out "$out_file" --force
    echo "== inspect $out_file"
    "$BIN" inspect "$out_file"
done
