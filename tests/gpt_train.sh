#!/bin/sh
# gpt_train.sh: a small gpt on a small text, end to end: it learns (the loss falls,
# validation runs); 1, 2 and 4 processes give bitwise the same weights (dropout on),
# and 1 and 2 for the llama preset, whose bad arguments exit 2 naming them;
# a run stopped on 2 processes and resumed on 1 is bitwise the uninterrupted one;
# dtrain sample is reproducible by seed, greedy at temperature 0, and refuses bad
# flags (exit 2); dtrain check proves the distributed run on token data (and catches
# a planted sampler bug); --init reads a GPT-2 file in Hugging Face's layout
# (GPT2LMHeadModel's names, Conv1D weights [in, out], mask buffers, no lm_head).
. "${DT_SRCDIR:-$(dirname "$0")/..}/tests/tap.sh"
D="$DT_BUILDDIR/dtrain"; R="$DT_BUILDDIR/dtrun"
[ -x "$D" ] && [ -x "$R" ] || skip_all "dtrain or dtrun not built"
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
export TMPDIR="$T"   # dtrain check's run directories land here (a failed check keeps its own)
# one thread per process: on a loaded machine an OpenMP team only waits for its cores
M="gpt(layers=2,heads=2,dim=32,block=16)"
A="--data tokens:$T/tok --batch 8 --threads 1 --quiet --eval-batches 2"
step_loss() { sed -n "s/.*\"event\":\"step\".*\"step\":$2,\"loss\":\([^,]*\),.*/\1/p" "$1" | head -1; }

# ~28 KB of text with a few patterns to learn
awk 'BEGIN { for (i = 0; i < 300; i++)
    printf "line %d: the quick brown fox jumps over the lazy dog; pack my box with five dozen liquor jugs.\n", i % 17 }' \
    > "$T/text.txt"
timeout 60 "$D" prepare-text "$T/tok" "$T/text.txt" > "$T/o.prep" 2>&1
ok $? "prepare-text writes the token files"

# (a) it learns
timeout 120 "$D" train --model "$M" $A --steps 40 --lr 3e-3 --warmup 5 --eval-every 20 --log-every 1 \
    --metrics "$T/m.jsonl" --save "$T/w.st" > "$T/o.a" 2>&1
ok $? "a 2-layer gpt trains 40 steps on the text"
first=$(step_loss "$T/m.jsonl" 1); last=$(step_loss "$T/m.jsonl" 40)
diag "loss: step 1 ${first:-none}, step 40 ${last:-none}"
awk -v a="${first:-0}" -v b="${last:-99}" 'BEGIN { exit !(a > 4 && b < a - 1) }'
ok $? "the loss after 40 steps is well below the first (by more than 1)"
grep -q '"event":"eval","step":20,' "$T/m.jsonl"; ok $? "validation runs at step 20 (--eval-every)"
ok_grep "$T/o.a" "done: 40 steps .*tokens/s.*val loss" "the summary gives tokens/s and the validation loss"

# (b) world size is an execution detail: dropout is keyed by sample, not by rank
MD="gpt(layers=2,heads=2,dim=32,block=16,dropout=0.1)"
I="--model $MD $A --micro-batches 4 --steps 4 --warmup 1 --no-eval"
timeout 120 "$D" train $I --save "$T/w1.st" > "$T/o1" 2>&1
ok $? "1 process, 4 micro-batches"
for n in 2 4; do
    timeout 120 "$R" -n $n "$D" train $I --save "$T/w$n.st" > "$T/o$n" 2>&1
    ok $? "$n processes train"
    cmp -s "$T/w1.st" "$T/w$n.st"; ok $? "$n processes give bitwise the weights of 1 process"
done

# ... and for the llama preset (RMSNorm, rotary positions, grouped-query attention, SwiGLU)
ML="llama(layers=2,heads=4,kv_heads=2,dim=32,hidden=48,block=16)"
IL="--model $ML $A --micro-batches 4 --steps 4 --warmup 1 --no-eval"
timeout 120 "$D" train $IL --save "$T/l1.st" > "$T/ol1" 2>&1
ok $? "llama: 1 process, 4 micro-batches"
timeout 120 "$R" -n 2 "$D" train $IL --save "$T/l2.st" > "$T/ol2" 2>&1
ok $? "llama: 2 processes train"
cmp -s "$T/l1.st" "$T/l2.st"; ok $? "llama: 2 processes give bitwise the weights of 1 process"
badm() {   # badm PATTERN MODEL: dtrain train exits 2 naming the argument
    timeout 60 "$D" train --model "$2" $A --steps 1 --no-eval > "$T/o.bm" 2>&1
    rc=$?; [ $rc -eq 2 ]; ok $? "llama: '$2' exits 2 (got $rc)"
    ok_grep "$T/o.bm" "$1" "... saying: $1"
}
badm "'kv_heads' 3 does not divide 'heads' 4" "llama(layers=1,heads=4,kv_heads=3,dim=32,block=16)"
badm "head width 'dim' / 'heads' = 12 / 4 = 3 is odd" "llama(layers=1,heads=4,kv_heads=2,dim=12,block=16)"
badm "'hidden' expects a whole number from 1 to 16777216, got '0'" "llama(layers=1,hidden=0,dim=32,block=16)"
badm "'kv_heads' 2 does not divide 'heads' 3" "embed(256,12) attn(3,kv_heads=2,block=16) linear(256)"
badm "'rope' needs an even head width" "embed(256,12) attn(4,rope=10000,block=16) linear(256)"

