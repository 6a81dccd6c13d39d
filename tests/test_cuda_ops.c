/*
 * test_cuda_ops.c: every kernel of the CUDA backend held against the CPU backend.
 *
 * Each op runs on fresh random inputs (never zeros) on both backends; the GPU's result
 * must match the CPU's within a bound stated per op:
 *   exact      everything whose arithmetic is IEEE add/mul/div/sqrt: data movement,
 *              selection, elementwise ops, casts, optimizer steps, uniform fills, and
 *              the reductions (bias gradients, batch-norm and layer-norm statistics,
 *              pooling, sums, mse): the kernels compute the CPU's formulas in the CPU's
 *              summation order (ops.h) with no fused multiply-adds, so the bits agree;
 *   1e-6       transcendentals (gelu, tanh, softmax and cross-entropy, normal fills:
 *              CUDA's expf/erff/tanhf/log differ from glibc's in the last bits),
 *              normwise: max |gpu - cpu| / max |cpu|;
 *   1e-5       GEMMs and convolutions (cuBLAS sums in another order; TF32 is off).
 * Then determinism: every reduction runs twice on the GPU and must give the same bytes.
 * Bad inputs are checked too (errors name the kernel; kernel-found errors surface at the
 * next synchronize). Without a usable CUDA device the file skips, saying why.
 *
 * DT_CUDA_TEST_SELF=1 runs the comparisons CPU against CPU (a check of this file's
 * own harness on machines without a GPU; every comparison must then be exact).
 * tests/gpu_emu.sh builds this file against the backend's kernels compiled for the CPU
 * (DT_CUDA_TEST_EMU=1), so the kernels' logic is tested on machines without a GPU too.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/dt_cuda.h"
#include "ops.h"
#include "ops_util.h"
#include "rng.h"
#include "status.h"
#include "tap.h"

static const dt_ops *C, *G;   /* reference (cpu) and device under test */
static int self_test;

#define MUST(expr) do { \
    dt_status must_s_ = (expr); \
    if (must_s_ != DT_OK) { printf("Bail out! %s: %s\n", #expr, dt_last_error()); exit(1); } \
} while (0)

/* ---- device buffers ---- */

static void *dev_bytes(const void *h, size_t bytes) {
    void *d = NULL;
    MUST(G->alloc(&d, bytes ? bytes : 4));
    if (h && bytes) MUST(G->copy_h2d(d, h, bytes));
    return d;
}
static float *dev(const float *h, size_t n) { return dev_bytes(h, n * sizeof(float)); }
static float *dev_zero(size_t n) { float *d = dev(NULL, n); MUST(G->zero(d, n * sizeof(float))); return d; }
static float *back(const float *d, size_t n) {
    float *h = tu_alloc(n);
    MUST(G->copy_d2h(h, d, n * sizeof(float)));
    return h;
}
static float *copy_of(const float *h, size_t n) { float *c = tu_alloc(n); memcpy(c, h, n * sizeof(float)); return c; }

/* ---- comparisons ---- */

static void exact(const char *what, const void *want, const void *got, size_t bytes) {
    int same = memcmp(want, got, bytes) == 0;
    ok(same, "%s: bitwise equal to the cpu", what);
    if (!same) {
        const unsigned char *a = want, *b = got;
        size_t i = 0;
        while (i < bytes && a[i] == b[i]) i++;
        diag("   first difference at byte %zu of %zu", i, bytes);
    }
}

static void exact_f(const char *what, const float *want, const float *got, size_t n) {
    exact(what, want, got, n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        if (memcmp(&want[i], &got[i], sizeof(float)) != 0) { diag("   element %zu: cpu %.9g gpu %.9g", i, want[i], got[i]); break; }
}

static void near(const char *what, const float *want, const float *got, size_t n, double tol) {
    double maxref = 0.0, maxdiff = 0.0;
    int nan = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(want[i]) != isnan(got[i])) nan = 1;
        if (fabs(want[i]) > maxref) maxref = fabs(want[i]);
        double d = fabs((double)want[i] - got[i]);
        if (d > maxdiff) maxdiff = d;
    }
    double err = maxref > 0 ? maxdiff / maxref : maxdiff;
    if (self_test) tol = 0.0;
    ok(!nan && err <= tol, "%s: normwise error %.2e <= %.0e", what, err, tol);
}

/* The GPU result twice must be the same bytes (fixed reduction trees, no atomics). */
static void same_twice(const char *what, const void *a, const void *b, size_t bytes) {
    ok(memcmp(a, b, bytes) == 0, "%s: two GPU runs give the same bytes", what);
}

/* ---- GEMM ---- */

