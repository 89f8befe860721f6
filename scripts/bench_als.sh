#!/usr/bin/env bash
# iALS benchmark: torusrec (MPI ranks x rayon threads) against benfred/implicit on the
# same prepared datasets, the same d, epochs and CG steps, and the same exact Recall@K.
#
#   scripts/bench_als.sh                 # full run -> bench/als.md
#   QUICK=1 scripts/bench_als.sh         # smoke run: cnr-2000 K=10, d=64, 3 epochs, P=1,2
#   GRID=1 scripts/bench_als.sh          # tuning grids on cnr-2000 K=1, d=128 -> bench/als-grid.md
# Charts next to the table (`torusrec plot`): bench/als-time.svg (s/epoch by variant and P,
# ours and implicit), bench/als-bytes.svg (bytes exchanged, dedup vs allgather),
# bench/als-runs.svg (loss and edges/s by epoch of one case's runs); data in bench/als.tsv.
#
# Datasets (prepared into $OUT if missing): cnr-k1, cnr-k10 (cnr-2000 at K = 1 and 10)
# and in-dense (`generate webgraph --model independent --preset in-dense --scale $SCALE`).
# torusrec runs: P = 1, 2, 4 ranks (--threads = ceil($CORES / P)), d = 64 and 128,
# --exchange dedup at every P and allgather at P > 1, each under `timeout $TIMEOUT`.
# implicit runs: the same datasets and d with $CORES threads (scripts/compare_implicit.py).
#
# Knobs (environment):
#   EPOCHS=16  REG=0.0001 ALPHA=0.0001 (ours: --reg, --unobserved-weight)
#   IREG=0.01 IALPHA=200 (implicit: regularization, alpha)   CG_STEPS=3
#   DATASETS="cnr-k1 cnr-k10 in-dense"  SCALE=0.1  DIMS="64 128"  NPS="1 2 4"
#   CORES=2  TIMEOUT=3600 (seconds per run)  OUT=out/bench  PYTHON=python3
#   REUSE=1: keep a run whose metrics file is complete instead of running it again
#   BUILD=0: skip `cargo build --release`;  BIN=path of the torusrec binary
#   GRID=1 mode: GRID_EPOCHS=8 GRID_DIM=128 GRID_NP=1, the grids GRID_REGS="0.001 0.01 0.1"
#     GRID_WEIGHTS="0.001 0.01 0.1" (ours) and GRID_IREGS=0.01,0.1,1 GRID_IALPHAS=1,10,40 (implicit)
#
# Seconds per epoch are the mean over epochs 2..N (epoch 1 excluded) of the training
# time (torusrec: the epoch's seconds less its eval phase); evaluation is reported apart.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

QUICK="${QUICK:-0}"
GRID="${GRID:-0}"
EPOCHS="${EPOCHS:-16}"
# Defaults: the best Recall@20 found by GRID=1 (and a few points past its edges) on
# cnr-2000 K=1, d=128, 8 epochs: ours 0.663 at (1e-4, 1e-4), implicit 0.618 at (0.01, 200).
REG="${REG:-0.0001}"
ALPHA="${ALPHA:-0.0001}"
IREG="${IREG:-0.01}"
IALPHA="${IALPHA:-200}"
CG_STEPS="${CG_STEPS:-3}"
SCALE="${SCALE:-0.1}"
DATASETS="${DATASETS:-cnr-k1 cnr-k10 in-dense}"
DIMS="${DIMS:-64 128}"
NPS="${NPS:-1 2 4}"
CORES="${CORES:-2}"
TIMEOUT="${TIMEOUT:-3600}"
OUT="${OUT:-out/bench}"
PYTHON="${PYTHON:-python3}"
REUSE="${REUSE:-0}"
SEED=42
if [[ "$QUICK" == 1 ]]; then
    EPOCHS=3 DIMS=64 NPS="1 2" DATASETS=cnr-k10
