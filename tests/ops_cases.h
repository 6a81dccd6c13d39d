/*
 * ops_cases.h: one case per compute op, and the harness that runs a case on a backend
 * and compares two runs — the table-driven op test, in the manner of ggml's
 * test-backend-ops.
 *
 * The case table is generated from the op list (ops.h's DT_OPS): op `foo` is run by
 * `tc_foo`, so an op added to the list without a case here does not compile. The
 * activations' cases are generated from their own list (ops_elem.h), so a new
 * activation is tested without writing anything here.
 *
 * A case draws fresh random inputs from its own seed (the same on every backend and
 * run), calls the op on shapes with odd sizes and remainders (large enough to engage
 * the CPU's threads), and registers the buffers to compare, each with the tolerance
 * its contract states:
 *   TC_EXACT (0)  bitwise: data movement, selection, IEEE add/mul/div/sqrt in the CPU's
 *                 order, the reductions whose CUDA kernels sum in the CPU's order;
 *   TC_SUM        1e-6 normwise, max |b - a| / max |a|: the reductions the CUDA backend
 *                 runs in its own GPU-friendly order (src/cuda/cuda_impl.h: bias
 *                 gradient, layer norm, channel sums of batch norm and conv bias);
 *   TC_TRANSC     1e-6 normwise: transcendentals (CUDA's expf, erff, tanhf, log differ
 *                 from glibc's in the last bits);
 *   TC_GEMM       1e-5 normwise: GEMMs and convolutions (cuBLAS sums in its own order).
 * Outputs start as 0xff bytes, so an element a kernel forgets to write shows.
 * Users: tests/test_ops.c (CPU at 1 thread against 2, always bitwise) and
 * tests/test_cuda_ops.c (CUDA against CPU with the tolerances; tests/gpu_emu.sh runs
 * it on emulated kernels).
 */
#ifndef DT_OPS_CASES_H
#define DT_OPS_CASES_H

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.h"   /* DT_BF16, DT_F16 of the mixed-precision cases */
#include "ops.h"
#include "tap.h"

#define TC_EXACT  0.0
#define TC_SUM    1e-6
#define TC_TRANSC 1e-6
#define TC_GEMM   1e-5

#define TC_MAX_BUF 32
#define TC_MAX_OUT 16

/* One buffer a case asked to compare, read back to the host after the run. */
typedef struct {
    char   what[80];      /* "y", "dx (transA=1 transB=0)" */
    void  *dev;           /* on the backend, until read back */
    void  *host;
    size_t bytes;
    int    f32;           /* float32 data (tolerance and the unwritten check apply) */
    double tol;
} tc_output;

/* A run of one case on one backend. */
typedef struct {
    const dt_ops *ops;
    uint64_t      rng;                /* xorshift64* state, from the case's seed */
    void         *dev[TC_MAX_BUF];    /* device buffers, freed after the run */
    void         *hostbuf[TC_MAX_BUF];/* host scratch, freed after the run */
    int           ndev, nhost, nout;
    tc_output     out[TC_MAX_OUT];
    dt_status     status;             /* the first failure */
    char          error[300];
} tc_run;

typedef struct {
    const char *name;
    void      (*fn)(tc_run *r);
} tc_case;

/* ---- what a case calls ---- */

static inline void tc_fail_(tc_run *r, dt_status s, const char *call) {
    if (s == DT_OK || r->status != DT_OK) return;
    r->status = s;
    snprintf(r->error, sizeof r->error, "%s: %s", call, dt_last_error());
}
/* Call an op (or anything returning dt_status) and remember the first failure. */
#define TC(r, call) tc_fail_((r), (call), #call)

static inline float tc_uniform_(tc_run *r, float lo, float hi) {
    r->rng ^= r->rng >> 12;
    r->rng ^= r->rng << 25;
    r->rng ^= r->rng >> 27;
    uint64_t v = r->rng * 0x2545f4914f6cdd1dull;
    return lo + (hi - lo) * (float)((v >> 40) * (1.0 / 16777216.0));
}

static inline void *tc_hmalloc_(tc_run *r, size_t bytes) {
    void *p = malloc(bytes ? bytes : 4);
    if (!p || r->nhost == TC_MAX_BUF) { printf("Bail out! ops_cases: out of memory or host buffers\n"); exit(1); }
    r->hostbuf[r->nhost++] = p;
    return p;
}

/* A device buffer of `bytes`, freed after the run (NULL after a failure). */
static inline void *tc_dev(tc_run *r, size_t bytes) {
    void *p = NULL;
    if (r->ndev == TC_MAX_BUF) { printf("Bail out! ops_cases: more than %d buffers\n", TC_MAX_BUF); exit(1); }
    TC(r, r->ops->alloc(&p, bytes ? bytes : 4));
    r->dev[r->ndev++] = p;
    return p;
}

/* A device copy of host data. */
static inline void *tc_upload(tc_run *r, const void *host, size_t bytes) {
    void *p = tc_dev(r, bytes);
    if (p && bytes) TC(r, r->ops->copy_h2d(p, host, bytes));
    return p;
}

/* n random floats in [lo, hi) on the host (freed after the run), to edit before upload. */
static inline float *tc_hrand(tc_run *r, size_t n, float lo, float hi) {
    float *h = tc_hmalloc_(r, n * sizeof(float));
    for (size_t i = 0; i < n; i++) h[i] = tc_uniform_(r, lo, hi);
    return h;
}

/* n random floats in [lo, hi) on the device. */
static inline float *tc_rand(tc_run *r, size_t n, float lo, float hi) {
    return tc_upload(r, tc_hrand(r, n, lo, hi), n * sizeof(float));
}

/* B labels in [0, C), every 7th ignored (-1). */
static inline int32_t *tc_labels(tc_run *r, int B, int C) {
    int32_t *h = tc_hmalloc_(r, (size_t)B * sizeof(int32_t));
    for (int i = 0; i < B; i++) h[i] = i % 7 == 3 ? -1 : (int32_t)(tc_uniform_(r, 0.0f, (float)C)) % C;
    return tc_upload(r, h, (size_t)B * sizeof(int32_t));
}

static inline void *tc_register_(tc_run *r, void *dev, size_t bytes, int f32, double tol, const char *fmt, va_list ap) {
    if (r->nout == TC_MAX_OUT) { printf("Bail out! ops_cases: more than %d outputs\n", TC_MAX_OUT); exit(1); }
    tc_output *o = &r->out[r->nout++];
    memset(o, 0, sizeof *o);
    vsnprintf(o->what, sizeof o->what, fmt, ap);
    o->dev = dev;
    o->bytes = bytes;
    o->f32 = f32;
    o->tol = tol;
    return dev;
}

/* An output of `bytes` to compare, filled with 0xff bytes first; f32 says it holds floats. */
static inline void *tc_out(tc_run *r, size_t bytes, int f32, double tol, const char *fmt, ...) {
    unsigned char *h = tc_hmalloc_(r, bytes);
    memset(h, 0xff, bytes);
    void *d = tc_upload(r, h, bytes);
    va_list ap;
    va_start(ap, fmt);
    tc_register_(r, d, bytes, f32, tol, fmt, ap);
    va_end(ap);
    return d;
}

/* An output of n floats that the op updates (read and written): random in [lo, hi) first. */
static inline float *tc_inout(tc_run *r, size_t n, float lo, float hi, double tol, const char *fmt, ...) {
    float *d = tc_rand(r, n, lo, hi);
    va_list ap;
    va_start(ap, fmt);
    tc_register_(r, d, n * sizeof(float), 1, tol, fmt, ap);
    va_end(ap);
    return d;
}