static void test_gemm(void) {
    const int M = 67, N = 45, K = 129;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            int lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 1, ldc = N + 2;
            size_t na = (size_t)(ta ? K : M) * lda, nb = (size_t)(tb ? N : K) * ldb, nc = (size_t)M * ldc;
            float *A = tu_rand(na), *B = tu_rand(nb), *Cc = tu_rand(nc), *Cg0 = copy_of(Cc, nc);
            float *dA = dev(A, na), *dB = dev(B, nb), *dC = dev(Cg0, nc);
            MUST(C->sgemm(ta, tb, M, N, K, 0.7f, A, lda, B, ldb, 0.3f, Cc, ldc));
            MUST(G->sgemm(ta, tb, M, N, K, 0.7f, dA, lda, dB, ldb, 0.3f, dC, ldc));
            float *Cg = back(dC, nc);
            char what[64];
            snprintf(what, sizeof what, "sgemm transA=%d transB=%d", ta, tb);
            near(what, Cc, Cg, nc, 1e-5);
            free(A); free(B); free(Cc); free(Cg0); free(Cg);
            G->free(dA); G->free(dB); G->free(dC);
        }
    /* beta = 0 ignores C (NaN in C must not leak), K = 0 gives beta*C */
    {
        const int M = 8, N = 9, K = 0;
        float Cc[72], Cg[72];
        for (int i = 0; i < 72; i++) Cc[i] = NAN;
        float *dC = dev(Cc, 72);
        MUST(C->sgemm(0, 0, M, N, K, 1.0f, Cc, 1, Cc, N, 0.0f, Cc, N));
        MUST(G->sgemm(0, 0, M, N, K, 1.0f, dC, 1, dC, N, 0.0f, dC, N));
        MUST(G->copy_d2h(Cg, dC, sizeof Cg));
        exact_f("sgemm K=0 beta=0 writes zeros over NaN", Cc, Cg, 72);
        G->free(dC);
    }
    /* batched, with A shared across the batch (strideA = 0) */
    {
        const int M = 33, N = 20, K = 17, batch = 5;
        size_t na = (size_t)M * K, nb = (size_t)K * N * batch, nc = (size_t)M * N * batch;
        float *A = tu_rand(na), *B = tu_rand(nb), *Cc = tu_alloc(nc);
        float *dA = dev(A, na), *dB = dev(B, nb), *dC = dev_zero(nc);
        MUST(C->sgemm_batched(0, 1, M, N, K, 1.0f, A, K, 0, B, K, (int64_t)N * K, 0.0f, Cc, N, (int64_t)M * N, batch));
        MUST(G->sgemm_batched(0, 1, M, N, K, 1.0f, dA, K, 0, dB, K, (int64_t)N * K, 0.0f, dC, N, (int64_t)M * N, batch));
        float *Cg = back(dC, nc);
        near("sgemm_batched (strideA 0, transB)", Cc, Cg, nc, 1e-5);
        free(A); free(B); free(Cc); free(Cg);
        G->free(dA); G->free(dB); G->free(dC);
    }
    dt_status s = G->sgemm(0, 0, -1, 4, 4, 1.0f, NULL, 4, NULL, 4, 0.0f, NULL, 4);
    is_int(s, DT_ERR_INVALID, "sgemm with M = -1 is invalid");
    like(dt_last_error(), "sgemm", "the message names the kernel");
    s = G->sgemm(0, 0, 4, 4, 4, 1.0f, (float *)16, 2, (float *)16, 4, 0.0f, (float *)16, 4);
    is_int(s, DT_ERR_INVALID, "sgemm with lda < K is invalid");
}

/* ---- bias, activations, dropout ---- */

static void test_bias_act(void) {
    const int rows = 37, cols = 300, N = 6, Ch = 5, HW = 49;
    size_t n = (size_t)rows * cols, m = (size_t)N * Ch * HW;
    float *y = tu_rand(n), *b = tu_rand(cols), *yc = copy_of(y, n);
    float *dy = dev(y, n), *db = dev(b, cols);
    MUST(C->bias_add(yc, b, rows, cols));
    MUST(G->bias_add(dy, db, rows, cols));
    float *yg = back(dy, n);
    exact_f("bias_add", yc, yg, n);
    free(yg);
    MUST(C->bias_relu(yc, b, rows, cols));
    MUST(G->bias_relu(dy, db, rows, cols));
    yg = back(dy, n);
    exact_f("bias_relu", yc, yg, n);
    free(yg);

    float *z = tu_rand(m), *bc = tu_rand(Ch), *zc = copy_of(z, m);
    float *dz = dev(z, m), *dbc = dev(bc, Ch);
    MUST(C->bias_add_nchw(zc, bc, N, Ch, HW));
    MUST(G->bias_add_nchw(dz, dbc, N, Ch, HW));
    float *zg = back(dz, m);
    exact_f("bias_add_nchw", zc, zg, m);

    /* gradients: column sums and channel sums, twice for determinism */
    float gc[300], g1[300], g2[300];
    MUST(C->bias_grad(gc, y, rows, cols));
    float *dg = dev_zero(cols), *dyin = dev(y, n);
    MUST(G->bias_grad(dg, dyin, rows, cols));
    MUST(G->copy_d2h(g1, dg, sizeof(float) * cols));
    MUST(G->bias_grad(dg, dyin, rows, cols));
    MUST(G->copy_d2h(g2, dg, sizeof(float) * cols));
    exact_f("bias_grad", gc, g1, cols);
    same_twice("bias_grad", g1, g2, sizeof(float) * cols);
    float *dzin = dev(z, m);
    MUST(C->bias_grad_nchw(gc, z, N, Ch, HW));
    MUST(G->bias_grad_nchw(dg, dzin, N, Ch, HW));
    MUST(G->copy_d2h(g1, dg, sizeof(float) * Ch));
    MUST(G->bias_grad_nchw(dg, dzin, N, Ch, HW));
    MUST(G->copy_d2h(g2, dg, sizeof(float) * Ch));
    exact_f("bias_grad_nchw", gc, g1, Ch);
    same_twice("bias_grad_nchw", g1, g2, sizeof(float) * Ch);

    /* activations: forward from x, backward from dy and the forward's x or y */
    float *x = tu_rand(n), *g = tu_rand(n), *outc = tu_alloc(n);
    for (size_t i = 0; i < n; i++) x[i] *= 4.0f;
    float *dx = dev(x, n), *dgr = dev(g, n), *dout = dev_zero(n);
    struct { const char *name; int bwd, exact; } acts[] = {
        {"relu_forward", 0, 1}, {"relu_backward", 1, 1}, {"gelu_forward", 0, 0},
        {"gelu_backward", 1, 0}, {"tanh_forward", 0, 0}, {"tanh_backward", 1, 0},
    };
    for (int k = 0; k < 6; k++) {
        dt_status sc = DT_OK, sg = DT_OK;
        switch (k) {
        case 0: sc = C->relu_forward(outc, x, n); sg = G->relu_forward(dout, dx, n); break;
        case 1: sc = C->relu_backward(outc, g, x, n); sg = G->relu_backward(dout, dgr, dx, n); break;
        case 2: sc = C->gelu_forward(outc, x, n); sg = G->gelu_forward(dout, dx, n); break;
        case 3: sc = C->gelu_backward(outc, g, x, n); sg = G->gelu_backward(dout, dgr, dx, n); break;
        case 4: sc = C->tanh_forward(outc, x, n); sg = G->tanh_forward(dout, dx, n); break;
        default: sc = C->tanh_backward(outc, g, x, n); sg = G->tanh_backward(dout, dgr, dx, n); break;
        }
        MUST(sc);
        MUST(sg);
        float *og = back(dout, n);
        if (acts[k].exact) exact_f(acts[k].name, outc, og, n);
        else near(acts[k].name, outc, og, n, 1e-6);
        free(og);
    }

    /* dropout: the mask is Philox keyed by (seed, stream, epoch, sample, element) */
    MUST(C->dropout_forward(outc, x, rows, cols, 0.3f, 1234, 7, 2, 5000));
    MUST(G->dropout_forward(dout, dx, rows, cols, 0.3f, 1234, 7, 2, 5000));
    float *og = back(dout, n);
    exact_f("dropout_forward (p=0.3)", outc, og, n);
    free(og);
    MUST(C->dropout_backward(outc, g, rows, cols, 0.3f, 1234, 7, 2, 5000));
    MUST(G->dropout_backward(dout, dgr, rows, cols, 0.3f, 1234, 7, 2, 5000));
    og = back(dout, n);
    exact_f("dropout_backward (p=0.3)", outc, og, n);
    free(og);
    is_int(G->dropout_forward(dout, dx, rows, cols, 1.0f, 1, 0, 0, 0), DT_ERR_INVALID, "dropout with p = 1 is invalid");

    free(y); free(b); free(yc); free(z); free(bc); free(zc); free(zg); free(x); free(g); free(outc);
}

