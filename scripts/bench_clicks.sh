#!/usr/bin/env bash
# Real click logs and dynamic vocabularies (issue 11): writes bench/clicks.md.
#   ingest   `prepare clicks` MB/s per rank at P = 1 and 2 on INGEST_GB (default 2.2)
#            GB of Criteo-format TSV (generated: `generate clicks --format criteo`),
#            beside pandas' read_csv plus hashing of the same file (scripts/pandas_ingest.py;
#            PANDAS_PY, default python3, needs pandas);
#   hash     hash vs fixed vocabulary on the TorchRec peer's workload at 2x1: examples/s
#            and AUC (capacity 1.1x each table's vocabulary: nothing evicted);
#   modulo   the collisionless hash table vs modulo hashing into a fixed table of the
#            same memory (AUC of each, at several memories);
#   admit    the same hash tables with --admit-after 3 (after `modulo`, whose runs it
#            compares with);
#   days     a stream of DAYS (default 10) generated Criteo days with a growing
#            vocabulary at a capacity that forces eviction: each day trained from the
#            previous day's checkpoint and evaluated on the next day; peak RSS per rank,
#            rows held, evicted;
#   caughtup days 0-6 at P = 4, then day 7 at P = 2 from that checkpoint, AUC on day 8,
#            beside training from scratch on days 0-7 at P = 2.
# With real Criteo files, CRITEO_DAYS="day_0.gz day_1.gz ..." replaces the generated
# days of `days` and `caughtup` (and INGEST_FILE the generated file of `ingest`).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT="${OUT:-out/bench-clicks}"
SECTIONS="${SECTIONS:-ingest hash modulo admit days caughtup}"
INGEST_GB="${INGEST_GB:-2.2}"
PANDAS_PY="${PANDAS_PY:-python3}"
DAYS="${DAYS:-10}"
DAY_EXAMPLES="${DAY_EXAMPLES:-200000}"
# The Criteo-like generator's tables: the TorchRec peer's 26 vocabularies, scaled.
DAY_PRESET="${DAY_PRESET:-torchrec-peer}"
DAY_SCALE="${DAY_SCALE:-0.1}"
HASH_STEPS="${HASH_STEPS:-300}"
mkdir -p "$OUT" bench
if [[ $(id -u) -eq 0 ]]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
# shellcheck source=scripts/blas_env.sh
. scripts/blas_env.sh
cargo build --release --quiet
BIN=target/release/torusrec
# h5py (the logs' day offsets) and pandas (the ingestion reference).
python3 -c "import h5py" 2>/dev/null \
  || python3 -m pip install --quiet --only-binary=:all: -r scripts/requirements-bench.txt \
  || { echo "pip install -r scripts/requirements-bench.txt failed" >&2; exit 1; }
MPI=(mpirun --oversubscribe --bind-to none "${BLAS_MPI_ENV[@]}")

# mpi NP ARGS...: the binary on NP ranks, output to the caller.
mpi() { local np=$1; shift; timeout 3600 "${MPI[@]}" -np "$np" "$BIN" "$@"; }

# jq-like reads of a metrics file: final AUC, log loss, peak RSS; timed examples/s
# (intervals after the first); the hash tables' state at the end.
metric() {
  python3 - "$@" <<'PY'
import json, sys
path, what = sys.argv[1], sys.argv[2]
rows = [json.loads(l) for l in open(path) if l.strip()]
fin = [r for r in rows if r.get("final")][-1]
iv = [r for r in rows if not r.get("final")]
timed = iv[1:] or iv
h = (iv[-1].get("hash") or {}) if iv else {}
v = {
    "auc": fin.get("auc"), "logloss": fin.get("logloss"),
    "rss": fin.get("peak_rss_bytes", 0) / 2**20,
    "exs": sum(r["examples"] for r in timed) / max(sum(r["seconds"] for r in timed), 1e-9),
    "entries": h.get("entries", 0), "admitted": h.get("admitted", 0),
    "evicted": h.get("evicted", 0), "refused": h.get("refused", 0),
    "capacity": h.get("capacity", 0),
}[what]
print("n/a" if v is None else (f"{v:.4f}" if what in ("auc", "logloss") else f"{v:.0f}"))
PY
}

