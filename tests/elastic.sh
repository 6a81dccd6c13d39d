#!/bin/sh
# elastic.sh: dtrun --nnodes MIN:MAX, several dtruns on one host (127.0.0.1) as the nodes
# of one job. A node joins a running job and the world grows; a node is lost (its dtrun
# and ranks SIGKILLed, at a step drawn by the test) and the job goes on with fewer ranks;
# a spare takes a lost node's place; too few nodes end the job naming the lost node and
# the newest checkpoint. Every run that finishes ends with the weights of one process,
# byte for byte (pipelines too: 2 stages, and 2 stages of 2 chunks from in-memory
# snapshots). Then the refusals: MIN > MAX, one node only, a size that can never be
# exact, a program that does not say its sizes, dtrain without --micro-batches, MIN not
# reached, a node with another secret, mpirun. All of it beside two busy loops (the
# machine under load; DT_ELASTIC_BUSY=0 leaves them out); DT_ELASTIC_TRIALS=N repeats the
# join-and-loss at N drawn steps (default 1). Loopback only; every wait is bounded and
# waits for the event it checks (a line, a checkpoint), never for a fixed time.
. "${DT_SRCDIR:-$(dirname "$0")/..}/tests/tap.sh"
DTRUN="$DT_BUILDDIR/dtrun"
D="$DT_BUILDDIR/dtrain"
[ -x "$DTRUN" ] && [ -x "$D" ] || skip_all "dtrun and dtrain are not built"
T=$(mktemp -d) || exit 1
tok="dtelastic$$"
cleanup() { pids=$(pgrep -f "$tok"); [ -z "$pids" ] || kill -KILL $pids 2>/dev/null; }
trap 'cleanup; rm -rf "$T"' EXIT
# every process of a job carries $tok in its command line (the checkpoint directory)
mkdir -p "$T/$tok"
if [ "${DT_ELASTIC_BUSY:-1}" != 0 ]; then
    for i in 1 2; do timeout 900 sh -c 'while :; do :; done' "$tok" & done
fi
export DT_JOB_SECRET=elastic-test-secret-0123456789abcdef
STEPS=12000
echo "flatten linear(128) relu linear(64) relu linear(64) relu linear(4)" > "$T/model"   # 4 modules: 2 x 2 chunks
DATA=synthetic:2048,1,16,16,4
TRAIN="train --data $DATA --model @$T/model --batch 32 --micro-batches 4 --epochs 200 --steps $STEPS --no-eval --log-every 100 --threads 1 --quiet"

