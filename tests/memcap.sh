#!/bin/sh
# memcap.sh: dtrain train --max-memory, a cap on each rank's counted memory (mem.h,
# dt_mem_set_limit), as a device of that size would impose. A run within the cap is
# untouched; a run over it stops with exit 1 and one line naming the rank, what it
# held by category and the cap, whether an allocation would cross the cap (refused
# before anything is kept) or a step's peak did (the gathers of --shard params are
# counted as they arrive); dtrain plan's estimate is what a run needs, to the byte
# for --shard none in fp32; sharding fits a model under a cap that --shard none does
# not; bad values exit 2 naming the flag.
. "${DT_SRCDIR:-$(dirname "$0")/..}/tests/tap.sh"
D="$DT_BUILDDIR/dtrain"; R="$DT_BUILDDIR/dtrun"
[ -x "$D" ] && [ -x "$R" ] || skip_all "dtrain or dtrun not built"
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
S="synthetic:512,1,28,28,10"
# peak_of FILE: the largest rank's peak total bytes in a metrics file's memory lines
peak_of() { sed -n 's/.*"event":"memory".*"mem_peak_bytes":{[^}]*"total":\([0-9]*\).*/\1/p' "$1" | sort -n | tail -1; }

# bad values: exit 2, one line naming the flag, nothing trained
for v in abc 0 -5 1.5G 12Q ""; do
    timeout 60 "$D" train --model mlp --data "$S" --steps 1 --no-eval --max-memory "$v" > "$T/bad.out" 2>&1
    rc=$?
    [ $rc -eq 2 ] && [ "$(wc -l < "$T/bad.out")" -eq 1 ] && grep -q "^dtrain: --max-memory: expected" "$T/bad.out"
    ok $? "--max-memory '$v' is refused: exit 2, one line naming the flag (exit $rc)"
done

# plan's estimate for --shard none in fp32 is the run's need: a cap at it trains, a cap a
# little under it does not
"$D" plan --model mlp --np 1 --data "$S" --batch 64 --shard none --precision fp32 --no-eval --json > "$T/plan" 2>&1
need=$(plan_bytes "$T/plan" total)
[ -n "$need" ] && [ "$need" -gt 0 ]
ok $? "dtrain plan: the mlp needs ${need:-?} bytes"
timeout 120 "$D" train --model mlp --data "$S" --batch 64 --steps 3 --no-eval --threads 1 --quiet \
    --max-memory "$((need + 64))" --metrics "$T/fit.jsonl" > "$T/fit.out" 2>&1
ok $? "a cap at plan's estimate (+64 bytes) trains"
peak=$(peak_of "$T/fit.jsonl")
[ -n "$peak" ] && [ "$peak" -le "$((need + 64))" ]
ok $? "and the run's counted peak is within it (${peak:-?} bytes)"
timeout 120 "$D" train --model mlp --data "$S" --batch 64 --steps 3 --no-eval --threads 1 --quiet \
    --max-memory "$((need - 65536))" > "$T/over.out" 2>&1
rc=$?
[ $rc -eq 1 ] && grep -q "^dtrain: memory cap: .* MiB more of [a-z]* would take this process to .* over its cap of .*; it holds params [0-9.]*, grads [0-9.]*, optim [0-9.]*, acts [0-9.]*, comm [0-9.]*, other [0-9.]* MiB$" "$T/over.out"
ok $? "64 KiB under it: exit 1, the refused allocation, the cap and what was held by category (exit $rc)"
sed -n 's/^/# /p' "$T/over.out" | tail -1
timeout 120 "$D" train --model mlp --data "$S" --steps 1 --no-eval --max-memory 1M > "$T/tiny.out" 2>&1
rc=$?
[ $rc -eq 1 ] && grep -q "MiB more of params would take this process" "$T/tiny.out"
ok $? "a cap under the parameters stops at the first allocation, naming params (exit $rc)"

# sharding buys room: a gpt on 2 processes whose --shard none peak is over the cap and
# whose --shard params peak is under it (the cap halfway between the two, measured)
awk 'BEGIN { for (i = 0; i < 200; i++) printf "line %d: the quick brown fox jumps over the lazy dog.\n", i % 13 }' > "$T/text.txt"
timeout 60 "$D" prepare-text "$T/tok" "$T/text.txt" > "$T/o" 2>&1
ok $? "prepare-text"
G="gpt(layers=4,heads=4,dim=128,block=32)"
gpt2() {  # NAME SHARD [flags...]: 2 processes, 3 steps
    n=$1 m=$2; shift 2
    timeout 300 "$R" -n 2 "$D" train --model "$G" --data "tokens:$T/tok" --batch 8 --steps 3 --warmup 1 --no-eval \
        --threads 1 --quiet --shard "$m" --metrics "$T/$n.jsonl" "$@" > "$T/$n.out" 2>&1
}
gpt2 none none
ok $? "gpt, --shard none, 2 processes, no cap"
gpt2 params params
ok $? "gpt, --shard params, 2 processes, no cap"
pn=$(peak_of "$T/none.jsonl"); pp=$(peak_of "$T/params.jsonl")
[ -n "$pn" ] && [ -n "$pp" ] && [ "$pp" -lt "$pn" ]
ok $? "the params peak is under none's (${pp:-?} against ${pn:-?} bytes)"
cap=$(( (${pn:-0} + ${pp:-0}) / 2 ))
gpt2 capped-params params --max-memory "$cap"
ok $? "under a cap halfway between (${cap} bytes), --shard params trains"
gpt2 capped-none none --max-memory "$cap"
rc=$?
[ $rc -ne 0 ] && grep -q "rank [01]: memory cap: " "$T/capped-none.out"
ok $? "and --shard none stops, the error naming the rank (exit $rc)"
grep "memory cap" "$T/capped-none.out" | head -1 | sed 's/^/# /'

# a peak over the cap that no single allocation crossed: gathering in place, each rank
# counts a unit's parameters as they arrive (dt_mem_add); the step ends, the peak is
# over, the run stops naming the rank and what it held at that peak. The cap is 64 KiB
# under the first run's peak: the gradient sums in flight move a peak by about 1 KiB
# from run to run, a unit is hundreds of KiB
DT_SHARD_POOL=0 gpt2 inplace params
ok $? "--shard params gathering in place, no cap"
pi=$(peak_of "$T/inplace.jsonl")
DT_SHARD_POOL=0 gpt2 inplace-capped params --max-memory "$((${pi:-0} - 65536))"
rc=$?
[ $rc -ne 0 ] && grep -Eq "rank [01]: memory cap: (this process held [0-9.]+ MiB at its peak, over its cap of [0-9.]+ MiB \(params|.* more of [a-z]+ would take)" "$T/inplace-capped.out"
ok $? "a cap 64 KiB under its peak stops the run, naming the rank (exit $rc)"
grep "memory cap" "$T/inplace-capped.out" | head -1 | sed 's/^/# /'
done_testing
