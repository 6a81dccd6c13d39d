#!/bin/sh
# train_cli.sh: dtrain train/eval/model end to end on synthetic data — learning,
# determinism run after run and across thread counts, weight files, bad input.
. "${DT_SRCDIR:-$(dirname "$0")/..}/tests/tap.sh"
D="$DT_BUILDDIR/dtrain"
[ -x "$D" ] || skip_all "dtrain not built"
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
DATA="synthetic:2048,1,8,8,4"
MLP="flatten linear(32) relu linear(4)"
CNN="conv(4,3,pad=1) bn relu maxpool(2) dropout(0.1) flatten linear(4)"
run() { timeout 120 "$D" "$@"; }

run train --data "$DATA" --model "$MLP" --epochs 2 --batch 64 --log-every 0 --metrics "$T/m.jsonl" --save "$T/a.st" > "$T/out1" 2>&1
ok $? "mlp trains on synthetic data"
acc=$(sed -n 's/.*test accuracy \([0-9.]*\)$/\1/p' "$T/out1" | tail -1)
awk -v a="${acc:-0}" 'BEGIN { exit !(a >= 0.95) }'; ok $? "mlp reaches test accuracy >= 0.95 (got ${acc:-none})"
loss=$(sed -n 's/.*final loss \([0-9.]*\).*/\1/p' "$T/out1")
awk -v l="${loss:-9}" 'BEGIN { exit !(l < 0.1) }'; ok $? "final loss below 0.1 (got ${loss:-none})"
ok_grep "$T/m.jsonl" '"event":"epoch".*"test_acc"' "metrics hold one JSON line per epoch with test accuracy"
n=$(grep -c '"event":"step"' "$T/m.jsonl"); [ "$n" -ge 1 ]; ok $? "metrics hold step lines ($n)"

run train --data "$DATA" --model "$MLP" --epochs 2 --batch 64 --quiet --save "$T/b.st" > /dev/null 2>&1
cmp -s "$T/a.st" "$T/b.st"; ok $? "two runs with one seed give the same weight bytes"
run train --data "$DATA" --model "$MLP" --epochs 2 --batch 64 --quiet --seed 1 --save "$T/c.st" > /dev/null 2>&1
cmp -s "$T/a.st" "$T/c.st"; [ $? -ne 0 ]; ok $? "another seed gives other weights"

run train --data "$DATA" --model "$CNN" --epochs 1 --batch 64 --quiet --threads 1 --save "$T/t1.st" > /dev/null 2>&1
ok $? "cnn with batchnorm and dropout trains"
run train --data "$DATA" --model "$CNN" --epochs 1 --batch 64 --quiet --threads 2 --save "$T/t2.st" > /dev/null 2>&1
cmp -s "$T/t1.st" "$T/t2.st"; ok $? "1 and 2 threads give the same weight bytes (cnn, bn, dropout)"
run train --data "$DATA" --model "$CNN" --epochs 1 --batch 64 --quiet --micro-batches 4 --save "$T/s4.st" > /dev/null 2>&1
ok $? "4 micro-batches in one process"

run eval --data "$DATA" --model "$MLP" --weights "$T/a.st" > "$T/ev" 2>&1
ok $? "eval loads saved weights"
ok_grep "$T/ev" "test accuracy $acc" "eval reproduces the training run's final accuracy"
run eval --data "$DATA" --model "flatten linear(16) relu linear(4)" --weights "$T/a.st" > "$T/ev2" 2>&1
[ $? -eq 2 ]; ok $? "eval with another model's weights exits 2"
ok_grep "$T/ev2" "tensor '1.weight'" "the error names the first mismatched tensor"
head -c 100 "$T/a.st" > "$T/trunc.st"
run eval --data "$DATA" --model "$MLP" --weights "$T/trunc.st" > "$T/ev3" 2>&1
[ $? -eq 2 ]; ok $? "a truncated weight file is rejected with exit 2"

run model --model cnn > "$T/sum" 2>&1
ok_grep "$T/sum" "Total params: 421,834" "model summary of the cnn preset counts PyTorch's parameters"
run model --model mlp > "$T/sum2" 2>&1
ok_grep "$T/sum2" "Total params: 1,863,690" "model summary of the mlp preset"

