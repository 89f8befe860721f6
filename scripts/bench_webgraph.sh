#!/usr/bin/env bash
# ALX's WebGraph family on one box: generate each variant (streaming), train iALS at
# d = 128 with f32 and bf16 tables, and compare in-dense with benfred/implicit on the
# same split. Writes bench/webgraph.md (and prints it).
#
#   scripts/bench_webgraph.sh                       # in-dense, in-sparse, de-dense, de-sparse (full size)
#   VARIANTS="in-dense" EPOCHS=2 scripts/bench_webgraph.sh   # a quicker look
#   VARIANTS="in-dense de-sparse:0.5" ...           # NAME:SCALE runs a scaled variant
#
# Knobs (environment):
#   VARIANTS="in-dense in-sparse de-dense de-sparse"  NP=2 (ranks)  THREADS=1 (per rank)
#   DESPARSE_DTYPES=bf16  DESPARSE_MEM=7.5G (de-sparse's --mem-per-rank: the budget the
#     out-of-core layout is chosen for; it leaves the page cache ~8 GiB of this box)
#   BASE_BIN=path: also train in-dense, in-sparse and de-dense with this (older) binary in
#     the same run, for the "no slower than before" comparison (BASE_DTYPES="bf16 f32")
#   ALX_DENSE=1: the section on ALX's dense variant (memory, disk, projected epoch)
#   DIM=128  EPOCHS=3  REG=1e-4  ALPHA0=3e-3 (--unobserved-weight)  CG_STEPS=3
#   EVAL_ROWS=auto (at most a quarter of an epoch; N sampled rows; "all")  DTYPES="f32 bf16"
#   IMPLICIT=1: benfred/implicit on in-dense (IREG=0.01 IALPHA=100, CORES=2 threads)
#   OUT=out/bench (datasets and logs; a generated dataset is reused if present)
#   TIMEOUT=3600 seconds per run;  BUILD=0 skips `cargo build --release`
#   APPEND=1 keeps the rows of the previous invocation in the table
#
# Seconds per epoch: the mean over the epochs after the first of the epoch's training
# time (evaluation and checkpoints are timed apart). Peak RSS: the maximum over ranks
# of the process high-water mark (getrusage), for generation and for training.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

VARIANTS="${VARIANTS:-in-dense in-sparse de-dense de-sparse}"
DESPARSE_DTYPES="${DESPARSE_DTYPES:-bf16}"
DESPARSE_MEM="${DESPARSE_MEM:-7.5G}"
BASE_BIN="${BASE_BIN:-}"
BASE_DTYPES="${BASE_DTYPES:-bf16 f32}"
ALX_DENSE="${ALX_DENSE:-1}"
NP="${NP:-2}"
THREADS="${THREADS:-1}"
DIM="${DIM:-128}"
EPOCHS="${EPOCHS:-3}"
REG="${REG:-1e-4}"
ALPHA0="${ALPHA0:-3e-3}"
CG_STEPS="${CG_STEPS:-3}"
EVAL_ROWS="${EVAL_ROWS:-auto}"
DTYPES="${DTYPES:-f32 bf16}"
IMPLICIT="${IMPLICIT:-1}"
IREG="${IREG:-0.01}"
IALPHA="${IALPHA:-100}"
CORES="${CORES:-2}"
OUT="${OUT:-out/bench}"
TIMEOUT="${TIMEOUT:-3600}"
PYTHON="${PYTHON:-python3}"
SEED=42

