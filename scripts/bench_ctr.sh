#!/usr/bin/env bash
# The click models people train (issue 17): writes bench/ctr.md.
#   archs  mlp, DLRM and DCN-v2 in torusrec beside TorchRec's own models
#          (bench/peers/torchrec_ctr.py: an MLP, torchrec.models.dlrm.DLRM and DLRM_DCN)
#          on one click log at 2x1: the TorchRec peer's tables (preset torchrec-peer
#          at CTR_SCALE, 26 tables, width 64) with labels that need pairwise
#          interactions (`generate clicks --planted fm`). Same examples in the same
#          order, same batch per rank, widths, optimizers (tables row-wise Adagrad,
#          dense Adagrad) and rates; examples/s over the steps after the first
#          interval, held-out AUC and log loss over the log's last EVAL examples.
#   dtype  table precision: the mlp on the same log with --table-dtype f32 and bf16
#          (same plan row_block, output mode rows, same steps): table memory, bytes
#          exchanged per step, examples/s, held-out AUC and log loss. Written as the
#          section "## Table precision" of bench/ctr.md (replaced in place).
# SECTION=all (default) runs both; SECTION=archs or SECTION=dtype only one (the other
# part of bench/ctr.md is kept).
# The peer needs the venv of scripts/install_peer.sh plus h5py (PEER_VENV, default
# /work/peer-venv); without it the TorchRec rows are skipped with a line saying so.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT="${OUT:-out/bench-ctr}"
CTR_SCALE="${CTR_SCALE:-1}"
STEPS="${STEPS:-100}"
BATCH="${BATCH:-2048}"
EVAL="${EVAL:-65536}"
ARCHS="${ARCHS:-mlp dlrm dcnv2}"
PEER_VENV="${PEER_VENV:-/work/peer-venv}"
EMB_LR="${EMB_LR:-0.02}"
DENSE_LR="${DENSE_LR:-0.002}"
SECTION="${SECTION:-all}"
# The seed of both sides' initial weights (torusrec --seed, the peer's --seed).
SEED="${SEED:-1}"
DTYPES="${DTYPES:-f32 bf16}"
mkdir -p "$OUT" bench
if [[ $(id -u) -eq 0 ]]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
# shellcheck source=scripts/blas_env.sh
. scripts/blas_env.sh
# BIN=path: that binary, not built here.
if [[ -z ${BIN:-} ]]; then
  cargo build --release --quiet
  BIN=${CARGO_TARGET_DIR:-target}/release/torusrec
fi
MPI=(mpirun --oversubscribe --bind-to none "${BLAS_MPI_ENV[@]}")
mpi() { local np=$1; shift; timeout 3600 "${MPI[@]}" -np "$np" "$BIN" "$@"; }

LOG=$OUT/peer-fm-$CTR_SCALE.h5
N=$(( STEPS * 2 * BATCH + EVAL ))
if [[ ! -f $LOG ]] || [[ $(python3 -c "import h5py,sys; print(h5py.File(sys.argv[1])['labels'].shape[0])" "$LOG" 2>/dev/null || echo 0) -ne $N ]]; then
  "$BIN" generate clicks --preset torchrec-peer --scale "$CTR_SCALE" --planted fm --seed 1 \
    --examples "$N" --out "$LOG" --force > "$LOG.txt" 2>&1 || { echo "generate failed"; tail "$LOG.txt"; exit 1; }
fi

# The widths of each arch, the same on both sides. DLRM: bottom 13-512-256-64, top
# 512-256-1 (over the 64 + 351 interaction outputs). DCN-v2: torusrec's cross layers
# act on x0 = [pooled | dense] (1677 wide) as in the DCN-v2 paper, then the MLP
# 512-256-1; TorchRec's DLRM_DCN keeps DLRM's bottom MLP and puts its low-rank cross
# layers on [bottom output | pooled] (1728 wide), then the over arch 512-256-1.
arch_flags() {
  case $1 in
    mlp) echo "--arch mlp" ;;
    dlrm) echo "--arch dlrm --bottom-mlp 512,256,64 --top-mlp 512,256" ;;
    dcnv2) echo "--arch dcnv2 --cross-layers 3 --cross-rank 512 --dcn-structure stacked" ;;
  esac
}

metric() {
  python3 - "$@" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
fin = [r for r in rows if r.get("final")][-1]
iv = [r for r in rows if not r.get("final")]
timed = iv[1:] or iv
exs = sum(r["examples"] for r in timed) / max(sum(r["seconds"] for r in timed), 1e-9)
print(f"{exs:.0f} {fin.get('auc', float('nan')):.4f} {fin.get('logloss', float('nan')):.5f}")
PY
}

peer_ok=0
if [[ -x $PEER_VENV/bin/python ]] && (cd /tmp && "$PEER_VENV/bin/python" -c "import torchrec, h5py") 2>/dev/null; then
  peer_ok=1
