#!/bin/sh
# dtrun_signal.sh: Ctrl-C (SIGINT to dtrun) and SIGTERM are forwarded to the ranks, dtrun
# reaps them and exits 128+sig, and no process of the job is left behind — also when
# dtrun itself is killed with SIGKILL (the ranks die with it), ranks behind a wrapper shell
# included.
. "$DT_SRCDIR/tests/tap.sh"
DTRUN="$DT_BUILDDIR/dtrun"
tmp=$(mktemp -d) || exit 1
tok="dtrunsig$$"
# the job's processes carry $tok (unique to this run) in their command line; whatever a
# failed check leaves behind is killed by pid at the end
cleanup() { pids=$(pgrep -f "$tok"); [ -z "$pids" ] || kill -KILL $pids 2>/dev/null; }
trap 'cleanup; rm -rf "$tmp"' EXIT

# Wait (at most 10 s) until every one of $2 ranks has printed "up" into $1.
wait_up() {
    i=0
    while [ "$(grep -c ':up$' "$1" 2>/dev/null)" -lt "$2" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
    [ "$(grep -c ':up$' "$1")" -ge "$2" ]
}
# Empty the output file in this shell before a run: wait_up must not see the lines of
# the previous run (the redirection of a background command happens later, in its child).
fresh() { : > "$tmp/out"; : > "$tmp/err"; }

# SIGHUP ignored where this runs (under nohup) stays ignored in dtrun, as it should
hup_ignored=0
ign=$(sed -n 's/^SigIgn:[[:space:]]*//p' /proc/$$/status 2>/dev/null)
[ -n "$ign" ] && [ $((0x$ign & 1)) -ne 0 ] && hup_ignored=1
for sig in INT TERM HUP; do
    if [ "$sig" = HUP ] && [ $hup_ignored = 1 ]; then
        for k in 1 2 3 4; do skip "SIGHUP is ignored in this environment (nohup): dtrun keeps it so"; done
        continue
    fi
    # ranks spawn a grandchild too, to check the whole group goes
    fresh
    "$DTRUN" -n 3 sh -c 'sh -c "while :; do sleep 1; done" "$0-child" & echo up; while :; do sleep 1; done' "$tok" \
        > "$tmp/out" 2> "$tmp/err" &
    pid=$!
    wait_up "$tmp/out" 3
    ok $? "SIG$sig: all ranks started"
    kill -$sig $pid
    wait_pid $pid 10
    rc=$?
    case $sig in INT) want=130 ;; TERM) want=143 ;; HUP) want=129 ;; esac
    test "$rc" -eq "$want"
    ok $? "SIG$sig: dtrun exits $want (got $rc)"
    ok_grep "$tmp/err" "^dtrun: stopped by SIG$sig" "SIG$sig: dtrun says why it stopped"
    sleep 0.3
    ! pgrep -f "$tok" > /dev/null
    ok $? "SIG$sig: no rank or grandchild left behind"
    cleanup
done

# Ranks that ignore the forwarded SIGINT are SIGKILLed after the grace period.
fresh
"$DTRUN" -n 2 --grace 1 sh -c 'trap "" INT TERM; echo up; while :; do sleep 1; done' "$tok" > "$tmp/out" 2> "$tmp/err" &
pid=$!
wait_up "$tmp/out" 2
kill -INT $pid
wait_pid $pid 10
rc=$?
test "$rc" -eq 130
ok $? "ranks ignoring SIGINT: dtrun still ends, exit 130 (got $rc)"
sleep 0.3
! pgrep -f "$tok" > /dev/null
ok $? "ranks ignoring SIGINT: none left behind"
cleanup

# dtrun killed with SIGKILL: nothing of the job outlives it, neither ranks that are
# dtrun's children (PR_SET_PDEATHSIG) nor ranks started through a wrapper (dtrun -n 2
# sh -c "prog; echo"): grandchildren, which the parent-death signal does not reach and
# the watcher process ends with the rest of the group.
# kill9 WHAT ARGS...: dtrun -n 2 ARGS (ranks that print "up"), SIGKILLed once they are up
kill9() {
    what=$1; shift
    fresh
    "$DTRUN" -n 2 "$@" > "$tmp/out" 2> "$tmp/err" &
    pid=$!
    wait_up "$tmp/out" 2
    ok $? "SIGKILL, $what: ranks started"
    kill -KILL $pid
    wait $pid 2>/dev/null
    i=0
    while pgrep -f "$tok" > /dev/null && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
    left=$(pgrep -f "$tok" | tr '\n' ' ')
    [ -z "$left" ]
    ok $? "SIGKILL to dtrun, $what: nothing of the job outlives it within 5 s (left: ${left:-none})"
    cleanup
}
kill9 "ranks as its children" sh -c 'echo up; exec sleep 60' "$tok"
kill9 "ranks behind a wrapper" sh -c 'sh -c "echo up; while :; do sleep 1; done" "$0-rank"; echo after' "$tok"
done_testing
