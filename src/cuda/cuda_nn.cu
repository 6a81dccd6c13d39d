/*
 * cuda_nn.cu: convolution (im2col + cuBLAS GEMM), pooling, batch, layer and RMS
 * normalisation on the GPU — the semantics of src/cpu/cpu_conv.c and cpu_norm.c.
 *
 * Convolution works on groups of G samples, G fixed by the shape (a group's buffers stay
 * under CONV_SCRATCH floats), never by the device. For a group, col is (C*R*S, G*P*Q)
 * with sample s in columns [s*PQ, (s+1)*PQ), as on the CPU:
 *   forward:  y_s (K, PQ)     = w (K, CRS) x col_s, one strided batched GEMM over the
 *             group's samples writing y (N, K, P, Q) in place; then bias and relu in place
 *   backward: dyg (K, G*PQ)   = dy of the group, gathered
 *             dw (K, CRS)    += dyg x col^T   (groups in order, beta = 1 after the first)
 *             dcol (CRS, G*PQ) = w^T x dyg, then col2im (a gather: no atomics)
 * Forward keeps the columns of every sample (all groups) for the backward of the same
 * input (address and descriptor), within a memory budget (conv_cols below); backward
 * rebuilds them only when they were not kept. Index arithmetic is 32-bit: every
 * per-group array stays below 2^31 elements (conv_check refuses larger samples).
 *
 * Every scatter-add of the CPU (col2im, pooling backward) is a gather here: each input
 * element sums its contributions in the order the CPU adds them, starting from 0, so
 * given equal inputs the bits are equal. Per-channel statistics and global average
 * pooling sum each (n, c) plane in the CPU's 16 float lanes; the planes of a channel
 * meet in a warp and layer norm runs a warp per row (cuda_impl.h's GPU order).
 */
#include "cuda_impl.h"

#include <math.h>
#include <mutex>
#include <stdlib.h>
#include <string.h>
#include <vector>

#define CONV_SCRATCH ((size_t)1 << 25)   /* floats per group buffer (128 MiB) */

/* ---- convolution ---- */

/* Elements per sample of the largest per-sample array: columns, output, input. */
static size_t conv_per_sample(const dt_conv2d_desc *d) {
    size_t pq = (size_t)d->P * d->Q, crs = (size_t)d->C * d->R * d->S, m = crs * pq;
    if ((size_t)d->K * pq > m) m = (size_t)d->K * pq;
    if ((size_t)d->C * d->H * d->W > m) m = (size_t)d->C * d->H * d->W;
    return m;
}

static dt_status conv_check(const char *fn, const dt_conv2d_desc *d) {
    if (!d) return dt_error(DT_ERR_INVALID, "cuda %s: NULL descriptor", fn);
    dt_conv2d_desc e = *d;
    dt_status s = dt_conv2d_desc_init(&e);
    if (s != DT_OK) return dt_error_wrap(s, "cuda %s: ", fn);
    if (e.P != d->P || e.Q != d->Q)
        return dt_error(DT_ERR_INVALID, "cuda %s: descriptor output %dx%d does not match its input (expected %dx%d; call dt_conv2d_desc_init)",
                        fn, d->P, d->Q, e.P, e.Q);
    if (conv_per_sample(d) > INT32_MAX)
        return dt_error(DT_ERR_UNSUPPORTED, "cuda %s: one sample's columns (C*R*S*P*Q = %zu) exceed the 2^31 elements "
                        "this backend indexes", fn, (size_t)d->C * d->R * d->S * d->P * d->Q);
    return DT_OK;
}

/* Samples per group: as many as fit CONV_SCRATCH floats in each per-group array. */
static int conv_group(const dt_conv2d_desc *d) {
    size_t per = conv_per_sample(d), g = per ? CONV_SCRATCH / per : 1;
    if (g < 1) g = 1;
    if (g > (size_t)d->N) g = (size_t)d->N;
    return (int)g;
}

/* -- the columns of a forward, kept for the backward of the same input --
 * conv2d_backward is given the forward's x (ops.h), so columns built from the same
 * address with the same descriptor are the ones backward would build again. At most
 * `budget` bytes are kept (dt_cuda_set_memory_opts, DT_CUDA_CONV_CACHE_MB for dtrain; default the smaller of 1 GiB and a
 * sixteenth of the device); the least recently used go first, and the columns of an
 * input go when its buffer is freed (dt_cu_conv_forget, from the table's free). */
struct conv_cols {
    const float   *x;
    dt_conv2d_desc d;
    float         *col;     /* (CRS, N*PQ) group by group: group of sample n0 at col + CRS*PQ*n0 */
    size_t         bytes;
    uint64_t       used;
};
static struct {
    std::mutex             mu;
    std::vector<conv_cols> v;
    size_t                 bytes, budget;
    int                    have_budget;
    uint64_t               tick;
} cc;

/* Called with cc.mu held. The setting is read at every call, the device's size once. */
static size_t cols_budget(void) {
    const long long mb = dt_cu_conv_cache_mb;
    if (mb < 0) return 0;
    if (mb > 0) return (size_t)mb << 20;
    if (!cc.have_budget) {
        size_t fr = 0, tot = 0;
        cc.budget = (size_t)1 << 30;
        if (cudaMemGetInfo(&fr, &tot) == cudaSuccess && tot > 0 && tot / 16 < cc.budget) cc.budget = tot / 16;
        cudaGetLastError();
        cc.have_budget = 1;
    }
    return cc.budget;
}

static int cols_match(const conv_cols &c, const float *x, const dt_conv2d_desc *d) {
    return c.x == x && memcmp(&c.d, d, sizeof *d) == 0;
}

/* The kept columns of (x, d), or NULL. */
static float *cols_find(const float *x, const dt_conv2d_desc *d) {
    std::lock_guard<std::mutex> l(cc.mu);
    for (conv_cols &c : cc.v)
        if (cols_match(c, x, d)) { c.used = ++cc.tick; return c.col; }
    return NULL;
}

