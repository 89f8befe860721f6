#!/usr/bin/env bash
# End-to-end preemption test on a real one-node Slurm (scripts/slurm-local.sh):
#   1. start Slurm, build the release binary, prepare cnr-2000 K=10;
#   2. reference: an uninterrupted 2-rank `torusrec als` run (no Slurm) -> its checksum;
#   3. submit jobs/als_webgraph.sbatch (2 ranks, same flags); once it runs and has written
#      a first checkpoint, `scancel --signal=USR1 --batch` it (what `--signal=B:USR1@120`
#      does before the time limit);
#   4. expect: the ranks exit 75, the script requeues the job, Slurm restarts it
#      (Restarts=1), the resumed run finishes with exit 0, and its `final:` checksum equals
#      the reference's (bitwise-exact resume);
#   5. the same for the embedding model: an uninterrupted 2-rank `torusrec embed` run, then
#      jobs/embed_clicks.sbatch with the same flags, preempted, requeued and resumed to the
#      same checksum;
#   6. several nodes (docs/cluster.md, "Slurm on the namespace hosts"): a 2-node Slurm in
#      network namespaces (scripts/slurm-cluster.sh up 2); `sbatch -N 2` of both jobs gives
#      the checksums of the one-node references; a job on `-N 1-2` whose second node is
#      killed mid-run is requeued by its script without that node, resumes on the first
#      with 1 rank, and ends with the checksum of a 1-rank run from the same checkpoint.
#      Skipped (SKIP line) where network namespaces cannot be made.
# Needs root (Slurm runs as root here). Prints PASS/FAIL per check, ends with
# "N passed, M failed", exits non-zero on any failure. Slurm is always stopped at the end.
#
# Environment: TORUSREC (binary; default: cargo build --release and use target/release),
#   TEST_SLURM_EPOCHS (default 120), TEST_SLURM_DIM (128), TEST_SLURM_STEP_NNZ (100000): about
#   15 s per run on 2 cores (a run must outlast the job scripts' 5 s SIGNAL_GRACE by a margin,
#   or the signal would arrive after the last epoch; the test refuses a shorter reference); TEST_SLURM_SIGNAL_AT (seconds into the job's run to signal it,
#   default a third of the reference run's time, at least once a checkpoint exists);
#   the embed job: TEST_SLURM_EMBED_PRESET (small), TEST_SLURM_EMBED_STEPS (320),
#   TEST_SLURM_EMBED_CKPT_EVERY (20): about 15-40 s per run on 2 cores;
#   TEST_SLURM_EMBED_SIGNAL_AT (like TEST_SLURM_SIGNAL_AT; default 0: as soon as the first
#   checkpoint exists, since steps take 0.05 to 0.15 s here depending on the load);
#   TEST_SLURM_BUDGET (seconds for the one-node part after the build, default 290),
#   TEST_SLURM_CASES (default "local cluster": the one-node job cases, the several-node
#   ones; the reference runs always), TEST_SLURM_CLUSTER_BUDGET (seconds for the
#   several-node part, default 240), TEST_SLURM_KILL_AFTER (seconds between the failing
#   job's first checkpoint and the kill of its second node, default 3),
#   TEST_SLURM_KEEP=1 keeps the work directory on success, SLURM_LOCAL_DIR (slurm-local.sh).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
REPO=$(pwd)

EPOCHS="${TEST_SLURM_EPOCHS:-120}"
DIM="${TEST_SLURM_DIM:-128}"
STEP_NNZ="${TEST_SLURM_STEP_NNZ:-100000}"
EMBED_PRESET="${TEST_SLURM_EMBED_PRESET:-small}"
EMBED_STEPS="${TEST_SLURM_EMBED_STEPS:-320}"
EMBED_CKPT_EVERY="${TEST_SLURM_EMBED_CKPT_EVERY:-20}"
BUDGET="${TEST_SLURM_BUDGET:-290}"
RANKS=2
JOB_SIGNAL_GRACE=5   # the job scripts' default SIGNAL_GRACE (the test does not pass one)
THREADS=1   # bitwise equality holds at equal rank and thread counts: pin both

