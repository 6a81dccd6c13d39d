#!/bin/sh
# ranks_same_data.sh: every rank must train on the same data. A rank that read other
# data (here: another synthetic seed) is named at the start, on every rank, instead
# of the job silently training other weights; the same data passes.
. "${DT_SRCDIR:-$(dirname "$0")/..}/tests/tap.sh"
D="$DT_BUILDDIR/dtrain"; R="$DT_BUILDDIR/dtrun"
[ -x "$D" ] && [ -x "$R" ] || skip_all "dtrain or dtrun not built"
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
export D
timeout 120 "$R" -n 2 sh -c 'S=0; [ "$RANK" = 1 ] && S=7; exec "$D" train --data synthetic:512,1,8,8,4,64,$S --model mlp --epochs 1 --quiet' \
    > "$T/out" 2>&1
rc=$?
[ $rc -ne 0 ]; ok $? "rank 1 with other data: the job fails (exit $rc)"
ok_grep "$T/out" "rank 1 read other training data than rank 0 \(fingerprint [0-9a-f]{16}, rank 0 [0-9a-f]{16}\)" \
    "the message names the rank and both fingerprints"
timeout 120 "$R" -n 2 sh -c 'exec "$D" train --data synthetic:512,1,8,8,4,64,0 --model mlp --epochs 1 --quiet' > "$T/ok" 2>&1
ok $? "the same data on both ranks trains"
done_testing
