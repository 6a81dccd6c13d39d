#!/bin/sh
# shard.sh: --shard optim (ZeRO-1), grads (ZeRO-2) and params (ZeRO-3) give bitwise the
# weights of --shard none on 1, 2 and 4 processes, for a conv net with batchnorm and dropout,
# the mlp preset
# (AdamW, clipping, decay on matrices: the norm and the decay runs cross shard
# boundaries), the resnet preset (SGD with momentum) and a small gpt on token data;
# a checkpoint written in one mode and world size resumes in another, bitwise the
# uninterrupted run; the optimizer state really is split; optim sums the gradients by a
# reduce-scatter on the CPU at power-of-two world sizes, by DDP's all-reduce elsewhere;
# bad values exit 2.
. "${DT_SRCDIR:-$(dirname "$0")/..}/tests/tap.sh"
D="$DT_BUILDDIR/dtrain"; R="$DT_BUILDDIR/dtrun"
[ -x "$D" ] && [ -x "$R" ] || skip_all "dtrain or dtrun not built"
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT

peak() {  # the largest "peak MiB" of the per-rank table in $T/$1.out
    awk '/peak MiB/ { on = 1; next } /now\/peak/ { on = 0 } on && NF >= 7 && $1 ~ /^[0-9]+$/ { if ($6 + 0 > m) m = $6 + 0 } END { print m + 0 }' \
        "$T/$1.out" | sed 's/^\[rank0\]://'
}
# run TAG NPROC ARGS...: train on NPROC processes, weights to $T/TAG.st
run() {
    tag=$1; n=$2; shift 2
    if [ "$n" = 1 ]; then timeout 240 "$D" train "$@" --save "$T/$tag.st" > "$T/$tag.out" 2>&1
    else timeout 240 "$R" -n "$n" "$D" train "$@" --save "$T/$tag.st" > "$T/$tag.out" 2>&1; fi
    rc=$?
    [ $rc -eq 0 ] || tail -5 "$T/$tag.out" | sed 's/^/#   /'
    return $rc
}
# same NAME WORKLOAD ARGS...: none on 1 process is the reference; every mode on 1, 2, 4,
# and params in units of about a layer (--shard-unit-mb 0.001: gathers, prefetches and
# drops at every layer) on 2 and 4
same() {
    name=$1; shift
    run "$name-ref" 1 "$@"; ok $? "$name: --shard none on 1 process"
    for mode in optim grads params; do
        for n in 1 2 4; do
            run "$name-$mode-$n" $n "$@" --shard $mode
            rc=$?
            [ $rc -eq 0 ] && cmp -s "$T/$name-ref.st" "$T/$name-$mode-$n.st"
            ok $? "$name: --shard $mode on $n process(es) gives bitwise the weights of --shard none"
        done
    done
    for n in 2 4; do
        run "$name-units-$n" $n "$@" --shard params --shard-unit-mb 0.001
        rc=$?
        [ $rc -eq 0 ] && cmp -s "$T/$name-ref.st" "$T/$name-units-$n.st"
        ok $? "$name: --shard params in layer-sized units on $n processes gives bitwise the weights of --shard none"
    done
    run "$name-post-4" 4 "$@" --shard params --shard-unit-mb 0.001 --backward-prefetch post
    rc=$?
    [ $rc -eq 0 ] && cmp -s "$T/$name-ref.st" "$T/$name-post-4.st"
    ok $? "$name: --shard params --backward-prefetch post in layer-sized units on 4 processes: the same bits"
    # the gathers in place (DT_SHARD_POOL=0: pages given back and brought again) too
    DT_SHARD_POOL=0 run "$name-inplace-2" 2 "$@" --shard params --shard-unit-mb 0.001
    rc=$?
    [ $rc -eq 0 ] && cmp -s "$T/$name-ref.st" "$T/$name-inplace-2.st"
    ok $? "$name: --shard params gathering in place (DT_SHARD_POOL=0) on 2 processes: the same bits"
}

# 1. a conv net of 82,692 parameters: 21 chunks of 4096, so shards of 45056 floats on 2
#    ranks and 24576 on 4
CNN="conv(16,3,pad=1) bn relu maxpool(2) dropout(0.1) flatten linear(256) relu linear(64) relu linear(4)"
BASE="--data synthetic:1024,1,8,8,4 --epochs 1 --batch 64 --micro-batches 4 --quiet --no-eval --threads 1"
same cnn $BASE --model "$CNN" --optim adamw --clip 0.5 --decay matrices
ok_grep "$T/cnn-optim-4.out" "shard optim: rank 0 of 4 keeps the optimizer state of 24576 of 82692 parameters" \
    "each of 4 ranks keeps the optimizer state of at most 24576 of the 82692 parameters"
