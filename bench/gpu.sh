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

dtrain_sps() {  # model s1 s2
    local t0 t1 t2
    t0=$(date +%s.%N)
    timeout 300 ./dtrain train --device cuda --model "$1" --data synthetic:16384,1,28,28,10 --batch $B \
        --steps "$2" --lr 0.05 --momentum 0.9 --weight-decay 5e-4 --schedule constant --no-eval --quiet > /dev/null 2>&1 || { echo fail; return; }
    t1=$(date +%s.%N)
    timeout 300 ./dtrain train --device cuda --model "$1" --data synthetic:16384,1,28,28,10 --batch $B \
        --steps "$3" --lr 0.05 --momentum 0.9 --weight-decay 5e-4 --schedule constant --no-eval --quiet > /dev/null 2>&1 || { echo fail; return; }
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
def step(i):
    opt.zero_grad(set_to_none=True)
    loss = lossf(m(X[i % 64]), Y[i % 64]); loss.backward(); opt.step()
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
