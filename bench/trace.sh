#!/bin/sh
# bench/trace.sh: what --trace costs, in one run: the default gpt on 2 processes x 1
# thread over Debian's fortunes, with and without --trace FILE (every step recorded, the
# file written at the end), the two alternating --repeat R times (default 3) so that a
# change in the machine's load touches both alike; tokens/s is each run's final figure,
# the medians and their ratio are printed (traced / plain: 1 is free). The issue's bar:
# at least 0.98.
#
# usage: bench/trace.sh [--steps N] [--repeat R]    (N default 200, 10 of them warm-up of the
#        learning rate; DT_BUILDDIR: the build, default the source tree)
set -u
here=$(cd "$(dirname "$0")" && pwd)
B=${DT_BUILDDIR:-$here/..}
steps=200
repeat=3
while [ $# -gt 0 ]; do
    case $1 in
    --steps) steps=${2:?--steps needs a number}; shift 2 ;;
    --repeat) repeat=${2:?--repeat needs a number}; shift 2 ;;
    -h|--help) sed -n '2,10s/^# \{0,1\}//p' "$0"; exit 0 ;;
    *) echo "trace.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
. "$here/lib.sh"
fortunes_data trace.sh
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
echo "# --trace's cost: the default gpt, 2 processes x 1 thread, $steps steps, $repeat rounds"
echo "# $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //'), $(nproc) cores; load $(cut -d' ' -f1 /proc/loadavg)"
plain=""; traced=""
i=0
while [ $i -lt "$repeat" ]; do
    a=$(dtrain_run 2 1 --model gpt --steps "$steps" --warmup 10 --eval-every 0 | tok)
    b=$(dtrain_run 2 1 --model gpt --steps "$steps" --warmup 10 --eval-every 0 --trace "$tmp/t.json" | tok)
    [ -s "$tmp/t.json" ] || { echo "trace.sh: the traced run wrote no trace" >&2; exit 1; }
    echo "round $((i + 1)): plain ${a:-fail} tokens/s, traced ${b:-fail} tokens/s ($(grep -c '"ph":"X"' "$tmp/t.json") spans)"
    plain="$plain $a"; traced="$traced $b"
    i=$((i + 1))
done
mp=$(median $plain); mt=$(median $traced)
echo "median: plain $mp tokens/s, traced $mt tokens/s, traced/plain $(awk -v a="$mt" -v b="$mp" 'BEGIN { if (a > 0 && b > 0) printf "%.3f", a / b; else printf "n/a" }')"
echo "# load after: $(cut -d' ' -f1 /proc/loadavg)"
