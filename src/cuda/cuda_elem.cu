/*
 * cuda_elem.cu: bias, activations, the gated MLP (swiglu), dropout, losses, the accuracy count, the
 * deterministic sum of squares, elementwise arithmetic, casts, fused optimizer steps
 * and the uniform and normal random fills on the GPU.
 *
 * Same semantics as src/cpu/cpu_elem.c and cpu_vec.c, formula for formula: the
 * optimizer scalars are computed on the host exactly as the CPU does, the casts and
 * the Philox generator (rng.h, compiled for the device) are the same code, so those
 * kernels match the CPU bit for bit (with --fmad=false). The activations are generated
 * from ops_elem.h's list and scalar functions, the CPU's own. Transcendentals (expf,
 * erff, tanhf, log) are CUDA's and may differ from glibc's in the last bit or two.
 *
 * Reductions (bias gradients, losses, sums) never use atomics and follow the CPU's
 * order (cuda_impl.h): one thread per column, row or 4096-element chunk sums it exactly
 * as cpu_elem.c / cpu_vec.c do, and the partials are combined by dt_cu_pairwise, the
 * CPU's pairwise tree. So the sums are the CPU's bit for bit.
 */
#include "cuda_impl.h"

#include <math.h>
#include <string.h>

extern "C" {
#include "rng.h"
#include "dtype.h"   /* the f16/bf16 conversions of the cast kernels */
}

#define LAUNCH(kernel, n, ...) do { \
    kernel<<<dt_cu_blocks(n), DT_CU_THREADS, 0, dt_cu_stream()>>>(__VA_ARGS__); \
    DT_CU_LAUNCH(#kernel); \
} while (0)

/* ---- bias ---- */

__global__ void __launch_bounds__(DT_CU_THREADS) k_bias_add(float *y, const float *b, int cols, size_t n, int relu) {
    DT_CU_FOR(i, n) {
        float v = y[i] + b[i % cols];
        y[i] = relu ? (v > 0.0f ? v : 0.0f) : v;
    }
}

dt_status dt_cu_bias_add(float *y, const float *b, int rows, int cols) {
    DT_CU_ARG(rows >= 0 && cols >= 0);
    size_t n = (size_t)rows * cols;
    if (n == 0) return DT_OK;
    DT_CU_ARG(y && b);
    DT_TRY(dt_cu_enter());
    LAUNCH(k_bias_add, n, y, b, cols, n, 0);
    return DT_OK;
}

dt_status dt_cu_bias_relu(float *y, const float *b, int rows, int cols) {
    DT_CU_ARG(rows >= 0 && cols >= 0);
    size_t n = (size_t)rows * cols;
    if (n == 0) return DT_OK;
    DT_CU_ARG(y && b);
    DT_TRY(dt_cu_enter());
    LAUNCH(k_bias_add, n, y, b, cols, n, 1);
    return DT_OK;
}

/* Column sums, pass 1 (cuda_impl.h's order): work item (slab, column tile) sums rows
 * [slab*DT_CU_SLAB, +DT_CU_SLAB) of 4*blockDim.x columns, each thread four adjacent
 * columns (one float4 load per row when vec), rows in order, in float:
 *   ps (slabs, cols) = sum dy;  px (slabs, cols) = sum dy * (x - mean[i]) * rstd[i] (x != NULL).
 * Work items are spread over the blocks by a block-stride loop, so the grid's size
 * changes no sum. */
__global__ void __launch_bounds__(DT_CU_THREADS)
k_colsum_slabs(float *ps, float *px, const float *dy, const float *x, const float *mean, const float *rstd,
               int rows, int cols, int vec) {
    const int tile = 4 * DT_CU_THREADS, tiles = (cols + tile - 1) / tile, slabs = (rows + DT_CU_SLAB - 1) / DT_CU_SLAB;
    for (int w = blockIdx.x; w < tiles * slabs; w += gridDim.x) {
        const int slab = w / tiles, g = (w % tiles) * DT_CU_THREADS + threadIdx.x;   /* column group */
        if (4 * g >= cols) continue;
        const int i1 = rows - slab * DT_CU_SLAB < DT_CU_SLAB ? rows : (slab + 1) * DT_CU_SLAB;
        float a[4] = {0.0f, 0.0f, 0.0f, 0.0f}, b[4] = {0.0f, 0.0f, 0.0f, 0.0f}, gv[4], xv[4];
        int n = 0;
        for (int i = slab * DT_CU_SLAB; i < i1; i++) {
            n = dt_cu_load4(gv, dy + (size_t)i * cols, g, cols, vec);
            for (int k = 0; k < n; k++) a[k] += gv[k];
            if (x) {
                dt_cu_load4(xv, x + (size_t)i * cols, g, cols, vec);
                const float m = mean ? mean[i] : 0.0f, r = rstd[i];   /* no mean: RMS norm's */
                for (int k = 0; k < n; k++) b[k] += gv[k] * ((xv[k] - m) * r);
            }
        }
        dt_cu_store4(ps + (size_t)slab * cols, g, a, n, vec);
        if (x) dt_cu_store4(px + (size_t)slab * cols, g, b, n, vec);
    }
}

