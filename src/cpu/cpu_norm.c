/*
 * cpu_norm.c: batch normalisation, layer normalisation and RMS normalisation on the CPU.
 *
 * Batch norm is split into sums, finalisation and application so that synchronised
 * batch norm is an all-reduce of the sums between bn_stats and bn_finalize (and of
 * the two backward sums between bn_backward_reduce and bn_backward_dx); the kernels
 * know nothing of communication. Every per-channel sum is owned by one thread and
 * accumulated in double in (sample, position) order — thread-count independent.
 */
#include "cpu.h"

#include <math.h>
#include <string.h>

#define PAR_MIN 32768

typedef float v16f __attribute__((vector_size(64)));   /* GCC/Clang generic vectors */

/* The body of dt_cpu_run_sums, multiversioned; static (see DT_CPU_CLONES in cpu.h). */
DT_CPU_CLONES
static void run_sums(const float *a, const float *b, float m, size_t n, double *s1, double *s2) {
    v16f l1 = {0}, l2 = {0}, va, vb;
    size_t i = 0;
    if (b) {
        for (; i + 16 <= n; i += 16) {
            memcpy(&va, a + i, sizeof va);
            memcpy(&vb, b + i, sizeof vb);
            l1 += va;
            l2 += va * (vb - m);
        }
    } else {
        for (; i + 16 <= n; i += 16) {
            memcpy(&va, a + i, sizeof va);
            l1 += va;
            l2 += va * va;
        }
    }
    for (int k = 0; i < n; i++, k++) {
        l1[k] += a[i];
        l2[k] += a[i] * (b ? b[i] - m : a[i]);
    }
    double t1[8], t2[8];
    for (int k = 0; k < 8; k++) {
        t1[k] = (double)l1[k] + l1[k + 8];
        t2[k] = (double)l2[k] + l2[k + 8];
    }
    *s1 = ((t1[0] + t1[4]) + (t1[2] + t1[6])) + ((t1[1] + t1[5]) + (t1[3] + t1[7]));
    *s2 = ((t2[0] + t2[4]) + (t2[2] + t2[6])) + ((t2[1] + t2[5]) + (t2[3] + t2[7]));
}

void dt_cpu_run_sums(const float *a, const float *b, float m, size_t n, double *s1, double *s2) {
    run_sums(a, b, m, n, s1, s2);
}

/* Sums over x (N, C, HW) for channel c: per plane in float lanes, planes in order in double. */
static void channel_sums(const float *x, const float *b, const float m, int N, int C, int HW, int c,
                         double *s, double *ss) {
    double a = 0.0, q = 0.0;
    for (int n = 0; n < N; n++) {
        double pa, pq;
        size_t off = ((size_t)n * C + c) * HW;
        run_sums(x + off, b ? b + off : NULL, m, (size_t)HW, &pa, &pq);
        a += pa;
        q += pq;
    }
    *s = a;
    *ss = q;
}

dt_status dt_cpu_bn_stats(float *sum, float *sumsq, const float *x, int N, int C, int HW) {
    DT_CPU_ARG(N >= 0 && C >= 1 && HW >= 0);
    DT_CPU_ARG(sum && sumsq && ((size_t)N * HW == 0 || x));
    int nt = dt_cpu_threads();
    #pragma omp parallel for schedule(static) num_threads(nt) if ((size_t)N * C * HW >= PAR_MIN)
    for (int c = 0; c < C; c++) {
        double s, ss;
        channel_sums(x, NULL, 0.0f, N, C, HW, c, &s, &ss);
        sum[c] = (float)s;
        sumsq[c] = (float)ss;
    }
    return DT_OK;
}

dt_status dt_cpu_bn_finalize(float *mean, float *invstd, const float *sum, const float *sumsq, int C,
                             int64_t count, float eps, float *running_mean, float *running_var, float momentum) {
    DT_CPU_ARG(C >= 1 && count >= 1 && eps >= 0.0f);
    DT_CPU_ARG(mean && invstd && sum && sumsq);
    DT_CPU_ARG(!running_mean == !running_var);
    for (int c = 0; c < C; c++) {
        double m = (double)sum[c] / count;
        double var = (double)sumsq[c] / count - m * m;
        if (var < 0.0) var = 0.0;
        mean[c] = (float)m;
        invstd[c] = (float)(1.0 / sqrt(var + eps));
        if (running_mean) {
            double unbiased = count > 1 ? var * count / (count - 1) : var;
            running_mean[c] = (1.0f - momentum) * running_mean[c] + momentum * (float)m;
            running_var[c] = (1.0f - momentum) * running_var[c] + momentum * (float)unbiased;
        }
    }
    return DT_OK;
}

