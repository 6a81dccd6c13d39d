/*
 * cpu.h: what the files of the CPU backend share (not installed, not public).
 *
 * The backend is split by idea: cpu_ops.c (memory, threads, the table),
 * cpu_gemm.c (blocked GEMM), cpu_conv.c (convolution, pooling), cpu_norm.c
 * (batch and layer norm), cpu_elem.c (bias, activations, dropout, losses),
 * cpu_vec.c (vector ops, reductions, casts, optimizers, random fills).
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
 * DT_CPU_CHUNK, and the chunk sums are combined by pairwise summation in index
 * order, so the result is the same for any thread count. */
#define DT_CPU_CHUNK 4096
double dt_cpu_pairwise(double *v, size_t n);   /* destroys v */

/* Hot loops are compiled for AVX-512, AVX2 and the x86-64 baseline, picked at load
 * time (GCC/Clang function multiversioning); elsewhere they are plain functions. The
 * lanes of the kernels are explicit, and floating-point contraction is off for the
 * backend (local.mk), so every version computes the same bits. */
#if defined(__x86_64__) && defined(__has_attribute)
#if __has_attribute(target_clones)
#define DT_CPU_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#endif
#endif
#ifndef DT_CPU_CLONES
#define DT_CPU_CLONES
#endif

/* Sums over one contiguous run of n floats, for per-channel statistics:
 *   *s1 = sum a[i],  *s2 = sum a[i] * (b[i] - m)   (b == NULL: sum a[i]^2).
 * 16 float lanes (lane k takes the elements i = k mod 16), combined in double in a
 * fixed tree: the order depends on n only, and the lanes vectorise on any x86-64. */
void dt_cpu_run_sums(const float *a, const float *b, float m, size_t n, double *s1, double *s2);

/* Single-threaded row-major GEMM (a thin wrapper of cblas_sgemm), for use inside
 * parallel regions where each thread owns one output block. */
void dt_cpu_gemm1(int transA, int transB, int M, int N, int K, float alpha,
                  const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc);

/* Members of the table, defined in the files above. */
dt_status dt_cpu_sgemm(int transA, int transB, int M, int N, int K, float alpha,
                       const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc);
dt_status dt_cpu_sgemm_batched(int transA, int transB, int M, int N, int K, float alpha,
                               const float *A, int lda, int64_t strideA, const float *B, int ldb, int64_t strideB,
                               float beta, float *C, int ldc, int64_t strideC, int batch);

dt_status dt_cpu_bias_add(float *y, const float *b, int rows, int cols);
dt_status dt_cpu_bias_relu(float *y, const float *b, int rows, int cols);
dt_status dt_cpu_bias_add_nchw(float *y, const float *b, int N, int C, int HW);
dt_status dt_cpu_bias_grad(float *db, const float *dy, int rows, int cols);
dt_status dt_cpu_bias_grad_nchw(float *db, const float *dy, int N, int C, int HW);
dt_status dt_cpu_relu_forward(float *y, const float *x, size_t n);
dt_status dt_cpu_relu_backward(float *dx, const float *dy, const float *y, size_t n);
dt_status dt_cpu_gelu_forward(float *y, const float *x, size_t n);
dt_status dt_cpu_gelu_backward(float *dx, const float *dy, const float *x, size_t n);
dt_status dt_cpu_tanh_forward(float *y, const float *x, size_t n);
dt_status dt_cpu_tanh_backward(float *dx, const float *dy, const float *y, size_t n);
dt_status dt_cpu_dropout_forward(float *y, const float *x, int rows, int cols, float p,
                                 uint64_t seed, uint32_t stream, uint32_t epoch, uint64_t sample0);
dt_status dt_cpu_dropout_backward(float *dx, const float *dy, int rows, int cols, float p,
                                  uint64_t seed, uint32_t stream, uint32_t epoch, uint64_t sample0);
dt_status dt_cpu_xent_forward(float *loss, float *probs, const float *logits, const int32_t *labels,
                              int B, int C, float label_smoothing, float norm);
dt_status dt_cpu_xent_backward(float *dlogits, const float *probs, const int32_t *labels,
                               int B, int C, float label_smoothing, float norm);
dt_status dt_cpu_mse_forward(float *loss, const float *pred, const float *target, size_t n, float norm);
dt_status dt_cpu_mse_backward(float *dpred, const float *pred, const float *target, size_t n, float norm);

