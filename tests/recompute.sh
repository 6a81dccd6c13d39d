#!/bin/sh
# recompute.sh: --recompute (activations inside residual blocks dropped after forward
# and recomputed in backward) gives bitwise the weights of a run without it, for the
# resnet preset, a tree with a nested block, batchnorm and dropout inside, and a gpt
# with dropout, on 1 and 2 processes (and with --sync-bn on 2); the accounted
# activation memory falls to what the model's plan says; dtrain check passes with it.
. "${DT_SRCDIR:-$(dirname "$0")/..}/tests/tap.sh"
D="$DT_BUILDDIR/dtrain"; R="$DT_BUILDDIR/dtrun"
[ -x "$D" ] && [ -x "$R" ] || skip_all "dtrain or dtrun not built"
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
export TMPDIR="$T"

# bits NAME FLAGS...: without --recompute on 1 process, then with it on 1 and on 2
# processes (--sync-bn: 2 and 2, the statistics differ from 1 process by design): the
# same bytes of weights and buffers
bits() {
    name=$1; shift
    base=1; case "$*" in *--sync-bn*) base=2 ;; esac
    launch=""; [ $base -gt 1 ] && launch="$R -n $base"
    timeout 300 $launch "$D" train "$@" --save "$T/$name-a.st" --metrics "$T/$name-a.jsonl" > "$T/o" 2>&1
    ok $? "$name: $base process(es) without --recompute"
    for n in 1 2; do
        [ $n -lt $base ] && continue
        launch=""; [ $n -gt 1 ] && launch="$R -n $n"
        timeout 300 $launch "$D" train "$@" --recompute --save "$T/$name-$n.st" --metrics "$T/$name-$n.jsonl" > "$T/o" 2>&1
        ok $? "$name: $n process(es) with --recompute"
        cmp -s "$T/$name-a.st" "$T/$name-$n.st"; ok $? "$name: ... bitwise the weights and buffers without it"
    done
}
IMG="--data synthetic:512,1,12,12,4 --epochs 1 --batch 64 --micro-batches 4 --quiet --no-eval --threads 1"
TREE="conv(4,3,pad=1) residual(bn relu seq(conv(4,3,pad=1) dropout(0.2)) residual(relu conv(4,1))) residual(bn conv(4,3,pad=1)) gap linear(4)"
bits resnet $IMG --model resnet
bits tree $IMG --model "$TREE"
# synchronised batchnorm: the statistics are all-reduced again in the recomputed forward
bits resnet-sync-bn $IMG --model resnet --sync-bn

# a gpt with dropout (masks keyed by sample: the recomputed forward draws the same ones)
awk 'BEGIN { for (i = 0; i < 200; i++) printf "line %d: the quick brown fox jumps over the lazy dog.\n", i % 13 }' > "$T/text.txt"
timeout 60 "$D" prepare-text "$T/tok" "$T/text.txt" > "$T/o" 2>&1
ok $? "prepare-text"
M="gpt(layers=2,heads=2,dim=32,block=32,dropout=0.1)"
bits gpt --model "$M" --data "tokens:$T/tok" --batch 8 --micro-batches 4 --steps 4 --warmup 1 --no-eval --threads 1 --quiet

# the accounting: activations fall, to what the plan of the model says (micro-batches of 2)
a=$(metrics_peak "$T/gpt-a.jsonl" acts); b=$(metrics_peak "$T/gpt-1.jsonl" acts)
diag "gpt activations: ${a:-?} bytes without --recompute, ${b:-?} with"
[ -n "$a" ] && [ -n "$b" ] && [ "$b" -lt "$a" ]; ok $? "gpt: --recompute lowers the accounted activation peak"
"$D" plan --model "$M" --np 1 --batch 8 --micro-batches 4 --optim adamw --no-eval --shard none --precision fp32 --json \
    > "$T/p-a" 2>&1
"$D" plan --model "$M" --np 1 --batch 8 --micro-batches 4 --optim adamw --no-eval --shard none --precision fp32 --json \
    --recompute > "$T/p-b" 2>&1
[ "$(plan_bytes "$T/p-a" acts)" = "$a" ]; ok $? "gpt: the activations without --recompute are the plan's ($(plan_bytes "$T/p-a" acts))"
[ "$(plan_bytes "$T/p-b" acts)" = "$b" ]; ok $? "gpt: the activations with --recompute are the plan's ($(plan_bytes "$T/p-b" acts))"
# what the blocks keep with --recompute: each its output, 2 x 32 x 32 floats, plus the one shared arena
blocks=$(sed -n 's/.*"blocks":\([0-9]*\),"block_acts":\([0-9]*\),"arena":\([0-9]*\).*/\1 \2 \3/p' "$T/p-b")
set -- $blocks
[ "${1:-0}" -eq 4 ] && [ $(( ${2:-0} - ${3:-0} )) -eq $(( 4 * 2 * 32 * 32 * 4 )) ]
ok $? "gpt: with --recompute each of the 4 blocks keeps only its output (blocks, bytes, arena: $blocks)"

timeout 300 "$D" check --np 2 --model resnet --data synthetic:512,1,12,12,4 --steps 4 --recompute --threads 1 > "$T/check" 2>&1
ok $? "dtrain check with --recompute: 2 processes compute what 1 computes"
done_testing
