#!/usr/bin/env bash
# bench/precision.sh: mixed precision on the CPU — speed and final quality of
# --precision bf16 and fp16 against fp32, for the mlp, cnn, gpt and gpt2 presets, in one run.
#
#   bench/precision.sh [MODEL...]     (mlp cnn gpt gpt2 by default; run from the build
#                                      directory or set DT_BUILDDIR; THREADS=N threads,
#                                      default 2; ROUNDS=N, default 2)
#
#   gemm      first, bench/gemm_rate: the GEMM kernels' GFLOP/s on the gpt's and gpt2's
#             products, f32 against bf16 (the kernels DT_CPU_GEMM chose, named)
#   mlp, cnn  one epoch of Fashion-MNIST (234 steps at global batch 256, SGD momentum 0.9,
#             lr 0.05 cosine): samples/s and test accuracy
#   gpt       the default gpt (nanoGPT's recipe, global batch 12 of block 64) for GPT_STEPS
#             steps (default 600) on Debian's fortunes: tokens/s and validation loss (20
#             batches)
#   gpt2      GPT-2 124M at block 256, batch 4 (1,024 tokens a step), GPT2_STEPS steps
#             (default 12, warm-up 1, no evaluation): tokens/s and the final loss
# One process. A round runs fp32, bf16 and fp16 one after another, ROUNDS rounds: the
# speed shown is each precision's best round (on a shared machine the others' load comes
# and goes), the quality that of every round (the runs are deterministic: a round that
# differs is flagged). dtrain's figures count every step. "cpu" is the ratio of CPU
# seconds (user + system, the whole run: data loading and evaluation included) of fp32
# to this precision, the least of the rounds each: on a loaded machine it tells the work
# apart from the waiting better than wall time does.
# The peer: PyTorch 1.13 on the same CPU, the mlp and cnn in fp32 and under
# torch.autocast("cpu", dtype=torch.bfloat16), THREADS threads, global batch 256 of random
# inputs, SGD with momentum: samples/s over 20 steps (cnn: 8) after 3 warm-up steps.
set -u
here=$(cd "$(dirname "$0")" && pwd)
B=${DT_BUILDDIR:-$(pwd)}
THREADS=${THREADS:-2}
ROUNDS=${ROUNDS:-2}
GPT_STEPS=${GPT_STEPS:-600}
GPT2_STEPS=${GPT2_STEPS:-12}
DATA=${DT_GPT_DATA:-/tmp/dtrain-gpt-fortunes}
[ -x "$B/dtrain" ] || { echo "bench/precision.sh: no dtrain in $B (set DT_BUILDDIR)"; exit 2; }
models=${*:-mlp cnn gpt gpt2}
if [[ " $models " == *" gpt"* ]] && [ ! -s "$DATA/train.bin" ]; then
    files=$(ls -d /usr/share/games/fortunes/* 2>/dev/null | grep -v '\.' | LC_ALL=C sort)
    [ -n "$files" ] || { echo "bench/precision.sh: install Debian's fortunes package (apt-get install fortunes)"; exit 2; }
    "$B/dtrain" prepare-text "$DATA" $files > /dev/null || exit 1
fi

. "$here/lib.sh"   # ratio, median
# run MODEL PRECISION: prints "SPEED QUALITY CPU_SECONDS" from dtrain's final line and time(1)
tf=$(mktemp); trap 'rm -f "$tf"' EXIT
run() {
    local out cpu
    if [ "$1" = gpt2 ]; then
        out=$(/usr/bin/time -f '%U %S' -o "$tf" "$B/dtrain" train --data "tokens:$DATA" --steps "$GPT2_STEPS" --warmup 1 \
              --model 'gpt(layers=12,heads=12,dim=768,block=256,vocab=50304)' --batch 4 --eval-every 0 \
              --threads "$THREADS" --precision "$2" --quiet 2>&1 | grep 'done:')
        out=$(echo "$out" | sed -n 's/.* \([0-9][0-9]*\) tokens\/s.*final loss \([0-9.]*\).*/\1 \2/p')
    elif [ "$1" = gpt ]; then
        out=$(/usr/bin/time -f '%U %S' -o "$tf" "$B/dtrain" train --model gpt --data "tokens:$DATA" --steps "$GPT_STEPS" \
              --threads "$THREADS" --precision "$2" --quiet 2>&1 | grep 'done:')
        out=$(echo "$out" | sed -n 's/.* \([0-9][0-9]*\) tokens\/s.*val loss \([0-9.]*\).*/\1 \2/p')
    else
        out=$(/usr/bin/time -f '%U %S' -o "$tf" "$B/dtrain" train --model "$1" --epochs 1 --threads "$THREADS" \
              --precision "$2" --quiet 2>&1 | grep 'done:')
        out=$(echo "$out" | sed -n 's/.* \([0-9][0-9]*\) samples\/s.*test accuracy \([0-9.]*\).*/\1 \2/p')
    fi
    cpu=$(awk '{ printf "%.2f", $1 + $2 }' "$tf")
    echo "$out $cpu"
}

