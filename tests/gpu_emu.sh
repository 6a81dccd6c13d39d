#!/bin/sh
# gpu_emu.sh: the CUDA backend's kernels without a GPU. The four .cu files are compiled
# with g++ against stand-ins for the CUDA runtime and cuBLAS (tests/gpu_emu/: kernels
# become host functions, each block's threads run as cooperative fibers that switch at
# __syncthreads and meet at warp shuffles, GEMMs go to OpenBLAS column-major), launches
# <<<...>>> rewritten into calls (tests/gpu_emu_build.sh), and tests/test_cuda_ops runs
# against them: every op against the CPU backend, determinism, bad inputs. This checks
# index arithmetic, reduction trees, the cuBLAS operand order and the table on any
# machine; tests/test_cuda_ops on a GPU checks the real thing. The kernels are built
# twice, with grid caps of 3 and 1000 blocks, and both builds must give every output
# the same bytes (partitions fixed by the shape). In a --with-cuda build it also trains
# the mlp for 10 steps with dtrain --device cuda on the emulated kernels (dtrain's
# objects linked with them in place of the real backend), in fp32 and in bf16, and
# holds the losses against the cpu run's. Works in any build (needs g++ and libdtrain).
. "$DT_SRCDIR/tests/tap.sh"
S=$DT_SRCDIR
B=$DT_BUILDDIR
command -v g++ > /dev/null 2>&1 || skip_all "no g++"
[ -f "$B/.libs/libdtrain.so" ] || skip_all "no shared libdtrain in $B/.libs"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

fail() { echo "not ok 1 - $1"; sed 1d "$TMP/log" | sed 's/^/#   /' | head -30; echo "1..1"; exit 1; }
# the kernels (and, in a --with-cuda build, dtrain) on the stand-ins; then the same
# kernels with another grid cap (1000 blocks against 3), for section 3
cuda_build=
grep -q "define DT_HAVE_CUDA 1" "$B/config.h" 2>/dev/null && [ -x "$B/dtrain" ] && cuda_build=dtrain
"$S/tests/gpu_emu_build.sh" "$TMP" 3 $cuda_build 2> "$TMP/log"
[ -x "$TMP/test_cuda_emu" ] || fail "$(head -1 "$TMP/log")"
cp "$TMP/log" "$TMP/dtrain.log"
"$S/tests/gpu_emu_build.sh" "$TMP/cap" 1000 2> "$TMP/log" || fail "$(head -1 "$TMP/log")"

# 1. every op against the cpu backend (test_cuda_ops's own TAP lines, numbered on);
#    the build with the other grid cap runs beside it, writing a hash of every output
DT_CUDA_TEST_EMU=1 DT_CUDA_TEST_DUMP="$TMP/cap.dump" timeout 300 "$TMP/cap/test_cuda_emu" > "$TMP/cap.out" 2>&1 &
cap_pid=$!
DT_CUDA_TEST_EMU=1 DT_CUDA_TEST_DUMP="$TMP/ops.dump" timeout 300 "$TMP/test_cuda_emu" > "$TMP/ops.out" 2>&1
rc=$?
wait $cap_pid
cap_rc=$?
grep -v '^1\.\.' "$TMP/ops.out"
tap_n=$(grep -cE '^(not )?ok' "$TMP/ops.out")
tap_failed=$(grep -c '^not ok' "$TMP/ops.out")
[ $rc -eq 0 ] || [ "$tap_failed" -gt 0 ] || ok 1 "test_cuda_ops under emulation exited with $rc"

# 2. with a --with-cuda build: dtrain train --device cuda on the emulated kernels
#    (tests/gpu_emu_build.sh links dtrain's objects with them) follows the cpu run's losses.
if [ -n "$cuda_build" ]; then
    [ -x "$TMP/dtrain_emu" ]
    rc=$?
    ok $rc "dtrain links with the stand-in in place of the CUDA backend"
    [ $rc -eq 0 ] || sed 's/^/#   /' "$TMP/dtrain.log" | head -20
    # fp32, and bf16 (round_to and cublasGemmEx's gemm_lp in training)
    for p in fp32 bf16; do
        for d in cpu cuda; do
            rm -f "$TMP/mark" "$TMP/$d.jsonl"   # --metrics appends
            DT_GPU_EMU_MARK="$TMP/mark" timeout 120 "$TMP/dtrain_emu" train --device $d --model mlp \
                --data synthetic:512,1,28,28,10 --steps 10 --batch 32 --seed 5 --log-every 1 --precision $p \
                --metrics "$TMP/$d.jsonl" --no-eval --quiet --threads 1 > "$TMP/$d.out" 2>&1
            ok $? "dtrain train --device $d --precision $p (mlp, 10 steps)"
            [ -f "$TMP/mark" ] && used=1 || used=0
            [ $used -eq $([ $d = cuda ] && echo 1 || echo 0) ]
            ok $? "the $d run $([ $d = cuda ] && echo used || echo did not touch) the emulated device"
            sed -n 's/.*"event":"step".*"loss":\([^,}]*\).*/\1/p' "$TMP/$d.jsonl" > "$TMP/$d.loss"
        done
        worst=$(paste "$TMP/cpu.loss" "$TMP/cuda.loss" | awk '{ d = $1 - $2; if (d < 0) d = -d; r = d / ($1 < 0 ? -$1 : $1);
                                                            if (r > w) w = r } END { if (NR != 10) print "missing"; else printf "%.3g", w + 0 }')
        awk -v w="$worst" 'BEGIN { exit !(w != "missing" && w <= 1e-4) }'
        ok $? "$p: emulated cuda losses within 1e-4 relative of the cpu's (worst $worst)"
    done
else
    skip "not a --with-cuda build: dtrain --device cuda on the emulated kernels"
fi

# 3. no result depends on the grid: the build capped at 1000 blocks passes too and gives
#    every output of every case the bytes of the build capped at 3
[ $cap_rc -eq 0 ] && ! grep -q '^not ok' "$TMP/cap.out"
ok $? "test_cuda_ops passes with a grid cap of 1000 blocks too (exit $cap_rc)"
[ $cap_rc -eq 0 ] || grep -A3 '^not ok' "$TMP/cap.out" | head -20 | sed 's/^/#   /'
[ -s "$TMP/ops.dump" ] && [ "$(wc -l < "$TMP/ops.dump")" -gt 100 ] && cmp -s "$TMP/ops.dump" "$TMP/cap.dump"
ok $? "grid caps 3 and 1000 give the same bytes in all $(wc -l < "$TMP/ops.dump") device outputs"
diff "$TMP/ops.dump" "$TMP/cap.dump" | head -10 | sed 's/^/#   /'
done_testing