log() { printf '[bench_webgraph %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

if ! command -v cargo >/dev/null 2>&1 || ! command -v mpirun >/dev/null 2>&1; then
    bash scripts/install_deps.sh
fi
if ! command -v cargo >/dev/null 2>&1 && [[ -f "${CARGO_HOME:-$HOME/.cargo}/env" ]]; then
    # shellcheck disable=SC1091
    . "${CARGO_HOME:-$HOME/.cargo}/env"
fi
if [[ $(id -u) -eq 0 ]]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
# shellcheck source=scripts/blas_env.sh
. scripts/blas_env.sh
[[ "${BUILD:-1}" == 1 ]] && cargo build --release --quiet
BIN="${BIN:-target/release/torusrec}"
mkdir -p "$OUT" bench
MPI=(mpirun --oversubscribe --bind-to none -np "$NP" "${BLAS_MPI_ENV[@]}")
MANIFEST="$OUT/webgraph-manifest.tsv"
# The commit each row measured (APPEND=1 tables may mix runs of several commits).
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
if [[ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]]; then commit="$commit+dirty"; fi
# APPEND=1 adds to the previous invocation's rows (e.g. the largest variant run apart).
[[ "${APPEND:-0}" == 1 ]] || : > "$MANIFEST"

for v in $VARIANTS; do
    name="${v%%:*}"
    scale=1
    [[ "$v" == *:* ]] && scale="${v#*:}"
    tag="$name"
    [[ "$scale" != 1 ]] && tag="$name-s$scale"
    data="$OUT/$tag.h5"
    genlog="$OUT/$tag.gen.log"
    if [[ -s "$data" && -s "$genlog" ]] && grep -q '^wrote ' "$genlog"; then
        log "reuse $data (generated earlier: $(grep '^wrote ' "$genlog"))"
    else
        log "generate $tag on $NP ranks"
        if ! timeout "$TIMEOUT" "${MPI[@]}" "$BIN" generate webgraph --preset "$name" --scale "$scale" \
            --seed "$SEED" --out "$data" --force > "$genlog" 2>&1; then
            tail -n 5 "$genlog" >&2
            die "generating $tag failed (see $genlog)"
        fi
        grep '^wrote ' "$genlog" >&2 || true
    fi
    dts="$DTYPES"
    extra=()
    if [[ "$name" == de-sparse ]]; then
        dts="$DESPARSE_DTYPES"
        extra=(--mem-per-rank "$DESPARSE_MEM")
    fi
    runs=()
    for dt in $dts; do runs+=("$dt:$BIN"); done
    if [[ -n "$BASE_BIN" && "$name" != de-sparse ]]; then
        for dt in $BASE_DTYPES; do runs+=("$dt@base:$BASE_BIN"); done
    fi
    for spec in "${runs[@]}"; do
        dtl="${spec%%:*}"
        bin="${spec#*:}"
        dt="${dtl%@*}"
        run="$OUT/$tag-np$NP-t$THREADS-d$DIM-${dtl/@/-}"
        erows="$EVAL_ROWS"
        # The binary before --eval-rows auto: its old default.
        [[ "$dtl" == *@base && "$erows" == auto ]] && erows=10000
        rm -f "$run.jsonl"
        log "als $tag $dtl ($bin)"
        rc=0
        # shellcheck disable=SC2086
        timeout "$TIMEOUT" "${MPI[@]}" "$bin" als --data "$data" --dim "$DIM" --epochs "$EPOCHS" \
            --reg "$REG" --unobserved-weight "$ALPHA0" --cg-steps "$CG_STEPS" --threads "$THREADS" \
            --table-dtype "$dt" --eval-rows "$erows" --metrics "$run.jsonl" "${extra[@]}" \
            > "$run.log" 2>&1 || rc=$?
        if ((rc != 0)); then
            log "  exit $rc; last lines of $run.log:"
            tail -n 5 "$run.log" >&2
        else
            grep '^epoch\|^final' "$run.log" >&2 || true
        fi
        # This run's files replace an earlier invocation's of the same run (APPEND=1).
        awk -F'\t' -v f="$run.jsonl" '$5 != f' "$MANIFEST" > "$MANIFEST.tmp" && mv "$MANIFEST.tmp" "$MANIFEST"
        printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s %s\n' "$tag" "$scale" "$dtl" "$genlog" "$run.jsonl" "$rc" "$run.log" \
            "$commit" "$(date -u +%Y-%m-%d)" >> "$MANIFEST"
    done
    if [[ "$IMPLICIT" == 1 && "$name" == in-dense ]]; then
        ij="$OUT/implicit-$tag-d$DIM-e$EPOCHS-r$IREG-a$IALPHA.json"
        log "implicit $tag (reg $IREG, alpha $IALPHA, $CORES threads)"
        sample=()
        # implicit's script takes a count: auto's rows depend on torusrec's speed.
        case "$EVAL_ROWS" in
            all) ;;
            auto) sample=(--eval-rows 10000) ;;
            *) sample=(--eval-rows "$EVAL_ROWS") ;;
        esac
        timeout "$TIMEOUT" "$PYTHON" scripts/compare_implicit.py "$data" --dim "$DIM" --epochs "$EPOCHS" \
            --reg "$IREG" --alpha "$IALPHA" --cg-steps "$CG_STEPS" --threads "$CORES" --seed "$SEED" \
            "${sample[@]}" --json "$ij" > "${ij%.json}.log" 2>&1 || log "implicit failed; see ${ij%.json}.log"
        printf '%s\t%s\timplicit\t-\t%s\t-\t%s\n' "$tag" "$scale" "$ij" "${ij%.json}.log" >> "$MANIFEST"
    fi