# The newest complete checkpoint's step in directory $1 (0 if none).
newest() { n=$(ls "$1" 2>/dev/null | sed -n 's/^step-0*\([0-9][0-9]*\)$/\1/p' | sort -n | tail -1); echo "${n:-0}"; }
# Wait (at most 60 s) until directory $1 holds a checkpoint of a step >= $2.
wait_ckpt() {
    i=0
    while [ "$(newest "$1")" -lt "$2" ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
    [ "$(newest "$1")" -ge "$2" ]
}
# node NAME R SPEC ARGS...: node R's dtrun (-n 1, --nnodes SPEC) of the job whose
# checkpoints go to $T/$tok/NAME, in the background ($! is dtrun's pid); output in
# $T/NAME.outR and $T/NAME.errR; ARGS go to dtrun before the program; a checkpoint every
# $EVERY steps (default 200)
node() {
    nm=$1; r=$2; spec=$3; shift 3
    : > "$T/$nm.out$r"; : > "$T/$nm.err$r"   # now: a wait must not read the last run's lines
    (exec "$DTRUN" -n "${NPROC:-1}" --nnodes "$spec" --node-rank "$r" --master-port "$port" --heartbeat-timeout 5 --grace 20 \
        --rdzv-last-call 0.3 "$@" "$D" $TRAIN --checkpoint-dir "$T/$tok/$nm" --checkpoint-every "${EVERY:-200}" --resume auto \
        --metrics "$T/$nm.m.jsonl" --save "$T/$nm.st" > "$T/$nm.out$r" 2> "$T/$nm.err$r") &
}
# memnode NAME R ARGS...: node R of 2 (2 ranks each) of a job with no checkpoint
# directory (its state in the nodes' memory), in the background ($! is dtrun's pid);
# metrics in $T/$tok/NAME.m.jsonl (node 0) or NAMER.m.jsonl, output in $T/NAME.outR and
# $T/NAME.errR; ARGS go to the program
memnode() {
    nm=$1; r=$2; shift 2
    mf="$T/$tok/$nm.m.jsonl"; [ "$r" -gt 0 ] && mf="$T/$tok/$nm$r.m.jsonl"
    (exec "$DTRUN" -n 2 --nnodes 1:2 --node-rank "$r" --master-port "$port" --heartbeat-timeout 5 --grace 20 \
        --rdzv-last-call 0.3 "$D" $TRAIN --resume auto --metrics "$mf" "$@" > "$T/$nm.out$r" 2> "$T/$nm.err$r") &
}
# Wait (at most 60 s) until file $1 holds at least $3 lines matching $2.
wait_count() {
    i=0
    while [ "$(grep -Ec -- "$2" "$1" 2>/dev/null)" -lt "$3" ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
    [ "$(grep -Ec -- "$2" "$1")" -ge "$3" ]
}
show() { for f in "$@"; do diag "$f:"; sed 's/^/#   /' "$f" | tail -12; done; }
# The memory directory of the dtrun whose pid is $1 (its in-memory snapshots).
snapdir() { ls -d /dev/shm/dtrain-"$1"-*-snap 2>/dev/null | head -1; }
# A step drawn after the last change to a world of $2 ranks in metrics file $1: its first
# step + $3 + a random part below $4.
draw_step() {
    j=$(sed -n "s/.*\"event\":\"membership\",\"step\":\([0-9]*\),.*\"world_size\":$2.*/\1/p" "$1" | tail -1)
    echo $(( ${j:-0} + $3 + $(od -An -N2 -tu2 /dev/urandom | tr -d ' ') % $4 ))
}
# lose_at METRICS W MIN SPAN DIR KILLED WAITED WHAT: once DIR holds a saved state of a step
# drawn after the last change to W ranks in METRICS (draw_step MIN SPAN: $k), SIGKILL dtrun
# KILLED, note the newest state in DIR ($kept) and wait (at most 240 s) for dtrun WAITED
# ($rc0); two points, WHAT naming the case
lose_at() {
    k=$(draw_step "$1" "$2" "$3" "$4")
    wait_ckpt "$5" "$k"
    ok $? "$8: a state saved at or after step $k (drawn)"
    kill -KILL "$6"
    kept=$(newest "$5")
    wait_pid "$7" 240; rc0=$?
    wait "$6" 2>/dev/null
    [ "$rc0" -eq 0 ]; ok $? "$8: killed near step $k, the job finishes on the nodes left (exit $rc0)"
}

# the run nobody interrupts: one process, the same global batch and micro-batches
"$D" $TRAIN --save "$T/ref.st" > "$T/ref.out" 2>&1
ok $? "one process, $STEPS steps (the reference)"

# ---- a node joins, then a node is lost (at a step drawn here, DT_ELASTIC_TRIALS times) ---
trials=${DT_ELASTIC_TRIALS:-1}
for trial in $(seq "$trials"); do
    rm -rf "$T/$tok/grow" "$T/grow.m.jsonl"
    port=$(free_port)
    node grow 0 1:2; p0=$!
    wait_ckpt "$T/$tok/grow" 200
    ok $? "node 0 runs alone (world 1) and checkpoints"
    node grow 1 1:2; p1=$!
    wait_line "$T/grow.err0" "^dtrun: membership: node 1 \(.*\) joined; world 1 -> 2 ranks on 2 nodes; " 60
    ok $? "node 1 joins: node 0 says the world grows from 1 to 2 ranks"
    ok_grep "$T/grow.err0" "^dtrun: the world can grow from 1 to 2 ranks: asking the ranks to checkpoint and stop$" \
        "the ranks are asked to checkpoint first"
    ok_grep "$T/grow.out0" "^\[rank0\]:dtrain: stopped at step [0-9]+ on SIGTERM, checkpointed in " \
        "rank 0 checkpoints the step it stopped at: nothing is lost by a join"
    wait_line "$T/grow.err1" "^dtrun: node 1 \(.*\), attempt 1: ranks 1\.\.1 of 2$" 60
    ok $? "node 1 runs rank 1 of 2"
    wait_line "$T/grow.m.jsonl" '"event":"membership".*"world_size":2' 60
    ok $? "the metrics file records the change at the first step on 2 ranks"
    # the loss: node 1's dtrun (and with it its rank) SIGKILLed once a checkpoint at a step
    # drawn here exists
    lose_at "$T/grow.m.jsonl" 2 200 2000 "$T/$tok/grow" $p1 $p0 "node 1 of 2 ranks"
    lost_at=$kept
    [ "$rc0" -eq 0 ] || show "$T/grow.err0" "$T/grow.out0"
    ok_grep "$T/grow.err0" "^dtrun: node 1 \(.*\) lost at .* UTC: its connection closed; stopping the attempt$" \
        "node 0 names the lost node"
    ok_grep "$T/grow.err0" "^dtrun: membership: node 1 \(.*\) lost: its connection closed; world 2 -> 1 rank on 1 node; resumes after step [0-9]+; " \
        "node 0 says the world shrinks from 2 ranks to 1, and from which step"
    said=$(sed -n 's/^dtrun: membership: node 1 .* lost: .*; resumes after step \([0-9]*\); .*/\1/p' "$T/grow.err0" | tail -1)
    r=$(sed -n 's/.*"event":"membership","step":[0-9]*,"resumed_after":\([0-9]*\),"world_size":1.*/\1/p' "$T/grow.m.jsonl")
    [ -n "$r" ] && [ "$r" -ge "$lost_at" ] && [ "$r" -lt $((lost_at + 200)) ]
    ok $? "the job resumed from the checkpoint it had when node 1 died (step ${r:-none}, newest then $lost_at): at most 200 steps (--checkpoint-every) lost"
    [ -n "$r" ] && [ "$said" = "$r" ]; ok $? "dtrun named the step dtrain resumed after (${said:-none} and ${r:-none})"
    ok_grep "$T/grow.out0" "^\[rank0\]:dtrain: membership changed \(node 1 \(.*\) lost: its connection closed\): world 1, resumed after step [0-9]+, its first step done [0-9.]+ s after the change$" \
        "rank 0 says the change, the step it resumed after and how long it took"
    cmp -s "$T/ref.st" "$T/grow.st"; ok $? "grown to 2 ranks and shrunk to 1: the same weight bytes as one process"
    grep -q '"event":"start".*"membership":"node 1' "$T/grow.m.jsonl"; ok $? "the metrics' start lines carry the change"
done
"$D" report "$T/grow.m.jsonl" -o "$T/grow.html" > "$T/rep.out" 2>&1
ok $? "dtrain report reads the elastic job's metrics"
n=$(grep -c '<line class="membership" data-step=' "$T/grow.html")
[ "$n" -ge 2 ]; ok $? "its charts mark both membership changes ($n marks)"
ok_grep "$T/grow.html" '<title>[^<]*: resumed after step [0-9]+ on a membership change: node 1 \(.*\) lost: its connection closed</title>' \
    "a mark says the change"
ok_grep "$T/grow.html" 'membership change: nodes left or joined .dotted.' "the legend says what the marks are"
! grep -q 'skipped' "$T/rep.out"; ok $? "no metrics line skipped"

# ---- a node that flaps: joins and is lost three times, its state sharded ---------------
# (--shard grads: each change resumes a sharded checkpoint on another world size)
TRAIN_SAVE=$TRAIN; TRAIN="$TRAIN --shard grads"
port=$(free_port)
node flap 0 1:2; f0=$!
wait_ckpt "$T/$tok/flap" 200
flaps=0
for n in 1 2 3; do
    node flap 1 1:2; f1=$!
    wait_line "$T/flap.err1" "^dtrun: node 1 \(.*\), attempt [0-9]+: ranks 1\.\.1 of 2$" 60 || break
    # its first step on 2 ranks done (the n-th membership event of the metrics), it is killed
    wait_count "$T/flap.m.jsonl" '"event":"membership".*"world_size":2' $n || break
    kill -KILL $f1
    wait $f1 2>/dev/null
    wait_count "$T/flap.err0" "^dtrun: membership: node 1 \(.*\) lost: .*; world 2 -> 1 rank on 1 node; " $n || break
    [ "$(grep -c 'world 2 -> 1 rank' "$T/flap.err0")" -eq $n ] || break
    flaps=$n
done
[ $flaps -eq 3 ]; ok $? "node 1 joined and was lost 3 times, each seen by node 0 ($flaps)"
[ $flaps -eq 3 ] || show "$T/flap.err0" "$T/flap.err1" "$T/flap.out0"
wait_pid $f0 240; rc0=$?
[ "$rc0" -eq 0 ]; ok $? "node 0 finishes (exit $rc0)"
[ "$rc0" -eq 0 ] || show "$T/flap.err0"
cmp -s "$T/ref.st" "$T/flap.st"; ok $? "after 3 flaps, sharded: the same weight bytes as one process"
TRAIN=$TRAIN_SAVE

# ---- pipelines: 2 stages a replica, nodes of 2 ranks (worlds 2 and 4) -------------------
TRAIN_SAVE=$TRAIN; TRAIN="$TRAIN --pipeline 2"
port=$(free_port)
NPROC=2 node pipe 0 1:2; g0=$!
wait_ckpt "$T/$tok/pipe" 200
ok $? "node 0 runs one 2-stage pipeline"
ok_grep "$T/pipe.err0" "world sizes that keep the result exact: 2 and 4$" "the exact sizes are whole pipelines (2 and 4)"
NPROC=2 node pipe 1 1:2; g1=$!
wait_line "$T/pipe.err1" "^dtrun: node 1 \(.*\), attempt 1: ranks 2\.\.3 of 4$" 60
ok $? "node 1 joins: 2 replicas of the pipeline on 4 ranks"
at=$(newest "$T/$tok/pipe")
wait_ckpt "$T/$tok/pipe" $((at + 200))
kill -KILL $g1
wait $g1 2>/dev/null
wait_pid $g0 240; rc0=$?
[ "$rc0" -eq 0 ]; ok $? "node 1 lost: node 0 finishes on one pipeline again (exit $rc0)"
[ "$rc0" -eq 0 ] || show "$T/pipe.err0"
ok_grep "$T/pipe.err0" "^dtrun: membership: node 1 \(.*\) lost: its connection closed; world 4 -> 2 ranks on 1 node; " \
    "node 0: the world shrinks from 4 ranks to 2"
cmp -s "$T/ref.st" "$T/pipe.st"; ok $? "a pipeline grown to 2 replicas and back: the same weight bytes as one process"
TRAIN=$TRAIN_SAVE

# ---- the interleaved schedule, from memory: 2 stages of 2 chunks, nodes of 2 ranks -------
# (--shard optim, --snapshot-every 10, no checkpoint directory): a rank's snapshot is a
# piece per chunk, and each piece lies on the other node too. Node 1 joins and is
# SIGKILLed at a drawn step; node 0 goes on from its pieces and node 1's copies.
TRAIN_SAVE=$TRAIN
TRAIN="$TRAIN --pipeline 2 --pipeline-schedule interleaved --virtual-stages 2 --shard optim --snapshot-every 10"
port=$(free_port)
memnode il 0 --save "$T/il.st"; v0=$!
wait_line "$T/il.out0" "no snapshot yet: starting from step 0" 60
ok $? "node 0 runs one pipeline of 2 stages x 2 chunks"
ok_grep "$T/il.err0" "world sizes that keep the result exact: 2 and 4$" "the exact sizes are whole pipelines (2 and 4)"
s0=$(snapdir $v0)
memnode il 1; v1=$!
wait_line "$T/$tok/il.m.jsonl" '"event":"membership".*"world_size":4' 60
r=$?; ok $r "node 1 joins: 2 replicas of the pipeline on 4 ranks"
[ $r -eq 0 ] || show "$T/il.err0" "$T/il.err1" "$T/il.out1"
lose_at "$T/$tok/il.m.jsonl" 4 50 1500 "$s0" $v1 $v0 "node 1 of 2 nodes x 2 ranks, interleaved, memory"
[ "$rc0" -eq 0 ] || show "$T/il.err0" "$T/il.out0"
r=$(sed -n 's/.*"event":"membership","step":[0-9]*,"resumed_after":\([0-9]*\),"world_size":2.*/\1/p' "$T/$tok/il.m.jsonl" | tail -1)
[ -n "$r" ] && [ "$r" -ge "$kept" ]; ok $? "resumed after step ${r:-none}, the newest snapshot when node 1 died ($kept or later)"
ok_grep "$T/il.out0" "^\[rank0\]:dtrain: resumed from the nodes' in-memory snapshot of step $r(;|$)" \
    "node 0 held every chunk's piece: its own and node 1's copies, nothing copied"
cmp -s "$T/ref.st" "$T/il.st"; ok $? "interleaved, grown, shrunk, sharded, from memory: the same weight bytes as one process"
TRAIN=$TRAIN_SAVE

# ---- a spare takes a lost node's place -------------------------------------------------
# 3 nodes of 1 rank, --micro-batches 2: worlds 1 and 2 keep the bits, so 2 work, 1 waits
TRAIN2=$(echo "$TRAIN" | sed 's/--micro-batches 4/--micro-batches 2/')
"$D" $TRAIN2 --save "$T/ref2.st" > "$T/ref2.out" 2>&1
ok $? "one process, --micro-batches 2 (the reference)"
TRAIN_SAVE=$TRAIN; TRAIN=$TRAIN2
port=$(free_port)
node spare 0 2:3; q0=$!
node spare 1 2:3; q1=$!
wait_line "$T/spare.err1" "^dtrun: node 1 \(.*\), attempt 0: ranks 1\.\.1 of 2$" 60
ok $? "nodes 0 and 1 run the world of 2"
ok_grep "$T/spare.err0" "world sizes that keep the result exact: 1 and 2$" "node 0 names the exact sizes (1 and 2)"
node spare 2 2:3; q2=$!
wait_line "$T/spare.err2" "^dtrun: node 2 \(.*\), attempt 0: a spare \(the job runs 2 ranks\)$" 60
ok $? "node 2 joins and waits as a spare"
wait_ckpt "$T/$tok/spare" 400
kill -KILL $q1
wait_line "$T/spare.err2" "^dtrun: node 2 \(.*\), attempt 1: ranks 1\.\.1 of 2$" 60
ok $? "node 1 killed: the spare takes rank 1"
# node 0 says the change after it has sent the new layout: the spare may print first
wait_line "$T/spare.err0" "^dtrun: membership: node 1 \(.*\) lost: its connection closed; world 2 -> 2 ranks on 2 nodes; " 60
r=$?; ok $r "node 0: the world stays at 2 ranks"
[ $r -eq 0 ] || show "$T/spare.err0"
wait_pid $q0 240; rc0=$?
wait_pid $q2 60; rc2=$?
wait $q1 2>/dev/null
[ "$rc0" -eq 0 ] && [ "$rc2" -eq 0 ]; ok $? "nodes 0 and 2 finish (exit $rc0, $rc2)"
[ "$rc0" -eq 0 ] || show "$T/spare.err0"
cmp -s "$T/ref2.st" "$T/spare.st"; ok $? "a spare replaced the lost node: the same weight bytes as one process"

# ---- too few nodes: the job stops, naming the lost node and the newest checkpoint -------
port=$(free_port)
node few 0 2:2 --rdzv-timeout 3; f0=$!
node few 1 2:2; f1=$!
wait_ckpt "$T/$tok/few" 200
ok $? "a job of 2:2 nodes runs"
kill -KILL $f1
wait_pid $f0 60; rc0=$?
wait $f1 2>/dev/null
[ "$rc0" -eq 1 ]; ok $? "node 1 lost, MIN 2: node 0 exits 1 after --rdzv-timeout (got $rc0)"
ok_grep "$T/few.err0" "^dtrun: the job stops: 1 live node \(at least 2 needed, for a world of 1 and 2 ranks\) for 3 s \(--rdzv-timeout\); nodes lost: 1 \(.*\); newest checkpoint: .*/$tok/few/step-[0-9]{12}$" \
    "node 0 names the lost node and the newest checkpoint"
TRAIN=$TRAIN_SAVE

# ---- in-memory snapshots: no checkpoint directory at all, nodes of 2 ranks, sharded -----
# (--snapshot-every 10, --shard grads: each rank's shard also on the other node). Node 1
# joins (it holds nothing: the files come from node 0), then is SIGKILLed at a drawn step;
# node 0 goes on from the snapshot in memory, its own shards and node 1's copies.
TRAIN_SAVE=$TRAIN; TRAIN="$TRAIN --shard grads --snapshot-every 10"
port=$(free_port)
memnode mem 0 --save "$T/mem.st"; m0=$!
wait_line "$T/mem.err0" "^dtrun: warning: the program has no --checkpoint-dir: its state lives only in the nodes' memory" 60
ok $? "no --checkpoint-dir: dtrun says the state lives in the nodes' memory only"
wait_line "$T/mem.out0" "no snapshot yet: starting from step 0" 60
s0=$(snapdir $m0)
[ -n "$s0" ] && [ -d "$s0" ]; ok $? "node 0's dtrun made its memory directory (${s0:-none})"
memnode mem 1; m1=$!
wait_line "$T/$tok/mem.m.jsonl" '"event":"membership".*"world_size":4' 60
r=$?; ok $r "node 1 joins: 4 ranks"
[ $r -eq 0 ] || show "$T/mem.err0" "$T/mem.err1" "$T/mem.out1"
ok_grep "$T/mem.out0" "^\[rank0\]:dtrain: resumed from the nodes' in-memory snapshot of step [0-9]+ \([0-9]+ files copied between nodes, " \
    "the grown world starts from the snapshot node 0 kept, the files node 1 lacked copied to it"
s1=$(snapdir $m1)
lose_at "$T/$tok/mem.m.jsonl" 4 50 1500 "$s0" $m1 $m0 "node 1 of 2 nodes x 2 ranks, memory"
[ "$rc0" -eq 0 ] || show "$T/mem.err0" "$T/mem.out0"
r=$(sed -n 's/.*"event":"membership","step":[0-9]*,"resumed_after":\([0-9]*\),"world_size":2.*/\1/p' "$T/$tok/mem.m.jsonl" | tail -1)
[ -n "$r" ] && [ "$r" -ge "$kept" ] && [ $((r % 10)) -eq 0 ]
ok $? "resumed after step ${r:-none}, the newest snapshot when node 1 died ($kept or later): at most 10 steps lost"
ok_grep "$T/mem.out0" "^\[rank0\]:dtrain: resumed from the nodes' in-memory snapshot of step $r(;|$)" \
    "node 0 held the whole state: its shards and node 1's copies, nothing copied"
said=$(sed -n 's/^dtrun: membership: node 1 .* lost: .*; resumes after step \([0-9]*\); .*/\1/p' "$T/mem.err0" | tail -1)
[ "$said" = "$r" ]; ok $? "dtrun named that step (${said:-none})"
cmp -s "$T/ref.st" "$T/mem.st"; ok $? "grown, shrunk, sharded, from memory: the same weight bytes as one process"
[ ! -e "$s0" ]; ok $? "node 0's dtrun removed its memory directory at the end"
i=0; while [ -n "$s1" ] && [ -e "$s1" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
[ -n "$s1" ] && [ ! -e "$s1" ]; ok $? "the killed node's directory was swept (its dtrun is dead)"
TRAIN=$TRAIN_SAVE

# four nodes of one rank, the optimizer state sharded: node 1's shard is also on node 2
# (its partner) and node 3's on node 0. Node 1 is SIGKILLed: nodes 0 and 2 go on (node 3
# waits as a spare), each sent the shards it lacks of the 4-rank snapshot.
TRAIN_SAVE=$TRAIN; TRAIN="$TRAIN --shard optim --snapshot-every 10"
port=$(free_port)
# (disk checkpoints only where the world grows: a loss always resumes from memory)
EVERY=1000000
for n in 0 1 2 3; do node ring $n 2:4; eval "g$n=\$!"; done
unset EVERY
wait_line "$T/ring.m.jsonl" '"event":"(start|membership)".*"world_size":4' 120
ok $? "4 nodes of 1 rank run a world of 4"
sr=$(snapdir $g0)
lose_at "$T/ring.m.jsonl" 4 30 300 "$sr" $g1 $g0 "node 1 of 4 nodes x 1 rank, memory"
[ "$rc0" -eq 0 ] || show "$T/ring.err0" "$T/ring.out0"
for n in 2 3; do eval "wait_pid \$g$n 60"; done
ok_grep "$T/ring.out0" "^\[rank0\]:dtrain: resumed from the nodes' in-memory snapshot of step [0-9]+ \(4 files copied between nodes, " \
    "the 4 shards came from the nodes that hold them (node 1's from node 2)"
cmp -s "$T/ref.st" "$T/ring.st"; ok $? "four nodes, then two, sharded, from memory: the same weight bytes as one process"
TRAIN=$TRAIN_SAVE

# ---- node 0 lost: the majority goes on without it --------------------------------------
# 3 nodes of 1 rank (worlds 1, 2 and 4: nodes 0 and 1 work, node 2 waits), the optimizer
# state sharded and kept in memory only. Node 0 (its dtrun, and with it its rank) is
# SIGKILLed at a drawn step: node 1, the first node left in node 0's list, serves the
# rendezvous, node 2 reaches it, and the two go on from the snapshot in memory (node 0's
# shard from its copy on node 1; node 2, a spare until then, sent what it lacks).
TRAIN_SAVE=$TRAIN; TRAIN="$TRAIN --shard optim --snapshot-every 10"
port=$(free_port)
EVERY=1000000
for n in 0 1; do node tk $n 2:3; eval "h$n=\$!"; done
wait_line "$T/tk.err1" "^dtrun: node 1 \(.*\), attempt 0: ranks 1\.\.1 of 2$" 60
ok $? "nodes 0 and 1 run a world of 2"
node tk 2 2:3; h2=$!
unset EVERY
wait_line "$T/tk.err2" "^dtrun: node 2 \(.*\), attempt 0: a spare \(the job runs 2 ranks\)$" 60
ok $? "node 2 joins and waits as a spare"
sk=$(snapdir $h1)
lose_at "$T/tk.m.jsonl" 2 30 300 "$sk" $h0 $h1 "node 0 of 3 nodes x 1 rank"
[ "$rc0" -eq 0 ] || show "$T/tk.err1" "$T/tk.out1" "$T/tk.err2"
wait_pid $h2 60; rc2=$?
[ "$rc2" -eq 0 ]; ok $? "node 2 finishes too (exit $rc2)"
ok_grep "$T/tk.err1" "^dtrun: lost node 0 \(.*, the master at 127\.0\.0\.1:$port\) at .* UTC: its connection closed; the nodes that remain choose who serves the rendezvous$" \
    "node 1 names node 0 as lost, and does not end"
ok_grep "$T/tk.err1" "^dtrun: node 1 \(.*\) serves the rendezvous now on 127\.0\.0\.1:[0-9]+; waiting up to [0-9.]+ s for the 1 other node of the last membership of 3$" \
    "node 1, the first node left, serves the rendezvous"
ok_grep "$T/tk.err2" "^dtrun: node 2: node 1 at 127\.0\.0\.1:[0-9]+ serves the rendezvous now$" "node 2 goes to node 1"
ok_grep "$T/tk.err1" "^dtrun: membership: node 0 \(.*\) lost: its connection closed; world 2 -> 2 ranks on 2 nodes; resumes after step [0-9]+; " \
    "node 1 says the change and the step the job resumes after"
ok_grep "$T/tk.err2" "^dtrun: node 2 \(.*\), attempt 1: ranks 1\.\.1 of 2$" "node 2 runs rank 1, node 1 rank 0"
ok_grep "$T/tk.out1" "^\[rank0\]:dtrain: resumed from the nodes' in-memory snapshot of step [0-9]+ \([0-9]+ files? copied between nodes, " \
    "rank 0, now on node 1, resumes from memory: node 0's shard from node 1, files sent to node 2"
r=$(sed -n 's/.*"event":"membership","step":[0-9]*,"resumed_after":\([0-9]*\),"world_size":2.*/\1/p' "$T/tk.m.jsonl" | tail -1)
[ -n "$r" ] && [ "$r" -ge "$kept" ] && [ $((r % 10)) -eq 0 ]
ok $? "resumed after step ${r:-none}, the newest snapshot when node 0 died ($kept or later): at most 10 steps lost"
cmp -s "$T/ref.st" "$T/tk.st"; ok $? "node 0 lost, nodes 1 and 2 on, from memory: the same weight bytes as one process"
TRAIN=$TRAIN_SAVE

# 5 nodes of 1 rank (4 work, node 4 waits); node 0 and the spare SIGKILLed together:
# nodes 1-3 are 3 of 5, a majority. Node 1 waits the whole meeting window for node 4,
# exchanging heartbeats with nodes 2 and 3 (which came at once) so that neither loses it
port=$(free_port)
for n in 0 1 2 3 4; do node tk5 $n 2:5; eval "h$n=\$!"; done
wait_line "$T/tk5.m.jsonl" '"event":"(start|membership)".*"world_size":4' 120
ok $? "5 nodes of 1 rank run a world of 4"
wait_ckpt "$T/$tok/tk5" 400
kill -KILL $h0 $h4
for n in 1 2 3; do eval "wait_pid \$h$n 240; rc$n=\$?"; done
wait $h0 $h4 2>/dev/null
[ "$rc1" -eq 0 ] && [ "$rc2" -eq 0 ] && [ "$rc3" -eq 0 ]
r=$?; ok $r "node 0 and the spare lost: nodes 1-3 finish (exit $rc1, $rc2, $rc3)"
[ $r -eq 0 ] || show "$T/tk5.err1" "$T/tk5.err2" "$T/tk5.err3"
ok_grep "$T/tk5.err1" "^dtrun: membership: node 0 \(.*\) lost: its connection closed; node 4 \(.*\) did not meet again; world 4 -> 2 ranks on 2 nodes; " \
    "node 1 names both, and goes on with the 2 ranks 3 nodes hold"
cmp -s "$T/ref.st" "$T/tk5.st"; ok $? "the same weight bytes as one process"

# two nodes: node 1 alone is no majority of two (it cannot tell node 0's death from a cut
# link, behind which node 0 goes on), so it ends
port=$(free_port)
node tk2 0 1:2; h0=$!
node tk2 1 1:2; h1=$!
wait_line "$T/tk2.err1" "^dtrun: node 1 \(.*\), attempt [0-9]+: ranks 1\.\.1 of 2$" 60
ok $? "2 nodes of 1 rank run"
kill -KILL $h0
wait_pid $h1 60; rc1=$?
wait $h0 2>/dev/null
[ "$rc1" -eq 1 ]; ok $? "node 0 lost in a job of 2 nodes: node 1 exits 1 (got $rc1)"
ok_grep "$T/tk2.err1" "^dtrun: node 1 \(.*\): 1 of the 2 nodes of the last membership met again, not more than half: the job stops here" \
    "node 1 says it is no majority"

# 4 nodes, 3 of them stopped (SIGSTOP: their connections stay open, silent): node 0 keeps
# 1 of 4 and stops, rather than go on beside a majority that may go on without it
port=$(free_port)
for n in 0 1 2 3; do node tk4 $n 1:4; eval "h$n=\$!"; done
wait_line "$T/tk4.m.jsonl" '"event":"(start|membership)".*"world_size":4' 120
ok $? "4 nodes of 1 rank run a world of 4"
kill -STOP $h1 $h2 $h3
wait_pid $h0 60; rc0=$?
kill -KILL $h1 $h2 $h3; kill -CONT $h1 $h2 $h3 2>/dev/null
wait $h1 $h2 $h3 2>/dev/null
[ "$rc0" -eq 1 ]; ok $? "node 0 kept 1 of 4 nodes: it exits 1 (got $rc0)"
ok_grep "$T/tk4.err0" "^dtrun: node 0 \(.*\), serving the rendezvous, kept 1 of the 4 nodes of the last membership, fewer than half: it stops" \
    "node 0 says why it stops"

# a snapshot that does not verify is passed over for the disk's checkpoint; bad directories
# (one process: disk 20 and 35, memory 20 and 30; disk's 35 removed, memory's 30 damaged)
mkdir -p "$T/snapd"
DT_SNAPSHOT_DIR="$T/snapd" "$D" $TRAIN --stop-at 35 --checkpoint-dir "$T/$tok/pass" --checkpoint-every 20 \
    --snapshot-every 10 --resume auto > "$T/pass.out" 2>&1
[ -d "$T/snapd/step-000000000030" ] && [ -d "$T/$tok/pass/step-000000000035" ]
ok $? "one process keeps snapshots in DT_SNAPSHOT_DIR beside its checkpoints"
rm -rf "$T/$tok/pass/step-000000000035"
f="$T/snapd/step-000000000030/model.safetensors"
[ -f "$f" ] && printf 'X' | dd of="$f" bs=1 seek=200 conv=notrunc 2> /dev/null
DT_SNAPSHOT_DIR="$T/snapd" "$D" $TRAIN --checkpoint-dir "$T/$tok/pass" --checkpoint-every 20 --snapshot-every 10 \
    --resume auto --save "$T/pass.st" > "$T/pass.out" 2>&1
ok_grep "$T/pass.out" "in-memory snapshot of step 30 was passed over \(rank 0: .*model.safetensors.*\); resumed from .*/step-000000000020 " \
    "a damaged snapshot is passed over, naming the file; the disk's checkpoint is used"
cmp -s "$T/ref.st" "$T/pass.st"; ok $? "and the weights are one process's"
DT_SNAPSHOT_DIR="$T/model" "$D" $TRAIN --snapshot-every 10 --resume auto > "$T/r.out" 2>&1; rc=$?
[ $rc -eq 2 ] && grep -q "snapshot directory $T/model (DT_SNAPSHOT_DIR): not a writable directory" "$T/r.out"
ok $? "DT_SNAPSHOT_DIR not a directory: exit 2, naming it (got $rc)"
"$D" $TRAIN --snapshot-every -3 > "$T/r.out" 2>&1; rc=$?
[ $rc -eq 2 ] && grep -q "snapshot-every" "$T/r.out"; ok $? "--snapshot-every -3: refused (got $rc)"

# ---- refusals ---------------------------------------------------------------------------
port=$(free_port)
"$DTRUN" -n 1 --nnodes 3:2 true > "$T/r.out" 2> "$T/r.err"; rc=$?
[ $rc -eq 2 ] && grep -q "^dtrun: --nnodes: MIN 3 is more than MAX 2 in '3:2'" "$T/r.err"; ok $? "MIN > MAX: exit 2 (got $rc)"
"$DTRUN" -n 1 --nnodes 1:1 true > "$T/r.out" 2> "$T/r.err"; rc=$?
[ $rc -eq 2 ] && grep -q "allows one node only" "$T/r.err"; ok $? "--nnodes 1:1: exit 2 (got $rc)"
"$DTRUN" -n 1 --nnodes 1:x true > "$T/r.out" 2> "$T/r.err"; rc=$?
[ $rc -eq 2 ] && grep -q "expected an integer" "$T/r.err"; ok $? "--nnodes 1:x: exit 2 (got $rc)"
"$DTRUN" -n 1 --nnodes 1:2 --master-port "$port" "$D" $TRAIN --pipeline 4 > "$T/r.out" 2> "$T/r.err"; rc=$?
[ $rc -eq 2 ] && grep -q "^dtrun: --nnodes 1:2 with -n 1: 1 node holds 1 rank, fewer than any world size that keeps the result exact (4)$" "$T/r.err"
ok $? "MIN nodes hold no exact world (--pipeline 4: only 4): exit 2 naming the sizes (got $rc)"
"$DTRUN" -n 1 --nnodes 1:2 --master-port "$port" sh -c 'echo hello' > "$T/r.out" 2> "$T/r.err"; rc=$?
[ $rc -eq 2 ] && grep -q "does not say which world sizes keep its result exact" "$T/r.err"
ok $? "a program that does not answer the probe: exit 2 (got $rc)"
TRAIN0=$(echo "$TRAIN" | sed 's/--micro-batches 4//')
"$DTRUN" -n 1 --nnodes 1:2 --master-port "$port" "$D" $TRAIN0 > "$T/r.out" 2> "$T/r.err"; rc=$?
[ $rc -eq 2 ] && grep -q "^dtrain: elastic: give --micro-batches S" "$T/r.err" && grep -q "refused to run elastically" "$T/r.err"
ok $? "dtrain without --micro-batches: refused, both say why (got $rc)"
"$DTRUN" -n 1 --nnodes 1:2 --master-port "$port" "$D" $TRAIN --lr-scale linear > "$T/r.out" 2> "$T/r.err"; rc=$?
[ $rc -eq 2 ] && grep -q "^dtrain: elastic: --lr-scale linear scales the learning rate with the world size" "$T/r.err"
ok $? "--lr-scale linear: refused (got $rc)"
OMPI_COMM_WORLD_RANK=0 "$DTRUN" -n 1 --nnodes 1:2 true > "$T/r.out" 2> "$T/r.err"; rc=$?
[ $rc -eq 2 ] && grep -q "under mpirun" "$T/r.err"; ok $? "under mpirun: refused with the reason (got $rc)"
# MIN not reached
"$DTRUN" -n 1 --nnodes 2:3 --master-port "$port" --rdzv-timeout 1 "$D" $TRAIN --checkpoint-dir "$T/$tok/min" \
    > "$T/r.out" 2> "$T/r.err"; rc=$?
[ $rc -eq 1 ] && grep -q "^dtrun: the rendezvous timed out after 1 s (--rdzv-timeout): 1 of at least 2 nodes joined$" "$T/r.err"
ok $? "MIN not reached: exit 1, saying how many joined (got $rc)"
# a node with another secret cannot join; the job goes on without it
port=$(free_port)
node sec 0 1:2; s0=$!
wait_ckpt "$T/$tok/sec" 200
DT_JOB_SECRET=another-secret-entirely-0123456789 \
    "$DTRUN" -n 1 --nnodes 1:2 --node-rank 1 --master-port "$port" --rdzv-timeout 5 "$D" $TRAIN > "$T/s1.out" 2> "$T/s1.err"
rc=$?
[ $rc -ne 0 ]; ok $? "a node with another secret is refused (exit $rc)"
wait_pid $s0 240; rc0=$?
[ "$rc0" -eq 0 ] && ! grep -q "joined" "$T/sec.err0"; ok $? "the job finishes on its own node, nobody joined (exit $rc0)"
cmp -s "$T/ref.st" "$T/sec.st"; ok $? "and its weights are one process's"
cleanup
done_testing