/* ---- losses ---- */

static void test_losses(void) {
    const int B = 41, Cn = 10;
    size_t n = (size_t)B * Cn;
    float *logits = tu_rand(n);
    for (size_t i = 0; i < n; i++) logits[i] *= 5.0f;
    int32_t labels[41];
    for (int i = 0; i < B; i++) labels[i] = (int32_t)((i * 7) % Cn);
    labels[3] = -1;   /* ignored rows */
    labels[20] = -100;
    float *pc = tu_alloc(n), lc, lg1, lg2;
    float *dl = dev(logits, n), *dp = dev_zero(n), *dloss = dev_zero(1);
    int32_t *dlab = dev_bytes(labels, sizeof labels);
    MUST(C->xent_forward(&lc, pc, logits, labels, B, Cn, 0.1f, 128.0f));
    MUST(G->xent_forward(dloss, dp, dl, dlab, B, Cn, 0.1f, 128.0f));
    MUST(G->copy_d2h(&lg1, dloss, sizeof(float)));
    float *pg = back(dp, n);
    near("xent_forward probs", pc, pg, n, 1e-6);
    near("xent_forward loss (label smoothing 0.1, ignored rows)", &lc, &lg1, 1, 1e-6);
    MUST(G->xent_forward(dloss, dp, dl, dlab, B, Cn, 0.1f, 128.0f));
    MUST(G->copy_d2h(&lg2, dloss, sizeof(float)));
    same_twice("xent_forward loss", &lg1, &lg2, sizeof(float));

    /* backward from the same probabilities */
    float *dprob = dev(pc, n), *dd = dev_zero(n), *dc = tu_alloc(n);
    MUST(C->xent_backward(dc, pc, labels, B, Cn, 0.1f, 128.0f));
    MUST(G->xent_backward(dd, dprob, dlab, B, Cn, 0.1f, 128.0f));
    float *dg = back(dd, n);
    exact_f("xent_backward", dc, dg, n);

    /* a label >= C: reported by the next synchronisation, naming the kernel */
    labels[5] = Cn;
    MUST(G->copy_h2d(dlab, labels, sizeof labels));
    dt_status s = G->xent_forward(dloss, dp, dl, dlab, B, Cn, 0.0f, 1.0f);
    if (s == DT_OK) s = G->synchronize();
    is_int(s, DT_ERR_INVALID, "xent_forward with a label >= C fails");
    like(dt_last_error(), "xent_forward", "the message names the kernel");
    is_int(G->synchronize(), DT_OK, "the error is reported once");

    /* mse */
    size_t m = 100003;
    float *p = tu_rand(m), *t = tu_rand(m), mc, mg1, mg2;
    float *dpp = dev(p, m), *dt = dev(t, m), *dmc = tu_alloc(m);
    MUST(C->mse_forward(&mc, p, t, m, 3.0f));
    MUST(G->mse_forward(dloss, dpp, dt, m, 3.0f));
    MUST(G->copy_d2h(&mg1, dloss, sizeof(float)));
    MUST(G->mse_forward(dloss, dpp, dt, m, 3.0f));
    MUST(G->copy_d2h(&mg2, dloss, sizeof(float)));
    exact_f("mse_forward", &mc, &mg1, 1);
    same_twice("mse_forward", &mg1, &mg2, sizeof(float));
    float *dmg = dev_zero(m);
    MUST(C->mse_backward(dmc, p, t, m, 3.0f));
    MUST(G->mse_backward(dmg, dpp, dt, m, 3.0f));
    float *mgh = back(dmg, m);
    exact_f("mse_backward", dmc, mgh, m);

    free(logits); free(pc); free(pg); free(dc); free(dg); free(p); free(t); free(dmc); free(mgh);
}

/* ---- convolution ---- */

