#!/bin/sh
# plan.sh: dtrain plan against the accounted memory of real runs: for every
# configuration that runs here (--shard none in fp32; mlp, cnn, resnet and gpt; with
# and without --recompute; 1 and 2 processes, one or several micro-batches per rank;
# bf16 and fp16; every sharding mode on 2 and 4 processes, the CPU's pool of --shard
# params with either backward prefetch)
# the estimate is within 10% of the measured peak, in total and per category; the
# per-rank memory shows in --rank-stats and the metrics file; the walls are named
# (fits, the memory wall with the sharding and ranks that get past it, the compute
# wall); pipelines (mlp and the gpt's tied embedding, 1f1b and gpipe, 2 stages on 2
# processes and 2 x 2 on 4, with and without --recompute, --shard optim|grads; the
# interleaved schedule's chunks on 2 and 4 stages): every rank's peak against its stage's plan; bad flags exit 2 with one line naming the flag,
# a pipeline the trainer refuses with the trainer's message.
. "${DT_SRCDIR:-$(dirname "$0")/..}/tests/tap.sh"
D="$DT_BUILDDIR/dtrain"; R="$DT_BUILDDIR/dtrun"
[ -x "$D" ] && [ -x "$R" ] || skip_all "dtrain or dtrun not built"
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
CATS="params grads optim acts comm other total"
# within WHAT MEASURED ESTIMATE TOTAL: |estimate - measured| <= 10% of measured (categories
# under 1% of the total: within 1% of the total)
within() {
    awk -v m="$2" -v e="$3" -v t="$4" 'BEGIN { d = e - m; if (d < 0) d = -d; lim = 0.1 * m;
        if (m < 0.01 * t) lim = 0.01 * t; exit !(m != "" && e != "" && d <= lim) }'
}

awk 'BEGIN { for (i = 0; i < 200; i++) printf "line %d: the quick brown fox jumps over the lazy dog.\n", i % 13 }' > "$T/text.txt"
timeout 60 "$D" prepare-text "$T/tok" "$T/text.txt" > "$T/o" 2>&1
ok $? "prepare-text"