table=bench/clicks.md
cpu="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), family $(grep -m1 'cpu family' /proc/cpuinfo | cut -d: -f2 | xargs)"
avx512=$(grep -qw avx512f /proc/cpuinfo && echo "AVX-512" || echo "AVX2 only")
stamp="Measured $(date -u +%Y-%m-%d) at commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src || echo ' (with uncommitted changes)') on $(nproc) cores ($cpu; $avx512: the MLP's GEMM dispatches on it, \`--dense-gemm auto\`)."
[[ -f $table ]] || printf '# Click logs and hash-table embeddings\n\nEach section names the commit and CPU it was measured on; `SECTIONS="..." scripts/bench_clicks.sh` re-runs some sections and replaces them in place.\n\n' > "$table"

# splice SEC: put section SEC (written to $part) into $table, replacing its old text.
splice() {
  python3 - "$table" "$1" "$part" <<'PY'
import sys
table, sec, part = sys.argv[1], sys.argv[2], sys.argv[3]
text = open(table).read()
lines = open(part).read().rstrip("\n").split("\n")
# The stamp (first line) goes under the section's title.
k = next((i for i, l in enumerate(lines) if l.startswith("## ")), None)
if k is not None and lines[0].startswith("Measured"):
    lines = [lines[k], "", lines[0]] + [l for i, l in enumerate(lines) if i not in (0, 1, k)]
new = f"<!-- section:{sec} -->\n" + "\n".join(lines) + f"\n<!-- end:{sec} -->\n"
a, b = text.find(f"<!-- section:{sec} -->"), text.find(f"<!-- end:{sec} -->")
if a >= 0 and b > a:
    text = text[:a] + new + text[b + len(f"<!-- end:{sec} -->\n"):]
else:
    # Sections keep the script's order.
    order = ["ingest", "hash", "modulo", "admit", "days", "caughtup"]
    after = [s for s in order[order.index(sec) + 1:] if f"<!-- section:{s} -->" in text]
    at = text.find(f"<!-- section:{after[0]} -->") if after else len(text)
    text = text[:at] + new + "\n" + text[at:]
open(table, "w").write(text)
PY
}

# generate_days DIR N: N Criteo-format day files (plain TSV) of DAY_EXAMPLES each.
generate_days() {
  local dir=$1 n=$2
  if [[ ! -f $dir/day_$((n - 1)).tsv ]]; then
    "$BIN" generate clicks --format criteo --preset "$DAY_PRESET" --scale "$DAY_SCALE" \
      --days "$n" --examples "$DAY_EXAMPLES" --seed 7 --out "$dir" --force > "$dir.log" 2>&1 \
      || { echo "generate failed:"; tail "$dir.log"; exit 1; }
  fi
}

# day_file K: the file of day K (generated, or the K-th of CRITEO_DAYS).
day_file() {
  if [[ -n ${CRITEO_DAYS:-} ]]; then
    local files=($CRITEO_DAYS)
    echo "${files[$1]}"
  else
    echo "$OUT/days/day_$1.tsv"
  fi
}

# prepare_log OUT.h5 DAY...: a click log of the given days, on 2 ranks.
prepare_log() {
  local out=$1 day; shift
  local files=()
  for day in "$@"; do files+=("$(day_file "$day")"); done
  [[ -f $out ]] || mpi 2 prepare clicks --format criteo --input "${files[@]}" --out "$out" \
    > "$out.log" 2>&1 || { echo "prepare $out failed:"; tail "$out.log"; exit 1; }
}

