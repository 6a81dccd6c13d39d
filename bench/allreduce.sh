#!/bin/sh
# bench/allreduce.sh: collective bus bandwidth on this machine, in one run: all_reduce,
# reduce_scatter and all_gather on 2 and 4 ranks of one host, f32 (sum), for
#   dtrain tcp   dtbench over the tcp backend, started by dtrun -n N (same-host ranks
#                exchange through shared-memory rings), its ranks placed as mpirun
#                places its own (--bind auto)
#   Open MPI     dtbench --backend mpi under mpirun -np N --oversubscribe: Open MPI's own
#                MPI_Allreduce, MPI_Reduce_scatter_block and MPI_Allgather (DT_MPI_CHECK=0
#                drops dtrain's per-call fingerprint check, so the column measures MPI alone)
#   Gloo         all_reduce only: PyTorch's gloo backend, via the shared peer script
#                torch_allreduce.py (its own size list, one run)
# from 4 KiB to 256 MiB in steps of 2, with the ratios tcp/mpi and tcp/gloo (> 1: dtrain
# is faster). busbw follows nccl-tests: algbw = bytes / time with bytes the whole array
# (all_gather's output, reduce_scatter's input), busbw = algbw * 2(n-1)/n for all_reduce
# and * (n-1)/n for reduce_scatter and all_gather; time is the slowest rank's mean.
# By default each column is one dtbench sweep over all sizes. --paired makes each size
# its own short run, tcp then Open MPI, so the two numbers of a row are taken seconds
# apart (this machine's memory speed changes by up to 3x from minute to minute, which
# sweeping one column, then the other, can turn into false ratios); single-size runs
# are noisier at small sizes, on oversubscribed cores most.
# With --repeat R, the tcp and Open MPI runs alternate R times and every number is the
# median of its R runs (this machine's other work makes single runs noisy). The 1-minute
# load average before and after each table says how busy the machine was.
# Placement: mpirun binds each rank to a core of its own when the ranks fit in the cores
# and binds none when they do not (oversubscribed); dtrun binds nothing. --bind auto
# (default) gives the tcp ranks mpirun's placement (taskset, core = local rank), so the
# columns compare the transports; --bind none leaves them to the scheduler, which under
# other load often puts two ranks on one core, where every small message costs a context
# switch.
#
# usage: bench/allreduce.sh [--max SIZE] [--min SIZE] [--factor F] [--iters N]
#                           [--ranks "2 4"] [--ops "all_reduce reduce_scatter all_gather"]
#                           [--repeat R] [--bind auto|none] [--paired] [--no-gloo] [--builddir DIR]
#   --max SIZE     largest size (default 256M; e.g. --max 64K for a quick check)
#   --min SIZE     smallest size (default 4K)
#   --factor F     size step (default 2)
#   --iters N      timed iterations per size for dtbench (default 20)
#   --ranks LIST   world sizes (default "2 4"; more ranks than cores are oversubscribed)
#   --ops LIST     collectives (default "all_reduce reduce_scatter all_gather")
#   --repeat R     runs of each column, medians reported (default 1)
#   --bind MODE    auto: tcp ranks bound as mpirun binds (default); none: unbound
#   --paired       a run per size, tcp then Open MPI, instead of a sweep per column
#   --no-gloo      skip the Gloo column
#   --builddir DIR where dtrun and dtbench were built (default $DT_BUILDDIR, else the
#                  source tree)
# Environment: MPIRUN (default: mpirun on PATH), DT_PEERS (default ../shared/peers next to
# the source tree), PYTHON (default: the first of python3, /usr/bin/python3 that imports torch).
set -u
srcdir=$(cd "$(dirname "$0")/.." && pwd)
builddir=${DT_BUILDDIR:-$srcdir}
max=256M
min=4K
factor=2
iters=20
ranks="2 4"
ops="all_reduce reduce_scatter all_gather"
repeat=1
bind=auto
paired=0
gloo=1
while [ $# -gt 0 ]; do
    case $1 in
    --max) max=${2:?--max needs a size}; shift 2 ;;
    --min) min=${2:?--min needs a size}; shift 2 ;;
    --factor) factor=${2:?--factor needs a number}; shift 2 ;;
    --iters) iters=${2:?--iters needs a number}; shift 2 ;;
    --ranks) ranks=${2?--ranks needs a list}; shift 2 ;;
    --ops) ops=${2?--ops needs a list}; shift 2 ;;
    --repeat) repeat=${2:?--repeat needs a number}; shift 2 ;;
    --no-gloo) gloo=0; shift ;;
    --paired) paired=1; shift ;;
    --builddir) builddir=${2:?--builddir needs a directory}; shift 2 ;;
    --bind) bind=${2:?--bind needs auto or none}; shift 2 ;;
    -h|--help) sed -n '2,46s/^# \{0,1\}//p' "$0"; exit 0 ;;
    *) echo "allreduce.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done