passed=0
failed=0
jobid=""
slurm_started=0
cluster_started=0
work=""

# The Slurm clients: the one-node Slurm's in the root namespace, or, once in_cluster=1,
# the namespace cluster's through scripts/slurm-cluster.sh run (its controller is on the
# bridge, reachable only from the namespaces).
in_cluster=0
for c in sbatch squeue scontrol scancel sinfo; do
    eval "$c() { if ((in_cluster)); then scripts/slurm-cluster.sh run $c \"\$@\"; else command $c \"\$@\"; fi; }"
done

ts() { date +%H:%M:%S; }
say() { echo "[$(ts)] test_slurm: $*"; }
pass() { passed=$((passed + 1)); echo "PASS: $*"; }
fail() { failed=$((failed + 1)); echo "FAIL: $*"; }
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }

# --- cleanup: cancel the job, stop Slurm, summary line last -----------------------------
finish() {
    local rc=$?
    trap - EXIT INT TERM
    if [[ -n $jobid ]] && squeue -h -j "$jobid" 2>/dev/null | grep -q .; then
        say "cancelling job $jobid"
        scancel "$jobid" 2>/dev/null || true
    fi
    if ((cluster_started)); then
        say "stopping the namespace cluster"
        in_cluster=0
        timeout 120 scripts/slurm-cluster.sh down || fail "slurm-cluster.sh down"
    fi
    if ((slurm_started)); then
        say "stopping Slurm"
        scripts/slurm-local.sh stop || fail "slurm-local.sh stop"
    fi
    if [[ -n $work && -d $work ]]; then
        if ((failed == 0)) && [[ -z ${TEST_SLURM_KEEP:-} ]]; then
            rm -rf "$work"
        else
            say "work directory kept: $work"
        fi
    fi
    ((failed == 0 && rc != 0)) && fail "aborted (exit $rc)"
    echo "$passed passed, $failed failed"
    ((failed == 0)) || exit 1
    exit 0
}
trap finish EXIT
trap 'say "interrupted"; exit 130' INT TERM

# abort MSG: a check failed in a way that makes the later ones meaningless.
abort() {
    fail "$*"
    exit 1
}

[[ $(id -u) -eq 0 ]] || abort "must run as root (the local Slurm runs as root)"

CASES="${TEST_SLURM_CASES:-local cluster}"
want() { [[ " $CASES " == *" $1 "* ]]; }

# --- Slurm --------------------------------------------------------------------------------
if want local; then
    say "starting the local Slurm"
    if ! conf_line=$(timeout 300 scripts/slurm-local.sh start); then
        slurm_started=1   # whatever half of it started, stop it
        abort "Slurm did not start (scripts/slurm-local.sh start failed; its messages are above)"
    fi
    slurm_started=1
    eval "$conf_line"
    [[ -n ${SLURM_CONF:-} && -f $SLURM_CONF ]] || abort "slurm-local.sh printed no SLURM_CONF ($conf_line)"
    pass "local Slurm is up (SLURM_CONF=$SLURM_CONF)"
fi

# --- binary ---------------------------------------------------------------------------------
if [[ -z ${TORUSREC:-} ]]; then
    if ! command -v cargo >/dev/null 2>&1 && [[ -f "${CARGO_HOME:-$HOME/.cargo}/env" ]]; then
        # shellcheck disable=SC1091
        . "${CARGO_HOME:-$HOME/.cargo}/env"
    fi
    say "cargo build --release"
    timeout "${TEST_SLURM_BUILD_TIMEOUT:-540}" cargo build --release \
        || abort "cargo build --release failed"
    TORUSREC="$REPO/target/release/torusrec"
fi
"$TORUSREC" als --help >/dev/null 2>&1 || abort "$TORUSREC has no working 'als' subcommand"
"$TORUSREC" embed --help >/dev/null 2>&1 || abort "$TORUSREC has no working 'embed' subcommand"
pass "binary $TORUSREC"

