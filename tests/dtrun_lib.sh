# dtrun_lib.sh: helpers for the tests that run several dtruns as the nodes of one job
# (dtrun_nodes.sh, launch_netns.sh). Source it after tap.sh; the test defines
# `node R ARGS...`, which starts node R's dtrun in the background writing
# $tmp/outR and $tmp/errR, so that $! is dtrun's pid.

# wait for pid $1 at most $2 s (then kill it); its exit status
wait_for() {
    i=0
    while kill -0 "$1" 2>/dev/null && [ $i -lt $(($2 * 10)) ]; do sleep 0.1; i=$((i + 1)); done
    kill -0 "$1" 2>/dev/null && { diag "pid $1 still running after $2 s: killed"; kill -KILL "$1"; }
    wait "$1"
}

# both_nodes SECONDS ARGS...: run node 1 and node 0 with ARGS, wait for both at most
# SECONDS; their exit statuses in rc0 and rc1
both_nodes() {
    t=$1; shift
    node 1 "$@"; bn1=$!
    node 0 "$@"; bn0=$!
    wait_for $bn0 "$t"; rc0=$?
    wait_for $bn1 "$t"; rc1=$?
}

# both_ok "what": one test point, both nodes exited 0; else their last messages
both_ok() {
    test "$rc0" -eq 0 && test "$rc1" -eq 0
    ok $? "$1 (got $rc0, $rc1)"
    [ "$rc0" -eq 0 ] && [ "$rc1" -eq 0 ] && return
    for r in 0 1; do diag "node $r:"; sed 's/^/#   /' "$tmp/err$r" | tail -15; done
}

# kill_node1 P0 P1: SIGKILL node 1's dtrun (pid P1); node 0 (pid P0) must end with an
# error within 10 s naming node 1 as lost: two test points
kill_node1() {
    kill -KILL "$2"
    kn_start=$(date +%s)
    wait_for "$1" 20; rc0=$?
    kn_el=$(( $(date +%s) - kn_start ))
    test $rc0 -ne 0 && test $rc0 -ne 137 && test $kn_el -le 10
    ok $? "node 1 killed: node 0 ends with an error within 10 s (exit $rc0 after ${kn_el}s)"
    ok_grep "$tmp/err0" '^dtrun: node 1 \(.*\) was lost at .* UTC: its connection closed' "node 0 names the lost node"
    wait "$2" 2>/dev/null
}
