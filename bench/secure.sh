#!/bin/sh
# bench/secure.sh: the cost of --secure-transport between two nodes, in one run. Two
# network namespaces joined by a veth pair (10.232.0.1/24, 10.232.0.2/24, addresses that
# exist only inside them), each with its own host name, one dtrun per node with one rank
# each, so every byte of the all_reduce crosses a TCP connection between "hosts". Each
# size is timed with sealing off, auth and encrypt in turn, --repeat R times (the modes
# alternating, so a change in the machine's load touches all three alike), and each
# figure is the median of its R runs; the ratio is off's time over the mode's (< 1:
# slower than off). Needs root and iproute2's `ip netns`.
#
# usage: bench/secure.sh [--sizes "64K 1M 16M"] [--iters N] [--repeat R] [--builddir DIR]
set -u
srcdir=$(cd "$(dirname "$0")/.." && pwd)
builddir=${DT_BUILDDIR:-$srcdir}
sizes="64K 1M 16M"
iters=20
repeat=3
while [ $# -gt 0 ]; do
    case $1 in
    --sizes) sizes=${2:?--sizes needs a list}; shift 2 ;;
    --iters) iters=${2:?--iters needs a number}; shift 2 ;;
    --repeat) repeat=${2:?--repeat needs a number}; shift 2 ;;
    --builddir) builddir=${2:?--builddir needs a directory}; shift 2 ;;
    -h|--help) sed -n '2,12s/^# \{0,1\}//p' "$0"; exit 0 ;;
    *) echo "secure.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
. "$srcdir/bench/lib.sh"
[ "$(id -u)" -eq 0 ] || { echo "secure.sh: needs root to create network namespaces" >&2; exit 2; }
command -v ip > /dev/null || { echo "secure.sh: needs ip (iproute2)" >&2; exit 2; }
DTRUN=$builddir/dtrun; DTBENCH=$builddir/dtbench
nsa="dtsa$$"; nsb="dtsb$$"; va="dtsva$$"; vb="dtsvb$$"
ipa=10.232.0.1; ipb=10.232.0.2
tmp=$(mktemp -d) || exit 1
cleanup() {
    for ns in "$nsa" "$nsb"; do
        pids=$(ip netns pids "$ns" 2>/dev/null)
        [ -z "$pids" ] || kill -KILL $pids 2>/dev/null
        ip netns del "$ns" 2>/dev/null
    done
    rm -rf "$tmp"
}
trap cleanup EXIT
ip netns add "$nsa" && ip netns add "$nsb" && ip -n "$nsa" link set lo up && ip -n "$nsb" link set lo up &&
    ip link add "$va" type veth peer name "$vb" && ip link set "$va" netns "$nsa" && ip link set "$vb" netns "$nsb" &&
    ip -n "$nsa" addr add "$ipa/24" dev "$va" && ip -n "$nsb" addr add "$ipb/24" dev "$vb" &&
    ip -n "$nsa" link set "$va" up && ip -n "$nsb" link set "$vb" up || { echo "secure.sh: cannot make the namespaces" >&2; exit 1; }

# one MODE SIZE: dtbench's row for SIZE, sealed in MODE, across the two nodes
one() {
    for r in 0 1; do
        if [ $r = 0 ]; then ns=$nsa; v=$va; else ns=$nsb; v=$vb; fi
        DT_JOB_SECRET=bench-$$ DT_SOCKET_IFNAME=$v DT_TIMEOUT=60 ip netns exec "$ns" unshare --uts sh -c \
            'hostname "$1"; shift; exec "$@"' sh "bench$r" "$DTRUN" -n 1 --nnodes 2 --node-rank $r \
            --master-addr "$ipa" --master-port 29600 --secure-transport "$1" \
            "$DTBENCH" -b "$2" -e "$2" -n "$iters" -w 3 > "$tmp/out$r" 2> "$tmp/err$r" &
        eval "p$r=\$!"
    done
    wait "$p0"; wait "$p1"
    sed -n 's/^\[rank0\]: *\([0-9][0-9]*\) .* sum *\([0-9.]*\) *[0-9.]* *\([0-9.]*\) *0$/\2 \3/p' "$tmp/out0" | head -1
}

cpu=$(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //')
aes=$(grep -qw aes /proc/cpuinfo && echo "AES-NI" || echo "no AES-NI")
echo "# secure transport between two network-namespace nodes (1 rank each, veth), all_reduce f32"
echo "# $cpu ($aes), $(nproc) cores; load $(cut -d' ' -f1 /proc/loadavg); median of $repeat runs of $iters iterations"
printf "%10s  %12s %12s %12s  %9s %9s  %s\n" "size" "off (us)" "auth (us)" "encrypt (us)" "auth/off" "enc/off" "busbw off/auth/enc (GB/s)"
for s in $sizes; do
    for m in off auth encrypt; do : > "$tmp/t.$m"; : > "$tmp/b.$m"; done
    i=0
    while [ $i -lt "$repeat" ]; do
        for m in off auth encrypt; do
            set -- $(one $m "$s")
            [ $# -eq 2 ] || { echo "secure.sh: no result for $m at $s:" >&2; tail -3 "$tmp/err0" >&2; exit 1; }
            echo "$1" >> "$tmp/t.$m"; echo "$2" >> "$tmp/b.$m"
        done
        i=$((i + 1))
    done
    to=$(median $(cat "$tmp/t.off")); ta=$(median $(cat "$tmp/t.auth")); te=$(median $(cat "$tmp/t.encrypt"))
    printf "%10s  %12s %12s %12s  %9s %9s  %s/%s/%s\n" "$s" "$to" "$ta" "$te" "$(ratio "$to" "$ta")" "$(ratio "$to" "$te")" \
        "$(median $(cat "$tmp/b.off"))" "$(median $(cat "$tmp/b.auth"))" "$(median $(cat "$tmp/b.encrypt"))"
done
echo "# load after: $(cut -d' ' -f1 /proc/loadavg); cipher: $(grep -o 'sealed: [^)]*)' "$tmp/out0" | head -1)"
