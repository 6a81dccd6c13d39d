#!/bin/sh
# secure.sh: --secure-transport end to end on loopback, with DT_SHM=0 so that every byte
# between the ranks crosses a socket: every collective of dtbench sealed (auth, encrypt;
# 2 and 3 ranks) gives checked results and says it is sealed; a sharded training run
# sealed saves the very bytes of the unsealed one; a bit flipped by the last rank after
# sealing (the planted fault seal-flip) stops the job, rank 0 naming rank 1; ranks that
# seal differently, sealing without a job secret, a bad value, and another backend are
# refused with a clear message, before any collective runs.
. "$DT_SRCDIR/tests/tap.sh"
B=$DT_BUILDDIR
T=$(mktemp -d) || exit 1
trap 'rm -rf "$T"' EXIT
export DT_SHM=0 DT_TIMEOUT=30
unset DT_SECURE DTRUN_SECURE_TRANSPORT

# 1. collectives, sealed, results checked by dtbench itself (#wrong)
for spec in "2 auth" "2 encrypt" "3 encrypt"; do
    set -- $spec
    for op in all_reduce broadcast all_gather reduce_scatter reduce; do
        timeout 120 "$B/dtrun" -n "$1" --secure-transport "$2" "$B/dtbench" -o $op -b 4 -e 2M -f 32 -n 2 -w 1 -W 0 \
            > "$T/bench" 2>&1
        rc=$?
        sealed=$(grep -c "^\[rank0\]:# dtbench: $op, backend tcp (sealed: $2 (" "$T/bench")
        wrong=$(grep '^\[rank0\]: *[0-9]' "$T/bench" | awk '$NF != 0' | wc -l)
        rows=$(grep -c '^\[rank0\]: *[0-9]' "$T/bench")
        test $rc -eq 0 && test "$sealed" -eq 1 && test "$wrong" -eq 0 && test "$rows" -ge 4
        ok $? "$1 ranks, $op sealed ($2): $rows sizes, none wrong"
        [ $rc -eq 0 ] || tail -3 "$T/bench" | sed 's/^/#   /'
    done
done

# 2. training sealed: the same bytes saved as without sealing (the records carry the bytes
# unchanged, whatever the cut)
echo "flatten linear(32) relu linear(4)" > "$T/model"
run="train --data synthetic:512,1,8,8,4 --model @$T/model --epochs 2 --batch 64 --shard optim --threads 1 --quiet"
for mode in off auth encrypt; do
    timeout 120 "$B/dtrun" -n 2 "$B/dtrain" $run --secure-transport $mode --save "$T/$mode.st" > "$T/$mode.out" 2>&1
    ok $? "dtrain train --shard optim --secure-transport $mode on 2 ranks"
done
cmp -s "$T/off.st" "$T/auth.st" && cmp -s "$T/off.st" "$T/encrypt.st"
ok $? "sealed with auth and with encrypt, the saved weights are the unsealed run's bytes"
timeout 120 "$B/dtrun" -n 2 "$B/dtrain" train --data synthetic:512,1,8,8,4 --model @"$T/model" --epochs 1 --batch 64 \
    --threads 1 --secure-transport encrypt > "$T/say.out" 2>&1
ok_grep "$T/say.out" '^\[rank0\]:dtrain: secure transport: encrypt \((AES-256-GCM|ChaCha20-Poly1305)\)' \
    "rank 0 says how the traffic is sealed"

# 3. a record altered on the way (rank 1 flips a bit of its 5th record on each connection,
# after sealing it): rank 0 refuses it, naming rank 1; the job ends, not hangs
for mode in auth encrypt; do
    timeout 60 "$B/dtrun" -n 2 "$B/dtrain" $run --secure-transport $mode --testing-fault seal-flip:5 > "$T/flip.out" 2>&1
    rc=$?
    test $rc -ne 0 && test $rc -ne 124
    ok $? "$mode: an altered record ends the job (exit $rc)"
    ok_grep "$T/flip.out" "rank 0: .*a record from rank 1 \(.*\) failed its check during .*: altered on the way" \
        "$mode: rank 0 names rank 1 as the sender of the altered record"
done

# 4. refusals. start R MODE [SECRET]: rank R of 2 running dtbench with DT_SECURE=MODE
port=$(free_port)
start() {
    env -u DT_JOB_SECRET -u DT_JOB_SECRET_FILE RANK=$1 WORLD_SIZE=2 LOCAL_RANK=$1 LOCAL_WORLD_SIZE=2 \
        MASTER_ADDR=127.0.0.1 MASTER_PORT=$port DT_JOB_ID=secure$$ DT_SECURE=$2 ${3:+DT_JOB_SECRET=$3} \
        timeout 60 "$B/dtbench" -b 4 -e 4 -n 1 -w 1 -W 0 > "$T/r$1" 2>&1 &
}
start 0 auth s3cret; p0=$!
start 1 off s3cret; p1=$!
wait $p0; rc0=$?; wait $p1; rc1=$?
test $rc0 -ne 0 && test $rc0 -ne 124 && test $rc1 -ne 0 && test $rc1 -ne 124
ok $? "ranks that seal differently are refused (exit $rc0, $rc1)"
ok_grep "$T/r0" "rank 1 \(.*\) runs with secure transport off, this rank with auth: every rank needs the same" \
    "rank 0 names rank 1 and both modes"
ok_grep "$T/r1" "rank 0 \(.*\) runs with secure transport auth, this rank with off" "and rank 1 names rank 0"
port=$(free_port)
start 0 encrypt; p0=$!
start 1 encrypt; p1=$!
wait $p0; rc0=$?; wait $p1; rc1=$?
test $rc0 -ne 0 && test $rc0 -ne 124 && test $rc1 -ne 0 && test $rc1 -ne 124
ok $? "sealing without a job secret is refused (exit $rc0, $rc1)"
ok_grep "$T/r0" "secure transport \(encrypt\) needs a job secret \(DT_JOB_SECRET or DT_JOB_SECRET_FILE" "saying what to set"
DT_SECURE=sometimes timeout 60 "$B/dtrun" -n 2 "$B/dtbench" -b 4 -e 4 -n 1 > "$T/bad" 2>&1
rc=$?
test $rc -ne 0 && test $rc -ne 124
ok $? "DT_SECURE=sometimes is refused (exit $rc)"
ok_grep "$T/bad" "secure_transport: expected off, auth or encrypt, got 'sometimes'" "naming the values"
timeout 60 "$B/dtrun" -n 2 "$B/dtrain" $run --secure-transport sometimes > "$T/bad" 2>&1
rc=$?
test $rc -ne 0 && test $rc -ne 124
ok $? "dtrain --secure-transport sometimes is refused (exit $rc)"
ok_grep "$T/bad" "secure_transport: expected off, auth or encrypt, got 'sometimes'" "naming the values"
if grep -q '^#define DT_HAVE_MPI 1' "$B/config.h" 2>/dev/null; then
    timeout 60 "$B/dtrun" -n 2 "$B/dtrain" $run --backend mpi --secure-transport encrypt > "$T/mpi" 2>&1
    rc=$?
    test $rc -ne 0 && test $rc -ne 124
    ok $? "--backend mpi with --secure-transport encrypt is refused (exit $rc)"
    ok_grep "$T/mpi" "seals the tcp backend's traffic only; the mpi backend's cannot be" "saying why"
else
    skip "MPI is not built in"; skip "MPI is not built in"
fi
done_testing
