#!/usr/bin/env bash
# Checkpoint benchmark (issue 3): write and restore time and MB/s of iALS checkpoints
# (d = 128) on cnr-2000 (K = 1) and on a synthetic in-dense graph at SCALE (default
# 0.2), and the time from a signal to exit 75 at P = 4; then (issue 19) the embedding
# model's full vs incremental checkpoints on torchrec-peer (EMBED_SCALE, default 1.0;
# EMBED_STEPS, default 150; a checkpoint every 50 steps at P = 2): MB and seconds per
# checkpoint and restore seconds, and the AUC of the model a restore gives (lossy deltas);
# EMBED_MODES (full delta bf16 int8 hash; hash: --vocab hash) picks the runs. Writes
# bench/ckpt.md. PART=embed runs only the embedding part and replaces its section of
# bench/ckpt.md; SKIP_BUILD=1 uses the binary as built.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
SCALE="${SCALE:-0.2}"
OUT="${OUT:-out/bench-ckpt}"
mkdir -p "$OUT" bench
if [[ $(id -u) -eq 0 ]]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
export OPENBLAS_NUM_THREADS=1
[[ -n ${SKIP_BUILD:-} ]] || cargo build --release --quiet
BIN=${CARGO_TARGET_DIR:-target}/release/torusrec
MPI=(mpirun --oversubscribe --bind-to none -x OPENBLAS_NUM_THREADS)
PART="${PART:-all}"
table=bench/ckpt.md
EMBED_SECTION="## Embedding model: full vs incremental checkpoints (torchrec-peer)"

if [[ $PART != embed ]]; then

[[ -f $OUT/cnr-k1.h5 ]] || "$BIN" prepare --input tests/data/cnr-2000/cnr-2000 --format bv \
    --min-links 1 --seed 42 --out "$OUT/cnr-k1.h5"
[[ -f $OUT/in-dense.h5 ]] || "${MPI[@]}" -np 2 "$BIN" generate webgraph --model independent --preset in-dense \
    --scale "$SCALE" --seed 42 --out "$OUT/in-dense.h5"

tsv=bench/ckpt.tsv
printf 'case\toperation\tseconds\n' > "$tsv"
{
  echo "# iALS checkpoints: write, restore and signal-to-exit"
  echo
  echo "Measured at $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src || echo ' (with uncommitted changes)') on $(date -u +%Y-%m-%d) ($(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(free -g | awk '/Mem:/{print $2}') GiB) with \`$0\`."
  echo
  echo "| dataset | P | file MB | write s | write MB/s | restore (read + verify) s | restore MB/s | signal -> checkpoint committed s | signal -> mpirun exit 75 s |"
  echo "|---|---|---|---|---|---|---|---|---|"
} > "$table"