static void conv_case(int N, int Cc, int H, int W, int K, int R, int S, int sh, int sw, int ph, int pw, int relu) {
    dt_conv2d_desc d = { .N = N, .C = Cc, .H = H, .W = W, .K = K, .R = R, .S = S,
                         .stride_h = sh, .stride_w = sw, .pad_h = ph, .pad_w = pw };
    MUST(dt_conv2d_desc_init(&d));
    size_t nx = (size_t)N * Cc * H * W, nw = (size_t)K * Cc * R * S, ny = (size_t)N * K * d.P * d.Q;
    float *x = tu_rand(nx), *w = tu_rand(nw), *b = tu_rand(K), *dy = tu_rand(ny);
    float *yc = tu_alloc(ny), *dxc = tu_alloc(nx), *dwc = tu_alloc(nw), dbc[64];
    float *gx = dev(x, nx), *gw = dev(w, nw), *gb = dev(b, K), *gdy = dev(dy, ny);
    float *gy = dev_zero(ny), *gdx = dev_zero(nx), *gdw = dev_zero(nw), *gdb = dev_zero(K);
    char what[160];
    snprintf(what, sizeof what, "conv2d (N%d C%d %dx%d, K%d %dx%d, stride %d,%d, pad %d,%d%s)",
             N, Cc, H, W, K, R, S, sh, sw, ph, pw, relu ? ", relu" : "");
    MUST(C->conv2d_forward(&d, yc, x, w, b, relu));
    MUST(G->conv2d_forward(&d, gy, gx, gw, gb, relu));
    float *yg = back(gy, ny);
    char w2[200];
    snprintf(w2, sizeof w2, "%s forward", what);
    near(w2, yc, yg, ny, 1e-5);
    MUST(C->conv2d_backward(&d, dxc, dwc, dbc, dy, x, w));
    MUST(G->conv2d_backward(&d, gdx, gdw, gdb, gdy, gx, gw));
    float *dxg = back(gdx, nx), *dwg = back(gdw, nw), *dbg = back(gdb, K);
    snprintf(w2, sizeof w2, "%s dx", what);
    near(w2, dxc, dxg, nx, 1e-5);
    snprintf(w2, sizeof w2, "%s dw", what);
    near(w2, dwc, dwg, nw, 1e-5);
    snprintf(w2, sizeof w2, "%s dbias", what);
    exact_f(w2, dbc, dbg, K);
    MUST(G->conv2d_backward(&d, NULL, gdw, NULL, gdy, gx, gw));
    float *dwg2 = back(gdw, nw);
    snprintf(w2, sizeof w2, "%s dw", what);
    same_twice(w2, dwg, dwg2, nw * sizeof(float));
    free(x); free(w); free(b); free(dy); free(yc); free(dxc); free(dwc); free(yg); free(dxg); free(dwg); free(dbg); free(dwg2);
    G->free(gx); G->free(gw); G->free(gb); G->free(gdy); G->free(gy); G->free(gdx); G->free(gdw); G->free(gdb);
}

static void test_conv(void) {
    conv_case(5, 3, 9, 8, 4, 3, 2, 2, 1, 1, 1, 1);
    conv_case(16, 8, 14, 14, 16, 3, 3, 1, 1, 1, 1, 0);
    conv_case(3, 1, 28, 28, 32, 3, 3, 1, 1, 1, 1, 1);
    dt_conv2d_desc d = { .N = 1, .C = 1, .H = 5, .W = 5, .K = 1, .R = 3, .S = 3, .stride_h = 1, .stride_w = 1 };
    MUST(dt_conv2d_desc_init(&d));
    d.P = 7;
    float *buf = dev_zero(64);
    is_int(G->conv2d_forward(&d, buf, buf, buf, NULL, 0), DT_ERR_INVALID, "conv2d with a stale descriptor is invalid");
    like(dt_last_error(), "conv2d_forward", "the message names the kernel");
    G->free(buf);
}

/* ---- pooling ---- */

static void pool_case(int kh, int stride, int pad) {
    dt_pool2d_desc d = { .N = 3, .C = 4, .H = 11, .W = 10, .kh = kh, .kw = kh,
                         .stride_h = stride, .stride_w = stride, .pad_h = pad, .pad_w = pad };
    MUST(dt_pool2d_desc_init(&d));
    size_t nx = (size_t)d.N * d.C * d.H * d.W, ny = (size_t)d.N * d.C * d.P * d.Q;
    float *x = tu_rand(nx), *dy = tu_rand(ny), *yc = tu_alloc(ny), *dxc = tu_alloc(nx);
    x[7] = x[8];   /* a tie: the first maximum wins */
    x[30] = NAN;   /* NaN propagates */
    int32_t *ic = malloc(sizeof(int32_t) * ny), *ig = malloc(sizeof(int32_t) * ny);
    float *gx = dev(x, nx), *gy = dev_zero(ny), *gdy = dev(dy, ny), *gdx = dev_zero(nx);
    int32_t *gi = dev_bytes(NULL, sizeof(int32_t) * ny);
    char what[96];
    MUST(C->maxpool2d_forward(&d, yc, ic, x));
    MUST(G->maxpool2d_forward(&d, gy, gi, gx));
    float *yg = back(gy, ny);
    MUST(G->copy_d2h(ig, gi, sizeof(int32_t) * ny));
    snprintf(what, sizeof what, "maxpool2d %dx%d stride %d pad %d forward", kh, kh, stride, pad);
    exact_f(what, yc, yg, ny);
    snprintf(what, sizeof what, "maxpool2d %dx%d stride %d pad %d argmax", kh, kh, stride, pad);
    exact(what, ic, ig, sizeof(int32_t) * ny);
    MUST(C->maxpool2d_backward(&d, dxc, dy, ic));
    MUST(G->maxpool2d_backward(&d, gdx, gdy, gi));
    float *dxg = back(gdx, nx);
    snprintf(what, sizeof what, "maxpool2d %dx%d stride %d pad %d backward", kh, kh, stride, pad);
    exact_f(what, dxc, dxg, nx);
    free(yg); free(dxg);

    x[30] = 0.25f;
    MUST(G->copy_h2d(gx, x, nx * sizeof(float)));
    MUST(C->avgpool2d_forward(&d, yc, x));
    MUST(G->avgpool2d_forward(&d, gy, gx));
    yg = back(gy, ny);
    snprintf(what, sizeof what, "avgpool2d %dx%d stride %d pad %d forward", kh, kh, stride, pad);
    exact_f(what, yc, yg, ny);
    MUST(C->avgpool2d_backward(&d, dxc, dy));
    MUST(G->avgpool2d_backward(&d, gdx, gdy));
    dxg = back(gdx, nx);
    snprintf(what, sizeof what, "avgpool2d %dx%d stride %d pad %d backward", kh, kh, stride, pad);
    exact_f(what, dxc, dxg, nx);
    free(x); free(dy); free(yc); free(dxc); free(ic); free(ig); free(yg); free(dxg);
    G->free(gx); G->free(gy); G->free(gdy); G->free(gdx); G->free(gi);
}

