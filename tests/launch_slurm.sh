#!/bin/sh
# launch_slurm.sh: a real single-host Slurm (Debian's slurm-wlm and munge) runs the
# scripts of examples/slurm/. The test writes a minimal slurm.conf (this host as the one
# node, NodeAddr=127.0.0.1, CPUs from `slurmd -C`, free ports), starts munged as user
# munge with a fresh key, slurmctld and slurmd directly (SlurmUser=root,
# proctrack/linuxproc, task/none, select/cons_tres: no systemd, no cgroups), submits
# cpu.sbatch (srun, one task per rank) and dtrun.sbatch (one dtrun per node) with
# sbatch, runs `srun -n 2 dtrain train` directly (no MASTER_ADDR/MASTER_PORT anywhere:
# Slurm's variables give the rendezvous), waits for the jobs with a bounded loop and
# checks what they wrote; scancel preempts an srun job, which stops with its checkpoint
# and resumes to the uninterrupted weights. Every daemon it started is stopped on exit. Skips, saying
# why, without root, the packages, or 2 CPUs.
. "$DT_SRCDIR/tests/tap.sh"
[ "$(id -u)" -eq 0 ] || skip_all "needs root to run slurmctld, slurmd and munged"
for p in slurmctld slurmd sbatch squeue scontrol sinfo scancel munged mungekey runuser; do
    command -v $p > /dev/null || skip_all "$p not found: install slurm-wlm and munge"
done
id munge > /dev/null 2>&1 || skip_all "no user munge: install munge"
[ -x "$DT_BUILDDIR/dtrain" ] && [ -x "$DT_BUILDDIR/dtrun" ] || skip_all "dtrain and dtrun are not built"