ok_grep "$T/cnn-params-2.out" "shard params: rank 0 of 2 keeps the optimizer state of 45056 of 82692 parameters" \
    "each of 2 ranks keeps the optimizer state of at most 45056 of the 82692 parameters"

# 2. the mlp preset (1.86M parameters, SGD with momentum), and the resnet preset
#    (residual blocks, batchnorm)
same mlp --data synthetic:256,1,28,28,10 --model mlp --batch 32 --micro-batches 4 --steps 3 --quiet --no-eval \
    --threads 1
same resnet --data synthetic:256,1,28,28,10 --model resnet --batch 32 --micro-batches 4 --steps 3 --quiet --no-eval \
    --threads 1

# 2b. how optim sums the gradients (shard.h, dt_shard_scatter_sums): on the CPU at a
#     power-of-two world size one reduce-scatter after backward, as grads, where DDP's
#     all-reduce would also bring each rank the sums of shards it never applies; with
#     --grad-dtype bf16 and on 3 processes DDP's all-reduce, as none. The trace names
#     every collective with its element type.
sums() {  # TAG: "rs=R ar=A", the f32 reduce-scatters and the f32/bf16 all-reduces of trace TAG
    echo "rs=$(grep -o '"detail":"reduce_scatter (f32' "$T/$1.json" | wc -l) ar=$(grep -o '"detail":"all_reduce (\(f32\|bf16\)' "$T/$1.json" | wc -l)"
}
for n in 2 4; do
    run sum-optim-$n $n $BASE --model "$CNN" --optim adamw --clip 0.5 --decay matrices --shard optim \
        --trace "$T/sum-optim-$n.json"
    rc=$?
    x=$(sums sum-optim-$n)
    [ $rc -eq 0 ] && [ "${x#rs=0 }" = "$x" ] && [ "${x##* }" = ar=0 ] && cmp -s "$T/cnn-ref.st" "$T/sum-optim-$n.st"
    ok $? "--shard optim on $n processes reduce-scatters the gradients, all-reduces none ($x), clips by the norm of the shards' chunk sums, with the bits of none"
done
run sum-none 2 $BASE --model "$CNN" --trace "$T/sum-none.json"
rc=$?
x=$(sums sum-none)
[ $rc -eq 0 ] && [ "${x%% *}" = rs=0 ] && [ "${x##* }" != ar=0 ]
ok $? "--shard none on 2 processes all-reduces them ($x)"
run sum-bf16 2 $BASE --model "$CNN" --shard optim --grad-dtype bf16 --trace "$T/sum-bf16.json"
rc=$?
x=$(sums sum-bf16)
[ $rc -eq 0 ] && [ "${x%% *}" = rs=0 ] && grep -q '"detail":"all_reduce (bf16' "$T/sum-bf16.json"
ok $? "--shard optim --grad-dtype bf16 keeps DDP's all-reduce in bf16 ($x)"
B3="--data synthetic:1026,1,8,8,4 --epochs 1 --batch 54 --micro-batches 3 --quiet --no-eval --threads 1 --model"
run sum-optim-3 3 $B3 "$CNN" --shard optim --trace "$T/sum-optim-3.json"
rc=$?
x=$(sums sum-optim-3)
run sum-none-3 3 $B3 "$CNN"
[ $? -eq 0 ] && [ $rc -eq 0 ] && [ "${x%% *}" = rs=0 ] && [ "${x##* }" != ar=0 ] && cmp -s "$T/sum-none-3.st" "$T/sum-optim-3.st"
ok $? "--shard optim on 3 processes all-reduces ($x), bitwise the weights of none on 3"

# 3. a small gpt on token data (tied embedding, attention, dropout)
awk 'BEGIN { for (i = 0; i < 200; i++) printf "line %d: pack my box with five dozen liquor jugs.\n", i % 13 }' > "$T/text.txt"
timeout 60 "$D" prepare-text "$T/tok" "$T/text.txt" > "$T/prep.out" 2>&1
ok $? "prepare-text writes the token files"
same gpt --model "gpt(layers=2,heads=2,dim=32,block=16,dropout=0.1)" --data "tokens:$T/tok" --batch 8 \
    --micro-batches 4 --steps 4 --warmup 1 --quiet --threads 1 --eval-batches 1
# with --recompute a block's forward runs again inside backward: its parameters are gathered for it
# (with --backward-prefetch post, dropped after it and gathered again for backward)
for n in 2 4; do
    for pf in pre post; do
        run gpt-rc-$pf-$n $n --model "gpt(layers=2,heads=2,dim=32,block=16,dropout=0.1)" --data "tokens:$T/tok" \
            --batch 8 --micro-batches 4 --steps 4 --warmup 1 --quiet --threads 1 --eval-batches 1 --shard params \
            --recompute --shard-unit-mb 0.001 --backward-prefetch $pf
        rc=$?
        [ $rc -eq 0 ] && cmp -s "$T/gpt-ref.st" "$T/gpt-rc-$pf-$n.st"
        ok $? "gpt: --shard params --recompute --backward-prefetch $pf on $n processes gives bitwise the weights of --shard none"
    done
done

# 3a. with --recompute at most one block's parameters are gathered at a time: the
#    recomputed forward fetches the block's next unit, and the unit before the block only
#    once backward reaches it; evaluation (after each step here) gathers unit by unit as
#    training does (the accounting counts what lies outside the rank's shard; the
#    largest of peak less shard over the ranks is two units of at most 4 C^2 + 22 C floats,
#    the tied embedding aside, not a block of 12 C^2 + 13 C: the row closing a block drops
#    the unit it shares with the next block before the block's units are gathered again)
#    These bounds are those of the gathers in place (DT_SHARD_POOL=0); the pool's follow.
DT_SHARD_POOL=0 run gpt-fl 2 --model "gpt(layers=4,heads=2,dim=256,block=16)" --data "tokens:$T/tok" --batch 4 --steps 2 --warmup 1 \
    --threads 1 --eval-every 1 --eval-batches 2 --shard params --recompute --shard-unit-mb 0.25 --rank-stats 2
ok $? "gpt: 4 blocks of 256 wide train and evaluate with --shard params --recompute in layer-sized units"
shard=$(sed -n 's/.*keeps the optimizer state of \([0-9]*\) of.*/\1/p' "$T/gpt-fl.out" | head -1)
fl=$(sed 's/^\[rank0\]://' "$T/gpt-fl.out" | awk -v s="${shard:-0}" '/now\/peak \(accounted\)/ { on = 1; next }
    on && $1 ~ /^[0-9]+$/ { split($2, a, "/"); d = a[2] - s * 4 / 1048576; if (d > m) m = d } END { printf "%.2f", m }')
U=$(( (4 * 256 * 256 + 22 * 256) * 4 )); TIED=$(( 256 * 256 * 4 ))
awk -v f="$fl" -v u="$U" -v e="$TIED" 'BEGIN { exit !(f > u / 1048576 && f <= 1.1 * (2 * u + e) / 1048576) }'
ok $? "--shard params --recompute holds at most two units of parameters beyond the shard, evaluating too ($fl MiB; a unit is 1.02 MiB, a block 3.01)"
run gpt-fl-none 2 --model "gpt(layers=4,heads=2,dim=256,block=16)" --data "tokens:$T/tok" --batch 4 --steps 2 \
    --warmup 1 --threads 1 --eval-every 1 --eval-batches 2
ok $? "and the same run without sharding"
vals() { sed -n 's/.*val loss \([0-9.]*\).*/\1/p' "$T/$1.out" | tr '\n' ' '; }
[ -n "$(vals gpt-fl)" ] && [ "$(vals gpt-fl)" = "$(vals gpt-fl-none)" ]
ok $? "its validation losses are those of --shard none ($(vals gpt-fl))"
# 3a''. parameters and gradients together beyond the shard (the largest of peak less
#    end-of-step total over the ranks, all categories): --backward-prefetch pre holds the
#    unit backward runs, the one before it and the gradient being summed, three units;
#    post two (the tied embedding aside: the head starts its gradient, which is final
#    only after the embedding's backward, at the end). The largest unit is the position
#    table and the first attention, 4 C^2 + 22 C.
DT_SHARD_POOL=0 run gpt-fl-post 2 --model "gpt(layers=4,heads=2,dim=256,block=16)" --data "tokens:$T/tok" --batch 4 --steps 2 \
    --warmup 1 --threads 1 --eval-every 1 --eval-batches 2 --shard params --recompute --shard-unit-mb 0.25 \
    --rank-stats 2 --backward-prefetch post
ok $? "the same run with --backward-prefetch post"
extra() { sed 's/^\[rank0\]://' "$T/$1.out" | awk '/now\/peak \(accounted\)/ { on = 1; next }
    on && $1 ~ /^[0-9]+$/ { split($NF, a, "/"); d = a[2] - a[1]; if (d > m) m = d } END { printf "%.2f", m }'; }
xpre=$(extra gpt-fl); xpost=$(extra gpt-fl-post)
awk -v x="$xpost" -v u="$U" -v e="$TIED" 'BEGIN { exit !(x > 0 && x <= 1.1 * (2 * u + e) / 1048576) }'
ok $? "--backward-prefetch post: two units at most beyond the shard ($xpost MiB; a unit is 1.02 MiB)"
awk -v p="$xpre" -v x="$xpost" -v u="$U" 'BEGIN { exit !(p >= x + 0.5 * u / 1048576 && p <= 1.1 * 3 * u / 1048576 + 0.3) }'
ok $? "--backward-prefetch pre: a unit more ($xpre MiB)"
[ -n "$(vals gpt-fl-post)" ] && [ "$(vals gpt-fl-post)" = "$(vals gpt-fl-none)" ] && cmp -s "$T/gpt-fl.st" "$T/gpt-fl-post.st"
ok $? "with the validation losses and the weights of pre"
# 3a''''. the pool (the default): units and gradients gathered into reused slots of the
#    largest unit's size. With post it holds two, what the gathers in place hold beyond
#    the shard (a slot is the largest unit, in place a unit takes its own size); with pre as many as are in use at once (here the running unit, the one
#    before it arriving, the unit's gradient and the one being summed): the same bits,
#    and the accounted peaks (total, the largest rank) against the gathers in place
peak_total() { sed 's/^\[rank0\]://' "$T/$1.out" | awk '/now\/peak \(accounted\)/ { on = 1; next }
    on && $1 ~ /^[0-9]+$/ { split($NF, a, "/"); if (a[2] > m) m = a[2] } END { printf "%.2f", m }'; }
for pf in pre post; do
    run gpt-fl-pool-$pf 2 --model "gpt(layers=4,heads=2,dim=256,block=16)" --data "tokens:$T/tok" --batch 4 \
        --steps 2 --warmup 1 --threads 1 --eval-every 1 --eval-batches 2 --shard params --recompute \
        --shard-unit-mb 0.25 --rank-stats 2 --backward-prefetch $pf
    ok $? "the same run gathering into the pool, --backward-prefetch $pf"
    [ -n "$(vals gpt-fl-pool-$pf)" ] && [ "$(vals gpt-fl-pool-$pf)" = "$(vals gpt-fl-none)" ] &&
        cmp -s "$T/gpt-fl.st" "$T/gpt-fl-pool-$pf.st"
    ok $? "with the validation losses and the weights of the gathers in place"
done
inpre=$(peak_total gpt-fl); inpost=$(peak_total gpt-fl-post); ppre=$(peak_total gpt-fl-pool-pre); ppost=$(peak_total gpt-fl-pool-post)
awk -v p="$ppost" -v i="$inpost" -v u="$U" 'BEGIN { exit !(p > 0 && p <= i + 0.5 * u / 1048576) }'
ok $? "the pool with post peaks within half a unit of the gathers in place (slots of the largest unit: $ppost MiB against $inpost)"
awk -v p="$ppre" -v i="$inpre" -v u="$U" 'BEGIN { exit !(p > i && p <= i + 2 * u / 1048576 + 0.05) }'
ok $? "with pre by at most two units more ($ppre MiB against $inpre; a unit is 1.02 MiB)"

# 3a'''. the tied embedding's two uses (the embedding's unit and the head's) gathered
#    together, as forward prefetches the second while the first runs in this 2-unit
#    model: its pages count once, so no rank's parameters ever count more than the whole
#    (padded) array, 2 x 12288 floats (they used to, by the embedding's 32 KiB)
DT_SHARD_POOL=0 timeout 120 "$R" -n 2 "$D" train --model "gpt(layers=1,heads=2,dim=32,block=16)" --data "tokens:$T/tok" --batch 4 \
    --steps 2 --warmup 1 --threads 1 --no-eval --shard params --shard-unit-mb 0.04 --rank-stats 1 \
    --metrics "$T/tied.jsonl" > "$T/tied.out" 2>&1
ok $? "a 1-layer gpt in two units, both holding the tied embedding, trains with --shard params"
per=$(sed -n 's/.*keeps the optimizer state of \([0-9]*\) of.*/\1/p' "$T/tied.out" | head -1)
tp=$(sed -n 's/.*"mem_peak_bytes":{"params":\([0-9]*\).*/\1/p' "$T/tied.jsonl" | sort -n | tail -1)
[ -n "$per" ] && [ -n "$tp" ] && [ "$tp" -gt 0 ] && [ "$tp" -le $((2 * per * 4)) ]
ok $? "its accounted parameters peak at most at the whole array ($tp bytes; the array is $((2 * ${per:-0} * 4)))"

# 3a'. a test split of 10 samples on 4 ranks of 2 samples a batch: shares of 2, 3, 2, 3,
#    so ranks 0 and 2 finish after one forward where 1 and 3 take two; with --shard params
#    every forward gathers from all ranks, so all run two (ending with an idle one)
SMALL="--data synthetic:64,1,8,8,4,10 --batch 8 --micro-batches 4 --steps 2 --threads 1"
run ev-ref 1 $SMALL --model "flatten linear(16) relu linear(4)"
ok $? "a model with a test split of 10 samples trains on 1 process"
run ev-params 4 $SMALL --model "flatten linear(16) relu linear(4)" --shard params --shard-unit-mb 0.00001
ok $? "and on 4 processes with --shard params, evaluating shares of unequal batch counts"
acc() { sed -n 's/.*\(test accuracy [0-9.]*\).*/\1/p' "$T/$1.out"; }
[ -n "$(acc ev-ref)" ] && [ "$(acc ev-ref)" = "$(acc ev-params)" ] && cmp -s "$T/ev-ref.st" "$T/ev-params.st"
ok $? "with the test accuracy and the weights of 1 process ($(acc ev-params))"

# 3b. mixed precision: the loss scaler decides from each rank's shard together, bf16
#    rounds the same operands; every mode keeps the bits of none
for p in bf16 fp16; do
    run prec-$p-ref 1 $BASE --model "$CNN" --optim adamw --clip 0.5 --precision $p
    for mode in optim grads params; do
        run prec-$p-$mode 4 $BASE --model "$CNN" --optim adamw --clip 0.5 --precision $p --shard $mode
        rc=$?
        [ $rc -eq 0 ] && cmp -s "$T/prec-$p-ref.st" "$T/prec-$p-$mode.st"
        ok $? "--precision $p --shard $mode on 4 processes gives bitwise the weights of 1 process without sharding"
    done
done
# the gpt in bf16: its tied embedding is read as stored by the embedding and rounded by
#    the head. The pool rounds each layer's own copy of its ranges in place, where they
#    were gathered (the whole model in one unit, layer-sized units, recompute with post);
#    the gathers in place round into a copy of the flat array
GPT="gpt(layers=2,heads=2,dim=32,block=16,dropout=0.1)"
GB="--data tokens:$T/tok --batch 8 --micro-batches 4 --steps 4 --warmup 1 --quiet --threads 1 --eval-batches 1 --precision bf16"
run gpt-bf16-ref 1 --model "$GPT" $GB
for v in "2 one-unit 64" "4 units 0.001" "2 recompute-post 0.001 --recompute --backward-prefetch post"; do
    set -- $v
    np=$1 kind=$2 mb=$3; shift 3
    run gpt-bf16-$kind $np --model "$GPT" $GB --shard params --shard-unit-mb $mb "$@"
    rc=$?
    [ $rc -eq 0 ] && cmp -s "$T/gpt-bf16-ref.st" "$T/gpt-bf16-$kind.st"
    ok $? "gpt in bf16: --shard params ($kind, $np processes) gives bitwise the weights of 1 process without sharding"
done
DT_SHARD_POOL=0 run gpt-bf16-inplace 2 --model "$GPT" $GB --shard params --shard-unit-mb 0.001
rc=$?
[ $rc -eq 0 ] && cmp -s "$T/gpt-bf16-ref.st" "$T/gpt-bf16-inplace.st"
ok $? "gpt in bf16: --shard params gathering in place (DT_SHARD_POOL=0): the same bits"
# ... and no rounded copy of the whole model on any rank (3.2M parameters: 12.3 MiB in
#    f32): the accounted parameters of bf16 are those of fp32 within one unit (the units
#    of a rank's own shard take a slot too, to be rounded there), its peak resident memory
#    within a third of such a copy
for p in fp32 bf16; do
    run lp-mem-$p 2 --model "gpt(layers=4,heads=2,dim=256,block=16)" --data "tokens:$T/tok" --batch 4 --steps 2 \
        --warmup 1 --threads 1 --eval-every 1 --eval-batches 2 --shard params --rank-stats 2 --precision $p
    ok $? "a gpt of 3.2M parameters trains with --shard params in $p"
    sed -i 's/^\[rank0\]://' "$T/lp-mem-$p.out"
done
cat_peak() {  # the largest peak of accounted category column $2 over the ranks in $T/$1.out
    awk -v c="$2" '/now\/peak \(accounted\)/ { on = 1; next } on && $1 ~ /^[0-9]+$/ { split($c, a, "/"); if (a[2] > m) m = a[2] }
        END { print m + 0 }' "$T/$1.out"
}
p32=$(cat_peak lp-mem-fp32 2); p16=$(cat_peak lp-mem-bf16 2)
awk -v a="$p32" -v b="$p16" 'BEGIN { exit !(a > 0 && b <= a + 1.1) }'
ok $? "bf16 --shard params: accounted parameters within a unit of fp32's ($p16 against $p32 MiB)"
r32=$(peak lp-mem-fp32); r16=$(peak lp-mem-bf16)
if [ -n "${DT_SANITIZED:-}" ]; then
    skip "bf16 --shard params: peak resident memory against fp32's: a sanitizer build's shadow memory is in its figures"
else
    awk -v a="$r32" -v b="$r16" 'BEGIN { exit !(a > 0 && b <= a + 12.3 / 3) }'
    ok $? "bf16 --shard params: peak resident memory within a third of a full copy of fp32's ($r16 against $r32 MiB)"
fi
run gd 2 $BASE --model "$CNN" --shard params --grad-dtype bf16
[ $rc -ne 0 ] && grep -q "bf16 gradients go with --shard none or optim" "$T/gd.out"
ok $? "--grad-dtype bf16 with --shard params is refused, saying which modes take it"

# 4. a checkpoint written by 4 ranks sharding parameters resumes on 2 ranks sharding the
#    optimizer, and one written without sharding resumes on 4 ranks sharding parameters
run ck-a 4 $BASE --model "$CNN" --optim adamw --clip 0.5 --decay matrices --shard params --checkpoint-dir "$T/ck1" --stop-at 7
ok $? "4 processes with --shard params stop at step 7 with a checkpoint"
run ck-b 2 $BASE --model "$CNN" --optim adamw --clip 0.5 --decay matrices --shard optim --checkpoint-dir "$T/ck1" --resume auto
ok_grep "$T/ck-b.out" "resumed from .*step 7" "2 processes with --shard optim resume it"
cmp -s "$T/cnn-ref.st" "$T/ck-b.st"; ok $? "the resumed run is bitwise the uninterrupted one"
run ck-c 1 $BASE --model "$CNN" --optim adamw --clip 0.5 --decay matrices --checkpoint-dir "$T/ck2" --stop-at 5
ok $? "1 process without sharding stops at step 5 with a checkpoint"
run ck-d 4 $BASE --model "$CNN" --optim adamw --clip 0.5 --decay matrices --shard params --checkpoint-dir "$T/ck2" --resume auto
ok_grep "$T/ck-d.out" "resumed from .*step 5" "4 processes with --shard params resume it"
cmp -s "$T/cnn-ref.st" "$T/ck-d.st"; ok $? "the resumed run is bitwise the uninterrupted one"

# 5. sharded checkpoints: a sharded run writes one file per rank and a manifest; they
#    resume on 1 process without sharding, bitwise; a damaged shard makes the whole
#    checkpoint invalid (the one before is taken); `dtrain export` gives the whole model.
run sc 4 $BASE --model "$CNN" --optim adamw --clip 0.5 --decay matrices --shard params --checkpoint-dir "$T/ck3" \
    --checkpoint-every 8
ok $? "4 processes with --shard params write checkpoints at steps 8 and 16"
n=$(ls "$T/ck3/step-000000000008" | grep -c '^shard-0000[0-3]-of-00004.safetensors$')
[ "$n" = 4 ]; ok $? "the checkpoint holds one shard file per rank ($n)"
cmp -s "$T/cnn-ref.st" "$T/sc.st"; ok $? "the sharded run with checkpoints still gives the reference weights"
timeout 60 "$D" export "$T/ck3" -o "$T/export.st" > "$T/export.out" 2>&1
ok $? "dtrain export writes the whole model of the newest sharded checkpoint"
same_tensors() {  # FILE FILE: the same tensor names, dtypes, shapes and bytes
    python3 - "$1" "$2" <<'PY'
import json, struct, sys
def load(p):
    raw = open(p, 'rb').read(); n = struct.unpack('<Q', raw[:8])[0]
    h = json.loads(raw[8:8 + n]); d = raw[8 + n:]
    return {k: (v['dtype'], v['shape'], d[v['data_offsets'][0]:v['data_offsets'][1]]) for k, v in h.items() if k != '__metadata__'}
a, b = load(sys.argv[1]), load(sys.argv[2])
sys.exit(0 if a == b and a else 1)
PY
}
same_tensors "$T/export.st" "$T/sc.st"; ok $? "the exported tensors are those the run saved, bit for bit"
cp -r "$T/ck3" "$T/ck4"
run sr 1 $BASE --model "$CNN" --optim adamw --clip 0.5 --decay matrices --checkpoint-dir "$T/ck3" \
    --resume "$T/ck3/step-000000000008"
ok_grep "$T/sr.out" "resumed from .*step 8" "1 process without sharding resumes the sharded checkpoint of step 8"
cmp -s "$T/cnn-ref.st" "$T/sr.st"; ok $? "and ends bitwise on the reference weights"
printf 'X' | dd of="$T/ck4/step-000000000016/shard-00002-of-00004.safetensors" bs=1 seek=200 conv=notrunc 2>/dev/null
run sd 2 $BASE --model "$CNN" --optim adamw --clip 0.5 --decay matrices --shard grads --checkpoint-dir "$T/ck4" \
    --resume auto
ok_grep "$T/sd.out" "resumed from .*step 8\).*skipped: .*step-000000000016.*shard-00002-of-00004" \
    "a flipped byte in one shard of step 16: resume takes step 8 and says why"
cmp -s "$T/cnn-ref.st" "$T/sd.st"; ok $? "and ends bitwise on the reference weights"
timeout 60 "$D" export "$T/nowhere" -o "$T/x.st" > "$T/bad1.out" 2>&1
[ $? -eq 2 ]; ok $? "export of a missing checkpoint exits 2"
timeout 60 "$D" export "$T/ck3" > "$T/bad2.out" 2>&1
[ $? -eq 2 ]; ok $? "export without -o exits 2"
ok_grep "$T/bad2.out" "expected a checkpoint and -o FILE" "and says what it needs"

# 6. memory: a 32-layer MLP of 33.6M parameters (small activations) on 4 processes with
#    AdamW. A rank's state is its peak resident memory less that of the same run with a
#    one-layer model (libraries, buffers); shared-memory rings are off (DT_SHM_BUDGET=1),
#    as they are communication buffers, not state, and params talks to more peers. With
#    --shard params the state must be at most 30% of --shard none's (ideal 25%: the
#    units gathered around the running one are the rest).
DEEP="flatten $(i=0; while [ $i -lt 32 ]; do printf 'linear(1024) relu '; i=$((i + 1)); done)linear(4)"
MEM="--data synthetic:256,1,8,8,4 --batch 16 --steps 2 --optim adamw --no-eval --threads 1 --rank-stats 2"
for mode in none params; do
    DT_SHM_BUDGET=1 timeout 300 "$R" -n 4 "$D" train $MEM --model "$DEEP" --shard $mode > "$T/mem-$mode.out" 2>&1
    ok $? "the 32-layer MLP trains on 4 processes with --shard $mode"
    DT_SHM_BUDGET=1 timeout 120 "$R" -n 4 "$D" train $MEM --model "flatten linear(4)" --shard $mode \
        > "$T/mem0-$mode.out" 2>&1
    ok $? "a one-layer model trains on 4 processes with --shard $mode (the baseline)"
done
sed -i 's/^\[rank0\]://' "$T"/mem*.out
full=$(awk -v a="$(peak mem-none)" -v b="$(peak mem0-none)" 'BEGIN { print a - b }')
part=$(awk -v a="$(peak mem-params)" -v b="$(peak mem0-params)" 'BEGIN { print a - b }')
if [ -n "${DT_SANITIZED:-}" ]; then   # ASan here: 179 against 568 MiB; the same build without it: 138 against 501
    skip "--shard params keeps at most 30% of --shard none's state per rank: a sanitizer build's shadow memory" \
         "(1/8 of each array's whole address range, the parameters' and gradients' too, resident in every mode) is in its figures"
else
    awk -v f="$full" -v p="$part" 'BEGIN { exit !(f > 400 && p > 0 && p <= 0.30 * f) }'
    ok $? "--shard params keeps at most 30% of --shard none's state per rank ($part MiB against $full MiB)"
fi

# 6b. dtrain plan against the accounted peak of an 8-layer MLP on 4 processes, every mode
MLP8="flatten $(i=0; while [ $i -lt 8 ]; do printf 'linear(1024) relu '; i=$((i + 1)); done)linear(4)"
#    (and --shard params in bf16: its units rounded where they were gathered)
for v in "optim fp32" "grads fp32" "params fp32" "params bf16"; do
    set -- $v
    mode=$1 prec=$2
    timeout 120 "$R" -n 4 "$D" train $MEM --model "$MLP8" --shard $mode --precision $prec \
        --metrics "$T/pl-$mode-$prec.jsonl" > "$T/pl-$mode-$prec.out" 2>&1
    ok $? "the 8-layer MLP trains with --shard $mode in $prec (accounted)"
    got=$(sed 's/^\[rank0\]://' "$T/pl-$mode-$prec.out" | awk '/now\/peak \(accounted\)/ { on = 1; next }
        on && $1 ~ /^[0-9]+$/ { split($NF, a, "/"); if (a[2] > m) m = a[2] } END { print m + 0 }')
    want=$(timeout 60 "$D" plan --model "$MLP8" --np 4 --shard $mode --precision $prec --input 1,8,8 --batch 16 \
        --optim adamw --no-eval 2>&1 | awk -v m=$mode -v p=$prec '$1 == m && $2 == p { print $9 }')
    awk -v g="$got" -v w="$want" 'BEGIN { exit !(g > 0 && w > 0 && w <= 1.1 * g && w >= 0.9 * g) }'
    ok $? "dtrain plan --shard $mode --precision $prec: $want MiB per rank, within 10% of the accounted peak $got MiB"
done
# with params, the optimizer state and the gradient shard are given back before the
# end-of-run gather of the whole model: none at the end, their shards at the peak
for cat in optim grads; do
    sed 's/^\[rank0\]://' "$T/pl-params-fp32.out" | awk -v c=$cat '/memory of rank 0 \(accounted\)/ { on = 1; next }
        on && $1 == c { found = 1; exit !($2 == 0 && $3 > 0) } END { if (!found) exit 1 }'
    ok $? "--shard params gives back its $cat before gathering the whole model at the end"
done
# ... which rank 0 alone receives: the others end with their shard (a quarter)
endp() { sed -n "s/.*\"event\":\"memory\",\"step\":[0-9]*,\"rank\":$1,\"mem_bytes\":{\"params\":\([0-9]*\).*/\1/p" "$T/pl-params-fp32.jsonl"; }
r0=$(endp 0); big=0
for r in 1 2 3; do awk -v a="$(endp $r)" -v b="$r0" 'BEGIN { exit !(a > 0 && b > 0 && a <= 0.3 * b) }' || big=1; done
[ $big -eq 0 ]; ok $? "--shard params: only rank 0 holds the whole model at the end (parameters, bytes: $r0 on rank 0; $(endp 1) $(endp 2) $(endp 3) on ranks 1-3)"

# 7. bad input
timeout 60 "$D" train $BASE --model "$CNN" --shard params --shard-unit-mb 0 > "$T/bad0.out" 2>&1
[ $? -eq 2 ]; ok $? "--shard-unit-mb 0 exits 2"
timeout 60 "$D" train $BASE --model "$CNN" --shard params3 > "$T/bad.out" 2>&1
[ $? -eq 2 ]; ok $? "an unknown --shard exits 2"
ok_grep "$T/bad.out" "--shard: expected none, optim, grads or params, got 'params3'" "and names the choices"
timeout 60 "$D" train $BASE --model "$CNN" --shard params --backward-prefetch late > "$T/badpf.out" 2>&1
[ $? -eq 2 ]; ok $? "an unknown --backward-prefetch exits 2"
ok_grep "$T/badpf.out" "--backward-prefetch: expected pre or post, got 'late'" "and names the choices"
DT_SHARD_POOL=yes timeout 120 "$R" -n 2 "$D" train $BASE --model "$CNN" --shard params > "$T/badpool.out" 2>&1
[ $? -eq 2 ]; ok $? "DT_SHARD_POOL=yes exits 2"
ok_grep "$T/badpool.out" "DT_SHARD_POOL='yes': expected 0 or 1" "and names the variable and its values"
done_testing
