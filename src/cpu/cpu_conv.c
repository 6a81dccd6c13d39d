/*
 * cpu_conv.c: 2-d convolution (im2col + GEMM) and pooling on the CPU.
 *
 * Convolution works on groups of g samples (conv_group, a function of the shape). The
 * im2col matrix of a group is col (C*R*S, g*P*Q): sample s fills columns
 * [s*P*Q, (s+1)*P*Q). Then, with single-threaded GEMMs inside each OpenMP worker,
 *   forward:  yg (K, g*PQ)     = w (K, CRS) x col             (scattered to y (N, K, P, Q))
 *   backward: dwg (K, CRS)     = dyg (K, g*PQ) x col^T         (one partial per group)
 *             dcol (CRS, g*PQ) = w^T x dyg, then col2im        (per sample: no reduction)
 * One GEMM per group instead of per sample keeps the GEMMs wide (g*PQ columns),
 * which is where OpenBLAS is fast.
 *
 * Determinism: the groups depend on the shape only. dw is the sum of the group
 * partials, combined pairwise in group order after the parallel loop, so dw has the
 * same bits on any thread count; dx of a sample is written by one thread in a fixed
 * order.
 */
#include "cpu.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#define CONV_GROUP_MAX 16      /* samples per group, at most */
#define CONV_GROUP_COLS 4096   /* ... and about this many output positions per group */

/* Samples per group: the largest power of two <= CONV_GROUP_MAX with g*P*Q <= 4096
 * (at least 1, at most N), so the GEMMs are wide but a group's im2col stays near the
 * L2 cache. A function of the shape only — never of the thread count — because the
 * groups fix the summation order of dw. */
static int conv_group(const dt_conv2d_desc *d) {
    int g = 1;
    while (g * 2 <= CONV_GROUP_MAX && (int64_t)g * 2 * d->P * d->Q <= CONV_GROUP_COLS) g *= 2;
    return g < d->N ? g : d->N;
}
#define PAR_MIN 32768

/* "Same-width" convolutions (stride 1, Q == W, as 3x3 with padding 1) have a faster
 * im2col: every row of col is the input plane shifted by (r - pad_h) rows and
 * (s - pad_w) columns, i.e. ONE contiguous copy per row of col, after which the few
 * entries that wrapped around a row edge are zeroed. */
static int conv_rowcopy(const dt_conv2d_desc *d) {
    return d->stride_h == 1 && d->stride_w == 1 && d->Q == d->W;
}

/* Valid output rows [*p0, *p1) for kernel row r: 0 <= p - pad_h + r < H. */
static void valid_rows(const dt_conv2d_desc *d, int r, int *p0, int *p1) {
    int a = d->pad_h - r, b = d->H + d->pad_h - r;
    *p0 = a < 0 ? 0 : a > d->P ? d->P : a;
    *p1 = b > d->P ? d->P : b < *p0 ? *p0 : b;
}

/* im2col for one sample: x (C, H, W) -> col rows (C*R*S) with row stride ld,
 * starting at column 0 of the given pointer; P*Q columns are written per row. */
