# Sourced by scripts/run.sh and scripts/test.sh: Open MPI's launch environment.
#
# As root, Open MPI refuses to start without these two.
if [[ $(id -u) -eq 0 ]]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
# PMIx checks a local rank by the node's credentials, not munge: with munge installed
# (the Slurm tests add it) but its daemon stopped, every mpirun and every singleton
# rank would otherwise retry munge's socket for ~2.3 s. A value already set wins.
export PMIX_MCA_psec="${PMIX_MCA_psec:-native}"
