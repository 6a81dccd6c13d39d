/*
 * test_conv.c: the CPU backend's GEMM, convolution and pooling against plain
 * double-precision loops, finite differences, and thread-count independence
 * (the same call on 1 and 2 threads must give the same bytes: docs/DESIGN.md rule 2).
 */
#include "ops_util.h"
#include "cpu/cpu.h"   /* dt_cpu_gemm_own, dt_cpu_gemm1 */

static const dt_ops *ops;

/* ---- GEMM ---- */

static void ref_gemm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                     const float *B, int ldb, float beta, const float *C0, int ldc, double *out) {
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0.0;
            for (int k = 0; k < K; k++) {
                double a = ta ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k];
                double b = tb ? B[(size_t)j * ldb + k] : B[(size_t)k * ldb + j];
                s += a * b;
            }
            out[(size_t)i * N + j] = alpha * s + (beta == 0.0f ? 0.0 : beta * (double)C0[(size_t)i * ldc + j]);
        }
}

static void test_gemm_one(int ta, int tb, int M, int N, int K, float alpha, float beta, int pad) {
    int lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
    float *A = tu_rand((size_t)(ta ? K : M) * lda), *B = tu_rand((size_t)(tb ? N : K) * ldb);
    float *C = tu_rand((size_t)M * ldc), *C0 = malloc(sizeof(float) * (size_t)M * ldc);
    memcpy(C0, C, sizeof(float) * (size_t)M * ldc);
    double *want = tu_dalloc((size_t)M * N);
    ref_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C0, ldc, want);
    dt_status s = ops->sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    float *got = tu_alloc((size_t)M * N);
    for (int i = 0; i < M; i++) memcpy(got + (size_t)i * N, C + (size_t)i * ldc, sizeof(float) * N);
    int pad_ok = 1;
    for (int i = 0; i < M; i++)
        for (int j = N; j < ldc; j++) pad_ok &= C[(size_t)i * ldc + j] == C0[(size_t)i * ldc + j];
    ok(s == DT_OK && tu_close(got, want, (size_t)M * N, 1e-4, 1e-4 * sqrt(K)) && pad_ok,
       "sgemm tA=%d tB=%d %dx%dx%d alpha=%g beta=%g ld+%d", ta, tb, M, N, K, alpha, beta, pad);
    free(A); free(B); free(C); free(C0); free(want); free(got);
}

/* Run sgemm on 1 and on 2 threads; the bytes must match. */
static void test_gemm_threads(int ta, int tb, int M, int N, int K) {
    int lda = ta ? M : K, ldb = tb ? K : N;
    float *A = tu_rand((size_t)M * K), *B = tu_rand((size_t)K * N);
    float *C1 = tu_alloc((size_t)M * N), *C2 = tu_alloc((size_t)M * N);
    ops->set_threads(1);
    dt_status s1 = ops->sgemm(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C1, N);
    ops->set_threads(2);
    dt_status s2 = ops->sgemm(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C2, N);
    ok(s1 == DT_OK && s2 == DT_OK && memcmp(C1, C2, sizeof(float) * (size_t)M * N) == 0,
       "sgemm %dx%dx%d tA=%d tB=%d: 1 and 2 threads give the same bytes", M, N, K, ta, tb);
    free(A); free(B); free(C1); free(C2);
}

static void test_gemm(void) {
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            test_gemm_one(ta, tb, 7, 5, 3, 1.0f, 0.0f, 0);
            test_gemm_one(ta, tb, 37, 29, 41, 0.5f, 2.0f, 3);
            test_gemm_one(ta, tb, 300, 270, 20, 1.0f, 1.0f, 1);   /* several blocks */
        }
    test_gemm_one(0, 0, 4, 4, 0, 1.0f, 0.5f, 1);   /* K = 0: C = beta*C */
    /* the training shapes of the mlp preset (micro-batch 128) */
    test_gemm_threads(0, 1, 128, 1024, 784);   /* forward  y = x W^T   */
    test_gemm_threads(1, 0, 1024, 784, 128);   /* weights  dW = dy^T x */
    test_gemm_threads(0, 0, 128, 784, 1024);   /* data     dx = dy W   */
    test_gemm_threads(0, 1, 256, 1024, 1024);
    test_gemm_threads(0, 1, 256, 128, 3136);   /* the cnn's fc1: a narrow output cut into 64-row blocks */

    /* on 1 thread (the own kernel takes the product in one call) and on 2 (the grid) */
    int was = ops->threads();
    for (int nt = 1; nt <= 2; nt++) {
        float x[4] = {1, 2, 3, 4};
        ops->set_threads(nt);
        dt_status s = ops->sgemm(0, 0, 2, 2, 2, 1.0f, x, 1, x, 2, 0.0f, x, 2);
        is_int(s, DT_ERR_INVALID, "sgemm on %d thread(s) rejects lda smaller than K", nt);
        like(dt_last_error(), "leading dimension", "and says which argument");
        is_int(ops->sgemm(0, 0, -1, 2, 2, 1.0f, x, 2, x, 2, 0.0f, x, 2), DT_ERR_INVALID,
               "sgemm on %d thread(s) rejects a negative size", nt);
        is_int(ops->sgemm(0, 0, 2, 2, 2, 1.0f, NULL, 2, x, 2, 0.0f, x, 2), DT_ERR_INVALID,
               "sgemm on %d thread(s) rejects a NULL A", nt);
        ok(x[0] == 1 && x[1] == 2 && x[2] == 3 && x[3] == 4, "and writes nothing");
    }
    ops->set_threads(was);
}

