#!/usr/bin/env bash
# Sharded embedding benchmark (issue 5): the TorchRec peer's workload
# (docs/embedding-workload.md; preset torchrec-peer: 26 tables, 4.37M rows,
# width 64, pooling ~15, Zipf(1.05), MLP 1677-512-256-1, batch 2048 per rank).
#   1. examples/s and bytes per step with and without dedup, dedup ratio (P = 2, 4);
#   2. throughput for --accumulate K = 1, 2, 5 at P = 4, and the gain of K = 5 over
#      K = 1 over TCP in a private network namespace, uncapped and capped
#      (NET_RATES, default "none 10gbit 4gbit"; needs root, unshare and tc);
#   3. the pipelining gain (P = 2, 4);
#   4. the planner against the random, size-, dim- and lookup-greedy heuristics on 10
#      sampled table tasks (dlrm-synthetic pool);
#   5. side by side with TorchRec (if PEER_PY points at a python with torchrec; see
#      scripts/install_peer.sh), same machine, same run: REPEATS (default 3) rounds,
#      each ours in every output mode then TorchRec; medians and ranges reported.
# Writes bench/embed.md. STEPS (default 30) timed steps after WARM (default 10).
# Charts next to it (`torusrec plot`, data in bench/embed-*.tsv), for the sections run:
# bench/embed-dedup.svg (bytes per step with and without dedup), bench/embed-peer.svg
# (examples/s against TorchRec), bench/embed-planner.svg (planner imbalance against the
# heuristics), bench/embed-runs.svg (loss and examples/s by step of the peer runs at 2x1).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
STEPS="${STEPS:-30}"
WARM="${WARM:-10}"
OUT="${OUT:-out/bench-embed}"
PEER_PY="${PEER_PY:-/work/peer-venv/bin/python}"
PEER="${PEER:-bench/peers/torchrec_peer.py}"
SECTIONS="${SECTIONS:-dedup accumulate pipeline planner peer}"
REPEATS="${REPEATS:-3}"
[[ $REPEATS =~ ^[1-9][0-9]*$ ]] || { echo "REPEATS=$REPEATS: must be a whole number >= 1" >&2; exit 2; }
mkdir -p "$OUT" bench
if [[ $(id -u) -eq 0 ]]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
export OPENBLAS_NUM_THREADS=1
cargo build --release --quiet
BIN=target/release/torusrec
MPI=(mpirun --oversubscribe --bind-to none -x OPENBLAS_NUM_THREADS)
MPI_PREFIX=()  # a command that runs mpirun in another setting (the transport runs)
# The capped transports of the accumulation section ("none": TCP uncapped).
NET_RATES="${NET_RATES:-none 10gbit 4gbit}"
TOTAL=$((WARM + STEPS))

# run NAME NP THREADS ARGS...: one training run; its metrics in $OUT/NAME.jsonl.
run() {
  local name=$1 np=$2 th=$3; shift 3
  rm -f "$OUT/$name.jsonl"
  "${MPI_PREFIX[@]}" "${MPI[@]}" -np "$np" "$BIN" embed --preset torchrec-peer --batch 2048 --steps "$TOTAL" \
      --log-every "$WARM" --eval-examples 16384 --threads "$th" --seed 1 \
      --preload --metrics "$OUT/$name.jsonl" "$@" > "$OUT/$name.log" 2>&1 \
    || { echo "run $name failed:"; tail -20 "$OUT/$name.log"; exit 1; }
}

