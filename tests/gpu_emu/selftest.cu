/*
 * gpu_emu/selftest.cu: the CUDA stand-in's own test (tests/gpu_emu.sh compiles it with
 * g++ as it does the backend): the mistakes a GPU punishes and a CPU forgives must fail
 * here too, each naming the call.
 *
 *   selftest            launch-configuration errors, lazy streams (a missing wait reads
 *                       stale data, an event wait or a synchronisation the fresh data),
 *                       copies against their kind, pointer attributes, NCCL on a
 *                       one-rank communicator with device buffers and with a host buffer
 *   selftest kernel     a kernel given a host pointer: a sticky cudaErrorIllegalAddress
 *                       naming the kernel and the argument
 *   selftest cublas     cublasSgemm given a host matrix: the same, naming the matrix
 *   selftest divergent  a __syncthreads that thread 0 never reaches: the emulation stops
 *                       (abort), naming the kernel
 *   selftest order      a kernel that reads another thread's shared memory without the
 *                       barrier between (right only when threads run in index order) and
 *                       the same with it: under DT_GPU_EMU_ORDER=reverse or shuffle the first
 *                       fails, the second never
 *   selftest unaligned  a float4 load from an address 16 bytes apart passes, one from 4
 *                       bytes further stops the program (tests/gpu_emu.sh builds with
 *                       -fsanitize=alignment), naming the address and the type
 *   selftest overrun    a kernel that writes one float past the end of its allocation:
 *                       under AddressSanitizer (tests/gpu_emu.sh's build of the kernels
 *                       and the stand-in with it) a heap-buffer-overflow naming the kernel
 *   selftest eager      the host writes a pinned buffer again after queuing a copy from
 *                       it, before the copy is known done (a race): the copy carries the
 *                       second value when work runs late (the default: the bug unseen), the
 *                       first under DT_GPU_EMU_EAGER=1 (caught)
 *   selftest resources  with DT_GPU_EMU_RESOURCES (nvcc's table): a kernel of many
 *                       registers launched with 1024 threads, and one of 40 KiB static
 *                       shared memory given 12 KiB dynamic, refused as a GPU would; the
 *                       smaller launches and a template's instance (its name from the
 *                       launch) run; without the table all run
 *   selftest hazard CALL
 *                       CALL (cudaFree, cudaFreeHost, cudaMalloc, cuMemUnmap) made while
 *                       another thread has an NCCL all-reduce queued: the emulation stops
 *                       (abort), naming both; the same call made by the thread that queued
 *                       it, or after the other's work ran, passes (`selftest hazard none`)
 * (a sticky error ends the process's use of the device, hence one run each)
 */
#include <cuda.h>
#include <cuda_runtime.h>
#include <cublas_v2.h>
#include <nccl.h>
#include <pthread.h>

#include "tap.h"

__global__ void k_copy(float *dst, const float *src, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) dst[i] = src[i];
}

__global__ void __launch_bounds__(64) k_small(float *dst, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) dst[i] = 1.0f;
}

/* one float4 per thread: src must be 16-byte aligned, as on a GPU */
__global__ void k_load4(float *dst, const float *src) {
    const float4 q = reinterpret_cast<const float4 *>(src)[threadIdx.x];
    dst[threadIdx.x] = q.x + q.y + q.z + q.w;
}

/* one thread too many: thread n writes past the end of dst's n floats */
__global__ void k_overrun(float *dst, int n) {
    if (threadIdx.x <= n) dst[threadIdx.x] = 1.0f;
}

/* thread 0 skips the barrier the others reach: undefined on a GPU */
__global__ void k_divergent(float *dst) {
    if (threadIdx.x > 0) {
        __syncthreads();
        dst[threadIdx.x] = 1.0f;
    }
}

/* each thread's left neighbour's value: the barrier between the write and the read is
 * missing in k_racy (a GPU runs the threads in no promised order) */
__global__ void k_racy(float *dst) {
    __shared__ float s[64];
    s[threadIdx.x] = (float)(blockIdx.x * 64 + threadIdx.x);
    dst[blockIdx.x * 64 + threadIdx.x] = threadIdx.x ? s[threadIdx.x - 1] + 1.0f : s[0];
}