/* A buffer to keep the columns of (x, d) in, or NULL when they cannot be kept (then the
 * caller builds them group by group in scratch memory). */
static float *cols_make(const float *x, const dt_conv2d_desc *d, size_t bytes) {
    std::vector<float *> drop;
    float *col = NULL;
    {
        std::lock_guard<std::mutex> l(cc.mu);
        for (conv_cols &c : cc.v)
            if (cols_match(c, x, d)) { c.used = ++cc.tick; return c.col; }
        const size_t budget = cols_budget();
        if (bytes > budget) return NULL;
        while (cc.bytes + bytes > budget && !cc.v.empty()) {   /* least recently used first */
            size_t lru = 0;
            for (size_t i = 1; i < cc.v.size(); i++)
                if (cc.v[i].used < cc.v[lru].used) lru = i;
            drop.push_back(cc.v[lru].col);
            cc.bytes -= cc.v[lru].bytes;
            cc.v.erase(cc.v.begin() + (long)lru);
        }
    }
    for (float *p : drop) dt_cu_free(p);
    if (dt_cu_alloc((void **)&col, bytes) != DT_OK) return NULL;   /* no room: build them per group */
    std::lock_guard<std::mutex> l(cc.mu);
    cc.v.push_back(conv_cols{x, *d, col, bytes, ++cc.tick});
    cc.bytes += bytes;
    return col;
}

void dt_cu_conv_forget(const void *p) {
    std::vector<float *> drop;
    {
        std::lock_guard<std::mutex> l(cc.mu);
        for (size_t i = cc.v.size(); i-- > 0;)
            if (cc.v[i].x == p) {
                drop.push_back(cc.v[i].col);
                cc.bytes -= cc.v[i].bytes;
                cc.v.erase(cc.v.begin() + (long)i);
            }
    }
    for (float *c : drop) dt_cu_free(c);
}

/* col (CRS, g*PQ) from x of the g samples of a group: one thread per (s, c, p, q)
 * writes its R*S column entries (im2col as in Caffe: the divisions are shared). */
__global__ void k_im2col(float *col, const float *x, dt_conv2d_desc d, int g) {
    const unsigned PQ = d.P * d.Q, ld = g * PQ, HW = d.H * d.W, cpq = d.C * PQ, RS = d.R * d.S;
    DT_CU_FOR32(t, g * cpq) {
        const unsigned s = t / cpq, rem = t - s * cpq, c = rem / PQ, pq = rem - c * PQ;
        const int p = (int)pq / d.Q, q = (int)pq - p * d.Q;
        const int h0 = p * d.stride_h - d.pad_h, w0 = q * d.stride_w - d.pad_w;
        const float *xs = x + (s * d.C + c) * HW;
        float *out = col + c * RS * ld + s * PQ + pq;
        for (int r = 0; r < d.R; r++) {
            const int ih = h0 + r;
            for (int k = 0; k < d.S; k++, out += ld) {
                const int iw = w0 + k;
                *out = (unsigned)ih < (unsigned)d.H && (unsigned)iw < (unsigned)d.W ? xs[ih * d.W + iw] : 0.0f;
            }
        }
    }
}

/* y (n elements of (g, K, PQ)) += bias[k], then relu, in place. */
__global__ void k_conv_bias_act(float *y, const float *bias, unsigned K, unsigned PQ, unsigned n, int relu) {
    DT_CU_FOR32(t, n) {
        float v = y[t] + (bias ? bias[t / PQ % K] : 0.0f);
        y[t] = relu ? (v > 0.0f ? v : 0.0f) : v;
    }
}

/* dyg (K, g*PQ) from dy (g, K, PQ) of the group. */
__global__ void k_conv_gather_dy(float *dyg, const float *dy, unsigned K, unsigned PQ, unsigned g) {
    const unsigned ld = g * PQ, kpq = K * PQ;
    DT_CU_FOR32(t, g * kpq) {
        const unsigned s = t / kpq, r = t - s * kpq, k = r / PQ, pq = r - k * PQ;
        dyg[k * ld + s * PQ + pq] = dy[t];
    }
}

/* dx (g, C, H, W) of the group from dcol (CRS, g*PQ): each input element sums the
 * entries that read it in (r, s) order, as the CPU's col2im adds them. */
__global__ void k_col2im(float *dx, const float *col, dt_conv2d_desc d, int g) {
    const unsigned HW = d.H * d.W, PQ = d.P * d.Q, ld = g * PQ, chw = d.C * HW;
    DT_CU_FOR32(t, g * chw) {
        const unsigned s = t / chw, rem = t - s * chw, c = rem / HW, hw = rem - c * HW;
        const int ih = (int)hw / d.W, iw = (int)hw - ih * d.W;
        float acc = 0.0f;
        for (int r = 0; r < d.R; r++) {
            int ph = ih + d.pad_h - r;
            if (ph < 0 || ph % d.stride_h) continue;
            int p = ph / d.stride_h;
            if (p >= d.P) continue;
            for (int k = 0; k < d.S; k++) {
                int qw = iw + d.pad_w - k;
                if (qw < 0 || qw % d.stride_w) continue;
                int q = qw / d.stride_w;
                if (q >= d.Q) continue;
                acc += col[((c * d.R + r) * d.S + k) * ld + s * PQ + p * d.Q + q];
            }
        }
        dx[t] = acc;
    }
}

