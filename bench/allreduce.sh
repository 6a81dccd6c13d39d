#!/bin/sh
# bench/allreduce.sh: 2-rank all_reduce bus bandwidth on this machine, in one run, for
#   dtrain tcp   dtbench over the tcp backend, started by dtrun -n 2
#   Open MPI     dtbench --backend mpi under mpirun -np 2: Open MPI's own MPI_Allreduce
#                (DT_MPI_CHECK=0 drops dtrain's per-call fingerprint check, so the column
#                measures MPI alone)
#   Gloo         PyTorch's gloo backend, via the shared peer script torch_allreduce.py
# from 4 KiB to 256 MiB in steps of 4, f32 sum, with the ratios tcp/mpi and tcp/gloo
# (> 1: dtrain is faster) and the 4 KiB latency of each. busbw follows nccl-tests:
# algbw = bytes / time, busbw = algbw * 2(n-1)/n; time is the slowest rank's mean.
#
# usage: bench/allreduce.sh [--max SIZE] [--iters N] [--builddir DIR]
#   --max SIZE     largest size (default 256M; e.g. --max 64K for a quick check)
#   --iters N      timed iterations per size for dtbench (default 20)
#   --builddir DIR where dtrun and dtbench were built (default $DT_BUILDDIR, else the
#                  source tree)
# Environment: MPIRUN (default: mpirun on PATH), DT_PEERS (default ../shared/peers next to
# the source tree), PYTHON (default: the first of python3, /usr/bin/python3 that imports torch).
set -u
srcdir=$(cd "$(dirname "$0")/.." && pwd)
builddir=${DT_BUILDDIR:-$srcdir}
max=256M
iters=20
while [ $# -gt 0 ]; do
    case $1 in
    --max) max=${2:?--max needs a size}; shift 2 ;;
    --iters) iters=${2:?--iters needs a number}; shift 2 ;;
    --builddir) builddir=${2:?--builddir needs a directory}; shift 2 ;;
    -h|--help) sed -n '2,20s/^# \{0,1\}//p' "$0"; exit 0 ;;
    *) echo "allreduce.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
num=${max%[kKmMgG]}
case $num in ''|*[!0-9]*) echo "allreduce.sh: --max: expected a size like 64K or 256M, got '$max'" >&2; exit 2 ;; esac
case $max in
*[kK]) maxb=$((num * 1024)) ;;
*[mM]) maxb=$((num * 1048576)) ;;
*[gG]) maxb=$((num * 1073741824)) ;;
*) maxb=$num ;;
esac
case $iters in ''|*[!0-9]*|0) echo "allreduce.sh: --iters: expected a positive integer, got '$iters'" >&2; exit 2 ;; esac
DTRUN=$builddir/dtrun
DTBENCH=$builddir/dtbench
for p in "$DTRUN" "$DTBENCH"; do
    [ -x "$p" ] || { echo "allreduce.sh: $p not found: build dtrain and give --builddir or DT_BUILDDIR" >&2; exit 2; }
done
MPIRUN=${MPIRUN:-$(command -v mpirun || true)}
# the first Python that has torch (a pyenv python3 on PATH may lack Debian's python3-torch)
py=
for cand in ${PYTHON:-} python3 /usr/bin/python3; do
    if "$cand" -c 'import torch.distributed' > /dev/null 2>&1; then py=$cand; break; fi
done
peers=${DT_PEERS:-$srcdir/../shared/peers}
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
unset DT_BACKEND DT_DETERMINISTIC
export DT_TIMEOUT=600

echo "# all_reduce, 2 ranks, f32 sum, 4 KiB .. $max (x4), dtbench -n $iters; $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, $(uname -m)"

# 1. dtrain tcp
"$DTRUN" -n 2 "$DTBENCH" -b 4K -e "$maxb" -f 4 -w 5 -n "$iters" > "$tmp/tcp.raw" 2> "$tmp/tcp.err"
rc=$?
sed -n 's/^\[rank0\]://p' "$tmp/tcp.raw" | awk '$1 ~ /^[0-9]+$/ && $NF == 0 { print $1, $5, $7 }' > "$tmp/tcp"
[ $rc -eq 0 ] || { echo "# dtrain tcp failed (exit $rc):"; sed 's/^/#   /' "$tmp/tcp.err" | tail -5; }