/* ---- the cases (shapes: odd, with remainders; above the CPU's parallel thresholds) ---- */

#define TC_N 100003   /* elementwise length */

static void tc_sgemm(tc_run *r) {
    const int M = 263, N = 141, K = 129;   /* > 2M multiply-adds: the CPU cuts C into blocks */
    for (int v = 0; v < 5; v++) {
        int ta = v & 1, tb = (v >> 1) & 1, k = v == 4 ? 0 : K;
        int lda = (ta ? M : k) + 3, ldb = (tb ? k : N) + 1, ldc = N + 2;
        float *A = tc_rand(r, (size_t)(ta ? k : M) * lda + 1, -1.0f, 1.0f);
        float *B = tc_rand(r, (size_t)(tb ? N : k) * ldb + 1, -1.0f, 1.0f);
        float *C = tc_inout(r, (size_t)M * ldc, -1.0f, 1.0f, k ? TC_GEMM : TC_EXACT,
                            "C (transA=%d transB=%d K=%d)", ta, tb, k);
        TC(r, r->ops->sgemm(ta, tb, M, N, k, 0.7f, A, lda, B, ldb, 0.3f, C, ldc));
    }
}

static void tc_bias_add(tc_run *r) {
    const int rows = 301, cols = 131;
    float *b = tc_rand(r, cols, -1.0f, 1.0f);
    float *y = tc_inout(r, (size_t)rows * cols, -1.0f, 1.0f, TC_EXACT, "y");
    TC(r, r->ops->bias_add(y, b, rows, cols));
}

static void tc_bias_relu(tc_run *r) {
    const int rows = 301, cols = 131;
    float *b = tc_rand(r, cols, -1.0f, 1.0f);
    float *y = tc_inout(r, (size_t)rows * cols, -1.0f, 1.0f, TC_EXACT, "y");
    TC(r, r->ops->bias_relu(y, b, rows, cols));
}

static void tc_bias_grad(tc_run *r) {
    const int rows = 301, cols = 131;
    float *dy = tc_rand(r, (size_t)rows * cols, -1.0f, 1.0f);
    float *db = tc_out(r, cols * sizeof(float), 1, TC_SUM, "db");
    TC(r, r->ops->bias_grad(db, dy, rows, cols));
}

/* Activations, from ops_elem.h's list: x in [-8, 8) with zeros and +-20 among it;
 * backward reads the forward's x or y (the row says which), y computed by the same
 * backend's forward. The row's tolerance is the contract. */
