#!/bin/sh
# pipeline_train.sh: dtrain train --pipeline end to end (src/train_pipe.c) — every layout
# of stages and replicas, every schedule (interleaved with 2 and 3 chunks a stage), fp32,
# bf16 and fp16, recomputation, dropout,
# batchnorm, --shard optim|grads and the gpt presets' tied embedding give bitwise the
# weights of one process with the same micro-batches; dtrain check takes --pipeline; checkpoints resume across layouts; evaluation and the printed loss are
# one process's; refused configurations exit 2 naming the reason; a rank that built
# another model is named at the start, not hung.
. "${DT_SRCDIR:-$(dirname "$0")/..}/tests/tap.sh"
D="$DT_BUILDDIR/dtrain"; R="$DT_BUILDDIR/dtrun"
[ -x "$D" ] && [ -x "$R" ] || skip_all "dtrain or dtrun not built"
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT

# run NAME NPROC ARGS...: one process without dtrun, else dtrun -n NPROC
run() {
    name=$1; n=$2; shift 2
    if [ "$n" = 1 ]; then timeout 180 "$D" train "$@" --save "$T/$name.st" > "$T/$name.out" 2>&1
    else timeout 240 "$R" -n "$n" "$D" train "$@" --save "$T/$name.st" > "$T/$name.out" 2>&1; fi
}
# same REF NAME WHAT: NAME's weights are REF's, bit for bit
same() { cmp -s "$T/$1.st" "$T/$2.st"; ok $? "$3"; }
final() { sed -n 's/.*final loss \([0-9.]*\).*/\1/p' "$T/$1.out" | tail -1; }

# (a) an mlp with dropout: P = 2 and 4, both schedules, 2 replicas x 2 stages
MLP="flatten linear(32) relu dropout(0.1) linear(16) relu linear(16) tanh linear(4)"
A="--model $MLP"
A1="--data synthetic:1024,1,8,8,4 --epochs 1 --batch 64 --micro-batches 8 --quiet --no-eval --clip 0.5 --optim adamw --lr 0.01"
run m1 1 --model "$MLP" $A1; ok $? "mlp, 1 process"
for cfg in "2 2 1f1b" "2 2 gpipe" "4 4 1f1b" "4 4 gpipe" "4 2 1f1b"; do
    set -- $cfg
    run "m$1$2$3" "$1" --model "$MLP" $A1 --pipeline "$2" --pipeline-schedule "$3"
    ok $? "mlp, $1 processes, --pipeline $2, $3"
    same m1 "m$1$2$3" "mlp: $(($1 / $2)) x $2 stages ($3) give the weights of 1 process"
done
ok_grep "$T/m421f1b.out" "pipeline: 2 stages x 2 replicas, schedule 1f1b, 4 micro-batches per replica" \
    "the start names the layout"
run mst 2 --model "$MLP" $A1 --pipeline 2 --stages 0-3,4-8 --schedule-dump
ok $? "--stages names the cut"
same m1 mst "a named cut gives the same bits"
ok_grep "$T/mst.out" "0:0-3:.* 1:4-8:" "the start shows each stage's modules"
ok_grep "$T/mst.out" "stage 1: RECV_ACT 0, FWD 0, BWD 0, SEND_GRAD 0" "--schedule-dump prints the lists"

# (b) a convolutional net: a relu fused into the layer before it on another stage
CNN="conv(4,3,pad=1) relu maxpool(2) dropout(0.1) conv(8,3,pad=1) relu flatten linear(16) relu linear(4)"
A2="--data synthetic:1024,1,8,8,4 --epochs 1 --batch 64 --micro-batches 4 --quiet --no-eval"
run c1 1 --model "$CNN" $A2; ok $? "cnn, 1 process"
for st in 0-4,5-9 0-7,8-9; do
    run "c$st" 2 --model "$CNN" $A2 --pipeline 2 --stages "$st" --pipeline-schedule gpipe
    same c1 "c$st" "cnn cut at $st (gpipe) gives the weights of 1 process"