# steps_for LOG GLOBAL_BATCH [EVAL_DAY]: optimizer steps of one pass over the training days.
steps_for() {
  python3 - "$@" <<'PY'
import sys, h5py
f = h5py.File(sys.argv[1], "r")
days = [int(x) for x in f["day_offsets"][:]] if "day_offsets" in f else [0, int(f.attrs["examples"])]
n = days[-1]
if len(sys.argv) > 3:
    k = int(sys.argv[3]); n -= days[k + 1] - days[k]
print(max(1, -(-n // int(sys.argv[2]))))
PY
}

for sec in $SECTIONS; do
part=$OUT/section-$sec.md
printf '%s\n\n' "$stamp" > "$part"
case $sec in
ingest)
  src="${INGEST_FILE:-$OUT/ingest/day_0.tsv}"
  if [[ -z ${INGEST_FILE:-} && ! -f $src ]]; then
    # One day of about INGEST_GB: a Criteo line of this generator is ~180 bytes.
    n=$(python3 -c "print(int($INGEST_GB * 1e9 / 180))")
    mkdir -p "$OUT/ingest"
    "$BIN" generate clicks --format criteo --preset "$DAY_PRESET" --scale "$DAY_SCALE" \
      --days 1 --examples "$n" --seed 3 --out "$OUT/ingest" --force > "$OUT/ingest.log" 2>&1
  fi
  bytes=$(stat -c %s "$src")
  {
    echo "## Ingestion: \`prepare clicks --format criteo\` vs pandas"
    echo
    echo "Input: $(basename "$src"), $(python3 -c "print(f'{$bytes/1e9:.2f}')") GB of Criteo-format TSV (page cache warm: each run reads the file once before timing starts). pandas: \`read_csv\` in chunks of 1M lines, the same transforms and hex -> int64 hashing, one process (one core)."
    echo
    echo "| reader | ranks x threads | seconds | MB/s | MB/s per rank | MB/s per core | per core over pandas | peak RSS per rank |"
    echo "|---|---|---|---|---|---|---|---|"
  } >> "$part"
  cat "$src" > /dev/null
  # ranks:threads (rayon threads per rank; the parser splits each block over them).
  for cfg in 1:1 1:2 2:1; do
    np=${cfg%:*}; th=${cfg#*:}
    rm -f "$OUT/ingest-$np-$th.h5"
    RAYON_NUM_THREADS=$th timeout 3600 "${MPI[@]}" -x RAYON_NUM_THREADS -np "$np" "$BIN" prepare clicks \
      --format criteo --input "$src" --out "$OUT/ingest-$np-$th.h5" --force > "$OUT/ingest-$np-$th.log" 2>&1 \
      || { echo "prepare clicks at $cfg failed:"; tail "$OUT/ingest-$np-$th.log"; exit 1; }
    rm -f "$OUT/ingest-$np-$th.h5"
    secs=$(grep -o 'seconds [0-9.]*' "$OUT/ingest-$np-$th.log" | tail -1 | cut -d' ' -f2)
    rss=$(grep -o 'peak_rss_bytes [0-9]*' "$OUT/ingest-$np-$th.log" | tail -1 | cut -d' ' -f2)
    echo "$np $th $secs ${rss:-0}" >> "$OUT/ingest-runs.txt"
  done
  "$PANDAS_PY" scripts/pandas_ingest.py "$src" > "$OUT/pandas.json" 2> "$OUT/pandas.log" \
    || { echo "pandas failed:"; tail "$OUT/pandas.log"; exit 1; }
  python3 - "$OUT/pandas.json" "$OUT/ingest-runs.txt" "$bytes" >> "$part" <<'PY'
import json, sys
p = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
runs = [l.split() for l in open(sys.argv[2]) if l.strip()][-3:]
b = float(sys.argv[3])
for np_, th, s, rss in runs:
    np_, th, s, rss = int(np_), int(th), float(s), int(rss)
    mbs = b / s / 1e6
    print(f"| torusrec prepare clicks | {np_} x {th} | {s:.1f} | {mbs:.0f} | {mbs/np_:.0f} | {mbs/(np_*th):.0f} | {mbs/(np_*th)/p['mb_per_s']:.1f}x | {rss/2**20:.0f} MiB |")
print(f"| pandas read_csv + hashing | 1 x 1 | {p['seconds']:.1f} | {p['mb_per_s']:.0f} | {p['mb_per_s']:.0f} | {p['mb_per_s']:.0f} | 1.0x | - |")
print()
print("MB/s are of the text read; a torusrec run includes writing and fsyncing the click log (larger than the text: 64-bit ids and offsets). Target: at least 3x pandas per core.")
print()
PY
  rm -f "$OUT/ingest-runs.txt"
  ;;
hash)
  {
    echo "## Hash vs fixed vocabulary: the TorchRec peer's workload at 2x1"
    echo
    echo "Preset torchrec-peer (26 tables, 4.37M rows, width 64), batch 2048 per rank, --preload, $HASH_STEPS steps (the first log interval of 10 is not timed), plan auto for both. Hash: \`--vocab hash --capacity 1.1x\` (each table 1.1 times its id space, so that keys spreading unevenly over owners still fit: nothing is evicted), admission at the first occurrence."
    echo
    echo "| vocabulary | examples/s | eval AUC | log loss | rows held | evicted | peak RSS/rank |"
    echo "|---|---|---|---|---|---|---|"
  } >> "$part"
  for v in fixed hash; do
    extra=()
    [[ $v == hash ]] && extra=(--vocab hash --capacity 1.1x)
    rm -f "$OUT/hash-$v.jsonl"
    mpi 2 embed --preset torchrec-peer --batch 2048 --steps "$HASH_STEPS" --log-every 10 \
      --eval-examples 65536 --threads 1 --seed 1 --preload --metrics "$OUT/hash-$v.jsonl" \
      "${extra[@]}" > "$OUT/hash-$v.log" 2>&1 || { echo "run $v failed"; tail "$OUT/hash-$v.log"; exit 1; }
    m=$OUT/hash-$v.jsonl
    echo "| $v | $(metric "$m" exs) | $(metric "$m" auc) | $(metric "$m" logloss) | $( [[ $v == hash ]] && metric "$m" entries || echo -) | $( [[ $v == hash ]] && metric "$m" evicted || echo -) | $(metric "$m" rss) MiB |" >> "$part"
  done
  python3 - "$OUT/hash-fixed.jsonl" "$OUT/hash-hash.jsonl" >> "$part" <<'PY'
import json, sys
def load(p):
    rows = [json.loads(l) for l in open(p) if l.strip()]
    iv = [r for r in rows if not r.get("final")][1:]
    fin = [r for r in rows if r.get("final")][-1]
    return sum(r["examples"] for r in iv) / sum(r["seconds"] for r in iv), fin["auc"]
f, h = load(sys.argv[1]), load(sys.argv[2])
print()
print(f"Hash over fixed: {h[0]/f[0]:.2f}x examples/s (target: at least 0.9x, issue 17); AUC difference {h[1]-f[1]:+.4f} (target: within 0.002 when nothing is evicted).")
print()
PY
  ;;
modulo)
  {
    echo "## Collisionless hash table vs modulo hashing into a fixed table of the same memory"
    echo
    echo "The TorchRec peer's workload at 2x1 as above ($HASH_STEPS steps). Each table gets F times its id space in rows: \`--vocab hash --capacity Fx\` (a full table evicts the least frequent keys; an evicted key that comes back starts from a fresh row) against \`--vocab modulo --capacity Fx\` (every id gets row id mod rows: distinct ids share rows). Fixed vocabulary (F = 1) for reference: $(metric "$OUT/hash-fixed.jsonl" auc 2>/dev/null || echo 'run the hash section')."
    echo
    echo "| rows (F x id space) | hash AUC | modulo AUC | hash - modulo | hash: evicted | hash examples/s | modulo examples/s |"
    echo "|---|---|---|---|---|---|---|"
  } >> "$part"
  for f in 0.05 0.2 0.5; do
    for v in hash modulo; do
      rm -f "$OUT/mod-$v-$f.jsonl"
      mpi 2 embed --preset torchrec-peer --batch 2048 --steps "$HASH_STEPS" --log-every 10 \
        --eval-examples 65536 --threads 1 --seed 1 --preload --vocab "$v" --capacity "${f}x" \
        --metrics "$OUT/mod-$v-$f.jsonl" > "$OUT/mod-$v-$f.log" 2>&1 \
        || { echo "run $v $f failed"; tail "$OUT/mod-$v-$f.log"; exit 1; }
    done
    h=$OUT/mod-hash-$f.jsonl; m=$OUT/mod-modulo-$f.jsonl
    echo "| $f | $(metric "$h" auc) | $(metric "$m" auc) | $(python3 -c "print(f'{$(metric "$h" auc) - $(metric "$m" auc):+.4f}')") | $(metric "$h" evicted) | $(metric "$h" exs) | $(metric "$m" exs) |" >> "$part"
  done
  echo >> "$part"
  ;;
admit)
  {
    echo "## Hash tables with admission vs modulo hashing of the same memory"
    echo
    echo "As the section above, with \`--admit-after 3\`: a key gets a row once seen 3 times, so the stream of rare keys no longer evicts trained rows (before admission a key looks up nothing). Modulo's AUC is the section above's run (\`$OUT/mod-modulo-F.jsonl\`)."
    echo
    echo "| rows (F x id space) | hash, admit after 3: AUC | modulo AUC | difference | evicted | rows held | examples/s |"
    echo "|---|---|---|---|---|---|---|"
  } >> "$part"
  for f in 0.05 0.2 0.5; do
    rm -f "$OUT/admit-$f.jsonl"
    mpi 2 embed --preset torchrec-peer --batch 2048 --steps "$HASH_STEPS" --log-every 10 \
      --eval-examples 65536 --threads 1 --seed 1 --preload --vocab hash --capacity "${f}x" \
      --admit-after 3 --metrics "$OUT/admit-$f.jsonl" > "$OUT/admit-$f.log" 2>&1 \
      || { echo "run admit $f failed"; tail "$OUT/admit-$f.log"; exit 1; }
    h=$OUT/admit-$f.jsonl; m=$OUT/mod-modulo-$f.jsonl
    mauc=$( [[ -f $m ]] && metric "$m" auc || echo n/a)
    diff=$( [[ -f $m ]] && python3 -c "print(f'{$(metric "$h" auc) - $mauc:+.4f}')" || echo n/a)
    echo "| $f | $(metric "$h" auc) | $mauc | $diff | $(metric "$h" evicted) | $(metric "$h" entries) | $(metric "$h" exs) |" >> "$part"
  done
  ;;
