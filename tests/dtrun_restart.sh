#!/bin/sh
# dtrun_restart.sh: --max-restarts (a rank that fails only on its first attempt is
# recovered; a rank that always fails ends the job after K restarts), --log-dir with
# and without --tee, --ranks-filter, and options given as DTRUN_* variables.
. "$DT_SRCDIR/tests/tap.sh"
DTRUN="$DT_BUILDDIR/dtrun"
tmp=$(mktemp -d) || exit 1
tok="dtrunrestart$$"
cleanup() { pids=$(pgrep -f "$tok"); [ -z "$pids" ] || kill -KILL $pids 2>/dev/null; }
trap 'cleanup; rm -rf "$tmp"' EXIT

# rank 1 fails on the first attempt only
flaky='echo "try $DT_RESTART_COUNT of $DT_MAX_RESTARTS job $DT_JOB_ID port $MASTER_PORT"
if [ "$RANK" = 1 ] && [ "$DT_RESTART_COUNT" = 0 ]; then echo "first try fails" >&2; exit 9; fi
sleep 0.2'
DT_JOB_ID= timeout 30 "$DTRUN" -n 2 --max-restarts 1 sh -c "$flaky" "$tok" > "$tmp/out" 2> "$tmp/err"
rc=$?
ok $rc "--max-restarts 1 recovers a rank that fails on its first attempt (exit $rc)"
ok_grep "$tmp/err" '^dtrun: rank 1 \(pid [0-9]+\) failed first: exit code 9$' "the failure is reported"
ok_grep "$tmp/err" '^dtrun:   \| first try fails$' "with the rank's last stderr line"
ok_grep "$tmp/err" '^dtrun: restarting all ranks \(restart 1 of 1\)$' "the restart is announced"
ok_grep "$tmp/out" '^\[rank0\]:try 1 of 1 job dtrun-[0-9a-f]+-r1 port [0-9]+$' "restarted ranks see DT_RESTART_COUNT=1, DT_MAX_RESTARTS=1, a new job id"
ok_grep "$tmp/out" '^\[rank1\]:try 0 of 1 ' "the first attempt saw DT_RESTART_COUNT=0"
test "$(grep -c 'try 1 of 1' "$tmp/out")" -eq 2
ok $? "both ranks restarted"

# always failing: K restarts, then the job fails with the rank's code
timeout 30 "$DTRUN" -n 2 --max-restarts 2 sh -c '[ "$RANK" = 0 ] && exit 4; sleep 0.2' "$tok" > "$tmp/out" 2> "$tmp/err"
rc=$?
test $rc -eq 4
ok $? "a rank that always fails: exit 4 after the restarts (got $rc)"
test "$(grep -c '^dtrun: restarting all ranks' "$tmp/err")" -eq 2 && grep -q 'attempt 3 of 3$' "$tmp/err"
ok $? "two restarts, the last report says attempt 3 of 3"

# without --max-restarts there is no restart
timeout 30 "$DTRUN" -n 2 sh -c '[ "$RANK" = 0 ] && exit 4; sleep 0.2' "$tok" > "$tmp/out" 2> "$tmp/err"
rc=$?
test $rc -eq 4 && ! grep -q restarting "$tmp/err"
ok $? "no restart by default (exit $rc)"

# --log-dir: one file per rank, dtrun's own log, nothing of the ranks on the console
timeout 30 "$DTRUN" -n 2 --log-dir "$tmp/logs" --max-restarts 1 sh -c "$flaky"' ; echo "out of $RANK"; echo "err of $RANK" >&2' "$tok" \
    > "$tmp/out" 2> "$tmp/err"
ok $? "--log-dir run exits 0"
test ! -s "$tmp/out" && ! grep -q '^\[rank' "$tmp/err"
ok $? "--log-dir without --tee: no rank output on the console"
ok_grep "$tmp/logs/rank1.log" '^first try fails$' "rank 1's log has its first attempt's stderr"
ok_grep "$tmp/logs/rank1.log" '^--- dtrun: restart 1 ---$' "and a header for the restart"
ok_grep "$tmp/logs/rank1.log" '^err of 1$' "and the restarted rank's output"
ok_grep "$tmp/logs/rank0.log" '^out of 0$' "rank 0's log"
ok_grep "$tmp/logs/dtrun-node0.log" 'restarting all ranks' "dtrun's own log"

# --tee and --ranks-filter
timeout 30 "$DTRUN" -n 3 --log-dir "$tmp/logs2" --tee --ranks-filter 0,2 sh -c 'echo "hi $RANK"' > "$tmp/out" 2> "$tmp/err"
ok $? "--tee --ranks-filter run exits 0"
ok_grep "$tmp/out" '^\[rank0\]:hi 0$' "--tee shows rank 0"
ok_grep "$tmp/out" '^\[rank2\]:hi 2$' "--tee shows rank 2"
! grep -q 'rank1' "$tmp/out"
ok $? "--ranks-filter 0,2 hides rank 1"
ok_grep "$tmp/logs2/rank1.log" '^hi 1$' "rank 1 still has its log"

# DTRUN_* variables; flags win over them
DTRUN_NPROC_PER_NODE=3 DTRUN_RANKS_FILTER=1-2 DTRUN_RUN_ID=fromenv timeout 30 "$DTRUN" sh -c 'echo "W=$WORLD_SIZE J=$DT_JOB_ID"' > "$tmp/out" 2>&1
ok $? "DTRUN_NPROC_PER_NODE=3 alone is enough"
test "$(grep -c '^\[rank[12]\]:W=3 J=fromenv$' "$tmp/out")" -eq 2 && ! grep -q rank0 "$tmp/out"
ok $? "DTRUN_NPROC_PER_NODE, DTRUN_RANKS_FILTER and DTRUN_RUN_ID apply"
DTRUN_NPROC_PER_NODE=3 timeout 30 "$DTRUN" -n 1 sh -c 'echo "W=$WORLD_SIZE"' > "$tmp/out" 2>&1
ok_grep "$tmp/out" '^\[rank0\]:W=1$' "-n 1 wins over DTRUN_NPROC_PER_NODE=3"
DTRUN_MAX_RESTARTS=lots timeout 10 "$DTRUN" -n 1 true > "$tmp/out" 2> "$tmp/err"
rc=$?
test $rc -eq 2
ok $? "a bad DTRUN_MAX_RESTARTS: exit 2 (got $rc)"
ok_grep "$tmp/err" "^dtrun: DTRUN_MAX_RESTARTS: expected an integer in 0\.\.1000000, got 'lots'" "the message names the variable"

# a rank killed with SIGKILL under --max-restarts is restarted too, and the job ends
timeout 30 "$DTRUN" -n 2 --max-restarts 1 sh -c '[ "$RANK" = 1 ] && [ "$DT_RESTART_COUNT" = 0 ] && kill -KILL $$; echo "alive $DT_RESTART_COUNT"' "$tok" \
    > "$tmp/out" 2> "$tmp/err"
ok $? "a rank SIGKILLed on the first attempt is recovered"
ok_grep "$tmp/err" '^dtrun: rank 1 \(pid [0-9]+\) failed first: killed by signal SIGKILL$' "the signal is named"
sleep 0.2
! pgrep -f "$tok" > /dev/null
ok $? "no rank left behind"
done_testing
