#!/usr/bin/env bash
# Interleaved A/B of two torusrec binaries on the rows a refactor must not slow down:
# the iALS headline row of bench/als.md (cnr-2000 K = 1, d = 128, CG 3 steps, P = 2 x 1
# thread, dedup exchange, reg 1e-4, unobserved weight 3e-3) and the 2x1 row of
# bench/embed.md (the TorchRec peer's workload, P = 2 x 1 thread, dedup on, --preload).
# Each round runs A then B on each workload, REPEATS rounds; the table gives each run's
# seconds, the median and range of each side, B / A of the medians, and whether the
# results agree bit for bit (the final checksums).
#
#   A=/path/to/old/torusrec B=target/release/torusrec scripts/bench_ab.sh
#
# Knobs: A_NAME, B_NAME (what each binary was built from)  REPEATS=3  EPOCHS=8  STEPS=40 (embed; the first WARM=10 are not timed)
#   OUT=out/bench-ab  MD=bench/ab.md  TIMEOUT=1800 (seconds per run)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
A="${A:?A=path of the base binary}"
B="${B:-target/release/torusrec}"
A_NAME="${A_NAME:-the base}"  # what each binary is (a commit), for the table
B_NAME="${B_NAME:-$(git rev-parse --short HEAD 2>/dev/null || echo this tree)}"
REPEATS="${REPEATS:-3}"
EPOCHS="${EPOCHS:-8}"
STEPS="${STEPS:-40}"
WARM="${WARM:-10}"
OUT="${OUT:-out/bench-ab}"
MD="${MD:-bench/ab.md}"
TIMEOUT="${TIMEOUT:-1800}"
for bin in "$A" "$B"; do
    [[ -x "$bin" ]] || { echo "bench_ab.sh: $bin is not an executable" >&2; exit 2; }
done
[[ $REPEATS =~ ^[1-9][0-9]*$ ]] || { echo "REPEATS=$REPEATS: must be a whole number >= 1" >&2; exit 2; }
# shellcheck source=scripts/mpi_env.sh
. scripts/mpi_env.sh
export OPENBLAS_NUM_THREADS=1
MPI=(timeout "$TIMEOUT" mpirun --oversubscribe --bind-to none -x OPENBLAS_NUM_THREADS -np 2)
mkdir -p "$OUT" "$(dirname "$MD")"
DATA="$OUT/cnr-k1.h5"
if [[ ! -s "$DATA" ]]; then
    "$B" prepare --input tests/data/cnr-2000/cnr-2000 --format bv --min-links 1 --seed 42 \
        --out "$DATA" > "$OUT/prepare.log" 2>&1 || { cat "$OUT/prepare.log" >&2; exit 1; }
fi

run_als() { # side bin round
    "${MPI[@]}" "$2" als --data "$DATA" --dim 128 --epochs "$EPOCHS" --reg 1e-4 \
        --unobserved-weight 3e-3 --solver cg --cg-steps 3 --exchange dedup --threads 1 \
        --eval-every 0 --eval-rows all --seed 42 --metrics "$OUT/als-$1-$3.jsonl" \
        > "$OUT/als-$1-$3.log" 2>&1 || { tail -20 "$OUT/als-$1-$3.log" >&2; exit 1; }
}
run_embed() { # side bin round
    rm -f "$OUT/embed-$1-$3.jsonl"
    "${MPI[@]}" "$2" embed --preset torchrec-peer --batch 2048 --steps $((WARM + STEPS)) \
        --log-every "$WARM" --eval-examples 16384 --threads 1 --seed 1 --preload \
        --metrics "$OUT/embed-$1-$3.jsonl" > "$OUT/embed-$1-$3.log" 2>&1 \
        || { tail -20 "$OUT/embed-$1-$3.log" >&2; exit 1; }
}
for r in $(seq 1 "$REPEATS"); do
    for side in A B; do
        bin=$A; [[ $side == B ]] && bin=$B
        echo "== round $r: iALS $side" >&2; run_als "$side" "$bin" "$r"
        echo "== round $r: embed $side" >&2; run_embed "$side" "$bin" "$r"
    done
done

python3 - "$OUT" "$REPEATS" "$A" "$B" "$MD" "$A_NAME" "$B_NAME" <<'PY'
import json, re, statistics, subprocess, sys
out, repeats, a, b, md, a_name, b_name = sys.argv[1], int(sys.argv[2]), *sys.argv[3:]
def rows(p): return [json.loads(l) for l in open(p) if l.strip()]
def als_s(p):
    ep = [r for r in rows(p) if "epoch" in r][1:]
    return sum(r["seconds"] for r in ep) / len(ep)
def embed_s(p):
    iv = [r for r in rows(p) if not r.get("final")][1:]
    return sum(r["examples"] for r in iv) / sum(r["seconds"] for r in iv)
def checksum(log):
    m = re.findall(r"checksum ([0-9a-f]{16})", open(log).read())
    return m[-1] if m else "-"
def cpu():
    try:
        return subprocess.run(["bash", "-c", ". scripts/cpu_line.sh; cpu_line"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return "?"
lines = [f"# A/B of two binaries ({subprocess.run(['date','-u','+%Y-%m-%dT%H:%MZ'],capture_output=True,text=True).stdout.strip()})", "",
         f"A: {a_name} (`{a}`); B: {b_name} (`{b}`); {cpu()}.", "",
         "Interleaved: each round runs A then B on each workload. iALS: cnr-2000 K = 1, d = 128, 8 epochs, CG 3 steps, P = 2 x 1 thread, dedup, reg 1e-4, unobserved weight 3e-3; mean training seconds of epochs 2..N. Embed: torchrec-peer, P = 2 x 1 thread, batch 2048, dedup, --preload; examples/s over the timed steps after the first interval.", "",
         "| workload | side | runs | median | range | checksums |", "|---|---|---|---|---|---|"]
summary = []
for w, f, unit in [("als", als_s, "s/epoch"), ("embed", embed_s, "examples/s")]:
    med = {}
    for side in "AB":
        vals = [f(f"{out}/{w}-{side}-{r}.jsonl") for r in range(1, repeats + 1)]
        sums = sorted({checksum(f"{out}/{w}-{side}-{r}.log") for r in range(1, repeats + 1)})
        med[side] = statistics.median(vals)
        fmt = (lambda v: f"{v:.3f}") if w == "als" else (lambda v: f"{v:,.0f}")
        lines.append(f"| {w} ({unit}) | {side} | {', '.join(fmt(v) for v in vals)} | {fmt(med[side])} | {fmt(min(vals))}-{fmt(max(vals))} | {' '.join(sums)} |")
        med[side + "sums"] = sums
    same = "the same bits" if med["Asums"] == med["Bsums"] and len(med["Asums"]) == 1 else "DIFFERENT bits"
    summary.append(f"- {w}: B / A of the medians **{med['B'] / med['A']:.3f}** ({unit}); {same}.")
lines += ["", *summary, ""]
open(md, "w").write("\n".join(lines))
print("\n".join(lines))
PY