# bad input: one clear line, exit 2
bad() {  # expected-pattern description args...
    pat=$1; what=$2; shift 2
    run "$@" > "$T/bad" 2>&1; rc=$?
    [ $rc -eq 2 ]; ok $? "$what exits 2 (got $rc)"
    ok_grep "$T/bad" "$pat" "$what: message names the problem"
}
bad "--lr: expected a number" "a malformed --lr" train --data "$DATA" --lr 0.1x
bad "--epochs" "a negative --epochs" train --data "$DATA" --epochs -3
bad "unknown flag '--bogus'" "an unknown flag" train --bogus
bad "--decay: expected all or matrices, got 'some'" "an unknown --decay" train --data "$DATA" --decay some
bad "--min-lr: expected a value in \\[0, lr = 0.05\\], got 0.5" "a --min-lr above --lr" train --data "$DATA" --min-lr 0.5
bad "--eval-batches" "--eval-batches 0" train --data "$DATA" --eval-batches 0
bad "--peak-gflops" "a negative --peak-gflops" train --data "$DATA" --peak-gflops -1
bad "token data needs a token model with an embedding and learned positions" "token data for a model without embed" \
    train --data tokens:/nonexistent --model mlp
bad "unknown layer 'linar'" "an unknown layer" train --data "$DATA" --model "flatten linar(4)"
bad "add 'flatten'" "a spec that does not fit the data" train --data "$DATA" --model "linear(4)"
bad "/nonexistent" "a missing data directory" train --data /nonexistent/dir
printf 'garbage, not IDX' > "$T/x.idx"; printf 'junk' > "$T/y.idx"
bad "$T/x.idx" "a corrupt data file" train --data "$T/x.idx,$T/y.idx"
bad "^dtrain: --batch: the global batch 100 is not divisible" "a batch that micro-batches do not divide" train --data "$DATA" --batch 100 --micro-batches 3
# the library names its option fields (resume, ckpt_dir, schedule); dtrain shows the flags
bad "^dtrain: --checkpoint-dir: required to resume 'auto'" "--resume auto without a checkpoint directory" train --data "$DATA" --resume auto
bad "^dtrain: --schedule: expected cosine, constant or step, got 'linear'" "an unknown --schedule" train --data "$DATA" --schedule linear
bad "unknown command" "an unknown command" frobnicate
DT_CPU_GEMM=bogus run train --data "$DATA" --model "$MLP" --epochs 1 > "$T/bad" 2>&1; rc=$?
[ $rc -eq 2 ]; ok $? "DT_CPU_GEMM=bogus exits 2 (got $rc)"
ok_grep "$T/bad" "DT_CPU_GEMM='bogus': expected auto, openblas, avx512 or avx512bf16" "DT_CPU_GEMM=bogus: message names the variable and its values"
DT_CPU_GEMM=bogus run eval --data "$DATA" --model "$MLP" --weights "$T/a.st" > "$T/bad" 2>&1; rc=$?
[ $rc -eq 2 ] && grep -q "DT_CPU_GEMM='bogus'" "$T/bad"; ok $? "dtrain eval reads DT_CPU_GEMM too: bogus exits 2 naming it (got $rc)"
for g in own openblas; do
    DT_CPU_GEMM=$g run train --data "$DATA" --model "$MLP" --epochs 1 --batch 64 --log-every 0 > "$T/gemm_$g" 2>&1
    ok $? "DT_CPU_GEMM=$g trains"