# (c) stopped on 2 processes, resumed on 1: the uninterrupted run's bits
timeout 120 "$R" -n 2 "$D" train $I --checkpoint-dir "$T/ck" --stop-at 2 > "$T/o.stop" 2>&1
ok $? "2 processes stop at step 2 with a checkpoint"
ok_grep "$T/o.stop" "stopped at step 2" "it says where it stopped"
timeout 120 "$D" train $I --checkpoint-dir "$T/ck" --resume auto --save "$T/r1.st" > "$T/o.r1" 2>&1
ok $? "1 process resumes"
ok_grep "$T/o.r1" "resumed from .*step-000000000002" "from the 2-process checkpoint"
cmp -s "$T/w1.st" "$T/r1.st"; ok $? "the resumed run is bitwise the uninterrupted one"

# (d) sampling
S="--model $M --weights $T/w.st --prompt line --tokens 40 --threads 1"
sample() { timeout 60 "$D" sample $S "$@" 2> "$T/s.err"; }
a=$(sample --seed 1); ra=$?; b=$(sample --seed 1); c=$(sample --seed 2)
[ $ra -eq 0 ] && [ "${#a}" -ge 44 ]; ok $? "sample prints the prompt and 40 tokens"
case "$a" in line*) ok 0 "the text starts with the prompt" ;; *) ok 1 "the text starts with the prompt" ;; esac
[ "$a" = "$b" ]; ok $? "the same seed gives the same text"
[ "$a" != "$c" ]; ok $? "another seed gives another text (temperature 0.8)"
g1=$(sample --seed 1 --temperature 0); g2=$(sample --seed 2 --temperature 0)
[ -n "$g1" ] && [ "$g1" = "$g2" ]; ok $? "--temperature 0 is greedy: the same text for any seed"
diag "seed 1: $(printf '%s' "$a" | tr '\n' ' ')"
bad() {   # bad WHAT PATTERN sample-flags...: exit 2 and one line naming the problem
    what=$1 pat=$2; shift 2
    timeout 60 "$D" sample --threads 1 "$@" > "$T/bad.out" 2>&1
    rc=$?
    [ $rc -eq 2 ]; ok $? "$what exits 2 (got $rc)"
    ok_grep "$T/bad.out" "$pat" "... saying: $pat"
}
bad "no --weights" "--weights: required" --model "$M"
bad "weights of another model" "w.st: holds 29 tensors, the model has 17" --model "gpt(layers=1,heads=2,dim=32,block=16)" --weights "$T/w.st"
timeout 60 "$D" train --model "gpt(layers=1,heads=2,dim=16,block=16,vocab=128)" $A --steps 1 --warmup 0 --no-eval \
    --save "$T/v128.st" > "$T/o.v" 2>&1
ok $? "a gpt with a 128-token vocabulary (the text is ASCII)"
bad "a prompt byte outside a 128-token vocabulary" "byte 233 is outside the model's vocabulary of 128" \
    --model "gpt(layers=1,heads=2,dim=16,block=16,vocab=128)" --weights "$T/v128.st" --prompt "$(printf 'caf\351')"
bad "a negative temperature" "--temperature" --model "$M" --weights "$T/w.st" --temperature -1

# (e) dtrain check on token data: the same comparisons as for classification
C="--model $M --data tokens:$T/tok --batch 8 --threads 1"
timeout 300 "$D" check --np 2 $C > "$T/o.ck" 2>&1
rc=$?; [ $rc -eq 0 ]; ok $? "dtrain check --np 2 passes on token data (exit $rc)"
ok_grep "$T/o.ck" "all 6 checks passed" "all six checks ran and passed"
ok_grep "$T/o.ck" "epoch order +PASS .*tokens:" "the epoch-order run used a token file of its own"
timeout 300 "$D" check --np 2 $C --testing-fault sampler-epoch > "$T/o.ckf" 2>&1
rc=$?; [ $rc -eq 1 ]; ok $? "a planted sampler bug fails the check (exit $rc)"
ok_grep "$T/o.ckf" "epoch order +FAIL" "... in the epoch-order row"
n=$(ls -d "$T"/dtrain-check-* 2>/dev/null | wc -l); [ "$n" -eq 1 ]
ok $? "only the failed check keeps its runs' directory (found $n)"
# a text so short that the runs cross an epoch themselves (38 windows, 4 steps an epoch)
head -c 60 "$T/text.txt" > "$T/short.txt" && timeout 60 "$D" prepare-text "$T/short" "$T/short.txt" > /dev/null 2>&1
timeout 300 "$D" check --np 2 --model "$M" --data "tokens:$T/short" --batch 8 --threads 1 > "$T/o.cks" 2>&1
rc=$?; [ $rc -eq 0 ]; ok $? "dtrain check passes on a corpus of a few batches (exit $rc)"
ok_grep "$T/o.cks" "5 steps \(4 per epoch\)" "its runs cross an epoch (4 steps an epoch, 5 steps)"
timeout 60 "$D" check --np 2 --model cnn --data "tokens:$T/tok" > "$T/o.ckb" 2>&1
rc=$?; [ $rc -eq 2 ]; ok $? "check with token data and a model without embed/pos exits 2 (got $rc)"
ok_grep "$T/o.ckb" "--model: token data needs a token model" "... naming --model"

