#!/bin/sh
# auth_rdzv.sh: who may join a job, and floods that must not stop one (loopback only).
#  - dtrun's rendezvous: a stranger without the secret learns nothing; a client that has
#    the secret but sends run id '-' to a job with --run-id is refused; 70 silent
#    connections and 5,000 HELLOs a second (from 127.0.0.2-9) at node 0 do not shut
#    node 1 out or slow it down.
#  - a live 2-rank training job whose store port gets 1100 silent connections, 8 hostile
#    63 MiB requests, and whose rank 0 peer port gets 40 silent connections: the job
#    forms and ends normally, and rank 0 stays small.
#  - a rank whose master is not on loopback and that has no secret is refused before it
#    sends anything, saying how to set one; a secret file readable by others is refused.
#  - a 2-rank job whose store and rank 0 peer port each get 5,000 HELLOs a second (a
#    HELLO needs no secret) from 127.0.0.2-9 forms in well under a second, as without a
#    flood; 4 authenticated connections that stall in the middle of the mesh handshake
#    do not hold the mesh up.
. "$DT_SRCDIR/tests/tap.sh"
. "$DT_SRCDIR/tests/dtrun_lib.sh"
DTRUN="$DT_BUILDDIR/dtrun"
DTRAIN="$DT_BUILDDIR/dtrain"
command -v python3 > /dev/null || skip_all "needs python3"
tmp=$(mktemp -d) || exit 1
tok="authrdzv$$"
cleanup() { pids=$(pgrep -f "$tok"); [ -z "$pids" ] || kill -KILL $pids 2>/dev/null; }
trap 'cleanup; rm -rf "$tmp"' EXIT

# A client of dtrun's rendezvous in Python (hmac + hashlib): it proves SECRET (if given),
# sends LINE, and prints what node 0 answered within 5 s.
cat > "$tmp/client.py" <<'EOF'
import hashlib, hmac, os, socket, struct, sys, time
port, secret, line = int(sys.argv[1]), sys.argv[2], sys.argv[3]
s = socket.create_connection(("127.0.0.1", port), timeout=5)
nc = os.urandom(32)
s.sendall(struct.pack("<4I", 0x55415444, 1, 3, 1 if secret else 0) + nc)
def recv(n):
    b = b""
    while len(b) < n:
        c = s.recv(n - len(b))
        if not c: return b
        b += c
    return b
try:
    ch = recv(76)
    if len(ch) == 76 and secret:
        ns = ch[12:44]
        job = b"dtrun-rendezvous"
        msg = b"dtrain-auth-1" + b"C" + struct.pack("<II", 3, len(job)) + job + nc + ns
        s.sendall(struct.pack("<I", 0x52415444) + hmac.new(secret.encode(), msg, hashlib.sha256).digest())
        recv(8)
    s.sendall(line.encode() + b"\n")
    out = b""
    end = time.time() + 5
    while time.time() < end:
        c = s.recv(4096)
        if not c: break
        out += c
    print(out.decode(errors="replace"))
except OSError as e:
    print("closed:", e)
EOF
# Hold N silent connections to PORT ("hello": each says HELLO and stalls), write READY,
# wait. A connection counts once made: the server may drop one while its bytes still go
# out (it should: it is unauthenticated), which ends that send, not the flood.
#   flood.py PORT RATE hello=PURPOSE READY SECONDS SOURCES: RATE new connections a second
#   for at most SECONDS, from SOURCES loopback addresses (127.0.0.2, ...), each saying a
#   valid HELLO for PURPOSE (1 store, 2 peer port, 3 dtrun) and never the proof, held
#   until the server closes it; READY gets the number of HELLOs sent after 0.5 s. On its
#   way out (SECONDS, or a SIGTERM) it prints what it did.
cat > "$tmp/flood.py" <<'EOF'
import collections, errno, os, resource, select, signal, socket, struct, sys, time
port, n, mode, ready = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
purpose = 1
if mode.startswith("hello="):
    mode, purpose = "hello", int(mode[6:])