/* Pass 2: a block per tile of 32 columns (a block-stride loop over the tiles), thread
 * (column c, group q) adds the slab partials s = q, q + COLSUM_GROUPS, ... of its column
 * in slab order, in double; the COLSUM_GROUPS group sums meet in a fixed tree (q and
 * q + 4, then q + 2, then q + 1), rounded once: os (cols) / ox (cols). A warp reads 32
 * adjacent columns of one slab. */
#define COLSUM_GROUPS (DT_CU_THREADS / 32)
__global__ void __launch_bounds__(DT_CU_THREADS)
k_colsum_final(float *os, float *ox, const float *ps, const float *px, int cols, int slabs) {
    __shared__ double sa[COLSUM_GROUPS][32], sb[COLSUM_GROUPS][32];
    const int c = threadIdx.x % 32, q = threadIdx.x / 32, tiles = (cols + 31) / 32;
    for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
        const int j = 32 * t + c;
        double a = 0.0, b = 0.0;
        if (j < cols)
            for (int s = q; s < slabs; s += COLSUM_GROUPS) {
                a += ps[(size_t)s * cols + j];
                if (ox) b += px[(size_t)s * cols + j];
            }
        sa[q][c] = a;
        sb[q][c] = b;
        __syncthreads();
        for (int h = COLSUM_GROUPS / 2; h > 0; h >>= 1) {
            if (q < h) {
                sa[q][c] += sa[q + h][c];
                sb[q][c] += sb[q + h][c];
            }
            __syncthreads();
        }
        if (q == 0 && j < cols) {
            if (os) os[j] = (float)sa[0][c];
            if (ox) ox[j] = (float)sb[0][c];
        }
        __syncthreads();   /* the next tile writes sa, sb */
    }
}

dt_status dt_cu_column_sums(float *osum, float *oxhat, const float *dy, const float *x, const float *mean,
                            const float *rstd, int rows, int cols) {
    const int slabs = rows > 0 ? (rows + DT_CU_SLAB - 1) / DT_CU_SLAB : 0;
    float *part = NULL;
    DT_TRY(dt_cu_scratch((void **)&part, sizeof(float) * 2 * ((size_t)slabs * cols + 4)));
    float *px = part + (((size_t)slabs * cols + 3) & ~(size_t)3);   /* 16-byte aligned, as part */
    const int vec = dt_cu_vec4(dy, cols) && dt_cu_vec4(x, cols);
    if (slabs > 0) {
        const unsigned tiles = (unsigned)((cols + 4 * DT_CU_THREADS - 1) / (4 * DT_CU_THREADS));
        k_colsum_slabs<<<dt_cu_grid((size_t)tiles * slabs, 1), DT_CU_THREADS, 0, dt_cu_stream()>>>(
            part, px, dy, x, mean, rstd, rows, cols, vec);
        DT_CU_LAUNCH("k_colsum_slabs");
    }
    k_colsum_final<<<dt_cu_grid((size_t)cols, 32), DT_CU_THREADS, 0, dt_cu_stream()>>>(osum, oxhat, part, px, cols,
                                                                                       slabs);
    DT_CU_LAUNCH("k_colsum_final");
    return DT_OK;
}

dt_status dt_cu_bias_grad(float *db, const float *dy, int rows, int cols) {
    DT_CU_ARG(rows >= 0 && cols >= 0);
    if (cols == 0) return DT_OK;
    DT_CU_ARG(db && (rows == 0 || dy));
    DT_TRY(dt_cu_enter());
    return dt_cu_column_sums(db, NULL, dy, NULL, NULL, NULL, rows, cols);
}

/* ---- activations: a grid-stride kernel and its launcher for each direction of each row
 * of DT_OPS_ELEM, over the scalar functions of ops_elem.h (the CPU's expressions) ---- */

#define ELEM_KERNELS_(X_, name, saved, tol) \
__global__ void __launch_bounds__(DT_CU_THREADS) k_##name##_forward(float *y, const float *x, size_t n) { \
    DT_CU_FOR(i, n) y[i] = dt_##name##_fwd(x[i]); \
} \
__global__ void __launch_bounds__(DT_CU_THREADS) \
k_##name##_backward(float *dx, const float *dy, const float *s, size_t n) { \
    DT_CU_FOR(i, n) dx[i] = dt_##name##_bwd(dy[i], s[i]); \
} \
dt_status dt_cu_##name##_forward(float *y, const float *x, size_t n) { \
    if (n == 0) return DT_OK; \
    DT_CU_ARG(y && x); \
    DT_TRY(dt_cu_enter()); \
    LAUNCH(k_##name##_forward, n, y, x, n); \
    return DT_OK; \
} \
dt_status dt_cu_##name##_backward(float *dx, const float *dy, const float *saved, size_t n) { \
    if (n == 0) return DT_OK; \
    DT_CU_ARG(dx && dy && saved); \
    DT_TRY(dt_cu_enter()); \
    LAUNCH(k_##name##_backward, n, dx, dy, saved, n); \
    return DT_OK; \
}
DT_OPS_ELEM(ELEM_KERNELS_, _)
#undef ELEM_KERNELS_

/* ---- the gated MLP: one thread per (row, j), silu's scalar functions (the CPU's
 * expressions) ---- */