done
run c4 4 --model "$CNN" $A2 --pipeline 4; same c1 c4 "cnn on 4 stages gives the weights of 1 process"
# batchnorm (each stage's records gathered and replayed in micro-batch order on every
# rank: the running statistics are saved too) and a residual block
BN="conv(4,3,pad=1) bn relu maxpool(2) dropout(0.1) residual(conv(4,3,pad=1) bn relu) conv(8,3,pad=1) bn relu flatten linear(16) relu linear(4)"
run b1 1 --model "$BN" $A2; ok $? "a cnn with batchnorm, 1 process"
for cfg in "2 2 1f1b" "4 4 1f1b" "4 2 gpipe"; do
    set -- $cfg
    run "b$1$2$3" "$1" --model "$BN" $A2 --pipeline "$2" --pipeline-schedule "$3"
    same b1 "b$1$2$3" "batchnorm: $(($1 / $2)) x $2 stages ($3) give the weights and running statistics of 1 process"
done
RN="--model resnet --data synthetic:256,1,28,28,10 --batch 16 --micro-batches 4 --steps 3 --quiet --no-eval --threads 1"
run rn1 1 $RN; run rn2 2 $RN --pipeline 2 --recompute; same rn1 rn2 "the resnet preset on 2 stages with --recompute gives the weights of 1 process"

# (c) a gpt with dropout and its tied embedding (first and last stage), clipping, adamw,
# evaluation every 3 steps
awk 'BEGIN { for (i = 0; i < 200; i++)
    printf "line %d: the quick brown fox jumps over the lazy dog; pack my box with five dozen liquor jugs.\n", i % 17 }' \
    > "$T/text.txt"
timeout 60 "$D" prepare-text "$T/tok" "$T/text.txt" > "$T/prep.out" 2>&1; ok $? "token files"
GPT="gpt(layers=3,heads=2,dim=32,block=16,dropout=0.1)"
G="--model $GPT --data tokens:$T/tok --batch 16 --micro-batches 8 --threads 1 --quiet --steps 6 --warmup 2 --lr 3e-3
   --clip 1.0 --optim adamw --eval-batches 2 --eval-every 3"
run g1 1 $G; ok $? "gpt, 1 process"
for cfg in "2 2 1f1b" "2 2 gpipe" "4 4 1f1b" "4 4 gpipe" "4 2 1f1b"; do
    set -- $cfg
    run "g$1$2$3" "$1" $G --pipeline "$2" --pipeline-schedule "$3"
    ok $? "gpt, $1 processes, --pipeline $2, $3"
    same g1 "g$1$2$3" "gpt: $(($1 / $2)) x $2 stages ($3) give the weights of 1 process"
done
l1=$(final g1); l4=$(final g441f1b)
[ -n "$l1" ] && [ "$l1" = "$l4" ]; ok $? "the loss printed once, one process's ($l1 / $l4)"
v1=$(sed -n 's/.*val loss \([0-9.]*\).*/\1/p' "$T/g1.out"); v4=$(sed -n 's/.*val loss \([0-9.]*\).*/\1/p' "$T/g441f1b.out")
[ -n "$v1" ] && [ "$v1" = "$v4" ]; ok $? "validation on 4 stages gives one process's loss ($v1 / $v4)"
[ "$(grep -c 'final loss' "$T/g441f1b.out")" = 1 ]; ok $? "and is printed by rank 0 alone"
run grc 2 $G --pipeline 2 --recompute; same g1 grc "--recompute with a pipeline (forwards run again) gives the same bits"
# the cut by parameters: the tied embedding's stage takes fewer blocks
run gpar 2 $G --pipeline 2 --stages params; same g1 gpar "--stages params gives the weights of 1 process"
ok_grep "$T/g221f1b.out" "stage:modules:parameters 0:0-6:34112 1:7-10:12768" "auto balances the work (the head's on stage 1)"
ok_grep "$T/gpar.out" "stage:modules:parameters 0:0-4:21408 1:5-10:25472" "params balances the parameters each stage owns"
# --stages auto under a --max-memory the work's cut exceeds and the parameters' fits (the
# cap between the two cuts' plans): the parameters' cut, said so, within the cap
PG="--model $GPT --data tokens:$T/tok --batch 16 --micro-batches 8 --optim adamw --np 2 --pipeline 2 --shard none
    --precision fp32 --json"