done

# ALX's dense variant (136.5M nodes, 22.2B arcs) cannot be generated here (its prepared
# file alone is ~180 GB): what one box would need, from the estimate's formulas, and the
# projected epoch on this machine's calibrated rates (`project measure` on in-dense).
if [[ "$ALX_DENSE" == 1 ]]; then
    cal="$OUT/calibration-np$NP.json"
    if [[ -s "$OUT/in-dense.h5" ]]; then
        log "project measure on in-dense (calibration)"
        timeout "$TIMEOUT" "${MPI[@]}" "$BIN" project measure --data "$OUT/in-dense.h5" --dim "$DIM" \
            --out "$cal" --force > "$OUT/calibration.log" 2>&1 || log "project measure failed (see $OUT/calibration.log)"
    fi
    calargs=()
    [[ -s "$cal" ]] && calargs=(--chip here --calibration "$cal")
    timeout "$TIMEOUT" "$BIN" project als --webgraph dense --dim "$DIM" --table-dtype bf16 \
        --shapes "${NP}x1" --exchange dedup "${calargs[@]}" > "$OUT/alx-dense-project.txt" 2>&1 \
        || log "project als on dense failed (see $OUT/alx-dense-project.txt)"
fi

DESCRIBE="report written at torusrec $commit, $(date -u +%Y-%m-%dT%H:%MZ), $(getconf _NPROCESSORS_ONLN) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')), $(free -g | awk '/Mem:/{print $2}') GiB" \
MANIFEST="$MANIFEST" NP="$NP" THREADS="$THREADS" DIM="$DIM" EPOCHS="$EPOCHS" REG="$REG" ALPHA0="$ALPHA0" \
CG_STEPS="$CG_STEPS" EVAL_ROWS="$EVAL_ROWS" IREG="$IREG" IALPHA="$IALPHA" CORES="$CORES" \
DESPARSE_MEM="$DESPARSE_MEM" ALX_PROJECT="$OUT/alx-dense-project.txt" \
    "$PYTHON" scripts/bench_webgraph_report.py > bench/webgraph.md
# A chart next to the table: every run's loss, Recall@20 and edges/s by epoch (one
# series per variant and table dtype).
mapfile -t runs < <(awk -F'\t' '$5 ~ /\.jsonl$/ && $6 == 0 && (system("test -s " $5) == 0) {print $5}' "$MANIFEST")
if ((${#runs[@]} > 0)) && "$BIN" plot --force "${runs[@]}" \
    --title "WebGraph variants: loss, Recall@20 and edges/s by epoch" --out bench/webgraph-runs.svg >&2; then
  { echo; echo "![webgraph-runs.svg](webgraph-runs.svg)"; echo; } >> bench/webgraph.md
fi
cat bench/webgraph.md