# compare NAME NP MODEL DATA "TRAIN-ONLY FLAGS" SHARED FLAGS...: train, plan (--shard none
# --precision fp32 unless the flags say otherwise), compare
compare() {
    name=$1 np=$2 model=$3 data=$4 only=$5
    shift 5
    launch=""; [ "$np" -gt 1 ] && launch="$R -n $np"
    timeout 300 $launch "$D" train --model "$model" --data "$data" $only "$@" --threads 1 --quiet \
        --metrics "$T/$name.jsonl" > "$T/$name.out" 2>&1
    ok $? "$name: trains on $np process(es)"
    input="--data $data"; case $data in tokens:*) input="" ;; esac
    "$D" plan --model "$model" --np "$np" $input --shard none --precision fp32 "$@" --json > "$T/$name.plan" 2>&1
    ok $? "$name: dtrain plan"
    total=$(metrics_peak "$T/$name.jsonl" total)
    bad=""
    for c in ${ONLY:-$CATS}; do
        within "$c" "$(metrics_peak "$T/$name.jsonl" "$c")" "$(plan_bytes "$T/$name.plan" "$c")" "$total" || bad="$bad $c"
    done
    [ -z "$bad" ] && [ -n "$total" ]
    ok $? "$name: the estimate is within 10% of the measured peak (total $(plan_bytes "$T/$name.plan" total) planned, ${total:-?} measured)${bad:+; off:$bad}"
}
S="synthetic:512,1,28,28,10"
E="--epochs 1"
compare mlp-1 1 mlp $S "$E" --batch 64
compare mlp-2 2 mlp $S "$E" --batch 64
compare cnn-1 1 cnn $S "$E" --batch 64 --optim adamw
compare cnn-2x4 2 cnn $S "$E" --batch 64 --micro-batches 8
compare resnet-1 1 resnet synthetic:512,1,12,12,4 "$E" --batch 64
compare resnet-2-re 2 resnet synthetic:512,1,12,12,4 "$E" --batch 64 --recompute
G="gpt(layers=2,heads=2,dim=32,block=32)"
GT="--steps 4 --warmup 1"
compare gpt-1 1 "$G" "tokens:$T/tok" "$GT" --batch 8
compare gpt-1-re 1 "$G" "tokens:$T/tok" "$GT" --batch 8 --recompute
compare gpt-2-re 2 "$G" "tokens:$T/tok" "$GT" --batch 8 --recompute --no-eval
compare gpt-2x2 2 "$G" "tokens:$T/tok" "$GT" --batch 8 --micro-batches 4
# mixed precision: the rounded copy of the weights and the scratch for rounded
# activations (--shard params, which rounds its gathered units in place: tests/shard.sh)
compare mlp-2-bf16 2 mlp $S "$E" --batch 64 --precision bf16
compare cnn-1-fp16 1 cnn $S "$E" --batch 64 --precision fp16
compare gpt-2-bf16 2 "$G" "tokens:$T/tok" "$GT" --batch 8 --precision bf16 --recompute
# sharding: the state divided, and --shard params' pool (its slots the size of the
# largest unit a rank does not hold whole, as many as its run of such units needs)
G4="gpt(layers=4,heads=4,dim=64,block=32)"
compare mlp-2-params 2 mlp $S "$E" --batch 64 --shard params
compare gpt-2-optim 2 "$G4" "tokens:$T/tok" "$GT" --batch 8 --shard optim --no-eval
compare gpt-2-grads 2 "$G4" "tokens:$T/tok" "$GT" --batch 8 --shard grads --no-eval
compare gpt-2-params 2 "$G4" "tokens:$T/tok" "$GT" --batch 8 --shard params --no-eval
compare gpt-2-params-post 2 "$G4" "tokens:$T/tok" "$GT" --batch 8 --shard params --backward-prefetch post --no-eval
compare gpt-2-params-re 2 "$G4" "tokens:$T/tok" "$GT" --batch 8 --shard params --recompute --no-eval
compare gpt-2-params-bf16 2 "$G4" "tokens:$T/tok" "$GT" --batch 8 --shard params --precision bf16 --no-eval
# on 4 processes --shard params' broadcasts from each owner map a ring with a partner
# that halving/doubling does not use; the plan counts the rings of the latter
# (dt_comm_shm_plan), so its comm is one ring short (a transient: the total's peak is
# elsewhere, and within 10%)
ONLY="params grads optim acts other total"
compare mlp-4-params 4 mlp $S "$E" --batch 64 --shard params
compare gpt-4-params 4 "$G4" "tokens:$T/tok" "$GT" --batch 8 --shard params --no-eval
ONLY=