done
ok_grep "$T/gemm_openblas" "1 micro-batch, GEMM openblas$" "the start line names the GEMM kernel (openblas)"
# the kernels that need instructions: taken where the CPU has them, refused (exit 2, naming them) where not
for g in avx512:avx512f avx512bf16:avx512_bf16; do
    name=${g%%:*}; flag=${g#*:}
    DT_CPU_GEMM=$name run train --data "$DATA" --model "$MLP" --epochs 1 --batch 64 --log-every 0 --precision bf16 \
        > "$T/gemm_$name" 2>&1; rc=$?
    if grep -qw "$flag" /proc/cpuinfo; then
        want=$name; [ "$name" = avx512bf16 ] && want=avx512-bf16
        [ $rc -eq 0 ] && grep -q "precision bf16, GEMM $want$" "$T/gemm_$name"
        ok $? "DT_CPU_GEMM=$name on a CPU with $flag trains in bf16 on it, as the start line says (rc $rc)"
    else
        [ $rc -eq 2 ] && grep -q "DT_CPU_GEMM=$name: this CPU .*has no" "$T/gemm_$name"
        ok $? "DT_CPU_GEMM=$name on a CPU without $flag is refused naming it (rc $rc)"
    fi
done
bad "/nonexistent" "dtrain model with a missing data directory" model --model cnn --data /nonexistent/dir
bad "/nonexistent/spec.txt" "dtrain model with a missing @FILE" model --model @/nonexistent/spec.txt
bad "/nonexistent/spec.txt" "dtrain train with a missing @FILE" train --data "$DATA" --model @/nonexistent/spec.txt
bad "empty layer list" "dtrain model with an empty residual block" model --model "conv(4,3) residual()"
# a run that fails after setup releases everything in the right order (valgrind: no invalid access)
if [ -n "${DT_SANITIZED:-}" ]; then        # a sanitizer build checks the same thing itself
    skip "a sanitizer build: valgrind cannot run it"; skip "a sanitizer build"
elif command -v valgrind > /dev/null 2>&1; then
    timeout 300 "$DT_BUILDDIR/libtool" --mode=execute valgrind -q --error-exitcode=99 "$D" train \
        --model "flatten linear(8) relu linear(3)" --data synthetic:64,1,4,4,3 --batch 16 --epochs 2 --quiet \
        --lr 1e6 > "$T/vg" 2>&1
    rc=$?
    if grep -q "Valgrind: debuginfo reader" "$T/vg"; then   # valgrind 3.19 cannot read clang's DWARF 5
        skip "valgrind cannot read this build's debug information"; skip "valgrind cannot read it"
    else
        [ $rc -eq 1 ]; ok $? "a run failing mid-training: exit 1 and no invalid memory access under valgrind (got $rc)"
        ok_grep "$T/vg" "stopped before the update" "the error reaches the user"
    fi
else
    skip "valgrind not installed"; skip "valgrind not installed"
fi
# a diverging run stops before the update that would make the weights NaN, and saves nothing
run train --data "$DATA" --model "$MLP" --epochs 2 --lr 1e6 --quiet --save "$T/nan.st" > "$T/nan" 2>&1
rc=$?
[ $rc -eq 1 ]; ok $? "a loss that becomes NaN: exit 1 (got $rc)"
ok_grep "$T/nan" "^dtrain: step [0-9]+: the loss of micro-batch 0 \(computed by rank 0\) is (NaN|infinite); stopped before the update" \
    "the error names the step, the micro-batch and its rank"
[ ! -e "$T/nan.st" ]; ok $? "no weights are saved"
# written files honour the umask (077: only the owner may read the weights)
(umask 077; run train --data "$DATA" --model "$MLP" --epochs 1 --quiet --no-eval --save "$T/private.st" > /dev/null 2>&1)
[ "$(stat -c %a "$T/private.st" 2>/dev/null)" = 600 ]; ok $? "under umask 077 the saved weights are mode 600"
(umask 022; run train --data "$DATA" --model "$MLP" --epochs 1 --quiet --no-eval --save "$T/public.st" > /dev/null 2>&1)
[ "$(stat -c %a "$T/public.st" 2>/dev/null)" = 644 ]; ok $? "under umask 022 they are mode 644"
# a FIFO given as an input file is refused at once, never waited on
mkfifo "$T/fifo"
bad "$T/fifo: not a regular file" "a FIFO as the model spec file" model --model "@$T/fifo"
bad "$T/fifo: not a regular file" "a FIFO as a data file" train --data "$T/fifo,$T/fifo" --model "$MLP"
bad "$T/fifo: not a regular file" "a FIFO as the weights" eval --data "$DATA" --model "$MLP" --weights "$T/fifo"
bad "$T/fifo: not a regular file" "a FIFO as a metrics file" plot --text "$T/fifo"
bad "/nonexistent/ck" "--resume of a checkpoint that does not exist" train --data "$DATA" --model "$MLP" --resume /nonexistent/ck
# a resume with other settings than the checkpoint's is refused, naming each difference
run train --data "$DATA" --model "$MLP" --epochs 2 --quiet --no-eval --checkpoint-dir "$T/rck" --stop-at 5 > /dev/null 2>&1
ok $? "a run stopped at step 5 for the resume checks"
bad "^dtrain: --resume: this run differs from the checkpoint: lr '0.05' -> '0.1', momentum '0.9' -> '0.8'" \
    "a resume with another --lr and --momentum" \
    train --data "$DATA" --model "$MLP" --epochs 2 --quiet --no-eval --checkpoint-dir "$T/rck" --resume auto --lr 0.1 --momentum 0.8
bad "schedule 'cosine' -> 'constant'" "a resume with another --schedule" \
    train --data "$DATA" --model "$MLP" --epochs 2 --quiet --no-eval --checkpoint-dir "$T/rck" --resume auto --schedule constant
bad "data 'synthetic:2048,1,8,8,4' -> 'synthetic:1024,1,8,8,4'" "a resume on other data" \
    train --data synthetic:1024,1,8,8,4 --model "$MLP" --epochs 4 --quiet --no-eval --checkpoint-dir "$T/rck" --resume auto
bad "loss 'ce' -> 'mse', normalize 'auto' -> 'none'" "a resume with another --loss and --normalize" \
    train --data "$DATA" --model "$MLP" --epochs 2 --quiet --no-eval --checkpoint-dir "$T/rck" --resume auto --loss mse --normalize none
bad "label_smoothing '0' -> '0.1'" "a resume with another --label-smoothing" \
    train --data "$DATA" --model "$MLP" --epochs 2 --quiet --no-eval --checkpoint-dir "$T/rck" --resume auto --label-smoothing 0.1
run train --data "$DATA" --model "$MLP" --epochs 2 --no-eval --checkpoint-dir "$T/rck" --resume auto --lr 0.1 \
    --resume-override > "$T/ovr" 2>&1
ok $? "--resume-override continues anyway"
ok_grep "$T/ovr" "changed on resume \(overridden\): lr '0.05' -> '0.1'" "... and says what changed"
# input normalisation: chosen by --normalize, recorded with the weights, repeated by eval
run train --data "$DATA" --model "$MLP" --epochs 1 --batch 64 --normalize standard --save "$T/ns.st" > "$T/ns" 2>&1
ok $? "--normalize standard trains"
nacc=$(sed -n 's/.*test accuracy \([0-9.]*\)$/\1/p' "$T/ns" | tail -1)
run eval --data "$DATA" --model "$MLP" --weights "$T/ns.st" --normalize standard > "$T/nse" 2>&1
ok_grep "$T/nse" "test accuracy ${nacc:-none} " "eval with the same --normalize reproduces the accuracy"
# meta FILE: the normalisation, its mean and std, and the loss recorded in a saved file
meta() {
    python3 -c 'import json, struct, sys
raw = open(sys.argv[1], "rb").read()
m = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])["__metadata__"]
print(m["normalize"], m["input_mean"], m["input_std"], m["loss"])' "$1" 2>&1
}
meta "$T/ns.st" > "$T/nsm"
ok_grep "$T/nsm" "^standard -?[0-9.e-]+ [0-9.e-]+ ce$" "the saved file records the normalisation, the training set's mean and std, and the loss"
bad "--normalize: expected auto, standard, unit or none, got 'zscore'" "an unknown --normalize" train --data "$DATA" --normalize zscore
bad "--normalize: expected auto, standard, unit or none" "an unknown eval --normalize" eval --data "$DATA" --model "$MLP" --weights "$T/ns.st" --normalize zscore
# --normalize none: bytes reach the model as 0..255. Images of 4x4 bytes (class k: bright
# column k) and a linear model whose logits PyTorch's formula gives from the raw bytes
python3 - "$T" > "$T/u8.py.out" 2>&1 <<'PYEOF'
import json, math, random, struct, sys
d, r = sys.argv[1], random.Random(0)
def split(name, n):
    xs, ys = bytearray(), bytearray()
    for _ in range(n):
        k = r.randrange(4); ys.append(k)
        xs += bytes(min(255, (200 if j % 4 == k else 0) + r.randrange(40)) for j in range(16))
    open('%s/%s-x.idx' % (d, name), 'wb').write(struct.pack('>IIII', 0x803, n, 4, 4) + xs)
    open('%s/%s-y.idx' % (d, name), 'wb').write(struct.pack('>II', 0x801, n) + ys)
    return xs, ys