dt_status dt_cu_conv2d_forward(const dt_conv2d_desc *d, float *y, const float *x, const float *w,
                               const float *bias, int relu) {
    DT_TRY(conv_check("conv2d_forward", d));
    DT_CU_ARG(y && x && w);
    DT_TRY(dt_cu_enter());
    const int N = d->N, K = d->K, CRS = d->C * d->R * d->S, G = conv_group(d), PQ = d->P * d->Q;
    const size_t chw = (size_t)d->C * d->H * d->W;
    float *kept = cols_make(x, d, sizeof(float) * CRS * (size_t)N * PQ), *col = kept;
    if (!col) DT_TRY(dt_cu_scratch((void **)&col, sizeof(float) * CRS * (size_t)G * PQ));
    for (int n0 = 0; n0 < N; n0 += G) {
        const int g = N - n0 < G ? N - n0 : G;
        float *cg = kept ? kept + (size_t)CRS * PQ * n0 : col, *yg = y + (size_t)n0 * K * PQ;
        k_im2col<<<dt_cu_blocks((size_t)g * d->C * PQ), DT_CU_THREADS, 0, dt_cu_stream()>>>(cg, x + n0 * chw, *d, g);
        DT_CU_LAUNCH("k_im2col");
        /* y_s (K, PQ) = w (K, CRS) x col_s (CRS, PQ with row stride g*PQ), straight into NCHW */
        DT_TRY(dt_cu_gemm_batched("conv2d_forward", DT_F32, 0, 0, K, PQ, CRS, 1.0f, w, CRS, 0, cg, g * PQ, PQ, 0.0f, yg, PQ,
                                  (long long)K * PQ, g));
        if (bias || relu) {
            const unsigned n = (unsigned)g * K * PQ;
            k_conv_bias_act<<<dt_cu_blocks(n), DT_CU_THREADS, 0, dt_cu_stream()>>>(yg, bias, K, PQ, n, relu);
            DT_CU_LAUNCH("k_conv_bias_act");
        }
    }
    return DT_OK;
}

dt_status dt_cu_conv2d_backward(const dt_conv2d_desc *d, float *dx, float *dw, float *dbias,
                                const float *dy, const float *x, const float *w) {
    DT_TRY(conv_check("conv2d_backward", d));
    DT_CU_ARG(dy);
    DT_CU_ARG(!dx || w);
    DT_CU_ARG(!dw || x);
    DT_TRY(dt_cu_enter());
    if (dbias) DT_TRY(dt_cu_channel_sums(dbias, NULL, dy, NULL, NULL, NULL, d->N, d->K, d->P * d->Q));
    if (!dx && !dw) return DT_OK;
    const int N = d->N, K = d->K, CRS = d->C * d->R * d->S, G = conv_group(d), PQ = d->P * d->Q;
    const size_t chw = (size_t)d->C * d->H * d->W;
    const float *kept = dw ? cols_find(x, d) : NULL;
    float *dyg = NULL;
    DT_TRY(dt_cu_scratch((void **)&dyg, sizeof(float) * ((size_t)CRS + K) * G * PQ));
    float *col = dyg + (size_t)K * G * PQ;   /* the group's columns when not kept, then dcol */
    for (int n0 = 0; n0 < N; n0 += G) {
        const int g = N - n0 < G ? N - n0 : G, ld = g * PQ;
        k_conv_gather_dy<<<dt_cu_blocks((size_t)K * ld), DT_CU_THREADS, 0, dt_cu_stream()>>>(
            dyg, dy + (size_t)n0 * K * PQ, K, PQ, g);
        DT_CU_LAUNCH("k_conv_gather_dy");
        if (dw) {
            const float *cg = kept ? kept + (size_t)CRS * PQ * n0 : col;
            if (!kept) {
                k_im2col<<<dt_cu_blocks((size_t)g * d->C * PQ), DT_CU_THREADS, 0, dt_cu_stream()>>>(col, x + n0 * chw,
                                                                                                   *d, g);
                DT_CU_LAUNCH("k_im2col");
            }
            DT_TRY(dt_cu_gemm("conv2d_backward", 0, 1, K, CRS, ld, 1.0f, dyg, ld, cg, ld, n0 ? 1.0f : 0.0f, dw, CRS));
        }
        if (dx) {
            DT_TRY(dt_cu_gemm("conv2d_backward", 1, 0, CRS, ld, K, 1.0f, w, CRS, dyg, ld, 0.0f, col, ld));
            k_col2im<<<dt_cu_blocks((size_t)g * chw), DT_CU_THREADS, 0, dt_cu_stream()>>>(dx + n0 * chw, col, *d, g);
            DT_CU_LAUNCH("k_col2im");
        }
    }
    return DT_OK;
}

/* ---- pooling ---- */

static dt_status pool_check(const char *fn, const dt_pool2d_desc *d) {
    if (!d) return dt_error(DT_ERR_INVALID, "cuda %s: NULL descriptor", fn);
    dt_pool2d_desc e = *d;
    dt_status s = dt_pool2d_desc_init(&e);
    if (s != DT_OK) return dt_error_wrap(s, "cuda %s: ", fn);
    if (e.P != d->P || e.Q != d->Q)
        return dt_error(DT_ERR_INVALID, "cuda %s: descriptor output %dx%d does not match its input (expected %dx%d; call dt_pool2d_desc_init)",
                        fn, d->P, d->Q, e.P, e.Q);
    return DT_OK;
}

