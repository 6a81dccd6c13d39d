/*
 * cpu_elem.c: bias, activations, the gated MLP (swiglu), dropout and losses on the CPU.
 *
 * Elementwise kernels are trivially thread-independent (each output has one
 * writer); the activations are generated from the list in ops_elem.h. The
 * reductions here — bias gradients and loss sums — use a partition fixed by the
 * shape: a bias gradient sums each column in row order in double on one thread; a
 * loss is per-row values combined pairwise. No
 * `reduction(+:...)` clause, no atomics, so 1 and 2 threads give the same bits.
 */
#include "cpu.h"
#include "ops_elem.h"   /* dt_exp_nonpos */
#include "rng.h"

#include <math.h>
#include <stdlib.h>

#define PAR_MIN 32768   /* below this many elements a parallel region costs more than it saves */

/* ---- the gated MLP: element-wise over (row, j), one writer per element, silu's scalar
 * functions of ops_elem.h ---- */

dt_status dt_cpu_swiglu_forward(float *h, const float *gu, int rows, int hid) {
    DT_CPU_ARG(rows >= 0 && hid >= 1);
    if (rows == 0) return DT_OK;
    DT_CPU_ARG(h && gu);
    int nt = dt_cpu_threads();
    #pragma omp parallel for schedule(static) num_threads(nt) if ((size_t)rows * hid >= PAR_MIN)
    for (int i = 0; i < rows; i++) {
        const float *g = gu + (size_t)i * 2 * hid, *u = g + hid;
        float *hr = h + (size_t)i * hid;
        for (int j = 0; j < hid; j++) hr[j] = dt_silu_fwd(g[j]) * u[j];
    }
    return DT_OK;
}

/* dg = silu'(g) * (dh * u), du = dh * silu(g); each (row, j) reads g, u before writing
 * dg, du at the same places, so dgu may be gu */
dt_status dt_cpu_swiglu_backward(float *dgu, const float *dh, const float *gu, int rows, int hid) {
    DT_CPU_ARG(rows >= 0 && hid >= 1);
    if (rows == 0) return DT_OK;
    DT_CPU_ARG(dgu && dh && gu);
    int nt = dt_cpu_threads();
    #pragma omp parallel for schedule(static) num_threads(nt) if ((size_t)rows * hid >= PAR_MIN)
    for (int i = 0; i < rows; i++) {
        const float *g = gu + (size_t)i * 2 * hid, *u = g + hid, *d = dh + (size_t)i * hid;
        float *dg = dgu + (size_t)i * 2 * hid, *du = dg + hid;
        for (int j = 0; j < hid; j++) {
            const float gj = g[j], uj = u[j], dj = d[j];
            dg[j] = dt_silu_bwd(dj * uj, gj);
            du[j] = dj * dt_silu_fwd(gj);
        }
    }
    return DT_OK;
}

/* ---- bias ---- */

dt_status dt_cpu_bias_add(float *y, const float *b, int rows, int cols) {
    DT_CPU_ARG(rows >= 0 && cols >= 0);
    if (rows == 0 || cols == 0) return DT_OK;
    DT_CPU_ARG(y && b);
    int nt = dt_cpu_threads();
    #pragma omp parallel for schedule(static) num_threads(nt) if ((size_t)rows * cols >= PAR_MIN)
    for (int i = 0; i < rows; i++) {
        float *yr = y + (size_t)i * cols;
        for (int j = 0; j < cols; j++) yr[j] += b[j];
    }
    return DT_OK;
}

dt_status dt_cpu_bias_relu(float *y, const float *b, int rows, int cols) {
    DT_CPU_ARG(rows >= 0 && cols >= 0);
    if (rows == 0 || cols == 0) return DT_OK;
    DT_CPU_ARG(y && b);
    int nt = dt_cpu_threads();
    #pragma omp parallel for schedule(static) num_threads(nt) if ((size_t)rows * cols >= PAR_MIN)
    for (int i = 0; i < rows; i++) {
        float *yr = y + (size_t)i * cols;
        for (int j = 0; j < cols; j++) {
            float v = yr[j] + b[j];
            yr[j] = v > 0.0f ? v : 0.0f;
        }
    }
    return DT_OK;
}

/* Column sums: columns are cut into fixed blocks of 64; each block (db of columns
 * j0 .. j0 + w, w <= 64) is summed over rows in order, in double, by one thread. */
