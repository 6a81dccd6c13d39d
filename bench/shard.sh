#!/usr/bin/env bash
# bench/shard.sh: what sharding (--shard, ZeRO-1/2/3) costs and buys on this machine, in one run.
#
#   bench/shard.sh [speed|memory|all]      (run from the build directory or set DT_BUILDDIR)
#
#   speed   throughput of every shard mode against --shard none in the same run, in
#           DT_BENCH_ROUNDS rounds (default 3; medians, bench/lib.sh):
#           the default gpt on fortunes (60 steps, 2 processes x 1 thread, tokens/s), and
#           the mlp on Fashion-MNIST (1 epoch, 2 processes x 1 thread, samples/s) next
#           to PyTorch DDP over Gloo (peers/torch_ddp_fmnist.py mlp 2) and to dtrain on
#           1 process x 1 thread (the scaling ratio). The scaling's ceiling on this
#           machine: two 1 x 1 processes at the ranks' batch (128) side by side, with
#           no communication between them; their samples/s together over 1 x 1's.
#   memory  the largest model that trains under a per-rank memory cap: gpt models of
#           8 layers and growing width (block 64, batch 8, AdamW) on 2 and 4 processes,
#           --shard none against --shard params; a model fits when every rank's peak
#           resident memory (the per-rank table of --rank-stats) stays within
#           DT_SHARD_CAP_MIB (default 256) MiB. Prints the peaks on a grid of widths,
#           then the largest width (to a multiple of 8, the head count; by bisection) that
#           fits in each mode, with its parameter count and peak, without and with
#           --recompute (same batch and flags in both modes), with --backward-prefetch
#           post, the least memory (DT_SHARD_PREFETCH=pre for the default).
#           DT_SHARD_CAP_BY=accounted measures the accounted peak (--rank-stats' second
#           table: what --max-memory caps, without the process's own ~13 MiB) instead of
#           the resident one, and checks each largest width against the enforced cap:
#           it trains under --max-memory CAP, the next multiple of 8 stops.
set -u
here=$(cd "$(dirname "$0")" && pwd)
B=${DT_BUILDDIR:-$(pwd)}
MODE=${1:-all}
CAP=${DT_SHARD_CAP_MIB:-256}
. "$here/lib.sh"
fortunes_data bench/shard.sh
find_peer torch_ddp_fmnist.py
tmpd=$(mktemp -d) || exit 1
trap 'rm -rf "$tmpd"' EXIT
# run2 ARGS...: dtrain train on 2 processes x 1 thread; its final line
run_np() {
    local np=$1; shift
    OMP_NUM_THREADS=1 "$B/dtrun" -n "$np" "$B/dtrain" train --threads 1 "$@" 2>&1 | sed 's/^\[rank0\]://'
}

MODES="none optim grads params"
if [ "$MODE" = speed ] || [ "$MODE" = all ]; then
    # rounds (bench/lib.sh): every configuration once per round; medians of the rates
    # and of the ratios taken within a round
    declare -A rate vs_none
    echo "gpt (default), 2 processes x 1 thread, 60 steps: tokens/s (medians of $ROUNDS rounds)"
    for r in $(seq "$ROUNDS"); do
        for m in $MODES; do
            t=$(run_np 2 --model gpt --data "tokens:$DATA" --steps 60 --warmup 5 --eval-batches 1 --log-every 1000000 \
                --shard $m | sed -n 's/.*dtrain: done.* \([0-9][0-9]*\) tokens\/s.*/\1/p')
            [ $m = none ] && base=${t:-0}
            rate[$m]+=" ${t:-fail}" vs_none[$m]+=" $(ratio "${t:-0}" "$base")"
        done
    done
    printf "%-8s %10s %10s   %s\n" shard tokens/s "vs none" "vs none per round"
    for m in $MODES; do
        printf "%-8s %10s %10s   %s\n" $m "$(median ${rate[$m]})" "$(median ${vs_none[$m]})" "${vs_none[$m]}"
    done
    echo
    echo "mlp on Fashion-MNIST, 1 epoch: samples/s (medians of $ROUNDS rounds)"
    declare -A sps vs_torch scaling
    one() {   # dtrain on 1 process x 1 thread, one epoch: its samples/s
        "$B/dtrain" train --model mlp --epochs 1 --threads 1 --no-eval --quiet "$@" 2>&1 |
            sed -n 's/.* \([0-9][0-9]*\) samples\/s.*/\1/p' | tail -1
    }
    for r in $(seq "$ROUNDS"); do
        t=n/a
        [ "$have_torch" -eq 1 ] && t=$("$PY" "$PEERS/torch_ddp_fmnist.py" mlp 2 1 2>/dev/null | peer_field samples_per_s)
        o=$(one)
        # the ceiling: two processes computing the ranks' half batches, nothing exchanged
        one --batch 128 > "$tmpd/apart0" & one --batch 128 > "$tmpd/apart1"; wait
        a=$(cat "$tmpd/apart0" "$tmpd/apart1" | awk 'NF { s += $1; n++ } END { if (n == 2) print s }')
        sps[torch]+=" ${t:-fail}" sps[one]+=" ${o:-fail}" sps[apart]+=" ${a:-fail}" scaling[apart]+=" $(ratio "${a:-0}" "${o:-0}")"
        for m in $MODES; do
            s=$(run_np 2 --model mlp --epochs 1 --no-eval --quiet --shard $m | sed -n 's/.* \([0-9][0-9]*\) samples\/s.*/\1/p' | tail -1)
            sps[$m]+=" ${s:-fail}" vs_torch[$m]+=" $(ratio "${s:-0}" "${t:-0}")" scaling[$m]+=" $(ratio "${s:-0}" "${o:-0}")"
        done
    done
    printf "%-24s %10s %12s %10s   %s\n" configuration samples/s "vs PyTorch" "scaling" "per round: vs PyTorch / scaling"
    printf "%-24s %10s\n" "PyTorch DDP, 2 x 1" "$(median ${sps[torch]})"
    printf "%-24s %10s\n" "dtrain, 1 x 1" "$(median ${sps[one]})"
    printf "%-24s %10s %12s %10s   %s\n" "2 x (1 x 1), apart" "$(median ${sps[apart]})" "" \
        "$(median ${scaling[apart]})" "${scaling[apart]} (the ceiling: no communication)"
    for m in $MODES; do
        printf "%-24s %10s %12s %10s   %s /%s\n" "dtrain, 2 x 1, $m" "$(median ${sps[$m]})" "$(median ${vs_torch[$m]})" \
            "$(median ${scaling[$m]})" "${vs_torch[$m]}" "${scaling[$m]}"
    done
    echo
