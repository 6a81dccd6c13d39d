/*
 * cuda_seq.cu: the sequence kernels of transformers on the GPU — embeddings, learned
 * positions, rotary positions and fused causal attention (multi-head or grouped-query);
 * the semantics of src/cpu/cpu_seq.c.
 *
 * Embeddings and positions move data, or sum in the CPU's order, so they match it bit
 * for bit. The embedding gradient has one writer per element of dW: block (column
 * block, vocabulary range) walks the tokens in index order and adds the rows whose id
 * falls in its range, so each dW[v][c] is the CPU's sum, in the CPU's order, and the
 * ranges only spread the work (their number does not change a bit). An id that is not
 * an integer in [0, V) is reported at the next synchronisation (cuda_impl.h), as the
 * CPU reports it at once.
 *
 * Attention is FlashAttention's scheme on CUDA cores in FP32, with no T x T buffer:
 *   forward:  block (b*H + h, query tile of TILE rows); the key/value tiles 0 .. the
 *             diagonal stream through shared memory; each query row keeps its running
 *             maximum, sum and output (D / SUB floats per thread, in registers);
 *             lse (B, H, T) is saved for backward.
 *   backward: delta (B, H, T) = rowsum(dy * y) first; then block (b*K + kh, key tile)
 *             computes dK, dV of its keys over the query heads of key/value head kh
 *             in order and their query tiles from the diagonal to T - 1 in order, and
 *             block (b*H + h, query tile) computes dQ over the key tiles up to the
 *             diagonal in order, both recomputing the probabilities
 *             from lse. Every output row has one writer and every sum a fixed order:
 *             no atomics, and two runs give the same bits.
 * The sums run in another order than the CPU's (tiles, fused multiply-adds), so the
 * results agree to rounding (TC_GEMM in tests/ops_cases.h). The shared tiles are sized
 * by a compile-time bound DMAX on the head width D: 32, 64, 128 and 256 are built, and
 * a wider head gives DT_ERR_UNSUPPORTED (as FlashAttention's 256). attn_decode (one
 * query row, for sampling) has no such bound: a block per head, scores in chunks of
 * ROW_THREADS keys.
 */
#include "cuda_impl.h"

#include <math.h>

/* id as an index, or -1 when it is not an integer in [0, V) (cpu_seq.c's token()) */
static __device__ int token(float id, int V) {
    if (!(id >= 0.0f) || id >= (float)V || id != (float)(int)id) return -1;
    return (int)id;
}

/* ---- embeddings ---- */

__global__ void __launch_bounds__(DT_CU_THREADS)
k_embedding_forward(float *y, const float *ids, const float *W, int n, int C, int V, int *err) {
    DT_CU_FOR(e, (size_t)n * C) {
        size_t i = e / C, c = e % C;
        int v = token(ids[i], V);
        if (v < 0 && c == 0) err[DT_CU_ERR_EMBED_FWD] = (int)i + 1;
        y[e] = v < 0 ? 0.0f : W[(size_t)v * C + c];
    }
}

dt_status dt_cu_embedding_forward(float *y, const float *ids, const float *W, int n, int C, int V) {
    DT_CU_ARG(n >= 0 && C >= 1 && V >= 1);
    if (n == 0) return DT_OK;
    DT_CU_ARG(y && ids && W);
    DT_TRY(dt_cu_enter());
    k_embedding_forward<<<dt_cu_blocks((size_t)n * C), DT_CU_THREADS, 0, dt_cu_stream()>>>(y, ids, W, n, C, V,
                                                                                         dt_cu_err_flags());
    DT_CU_LAUNCH("k_embedding_forward");
    return DT_OK;
}

#define EMB_THREADS 128     /* columns per block */
#define EMB_IDS 1024        /* token ids staged in shared memory at a time */
#define EMB_TARGET 65536    /* threads to aim for: column blocks x vocabulary ranges */

/* Block (x: columns x*EMB_THREADS.., y: vocabulary rows [y*range, (y+1)*range)): the
 * thread of column c adds dy[i][c] into dW[id_i][c] for every token i whose id is in
 * the range, in index order. */
__global__ void __launch_bounds__(EMB_THREADS)
k_embedding_backward(float *dW, const float *ids, const float *dy, int n, int C, int V, int range, int *err) {
    __shared__ int tok[EMB_IDS];
    const int c = blockIdx.x * EMB_THREADS + threadIdx.x, v0 = blockIdx.y * range;
    const unsigned span = (unsigned)(V - v0 < range ? V - v0 : range);
    for (int i0 = 0; i0 < n; i0 += EMB_IDS) {
        const int m = n - i0 < EMB_IDS ? n - i0 : EMB_IDS;
        __syncthreads();   /* the previous ids are consumed */
        for (int k = threadIdx.x; k < m; k += EMB_THREADS) {
            int v = token(ids[i0 + k], V);
            if (v < 0 && blockIdx.x == 0 && blockIdx.y == 0) err[DT_CU_ERR_EMBED_BWD] = i0 + k + 1;
            tok[k] = v;   /* -1 (a bad id) is in no range */
        }
        __syncthreads();
        if (c >= C) continue;
        for (int k = 0; k < m; k++) {
            const int v = tok[k];
            if ((unsigned)(v - v0) < span) dW[(size_t)v * C + c] += dy[(size_t)(i0 + k) * C + c];
        }
    }
}

