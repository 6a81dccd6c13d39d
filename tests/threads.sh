#!/bin/sh
# threads.sh: the compute thread tuner (src/tuner.h) never changes a result. With the
# planted "threads-flip" the tuner sets another count at every step (1, 2, 3 in turn);
# the weights are bitwise those of a run on 1 thread with --fixed-threads, for an mlp, a
# cnn with batchnorm and a gpt, on 1 and 2 processes, and for a run with a busy loop
# beside it (where the tuner may take threads away for real). The metrics file says the
# threads the steps ran on only when the count may change; a bad planted name exits 2.
. "${DT_SRCDIR:-$(dirname "$0")/..}/tests/tap.sh"
D="$DT_BUILDDIR/dtrain"; R="$DT_BUILDDIR/dtrun"
[ -x "$D" ] && [ -x "$R" ] || skip_all "dtrain or dtrun not built"
T=$(mktemp -d)
BUSY=""
trap '[ -n "$BUSY" ] && kill $BUSY 2>/dev/null; rm -rf "$T"' EXIT
export TMPDIR="$T"

# same NAME LAUNCH FLAGS...: 1 thread fixed, then 3 threads flipped every step
same() {
    name=$1; launch=$2; shift 2
    timeout 300 $launch "$D" train "$@" --threads 1 --fixed-threads --save "$T/$name-1.st" \
        --metrics "$T/$name-1.jsonl" > "$T/o" 2>&1
    ok $? "$name: 1 thread, fixed" || sed 's/^/# /' "$T/o"
    timeout 300 $launch "$D" train "$@" --threads 3 --testing-fault threads-flip --save "$T/$name-f.st" \
        --metrics "$T/$name-f.jsonl" > "$T/o" 2>&1
    ok $? "$name: 3 threads, another count at every step" || sed 's/^/# /' "$T/o"
    cmp -s "$T/$name-1.st" "$T/$name-f.st"; ok $? "$name: ... bitwise the same weights and buffers"
}
IMG="--data synthetic:512,1,12,12,4 --epochs 1 --batch 64 --micro-batches 4 --quiet --no-eval --log-every 1"
same mlp "" $IMG --model "flatten linear(64) relu linear(4)"
same cnn "" $IMG --model "conv(8,3,pad=1) bn relu maxpool(2) flatten linear(4)"
same cnn-2p "$R -n 2" $IMG --model "conv(8,3,pad=1) bn relu maxpool(2) flatten linear(4)"

awk 'BEGIN { for (i = 0; i < 200; i++) printf "line %d: the quick brown fox jumps over the lazy dog.\n", i % 13 }' > "$T/text.txt"
timeout 60 "$D" prepare-text "$T/tok" "$T/text.txt" > "$T/o" 2>&1
ok $? "prepare-text"
same gpt "" --model "gpt(layers=2,heads=2,dim=32,block=32)" --data "tokens:$T/tok" --batch 8 --micro-batches 4 \
    --steps 6 --warmup 1 --no-eval --quiet --log-every 1

# the metrics: a step line carries "threads" (the mean since the line before) when the count
# may change: flipped, step 1 runs on the 3 set, then each step on the count the step before
# set (2, 3, 1, 2, ...), one line a step; fixed: no field
n=$(grep -c '"event":"step"' "$T/gpt-f.jsonl"); t=$(grep '"event":"step"' "$T/gpt-f.jsonl" | grep -c '"threads":')
[ "$n" -eq 6 ] && [ "$t" -eq 6 ]; ok $? "flipped: each of the 6 step lines says its threads ($t of $n)"
grep '"event":"step"' "$T/gpt-f.jsonl" | sed -n 's/.*"threads":\([0-9.]*\).*/\1/p' | tr '\n' ' ' > "$T/th"
[ "$(cat "$T/th")" = "3.00 2.00 3.00 1.00 2.00 3.00 " ]; ok $? "flipped: the counts in turn ($(cat "$T/th"))"
grep -q '"threads":[0-9.]*[,}]' "$T/gpt-1.jsonl" && ! grep '"event":"step"' "$T/gpt-1.jsonl" | grep -q '"threads"'
ok $? "fixed: the start line's threads only"

# beside a busy loop (bounded by the script's end) the tuner may drop to 1 thread: the same bits
( end=$(( $(date +%s) + 600 )); while [ "$(date +%s)" -lt "$end" ]; do :; done ) &
BUSY=$!
timeout 300 "$D" train $IMG --model "flatten linear(64) relu linear(4)" --threads 2 --save "$T/busy.st" > "$T/o" 2>&1
ok $? "mlp: 2 adaptive threads beside a busy loop"
kill $BUSY 2>/dev/null; BUSY=""
cmp -s "$T/mlp-1.st" "$T/busy.st"; ok $? "... bitwise the weights of 1 fixed thread"

# bad input
"$D" train $IMG --model mlp --testing-fault threads-flop > "$T/o" 2>&1
[ $? -eq 2 ] && grep -q "threads-flip" "$T/o"; ok $? "an unknown planted fault exits 2 listing threads-flip"
"$D" train $IMG --model mlp --fixed-threads=1 > "$T/o" 2>&1
[ $? -eq 2 ]; ok $? "--fixed-threads takes no value: exit 2"
done_testing
