"""gpu_torch.py: the PyTorch side of bench/gpu.sh's throughput rows, on the GPU.

    python3 bench/gpu_torch.py MODEL BATCH WARMUP STEPS TF32 [TOKENS_DIR]

MODEL is cnn, mlp8x4096 (flatten, 8 x (linear(4096) relu), linear(10)), gpt2 (nanoGPT's
GPT at 12 layers, 12 heads, width 768, block 1024, vocabulary 50304) or gpt:L,H,C,T,V
(the same GPT at L layers, H heads, width C, block T, vocabulary V; dtrain's default gpt
is gpt:4,4,128,64,256); the GPTs train with AdamW and gradient clipping at 1 (dtrain's
gpt defaults) on TOKENS_DIR, dtrain prepare-text's output. cnn and mlp train with SGD
(momentum 0.9, lr 0.05, weight decay 5e-4) on random 1x28x28 images held on the GPU, as dtrain's synthetic data.
TF32 is 0 or 1 (matmul and cuDNN), or bf16: TF32 off and the forward and loss under
torch.autocast("cuda", dtype=torch.bfloat16), as dtrain's --precision bf16. WARMUP steps run first; then STEPS steps are timed
between torch.cuda.synchronize() calls, inside the process. Prints one line:
    ms_per_step samples_per_s peak_mib
or "n/a REASON" when PyTorch or its CUDA is missing.
"""
import math
import sys
import time


def main():
    name, batch, warmup, steps, tf32 = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    try:
        import torch
        import torch.nn as nn
        import torch.nn.functional as F
    except Exception as e:  # noqa: BLE001 - any import failure means no peer
        print("n/a no PyTorch (%s)" % type(e).__name__)
        return
    if not torch.cuda.is_available():
        print("n/a PyTorch %s has no usable CUDA" % torch.__version__)
        return
    torch.backends.cuda.matmul.allow_tf32 = tf32 == "1"
    torch.backends.cudnn.allow_tf32 = tf32 == "1"
    dev = torch.device("cuda", 0)
    bf16 = tf32 == "bf16"
    if name == "gpt2":
        name = "gpt:12,12,768,1024,50304"
    if name.startswith("gpt:"):
        shape = [int(v) for v in name[4:].split(",")]
        step, per_step = gpt_step(torch, nn, F, dev, batch, sys.argv[6], shape, bf16), batch * shape[3]
    else:
        step, per_step = image_step(torch, nn, dev, name, batch, bf16), batch
    for i in range(warmup):
        step(i)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for i in range(steps):
        step(i)
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / steps
    print("%.3f %.0f %.0f" % (dt * 1e3, per_step / dt, torch.cuda.max_memory_allocated() / 2**20))


def image_step(torch, nn, dev, name, batch, bf16):
    if name == "cnn":
        m = nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Flatten(), nn.Linear(3136, 128), nn.ReLU(), nn.Linear(128, 10))
    else:
        layers, d = [nn.Flatten()], 784
        for _ in range(8):
            layers += [nn.Linear(d, 4096), nn.ReLU()]
            d = 4096
        m = nn.Sequential(*layers, nn.Linear(d, 10))
    m = m.to(dev)
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    lossf = nn.CrossEntropyLoss()
    X = torch.rand(8, batch, 1, 28, 28, device=dev)
    Y = torch.randint(0, 10, (8, batch), device=dev)

    def step(i):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            loss = lossf(m(X[i % 8]), Y[i % 8])
        loss.backward()
        opt.step()
    return step


def gpt_step(torch, nn, F, dev, B, tokens, shape, bf16):
    import numpy as np
    L, H, C, T, V = shape

    class Block(nn.Module):
        def __init__(s):
            super().__init__()
            s.ln_1, s.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
            s.c_attn, s.attn_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
            s.c_fc, s.mlp_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

        def forward(s, x):
            b, t, c = x.shape
            q, k, v = s.c_attn(s.ln_1(x)).split(C, dim=2)
            q, k, v = (z.view(b, t, H, C // H).transpose(1, 2) for z in (q, k, v))
            if hasattr(F, "scaled_dot_product_attention"):
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril().logical_not()
                y = F.softmax((q @ k.transpose(-2, -1) / math.sqrt(C // H)).masked_fill(mask, float("-inf")), -1) @ v
            x = x + s.attn_proj(y.transpose(1, 2).contiguous().view(b, t, c))
            return x + s.mlp_proj(F.gelu(s.c_fc(s.ln_2(x))))

    class GPT(nn.Module):
        def __init__(s):
            super().__init__()
            s.wte, s.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
            s.h = nn.ModuleList([Block() for _ in range(L)])
            s.ln_f = nn.LayerNorm(C)
            s.lm_head = nn.Linear(C, V, bias=False)
            s.lm_head.weight = s.wte.weight

        def forward(s, idx, tgt):
            x = s.wte(idx) + s.wpe(torch.arange(idx.shape[1], device=idx.device))
            for b in s.h:
                x = b(x)
            return F.cross_entropy(s.lm_head(s.ln_f(x)).view(-1, V), tgt.view(-1))

    m = GPT().to(dev)
    opt = torch.optim.AdamW(m.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1)
    raw = np.fromfile(tokens + "/train.bin", dtype=np.uint8)
    tok = torch.from_numpy(raw[1024:].view(np.uint16).astype(np.int64)).to(dev)

    def step(i):
        ix = torch.randint(len(tok) - T - 1, (B,), device=dev)
        x = torch.stack([tok[j:j + T] for j in ix])
        y = torch.stack([tok[j + 1:j + 1 + T] for j in ix])
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            loss = m(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
    return step


if __name__ == "__main__":
    main()