fi
GRID_EPOCHS="${GRID_EPOCHS:-8}"
GRID_DIM="${GRID_DIM:-128}"
GRID_NP="${GRID_NP:-1}"
read -r -a GRID_REGS <<< "${GRID_REGS:-0.001 0.01 0.1}"
read -r -a GRID_WEIGHTS <<< "${GRID_WEIGHTS:-0.001 0.01 0.1}"
GRID_IREGS="${GRID_IREGS:-0.01,0.1,1}"
GRID_IALPHAS="${GRID_IALPHAS:-1,10,40}"

log() { printf '[bench_als %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# --- tools ----------------------------------------------------------------------------
if ! command -v cargo >/dev/null 2>&1 || ! command -v mpirun >/dev/null 2>&1; then
    bash scripts/install_deps.sh
fi
if ! command -v cargo >/dev/null 2>&1 && [[ -f "${CARGO_HOME:-$HOME/.cargo}/env" ]]; then
    # shellcheck disable=SC1091
    . "${CARGO_HOME:-$HOME/.cargo}/env"
fi
command -v "$PYTHON" >/dev/null 2>&1 || die "$PYTHON not found (set PYTHON=...)"
if ! "$PYTHON" -c 'import implicit, h5py, numpy, scipy, threadpoolctl' >/dev/null 2>&1; then
    log "installing the Python packages of scripts/requirements-bench.txt (PyPI wheels)"
    "$PYTHON" -m pip install --quiet --only-binary=:all: -r scripts/requirements-bench.txt \
        || "$PYTHON" -m pip install --quiet --only-binary=:all: --user --break-system-packages \
            -r scripts/requirements-bench.txt \
        || die "pip install -r scripts/requirements-bench.txt failed"
fi

if [[ $(id -u) -eq 0 ]]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
# shellcheck source=scripts/blas_env.sh
. scripts/blas_env.sh
export MKL_NUM_THREADS=1 OMP_NUM_THREADS=1
MPIRUN=(mpirun --oversubscribe --bind-to none "${BLAS_MPI_ENV[@]}" -x MKL_NUM_THREADS -x OMP_NUM_THREADS)

BIN="${BIN:-target/release/torusrec}"
if [[ "${BUILD:-1}" == 1 ]]; then
    log "cargo build --release"
    cargo build --release --quiet
fi
[[ -x "$BIN" ]] || die "$BIN not found or not executable"
mkdir -p "$OUT" bench

# --- datasets -------------------------------------------------------------------------
data_path() { # name -> prepared file
    case "$1" in
        cnr-k1) echo "$OUT/cnr-k1.h5" ;;
        cnr-k10) echo "$OUT/cnr-k10.h5" ;;
        in-dense) echo "$OUT/in-dense-$SCALE.h5" ;;
        *) die "unknown dataset '$1' (cnr-k1, cnr-k10, in-dense)" ;;
    esac
}

ensure_data() { # name
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
    if ! timeout "$TIMEOUT" "${MPIRUN[@]}" -np 1 "$BIN" "${cmd[@]}" > "$OUT/prepare-$name.log" 2>&1; then
        cat "$OUT/prepare-$name.log" >&2
        rm -f "$path"
        die "preparing $name failed (log: $OUT/prepare-$name.log)"
    fi
}

# --- runs -----------------------------------------------------------------------------
# MANIFEST: one line per run, tab-separated:
#   dataset  system  P  threads  d  exchange  result-file  exit-code  log  reg  weight
MANIFEST=""

complete_metrics() { # jsonl -> 0 if it ends with the final object
    [[ -s "$1" ]] && tail -n 1 "$1" | grep -q '"final":true'
}

