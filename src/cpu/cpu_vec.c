/*
 * cpu_vec.c: vector kernels on the CPU — the deterministic sum of squares (gradient
 * norms), the accuracy count, elementwise arithmetic, casts to and from bf16/f16,
 * fused optimizer steps, the uniform random fill.
 *
 * The sum of squares uses the fixed-chunk scheme of cpu.h: chunk sums in double (8 interleaved
 * accumulators), chunks combined pairwise in index order, so gradient norms and
 * checksums have the same bits on 1 or 2 threads (docs/DESIGN.md rule 2).
 */
#include "cpu.h"
#include "rng.h"
#include "dtype.h"   /* the f16/bf16 conversions of the cast kernels */

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define PAR_MIN 32768


/* ---- metrics ---- */

dt_status dt_cpu_count_correct(int32_t *correct, const float *logits, const int32_t *labels, int B, int C) {
    DT_CPU_ARG(B >= 0 && C >= 1);
    DT_CPU_ARG(correct && (B == 0 || (logits && labels)));
    int32_t n = 0;
    for (int i = 0; i < B; i++) {
        const float *r = logits + (size_t)i * C;
        int best = 0;
        for (int c = 1; c < C; c++)
            if (r[c] > r[best] || (isnan(r[c]) && !isnan(r[best]))) best = c;
        n += labels[i] >= 0 && best == labels[i];
    }
    *correct = n;
    return DT_OK;
}

/* ---- deterministic sum of squares ---- */

