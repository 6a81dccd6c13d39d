# gpu_lib.sh: shared by the GPU shell tests (source it after tap.sh).
#   gpu_need_build          skip unless the build dir was configured --with-cuda
#   gpu_count               print the number of visible NVIDIA GPUs (0 when none or unknown)
#   gpu_absent_msg FILE     succeeds when FILE holds dtrain's "no usable device" message
#   gpu_probe_failed FILE   a GPU probe failed with FILE's message: skip the file when no
#                           GPU is there, fail it when nvidia-smi lists one (an insufficient
#                           driver or a broken install must not pass as "no GPU")
B=$DT_BUILDDIR
gpu_need_build() {
    grep -q "define DT_HAVE_CUDA 1" "$B/config.h" 2>/dev/null || skip_all "not configured --with-cuda"
}
gpu_count() {
    if ! command -v nvidia-smi > /dev/null 2>&1; then echo 0; return; fi
    n=$(timeout 20 nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
    if [ -n "${CUDA_VISIBLE_DEVICES+x}" ]; then
        v=$(echo "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | grep -c .)
        [ "$v" -lt "$n" ] && n=$v
    fi
    echo "$n"
}
gpu_absent_msg() {
    grep -Eq "no CUDA device|cudaGetDeviceCount|cudaErrorInsufficientDriver|cudaErrorNoDevice|no CUDA backend" "$1"
}
gpu_probe_failed() {
    n=$(gpu_count)
    if [ "$n" -gt 0 ]; then
        echo "not ok 1 - nvidia-smi lists $n GPU(s) but dtrain cannot use them: $(tail -n 1 "$1")"
        echo "1..1"
        exit 1
    fi
    skip_all "no usable GPU: $(tail -n 1 "$1")"
}
# gpu_nccl_checks RUN W: tests/gpu_nccl_prog's modes, each through `RUN TAG RANKS ARGS...`
# (a function that starts the program on RANKS ranks, its output in $TMP/TAG.out), on W ranks
gpu_nccl_checks() {
    run=$1 w=$2
    $run all "$w" --mode all; rc=$?
    ok $rc "$w ranks: every collective on device buffers is exact ($(grep -c '^\[rank0\]:ok' "$TMP/all.out") checks)"
    [ $rc -eq 0 ] || grep -v ':ok ' "$TMP/all.out" | tail -8 | sed 's/^/#   /'
    DT_DETERMINISTIC=1 $run det "$w" --mode all; rc=$?
    ok $rc "$w ranks, deterministic mode: the same checks through dtrain's own tree"
    [ $rc -eq 0 ] || grep -v ':ok ' "$TMP/det.out" | tail -8 | sed 's/^/#   /'
    for det in 0 1; do
        DT_DETERMINISTIC=$det $run every$det "$w" --mode every; rc=$?
        ok $rc "$w ranks$([ $det = 1 ] && echo ', deterministic mode'): every collective of the list (tests/coll_cases.h) on device buffers ($(grep -c '^\[rank0\]:ok' "$TMP/every$det.out") checks)"
        [ $rc -eq 0 ] || grep -v ':ok ' "$TMP/every$det.out" | tail -8 | sed 's/^/#   /'
    done
    DT_DETERMINISTIC=1 $run tree "$w" --mode tree; rc=$?
    ok $rc "$w ranks, deterministic mode: all_reduce is dtrain's tree bit for bit (f32, f64, f16, bf16)"
    [ $rc -eq 0 ] || grep -v ':ok ' "$TMP/tree.out" | tail -8 | sed 's/^/#   /'
    $run host "$w" --mode host; rc=$?
    ok $rc "$w ranks: the same on host buffers (over the tcp side channel); mixed and disagreeing kinds refused"
    [ $rc -eq 0 ] || grep -v ':ok ' "$TMP/host.out" | tail -8 | sed 's/^/#   /'
    $run mismatch "$w" --mode mismatch
    ok $? "a mismatched collective is DT_ERR_MISMATCH naming both calls on every rank"
    ok_grep "$TMP/mismatch.out" "all_reduce.*broadcast|broadcast.*all_reduce" "the message names all_reduce and broadcast"
    $run timeout 2 --mode timeout
    ok $? "a rank that never arrives: the others time out"
    ok_grep "$TMP/timeout.out" "rank 1" "the timeout names rank 1"
}