dt_status dt_cu_embedding_backward(float *dW, const float *ids, const float *dy, int n, int C, int V, int accumulate) {
    DT_CU_ARG(n >= 0 && C >= 1 && V >= 1 && dW);
    DT_CU_ARG(n == 0 || (ids && dy));
    DT_TRY(dt_cu_enter());
    if (!accumulate) DT_CU(cudaMemsetAsync(dW, 0, (size_t)V * C * sizeof(float), dt_cu_stream()));
    if (n == 0) return DT_OK;
    const int colblocks = (C + EMB_THREADS - 1) / EMB_THREADS;
    int ranges = (EMB_TARGET / EMB_THREADS + colblocks - 1) / colblocks;
    if (ranges > V) ranges = V;
    if (ranges > 65535) ranges = 65535;
    const int range = (V + ranges - 1) / ranges;
    dim3 grid(colblocks, (V + range - 1) / range);
    k_embedding_backward<<<grid, EMB_THREADS, 0, dt_cu_stream()>>>(dW, ids, dy, n, C, V, range, dt_cu_err_flags());
    DT_CU_LAUNCH("k_embedding_backward");
    return DT_OK;
}

/* ---- learned positions ---- */

/* y (B, T, C) = x + P[t]: element e of y reads P at e mod (T*C). */
__global__ void __launch_bounds__(DT_CU_THREADS)
k_pos_forward(float *y, const float *x, const float *P, size_t n, size_t tc) {
    DT_CU_FOR(e, n) y[e] = x[e] + P[e % tc];
}

dt_status dt_cu_pos_forward(float *y, const float *x, const float *P, int B, int T, int C) {
    DT_CU_ARG(B >= 0 && T >= 1 && C >= 1);
    if (B == 0) return DT_OK;
    DT_CU_ARG(y && x && P);
    DT_TRY(dt_cu_enter());
    const size_t tc = (size_t)T * C, n = (size_t)B * tc;
    k_pos_forward<<<dt_cu_blocks(n), DT_CU_THREADS, 0, dt_cu_stream()>>>(y, x, P, n, tc);
    DT_CU_LAUNCH("k_pos_forward");
    return DT_OK;
}

/* One thread per element of dP (T, C): the batch in order, from 0, as the CPU. */
__global__ void __launch_bounds__(DT_CU_THREADS) k_pos_backward(float *dP, const float *dy, int B, size_t tc) {
    DT_CU_FOR(e, tc) {
        float acc = 0.0f;
        for (int b = 0; b < B; b++) acc += dy[(size_t)b * tc + e];
        dP[e] = acc;
    }
}

dt_status dt_cu_pos_backward(float *dP, const float *dy, int B, int T, int C) {
    DT_CU_ARG(B >= 0 && T >= 1 && C >= 1 && dP);
    DT_CU_ARG(B == 0 || dy);
    DT_TRY(dt_cu_enter());
    const size_t tc = (size_t)T * C;
    k_pos_backward<<<dt_cu_blocks(tc), DT_CU_THREADS, 0, dt_cu_stream()>>>(dP, dy, B, tc);
    DT_CU_LAUNCH("k_pos_backward");
    return DT_OK;
}

/* ---- attention: tiles ---- */

#define SUB 4            /* threads per row of a tile; thread (row, sub) owns columns sub, sub+SUB, ... */
#define ATTN_DMAX 256    /* the widest head built */

/* What the attention kernels read and write; query head h of batch b is block row
 * b*H + h (key/value head kh of batch b is block row b*K + kh in the dK, dV kernel).
 *   qkv (B, T, (H + 2K) D), y and dy (B, T, C), lse and delta (B, H, T),
 *   dqkv (B, T, (H + 2K) D); C = H D. */
typedef struct {
    float       *y, *lse, *dqkv;   /* lse: written by forward, read by backward */
    float       *delta;            /* backward: rowsum(dy * y) per (b, h, t) */
    const float *qkv, *dy;
    int          T, H, K, D;
    float        scale;            /* 1 / sqrt(D) */
} attn_args;

/* Where query head h of batch b finds its columns. */
struct attn_head {
    int          b, h, kh, C;
    size_t       ld;      /* row stride of qkv and dqkv: (H + 2K) D */
    const float *q;       /* q of (b, h) at position 0, row stride ld */
    size_t       ko, vo;  /* k and v of its key/value head kh = h / (H/K): q - h*D + ko, + vo */
    const float *g;       /* dy of (b, h) at position 0, row stride C */
    size_t       row0;    /* b*T: the first row of the batch in (B, T, .) arrays */
    size_t       bh;      /* b*H + h: the row of lse and delta (times T) */
};

static __device__ attn_head attn_locate(const attn_args &a, int b, int h) {
    attn_head w;
    w.b = b;
    w.h = h;
    w.kh = h / (a.H / a.K);
    w.bh = (size_t)b * a.H + h;
    w.C = a.H * a.D;
    w.ld = (size_t)(a.H + 2 * a.K) * a.D;
    w.row0 = (size_t)w.b * a.T;
    w.q = a.qkv + w.row0 * w.ld + (size_t)w.h * a.D;
    w.ko = (size_t)w.C + (size_t)w.kh * a.D;
    w.vo = (size_t)w.C + (size_t)(a.K + w.kh) * a.D;
    w.g = a.dy ? a.dy + w.row0 * w.C + (size_t)w.h * a.D : NULL;
    return w;
}

