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
static ucontext_t scheduler;
static int current;
static const std::function<void()> *body;
static const size_t STACK = 256 * 1024;

static void trampoline(void) {
    (*body)();
    finished[current] = 1;   /* uc_link returns to the scheduler */
}

void __syncthreads(void) { swapcontext(&fibers[current], &scheduler); }

void emu_exec(dim3 g, dim3 b, const std::function<void()> &f) {
    const int nt = (int)(b.x * b.y * b.z);
    if ((int)fibers.size() < nt) {
        fibers.resize(nt);
        stacks.resize((size_t)nt * STACK);
        finished.resize(nt);
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
                }
                /* rounds: every live thread runs to its next __syncthreads or its end */
                for (int live = 1; live;) {
                    live = 0;
                    for (int i = 0; i < nt; i++) {
                        if (finished[i]) continue;
                        current = i;
                        emu_threadIdx = dim3(i % b.x, (i / b.x) % b.y, i / (b.x * b.y));
                        swapcontext(&scheduler, &fibers[i]);
                        if (!finished[i]) live = 1;
                    }
                }
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
