#!/bin/sh
# launch_netns.sh: two nodes on one machine. Two network namespaces joined by a veth pair
# (10.231.0.1/24 and 10.231.0.2/24, addresses that exist only inside these namespaces),
# one dtrun in each with --nnodes 2, a shared DT_JOB_SECRET and DT_SOCKET_IFNAME naming its
# veth (without a secret, or with two, the job is refused): collectives
# (dtbench, also sealed with --secure-transport) and a short training run across them; then one node's dtrun is killed, and
# then the link is cut, and the other node must end naming the lost node in time; last,
# three nodes on a bridge, node 0 cut off: the majority goes on without it.
# Needs root and iproute2's `ip netns`; skips saying why otherwise.
. "$DT_SRCDIR/tests/tap.sh"
. "$DT_SRCDIR/tests/dtrun_lib.sh"
DTRUN="$DT_BUILDDIR/dtrun"
[ "$(id -u)" -eq 0 ] || skip_all "needs root to create network namespaces"
command -v ip > /dev/null || skip_all "needs ip (iproute2)"
[ -x "$DT_BUILDDIR/dtbench" ] || skip_all "dtbench is not built"

nsa="dtna$$"; nsb="dtnb$$"       # unique per run: another run may be going on at once
va="dtva$$"; vb="dtvb$$"         # interface names stay under 16 characters
ipa=10.231.0.1; ipb=10.231.0.2
tmp=$(mktemp -d) || exit 1
cleanup() {
    for ns in "$nsa" "$nsb"; do
        pids=$(ip netns pids "$ns" 2>/dev/null)
        [ -z "$pids" ] || kill -KILL $pids 2>/dev/null
    done
    ip netns del "$nsa" 2>/dev/null
    ip netns del "$nsb" 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT

setup_link() {
    ip link add "$va" type veth peer name "$vb" &&
    ip link set "$va" netns "$nsa" && ip link set "$vb" netns "$nsb" &&
    ip -n "$nsa" addr add "$ipa/24" dev "$va" && ip -n "$nsb" addr add "$ipb/24" dev "$vb" &&
    ip -n "$nsa" link set "$va" up && ip -n "$nsb" link set "$vb" up
}
{ ip netns add "$nsa" && ip netns add "$nsb" && ip -n "$nsa" link set lo up && ip -n "$nsb" link set lo up &&
  setup_link; } > "$tmp/setup" 2>&1 || skip_all "cannot create the namespaces and veth pair: $(head -1 "$tmp/setup")"

port=29500   # each namespace has its own ports: no clash with anything outside
uts="unshare --uts"
unshare --uts true 2>/dev/null || skip_all "cannot create a UTS namespace (unshare --uts)"
# node R ARGS...: start node R's dtrun in its namespace, in the background; $! is its pid
node() {
    r=$1; shift
    if [ "$r" = 0 ]; then ns=$nsa; v=$va; else ns=$nsb; v=$vb; fi
    rm -f "$tmp/out$r" "$tmp/err$r"   # waits below look for what this run writes
    # its own UTS namespace too, so each node has its own host name as real nodes do
    # (ranks on one host exchange through shared memory; across hosts, over the veth)
    (DT_JOB_SECRET=$secret DT_SOCKET_IFNAME=$v DT_TIMEOUT=30 exec ip netns exec "$ns" $uts sh -c 'h=$1; shift; hostname "$h"; exec "$@"' \
        sh "dtnode$r" "$DTRUN" -n 2 --nnodes 2 --node-rank "$r" \
        --master-addr "$ipa" --master-port "$port" "$@" > "$tmp/out$r" 2> "$tmp/err$r") &
}

# no_pids SECONDS: wait (at most that long) until neither namespace has a process left
no_pids() {
    np_i=0
    while { [ -n "$(ip netns pids "$nsa")" ] || [ -n "$(ip netns pids "$nsb")" ]; } && [ $np_i -lt $(($1 * 10)) ]; do
        sleep 0.1; np_i=$((np_i + 1))
    done
    test -z "$(ip netns pids "$nsa")" && test -z "$(ip netns pids "$nsb")"
}

# 0. across hosts, a job without a secret is refused, saying how to set one; nodes with
# different secrets do not join
secret=
node 0 true
wait_for $! 20; rc=$?
test $rc -eq 2; ok $? "a multi-node job without a job secret is refused (exit $rc)"
ok_grep "$tmp/err0" "needs a job secret: set DT_JOB_SECRET" "the error says how to set one"
secret=one-secret; node 0 --rdzv-timeout 3 true; p0=$!
secret=another-secret; node 1 --rdzv-timeout 3 true; p1=$!
wait_for $p0 20; rc0=$?; wait_for $p1 20; rc1=$?
test $rc0 -ne 0 && test $rc1 -ne 0; ok $? "nodes with different secrets do not form a job (exit $rc0, $rc1)"
ok_grep "$tmp/err1" "refused: authentication: the server does not prove this job's secret" "the node says the secret differs"
secret="shared-$$-secret"

# 1. collectives across the namespaces
both_nodes 60 "$DT_BUILDDIR/dtbench" -b 4K -e 64K -n 5 -w 1
both_ok "dtbench all_reduce, 2 namespaces x 2 ranks: both nodes exit 0"
ok_grep "$tmp/out0" '^\[rank0\]:# dtbench: all_reduce, backend tcp, 4 ranks' "rank 0 reports a 4-rank job"
ok_grep "$tmp/out0" '^\[rank0\]: +65536 .* 0$' "64 KiB all_reduce across the veth, no wrong element"
ok_grep "$tmp/err1" "^dtrun: node 1 of 2 \(.*\): ranks 2\.\.3 of 4" "node 1 learned the layout"

both_nodes 60 "$DT_BUILDDIR/dtbench" -o all_gather -b 4K -e 16K -n 3 -w 1
both_ok "dtbench all_gather across the namespaces"

# the same sealed (--secure-transport, given to each node's dtrun): the records cross the veth
both_nodes 60 --secure-transport encrypt "$DT_BUILDDIR/dtbench" -b 4K -e 1M -f 16 -n 3 -w 1
both_ok "dtbench all_reduce sealed (encrypt) across the namespaces"
ok_grep "$tmp/out0" '^\[rank0\]:# dtbench: all_reduce, backend tcp \(sealed: encrypt \(' "rank 0 says the traffic is sealed"
ok_grep "$tmp/out0" '^\[rank0\]: +1048576 .* 0$' "1 MiB all_reduce sealed across the veth, no wrong element"

# 2. a short training run across the namespaces
if [ -x "$DT_BUILDDIR/dtrain" ]; then
    cat > "$tmp/train.sh" <<EOF
exec "$DT_BUILDDIR/dtrain" train --data synthetic:1024,1,8,8,4 --model "flatten linear(16) relu linear(4)" --epochs 1 --batch 64
EOF
    both_nodes 90 sh "$tmp/train.sh"
    both_ok "dtrain train over 2 nodes exits 0"
    ok_grep "$tmp/out0" '^\[rank0\]:dtrain: done: ' "rank 0 finished training"
else
    skip "dtrain is not built"; skip "dtrain is not built"
fi

# 3. node 1's dtrun is killed: node 0 ends within 10 s, naming node 1
node 1 "$DT_BUILDDIR/dtbench" -b 4K -e 4K -n 1000000 -w 1; p1=$!
node 0 --heartbeat-timeout 5 "$DT_BUILDDIR/dtbench" -b 4K -e 4K -n 1000000 -w 1; p0=$!
# the ranks are in their collectives once rank 0 has printed its header (after the
# connections, before the loop)
wait_line "$tmp/out0" '^\[rank0\]:# dtbench:' 30 || echo "# rank 0 never printed its header"
kill_node1 $p0 $p1
no_pids 10
ok $? "no process left in either namespace"

# 4. the link is cut: both nodes notice within the heartbeat timeout and end, naming the other
node 1 --heartbeat-timeout 3 --monitor-interval 0.5 "$DT_BUILDDIR/dtbench" -b 4K -e 4K -n 1000000 -w 1; p1=$!
node 0 --heartbeat-timeout 3 --monitor-interval 0.5 "$DT_BUILDDIR/dtbench" -b 4K -e 4K -n 1000000 -w 1; p0=$!
wait_line "$tmp/out0" '^\[rank0\]:# dtbench:' 30 || echo "# rank 0 never printed its header"
ip -n "$nsa" link del "$va"      # deletes the pair: the nodes can no longer reach each other
start=$(date +%s)
wait_for $p0 30; rc0=$?
wait_for $p1 30; rc1=$?
el=$(( $(date +%s) - start ))
test $rc0 -ne 0 && test $rc1 -ne 0 && test $el -le 15
ok $? "link cut: both nodes end with an error within 15 s (exit $rc0, $rc1 after ${el}s)"
ok_grep "$tmp/err0" "node 1 \(.*\) was lost at .* UTC: no heartbeat for 3 s" "node 0 names node 1 as lost"
ok_grep "$tmp/err1" "lost node 0 \(.*, the master at $ipa:$port\) at .* UTC: no heartbeat for 3 s" "node 1 names node 0 as lost"
no_pids 10
ok $? "no process left in either namespace"

# 5. an elastic job (--nnodes 1:2) loses node 1 to a link cut (down on node 1's side) during a 4-rank attempt: node
# 0 notices by the heartbeats, kills its ranks, and finishes on its own 2 ranks from the
# snapshot the nodes kept in memory, with the weights of one process
if [ -x "$DT_BUILDDIR/dtrain" ]; then
    setup_link > "$tmp/setup" 2>&1
    ok $? "the link is made again"
    echo "flatten linear(64) relu linear(4)" > "$tmp/model"
    el="train --data synthetic:1024,1,8,8,4 --model @$tmp/model --batch 32 --micro-batches 4 --epochs 1000 --steps 6000 --no-eval --threads 1 --quiet"
    "$DT_BUILDDIR/dtrain" $el --save "$tmp/ref.st" > "$tmp/ref.out" 2>&1
    ok $? "one process: the reference run"
    ck="$tmp/ck"
    # the optimizer state sharded, a snapshot in each node's memory every 20 steps: node 1's
    # shards reach node 0 over the veth as the partner copies
    node 0 --nnodes 1:2 --heartbeat-timeout 3 --monitor-interval 0.5 --grace 5 --rdzv-last-call 5 "$DT_BUILDDIR/dtrain" $el \
        --checkpoint-dir "$ck" --checkpoint-every 200 --shard optim --snapshot-every 20 --resume auto \
        --save "$tmp/el.st"; p0=$!
    node 1 --nnodes 1:2 --heartbeat-timeout 3 --monitor-interval 0.5 --grace 5 "$DT_BUILDDIR/dtrain" $el \
        --checkpoint-dir "$ck" --checkpoint-every 200 --shard optim --snapshot-every 20 --resume auto; p1=$!
    wait_line "$tmp/err1" "^dtrun: node 1 \(.*\), attempt 0: ranks 2\.\.3 of 4$" 60
    ok $? "2 nodes x 2 ranks: node 1 runs ranks 2..3 of 4"
    i=0; while ! ls "$ck" 2>/dev/null | grep -q '^step-' && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
    ip -n "$nsb" link set "$vb" down   # node 1's side only: node 0 keeps its interface
    wait_pid $p0 240; rc0=$?
    wait_pid $p1 60; rc1=$?
    test "$rc0" -eq 0 && test "$rc1" -ne 0
    ok $? "link cut: node 0 finishes alone (exit $rc0), node 1 ends, having lost node 0 (exit $rc1)"
    [ "$rc0" -eq 0 ] || sed 's/^/#   /' "$tmp/err0" | tail -12
    ok_grep "$tmp/err0" "^dtrun: node 1 \(.*\) lost at .* UTC: no heartbeat for 3 s \(--heartbeat-timeout\); stopping the attempt$" \
        "node 0 names node 1 as lost by its heartbeats"
    ok_grep "$tmp/err0" "^dtrun: membership: node 1 \(.*\) lost: no heartbeat for 3 s \(--heartbeat-timeout\); world 4 -> 2 ranks on 1 node; " \
        "node 0 goes on with 2 ranks"
    ok_grep "$tmp/out0" "^\[rank0\]:dtrain: resumed from the nodes' in-memory snapshot of step [0-9]+;" \
        "node 0 resumes from memory: its own shards and node 1's copies"
    cmp -s "$tmp/ref.st" "$tmp/el.st"; ok $? "4 ranks on 2 nodes, then 2 on one: the weights of one process, byte for byte"
else
    for i in 1 2 3 4 5 6 7; do skip "dtrain is not built"; done
fi

# 6. three nodes on a bridge (10.231.1.1-3, each its own namespace; the bridge in a fourth),
# an elastic job of 2 ranks a node (--micro-batches 4: nodes 0 and 1 run 4 ranks, node 2
# waits). Node 0's link is cut: it is alone, 1 of 3, and stops; nodes 1 and 2 are 2 of 3:
# node 1, the first of node 0's list left, serves the rendezvous on its own address, node 2
# reaches it there, and the two go on from the snapshot in memory to the weights of one
# process. Both sides of the cut see the other lost; only the majority's side goes on.
if [ -x "$DT_BUILDDIR/dtrain" ]; then
    nsr="dtnr$$"; ns3="dtn0$$ dtn1$$ dtn2$$"
    cleanup3() {
        for ns in $ns3 $nsr; do
            pids=$(ip netns pids "$ns" 2>/dev/null)
            [ -z "$pids" ] || kill -KILL $pids 2>/dev/null
            ip netns del "$ns" 2>/dev/null
        done
    }
    trap 'cleanup3; cleanup' EXIT
    { ip netns add "$nsr" && ip -n "$nsr" link add dtbr type bridge && ip -n "$nsr" link set dtbr up &&
      for i in 0 1 2; do
          ns="dtn$i$$"
          ip netns add "$ns" && ip -n "$ns" link set lo up &&
          ip link add "dtc$i$$" type veth peer name "dtd$i$$" &&
          ip link set "dtc$i$$" netns "$ns" && ip link set "dtd$i$$" netns "$nsr" &&
          ip -n "$nsr" link set "dtd$i$$" master dtbr && ip -n "$nsr" link set "dtd$i$$" up &&
          ip -n "$ns" addr add "10.231.1.$((i + 1))/24" dev "dtc$i$$" && ip -n "$ns" link set "dtc$i$$" up || exit 1
      done; } > "$tmp/setup3" 2>&1
    ok $? "three namespaces on a bridge$( [ -s "$tmp/setup3" ] && echo ": $(head -1 "$tmp/setup3")")"
    ck3="$tmp/ck3"
    # node3 R: node R of the three, in the background ($! its dtrun)
    node3() {
        r=$1
        : > "$tmp/t$r.out"; : > "$tmp/t$r.err"
        (DT_JOB_SECRET=three-node-secret DT_SOCKET_IFNAME="dtc$r$$" DT_TIMEOUT=30 exec ip netns exec "dtn$r$$" $uts \
            sh -c 'h=$1; shift; hostname "$h"; exec "$@"' sh "dtnode$r" "$DTRUN" -n 2 --nnodes 2:3 --node-rank "$r" \
            --master-addr 10.231.1.1 --master-port "$port" --heartbeat-timeout 3 --monitor-interval 0.5 --grace 5 \
            --rdzv-last-call 0.3 "$DT_BUILDDIR/dtrain" $el --checkpoint-dir "$ck3" --checkpoint-every 1000000 \
            --shard optim --snapshot-every 20 --resume auto --save "$tmp/t.st" > "$tmp/t$r.out" 2> "$tmp/t$r.err") &
    }
    node3 0; t0=$!
    node3 1; t1=$!
    wait_line "$tmp/t1.err" "^dtrun: node 1 \(.*\), attempt 0: ranks 2\.\.3 of 4$" 60
    ok $? "nodes 0 and 1 run 4 ranks"
    node3 2; t2=$!
    wait_line "$tmp/t2.err" "^dtrun: node 2 \(.*\), attempt 0: a spare \(the job runs 4 ranks\)$" 60
    ok $? "node 2 joins as a spare"
    # a snapshot of step 100 or later on node 1 (its dtrun's directory in /dev/shm)
    i=0; while [ $i -lt 600 ]; do
        s1=$(ls -d /dev/shm/dtrain-"$t1"-*-snap 2>/dev/null | head -1)
        [ -n "$s1" ] && ls "$s1" | grep -q '^step-0*[1-9][0-9][0-9]$' && break
        sleep 0.1; i=$((i + 1))
    done
    [ $i -lt 600 ]; ok $? "node 1 holds a snapshot of step 100 or later in memory"
    ip -n "dtn0$$" link set "dtc0$$" down   # node 0 alone on its side of the cut
    wait_pid $t0 60; rc0=$?
    wait_pid $t1 240; rc1=$?
    wait_pid $t2 60; rc2=$?
    test "$rc0" -eq 1 && test "$rc1" -eq 0 && test "$rc2" -eq 0
    ok $? "node 0 cut off: it stops (exit $rc0), nodes 1 and 2 finish (exit $rc1, $rc2)"
    [ "$rc1" -eq 0 ] || for r in 0 1 2; do diag "node $r:"; sed 's/^/#   /' "$tmp/t$r.err" | tail -8; done
    ok_grep "$tmp/t0.err" "^dtrun: node 0 \(dtnode0\), serving the rendezvous, kept 1 of the 3 nodes of the last membership, fewer than half: it stops" \
        "node 0 says it kept 1 of 3 nodes"
    ok_grep "$tmp/t1.err" "^dtrun: node 1 \(dtnode1\) serves the rendezvous now on 10\.231\.1\.2:[0-9]+; " \
        "node 1 serves the rendezvous on its own address"
    ok_grep "$tmp/t2.err" "^dtrun: node 2: node 1 at 10\.231\.1\.2:[0-9]+ serves the rendezvous now$" "node 2 reaches it there"
    ok_grep "$tmp/t1.err" "^dtrun: membership: node 0 \(dtnode0\) lost: no heartbeat for 3 s \(--heartbeat-timeout\); world 4 -> 4 ranks on 2 nodes; " \
        "the world stays at 4 ranks, on nodes 1 and 2"
    ok_grep "$tmp/t1.out" "^\[rank0\]:dtrain: resumed from the nodes' in-memory snapshot of step [0-9]+ \([0-9]+ files? copied between nodes, " \
        "rank 0, now on node 1, resumes from memory, node 2 sent what it lacked"
    cmp -s "$tmp/ref.st" "$tmp/t.st"; ok $? "node 0 cut off, the majority on: the weights of one process, byte for byte"
else
    for i in 1 2 3 4 5 6 7 8 9 10 11; do skip "dtrain is not built"; done
fi
done_testing