/* dtrain's own AVX-512 block (cpu_gemm_avx512.c) where the CPU has it, against
 * OpenBLAS and the double loops, across its slice edges (K past 256, M past 128, N past
 * 1024, tiles of 8 x 32 cut short), with a NaN-filled C for beta = 0; and its rule:
 * an output's bits depend on its row, its column and K only, so the rows (and the
 * columns) of a product computed apart are the bytes of the whole. */
static void test_gemm_own(void) {
    if (!dt_cpu_gemm_avx512(0, 0, 1, 1, 1, 1.0f, (float[]){1}, 1, (float[]){1}, 1, 0.0f, (float[]){0}, 1)) {
        skip(16, "this CPU (or compiler) has no AVX-512 F: every GEMM is OpenBLAS's");
        return;
    }
    static const int shapes[][3] = {{13, 1100, 600}, {300, 47, 257}, {129, 33, 1}, {64, 64, 32}};
    for (int t = 0; t < 4; t++)
        for (int tr = 0; tr < 4; tr++) {
            int ta = tr & 1, tb = tr >> 1, M = shapes[t][0], N = shapes[t][1], K = shapes[t][2];
            int lda = (ta ? M : K) + 1, ldb = (tb ? K : N) + 2, ldc = N + 3;
            float *A = tu_rand((size_t)(ta ? K : M) * lda), *B = tu_rand((size_t)(tb ? N : K) * ldb);
            float *C = tu_alloc((size_t)M * ldc), *R = tu_alloc((size_t)M * ldc), *P = tu_alloc((size_t)M * ldc);
            for (size_t i = 0; i < (size_t)M * ldc; i++) C[i] = P[i] = NAN;
            dt_cpu_gemm_own(0);
            for (size_t i = 0; i < (size_t)M * ldc; i++) R[i] = 0.0f;
            dt_cpu_gemm1(ta, tb, M, N, K, -0.5f, A, lda, B, ldb, 0.0f, R, ldc);   /* OpenBLAS */
            dt_cpu_gemm_own(1);
            dt_cpu_gemm1(ta, tb, M, N, K, -0.5f, A, lda, B, ldb, 0.0f, C, ldc);
            /* rows [0, h) and [h, M) apart, then columns [0, w) and [w, N) apart */
            int h = M / 3 + 1, w = N / 2 + 1;
            dt_cpu_gemm1(ta, tb, h, N, K, -0.5f, A, lda, B, ldb, 0.0f, P, ldc);
            dt_cpu_gemm1(ta, tb, M - h, N, K, -0.5f, ta ? A + h : A + (size_t)h * lda, lda, B, ldb, 0.0f,
                         P + (size_t)h * ldc, ldc);
            int same_rows = 1, same_cols = 1, close = 1, pad = 1;
            for (int i = 0; i < M; i++)
                for (int j = 0; j < ldc; j++) {
                    float c = C[(size_t)i * ldc + j], r = R[(size_t)i * ldc + j];
                    if (j >= N) pad &= isnan(c) && isnan(P[(size_t)i * ldc + j]);
                    else {
                        same_rows &= memcmp(&c, &P[(size_t)i * ldc + j], sizeof c) == 0;
                        close &= fabsf(c - r) <= 1e-4f * sqrtf((float)K) * (1.0f + fabsf(r));
                    }
                }
            for (size_t i = 0; i < (size_t)M * ldc; i++) P[i] = NAN;
            dt_cpu_gemm1(ta, tb, M, w, K, -0.5f, A, lda, B, ldb, 0.0f, P, ldc);
            dt_cpu_gemm1(ta, tb, M, N - w, K, -0.5f, A, lda, tb ? B + (size_t)w * ldb : B + w, ldb, 0.0f, P + w, ldc);
            for (int i = 0; i < M; i++) same_cols &= memcmp(C + (size_t)i * ldc, P + (size_t)i * ldc, sizeof(float) * N) == 0;
            ok(close && pad && same_rows && same_cols,
               "own GEMM %dx%dx%d tA=%d tB=%d: as OpenBLAS (%s), C's padding untouched (%s), rows apart the same bytes "
               "(%s), columns apart (%s)", M, N, K, ta, tb, close ? "yes" : "no", pad ? "yes" : "no",
               same_rows ? "yes" : "no", same_cols ? "yes" : "no");
            free(A); free(B); free(C); free(R); free(P);
        }
}