wa=$("$D" plan $PG --stages auto | grep -o '"total":[0-9]*' | head -1 | cut -d: -f2)
wp=$("$D" plan $PG --stages params | grep -o '"total":[0-9]*' | head -1 | cut -d: -f2)
[ -n "$wa" ] && [ -n "$wp" ] && [ "$wp" -lt "$wa" ]; ok $? "the plan: the parameters' cut needs less (${wp:-?} < ${wa:-?})"
run gcap 2 $G --pipeline 2 --max-memory $(( (${wa:-0} + ${wp:-0}) / 2 ))
ok $? "--max-memory between the cuts' plans: the run fits"
same g1 gcap "... and gives the weights of 1 process"
ok_grep "$T/gcap.out" "stage:modules:parameters 0:0-4:21408 1:5-10:25472 \(--stages auto cut by parameters: the work's cut needs" \
    "... cut by parameters, saying why"
run gcap2 2 $G --pipeline 2 --max-memory "${wa:-0}"
ok_grep "$T/gcap2.out" "stage:modules:parameters 0:0-6:34112 1:7-10:12768\$" "a cap the work's cut fits keeps it"
# sharding over each stage's replicas (the norm's chunks cut by shard and stage edges)
for cfg in "4 2 optim" "4 2 grads" "2 2 grads" "4 4 grads"; do
    set -- $cfg
    run "gs$1$2$3" "$1" $G --pipeline "$2" --shard "$3"
    same g1 "gs$1$2$3" "gpt: $(($1 / $2)) x $2 stages with --shard $3 give the weights of 1 process"
done
for p in bf16 fp16; do
    run "g1$p" 1 $G --precision $p; ok $? "gpt $p, 1 process"
    run "g2$p" 2 $G --precision $p --pipeline 2 --pipeline-schedule gpipe
    same "g1$p" "g2$p" "gpt $p on 2 stages gives the weights of 1 process"
done
# starting from a file (every rank loads it whole, then keeps its stage's part)
run gi1 1 $G --init "$T/g1.st"; run gi4 4 $G --init "$T/g1.st" --pipeline 4
same gi1 gi4 "--init on 4 stages gives the weights of 1 process"
LL="llama(layers=2,heads=4,kv_heads=2,dim=32,hidden=64,block=16)"
L="--model $LL --data tokens:$T/tok --batch 16 --micro-batches 4 --threads 1 --quiet --no-eval --steps 4 --warmup 1"
run l1 1 $L; run l4 4 $L --pipeline 4; same l1 l4 "llama on 4 stages gives the weights of 1 process"

# (c2) the interleaved schedule: V chunks a stage (chunks s, s + P, ...), each with a model,
# DDP, sharding and optimizer of its own; the tied embedding's gradient relayed through
# every chunk between the head's and the embedding's, several micro-batches' at once
I="--pipeline-schedule interleaved --virtual-stages 2"
for cfg in "2 2" "4 2"; do
    set -- $cfg
    run "mi$1$2" "$1" --model "$MLP" $A1 --pipeline "$2" $I
    ok $? "mlp, $1 processes, --pipeline $2, interleaved, 2 chunks a stage"
    same m1 "mi$1$2" "mlp: $(($1 / $2)) x $2 stages of 2 chunks give the weights of 1 process"
    run "gi$1$2" "$1" $G --pipeline "$2" $I
    ok $? "gpt, $1 processes, --pipeline $2, interleaved, 2 chunks a stage"
    same g1 "gi$1$2" "gpt: $(($1 / $2)) x $2 stages of 2 chunks give the weights of 1 process"
done
ok_grep "$T/gi42.out" "pipeline: 2 stages x 2 replicas, schedule interleaved with 2 chunks a stage, 4 micro-batches" \
    "the start names the chunks"
