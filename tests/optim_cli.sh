#!/bin/sh
# optim_cli.sh: the optimizer rows as `dtrain train` shows them — --help lists every
# row, an unknown --optim names the valid ones, each row trains and checkpoints under
# its own name, and a resume with another optimizer than the checkpoint's is refused
# with a message naming both.
. "${DT_SRCDIR:-$(dirname "$0")/..}/tests/tap.sh"
D="$DT_BUILDDIR/dtrain"
[ -x "$D" ] || skip_all "dtrain not built"
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
C="--data synthetic:512,1,4,4,2 --model mlp --batch 64 --quiet --no-eval"
run() { timeout 120 "$D" "$@"; }

run train --help > "$T/help" 2>&1; ok $? "train --help exits 0"
ok_grep "$T/help" "^    sgd +SGD with momentum" "--help lists sgd with its help line"
ok_grep "$T/help" "^    adamw +Adam with decoupled weight decay" "--help lists adamw with its help line"
ok_grep "$T/help" "defaults: --lr 0.001 --weight-decay 0.01" "--help shows a row's defaults"

run train $C --steps 1 --optim lion > "$T/o.bad" 2>&1
[ $? -eq 2 ]; ok $? "an unknown --optim exits 2"
ok_grep "$T/o.bad" "--optim: expected one of sgd, adamw, got 'lion'" "the error lists the valid optimizers"

for o in sgd adamw; do
    run train $C --steps 6 --stop-at 3 --optim $o --checkpoint-dir "$T/$o" --checkpoint-every 3 > "$T/o.$o" 2>&1
    ok $? "$o trains and checkpoints"
    # the metadata is JSON text in the header of train_state.safetensors
    grep -aq "\"dtrain.optimizer\":\"$o\"" "$T/$o/step-000000000003/train_state.safetensors"
    ok $? "the $o checkpoint records the optimizer as '$o'"
done

run train $C --steps 6 --optim sgd --checkpoint-dir "$T/adamw" --resume auto > "$T/o.mix" 2>&1
[ $? -ne 0 ]; ok $? "resuming an adamw checkpoint with --optim sgd fails"
ok_grep "$T/o.mix" "checkpoint .*/adamw/step-000000000003 was written by optimizer 'adamw'; this run uses 'sgd'" \
    "the error names the checkpoint and both optimizers"
run train $C --steps 6 --optim adamw --checkpoint-dir "$T/sgd" --resume auto > "$T/o.mix2" 2>&1
[ $? -ne 0 ]; ok $? "resuming an sgd checkpoint with --optim adamw fails"
ok_grep "$T/o.mix2" "written by optimizer 'sgd'; this run uses 'adamw'" "... naming both the other way round"
run train $C --steps 6 --optim adamw --checkpoint-dir "$T/adamw" --resume auto > "$T/o.same" 2>&1
ok $? "resuming with the checkpoint's own optimizer works"
# the hyper-parameters the rows have are flags too: the PyTorch defaults spelled out give
# the same bytes as leaving them out, other values another run; bad values exit 2
run train $C --epochs 1 --optim adamw --save "$T/a0.st" > /dev/null 2>&1
run train $C --epochs 1 --optim adamw --betas 0.9,0.999 --eps 1e-8 --save "$T/a1.st" > /dev/null 2>&1
cmp -s "$T/a0.st" "$T/a1.st"; ok $? "--betas 0.9,0.999 --eps 1e-8 are AdamW's defaults"
run train $C --epochs 1 --optim adamw --betas 0.8,0.95 --save "$T/a2.st" > /dev/null 2>&1
! cmp -s "$T/a0.st" "$T/a2.st"; ok $? "--betas 0.8,0.95 trains another way"
run train $C --epochs 1 --optim adamw --eps 1e-3 --save "$T/a3.st" > /dev/null 2>&1
! cmp -s "$T/a0.st" "$T/a3.st"; ok $? "--eps 1e-3 trains another way"
run train $C --epochs 1 --save "$T/s0.st" > /dev/null 2>&1
run train $C --epochs 1 --dampening 0.5 --save "$T/s1.st" > /dev/null 2>&1
! cmp -s "$T/s0.st" "$T/s1.st"; ok $? "--dampening 0.5 trains another way"
for bad in "--betas 0.9" "--betas 1,0.9" "--betas 0.9,x" "--eps -1" "--dampening 2"; do
    run train $C --epochs 1 --optim adamw $bad > "$T/bad" 2>&1; rc=$?
    [ $rc -eq 2 ]; ok $? "$bad: exit 2 (got $rc)"
done
ok_grep "$T/bad" "^dtrain: --dampening: expected a value in" "the message names the flag"
run train $C --epochs 1 --nesterov --dampening 0.5 > "$T/nd" 2>&1; rc=$?
[ $rc -eq 2 ]; ok $? "Nesterov with dampening is refused as PyTorch refuses it (got $rc)"
done_testing
