/*
 * cuda_nn.cu: convolution (im2col + cuBLAS GEMM), pooling, batch and layer
 * normalisation on the GPU — the semantics of src/cpu/cpu_conv.c and cpu_norm.c.
 *
 * Convolution works on groups of G samples, G fixed by the shape (the im2col buffer
 * stays under CONV_SCRATCH floats), never by the device. For a group, col is
 * (C*R*S, G*P*Q) with sample s in columns [s*PQ, (s+1)*PQ), as on the CPU:
 *   forward:  yg (K, G*PQ)     = w (K, CRS) x col, then bias/relu scattered to y (N, K, P, Q)
 *   backward: dwg (K, CRS)     = dyg (K, G*PQ) x col^T     (one partial per group)
 *             dcol (CRS, G*PQ) = w^T x dyg, then col2im     (a gather: no atomics)
 * The group partials of dw are combined pairwise in group order (the CPU's tree).
 *
 * Every scatter-add of the CPU (col2im, pooling backward) is a gather here: each input
 * element sums its contributions in the order the CPU adds them, starting from 0, so
 * given equal inputs the bits are equal. Per-channel statistics, global average pooling
 * and layer norm sum in the CPU's order too (cuda_impl.h): a thread per (n, c) plane
 * in 16 float lanes then the planes in sample order, a thread per row or column.
 */
#include "cuda_impl.h"

#include <math.h>

#define CONV_SCRATCH ((size_t)1 << 25)   /* floats per group buffer (128 MiB) */

/* ---- convolution ---- */

static dt_status conv_check(const char *fn, const dt_conv2d_desc *d) {
    if (!d) return dt_error(DT_ERR_INVALID, "cuda %s: NULL descriptor", fn);
    dt_conv2d_desc e = *d;
    dt_status s = dt_conv2d_desc_init(&e);
    if (s != DT_OK) return dt_error_wrap(s, "cuda %s: ", fn);
    if (e.P != d->P || e.Q != d->Q)
        return dt_error(DT_ERR_INVALID, "cuda %s: descriptor output %dx%d does not match its input (expected %dx%d; call dt_conv2d_desc_init)",
                        fn, d->P, d->Q, e.P, e.Q);
    return DT_OK;
}

/* Samples per group: as many as fit CONV_SCRATCH floats in col and in yg. */
static int conv_group(const dt_conv2d_desc *d) {
    size_t crs = (size_t)d->C * d->R * d->S, wide = crs > (size_t)d->K ? crs : (size_t)d->K;
    size_t per = wide * d->P * d->Q, g = per ? CONV_SCRATCH / per : 1;
    if (g < 1) g = 1;
    if (g > (size_t)d->N) g = (size_t)d->N;
    return (int)g;
}

/* col (CRS, g*PQ) from x of samples n0 .. n0+g-1. */
__global__ void k_im2col(float *col, const float *x, dt_conv2d_desc d, int g) {
    const size_t PQ = (size_t)d.P * d.Q, ld = (size_t)g * PQ, n = (size_t)d.C * d.R * d.S * ld;
    DT_CU_FOR(t, n) {
        size_t crs = t / ld, rem = t % ld, s = rem / PQ, pq = rem % PQ;
        int c = (int)(crs / (d.R * d.S)), r = (int)(crs / d.S % d.R), k = (int)(crs % d.S);
        int ih = (int)(pq / d.Q) * d.stride_h - d.pad_h + r, iw = (int)(pq % d.Q) * d.stride_w - d.pad_w + k;
        col[t] = ih >= 0 && ih < d.H && iw >= 0 && iw < d.W
                     ? x[((s * d.C + c) * d.H + ih) * (size_t)d.W + iw] : 0.0f;
    }
}

