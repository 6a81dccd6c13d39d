#!/bin/sh
# mpi_coll.sh: the mpi backend under mpirun with 2 and 4 ranks, native and deterministic:
# every collective, type and operator of tests/coll_prog --mode all; world-size
# invariance of the deterministic tree (--mode tree, W = 1, 2, 4, equal to tcp's bytes);
# a collective mismatch is an error naming both calls; in deterministic mode a rank that
# never arrives gives a timeout (native MPI collectives cannot time out: see mpi.c).
. "$DT_SRCDIR/tests/tap.sh"
need_mpirun
PROG="$DT_BUILDDIR/tests/coll_prog"
DTRUN="$DT_BUILDDIR/dtrun"
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
export DT_BACKEND=mpi DT_TIMEOUT=60
mpirun_n() { n=$1; shift; timeout 120 "$MPIRUN" --allow-run-as-root --oversubscribe -np "$n" "$@"; }
ok_log() { ok "$1" "$2"; [ "$1" -eq 0 ] || sed 's/^/#   /' "$tmp/log" | tail -20; }

for det in 0 1; do
    mode=native; [ $det = 1 ] && mode=deterministic
    for n in 2 4; do
        DT_DETERMINISTIC=$det mpirun_n $n "$PROG" --mode all > "$tmp/log" 2>&1
        ok_log $? "$mode, $n ranks: coll_prog --mode all passes"
        nok=$(grep -c '^ok ' "$tmp/log")
        test "$nok" -gt 20 && ! grep -q '^not ok' "$tmp/log"
        ok_log $? "$mode, $n ranks: $nok checks passed, none failed"
        grep -q 'rank [0-9]: not ok' "$tmp/log" && { ok 1 "$mode, $n ranks: other ranks' checks"; sed 's/^/#   /' "$tmp/log" | grep 'not ok' | head; } \
            || ok 0 "$mode, $n ranks: other ranks' checks"
    done
done

# world-size invariance through the mpi backend's deterministic mode, and the same
# bytes as the tcp backend
for n in 1 2 4; do
    DT_DETERMINISTIC=1 mpirun_n $n "$PROG" --mode tree --dump "$tmp/tree$n" > "$tmp/log" 2>&1
    ok_log $? "deterministic, $n ranks: --mode tree runs"
done
cmp "$tmp/tree1" "$tmp/tree2" && cmp "$tmp/tree1" "$tmp/tree4"
ok $? "deterministic mpi: W = 1, 2, 4 give the same bytes"
env -u DT_BACKEND timeout 60 "$DTRUN" -n 2 "$PROG" --mode tree --dump "$tmp/tcp2" > "$tmp/log" 2>&1
ok_log $? "tcp, 2 ranks: --mode tree runs"
cmp "$tmp/tree2" "$tmp/tcp2"
ok $? "deterministic mpi equals tcp bytes"

# mismatch: rank 0 calls all_reduce, the others broadcast -> an error naming both calls
for det in 0 1; do
    mode=native; [ $det = 1 ] && mode=deterministic
    DT_DETERMINISTIC=$det mpirun_n 2 "$PROG" --mode mismatch > "$tmp/log" 2>&1
    rc=$?
    test $rc -ne 0 && test $rc -ne 124
    ok_log $? "$mode: a collective mismatch fails the job (exit $rc, no hang)"
    ok_grep "$tmp/log" 'ERROR: collective: rank [01]: .*mismatch.*(all_reduce.*broadcast|broadcast.*all_reduce)' \
        "$mode: the error names both calls"
done

# timeout in deterministic mode: rank 1 sleeps, rank 0 gives up after DT_TIMEOUT
start=$(date +%s)
DT_DETERMINISTIC=1 DT_TIMEOUT=2 mpirun_n 2 "$PROG" --mode timeout > "$tmp/log" 2>&1
rc=$?
el=$(( $(date +%s) - start ))
test $rc -ne 0 && test $el -lt 25
ok_log $? "deterministic: a missing rank ends the job by timeout (exit $rc after ${el}s)"
ok_grep "$tmp/log" 'ERROR: all_reduce: rank 0: timed out after 2 s in collective #[0-9]+ all_reduce.*waiting for rank 1' \
    "deterministic: the timeout names the collective and the missing rank"

# rank discovery: local ranks and hosts as MPI reports them
mpirun_n 2 "$PROG" --mode init > "$tmp/log" 2>&1
ok_log $? "--mode init under mpirun"
ok_grep "$tmp/log" '^rank 1 of 2 on .* \(mpi\)$' "rank 1 of 2 over the mpi backend"
done_testing
