/*
 * ops_util.h: helpers shared by the compute-kernel tests (test_ops.c, test_conv.c):
 * a seeded random generator for inputs (never zeros), error measures, and a way
 * to run a kernel with 1 and with 2 threads and compare the bytes.
 */
#ifndef DT_OPS_UTIL_H
#define DT_OPS_UTIL_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ops.h"
#include "tap.h"

static uint64_t tu_state_ = 0x9e3779b97f4a7c15ull;

/* Uniform in [lo, hi), from a xorshift64* stream (independent of dtrain's Philox). */
static inline float tu_uniform(float lo, float hi) {
    tu_state_ ^= tu_state_ >> 12;
    tu_state_ ^= tu_state_ << 25;
    tu_state_ ^= tu_state_ >> 27;
    uint64_t r = tu_state_ * 0x2545f4914f6cdd1dull;
    return lo + (hi - lo) * (float)((r >> 40) * (1.0 / 16777216.0));
}

/* n random floats in [-1, 1) that are never exactly zero. */
static inline float *tu_rand(size_t n) {
    float *x = malloc(sizeof(float) * (n ? n : 1));
    if (!x) { printf("Bail out! out of memory\n"); exit(1); }
    for (size_t i = 0; i < n; i++) {
        float v = tu_uniform(-1.0f, 1.0f);
        x[i] = v == 0.0f ? 0.5f : v;
    }
    return x;
}

static inline float *tu_alloc(size_t n) {
    float *x = calloc(n ? n : 1, sizeof(float));
    if (!x) { printf("Bail out! out of memory\n"); exit(1); }
    return x;
}

static inline double *tu_dalloc(size_t n) {
    double *x = calloc(n ? n : 1, sizeof(double));
    if (!x) { printf("Bail out! out of memory\n"); exit(1); }
    return x;
}

/* max |got - want| / (atol + |want|) over n values: <= 1 means within tolerance rtol
 * when called as tu_close(got, want, n, rtol, atol). NaN anywhere fails. */
static inline int tu_close(const float *got, const double *want, size_t n, double rtol, double atol) {
    double worst = 0.0;
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        double diff = fabs((double)got[i] - want[i]);
        double e = diff == 0.0 ? 0.0 : diff / (atol + rtol * fabs(want[i]));
        if (!(e <= worst)) { worst = e; at = i; }
        if (isnan(got[i]) || isnan(want[i])) { worst = INFINITY; at = i; break; }
    }
    if (!(worst <= 1.0)) diag("   element %zu: got %.9g, expected %.9g", at, n ? (double)got[at] : 0.0, n ? want[at] : 0.0);
    return worst <= 1.0;
}

#endif /* DT_OPS_UTIL_H */
