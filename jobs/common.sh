# Sourced by jobs/*.sbatch (after they define `say` and find REPO): the rank count, the
# launch under mpirun with signal forwarding, and what each exit code means (requeue,
# hold, requeue without a lost node). Not a job script itself.
#
#   job_ranks            sets RANKS and MAP_BY from RANKS / RANKS_PER_NODE (exit 2 if both)
#   job_run ARGS...      mpirun -np $RANKS $TORUSREC ARGS...; exits with the job's code

# --- ranks ------------------------------------------------------------------------------
# RANKS_PER_NODE: RANKS = RANKS_PER_NODE x the nodes of this run's allocation, placed
# that many per node. With a node range (`sbatch -N 1-2 --spread-job`) a job requeued
# without a failed node then runs on fewer ranks (docs/cluster.md, "Slurm").
job_ranks() {
    RANKS_PER_NODE="${RANKS_PER_NODE:-}"
    MAP_BY=()
    if [[ -n $RANKS_PER_NODE ]]; then
        if [[ -n ${RANKS:-} ]]; then
            say "give RANKS ($RANKS) or RANKS_PER_NODE ($RANKS_PER_NODE), not both"
            return 2
        fi
        if ! [[ $RANKS_PER_NODE =~ ^[1-9][0-9]*$ ]]; then
            say "RANKS_PER_NODE must be a positive integer, not '$RANKS_PER_NODE'"
            return 2
        fi
        RANKS=$((RANKS_PER_NODE * ${SLURM_JOB_NUM_NODES:-1}))
        MAP_BY=(--map-by "ppr:$RANKS_PER_NODE:node")
    fi
    RANKS="${RANKS:-${SLURM_NTASKS:-4}}"
}

# --- MPI environment ----------------------------------------------------------------------
export OPENBLAS_NUM_THREADS=1   # one BLAS thread per rank: ranks and rayon own the cores
if [[ $(id -u) -eq 0 ]]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi

# --- signals ------------------------------------------------------------------------------
# `--signal=B:USR1@120` and `scancel --signal=USR1 --batch` reach only this shell. Forward
# SIGUSR1 to mpirun, which forwards it to every rank (Open MPI 4.1 does so for SIGUSR1
# and SIGUSR2). SIGTERM to this shell is turned into SIGUSR1 for mpirun as well: mpirun
# answers SIGTERM by killing the ranks, before they could write a checkpoint.
# A rank dies of SIGUSR1 until torusrec has installed its handler (its first few tenths
# of a second; Open MPI then hangs in PMIx instead of exiting), so a signal in the first
# SIGNAL_GRACE seconds after the launch is held back until then.
SIGNAL_GRACE="${SIGNAL_GRACE:-5}"
launcher=""
launched_at=0
interrupted=0
deferred=0
pending=""
forward_now() {
    say "forwarding SIGUSR1 to mpirun (pid $launcher)"
    kill -USR1 "$launcher" 2>/dev/null || true
}
# shellcheck disable=SC2317  # called from the traps below
on_signal() {
    interrupted=1
    if [[ -n $launcher ]] && kill -0 "$launcher" 2>/dev/null; then
        if ((SECONDS - launched_at < SIGNAL_GRACE)); then
            say "got SIG$1 $((SECONDS - launched_at))s after the launch; holding it until ${SIGNAL_GRACE}s"
            deferred=1
        else
            say "got SIG$1"
            forward_now
        fi
    else
        say "got SIG$1 with no training running"
        pending=$1
    fi
}
trap 'on_signal USR1' USR1
trap 'on_signal TERM' TERM

# launch ARGS...: mpirun in the background, its stderr also copied into $errlog (the
# peer-lost lines are read from it, into errtext); sets launcher, errfd, teepid.
errtext=""
launch() {
    errlog=$(mktemp "${TMPDIR:-/tmp}/torusrec-job-stderr.XXXXXX")
    exec {errfd}> >(exec tee -a "$errlog" >&2)
    teepid=$!
    say "mpirun -np $RANKS ${MAP_BY[*]} $TORUSREC $*"
    launched_at=$SECONDS
    mpirun --oversubscribe --bind-to none -x OPENBLAS_NUM_THREADS -np "$RANKS" "${MAP_BY[@]}" \
        "$TORUSREC" "$@" 2>&"$errfd" &
    launcher=$!
}

# wait_launcher: mpirun's exit code into rc.
wait_launcher() {
    # `wait` returns early (status > 128) when a trapped signal arrives; mpirun is still
    # running then, so wait again. Bash keeps mpirun's status until it is collected.
    local w last=""
    rc=""
    while :; do
        if ((deferred)); then
            while kill -0 "$launcher" 2>/dev/null && ((SECONDS - launched_at < SIGNAL_GRACE)); do
                sleep 0.2
            done
            deferred=0
            kill -0 "$launcher" 2>/dev/null && forward_now
        fi
        interrupted=0
        wait "$launcher"
        w=$?
        if ((interrupted && w > 128)); then
            last=$w
            continue
        fi
        # 127: already collected by the wait the signal cut short (it ended at that moment).
        if ((w == 127)) && [[ -n $last ]]; then w=$last; fi
        rc=$w
        break
    done
    launcher=""
    # The copy of stderr ends once every writer (mpirun, its srun) has closed it.
    exec {errfd}>&-
    local i
    for ((i = 0; i < 30; i++)); do
        kill -0 "$teepid" 2>/dev/null || break
        sleep 0.1
    done
    errtext=$(cat "$errlog" 2>/dev/null)
    rm -f "$errlog"
}

