/*
 * cpu.h: what the files of the CPU backend share (not installed, not public).
 *
 * The backend is split by idea: cpu_ops.c (memory, threads, the table),
 * cpu_gemm.c (blocked GEMM), cpu_conv.c (convolution, pooling), cpu_norm.c
 * (batch and layer norm), cpu_elem.c (bias, activations, dropout, losses),
 * cpu_vec.c (vector ops, reductions, casts, optimizers, random fills). The device
 * registry and the descriptor checks are above the backends, in src/ops.c.
 */
#ifndef DT_CPU_H
#define DT_CPU_H

#include <stddef.h>
#include <stdint.h>
#include "ops.h"
#include "status.h"

/* Check an argument; on failure name the kernel and the condition that failed. */
#define DT_CPU_ARG(cond) do { \
    if (!(cond)) return dt_error(DT_ERR_INVALID, "cpu %s: bad argument (%s)", __func__, #cond); \
} while (0)

/* The OpenMP thread count every parallel region of the backend uses. */
int dt_cpu_threads(void);
/* Per-thread scratch memory, kept between calls (slot 0..3): large per-call
 * buffers (im2col) would otherwise come from fresh mmap'd pages, and the page
 * faults of every step cost as much as a kernel. Valid until the next call with
 * the same slot on the same thread; NULL when out of memory. */
float    *dt_cpu_scratch(int slot, size_t floats);

/* Fixed-chunk reductions: elements are summed in double over chunks of
 * DT_CPU_CHUNK (ops.h's DT_SUM_CHUNK), and the chunk sums are combined by pairwise
 * summation in index order (dt_pairwise_sum), so the result is the same for any
 * thread count. */
#define DT_CPU_CHUNK DT_SUM_CHUNK
#define dt_cpu_pairwise dt_pairwise_sum   /* destroys v */

/* Hot loops are compiled for AVX-512, AVX2 and the x86-64 baseline, picked at load
 * time (GCC/Clang function multiversioning); elsewhere they are plain functions. The
 * lanes of the kernels are explicit, and floating-point contraction is off for the
 * backend (local.mk), so every version computes the same bits. Put it on static
 * functions only, called by a plain global one where other files need them: GCC (12)
 * gives the load-time dispatcher of a global multiversioned function default visibility
 * whatever -fvisibility says, so libdtrain.so would export it. */
#if defined(__x86_64__) && defined(__has_attribute)
#if __has_attribute(target_clones)
#define DT_CPU_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#endif
#endif
#ifndef DT_CPU_CLONES
#define DT_CPU_CLONES
#endif

/* The sum of eight lanes a[0..7] (lane k took the elements i = k mod 8) in a fixed
 * tree, so a lane-wise sum's order depends on its length only. */
#define DT_CPU_TREE8(a) ((((a)[0] + (a)[4]) + ((a)[2] + (a)[6])) + (((a)[1] + (a)[5]) + ((a)[3] + (a)[7])))

/* The largest of m and s[0..n), in eight lanes (exact in any order). */
float dt_cpu_row_max(const float *s, int n, float m);

/* Sums over one contiguous run of n floats, for per-channel statistics:
 *   *s1 = sum a[i],  *s2 = sum a[i] * (b[i] - m)   (b == NULL: sum a[i]^2).
 * 16 float lanes (lane k takes the elements i = k mod 16), combined in double in a
 * fixed tree: the order depends on n only, and the lanes vectorise on any x86-64. */
void dt_cpu_run_sums(const float *a, const float *b, float m, size_t n, double *s1, double *s2);

/* Single-threaded row-major GEMM (dt_cpu_gemm_avx512 where it applies, else
 * cblas_sgemm), for use inside parallel regions where each thread owns one output block. */
void dt_cpu_gemm1(int transA, int transB, int M, int N, int K, float alpha,
                  const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc);

/* The same block in AVX-512 (cpu_gemm_avx512.c): 1 when it computed C, 0 when the
 * CPU (or the compiler) has no AVX-512 F, dt_cpu_gemm_own(0) chose OpenBLAS, or the
 * packing buffers could not be had; then the caller calls OpenBLAS. */
int  dt_cpu_gemm_avx512(int transA, int transB, int M, int N, int K, float alpha,
                        const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc);
void dt_cpu_gemm_own(int on);
int  dt_cpu_gemm_own_on(void);     /* 1: f32 blocks run dt_cpu_gemm_avx512 */
int  dt_cpu_has_avx512f(void);     /* the CPU and the compiler can run it */

/* The block of bf16 products on AVX512-BF16 (cpu_gemm_bf16.c), dt_cpu_gemm1's contract
 * for A and B that hold bf16 values: 1 when it computed C, 0 when the CPU has no
 * AVX512-BF16 or the packing buffers could not be had (C untouched). */
#define DT_CPU_GEMM_BF16_KC 512   /* the depth of its slices (see its order there) */
int  dt_cpu_gemm1_bf16(int transA, int transB, int M, int N, int K, float alpha, const float *A, int lda,
                       const void *B, int ldb, float beta, float *C, int ldc);
/* The same with B (not transposed) held as bf16 bits (uint16_t): its words are packed as
 * they are, the bits of dt_cpu_gemm1_bf16 on B widened to f32. */
int  dt_cpu_gemm1_bf16_b16(int transA, int transB, int M, int N, int K, float alpha, const float *A, int lda,
                           const void *B, int ldb, float beta, float *C, int ldc);
int  dt_cpu_has_avx512bf16(void);

/* One product cut into cpu_gemm.c's block grid (a function of the shape only), the
 * blocks spread over the threads, each computed by blk (1: done; 0: out of memory). B's
 * elements are floats, or 16-bit words where b16 is 1 (blk reads them so). */
typedef int (*dt_cpu_gemm_block)(int transA, int transB, int M, int N, int K, float alpha, const float *A, int lda,
                                 const void *B, int ldb, float beta, float *C, int ldc);
dt_status dt_cpu_gemm_blocks(const char *fn, dt_cpu_gemm_block blk, int b16, int transA, int transB, int M, int N,
                             int K, float alpha, const float *A, int lda, const void *B, int ldb, float beta, float *C,
                             int ldc);

/* The kernels chosen for the process (ops.h DT_CPU_GEMM_*): DT_ERR_UNSUPPORTED where
 * the CPU lacks what the choice names. Then dt_cpu_gemm_bf16_on() says whether bf16
 * products run on dt_cpu_gemm1_bf16, and dt_cpu_gemm_name(dtype) names the kernel that
 * runs products of dtype (DT_F32, DT_BF16, DT_F16): "avx512-bf16", "avx512", "openblas". */
dt_status   dt_cpu_gemm_select(int choice);   /* before any: auto */
int         dt_cpu_gemm_bf16_on(void);
const char *dt_cpu_gemm_name(int dtype);

/* The kernels of the table, dt_cpu_<op> for every op of ops.h's list, defined in the
 * files above (the activations by one generator in cpu_elem.c). */
#define DT_CPU_DECL_(name, params) dt_status dt_cpu_##name params;
DT_OPS(DT_CPU_DECL_)
#undef DT_CPU_DECL_

#endif /* DT_CPU_H */
