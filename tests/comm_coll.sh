#!/bin/bash
# comm_coll.sh: every collective x type x operator (coll_prog --mode all) over the tcp
# backend at 2, 3 and 4 ranks (oversubscribed on small machines), through shared memory
# and over pure TCP (DT_SHM=0), with each init method: env://, tcp://host:port and
# file:///path (with a stale rendezvous file of another job already in place).
. "$DT_SRCDIR/tests/tap.sh"
. "$DT_SRCDIR/tests/comm_lib.sh"

run_all() {   # run_all N "description" ARGS...
    n=$1; what=$2; shift 2
    launch $n --mode all "$@"
    st=$?
    all_passed || st=1
    ok $st "$what"
}

LAUNCH_ENV= run_all 2 "2 ranks, env://, shared memory, with a 64 MiB all_reduce" --big
LAUNCH_ENV="DT_SHM=0" run_all 2 "2 ranks, env://, TCP only, with a 64 MiB all_reduce" --big
LAUNCH_ENV="DT_CMA=0" run_all 2 "2 ranks, env://, shared memory without cross-memory reads, with a 64 MiB all_reduce" --big
LAUNCH_ENV="DT_CMA=1" run_all 2 "2 ranks, env://, cross-memory reads for large messages, with a 64 MiB all_reduce" --big
LAUNCH_ENV="DT_CMA=1" run_all 3 "3 ranks (rings), cross-memory reads for large messages, with a 64 MiB all_reduce" --big
LAUNCH_ENV= run_all 3 "3 ranks (rings), shared memory"
LAUNCH_ENV="DT_SHM=0" run_all 3 "3 ranks (rings), TCP only"
LAUNCH_ENV= run_all 4 "4 ranks, shared memory"
LAUNCH_ENV="DT_SHM=0" run_all 4 "4 ranks, TCP only"

# tcp://host:port: the address comes from the URL, not from MASTER_*
port=$(free_port)
NO_MASTER=1 LAUNCH_ENV= run_all 2 "2 ranks, tcp://127.0.0.1:$port" --init "tcp://127.0.0.1:$port"

# file://: a stale file from another job is already there (this user's, mode 0600, as
# rank 0 writes it); rank 1 starts first
rdv="$TMP/rendezvous"
echo "dtrain-store 2 otherjob 127.0.0.1 9 deadbeef -" > "$rdv"; chmod 600 "$rdv"
port=$(free_port)
start_rank 1 3 $port --mode all --init "file://$rdv"; p1=$!
start_rank 2 3 $port --mode all --init "file://$rdv"; p2=$!
sleep 0.3
start_rank 0 3 $port --mode all --init "file://$rdv"; p0=$!
st=0
for p in $p0 $p1 $p2; do wait $p || st=1; done
all_passed || st=1
ok $st "3 ranks, file:// (a stale file of another job is ignored)"
[ -e "$rdv" ]; ok $((1 - $?)) "rank 0 removes the rendezvous file at the end"

LAUNCH_ENV="DT_SHM=0"
rm -f "$rdv"
run_all 2 "2 ranks, file://, TCP only" --init "file://$rdv"
# interface selection
LAUNCH_ENV="DT_SOCKET_IFNAME=lo DT_SHM=0" launch 2 --mode init
ok $? "DT_SOCKET_IFNAME=lo"
LAUNCH_ENV="DT_SOCKET_IFNAME=nosuchif0" launch 2 --mode init
st=$?
[ $st -ne 0 ] && grep -q "rank 1: DT_SOCKET_IFNAME=nosuchif0: no up IPv4 interface matches" "$TMP/out.1"
ok $? "an unknown DT_SOCKET_IFNAME is an error naming the variable"
done_testing
