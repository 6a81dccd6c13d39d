#!/bin/sh
# dtrun_flags.sh: bad command lines get one clear line on stderr and exit 2; --help works.
. "$DT_SRCDIR/tests/tap.sh"
DTRUN="$DT_BUILDDIR/dtrun"
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT

# bad ARGS... / expected pattern in the message; ARGS ending in DTRUN_X run with DTRUN_X set
# to the bad value the pattern expects
bad() {
    pat=$1; shift
    case "$*" in
    *DTRUN_NNODES) DTRUN_NNODES=two timeout 10 "$DTRUN" -n 2 true > "$tmp/out" 2> "$tmp/err" ;;
    *DTRUN_TEE) DTRUN_TEE=yes timeout 10 "$DTRUN" -n 2 true > "$tmp/out" 2> "$tmp/err" ;;
    *) timeout 10 "$DTRUN" "$@" > "$tmp/out" 2> "$tmp/err" ;;
    esac
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
bad "^dtrun: --secure-transport: expected off, auth or encrypt, got 'yes'" -n 2 --secure-transport yes true
bad "^dtrun: unknown option '--bogus'" -n 2 --bogus true
bad "^dtrun: no program to run" -n 2
bad "^dtrun: no program to run" -n 2 --
bad "^dtrun: --nnodes: expected an integer in 1\.\.4096, got '0'" -n 2 --nnodes 0 true
bad "^dtrun: --node-rank 2: expected 0\.\.1 for --nnodes 2" -n 2 --nnodes 2 --node-rank 2 true
bad "^dtrun: --node-rank 1: expected 0\.\.0 for --nnodes 1" -n 2 --node-rank 1 true
bad "^dtrun: --rdzv-endpoint: expected HOST:PORT, got 'node0'" -n 2 --rdzv-endpoint node0 true
bad "^dtrun: --rdzv-endpoint \(the port\): expected an integer in 1\.\.65535, got 'x'" -n 2 --rdzv-endpoint node0:x true
bad "^dtrun: --max-restarts: expected an integer in 0\.\.1000000, got '-1'" -n 2 --max-restarts -1 true
bad "^dtrun: --monitor-interval: expected seconds" -n 2 --monitor-interval 0 true
bad "^dtrun: --heartbeat-timeout: expected seconds" -n 2 --heartbeat-timeout never true
bad "^dtrun: --rdzv-timeout: expected seconds" -n 2 --rdzv-timeout= true
bad "^dtrun: --ranks-filter: rank 2 is outside 0\.\.1 of this job, got '0,2'" -n 2 --ranks-filter 0,2 true
bad "^dtrun: --ranks-filter: expected ranks like 0,2-3, got '1-0'" -n 2 --ranks-filter 1-0 true
bad "^dtrun: --ranks-filter: expected ranks like 0,2-3, got 'a'" -n 2 --ranks-filter a true
bad "^dtrun: --run-id: expected an id without spaces, got 'a b'" -n 2 --run-id "a b" true
bad "^dtrun: --log-dir: missing value" -n 2 --log-dir
bad "^dtrun: DTRUN_NNODES: expected an integer in 1\.\.4096, got 'two'" -n 2 true DTRUN_NNODES
bad "^dtrun: DTRUN_TEE: expected 0 or 1, got 'yes'" -n 2 true DTRUN_TEE

timeout 10 "$DTRUN" --help > "$tmp/out" 2>&1
ok $? "--help exits 0"
for word in RANK LOCAL_RANK WORLD_SIZE LOCAL_WORLD_SIZE NODE_RANK MASTER_ADDR MASTER_PORT DT_JOB_ID \
            OMP_NUM_THREADS --nproc-per-node --master-addr --master-port --grace "failed first" "128\\+S" \
            --nnodes --node-rank --rdzv-endpoint --rdzv-timeout --max-restarts --monitor-interval \
            --heartbeat-timeout --log-dir --tee --ranks-filter --run-id DT_RESTART_COUNT DT_MAX_RESTARTS \
            DTRUN_NPROC_PER_NODE DTRUN_NNODES DTRUN_NODE_RANK DTRUN_MASTER_ADDR DTRUN_MASTER_PORT \
            DTRUN_RDZV_ENDPOINT DTRUN_MAX_RESTARTS DTRUN_LOG_DIR DTRUN_TEE DTRUN_RANKS_FILTER DTRUN_RUN_ID; do
    ok_grep "$tmp/out" "$word" "--help documents $word"
done

# Options after PROGRAM belong to PROGRAM.
timeout 10 "$DTRUN" -n1 echo -n 5 --bogus > "$tmp/out" 2>&1
ok $? "options after PROGRAM are passed to it"
ok_grep "$tmp/out" '^\[rank0\]:5 --bogus$' "the program got '-n 5 --bogus'"
done_testing