/* One thread per output; avg != 0: average (count_include_pad), else max with idx. */
__global__ void k_pool_forward(float *y, int32_t *idx, const float *x, dt_pool2d_desc d, int avg, float inv) {
    const size_t PQ = (size_t)d.P * d.Q, n = (size_t)d.N * d.C * PQ;
    DT_CU_FOR(t, n) {
        size_t pl = t / PQ;
        int p = (int)(t % PQ / d.Q), q = (int)(t % d.Q);
        const float *xp = x + pl * d.H * d.W;
        int h0 = p * d.stride_h - d.pad_h, w0 = q * d.stride_w - d.pad_w;
        int h1 = h0 + d.kh < d.H ? h0 + d.kh : d.H, w1 = w0 + d.kw < d.W ? w0 + d.kw : d.W;
        if (h0 < 0) h0 = 0;
        if (w0 < 0) w0 = 0;
        if (avg) {
            float s = 0.0f;
            for (int h = h0; h < h1; h++)
                for (int w = w0; w < w1; w++) s += xp[h * d.W + w];
            y[t] = s * inv;
        } else {
            float best = -INFINITY;
            int bi = h0 * d.W + w0;
            for (int h = h0; h < h1; h++)
                for (int w = w0; w < w1; w++) {
                    float v = xp[h * d.W + w];
                    if (v > best || isnan(v)) { best = v; bi = h * d.W + w; }
                }
            y[t] = best;
            if (idx) idx[t] = bi;
        }
    }
}

/* One thread per input element: the outputs whose window holds it, in output order. */
__global__ void k_pool_backward(float *dx, const float *dy, const int32_t *idx, dt_pool2d_desc d, int avg, float inv) {
    const size_t HW = (size_t)d.H * d.W, n = (size_t)d.N * d.C * HW;
    DT_CU_FOR(t, n) {
        size_t pl = t / HW;
        int h = (int)(t % HW / d.W), w = (int)(t % d.W), me = (int)(t % HW);
        int a = h + d.pad_h - d.kh + 1, b = w + d.pad_w - d.kw + 1;
        int p0 = a <= 0 ? 0 : (a + d.stride_h - 1) / d.stride_h, p1 = (h + d.pad_h) / d.stride_h;
        int q0 = b <= 0 ? 0 : (b + d.stride_w - 1) / d.stride_w, q1 = (w + d.pad_w) / d.stride_w;
        if (p1 > d.P - 1) p1 = d.P - 1;
        if (q1 > d.Q - 1) q1 = d.Q - 1;
        const float *g = dy + pl * d.P * d.Q;
        const int32_t *ix = idx ? idx + pl * d.P * d.Q : NULL;
        float acc = 0.0f;
        for (int p = p0; p <= p1; p++)
            for (int q = q0; q <= q1; q++) {
                if (avg) acc += g[p * d.Q + q] * inv;
                else if (ix[p * d.Q + q] == me) acc += g[p * d.Q + q];
            }
        dx[t] = acc;
    }
}

__global__ void k_check_idx(const int32_t *idx, size_t n, int HW, int *err) {
    DT_CU_FOR(i, n)
        if (idx[i] < 0 || idx[i] >= HW) err[DT_CU_ERR_MAXPOOL_BWD] = (int)i + 1;
}

static dt_status pool_launch(const char *fn, const dt_pool2d_desc *d, float *out, int32_t *idx, const float *in,
                             const float *dy, const int32_t *cidx, int backward, int avg) {
    DT_TRY(pool_check(fn, d));
    if (!out || (!backward && !in) || (backward && !dy) || (backward && !avg && !cidx))
        return dt_error(DT_ERR_INVALID, "cuda %s: NULL pointer", fn);
    DT_TRY(dt_cu_enter());
    const float inv = 1.0f / (float)(d->kh * d->kw);
    const size_t planes = (size_t)d->N * d->C;
    if (!backward) {
        size_t n = planes * d->P * d->Q;
        k_pool_forward<<<dt_cu_blocks(n), DT_CU_THREADS, 0, dt_cu_stream()>>>(out, idx, in, *d, avg, inv);
        DT_CU_LAUNCH("k_pool_forward");
        return DT_OK;
    }
    if (!avg) {
        size_t n = planes * d->P * d->Q;
        k_check_idx<<<dt_cu_blocks(n), DT_CU_THREADS, 0, dt_cu_stream()>>>(cidx, n, d->H * d->W, dt_cu_err_flags());
        DT_CU_LAUNCH("k_check_idx");
    }
    size_t n = planes * d->H * d->W;
    k_pool_backward<<<dt_cu_blocks(n), DT_CU_THREADS, 0, dt_cu_stream()>>>(out, dy, cidx, *d, avg, inv);
    DT_CU_LAUNCH("k_pool_backward");
    return DT_OK;
}

dt_status dt_cu_maxpool2d_forward(const dt_pool2d_desc *d, float *y, int32_t *idx, const float *x) {
    return pool_launch("maxpool2d_forward", d, y, idx, x, NULL, NULL, 0, 0);
}
dt_status dt_cu_maxpool2d_backward(const dt_pool2d_desc *d, float *dx, const float *dy, const int32_t *idx) {
    return pool_launch("maxpool2d_backward", d, dx, NULL, NULL, dy, idx, 1, 0);
}
dt_status dt_cu_avgpool2d_forward(const dt_pool2d_desc *d, float *y, const float *x) {
    return pool_launch("avgpool2d_forward", d, y, NULL, x, NULL, NULL, 0, 1);
}
dt_status dt_cu_avgpool2d_backward(const dt_pool2d_desc *d, float *dx, const float *dy) {
    return pool_launch("avgpool2d_backward", d, dx, NULL, NULL, dy, NULL, 1, 1);
}

static dt_status plane_sums(double *part, float *avg, const float *a, const float *b, const float *mean, int C, int HW,
                            size_t planes);   /* below, with batch norm */

__global__ void k_gap_backward(float *dx, const float *dy, size_t n, int HW, float inv) {
    DT_CU_FOR(i, n) dx[i] = dy[i / HW] * inv;
}

dt_status dt_cu_global_avgpool_forward(float *y, const float *x, int N, int C, int HW) {
    DT_CU_ARG(N >= 0 && C >= 0 && HW >= 1);
    size_t planes = (size_t)N * C;
    if (planes == 0) return DT_OK;
    DT_CU_ARG(y && x);
    DT_TRY(dt_cu_enter());
    return plane_sums(NULL, y, x, NULL, NULL, 1, HW, planes);   /* y = run sum / HW, the CPU's order */
}

