/*
 * cpu_ops.c: the CPU backend's table — memory, threads — and the backend lookup
 * (dt_ops_get: "cpu" here, "cuda" from src/cuda/ in a --with-cuda build).
 *
 * Device memory is host memory here: 64-byte aligned (one cache line, one AVX-512
 * vector) so kernels vectorise without peeling. "Pinned" host memory is the same
 * aligned allocation. Work runs synchronously, so synchronize() has nothing to wait for.
 *
 * Threads: every parallel region uses dt_cpu_threads() threads (set_threads), and
 * OpenBLAS is pinned to one thread: its own threading changes the bits of sgemm
 * with the thread count (DESIGN.md rule 2), so cpu_gemm.c parallelises over fixed
 * output blocks instead.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif
#include "cpu.h"
#ifdef DT_HAVE_CUDA
#include "cuda/dt_cuda.h"
#endif

#include <cblas.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

static int cpu_nthreads = 0;   /* 0 until set: then omp_get_max_threads() at first use */

static void cpu_blas_one_thread(void) { openblas_set_num_threads(1); }

static void cpu_blas_single(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, cpu_blas_one_thread);
}

int dt_cpu_threads(void) {
    if (cpu_nthreads <= 0) {
#ifdef _OPENMP
        cpu_nthreads = omp_get_max_threads();
#else
        cpu_nthreads = 1;
#endif
        if (cpu_nthreads < 1) cpu_nthreads = 1;
    }
    return cpu_nthreads;
}

static dt_status cpu_set_threads(int n) {
    if (n < 1) return dt_error(DT_ERR_INVALID, "cpu set_threads: thread count must be >= 1, got %d", n);
#ifndef _OPENMP
    if (n > 1) return dt_error(DT_ERR_UNSUPPORTED, "cpu set_threads: built without OpenMP, cannot use %d threads", n);
#endif
    cpu_blas_single();
    cpu_nthreads = n;
    return DT_OK;
}

static int cpu_threads(void) { return dt_cpu_threads(); }

static dt_status cpu_alloc(void **p, size_t bytes) {
    if (!p) return dt_error(DT_ERR_INVALID, "cpu alloc: NULL result pointer");
    *p = NULL;
    if (bytes == 0) return DT_OK;
    size_t rounded = (bytes + 63) & ~(size_t)63;   /* aligned_alloc wants a multiple of the alignment */
    if (rounded < bytes) return dt_error(DT_ERR_NOMEM, "cpu alloc: %zu bytes is too large", bytes);
    void *q = aligned_alloc(64, rounded);
    if (!q) return dt_error(DT_ERR_NOMEM, "cpu alloc: out of memory allocating %zu bytes", bytes);
    *p = q;
    return DT_OK;
}

static void cpu_free(void *p) { free(p); }

static dt_status cpu_zero(void *p, size_t bytes) {
    if (bytes == 0) return DT_OK;
    if (!p) return dt_error(DT_ERR_INVALID, "cpu zero: NULL pointer for %zu bytes", bytes);
    memset(p, 0, bytes);
    return DT_OK;
}

static dt_status cpu_copy(void *dst, const void *src, size_t bytes) {
    if (bytes == 0) return DT_OK;
    if (!dst || !src) return dt_error(DT_ERR_INVALID, "cpu copy: NULL pointer for %zu bytes", bytes);
    if (dst != src) memmove(dst, src, bytes);
    return DT_OK;
}

static dt_status cpu_synchronize(void) { return DT_OK; }

