#!/bin/sh
# plot.sh: `dtrain plot` draws the step losses of metrics files: a PNG through
# gnuplot (skipped when gnuplot is absent), an ASCII chart with --text whose shape
# and marks are checked (identical runs share '#' cells, different ones do not),
# LABEL=PATH legends, a file appended to by two runs, and bad inputs (exit 2).
. "${DT_SRCDIR:-$(dirname "$0")/..}/tests/tap.sh"
D="$DT_BUILDDIR/dtrain"
[ -x "$D" ] || skip_all "dtrain not built"
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT

# metrics as dtrain train --metrics writes them: step lines among epoch and rank lines
metrics() {  # metrics FILE SCALE: 20 steps of loss SCALE * 2 / step
    awk -v s="$2" 'BEGIN {
        for (i = 1; i <= 20; i++) {
            printf "{\"event\":\"step\",\"epoch\":%d,\"step\":%d,\"loss\":%.9g,\"lr\":0.05,\"grad_norm\":1.5,", int((i - 1) / 10), i, s * 2 / i
            printf "\"batch_hash\":\"%016x\",\"samples_per_s\":100.0,\"elapsed_s\":0.1,\"world_size\":1}\n", i
            if (i % 10 == 0) printf "{\"event\":\"epoch\",\"epoch\":%d,\"step\":%d,\"train_loss\":0.5,\"samples_per_s\":1.0,\"elapsed_s\":1.0,\"world_size\":1}\n", i / 10 - 1, i
        }
        print "{\"event\":\"rank\",\"step\":20,\"rank\":0,\"steps\":20,\"step_s\":0.1,\"data_s\":0.0,\"compute_s\":0.1,\"comm_s\":0.0,\"peak_mem_mb\":10.0,\"samples\":100}"
    }' > "$1"
}
metrics "$T/np1.jsonl" 1; cp "$T/np1.jsonl" "$T/np2.jsonl"; metrics "$T/other.jsonl" 1.5

# --text: the chart's shape, and what lies on top of what
"$D" plot --text --width 60 --height 15 "$T/np1.jsonl" "$T/np2.jsonl" > "$T/out" 2> "$T/err"
ok $? "plot --text of two runs exits 0"
rows=$(grep -cE '^ {0,10}[0-9.e+-]* \|' "$T/out"); [ "$rows" -eq 15 ]; ok $? "--height 15 gives 15 chart rows ($rows)"
axis=$(grep -E '^ +\+-+$' "$T/out" | tr -d ' +' | wc -c); [ "$axis" -eq 61 ]; ok $? "--width 60 gives a 60-column axis"
grep -E ' \|' "$T/out" | grep -q '#'; ok $? "identical runs share cells (#)"
! grep -E ' \|' "$T/out" | grep -q '[*+]'; ok $? "identical runs leave no cell of one run alone"
ok_grep "$T/out" '^ +1 +20  step$' "the x axis runs from step 1 to step 20"
ok_grep "$T/out" '^ +2 \|' "the top of the y axis is the largest loss (2)"
ok_grep "$T/out" '^\s+\* np1\.jsonl \(20 steps\)' "the legend names the first file"
ok_grep "$T/out" '^\s+\+ np2\.jsonl \(20 steps\)' "the legend names the second file"
"$D" plot --text "$T/np1.jsonl" "slower=$T/other.jsonl" > "$T/out" 2>&1
ok $? "plot --text with a LABEL=PATH argument"
grep -E ' \|' "$T/out" | grep -q '[*]' && grep -E ' \|' "$T/out" | grep -q '[+]'; ok $? "different runs show both marks"
ok_grep "$T/out" '^\s+\+ slower \(20 steps\)' "the legend uses the label"

# a file appended to by two runs: the last one is plotted, with a note
{ cat "$T/other.jsonl"; head -5 "$T/np1.jsonl"; } > "$T/two.jsonl"
"$D" plot --text "$T/two.jsonl" > "$T/out" 2> "$T/err"
ok $? "a file of two runs plots"
ok_grep "$T/err" 'holds 2 runs .*plotting the last' "it says so on stderr"
ok_grep "$T/out" 'two\.jsonl \(5 steps\)' "and plots the last run (5 steps)"

