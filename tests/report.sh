#!/bin/sh
# report.sh: `dtrain report` writes one self-contained HTML page from metrics files:
#   of a 2-process mlp run (--rank-stats, every step logged), of a gpt run with
#   validation, and of both overlaid; the numbers in the page are the files' (the loss
#   polyline has a point per step event, the data block holds every loss, validation
#   loss, throughput, rank split and memory figure of the file, the summary the final
#   loss as printed); nothing is fetched (no src or href); text from outside is escaped;
#   headless Chromium renders it without console messages and the screenshot has the
#   charts' colours where the charts are (skipped without chromium); bad input exits 2
#   naming it, and lines that are not metrics events are skipped and counted.
. "${DT_SRCDIR:-$(dirname "$0")/..}/tests/tap.sh"
D="$DT_BUILDDIR/dtrain"; R="$DT_BUILDDIR/dtrun"
[ -x "$D" ] && [ -x "$R" ] || skip_all "dtrain or dtrun not built"
command -v python3 > /dev/null || skip_all "python3 is needed to read the page"
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT

# the runs: 2 processes of an mlp on synthetic data, and a small gpt with validation
timeout 120 "$R" -n 2 "$D" train --model mlp --data synthetic:1024,1,28,28,10 --batch 64 --steps 20 --threads 1 \
    --rank-stats 5 --log-every 1 --metrics "$T/m2.jsonl" --quiet > "$T/o.m2" 2>&1
ok $? "2 processes train an mlp 20 steps with --rank-stats 5 --log-every 1"
awk 'BEGIN { for (i = 0; i < 300; i++)
    printf "line %d: the quick brown fox jumps over the lazy dog; pack my box with five dozen liquor jugs.\n", i % 17 }' \
    > "$T/text.txt"
timeout 60 "$D" prepare-text "$T/tok" "$T/text.txt" > "$T/o.prep" 2>&1
timeout 120 "$D" train --model "gpt(layers=2,heads=2,dim=32,block=16)" --data "tokens:$T/tok" --batch 8 --threads 1 \
    --steps 20 --warmup 5 --eval-every 10 --eval-batches 2 --rank-stats 5 --log-every 1 --metrics "$T/g.jsonl" \
    --quiet > "$T/o.g" 2>&1
ok $? "a gpt trains 20 steps with --eval-every 10"

timeout 60 "$D" report "$T/m2.jsonl" -o "$T/report.html" > "$T/out" 2> "$T/err"
ok $? "report of the 2-process run exits 0"
[ -s "$T/report.html" ] && [ ! -s "$T/err" ]; ok $? "... writes the page and says nothing on stderr"
ok_grep "$T/out" "wrote .*report\.html \(1 run\)" "... and says what it wrote"
timeout 60 "$D" report "$T/g.jsonl" -o "$T/g.html" > "$T/out" 2>&1
ok $? "report of the gpt run exits 0"
timeout 60 "$D" report "2 ranks=$T/m2.jsonl" "$T/g.jsonl" -o "$T/both.html" > "$T/out" 2>&1
ok $? "report of the two files overlaid exits 0"

# the page against the files: check.py PAGE METRICS... prints "name value" lines
cat > "$T/check.py" <<'PYEOF'
import html.parser, json, re, sys
page, files = sys.argv[1], sys.argv[2:]
say = lambda k, v: print("%s %s" % (k, v))
class P(html.parser.HTMLParser):
    def __init__(s):
        super().__init__(); s.lines = []; s.ids = []; s.cls = None; s.cells = {}; s.data = None; s.injson = False
    def handle_starttag(s, tag, a):
        a = dict(a)
        if tag == "polyline": s.lines.append(a)
        if tag == "svg" and a.get("id"): s.ids.append(a["id"])
        if tag == "td" and a.get("class"): s.cls = a["class"]; s.cells.setdefault(s.cls, []).append("")
        s.injson = tag == "script" and a.get("id") == "dtrain-report-data"
    def handle_endtag(s, tag): s.cls = None; s.injson = False
    def handle_data(s, d):
        if s.cls: s.cells[s.cls][-1] += d
        if s.injson: s.data = json.loads(d)