split('train', 512)
xs, ys = split('test', 128)
w = [[0.001 if j % 4 == k else 0.0 for j in range(16)] for k in range(4)]
blob = struct.pack('<64f', *[v for row in w for v in row]) + struct.pack('<4f', 0, 0, 0, 0)
hdr = json.dumps({'1.weight': {'dtype': 'F32', 'shape': [4, 16], 'data_offsets': [0, 256]},
                  '1.bias': {'dtype': 'F32', 'shape': [4], 'data_offsets': [256, 272]}}).encode()
hdr += b' ' * ((8 - len(hdr) % 8) % 8)
open(d + '/lin.st', 'wb').write(struct.pack('<Q', len(hdr)) + hdr + blob)
def ce(scale):   # cross-entropy of logits W x / scale, the mean over the test set
    tot = 0.0
    for i in range(len(ys)):
        x = xs[16 * i:16 * i + 16]
        z = [sum(w[k][j] * x[j] / scale for j in range(16)) for k in range(4)]
        m = max(z)
        tot += m + math.log(sum(math.exp(v - m) for v in z)) - z[ys[i]]
    return tot / len(ys)
print('%.6f %.6f' % (ce(1.0), ce(255.0)))
PYEOF
ok $? "u8 IDX data and a linear model's weights written"
U8="$T/train-x.idx,$T/train-y.idx,$T/test-x.idx,$T/test-y.idx"
read -r raw unit < "$T/u8.py.out"
for mode in none unit; do
    run eval --data "$U8" --model "flatten linear(4)" --weights "$T/lin.st" --normalize $mode > "$T/u8$mode" 2>&1
    got=$(sed -n 's/.*test loss \([0-9.]*\) .*/\1/p' "$T/u8$mode")
    want=$raw; [ $mode = unit ] && want=$unit
    awk -v a="${got:-9}" -v b="$want" 'BEGIN { exit !(a - b < 2e-4 && b - a < 2e-4) }'
    ok $? "eval --normalize $mode: the test loss of logits from $([ $mode = none ] && echo 'bytes as 0..255' || echo 'bytes / 255') (got ${got:-none}, want $want)"