# summary NAME: the timed intervals (all after the first) of a run, as table cells.
summary() {
  python3 - "$OUT/$1.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
iv = [r for r in rows if not r.get("final")][1:]
fin = [r for r in rows if r.get("final")][0]
ex = sum(r["examples"] for r in iv); s = sum(r["seconds"] for r in iv); st = sum(r["steps"] for r in iv)
def per_step(k): return sum(r[k] * r["steps"] for r in iv) / st
occ = [r["dedup_ratio"] for r in iv]
print(f'{ex / s:,.0f} | {s / st:.3f} | {per_step("bytes_per_step")/1e6:.1f} | '
      f'{per_step("lookup_bytes_per_step")/1e6:.1f} | {per_step("backward_bytes_per_step")/1e6:.1f} | '
      f'{per_step("allreduce_bytes_per_step")/1e6:.1f} | {sum(occ)/len(occ):.2f} | '
      f'{max(r["owner_imbalance"] for r in iv):.3f} | '
      f'{sum(r["seconds_lookup"] for r in iv)/st:.3f} | {sum(r.get("seconds_pool", 0) for r in iv)/st:.3f} | '
      f'{sum(r["seconds_dense"] for r in iv)/st:.3f} | '
      f'{sum(r["seconds_backward"] for r in iv)/st:.3f} | {sum(r.get("seconds_update", 0) for r in iv)/st:.3f} | '
      f'{sum(r["seconds_allreduce"] for r in iv)/st:.3f} | '
      f'{fin["auc"]:.4f} | {fin["peak_rss_bytes"]/2**20:,.0f} MiB')
PY
}
# numbers NAME: "examples/s<TAB>MB sent per step" of a run's timed intervals (chart data).
numbers() {
  python3 - "$OUT/$1.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
iv = [r for r in rows if not r.get("final")][1:]
st = sum(r["steps"] for r in iv)
print(f'{sum(r["examples"] for r in iv) / sum(r["seconds"] for r in iv):.6g}\t'
      f'{sum(r["bytes_per_step"] * r["steps"] for r in iv) / st / 1e6:.6g}')
PY
}

