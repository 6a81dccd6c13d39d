#!/bin/sh
# amp_train.sh: mixed precision end to end. bf16 and fp16 training, and gradients
# all-reduced in bf16, give bitwise the same weights on 1, 2 and 4 processes (batchnorm
# and dropout included); a planted overflow (the last rank finds an inf in its gradient
# at step 3) skips exactly that step on every rank and halves the loss scale, on 1 and 2
# processes, while the same inf stops an fp32 run; a run stopped and resumed with fp16
# is bitwise the uninterrupted one (the scaler's state is in the checkpoint), also on
# another world size; `dtrain check` passes in bf16; bad values exit 2.
. "${DT_SRCDIR:-$(dirname "$0")/..}/tests/tap.sh"
D="$DT_BUILDDIR/dtrain"; R="$DT_BUILDDIR/dtrun"
[ -x "$D" ] && [ -x "$R" ] || skip_all "dtrain or dtrun not built"
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
export TMPDIR="$T"
CNN="conv(4,3,pad=1) bn relu maxpool(2) dropout(0.1) flatten linear(16) relu linear(4)"
MLP="flatten linear(32) relu linear(4)"
A="--data synthetic:1024,1,8,8,4 --batch 64 --micro-batches 4 --quiet --no-eval --threads 1"
field() { sed -n "s/.*\"step\":$2,.*\"$3\":\([^,}]*\).*/\1/p" "$1" | head -1; }   # a step's JSON field

# ---- bad flags: one line, exit 2 ----
timeout 60 "$D" train $A --model "$MLP" --precision fp8 > "$T/bad1" 2>&1
[ $? -eq 2 ]; ok $? "--precision fp8 exits 2"
ok_grep "$T/bad1" "^dtrain: --precision: expected fp32, bf16 or fp16, got 'fp8'" "naming the flag and the choices"
timeout 60 "$D" train $A --model "$MLP" --grad-dtype f16 > "$T/bad2" 2>&1
[ $? -eq 2 ]; ok $? "--grad-dtype f16 exits 2"
ok_grep "$T/bad2" "^dtrain: --grad-dtype: expected f32 or bf16, got 'f16'" "naming the flag and the choices"
timeout 60 "$D" train $A --model "$MLP" --precision > "$T/bad3" 2>&1
[ $? -eq 2 ]; ok $? "--precision without a value exits 2"
timeout 60 "$D" train $A --model "$MLP" --precision BF16 > "$T/bad4" 2>&1
[ $? -eq 2 ]; ok $? "names are lower case: BF16 exits 2"

# ---- world-size invariance: 1, 2, 4 processes, the same bits ----
inv() {   # inv NAME FLAGS...: train on 1, 2 and 4 processes, compare the weights
    name=$1; shift
    timeout 180 "$D" train $A --epochs 1 --model "$CNN" "$@" --save "$T/$name.1.st" > "$T/$name.o1" 2>&1
    ok $? "$name: 1 process trains"
    for n in 2 4; do
        timeout 300 "$R" -n $n "$D" train $A --epochs 1 --model "$CNN" "$@" --save "$T/$name.$n.st" > "$T/$name.o$n" 2>&1
        ok $? "$name: $n processes train"
        cmp -s "$T/$name.1.st" "$T/$name.$n.st"; ok $? "$name: $n processes give bitwise the weights of 1"
        l1=$(sed -n 's/.*final loss \([0-9.]*\).*/\1/p' "$T/$name.o1"); ln=$(sed -n 's/.*final loss \([0-9.]*\).*/\1/p' "$T/$name.o$n")
        [ -n "$l1" ] && [ "$l1" = "$ln" ] && awk -v l="$l1" 'BEGIN { exit !(l > 0) }'
        ok $? "$name: $n processes print 1 process's final loss, not 0 (${l1:-none} / ${ln:-none})"
    done
}
inv bf16 --precision bf16
inv fp16 --precision fp16
inv gradbf16 --grad-dtype bf16
timeout 180 "$D" train $A --epochs 1 --model "$CNN" --save "$T/fp32.st" > "$T/fp32.o" 2>&1
ok $? "fp32: 1 process trains"
for p in bf16 fp16 gradbf16; do
    ! cmp -s "$T/fp32.st" "$T/$p.1.st"; ok $? "$p computes other weights than fp32"
done
ok_grep "$T/fp16.o1" "fp16 loss scaling: 0 steps skipped for inf/NaN gradients, final scale 65536" \
    "fp16 reports its scaler: nothing skipped, the initial scale"

