#!/bin/sh
# gpu_emu.sh: the CUDA backend's kernels without a GPU. The five .cu files are compiled
# with g++ against stand-ins for the CUDA runtime and cuBLAS (tests/gpu_emu/: kernels
# become host functions, each block's threads run as cooperative fibers that switch at
# __syncthreads, GEMMs go to OpenBLAS column-major), launches <<<...>>> rewritten into
# calls, and tests/test_cuda_ops runs against them: every op against the CPU backend,
# determinism, bad inputs. This checks index arithmetic, reduction trees, the cuBLAS
# operand order and the table on any machine; tests/test_cuda_ops on a GPU checks the
# real thing. In a --with-cuda build it also trains the mlp for 10 steps with
# dtrain --device cuda on the emulated kernels (dtrain's objects linked with them in
# place of the real backend), in fp32 and in bf16, and holds the losses against the cpu
# run's. Works in any build (needs g++ and libdtrain).
. "$DT_SRCDIR/tests/tap.sh"
S=$DT_SRCDIR
B=$DT_BUILDDIR
command -v g++ > /dev/null 2>&1 || skip_all "no g++"
[ -f "$B/.libs/libdtrain.so" ] || skip_all "no shared libdtrain in $B/.libs"
blas_cflags=$(sed -n 's/^OPENBLAS_CFLAGS = //p' "$B/Makefile")
blas_libs=$(sed -n 's/^OPENBLAS_LIBS = //p' "$B/Makefile")
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

fail() { echo "not ok 1 - $1"; sed 's/^/#   /' "$TMP/log" | head -30; echo "1..1"; exit 1; }
cxx="g++ -std=c++17 -O1 -fPIC -I$S/tests/gpu_emu $blas_cflags"
for f in cuda_ops cuda_elem cuda_nn cuda_seq cuda_lowp; do
    sed 's/\([A-Za-z_][A-Za-z_0-9]*\)<<<\(.*\)>>>(/emu_cfg(\2).run(\1)(/' "$S/src/cuda/$f.cu" > "$TMP/$f.cpp"
    if grep -n '<<<' "$TMP/$f.cpp" > "$TMP/log"; then fail "a kernel launch in $f.cu was not rewritten"; fi
    timeout 300 $cxx -DDT_CU_MAX_BLOCKS=3 -I"$S/src/cuda" -I"$S/src" -I"$S/src/comm" -I"$B" \
        -c "$TMP/$f.cpp" -o "$TMP/$f.o" > "$TMP/log" 2>&1 || fail "compile $f.cu for the CPU"
done
timeout 120 $cxx -c "$S/tests/gpu_emu/emu.cpp" -o "$TMP/emu.o" > "$TMP/log" 2>&1 || fail "compile the CUDA stand-in"
timeout 120 gcc -std=c11 -O1 -I"$S/src" -I"$S/tests" -I"$B" -c "$S/tests/test_cuda_ops.c" -o "$TMP/test.o" \
    > "$TMP/log" 2>&1 || fail "compile tests/test_cuda_ops.c"
timeout 120 g++ -o "$TMP/test_cuda_emu" "$TMP"/*.o -L"$B/.libs" -ldtrain $blas_libs -lm -Wl,-rpath,"$B/.libs" \
    > "$TMP/log" 2>&1 || fail "link the emulated test"

# 1. every op against the cpu backend (test_cuda_ops's own TAP lines, numbered on)
DT_CUDA_TEST_EMU=1 timeout 300 "$TMP/test_cuda_emu" > "$TMP/ops.out" 2>&1
rc=$?
grep -v '^1\.\.' "$TMP/ops.out"
tap_n=$(grep -cE '^(not )?ok' "$TMP/ops.out")
tap_failed=$(grep -c '^not ok' "$TMP/ops.out")
[ $rc -eq 0 ] || [ "$tap_failed" -gt 0 ] || ok 1 "test_cuda_ops under emulation exited with $rc"

# 2. with a --with-cuda build: dtrain train --device cuda on the emulated kernels follows
#    the cpu run's losses. dtrain links libdtrain_core statically, so nothing can be
#    preloaded over its backend: its objects are linked again, with the emulated kernels
#    ahead of the archive, which then has no reason to pull in the real ones.
if grep -q "define DT_HAVE_CUDA 1" "$B/config.h" 2>/dev/null && [ -x "$B/dtrain" ]; then
    objs=$(awk '/^am_dtrain_OBJECTS =/ { on = 1; sub(/^[^=]*=/, "") }
                on { more = sub(/\\$/, ""); print; if (!more) exit }' "$B/Makefile" | sed 's/\$(OBJEXT)/o/g')
    (cd "$B" && ./libtool --mode=link --tag=CXX g++ -o "$TMP/dtrain_emu" $objs "$TMP"/cuda_*.o "$TMP/emu.o" \
        libdtrain_core.la) > "$TMP/log" 2>&1
    rc=$?
    ok $rc "dtrain links with the stand-in in place of the CUDA backend"
    [ $rc -eq 0 ] || sed 's/^/#   /' "$TMP/log" | head -20
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
done_testing
