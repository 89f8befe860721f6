#!/usr/bin/env bash
# User-item benchmark (issue 18): torusrec iALS vs implicit 0.7.3 on MovieLens
# ml-latest-small and a synthetic power-law users x items matrix, same split, scored by
# the same Python code (scripts/bench_useritem.py: Recall@20, NDCG@20), -> bench/useritem.md.
#
#   scripts/bench_useritem.sh                       # ml grid + best at d=64,128 + synthetic
#   SYN_USERS=1000000 SYN_ITEMS=200000 SYN_INTERACTIONS=20000000 scripts/bench_useritem.sh
#
# Knobs: EPOCHS=16 CG_STEPS=3 P=2 (torusrec ranks, 1 thread each, OPENBLAS_NUM_THREADS=1;
# implicit: P threads)  GRID_REGS / GRID_WEIGHTS (torusrec --reg x --unobserved-weight),
# GRID_IREGS / GRID_IALPHAS (implicit), DIMS="64 128", SYN=1 (0: skip the synthetic),
# SYN_USERS=100000 SYN_ITEMS=20000 SYN_INTERACTIONS=2000000 SYN_EPOCHS=8 SYN_EVAL_ROWS=2000
# SYN_DIMS="64 128", SYN_GRID=1 (the same 3x3 grids at SYN_GRID_DIM, default SYN_DIMS[0], on the synthetic; 0: take
# the settings of the case SYN_BEST_FROM, default ml-grid, e.g. syn-2000000-grid), RUN_ML=1 (0: keep results.jsonl, reuse its ml grid's best), OUT=out/bench-useritem, PYTHON, BIN, ML=path of ratings.csv.
# The synthetic matrix: scripts/gen_useritem.py (a seeded Python generator).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

EPOCHS="${EPOCHS:-16}" CG_STEPS="${CG_STEPS:-3}" P="${P:-2}" SEED=42
read -r -a GRID_REGS <<< "${GRID_REGS:-0.003 0.01 0.03}"
read -r -a GRID_WEIGHTS <<< "${GRID_WEIGHTS:-0.03 0.1 0.3}"
GRID_IREGS="${GRID_IREGS:-0.1,1,10}" GRID_IALPHAS="${GRID_IALPHAS:-1,3,10}"
read -r -a DIMS <<< "${DIMS:-64 128}"
SYN="${SYN:-1}" SYN_USERS="${SYN_USERS:-100000}" SYN_ITEMS="${SYN_ITEMS:-20000}"
SYN_INTERACTIONS="${SYN_INTERACTIONS:-2000000}" SYN_EPOCHS="${SYN_EPOCHS:-8}" SYN_EVAL_ROWS="${SYN_EVAL_ROWS:-2000}"
read -r -a SYN_DIMS <<< "${SYN_DIMS:-64 128}"
SYN_GRID="${SYN_GRID:-1}" SYN_BEST_FROM="${SYN_BEST_FROM:-ml-grid}" SYN_GRID_DIM="${SYN_GRID_DIM:-${SYN_DIMS[0]}}"
OUT="${OUT:-out/bench-useritem}" PYTHON="${PYTHON:-python3}"
BIN="${BIN:-${CARGO_TARGET_DIR:-target}/release/torusrec}"
ML="${ML:-../shared/data/ml-latest-small/ratings.csv}"

