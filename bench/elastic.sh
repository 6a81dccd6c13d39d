#!/usr/bin/env bash
# bench/elastic.sh: what losing a node costs an elastic job (dtrun --nnodes MIN:MAX) here,
# with the state from disk and from the nodes' memory, and what the snapshots cost.
#
#   bench/elastic.sh            (run from the build directory or set DT_BUILDDIR)
#
# Two dtruns on this host (127.0.0.1) are the nodes of one job of --nnodes 1:2, one rank
# each, --micro-batches 2. Once the job has run 2 x DT_ELASTIC_EVERY steps (default 10) on
# 2 ranks, node 1's dtrun (and with it its rank) is SIGKILLed; node 0 notices (its
# connection closes), kills its own rank and starts again on 1 rank. The state comes back
#   disk     from a checkpoint every DT_ELASTIC_EVERY steps to a local directory
#            (--snapshot-every 0), or
#   memory   from the in-memory snapshot every DT_ELASTIC_EVERY steps (--snapshot-every;
#            a disk checkpoint only at the end).
#   node0    the same from memory, but three dtruns (node 2 a spare) and node 0's dtrun is
#            the one SIGKILLed: node 1 takes over the rendezvous, node 2 reaches it there,
#            and the two go on with 2 ranks.
# For the default gpt (fortunes tokens) and the cnn (Fashion-MNIST, or synthetic data of
# its shape where the dataset is missing), DT_BENCH_ROUNDS rounds (default 3), medians:
#   recovery   seconds from the kill to the end of the first step on the new world
#              (the metrics' membership event: its wall-clock time less the kill's)
#   lost       steps done on 2 ranks after the newest saved state, done again on 1 rank
#   step       the median step time on 2 ranks before the kill, for scale
# A lost node found by missing heartbeats adds --heartbeat-timeout to the recovery.
# Then the snapshots' cost: the default gpt on the two nodes for DT_ELASTIC_STEPS steps
# (default 600) with --snapshot-every 10 and 0, alternating, DT_BENCH_ROUNDS rounds each:
# the median tokens/s of each and their ratio. DT_ELASTIC_RECOVERY=0 runs that part alone.
set -u
here=$(cd "$(dirname "$0")" && pwd)
B=${DT_BUILDDIR:-$(pwd)}
EVERY=${DT_ELASTIC_EVERY:-10}
. "$here/lib.sh"
fortunes_data bench/elastic.sh
[ -x "$B/dtrun" ] || { echo "bench/elastic.sh: no dtrun in $B"; exit 2; }
tmpd=$(mktemp -d) || exit 1
tok="dtbenchelastic$$"
trap 'pkill -KILL -f "$tok" 2>/dev/null; rm -rf "$tmpd"' EXIT
export DT_JOB_SECRET="bench-elastic-$$-secret"
grep -m1 "model name" /proc/cpuinfo | sed 's/.*: /cpu: /'
echo "cores: $(nproc); $(blas_kernels); state saved every $EVERY steps; $ROUNDS rounds"

FMNIST=/usr/share/datasets/fashion-mnist
cnn_data=$FMNIST
[ -d "$FMNIST" ] || cnn_data=synthetic:60000,1,28,28,10
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
now() { date +%s.%N; }
# wait (at most $3 s) until file $1 has a line matching $2
wait_for_line() {
    local i=0
    while ! grep -Eq -- "$2" "$1" 2>/dev/null && [ $i -lt $(($3 * 10)) ]; do sleep 0.1; i=$((i + 1)); done
    grep -Eq -- "$2" "$1"
}

