#!/usr/bin/env bash
# Do the embedding phases cost more beside a large MLP step (which evicts the tables'
# hot rows from the caches between steps) than beside the calibration's tiny one?
# The same 2P tables (64 MiB each, width 64, 8 Zipf ids per example) trained at P ranks
# with MLPs of growing size (n_dense 13; hidden [256, 128], [1024, 512], [4096, 2048]),
# interleaved, REPS rounds; per run the embedding phases' seconds per step (lookup,
# pooling, backward, update) and the dense step's, over the timed intervals after the
# first. Run from the repository root after `cargo build --release`:
#   P=2 REPS="1 2 3" bash docs/experiments/beside-dense.sh
# (docs/calibrate.md, "Where the model is known to be off"). n_dense is kept small on
# purpose: the lookup phase generates the dense features too, so a large n_dense
# slows it for another reason.
set -euo pipefail
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
B=$PWD/target/release/torusrec
O=${OUT:-out/beside-dense}
P=${P:-2}
mkdir -p "$O"
mk() { # NAME N_DENSE HIDDEN
  {
    echo "n_dense = $2"; echo "hidden = $3"; echo "zipf = 1.05"
    for ((i = 0; i < 2 * P; i++)); do
      printf '[[table]]\nname = "t%d"\nvocab = 262144\ndim = 64\nvalency = 8.0\n' "$i"
    done
  } > "$O/$1.toml"
}
mk small 13 "[256, 128]"
mk wide2 13 "[1024, 512]"
mk wide 13 "[4096, 2048]"
for rep in ${REPS:-1 2 3}; do
  for v in small wide2 wide; do
    f="$O/$v-$P-r$rep"
    timeout 900 mpirun --oversubscribe --bind-to none -x OPENBLAS_NUM_THREADS -np "$P" "$B" embed \
      --tables "$O/$v.toml" --batch 2048 --steps 70 --log-every 10 --eval-examples 4096 \
      --threads 1 --seed 1 --preload --metrics "$f.jsonl" > "$f.log" 2>&1
    python3 - "$f.jsonl" "$v" "$rep" <<'PY'
import json, sys
f, v, rep = sys.argv[1:]
lines = [json.loads(l) for l in open(f) if l.strip()]
timed = [x for x in lines if not x.get("final")][1:]
steps = sum(x["steps"] for x in timed)
ms = lambda q: 1e3 * sum(x["seconds_" + q] for x in timed) / steps
emb = sum(ms(q) for q in ["lookup", "pool", "backward", "update"])
print(f"{v} round {rep}: embedding {emb:.2f} ms (lookup {ms('lookup'):.2f}, pool {ms('pool'):.2f}, "
      f"backward {ms('backward'):.2f}, update {ms('update'):.2f}); dense {ms('dense'):.2f} ms")
PY
  done
done
