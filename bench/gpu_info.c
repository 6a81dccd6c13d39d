/*
 * gpu_info.c: what bench/gpu.sh needs to know about the GPU and its libraries, as
 * key=value lines: device name, compute capability, SMs, peak clocks, memory, the
 * device count, the driver's and the runtime's CUDA versions, cuBLAS's version and
 * (built with -DDT_GPU_INFO_NCCL) NCCL's. Exit 1 with error=... when the runtime cannot
 * reach a device (no GPU, or a driver older than the runtime).
 *   cc -I$CUDA/include bench/gpu_info.c -L$CUDA/lib64 -lcublas -lcudart -o gpu_info
 */
#include <stdio.h>

#include <cublas_v2.h>
#include <cuda_runtime.h>
#ifdef DT_GPU_INFO_NCCL
#include <nccl.h>
#endif

static int attr(enum cudaDeviceAttr a, int dev) {
    int v = -1;
    if (cudaDeviceGetAttribute(&v, a, dev) != cudaSuccess) v = -1;
    return v;
}

int main(void) {
    int driver = 0, runtime = 0, n = 0;
    cudaDriverGetVersion(&driver);
    cudaRuntimeGetVersion(&runtime);
    printf("driver_cuda=%d.%d\nruntime_cuda=%d.%d\n", driver / 1000, driver % 1000 / 10, runtime / 1000,
           runtime % 1000 / 10);
    int maj = 0, min = 0, patch = 0;
    if (cublasGetProperty(MAJOR_VERSION, &maj) == CUBLAS_STATUS_SUCCESS && cublasGetProperty(MINOR_VERSION, &min) ==
        CUBLAS_STATUS_SUCCESS && cublasGetProperty(PATCH_LEVEL, &patch) == CUBLAS_STATUS_SUCCESS)
        printf("cublas=%d.%d.%d\n", maj, min, patch);
#ifdef DT_GPU_INFO_NCCL
    int nv = 0;
    if (ncclGetVersion(&nv) == ncclSuccess) printf("nccl=%d.%d.%d\n", nv / 10000, nv / 100 % 100, nv % 100);
#endif
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n < 1) {
        printf("error=%s\n", e != cudaSuccess ? cudaGetErrorName(e) : "no CUDA device is visible");
        return 1;
    }
    struct cudaDeviceProp p;
    if ((e = cudaGetDeviceProperties(&p, 0)) != cudaSuccess) {
        printf("error=cudaGetDeviceProperties: %s\n", cudaGetErrorName(e));
        return 1;
    }
    printf("devices=%d\ndevice=%s\ncc=%d.%d\nsms=%d\n", n, p.name, p.major, p.minor, p.multiProcessorCount);
    printf("sm_clock_mhz=%d\nmem_clock_mhz=%d\n", attr(cudaDevAttrClockRate, 0) / 1000,
           attr(cudaDevAttrMemoryClockRate, 0) / 1000);
    printf("mem_gib=%.1f\nl2_mib=%.0f\n", (double)p.totalGlobalMem / (1 << 30), (double)p.l2CacheSize / (1 << 20));
    return 0;
}