dt_status dt_cpu_bn_invstd(float *invstd, const float *var, int C, float eps) {
    DT_CPU_ARG(C >= 1 && eps >= 0.0f && invstd && var);
    for (int c = 0; c < C; c++) invstd[c] = (float)(1.0 / sqrt((double)var[c] + eps));
    return DT_OK;
}

dt_status dt_cpu_bn_apply(float *y, const float *x, const float *mean, const float *invstd,
                          const float *gamma, const float *beta, int N, int C, int HW, int relu) {
    DT_CPU_ARG(N >= 0 && C >= 1 && HW >= 0);
    if ((size_t)N * HW == 0) return DT_OK;
    DT_CPU_ARG(y && x && mean && invstd);
    int nt = dt_cpu_threads();
    #pragma omp parallel for schedule(static) num_threads(nt) if ((size_t)N * C * HW >= PAR_MIN)
    for (int nc = 0; nc < N * C; nc++) {
        int c = nc % C;
        float sc = invstd[c] * (gamma ? gamma[c] : 1.0f);
        float sh = (beta ? beta[c] : 0.0f) - mean[c] * sc;
        const float *xp = x + (size_t)nc * HW;
        float *yp = y + (size_t)nc * HW;
        if (relu) {
            for (int i = 0; i < HW; i++) { float v = xp[i] * sc + sh; yp[i] = v > 0.0f ? v : 0.0f; }
        } else {
            for (int i = 0; i < HW; i++) yp[i] = xp[i] * sc + sh;
        }
    }
    return DT_OK;
}

dt_status dt_cpu_bn_backward_reduce(float *sum_dy, float *sum_dy_xhat, const float *dy, const float *x,
                                    const float *mean, const float *invstd, int N, int C, int HW) {
    DT_CPU_ARG(N >= 0 && C >= 1 && HW >= 0);
    DT_CPU_ARG(sum_dy && sum_dy_xhat && mean && invstd && ((size_t)N * HW == 0 || (dy && x)));
    int nt = dt_cpu_threads();
    #pragma omp parallel for schedule(static) num_threads(nt) if ((size_t)N * C * HW >= PAR_MIN)
    for (int c = 0; c < C; c++) {
        double a, b;
        channel_sums(dy, x, mean[c], N, C, HW, c, &a, &b);
        sum_dy[c] = (float)a;
        sum_dy_xhat[c] = (float)(b * invstd[c]);
    }
    return DT_OK;
}

dt_status dt_cpu_bn_backward_dx(float *dx, const float *dy, const float *x, const float *mean,
                                const float *invstd, const float *gamma, const float *sum_dy,
                                const float *sum_dy_xhat, int N, int C, int HW, int64_t count) {
    DT_CPU_ARG(N >= 0 && C >= 1 && HW >= 0 && count >= 1);
    if ((size_t)N * HW == 0) return DT_OK;
    DT_CPU_ARG(dx && dy && x && mean && invstd && sum_dy && sum_dy_xhat);
    int nt = dt_cpu_threads();
    #pragma omp parallel for schedule(static) num_threads(nt) if ((size_t)N * C * HW >= PAR_MIN)
    for (int nc = 0; nc < N * C; nc++) {
        int c = nc % C;
        const float is = invstd[c], m = mean[c];
        const float k = (gamma ? gamma[c] : 1.0f) * is;
        const float mdy = (float)((double)sum_dy[c] / count), mdyx = (float)((double)sum_dy_xhat[c] / count);
        const float *g = dy + (size_t)nc * HW, *xp = x + (size_t)nc * HW;
        float *d = dx + (size_t)nc * HW;
        for (int i = 0; i < HW; i++) d[i] = k * (g[i] - mdy - (xp[i] - m) * is * mdyx);
    }
    return DT_OK;
}

/* ---- layer norm ---- */

/* Layer norm works row by row, one row per OpenMP iteration. A row's sums run in
 * eight double lanes (lane k takes column j = k mod 8) combined by DT_CPU_TREE8, so
 * the order depends on the row length only and the lanes vectorise; the column sums of
 * the parameter gradients run in fixed blocks of 64 columns, rows in order. */