static void im2col(const dt_conv2d_desc *d, const float *x, float *col, size_t ld) {
    const int H = d->H, W = d->W, P = d->P, Q = d->Q, sh = d->stride_h, sw = d->stride_w;
    const int fast = conv_rowcopy(d);
    for (int c = 0; c < d->C; c++)
        for (int r = 0; r < d->R; r++)
            for (int s = 0; s < d->S; s++) {
                float *row = col + ((size_t)(c * d->R + r) * d->S + s) * ld;
                const float *xc = x + (size_t)c * H * W;
                int off = s - d->pad_w;
                if (fast) {
                    int p0, p1;
                    valid_rows(d, r, &p0, &p1);
                    size_t len = (size_t)(p1 - p0) * Q;
                    int lead = off < 0 ? -off : 0, trail = off > 0 ? off : 0;
                    float *dst = row + (size_t)p0 * Q;
                    const float *src = xc + (size_t)(p0 - d->pad_h + r) * W;   /* read at [i + off] */
                    memset(row, 0, sizeof(float) * (size_t)p0 * Q);
                    memset(row + (size_t)p1 * Q, 0, sizeof(float) * (size_t)(P - p1) * Q);
                    if (len > (size_t)(lead + trail)) {
                        for (ptrdiff_t i = lead; i < (ptrdiff_t)(len - trail); i++) dst[i] = src[i + off];
                        for (int p = 0; p < p1 - p0; p++) {   /* entries that wrapped past a row edge */
                            for (int q = 0; q < lead && q < Q; q++) dst[(size_t)p * Q + q] = 0.0f;
                            for (int q = Q - trail < 0 ? 0 : Q - trail; q < Q; q++) dst[(size_t)p * Q + q] = 0.0f;
                        }
                    } else {
                        memset(dst, 0, sizeof(float) * len);
                    }
                    continue;
                }
                /* valid q: 0 <= q*sw - pw + s < W */
                int q0 = off >= 0 ? 0 : (-off + sw - 1) / sw;
                int q1 = (W - 1 - off) < 0 ? 0 : (W - 1 - off) / sw + 1;
                if (q1 > Q) q1 = Q;
                if (q0 > q1) q0 = q1;
                for (int p = 0; p < P; p++) {
                    float *o = row + (size_t)p * Q;
                    int ih = p * sh - d->pad_h + r;
                    if (ih < 0 || ih >= H) {
                        memset(o, 0, sizeof(float) * Q);
                        continue;
                    }
                    const float *xr = xc + (size_t)ih * W;
                    for (int q = 0; q < q0; q++) o[q] = 0.0f;
                    for (int q = q0; q < q1; q++) o[q] = xr[q * sw + off];
                    for (int q = q1; q < Q; q++) o[q] = 0.0f;
                }
            }
}

/* col2im for one sample: dx (C, H, W) = sum of the col entries that read each input,
 * in (c, r, s, p, q) order. dx is overwritten. col is scratch and may be modified:
 * the fast path zeroes the wrapped entries of a row so it can add it contiguously
 * (adding +0 leaves every sum unchanged). */
static void col2im(const dt_conv2d_desc *d, float *col, size_t ld, float *dx) {
    const int H = d->H, W = d->W, P = d->P, Q = d->Q, sh = d->stride_h, sw = d->stride_w;
    const int fast = conv_rowcopy(d);
    memset(dx, 0, sizeof(float) * (size_t)d->C * H * W);
    for (int c = 0; c < d->C; c++)
        for (int r = 0; r < d->R; r++)
            for (int s = 0; s < d->S; s++) {
                float *row = col + ((size_t)(c * d->R + r) * d->S + s) * ld;
                float *xc = dx + (size_t)c * H * W;
                int off = s - d->pad_w;
                if (fast) {
                    int p0, p1;
                    valid_rows(d, r, &p0, &p1);
                    size_t len = (size_t)(p1 - p0) * Q;
                    int lead = off < 0 ? -off : 0, trail = off > 0 ? off : 0;
                    float *src = row + (size_t)p0 * Q;
                    float *dst = xc + (size_t)(p0 - d->pad_h + r) * W;   /* written at [i + off] */
                    if (len > (size_t)(lead + trail)) {
                        for (int p = 0; p < p1 - p0; p++) {
                            for (int q = 0; q < lead && q < Q; q++) src[(size_t)p * Q + q] = 0.0f;
                            for (int q = Q - trail < 0 ? 0 : Q - trail; q < Q; q++) src[(size_t)p * Q + q] = 0.0f;
                        }
                        for (ptrdiff_t i = lead; i < (ptrdiff_t)(len - trail); i++) dst[i + off] += src[i];
                    }
                    continue;
                }
                int q0 = off >= 0 ? 0 : (-off + sw - 1) / sw;
                int q1 = (W - 1 - off) < 0 ? 0 : (W - 1 - off) / sw + 1;
                if (q1 > Q) q1 = Q;
                if (q0 > q1) q0 = q1;
                for (int p = 0; p < P; p++) {
                    int ih = p * sh - d->pad_h + r;
                    if (ih < 0 || ih >= H) continue;
                    const float *o = row + (size_t)p * Q;
                    float *xr = xc + (size_t)ih * W;
                    for (int q = q0; q < q1; q++) xr[q * sw + off] += o[q];
                }
            }
}

