#!/usr/bin/env bash
# Tuning benchmark: `torusrec tune` against benfred/implicit tuned over a grid of the same
# size, both on the same validation split of the same prepared dataset, then each
# system's chosen setting trained on the full training rows and scored on the test rows.
#
#   scripts/bench_tune.sh                 # -> bench/tune.md, bench/tune.tsv, bench/tune.svg
#   QUICK=1 scripts/bench_tune.sh         # smoke run: cnr-k10 only, d=32, 2 epochs, 2x2 grids
#
# Datasets (prepared into $OUT if missing): cnr-k1 (cnr-2000 at K = 1, as bench_als.sh)
# and in-dense (`generate webgraph --model independent --preset in-dense --scale $SCALE`).
# Ours: `torusrec tune --strategy $STRATEGY` (refine: the centres of the cells of the grid
#   --reg $REGS x --unobserved-weight $WEIGHTS, then compass-search points inside its box) with
#   --budget = (implicit's grid points) x $EPOCHS: the same number of full trainings as
#   implicit, $EPOCHS epochs each, d = $DIM, CG $CG_STEPS steps, P = 1 rank x $CORES
#   threads, validation Recall@20 over $VAL_ROWS validation rows, then --train-final with
#   the best (test recall over all test rows).
# implicit: scripts/tune_implicit.py over regularization $IREGS x alpha $IALPHAS (per
#   dataset: IREGS_CNR_K1, IALPHAS_IN_DENSE, ... override them), the same d, epochs, CG
#   steps, threads, validation split
#   (--val-fraction $VAL_FRACTION --val-seed $VAL_SEED; the script checks that both
#   print the same split digest) and evaluation rows. implicit's alpha is the reciprocal
#   of our weight (implicit weights an observed cell alpha and any other 1, ours 1 and
#   alpha0: the same model at alpha = 1/alpha0); its regularization is unscaled.
#
# Knobs (environment): STRATEGY=refine REGS=1e-8:1e-2:3 WEIGHTS=1e-5:1:3 (REGS_<DATASET>,
#   WEIGHTS_<DATASET> per dataset) IREGS=1e-2:1e2:4 IALPHAS=100:1e4:3
#   EPOCHS=8 DIM=128 CG_STEPS=3 CORES=2 VAL_ROWS=5000 VAL_FRACTION=0.1 VAL_SEED=1
#   DATASETS="cnr-k1 in-dense" SCALE=0.1 OUT=out/bench PYTHON=python3 TIMEOUT=3600
#   REPORT=bench/tune: the report's path without extension (.md, .tsv, .svg);
#   REUSE=1: keep a run whose JSON result exists;  BUILD=0: skip `cargo build --release`;
#   BIN=path of the torusrec binary
#
# This measures recall, not speed: the seconds are reported for scale only (both systems
# on the same 2 cores, possibly shared with other work).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

QUICK="${QUICK:-0}"
STRATEGY="${STRATEGY:-refine}"
REGS="${REGS:-1e-8:1e-2:3}"
WEIGHTS="${WEIGHTS:-1e-5:1:3}"
IREGS="${IREGS:-1e-2:1e2:4}"
IALPHAS="${IALPHAS:-100:1e4:3}"
EPOCHS="${EPOCHS:-8}"
DIM="${DIM:-128}"
CG_STEPS="${CG_STEPS:-3}"
CORES="${CORES:-2}"
VAL_ROWS="${VAL_ROWS:-5000}"
VAL_FRACTION="${VAL_FRACTION:-0.1}"
VAL_SEED="${VAL_SEED:-1}"
DATASETS="${DATASETS:-cnr-k1 in-dense}"
SCALE="${SCALE:-0.1}"
OUT="${OUT:-out/bench}"
PYTHON="${PYTHON:-python3}"
TIMEOUT="${TIMEOUT:-3600}"
REUSE="${REUSE:-0}"
REPORT="${REPORT:-bench/tune}"
SEED=42
if [[ "$QUICK" == 1 ]]; then
    DATASETS=cnr-k10 DIM=32 EPOCHS=2 REGS=1e-4:1e-2:2 WEIGHTS=1e-3:1e-2:2 IREGS=0.01:1:2 IALPHAS=10:100:2
fi

