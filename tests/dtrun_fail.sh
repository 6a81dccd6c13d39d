#!/bin/sh
# dtrun_fail.sh: exit codes propagate, and one failing rank ends the whole job quickly
# with a line naming the rank and how it died.
. "$DT_SRCDIR/tests/tap.sh"
DTRUN="$DT_BUILDDIR/dtrun"
tmp=$(mktemp -d) || exit 1
tok="dtrunfail$$"
# the job's processes carry $tok (unique to this run) in their command line; whatever a
# failed check leaves behind is killed by pid at the end
cleanup() { pids=$(pgrep -f "$tok"); [ -z "$pids" ] || kill -KILL $pids 2>/dev/null; }
trap 'cleanup; rm -rf "$tmp"' EXIT

# All ranks exit 0 -> 0.
timeout 20 "$DTRUN" -n 3 true
ok $? "all ranks exit 0: dtrun exits 0"

# Rank 1 exits 3 after a moment, the others would sleep: dtrun exits 3, names rank 1.
start=$(date +%s)
timeout 30 "$DTRUN" -n 3 sh -c 'if [ "$RANK" = 1 ]; then sleep 0.3; exit 3; fi; while :; do sleep 1; done' "$tok" \
    > "$tmp/out" 2> "$tmp/err"
rc=$?
el=$(( $(date +%s) - start ))
test "$rc" -eq 3
ok $? "exit code of the failing rank is propagated (got $rc)"
ok_grep "$tmp/err" '^dtrun: rank 1 \(pid [0-9]+\) failed first: exit code 3$' "message names rank 1 and its exit code"
test "$(grep -c 'failed first' "$tmp/err")" -eq 1
ok $? "exactly one 'failed first' line"
test "$el" -lt 10
ok $? "the job ended within 10 s (${el}s)"
sleep 0.2
! pgrep -f "$tok" > /dev/null
ok $? "no rank left behind"

# A rank killed with SIGKILL: the others (ignoring SIGTERM, so SIGKILL after --grace 2)
# end too; the message names the rank and the signal; exit 128+9.
start=$(date +%s)
timeout 30 "$DTRUN" -n 3 --grace 2 sh -c 'trap "" TERM; if [ "$RANK" = 2 ]; then sleep 0.3; kill -KILL $$; fi; while :; do sleep 1; done' "$tok" \
    > "$tmp/out" 2> "$tmp/err"
rc=$?
el=$(( $(date +%s) - start ))
test "$rc" -eq 137
ok $? "a rank killed by SIGKILL: dtrun exits 137 (got $rc)"
ok_grep "$tmp/err" '^dtrun: rank 2 \(pid [0-9]+\) failed first: killed by signal SIGKILL$' "message names rank 2 and SIGKILL"
test "$el" -lt 10
ok $? "all ranks ended within 10 s although they ignore SIGTERM (${el}s)"
sleep 0.2
! pgrep -f "$tok" > /dev/null
ok $? "no rank left behind"

# A rank that segfaults is named with its signal.
timeout 20 "$DTRUN" -n 2 sh -c 'if [ "$RANK" = 0 ]; then kill -SEGV $$; fi; sleep 5' "$tok" 2> "$tmp/err"
rc=$?
test "$rc" -eq 139
ok $? "SIGSEGV: exit 139 (got $rc)"
ok_grep "$tmp/err" '^dtrun: rank 0 \(pid [0-9]+\) failed first: killed by signal SIGSEGV$' "message names SIGSEGV"

# A program that cannot be run.
timeout 20 "$DTRUN" -n 2 "$tmp/no-such-program" > "$tmp/out" 2> "$tmp/err"
rc=$?
test "$rc" -eq 127
ok $? "missing program: exit 127 (got $rc)"
ok_grep "$tmp/err" "^\[rank[01]\]:dtrun: cannot run '.*no-such-program': No such file or directory" "the rank says it cannot run the program"
ok_grep "$tmp/err" "^dtrun: rank [01] \(pid [0-9]+\) failed first: exit code 127$" "and dtrun names the rank"
done_testing
