#!/bin/bash
# reprice-all.sh TAG: re-price every plan of a bench_costs output directory B (default
# out/bench-costs-amd13) with the current binary: `embed --steps 1 --costs` on its
# r1 plan files, against the median measured step of costs-runs.tsv; writes
# out/exp13/pred-TAG.tsv (name, measured, predicted step and embedding, error %).
# C=dir prices them with another bench's calibrations (C/costs-P.json; default B's own):
# a plan chosen for one calibration's low prices, priced by another one.
cd "$(dirname "${BASH_SOURCE[0]}")/../.."; mkdir -p out/exp13
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
B=${B:-out/bench-costs-amd13}; C=${C:-$B}; T=${1:-cur}; out=out/exp13/pred-$T.tsv; : > $out
pred() { # name np batch plan costs measured model...
  local name=$1 np=$2 b=$3 plan=$4 costs=$5 meas=$6; shift 6
  local line; line=$(timeout 300 mpirun --oversubscribe --bind-to none -x OPENBLAS_NUM_THREADS -np $np target/release/torusrec embed "$@" --batch $b --steps 1 --eval-examples 4096 --threads 1 --seed 1 --plan $plan --costs $costs 2>&1 | grep "predicted step")
  local p; p=$(sed -E 's/.*predicted step ([0-9.e-]+) s.*embedding: max ([0-9.e-]+) s.*/\1 \2/' <<<"$line")
  printf '%s\t%s\t%s\t%s\n' "$name" "$meas" "$p" "$(python3 -c "a,b='$p'.split()[0],'$meas';print('%+.1f'%((float(a)-float(b))/float(b)*100))")" | tee -a $out
}
for w in torchrec-peer dlrm-synthetic skewed; do for P in 2 4; do for pl in calibrated analytic lookup; do
  case $w in torchrec-peer) m="--preset torchrec-peer --scale 1";; dlrm-synthetic) m="--preset dlrm-synthetic --scale 0.1";; skewed) m="--tables $B/skewed.toml";; esac
  b=2048; [[ $w == dlrm-synthetic && $P == 4 ]] && b=1024
  pln=$pl; [[ $pl == lookup ]] && pln=lookup-greedy
  meas=$(awk -F'\t' -v w=$w -v p=$P -v pl=$pln '$1==w&&$2==p&&$3==pl{print $6}' $B/costs-runs.tsv | sort -n | sed -n 2p)
  pred "$w-$P-$pl" $P $b $B/$w-$P-$pl-r1.plan.json $C/costs-$P.json $meas $m
done; done; done