# pipelines: every rank's measured peak against its stage's plan (the stage_bytes of
# --json), per category (replica 0, which holds the largest shard of its stage) and in
# total (every rank); the plan's row is the largest stage's, against the
# largest rank. The start (every layer's buffers beside the stage's activation sets),
# the step, evaluation and the end (every stage's parameters gathered) are its moments.
# rank_peak FILE RANK CAT, stage_plan FILE STAGE CAT
rank_peak() { sed -n "s/.*\"event\":\"memory\",\"step\":[0-9]*,\"rank\":$2,.*\"mem_peak_bytes\":{[^}]*\"$3\":\([0-9]*\).*/\1/p" "$1" | tail -1; }
stage_plan() { sed -n "s/.*{\"stage\":$2,[^}]*\"$3\":\([0-9]*\).*/\1/p" "$1" | head -1; }
# compare_pipe NAME NP P MODEL DATA "TRAIN-ONLY FLAGS" SHARED FLAGS...
compare_pipe() {
    name=$1 np=$2 pp=$3 model=$4 data=$5 only=$6
    shift 6
    timeout 300 "$R" -n "$np" "$D" train --model "$model" --data "$data" --pipeline "$pp" $only "$@" --threads 1 \
        --quiet --metrics "$T/$name.jsonl" > "$T/$name.out" 2>&1
    ok $? "$name: trains on $np processes, $pp stages"
    input="--data $data"; case $data in tokens:*) input="" ;; esac
    "$D" plan --model "$model" --np "$np" $input --pipeline "$pp" --shard none --precision fp32 "$@" --json \
        > "$T/$name.plan" 2>&1
    ok $? "$name: dtrain plan"
    bad="" most=0 seen=""
    r=0
    while [ $r -lt "$np" ]; do
        st=$((r % pp))
        total=$(rank_peak "$T/$name.jsonl" $r total)
        # every category on replica 0, whose shard of the stage is the largest (the plan's);
        # the total on every rank
        cats=total; [ $r -lt "$pp" ] && cats=$CATS
        for c in $cats; do
            within "$c" "$(rank_peak "$T/$name.jsonl" $r "$c")" "$(stage_plan "$T/$name.plan" $st "$c")" "$total" ||
                bad="$bad rank$r:$c"
        done
        [ -n "$total" ] && [ "$total" -gt "$most" ] && most=$total
        seen="$seen $r:$(stage_plan "$T/$name.plan" $st total)/${total:-?}"
        r=$((r + 1))
    done
    [ -z "$bad" ] && [ "$most" -gt 0 ]
    ok $? "$name: each rank's peak is within 10% of its stage's plan (planned/measured:$seen)${bad:+; off:$bad}"
    within total "$most" "$(plan_bytes "$T/$name.plan" total)" "$most"
    ok $? "$name: the plan's row is the largest rank's ($(plan_bytes "$T/$name.plan" total) planned, $most measured)"
}
compare_pipe mlp-p2-1f1b 2 2 mlp $S "$E" --batch 64 --micro-batches 4
compare_pipe mlp-p2-gpipe 2 2 mlp $S "$E" --batch 64 --micro-batches 4 --pipeline-schedule gpipe
compare_pipe mlp-2x2-gpipe 4 2 mlp $S "$E" --batch 64 --micro-batches 8 --pipeline-schedule gpipe --no-eval
compare_pipe gpt-p2-1f1b 2 2 "$G" "tokens:$T/tok" "$GT" --batch 8 --micro-batches 4
compare_pipe gpt-p2-gpipe 2 2 "$G" "tokens:$T/tok" "$GT" --batch 8 --micro-batches 4 --pipeline-schedule gpipe
compare_pipe gpt-p2-re 2 2 "$G" "tokens:$T/tok" "$GT" --batch 8 --micro-batches 4 --recompute
compare_pipe gpt-p2-gpipe-re 2 2 "$G" "tokens:$T/tok" "$GT" --batch 8 --micro-batches 4 --pipeline-schedule gpipe \
    --recompute --no-eval
compare_pipe gpt-2x2-optim 4 2 "$G4" "tokens:$T/tok" "$GT" --batch 8 --micro-batches 4 --shard optim
compare_pipe gpt-2x2-grads-gpipe 4 2 "$G4" "tokens:$T/tok" "$GT" --batch 8 --micro-batches 8 --shard grads \
    --pipeline-schedule gpipe --no-eval
compare_pipe gpt-p4-1f1b 4 4 "$G4" "tokens:$T/tok" "$GT" --batch 8 --micro-batches 8 --stages 0-2,3-5,6-8,9-11
# mixed precision: each stage's rounded copy (its own weights and the tied head's, which
# the last stage rounds from what the first sends; every weight once an evaluation ran)
# and 16-bit activations; fp16 makes the copy on every CPU, bf16 where the GEMM kernel
# does not round its operands itself
compare_pipe gpt-p2-bf16 2 2 "$G" "tokens:$T/tok" "$GT" --batch 8 --micro-batches 4 --precision bf16
compare_pipe gpt-p2-fp16-noeval 2 2 "$G" "tokens:$T/tok" "$GT" --batch 8 --micro-batches 4 --precision fp16 --no-eval
compare_pipe mlp-p2-fp16-gpipe 2 2 mlp $S "$E" --batch 64 --micro-batches 4 --precision fp16 --pipeline-schedule gpipe
# the interleaved schedule: each stage's V chunks, each a model of its own (its kept
# range, fixed buffers, activation sets and boundary slots; the tied head's relay slots
# where a later micro-batch's part arrives first), built and set up chunk by chunk
I="--pipeline-schedule interleaved --virtual-stages 2"
compare_pipe gpt-p2-il 2 2 "$G" "tokens:$T/tok" "$GT" --batch 8 --micro-batches 4 $I
compare_pipe gpt-p2-il3 2 2 "$G4" "tokens:$T/tok" "$GT" --batch 8 --micro-batches 4 --pipeline-schedule interleaved \
    --virtual-stages 3 --no-eval
