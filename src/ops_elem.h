/*
 * ops_elem.h: the element-wise activations of the compute interface — their list and
 * their scalar math, shared by the CPU and the CUDA backend.
 *
 * An activation is one row of DT_OPS_ELEM plus two scalar functions here:
 *   dt_<name>_fwd(x)      -> y
 *   dt_<name>_bwd(dy, s)  -> dx, where s is what the row says backward reads: the
 *                            forward INPUT x or the forward OUTPUT y.
 * From the row, ops.h makes the ops <name>_forward (y, x, n) and <name>_backward
 * (dx, dy, x or y, n); src/cpu/cpu_elem.c makes their OpenMP loops, src/cuda/
 * cuda_elem.cu their grid-stride kernels and launchers, and tests/ops_cases.h their
 * cases of the op test. Nothing else is written per activation. (The layer that uses
 * the ops is one line of the layer table in src/layers.c and one entry of
 * DT_LAYER_LIST in src/nn.h.)
 *
 * The functions are static inline and __host__ __device__ under nvcc (DT_HD), so both
 * backends run the same expression; with no fused multiply-adds on either side
 * (-ffp-contract=off, --fmad=false), the bits differ only where CUDA's expf/erff/tanhf
 * differ from glibc's. The tolerance column states that contract for the op test:
 * 0 = the CUDA backend must match the CPU bit for bit, otherwise the normwise bound.
 */
#ifndef DT_OPS_ELEM_H
#define DT_OPS_ELEM_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifndef DT_HD
#ifdef __CUDACC__
#define DT_HD __host__ __device__
#else
#define DT_HD
#endif
#endif

/* DT_OPS_ELEM(M, X) calls M(X, name, saved, gpu_tol) for every activation, in order.
 * saved: x (backward reads the forward input) or y (the forward output). X is passed
 * through for list builders that expand each row into several entries (ops.h). */
#define DT_OPS_ELEM(M, X) \
    M(X, relu,    y, 0)     /* max(x, 0); dx = dy where y > 0 */ \
    M(X, gelu,    x, 1e-6)  /* exact: x * Phi(x) with erf, as nn.GELU() */ \
    M(X, tanh,    y, 1e-6)  /* dx = dy * (1 - y^2) */ \
    M(X, silu,    x, 1e-6)  /* x * sigmoid(x), as nn.SiLU() */ \
    M(X, sigmoid, y, 1e-6)  /* 1 / (1 + exp(-x)), as nn.Sigmoid(); dx = dy * y * (1 - y) */

static inline DT_HD float dt_relu_fwd(float x) { return x > 0.0f ? x : 0.0f; }
static inline DT_HD float dt_relu_bwd(float dy, float y) { return y > 0.0f ? dy : 0.0f; }

#define DT_SQRT1_2F 0.70710678118654752440f   /* (float)M_SQRT1_2, spelled out: strict C11 has no M_ constants */

/* erf as a rational function of x (odd degree 13 over even degree 8) on x clamped to
 * [-4, 4], where float erf is +-1: plain arithmetic, so the CPU loops vectorise (libm's
 * erff is a scalar call and was a fifth of a GPT step); max error 4.2e-7 (erff: 5e-8),
 * checked in tests/test_nn.c. NaN stays NaN. */
static inline DT_HD float dt_erf(float x) {
    x = x < -4.0f ? -4.0f : x > 4.0f ? 4.0f : x;
    float x2 = x * x;
    float p = -2.72614225801306e-10f;
    p = p * x2 + 2.77068142495902e-08f;
    p = p * x2 + -2.10102402082508e-06f;
    p = p * x2 + -5.69250639462346e-05f;
    p = p * x2 + -7.34990630326855e-04f;
    p = p * x2 + -2.95459980854025e-03f;
    p = p * x2 + -1.60960333262415e-02f;
    float q = -1.45660718464996e-05f;
    q = q * x2 + -2.13374055278905e-04f;
    q = q * x2 + -1.68282697438203e-03f;
    q = q * x2 + -7.37332916720468e-03f;
    q = q * x2 + -1.42647390514189e-02f;
    return x * p / q;
}

/* exp(a) for a <= 0 (arguments below -87 give exp(-87), about the smallest normal
 * float): range reduction by ln 2 (Cody and Waite's two-part constant), a degree-7
 * polynomial, and the power of two built in the exponent bits, with integer
 * arithmetic only, so the CPU loops vectorise; max relative error 1e-7 (expf: 6e-8).
 * NaN stays NaN. */
static inline DT_HD float dt_exp_nonpos(float a) {
    const float magic = 12582912.0f;   /* 1.5 * 2^23: adding it rounds to an integer */
    float c = a < -87.0f ? -87.0f : a;
    float f = c * 1.44269504088896341f + magic, k = f - magic;
    uint32_t fb, mb, sb;
    memcpy(&fb, &f, sizeof fb);
    memcpy(&mb, &magic, sizeof mb);
    float r = c - k * 0.693145751953125f;
    r = r - k * 1.428606765330187e-06f;
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    sb = (fb - mb + 127u) << 23;       /* 2^k: k = fb - mb, an integer in [-126, 0] */
    float s;
    memcpy(&s, &sb, sizeof s);
    return a != a ? a : p * s;
}

static inline DT_HD float dt_gelu_fwd(float x) { return 0.5f * x * (1.0f + dt_erf(x * DT_SQRT1_2F)); }
static inline DT_HD float dt_gelu_bwd(float dy, float x) {
    const float inv_sqrt_2pi = 0.39894228040143267794f;
    float cdf = 0.5f * (1.0f + dt_erf(x * DT_SQRT1_2F));
    float pdf = inv_sqrt_2pi * dt_exp_nonpos(-0.5f * x * x);
    return dy * (cdf + x * pdf);
}

static inline DT_HD float dt_tanh_fwd(float x) { return tanhf(x); }
static inline DT_HD float dt_tanh_bwd(float dy, float y) { return dy * (1.0f - y * y); }

/* exp of a non-positive argument only, so no overflow for any x: for x < 0,
 * 1/(1 + e^-x) = e^x/(1 + e^x). NaN stays NaN. */
static inline DT_HD float dt_sigmoid_fwd(float x) {
    if (x >= 0.0f) return 1.0f / (1.0f + expf(-x));
    float e = expf(x);
    return e / (1.0f + e);
}
/* PyTorch's order: dy * (1 - y) * y */
static inline DT_HD float dt_sigmoid_bwd(float dy, float y) { return dy * (1.0f - y) * y; }

static inline DT_HD float dt_silu_fwd(float x) { return x * dt_sigmoid_fwd(x); }
/* d/dx x*s(x) = s * (1 + x * (1 - s)), PyTorch's formula */
static inline DT_HD float dt_silu_bwd(float dy, float x) {
    float s = dt_sigmoid_fwd(x);
    return dy * s * (1.0f + x * (1.0f - s));
}

#endif /* DT_OPS_ELEM_H */
