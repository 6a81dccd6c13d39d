#!/bin/sh
# dtrun_nodes.sh: several dtruns on one host (127.0.0.1) as the nodes of one job: every
# rank's variables, a collective across the nodes, a failure on one node seen by all,
# a node whose dtrun is killed, SIGINT to one node, nodes that disagree, an unreachable
# master and a taken port.
. "$DT_SRCDIR/tests/tap.sh"
. "$DT_SRCDIR/tests/dtrun_lib.sh"
DTRUN="$DT_BUILDDIR/dtrun"
tmp=$(mktemp -d) || exit 1
tok="dtrunnodes$$"
cleanup() { pids=$(pgrep -f "$tok"); [ -z "$pids" ] || kill -KILL $pids 2>/dev/null; }
trap 'cleanup; rm -rf "$tmp"' EXIT

# node R of a 2-node job on port $port, 2 ranks each, in the background (exec, so that
# $! is dtrun's pid): node R ARGS...
node() { r=$1; shift; rm -f "$tmp/out$r" "$tmp/err$r"; (exec "$DTRUN" -n 2 --nnodes 2 --node-rank "$r" --master-port "$port" "$@" \
             > "$tmp/out$r" 2> "$tmp/err$r") & }
# Wait (at most 10 s) until $1 holds $2 lines ending in ":up".
wait_up() {
    i=0
    while [ "$(cat "$@" 2>/dev/null | grep -c ':up$')" -lt 4 ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
    [ "$(cat "$@" | grep -c ':up$')" -ge 4 ]
}

# The variables of every rank on two nodes.
port=$(free_port)
show='echo R=$RANK L=$LOCAL_RANK W=$WORLD_SIZE LW=$LOCAL_WORLD_SIZE N=$NODE_RANK M=$MASTER_ADDR P=$MASTER_PORT J=$DT_JOB_ID RC=$DT_RESTART_COUNT MR=$DT_MAX_RESTARTS NN=$DT_NNODES'
both_nodes 30 --run-id nodes-ok sh -c "$show" "$tok"
both_ok "two nodes run and exit 0"
cat "$tmp/out0" "$tmp/out1" > "$tmp/all"
for r in 0 1 2 3; do
    n=$((r / 2)); l=$((r % 2))
    ok_grep "$tmp/all" "^\[rank$r\]:R=$r L=$l W=4 LW=2 N=$n M=127\.0\.0\.1 P=[0-9]+ J=nodes-ok RC=0 MR=0 NN=2\$" "rank $r: node $n, local rank $l, world 4"
done
test "$(sed -n 's/.* P=\([0-9]*\) .*/\1/p' "$tmp/all" | sort -u | wc -l)" -eq 1
ok $? "all four ranks share one MASTER_PORT"
! grep -q "P=$port " "$tmp/all"
ok $? "the ranks' port is not the rendezvous port"
ok_grep "$tmp/err1" "^dtrun: node 1 of 2 \(.*\): ranks 2\.\.3 of 4; nodes: 0=.* 1=" "node 1 prints the layout"

# A collective across the two nodes (dtbench checks its results).
if [ -x "$DT_BUILDDIR/dtbench" ]; then
    port=$(free_port)
    both_nodes 30 "$DT_BUILDDIR/dtbench" -b 4K -e 64K -n 3 -w 1
    both_ok "dtbench all_reduce over 2 nodes x 2 ranks exits 0"
    ok_grep "$tmp/out0" '^\[rank0\]:.* 65536 .* 0$' "64 KiB all_reduce across nodes, no wrong element"
else
    skip "dtbench not built"; skip "dtbench not built"
fi

# A rank on node 1 fails: both nodes stop, both print the same first failure.
port=$(free_port)
prog='echo up; if [ "$RANK" = 3 ]; then sleep 0.5; echo "disk full on rank $RANK" >&2; exit 5; fi; exec sleep 30'
start=$(date +%s)
both_nodes 20 sh -c "$prog" "$tok"
el=$(( $(date +%s) - start ))
test $rc0 -eq 5 && test $rc1 -eq 5 && test $el -le 10
ok $? "rank 3 exits 5: both dtruns exit 5 within 10 s (got $rc0, $rc1 after ${el}s)"
for r in 0 1; do
    ok_grep "$tmp/err$r" '^dtrun: rank 3 \(pid [0-9]+\) failed first: exit code 5$' "node $r names rank 3 and its exit code"
    ok_grep "$tmp/err$r" '^dtrun:   on node 1 \(.*\), local rank 1, at [0-9-]+ [0-9:.]+ UTC, attempt 1 of 1$' "node $r says where and when"
    ok_grep "$tmp/err$r" '^dtrun:   \| disk full on rank 3$' "node $r shows rank 3's last stderr line"
done
sleep 0.3
! pgrep -f "$tok" > /dev/null
ok $? "no rank left on either node"
cleanup

# --max-restarts 1 on both nodes: rank 3 fails on its first attempt only; every rank of
# both nodes starts again with DT_RESTART_COUNT=1 and a new common port, and the job ends 0.
port=$(free_port)
flaky='if [ "$RANK" = 3 ] && [ "$DT_RESTART_COUNT" = 0 ]; then echo "flaky $RANK" >&2; exit 6; fi
sleep 0.3; echo "R=$RANK RC=$DT_RESTART_COUNT P=$MASTER_PORT J=$DT_JOB_ID"'
both_nodes 30 --max-restarts 1 --run-id again sh -c "$flaky" "$tok"
both_ok "--max-restarts 1 over two nodes recovers rank 3"
cat "$tmp/out0" "$tmp/out1" > "$tmp/all"
test "$(grep -c '^\[rank[0-3]\]:R=[0-3] RC=1 P=[0-9]* J=again-r1$' "$tmp/all")" -eq 4
ok $? "all four ranks ran again with DT_RESTART_COUNT=1 and job id again-r1"
# (a first-attempt rank may print before rank 3's failure stops it on a loaded machine:
# only the restarted ranks' lines count)
test "$(grep 'RC=1 ' "$tmp/all" | sed -n 's/.* P=\([0-9]*\) .*/\1/p' | sort -u | wc -l)" -eq 1
ok $? "the restarted ranks share one MASTER_PORT"
for r in 0 1; do
    ok_grep "$tmp/err$r" '^dtrun: rank 3 \(pid [0-9]+\) failed first: exit code 6$' "node $r reports rank 3's failure"
    ok_grep "$tmp/err$r" '^dtrun: restarting all ranks \(restart 1 of 1\)$' "node $r restarts"
done

# The dtrun of node 1 is killed: node 0 ends, naming the lost node.
port=$(free_port)
node 1 sh -c 'echo up; exec sleep 30' "$tok"; p1=$!
node 0 --heartbeat-timeout 5 sh -c 'echo up; exec sleep 30' "$tok"; p0=$!
wait_up "$tmp/out0" "$tmp/out1"
ok $? "four ranks up"
kill_node1 $p0 $p1
test $rc0 -eq 1
ok $? "a lost node: exit 1 (got $rc0)"
sleep 0.3
! pgrep -f "$tok" > /dev/null
ok $? "no rank of either node left"
cleanup

# The dtrun of node 0 is killed: node 1 ends, naming node 0.
port=$(free_port)
node 1 sh -c 'echo up; exec sleep 30' "$tok"; p1=$!
node 0 sh -c 'echo up; exec sleep 30' "$tok"; p0=$!
wait_up "$tmp/out0" "$tmp/out1"
kill -KILL $p0
wait_for $p1 15; rc1=$?
test $rc1 -eq 1
ok $? "node 0 killed: node 1 exits 1 (got $rc1)"
ok_grep "$tmp/err1" "^dtrun: lost node 0 \(.*, the master at 127\.0\.0\.1:$port\) at .* UTC: its connection closed" "node 1 names node 0, its address and port"
wait $p0 2>/dev/null
sleep 0.3
! pgrep -f "$tok" > /dev/null
ok $? "no rank of either node left"
cleanup

# SIGINT to node 1's dtrun ends the job on both nodes, without restart.
port=$(free_port)
node 1 --max-restarts 3 sh -c 'echo up; exec sleep 30' "$tok"; p1=$!
node 0 --max-restarts 3 sh -c 'echo up; exec sleep 30' "$tok"; p0=$!
wait_up "$tmp/out0" "$tmp/out1"
kill -INT $p1
wait_for $p0 15; rc0=$?
wait_for $p1 15; rc1=$?
test $rc0 -eq 130 && test $rc1 -eq 130
ok $? "SIGINT to node 1: both exit 130 (got $rc0, $rc1)"
ok_grep "$tmp/err0" '^dtrun: dtrun on node 1 \(.*\) was stopped by SIGINT' "node 0 says node 1 was stopped by SIGINT"
! grep -q restarting "$tmp/err0" "$tmp/err1"
ok $? "no restart after a signal"
cleanup

# Nodes that disagree are refused, naming both; node 0 keeps waiting for the right one.
port=$(free_port)
node 0 --rdzv-timeout 8 sh -c 'echo up; sleep 2' "$tok"; p0=$!
refused() {
    want=$1; what=$2; shift 2
    timeout 20 "$DTRUN" --master-port "$port" "$@" true > "$tmp/o" 2> "$tmp/e"
    rc=$?
    test $rc -eq 2 && grep -Eq -- "$want" "$tmp/e"
    ok $? "$what: refused with exit 2 (got $rc)"
    [ $rc -eq 2 ] || sed 's/^/#   /' "$tmp/e"
}
refused '^dtrun: refused by node 0 at .*: the nodes disagree about --nnodes: node 1 \(.*\) says 3, node 0 \(.*\) says 2' \
    "--nnodes 3 against 2" -n 2 --nnodes 3 --node-rank 1
refused '^dtrun: refused by node 0 at .*: the nodes disagree about --nproc-per-node: node 1 \(.*\) says 3, node 0 \(.*\) says 2' \
    "-n 3 against 2" -n 3 --nnodes 2 --node-rank 1
node 1 sh -c 'echo up; sleep 2' "$tok"; p1=$!
i=0; while ! grep -q 'ranks 2\.\.3' "$tmp/err1" 2>/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
refused '^dtrun: refused by node 0 at .*: node rank 1 given twice: .* at 127\.0\.0\.1 \(joined first\) and .* at 127\.0\.0\.1' \
    "node rank 1 twice" -n 2 --nnodes 2 --node-rank 1
wait_for $p0 20; rc0=$?
wait_for $p1 20; rc1=$?
test $rc0 -eq 0 && test $rc1 -eq 0
ok $? "the job itself ran after refusing the others (got $rc0, $rc1)"
ok_grep "$tmp/err0" "^dtrun: refused a node: the nodes disagree about --nnodes" "node 0 says whom it refused"

# A node that cannot reach node 0 says so, with host, port and why, until its timeout.
port=$(free_port)
start=$(date +%s)
timeout 20 "$DTRUN" -n 1 --nnodes 2 --node-rank 1 --master-port "$port" --rdzv-timeout 2 true > "$tmp/o" 2> "$tmp/e"
rc=$?
el=$(( $(date +%s) - start ))
test $rc -eq 1 && test $el -ge 2 && test $el -le 6
ok $? "no master: gives up after --rdzv-timeout 2 with exit 1 (got $rc after ${el}s)"
ok_grep "$tmp/e" "^dtrun: node 1 cannot reach node 0 at 127\.0\.0\.1:$port: Connection refused; retrying" "it says why while retrying"
ok_grep "$tmp/e" "^dtrun: node 1 could not reach node 0 at 127\.0\.0\.1:$port within 2 s \(--rdzv-timeout\): Connection refused" "and when it gives up"

# node 0 alone: times out naming the nodes that never came
timeout 20 "$DTRUN" -n 1 --nnodes 3 --master-port "$port" --rdzv-timeout 1 true > "$tmp/o" 2> "$tmp/e"
rc=$?
test $rc -eq 1
ok $? "node 0 without the others: exit 1 (got $rc)"
ok_grep "$tmp/e" "^dtrun: the rendezvous timed out after 1 s \(--rdzv-timeout\): nodes 1,2 never joined" "names the missing nodes"

# A taken port: one clear line.
# the holder writes $tmp/held once it listens; wait for that (at most 20 s), not a fixed time
python3 -c 'import socket,sys,time; s=socket.socket(); s.bind(("0.0.0.0",int(sys.argv[1]))); s.listen(1); open(sys.argv[2],"w").close(); time.sleep(60)' "$port" "$tmp/held" &
hold=$!
i=0; while [ ! -e "$tmp/held" ] && [ $i -lt 200 ]; do sleep 0.1; i=$((i + 1)); done
timeout 10 "$DTRUN" -n 1 --nnodes 2 --master-port "$port" true > "$tmp/o" 2> "$tmp/e"
rc=$?
test $rc -eq 1
ok $? "node 0 on a taken port: exit 1 (got $rc)"
ok_grep "$tmp/e" "^dtrun: node 0 cannot serve the rendezvous on 127\.0\.0\.1:$port \(--master-port\): .*Address already in use" "says the port is taken"
timeout 10 "$DTRUN" -n 2 --master-port "$port" true > "$tmp/o" 2> "$tmp/e"
rc=$?
test $rc -eq 1 && test "$(wc -l < "$tmp/e")" -eq 1
ok $? "one node, taken --master-port: exit 1 and one line (got $rc)"
ok_grep "$tmp/e" "^dtrun: --master-port $port cannot be used on this host: Address already in use" "says the port is taken"
kill $hold 2>/dev/null
wait $hold 2>/dev/null

done_testing