compare_pipe gpt-p4-il 4 4 "$G4" "tokens:$T/tok" "$GT" --batch 8 --micro-batches 8 $I
compare_pipe gpt-2x2-il-optim 4 2 "$G4" "tokens:$T/tok" "$GT" --batch 8 --micro-batches 8 $I --shard optim
compare_pipe gpt-p2-il-re 2 2 "$G" "tokens:$T/tok" "$GT" --batch 8 --micro-batches 4 $I --recompute
compare_pipe gpt-p2-il-bf16 2 2 "$G" "tokens:$T/tok" "$GT" --batch 8 --micro-batches 4 $I --precision bf16
# the table: a row per stage, the largest named; the start event's plan is rank 0's stage's
"$D" plan --model "$G" --np 2 --batch 8 --micro-batches 4 --pipeline 2 --shard none --precision fp32 > "$T/p1" 2>&1
ok $? "plan --pipeline 2: the table"
ok_grep "$T/p1" "^  pipeline: 2 stages x 1 replica, schedule 1f1b, 4 micro-batches per replica" "... names the layout"
ok_grep "$T/p1" "^  0 +0-[0-9]+ +[0-9,]+ +2 .*<- the largest" "... stage 0 keeps 2 micro-batches in flight, the largest"
ok_grep "$T/p1" "^  1 +[0-9]+-[0-9]+ +[0-9,]+ +1 " "... stage 1 keeps 1"
for name in gpt-p2-1f1b gpt-p2-il; do
    p0=$(stage_plan "$T/$name.plan" 0 total)
    grep -q "\"event\":\"start\".*\"plan_bytes\":${p0:-x}[,}]" "$T/$name.jsonl"
    ok $? "$name: the start event's plan_bytes is stage 0's estimate (${p0:-?})"
done
"$D" plan --model "$G" --np 2 --batch 8 --micro-batches 4 --pipeline 2 $I --shard none --precision fp32 > "$T/p2" 2>&1
ok $? "plan --pipeline 2 --virtual-stages 2: the table"
ok_grep "$T/p2" "^  pipeline: 2 stages x 1 replica, schedule interleaved with 2 chunks a stage, 4 micro-batches per replica" \
    "... names the layout"
ok_grep "$T/p2" "^  0 +0-[0-9]+,[0-9]+(-[0-9]+)? +[0-9,]+ +[0-9]+ " "... stage 0's row names its two chunks' modules"
# --stages auto under --max-memory: the parameters' cut where the work's needs more than
# the cap and that one does not (the trainer cuts the same: pipeline_train.sh)
PC="--model $G --np 2 --batch 8 --micro-batches 4 --pipeline 2 --shard none --precision fp32"
first_total() { grep -o '"total":[0-9]*' "$1" | head -1 | cut -d: -f2; }
for st in auto params; do
    "$D" plan $PC --stages $st --json > "$T/cut-$st" 2>&1
    "$D" plan $PC --stages $st --recompute --json > "$T/cut-$st-re" 2>&1
done
wa=$(first_total "$T/cut-auto"); wp=$(first_total "$T/cut-params")
[ -n "$wa" ] && [ -n "$wp" ] && [ "$wp" -lt "$wa" ]
ok $? "the gpt's cut by parameters needs less than the work's (${wp:-?} < ${wa:-?} bytes)"
cap=$(( (${wa:-0} + ${wp:-0}) / 2 ))
"$D" plan $PC --max-memory $cap > "$T/cut-cap" 2>&1
ok_grep "$T/cut-cap" "^  cut by parameters \(--stages auto under --max-memory\): the work's cut needs" \
    "plan --max-memory $cap between them: cut by parameters, said so"
