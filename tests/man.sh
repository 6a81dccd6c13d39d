#!/bin/sh
# man.sh: the man pages `make` builds (dtrain.1, dtrun.1, dtbench.1, build-aux/help2man.sh)
# render with man -l, and every flag the programs' --help names (dtrain's for each of
# its commands) is in the rendered page: a flag added to a program, or a row added to
# src/options.c, reaches its page.
. "${DT_SRCDIR:-$(dirname "$0")/..}/tests/tap.sh"
B=$DT_BUILDDIR
command -v man > /dev/null || skip_all "man (man-db) is not installed"
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT

# page PROGRAM [COMMAND...]: render PROGRAM.1 and look for each flag of each help text
page() {
    prog=$1; shift
    [ -f "$B/$prog.1" ] || { ok 1 "$prog.1 was built"; return; }
    MANWIDTH=200 man -l "$B/$prog.1" > "$T/$prog.txt" 2> "$T/$prog.err"
    ok $? "man -l renders $prog.1"
    [ -s "$T/$prog.err" ] && diag "$(head -3 "$T/$prog.err")"
    for cmd in "" "$@"; do
        # shellcheck disable=SC2086
        "$B/$prog" $cmd --help > "$T/help" 2>&1
        flags=$(grep -oE '(^|[ ,[])--?[a-zA-Z][a-zA-Z0-9-]*' "$T/help" | sed 's/^[ ,[]*//' | sort -u)
        [ -n "$flags" ]; ok $? "$prog $cmd --help names flags"
        missing=""
        for f in $flags; do grep -qe "$f" "$T/$prog.txt" || missing="$missing $f"; done
        [ -z "$missing" ]; ok $? "every flag of $prog $cmd --help is in the page${missing:+ (missing:$missing)}"
    done
}
page dtrain train eval sample model check plan plot report prepare-text export
page dtrun
page dtbench
# the train options: one each from the three kinds of row (a value, a switch, a pair)
grep -q -- "--max-memory SIZE" "$T/dtrain.txt"; ok $? "dtrain.1 has --max-memory SIZE (a row of src/options.c)"
grep -q -- "--no-overlap" "$T/dtrain.txt"; ok $? "dtrain.1 has --no-overlap (a switch)"
grep -q -- "--betas B1,B2" "$T/dtrain.txt"; ok $? "dtrain.1 has --betas B1,B2 (a pair)"
done_testing