days)
  mkdir -p "$OUT/days"
  [[ -n ${CRITEO_DAYS:-} ]] || generate_days "$OUT/days" "$DAYS"
  cap="${DAYS_CAPACITY:-20000}"
  {
    echo "## A stream of $DAYS days with a growing vocabulary, at a capacity that forces eviction"
    echo
    echo "Days of $DAY_EXAMPLES examples from \`generate clicks --format criteo --preset $DAY_PRESET --scale $DAY_SCALE\` (vocabularies growing 10 % a day, new keys among the frequent ones). Day d trains one pass at 2x1 (batch 2048 per rank, dim 16, \`--capacity $cap --evict lfu\` per table, the 26 tables table-wise or row-cyclic by the planner) from day d-1's checkpoint (\`--init-from\`), and is evaluated on day d+1 (\`prepare clicks\` of days d and d+1, \`--eval-day 1\`). Day 0 starts fresh."
    echo
    echo "| day | steps | eval AUC (next day) | log loss | rows held / capacity | evicted in the day | examples/s | peak RSS/rank |"
    echo "|---|---|---|---|---|---|---|---|"
  } >> "$part"
  prev=()
  for ((d = 0; d < DAYS - 1; d++)); do
    log=$OUT/days/pair-$d.h5
    prepare_log "$log" "$d" $((d + 1))
    steps=$(steps_for "$log" 4096 1)
    rm -rf "$OUT/days/ckpt-$d"; rm -f "$OUT/days/run-$d.jsonl"
    mpi 2 embed --data "$log" --eval-day 1 --capacity "$cap" --evict lfu --batch 2048 \
      --steps "$steps" --log-every "$steps" --threads 1 --seed 1 "${prev[@]}" \
      --checkpoint-dir "$OUT/days/ckpt-$d" --metrics "$OUT/days/run-$d.jsonl" \
      > "$OUT/days/run-$d.log" 2>&1 || { echo "day $d failed"; tail "$OUT/days/run-$d.log"; exit 1; }
    m=$OUT/days/run-$d.jsonl
    echo "| $d | $steps | $(metric "$m" auc) | $(metric "$m" logloss) | $(metric "$m" entries) / $(metric "$m" capacity) | $(metric "$m" evicted) | $(metric "$m" exs) | $(metric "$m" rss) MiB |" >> "$part"
    prev=(--init-from "$OUT/days/ckpt-$d")
  done
  python3 - "$OUT/days" "$DAYS" >> "$part" <<'PY'