/* the head's k and v at position 0 */
static __device__ const float *attn_k(const attn_head &w, int D) { return w.q - (size_t)w.h * D + w.ko; }
static __device__ const float *attn_v(const attn_head &w, int D) { return w.q - (size_t)w.h * D + w.vo; }

/* s = rows row0 .. row0+TILE-1 of a (rows, D) slice with row stride ld; zero beyond
 * `rows` and beyond D, so a padding row or column adds nothing. Every thread calls it. */
template <int DMAX, int TILE>
static __device__ void tile_load(float (*s)[DMAX + 1], const float *src, size_t ld, int row0, int rows, int D) {
    for (int e = threadIdx.x; e < TILE * DMAX; e += TILE * SUB) {
        int r = e / DMAX, d = e % DMAX;
        s[r][d] = row0 + r < rows && d < D ? src[(size_t)(row0 + r) * ld + d] : 0.0f;
    }
}

static __device__ float row_dot(const float *a, const float *b, int D) {
    float s = 0.0f;
    for (int d = 0; d < D; d++) s = fmaf(a[d], b[d], s);
    return s;
}

/* Row t of the (T, C) array at `out` (head columns at out), columns sub + SUB*k < D = acc[k] * mul. */
template <int DMAX>
static __device__ void row_store(float *out, const float *acc, float mul, int sub, int D) {
#pragma unroll
    for (int k = 0; k < DMAX / SUB; k++)
        if (sub + SUB * k < D) out[sub + SUB * k] = acc[k] * mul;
}

/* Forward. Block (b*H + h, query tile), thread (query row r, sub); tiles with the most
 * keys are launched first. */
template <int DMAX, int TILE>
__global__ void __launch_bounds__(TILE * SUB) k_attn_forward(attn_args a) {
    __shared__ float Qs[TILE][DMAX + 1], Ks[TILE][DMAX + 1], Vs[TILE][DMAX + 1];
    __shared__ float Ss[TILE][TILE + 1], Ps[TILE][TILE + 1];
    const attn_head w = attn_locate(a, (int)(blockIdx.x / a.H), (int)(blockIdx.x % a.H));
    const int r = threadIdx.x / SUB, sub = threadIdx.x % SUB;
    const int q0 = (gridDim.y - 1 - blockIdx.y) * TILE, t = q0 + r;
    const int tq = t < a.T ? t : a.T - 1;              /* a padding row attends as the last one; never stored */
    const int kend = q0 + TILE < a.T ? q0 + TILE : a.T; /* keys 0 .. kend-1 */
    tile_load<DMAX, TILE>(Qs, w.q, w.ld, q0, a.T, a.D);
    float o[DMAX / SUB], m = -INFINITY, l = 0.0f;
#pragma unroll
    for (int k = 0; k < DMAX / SUB; k++) o[k] = 0.0f;
    for (int k0 = 0; k0 < kend; k0 += TILE) {
        __syncthreads();   /* the previous tile is consumed */
        tile_load<DMAX, TILE>(Ks, attn_k(w, a.D), w.ld, k0, a.T, a.D);
        tile_load<DMAX, TILE>(Vs, attn_v(w, a.D), w.ld, k0, a.T, a.D);
        __syncthreads();
        for (int i = 0; i < TILE / SUB; i++) {
            const int c = sub + SUB * i;
            Ss[r][c] = k0 + c <= tq ? row_dot(Qs[r], Ks[c], a.D) * a.scale : -INFINITY;
        }
        __syncthreads();
        float mx = m;   /* finite from the first tile on: key 0 is always visible */
        for (int c = 0; c < TILE; c++) mx = fmaxf(mx, Ss[r][c]);
        for (int i = 0; i < TILE / SUB; i++) {
            const int c = sub + SUB * i;
            Ps[r][c] = expf(Ss[r][c] - mx);
        }
        __syncthreads();
        const float alpha = expf(m - mx);
        float rs = 0.0f;
#pragma unroll
        for (int k = 0; k < DMAX / SUB; k++) o[k] *= alpha;
        for (int c = 0; c < TILE; c++) {
            const float p = Ps[r][c];
            rs += p;
#pragma unroll
            for (int k = 0; k < DMAX / SUB; k++) o[k] = fmaf(p, Vs[c][sub + SUB * k], o[k]);
        }
        l = l * alpha + rs;
        m = mx;
    }
    if (t < a.T) {
        row_store<DMAX>(a.y + (w.row0 + t) * w.C + (size_t)w.h * a.D, o, 1.0f / l, sub, a.D);
        if (sub == 0) a.lse[w.bh * a.T + t] = m + logf(l);
    }
}

/* delta (B, H, T) = rowsum(dy * y) of each head's row: one warp per row (rows in
 * (b, h, t) order), in the row sums' order of cuda_impl.h (lane l takes the groups of
 * four l, l + 32, ... in order, the lanes meet in the butterfly). A warp reads the
 * head's D adjacent floats at once, where a thread per row read one float per row. */