const dt_ops *dt_ops_cpu(void) {
    static const dt_ops table = {
        .name        = "cpu",
        .host_memory = 1,
        .alloc       = cpu_alloc,
        .free        = cpu_free,
        .zero        = cpu_zero,
        .copy_h2d    = cpu_copy,
        .copy_d2h    = cpu_copy,
        .copy_d2d    = cpu_copy,
        .host_alloc  = cpu_alloc,
        .host_free   = cpu_free,
        .synchronize = cpu_synchronize,
        .set_threads = cpu_set_threads,
        .threads     = cpu_threads,

        .sgemm         = dt_cpu_sgemm,
        .sgemm_batched = dt_cpu_sgemm_batched,

        .bias_add       = dt_cpu_bias_add,
        .bias_relu      = dt_cpu_bias_relu,
        .bias_add_nchw  = dt_cpu_bias_add_nchw,
        .bias_grad      = dt_cpu_bias_grad,
        .bias_grad_nchw = dt_cpu_bias_grad_nchw,

        .relu_forward  = dt_cpu_relu_forward,
        .relu_backward = dt_cpu_relu_backward,
        .gelu_forward  = dt_cpu_gelu_forward,
        .gelu_backward = dt_cpu_gelu_backward,
        .tanh_forward  = dt_cpu_tanh_forward,
        .tanh_backward = dt_cpu_tanh_backward,

        .dropout_forward  = dt_cpu_dropout_forward,
        .dropout_backward = dt_cpu_dropout_backward,

        .xent_forward  = dt_cpu_xent_forward,
        .xent_backward = dt_cpu_xent_backward,
        .mse_forward   = dt_cpu_mse_forward,
        .mse_backward  = dt_cpu_mse_backward,

        .conv2d_forward  = dt_cpu_conv2d_forward,
        .conv2d_backward = dt_cpu_conv2d_backward,

        .maxpool2d_forward       = dt_cpu_maxpool2d_forward,
        .maxpool2d_backward      = dt_cpu_maxpool2d_backward,
        .avgpool2d_forward       = dt_cpu_avgpool2d_forward,
        .avgpool2d_backward      = dt_cpu_avgpool2d_backward,
        .global_avgpool_forward  = dt_cpu_global_avgpool_forward,
        .global_avgpool_backward = dt_cpu_global_avgpool_backward,

        .bn_stats           = dt_cpu_bn_stats,
        .bn_finalize        = dt_cpu_bn_finalize,
        .bn_invstd          = dt_cpu_bn_invstd,
        .bn_apply           = dt_cpu_bn_apply,
        .bn_backward_reduce = dt_cpu_bn_backward_reduce,
        .bn_backward_dx     = dt_cpu_bn_backward_dx,

        .layernorm_forward  = dt_cpu_layernorm_forward,
        .layernorm_backward = dt_cpu_layernorm_backward,

        .argmax_rows   = dt_cpu_argmax_rows,
        .count_correct = dt_cpu_count_correct,
        .sum           = dt_cpu_sum,
        .sumsq         = dt_cpu_sumsq,

        .fill  = dt_cpu_fill,
        .scale = dt_cpu_scale,
        .axpy  = dt_cpu_axpy,
        .add   = dt_cpu_add,
        .mul   = dt_cpu_mul,

        .f32_to_bf16 = dt_cpu_f32_to_bf16,
        .bf16_to_f32 = dt_cpu_bf16_to_f32,
        .f32_to_f16  = dt_cpu_f32_to_f16,
        .f16_to_f32  = dt_cpu_f16_to_f32,

        .sgd_update   = dt_cpu_sgd_update,
        .adamw_update = dt_cpu_adamw_update,

        .rng_uniform = dt_cpu_rng_uniform,
        .rng_normal  = dt_cpu_rng_normal,
    };
    cpu_blas_single();
    return &table;
}

const dt_ops *dt_ops_get(const char *device) {
    if (!device) {
        dt_error(DT_ERR_INVALID, "no device given (expected \"cpu\" or \"cuda\")");
        return NULL;
    }
    if (strcmp(device, "cpu") == 0) return dt_ops_cpu();
    if (strcmp(device, "cuda") == 0) {
#ifdef DT_HAVE_CUDA
        return dt_ops_cuda();   /* NULL with the backend's own message when no device is usable */
#else
        dt_error(DT_ERR_UNSUPPORTED, "device \"cuda\": this build has no CUDA backend (configure --with-cuda)");
        return NULL;
#endif
    }
    dt_error(DT_ERR_INVALID, "unknown device \"%s\" (expected \"cpu\" or \"cuda\")", device);
    return NULL;
}

/* ---- descriptors: the shape arithmetic of PyTorch, checked ---- */