# lost_hosts: the nodes of this job that torusrec's ranks (`torusrec: lost rank 1 (host
# h2) ...`, exit 77) or Open MPI (`Remote daemon: [[...],1] on node h2`) named as lost in
# this run, one per line, not this one. A host name is matched to the job's node names
# as it is or by its first label (a rank's host name may be the node's full name).
lost_hosts() {
    local me names h node
    me=$(hostname -s)
    names=$({
        grep 'torusrec: lost ' <<<"$errtext" | grep -o '(host [^)]*)' | sed 's/^(host //; s/)$//'
        grep 'Remote daemon:.* on node ' <<<"$errtext" | awk '{print $NF}'
    } | sort -u)
    for h in $names; do
        for node in $(scontrol show hostnames "${SLURM_JOB_NODELIST:-}" 2>/dev/null); do
            [[ $node == "$h" || ${node%%.*} == "${h%%.*}" ]] || continue
            [[ ${node%%.*} == "${me%%.*}" ]] || echo "$node"
        done
    done | sort -u
}

job_state() {
    scontrol show job -o "$SLURM_JOB_ID" 2>/dev/null | grep -o 'JobState=[^ ]*' | cut -d= -f2
}

# requeue_without HOSTS: requeue this job with HOSTS added to its excluded nodes. The
# exclusion can only be set once the job is pending again, that is after the requeue;
# this shell outlives the requeue's SIGTERM (trapped above) and runs the update with
# SIGTERM ignored (Slurm signals every process of the job), and the job cannot start
# again before its clean-up on the lost node ends and the credential delay has passed.
requeue_without() {
    local hosts=$1 exc i
    say "job $SLURM_JOB_ID lost host(s) $hosts: requeueing it without them"
    exc=$(scontrol show job -o "$SLURM_JOB_ID" 2>/dev/null | grep -o 'ExcNodeList=[^ ]*' | cut -d= -f2)
    [[ $exc == "(null)" ]] && exc=""
    exc="${exc:+$exc,}$hosts"
    scontrol requeue "$SLURM_JOB_ID" || return 1
    for ((i = 0; i < 5; i++)); do
        if (trap '' TERM; exec scontrol update JobId="$SLURM_JOB_ID" ExcNodeList="$exc"); then
            say "requeued job $SLURM_JOB_ID, excluding $exc"
            return 0
        fi
        sleep 1
    done
    say "requeued job $SLURM_JOB_ID, but could not exclude $exc"
}

# job_run ARGS...: train, then exit as the code says (docs/design.md, exit codes).
job_run() {
    # Asked to stop before training started: nothing changed since the last checkpoint.
    if [[ -n $pending ]]; then
        rc=75
    else
        # In the background, so that this shell can run its traps while it waits.
        launch "$@"
        [[ -n $pending ]] && { pending=""; deferred=1; }   # arrived during the launch itself
        wait_launcher
    fi
    case $rc in
        0)
            say "finished (exit 0)"
            exit 0
            ;;
        75) on_preempted ;;
        76) on_hold ;;
        *) on_failed ;;
    esac
}

on_preempted() {
    # Preempted with a complete checkpoint: run again from it.
    say "preempted; checkpoint written (exit 75)"
    # Only a job that Slurm still has RUNNING is requeued here. A plain `scancel` (or a
    # preemption Slurm handles itself) leaves it COMPLETING: requeueing would undo it.
    if [[ -z ${SLURM_JOB_ID:-} ]]; then
        say "not running under Slurm: exiting 75 for the caller to restart"
        exit 75
    fi
    local state
    state=$(job_state)
    if [[ $state != RUNNING ]]; then
        say "job $SLURM_JOB_ID is ${state:-unknown} (cancelled or ended by Slurm): not requeueing; exiting 75"
        exit 75
    fi
    say "requeueing job $SLURM_JOB_ID"
    if scontrol requeue "$SLURM_JOB_ID"; then
        # Slurm ends this run now and starts the job again (Restarts += 1).
        say "requeued job $SLURM_JOB_ID"
        exit 0
    fi
    # Requeue refused (e.g. JobRequeue=0 and no --requeue): leave it to Slurm's
    # RequeueExit=75 if the cluster has it, or to whoever submitted the job.
    say "could not requeue; exiting 75"
    exit 75
}

on_hold() {
    # Training hold: a person must look. Never requeue.
    local reason=""
    if [[ -f $CKPT_DIR/HOLD.json ]]; then
        reason=$(python3 -c 'import json,sys; h=json.load(open(sys.argv[1])); print(h.get("reason",""))' \
            "$CKPT_DIR/HOLD.json" 2>/dev/null) \
            || reason=$(grep -o '"reason": *"[^"]*"' "$CKPT_DIR/HOLD.json")
    fi
    say "TRAINING HOLD (exit 76), not requeued: ${reason:-no $CKPT_DIR/HOLD.json}"
    say "fix the cause, then resubmit with EXTRA=--release-hold"
    exit 76
}

on_failed() {
    # A lost peer (exit 77 on the surviving ranks; mpirun's own code may be the killed
    # rank's 137 or Open MPI's 205 for a lost daemon): the last committed checkpoint is
    # valid, so requeue without the lost hosts; `--resume auto` continues on the others.
    local lost
    lost=$(lost_hosts | paste -sd, -)
    if [[ -n $lost && -n ${SLURM_JOB_ID:-} && $(job_state) == RUNNING ]]; then
        say "torusrec/mpirun failed (exit $rc) after losing a peer"
        requeue_without "$lost" && exit 0
        say "could not requeue; exiting $rc"
        exit "$rc"
    fi
    if [[ -n $lost && -n ${SLURM_JOB_ID:-} ]]; then
        # Slurm already ended the job: a node it found DOWN requeues it (--requeue) itself.
        say "lost host(s) $lost; job $SLURM_JOB_ID is $(job_state), not requeueing it here"
    fi
    say "torusrec/mpirun failed (exit $rc)"
    exit "$rc"
}
