#!/bin/sh
# auth_rdzv.sh: who may join a job, and floods that must not stop one (loopback only).
#  - dtrun's rendezvous: a stranger without the secret learns nothing; a client that has
#    the secret but sends run id '-' to a job with --run-id is refused; 70 silent
#    connections to node 0 do not shut node 1 out.
#  - a live 2-rank training job whose store port gets 1100 silent connections, 8 hostile
#    63 MiB requests, and whose rank 0 peer port gets 40 silent connections: the job
#    forms and ends normally, and rank 0 stays small.
#  - a rank whose master is not on loopback and that has no secret is refused before it
#    sends anything, saying how to set one; a secret file readable by others is refused.
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
# Hold N silent connections to PORT (HELLO-and-stall with "hello"), write READY, wait.
# A connection counts once made: the server may drop one while its bytes still go out
# (it should: it is unauthenticated), which ends that send, not the flood.
cat > "$tmp/flood.py" <<'EOF'
import socket, struct, sys, time
port, n, mode, ready = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
socks = []
for i in range(n):
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
    except OSError:
        continue
    socks.append(s)
    try:
        if mode == "hello": s.sendall(struct.pack("<4I", 0x55415444, 1, 1, 1) + bytes(32))
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

# 1. dtrun's rendezvous
port=$(free_port)
(DT_JOB_SECRET=s3cret exec "$DTRUN" -n 1 --nnodes 2 --master-port "$port" --run-id secret-123 --rdzv-timeout 30 \
    sh -c 'echo up' "$tok" > "$tmp/n0.out" 2> "$tmp/n0.err") & n0=$!
wait_port "$port"; ok $? "node 0 listens"
python3 "$tmp/client.py" "$port" "" "HELLO 1 1 2 1 - evilhost" > "$tmp/stranger"
! grep -q "LAYOUT\|START" "$tmp/stranger"; ok $? "a client without the secret learns nothing (no LAYOUT, no port)"
python3 "$tmp/client.py" "$port" "s3cret" "HELLO 1 1 2 1 - evilhost" > "$tmp/dash"
grep -q "^REFUSE 2 the nodes disagree about --run-id: node 1 (evilhost.*) gives none, node 0 (.*) says 'secret-123'" "$tmp/dash"
ok $? "a client with the secret but run id '-' is refused, the run id named"
! grep -q "LAYOUT\|START" "$tmp/dash"; ok $? "... and learns no job id or port"
python3 "$tmp/flood.py" "$port" 70 silent "$tmp/flood1" & f1=$!
wait_file "$tmp/flood1"; ok $? "70 silent connections to node 0 (held: $(cat "$tmp/flood1"))"
(DT_JOB_SECRET=s3cret exec "$DTRUN" -n 1 --nnodes 2 --node-rank 1 --master-port "$port" --run-id secret-123 \
    sh -c 'echo up' "$tok" > "$tmp/n1.out" 2> "$tmp/n1.err") & n1=$!
wait_for $n0 40; rc0=$?; wait_for $n1 40; rc1=$?
kill $f1 2>/dev/null; wait $f1 2>/dev/null
test $rc0 -eq 0 && test $rc1 -eq 0; ok $? "the real node 1 still joins and the job runs (exit $rc0, $rc1)"
grep -q ':up$' "$tmp/n1.out"; ok $? "node 1's rank ran"

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
pport=
i=0
while [ -z "$pport" ] && [ $i -lt 300 ]; do
    pport=$(ss -Hltnp 2>/dev/null | grep "pid=$t0," | awk '{print $4}' | sed 's/.*://' | grep -v "^$port\$" | head -1)
    [ -n "$pport" ] || { sleep 0.1; i=$((i + 1)); }
done
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
done_testing
