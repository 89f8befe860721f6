#!/usr/bin/env bash
# Benchmark of the iALS evaluation's scoring kernel (issue 31, part 3): every row
# against a shard of H, best 50 per row, at ROWS x COLS x DIM with THREADS rayon
# threads, f32 and bf16 tables, for each kernel: OpenBLAS's sgemm with a scan of the
# scores (the fallback off AVX-512), and torusrec's fused AVX-512 product and top-K scan
# with rounded products and sums or with fused multiply-adds (on an AVX-512 CPU the
# evaluation uses the one whose arithmetic matches OpenBLAS's kernels for the process,
# so recall keeps its bits: FMA for Haswell/SkylakeX/Zen kernels, rounded for older
# ones such as Prescott). GFLOP/s counts 2 * DIM flops per score, best of REPS runs.
# Writes bench/eval.md (and prints it).
#
#   scripts/bench_eval.sh                          # 2,000 rows x 1M columns, d = 128
#   ROWS=500 COLS=200000 scripts/bench_eval.sh     # quicker
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROWS="${ROWS:-2000}"
COLS="${COLS:-1000000}"
DIM="${DIM:-128}"
THREADS="${THREADS:-$(nproc)}"
REPS="${REPS:-2}"
mkdir -p bench
export OPENBLAS_NUM_THREADS=1
cargo build --release --quiet --example eval_score_bench
BIN=target/release/examples/eval_score_bench

tsv=bench/eval.tsv
timeout 3600 "$BIN" "$ROWS" "$COLS" "$DIM" "$THREADS" "$REPS" > "$tsv"
corename=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)
flags=$(grep -m1 -o -w -E 'avx512f|avx2' /proc/cpuinfo | sort -u | xargs)
table=bench/eval.md
{
  echo "# iALS evaluation: scoring rate"
  echo
  echo "Measured at $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src examples || echo ' (with uncommitted changes)') on $(date -u +%Y-%m-%d) ($(nproc) cores, $corename, $flags) with \`$0\`: $ROWS rows x $COLS columns, d = $DIM, $THREADS thread(s), top 50 per row, best of $REPS."
  echo
  echo "| kernel | table | seconds | GFLOP/s | GFLOP/s per thread |"
  echo "|---|---|---|---|---|"
  tail -n +2 "$tsv" | awk -F'\t' '{printf "| %s | %s | %s | %s | %.1f |\n", $1, $2, $7, $8, $8 / $6}'
  echo
  echo "OpenBLAS's kernels here: $(OPENBLAS_VERBOSE=2 "$BIN" 1 1 1 1 1 2>&1 | sed -n 's/^Core: //p' | head -1) ($([[ -n ${OPENBLAS_CORETYPE:-} ]] && echo "OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE" || echo "OpenBLAS's own choice")); the evaluation's scorer: $("$BIN" 1 1 1 1 1 2>&1 >/dev/null | sed -n 's/^default kernel: //p')."
  echo "torusrec-avx512 rounds each product and each sum (the reference's arithmetic,"
  echo "and OpenBLAS's SSE3 kernels'); torusrec-avx512-fma uses fused multiply-adds"
  echo "(OpenBLAS's FMA kernels' arithmetic), twice the arithmetic per instruction."
} > "$table"
cat "$table"