p = P(); p.feed(open(page, encoding="utf-8").read())
say("ids", ",".join(p.ids))
say("has_data", int(p.data is not None and len(p.data["files"]) == len(files)))
for k, path in enumerate(files):
    raw = [l for l in open(path, encoding="utf-8") if l.strip()]
    ev = [json.loads(l) for l in raw]
    steps = [e for e in ev if e["event"] == "step"]
    f = p.data["files"][k]
    loss = [l for l in p.lines if l.get("class") == "loss" and l.get("data-file") == str(k)]
    npts = len(loss[0]["points"].split()) if loss else -1
    say("points%d" % k, "%d %s %d" % (npts, loss[0].get("data-points") if loss else "-", len(steps)))
    say("loss%d" % k, int(f["loss"] == [e["loss"] for e in steps] and f["step"] == [e["step"] for e in steps]))
    printed = re.search(r'"loss":([^,]*),', [l for l in raw if '"event":"step"' in l][-1]).group(1)
    say("final%d" % k, "%s %s" % (p.cells["final-loss"][k], printed))
    unit = "tokens_per_s" if "tokens_per_s" in steps[0] else "samples_per_s"
    say("thr%d" % k, int(f["throughput"] == [e[unit] for e in steps] and f["unit"] == unit.replace("_per_s", "/s")))
    val = []
    for e in ev:
        v = e.get("val_loss", e.get("test_loss")) if e["event"] in ("eval", "epoch") else None
        if v is None: continue
        if val and val[-1][0] == e["step"]: val[-1] = (e["step"], v)
        else: val.append((e["step"], v))
    say("val%d" % k, "%d %d" % (int(f["val_loss"] == [v for _, v in val] and f["val_step"] == [s for s, _ in val]), len(val)))
    ranks = [e for e in ev if e["event"] == "rank"]
    last = [e for e in ranks if e["step"] == ranks[-1]["step"]] if ranks else []
    close = lambda a, b: abs(a - b) <= 1e-6 * max(abs(a), abs(b), 1e-9)
    say("ranks%d" % k, "%d %d" % (len(last), int(len(f["ranks"]) == len(last) and all(
        g["rank"] == e["rank"] and close(g["compute_ms"], 1e3 * e["compute_s"] / e["steps"]) and
        close(g["comm_ms"], 1e3 * e["comm_s"] / e["steps"]) and close(g["data_ms"], 1e3 * e["data_s"] / e["steps"])
        for g, e in zip(f["ranks"], last)))))
    slow = max(last, key=lambda e: e["step_s"] / e["steps"])["rank"] if len(last) > 1 else None
    say("slowest%d" % k, "%s %s" % (f["slowest"], slow))
    mem = ([e for e in ev if e["event"] == "memory" and e["rank"] == 0] or [{"step": -1}])[-1]
    got = [m for m in f["memory"] if m["rank"] == 0 and m["step"] == mem["step"]]
    say("memory%d" % k, int(len(got) == 1 and all(close(got[0]["mib"][c], b / 1048576) for c, b in mem["mem_bytes"].items())
                            and all(close(got[0]["peak_mib"][c], b / 1048576) for c, b in mem["mem_peak_bytes"].items())))