dt_status dt_cu_global_avgpool_backward(float *dx, const float *dy, int N, int C, int HW) {
    DT_CU_ARG(N >= 0 && C >= 0 && HW >= 1);
    size_t n = (size_t)N * C * HW;
    if (n == 0) return DT_OK;
    DT_CU_ARG(dx && dy);
    DT_TRY(dt_cu_enter());
    k_gap_backward<<<dt_cu_blocks(n), DT_CU_THREADS, 0, dt_cu_stream()>>>(dx, dy, n, HW, 1.0f / HW);
    DT_CU_LAUNCH("k_gap_backward");
    return DT_OK;
}

/* ---- batch norm ---- */

/* The run sums of each (n, c) plane of a (N*C planes of HW) as the CPU's dt_cpu_run_sums
 * computes them on one thread, here with 16 threads per plane: thread k owns float lane k (the
 * elements i = k mod 16, in order), so a half-warp reads contiguous memory; the lanes
 * are combined in shared memory in the CPU's tree. part (planes, 2) gets the sums
 * (b != NULL: against mean[p % C]); or, with avg != NULL, avg (planes) = sum / HW.
 * Launched with DT_CU_THREADS threads per block. */
__global__ void k_plane_sums(double *part, float *avg, const float *a, const float *b, const float *mean, int C,
                             int HW, size_t planes) {
    __shared__ double s1[DT_CU_THREADS], s2[DT_CU_THREADS];
    const int tid = threadIdx.x, k = tid & 15;
    const size_t p = ((size_t)blockIdx.x * DT_CU_THREADS + tid) >> 4;
    float l1 = 0.0f, l2 = 0.0f;
    if (p < planes) {
        const float *x = a + p * HW, *y = b ? b + p * HW : NULL;
        const float m = b ? mean[p % C] : 0.0f;
        for (int i = k; i < HW; i += 16) {
            float v = x[i];
            l1 += v;
            l2 += v * (y ? y[i] - m : v);
        }
    }
    s1[tid] = l1;
    s2[tid] = l2;
    __syncthreads();
    if (k < 8) { s1[tid] += s1[tid + 8]; s2[tid] += s2[tid + 8]; }   /* t_k = l_k + l_(k+8), in double */
    __syncthreads();
    if (k < 4) { s1[tid] += s1[tid + 4]; s2[tid] += s2[tid + 4]; }
    __syncthreads();
    if (k < 2) { s1[tid] += s1[tid + 2]; s2[tid] += s2[tid + 2]; }
    __syncthreads();
    if (k == 0 && p < planes) {
        double t1 = s1[tid] + s1[tid + 1];   /* ((t0+t4)+(t2+t6)) + ((t1+t5)+(t3+t7)) */
        if (avg) {
            avg[p] = (float)(t1 / HW);
        } else {
            part[2 * p] = t1;
            part[2 * p + 1] = s2[tid] + s2[tid + 1];
        }
    }
}

static dt_status plane_sums(double *part, float *avg, const float *a, const float *b, const float *mean, int C, int HW,
                            size_t planes) {
    size_t blocks = (planes * 16 + DT_CU_THREADS - 1) / DT_CU_THREADS;
    k_plane_sums<<<(unsigned)blocks, DT_CU_THREADS, 0, dt_cu_stream()>>>(part, avg, a, b, mean, C, HW, planes);
    DT_CU_LAUNCH("k_plane_sums");
    return DT_OK;
}

/* One warp per channel (cuda_impl.h's channel order): lane l sums the planes of samples
 * l, l+32, ... in order, in double; the lanes meet in the butterfly; rounded once. */
__global__ void __launch_bounds__(DT_CU_THREADS)
k_channel_combine(float *o1, float *o2, const double *part, const float *invstd, int N, int C) {
    const int lane = threadIdx.x % 32;
    for (int c = blockIdx.x * DT_CU_WARPS + threadIdx.x / 32; c < C; c += gridDim.x * DT_CU_WARPS) {
        double s1 = 0.0, s2 = 0.0;
        for (int n = lane; n < N; n += 32) {
            const unsigned p = 2u * ((unsigned)n * (unsigned)C + (unsigned)c);
            s1 += part[p];
            s2 += part[p + 1];
        }
        s1 = dt_cu_warp_sum(s1);
        s2 = dt_cu_warp_sum(s2);
        if (lane == 0) {
            o1[c] = (float)s1;
            if (o2) o2[c] = (float)(invstd ? s2 * invstd[c] : s2);
        }
    }
}

dt_status dt_cu_channel_sums(float *o1, float *o2, const float *a, const float *b, const float *mean,
                             const float *invstd, int N, int C, int HW) {
    size_t planes = (size_t)N * C;
    if (planes > INT32_MAX / 2)
        return dt_error(DT_ERR_UNSUPPORTED, "cuda channel sums: %zu (n, c) planes are more than this backend indexes", planes);
    double *part = NULL;
    DT_TRY(dt_cu_scratch((void **)&part, sizeof(double) * 2 * (planes ? planes : 1)));
    if (planes && HW > 0) DT_TRY(plane_sums(part, NULL, a, b, mean, C, HW, planes));
    k_channel_combine<<<dt_cu_grid((size_t)C, DT_CU_WARPS), DT_CU_THREADS, 0, dt_cu_stream()>>>(
        o1, o2, part, invstd, HW > 0 ? N : 0, C);
    DT_CU_LAUNCH("k_channel_combine");
    return DT_OK;
}

dt_status dt_cu_bn_stats(float *sum, float *sumsq, const float *x, int N, int C, int HW) {
    DT_CU_ARG(N >= 0 && C >= 1 && HW >= 0);
    DT_CU_ARG(sum && sumsq && ((size_t)N * HW == 0 || x));
    DT_TRY(dt_cu_enter());
    return dt_cu_channel_sums(sum, sumsq, x, NULL, NULL, NULL, N, C, HW);
}