DT_CPU_CLONES static void bias_grad_cols(float *db, const float *dy, int rows, int cols, int j0, int w) {
    double acc[64] = {0};
    for (int i = 0; i < rows; i++) {
        const float *r = dy + (size_t)i * cols + j0;
        for (int j = 0; j < w; j++) acc[j] += r[j];
    }
    for (int j = 0; j < w; j++) db[j0 + j] = (float)acc[j];
}

dt_status dt_cpu_bias_grad(float *db, const float *dy, int rows, int cols) {
    DT_CPU_ARG(rows >= 0 && cols >= 0);
    if (cols == 0) return DT_OK;
    DT_CPU_ARG(db && (rows == 0 || dy));
    int nblk = (cols + 63) / 64, nt = dt_cpu_threads();
    #pragma omp parallel for schedule(static) num_threads(nt) if ((size_t)rows * cols >= PAR_MIN)
    for (int blk = 0; blk < nblk; blk++)
        bias_grad_cols(db, dy, rows, cols, blk * 64, cols - blk * 64 < 64 ? cols - blk * 64 : 64);
    return DT_OK;
}

/* ---- activations: one forward and one backward loop per row of DT_OPS_ELEM, over the
 * scalar functions of ops_elem.h (each output has one writer) ---- */

/* The loops run over chunks of ELEM_CHUNK elements, each chunk a call of a static loop
 * compiled for AVX-512, AVX2 and the baseline (DT_CPU_CLONES): per element the same
 * expression, so the same bits whatever the vector width or the thread. */
#define ELEM_CHUNK 4096
#define ELEM_KERNELS_(X_, name, saved, tol) \
DT_CPU_CLONES static void name##_fwd_loop(float *y, const float *x, size_t n) { \
    for (size_t i = 0; i < n; i++) y[i] = dt_##name##_fwd(x[i]); \
} \
DT_CPU_CLONES static void name##_bwd_loop(float *dx, const float *dy, const float *s, size_t n) { \
    for (size_t i = 0; i < n; i++) dx[i] = dt_##name##_bwd(dy[i], s[i]); \
} \
dt_status dt_cpu_##name##_forward(float *y, const float *x, size_t n) { \
    if (n == 0) return DT_OK; \
    DT_CPU_ARG(y && x); \
    int nt = dt_cpu_threads(); \
    size_t nc = (n + ELEM_CHUNK - 1) / ELEM_CHUNK; \
    _Pragma("omp parallel for schedule(static) num_threads(nt) if (n >= PAR_MIN / 8)") \
    for (size_t c = 0; c < nc; c++) { \
        size_t lo = c * ELEM_CHUNK, len = n - lo < ELEM_CHUNK ? n - lo : ELEM_CHUNK; \
        name##_fwd_loop(y + lo, x + lo, len); \
    } \
    return DT_OK; \
} \
dt_status dt_cpu_##name##_backward(float *dx, const float *dy, const float *saved, size_t n) { \
    if (n == 0) return DT_OK; \
    DT_CPU_ARG(dx && dy && saved); \
    int nt = dt_cpu_threads(); \
    size_t nc = (n + ELEM_CHUNK - 1) / ELEM_CHUNK; \
    _Pragma("omp parallel for schedule(static) num_threads(nt) if (n >= PAR_MIN / 8)") \
    for (size_t c = 0; c < nc; c++) { \
        size_t lo = c * ELEM_CHUNK, len = n - lo < ELEM_CHUNK ? n - lo : ELEM_CHUNK; \
        name##_bwd_loop(dx + lo, dy + lo, saved + lo, len); \
    } \
    return DT_OK; \
}
DT_OPS_ELEM(ELEM_KERNELS_, _)
#undef ELEM_KERNELS_

/* ---- dropout: one Philox block gives the keep bits of 4 consecutive elements ---- */

