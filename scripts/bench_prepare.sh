#!/usr/bin/env bash
# Benchmark of dataset preparation (issue 1): wall time and peak RSS per rank of
#   - prepare on cnr-2000, K = 1
#   - generate webgraph --model independent --preset in-dense at SCALE (default 1.0: 0.5M nodes, 122M arcs)
# with 1 and 2 ranks. Writes a Markdown table to bench/prepare.md (and prints it).
#
#   scripts/bench_prepare.sh            # full size
#   SCALE=0.1 scripts/bench_prepare.sh  # quicker
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
SCALE="${SCALE:-1.0}"
OUT="${OUT:-out/bench}"
mkdir -p "$OUT" bench
if [[ $(id -u) -eq 0 ]]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
export OPENBLAS_NUM_THREADS=1
cargo build --release --quiet
BIN=target/release/torusrec

table=bench/prepare.md
{
  echo "# prepare and generate: wall time and memory"
  echo
  echo "Measured at $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src || echo ' (with uncommitted changes)') on $(date -u +%Y-%m-%d) ($(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(free -g | awk '/Mem:/{print $2}') GiB) with \`$0\`."
  echo
  echo "| job | ranks | wall s | peak RSS per rank | result |"
  echo "|---|---|---|---|---|"
} > "$table"
tsv=bench/prepare.tsv
printf 'job\tranks\tseconds\n' > "$tsv"

run() { # name np args...
  local name=$1 np=$2; shift 2
  local log="$OUT/$name-np$np.log" t0 t1
  t0=$(date +%s.%N)
  timeout 1800 mpirun --oversubscribe --bind-to none -np "$np" "$BIN" "$@" > "$log" 2>&1
  t1=$(date +%s.%N)
  local rss kept
  rss=$(grep -o 'peak RSS [0-9.]* [kMG]*B' "$log" | tail -1 | sed 's/peak RSS //')
  kept=$(grep -o -- '-> K = .*' "$log" | head -1 | sed 's/-> //')
  local secs
  secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.1f", b-a}')
  printf '| %s | %s | %s | %s | %s |\n' "$name" "$np" "$secs" "$rss" "$kept" >> "$table"
  printf '%s\t%s ranks\t%s\n' "$name" "$np" "$secs" >> "$tsv"
}

for np in 1 2; do
  run "prepare cnr-2000 K=1" "$np" prepare --input tests/data/cnr-2000/cnr-2000 --format bv \
      --min-links 1 --seed 42 --out "$OUT/cnr-k1.h5" --force
done
for np in 1 2; do
  run "generate in-dense scale=$SCALE" "$np" generate webgraph --model independent --preset in-dense --scale "$SCALE" \
      --seed 42 --out "$OUT/in-dense.h5" --force
done
# A chart next to the table: wall seconds per job and rank count.
if "$BIN" plot --force --table "$tsv" --x job --y seconds --series ranks --kind bar \
    --title "prepare and generate: wall seconds" --out bench/prepare.svg >&2; then
  { echo; echo "![prepare.svg](prepare.svg)"; echo; echo "The chart's data: bench/prepare.tsv."; } >> "$table"
fi
cat "$table"
