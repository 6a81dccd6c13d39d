/*
 * cpu_seq.c: the sequence kernels of transformers on the CPU — embeddings, learned
 * positions, rotary positions and fused causal attention (multi-head or grouped-query).
 *
 * Attention works per (batch, head) pair, one pair per OpenMP iteration: each pair's
 * sums run in one thread in a fixed order, so no result depends on the thread count.
 * The scores are computed a tile of 64 queries x 64 keys at a time with small GEMMs,
 * with an online softmax (a running maximum and sum per query row), so memory holds
 * one tile per thread, never the T x T matrix; the forward saves each row's
 * log-sum-exp and backward recomputes the probabilities from it (FlashAttention's
 * scheme).
 */
#include "cpu.h"
#include "dtype.h"   /* the attention's operand types */
#include "ops_elem.h"   /* dt_exp_nonpos */

#include <math.h>
#include <string.h>

#define PAR_MIN 32768

/* id as an index, or -1 when it is not an integer in [0, V) */
static int token(float id, int V) {
    if (!(id >= 0.0f) || id >= (float)V || id != (float)(int)id) return -1;
    return (int)id;
}

dt_status dt_cpu_embedding_forward(float *y, const float *ids, const float *W, int n, int C, int V) {
    DT_CPU_ARG(n >= 0 && C >= 1 && V >= 1);
    if (n == 0) return DT_OK;
    DT_CPU_ARG(y && ids && W);
    for (int i = 0; i < n; i++)
        if (token(ids[i], V) < 0)
            return dt_error(DT_ERR_INVALID, "cpu embedding_forward: token %d is %g, outside the vocabulary [0, %d)",
                            i, (double)ids[i], V);
    int nt = dt_cpu_threads();
    #pragma omp parallel for schedule(static) num_threads(nt) if ((size_t)n * C >= PAR_MIN)
    for (int i = 0; i < n; i++) memcpy(y + (size_t)i * C, W + (size_t)token(ids[i], V) * C, (size_t)C * sizeof(float));
    return DT_OK;
}

/* Columns are split into fixed blocks; each block's rows are summed over the tokens
 * in index order by one thread. */
#define EMB_COLS 64

dt_status dt_cpu_embedding_backward(float *dW, const float *ids, const float *dy, int n, int C, int V, int accumulate) {
    DT_CPU_ARG(n >= 0 && C >= 1 && V >= 1 && dW);
    DT_CPU_ARG(n == 0 || (ids && dy));
    int nt = dt_cpu_threads();
    if (!accumulate) {
        #pragma omp parallel for schedule(static) num_threads(nt) if ((size_t)V * C >= PAR_MIN)
        for (int v = 0; v < V; v++) memset(dW + (size_t)v * C, 0, (size_t)C * sizeof(float));
    }
    for (int i = 0; i < n; i++)
        if (token(ids[i], V) < 0)
            return dt_error(DT_ERR_INVALID, "cpu embedding_backward: token %d is %g, outside the vocabulary [0, %d)",
                            i, (double)ids[i], V);
    int nblk = (C + EMB_COLS - 1) / EMB_COLS;
    #pragma omp parallel for schedule(static) num_threads(nt) if ((size_t)n * C >= PAR_MIN)
    for (int b = 0; b < nblk; b++) {
        int c0 = b * EMB_COLS, c1 = c0 + EMB_COLS < C ? c0 + EMB_COLS : C;
        for (int i = 0; i < n; i++) {
            float *w = dW + (size_t)token(ids[i], V) * C;
            const float *g = dy + (size_t)i * C;
            for (int c = c0; c < c1; c++) w[c] += g[c];
        }
    }
    return DT_OK;
}

dt_status dt_cpu_pos_forward(float *y, const float *x, const float *P, int B, int T, int C) {
    DT_CPU_ARG(B >= 0 && T >= 1 && C >= 1);
    if (B == 0) return DT_OK;
    DT_CPU_ARG(y && x && P);
    int nt = dt_cpu_threads();
    #pragma omp parallel for schedule(static) num_threads(nt) if ((size_t)B * T * C >= PAR_MIN)
    for (int r = 0; r < B * T; r++) {
        const float *xr = x + (size_t)r * C, *p = P + (size_t)(r % T) * C;
        float *yr = y + (size_t)r * C;
        for (int c = 0; c < C; c++) yr[c] = xr[c] + p[c];
    }
    return DT_OK;
}

