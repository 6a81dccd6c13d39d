#!/bin/sh
# ddp_invariance.sh: docs/DESIGN.md rule 2 end to end — training with S micro-batches on
# 1, 2 and 4 processes (dtrun, tcp backend) gives bitwise the same weights, batchnorm
# buffers included; and with S = 2 on 2 processes under mpirun (mpi, deterministic).
. "${DT_SRCDIR:-$(dirname "$0")/..}/tests/tap.sh"
D="$DT_BUILDDIR/dtrain"; R="$DT_BUILDDIR/dtrun"
[ -x "$D" ] && [ -x "$R" ] || skip_all "dtrain or dtrun not built"
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
ARGS="--data synthetic:1024,1,8,8,4 --epochs 1 --batch 64 --micro-batches 4 --quiet --no-eval"
CNN="conv(4,3,pad=1) bn relu maxpool(2) dropout(0.1) flatten linear(16) relu linear(4)"

timeout 120 "$D" train $ARGS --model "$CNN" --save "$T/w1.st" > "$T/o1" 2>&1
ok $? "1 process, 4 micro-batches"
for n in 2 4; do
    timeout 180 "$R" -n $n "$D" train $ARGS --model "$CNN" --save "$T/w$n.st" > "$T/o$n" 2>&1
    ok $? "$n processes (tcp) train"
    cmp -s "$T/w1.st" "$T/w$n.st"; ok $? "$n processes give bitwise the weights and buffers of 1 process"
done
# buckets of a few KiB (many buckets, launched during backward) and no overlap: same bits
timeout 180 "$R" -n 2 "$D" train $ARGS --model "$CNN" --bucket-mb 0.002 --save "$T/wb.st" > "$T/ob" 2>&1
ok $? "2 processes with 2 KiB buckets"
cmp -s "$T/w1.st" "$T/wb.st"; ok $? "many small buckets overlapped with backward give the same bits"
timeout 180 "$R" -n 2 "$D" train $ARGS --model "$CNN" --no-overlap --save "$T/wn.st" > "$T/on" 2>&1
cmp -s "$T/w1.st" "$T/wn.st"; ok $? "--no-overlap gives the same bits"
timeout 180 "$R" -n 2 "$D" train $ARGS --model "$CNN" --sync-bn --micro-batches 2 --save "$T/ws.st" > "$T/os" 2>&1
ok $? "--sync-bn trains on 2 processes (ranks verified equal at the end)"
# the reported loss is the same too
l1=$(sed -n 's/.*final loss \([0-9.]*\).*/\1/p' "$T/o1"); l4=$(sed -n 's/.*final loss \([0-9.]*\).*/\1/p' "$T/o4")
[ -n "$l1" ] && [ "$l1" = "$l4" ]; ok $? "final loss printed by 1 and 4 processes agrees ($l1 / $l4)"

if [ -n "${MPIRUN:-}" ] && [ -x "$MPIRUN" ]; then
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 DT_DETERMINISTIC=1 \
        timeout 180 "$MPIRUN" --allow-run-as-root --oversubscribe -np 2 \
        "$D" train $ARGS --model "$CNN" --backend mpi --save "$T/wm.st" > "$T/om" 2>&1
    ok $? "2 processes under mpirun (mpi backend, deterministic)"
    cmp -s "$T/w1.st" "$T/wm.st"; ok $? "mpi deterministic gives bitwise the weights of 1 process"
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 DT_DETERMINISTIC=1 \
        timeout 240 "$MPIRUN" --allow-run-as-root --oversubscribe -np 4 \
        "$D" train $ARGS --model "$CNN" --backend mpi --save "$T/wm4.st" > "$T/om4" 2>&1
    ok $? "4 processes under mpirun (mpi backend, deterministic)"
    cmp -s "$T/w1.st" "$T/wm4.st"; ok $? "4 processes over mpi give bitwise the weights of 1 process"
else
    for i in 1 2 3 4; do skip "MPI not configured"; done
fi

# --batch-per-rank and --lr-scale: global batch 2 x 32, lr 0.05 x 2 reached after a 2-step warm-up
timeout 120 "$R" -n 2 "$D" train --data synthetic:1024,1,8,8,4 --model "flatten linear(4)" --batch-per-rank 32 \
    --lr-scale linear --warmup 2 --steps 4 --log-every 1 --metrics "$T/lrs.jsonl" --quiet > "$T/olrs" 2>&1
ok $? "--batch-per-rank with --lr-scale linear and --warm-up on 2 processes"
ok_grep "$T/lrs.jsonl" '"step":1,.*"lr":0.050000' "warm-up step 1 uses half the scaled rate"
ok_grep "$T/lrs.jsonl" '"step":2,.*"lr":0.100000' "after warm-up the rate is --lr x world size"
timeout 60 "$D" train --data synthetic:1024,1,8,8,4 --lr-scale cubic > "$T/olrs2" 2>&1
[ $? -eq 2 ]; ok $? "an unknown --lr-scale exits 2"
ok_grep "$T/olrs2" "--lr-scale: expected none, linear or sqrt" "and names the choices"

# a model that differs across ranks is caught at the start, naming the parameter and the rank
timeout 60 "$R" -n 2 sh -c 'm="$1"; [ "$RANK" = 1 ] && m="$2"; shift 2; exec "$@" --model "$m"' sh \
    "$CNN" "conv(8,3,pad=1) bn relu maxpool(2) dropout(0.1) flatten linear(16) relu linear(4)" \
    "$D" train $ARGS > "$T/odiff" 2>&1
[ $? -ne 0 ]; ok $? "ranks that build different models fail"
ok_grep "$T/odiff" "parameter '0.weight' has a different name or shape on rank 1" "the error names the first differing parameter and the rank"
timeout 60 "$R" -n 2 sh -c 'm="$1"; [ "$RANK" = 1 ] && m="$2"; shift 2; exec "$@" --model "$m"' sh \
    "$CNN" "flatten linear(4)" "$D" train $ARGS > "$T/odiff2" 2>&1
[ $? -ne 0 ]; ok $? "ranks with a different number of parameters fail"
ok_grep "$T/odiff2" "the model differs across ranks: rank 0 has [0-9]+ parameter tensors" "the error says what differs"
done_testing