__global__ void k_shift(float *dst) {
    __shared__ float s[64];
    s[threadIdx.x] = (float)(blockIdx.x * 64 + threadIdx.x);
    __syncthreads();
    dst[blockIdx.x * 64 + threadIdx.x] = threadIdx.x ? s[threadIdx.x - 1] + 1.0f : s[0];
}

/* many registers a thread (nvcc gives it over 96: every value stays live until their sum
 * is known) and no __launch_bounds__: 1024 threads a block need more than a GPU has */
enum { HEAVY = 96 };
__global__ void k_heavy(float *dst, const float *src) {
    float v[HEAVY], s = 0.0f;
    const unsigned n = blockDim.x, t = threadIdx.x;
#pragma unroll
    for (int j = 0; j < HEAVY; j++) v[j] = src[j * n + t];
#pragma unroll
    for (int j = 0; j < HEAVY; j++) s += v[j] * v[j];
#pragma unroll
    for (int j = 0; j < HEAVY; j++) dst[j * n + t] = v[j] / s;
}

/* 40 KiB of static shared memory: with more than 8 KiB dynamic asked beside it (the
 * launch's third argument; the stand-in has no dynamic shared memory to use), over 48 KiB */
__global__ void k_bigshared(float *dst) {
    __shared__ float s[10240];
    s[threadIdx.x] = (float)threadIdx.x;
    __syncthreads();
    dst[threadIdx.x] = s[31 - threadIdx.x];
}

/* a kernel template, launched by instance: the table names it "k_tmpl<2, 3>" */
template <int A, int B> __global__ void k_tmpl(float *dst) { dst[threadIdx.x] = (float)(A * B); }
template <int A, int B> __global__ void k_tmpl2(float *dst) { dst[threadIdx.x] = (float)(A + B); }

static const int N = 1000;

static float *dev(void) {
    float *p = NULL;
    cudaMalloc((void **)&p, N * sizeof(float));
    return p;
}

/* Copy device src to the host and say whether it holds 0, 1, 2, ... */
static int holds_iota(const float *src, cudaStream_t s) {
    static float h[N];
    cudaMemcpyAsync(h, src, sizeof h, cudaMemcpyDeviceToHost, s);
    cudaStreamSynchronize(s);
    for (int i = 0; i < N; i++)
        if (h[i] != (float)i) return 0;
    return 1;
}

/* The first 512 floats of device src are 0, 1, 2, ... */
static int iota512(const float *src) {
    static float h[512];
    cudaMemcpy(h, src, sizeof h, cudaMemcpyDeviceToHost);
    for (int i = 0; i < 512; i++)
        if (h[i] != (float)i) return 0;
    return 1;
}

static void test_config(void) {
    float *a = dev(), *b = dev();
    k_copy<<<1, 2048, 0, 0>>>(a, b, N);
    cudaError_t e = cudaGetLastError();
    is_int(e, cudaErrorInvalidConfiguration, "a block of 2048 threads is cudaErrorInvalidConfiguration");
    like(cudaGetErrorString(e), "k_copy", "the message names the kernel");
    is_int(cudaGetLastError(), cudaSuccess, "and cudaGetLastError clears it (not sticky)");
    k_copy<<<1, dim3(32, 1, 128), 0, 0>>>(a, b, N);
    is_int(cudaGetLastError(), cudaErrorInvalidConfiguration, "a block z dimension of 128 too");
    k_copy<<<0, 32, 0, 0>>>(a, b, N);
    is_int(cudaGetLastError(), cudaErrorInvalidConfiguration, "an empty grid too");
    k_copy<<<1, 32, 64 << 10, 0>>>(a, b, N);
    e = cudaGetLastError();
    is_int(e, cudaErrorInvalidConfiguration, "64 KiB of dynamic shared memory too");
    like(cudaGetErrorString(e), "shared memory", "the message says shared memory");
    k_small<<<1, 128, 0, 0>>>(a, N);
    e = cudaGetLastError();
    is_int(e, cudaErrorLaunchOutOfResources, "128 threads for a kernel with __launch_bounds__(64): out of resources");
    like(cudaGetErrorString(e), "k_small has __launch_bounds__(64)", "the message names the kernel and its bound");
    k_small<<<1, 64, 0, 0>>>(a, N);
    is_int(cudaGetLastError(), cudaSuccess, "64 threads are fine");
    cudaFree(a);
    cudaFree(b);
}

