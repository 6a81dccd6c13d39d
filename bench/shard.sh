#!/usr/bin/env bash
# bench/shard.sh: what sharding (--shard, ZeRO-1/2/3) costs and buys on this machine, in one run.
#
#   bench/shard.sh [speed|memory|all]      (run from the build directory or set DT_BUILDDIR)
#
#   speed   throughput of every shard mode against --shard none in the same run:
#           the default gpt on fortunes (60 steps, 2 processes x 1 thread, tokens/s), and
#           the mlp on Fashion-MNIST (1 epoch, 2 processes x 1 thread, samples/s) next
#           to PyTorch DDP over Gloo (peers/torch_ddp_fmnist.py mlp 2) and to dtrain on
#           1 process x 1 thread (the scaling ratio).
#   memory  the largest model that trains under a per-rank memory cap: gpt models of
#           8 layers and growing width (block 64, batch 8, AdamW) on 2 and 4 processes,
#           --shard none against --shard params; a model fits when every rank's peak
#           resident memory (the per-rank table of --rank-stats) stays within
#           DT_SHARD_CAP_MIB (default 256) MiB. Prints every width's peak and the
#           largest that fits in each mode, with its parameter count.
set -u
here=$(cd "$(dirname "$0")" && pwd)
B=${DT_BUILDDIR:-$(pwd)}
MODE=${1:-all}
CAP=${DT_SHARD_CAP_MIB:-256}
PEERS=${DT_PEERS:-$here/../../shared/peers}
[ -d "$PEERS" ] || PEERS=$here/../shared/peers
DATA=${DT_GPT_DATA:-/tmp/dtrain-gpt-fortunes}
[ -x "$B/dtrain" ] || { echo "bench/shard.sh: no dtrain in $B (set DT_BUILDDIR)"; exit 2; }
if [ ! -s "$DATA/train.bin" ]; then
    files=$(ls -d /usr/share/games/fortunes/* 2>/dev/null | grep -v '\.' | LC_ALL=C sort)
    [ -n "$files" ] || { echo "bench/shard.sh: install Debian's fortunes package (apt-get install fortunes)"; exit 2; }
    "$B/dtrain" prepare-text "$DATA" $files > /dev/null || exit 1
fi
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { a += 0; b += 0; if (b > 0 && a > 0) printf "%.2f", a / b; else printf "n/a" }'; }
# run2 ARGS...: dtrain train on 2 processes x 1 thread; its final line
run_np() {
    local np=$1; shift
    OMP_NUM_THREADS=1 "$B/dtrun" -n "$np" "$B/dtrain" train --threads 1 "$@" 2>&1 | sed 's/^\[rank0\]://'
}

if [ "$MODE" = speed ] || [ "$MODE" = all ]; then
    echo "gpt (default), 2 processes x 1 thread, 60 steps: tokens/s"
    printf "%-8s %10s %10s\n" shard tokens/s "vs none"
    base=
    for m in none optim grads params; do
        t=$(run_np 2 --model gpt --data "tokens:$DATA" --steps 60 --warmup 5 --eval-batches 1 --log-every 1000000 \
            --shard $m | sed -n 's/.*dtrain: done.* \([0-9][0-9]*\) tokens\/s.*/\1/p')
        [ $m = none ] && base=$t
        printf "%-8s %10s %10s\n" $m "${t:-fail}" "$(ratio "${t:-0}" "${base:-0}")"
    done
    echo
    echo "mlp on Fashion-MNIST, 1 epoch: samples/s"
    tp=n/a
    for py in ${PYTHON:-python3 /usr/bin/python3}; do
        if "$py" -c 'import torch' 2>/dev/null && [ -f "$PEERS/torch_ddp_fmnist.py" ]; then
            tp=$("$py" "$PEERS/torch_ddp_fmnist.py" mlp 2 1 2>/dev/null | sed -n 's/.*samples_per_s=\([0-9]*\).*/\1/p')
            break
        fi
    done
    one=$("$B/dtrain" train --model mlp --epochs 1 --threads 1 --no-eval --quiet 2>&1 |
          sed -n 's/.* \([0-9][0-9]*\) samples\/s.*/\1/p' | tail -1)
    printf "%-24s %10s %12s %10s\n" configuration samples/s "vs PyTorch" "scaling"
    printf "%-24s %10s %12s %10s\n" "PyTorch DDP, 2 x 1" "${tp:-fail}" "" ""
    printf "%-24s %10s %12s %10s\n" "dtrain, 1 x 1" "${one:-fail}" "" ""
    for m in none optim grads params; do
        s=$(run_np 2 --model mlp --epochs 1 --no-eval --quiet --shard $m | sed -n 's/.* \([0-9][0-9]*\) samples\/s.*/\1/p' | tail -1)
        printf "%-24s %10s %12s %10s\n" "dtrain, 2 x 1, $m" "${s:-fail}" "$(ratio "${s:-0}" "${tp:-0}")" "$(ratio "${s:-0}" "${one:-0}")"
    done
    echo
fi

if [ "$MODE" = memory ] || [ "$MODE" = all ]; then
    echo "gpt, 8 layers, block 64, batch 8, AdamW: peak resident MiB per rank (the largest rank); cap $CAP MiB"
    for np in 2 4; do
        printf "%-3s %-6s %12s %10s %10s\n" np width params none params
        best_none=0; best_params=0; pn_none=0; pn_params=0
        for C in 128 256 384 512 640 768 896 1024; do
            row=""
            for m in none params; do
                out=$(run_np "$np" --model "gpt(layers=8,heads=8,dim=$C,block=64)" --data "tokens:$DATA" --batch 8 \
                      --steps 2 --warmup 1 --optim adamw --no-eval --rank-stats 2 --shard $m)
                peak=$(echo "$out" | awk '/peak MiB/ { on = 1; next } on && NF >= 7 && $1 ~ /^[0-9]+$/ { if ($6 > x) x = $6 } END { print x + 0 }')
                n=$(echo "$out" | sed -n 's/.* \([0-9,]*\) parameters.*/\1/p' | head -1 | tr -d ,)
                row="$row $peak"
                if [ "${peak%.*}" -gt 0 ] && awk -v p="$peak" -v c="$CAP" 'BEGIN { exit !(p <= c) }'; then
                    [ $m = none ] && { best_none=$C; pn_none=$n; }
                    [ $m = params ] && { best_params=$C; pn_params=$n; }
                fi
            done
            set -- $row
            printf "%-3s %-6s %12s %10s %10s\n" "$np" "$C" "${n:-?}" "$1" "$2"
        done
        echo "np $np: largest width within $CAP MiB: none $best_none (${pn_none} parameters), params $best_params" \
             "(${pn_params} parameters): $(ratio "$pn_params" "$pn_none")x the parameters"
    done
fi
