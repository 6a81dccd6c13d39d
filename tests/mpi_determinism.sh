#!/bin/sh
# mpi_determinism.sh: the mpi backend in deterministic mode gives bitwise the tcp
# backend's results (docs/DESIGN.md rule 2): the same reductions on pseudo-random data
# (tests/coll_dump) under dtrun/tcp and under mpirun/mpi with DT_DETERMINISTIC=1, rank 0's
# result bytes compared with cmp, for 2, 3 and 4 ranks.
. "$DT_SRCDIR/tests/tap.sh"
need_mpirun
DTRUN="$DT_BUILDDIR/dtrun"
DUMP="$DT_BUILDDIR/tests/coll_dump"
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
export DT_TIMEOUT=60
# ok_log STATUS WHAT: one test point; on failure show the command's output
ok_log() { ok "$1" "$2"; [ "$1" -eq 0 ] || sed 's/^/#   /' "$tmp/log"; }

# counts 1, 7, 1000, 100003 (sum 101011); per count rank 0 writes f32 sum, f32 avg,
# bf16 sum, the gathered f32 reduce_scatter (n blocks) and f32 reduce
for n in 2 3 4; do
    env -u DT_BACKEND DT_DETERMINISTIC=0 timeout 60 "$DTRUN" -n $n "$DUMP" "$tmp/tcp$n" > "$tmp/log" 2>&1
    ok_log $? "tcp, $n ranks: coll_dump runs"
    DT_BACKEND=mpi DT_DETERMINISTIC=1 timeout 60 "$MPIRUN" --allow-run-as-root --oversubscribe -np $n \
        "$DUMP" "$tmp/mpi$n" > "$tmp/log" 2>&1
    ok_log $? "mpi deterministic, $n ranks: coll_dump runs"
    size=$(wc -c < "$tmp/tcp$n" 2>/dev/null || echo 0)
    test "$size" -eq $((101011 * (14 + 4 * n)))
    ok $? "tcp, $n ranks: result file has the expected size ($size bytes)"
    cmp "$tmp/tcp$n" "$tmp/mpi$n"
    ok $? "$n ranks: mpi deterministic results are bitwise the tcp results"
done
# The same program under the mpi backend's native collectives also runs (its bits may
# differ: MPI chooses the order), and DT_DETERMINISTIC=1 over tcp changes nothing.
DT_BACKEND=mpi DT_DETERMINISTIC=0 timeout 60 "$MPIRUN" --allow-run-as-root --oversubscribe -np 4 \
    "$DUMP" "$tmp/native4" > "$tmp/log" 2>&1
ok_log $? "mpi native, 4 ranks: coll_dump runs"
test "$(wc -c < "$tmp/native4")" -eq "$(wc -c < "$tmp/tcp4")"
ok $? "mpi native, 4 ranks: same amount of output"
if cmp -s "$tmp/native4" "$tmp/tcp4"; then diag "MPI's own reductions happen to match the tree on 4 ranks"; else diag "MPI's own reductions differ from the tree on 4 ranks in some bits, as expected"; fi
done_testing
