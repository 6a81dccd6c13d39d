#!/usr/bin/env bash
# bench/llama.sh: the llama preset against PyTorch (peers/torch_llama.py, Hugging Face
# LlamaForCausalLM's architecture) on this machine, in one run.
#
#   bench/llama.sh [speed|smollm|quality|all] [STEPS]   (run from the build directory or set DT_BUILDDIR)
#
# Data: the byte-level token files of Debian's fortunes (bench/lib.sh fortunes_data);
# both programs read the same train.bin/val.bin.
#   speed   (default) the default llama (4 layers, 4 query heads, 2 key/value heads, 128
#           wide, SwiGLU 352, block 64, global batch 12, nanoGPT's recipe): tokens/s of
#           dtrain and PyTorch on 1 process x 2 threads and on 2 processes x 1 thread,
#           STEPS steps each (default 60; PyTorch leaves out its first 10 steps, dtrain
#           counts every step), and dtrain's MFU against its measured sgemm peak; medians
#           of DT_BENCH_ROUNDS rounds (default 3), each round's ratio.
#   smollm  SmolLM-135M's shape (30 layers, 9 heads, 3 key/value heads, 576 wide, SwiGLU
#           1536, vocabulary 49152) at block 256, global batch 4, 1 process x 2 threads,
#           STEPS steps (default 8): tokens/s of both, dtrain's MFU, its peak resident
#           and accounted memory, and `dtrain plan`'s estimate of the same run. The head is
#           untied on both sides (the peer's model has no tied head; SmolLM ties it, which
#           changes the parameter count, not the work).
#   quality the default llama for STEPS steps (default 2000) on 2 processes of each, for
#           seeds 0..DT_LLAMA_SEEDS-1 (default 4): each validation loss (PyTorch: 20 random
#           batches; dtrain: --eval-batches 20) and the means. The peer's seeds (1337 for
#           its init, 1000 + rank for its batches) are offset by the seed.
set -u
here=$(cd "$(dirname "$0")" && pwd)
B=${DT_BUILDDIR:-$(pwd)}
MODE=${1:-speed}
. "$here/lib.sh"
fortunes_data bench/llama.sh
find_peer torch_llama.py
grep -m1 "model name" /proc/cpuinfo | sed 's/.*: /cpu: /'
echo "cores: $(nproc); $(blas_kernels)"
[ "$have_torch" -eq 1 ] || echo "PyTorch or $PEERS/torch_llama.py missing: the peer's columns say n/a"

# The peer under a seed: seeded_llama.py (written to a temporary folder) offsets the
# peer's torch.manual_seed (1337, its init) and its batch generators' seeds (1000 + rank)
# by SEED, in every process it spawns, then runs torch_llama.py's own run().
tmpd=$(mktemp -d) || exit 1
trap 'rm -rf "$tmpd"' EXIT
cat > "$tmpd/seeded_llama.py" <<'PYEOF'
import sys, torch
import torch_llama


def seeded(rank, off, *args):
    seed = torch.manual_seed
    torch.manual_seed = lambda s: seed(s + off)

    class Gen(torch.Generator):
        def manual_seed(self, s):
            return super().manual_seed(s + off)
    torch.Generator = Gen
    torch_llama.run(rank, *args)


if __name__ == "__main__":
    off, a = int(sys.argv[1]), sys.argv[2:]
    data, n, iters = a[0], int(a[1]), int(a[2])
    shape = [int(x) for x in a[3:10]] if len(a) >= 10 else [4, 4, 2, 128, 352, 64, 12]
    args = (n, data, iters, *shape, int(a[10]) if len(a) >= 11 else 0)
    if n > 1:
        torch_llama.mp.spawn(seeded, args=(off, *args), nprocs=n)
    else:
        seeded(0, off, *args)
PYEOF
# torch_run SEED PROCS ITERS [L H KVH C HID T GB [V]]: the peer's result line
torch_run() {
    [ "$have_torch" -eq 1 ] || { echo "n/a"; return; }
    local seed=$1; shift
    PYTHONPATH="$PEERS${PYTHONPATH:+:$PYTHONPATH}" "$PY" "$tmpd/seeded_llama.py" "$seed" "$DATA" "$@" 2>/dev/null |
        grep '^torch'
}