PYEOF
py() { python3 "$T/check.py" "$@" > "$T/c.out" 2> "$T/c.err" || sed 's/^/#   /' "$T/c.err" | tail -5; }
val() { sed -n "s/^$1 //p" "$T/c.out"; }
py "$T/report.html" "$T/m2.jsonl"
[ "$(val has_data)" = 1 ]; ok $? "the page has its data block, one entry per file"
[ "$(val ids)" = "chart-loss,chart-samples,chart-ranks-0,chart-memory-0" ]
ok $? "charts of loss, samples/s, the ranks' steps and memory (got '$(val ids)')"
set -- $(val points0)
[ "$1" = 20 ] && [ "$2" = 20 ] && [ "$3" = 20 ]; ok $? "the loss polyline has a point per step event (points, data-points, events: $*)"
[ "$(val loss0)" = 1 ]; ok $? "the data block's losses and steps are the file's"
set -- $(val final0)
[ -n "$1" ] && [ "$1" = "$2" ]; ok $? "the summary's final loss is the last step's as printed ($*)"
[ "$(val thr0)" = 1 ]; ok $? "the throughput is the file's samples/s"
[ "$(val ranks0)" = "2 1" ]; ok $? "the last rank events of both ranks: compute, communication and data ms per step ($(val ranks0))"
set -- $(val slowest0)
[ "$1" = "$2" ] && [ "$1" != None ]; ok $? "the slowest rank marked is the one with the longest step ($*)"
grep -q 'class="slowest"' "$T/report.html"; ok $? "... and drawn marked"
[ "$(val memory0)" = 1 ]; ok $? "memory: rank 0's MiB now and at peak are the memory event's bytes"
ok_grep "$T/report.html" '<td>model</td><td class="text">mlp</td>' "the run's settings (the start line dtrain train writes)"
! grep -Eq '(src|href)=' "$T/report.html"; ok $? "nothing is fetched: no src or href in the page"
! grep -Eq '<script>|<script [^>]*>[^{]' "$T/report.html"; ok $? "no script runs: the one script element is the JSON data"

py "$T/g.html" "$T/g.jsonl"
[ "$(val ids)" = "chart-loss,chart-tokens,chart-ranks-0,chart-memory-0" ]; ok $? "gpt: a tokens/s chart (got '$(val ids)')"
set -- $(val points0)
[ "$1" = 20 ] && [ "$3" = 20 ]; ok $? "gpt: a loss point per step ($*)"
[ "$(val loss0)" = 1 ] && [ "$(val thr0)" = 1 ]; ok $? "gpt: the losses and tokens/s are the file's"
set -- $(val val0)
[ "$1" = 1 ] && [ "$2" -ge 2 ]; ok $? "gpt: the validation losses are the file's ($2 of them)"
grep -q 'class="val"' "$T/g.html"; ok $? "gpt: the validation loss is drawn"
ok_grep "$T/g.html" 'MFU \(% of peak\)' "gpt: MFU has its axis"
[ "$(val memory0)" = 1 ]; ok $? "gpt: memory is the file's"

py "$T/both.html" "$T/m2.jsonl" "$T/g.jsonl"
set -- $(val points0) $(val points1)
[ "$1" = 20 ] && [ "$4" = 20 ]; ok $? "overlaid: a loss polyline per file ($*)"
[ "$(val loss0)" = 1 ] && [ "$(val loss1)" = 1 ]; ok $? "overlaid: each line's losses are its file's"
ok_grep "$T/both.html" 'class="item"><span class="sw[^>]*></span>2 ranks</span>' "overlaid: the legend names the label given"
ok_grep "$T/both.html" 'class="item"><span class="sw[^>]*></span>g\.jsonl</span>' "overlaid: ... and the other file"
[ "$(val ids)" = "chart-loss,chart-tokens,chart-samples,chart-ranks-0,chart-memory-0,chart-ranks-1,chart-memory-1" ]
ok $? "overlaid: one throughput chart per unit, the ranks and memory of each run"

# what a file lacks is left out with a note saying why
grep '"event":"step"' "$T/m2.jsonl" > "$T/steps.jsonl"
timeout 60 "$D" report "$T/steps.jsonl" -o "$T/steps.html" > "$T/out" 2>&1
ok $? "a file of step events only reports"
py "$T/steps.html" "$T/steps.jsonl"
[ "$(val ids)" = "chart-loss,chart-samples" ]; ok $? "... with the loss and throughput charts only (got '$(val ids)')"
ok_grep "$T/steps.html" 'class="note">No validation loss: .*--eval-every N' "... a note for the validation loss"
ok_grep "$T/steps.html" 'class="note">No per-rank step split: .*--rank-stats N' "... for the ranks"
ok_grep "$T/steps.html" 'class="note">No memory chart: .*--rank-stats N' "... for memory"

