#!/usr/bin/env bash
# Torus collectives benchmark (issue 9): neighbour-exchange collectives (`--collectives
# torus`) against MPI's own (`mpi`) on simulated tori of 4 and 8 ranks on this machine.
#   1. `torusrec selftest --bench`: all-reduce (f32) and a uniform all-to-all-v of 64 kB
#      to 64 MB per rank, mean of $REPS calls, the slowest rank's, at 2x2, 2x4, 2x2x2;
#   2. the ALS epoch on cnr-2000 K=1 (d=$DIM, $EPOCHS epochs) at 2x2 with both, and the
#      end-of-run link summary (busiest link, mean, all-to-all hops).
#   3. `torusrec project measure` at 2x2, 2x4, 2x2x2 on cnr-2000 K=1: the projected
#      per-link bytes and messages of every training phase against the measured
#      counters (rank by rank), and the projected communication seconds (with this
#      machine's link parameters, fitted to the torus collectives at that shape)
#      against the measured ones; MEASURE_RUNS (default 5) runs per shape, each
#      fitting the link model afresh: medians and spread (min..max) reported;
#   4. `torusrec project als`: WebGraph in-dense, de-dense, dense and sparse at d=128
#      (bf16 tables) on TPU v3 shapes up to 2048 cores, ours (dedup) and ALX's scheme
#      (all-gather), with the compute rate calibrated by step 3 at 2x2; a chart of the
#      projected time per epoch against chips; for sparse and dense, ALX's published
#      points beside the projection of its scheme, the gap by term, and the scheme at
#      the rates `torusrec calibrate` measured here at 2x2 (--costs);
#   5. `torusrec project embed`: the torchrec-peer and dlrm-synthetic presets on TPU v4
#      shapes (the planner's placement per chip count).
# Sections 1-3 are measured; sections 4-5 are projected (and say so). Writes bench/torus.md.
#   REPS=5 DIM=64 EPOCHS=3 MEASURE_EPOCHS=6 OUT=out/bench-torus
#   REUSE=1: sections 1-2 from the logs an earlier run left in $OUT (not run again; the
#   table says so and dates them); sections 3-5 run.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
REPS="${REPS:-5}"
MEASURE_RUNS="${MEASURE_RUNS:-5}"
REUSE="${REUSE:-0}"
DIM="${DIM:-64}"
EPOCHS="${EPOCHS:-3}"
# Epochs of each `project measure` run: its communication seconds are a mean over
# them, and the link model's rounds (one after each) sample the machine over them.
MEASURE_EPOCHS="${MEASURE_EPOCHS:-6}"
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
  echo "Measured $(date -u +%Y-%m-%d) at commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src || echo ' (with uncommitted changes)') on $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)); every rank is a process on this one machine (oversubscribed beyond 2 ranks), so a \"link\" is shared memory and these times say how the algorithms compare here, not what a TPU pod's links would do. \`torus\`: neighbour exchanges only (bidirectional ring all-reduce per dimension, ring all-gather, dimension-ordered all-to-all-v); \`mpi\`: Open MPI's own. Sections 1-3 are measured; sections 4-5 (TPU pods) are projected."
  echo
} > "$table"

