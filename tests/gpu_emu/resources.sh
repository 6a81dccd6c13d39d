#!/bin/sh
# resources.sh OUT SRC...: what nvcc says each kernel of the CUDA sources uses, for the
# emulator's launch check (DT_GPU_EMU_RESOURCES, tests/gpu_emu/cuda_runtime.h): a line
# per kernel, "NAME<tab>REGISTERS<tab>STATIC_SHARED_BYTES", NAME as a launch names it
# ("k_ln_forward", "k_attn_forward<64, 32>"), the most over the architectures a build
# makes (sm_80 and sm_90, as configure's default; the GPU kit builds sm_90 alone). Each
# source is compiled as the build compiles it (nvcc -O3 --fmad=false), to a scratch
# object, with `--resource-usage`.
# nvcc: $NVCC, else on PATH, else /usr/local/cuda/bin/nvcc. Exit 77 when there is none,
# 1 (saying which source) when a compile fails or a kernel's line cannot be read.
# Needs DT_SRCDIR, DT_BUILDDIR (config.h) and c++filt.
# DT_GPU_EMU_CACHE (a directory, optional): the table is kept there, named by a digest of
# nvcc's version, this script, the sources and every header of src/ and tests/, and taken
# from there when the digest matches (CI checks the same kernels from two builds). config.h
# is left out of the digest: no kernel reads it (the builds differ in it, the kernels not).
S=${DT_SRCDIR:?} B=${DT_BUILDDIR:?} out=${1:?usage: resources.sh OUT SRC...}
shift
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
[ -x "$nvcc" ] || { echo "no nvcc (set NVCC)" >&2; exit 77; }
command -v c++filt > /dev/null 2>&1 || { echo "no c++filt" >&2; exit 77; }
cache=${DT_GPU_EMU_CACHE:-}
if [ -n "$cache" ]; then
    key=$( { "$nvcc" --version; cat "$0" "$@" "$S"/src/*.h "$S"/src/cuda/*.h "$S"/src/comm/*.h "$S"/tests/*.h \
             "$S"/tests/gpu_emu/*.h; } 2>/dev/null | sha256sum | cut -c1-32)
    if [ -s "$cache/resources-$key" ]; then
        cp "$cache/resources-$key" "$out" && exit 0
    fi
fi
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
for src in "$@"; do
    timeout 300 "$nvcc" -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 -O3 -std=c++17 \
        --fmad=false --resource-usage -I"$S/src/cuda" -I"$S/src" -I"$S/src/comm" -I"$S/tests" -I"$B" \
        -c "$src" -o "$tmp/scratch.o" > "$tmp/one.txt" 2>&1 ||
        { echo "nvcc failed on $src:" >&2; tail -20 "$tmp/one.txt" >&2; exit 1; }
    cat "$tmp/one.txt" >> "$tmp/all.txt"
done
# ptxas: "Compiling entry function 'MANGLED' for 'sm_90'", then (a few lines on) "Used R
# registers, ... [S bytes smem, ...]" for it
awk "/Compiling entry function/ { split(\$0, q, \"'\"); name = q[2]; next }
     /ptxas info *: Used [0-9]+ registers/ && name != \"\" {
         r = \$0; sub(/.*Used /, \"\", r); sub(/ registers.*/, \"\", r)
         s = 0; if (match(\$0, /[0-9]+ bytes smem/)) { s = substr(\$0, RSTART, RLENGTH); sub(/ .*/, \"\", s) }
         print name; print r; print s; name = \"\" }" "$tmp/all.txt" > "$tmp/raw" || exit 1
# demangle the names ("void k_attn_forward<64, 32>(attn_args)" -> "k_attn_forward<64, 32>"),
# then the most registers and shared memory per name
c++filt < "$tmp/raw" | awk '
    NR % 3 == 1 { n = $0; sub(/^void /, "", n); sub(/\(.*$/, "", n); sub(/^\(anonymous namespace\)::/, "", n); next }
    NR % 3 == 2 { r = $0 + 0; next }
    { s = $0 + 0
      if (n == "" || r <= 0) { bad = 1; exit }
      if (!(n in R) || r > R[n]) R[n] = r
      if (!(n in M) || s > M[n]) M[n] = s }
    END { if (bad || NR == 0) exit 1
          for (n in R) printf "%s\t%d\t%d\n", n, R[n], M[n] }' | sort > "$out" ||
    { echo "resources.sh: a kernel's resource line could not be read (nvcc's output changed?)" >&2; exit 1; }
[ -s "$out" ] || { echo "resources.sh: nvcc named no kernel" >&2; exit 1; }
[ -z "$cache" ] || { mkdir -p "$cache" && cp "$out" "$cache/resources-$key.tmp" && mv "$cache/resources-$key.tmp" "$cache/resources-$key"; } ||
    echo "resources.sh: could not keep the table in $cache (it is made again next time)" >&2
