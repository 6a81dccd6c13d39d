#!/bin/sh
# peak.sh: MFU's peak (src/tools/peak.h). Measured once and cached, a line per CPU,
# kernel, precision and threads with its date; a second run takes it from the cache; a
# cache that holds a peak below what the run reaches is corrected by the run, so no MFU
# above 100% is ever printed or written; junk lines are dropped; DT_PEAK_CACHE=off keeps
# no file; --peak-gflops touches no cache; a cache that cannot be written is a warning.
. "${DT_SRCDIR:-$(dirname "$0")/..}/tests/tap.sh"
D="$DT_BUILDDIR/dtrain"
[ -x "$D" ] || skip_all "dtrain not built"
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
export TMPDIR="$T"

awk 'BEGIN { for (i = 0; i < 200; i++) printf "line %d: the quick brown fox jumps over the lazy dog.\n", i % 13 }' > "$T/text.txt"
timeout 60 "$D" prepare-text "$T/tok" "$T/text.txt" > "$T/o" 2>&1
ok $? "prepare-text"
G="--model gpt(layers=1,heads=2,dim=32,block=32) --data tokens:$T/tok --batch 8 --steps 4 --warmup 1 --no-eval --threads 1 --log-every 1"
C="$T/cache/dir/peak"   # its directories do not exist yet
LINE='^[0-9]+\.[0-9] 20[0-9][0-9]-[01][0-9]-[0-3][0-9] cpu=[^;]+;gemm=[a-z0-9-]+;precision=%s;threads=1$'

DT_PEAK_CACHE="$C" timeout 120 "$D" train $G > "$T/o1" 2>&1
ok $? "a first run"
ok_grep "$T/o1" 'MFU against 1 x [0-9.]+ GFLOP/s \(per process: the peak of its GEMM, measured now\)' "it measures the peak"
[ "$(wc -l < "$C")" -eq 1 ] && grep -Eq "$(printf "$LINE" fp32)" "$C"; ok $? "and caches it: one line, rate, date, key"
rate=$(cut -d' ' -f1 "$C")
DT_PEAK_CACHE="$C" timeout 120 "$D" train $G --metrics "$T/m.jsonl" > "$T/o2" 2>&1
ok $? "a second run"
ok_grep "$T/o2" "MFU against 1 x $rate GFLOP/s \\(per process: the peak of its GEMM, measured 20[0-9-]+\\)" "it takes the cached peak"
ok_grep "$T/m.jsonl" "\"event\":\"start\".*\"peak_gflops\":$rate,\"peak\":\"measured 20" "the metrics' start line names it"
DT_PEAK_CACHE="$C" timeout 120 "$D" train $G --precision bf16 > "$T/o3" 2>&1
ok $? "a bf16 run"
[ "$(wc -l < "$C")" -eq 2 ] && grep -Eq "$(printf "$LINE" bf16)" "$C" && grep -Eq "$(printf "$LINE" fp32)" "$C"
ok $? "a line per precision, the fp32 line kept"

# a peak too low: the run's rate replaces it, and no MFU above 100 % is printed or written
sed -i "s/^$rate /0.001 /" "$C"
DT_PEAK_CACHE="$C" timeout 120 "$D" train $G --metrics "$T/low.jsonl" > "$T/o4" 2>&1
ok $? "a run with a cached peak of 0.001 GFLOP/s"
ok_grep "$T/o4" 'MFU: this run reached [0-9.]+ GFLOP/s per process, above the peak of 0.0 \(measured 20[0-9-]+\): it is the peak from now on \(kept in .*/peak at the end\)' "it says the peak was low"
[ "$(grep -c 'MFU: this run reached' "$T/o4")" -eq 1 ]; ok $? "once"
over=$(sed -n 's/.*MFU \([0-9.]*\)%.*/\1/p' "$T/o4" | awk '$1 > 100 { n++ } END { print n + 0 }')
seen=$(sed -n 's/.*MFU \([0-9.]*\)%.*/\1/p' "$T/o4" | wc -l)
[ "$seen" -ge 5 ] && [ "$over" -eq 0 ]; ok $? "no printed MFU above 100% ($seen seen)"
wover=$(grep '"event":"step"' "$T/low.jsonl" | sed -n 's/.*"mfu":\([0-9.]*\).*/\1/p' | awk '$1 > 100 { n++ } END { print n + 0 }')
[ "$wover" -eq 0 ]; ok $? "no MFU above 100 in the metrics"
new=$(grep 'precision=fp32' "$C" | cut -d' ' -f1)
awk -v n="$new" 'BEGIN { exit !(n > 0.001) }'; ok $? "the cache's line was raised ($new)"

# junk in the cache: dropped, the file written again with the valid lines
{ printf 'garbage\n12 not-a-date cpu=x\n-5 2026-12-04 cpu=x\n\001\002\003\n'; cat "$C"; } > "$T/c2"
head -c 3000 /dev/urandom | tr -d '\n' >> "$T/c2"; echo >> "$T/c2"
DT_PEAK_CACHE="$T/c2" timeout 120 "$D" train $G --precision fp16 > "$T/o5" 2>&1
ok $? "a cache with junk lines: the run goes on"
[ "$(wc -l < "$T/c2")" -eq 3 ] && ! grep -q 'garbage\|not-a-date\|^-5' "$T/c2"; ok $? "junk dropped, 3 valid lines"

# off: no file
DT_PEAK_CACHE=off timeout 120 "$D" train $G > "$T/o6" 2>&1
ok $? "DT_PEAK_CACHE=off"
ok_grep "$T/o6" 'measured now' "off: measured"
[ -z "$(find "$T" -name peak -newer "$T/o5" 2>/dev/null)" ]; ok $? "off: nothing written"

# --peak-gflops: given, raised for this run only, the cache untouched
cp "$C" "$T/before"
DT_PEAK_CACHE="$C" timeout 120 "$D" train $G --peak-gflops 0.001 > "$T/o7" 2>&1
ok $? "--peak-gflops 0.001"
ok_grep "$T/o7" 'above the peak of 0.0 \(--peak-gflops\): it is the peak from now on$' "a given peak below the run is said"
cmp -s "$C" "$T/before"; ok $? "and the cache is untouched"

# a cache that cannot be written: a warning, the run succeeds
: > "$T/file"
DT_PEAK_CACHE="$T/file/peak" timeout 120 "$D" train $G > "$T/o8" 2>&1
ok $? "an unwritable cache: the run succeeds"
ok_grep "$T/o8" "warning: MFU's peak is not cached in $T/file/peak" "and warns, naming the file"
done_testing