__global__ void __launch_bounds__(DT_CU_THREADS)
k_attn_delta(float *delta, const float *dy, const float *y, size_t n, int T, int H, int D, int vec) {
    const size_t C = (size_t)H * D;
    const int lane = threadIdx.x % 32;
    for (size_t e = blockIdx.x * (size_t)DT_CU_WARPS + threadIdx.x / 32; e < n; e += (size_t)gridDim.x * DT_CU_WARPS) {
        const size_t bh = e / T, t = e % T, off = (bh / H * T + t) * C + bh % H * D;
        float s = 0.0f, gv[4], yv[4];
        for (int g = lane; 4 * g < D; g += 32) {
            const int k = dt_cu_load4(gv, dy + off, g, D, vec);
            dt_cu_load4(yv, y + off, g, D, vec);
            for (int i = 0; i < k; i++) s += gv[i] * yv[i];
        }
        s = dt_cu_warp_sum(s);
        if (lane == 0) delta[e] = s;
    }
}

/* dK, dV. Block (b*K + kh, key tile), thread (key row r, sub): the query heads of the
 * key/value head kh in order, and for each the query tiles from the diagonal to the end,
 * in order. */
template <int DMAX, int TILE>
__global__ void __launch_bounds__(TILE * SUB) k_attn_dkv(attn_args a) {
    __shared__ float Ks[TILE][DMAX + 1], Vs[TILE][DMAX + 1], Qs[TILE][DMAX + 1], Gs[TILE][DMAX + 1];
    __shared__ float Ps[TILE][TILE + 1], Ds[TILE][TILE + 1], Ls[TILE], Es[TILE];
    const int b = (int)(blockIdx.x / a.K), kh = (int)(blockIdx.x % a.K), rep = a.H / a.K;
    const int r = threadIdx.x / SUB, sub = threadIdx.x % SUB;
    const int k0 = blockIdx.y * TILE, j = k0 + r;
    const attn_head w0 = attn_locate(a, b, kh * rep);
    tile_load<DMAX, TILE>(Ks, attn_k(w0, a.D), w0.ld, k0, a.T, a.D);
    tile_load<DMAX, TILE>(Vs, attn_v(w0, a.D), w0.ld, k0, a.T, a.D);
    float dk[DMAX / SUB], dv[DMAX / SUB];
#pragma unroll
    for (int k = 0; k < DMAX / SUB; k++) dk[k] = dv[k] = 0.0f;
    for (int h = kh * rep; h < (kh + 1) * rep; h++) {
        const attn_head w = attn_locate(a, b, h);
        const float *L = a.lse + w.bh * a.T, *E = a.delta + w.bh * a.T;
        for (int q0 = k0; q0 < a.T; q0 += TILE) {
            __syncthreads();
            tile_load<DMAX, TILE>(Qs, w.q, w.ld, q0, a.T, a.D);
            tile_load<DMAX, TILE>(Gs, w.g, w.C, q0, a.T, a.D);
            if ((int)threadIdx.x < TILE) {
                const int t = q0 + threadIdx.x;
                Ls[threadIdx.x] = t < a.T ? L[t] : 0.0f;
                Es[threadIdx.x] = t < a.T ? E[t] : 0.0f;
            }
            __syncthreads();
            for (int i = 0; i < TILE / SUB; i++) {
                const int c = sub + SUB * i, t = q0 + c;
                float p = 0.0f, ds = 0.0f;
                if (t < a.T && j <= t) {
                    p = expf(row_dot(Qs[c], Ks[r], a.D) * a.scale - Ls[c]);
                    ds = p * (row_dot(Gs[c], Vs[r], a.D) - Es[c]) * a.scale;
                }
                Ps[c][r] = p;
                Ds[c][r] = ds;
            }
            __syncthreads();
            for (int c = 0; c < TILE; c++) {
                const float p = Ps[c][r], ds = Ds[c][r];
#pragma unroll
                for (int k = 0; k < DMAX / SUB; k++) {
                    dv[k] = fmaf(p, Gs[c][sub + SUB * k], dv[k]);
                    dk[k] = fmaf(ds, Qs[c][sub + SUB * k], dk[k]);
                }
            }
        }
    }
    if (j < a.T) {
        float *out = a.dqkv + (w0.row0 + j) * w0.ld;
        row_store<DMAX>(out + w0.ko, dk, 1.0f, sub, a.D);
        row_store<DMAX>(out + w0.vo, dv, 1.0f, sub, a.D);
    }
}

/* dQ. Block (b*H + h, query tile), thread (query row r, sub): the key tiles up to the
 * diagonal, in order; tiles with the most keys first. */
