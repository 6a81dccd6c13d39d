#!/bin/sh
# gpu_kit.sh KIT.tar.gz: the GPU kit (bench/gpu_kit.sh) as a GPU host sees it. Unpacks it
# into a minimal root (chroot) that holds the C and C++ runtimes (Debian's libc6,
# libgcc-s1, libstdc++6, as dpkg lists them) and CUDA's runtime libraries (cudart,
# cuBLAS, cuBLASLt from /usr/local/cuda/lib64, hard-linked) and nothing else: no
# OpenBLAS, libsodium, MPI or NCCL. Inside it: the dynamic loader resolves every library
# of every kit program (what ldd does; the root has no shell), `dtrain --version` runs,
# and a 5-step CPU training of the mlp ends with a loss. Then, as a control, the same
# check on a copy of the kit without lib/libsodium.so.23 must see the library missing:
# a root that leaked the build machine's libraries would fail here. No driver in the
# root: the programs do not link libcuda.so.1 (cudart opens it when a GPU is used).
# Run by .ci/run after bench/gpu_kit.sh; needs root (chroot). TAP on stdout.
. "$(dirname "$0")/tap.sh"
kit=${1:?usage: tests/gpu_kit.sh KIT.tar.gz}
[ -f "$kit" ] || { echo "tests/gpu_kit.sh: no kit at $kit" >&2; exit 2; }
[ "$(id -u)" -eq 0 ] || skip_all "chroot needs root"
command -v dpkg > /dev/null 2>&1 || skip_all "the root is made from dpkg's file lists (Debian)"
R=$(mktemp -d)
# /proc is mounted in the root below: unmounted before the root is removed
trap 'umount "$R/proc" 2> /dev/null; mountpoint -q "$R/proc" 2> /dev/null || rm -rf "$R"' EXIT
cuda=/usr/local/cuda/lib64

# ---- the root: libc6, libgcc-s1, libstdc++6 and CUDA's runtime libraries -----------------
# (their files only: /lib, a link to usr/lib on a merged-/usr host, becomes a directory)
for p in libc6 libgcc-s1 libstdc++6; do dpkg -L "$p:amd64" 2> /dev/null || dpkg -L "$p"; done |
    while IFS= read -r f; do if [ ! -d "$f" ] && [ -e "$f" ]; then echo "${f#/}"; fi; done | sort -u > "$R/files"
tar -C / --no-recursion -T "$R/files" -cf - 2> /dev/null | tar -C "$R" -xf -
ok $? "root: $(wc -l < "$R/files") files of libc6, libgcc-s1, libstdc++6"
mkdir -p "$R$cuda" "$R/etc" "$R/tmp" "$R/dev" && chmod 1777 "$R/tmp"
n=0
for f in "$cuda"/libcudart.so.* "$cuda"/libcublas.so.* "$cuda"/libcublasLt.so.*; do
    [ -e "$f" ] || continue
    ln "$(readlink -f "$f")" "$R$cuda/${f##*/}" 2> /dev/null || cp -L "$f" "$R$cuda/${f##*/}" || exit 1
    n=$((n + 1))
done
[ "$n" -ge 3 ]
ok $? "root: CUDA's runtime libraries ($n files: $(cd "$R$cuda" && ls | tr '\n' ' '))"
: > "$R/dev/null" && chmod 666 "$R/dev/null"   # a file will do for what the programs write there
# every host has /proc, and the loader needs it: $ORIGIN of a program it is asked to run
# comes from /proc/self/exe
mkdir -p "$R/proc" && mount -t proc proc "$R/proc"
ok $? "root: /proc mounted"
echo "$cuda" > "$R/etc/ld.so.conf"
ldconfig -r "$R" 2> /dev/null
ls "$R"/lib*/*/libopenblas* "$R"/usr/lib*/*/libopenblas* "$R"/lib*/*/libsodium* "$R"/usr/lib*/*/libsodium* \
    "$R"/usr/lib*/*/libmpi* > "$R/leak" 2> /dev/null
[ ! -s "$R/leak" ]
ok $? "root: no OpenBLAS, libsodium or MPI in it"

tar -C "$R" -xzf "$kit"
k=/$(tar -tzf "$kit" | head -1 | cut -d/ -f1)
[ -x "$R$k/dtrain" ]
ok $? "the kit unpacks: $k ($(du -sh "$R$k" | cut -f1) unpacked from $(du -h "$kit" | cut -f1))"
progs=$(cd "$R$k" && ls dtrain dtrun gpu_info tests/test_cuda_ops tests/gpu_nccl_prog 2> /dev/null)

# ldd inside the root: the loader of the root lists what each program loads
loader=/lib64/ld-linux-x86-64.so.2
libs_of() {  # KITDIR: every kit program's libraries inside the root; status 1 when one is missing
    local p bad=0
    for p in $progs; do
        # a library missing: "not found", or the loader gives up naming it
        if ! chroot "$R" "$loader" --list "$1/$p" > "$R/ldd.out" 2>&1 || grep -q 'not found' "$R/ldd.out"; then
            bad=1; grep -E 'not found|error' "$R/ldd.out" | sed "s|^[[:space:]]*|# $p: |"
        fi
    done
    return $bad
}
libs_of "$k"
ok $? "inside the root, every library of $(echo $progs) is found"
chroot "$R" "$loader" --list "$k/dtrain" | grep -E 'openblas|sodium|cublas' | sed 's/^[[:space:]]*/# dtrain: /'

chroot "$R" "$k/dtrain" --version > "$R/version.out" 2>&1
ok $? "dtrain --version inside the root: $(head -1 "$R/version.out")"
chroot "$R" "$k/dtrain" train --model mlp --data synthetic:512,1,28,28,10 --steps 5 --threads 1 --no-eval \
    --metrics /tmp/m.jsonl > "$R/train.out" 2>&1
rc=$?
[ $rc -eq 0 ] && grep -q '"event":"step".*"loss"' "$R/tmp/m.jsonl"
ok $? "a 5-step CPU training of the mlp inside the root (exit $rc): $(grep '"event":"step"' "$R/tmp/m.jsonl" 2> /dev/null | tail -1 | sed -n 's/.*"loss":\([^,}]*\).*/loss \1/p')"
[ $rc -eq 0 ] || sed 's/^/#   /' "$R/train.out" | tail -10

# the control: a library taken out of the kit is seen missing
cp -a "$R$k" "$R$k-control" && rm -f "$R$k-control/lib/libsodium.so.23"
libs_of "$k-control" > "$R/control.out" 2>&1
[ $? -ne 0 ] && grep -q 'libsodium.so.23' "$R/control.out"
ok $? "control: without lib/libsodium.so.23 the same check reports it missing"
sed -n 's/^# //p' "$R/control.out" | head -2 | sed 's/^/#   control: /'
done_testing