#define TC_SAVED_x(x, y) x
#define TC_SAVED_y(x, y) y
static inline float *tc_act_input_(tc_run *r) {
    float *h = tc_hrand(r, TC_N, -8.0f, 8.0f);
    h[0] = 0.0f; h[1] = -0.0f; h[2] = 20.0f; h[3] = -20.0f;
    return tc_upload(r, h, TC_N * sizeof(float));
}
#define TC_ELEM_CASES_(X_, name, saved, tol) \
static void tc_##name##_forward(tc_run *r) { \
    float *x = tc_act_input_(r); \
    float *y = tc_out(r, TC_N * sizeof(float), 1, tol, "y"); \
    TC(r, r->ops->name##_forward(y, x, TC_N)); \
} \
static void tc_##name##_backward(tc_run *r) { \
    float *x = tc_act_input_(r), *dy = tc_rand(r, TC_N, -1.0f, 1.0f), *y = tc_dev(r, TC_N * sizeof(float)); \
    TC(r, r->ops->name##_forward(y, x, TC_N)); \
    float *dx = tc_out(r, TC_N * sizeof(float), 1, tol, "dx"); \
    TC(r, r->ops->name##_backward(dx, dy, TC_SAVED_##saved(x, y), TC_N)); \
}
DT_OPS_ELEM(TC_ELEM_CASES_, _)
#undef TC_ELEM_CASES_

static void tc_dropout_forward(tc_run *r) {
    const int rows = 67, cols = 1001;
    float *x = tc_rand(r, (size_t)rows * cols, -1.0f, 1.0f);
    float *y = tc_out(r, (size_t)rows * cols * sizeof(float), 1, TC_EXACT, "y");
    TC(r, r->ops->dropout_forward(y, x, rows, cols, 0.3f, 1234, 7, 2, 5000));
}

static void tc_dropout_backward(tc_run *r) {
    const int rows = 67, cols = 1001;
    float *dy = tc_rand(r, (size_t)rows * cols, -1.0f, 1.0f);
    float *dx = tc_out(r, (size_t)rows * cols * sizeof(float), 1, TC_EXACT, "dx");
    TC(r, r->ops->dropout_backward(dx, dy, rows, cols, 0.3f, 1234, 7, 2, 5000));
}

static void tc_xent_forward(tc_run *r) {
    const int B = 3301, C = 10;
    float *logits = tc_rand(r, (size_t)B * C, -5.0f, 5.0f);
    int32_t *labels = tc_labels(r, B, C);
    float *loss = tc_out(r, sizeof(float), 1, TC_TRANSC, "loss");
    float *probs = tc_out(r, (size_t)B * C * sizeof(float), 1, TC_TRANSC, "probs");
    TC(r, r->ops->xent_forward(loss, probs, logits, labels, B, C, 0.1f, 128.0f));
    /* over the logits themselves, as a model whose last layer's output is not read again
     * calls it, and the loss alone: on fewer rows (still more than the emulated grid's
     * warps, with a remainder), as an emulated warp-per-row kernel costs seconds per
     * thousand rows */
    const int Bs = 331;
    float *lossi = tc_out(r, sizeof(float), 1, TC_TRANSC, "loss in place");
    float *pi = tc_out(r, (size_t)Bs * C * sizeof(float), 1, TC_TRANSC, "probs in place");
    TC(r, r->ops->copy_d2d(pi, logits, (size_t)Bs * C * sizeof(float)));
    TC(r, r->ops->xent_forward(lossi, pi, pi, labels, Bs, C, 0.1f, 128.0f));
    float *loss0 = tc_out(r, sizeof(float), 1, TC_TRANSC, "loss alone");
    TC(r, r->ops->xent_forward(loss0, NULL, logits, labels, Bs, C, 0.1f, 128.0f));
}

static void tc_xent_backward(tc_run *r) {
    const int B = 3301, C = 10;
    float *probs = tc_rand(r, (size_t)B * C, 0.0f, 1.0f);
    int32_t *labels = tc_labels(r, B, C);
    float *d = tc_out(r, (size_t)B * C * sizeof(float), 1, TC_EXACT, "dlogits");
    TC(r, r->ops->xent_backward(d, probs, labels, B, C, 0.1f, 128.0f));
    /* in place over the probabilities, as the model calls it */
    float *dp = tc_out(r, (size_t)B * C * sizeof(float), 1, TC_EXACT, "dlogits in place");
    TC(r, r->ops->copy_d2d(dp, probs, (size_t)B * C * sizeof(float)));
    TC(r, r->ops->xent_backward(dp, dp, labels, B, C, 0.1f, 128.0f));
}

static void tc_mse_forward(tc_run *r) {
    float *p = tc_rand(r, TC_N, -1.0f, 1.0f), *t = tc_rand(r, TC_N, -1.0f, 1.0f);
    float *loss = tc_out(r, sizeof(float), 1, TC_EXACT, "loss");
    TC(r, r->ops->mse_forward(loss, p, t, TC_N, 3.0f));
}

static void tc_mse_backward(tc_run *r) {
    float *p = tc_rand(r, TC_N, -1.0f, 1.0f), *t = tc_rand(r, TC_N, -1.0f, 1.0f);
    float *d = tc_out(r, TC_N * sizeof(float), 1, TC_EXACT, "dpred");
    TC(r, r->ops->mse_backward(d, p, t, TC_N, 3.0f));
}

/* Convolution shapes: strided and rectangular with fused relu, a middle layer, a first
 * layer (C = 1) with many output channels. */
static const struct { int N, C, H, W, K, R, S, sh, sw, ph, pw, relu; } tc_convs[] = {
    {5, 3, 9, 8, 4, 3, 2, 2, 1, 1, 1, 1},
    {16, 8, 14, 14, 16, 3, 3, 1, 1, 1, 1, 0},
    {3, 1, 28, 28, 32, 3, 3, 1, 1, 1, 1, 1},
};
#define TC_NCONV ((int)(sizeof tc_convs / sizeof tc_convs[0]))

static dt_conv2d_desc tc_conv_desc_(tc_run *r, int v) {
    dt_conv2d_desc d = {.N = tc_convs[v].N, .C = tc_convs[v].C, .H = tc_convs[v].H, .W = tc_convs[v].W,
                        .K = tc_convs[v].K, .R = tc_convs[v].R, .S = tc_convs[v].S,
                        .stride_h = tc_convs[v].sh, .stride_w = tc_convs[v].sw,
                        .pad_h = tc_convs[v].ph, .pad_w = tc_convs[v].pw};
    TC(r, dt_conv2d_desc_init(&d));
    return d;
}

static void tc_conv2d_forward(tc_run *r) {
    for (int v = 0; v < TC_NCONV; v++) {
        dt_conv2d_desc d = tc_conv_desc_(r, v);
        float *x = tc_rand(r, (size_t)d.N * d.C * d.H * d.W, -1.0f, 1.0f);
        float *w = tc_rand(r, (size_t)d.K * d.C * d.R * d.S, -1.0f, 1.0f);
        float *b = v == 1 ? NULL : tc_rand(r, d.K, -1.0f, 1.0f);
        float *y = tc_out(r, (size_t)d.N * d.K * d.P * d.Q * sizeof(float), 1, TC_GEMM, "y (shape %d%s%s)", v,
                          b ? "" : ", no bias", tc_convs[v].relu ? ", relu" : "");
        TC(r, r->ops->conv2d_forward(&d, y, x, w, b, tc_convs[v].relu));
    }
}

static void tc_conv2d_backward(tc_run *r) {
    for (int v = 0; v < TC_NCONV; v++) {
        dt_conv2d_desc d = tc_conv_desc_(r, v);
        size_t nx = (size_t)d.N * d.C * d.H * d.W, nw = (size_t)d.K * d.C * d.R * d.S;
        float *x = tc_rand(r, nx, -1.0f, 1.0f), *w = tc_rand(r, nw, -1.0f, 1.0f);
        float *dy = tc_rand(r, (size_t)d.N * d.K * d.P * d.Q, -1.0f, 1.0f);
        float *dx = v == 2 ? NULL : tc_out(r, nx * sizeof(float), 1, TC_GEMM, "dx (shape %d)", v);   /* a first layer: no dx */
        float *dw = tc_out(r, nw * sizeof(float), 1, TC_GEMM, "dw (shape %d)", v);
        float *db = tc_out(r, d.K * sizeof(float), 1, TC_SUM, "dbias (shape %d)", v);
        TC(r, r->ops->conv2d_backward(&d, dx, dw, db, dy, x, w));
    }
}

/* Pooling windows: 2x2/2, 3x3/2 padded, 3x3/1 padded; the input has a tie and a NaN. */
static const int tc_pools[][3] = {{2, 2, 0}, {3, 2, 1}, {3, 1, 1}};

static dt_pool2d_desc tc_pool_desc_(tc_run *r, int v) {
    dt_pool2d_desc d = {.N = 8, .C = 8, .H = 24, .W = 23, .kh = tc_pools[v][0], .kw = tc_pools[v][0],
                        .stride_h = tc_pools[v][1], .stride_w = tc_pools[v][1],
                        .pad_h = tc_pools[v][2], .pad_w = tc_pools[v][2]};
    TC(r, dt_pool2d_desc_init(&d));
    return d;
}

static float *tc_pool_input_(tc_run *r, const dt_pool2d_desc *d, int nan) {
    size_t nx = (size_t)d->N * d->C * d->H * d->W;
    float *h = tc_hrand(r, nx, -1.0f, 1.0f);
    h[7] = h[8];                      /* a tie: the first maximum wins */
    if (nan) h[30] = nanf("");        /* NaN propagates */
    return tc_upload(r, h, nx * sizeof(float));
}

static void tc_maxpool2d_forward(tc_run *r) {
    for (int v = 0; v < 3; v++) {
        dt_pool2d_desc d = tc_pool_desc_(r, v);
        size_t ny = (size_t)d.N * d.C * d.P * d.Q;
        float *x = tc_pool_input_(r, &d, 1);
        float *y = tc_out(r, ny * sizeof(float), 1, TC_EXACT, "y (window %d)", v);
        int32_t *idx = tc_out(r, ny * sizeof(int32_t), 0, TC_EXACT, "idx (window %d)", v);
        TC(r, r->ops->maxpool2d_forward(&d, y, idx, x));
    }
}

static void tc_maxpool2d_backward(tc_run *r) {
    for (int v = 0; v < 3; v++) {
        dt_pool2d_desc d = tc_pool_desc_(r, v);
        size_t nx = (size_t)d.N * d.C * d.H * d.W, ny = (size_t)d.N * d.C * d.P * d.Q;
        float *x = tc_pool_input_(r, &d, 0), *y = tc_dev(r, ny * sizeof(float)), *dy = tc_rand(r, ny, -1.0f, 1.0f);
        int32_t *idx = tc_dev(r, ny * sizeof(int32_t));
        TC(r, r->ops->maxpool2d_forward(&d, y, idx, x));   /* valid indices, from this backend */
        float *dx = tc_out(r, nx * sizeof(float), 1, TC_EXACT, "dx (window %d)", v);
        TC(r, r->ops->maxpool2d_backward(&d, dx, dy, idx));
    }
}

static void tc_avgpool2d_forward(tc_run *r) {
    for (int v = 0; v < 3; v++) {
        dt_pool2d_desc d = tc_pool_desc_(r, v);
        float *x = tc_pool_input_(r, &d, 0);
        float *y = tc_out(r, (size_t)d.N * d.C * d.P * d.Q * sizeof(float), 1, TC_EXACT, "y (window %d)", v);
        TC(r, r->ops->avgpool2d_forward(&d, y, x));
    }
}

static void tc_avgpool2d_backward(tc_run *r) {
    for (int v = 0; v < 3; v++) {
        dt_pool2d_desc d = tc_pool_desc_(r, v);
        float *dy = tc_rand(r, (size_t)d.N * d.C * d.P * d.Q, -1.0f, 1.0f);
        float *dx = tc_out(r, (size_t)d.N * d.C * d.H * d.W * sizeof(float), 1, TC_EXACT, "dx (window %d)", v);
        TC(r, r->ops->avgpool2d_backward(&d, dx, dy));
    }
}

#define TC_GN 67
#define TC_GC 16
#define TC_GHW 49

static void tc_global_avgpool_forward(tc_run *r) {
    float *x = tc_rand(r, (size_t)TC_GN * TC_GC * TC_GHW, -1.0f, 1.0f);
    float *y = tc_out(r, (size_t)TC_GN * TC_GC * sizeof(float), 1, TC_EXACT, "y");
    TC(r, r->ops->global_avgpool_forward(y, x, TC_GN, TC_GC, TC_GHW));
}

static void tc_global_avgpool_backward(tc_run *r) {
    float *dy = tc_rand(r, (size_t)TC_GN * TC_GC, -1.0f, 1.0f);
    float *dx = tc_out(r, (size_t)TC_GN * TC_GC * TC_GHW * sizeof(float), 1, TC_EXACT, "dx");
    TC(r, r->ops->global_avgpool_backward(dx, dy, TC_GN, TC_GC, TC_GHW));
}

/* Batch norm on (N, C, HW) = (33, 16, 197): statistics drawn where the op needs them. */
#define TC_BN 33
#define TC_BC 16
#define TC_BHW 197
#define TC_BSIZE ((size_t)TC_BN * TC_BC * TC_BHW)

static void tc_bn_stats(tc_run *r) {
    float *x = tc_rand(r, TC_BSIZE, 1.0f, 5.0f);   /* a mean away from 0 */
    float *sum = tc_out(r, TC_BC * sizeof(float), 1, TC_SUM, "sum");
    float *sumsq = tc_out(r, TC_BC * sizeof(float), 1, TC_SUM, "sumsq");
    TC(r, r->ops->bn_stats(sum, sumsq, x, TC_BN, TC_BC, TC_BHW));
}

static void tc_bn_finalize(tc_run *r) {
    const int64_t count = (int64_t)TC_BN * TC_BHW;
    for (int v = 0; v < 2; v++) {
        float *s = tc_hrand(r, TC_BC, -1.0f, 1.0f), *ss = tc_hrand(r, TC_BC, 0.5f, 2.0f);
        for (int c = 0; c < TC_BC; c++) { ss[c] = (ss[c] + s[c] * s[c]) * (float)count; s[c] *= (float)count; }
        float *sum = tc_upload(r, s, TC_BC * sizeof(float)), *sumsq = tc_upload(r, ss, TC_BC * sizeof(float));
        float *mean = tc_out(r, TC_BC * sizeof(float), 1, TC_EXACT, "mean%s", v ? " (running stats)" : "");
        float *invstd = tc_out(r, TC_BC * sizeof(float), 1, TC_EXACT, "invstd%s", v ? " (running stats)" : "");
        float *rm = v ? tc_inout(r, TC_BC, -1.0f, 1.0f, TC_EXACT, "running_mean") : NULL;
        float *rv = v ? tc_inout(r, TC_BC, 0.5f, 2.0f, TC_EXACT, "running_var") : NULL;
        TC(r, r->ops->bn_finalize(mean, invstd, sum, sumsq, TC_BC, count, 1e-5f, rm, rv, 0.1f));
    }
}

static void tc_bn_invstd(tc_run *r) {
    const int C = 1001;
    float *var = tc_rand(r, C, 0.1f, 2.0f);
    float *invstd = tc_out(r, C * sizeof(float), 1, TC_EXACT, "invstd");
    TC(r, r->ops->bn_invstd(invstd, var, C, 1e-5f));
}

static void tc_bn_apply(tc_run *r) {
    float *x = tc_rand(r, TC_BSIZE, -2.0f, 4.0f), *mean = tc_rand(r, TC_BC, 0.0f, 2.0f);
    float *invstd = tc_rand(r, TC_BC, 0.5f, 2.0f), *gamma = tc_rand(r, TC_BC, -1.0f, 1.0f);
    float *beta = tc_rand(r, TC_BC, -1.0f, 1.0f);
    for (int v = 0; v < 3; v++) {   /* affine, affine + relu, no affine */
        float *y = tc_out(r, TC_BSIZE * sizeof(float), 1, TC_EXACT, "y (%s)", v == 0 ? "affine" : v == 1 ? "affine, relu" : "no affine");
        TC(r, r->ops->bn_apply(y, x, mean, invstd, v < 2 ? gamma : NULL, v < 2 ? beta : NULL, TC_BN, TC_BC, TC_BHW, v == 1));
    }
}

static void tc_bn_backward_reduce(tc_run *r) {
    float *dy = tc_rand(r, TC_BSIZE, -1.0f, 1.0f), *x = tc_rand(r, TC_BSIZE, -2.0f, 4.0f);
    float *mean = tc_rand(r, TC_BC, 0.0f, 2.0f), *invstd = tc_rand(r, TC_BC, 0.5f, 2.0f);
    float *s1 = tc_out(r, TC_BC * sizeof(float), 1, TC_SUM, "sum_dy");
    float *s2 = tc_out(r, TC_BC * sizeof(float), 1, TC_SUM, "sum_dy_xhat");
    TC(r, r->ops->bn_backward_reduce(s1, s2, dy, x, mean, invstd, TC_BN, TC_BC, TC_BHW));
}

static void tc_bn_backward_dx(tc_run *r) {
    float *dy = tc_rand(r, TC_BSIZE, -1.0f, 1.0f), *x = tc_rand(r, TC_BSIZE, -2.0f, 4.0f);
    float *mean = tc_rand(r, TC_BC, 0.0f, 2.0f), *invstd = tc_rand(r, TC_BC, 0.5f, 2.0f);
    float *gamma = tc_rand(r, TC_BC, -1.0f, 1.0f);
    float *s1 = tc_rand(r, TC_BC, -100.0f, 100.0f), *s2 = tc_rand(r, TC_BC, -100.0f, 100.0f);
    for (int v = 0; v < 2; v++) {
        float *dx = tc_out(r, TC_BSIZE * sizeof(float), 1, TC_EXACT, "dx (%s)", v ? "gamma NULL" : "gamma");
        TC(r, r->ops->bn_backward_dx(dx, dy, x, mean, invstd, v ? NULL : gamma, s1, s2, TC_BN, TC_BC, TC_BHW,
                                     (int64_t)TC_BN * TC_BHW));
    }
}

#define TC_LR 257
#define TC_LC 333

static void tc_layernorm_forward(tc_run *r) {
    float *x = tc_rand(r, (size_t)TC_LR * TC_LC, -1.0f, 3.0f);
    float *g = tc_rand(r, TC_LC, -1.0f, 1.0f), *b = tc_rand(r, TC_LC, -1.0f, 1.0f);
    for (int v = 0; v < 2; v++) {
        const char *aff = v ? "no affine" : "affine";
        float *y = tc_out(r, (size_t)TC_LR * TC_LC * sizeof(float), 1, TC_SUM, "y (%s)", aff);
        float *mean = tc_out(r, TC_LR * sizeof(float), 1, TC_SUM, "mean (%s)", aff);
        float *rstd = tc_out(r, TC_LR * sizeof(float), 1, TC_SUM, "rstd (%s)", aff);
        TC(r, r->ops->layernorm_forward(y, mean, rstd, x, v ? NULL : g, v ? NULL : b, TC_LR, TC_LC, 1e-5f));
    }
}

static void tc_layernorm_backward(tc_run *r) {
    size_t n = (size_t)TC_LR * TC_LC;
    float *x = tc_rand(r, n, -1.0f, 3.0f), *dy = tc_rand(r, n, -1.0f, 1.0f), *g = tc_rand(r, TC_LC, -1.0f, 1.0f);
    float *y = tc_dev(r, n * sizeof(float)), *mean = tc_dev(r, TC_LR * sizeof(float)), *rstd = tc_dev(r, TC_LR * sizeof(float));
    TC(r, r->ops->layernorm_forward(y, mean, rstd, x, g, NULL, TC_LR, TC_LC, 1e-5f));
    float *dx = tc_out(r, n * sizeof(float), 1, TC_SUM, "dx");
    float *dg = tc_out(r, TC_LC * sizeof(float), 1, TC_SUM, "dgamma");
    float *db = tc_out(r, TC_LC * sizeof(float), 1, TC_SUM, "dbeta");
    TC(r, r->ops->layernorm_backward(dx, dg, db, dy, x, mean, rstd, g, TC_LR, TC_LC));
    float *dg2 = tc_out(r, TC_LC * sizeof(float), 1, TC_SUM, "dgamma alone");
    TC(r, r->ops->layernorm_backward(NULL, dg2, NULL, dy, x, mean, rstd, g, TC_LR, TC_LC));
}

static void tc_rmsnorm_forward(tc_run *r) {
    float *x = tc_rand(r, (size_t)TC_LR * TC_LC, -1.0f, 3.0f), *w = tc_rand(r, TC_LC, -1.0f, 1.0f);
    for (int v = 0; v < 2; v++) {
        const char *aff = v ? "no weight" : "weight";
        float *y = tc_out(r, (size_t)TC_LR * TC_LC * sizeof(float), 1, TC_SUM, "y (%s)", aff);
        float *rstd = tc_out(r, TC_LR * sizeof(float), 1, TC_SUM, "rstd (%s)", aff);
        TC(r, r->ops->rmsnorm_forward(y, rstd, x, v ? NULL : w, TC_LR, TC_LC, 1e-5f));
    }
}

static void tc_rmsnorm_backward(tc_run *r) {
    size_t n = (size_t)TC_LR * TC_LC;
    float *x = tc_rand(r, n, -1.0f, 3.0f), *dy = tc_rand(r, n, -1.0f, 1.0f), *w = tc_rand(r, TC_LC, -1.0f, 1.0f);
    float *y = tc_dev(r, n * sizeof(float)), *rstd = tc_dev(r, TC_LR * sizeof(float));
    TC(r, r->ops->rmsnorm_forward(y, rstd, x, w, TC_LR, TC_LC, 1e-5f));
    float *dx = tc_out(r, n * sizeof(float), 1, TC_SUM, "dx");
    float *dw = tc_out(r, TC_LC * sizeof(float), 1, TC_SUM, "dw");
    TC(r, r->ops->rmsnorm_backward(dx, dw, dy, x, rstd, w, TC_LR, TC_LC));
    float *dw2 = tc_out(r, TC_LC * sizeof(float), 1, TC_SUM, "dw alone");
    TC(r, r->ops->rmsnorm_backward(NULL, dw2, dy, x, rstd, w, TC_LR, TC_LC));
}

static void tc_swiglu_forward(tc_run *r) {
    float *gu = tc_rand(r, (size_t)TC_LR * 2 * TC_LC, -4.0f, 4.0f);
    float *h = tc_out(r, (size_t)TC_LR * TC_LC * sizeof(float), 1, TC_TRANSC, "h");
    TC(r, r->ops->swiglu_forward(h, gu, TC_LR, TC_LC));
}

static void tc_swiglu_backward(tc_run *r) {
    size_t n = (size_t)TC_LR * TC_LC;
    float *gu = tc_rand(r, 2 * n, -4.0f, 4.0f), *dh = tc_rand(r, n, -1.0f, 1.0f);
    float *dgu = tc_out(r, 2 * n * sizeof(float), 1, TC_TRANSC, "dgu");
    TC(r, r->ops->swiglu_backward(dgu, dh, gu, TC_LR, TC_LC));
    float *inplace = tc_inout(r, 2 * n, -4.0f, 4.0f, TC_TRANSC, "dgu (in place over gu)");
    TC(r, r->ops->swiglu_backward(inplace, dh, inplace, TC_LR, TC_LC));
}

static void tc_count_correct(tc_run *r) {
    const int B = 1001, C = 10;
    float *h = tc_hrand(r, (size_t)B * C, -1.0f, 1.0f);
    h[1 * C + 4] = h[1 * C + 7] = 5.0f;   /* a tie: the first maximum wins */
    h[2 * C + 6] = nanf("");              /* a NaN beats any number */
    float *logits = tc_upload(r, h, (size_t)B * C * sizeof(float));
    int32_t *labels = tc_labels(r, B, C);
    int32_t *correct = tc_out(r, sizeof(int32_t), 0, TC_EXACT, "correct");
    TC(r, r->ops->count_correct(correct, logits, labels, B, C));
}

static void tc_sumsq(tc_run *r) {
    const size_t n = 1000003;
    float *x = tc_rand(r, n, -1.0f, 1.0f);
    float *out = tc_out(r, sizeof(float), 1, TC_EXACT, "out");
    TC(r, r->ops->sumsq(out, x, n));
}

static void tc_sumsq_chunks(tc_run *r) {
    const size_t n = 3 * DT_SUM_CHUNK + 17;
    float *x = tc_rand(r, n, -1.0f, 1.0f);
    double *part = tc_out(r, 4 * sizeof(double), 0, TC_EXACT, "part");
    TC(r, r->ops->sumsq_chunks(part, x, n));
}

static void tc_fill(tc_run *r) {
    float *x = tc_out(r, TC_N * sizeof(float), 1, TC_EXACT, "x");
    TC(r, r->ops->fill(x, 0.37f, TC_N));
}

static void tc_scale(tc_run *r) {
    float *x = tc_inout(r, TC_N, -1.0f, 1.0f, TC_EXACT, "x");
    TC(r, r->ops->scale(x, -1.7f, TC_N));
}

static void tc_add(tc_run *r) {
    float *x = tc_rand(r, TC_N, -1.0f, 1.0f), *y = tc_rand(r, TC_N, -1.0f, 1.0f);
    float *z = tc_out(r, TC_N * sizeof(float), 1, TC_EXACT, "z");
    TC(r, r->ops->add(z, x, y, TC_N));
}

/* f32 sources for the casts: wide random values, with the special ones first. */
static float *tc_cast_source_(tc_run *r) {
    static const float sp[] = {0.0f, -0.0f, 1.0f, -2.5f, 65504.0f, 65520.0f, 1e-8f, 6e-8f, 3e-5f, INFINITY,
                               -INFINITY, NAN, 3.4e38f, 1.00048828125f, 1.0009765625f, -1e-40f};
    float *h = tc_hrand(r, TC_N, -1000.0f, 1000.0f);
    memcpy(h, sp, sizeof sp);
    return tc_upload(r, h, TC_N * sizeof(float));
}

/* 16-bit sources: every pattern, then random ones. */
static uint16_t *tc_half_source_(tc_run *r) {
    uint16_t *h = tc_hmalloc_(r, TC_N * sizeof(uint16_t));
    for (size_t i = 0; i < TC_N; i++) h[i] = i < 65536 ? (uint16_t)i : (uint16_t)tc_uniform_(r, 0.0f, 65536.0f);
    return tc_upload(r, h, TC_N * sizeof(uint16_t));
}

/* The casts, each from its kind of source, compared as bytes (NaN payloads too). */
#define TC_CAST_CASE_(op, source, dst_t) \
static void tc_##op(tc_run *r) { \
    dst_t *d = tc_out(r, TC_N * sizeof(dst_t), 0, TC_EXACT, #op); \
    TC(r, r->ops->op(d, source(r), TC_N)); \
}
TC_CAST_CASE_(f32_to_bf16, tc_cast_source_, uint16_t)
TC_CAST_CASE_(bf16_to_f32, tc_half_source_, float)
TC_CAST_CASE_(f32_to_f16, tc_cast_source_, uint16_t)
TC_CAST_CASE_(f16_to_f32, tc_half_source_, float)
#undef TC_CAST_CASE_

/* Rounding to bf16 and f16 from the casts' sources (their special values), out of place
 * and in place; bitwise: it is the casts' code. */
static void tc_round_to(tc_run *r) {
    static const int dt[2] = {DT_BF16, DT_F16};
    for (int k = 0; k < 2; k++) {
        float *x = tc_cast_source_(r);
        float *y = tc_out(r, TC_N * sizeof(float), 0, TC_EXACT, "y (%s)", dt_dtype_name((dt_dtype)dt[k]));
        TC(r, r->ops->round_to(y, x, TC_N, dt[k]));
        TC(r, r->ops->round_to(x, x, TC_N, dt[k]));
        float *inplace = tc_out(r, TC_N * sizeof(float), 0, TC_EXACT, "in place (%s)", dt_dtype_name((dt_dtype)dt[k]));
        TC(r, r->ops->copy_d2d(inplace, x, TC_N * sizeof(float)));
    }
}

/* The GEMM of rounded operands, as the sgemm case (transposes, strides, K = 0). */
static void tc_gemm_lp(tc_run *r) {
    const int M = 263, N = 141, K = 129;
    for (int v = 0; v < 5; v++) {
        int ta = v & 1, tb = (v >> 1) & 1, k = v == 4 ? 0 : K, dt = v & 1 ? DT_F16 : DT_BF16;
        int lda = (ta ? M : k) + 3, ldb = (tb ? k : N) + 1, ldc = N + 2;
        size_t na = (size_t)(ta ? k : M) * lda + 1, nb = (size_t)(tb ? N : k) * ldb + 1;
        float *A = tc_rand(r, na, -1.0f, 1.0f), *B = tc_rand(r, nb, -1.0f, 1.0f);
        TC(r, r->ops->round_to(A, A, na, dt));
        TC(r, r->ops->round_to(B, B, nb, dt));
        float *C = tc_inout(r, (size_t)M * ldc, -1.0f, 1.0f, k ? TC_GEMM : TC_EXACT, "C (%s transA=%d transB=%d K=%d)",
                            dt_dtype_name((dt_dtype)dt), ta, tb, k);
        TC(r, r->ops->gemm_lp(dt, ta, tb, M, N, k, 0.7f, A, lda, B, ldb, 0.3f, C, ldc));
    }
}

/* The GEMM with a 16-bit B (row stride past its width), A transposed or not, and K = 0. */
static void tc_gemm_lp_b16(tc_run *r) {
    const int M = 131, N = 77, K = 67;
    for (int v = 0; v < 5; v++) {
        int ta = v & 1, k = v == 4 ? 0 : K, dt = (v >> 1) & 1 ? DT_F16 : DT_BF16;
        int lda = (ta ? M : k) + 3, ldb = N + 5, ldc = N + 2;
        size_t na = (size_t)(ta ? k : M) * lda + 1, nb = (size_t)k * ldb + 1;
        float *A = tc_rand(r, na, -1.0f, 1.0f), *Bf = tc_rand(r, nb, -1.0f, 1.0f);
        TC(r, r->ops->round_to(A, A, na, dt));
        uint16_t *B = tc_dev(r, nb * sizeof(uint16_t));
        TC(r, dt == DT_BF16 ? r->ops->f32_to_bf16(B, Bf, nb) : r->ops->f32_to_f16(B, Bf, nb));
        float *C = tc_inout(r, (size_t)M * ldc, -1.0f, 1.0f, k ? TC_GEMM : TC_EXACT, "C (%s transA=%d K=%d)",
                            dt_dtype_name((dt_dtype)dt), ta, k);
        TC(r, r->ops->gemm_lp_b16(dt, ta, M, N, k, 0.7f, A, lda, B, ldb, 0.3f, C, ldc));
    }
}

/* The flag over finite data, with one inf, one NaN, and over nothing. */
static void tc_nonfinite(tc_run *r) {
    float *h = tc_hrand(r, TC_N, -1e30f, 1e30f);
    float *x = tc_upload(r, h, TC_N * sizeof(float));
    int32_t *f = tc_out(r, sizeof(int32_t), 0, TC_EXACT, "finite");
    TC(r, r->ops->nonfinite(f, x, TC_N));
    h[TC_N - 7] = -INFINITY;
    float *xi = tc_upload(r, h, TC_N * sizeof(float));
    int32_t *fi = tc_out(r, sizeof(int32_t), 0, TC_EXACT, "an inf");
    TC(r, r->ops->nonfinite(fi, xi, TC_N));
    h[TC_N - 7] = 0.0f;
    h[12345] = NAN;
    float *xn = tc_upload(r, h, TC_N * sizeof(float));
    int32_t *fn = tc_out(r, sizeof(int32_t), 0, TC_EXACT, "a NaN");
    TC(r, r->ops->nonfinite(fn, xn, TC_N));
    int32_t *f0 = tc_out(r, sizeof(int32_t), 0, TC_EXACT, "n = 0");
    TC(r, r->ops->nonfinite(f0, xn, 0));
}

/* The step's checks over chunk sums of a gradient: the norm, the clipping coefficient,
 * the gate; with every loss finite, and with a NaN loss (gate 0); no chunks (norm 0). */
static void tc_step_checks(tc_run *r) {
    const size_t n = 37 * DT_SUM_CHUNK + 101, nch = 38;
    float *x = tc_rand(r, n, -1.0f, 1.0f);
    float hl[5] = {2.5f, 2.25f, 3.0f, 1.0f, NAN};
    float *losses = tc_upload(r, hl, sizeof hl);
    const char *what[3] = {"clipped", "a NaN loss", "no norm"};
    for (int c = 0; c < 3; c++) {
        double *parts = tc_dev(r, 2 * nch * sizeof(double));
        TC(r, r->ops->sumsq_chunks(parts, x, n));
        float *out = tc_out(r, 3 * sizeof(float), 1, TC_EXACT, "checks (%s)", what[c]);
        TC(r, r->ops->step_checks(out, parts, parts + nch, c == 2 ? 0 : nch, losses, c == 1 ? 5 : 4, 1.0f, 0.5f));
    }
}

static void tc_clip_scale(tc_run *r) {
    const float coef[2][3] = {{0.0f, 0.37f, 1.0f}, {0.0f, 1.0f, 1.0f}};
    for (int c = 0; c < 2; c++) {
        float *checks = tc_upload(r, coef[c], sizeof coef[c]);
        float *x = tc_inout(r, TC_N, -1.0f, 1.0f, TC_EXACT, "x (coefficient %g)", (double)coef[c][1]);
        TC(r, r->ops->clip_scale(x, checks, TC_N));
    }
}

/* Three steps of each optimizer, with momentum, nesterov, weight decay and a grad scale;
 * a fourth with a closed gate (nothing moves) and a fifth with an open one. */
static void tc_sgd_update(tc_run *r) {
    float *grad = tc_rand(r, TC_N, -1.0f, 1.0f);
    float *p = tc_inout(r, TC_N, -1.0f, 1.0f, TC_EXACT, "p"), *buf = tc_out(r, TC_N * sizeof(float), 1, TC_EXACT, "buf");
    for (int step = 1; step <= 3; step++) {
        dt_sgd_args a = {.lr = 0.05, .momentum = 0.9, .dampening = 0.0, .weight_decay = 1e-4, .grad_scale = 0.5,
                         .nesterov = 1, .first_step = step == 1};
        TC(r, r->ops->sgd_update(p, grad, buf, TC_N, &a));
    }
    for (int open = 0; open <= 1; open++) {
        float g1 = (float)open, *gate = tc_upload(r, &g1, sizeof g1);
        dt_sgd_args a = {.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-4, .grad_scale = 0.5, .gate = gate};
        TC(r, r->ops->sgd_update(p, grad, buf, TC_N, &a));
    }
}

static void tc_adamw_update(tc_run *r) {
    float *grad = tc_rand(r, TC_N, -1.0f, 1.0f);
    float *p = tc_inout(r, TC_N, -1.0f, 1.0f, TC_EXACT, "p");
    float *m = tc_out(r, TC_N * sizeof(float), 1, TC_EXACT, "m"), *v = tc_out(r, TC_N * sizeof(float), 1, TC_EXACT, "v");
    TC(r, r->ops->zero(m, TC_N * sizeof(float)));
    TC(r, r->ops->zero(v, TC_N * sizeof(float)));
    for (int step = 1; step <= 3; step++) {
        dt_adamw_args a = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.01,
                           .grad_scale = 1.0, .step = step};
        TC(r, r->ops->adamw_update(p, grad, m, v, TC_N, &a));
    }
    for (int open = 0; open <= 1; open++) {
        float g1 = (float)open, *gate = tc_upload(r, &g1, sizeof g1);
        dt_adamw_args a = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.01,
                           .grad_scale = 1.0, .step = 4, .gate = gate};
        TC(r, r->ops->adamw_update(p, grad, m, v, TC_N, &a));
    }
}

