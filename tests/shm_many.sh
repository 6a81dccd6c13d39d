#!/bin/bash
# shm_many.sh: many ranks on one host over the tcp backend's shared memory, and what
# killed jobs leave in /dev/shm.
#   - 64 ranks of dtbench under dtrun pass, and none of their segments is left;
#   - rings are made when a pair first talks (DT_SHM_WARM=1: for the collectives' partners
#     at the start, checked here too): after one all_reduce over 64 ranks each
#     rank has mapped log2(64) = 6 rings it made and 6 its partners made; with a small
#     DT_SHM_BUDGET only 2 of each (the other partners stay on TCP), and every collective
#     still passes with such mixed pairs; a malformed DT_SHM_BUDGET is refused;
#   - a ring offered to a rank that never reads it stays in /dev/shm while its maker
#     lives; after a SIGKILL of the maker, dtrun removes it, and without dtrun the next
#     job on the host does;
#   - the sweep's rule on planted names: a dead maker's segment goes; a live maker's, one
#     from another pid namespace and names not of this form stay; a reused pid (another
#     start time) counts as dead;
#   - open files: the soft limit is raised to the hard one when the mesh needs more; a
#     hard limit below the need is a clear error.
# Segments are named /dtrain-PID-... (src/comm/shm_name.h): a job's leftovers are the
# names carrying its ranks' pids, which each rank writes to a file before it starts.
. "$DT_SRCDIR/tests/tap.sh"
. "$DT_SRCDIR/tests/comm_lib.sh"
DTRUN="$DT_BUILDDIR/dtrun"
DTBENCH="$DT_BUILDDIR/dtbench"
[ -x "$DTRUN" ] && [ -x "$DTBENCH" ] || skip_all "dtrun or dtbench is not built"
[ -d /dev/shm ] && [ -w /dev/shm ] || skip_all "/dev/shm is not a writable directory"
ns=$(readlink /proc/self/ns/pid | tr -dc 0-9)
[ -n "$ns" ] || skip_all "no /proc/self/ns/pid: the sweep cannot tell pid namespaces apart"
planted=
trap 'rm -rf "$TMP"; for f in $planted; do rm -f "/dev/shm/$f"; done' EXIT
export DT_TIMEOUT=120

# segments in /dev/shm made by the pids listed in file $1
left_of() {
    for p in $(cat "$1" 2>/dev/null); do
        ls /dev/shm | grep "^dtrain-$p-"
    done
}
# the program each rank runs: write its pid to $PIDS, then become ARGS
WRAP='echo $$ >> "$PIDS"; exec "$@"'

# ---- 64 ranks of dtbench -------------------------------------------------------------------
export PIDS="$TMP/pids64"
timeout 300 "$DTRUN" -n 64 sh -c "$WRAP" rank "$DTBENCH" -b 4K -e 256K -w 1 -n 3 > "$TMP/bench64" 2>&1
st=$?
ok $st "64 ranks of dtbench on one host pass (exit $st)"
[ $st -eq 0 ] || tail -5 "$TMP/bench64" | sed 's/^/#   /'
[ "$(wc -l < "$PIDS")" -eq 64 ]; ok $? "all 64 ranks started"
left=$(left_of "$PIDS")
[ -z "$left" ]; ok $? "no segment of the 64 ranks is left in /dev/shm"
[ -z "$left" ] || diag "left: $left"

# ---- lazy rings, the budget -----------------------------------------------------------------
"$DTRUN" -n 64 "$PROG" --mode rings > "$TMP/rings" 2>&1
ok $? "64 ranks: one all_reduce, checked"
[ "$(grep -c 'rings out 6 in 6 ' "$TMP/rings")" -eq 64 ]
ok $? "every rank mapped 6 rings of its own and 6 of its partners (log2 64), not 63"
DT_SHM_WARM=1 "$DTRUN" -n 64 "$PROG" --mode rings > "$TMP/rings" 2>&1
ok $? "64 ranks with the rings made at the start (DT_SHM_WARM=1): one all_reduce, checked"
[ "$(grep -c 'rings out 6 in 6 ' "$TMP/rings")" -eq 64 ]
ok $? "... the same 6 rings each way, no more"
DT_SHM_BUDGET=150K "$DTRUN" -n 64 "$PROG" --mode rings > "$TMP/rings" 2>&1
st=$?
[ $st -eq 0 ] && [ "$(grep -c 'rings out 2 in 2 ' "$TMP/rings")" -eq 64 ]
ok $? "DT_SHM_BUDGET=150K: 2 rings of 64 KiB per rank, the other partners over TCP (exit $st)"
DT_SHM=0 "$DTRUN" -n 4 "$PROG" --mode rings > "$TMP/rings" 2>&1
ok_grep "$TMP/rings" '^\[rank0\]:rank 0 rings out 0 in 0 ' "DT_SHM=0: no ring"
for n in 8 6; do
    LAUNCH_ENV="DT_SHM_BUDGET=150K" launch $n --mode all
    st=$?
    all_passed || st=1
    ok $st "$n ranks, every collective, with pairs on rings and pairs on TCP (DT_SHM_BUDGET=150K)"
done
LAUNCH_ENV="DT_SHM_BUDGET=lots" launch 2 --mode init
st=$?
[ $st -ne 0 ] && grep -q "DT_SHM_BUDGET='lots': expected the bytes" "$TMP/out.0"
ok $? "a malformed DT_SHM_BUDGET is refused"

