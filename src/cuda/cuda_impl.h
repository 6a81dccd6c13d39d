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
 * Determinism: no reduction uses atomics, and every partition is fixed by the shape,
 * never by the grid size (DT_CU_MAX_BLOCKS) or the thread count; partials are combined
 * in a fixed order. Two runs give the same bits on the same GPU, whatever the grid cap.
 * Two orders are used:
 *   - the CPU backend's own (ops.h, src/cpu/), bit for bit: the 4096-element chunks of
 *     sum / sumsq / mse, the (n, c) planes of 16 float lanes, the pairwise combination
 *     of chunk and row partials (dt_cu_pairwise), the gathers of col2im and pooling;
 *   - the GPU's own canonical order, where the CPU's serial loop would leave a GPU idle
 *     (equal to the CPU's to rounding, not bit for bit):
 *       row sums (layer norm statistics and dx, softmax cross-entropy): one warp per row;
 *         element j belongs to lane (j / 4) mod 32, which sums its elements in index
 *         order in float, and the 32 lane sums meet in the butterfly of dt_cu_warp_sum
 *         (lanes i and i^16 first, then i^8, ..., i^1);
 *       column sums (bias gradient, layer norm dgamma and dbeta): rows cut into slabs
 *         of DT_CU_SLAB; each column of each slab summed in row order in float, then the
 *         slab partials of a column dealt to 8 groups (slab s to group s mod 8), each
 *         group's in slab order in double, the 8 group sums in a fixed tree (g + 4, then
 *         g + 2, then g + 1), rounded once;
 *       channel sums (batch norm, conv bias gradient): the CPU's plane sums, then the
 *         planes of a channel in one warp: lane l takes samples l, l+32, ... in order
 *         (double), the lanes in dt_cu_warp_sum's butterfly;
 *       attention (cuda_seq.cu) and GEMMs (cuBLAS): their own fixed orders.
 * A float4 load and four scalar loads feed a lane the same elements in the same order,
 * so whether a row is 16-byte aligned never changes a bit.
 */
#ifndef DT_CUDA_IMPL_H
#define DT_CUDA_IMPL_H

#include <cuda_runtime.h>
#include <cublas_v2.h>
#include <math.h>     /* before the extern "C" block: ops_elem.h includes it too */
#include <stddef.h>
#include <stdint.h>

extern "C" {
#include "dtype.h"
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
/* The same for batch products at once, X_i = X + i * sX (cuBLAS's strided batched GEMM
 * with the operands swapped, as dt_cu_gemm); a stride may be 0 (one operand for all).
 * dtype DT_BF16 or DT_F16: A and B hold values of that type (rounded), multiplied on
 * 16-bit tensor cores with f32 sums (CUBLAS_COMPUTE_32F_FAST_16BF / _16F, gemm_lp's
 * contract); DT_F32: SGEMM (TF32 where the math mode allows it). */
dt_status dt_cu_gemm_batched(const char *fn, int dtype, int transA, int transB, int M, int N, int K, float alpha,
                             const float *A, int lda, long long sa, const float *B, int ldb, long long sb, float beta,
                             float *C, int ldc, long long sc, int batch);

/* ---- launch geometry ---- */

#define DT_CU_THREADS 256        /* elementwise kernels */
#define DT_CU_RED_THREADS 256    /* block-level trees have this width (a power of two) */
#define DT_CU_CHUNK DT_SUM_CHUNK        /* fixed-size chunks of sum / sumsq / mse, as the CPU's */

/* Blocks for a grid-stride loop over n elements: enough to fill a large GPU, capped at
 * dt_cu_max_blocks (DT_CU_MAX_BLOCKS unless dt_cuda_set_debug set another). The
 * partition of the work does not matter for these kernels (one writer per output), so
 * the cap may be anything >= 1 (tests/gpu_emu.sh and gpu_train.sh set it small and hold
 * the results equal). */
#define DT_CU_MAX_BLOCKS (65535u * 8u)
extern unsigned dt_cu_max_blocks;
/* The cap on the convolution's kept columns (dt_cuda_set_memory_opts): > 0 MiB, < 0
 * none, 0 the default. */
extern long long dt_cu_conv_cache_mb;
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

/* Column sums over dy (rows, cols) in the GPU's order (cuda_elem.cu; cuda_impl.h's top):
 *   osum (cols) = sum over rows of dy;  oxhat (cols) = sum of dy * (x - mean[i]) * rstd[i]
 * (x, mean, rstd (rows) only for oxhat; either output may be NULL). Uses the scratch arena. */
dt_status dt_cu_column_sums(float *osum, float *oxhat, const float *dy, const float *x, const float *mean,
                            const float *rstd, int rows, int cols);

/* Grid-stride loop over [0, n). */
#define DT_CU_FOR(i, n) \
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (size_t)(n); i += (size_t)gridDim.x * blockDim.x)
/* The same with 32-bit indices, for n <= INT32_MAX (the stride stays below 2^31 too). */
#define DT_CU_FOR32(i, n) \
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < (unsigned)(n); i += gridDim.x * blockDim.x)