static dt_status dropout_apply(const char *fn, float *y, const float *x, int rows, int cols, float p,
                               uint64_t seed, uint32_t stream, uint32_t epoch, uint64_t sample0) {
    if (rows < 0 || cols < 0) return dt_error(DT_ERR_INVALID, "cpu %s: negative shape (%d, %d)", fn, rows, cols);
    if (!(p >= 0.0f && p < 1.0f)) return dt_error(DT_ERR_INVALID, "cpu %s: drop probability %g is not in [0, 1)", fn, (double)p);
    size_t n = (size_t)rows * cols;
    if (n == 0) return DT_OK;
    if (!y || !x) return dt_error(DT_ERR_INVALID, "cpu %s: NULL pointer", fn);
    if (p == 0.0f) {
        if (y != x) for (size_t i = 0; i < n; i++) y[i] = x[i];
        return DT_OK;
    }
    const float scale = 1.0f / (1.0f - p);
    dt_philox_key key = dt_philox_seed(seed);
    int nt = dt_cpu_threads();
    #pragma omp parallel for schedule(static) num_threads(nt) if (n >= PAR_MIN / 4)
    for (int i = 0; i < rows; i++) {
        uint64_t sample = sample0 + (uint64_t)i;
        const float *xr = x + (size_t)i * cols;
        float *yr = y + (size_t)i * cols;
        for (int j0 = 0; j0 < cols; j0 += 4) {
            dt_philox_ctr c = {{(uint32_t)((uint64_t)j0 >> 2), (uint32_t)sample, epoch, stream}};
            dt_philox_ctr r = dt_philox4x32_10(c, key);
            int w = cols - j0 < 4 ? cols - j0 : 4;
            for (int k = 0; k < w; k++)
                yr[j0 + k] = dt_u32_to_unit(r.v[k]) >= p ? xr[j0 + k] * scale : 0.0f;
        }
    }
    return DT_OK;
}

dt_status dt_cpu_dropout_forward(float *y, const float *x, int rows, int cols, float p,
                                 uint64_t seed, uint32_t stream, uint32_t epoch, uint64_t sample0) {
    return dropout_apply("dropout_forward", y, x, rows, cols, p, seed, stream, epoch, sample0);
}

/* The gradient of y = x*mask*scale is dy*mask*scale: the same map applied to dy. */
dt_status dt_cpu_dropout_backward(float *dx, const float *dy, int rows, int cols, float p,
                                  uint64_t seed, uint32_t stream, uint32_t epoch, uint64_t sample0) {
    return dropout_apply("dropout_backward", dx, dy, rows, cols, p, seed, stream, epoch, sample0);
}

/* ---- losses ---- */

static dt_status check_labels(const char *fn, const int32_t *labels, int B, int C) {
    for (int i = 0; i < B; i++)
        if (labels[i] >= C)
            return dt_error(DT_ERR_INVALID, "cpu %s: label %d of row %d is out of range for %d classes", fn, (int)labels[i], i, C);
    return DT_OK;
}

/* Add v[0..n) into eight double lanes, lane k taking the elements c = k mod 8 in order.
 * Inlined into each clone of its caller, so the eight lanes are one vector of the
 * clone's width (each lane's sum in the same order: the same bits). */
static inline __attribute__((always_inline)) void lanes8_add(double *a, const float *v, int n) {
    int c = 0;
    for (; c + 8 <= n; c += 8)
        for (int k = 0; k < 8; k++) a[k] += v[c + k];
    for (int k = 0; c < n; c++, k++) a[k] += v[c];
}

/* One row of C logits x: p[c] = exp(x[c] - mx) with the polynomial exp of ops_elem.h
 * (vectorised, unlike expf; mx the row's largest, so every argument is <= 0); the sums
 * of x and of p in eight double lanes (lane c mod 8) combined in a fixed tree: the order
 * depends on C only. The sum of x comes first, so p may be x itself (each x[c] is read
 * before p[c] is written); p NULL keeps no probabilities, the same sums from a chunk of
 * the row at a time (XENT_CHUNK, a multiple of 8, keeps every lane's elements). */
enum { XENT_CHUNK = 512 };
DT_CPU_CLONES static void xent_row(float *p, const float *x, int C, float mx, double *s, double *sx) {
    double a[8] = { 0 }, b[8] = { 0 };
    float tmp[XENT_CHUNK];
    lanes8_add(b, x, C);
    for (int c0 = 0; c0 < C; c0 += XENT_CHUNK) {
        int n = C - c0 < XENT_CHUNK ? C - c0 : XENT_CHUNK;
        float *q = p ? p + c0 : tmp;
        for (int c = 0; c < n; c++) q[c] = dt_exp_nonpos(x[c0 + c] - mx);
        lanes8_add(a, q, n);
    }
    *s = DT_CPU_TREE8(a);
    *sx = DT_CPU_TREE8(b);
}

