#!/bin/sh
# bench/cold.sh: the first collective of a job. Each run is a fresh dtrun -n N of dtbench
# that times one all_reduce with no warm-up (-w 0 -W 0 -n 1), so it is the job's first
# collective; with the shared-memory rings made at the start (DT_SHM_WARM=1) and made
# when a pair first talks (the default), the two alternating,
# R times each (default 5), medians of busbw in GB/s. For comparison, the same size warm
# (dtbench's defaults: 5 warm-up iterations, then 20 timed), once per repeat.
#
# usage: bench/cold.sh [--repeat R] [--ranks "2 4"] [--sizes "4M 8M 16M"]
#        (run from the build directory or set DT_BUILDDIR)
B=${DT_BUILDDIR:-$(pwd)}
here=$(cd "$(dirname "$0")" && pwd)
R=5; RANKS="2 4"; SIZES="4M 8M 16M"
while [ $# -gt 0 ]; do
    case $1 in
        --repeat) R=$2; shift 2 ;;
        --ranks) RANKS=$2; shift 2 ;;
        --sizes) SIZES=$2; shift 2 ;;
        *) echo "bench/cold.sh: unknown option '$1' (--repeat R, --ranks LIST, --sizes LIST)" >&2; exit 2 ;;
    esac
done
case $R in ''|*[!0-9]*|0) echo "bench/cold.sh: --repeat expects a positive integer, got '$R'" >&2; exit 2 ;; esac
[ -x "$B/dtrun" ] && [ -x "$B/dtbench" ] || { echo "bench/cold.sh: no dtrun and dtbench in $B (set DT_BUILDDIR)" >&2; exit 2; }
. "$here/lib.sh"
grep -m1 "model name" /proc/cpuinfo | sed 's/.*: /cpu: /'
echo "cores: $(nproc); load before: $(cut -d' ' -f1 /proc/loadavg)"
# busbw of the one row dtbench prints (rank 0's, prefix removed); fail when none
one() {   # one N SIZE [dtbench args...]
    n=$1; sz=$2; shift 2
    "$B/dtrun" -n "$n" "$B/dtbench" -b "$sz" -e "$sz" "$@" 2>/dev/null |
        sed -n 's/^\[rank0\]://p' | awk '$1 ~ /^[0-9]+$/ { print $7; found = 1 } END { if (!found) print "fail" }' | tail -1
}
printf '%-6s %-6s %-12s %-14s %-10s %s\n' ranks size "first: rings" "first: lazy" warm "first rings / lazy"
for n in $RANKS; do
    for sz in $SIZES; do
        eager=""; lazy=""; warm=""
        for i in $(seq "$R"); do
            eager="$eager $(DT_SHM_WARM=1 one "$n" "$sz" -w 0 -W 0 -n 1)"
            lazy="$lazy $(one "$n" "$sz" -w 0 -W 0 -n 1)"
            warm="$warm $(one "$n" "$sz")"
        done
        me=$(median $eager); ml=$(median $lazy); mw=$(median $warm)
        printf '%-6s %-6s %-12s %-14s %-10s %s\n' "$n" "$sz" "$me" "$ml" "$mw" "$(ratio "$me" "$ml")"
    done
done
echo "load after: $(cut -d' ' -f1 /proc/loadavg)"