__global__ void __launch_bounds__(DT_CU_THREADS) k_swiglu_forward(float *h, const float *gu, int hid, size_t n) {
    DT_CU_FOR(e, n) {
        const size_t i = e / hid, j = e % hid;
        const float *g = gu + i * 2 * hid;
        h[e] = dt_silu_fwd(g[j]) * g[hid + j];
    }
}

__global__ void __launch_bounds__(DT_CU_THREADS)
k_swiglu_backward(float *dgu, const float *dh, const float *gu, int hid, size_t n) {
    DT_CU_FOR(e, n) {
        const size_t i = e / hid, j = e % hid, o = i * 2 * hid + j;
        const float gj = gu[o], uj = gu[o + hid], dj = dh[e];
        dgu[o] = dt_silu_bwd(dj * uj, gj);
        dgu[o + hid] = dj * dt_silu_fwd(gj);
    }
}

dt_status dt_cu_swiglu_forward(float *h, const float *gu, int rows, int hid) {
    DT_CU_ARG(rows >= 0 && hid >= 1);
    if (rows == 0) return DT_OK;
    DT_CU_ARG(h && gu);
    DT_TRY(dt_cu_enter());
    const size_t n = (size_t)rows * hid;
    LAUNCH(k_swiglu_forward, n, h, gu, hid, n);
    return DT_OK;
}

dt_status dt_cu_swiglu_backward(float *dgu, const float *dh, const float *gu, int rows, int hid) {
    DT_CU_ARG(rows >= 0 && hid >= 1);
    if (rows == 0) return DT_OK;
    DT_CU_ARG(dgu && dh && gu);
    DT_TRY(dt_cu_enter());
    const size_t n = (size_t)rows * hid;
    LAUNCH(k_swiglu_backward, n, dgu, dh, gu, hid, n);
    return DT_OK;
}

/* ---- dropout: thread t owns elements 4t..4t+3 of a row: one Philox block, as the CPU ---- */

__global__ void __launch_bounds__(DT_CU_THREADS)
k_dropout(float *y, const float *x, int rows, int cols, float p, float scale,
          dt_philox_key key, uint32_t stream, uint32_t epoch, uint64_t sample0) {
    const size_t groups = (size_t)(cols + 3) / 4, n = (size_t)rows * groups;
    DT_CU_FOR(t, n) {
        size_t i = t / groups;
        int j0 = (int)(t % groups) * 4;
        uint64_t sample = sample0 + i;
        dt_philox_ctr c = {{(uint32_t)((uint64_t)j0 >> 2), (uint32_t)sample, epoch, stream}};
        dt_philox_ctr r = dt_philox4x32_10(c, key);
        int w = cols - j0 < 4 ? cols - j0 : 4;
        const float *xr = x + i * cols;
        float *yr = y + i * cols;
        for (int k = 0; k < w; k++) yr[j0 + k] = dt_u32_to_unit(r.v[k]) >= p ? xr[j0 + k] * scale : 0.0f;
    }
}

static dt_status dropout_apply(const char *fn, float *y, const float *x, int rows, int cols, float p,
                               uint64_t seed, uint32_t stream, uint32_t epoch, uint64_t sample0) {
    if (rows < 0 || cols < 0) return dt_error(DT_ERR_INVALID, "cuda %s: negative shape (%d, %d)", fn, rows, cols);
    if (!(p >= 0.0f && p < 1.0f)) return dt_error(DT_ERR_INVALID, "cuda %s: drop probability %g is not in [0, 1)", fn, (double)p);
    size_t n = (size_t)rows * cols;
    if (n == 0) return DT_OK;
    if (!y || !x) return dt_error(DT_ERR_INVALID, "cuda %s: NULL pointer", fn);
    DT_TRY(dt_cu_enter());
    if (p == 0.0f) {
        if (y != x) DT_CU(cudaMemcpyAsync(y, x, n * sizeof(float), cudaMemcpyDeviceToDevice, dt_cu_stream()));
        return DT_OK;
    }
    const float scale = 1.0f / (1.0f - p);
    size_t groups = (size_t)rows * ((cols + 3) / 4);
    LAUNCH(k_dropout, groups, y, x, rows, cols, p, scale, dt_philox_seed(seed), stream, epoch, sample0);
    return DT_OK;
}

dt_status dt_cu_dropout_forward(float *y, const float *x, int rows, int cols, float p,
                                uint64_t seed, uint32_t stream, uint32_t epoch, uint64_t sample0) {
    return dropout_apply("dropout_forward", y, x, rows, cols, p, seed, stream, epoch, sample0);
}

dt_status dt_cu_dropout_backward(float *dx, const float *dy, int rows, int cols, float p,
                                 uint64_t seed, uint32_t stream, uint32_t epoch, uint64_t sample0) {
    return dropout_apply("dropout_backward", dx, dy, rows, cols, p, seed, stream, epoch, sample0);
}

/* ---- losses ---- */

/* (m, s) = (m, s) merged with (m2, s2): running maxima and sums of exp(x - m) of two
 * parts of a row (s = 0: an empty part). Symmetric to the bit, so both lanes of a
 * butterfly pair get the same result. */
