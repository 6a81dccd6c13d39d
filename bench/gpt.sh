#!/usr/bin/env bash
# bench/gpt.sh: the GPT workload against PyTorch (peers/torch_gpt.py) on this machine, in one run.
#
#   bench/gpt.sh [speed|gpt2|quality] [STEPS]     (run from the build directory or set DT_BUILDDIR)
#
# Data: byte-level token files of Debian's fortunes (the text files of
# /usr/share/games/fortunes, sorted), made once by `dtrain prepare-text` in $DT_GPT_DATA
# (default /tmp/dtrain-gpt-fortunes); both programs read the same train.bin/val.bin.
#   speed   (default) the default gpt (4 layers, 4 heads, 128 wide, block 64, global batch
#           12, nanoGPT's recipe): tokens/s of dtrain and PyTorch on 1 process x 2 threads
#           and on 2 processes x 1 thread, STEPS steps each (default 60; PyTorch leaves out
#           its first 10 steps, dtrain counts every step), and dtrain's MFU against its
#           measured sgemm peak. In DT_BENCH_ROUNDS rounds (default 3; bench/lib.sh): each
#           round runs dtrain then PyTorch in each configuration; the table gives the
#           medians, and each round's ratio.
#   gpt2    the 124M GPT-2 (12 layers, 12 heads, 768 wide, vocabulary 50304) at block 256,
#           global batch 4, 1 process x 2 threads, STEPS steps (default 14): tokens/s of
#           both, dtrain's MFU and its peak memory (--rank-stats).
#   quality the default gpt for STEPS steps (default 2000) on 2 processes of each: final
#           train loss and validation loss (PyTorch: 20 batches; dtrain: --eval-batches 20).
set -u
here=$(cd "$(dirname "$0")" && pwd)
B=${DT_BUILDDIR:-$(pwd)}
MODE=${1:-speed}
. "$here/lib.sh"
fortunes_data bench/gpt.sh
find_peer torch_gpt.py
blas_kernels
# torch_run PROCS ITERS [L H C T GB [V]]
torch_run() {
    [ "$have_torch" -eq 1 ] || { echo "n/a"; return; }
    "$PY" "$PEERS/torch_gpt.py" "$DATA" "$@" 2>/dev/null | grep '^torch'
}

case $MODE in
speed)
    STEPS=${2:-60}
    printf "%-16s %14s %14s %8s %8s   %s\n" config "dtrain tok/s" "pytorch tok/s" ratio "MFU" "ratio per round"
    for cfg in "1 2" "2 1"; do
        set -- $cfg
        ds= ts= rs= ms=
        for r in $(seq "$ROUNDS"); do
            d=$(dtrain_run "$1" "$2" --model gpt --steps "$STEPS" --warmup 10 --no-eval)
            t=$(torch_run "$1" "$STEPS" | sed -n 's/.*tokens_per_s=\([0-9]*\).*/\1/p')
            dt=$(echo "$d" | tok)
            ds="$ds ${dt:-fail}" ts="$ts ${t:-fail}" rs="$rs $(ratio "${dt:-0}" "${t:-0}")"
            ms="$ms $(echo "$d" | sed -n 's/.*MFU \([0-9.]*\)%.*/\1/p')"
        done
        printf "%-16s %14s %14s %8s %7s%%  %s\n" "$1 proc x $2 thr" "$(median $ds)" "$(median $ts)" "$(median $rs)" \
            "$(median $ms)" "$rs"
    done
    ;;
gpt2)
    STEPS=${2:-14}
    all=$(dtrain_all 1 2 --model "gpt(layers=12,heads=12,dim=768,block=256,vocab=50304)" --batch 4 --steps "$STEPS" \
        --warmup 2 --no-eval --rank-stats "$STEPS")
    d=$(echo "$all" | grep 'dtrain: done')
    t=$(torch_run 1 "$STEPS" 12 12 768 256 4 50304 | sed -n 's/.*tokens_per_s=\([0-9]*\).*/\1/p')
    echo "gpt2 (124M, block 256, batch 4), 1 proc x 2 thr: dtrain $(echo "$d" | tok) tokens/s," \
         "pytorch ${t:-fail} tokens/s, ratio $(ratio "$(echo "$d" | tok)" "${t:-0}")"
    echo "$d"
    # peak resident memory (the per-rank step table) and the accounted split at the end
    echo "dtrain peak resident memory: $(echo "$all" | peak_rss_mib) MiB"
    echo "$all" | sed -n '/memory of rank 0 (accounted)/,/total/p'
    ;;
quality)
    STEPS=${2:-2000}
    d=$(dtrain_run 2 1 --model gpt --steps "$STEPS")
    t=$(torch_run 2 "$STEPS")
    echo "dtrain : $d"
    echo "pytorch: ${t:-n/a}"
    ;;
*) echo "usage: bench/gpt.sh [speed|gpt2|quality] [STEPS]"; exit 2 ;;
esac
