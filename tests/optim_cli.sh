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
done_testing
