#!/usr/bin/env bash
# bench/gpu_kit.sh: build, on a machine without a GPU, the one archive a lent GPU machine
# needs to run bench/gpu.sh without building: dtrain, dtrun, the CUDA op test, gpu_info and
# the bench scripts, with every library a GPU host may lack beside them.
#
#   bench/gpu_kit.sh [--nccl] [--mpi]        (also: make gpu-kit, bench/gpu.sh --kit)
#
# Builds --with-cuda --with-cuda-arch=$DT_GPU_ARCH (default 90) in a copy of the sources,
# $DT_GPU_KITDIR/src (default build-kit/src; make rebuilds only what changed), without MPI
# (--mpi: with it, if mpicc exists) and without NCCL (--nccl: with it, bundled). Then packs
# $DT_GPU_KITDIR/dtrain-gpu-kit.tar.gz (at most 40 MiB without NCCL), unpacking to
# dtrain-gpu-kit/:
#   dtrain dtrun gpu_info tests/test_cuda_ops   stripped; RUNPATH $ORIGIN/lib (../lib for
#                                               tests/), then /usr/local/cuda/lib64
#   lib/          what they need beyond the C and C++ runtimes and CUDA: OpenBLAS (+ gfortran,
#                 quadmath), libsodium, libgomp, zlib, each with RUNPATH $ORIGIN
#   bench/        the bench scripts; bench/gpu.sh there uses the kit's programs
#   KIT           how it was built (configuration, commit, the newest glibc and libstdc++
#                 symbol versions needed)
#   config.h      the build's configuration (bench/gpu.sh reads which backends are in)
# Why copied libraries with a RUNPATH rather than static linking: the kit's programs are
# then the very binaries the build linked and the tests ran, only their RUNPATH changed;
# static OpenBLAS would need its Fortran runtime and threads resolved by hand in a second
# link configuration, and `ldd` on the host shows plainly what each program loads.
# Never bundled: the CUDA driver (libcuda.so.1), cudart, cuBLAS and cuBLASLt (the GPU
# host's own, matched to its driver), glibc, libstdc++ and libgcc_s: Debian 12's libstdc++
# needs glibc 2.36 where the programs need 2.34 and GLIBCXX_3.4.29 (GCC 11), so a host of
# Ubuntu 22.04's age runs the kit with its own.
set -u
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/.." && pwd)
kd=${DT_GPU_KITDIR:-$src/build-kit}
arch=${DT_GPU_ARCH:-90}
nccl=--without-nccl mpi=--without-mpi
while [ $# -gt 0 ]; do
    case $1 in
        --nccl) nccl=--with-nccl ;;
        --mpi) mpi= ;;
        -h|--help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "bench/gpu_kit.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done
case $arch in ''|*[!0-9,]*) echo "bench/gpu_kit.sh: DT_GPU_ARCH expects SM versions like 90 or 80,90, got '$arch'" >&2; exit 2 ;; esac
[ -x /usr/local/cuda/bin/nvcc ] || { echo "bench/gpu_kit.sh: needs the CUDA toolkit in /usr/local/cuda (nvcc)" >&2; exit 1; }
command -v patchelf > /dev/null 2>&1 || { echo "bench/gpu_kit.sh: needs patchelf (apt-get install patchelf)" >&2; exit 1; }
jobs=$(nproc 2>/dev/null || echo 2)
B=$kd/src
name=dtrain-gpu-kit
K=$kd/$name

# ---- the build: a copy of the tracked files (their times kept, so make redoes only what changed)
t0=$SECONDS
echo "== build: $B (--with-cuda --with-cuda-arch=$arch $mpi $nccl)"
mkdir -p "$B" || exit 1
if git -C "$src" rev-parse --git-dir > /dev/null 2>&1; then
    git -C "$src" ls-files -z --cached --others --exclude-standard |
        (cd "$src" && tar --null --ignore-failed-read -T - -cf -) | tar -C "$B" -xf - || exit 1
else
    (cd "$src" && tar --exclude='./build*' --exclude=./.git -cf - .) | tar -C "$B" -xf - || exit 1
fi
want="--with-cuda --with-cuda-arch=$arch $mpi $nccl"
if ! [ -f "$B/Makefile" ] || [ "$(cat "$B/kit.configure" 2>/dev/null)" != "$want" ]; then
    (cd "$B" && ./autogen.sh > autogen.log 2>&1 && ./configure -q $want > configure.log 2>&1) ||
        { echo "configure FAILED:"; tail -20 "$B/autogen.log" "$B/configure.log" 2>/dev/null; exit 1; }
    echo "$want" > "$B/kit.configure"
