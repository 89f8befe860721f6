#!/usr/bin/env bash
# A real one-node Slurm cluster on this machine, for testing job scripts for real
# (sbatch, --signal, --requeue, scancel --signal=USR1 --batch, scontrol requeue).
# Recipe: docs/slurm-local.md. Needs root (SlurmUser=root, apt-get, munge key).
#
#   eval "$(scripts/slurm-local.sh start)"   # starts it; stdout is only `export SLURM_CONF=...`
#   scripts/slurm-local.sh status
#   scripts/slurm-local.sh stop
#   scripts/slurm-local.sh munge-start   # only the packages and munged (scripts/slurm-cluster.sh)
#   scripts/slurm-local.sh munge-stop    # munged, if this state directory started it
#
# Environment:
#   SLURM_LOCAL_DIR   state directory (default /tmp/torusrec-slurm): slurm.conf, state, spool,
#                     logs and the pid files of the daemons this script started
#   SLURM_LOCAL_CPUS  CPUs the node claims (default 16; more than the machine has is fine)
#   SLURMCTLD_PORT, SLURMD_PORT   (default 6817, 6818)
#   SLURM_LOCAL_CRED_EXPIRE   credential lifetime in seconds, which is also how long a
#                     requeued job waits before it can start again (default 10; Slurm's 120)
#
# All messages go to stderr; `start` prints the export line on stdout. Idempotent: `start`
# on a running cluster only checks it, `stop` on a stopped one does nothing. `stop` only
# ends processes by the pids recorded in the state directory (never pkill).
set -euo pipefail
# shellcheck source=scripts/slurm_conf.sh
. "$(dirname "${BASH_SOURCE[0]}")/slurm_conf.sh"   # the slurm.conf lines shared with slurm-cluster.sh

DIR="${SLURM_LOCAL_DIR:-/tmp/torusrec-slurm}"
CPUS="${SLURM_LOCAL_CPUS:-16}"
CTLD_PORT="${SLURMCTLD_PORT:-6817}"
SLURMD_PORT="${SLURMD_PORT:-6818}"
# Seconds a requeued job waits before it may start again (Slurm's default is 120).
CRED_EXPIRE="${SLURM_LOCAL_CRED_EXPIRE:-10}"
CONF="$DIR/slurm.conf"
NODE="$(hostname -s)"
MUNGE_KEY=/etc/munge/munge.key
START_TIMEOUT=60

log() { echo "slurm-local: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# proc_is PID NAME: PID is a live process whose command name is NAME (guards against a
# stale pid file whose pid was reused by something else).
proc_is() {
    [[ $1 =~ ^[0-9]+$ && -r /proc/$1/comm && $(</proc/"$1"/comm) == "$2" ]] 2>/dev/null
}

# pid_alive FILE NAME: the pid recorded in FILE is a live NAME process.
pid_alive() {
    [[ -s $1 ]] && proc_is "$(<"$1")" "$2"
}

# stop_pid FILE NAME: SIGTERM the pid recorded in FILE (if it is NAME), wait up to 10 s
# for it to go (the daemons remove their pid file before they finish), then SIGKILL.
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
        if proc_is "$pid" "$name"; then
            log "$name (pid $pid) still running; SIGKILL"
            kill -KILL "$pid" 2>/dev/null || true
        fi
    fi
    rm -f "$f"
}

print_logs() {
    local f
    for f in "$DIR"/log/slurmctld.log "$DIR"/log/slurmd.log "$DIR"/log/munged.log; do
        [[ -f $f ]] || continue
        echo "----- $f (last 40 lines)" >&2
        tail -n 40 "$f" >&2
    done
}

need_root() {
    [[ $(id -u) -eq 0 ]] || die "must run as root (SlurmUser=root, munge key, apt-get)"
}