dt_status dt_cpu_pos_backward(float *dP, const float *dy, int B, int T, int C) {
    DT_CPU_ARG(B >= 0 && T >= 1 && C >= 1 && dP);
    DT_CPU_ARG(B == 0 || dy);
    int nt = dt_cpu_threads();
    #pragma omp parallel for schedule(static) num_threads(nt) if ((size_t)B * T * C >= PAR_MIN)
    for (int t = 0; t < T; t++) {
        float *d = dP + (size_t)t * C;
        memset(d, 0, (size_t)C * sizeof(float));
        for (int b = 0; b < B; b++) {
            const float *g = dy + ((size_t)b * T + t) * C;
            for (int c = 0; c < C; c++) d[c] += g[c];
        }
    }
    return DT_OK;
}

typedef float v8f __attribute__((vector_size(32)));   /* GCC/Clang generic vectors */

/* a . b over D: eight float lanes (lane k takes d = k mod 8), the tail added to lane
 * d mod 8 too, the lanes combined in a fixed tree; the order depends on D only. */
static inline float dot(const float *a, const float *b, int D) {
    v8f acc = {0}, x, y;
    int d = 0;
    for (; d + 8 <= D; d += 8) {
        memcpy(&x, a + d, sizeof x);
        memcpy(&y, b + d, sizeof y);
        acc += x * y;
    }
    for (int k = 0; d < D; d++, k++) acc[k] += a[d] * b[d];
    return DT_CPU_TREE8(acc);
}

/* y += a * x over D (element-wise: each output has one writer) */
static inline void axpy(float *y, float a, const float *x, int D) {
    for (int d = 0; d < D; d++) y[d] += a * x[d];
}

/* Scores of query row q over keys 0..t into s[0..t]; returns their maximum. */
static float scores(float *s, const float *q, const float *k0, size_t ld, int t, int D, float scale) {
    float m = -INFINITY;
    for (int j = 0; j <= t; j++) {
        s[j] = dot(q, k0 + (size_t)j * ld, D) * scale;
        if (s[j] > m) m = s[j];
    }
    return m;
}

/* y (D) = softmax-weighted sum of the values 0..t, from scores s (destroyed); lse out. */
static void weigh(float *y, float *s, float m, const float *v0, size_t ld, int t, int D, float *lse) {
    double l = 0.0;
    for (int j = 0; j <= t; j++) {
        s[j] = expf(s[j] - m);
        l += s[j];
    }
    float inv = (float)(1.0 / l);
    for (int d = 0; d < D; d++) y[d] = 0.0f;
    for (int j = 0; j <= t; j++) axpy(y, s[j] * inv, v0 + (size_t)j * ld, D);
    if (lse) *lse = m + (float)log(l);
}

/* The probabilities of one score row: p[c] = exp(s[c] - m) with the polynomial exp of
 * ops_elem.h (vectorised, unlike expf), 0 where s[c] is -inf (a masked key); every
 * s[c] - m is <= 0 up to rounding. Returns their sum in eight lanes (lane k takes
 * c = k mod 8) combined in a fixed tree: the order depends on n only. */
DT_CPU_CLONES static float exp_row(float *restrict p, const float *restrict s, float m, int n) {
    for (int c = 0; c < n; c++) p[c] = s[c] == -INFINITY ? 0.0f : dt_exp_nonpos(s[c] - m);
    float acc[8] = { 0 };
    int c = 0;
    for (; c + 8 <= n; c += 8)
        for (int k = 0; k < 8; k++) acc[k] += p[c + k];
    for (int k = 0; c < n; c++, k++) acc[k] += p[c];
    return DT_CPU_TREE8(acc);
}

/* the largest of m and s[0..n) (exact in any order) */
float dt_cpu_row_max(const float *s, int n, float m) {
    float acc[8] = { m, m, m, m, m, m, m, m };
    int c = 0;
    for (; c + 8 <= n; c += 8)
        for (int k = 0; k < 8; k++) acc[k] = s[c + k] > acc[k] ? s[c + k] : acc[k];
    for (; c < n; c++) acc[0] = s[c] > acc[0] ? s[c] : acc[0];
    for (int k = 1; k < 8; k++) acc[0] = acc[k] > acc[0] ? acc[k] : acc[0];
    return acc[0];
}