static __device__ inline void softmax_merge(float *m, float *s, float m2, float s2) {
    if (s2 == 0.0f) return;
    if (*s == 0.0f) { *m = m2; *s = s2; return; }
    const float mx = fmaxf(*m, m2);
    *s = *s * expf(*m - mx) + s2 * expf(m2 - mx);
    *m = mx;
}

/* One warp per row (cuda_impl.h's row order): each lane keeps the running maximum and
 * sum of exp over its elements (one pass over the logits), the lanes merge in the
 * butterfly, then probs = exp(x - max) / sum; rowloss[i] (double) = lse - ((1 - ls) x[l]
 * + ls / C sum x), as the CPU's formula. A label >= C is flagged for the next
 * synchronisation. */
__global__ void __launch_bounds__(DT_CU_THREADS)
k_xent_forward(double *rowloss, float *probs, const float *logits, const int32_t *labels, int B, int C, double ls,
               int vec, int *err) {
    const int lane = threadIdx.x % 32;
    for (int i = blockIdx.x * DT_CU_WARPS + threadIdx.x / 32; i < B; i += gridDim.x * DT_CU_WARPS) {
        const float *x = logits + (size_t)i * C;
        float *p = probs ? probs + (size_t)i * C : NULL;   /* may be x: each lane reads its groups first */
        float m = -INFINITY, s = 0.0f, sx = 0.0f, v[4];
        const int32_t l = labels[i];
        const float xl = lane == 0 && l >= 0 && l < C ? x[l] : 0.0f;   /* before probs may overwrite it */
        for (int g = lane; 4 * g < C; g += 32) {
            const int n = dt_cu_load4(v, x, g, C, vec);
            for (int k = 0; k < n; k++) {
                sx += v[k];
                if (v[k] > m) { s = s * expf(m - v[k]) + 1.0f; m = v[k]; }
                else s += expf(v[k] - m);
            }
        }
        for (int o = 16; o > 0; o >>= 1) {
            const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
            softmax_merge(&m, &s, m2, s2);
        }
        sx = dt_cu_warp_sum(sx);
        const float inv = (float)(1.0 / s);
        for (int g = lane; p && 4 * g < C; g += 32) {
            const int n = dt_cu_load4(v, x, g, C, vec);
            for (int k = 0; k < n; k++) v[k] = expf(v[k] - m) * inv;
            dt_cu_store4(p, g, v, n, vec);
        }
        if (lane == 0) {
            if (l >= C) {
                err[DT_CU_ERR_XENT_FWD] = i + 1;
                rowloss[i] = 0.0;
            } else if (l < 0) {
                rowloss[i] = 0.0;
            } else {
                const double lse = m + log((double)s);
                rowloss[i] = lse - ((1.0 - ls) * xl + ls / C * sx);
            }
        }
    }
}

dt_status dt_cu_xent_forward(float *loss, float *probs, const float *logits, const int32_t *labels,
                             int B, int C, float label_smoothing, float norm) {
    DT_CU_ARG(B >= 0 && C >= 1);
    DT_CU_ARG(loss && (B == 0 || (logits && labels)));
    DT_CU_ARG(label_smoothing >= 0.0f && label_smoothing <= 1.0f);
    DT_CU_ARG(norm > 0.0f);
    DT_TRY(dt_cu_enter());
    double *rows = NULL;
    DT_TRY(dt_cu_scratch((void **)&rows, sizeof(double) * 2 * (B > 0 ? B : 1)));
    if (B > 0) {
        const int vec = dt_cu_vec4(logits, C) && (!probs || dt_cu_vec4(probs, C));
        k_xent_forward<<<dt_cu_grid((size_t)B, DT_CU_WARPS), DT_CU_THREADS, 0, dt_cu_stream()>>>(
            rows, probs, logits, labels, B, C, (double)label_smoothing, vec, dt_cu_err_flags());
        DT_CU_LAUNCH("k_xent_forward");
    }
    return dt_cu_pairwise(rows, rows + (B > 0 ? B : 1), (size_t)B, (double)norm, loss);
}

/* A warp per row, 32-bit column indices: d = (p - off) * inv, and (p - off - on) * inv at
 * the label (the CPU's formulas); 0 for an ignored row. In place over probs is fine: each
 * element is read before it is written, by the same thread. */
__global__ void __launch_bounds__(DT_CU_THREADS)
k_xent_backward(float *d, const float *probs, const int32_t *labels, int B, int C, float inv, float off, float on,
                int vec, int *err) {
    const int lane = threadIdx.x % 32;
    for (int i = blockIdx.x * DT_CU_WARPS + threadIdx.x / 32; i < B; i += gridDim.x * DT_CU_WARPS) {
        const int32_t l = labels[i];
        if (l >= C && lane == 0) err[DT_CU_ERR_XENT_BWD] = i + 1;
        const int skip = l < 0 || l >= C;
        const float *p = probs + (size_t)i * C;
        float *o = d + (size_t)i * C, v[4];
        for (int g = lane; 4 * g < C; g += 32) {
            const int n = dt_cu_load4(v, p, g, C, vec);
            for (int k = 0; k < n; k++)
                v[k] = skip ? 0.0f : 4 * g + k == l ? (v[k] - off - on) * inv : (v[k] - off) * inv;
            dt_cu_store4(o, g, v, n, vec);
        }
    }
}

