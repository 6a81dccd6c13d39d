#!/usr/bin/env bash
# bench/pipeline.sh: what a pipeline (--pipeline, docs/pipeline.md) costs on this machine, in one run.
#
#   bench/pipeline.sh [speed|bubble|memory|all]      (run from the build directory or set DT_BUILDDIR)
#
#   speed   a deep gpt (16 layers, 256 wide, block 64, batch 32, 16 micro-batches,
#           20 steps on fortunes, AdamW) on 2 processes x 1 thread: --pipeline 2 with each
#           schedule (interleaved with --virtual-stages 2) against 2 data-parallel ranks (--shard none) of the same model, in the
#           same round; tokens/s and the ratio, medians of DT_BENCH_ROUNDS rounds (default 3;
#           bench/lib.sh).
#   bubble  each stage's idle fraction (its step less its compute and data wait, from
#           --rank-stats: the bubble, the boundary transfers and the gradient sums) for
#           P = 2 and M = 4, 8, 16 per schedule, beside the theory (P-1)/(M+P-1), or
#           (P-1)/(VM+P-1) for interleaved with V = 2 chunks a stage, on the
#           same deep gpt (a stage's own transfers count as idle: the measured figure is
#           the theory plus them and plus the stages' imbalance). P = 4 needs 4 cores
#           (this machine's 2 would be shared): DT_PIPE_P4=1 adds it.
#   memory  the largest gpt (8 layers, 8 heads, width a multiple of 8, block 64, batch 8,
#           AdamW) that trains 2 steps under --max-memory DT_PIPE_CAP_MIB (default 256)
#           MiB per rank on 2 processes: 2 data-parallel ranks, --pipeline 2 (1f1b, and
#           interleaved with 2 chunks a stage), and
#           --shard params, and the first two with --recompute, found by bisection; with
#           its parameter count and tokens/s. Each layout runs the batch as 2, 4 and 8
#           micro-batches and is compared at its best.
set -u
here=$(cd "$(dirname "$0")" && pwd)
B=${DT_BUILDDIR:-$(pwd)}
MODE=${1:-all}
CAP=${DT_PIPE_CAP_MIB:-256}
. "$here/lib.sh"
fortunes_data bench/pipeline.sh
tmpd=$(mktemp -d) || exit 1
trap 'rm -rf "$tmpd"' EXIT
MODEL="gpt(layers=16,heads=8,dim=256,block=64)"
run_np() {
    local np=$1; shift
    OMP_NUM_THREADS=1 "$B/dtrun" -n "$np" "$B/dtrain" train --threads 1 --model "$MODEL" --data "tokens:$DATA" \
        --optim adamw --warmup 2 --no-eval --log-every 1000000 "$@" 2>&1 | sed 's/^\[rank0\]://'
}
# a schedule's flags: interleaved runs 2 chunks a stage
sched() { if [ "$1" = interleaved ]; then echo "--pipeline-schedule interleaved --virtual-stages 2"; else echo "--pipeline-schedule $1"; fi; }
tps() { sed -n 's/.*dtrain: done.* \([0-9][0-9]*\) tokens\/s.*/\1/p' | tail -1; }
grep -m1 "model name" /proc/cpuinfo | sed 's/.*: /cpu: /'
echo "cores: $(nproc); $(blas_kernels)"

if [ "$MODE" = speed ] || [ "$MODE" = all ]; then
    declare -A rate vs
    for r in $(seq "$ROUNDS"); do
        base=$(run_np 2 --batch 32 --micro-batches 16 --steps 20 | tps)
        rate[dp]+=" ${base:-fail}"
        for s in 1f1b gpipe interleaved; do
            t=$(run_np 2 --batch 32 --micro-batches 16 --steps 20 --pipeline 2 $(sched $s) | tps)
            rate[$s]+=" ${t:-fail}" vs[$s]+=" $(ratio "${t:-0}" "${base:-0}")"
        done
    done
    echo "$MODEL, batch 32, 16 micro-batches, 2 processes x 1 thread: tokens/s (medians of $ROUNDS rounds)"
    printf "%-28s %10s %10s   %s\n" layout tokens/s "vs DP" "vs DP per round"
    printf "%-28s %10s\n" "2 data-parallel ranks" "$(median ${rate[dp]})"
    for s in 1f1b gpipe interleaved; do
        printf "%-28s %10s %10s   %s\n" "--pipeline 2, $s" "$(median ${rate[$s]})" "$(median ${vs[$s]})" "${vs[$s]}"
    done
    echo
fi

