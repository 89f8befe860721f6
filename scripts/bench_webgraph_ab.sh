#!/usr/bin/env bash
# Interleaved A/B of iALS seconds per epoch: this build against an older binary, run
# alternately (new, base, new, base, ...) so that a shared, noisy machine's drift falls
# on both alike. Each run: 2 epochs at d = 128 on a prepared WebGraph variant (from
# scripts/bench_webgraph.sh), --eval-rows 100 (evaluation is timed apart anyway); the
# second epoch is the one compared. Appends to out/ab/VARIANT.tsv and writes
# bench/webgraph-ab.md from every variant's rows there.
#
#   BASE_BIN=/path/to/old/torusrec BASE_LABEL="commit 8742ffa" V=in-dense DTYPES="f32 bf16" REPS=2 scripts/bench_webgraph_ab.sh
#   BASE_BIN=... V=de-dense DTYPES=bf16 REPS=1 scripts/bench_webgraph_ab.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
: "${BASE_BIN:?set BASE_BIN to the older binary}"
export BASE_LABEL="${BASE_LABEL:-$BASE_BIN}"
V="${V:-in-dense}"; REPS="${REPS:-2}"; DTYPES="${DTYPES:-f32 bf16}"; OUT="${OUT:-out/bench}"
if [[ $(id -u) -eq 0 ]]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
export OPENBLAS_NUM_THREADS=1
[[ "${BUILD:-1}" == 1 ]] && cargo build --release --quiet
NEW=target/release/torusrec
[[ -f "$OUT/$V.h5" ]] || { echo "no $OUT/$V.h5: run scripts/bench_webgraph.sh with VARIANTS=$V first" >&2; exit 2; }
commit=$(git rev-parse --short HEAD)
mkdir -p out/ab bench
# REPORT_ONLY=1 rewrites the table from out/ab/*.tsv without running anything.
[[ "${REPORT_ONLY:-0}" == 1 ]] && REPS=0
for rep in $(seq 1 "$REPS"); do
  for dt in $DTYPES; do
    for which in new base; do
      bin=$NEW; [[ $which == base ]] && bin=$BASE_BIN
      log=out/ab/$V-$dt-$which-$rep.log
      timeout 3600 mpirun --oversubscribe --bind-to none -x OPENBLAS_NUM_THREADS -np 2 "$bin" als \
        --data "$OUT/$V.h5" --dim 128 --epochs 2 --reg 1e-4 --unobserved-weight 3e-3 --cg-steps 3 \
        --threads 1 --table-dtype "$dt" --eval-rows 100 > "$log" 2>&1
      e2=$(grep '^epoch   2' "$log" | grep -o '[0-9.]* s  ' | head -1 | awk '{print $1}')
      pk=$(grep -o 'peak RSS [0-9.]* [GM]B' "$log" | head -1 | sed 's/peak RSS //')
      est=$(grep -o 'memory estimate for rank 0: [0-9.]* [GM]B' "$log" | head -1 | sed 's/.*: //')
      ck=$(grep -o 'checksum [0-9a-f]*' "$log" | tail -1 | sed 's/checksum //')
      printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$V" "$dt" "$which" "$rep" "$e2" "$pk" "${est:--}" "$ck" \
        "$([[ $which == new ]] && echo "$commit" || echo base)" "$(date -u +%FT%H:%MZ)" >> "out/ab/$V.tsv"
    done
  done
done
python3 - out/ab/*.tsv > bench/webgraph-ab.md <<'PY'
import os, sys, statistics as st
rows = [l.rstrip("\n").split("\t") for f in sys.argv[1:] for l in open(f) if l.strip()]
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
flags = open("/proc/cpuinfo").read()
isa = "AVX-512" if "avx512f" in flags else "AVX2"
print("# iALS seconds per epoch, interleaved A/B against an older binary\n")
print(f"By `scripts/bench_webgraph_ab.sh` on {cpu} ({isa}; the solver dispatches on it), 2 ranks x 1 thread, d = 128, the second of 2 epochs, runs alternated new/base; base is {os.environ.get('BASE_LABEL', 'BASE_BIN')}. Raw rows: `out/ab/*.tsv`.\n")
print("new / base: the ratio of the means, and of the medians (one slow run moves the mean).\n")
print("| variant | tables | new (commit) s/epoch | base s/epoch | new / base (means) | medians | new peak RSS | new estimate | same checksum |")
print("|---|---|---|---|---|---|---|---|---|")
keys = sorted({(r[0], r[1]) for r in rows})
for v, dt in keys:
    new = [r for r in rows if r[0] == v and r[1] == dt and r[2] == "new"]
    base = [r for r in rows if r[0] == v and r[1] == dt and r[2] == "base"]
    if not new or not base:
        continue
    n = [float(r[4]) for r in new]; b = [float(r[4]) for r in base]
    same = "yes" if {r[7] for r in new} == {r[7] for r in base} and len({r[7] for r in new}) == 1 else "NO"
    commits = ",".join(sorted({r[8] for r in new}))
    print(f"| {v} | {dt} | {st.mean(n):.2f} ({', '.join(f'{x:.2f}' for x in n)}; {commits}) | {st.mean(b):.2f} ({', '.join(f'{x:.2f}' for x in b)}) | {st.mean(n)/st.mean(b):.3f}x | {st.median(n)/st.median(b):.3f}x | {new[-1][5]} | {new[-1][6]} | {same} |")
PY
cat bench/webgraph-ab.md
