#!/usr/bin/env bash
# Measured costs (issue 14): does the planner's calibrated cost model predict the
# step, and does planning with it balance the ranks' measured busy time?
#
# For each rank count P in RANKS (default "2 4"):
#   1. `torusrec calibrate` at P ranks -> $OUT/costs-P.json;
#   2. for each workload (torchrec-peer; dlrm-synthetic at scale SCALE, default 0.1;
#      "skewed": a few hot tables and many cold ones, $OUT/skewed.toml), three plans
#      trained in the same session, each for WARM + STEPS steps (--preload):
#        calibrated     `embed --plan auto --costs costs-P.json`
#        analytic       `plan` without --costs (the default constants), then
#                       `embed --plan analytic.json --costs costs-P.json`
#        lookup-greedy  `plan --method lookup-greedy`, then `embed --plan ... --costs`
#      (--costs on a plan file predicts its step with the measured costs; it does
#      not change the plan.)
#      The three runs are repeated REPEATS times (default 3), interleaved (calibrated,
#      analytic, lookup-greedy, calibrated, ...), so that a slow spell of this shared
#      machine does not land on one planner only.
# Per run: the predicted seconds per step (start of the run) and the measured one
# (the intervals after the first, i.e. after WARM steps), each rank's busy seconds
# per step in the embedding phases (max/min over ranks), and examples/s; every run is
# kept in $OUT/costs-runs.tsv. The table gives per plan the median over the repeats
# and the range. Summary: mean and worst |predicted - median measured| / median
# measured (target: 10 % mean, 20 % worst); the calibrated plan's busy max/min
# (target <= 1.05 and never above the other two planners'), over all its runs (each
# rank's busy seconds summed over the runs: a slow spell of one core on this shared
# machine lasts tens of steps and makes a single run's max/min read high even for
# ranks with the same work), and the median of the runs' own max/min beside it.
# Beside each busy max/min, its standard error (jackknife over the plan's runs: the
# runs of one plan differ only by the machine's noise), and how many settings miss the
# targets by more than twice it. The strict counts stay the headline.
# Each run writes the plan it trained (--plan-out); when two planners made the same
# plan (the same digest), the summaries pool their runs: one plan, one measurement.
#
# Knobs: RANKS="2 4", WORKLOADS="torchrec-peer dlrm-synthetic skewed", REPEATS=3,
# STEPS=60 and WARM=10 (timed and warm-up steps; 60 since 2026-12-02, 30 before: a
# 3 s loop of plain arithmetic pinned to one core of this machine ran 2.1-3.3 s, so
# a rank's busy share moves by several % over a short run),
# SKEW_MULT=4 (skewed runs that many times WARM and STEPS: its steps are short),
# KEEP_ROWS=1 (add to an earlier invocation's runs), RECALIBRATE=0 (keep its
# costs-P.json), MD=path (the table elsewhere than bench/costs.md; not with QUICK=1),
# RECALIBRATE_EACH=1 (per workload, calibrate again before every repeat after the
# first, costs-P-W-rN.json, and predict that repeat's three runs with it; the
# calibrated plan is then planned once, `plan --costs costs-P.json`, so that every
# repeat trains the same plans: a check of how much of the prediction error is the
# machine's drift over the bench; the table says so).
# The machine's speed moves under the bench (a 3 s loop of arithmetic ran 3.0-4.6 s
# on 2026-12-02 minutes apart; skewed's calibrated plan at P = 2 measured 0.146 s a
# step in a bench and 0.106-0.118 s three hours later, predicted 0.1145 s from the
# bench's calibration): after each calibration and before every round of three runs a
# probe (PROBE_STEPS=160 timed steps of $OUT/probe-P.toml: P tables of 64 MiB, width
# 64, 8 Zipf ids per example, the planner's default plan) measures it, and the table
# adds the prediction error with each run's prediction scaled by the mean of the
# probe's seconds before and after its round over those after the calibration
# (PROBE=0: no probes). TABLE_ONLY=1 (with COMMIT=) rewrites the table from $OUT.
# Writes bench/costs.md (or $OUT/costs.md with QUICK=1: a tiny setting that checks
# the script in a minute: calibrate --quick, small models, a few steps).
# Run it on a quiet machine: the times are the point.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
QUICK="${QUICK:-0}"
RANKS="${RANKS:-2 4}"
OUT="${OUT:-out/bench-costs}"
if [[ $QUICK == 1 ]]; then
  STEPS="${STEPS:-4}"; WARM="${WARM:-2}"; SCALE="${SCALE:-0.01}"; PEER_SCALE="${PEER_SCALE:-0.01}"
  BATCH="${BATCH:-256}"; CAL=(--quick); MD="$OUT/costs.md"; SKEW_HOT=50000; SKEW_COLD=2000
  REPEATS="${REPEATS:-1}"; SKEW_MULT="${SKEW_MULT:-1}"