/* ---- convolution ---- */

static void ref_conv_fwd(const dt_conv2d_desc *d, const float *x, const float *w, const float *b, double *y) {
    for (int n = 0; n < d->N; n++)
        for (int k = 0; k < d->K; k++)
            for (int p = 0; p < d->P; p++)
                for (int q = 0; q < d->Q; q++) {
                    double s = b ? b[k] : 0.0;
                    for (int c = 0; c < d->C; c++)
                        for (int r = 0; r < d->R; r++)
                            for (int t = 0; t < d->S; t++) {
                                int h = p * d->stride_h - d->pad_h + r, ww = q * d->stride_w - d->pad_w + t;
                                if (h < 0 || h >= d->H || ww < 0 || ww >= d->W) continue;
                                s += (double)x[(((size_t)n * d->C + c) * d->H + h) * d->W + ww] *
                                     w[(((size_t)k * d->C + c) * d->R + r) * d->S + t];
                            }
                    y[(((size_t)n * d->K + k) * d->P + p) * d->Q + q] = s;
                }
}

static void ref_conv_bwd(const dt_conv2d_desc *d, const float *x, const float *w, const float *dy,
                         double *dx, double *dw, double *db) {
    memset(dx, 0, sizeof(double) * d->N * d->C * d->H * d->W);
    memset(dw, 0, sizeof(double) * d->K * d->C * d->R * d->S);
    memset(db, 0, sizeof(double) * d->K);
    for (int n = 0; n < d->N; n++)
        for (int k = 0; k < d->K; k++)
            for (int p = 0; p < d->P; p++)
                for (int q = 0; q < d->Q; q++) {
                    double g = dy[(((size_t)n * d->K + k) * d->P + p) * d->Q + q];
                    db[k] += g;
                    for (int c = 0; c < d->C; c++)
                        for (int r = 0; r < d->R; r++)
                            for (int t = 0; t < d->S; t++) {
                                int h = p * d->stride_h - d->pad_h + r, ww = q * d->stride_w - d->pad_w + t;
                                if (h < 0 || h >= d->H || ww < 0 || ww >= d->W) continue;
                                size_t xi = (((size_t)n * d->C + c) * d->H + h) * d->W + ww;
                                size_t wi = (((size_t)k * d->C + c) * d->R + r) * d->S + t;
                                dx[xi] += g * w[wi];
                                dw[wi] += g * x[xi];
                            }
                }
}