dt_status dt_cu_xent_backward(float *dlogits, const float *probs, const int32_t *labels,
                              int B, int C, float label_smoothing, float norm) {
    DT_CU_ARG(B >= 0 && C >= 1);
    DT_CU_ARG(B == 0 || (dlogits && probs && labels));
    DT_CU_ARG(label_smoothing >= 0.0f && label_smoothing <= 1.0f);
    DT_CU_ARG(norm > 0.0f);
    if (B == 0) return DT_OK;
    DT_TRY(dt_cu_enter());
    const float inv = 1.0f / norm, off = label_smoothing / C, on = 1.0f - label_smoothing;
    const int vec = dt_cu_vec4(dlogits, C) && dt_cu_vec4(probs, C);
    k_xent_backward<<<dt_cu_grid((size_t)B, DT_CU_WARPS), DT_CU_THREADS, 0, dt_cu_stream()>>>(
        dlogits, probs, labels, B, C, inv, off, on, vec, dt_cu_err_flags());
    DT_CU_LAUNCH("k_xent_backward");
    return DT_OK;
}

/* ---- fixed-chunk sums: sum of squares (squares = 1), squared differences (0) ---- */

/* Sum of squares of each 4096-element chunk, as cpu_vec.c's chunk_sumsq: 8 double
 * accumulators, accumulator k taking the elements i = k mod 8 in
 * order, combined ((a0+a1)+(a2+a3))+((a4+a5)+(a6+a7)). Here 8 threads per chunk, thread
 * k owning accumulator k (so a warp reads contiguous memory), and the combination in
 * shared memory in that tree. Launched with DT_CU_THREADS threads per block. */
__global__ void k_chunk_sumsq(double *part, const float *x, size_t n, size_t nch) {
    __shared__ double sh[DT_CU_THREADS];
    const int tid = threadIdx.x, k = tid & 7;
    const size_t ch = ((size_t)blockIdx.x * DT_CU_THREADS + tid) >> 3;
    double a = 0.0;
    if (ch < nch) {
        size_t i1 = (ch + 1) * DT_CU_CHUNK < n ? (ch + 1) * DT_CU_CHUNK : n;
        for (size_t i = ch * DT_CU_CHUNK + k; i < i1; i += 8) a += (double)x[i] * x[i];
    }
    sh[tid] = a;
    __syncthreads();
    if (k % 2 == 0) sh[tid] += sh[tid + 1];
    __syncthreads();
    if (k % 4 == 0) sh[tid] += sh[tid + 2];
    __syncthreads();
    if (k == 0 && ch < nch) part[ch] = sh[tid] + sh[tid + 4];
}

/* Squared differences of each chunk: one thread, one accumulator, in order (cpu_elem.c). */
__global__ void k_chunk_sqdiff(double *part, const float *x, const float *y, size_t n, size_t nch) {
    DT_CU_FOR(ch, nch) {
        size_t i = ch * DT_CU_CHUNK, i1 = i + DT_CU_CHUNK < n ? i + DT_CU_CHUNK : n;
        double a = 0.0;
        for (; i < i1; i++) {
            double d = (double)x[i] - y[i];
            a += d * d;
        }
        part[ch] = a;
    }
}

static dt_status chunk_total(float *out, const float *x, const float *y, size_t n, int squares, double divisor) {
    size_t nch = (n + DT_CU_CHUNK - 1) / DT_CU_CHUNK;
    double *part = NULL;
    DT_TRY(dt_cu_scratch((void **)&part, sizeof(double) * 2 * (nch > 0 ? nch : 1)));
    if (nch > 0) {
        if (!squares) {
            LAUNCH(k_chunk_sqdiff, nch, part, x, y, n, nch);
        } else {
            k_chunk_sumsq<<<(unsigned)((nch * 8 + DT_CU_THREADS - 1) / DT_CU_THREADS), DT_CU_THREADS, 0, dt_cu_stream()>>>(
                part, x, n, nch);
            DT_CU_LAUNCH("k_chunk_sumsq");
        }
    }
    return dt_cu_pairwise(part, part + (nch > 0 ? nch : 1), nch, divisor, out);
}

dt_status dt_cu_mse_forward(float *loss, const float *pred, const float *target, size_t n, float norm) {
    DT_CU_ARG(loss && (n == 0 || (pred && target)));
    DT_CU_ARG(norm > 0.0f);
    DT_TRY(dt_cu_enter());
    return chunk_total(loss, pred, target, n, 0, (double)norm);
}

__global__ void __launch_bounds__(DT_CU_THREADS)
k_mse_backward(float *d, const float *p, const float *t, size_t n, float k) {
    DT_CU_FOR(i, n) d[i] = k * (p[i] - t[i]);
}

dt_status dt_cu_mse_backward(float *dpred, const float *pred, const float *target, size_t n, float norm) {
    if (n == 0) return DT_OK;
    DT_CU_ARG(dpred && pred && target);
    DT_CU_ARG(norm > 0.0f);
    DT_TRY(dt_cu_enter());
    LAUNCH(k_mse_backward, n, dpred, pred, target, n, 2.0f / norm);
    return DT_OK;
}