else
  STEPS="${STEPS:-60}"; WARM="${WARM:-10}"; SCALE="${SCALE:-0.1}"; PEER_SCALE="${PEER_SCALE:-1}"
  BATCH="${BATCH:-2048}"; CAL=(); MD="${MD:-bench/costs.md}"; SKEW_HOT=1000000; SKEW_COLD=20000
  REPEATS="${REPEATS:-3}"; SKEW_MULT="${SKEW_MULT:-4}"
fi
RECALIBRATE_EACH="${RECALIBRATE_EACH:-0}"
PROBE="${PROBE:-1}"; PROBE_STEPS="${PROBE_STEPS:-$([[ $QUICK == 1 ]] && echo 4 || echo 160)}"
mkdir -p "$OUT" bench "$(dirname "$MD")"
if [[ $(id -u) -eq 0 ]]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
export OPENBLAS_NUM_THREADS=1
cargo build --release --quiet
BIN=target/release/torusrec
MPI=(mpirun --oversubscribe --bind-to none -x OPENBLAS_NUM_THREADS)

# The skewed workload: 4 hot tables (long bags, wide) and 28 cold ones (one id, narrow).
{
  echo "n_dense = 13"
  echo "hidden = [256, 128]"
  echo "zipf = 1.05"
  for i in 0 1 2 3; do
    printf '[[table]]\nname = "hot%d"\nvocab = %d\ndim = 64\nvalency = 30.0\n' "$i" "$SKEW_HOT"
  done
  for i in $(seq 0 27); do
    printf '[[table]]\nname = "cold%d"\nvocab = %d\ndim = 16\nvalency = 1.0\n' "$i" "$SKEW_COLD"
  done
} > "$OUT/skewed.toml"

# probe LABEL P W REP: the probe (P tables of 64 MiB; QUICK: 1 MiB) trained for 10 +
# PROBE_STEPS steps at P ranks; a line of $PROBES: P, W, REP, LABEL, its seconds per
# step over the intervals after the first.
probe() {
  [[ $PROBE == 1 ]] || return 0
  local label=$1 np=$2 rows=262144 f="$OUT/probe-$2.toml"
  [[ $QUICK == 1 ]] && rows=4096
  {
    echo "n_dense = 13"; echo "hidden = [256, 128]"; echo "zipf = 1.05"
    for ((i = 0; i < np; i++)); do
      printf '[[table]]\nname = "probe%d"\nvocab = %d\ndim = 64\nvalency = 8.0\n' "$i" "$rows"
    done
  } > "$f"
  rm -f "$OUT/probe-$label.jsonl"
  "${MPI[@]}" -np "$np" "$BIN" embed --tables "$f" --batch "$BATCH" --steps $((10 + PROBE_STEPS)) --log-every 10 \
      --eval-examples 4096 --threads 1 --seed 1 --preload --metrics "$OUT/probe-$label.jsonl" > "$OUT/probe-$label.log" 2>&1 \
    || { echo "probe $label failed:"; tail -20 "$OUT/probe-$label.log"; exit 1; }
  python3 - "$OUT/probe-$label.jsonl" "$np" "$3" "$4" "$label" >> "$PROBES" <<'PY'
import json, sys
f, p, w, rep, label = sys.argv[1:]
iv = [r for r in map(json.loads, filter(str.strip, open(f))) if not r.get("final")][1:]
print(f"{p}\t{w}\t{rep}\t{label}\t{sum(r['seconds'] for r in iv) / sum(r['steps'] for r in iv):.6f}")
PY
}

# workload NAME: the model flags of a workload.
workload() {
  case $1 in
    torchrec-peer) echo "--preset torchrec-peer --scale $PEER_SCALE" ;;
    dlrm-synthetic) echo "--preset dlrm-synthetic --scale $SCALE" ;;
    skewed) echo "--tables $OUT/skewed.toml" ;;
  esac
}