fi

if [ "$MODE" = memory ] || [ "$MODE" = all ]; then
    BY=${DT_SHARD_CAP_BY:-rss}
    case $BY in rss|accounted) ;; *) echo "bench/shard.sh: DT_SHARD_CAP_BY must be rss or accounted, got '$BY'" >&2; exit 2 ;; esac
    # gpt NP MODE C [flags...]: one run of width C, its output
    gpt() {
        local np=$1 m=$2 c=$3; shift 3
        run_np "$np" --model "gpt(layers=8,heads=8,dim=$c,block=64)" --data "tokens:$DATA" --batch 8 \
            --steps 2 --warmup 1 --optim adamw --no-eval --rank-stats 2 --shard "$m" \
            --backward-prefetch "${DT_SHARD_PREFETCH:-post}" $EXTRA "$@"
    }
    # peak NP MODE C: "PEAK PARAMS": the largest rank's peak MiB (resident, or accounted
    # with DT_SHARD_CAP_BY=accounted) for width C (0 when the run failed) and the
    # parameter count
    peak() {
        out=$(gpt "$@")
        n=$(echo "$out" | sed -n 's/.* \([0-9,]*\) parameters.*/\1/p' | head -1 | tr -d ,)
        if [ "$BY" = accounted ]; then
            echo "$(echo "$out" | awk '/now\/peak/ { on = 1; next } on && $1 == "rank" { next } on && $1 ~ /^[0-9]+$/ && NF == 8 {
                split($8, a, "/"); if (a[2] + 0 > x) x = a[2] + 0 } on && $1 !~ /^[0-9]+$/ { on = 0 }
                END { print x + 0 }') ${n:-0}"
        else
            echo "$(echo "$out" | peak_rss_mib) ${n:-0}"
        fi
    }
    fits() { set -- $1; awk -v p="$1" -v c="$CAP" 'BEGIN { exit !(p > 0 && p <= c) }'; }
    echo "gpt, 8 layers, block 64, batch 8, AdamW, --backward-prefetch ${DT_SHARD_PREFETCH:-post}:" \
         "peak $([ "$BY" = rss ] && echo resident || echo accounted) MiB per rank (the largest rank); cap $CAP MiB"
    EXTRA=
    for np in 2 4; do
        printf "%-3s %-6s %12s %10s %10s\n" np width params none params
        for C in 128 256 384 512 640 768 896 1024; do
            set -- $(peak "$np" none "$C") $(peak "$np" params "$C")
            printf "%-3s %-6s %12s %10s %10s\n" "$np" "$C" "$2" "$1" "$3"
        done
    done
    # the largest width (a multiple of 8, which the 8 heads divide) within the cap, per
    # mode: doubling, then bisection; without and with --recompute (activations are a large part of these
    # small models' memory, the same in both modes, and recomputation takes most away)
    for EXTRA in "" --recompute; do
      for np in 2 4; do
        for m in none params; do
            lo=0 hi=64
            while [ $hi -le 8192 ] && fits "$(peak "$np" $m $hi)"; do lo=$hi; hi=$((hi * 2)); done
            while [ $((hi - lo)) -gt 8 ]; do
                mid=$(((lo + hi) / 16 * 8))
                if fits "$(peak "$np" $m $mid)"; then lo=$mid; else hi=$mid; fi
            done
            set -- $(peak "$np" $m $lo)
            eval "best_$m=$lo pk_$m=$1 pn_$m=$2"
            if [ "$BY" = accounted ]; then   # the enforced cap agrees: lo trains, lo + 8 stops
                gpt "$np" $m $lo --max-memory "${CAP}M" 2>&1 | grep -q "dtrain: done" && a=trains || a=FAILS
                gpt "$np" $m $((lo + 8)) --max-memory "${CAP}M" 2>&1 | grep -q "memory cap: " && b=stops || b="DOES NOT STOP"
                eval "cap_$m=\"$lo $a, $((lo + 8)) $b\""
            fi
        done
        echo "np $np${EXTRA:+ $EXTRA}: largest width within $CAP MiB (to 8): none $best_none ($pn_none parameters," \
             "peak $pk_none MiB), params $best_params ($pn_params parameters, peak $pk_params MiB):" \
             "$(ratio "$pn_params" "$pn_none")x the parameters"
        if [ "$BY" = accounted ]; then echo "  under --max-memory ${CAP}M: none $cap_none; params $cap_params"; fi
      done
    done
fi
