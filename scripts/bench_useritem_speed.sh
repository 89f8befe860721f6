#!/usr/bin/env bash
# Seconds per epoch of torusrec against implicit 0.7.3 (issue 18's speed target), measured
# in alternating repeats so that a shared machine's load swings hit both systems alike:
# for each case and d, REPEATS rounds of one torusrec run and one implicit run (the order
# swapped every round), each the mean s/epoch of epochs 2..EPOCHS. Writes
# bench/useritem-speed.md: every round's pair, the median and spread of each system and of
# the per-round ratio.
#
#   scripts/bench_useritem_speed.sh
#   CASES="syn2m" DIMS=64 REPEATS=5 scripts/bench_useritem_speed.sh
#
# Cases: syn2m (scripts/gen_useritem.py 100k users x 20k items, 2M interactions), syn20m
# (1M x 200k, 20.1M), cnr-k1 (cnr-2000 at --min-links 1). Settings: each system's best of
# the 3x3 grids of bench/useritem.md (torusrec reg 0.003, alpha0 0.03; implicit reg 1,
# alpha 10) on the synthetic cases; on cnr-k1 torusrec's link-graph defaults (0.001,
# 0.001; docs/als.md "Defaults") and implicit's bench/als.md setting (0.01, 200).
# torusrec: mpirun -np P, --threads 1, CG 3 steps; implicit: CG 3 steps, P threads.
# Knobs: CASES="syn2m syn20m cnr-k1" DIMS="64 128" REPEATS=3 EPOCHS=5 P=2 OUT=out/bench-speed
#        PYTHON (with implicit, h5py) BIN (the torusrec binary).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

read -r -a CASES <<< "${CASES:-syn2m syn20m cnr-k1}"
read -r -a DIMS <<< "${DIMS:-64 128}"
REPEATS="${REPEATS:-3}" EPOCHS="${EPOCHS:-5}" P="${P:-2}" SEED=42
OUT="${OUT:-out/bench-speed}" PYTHON="${PYTHON:-python3}"
BIN="${BIN:-${CARGO_TARGET_DIR:-target}/release/torusrec}"
REPORT=bench/useritem-speed.md

log() { printf '[bench_useritem_speed %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
[[ -x "$BIN" ]] || die "$BIN not found (cargo build --release, or set BIN=)"
"$PYTHON" -c 'import implicit, h5py' 2>/dev/null || die "$PYTHON lacks implicit/h5py (pip install -r scripts/requirements-bench.txt)"
[[ $(id -u) -ne 0 ]] || export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 OMP_NUM_THREADS=1
MPIRUN=(timeout 3600 mpirun --oversubscribe --bind-to none -x OPENBLAS_NUM_THREADS -x MKL_NUM_THREADS -x OMP_NUM_THREADS)
mkdir -p "$OUT" bench
# shellcheck source=scripts/cpu_line.sh
. scripts/cpu_line.sh

dataset() { # case -> prepared file (made if missing)
    local c=$1 f="$OUT/$1.h5"
    if [[ ! -s "$f" ]]; then
        log "preparing $c"
        case $c in
            syn2m | syn20m)
                local u=100000 i=20000 n=2000000
                [[ $c == syn2m ]] || { u=1000000 i=200000 n=20100000; }
                "$PYTHON" scripts/gen_useritem.py --users $u --items $i --interactions $n --seed $SEED \
                    --out "$OUT/$c.tsv" >&2
                "$BIN" prepare --matrix user-item --format tsv --input "$OUT/$c.tsv" --seed $SEED \
                    --out "$f" --force > "$OUT/prepare-$c.log" 2>&1 || { cat "$OUT/prepare-$c.log" >&2; die "prepare $c failed"; } ;;
            cnr-k1)
                "$BIN" prepare --input tests/data/cnr-2000/cnr-2000 --format bv --min-links 1 --seed $SEED \
                    --out "$f" --force > "$OUT/prepare-$c.log" 2>&1 || { cat "$OUT/prepare-$c.log" >&2; die "prepare $c failed"; } ;;
            *) die "unknown case $c (syn2m, syn20m, cnr-k1)" ;;
        esac
    fi
    echo "$f"
}

settings() { # case -> "reg alpha0 ireg ialpha"
    case $1 in
        cnr-k1) echo "0.001 0.001 0.01 200" ;;
        *) echo "0.003 0.03 1 10" ;;
    esac
}