# batch_for WORKLOAD P: the batch per rank. dlrm-synthetic keeps at P > 2 the global
# batch of P = 2 (2 x BATCH): at BATCH per rank on 4 ranks its memory estimate (8.8 GB
# a rank, most of it the lookups of a global batch of 8192) is over a quarter of this
# 23 GiB machine, and the run is refused.
batch_for() {
  if [[ $1 == dlrm-synthetic && $2 -gt 2 ]]; then echo $((BATCH * 2 / $2)); else echo "$BATCH"; fi
}

# mult_for WORKLOAD: how many times WARM and STEPS it runs. skewed's steps are a
# tenth of the others' (about 0.1 s at P = 2), so 30 of them are 3 s, and one slow
# second of this shared machine moved its measured step by a third between runs of
# the same plan: it runs SKEW_MULT times as many.
mult_for() {
  if [[ $1 == skewed ]]; then echo "$SKEW_MULT"; else echo 1; fi
}

# calibrate_to P FILE LOG: `torusrec calibrate` at P ranks into FILE.
calibrate_to() {
  "${MPI[@]}" -np "$1" "$BIN" calibrate "${CAL[@]}" --threads 1 --out "$2" --force > "$3" 2>&1 \
    || { echo "calibrate at $1 failed:"; tail -20 "$3"; exit 1; }
}

# train NAME NP PLAN MODEL...: one run with --costs; metrics in $OUT/NAME.jsonl.
train() {
  local name=$1 np=$2 plan=$3; shift 3
  rm -f "$OUT/$name.jsonl" "$OUT/$name.plan.json"
  "${MPI[@]}" -np "$np" "$BIN" embed "$@" --batch "$B" --steps $(((WARM + STEPS) * M)) --log-every $((WARM * M)) \
      --eval-examples 4096 --threads 1 --seed 1 --preload --plan "$plan" --plan-out "$OUT/$name.plan.json" \
      --costs "$COSTS" --metrics "$OUT/$name.jsonl" > "$OUT/$name.log" 2>&1 \
    || { local rc=$?; rm -f "$OUT/$name.jsonl"
         # Exit 2: refused before training (e.g. the memory estimate); a row says so.
         [[ $rc == 2 ]] && return 0
         echo "run $name failed:"; tail -20 "$OUT/$name.log"; exit 1; }
}

# run WORKLOAD P PLANNER REP NAME: a line of $RUNS (tab-separated) from a run's
# metrics, or why it did not run.
run() {
  if [[ ! -f "$OUT/$5.jsonl" ]]; then
    printf '%s\t%s\t%s\t%s\trefused (batch %s per rank): %s\n' "$1" "$2" "$3" "$4" "$B" \
      "$(grep -o 'torusrec: .*' "$OUT/$5.log" | head -1 | cut -c11-160 | tr '|\t' '/ ')"
    return
  fi
  B_USED="$B" python3 - "$@" "$OUT/$5.jsonl" "$OUT/$5.plan.json" <<'PY'
import hashlib, json, os, sys
w, p, planner, rep, _, f, plan = sys.argv[1:]
rows = [json.loads(l) for l in open(f) if l.strip()]
# The plan the run trained with (--plan-out), as a digest of its canonical JSON:
# runs of different planners with the same digest trained the same plan.
digest = hashlib.sha256(json.dumps(json.load(open(plan)), sort_keys=True).encode()).hexdigest()[:12]
fin = [r for r in rows if r.get("final")][-1]
iv = [r for r in rows if not r.get("final")][1:]
ex = sum(r["examples"] for r in iv) / max(sum(r["seconds"] for r in iv), 1e-12)
m = fin["measured"]
busy = m["busy_per_rank"]
cpu = m.get("busy_cpu_per_rank") or [float("nan")]
print("\t".join([w, p, planner, rep, f"{fin['predicted']['step']:.6f}",
                 f"{m['seconds_per_step']:.6f}", f"{max(busy):.6f}", f"{min(busy):.6f}",
                 f"{m['busy_max_over_min']:.4f}", f"{ex:.1f}",
                 f"{max(cpu):.6f}", f"{min(cpu):.6f}", f"{max(cpu) / min(cpu):.4f}",
                 os.environ["B_USED"], ",".join(f"{x:.6f}" for x in busy),
                 ",".join(f"{x:.6f}" for x in cpu), digest]))
PY
}