if len(sys.argv) > 5:
    rate, seconds, sources = n, float(sys.argv[5]), int(sys.argv[6])
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard)); soft = hard
    except (ValueError, OSError):
        pass
    cap = min(soft - 100, 30000)
    hello = struct.pack("<4I", 0x55415444, 1, purpose, 1) + bytes(32)
    ep = select.epoll()
    live, order = {}, collections.deque()   # fd -> [socket, time made]; the sockets, oldest first
    t0 = time.time(); made = sent = closed = 0; wrote_ready = False
    def close(s):
        ep.unregister(s.fileno()); live.pop(s.fileno()); s.close()
    try:
        while time.time() - t0 < seconds:
            now = time.time()
            due = min(int((now - t0) * rate) + 1, made + 500)
            while made < due:
                while order and (order[0].fileno() < 0 or len(live) >= cap):
                    s = order.popleft()      # out of descriptors: the oldest goes
                    if s.fileno() >= 0: close(s)
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                s.setblocking(False)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                s.setsockopt(socket.IPPROTO_IP, 24, 1)    # IP_BIND_ADDRESS_NO_PORT
                s.bind(("127.0.0.%d" % (2 + made % sources), 0))
                made += 1
                e = s.connect_ex(("127.0.0.1", port))
                if e not in (0, errno.EINPROGRESS):
                    s.close(); continue
                live[s.fileno()] = [s, now]
                order.append(s)
                ep.register(s.fileno(), select.EPOLLOUT)
            for fd, ev in ep.poll(0.001):
                if fd not in live: continue
                s = live[fd][0]
                if ev & select.EPOLLOUT:
                    if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) != 0: close(s); continue
                    try: s.send(hello); sent += 1
                    except OSError: close(s); continue
                    ep.modify(fd, select.EPOLLIN | select.EPOLLRDHUP)
                    continue
                try: b = s.recv(4096)       # the challenge: read, never answered
                except OSError: b = b""
                if not b or ev & (select.EPOLLRDHUP | select.EPOLLHUP | select.EPOLLERR):
                    close(s); closed += 1
            while order and (order[0].fileno() < 0 or live[order[0].fileno()][1] < now - 10):
                s = order.popleft()
                if s.fileno() >= 0: close(s)
            if not wrote_ready and now - t0 >= 0.5:
                open(ready + ".tmp", "w").write(str(sent)); os.rename(ready + ".tmp", ready); wrote_ready = True
    finally:
        el = time.time() - t0
        print("%d connections tried, %d HELLOs sent in %.1f s (%.0f a second), %d closed by the server"
              % (made, sent, el, sent / el, closed), flush=True)
    sys.exit(0)
socks = []
for i in range(n):
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
    except OSError:
        continue
    socks.append(s)
    try:
        if mode == "hello": s.sendall(struct.pack("<4I", 0x55415444, 1, purpose, 1) + bytes(32))
        if mode == "big": s.sendall(struct.pack("<7I", 0x54535444, 1, 2, 0, 0, 63 << 20, 0) + bytes(1 << 20))
    except OSError:
        pass
open(ready, "w").write(str(len(socks)))
time.sleep(60)
EOF
# wait (at most 30 s) until file $1 holds a count above 0
wait_file() { i=0; while [ ! -s "$1" ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done; [ "$(cat "$1" 2>/dev/null)" -gt 0 ] 2>/dev/null; }
# wait until something listens on 127.0.0.1:$1 (at most 30 s)
wait_port() {
    python3 - "$1" <<'EOF'
import socket, sys, time
end = time.time() + 30
while time.time() < end:
    try:
        socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=1).close(); sys.exit(0)
    except OSError:
        time.sleep(0.05)
sys.exit(1)
EOF
}

# seconds since $1 (a `date +%s.%N`), and whether $1 < $2, for timings
since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }'; }
below() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a < b) }'; }
# the floods of HELLOs come from 127.0.0.2-9: loopback, where Linux routes all of 127/8
lo8=1
python3 -c 'import socket; socket.socket().bind(("127.0.0.9", 0))' 2>/dev/null || lo8=
# a listening port of pid $1 other than $2 (its peer port; empty if none within 30 s)
other_port() {
    pp= ; i=0
    while [ -z "$pp" ] && [ $i -lt 300 ]; do
        pp=$(ss -Hltnp 2>/dev/null | grep "pid=$1," | awk '{print $4}' | sed 's/.*://' | grep -v "^$2\$" | head -1)
        [ -n "$pp" ] || { sleep 0.1; i=$((i + 1)); }
    done
    echo "$pp"
}