# --- packages -------------------------------------------------------------------------
install_packages() {
    if command -v slurmctld >/dev/null && command -v slurmd >/dev/null \
        && command -v sbatch >/dev/null && command -v munged >/dev/null; then
        return
    fi
    command -v apt-get >/dev/null || die "slurm-wlm/munge are missing and there is no apt-get"
    log "installing slurm-wlm and munge with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2 || die "apt-get update failed"
    apt-get install -y -qq --no-install-recommends slurm-wlm munge >&2 \
        || die "apt-get install slurm-wlm munge failed"
    if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null; then
        die "slurmctld/slurmd not found after installing slurm-wlm"
    fi
}

# --- munge ----------------------------------------------------------------------------
munge_ok() { munge -n 2>/dev/null | unmunge 2>/dev/null | grep -q 'STATUS:.*Success'; }

start_munge() {
    getent passwd munge >/dev/null || die "user munge does not exist (is the munge package installed?)"
    if [[ ! -s $MUNGE_KEY ]]; then
        log "creating $MUNGE_KEY"
        mkdir -p /etc/munge
        dd if=/dev/urandom of="$MUNGE_KEY" bs=1 count=1024 status=none
    fi
    chown munge:munge /etc/munge "$MUNGE_KEY"
    chmod 700 /etc/munge
    chmod 400 "$MUNGE_KEY"
    mkdir -p /run/munge /var/lib/munge /var/log/munge
    chown munge:munge /run/munge /var/lib/munge /var/log/munge
    chmod 755 /run/munge

    if munge_ok; then
        # Already running: ours if the recorded pid is alive, otherwise someone else's
        # munged, which we use but never stop.
        pid_alive "$DIR/munged.pid" munged || log "using an already running munged"
        return
    fi
    log "starting munged"
    rm -f /run/munge/munged.pid
    # As root munged refuses without --force (it warns and runs).
    munged --force --log-file="$DIR/log/munged.log" --pid-file=/run/munge/munged.pid \
        2>>"$DIR/log/munged.log" || { print_logs; die "munged did not start"; }
    local i
    for ((i = 0; i < 50; i++)); do
        [[ -s /run/munge/munged.pid ]] && munge_ok && break
        sleep 0.1
    done
    [[ -s /run/munge/munged.pid ]] && cp /run/munge/munged.pid "$DIR/munged.pid"
    munge_ok || { print_logs; die "munge -n | unmunge does not say Success"; }
    log "munge works (munged pid $(cat "$DIR/munged.pid" 2>/dev/null || echo '?'))"
}

# --- slurm.conf -----------------------------------------------------------------------
# write_conf FILE: the cluster's slurm.conf.
write_conf() {
    cat >"$1" <<EOF
# Written by scripts/slurm-local.sh: a one-node test cluster (see docs/slurm-local.md).
ClusterName=torusrec-local
SlurmctldHost=$NODE
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
$(slurm_conf_common "$CRED_EXPIRE")
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
NodeName=$NODE CPUs=$CPUS State=UNKNOWN
PartitionName=local Nodes=$NODE Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
EOF
}

node_state() { sinfo -h -n "$NODE" -o %t 2>/dev/null | head -n1; }