log() { printf '[bench_useritem %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
[[ -x "$BIN" ]] || die "$BIN not found (cargo build --release, or set BIN=)"
"$PYTHON" -c 'import implicit, h5py' 2>/dev/null || die "$PYTHON lacks implicit/h5py (pip install -r scripts/requirements-bench.txt)"
[[ $(id -u) -ne 0 ]] || export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 OMP_NUM_THREADS=1
MPIRUN=(mpirun --oversubscribe --bind-to none -x OPENBLAS_NUM_THREADS -x MKL_NUM_THREADS -x OMP_NUM_THREADS)
mkdir -p "$OUT" bench
RESULTS="$OUT/results.jsonl"
# RUN_ML=0: skip ml-latest-small and keep the results file (its ml-grid rows give the
# best settings the synthetic runs use), e.g. to add a larger synthetic run to the report
RUN_ML="${RUN_ML:-1}"
[[ "$RUN_ML" == 0 ]] || : > "$RESULTS"

ours() { # data tag d reg weight epochs [eval-rows]: train with torusrec, score with the script
    local data=$1 tag=$2 d=$3 reg=$4 w=$5 epochs=$6 rows=${7:-all}
    local base="$OUT/$tag-torusrec-d$d-r$reg-a$w"
    log "torusrec $tag d=$d reg=$reg alpha0=$w P=$P"
    rm -f "$base.jsonl"
    "${MPIRUN[@]}" -np "$P" "$BIN" als --data "$data" --dim "$d" --epochs "$epochs" --reg "$reg" \
        --unobserved-weight "$w" --solver cg --cg-steps "$CG_STEPS" --threads 1 --eval-every 0 \
        --eval-rows "$rows" --seed "$SEED" --metrics "$base.jsonl" --out "$base.h5" --force \
        > "$base.log" 2>&1 || { tail -n 5 "$base.log" >&2; die "torusrec run failed ($base.log)"; }
    local er=()
    [[ "$rows" == all ]] || er=(--eval-rows "$rows")
    "$PYTHON" scripts/bench_useritem.py torusrec "$data" --model "$base.h5" --metrics "$base.jsonl" \
        --reg "$reg" --unobserved-weight "$w" --threads "$P" "${er[@]}" --json "$base.json" >&2
    "$PYTHON" -c "import json,sys; r=json.load(open(sys.argv[1]))['best']; r['case']=sys.argv[2]; print(json.dumps(r))" \
        "$base.json" "$tag" >> "$RESULTS"
}

theirs() { # data tag d epochs grid|reg:alpha [eval-rows]
    local data=$1 tag=$2 d=$3 epochs=$4 spec=$5 rows=${6:-all}
    local base="$OUT/$tag-implicit-d$d-${spec//[:,]/_}"
    log "implicit $tag d=$d $spec threads=$P"
    local er=()
    [[ "$rows" == all ]] || er=(--eval-rows "$rows")
    "$PYTHON" scripts/bench_useritem.py implicit "$data" --dim "$d" --epochs "$epochs" --grid "$spec" \
        --cg-steps "$CG_STEPS" --threads "$P" --seed "$SEED" "${er[@]}" --json "$base.json" >&2
    "$PYTHON" -c "
import json,sys
for r in json.load(open(sys.argv[1]))['results']:
    r['case']=sys.argv[2]; print(json.dumps(r))" "$base.json" "$tag" >> "$RESULTS"
}

best() { # system case d -> 'reg weight' of the best Recall@20 (then NDCG@20)
    "$PYTHON" - "$RESULTS" "$@" <<'PY'
import json, sys
rs = [json.loads(l) for l in open(sys.argv[1])]
rs = [r for r in rs if r["system"] == sys.argv[2] and r["case"] == sys.argv[3] and r["dim"] == int(sys.argv[4])]
b = max(rs, key=lambda r: (r["recall_at_20"], r["ndcg_at_20"]))
print(b["reg"], b.get("unobserved_weight", b.get("alpha")))
PY
}

# --- ml-latest-small ----------------------------------------------------------------
MLH5="$OUT/ml.h5"
if [[ "$RUN_ML" == 1 ]]; then
"$BIN" prepare --matrix user-item --format csv --input "$ML" --seed "$SEED" --out "$MLH5" --force > "$OUT/prepare-ml.log" 2>&1 \
    || { cat "$OUT/prepare-ml.log" >&2; die "prepare ml failed"; }
for reg in "${GRID_REGS[@]}"; do
    for w in "${GRID_WEIGHTS[@]}"; do
        ours "$MLH5" ml-grid "${DIMS[0]}" "$reg" "$w" "$EPOCHS"
    done
done
theirs "$MLH5" ml-grid "${DIMS[0]}" "$EPOCHS" "$GRID_IREGS:$GRID_IALPHAS"
fi
read -r BR BW <<< "$(best torusrec ml-grid "${DIMS[0]}")"
read -r IR IA <<< "$(best implicit ml-grid "${DIMS[0]}")"
log "best: torusrec reg=$BR alpha0=$BW; implicit reg=$IR alpha=$IA"
if [[ "$RUN_ML" == 1 ]]; then
    for d in "${DIMS[@]}"; do
        ours "$MLH5" ml-best "$d" "$BR" "$BW" "$EPOCHS"
        theirs "$MLH5" ml-best "$d" "$EPOCHS" "$IR:$IA"
    done
fi

# --- synthetic ----------------------------------------------------------------------
if [[ "$SYN" == 1 ]]; then
    SYNTSV="$OUT/syn-$SYN_USERS-$SYN_ITEMS-$SYN_INTERACTIONS.tsv" SYNH5="${SYNTSV%.tsv}.h5"
    if [[ ! -s "$SYNH5" ]]; then
        "$PYTHON" scripts/gen_useritem.py --users "$SYN_USERS" --items "$SYN_ITEMS" \
            --interactions "$SYN_INTERACTIONS" --seed "$SEED" --out "$SYNTSV" >&2
        "$BIN" prepare --matrix user-item --format tsv --input "$SYNTSV" --seed "$SEED" --out "$SYNH5" \
            --force > "$OUT/prepare-syn.log" 2>&1 || { cat "$OUT/prepare-syn.log" >&2; die "prepare syn failed"; }
        cat "$OUT/prepare-syn.log" >&2
    fi
    SC="syn-$SYN_INTERACTIONS"
    if [[ "$SYN_GRID" == 1 ]]; then
        for reg in "${GRID_REGS[@]}"; do
            for w in "${GRID_WEIGHTS[@]}"; do
                ours "$SYNH5" "$SC-grid" "$SYN_GRID_DIM" "$reg" "$w" "$SYN_EPOCHS" "$SYN_EVAL_ROWS"
            done
        done
        theirs "$SYNH5" "$SC-grid" "$SYN_GRID_DIM" "$SYN_EPOCHS" "$GRID_IREGS:$GRID_IALPHAS" "$SYN_EVAL_ROWS"
        SYN_BEST_FROM="$SC-grid"
    fi
    read -r SR SW <<< "$(best torusrec "$SYN_BEST_FROM" "$([[ "$SYN_BEST_FROM" == ml-grid ]] && echo "${DIMS[0]}" || echo "$SYN_GRID_DIM")")"
    read -r SIR SIA <<< "$(best implicit "$SYN_BEST_FROM" "$([[ "$SYN_BEST_FROM" == ml-grid ]] && echo "${DIMS[0]}" || echo "$SYN_GRID_DIM")")"
    log "synthetic settings from $SYN_BEST_FROM: torusrec reg=$SR alpha0=$SW; implicit reg=$SIR alpha=$SIA"
    for d in "${SYN_DIMS[@]}"; do
        ours "$SYNH5" "$SC" "$d" "$SR" "$SW" "$SYN_EPOCHS" "$SYN_EVAL_ROWS"
        theirs "$SYNH5" "$SC" "$d" "$SYN_EPOCHS" "$SIR:$SIA" "$SYN_EVAL_ROWS"
    done
fi

# --- report -------------------------------------------------------------------------
CPU="$(. scripts/cpu_line.sh && cpu_line)" COMMIT="$(git rev-parse --short HEAD)" \
    EPOCHS="$EPOCHS" SYN_EPOCHS="$SYN_EPOCHS" P="$P" "$PYTHON" scripts/bench_useritem_report.py "$RESULTS" \
    > bench/useritem.md
log "wrote bench/useritem.md"
