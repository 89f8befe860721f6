#!/usr/bin/env bash
# A Slurm cluster of N nodes on one box: one slurmd per network-namespace host of
# scripts/netcluster.sh, under one slurmctld on the switch (docs/cluster.md, "Slurm").
#
#   scripts/slurm-cluster.sh up N [--rate R] [--delay D]   # netcluster up N + Slurm on it
#   scripts/slurm-cluster.sh run CMD...       # a Slurm client (sbatch, squeue, scontrol...)
#   scripts/slurm-cluster.sh kill H           # SIGKILL every process of host H (its slurmd,
#                                             # slurmstepd, orted, ranks): a node failure
#   scripts/slurm-cluster.sh status
#   scripts/slurm-cluster.sh down             # stop Slurm, then netcluster down
#
# Node hK is host K of netcluster (namespace trc-hK, 198.18.19.K), its slurmd started
# there as `slurmd -N hK` in the host's UTS namespace (hostname hK). slurmctld runs in the
# switch namespace trc-sw with the address 198.18.19.254 on the bridge, under the host
# name `ctl`: every host reaches it on the bridge, it survives any host's failure or cut
# link (as a real controller on its own machine), and the root namespace gets no
# interface or address. Clients therefore run in the switch namespace (`run`) or in a
# host (`netcluster.sh exec K`, and the job scripts themselves). munged runs in the root
# namespace; its socket /run/munge/munge.socket.2 is on the shared filesystem, so every
# namespace authenticates through the one daemon and key (scripts/slurm-local.sh
# munge-start). All Slurm traffic is between 198.18.19.0/24 addresses.
#
# Environment: SLURM_CLUSTER_DIR (state, default /tmp/torusrec-slurm-cluster: slurm.conf,
#   state, spool, logs, pid files), SLURM_CLUSTER_CPUS (CPUs each node claims, default 2),
#   SLURM_CLUSTER_SLURMD_TIMEOUT (seconds without an answer before slurmctld sets a node
#   DOWN, default 10; Slurm's 300), SLURM_LOCAL_CRED_EXPIRE (as slurm-local.sh: seconds a
#   requeued job waits, default 10), TRC_NET (netcluster's first three octets).
# Messages go to stderr; `up` prints `export SLURM_CONF=...` on stdout (for clients run
# through `run` or inside the hosts). `down` ends only processes by recorded pid, then
# whatever is left in the namespaces (netcluster.sh down).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=scripts/slurm_conf.sh
. "$HERE/slurm_conf.sh"   # the slurm.conf lines shared with slurm-local.sh
NETC="$HERE/netcluster.sh"
DIR="${SLURM_CLUSTER_DIR:-/tmp/torusrec-slurm-cluster}"
CPUS="${SLURM_CLUSTER_CPUS:-2}"
SLURMD_TIMEOUT="${SLURM_CLUSTER_SLURMD_TIMEOUT:-10}"
CRED_EXPIRE="${SLURM_LOCAL_CRED_EXPIRE:-10}"
NET="${TRC_NET:-198.18.19}"
CTL_ADDR="$NET.254"
CONF="$DIR/slurm.conf"
SW=trc-sw
BR=trc-br
START_TIMEOUT=60

log() { echo "slurm-cluster: $*" >&2; }
die() {
    log "ERROR: $*"
    exit 1
}

proc_is() {
    [[ $1 =~ ^[0-9]+$ && -r /proc/$1/comm && $(</proc/"$1"/comm) == "$2" ]] 2>/dev/null
}

# stop_pid FILE NAME: SIGTERM the pid in FILE if it is a NAME, SIGKILL after 10 s.
stop_pid() {
    local f=$1 name=$2 pid="" i
    [[ -s $f ]] && pid=$(<"$f")
    if proc_is "$pid" "$name"; then
        log "stopping $name (pid $pid)"
        kill -TERM "$pid" 2>/dev/null || true
        for ((i = 0; i < 100; i++)); do
            proc_is "$pid" "$name" || break
            sleep 0.1
        done
        proc_is "$pid" "$name" && kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$f"
}

nodes() {
    [[ -s $DIR/nodes ]] || die "no Slurm cluster is up (scripts/slurm-cluster.sh up N)"
    cat "$DIR/nodes"
}

# in_host K CMD...: CMD in host K's network namespace, its own UTS namespace named hK and
# a private mount namespace with the host's /etc/hosts bound over /etc/hosts. Unlike
# `ip netns exec` (netcluster.sh exec), /sys is not remounted: slurmd (22.05) will not
# start without the cgroup hierarchy under /sys/fs/cgroup, even with proctrack/linuxproc.
in_host() {
    local k=$1
    shift
    nsenter --net="/run/netns/trc-h$k" unshare --mount --uts sh -c \
        'mount --bind "/etc/netns/trc-h$0/hosts" /etc/hosts && hostname "h$0" && exec "$@"' "$k" "$@"
}

# client CMD...: a Slurm client in the switch namespace, against this cluster.
client() { ip netns exec "$SW" env SLURM_CONF="$CONF" "$@"; }

