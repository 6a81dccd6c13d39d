#!/bin/sh
# comm_every.sh: every collective of the list (src/comm/coll.h) on every backend this build
# has, from the case table of tests/coll_cases.h (coll_prog --mode every: each element
# type, operator and placement, results exact): tcp on 2 ranks (halving/doubling) and 3
# (rings), through shared memory and over TCP alone; mpi under mpirun on 2 and 3 ranks,
# native and deterministic, when Open MPI is built in (else one skip, saying why). The
# nccl backend runs the same table on device buffers in tests/gpu_nccl_prog --mode every,
# which tests/gpu_lib.sh's gpu_nccl_checks starts: on emulated GPUs in tests/gpu_emu.sh (a
# --with-cuda --with-nccl build), on real ones in tests/gpu_nccl.sh; it needs the CUDA
# stand-ins those files build.
. "$DT_SRCDIR/tests/tap.sh"
. "$DT_SRCDIR/tests/comm_lib.sh"

# every_ok FILE WHAT: FILE (rank 0's output) holds a plan of one point per collective and
# type, every point passed, and no rank reported a failure
every_ok() {
    nok=$(grep -c '^ok ' "$1")
    plan=$(sed -n 's/^1\.\.\([0-9][0-9]*\)$/\1/p' "$1")
    [ -n "$plan" ] && [ "$plan" -gt 0 ] && [ "$nok" -eq "$plan" ] && ! grep -q 'not ok' "$1"
    st=$?
    ok $st "$2 ($nok checks)"
    [ $st -eq 0 ] || grep 'not ok' "$1" | head -5 | sed 's/^/#   /'
}

for n in 2 3; do
    for shm in 1 0; do
        how="shared memory"; [ $shm = 0 ] && how="TCP only"
        LAUNCH_ENV="DT_SHM=$shm" launch $n --mode every
        st=$?
        ok $st "tcp, $n ranks, $how: coll_prog --mode every exits 0 on every rank"
        every_ok "$TMP/out.0" "tcp, $n ranks, $how: every collective of the list, every type"
    done
done

if [ -n "$MPIRUN" ] && [ -x "$MPIRUN" ]; then
    for det in 0 1; do
        mode=native; [ $det = 1 ] && mode=deterministic
        for n in 2 3; do
            DT_BACKEND=mpi DT_TIMEOUT=60 DT_DETERMINISTIC=$det OMPI_ALLOW_RUN_AS_ROOT=1 \
                OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo \
                timeout 120 "$MPIRUN" --oversubscribe -np $n "$PROG" --mode every > "$TMP/mpi" 2>&1
            st=$?
            ok $st "mpi $mode, $n ranks: coll_prog --mode every exits 0 on every rank"
            [ $st -eq 0 ] || grep -v '^ok ' "$TMP/mpi" | tail -5 | sed 's/^/#   /'
            every_ok "$TMP/mpi" "mpi $mode, $n ranks: every collective of the list, every type"
        done
    done
else
    skip "configure found no MPI (MPIRUN is empty): the mpi backend is not built"
fi
done_testing
