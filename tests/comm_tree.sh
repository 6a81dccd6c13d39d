#!/bin/bash
# comm_tree.sh: docs/DESIGN.md rule 2 for the communication layer. Eight fixed buffers of
# awkward floats are summed on world sizes 1, 2, 4 and 8 (8 ranks oversubscribed), each
# rank pre-summing its 8/W buffers pairwise; all_reduce (small and large paths) and
# reduce_scatter must give bitwise identical bytes on every world size and transport
# (sockets, shared-memory rings, and with DT_CMA=1 cross-memory reads for the largest
# size). Then, on world sizes 1, 2 and 4, reduce_scatter must be all_reduce's array cut
# into blocks, bit for bit, for odd counts per rank too (coll_prog --mode slices).
. "$DT_SRCDIR/tests/tap.sh"
. "$DT_SRCDIR/tests/comm_lib.sh"

for n in 1 2 4 8; do
    LAUNCH_ENV= launch $n --mode tree --dump "$TMP/tree.$n"
    ok $? "world size $n: tree reduction runs"
done
LAUNCH_ENV="DT_SHM=0" launch 8 --mode tree --dump "$TMP/tree.8tcp"
ok $? "world size 8 over TCP only"
LAUNCH_ENV="DT_SHM=0" launch 4 --mode tree --dump "$TMP/tree.4tcp"
ok $? "world size 4 over TCP only"
LAUNCH_ENV="DT_CMA=0" launch 2 --mode tree --dump "$TMP/tree.2ring"
ok $? "world size 2, shared memory without cross-memory reads (DT_CMA=0)"
LAUNCH_ENV="DT_CMA=1" launch 2 --mode tree --dump "$TMP/tree.2cma"
ok $? "world size 2, large messages always by cross-memory reads (DT_CMA=1)"
LAUNCH_ENV="DT_CMA=1" launch 4 --mode tree --dump "$TMP/tree.4cma"
ok $? "world size 4, large messages always by cross-memory reads (DT_CMA=1)"
# the control: the inputs are awkward enough that another summation order changes bits
LAUNCH_ENV= launch 1 --mode tree --dump "$TMP/tree.1b"
ok_grep "$TMP/out.0" "sequential order differs \(n=1000\)" "a left-to-right sum gives other bits (small case)"
ok_grep "$TMP/out.0" "sequential order differs \(n=100000\)" "a left-to-right sum gives other bits (large case)"
[ -s "$TMP/tree.1" ]; ok $? "results were written"
for f in tree.2 tree.4 tree.8 tree.8tcp tree.4tcp tree.2ring tree.2cma tree.4cma; do
    cmp -s "$TMP/tree.1" "$TMP/$f"
    ok $? "$f is bitwise identical to world size 1"
done
# reduce_scatter is all_reduce cut into blocks (what sharded training relies on), for odd
# counts per rank too, on every transport; all_gather puts the blocks back exactly
for n in 1 2 4; do
    LAUNCH_ENV= launch $n --mode slices
    ok $? "world size $n: reduce_scatter is bitwise all_reduce's block, all_gather exact (every rank)"
    all_passed
    ok $? "world size $n: every slice check passed"
done
LAUNCH_ENV="DT_SHM=0" launch 4 --mode slices
ok $? "world size 4 over TCP only: reduce_scatter slices"
LAUNCH_ENV="DT_CMA=1" launch 2 --mode slices
ok $? "world size 2 with cross-memory reads (DT_CMA=1): reduce_scatter slices"
done_testing