static void test_pool(void) {
    pool_case(2, 2, 0);
    pool_case(3, 2, 1);
    pool_case(3, 1, 1);
    /* a corrupt argmax index: reported at the next synchronisation */
    dt_pool2d_desc d = { .N = 1, .C = 1, .H = 4, .W = 4, .kh = 2, .kw = 2, .stride_h = 2, .stride_w = 2 };
    MUST(dt_pool2d_desc_init(&d));
    int32_t bad[4] = { 0, 2, 99, 10 };
    int32_t *gi = dev_bytes(bad, sizeof bad);
    float *gdy = dev_zero(4), *gdx = dev_zero(16);
    dt_status s = G->maxpool2d_backward(&d, gdx, gdy, gi);
    if (s == DT_OK) s = G->synchronize();
    is_int(s, DT_ERR_INVALID, "maxpool2d_backward with an index outside the plane fails");
    like(dt_last_error(), "maxpool2d_backward", "the message names the kernel");
    G->free(gi); G->free(gdy); G->free(gdx);

    const int N = 4, Cn = 6, HW = 49;
    size_t n = (size_t)N * Cn * HW;
    float *x = tu_rand(n), yc[24], *gy = dev_zero(24), *gx = dev(x, n), *dxc = tu_alloc(n), *gdx2 = dev_zero(n);
    MUST(C->global_avgpool_forward(yc, x, N, Cn, HW));
    MUST(G->global_avgpool_forward(gy, gx, N, Cn, HW));
    float *yg = back(gy, 24);
    exact_f("global_avgpool_forward", yc, yg, 24);
    MUST(C->global_avgpool_backward(dxc, yc, N, Cn, HW));
    MUST(G->global_avgpool_backward(gdx2, gy, N, Cn, HW));
    float *dxg = back(gdx2, n);
    exact_f("global_avgpool_backward", dxc, dxg, n);
    free(x); free(dxc); free(yg); free(dxg);
}

/* ---- normalisation ---- */

