#!/bin/sh
# dtbench.sh: dtbench over 2 ranks (tcp via dtrun; mpi under mpirun when built) on small
# sizes: every operation and type gives #wrong 0, the table has its columns and rows,
# and bad flags are refused with one line and exit 2.
. "$DT_SRCDIR/tests/tap.sh"
DTRUN="$DT_BUILDDIR/dtrun"
DTBENCH="$DT_BUILDDIR/dtbench"
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
export DT_TIMEOUT=60

# check_table FILE ROWS WHAT: header present, ROWS data rows, every #wrong is 0.
check_table() {
    ok_grep "$1" '^\[rank0\]:# +size\(B\) +count +type +redop +time\(us\) +algbw\(GB/s\) +busbw\(GB/s\) +#wrong$' "$3: table header"
    rows=$(grep -cE '^\[rank0\]: +[0-9]+ +[0-9]+ +[a-z0-9]+ +[a-z-]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9]+$' "$1")
    test "$rows" -eq "$2"
    ok $? "$3: $2 rows (got $rows)"
    bad=$(awk '/^\[rank0\]: +[0-9]+ / && $NF != 0' "$1" | wc -l)
    test "$bad" -eq 0 && test "$rows" -gt 0
    ok $? "$3: #wrong is 0 in every row"
    ! grep -q '^\[rank1\]: *[0-9]' "$1"
    ok $? "$3: only rank 0 prints rows"
}

# sizes 4K, 16K, 64K: 3 rows
for op in all_reduce broadcast all_gather reduce_scatter reduce; do
    timeout 60 "$DTRUN" -n 2 "$DTBENCH" -o $op -b 4K -e 64K -f 4 -w 1 -n 2 > "$tmp/$op" 2>&1
    ok $? "tcp $op exits 0"
    check_table "$tmp/$op" 3 "tcp $op"
done
for dr in f64:avg f16:sum bf16:max i32:min i64:prod u8:sum; do
    d=${dr%:*}; r=${dr#*:}
    timeout 60 "$DTRUN" -n 2 "$DTBENCH" -d $d -r $r -b 1K -e 4K -f 2 -w 1 -n 2 > "$tmp/t" 2>&1
    ok $? "tcp all_reduce $d $r exits 0"
    check_table "$tmp/t" 3 "tcp all_reduce $d $r"
    ok_grep "$tmp/t" "^\[rank0\]: +1024 +[0-9]+ +$d +$r " "tcp all_reduce $d $r: type and redop columns"
done
# busbw = algbw x 2(n-1)/n = algbw for all_reduce on 2 ranks; x (n-1)/n = half for all_gather
awk '/^\[rank0\]: +[0-9]+ / && $7 != $8 { bad++ } END { exit bad > 0 }' "$tmp/all_reduce"
ok $? "all_reduce on 2 ranks: busbw equals algbw"
awk '/^\[rank0\]: +[0-9]+ / { d = $7 / 2 - $8; if (d > 0.002 || d < -0.002) bad++ } END { exit bad > 0 }' "$tmp/all_gather"
ok $? "all_gather on 2 ranks: busbw is half of algbw"
# 3 ranks, sizes that do not divide evenly
timeout 60 "$DTRUN" -n 3 "$DTBENCH" -o reduce_scatter -b 1000 -e 1000 -w 0 -n 1 > "$tmp/t3" 2>&1
ok $? "3 ranks, 1000 bytes reduce_scatter exits 0"
check_table "$tmp/t3" 1 "3-rank reduce_scatter"
ok_grep "$tmp/t3" '^\[rank0\]: +996 +249 ' "1000 bytes over 3 ranks of f32 rounds to 996 bytes, 249 elements"

# mpi backend under mpirun
if [ -n "$MPIRUN" ] && [ -x "$MPIRUN" ]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
    for op in all_reduce reduce_scatter; do
        timeout 60 "$MPIRUN" --oversubscribe -np 2 "$DTBENCH" --backend mpi -o $op -d bf16 -b 4K -e 64K -f 4 -w 1 -n 2 \
            > "$tmp/m" 2>&1
        ok $? "mpi $op exits 0"
        sed 's/^/[rank0]:/' "$tmp/m" > "$tmp/m0"   # mpirun prints rank 0's lines unprefixed
        check_table "$tmp/m0" 3 "mpi $op"
    done
else
    skip "no mpirun: mpi backend not built"
fi

# bad flags: one line, exit 2
bad() {
    pat=$1; shift
    timeout 20 "$DTBENCH" "$@" > "$tmp/out" 2> "$tmp/err"
    rc=$?
    test "$rc" -eq 2 && test "$(wc -l < "$tmp/err")" -eq 1 && grep -Eq -- "$pat" "$tmp/err"
    ok $? "dtbench $* -> exit 2 with '$pat' (rc $rc)"
}
bad "^dtbench: -b: expected an integer \(optionally with K, M or G\), got '4Q'" -b 4Q
bad "^dtbench: -e: expected a value in \[1, 1099511627776\], got '-5'" -e -5
bad "^dtbench: -e: expected a value in \[1, 1099511627776\], got '2048G'" -e 2048G
bad "^dtbench: -b 1048576 is larger than -e 4096" -b 1M -e 4K
bad "^dtbench: -f: expected a factor > 1" -f 1
bad "^dtbench: -o: expected all_reduce" -o alltoall
bad "^dtbench: -d: expected f32" -d f8
bad "^dtbench: -r: expected sum" -r xor
bad "^dtbench: -n: expected a value in \[1, 1000000\], got '0'" -n 0
bad "^dtbench: -c: expected a value in \[0, 1\], got '2'" -c 2
bad "^dtbench: -f: expected a number, got 'x'" -f x
bad "^dtbench: --backend: expected tcp, mpi or nccl" --backend=ib
bad "^dtbench: unknown option '--bogus'" --bogus
bad "^dtbench: -w: expected a value after it" -w
bad "^dtbench: -W: expected a value in \[0, 3600\], got '-1'" -W -1
bad "^dtbench: -W: expected a number, got 'soon'" -W soon
timeout 20 "$DTBENCH" --help > "$tmp/out" 2>&1
ok $? "--help exits 0"
ok_grep "$tmp/out" "busbw" "--help explains the columns"
done_testing