# one_round FROM NAME ARGS...: one kill, the state from FROM (disk, memory or node0);
# prints "recovery lost step"
one_round() {
    local from=$1 name=$2; shift 2
    local save=(--checkpoint-every "$EVERY" --snapshot-every 0)
    [ "$from" != disk ] && save=(--checkpoint-every 1000000 --snapshot-every "$EVERY")
    local d="$tmpd/$tok-$name" port m nodes=2
    [ "$from" = node0 ] && nodes=3
    rm -rf "$d"; mkdir -p "$d"
    m="$d/m.jsonl"
    port=$(free_port)
    local common=(-n 1 --nnodes "1:$nodes" --master-port "$port" --rdzv-last-call 1 --heartbeat-timeout 10 --grace 5)
    local prog=("$B/dtrain" train "$@" --threads 1 --micro-batches 2 --log-every 1 --checkpoint-dir "$d/ck"
                "${save[@]}" --resume auto --steps 100000 --no-eval --quiet --metrics "$m")
    OMP_NUM_THREADS=1 "$B/dtrun" "${common[@]}" "${prog[@]}" > "$d/out0" 2> "$d/err0" &
    local p0=$! p2=
    OMP_NUM_THREADS=1 "$B/dtrun" "${common[@]}" --node-rank 1 "${prog[@]}" > "$d/out1" 2> "$d/err1" &
    local p1=$!
    if [ "$nodes" = 3 ]; then   # node 2 once nodes 0 and 1 run: the spare
        wait_for_line "$d/err1" "attempt 0: ranks 1\.\.1 of 2" 600
        OMP_NUM_THREADS=1 "$B/dtrun" "${common[@]}" --node-rank 2 "${prog[@]}" > "$d/out2" 2> "$d/err2" &
        p2=$!
        wait_for_line "$d/err2" "a spare" 600
    fi
    if ! wait_for_line "$m" "\"step\":$((2 * EVERY)),.*\"world_size\":2" 600; then
        echo "fail fail fail"; kill -KILL $p0 $p1 $p2 2>/dev/null; wait 2>/dev/null; return
    fi
    local t_kill victim=$p1 rest=$p0
    [ "$nodes" = 3 ] && victim=$p0 rest="$p1 $p2"
    t_kill=$(now)
    kill -KILL $victim
    wait_for_line "$m" '"event":"membership"' 600 || { echo "fail fail fail"; kill -KILL $p0 $p1 $p2; wait 2>/dev/null; return; }
    kill -TERM $rest; wait $p0 $p1 $p2 2>/dev/null
    awk -v tk="$t_kill" '
        /"event":"step"/ && /"world_size":2/ && !seen { n++; s[n] = $0; if (match($0, /"step":[0-9]+/)) last = substr($0, RSTART + 7, RLENGTH - 7) + 0
                                                        if (match($0, /"elapsed_s":[0-9.]+/)) el[n] = substr($0, RSTART + 12, RLENGTH - 12) + 0 }
        /"event":"membership"/ && !seen { seen = 1
            match($0, /"at":[0-9.]+/); at = substr($0, RSTART + 5, RLENGTH - 5) + 0
            match($0, /"resumed_after":[0-9]+/); ra = substr($0, RSTART + 16, RLENGTH - 16) + 0 }
        END { k = 0; for (i = 2; i <= n; i++) { d[++k] = el[i] - el[i - 1] }
              for (i = 2; i <= k; i++) for (j = i; j > 1 && d[j - 1] > d[j]; j--) { t = d[j]; d[j] = d[j - 1]; d[j - 1] = t }
              printf "%.2f %d %.3f\n", at - tk, last - ra, k ? d[int((k + 1) / 2)] : 0 }' "$m"
}

[ "${DT_ELASTIC_RECOVERY:-1}" = 0 ] ||
printf '%-6s %-7s %-12s %-8s %-10s %s\n' model from recovery_s lost step_s "rounds (recovery/lost)"
for model in gpt cnn; do
    [ "${DT_ELASTIC_RECOVERY:-1}" = 0 ] && break
    for from in disk memory node0; do
        recs=(); losts=(); steps=(); all=""
        for r in $(seq "$ROUNDS"); do
            if [ "$model" = gpt ]; then
                set -- $(one_round "$from" gpt --model gpt --data "tokens:$DATA")
            else
                set -- $(one_round "$from" cnn --model cnn --data "$cnn_data")
            fi
            recs+=("$1"); losts+=("$2"); steps+=("$3"); all="$all $1/$2"
        done
        printf '%-6s %-7s %-12s %-8s %-10s%s\n' "$model" "$from" "$(median "${recs[@]}")" "$(median "${losts[@]}")" \
            "$(median "${steps[@]}")" "$all"
    done
done

# the snapshots' cost: tokens/s of the default gpt on the two nodes, with and without
STEPS=${DT_ELASTIC_STEPS:-600}
# throughput K: prints the tokens/s of one job with --snapshot-every K
throughput() {
    local d="$tmpd/$tok-tp" port
    rm -rf "$d"; mkdir -p "$d"
    port=$(free_port)
    local common=(-n 1 --nnodes 1:2 --master-port "$port" --rdzv-last-call 60 --heartbeat-timeout 10 --grace 5)
    local prog=("$B/dtrain" train --model gpt --data "tokens:$DATA" --threads 1 --micro-batches 2 --steps "$STEPS"
                --warmup 10 --snapshot-every "$1" --no-eval --quiet)
    OMP_NUM_THREADS=1 "$B/dtrun" "${common[@]}" "${prog[@]}" > "$d/out0" 2> "$d/err0" &
    local p0=$!
    OMP_NUM_THREADS=1 "$B/dtrun" "${common[@]}" --node-rank 1 "${prog[@]}" > "$d/out1" 2> "$d/err1"
    wait $p0
    sed -n 's/.*dtrain: done: .* steps in .* s, \([0-9.]*\) tokens\/s.*/\1/p' "$d/out0" | tail -1
}
on=(); off=()
for r in $(seq "$ROUNDS"); do
    off+=("$(throughput 0)")
    on+=("$(throughput 10)")
done
mon=$(median "${on[@]}"); moff=$(median "${off[@]}")
echo "snapshots: default gpt, 2 nodes x 1 rank, $STEPS steps: tokens/s with --snapshot-every 10 $mon," \
     "without $moff: $(awk -v a="$mon" -v b="$moff" 'BEGIN { printf "%.3f", (b > 0) ? a / b : 0 }') of it" \
     "(rounds: ${on[*]} / ${off[*]})"