for ds in cnr-k1 in-dense; do
  for np in 1 4; do
    dir="$OUT/ck-$ds-$np"; rm -rf "$dir"; log="$OUT/$ds-$np.log"
    # Preempted by a real SIGUSR1 to mpirun once the first checkpoint exists.
    "${MPI[@]}" -np "$np" "$BIN" als --data "$OUT/$ds.h5" --dim 128 --epochs 50 --threads 1 \
        --checkpoint-dir "$dir" --checkpoint-every 1 --step-nnz 200000 > "$log" 2>&1 &
    pid=$!
    for _ in $(seq 600); do compgen -G "$dir/ckpt-*.h5" > /dev/null && break; sleep 0.2; done
    sleep 1
    t_sig=$(date +%s.%N)
    kill -USR1 "$pid"
    code=0; wait "$pid" || code=$?
    t_exit=$(date +%s.%N)
    [[ $code -eq 75 ]] || { echo "expected exit 75, got $code (see $log)"; exit 1; }
    w=$(grep -o 'checkpoint .*: [0-9.]* MB in [0-9.]* s, [0-9]* MB/s' "$log" | head -1)
    since=$(grep -o 'written at .* [0-9.]* s after the signal' "$log" | grep -o '[0-9.]* s after' | grep -o '^[0-9.]*')
    # Restore: resume at the same P and stop right away at the next step.
    "${MPI[@]}" -np "$np" "$BIN" als --data "$OUT/$ds.h5" \
        --dim 128 --epochs 50 --threads 1 --checkpoint-dir "$dir" --checkpoint-every 1000 \
        --step-nnz 200000 --resume auto > "$log.resume" 2>&1 &
    rpid=$!
    for _ in $(seq 600); do grep -q "resumed from" "$log.resume" && break; sleep 0.2; done
    kill -USR1 "$rpid" 2>/dev/null || true; wait "$rpid" || true
    r=$(grep -o 'read and verified [0-9.]* MB in [0-9.]* s, [0-9]* MB/s' "$log.resume" | head -1)
    mb=$(echo "$w" | grep -o '[0-9.]* MB in' | grep -o '^[0-9.]*')
    ws=$(echo "$w" | grep -o 'in [0-9.]* s' | grep -o '[0-9.]*')
    wr=$(echo "$w" | grep -o '[0-9]* MB/s' | grep -o '^[0-9]*')
    rs=$(echo "$r" | grep -o 'in [0-9.]* s' | grep -o '[0-9.]*')
    rr=$(echo "$r" | grep -o '[0-9]* MB/s' | grep -o '^[0-9]*')
    total=$(awk -v a="$t_sig" -v b="$t_exit" 'BEGIN{printf "%.2f", b-a}')
    echo "| $ds | $np | $mb | $ws | $wr | $rs | $rr | $since | $total |" >> "$table"
    printf '%s P=%s\twrite\t%s\n%s P=%s\trestore\t%s\n%s P=%s\tsignal to exit 75\t%s\n' \
      "$ds" "$np" "$ws" "$ds" "$np" "$rs" "$ds" "$np" "$total" >> "$tsv"
  done
done
# A chart next to the table: seconds of each operation per dataset and P.
if "$BIN" plot --force --table "$tsv" --x case --y seconds --series operation --kind bar \
    --title "Checkpoint write, restore and signal-to-exit (s)" --out bench/ckpt.svg >&2; then
  { echo; echo "![ckpt.svg](ckpt.svg)"; echo; echo "The chart's data: bench/ckpt.tsv."; } >> "$table"
fi
fi

# --- The embedding model: full vs incremental checkpoints (issue 19) ---------------
. scripts/cpu_line.sh
ESCALE="${EMBED_SCALE:-1.0}"
ESTEPS="${EMBED_STEPS:-150}"
EVERY=50
# The section is rebuilt: the part of the file before it is kept.
if [[ -f $table ]]; then
  awk -v h="$EMBED_SECTION" '$0 == h {exit} {print}' "$table" > "$OUT/ckpt-head.md"
else
  : > "$OUT/ckpt-head.md"
