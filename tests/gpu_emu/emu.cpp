/* gpu_emu/emu.cpp: the CPU side of the CUDA stand-in (see cuda_runtime.h here): the
 * fiber scheduler that runs a launch, and the runtime and cuBLAS calls the backend uses. */
#include "cublas_v2.h"

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <ucontext.h>
#include <vector>

dim3 emu_threadIdx, emu_blockIdx, emu_blockDim, emu_gridDim;

static std::vector<ucontext_t> fibers;
static std::vector<char> stacks;
static std::vector<int> finished;
/* Where a thread waits (emu_warp.h): running, at __syncthreads, or at a warp rendezvous
 * of the lanes in wait_mask. */
enum { RUN, AT_BLOCK, AT_WARP };
static std::vector<int> waiting;
static std::vector<unsigned> wait_mask;
static std::vector<uint64_t> shfl_slots;
static ucontext_t scheduler;
static int current;
static const std::function<void()> *body;
static const size_t STACK = 256 * 1024;

static void trampoline(void) {
    (*body)();
    finished[current] = 1;   /* uc_link returns to the scheduler */
}

void __syncthreads(void) {
    waiting[current] = AT_BLOCK;
    swapcontext(&fibers[current], &scheduler);
}

void emu_warp_sync(unsigned mask) {
    waiting[current] = AT_WARP;
    wait_mask[current] = mask;
    swapcontext(&fibers[current], &scheduler);
}

uint64_t *emu_shfl_slots(void) { return shfl_slots.data(); }

[[noreturn]] static void emu_die(const char *what, int thread) {
    fprintf(stderr, "gpu_emu: block (%u,%u,%u) thread %d: %s\n", emu_blockIdx.x, emu_blockIdx.y, emu_blockIdx.z,
            thread, what);
    abort();
}

/* After a round: release the warps whose named lanes all wait at a warp rendezvous,
 * else the block when every live thread waits at __syncthreads. 0 when all finished. */
static int release(int nt) {
    int live = 0, released = 0, at_block = 0;
    for (int w0 = 0; w0 < nt; w0 += 32) {
        const int w1 = w0 + 32 < nt ? w0 + 32 : nt;
        int lead = -1;
        for (int i = w0; i < w1; i++)
            if (!finished[i] && waiting[i] == AT_WARP) { lead = i; break; }
        if (lead < 0) continue;
        const unsigned mask = wait_mask[lead];
        int all = 1;
        for (int i = w0; i < w1; i++) {
            if (!(mask >> (i - w0) & 1u)) continue;
            if (finished[i]) emu_die("a lane named in a warp shuffle or __syncwarp mask has exited", i);
            if (waiting[i] == AT_BLOCK) emu_die("lanes of one warp wait at __syncthreads and at a warp shuffle", i);
            if (waiting[i] != AT_WARP) all = 0;
        }
        if (!all) continue;
        for (int i = w0; i < w1; i++)
            if (mask >> (i - w0) & 1u) waiting[i] = RUN;
        released = 1;
    }
    for (int i = 0; i < nt; i++)
        if (!finished[i]) { live++; at_block += waiting[i] == AT_BLOCK; }
    if (released || live == 0) return live;
    if (at_block != live) emu_die("deadlock: threads wait at warp shuffles that can never complete", 0);
    for (int i = 0; i < nt; i++) waiting[i] = RUN;
    return live;
}