dt_status dt_cpu_conv2d_forward(const dt_conv2d_desc *d, float *y, const float *x, const float *w,
                                const float *bias, int relu);
dt_status dt_cpu_conv2d_backward(const dt_conv2d_desc *d, float *dx, float *dw, float *dbias,
                                 const float *dy, const float *x, const float *w);
dt_status dt_cpu_maxpool2d_forward(const dt_pool2d_desc *d, float *y, int32_t *idx, const float *x);
dt_status dt_cpu_maxpool2d_backward(const dt_pool2d_desc *d, float *dx, const float *dy, const int32_t *idx);
dt_status dt_cpu_avgpool2d_forward(const dt_pool2d_desc *d, float *y, const float *x);
dt_status dt_cpu_avgpool2d_backward(const dt_pool2d_desc *d, float *dx, const float *dy);
dt_status dt_cpu_global_avgpool_forward(float *y, const float *x, int N, int C, int HW);
dt_status dt_cpu_global_avgpool_backward(float *dx, const float *dy, int N, int C, int HW);

dt_status dt_cpu_bn_stats(float *sum, float *sumsq, const float *x, int N, int C, int HW);
dt_status dt_cpu_bn_finalize(float *mean, float *invstd, const float *sum, const float *sumsq, int C,
                             int64_t count, float eps, float *running_mean, float *running_var, float momentum);
dt_status dt_cpu_bn_invstd(float *invstd, const float *var, int C, float eps);
dt_status dt_cpu_bn_apply(float *y, const float *x, const float *mean, const float *invstd,
                          const float *gamma, const float *beta, int N, int C, int HW, int relu);
dt_status dt_cpu_bn_backward_reduce(float *sum_dy, float *sum_dy_xhat, const float *dy, const float *x,
                                    const float *mean, const float *invstd, int N, int C, int HW);
dt_status dt_cpu_bn_backward_dx(float *dx, const float *dy, const float *x, const float *mean,
                                const float *invstd, const float *gamma, const float *sum_dy,
                                const float *sum_dy_xhat, int N, int C, int HW, int64_t count);
dt_status dt_cpu_layernorm_forward(float *y, float *mean, float *rstd, const float *x,
                                   const float *gamma, const float *beta, int rows, int cols, float eps);
dt_status dt_cpu_layernorm_backward(float *dx, float *dgamma, float *dbeta, const float *dy,
                                    const float *x, const float *mean, const float *rstd,
                                    const float *gamma, int rows, int cols);

dt_status dt_cpu_argmax_rows(int32_t *idx, const float *x, int rows, int cols);
dt_status dt_cpu_count_correct(int32_t *correct, const float *logits, const int32_t *labels, int B, int C);
dt_status dt_cpu_sum(float *out, const float *x, size_t n);
dt_status dt_cpu_sumsq(float *out, const float *x, size_t n);
dt_status dt_cpu_fill(float *x, float value, size_t n);
dt_status dt_cpu_scale(float *x, float alpha, size_t n);
dt_status dt_cpu_axpy(float *y, float alpha, const float *x, size_t n);
dt_status dt_cpu_add(float *z, const float *x, const float *y, size_t n);
dt_status dt_cpu_mul(float *z, const float *x, const float *y, size_t n);
dt_status dt_cpu_f32_to_bf16(uint16_t *dst, const float *src, size_t n);
dt_status dt_cpu_bf16_to_f32(float *dst, const uint16_t *src, size_t n);
dt_status dt_cpu_f32_to_f16(uint16_t *dst, const float *src, size_t n);
dt_status dt_cpu_f16_to_f32(float *dst, const uint16_t *src, size_t n);
dt_status dt_cpu_sgd_update(float *p, const float *grad, float *buf, size_t n, const dt_sgd_args *a);
dt_status dt_cpu_adamw_update(float *p, const float *grad, float *m, float *v, size_t n, const dt_adamw_args *a);
dt_status dt_cpu_rng_uniform(float *x, size_t n, float lo, float hi, uint64_t seed, uint64_t stream, uint64_t offset);
dt_status dt_cpu_rng_normal(float *x, size_t n, float mean, float std, uint64_t seed, uint64_t stream, uint64_t offset);

#endif /* DT_CPU_H */
