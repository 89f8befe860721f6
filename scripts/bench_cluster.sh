#!/usr/bin/env bash
# Cluster benchmark (issue 19) on network-namespace hosts (scripts/netcluster.sh,
# docs/cluster.md) -> bench/cluster.md. Run as root (namespaces, tc).
#
#   scripts/bench_cluster.sh                         # defaults below (the reduced run)
#   ALS_EPOCHS=8 EMBED_STEPS=300 WG_SCALE=0.1 scripts/bench_cluster.sh   # a quiet machine
#
# 1. Scaling: iALS on cnr-2000 K=1 and on a `generate webgraph` in-dense variant, and the
#    embedding model (preset torchrec-peer), on 2 and 4 hosts with one rank each, beside
#    the same ranks on one host; seconds per epoch / step at each link rate; bytes on the
#    wire (sum over hosts of eth0's tx_bytes during the run) beside torusrec's own
#    counters (the INFO "comm ..." lines' bytes sent, all ranks; rank 0's "exchanged")
#    and `torusrec project`'s per-link prediction. All hosts share this machine's cores.
# 2. Failure: on 2 hosts, kill -9 of host 2's rank and a cut of host 2's link after the
#    first checkpoint: seconds to the last rank's exit and to mpirun's end; then a
#    restart with 1 rank on 1 host (--resume auto): seconds to the first new epoch/step,
#    and the work lost (epochs/steps done before the failure less the checkpoint's).
# 3. Checkpoints: scripts/bench_ckpt.sh (full vs delta) when `embed --help` lists
#    --checkpoint-full-every; otherwise a line saying so.
#
# Link rates: netcluster.sh's --rate uses netem; where the kernel has no sch_netem
# ("Specified qdisc kind is unknown") this script shapes each host's eth0 and the
# switch's port to it with tbf (token bucket, burst = 10 ms of the rate) itself.
#
# Knobs (environment):
#   RATES="10gbit 25gbit"  HOSTS="2 4"  DIM=128  ALS_EPOCHS=3  EVAL_ROWS=1000
#   WG_SCALE=0.01 (in-dense x WG_SCALE)  EMBED_STEPS=40  EMBED_LOG=10  EMBED_BATCH=512
#   FAILS="cnr-k1:kill cnr-k1:cut embed:kill"  FAIL_EPOCHS=200 FAIL_STEPS=2000 (long enough to be killed)  COMM_TIMEOUT=5 (cut)
#   SECTIONS="scale fail ckpt"  WORKLOADS="cnr-k1 in-dense embed" (scaling section)  TIMEOUT=600 (seconds per run)  OUT=out/bench-cluster
#   BIN=target/release/torusrec (built with `cargo build --release` when missing)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
HERE=$PWD

RATES="${RATES:-10gbit 25gbit}"
HOSTS="${HOSTS:-2 4}"
DIM="${DIM:-128}"
ALS_EPOCHS="${ALS_EPOCHS:-3}"
EVAL_ROWS="${EVAL_ROWS:-1000}"
WG_SCALE="${WG_SCALE:-0.01}"
EMBED_STEPS="${EMBED_STEPS:-40}"
EMBED_LOG="${EMBED_LOG:-10}"
EMBED_BATCH="${EMBED_BATCH:-512}"
FAIL_EPOCHS="${FAIL_EPOCHS:-200}"
FAIL_STEPS="${FAIL_STEPS:-2000}"
COMM_TIMEOUT="${COMM_TIMEOUT:-5}"
SECTIONS="${SECTIONS:-scale fail ckpt}"
WORKLOADS="${WORKLOADS:-cnr-k1 in-dense embed}"
FAILS="${FAILS:-cnr-k1:kill cnr-k1:cut embed:kill}"
TIMEOUT="${TIMEOUT:-600}"
OUT="${OUT:-out/bench-cluster}"
BIN="${BIN:-target/release/torusrec}"
SEED=42
NC="$HERE/scripts/netcluster.sh"
MD=bench/cluster.md

