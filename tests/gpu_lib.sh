# gpu_lib.sh: shared by the GPU shell tests (source it after tap.sh).
#   gpu_need_build          skip unless the build dir was configured --with-cuda
#   gpu_count               print the number of visible NVIDIA GPUs (0 when none or unknown)
#   gpu_absent_msg FILE     succeeds when FILE holds dtrain's "no usable device" message
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