static void test_streams(void) {
    cudaStream_t s1, s2;
    cudaStreamCreate(&s1);
    cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking);
    float *pinned = NULL, *a = dev(), *b = dev();
    cudaHostAlloc((void **)&pinned, N * sizeof(float), cudaHostAllocPortable);
    for (int i = 0; i < N; i++) pinned[i] = (float)i;

    /* upload on s1, copy on s2 without waiting: s2 reads what a held before */
    cudaMemsetAsync(b, 0, N * sizeof(float), s2);
    cudaMemcpyAsync(a, pinned, N * sizeof(float), cudaMemcpyHostToDevice, s1);
    k_copy<<<2, 128, 0, s2>>>(b, a, N);
    ok(!holds_iota(b, s2), "a kernel on another stream without a wait reads stale data");
    ok(holds_iota(a, s1), "the upload happens when its own stream is synchronised");

    /* with an event wait the copy sees the upload */
    float *c = dev();
    cudaEvent_t ev;
    cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    cudaMemcpyAsync(c, pinned, N * sizeof(float), cudaMemcpyHostToDevice, s1);
    cudaEventRecord(ev, s1);
    cudaStreamWaitEvent(s2, ev, 0);
    cudaEventDestroy(ev);   /* allowed: the wait still happens */
    k_copy<<<2, 128, 0, s2>>>(b, c, N);
    ok(holds_iota(b, s2), "with cudaStreamWaitEvent the kernel sees the upload");

    /* a host read before the synchronisation sees the old bytes */
    static float h[N];
    memset(h, 0, sizeof h);
    cudaMemcpyAsync(h, c, sizeof h, cudaMemcpyDeviceToHost, s1);
    ok(h[N - 1] == 0.0f, "a device-to-host copy has not happened before its stream is synchronised");
    cudaStreamSynchronize(s1);
    ok(h[N - 1] == (float)(N - 1), "and has after");

    /* the legacy stream runs after the blocking streams, not the non-blocking ones */
    cudaMemcpyAsync(a, pinned, N * sizeof(float), cudaMemcpyHostToDevice, s1);
    static float h2[N];
    cudaMemcpy(h2, a, sizeof h2, cudaMemcpyDeviceToHost);
    ok(h2[N - 1] == (float)(N - 1), "cudaMemcpy waits for the blocking streams");
    is_int(cudaStreamQuery(s2), cudaSuccess, "cudaStreamQuery runs a stream's work");

    /* fresh device memory is not zero */
    float *f = dev(), z;
    cudaMemcpy(&z, f, sizeof z, cudaMemcpyDeviceToHost);
    ok(z != z, "fresh device memory reads as NaN, not zero");

    cudaFree(a);
    cudaFree(b);
    cudaFree(c);
    cudaFree(f);
    cudaFreeHost(pinned);
    cudaStreamDestroy(s1);
    cudaStreamDestroy(s2);
}

static void test_copies(void) {
    float *a = dev(), host[4] = {0};
    cudaError_t e = cudaMemcpyAsync(host, host + 2, 2 * sizeof(float), cudaMemcpyHostToDevice, 0);
    is_int(e, cudaErrorInvalidValue, "a host-to-device copy into host memory is cudaErrorInvalidValue");
    like(cudaGetErrorString(e), "destination", "the message names the destination");
    is_int(cudaMemcpyAsync(a, a + 1, sizeof(float), cudaMemcpyHostToDevice, 0), cudaErrorInvalidValue,
           "a host-to-device copy from device memory too");
    is_int(cudaMemcpyAsync(host, a + N - 1, 2 * sizeof(float), cudaMemcpyDeviceToHost, 0), cudaErrorInvalidValue,
           "a copy past the end of an allocation too");
    is_int(cudaMemsetAsync(host, 0, sizeof host, 0), cudaErrorInvalidValue, "a memset of host memory too");
    is_int(cudaFree(a + 1), cudaErrorInvalidValue, "cudaFree of a pointer inside an allocation too");
    struct cudaPointerAttributes at;
    cudaPointerGetAttributes(&at, a + 5);
    is_int(at.type, cudaMemoryTypeDevice, "cudaPointerGetAttributes: device memory");
    float *pinned = NULL;
    cudaHostAlloc((void **)&pinned, 64, cudaHostAllocPortable);
    cudaPointerGetAttributes(&at, pinned);
    is_int(at.type, cudaMemoryTypeHost, "pinned host memory");
    cudaPointerGetAttributes(&at, host);
    is_int(at.type, cudaMemoryTypeUnregistered, "other host memory");
    cudaFreeHost(pinned);
    cudaFree(a);
}