ok_grep "$T/gi22.out" "chunk:modules:parameters 0:0-[0-9]*:[0-9]* 1:[0-9-]*:[0-9]* 2:[0-9-]*:[0-9]* 3:[0-9-]*:[0-9]*$" \
    "and the modules of each of the 4 chunks"
li=$(final gi22); [ -n "$l1" ] && [ "$l1" = "$li" ]; ok $? "the loss printed is one process's ($l1 / $li)"
vi=$(sed -n 's/.*val loss \([0-9.]*\).*/\1/p' "$T/gi22.out")
[ -n "$v1" ] && [ "$v1" = "$vi" ]; ok $? "and validation's ($v1 / $vi)"
for sh in optim grads; do
    run "gi42$sh" 4 $G --pipeline 2 $I --shard $sh
    same g1 "gi42$sh" "interleaved, 2 x 2 stages with --shard $sh give the weights of 1 process"
done
run gi2r 2 $G --pipeline 2 $I --recompute; same g1 gi2r "interleaved with --recompute gives the same bits"
run gi2b 2 $G --pipeline 2 $I --precision bf16; same g1bf16 gi2b "interleaved in bf16 gives 1 process's bf16 weights"
# fp16: one loss-scaler decision over a stage's chunks (an overflow planted at step 2 on
# the last rank skips that step everywhere, as in one process)
run gi2h 2 $G --pipeline 2 $I --precision fp16; same g1fp16 gi2h "interleaved in fp16 gives 1 process's fp16 weights"
run g1of 1 $G --precision fp16 --testing-fault grad-inf:2
run gi4of 4 $G --pipeline 2 $I --precision fp16 --testing-fault grad-inf:2
same g1of gi4of "an overflow on the last rank skips the step on 2 x 2 stages of 2 chunks as on 1 process"
! cmp -s "$T/g1fp16.st" "$T/g1of.st"; ok $? "(the skipped step changed the weights)"
run mid 2 --model "$MLP" $A1 --pipeline 2 $I --schedule-dump
ok_grep "$T/mid.out" "stage 1: RECV_ACT 0.0, FWD 0.0, " "--schedule-dump names each action's chunk"
# an elastic job's worlds: those whose replicas get a multiple of P micro-batches
DT_ELASTIC_PROBE=1 "$D" train --model "$MLP" $A1 --batch 96 --micro-batches 24 --pipeline 4 $I > "$T/probe.out" 2>&1
ok_grep "$T/probe.out" "^dtrain-elastic: sizes=4,8 " "elastic worlds of 4 stages of 2 chunks and 24 micro-batches: 4 and 8 (not 16: 6 each)"
# 4 stages of 2 chunks (a stage receives a micro-batch's boundary gradient before the
# previous one's backward ran) and 2 stages of 3
G6="--model gpt(layers=6,heads=2,dim=32,block=16,dropout=0.1) --data tokens:$T/tok --batch 16 --micro-batches 8
    --threads 1 --quiet --steps 3 --warmup 1 --lr 3e-3 --clip 1.0 --optim adamw --no-eval"
run h1 1 $G6; run hi42 4 $G6 --pipeline 4 $I
same h1 hi42 "gpt: 4 stages of 2 chunks give the weights of 1 process"
run hi23 2 $G6 --pipeline 2 --pipeline-schedule interleaved --virtual-stages 3
same h1 hi23 "gpt: 2 stages of 3 chunks give the weights of 1 process"

# memory: a stage holds its own parameters (and the tied head's), not the whole array:
# each rank's accounted parameter bytes at step 3 (--rank-stats), against the model's
run mem 2 $G --pipeline 2 --no-eval --rank-stats 3 --metrics "$T/mem.jsonl"
full=$("$D" model --model "$GPT" --data "tokens:$T/tok" | sed -n 's/^Trainable params: //p' | tr -d ,)
for r in 0 1; do
    p=$(sed -n "s/.*\"event\":\"rank\",\"step\":3,\"rank\":$r,.*\"mem_peak_bytes\":{\"params\":\([0-9]*\).*/\1/p" "$T/mem.jsonl")
    awk -v p="$p" -v n="$full" 'BEGIN { exit !(p > 0 && n > 0 && p < 0.8 * 4 * n) }'
    ok $? "stage $r holds ${p:-?} bytes of parameters, less than 0.8 of the whole model's $((4 * ${full:-0}))"