template <int DMAX, int TILE>
__global__ void __launch_bounds__(TILE * SUB) k_attn_dq(attn_args a) {
    __shared__ float Qs[TILE][DMAX + 1], Gs[TILE][DMAX + 1], Ks[TILE][DMAX + 1], Vs[TILE][DMAX + 1];
    __shared__ float Ds[TILE][TILE + 1];
    const attn_head w = attn_locate(a, (int)(blockIdx.x / a.H), (int)(blockIdx.x % a.H));
    const int r = threadIdx.x / SUB, sub = threadIdx.x % SUB;
    const int q0 = (gridDim.y - 1 - blockIdx.y) * TILE, t = q0 + r;
    const int kend = q0 + TILE < a.T ? q0 + TILE : a.T;
    const float Lt = t < a.T ? a.lse[w.bh * a.T + t] : 0.0f, Et = t < a.T ? a.delta[w.bh * a.T + t] : 0.0f;
    tile_load<DMAX, TILE>(Qs, w.q, w.ld, q0, a.T, a.D);
    tile_load<DMAX, TILE>(Gs, w.g, w.C, q0, a.T, a.D);
    float dq[DMAX / SUB];
#pragma unroll
    for (int k = 0; k < DMAX / SUB; k++) dq[k] = 0.0f;
    for (int k0 = 0; k0 < kend; k0 += TILE) {
        __syncthreads();
        tile_load<DMAX, TILE>(Ks, attn_k(w, a.D), w.ld, k0, a.T, a.D);
        tile_load<DMAX, TILE>(Vs, attn_v(w, a.D), w.ld, k0, a.T, a.D);
        __syncthreads();
        for (int i = 0; i < TILE / SUB; i++) {
            const int c = sub + SUB * i;
            float ds = 0.0f;
            if (t < a.T && k0 + c <= t) {
                const float p = expf(row_dot(Qs[r], Ks[c], a.D) * a.scale - Lt);
                ds = p * (row_dot(Gs[r], Vs[c], a.D) - Et) * a.scale;
            }
            Ds[r][c] = ds;
        }
        __syncthreads();
        for (int c = 0; c < TILE; c++) {
            const float ds = Ds[r][c];
#pragma unroll
            for (int k = 0; k < DMAX / SUB; k++) dq[k] = fmaf(ds, Ks[c][sub + SUB * k], dq[k]);
        }
    }
    if (t < a.T) row_store<DMAX>(a.dqkv + (w.row0 + t) * w.ld + (size_t)w.h * a.D, dq, 1.0f, sub, a.D);
}

/* Launch forward (backward = 0) or the two backward kernels for heads of width <= DMAX,
 * with TILE rows per tile (shared memory stays under 48 KiB). */
template <int DMAX, int TILE>
static dt_status attn_launch(const attn_args &a, int B, int backward) {
    static_assert(TILE % SUB == 0 && DMAX % SUB == 0, "tiles split into SUB-thread rows");
    dim3 grid((unsigned)(B * a.H), (unsigned)((a.T + TILE - 1) / TILE));
    dim3 kv_grid((unsigned)(B * a.K), grid.y);
    if (!backward) {
        k_attn_forward<DMAX, TILE><<<grid, TILE * SUB, 0, dt_cu_stream()>>>(a);
        DT_CU_LAUNCH("k_attn_forward");
        return DT_OK;
    }
    k_attn_dkv<DMAX, TILE><<<kv_grid, TILE * SUB, 0, dt_cu_stream()>>>(a);
    DT_CU_LAUNCH("k_attn_dkv");
    k_attn_dq<DMAX, TILE><<<grid, TILE * SUB, 0, dt_cu_stream()>>>(a);
    DT_CU_LAUNCH("k_attn_dq");
    return DT_OK;
}

/* The narrowest build that holds D (checked <= ATTN_DMAX by the caller). */
static dt_status attn_dispatch(const attn_args &a, int B, int backward) {
    if (a.D <= 32) return attn_launch<32, 32>(a, B, backward);
    if (a.D <= 64) return attn_launch<64, 32>(a, B, backward);
    if (a.D <= 128) return attn_launch<128, 16>(a, B, backward);
    return attn_launch<ATTN_DMAX, 8>(a, B, backward);
}

/* The shape checks of both directions; fn names the op. */
static dt_status attn_check(const char *fn, int B, int T, int H, int K, int D) {
    if (D > ATTN_DMAX)
        return dt_error(DT_ERR_UNSUPPORTED, "cuda %s: head width D = %d is above the %d this backend supports",
                        fn, D, ATTN_DMAX);
    if ((int64_t)B * H > INT32_MAX || (int64_t)(H + 2 * K) * D > INT32_MAX || (T + 7) / 8 > 65535)
        return dt_error(DT_ERR_INVALID, "cuda %s: shape B=%d T=%d H=%d D=%d is too large", fn, B, T, H, D);
    return DT_OK;
}

/* ---- attention through cuBLAS: the scores as T x T matrices ----
 * From ATTN_GEMM_T positions on, the products are cuBLAS's strided batched GEMMs over the
 * heads of one sequence at a time (one call per query head of each key/value head's
 * group: every call takes one head of each group, with a stride). Forward: S = scale
 * Q K^T (the whole T x T, the masked half too), a warp per row of S saves lse and turns
 * the row into P = exp(S - lse), zero past the diagonal, then Y = P V. Backward: S again
 * (the same call, so the same bits and the same P), dP = dY V^T, a warp per row makes P
 * and dS = scale P (dP - delta) in place, then dV = P^T dY, dQ = dS K and dK = dS^T Q; a
 * key/value head's dK and dV sum its query heads in order (beta 1 after the first).
 * TF32 tensor cores when the math mode allows them (--allow-tf32), SGEMM otherwise; in
 * low precision (--precision bf16|fp16) the products of two 16-bit operands (S = Q K^T,
 * dP = dY V^T: q, k, v and dy hold rounded values) on 16-bit tensor cores with f32 sums,
 * exact products as the CPU's (gemm_lp's contract), while P and dS stay f32 as the
 * softmax does (their products TF32 or SGEMM, as above).
 * Scratch: 2 H T^2 floats (one sequence); above ATTN_GEMM_BYTES the tiled kernels above
 * run instead. Which path runs depends on the shape alone, never on anything else, so a
 * configuration's bits stay the same run to run; the two paths agree to rounding. */