# (f) --init from a GPT-2 in Hugging Face's layout, written from w.st
PY=/usr/bin/python3
[ -x "$PY" ] || PY=$(command -v python3)
if [ -z "$PY" ]; then
    for i in 1 2 3 4 5 6; do skip "no python3 to write the Hugging Face layout"; done
else
    cat > "$T/to_hf.py" <<'EOF'
# dtrain's GPT weights as transformers' GPT2LMHeadModel saves them: Conv1D weights
# [in, out], the causal-mask buffers attn.bias / attn.masked_bias, no lm_head.weight
# (tied to wte). VOCAB (optional) cuts wte for a file of another vocabulary.
import json, struct, sys
from array import array

def load(path):
    raw = open(path, 'rb').read()
    n = struct.unpack('<Q', raw[:8])[0]
    hdr = json.loads(raw[8:8 + n]); data = raw[8 + n:]
    return {k: (v['dtype'], v['shape'], data[v['data_offsets'][0]:v['data_offsets'][1]])
            for k, v in hdr.items() if k != '__metadata__'}

def save(tensors, path):
    hdr, blobs, off = {}, [], 0
    for k, (dt, shape, b) in tensors.items():
        hdr[k] = {'dtype': dt, 'shape': shape, 'data_offsets': [off, off + len(b)]}
        blobs.append(b); off += len(b)
    h = json.dumps(hdr).encode()
    h += b' ' * ((8 - len(h) % 8) % 8)
    open(path, 'wb').write(struct.pack('<Q', len(h)) + h + b''.join(blobs))

conv1d = ('.attn.c_attn.weight', '.attn.c_proj.weight', '.mlp.c_fc.weight', '.mlp.c_proj.weight')
src = load(sys.argv[1])
T = src['transformer.wpe.weight'][1][0]
out = {}
for k, (dt, shape, b) in src.items():
    if k == 'lm_head.weight': continue
    if k.endswith(conv1d):                          # nn.Linear [out, in] -> Conv1D [in, out]
        o, i = shape
        a = array('f'); a.frombytes(b)
        shape, b = [i, o], array('f', [a[r * i + c] for c in range(i) for r in range(o)]).tobytes()
    if k == 'transformer.wte.weight' and len(sys.argv) > 3:
        shape, b = [int(sys.argv[3]), shape[1]], b[:int(sys.argv[3]) * shape[1] * 4]
    out[k] = (dt, shape, b)
    if k.endswith('.attn.c_attn.bias'):
        blk = k[:-len('c_attn.bias')]
        out[blk + 'bias'] = ('BOOL', [1, 1, T, T], bytes(1 if c <= r else 0 for r in range(T) for c in range(T)))
        out[blk + 'masked_bias'] = ('F32', [], array('f', [-1e4]).tobytes())
save(out, sys.argv[2])
EOF
    timeout 60 "$PY" "$T/to_hf.py" "$T/w.st" "$T/hf.st" && timeout 60 "$PY" "$T/to_hf.py" "$T/w.st" "$T/hf200.st" 200
    ok $? "the trained weights written in Hugging Face's layout"
    F="--model $M $A --steps 2 --warmup 0 --no-eval"
    timeout 60 "$D" train $F --init "$T/w.st" --save "$T/f1.st" > "$T/o.f1" 2>&1 &&
        timeout 60 "$D" train $F --init "$T/hf.st" --save "$T/f2.st" > "$T/o.f2" 2>&1
    ok $? "--init takes dtrain's file and the Hugging Face one"
    cmp -s "$T/f1.st" "$T/f2.st"; ok $? "both runs give the same bits: the same starting weights"
    timeout 60 "$D" train $F --save "$T/f0.st" > "$T/o.f0" 2>&1
    ! cmp -s "$T/f0.st" "$T/f2.st"; ok $? "and not those of a run without --init"
    timeout 60 "$D" train $F --init "$T/hf200.st" > "$T/o.f3" 2>&1
    rc=$?; [ $rc -eq 2 ]; ok $? "a Hugging Face file of another vocabulary exits 2 (got $rc)"
    ok_grep "$T/o.f3" "--init: .*tensor 'transformer.wte.weight' is F32 \[200,32\] in the file, the model expects F32 \[256,32\]" \
        "... naming the tensor and both shapes"
fi
done_testing