# Everything from here on runs within BUDGET seconds.
deadline=$((SECONDS + BUDGET))
left() { local l=$((deadline - SECONDS)); ((l > 1)) && echo "$l" || echo 1; }
# tmo LIMIT: the smaller of LIMIT and what is left of the budget.
tmo() { local l; l=$(left); ((l < $1)) && echo "$l" || echo "$1"; }

if [[ $(id -u) -eq 0 ]]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
export OPENBLAS_NUM_THREADS=1
MPIRUN=(mpirun --oversubscribe --bind-to none -x OPENBLAS_NUM_THREADS -np "$RANKS")

work=$(mktemp -d /tmp/torusrec-slurm-test.XXXXXX)
say "work directory $work"

# reference NAME ARGS...: an uninterrupted run of `torusrec ARGS...` on RANKS ranks, no
# Slurm; sets ref_sum (the checksum of its `final:` line) and ref_secs.
ref_sum=""
ref_secs=""
reference() {
    local name=$1 t rc
    shift
    say "$name reference run: ${MPIRUN[*]} torusrec $*"
    t=$(now)
    timeout --kill-after=5 "$(tmo 120)" "${MPIRUN[@]}" "$TORUSREC" "$@" >"$work/$name-ref.log" 2>&1
    rc=$?
    ref_secs=$(secs "$t" "$(now)")
    ref_sum=$(grep '^final:' "$work/$name-ref.log" | grep -o 'checksum [0-9a-f]\{16\}' | awk '{print $2}' | tail -n1)
    if ((rc == 0)) && [[ -n $ref_sum ]]; then
        pass "$name: reference run finished in ${ref_secs}s, checksum $ref_sum"
    else
        tail -n 30 "$work/$name-ref.log"
        abort "$name: reference run failed (exit $rc)"
    fi
}

# sbatch exports this shell's environment: job_unset clears the variables the job scripts
# read, so that only VAR=VALUE... configures a job (a stray DATA would change the model).
job_unset=()
for v in PRESET TABLES DATA RANKS RANKS_PER_NODE DIM EPOCHS BATCH ACCUMULATE STEPS PLAN OUT \
    EXTRA CKPT_EVERY SIGNAL_GRACE TORUSREC_REPO; do
    job_unset+=(-u "$v")
done

# The job under test: its id, log and checkpoint directory (finish() cancels it).
joblog=""
ckpt=""
job_field() { scontrol show job "$jobid" 2>/dev/null | grep -o "\b$1=[^ ]*" | head -n1 | cut -d= -f2-; }
show_state() {
    scontrol show job "$jobid" 2>/dev/null | grep -E 'JobState|Restarts|ExitCode' | sed 's/^/    /'
    echo "    --- $joblog"
    sed 's/^/    /' "$joblog" 2>/dev/null | tail -n 40
}
first_ckpt() { find "$ckpt" -maxdepth 1 -name 'ckpt-*.h5' 2>/dev/null | sort | head -n1; }