# 2. Open MPI
notes=
if [ -n "$MPIRUN" ] && [ -x "$MPIRUN" ]; then
    DT_MPI_CHECK=0 "$MPIRUN" --allow-run-as-root -np 2 "$DTBENCH" --backend mpi -b 4K -e "$maxb" -f 4 -w 5 \
        -n "$iters" > "$tmp/mpi.raw" 2> "$tmp/mpi.err"
    rc=$?
    awk '$1 ~ /^[0-9]+$/ && $NF == 0 { print $1, $5, $7 }' "$tmp/mpi.raw" > "$tmp/mpi"
    [ $rc -eq 0 ] || notes="$notes
# Open MPI column empty: dtbench --backend mpi failed (exit $rc): $(tail -1 "$tmp/mpi.err")"
else
    : > "$tmp/mpi"
    notes="$notes
# Open MPI column empty: no mpirun found (install openmpi-bin, configure dtrain with MPI)"
fi

# 3. PyTorch Gloo (the peer script has its own size list; sizes above --max are dropped)
if [ ! -f "$peers/torch_allreduce.py" ]; then
    : > "$tmp/gloo"
    notes="$notes
# Gloo column empty: $peers/torch_allreduce.py not found (set DT_PEERS)"
elif [ -z "$py" ]; then
    : > "$tmp/gloo"
    notes="$notes
# Gloo column empty: python3-torch is not installed"
else
    "$py" - "$peers/torch_allreduce.py" "$maxb" "$tmp/torch_allreduce.py" <<'PY'
import re, sys
src = open(sys.argv[1]).read()
src = re.sub(r"for size in (\[[^\]]*\]):", lambda m: "for size in [s for s in %s if s <= %d]:" % (m.group(1), int(sys.argv[2])), src, count=1)
open(sys.argv[3], "w").write(src)
PY
    OMP_NUM_THREADS=1 "$py" "$tmp/torch_allreduce.py" 2 > "$tmp/gloo.raw" 2> "$tmp/gloo.err"
    rc=$?
    awk '$1 ~ /^[0-9]+$/ { print $1, $2, $4 }' "$tmp/gloo.raw" > "$tmp/gloo"
    [ $rc -eq 0 ] || notes="$notes
# Gloo run failed (exit $rc): $(tail -1 "$tmp/gloo.err")"
fi

# The table: one row per size of the tcp run; "-" where a peer has no number.
awk -v T="$tmp" '
function load(name, arr, lat,   line, f) {
    while ((getline line < (T "/" name)) > 0) { split(line, f, " "); arr[f[1]] = f[3]; lat[f[1]] = f[2] }
}
function ratio(a, b) { return (a == "" || b == "" || b + 0 == 0) ? "-" : sprintf("%.2f", a / b) }
function show(v) { return v == "" ? "-" : v }
BEGIN {
    load("tcp", tcp, ltcp); load("mpi", mpi, lmpi); load("gloo", gloo, lgloo)
    printf "%12s %12s %12s %12s %9s %9s\n", "size(B)", "tcp busbw", "mpi busbw", "gloo busbw", "tcp/mpi", "tcp/gloo"
    for (s = 4096; s <= '"$maxb"'; s *= 4)
        printf "%12d %12s %12s %12s %9s %9s\n", s, show(tcp[s]), show(mpi[s]), show(gloo[s]), ratio(tcp[s], mpi[s]), ratio(tcp[s], gloo[s])
    printf "# busbw in GB/s; 4 KiB latency (us): tcp %s, mpi %s, gloo %s\n", show(ltcp[4096]), show(lmpi[4096]), show(lgloo[4096])
}'
[ -n "$notes" ] && echo "${notes#?}"
exit 0
