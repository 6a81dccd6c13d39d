#!/usr/bin/env bash
# bench/gpu.sh: the GPU path in one run — build, test, and training throughput of
# dtrain's CUDA backend against PyTorch on the same GPU.
#
#   bench/gpu.sh                  (from anywhere; sized for < 5 minutes on one H200)
#
# 1. configures and builds with --with-cuda --with-nccl in $DT_GPU_BUILDDIR
#    (default: build-gpu next to this script's source tree);
# 2. runs the GPU tests: tests/test_cuda_ops (every kernel against the CPU backend),
#    tests/gpu_train.sh (CPU and GPU losses agree), tests/gpu_nccl.sh (2+ GPUs);
# 3. trains `cnn` and an 8 x 4096 MLP (`flatten linear(4096) relu` x 8, `linear(10)`)
#    on synthetic 1x28x28 data, global batch 256, SGD (momentum 0.9, lr 0.05,
#    weight decay 5e-4), FP32 with TF32 off on both sides, and prints samples/s:
#      dtrain:  wall time of a run of S2 steps minus a run of S1 steps, so process
#               start-up, data generation and warm-up cancel out;
#      PyTorch: python3 with a CUDA build of torch, 20 warm-up steps then S timed steps
#               (torch.cuda.synchronize around them); "n/a" when torch has no CUDA.
#    The MLP again in bf16: dtrain --precision bf16 (cublasGemmEx, bf16 inputs, f32
#    compute) against torch.autocast("cuda", dtype=torch.bfloat16).
# 4. trains the gpt2 size (12 layers, 12 heads, 768 wide, vocabulary 50304, block 1024,
#    batch 8, AdamW, FP32 with TF32 off) on random byte tokens and prints tokens/s and
#    peak memory of dtrain (the same wall-time difference; --rank-stats) against the
#    same model in PyTorch (nanoGPT's GPT as in peers/torch_gpt.py, on the GPU).
set -u
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/.." && pwd)
bd=${DT_GPU_BUILDDIR:-$src/build-gpu}
jobs=$(nproc 2>/dev/null || echo 4)

echo "== build ($bd)"
[ -x "$src/configure" ] || (cd "$src" && autoreconf -fi > /dev/null 2>&1) || { echo "autoreconf failed"; exit 1; }
mkdir -p "$bd" && cd "$bd" || exit 1
if [ ! -f Makefile ]; then
    "$src/configure" -q --with-cuda --with-nccl > configure.log 2>&1 || { tail -5 configure.log; exit 1; }
fi
make -j"$jobs" > make.log 2>&1 || { grep -i -m 20 "error" make.log; exit 1; }
make -j"$jobs" check TESTS= > /dev/null 2>&1   # build the test programs

echo "== GPU tests"
make check TESTS='tests/test_cuda_ops tests/gpu_train.sh tests/gpu_nccl.sh' 2>&1 | grep -E '^(PASS|FAIL|SKIP|ERROR|XPASS|# (TOTAL|PASS|FAIL|SKIP))' | grep -vE '^PASS:' 
grep -h '^not ok' tests/test_cuda_ops.log tests/gpu_train.sh.log tests/gpu_nccl.sh.log 2>/dev/null | head -20

MLP8="flatten$(for i in 1 2 3 4 5 6 7 8; do printf ' linear(4096) relu'; done) linear(10)"
B=256

dtrain_sps() {  # model s1 s2 [precision]
    local t0 t1 t2
    t0=$(date +%s.%N)
    timeout 300 ./dtrain train --device cuda --model "$1" --data synthetic:16384,1,28,28,10 --batch $B \
        --steps "$2" --lr 0.05 --momentum 0.9 --weight-decay 5e-4 --schedule constant --precision "${4:-fp32}" \
        --no-eval --quiet > /dev/null 2>&1 || { echo fail; return; }
    t1=$(date +%s.%N)
    timeout 300 ./dtrain train --device cuda --model "$1" --data synthetic:16384,1,28,28,10 --batch $B \
        --steps "$3" --lr 0.05 --momentum 0.9 --weight-decay 5e-4 --schedule constant --precision "${4:-fp32}" \
        --no-eval --quiet > /dev/null 2>&1 || { echo fail; return; }
    t2=$(date +%s.%N)
    awk -v a="$t0" -v b="$t1" -v c="$t2" -v n=$(( ($3 - $2) * B )) \
        'BEGIN { d = (c - b) - (b - a); if (d > 0) printf "%.0f", n / d; else print "n/a" }'
}