# text from outside is escaped: a file name and a start event's settings
n="$T/a<b>&\"c.jsonl"
{ echo '{"event":"start","model":"<i>mlp</i>","lr":0.05,"data":{"spec":"synthetic:\u003c"}}'
  grep -v '"event":"start"' "$T/m2.jsonl"; } > "$n"
timeout 60 "$D" report "$n" -o "$T/esc.html" > "$T/out" 2>&1
ok $? "a file with <, &, \" in its name and a start event"
ok_grep "$T/esc.html" 'a&lt;b&gt;&amp;&quot;c\.jsonl' "its name is escaped"
! grep -q 'a<b>' "$T/esc.html"; ok $? "... nowhere raw"
ok_grep "$T/esc.html" '<td>model</td><td class="text">&lt;i&gt;mlp&lt;/i&gt;</td>' "the start event's settings are a table, escaped"
ok_grep "$T/esc.html" '<td>data\.spec</td><td class="text">synthetic:&lt;</td>' "... nested members by their path"

# headless Chromium: a screenshot with the charts in it, and no console messages
CHROME=$(command -v chromium || command -v chromium-browser)
if [ -n "$CHROME" ]; then
    chrome() { timeout 60 "$CHROME" --headless --no-sandbox --disable-gpu --hide-scrollbars --user-data-dir="$T/chrome" "$@"; }
    chrome --screenshot="$T/r.png" --window-size=1000,2400 "file://$T/report.html" > "$T/o.shot" 2>&1
    [ -s "$T/r.png" ]; ok $? "chromium takes a screenshot of the page"
    cat > "$T/png.py" <<'PYEOF'