dt_status dt_cu_sumsq_chunks(double *part, const float *x, size_t n) {
    if (n == 0) return DT_OK;
    DT_CU_ARG(part && x);
    DT_TRY(dt_cu_enter());
    size_t nch = (n + DT_CU_CHUNK - 1) / DT_CU_CHUNK;
    k_chunk_sumsq<<<(unsigned)((nch * 8 + DT_CU_THREADS - 1) / DT_CU_THREADS), DT_CU_THREADS, 0, dt_cu_stream()>>>(
        part, x, n, nch);
    DT_CU_LAUNCH("k_chunk_sumsq");
    return DT_OK;
}

/* One block: the host's pairwise sum (dt_cu_block_pairwise), then thread 0 finishes as
 * the host does (shard.c): the same bits. */
__global__ void __launch_bounds__(DT_CU_THREADS)
k_step_checks(float *out, double *a, double *b, size_t n, const float *losses, size_t k, float max_norm, float unscale) {
    const double sq = dt_cu_block_pairwise(a, b, n);
    if (threadIdx.x != 0) return;
    const float norm = dt_clip_norm(sq, unscale);
    int finite = isfinite(norm);
    for (size_t i = 0; i < k; i++) finite &= isfinite(losses[i]) != 0;
    out[0] = norm;
    out[1] = dt_clip_coef(max_norm, norm);
    out[2] = finite ? 1.0f : 0.0f;
}

dt_status dt_cu_step_checks(float *out, double *parts, double *scratch, size_t nch, const float *losses, size_t k,
                           float max_norm, float unscale) {
    DT_CU_ARG(out && (nch == 0 || (parts && scratch)) && (k == 0 || losses));
    DT_TRY(dt_cu_enter());
    k_step_checks<<<1, DT_CU_THREADS, 0, dt_cu_stream()>>>(out, parts, scratch, nch, losses, k, max_norm, unscale);
    DT_CU_LAUNCH("k_step_checks");
    return DT_OK;
}

__global__ void __launch_bounds__(DT_CU_THREADS) k_clip_scale(float *x, const float *checks, size_t n) {
    const float c = checks[1];
    if (!(c < 1.0f)) return;
    DT_CU_FOR(i, n) x[i] *= c;
}

dt_status dt_cu_clip_scale(float *x, const float *checks, size_t n) {
    if (n == 0) return DT_OK;
    DT_CU_ARG(x && checks);
    DT_TRY(dt_cu_enter());
    LAUNCH(k_clip_scale, n, x, checks, n);
    return DT_OK;
}

dt_status dt_cu_sumsq(float *out, const float *x, size_t n) {
    DT_CU_ARG(out && (n == 0 || x));
    DT_TRY(dt_cu_enter());
    return chunk_total(out, x, NULL, n, 1, 1.0);
}

/* ---- metrics: the CPU's rule, first maximum wins and a NaN beats any number ---- */

/* Whether candidate (v, i) wins over (bv, bi) under the CPU's rule over a whole row
 * (the first NaN, else the first maximum): NaN beats a number, two NaNs or two equal
 * numbers go to the smaller index, else the larger number. Symmetric, so the lanes of a
 * butterfly pair agree, and associative, so any grouping gives the serial loop's answer. */
static __device__ inline int argmax_wins(float v, int i, float bv, int bi) {
    const int n = isnan(v), bn = isnan(bv);
    if (n != bn) return n;
    if (n || v == bv) return i < bi;
    return v > bv;
}

/* Pass 1: one warp per row (cuda_impl.h's row order); lane l scans its groups of four
 * in index order, the lanes meet in the butterfly; hit[i] = 1 when row i's argmax is
 * its label (a negative label: ignored, 0). */
__global__ void __launch_bounds__(DT_CU_THREADS)
k_row_hits(int32_t *hit, const float *logits, const int32_t *labels, int B, int C, int vec) {
    const int lane = threadIdx.x % 32;
    for (int i = blockIdx.x * DT_CU_WARPS + threadIdx.x / 32; i < B; i += gridDim.x * DT_CU_WARPS) {
        const float *x = logits + (size_t)i * C;
        float bv = -INFINITY, v[4];
        int bi = 0x7fffffff;
        for (int g = lane; 4 * g < C; g += 32) {
            const int n = dt_cu_load4(v, x, g, C, vec);
            for (int k = 0; k < n; k++)
                if (argmax_wins(v[k], 4 * g + k, bv, bi)) { bv = v[k]; bi = 4 * g + k; }
        }
        for (int o = 16; o > 0; o >>= 1) {
            const float v2 = __shfl_xor_sync(0xffffffffu, bv, o);
            const int i2 = __shfl_xor_sync(0xffffffffu, bi, o);
            if (argmax_wins(v2, i2, bv, bi)) { bv = v2; bi = i2; }
        }
        if (lane == 0) hit[i] = labels[i] >= 0 && bi == labels[i];
    }
}

/* Sum of one value per thread over a block of DT_CU_RED_THREADS threads: a fixed
 * binary tree in shared memory `sh`. Every thread of the block must call it. */
static __device__ double block_sum(double v, double *sh) {
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int s = DT_CU_RED_THREADS / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) sh[threadIdx.x] += sh[threadIdx.x + s];
        __syncthreads();
    }
    return sh[0];
}