torch_sps() {  # model steps
    python3 - "$1" "$2" $B <<'PY' 2>/dev/null || echo "n/a"
import sys, time
try:
    import torch, torch.nn as nn
except Exception:
    print("n/a"); sys.exit(0)
if not torch.cuda.is_available():
    print("n/a"); sys.exit(0)
name, steps, B = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
if name == "cnn":
    m = nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
                      nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                      nn.Linear(3136, 128), nn.ReLU(), nn.Linear(128, 10))
else:
    layers, d = [nn.Flatten()], 784
    for _ in range(8):
        layers += [nn.Linear(d, 4096), nn.ReLU()]; d = 4096
    m = nn.Sequential(*layers, nn.Linear(d, 10))
dev = torch.device("cuda", 0)
m = m.to(dev)
opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
lossf = nn.CrossEntropyLoss()
X = torch.rand(64, B, 1, 28, 28, device=dev); Y = torch.randint(0, 10, (64, B), device=dev)
bf16 = name.endswith("-bf16")
def step(i):
    opt.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
        out = m(X[i % 64])
    loss = lossf(out.float(), Y[i % 64]); loss.backward(); opt.step()
for i in range(20): step(i)
torch.cuda.synchronize(); t0 = time.perf_counter()
for i in range(steps): step(i)
torch.cuda.synchronize()
print(f"{steps * B / (time.perf_counter() - t0):.0f}")
PY
}

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a + 0 > 0 && b + 0 > 0) printf "%.2f", a / b; else printf "n/a" }'; }

echo "== training throughput, samples/s (batch $B, FP32, TF32 off)"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
echo "device: ${gpu:-unknown}; torch: $(python3 -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda)' 2>/dev/null || echo none)"
printf "%-12s %14s %14s %10s\n" model dtrain-cuda pytorch-cuda ratio
d=$(dtrain_sps cnn 50 450); t=$(torch_sps cnn 400)
printf "%-12s %14s %14s %10s\n" cnn "$d" "$t" "$(ratio "$d" "$t")"
d=$(dtrain_sps "$MLP8" 20 120); t=$(torch_sps mlp8x4096 100)
printf "%-12s %14s %14s %10s\n" mlp8x4096 "$d" "$t" "$(ratio "$d" "$t")"
d=$(dtrain_sps "$MLP8" 20 120 bf16); t=$(torch_sps mlp8x4096-bf16 100)
printf "%-12s %14s %14s %10s\n" mlp8x4096-bf16 "$d" "$t" "$(ratio "$d" "$t")"

