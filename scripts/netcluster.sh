#!/usr/bin/env bash
# A cluster of N hosts on one box: network namespaces on a bridge (docs/cluster.md).
#
#   scripts/netcluster.sh up N [--rate R] [--delay D]   # hosts h1..hN, R e.g. 10gbit, D e.g. 50us
#   scripts/netcluster.sh mpirun ARGS...                 # mpirun ARGS across the hosts
#   scripts/netcluster.sh pids H                         # the processes of host H (1..N)
#   scripts/netcluster.sh exec H CMD...                  # CMD inside host H
#   scripts/netcluster.sh link H down|up                 # cut or restore host H's link
#   scripts/netcluster.sh bytes                          # per host: bytes sent, received
#   scripts/netcluster.sh down                           # remove everything `up` made
#
# Host K is the namespace trc-hK with interface eth0 at $TRC_NET.K (default 198.18.19.K,
# RFC 2544's benchmarking range: never routed, no default route in any host) on the
# bridge trc-br in the switch namespace trc-sw; nothing is added to the root namespace
# but the namespaces themselves. Names h1..hN resolve inside the hosts through
# /etc/netns/trc-hK/hosts (bind-mounted over /etc/hosts by `ip netns exec`). Each process
# started in a host also gets its own UTS namespace named hK, so MPI_Get_processor_name
# names the host. --rate shapes both directions of each host's link (netem on the host's
# eth0 and on the switch's port to it; tbf where the kernel has no sch_netem); --delay is
# added once, on the host's egress, so a message from one host to another is delayed by D
# (a round trip by 2D; refused without sch_netem).
#
# `mpirun` runs Open MPI's mpirun inside h1 with a hostfile of h1..hN (one slot each, so
# one rank per host unless ARGS say otherwise), this script as the launch agent
# (`agent HOST CMD` enters host HOST's namespaces: there is no sshd), TCP only between
# all ranks (`--mca btl tcp,self`, no shared memory even on one host), the out-of-band and
# MPI traffic on the bridge's subnet, and the environment scripts/run.sh passes
# (mpi_env.sh, OPENBLAS_NUM_THREADS). mpirun's keepalives to its daemons are shortened
# (5 s idle, 3 probes 2 s apart; Open MPI's default is 300 s + 9 x 20 s) so that mpirun
# itself notices a host whose link is down within about 11 s and ends the job; and the
# ranks it ends get 3 s between SIGTERM and SIGKILL (default 1 s), time for each to
# probe its peers and name the lost ones (docs/cluster.md).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SELF="$HERE/$(basename "${BASH_SOURCE[0]}")"
NET="${TRC_NET:-198.18.19}"
STATE=/run/torusrec-netcluster
SW=trc-sw
BR=trc-br

die() {
    echo "netcluster: $*" >&2
    exit 2
}

hosts() {
    [[ -f $STATE/hosts ]] || die "no cluster is up (scripts/netcluster.sh up N)"
    cat "$STATE/hosts"
}

ns_of() {
    local h=$1
    [[ $h =~ ^h?([0-9]+)$ ]] || die "host '$h': expected 1..N or h1..hN"
    local k=${BASH_REMATCH[1]} n
    n=$(hosts)
    ((k >= 1 && k <= n)) || die "host $k: the cluster has hosts 1..$n"
    echo "trc-h$k"
}

cmd_down() {
    local ns
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^trc-(h[0-9]+|sw)$' || true); do
        # Every process still in the host's network namespace first.
        local pids
        pids=$(ip netns pids "$ns" 2>/dev/null || true)
        if [[ -n $pids ]]; then
            # shellcheck disable=SC2086
            kill -9 $pids 2>/dev/null || true
        fi
        ip netns del "$ns" 2>/dev/null || true
        rm -rf "/etc/netns/$ns"
    done
    rmdir /etc/netns 2>/dev/null || true
    rm -rf "$STATE"
}

# During `up`: say why, remove what was made, exit 2.
fail_up() {
    echo "netcluster: $*" >&2
    cmd_down >/dev/null 2>&1 || true
    exit 2
}

# shape NS DEV RATE DELAY: netem (rate and/or delay) on DEV in namespace NS. Where the
# kernel has no sch_netem, a rate alone falls back to tbf (token bucket, burst = 10 ms of
# the rate); a delay cannot be had without netem and is refused.
shape() {
    local ns=$1 dev=$2 rate=$3 delay=$4 err
    local q=(netem limit 100000)
    [[ -n $delay ]] && q+=(delay "$delay")
    [[ -n $rate ]] && q+=(rate "$rate")
    if err=$(ip netns exec "$ns" tc qdisc add dev "$dev" root "${q[@]}" 2>&1); then
        return 0
    fi
    if [[ $err != *"qdisc kind is unknown"* ]]; then
        fail_up "tc qdisc add dev $dev (namespace $ns) ${q[*]}: $err"
    fi
    [[ -z $delay ]] || fail_up "--delay $delay needs the kernel's sch_netem, which this kernel does not have (tc: $err); --rate alone falls back to tbf"
    local bps
    case ${rate,,} in
    *gbit) bps=$((${rate%[gG]bit} * 125000000)) ;;
    *mbit) bps=$((${rate%[mM]bit} * 125000)) ;;
    *) fail_up "--rate $rate: without sch_netem (tbf fallback) the rate must be Ngbit or Nmbit" ;;
    esac
    ip netns exec "$ns" tc qdisc add dev "$dev" root tbf rate "$rate" burst $((bps / 100)) latency 50ms ||
        fail_up "tc qdisc add dev $dev (namespace $ns) tbf rate $rate failed"
    echo "netcluster: no sch_netem in this kernel: $dev in $ns shaped with tbf rate $rate" >&2
}

