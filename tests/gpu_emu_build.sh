#!/bin/sh
# gpu_emu_build.sh OUT [CAP [dtrain]]: the CUDA backend's kernels built for the CPU with
# the stand-ins of tests/gpu_emu/ (kernels become host functions, each block's threads
# cooperative fibers; see tests/gpu_emu.sh), into OUT:
#   OUT/test_cuda_emu   tests/test_cuda_ops on the emulated kernels
#   OUT/dtrain_emu      dtrain with the emulated kernels in place of the real backend
#                       (third argument "dtrain"; needs a --with-cuda build)
# CAP is the grid cap DT_CU_MAX_BLOCKS the kernels are compiled with (default 3).
# Needs DT_SRCDIR and DT_BUILDDIR (a build with .libs/libdtrain.so), g++ and gcc.
# On failure: exit 1, the first line of stderr saying what failed, then the compiler's
# output. Used by tests/gpu_emu.sh and bench/gpu.sh --emulate.
S=${DT_SRCDIR:?} B=${DT_BUILDDIR:?} O=${1:?usage: gpu_emu_build.sh OUT [CAP [dtrain]]} cap=${2:-3}
die() { echo "$1" >&2; cat "$O/build.log" >&2; exit 1; }
mkdir -p "$O" || exit 1
blas_cflags=$(sed -n 's/^OPENBLAS_CFLAGS = //p' "$B/Makefile")
blas_libs=$(sed -n 's/^OPENBLAS_LIBS = //p' "$B/Makefile")
cxx="g++ -std=c++17 -O1 -fPIC -I$S/tests/gpu_emu $blas_cflags"
# cu SRC NAME: a CUDA source compiled for the CPU into OUT/NAME.o (launches rewritten by
# tests/gpu_emu/cu2cpp.sh)
cu() {
    sh "$S/tests/gpu_emu/cu2cpp.sh" "$1" > "$O/$2.cpp"
    if grep -n '<<<' "$O/$2.cpp" > "$O/build.log"; then die "a kernel launch in $1 was not rewritten"; fi
    timeout 300 $cxx -DDT_CU_MAX_BLOCKS="$cap" -I"$S/src/cuda" -I"$S/src" -I"$S/src/comm" -I"$S/tests" -I"$B" \
        -c "$O/$2.cpp" -o "$O/$2.o" > "$O/build.log" 2>&1 || die "compile $1 for the CPU (grid cap $cap)"
}
for f in "$S"/src/cuda/*.cu; do cu "$f" "cuda_$(basename "$f" .cu)"; done
timeout 120 $cxx -I"$S/src" -c "$S/tests/gpu_emu/emu.cpp" -o "$O/emu.o" > "$O/build.log" 2>&1 || die "compile the CUDA stand-in"
timeout 120 gcc -std=c11 -O1 -I"$S/src" -I"$S/tests" -I"$B" -c "$S/tests/test_cuda_ops.c" -o "$O/test.o" \
    > "$O/build.log" 2>&1 || die "compile tests/test_cuda_ops.c"
timeout 120 g++ -o "$O/test_cuda_emu" "$O"/cuda_*.o "$O/emu.o" "$O/test.o" -L"$B/.libs" -ldtrain $blas_libs -lm \
    -Wl,-rpath,"$B/.libs" > "$O/build.log" 2>&1 || die "link the emulated test"
[ "${3:-}" = dtrain ] || exit 0

# dtrain links libdtrain_core statically, so nothing can be preloaded over its backend:
# its objects are linked again, with the emulated kernels (and NCCL, in a --with-nccl
# build) ahead of the archive, which then has no reason to pull in the real ones.
grep -q "define DT_HAVE_CUDA 1" "$B/config.h" 2>/dev/null && [ -x "$B/dtrain" ] ||
    { : > "$O/build.log"; die "not a --with-cuda build: no dtrain to link with the emulated kernels"; }
extra=
if grep -q "define DT_HAVE_NCCL 1" "$B/config.h" 2>/dev/null; then
    timeout 120 $cxx -I"$S/src" -I"$S/src/comm" -I"$B" -c "$S/tests/gpu_emu/nccl_emu.cpp" -o "$O/nccl_emu.o" \
        > "$O/build.log" 2>&1 || die "compile the NCCL stand-in"
    timeout 120 gcc -std=c11 -O1 -fPIC -I"$S/tests/gpu_emu" -I"$S/src" -I"$S/src/comm" -I"$B" \
        -c "$S/src/comm/nccl.c" -o "$O/nccl.o" > "$O/build.log" 2>&1 || die "compile src/comm/nccl.c against the stand-in"
    extra="$O/nccl.o $O/nccl_emu.o"
fi
objs=$(awk '/^am_dtrain_OBJECTS =/ { on = 1; sub(/^[^=]*=/, "") }
            on { more = sub(/\\$/, ""); print; if (!more) exit }' "$B/Makefile" | sed 's/\$(OBJEXT)/o/g')
(cd "$B" && ./libtool --mode=link --tag=CXX g++ -o "$O/dtrain_emu" $objs "$O"/cuda_*.o "$O/emu.o" $extra \
    libdtrain_core.la) > "$O/build.log" 2>&1 || die "link dtrain with the stand-in in place of the CUDA backend"