# preempt_job NAME SCRIPT SIGNAL_AT VAR=VALUE...: submit jobs/SCRIPT on RANKS ranks with the
# environment VAR=VALUE... (plus CKPT_DIR and TORUSREC), signal it SIGNAL_AT seconds into
# its run (empty: a third of the reference run's time) once it has a first checkpoint, and
# check exit 75, the requeue, the resumed run and its checksum against ref_sum.
preempt_job() {
    local name=$1 script=$2 signal_at=$3
    shift 3
    joblog="$work/$name-job.log"
    ckpt="$work/$name-ckpt-job"

    # A signal within the job script's grace is held back until the grace has passed; a
    # run that ends about then cannot be preempted, and the test would fail for no fault.
    if awk -v r="$ref_secs" -v g="$JOB_SIGNAL_GRACE" 'BEGIN { exit !(r < 2 * g) }'; then
        abort "$name: the reference run took ${ref_secs}s, too short to preempt after the job" \
            "script's ${JOB_SIGNAL_GRACE}s signal grace (raise TEST_SLURM_EPOCHS or TEST_SLURM_EMBED_STEPS)"
    fi

    # --- submit -----------------------------------------------------------------------------
    jobid=$(env "${job_unset[@]}" "$@" CKPT_DIR="$ckpt" TORUSREC="$TORUSREC" \
        sbatch --parsable --ntasks="$RANKS" --job-name="torusrec-slurm-test-$name" \
        --output="$joblog" "jobs/$script" 2>"$work/$name-sbatch.err")
    jobid=${jobid%%;*}
    if [[ $jobid =~ ^[0-9]+$ ]]; then
        pass "$name: submitted job $jobid ($script)"
    else
        cat "$work/$name-sbatch.err"
        jobid=""
        abort "$name: sbatch failed"
    fi

    # --- wait for RUNNING and a first checkpoint ------------------------------------------
    local t_running="" st
    until [[ -n $t_running && -n $(first_ckpt) ]]; do
        st=$(job_field JobState)
        [[ -z $t_running && $st == RUNNING ]] && t_running=$(now)
        if ((SECONDS >= deadline)) || [[ $st =~ ^(COMPLETED|FAILED|CANCELLED|TIMEOUT|PENDING)$ && -n $t_running ]]; then
            show_state
            abort "$name: job $jobid did not reach RUNNING with a checkpoint (state $st)"
        fi
        sleep 0.2
    done
    pass "$name: job $jobid is RUNNING with a first checkpoint ($(basename "$(first_ckpt)"))"

    # Signal in the middle of the run (between checkpoints), not at its start.
    [[ -n $signal_at ]] || signal_at=$(awk -v r="$ref_secs" 'BEGIN { printf "%.1f", r / 3 }')
    local pause
    pause=$(awk -v a="$signal_at" -v e="$(secs "$t_running" "$(now)")" 'BEGIN { p = a - e; printf "%.1f", (p > 0 ? p : 0) }')
    say "$name: signalling ${signal_at}s into the run (in ${pause}s)"
    sleep "$pause"

    # --- preempt: SIGUSR1 to the batch shell -----------------------------------------------
    local t_sig t_75 t_rq t_start t_end
    t_sig=$(now)
    say "scancel --signal=USR1 --batch $jobid"
    scancel --signal=USR1 --batch "$jobid" || abort "$name: scancel --signal=USR1 --batch $jobid failed"

    # The job script prints "preempted; ... (exit 75)" once mpirun has returned 75.
    until grep -q '(exit 75)' "$joblog" 2>/dev/null; do
        if ((SECONDS >= deadline)) || grep -qE 'finished \(exit 0\)|failed \(exit|TRAINING HOLD' "$joblog"; then
            show_state
            abort "$name: no exit 75 after the signal"
        fi
        sleep 0.1
    done
    t_75=$(now)
    pass "$name: ranks checkpointed and exited 75 $(secs "$t_sig" "$t_75")s after the signal"
    grep -E 'preempted|checkpoint .* written' "$joblog" | sed 's/^/    /'

    # --- the requeue: Restarts=1 and a second start ----------------------------------------
    until [[ $(job_field Restarts) == 1 ]]; do
        if ((SECONDS >= deadline)); then
            show_state
            abort "$name: job $jobid was not requeued (Restarts=$(job_field Restarts))"
        fi
        sleep 0.1
    done
    t_rq=$(now)
    if grep -q "requeued job $jobid" "$joblog"; then
        pass "$name: job script requeued job $jobid (scontrol requeue), Restarts=1"
    else
        # Slurm may end the script (JOB REQUEUE) before it prints; Restarts=1 is what counts.
        pass "$name: job $jobid requeued, Restarts=1 (the script's confirmation line was cut by the requeue)"
    fi

    until grep -q 'restart 1 on' "$joblog" 2>/dev/null; do
        if ((SECONDS >= deadline)); then
            show_state
            abort "$name: requeued job $jobid did not start again (state $(job_field JobState), $(job_field Reason))"
        fi
        sleep 0.1
    done
    t_start=$(now)
    pass "$name: job $jobid started again $(secs "$t_rq" "$t_start")s after the requeue"

    # --- the resumed run finishes -----------------------------------------------------------
    while squeue -h -j "$jobid" 2>/dev/null | grep -q .; do
        if ((SECONDS >= deadline)); then
            show_state
            abort "$name: resumed job $jobid did not finish within the budget"
        fi
        sleep 0.5
    done
    t_end=$(now)
    local state exitcode first second job_sum
    state=$(job_field JobState)
    exitcode=$(job_field ExitCode)
    # The part of the log written by the second run.
    second=$(sed -n '/restart 1 on/,$p' "$joblog")
    if [[ $state == COMPLETED && $exitcode == 0:0 ]] && grep -q 'finished (exit 0)' <<<"$second"; then
        pass "$name: resumed run finished with exit 0 in $(secs "$t_start" "$t_end")s (JobState=$state ExitCode=$exitcode)"
    else
        show_state
        fail "$name: resumed run did not finish cleanly (JobState=$state ExitCode=$exitcode)"
    fi

    if grep -q 'resumed from' <<<"$second"; then
        pass "$name: second run $(grep -o 'resumed from.*' <<<"$second" | head -n1)"
    else
        fail "$name: second run shows no sign of resuming from a checkpoint"
    fi

    first=$(sed '/restart 1 on/,$d' "$joblog")
    if grep -q '^final:' <<<"$first"; then
        fail "$name: the first run already finished (the signal came too late to test a resume)"
    fi

    job_sum=$(grep '^final:' <<<"$second" | grep -o 'checksum [0-9a-f]\{16\}' | awk '{print $2}' | tail -n1)
    if [[ -n $job_sum && $job_sum == "$ref_sum" ]]; then
        pass "$name: resumed checksum $job_sum equals the uninterrupted run's"
    else
        show_state
        fail "$name: checksum after resume '${job_sum:-none}' != reference '$ref_sum'"
    fi

    say "$name timings: reference ${ref_secs}s; signal -> exit 75 $(secs "$t_sig" "$t_75")s;" \
        "exit 75 -> Restarts=1 $(secs "$t_75" "$t_rq")s; requeue -> resumed start $(secs "$t_rq" "$t_start")s;" \
        "resumed start -> done $(secs "$t_start" "$t_end")s; test body so far $((SECONDS - deadline + BUDGET))s"
    echo "--- job log ($joblog)"
    cat "$joblog"
}

