#!/bin/bash
# comm_errors.sh: the tcp backend fails loudly and names the culprit (docs/DESIGN.md rule 3):
# mismatched collectives, a rank that never calls (timeout), a rank killed mid-collective,
# junk bytes on the store port and on a peer port, two processes claiming one rank, a
# wrong world size, a foreign job id, an unknown backend, a malformed init URL and a
# NULL buffer. Every message must start with the rank that reports it.
. "$DT_SRCDIR/tests/tap.sh"
. "$DT_SRCDIR/tests/comm_lib.sh"

# mismatch: rank 0 calls all_reduce where rank 1 calls broadcast
launch 2 --mode mismatch
ok $((1 - $?)) "mismatched collectives fail"
ok_grep "$TMP/out.1" "rank 1: collective #2 mismatch: this rank called broadcast \(f32, 100 elems, root 0\), rank 0 called all_reduce \(f32, 100 elems, sum\)" \
    "the mismatch names both calls (reported through dt_work_wait)"

# timeout: rank 1 never calls
start=$(date +%s)
LAUNCH_ENV="DT_TIMEOUT=2" launch 2 --mode timeout
el=$(($(date +%s) - start))
ok_grep "$TMP/out.0" "rank 0: timed out after 2 s in collective #1 all_reduce \(f32, 10 elems, sum\) waiting for rank 1 \(" \
    "a rank that never calls: timeout naming the collective and the rank"
[ $el -lt 10 ]; ok $? "and it came in time (${el}s)"

# three ranks: the waiting ones find out together which rank never came
LAUNCH_ENV="DT_TIMEOUT=2" launch 3 --mode timeout
ok_grep "$TMP/out.2" "rank 2: timed out after 2 s in collective #1 .*; rank 1 \([^)]*:pid [0-9]+\) never joined it, rank\(s\) 0,2 waiting" \
    "3 ranks: the timeout names the rank that never joined and the ranks waiting"

# the store's host itself hangs (stopped): the others still report within the timeout,
# not after a fixed 30 s of waiting on the store
port=$(free_port)
LAUNCH_ENV="DT_TIMEOUT=2" start_rank 0 2 $port --mode hang0; p0=$!
start=$(date +%s)
LAUNCH_ENV="DT_TIMEOUT=2" start_rank 1 2 $port --mode hang0; p1=$!
wait $p1
el=$(($(date +%s) - start))
pkill -KILL -P $p0 2>/dev/null; kill -KILL $p0 2>/dev/null; wait $p0 2>/dev/null   # the stopped rank under timeout(1)
ok_grep "$TMP/out.1" "rank 1: timed out after 2 s in collective #1 all_reduce \(f32, 10 elems, sum\) waiting for rank 0" \
    "a stopped store host: the timeout names it"
[ $el -lt 12 ]; ok $? "and it came within the timeout and the diagnosis window (${el}s, not 30 s more)"

# the per-communicator setter overrides the environment
LAUNCH_ENV="DT_TIMEOUT=30" launch 2 --mode timeout --timeout 1
ok_grep "$TMP/out.0" "rank 0: timed out after 1 s in collective #1 all_reduce" "dt_comm_set_timeout applies to later calls"

# a rank killed mid-collective, over shared memory (also with every large message read
# from the peer's memory) and over TCP
for shm in 1 1cma 0; do
    cma=; [ $shm = 1cma ] && { shm=1; cma="DT_CMA=1"; }
    port=$(free_port)
    LAUNCH_ENV="DT_SHM=$shm $cma" start_rank 0 2 $port --mode loop; p0=$!
    env RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port DT_JOB_ID=$JOB DT_SHM=$shm $cma \
        "$PROG" --mode loop --iters 100000 > "$TMP/victim" 2>&1 &
    p1=$!
    for i in $(seq 50); do grep -q looping "$TMP/out.0" && break; sleep 0.1; done
    sleep 0.3
    kill -9 $p1
    t0=$(date +%s)
    wait $p0
    st=$?
    wait $p1 2>/dev/null
    el=$(($(date +%s) - t0))
    [ $st -eq 1 ] && [ $el -le 5 ]; ok $? "DT_SHM=$shm${cma:+ $cma}: a SIGKILLed peer ends the survivor within seconds (${el}s, exit $st)"
    ok_grep "$TMP/out.0" "rank 0: rank 1 \([^)]*:pid $p1\) disconnected during collective #[0-9]+ all_reduce \(f32, 2097152 elems, sum\)" \
        "DT_SHM=$shm${cma:+ $cma}: the error names the dead rank, its host and pid, and the collective"
done

# junk on the store port and on rank 0's peer port while rank 1 is not there yet
port=$(free_port)
start_rank 0 2 $port --mode init; p0=$!
sleep 0.5
ports=$(ss -ltnpH 2>/dev/null | grep "pid=$(pgrep -P $p0 coll_prog | head -1)," | sed -E 's/.*:([0-9]+) .*/\1/' | sort -u)
[ -z "$ports" ] && ports=$port
njunk=0
for pt in $ports; do
    # HTTP-ish text and binary noise, then a request that claims a 4 GiB value
    if python3 - $pt <<'PY' 2>/dev/null; then njunk=$((njunk + 1)); fi