log() { printf '[bench_tune %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

if ! command -v cargo >/dev/null 2>&1 && [[ -f "${CARGO_HOME:-$HOME/.cargo}/env" ]]; then
    # shellcheck disable=SC1091
    . "${CARGO_HOME:-$HOME/.cargo}/env"
fi
command -v "$PYTHON" >/dev/null 2>&1 || die "$PYTHON not found (set PYTHON=...)"
# shellcheck source=scripts/blas_env.sh
. scripts/blas_env.sh
export MKL_NUM_THREADS=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
BIN="${BIN:-target/release/torusrec}"
if [[ "${BUILD:-1}" == 1 ]]; then
    log "cargo build --release"
    cargo build --release --quiet
fi
[[ -x "$BIN" ]] || die "$BIN not found or not executable"
mkdir -p "$OUT" "$(dirname "$REPORT")"
START=$(date +%s)

data_path() {
    case "$1" in
        cnr-k1 | cnr-k10) echo "$OUT/$1.h5" ;;
        in-dense) echo "$OUT/in-dense-$SCALE.h5" ;;
        *) die "unknown dataset '$1' (cnr-k1, cnr-k10, in-dense)" ;;
    esac
}

ensure_data() {
    local name=$1 path
    path=$(data_path "$name")
    [[ -s "$path" ]] && return 0
    log "preparing $name -> $path"
    local cmd
    case "$name" in
        cnr-k1 | cnr-k10)
            cmd=(prepare --input tests/data/cnr-2000/cnr-2000 --format bv --min-links "${name#cnr-k}"
                --seed "$SEED" --out "$path" --force) ;;
        in-dense)
            cmd=(generate webgraph --model independent --preset in-dense --scale "$SCALE" --seed "$SEED" --out "$path" --force) ;;
    esac
    timeout "$TIMEOUT" "$BIN" "${cmd[@]}" > "$OUT/prepare-$name.log" 2>&1 \
        || { cat "$OUT/prepare-$name.log" >&2; rm -f "$path"; die "preparing $name failed"; }
}

# The value of knob $1 for dataset $2: ${1}_<DATASET> (cnr-k1 -> CNR_K1) or $1.
knob() {
    local key
    key="${1}_$(tr 'a-z-' 'A-Z_' <<< "$2")"
    echo "${!key:-${!1}}"
}
# Points of a --reg style value: LO:HI:N or a comma list.
count() { if [[ "$1" == *:* ]]; then echo "${1##*:}"; else tr ',' '\n' <<< "$1" | grep -c .; fi; }

GRIDS=""
for name in $DATASETS; do
    ensure_data "$name"
    data=$(data_path "$name")
    regs=$(knob REGS "$name") weights=$(knob WEIGHTS "$name")
    iregs=$(knob IREGS "$name") ialphas=$(knob IALPHAS "$name")
    trainings=$(($(count "$iregs") * $(count "$ialphas")))
    GRIDS+="$name: torusrec --strategy $STRATEGY --reg $regs --unobserved-weight $weights --budget $((trainings * EPOCHS)); implicit --regs $iregs --alphas $ialphas. "
    ours="$OUT/tune-ours-$name.json" theirs="$OUT/tune-implicit-$name.json"
    if [[ "$REUSE" == 1 && -s "$ours" ]]; then
        log "reuse $ours"
    else
        log "torusrec tune on $name"
        timeout "$TIMEOUT" "$BIN" tune --data "$data" --strategy "$STRATEGY" --reg "$regs" \
            --unobserved-weight "$weights" --budget $((trainings * EPOCHS)) --epochs "$EPOCHS" --dim "$DIM" --cg-steps "$CG_STEPS" \
            --threads "$CORES" --seed "$SEED" --val-fraction "$VAL_FRACTION" --val-seed "$VAL_SEED" \
            --eval-rows "$VAL_ROWS" --final-eval-rows all --train-final --out-json "$ours" --force \
            > "$OUT/tune-ours-$name.log" 2>&1 || { tail -n 20 "$OUT/tune-ours-$name.log" >&2; die "torusrec tune on $name failed"; }
        grep -E '^(best|final):' "$OUT/tune-ours-$name.log" >&2 || true
    fi
    if [[ "$REUSE" == 1 && -s "$theirs" ]]; then
        log "reuse $theirs"
    else
        log "implicit tune on $name"
        timeout "$TIMEOUT" "$PYTHON" scripts/tune_implicit.py "$data" --regs "$iregs" --alphas "$ialphas" \
            --epochs "$EPOCHS" --dim "$DIM" --cg-steps "$CG_STEPS" --threads "$CORES" --seed "$SEED" \
            --val-fraction "$VAL_FRACTION" --val-seed "$VAL_SEED" --eval-rows "$VAL_ROWS" \
            --final-eval-rows all --json "$theirs" \
            > "$OUT/tune-implicit-$name.log" 2>&1 || { tail -n 20 "$OUT/tune-implicit-$name.log" >&2; die "implicit tune on $name failed"; }
        grep -E '^(best|final):' "$OUT/tune-implicit-$name.log" >&2 || true
    fi
    a=$(grep '^validation:' "$OUT/tune-ours-$name.log") b=$(grep '^validation:' "$OUT/tune-implicit-$name.log")
    [[ "$a" == "$b" ]] || die "the two validation splits differ on $name:
  ours:     $a
  implicit: $b"
