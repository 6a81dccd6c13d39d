/*
 * cuda_impl.h: what the .cu files of the CUDA backend share (not installed).
 *
 * The backend is split by idea: cuda_ops.cu (context, memory, GEMM, the table),
 * cuda_elem.cu (bias, activations, dropout, losses, vector ops, casts, optimizers,
 * the random fills, the sum of squares), cuda_nn.cu (convolution, pooling, batch and
 * layer norm), cuda_seq.cu (embeddings, positions, attention), cuda_reduce.cu (the
 * combination of buffers for the nccl backend's deterministic all-reduce). Each op of
 * ops.h's list is a function dt_cu_<op>, declared below from
 * the list, and the table in cuda_ops.cu is generated from the same list.
 *
 * Checking: every CUDA and cuBLAS call goes through DT_CU / DT_CUBLAS, which return a
 * dt_status whose message names the kernel, the call and CUDA's reason; kernel
 * launches are checked with DT_CU_LAUNCH (cudaGetLastError). Nothing prints or exits.
 *
 * Determinism: no reduction uses atomics. Each reduction follows the CPU backend's own
 * order (ops.h, src/cpu/): a partition fixed by the shape (a column, a row, an (n, c)
 * plane in 16 float lanes, a 4096-element chunk with 8 double accumulators), each lane
 * or accumulator owned by one thread and summed in index order, lanes combined in the
 * CPU's fixed tree, and the partials combined in a second pass in index order (pairwise
 * for chunks and rows, in sample order for planes). Two runs give the same bits, and
 * the sums are the CPU's bit for bit. The exception is attention (cuda_seq.cu): its
 * sums run over tiles in an order fixed by the shape, not the CPU's, so two runs agree
 * bit for bit and the CPU to rounding.
 */
#ifndef DT_CUDA_IMPL_H
#define DT_CUDA_IMPL_H

#include <cuda_runtime.h>
#include <cublas_v2.h>
#include <math.h>     /* before the extern "C" block: ops_elem.h includes it too */
#include <stddef.h>
#include <stdint.h>

extern "C" {
#include "ops.h"
#include "status.h"
}
#include "dt_cuda.h"

/* The kernels of the table, dt_cu_<op> for every op of the list. */
#define DT_CU_DECL_(name, params) dt_status dt_cu_##name params;
DT_OPS(DT_CU_DECL_)
#undef DT_CU_DECL_

/* Map a CUDA error onto a dt_status and leave "cuda FN: CALL failed: REASON". */
dt_status dt_cu_fail(cudaError_t e, const char *fn, const char *call);
dt_status dt_cublas_fail(cublasStatus_t e, const char *fn, const char *call);

#define DT_CU(call) do { \
    cudaError_t dt_cu_e_ = (call); \
    if (dt_cu_e_ != cudaSuccess) return dt_cu_fail(dt_cu_e_, __func__, #call); \
} while (0)
#define DT_CUBLAS(call) do { \
    cublasStatus_t dt_cb_e_ = (call); \
    if (dt_cb_e_ != CUBLAS_STATUS_SUCCESS) return dt_cublas_fail(dt_cb_e_, __func__, #call); \
} while (0)
#define DT_CU_LAUNCH(name) do { \
    cudaError_t dt_cu_e_ = cudaGetLastError(); \
    if (dt_cu_e_ != cudaSuccess) return dt_cu_fail(dt_cu_e_, __func__, "launch of " name); \
    if (dt_cu_sync_launches) DT_TRY(dt_cu_sync_after(__func__, "kernel " name)); \
} while (0)
/* Check an argument; on failure name the kernel and the condition. */
#define DT_CU_ARG(cond) do { \
    if (!(cond)) return dt_error(DT_ERR_INVALID, "cuda %s: bad argument (%s)", __func__, #cond); \
} while (0)

/* ---- the context (cuda_ops.cu) ---- */

/* DT_CUDA_SYNC (dt_cuda_set_debug): synchronise after every launch; the error of one
 * that faulted names it ("cuda FN: kernel K failed (DT_CUDA_SYNC): REASON"). */