# === iALS: jobs/als_webgraph.sbatch ==========================================================

# --- dataset --------------------------------------------------------------------------------
data="$work/cnr-2000-k10.h5"
if timeout "$(tmo 60)" "$TORUSREC" prepare --input tests/data/cnr-2000/cnr-2000 --format bv \
    --min-links 10 --seed 42 --out "$data" >"$work/prepare.log" 2>&1; then
    pass "prepared $data"
else
    cat "$work/prepare.log"
    abort "torusrec prepare failed"
fi

# The same training flags for the reference and the job; only the paths differ.
common=(--dim "$DIM" --epochs "$EPOCHS" --step-nnz "$STEP_NNZ" --threads "$THREADS")
reference als als --data "$data" "${common[@]}" \
    --checkpoint-dir "$work/als-ckpt-ref" --resume auto --out "$work/als-ref.h5"
als_ref_sum=$ref_sum
want local && preempt_job als als_webgraph.sbatch "${TEST_SLURM_SIGNAL_AT:-}" \
    DATA="$data" RANKS="$RANKS" DIM="$DIM" EPOCHS="$EPOCHS" OUT="$work/als-job.h5" \
    EXTRA="--step-nnz $STEP_NNZ --threads $THREADS"

# === the embedding model: jobs/embed_clicks.sbatch ===========================================
# Examples are generated on the fly from the seed: no data set to prepare. A micro-batch of
# 1024 per rank, accumulated twice, so the job's BATCH and ACCUMULATE are both exercised.
# The signal goes out once the first checkpoint (step 20) exists, which is robust to the
# job running faster or slower than the reference did; a signal within the job script's
# SIGNAL_GRACE (5 s) of the launch is held back until then, still well before the end.
embed_extra="--threads $THREADS --log-every 20"
# shellcheck disable=SC2086  # embed_extra is a list of flags, split on purpose
reference embed embed --preset "$EMBED_PRESET" --batch 1024 --accumulate 2 --steps "$EMBED_STEPS" \
    --plan auto --checkpoint-dir "$work/embed-ckpt-ref" --checkpoint-every "$EMBED_CKPT_EVERY" \
    --resume auto $embed_extra