done
# and a stage of 2 chunks holds its two chunks' (a model each), not the whole array twice
run memi 2 $G --pipeline 2 $I --no-eval --rank-stats 3 --metrics "$T/memi.jsonl"
for r in 0 1; do
    p=$(sed -n "s/.*\"event\":\"rank\",\"step\":3,\"rank\":$r,.*\"mem_peak_bytes\":{\"params\":\([0-9]*\).*/\1/p" "$T/memi.jsonl")
    awk -v p="$p" -v n="$full" 'BEGIN { exit !(p > 0 && n > 0 && p < 0.8 * 4 * n) }'
    ok $? "stage $r of 2 chunks holds ${p:-?} bytes of parameters, less than 0.8 of the whole model's $((4 * ${full:-0}))"
done

# dtrain check gives --pipeline to the N-process run only
timeout 300 "$D" check --np 4 --pipeline 2 --model "$GPT" --data "tokens:$T/tok" --batch 16 --threads 1 \
    > "$T/check.out" 2>&1
ok $? "dtrain check --np 4 --pipeline 2 passes"
ok_grep "$T/check.out" "bitwise +PASS" "its final weights are 1 process's"
timeout 300 "$D" check --np 2 --pipeline 2 $I --model "$GPT" --data "tokens:$T/tok" --batch 16 --threads 1 \
    > "$T/checki.out" 2>&1
ok $? "dtrain check --np 2 --pipeline 2 with 2 chunks a stage passes"
ok_grep "$T/checki.out" "bitwise +PASS" "its final weights are 1 process's"

# under mpirun: the mpi backend (deterministic: dtrain's tree) and the tcp backend's
# rendezvous through MPI
# (not in a sanitizer build: its leak check reports Open MPI's own allocations at exit)
if [ -n "${MPIRUN:-}" ] && [ -x "$MPIRUN" ] && [ -z "${DT_SANITIZED:-}" ]; then
    mpi() { OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 DT_DETERMINISTIC=1 \
        timeout 240 "$MPIRUN" --allow-run-as-root --oversubscribe -np "$@"; }
    mpi 2 "$D" train $G --pipeline 2 --backend mpi --save "$T/gm.st" > "$T/gm.out" 2>&1
    ok $? "--pipeline 2 under mpirun, mpi backend"
    same g1 gm "its weights are 1 process's"
    mpi 4 "$D" train $G --pipeline 2 --save "$T/gm4.st" > "$T/gm4.out" 2>&1
    ok $? "2 x 2 stages under mpirun, tcp backend"
    same g1 gm4 "its weights are 1 process's"
else
    for i in 1 2 3 4; do skip "MPI not configured, or a sanitizer build"; done
fi

# (d) checkpoints resume across layouts: 1 x 2 -> 1 process, 1 process -> 2 x 2, 2 x 2 -> 1 x 4
ck() { timeout 240 "$R" -n "$1" "$D" train $G --checkpoint-dir "$T/$2" --checkpoint-every 3 --stop-at 3 $3 > "$T/$2.out" 2>&1; }
ck 2 k12 "--pipeline 2"; ok $? "a pipeline stops at step 3 with a checkpoint"
run r12 1 $G --checkpoint-dir "$T/k12" --resume auto; same g1 r12 "it resumes on 1 process to the uninterrupted weights"
timeout 180 "$D" train $G --checkpoint-dir "$T/k1" --checkpoint-every 3 --stop-at 3 > "$T/k1.out" 2>&1
run r22 4 $G --checkpoint-dir "$T/k1" --resume auto --pipeline 2
same g1 r22 "one process's checkpoint resumes on 2 replicas x 2 stages to the same weights"
# the pipeline's checkpoint is an ordinary one: exported, it is the 1-process checkpoint's model
"$D" export "$T/k12/step-000000000003" -o "$T/e12.st" > /dev/null 2>&1 &&
    "$D" export "$T/k1/step-000000000003" -o "$T/e1.st" > /dev/null 2>&1