# 1. dtrun's rendezvous
port=$(free_port)
(DT_JOB_SECRET=s3cret exec "$DTRUN" -n 1 --nnodes 2 --master-port "$port" --run-id secret-123 --rdzv-timeout 30 \
    sh -c 'echo up' "$tok" > "$tmp/n0.out" 2> "$tmp/n0.err") & n0=$!
wait_port "$port"; ok $? "node 0 listens"
python3 "$tmp/client.py" "$port" "" "HELLO 2 1 2 1 - evilhost 0" > "$tmp/stranger"
! grep -q "LAYOUT\|START" "$tmp/stranger"; ok $? "a client without the secret learns nothing (no LAYOUT, no port)"
python3 "$tmp/client.py" "$port" "s3cret" "HELLO 2 1 2 1 - evilhost 0" > "$tmp/dash"
grep -q "^REFUSE 2 the nodes disagree about --run-id: node 1 (evilhost.*) gives none, node 0 (.*) says 'secret-123'" "$tmp/dash"
ok $? "a client with the secret but run id '-' is refused, the run id named"
! grep -q "LAYOUT\|START" "$tmp/dash"; ok $? "... and learns no job id or port"
python3 "$tmp/flood.py" "$port" 70 silent "$tmp/flood1" & f1=$!
wait_file "$tmp/flood1"; ok $? "70 silent connections to node 0 (held: $(cat "$tmp/flood1"))"
f1h=
if [ -n "$lo8" ]; then
    python3 "$tmp/flood.py" "$port" 5000 hello=3 "$tmp/flood1h" 30 8 > "$tmp/flood1h.log" & f1h=$!
    wait_file "$tmp/flood1h"; ok $? "and HELLOs at 5,000 a second from 127.0.0.2-9 ($(cat "$tmp/flood1h") in 0.5 s)"
else
    skip "cannot bind 127.0.0.9 for a flood from several addresses"
fi
t=$(date +%s.%N)
(DT_JOB_SECRET=s3cret exec "$DTRUN" -n 1 --nnodes 2 --node-rank 1 --master-port "$port" --run-id secret-123 \
    sh -c 'echo up' "$tok" > "$tmp/n1.out" 2> "$tmp/n1.err") & n1=$!
wait_for $n1 40; rc1=$?; took=$(since "$t"); wait_for $n0 40; rc0=$?
kill $f1 $f1h 2>/dev/null; wait $f1 $f1h 2>/dev/null
[ -z "$f1h" ] || diag "flood of node 0: $(cat "$tmp/flood1h.log")"
test $rc0 -eq 0 && test $rc1 -eq 0; ok $? "the real node 1 still joins and the job runs (exit $rc0, $rc1)"
grep -q ':up$' "$tmp/n1.out"; ok $? "node 1's rank ran"
below "$took" 5; ok $? "... and node 1 was done within 5 s ($took s)"