import struct, sys, zlib
d = open(sys.argv[1], "rb").read()
assert d[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
pos, idat, hdr = 8, b"", None
while pos < len(d):
    n, kind = struct.unpack(">I4s", d[pos:pos + 8])
    body = d[pos + 8:pos + 8 + n]
    if kind == b"IHDR": hdr = struct.unpack(">IIBBBBB", body)
    if kind == b"IDAT": idat += body
    pos += 12 + n
w, h, depth, ctype, _, _, interlace = hdr
assert depth == 8 and ctype in (2, 6) and not interlace, "unexpected PNG format %r" % (hdr,)
bpp = 3 if ctype == 2 else 4
raw, stride, prev, rows = zlib.decompress(idat), w * bpp, bytearray(w * bpp), []
for y in range(h):
    f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
    for i in range(stride):
        a = line[i - bpp] if i >= bpp else 0
        b, c = prev[i], prev[i - bpp] if i >= bpp else 0
        if f == 1: line[i] = (line[i] + a) & 255
        elif f == 2: line[i] = (line[i] + b) & 255
        elif f == 3: line[i] = (line[i] + (a + b) // 2) & 255
        elif f == 4:
            pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
            line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    rows.append(line); prev = line
near = lambda px, rgb: all(abs(px[j] - rgb[j]) <= 24 for j in range(3))
colours = {"file0": (0x1f, 0x77, 0xb4), "compute_params": (0x4e, 0x79, 0xa7), "comm_wait_optim": (0xe1, 0x57, 0x59)}
count = dict.fromkeys(colours, 0)
inked = 0
for line in rows:
    ink = 0
    for x in range(0, w, 2):
        px = line[x * bpp:x * bpp + 3]
        ink |= min(px) < 200
        for k, rgb in colours.items():
            count[k] += near(px, rgb)
    inked += ink
print("size %dx%d" % (w, h))
for k in colours: print("%s %d" % (k, count[k]))
print("inked_rows %d" % inked)
PYEOF
    python3 "$T/png.py" "$T/r.png" > "$T/c.out" 2> "$T/c.err" || sed 's/^/#   /' "$T/c.err" | tail -3
    [ "$(val size)" = 1000x2400 ]; ok $? "the screenshot is 1000 x 2400 ($(val size))"
    n=$(val file0); [ "${n:-0}" -gt 300 ]; ok $? "the loss and throughput lines are drawn ($n pixels of the run's colour)"
    n=$(val compute_params); [ "${n:-0}" -gt 3000 ]; ok $? "the compute bars and the params layer are drawn ($n pixels)"
    n=$(val comm_wait_optim); [ "${n:-0}" -gt 3000 ]; ok $? "the communication-wait bars and the optim layer are drawn ($n pixels)"
    n=$(val inked_rows); [ "${n:-0}" -gt 1000 ]; ok $? "ink on $n of the 2400 rows: not blank"
    chrome --enable-logging=stderr --v=0 --dump-dom "file://$T/report.html" > "$T/dom.html" 2> "$T/dom.err"
    ok $? "chromium --dump-dom of the page"
    for id in chart-loss chart-samples chart-ranks-0 chart-memory-0; do
        grep -q "<svg class=\"chart\" id=\"$id\"" "$T/dom.html"; ok $? "the DOM has the chart $id"
    done
    ! grep -E 'CONSOLE|Uncaught' "$T/dom.err" > "$T/console"; ok $? "no console message from the page$(head -c 300 "$T/console")"
else
    for i in 1 2 3 4 5 6 7 8 9 10 11 12; do skip "chromium not installed (Debian: apt-get install chromium)"; done
fi

# bad input: exit 2 and one line naming it; no page written
bad() {  # bad "what" PATTERN ARGS...
    what=$1; pat=$2; shift 2
    rm -f "$T/x.html"
    timeout 60 "$D" report "$@" > "$T/out" 2> "$T/err"; rc=$?
    [ $rc -eq 2 ] && [ "$(wc -l < "$T/err")" -eq 1 ] && grep -Eq -- "$pat" "$T/err" && [ ! -e "$T/x.html" ]
    ok $? "$what -> exit 2 ($rc): $(cat "$T/err")"
}
grep -v '"event":"step"' "$T/m2.jsonl" > "$T/nosteps.jsonl"
: > "$T/empty.jsonl"
mkdir "$T/dir.jsonl"
bad "a missing file" "missing\.jsonl: cannot open" "$T/missing.jsonl" -o "$T/x.html"
bad "a file without step events" "nosteps\.jsonl: no step events" "$T/nosteps.jsonl" -o "$T/x.html"
bad "an empty file" "empty\.jsonl: no step events" "$T/empty.jsonl" -o "$T/x.html"
bad "a directory" "dir\.jsonl: not a regular file" "$T/dir.jsonl" -o "$T/x.html"
bad "-o into a missing directory" "-o: cannot create .*/nodir/r\.html: directory .*/nodir" "$T/m2.jsonl" -o "$T/nodir/r.html"
bad "-o a directory" "-o: .* is a directory" "$T/m2.jsonl" -o "$T"
bad "-o one of the metrics files" "-o: .*m2\.jsonl is one of the metrics files" "$T/m2.jsonl" -o "$T/m2.jsonl"
bad "no -o" "-o: required" "$T/m2.jsonl"
bad "no files" "expected one or more metrics files" -o "$T/x.html"
bad "an unknown flag" "unknown flag '--frobnicate'" --frobnicate "$T/m2.jsonl" -o "$T/x.html"

# lines that are not metrics events: skipped and counted
{ echo 'not json'; head -3 "$T/m2.jsonl"; echo '{"event":"step","step":4,"loss":'; echo '{"event":"other","step":4}'
  echo '{"event":"step","step":4,"loss":nan}'; echo '[1]'; sed -n '4,$p' "$T/m2.jsonl"; } > "$T/junk.jsonl"
timeout 60 "$D" report "$T/junk.jsonl" -o "$T/junk.html" > "$T/out" 2> "$T/err"
ok $? "a file with 5 lines that are not metrics events still reports"
ok_grep "$T/err" "junk\.jsonl: 5 lines skipped \(not metrics events\)" "... saying how many were skipped"
py "$T/junk.html" "$T/m2.jsonl"
set -- $(val points0)
[ "$1" = 20 ]; ok $? "... and every step event is drawn ($1 points)"
grep -v '"event":"step"' "$T/junk.jsonl" | { cat; echo 'garbage'; } > "$T/junk2.jsonl"
timeout 60 "$D" report "$T/junk2.jsonl" -o "$T/x.html" > "$T/out" 2> "$T/err"
[ $? -eq 2 ] && grep -q "junk2\.jsonl: 4 lines skipped" "$T/err" && grep -q "junk2\.jsonl: no step events" "$T/err"
ok $? "skipped lines and no step events: both said, exit 2"
# a file appended to by two runs: the last is reported
{ cat "$T/g.jsonl"; cat "$T/m2.jsonl"; } > "$T/two.jsonl"
timeout 60 "$D" report "$T/two.jsonl" -o "$T/two.html" > "$T/out" 2> "$T/err"
ok $? "a file of two runs reports"
ok_grep "$T/err" "holds 2 runs .*reporting the last" "... saying so"
py "$T/two.html" "$T/m2.jsonl"
[ "$(val loss0)" = 1 ]; ok $? "... from its last run"
# a run stopped at step 10 and resumed to 20, into one metrics file: one run of 20 steps
MR="--model mlp --data synthetic:1024,1,28,28,10 --batch 64 --steps 20 --threads 1 --log-every 1 --quiet"
timeout 60 "$D" train $MR --metrics "$T/res.jsonl" --checkpoint-dir "$T/ck" --stop-at 10 > "$T/o.r1" 2>&1 &&
    timeout 60 "$D" train $MR --metrics "$T/res.jsonl" --checkpoint-dir "$T/ck" --resume auto > "$T/o.r2" 2>&1
ok $? "a run stopped at step 10, resumed to 20, one metrics file"
timeout 60 "$D" report "$T/res.jsonl" -o "$T/res.html" > "$T/out" 2> "$T/err"
ok $? "... reports"
! grep -q "runs" "$T/err"; ok $? "... as one run (not 'holds 2 runs')"
ok_grep "$T/res.html" '<td>resumed after step</td><td class="text">10</td>' "... the resumption noted"
n=$(grep -c '<line class="resume" data-step="10"' "$T/res.html")
[ "$n" -ge 2 ]; ok $? "... and marked at step 10 on the loss and throughput charts ($n marks)"
ok_grep "$T/res.html" 'resumed from a checkpoint .dotted.' "... the legend says what the mark is"
n=$(grep -c '<line class="resume"' "$T/two.html")
[ "$n" -eq 0 ]; ok $? "a run never resumed has no such mark ($n)"
# dtrain plan's estimate on the memory chart: the start line carries it, it is within 10%
# of the peak the run accounted, and the chart draws it at that height with a legend
planb=$(head -1 "$T/m2.jsonl" | sed -n 's/.*"plan_bytes":\([0-9]*\).*/\1/p')
peakb=$(grep '"event":"memory"' "$T/m2.jsonl" | grep '"rank":0' | sed -n 's/.*"mem_peak_bytes":{[^}]*"total":\([0-9]*\).*/\1/p')
[ -n "$planb" ] && [ -n "$peakb" ] && awk -v p="$planb" -v m="$peakb" 'BEGIN { d = p - m; if (d < 0) d = -d; exit !(p > 0 && d <= 0.1 * m) }'
ok $? "the start line has plan_bytes, within 10% of rank 0's accounted peak (${planb:-none} planned, ${peakb:-none} held)"
mib=$(awk -v p="${planb:-0}" 'BEGIN { printf "%.1f", p / 1048576 }')
ok_grep "$T/report.html" "<line class=\"plan\" data-mib=\"$mib\"" "the memory chart draws the plan's line at $mib MiB"
ok_grep "$T/report.html" "dtrain plan&#39;s peak, $mib MiB \\(dotted\\)" "... and names it in the legend"
n=$(grep -c '<line class="plan"' "$T/two.html")
[ "$n" -eq 1 ]; ok $? "one plan line for the run reported ($n)"
python3 -c "
import json, re, sys
page = open(sys.argv[1]).read()
data = json.loads(re.search(r'<script type=\"application/json\" id=\"dtrain-report-data\">(.*?)</script>', page, re.S).group(1))
print(data['files'][0]['step'] == list(range(1, 21)))" "$T/res.html" > "$T/res.data" 2>&1
[ "$(cat "$T/res.data")" = True ]; ok $? "... its loss line has steps 1 to 20, once each ($(cat "$T/res.data"))"
timeout 10 "$D" report --help > "$T/out"; ok $? "report --help exits 0"

# --trace: the timeline of a trace file, a box per span, a lane per thread of each rank
echo "flatten linear(32) relu linear(4)" > "$T/tl.model"
timeout 60 "$R" -n 2 "$D" train --model @"$T/tl.model" --data synthetic:512,1,8,8,4 --steps 3 --batch 32 \
    --micro-batches 2 --threads 1 --quiet --no-eval --trace "$T/tl.json" > "$T/o.tl" 2>&1
ok $? "a 2-rank run with --trace"
timeout 60 "$D" report --trace "$T/tl.json" -o "$T/tl.html" > "$T/out" 2> "$T/err"
ok $? "report --trace writes the timeline"
spans=$(python3 -c "
import json, sys
print(sum(1 for e in json.load(open(sys.argv[1]))['traceEvents'] if e['ph'] == 'X'))" "$T/tl.json")
n=$(grep -c '<rect class="span"' "$T/tl.html")
[ "$n" = "$spans" ] && [ "$n" -gt 50 ]; ok $? "one box per span of the file ($n boxes, $spans spans)"
for lane in 'rank 0' 'rank 1' '>main<' '>comm<' '>loader<'; do
    grep -q "$lane" "$T/tl.html"; ok $? "the timeline has $lane"
done
ok_grep "$T/tl.html" '<title>all_reduce [^<]*f32[^<]* [0-9.]+ ms</title>' \
    "a collective's box says what it was and how long it took"
timeout 60 "$D" report --trace "$T/m2.jsonl" -o "$T/bad.html" > "$T/out" 2> "$T/err"
[ $? -eq 2 ] && [ ! -e "$T/bad.html" ]; ok $? "a metrics file given as a trace: exit 2, no page"
ok_grep "$T/err" "no spans in it" "... saying there is nothing to draw"
timeout 60 "$D" report --trace "$T/none.json" -o "$T/bad.html" > "$T/out" 2> "$T/err"
[ $? -eq 2 ]; ok $? "a trace file that does not exist: exit 2"
timeout 60 "$D" report --trace "$T/tl.json" "$T/m2.jsonl" -o "$T/bad.html" > "$T/out" 2> "$T/err"
[ $? -eq 2 ]; ok $? "a trace and metrics files at once: exit 2"
head -c 3000 "$T/tl.json" > "$T/cut.json"
timeout 60 "$D" report --trace "$T/cut.json" -o "$T/cut.html" > "$T/out" 2> "$T/err"
ok $? "a trace cut short (a crash) still draws what it holds"
if [ -n "$CHROME" ]; then
    chrome --screenshot="$T/tl.png" --window-size=1300,500 "file://$T/tl.html" > "$T/o.shot" 2>&1
    python3 "$T/png.py" "$T/tl.png" > "$T/c.out" 2> "$T/c.err" || sed 's/^/#   /' "$T/c.err" | tail -3
    # the boxes' share of the width depends on the machine's speed: a few hundred pixels of
    # the compute colour say they are drawn
    n=$(val compute_params); [ "${n:-0}" -gt 300 ]; ok $? "chromium draws the timeline's compute boxes ($n pixels)"
else
    skip "chromium not installed (Debian: apt-get install chromium)"
fi
done_testing