static void tc_rng_uniform(tc_run *r) {
    float *x = tc_out(r, TC_N * sizeof(float), 1, TC_EXACT, "x");
    TC(r, r->ops->rng_uniform(x, TC_N, -2.0f, 3.0f, 99, 5, 1u << 20));
}

static void tc_rng_normal(tc_run *r) {
    float *x = tc_out(r, TC_N * sizeof(float), 1, TC_TRANSC, "x");
    TC(r, r->ops->rng_normal(x, TC_N, 0.5f, 0.02f, 99, 6, 1u << 20));
}

/* token ids (n) as floats in [0, V), uploaded */
static inline float *tc_ids(tc_run *r, int n, int V) {
    float *h = tc_hrand(r, (size_t)n, 0.0f, (float)V);
    for (int i = 0; i < n; i++) h[i] = floorf(h[i]) < V ? floorf(h[i]) : (float)(V - 1);
    h[0] = h[n - 1];   /* a repeated token: its gradient rows add up */
    return tc_upload(r, h, (size_t)n * sizeof(float));
}

#define TC_SB 3     /* sequences: batch, positions, width, vocabulary */
#define TC_ST 37
#define TC_SC 48
#define TC_SV 101

static void tc_embedding_forward(tc_run *r) {
    int n = TC_SB * TC_ST;
    float *ids = tc_ids(r, n, TC_SV), *W = tc_rand(r, (size_t)TC_SV * TC_SC, -1.0f, 1.0f);
    float *y = tc_out(r, (size_t)n * TC_SC * sizeof(float), 1, TC_EXACT, "y");
    TC(r, r->ops->embedding_forward(y, ids, W, n, TC_SC, TC_SV));
}

