# shellcheck shell=bash
# The slurm.conf lines the one-node cluster (scripts/slurm-local.sh) and the namespace
# cluster (scripts/slurm-cluster.sh) share; each script writes its own name, hosts,
# ports, paths, nodes and partition around them. Sourced, never run.

# slurm_conf_common CRED_EXPIRE: print the shared lines.
slurm_conf_common() {
    cat <<EOF2
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire is also the delay before a requeued job may start again (default 120 s).
AuthInfo=cred_expire=$1
# No cgroups in a container: track processes by parent pid, no task binding.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
# Look at pending jobs every 2 s (defaults 60 s and 30 s), so a requeued job starts soon
# after its begin time.
SchedulerParameters=sched_interval=2,bf_interval=2
MpiDefault=none
SwitchType=switch/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
# Requeue: allowed; exit 75 (preempted, checkpoint written) requeues by itself, as a
# fallback for job scripts that cannot run scontrol; exit 76 (training hold) is not
# requeued: a person looks at HOLD.json (docs/design.md, exit codes).
JobRequeue=1
RequeueExit=75
# A node whose slurmd answers again returns to service by itself.
ReturnToService=2
# Keep finished jobs visible to scontrol for 10 minutes.
MinJobAge=600
KillWait=30
SlurmctldDebug=info
SlurmdDebug=info
# Let a node claim more CPUs than the machine has (CPUs= below), so that many ranks fit.
SlurmdParameters=config_overrides
EOF2
}