static void test_conv_case(int N, int C, int H, int W, int K, int R, int S, int stride, int pad, int relu) {
    dt_conv2d_desc d = {.N = N, .C = C, .H = H, .W = W, .K = K, .R = R, .S = S,
                        .stride_h = stride, .stride_w = stride, .pad_h = pad, .pad_w = pad};
    if (dt_conv2d_desc_init(&d) != DT_OK) { ok(0, "conv desc: %s", dt_last_error()); return; }
    size_t nx = (size_t)N * C * H * W, nw = (size_t)K * C * R * S, ny = (size_t)N * K * d.P * d.Q;
    float *x = tu_rand(nx), *w = tu_rand(nw), *b = tu_rand(K), *y = tu_alloc(ny), *dy = tu_rand(ny);
    float *dx = tu_alloc(nx), *dw = tu_alloc(nw), *db = tu_alloc(K);
    double *ry = tu_dalloc(ny), *rdx = tu_dalloc(nx), *rdw = tu_dalloc(nw), *rdb = tu_dalloc(K);
    ref_conv_fwd(&d, x, w, b, ry);
    if (relu) for (size_t i = 0; i < ny; i++) ry[i] = ry[i] > 0 ? ry[i] : 0;
    double tol = 1e-5 * sqrt((double)C * R * S);
    ok(ops->conv2d_forward(&d, y, x, w, b, relu) == DT_OK && tu_close(y, ry, ny, 1e-4, tol),
       "conv2d_forward N=%d C=%d %dx%d K=%d %dx%d stride %d pad %d relu %d -> %dx%d", N, C, H, W, K, R, S, stride, pad, relu, d.P, d.Q);
    ref_conv_bwd(&d, x, w, dy, rdx, rdw, rdb);
    dt_status s = ops->conv2d_backward(&d, dx, dw, db, dy, x, w);
    ok(s == DT_OK && tu_close(dx, rdx, nx, 1e-4, 1e-5 * sqrt((double)K * R * S)), "conv2d_backward dx");
    ok(s == DT_OK && tu_close(dw, rdw, nw, 1e-4, 1e-5 * sqrt((double)N * d.P * d.Q)), "conv2d_backward dw");
    ok(s == DT_OK && tu_close(db, rdb, K, 1e-4, 1e-5 * sqrt((double)N * d.P * d.Q)), "conv2d_backward dbias");
    free(x); free(w); free(b); free(y); free(dy); free(dx); free(dw); free(db);
    free(ry); free(rdx); free(rdw); free(rdb);
}

/* Finite differences of L = sum(y * r) in double through the reference forward. */
static void test_conv_fd(void) {
    dt_conv2d_desc d = {.N = 2, .C = 2, .H = 5, .W = 4, .K = 3, .R = 3, .S = 2, .stride_h = 2, .stride_w = 1, .pad_h = 1, .pad_w = 1};
    dt_conv2d_desc_init(&d);
    size_t nx = 2 * 2 * 5 * 4, nw = 3 * 2 * 3 * 2, ny = (size_t)2 * 3 * d.P * d.Q;
    float *x = tu_rand(nx), *w = tu_rand(nw), *r = tu_rand(ny), *dx = tu_alloc(nx), *dw = tu_alloc(nw);
    double *y = tu_dalloc(ny), *fdx = tu_dalloc(nx), *fdw = tu_dalloc(nw);
    ops->conv2d_backward(&d, dx, dw, NULL, r, x, w);
    const float h = 1e-2f;
    for (int which = 0; which < 2; which++) {
        float *v = which ? w : x;
        size_t nv = which ? nw : nx;
        for (size_t i = 0; i < nv; i++) {
            float keep = v[i];
            double lp = 0, lm = 0;
            v[i] = keep + h; ref_conv_fwd(&d, x, w, NULL, y);
            for (size_t j = 0; j < ny; j++) lp += y[j] * r[j];
            v[i] = keep - h; ref_conv_fwd(&d, x, w, NULL, y);
            for (size_t j = 0; j < ny; j++) lm += y[j] * r[j];
            v[i] = keep;
            (which ? fdw : fdx)[i] = (lp - lm) / (2.0 * h);
        }
    }
    ok(tu_close(dx, fdx, nx, 1e-3, 1e-3), "conv2d_backward dx matches finite differences (stride 2x1, pad 1)");
    ok(tu_close(dw, fdw, nw, 1e-3, 1e-3), "conv2d_backward dw matches finite differences");
    free(x); free(w); free(r); free(dx); free(dw); free(y); free(fdx); free(fdw);
}

