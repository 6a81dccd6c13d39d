#!/bin/sh
# check_planted.sh: `dtrain check` passes on the correct trainer and catches each
# planted bug (dtrain train's hidden flag --testing-fault, see src/testing.h) in the
# check that should catch it, with the detail a user needs: a sampler that ignores
# the epoch (epoch order), a skipped gradient all-reduce (loss curve from step 2,
# bitwise), a learning rate that differs on rank 1 (ranks agree, naming the
# parameter). Also: N not a power of two (tolerance rule), the separate epoch-order
# run, a run that hangs (killed at --timeout) and bad flags (exit 2, one line).
. "${DT_SRCDIR:-$(dirname "$0")/..}/tests/tap.sh"
D="$DT_BUILDDIR/dtrain"; R="$DT_BUILDDIR/dtrun"
[ -x "$D" ] && [ -x "$R" ] || skip_all "dtrain or dtrun not built"
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
export TMPDIR="$T"   # check's run directories land here, so the test sees what is left
DATA="--data synthetic:1024,1,8,8,4 --batch 64"
CNN="conv(4,3,pad=1) bn relu maxpool(2) flatten linear(4)"
row() { grep -E "^$1 +$2 " "$T/out"; }   # a table row with its result

# correct code: every check passes, nothing is left behind
timeout 120 "$D" check --np 2 $DATA --model "$CNN" > "$T/out" 2>&1
ok $? "check --np 2 passes on the correct trainer"
n=$(grep -cE '^[a-z][a-z ]+ +PASS ' "$T/out"); [ "$n" -eq 6 ]; ok $? "six checks PASS ($n)"
ok_grep "$T/out" 'loss curve +PASS +17 steps, every loss bitwise equal \(bitwise: 2 is a power of two\)' \
    "the loss curve is bitwise over 17 steps (one epoch of 16 + 1) and says which rule"
ok_grep "$T/out" 'epoch order +PASS .*epoch 1' "the runs cross an epoch boundary and epoch 1 draws new batches"
[ -z "$(ls -d "$T"/dtrain-check-* 2>/dev/null)" ]; ok $? "the runs' directory is removed after a pass"

# planted: the sampler forgets the epoch -> only the epoch-order check fails
timeout 120 "$D" check --np 2 $DATA --testing-fault sampler-epoch --model "$CNN" > "$T/out" 2>&1
ok $([ $? -eq 1 ] && echo 0 || echo 1) "sampler-epoch: check exits 1"
row "epoch order" FAIL > /dev/null; ok $? "sampler-epoch: epoch order FAILs"
ok_grep "$T/out" "epoch order +FAIL +epoch 1 repeats epoch 0's batches .*the sampler ignores the epoch" \
    "sampler-epoch: the detail says the order repeats every epoch"
n=$(grep -cE '^[a-z][a-z ]+ +PASS ' "$T/out"); [ "$n" -eq 5 ]; ok $? "sampler-epoch: the other five checks pass ($n)"
dir=$(sed -n "s/.*the runs' output is in \(.*\)$/\1/p" "$T/out" | head -1)
[ -n "$dir" ] && [ -s "$dir/np2.log" ] && [ -s "$dir/np1.jsonl" ]; ok $? "the failure names the runs' directory ($dir)"

# the same bug through the separate epoch-order run (the main runs stay in epoch 0)
timeout 120 "$D" check --np 2 $DATA --testing-fault sampler-epoch --model "$CNN" --steps 3 > "$T/out" 2>&1
ok $([ $? -eq 1 ] && echo 0 || echo 1) "sampler-epoch, --steps 3: check exits 1"
ok_grep "$T/out" "epoch order +FAIL +epoch 1 repeats .*synthetic:128,1,8,8,4" \
    "--steps 3: a 3-step run on 2 synthetic batches of the same shape catches it"