# ---- a killed maker's ring -----------------------------------------------------------------
# --mode timeout: rank 1 never reads; rank 0's all_reduce offers it a ring and waits.
# wait_seg FILE: until a segment of the pid in FILE exists (30 s bound); its name
wait_seg() {
    for _ in $(seq 300); do
        p=$(head -1 "$1" 2>/dev/null)
        [ -n "$p" ] && s=$(ls /dev/shm | grep "^dtrain-$p-" | head -1) && [ -n "$s" ] && { echo "$s"; return 0; }
        sleep 0.1
    done
    return 1
}
export PIDS="$TMP/pids_dtrun"
: > "$PIDS.0"
"$DTRUN" -n 2 sh -c 'echo $$ >> "$PIDS.$RANK"; exec "$@"' rank "$PROG" --mode timeout > "$TMP/killed" 2>&1 &
dtrun_pid=$!
seg=$(wait_seg "$PIDS.0")
ok $? "a ring offered to a rank that never reads is in /dev/shm while its maker lives ($seg)"
kill -KILL "$(head -1 "$PIDS.0")" 2>/dev/null
for _ in $(seq 300); do kill -0 $dtrun_pid 2>/dev/null || break; sleep 0.1; done
kill -0 $dtrun_pid 2>/dev/null && { diag "dtrun still running after 30 s: killed"; kill -KILL $dtrun_pid; }
wait $dtrun_pid
st=$?
[ $st -ne 0 ] && [ -n "$seg" ] && [ ! -e "/dev/shm/$seg" ]
ok $? "its maker SIGKILLed under dtrun: dtrun fails (exit $st) and leaves no segment"

export PIDS="$TMP/pids_bare"
: > "$PIDS.0"
port=$(free_port)
for r in 0 1; do
    RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port DT_JOB_ID=$JOB.k \
        timeout 60 sh -c 'echo $$ >> "$PIDS.$RANK"; exec "$@"' rank "$PROG" --mode timeout > "$TMP/bare.$r" 2>&1 &
done
seg=$(wait_seg "$PIDS.0")
ok $? "the same without dtrun ($seg)"
kill -KILL $(cat "$PIDS.0" "$PIDS.1") 2>/dev/null
wait
LAUNCH_ENV= launch 2 --mode init
st=$?
[ $st -eq 0 ] && [ -n "$seg" ] && [ ! -e "/dev/shm/$seg" ]
ok $? "both ranks SIGKILLed (as by the OOM killer): the next job on the host removes the segment"

# ---- the sweep's rule -----------------------------------------------------------------------
# pid_max itself is never a process id; a live process gives a pid and a start time
sleep 300 & live=$!
start=$(sed 's/.*) //' /proc/$live/stat | awk '{print $20}')
dead=$(cat /proc/sys/kernel/pid_max)
tag="planted$$"
gone="dtrain-$dead-1-$ns-$tag dtrain-$live-$((start + 1))-$ns-$tag"
kept="dtrain-$live-$start-$ns-$tag dtrain-$dead-1-$((ns + 1))-$tag dtrain-$dead-abc-$tag dtrain-$dead-1-$ns"
planted="$gone $kept"
for f in $planted; do : > "/dev/shm/$f"; done
LAUNCH_ENV= launch 2 --mode init
ok $? "a job runs with the planted names in /dev/shm"
st=0
for f in $gone; do [ -e "/dev/shm/$f" ] && { st=1; diag "not removed: $f"; }; done
ok $st "removed: a dead maker's segment, and one whose pid now has another start time"
st=0
for f in $kept; do [ -e "/dev/shm/$f" ] || { st=1; diag "removed: $f"; }; done
ok $st "kept: a live maker's, another pid namespace's, and names of another form"
kill $live 2>/dev/null
wait $live 2>/dev/null
: > "/dev/shm/dtrain-$dead-1-$ns-$tag"
"$DTRUN" -n 1 true > /dev/null 2>&1
[ ! -e "/dev/shm/dtrain-$dead-1-$ns-$tag" ]; ok $? "dtrun sweeps after its ranks end (1 rank: no set-up sweep)"

# ---- open files ------------------------------------------------------------------------------
hard=$(ulimit -Hn)
if [ "$hard" = unlimited ] || [ "$hard" -ge 200 ]; then
    (ulimit -Sn 40; LAUNCH_ENV= launch 2 --mode rings)
    want=$hard
    [ "$hard" = unlimited ] && want=582   # 2 per rank, 64, and 257 for each of its 2 gates
    ok_grep "$TMP/out.0" "^rank 0 rings out 1 in 1 nofile $want\$" "a soft limit of 40 open files is raised to the hard one ($hard)"
else
    skip "the hard limit on open files ($hard) is too low to test raising the soft one"
fi
port=$(free_port)
(ulimit -n 100; RANK=1 WORLD_SIZE=512 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port DT_JOB_ID=$JOB.f timeout 60 "$PROG" --mode init) \
    > "$TMP/nofile" 2>&1
st=$?
[ $st -eq 2 ]; ok $? "a hard limit of 100 open files for 512 ranks is refused at once (exit $st)"
ok_grep "$TMP/nofile" "a world of 512 ranks needs about 576 open files on rank 1 .*hard limit is 100: raise it" \
    "the error says how many are needed and which limit to raise"
done_testing
