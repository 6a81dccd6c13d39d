#!/bin/sh
# resnet_invariance.sh: docs/DESIGN.md rule 2 on a tree model — the resnet preset
# (residual blocks, batchnorm inside them) trained with 4 micro-batches on 1, 2
# and 4 processes gives bitwise the same weights and buffers; so does a tree
# with nested containers and dropout inside a block; a checkpoint of it resumes
# bitwise on another world size; and dtrain check agrees.
. "${DT_SRCDIR:-$(dirname "$0")/..}/tests/tap.sh"
D="$DT_BUILDDIR/dtrain"; R="$DT_BUILDDIR/dtrun"
[ -x "$D" ] && [ -x "$R" ] || skip_all "dtrain or dtrun not built"
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
ARGS="--data synthetic:512,1,12,12,4 --epochs 1 --batch 64 --micro-batches 4 --quiet --no-eval"
TREE="conv(4,3,pad=1) residual(bn relu seq(conv(4,3,pad=1) dropout(0.2)) residual(relu conv(4,1))) gap linear(4)"

for model in resnet tree; do
    spec=$model; [ "$model" = tree ] && spec=$TREE
    timeout 300 "$D" train $ARGS --model "$spec" --save "$T/$model-1.st" > "$T/$model-o1" 2>&1
    ok $? "$model: 1 process, 4 micro-batches"
    for n in 2 4; do
        timeout 300 "$R" -n $n "$D" train $ARGS --model "$spec" --save "$T/$model-$n.st" > "$T/$model-o$n" 2>&1
        ok $? "$model: $n processes (tcp) train"
        cmp -s "$T/$model-1.st" "$T/$model-$n.st"
        ok $? "$model: $n processes give bitwise the weights and buffers of 1 process"
    done
done
# checkpoints of a tree: stopped on 1 process, resumed on 2, bitwise the uninterrupted run
C="--data synthetic:512,1,12,12,4 --epochs 2 --batch 64 --micro-batches 2 --quiet --no-eval"
timeout 300 "$D" train $C --model resnet --save "$T/full.st" > "$T/o.full" 2>&1
ok $? "resnet: uninterrupted run"
timeout 300 "$D" train $C --model resnet --checkpoint-dir "$T/ck" --stop-at 5 > "$T/o.stop" 2>&1
ok $? "resnet: run stopped at step 5 with a checkpoint"
timeout 300 "$R" -n 2 "$D" train $C --model resnet --checkpoint-dir "$T/ck" --resume auto --save "$T/r2.st" > "$T/o.r2" 2>&1
ok $? "resnet: resumed on 2 processes"
cmp -s "$T/full.st" "$T/r2.st"; ok $? "resnet: the resumed run is bitwise the uninterrupted one"

timeout 300 "$D" check --np 2 --model resnet --data synthetic:512,1,12,12,4 --steps 4 > "$T/check" 2>&1
ok $? "dtrain check on the resnet preset: 2 processes compute what 1 computes"
ok_grep "$T/check" "all 6 checks passed" "dtrain check runs every check on a tree model"
done_testing