static void tc_embedding_backward(tc_run *r) {
    int n = TC_SB * TC_ST;
    float *ids = tc_ids(r, n, TC_SV), *dy = tc_rand(r, (size_t)n * TC_SC, -1.0f, 1.0f);
    float *dW = tc_out(r, (size_t)TC_SV * TC_SC * sizeof(float), 1, TC_EXACT, "dW");
    TC(r, r->ops->embedding_backward(dW, ids, dy, n, TC_SC, TC_SV, 0));
    float *acc = tc_rand(r, (size_t)TC_SV * TC_SC, -1.0f, 1.0f);
    TC(r, r->ops->embedding_backward(acc, ids, dy, n, TC_SC, TC_SV, 1));
    float *out = tc_out(r, (size_t)TC_SV * TC_SC * sizeof(float), 1, TC_EXACT, "dW accumulated");
    TC(r, r->ops->copy_d2d(out, acc, (size_t)TC_SV * TC_SC * sizeof(float)));
}

static void tc_pos_forward(tc_run *r) {
    size_t n = (size_t)TC_SB * TC_ST * TC_SC;
    float *x = tc_rand(r, n, -1.0f, 1.0f), *P = tc_rand(r, (size_t)(TC_ST + 5) * TC_SC, -1.0f, 1.0f);
    float *y = tc_out(r, n * sizeof(float), 1, TC_EXACT, "y");
    TC(r, r->ops->pos_forward(y, x, P, TC_SB, TC_ST, TC_SC));
}