print_logs() {
    local f
    for f in "$DIR"/log/*.log; do
        [[ -f $f ]] || continue
        echo "----- $f (last 30 lines)" >&2
        tail -n 30 "$f" >&2
    done
}

write_conf() {
    local n=$1 k
    cat <<EOF
# Written by scripts/slurm-cluster.sh: $n nodes in network namespaces (docs/cluster.md).
ClusterName=torusrec-ns
SlurmctldHost=ctl($CTL_ADDR)
SlurmctldPort=6817
SlurmdPort=6818
$(slurm_conf_common "$CRED_EXPIRE")
# A node that does not answer for this long is DOWN: its jobs are requeued (--requeue)
# or ended, and a requeued job's clean-up on it stops waiting for it.
SlurmdTimeout=$SLURMD_TIMEOUT
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
EOF
    for ((k = 1; k <= n; k++)); do
        echo "NodeName=h$k NodeAddr=$NET.$k CPUs=$CPUS State=UNKNOWN"
    done
    echo "PartitionName=ns Nodes=h[1-$n] Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4"
}

# wait_idle N: every node idle (or running jobs), within START_TIMEOUT.
wait_idle() {
    local n=$1 t0=$SECONDS up
    while ((SECONDS - t0 < START_TIMEOUT)); do
        up=$(client sinfo -h -N -o '%N %t' 2>/dev/null | grep -cE ' (idle|mix|alloc)$' || true)
        ((up == n)) && { log "$n nodes idle after $((SECONDS - t0))s"; return 0; }
        sleep 1
    done
    client sinfo -N >&2 || true
    log "ERROR: the nodes are not idle after ${START_TIMEOUT}s"
    return 1
}

cmd_up() {
    [[ $(id -u) -eq 0 ]] || die "must run as root (namespaces, SlurmUser=root, munge key)"
    local n=${1:?up: how many nodes}
    [[ $n =~ ^[0-9]+$ ]] && ((n >= 1 && n <= 250)) || die "up: N must be 1..250, not '$n'"
    [[ -s $DIR/nodes ]] && die "a Slurm cluster is already up ($DIR; slurm-cluster.sh down first)"
    rm -rf "$DIR"/state "$DIR"/spool "$DIR"/log "$CONF"
    mkdir -p "$DIR"/state "$DIR"/log || die "cannot create $DIR"
    SLURM_LOCAL_DIR="$DIR" "$HERE/slurm-local.sh" munge-start || die "munge did not start"
    if ! "$NETC" up "$@" >&2; then
        SLURM_LOCAL_DIR="$DIR" "$HERE/slurm-local.sh" munge-stop
        die "netcluster.sh up $* failed"
    fi
    echo "$n" >"$DIR/nodes"
    trap 'print_logs; cmd_down' ERR
    # The controller's address on the bridge, and its name in every namespace.
    ip -n "$SW" addr add "$CTL_ADDR/24" dev "$BR"
    local k
    mkdir -p "/etc/netns/$SW"
    cp "/etc/netns/trc-h1/hosts" "/etc/netns/$SW/hosts"
    for ((k = 1; k <= n; k++)); do
        echo "$CTL_ADDR ctl" >>"/etc/netns/trc-h$k/hosts"
        mkdir -p "$DIR/spool/h$k"
    done
    echo "$CTL_ADDR ctl" >>"/etc/netns/$SW/hosts"
    write_conf "$n" >"$CONF"
    log "starting slurmctld on the switch ($CTL_ADDR) and slurmd on h1..h$n (config $CONF)"
    # -c: a clean state (no jobs from an earlier cluster). Both daemonize in the namespaces.
    ip netns exec "$SW" unshare --uts sh -c 'hostname ctl && exec slurmctld -c -f "$0"' "$CONF"
    for ((k = 1; k <= n; k++)); do
        in_host "$k" slurmd -c -f "$CONF" -N "h$k"
    done
    trap - ERR
    if ! wait_idle "$n"; then
        print_logs
        cmd_down
        exit 1
    fi
    echo "export SLURM_CONF=$CONF"
}

cmd_down() {
    local n="" k
    [[ -s $DIR/nodes ]] && n=$(<"$DIR/nodes")
    if [[ -n $n ]]; then
        local jobs
        jobs=$(client squeue -h -o %i 2>/dev/null || true)
        if [[ -n $jobs ]]; then
            log "cancelling jobs: ${jobs//$'\n'/ }"
            # shellcheck disable=SC2086
            client scancel $jobs 2>/dev/null || true
            sleep 1
        fi
        for ((k = 1; k <= n; k++)); do stop_pid "$DIR/slurmd-h$k.pid" slurmd; done
        stop_pid "$DIR/slurmctld.pid" slurmctld
        # Whatever is left in the namespaces (slurmstepd, ranks) goes with them. Only a
        # netcluster this script brought up (DIR/nodes is written right after it).
        "$NETC" down
    fi
    SLURM_LOCAL_DIR="$DIR" "$HERE/slurm-local.sh" munge-stop
    rm -f "$DIR/nodes"
    log "down"
}

cmd_kill() {
    local h=${1:?kill: which host}
    local pids
    pids=$("$NETC" pids "$h")
    # shellcheck disable=SC2086
    [[ -n $pids ]] && kill -KILL $pids 2>/dev/null
    log "host $h: SIGKILL to $(echo $pids | wc -w) processes"
}

cmd_status() {
    local n k
    n=$(nodes)
    for ((k = 1; k <= n; k++)); do
        if [[ -s $DIR/slurmd-h$k.pid ]] && proc_is "$(<"$DIR/slurmd-h$k.pid")" slurmd; then
            echo "slurmd h$k: running (pid $(<"$DIR/slurmd-h$k.pid"))"
        else
            echo "slurmd h$k: not running"
        fi
    done
    echo "SLURM_CONF=$CONF"
    client sinfo -N
    client squeue
}

case ${1:-} in
up) shift; cmd_up "$@" ;;
down) cmd_down ;;
run) shift; nodes >/dev/null; client "$@" ;;
kill) shift; cmd_kill "$@" ;;
status) cmd_status ;;
*) die "usage: $0 up N [--rate R] [--delay D] | run CMD... | kill H | status | down" ;;
esac