done
run train --data "$U8" --model "flatten linear(4)" --epochs 2 --batch 64 --lr 0.0001 --normalize none --save "$T/nn.st" > "$T/nn" 2>&1
ok $? "--normalize none trains on bytes"
meta "$T/nn.st" > "$T/nnm"
ok_grep "$T/nnm" "^none 0 1 ce$" "the saved file records normalize none (mean 0, std 1)"
# --loss mse: one-hot targets, the mean squared error over all outputs; it learns too
run train --data "$DATA" --model "$MLP" --epochs 2 --batch 64 --loss mse --log-every 1 --metrics "$T/mse.jsonl" \
    --save "$T/mse.st" > "$T/mse" 2>&1
ok $? "--loss mse trains"
first=$(grep -m1 '"event":"step"' "$T/mse.jsonl" | sed 's/.*"loss":\([^,]*\),.*/\1/')
last=$(grep '"event":"step"' "$T/mse.jsonl" | tail -1 | sed 's/.*"loss":\([^,]*\),.*/\1/')
awk -v a="${first:-0}" -v b="${last:-9}" 'BEGIN { exit !(a > 0.1 && b < a / 4) }'
ok $? "the MSE loss falls (first step ${first:-none}, last ${last:-none})"
macc=$(sed -n 's/.*test accuracy \([0-9.]*\)$/\1/p' "$T/mse" | tail -1)
awk -v a="${macc:-0}" 'BEGIN { exit !(a >= 0.9) }'; ok $? "... to test accuracy >= 0.9 (got ${macc:-none})"
mloss=$(sed -n 's/.*test loss \([0-9.]*\) .*/\1/p' "$T/mse" | tail -1)
run eval --data "$DATA" --model "$MLP" --weights "$T/mse.st" --loss mse > "$T/msee" 2>&1
ok_grep "$T/msee" "test accuracy ${macc:-none}  test loss ${mloss:-none} " "eval --loss mse reproduces the test loss and accuracy"
meta "$T/mse.st" > "$T/msem"
ok_grep "$T/msem" " mse$" "the saved file records loss mse"
timeout 120 "$D" check --np 2 --data "$DATA" --model "$MLP" --batch 256 --loss mse > "$T/msec" 2>&1
ok $? "dtrain check --np 2 --loss mse passes"
ok_grep "$T/msec" "all 6 checks passed" "... every check, bitwise"
bad "^dtrain: --loss: expected ce or mse, got 'hinge'" "an unknown --loss" train --data "$DATA" --loss hinge
bad "^dtrain: --loss: expected ce or mse, got 'hinge'" "an unknown eval --loss" eval --data "$DATA" --model "$MLP" --weights "$T/mse.st" --loss hinge
bad "^dtrain: --label-smoothing: smooths cross-entropy targets only" "--label-smoothing with --loss mse" \
    train --data "$DATA" --model "$MLP" --loss mse --label-smoothing 0.1