import socket, struct, sys
port = int(sys.argv[1])
s = socket.create_connection(("127.0.0.1", port))
try:
    s.sendall(b"GET / HTTP/1.0\r\n\r\n\x00\xff\xfe garbage")
except OSError:
    pass
s.close()
s = socket.create_connection(("127.0.0.1", port))
s.settimeout(2)
try:
    s.sendall(struct.pack("<7I", 0x54535444, 1, 2, 0, 0, 0xFFFFFFFF, 0))
    s.recv(100)
except OSError:
    pass
s.close()
PY
done
if command -v ss > /dev/null; then
    [ $njunk -ge 2 ]; ok $? "junk written to the store port and the peer port ($njunk ports)"
else
    skip "ss is not installed: junk went to the store port only"
fi
start_rank 1 2 $port --mode init; p1=$!
wait $p0; s0=$?
wait $p1; s1=$?
[ $s0 -eq 0 ] && [ $s1 -eq 0 ]; ok $? "the job still forms and runs after the junk"

# a second process claiming an existing rank
port=$(free_port)
start_rank 0 2 $port --mode loop --iters 200; p0=$!
start_rank 1 2 $port --mode loop --iters 200; p1=$!
for i in $(seq 50); do grep -q looping "$TMP/out.0" && break; sleep 0.1; done
mv "$TMP/out.1" "$TMP/first.1"
env RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port DT_JOB_ID=$JOB DT_TIMEOUT=5 \
    timeout 30 "$PROG" --mode init > "$TMP/dup" 2>&1
st=$?
wait $p0; wait $p1
[ $st -eq 2 ]; ok $? "a second rank 1 is refused (exit $st)"
ok_grep "$TMP/dup" "rank 1: rank 1 is claimed twice: by [^ ]+:[0-9]+ and by this process" "the error names both claimants"

# wrong world size
port=$(free_port)
LAUNCH_ENV="DT_TIMEOUT=3" start_rank 0 2 $port --mode init; p0=$!
env RANK=1 WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port DT_JOB_ID=$JOB DT_TIMEOUT=3 \
    timeout 30 "$PROG" --mode init > "$TMP/ws" 2>&1
st=$?
wait $p0; s0=$?
[ $st -ne 0 ] && [ $s0 -ne 0 ]; ok $? "wrong world size: both fail"
ok_grep "$TMP/ws" "rank 1: world size mismatch: this process has WORLD_SIZE=3, rank 0 has 2" "the error names both sizes"
ok_grep "$TMP/out.0" "rank 0: timed out after 3 s waiting for rank\(s\) 1 to join" "rank 0 names the rank that never joined"

# a foreign job id
port=$(free_port)
LAUNCH_ENV="DT_TIMEOUT=3" start_rank 0 2 $port --mode init; p0=$!
env RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port DT_JOB_ID=intruder DT_TIMEOUT=3 \
    timeout 30 "$PROG" --mode init > "$TMP/job" 2>&1
st=$?
wait $p0
[ $st -ne 0 ]; ok $? "a process of another job is refused"
ok_grep "$TMP/job" "rank 1: store at .*authentication: the server does not prove this job's secret and id \(it serves another job" "the error says the store serves another job"

# unknown backend, malformed init URLs, NULL buffer
LAUNCH_ENV="DT_BACKEND=carrier-pigeon" launch 1 --mode init
ok_grep "$TMP/out.0" "rank 0: unknown backend 'carrier-pigeon'" "unknown backend"
for url in "tcp://127.0.0.1" "tcp://127.0.0.1:99999" "http://x" "file://relative/path"; do
    launch 2 --mode init --init "$url"
    st=$?
    [ $st -ne 0 ] && grep -q "rank 1: malformed init method '$url'" "$TMP/out.1"
    ok $? "malformed init method '$url' is refused"
done
launch 2 --mode nullbuf
ok_grep "$TMP/out.1" "rank 1: all_reduce: send buffer is NULL with count 4" "a NULL buffer is refused, naming the rank"
LAUNCH_ENV="DT_TIMEOUT=soon" launch 1 --mode init
ok_grep "$TMP/out.0" "rank 0: DT_TIMEOUT='soon': expected a positive number of seconds" "a malformed DT_TIMEOUT is refused"
# file:// with only a stale file of another job and no rank 0: a clear timeout
echo "dtrain-store 2 otherjob 127.0.0.1 9 deadbeef -" > "$TMP/stale"; chmod 600 "$TMP/stale"
env RANK=1 WORLD_SIZE=2 DT_JOB_ID=$JOB DT_TIMEOUT=1 timeout 30 "$PROG" --mode init --init "file://$TMP/stale" > "$TMP/fto" 2>&1
st=$?
[ $st -eq 1 ]; ok $? "file:// without a live store times out (exit $st)"
ok_grep "$TMP/fto" "rank 1: file://$TMP/stale: no store for job '$JOB' appeared before the timeout \(the file is from job 'otherjob'\)" \
    "the error says what the file held"
