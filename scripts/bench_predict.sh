#!/usr/bin/env bash
# `torusrec predict` (issue 17): writes bench/predict.md.
#   For each arch (mlp, dlrm, dcnv2) a model of the TorchRec peer's tables (preset
#   torchrec-peer at PRED_SCALE) trained STEPS steps on a generated click log of
#   EXAMPLES examples, then `predict` over the whole log at 1 and 2 ranks: examples/s
#   per rank (the slowest rank's scoring seconds), whether the two files are equal, and
#   scripts/score.py's largest |difference| from predict's probabilities.
# score.py needs a Python with numpy and h5py (PYTHON, default python3, then
# /work/peer-venv/bin/python); without one its column says so.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT="${OUT:-out/bench-predict}"
PRED_SCALE="${PRED_SCALE:-0.05}"
EXAMPLES="${EXAMPLES:-200000}"
STEPS="${STEPS:-20}"
ARCHS="${ARCHS:-mlp dlrm dcnv2}"
mkdir -p "$OUT" bench
if [[ $(id -u) -eq 0 ]]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
# shellcheck source=scripts/blas_env.sh
. scripts/blas_env.sh
# BIN: a torusrec already built (skips the build).
if [[ -z ${BIN:-} ]]; then
    cargo build --release --quiet
    BIN="${CARGO_TARGET_DIR:-target}/release/torusrec"
fi
MPI=(mpirun --oversubscribe --bind-to none "${BLAS_MPI_ENV[@]}")
PY=""
for p in "${PYTHON:-python3}" /work/peer-venv/bin/python; do
    if "$p" -c 'import numpy, h5py' 2>/dev/null; then PY="$p"; break; fi
done
LOG="$OUT/log.h5"
"$BIN" generate clicks --preset torchrec-peer --scale "$PRED_SCALE" --examples "$EXAMPLES" \
    --out "$LOG" --force >/dev/null
rate() { sed -n 's/.*; \([0-9]*\) examples\/s per rank.*/\1/p' "$1"; }
{
    echo "# \`torusrec predict\`: throughput and scripts/score.py's agreement"
    echo
    echo "$(date -u +%F), $(nproc) cores, machine shared with other jobs (nice -n 19): expect noise."
    echo "Preset torchrec-peer at scale $PRED_SCALE, $EXAMPLES generated examples, models trained $STEPS steps."
    echo "Command: \`nice -n 19 scripts/bench_predict.sh\` (PRED_SCALE=$PRED_SCALE EXAMPLES=$EXAMPLES STEPS=$STEPS)."
    echo
    echo "| arch | examples/s per rank, 1 rank | examples/s per rank, 2 ranks | 1 = 2 ranks | score.py max abs diff |"
    echo "|---|---|---|---|---|"
} >"$OUT/predict.md"
for arch in $ARCHS; do
    extra=()
    [[ $arch == mlp ]] || extra=(--arch "$arch")
    M="$OUT/$arch.h5"
    "${MPI[@]}" -np 2 "$BIN" embed --data "$LOG" --global-batch 2048 --steps "$STEPS" \
        --eval-examples 8192 --threads 1 "${extra[@]}" --out "$M" --force >/dev/null 2>&1
    "$BIN" predict --model "$M" --data "$LOG" --out "$OUT/$arch-1.tsv" --force --threads 1 \
        >"$OUT/$arch-1.txt" 2>/dev/null
    "${MPI[@]}" -np 2 "$BIN" predict --model "$M" --data "$LOG" --out "$OUT/$arch-2.tsv" \
        --force --threads 1 >"$OUT/$arch-2.txt" 2>/dev/null
    same=no
    cmp -s "$OUT/$arch-1.tsv" "$OUT/$arch-2.tsv" && same=yes
    agree="no Python with numpy and h5py"
    if [[ -n $PY ]]; then
        agree=$("$PY" scripts/score.py --model "$M" --data "$LOG" --compare "$OUT/$arch-1.tsv" \
            | sed -n 's/.*max |difference| \([^ ]*\).*/\1/p')
    fi
    echo "| $arch | $(rate "$OUT/$arch-1.txt") | $(rate "$OUT/$arch-2.txt") | $same | $agree |" >>"$OUT/predict.md"
done
cp "$OUT/predict.md" bench/predict.md
cat bench/predict.md
