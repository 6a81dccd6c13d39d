#!/bin/sh
# launch_mpirun.sh: the programs run unchanged under Open MPI's mpirun, 2 and 4 ranks,
# with the tcp backend (MASTER_ADDR/MASTER_PORT passed with -x, as a user who picks
# the rendezvous does) and the mpi backend: dtbench checks its collectives' results, and
# a short dtrain run (4 micro-batches) must write the same weights under every backend
# and world size (docs/DESIGN.md rule 2). Without MASTER_ADDR/MASTER_PORT the tcp backend
# finds rank 0 through MPI instead: tests/mpirun_bare.sh.
. "$DT_SRCDIR/tests/tap.sh"
need_mpirun open
BENCH="$DT_BUILDDIR/dtbench"
TRAIN="$DT_BUILDDIR/dtrain"
[ -x "$BENCH" ] && [ -x "$TRAIN" ] || skip_all "dtbench and dtrain are not built"
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader,tcp
# the tcp backend ignores DT_BACKEND from the caller: each run names its backend
unset DT_BACKEND RANK WORLD_SIZE MASTER_ADDR MASTER_PORT
mpi() { n=$1; shift; timeout 120 "$MPIRUN" --oversubscribe -np "$n" "$@"; }
show() { sed 's/^/#   /' "$tmp/log" | tail -15; }

for backend in tcp mpi; do
    for n in 2 4; do
        port=$(free_port)
        mpi $n -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=$port "$BENCH" --backend $backend -b 4K -e 64K -n 5 -w 1 \
            > "$tmp/log" 2>&1
        rc=$?
        ok $rc "mpirun -np $n dtbench --backend $backend exits 0"
        [ $rc -eq 0 ] || show
        ok_grep "$tmp/log" "^# dtbench: all_reduce, backend $backend, $n ranks" "$backend, $n ranks: dtbench found $n ranks"
        test "$(grep -Ec '^ +[0-9]+ +[0-9]+ +f32 +sum .* 0$' "$tmp/log")" -eq 5
        ok $? "$backend, $n ranks: 5 sizes, no wrong element"

        port=$(free_port)
        mpi $n -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=$port "$TRAIN" train --backend $backend \
            --data synthetic:1024,1,8,8,4 --model "flatten linear(16) relu linear(4)" --epochs 1 --batch 64 --micro-batches 4 \
            --save "$tmp/w_${backend}_$n.safetensors" > "$tmp/log" 2>&1
        rc=$?
        ok $rc "mpirun -np $n dtrain train --backend $backend exits 0"
        [ $rc -eq 0 ] || show
        ok_grep "$tmp/log" "^dtrain: done: 16 steps" "$backend, $n ranks: 16 steps trained"
    done
done
same=0
for f in "$tmp"/w_*.safetensors; do cmp -s "$tmp/w_tcp_2.safetensors" "$f" || { same=1; diag "$f differs from w_tcp_2"; }; done
test -s "$tmp/w_tcp_2.safetensors" && test $same -eq 0
ok $? "the weights are the same bytes for tcp and mpi, 2 and 4 ranks"

# a rank that fails ends the job under mpirun too
port=$(free_port)
mpi 2 -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=$port "$BENCH" --backend mpi -b 4K -e 4K -n 1 -w 0 -o no_such_op \
    > "$tmp/log" 2>&1
rc=$?
test $rc -ne 0 && test $rc -ne 124
ok $? "a bad flag on every rank: mpirun exits non-zero, no hang (exit $rc)"
done_testing