static void test_norm(void) {
    const int N = 9, Cn = 7, HW = 61;
    size_t n = (size_t)N * Cn * HW;
    float *x = tu_rand(n), *dy = tu_rand(n), *gamma = tu_rand(Cn), *beta = tu_rand(Cn);
    for (size_t i = 0; i < n; i++) x[i] = 3.0f + 2.0f * x[i];   /* a mean away from 0 */
    float *gx = dev(x, n), *gdy = dev(dy, n), *ggam = dev(gamma, Cn), *gbet = dev(beta, Cn);
    float sc[7], ssc[7], s1[7], ss1[7], s2[7], ss2[7];
    float *gs = dev_zero(Cn), *gss = dev_zero(Cn);
    MUST(C->bn_stats(sc, ssc, x, N, Cn, HW));
    MUST(G->bn_stats(gs, gss, gx, N, Cn, HW));
    MUST(G->copy_d2h(s1, gs, sizeof s1));
    MUST(G->copy_d2h(ss1, gss, sizeof ss1));
    MUST(G->bn_stats(gs, gss, gx, N, Cn, HW));
    MUST(G->copy_d2h(s2, gs, sizeof s2));
    MUST(G->copy_d2h(ss2, gss, sizeof ss2));
    exact_f("bn_stats sum", sc, s1, Cn);
    exact_f("bn_stats sumsq", ssc, ss1, Cn);
    same_twice("bn_stats", s1, s2, sizeof s1);
    same_twice("bn_stats sumsq", ss1, ss2, sizeof ss1);

    /* finalise from the CPU's sums on both sides, with the running update */
    float mc[7], ic[7], rmc[7], rvc[7], mg[7], ig[7], rmg[7], rvg[7];
    for (int c = 0; c < Cn; c++) { rmc[c] = 0.1f * c; rvc[c] = 1.0f + 0.2f * c; }
    float *gsum = dev(sc, Cn), *gsq = dev(ssc, Cn), *gm = dev_zero(Cn), *gi = dev_zero(Cn);
    float *grm = dev(rmc, Cn), *grv = dev(rvc, Cn);
    MUST(C->bn_finalize(mc, ic, sc, ssc, Cn, (int64_t)N * HW, 1e-5f, rmc, rvc, 0.1f));
    MUST(G->bn_finalize(gm, gi, gsum, gsq, Cn, (int64_t)N * HW, 1e-5f, grm, grv, 0.1f));
    MUST(G->copy_d2h(mg, gm, sizeof mg));
    MUST(G->copy_d2h(ig, gi, sizeof ig));
    MUST(G->copy_d2h(rmg, grm, sizeof rmg));
    MUST(G->copy_d2h(rvg, grv, sizeof rvg));
    exact_f("bn_finalize mean", mc, mg, Cn);
    exact_f("bn_finalize invstd", ic, ig, Cn);
    exact_f("bn_finalize running_mean", rmc, rmg, Cn);
    exact_f("bn_finalize running_var (unbiased)", rvc, rvg, Cn);
    MUST(C->bn_invstd(ic, rvc, Cn, 1e-5f));
    MUST(G->bn_invstd(gi, grv, Cn, 1e-5f));
    MUST(G->copy_d2h(ig, gi, sizeof ig));
    exact_f("bn_invstd", ic, ig, Cn);

    /* apply and backward from the CPU's statistics */
    MUST(G->copy_h2d(gm, mc, sizeof mc));
    MUST(G->copy_h2d(gi, ic, sizeof ic));
    float *yc = tu_alloc(n), *gy = dev_zero(n);
    for (int relu = 0; relu < 2; relu++) {
        MUST(C->bn_apply(yc, x, mc, ic, gamma, beta, N, Cn, HW, relu));
        MUST(G->bn_apply(gy, gx, gm, gi, ggam, gbet, N, Cn, HW, relu));
        float *yg = back(gy, n);
        exact_f(relu ? "bn_apply (affine, relu)" : "bn_apply (affine)", yc, yg, n);
        free(yg);
    }
    float a1[7], b1[7], ag[7], bg[7], ag2[7], bg2[7];
    float *ga = dev_zero(Cn), *gb = dev_zero(Cn);
    MUST(C->bn_backward_reduce(a1, b1, dy, x, mc, ic, N, Cn, HW));
    MUST(G->bn_backward_reduce(ga, gb, gdy, gx, gm, gi, N, Cn, HW));
    MUST(G->copy_d2h(ag, ga, sizeof ag));
    MUST(G->copy_d2h(bg, gb, sizeof bg));
    MUST(G->bn_backward_reduce(ga, gb, gdy, gx, gm, gi, N, Cn, HW));
    MUST(G->copy_d2h(ag2, ga, sizeof ag2));
    MUST(G->copy_d2h(bg2, gb, sizeof bg2));
    exact_f("bn_backward_reduce sum_dy", a1, ag, Cn);
    exact_f("bn_backward_reduce sum_dy_xhat", b1, bg, Cn);
    same_twice("bn_backward_reduce", bg, bg2, sizeof bg);
    MUST(G->copy_h2d(ga, a1, sizeof a1));
    MUST(G->copy_h2d(gb, b1, sizeof b1));
    MUST(C->bn_backward_dx(yc, dy, x, mc, ic, gamma, a1, b1, N, Cn, HW, (int64_t)N * HW));
    MUST(G->bn_backward_dx(gy, gdy, gx, gm, gi, ggam, ga, gb, N, Cn, HW, (int64_t)N * HW));
    float *dxg = back(gy, n);
    exact_f("bn_backward_dx", yc, dxg, n);
    free(dxg);

    /* layer norm */
    const int rows = 13, cols = 333;
    size_t m = (size_t)rows * cols;
    float *lx = tu_rand(m), *ldy = tu_rand(m), *lg = tu_rand(cols), *lb = tu_rand(cols);
    float *ly = tu_alloc(m), lmean[13], lrstd[13], lmg[13], lrg[13];
    float *glx = dev(lx, m), *gldy = dev(ldy, m), *glg = dev(lg, cols), *glb = dev(lb, cols);
    float *gly = dev_zero(m), *glm = dev_zero(rows), *glr = dev_zero(rows);
    MUST(C->layernorm_forward(ly, lmean, lrstd, lx, lg, lb, rows, cols, 1e-5f));
    MUST(G->layernorm_forward(gly, glm, glr, glx, glg, glb, rows, cols, 1e-5f));
    float *lyg = back(gly, m);
    MUST(G->copy_d2h(lmg, glm, sizeof lmg));
    MUST(G->copy_d2h(lrg, glr, sizeof lrg));
    exact_f("layernorm_forward y", ly, lyg, m);
    exact_f("layernorm_forward mean", lmean, lmg, rows);
    exact_f("layernorm_forward rstd", lrstd, lrg, rows);
    MUST(G->copy_h2d(glm, lmean, sizeof lmean));
    MUST(G->copy_h2d(glr, lrstd, sizeof lrstd));
    float *ldx = tu_alloc(m), *ldgam = tu_alloc(cols), *ldbet = tu_alloc(cols);
    float *gldx = dev_zero(m), *gldg = dev_zero(cols), *gldb = dev_zero(cols);
    MUST(C->layernorm_backward(ldx, ldgam, ldbet, ldy, lx, lmean, lrstd, lg, rows, cols));
    MUST(G->layernorm_backward(gldx, gldg, gldb, gldy, glx, glm, glr, glg, rows, cols));
    float *ldxg = back(gldx, m), *ldgg = back(gldg, cols), *ldbg = back(gldb, cols);
    exact_f("layernorm_backward dx", ldx, ldxg, m);
    exact_f("layernorm_backward dgamma", ldgam, ldgg, cols);
    exact_f("layernorm_backward dbeta", ldbet, ldbg, cols);
    MUST(G->layernorm_backward(NULL, gldg, NULL, gldy, glx, glm, glr, glg, rows, cols));
    float *ldgg2 = back(gldg, cols);
    same_twice("layernorm_backward dgamma", ldgg, ldgg2, cols * sizeof(float));

    free(x); free(dy); free(gamma); free(beta); free(yc);
    free(lx); free(ldy); free(lg); free(lb); free(ly); free(lyg); free(ldx); free(ldgam); free(ldbet);
    free(ldxg); free(ldgg); free(ldbg); free(ldgg2);
}