# SIZE (bytes, or with K, M, G = 2^10, 2^20, 2^30) -> bytes; FLAG names it in the error
bytes_of() {
    num=${2%[kKmMgG]}
    case $num in ''|*[!0-9]*) echo "allreduce.sh: $1: expected a size like 64K or 256M, got '$2'" >&2; exit 2 ;; esac
    case $2 in
    *[kK]) echo $((num * 1024)) ;;
    *[mM]) echo $((num * 1048576)) ;;
    *[gG]) echo $((num * 1073741824)) ;;
    *) echo "$num" ;;
    esac
}
positive() {
    case $2 in ''|*[!0-9]*|0) echo "allreduce.sh: $1: expected a positive integer, got '$2'" >&2; exit 2 ;; esac
}
maxb=$(bytes_of --max "$max") || exit 2
minb=$(bytes_of --min "$min") || exit 2
positive --iters "$iters"
positive --repeat "$repeat"
positive --factor "$factor"
[ "$factor" -ge 2 ] || { echo "allreduce.sh: --factor: expected an integer >= 2, got '$factor'" >&2; exit 2; }
[ "$minb" -ge 1 ] && [ "$minb" -le "$maxb" ] || { echo "allreduce.sh: --min $min is larger than --max $max" >&2; exit 2; }
[ -n "$ranks" ] || { echo "allreduce.sh: --ranks: expected world sizes like \"2 4\"" >&2; exit 2; }
for n in $ranks; do
    case $n in ''|*[!0-9]*|0|1) echo "allreduce.sh: --ranks: expected world sizes >= 2, got '$n'" >&2; exit 2 ;; esac
done
case $bind in auto|none) ;; *) echo "allreduce.sh: --bind: expected auto or none, got '$bind'" >&2; exit 2 ;; esac
[ -n "$ops" ] || { echo "allreduce.sh: --ops: expected all_reduce, reduce_scatter and/or all_gather" >&2; exit 2; }
for op in $ops; do
    case $op in all_reduce|reduce_scatter|all_gather) ;;
    *) echo "allreduce.sh: --ops: expected all_reduce, reduce_scatter or all_gather, got '$op'" >&2; exit 2 ;;
    esac
done
DTRUN=$builddir/dtrun
DTBENCH=$builddir/dtbench
for p in "$DTRUN" "$DTBENCH"; do
    [ -x "$p" ] || { echo "allreduce.sh: $p not found: build dtrain and give --builddir or DT_BUILDDIR" >&2; exit 2; }
done
MPIRUN=${MPIRUN:-$(command -v mpirun || true)}
# the first Python that has torch (a pyenv python3 on PATH may lack Debian's python3-torch)
py=
if [ $gloo = 1 ]; then
    for cand in ${PYTHON:-} python3 /usr/bin/python3; do
        if "$cand" -c 'import torch.distributed' > /dev/null 2>&1; then py=$cand; break; fi
    done
