# tap.sh: TAP helpers for dtrain's multi-process shell tests. Source it.
#   ok COND_STATUS "what"     e.g. `cmd; ok $? "cmd works"` (0 passes)
#   ok_grep FILE PATTERN "what"  passes when FILE contains PATTERN (grep -E)
#   skip_all "reason"         skip the whole file
#   skip "reason"             one skipped test point
#   need_mpirun [open]        skip_all unless configure found (Open) MPI's mpirun
#   need_torch                skip_all without PyTorch; else $PY runs it
#   metrics_peak, plan_bytes  memory figures of a metrics file and of dtrain plan --json
#   done_testing              print the plan; exit 1 if anything failed
# Programs: $DT_BUILDDIR/dtrun, $DT_BUILDDIR/dtbench, ... (set by make check).
tap_n=0
tap_failed=0
: "${DT_BUILDDIR:=$(cd "$(dirname "$0")/.." && pwd)}"
: "${DT_SRCDIR:=$(cd "$(dirname "$0")/.." && pwd)}"
# MFU's peak (src/tools/peak.h): one cache for the suite, not the user's
: "${DT_PEAK_CACHE:=$DT_BUILDDIR/tests/peak.cache}"
export DT_PEAK_CACHE
diag() { echo "# $*"; }
ok() {
    tap_n=$((tap_n + 1))
    if [ "$1" -eq 0 ]; then echo "ok $tap_n - $2"; else echo "not ok $tap_n - $2"; tap_failed=$((tap_failed + 1)); fi
}
ok_grep() {
    if grep -Eq -- "$2" "$1"; then ok 0 "$3"; else ok 1 "$3"; diag "pattern '$2' not in $1:"; sed 's/^/#   /' "$1" | tail -20; fi
}
skip() { tap_n=$((tap_n + 1)); echo "ok $tap_n # SKIP $*"; }
skip_all() { echo "1..0 # SKIP $*"; exit 0; }
done_testing() { echo "1..$tap_n"; [ "$tap_failed" -eq 0 ]; exit $?; }
# Skip the whole file unless configure found MPI ($MPIRUN); `need_mpirun open`: and it is Open MPI's.
need_mpirun() {
    [ -n "$MPIRUN" ] || skip_all "configure found no MPI (MPIRUN is empty): install libopenmpi-dev openmpi-bin"
    [ -x "$MPIRUN" ] || skip_all "MPIRUN=$MPIRUN is not executable"
    [ "${1:-}" != open ] || "$MPIRUN" --version 2>/dev/null | grep -q 'Open MPI' || skip_all "$MPIRUN is not Open MPI's"
}
# Set PY to a Python with PyTorch and NumPy (python3, else Debian's /usr/bin/python3), or
# skip the whole file; PYTHONPATH then holds tests/ for st_torch.py (safetensors I/O).
need_torch() {
    PY=
    for p in python3 /usr/bin/python3; do
        if timeout 60 "$p" -c 'import torch, numpy' >/dev/null 2>&1; then PY=$p; break; fi
    done
    [ -n "$PY" ] || skip_all "PyTorch (python3-torch) not installed"
    PYTHONPATH="$DT_SRCDIR/tests${PYTHONPATH:+:$PYTHONPATH}"
    export PYTHONPATH
}
# The peak bytes of memory category CAT (params, ..., total) in rank 0's last "memory" line
# of a metrics file (dtrain train --metrics), and the bytes of CAT that `dtrain plan
# --json` planned in its first row: metrics_peak FILE CAT, plan_bytes FILE CAT.
metrics_peak() { sed -n "s/.*\"event\":\"memory\",\"step\":[0-9]*,\"rank\":0,.*\"mem_peak_bytes\":{[^}]*\"$2\":\([0-9]*\).*/\1/p" "$1" | tail -1; }
plan_bytes() { sed -n "s/.*\"bytes\":{[^}]*\"$2\":\([0-9]*\).*/\1/p" "$1" | head -1; }
# A free TCP port on loopback (bound and released; good enough for tests on one machine).
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# Wait (at most SECONDS, default 30) until FILE holds a line matching the extended
# regular expression RE: wait_line FILE RE [SECONDS]; its status says whether it does.
wait_line() {
    wl_i=0
    while ! grep -Eq -- "$2" "$1" 2>/dev/null && [ $wl_i -lt $((${3:-30} * 10)) ]; do sleep 0.1; wl_i=$((wl_i + 1)); done
    grep -Eq -- "$2" "$1"
}
# Wait (at most SECONDS) for process PID, a child of this shell, to end (then kill it):
# wait_pid PID SECONDS; its exit status.
wait_pid() {
    wp_i=0
    while kill -0 "$1" 2>/dev/null && [ $wp_i -lt $(($2 * 10)) ]; do sleep 0.1; wp_i=$((wp_i + 1)); done
    kill -0 "$1" 2>/dev/null && { echo "# pid $1 still running after $2 s: killed"; kill -KILL "$1"; }
    wait "$1"
}