# ... and with a file of this job that does not parse (a port past 65535): the timeout says why
echo "dtrain-store 2 $JOB 127.0.0.1 70000 deadbeef -" > "$TMP/badport"; chmod 600 "$TMP/badport"
env RANK=1 WORLD_SIZE=2 DT_JOB_ID=$JOB DT_TIMEOUT=1 timeout 30 "$PROG" --mode init --init "file://$TMP/badport" > "$TMP/fbp" 2>&1
st=$?
[ $st -eq 1 ]; ok $? "file:// with a malformed rendezvous file times out (exit $st)"
ok_grep "$TMP/fbp" "appeared before the timeout \(rendezvous file: the store's port is not a number in 1..65535\)" \
    "the error says what is wrong with the file"
NO_MASTER=1 launch 2 --mode init
ok_grep "$TMP/out.0" "rank 0: init method env:// needs MASTER_ADDR and MASTER_PORT" "env:// without a master address"

# file:// refuses a rendezvous file that is not this user's with mode 0600, whatever it
# holds: here a line for this job, without a secret, naming a listener that records
# whether anyone connects. The rank must fail at once, naming the file, owner and mode.
python3 - "$TMP/lport" "$TMP/lconn" <<'PY' &
import socket, sys, time
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(8); s.settimeout(0.2)
open(sys.argv[1] + ".tmp", "w").write(str(s.getsockname()[1]))
import os; os.rename(sys.argv[1] + ".tmp", sys.argv[1])
end = time.time() + 60
while time.time() < end:
    try:
        c, _ = s.accept(); open(sys.argv[2], "a").write("connected\n"); c.close()
    except socket.timeout:
        pass
PY
lpid=$!
i=0; while [ ! -s "$TMP/lport" ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
lport=$(cat "$TMP/lport" 2>/dev/null)
# planted OWNER MODE: run rank 1 on a rendezvous file of that owner and mode (a symbolic
# link to a file of this user's when MODE is "link"); st: its exit status, el: seconds
planted() {
    rm -f "$TMP/planted" "$TMP/planted.real"
    if [ "$2" = link ]; then
        echo "dtrain-store 2 $JOB 127.0.0.1 $lport 1 -" > "$TMP/planted.real"; chmod 600 "$TMP/planted.real"
        ln -s "$TMP/planted.real" "$TMP/planted"
    else
        echo "dtrain-store 2 $JOB 127.0.0.1 $lport 1 -" > "$TMP/planted"; chown "$1" "$TMP/planted"; chmod "$2" "$TMP/planted"
    fi
    rm -f "$TMP/lconn"
    start=$(date +%s)
    env RANK=1 WORLD_SIZE=2 DT_JOB_ID=$JOB DT_TIMEOUT=5 timeout 30 "$PROG" --mode init --init "file://$TMP/planted" \
        > "$TMP/pl" 2>&1
    st=$?; el=$(($(date +%s) - start))
}
if [ -n "$lport" ] && [ "$(id -u)" = 0 ]; then
    planted 65534 600
    [ $st -ne 0 ] && [ $el -lt 4 ]; ok $? "a rendezvous file of user 65534 (mode 0600) is refused at once (exit $st, ${el}s)"
    ok_grep "$TMP/pl" "rank 1: file://$TMP/planted: the rendezvous file is another user's \(owner 65534[ )].*mode 0600\)" \
        "the error names the file, its owner and its mode"
    [ ! -e "$TMP/lconn" ]; ok $? "the rank did not connect to the store the file names"
else
    skip "another owner needs root (to chown) and the listener (port '${lport:-none}')"
    skip "another owner: the error names the file, its owner and its mode"
    skip "another owner: the rank did not connect"
fi
if [ -n "$lport" ]; then
    planted "$(id -u)" 644
    [ $st -ne 0 ] && [ $el -lt 4 ]; ok $? "this user's rendezvous file of mode 0644 is refused at once (exit $st, ${el}s)"
    ok_grep "$TMP/pl" "rank 1: file://$TMP/planted: the rendezvous file is readable or writable by others \(owner $(id -u)[ )].*mode 0644\)" \
        "the error names its owner and mode"
    [ ! -e "$TMP/lconn" ]; ok $? "the rank did not connect to the store the file names"
    planted - link
    [ $st -ne 0 ] && [ $el -lt 4 ]; ok $? "a symbolic link as the rendezvous file is refused at once (exit $st, ${el}s)"
    ok_grep "$TMP/pl" "file://$TMP/planted: the rendezvous file is a symbolic link" "the error says so"
    [ ! -e "$TMP/lconn" ]; ok $? "the rank did not connect to the store the link's target names"
else
    ok 1 "the listener for the planted rendezvous files did not start"
fi
kill $lpid 2>/dev/null; wait $lpid 2>/dev/null
done_testing
