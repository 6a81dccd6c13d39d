#!/bin/sh
# mpirun_bare.sh: the laptop path of docs/DESIGN.md, `mpirun -np 2 ./dtrain train` with no
# flags and no MASTER_ADDR/MASTER_PORT. The tcp backend then finds rank 0's store
# through MPI (tcp.c, mpi_boot.h): the run must finish with the same weight bytes as
# `dtrun -n 2` and as 4 ranks (the tcp backend is world-size invariant), say so once on
# rank 0, set MASTER_ADDR/MASTER_PORT and a shared 64-hex-digit DT_JOB_SECRET on every
# rank (keeping a secret the user set), and leave a user's MASTER_ADDR/MASTER_PORT in
# charge. Skips, saying why, without Open MPI.
. "$DT_SRCDIR/tests/tap.sh"
need_mpirun open
TRAIN="$DT_BUILDDIR/dtrain"
DTRUN="$DT_BUILDDIR/dtrun"
PROG="$DT_BUILDDIR/tests/coll_prog"
[ -x "$TRAIN" ] && [ -x "$DTRUN" ] && [ -x "$PROG" ] || skip_all "dtrain, dtrun and tests/coll_prog are not built"
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader,tcp DT_TIMEOUT=60
unset DT_BACKEND RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT DT_JOB_SECRET DT_SOCKET_IFNAME
# no MASTER_* reaches the ranks, whatever the caller's environment
bare() { n=$1; shift; env -u MASTER_ADDR -u MASTER_PORT timeout 120 "$MPIRUN" --oversubscribe -np "$n" "$@"; }
show() { sed 's/^/#   /' "$1" | tail -15; }
FLAGS="--data synthetic:1024,1,8,8,4 --epochs 1 --batch 64 --micro-batches 4"
MODEL="flatten linear(16) relu linear(4)"

# 1. training: mpirun with no flags, against dtrun, 2 and 4 ranks
for n in 2 4; do
    bare $n "$TRAIN" train $FLAGS --model "$MODEL" --save "$tmp/mpirun$n.st" > "$tmp/log$n" 2>&1
    rc=$?
    ok $rc "mpirun -np $n dtrain train, no MASTER_ADDR/MASTER_PORT: exit 0"
    [ $rc -eq 0 ] || show "$tmp/log$n"
    ok_grep "$tmp/log$n" "^dtrain: done: 16 steps" "$n ranks: 16 steps trained"
    ok_grep "$tmp/log$n" "^dtrain: .* $n processes" "$n ranks: one job of $n processes"
done
grep -q "exiting improperly" "$tmp/log2" "$tmp/log4"; test $? -ne 0
ok $? "every rank finalised MPI (mpirun reports no improper exit)"
test "$(grep -c '^dtrain: mpirun set no MASTER_ADDR/MASTER_PORT: tcp backend, rendezvous at 127.0.0.1:[0-9]* through MPI' "$tmp/log2")" -eq 1
ok $? "rank 0 says once how the ranks met (tcp backend, rendezvous through MPI)"
env -u MASTER_ADDR -u MASTER_PORT timeout 120 "$DTRUN" -n 2 "$TRAIN" train $FLAGS --model "$MODEL" \
    --save "$tmp/dtrun2.st" > "$tmp/logd" 2>&1
ok $? "dtrun -n 2 dtrain train of the same configuration"
cmp "$tmp/dtrun2.st" "$tmp/mpirun2.st" && cmp "$tmp/dtrun2.st" "$tmp/mpirun4.st"
ok $? "mpirun -np 2, mpirun -np 4 and dtrun -n 2 save the same weight bytes"
grep -q "through MPI" "$tmp/logd"; test $? -ne 0
ok $? "dtrun's run did not go through MPI"

# a bad setting found after the rendezvous (MPI finalised by then): every rank exits 2
bare 2 "$TRAIN" train $FLAGS --model "$MODEL" --schedule bogus > "$tmp/late" 2>&1
rc=$?
test $rc -ne 0 && test $rc -ne 124
ok $? "an error after the rendezvous: mpirun exits non-zero, no hang (exit $rc)"
ok_grep "$tmp/late" "^dtrain: rank [01]: --schedule: expected cosine" "... naming the flag"