static void test_nccl(void) {
    ncclUniqueId id;
    ncclComm_t comm = NULL;
    if (ncclGetUniqueId(&id) != ncclSuccess || ncclCommInitRank(&comm, 1, id, 0) != ncclSuccess) {
        ok(0, "a one-rank NCCL communicator: %s", ncclGetLastError(NULL));
        return;
    }
    float *a = dev(), *b = dev(), host[N];
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    is_int(ncclAllReduce(a, b, N, ncclFloat32, ncclSum, comm, s), ncclSuccess, "ncclAllReduce on device buffers");
    is_int(cudaStreamSynchronize(s), cudaSuccess, "runs when its stream is synchronised");
    is_int(ncclAllReduce(host, b, N, ncclFloat32, ncclSum, comm, s), ncclInvalidArgument,
           "ncclAllReduce with a host send buffer is ncclInvalidArgument");
    like(ncclGetLastError(comm), "ncclAllReduce: sendbuff", "the message names the call and the argument");
    like(ncclGetLastError(comm), "host memory", "and says host memory");
    is_int(ncclAllGather(a, host, N, ncclFloat32, comm, s), ncclInvalidArgument,
           "ncclAllGather with a host receive buffer too");
    is_int(ncclBroadcast(a, a + 1, N, ncclFloat32, 0, comm, s), ncclInvalidArgument,
           "a buffer that runs past its allocation too");
    ncclCommDestroy(comm);

    /* a non-blocking communicator's split: the parent is in progress until polled */
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclComm_t nb = NULL, child = NULL;
    if (ncclGetUniqueId(&id) != ncclSuccess || ncclCommInitRankConfig(&nb, 1, id, 0, &cfg) != ncclSuccess) {
        ok(0, "a one-rank non-blocking NCCL communicator: %s", ncclGetLastError(NULL));
        return;
    }
    is_int(ncclCommSplit(nb, 0, 0, &child, &cfg), ncclInProgress, "ncclCommSplit of a non-blocking communicator: "
           "ncclInProgress");
    is_int(ncclAllReduce(a, b, N, ncclFloat32, ncclSum, nb, s), ncclInvalidUsage,
           "the parent used before the split was polled to its end: ncclInvalidUsage");
    like(ncclGetLastError(nb), "ncclAllReduce: the communicator's ncclCommSplit is still in progress",
         "the message names the call and the split");
    ncclResult_t st = ncclInProgress;
    int polls = 0;
    while (st == ncclInProgress && polls < 1000) {
        ncclCommGetAsyncError(nb, &st);
        polls++;
    }
    ok(st == ncclSuccess && polls >= 2, "the parent reports ncclInProgress before ncclSuccess (%d polls)", polls);
    is_int(ncclAllReduce(a, b, N, ncclFloat32, ncclSum, nb, s), ncclSuccess, "then takes calls again");
    cudaStreamSynchronize(s);
    ncclCommDestroy(child);
    ncclCommDestroy(nb);
    cudaStreamDestroy(s);
    cudaFree(a);
    cudaFree(b);
}

/* ---- hazard: a device-synchronising call while another thread has NCCL work queued ---- */

static struct {
    ncclComm_t      comm;
    cudaStream_t    s;
    float          *a, *b;
    pthread_mutex_t mu;
    pthread_cond_t  cv;
    int             queued;
} hz = {NULL, NULL, NULL, NULL, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};