fi
sec="$OUT/ckpt-embed.md"
{
  echo "$EMBED_SECTION"
  echo
  echo "Measured at $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src || echo ' (with uncommitted changes)') on $(date -u +%Y-%m-%d), $(nproc) cores, $(cpu_line), with \`PART=embed $0\`:"
  echo "\`embed --preset torchrec-peer --scale $ESCALE\` (batch 2048 per rank, row-wise Adagrad) at P = 2 x 1 thread,"
  echo "$ESTEPS steps, \`--checkpoint-every $EVERY\`; full: \`--checkpoint-full-every 1\` (the default), delta: \`--checkpoint-full-every 3\`"
  echo "(full, delta, delta, ...); bf16 and int8: the same with \`--ckpt-delta-dtype bf16|int8\` (lossy rows); hash: deltas of \`--vocab hash --capacity 1.1x\` tables."
  echo "MB is the file's size (rank 0's log line), seconds its write (commit included)."
  echo "Restore: \`--resume\` of the last checkpoint (a delta: its chain of full + deltas), read + verify, at P = 2."
  echo
  echo "| run | step | kind | changed rows | MB | write s | MB/s |"
  echo "|---|---|---|---|---|---|---|"
} > "$sec"
declare -A restore auc_run auc_resumed
MODES="${EMBED_MODES:-full delta bf16 int8 hash}"
for mode in $MODES; do
  dir="$OUT/ck-embed-$mode"; rm -rf "$dir"; log="$OUT/embed-$mode.log"
  model=()
  case $mode in
    full) extra=() ;;
    delta) extra=(--checkpoint-full-every 3) ;;
    bf16) extra=(--checkpoint-full-every 3 --ckpt-delta-dtype bf16) ;;
    int8) extra=(--checkpoint-full-every 3 --ckpt-delta-dtype int8) ;;
    # Hash tables of 1.1x each id space (nothing evicted), exact deltas.
    hash) model=(--vocab hash --capacity 1.1x); extra=(--checkpoint-full-every 3) ;;
  esac
  timeout 900 "${MPI[@]}" -np 2 "$BIN" embed --preset torchrec-peer --scale "$ESCALE" \
      --steps "$ESTEPS" --log-every "$EVERY" --eval-examples 4096 --threads 1 "${model[@]}" \
      --checkpoint-dir "$dir" --checkpoint-every "$EVERY" --keep 10 "${extra[@]}" > "$log" 2>&1
  grep -o 'checkpoint [^ ]*ckpt-[0-9]*\.h5 (.*): [0-9.]* MB in [0-9.]* s, [0-9]* MB/s' "$log" |
  while read -r line; do
    step=$(echo "$line" | grep -o 'ckpt-[0-9]*' | head -1 | grep -o '[0-9]*$' | sed 's/^0*//')
    if echo "$line" | grep -q ', delta '; then
      kind=delta; rows=$(echo "$line" | grep -o '[0-9]* changed rows' | grep -o '^[0-9]*')
    else
      kind=full; rows="all"
    fi
    mb=$(echo "$line" | grep -o '[0-9.]* MB in' | grep -o '^[0-9.]*')
    s=$(echo "$line" | grep -o 'in [0-9.]* s' | grep -o '[0-9.]*')
    r=$(echo "$line" | grep -o '[0-9]* MB/s' | grep -o '^[0-9]*')
    echo "| $mode | $step | $kind | $rows | $mb | $s | $r |" >> "$sec"
  done
  last=$(ls "$dir"/ckpt-*.h5 | tail -1)
  timeout 900 "${MPI[@]}" -np 2 "$BIN" embed --preset torchrec-peer --scale "$ESCALE" \
      --steps "$ESTEPS" --log-every "$EVERY" --eval-examples 4096 --threads 1 "${model[@]}" \
      --checkpoint-dir "$OUT/ck-embed-restore-$mode" --resume "$last" > "$log.resume" 2>&1 || true
  auc() { grep -o '^final: eval AUC [0-9.]*' "$1" | grep -o '[0-9.]*$' || echo "?"; }
  auc_run[$mode]=$(auc "$log"); auc_resumed[$mode]=$(auc "$log.resume")
  rm -rf "$OUT/ck-embed-restore-$mode"
  restore[$mode]=$(grep -o 'resumed from .* in [0-9.]* s' "$log.resume" | grep -o 'in [0-9.]* s' | grep -o '[0-9.]*' || echo "?")
  grep -q 'lossy' "$log.resume" && restore[$mode]="${restore[$mode]} (warned: lossy, inexact)"
  rm -rf "$dir"
done
{
  echo
  echo "| run | restore of the last checkpoint s | AUC of the run | AUC of the model restored from its last checkpoint |"
  echo "|---|---|---|---|"
  for mode in $MODES; do echo "| $mode | ${restore[$mode]} | ${auc_run[$mode]} | ${auc_resumed[$mode]} |"; done
} >> "$sec"
cat "$OUT/ckpt-head.md" "$sec" > "$table"
cat "$table"
