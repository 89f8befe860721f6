#!/usr/bin/env bash
# Generation speed of the copying model against the independent model it replaced
# (issue 15: de-sparse no slower than 1.5x). For each round, `generate webgraph --preset
# PRESET` runs once with each model, the order alternating between rounds, on NP ranks;
# each output is deleted once its log is read (only the logs stay in OUT). Writes
# bench/generate.md (every pair, the medians and the spread of the per-round ratio).
#
#   scripts/bench_generate.sh                       # de-sparse at full size, 2 rounds
#   PRESET=in-dense SCALE=0.1 ROUNDS=3 scripts/bench_generate.sh
#
# Knobs: PRESET=de-sparse SCALE=1 ROUNDS=2 NP=2 OUT=out/bench-generate
#   REPORT=bench/generate.md TIMEOUT=3600 BIN (default target/release/torusrec; built
#   unless BUILD=0)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PRESET="${PRESET:-de-sparse}"
SCALE="${SCALE:-1}"
ROUNDS="${ROUNDS:-2}"
NP="${NP:-2}"
OUT="${OUT:-out/bench-generate}"
REPORT="${REPORT:-bench/generate.md}"
TIMEOUT="${TIMEOUT:-3600}"
SEED=42

log() { printf '[bench_generate %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "error: $*"; exit 1; }
if ! command -v cargo >/dev/null 2>&1 || ! command -v mpirun >/dev/null 2>&1; then
    bash scripts/install_deps.sh
fi
# shellcheck source=scripts/mpi_env.sh
. scripts/mpi_env.sh
# shellcheck source=scripts/cpu_line.sh
. scripts/cpu_line.sh
export OPENBLAS_NUM_THREADS=1
if [[ -z "${BIN:-}" ]]; then
    [[ "${BUILD:-1}" == 0 ]] || cargo build --release
    BIN=target/release/torusrec
fi
[[ -x "$BIN" ]] || die "$BIN not found"
mkdir -p "$OUT"
REV="$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src || echo '+dirty')"
STARTED="$(date -u +%Y-%m-%dT%H:%MZ)"
LOAD0="$(cut -d' ' -f1 /proc/loadavg)"

gen() { # model round -> "seconds peak-rss arcs" on stdout
    local model=$1 r=$2 data="$OUT/$1.h5" glog="$OUT/$1-r$2.log" extra=() t0 t1
    [[ $model == independent ]] && extra=(--model independent)
    rm -f "$data"
    t0=$(date +%s.%N)
    timeout --kill-after=30 "$TIMEOUT" mpirun --oversubscribe --bind-to none -x OPENBLAS_NUM_THREADS \
        -np "$NP" "$BIN" generate webgraph --preset "$PRESET" --scale "$SCALE" "${extra[@]}" \
        --seed $SEED --out "$data" >"$glog" 2>&1 || { tail -n 5 "$glog" >&2; die "$model round $r failed"; }
    t1=$(date +%s.%N)
    rm -f "$data"
    local rss arcs
    rss=$(grep -o 'peak RSS [0-9.]* [kMG]*i*B' "$glog" | tail -1 | sed 's/peak RSS //' || true)
    arcs=$(grep -o -- '-> K = [0-9]*: [0-9,]* nodes, [0-9,]* arcs' "$glog" | tail -1 | sed 's/.*nodes, //; s/ arcs//' || true)
    echo "$(echo "$t1 - $t0" | bc) ${rss// /_} ${arcs:-?}"
}

rows=()
for r in $(seq 1 "$ROUNDS"); do
    order="independent copying"
    (( r % 2 == 0 )) && order="copying independent"
    declare -A secs=()
    for m in $order; do
        log "round $r: $m ($PRESET, scale $SCALE, $NP ranks; load $(cut -d' ' -f1 /proc/loadavg))"
        read -r s rss arcs < <(gen "$m" "$r")
        secs[$m]=$s
        rows+=("| $r | $m | $(printf '%.1f' "$s") | ${rss//_/ } | $arcs |")
        log "  $m: $(printf '%.1f' "$s") s, peak RSS ${rss//_/ }, $arcs arcs"
    done
    ratios+=("$(echo "scale=4; ${secs[copying]} / ${secs[independent]}" | bc)")
    unset secs
done
LOAD1="$(cut -d' ' -f1 /proc/loadavg)"

summary=$(printf '%s\n' "${ratios[@]}" | sort -n | awk '{a[NR]=$1} END {
    m = (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2;
    printf "copying / independent wall time, median of %d rounds: %.2fx (%.2f-%.2f); target at most 1.5x: %s",
        NR, m, a[1], a[NR], (m <= 1.5 ? "met" : "not met") }')

{
    echo "# Generation speed: the copying model against the independent model"
    echo
    echo "torusrec $REV, $STARTED; $(cpu_line); $(nproc) cores; load average $LOAD0 at the start, $LOAD1 at the end."
    echo
    echo "Command: \`PRESET=$PRESET SCALE=$SCALE ROUNDS=$ROUNDS NP=$NP scripts/bench_generate.sh\`. Each round runs \`mpirun -np $NP torusrec generate webgraph --preset $PRESET --scale $SCALE --seed $SEED\` once with \`--model independent\` and once with the default copying model, the order alternating between rounds; wall time from the launch to the exit (the prepared dataset written, K = 0), the output deleted after each run. Peak RSS is the largest rank's, from the log."
    echo
    # The runs themselves keep the load near NP, so only the load at the start tells.
    if awk -v a="$LOAD0" 'BEGIN { exit !(a >= 1) }'; then
        echo "**Loaded**: other jobs shared the $(nproc) cores (the load averages above), so the seconds are not the quiet machine's; the alternated rounds' ratio is what this table measures."
        echo
    fi
    echo "| round | model | wall s | peak RSS/rank | arcs |"
    echo "|---|---|---|---|---|"
    printf '%s\n' "${rows[@]}"
    echo
    echo "$summary"
} >"$REPORT"
cat "$REPORT"