speed() {
    local STEPS=$1
    echo "== speed: the default llama, $STEPS steps, medians of $ROUNDS rounds"
    printf "%-16s %14s %14s %8s %8s   %s\n" config "dtrain tok/s" "pytorch tok/s" ratio "MFU" "ratio per round"
    for cfg in "1 2" "2 1"; do
        set -- $cfg
        local ds= ts= rs= ms= r d t dt
        for r in $(seq "$ROUNDS"); do
            d=$(dtrain_run "$1" "$2" --model llama --steps "$STEPS" --warmup 10 --no-eval)
            t=$(torch_run 0 "$1" "$STEPS" | peer_field tokens_per_s)
            dt=$(echo "$d" | tok)
            ds="$ds ${dt:-fail}" ts="$ts ${t:-fail}" rs="$rs $(ratio "${dt:-0}" "${t:-0}")"
            ms="$ms $(echo "$d" | sed -n 's/.*MFU \([0-9.]*\)%.*/\1/p')"
        done
        printf "%-16s %14s %14s %8s %7s%%  %s\n" "$1 proc x $2 thr" "$(median $ds)" "$(median $ts)" "$(median $rs)" \
            "$(median $ms)" "$rs"
    done
}

smollm() {
    local STEPS=$1
    local M="llama(layers=30,heads=9,kv_heads=3,dim=576,hidden=1536,block=256,vocab=49152)"
    echo "== smollm: SmolLM-135M's shape at block 256, global batch 4, 1 process x 2 threads, $STEPS steps"
    local all d t
    all=$(dtrain_all 1 2 --model "$M" --batch 4 --steps "$STEPS" --warmup 1 --no-eval --rank-stats "$STEPS")
    d=$(echo "$all" | grep 'dtrain: done')
    t=$(torch_run 0 1 "$((STEPS + 10))" 30 9 3 576 1536 256 4 49152 | peer_field tokens_per_s)
    echo "dtrain $(echo "$d" | tok) tokens/s, pytorch ${t:-fail} tokens/s, ratio $(ratio "$(echo "$d" | tok)" "${t:-0}")"
    echo "$d"
    echo "dtrain peak resident memory: $(echo "$all" | peak_rss_mib) MiB"
    echo "$all" | sed -n '/memory of rank 0 (accounted)/,/total/p'
    echo "dtrain plan for the same run (--shard none, fp32):"
    "$B/dtrain" plan --model "$M" --np 1 --batch 4 --micro-batches 1 --optim adamw --no-eval --shard none \
        --precision fp32 2>&1 | grep -v '^$'
}

quality() {
    local STEPS=$1 SEEDS=${DT_LLAMA_SEEDS:-4} s d t dv= tv=
    echo "== quality: the default llama, $STEPS steps on 2 processes, seeds 0..$((SEEDS - 1))"
    printf "%-6s %14s %14s\n" seed "dtrain val" "pytorch val"
    for s in $(seq 0 $((SEEDS - 1))); do
        d=$(dtrain_run 2 1 --model llama --steps "$STEPS" --seed "$s" | sed -n 's/.*val loss \([0-9.]*\).*/\1/p')
        t=$(torch_run "$s" 2 "$STEPS" | peer_field val_loss)
        printf "%-6s %14s %14s\n" "$s" "${d:-fail}" "${t:-n/a}"
        dv="$dv ${d:-}" tv="$tv ${t:-}"
    done
    printf '%s\n' "$dv" "$tv" | awk '{ s = 0; n = 0; for (i = 1; i <= NF; i++) { s += $i; n++ }
        m[NR] = n ? sprintf("%.4f", s / n) : "n/a"; c[NR] = n }
        END { printf "mean   %14s %14s   (over %d and %d seeds)\n", m[1], m[2], c[1], c[2];
              if (c[1] && c[2]) printf "difference of the means: %.4f\n", m[1] - m[2] }'
}

case $MODE in
speed) speed "${2:-60}" ;;
smollm) smollm "${2:-8}" ;;
quality) quality "${2:-2000}" ;;
all) speed 60; smollm 8; quality 2000 ;;
*) echo "usage: bench/llama.sh [speed|smollm|quality|all] [STEPS]"; exit 2 ;;
esac