/* Tiles of BR queries x BC keys: a tile's scores go through small GEMMs (the
 * single-threaded dt_cpu_gemm1) in one thread's scratch memory, whose size is fixed
 * by the tile, not by T. Per (batch, head) the tiles run in a fixed order. */
#define BR 64
#define BC 64

/* scratch floats per thread: S, P (BR x BC each), O (BR x D), m, l (BR each), and
 * D_i (T) for backward */
static size_t attn_scratch(int T, int D) { return 2 * (size_t)BR * BC + (size_t)BR * D + 2 * BR + (size_t)T; }

/* S (br x bc, row stride BC) = scale * Q K^T, keys after a query masked to -inf */
static void tile_scores(float *S, const float *Q, const float *K, size_t ld, int i0, int br, int j0, int bc, int D,
                        float scale) {
    dt_cpu_gemm1(0, 1, br, bc, D, scale, Q + (size_t)i0 * ld, (int)ld, K + (size_t)j0 * ld, (int)ld, 0.0f, S, BC);
    for (int r = 0; r < br; r++)
        for (int c = i0 + r - j0 + 1 > 0 ? i0 + r - j0 + 1 : 0; c < bc; c++) S[(size_t)r * BC + c] = -INFINITY;
}

/* One (batch, head) pair: Q, K, V at position 0 of the head's columns, row stride ld
 * (the fused qkv's); y (T, D) of the head with row stride C, lse (T). */
static void attn_fwd_head(float *y, float *lse, const float *Q, const float *K, const float *V, size_t ld, int T,
                          int C, int D, float scale, float *w) {
    float *S = w, *P = S + (size_t)BR * BC, *O = P + (size_t)BR * BC, *m = O + (size_t)BR * D, *l = m + BR;
    for (int i0 = 0; i0 < T; i0 += BR) {
        int br = T - i0 < BR ? T - i0 : BR;
        for (int r = 0; r < br; r++) { m[r] = -INFINITY; l[r] = 0.0f; }
        memset(O, 0, (size_t)br * D * sizeof(float));
        for (int j0 = 0; j0 < i0 + br; j0 += BC) {
            int bc = i0 + br - j0 < BC ? i0 + br - j0 : BC;
            tile_scores(S, Q, K, ld, i0, br, j0, bc, D, scale);
            for (int r = 0; r < br; r++) {
                float *sr = S + (size_t)r * BC, *pr = P + (size_t)r * BC, mx = dt_cpu_row_max(sr, bc, m[r]);
                float alpha = m[r] == -INFINITY ? 0.0f : dt_exp_nonpos(m[r] - mx);
                l[r] = l[r] * alpha + exp_row(pr, sr, mx, bc);
                m[r] = mx;
                float *orow = O + (size_t)r * D;
                for (int d = 0; d < D; d++) orow[d] *= alpha;
            }
            dt_cpu_gemm1(0, 0, br, D, bc, 1.0f, P, BC, V + (size_t)j0 * ld, (int)ld, 1.0f, O, D);
        }
        for (int r = 0; r < br; r++) {
            float inv = 1.0f / l[r], *yr = y + (size_t)(i0 + r) * C;
            for (int d = 0; d < D; d++) yr[d] = O[(size_t)r * D + d] * inv;
            lse[i0 + r] = m[r] + logf(l[r]);
        }
    }
}

/* One query head's share of the backward: dQ of the head written, its contributions
 * added to dK, dV of its key/value head (zeroed by the caller before its first query
 * head). Q, K, V, dQ, dK, dV have row stride ld; g (dy) and y row stride C. */