run_ours() { # dataset P d exchange reg weight epochs tag-prefix
    local name=$1 np=$2 d=$3 ex=$4 reg=$5 weight=$6 epochs=$7 prefix=$8
    local threads=$(((CORES + np - 1) / np))
    ((threads >= 1)) || threads=1
    local tag="$prefix$name-P$np-t$threads-d$d-$ex-e$epochs"
    [[ "$prefix" == grid-* ]] || tag="$tag-r$reg-a$weight"
    local jsonl="$OUT/$tag.jsonl" logf="$OUT/$tag.log" rc=0
    if [[ "$REUSE" == 1 ]] && complete_metrics "$jsonl"; then
        log "reuse $tag"
    else
        rm -f "$jsonl"
        log "torusrec $tag"
        timeout "$TIMEOUT" "${MPIRUN[@]}" -np "$np" "$BIN" als --data "$(data_path "$name")" \
            --dim "$d" --epochs "$epochs" --reg "$reg" --unobserved-weight "$weight" \
            --solver cg --cg-steps "$CG_STEPS" --exchange "$ex" --threads "$threads" \
            --eval-every 0 --eval-rows all --seed "$SEED" --metrics "$jsonl" > "$logf" 2>&1 || rc=$?
        if ((rc != 0)); then
            log "  failed with exit code $rc$( ((rc == 124)) && echo ' (timeout)'); last lines of $logf:"
            tail -n 5 "$logf" >&2 || true
        else
            grep '^final:' "$logf" >&2 || true
        fi
    fi
    printf '%s\ttorusrec\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' \
        "$name" "$np" "$threads" "$d" "$ex" "$jsonl" "$rc" "$logf" "$reg" "$weight" >> "$MANIFEST"
}

run_implicit() { # dataset d epochs [extra args]
    local name=$1 d=$2 epochs=$3
    shift 3
    local tag="implicit-$name-t$CORES-d$d-e$epochs-r$IREG-a$IALPHA"
    local json="$OUT/$tag.json" logf="$OUT/$tag.log" rc=0
    if [[ "$REUSE" == 1 && -s "$json" ]]; then
        log "reuse $tag"
    else
        rm -f "$json"
        log "implicit $tag"
        timeout "$TIMEOUT" "$PYTHON" scripts/compare_implicit.py "$(data_path "$name")" --dim "$d" \
            --epochs "$epochs" --reg "$IREG" --alpha "$IALPHA" --cg-steps "$CG_STEPS" \
            --threads "$CORES" --seed "$SEED" --json "$json" "$@" > "$logf" 2>&1 || rc=$?
        if ((rc != 0)); then
            log "  failed with exit code $rc; last lines of $logf:"
            tail -n 5 "$logf" >&2 || true
        else
            grep '^implicit' "$logf" >&2 || true
        fi
    fi
    printf '%s\timplicit\t1\t%s\t%s\t-\t%s\t%s\t%s\t%s\t%s\n' \
        "$name" "$CORES" "$d" "$json" "$rc" "$logf" "$IREG" "$IALPHA" >> "$MANIFEST"
}

describe() { # the machine and the code, for the report header
    local commit
    commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
    if [[ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]]; then commit="$commit+dirty"; fi
    printf 'torusrec %s, %s, %s cores (%s), Open MPI %s, %s\n' "$commit" "$(date -u +%Y-%m-%dT%H:%MZ)" \
        "$(getconf _NPROCESSORS_ONLN)" "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')" \
        "$(mpirun --version 2>/dev/null | head -n1 | grep -o '[0-9][0-9.]*' | head -n1)" \
        "$("$PYTHON" -c 'import implicit, numpy; print("implicit", implicit.__version__, "numpy", numpy.__version__)')"
}

