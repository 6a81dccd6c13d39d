#!/bin/sh
# dtrun_flags.sh: bad command lines get one clear line on stderr and exit 2; --help works.
. "$DT_SRCDIR/tests/tap.sh"
DTRUN="$DT_BUILDDIR/dtrun"
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT

# bad ARGS... / expected pattern in the message
bad() {
    pat=$1; shift
    timeout 10 "$DTRUN" "$@" > "$tmp/out" 2> "$tmp/err"
    rc=$?
    test "$rc" -eq 2 && test "$(wc -l < "$tmp/err")" -eq 1 && test ! -s "$tmp/out" && grep -Eq -- "$pat" "$tmp/err"
    r=$?
    ok $r "dtrun $* -> exit 2, one line matching '$pat'"
    [ $r -eq 0 ] || { diag "rc=$rc"; sed 's/^/#   /' "$tmp/err"; }
}
bad '^dtrun: -n N \(the number of ranks\) is required' true
bad '^dtrun: -n N \(the number of ranks\) is required'
bad "^dtrun: -n: expected an integer in 1\.\.4096, got 'abc'" -n abc true
bad "^dtrun: -n: expected an integer in 1\.\.4096, got '0'" -n 0 true
bad "^dtrun: -n: expected an integer in 1\.\.4096, got '-2'" -n -2 true
bad "^dtrun: -n: missing value" -n
bad "^dtrun: --nproc-per-node: expected an integer in 1\.\.4096, got '2x'" --nproc-per-node=2x true
bad "^dtrun: --master-port: expected an integer in 1\.\.65535, got '99999'" -n 2 --master-port 99999 true
bad "^dtrun: --master-addr: missing value" -n 2 --master-addr
bad "^dtrun: --grace: expected seconds" -n 2 --grace soon true
bad "^dtrun: unknown option '--bogus'" -n 2 --bogus true
bad "^dtrun: no program to run" -n 2
bad "^dtrun: no program to run" -n 2 --

timeout 10 "$DTRUN" --help > "$tmp/out" 2>&1
ok $? "--help exits 0"
for word in RANK LOCAL_RANK WORLD_SIZE LOCAL_WORLD_SIZE NODE_RANK MASTER_ADDR MASTER_PORT DT_JOB_ID \
            OMP_NUM_THREADS --nproc-per-node --master-addr --master-port --grace "failed first" "128\\+S"; do
    ok_grep "$tmp/out" "$word" "--help documents $word"
done

# Options after PROGRAM belong to PROGRAM.
timeout 10 "$DTRUN" -n1 echo -n 5 --bogus > "$tmp/out" 2>&1
ok $? "options after PROGRAM are passed to it"
ok_grep "$tmp/out" '^\[rank0\]:5 --bogus$' "the program got '-n 5 --bogus'"
done_testing