/* One chunk: 8 double accumulators, accumulator k taking the elements i = k mod 8. */
static double chunk_sumsq(const float *x, size_t n) {
    double a[8] = {0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) a[k] += (double)x[i + k] * x[i + k];
    for (int k = 0; i < n; i++, k++) a[k] += (double)x[i] * x[i];
    return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

dt_status dt_cpu_sumsq_chunks(double *part, const float *x, size_t n) {
    if (n == 0) return DT_OK;
    if (!part || !x) return dt_error(DT_ERR_INVALID, "cpu sumsq_chunks: NULL pointer");
    size_t nch = (n + DT_CPU_CHUNK - 1) / DT_CPU_CHUNK;
    int nt = dt_cpu_threads();
    #pragma omp parallel for schedule(static) num_threads(nt) if (n >= PAR_MIN)
    for (size_t ch = 0; ch < nch; ch++) {
        size_t i0 = ch * DT_CPU_CHUNK, len = n - i0 < DT_CPU_CHUNK ? n - i0 : DT_CPU_CHUNK;
        part[ch] = chunk_sumsq(x + i0, len);
    }
    return DT_OK;
}

dt_status dt_cpu_sumsq(float *out, const float *x, size_t n) {
    if (!out || (n > 0 && !x)) return dt_error(DT_ERR_INVALID, "cpu sumsq: NULL pointer");
    size_t nch = (n + DT_CPU_CHUNK - 1) / DT_CPU_CHUNK;
    double stackbuf[256], *part = nch <= 256 ? stackbuf : malloc(sizeof(double) * nch);
    if (!part) return dt_error(DT_ERR_NOMEM, "cpu sumsq: out of memory for %zu chunks", nch);
    dt_status s = dt_cpu_sumsq_chunks(part, x, n);
    if (s == DT_OK) *out = (float)dt_cpu_pairwise(part, nch);
    if (part != stackbuf) free(part);
    return s;
}

dt_status dt_cpu_step_checks(float *out, double *parts, double *scratch, size_t nch, const float *losses, size_t k,
                            float max_norm, float unscale) {
    DT_CPU_ARG(out && (nch == 0 || parts) && (k == 0 || losses));
    (void)scratch;   /* the host sums in place */
    float norm = dt_clip_norm(dt_cpu_pairwise(parts, nch), unscale);
    int finite = isfinite(norm);
    for (size_t i = 0; i < k; i++) finite &= isfinite(losses[i]) != 0;
    out[0] = norm;
    out[1] = dt_clip_coef(max_norm, norm);
    out[2] = finite ? 1.0f : 0.0f;
    return DT_OK;
}

dt_status dt_cpu_clip_scale(float *x, const float *checks, size_t n) {
    if (n == 0) return DT_OK;
    DT_CPU_ARG(x && checks);
    return checks[1] < 1.0f ? dt_cpu_scale(x, checks[1], n) : DT_OK;
}

/* ---- elementwise ---- */

dt_status dt_cpu_fill(float *x, float value, size_t n) {
    if (n == 0) return DT_OK;
    DT_CPU_ARG(x);
    int nt = dt_cpu_threads();
    #pragma omp parallel for schedule(static) num_threads(nt) if (n >= PAR_MIN)
    for (size_t i = 0; i < n; i++) x[i] = value;
    return DT_OK;
}

dt_status dt_cpu_scale(float *x, float alpha, size_t n) {
    if (n == 0) return DT_OK;
    DT_CPU_ARG(x);
    int nt = dt_cpu_threads();
    #pragma omp parallel for schedule(static) num_threads(nt) if (n >= PAR_MIN)
    for (size_t i = 0; i < n; i++) x[i] *= alpha;
    return DT_OK;
}

dt_status dt_cpu_add(float *z, const float *x, const float *y, size_t n) {
    if (n == 0) return DT_OK;
    DT_CPU_ARG(z && x && y);
    int nt = dt_cpu_threads();
    #pragma omp parallel for schedule(static) num_threads(nt) if (n >= PAR_MIN)
    for (size_t i = 0; i < n; i++) z[i] = x[i] + y[i];
    return DT_OK;
}

/* ---- casts: the conversions of dtype.h (round to nearest even, NaN kept quiet, f16 overflow to inf) ---- */

dt_status dt_cpu_f32_to_bf16(uint16_t *dst, const float *src, size_t n) {
    if (n == 0) return DT_OK;
    DT_CPU_ARG(dst && src);
    int nt = dt_cpu_threads();
    #pragma omp parallel for schedule(static) num_threads(nt) if (n >= PAR_MIN)
    for (size_t i = 0; i < n; i++) dst[i] = dt_f32_to_bf16(src[i]);
    return DT_OK;
}

dt_status dt_cpu_bf16_to_f32(float *dst, const uint16_t *src, size_t n) {
    if (n == 0) return DT_OK;
    DT_CPU_ARG(dst && src);
    int nt = dt_cpu_threads();
    #pragma omp parallel for schedule(static) num_threads(nt) if (n >= PAR_MIN)
    for (size_t i = 0; i < n; i++) dst[i] = dt_bf16_to_f32(src[i]);
    return DT_OK;
}

dt_status dt_cpu_f32_to_f16(uint16_t *dst, const float *src, size_t n) {
    if (n == 0) return DT_OK;
    DT_CPU_ARG(dst && src);
    int nt = dt_cpu_threads();
    #pragma omp parallel for schedule(static) num_threads(nt) if (n >= PAR_MIN)
    for (size_t i = 0; i < n; i++) dst[i] = dt_f32_to_f16(src[i]);
    return DT_OK;
}

dt_status dt_cpu_f16_to_f32(float *dst, const uint16_t *src, size_t n) {
    if (n == 0) return DT_OK;
    DT_CPU_ARG(dst && src);
    int nt = dt_cpu_threads();
    #pragma omp parallel for schedule(static) num_threads(nt) if (n >= PAR_MIN)
    for (size_t i = 0; i < n; i++) dst[i] = dt_f16_to_f32(src[i]);
    return DT_OK;
}

/* ---- optimizers (the formulas are in ops.h) ---- */

/* The update loops run over chunks of OPT_CHUNK elements, each a call of a loop
 * compiled for every vector width (DT_CPU_CLONES): the same expression per element, so
 * the same bits on any width and thread. Square roots and divisions are IEEE-exact in
 * vector form too (the backend is built with -fno-math-errno, so sqrtf is one
 * instruction). */
#define OPT_CHUNK 4096
#define OPT_CHUNKS(n, body) do { \
    int nt_ = dt_cpu_threads(); \
    size_t nc_ = ((n) + OPT_CHUNK - 1) / OPT_CHUNK; \
    _Pragma("omp parallel for schedule(static) num_threads(nt_) if ((n) >= PAR_MIN)") \
    for (size_t c_ = 0; c_ < nc_; c_++) { \
        size_t lo = c_ * OPT_CHUNK, len = (n) - lo < OPT_CHUNK ? (n) - lo : OPT_CHUNK; \
        body; \
    } \
} while (0)

typedef struct { float lr, mom, damp1, wd, gs; int first, nest; } sgd_k;