log() { printf '[bench_cluster %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

[[ $(id -u) -eq 0 ]] || die "run as root (network namespaces and tc)"
# shellcheck source=scripts/mpi_env.sh
. scripts/mpi_env.sh
# shellcheck source=scripts/cpu_line.sh
. scripts/cpu_line.sh
export OPENBLAS_NUM_THREADS=1
if [[ ! -x $BIN ]]; then cargo build --release --quiet; fi
[[ -x $BIN ]] || die "$BIN not found"
BIN=$(realpath "$BIN")
mkdir -p "$OUT" bench
# One cluster per machine (netcluster.sh's state is global), and `down` kills every
# process in it: never take down a cluster this script did not bring up.
if ip netns list 2>/dev/null | grep -qE '^trc-'; then
    die "a netcluster is up (another user's test?): wait for it to end, or run scripts/netcluster.sh down if it is stale"
fi
MINE=0
STAMP=""
stamp() { stat -c '%i %Y' /run/torusrec-netcluster/hosts 2>/dev/null || true; }
down() { # only a cluster this script brought up (another user's `down` + `up` may have replaced it)
    if [[ $MINE == 1 && "$(stamp)" == "$STAMP" ]]; then "$NC" down >/dev/null 2>&1 || true; fi
    MINE=0
}
mine() {
    MINE=1
    STAMP=$(stamp)
}
trap down EXIT
trap 'down; exit 130' INT TERM

# --- the cluster ----------------------------------------------------------------------
rate_bytes() { # 10gbit -> bytes per second
    local r=${1,,}
    case $r in
    *gbit) echo $((${r%gbit} * 125000000)) ;;
    *mbit) echo $((${r%mbit} * 125000)) ;;
    *) die "rate '$1': expected Ngbit or Nmbit" ;;
    esac
}

up() { # N RATE ("none": unshaped)
    local n=$1 rate=$2 k burst
    down
    if [[ $rate == none ]]; then
        "$NC" up "$n" >/dev/null || die "netcluster up $n failed"
        mine
        return 0
    fi
    if "$NC" up "$n" --rate "$rate" >/dev/null 2>"$OUT/up.err"; then
        mine
        if grep -q "shaped with tbf" "$OUT/up.err"; then
            SHAPER="tbf (no sch_netem in this kernel: netcluster.sh --rate falls back to tbf, burst 10 ms of the rate, on each host's eth0 and the switch's port)"
        fi
        return 0
    fi
    # netcluster.sh's own ERR trap removed what it made.
    grep -q "qdisc kind is unknown" "$OUT/up.err" || { cat "$OUT/up.err" >&2; die "netcluster up $n failed"; }
    "$NC" up "$n" >/dev/null || die "netcluster up $n failed"
    mine
    burst=$(($(rate_bytes "$rate") / 100))
    for ((k = 1; k <= n; k++)); do
        ip netns exec "trc-h$k" tc qdisc replace dev eth0 root tbf rate "$rate" burst "$burst" latency 50ms
        ip netns exec trc-sw tc qdisc replace dev "p$k" root tbf rate "$rate" burst "$burst" latency 50ms
    done
    SHAPER="tbf (no sch_netem in this kernel: netcluster.sh --rate fails, so the script shapes with tbf, burst 10 ms of the rate, on each host's eth0 and the switch's port)"
}
SHAPER="netem (netcluster.sh --rate)"

wire_tx() { # the sum over hosts of eth0's tx_bytes
    { "$NC" bytes 2>/dev/null || true; } | awk 'NR > 1 { s += $2 } END { printf "%.0f\n", s }'
}

torusrec_pids() { # host -> the torusrec processes in it
    local p
    for p in $("$NC" pids "$1" 2>/dev/null); do
        [[ $(cat "/proc/$p/comm" 2>/dev/null) == torusrec ]] && echo "$p"
    done
    return 0
}

