/*
 * ops.c: the compute interface's own code — the device registry (which backend a
 * device name means, and with which options), the names of the ops, and the checks of
 * the convolution and pooling descriptors that every backend shares.
 *
 * It sits above the backends: "cpu" is always built, "cuda" only with --with-cuda
 * (DT_HAVE_CUDA), so this is the one file that knows which backends exist.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif
#include "ops.h"
#include "cpu/cpu.h"   /* the cpu GEMM kernels' choice */
#include "dtype.h"
#ifdef DT_HAVE_CUDA
#include "cuda/dt_cuda.h"
#endif

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* ---- the registry ---- */

/* The switch `name`: unset or empty leaves *on; "0" or "1" sets it. */
static dt_status env_switch(const char *name, int *on) {
    const char *v = getenv(name);
    if (!v || !*v) return DT_OK;
    if (strcmp(v, "0") && strcmp(v, "1")) return dt_error(DT_ERR_INVALID, "%s='%s': expected 0 or 1", name, v);
    *on = v[0] == '1';
    return DT_OK;
}

/* The decimal count `name` in [lo, hi] into *n (unset or empty: left alone); `what`
 * says what it counts in the error. */
static dt_status env_count(const char *name, unsigned long lo, unsigned long hi, const char *what, unsigned long *n) {
    const char *v = getenv(name);
    if (!v || !*v) return DT_OK;
    char *end = NULL;
    errno = 0;
    unsigned long x = strtoul(v, &end, 10);
    if (errno || *end || v[0] < '0' || v[0] > '9' || x < lo || x > hi)
        return dt_error(DT_ERR_INVALID, "%s='%s': expected %s from %lu to %lu", name, v, what, lo, hi);
    *n = x;
    return DT_OK;
}

dt_status dt_device_opts_env(dt_device_opts *o) {
    DT_TRY(env_switch("DT_CUDA_SYNC", &o->sync));
    unsigned long n = 0;
    DT_TRY(env_count("DT_CU_MAX_BLOCKS", 1, 0x7fffffffUL, "a block count", &n));
    if (n) o->max_blocks = (unsigned)n;
    int vmm = !o->no_vmm;
    DT_TRY(env_switch("DT_CUDA_VMM", &vmm));
    o->no_vmm = !vmm;
    n = (unsigned long)-1;
    DT_TRY(env_count("DT_CUDA_CONV_CACHE_MB", 0, 1UL << 30, "a size in MiB", &n));
    if (n != (unsigned long)-1) o->conv_cache_mb = n ? (long long)n : -1;
    const char *v = getenv("DT_CPU_GEMM");
    if (v && *v) {
        static const char *const names[] = {"auto", "openblas", "avx512", "avx512bf16"};
        int k = !strcmp(v, "own") ? DT_CPU_GEMM_AUTO : -1;
        for (int i = 0; i < (int)(sizeof names / sizeof *names); i++)
            if (!strcmp(v, names[i])) k = i;
        if (k < 0) return dt_error(DT_ERR_INVALID, "DT_CPU_GEMM='%s': expected auto, openblas, avx512 or avx512bf16", v);
        o->cpu_gemm = k;
    }
    return DT_OK;
}

dt_status dt_ops_describe(const dt_ops *ops, char *buf, size_t n) {
    if (!ops || !buf || !n) return dt_error(DT_ERR_INVALID, "dt_ops_describe: NULL argument");
    buf[0] = 0;
#ifdef DT_HAVE_CUDA
    if (!strcmp(ops->name, "cuda")) return dt_cuda_describe(buf, n);
#endif
    return DT_OK;
}

const char *dt_ops_gemm_name(const dt_ops *ops, int dtype) {
    if (!ops) return "";
    if (!strcmp(ops->name, "cpu")) return dt_cpu_gemm_name(dtype);
    return "cublas";
}

int dt_ops_gemm_lp_rounds(const dt_ops *ops, int dtype) {
    return ops && !strcmp(ops->name, "cpu") && dtype == DT_BF16 && dt_cpu_gemm_bf16_on();
}

int dt_ops_gemm_lp_reads16(const dt_ops *ops, int dtype) { return dt_ops_gemm_lp_rounds(ops, dtype); }

void dt_ops_reset_peak(const dt_ops *ops) {
    if (ops && ops->memory) ops->memory(NULL, NULL, 1);
}

const dt_ops *dt_ops_get_ex(const char *device, const dt_device_opts *opts) {
    const dt_device_opts none = {0};
    if (!opts) opts = &none;
    if (!device) {
        dt_error(DT_ERR_INVALID, "no device given (expected \"cpu\" or \"cuda\")");
        return NULL;
    }
    if (opts->index < 0) {
        dt_error(DT_ERR_INVALID, "device \"%s\": index %d must be >= 0", device, opts->index);
        return NULL;
    }
    if (strcmp(device, "cpu") == 0) {
        if (opts->cpu_gemm < DT_CPU_GEMM_AUTO || opts->cpu_gemm > DT_CPU_GEMM_AVX512BF16) {
            dt_error(DT_ERR_INVALID, "device \"cpu\": unknown GEMM choice %d", opts->cpu_gemm);
            return NULL;
        }
        if (dt_cpu_gemm_select(opts->cpu_gemm) != DT_OK) return NULL;
        return dt_ops_cpu();
    }
    if (strcmp(device, "cuda") == 0) {
#ifdef DT_HAVE_CUDA
        dt_cuda_set_memory_opts(!opts->no_vmm, opts->conv_cache_mb);   /* before the table's page_block is set */
        const dt_ops *t = dt_ops_cuda(opts->index, opts->allow_tf32);   /* NULL with the backend's own message */
        if (t && dt_cuda_set_debug(opts->sync, opts->max_blocks) != DT_OK) return NULL;
        return t;
#else
        dt_error(DT_ERR_UNSUPPORTED, "device \"cuda\": this build has no CUDA backend (configure --with-cuda)");
        return NULL;
#endif
    }
    dt_error(DT_ERR_INVALID, "unknown device \"%s\" (expected \"cpu\" or \"cuda\")", device);
    return NULL;
}

const dt_ops *dt_ops_get(const char *device) { return dt_ops_get_ex(device, NULL); }

double dt_pairwise_sum(double *v, size_t n) {
    if (n == 0) return 0.0;
    while (n > 1) {
        size_t h = n / 2;
        for (size_t i = 0; i < h; i++) v[i] = v[2 * i] + v[2 * i + 1];
        if (n & 1) v[h] = v[n - 1];
        n = h + (n & 1);
    }
    return v[0];
}

/* ---- op names ---- */

static const char *const op_names[DT_OPS_COUNT] = {
#define OP_NAME_(name, params) #name,
    DT_OPS(OP_NAME_)
#undef OP_NAME_
};

const char *dt_ops_op_name(int i) { return i >= 0 && i < DT_OPS_COUNT ? op_names[i] : NULL; }

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