#define ATTN_GEMM_T 256
#define ATTN_GEMM_BYTES ((size_t)1 << 30)

static int attn_gemm_path(int T, int H) {
    return T >= ATTN_GEMM_T && 2 * (size_t)H * T * T * sizeof(float) <= ATTN_GEMM_BYTES;
}

/* The rows of S (rows (h, i) of one sequence, T floats each; key j <= i visible):
 * forward (lse written): lse = log sum exp of the row's visible scores; both directions:
 * the row becomes P = exp(S - lse), 0 past the diagonal. With dS (holding dP): dS =
 * scale P (dP - delta), 0 past the diagonal. A warp per row: the lanes' sums in their
 * order, then the butterfly, so the bits never depend on the grid. */
__global__ void __launch_bounds__(DT_CU_THREADS)
k_attn_rows(float *S, float *dS, float *lse, const float *delta, int rows, int T, float scale, int fwd) {
    const int lane = threadIdx.x % 32;
    for (int e = blockIdx.x * DT_CU_WARPS + threadIdx.x / 32; e < rows; e += gridDim.x * DT_CU_WARPS) {
        const int n = e % T + 1;
        float *s = S + (size_t)e * T, l;
        if (fwd) {
            float m = -INFINITY, z = 0.0f;
            for (int j = lane; j < n; j += 32) m = fmaxf(m, s[j]);
            for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
            for (int j = lane; j < n; j += 32) z += expf(s[j] - m);
            l = m + logf(dt_cu_warp_sum(z));
            if (lane == 0) lse[e] = l;
        } else {
            l = lse[e];
        }
        float *ds = dS ? dS + (size_t)e * T : NULL;
        const float dl = ds ? delta[e] : 0.0f;
        for (int j = lane; j < T; j += 32) {
            const float p = j < n ? expf(s[j] - l) : 0.0f;
            s[j] = p;
            if (ds) ds[j] = j < n ? scale * p * (ds[j] - dl) : 0.0f;
        }
    }
}

static dt_status attn_rows(float *S, float *dS, float *lse, const float *delta, int H, int T, float scale, int fwd) {
    const size_t rows = (size_t)H * T;
    k_attn_rows<<<dt_cu_grid(rows, DT_CU_WARPS), DT_CU_THREADS, 0, dt_cu_stream()>>>(S, dS, lse, delta, (int)rows, T,
                                                                                      scale, fwd);
    DT_CU_LAUNCH("k_attn_rows");
    return DT_OK;
}

/* S (H, T, T) = scale Q K^T of sequence q (its qkv rows), or with g (its dy rows, row
 * stride H D) dP = dY V^T: one batched call per query head of each group. In low
 * precision (dtype DT_BF16, DT_F16) both operands hold 16-bit values: tensor cores. */
static dt_status attn_scores(const char *fn, int dtype, float *S, const float *q, const float *g, int T, int H, int K,
                             int D) {
    const int rep = H / K, ld = (H + 2 * K) * D;
    const long long TT = (long long)T * T;
    const float *a = g ? g : q, *kv = q + (size_t)H * D + (g ? (size_t)K * D : 0);
    const int lda = g ? H * D : ld;
    for (int r = 0; r < rep; r++)
        DT_TRY(dt_cu_gemm_batched(fn, dtype, 0, 1, T, T, D, g ? 1.0f : 1.0f / sqrtf((float)D), a + (size_t)r * D, lda,
                                  (long long)rep * D, kv, ld, D, 0.0f, S + r * TT, T, rep * TT, K));
    return DT_OK;
}

/* out_h (T, D) = M_h (T, T) X (T, D) for every query head h, M = S (H, T, T) (transposed
 * when trans) and X the head's key/value columns (by_kv: x + kh D, row stride ldx) or
 * its own (x + h D); out the head's columns (out + h D, or out + kh D summing the group's
 * heads in order when to_kv), row stride ldo. */
static dt_status attn_apply(const char *fn, int trans, const float *S, const float *x, int ldx, int by_kv, float *out,
                            int ldo, int to_kv, int T, int H, int K, int D) {
    const int rep = H / K;
    const long long TT = (long long)T * T;
    for (int r = 0; r < rep; r++)
        DT_TRY(dt_cu_gemm_batched(fn, DT_F32, trans, 0, T, D, T, 1.0f, S + r * TT, T, rep * TT,
                                  by_kv ? x : x + (size_t)r * D, ldx, by_kv ? D : (long long)rep * D,
                                  to_kv && r ? 1.0f : 0.0f, to_kv ? out : out + (size_t)r * D, ldo,
                                  to_kv ? D : (long long)rep * D, K));
    return DT_OK;
}

