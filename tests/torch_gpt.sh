#!/usr/bin/env bash
# torch_gpt.sh: the gpt preset is nanoGPT's GPT in PyTorch (the module of
# ../shared/peers/torch_gpt.py, copied below). On a token file of exactly block + 1
# tokens the only window is the whole file, so every sample of a batch is that window
# and both sides see the same batch whatever their sampler. Then:
#   (a) dtrain's initial weights load into the PyTorch GPT with load_state_dict(strict=True);
#   (b) the first loss is PyTorch's to 1e-5 relative;
#   (c) the gradient, (w0 - w1) / lr from one SGD step at lr 1, is PyTorch's to 1e-5
#       relative in norm;
#   (d) --init takes PyTorch's own state_dict (both tied names in it) and starts from
#       exactly those weights, at PyTorch's loss;
#   (e) --init takes a Hugging Face GPT-2 state_dict (GPT2Model's names without
#       "transformer.", Conv1D weights [in, out], the attn.bias / attn.masked_bias
#       buffers, no lm_head) from a module computing with Conv1D as transformers does,
#       and starts from its weights, at its loss.
# dtrain's weights before a step come from a 1-step run at --lr 1e-30 with plain SGD,
# which leaves every nonzero weight bitwise unchanged (a zero bias moves to about 1e-31,
# which matters to nothing compared here; the state_dicts given to --init have no zero
# weight, so there the comparison is exact). Runs when python3-torch is installed.
. "$(dirname "$0")/tap.sh"
need_torch
T=$(mktemp -d)
trap '[ -n "$KEEP" ] || rm -rf "$T"' EXIT
DTRAIN="$DT_BUILDDIR/dtrain"
L=2 H=2 C=32 BLOCK=16 V=64 B=4
MODEL="gpt(layers=$L,heads=$H,dim=$C,block=$BLOCK,vocab=$V)"

cat > "$T/gpt.py" <<'PYEOF'
# nanoGPT's GPT as ../shared/peers/torch_gpt.py defines it, and a GPT-2 in the layout of
# Hugging Face's transformers (Conv1D projections, mask buffers) for --init.
import math, struct, sys
import numpy as np, torch, torch.nn as nn, torch.nn.functional as F
from st_torch import load, save