# --- GRID=1: tuning ---------------------------------------------------------------------
if [[ "$GRID" == 1 ]]; then
    MANIFEST="$OUT/grid-manifest.tsv"
    : > "$MANIFEST"
    ensure_data cnr-k1
    for reg in "${GRID_REGS[@]}"; do
        for w in "${GRID_WEIGHTS[@]}"; do
            run_ours cnr-k1 "$GRID_NP" "$GRID_DIM" dedup "$reg" "$w" "$GRID_EPOCHS" "grid-r$reg-a$w-"
        done
    done
    ijson="$OUT/grid-implicit-cnr-k1-d$GRID_DIM-e$GRID_EPOCHS-r$GRID_IREGS-a$GRID_IALPHAS.json"
    if [[ "$REUSE" == 1 && -s "$ijson" ]]; then
        log "reuse $ijson"
    else
        log "implicit grid reg {$GRID_IREGS} x alpha {$GRID_IALPHAS}"
        timeout "$((TIMEOUT * 9))" "$PYTHON" scripts/compare_implicit.py "$(data_path cnr-k1)" \
            --dim "$GRID_DIM" --epochs "$GRID_EPOCHS" --cg-steps "$CG_STEPS" --threads "$CORES" \
            --seed "$SEED" --grid "$GRID_IREGS:$GRID_IALPHAS" --json "$ijson" \
            > "${ijson%.json}.log" 2>&1 || log "implicit grid failed; see ${ijson%.json}.log"
    fi
    DESCRIBE="$(describe)" MANIFEST="$MANIFEST" IJSON="$ijson" GRID_EPOCHS="$GRID_EPOCHS" \
        GRID_DIM="$GRID_DIM" GRID_NP="$GRID_NP" CG_STEPS="$CG_STEPS" "$PYTHON" - <<'EOF'
import json, os, sys
sys.path.insert(0, "scripts")
from bench_metrics import load_jsonl, train_seconds



ours = {}
for line in open(os.environ["MANIFEST"]):
    f = line.rstrip("\n").split("\t")
    reg, w = f[9], f[10]
    epochs, final = load_jsonl(f[6])
    steady = epochs[1:] or epochs
    ours[(reg, w)] = {
        "rc": f[7], "final": final,
        "spe": sum(map(train_seconds, steady)) / len(steady) if steady else None,
    }
regs = list(dict.fromkeys(k[0] for k in ours))
ws = list(dict.fromkeys(k[1] for k in ours))

def cell(r):
    if r["final"] is None:
        return f"failed (exit {r['rc']})"
    return f"{r['final']['recall_at_20']:.4f} / {r['final']['recall_at_50']:.4f}"

E, D, P = os.environ["GRID_EPOCHS"], os.environ["GRID_DIM"], os.environ["GRID_NP"]
out = [f"# iALS tuning grids: cnr-2000 K=1, d={D}, {E} epochs, CG {os.environ['CG_STEPS']} steps",
       "", os.environ["DESCRIBE"], "",
       "Cells: Recall@20 / Recall@50 over all test rows (docs/design.md).", "",
       f"## torusrec (ALX objective), P={P}", "",
       "| reg (lambda) \\ unobserved weight (alpha0) | " + " | ".join(ws) + " |",
       "|---" * (len(ws) + 1) + "|"]
for r in regs:
    out.append(f"| {r} | " + " | ".join(cell(ours[(r, w)]) for w in ws) + " |")
ok = [(k, v) for k, v in ours.items() if v["final"]]
if ok:
    (br, bw), b = max(ok, key=lambda kv: (kv[1]["final"]["recall_at_20"], kv[1]["final"]["recall_at_50"]))
    out += ["", f"**Best torusrec:** `--reg {br} --unobserved-weight {bw}`: Recall@20 "
            f"{b['final']['recall_at_20']:.4f}, Recall@50 {b['final']['recall_at_50']:.4f}, "
            f"{b['spe']:.3f} s/epoch"]
out += ["", "## implicit (confidence alpha on observed cells, unscaled L2)", ""]
try:
    g = json.load(open(os.environ["IJSON"]))
    res = g["grid"]
    iregs = list(dict.fromkeys(r["reg"] for r in res))
    ias = list(dict.fromkeys(r["alpha"] for r in res))
    c = {(r["reg"], r["alpha"]): r for r in res}
    out += ["| regularization \\ alpha | " + " | ".join(f"{a:g}" for a in ias) + " |",
            "|---" * (len(ias) + 1) + "|"]
    for r in iregs:
        out.append(f"| {r:g} | " + " | ".join(
            f"{c[(r, a)]['recall_at_20']:.4f} / {c[(r, a)]['recall_at_50']:.4f}" for a in ias) + " |")
    b = g["best"]
    out += ["", f"**Best implicit:** `--reg {b['reg']:g} --alpha {b['alpha']:g}` (IREG/IALPHA): "
            f"Recall@20 {b['recall_at_20']:.4f}, Recall@50 {b['recall_at_50']:.4f}, "
            f"{b['seconds_per_epoch_after_first']:.3f} s/epoch at {b['threads']} threads"]
