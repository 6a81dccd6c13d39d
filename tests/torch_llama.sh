#!/usr/bin/env bash
# torch_llama.sh: the llama preset is Hugging Face's LlamaForCausalLM as the PyTorch peer
# ../shared/peers/torch_llama.py builds it (its build(); DT_PEERS names another folder).
# On a token file of exactly block + 1 tokens the only window is the whole file, so
# every sample of a batch is that window and both sides see the same batch. Then:
#   (a) dtrain's initial weights load into the peer with load_state_dict(strict=True);
#   (b) the first loss is the peer's to 1e-6 relative;
#   (c) the gradient, (w0 - w1) / lr from one SGD step at lr 1, is the peer's to 1e-5
#       relative in norm;
#   (d) --init takes the peer's own state_dict and starts from exactly those weights,
#       at the peer's loss.
# dtrain's weights before a step come from a 1-step run at --lr 1e-30 with plain SGD,
# which leaves every weight bitwise unchanged (the model has no biases, its RMSNorm
# weights start at 1). Runs when python3-torch is installed.
. "$(dirname "$0")/tap.sh"
need_torch
PEERS=${DT_PEERS:-$DT_SRCDIR/../shared/peers}
[ -f "$PEERS/torch_llama.py" ] || skip_all "the PyTorch peer $PEERS/torch_llama.py is missing (set DT_PEERS)"
T=$(mktemp -d)
trap '[ -n "$KEEP" ] || rm -rf "$T"' EXIT
DTRAIN="$DT_BUILDDIR/dtrain"
L=2 H=4 K=2 C=32 HID=48 BLOCK=16 V=64 B=4
MODEL="llama(layers=$L,heads=$H,kv_heads=$K,dim=$C,hidden=$HID,block=$BLOCK,vocab=$V)"

cat > "$T/llama.py" <<'PYEOF'
# The peer's Llama (build() of torch_llama.py) against dtrain's weights and gradients.
import math, sys
import numpy as np, torch
from st_torch import load, save
sys.path.insert(0, sys.argv[3])
from torch_llama import build


def tokens(path):
    raw = np.fromfile(path, dtype=np.uint8)
    head = raw[:1024].view(np.int32)
    assert head[0] == 20240520 and head[1] == 1
    return torch.from_numpy(raw[1024:].view(np.uint16)[: int(head[2])].astype(np.int64))


cmd, d = sys.argv[1], sys.argv[2]
V, T, L, H, K, C, HID, B = (int(a) for a in sys.argv[4:12])
if cmd == "data":
    tok = (np.arange(T + 1) * 37 + 11) % V
    head = np.zeros(256, np.int32); head[:3] = (20240520, 1, T + 1)
    for name in ("train.bin", "val.bin"):
        with open(d + "/" + name, "wb") as f:
            f.write(head.tobytes()); f.write(tok.astype("<u2").tobytes())
    torch.manual_seed(1337)
    m = build(V, T, L, H, K, C, HID)
    with torch.no_grad():      # RMSNorm weights off 1, so every tensor matters
        for n, p in m.named_parameters():
            if p.dim() == 1: p.normal_(1.0, 0.1)
    save(m.state_dict(), d + "/torch.st")
    sys.exit(0)

tok = tokens(d + "/train.bin")
assert len(tok) == T + 1, len(tok)
x, y = tok[:T].repeat(B, 1), tok[1:].repeat(B, 1)
m = build(V, T, L, H, K, C, HID)
r = m.load_state_dict(load(d + "/init.st"), strict=True)
print("strict_load", int(not r.missing_keys and not r.unexpected_keys))
loss = m(x, y)
loss.backward()
print("loss %.9g" % loss.item())
w0, w1 = load(d + "/init.st"), load(d + "/one.st")
num = den = 0.0
worst, worst_name = 0.0, ""
for n, p in m.named_parameters():
    g_d = (w0[n] - w1[n]).double()
    g_t = p.grad.double()
    e, t = (g_d - g_t).norm().item(), g_t.norm().item()
    num += e * e; den += t * t
    if t > 0 and e / t > worst:
        worst, worst_name = e / t, n
print("grad_rel %.3g" % math.sqrt(num / den))
print("grad_worst %.3g %s" % (worst, worst_name))

sd, back = load(d + "/torch.st"), load(d + "/back.st")
print("torch_init_same", int(set(sd) == set(back) and all(torch.equal(sd[k], back[k]) for k in sd)))
mt = build(V, T, L, H, K, C, HID)
mt.load_state_dict(sd, strict=True)
with torch.no_grad():
    print("torch_init_loss %.9g" % mt(x, y).item())
PYEOF

ARGS="$PEERS $V $BLOCK $L $H $K $C $HID $B"
timeout 300 "$PY" "$T/llama.py" data "$T" $ARGS > "$T/data.out" 2>&1
ok $? "a token file of block + 1 = $((BLOCK + 1)) tokens and the peer's weights written"
[ -s "$T/data.out" ] && sed 's/^/#   /' "$T/data.out" | tail -5

# plain SGD, no decay, no clipping, no schedule: one step is w - lr * g (peer_lib.sh: step, loss_of, val, close)
. "${DT_SRCDIR:-$(dirname "$0")/..}/tests/peer_lib.sh"
step --lr 1e-30 --metrics "$T/m0.jsonl" --save "$T/init.st" > "$T/a.out" 2>&1
ok $? "dtrain saves its initial weights (one step at lr 1e-30)"
step --lr 1 --save "$T/one.st" > "$T/b.out" 2>&1
ok $? "dtrain takes one SGD step at lr 1"
step --lr 1e-30 --init "$T/torch.st" --metrics "$T/mt.jsonl" --save "$T/back.st" > "$T/c.out" 2>&1
ok $? "dtrain starts from the peer's state_dict (--init)"
for f in a b c; do grep -q '^dtrain: done' "$T/$f.out" || sed 's/^/#   /' "$T/$f.out" | tail -3; done

timeout 300 "$PY" "$T/llama.py" compare "$T" $ARGS > "$T/cmp.out" 2> "$T/py.err"
ok $? "the peer computes the same window from the same weights"
[ -s "$T/py.err" ] && sed 's/^/#   /' "$T/py.err" | tail -5

[ "$(val strict_load)" = 1 ]; ok $? "(a) dtrain's initial weights load into the peer with strict=True"
dl=$(loss_of "$T/m0.jsonl"); tl=$(val loss)
diag "first loss: dtrain ${dl:-none}, peer ${tl:-none} (ln $V = $(awk -v v=$V 'BEGIN { printf "%.6f", log(v) }'))"
close "$dl" "$tl" 1e-6; ok $? "(b) the first loss agrees within 1e-6 relative"
gr=$(val grad_rel)
diag "gradient: relative difference in norm ${gr:-none}; worst tensor $(sed -n 's/^grad_worst //p' "$T/cmp.out")"
awk -v g="${gr:-1}" 'BEGIN { exit !(g < 1e-5) }'; ok $? "(c) the gradients agree within 1e-5 relative in norm (got ${gr:-none})"
[ "$(val torch_init_same)" = 1 ]; ok $? "(d) --init with the peer's state_dict: dtrain's weights are exactly the peer's"
dl=$(loss_of "$T/mt.jsonl"); tl=$(val torch_init_loss)
diag "loss from the peer's init: dtrain ${dl:-none}, peer ${tl:-none}"
close "$dl" "$tl" 1e-6; ok $? "(d) ... and its first loss is the peer's within 1e-6 relative"
done_testing