static void *queue_allreduce(void *arg) {
    (void)arg;
    ncclAllReduce(hz.a, hz.b, N, ncclFloat32, ncclSum, hz.comm, hz.s);   /* queued: its stream runs lazily */
    pthread_mutex_lock(&hz.mu);
    hz.queued = 1;
    pthread_cond_signal(&hz.cv);
    pthread_mutex_unlock(&hz.mu);
    return NULL;
}

/* The driver's calls of a mapping: one granule mapped into a reservation. */
typedef CUresult (*granularity_fn)(size_t *, const CUmemAllocationProp *, CUmemAllocationGranularity_flags);
typedef CUresult (*reserve_fn)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
typedef CUresult (*create_fn)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
typedef CUresult (*map_fn)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
typedef CUresult (*unmap_fn)(CUdeviceptr, size_t);
static void *entry(const char *name) {
    void *f = NULL;
    cudaGetDriverEntryPointByVersion(name, &f, 12000, 0, NULL);
    return f;
}

static void test_hazard(const char *call) {
    ncclUniqueId id;
    if (ncclGetUniqueId(&id) != ncclSuccess || ncclCommInitRank(&hz.comm, 1, id, 0) != ncclSuccess) {
        ok(0, "a one-rank NCCL communicator: %s", ncclGetLastError(NULL));
        return;
    }
    cudaStreamCreateWithFlags(&hz.s, cudaStreamNonBlocking);
    hz.a = dev();
    hz.b = dev();
    float *victim = dev(), *pinned = NULL, *fresh = NULL;
    cudaHostAlloc((void **)&pinned, 64, cudaHostAllocPortable);
    CUmemAllocationProp prop = {};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    size_t g = 0;
    CUdeviceptr va = 0;
    CUmemGenericAllocationHandle h = 0;
    ((granularity_fn)entry("cuMemGetAllocationGranularity"))(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    ((reserve_fn)entry("cuMemAddressReserve"))(&va, g, g, 0, 0);
    ((create_fn)entry("cuMemCreate"))(&h, g, &prop, 0);
    ((map_fn)entry("cuMemMap"))(va, g, 0, h, 0);

    /* the same thread's queued work is no hazard to itself */
    ncclAllReduce(hz.a, hz.b, N, ncclFloat32, ncclSum, hz.comm, hz.s);
    float *mine = dev();
    ok(cudaFree(mine) == cudaSuccess, "cudaFree with this thread's own NCCL work queued");
    cudaStreamSynchronize(hz.s);

    pthread_t t;
    pthread_create(&t, NULL, queue_allreduce, NULL);
    pthread_mutex_lock(&hz.mu);
    while (!hz.queued) pthread_cond_wait(&hz.cv, &hz.mu);
    pthread_mutex_unlock(&hz.mu);
    pthread_join(t, NULL);
    if (!strcmp(call, "none")) cudaStreamSynchronize(hz.s);   /* the other thread's work runs first */
    fflush(stdout);
    if (!strcmp(call, "cudaFree") || !strcmp(call, "none")) cudaFree(victim);
    else if (!strcmp(call, "cudaFreeHost")) cudaFreeHost(pinned);
    else if (!strcmp(call, "cudaMalloc")) cudaMalloc((void **)&fresh, 64);
    else if (!strcmp(call, "cuMemUnmap")) ((unmap_fn)entry("cuMemUnmap"))(va, g);
    if (!strcmp(call, "none")) ok(1, "cudaFree once the other thread's NCCL work ran: no stop");
    else ok(0, "%s with another thread's NCCL work queued went unnoticed", call);
    cudaStreamSynchronize(hz.s);
    ncclCommDestroy(hz.comm);
}

static void test_kernel_fault(void) {
    float *a = dev(), host[N];
    k_copy<<<1, 32, 0, 0>>>(a, host, N);
    cudaError_t e = cudaGetLastError();
    is_int(e, cudaErrorIllegalAddress, "a kernel given a host pointer is cudaErrorIllegalAddress");
    like(cudaGetErrorString(e), "kernel k_copy: argument 2", "the message names the kernel and the argument");
    is_int(cudaMalloc((void **)&a, 16), cudaErrorIllegalAddress, "the error is sticky");
}

static void test_cublas_fault(void) {
    cublasHandle_t h;
    cublasCreate(&h);
    float *a = dev(), *c = dev(), host[64], one = 1, zero = 0;
    is_int(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 4, &one, a, 4, a, 4, &zero, c, 4), CUBLAS_STATUS_SUCCESS,
           "cublasSgemm on device matrices");
    cublasStatus_t e = cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 4, &one, a, 4, host, 4, &zero, c, 4);
    is_int(e, CUBLAS_STATUS_EXECUTION_FAILED, "cublasSgemm with a host matrix fails");
    like(cublasGetStatusString(e), "cublasSgemm: matrix B", "the message names the call and the matrix");
    is_int(cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, 4, 4, 4, &one, a + N - 8, 4, a, 4, &zero, c, 4),
           CUBLAS_STATUS_EXECUTION_FAILED, "later calls fail too (sticky)");
}