fi
peers=${DT_PEERS:-$srcdir/../shared/peers}
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
unset DT_BACKEND DT_DETERMINISTIC
export DT_TIMEOUT=600
load() { cut -d' ' -f1 /proc/loadavg 2>/dev/null || echo "?"; }
cores=$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1)
[ "$bind" = auto ] && ! command -v taskset > /dev/null 2>&1 && bind=none && echo "# taskset not found: tcp ranks unbound"
# the tcp ranks of an N-rank run, placed as mpirun places its own (see above)
tcp_placed() {
    if [ "$bind" = auto ] && [ "$1" -le "$cores" ]; then
        shift
        "$DTRUN" -n "$n" sh -c 'exec taskset -c "$LOCAL_RANK" "$@"' sh "$@"
    else
        shift
        "$DTRUN" -n "$n" "$@"
    fi
}
# the runs of one repetition: the whole sweep, or one run per size (paired)
if [ $paired = 1 ]; then
    runs= s=$minb
    while [ "$s" -le "$maxb" ]; do runs="$runs -b:$s:-e:$s"; s=$((s * factor)); done
else
    runs="-b:$minb:-e:$maxb"
fi

echo "# f32 sum, $min .. $max (x$factor), dtbench -n $iters, $repeat run(s) per column (medians), tcp ranks" \
     "bound: $bind, $([ $paired = 1 ] && echo 'paired (a run per size, tcp then Open MPI)' || echo 'one sweep per column');" \
     "$(date -u '+%Y-%m-%d %H:%M UTC'), $cores cores, $(uname -m)"
worst=
for n in $ranks; do
    for op in $ops; do
        l0=$(load)
        notes=
        [ -n "$MPIRUN" ] && [ -x "$MPIRUN" ] || notes="
# Open MPI column empty: no mpirun found (install openmpi-bin, configure dtrain with MPI)"
        : > "$tmp/tcp"; : > "$tmp/mpi"; : > "$tmp/gloo"
        i=0
        while [ $i -lt "$repeat" ]; do
          i=$((i + 1))
          for run in $runs; do
            args="$(echo "$run" | tr : ' ') -f $factor -w 5 -n $iters"
            # 1. dtrain tcp: "size time busbw" per correct row
            tcp_placed "$n" "$DTBENCH" -o "$op" $args > "$tmp/tcp.raw" 2> "$tmp/tcp.err"
            rc=$?
            sed -n 's/^\[rank0\]://p' "$tmp/tcp.raw" | awk '$1 ~ /^[0-9]+$/ && $NF == 0 { print $1, $5, $7 }' >> "$tmp/tcp"
            [ $rc -eq 0 ] || notes="$notes
# dtrain tcp run $i failed (exit $rc): $(tail -1 "$tmp/tcp.err")"
            # 2. Open MPI
            if [ -n "$MPIRUN" ] && [ -x "$MPIRUN" ]; then
                DT_MPI_CHECK=0 "$MPIRUN" --allow-run-as-root --oversubscribe -np "$n" "$DTBENCH" --backend mpi -o "$op" \
                    $args > "$tmp/mpi.raw" 2> "$tmp/mpi.err"
                rc=$?
                awk '$1 ~ /^[0-9]+$/ && $NF == 0 { print $1, $5, $7 }' "$tmp/mpi.raw" >> "$tmp/mpi"
                [ $rc -eq 0 ] || notes="$notes
# Open MPI run $i failed (exit $rc): $(tail -1 "$tmp/mpi.err")"
            fi
          done
        done
        # 3. PyTorch Gloo, all_reduce only (the peer script has its own size list; sizes
        #    outside --min .. --max are dropped)
        has_gloo=0
        if [ "$op" = all_reduce ] && [ $gloo = 1 ]; then
            has_gloo=1
            if [ ! -f "$peers/torch_allreduce.py" ]; then
                notes="$notes
# Gloo column empty: $peers/torch_allreduce.py not found (set DT_PEERS)"
            elif [ -z "$py" ]; then
                notes="$notes
# Gloo column empty: python3-torch is not installed"
            else
                "$py" - "$peers/torch_allreduce.py" "$minb" "$maxb" "$tmp/torch_allreduce.py" <<'PY'