# --- datasets -------------------------------------------------------------------------
CNR="$OUT/cnr-k1.h5"
WG="$OUT/in-dense-$WG_SCALE.h5"
[[ -s $CNR ]] || timeout "$TIMEOUT" "$BIN" prepare --input tests/data/cnr-2000/cnr-2000 --format bv \
    --min-links 1 --seed "$SEED" --out "$CNR" --force >"$OUT/prep-cnr.log" 2>&1 || die "prepare cnr-k1"
[[ -s $WG ]] || timeout "$TIMEOUT" "$BIN" generate webgraph --preset in-dense --scale "$WG_SCALE" \
    --seed "$SEED" --out "$WG" --force >"$OUT/prep-wg.log" 2>&1 || die "generate webgraph"

workload_args() { # name -> the torusrec arguments
    case $1 in
    cnr-k1) echo "als --data $CNR --dim $DIM --epochs $ALS_EPOCHS --threads 1 --eval-rows $EVAL_ROWS --seed $SEED" ;;
    in-dense) echo "als --data $WG --dim $DIM --epochs $ALS_EPOCHS --threads 1 --eval-rows $EVAL_ROWS --seed $SEED" ;;
    embed) echo "embed --preset torchrec-peer --batch $EMBED_BATCH --steps $EMBED_STEPS --log-every $EMBED_LOG --threads 1 --seed 1 --eval-examples 4096" ;;
    esac
}

# parse LOG.out LOG.err -> "seconds_per_unit exchanged_bytes comm_sent_bytes"
parse() {
    python3 - "$1" "$2" <<'PY'
import re, sys
U = {"B": 1, "kB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12}
out, err = open(sys.argv[1]).read(), open(sys.argv[2]).read()
ep = re.findall(r"^epoch\s+\d+/\d+\s.*?([\d.]+) s\s+[\d.]+M edges/s\s+exchanged ([\d.]+) (\w?B)", out, re.M)
st = re.findall(r"^step\s+(\d+)/\d+\s.*?([\d.]+) s/step\s+exchanged ([\d.]+) (\w?B)/step", out, re.M)
if ep:  # mean seconds over epochs 2..N; exchanged summed over all epochs
    secs = [float(s) for s, _, _ in ep]
    per = sum(secs[1:]) / max(1, len(secs) - 1) if len(secs) > 1 else secs[0]
    exch = sum(float(v) * U[u] for _, v, u in ep)
elif st:  # the log intervals after the first; bytes per step x steps
    steps = [int(s) for s, _, _, _ in st]
    spans = [b - a for a, b in zip([0] + steps, steps)]
    rows = list(zip(spans, st))[1:] or list(zip(spans, st))
    per = sum(n * float(r[1]) for n, r in rows) / sum(n for n, _ in rows)
    exch = sum(n * float(r[2]) * U[r[3]] for n, r in zip(spans, st))
else:
    print("nan nan nan"); sys.exit()
comm = sum(float(v) * U[u] for v, u in re.findall(r"INFO\s+comm \w+: \d+ calls, ([\d.]+) (\w?B) sent", err))
print(f"{per:.4g} {exch:.0f} {comm:.0f}")
PY
}

ROWS="$OUT/scale.tsv"
run_scale() { # workload hosts ranks rate
    local w=$1 h=$2 np=$3 rate=$4 name a0 a1 t0 t1 rc=0
    name="$w-h$h-p$np-$rate"
    up "$h" "$rate"
    # shellcheck disable=SC2046
    set -- $(workload_args "$w")
    a0=$(wire_tx)
    t0=$(date +%s.%N)
    timeout "$TIMEOUT" "$NC" mpirun -np "$np" --oversubscribe "$BIN" "$@" >"$OUT/$name.out" 2>"$OUT/$name.err" || rc=$?
    t1=$(date +%s.%N)
    a1=$(wire_tx)
    down
    if [[ $rc -ne 0 ]]; then
        log "$name failed (exit $rc; $OUT/$name.err)"
        echo -e "$w\t$h\t$np\t$rate\tfailed($rc)\t-\t-\t-\t-" >>"$ROWS"
        return 0
    fi
    read -r per exch comm < <(parse "$OUT/$name.out" "$OUT/$name.err")
    echo -e "$w\t$h\t$np\t$rate\t$per\t$(awk -v a="$a0" -v b="$a1" 'BEGIN{printf "%.0f", b-a}')\t$comm\t$exch\t$(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.1f", b-a}')" >>"$ROWS"
    log "$name: $per s/unit, wire $((a1 - a0)) B, comm $comm B, exchanged $exch B"
}