embed_ref_sum=$ref_sum
want local && preempt_job embed embed_clicks.sbatch "${TEST_SLURM_EMBED_SIGNAL_AT:-0}" \
    PRESET="$EMBED_PRESET" RANKS="$RANKS" BATCH=1024 ACCUMULATE=2 STEPS="$EMBED_STEPS" PLAN=auto \
    CKPT_EVERY="$EMBED_CKPT_EVERY" EXTRA="$embed_extra"

say "one-node part: test body $((SECONDS - deadline + BUDGET))s of the ${BUDGET}s budget"
want cluster || exit 0


# === several nodes: scripts/slurm-cluster.sh =================================================
# Two Slurm nodes h1, h2 (one slurmd per network-namespace host, slurmctld on the switch),
# all traffic on 198.18.19.0/24. The 2-node runs must give the bits of the one-node
# reference runs above (2 ranks each); a node failure must requeue the job without the
# node and resume on the survivor with the bits of a 1-rank run from the same checkpoint.
BUDGET="${TEST_SLURM_CLUSTER_BUDGET:-240}"
deadline=$((SECONDS + BUDGET))
if ! ip netns add "trc-probe-$$" 2>/dev/null; then
    echo "SKIP: several nodes: network namespaces cannot be made here (ip netns add failed)"
    exit 0
fi
ip netns del "trc-probe-$$"
say "starting a 2-node Slurm in network namespaces (scripts/slurm-cluster.sh up 2)"
t=$(now)
cluster_started=1
if ! timeout 120 scripts/slurm-cluster.sh up 2 >"$work/cluster-up.log"; then
    abort "slurm-cluster.sh up 2 failed (its messages are above)"
fi
in_cluster=1
pass "2-node Slurm is up in $(secs "$t" "$(now)")s: $(sinfo -h -N -o '%N=%t' | paste -sd' ' -)"

# cluster_job NAME SCRIPT "SBATCH-OPTIONS" VAR=VALUE...: submit jobs/SCRIPT to the cluster.
cluster_job() {
    local name=$1 script=$2 opts=$3
    shift 3
    joblog="$work/$name-job.log"
    ckpt="$work/$name-ckpt-job"
    # shellcheck disable=SC2086  # opts is a list of sbatch options, split on purpose
    jobid=$(env "${job_unset[@]}" "$@" CKPT_DIR="$ckpt" TORUSREC="$TORUSREC" \
        scripts/slurm-cluster.sh run sbatch --parsable $opts --job-name="torusrec-slurm-test-$name" \
        --output="$joblog" "jobs/$script" 2>"$work/$name-sbatch.err")
    jobid=${jobid%%;*}
    if [[ $jobid =~ ^[0-9]+$ ]]; then
        pass "$name: submitted job $jobid (sbatch $opts $script)"
    else
        cat "$work/$name-sbatch.err"
        jobid=""
        abort "$name: sbatch failed"
    fi
}

# wait_gone WHAT: until the job has left the queue (within the budget).
wait_gone() {
    while squeue -h -j "$jobid" 2>/dev/null | grep -q .; do
        if ((SECONDS >= deadline)); then
            show_state
            abort "$1: job $jobid did not finish within the budget"
        fi
        sleep 0.5
    done
}

job_checksum() { grep '^final:' | grep -o 'checksum [0-9a-f]\{16\}' | awk '{print $2}' | tail -n1; }