if [ "$MODE" = bubble ] || [ "$MODE" = all ]; then
    PS="2"
    [ "${DT_PIPE_P4:-0}" = 1 ] && PS="2 4"
    echo "idle fraction per stage, % of the step (medians of $ROUNDS rounds; 24 steps, the last 20 measured)"
    printf "%-3s %-6s %-4s %8s   %s\n" P sched M theory "measured, stage 0 .. P-1"
    for P in $PS; do
        for s in gpipe 1f1b interleaved; do
            V=1; [ $s = interleaved ] && V=2
            for M in 4 8 16; do
                declare -A idle=()
                for r in $(seq "$ROUNDS"); do
                    run_np "$P" --batch $((2 * M)) --micro-batches "$M" --steps 24 --pipeline "$P" \
                        $(sched $s) --rank-stats 4 --metrics "$tmpd/m.jsonl" > /dev/null
                    # the rank events after the first 4 steps: idle = step - data - compute, summed
                    for q in $(seq 0 $((P - 1))); do
                        v=$(sed -n "s/.*\"event\":\"rank\",\"step\":\([0-9]*\),\"rank\":$q,\"steps\":[0-9]*,\"step_s\":\([0-9.]*\),\"data_s\":\([0-9.]*\),\"compute_s\":\([0-9.]*\),.*/\1 \2 \3 \4/p" \
                            "$tmpd/m.jsonl" | awk '$1 > 4 { st += $2; idle += $2 - $3 - $4 } END { if (st > 0) printf "%.1f", 100 * idle / st }')
                        idle[$q]+=" ${v:-fail}"
                    done
                done
                line=""
                for q in $(seq 0 $((P - 1))); do line+=" $(median ${idle[$q]})"; done
                printf "%-3s %-6s %-4s %7.1f%%  %s\n" "$P" $s "$M" "$(awk -v p=$P -v m=$M -v v=$V 'BEGIN { print 100 * (p - 1) / (v * m + p - 1) }')" "$line"
            done
        done
    done
fi

if [ "$MODE" = memory ] || [ "$MODE" = all ]; then
    # fits C FLAGS...: 0 when width C trains 2 steps within the cap (its output in $tmpd/fit)
    fits() {
        local c=$1; shift
        MODEL="gpt(layers=8,heads=8,dim=$c,block=64)" run_np 2 --batch 8 --steps 2 --warmup 1 \
            --max-memory "${CAP}M" "$@" > "$tmpd/fit"
        grep -q "dtrain: done" "$tmpd/fit"
    }
    # The global batch is 8 in every row; each layout runs it as M = 2, 4 or 8 micro-batches
    # (a data-parallel rank then sums M/2 of them in DDP's accumulation tree; a stage holds
    # fewer samples' activations per micro-batch) and is compared at its best M, as a user
    # would choose it.
    echo "the largest gpt(layers=8,heads=8,dim=C,block=64) under --max-memory ${CAP}M per rank, 2 processes, batch 8, AdamW"
    printf "%-26s %3s %6s %12s %10s %7s\n" layout M width params tokens/s "vs DP"
    dp_best=0
    for cfg in "2 data-parallel ranks|" "--pipeline 2|--pipeline 2" \
               "--pipeline 2, interleaved|--pipeline 2 --pipeline-schedule interleaved --virtual-stages 2" \
               "--shard params|--shard params" \
               "DP, --recompute|--recompute" "--pipeline 2 --recompute|--pipeline 2 --recompute"; do
        name=${cfg%%|*} flags=${cfg#*|}
        best=0 bestm=
        for M in 2 4 8; do
            lo=0 hi=2048   # widths lo fits (0: none known), hi does not
            while [ $((hi - lo)) -gt 8 ]; do
                mid=$(( (lo + hi) / 16 * 8 )); [ "$mid" -le "$lo" ] && mid=$((lo + 8))
                if fits "$mid" $flags --micro-batches $M; then lo=$mid; else hi=$mid; fi
            done
            n=n/a t=n/a
            if [ "$lo" -gt 0 ] && fits "$lo" $flags --micro-batches $M; then
                n=$(sed -n 's/.* \([0-9,]*\) parameters.*/\1/p' "$tmpd/fit" | head -1)
                t=$(tps < "$tmpd/fit")
            fi
            v=${n//,/}
            [ "$name" = "2 data-parallel ranks" ] && [ "${v:-0}" -gt "$dp_best" ] 2>/dev/null && dp_best=$v
            [ "${v:-0}" -gt "$best" ] 2>/dev/null && best=$v bestm=$M
            printf "%-26s %3s %6s %12s %10s %7s\n" "$name" "$M" "$lo" "${n:-n/a}" "${t:-n/a}" "$(ratio "${v:-0}" "$dp_best")"
        done
        printf "%-26s best at M = %s: %s parameters, %s x the data-parallel best\n" "$name" "${bestm:-n/a}" "$best" \
            "$(ratio "$best" "$dp_best")"
    done
fi