static void tc_pos_backward(tc_run *r) {
    float *dy = tc_rand(r, (size_t)TC_SB * TC_ST * TC_SC, -1.0f, 1.0f);
    float *dP = tc_out(r, (size_t)TC_ST * TC_SC * sizeof(float), 1, TC_EXACT, "dP");
    TC(r, r->ops->pos_backward(dP, dy, TC_SB, TC_ST, TC_SC));
}


/* Grouped-query shapes: 6 query heads of width 8 over K = 6 (multi-head), 2 and 1
 * key/value heads; qkv rows are (H + 2K) D wide. */
#define TC_GH 6
#define TC_GD 8
static const int tc_gk[3] = { TC_GH, 2, 1 };

static void tc_attn_forward(tc_run *r) {
    size_t bt = (size_t)TC_SB * TC_ST;
    for (int v = 0; v < 3; v++) {
        const int K = tc_gk[v], W = (TC_GH + 2 * K) * TC_GD;
        float *qkv = tc_rand(r, bt * W, -2.0f, 2.0f);
        float *y = tc_out(r, bt * TC_GH * TC_GD * sizeof(float), 1, TC_GEMM, "y (K=%d)", K);
        float *lse = tc_out(r, bt * TC_GH * sizeof(float), 1, TC_GEMM, "lse (K=%d)", K);
        TC(r, r->ops->attn_forward(y, lse, qkv, TC_SB, TC_ST, TC_GH, K, TC_GD, DT_F32));
    }
}