echo "== gpt2 (124M, block 1024, batch 8, FP32, TF32 off): tokens/s and peak memory"
TOK=$(mktemp -d)
head -c 4000000 /dev/urandom > "$TOK/text" && ./dtrain prepare-text "$TOK/data" "$TOK/text" > /dev/null 2>&1
GPT2="gpt(layers=12,heads=12,dim=768,block=1024,vocab=50304)"
gpt2_run() {  # steps: prints "seconds peak_MiB"
    local t0 t1 out
    t0=$(date +%s.%N)
    out=$(timeout 600 ./dtrain train --device cuda --model "$GPT2" --data "tokens:$TOK/data" --batch 8 --steps "$1" \
          --warmup 1 --no-eval --rank-stats "$1" 2>&1) || { echo "fail"; return; }
    t1=$(date +%s.%N)
    echo "$t0 $t1 $(echo "$out" | awk '$1 == 0 && NF >= 7 { print $6 }' | tail -1)"
}
a=$(gpt2_run 5); b=$(gpt2_run 25)
d=$(echo "$a $b" | awk '{ d = ($5 - $4) - ($2 - $1); if (d > 0) printf "%.0f", 20 * 8 * 1024 / d; else print "n/a" }')
mem=$(echo "$b" | awk '{ print $3 }')
t=$(python3 - "$TOK/data" <<'PY' 2>/dev/null || echo "n/a"
import math, sys, time
import numpy as np
try:
    import torch, torch.nn as nn, torch.nn.functional as F
except Exception:
    print("n/a"); sys.exit(0)
if not torch.cuda.is_available():
    print("n/a"); sys.exit(0)
torch.backends.cuda.matmul.allow_tf32 = False
V, T, L, H, C, B = 50304, 1024, 12, 12, 768, 8
class Block(nn.Module):
    def __init__(s):
        super().__init__()
        s.ln_1, s.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
        s.attn = nn.Module(); s.attn.c_attn = nn.Linear(C, 3 * C); s.attn.c_proj = nn.Linear(C, C)
        s.mlp = nn.Module(); s.mlp.c_fc = nn.Linear(C, 4 * C); s.mlp.c_proj = nn.Linear(4 * C, C)
    def forward(s, x):
        b, t, c = x.shape
        q, k, v = s.attn.c_attn(s.ln_1(x)).split(C, dim=2)
        q, k, v = (z.view(b, t, H, C // H).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True) if hasattr(F, "scaled_dot_product_attention") else \
            (F.softmax((q @ k.transpose(-2, -1) / math.sqrt(C // H)).masked_fill(
                torch.ones(t, t, dtype=torch.bool, device=x.device).tril().logical_not(), float("-inf")), dim=-1) @ v)
        x = x + s.attn.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))
        return x + s.mlp.c_proj(F.gelu(s.mlp.c_fc(s.ln_2(x))))
class GPT(nn.Module):
    def __init__(s):
        super().__init__()
        s.wte, s.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
        s.h = nn.ModuleList([Block() for _ in range(L)]); s.ln_f = nn.LayerNorm(C)
        s.lm_head = nn.Linear(C, V, bias=False); s.lm_head.weight = s.wte.weight
    def forward(s, idx, tgt):
        x = s.wte(idx) + s.wpe(torch.arange(idx.shape[1], device=idx.device))
        for b in s.h: x = b(x)
        return F.cross_entropy(s.lm_head(s.ln_f(x)).view(-1, V), tgt.view(-1))
dev = torch.device("cuda", 0)
m = GPT().to(dev)
opt = torch.optim.AdamW(m.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1)
raw = np.fromfile(sys.argv[1] + "/train.bin", dtype=np.uint8)
tok = torch.from_numpy(raw[1024:].view(np.uint16).astype(np.int64)).to(dev)
def step():
    ix = torch.randint(len(tok) - T - 1, (B,), device=dev)
    x = torch.stack([tok[i:i + T] for i in ix]); y = torch.stack([tok[i + 1:i + 1 + T] for i in ix])
    opt.zero_grad(set_to_none=True); m(x, y).backward(); opt.step()
for _ in range(5): step()
torch.cuda.synchronize(); t0 = time.perf_counter()
for _ in range(20): step()
torch.cuda.synchronize()
print(f"{20 * B * T / (time.perf_counter() - t0):.0f} {torch.cuda.max_memory_allocated() / 2**20:.0f}")
PY
)
printf "%-12s %14s %14s %10s %16s %16s\n" model dtrain-cuda pytorch-cuda ratio "dtrain peak MiB" "pytorch peak MiB"
printf "%-12s %14s %14s %10s %16s %16s\n" gpt2 "$d" "${t%% *}" "$(ratio "$d" "${t%% *}")" "${mem:-n/a}" "${t##* }"
rm -rf "$TOK"
