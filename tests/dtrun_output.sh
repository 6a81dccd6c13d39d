#!/bin/sh
# dtrun_output.sh: every line of every rank comes out whole, prefixed "[rankK]:", on the
# stream the rank wrote it to; partial lines are joined; a last line without newline is
# printed at EOF.
. "$DT_SRCDIR/tests/tap.sh"
DTRUN="$DT_BUILDDIR/dtrun"
command -v python3 > /dev/null || skip_all "python3 is needed to write long lines in pieces"
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT

# Two ranks each write 40 lines of 100000 characters (rank 0 'a', rank 1 'b') in
# 997-byte pieces with flushes between, far beyond a pipe's buffer, racing each other.
cat > "$tmp/long.py" <<'PY'
import os, sys
r = int(os.environ["RANK"])
c = "ab"[r].encode()
for i in range(40):
    line = c * 100000 + b"\n"
    for k in range(0, len(line), 997):
        os.write(1, line[k:k + 997])
PY
timeout 30 "$DTRUN" -n 2 python3 "$tmp/long.py" > "$tmp/out" 2> "$tmp/err"
ok $? "two ranks writing long lines exit 0"
test "$(wc -l < "$tmp/out")" -eq 80
ok $? "80 lines out"
# (length and character set rather than a{100000}: mawk has no interval expressions)
bad=$(awk '{ ok = length($0) == 100008 && ((/^\[rank0\]:/ && substr($0, 9) !~ /[^a]/) || (/^\[rank1\]:/ && substr($0, 9) !~ /[^b]/)) } !ok { n++ } END { print n + 0 }' "$tmp/out")
test "$bad" -eq 0
ok $? "every line is one rank's whole line with its prefix ($bad bad)"
test "$(grep -c '^\[rank0\]:' "$tmp/out")" -eq 40 && test "$(grep -c '^\[rank1\]:' "$tmp/out")" -eq 40
ok $? "40 lines from each rank"
test ! -s "$tmp/err"
ok $? "nothing on stderr"

# Partial lines, separate streams, a last line without newline, an empty line.
timeout 20 "$DTRUN" -n 2 sh -c 'printf "abc"; sleep 0.2; printf "def\n"; echo "to-err $RANK" >&2; echo; printf "tail$RANK"' \
    > "$tmp/out2" 2> "$tmp/err2"
ok $? "partial-line ranks exit 0"
ok_grep "$tmp/out2" '^\[rank0\]:abcdef$' "rank 0's pieces are joined into one line"
ok_grep "$tmp/out2" '^\[rank1\]:abcdef$' "rank 1's pieces are joined into one line"
ok_grep "$tmp/out2" '^\[rank1\]:tail1$' "a last line without newline is printed"
ok_grep "$tmp/out2" '^\[rank0\]:$' "an empty line keeps its prefix"
ok_grep "$tmp/err2" '^\[rank0\]:to-err 0$' "rank 0's stderr goes to stderr"
ok_grep "$tmp/err2" '^\[rank1\]:to-err 1$' "rank 1's stderr goes to stderr"
! grep -q 'to-err' "$tmp/out2"
ok $? "stderr lines do not appear on stdout"
test "$(wc -l < "$tmp/out2")" -eq 6
ok $? "six stdout lines (3 per rank)"

# dtrun's reader going away does not hang or kill the ranks' supervision.
timeout 20 "$DTRUN" -n 2 sh -c 'i=0; while [ $i -lt 2000 ]; do echo line $i; i=$((i+1)); done' | head -1 > "$tmp/out3"
ok_grep "$tmp/out3" '^\[rank[01]\]:line 0$' "output into a closed pipe: first line seen, no hang"
done_testing