cmd_up() {
    [[ $# -ge 1 ]] || die "usage: up N [--rate R] [--delay D]"
    local n=$1 rate="" delay=""
    shift
    [[ $n =~ ^[0-9]+$ ]] && ((n >= 1 && n <= 250)) || die "up: N must be 1..250, not '$n'"
    while [[ $# -gt 0 ]]; do
        case $1 in
        --rate) rate=${2:?--rate needs a value, e.g. 10gbit}; shift 2 ;;
        --delay) delay=${2:?--delay needs a value, e.g. 50us}; shift 2 ;;
        *) die "up: unknown option '$1'" ;;
        esac
    done
    if ip netns list 2>/dev/null | grep -qE '^trc-'; then
        die "a cluster is already up (scripts/netcluster.sh down first)"
    fi
    ip netns add "$SW" || die "cannot make network namespaces here (ip netns add failed)"
    trap 'cmd_down' ERR
    mkdir -p "$STATE"
    echo "$n" >"$STATE/hosts"
    echo "rate=${rate:-none} delay=${delay:-none}" >"$STATE/link"
    ip -n "$SW" link add "$BR" type bridge
    ip -n "$SW" link set "$BR" up
    ip -n "$SW" link set lo up
    local hostsfile k ns
    hostsfile=$(printf '127.0.0.1 localhost\n'; for ((k = 1; k <= n; k++)); do echo "$NET.$k h$k"; done)
    for ((k = 1; k <= n; k++)); do
        ns="trc-h$k"
        ip netns add "$ns"
        mkdir -p "/etc/netns/$ns"
        echo "$hostsfile" >"/etc/netns/$ns/hosts"
        ip -n "$SW" link add "p$k" type veth peer name eth0 netns "$ns"
        ip -n "$SW" link set "p$k" master "$BR" up
        ip -n "$ns" link set lo up
        ip -n "$ns" addr add "$NET.$k/24" dev eth0
        ip -n "$ns" link set eth0 up
        if [[ -n $rate || -n $delay ]]; then
            shape "$ns" eth0 "$rate" "$delay"
            [[ -z $rate ]] || shape "$SW" "p$k" "$rate" ""
        fi
    done
    trap - ERR
    echo "netcluster: $n hosts h1..h$n at $NET.1..$NET.$n (rate ${rate:-unlimited}, delay ${delay:-none})"
}

# The launch agent: Open MPI calls `agent HOST REMOTE-COMMAND...` as it would ssh.
cmd_agent() {
    local host=$1
    shift
    local ns
    ns=$(ns_of "$host")
    exec ip netns exec "$ns" unshare --uts sh -c 'hostname "$0" && exec sh -c "$*"' "h${ns#trc-h}" "$@"
}

cmd_exec() {
    local ns
    ns=$(ns_of "${1:?exec: which host}")
    shift
    exec ip netns exec "$ns" unshare --uts sh -c 'hostname "$0" && exec "$@"' "h${ns#trc-h}" "$@"
}

cmd_mpirun() {
    local n k hf
    n=$(hosts)
    hf="$STATE/hostfile"
    : >"$hf"
    for ((k = 1; k <= n; k++)); do echo "h$k slots=1" >>"$hf"; done
    # shellcheck source=scripts/mpi_env.sh
    . "$HERE/mpi_env.sh"
    # shellcheck source=scripts/blas_env.sh
    . "$HERE/blas_env.sh"
    cmd_exec 1 mpirun --hostfile "$hf" \
        --mca plm_rsh_agent "$SELF agent" \
        --mca btl tcp,self \
        --mca btl_tcp_if_include "$NET.0/24" \
        --mca oob_tcp_if_include "$NET.0/24" \
        --mca oob_tcp_keepalive_time 5 --mca oob_tcp_keepalive_intvl 2 \
        --mca oob_tcp_keepalive_probes 3 --mca odls_base_sigkill_timeout 3 \
        --bind-to none "${BLAS_MPI_ENV[@]}" -x PMIX_MCA_psec "$@"
}

cmd_pids() {
    local ns
    ns=$(ns_of "${1:?pids: which host}")
    ip netns pids "$ns"
}

cmd_link() {
    local ns
    ns=$(ns_of "${1:?link: which host}")
    local k=${ns#trc-h}
    case ${2:-} in
    down | up) ip -n "$SW" link set "p$k" "$2" ;;
    *) die "link: expected 'down' or 'up'" ;;
    esac
}

cmd_bytes() {
    local n k
    n=$(hosts)
    echo -e "host\ttx_bytes\trx_bytes"
    for ((k = 1; k <= n; k++)); do
        echo -e "h$k\t$(ip netns exec "trc-h$k" cat /sys/class/net/eth0/statistics/tx_bytes)\t$(ip netns exec "trc-h$k" cat /sys/class/net/eth0/statistics/rx_bytes)"
    done
}

case ${1:-} in
up) shift; cmd_up "$@" ;;
down) cmd_down ;;
agent) shift; cmd_agent "$@" ;;
exec) shift; cmd_exec "$@" ;;
mpirun) shift; cmd_mpirun "$@" ;;
pids) shift; cmd_pids "$@" ;;
link) shift; cmd_link "$@" ;;
bytes) cmd_bytes ;;
*) die "usage: $0 up N [--rate R] [--delay D] | mpirun ARGS... | pids H | exec H CMD... | link H down|up | bytes | down" ;;
esac