DT_CPU_CLONES static void ln_row_forward(float *restrict y, float *mean, float *rstd, const float *restrict x,
                                         const float *restrict gamma, const float *restrict beta, int n,
                                         float eps) {
    double s[8] = { 0 }, v[8] = { 0 };
    int j = 0;
    for (; j + 8 <= n; j += 8)
        for (int k = 0; k < 8; k++) s[k] += x[j + k];
    for (int k = 0; j < n; j++, k++) s[k] += x[j];
    const double m = DT_CPU_TREE8(s) / n;
    for (j = 0; j + 8 <= n; j += 8)
        for (int k = 0; k < 8; k++) v[k] += ((double)x[j + k] - m) * ((double)x[j + k] - m);
    for (int k = 0; j < n; j++, k++) v[k] += ((double)x[j] - m) * ((double)x[j] - m);
    const float mf = (float)m, r = (float)(1.0 / sqrt(DT_CPU_TREE8(v) / n + eps));
    *mean = mf;
    *rstd = r;
    /* y = xhat * gamma + beta, a missing gamma 1 and a missing beta +0 */
    if (gamma && beta) for (j = 0; j < n; j++) y[j] = (x[j] - mf) * r * gamma[j] + beta[j];
    else if (gamma) for (j = 0; j < n; j++) y[j] = (x[j] - mf) * r * gamma[j] + 0.0f;
    else if (beta) for (j = 0; j < n; j++) y[j] = (x[j] - mf) * r + beta[j];
    else for (j = 0; j < n; j++) y[j] = (x[j] - mf) * r + 0.0f;
}

dt_status dt_cpu_layernorm_forward(float *y, float *mean, float *rstd, const float *x,
                                   const float *gamma, const float *beta, int rows, int cols, float eps) {
    DT_CPU_ARG(rows >= 0 && cols >= 1 && eps >= 0.0f);
    if (rows == 0) return DT_OK;
    DT_CPU_ARG(y && mean && rstd && x);
    int nt = dt_cpu_threads();
    #pragma omp parallel for schedule(static) num_threads(nt) if ((size_t)rows * cols >= PAR_MIN)
    for (int i = 0; i < rows; i++)
        ln_row_forward(y + (size_t)i * cols, mean + i, rstd + i, x + (size_t)i * cols, gamma, beta, cols, eps);
    return DT_OK;
}

/* dx of one row: dxhat = dy * gamma (gamma missing: 1), a = mean(dxhat),
 * b = mean(dxhat * xhat), dx = rstd * (dxhat - a - xhat * b) */
DT_CPU_CLONES static void ln_row_backward(float *restrict d, const float *restrict g, const float *restrict x,
                                          const float *restrict gamma, float m, float r, int n) {
    double a[8] = { 0 }, b[8] = { 0 };
    int j = 0;
    if (gamma) {
        for (; j + 8 <= n; j += 8)
            for (int k = 0; k < 8; k++) {
                float dh = g[j + k] * gamma[j + k];
                a[k] += dh;
                b[k] += (double)dh * ((x[j + k] - m) * r);
            }
        for (int k = 0; j < n; j++, k++) {
            float dh = g[j] * gamma[j];
            a[k] += dh;
            b[k] += (double)dh * ((x[j] - m) * r);
        }
    } else {
        for (; j + 8 <= n; j += 8)
            for (int k = 0; k < 8; k++) {
                a[k] += g[j + k];
                b[k] += (double)g[j + k] * ((x[j + k] - m) * r);
            }
        for (int k = 0; j < n; j++, k++) {
            a[k] += g[j];
            b[k] += (double)g[j] * ((x[j] - m) * r);
        }
    }
    const float ma = (float)(DT_CPU_TREE8(a) / n), mb = (float)(DT_CPU_TREE8(b) / n);
    if (gamma) for (j = 0; j < n; j++) d[j] = r * (g[j] * gamma[j] - ma - (x[j] - m) * r * mb);
    else for (j = 0; j < n; j++) d[j] = r * (g[j] - ma - (x[j] - m) * r * mb);
}

/* dgamma, dbeta of columns j0 .. j0 + w (w <= 64): sums over the rows in order */
DT_CPU_CLONES static void ln_cols_backward(float *dgamma, float *dbeta, const float *dy, const float *x,
                                           const float *mean, const float *rstd, int rows, int cols, int j0,
                                           int w) {
    double ag[64] = { 0 }, ab[64] = { 0 };
    for (int i = 0; i < rows; i++) {
        const float *restrict g = dy + (size_t)i * cols + j0, *restrict xr = x + (size_t)i * cols + j0;
        const float m = mean ? mean[i] : 0.0f, r = rstd[i];   /* no mean: RMS norm's */
        for (int j = 0; j < w; j++) {
            ag[j] += (double)g[j] * ((xr[j] - m) * r);
            ab[j] += g[j];
        }
    }
    for (int j = 0; j < w; j++) {
        if (dgamma) dgamma[j0 + j] = (float)ag[j];
        if (dbeta) dbeta[j0 + j] = (float)ab[j];
    }
}