__global__ void k_bn_finalize(float *mean, float *invstd, const float *sum, const float *sumsq, int C,
                              int64_t count, float eps, float *rm, float *rv, float momentum) {
    DT_CU_FOR(c, C) {
        double m = (double)sum[c] / count;
        double var = (double)sumsq[c] / count - m * m;
        if (var < 0.0) var = 0.0;
        mean[c] = (float)m;
        invstd[c] = (float)(1.0 / sqrt(var + eps));
        if (rm) {
            double unbiased = count > 1 ? var * count / (count - 1) : var;
            rm[c] = (1.0f - momentum) * rm[c] + momentum * (float)m;
            rv[c] = (1.0f - momentum) * rv[c] + momentum * (float)unbiased;
        }
    }
}

dt_status dt_cu_bn_finalize(float *mean, float *invstd, const float *sum, const float *sumsq, int C,
                            int64_t count, float eps, float *running_mean, float *running_var, float momentum) {
    DT_CU_ARG(C >= 1 && count >= 1 && eps >= 0.0f);
    DT_CU_ARG(mean && invstd && sum && sumsq);
    DT_CU_ARG(!running_mean == !running_var);
    DT_TRY(dt_cu_enter());
    k_bn_finalize<<<dt_cu_blocks((size_t)C), DT_CU_THREADS, 0, dt_cu_stream()>>>(mean, invstd, sum, sumsq, C, count, eps,
                                                                                 running_mean, running_var, momentum);
    DT_CU_LAUNCH("k_bn_finalize");
    return DT_OK;
}

__global__ void k_bn_invstd(float *invstd, const float *var, int C, float eps) {
    DT_CU_FOR(c, C) invstd[c] = (float)(1.0 / sqrt((double)var[c] + eps));
}

dt_status dt_cu_bn_invstd(float *invstd, const float *var, int C, float eps) {
    DT_CU_ARG(C >= 1 && eps >= 0.0f && invstd && var);
    DT_TRY(dt_cu_enter());
    k_bn_invstd<<<dt_cu_blocks((size_t)C), DT_CU_THREADS, 0, dt_cu_stream()>>>(invstd, var, C, eps);
    DT_CU_LAUNCH("k_bn_invstd");
    return DT_OK;
}

__global__ void k_bn_apply(float *y, const float *x, const float *mean, const float *invstd, const float *gamma,
                           const float *beta, int C, int HW, size_t n, int relu) {
    DT_CU_FOR(i, n) {
        int c = (int)(i / HW % C);
        float sc = invstd[c] * (gamma ? gamma[c] : 1.0f);
        float sh = (beta ? beta[c] : 0.0f) - mean[c] * sc;
        float v = x[i] * sc + sh;
        y[i] = relu ? (v > 0.0f ? v : 0.0f) : v;
    }
}

dt_status dt_cu_bn_apply(float *y, const float *x, const float *mean, const float *invstd,
                         const float *gamma, const float *beta, int N, int C, int HW, int relu) {
    DT_CU_ARG(N >= 0 && C >= 1 && HW >= 0);
    size_t n = (size_t)N * C * HW;
    if (n == 0) return DT_OK;
    DT_CU_ARG(y && x && mean && invstd);
    DT_TRY(dt_cu_enter());
    k_bn_apply<<<dt_cu_blocks(n), DT_CU_THREADS, 0, dt_cu_stream()>>>(y, x, mean, invstd, gamma, beta, C, HW, n, relu);
    DT_CU_LAUNCH("k_bn_apply");
    return DT_OK;
}

dt_status dt_cu_bn_backward_reduce(float *sum_dy, float *sum_dy_xhat, const float *dy, const float *x,
                                   const float *mean, const float *invstd, int N, int C, int HW) {
    DT_CU_ARG(N >= 0 && C >= 1 && HW >= 0);
    DT_CU_ARG(sum_dy && sum_dy_xhat && mean && invstd && ((size_t)N * HW == 0 || (dy && x)));
    DT_TRY(dt_cu_enter());
    return dt_cu_channel_sums(sum_dy, sum_dy_xhat, dy, x, mean, invstd, N, C, HW);
}

__global__ void k_bn_backward_dx(float *dx, const float *dy, const float *x, const float *mean, const float *invstd,
                                 const float *gamma, const float *sum_dy, const float *sum_dy_xhat,
                                 int C, int HW, size_t n, int64_t count) {
    DT_CU_FOR(i, n) {
        int c = (int)(i / HW % C);
        const float is = invstd[c], m = mean[c];
        const float k = (gamma ? gamma[c] : 1.0f) * is;
        const float mdy = (float)((double)sum_dy[c] / count), mdyx = (float)((double)sum_dy_xhat[c] / count);
        dx[i] = k * (dy[i] - mdy - (x[i] - m) * is * mdyx);
    }
}

dt_status dt_cu_bn_backward_dx(float *dx, const float *dy, const float *x, const float *mean,
                               const float *invstd, const float *gamma, const float *sum_dy,
                               const float *sum_dy_xhat, int N, int C, int HW, int64_t count) {
    DT_CU_ARG(N >= 0 && C >= 1 && HW >= 0 && count >= 1);
    size_t n = (size_t)N * C * HW;
    if (n == 0) return DT_OK;
    DT_CU_ARG(dx && dy && x && mean && invstd && sum_dy && sum_dy_xhat);
    DT_TRY(dt_cu_enter());
    k_bn_backward_dx<<<dt_cu_blocks(n), DT_CU_THREADS, 0, dt_cu_stream()>>>(dx, dy, x, mean, invstd, gamma, sum_dy,
                                                                            sum_dy_xhat, C, HW, n, count);
    DT_CU_LAUNCH("k_bn_backward_dx");
    return DT_OK;
}

