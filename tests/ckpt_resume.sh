#!/bin/sh
# ckpt_resume.sh: checkpoints that lose nothing (docs/DESIGN.md rule 4) — a run stopped
# and resumed is bitwise the uninterrupted one, on the same and on another world
# size; a damaged newest checkpoint is skipped; a rank killed mid-run ends the job
# with an error naming it and leaves the last checkpoint loadable.
. "${DT_SRCDIR:-$(dirname "$0")/..}/tests/tap.sh"
D="$DT_BUILDDIR/dtrain"; R="$DT_BUILDDIR/dtrun"
[ -x "$D" ] && [ -x "$R" ] || skip_all "dtrain or dtrun not built"
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
M="conv(4,3,pad=1) bn relu maxpool(2) dropout(0.2) flatten linear(4)"
C="--data synthetic:1024,1,8,8,4 --epochs 3 --batch 64 --micro-batches 2 --optim adamw --quiet"

timeout 120 "$D" train $C --model "$M" --save "$T/full.st" > "$T/o.full" 2>&1
ok $? "uninterrupted run (48 steps)"
timeout 120 "$D" train $C --model "$M" --checkpoint-dir "$T/ck" --checkpoint-every 5 --stop-at 23 > "$T/o.stop" 2>&1
ok $? "run stopped at step 23"
ok_grep "$T/o.stop" "stopped at step 23" "it says where it stopped"
n=$(ls "$T/ck" | grep -c '^step-'); [ "$n" -eq 3 ]; ok $? "keeps the newest 3 checkpoints (found $n)"
[ -d "$T/ck/step-000000000023" ] && [ -d "$T/ck/step-000000000015" ]; ok $? "checkpoints 15, 20 and 23 are kept"
cp -r "$T/ck" "$T/ck2"; cp -r "$T/ck" "$T/ck3"

timeout 120 "$D" train $C --model "$M" --checkpoint-dir "$T/ck" --resume auto --save "$T/r1.st" > "$T/o.r1" 2>&1
ok $? "resume on 1 process"
ok_grep "$T/o.r1" "resumed from .*step-000000000023" "it names the checkpoint it resumed from"
cmp -s "$T/full.st" "$T/r1.st"; ok $? "resumed run is bitwise the uninterrupted one"
timeout 180 "$R" -n 2 "$D" train $C --model "$M" --checkpoint-dir "$T/ck2" --resume auto --save "$T/r2.st" > "$T/o.r2" 2>&1
ok $? "resume on 2 processes"
cmp -s "$T/full.st" "$T/r2.st"; ok $? "resumed on another world size, still bitwise the uninterrupted run"

# damage the newest checkpoint: it is skipped, the previous one is used, the result is unchanged
f="$T/ck3/step-000000000023/model.safetensors"; head -c 300 "$f" > "$f.cut" && mv "$f.cut" "$f"
timeout 120 "$D" train $C --model "$M" --checkpoint-dir "$T/ck3" --resume auto --save "$T/r3.st" > "$T/o.r3" 2>&1
ok $? "resume with a truncated newest checkpoint"
ok_grep "$T/o.r3" "resumed from .*step-000000000020.*skipped" "the damaged one is skipped and reported"
cmp -s "$T/full.st" "$T/r3.st"; ok $? "resuming from the previous checkpoint still gives the same bits"

timeout 60 "$D" train $C --model "$M" --checkpoint-dir "$T/empty" --resume auto --steps 2 > "$T/o.e" 2>&1
ok $? "--resume auto with no checkpoint starts fresh"
ok_grep "$T/o.e" "starting from step 0" "and says so"
timeout 60 "$D" train $C --batch 32 --model "$M" --checkpoint-dir "$T/ck" --resume auto > "$T/o.b" 2>&1
[ $? -eq 2 ]; ok $? "resume with another global batch exits 2"
ok_grep "$T/o.b" "global batch of 64" "the message names the checkpoint's batch"
timeout 60 "$D" train $C --model "flatten linear(4)" --checkpoint-dir "$T/ck" --resume auto > "$T/o.m" 2>&1
[ $? -ne 0 ]; ok $? "resume into another model fails"
ok_grep "$T/o.m" "tensor '" "the message names the first mismatched tensor"

# --keep prunes dtrain's own checkpoints only: a user's step-5/ and a .tmp-mine-<pid>/ of a
# dead process in the checkpoint directory stay, with their files
dead=$(sh -c 'echo $$')
mkdir -p "$T/own/step-5" "$T/own/.tmp-mine-$dead"
echo mine > "$T/own/step-5/results.txt"; echo mine > "$T/own/.tmp-mine-$dead/notes"
timeout 60 "$D" train $C --model "$M" --checkpoint-dir "$T/own" --checkpoint-every 2 --keep 1 --steps 6 > "$T/o.own" 2>&1
ok $? "a run with --keep 1 beside the user's directories"
n=$(ls "$T/own" | grep -c '^step-0'); [ "$n" -eq 1 ] && [ -d "$T/own/step-000000000006" ]; ok $? "it keeps its newest checkpoint only (found $n)"
[ -f "$T/own/step-5/results.txt" ] && [ -f "$T/own/.tmp-mine-$dead/notes" ]; ok $? "the user's step-5/ and .tmp-mine-$dead/ are still there"

# a rank killed mid-run: the job ends naming it; the last checkpoint loads and resumes
L="--data synthetic:8192,1,8,8,4 --epochs 40 --batch 64 --micro-batches 2 --quiet --checkpoint-dir $T/kill --checkpoint-every 8"
timeout 120 "$R" -n 2 "$D" train $L --model "$M" > "$T/o.k" 2>&1 &
job=$!
i=0; while [ $i -lt 200 ] && ! ls "$T/kill" 2>/dev/null | grep -q '^step-'; do sleep 0.1; i=$((i + 1)); done
victim=""
for p in $(pgrep -f "checkpoint-dir $T/kill"); do
    if tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -qx 'RANK=1'; then victim=$p; fi
done
[ -n "$victim" ] && kill -KILL "$victim"
t0=$(date +%s); wait $job; rc=$?; t1=$(date +%s)
[ -n "$victim" ] && [ $rc -ne 0 ]; ok $? "killing rank 1 (pid ${victim:-none}) fails the job (exit $rc)"
[ $((t1 - t0)) -le 15 ]; ok $? "the job ended within 15 s of the kill ($((t1 - t0)) s)"
ok_grep "$T/o.k" "rank 1.*(SIGKILL|signal 9)" "the error names rank 1 and the signal"
last=$(ls -d "$T"/kill/step-* 2>/dev/null | tail -1)
timeout 60 "$D" eval --data synthetic:8192,1,8,8,4 --model "$M" --weights "$last/model.safetensors" > "$T/o.ev" 2>&1
ok $? "the last checkpoint's weights load ($(basename "${last:-none}"))"
timeout 60 "$D" train $L --model "$M" --resume auto --stop-at $(( $(basename "${last:-step-0}" | sed 's/step-0*//') + 2 )) > "$T/o.kr" 2>&1
ok $? "and the run resumes from it"
done_testing
