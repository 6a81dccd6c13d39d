# bench/lib.sh: helpers the benchmark scripts source.
#
# This machine's speed moves by 2-3x from minute to minute (shared hosts, memory
# bandwidth states), so one run of each side gives ratios that swing by as much. The
# scripts therefore run in rounds: each round runs every configuration once, back to
# back, and the tables give medians over the rounds: of the rates, and of the ratios
# taken within a round (both sides measured in the same minute).

# ratio A B: A / B to two decimals, n/a when either is missing or zero
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { a += 0; b += 0; if (b > 0 && a > 0) printf "%.2f", a / b; else printf "n/a" }'; }

# median V...: the median of the numeric values given (n/a, fail and empty ones are
# left out; the lower middle of an even count); n/a when none is left
median() {
    printf '%s\n' "$@" | awk 'BEGIN { n = 0 } $1 ~ /^[0-9.]+$/ { v[n] = $1 + 0; w[n++] = $1 }
        END { if (!n) { print "n/a"; exit }
              for (i = 1; i < n; i++)
                  for (j = i; j > 0 && v[j - 1] > v[j]; j--) { t = v[j]; v[j] = v[j - 1]; v[j - 1] = t; t = w[j]; w[j] = w[j - 1]; w[j - 1] = t }
              print w[int((n - 1) / 2)] }'
}

# peak_rss_mib: on stdin, dtrain's output with --rank-stats (rank prefixes removed); prints
# the largest "peak MiB" (peak resident memory) of the per-rank step table, 0 if none.
# The accounted-memory table that follows it is left out.
peak_rss_mib() {
    awk '/peak MiB/ { on = 1; next } /now\/peak/ { on = 0 }
         on && NF >= 7 && $1 ~ /^[0-9]+$/ { if ($6 + 0 > x) x = $6 + 0 } END { print x + 0 }'
}

# ROUNDS: rounds per table (DT_BENCH_ROUNDS, default 3)
ROUNDS=${DT_BENCH_ROUNDS:-3}
case $ROUNDS in ''|*[!0-9]*|0) echo "bench: DT_BENCH_ROUNDS must be a positive integer, got '$ROUNDS'" >&2; exit 2 ;; esac

# blas_kernels: a line saying which sgemm kernels run. PyTorch calls OpenBLAS, whose
# kernels OPENBLAS_CORETYPE chooses when set (an environment that sets it to Haswell
# runs the AVX2 kernels on a CPU with AVX-512, about half the sgemm rate of OpenBLAS's
# own choice there). dtrain runs its own AVX-512 GEMM on a CPU with AVX-512 F
# (src/cpu/cpu_gemm_avx512.c) unless DT_CPU_GEMM=openblas, and OpenBLAS's otherwise.
blas_kernels() {
    local own=no
    grep -qw avx512f /proc/cpuinfo 2>/dev/null && own=yes
    [ "${DT_CPU_GEMM:-own}" = openblas ] && own=no
    echo "sgemm kernels: OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-(unset: OpenBLAS picks them from the CPU)};" \
         "dtrain: $([ $own = yes ] && echo 'its own AVX-512 GEMM' || echo "OpenBLAS's")"
}

# fortunes_data NAME: DATA, the byte-level token files of Debian's fortunes (the text
# files of /usr/share/games/fortunes, sorted), made once by `dtrain prepare-text` in
# $DT_GPT_DATA (default /tmp/dtrain-gpt-fortunes). B names the build directory; NAME
# the script, in its messages. Exits 2 when B has no dtrain or fortunes is not installed.
fortunes_data() {
    [ -x "$B/dtrain" ] || { echo "$1: no dtrain in $B (set DT_BUILDDIR)"; exit 2; }
    DATA=${DT_GPT_DATA:-/tmp/dtrain-gpt-fortunes}
    [ -s "$DATA/train.bin" ] && return 0
    local files
    files=$(ls -d /usr/share/games/fortunes/* 2>/dev/null | grep -v '\.' | LC_ALL=C sort)
    [ -n "$files" ] || { echo "$1: install Debian's fortunes package (apt-get install fortunes)"; exit 2; }
    "$B/dtrain" prepare-text "$DATA" $files > /dev/null || exit 1
}

# find_peer FILE: PY, a Python that imports torch, and have_torch=1 when it and the peer
# script $PEERS/FILE exist (PEERS: DT_PEERS, or the shared folder beside the checkout);
# have_torch=0 otherwise.
find_peer() {
    PEERS=${DT_PEERS:-$here/../../shared/peers}
    [ -d "$PEERS" ] || PEERS=$here/../shared/peers
    have_torch=0
    local py
    for py in ${PYTHON:-python3 /usr/bin/python3}; do
        if "$py" -c 'import torch' 2>/dev/null && [ -f "$PEERS/$1" ]; then PY=$py; have_torch=1; return 0; fi
    done
}

# dtrain_all PROCS THREADS ARGS...: dtrain train on token data $DATA, rank 0's output
# without its prefix
dtrain_all() {
    local np=$1 thr=$2; shift 2
    if [ "$np" -eq 1 ]; then
        "$B/dtrain" train --data "tokens:$DATA" --threads "$thr" --log-every 1000000 "$@" 2>&1
    else
        OMP_NUM_THREADS=$thr "$B/dtrun" -n "$np" "$B/dtrain" train --data "tokens:$DATA" --threads "$thr" \
            --log-every 1000000 "$@" 2>&1 | sed 's/^\[rank0\]://'
    fi
}
# dtrain_run PROCS THREADS ARGS...: dtrain's final line ("done: ... tokens/s (MFU ...)")
dtrain_run() { dtrain_all "$@" | grep 'dtrain: done'; }
# tok: the tokens/s of dtrain's final line (on stdin)
tok() { sed -n 's/.* \([0-9][0-9]*\) tokens\/s.*/\1/p'; }
# peer_field NAME: the value of NAME=... on a peer's result line (on stdin)
peer_field() { sed -n "s/.*$1=\([0-9.]*\).*/\1/p"; }