/* ---- layer norm: one warp per row for the statistics and dx, the column sums of
 * cuda_elem.cu for dgamma and dbeta (cuda_impl.h's orders) ---- */

/* Row i of y = (x - mean) * rstd * gamma + beta, with mean and the biased variance from
 * two passes over the row (float lane sums in the butterfly; the scalars in double, as
 * the CPU's). vec: x, y, gamma, beta can be read as float4. */
__global__ void __launch_bounds__(DT_CU_THREADS)
k_ln_forward(float *y, float *mean, float *rstd, const float *x, const float *gamma, const float *beta, int rows,
             int cols, float eps, int vec) {
    const int lane = threadIdx.x % 32;
    for (int i = blockIdx.x * DT_CU_WARPS + threadIdx.x / 32; i < rows; i += gridDim.x * DT_CU_WARPS) {
        const float *xr = x + (size_t)i * cols;
        float *yr = y + (size_t)i * cols;
        float v[4], gv[4], bv[4], s = 0.0f, q = 0.0f;
        for (int g = lane; 4 * g < cols; g += 32) {
            const int n = dt_cu_load4(v, xr, g, cols, vec);
            for (int k = 0; k < n; k++) s += v[k];
        }
        const float mf = (float)((double)dt_cu_warp_sum(s) / cols);
        for (int g = lane; 4 * g < cols; g += 32) {
            const int n = dt_cu_load4(v, xr, g, cols, vec);
            for (int k = 0; k < n; k++) q += (v[k] - mf) * (v[k] - mf);
        }
        const float r = (float)(1.0 / sqrt((double)dt_cu_warp_sum(q) / cols + eps));
        if (lane == 0) {
            mean[i] = mf;
            rstd[i] = r;
        }
        for (int g = lane; 4 * g < cols; g += 32) {
            const int n = dt_cu_load4(v, xr, g, cols, vec);
            if (gamma) dt_cu_load4(gv, gamma, g, cols, vec);
            if (beta) dt_cu_load4(bv, beta, g, cols, vec);
            for (int k = 0; k < n; k++) {
                const float h = (v[k] - mf) * r;
                v[k] = gamma ? h * gv[k] + (beta ? bv[k] : 0.0f) : h + (beta ? bv[k] : 0.0f);
            }
            dt_cu_store4(yr, g, v, n, vec);
        }
    }
}

dt_status dt_cu_layernorm_forward(float *y, float *mean, float *rstd, const float *x,
                                  const float *gamma, const float *beta, int rows, int cols, float eps) {
    DT_CU_ARG(rows >= 0 && cols >= 1 && eps >= 0.0f);
    if (rows == 0) return DT_OK;
    DT_CU_ARG(y && mean && rstd && x);
    DT_TRY(dt_cu_enter());
    const int vec = dt_cu_vec4(x, cols) && dt_cu_vec4(y, cols) && dt_cu_vec4(gamma, cols) && dt_cu_vec4(beta, cols);
    k_ln_forward<<<dt_cu_grid((size_t)rows, DT_CU_WARPS), DT_CU_THREADS, 0, dt_cu_stream()>>>(y, mean, rstd, x, gamma,
                                                                                              beta, rows, cols, eps, vec);
    DT_CU_LAUNCH("k_ln_forward");
    return DT_OK;
}

/* Row i of dx: with dh = dy * gamma and xhat = (x - mean) * rstd, the row sums a = sum dh
 * and b = sum dh * xhat, then dx = rstd * (dh - a/cols - xhat * b/cols) (the CPU's formula). */
__global__ void __launch_bounds__(DT_CU_THREADS)
k_ln_backward_dx(float *dx, const float *dy, const float *x, const float *mean, const float *rstd, const float *gamma,
                 int rows, int cols, int vec) {
    const int lane = threadIdx.x % 32;
    for (int i = blockIdx.x * DT_CU_WARPS + threadIdx.x / 32; i < rows; i += gridDim.x * DT_CU_WARPS) {
        const float *gr = dy + (size_t)i * cols, *xr = x + (size_t)i * cols;
        float *d = dx + (size_t)i * cols;
        const float m = mean[i], r = rstd[i];
        float gv[4], xv[4], wv[4] = {1.0f, 1.0f, 1.0f, 1.0f}, a = 0.0f, b = 0.0f;
        for (int g = lane; 4 * g < cols; g += 32) {
            const int n = dt_cu_load4(gv, gr, g, cols, vec);
            dt_cu_load4(xv, xr, g, cols, vec);
            if (gamma) dt_cu_load4(wv, gamma, g, cols, vec);
            for (int k = 0; k < n; k++) {
                const float dh = gv[k] * wv[k];
                a += dh;
                b += dh * ((xv[k] - m) * r);
            }
        }
        const float ma = (float)((double)dt_cu_warp_sum(a) / cols), mb = (float)((double)dt_cu_warp_sum(b) / cols);
        for (int g = lane; 4 * g < cols; g += 32) {
            const int n = dt_cu_load4(gv, gr, g, cols, vec);
            dt_cu_load4(xv, xr, g, cols, vec);
            if (gamma) dt_cu_load4(wv, gamma, g, cols, vec);
            for (int k = 0; k < n; k++) gv[k] = r * (gv[k] * wv[k] - ma - (xv[k] - m) * r * mb);
            dt_cu_store4(d, g, gv, n, vec);
        }
    }
}