# PNG through gnuplot
if command -v gnuplot > /dev/null 2>&1; then
    "$D" plot "1 process=$T/np1.jsonl" "2 processes=$T/np2.jsonl" "$T/other.jsonl" -o "$T/loss.png" > "$T/out" 2>&1
    ok $? "plot -o loss.png exits 0"
    magic=$(head -c 8 "$T/loss.png" | od -An -tx1 | tr -d ' \n')
    [ "$magic" = "89504e470d0a1a0a" ]; ok $? "loss.png starts with the PNG signature ($magic)"
    size=$(wc -c < "$T/loss.png"); [ "$size" -gt 5000 ]; ok $? "loss.png is a real picture ($size bytes)"
    ok_grep "$T/out" "wrote .*loss.png \(3 runs\)" "it says what it wrote"
else
    skip "gnuplot not installed (Debian: gnuplot-nox)"; skip "gnuplot not installed"
    skip "gnuplot not installed"; skip "gnuplot not installed"
fi
GNUPLOT="$T/no-such-gnuplot" "$D" plot "$T/np1.jsonl" -o "$T/x.png" > "$T/out" 2> "$T/err"
[ $? -eq 1 ] && grep -q 'gnuplot-nox' "$T/err"; ok $? "without gnuplot: exit 1 naming the Debian package: $(cat "$T/err")"

# bad inputs: exit 2 and one clear line
bad() {  # bad "what" PATTERN ARGS...
    what=$1; pat=$2; shift 2
    "$D" plot "$@" > "$T/out" 2> "$T/err"; rc=$?
    [ $rc -eq 2 ] && [ "$(wc -l < "$T/err")" -eq 1 ] && grep -Eq -- "$pat" "$T/err"
    ok $? "$what -> exit 2 ($rc): $(cat "$T/err")"
}
grep -v '"event":"step"' "$T/np1.jsonl" > "$T/nosteps.jsonl"
sed '3s/"loss":[0-9.e+-]*/"loss":abc/' "$T/np1.jsonl" > "$T/broken.jsonl"
bad "a missing file" "missing\.jsonl: cannot open" "$T/missing.jsonl" -o "$T/x.png"
bad "a file with no step lines" "nosteps\.jsonl: no step lines" --text "$T/nosteps.jsonl"
bad "no -o and no --text" '-o: required' "$T/np1.jsonl"
bad "a malformed step line" 'broken\.jsonl:3: "loss": expected a number' --text "$T/broken.jsonl"
bad "no files" 'expected one or more metrics files' -o "$T/x.png"
bad "an unknown flag" "unknown flag '--frobnicate'" --frobnicate "$T/np1.jsonl"
bad "-o without a value" '-o' "$T/np1.jsonl" -o
[ ! -e "$T/x.png" ]; ok $? "no PNG is written after bad input"
# --val: validation losses (eval events every --eval-every steps, and epochs that evaluated)
{ for i in 1 2 3 4; do
      echo "{\"event\":\"step\",\"epoch\":0,\"step\":$((i * 10)),\"loss\":$((5 - i)).5,\"lr\":0.001}"
      echo "{\"event\":\"eval\",\"step\":$((i * 10)),\"val_loss\":$((5 - i)).25,\"val_acc\":0.1}"
  done
  echo '{"event":"epoch","epoch":0,"step":40,"train_loss":1.5,"test_loss":1.0,"test_acc":0.5}'
} > "$T/val.jsonl"
"$D" plot --val --text --width 40 --height 10 "$T/val.jsonl" > "$T/out" 2> "$T/err"
ok $? "plot --val --text exits 0"
ok_grep "$T/out" "^validation loss" "the chart is titled validation loss"
ok_grep "$T/out" "4\.25" "its scale starts at the first validation loss (4.25)"
"$D" plot --val --text "$T/np1.jsonl" > "$T/out" 2>&1
[ $? -eq 2 ]; ok $? "plot --val of a file without validation lines exits 2"
ok_grep "$T/out" "no validation lines \(write them with dtrain train --metrics FILE --eval-every N\)" "and says how to get them"
"$D" plot --help > "$T/out"; ok $? "plot --help exits 0"
done_testing