# two_nodes NAME SCRIPT REF_SUM VAR=VALUE...: `sbatch -N 2 --ntasks=2` of jobs/SCRIPT runs
# rank 0 on h1 and rank 1 on h2 and ends with REF_SUM, the one-node run's checksum.
two_nodes() {
    local name=$1 script=$2 want_sum=$3 t state sum
    shift 3
    t=$(now)
    cluster_job "$name" "$script" "-N 2 --ntasks=2" "$@"
    wait_gone "$name"
    state="$(job_field JobState) $(job_field ExitCode) $(job_field NodeList)"
    if [[ $state == "COMPLETED 0:0 h[1-2]" ]]; then
        pass "$name: finished on both nodes in $(secs "$t" "$(now)")s ($state)"
    else
        show_state
        fail "$name: job state '$state', expected 'COMPLETED 0:0 h[1-2]'"
    fi
    if grep -q '2 ranks on 2 host(s): h1 h2' "$joblog"; then
        pass "$name: $(grep -o '2 ranks on 2 host(s): h1 h2' "$joblog" | head -n1)"
    else
        show_state
        fail "$name: the job log does not show 2 ranks on the hosts h1 h2"
    fi
    sum=$(job_checksum <"$joblog")
    if [[ -n $sum && $sum == "$want_sum" ]]; then
        pass "$name: checksum $sum on 2 nodes equals the one-node run's"
    else
        show_state
        fail "$name: checksum on 2 nodes '${sum:-none}' != one node '$want_sum'"
    fi
}

t_case=$SECONDS
two_nodes als-2n als_webgraph.sbatch "$als_ref_sum" \
    DATA="$data" DIM="$DIM" EPOCHS="$EPOCHS" OUT="" EXTRA="--step-nnz $STEP_NNZ --threads $THREADS"
say "als-2n: $((SECONDS - t_case))s"
t_case=$SECONDS
two_nodes embed-2n embed_clicks.sbatch "$embed_ref_sum" \
    PRESET="$EMBED_PRESET" BATCH=1024 ACCUMULATE=2 STEPS="$EMBED_STEPS" PLAN=auto \
    CKPT_EVERY="$EMBED_CKPT_EVERY" EXTRA="$embed_extra"
say "embed-2n: $((SECONDS - t_case))s"

# --- a node fails: requeued without it, resumed on the survivor ------------------------------
# RANKS_PER_NODE=1 on `-N 1-2 --ntasks=2 --spread-job`: 2 ranks on h1, h2 while both are up,
# 1 rank on h1 once h2 is gone. Host h2 (its slurmd, slurmstepd, orted and rank) is killed
# once a checkpoint exists; the rank on h1 names it and exits 77, the job script requeues
# the job excluding h2, Slurm starts it again on h1 alone (once h2 is DOWN: SlurmdTimeout),
# and `--resume auto` continues from the last committed checkpoint.
t_case=$SECONDS
name=als-fail
cluster_job "$name" als_webgraph.sbatch "-N 1-2 --ntasks=2 --spread-job" RANKS_PER_NODE=1 \
    DATA="$data" DIM="$DIM" EPOCHS="$EPOCHS" OUT="" EXTRA="--step-nnz $STEP_NNZ --threads $THREADS"
until [[ $(job_field JobState) == RUNNING && -n $(first_ckpt) ]]; do
    if ((SECONDS >= deadline)) || ! squeue -h -j "$jobid" | grep -q .; then
        show_state
        abort "$name: job $jobid did not reach RUNNING with a checkpoint"
    fi
    sleep 0.2
done
[[ $(job_field NodeList) == "h[1-2]" ]] || { show_state; abort "$name: job $jobid is not on h[1-2]"; }
pass "$name: job $jobid runs on h[1-2] with a first checkpoint ($(basename "$(first_ckpt)"))"
sleep "${TEST_SLURM_KILL_AFTER:-3}"
t_kill=$(now)
say "$name: killing host h2 (scripts/slurm-cluster.sh kill 2)"
scripts/slurm-cluster.sh kill 2
until [[ $(job_field Restarts) == 1 ]]; do
    if ((SECONDS >= deadline)) || ! squeue -h -j "$jobid" | grep -q .; then
        show_state
        abort "$name: job $jobid was not requeued after h2 died"
    fi
    sleep 0.1