# --init starts from saved weights: one step at a vanishing learning rate keeps them byte for byte
run train --data "$DATA" --model "$MLP" --steps 1 --lr 1e-30 --momentum 0 --weight-decay 0 --quiet --no-eval \
    --init "$T/a.st" --save "$T/init.st" > /dev/null 2>&1
ok $? "--init trains from a saved file"
cmp -s "$T/a.st" "$T/init.st"; ok $? "... starting from exactly its weights"
bad "^dtrain: --init: .*tensor '0.weight' is missing" "--init with another model's weights" \
    train --data "$DATA" --model "$CNN" --init "$T/a.st"
bad "^dtrain: --init: .*/nonexistent.st" "--init of a missing file" train --data "$DATA" --model "$MLP" --init /nonexistent.st
# --init of a sharded checkpoint, as Hugging Face writes big models: shard files and an
# index JSON whose weight_map names each tensor's shard; the index or its directory
# starts from exactly the weights of the single file
if command -v python3 > /dev/null 2>&1; then
    mkdir "$T/sh"
    python3 - "$T/a.st" "$T/sh" << 'EOF'
import json, os, struct, sys
src, out = sys.argv[1], sys.argv[2]
b = open(src, 'rb').read()
n = struct.unpack('<Q', b[:8])[0]
head, data = json.loads(b[8:8 + n]), b[8 + n:]
head.pop('__metadata__', None)
hdr, blob, wm = [{}, {}], [b'', b''], {}
for i, name in enumerate(head):   # the tensors alternate between the two shards
    t, k = head[name], i % 2
    s, e = t['data_offsets']
    hdr[k][name] = {'dtype': t['dtype'], 'shape': t['shape'], 'data_offsets': [len(blob[k]), len(blob[k]) + e - s]}
    blob[k] += data[s:e]
    wm[name] = 'model-%05d-of-00002.safetensors' % (k + 1)
for k in range(2):
    js = json.dumps(hdr[k]).encode()
    js += b' ' * (-len(js) % 8)
    with open(os.path.join(out, 'model-%05d-of-00002.safetensors' % (k + 1)), 'wb') as f:
        f.write(struct.pack('<Q', len(js)) + js + blob[k])
with open(os.path.join(out, 'model.safetensors.index.json'), 'w') as f:
    json.dump({'metadata': {'total_size': len(data)}, 'weight_map': wm}, f, indent=2)
EOF
    ok $? "the saved weights split into two shards and an index (python3, json + struct)"
    run train --data "$DATA" --model "$MLP" --steps 1 --lr 1e-30 --momentum 0 --weight-decay 0 --quiet --no-eval \
        --init "$T/sh/model.safetensors.index.json" --save "$T/init_ix.st" > "$T/ix.out" 2>&1
    ok $? "--init trains from a sharded checkpoint's index"
    cmp -s "$T/init.st" "$T/init_ix.st"; ok $? "... starting from the weights of the single file, byte for byte"
    run train --data "$DATA" --model "$MLP" --steps 1 --lr 1e-30 --momentum 0 --weight-decay 0 --quiet --no-eval \
        --init "$T/sh" --save "$T/init_dir.st" > "$T/dir.out" 2>&1
    ok $? "--init trains from the sharded checkpoint's directory"
    cmp -s "$T/init.st" "$T/init_dir.st"; ok $? "... starting from the same weights"
    run eval --data "$DATA" --model "$MLP" --weights "$T/sh" > "$T/evsh" 2>&1
    ok_grep "$T/evsh" "test accuracy $acc" "eval --weights of the sharded checkpoint reproduces the accuracy"
    sed 's/model-00002-of-00002/model-00003-of-00002/' "$T/sh/model.safetensors.index.json" > "$T/sh/broken.index.json"
    bad '^dtrain: --init: .*/sh/broken.index.json: shard "model-00003-of-00002.safetensors": .*No such file' \
        "--init of an index naming a missing shard" train --data "$DATA" --model "$MLP" --init "$T/sh/broken.index.json"
    sed 's|"model-00001-of-00002.safetensors"|"../a.st"|' "$T/sh/model.safetensors.index.json" > "$T/sh/out.index.json"
    bad '^dtrain: --init: .*/sh/out.index.json: bad safetensors index: tensor "1.weight": shard file name "\.\./a\.st" is not a plain file name' \
        "--init of an index naming a file outside its directory" train --data "$DATA" --model "$MLP" --init "$T/sh/out.index.json"