except (OSError, ValueError, KeyError) as e:
    out.append(f"implicit grid missing or failed ({e}); see {os.environ['IJSON'][:-5]}.log")
text = "\n".join(out) + "\n"
open("bench/als-grid.md", "w").write(text)
print(text)
EOF
    log "wrote bench/als-grid.md"
    exit 0
fi

# --- the benchmark ----------------------------------------------------------------------
MANIFEST="$OUT/manifest.tsv"
: > "$MANIFEST"
read -r -a datasets <<< "$DATASETS"
read -r -a dims <<< "$DIMS"
read -r -a nps <<< "$NPS"
for name in "${datasets[@]}"; do
    ensure_data "$name"
done
for name in "${datasets[@]}"; do
    for d in "${dims[@]}"; do
        for np in "${nps[@]}"; do
            run_ours "$name" "$np" "$d" dedup "$REG" "$ALPHA" "$EPOCHS" ""
            if ((np > 1)); then
                run_ours "$name" "$np" "$d" allgather "$REG" "$ALPHA" "$EPOCHS" ""
            fi
        done
        run_implicit "$name" "$d" "$EPOCHS"
    done
done

RUNS_LIST="$OUT/chart-runs.tsv"
DESCRIBE="$(describe)" MANIFEST="$MANIFEST" RUNS_LIST="$RUNS_LIST" EPOCHS="$EPOCHS" REG="$REG" ALPHA="$ALPHA" \
    IREG="$IREG" IALPHA="$IALPHA" CG_STEPS="$CG_STEPS" CORES="$CORES" SCALE="$SCALE" \
    "$PYTHON" - <<'EOF'
import json, os, sys
sys.path.insert(0, "scripts")
from bench_metrics import load_jsonl, train_seconds

env = os.environ


def mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None

def human(b):
    if b is None:
        return "-"
    for u in ("B", "kB", "MB", "GB", "TB"):
        if b < 1000 or u == "TB":
            return f"{b:.0f} {u}" if u == "B" else f"{b:.1f} {u}"
        b /= 1000

def f(x, spec):
    return "-" if x is None else format(x, spec)

rows = []
for line in open(env["MANIFEST"]):
    ds, system, p, threads, d, ex, path, rc, logf, reg, w = line.rstrip("\n").split("\t")
    r = {"dataset": ds, "system": system, "P": int(p), "threads": int(threads), "d": int(d),
         "exchange": ex, "rc": int(rc), "log": logf, "reg": reg, "weight": w, "ok": False}
    if system == "torusrec":
        epochs, final = load_jsonl(path)
        if final is not None and epochs:
            steady = epochs[1:] or epochs
            no_eval = [e for e in epochs if e.get("recall") is None] or epochs
            ph = lambda k: mean([(e.get("phases") or {}).get(k) for e in steady])
            r.update(ok=True,
                     spe=mean([train_seconds(e) for e in steady]),
                     eps=mean([e.get("edges_per_second") for e in steady]),
                     r20=final.get("recall_at_20"), r50=final.get("recall_at_50"),
                     bytes=mean([e.get("exchange_bytes") for e in no_eval]),
                     gramian=ph("gramian"), exch=ph("exchange"), solve=ph("solve"), loss=ph("loss"),
                     eval=sum((e.get("phases") or {}).get("eval", 0.0) for e in epochs),
                     rss=final.get("peak_rss_bytes"), epochs=len(epochs))
    else:
        try:
            j = json.load(open(path))
            r.update(ok=True, spe=j["seconds_per_epoch_after_first"], eps=j.get("edges_per_second"),
                     r20=j["recall_at_20"], r50=j["recall_at_50"], bytes=None, gramian=None, exch=None,
                     solve=None, loss=None, eval=j.get("eval_seconds"), rss=j.get("peak_rss_bytes"),
                     epochs=j["epochs"], ver=j["versions"]["implicit"])
        except (OSError, ValueError, KeyError):
            pass
    rows.append(r)