done

COMMIT=$(git rev-parse --short HEAD)
DIRTY=$(git status --porcelain --untracked-files=no | grep -q . && echo " (with uncommitted changes)" || true)
ELAPSED=$(($(date +%s) - START))
DATASETS_RUN="$DATASETS"
export GRIDS STRATEGY REGS WEIGHTS IREGS IALPHAS EPOCHS DIM CG_STEPS CORES VAL_ROWS VAL_FRACTION VAL_SEED DATASETS SCALE QUICK DATASETS_RUN REPORT
"$PYTHON" - "$OUT" "$COMMIT$DIRTY" "$ELAPSED" "$SCALE" <<'EOF'
import json, os, sys, platform
out, commit, elapsed, scale = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
env = {k: os.environ.get(k, "") for k in ("STRATEGY", "REGS", "WEIGHTS", "IREGS", "IALPHAS", "EPOCHS", "DIM",
                                          "CG_STEPS", "CORES", "VAL_ROWS", "VAL_FRACTION", "VAL_SEED",
                                          "DATASETS", "SCALE", "QUICK")}
datasets = os.environ.get("DATASETS_RUN", "").split()
rows, tsv, grids = [], ["dataset\tsystem\tval_r20\ttest_r20\ttest_r50"], []
for name in datasets:
    o = json.load(open(f"{out}/tune-ours-{name}.json"))
    i = json.load(open(f"{out}/tune-implicit-{name}.json"))
    ob, ib = o["best"], i["best"]
    of, if_ = o["final"], i["final"]
    label = name if name != "in-dense" else f"in-dense (scale {scale})"
    npo = len(o["results"])
    npi = len(i["results"])
    ratio = of["test_recall_at_20"] / if_["test_recall_at_20"] if if_["test_recall_at_20"] else float("nan")
    ngrid = sum(1 for r in o["results"] if r["rung"] == 0)
    shape = (f"{ngrid} cell centres + {npo - ngrid} compass = {npo}" if o["strategy"] == "Refine" else
             f"{len(set(r['point']['reg'] for r in o['results']))} reg x "
             f"{len(set(r['point']['unobserved_weight'] for r in o['results']))} weight = {npo}")
    rows.append(f"| {label} | torusrec | {shape} | "
                f"reg {ob['point']['reg']:g} / weight {ob['point']['unobserved_weight']:g} | "
                f"{ob['recall']['at20']:.4f} | {of['test_recall_at_20']:.4f} | {of['test_recall_at_50']:.4f} | "
                f"{o['seconds']:.0f} | {ratio:.3f} |")
    rows.append(f"| {label} | implicit | {len(i['grid']['regs'])} reg x {len(i['grid']['alphas'])} alpha = {npi} | "
                f"reg {ib['reg']:g} / alpha {ib['alpha']:g} | {ib['val_recall_at_20']:.4f} | "
                f"{if_['test_recall_at_20']:.4f} | {if_['test_recall_at_50']:.4f} | {i['search_seconds']:.0f} | 1 |")
    tsv.append(f"{label}\ttorusrec\t{ob['recall']['at20']:.4f}\t{of['test_recall_at_20']:.4f}\t{of['test_recall_at_50']:.4f}")
    tsv.append(f"{label}\timplicit\t{ib['val_recall_at_20']:.4f}\t{if_['test_recall_at_20']:.4f}\t{if_['test_recall_at_50']:.4f}")
    st = o["validation"]["stats"]
    g = [f"### {label}", "",
         f"Validation split (the same for both, digest `{st['digest']}`): {st['rows']} rows, "
         f"{st['visible_arcs']} visible and {st['holdout_arcs']} held-out arcs, {st['train_arcs']} training arcs "
         f"left; Recall over {o['results'][0]['recall']['test_rows']} sampled validation rows; "
         f"test recall over {of['test_rows']} test rows.", "",
         "torusrec, every training in the order run (validation Recall@20 / @50; stage: grid; for "
         "refine, centre = a centre of the grid's cells (the first design) or compass = a "
         "compass-search point):", "",
         "| # | stage | reg | weight | val R@20 | val R@50 |", "|---|---|---|---|---|---|"]
    for k, r in enumerate(o["results"]):
        best = " **best**" if r == ob else ""
        stage = "grid" if o["strategy"] != "Refine" else ("centre" if r["rung"] == 0 else "compass")
        g.append(f"| {k + 1} | {stage}{best} | "
                 f"{r['point']['reg']:.3g} | {r['point']['unobserved_weight']:.3g} | "
                 f"{r['recall']['at20']:.4f} | {r['recall']['at50']:.4f} |")
    g += ["", "implicit (validation Recall@20 / @50; rows regularization, columns alpha):", ""]
    cell = {(r["reg"], r["alpha"]): r for r in i["results"]}
    g.append("| reg \\ alpha | " + " | ".join(f"{a:g}" for a in i["grid"]["alphas"]) + " |")
    g.append("|---" * (len(i["grid"]["alphas"]) + 1) + "|")
    for rg in i["grid"]["regs"]:
        g.append(f"| {rg:g} | " + " | ".join(
            f"{cell[(rg, a)]['val_recall_at_20']:.4f} / {cell[(rg, a)]['val_recall_at_50']:.4f}"
            for a in i["grid"]["alphas"]) + " |")
    g += ["", f"torusrec's best, to train again: `{o['command']}`", ""]
    grids += g