/* y (g, K, PQ) of the group = yg (K, g*PQ) + bias, relu. */
__global__ void k_conv_out(float *y, const float *yg, const float *bias, int K, size_t PQ, int g, int relu) {
    const size_t ld = (size_t)g * PQ, n = (size_t)K * ld;
    DT_CU_FOR(t, n) {   /* t indexes y: (s, k, pq) */
        size_t s = t / ((size_t)K * PQ), k = t / PQ % K, pq = t % PQ;
        float v = yg[k * ld + s * PQ + pq] + (bias ? bias[k] : 0.0f);
        y[t] = relu ? (v > 0.0f ? v : 0.0f) : v;
    }
}

/* dyg (K, g*PQ) from dy (g, K, PQ) of the group. */
__global__ void k_conv_gather_dy(float *dyg, const float *dy, int K, size_t PQ, int g) {
    const size_t ld = (size_t)g * PQ, n = (size_t)K * ld;
    DT_CU_FOR(t, n) {
        size_t s = t / ((size_t)K * PQ), k = t / PQ % K, pq = t % PQ;
        dyg[k * ld + s * PQ + pq] = dy[t];
    }
}

/* dx (g, C, H, W) of the group from dcol (CRS, g*PQ): each input element sums the
 * entries that read it in (r, s) order, as the CPU's col2im adds them. */
__global__ void k_col2im(float *dx, const float *col, dt_conv2d_desc d, int g) {
    const size_t PQ = (size_t)d.P * d.Q, ld = (size_t)g * PQ, n = (size_t)g * d.C * d.H * d.W;
    DT_CU_FOR(t, n) {
        int iw = (int)(t % d.W), ih = (int)(t / d.W % d.H), c = (int)(t / ((size_t)d.W * d.H) % d.C);
        size_t s = t / ((size_t)d.W * d.H * d.C);
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
                acc += col[((size_t)(c * d.R + r) * d.S + k) * ld + s * PQ + (size_t)p * d.Q + q];
            }
        }
        dx[t] = acc;
    }
}

__global__ void k_add_into(float *a, const float *b, size_t n) {
    DT_CU_FOR(i, n) a[i] += b[i];
}