fi

table=bench/ctr.md
archs_section() {
{
  echo "# Click models: mlp, DLRM and DCN-v2 beside TorchRec"
  echo
  echo "Measured $(date -u +%Y-%m-%d) at commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src || echo ' (with uncommitted changes)') on $(nproc) cores ($(cpu_line); the dense GEMM dispatches on AVX-512, \`--dense-gemm auto\`), seed $SEED on both sides, load $(cut -d' ' -f1 /proc/loadavg) at the start. Both sides share the 2 cores: one process per rank, one thread each."
  echo
  echo "Workload: \`generate clicks --preset torchrec-peer --scale $CTR_SCALE --planted fm\` ($N examples: the TorchRec peer's 26 tables of width 64, mean pooling factor 15, labels of the linear planted model plus a rank-8 factorization machine of the tables' planted factors, docs/generate.md). 2 ranks (torus 2x1 / 2 gloo processes), batch $BATCH per rank, $STEPS steps; the last $EVAL examples held out. Tables row-wise Adagrad lr $EMB_LR (eps 1e-8), dense Adagrad lr $DENSE_LR. Examples/s over steps 11-$STEPS (torusrec: log intervals after the first; TorchRec: after 10 warm-up steps)."
  echo
  echo "| arch | torusrec examples/s | TorchRec examples/s | speed-up | torusrec AUC | TorchRec AUC | AUC difference | torusrec log loss | TorchRec log loss |"
  echo "|---|---|---|---|---|---|---|---|---|"
} > "$table.part"

for arch in $ARCHS; do
  m=$OUT/$arch.jsonl
  rm -f "$m"
  # shellcheck disable=SC2046
  mpi 2 embed --data "$LOG" --eval-examples "$EVAL" --batch "$BATCH" --steps "$STEPS" \
    --log-every 10 --threads 1 --preload --table-opt rowwise-adagrad --table-lr "$EMB_LR" \
    --dense-opt adagrad --dense-lr "$DENSE_LR" $(arch_flags "$arch") --seed "$SEED" --metrics "$m" \
    > "$OUT/$arch.log" 2>&1 || { echo "torusrec $arch failed"; tail "$OUT/$arch.log"; exit 1; }
  read -r t_exs t_auc t_ll <<< "$(metric "$m")"
  p_exs=n/a; p_auc=n/a; p_ll=n/a; up=n/a; diff=n/a
  if [[ $peer_ok == 1 ]]; then
    OMP_NUM_THREADS=1 timeout 3600 "$PEER_VENV/bin/python" bench/peers/torchrec_ctr.py --log "$LOG" \
      --arch "$arch" --procs 2 --threads 1 --batch "$BATCH" --steps "$STEPS" --warmup 10 \
      --eval-examples "$EVAL" --bottom 512,256,64 --top 512,256 --cross-layers 3 \
      --cross-rank 512 --emb-lr "$EMB_LR" --dense-lr "$DENSE_LR" --seed "$SEED" > "$OUT/peer-$arch.log" 2>&1 \
      || { echo "peer $arch failed"; tail "$OUT/peer-$arch.log"; exit 1; }
    line=$(grep "^torchrec $arch examples/s=" "$OUT/peer-$arch.log")
    p_exs=$(sed -E 's/.*examples\/s=([0-9]+).*/\1/' <<< "$line")
    p_auc=$(sed -E 's/.*auc=([0-9.]+).*/\1/' <<< "$line")
    p_ll=$(sed -E 's/.*logloss=([0-9.]+).*/\1/' <<< "$line")
    up=$(python3 -c "print(f'{$t_exs/$p_exs:.2f}x')")
    diff=$(python3 -c "print(f'{$t_auc-$p_auc:+.4f}')")
  fi
  echo "| $arch | $t_exs | $p_exs | $up | $t_auc | $p_auc | $diff | $t_ll | $p_ll |" >> "$table.part"
done
{
  echo
  [[ $peer_ok == 1 ]] || echo "TorchRec not run: no venv with torchrec and h5py at $PEER_VENV (scripts/install_peer.sh, then \`$PEER_VENV/bin/pip install h5py\`)."
  echo
  echo "Reproduce: \`SECTION=archs SEED=$SEED STEPS=$STEPS BATCH=$BATCH EVAL=$EVAL CTR_SCALE=$CTR_SCALE scripts/bench_ctr.sh\` (logs in $OUT)."
} >> "$table.part"
# Keep a table-precision section measured before.
if [[ -f $table ]] && grep -q '^## Table precision' "$table"; then
  { echo; sed -n '/^## Table precision/,$p' "$table"; } >> "$table.part"
fi
mv "$table.part" "$table"
}

