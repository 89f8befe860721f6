#!/usr/bin/env bash
# Torus collectives benchmark (issue 9): neighbour-exchange collectives (`--collectives
# torus`) against MPI's own (`mpi`) on simulated tori of 4 and 8 ranks on this machine.
#   1. `torusrec selftest --bench`: all-reduce (f32) and a uniform all-to-all-v of 64 kB
#      to 64 MB per rank, mean of $REPS calls, the slowest rank's, at 2x2, 2x4, 2x2x2;
#   2. the ALS epoch on cnr-2000 K=1 (d=$DIM, $EPOCHS epochs) at 2x2 with both, and the
#      end-of-run link summary (busiest link, mean, all-to-all hops).
# Everything here is measured; nothing is projected. Writes bench/torus.md.
#   REPS=5 DIM=64 EPOCHS=3 OUT=out/bench-torus
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
REPS="${REPS:-5}"
DIM="${DIM:-64}"
EPOCHS="${EPOCHS:-3}"
OUT="${OUT:-out/bench-torus}"
mkdir -p "$OUT" bench
if [[ $(id -u) -eq 0 ]]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
export OPENBLAS_NUM_THREADS=1
cargo build --release --quiet
BIN=target/release/torusrec
MPI=(timeout 1800 mpirun --oversubscribe --bind-to none -x OPENBLAS_NUM_THREADS)
CNR=out/bench/cnr-k1.h5
if [[ ! -f $CNR ]]; then
  mkdir -p out/bench
  "$BIN" prepare --input ../shared/data/cnr-2000/cnr-2000 --format bv --min-links 1 --out "$CNR"
fi

table=bench/torus.md
{
  echo "# Torus collectives"
  echo
  echo "Measured $(date -u +%Y-%m-%d) at commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src || echo ' (with uncommitted changes)') on $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)); every rank is a process on this one machine (oversubscribed beyond 2 ranks), so a \"link\" is shared memory and these times say how the algorithms compare here, not what a TPU pod's links would do. \`torus\`: neighbour exchanges only (bidirectional ring all-reduce per dimension, ring all-gather, dimension-ordered all-to-all-v); \`mpi\`: Open MPI's own. Nothing in this file is projected."
  echo
} > "$table"

printf 'shape\top\tcollectives\tmb_per_rank\tms_per_call\n' > bench/torus.tsv
for shape in 2x2 2x4 2x2x2; do
  np=$(( ${shape//x/*} ))
  {
    echo "## Collectives at $shape ($np ranks), mean of $REPS calls (slowest rank)"
    echo
  } >> "$table"
  "${MPI[@]}" -np "$np" "$BIN" --torus "$shape" selftest --bench --reps "$REPS" \
      > "$OUT/coll-$shape.log" 2>&1 || { tail -20 "$OUT/coll-$shape.log"; exit 1; }
  grep '^|' "$OUT/coll-$shape.log" >> "$table"
  echo >> "$table"
  # Chart data: rows "| op | size | mode | ms | GB/s |" with sizes like 65.5 kB / 1.0 MB.
  grep '^| all-' "$OUT/coll-$shape.log" | awk -F'|' -v s="$shape" '{
      gsub(/^ +| +$/, "", $2); gsub(/^ +| +$/, "", $3); gsub(/^ +| +$/, "", $4); gsub(/ /, "", $5)
      split($3, v, " "); mb = v[1]; if (v[2] == "kB") mb = v[1] / 1000; if (v[2] == "GB") mb = v[1] * 1000
      printf "%s\t%s\t%s\t%s\t%s\n", s, $2, tolower($4), mb, $5 }' >> bench/torus.tsv
done

{
  echo "## ALS on cnr-2000 K=1 at 2x2 (d=$DIM, $EPOCHS epochs, 1 thread per rank)"
  echo
  echo "| collectives | s/epoch (epochs 2..N) | R@20 | link summary (exchange phase) |"
  echo "|---|---|---|---|"
} >> "$table"
for c in mpi torus; do
  log="$OUT/als-$c.log"
  rm -f "$OUT/als-$c.jsonl"
  "${MPI[@]}" -np 4 "$BIN" --torus 2x2 --collectives "$c" als --data "$CNR" --dim "$DIM" \
      --epochs "$EPOCHS" --threads 1 --reg 1e-4 --unobserved-weight 3e-3 \
      --metrics "$OUT/als-$c.jsonl" > "$log" 2>&1 || { tail -20 "$log"; exit 1; }
  secs=$(python3 - "$OUT/als-$c.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
ep = [r for r in rows if not r.get("final") and "epoch" in r]
xs = [r["seconds"] for r in ep[1:]] or [r["seconds"] for r in ep]
print(f"{sum(xs) / len(xs):.3f}")
PY
)
  r20=$(grep -o 'final: Recall@20 [0-9.]*' "$log" | grep -o '[0-9.]*$')
  links=$(grep -o 'links exchange: .*' "$log" | head -1 | sed 's/links exchange: //')
  echo "| $c | $secs | $r20 | $links |" >> "$table"
done
echo >> "$table"
charts=()
for op in all-reduce all-to-all-v; do
  for shape in 2x2 2x4 2x2x2; do
    out="bench/torus-$op-$shape.svg"
    if "$BIN" plot --force --table bench/torus.tsv --where "shape=$shape" --where "op=$op" \
        --x mb_per_rank --y ms_per_call --series collectives --log-y \
        --title "$op at $shape: ms per call against MB per rank" --out "$out" >&2; then
      charts+=("$out")
    fi
  done
done
if ((${#charts[@]} > 0)); then
  { echo "## Charts"; echo; for c in "${charts[@]}"; do echo "![${c#bench/}](${c#bench/})"; echo; done
    echo "The charts' data: bench/torus.tsv."; echo; } >> "$table"
fi
cat "$table"