tmp=$(mktemp -d) || exit 1
chmod 755 "$tmp"   # munged runs as munge and must reach its directory
pids=""
cleanup() {
    # jobs first (their steps run under slurmd), then the daemons this test started
    [ -n "$jobs" ] && timeout 5 scancel --quiet --full $jobs 2>/dev/null
    [ -s "$tmp/munge/munged.pid" ] && pids="$pids $(cat "$tmp/munge/munged.pid")"
    for p in $pids; do kill -TERM "$p" 2>/dev/null; done
    i=0
    while [ $i -lt 50 ]; do
        i=$((i + 1))
        alive=0; for p in $pids; do kill -0 "$p" 2>/dev/null && alive=1; done
        [ $alive = 0 ] && break; sleep 0.1
    done
    for p in $pids; do kill -KILL "$p" 2>/dev/null; done
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP   # so that the EXIT trap runs on these too
jobs=""
# wait until command "$@" succeeds, at most $1 s
until_ok() { t=$1; shift; i=0; while ! "$@" > /dev/null 2>&1; do i=$((i + 1)); [ $i -gt $((t * 5)) ] && return 1; sleep 0.2; done; }

# munge: a fresh key, our own socket, run as user munge
mkdir -p "$tmp/munge" && chown munge: "$tmp/munge" && chmod 755 "$tmp/munge"   # its socket must be reachable by all
mungekey -c -k "$tmp/munge/munge.key" > "$tmp/mungekey.log" 2>&1 || skip_all "mungekey -c failed: $(head -1 "$tmp/mungekey.log")"
chown munge: "$tmp/munge/munge.key" && chmod 600 "$tmp/munge/munge.key"
sock="$tmp/munge/munge.socket"
runuser -u munge -- munged -F --key-file="$tmp/munge/munge.key" --socket="$sock" \
    --pid-file="$tmp/munge/munged.pid" --log-file="$tmp/munge/munged.log" --seed-file="$tmp/munge/seed" \
    > "$tmp/munged.out" 2>&1 &
pids="$pids $!"
until_ok 10 test -S "$sock" || skip_all "munged did not start: $(tail -1 "$tmp/munge/munged.log" "$tmp/munged.out" 2>/dev/null | tr '\n' ' ')"

# slurm.conf: this host, free ports, state under $tmp
host=$(hostname)
node=$(slurmd -C 2>/dev/null | head -1 | grep -o '^NodeName=[^ ]* CPUs=[0-9]* .*ThreadsPerCore=[0-9]*')
[ -n "$node" ] || skip_all "slurmd -C did not describe this host"
cpus=$(echo "$node" | sed 's/.*CPUs=\([0-9]*\).*/\1/')
[ "$cpus" -ge 2 ] || skip_all "needs 2 CPUs for 2 ranks, slurmd -C says $cpus"
ctlport=$(free_port); dport=$(free_port)
mkdir -p "$tmp/state" "$tmp/spool" "$tmp/log" "$tmp/out"
export SLURM_CONF="$tmp/slurm.conf"
cat > "$SLURM_CONF" <<EOF
ClusterName=dttest$$
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctlport
SlurmdPort=$dport
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$sock
StateSaveLocation=$tmp/state
SlurmdSpoolDir=$tmp/spool
SlurmctldPidFile=$tmp/slurmctld.pid
SlurmdPidFile=$tmp/slurmd.pid
SlurmctldLogFile=$tmp/log/slurmctld.log
SlurmdLogFile=$tmp/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
MpiDefault=none
SwitchType=switch/none
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
ReturnToService=2
MaxJobCount=100
MinJobAge=60
KillWait=5
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=30
$node NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=dttest Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
export SLURM_CONF
slurmctld -D -i -f "$SLURM_CONF" > "$tmp/log/slurmctld.out" 2>&1 &
pids="$pids $!"
slurmd -D -f "$SLURM_CONF" > "$tmp/log/slurmd.out" 2>&1 &
pids="$pids $!"
why() { tail -3 "$tmp/log/slurmctld.log" "$tmp/log/slurmd.log" "$tmp/log/"*.out 2>/dev/null | tr '\n' ' ' | cut -c1-400; }
until_ok 20 scontrol ping || skip_all "slurmctld did not answer: $(why)"
idle() { sinfo -h -N -o '%T' 2>/dev/null | grep -Eq '^(idle|mixed|allocated)'; }
until_ok 30 idle || skip_all "slurmd did not register its node: $(why)"
ok 0 "a single-host Slurm is up ($host, $cpus CPUs)"

export DTRAIN="$DT_BUILDDIR/dtrain" DTRUN="$DT_BUILDDIR/dtrun"
# no rendezvous address from the caller: under srun, launch_env.c finds it (the first
# host of the node list, port 20000 + job id % 20000)
unset MASTER_ADDR MASTER_PORT RANK WORLD_SIZE

# submit SCRIPT NAME [sbatch flags]: the job id, or "" (the reason in $tmp/NAME.sbatch)
submit() {
    s=$1; name=$2; shift 2
    timeout 20 sbatch --parsable --chdir="$tmp" --output="$tmp/out/$name.out" "$@" \
        "$DT_SRCDIR/examples/slurm/$s" --data synthetic:1024,1,8,8,4 --model "flatten linear(16) relu linear(4)" \
        --epochs 1 --batch 64 2> "$tmp/$name.sbatch" | cut -d';' -f1
}
# wait (at most $2 s) until job $1 has left the queue; its final state
finish() {
    i=0
    while [ -n "$(squeue -h -j "$1" 2>/dev/null)" ] && [ $i -lt $(($2 * 5)) ]; do sleep 0.2; i=$((i + 1)); done
    scontrol show job "$1" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | cut -d= -f2
}

# run_job SCRIPT NAME [sbatch flags]: submit, wait (at most 60 s), two test points;
# the job id in $id
run_job() {
    s=$1; name=$2; shift 2
    id=$(submit "$s" "$name" "$@")
    [ -n "$id" ] && jobs="$jobs $id"
    test -n "$id"
    ok $? "sbatch $s accepted (job ${id:-none})"
    [ -n "$id" ] || sed 's/^/#   /' "$tmp/$name.sbatch"
    state=$(finish "$id" 60)
    test "$state" = COMPLETED
    ok $? "$s: the job completed (state ${state:-unknown})"
    [ "$state" = COMPLETED ] || { sed 's/^/#   /' "$tmp/out/$name.out" | tail -15; diag "$(why)"; }
}

# cpu.sbatch: srun, one task per rank
run_job cpu.sbatch cpu
ok_grep "$tmp/out/cpu.out" "^dtrain-cpu: job $id: 2 ranks on $host, 1 threads each" "cpu.sbatch: 2 ranks, threads from --cpus-per-task"
ok_grep "$tmp/out/cpu.out" "^dtrain: done: 16 steps" "cpu.sbatch: the 2-rank training finished"
ok_grep "$tmp/out/cpu.out" "^dtrain: .* 2 processes" "cpu.sbatch: rank 0 saw a world of 2 (from Slurm's variables)"
test "$(grep -c '^dtrain: done' "$tmp/out/cpu.out")" -eq 1
ok $? "cpu.sbatch: one job of 2 ranks, not 2 jobs of 1"

# srun straight from a shell, in an allocation of its own
timeout 120 srun -n 2 --kill-on-bad-exit=1 "$DTRAIN" train --data synthetic:1024,1,8,8,4 \
    --model "flatten linear(16) relu linear(4)" --epochs 1 --batch 64 > "$tmp/srun.out" 2>&1
rc=$?
ok $rc "srun -n 2 dtrain train, no MASTER_ADDR/MASTER_PORT: exit 0"
[ $rc -eq 0 ] || { sed 's/^/#   /' "$tmp/srun.out" | tail -15; diag "$(why)"; }
ok_grep "$tmp/srun.out" "^dtrain: .* 2 processes" "srun -n 2: one job of 2 processes"
ok_grep "$tmp/srun.out" "^dtrain: done: 16 steps" "srun -n 2: the training finished"

# dtrun.sbatch: one dtrun per node
run_job dtrun.sbatch dtrun --export=ALL,NPROC=2
ok_grep "$tmp/out/dtrun.out" "^dtrain-dtrun: job $id: 1 node\(s\) x 2 ranks, rendezvous $host:" "dtrun.sbatch: 1 node x 2 ranks"
ok_grep "$tmp/out/dtrun.out" '^\[rank0\]:dtrain: done: 16 steps' "dtrun.sbatch: rank 0 finished training under dtrun"

test -z "$(ls -A "$tmp" | grep '^\.dtrain-secret-')"
ok $? "the scripts removed their job secret files"

# preemption under srun: scancel has Slurm send every task SIGTERM (SIGKILL KillWait
# later); the ranks stop after one step with the checkpoint, and srun --resume auto ends
# the run with the weights of one never interrupted (run under dtrun: no launcher
# changes a bit)
pre() {   # pre CKDIR EXTRA CMD...: the run (about 1.3 ms a step: the signal comes long before its end)
    ck=$1 extra=$2; shift 2
    "$@" train --data synthetic:2048,1,16,16,4 --model "flatten linear(512) relu linear(512) relu linear(4)" \
        --batch 64 --epochs 200 --steps 4000 --no-eval --log-every 50 --threads 1 --checkpoint-dir "$ck" \
        --checkpoint-every 100000 $extra
}
pre "$tmp/ckr" "--save $tmp/pref.st" timeout 120 "$DT_BUILDDIR/dtrun" -n 2 "$DTRAIN" > "$tmp/pref.out" 2>&1
ok $? "the uninterrupted run (dtrun -n 2)"
pre "$tmp/ckp" "--save $tmp/pstop.st" timeout 120 srun -n 2 -J dtpreempt "$DTRAIN" > "$tmp/pre.out" 2>&1 &
spid=$!
wait_line "$tmp/pre.out" "^epoch [0-9/]+  step 50/4000"
jid=$(squeue -h -n dtpreempt -o %i 2>/dev/null | head -1)
[ -n "$jid" ] && jobs="$jobs $jid"
timeout 20 scancel "${jid:-none}"
ok $? "scancel the srun job (${jid:-not found}) once it logged step 50"
wait_pid $spid 60
n=$(sed -n "s/^dtrain: stopped at step \([0-9]*\) on SIGTERM, checkpointed in .*/\1/p" "$tmp/pre.out")
[ -n "$n" ] && [ "$(ls "$tmp/ckp" 2>/dev/null)" = "$(printf 'step-%012d' "$n")" ] && [ ! -e "$tmp/pstop.st" ]
ok $? "srun: every task stopped after step ${n:-none} with the checkpoint there, no --save"
[ -n "$n" ] || sed 's/^/#   /' "$tmp/pre.out" | tail -8
pre "$tmp/ckp" "--resume auto --save $tmp/pres.st" timeout 120 srun -n 2 "$DTRAIN" > "$tmp/pres.out" 2>&1
ok $? "srun -n 2 --resume auto continues it to the end"
cmp -s "$tmp/pref.st" "$tmp/pres.st"; ok $? "srun: stopped and resumed, the uninterrupted run's weight bytes"

# a failing job: srun ends every task and the job fails
id=$(submit cpu.sbatch bad --export=ALL,DTRAIN=/bin/false)
[ -n "$id" ] && jobs="$jobs $id"
state=$(finish "$id" 60)
test "$state" = FAILED
ok $? "a job whose ranks fail ends FAILED (state ${state:-unknown})"
done_testing
