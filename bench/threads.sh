#!/usr/bin/env bash
# bench/threads.sh: one process's threads beside other work on the machine.
#
#   bench/threads.sh        (run from the build directory or set DT_BUILDDIR; rounds: DT_BENCH_ROUNDS)
#
# For mlp, cnn, resnet (Fashion-MNIST) and the default gpt (fortunes), samples/s (the
# gpt: tokens/s) of one
# process on 1 thread and on 2 threads, under three loads beside it:
#   idle   nothing else runs;
#   light  one process busy 3 ms of every 10 (a browser, an editor);
#   busy   one process that never sleeps (a compile), at normal priority.
# 2 threads run twice: with --fixed-threads (the count held) and as dtrain runs by
# default (the thread tuner, src/tuner.h, may take threads away while cores are short).
# The ratio column is 2 threads / 1 thread in the same round; the tables give medians
# over the rounds. Meant for a 2-core machine: the load takes one of the two cores.
# DT_THREADS_MODELS and DT_THREADS_LOADS choose some rows (e.g. "gpt", "busy").
set -u
here=$(cd "$(dirname "$0")" && pwd)
B=${DT_BUILDDIR:-$(pwd)}
. "$here/lib.sh"
fortunes_data bench/threads.sh
[ -d /usr/share/games/fortunes ] || exit 2

LOADPID=""
trap '[ -n "$LOADPID" ] && kill $LOADPID 2>/dev/null' EXIT
trap 'exit 1' INT TERM   # the load goes with the script
load_start() {   # $1 idle|light|busy
    LOADPID=""
    case $1 in
        light) perl -e 'use Time::HiRes qw(time sleep); while (1) { my $t = time; 1 while time - $t < 0.003; sleep 0.007 }' &
               LOADPID=$! ;;
        busy)  ( while :; do :; done ) & LOADPID=$! ;;
    esac
    return 0
}
load_stop() { [ -n "$LOADPID" ] && { kill $LOADPID 2>/dev/null; wait $LOADPID 2>/dev/null; }; LOADPID=""; }

sps() {  # $1 model, $2 threads, $3 extra flag: samples/s of the run's summary
    local args
    case $1 in
        gpt)    args="--model gpt --data tokens:$DATA --steps 150" ;;
        resnet) args="--model resnet --steps 80" ;;
        cnn)    args="--model cnn --steps 150" ;;
        *)      args="--model $1 --steps 200" ;;
    esac
    "$B/dtrain" train $args --threads "$2" $3 --no-eval --quiet 2>&1 |
        sed -n 's/.*, \([0-9][0-9]*\) \(samples\|tokens\)\/s.*/\1/p' | tail -1
}

blas_kernels
echo "cpu: $(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -1), $(nproc) cores; rounds: $ROUNDS"
printf "%-7s %-6s %10s %12s %12s %12s %12s\n" model load "1 thr" "2 thr fixed" ratio "2 thr tuned" ratio
for m in ${DT_THREADS_MODELS:-mlp cnn resnet gpt}; do
    for load in ${DT_THREADS_LOADS:-idle light busy}; do
        a=(); f=(); t=(); rf=(); rt=()
        for r in $(seq "$ROUNDS"); do
            load_start $load
            x=$(sps $m 1 --fixed-threads); y=$(sps $m 2 --fixed-threads); z=$(sps $m 2 "")
            load_stop
            a+=("${x:-fail}"); f+=("${y:-fail}"); t+=("${z:-fail}")
            rf+=("$(ratio "${y:-0}" "${x:-0}")"); rt+=("$(ratio "${z:-0}" "${x:-0}")")
        done
        printf "%-7s %-6s %10s %12s %12s %12s %12s\n" $m $load "$(median "${a[@]}")" "$(median "${f[@]}")" \
            "$(median "${rf[@]}")" "$(median "${t[@]}")" "$(median "${rt[@]}")"
    done
done
