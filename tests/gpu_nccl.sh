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
run() {  # tag ranks args...
    t=$1 r=$2; shift 2
    timeout 240 "$B/dtrun" -n "$r" "$PROG" "$@" > "$TMP/$t.out" 2>&1
}
gpu_nccl_checks run "$n"
done_testing