/* conv forward and backward on 1 and 2 threads, the cnn preset's second layer. */
static void test_conv_threads(void) {
    dt_conv2d_desc d = {.N = 40, .C = 32, .H = 14, .W = 14, .K = 64, .R = 3, .S = 3,
                        .stride_h = 1, .stride_w = 1, .pad_h = 1, .pad_w = 1};
    dt_conv2d_desc_init(&d);
    size_t nx = (size_t)d.N * d.C * d.H * d.W, nw = (size_t)d.K * d.C * 9, ny = (size_t)d.N * d.K * d.P * d.Q;
    float *x = tu_rand(nx), *w = tu_rand(nw), *b = tu_rand(d.K), *dy = tu_rand(ny);
    float *out[2][4];
    for (int t = 0; t < 2; t++) {
        out[t][0] = tu_alloc(ny); out[t][1] = tu_alloc(nx); out[t][2] = tu_alloc(nw); out[t][3] = tu_alloc(d.K);
        ops->set_threads(t + 1);
        ops->conv2d_forward(&d, out[t][0], x, w, b, 1);
        ops->conv2d_backward(&d, out[t][1], out[t][2], out[t][3], dy, x, w);
    }
    ok(memcmp(out[0][0], out[1][0], ny * 4) == 0, "conv2d_forward: 1 and 2 threads give the same bytes");
    ok(memcmp(out[0][1], out[1][1], nx * 4) == 0, "conv2d_backward dx: 1 and 2 threads give the same bytes");
    ok(memcmp(out[0][2], out[1][2], nw * 4) == 0, "conv2d_backward dw: 1 and 2 threads give the same bytes");
    ok(memcmp(out[0][3], out[1][3], (size_t)d.K * 4) == 0, "conv2d_backward dbias: 1 and 2 threads give the same bytes");
    for (int t = 0; t < 2; t++) for (int i = 0; i < 4; i++) free(out[t][i]);
    free(x); free(w); free(b); free(dy);
}

static void test_conv(void) {
    test_conv_case(3, 2, 7, 6, 4, 3, 3, 1, 1, 0);
    test_conv_case(2, 3, 9, 8, 5, 3, 3, 2, 1, 1);
    test_conv_case(17, 1, 6, 6, 3, 5, 5, 1, 2, 0);   /* more than one group of samples, 5x5 */
    test_conv_case(2, 4, 5, 5, 2, 1, 1, 1, 0, 0);    /* 1x1 */
    test_conv_case(1, 2, 4, 7, 3, 2, 4, 3, 0, 0);    /* non-square kernel, stride 3 */
    test_conv_case(2, 2, 6, 1, 3, 5, 5, 1, 2, 0);    /* padding wider than the image */
    test_conv_case(2, 3, 2, 2, 2, 5, 5, 1, 2, 1);    /* padding wider than the image, both ways */
    test_conv_fd();
    test_conv_threads();

    dt_conv2d_desc bad = {.N = 1, .C = 1, .H = 2, .W = 2, .K = 1, .R = 5, .S = 5, .stride_h = 1, .stride_w = 1};
    is_int(dt_conv2d_desc_init(&bad), DT_ERR_INVALID, "conv2d: a kernel larger than the padded input is rejected");
    like(dt_last_error(), "larger than the padded input", "with a message saying so");
    dt_conv2d_desc bad2 = {.N = 1, .C = 1, .H = 4, .W = 4, .K = 1, .R = 3, .S = 3, .stride_h = 0, .stride_w = 1};
    is_int(dt_conv2d_desc_init(&bad2), DT_ERR_INVALID, "conv2d: stride 0 is rejected");
    dt_conv2d_desc stale = {.N = 1, .C = 1, .H = 4, .W = 4, .K = 1, .R = 3, .S = 3, .stride_h = 1, .stride_w = 1, .P = 4, .Q = 4};
    float buf[16] = {0};
    is_int(ops->conv2d_forward(&stale, buf, buf, buf, NULL, 0), DT_ERR_INVALID, "conv2d_forward rejects a descriptor with a wrong output size");
}

/* ---- pooling ---- */