import re, sys
src = open(sys.argv[1]).read()
lo, hi = int(sys.argv[2]), int(sys.argv[3])
src = re.sub(r"for size in (\[[^\]]*\]):",
             lambda m: "for size in [s for s in %s if %d <= s <= %d]:" % (m.group(1), lo, hi), src, count=1)
open(sys.argv[4], "w").write(src)
PY
                OMP_NUM_THREADS=1 "$py" "$tmp/torch_allreduce.py" "$n" > "$tmp/gloo.raw" 2> "$tmp/gloo.err"
                rc=$?
                awk '$1 ~ /^[0-9]+$/ { print $1, $2, $4 }' "$tmp/gloo.raw" > "$tmp/gloo"
                [ $rc -eq 0 ] || notes="$notes
# Gloo run failed (exit $rc): $(tail -1 "$tmp/gloo.err")"
            fi
        fi
        echo
        echo "## $op, $n ranks (load $l0 before, $(load) after)"
        # The table: one row per size; "-" where a column has no number.
        awk -v T="$tmp" -v lo="$minb" -v hi="$maxb" -v f="$factor" -v gl=$has_gloo -v tag="$op, $n ranks" '
        function load(name, bw, lat,   line, x, k) {
            while ((getline line < (T "/" name)) > 0) {
                split(line, x, " "); k = x[1]
                nb[name, k]++; bw[k, nb[name, k]] = x[3]; lat[k, nb[name, k]] = x[2]
            }
        }
        # median of the m values v[k, 1..m]
        function med(v, k, m,   i, j, t, a) {
            if (m == 0) return ""
            for (i = 1; i <= m; i++) a[i] = v[k, i] + 0
            for (i = 2; i <= m; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
            return m % 2 ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2
        }
        function ratio(a, b) { return (a == "" || b == "" || b + 0 == 0) ? "-" : sprintf("%.2f", a / b) }
        function show(v, p) { return v == "" ? "-" : sprintf(p, v) }
        BEGIN {
            load("tcp", tb, tl); load("mpi", mb, ml); load("gloo", gb, gll)
            if (gl) printf "%12s %10s %10s %10s %8s %9s\n", "size(B)", "tcp busbw", "mpi busbw", "gloo busbw", "tcp/mpi", "tcp/gloo"
            else printf "%12s %10s %10s %8s\n", "size(B)", "tcp busbw", "mpi busbw", "tcp/mpi"
            worst = ""
            for (s = lo; s <= hi; s *= f) {
                t = med(tb, s, nb["tcp", s]); m = med(mb, s, nb["mpi", s]); g = med(gb, s, nb["gloo", s])
                r = ratio(t, m)
                if (r != "-" && (worst == "" || r + 0 < worst + 0)) { worst = r; ws = s }
                if (gl) printf "%12d %10s %10s %10s %8s %9s\n", s, show(t, "%.3f"), show(m, "%.3f"), show(g, "%.3f"), r, ratio(t, g)
                else printf "%12d %10s %10s %8s\n", s, show(t, "%.3f"), show(m, "%.3f"), r
            }
            printf "# busbw in GB/s; %d B latency (us): tcp %s, mpi %s", lo, show(med(tl, lo, nb["tcp", lo]), "%.2f"),
                   show(med(ml, lo, nb["mpi", lo]), "%.2f")
            if (gl) printf ", gloo %s", show(med(gll, lo, nb["gloo", lo]), "%.1f")
            printf "\n"
            if (worst != "") printf "# lowest tcp/mpi: %s at %d B\n", worst, ws
            if (worst != "") printf "%s %d %s\n", worst, ws, tag > (T "/worst.row")
        }'
        [ -f "$tmp/worst.row" ] && cat "$tmp/worst.row" >> "$tmp/worst" && rm -f "$tmp/worst.row"
        [ -n "$notes" ] && echo "${notes#?}"
    done
done
if [ -s "$tmp/worst" ]; then
    echo
    sort -n "$tmp/worst" | head -1 | awk '{ w = $1; s = $2; $1 = ""; $2 = ""; sub(/^ +/, ""); printf "# lowest tcp/mpi of all tables: %s at %d B (%s)\n", w, s, $0 }'
fi
exit 0