static dt_status attn_gemm_forward(float *y, float *lse, const float *qkv, int B, int T, int H, int K, int D,
                                   int dtype) {
    const int C = H * D, ld = (H + 2 * K) * D;
    float *S;
    DT_TRY(dt_cu_scratch((void **)&S, sizeof(float) * (size_t)H * T * T));
    for (int b = 0; b < B; b++) {
        const float *q = qkv + (size_t)b * T * ld;
        DT_TRY(attn_scores("attn_forward", dtype, S, q, NULL, T, H, K, D));
        DT_TRY(attn_rows(S, NULL, lse + (size_t)b * H * T, NULL, H, T, 0.0f, 1));
        DT_TRY(attn_apply("attn_forward", 0, S, q + (size_t)(H + K) * D, ld, 1, y + (size_t)b * T * C, C, 0, T, H, K, D));
    }
    return DT_OK;
}

/* S and dS: 2 H T^2 floats of scratch after delta's */
static dt_status attn_gemm_backward(float *dqkv, const float *dy, const float *qkv, const float *lse,
                                    const float *delta, float *S, int B, int T, int H, int K, int D, int dtype) {
    const int C = H * D, ld = (H + 2 * K) * D;
    float *dS = S + (size_t)H * T * T;
    for (int b = 0; b < B; b++) {
        const float *q = qkv + (size_t)b * T * ld, *g = dy + (size_t)b * T * C;
        float *dq = dqkv + (size_t)b * T * ld;
        const size_t bh = (size_t)b * H * T;
        DT_TRY(attn_scores("attn_backward", dtype, S, q, NULL, T, H, K, D));
        DT_TRY(attn_scores("attn_backward", dtype, dS, q, g, T, H, K, D));
        DT_TRY(attn_rows(S, dS, (float *)lse + bh, delta + bh, H, T, 1.0f / sqrtf((float)D), 0));
        DT_TRY(attn_apply("attn_backward", 1, S, g, C, 0, dq + (size_t)(H + K) * D, ld, 1, T, H, K, D));   /* dV */
        DT_TRY(attn_apply("attn_backward", 0, dS, q + C, ld, 1, dq, ld, 0, T, H, K, D));                   /* dQ */
        DT_TRY(attn_apply("attn_backward", 1, dS, q, ld, 0, dq + C, ld, 1, T, H, K, D));                   /* dK */
    }
    return DT_OK;
}

dt_status dt_cu_attn_forward(float *y, float *lse, const float *qkv, int B, int T, int H, int K, int D, int dtype) {
    DT_CU_ARG(B >= 0 && T >= 1 && H >= 1 && K >= 1 && H % K == 0 && D >= 1);
    DT_CU_ARG(dtype == DT_F32 || dtype == DT_BF16 || dtype == DT_F16);
    if (B == 0) return DT_OK;
    DT_CU_ARG(y && lse && qkv);
    DT_TRY(attn_check("attn_forward", B, T, H, K, D));
    DT_TRY(dt_cu_enter());
    if (attn_gemm_path(T, H)) return attn_gemm_forward(y, lse, qkv, B, T, H, K, D, dtype);
    attn_args a = {y, lse, NULL, NULL, qkv, NULL, T, H, K, D, 1.0f / sqrtf((float)D)};
    return attn_dispatch(a, B, 0);
}

dt_status dt_cu_attn_backward(float *dqkv, const float *dy, const float *qkv, const float *y, const float *lse,
                              int B, int T, int H, int K, int D, int dtype) {
    DT_CU_ARG(B >= 0 && T >= 1 && H >= 1 && K >= 1 && H % K == 0 && D >= 1);
    DT_CU_ARG(dtype == DT_F32 || dtype == DT_BF16 || dtype == DT_F16);
    if (B == 0) return DT_OK;
    DT_CU_ARG(dqkv && dy && qkv && y && lse);
    DT_TRY(attn_check("attn_backward", B, T, H, K, D));
    DT_TRY(dt_cu_enter());
    float *delta = NULL;
    const size_t rows = (size_t)B * H * T, rows64 = (rows + 63) / 64 * 64;   /* S after it, 256-byte aligned */
    const int gemm = attn_gemm_path(T, H);
    DT_TRY(dt_cu_scratch((void **)&delta, sizeof(float) * (rows64 + (gemm ? 2 * (size_t)H * T * T : 0))));
    const int vec = dt_cu_vec4(dy, H * D) && dt_cu_vec4(y, H * D) && D % 4 == 0;   /* every row 16-byte aligned */
    k_attn_delta<<<dt_cu_grid(rows, DT_CU_WARPS), DT_CU_THREADS, 0, dt_cu_stream()>>>(delta, dy, y, rows, T, H, D, vec);
    DT_CU_LAUNCH("k_attn_delta");
    if (gemm) return attn_gemm_backward(dqkv, dy, qkv, lse, delta, delta + rows64, B, T, H, K, D, dtype);
    attn_args a = {NULL, (float *)lse, dqkv, delta, qkv, dy, T, H, K, D, 1.0f / sqrtf((float)D)};
    return attn_dispatch(a, B, 1);
}

