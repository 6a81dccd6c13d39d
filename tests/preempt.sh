#!/bin/sh
# preempt.sh: SIGTERM is preemption, as Slurm and Kubernetes send it a grace period before
# SIGKILL. dtrun forwards it to each rank once; every rank of `dtrain train` finishes its
# step, the ranks agree to stop after the same one, the checkpoint is written there, and
# the job exits 75 (dtrain's documented status for "stopped on SIGTERM, checkpointed");
# `--resume auto` then ends with the weights of a run that was never interrupted. A
# second SIGTERM to dtrun kills at once. SIGUSR1 does the same, through dtrun and through
# Open MPI's mpirun. Loopback only; every wait is bounded.
. "${DT_SRCDIR:-$(dirname "$0")/..}/tests/tap.sh"
DTRUN="$DT_BUILDDIR/dtrun"
D="$DT_BUILDDIR/dtrain"
[ -x "$DTRUN" ] && [ -x "$D" ] || skip_all "dtrun and dtrain are not built"
T=$(mktemp -d) || exit 1
tok="dtpreempt$$"
cleanup() { pids=$(pgrep -f "$tok"); [ -z "$pids" ] || kill -KILL $pids 2>/dev/null; }
trap 'cleanup; rm -rf "$T"' EXIT
STEPS=4000   # about 1.3 ms a step here: the signal comes long before the end
# every process of the job carries $tok in its command line (the metrics directory), so
# whatever a failed check leaves behind is found and killed at the end
mkdir -p "$T/$tok"
MODEL="flatten linear(512) relu linear(512) relu linear(4)"
DATA=synthetic:2048,1,16,16,4
run2() {   # run2 OUT ARGS...: dtrun -n 2 dtrain train (the shared run) ARGS..., in the foreground
    out=$1; shift
    timeout 300 "$DTRUN" -n 2 "$D" train --data $DATA --model "$MODEL" --batch 64 --epochs 200 --steps $STEPS \
        --no-eval --log-every 50 --threads 1 --metrics "$T/$tok/m.jsonl" "$@" > "$out" 2>&1
}

# the run nobody interrupts
run2 "$T/ref.out" --save "$T/ref.st"
ok $? "uninterrupted 2-rank run of $STEPS steps"

# the same run, SIGTERM to dtrun once it has logged step 50
"$DTRUN" -n 2 "$D" train --data $DATA --model "$MODEL" --batch 64 --epochs 200 --steps $STEPS \
    --no-eval --log-every 50 --threads 1 --metrics "$T/$tok/m.jsonl" --checkpoint-dir "$T/ck" --checkpoint-every 100000 \
    --save "$T/stopped.st" > "$T/a.out" 2> "$T/a.err" &
pid=$!
wait_line "$T/a.out" "^\[rank0\]:epoch [0-9/]+  step 50/$STEPS"
ok $? "the run logged its step 50"
kill -TERM $pid
wait_pid $pid 60
rc=$?
[ "$rc" -eq 75 ]; ok $? "SIGTERM: dtrun exits 75, the ranks' status for a checkpointed stop (got $rc)"
[ "$rc" -eq 75 ] || sed 's/^/#   /' "$T/a.err" | tail -10
n=$(sed -n "s/^\[rank0\]:dtrain: stopped at step \([0-9]*\) on SIGTERM, checkpointed in .*; resume with --resume auto$/\1/p" "$T/a.out")
[ -n "$n" ] && [ "$n" -ge 50 ] && [ "$n" -lt $STEPS ]
ok $? "rank 0 says at which step it stopped and how to resume (step ${n:-none} of $STEPS)"
ok_grep "$T/a.err" "^dtrun: stopped by SIGTERM; every rank exited by itself with status 75" "dtrun says the ranks stopped themselves"
ck=$(ls "$T/ck" 2>/dev/null | tr '\n' ' ')
[ -n "$n" ] && [ "$ck" = "$(printf 'step-%012d ' "$n")" ]
ok $? "the only checkpoint is the one at the step it stopped (${ck:-none})"
[ ! -e "$T/stopped.st" ]; ok $? "no --save weights from a stopped run (the checkpoint holds its state)"
! grep -q "killed by signal" "$T/a.err"; ok $? "no rank was killed"

# resume: the weights of the uninterrupted run, bit for bit
run2 "$T/b.out" --checkpoint-dir "$T/ck" --checkpoint-every 100000 --resume auto --save "$T/resumed.st"
ok $? "--resume auto continues the stopped run to the end"
ok_grep "$T/b.out" "resumed from .*step-0*${n:-x}" "it resumed from the step it stopped at"
cmp -s "$T/ref.st" "$T/resumed.st"; ok $? "stopped and resumed: the same weight bytes as the uninterrupted run"

# stopped SIG OUT PREFIX CK CMD...: CMD (a launcher and dtrain, or dtrain) runs the shared
# run with --checkpoint-dir CK in the background, gets SIG once it logged step 50 (lines
# prefixed PREFIX); sets rc to its status and n to the step it says it stopped at
stopped() {
    sig=$1 out=$2 pre=$3 ck=$4; shift 4
    "$@" train --data $DATA --model "$MODEL" --batch 64 --epochs 200 --steps $STEPS --no-eval --log-every 50 \
        --threads 1 --metrics "$T/$tok/$sig.jsonl" --checkpoint-dir "$ck" --checkpoint-every 100000 > "$out" 2>&1 &
    pid=$!
    wait_line "$out" "^${pre}epoch [0-9/]+  step 50/$STEPS"
    kill -$sig $pid
    wait_pid $pid 60
    rc=$?
    n=$(sed -n "s/^${pre}dtrain: stopped at step \([0-9]*\) on SIG$sig, checkpointed in .*/\1/p" "$out")
}