ours() { # data d reg w tag -> s/epoch
    local m="$OUT/$5.jsonl"
    rm -f "$m"
    "${MPIRUN[@]}" -np "$P" "$BIN" als --data "$1" --dim "$2" --epochs "$EPOCHS" --reg "$3" \
        --unobserved-weight "$4" --solver cg --cg-steps 3 --threads 1 --eval-every 0 --eval-rows 100 \
        --seed $SEED --metrics "$m" > "$OUT/$5.log" 2>&1 || { tail -n 5 "$OUT/$5.log" >&2; die "torusrec $5 failed"; }
    "$PYTHON" - "$m" <<'PY'
import json, sys
sys.path.insert(0, "scripts")
from bench_metrics import load_jsonl, train_seconds
epochs, _ = load_jsonl(sys.argv[1])
steady = epochs[1:] or epochs
print(f"{sum(train_seconds(e) for e in steady) / len(steady):.4f}")
PY
}

theirs() { # data d ireg ialpha tag -> s/epoch
    "$PYTHON" scripts/bench_useritem.py implicit "$1" --dim "$2" --epochs "$EPOCHS" --reg "$3" \
        --alpha "$4" --cg-steps 3 --threads "$P" --seed $SEED --eval-rows 100 --no-checks \
        --json "$OUT/$5.json" > "$OUT/$5.log" 2>&1 || { tail -n 5 "$OUT/$5.log" >&2; die "implicit $5 failed"; }
    "$PYTHON" -c "import json,sys; print(f\"{json.load(open(sys.argv[1]))['results'][0]['seconds_per_epoch_after_first']:.4f}\")" "$OUT/$5.json"
}

summary() { # "ours..." "theirs..." -> "median (min-max) | median (min-max) | ratio median (min-max)"
    "$PYTHON" - "$1" "$2" <<'PY'
import statistics as st, sys
a = [float(x) for x in sys.argv[1].split()]
b = [float(x) for x in sys.argv[2].split()]
r = [x / y for x, y in zip(a, b)]
f = lambda v, n: f"{st.median(v):.{n}f} ({min(v):.{n}f}-{max(v):.{n}f})"
print(f"{f(a, 3)} | {f(b, 3)} | **{f(r, 2)}**")
PY
}

{
    echo "# Seconds per epoch, torusrec / implicit, alternated repeats (issue 18)"
    echo
    echo "Measured $(date -u +%Y-%m-%dT%H:%MZ) at torusrec $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src || echo '+dirty'); $(cpu_line); $(nproc) cores, load $(cut -d' ' -f1 /proc/loadavg) at the start; implicit $("$PYTHON" -c 'import implicit; print(implicit.__version__)')."
    echo
    echo "Each round runs torusrec (\`mpirun -np $P als --threads 1 --solver cg --cg-steps 3\`) and implicit (CG 3 steps, $P threads) once, in alternating order; s/epoch is the mean of epochs 2..$EPOCHS, evaluation excluded. The target: torusrec at most 0.3x implicit's seconds (cnr-k1: 0.25x). Settings in the script's header."
    echo
    echo "| case | d | rounds: torusrec / implicit s/epoch | torusrec median (min-max) | implicit median (min-max) | ratio median (min-max) |"
    echo "|---|---|---|---|---|---|"
} > "$REPORT.part"

for c in "${CASES[@]}"; do
    data=$(dataset "$c")
    read -r R W IR IA <<< "$(settings "$c")"
    for d in "${DIMS[@]}"; do
        [[ $c != cnr-k1 || $d == 128 ]] || continue  # bench/als.md's headline is d = 128
        a=() b=() pairs=()
        for ((k = 1; k <= REPEATS; k++)); do
            if ((k % 2)); then
                x=$(ours "$data" "$d" "$R" "$W" "$c-d$d-t$k"); y=$(theirs "$data" "$d" "$IR" "$IA" "$c-d$d-i$k")
            else
                y=$(theirs "$data" "$d" "$IR" "$IA" "$c-d$d-i$k"); x=$(ours "$data" "$d" "$R" "$W" "$c-d$d-t$k")
            fi
            log "$c d=$d round $k: torusrec $x s/epoch, implicit $y s/epoch"
            a+=("$x") b+=("$y") pairs+=("$x / $y")
        done
        joined=$(printf '%s; ' "${pairs[@]}")
        echo "| $c | $d | ${joined%; } | $(summary "${a[*]}" "${b[*]}") |" >> "$REPORT.part"
    done
done
{
    echo
    echo "Load at the end: $(cut -d' ' -f1 /proc/loadavg)."
    echo
    echo "Reproduce: \`CASES=\"${CASES[*]}\" DIMS=\"${DIMS[*]}\" REPEATS=$REPEATS EPOCHS=$EPOCHS P=$P PYTHON=... scripts/bench_useritem_speed.sh\`"
} >> "$REPORT.part"
mv "$REPORT.part" "$REPORT"
cat "$REPORT"
