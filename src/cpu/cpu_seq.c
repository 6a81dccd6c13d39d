/*
 * cpu_seq.c: the sequence kernels of transformers on the CPU — embeddings, learned
 * positions and fused causal attention.
 *
 * Attention works per (batch, head) pair, one pair per OpenMP iteration: each pair's
 * sums run in one thread in a fixed order, so no result depends on the thread count.
 * The forward keeps one row of T scores per thread (never the T x T matrix) and saves
 * each row's log-sum-exp; backward recomputes the probabilities from it (the scheme of
 * FlashAttention, without tiling: on a CPU the row fits in cache).
 */
#include "cpu.h"

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

static float dot(const float *a, const float *b, int D) {
    float s = 0.0f;
    for (int d = 0; d < D; d++) s += a[d] * b[d];
    return s;
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
    for (int j = 0; j <= t; j++) {
        const float *v = v0 + (size_t)j * ld;
        float p = s[j] * inv;
        for (int d = 0; d < D; d++) y[d] += p * v[d];
    }
    if (lse) *lse = m + (float)log(l);
}

dt_status dt_cpu_attn_forward(float *y, float *lse, const float *qkv, int B, int T, int H, int D) {
    DT_CPU_ARG(B >= 0 && T >= 1 && H >= 1 && D >= 1);
    if (B == 0) return DT_OK;
    DT_CPU_ARG(y && lse && qkv);
    const int C = H * D;
    const size_t ld = 3 * (size_t)C;
    const float scale = 1.0f / sqrtf((float)D);
    int nt = dt_cpu_threads(), failed = 0;
    #pragma omp parallel for schedule(static) num_threads(nt) if ((size_t)B * H * T * T * D >= PAR_MIN)
    for (int bh = 0; bh < B * H; bh++) {
        int b = bh / H, h = bh % H;
        float *s = dt_cpu_scratch(0, (size_t)T);
        if (!s) {
            #pragma omp atomic write
            failed = 1;
            continue;
        }
        const float *base = qkv + (size_t)b * T * ld;
        for (int t = 0; t < T; t++) {
            const float *q = base + (size_t)t * ld + (size_t)h * D;
            float m = scores(s, q, base + C + (size_t)h * D, ld, t, D, scale);
            weigh(y + ((size_t)b * T + t) * C + (size_t)h * D, s, m, base + 2 * C + (size_t)h * D, ld, t, D,
                  lse + ((size_t)b * H + h) * T + t);
        }
    }
    return failed ? dt_error(DT_ERR_NOMEM, "cpu attn_forward: out of memory") : DT_OK;
}

dt_status dt_cpu_attn_backward(float *dqkv, const float *dy, const float *qkv, const float *y, const float *lse,
                               int B, int T, int H, int D) {
    DT_CPU_ARG(B >= 0 && T >= 1 && H >= 1 && D >= 1);
    if (B == 0) return DT_OK;
    DT_CPU_ARG(dqkv && dy && qkv && y && lse);
    const int C = H * D;
    const size_t ld = 3 * (size_t)C;
    const float scale = 1.0f / sqrtf((float)D);
    int nt = dt_cpu_threads();
    #pragma omp parallel for schedule(static) num_threads(nt) if ((size_t)B * H * T * T * D >= PAR_MIN)
    for (int bh = 0; bh < B * H; bh++) {
        int b = bh / H, h = bh % H;
        const float *base = qkv + (size_t)b * T * ld;
        float *dbase = dqkv + (size_t)b * T * ld;
        const float *K = base + C + (size_t)h * D, *V = base + 2 * C + (size_t)h * D;
        float *dK = dbase + C + (size_t)h * D, *dV = dbase + 2 * C + (size_t)h * D;
        for (int t = 0; t < T; t++) {
            memset(dK + (size_t)t * ld, 0, (size_t)D * sizeof(float));
            memset(dV + (size_t)t * ld, 0, (size_t)D * sizeof(float));
        }
        for (int t = 0; t < T; t++) {
            const float *q = base + (size_t)t * ld + (size_t)h * D;
            const float *g = dy + ((size_t)b * T + t) * C + (size_t)h * D;
            const float *o = y + ((size_t)b * T + t) * C + (size_t)h * D;
            float *dq = dbase + (size_t)t * ld + (size_t)h * D;
            const float L = lse[((size_t)b * H + h) * T + t];
            const float Di = dot(g, o, D);
            for (int d = 0; d < D; d++) dq[d] = 0.0f;
            for (int j = 0; j <= t; j++) {
                const float *k = K + (size_t)j * ld, *v = V + (size_t)j * ld;
                float p = expf(dot(q, k, D) * scale - L);
                float ds = p * (dot(g, v, D) - Di) * scale;
                float *dk = dK + (size_t)j * ld, *dv = dV + (size_t)j * ld;
                for (int d = 0; d < D; d++) {
                    dq[d] += ds * k[d];
                    dk[d] += ds * q[d];
                    dv[d] += p * g[d];
                }
            }
        }
    }
    return DT_OK;
}

dt_status dt_cpu_attn_decode(float *y, const float *qkv, int t, int H, int D) {
    DT_CPU_ARG(t >= 0 && H >= 1 && D >= 1 && y && qkv);
    const int C = H * D;
    const size_t ld = 3 * (size_t)C;
    const float scale = 1.0f / sqrtf((float)D);
    float *s = dt_cpu_scratch(0, (size_t)t + 1);
    if (!s) return dt_error(DT_ERR_NOMEM, "cpu attn_decode: out of memory");
    for (int h = 0; h < H; h++) {
        const float *q = qkv + (size_t)t * ld + (size_t)h * D;
        float m = scores(s, q, qkv + C + (size_t)h * D, ld, t, D, scale);
        weigh(y + (size_t)h * D, s, m, qkv + 2 * C + (size_t)h * D, ld, t, D, NULL);
    }
    return DT_OK;
}