# 2. the environment every rank ends with: MASTER_ADDR/MASTER_PORT of rank 0's store
# and one fresh secret
bare 3 "$PROG" --mode env > "$tmp/env" 2>&1
ok $? "coll_prog --mode env, 3 ranks, no MASTER_*: exit 0"
test "$(grep -c "^rank [012] of 3 rendezvous 'mpirun 127.0.0.1:[0-9]*' MASTER_ADDR=127.0.0.1 MASTER_PORT=[0-9]* DT_JOB_SECRET=[0-9a-f]\{64\}$" "$tmp/env")" -eq 3
r=$?; ok $r "every rank: rendezvous through MPI, MASTER_ADDR/MASTER_PORT set, a 64-hex-digit secret"
[ $r -eq 0 ] || show "$tmp/env"
test "$(sed -n 's/^rank [0-9] of 3 rendezvous .mpirun \([^ ]*\). MASTER_ADDR=\([^ ]*\) MASTER_PORT=\([^ ]*\) DT_JOB_SECRET=\(.*\)$/\1 \2:\3 \4/p' "$tmp/env" | sort -u | wc -l)" -eq 1
ok $? "... the same address, port and secret on every rank"
bare 2 "$PROG" --mode env > "$tmp/env2" 2>&1
s1=$(sed -n 's/.*DT_JOB_SECRET=//p' "$tmp/env" | head -1); s2=$(sed -n 's/.*DT_JOB_SECRET=//p' "$tmp/env2" | head -1)
test -n "$s2" && test "$s1" != "$s2"
ok $? "another job gets another secret"
user=$(printf 'ab%.0s' 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32)
DT_JOB_SECRET=$user bare 2 "$PROG" --mode env > "$tmp/envu" 2>&1
test "$(grep -c "rendezvous 'mpirun .* DT_JOB_SECRET=$user$" "$tmp/envu")" -eq 2
r=$?; ok $r "a DT_JOB_SECRET the user set is kept on every rank"
[ $r -eq 0 ] || show "$tmp/envu"

# 3. a user's MASTER_ADDR/MASTER_PORT stay in charge: env://, on the user's port
port=$(free_port)
timeout 120 "$MPIRUN" -np 2 -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=$port "$PROG" --mode env > "$tmp/envm" 2>&1
test "$(grep -c "^rank [01] of 2 rendezvous 'env:// 127.0.0.1:$port' MASTER_ADDR=127.0.0.1 MASTER_PORT=$port DT_JOB_SECRET=-$" "$tmp/envm")" -eq 2
r=$?; ok $r "with MASTER_ADDR/MASTER_PORT set: env:// on the user's port, no secret made up"
[ $r -eq 0 ] || show "$tmp/envm"
port=$(free_port)
timeout 120 "$MPIRUN" -np 2 -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=$port "$TRAIN" train $FLAGS --model "$MODEL" \
    --save "$tmp/user.st" > "$tmp/logu" 2>&1
ok $? "mpirun -x MASTER_ADDR -x MASTER_PORT dtrain train: exit 0"
cmp -s "$tmp/dtrun2.st" "$tmp/user.st"; ok $? "... the same weights"
grep -q "through MPI" "$tmp/logu"; test $? -ne 0
ok $? "... and no rendezvous through MPI"
# only one of the two: a clear error naming the missing one, at once
timeout 60 "$MPIRUN" -np 2 -x MASTER_ADDR=127.0.0.1 "$PROG" --mode init > "$tmp/half" 2>&1
rc=$?
test $rc -ne 0 && test $rc -ne 124
ok $? "MASTER_ADDR without MASTER_PORT fails at once (exit $rc)"
ok_grep "$tmp/half" "env:// needs MASTER_ADDR and MASTER_PORT .*: MASTER_PORT is not set" "the error names MASTER_PORT"

# 4. the mpi backend is still one flag away, and a bad interface fails every rank alike
bare 2 "$TRAIN" train $FLAGS --model "$MODEL" --backend mpi > "$tmp/logm" 2>&1
ok $? "mpirun -np 2 dtrain train --backend mpi, no MASTER_*: exit 0"
grep -q "through MPI" "$tmp/logm"; test $? -ne 0
ok $? "... on MPI's collectives, no rendezvous notice"
DT_SOCKET_IFNAME=nosuchif0 bare 2 "$PROG" --mode init > "$tmp/ifn" 2>&1
rc=$?
test $rc -ne 0 && test $rc -ne 124
ok $? "DT_SOCKET_IFNAME naming no interface: mpirun exits non-zero, no hang (exit $rc)"
ok_grep "$tmp/ifn" "DT_SOCKET_IFNAME=nosuchif0" "the error names DT_SOCKET_IFNAME"
done_testing
