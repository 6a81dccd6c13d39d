#!/bin/sh
# gpu_nccl.sh: the "nccl" backend on device buffers, one process per GPU (dtrun -n W,
# W = the visible GPUs, at most 4): every collective x type x operator, in and out of
# place, send/recv, split, async (tests/gpu_nccl_prog --mode all), the same in
# deterministic mode (host staging over dtrain's own tree), and the rule-3 errors: a
# mismatched collective and a rank that never arrives. Needs 2 or more GPUs and a
# --with-nccl build; skips otherwise, saying why.
. "$DT_SRCDIR/tests/tap.sh"
. "$DT_SRCDIR/tests/gpu_lib.sh"
gpu_need_build
grep -q "define DT_HAVE_NCCL 1" "$B/config.h" 2>/dev/null || skip_all "not configured --with-nccl"
PROG="$B/tests/gpu_nccl_prog"
[ -x "$PROG" ] || skip_all "gpu_nccl_prog is not built"
n=$(gpu_count)
[ "$n" -ge 2 ] || skip_all "needs 2 or more GPUs, $n visible (nvidia-smi -L, CUDA_VISIBLE_DEVICES)"
[ "$n" -gt 4 ] && n=4
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
run() {  # tag args...
    t=$1; shift
    timeout 240 "$B/dtrun" -n "$n" "$PROG" "$@" > "$TMP/$t.out" 2>&1
}

run all --mode all; rc=$?
grep '^\[rank0\]:.*ok ' "$TMP/all.out" | sed 's/^\[rank0\]: //; s/^/# /' | tail -3
ok $rc "$n ranks: every collective on device buffers is exact"
[ $rc -eq 0 ] || grep -v ' ok ' "$TMP/all.out" | tail -8 | sed 's/^/#   /'
DT_DETERMINISTIC=1 run det --mode all; rc=$?
ok $rc "$n ranks, deterministic mode: the same checks through dtrain's own tree"
[ $rc -eq 0 ] || grep -v ' ok ' "$TMP/det.out" | tail -8 | sed 's/^/#   /'
run mismatch --mode mismatch
ok $? "a mismatched collective is DT_ERR_MISMATCH naming both calls on every rank"
ok_grep "$TMP/mismatch.out" "all_reduce.*broadcast|broadcast.*all_reduce" "the message names all_reduce and broadcast"
n=2 run timeout --mode timeout
ok $? "a rank that never arrives: the others time out"
ok_grep "$TMP/timeout.out" "rank 1" "the timeout names rank 1"
done_testing