project_rows() { # workload ranks rate -> project's table rows for that torus
    local w=$1 np=$2 rate=$3 gbs
    gbs=$(awk -v b="$(rate_bytes "$rate")" 'BEGIN{print b/1e9}')
    case $w in
    cnr-k1) "$BIN" project als --data "$CNR" --dim "$DIM" --exchange dedup --shapes "${np}x1" --link-gbs "$gbs" ;;
    in-dense) "$BIN" project als --data "$WG" --dim "$DIM" --exchange dedup --shapes "${np}x1" --link-gbs "$gbs" ;;
    embed) "$BIN" project embed --preset torchrec-peer --batch "$EMBED_BATCH" --shapes "${np}x1" --link-gbs "$gbs" ;;
    esac 2>&1 | grep -E '^\|' || true
}

section_scale() {
    : >"$ROWS"
    local w h r
    for w in $WORKLOADS; do
        for h in $HOSTS; do
            run_scale "$w" 1 "$h" none
            for r in $RATES; do run_scale "$w" "$h" "$h" "$r"; done
        done
    done
}

# --- failure --------------------------------------------------------------------------
FROWS="$OUT/fail.tsv"
count_units() { grep -cE '^(epoch|step)\s+[0-9]+/' "$1" || true; }

run_fail() { # workload kill|cut
    local w=$1 how=$2 name dir ck args t0 tl tm done_units rc=0 first lost tr
    name="fail-$w-$how"
    dir="$OUT/$name"
    ck="$dir/ckpt"
    rm -rf "$dir"
    mkdir -p "$dir"
    case $w in
    cnr-k1) args="als --data $CNR --dim $DIM --epochs $FAIL_EPOCHS --threads 1 --eval-rows $EVAL_ROWS --seed $SEED --checkpoint-every 1" ;;
    embed) args="embed --preset torchrec-peer --global-batch $((2 * EMBED_BATCH)) --steps $FAIL_STEPS --log-every 1 --threads 1 --seed 1 --eval-examples 4096 --checkpoint-every 50" ;;
    esac
    [[ $how == cut ]] && args="$args --comm-timeout $COMM_TIMEOUT"
    up 2 "${RATES%% *}"
    # shellcheck disable=SC2086
    timeout "$TIMEOUT" "$NC" mpirun -np 2 "$BIN" $args --checkpoint-dir "$ck" --resume auto \
        >"$dir/out" 2>"$dir/err" &
    local job=$! t=0
    until compgen -G "$ck/*.h5" >/dev/null; do
        sleep 0.2
        t=$((t + 1))
        kill -0 "$job" 2>/dev/null || { log "$name: the run ended before a checkpoint"; return 0; }
        ((t < TIMEOUT * 5)) || { log "$name: no checkpoint"; return 0; }
    done
    # A few units past the checkpoint, so that some work is lost.
    local seen
    seen=$(count_units "$dir/out")
    while (($(count_units "$dir/out") < seen + 2)) && kill -0 "$job" 2>/dev/null; do sleep 0.1; done
    done_units=$(count_units "$dir/out")
    t0=$(date +%s.%N)
    if [[ $how == kill ]]; then
        # shellcheck disable=SC2046
        kill -9 $(torusrec_pids 2)
    else
        "$NC" link 2 down
    fi
    while [[ -n "$(torusrec_pids 1)$(torusrec_pids 2)" ]]; do sleep 0.1; done
    tl=$(date +%s.%N)
    wait "$job" || rc=$?
    tm=$(date +%s.%N)
    local lostline
    lostline=$(grep -m1 -o 'lost rank [^(]*(host [^)]*)' "$dir/err" || echo "no lost-rank line")
    # Restart: 1 rank on 1 host from the last committed checkpoint.
    down
    up 1 none
    local t2 t3=""
    t2=$(date +%s.%N)
    # shellcheck disable=SC2086
    timeout "$TIMEOUT" "$NC" mpirun -np 1 "$BIN" $args --checkpoint-dir "$ck" --resume auto \
        >"$dir/rout" 2>"$dir/rerr" &
    local rjob=$!
    while kill -0 "$rjob" 2>/dev/null; do
        if grep -qE '^(epoch|step)\s+[0-9]+/' "$dir/rout"; then t3=$(date +%s.%N); break; fi
        sleep 0.1
    done
    kill -- "$rjob" 2>/dev/null || true
    down
    wait "$rjob" 2>/dev/null || true
    first=$(grep -m1 -oE '^(epoch|step)\s+[0-9]+' "$dir/rout" | awk '{print $2}' || true)
    if [[ -n $first && -n $t3 ]]; then
        lost=$((done_units - (first - 1)))
        tr=$(awk -v a="$t2" -v b="$t3" 'BEGIN{printf "%.1f", b-a}')
    else
        lost="-" tr="-"
    fi
    local unit=epochs ckat="-"
    [[ -n $first ]] && ckat=$((first - 1))
    [[ $w == embed ]] && unit=steps
    echo -e "$w\t$how\t$(awk -v a="$t0" -v b="$tl" 'BEGIN{printf "%.1f", b-a}')\t$(awk -v a="$t0" -v b="$tm" 'BEGIN{printf "%.1f", b-a}')\t$rc\t$lostline\t$tr\t$lost $unit (done $done_units, checkpoint at $ckat)" >>"$FROWS"
    log "$name: done"
}