static void tc_attn_backward(tc_run *r) {
    size_t bt = (size_t)TC_SB * TC_ST;
    for (int v = 0; v < 3; v++) {
        const int K = tc_gk[v], W = (TC_GH + 2 * K) * TC_GD, C = TC_GH * TC_GD;
        float *qkv = tc_rand(r, bt * W, -2.0f, 2.0f), *dy = tc_rand(r, bt * C, -1.0f, 1.0f);
        float *y = tc_dev(r, bt * C * sizeof(float)), *lse = tc_dev(r, bt * TC_GH * sizeof(float));
        TC(r, r->ops->attn_forward(y, lse, qkv, TC_SB, TC_ST, TC_GH, K, TC_GD, DT_F32));
        float *dqkv = tc_out(r, bt * W * sizeof(float), 1, TC_GEMM, "dqkv (K=%d)", K);
        TC(r, r->ops->attn_backward(dqkv, dy, qkv, y, lse, TC_SB, TC_ST, TC_GH, K, TC_GD, DT_F32));
    }
}

static void tc_attn_decode(tc_run *r) {
    for (int v = 0; v < 3; v++) {
        const int K = tc_gk[v], W = (TC_GH + 2 * K) * TC_GD, C = TC_GH * TC_GD;
        float *q = tc_rand(r, (size_t)C, -2.0f, 2.0f), *kv = tc_rand(r, (size_t)TC_ST * (W - C), -2.0f, 2.0f);
        float *y = tc_out(r, C * sizeof(float), 1, TC_GEMM, "y (last position, K=%d)", K);
        TC(r, r->ops->attn_decode(y, q, kv, TC_ST - 1, TC_GH, K, TC_GD));
        float *y0 = tc_out(r, C * sizeof(float), 1, TC_GEMM, "y (position 0, K=%d)", K);
        TC(r, r->ops->attn_decode(y0, q, kv, 0, TC_GH, K, TC_GD));
    }
}