COMMIT="${COMMIT:-$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src || echo ' (with uncommitted changes)')}"
# shellcheck source=scripts/cpu_line.sh
. scripts/cpu_line.sh
CPU="$(cpu_line)"
RUNS="$OUT/costs-runs.tsv"
# KEEP_ROWS=1 adds to the runs of an earlier invocation (e.g. RANKS=4 run apart).
PROBES="$OUT/probes.tsv"
# TABLE_ONLY=1: only the table, from an earlier invocation's $OUT (COMMIT=... names
# the commit it measured).
if [[ ${TABLE_ONLY:-0} != 1 ]]; then
[[ "${KEEP_ROWS:-0}" == 1 ]] || : > "$RUNS"
[[ "${KEEP_ROWS:-0}" == 1 ]] || : > "$PROBES"
WORKLOADS="${WORKLOADS:-torchrec-peer dlrm-synthetic skewed}"
for P in $RANKS; do
  # RECALIBRATE=0 keeps an earlier invocation's costs-P.json (with KEEP_ROWS=1).
  [[ "${RECALIBRATE:-1}" == 0 && -f "$OUT/costs-$P.json" ]] ||
    calibrate_to "$P" "$OUT/costs-$P.json" "$OUT/calibrate-$P.log"
  probe "cal-$P" "$P" - 0
  for W in $WORKLOADS; do
    # shellcheck disable=SC2046
    model=( $(workload "$W") )
    B=$(batch_for "$W" "$P")
    M=$(mult_for "$W")
    "$BIN" plan "${model[@]}" --ranks "$P" --batch "$B" --seed 1 \
      --out "$OUT/$W-$P-analytic.json" --force > "$OUT/$W-$P-analytic-plan.log" 2>&1
    "$BIN" plan "${model[@]}" --ranks "$P" --batch "$B" --seed 1 --costs "$OUT/costs-$P.json" \
      --method lookup-greedy --out "$OUT/$W-$P-lookup.json" --force > "$OUT/$W-$P-lookup-plan.log" 2>&1
    calibrated=auto
    if [[ $RECALIBRATE_EACH == 1 ]]; then
      calibrated="$OUT/$W-$P-calibrated.json"
      "$BIN" plan "${model[@]}" --ranks "$P" --batch "$B" --seed 1 --costs "$OUT/costs-$P.json" \
        --out "$calibrated" --force > "$OUT/$W-$P-calibrated-plan.log" 2>&1
    fi
    for ((r = 1; r <= REPEATS; r++)); do
      COSTS="$OUT/costs-$P.json"
      if [[ $RECALIBRATE_EACH == 1 && $r -gt 1 ]]; then
        COSTS="$OUT/costs-$P-$W-r$r.json"
        calibrate_to "$P" "$COSTS" "$OUT/calibrate-$P-$W-r$r.log"
      fi
      probe "$W-$P-r$r" "$P" "$W" "$r"
      train "$W-$P-calibrated-r$r" "$P" "$calibrated" "${model[@]}"
      train "$W-$P-analytic-r$r" "$P" "$OUT/$W-$P-analytic.json" "${model[@]}"
      train "$W-$P-lookup-r$r" "$P" "$OUT/$W-$P-lookup.json" "${model[@]}"
      for k in calibrated analytic lookup; do
        name=$k; [[ $k == lookup ]] && name=lookup-greedy
        run "$W" "$P" "$name" "$r" "$W-$P-$k-r$r" >> "$RUNS"
      done
    done
  done
  probe "end-$P" "$P" - 0
done
fi

