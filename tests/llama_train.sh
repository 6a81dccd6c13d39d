#!/bin/sh
# llama_train.sh: the llama preset under everything the trainer does to a model.
#   (a) 1, 2 and 4 processes give bitwise the same weights, dropout off and on;
#   (b) every --shard mode gives bitwise the weights of --shard none (2 processes), and
#       so do --recompute and a 2-stage pipeline; bf16 on 2 processes is bf16 on 1;
#       dtrain check passes;
#   (c) a run stopped on 2 processes resumes on 1 and on 4 to the uninterrupted bits;
#   (d) a tied head (tie=1) trains across processes bitwise, and its file loads back,
#       with lm_head.weight or without it (as Hugging Face saves a tied model);
#   (e) dtrain sample continues a prompt from a llama checkpoint, the same text for the
#       same seed, greedy text at temperature 0 whatever the seed;
#   (f) --init with a file missing a layer, or a tensor of the wrong shape, exits 2
#       naming the tensor, and the bad preset arguments exit 2 naming the argument.
. "${DT_SRCDIR:-$(dirname "$0")/..}/tests/tap.sh"
D="$DT_BUILDDIR/dtrain"; R="$DT_BUILDDIR/dtrun"
[ -x "$D" ] && [ -x "$R" ] || skip_all "dtrain or dtrun not built"
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
awk 'BEGIN { for (i = 0; i < 200; i++)
    printf "%d: a llama shares its key and value heads among the query heads of a group.\n", i % 13 }' > "$T/text.txt"
timeout 60 "$D" prepare-text "$T/tok" "$T/text.txt" > "$T/o.prep" 2>&1
ok $? "prepare-text writes the token files"