static dt_status conv_check(const char *fn, const dt_conv2d_desc *d) {
    if (!d) return dt_error(DT_ERR_INVALID, "cpu %s: NULL descriptor", fn);
    dt_conv2d_desc e = *d;
    dt_status s = dt_conv2d_desc_init(&e);
    if (s != DT_OK) return dt_error_wrap(s, "cpu %s: ", fn);
    if (e.P != d->P || e.Q != d->Q)
        return dt_error(DT_ERR_INVALID, "cpu %s: descriptor output %dx%d does not match its input (expected %dx%d; call dt_conv2d_desc_init)",
                        fn, d->P, d->Q, e.P, e.Q);
    return DT_OK;
}

dt_status dt_cpu_conv2d_forward(const dt_conv2d_desc *d, float *y, const float *x, const float *w,
                                const float *bias, int relu) {
    DT_TRY(conv_check("conv2d_forward", d));
    DT_CPU_ARG(y && x && w);
    const int N = d->N, K = d->K, CRS = d->C * d->R * d->S, PQ = d->P * d->Q;
    const int G = conv_group(d), ngroups = (N + G - 1) / G;
    const size_t chw = (size_t)d->C * d->H * d->W;
    int nt = dt_cpu_threads();
    if (nt > ngroups) nt = ngroups;
    int failed = 0;
    #pragma omp parallel num_threads(nt) if (nt > 1)
    {
        float *col = dt_cpu_scratch(0, (size_t)CRS * G * PQ);
        float *yg = dt_cpu_scratch(1, (size_t)K * G * PQ);
        if (!col || !yg) {
            #pragma omp atomic write
            failed = 1;
        }
        #pragma omp for schedule(dynamic, 1)
        for (int gi = 0; gi < ngroups; gi++) {
            if (!col || !yg) continue;
            int n0 = gi * G, g = N - n0 < G ? N - n0 : G;
            size_t ld = (size_t)g * PQ;
            for (int s = 0; s < g; s++) im2col(d, x + (size_t)(n0 + s) * chw, col + (size_t)s * PQ, ld);
            dt_cpu_gemm1(0, 0, K, (int)ld, CRS, 1.0f, w, CRS, col, (int)ld, 0.0f, yg, (int)ld);
            for (int s = 0; s < g; s++)
                for (int k = 0; k < K; k++) {
                    const float *src = yg + (size_t)k * ld + (size_t)s * PQ;
                    float *dst = y + ((size_t)(n0 + s) * K + k) * PQ;
                    float b = bias ? bias[k] : 0.0f;
                    if (relu)
                        for (int i = 0; i < PQ; i++) { float v = src[i] + b; dst[i] = v > 0.0f ? v : 0.0f; }
                    else
                        for (int i = 0; i < PQ; i++) dst[i] = src[i] + b;
                }
        }
    }
    if (failed) return dt_error(DT_ERR_NOMEM, "cpu conv2d_forward: out of memory for the im2col buffers");
    return DT_OK;
}

/* db (C) = sum of dy (N, C, HW) over N and HW: each plane in the fixed float lanes of
 * dt_cpu_run_sums, the planes of a channel in sample order in double, one thread per
 * channel. */
static void bias_grad_nchw(float *db, const float *dy, int N, int C, int HW) {
    int nt = dt_cpu_threads();
    #pragma omp parallel for schedule(static) num_threads(nt) if ((size_t)N * C * HW >= PAR_MIN)
    for (int c = 0; c < C; c++) {
        double acc = 0.0, plane, unused;
        for (int n = 0; n < N; n++) {
            dt_cpu_run_sums(dy + ((size_t)n * C + c) * HW, NULL, 0.0f, (size_t)HW, &plane, &unused);
            acc += plane;
        }
        db[c] = (float)acc;
    }
}