echo "dtrain $(git -C "$(dirname "$0")" rev-parse --short HEAD 2>/dev/null || echo ?), 1 process x $THREADS threads, $(nproc) cores, load $(cut -d' ' -f1 /proc/loadavg)"
echo "CPU: $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)$(grep -qw avx512_bf16 /proc/cpuinfo && echo ', AVX512-BF16')"
if [ -x "$B/bench/gemm_rate" ]; then "$B/bench/gemm_rate" -t "$THREADS"; echo; fi
printf "%-5s %-9s %18s %8s %8s %15s\n" model precision speed "vs fp32" cpu quality
for m in $models; do
    unit="samples/s"; qual="test acc"
    [ "$m" = gpt ] && unit="tokens/s" && qual="val loss"
    [ "$m" = gpt2 ] && unit="tokens/s" && qual="loss"
    declare -A speed=() quality=() cpu=()
    for ((r = 0; r < ROUNDS; r++)); do
        for p in fp32 bf16 fp16; do
            set -- $(run "$m" "$p")
            awk -v a="${1:-0}" -v b="${speed[$p]:-0}" 'BEGIN { exit !(a + 0 > b + 0) }' && speed[$p]=$1
            awk -v a="${3:-0}" -v b="${cpu[$p]:-0}" 'BEGIN { exit !(a + 0 > 0 && (b + 0 == 0 || a + 0 < b + 0)) }' && cpu[$p]=$3
            if [ -z "${quality[$p]:-}" ]; then quality[$p]=${2:-?}
            elif [ "${quality[$p]}" != "${2:-?}" ]; then quality[$p]="${quality[$p]} (differs: ${2:-?})"; fi
        done
    done
    for p in fp32 bf16 fp16; do
        printf "%-5s %-9s %18s %8s %8s %15s\n" "$m" "$p" "${speed[$p]:-fail} $unit" "$(ratio "${speed[$p]:-0}" "${speed[fp32]:-0}")" \
            "$(ratio "${cpu[fp32]:-0}" "${cpu[$p]:-0}")" "$qual ${quality[$p]}"
    done
done

have_torch=0
for py in ${PYTHON:-python3 /usr/bin/python3}; do
    if "$py" -c 'import torch' 2>/dev/null; then PY=$py; have_torch=1; break; fi
done
if [ "$have_torch" -eq 1 ]; then
    echo "PyTorch $("$PY" -c 'import torch; print(torch.__version__)'), same machine:"
    printf "%-5s %-9s %18s %8s\n" model precision speed "vs fp32"
    for m in $models; do
        [[ "$m" == gpt* ]] && continue
        "$PY" - "$m" "$THREADS" <<'PY'
import sys, time, torch, torch.nn as nn
name, threads = sys.argv[1], int(sys.argv[2])
torch.set_num_threads(threads); torch.manual_seed(0)
if name == "mlp":
    m = nn.Sequential(nn.Flatten(), nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))
else:
    m = nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
                      nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                      nn.Linear(3136, 128), nn.ReLU(), nn.Linear(128, 10))
opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
x, y = torch.randn(256, 1, 28, 28), torch.randint(0, 10, (256,))
def steps(bf16, n):
    for _ in range(n):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            out = m(x)
        nn.functional.cross_entropy(out.float(), y).backward()
        opt.step()
n = 20 if name == "mlp" else 8
sps = {}
for bf16 in (False, True):
    steps(bf16, 3)
    t0 = time.perf_counter(); steps(bf16, n); sps[bf16] = n * 256 / (time.perf_counter() - t0)
for bf16, label in ((False, "fp32"), (True, "bf16")):
    print("%-5s %-9s %18s %8.2f" % (name, label, "%.0f samples/s" % sps[bf16], sps[bf16] / sps[False]))
PY
    done
fi
echo "load at the end $(cut -d' ' -f1 /proc/loadavg)"