fi
progs="dtrain dtrun tests/test_cuda_ops"
[ "$nccl" = --with-nccl ] && progs="$progs tests/gpu_nccl_prog"
(cd "$B" && make -j"$jobs" $progs > make.log 2>&1) || { echo "make FAILED:"; tail -30 "$B/make.log"; exit 1; }
mk() { sed -n "s/^$1 = //p" "$B/Makefile"; }
cc -std=c11 -O1 $(mk CUDA_CFLAGS) $(mk NCCL_CFLAGS) $([ -n "$(mk NCCL_LIBS)" ] && echo -DDT_GPU_INFO_NCCL) \
    "$here/gpu_info.c" -o "$B/gpu_info" $(mk NCCL_LIBS) $(mk CUDA_LIBS) || exit 1
echo "-- build: $((SECONDS - t0)) s"

# ---- the kit --------------------------------------------------------------------------
rm -rf "$K" && mkdir -p "$K/lib" "$K/tests" "$K/bench" || exit 1
for p in $progs gpu_info; do
    install -m 755 "$B/$p" "$K/$p" && strip --strip-unneeded "$K/$p" || exit 1
done
cp "$B/config.h" "$K/" && cp "$here"/*.sh "$here"/*.py "$here"/gpu_info.c "$K/bench/" || exit 1
[ "$nccl" = --with-nccl ] && { cp "$src/tests/gpu_nccl.sh" "$src/tests/gpu_lib.sh" "$src/tests/tap.sh" "$K/tests/" || exit 1; }
# What the programs load, less glibc, the CUDA driver and CUDA's runtime libraries; ldd
# follows the libraries' own needs, so OpenBLAS brings gfortran and quadmath.
keep() {
    case ${1##*/} in
        linux-vdso*|ld-linux*|libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|libresolv.so*|libutil.so*) return 1 ;;
        libstdc++.so*|libgcc_s.so*) return 1 ;;
        libcuda.so*|libcudart.so*|libcublas.so*|libcublasLt.so*) return 1 ;;
    esac
}
missing=$(cd "$K" && ldd $progs gpu_info | grep 'not found' | sort -u)
[ -z "$missing" ] || { echo "the programs need libraries this machine lacks:"; echo "$missing"; exit 1; }
for l in $(cd "$K" && ldd $progs gpu_info | awk '$2 == "=>" && $3 ~ /^\// { print $3 }' | sort -u); do
    keep "$l" || continue
    cp -L "$l" "$K/lib/${l##*/}" && chmod 644 "$K/lib/${l##*/}" && patchelf --set-rpath '$ORIGIN' "$K/lib/${l##*/}" || exit 1
done
for p in $progs gpu_info; do
    case $p in */*) o='$ORIGIN/../lib' ;; *) o='$ORIGIN/lib' ;; esac
    patchelf --set-rpath "$o:/usr/local/cuda/lib64" "$K/$p" || exit 1
done
newest() { (cd "$K" && objdump -T $progs gpu_info lib/*.so* 2>/dev/null) | grep -o "$1"'_[0-9.]*' | sort -V -u | tail -1; }
{
    echo "dtrain GPU kit: bench/gpu.sh in this folder runs the kit's programs without building"
    echo "built: $(date -u '+%Y-%m-%d %H:%M UTC') on $(. /etc/os-release && echo "$PRETTY_NAME")," \
         "commit $(git -C "$src" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$src" diff --quiet HEAD 2>/dev/null || echo ' (modified)')"
    echo "configure: $want"
    echo "NVCC_ARCH_FLAGS = $(mk NVCC_ARCH_FLAGS)"
    echo "CUDA: $(/usr/local/cuda/bin/nvcc --version | sed -n 's/.*release \([^,]*\),.*/\1/p'); the host needs" \
         "$(cd "$K" && ldd $progs gpu_info | awk '$1 ~ /^lib(cudart|cublas|cublasLt|cuda)\.so/ { print $1 }' | sort -u | tr '\n' ' ')"
    echo "needs: $(newest GLIBC) (glibc), $(newest GLIBCXX) (libstdc++) or newer"
    echo "bundled: $(cd "$K/lib" && ls | tr '\n' ' ')"
} > "$K/KIT"
tar -C "$kd" -czf "$kd/$name.tar.gz.tmp" "$name" && mv "$kd/$name.tar.gz.tmp" "$kd/$name.tar.gz" || exit 1
size=$(stat -c %s "$kd/$name.tar.gz")
echo "kit: $kd/$name.tar.gz, $((size / 1024 / 1024)) MiB ($size bytes); unpacked $(du -sh "$K" | cut -f1)"
sed 's/^/  /' "$K/KIT"
if [ "$nccl" != --with-nccl ] && [ "$size" -gt $((40 * 1024 * 1024)) ]; then
    echo "kit: larger than 40 MiB" >&2; exit 1
fi
echo "On the GPU machine: tar -xzf $name.tar.gz && OUT=\$OUT $name/bench/gpu.sh"