dt_status dt_cpu_layernorm_backward(float *dx, float *dgamma, float *dbeta, const float *dy,
                                    const float *x, const float *mean, const float *rstd,
                                    const float *gamma, int rows, int cols) {
    DT_CPU_ARG(rows >= 0 && cols >= 1);
    DT_CPU_ARG(rows == 0 || (dy && x && mean && rstd));
    int nt = dt_cpu_threads();
    if (dx && rows > 0) {
        #pragma omp parallel for schedule(static) num_threads(nt) if ((size_t)rows * cols >= PAR_MIN)
        for (int i = 0; i < rows; i++)
            ln_row_backward(dx + (size_t)i * cols, dy + (size_t)i * cols, x + (size_t)i * cols, gamma, mean[i],
                            rstd[i], cols);
    }
    if (dgamma || dbeta) {
        int nblk = (cols + 63) / 64;
        #pragma omp parallel for schedule(static) num_threads(nt) if ((size_t)rows * cols >= PAR_MIN)
        for (int blk = 0; blk < nblk; blk++)
            ln_cols_backward(dgamma, dbeta, dy, x, mean, rstd, rows, cols, blk * 64,
                             cols - blk * 64 < 64 ? cols - blk * 64 : 64);
    }
    return DT_OK;
}

/* ---- RMS norm ---- */

/* RMS norm is layer norm without the mean: one row per OpenMP iteration, the row's sum
 * of squares in eight double lanes combined by DT_CPU_TREE8, the weight's gradient in
 * layer norm's fixed column blocks with the mean 0. */
DT_CPU_CLONES static void rms_row_forward(float *restrict y, float *rstd, const float *restrict x,
                                          const float *restrict w, int n, float eps) {
    double v[8] = { 0 };
    int j = 0;
    for (; j + 8 <= n; j += 8)
        for (int k = 0; k < 8; k++) v[k] += (double)x[j + k] * (double)x[j + k];
    for (int k = 0; j < n; j++, k++) v[k] += (double)x[j] * (double)x[j];
    const float r = (float)(1.0 / sqrt(DT_CPU_TREE8(v) / n + eps));
    *rstd = r;
    if (w) for (j = 0; j < n; j++) y[j] = x[j] * r * w[j];
    else for (j = 0; j < n; j++) y[j] = x[j] * r;
}

dt_status dt_cpu_rmsnorm_forward(float *y, float *rstd, const float *x, const float *w, int rows, int cols,
                                 float eps) {
    DT_CPU_ARG(rows >= 0 && cols >= 1 && eps >= 0.0f);
    if (rows == 0) return DT_OK;
    DT_CPU_ARG(y && rstd && x);
    int nt = dt_cpu_threads();
    #pragma omp parallel for schedule(static) num_threads(nt) if ((size_t)rows * cols >= PAR_MIN)
    for (int i = 0; i < rows; i++)
        rms_row_forward(y + (size_t)i * cols, rstd + i, x + (size_t)i * cols, w, cols, eps);
    return DT_OK;
}

/* dx of one row: dxhat = dy * w (w missing: 1), b = mean(dxhat * xhat) with
 * xhat = x * rstd, dx = rstd * (dxhat - xhat * b) */
DT_CPU_CLONES static void rms_row_backward(float *restrict d, const float *restrict g, const float *restrict x,
                                           const float *restrict w, float r, int n) {
    double b[8] = { 0 };
    int j = 0;
    for (; j + 8 <= n; j += 8)
        for (int k = 0; k < 8; k++) b[k] += (double)(g[j + k] * (w ? w[j + k] : 1.0f)) * (x[j + k] * r);
    for (int k = 0; j < n; j++, k++) b[k] += (double)(g[j] * (w ? w[j] : 1.0f)) * (x[j] * r);
    const float mb = (float)(DT_CPU_TREE8(b) / n);
    for (j = 0; j < n; j++) d[j] = r * (g[j] * (w ? w[j] : 1.0f) - x[j] * r * mb);
}

dt_status dt_cpu_rmsnorm_backward(float *dx, float *dw, const float *dy, const float *x, const float *rstd,
                                  const float *w, int rows, int cols) {
    DT_CPU_ARG(rows >= 0 && cols >= 1);
    DT_CPU_ARG(rows == 0 || (dy && x && rstd));
    int nt = dt_cpu_threads();
    if (dx && rows > 0) {
        #pragma omp parallel for schedule(static) num_threads(nt) if ((size_t)rows * cols >= PAR_MIN)
        for (int i = 0; i < rows; i++)
            rms_row_backward(dx + (size_t)i * cols, dy + (size_t)i * cols, x + (size_t)i * cols, w, rstd[i], cols);
    }
    if (dw) {
        int nblk = (cols + 63) / 64;
        #pragma omp parallel for schedule(static) num_threads(nt) if ((size_t)rows * cols >= PAR_MIN)
        for (int blk = 0; blk < nblk; blk++)
            ln_cols_backward(dw, NULL, dy, x, NULL, rstd, rows, cols, blk * 64, cols - blk * 64 < 64 ? cols - blk * 64 : 64);
    }
    return DT_OK;
}