done
t_rq=$(now)
# The first run is over: its last committed checkpoint is what the next run resumes from.
cp -a "$ckpt" "$work/$name-ckpt-copy"
if grep -q 'torusrec: lost rank 1 (host h2)' "$joblog" && grep -q 'exit 77' "$joblog"; then
    pass "$name: the rank on h1 named the lost one and exited 77, $(secs "$t_kill" "$t_rq")s to the requeue"
else
    show_state
    fail "$name: no 'lost rank 1 (host h2)' ... exit 77 line in the job log"
fi
# The script sets the exclusion just after its requeue (Restarts=1): give it a moment.
for ((i = 0; i < 100; i++)); do
    grep -q "requeued job $jobid, \(excluding\|but could not\)" "$joblog" && break
    sleep 0.1
done
if [[ $(job_field ExcNodeList) == h2 ]] && grep -q "requeued job $jobid, excluding h2" "$joblog"; then
    pass "$name: the job script requeued job $jobid excluding h2"
else
    show_state
    fail "$name: job $jobid requeued without excluding h2 (ExcNodeList=$(job_field ExcNodeList))"
fi
until grep -q 'restart 1 on' "$joblog" 2>/dev/null; do
    if ((SECONDS >= deadline)); then
        show_state
        abort "$name: requeued job $jobid did not start again ($(job_field JobState), $(job_field Reason))"
    fi
    sleep 0.2
done
t_start=$(now)
pass "$name: started again $(secs "$t_rq" "$t_start")s after the requeue on $(job_field NodeList)" \
    "(h2 $(sinfo -h -n h2 -o %t))"
wait_gone "$name"
t_end=$(now)
second=$(sed -n '/restart 1 on/,$p' "$joblog")
state="$(job_field JobState) $(job_field ExitCode) $(job_field NodeList)"
if [[ $state == "COMPLETED 0:0 h1" ]] && grep -q 'restart 1 on h1: 1 ranks' <<<"$second"; then
    pass "$name: resumed on h1 alone with 1 rank, finished in $(secs "$t_start" "$t_end")s ($state)"
else
    show_state
    fail "$name: resumed run: '$state' (expected 'COMPLETED 0:0 h1', 1 rank)"
fi
job_resumed=$(grep -o 'resumed from [^ ]*' <<<"$second" | head -n1)
[[ -n $job_resumed ]] && pass "$name: the second run $job_resumed" \
    || fail "$name: the second run shows no sign of resuming"
# The reference: 1 rank, no Slurm, from the copy of the same checkpoint directory.
say "$name: reference: 1 rank resumed from the copy"
timeout --kill-after=5 "$(tmo 120)" mpirun --oversubscribe --bind-to none -x OPENBLAS_NUM_THREADS -np 1 \
    "$TORUSREC" als --data "$data" "${common[@]}" --checkpoint-dir "$work/$name-ckpt-copy" \
    --resume auto >"$work/$name-ref.log" 2>&1
rc=$?
ref1=$(job_checksum <"$work/$name-ref.log")
ref_resumed=$(grep -o 'resumed from [^ ]*' "$work/$name-ref.log" | head -n1)
sum=$(job_checksum <<<"$second")
if ((rc == 0)) && [[ -n $sum && $sum == "$ref1" && ${job_resumed##*/} == "${ref_resumed##*/}" ]]; then
    pass "$name: checksum $sum equals a 1-rank run's from the same checkpoint (${ref_resumed##*/})"
else
    tail -n 20 "$work/$name-ref.log"
    fail "$name: resumed checksum '${sum:-none}' ($job_resumed) != 1-rank reference '${ref1:-none}' ($ref_resumed, exit $rc)"
fi
say "$name: $((SECONDS - t_case))s (kill -> requeue $(secs "$t_kill" "$t_rq")s, requeue -> start" \
    "$(secs "$t_rq" "$t_start")s, resumed run $(secs "$t_start" "$t_end")s)"
echo "--- job log ($joblog)"
cat "$joblog"
say "several nodes: test body $((SECONDS - deadline + BUDGET))s of the ${BUDGET}s budget"
