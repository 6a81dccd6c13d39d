# comm_lib.sh: launching helpers for the multi-process communication tests. Source it
# after tap.sh.
#   launch N ARGS...    start N ranks of coll_prog on 127.0.0.1 (RANK, WORLD_SIZE,
#                       MASTER_ADDR/PORT, DT_JOB_ID set; extra variables for every rank
#                       in $LAUNCH_ENV, e.g. LAUNCH_ENV="DT_SHM=0"), wait for all (60 s
#                       bound), output of rank r in $TMP/out.r; status 0 iff every rank
#                       exited 0 (failing ranks are shown as diagnostics)
#   start_rank R N PORT ARGS...   start one rank in the background ($! is its pid);
#                       NO_MASTER=1 leaves MASTER_ADDR/MASTER_PORT unset
PROG="$DT_BUILDDIR/tests/coll_prog"
[ -x "$PROG" ] || skip_all "coll_prog is not built ($PROG)"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
JOB="job$$"

start_rank() {
    r=$1; n=$2; p=$3; shift 3
    master="MASTER_ADDR=127.0.0.1 MASTER_PORT=$p"
    [ -n "$NO_MASTER" ] && master=
    env -u MASTER_ADDR -u MASTER_PORT RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r LOCAL_WORLD_SIZE=$n $master \
        DT_JOB_ID=$JOB $LAUNCH_ENV timeout 60 "$PROG" "$@" > "$TMP/out.$r" 2>&1 &
}

launch() {
    n=$1; shift
    port=$(free_port)
    pids=""
    r=0
    while [ $r -lt $n ]; do
        start_rank $r $n $port "$@"
        pids="$pids $!"
        r=$((r + 1))
    done
    rc=0
    r=0
    for p in $pids; do
        if ! wait $p; then
            rc=1
            diag "rank $r failed:"
            grep -v '^ok' "$TMP/out.$r" | tail -5 | sed 's/^/#   /'
        fi
        r=$((r + 1))
    done
    return $rc
}

# The rank 0 output of a mode-all run holds a TAP plan and no failures.
all_passed() {
    grep -q '^1\.\.[0-9]' "$TMP/out.0" && ! grep -q '^not ok' "$TMP/out.0"
}