static void attn_bwd_head(float *dQ, float *dK, float *dV, const float *g, const float *Q, const float *K,
                          const float *V, const float *y, const float *lse, size_t ld, int T, int C, int D,
                          float scale, float *w) {
    float *S = w, *P = S + (size_t)BR * BC, *Di = P + (size_t)BR * BC + (size_t)BR * D + 2 * BR;
    for (int t = 0; t < T; t++) {
        Di[t] = dot(g + (size_t)t * C, y + (size_t)t * C, D);
        memset(dQ + (size_t)t * ld, 0, (size_t)D * sizeof(float));
    }
    for (int i0 = 0; i0 < T; i0 += BR) {
        int br = T - i0 < BR ? T - i0 : BR;
        for (int j0 = 0; j0 < i0 + br; j0 += BC) {
            int bc = i0 + br - j0 < BC ? i0 + br - j0 : BC;
            tile_scores(S, Q, K, ld, i0, br, j0, bc, D, scale);
            for (int r = 0; r < br; r++)   /* P = exp(S - lse), masked entries 0 */
                exp_row(P + (size_t)r * BC, S + (size_t)r * BC, lse[i0 + r], bc);
            /* dV_j += P^T dO_i; dP = dO_i V_j^T, in S */
            dt_cpu_gemm1(1, 0, bc, D, br, 1.0f, P, BC, g + (size_t)i0 * C, C, 1.0f, dV + (size_t)j0 * ld, (int)ld);
            dt_cpu_gemm1(0, 1, br, bc, D, 1.0f, g + (size_t)i0 * C, C, V + (size_t)j0 * ld, (int)ld, 0.0f, S, BC);
            for (int r = 0; r < br; r++) {   /* dS = P (dP - D_i) scale, in S */
                const float *pr = P + (size_t)r * BC;
                float *dr = S + (size_t)r * BC;
                const float di = Di[i0 + r];
                for (int c = 0; c < bc; c++) dr[c] = pr[c] * (dr[c] - di) * scale;
            }
            /* dQ_i += dS K_j; dK_j += dS^T Q_i */
            dt_cpu_gemm1(0, 0, br, D, bc, 1.0f, S, BC, K + (size_t)j0 * ld, (int)ld, 1.0f, dQ + (size_t)i0 * ld, (int)ld);
            dt_cpu_gemm1(1, 0, bc, D, br, 1.0f, S, BC, Q + (size_t)i0 * ld, (int)ld, 1.0f, dK + (size_t)j0 * ld, (int)ld);
        }
    }
}

/* What one pass needs; the forward reads qkv and writes y and lse, the backward also
 * reads dy, y and lse and writes dqkv. K key/value heads, H/K query heads each. */
typedef struct {
    int backward, B, T, H, K, D;
    float *y, *lse, *dqkv;
    const float *qkv, *dy;
} attn_job;

/* The forward takes one (batch, query head) pair per OpenMP iteration; the backward one
 * (batch, key/value head) pair, whose query heads run in order in that iteration (the
 * sums into dK and dV have one writer and a fixed order). Each has its thread's scratch. */
static dt_status attn_each_head(const char *fn, const attn_job *j) {
    const int C = j->H * j->D, rep = j->H / j->K, units = j->backward ? j->K : j->H;
    const size_t ld = (size_t)(j->H + 2 * j->K) * j->D;
    const float scale = 1.0f / sqrtf((float)j->D);
    int nt = dt_cpu_threads(), failed = 0;
    #pragma omp parallel for schedule(static) num_threads(nt) if ((size_t)j->B * j->H * j->T * j->T * j->D >= PAR_MIN)
    for (int bu = 0; bu < j->B * units; bu++) {
        int b = bu / units, u = bu % units;
        float *w = dt_cpu_scratch(0, attn_scratch(j->T, j->D));
        if (!w) {
            #pragma omp atomic write
            failed = 1;
            continue;
        }
        const size_t row0 = (size_t)b * j->T;
        const float *base = j->qkv + row0 * ld;
        if (!j->backward) {
            int kh = u / rep;
            attn_fwd_head(j->y + row0 * C + (size_t)u * j->D, j->lse + ((size_t)b * j->H + u) * j->T,
                          base + (size_t)u * j->D, base + C + (size_t)kh * j->D,
                          base + C + (size_t)(j->K + kh) * j->D, ld, j->T, C, j->D, scale, w);
            continue;
        }
        float *dbase = j->dqkv + row0 * ld;
        float *dK = dbase + C + (size_t)u * j->D, *dV = dbase + C + (size_t)(j->K + u) * j->D;
        for (int t = 0; t < j->T; t++) {
            memset(dK + (size_t)t * ld, 0, (size_t)j->D * sizeof(float));
            memset(dV + (size_t)t * ld, 0, (size_t)j->D * sizeof(float));
        }
        for (int h = u * rep; h < (u + 1) * rep; h++)
            attn_bwd_head(dbase + (size_t)h * j->D, dK, dV, j->dy + row0 * C + (size_t)h * j->D,
                          base + (size_t)h * j->D, base + C + (size_t)u * j->D, base + C + (size_t)(j->K + u) * j->D,
                          j->y + row0 * C + (size_t)h * j->D, j->lse + ((size_t)b * j->H + h) * j->T, ld, j->T, C,
                          j->D, scale, w);
    }
    return failed ? dt_error(DT_ERR_NOMEM, "cpu %s: out of memory", fn) : DT_OK;
}