ok_grep "$T/cut-cap" "per-rank memory: [0-9.]+ MiB \(--max-memory\)" "... the cap is the capacity"
"$D" plan $PC --max-memory $cap --json > "$T/cut-capj" 2>&1
grep -q '"cut":"params"' "$T/cut-capj" && [ "$(first_total "$T/cut-capj")" = "$wp" ]
ok $? "... --json: \"cut\":\"params\", the parameters' cut's plan ($(first_total "$T/cut-capj") = $wp)"
"$D" plan $PC --max-memory "$wa" --json > "$T/cut-fit" 2>&1
grep -q '"cut":"auto"' "$T/cut-fit" && [ "$(first_total "$T/cut-fit")" = "$wa" ]
ok $? "... a cap the work's cut fits keeps it"
# a pipeline asked for that does not fit (--device-mem between the cuts): its verdict lists
# the same stages cut by the parameters
gib=$(awk -v a="${wa:-0}" -v b="${wp:-0}" 'BEGIN { printf "%.9f", (a + b) / 2 / 1073741824 }')
"$D" plan $PC --device-mem "$gib" > "$T/cut-dm" 2>&1
ok_grep "$T/cut-dm" "^  --pipeline 2 --stages params +$(awk -v b="${wp:-0}" 'BEGIN { printf "%.2f", b / 1048576 }') MiB " \
    "a pipeline that does not fit --device-mem: --stages params is listed, with its plan"
# the verdict of a run that does not fit lists the parameters' cut where only it fits a pipeline
ra=$(first_total "$T/cut-auto-re"); rp=$(first_total "$T/cut-params-re")
cap=$(( (${ra:-0} + ${rp:-0}) / 2 ))
"$D" plan --model $G --np 2 --batch 8 --micro-batches 4 --shard none --precision fp32 --max-memory $cap > "$T/cut-v" 2>&1
ok_grep "$T/cut-v" "^  --recompute --pipeline 2 --stages params +[0-9.]+ MiB" \
    "verdict under a cap between the cuts with --recompute: --pipeline 2 --stages params"
a=$(sed -n 's/^  --recompute --pipeline 2 --stages params *\([0-9.]*\) MiB.*/\1/p' "$T/cut-v")
b=$(awk -v b="${rp:-0}" 'BEGIN { printf "%.2f", b / 1048576 }')
[ -n "$a" ] && [ "$a" = "$b" ]; ok $? "... its memory is the plan of that run (${a:-none} = $b MiB)"
# bad flags exit 2 with one line naming the flag; what the trainer refuses, with its message
bad() {   # bad WHAT PATTERN flags...
    what=$1 pat=$2; shift 2
    "$D" plan "$@" > "$T/bad" 2>&1
    rc=$?
    [ $rc -eq 2 ]; ok $? "$what exits 2 (got $rc)"
    ok_grep "$T/bad" "$pat" "... saying: $pat"
}
bad "plan --pipeline: a world that is no multiple of the stages" \
    "pipeline: 3 processes cannot hold whole pipelines of 2 stages" --model mlp --np 3 --pipeline 2 --micro-batches 6
bad "plan --pipeline: more stages than modules with parameters" \
    "pipeline: the model has 3 modules with parameters, fewer than the 4 stages" --model mlp --np 4 --pipeline 4 \
    --micro-batches 4
bad "plan --pipeline: fewer micro-batches than stages" "pipeline: 1 micro-batches per replica cannot fill 2 stages" \
    --model mlp --np 4 --pipeline 2 --micro-batches 2
bad "plan --pipeline: --shard params" "pipeline: --shard params with --pipeline is not supported yet" \
    --model mlp --np 2 --pipeline 2 --shard params
bad "plan --pipeline: more chunks than modules" "pipeline: 2 stages x 2 chunks .--virtual-stages. are 4 chunks of the model: " \
    --model mlp --np 2 --pipeline 2 --pipeline-schedule interleaved --virtual-stages 2