# planted: no gradient all-reduce -> the loss diverges at step 2, the weights differ
timeout 120 "$D" check --np 2 $DATA --testing-fault skip-allreduce --model "$CNN" > "$T/out" 2>&1
ok $([ $? -eq 1 ] && echo 0 || echo 1) "skip-allreduce: check exits 1"
ok_grep "$T/out" 'loss curve +FAIL +diverges at step 2: 1 process [0-9.e+-]+, 2 processes [0-9.e+-]+' \
    "skip-allreduce: the loss curve diverges at step 2, both values shown"
row "bitwise" FAIL > /dev/null; ok $? "skip-allreduce: bitwise FAILs"
row "batch order" PASS > /dev/null; ok $? "skip-allreduce: the batches are still the same"

# planted: rank 1 uses another learning rate -> the ranks end with different parameters
timeout 120 "$D" check --np 2 $DATA --testing-fault lr-rank1 --model "$CNN" > "$T/out" 2>&1
ok $([ $? -eq 1 ] && echo 0 || echo 1) "lr-rank1: check exits 1"
ok_grep "$T/out" "ranks agree +FAIL +rank [01]: parameter '[^']+' has a different value \(checksum\) on rank 1 than on rank 0" \
    "lr-rank1: ranks agree FAILs naming the parameter and the rank"

# N not a power of two: the loss within 1e-5 relative, the weights within tolerance
timeout 120 "$D" check --np 3 --data synthetic:1024,1,8,8,4 --batch 48 --model "$CNN" > "$T/out" 2>&1
ok $? "check --np 3 passes"
ok_grep "$T/out" 'loss curve +PASS .*within 1e-05 relative: 3 is not a power of two' "--np 3: the tolerance rule is named"

# a run that never ends is killed at --timeout, with everything it started
printf '#!/bin/sh\necho $$ > "%s/hang.pid"\nexec sleep 60\n' "$T" > "$T/hang.sh"; chmod +x "$T/hang.sh"
# (--timeout 10, not less: the 1-process reference run must finish within it on a loaded machine)
DTRUN="$T/hang.sh" timeout 90 "$D" check --np 2 --timeout 10 $DATA --model "$CNN" > "$T/out" 2>&1
ok $([ $? -eq 1 ] && echo 0 || echo 1) "a hanging N-process run: check exits 1"
ok_grep "$T/out" 'end to end +FAIL +2 processes: timed out after 10 s \(killed\)' "the hang is reported as a timeout"
i=0; while kill -0 "$(cat "$T/hang.pid")" 2>/dev/null && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
! kill -0 "$(cat "$T/hang.pid")" 2>/dev/null; ok $? "the hanging launcher was killed"

# bad flags: exit 2 and one line
bad() {  # bad "what" PATTERN ARGS...
    what=$1; pat=$2; shift 2
    timeout 60 "$D" check "$@" > "$T/out" 2> "$T/err"; rc=$?
    [ $rc -eq 2 ] && [ "$(wc -l < "$T/err")" -eq 1 ] && grep -Eq -- "$pat" "$T/err"
    ok $? "$what -> exit 2 ($rc): $(cat "$T/err")"
}
bad "no --np" '^dtrain check: --np: required' $DATA
bad "--np 1" '^dtrain check: --np: expected' --np 1 $DATA
bad "--micro-batches 3 with --np 2" 'micro-batches: 3 is not a multiple of --np 2' --np 2 --micro-batches 3 $DATA
bad "an unknown train flag" "rejected the flags: dtrain: unknown flag '--bogus'" --np 2 $DATA --model "$CNN" --bogus 1
bad "an unknown planted fault" "rejected the flags: dtrain: --testing-fault: planted fault 'nope'" --np 2 $DATA --testing-fault nope
bad "--lr-scale linear" '^dtrain check: --lr-scale:' --np 2 $DATA --lr-scale linear
bad "a stray argument" "unexpected argument 'stray'" --np 2 stray
bad "a missing data directory" '^dtrain check: --data: ' --np 2 --data "$T/none"
bad "a batch larger than the data" 'global batch 2048 is larger than the 1024' --np 2 --data synthetic:1024,1,8,8,4 --batch 2048
"$D" check --help > "$T/out" 2>&1; ok $? "check --help exits 0"
ok_grep "$T/out" '--np N' "--help documents --np"
done_testing