static void test_pool_case(int N, int C, int H, int W, int k, int stride, int pad) {
    dt_pool2d_desc d = {.N = N, .C = C, .H = H, .W = W, .kh = k, .kw = k, .stride_h = stride, .stride_w = stride, .pad_h = pad, .pad_w = pad};
    if (dt_pool2d_desc_init(&d) != DT_OK) { ok(0, "pool desc: %s", dt_last_error()); return; }
    size_t nx = (size_t)N * C * H * W, ny = (size_t)N * C * d.P * d.Q;
    float *x = tu_rand(nx), *y = tu_alloc(ny), *dy = tu_rand(ny), *dx = tu_alloc(nx);
    int32_t *idx = malloc(sizeof(int32_t) * ny);
    double *ry = tu_dalloc(ny), *rdx = tu_dalloc(nx), *ay = tu_dalloc(ny), *adx = tu_dalloc(nx);
    int idx_ok = 1;
    dt_status s = ops->maxpool2d_forward(&d, y, idx, x);
    for (int pl = 0; pl < N * C; pl++)
        for (int p = 0; p < d.P; p++)
            for (int q = 0; q < d.Q; q++) {
                double best = -INFINITY, sum = 0;
                int bi = -1;
                for (int r = 0; r < k; r++)
                    for (int t = 0; t < k; t++) {
                        int h = p * stride - pad + r, w = q * stride - pad + t;
                        if (h < 0 || h >= H || w < 0 || w >= W) continue;
                        double v = x[(size_t)pl * H * W + h * W + w];
                        sum += v;
                        if (v > best) { best = v; bi = h * W + w; }
                    }
                size_t o = (size_t)pl * d.P * d.Q + p * d.Q + q;
                ry[o] = best;
                ay[o] = sum / (k * k);
                idx_ok &= idx[o] == bi;
                rdx[(size_t)pl * H * W + bi] += dy[o];
                for (int r = 0; r < k; r++)
                    for (int t = 0; t < k; t++) {
                        int h = p * stride - pad + r, w = q * stride - pad + t;
                        if (h < 0 || h >= H || w < 0 || w >= W) continue;
                        adx[(size_t)pl * H * W + h * W + w] += dy[o] / (k * k);
                    }
            }
    ok(s == DT_OK && tu_close(y, ry, ny, 0, 0) && idx_ok, "maxpool2d_forward %dx%d k%d s%d p%d: values and argmax", H, W, k, stride, pad);
    ok(ops->maxpool2d_backward(&d, dx, dy, idx) == DT_OK && tu_close(dx, rdx, nx, 1e-6, 1e-7), "maxpool2d_backward");
    ok(ops->avgpool2d_forward(&d, y, x) == DT_OK && tu_close(y, ay, ny, 1e-5, 1e-6), "avgpool2d_forward (padding counted)");
    ok(ops->avgpool2d_backward(&d, dx, dy) == DT_OK && tu_close(dx, adx, nx, 1e-5, 1e-6), "avgpool2d_backward");
    free(x); free(y); free(dy); free(dx); free(idx); free(ry); free(rdx); free(ay); free(adx);
}

static void test_pool(void) {
    test_pool_case(2, 3, 8, 8, 2, 2, 0);
    test_pool_case(1, 2, 7, 5, 3, 2, 1);
    test_pool_case(2, 1, 6, 6, 3, 1, 1);   /* overlapping windows */

    int N = 3, C = 4, HW = 10;
    float *x = tu_rand((size_t)N * C * HW), *y = tu_alloc((size_t)N * C), *dy = tu_rand((size_t)N * C), *dx = tu_alloc((size_t)N * C * HW);
    double *ry = tu_dalloc((size_t)N * C), *rdx = tu_dalloc((size_t)N * C * HW);
    for (int i = 0; i < N * C; i++) {
        for (int j = 0; j < HW; j++) { ry[i] += x[i * HW + j] / (double)HW; rdx[i * HW + j] = dy[i] / (double)HW; }
    }
    ok(ops->global_avgpool_forward(y, x, N, C, HW) == DT_OK && tu_close(y, ry, (size_t)N * C, 1e-6, 1e-7), "global_avgpool_forward");
    ok(ops->global_avgpool_backward(dx, dy, N, C, HW) == DT_OK && tu_close(dx, rdx, (size_t)N * C * HW, 1e-6, 1e-7), "global_avgpool_backward");
    free(x); free(y); free(dy); free(dx); free(ry); free(rdx);

    dt_pool2d_desc bad = {.N = 1, .C = 1, .H = 4, .W = 4, .kh = 2, .kw = 2, .stride_h = 2, .stride_w = 2, .pad_h = 2, .pad_w = 0};
    is_int(dt_pool2d_desc_init(&bad), DT_ERR_INVALID, "pool2d: padding above half the kernel is rejected");
    like(dt_last_error(), "half the kernel", "with a message saying so");
    dt_pool2d_desc d = {.N = 1, .C = 1, .H = 2, .W = 2, .kh = 2, .kw = 2, .stride_h = 2, .stride_w = 2};
    dt_pool2d_desc_init(&d);
    float g = 1.0f, out[4];
    int32_t wrong = 7;
    is_int(ops->maxpool2d_backward(&d, out, &g, &wrong), DT_ERR_INVALID, "maxpool2d_backward rejects an index outside the plane");
}

int main(void) {
    ops = dt_ops_get("cpu");
    if (!ops) { printf("Bail out! no cpu backend: %s\n", dt_last_error()); return 1; }
    test_gemm();
    test_gemm_own();
    test_conv();
    test_pool();
    ops->set_threads(2);
    return done_testing();
}