/* ---- attention: one decoding position ---- */

#define ROW_THREADS 128

/* (m, l) = (m, l) merged with (m2, l2): the running maximum and the sum of exp(s - m). */
static __device__ void lse_merge(float *m, float *l, float m2, float l2) {
    if (l2 == 0.0f) return;
    if (*l == 0.0f) { *m = m2; *l = l2; return; }
    const float mx = fmaxf(*m, m2);
    *l = *l * expf(*m - mx) + l2 * expf(m2 - mx);
    *m = mx;
}

/* Block h: y (head h's D columns) = softmax(q k^T / sqrt(D)) v over keys 0..t for the
 * query of row t. Pass 1: thread k keeps the running maximum and sum of keys k,
 * k+ROW_THREADS, ..., merged in a fixed tree. Pass 2: chunks of ROW_THREADS keys, their
 * probabilities in shared memory, each column summed by one thread in key order. */
__global__ void __launch_bounds__(ROW_THREADS)
k_attn_decode(float *y, const float *q0, const float *kv, int t, int H, int KV, int D, float scale) {
    __shared__ float ms[ROW_THREADS], ls[ROW_THREADS], ps[ROW_THREADS];
    const int h = blockIdx.x, tid = threadIdx.x, kh = h / (H / KV);
    const size_t ld = (size_t)2 * KV * D;
    const float *q = q0 + (size_t)h * D, *K = kv + (size_t)kh * D;
    const float *V = kv + (size_t)(KV + kh) * D;
    float *yh = y + (size_t)h * D;
    float m = -INFINITY, l = 0.0f;
    for (int j = tid; j <= t; j += ROW_THREADS) lse_merge(&m, &l, row_dot(q, K + (size_t)j * ld, D) * scale, 1.0f);
    ms[tid] = m;
    ls[tid] = l;
    for (int s = ROW_THREADS / 2; s > 0; s >>= 1) {
        __syncthreads();
        if (tid < s) lse_merge(&ms[tid], &ls[tid], ms[tid + s], ls[tid + s]);
    }
    __syncthreads();
    const float M = ms[0], inv = 1.0f / ls[0];
    for (int j0 = 0; j0 <= t; j0 += ROW_THREADS) {
        const int j = j0 + tid, n = t + 1 - j0 < ROW_THREADS ? t + 1 - j0 : ROW_THREADS;
        __syncthreads();   /* the previous chunk is consumed */
        ps[tid] = j <= t ? expf(row_dot(q, K + (size_t)j * ld, D) * scale - M) * inv : 0.0f;
        __syncthreads();
        for (int d = tid; d < D; d += ROW_THREADS) {
            float acc = j0 ? yh[d] : 0.0f;
            for (int k = 0; k < n; k++) acc = fmaf(ps[k], V[(size_t)(j0 + k) * ld + d], acc);
            yh[d] = acc;
        }
    }
}

dt_status dt_cu_attn_decode(float *y, const float *q, const float *kv, int t, int H, int K, int D) {
    DT_CU_ARG(t >= 0 && H >= 1 && K >= 1 && H % K == 0 && D >= 1 && y && q && kv);
    DT_CU_ARG((int64_t)2 * K * D <= INT32_MAX);
    DT_TRY(dt_cu_enter());
    k_attn_decode<<<H, ROW_THREADS, 0, dt_cu_stream()>>>(y, q, kv, t, H, K, D, 1.0f / sqrtf((float)D));
    DT_CU_LAUNCH("k_attn_decode");
    return DT_OK;
}

/* ---- rotary positions: one thread per (row, q or k head, pair i), the angles of
 * dt_rope_angle (ops.h, the CPU's) ---- */

__global__ void __launch_bounds__(DT_CU_THREADS)
k_rope(float *qkv, int T, int heads, int D, size_t ld, float theta, int pos0, int inverse, size_t n) {
    const int half = D / 2;
    DT_CU_FOR(e, n) {
        const size_t r = e / ((size_t)heads * half);
        const int hh = (int)(e / half % heads), i = (int)(e % half);
        float c, s;
        dt_rope_angle((double)(pos0 + (int)(r % T)), i, D, theta, &c, &s);
        if (inverse) s = -s;
        float *x = qkv + r * ld + (size_t)hh * D;
        const float a = x[i], b = x[i + half];
        x[i] = a * c - b * s;
        x[i + half] = b * c + a * s;
    }
}

dt_status dt_cu_rope(float *qkv, int B, int T, int H, int K, int D, float theta, int pos0, int inverse) {
    DT_CU_ARG(B >= 0 && T >= 1 && H >= 1 && K >= 1 && D >= 2 && D % 2 == 0 && theta > 0.0f && pos0 >= 0);
    if (B == 0) return DT_OK;
    DT_CU_ARG(qkv);
    DT_TRY(dt_cu_enter());
    const size_t n = (size_t)B * T * (H + K) * (D / 2);
    k_rope<<<dt_cu_blocks(n), DT_CU_THREADS, 0, dt_cu_stream()>>>(qkv, T, H + K, D, (size_t)(H + 2 * K) * D, theta,
                                                                   pos0, inverse, n);
    DT_CU_LAUNCH("k_rope");
    return DT_OK;
}