# One line of the precision table from a run's metrics and log: table bytes (the
# header's total and the plan's memory per rank, rows and state), exchanged bytes per
# step (all, lookup, backward), examples/s, AUC, log loss, peak RSS.
dtype_row() {
  python3 - "$@" <<'PY'
import json, re, sys
dtype, metrics, log = sys.argv[1:4]
rows = [json.loads(l) for l in open(metrics) if l.strip()]
fin = [r for r in rows if r.get("final")][-1]
iv = [r for r in rows if not r.get("final")]
timed = iv[1:] or iv
exs = sum(r["examples"] for r in timed) / max(sum(r["seconds"] for r in timed), 1e-9)
mean = lambda k: sum(r[k] for r in timed) / len(timed)
text = open(log).read()
tables = re.search(r"tables \([\d,]+ rows, ([^)]+) of (\w+)\)", text)
mem = re.search(r"memory per rank ([^\n]+)", text)
mb = lambda b: f"{b / 1e6:.1f} MB"
print(f"| {dtype} | {tables.group(1)} | {mem.group(1).strip()} | {mb(mean('bytes_per_step'))} | "
      f"{mb(mean('lookup_bytes_per_step'))} | {mb(mean('backward_bytes_per_step'))} | {exs:.0f} | "
      f"{fin['auc']:.4f} | {fin['logloss']:.5f} | {mb(fin['peak_rss_bytes'])} |")
print(f"AUC {fin['auc']:.6f}", file=sys.stderr)
PY
}

dtype_section() {
  local part=$OUT/dtype.md
  {
    echo "## Table precision (\`--table-dtype\`)"
    echo
    echo "Measured $(date -u +%Y-%m-%d) at commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src || echo ' (with uncommitted changes)') on $(nproc) cores ($(cpu_line))."
    echo
    echo "Workload: the mlp above on the same log, 2 ranks, batch $BATCH per rank, $STEPS steps, the last $EVAL examples held out, row-wise Adagrad lr $EMB_LR, dense Adagrad lr $DENSE_LR; the same plan for both (\`--plan row_block\`, \`--output-mode rows\`: the mode whose rows travel; the pooled mode's exchange is of f32 sums and gradients at any dtype). Exchanged bytes are per step, all ranks; memory per rank is rows plus the row-wise Adagrad state (one f32 a row)."
    echo
    echo "| table dtype | tables | memory per rank | exchanged | lookup | backward | examples/s | AUC | log loss | peak RSS per rank |"
    echo "|---|---|---|---|---|---|---|---|---|---|"
  } > "$part"
  local aucs=()
  for dt in $DTYPES; do
    local m=$OUT/dtype-$dt.jsonl
    rm -f "$m"
    mpi 2 embed --data "$LOG" --eval-examples "$EVAL" --batch "$BATCH" --steps "$STEPS" \
      --log-every 10 --threads 1 --preload --table-opt rowwise-adagrad --table-lr "$EMB_LR" \
      --dense-opt adagrad --dense-lr "$DENSE_LR" --arch mlp --plan row_block --output-mode rows \
      --table-dtype "$dt" --metrics "$m" > "$OUT/dtype-$dt.log" 2>&1 \
      || { echo "torusrec --table-dtype $dt failed"; tail "$OUT/dtype-$dt.log"; exit 1; }
    dtype_row "$dt" "$m" "$OUT/dtype-$dt.log" >> "$part" 2> "$OUT/dtype-$dt.auc"
    aucs+=("$(cut -d' ' -f2 "$OUT/dtype-$dt.auc")")
  done
  {
    echo
    local dts=($DTYPES)
    echo "Held-out AUC difference (${dts[1]:-?} minus ${dts[0]}): $(python3 -c "import sys; a=[float(x) for x in sys.argv[1:]]; print(f'{a[1]-a[0]:+.4f}' if len(a) > 1 else 'n/a')" "${aucs[@]}") (the issue's bound: within 0.001). One run each on a machine shared with other jobs (load $(cut -d' ' -f1 /proc/loadavg) on $(nproc) cores at the end): examples/s are not a speed measurement."
    echo
    echo "Reproduce: \`SECTION=dtype STEPS=$STEPS BATCH=$BATCH EVAL=$EVAL CTR_SCALE=$CTR_SCALE scripts/bench_ctr.sh\` (logs in $OUT/dtype-*)."
  } >> "$part"
  # Replace the section in bench/ctr.md (or append it).
  if [[ -f $table ]]; then
    sed '/^## Table precision/,$d' "$table" > "$table.part"
    sed -i -e :a -e '/^\n*$/{$d;N;ba' -e '}' "$table.part"
    { echo; cat "$part"; } >> "$table.part"
  else
    cp "$part" "$table.part"
  fi
  mv "$table.part" "$table"
}

# shellcheck source=scripts/cpu_line.sh
. scripts/cpu_line.sh
case $SECTION in
  all) archs_section; dtype_section ;;
  archs) archs_section ;;
  dtype) dtype_section ;;
  *) echo "SECTION must be all, archs or dtype, not $SECTION"; exit 2 ;;
esac
cat "$table"