/* Pass 2, one block: thread t adds hits t, t+256, ...; the counts meet in a fixed tree
 * (integers, so any order is exact; the tree keeps the no-atomics rule anyway). */
__global__ void __launch_bounds__(DT_CU_RED_THREADS)
k_count_hits(int32_t *correct, const int32_t *hit, int B) {
    __shared__ double sh[DT_CU_RED_THREADS];
    double n = 0.0;
    for (int i = threadIdx.x; i < B; i += DT_CU_RED_THREADS) n += hit[i];
    n = block_sum(n, sh);
    if (threadIdx.x == 0) *correct = (int32_t)n;
}

dt_status dt_cu_count_correct(int32_t *correct, const float *logits, const int32_t *labels, int B, int C) {
    DT_CU_ARG(B >= 0 && C >= 1);
    DT_CU_ARG(correct && (B == 0 || (logits && labels)));
    DT_TRY(dt_cu_enter());
    int32_t *hit = NULL;
    DT_TRY(dt_cu_scratch((void **)&hit, sizeof(int32_t) * (B > 0 ? B : 1)));
    if (B > 0) {
        k_row_hits<<<dt_cu_grid((size_t)B, DT_CU_WARPS), DT_CU_THREADS, 0, dt_cu_stream()>>>(
            hit, logits, labels, B, C, dt_cu_vec4(logits, C));
        DT_CU_LAUNCH("k_row_hits");
    }
    k_count_hits<<<1, DT_CU_RED_THREADS, 0, dt_cu_stream()>>>(correct, hit, B);
    DT_CU_LAUNCH("k_count_hits");
    return DT_OK;
}

/* ---- elementwise ---- */

enum { EW_FILL, EW_SCALE, EW_ADD };

__global__ void __launch_bounds__(DT_CU_THREADS)
k_elementwise(int kind, float *z, const float *x, const float *y, float alpha, size_t n) {
    DT_CU_FOR(i, n) {
        switch (kind) {
        case EW_FILL:  z[i] = alpha; break;
        case EW_SCALE: z[i] *= alpha; break;
        default:       z[i] = x[i] + y[i]; break;
        }
    }
}

static dt_status elementwise(const char *fn, int kind, float *z, const float *x, const float *y, float alpha, size_t n) {
    if (n == 0) return DT_OK;
    if (!z || (kind == EW_ADD && (!x || !y))) return dt_error(DT_ERR_INVALID, "cuda %s: NULL pointer", fn);
    DT_TRY(dt_cu_enter());
    LAUNCH(k_elementwise, n, kind, z, x, y, alpha, n);
    return DT_OK;
}

dt_status dt_cu_fill(float *x, float value, size_t n) { return elementwise("fill", EW_FILL, x, NULL, NULL, value, n); }
dt_status dt_cu_scale(float *x, float alpha, size_t n) { return elementwise("scale", EW_SCALE, x, NULL, NULL, alpha, n); }
dt_status dt_cu_add(float *z, const float *x, const float *y, size_t n) { return elementwise("add", EW_ADD, z, x, y, 0.0f, n); }

/* ---- casts: the conversions of dtype.h, the CPU's very code (round to nearest even, NaN quiet, f16 overflow to inf) ---- */

enum { CAST_TO_BF16, CAST_FROM_BF16, CAST_TO_F16, CAST_FROM_F16 };

__global__ void __launch_bounds__(DT_CU_THREADS) k_cast(int kind, void *dst, const void *src, size_t n) {
    DT_CU_FOR(i, n) {
        switch (kind) {
        case CAST_TO_BF16:   ((uint16_t *)dst)[i] = dt_f32_to_bf16(((const float *)src)[i]); break;
        case CAST_FROM_BF16: ((float *)dst)[i] = dt_bf16_to_f32(((const uint16_t *)src)[i]); break;
        case CAST_TO_F16:    ((uint16_t *)dst)[i] = dt_f32_to_f16(((const float *)src)[i]); break;
        default:             ((float *)dst)[i] = dt_f16_to_f32(((const uint16_t *)src)[i]); break;
        }
    }
}

static dt_status cast(const char *fn, int kind, void *dst, const void *src, size_t n) {
    if (n == 0) return DT_OK;
    if (!dst || !src) return dt_error(DT_ERR_INVALID, "cuda %s: NULL pointer", fn);
    DT_TRY(dt_cu_enter());
    LAUNCH(k_cast, n, kind, dst, src, n);
    return DT_OK;
}

dt_status dt_cu_f32_to_bf16(uint16_t *d, const float *s, size_t n) { return cast("f32_to_bf16", CAST_TO_BF16, d, s, n); }
dt_status dt_cu_bf16_to_f32(float *d, const uint16_t *s, size_t n) { return cast("bf16_to_f32", CAST_FROM_BF16, d, s, n); }
dt_status dt_cu_f32_to_f16(uint16_t *d, const float *s, size_t n) { return cast("f32_to_f16", CAST_TO_F16, d, s, n); }
dt_status dt_cu_f16_to_f32(float *d, const uint16_t *s, size_t n) { return cast("f16_to_f32", CAST_FROM_F16, d, s, n); }