/* Blocks for `items` work items of which one block takes `per_block` at a time (a
 * block-stride loop covers the rest), capped as dt_cu_blocks. */
static inline unsigned dt_cu_grid(size_t items, unsigned per_block) {
    size_t b = (items + per_block - 1) / per_block;
    if (b < 1) b = 1;
    if (b > DT_CU_MAX_BLOCKS) b = DT_CU_MAX_BLOCKS;
    return (unsigned)b;
}

/* ---- warp-level pieces of the reductions (cuda_elem.cu, cuda_nn.cu) ---- */

#define DT_CU_WARPS (DT_CU_THREADS / 32)   /* warps per block of the one-warp-per-row kernels */
#define DT_CU_SLAB 32                      /* rows per partial of the column sums */

/* Sum of v over the 32 lanes of the warp in a fixed butterfly: lanes i and i^16 add
 * first, then i^8, i^4, i^2, i^1. Addition is commutative, so every lane ends with the
 * same bits. All 32 lanes must call it. */
/* The pairwise sum of v (n) by the whole block, level by level: dst[i] = src[2i] +
 * src[2i+1] (odd last carried), v and tmp (n / 2 + 1) swapped between levels; the tree
 * of dt_cpu_pairwise, so the same bits. Every thread of the block calls it and gets the
 * sum (0 for n = 0). */
static __device__ inline double dt_cu_block_pairwise(double *v, double *tmp, size_t n) {
    double *src = v, *dst = tmp;
    while (n > 1) {
        size_t h = n / 2;
        for (size_t i = threadIdx.x; i < h; i += blockDim.x) dst[i] = src[2 * i] + src[2 * i + 1];
        if ((n & 1) && threadIdx.x == 0) dst[h] = src[n - 1];
        __syncthreads();
        n = h + (n & 1);
        double *t = src; src = dst; dst = t;
    }
    return n ? src[0] : 0.0;
}

template <class T> static __device__ inline T dt_cu_warp_sum(T v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Whether rows of `cols` floats starting at p (NULL allowed) can be read as float4. */
static inline int dt_cu_vec4(const void *p, int cols) { return cols % 4 == 0 && ((uintptr_t)p & 15) == 0; }

/* The elements of group g (elements 4g .. 4g+3, fewer at the end of a row of `cols`)
 * into v: one float4 load when vec, else scalar loads. Returns how many. */
static __device__ inline int dt_cu_load4(float v[4], const float *row, int g, int cols, int vec) {
    if (vec) {
        const float4 q = reinterpret_cast<const float4 *>(row)[g];
        v[0] = q.x; v[1] = q.y; v[2] = q.z; v[3] = q.w;
        return 4;
    }
    const int j = 4 * g, n = cols - j < 4 ? cols - j : 4;
    for (int k = 0; k < n; k++) v[k] = row[j + k];
    return n;
}

/* Store the n values of group g (dt_cu_load4's counterpart). */
static __device__ inline void dt_cu_store4(float *row, int g, const float v[4], int n, int vec) {
    if (vec) {
        reinterpret_cast<float4 *>(row)[g] = make_float4(v[0], v[1], v[2], v[3]);
        return;
    }
    for (int k = 0; k < n; k++) row[4 * g + k] = v[k];
}

/* ---- device memory for the backend's own caches (cuda_ops.cu): tracked as the table's
 * alloc and free; dt_cu_free tells the convolution cache that a buffer is gone ---- */
dt_status dt_cu_alloc(void **p, size_t bytes);
void      dt_cu_free(void *p);
void      dt_cu_conv_forget(const void *p);   /* cuda_nn.cu: drop cached columns of input p */

#endif /* DT_CUDA_IMPL_H */