# one process, no launcher: SIGTERM to dtrain itself
stopped TERM "$T/c.out" "" "$T/ck1" "$D"
[ "$rc" -eq 75 ]; ok $? "one process: SIGTERM ends it with 75 (got $rc)"
[ -n "$n" ] && [ -d "$T/ck1/$(printf 'step-%012d' "$n")" ]
ok $? "one process: checkpointed at the step it stopped (${n:-none})"

# SIGUSR1 to dtrun (Slurm's --signal=USR1@SECONDS before a time limit): forwarded, the same stop
stopped USR1 "$T/u.out" "\[rank0\]:" "$T/cku" "$DTRUN" -n 2 "$D"
[ "$rc" -eq 75 ]; ok $? "SIGUSR1 to dtrun: the ranks stop by themselves, exit 75 (got $rc)"
[ -n "$n" ] && [ -d "$T/cku/$(printf 'step-%012d' "$n")" ]
ok $? "SIGUSR1 to dtrun: rank 0 names the signal, checkpointed at the step it stopped (${n:-none})"

# under Open MPI's mpirun: SIGUSR1 to mpirun, which forwards it to the ranks at once (a
# SIGTERM it delivers only as it kills the job, one second before SIGKILL); the ranks
# stop and checkpoint as under dtrun, and the resumed run under mpirun ends with the
# uninterrupted run's weights
if [ -n "$MPIRUN" ] && [ -x "$MPIRUN" ] && "$MPIRUN" --version 2>/dev/null | grep -q 'Open MPI'; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader,tcp
    mpirun_train() {   # mpirun_train ARGS...: the shared run under mpirun (exec: the caller's pid is mpirun's)
        exec "$MPIRUN" --oversubscribe -np 2 "$D" train --data $DATA \
            --model "$MODEL" --batch 64 --epochs 200 --steps $STEPS --no-eval --log-every 50 --threads 1 \
            --metrics "$T/$tok/mm.jsonl" --checkpoint-dir "$T/ckm" --checkpoint-every 100000 "$@"
    }
    (mpirun_train --save "$T/mstopped.st" > "$T/m.out" 2> "$T/m.err") &
    pid=$!
    wait_line "$T/m.out" "^epoch [0-9/]+  step 50/$STEPS"
    ok $? "mpirun: the run logged its step 50"
    kill -USR1 $pid
    wait_pid $pid 60
    rc=$?
    [ "$rc" -ne 0 ]; ok $? "mpirun: SIGUSR1 ends the job, not as a success (mpirun's status: $rc)"
    nm=$(sed -n "s/^dtrain: stopped at step \([0-9]*\) on SIGUSR1, checkpointed in .*/\1/p" "$T/m.out")
    ck=$(ls "$T/ckm" 2>/dev/null | tr '\n' ' ')
    [ -n "$nm" ] && [ "$ck" = "$(printf 'step-%012d ' "$nm")" ]
    ok $? "mpirun: the ranks stopped at one step and checkpointed there (step ${nm:-none}; ${ck:-no checkpoint})"
    [ -n "$nm" ] || sed 's/^/#   /' "$T/m.err" | tail -10
    [ ! -e "$T/mstopped.st" ]; ok $? "mpirun: no --save weights from the stopped run"
    (mpirun_train --resume auto --save "$T/mresumed.st" > "$T/mr.out" 2> "$T/mr.err") &
    wait_pid $! 300
    ok $? "mpirun: --resume auto continues it to the end"
    ok_grep "$T/mr.out" "resumed from .*step-0*${nm:-x}" "mpirun: it resumed from the step it stopped at"
    cmp -s "$T/ref.st" "$T/mresumed.st"; ok $? "mpirun: stopped and resumed, the uninterrupted run's weight bytes"
else
    skip "no Open MPI mpirun (MPIRUN=${MPIRUN:-empty})"
fi

# a second SIGTERM to dtrun kills at once, long before the default grace of 30 s: ranks
# that take their time over the first (each says it got it, then goes on)
: > "$T/d.out"
"$DTRUN" -n 2 sh -c 'trap "echo got-term" TERM; echo up; while :; do sleep 0.2; done' "$tok" > "$T/d.out" 2> "$T/d.err" &
pid=$!
i=0; while [ "$(grep -c ':up$' "$T/d.out")" -lt 2 ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
kill -TERM $pid
i=0; while [ "$(grep -c ':got-term$' "$T/d.out")" -lt 2 ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
start=$(date +%s)
kill -TERM $pid
wait_pid $pid 20
rc=$?
took=$(( $(date +%s) - start ))
[ "$rc" -eq 143 ] && [ "$took" -lt 10 ]; ok $? "a second SIGTERM kills the ranks: exit 143 after ${took} s (got $rc)"
g=$(grep -c ':got-term$' "$T/d.out")
[ "$g" -eq 2 ]; ok $? "each rank got the first SIGTERM once ($g lines from 2 ranks)"
"$DTRUN" --help | grep -q "(default 30, Slurm's KillWait)"; ok $? "dtrun --help: --grace defaults to 30 s"
cleanup
done_testing
