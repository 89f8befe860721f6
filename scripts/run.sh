#!/usr/bin/env bash
# Build torusrec and run the main job on the bundled cnr-2000 data.
#
#   scripts/run.sh               # 2 ranks, outputs in ./out
#   NP=4 OUT=/tmp/o scripts/run.sh
#
# Prepares the WebGraph variants (K = 1, 10, 50) of the bundled graph, then trains
# iALS on K = 10 with 4 ranks and prints Recall@20/50 (TRAIN_NP changes the ranks).
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
# shellcheck source=scripts/mpi_env.sh
. scripts/mpi_env.sh    # Open MPI as root; PMIx without munge's retries
# shellcheck source=scripts/blas_env.sh
. scripts/blas_env.sh   # one BLAS thread per rank, the same OpenBLAS kernels on every rank
MPIRUN=(mpirun --oversubscribe --bind-to none "${BLAS_MPI_ENV[@]}" -np "$NP")
# ---------------------------------------------------------------------------------------

cargo build --release
BIN=target/release/torusrec
mkdir -p "$OUT"

for K in 1 10 50; do
    out_file="$OUT/cnr-2000-k$K.h5"
    echo "== prepare cnr-2000 K=$K on $NP ranks -> $out_file"
    "${MPIRUN[@]}" "$BIN" prepare --input "$DATA" --format bv --min-links "$K" \
        --seed 42 --out "$out_file" --force
done
"$BIN" inspect "$OUT/cnr-2000-k10.h5"

# The main job: ALX-style iALS on the K = 10 variant with TRAIN_NP ranks (default 4),
# d = 128, 16 epochs of 3-step CG, Recall@20/50 every 4 epochs and at the end, over a
# fixed sample of 10,000 test rows (all 2,146 here; `auto` would pick by speed).
TRAIN_NP="${TRAIN_NP:-4}"
# Checkpoints per build: a rerun of an interrupted job resumes it, while a rerun after
# an upgrade (whose numerics may differ: a checkpoint of another configuration is a
# training hold, exit 76) starts fresh instead of stopping on the old run's files.
REV="$(git rev-parse --short HEAD 2>/dev/null || echo local)"
CKPT="$OUT/ckpt-cnr-2000-k10-$REV"
echo "== train iALS on cnr-2000 K=10 with $TRAIN_NP ranks (checkpoints in $CKPT)"
mpirun --oversubscribe --bind-to none "${BLAS_MPI_ENV[@]}" -np "$TRAIN_NP" \
    "$BIN" als --data "$OUT/cnr-2000-k10.h5" --dim 128 --epochs 16 --reg 0.01 \
    --unobserved-weight 0.001 --eval-every 4 --eval-rows 10000 --threads 1 \
    --checkpoint-dir "$CKPT" --resume auto \
    --out "$OUT/cnr-2000-k10-model.h5" --force --metrics "$OUT/cnr-2000-k10.jsonl"

# The embedding model: the TorchRec peer's table shapes at a size that trains in
# seconds (preset small: 8 tables, width 16), placed by the planner, on TRAIN_NP ranks.
echo "== train the sharded embedding model (preset small) with $TRAIN_NP ranks"
mpirun --oversubscribe --bind-to none "${BLAS_MPI_ENV[@]}" -np "$TRAIN_NP" \
    "$BIN" embed --preset small --batch 1024 --accumulate 2 --steps 100 --log-every 20 \
    --plan auto --threads 1 --table-lr 0.05 --dense-lr 0.005 \
    --metrics "$OUT/embed-small.jsonl"