dt_status dt_cpu_xent_forward(float *loss, float *probs, const float *logits, const int32_t *labels,
                              int B, int C, float label_smoothing, float norm) {
    DT_CPU_ARG(B >= 0 && C >= 1);
    DT_CPU_ARG(loss && (B == 0 || (logits && labels)));
    DT_CPU_ARG(label_smoothing >= 0.0f && label_smoothing <= 1.0f);
    DT_CPU_ARG(norm > 0.0f);
    DT_TRY(check_labels("xent_forward", labels, B, C));
    double *row = malloc(sizeof(double) * (B > 0 ? B : 1));
    if (!row) return dt_error(DT_ERR_NOMEM, "cpu xent_forward: out of memory for %d rows", B);
    const double ls = label_smoothing;
    int nt = dt_cpu_threads();
    #pragma omp parallel for schedule(static) num_threads(nt) if ((size_t)B * C >= PAR_MIN)
    for (int i = 0; i < B; i++) {
        const float *x = logits + (size_t)i * C;
        float *p = probs ? probs + (size_t)i * C : NULL;
        const float xl = labels[i] >= 0 ? x[labels[i]] : 0.0f;   /* before p overwrites it */
        float mx = dt_cpu_row_max(x, C, x[0]);
        double s, sx;
        xent_row(p, x, C, mx, &s, &sx);
        float inv = (float)(1.0 / s);
        if (p)
            for (int c = 0; c < C; c++) p[c] *= inv;
        if (labels[i] < 0) { row[i] = 0.0; continue; }
        double lse = mx + log(s);
        /* -sum_c target_c * log p_c with log p_c = x_c - lse and target summing to 1. */
        row[i] = lse - ((1.0 - ls) * xl + ls / C * sx);
    }
    double total = dt_cpu_pairwise(row, (size_t)B);
    free(row);
    *loss = (float)(total / norm);
    return DT_OK;
}

dt_status dt_cpu_xent_backward(float *dlogits, const float *probs, const int32_t *labels,
                               int B, int C, float label_smoothing, float norm) {
    DT_CPU_ARG(B >= 0 && C >= 1);
    DT_CPU_ARG(B == 0 || (dlogits && probs && labels));
    DT_CPU_ARG(label_smoothing >= 0.0f && label_smoothing <= 1.0f);
    DT_CPU_ARG(norm > 0.0f);
    DT_TRY(check_labels("xent_backward", labels, B, C));
    const float inv = 1.0f / norm, off = label_smoothing / C, on = 1.0f - label_smoothing;
    int nt = dt_cpu_threads();
    #pragma omp parallel for schedule(static) num_threads(nt) if ((size_t)B * C >= PAR_MIN)
    for (int i = 0; i < B; i++) {
        const float *p = probs + (size_t)i * C;
        float *d = dlogits + (size_t)i * C;
        if (labels[i] < 0) {
            for (int c = 0; c < C; c++) d[c] = 0.0f;
            continue;
        }
        const int y = labels[i];   /* reading p[c] before writing d[c]: in place is fine */
        const float py = p[y];
        /* (p - off - 0) is p - off: the bits the label test gave, without it in the loop */
        for (int c = 0; c < C; c++) d[c] = (p[c] - off) * inv;
        d[y] = (py - off - on) * inv;
    }
    return DT_OK;
}

/* Squared differences summed in fixed chunks of DT_CPU_CHUNK, chunks combined pairwise. */
dt_status dt_cpu_mse_forward(float *loss, const float *pred, const float *target, size_t n, float norm) {
    DT_CPU_ARG(loss && (n == 0 || (pred && target)));
    DT_CPU_ARG(norm > 0.0f);
    size_t nch = (n + DT_CPU_CHUNK - 1) / DT_CPU_CHUNK;
    double *part = malloc(sizeof(double) * (nch > 0 ? nch : 1));
    if (!part) return dt_error(DT_ERR_NOMEM, "cpu mse_forward: out of memory");
    int nt = dt_cpu_threads();
    #pragma omp parallel for schedule(static) num_threads(nt) if (n >= PAR_MIN)
    for (size_t ch = 0; ch < nch; ch++) {
        size_t i0 = ch * DT_CPU_CHUNK, i1 = i0 + DT_CPU_CHUNK < n ? i0 + DT_CPU_CHUNK : n;
        double a = 0.0;
        for (size_t i = i0; i < i1; i++) {
            double d = (double)pred[i] - target[i];
            a += d * d;
        }
        part[ch] = a;
    }
    double total = dt_cpu_pairwise(part, nch);
    free(part);
    *loss = (float)(total / norm);
    return DT_OK;
}

dt_status dt_cpu_mse_backward(float *dpred, const float *pred, const float *target, size_t n, float norm) {
    if (n == 0) return DT_OK;
    DT_CPU_ARG(dpred && pred && target);
    DT_CPU_ARG(norm > 0.0f);
    const float k = 2.0f / norm;
    int nt = dt_cpu_threads();
    #pragma omp parallel for schedule(static) num_threads(nt) if (n >= PAR_MIN)
    for (size_t i = 0; i < n; i++) dpred[i] = k * (pred[i] - target[i]);
    return DT_OK;
}