# ---- a planted overflow: step 3 skipped on every rank, the scale halved ----
P="$A --precision fp16 --schedule constant --steps 5 --log-every 1"
overflow() {   # overflow NPROC
    if [ "$1" -eq 1 ]; then run="timeout 120 $D"; else run="timeout 180 $R -n $1 $D"; fi
    $run train $P --model "$MLP" --testing-fault grad-inf:3 --metrics "$T/of$1.jsonl" --save "$T/of$1.st" > "$T/of$1.o" 2>&1
    ok $? "$1 process(es): a run with an inf planted in the last rank's gradient at step 3 completes"
    s="$(field "$T/of$1.jsonl" 1 skipped) $(field "$T/of$1.jsonl" 2 skipped) $(field "$T/of$1.jsonl" 3 skipped) $(field "$T/of$1.jsonl" 5 skipped)"
    [ "$s" = "0 0 1 1" ]; ok $? "$1: exactly step 3 is skipped (skipped after steps 1, 2, 3, 5: $s)"
    s="$(field "$T/of$1.jsonl" 3 loss_scale) $(field "$T/of$1.jsonl" 4 loss_scale)"
    [ "$s" = "65536 32768" ]; ok $? "$1: step 3 ran at 65536, step 4 at half of it ($s)"
    ok_grep "$T/of$1.o" "1 step skipped for inf/NaN gradients, final scale 32768" "$1: the summary says so"
}
overflow 1
overflow 2
cmp -s "$T/of1.st" "$T/of2.st"; ok $? "the skip gives the same weights on 1 and 2 processes (every rank skipped)"
# a skipped step changes nothing: the weights after 3 steps, step 3 skipped, are those after 2
timeout 120 "$D" train $P --model "$MLP" --steps 2 --save "$T/two.st" > "$T/two.o" 2>&1
timeout 120 "$D" train $P --model "$MLP" --steps 3 --testing-fault grad-inf:3 --save "$T/three.st" > "$T/three.o" 2>&1
cmp -s "$T/two.st" "$T/three.st"; ok $? "the skipped step left the weights (and the momentum) as they were"
timeout 120 "$D" train $P --model "$MLP" --steps 3 --save "$T/three0.st" > "$T/three0.o" 2>&1
! cmp -s "$T/two.st" "$T/three0.st"; ok $? "while a step that is not skipped changes them"
# fp32 has no scaler: the same inf stops the job before the update
timeout 120 "$D" train $A --model "$MLP" --steps 5 --log-every 1 --testing-fault grad-inf:3 > "$T/of32.o" 2>&1
[ $? -eq 1 ]; ok $? "fp32 with the same inf stops (exit 1)"
ok_grep "$T/of32.o" "step 3: the gradient norm is (infinite|NaN); stopped before the update" "naming the step"

# ---- checkpoints: fp16 resume is exact (the scale after the overflow included) ----
C="$A --precision fp16 --epochs 2 --optim adamw --testing-fault grad-inf:4"
timeout 180 "$D" train $C --model "$CNN" --save "$T/full.st" > "$T/full.o" 2>&1
ok $? "fp16 uninterrupted run (32 steps, step 4 skipped)"
timeout 180 "$R" -n 2 "$D" train $C --model "$CNN" --checkpoint-dir "$T/ck" --checkpoint-every 5 --stop-at 10 > "$T/stop.o" 2>&1
ok $? "fp16 run on 2 processes stopped at step 10"
cp -r "$T/ck" "$T/ck2"
timeout 180 "$D" train $C --model "$CNN" --checkpoint-dir "$T/ck" --resume auto --save "$T/res.st" > "$T/res.o" 2>&1
ok $? "resumed on 1 process"
cmp -s "$T/full.st" "$T/res.st"; ok $? "the resumed fp16 run is bitwise the uninterrupted one"
ok_grep "$T/res.o" "1 step skipped for inf/NaN gradients, final scale 32768" "the scaler's state came back with it"
timeout 60 "$D" train $C --model "$CNN" --precision bf16 --checkpoint-dir "$T/ck2" --resume auto > "$T/resb.o" 2>&1
[ $? -eq 2 ]; ok $? "resuming an fp16 checkpoint in bf16 is refused (exit 2)"
ok_grep "$T/resb.o" "precision 'fp16' -> 'bf16'" "naming the change"

# ---- dtrain check proves a bf16 run ----
timeout 300 "$D" check --np 2 --data synthetic:1024,1,8,8,4 --batch 64 --model "$CNN" --precision bf16 \
    --threads 1 > "$T/check.o" 2>&1
ok $? "dtrain check --np 2 --precision bf16 passes"
ok_grep "$T/check.o" "bitwise +PASS" "its final weights are bitwise those of 1 process"
done_testing