extern int dt_cu_sync_launches;
dt_status  dt_cu_sync_after(const char *fn, const char *what);

/* Make sure the backend is initialised (dt_cuda_init) and this thread uses its device.
 * Every table function calls it first. */
dt_status    dt_cu_enter(void);
cudaStream_t dt_cu_stream(void);
cublasHandle_t dt_cu_blas(void);

/* Scratch memory owned by the backend, valid until the next dt_cu_scratch call (work
 * on the one stream is ordered, so reuse across kernels is safe). Grows on demand. */
dt_status dt_cu_scratch(void **p, size_t bytes);

/* Errors found by kernels (a label out of range, a bad argmax index) are recorded in a
 * device word per kind and reported by the next synchronize() or copy_d2h. */
enum { DT_CU_ERR_XENT_FWD, DT_CU_ERR_XENT_BWD, DT_CU_ERR_MAXPOOL_BWD, DT_CU_ERR_EMBED_FWD, DT_CU_ERR_EMBED_BWD,
       DT_CU_ERR_COUNT };
int *dt_cu_err_flags(void);   /* device array of DT_CU_ERR_COUNT ints; 0 = fine, else row/index + 1 */

/* Row-major GEMM on the compute stream (used by the convolutions too). */
dt_status dt_cu_gemm(const char *fn, int transA, int transB, int M, int N, int K, float alpha,
                     const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc);

/* ---- launch geometry ---- */

#define DT_CU_THREADS 256        /* elementwise kernels */
#define DT_CU_RED_THREADS 256    /* block-level trees have this width (a power of two) */
#define DT_CU_CHUNK 4096         /* fixed-size chunks of sum / sumsq / mse, as the CPU's */

/* Blocks for a grid-stride loop over n elements: enough to fill a large GPU, capped at
 * dt_cu_max_blocks (DT_CU_MAX_BLOCKS unless dt_cuda_set_debug set another). The
 * partition of the work does not matter for these kernels (one writer per output), so
 * the cap may be anything >= 1 (tests/gpu_emu.sh and gpu_train.sh set it small and hold
 * the results equal). */
#define DT_CU_MAX_BLOCKS (65535u * 8u)
extern unsigned dt_cu_max_blocks;
static inline unsigned dt_cu_blocks(size_t n) {
    size_t b = (n + DT_CU_THREADS - 1) / DT_CU_THREADS;
    if (b < 1) b = 1;
    if (b > dt_cu_max_blocks) b = dt_cu_max_blocks;
    return (unsigned)b;
}

/* Pairwise combination of n doubles in `v` (device; destroyed), in the order of the
 * CPU's dt_cpu_pairwise: level by level, v[i] = v[2i] + v[2i+1], an odd last element
 * carried. `tmp` holds n doubles of scratch. *out (device float) = (float)(total / divisor),
 * rounded once, as the CPU's losses and sums. n = 0 gives 0. */
dt_status dt_cu_pairwise(double *v, double *tmp, size_t n, double divisor, float *out);

/* Per-channel sums over x (N, C, HW) in the CPU's order (cuda_nn.cu): each (n, c) plane
 * as the CPU's dt_cpu_run_sums (16 float lanes, lane k taking i = k mod 16, combined in
 * double in a fixed tree), the planes of a channel in sample order in double, rounded once.
 *   o1 (C) = sum a;  o2 (C) = sum a*a (b == NULL) or invstd[c] * sum a*(b - mean[c]).
 * o2 may be NULL. Uses the scratch arena. */
dt_status dt_cu_channel_sums(float *o1, float *o2, const float *a, const float *b, const float *mean,
                             const float *invstd, int N, int C, int HW);

/* Grid-stride loop over [0, n). */
#define DT_CU_FOR(i, n) \
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (size_t)(n); i += (size_t)gridDim.x * blockDim.x)

#endif /* DT_CUDA_IMPL_H */
