#!/bin/sh
# trace.sh: dtrain train --trace writes one Chrome trace-event file for every rank:
#   valid JSON with a process per rank and named threads (main, comm, loader); on each
#   rank the step's phases (data wait, forward and backward per micro-batch, gradient
#   sums, optimizer) for exactly the steps --trace-steps names, the collectives on the
#   communication thread, a memory counter; the ranks' clocks on one time line (every
#   all-reduce overlaps its partner on the other rank, within the stated error);
#   a 1-process run and a pipeline trace too; bad --trace and --trace-steps exit 2.
. "${DT_SRCDIR:-$(dirname "$0")/..}/tests/tap.sh"
D="$DT_BUILDDIR/dtrain"; R="$DT_BUILDDIR/dtrun"
[ -x "$D" ] && [ -x "$R" ] || skip_all "dtrain or dtrun not built"
command -v python3 > /dev/null || skip_all "python3 is needed to read the JSON"
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
A="--model mlp --batch 64 --micro-batches 4 --steps 5 --threads 1 --no-eval --quiet"

timeout 120 "$R" -n 2 "$D" train $A --trace "$T/t2.json" --trace-steps 2:3 > "$T/o2" 2>&1
ok $? "2 processes train with --trace --trace-steps 2:3"
cat > "$T/check.py" <<'PYEOF'
import json, sys
path, ranks, steps = sys.argv[1], int(sys.argv[2]), [int(s) for s in sys.argv[3].split(",")]
d = json.load(open(path))
ev = d["traceEvents"]
say = lambda k, v: print("%s %s" % (k, v))
names = {(e["pid"], e["tid"]): e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
procs = sorted(e["pid"] for e in ev if e["ph"] == "M" and e["name"] == "process_name")
say("device_threads", sum(1 for v in names.values() if v == "device"))
say("procs", ",".join(map(str, procs)))
X = [e for e in ev if e["ph"] == "X"]
say("durations_ok", int(all(e["dur"] >= 0 for e in X)))
for r in range(ranks):
    mine = [e for e in X if e["pid"] == r]
    main = [e for e in mine if names.get((r, e["tid"])) == "main"]
    got = sorted(int(e["args"]["detail"].split()[1]) for e in main if e["name"] == "step")
    say("steps%d" % r, ",".join(map(str, got)))
    say("phases%d" % r, int(all(any(e["name"] == n for e in main)
                                for n in ("data wait", "forward", "backward", "gradient sums", "optimizer"))))
    fw = [e for e in main if e["name"] == "forward"]
    say("forwards%d" % r, len(fw))
    comm = [e for e in mine if names.get((r, e["tid"])) == "comm" and e["name"] == "all_reduce"]
    say("comm_allreduce%d" % r, len(comm))
    say("memory%d" % r, sum(1 for e in ev if e["ph"] == "C" and e["pid"] == r and e["name"] == "memory MiB"))
    # by category too, the categories summing to the total at each step's end
    tot = {e["ts"]: e["args"]["value"] for e in ev if e["ph"] == "C" and e["pid"] == r and e["name"] == "memory MiB"}
    cats = {}
    for e in ev:
        if e["ph"] == "C" and e["pid"] == r and e["name"].startswith("memory MiB: "):
            cats.setdefault(e["ts"], {})[e["name"][12:]] = e["args"]["value"]
    say("memcats%d" % r, int(len(cats) == len(tot) > 0 and all(
        set(c) >= {"params", "grads", "optim", "acts"} and abs(sum(c.values()) - tot[ts]) <= 1e-3 * max(1.0, tot[ts])
        for ts, c in cats.items() if ts in tot)))
    # every phase inside its step's span, on this rank's time line
    spans = {int(e["args"]["detail"].split()[1]): e for e in main if e["name"] == "step"}
    inside = all(spans[int(e["args"]["detail"].split()[1])]["ts"] - 1 <= e["ts"] and
                 e["ts"] + e["dur"] <= spans[int(e["args"]["detail"].split()[1])]["ts"] +
                 spans[int(e["args"]["detail"].split()[1])]["dur"] + 1
                 for e in main if e["name"] in ("data wait", "gradient sums", "optimizer"))
    say("nested%d" % r, int(inside))
    # on every thread any two spans nest or are apart (no span ends inside another it began after)
    ok = True
    for tid in set(e["tid"] for e in mine):
        stack = []
        for e in sorted((e for e in mine if e["tid"] == tid), key=lambda e: (e["ts"], -e["dur"])):
            while stack and stack[-1] <= e["ts"] + 0.5:
                stack.pop()
            if stack and e["ts"] + e["dur"] > stack[-1] + 0.5:
                ok = False
            stack.append(e["ts"] + e["dur"])
    say("threads_nest%d" % r, int(ok))
    # every all-reduce of the communication thread (DDP's buckets) lies within a step
    steps_r = [e for e in main if e["name"] == "step"]
    within = all(any(s["ts"] - 1 <= c["ts"] and c["ts"] + c["dur"] <= s["ts"] + s["dur"] + 1 for s in steps_r)
                 for c in comm)
    say("buckets_in_steps%d" % r, int(within and len(comm) > 0))
    say("rate%d" % r, sum(1 for e in ev if e["ph"] == "C" and e["pid"] == r and e["name"].endswith("/s")))
    # a collective that waited names the peer it waited for longest, and waited no longer than it ran
    waits = [e for e in mine if names.get((r, e["tid"])) == "comm" and "waited_for" in e.get("args", {})]
    say("waits_count%d" % r, len(waits))
    say("waits_valid%d" % r, int(all(
        0 <= e["args"]["waited_for"] < ranks and e["args"]["waited_for"] != r and
        0 <= e["args"]["waited_ms"] * 1000 <= e["dur"] + 1 for e in waits)))
    say("waited_ms%d" % r, "%.3f" % sum(e["args"]["waited_ms"] for e in waits))
    say("waits_n%d" % r, "%d of %d, worst excess %.3f us" % (len(waits), len(comm), max(
        [e["args"]["waited_ms"] * 1000 - e["dur"] for e in waits] or [0.0])))
if ranks > 1:
    err = d["otherData"]["clock_error_us"] + 1.0
    a = sorted((e for e in X if e["pid"] == 0 and e["name"] == "all_reduce"), key=lambda e: e["ts"])
    b = sorted((e for e in X if e["pid"] == 1 and e["name"] == "all_reduce"), key=lambda e: e["ts"])
    overl = len(a) == len(b) and len(a) > 0 and all(
        x["ts"] <= y["ts"] + y["dur"] + err and y["ts"] <= x["ts"] + x["dur"] + err for x, y in zip(a, b))
    say("aligned", int(overl))
    say("clock_error_us", d["otherData"]["clock_error_us"])
PYEOF
py() { python3 "$T/check.py" "$@" > "$T/c.out" 2> "$T/c.err" || sed 's/^/#   /' "$T/c.err" | tail -3; }
val() { sed -n "s/^$1 //p" "$T/c.out"; }
py "$T/t2.json" 2 2,3
[ "$(val procs)" = "0,1" ]; ok $? "a process per rank, named (got '$(val procs)')"
[ "$(val durations_ok)" = 1 ]; ok $? "every span's duration is >= 0"
for r in 0 1; do
    [ "$(val steps$r)" = "2,3" ]; ok $? "rank $r: exactly steps 2 and 3 (got '$(val steps$r)')"
    [ "$(val phases$r)" = 1 ]; ok $? "rank $r: data wait, forward, backward, gradient sums and optimizer on the main thread"
    [ "$(val forwards$r)" = 4 ]; ok $? "rank $r: a forward per local micro-batch (2 steps x 2; got $(val forwards$r))"
    n=$(val comm_allreduce$r); [ "${n:-0}" -ge 2 ]; ok $? "rank $r: the gradient all-reduces on the comm thread ($n)"
    [ "$(val memory$r)" = 2 ]; ok $? "rank $r: a memory counter per step"
    [ "$(val memcats$r)" = 1 ]; ok $? "rank $r: memory counters by category, summing to the total"
    [ "$(val nested$r)" = 1 ]; ok $? "rank $r: each phase lies within its step"
    [ "$(val threads_nest$r)" = 1 ]; ok $? "rank $r: on every thread, spans nest or lie apart"
    [ "$(val buckets_in_steps$r)" = 1 ]; ok $? "rank $r: every bucket all-reduce lies within its step"
    [ "$(val rate$r)" = 2 ]; ok $? "rank $r: a samples/s counter per step"
    [ "$(val waits_valid$r)" = 1 ]; ok $? "rank $r: collectives that waited name another rank and wait within their span ($(val waits_n$r))"
done
[ "$(val device_threads)" = 0 ]; ok $? "on the cpu no device thread: the host's clock times the compute"
# the rank that comes first to a collective waits for the other: some collective of one
# rank or the other waited (one rank alone may have come last every time, on a busy machine)
[ $(( $(val waits_count0) + $(val waits_count1) )) -gt 0 ]; ok $? "collectives that waited are marked (rank 0: $(val waits_count0), rank 1: $(val waits_count1))"
diag "clock error bound: $(val clock_error_us) us"
[ "$(val aligned)" = 1 ]; ok $? "the ranks share one time line: each all-reduce overlaps its partner on the other rank"

# a straggler: rank 1 is stopped for 80 ms of every 100 (SIGSTOP, SIGCONT), so rank 0
# waits for it in the collectives, and it finds rank 0's data there when it resumes
printf '#!/bin/sh\necho $$ > "%s/pid.$RANK"\nexec "$@"\n' "$T" > "$T/pid.sh"
timeout 120 "$R" -n 2 sh "$T/pid.sh" "$D" train $A --steps 12 --trace "$T/ts.json" --trace-steps 2:12 > "$T/os" 2>&1 &
run=$!
i=0; while [ ! -s "$T/pid.1" ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done   # rank 1 started
p1=$(cat "$T/pid.1" 2>/dev/null)
i=0
while [ -n "$p1" ] && [ $i -lt 1200 ] && kill -STOP "$p1" 2>/dev/null; do
    sleep 0.08; kill -CONT "$p1" 2>/dev/null; sleep 0.02; i=$((i + 1))
done
wait $run
ok $? "2 processes with --trace, rank 1 stopped most of the time ($i times)"
py "$T/ts.json" 2 2,3,4,5,6,7,8,9,10,11,12
diag "waited in collectives: rank 0 $(val waited_ms0) ms, rank 1 $(val waited_ms1) ms"
awk -v a="$(val waited_ms0)" -v b="$(val waited_ms1)" 'BEGIN { exit !(a + 0 > b + 0) }'
ok $? "rank 0 waited for the stopped rank 1 longer than rank 1 waited for it"

# one process, and a pipeline
timeout 60 "$D" train $A --trace "$T/t1.json" --checkpoint-dir "$T/ck" --checkpoint-every 2 > "$T/o1" 2>&1
ok $? "1 process with --trace (every step) and checkpoints every 2 steps"
n=$(python3 -c "
import json, sys
print(sum(1 for e in json.load(open(sys.argv[1]))['traceEvents'] if e.get('name') == 'checkpoint'))" "$T/t1.json")
[ "$n" = 3 ]; ok $? "... a span per checkpoint written (steps 2, 4 and the end, 5; got $n)"
py "$T/t1.json" 1 1,2,3,4,5
[ "$(val steps0)" = "1,2,3,4,5" ]; ok $? "... every step traced (got '$(val steps0)')"
[ "$(val forwards0)" = 20 ]; ok $? "... a forward per micro-batch (5 x 4; got $(val forwards0))"
timeout 120 "$R" -n 2 "$D" train $A --pipeline 2 --trace "$T/tp.json" --trace-steps 4: > "$T/op" 2>&1
ok $? "a 2-stage pipeline with --trace --trace-steps 4:"
python3 -c "
import json, sys
ev = json.load(open(sys.argv[1]))['traceEvents']
print(sorted(set(e['pid'] for e in ev if e.get('name') == 'pipeline actions')))" "$T/tp.json" > "$T/pp" 2>&1
[ "$(cat "$T/pp")" = "[0, 1]" ]; ok $? "... both stages' pipeline actions (got $(cat "$T/pp"))"

# a gpt: a forward and a backward span per top-level module and micro-batch
awk 'BEGIN { for (i = 0; i < 100; i++) printf "%d: the quick brown fox.\n", i % 13 }' > "$T/text.txt"
timeout 60 "$D" prepare-text "$T/tok" "$T/text.txt" > /dev/null 2>&1
timeout 60 "$D" train --model "gpt(layers=2,heads=2,dim=32,block=16)" --data "tokens:$T/tok" --steps 3 --warmup 1 \
    --batch 8 --micro-batches 2 --threads 1 --no-eval --quiet --trace "$T/g.json" > "$T/og" 2>&1
ok $? "a gpt with --trace"
python3 -c "
import json, sys, collections
ev = json.load(open(sys.argv[1]))['traceEvents']
for p in ('forward', 'backward'):
    c = collections.Counter(e['name'] for e in ev if e['ph'] == 'X' and e.get('cat') == p)
    print(p, len(c), sorted(set(c.values())))" "$T/g.json" > "$T/mods" 2>&1
diag "$(tr '\n' ';' < "$T/mods")"
grep -qx "forward 8 \[6\]" "$T/mods"; ok $? "its 8 modules each have a forward span per micro-batch (3 steps x 2)"
grep -qx "backward 8 \[6\]" "$T/mods"; ok $? "... and a backward span"

# bad input: exit 2 before training, naming the flag
bad() {   # bad WHAT PATTERN ARGS...
    what=$1 pat=$2; shift 2
    timeout 60 "$D" train $A "$@" > "$T/bad" 2>&1
    rc=$?; [ $rc -eq 2 ]; ok $? "$what exits 2 (got $rc)"
    ok_grep "$T/bad" "$pat" "... saying: $pat"
}
bad "--trace-steps 3:2" "--trace-steps: expected A:B" --trace "$T/x.json" --trace-steps 3:2
bad "--trace-steps 0:2" "--trace-steps: expected A:B" --trace "$T/x.json" --trace-steps 0:2
bad "--trace-steps without --trace" "--trace-steps: needs --trace" --trace-steps 1:2
bad "--trace into a missing directory" "--trace: cannot create" --trace "$T/nodir/x.json"
[ ! -e "$T/x.json" ]; ok $? "no file is left by a refused run"
done_testing