# rate NAME: examples/s of a run's timed intervals (all after the first).
rate() {
  python3 - "$OUT/$1.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
iv = [r for r in rows if not r.get("final")][1:]
print(round(sum(r["examples"] for r in iv) / sum(r["seconds"] for r in iv)))
PY
}
# median VALUES...: "MEDIAN INDEX MIN MAX" of whole numbers or n/a (ignored; all n/a:
# "n/a 1 n/a n/a"); INDEX (1-based) is the value's position, the lower middle when
# the count is even, so that its run can be shown.
median() {
  python3 - "$@" <<'PY'
import sys
v = [(int(x), i + 1) for i, x in enumerate(sys.argv[1:]) if x != "n/a"]
if not v:
    print("n/a 1 n/a n/a")
else:
    s = sorted(v)
    m = s[(len(s) - 1) // 2]
    print(m[0], m[1], s[0][0], s[-1][0])
PY
}
# cell MEDIAN MIN MAX: "23,301 (22,900-23,500)", or the median alone for one value.
cell() {
  [[ $1 == n/a ]] && { echo n/a; return; }
  if [[ $2 == "$3" ]]; then printf '%d' "$1"; else printf '%d (%d-%d)' "$1" "$2" "$3"; fi
}

# chart OUT.svg PLOT-ARGS...: one chart with `torusrec plot`; a failure is reported, not fatal.
charts=()
chart() {
  local out=$1; shift
  if "$BIN" plot --force --out "$out" "$@" >&2; then charts+=("$out"); else echo "chart $out failed" >&2; fi
}

HEAD="| examples/s | s/step | MB sent/step (all ranks) | lookup MB | backward MB | all-reduce MB | dedup ratio | owner imbalance | lookup s | pool s | dense s | backward s | update s | all-reduce s | eval AUC | peak RSS/rank |"
SEP="|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"

table=bench/embed.md
{
  echo "# Sharded embedding benchmark"
  echo
  echo "Workload: preset torchrec-peer (TorchRec peer's definition, seed 1), batch 2048 per rank, examples preloaded into memory before the first step (--preload, as the peer does), row-wise Adagrad (lr 0.02) for tables, Adagrad (lr 0.002) for the MLP, $WARM warm-up + $STEPS timed steps (the first log interval is not counted). Measured $(date -u +%Y-%m-%d) at commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src || echo ' (with uncommitted changes)'), $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), family $(grep -m1 'cpu family' /proc/cpuinfo | cut -d: -f2 | xargs) model $(grep -m1 '^model[[:space:]]' /proc/cpuinfo | cut -d: -f2 | xargs)); OpenBLAS kernels: $(OPENBLAS_VERBOSE=2 "$BIN" --version 2>&1 | sed -n 's/^Core: //p' | head -1) ($([[ -n ${OPENBLAS_CORETYPE:-} ]] && echo "OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE" || echo "OpenBLAS's own choice")); the MLP's GEMM (\`--dense-gemm auto\`): $("$BIN" embed --preset tiny --batch 64 --steps 1 --eval-examples 64 --threads 1 2>/dev/null < /dev/null | grep -o '([a-z0-9-]* GEMM)' | head -1 | tr -d '()' | sed 's/ GEMM//')."
  echo
} > "$table"

for sec in $SECTIONS; do
case $sec in
dedup)
  {
    echo "## Dedup on and off (plan auto)"
    echo
    echo "| P x threads | dedup $HEAD"
    echo "|---|---$SEP"
  } >> "$table"
  printf 'P x threads\tdedup\texamples_per_s\tmb_per_step\n' > bench/embed-dedup.tsv
  for np in 2 4; do
    for d in on off; do
      flag=(); [[ $d == off ]] && flag=(--no-dedup)
      run "dedup-$np-$d" "$np" 1 --plan auto --stats "$OUT/stats-$np.json" "${flag[@]}"
      echo "| ${np}x1 | $d | $(summary "dedup-$np-$d") |" >> "$table"
      printf '%sx1\tdedup %s\t%s\n' "$np" "$d" "$(numbers "dedup-$np-$d")" >> bench/embed-dedup.tsv
    done
  done
  chart bench/embed-dedup.svg --table bench/embed-dedup.tsv --x "P x threads" --y mb_per_step \
    --series dedup --kind bar --ylabel "MB sent per step (all ranks)" \
    --title "Embedding: bytes exchanged per step, dedup on and off"
  echo >> "$table" ;;
accumulate)
  {
    echo "## Gradient accumulation at P = 4 (micro-batch 2048 per rank)"
    echo
    echo "| K $HEAD"
    echo "|---$SEP"
  } >> "$table"
  for k in 1 2 5; do
    run "acc-$k" 4 1 --plan auto --stats "$OUT/stats-4.json" --accumulate "$k"
    echo "| $k | $(summary "acc-$k") |" >> "$table"
  done
  echo >> "$table"
  # What accumulation saves is per-step communication, so its gain depends on how much
  # of a step that is. The same runs with the ranks talking TCP (the transport between
  # nodes) on a private loopback, unlimited and then capped by a token bucket
  # (aggregate over all ranks: a shared switch of that rate).
  {
    echo "### The gain by transport (P = 4, K = 1 and 5, same plan)"
    echo
    echo "Shared memory is the runs above. \`tcp\`: Open MPI's TCP transport (as between nodes) in a private network namespace; \`tcp R\`: the same with the namespace's loopback capped at R in all (\`tc ... tbf\`), so about R/4 per rank when all send. Phases in seconds per step, the slowest rank's."
    echo
    echo "| transport | K=1 ex/s | K=5 ex/s | K=5 / K=1 | K=1 lookup + backward + all-reduce s | K=5 lookup + backward + all-reduce s | K=1 dense s | K=5 dense s |"
    echo "|---|---|---|---|---|---|---|---|"
  } >> "$table"
  # comm_cells NAME: "lookup+backward+all-reduce seconds per step<TAB>dense seconds per step".
  comm_cells() {
    python3 - "$OUT/$1.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
iv = [r for r in rows if not r.get("final")][1:]
st = sum(r["steps"] for r in iv)
c = sum(r["seconds_lookup"] + r["seconds_backward"] + r.get("seconds_update", 0) + r["seconds_allreduce"] for r in iv) / st
print(f'{c:.3f}\t{sum(r["seconds_dense"] for r in iv) / st:.3f}')
PY
  }
  commas() { python3 -c 'import sys; print(f"{int(sys.argv[1]):,}")' "$1"; }
  gain_row() {  # gain_row LABEL NAME_K1 NAME_K5
    local a b; a=$(rate "$2"); b=$(rate "$3")
    IFS=$'\t' read -r c1 d1 <<< "$(comm_cells "$2")"
    IFS=$'\t' read -r c5 d5 <<< "$(comm_cells "$3")"
    printf '| %s | %s | %s | %s | %s | %s | %s | %s |\n' "$1" "$(commas "$a")" "$(commas "$b")" \
      "$(awk -v a="$a" -v b="$b" 'BEGIN{printf "%+.1f%%", (b / a - 1) * 100}')" "$c1" "$c5" "$d1" "$d5" >> "$table"
  }
  gain_row "shared memory" acc-1 acc-5
  if [[ $(id -u) -eq 0 ]] && command -v tc > /dev/null && unshare -n true 2> /dev/null; then
    for r in $NET_RATES; do
      for k in 1 5; do
        MPI_PREFIX=(unshare -n bash -c 'ip link set lo up && { [[ $1 == none ]] || tc qdisc add dev lo root tbf rate "$1" burst 4mb latency 50ms; } && shift && exec "$@"' \
          netns "$r" env OMPI_MCA_btl=self,tcp OMPI_MCA_btl_tcp_if_include=lo)
        run "acc-net-$r-$k" 4 1 --plan auto --stats "$OUT/stats-4.json" --accumulate "$k"
        MPI_PREFIX=()
      done
      label=tcp; [[ $r != none ]] && label="tcp $r"
      gain_row "$label" "acc-net-$r-1" "acc-net-$r-5"
    done
  else
    echo "| tcp | skipped: needs root, \`unshare -n\` and \`tc\` | | | | | | |" >> "$table"
  fi
  echo >> "$table" ;;
pipeline)
  {
    echo "## Pipelining (next lookup overlaps the dense step; one step stale), K = 2"
    echo
    echo "| P x threads | pipeline $HEAD"
    echo "|---|---$SEP"
  } >> "$table"
  for np in 2 4; do
    for p in off on; do
      flag=(); [[ $p == on ]] && flag=(--pipeline)
      run "pipe-$np-$p" "$np" 1 --plan auto --stats "$OUT/stats-$np.json" --accumulate 2 "${flag[@]}"
      echo "| ${np}x1 | $p | $(summary "pipe-$np-$p") |" >> "$table"
    done
  done
  echo >> "$table" ;;
planner)
  {
    echo "## Planner vs heuristics: 10 table tasks sampled from dlrm-synthetic (scale 0.1), 4 ranks"
    echo
    echo '```'
    "$BIN" plan --preset dlrm-synthetic --scale 0.1 --ranks 4 --batch 2048 --tasks 10 --estimate \
      | tee "$OUT/plan-tasks.md"
    echo '```'
    echo
  } >> "$table"
  # The Markdown table (task | tables | planner | 4 heuristics | ...) in long form.
  awk -F'|' 'NR == 1 { for (i = 4; i <= 8; i++) { h[i] = $i; gsub(/ /, "", h[i]) }
                       print "task\tmethod\timbalance"; next }
             { t = $2; gsub(/ /, "", t) }
             t ~ /^([0-9]+|mean)$/ { for (i = 4; i <= 8; i++) { v = $i; gsub(/ /, "", v); print t "\t" h[i] "\t" v } }' \
    "$OUT/plan-tasks.md" > bench/embed-planner.tsv
  chart bench/embed-planner.svg --table bench/embed-planner.tsv --x task --y imbalance \
    --series method --kind bar --ylabel "imbalance (P max / sum of rank costs)" \
    --title "Planner vs heuristics: imbalance per sampled task (1 is perfect)" ;;
peer)
  # Per shape and table optimizer, REPEATS rounds of: torusrec with every sharded
  # table in `rows`, in `pooled`, and with the planner's mix (`auto`), then TorchRec.
  {
    echo "## Side by side with TorchRec (same workload definition, same machine, one run)"
    echo
    echo "Output modes: \`rows\` (distinct rows come back, pooled by the asking rank), \`pooled\` (owners pool each example's rows and return one vector per example and table), \`auto\` (the planner's choice per table). Each shape ran $REPEATS rounds, one after another in this run: torusrec in the three modes, then TorchRec. Cells give the median examples/s and, in brackets, the lowest and highest; ratios are torusrec's median over TorchRec's."
    echo
    echo "| P x threads | tables' optimizer | rows ex/s | pooled ex/s | auto ex/s (pooled tables) | TorchRec ex/s | rows / TorchRec | pooled / TorchRec | auto / TorchRec |"
    echo "|---|---|---|---|---|---|---|---|---|"
  } >> "$table"
  phases=$(mktemp)
  printf 'config\tsystem\texamples_per_s\n' > bench/embed-peer.tsv
  have_peer=false
  if [[ -x $PEER_PY ]] && "$PEER_PY" -c 'import torchrec' 2>/dev/null; then have_peer=true; fi
  for cfg in "2 1 rowwise_adagrad" "1 2 rowwise_adagrad" "2 1 sgd" "1 2 sgd"; do
    read -r np th opt <<< "$cfg"
    ours_opt=rowwise-adagrad; [[ $opt == sgd ]] && ours_opt=sgd
    declare -A ex=()
    theirs_all=()
    for ((rep = 1; rep <= REPEATS; rep++)); do
      for mode in rows pooled auto; do
        name="peer-ours-$np-$th-$opt-$mode-$rep"
        run "$name" "$np" "$th" --plan auto --stats "$OUT/stats-$np.json" --table-opt "$ours_opt" --output-mode "$mode"
        ex[$mode]+="$(rate "$name") "
      done
      theirs=n/a
      if $have_peer; then
        log="$OUT/peer-$np-$th-$opt-$rep.log"
        (cd /tmp && OMP_NUM_THREADS=$th "$PEER_PY" "$OLDPWD/$PEER" --procs "$np" --threads "$th" \
            --emb-opt "$opt" --steps "$STEPS" --warmup "$WARM") > "$log" 2>&1 || true
        theirs=$(grep -o 'torchrec examples/s=[0-9]*' "$log" | grep -o '[0-9]*$' || echo n/a)
        [[ -z $theirs ]] && theirs=n/a
      fi
      theirs_all+=("$theirs")
    done
    declare -A med=() cells=()
    for mode in rows pooled auto; do
      # shellcheck disable=SC2086
      read -r m i lo hi <<< "$(median ${ex[$mode]})"
      med[$mode]=$m
      cells[$mode]=$(cell "$m" "$lo" "$hi")
      echo "| ${np}x${th} | $opt | $mode | $(summary "peer-ours-$np-$th-$opt-$mode-$i") |" >> "$phases"
      printf '%sx%s %s\ttorusrec %s\t%s\n' "$np" "$th" "$opt" "$mode" "$m" >> bench/embed-peer.tsv
    done
    read -r theirs _ tlo thi <<< "$(median "${theirs_all[@]}")"
    printf '%sx%s %s\tTorchRec\t%s\n' "$np" "$th" "$opt" "$theirs" >> bench/embed-peer.tsv
    pooled_tables=$(grep -o 'output [0-9]* pooled' "$OUT/peer-ours-$np-$th-$opt-auto-1.log" | head -1 | grep -o '[0-9]*')
    ratio() { [[ $theirs == n/a ]] && echo n/a || awk -v a="$1" -v b="$theirs" 'BEGIN{printf "%.2fx", a/b}'; }
    echo "| ${np}x${th} | $opt | ${cells[rows]} | ${cells[pooled]} | ${cells[auto]} ($pooled_tables of 26) | $(cell "$theirs" "$tlo" "$thi") | $(ratio "${med[rows]}") | $(ratio "${med[pooled]}") | $(ratio "${med[auto]}") |" >> "$table"
    unset ex med cells
  done
  {
    echo
    echo "### Per phase (seconds per step, the slowest rank's), bytes per step, of the median runs above"
    echo
    echo "| P x threads | tables' optimizer | output $HEAD"
    echo "|---|---|---$SEP"
    cat "$phases"
    echo
  } >> "$table"
  rm -f "$phases"
  chart bench/embed-peer.svg --table bench/embed-peer.tsv --x config --y examples_per_s \
    --series system --kind bar --ylabel "examples/s (median of $REPEATS)" \
    --title "Embedding: examples/s, torusrec output modes and TorchRec"
  chart bench/embed-runs.svg "$OUT"/peer-ours-2-1-rowwise_adagrad-{rows,pooled,auto}-1.jsonl \
    --label rows --label pooled --label auto --title "Embedding runs at 2x1 (rowwise Adagrad, first round)" ;;
esac
done
if ((${#charts[@]} > 0)); then
  {
    echo "## Charts"
    echo
    for c in "${charts[@]}"; do echo "![${c#bench/}](${c#bench/})"; echo; done
    echo "The charts' data: bench/embed-*.tsv (drawn by \`torusrec plot --table\`)."
  } >> "$table"
fi
cat "$table"