/* ---- optimizers: scalars prepared on the host exactly as cpu_vec.c does ---- */

__global__ void __launch_bounds__(DT_CU_THREADS)
k_sgd(float *p, const float *grad, float *buf, size_t n, float lr, float mom, float damp1,
      float wd, float gs, int first, int nest, const float *gate) {
    if (gate && *gate == 0.0f) return;   /* the step's checks said no (step_checks) */
    DT_CU_FOR(i, n) {
        float g = gs * grad[i];
        if (wd != 0.0f) g += wd * p[i];
        if (mom != 0.0f) {
            float b = first ? g : mom * buf[i] + damp1 * g;
            buf[i] = b;
            g = nest ? g + mom * b : b;
        }
        p[i] -= lr * g;
    }
}

dt_status dt_cu_sgd_update(float *p, const float *grad, float *buf, size_t n, const dt_sgd_args *a) {
    DT_CU_ARG(a);
    if (n == 0) return DT_OK;
    DT_CU_ARG(p && grad && (a->momentum == 0.0f || buf));
    DT_CU_ARG(a->lr >= 0.0 && a->momentum >= 0.0 && a->weight_decay >= 0.0);
    DT_CU_ARG(!a->nesterov || (a->momentum > 0.0 && a->dampening == 0.0));
    DT_TRY(dt_cu_enter());
    LAUNCH(k_sgd, n, p, grad, buf, n, (float)a->lr, (float)a->momentum, (float)(1.0 - a->dampening),
           (float)a->weight_decay, (float)a->grad_scale, a->first_step, a->nesterov, a->gate);
    return DT_OK;
}

__global__ void __launch_bounds__(DT_CU_THREADS)
k_adamw(float *p, const float *grad, float *m, float *v, size_t n, dt_adamw_f k, const float *gate) {
    if (gate && *gate == 0.0f) return;
    DT_CU_FOR(i, n) dt_adamw_elem(p + i, m + i, v + i, grad[i], k);
}

dt_status dt_cu_adamw_update(float *p, const float *grad, float *m, float *v, size_t n, const dt_adamw_args *a) {
    DT_CU_ARG(a);
    if (n == 0) return DT_OK;
    DT_CU_ARG(p && grad && m && v);
    DT_CU_ARG(a->step >= 1);
    DT_CU_ARG(a->lr >= 0.0 && a->eps >= 0.0 && a->weight_decay >= 0.0);
    DT_CU_ARG(a->beta1 >= 0.0 && a->beta1 < 1.0 && a->beta2 >= 0.0 && a->beta2 < 1.0);
    DT_TRY(dt_cu_enter());
    LAUNCH(k_adamw, n, p, grad, m, v, n, dt_adamw_floats(a), a->gate);
    return DT_OK;
}

/* ---- random fills: the uniform at position `index` of a stream is word 0 of Philox
 * block (index, stream), as rng.c's dt_rng_unit ---- */

static __device__ float rng_unit(dt_philox_key key, uint64_t stream, uint64_t index) {
    dt_philox_ctr c = {{(uint32_t)index, (uint32_t)(index >> 32), (uint32_t)stream, (uint32_t)(stream >> 32)}};
    return dt_u32_to_unit(dt_philox4x32_10(c, key).v[0]);
}

__global__ void __launch_bounds__(DT_CU_THREADS)
k_rng_uniform(float *x, size_t n, float a, float b, dt_philox_key key, uint64_t stream, uint64_t offset) {
    DT_CU_FOR(i, n) x[i] = a + b * rng_unit(key, stream, offset + i);
}

/* Box-Muller in double, cpu_vec.c's expression (CUDA's log and cos may differ from
 * glibc's in the last bit of a double, so rarely in the float). */
__global__ void __launch_bounds__(DT_CU_THREADS)
k_rng_normal(float *x, size_t n, double mean, double std, dt_philox_key key, uint64_t stream,
             uint64_t offset) {
    DT_CU_FOR(i, n) {
        double u = rng_unit(key, stream, 2 * (offset + i)), w = rng_unit(key, stream, 2 * (offset + i) + 1);
        x[i] = (float)(mean + std * sqrt(-2.0 * log(1.0 - u)) * cos(6.283185307179586 * w));
    }
}

dt_status dt_cu_rng_uniform(float *x, size_t n, float lo, float hi, uint64_t seed, uint64_t stream, uint64_t offset) {
    if (n == 0) return DT_OK;
    DT_CU_ARG(x);
    DT_CU_ARG(lo <= hi);
    DT_TRY(dt_cu_enter());
    LAUNCH(k_rng_uniform, n, x, n, lo, hi - lo, dt_philox_seed(seed), stream, offset);
    return DT_OK;
}

dt_status dt_cu_rng_normal(float *x, size_t n, float mean, float std, uint64_t seed, uint64_t stream, uint64_t offset) {
    if (n == 0) return DT_OK;
    DT_CU_ARG(x);
    DT_CU_ARG(std >= 0.0f);
    DT_TRY(dt_cu_enter());
    LAUNCH(k_rng_normal, n, x, n, (double)mean, (double)std, dt_philox_seed(seed), stream, offset);
    return DT_OK;
}