dt_status dt_cpu_conv2d_backward(const dt_conv2d_desc *d, float *dx, float *dw, float *dbias,
                                 const float *dy, const float *x, const float *w) {
    DT_TRY(conv_check("conv2d_backward", d));
    DT_CPU_ARG(dy);
    DT_CPU_ARG(!dx || w);
    DT_CPU_ARG(!dw || x);
    if (dbias) bias_grad_nchw(dbias, dy, d->N, d->K, d->P * d->Q);
    if (!dx && !dw) return DT_OK;
    const int N = d->N, K = d->K, CRS = d->C * d->R * d->S, PQ = d->P * d->Q;
    const int G = conv_group(d), ngroups = (N + G - 1) / G;
    const size_t chw = (size_t)d->C * d->H * d->W, wsize = (size_t)K * CRS;
    float *partial = NULL;   /* (ngroups, K, CRS): dw of each group */
    if (dw) {
        partial = dt_cpu_scratch(2, wsize * ngroups);
        if (!partial) return dt_error(DT_ERR_NOMEM, "cpu conv2d_backward: out of memory for %d weight partials", ngroups);
    }
    int nt = dt_cpu_threads();
    if (nt > ngroups) nt = ngroups;
    int failed = 0;
    #pragma omp parallel num_threads(nt) if (nt > 1)
    {
        float *col = dt_cpu_scratch(0, (size_t)CRS * G * PQ);
        float *dyg = dt_cpu_scratch(1, (size_t)K * G * PQ);
        if (!col || !dyg) {
            #pragma omp atomic write
            failed = 1;
        }
        #pragma omp for schedule(dynamic, 1)
        for (int gi = 0; gi < ngroups; gi++) {
            if (!col || !dyg) continue;
            int n0 = gi * G, g = N - n0 < G ? N - n0 : G;
            size_t ld = (size_t)g * PQ;
            /* dyg (K, g*PQ): the group's output gradients side by side */
            for (int s = 0; s < g; s++)
                for (int k = 0; k < K; k++)
                    memcpy(dyg + (size_t)k * ld + (size_t)s * PQ, dy + ((size_t)(n0 + s) * K + k) * PQ, sizeof(float) * PQ);
            if (dw) {
                for (int s = 0; s < g; s++) im2col(d, x + (size_t)(n0 + s) * chw, col + (size_t)s * PQ, ld);
                dt_cpu_gemm1(0, 1, K, CRS, (int)ld, 1.0f, dyg, (int)ld, col, (int)ld, 0.0f, partial + (size_t)gi * wsize, CRS);
            }
            if (dx) {
                dt_cpu_gemm1(1, 0, CRS, (int)ld, K, 1.0f, w, CRS, dyg, (int)ld, 0.0f, col, (int)ld);
                for (int s = 0; s < g; s++) col2im(d, col + (size_t)s * PQ, ld, dx + (size_t)(n0 + s) * chw);
            }
        }
    }
    if (failed) {
        return dt_error(DT_ERR_NOMEM, "cpu conv2d_backward: out of memory for the im2col buffers");
    }
    if (dw) {
        /* pairwise over groups in index order: stride-doubling tree, then copy out */
        for (int step = 1; step < ngroups; step *= 2) {
            #pragma omp parallel for schedule(static) num_threads(dt_cpu_threads()) if (wsize * ngroups >= PAR_MIN)
            for (int gi = 0; gi < ngroups; gi += 2 * step) {
                if (gi + step >= ngroups) continue;
                float *a = partial + (size_t)gi * wsize;
                const float *b = partial + (size_t)(gi + step) * wsize;
                for (size_t i = 0; i < wsize; i++) a[i] += b[i];
            }
        }
        memcpy(dw, partial, sizeof(float) * wsize);
    }
    return DT_OK;
}

/* ---- pooling ---- */

/* The input rows [h0, h1) and columns [w0, w1) of output (p, q)'s window, clipped to the input. */
static inline void pool_window(const dt_pool2d_desc *d, int p, int q, int *h0, int *h1, int *w0, int *w1) {
    int a = p * d->stride_h - d->pad_h, b = q * d->stride_w - d->pad_w;
    *h1 = a + d->kh < d->H ? a + d->kh : d->H;
    *w1 = b + d->kw < d->W ? b + d->kw : d->W;
    *h0 = a < 0 ? 0 : a;
    *w0 = b < 0 ? 0 : b;
}

static dt_status pool_check(const char *fn, const dt_pool2d_desc *d) {
    if (!d) return dt_error(DT_ERR_INVALID, "cpu %s: NULL descriptor", fn);
    dt_pool2d_desc e = *d;
    dt_status s = dt_pool2d_desc_init(&e);
    if (s != DT_OK) return dt_error_wrap(s, "cpu %s: ", fn);
    if (e.P != d->P || e.Q != d->Q)
        return dt_error(DT_ERR_INVALID, "cpu %s: descriptor output %dx%d does not match its input (expected %dx%d; call dt_pool2d_desc_init)",
                        fn, d->P, d->Q, e.P, e.Q);
    return DT_OK;
}