{
  echo "# Measured costs: predicted against measured step, and measured balance"
  echo
  echo "Measured $(date -u +%Y-%m-%d) at commit $COMMIT on $(nproc) cores ($CPU) by \`scripts/bench_costs.sh\`$([[ $QUICK == 1 ]] && echo ' (QUICK=1: the tiny check setting, not a benchmark)'). Batch $BATCH per rank, $WARM warm-up steps then $STEPS timed (the intervals after the first), --preload, 1 thread per rank, $REPEATS run(s) of each plan, interleaved (skewed: $SKEW_MULT times the warm-up and timed steps, as its steps are short); every rank is a process on this machine (oversubscribed beyond 2 ranks)."
  echo
  echo "Workloads: torchrec-peer (scale $PEER_SCALE), dlrm-synthetic (scale $SCALE), skewed (4 hot tables: $SKEW_HOT rows, width 64, 30 ids per example; 28 cold: $SKEW_COLD rows, width 16, 1 id; \`$OUT/skewed.toml\`)."
  if [[ $RECALIBRATE_EACH == 1 ]]; then
    echo "Planners: calibrated (\`plan --costs costs-P.json\`, once per workload), analytic (\`plan\` with the default constants), lookup-greedy (\`plan --method lookup-greedy\`). RECALIBRATE_EACH=1: \`calibrate\` ran again before every repeat after the first (per workload, \`costs-P-W-rN.json\`), and each repeat's three runs predict their step with that repeat's costs (\`--costs\`)."
  else
    echo "Planners: calibrated (\`embed --plan auto --costs\`), analytic (\`plan\` with the default constants), lookup-greedy (\`plan --method lookup-greedy\`); each run predicts its plan's step with the same measured costs (\`--costs\`)."
  fi
  echo "Busy: each rank's seconds per step in the embedding phases (lookup, pooling, backward) less its seconds inside their collectives: wall seconds, and CPU seconds of the rank's process (its CPU time in those phases less its CPU time inside their collectives; time the rank waited for a core, which the wall seconds count, is not in it). dlrm-synthetic at P > 2 keeps the global batch of P = 2 (batch column)."
  echo
  for P in $(ls "$OUT"/calibrate-*.log 2>/dev/null | grep -E 'calibrate-[0-9]+\.log$' | sed 's/.*calibrate-\([0-9]*\)\.log/\1/' | sort -n); do
    echo "Calibration at $P ranks (\`$OUT/costs-$P.json\`):"
    echo
    grep -E '^(calibrate|fit|passes):' "$OUT/calibrate-$P.log" | sed 's/^/    /'
    echo
  done
  python3 - "$RUNS" "$PROBES" <<'PY'
import statistics as st, sys
runs = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
probes = [l.rstrip("\n").split("\t") for l in open(sys.argv[2]) if l.strip()]
refused = [r for r in runs if r[4].startswith("refused")]
runs = [r for r in runs if not r[4].startswith("refused")]
# Per (workload, P, planner), in the order first run.
plans = {}
for r in runs:
    plans.setdefault((r[0], r[1], r[2]), []).append(r)
med = lambda rs, i: st.median(float(r[i]) for r in rs)
# The plan each run trained (a digest of its JSON; rows of an older script: the
# planner). Planners that made the same plan trained it in each of their runs: for
# the summaries their runs are pooled, so that the same plan is not compared with
# itself through the machine's noise.
digest = lambda r: r[16] if len(r) > 16 else r[2]
by_plan = {}
for r in runs:
    by_plan.setdefault((r[0], r[1], digest(r)), []).append(r)
def same(w, p, planner):
    """The runs of every planner that made `planner`'s plan, and those planners."""
    ds = {digest(r) for r in plans[(w, p, planner)]}
    if len(ds) != 1:
        return plans[(w, p, planner)], [planner]
    rs = by_plan[(w, p, ds.pop())]
    return rs, sorted({r[2] for r in rs})
def pooled(rs, i):
    """Max over min of each rank's busy seconds per step over all the plan's runs
    (the same plan, data and steps each run): none for rows of an older script."""
    if any(len(r) <= i for r in rs):
        return None
    per = [[float(x) for x in r[i].split(",")] for r in rs]
    tot = [sum(xs) for xs in zip(*per)]
    return max(tot) / min(tot) if min(tot) > 0 else float("inf")
def jackknife(rs, i):
    """The standard error of `pooled` over the runs (jackknife: leave one run out);
    none with fewer than 2 runs. The machine's noise, not the plan's: the same plan's
    runs differ only by it."""
    n = len(rs)
    if n < 2 or pooled(rs, i) is None:
        return None
    th = [pooled(rs[:k] + rs[k + 1:], i) for k in range(n)]
    mean = sum(th) / n
    return ((n - 1) / n * sum((t - mean) ** 2 for t in th)) ** 0.5
rng = lambda rs, i, f: f"{f % min(float(r[i]) for r in rs)}-{f % max(float(r[i]) for r in rs)}"
print("Per plan: the median over its runs (the range over them in brackets); error: predicted against the median measured step. "
      "Plan: a digest of the plan's JSON (`embed --plan-out`); planners with the same digest trained the same plan, and its busy max/min is over the runs of all of them. "
      "Busy max/min: over all the plan's runs, each rank's busy seconds summed over them, the largest over the smallest; "
      "then, in brackets, the median of the runs' own max/min and their range.")
print()
print("| workload | P | batch/rank | planner | plan | runs | predicted s/step | measured s/step | error % | busy max / min s | busy max/min | CPU busy max / min s | CPU busy max/min | examples/s |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
errs, ratio, cratio, rratio, rcratio, se, cse = [], {}, {}, {}, {}, {}, {}
fmt = lambda v: "-" if v is None else f"{v:.3f}"
for (w, p, planner), rs in plans.items():
    pred, meas = med(rs, 4), med(rs, 5)
    err = 100 * (pred - meas) / meas
    errs.append(abs(err))
    key = (w, p, planner)
    # The balance of the plan over every run of it (any planner's).
    srs, _ = same(w, p, planner)
    ratio[key], cratio[key] = pooled(srs, 14), pooled(srs, 15)
    se[key], cse[key] = jackknife(srs, 14), jackknife(srs, 15)
    rratio[key], rcratio[key] = med(srs, 8), med(srs, 12)
    print(f"| {w} | {p} | {rs[0][13]} | {planner} | `{digest(rs[0])[:8]}` | {len(rs)} | {pred:.4f} | {meas:.4f} ({rng(rs, 5, '%.4f')}) | {err:+.1f} | "
          f"{med(rs, 6):.4f} / {med(rs, 7):.4f} | **{fmt(ratio[key])}** ({med(rs, 8):.3f}; {rng(rs, 8, '%.3f')}) | "
          f"{med(rs, 10):.4f} / {med(rs, 11):.4f} | {fmt(cratio[key])} ({med(rs, 12):.3f}; {rng(rs, 12, '%.3f')}) | {med(rs, 9):.0f} ({rng(rs, 9, '%.0f')}) |")
seen = set()
for r in refused:
    if (r[0], r[1], r[2]) not in seen:
        seen.add((r[0], r[1], r[2]))
        print(f"| {r[0]} | {r[1]} | - | {r[2]} | - | - | {r[4][:170]} | - | - | - | - | - | - | - |")
print()
if errs:
    print(f"Prediction error |predicted - measured| / measured over {len(errs)} plans (medians of their runs): mean {sum(errs)/len(errs):.1f} %, worst {max(errs):.1f} % (target: 10 % mean, 20 % worst).")
    print()
    # Each distinct plan once, over the runs of every planner that made it (the
    # same plan and costs predict the same step).
    derrs, shared = [], []
    for (w, p, d), rs in by_plan.items():
        pred, meas = med(rs, 4), med(rs, 5)
        derrs.append(abs(100 * (pred - meas) / meas))
        names = sorted({r[2] for r in rs})
        if len(names) > 1:
            shared.append(f"{w} at P={p}: {' = '.join(names)} ({len(rs)} runs, {100 * (pred - meas) / meas:+.1f} %)")
    if len(derrs) != len(errs):
        print(f"Over the {len(derrs)} distinct plans (the runs of planners that made the same plan pooled): mean {sum(derrs)/len(derrs):.1f} %, worst {max(derrs):.1f} %. The same plan: " + "; ".join(shared) + ".")
        print()
# The machine's speed: the probe's seconds per step before each round over after
# the calibration at the same P (RECALIBRATE_EACH: the last calibration is not
# probed, so the one at the start of P stands for all).
# A round's speed: the mean of the probes before and after it (the next probe at the
# same P: the next round's, or the one after the last round), over the probe after
# the calibration; the before one alone where none follows (benches before the end
# probe).
cal = {q[0]: float(q[4]) for q in probes if q[3].startswith("cal-")}
rnd, around = {}, {}
for i, q in enumerate(probes):
    if q[3].startswith("cal-"):
        continue
    if not q[3].startswith("end-"):
        rnd[(q[0], q[1], q[2])] = float(q[4])
        nxt = probes[i + 1] if i + 1 < len(probes) else None
        after = float(nxt[4]) if nxt and nxt[0] == q[0] and not nxt[3].startswith("cal-") else None
        around[(q[0], q[1], q[2])] = float(q[4]) if after is None else (float(q[4]) + after) / 2
speed = lambda r: around[(r[1], r[0], r[3])] / cal[r[1]] if (r[1], r[0], r[3]) in around and r[1] in cal else None
if cal and rnd:
    print("Machine speed, the probe's seconds per step (P tables of 64 MiB, width 64, 8 Zipf ids per example; after each calibration, and before every round of the three planners' runs):")
    print()
    for p in sorted(cal, key=int):
        rs = sorted(((w, int(k), v) for (pp, w, k), v in rnd.items() if pp == p), key=lambda x: x[1])
        ws = []
        for w in dict.fromkeys(x[0] for x in rs):
            ws.append(f"{w} " + ", ".join(f"{v:.4f} ({v / cal[p]:.2f}x)" for ww, _, v in rs if ww == w))
        end = [float(q[4]) for q in probes if q[3] == f"end-{p}"]
        tail = f"; after the last round {end[0]:.4f} ({end[0] / cal[p]:.2f}x)" if end else ""
        print(f"- P={p}: after the calibration {cal[p]:.4f}; before the rounds: " + "; ".join(ws) + tail)
    print()
    serrs, lines = [], []
    for (w, p, planner), rs in plans.items():
        if any(speed(r) is None for r in rs):
            continue
        pred = st.median(float(r[4]) * speed(r) for r in rs)
        meas = med(rs, 5)
        e = 100 * (pred - meas) / meas
        serrs.append(abs(e))
        lines.append(f"{w} P={p} {planner} {e:+.1f}")
    if serrs:
        print(f"Prediction error with each run's prediction times the mean of the probe's seconds before and after its round over after the calibration (the machine's speed at the run, which no calibration can know), over {len(serrs)} plans: "
              f"mean {sum(serrs)/len(serrs):.1f} %, worst {max(serrs):.1f} % (" + "; ".join(lines) + ").")
        print()
for label, rat, err in (("busy max/min (wall) over all runs", ratio, se), ("CPU busy max/min over all runs", cratio, cse),
                        ("per-run busy max/min (wall), median of the runs", rratio, {}),
                        ("per-run CPU busy max/min, median of the runs", rcratio, {})):
    cal_ok, cal_best, cal_ok2, cal_best2 = [], [], [], []
    groups = {}
    for (w, p, planner), v in rat.items():
        if v is not None:
            groups.setdefault((w, p), {})[planner] = v
    if not groups:
        continue
    print(f"{label[0].upper()}{label[1:]}, per setting:")
    print()
    for (w, p), g in sorted(groups.items()):
        c = g.get("calibrated")
        if c is None:
            continue
        others = [v for k, v in g.items() if k != "calibrated"]
        cal_ok.append(c <= 1.05)
        cal_best.append(all(c <= o + 1e-9 for o in others))
        # Beyond the noise: by more than twice the standard error (of c - 1.05, of
        # c - o: the two planners' runs are independent).
        e = lambda k: err.get((w, p, k))
        if e("calibrated") is not None and all(e(k) is not None for k in g):
            cal_ok2.append(c - 1.05 <= 2 * e("calibrated"))
            cal_best2.append(all(c - v <= 2 * (e("calibrated") ** 2 + e(k) ** 2) ** 0.5
                                 for k, v in g.items() if k != "calibrated"))
        _, names = same(w, p, "calibrated")
        also = [k for k in names if k != "calibrated"]
        note = f" (the same plan as {' and '.join(also)}: their runs pooled)" if also else ""
        pm = lambda k: "" if e(k) is None else f" ± {e(k):.3f}"
        print(f"- {w} at P={p}: calibrated {c:.3f}{pm('calibrated')}{note}, "
              + ", ".join(f"{k} {v:.3f}{pm(k)}" for k, v in g.items() if k != "calibrated"))
    print()
    print(f"Calibrated {label}: <= 1.05 in {sum(cal_ok)} of {len(cal_ok)} settings; no worse than both others in {sum(cal_best)} of {len(cal_best)}.")
    if cal_ok2:
        print()
        print(f"The same within twice the standard error (± above: jackknife over the plan's runs, i.e. the machine's noise, as the runs of one plan differ only by it): "
              f"above 1.05 by more than that in {len(cal_ok2) - sum(cal_ok2)} of {len(cal_ok2)} settings; "
              f"worse than another planner by more than twice the standard error of the difference in {len(cal_best2) - sum(cal_best2)} of {len(cal_best2)}.")
    print()
for r in sorted(seen):
    print(f"- not run: {r[0]} at P={r[1]} ({r[2]}): refused before training (see the table)")
PY
} > "$MD"
echo "wrote $MD"