# one thread per process: on a loaded machine an OpenMP team only waits for its cores
A="--data tokens:$T/tok --batch 8 --micro-batches 4 --threads 1 --quiet --no-eval --steps 4 --warmup 1"
M="llama(layers=2,heads=4,kv_heads=2,dim=32,hidden=48,block=16)"
MD="llama(layers=2,heads=4,kv_heads=1,dim=32,hidden=48,block=16,dropout=0.1)"
run() {   # run NAME N ARGS...: dtrain train on N processes (1: no launcher), weights to $T/NAME.st
    name=$1 n=$2; shift 2
    if [ "$n" = 1 ]; then timeout 180 "$D" train $A "$@" --save "$T/$name.st" > "$T/o.$name" 2>&1
    else timeout 180 "$R" -n "$n" "$D" train $A "$@" --save "$T/$name.st" > "$T/o.$name" 2>&1; fi
    rc=$?
    [ $rc -eq 0 ] || sed 's/^/#   /' "$T/o.$name" | tail -4
    return $rc
}
same() {   # same A B WHAT
    cmp -s "$T/$1.st" "$T/$2.st"; ok $? "$3"
}
st_edit() {   # st_edit SRC DST [--drop PREFIX | --reverse-shape NAME]: a safetensors file rewritten
    python3 - "$@" <<'PYEOF'
import json, struct, sys
src, dst, how, arg = sys.argv[1:5]
raw = open(src, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
hdr, data = json.loads(raw[8:8 + n]), raw[8 + n:]
out, blobs, off = {}, [], 0
for k, v in hdr.items():
    if k == "__metadata__" or (how == "--drop" and k.startswith(arg)):
        continue
    b = data[v["data_offsets"][0]:v["data_offsets"][1]]
    shape = v["shape"][::-1] if how == "--reverse-shape" and k == arg else v["shape"]   # same bytes
    out[k] = {"dtype": v["dtype"], "shape": shape, "data_offsets": [off, off + len(b)]}
    blobs.append(b); off += len(b)
h = json.dumps(out).encode()
h += b" " * (-len(h) % 8)
open(dst, "wb").write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
PYEOF
}

# (a) world sizes, dropout off and on
for d in plain drop; do
    spec=$M; [ $d = drop ] && spec=$MD
    run "${d}1" 1 --model "$spec"; ok $? "$d: 1 process, 4 micro-batches"
    for n in 2 4; do
        run "$d$n" $n --model "$spec"; ok $? "$d: $n processes train"
        same "${d}1" "$d$n" "$d: $n processes give bitwise the weights of 1 process"
    done
done
! cmp -s "$T/plain1.st" "$T/drop1.st"; ok $? "dropout changes the result (the check above can fail)"

# (b) shard modes, recompute, pipeline: 2 processes, bitwise --shard none
for mode in optim grads params; do
    run "sh$mode" 2 --model "$MD" --shard $mode; ok $? "--shard $mode trains on 2 processes"
    same drop2 "sh$mode" "--shard $mode gives bitwise the weights of --shard none"
done
run rc 2 --model "$MD" --recompute; ok $? "--recompute trains"
same drop2 rc "--recompute gives bitwise the weights without it"
run pp 2 --model "$MD" --pipeline 2; ok $? "--pipeline 2 trains (one stage a process)"
same drop1 pp "a 2-stage pipeline gives bitwise the weights of 1 process"
run bf1 1 --model "$MD" --precision bf16; ok $? "--precision bf16: 1 process"
run bf2 2 --model "$MD" --precision bf16; ok $? "--precision bf16: 2 processes"
same bf1 bf2 "--precision bf16: 2 processes give bitwise the weights of 1 process"
! cmp -s "$T/drop1.st" "$T/bf1.st"; ok $? "... and bf16 is not fp32 (the check above can fail)"
export TMPDIR="$T"   # dtrain check's run directories land here
timeout 300 "$D" check --np 2 --model "$M" --data "tokens:$T/tok" --batch 8 --threads 1 > "$T/o.ck" 2>&1
rc=$?; [ $rc -eq 0 ]; ok $? "dtrain check --np 2 passes for the llama (exit $rc)"
ok_grep "$T/o.ck" "all 6 checks passed" "... all six checks"

# (c) stopped on 2, resumed on 1 and on 4
timeout 180 "$R" -n 2 "$D" train $A --model "$MD" --checkpoint-dir "$T/ck" --stop-at 2 > "$T/o.stop" 2>&1
ok $? "2 processes stop at step 2 with a checkpoint"
for n in 1 4; do
    rm -rf "$T/ck$n"; cp -r "$T/ck" "$T/ck$n"
    run "res$n" $n --model "$MD" --checkpoint-dir "$T/ck$n" --resume auto; ok $? "$n process(es) resume"
    ok_grep "$T/o.res$n" "resumed from .*step-000000000002" "... from the 2-process checkpoint"
    same drop1 "res$n" "resumed on $n: bitwise the uninterrupted run"
done

# (d) a tied head: the embedding's two gradient parts in one order on any world size
MT="llama(layers=2,heads=4,kv_heads=2,dim=32,hidden=48,block=16,tie=1)"
run tie1 1 --model "$MT"; ok $? "tie=1: 1 process trains"
run tie2 2 --model "$MT"; ok $? "tie=1: 2 processes train"
same tie1 tie2 "tie=1: 2 processes give bitwise the weights of 1 process"
run tiepp 2 --model "$MT" --pipeline 2; ok $? "tie=1: a 2-stage pipeline trains (embedding and head on different stages)"
same tie1 tiepp "tie=1: the pipeline gives bitwise the weights of 1 process"
# plain SGD at lr 1e-30 changes no weight: the file saved is the file read
timeout 60 "$D" train $A --model "$MT" --init "$T/tie1.st" --lr 1e-30 --optim sgd --weight-decay 0 --steps 1 --warmup 0 \
    --save "$T/tieback.st" > "$T/o.tieback" 2>&1
ok $? "tie=1: --init takes its own saved file"
same tie1 tieback "... and starts from exactly its weights"
st_edit "$T/tie1.st" "$T/nohead.st" --drop lm_head.weight
ok $? "tie=1: the file without lm_head.weight written (as Hugging Face saves a tied model)"
timeout 60 "$D" train $A --model "$MT" --init "$T/nohead.st" --lr 1e-30 --optim sgd --weight-decay 0 --steps 1 \
    --warmup 0 --save "$T/tienohead.st" > "$T/o.tienohead" 2>&1
ok $? "tie=1: --init takes it"
same tie1 tienohead "... the head is the embedding's weight: the same model"

# (e) sampling
S="--weights $T/plain1.st --model $M --prompt 3: --tokens 40 --threads 1"
timeout 60 "$D" sample $S --seed 5 > "$T/s1" 2>"$T/s.err"; ok $? "dtrain sample runs a llama checkpoint"
timeout 60 "$D" sample $S --seed 5 > "$T/s2" 2>>"$T/s.err"
cmp -s "$T/s1" "$T/s2"; ok $? "... the same text for the same seed"
[ "$(wc -c < "$T/s1")" -ge 40 ]; ok $? "... 40 tokens after the prompt ($(wc -c < "$T/s1") bytes)"
timeout 60 "$D" sample $S --temperature 0 --seed 1 > "$T/g1" 2>>"$T/s.err"
timeout 60 "$D" sample $S --temperature 0 --seed 2 > "$T/g2" 2>>"$T/s.err"
cmp -s "$T/g1" "$T/g2"; ok $? "greedy decoding does not depend on the seed"
[ -s "$T/s.err" ] && sed 's/^/#   /' "$T/s.err" | tail -3

# (f) bad files and arguments exit 2, naming the culprit
st_edit "$T/plain1.st" "$T/nolayer.st" --drop model.layers.1. &&
    st_edit "$T/plain1.st" "$T/badshape.st" --reverse-shape model.layers.0.mlp.up_proj.weight
ok $? "two broken weight files written"
for f in nolayer badshape; do
    timeout 60 "$D" train $A --model "$M" --init "$T/$f.st" --steps 1 > "$T/o.$f" 2>&1
    rc=$?; [ $rc -eq 2 ]; ok $? "--init with a $f file exits 2 (got $rc)"
done
ok_grep "$T/o.nolayer" "model.layers.1.*missing" "... naming the missing layer's tensor"
ok_grep "$T/o.badshape" "model.layers.0.mlp.up_proj.weight" "... naming the tensor of the wrong shape"
badm() {   # badm PATTERN MODEL: dtrain train exits 2 naming the argument
    timeout 60 "$D" train $A --model "$2" --steps 1 > "$T/o.bm" 2>&1
    rc=$?; [ $rc -eq 2 ]; ok $? "'$2' exits 2 (got $rc)"
    ok_grep "$T/o.bm" "$1" "... saying: $1"
}
badm "'tie' expects a whole number from 0 to 1, got '2'" "llama(layers=1,dim=32,block=16,tie=2)"
badm "'dropout' expects a probability in \[0, 1), got '1'" "llama(layers=1,dim=32,block=16,dropout=1)"
badm "'heads' 5 does not divide 'dim' 32" "llama(layers=1,heads=5,kv_heads=1,dim=32,block=16)"
done_testing