/* both directions, from position 0 and from a later one (decoding), theta 10000 and 500000 */
static void tc_rope(tc_run *r) {
    const int K = 2, W = (TC_GH + 2 * K) * TC_GD;
    const size_t n = (size_t)TC_SB * TC_ST * W;
    float *a = tc_inout(r, n, -2.0f, 2.0f, TC_TRANSC, "qkv (pos0 0)");
    TC(r, r->ops->rope(a, TC_SB, TC_ST, TC_GH, K, TC_GD, 10000.0f, 0, 0));
    float *b = tc_inout(r, n, -2.0f, 2.0f, TC_TRANSC, "qkv (pos0 300, theta 500000)");
    TC(r, r->ops->rope(b, TC_SB, TC_ST, TC_GH, K, TC_GD, 500000.0f, 300, 0));
    float *c = tc_inout(r, n, -2.0f, 2.0f, TC_TRANSC, "dqkv (inverse)");
    TC(r, r->ops->rope(c, TC_SB, TC_ST, TC_GH, K, TC_GD, 10000.0f, 5, 1));
}

/* The table, in the order of the list: a missing tc_<op> is a compile error. */
static const tc_case tc_cases[DT_OPS_COUNT] = {
#define TC_ROW_(name, params) {#name, tc_##name},
    DT_OPS(TC_ROW_)
#undef TC_ROW_
};

/* ---- the harness ---- */

static inline void tc_result_free(tc_run *r) {
    for (int i = 0; i < r->nout; i++) free(r->out[i].host);
    r->nout = 0;
}

/* Run case function fn on `ops` from `seed` (plus DT_TEST_SEED when set); outputs are
 * read back into r->out[i].host. DT_OK, or the first failure with its message in
 * r->error. */
static inline dt_status tc_exec_fn(void (*fn)(tc_run *), uint64_t seed, const dt_ops *ops, tc_run *r) {
    memset(r, 0, sizeof *r);
    r->ops = ops;
    const char *env = getenv("DT_TEST_SEED");
    r->rng = 0x9e3779b97f4a7c15ull ^ seed ^ (env ? strtoull(env, NULL, 0) : 0);
    fn(r);
    TC(r, ops->synchronize());
    for (int i = 0; i < r->nout; i++) {
        tc_output *o = &r->out[i];
        o->host = malloc(o->bytes ? o->bytes : 4);
        if (!o->host) { printf("Bail out! ops_cases: out of memory\n"); exit(1); }
        memset(o->host, 0, o->bytes);
        if (r->status == DT_OK && o->dev) TC(r, ops->copy_d2h(o->host, o->dev, o->bytes));
        o->dev = NULL;
    }
    for (int i = 0; i < r->ndev; i++) ops->free(r->dev[i]);
    for (int i = 0; i < r->nhost; i++) free(r->hostbuf[i]);
    r->ndev = r->nhost = 0;
    return r->status;
}

/* Run case c of the table on `ops` from a seed fixed by the case (tc_exec_fn). */
static inline dt_status tc_exec(const tc_case *c, const dt_ops *ops, tc_run *r) {
    return tc_exec_fn(c->fn, (uint64_t)(c - tc_cases) * 0x100000001b3ull, ops, r);
}

/* Every float of every f32 output was written (no 0xffffffff left); the first one
 * that was not is named in `why`. */
static inline int tc_all_written(const tc_run *r, char *why, size_t n) {
    for (int i = 0; i < r->nout; i++) {
        const tc_output *o = &r->out[i];
        if (!o->f32) continue;
        const uint32_t *u = o->host;
        for (size_t k = 0; k < o->bytes / 4; k++)
            if (u[k] == 0xffffffffu) { snprintf(why, n, "%s: element %zu was never written", o->what, k); return 0; }
    }
    return 1;
}

/* `got` against `want`, output by output: bitwise when `bitwise` or the output's
 * tolerance is 0, else normwise within the tolerance (NaN only where want has NaN).
 * On failure, `why` names the output and the first difference. */
static inline int tc_same(const tc_run *want, const tc_run *got, int bitwise, char *why, size_t n, double *worst) {
    *worst = 0.0;
    if (want->nout != got->nout) { snprintf(why, n, "%d outputs against %d", got->nout, want->nout); return 0; }
    for (int i = 0; i < want->nout; i++) {
        const tc_output *a = &want->out[i], *b = &got->out[i];
        if (a->bytes != b->bytes) { snprintf(why, n, "%s: %zu bytes against %zu", a->what, b->bytes, a->bytes); return 0; }
        if (bitwise || a->tol == 0.0 || !a->f32) {
            if (memcmp(a->host, b->host, a->bytes) == 0) continue;
            const unsigned char *x = a->host, *y = b->host;
            size_t k = 0;
            while (x[k] == y[k]) k++;
            if (a->f32)
                snprintf(why, n, "%s: element %zu is %.9g, expected %.9g (bitwise)", a->what, k / 4,
                         ((const float *)b->host)[k / 4], ((const float *)a->host)[k / 4]);
            else
                snprintf(why, n, "%s: byte %zu of %zu differs (bitwise)", a->what, k, a->bytes);
            return 0;
        }
        const float *x = a->host, *y = b->host;
        double maxref = 0.0, maxdiff = 0.0;
        for (size_t k = 0; k < a->bytes / 4; k++) {
            if (isnan(x[k]) || isnan(y[k])) {
                if (isnan(x[k]) && isnan(y[k])) continue;
                snprintf(why, n, "%s: element %zu is %g, expected %g", a->what, k, y[k], x[k]);
                return 0;
            }
            if (fabs(x[k]) > maxref) maxref = fabs(x[k]);
            double d = fabs((double)x[k] - y[k]);
            if (d > maxdiff) maxdiff = d;
        }
        double err = maxref > 0.0 ? maxdiff / maxref : maxdiff;
        if (err > *worst) *worst = err;
        if (!(err <= a->tol)) { snprintf(why, n, "%s: normwise error %.2e > %.0e", a->what, err, a->tol); return 0; }
    }
    return 1;
}

/* Test (a): no member of the table is NULL, over the generated lists. */
static inline void tc_check_complete(const dt_ops *t) {
    const char *backend = t->name ? t->name : "(unnamed)";
    int missing = 0, members = 0;
#define TC_DEV_(ret, name, params) members++; if (!t->name) { missing++; diag("   %s: %s is NULL", backend, #name); }
    DT_OPS_DEVICE(TC_DEV_)
#undef TC_DEV_
#define TC_OP_(name, params) members++; if (!t->name) { missing++; diag("   %s: %s is NULL", backend, #name); }
    DT_OPS(TC_OP_)
#undef TC_OP_
    ok(missing == 0 && t->name, "%s table: all %d function members of the op lists are set", backend, members);
}

#endif /* DT_OPS_CASES_H */