/* The common 2x2 window with stride 2 and no padding, branch-free so it vectorises:
 * the same first-maximum and NaN rules as the general loop (window order a b / c d). */
static void maxpool_2x2(const float *xp, float *yp, int32_t *ip, int W, int P, int Q) {
    for (int p = 0; p < P; p++) {
        const float *r0 = xp + (size_t)(2 * p) * W, *r1 = r0 + W;
        float *yr = yp + (size_t)p * Q;
        int32_t *ir = ip + (size_t)p * Q;
        const int base = 2 * p * W;
        for (int q = 0; q < Q; q++) {
            float a = r0[2 * q], b = r0[2 * q + 1], c = r1[2 * q], e = r1[2 * q + 1];
            float best = a;
            int bi = base + 2 * q;
            int tb = (b > best) | (b != b);
            best = tb ? b : best;
            bi = tb ? base + 2 * q + 1 : bi;
            int tc = (c > best) | (c != c);
            best = tc ? c : best;
            bi = tc ? base + W + 2 * q : bi;
            int te = (e > best) | (e != e);
            best = te ? e : best;
            bi = te ? base + W + 2 * q + 1 : bi;
            yr[q] = best;
            ir[q] = bi;
        }
    }
}

dt_status dt_cpu_maxpool2d_forward(const dt_pool2d_desc *d, float *y, int32_t *idx, const float *x) {
    DT_TRY(pool_check("maxpool2d_forward", d));
    DT_CPU_ARG(y && x);
    const int H = d->H, W = d->W, P = d->P, Q = d->Q, planes = d->N * d->C;
    int nt = dt_cpu_threads();
    if (d->kh == 2 && d->kw == 2 && d->stride_h == 2 && d->stride_w == 2 && d->pad_h == 0 && d->pad_w == 0) {
        int failed = 0;
        #pragma omp parallel num_threads(nt) if ((size_t)planes * H * W >= PAR_MIN)
        {
            int32_t *scratch = idx ? NULL : malloc(sizeof(int32_t) * (size_t)P * Q);   /* idx not wanted */
            if (!idx && !scratch) {
                #pragma omp atomic write
                failed = 1;
            }
            #pragma omp for schedule(static)
            for (int pl = 0; pl < planes; pl++)
                if (idx || scratch)
                    maxpool_2x2(x + (size_t)pl * H * W, y + (size_t)pl * P * Q,
                                idx ? idx + (size_t)pl * P * Q : scratch, W, P, Q);
            free(scratch);
        }
        if (failed) return dt_error(DT_ERR_NOMEM, "cpu maxpool2d_forward: out of memory");
        return DT_OK;
    }
    #pragma omp parallel for schedule(static) num_threads(nt) if ((size_t)planes * H * W >= PAR_MIN)
    for (int pl = 0; pl < planes; pl++) {
        const float *xp = x + (size_t)pl * H * W;
        for (int p = 0; p < P; p++)
            for (int q = 0; q < Q; q++) {
                int h0, h1, w0, w1;
                pool_window(d, p, q, &h0, &h1, &w0, &w1);
                float best = -INFINITY;
                int bi = h0 * W + w0;
                for (int h = h0; h < h1; h++)
                    for (int ww = w0; ww < w1; ww++) {
                        float v = xp[h * W + ww];
                        if (v > best || isnan(v)) { best = v; bi = h * W + ww; }
                    }
                y[(size_t)pl * P * Q + p * Q + q] = best;
                if (idx) idx[(size_t)pl * P * Q + p * Q + q] = bi;
            }
    }
    return DT_OK;
}

dt_status dt_cpu_maxpool2d_backward(const dt_pool2d_desc *d, float *dx, const float *dy, const int32_t *idx) {
    DT_TRY(pool_check("maxpool2d_backward", d));
    DT_CPU_ARG(dx && dy && idx);
    const int HW = d->H * d->W, PQ = d->P * d->Q, planes = d->N * d->C;
    int bad = 0;
    int nt = dt_cpu_threads();
    #pragma omp parallel for schedule(static) num_threads(nt) if ((size_t)planes * HW >= PAR_MIN)
    for (int pl = 0; pl < planes; pl++) {
        float *dp = dx + (size_t)pl * HW;
        memset(dp, 0, sizeof(float) * HW);
        for (int i = 0; i < PQ; i++) {
            int j = idx[(size_t)pl * PQ + i];
            if (j < 0 || j >= HW) {
                #pragma omp atomic write
                bad = 1;
                continue;
            }
            dp[j] += dy[(size_t)pl * PQ + i];
        }
    }
    if (bad) return dt_error(DT_ERR_INVALID, "cpu maxpool2d_backward: an argmax index is outside the %dx%d plane", d->H, d->W);
    return DT_OK;
}

