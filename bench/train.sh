#!/usr/bin/env bash
# bench/train.sh: training throughput of dtrain against PyTorch on this machine, in one run.
#
#   bench/train.sh [EPOCHS]        (default 1 epoch; run from the build directory or set DT_BUILDDIR)
#
# For each preset (mlp, cnn) it trains one epoch of Fashion-MNIST at global batch 256
# with SGD (momentum 0.9, lr 0.05 cosine, weight decay 5e-4) and prints samples/s:
#   - dtrain, 1 process x 2 threads, and PyTorch 1.13 (peers/torch_ddp_fmnist.py MODEL 1 N);
#   - dtrain, 2 processes x 1 thread (dtrun -n 2), and PyTorch DDP with Gloo, 2 processes;
#   - dtrain, 1 process x 1 thread, for the scaling ratio 2x1 / 1x1;
#   - overlap: on 2 processes, the communication wait per step with buckets launched
#     during backward against --no-overlap (all-reduce after backward); the hidden
#     fraction is 1 - wait(overlap) / wait(no overlap).
# PyTorch's figure excludes its first 20 steps; dtrain's counts every step of the epoch.
set -u
here=$(cd "$(dirname "$0")" && pwd)
B=${DT_BUILDDIR:-$(pwd)}
EPOCHS=${1:-1}
PEERS=${DT_PEERS:-$here/../../shared/peers}
[ -d "$PEERS" ] || PEERS=$here/../shared/peers
[ -x "$B/dtrain" ] || { echo "bench/train.sh: no dtrain in $B (set DT_BUILDDIR)"; exit 2; }
# Debian's python3-torch lives under /usr/bin/python3, which another python3 on PATH may shadow.
have_torch=0
for py in ${PYTHON:-python3 /usr/bin/python3}; do
    if "$py" -c 'import torch' 2>/dev/null && [ -f "$PEERS/torch_ddp_fmnist.py" ]; then PY=$py; have_torch=1; break; fi
done

dtrain_sps() {  # $1 model, $2 procs, $3 threads
    local out
    if [ "$2" -eq 1 ]; then
        out=$("$B/dtrain" train --model "$1" --epochs "$EPOCHS" --threads "$3" --no-eval --quiet 2>&1)
    else
        out=$(OMP_NUM_THREADS=$3 "$B/dtrun" -n "$2" "$B/dtrain" train --model "$1" --epochs "$EPOCHS" \
              --threads "$3" --no-eval --quiet 2>&1)
    fi
    echo "$out" | sed -n 's/.* \([0-9][0-9]*\) samples\/s.*/\1/p' | tail -1
}
torch_sps() {  # $1 model, $2 procs
    [ "$have_torch" -eq 1 ] || { echo "n/a"; return; }
    "$PY" "$PEERS/torch_ddp_fmnist.py" "$1" "$2" "$EPOCHS" 2>/dev/null | sed -n 's/.*samples_per_s=\([0-9]*\).*/\1/p'
}
. "$here/lib.sh"   # ratio, median
blas_kernels

printf "%-5s %-14s %12s %12s %8s\n" model config dtrain pytorch ratio
for m in mlp cnn; do
    d1=$(dtrain_sps $m 1 2); t1=$(torch_sps $m 1)
    printf "%-5s %-14s %12s %12s %8s\n" $m "1 proc x 2 thr" "${d1:-fail}" "${t1:-fail}" "$(ratio "${d1:-0}" "${t1:-0}")"
    d2=$(dtrain_sps $m 2 1); t2=$(torch_sps $m 2)
    printf "%-5s %-14s %12s %12s %8s\n" $m "2 proc x 1 thr" "${d2:-fail}" "${t2:-fail}" "$(ratio "${d2:-0}" "${t2:-0}")"
    d11=$(dtrain_sps $m 1 1)
    printf "%-5s %-14s %12s %12s %8s\n" $m "1 proc x 1 thr" "${d11:-fail}" "" ""
    echo "$m scaling 2x1 / 1x1: $(ratio "${d2:-0}" "${d11:-0}")"
done

comm_wait_ms() {  # $1 model, $2 extra flag: mean communication wait per step (ms) on rank 0
    local f; f=$(mktemp)
    OMP_NUM_THREADS=1 "$B/dtrun" -n 2 "$B/dtrain" train --model "$1" --steps 100 --threads 1 --no-eval \
        --quiet --rank-stats 100 --metrics "$f" $2 > /dev/null 2>&1
    sed -n 's/.*"event":"rank","step":100,"rank":0,"steps":\([0-9]*\),.*"comm_s":\([0-9.]*\).*/\1 \2/p' "$f" |
        awk '{ if ($1 > 0) printf "%.2f", 1000 * $2 / $1 }'
    rm -f "$f"
}
echo
printf "%-5s %22s %22s %8s\n" model "comm wait, overlap (ms)" "comm wait, after (ms)" hidden
for m in mlp cnn; do
    a=$(comm_wait_ms $m ""); b=$(comm_wait_ms $m --no-overlap)
    h=$(awk -v a="${a:-0}" -v b="${b:-0}" 'BEGIN { if (b > 0) printf "%.0f%%", 100 * (1 - a / b); else printf "n/a" }')
    printf "%-5s %22s %22s %8s\n" $m "${a:-fail}" "${b:-fail}" "$h"
done