import json, sys
d, n = sys.argv[1], int(sys.argv[2])
rss = []
for k in range(n - 1):
    rows = [json.loads(l) for l in open(f"{d}/run-{k}.jsonl") if l.strip()]
    rss.append([r for r in rows if r.get("final")][-1]["peak_rss_bytes"])
full = rss[1:]
print()
print(f"Peak RSS per rank once the tables are full (days 1-{n-2}): {min(full)/2**20:.0f} to {max(full)/2**20:.0f} MiB, a spread of {100*(max(full)-min(full))/min(full):.1f} % (target: within 5 %). The tables' memory is their capacity, allocated at start; what grows with the data is nothing.")
print()
PY
  ;;
caughtup)
  mkdir -p "$OUT/days"
  [[ -n ${CRITEO_DAYS:-} ]] || generate_days "$OUT/days" 9
  # Default: each log's own count of distinct keys per column; the caught-up run keeps
  # the history's (a warm start without --capacity does).
  cap=(); capnote="as many rows as the distinct keys each log counted (the caught-up run keeps the history's)"
  if [[ -n ${CAUGHT_CAPACITY:-} ]]; then cap=(--capacity "$CAUGHT_CAPACITY"); capnote="--capacity $CAUGHT_CAPACITY"; fi
  prepare_log "$OUT/days/d0-6.h5" 0 1 2 3 4 5 6
  prepare_log "$OUT/days/d7-8.h5" 7 8
  prepare_log "$OUT/days/d0-8.h5" 0 1 2 3 4 5 6 7 8
  s06=$(steps_for "$OUT/days/d0-6.h5" 4096)
  s78=$(steps_for "$OUT/days/d7-8.h5" 4096 1)
  s08=$(steps_for "$OUT/days/d0-8.h5" 4096 8)
  rm -rf "$OUT/days/ckpt-hist" "$OUT/days/ckpt-caught" "$OUT/days/ckpt-scratch"
  rm -f "$OUT"/days/{hist,caught,scratch}.jsonl
  t0=$(date +%s.%N)
  mpi 4 embed --data "$OUT/days/d0-6.h5" --eval-examples 8192 "${cap[@]}" --global-batch 4096 --steps "$s06" \
    --log-every "$s06" --threads 1 --seed 1 --checkpoint-dir "$OUT/days/ckpt-hist" \
    --metrics "$OUT/days/hist.jsonl" > "$OUT/days/hist.log" 2>&1 || { tail "$OUT/days/hist.log"; exit 1; }
  t1=$(date +%s.%N)
  mpi 2 embed --data "$OUT/days/d7-8.h5" --eval-day 1 "${cap[@]}" --batch 2048 --steps "$s78" \
    --log-every "$s78" --threads 1 --seed 1 --init-from "$OUT/days/ckpt-hist" \
    --checkpoint-dir "$OUT/days/ckpt-caught" --metrics "$OUT/days/caught.jsonl" \
    > "$OUT/days/caught.log" 2>&1 || { tail "$OUT/days/caught.log"; exit 1; }
  t2=$(date +%s.%N)
  mpi 2 embed --data "$OUT/days/d0-8.h5" --eval-day 8 "${cap[@]}" --batch 2048 --steps "$s08" \
    --log-every "$s08" --threads 1 --seed 1 --checkpoint-dir "$OUT/days/ckpt-scratch" \
    --metrics "$OUT/days/scratch.jsonl" > "$OUT/days/scratch.log" 2>&1 || { tail "$OUT/days/scratch.log"; exit 1; }
  t3=$(date +%s.%N)
  {
    echo "## Caught-up training: history on 4 ranks, the new day on 2"
    echo
    echo "Days of $DAY_EXAMPLES examples as above; hash tables of $capnote, dim 16, one pass over each log. Global batch 4096 throughout (1024 per rank at P = 4, 2048 at P = 2), so the runs differ only in ranks and in where training starts. History: days 0-6 at P = 4. Caught up: day 7 at P = 2 from the history's checkpoint (\`--init-from\`: the keys re-hashed to their new owners), evaluated on day 8. From scratch: days 0-7 at P = 2, evaluated on day 8."
    echo
    echo "| run | ranks | steps | seconds | AUC on day 8 | log loss on day 8 |"
    echo "|---|---|---|---|---|---|"
    echo "| history (days 0-6) | 4 | $s06 | $(python3 -c "print(f'{$t1 - $t0:.0f}')") | - | - |"
    echo "| caught up (day 7 from the history) | 2 | $s78 | $(python3 -c "print(f'{$t2 - $t1:.0f}')") | $(metric "$OUT/days/caught.jsonl" auc) | $(metric "$OUT/days/caught.jsonl" logloss) |"
    echo "| from scratch (days 0-7) | 2 | $s08 | $(python3 -c "print(f'{$t3 - $t2:.0f}')") | $(metric "$OUT/days/scratch.jsonl" auc) | $(metric "$OUT/days/scratch.jsonl" logloss) |"
    echo
    grep -h '^warm start' "$OUT/days/caught.log" | sed 's/^/Warm start: /' || true
    echo
  } >> "$part"
  ;;
*) echo "unknown section $sec" >&2; exit 2 ;;
esac
splice "$sec"
done
echo "wrote $table"