bad "plan --pipeline: chunks without the interleaved schedule" "virtual-stages needs the interleaved schedule" \
    --model mlp --np 2 --pipeline 2 --virtual-stages 2
bad "plan --pipeline: an unknown schedule" "pipeline.schedule: expected .*, got 'zigzag'" \
    --model mlp --np 2 --pipeline 2 --pipeline-schedule zigzag
bad "plan --pipeline: a bad --stages" "stages: " --model mlp --np 2 --pipeline 2 --stages 0-1,3-5
bad "plan: a bad --max-memory" "max-memory: expected an integer" --model mlp --np 2 --max-memory 3.25M
timeout 60 "$R" -n 2 "$D" train --model mlp --data $S --epochs 1 --batch 64 --pipeline 2 --virtual-stages 2 \
    --threads 1 --quiet > "$T/tr" 2>&1
ok_grep "$T/tr" "virtual-stages needs the interleaved schedule" "... the trainer's message, the same"

# per-rank memory in --rank-stats and the metrics file; the end-of-run lines
timeout 120 "$R" -n 2 "$D" train --model mlp --data $S --epochs 1 --batch 64 --threads 1 --rank-stats 4 \
    --metrics "$T/rs.jsonl" > "$T/rs.out" 2>&1
ok $? "--rank-stats on 2 processes"
ok_grep "$T/rs.out" "per-rank memory, MiB now/peak" "the rank table shows memory by category"
n=$(grep -c '"event":"rank".*"mem_bytes":{"params":7454760,"grads":7454760,"optim":7454760' "$T/rs.jsonl")
[ "$n" -ge 2 ]; ok $? "each rank's line in the metrics file has the mlp's 4P bytes of parameters, gradients and momentum ($n lines)"
grep -q '"event":"rank".*"rank":1,.*"mem_peak_bytes":{' "$T/rs.jsonl"; ok $? "... rank 1's too, with peaks"
for c in params grads optim acts comm other total; do
    grep -Eq "^(\[rank0\]:)?  $c +[0-9.]+ +[0-9.]+ " "$T/rs.out" || { ok 1 "the end of the run has a line for $c"; continue; }
    ok 0 "the end of the run has a line for $c"
done

# the walls
"$D" plan --model mlp --np 2 --batch 64 --device-mem 80 > "$T/w1" 2>&1
ok $? "plan: mlp on 2 ranks of 80 GiB"
ok_grep "$T/w1" "^  none +fp32 .* fits$" "... fits"
ok_grep "$T/w1" "verdict .*compute wall: fits, add ranks for speed" "... the compute wall: more ranks only make it faster"
"$D" plan --model mlp --np 2 --batch 2 --device-mem 80 --shard none --precision fp32 > "$T/w2" 2>&1
ok_grep "$T/w2" "verdict .*: fits \(the batch cannot be split" "a batch of 2 on 2 ranks fits and cannot take more ranks"
BIG="gpt(layers=48,dim=1600,heads=25,block=64)"
"$D" plan --model "$BIG" --np 2 --batch 16 --micro-batches 16 --device-mem 16 --precision bf16 > "$T/w3" 2>&1
ok $? "plan: a 1.5B-parameter gpt on 2 ranks of 16 GiB"
ok_grep "$T/w3" "verdict .*memory wall: needs --shard optim on >= 8 ranks" "... the memory wall: --shard optim on >= 8 ranks"
# (on 8 ranks 2 micro-batches each: DDP's tree in place keeps no second gradient array,
# so sharding the optimizer state suffices there; 12 GiB needs the parameters sharded)
"$D" plan --model "$BIG" --np 2 --batch 16 --micro-batches 16 --device-mem 12 --precision bf16 > "$T/w3b" 2>&1
ok_grep "$T/w3b" "verdict .*memory wall: needs --shard params on >= 8 ranks" "... of 12 GiB: --shard params on >= 8 ranks"
ok_grep "$T/w3" "^  params +bf16 " "... a row per shard mode (params)"
ok_grep "$T/w3" "^  optim +bf16 " "... (optim)"
grep -q "fp32" "$T/w3"; [ $? -ne 0 ]; ok $? "--precision bf16 shows bf16 rows only"
"$D" plan --model gpt2 --np 2 --batch 16 --device-mem 4 --shard none --precision fp32 > "$T/w4" 2>&1
ok_grep "$T/w4" "memory wall: needs >= 8 ranks \(smaller micro-batches\)" "gpt2's activations: more ranks, smaller micro-batches"
"$D" plan --model mlp --np 1 --batch 64 --device-mem 0.000001 --shard none --precision fp32 > "$T/w5" 2>&1
ok_grep "$T/w5" "memory wall: fits on no number of ranks" "a budget of 1 KiB fits nothing"
"$D" plan --model "$G" --np 1 --batch 8 --recompute > "$T/w6" 2>&1
ok_grep "$T/w6" "each keeps its output, 0.03 MiB, and they share an arena" "with --recompute the blocks' share is shown"
"$D" plan --model gpt --np 2 > "$T/w7" 2>&1
ok_grep "$T/w7" "global batch 12 in 2 micro-batches of 6 .* adamw \(2 state arrays\)" "a gpt preset takes dtrain train's recipe (batch 12, adamw)"
n=$(grep -Ec '^  (none|optim|grads|params) +(fp32|bf16|fp16) ' "$T/w7")
[ "$n" -eq 12 ]; ok $? "every shard mode x precision: 12 rows ($n)"