dt_status dt_cpu_avgpool2d_forward(const dt_pool2d_desc *d, float *y, const float *x) {
    DT_TRY(pool_check("avgpool2d_forward", d));
    DT_CPU_ARG(y && x);
    const int H = d->H, W = d->W, P = d->P, Q = d->Q, planes = d->N * d->C;
    const float inv = 1.0f / (float)(d->kh * d->kw);   /* count_include_pad=True */
    int nt = dt_cpu_threads();
    #pragma omp parallel for schedule(static) num_threads(nt) if ((size_t)planes * H * W >= PAR_MIN)
    for (int pl = 0; pl < planes; pl++) {
        const float *xp = x + (size_t)pl * H * W;
        for (int p = 0; p < P; p++)
            for (int q = 0; q < Q; q++) {
                int h0, h1, w0, w1;
                pool_window(d, p, q, &h0, &h1, &w0, &w1);
                float s = 0.0f;
                for (int h = h0; h < h1; h++)
                    for (int ww = w0; ww < w1; ww++) s += xp[h * W + ww];
                y[(size_t)pl * P * Q + p * Q + q] = s * inv;
            }
    }
    return DT_OK;
}

dt_status dt_cpu_avgpool2d_backward(const dt_pool2d_desc *d, float *dx, const float *dy) {
    DT_TRY(pool_check("avgpool2d_backward", d));
    DT_CPU_ARG(dx && dy);
    const int H = d->H, W = d->W, P = d->P, Q = d->Q, planes = d->N * d->C;
    const float inv = 1.0f / (float)(d->kh * d->kw);
    int nt = dt_cpu_threads();
    #pragma omp parallel for schedule(static) num_threads(nt) if ((size_t)planes * H * W >= PAR_MIN)
    for (int pl = 0; pl < planes; pl++) {
        float *dp = dx + (size_t)pl * H * W;
        memset(dp, 0, sizeof(float) * H * W);
        for (int p = 0; p < P; p++)
            for (int q = 0; q < Q; q++) {
                int h0, h1, w0, w1;
                pool_window(d, p, q, &h0, &h1, &w0, &w1);
                float g = dy[(size_t)pl * P * Q + p * Q + q] * inv;
                for (int h = h0; h < h1; h++)
                    for (int ww = w0; ww < w1; ww++) dp[h * W + ww] += g;
            }
    }
    return DT_OK;
}

dt_status dt_cpu_global_avgpool_forward(float *y, const float *x, int N, int C, int HW) {
    DT_CPU_ARG(N >= 0 && C >= 0 && HW >= 1);
    if ((size_t)N * C == 0) return DT_OK;
    DT_CPU_ARG(y && x);
    int nt = dt_cpu_threads();
    #pragma omp parallel for schedule(static) num_threads(nt) if ((size_t)N * C * HW >= PAR_MIN)
    for (int nc = 0; nc < N * C; nc++) {
        double s, unused;
        dt_cpu_run_sums(x + (size_t)nc * HW, NULL, 0.0f, (size_t)HW, &s, &unused);
        y[nc] = (float)(s / HW);
    }
    return DT_OK;
}

dt_status dt_cpu_global_avgpool_backward(float *dx, const float *dy, int N, int C, int HW) {
    DT_CPU_ARG(N >= 0 && C >= 0 && HW >= 1);
    if ((size_t)N * C == 0) return DT_OK;
    DT_CPU_ARG(dx && dy);
    const float inv = 1.0f / HW;
    int nt = dt_cpu_threads();
    #pragma omp parallel for schedule(static) num_threads(nt) if ((size_t)N * C * HW >= PAR_MIN)
    for (int nc = 0; nc < N * C; nc++) {
        float g = dy[nc] * inv, *p = dx + (size_t)nc * HW;
        for (int i = 0; i < HW; i++) p[i] = g;
    }
    return DT_OK;
}
