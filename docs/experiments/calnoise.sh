#!/usr/bin/env bash
# Calibrations at 2 ranks, interleaved: /tmp/torusrec-base (HEAD) and /tmp/torusrec-exp
# (HEAD with docs/experiments/pooled-min-seconds.patch), each built with cargo build
# --release and copied there. Run from the repository root; fitted values per file:
# python3 over out/calnoise/*.json (docs/calibrate.md).
set -u
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1 PMIX_MCA_psec=native
mkdir -p out/calnoise && cd out/calnoise
for i in 1 2 3; do
  for v in base exp; do
    s=$(date +%s)
    timeout 900 mpirun --oversubscribe --bind-to none -x OPENBLAS_NUM_THREADS -np 2 /tmp/torusrec-$v calibrate --threads 1 --out $v-$i.json --force > $v-$i.log 2>&1
    echo "$v-$i rc=$? $(( $(date +%s) - s )) s $(date +%T)"
  done
done