void emu_exec(dim3 g, dim3 b, const std::function<void()> &f) {
    const int nt = (int)(b.x * b.y * b.z);
    if ((int)fibers.size() < nt) {
        fibers.resize(nt);
        stacks.resize((size_t)nt * STACK);
        finished.resize(nt);
        waiting.resize(nt);
        wait_mask.resize(nt);
        shfl_slots.resize(nt);
    }
    body = &f;
    emu_blockDim = b;
    emu_gridDim = g;
    for (unsigned bz = 0; bz < g.z; bz++)
        for (unsigned by = 0; by < g.y; by++)
            for (unsigned bx = 0; bx < g.x; bx++) {
                emu_blockIdx = dim3(bx, by, bz);
                for (int i = 0; i < nt; i++) {
                    getcontext(&fibers[i]);
                    fibers[i].uc_stack.ss_sp = &stacks[(size_t)i * STACK];
                    fibers[i].uc_stack.ss_size = STACK;
                    fibers[i].uc_link = &scheduler;
                    makecontext(&fibers[i], trampoline, 0);
                    finished[i] = 0;
                    waiting[i] = RUN;
                }
                /* rounds: every running thread runs to its next barrier or its end */
                do {
                    for (int i = 0; i < nt; i++) {
                        if (finished[i] || waiting[i] != RUN) continue;
                        current = i;
                        emu_threadIdx = dim3(i % b.x, (i / b.x) % b.y, i / (b.x * b.y));
                        swapcontext(&scheduler, &fibers[i]);
                    }
                } while (release(nt));
            }
}

/* DT_GPU_EMU_MARK=FILE: create FILE, so a test can tell the stand-in was used. */
cudaError_t cudaGetDeviceCount(int *n) {
    const char *mark = getenv("DT_GPU_EMU_MARK");
    FILE *f = mark ? fopen(mark, "w") : NULL;
    if (f) fclose(f);
    *n = 1;
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int) { return cudaSuccess; }
cudaError_t cudaStreamCreate(cudaStream_t *s) { *s = (cudaStream_t)&scheduler; return cudaSuccess; }
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaMalloc(void **p, size_t bytes) {
    *p = aligned_alloc(256, (bytes + 255) & ~(size_t)255);
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFree(void *p) { free(p); return cudaSuccess; }
cudaError_t cudaMemset(void *p, int v, size_t n) { memset(p, v, n); return cudaSuccess; }
cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t) { memset(p, v, n); return cudaSuccess; }
cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, cudaMemcpyKind, cudaStream_t) {
    memmove(d, s, n);
    return cudaSuccess;
}
cudaError_t cudaHostAlloc(void **p, size_t n, unsigned) { *p = malloc(n); return *p ? cudaSuccess : cudaErrorMemoryAllocation; }
cudaError_t cudaFreeHost(void *p) { free(p); return cudaSuccess; }
cudaError_t cudaGetLastError(void) { return cudaSuccess; }
cudaError_t cudaMemGetInfo(size_t *fr, size_t *tot) { *fr = *tot = 0; return cudaSuccess; }
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned) { *e = (cudaEvent_t)&scheduler; return cudaSuccess; }
cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned) { return cudaSuccess; }
cudaError_t cudaEventDestroy(cudaEvent_t) { return cudaSuccess; }
const char *cudaGetErrorString(cudaError_t) { return "emulated error"; }
const char *cudaGetErrorName(cudaError_t) { return "cudaErrorEmulated"; }

cublasStatus_t cublasCreate(cublasHandle_t *h) { *h = (cublasHandle_t)&scheduler; return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasSetStream(cublasHandle_t, cudaStream_t) { return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasSetPointerMode(cublasHandle_t, cublasPointerMode_t) { return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasSetMathMode(cublasHandle_t, cublasMath_t) { return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasSgemm(cublasHandle_t, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                           const float *alpha, const float *A, int lda, const float *B, int ldb,
                           const float *beta, float *C, int ldc) {
    cblas_sgemm(CblasColMajor, ta == CUBLAS_OP_T ? CblasTrans : CblasNoTrans, tb == CUBLAS_OP_T ? CblasTrans : CblasNoTrans,
                m, n, k, *alpha, A, lda, B, ldb, *beta, C, ldc);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                                         int k, const float *alpha, const float *A, int lda, long long sa,
                                         const float *B, int ldb, long long sb, const float *beta, float *C, int ldc,
                                         long long sc, int batch) {
    for (int i = 0; i < batch; i++)
        cublasSgemm(h, ta, tb, m, n, k, alpha, A + i * sa, lda, B + i * sb, ldb, beta, C + i * sc, ldc);
    return CUBLAS_STATUS_SUCCESS;
}
const char *cublasGetStatusString(cublasStatus_t) { return "emulated cuBLAS error"; }