out = ["# iALS benchmark: torusrec vs implicit", "", env["DESCRIBE"], "",
       f"{env['EPOCHS']} epochs, CG {env['CG_STEPS']} steps. torusrec: `--reg {env['REG']} "
       f"--unobserved-weight {env['ALPHA']}` (ALX objective), `mpirun --oversubscribe --bind-to none "
       f"-np P`, `--threads` = ceil({env['CORES']}/P), OPENBLAS_NUM_THREADS=1. implicit: "
       f"regularization {env['IREG']}, alpha {env['IALPHA']}, CG, {env['CORES']} threads, same split, "
       f"same exact Recall (scripts/compare_implicit.py). in-dense is `generate webgraph --model independent --preset in-dense "
       f"--scale {env['SCALE']}`.", "",
       "s/epoch: mean training time of epochs 2..N (evaluation excluded); edges/s: training arcs / that; "
       "exchange bytes: sent to other ranks per epoch, all ranks; phases: mean seconds per epoch on rank 0; "
       "eval: total evaluation seconds (one evaluation after the last epoch; implicit: numpy fold-in + scoring); "
       "peak RSS: max over ranks.", "",
       "| dataset | system | P | threads | d | exchange | s/epoch | edges/s | Recall@20 | Recall@50 | "
       "exchange bytes/epoch | gramian s | exchange s | solve s | loss s | eval s (total) | peak RSS/rank |",
       "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
for r in rows:
    head = f"| {r['dataset']} | {r['system']} | {r['P']} | {r['threads']} | {r['d']} | {r['exchange']} |"
    if not r["ok"]:
        why = "timeout" if r["rc"] == 124 else f"exit {r['rc']}"
        out.append(head + f" failed ({why}, `{r['log']}`) |" + " |" * 10)
        continue
    out.append(head + " " + " | ".join([
        f(r["spe"], ".3f"), "-" if r["eps"] is None else f"{r['eps'] / 1e6:.2f}M",
        f(r["r20"], ".4f"), f(r["r50"], ".4f"), human(r["bytes"]),
        f(r["gramian"], ".3f"), f(r["exch"], ".3f"), f(r["solve"], ".3f"), f(r["loss"], ".3f"),
        f(r["eval"], ".1f"), human(r["rss"])]) + " |")

def find(**kw):
    for r in rows:
        if r["ok"] and all(r[k] == v for k, v in kw.items()):
            return r
    return None

out += ["", "## Ratios", ""]
keys = list(dict.fromkeys((r["dataset"], r["d"]) for r in rows))
headline = ("cnr-k1", 128)
for ds, d in sorted(keys, key=lambda k: k != headline):
    imp = find(dataset=ds, d=d, system="implicit")
    mark = " (headline)" if (ds, d) == headline else ""
    parts = []
    for p, t in ((1, int(env["CORES"])), (2, max(1, -(-int(env["CORES"]) // 2)))):
        o = find(dataset=ds, d=d, system="torusrec", P=p, threads=t, exchange="dedup")
        if o and imp and imp["spe"]:
            parts.append(f"torusrec P={p}x{t} threads / implicit {imp['threads']} threads: "
                         f"**{o['spe'] / imp['spe']:.2f}x** the seconds per epoch "
                         f"({o['spe']:.3f} vs {imp['spe']:.3f})")
    ps = sorted({r["P"] for r in rows if r["ok"] and r["dataset"] == ds and r["d"] == d
                 and r["exchange"] == "allgather"})
    if ps:
        p = 4 if 4 in ps else ps[-1]
        a = find(dataset=ds, d=d, system="torusrec", P=p, exchange="allgather")
        b = find(dataset=ds, d=d, system="torusrec", P=p, exchange="dedup")
        if a and b and a["bytes"]:
            parts.append(f"dedup / allgather exchange bytes at P={p}: **{b['bytes'] / a['bytes']:.3f}** "
                         f"({human(b['bytes'])} vs {human(a['bytes'])} per epoch)")
    if parts:
        out.append(f"- {ds}, d={d}, CG {env['CG_STEPS']} steps{mark}: " + "; ".join(parts) + ".")

# The charts' data (drawn below with `torusrec plot --table`): one row per run; "-"
# where a value does not apply (no exchange at P=1 or in implicit).
with open("bench/als.tsv", "w") as t:
    t.write("case\tvariant\tP\ts_per_epoch\texchange_bytes\tedges_per_s\trecall_at_20\n")
    for r in rows:
        if not r["ok"]:
            continue
        if r["system"] == "torusrec":
            variant = f"torusrec P={r['P']} {r['exchange']}"
        else:
            variant = f"implicit {r['threads']} threads"
        moved = r["bytes"] if r["system"] == "torusrec" and r["P"] > 1 and r["bytes"] else None
        t.write("\t".join([f"{r['dataset']} d={r['d']}", variant, str(r["P"]), f(r["spe"], ".6g"),
                            f(moved, ".6g"), f(r["eps"], ".6g"), f(r["r20"], ".6g")]) + "\n")
# The runs overlaid in bench/als-runs.svg: torusrec's runs of the headline case (or of
# the first case that ran), labelled by variant.
case = headline if any(r["ok"] and (r["dataset"], r["d"]) == headline for r in rows) else \
    next(((r["dataset"], r["d"]) for r in rows if r["ok"]), None)
with open(env["RUNS_LIST"], "w") as rl:
    for r, line in zip(rows, open(env["MANIFEST"])):
        if r["ok"] and r["system"] == "torusrec" and (r["dataset"], r["d"]) == case:
            rl.write(f"{line.split(chr(9))[6]}\tP={r['P']} {r['exchange']}\n")
out += ["", "## Charts", "",
        "![seconds per epoch by variant and P, torusrec and implicit](als-time.svg)", "",
        "![bytes exchanged per epoch, dedup vs allgather](als-bytes.svg)", ""]
if case:
    out += [f"![loss and edges/s by epoch, {case[0]} d={case[1]}](als-runs.svg)", ""]
out.append("The charts' data: `bench/als.tsv` (drawn by `torusrec plot --table`).")
text = "\n".join(out) + "\n"
open("bench/als.md", "w").write(text)
print(text)
EOF
log "wrote bench/als.md"

# --- charts next to the table (torusrec plot) -------------------------------------------
chart() { # out.svg plot-args...: a chart that fails is reported, never fatal
    local out=$1
    shift
    "$BIN" plot --force --out "$out" "$@" >&2 || log "chart $out failed"
}
chart bench/als-time.svg --table bench/als.tsv --x case --y s_per_epoch --series variant \
    --kind bar --log-y --ylabel "s/epoch (log scale)" \
    --title "iALS seconds per epoch by variant and P: torusrec vs implicit"
chart bench/als-bytes.svg --table bench/als.tsv --x case --y exchange_bytes --series variant \
    --kind bar --log-y --ylabel "bytes per epoch (log scale)" \
    --title "iALS bytes exchanged per epoch: dedup vs allgather"
runs=() labels=()
while IFS=$'\t' read -r path label; do
    runs+=("$path") labels+=(--label "$label")
done < "$RUNS_LIST"
if ((${#runs[@]} > 0)); then
    chart bench/als-runs.svg "${runs[@]}" "${labels[@]}" --title "iALS runs of one case"
fi
log "wrote bench/als-time.svg, bench/als-bytes.svg, bench/als-runs.svg"
