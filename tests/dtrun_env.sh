#!/bin/sh
# dtrun_env.sh: the launch variables every rank of `dtrun -n N` sees.
. "$DT_SRCDIR/tests/tap.sh"
DTRUN="$DT_BUILDDIR/dtrun"
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT

# Each rank prints its variables as one line.
show='echo "R=$RANK L=$LOCAL_RANK W=$WORLD_SIZE LW=$LOCAL_WORLD_SIZE N=$NODE_RANK G=$GROUP_RANK M=$MASTER_ADDR P=$MASTER_PORT J=$DT_JOB_ID OMP=$OMP_NUM_THREADS OB=$OPENBLAS_NUM_THREADS"'
env -u DT_JOB_ID -u OMP_NUM_THREADS -u OPENBLAS_NUM_THREADS \
    timeout 20 "$DTRUN" -n 3 sh -c "$show" > "$tmp/out" 2> "$tmp/err"
ok $? "dtrun -n 3 runs and exits 0"
for r in 0 1 2; do
    ok_grep "$tmp/out" "^\[rank$r\]:R=$r L=$r W=3 LW=3 N=0 G=0 M=127\.0\.0\.1 P=[0-9]+ " "rank $r sees RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, NODE_RANK, GROUP_RANK, MASTER_ADDR"
done
test "$(wc -l < "$tmp/out")" -eq 3
ok $? "exactly one line per rank"
ports=$(sed -n 's/.* P=\([0-9]*\) .*/\1/p' "$tmp/out" | sort -u)
test "$(echo "$ports" | wc -l)" -eq 1 && test "$ports" -ge 1 && test "$ports" -le 65535
ok $? "all ranks share one free port ($ports)"
jobs=$(sed -n 's/.* J=\([^ ]*\) .*/\1/p' "$tmp/out" | sort -u)
test "$(echo "$jobs" | wc -l)" -eq 1 && test -n "$jobs"
ok $? "all ranks share one fresh job id ($jobs)"
cores=$(nproc)
t=$((cores / 3)); [ "$t" -lt 1 ] && t=1
ok_grep "$tmp/out" "OMP=$t OB=$t\$" "OMP_NUM_THREADS and OPENBLAS_NUM_THREADS = max(1, cores/3) = $t"

# A second run gets a different job id.
env -u DT_JOB_ID timeout 20 "$DTRUN" -n 1 sh -c 'echo "J=$DT_JOB_ID"' > "$tmp/out2"
ok_grep "$tmp/out2" "^\[rank0\]:J=." "second run has a job id"
! grep -q "J=$jobs\$" "$tmp/out2"
ok $? "a second run gets another job id"

# Given values win: --master-addr/--master-port, DT_JOB_ID (even a long one),
# OMP_NUM_THREADS.
long=job-$(printf '%0100d' 7)
DT_JOB_ID=$long OMP_NUM_THREADS=7 OPENBLAS_NUM_THREADS=5 timeout 20 "$DTRUN" --nproc-per-node 2 \
    --master-addr localhost --master-port 23456 -- sh -c "$show" > "$tmp/out3" 2>&1
ok $? "--nproc-per-node 2 with given master runs"
ok_grep "$tmp/out3" "^\[rank1\]:R=1 L=1 W=2 LW=2 N=0 G=0 M=localhost P=23456 J=$long OMP=7 OB=5\$" "given master, job id and thread counts are passed through"
ok_grep "$tmp/out3" "^\[rank0\]:R=0 " "rank 0 ran"

done_testing