ok $? "dtrain export writes the pipeline's and the 1-process run's step-3 models"
cmp -s "$T/e12.st" "$T/e1.st"; ok $? "byte for byte the same"
timeout 60 "$D" sample --model "$GPT" --weights "$T/e12.st" --prompt line --tokens 8 --threads 1 > "$T/sample.out" 2>&1
ok $? "dtrain sample runs the pipeline's model"
ck 4 k22 "--pipeline 2"
run r14 4 $G --checkpoint-dir "$T/k22" --resume auto --pipeline 4
same g1 r14 "2 x 2 stages' checkpoint resumes on 4 stages to the same weights"
ck 4 k22g "--pipeline 2 --shard grads"; ok $? "2 x 2 stages with --shard grads write a sharded checkpoint"
[ "$(ls "$T"/k22g/step-*/ | grep -c '^shard-.*-of-00004')" = 4 ]; ok $? "one piece per rank"
run r2o 2 $G --checkpoint-dir "$T/k22g" --resume auto --shard optim
same g1 r2o "it resumes on 2 data-parallel ranks (--shard optim) to the same weights"
# interleaved: a piece per chunk; 1 x 2 of 2 chunks -> 1 process, 1 process -> 2 x 2 of 2 chunks
ck 2 ki "--pipeline 2 $I"; ok $? "an interleaved pipeline stops at step 3 with a checkpoint"
[ "$(ls "$T"/ki/step-*/ | grep -c '^shard-.*-of-00004')" = 4 ]; ok $? "one piece per chunk"
run rki 1 $G --checkpoint-dir "$T/ki" --resume auto
same g1 rki "it resumes on 1 process to the uninterrupted weights"
run rk1i 4 $G --checkpoint-dir "$T/k1" --resume auto --pipeline 2 $I
same g1 rk1i "one process's checkpoint resumes on 2 x 2 stages of 2 chunks to the same weights"

# (e) refused: exit 2 with the reason
refuse() {
    what=$1; n=$2; pat=$3; shift 3
    timeout 120 "$R" -n "$n" "$D" train "$@" > "$T/refuse.out" 2>&1
    [ $? -ne 0 ]; ok $? "$what is refused"
    ok_grep "$T/refuse.out" "$pat" "and the message says why"
    grep -q "exit code 2" "$T/refuse.out"; ok $? "with exit code 2"
}
refuse "fewer micro-batches than stages" 4 "2 micro-batches per replica cannot fill 4 stages" \
    --model "$MLP" $A1 --micro-batches 2 --pipeline 4
refuse "a world that is no multiple of the stages" 2 "2 processes cannot hold whole pipelines of 4 stages" \
    --model "$MLP" $A1 --pipeline 4
refuse "a cut that leaves modules out" 2 "leaves modules 6-8 out" --model "$MLP" $A1 --pipeline 2 --stages 0-2,3-5
refuse "a cut that does not follow on" 2 "stage 1 is modules 4-8; expected a run starting at module 3" \
    --model "$MLP" $A1 --pipeline 2 --stages 0-2,4-8
refuse "a malformed cut" 2 "expected auto, params or 2 runs of module indices" --model "$MLP" $A1 --pipeline 2 --stages 0-3
refuse "more stages than modules with parameters" 4 "fewer than the 4 stages" \
    --model "flatten linear(8) relu linear(4)" $A1 --pipeline 4
refuse "an unknown schedule" 2 "expected gpipe, 1f1b or interleaved, got 'zb'" --model "$MLP" $A1 --pipeline 2 --pipeline-schedule zb
timeout 120 "$R" -n 2 "$D" train --model "$MLP" $A1 --pipeline 2 --shard params > "$T/refuse.out" 2>&1
[ $? -ne 0 ]; ok $? "--shard params with a pipeline is refused"
ok_grep "$T/refuse.out" "shard params with --pipeline is not supported yet" "saying so"
refuse "chunks without the interleaved schedule" 2 "virtual-stages needs the interleaved schedule" \
    --model "$MLP" $A1 --pipeline 2 --virtual-stages 2