# 1b. an elastic job (--nnodes 1:2) grows while its rendezvous is flooded with HELLOs: a
# rank answers the elastic probe (worlds 1 and 2), waits on 1 rank until asked to stop
# (SIGTERM: exit 75, as dtrain does after its checkpoint), and on 2 ranks says so and ends
cat > "$tmp/el.sh" <<'EOF2'
if [ -n "$DT_ELASTIC_PROBE" ]; then echo "dtrain-elastic: sizes=1,2 resume=auto checkpoint-dir=/nonexistent"; exit 0; fi
if [ "$WORLD_SIZE" = 2 ]; then echo "up2 $RANK"; exit 0; fi
echo up1; trap 'exit 75' TERM
i=0; while [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done; exit 3
EOF2
port=$(free_port)
(DT_JOB_SECRET=s3cret exec "$DTRUN" -n 1 --nnodes 1:2 --master-port "$port" --rdzv-last-call 0 --grace 20 \
    sh "$tmp/el.sh" "$tok" > "$tmp/e0.out" 2> "$tmp/e0.err") & e0=$!
i=0; while ! grep -q ':up1$' "$tmp/e0.out" 2>/dev/null && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
grep -q ':up1$' "$tmp/e0.out"; ok $? "an elastic job runs on node 0 alone"
fe=
if [ -n "$lo8" ]; then
    rm -f "$tmp/flood5"
    python3 "$tmp/flood.py" "$port" 5000 hello=3 "$tmp/flood5" 30 8 > "$tmp/flood5.log" & fe=$!
    wait_file "$tmp/flood5"; ok $? "HELLOs at 5,000 a second from 127.0.0.2-9 at its rendezvous ($(cat "$tmp/flood5") in 0.5 s)"
else
    skip "cannot bind 127.0.0.9 for a flood from several addresses"
fi
t=$(date +%s.%N)
(DT_JOB_SECRET=s3cret exec "$DTRUN" -n 1 --nnodes 1:2 --node-rank 1 --master-port "$port" \
    sh "$tmp/el.sh" "$tok" > "$tmp/e1.out" 2> "$tmp/e1.err") & e1=$!
wait_for $e0 60; rc0=$?; took=$(since "$t"); wait_for $e1 60; rc1=$?
[ -z "$fe" ] || { kill $fe 2>/dev/null; wait $fe 2>/dev/null; diag "flood of the elastic node 0: $(cat "$tmp/flood5.log")"; }
test $rc0 -eq 0 && test $rc1 -eq 0; ok $? "under the flood node 1 joins, the world grows to 2 and the job ends (exit $rc0, $rc1)"
grep -q ':up2 1$' "$tmp/e1.out" && grep -q ':up2 0$' "$tmp/e0.out"; ok $? "both ranks ran on the world of 2"
ok_grep "$tmp/e0.err" "^dtrun: membership: node 1 \(.*\) joined; world 1 -> 2 ranks on 2 nodes; " "node 0 says the change"
below "$took" 10; ok $? "... within 10 s of node 1's start ($took s)"

# 2. a live training job under floods of its store and peer ports
port=$(free_port)
train() {   # train RANK: one rank of a 2-rank job on $port, in the background
    (RANK=$1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port DT_JOB_SECRET=job-secret DT_TIMEOUT=60 \
     exec "$DTRAIN" train --data synthetic:512,1,8,8,4 --model "flatten linear(16) relu linear(4)" --epochs 2 --batch 32 --micro-batches 2 \
     --quiet --save "$tmp/$tok-w$1.st" > "$tmp/t$1.out" 2> "$tmp/t$1.err") &
}
train 0; t0=$!
wait_port "$port"; ok $? "rank 0 serves the store"
python3 "$tmp/flood.py" "$port" 1100 silent "$tmp/flood2" & f2=$!
python3 "$tmp/flood.py" "$port" 8 big "$tmp/flood3" & f3=$!
wait_file "$tmp/flood2" && wait_file "$tmp/flood3"
ok $? "1100 silent connections and 8 requests of 63 MiB at the store (held: $(cat "$tmp/flood2"), $(cat "$tmp/flood3"))"
# rank 0's peer port: its other listening socket
pport=$(other_port $t0 "$port")
if [ -n "$pport" ]; then
    python3 "$tmp/flood.py" "$pport" 40 silent "$tmp/flood4" & f4=$!
    wait_file "$tmp/flood4"; ok $? "40 silent connections at rank 0's peer port $pport"
else
    skip "cannot find rank 0's peer port (ss)"; f4=
fi
rss=$(awk '/VmRSS/ {print $2}' /proc/$t0/status 2>/dev/null)
train 1; t1=$!
wait_for $t0 120; rc0=$?; wait_for $t1 120; rc1=$?
kill $f2 $f3 $f4 2>/dev/null; wait $f2 $f3 $f4 2>/dev/null
test $rc0 -eq 0 && test $rc1 -eq 0; ok $? "the job forms and finishes normally under the floods (exit $rc0, $rc1)"
"$DTRAIN" train --data synthetic:512,1,8,8,4 --model "flatten linear(16) relu linear(4)" --epochs 2 --batch 32 --micro-batches 2 \
    --quiet --save "$tmp/ref.st" > /dev/null 2>&1
cmp -s "$tmp/$tok-w0.st" "$tmp/ref.st"; ok $? "its weights are bitwise those of a 1-process run"
test -n "$rss" && test "$rss" -lt 200000; ok $? "rank 0 stayed small during the floods (${rss:-?} KiB resident)"

# 3. beyond loopback without a secret: refused before any traffic, saying how
RANK=1 WORLD_SIZE=2 MASTER_ADDR=10.231.0.9 MASTER_PORT=29500 DT_TIMEOUT=5 \
    "$DTRAIN" train --data synthetic:64,1,4,4,2 --model "flatten linear(2)" --epochs 1 --quiet > "$tmp/far" 2>&1
rc=$?
test $rc -eq 2; ok $? "a rank whose master is not on loopback, without a secret: exit 2 (got $rc)"
ok_grep "$tmp/far" "needs a job secret: set DT_JOB_SECRET .* or DT_JOB_SECRET_FILE" "the error says how to set one"
printf 'abc\n' > "$tmp/secret"; chmod 644 "$tmp/secret"
RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 DT_JOB_SECRET_FILE="$tmp/secret" DT_TIMEOUT=5 \
    "$DTRAIN" train --data synthetic:64,1,4,4,2 --model "flatten linear(2)" --epochs 1 --quiet > "$tmp/perm" 2>&1
rc=$?
test $rc -eq 2; ok $? "a secret file readable by others: exit 2 (got $rc)"
ok_grep "$tmp/perm" "DT_JOB_SECRET_FILE=.* is readable by others \(mode 644\): make it private with chmod 600" "the error says what to do"
# other secret files refused: empty, a symbolic link, missing
: > "$tmp/empty"; chmod 600 "$tmp/empty"
printf 'abc\n' > "$tmp/real"; chmod 600 "$tmp/real"; ln -s "$tmp/real" "$tmp/link"
for f in empty:"is empty" link:"a symbolic link is not accepted" missing:"No such file"; do
    name=${f%%:*}; want=${f#*:}
    RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 DT_JOB_SECRET_FILE="$tmp/$name" DT_TIMEOUT=5 \
        "$DTRAIN" train --data synthetic:64,1,4,4,2 --model "flatten linear(2)" --epochs 1 --quiet > "$tmp/sf" 2>&1
    rc=$?
    test $rc -eq 2 && grep -q "DT_JOB_SECRET_FILE=.*$want" "$tmp/sf"
    ok $? "a secret file that is $name: exit 2 saying '$want' (got $rc)"
done

# 4. a flood of HELLOs (they need no secret) at 5,000 new connections a second from 8
#    loopback addresses at the store and at rank 0's peer port: a 2-rank job still forms,
#    in a fraction of a second, well within DT_TIMEOUT=20
PROG="$DT_BUILDDIR/tests/coll_prog"
# rank R: one rank of a 2-rank coll_prog job on $port (init, barrier, end), in the background;
# join: rank 1, timed (in $took, seconds), its status in $rc1, then rank 0's ($r0) in $rc0
rank() {
    (RANK=$1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port DT_JOB_SECRET=job-secret DT_JOB_ID=$tok \
     DT_TIMEOUT=20 exec "$PROG" --mode init --dump "$tmp/$tok-unused" > "$tmp/r$1.out" 2>&1) &
}
join() {
    t=$(date +%s.%N)
    RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port DT_JOB_SECRET=job-secret DT_JOB_ID=$tok \
        DT_TIMEOUT=20 timeout 40 "$PROG" --mode init --dump "$tmp/$tok-unused" > "$tmp/r1.out" 2>&1
    rc1=$?; took=$(since "$t")
    wait_for $r0 40; rc0=$?
}
if [ ! -x "$PROG" ]; then
    skip "tests/coll_prog is not built"
elif [ -z "$lo8" ]; then
    skip "cannot bind 127.0.0.9 for a flood from several addresses"
else
    port=$(free_port)
    rank 0; r0=$!
    wait_port "$port"
    join; calm=$took
    test $rc0 -eq 0 && test $rc1 -eq 0; ok $? "without a flood, a 2-rank job forms in $calm s (exit $rc0, $rc1)"
    port=$(free_port)
    rank 0; r0=$!
    wait_port "$port"; pport=$(other_port $r0 "$port")
    python3 "$tmp/flood.py" "$port" 5000 hello=1 "$tmp/flood5" 30 8 > "$tmp/flood5.log" & f5=$!
    f6=
    [ -z "$pport" ] || { python3 "$tmp/flood.py" "$pport" 5000 hello=2 "$tmp/flood6" 30 8 > "$tmp/flood6.log" & f6=$!; }
    wait_file "$tmp/flood5" && { [ -z "$f6" ] || wait_file "$tmp/flood6"; }; rc=$?
    where="the store ($(cat "$tmp/flood5") sent in 0.5 s)"
    [ -z "$f6" ] || where="$where and at rank 0's peer port ($(cat "$tmp/flood6") sent)"
    ok $rc "HELLOs at 5,000 a second at $where"
    join
    kill $f5 $f6 2>/dev/null; wait $f5 $f6 2>/dev/null
    diag "flood of the store: $(cat "$tmp/flood5.log")"
    [ -z "$f6" ] || diag "flood of the peer port: $(cat "$tmp/flood6.log")"
    test $rc0 -eq 0 && test $rc1 -eq 0; ok $? "under the floods the job forms and ends (exit $rc0, $rc1)"
    [ $rc0 -eq 0 ] && [ $rc1 -eq 0 ] || sed 's/^/#   /' "$tmp/r0.out" "$tmp/r1.out" | tail -6
    below "$took" 5; ok $? "... in $took s (DT_TIMEOUT=20; without the flood $calm s)"
fi

# 5. authenticated connections that send part of a mesh handshake and stall, at rank 0's
#    peer port before rank 1 connects: read side by side with rank 1's, they hold up
#    nothing (read one after the other, each held the mesh up for 2 s)
cat > "$tmp/partial.py" <<'EOF'
import hashlib, hmac, os, socket, struct, sys, time
port, n, secret, job, ready = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3].encode(), sys.argv[4].encode(), sys.argv[5]
conns = []
for i in range(n):
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    nc = os.urandom(32)
    s.sendall(struct.pack("<4I", 0x55415444, 1, 2, 1) + nc)
    conns.append((s, nc))
open(ready, "w").write(str(len(conns)))
def recv(s, k):
    b = b""
    while len(b) < k:
        c = s.recv(k - len(b))
        if not c: raise OSError("closed")
        b += c
    return b
for s, nc in conns:   # answered once rank 0 builds its mesh
    try:
        ns = recv(s, 76)[12:44]
        msg = b"dtrain-auth-1" + b"C" + struct.pack("<II", 2, len(job)) + job + nc + ns
        s.sendall(struct.pack("<I", 0x52415444) + hmac.new(secret, msg, hashlib.sha256).digest())
        recv(s, 8)
        s.sendall(struct.pack("<I", 0x53484454))   # "DTHS", and no more
    except OSError:
        pass
time.sleep(30)
EOF
if [ ! -x "$PROG" ]; then
    skip "tests/coll_prog is not built"
else
    port=$(free_port)
    rank 0; r0=$!
    wait_port "$port"; pport=$(other_port $r0 "$port")
    if [ -z "$pport" ]; then
        skip "cannot find rank 0's peer port (ss)"
    else
        python3 "$tmp/partial.py" "$pport" 4 job-secret "$tok" "$tmp/partial" & f7=$!
        wait_file "$tmp/partial"
        join
        kill $f7 2>/dev/null; wait $f7 2>/dev/null
        test $rc0 -eq 0 && test $rc1 -eq 0 && below "$took" 1.5
        ok $? "4 stalled partial handshakes at rank 0's peer port: the job forms in $took s (exit $rc0, $rc1)"
    fi
fi
done_testing