/* ---- metrics, sums, vector ops, casts, optimizers, random fills ---- */

static void test_vec(void) {
    const int rows = 50, cols = 10;
    size_t n = (size_t)rows * cols;
    float *x = tu_rand(n);
    x[1 * cols + 4] = x[1 * cols + 7] = 5.0f;   /* a tie in row 1: index 4 */
    x[2 * cols + 6] = NAN;                      /* a NaN in row 2 wins */
    int32_t ic[50], ig[50], labels[50], cc, cg;
    for (int i = 0; i < rows; i++) labels[i] = i % 3 == 0 ? -1 : (i * 3) % cols;
    labels[1] = 4;
    float *gx = dev(x, n);
    int32_t *gi = dev_bytes(NULL, sizeof ig), *gl = dev_bytes(labels, sizeof labels), *gc = dev_bytes(NULL, sizeof cg);
    MUST(C->argmax_rows(ic, x, rows, cols));
    MUST(G->argmax_rows(gi, gx, rows, cols));
    MUST(G->copy_d2h(ig, gi, sizeof ig));
    exact("argmax_rows (ties, NaN)", ic, ig, sizeof ic);
    MUST(C->count_correct(&cc, x, labels, rows, cols));
    MUST(G->count_correct(gc, gx, gl, rows, cols));
    MUST(G->copy_d2h(&cg, gc, sizeof cg));
    is_int(cg, cc, "count_correct");

    size_t m = 1000003;
    float *v = tu_rand(m), sc, sg1, sg2, qc, qg1, qg2;
    float *gv = dev(v, m), *gs = dev_zero(1);
    MUST(C->sum(&sc, v, m));
    MUST(G->sum(gs, gv, m));
    MUST(G->copy_d2h(&sg1, gs, 4));
    MUST(G->sum(gs, gv, m));
    MUST(G->copy_d2h(&sg2, gs, 4));
    exact_f("sum (1000003 elements)", &sc, &sg1, 1);
    same_twice("sum", &sg1, &sg2, 4);
    MUST(C->sumsq(&qc, v, m));
    MUST(G->sumsq(gs, gv, m));
    MUST(G->copy_d2h(&qg1, gs, 4));
    MUST(G->sumsq(gs, gv, m));
    MUST(G->copy_d2h(&qg2, gs, 4));
    exact_f("sumsq", &qc, &qg1, 1);
    same_twice("sumsq", &qg1, &qg2, 4);

    /* elementwise */
    float *w = tu_rand(m), *out = tu_alloc(m);
    float *gw = dev(w, m), *gout = dev_zero(m);
    for (int k = 0; k < 5; k++) {
        static const char *names[] = { "fill", "scale", "axpy", "add", "mul" };
        memcpy(out, v, m * sizeof(float));
        MUST(G->copy_h2d(gout, v, m * sizeof(float)));
        switch (k) {
        case 0: MUST(C->fill(out, 0.37f, m)); MUST(G->fill(gout, 0.37f, m)); break;
        case 1: MUST(C->scale(out, -1.7f, m)); MUST(G->scale(gout, -1.7f, m)); break;
        case 2: MUST(C->axpy(out, 0.3f, w, m)); MUST(G->axpy(gout, 0.3f, gw, m)); break;
        case 3: MUST(C->add(out, v, w, m)); MUST(G->add(gout, gv, gw, m)); break;
        default: MUST(C->mul(out, v, w, m)); MUST(G->mul(gout, gv, gw, m)); break;
        }
        float *og = back(gout, m);
        exact_f(names[k], out, og, m);
        free(og);
    }

    /* casts, with the special values */
    float sp[16] = { 0.0f, -0.0f, 1.0f, -2.5f, 65504.0f, 65520.0f, 1e-8f, 6e-8f, 3e-5f, INFINITY, -INFINITY, NAN,
                     3.4e38f, 1.00048828125f, 1.0009765625f, -1e-40f };
    size_t nc = 4096;
    float *cv = tu_rand(nc);
    for (size_t i = 0; i < nc; i++) cv[i] *= 1000.0f;
    memcpy(cv, sp, sizeof sp);
    float *gcv = dev(cv, nc), *gback = dev_zero(nc), *hb = tu_alloc(nc);
    uint16_t *hc = malloc(nc * 2), *hg = malloc(nc * 2), *g16 = dev_bytes(NULL, nc * 2);
    for (int k = 0; k < 2; k++) {
        if (k == 0) { MUST(C->f32_to_bf16(hc, cv, nc)); MUST(G->f32_to_bf16(g16, gcv, nc)); }
        else        { MUST(C->f32_to_f16(hc, cv, nc));  MUST(G->f32_to_f16(g16, gcv, nc)); }
        MUST(G->copy_d2h(hg, g16, nc * 2));
        exact(k == 0 ? "f32_to_bf16" : "f32_to_f16", hc, hg, nc * 2);
        if (k == 0) { MUST(C->bf16_to_f32(hb, hc, nc)); MUST(G->bf16_to_f32(gback, g16, nc)); }
        else        { MUST(C->f16_to_f32(hb, hc, nc));  MUST(G->f16_to_f32(gback, g16, nc)); }
        float *bg = back(gback, nc);
        exact_f(k == 0 ? "bf16_to_f32" : "f16_to_f32", hb, bg, nc);
        free(bg);
    }

    /* optimizers: several steps, momentum/nesterov and AdamW */
    size_t np = 10007;
    float *p = tu_rand(np), *gr = tu_rand(np), *buf = tu_alloc(np), *m1 = tu_alloc(np), *v1 = tu_alloc(np);
    float *gp = dev(p, np), *ggr = dev(gr, np), *gbuf = dev_zero(np), *gm1 = dev_zero(np), *gv1 = dev_zero(np);
    for (int step = 1; step <= 3; step++) {
        dt_sgd_args a = { .lr = 0.05, .momentum = 0.9, .dampening = 0.0, .weight_decay = 1e-4, .grad_scale = 0.5,
                          .nesterov = 1, .first_step = step == 1 };
        MUST(C->sgd_update(p, gr, buf, np, &a));
        MUST(G->sgd_update(gp, ggr, gbuf, np, &a));
    }
    float *pg = back(gp, np);
    exact_f("sgd_update (3 nesterov steps)", p, pg, np);
    free(pg);
    for (int step = 1; step <= 3; step++) {
        dt_adamw_args a = { .lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.01,
                            .grad_scale = 1.0, .step = step };
        MUST(C->adamw_update(p, gr, m1, v1, np, &a));
        MUST(G->adamw_update(gp, ggr, gm1, gv1, np, &a));
    }
    pg = back(gp, np);
    exact_f("adamw_update (3 steps)", p, pg, np);
    free(pg);

    /* random fills, at an offset */
    float *ru = tu_alloc(np), *gru = dev_zero(np);
    MUST(C->rng_uniform(ru, np, -2.0f, 3.0f, 99, 5, 1u << 20));
    MUST(G->rng_uniform(gru, np, -2.0f, 3.0f, 99, 5, 1u << 20));
    float *rug = back(gru, np);
    exact_f("rng_uniform", ru, rug, np);
    MUST(C->rng_normal(ru, np, 0.5f, 2.0f, 99, 6, 123));
    MUST(G->rng_normal(gru, np, 0.5f, 2.0f, 99, 6, 123));
    free(rug);
    rug = back(gru, np);
    near("rng_normal", ru, rug, np, 1e-6);

    free(x); free(v); free(w); free(out); free(cv); free(hb); free(hc); free(hg);
    free(p); free(gr); free(buf); free(m1); free(v1); free(ru); free(rug);
}