/* dtype (16-bit operands) changes nothing here: the products of two such values are
 * exact in f32, as on 16-bit units */
dt_status dt_cpu_attn_forward(float *y, float *lse, const float *qkv, int B, int T, int H, int K, int D, int dtype) {
    DT_CPU_ARG(B >= 0 && T >= 1 && H >= 1 && K >= 1 && H % K == 0 && D >= 1);
    DT_CPU_ARG(dtype == DT_F32 || dtype == DT_BF16 || dtype == DT_F16);
    if (B == 0) return DT_OK;
    DT_CPU_ARG(y && lse && qkv);
    attn_job j = { .backward = 0, .B = B, .T = T, .H = H, .K = K, .D = D, .y = y, .lse = lse, .qkv = qkv };
    return attn_each_head("attn_forward", &j);
}

dt_status dt_cpu_attn_backward(float *dqkv, const float *dy, const float *qkv, const float *y, const float *lse,
                               int B, int T, int H, int K, int D, int dtype) {
    DT_CPU_ARG(B >= 0 && T >= 1 && H >= 1 && K >= 1 && H % K == 0 && D >= 1);
    DT_CPU_ARG(dtype == DT_F32 || dtype == DT_BF16 || dtype == DT_F16);
    if (B == 0) return DT_OK;
    DT_CPU_ARG(dqkv && dy && qkv && y && lse);
    attn_job j = { .backward = 1, .B = B, .T = T, .H = H, .K = K, .D = D, .y = (float *)y, .lse = (float *)lse,
                   .dqkv = dqkv, .qkv = qkv, .dy = dy };
    return attn_each_head("attn_backward", &j);
}

dt_status dt_cpu_attn_decode(float *y, const float *q, const float *kv, int t, int H, int K, int D) {
    DT_CPU_ARG(t >= 0 && H >= 1 && K >= 1 && H % K == 0 && D >= 1 && y && q && kv);
    const int rep = H / K;
    const size_t ld = (size_t)2 * K * D;
    const float scale = 1.0f / sqrtf((float)D);
    float *s = dt_cpu_scratch(0, (size_t)t + 1);
    if (!s) return dt_error(DT_ERR_NOMEM, "cpu attn_decode: out of memory");
    for (int h = 0; h < H; h++) {
        float m = scores(s, q + (size_t)h * D, kv + (size_t)(h / rep) * D, ld, t, D, scale);
        weigh(y + (size_t)h * D, s, m, kv + (size_t)(K + h / rep) * D, ld, t, D, NULL);
    }
    return DT_OK;
}

/* ---- rotary positions ---- */

/* Each (row, head) pair is rotated by one thread; the angles depend on (position, i) only. */
dt_status dt_cpu_rope(float *qkv, int B, int T, int H, int K, int D, float theta, int pos0, int inverse) {
    DT_CPU_ARG(B >= 0 && T >= 1 && H >= 1 && K >= 1 && D >= 2 && D % 2 == 0 && theta > 0.0f && pos0 >= 0);
    if (B == 0) return DT_OK;
    DT_CPU_ARG(qkv);
    const size_t ld = (size_t)(H + 2 * K) * D;
    const int half = D / 2, heads = H + K;   /* the q heads, then the k heads: contiguous */
    int nt = dt_cpu_threads();
    #pragma omp parallel for schedule(static) num_threads(nt) if ((size_t)B * T * heads * D >= PAR_MIN)
    for (int r = 0; r < B * T; r++) {
        const double pos = (double)(pos0 + r % T);
        float *row = qkv + (size_t)r * ld;
        for (int i = 0; i < half; i++) {
            float c, s;
            dt_rope_angle(pos, i, D, theta, &c, &s);
            if (inverse) s = -s;
            for (int h = 0; h < heads; h++) {
                float *x = row + (size_t)h * D;
                const float a = x[i], b = x[i + half];
                x[i] = a * c - b * s;
                x[i + half] = b * c + a * s;
            }
        }
    }
    return DT_OK;
}