refuse "chunks without a pipeline" 1 "virtual-stages 2 cuts the stages of a pipeline into chunks" \
    --model "$MLP" $A1 --pipeline-schedule interleaved --virtual-stages 2
refuse "interleaved micro-batches that are no multiple of the stages" 4 "6 micro-batches are not a multiple of the 4 stages" \
    --model "$MLP" $A1 --batch 48 --micro-batches 6 --pipeline 4 $I
refuse "more chunks than modules" 4 "4 stages x 2 chunks .--virtual-stages. are 8 chunks of the model: .*8 stages, but the model has 7 top-level modules" \
    $L --pipeline 4 $I

# (f) a rank that built another model is named at the start (not a hang on a message of
# another size)
timeout 120 "$R" -n 2 sh -c 'm="$1"; [ "$RANK" = 1 ] && m="$2"; shift 2; exec "$@" --model "$m"' sh \
    "$CNN" "conv(4,3,pad=1) relu maxpool(2) dropout(0.1) conv(6,3,pad=1) relu flatten linear(16) relu linear(4)" \
    "$D" train $A2 --pipeline 2 > "$T/diff.out" 2>&1
[ $? -ne 0 ]; ok $? "stages that built different models fail"
ok_grep "$T/diff.out" "stage 0 .rank 0. built a model of 10 layers and 2468 parameters, stage 1 .rank 1. one of 10 and 1882" \
    "naming both stages and ranks"

# (g) a killed stage ends the job, named
# (rank 1 kills its trainer once a checkpoint exists: it is mid-run, not starting)
CK="$T/kill.ck"
DT_TIMEOUT=60 timeout 180 "$R" -n 2 sh -c 'if [ "$RANK" = 1 ]; then "$@" & p=$!; i=0
    until ls "$0" 2>/dev/null | grep -q "^step-" || [ $i -ge 1200 ]; do sleep 0.1; i=$((i + 1)); done
    ls "$0" 2>/dev/null | grep -q "^step-" && touch "$0.seen"; kill -9 $p; wait $p; exit 9; fi; exec "$@"' "$CK" \
    "$D" train --model "$MLP" $A1 --epochs 200 --pipeline 2 --checkpoint-dir "$CK" --checkpoint-every 1 \
    > "$T/kill.out" 2>&1
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ]; ok $? "a stage killed mid-run ends the job (exit $rc, no hang)"
[ -f "$CK.seen" ]; ok $? "it was killed after its first checkpoint"
ok_grep "$T/kill.out" "rank 1 .*failed first" "dtrun names the rank"

# (h) a stage that hangs (stopped mid-run) ends the job within DT_TIMEOUT, its neighbour
# naming it
MF="$T/hang.jsonl"
DT_TIMEOUT=5 timeout 120 "$R" -n 2 sh -c 'if [ "$RANK" = 1 ]; then "$@" & p=$!; i=0
    until n=$(grep -c step "$0" 2>/dev/null); [ "${n:-0}" -ge 20 ] || [ $i -ge 1200 ]; do sleep 0.1; i=$((i + 1)); done
    kill -STOP $p; wait $p; exit 9; fi; exec "$@"' "$MF" \
    "$D" train --model "$MLP" $A1 --epochs 200 --pipeline 2 --log-every 1 --metrics "$MF" > "$T/hang.out" 2>&1
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ]; ok $? "a stage stopped mid-run ends the job (exit $rc, no hang)"
# (the stop lands in a boundary receive, which names the stage, or in the step's
# collectives, which name the rank)
ok_grep "$T/hang.out" "(micro-batch [0-9]*, receiving from stage 1 .rank 1.: .*timed out after 5 s|timed out after 5 s .*waiting for rank 1)" \
    "its neighbour names the rank it waited for (and its stage, in a boundary receive)"

done_testing