# --- commands -------------------------------------------------------------------------
cmd_start() {
    need_root
    mkdir -p "$DIR"/state "$DIR"/spool "$DIR"/log || die "cannot create the state directory $DIR"
    install_packages
    start_munge
    export SLURM_CONF="$CONF"

    local ctld_up=0 slurmd_up=0 same_conf=0
    pid_alive "$DIR/slurmctld.pid" slurmctld && ctld_up=1
    pid_alive "$DIR/slurmd.pid" slurmd && slurmd_up=1
    write_conf "$CONF.new"
    cmp -s "$CONF.new" "$CONF" && same_conf=1
    if ((ctld_up && slurmd_up && same_conf)); then
        rm -f "$CONF.new"
        log "already running (slurmctld $(<"$DIR/slurmctld.pid"), slurmd $(<"$DIR/slurmd.pid"))"
    else
        # Not running, half running, or another config: (re)start both with a clean state.
        ((ctld_up || slurmd_up)) && log "restarting (config changed or a daemon is down)"
        stop_pid "$DIR/slurmd.pid" slurmd
        stop_pid "$DIR/slurmctld.pid" slurmctld
        mv "$CONF.new" "$CONF"
        log "starting slurmctld and slurmd (config $CONF, node $NODE, CPUs=$CPUS)"
        # -c: clear previous state (no jobs carried over from an old run).
        slurmctld -c -f "$CONF" || { print_logs; die "slurmctld did not start"; }
        slurmd -c -f "$CONF" || { print_logs; die "slurmd did not start"; }
    fi

    # Wait until the node is idle (or already running jobs: mixed/allocated).
    local t0=$SECONDS st=""
    while ((SECONDS - t0 < START_TIMEOUT)); do
        st=$(node_state || true)
        case "$st" in
            idle | mix | mixed | alloc | allocated) break ;;
        esac
        sleep 1
    done
    case "$st" in
        idle | mix | mixed | alloc | allocated) ;;
        *)
            sinfo >&2 || true
            scontrol show node "$NODE" >&2 || true
            print_logs
            die "node $NODE is not idle after ${START_TIMEOUT}s (state '${st:-none}')"
            ;;
    esac
    log "node $NODE is $st after $((SECONDS - t0))s"
    echo "export SLURM_CONF=$CONF"
}

cmd_stop() {
    export SLURM_CONF="$CONF"
    if pid_alive "$DIR/slurmctld.pid" slurmctld; then
        # Jobs of this private cluster only (SLURM_CONF points at it).
        local jobs
        jobs=$(squeue -h -o %i 2>/dev/null || true)
        if [[ -n $jobs ]]; then
            log "cancelling jobs: ${jobs//$'\n'/ }"
            # shellcheck disable=SC2086
            scancel $jobs 2>/dev/null || true
            sleep 2
        fi
        local ctld_pid slurmd_pid i
        ctld_pid=$(cat "$DIR/slurmctld.pid" 2>/dev/null || true)
        slurmd_pid=$(cat "$DIR/slurmd.pid" 2>/dev/null || true)
        log "scontrol shutdown"
        scontrol shutdown >&2 || log "scontrol shutdown failed; stopping by pid"
        for ((i = 0; i < 150; i++)); do
            proc_is "$ctld_pid" slurmctld || proc_is "$slurmd_pid" slurmd || break
            sleep 0.1
        done
        # The daemons delete their pid files on the way out; put them back for stop_pid
        # if they are somehow still there.
        proc_is "$ctld_pid" slurmctld && echo "$ctld_pid" >"$DIR/slurmctld.pid"
        proc_is "$slurmd_pid" slurmd && echo "$slurmd_pid" >"$DIR/slurmd.pid"
    fi
    # Whatever did not go down with scontrol shutdown, by recorded pid only.
    stop_pid "$DIR/slurmd.pid" slurmd
    stop_pid "$DIR/slurmctld.pid" slurmctld
    stop_pid "$DIR/munged.pid" munged
    log "stopped"
}

cmd_status() {
    export SLURM_CONF="$CONF"
    local rc=0 name
    for name in munged slurmctld slurmd; do
        if pid_alive "$DIR/$name.pid" "$name"; then
            echo "$name: running (pid $(<"$DIR/$name.pid"))"
        else
            echo "$name: not running (no live pid in $DIR/$name.pid)"
            [[ $name == munged ]] && munge_ok && echo "munged: (an external munged answers)" && continue
            rc=1
        fi
    done
    if ((rc == 0)); then
        echo "SLURM_CONF=$CONF"
        sinfo || rc=1
        squeue || rc=1
    fi
    return "$rc"
}

cmd_munge_start() {
    need_root
    mkdir -p "$DIR"/log || die "cannot create the state directory $DIR"
    install_packages
    start_munge
}

case "${1:-}" in
    start) cmd_start ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    munge-start) cmd_munge_start ;;
    munge-stop) stop_pid "$DIR/munged.pid" munged ;;
    *)
        echo "usage: $0 start|stop|status|munge-start|munge-stop   (state dir: $DIR, env SLURM_LOCAL_DIR)" >&2
        exit 2
        ;;
esac