md = ["# Tuning: `torusrec tune` vs benfred/implicit tuned the same way", "",
      f"Measured at commit `{commit}` by `scripts/bench_tune.sh` "
      f"({' '.join(f'{k}={v}' for k, v in env.items() if v)}; per dataset: {os.environ.get('GRIDS', '').strip()}); "
      f"{elapsed} s in all, "
      f"on {os.cpu_count()} cores ({platform.processor() or platform.machine()}).", "",
      f"Each system trains the same number of points at d={os.environ.get('DIM')}, "
      f"{os.environ.get('EPOCHS')} epochs per point, CG {os.environ.get('CG_STEPS')} steps, "
      f"{os.environ.get('CORES')} threads, on one validation split of the training rows "
      f"(fraction {os.environ.get('VAL_FRACTION')}, seed {os.environ.get('VAL_SEED')}: the test protocol "
      "applied to training rows, src/als/tune/; scripts/tune_implicit.py rebuilds it and the script "
      "checks the digests agree); the point with the best validation Recall@20 is then trained on the "
      "full training rows for the same epochs and scored on all test rows (exact Recall, docs/design.md). "
      "The test rows are never seen by either search. Ratio: torusrec's test Recall@20 over implicit's. "
      "implicit's alpha is the reciprocal of torusrec's weight (implicit weights an observed "
      "cell alpha and any other 1, torusrec 1 and alpha0: the same model at alpha = 1/alpha0); its "
      "regularization is unscaled, so its grid is placed around the unscaled size of torusrec's "
      "reg x (|I_u| + alpha0 n).", "",
      "| dataset | system | grid | best | val R@20 | test R@20 | test R@50 | tuning s | ratio |",
      "|---|---|---|---|---|---|---|---|---|"] + rows + [
      "", "Target: torusrec's tuned test Recall@20 >= implicit's on both datasets (ratio >= 1).", "",
      f"![test recall]({os.path.basename(os.environ['REPORT'])}.svg)", "", "## Grids", ""] + grids + [
      "Tuning seconds: the whole search (training and validation of every point); both systems "
      "ran on the same machine, which other work may have shared: they show scale, not speed."]
open(os.environ["REPORT"] + ".md", "w").write("\n".join(md) + "\n")
open(os.environ["REPORT"] + ".tsv", "w").write("\n".join(tsv) + "\n")
EOF
"$BIN" plot --force --out "$REPORT.svg" --table "$REPORT.tsv" --x dataset --y test_r20 --series system \
    --kind bar --ylabel "test Recall@20" --title "Tuned iALS: test Recall@20 of each system's best setting" >&2 \
    || log "chart $REPORT.svg failed"
log "wrote $REPORT.md, $REPORT.tsv, $REPORT.svg in ${ELAPSED} s"