class Block(nn.Module):
    def __init__(s, C, H):
        super().__init__()
        s.H = H
        s.ln_1 = nn.LayerNorm(C)
        s.attn = nn.Module()
        s.attn.c_attn = nn.Linear(C, 3 * C)
        s.attn.c_proj = nn.Linear(C, C)
        s.ln_2 = nn.LayerNorm(C)
        s.mlp = nn.Module()
        s.mlp.c_fc = nn.Linear(C, 4 * C)
        s.mlp.c_proj = nn.Linear(4 * C, C)

    def forward(s, x):
        B, T, C = x.shape
        q, k, v = s.attn.c_attn(s.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, s.H, C // s.H).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // s.H)
        att = att.masked_fill(torch.ones(T, T, dtype=torch.bool).tril().logical_not(), float("-inf"))
        y = (F.softmax(att, dim=-1) @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + s.attn.c_proj(y)
        return x + s.mlp.c_proj(F.gelu(s.mlp.c_fc(s.ln_2(x))))


class GPT(nn.Module):
    def __init__(s, V, T, L, H, C):
        super().__init__()
        s.transformer = nn.Module()
        s.transformer.wte = nn.Embedding(V, C)
        s.transformer.wpe = nn.Embedding(T, C)
        s.transformer.h = nn.ModuleList([Block(C, H) for _ in range(L)])
        s.transformer.ln_f = nn.LayerNorm(C)
        s.lm_head = nn.Linear(C, V, bias=False)
        s.lm_head.weight = s.transformer.wte.weight
        for n, p in s.named_parameters():
            if n.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * L) if n.endswith("c_proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(s, idx, targets):
        t = s.transformer
        x = t.wte(idx) + t.wpe(torch.arange(idx.shape[1]))
        for b in t.h:
            x = b(x)
        logits = s.lm_head(t.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


class Conv1D(nn.Module):
    """transformers.pytorch_utils.Conv1D: y = x W + b with W stored [in, out]."""
    def __init__(s, nf, nx):
        super().__init__()
        s.weight = nn.Parameter(torch.empty(nx, nf).normal_(0.0, 0.3))
        s.bias = nn.Parameter(torch.empty(nf).normal_(0.0, 0.1))

    def forward(s, x):
        return torch.addmm(s.bias, x.reshape(-1, x.size(-1)), s.weight).view(x.shape[:-1] + (s.weight.size(1),))


class HFBlock(Block):
    """nanoGPT's block with transformers' GPT2Block modules: Conv1D projections and the
    attn.bias / attn.masked_bias buffers (the forward applies the same causal mask)."""
    def __init__(s, C, H, T):
        super().__init__(C, H)
        s.attn.c_attn = Conv1D(3 * C, C)
        s.attn.c_proj = Conv1D(C, C)
        s.attn.register_buffer("bias", torch.tril(torch.ones(T, T, dtype=torch.bool)).view(1, 1, T, T))
        s.attn.register_buffer("masked_bias", torch.tensor(-1e4))
        s.mlp.c_fc = Conv1D(4 * C, C)
        s.mlp.c_proj = Conv1D(C, 4 * C)


class HFGPT2Model(nn.Module):
    """GPT2Model's module tree (wte, wpe, h.<i>, ln_f); the head is wte, as GPT2LMHeadModel ties it."""
    def __init__(s, V, T, L, H, C):
        super().__init__()
        s.wte = nn.Embedding(V, C)
        s.wpe = nn.Embedding(T, C)
        s.h = nn.ModuleList([HFBlock(C, H, T) for _ in range(L)])
        s.ln_f = nn.LayerNorm(C)
        for n, p in s.named_parameters():          # off the defaults, so every tensor matters
            if n.startswith("ln") or ".ln_" in n:
                nn.init.normal_(p, 1.0 if n.endswith("weight") else 0.0, 0.2)

    def forward(s, idx, targets):
        x = s.wte(idx) + s.wpe(torch.arange(idx.shape[1]))
        for b in s.h:
            x = b(x)
        logits = s.ln_f(x) @ s.wte.weight.t()
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def tokens(path):
    raw = np.fromfile(path, dtype=np.uint8)
    head = raw[:1024].view(np.int32)
    assert head[0] == 20240520 and head[1] == 1
    return torch.from_numpy(raw[1024:].view(np.uint16)[: int(head[2])].astype(np.int64))


def batch(d, B, T):
    tok = tokens(d + "/train.bin")
    assert len(tok) == T + 1, len(tok)
    return tok[:T].repeat(B, 1), tok[1:].repeat(B, 1)


cmd, d = sys.argv[1], sys.argv[2]
V, T, L, H, C, B = (int(a) for a in sys.argv[3:9])
if cmd == "data":
    # T + 1 tokens in llm.c's format; PyTorch's own GPT and an HF-layout GPT-2 for --init
    tok = (np.arange(T + 1) * 37 + 11) % V
    head = np.zeros(256, np.int32); head[:3] = (20240520, 1, T + 1)
    for name in ("train.bin", "val.bin"):
        with open(d + "/" + name, "wb") as f:
            f.write(head.tobytes()); f.write(tok.astype("<u2").tobytes())
    torch.manual_seed(1337)
    m = GPT(V, T, L, H, C)
    with torch.no_grad():      # biases off zero: a step at lr 1e-30 leaves no weight changed then
        for n, p in m.named_parameters():
            if n.endswith("bias"): p.normal_(0.0, 0.02)
    save(m.state_dict(), d + "/torch.st")
    torch.manual_seed(7)
    save(HFGPT2Model(V, T, L, H, C).state_dict(), d + "/hf.st")
    sys.exit(0)

x, y = batch(d, B, T)
m = GPT(V, T, L, H, C)
r = m.load_state_dict(load(d + "/init.st"), strict=True)
print("strict_load", int(not r.missing_keys and not r.unexpected_keys))
loss = m(x, y)
loss.backward()
print("loss %.9g" % loss.item())
# dtrain's gradient: (w0 - w1) / lr with lr 1; lm_head.weight is wte's (tied, counted once)
w0, w1 = load(d + "/init.st"), load(d + "/one.st")
num = den = 0.0
worst, worst_name, step_diff = 0.0, "", 0.0
for n, p in m.named_parameters():
    g_d = (w0[n] - w1[n]).double()
    g_t = p.grad.double()
    e, t = (g_d - g_t).norm().item(), g_t.norm().item()
    num += e * e; den += t * t
    if t > 0 and e / t > worst:
        worst, worst_name = e / t, n
    # the step itself, in float32 as torch.optim.SGD takes it: free of the rounding of w0 - w1
    step_diff = max(step_diff, (w1[n] - (w0[n] - p.grad)).abs().max().item())
print("grad_rel %.3g" % math.sqrt(num / den))
print("grad_worst %.3g %s" % (worst, worst_name))
print("step_diff %.3g" % step_diff)

# (d) PyTorch's own weights through --init: dtrain's are exactly them, at their loss
sd, back = load(d + "/torch.st"), load(d + "/back.st")
print("torch_init_same", int(set(sd) == set(back) and all(torch.equal(sd[k], back[k]) for k in sd)))
mt = GPT(V, T, L, H, C)
mt.load_state_dict(sd, strict=True)
with torch.no_grad():
    print("torch_init_loss %.9g" % mt(x, y).item())

# (e) the Hugging Face layout: dtrain holds c_attn etc. as the transpose of Conv1D's weight
hf, hb = load(d + "/hf.st"), load(d + "/hfback.st")
conv = (".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight")
same = True
for k, v in hb.items():
    src = "wte.weight" if k == "lm_head.weight" else k[len("transformer."):]
    want = hf[src].t() if k.endswith(conv) else hf[src]
    same = same and torch.equal(v, want)
print("hf_init_same", int(same and len(hb) == len(hf) - 2 * L + 1))
mh = HFGPT2Model(V, T, L, H, C)
mh.load_state_dict(hf, strict=True)
with torch.no_grad():
    print("hf_init_loss %.9g" % mh(x, y).item())
PYEOF

ARGS="$V $BLOCK $L $H $C $B"
timeout 300 "$PY" "$T/gpt.py" data "$T" $ARGS > "$T/data.out" 2>&1
ok $? "a token file of block + 1 = $((BLOCK + 1)) tokens, PyTorch's GPT and an HF-layout GPT-2 written"
[ -s "$T/data.out" ] && sed 's/^/#   /' "$T/data.out" | tail -5

# plain SGD, no decay, no clipping, no schedule: one step is w - lr * g (peer_lib.sh: step, loss_of, val, close)
. "${DT_SRCDIR:-$(dirname "$0")/..}/tests/peer_lib.sh"
step --lr 1e-30 --metrics "$T/m0.jsonl" --save "$T/init.st" > "$T/a.out" 2>&1
ok $? "dtrain saves its initial weights (one step at lr 1e-30)"
step --lr 1 --save "$T/one.st" > "$T/b.out" 2>&1
ok $? "dtrain takes one SGD step at lr 1"
step --lr 1e-30 --init "$T/torch.st" --metrics "$T/mt.jsonl" --save "$T/back.st" > "$T/c.out" 2>&1
ok $? "dtrain starts from PyTorch's state_dict (--init)"
step --lr 1e-30 --init "$T/hf.st" --metrics "$T/mh.jsonl" --save "$T/hfback.st" > "$T/d.out" 2>&1
ok $? "dtrain starts from an HF-layout GPT-2 state_dict (--init)"
for f in a b c d; do grep -q '^dtrain: done' "$T/$f.out" || sed 's/^/#   /' "$T/$f.out" | tail -3; done

timeout 300 "$PY" "$T/gpt.py" compare "$T" $ARGS > "$T/cmp.out" 2> "$T/py.err"
ok $? "PyTorch computes the same window from the same weights"
[ -s "$T/py.err" ] && sed 's/^/#   /' "$T/py.err" | tail -5

[ "$(val strict_load)" = 1 ]; ok $? "(a) dtrain's initial weights load into the PyTorch GPT with strict=True"
dl=$(loss_of "$T/m0.jsonl"); tl=$(val loss)
diag "first loss: dtrain ${dl:-none}, PyTorch ${tl:-none} (ln $V = $(awk -v v=$V 'BEGIN { printf "%.6f", log(v) }'))"
close "$dl" "$tl" 1e-5; ok $? "(b) the first loss agrees within 1e-5 relative"
gr=$(val grad_rel)
diag "gradient: relative difference in norm ${gr:-none}; worst tensor $(sed -n 's/^grad_worst //p' "$T/cmp.out")"
awk -v g="${gr:-1}" 'BEGIN { exit !(g < 1e-5) }'; ok $? "(c) the gradients agree within 1e-5 relative in norm (got ${gr:-none})"
diag "weights after the step: largest |dtrain - PyTorch's w0 - g| $(val step_diff)"
[ "$(val torch_init_same)" = 1 ]; ok $? "(d) --init with PyTorch's state_dict: dtrain's weights are exactly PyTorch's"
dl=$(loss_of "$T/mt.jsonl"); tl=$(val torch_init_loss)
diag "loss from PyTorch's init: dtrain ${dl:-none}, PyTorch ${tl:-none}"
close "$dl" "$tl" 1e-5; ok $? "(d) ... and its first loss is PyTorch's within 1e-5 relative"
[ "$(val hf_init_same)" = 1 ]; ok $? "(e) --init with an HF-layout GPT-2: Conv1D weights transposed, every tensor exact"
dl=$(loss_of "$T/mh.jsonl"); tl=$(val hf_init_loss)
diag "loss from the HF-layout init: dtrain ${dl:-none}, the Conv1D module ${tl:-none}"
close "$dl" "$tl" 1e-5; ok $? "(e) ... and its first loss is the Conv1D module's within 1e-5 relative"
done_testing