/* ---- memory, streams and the device ---- */

static void test_memory(void) {
    void *p = (void *)1;
    is_int(G->alloc(&p, 0), DT_OK, "alloc of 0 bytes is fine");
    ok(p == NULL, "and gives NULL");
    G->free(NULL);
    is_int(G->set_threads(0), DT_ERR_INVALID, "set_threads(0) is invalid");
    is_int(G->set_threads(3), DT_OK, "set_threads(3)");
    is_int(G->threads(), 3, "threads() answers what set_threads was given");
    if (self_test) return;
    size_t before = dt_cuda_memory_allocated();
    void *q = NULL;
    MUST(G->alloc(&q, 3u << 20));
    is_int((long long)(dt_cuda_memory_allocated() - before), 3 << 20, "memory_allocated counts an allocation");
    ok(dt_cuda_max_memory_allocated() >= before + (3u << 20), "max_memory_allocated is at least the current peak");
    G->free(q);
    is_int((long long)dt_cuda_memory_allocated(), (long long)before, "and forgets it when freed");
    dt_cuda_reset_peak_memory();
    is_int((long long)dt_cuda_max_memory_allocated(), (long long)before, "reset_peak_memory sets the peak to the current");
    void *h = NULL;
    is_int(G->host_alloc(&h, 1 << 16), DT_OK, "pinned host memory");
    memset(h, 1, 1 << 16);
    G->host_free(h);
    ok(dt_cuda_device() >= 0, "a device is selected (device %d)", dt_cuda_device());
    ok(dt_cuda_compute_stream() != NULL, "the compute stream exists");
    is_int(dt_cuda_stream_wait_compute(NULL), DT_OK, "the legacy stream can wait for the compute stream");
    is_int(dt_cuda_compute_wait_stream(NULL), DT_OK, "and the compute stream for it");
    ok(!dt_cuda_allow_tf32() || getenv("DT_ALLOW_TF32"), "TF32 is off by default");
    is_int(dt_cuda_set_allow_tf32(0), DT_OK, "TF32 can be switched off explicitly");
    is_int(G->copy_h2d(NULL, &p, 4), DT_ERR_INVALID, "copy to NULL is invalid");
    is_int(G->synchronize(), DT_OK, "synchronize");
}

int main(void) {
    self_test = getenv("DT_CUDA_TEST_SELF") && strcmp(getenv("DT_CUDA_TEST_SELF"), "0") != 0;
    int emulated = getenv("DT_CUDA_TEST_EMU") && strcmp(getenv("DT_CUDA_TEST_EMU"), "0") != 0;
    C = dt_ops_cpu();
    if (self_test) {
        G = dt_ops_cpu();
        diag("DT_CUDA_TEST_SELF: comparing the cpu backend with itself (harness check)");
    } else {
        int n = 0;
        if (dt_cuda_device_count(&n) != DT_OK) {
            char why[600];
            snprintf(why, sizeof why, "no usable CUDA device (%s)", dt_last_error());
            skip_all(why);
        }
        if (n < 1) skip_all("no CUDA device is visible");
        G = dt_ops_cuda();
        if (!G) {
            printf("Bail out! dt_ops_cuda() failed with %d devices: %s\n", n, dt_last_error());
            return 1;
        }
        is_str(G->name, "cuda", "the cuda table is named cuda");
        if (emulated) diag("DT_CUDA_TEST_EMU: the kernels run on the CPU (tests/gpu_emu.sh)");
        else ok(dt_ops_get("cuda") == G, "dt_ops_get(\"cuda\") gives the cuda table");
    }
    MUST(C->set_threads(2));
    test_gemm();
    test_bias_act();
    test_losses();
    test_conv();
    test_pool();
    test_norm();
    test_vec();
    test_memory();
    return done_testing();
}