dt_status dt_cu_conv2d_forward(const dt_conv2d_desc *d, float *y, const float *x, const float *w,
                               const float *bias, int relu) {
    DT_TRY(conv_check("conv2d_forward", d));
    DT_CU_ARG(y && x && w);
    DT_TRY(dt_cu_enter());
    const int N = d->N, K = d->K, CRS = d->C * d->R * d->S, G = conv_group(d);
    const size_t PQ = (size_t)d->P * d->Q, chw = (size_t)d->C * d->H * d->W;
    float *col = NULL;
    DT_TRY(dt_cu_scratch((void **)&col, sizeof(float) * ((size_t)CRS + K) * G * PQ));
    float *yg = col + (size_t)CRS * G * PQ;
    for (int n0 = 0; n0 < N; n0 += G) {
        int g = N - n0 < G ? N - n0 : G;
        size_t ld = (size_t)g * PQ;
        k_im2col<<<dt_cu_blocks((size_t)CRS * ld), DT_CU_THREADS, 0, dt_cu_stream()>>>(col, x + n0 * chw, *d, g);
        DT_CU_LAUNCH("k_im2col");
        DT_TRY(dt_cu_gemm("conv2d_forward", 0, 0, K, (int)ld, CRS, 1.0f, w, CRS, col, (int)ld, 0.0f, yg, (int)ld));
        k_conv_out<<<dt_cu_blocks((size_t)K * ld), DT_CU_THREADS, 0, dt_cu_stream()>>>(
            y + (size_t)n0 * K * PQ, yg, bias, K, PQ, g, relu);
        DT_CU_LAUNCH("k_conv_out");
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
    const int N = d->N, K = d->K, CRS = d->C * d->R * d->S, G = conv_group(d), ngroups = (N + G - 1) / G;
    const size_t PQ = (size_t)d->P * d->Q, chw = (size_t)d->C * d->H * d->W, wsize = (size_t)K * CRS;
    const size_t npart = dw && ngroups > 1 ? (size_t)ngroups : 0;
    float *col = NULL;
    DT_TRY(dt_cu_scratch((void **)&col, sizeof(float) * (((size_t)CRS + K) * G * PQ + npart * wsize)));
    float *dyg = col + (size_t)CRS * G * PQ, *partial = dyg + (size_t)K * G * PQ;
    for (int gi = 0; gi < ngroups; gi++) {
        int n0 = gi * G, g = N - n0 < G ? N - n0 : G;
        size_t ld = (size_t)g * PQ;
        k_conv_gather_dy<<<dt_cu_blocks((size_t)K * ld), DT_CU_THREADS, 0, dt_cu_stream()>>>(
            dyg, dy + (size_t)n0 * K * PQ, K, PQ, g);
        DT_CU_LAUNCH("k_conv_gather_dy");
        if (dw) {
            k_im2col<<<dt_cu_blocks((size_t)CRS * ld), DT_CU_THREADS, 0, dt_cu_stream()>>>(col, x + n0 * chw, *d, g);
            DT_CU_LAUNCH("k_im2col");
            float *out = npart ? partial + (size_t)gi * wsize : dw;
            DT_TRY(dt_cu_gemm("conv2d_backward", 0, 1, K, CRS, (int)ld, 1.0f, dyg, (int)ld, col, (int)ld, 0.0f, out, CRS));
        }
        if (dx) {
            DT_TRY(dt_cu_gemm("conv2d_backward", 1, 0, CRS, (int)ld, K, 1.0f, w, CRS, dyg, (int)ld, 0.0f, col, (int)ld));
            k_col2im<<<dt_cu_blocks((size_t)g * chw), DT_CU_THREADS, 0, dt_cu_stream()>>>(dx + n0 * chw, col, *d, g);
            DT_CU_LAUNCH("k_col2im");
        }
    }
    if (npart) {
        /* pairwise over groups in index order: the CPU's stride-doubling tree */
        for (int step = 1; step < ngroups; step *= 2)
            for (int gi = 0; gi + step < ngroups; gi += 2 * step) {
                k_add_into<<<dt_cu_blocks(wsize), DT_CU_THREADS, 0, dt_cu_stream()>>>(
                    partial + (size_t)gi * wsize, partial + (size_t)(gi + step) * wsize, wsize);
                DT_CU_LAUNCH("k_add_into");
            }
        DT_CU(cudaMemcpyAsync(dw, partial, sizeof(float) * wsize, cudaMemcpyDeviceToDevice, dt_cu_stream()));
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

/* One thread per channel: the planes in sample order, in double, rounded once. */
__global__ void k_channel_combine(float *o1, float *o2, const double *part, const float *invstd, int N, int C) {
    DT_CU_FOR(c, C) {
        double s1 = 0.0, s2 = 0.0;
        for (int n = 0; n < N; n++) {
            s1 += part[2 * ((size_t)n * C + c)];
            s2 += part[2 * ((size_t)n * C + c) + 1];
        }
        o1[c] = (float)s1;
        if (o2) o2[c] = (float)(invstd ? s2 * invstd[c] : s2);
    }
}

dt_status dt_cu_channel_sums(float *o1, float *o2, const float *a, const float *b, const float *mean,
                             const float *invstd, int N, int C, int HW) {
    size_t planes = (size_t)N * C;
    double *part = NULL;
    DT_TRY(dt_cu_scratch((void **)&part, sizeof(double) * 2 * (planes ? planes : 1)));
    if (planes && HW > 0) DT_TRY(plane_sums(part, NULL, a, b, mean, C, HW, planes));
    k_channel_combine<<<dt_cu_blocks((size_t)C), DT_CU_THREADS, 0, dt_cu_stream()>>>(
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

/* ---- layer norm: one thread per row (statistics, dx) or per column (dgamma, dbeta),
 * the loops of cpu_norm.c ---- */

__global__ void k_ln_forward(float *y, float *mean, float *rstd, const float *x, const float *gamma,
                             const float *beta, int rows, int cols, float eps) {
    DT_CU_FOR(i, rows) {
        const float *xr = x + i * cols;
        float *yr = y + i * cols;
        double s = 0.0;
        for (int j = 0; j < cols; j++) s += xr[j];
        double m = s / cols, v = 0.0;
        for (int j = 0; j < cols; j++) v += ((double)xr[j] - m) * ((double)xr[j] - m);
        float mf = (float)m, r = (float)(1.0 / sqrt(v / cols + eps));
        mean[i] = mf;
        rstd[i] = r;
        for (int j = 0; j < cols; j++) {
            float h = (xr[j] - mf) * r;
            yr[j] = gamma ? h * gamma[j] + (beta ? beta[j] : 0.0f) : h + (beta ? beta[j] : 0.0f);
        }
    }
}

dt_status dt_cu_layernorm_forward(float *y, float *mean, float *rstd, const float *x,
                                  const float *gamma, const float *beta, int rows, int cols, float eps) {
    DT_CU_ARG(rows >= 0 && cols >= 1 && eps >= 0.0f);
    if (rows == 0) return DT_OK;
    DT_CU_ARG(y && mean && rstd && x);
    DT_TRY(dt_cu_enter());
    k_ln_forward<<<dt_cu_blocks((size_t)rows), DT_CU_THREADS, 0, dt_cu_stream()>>>(y, mean, rstd, x, gamma, beta,
                                                                                   rows, cols, eps);
    DT_CU_LAUNCH("k_ln_forward");
    return DT_OK;
}

__global__ void k_ln_backward_dx(float *dx, const float *dy, const float *x, const float *mean, const float *rstd,
                                 const float *gamma, int rows, int cols) {
    DT_CU_FOR(i, rows) {
        const float *g = dy + i * cols, *xr = x + i * cols;
        float *d = dx + i * cols;
        const float m = mean[i], r = rstd[i];
        double a = 0.0, b = 0.0;   /* sums of dxhat and dxhat*xhat over the row */
        for (int j = 0; j < cols; j++) {
            float dh = g[j] * (gamma ? gamma[j] : 1.0f);
            a += dh;
            b += (double)dh * ((xr[j] - m) * r);
        }
        const float ma = (float)(a / cols), mb = (float)(b / cols);
        for (int j = 0; j < cols; j++) {
            float dh = g[j] * (gamma ? gamma[j] : 1.0f);
            d[j] = r * (dh - ma - (xr[j] - m) * r * mb);
        }
    }
}

/* dgamma, dbeta (cols): one thread per column, rows in order, in double. */
__global__ void k_ln_backward_params(float *dgamma, float *dbeta, const float *dy, const float *x,
                                     const float *mean, const float *rstd, int rows, int cols) {
    DT_CU_FOR(j, cols) {
        double ag = 0.0, ab = 0.0;
        for (int i = 0; i < rows; i++) {
            float g = dy[(size_t)i * cols + j], xv = x[(size_t)i * cols + j];
            ag += (double)g * ((xv - mean[i]) * rstd[i]);
            ab += g;
        }
        if (dgamma) dgamma[j] = (float)ag;
        if (dbeta) dbeta[j] = (float)ab;
    }
}

dt_status dt_cu_layernorm_backward(float *dx, float *dgamma, float *dbeta, const float *dy,
                                   const float *x, const float *mean, const float *rstd,
                                   const float *gamma, int rows, int cols) {
    DT_CU_ARG(rows >= 0 && cols >= 1);
    DT_CU_ARG(rows == 0 || (dy && x && mean && rstd));
    DT_TRY(dt_cu_enter());
    if (dx && rows > 0) {
        k_ln_backward_dx<<<dt_cu_blocks((size_t)rows), DT_CU_THREADS, 0, dt_cu_stream()>>>(dx, dy, x, mean, rstd,
                                                                                            gamma, rows, cols);
        DT_CU_LAUNCH("k_ln_backward_dx");
    }
    if (dgamma || dbeta) {
        k_ln_backward_params<<<dt_cu_blocks((size_t)cols), DT_CU_THREADS, 0, dt_cu_stream()>>>(
            dgamma, dbeta, dy, x, mean, rstd, rows, cols);
        DT_CU_LAUNCH("k_ln_backward_params");
    }
    return DT_OK;
}