/* TF32 math: the operands keep 10 mantissa bits (1 + 2^-12 reads as 1, 1 + 3 * 2^-12
 * as 1 + 2^-10: to nearest, ties away); the default math keeps all 23 */
static void test_tf32(void) {
    cublasHandle_t h;
    cublasCreate(&h);
    float *d = dev(), in[3] = {1.0f + 0x1p-12f, 1.0f + 3 * 0x1p-12f, 1.0f}, out[2], one = 1, zero = 0;
    cudaMemcpy(d, in, sizeof in, cudaMemcpyHostToDevice);
    for (int tf = 0; tf < 2; tf++) {   /* 2 x 1 (the two values) times 1 x 1 (one) */
        cublasSetMathMode(h, tf ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH);
        cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 2, 1, 1, &one, d, 2, d + 2, 1, &zero, d + 4, 2);
        cudaMemcpy(out, d + 4, sizeof out, cudaMemcpyDeviceToHost);
        if (tf) ok(out[0] == 1.0f && out[1] == 1.0f + 0x1p-10f, "TF32 math rounds the operands to 10 mantissa bits");
        else ok(out[0] == in[0] && out[1] == in[1], "the default math keeps them whole");
    }
    cublasDestroy(h);
    cudaFree(d);
}

/* With DT_GPU_EMU_RESOURCES (nvcc's table) the launches a GPU refuses fail as it would;
 * without it they run (the mistakes unseen). */