printf 'shape\top\tcollectives\tmb_per_rank\tms_per_call\n' > bench/torus.tsv
for shape in 2x2 2x4 2x2x2; do
  np=$(( ${shape//x/*} ))
  {
    echo "## Collectives at $shape ($np ranks), mean of $REPS calls (slowest rank)"
    echo
  } >> "$table"
  if [[ $REUSE == 1 && -s "$OUT/coll-$shape.log" ]]; then
    echo "(reused: \`$OUT/coll-$shape.log\` of $(date -u -r "$OUT/coll-$shape.log" '+%Y-%m-%d %H:%M UTC'), not run again)" >> "$table"; echo >> "$table"
  else
    "${MPI[@]}" -np "$np" "$BIN" --torus "$shape" selftest --bench --reps "$REPS" \
        > "$OUT/coll-$shape.log" 2>&1 || { tail -20 "$OUT/coll-$shape.log"; exit 1; }
  fi
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
reused=()
for c in mpi torus; do
  log="$OUT/als-$c.log"
  if [[ $REUSE == 1 && -s "$OUT/als-$c.jsonl" ]]; then
    reused+=("\`$log\` of $(date -u -r "$log" '+%Y-%m-%d %H:%M UTC')")
  else
    rm -f "$OUT/als-$c.jsonl"
    "${MPI[@]}" -np 4 "$BIN" --torus 2x2 --collectives "$c" als --data "$CNR" --dim "$DIM" \
        --epochs "$EPOCHS" --threads 1 --reg 1e-4 --unobserved-weight 3e-3 \
        --metrics "$OUT/als-$c.jsonl" > "$log" 2>&1 || { tail -20 "$log"; exit 1; }
  fi
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
if ((${#reused[@]} > 0)); then
  { echo; echo "(reused, not run again: ${reused[*]})"; } >> "$table"
fi
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

# 3. The projection checked against measured runs.
{
  echo "## Projection against measurement: \`project measure\` on cnr-2000 K=1 (d=$DIM, $MEASURE_EPOCHS epochs, torus collectives, 1 thread per rank)"
  echo
  echo "Per-link bytes: every rank's bytes and messages on every link, per phase, projected from the dataset (exact) against the counters of the run. Seconds: the projection uses the link model fitted at that shape to the torus collectives themselves (microbenchmarks, not this run, timed in a round before the epochs and one after each: all-reduces, uniform and skewed all-to-alls): latency per shift, the chain's bandwidth and, when the fit finds one, a node bandwidth for the bytes of all links together (the ranks share this machine's 2 cores; a pod's chips do not); the measured seconds are the slowest rank's time inside the phase's collectives, each started after a barrier so that waiting for slower ranks is not counted, and followed by one so that no rank computes while another is still in the call."
  echo
} >> "$table"
printf 'shape\trun\tlatency_us\tbandwidth_gbs\tcomm_measured_s\tcomm_projected_s\tdiff_pct\tnode_gbs\n' > "$OUT/measure.tsv"
for shape in 2x2 2x4 2x2x2; do
  np=$(( ${shape//x/*} ))
  for run in $(seq 1 "$MEASURE_RUNS"); do
    log="$OUT/measure-$shape-$run.log"
    "${MPI[@]}" -np "$np" "$BIN" --torus "$shape" project measure --data "$CNR" --dim "$DIM" \
        --epochs "$MEASURE_EPOCHS" --threads 1 --out "$OUT/cal-$shape-$run.json" --force > "$log" 2>&1 \
        || { tail -20 "$log"; exit 1; }
    python3 - "$OUT/cal-$shape-$run.json" "$shape" "$run" >> "$OUT/measure.tsv" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
c = m["calibration"]
d = 100 * (m["projected_comm_seconds"] / m["comm_seconds"] - 1)
# No node term fitted: infinite node bandwidth (the term costs nothing).
node = c.get("node_bandwidth")
node = float("inf") if node is None else node / 1e9
print(f"{sys.argv[2]}\t{sys.argv[3]}\t{c['link_latency']*1e6:.1f}\t{c['link_bandwidth']/1e9:.3f}\t{m['comm_seconds']:.4f}\t{m['projected_comm_seconds']:.4f}\t{d:+.1f}\t{node:.3f}")
PY
  done
  # The run of the median link bandwidth stands for the shape (its log below, its
  # calibration for section 4).
  med=$(awk -F'\t' -v s="$shape" '$1 == s {print $4 "\t" $2}' "$OUT/measure.tsv" | sort -g | awk -v n="$MEASURE_RUNS" 'NR == int((n + 1) / 2) {print $2}')
  cp "$OUT/cal-$shape-$med.json" "$OUT/cal-$shape.json"
  { echo "### $shape (run $med of $MEASURE_RUNS: the median link bandwidth)"; echo; grep -v '^\[' "$OUT/measure-$shape-$med.log" | grep -v '^calibration written'; echo; } >> "$table"
done
{
  echo "Summary (communication seconds per epoch), $MEASURE_RUNS runs per shape, each fitting the link model afresh: median and spread (min..max) over the runs."
  echo
  echo "| shape | fitted latency us | fitted bandwidth GB/s | measured s | projected s | projected vs measured | fitted node bandwidth GB/s (inf: no node term) |"
  echo "|---|---|---|---|---|---|---|"
  python3 - "$OUT/measure.tsv" <<'PY'
import statistics, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])][1:]
for shape in dict.fromkeys(r[0] for r in rows):
    rs = [r for r in rows if r[0] == shape]
    cells = []
    for k in range(2, 8):
        v = [float(r[k]) for r in rs]
        fmt = "{:+.1f}%" if k == 6 else "{:.4g}"
        cells.append(f"{fmt.format(statistics.median(v))} ({fmt.format(min(v))}..{fmt.format(max(v))})")
    print(f"| {shape} | " + " | ".join(cells) + " |")
PY
  echo
} >> "$table"

# 4. Projections onto TPU v3 pods (calibrated by the 2x2 measurement).
CAL="$OUT/cal-2x2.json"
# The rates `project als --costs` projects ALX's scheme with (sparse and dense).
"${MPI[@]}" -np 4 "$BIN" --torus 2x2 calibrate --threads 1 --out "$OUT/costs-2x2.json" --force \
    > "$OUT/calibrate-2x2.log" 2>&1 || { tail -20 "$OUT/calibrate-2x2.log"; exit 1; }
{
  echo "## Projected: WebGraph variants on TPU v3 (d=128, bf16 tables, 3 CG steps)"
  echo
  echo "Projected, not measured. Per-link bytes of the exchange come from the generator's degree model (within 5% of the exact counts on generated graphs at 4 and 16 ranks: tests/it/project.rs); compute is the solve rate measured here at 2x2 scaled by the chip's peak, bounded below by reading one fixed-table row per non-zero and CG step from HBM; communication is the torus algorithms' chain of neighbour shifts at the preset's link bandwidth and a 1 us latency; nothing overlaps. \`allgather\` is torusrec's ALX-style baseline (all ids all-gathered, a dense all-reduce of every needed row), whose buffer does not fit any pod here. ALX (published): WebGraph-sparse takes about 20 minutes per epoch on 256 TPU v3 cores (128 chips), and needs at least 8 cores for dense and 32 for sparse."
  echo
} >> "$table"
printf 'variant\tshape\tchips\tcores\texchange\tmemory_gib\tfits\tcompute_s\tcomm_s\tepoch_s\tbusiest_link_mb\tmean_link_mb\trun\n' > bench/torus-projection.tsv
for v in in-dense de-dense dense sparse; do
  log="$OUT/project-$v.log"
  costs=(); [[ $v == dense || $v == sparse ]] && costs=(--costs "$OUT/costs-2x2.json")
  "$BIN" project als --webgraph "$v" --chip v3 --dim 128 --table-dtype bf16 \
      --calibration "$CAL" "${costs[@]}" --tsv "$OUT/project-$v.tsv" --force > "$log" 2>&1 || { tail -20 "$log"; exit 1; }
  { echo "### $v"; echo; grep -v '^project als\|^compute:\|^table written' "$log"; echo; } >> "$table"
  tail -n +2 "$OUT/project-$v.tsv" | awk -F'\t' -v v="$v" 'BEGIN{OFS="\t"} {print v, $0, v " " $4}' >> bench/torus-projection.tsv
done
head -2 "$OUT/project-sparse.log" | sed 's/^/    /' >> "$table"
echo >> "$table"
if "$BIN" plot --force --table bench/torus-projection.tsv --where exchange=dedup --x chips --y epoch_s \
    --series variant --log-y --ylabel "projected s per epoch (dedup)" \
    --title "Projected iALS epoch on TPU v3 against chips (d=128, bf16)" --out bench/torus-projection.svg >&2; then
  { echo "![torus-projection.svg](torus-projection.svg)"; echo; echo "Data: bench/torus-projection.tsv (both schemes)."; echo; } >> "$table"
fi

# 5. The embedding presets projected onto TPU v4 shapes.
{
  echo "## Projected: embedding presets on TPU v4 (2048 examples per chip, row-wise Adagrad)"
  echo
  echo "Projected, not measured: the planner's placement at each chip count (\`plan_auto\` with the chip's memory per rank and a cost model of the chip on that torus, \`project::embed::cost_model\`; the \`plan\` lines give its kinds and output modes), the expected bytes of its lookups, backward and dense all-reduce from the batch statistics (measured from the click generator), routed by the torus algorithms at 45 GB/s per link and 1 us per message; compute: the MLP at the chip's peak plus the table rows touched at its memory bandwidth (src/projection/embed.rs)."
  echo
} >> "$table"
for spec in "torchrec-peer 2x2x1,2x2x2,2x2x4,2x4x4,4x4x4,4x4x8,4x8x8,8x8x8" "dlrm-synthetic 2x2x4,4x4x4,4x4x8,8x8x8"; do
  set -- $spec
  log="$OUT/project-embed-$1.log"
  "$BIN" project embed --preset "$1" --chip v4 --shapes "$2" > "$log" 2>&1 || { tail -20 "$log"; exit 1; }
  { echo "### $1"; echo; cat "$log"; echo; } >> "$table"
done
cat "$table"