# no --batch: the default rounded up to the micro-batches, said so (not a refusal)
"$D" plan --model gpt2 --np 8 > "$T/w8" 2>&1
ok $? "plan: gpt2 on 8 ranks without --batch runs"
ok_grep "$T/w8" "global batch 16 \(chosen: the default 12 is not divisible by 8 micro-batches" \
    "... taking 16, the default 12 rounded up to 8 micro-batches, and saying so"
"$D" plan --model gpt2 --np 8 --batch 12 > "$T/w9" 2>&1
rc=$?; [ $rc -eq 2 ]; ok $? "... a --batch given that does not divide stays an error (exit $rc)"

# what fits, in the order to try: gpt2 on 8 ranks of 3.0 GiB (3.46 asked)
"$D" plan --model gpt2 --np 8 --batch 16 --device-mem 3.0 --shard none --precision fp32 > "$T/f1" 2>&1
ok $? "plan: gpt2 on 8 ranks of 3.0 GiB"
sed -n '/what fits/,$p' "$T/f1" | sed 's/^/#   /'
ok_grep "$T/f1" "^  --recompute +[0-9.]+ GiB +compute  1.33x .*<- the first to try" \
    "--recompute comes first, a third more compute"
ok_grep "$T/f1" "^  (--recompute )?--shard (optim|grads|params) " "a sharding mode is listed as well"
fits_gib() { sed -n "s/^  $1 *\([0-9.]*\) GiB.*/\1/p" "$2" | head -1; }
row_gib() { sed -n "s/^  $1 .* \([0-9.]*\)  fits\$/\1/p" "$2" | head -1; }
"$D" plan --model gpt2 --np 8 --batch 16 --device-mem 3.0 --shard none --precision fp32 --recompute > "$T/f2" 2>&1
a=$(fits_gib "--recompute" "$T/f1"); b=$(row_gib "none  *fp32" "$T/f2")
diag "--recompute: ${a:-none} GiB in the list, ${b:-none} GiB planned with the flag"
[ -n "$a" ] && [ "$a" = "$b" ]; ok $? "... its memory is the plan of the run with --recompute (${a:-none} = ${b:-none})"
awk -v a="${a:-99}" 'BEGIN { exit !(a <= 3.0) }'; ok $? "... and within the 3.0 GiB"
# pipeline stages on the same ranks, last; their memory the plan of that run (its largest stage)
p=$(sed -n 's/^  \(\(--recompute \)\{0,1\}--pipeline 2\) .*/\1/p' "$T/f1" | head -1)
[ -n "$p" ]; ok $? "pipeline stages are listed (${p:-none})"
a=$(sed -n '/what fits/,$p' "$T/f1" | grep -n -- "--pipeline" | head -1 | cut -d: -f1)
b=$(sed -n '/what fits/,$p' "$T/f1" | grep -n -- "--np 16" | head -1 | cut -d: -f1)
[ -n "$a" ] && [ -n "$b" ] && [ "$a" -gt "$b" ]; ok $? "... after more ranks (line ${a:-none} after ${b:-none})"
"$D" plan --model gpt2 --np 8 --batch 16 --device-mem 3.0 --shard none --precision fp32 $p > "$T/f5" 2>&1
a=$(fits_gib "$p" "$T/f1"); b=$(row_gib "none  *fp32" "$T/f5")
[ -n "$a" ] && [ "$a" = "$b" ]; ok $? "... its memory is the plan of the run with $p (${a:-none} = ${b:-none} GiB)"
# a stage's rank computes its share of the work (the largest stage's: the cut balances
# it, not exactly) of twice the samples, a third more with --recompute
"$D" plan --model gpt2 --np 8 --batch 16 --shard none --precision fp32 $p --json > "$T/f5j" 2>&1
x=$(grep -o '"work":[0-9.]*' "$T/f5j" | cut -d: -f2 | sort -g | tail -1)
x=$(awk -v w="${x:-0}" -v r="$(case $p in --recompute*) echo 1;; *) echo 0;; esac)" \
    'BEGIN { printf "%.2f", 2 * w * (r ? 4.0 / 3.0 : 1.0) }')