static void test_resources(void) {
    const char *table = getenv("DT_GPU_EMU_RESOURCES");
    const int checked = table && *table;
    float *src = NULL, *dst = NULL;
    cudaMalloc((void **)&src, HEAVY * 1024 * sizeof(float));
    cudaMalloc((void **)&dst, HEAVY * 1024 * sizeof(float));
    cudaMemset(src, 0, HEAVY * 1024 * sizeof(float));
    k_heavy<<<1, 128, 0, 0>>>(dst, src);
    is_int(cudaGetLastError(), cudaSuccess, "k_heavy with 128 threads a block launches");
    k_heavy<<<1, 1024, 0, 0>>>(dst, src);
    cudaError_t e = cudaGetLastError();
    if (checked) {
        is_int(e, cudaErrorLaunchOutOfResources, "k_heavy with 1024 threads a block: too many registers");
        like(cudaGetErrorString(e), "k_heavy uses", "the message names the kernel and its registers");
    } else is_int(e, cudaSuccess, "k_heavy with 1024 threads a block launches (no table: unseen)");
    k_bigshared<<<1, 32, 8192, 0>>>(dst);
    is_int(cudaGetLastError(), cudaSuccess, "40 KiB static and 8 KiB dynamic shared memory launch");
    k_bigshared<<<1, 32, 12288, 0>>>(dst);
    e = cudaGetLastError();
    if (checked) {
        is_int(e, cudaErrorInvalidConfiguration, "40 KiB static and 12 KiB dynamic: over 48 KiB");
        like(cudaGetErrorString(e), "static shared", "the message says the static part");
    } else is_int(e, cudaSuccess, "40 KiB static and 12 KiB dynamic launch (no table: unseen)");
    k_tmpl<2, 3><<<1, 4, 0, 0>>>(dst);
    float h[4] = {0};
    cudaMemcpy(h, dst, sizeof h, cudaMemcpyDeviceToHost);
    ok(cudaGetLastError() == cudaSuccess && h[0] == 6.0f && h[3] == 6.0f,
       "a template's instance launches under its own name (%s)", checked ? "found in the table" : "no table");
    k_tmpl2<2, 3><<<1, 2048, 0, 0>>>(dst);   /* another kernel with the same arguments, refused by name */
    like(cudaGetErrorString(cudaGetLastError()), "kernel k_tmpl2<2, 3>:", "and another template's instance with the "
         "same arguments under its own");
    cudaFree(src);
    cudaFree(dst);
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "";
    if (!strcmp(mode, "divergent")) {
        float *a = dev();
        k_divergent<<<1, 32, 0, 0>>>(a);
        cudaDeviceSynchronize();
        ok(0, "a barrier in divergent code was not noticed");
    } else if (!strcmp(mode, "order")) {
        float *a = dev();
        const char *o = getenv("DT_GPU_EMU_ORDER");
        k_racy<<<8, 64, 0, 0>>>(a);
        ok(iota512(a), "k_racy (no barrier between a write and another thread's read) gives 0, 1, 2, ... "
           "(threads in %s order)", o && *o ? o : "natural");
        k_shift<<<8, 64, 0, 0>>>(a);
        ok(iota512(a), "k_shift (the same with the barrier) gives 0, 1, 2, ... (threads in %s order)",
           o && *o ? o : "natural");
    } else if (!strcmp(mode, "unaligned")) {
        float *a = dev(), *b = dev();
        k_load4<<<1, 4, 0, 0>>>(b, a);
        ok(cudaDeviceSynchronize() == cudaSuccess, "float4 loads from a 16-byte aligned address");
        fflush(stdout);
        k_load4<<<1, 4, 0, 0>>>(b, a + 1);
        cudaDeviceSynchronize();
        ok(0, "a float4 load from an address 4 bytes past a 16-byte boundary went unnoticed");
    } else if (!strcmp(mode, "overrun")) {
        float *a = NULL;
        cudaMalloc((void **)&a, 31 * sizeof(float));
        k_overrun<<<1, 32, 0, 0>>>(a, 30);
        ok(cudaDeviceSynchronize() == cudaSuccess, "31 threads write the 31 floats of an allocation");
        fflush(stdout);
        k_overrun<<<1, 32, 0, 0>>>(a, 31);
        cudaDeviceSynchronize();
        ok(0, "a write one float past the end went unnoticed");
    } else if (!strcmp(mode, "eager")) {
        float *d = dev(), *pinned = NULL, back = 0;
        cudaStream_t s;
        cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
        cudaHostAlloc((void **)&pinned, sizeof(float), cudaHostAllocPortable);
        pinned[0] = 1.0f;
        cudaMemcpyAsync(d, pinned, sizeof(float), cudaMemcpyHostToDevice, s);
        pinned[0] = 2.0f;   /* the race: the copy may have run already */
        cudaStreamSynchronize(s);
        cudaMemcpy(&back, d, sizeof back, cudaMemcpyDeviceToHost);
        const char *e = getenv("DT_GPU_EMU_EAGER");
        ok(back == 2.0f, "a copy queued before the host's second write carries the second value (%s)",
           e && !strcmp(e, "1") ? "eager" : "lazy");
    } else if (!strcmp(mode, "resources")) test_resources();
    else if (!strcmp(mode, "hazard")) test_hazard(argc > 2 ? argv[2] : "none");
    else if (!strcmp(mode, "kernel")) test_kernel_fault();
    else if (!strcmp(mode, "cublas")) test_cublas_fault();
    else {
        test_config();
        test_streams();
        test_copies();
        test_tf32();
        test_nccl();
    }
    printf("1..%d\n", tap_count_);
    return tap_failed_ ? 1 : 0;
}