section_fail() {
    : >"$FROWS"
    local f
    for f in $FAILS; do run_fail "${f%%:*}" "${f#*:}"; done
}

# --- report ---------------------------------------------------------------------------
[[ " $SECTIONS " == *" scale "* ]] && section_scale
[[ " $SECTIONS " == *" fail "* ]] && section_fail
CKPT_LINE="Not run in this invocation (SECTIONS=\"$SECTIONS\"): the full vs delta table is [ckpt.md](ckpt.md)'s embedding section (\`PART=embed scripts/bench_ckpt.sh\`)."
if [[ " $SECTIONS " == *" ckpt "* ]] && ! "$BIN" embed --help | grep -q -- '--checkpoint-full-every'; then
    CKPT_LINE="The checkpoint section (full vs delta, scripts/bench_ckpt.sh) needs \`torusrec embed --checkpoint-full-every\` (incremental checkpoints), which this binary's \`embed --help\` does not list: not measured here."
elif [[ " $SECTIONS " == *" ckpt "* ]]; then
    log "checkpoints: scripts/bench_ckpt.sh"
    if BIN="$BIN" bash scripts/bench_ckpt.sh >"$OUT/ckpt.log" 2>&1; then
        CKPT_LINE="Measured by \`scripts/bench_ckpt.sh\` (full vs delta, every 50 steps, restore): see [ckpt.md](ckpt.md)."
    else
        CKPT_LINE="scripts/bench_ckpt.sh failed (log $OUT/ckpt.log)."
    fi
fi