ok_grep "$T/f1" "^  $p +[0-9.]+ GiB +compute  $x" "... a stage's rank computing its share of twice the samples ($x x)"
awk -v x="$x" 'BEGIN { exit !(x >= 1.33 && x < 1.5) }'; ok $? "... the cut near even: $x x against 1.33 even"
"$D" plan --model gpt2 --np 8 --batch 16 --device-mem 3.0 --shard none --precision fp32 --pipeline 2 > "$T/f6" 2>&1
! grep -q -- "--pipeline 4" "$T/f6"; ok $? "... and none beside a pipeline asked for"
"$D" plan --model gpt2 --np 8 --batch 16 --device-mem 1.4 --shard none --precision fp32 > "$T/f4" 2>&1
ok_grep "$T/f4" "^  --recompute --shard optim --np 16 .*<- the first to try" \
    "at 1.4 GiB nothing fits on 8 ranks: --recompute --shard optim on 16 first"
"$D" plan --model "$BIG" --np 2 --batch 16 --micro-batches 16 --device-mem 16 --precision bf16 --shard none > "$T/f3" 2>&1
ok_grep "$T/f3" "^  .*--np [0-9]+ +[0-9.]+ GiB" "a model too large for 2 ranks: more ranks are listed"

# bad flags: exit 2, one line naming the flag (bad: above)
bad "no --model" "--model: required" --np 2
bad "--np 0" "--np: " --model mlp --np 0
bad "--np x" "--np: " --model mlp --np x
bad "an unknown shard mode" "--shard: expected none, optim, grads or params, got 'all'" --model mlp --shard all
bad "an unknown backward prefetch" "--backward-prefetch: expected pre or post, got 'late'" --model mlp --backward-prefetch late
bad "an unknown precision" "--precision: expected fp32, bf16 or fp16, got 'fp8'" --model mlp --precision fp8
bad "--batch 0" "--batch: " --model mlp --batch 0
bad "--device-mem -1" "--device-mem: " --model mlp --device-mem -1
bad "micro-batches the ranks cannot split" "--micro-batches: 3 is not a multiple of the world size 2" --model mlp --np 2 --micro-batches 3
bad "a batch the micro-batches cannot split" "--batch: the global batch 10 is not divisible by 4" --model mlp --batch 10 --micro-batches 4
bad "an unknown optimizer" "--optim: expected one of sgd, adamw, got 'lbfgs'" --model mlp --optim lbfgs
bad "a bad spec" "model spec" --model "linear(0)"
bad "a bad --input" "--input: expected C,H,W or F" --model mlp --input 1,2
bad "a missing data set" "" --model mlp --data /nonexistent/dir
bad "an unknown flag" "unknown flag '--bogus'" --model mlp --bogus 1
done_testing