else
    for i in 1 2 3 4 5 6 7 8 9 10; do skip "python3 not found"; done
fi
# output paths are checked before training, not after it
bad "^dtrain: --save: cannot create /nonexistent/dir/x.st: directory /nonexistent/dir" "an unwritable --save" \
    train --data "$DATA" --model "$MLP" --save /nonexistent/dir/x.st
bad "^dtrain: --checkpoint-dir: /proc/nonexistent: cannot create the checkpoint directory" "an unwritable --checkpoint-dir" \
    train --data "$DATA" --model "$MLP" --checkpoint-dir /proc/nonexistent/ck
run model --model resnet > "$T/sum3" 2>&1
ok_grep "$T/sum3" "Total params: 112,106" "model summary of the resnet preset"
ok_grep "$T/sum3" "^4\.3 +conv\(32,3,pad=1,bias=0\)" "the summary names layers inside a block by their module path"
"$D" train --help > "$T/help" 2>&1; ok $? "train --help exits 0"
ok_grep "$T/help" "--micro-batches" "train --help documents the flags"
ok_grep "$T/help" "--loss ce\|mse .*cross-entropy" "train --help documents --loss"
ok_grep "$T/help" "--normalize auto\|standard\|unit\|none" "train --help documents --normalize none"
# the default thread count: the cores, but no more than the process is bound to
if command -v taskset > /dev/null && [ "$(nproc --all)" -ge 2 ]; then
    env -u OMP_NUM_THREADS taskset -c 0 "$D" train --model "flatten linear(4)" --data synthetic:64,1,2,2,4 --epochs 1 \
        --batch 16 > "$T/bound" 2>&1
    ok_grep "$T/bound" "1 process x 1 thread," "a process bound to one core computes with one thread"
    env -u OMP_NUM_THREADS "$D" train --model "flatten linear(4)" --data synthetic:64,1,2,2,4 --epochs 1 --batch 16 \
        --threads 2 > "$T/two" 2>&1
    ok_grep "$T/two" "1 process x 2 threads," "--threads 2 is said at the start"
else
    skip "needs taskset and 2 cores"; skip "needs taskset and 2 cores"
fi
# Metrics that cannot be written (a full disk; /dev/full fails every write) are said at
# once, once, naming the file, and the run exits 1 at the end naming it again, after
# saving the weights; --metrics-best-effort keeps the warning and exits 0.
if [ -w /dev/full ]; then
    run train --data "$DATA" --model "$MLP" --steps 6 --batch 64 --log-every 1 --no-eval --metrics /dev/full \
        --save "$T/full.st" > "$T/full.out" 2> "$T/full.err"
    rc=$?
    [ "$rc" -eq 1 ]; ok $? "--metrics /dev/full: exit 1 (got $rc)"
    n=$(grep -c "warning: --metrics: cannot write /dev/full" "$T/full.err")
    [ "$n" -eq 1 ]; ok $? "--metrics /dev/full: one warning naming the file ($n)"
    ok_grep "$T/full.err" "^dtrain: --metrics: .*/dev/full.*lost" "--metrics /dev/full: the failure at the end names the file"
    [ -s "$T/full.st" ]; ok $? "--metrics /dev/full: the weights are saved all the same"
    run train --data "$DATA" --model "$MLP" --steps 6 --batch 64 --log-every 1 --no-eval --metrics /dev/full \
        --metrics-best-effort > "$T/fullb.out" 2> "$T/fullb.err"
    rc=$?
    [ "$rc" -eq 0 ]; ok $? "--metrics-best-effort: exit 0 (got $rc)"
    n=$(grep -c "warning: --metrics: cannot write /dev/full" "$T/fullb.err")
    [ "$n" -eq 1 ]; ok $? "--metrics-best-effort: the warning still said, once ($n)"
else
    for i in 1 2 3 4 5 6; do skip "/dev/full is not writable here"; done
fi
done_testing