dt_status dt_conv2d_desc_init(dt_conv2d_desc *d) {
    if (!d) return dt_error(DT_ERR_INVALID, "conv2d: NULL descriptor");
    if (d->N < 1 || d->C < 1 || d->H < 1 || d->W < 1)
        return dt_error(DT_ERR_INVALID, "conv2d: input shape (N=%d, C=%d, H=%d, W=%d) must be positive",
                        d->N, d->C, d->H, d->W);
    if (d->K < 1 || d->R < 1 || d->S < 1)
        return dt_error(DT_ERR_INVALID, "conv2d: weight shape (K=%d, R=%d, S=%d) must be positive", d->K, d->R, d->S);
    if (d->stride_h < 1 || d->stride_w < 1)
        return dt_error(DT_ERR_INVALID, "conv2d: stride (%d, %d) must be >= 1", d->stride_h, d->stride_w);
    if (d->pad_h < 0 || d->pad_w < 0)
        return dt_error(DT_ERR_INVALID, "conv2d: padding (%d, %d) must be >= 0", d->pad_h, d->pad_w);
    int64_t hp = (int64_t)d->H + 2 * (int64_t)d->pad_h - d->R, wp = (int64_t)d->W + 2 * (int64_t)d->pad_w - d->S;
    if (hp < 0 || wp < 0)
        return dt_error(DT_ERR_INVALID, "conv2d: kernel %dx%d is larger than the padded input %lldx%lld",
                        d->R, d->S, (long long)(hp + d->R), (long long)(wp + d->S));
    d->P = (int)(hp / d->stride_h + 1);
    d->Q = (int)(wp / d->stride_w + 1);
    return DT_OK;
}

dt_status dt_pool2d_desc_init(dt_pool2d_desc *d) {
    if (!d) return dt_error(DT_ERR_INVALID, "pool2d: NULL descriptor");
    if (d->N < 1 || d->C < 1 || d->H < 1 || d->W < 1)
        return dt_error(DT_ERR_INVALID, "pool2d: input shape (N=%d, C=%d, H=%d, W=%d) must be positive",
                        d->N, d->C, d->H, d->W);
    if (d->kh < 1 || d->kw < 1)
        return dt_error(DT_ERR_INVALID, "pool2d: kernel (%d, %d) must be positive", d->kh, d->kw);
    if (d->stride_h < 1 || d->stride_w < 1)
        return dt_error(DT_ERR_INVALID, "pool2d: stride (%d, %d) must be >= 1", d->stride_h, d->stride_w);
    if (d->pad_h < 0 || d->pad_w < 0 || 2 * d->pad_h > d->kh || 2 * d->pad_w > d->kw)
        return dt_error(DT_ERR_INVALID, "pool2d: padding (%d, %d) must be >= 0 and at most half the kernel (%d, %d)",
                        d->pad_h, d->pad_w, d->kh, d->kw);
    int64_t hp = (int64_t)d->H + 2 * (int64_t)d->pad_h - d->kh, wp = (int64_t)d->W + 2 * (int64_t)d->pad_w - d->kw;
    if (hp < 0 || wp < 0)
        return dt_error(DT_ERR_INVALID, "pool2d: window %dx%d is larger than the padded input", d->kh, d->kw);
    d->P = (int)(hp / d->stride_h + 1);
    d->Q = (int)(wp / d->stride_w + 1);
    return DT_OK;
}

/* ---- per-thread scratch ------------------------------------------------------------ */

#define DT_CPU_SCRATCH_SLOTS 4
static _Thread_local struct { float *p; size_t cap; } scratch_tl[DT_CPU_SCRATCH_SLOTS];

float *dt_cpu_scratch(int slot, size_t floats) {
    if (slot < 0 || slot >= DT_CPU_SCRATCH_SLOTS) return NULL;
    if (scratch_tl[slot].cap < floats) {
        free(scratch_tl[slot].p);
        size_t bytes = (floats * sizeof(float) + 63) & ~(size_t)63;
        scratch_tl[slot].p = aligned_alloc(64, bytes ? bytes : 64);
        scratch_tl[slot].cap = scratch_tl[slot].p ? floats : 0;
    }
    return scratch_tl[slot].p;
}