dt_status dt_cu_layernorm_backward(float *dx, float *dgamma, float *dbeta, const float *dy,
                                   const float *x, const float *mean, const float *rstd,
                                   const float *gamma, int rows, int cols) {
    DT_CU_ARG(rows >= 0 && cols >= 1);
    DT_CU_ARG(rows == 0 || (dy && x && mean && rstd));
    DT_TRY(dt_cu_enter());
    if (dx && rows > 0) {
        const int vec = dt_cu_vec4(dx, cols) && dt_cu_vec4(dy, cols) && dt_cu_vec4(x, cols) && dt_cu_vec4(gamma, cols);
        k_ln_backward_dx<<<dt_cu_grid((size_t)rows, DT_CU_WARPS), DT_CU_THREADS, 0, dt_cu_stream()>>>(
            dx, dy, x, mean, rstd, gamma, rows, cols, vec);
        DT_CU_LAUNCH("k_ln_backward_dx");
    }
    if (dgamma || dbeta) DT_TRY(dt_cu_column_sums(dbeta, dgamma, dy, x, mean, rstd, rows, cols));
    return DT_OK;
}

/* ---- RMS norm: layer norm's kernels without the mean (one warp per row; the weight's
 * gradient from the column sums with no mean) ---- */

__global__ void __launch_bounds__(DT_CU_THREADS)
k_rms_forward(float *y, float *rstd, const float *x, const float *w, int rows, int cols, float eps, int vec) {
    const int lane = threadIdx.x % 32;
    for (int i = blockIdx.x * DT_CU_WARPS + threadIdx.x / 32; i < rows; i += gridDim.x * DT_CU_WARPS) {
        const float *xr = x + (size_t)i * cols;
        float *yr = y + (size_t)i * cols;
        float v[4], wv[4], q = 0.0f;
        for (int g = lane; 4 * g < cols; g += 32) {
            const int n = dt_cu_load4(v, xr, g, cols, vec);
            for (int k = 0; k < n; k++) q += v[k] * v[k];
        }
        const float r = (float)(1.0 / sqrt((double)dt_cu_warp_sum(q) / cols + eps));
        if (lane == 0) rstd[i] = r;
        for (int g = lane; 4 * g < cols; g += 32) {
            const int n = dt_cu_load4(v, xr, g, cols, vec);
            if (w) dt_cu_load4(wv, w, g, cols, vec);
            for (int k = 0; k < n; k++) v[k] = w ? v[k] * r * wv[k] : v[k] * r;
            dt_cu_store4(yr, g, v, n, vec);
        }
    }
}

dt_status dt_cu_rmsnorm_forward(float *y, float *rstd, const float *x, const float *w, int rows, int cols, float eps) {
    DT_CU_ARG(rows >= 0 && cols >= 1 && eps >= 0.0f);
    if (rows == 0) return DT_OK;
    DT_CU_ARG(y && rstd && x);
    DT_TRY(dt_cu_enter());
    const int vec = dt_cu_vec4(x, cols) && dt_cu_vec4(y, cols) && dt_cu_vec4(w, cols);
    k_rms_forward<<<dt_cu_grid((size_t)rows, DT_CU_WARPS), DT_CU_THREADS, 0, dt_cu_stream()>>>(y, rstd, x, w, rows, cols,
                                                                                               eps, vec);
    DT_CU_LAUNCH("k_rms_forward");
    return DT_OK;
}

/* Row i of dx: dh = dy * w, xhat = x * rstd, b = sum dh * xhat, dx = rstd * (dh - xhat * b/cols). */
__global__ void __launch_bounds__(DT_CU_THREADS)
k_rms_backward_dx(float *dx, const float *dy, const float *x, const float *rstd, const float *w, int rows, int cols,
                  int vec) {
    const int lane = threadIdx.x % 32;
    for (int i = blockIdx.x * DT_CU_WARPS + threadIdx.x / 32; i < rows; i += gridDim.x * DT_CU_WARPS) {
        const float *gr = dy + (size_t)i * cols, *xr = x + (size_t)i * cols;
        float *d = dx + (size_t)i * cols;
        const float r = rstd[i];
        float gv[4], xv[4], wv[4] = {1.0f, 1.0f, 1.0f, 1.0f}, b = 0.0f;
        for (int g = lane; 4 * g < cols; g += 32) {
            const int n = dt_cu_load4(gv, gr, g, cols, vec);
            dt_cu_load4(xv, xr, g, cols, vec);
            if (w) dt_cu_load4(wv, w, g, cols, vec);
            for (int k = 0; k < n; k++) b += (gv[k] * wv[k]) * (xv[k] * r);
        }
        const float mb = (float)((double)dt_cu_warp_sum(b) / cols);
        for (int g = lane; 4 * g < cols; g += 32) {
            const int n = dt_cu_load4(gv, gr, g, cols, vec);
            dt_cu_load4(xv, xr, g, cols, vec);
            if (w) dt_cu_load4(wv, w, g, cols, vec);
            for (int k = 0; k < n; k++) gv[k] = r * (gv[k] * wv[k] - xv[k] * r * mb);
            dt_cu_store4(d, g, gv, n, vec);
        }
    }
}

dt_status dt_cu_rmsnorm_backward(float *dx, float *dw, const float *dy, const float *x, const float *rstd,
                                 const float *w, int rows, int cols) {
    DT_CU_ARG(rows >= 0 && cols >= 1);
    DT_CU_ARG(rows == 0 || (dy && x && rstd));
    DT_TRY(dt_cu_enter());
    if (dx && rows > 0) {
        const int vec = dt_cu_vec4(dx, cols) && dt_cu_vec4(dy, cols) && dt_cu_vec4(x, cols) && dt_cu_vec4(w, cols);
        k_rms_backward_dx<<<dt_cu_grid((size_t)rows, DT_CU_WARPS), DT_CU_THREADS, 0, dt_cu_stream()>>>(
            dx, dy, x, rstd, w, rows, cols, vec);
        DT_CU_LAUNCH("k_rms_backward_dx");
    }
    if (dw) DT_TRY(dt_cu_column_sums(NULL, dw, dy, x, NULL, rstd, rows, cols));
    return DT_OK;
}