{
    echo "# Cluster benchmark: namespace hosts, link rates, failures (issue 19)"
    echo
    echo "Measured $(date -u +%Y-%m-%d) at commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src || echo ' (uncommitted changes in src)') with \`scripts/bench_cluster.sh\`"
    echo "(RATES=\"$RATES\" HOSTS=\"$HOSTS\" DIM=$DIM ALS_EPOCHS=$ALS_EPOCHS EVAL_ROWS=$EVAL_ROWS WG_SCALE=$WG_SCALE EMBED_STEPS=$EMBED_STEPS EMBED_LOG=$EMBED_LOG EMBED_BATCH=$EMBED_BATCH),"
    echo "$(nproc) cores: $(cpu_line); load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)."
    echo
    echo "**All hosts share the machine's $(nproc) cores**: an N-host run is N processes on the same cores with"
    echo "a real TCP stack (and shaping) between them; the load average above says how quiet the machine"
    echo "was. Compare rows within this file only. Link shaping: $SHAPER."
    echo
    echo "## Scaling: one rank per host vs the same ranks on one host"
    echo
    echo "cnr-k1: cnr-2000 K=1 (\`prepare --min-links 1\`); in-dense: \`generate webgraph --preset in-dense --scale $WG_SCALE\`;"
    echo "both \`als --dim $DIM --epochs $ALS_EPOCHS --threads 1\`, s/unit = mean seconds per epoch over epochs 2..N."
    echo "embed: \`embed --preset torchrec-peer --batch $EMBED_BATCH --steps $EMBED_STEPS\`, s/unit = seconds per step over the log intervals after the first."
    echo "wire B = the sum over hosts of eth0's tx_bytes during the run (MPI, mpirun's out-of-band traffic, TCP/IP headers);"
    echo "comm B = the sum of torusrec's INFO \`comm <phase>: ... sent\` lines (all ranks, every phase incl. eval);"
    echo "exchanged B = rank 0's epoch/step lines' \"exchanged\" summed over the run. One host (rate -) talks over the host's own"
    echo "stack (not shaped)."
    echo
    echo "| workload | hosts | ranks | rate | s/unit | wire B | comm B | exchanged B | run s |"
    echo "|---|---|---|---|---|---|---|---|---|"
    if [[ -s $ROWS ]]; then sed 's/\tnone\t/\t-\t/; s/\t/ | /g; s/^/| /; s/$/ |/' "$ROWS"; fi
    echo
    echo "\`torusrec project\` for the same workloads (torus Nx1, \`--link-gbs\` = the rate; no calibration, so communication only; bytes per epoch/step):"
    echo
    for w in $WORKLOADS; do
        for h in $HOSTS; do
            for r in ${RATES%% *}; do
                echo "- $w, ${h}x1, $r:"
                echo
                project_rows "$w" "$h" "$r" | sed 's/^/  /'
                echo
            done
        done
    done
    echo "## Failure on 2 hosts"
    echo
    echo "After the first checkpoint and 2 more epochs/steps: \`kill -9\` of host 2's rank, or \`netcluster.sh link 2 down\`"
    echo "(with \`--comm-timeout $COMM_TIMEOUT\`); then a restart with 1 rank on 1 host, \`--resume auto\`. iALS checkpoints every epoch,"
    echo "embed (torchrec-peer, \`--global-batch $((2 * EMBED_BATCH))\`, so that the restart on 1 rank trains the same steps) every 50 steps. \"to last exit\": from the kill/cut until no torusrec process is"
    echo "left on either host; \"to mpirun end\": until mpirun returned; restart s: from the restart's launch to its first epoch/step line."
    echo
    echo "| workload | failure | to last exit s | to mpirun end s | mpirun exit | named | restart to first new unit s | work lost |"
    echo "|---|---|---|---|---|---|---|---|"
    if [[ -s $FROWS ]]; then sed 's/\t/ | /g; s/^/| /; s/$/ |/' "$FROWS"; fi
    echo
    echo "## Checkpoints: full vs delta"
    echo
    echo "$CKPT_LINE"
} >"$MD"
log "wrote $MD"
