#!/usr/bin/env bash
# Re-price the analytic and lookup-greedy plans of a bench_costs output directory with
# another binary (e.g. one built with interference-laws.patch applied, choosing a law
# with TORUSREC_LAW=L0..L4), against the steps measured in that run. The patch
# applies to e8caaaf (the commit before d24268d adopted law L3), not later:
#   git worktree add /tmp/laws e8caaaf && cd /tmp/laws
#   git apply docs/experiments/interference-laws.patch
#   CARGO_TARGET_DIR=/tmp/tgt cargo build --release
#   TORUSREC_LAW=L3 BIN=/tmp/tgt/release/torusrec RANKS=2 O=out/bench-costs7 \
#       bash docs/experiments/repredict.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
O=${O:-out/bench-costs7}
BIN=${BIN:-target/release/torusrec}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
export TORUSREC_LAW="${TORUSREC_LAW:-}"  # passed to every rank (empty: today's law)
for P in ${RANKS:-2 4}; do for W in torchrec-peer dlrm-synthetic skewed; do
  case $W in
    torchrec-peer) m=(--preset torchrec-peer --scale 1) ;;
    dlrm-synthetic) m=(--preset dlrm-synthetic --scale 0.1) ;;
    skewed) m=(--tables "$O/skewed.toml") ;;
  esac
  for k in analytic lookup; do
    kk=$k; [[ $k == lookup ]] && kk=lookup-greedy
    # This plan's runs in costs-runs.tsv: its batch per rank (column 14), predicted
    # (5) and measured (6) seconds per step.
    runs=$(awk -F'\t' -v w=$W -v p="$P" -v k=$kk '$1==w && $2==p && $3==k' "$O/costs-runs.tsv")
    B=$(cut -f14 <<<"$runs" | head -1)
    pred=$(timeout 300 mpirun --oversubscribe --bind-to none -x OPENBLAS_NUM_THREADS -x TORUSREC_LAW -np "$P" \
      "$BIN" embed "${m[@]}" --batch $B --steps 1 --eval-examples 0 --threads 1 --seed 1 \
      --plan "$O/$W-$P-$k.json" --costs "$O/costs-$P.json" 2>&1 \
      | grep -o "predicted step [0-9.]*" | head -1 | awk '{print $3}')
    meas=$(cut -f6 <<<"$runs" | sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}')
    old=$(cut -f5 <<<"$runs" | head -1)
    awk -v n="$pred" -v o="$old" -v m="$meas" -v l="$W P=$P $kk" 'BEGIN{printf "%s: new %.4f old %.4f measured %.4f error new %+.1f%% old %+.1f%%\n", l, n, o, m, 100*(n/m-1), 100*(o/m-1)}'
  done
done; done