DT_CPU_CLONES static void sgd_loop(float *restrict p, const float *restrict grad, float *restrict buf, size_t n,
                                   const sgd_k *k) {
    const float lr = k->lr, mom = k->mom, damp1 = k->damp1, wd = k->wd, gs = k->gs;
    const int decay = wd != 0.0f, nest = k->nest;
    if (mom == 0.0f) {
        for (size_t i = 0; i < n; i++) {
            float g = gs * grad[i];
            if (decay) g += wd * p[i];
            p[i] -= lr * g;
        }
    } else if (k->first) {   /* the buffer starts as the gradient */
        for (size_t i = 0; i < n; i++) {
            float g = gs * grad[i];
            if (decay) g += wd * p[i];
            buf[i] = g;
            p[i] -= lr * (nest ? g + mom * g : g);
        }
    } else {
        for (size_t i = 0; i < n; i++) {
            float g = gs * grad[i];
            if (decay) g += wd * p[i];
            float b = mom * buf[i] + damp1 * g;
            buf[i] = b;
            p[i] -= lr * (nest ? g + mom * b : b);
        }
    }
}

dt_status dt_cpu_sgd_update(float *p, const float *grad, float *buf, size_t n, const dt_sgd_args *a) {
    DT_CPU_ARG(a);
    if (n == 0) return DT_OK;
    DT_CPU_ARG(p && grad && (a->momentum == 0.0f || buf));
    DT_CPU_ARG(a->lr >= 0.0 && a->momentum >= 0.0 && a->weight_decay >= 0.0);
    DT_CPU_ARG(!a->nesterov || (a->momentum > 0.0 && a->dampening == 0.0));
    if (a->gate && *a->gate == 0.0f) return DT_OK;   /* the step's checks said no */
    /* scalars rounded to float once, (1 - dampening) formed in double, as PyTorch does */
    const sgd_k k = { .lr = (float)a->lr, .mom = (float)a->momentum, .damp1 = (float)(1.0 - a->dampening),
                      .wd = (float)a->weight_decay, .gs = (float)a->grad_scale, .first = a->first_step,
                      .nest = a->nesterov };
    OPT_CHUNKS(n, sgd_loop(p + lo, grad + lo, buf ? buf + lo : NULL, len, &k));
    return DT_OK;
}

DT_CPU_CLONES static void adamw_loop(float *restrict p, const float *restrict grad, float *restrict m,
                                     float *restrict v, size_t n, dt_adamw_f k) {
    for (size_t i = 0; i < n; i++) dt_adamw_elem(p + i, m + i, v + i, grad[i], k);
}

dt_status dt_cpu_adamw_update(float *p, const float *grad, float *m, float *v, size_t n, const dt_adamw_args *a) {
    DT_CPU_ARG(a);
    if (n == 0) return DT_OK;
    DT_CPU_ARG(p && grad && m && v);
    DT_CPU_ARG(a->step >= 1);
    DT_CPU_ARG(a->lr >= 0.0 && a->eps >= 0.0 && a->weight_decay >= 0.0);
    DT_CPU_ARG(a->beta1 >= 0.0 && a->beta1 < 1.0 && a->beta2 >= 0.0 && a->beta2 < 1.0);
    if (a->gate && *a->gate == 0.0f) return DT_OK;
    const dt_adamw_f k = dt_adamw_floats(a);
    OPT_CHUNKS(n, adamw_loop(p + lo, grad + lo, m + lo, v + lo, len, k));
    return DT_OK;
}

/* ---- random fill: element i depends on (seed, stream, offset + i) only ---- */

dt_status dt_cpu_rng_normal(float *x, size_t n, float mean, float std, uint64_t seed, uint64_t stream, uint64_t offset) {
    if (n == 0) return DT_OK;
    DT_CPU_ARG(x);
    DT_CPU_ARG(std >= 0.0f);
    int nt = dt_cpu_threads();
    #pragma omp parallel for schedule(static) num_threads(nt) if (n >= PAR_MIN / 8)
    for (size_t i = 0; i < n; i++) {
        double u = dt_rng_unit(seed, stream, 2 * (offset + i)), w = dt_rng_unit(seed, stream, 2 * (offset + i) + 1);
        x[i] = (float)(mean + std * sqrt(-2.0 * log(1.0 - u)) * cos(6.283185307179586 * w));
    }
    return DT_OK;
}

dt_status dt_cpu_rng_uniform(float *x, size_t n, float lo, float hi, uint64_t seed, uint64_t stream, uint64_t offset) {
    if (n == 0) return DT_OK;
    DT_CPU_ARG(x);
    DT_CPU_ARG(lo <= hi);
    const float w = hi - lo;
    int nt = dt_cpu_threads();
    #pragma omp parallel for schedule(static) num_threads(nt) if (n >= PAR_MIN / 8)
    for (size_t i = 0; i < n; i++) x[i] = lo + w * dt_rng_unit(seed, stream, offset + i);
    return DT_OK;
}
