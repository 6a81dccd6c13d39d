/*
 * test_ops.c: the CPU backend's kernels (all but GEMM, convolution and pooling,
 * which test_conv.c covers) against plain double-precision loops, finite
 * differences and hand-computed values; Philox against Random123's published
 * vectors; casts exhaustively; bad arguments; the tensor helpers; the device
 * registry. Then the table-driven op test (ops_cases.h): the table is complete, and
 * every op of the list gives the same bytes on 1 and on 2 threads (docs/DESIGN.md rule 2).
 */
#include "config.h"
#include "ops_cases.h"
#include "ops_util.h"
#include "rng.h"
#include "tensor.h"

static const dt_ops *ops;

static inline float bits2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t f2bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

/* ---- Philox and random fills ---- */

static void test_rng(void) {
    uint32_t o[4];
    dt_philox_block(0, 0, 0, 0, 0, o);
    ok(o[0] == 0x6627e8d5u && o[1] == 0xe169c58du && o[2] == 0xbc57ac4cu && o[3] == 0x9b00dbd8u,
       "philox4x32-10 known answer: ctr 0, key 0");
    dt_philox_block(0xffffffffffffffffull, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, o);
    ok(o[0] == 0x408f276du && o[1] == 0x41c83b0eu && o[2] == 0xa20bc7c6u && o[3] == 0x6d5451fdu,
       "philox4x32-10 known answer: ctr all ones, key all ones");
    dt_philox_block(0x299f31d0a4093822ull, 0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u, o);
    ok(o[0] == 0xd16cfe09u && o[1] == 0x94fdccebu && o[2] == 0x5001e420u && o[3] == 0x24126ea1u,
       "philox4x32-10 known answer: digits of pi");

    size_t n = 100000;
    float *u = tu_alloc(n), *part = tu_alloc(n);
    ops->rng_uniform(u, n, -2.0f, 3.0f, 42, 7, 0);
    double s = 0, lo = 1e9, hi = -1e9;
    for (size_t i = 0; i < n; i++) { s += u[i]; lo = u[i] < lo ? u[i] : lo; hi = u[i] > hi ? u[i] : hi; }
    ok(lo >= -2.0 && hi < 3.0 && fabs(s / n - 0.5) < 0.03, "rng_uniform(-2, 3): range and mean (mean %.4f)", s / n);
    ok(u[12345] == -2.0f + 5.0f * dt_rng_unit(42, 7, 12345), "rng_uniform element i is dt_rng_unit(seed, stream, i)");
    ops->rng_uniform(part, 1000, -2.0f, 3.0f, 42, 7, 0);
    ops->rng_uniform(part + 1000, n - 1000, -2.0f, 3.0f, 42, 7, 1000);
    ok(memcmp(part, u, n * 4) == 0, "rng_uniform filled in two pieces (offsets) equals one fill");
    ops->rng_uniform(part, n, -2.0f, 3.0f, 42, 8, 0);
    ok(memcmp(part, u, n * 4) != 0, "another stream gives other numbers");
    is_int(ops->rng_uniform(u, 4, 1.0f, 0.0f, 1, 1, 0), DT_ERR_INVALID, "rng_uniform rejects lo > hi");
    free(u); free(part);
}

/* ---- casts ---- */

static void test_casts(void) {
    struct { uint32_t in; uint16_t bf; } bcase[] = {
        {0x3f800000u, 0x3f80}, {0x3f808000u, 0x3f80} /* tie -> even */, {0x3f818000u, 0x3f82} /* tie -> even (up) */,
        {0x3f808001u, 0x3f81}, {0x3f807fffu, 0x3f80}, {0x7f800000u, 0x7f80}, {0xff800000u, 0xff80},
        {0x80000000u, 0x8000}, {0x7f7fffffu, 0x7f80} /* max float rounds to inf */,
    };
    int good = 1;
    for (size_t i = 0; i < sizeof bcase / sizeof bcase[0]; i++) {
        float f = bits2f(bcase[i].in);
        uint16_t h;
        ops->f32_to_bf16(&h, &f, 1);
        if (h != bcase[i].bf) { good = 0; diag("   bf16(0x%08x) = 0x%04x, expected 0x%04x", bcase[i].in, h, bcase[i].bf); }
    }
    ok(good, "f32_to_bf16: rounding to nearest even, infinities, signed zero, overflow");
    float nan = bits2f(0x7fc00001u), snan = bits2f(0x7f800001u);
    uint16_t hn[2];
    float nn[2] = {nan, snan};
    ops->f32_to_bf16(hn, nn, 2);
    ok((hn[0] & 0x7f80) == 0x7f80 && (hn[0] & 0x7f) && (hn[1] & 0x7f80) == 0x7f80 && (hn[1] & 0x7f), "f32_to_bf16 keeps NaN a NaN (even a payload in the low bits)");

    struct { float in; uint16_t h; } hcase[] = {
        {1.0f, 0x3c00}, {-2.0f, 0xc000}, {65504.0f, 0x7bff}, {65519.0f, 0x7bff}, {65520.0f, 0x7c00},
        {1e9f, 0x7c00}, {-INFINITY, 0xfc00}, {0x1p-24f, 0x0001}, {0x1p-25f, 0x0000} /* tie -> even 0 */,
        {0x1.8p-24f, 0x0002} /* tie 1.5 -> 2 */, {0x1.4p-24f, 0x0001}, {0x1p-14f, 0x0400},
        {1.0f + 0x1p-11f, 0x3c00} /* tie -> even */, {1.0f + 0x3p-11f, 0x3c02} /* tie -> even (up) */,
        {0x1.ffcp-15f, 0x0400} /* largest subnormal + half ulp rounds up to the smallest normal */, {-0.0f, 0x8000},
    };
    good = 1;
    for (size_t i = 0; i < sizeof hcase / sizeof hcase[0]; i++) {
        uint16_t h;
        ops->f32_to_f16(&h, &hcase[i].in, 1);
        if (h != hcase[i].h) { good = 0; diag("   f16(%a) = 0x%04x, expected 0x%04x", (double)hcase[i].in, h, hcase[i].h); }
    }
    ok(good, "f32_to_f16: rounding to nearest even, subnormals, overflow to inf");
    ops->f32_to_f16(hn, nn, 2);
    ok((hn[0] & 0x7c00) == 0x7c00 && (hn[0] & 0x3ff) && (hn[1] & 0x7c00) == 0x7c00 && (hn[1] & 0x3ff), "f32_to_f16 keeps NaN a NaN");

    /* Exhaustive: every 16-bit pattern converts to f32 and back to itself (NaNs stay NaN). */
    uint16_t *all = malloc(65536 * 2), *back = malloc(65536 * 2);
    float *wide = tu_alloc(65536);
    for (int i = 0; i < 65536; i++) all[i] = (uint16_t)i;
    int f16ok = 1, bfok = 1;
    ops->f16_to_f32(wide, all, 65536);
    ops->f32_to_f16(back, wide, 65536);
    for (int i = 0; i < 65536; i++) {
        int isnan16 = (i & 0x7c00) == 0x7c00 && (i & 0x3ff);
        if (isnan16 ? !isnan(wide[i]) : back[i] != i) f16ok = 0;
    }
    /* spot values of the widening */
    f16ok &= wide[0x3c00] == 1.0f && wide[0x0001] == 0x1p-24f && wide[0x7bff] == 65504.0f && isinf(wide[0x7c00]) && wide[0xc000] == -2.0f;
    ok(f16ok, "f16 -> f32 -> f16 is the identity on all 65536 patterns; widening is exact");
    ops->bf16_to_f32(wide, all, 65536);
    ops->f32_to_bf16(back, wide, 65536);
    for (int i = 0; i < 65536; i++) {
        int isnanb = (i & 0x7f80) == 0x7f80 && (i & 0x7f);
        if (isnanb ? !isnan(wide[i]) : back[i] != i) bfok = 0;
        if (!isnanb && f2bits(wide[i]) != (uint32_t)i << 16) bfok = 0;
    }
    ok(bfok, "bf16 -> f32 -> bf16 is the identity on all 65536 patterns");
    /* f32 -> f16 against a double-rounding-free reference: nearest of the two neighbours */
    good = 1;
    for (int i = 0; i < 20000 && good; i++) {
        float f = tu_uniform(-70000.0f, 70000.0f) * (i % 3 == 0 ? 1e-5f : 1.0f);
        uint16_t h;
        ops->f32_to_f16(&h, &f, 1);
        float hf;
        ops->f16_to_f32(&hf, &h, 1);
        /* the result must be within half an f16 ulp of f */
        int e = (h >> 10) & 0x1f;
        double ulp = e == 0 ? 0x1p-24 : ldexp(1.0, e - 25);
        if (e != 31 && fabs((double)hf - f) > ulp / 2) { good = 0; diag("   f16(%a) = %a", (double)f, (double)hf); }
        if (e == 31 && fabs(f) < 65520.0f) { good = 0; diag("   f16(%a) overflowed", (double)f); }
    }
    ok(good, "f32_to_f16 of random values is within half an ulp (or overflows only from 65520)");
    free(all); free(back); free(wide);
}

/* ---- bias, activations ---- */

static void test_bias(void) {
    int rows = 300, cols = 130;
    size_t n = (size_t)rows * cols;
    float *y = tu_rand(n), *b = tu_rand(cols), *db = tu_alloc(cols), *y2 = tu_alloc(n);
    double *want = tu_dalloc(n), *wb = tu_dalloc(cols);
    for (size_t i = 0; i < n; i++) want[i] = (double)y[i] + b[i % cols];
    memcpy(y2, y, n * 4);
    ok(ops->bias_add(y2, b, rows, cols) == DT_OK && tu_close(y2, want, n, 1e-7, 1e-7), "bias_add (rows, cols) += b (cols)");
    for (size_t i = 0; i < n; i++) want[i] = want[i] > 0 ? (float)want[i] : 0;
    memcpy(y2, y, n * 4);
    ok(ops->bias_relu(y2, b, rows, cols) == DT_OK && tu_close(y2, want, n, 1e-7, 1e-7), "bias_relu = relu(y + b)");
    for (size_t i = 0; i < n; i++) wb[i % cols] += y[i];
    ok(ops->bias_grad(db, y, rows, cols) == DT_OK && tu_close(db, wb, cols, 1e-6, 1e-6), "bias_grad: column sums");

    is_int(ops->bias_grad(db, y, -1, cols), DT_ERR_INVALID, "bias_grad rejects negative rows");
    like(dt_last_error(), "bias_grad", "and names the kernel");
    free(y); free(b); free(db); free(y2); free(want); free(wb);
}

static void test_activations(void) {
    size_t n = 5000;
    float *x = tu_rand(n), *y = tu_alloc(n), *dy = tu_rand(n), *dx = tu_alloc(n);
    double *w = tu_dalloc(n), *wd = tu_dalloc(n);
    for (size_t i = 0; i < n; i++) x[i] *= 4.0f;
    for (size_t i = 0; i < n; i++) { w[i] = x[i] > 0 ? x[i] : 0; wd[i] = x[i] > 0 ? dy[i] : 0; }
    ok(ops->relu_forward(y, x, n) == DT_OK && tu_close(y, w, n, 0, 0), "relu_forward");
    ok(ops->relu_backward(dx, dy, y, n) == DT_OK && tu_close(dx, wd, n, 0, 0), "relu_backward (from the output)");
    for (size_t i = 0; i < n; i++) {
        double v = x[i];
        w[i] = 0.5 * v * (1.0 + erf(v / sqrt(2.0)));
        wd[i] = dy[i] * (0.5 * (1.0 + erf(v / sqrt(2.0))) + v * exp(-0.5 * v * v) / sqrt(2.0 * M_PI));
    }
    ok(ops->gelu_forward(y, x, n) == DT_OK && tu_close(y, w, n, 1e-6, 1e-6), "gelu_forward (exact erf form)");
    ok(ops->gelu_backward(dx, dy, x, n) == DT_OK && tu_close(dx, wd, n, 1e-5, 1e-6), "gelu_backward");
    /* gelu gradient against finite differences of the double forward */
    int fd = 1;
    for (size_t i = 0; i < 200; i++) {
        double v = x[i], h = 1e-4;
        double g = (0.5 * (v + h) * (1 + erf((v + h) / sqrt(2.0))) - 0.5 * (v - h) * (1 + erf((v - h) / sqrt(2.0)))) / (2 * h);
        if (fabs(g * dy[i] - dx[i]) > 1e-4) fd = 0;
    }
    ok(fd, "gelu_backward matches finite differences");
    for (size_t i = 0; i < n; i++) { w[i] = tanh((double)x[i]); }
    ok(ops->tanh_forward(y, x, n) == DT_OK && tu_close(y, w, n, 1e-6, 1e-7), "tanh_forward");
    for (size_t i = 0; i < n; i++) wd[i] = dy[i] * (1.0 - (double)y[i] * y[i]);
    ok(ops->tanh_backward(dx, dy, y, n) == DT_OK && tu_close(dx, wd, n, 1e-6, 1e-7), "tanh_backward");
    memcpy(y, x, n * 4);
    ok(ops->relu_forward(y, y, n) == DT_OK && y[0] == (x[0] > 0 ? x[0] : 0), "relu_forward in place");

    /* relu, gelu and tanh now come from ops_elem.h: the same bits as the formulas they had */
    int same = 1;
    const float inv_sqrt_2pi = 0.39894228040143267794f;
    ops->relu_forward(y, x, n);
    ops->relu_backward(dx, dy, y, n);
    for (size_t i = 0; i < n; i++) same &= y[i] == (x[i] > 0.0f ? x[i] : 0.0f) && dx[i] == (y[i] > 0.0f ? dy[i] : 0.0f);
    ok(same, "relu forward and backward: bitwise the former kernels' formulas");
    same = 1;
    ops->gelu_forward(y, x, n);
    ops->gelu_backward(dx, dy, x, n);
    for (size_t i = 0; i < n; i++) {
        float v = x[i], cdf = 0.5f * (1.0f + dt_erf(v * (float)M_SQRT1_2)), pdf = inv_sqrt_2pi * dt_exp_nonpos(-0.5f * v * v);
        float fy = 0.5f * v * (1.0f + dt_erf(v * (float)M_SQRT1_2)), fdx = dy[i] * (cdf + v * pdf);
        same &= memcmp(&fy, &y[i], 4) == 0 && memcmp(&fdx, &dx[i], 4) == 0;
    }
    ok(same, "gelu forward and backward: bitwise the formula of ops_elem.h (dt_erf, dt_exp_nonpos)");
    same = 1;
    ops->tanh_forward(y, x, n);
    ops->tanh_backward(dx, dy, y, n);
    for (size_t i = 0; i < n; i++) {
        float fy = tanhf(x[i]), fdx = dy[i] * (1.0f - y[i] * y[i]);
        same &= memcmp(&fy, &y[i], 4) == 0 && memcmp(&fdx, &dx[i], 4) == 0;
    }
    ok(same, "tanh forward and backward: bitwise the former kernels' formulas");
    free(x); free(y); free(dy); free(dx); free(w); free(wd);
}

static double ref_sigmoid(double v) { return 1.0 / (1.0 + exp(-v)); }
static double ref_silu(double v) { return v * ref_sigmoid(v); }

/* silu and sigmoid: against double references, their gradients against finite
 * differences of the double forward, and no overflow at large |x|. */
static void test_silu_sigmoid(void) {
    size_t n = 5003;
    float *x = tu_rand(n), *y = tu_alloc(n), *dy = tu_rand(n), *dx = tu_alloc(n);
    double *w = tu_dalloc(n), *wd = tu_dalloc(n);
    for (size_t i = 0; i < n; i++) x[i] *= 6.0f;
    for (size_t i = 0; i < n; i++) {
        double v = x[i], sg = ref_sigmoid(v);
        w[i] = v * sg;
        wd[i] = dy[i] * sg * (1.0 + v * (1.0 - sg));
    }
    ok(ops->silu_forward(y, x, n) == DT_OK && tu_close(y, w, n, 1e-6, 1e-7), "silu_forward = x * sigmoid(x)");
    ok(ops->silu_backward(dx, dy, x, n) == DT_OK && tu_close(dx, wd, n, 1e-5, 1e-6), "silu_backward (from the input)");
    int fd = 1;
    for (size_t i = 0; i < 300; i++) {
        double v = x[i], h = 1e-4, g = (ref_silu(v + h) - ref_silu(v - h)) / (2 * h);
        if (fabs(g * dy[i] - dx[i]) > 1e-4) { fd = 0; diag("   silu'(%g): fd %g, kernel %g", v, g * dy[i], (double)dx[i]); break; }
    }
    ok(fd, "silu_backward matches finite differences");

    for (size_t i = 0; i < n; i++) { w[i] = ref_sigmoid(x[i]); }
    ok(ops->sigmoid_forward(y, x, n) == DT_OK && tu_close(y, w, n, 1e-6, 1e-7), "sigmoid_forward");
    for (size_t i = 0; i < n; i++) wd[i] = dy[i] * (double)y[i] * (1.0 - (double)y[i]);
    ok(ops->sigmoid_backward(dx, dy, y, n) == DT_OK && tu_close(dx, wd, n, 1e-6, 1e-7), "sigmoid_backward (from the output)");
    fd = 1;
    for (size_t i = 0; i < 300; i++) {
        double v = x[i], h = 1e-4, g = (ref_sigmoid(v + h) - ref_sigmoid(v - h)) / (2 * h);
        if (fabs(g * dy[i] - dx[i]) > 1e-5) { fd = 0; diag("   sigmoid'(%g): fd %g, kernel %g", v, g * dy[i], (double)dx[i]); break; }
    }
    ok(fd, "sigmoid_backward matches finite differences");

    /* large |x|: saturates without inf or NaN (exp is only taken of -|x|) */
    float big[8] = {100.0f, -100.0f, 1e30f, -1e30f, 88.8f, -88.8f, 3.4e38f, -3.4e38f}, sy[8], sd[8], one[8];
    for (int i = 0; i < 8; i++) one[i] = 1.0f;
    int good = ops->sigmoid_forward(sy, big, 8) == DT_OK && ops->sigmoid_backward(sd, one, sy, 8) == DT_OK;
    for (int i = 0; i < 8; i++)
        good &= isfinite(sy[i]) && isfinite(sd[i]) && (big[i] > 0 ? sy[i] == 1.0f : sy[i] >= 0.0f && sy[i] < 1e-38f);
    ok(good, "sigmoid of +-100, +-1e30, +-3.4e38 saturates to 1 or 0 without overflow");
    good = ops->silu_forward(sy, big, 8) == DT_OK && ops->silu_backward(sd, one, big, 8) == DT_OK;
    for (int i = 0; i < 8; i++)
        good &= isfinite(sy[i]) && isfinite(sd[i]) && (big[i] > 0 ? sy[i] == big[i] && sd[i] == 1.0f : fabsf(sy[i]) < 1e-30f);
    ok(good, "silu of +-100, +-1e30, +-3.4e38: x for large x, 0 for very negative x, finite gradients");
    memcpy(y, x, n * 4);
    ops->sigmoid_forward(dx, x, n);
    ok(ops->sigmoid_forward(y, y, n) == DT_OK && memcmp(y, dx, n * 4) == 0, "sigmoid_forward in place");
    is_int(ops->silu_forward(NULL, x, 4), DT_ERR_INVALID, "silu_forward rejects a NULL output");
    like(dt_last_error(), "silu_forward", "naming the kernel");
    free(x); free(y); free(dy); free(dx); free(w); free(wd);
}

/* ---- dropout ---- */

static void test_dropout(void) {
    int rows = 64, cols = 1000;
    size_t n = (size_t)rows * cols;
    float p = 0.3f;
    float *x = tu_rand(n), *y = tu_alloc(n), *dy = tu_rand(n), *dx = tu_alloc(n), *part = tu_alloc(n);
    ok(ops->dropout_forward(y, x, rows, cols, p, 11, 2, 3, 1000) == DT_OK, "dropout_forward runs");
    size_t dropped = 0;
    int match = 1;
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < cols; j++) {
            size_t k = (size_t)i * cols + j;
            int keep = dt_rng_dropout_keep(11, 2, 3, 1000 + i, j, p);
            dropped += !keep;
            if (y[k] != (keep ? x[k] * (1.0f / (1.0f - p)) : 0.0f)) match = 0;
        }
    ok(match, "dropout_forward: kept values scaled by 1/(1-p), mask from (seed, stream, epoch, sample, element)");
    ok(fabs((double)dropped / n - p) < 0.01, "dropout drops about p of the values (%.4f)", (double)dropped / n);
    /* a micro-batch holding rows 40.. of the batch gets the same mask for them */
    ops->dropout_forward(part, x + (size_t)40 * cols, rows - 40, cols, p, 11, 2, 3, 1040);
    ok(memcmp(part, y + (size_t)40 * cols, (size_t)(rows - 40) * cols * 4) == 0,
       "dropout mask of a sample does not depend on the micro-batch holding it");
    ops->dropout_forward(part, x, rows, cols, p, 11, 2, 4, 1000);
    ok(memcmp(part, y, n * 4) != 0, "another epoch gives another mask");
    ops->dropout_backward(dx, dy, rows, cols, p, 11, 2, 3, 1000);
    match = 1;
    for (size_t k = 0; k < n; k++)
        if (dx[k] != (y[k] != 0.0f ? dy[k] * (1.0f / (1.0f - p)) : 0.0f)) match = 0;
    ok(match, "dropout_backward applies the forward mask");
    is_int(ops->dropout_forward(y, x, rows, cols, 1.0f, 1, 1, 1, 0), DT_ERR_INVALID, "dropout rejects p = 1");
    like(dt_last_error(), "drop probability", "with a message naming the probability");
    free(x); free(y); free(dy); free(dx); free(part);
}

/* ---- losses ---- */

static double ref_xent(const float *logits, const int32_t *labels, int B, int C, double ls, double norm) {
    double total = 0;
    for (int i = 0; i < B; i++) {
        if (labels[i] < 0) continue;
        const float *x = logits + (size_t)i * C;
        double mx = x[0], s = 0;
        for (int c = 1; c < C; c++) mx = x[c] > mx ? x[c] : mx;
        for (int c = 0; c < C; c++) s += exp(x[c] - mx);
        double lse = mx + log(s);
        for (int c = 0; c < C; c++) {
            double t = (c == labels[i] ? 1.0 - ls : 0.0) + ls / C;
            total -= t * (x[c] - lse);
        }
    }
    return total / norm;
}

static void test_losses(void) {
    int B = 37, C = 10;
    size_t n = (size_t)B * C;
    float *logits = tu_rand(n), *probs = tu_alloc(n), *d = tu_alloc(n), loss;
    int32_t *labels = malloc(sizeof(int32_t) * B);
    for (int i = 0; i < B; i++) labels[i] = (i * 7) % C;
    labels[5] = -100;   /* ignored */
    for (size_t i = 0; i < n; i++) logits[i] *= 3.0f;
    for (int pass = 0; pass < 2; pass++) {
        float ls = pass ? 0.1f : 0.0f, norm = 64.0f;
        double want = ref_xent(logits, labels, B, C, ls, norm);
        dt_status s = ops->xent_forward(&loss, probs, logits, labels, B, C, ls, norm);
        ok(s == DT_OK && fabs(loss - want) < 1e-6 * fabs(want) + 1e-7, "xent_forward label_smoothing=%g: %.7f vs %.7f", ls, loss, want);
        ops->xent_backward(d, probs, labels, B, C, ls, norm);
        double *fd = tu_dalloc(n);
        for (size_t k = 0; k < n; k++) {
            float keep = logits[k], h = 1e-3f;
            logits[k] = keep + h;
            double lp = ref_xent(logits, labels, B, C, ls, norm);
            logits[k] = keep - h;
            double lm = ref_xent(logits, labels, B, C, ls, norm);
            logits[k] = keep;
            fd[k] = (lp - lm) / (2.0 * (double)h);
        }
        ok(tu_close(d, fd, n, 1e-3, 1e-6), "xent_backward matches finite differences (label_smoothing=%g, one row ignored)", ls);
        free(fd);
    }
    float *inplace = tu_alloc(n);
    memcpy(inplace, probs, n * 4);
    ok(ops->xent_backward(inplace, inplace, labels, B, C, 0.1f, 64.0f) == DT_OK && memcmp(inplace, d, n * 4) == 0,
       "xent_backward in place over probs gives the same bytes");
    /* the softmax over the logits themselves, and the loss alone: the same bytes, a row
     * wider than the loss-alone chunk (1000 classes) among them */
    for (int w = 0; w < 2; w++) {
        int Bw = w ? 5 : B, Cw = w ? 1000 : C;
        size_t nw = (size_t)Bw * Cw;
        float *lg = tu_rand(nw), *pw = tu_alloc(nw), *ip = tu_alloc(nw), l1, l2, l3;
        for (size_t k = 0; k < nw; k++) lg[k] *= 4.0f;
        memcpy(ip, lg, nw * 4);
        dt_status s1 = ops->xent_forward(&l1, pw, lg, labels, Bw, Cw, 0.1f, 64.0f);
        dt_status s2 = ops->xent_forward(&l2, ip, ip, labels, Bw, Cw, 0.1f, 64.0f);
        dt_status s3 = ops->xent_forward(&l3, NULL, lg, labels, Bw, Cw, 0.1f, 64.0f);
        ok(s1 == DT_OK && s2 == DT_OK && memcmp(&l1, &l2, 4) == 0 && memcmp(pw, ip, nw * 4) == 0,
           "xent_forward in place over the logits (%d x %d): the same loss and probabilities", Bw, Cw);
        ok(s3 == DT_OK && memcmp(&l1, &l3, 4) == 0, "xent_forward without probabilities (%d x %d): the same loss "
           "(%.9g, %.9g)", Bw, Cw, (double)l1, (double)l3);
        free(lg); free(pw); free(ip);
    }
    free(inplace);
    int zero = 1;
    for (int c = 0; c < C; c++) zero &= d[5 * C + c] == 0.0f;
    ok(zero, "xent_backward: an ignored row has zero gradient");
    double ps = 0;
    for (int c = 0; c < C; c++) ps += probs[c];
    ok(fabs(ps - 1.0) < 1e-6, "xent_forward: probs of a row sum to 1");
    labels[3] = C;
    is_int(ops->xent_forward(&loss, probs, logits, labels, B, C, 0.0f, 1.0f), DT_ERR_INVALID, "xent_forward rejects a label >= C");
    like(dt_last_error(), "out of range", "naming the bad label");
    labels[3] = 0;

    size_t m = 10007;
    float *pred = tu_rand(m), *tgt = tu_rand(m), *dp = tu_alloc(m);
    double want = 0, *wd = tu_dalloc(m);
    for (size_t i = 0; i < m; i++) { double e = (double)pred[i] - tgt[i]; want += e * e; wd[i] = 2 * e / 5.0; }
    ok(ops->mse_forward(&loss, pred, tgt, m, 5.0f) == DT_OK && fabs(loss - want / 5.0) < 1e-6 * want, "mse_forward");
    ok(ops->mse_backward(dp, pred, tgt, m, 5.0f) == DT_OK && tu_close(dp, wd, m, 1e-6, 1e-7), "mse_backward");
    free(logits); free(probs); free(d); free(labels); free(pred); free(tgt); free(dp); free(wd);
}

/* ---- batch norm and layer norm ---- */

/* Training-mode batch norm in double: y = gamma * (x - mean)/sqrt(var + eps) + beta. */
static void ref_bn(const float *x, const float *g, const float *b, int N, int C, int HW, double eps, double *y) {
    for (int c = 0; c < C; c++) {
        double s = 0, ss = 0, cnt = (double)N * HW;
        for (int n = 0; n < N; n++) for (int i = 0; i < HW; i++) s += x[((size_t)n * C + c) * HW + i];
        double m = s / cnt;
        for (int n = 0; n < N; n++) for (int i = 0; i < HW; i++) { double e = x[((size_t)n * C + c) * HW + i] - m; ss += e * e; }
        double is = 1.0 / sqrt(ss / cnt + eps);
        for (int n = 0; n < N; n++) for (int i = 0; i < HW; i++) {
            size_t k = ((size_t)n * C + c) * HW + i;
            y[k] = g[c] * (x[k] - m) * is + b[c];
        }
    }
}

static void test_batchnorm(void) {
    int N = 6, C = 3, HW = 5;
    size_t n = (size_t)N * C * HW;
    float *x = tu_rand(n), *g = tu_rand(C), *b = tu_rand(C), *y = tu_alloc(n), *dy = tu_rand(n), *dx = tu_alloc(n);
    for (size_t i = 0; i < n; i++) x[i] = x[i] * 2.0f + 0.5f;
    float sum[3], sumsq[3], mean[3], invstd[3], sdy[3], sdyx[3], rm[3] = {0.1f, 0.2f, 0.3f}, rv[3] = {1.0f, 2.0f, 0.5f};
    double ws[3] = {0}, wss[3] = {0}, *wy = tu_dalloc(n);
    for (size_t i = 0; i < n; i++) { ws[(i / HW) % C] += x[i]; wss[(i / HW) % C] += (double)x[i] * x[i]; }
    ok(ops->bn_stats(sum, sumsq, x, N, C, HW) == DT_OK && tu_close(sum, ws, 3, 1e-6, 1e-6) && tu_close(sumsq, wss, 3, 1e-6, 1e-6), "bn_stats: per-channel sum and sum of squares");
    float eps = 1e-5f, mom = 0.1f;
    ok(ops->bn_finalize(mean, invstd, sum, sumsq, C, (int64_t)N * HW, eps, rm, rv, mom) == DT_OK, "bn_finalize");
    int good = 1;
    for (int c = 0; c < C; c++) {
        double cnt = (double)N * HW, m = ws[c] / cnt, var = wss[c] / cnt - m * m;
        good &= fabs(mean[c] - m) < 1e-6 && fabs(invstd[c] - 1.0 / sqrt(var + eps)) < 1e-5 * (1.0 / sqrt(var + eps));
        double wrm = (c == 0 ? 0.1 : c == 1 ? 0.2 : 0.3) * 0.9 + 0.1 * m;
        double wrv = (c == 0 ? 1.0 : c == 1 ? 2.0 : 0.5) * 0.9 + 0.1 * var * cnt / (cnt - 1);
        good &= fabs(rm[c] - wrm) < 1e-6 && fabs(rv[c] - wrv) < 1e-5;
    }
    ok(good, "bn_finalize: mean, invstd and the running stats (unbiased variance, momentum 0.1)");
    ref_bn(x, g, b, N, C, HW, eps, wy);
    ok(ops->bn_apply(y, x, mean, invstd, g, b, N, C, HW, 0) == DT_OK && tu_close(y, wy, n, 1e-5, 1e-5), "bn_apply = training-mode BatchNorm2d");
    /* backward through the statistics, against finite differences of L = sum(dy * y) */
    ops->bn_backward_reduce(sdy, sdyx, dy, x, mean, invstd, N, C, HW);
    ops->bn_backward_dx(dx, dy, x, mean, invstd, g, sdy, sdyx, N, C, HW, (int64_t)N * HW);
    double *fd = tu_dalloc(n), fdg[3], fdb[3];
    for (size_t k = 0; k < n + 2 * C; k++) {
        float *v = k < n ? &x[k] : k < n + C ? &g[k - n] : &b[k - n - C];
        float keep = *v, h = 1e-3f;
        double l[2];
        for (int sgn = 0; sgn < 2; sgn++) {
            *v = keep + (sgn ? -h : h);
            ref_bn(x, g, b, N, C, HW, eps, wy);
            l[sgn] = 0;
            for (size_t i = 0; i < n; i++) l[sgn] += wy[i] * dy[i];
        }
        *v = keep;
        double d = (l[0] - l[1]) / (2.0 * h);
        if (k < n) fd[k] = d; else if (k < n + C) fdg[k - n] = d; else fdb[k - n - C] = d;
    }
    ok(tu_close(dx, fd, n, 2e-3, 2e-4), "bn_backward_dx matches finite differences");
    ok(tu_close(sdyx, fdg, 3, 2e-3, 2e-4), "bn_backward_reduce: sum(dy*xhat) is dgamma");
    ok(tu_close(sdy, fdb, 3, 2e-3, 2e-4), "bn_backward_reduce: sum(dy) is dbeta");
    float rvar[3] = {0.25f, 1.0f, 4.0f}, is2[3];
    ok(ops->bn_invstd(is2, rvar, 3, 0.0f) == DT_OK && is2[0] == 2.0f && is2[1] == 1.0f && is2[2] == 0.5f, "bn_invstd for evaluation");
    ops->bn_apply(y, x, mean, invstd, g, b, N, C, HW, 1);
    good = 1;
    ref_bn(x, g, b, N, C, HW, eps, wy);
    for (size_t i = 0; i < n; i++) good &= fabs(y[i] - (wy[i] > 0 ? wy[i] : 0)) < 1e-5;
    ok(good, "bn_apply with fused relu");
    is_int(ops->bn_finalize(mean, invstd, sum, sumsq, C, 0, eps, NULL, NULL, 0.1f), DT_ERR_INVALID, "bn_finalize rejects count 0");

    free(x); free(g); free(b); free(y); free(dy); free(dx); free(wy); free(fd);
}

static void ref_ln(const float *x, const float *g, const float *b, int rows, int cols, double eps, double *y) {
    for (int i = 0; i < rows; i++) {
        const float *r = x + (size_t)i * cols;
        double m = 0, v = 0;
        for (int j = 0; j < cols; j++) m += r[j];
        m /= cols;
        for (int j = 0; j < cols; j++) v += (r[j] - m) * (r[j] - m);
        double rs = 1.0 / sqrt(v / cols + eps);
        for (int j = 0; j < cols; j++) y[(size_t)i * cols + j] = (r[j] - m) * rs * g[j] + b[j];
    }
}

static void test_layernorm(void) {
    int rows = 5, cols = 70;
    size_t n = (size_t)rows * cols;
    float *x = tu_rand(n), *g = tu_rand(cols), *b = tu_rand(cols), *y = tu_alloc(n), *dy = tu_rand(n), *dx = tu_alloc(n);
    float *dg = tu_alloc(cols), *db = tu_alloc(cols), mean[5], rstd[5];
    double *wy = tu_dalloc(n), *fd = tu_dalloc(n + 2 * cols);
    float eps = 1e-5f;
    ref_ln(x, g, b, rows, cols, eps, wy);
    ok(ops->layernorm_forward(y, mean, rstd, x, g, b, rows, cols, eps) == DT_OK && tu_close(y, wy, n, 1e-5, 1e-5), "layernorm_forward");
    ok(ops->layernorm_backward(dx, dg, db, dy, x, mean, rstd, g, rows, cols) == DT_OK, "layernorm_backward runs");
    for (size_t k = 0; k < n + 2 * (size_t)cols; k++) {
        float *v = k < n ? &x[k] : k < n + cols ? &g[k - n] : &b[k - n - cols];
        float keep = *v, h = 1e-3f;
        double l[2];
        for (int sgn = 0; sgn < 2; sgn++) {
            *v = keep + (sgn ? -h : h);
            ref_ln(x, g, b, rows, cols, eps, wy);
            l[sgn] = 0;
            for (size_t i = 0; i < n; i++) l[sgn] += wy[i] * dy[i];
        }
        *v = keep;
        fd[k] = (l[0] - l[1]) / (2.0 * h);
    }
    ok(tu_close(dx, fd, n, 2e-3, 2e-4), "layernorm_backward dx matches finite differences");
    ok(tu_close(dg, fd + n, cols, 2e-3, 2e-4), "layernorm_backward dgamma matches finite differences");
    ok(tu_close(db, fd + n + cols, cols, 2e-3, 2e-4), "layernorm_backward dbeta matches finite differences");
    free(x); free(g); free(b); free(y); free(dy); free(dx); free(dg); free(db); free(wy); free(fd);
}

/* ---- reductions, metrics, vector ops ---- */

static void test_vector(void) {
    size_t n = 1000003;
    float *x = tu_rand(n), *y = tu_rand(n), *z = tu_alloc(n), ss;
    double wss = 0;
    for (size_t i = 0; i < n; i++) wss += (double)x[i] * x[i];
    ok(ops->sumsq(&ss, x, n) == DT_OK && fabs(ss - wss) <= 1e-6 * wss, "sumsq of 1000003 values");
    ok(ops->sumsq(&ss, x, 0) == DT_OK && ss == 0.0f, "sumsq of nothing is 0");

    double *w = tu_dalloc(n);
    for (size_t i = 0; i < n; i++) w[i] = (double)x[i] + y[i];
    ok(ops->add(z, x, y, n) == DT_OK && tu_close(z, w, n, 1e-7, 0), "add");
    for (size_t i = 0; i < n; i++) w[i] *= -3.0;
    ok(ops->scale(z, -3.0f, n) == DT_OK && tu_close(z, w, n, 1e-6, 1e-7), "scale");
    ops->fill(z, 2.5f, n);
    ok(z[0] == 2.5f && z[n - 1] == 2.5f && z[n / 2] == 2.5f, "fill");

    float logits[12] = {0.1f, 0.9f, 0.3f, 5, 4, 4, 1, 1, 2, -1, -3, -2};
    int32_t lab[4] = {1, 0, 2, 1}, cnt;
    ok(ops->count_correct(&cnt, logits, lab, 4, 3) == DT_OK && cnt == 3, "count_correct (first maximum wins a tie)");
    lab[1] = -100;
    ok(ops->count_correct(&cnt, logits, lab, 4, 3) == DT_OK && cnt == 2, "count_correct skips ignored labels");
    free(x); free(y); free(z); free(w);
}

/* ---- optimizers: two steps by hand ---- */

static void test_optim(void) {
    /* SGD lr 0.1, momentum 0.9, dampening 0, wd 0.01, p = 1, grads 0.5 then -0.25:
     * step 1: g = 0.5 + 0.01*1 = 0.51; buf = 0.51; p = 1 - 0.051 = 0.949
     * step 2: g = -0.25 + 0.00949 = -0.24051; buf = 0.459 - 0.24051 = 0.21849; p = 0.949 - 0.021849 = 0.927151
     * nesterov: step 1: g = 0.51 + 0.9*0.51 = 0.969; p = 0.9031; buf 0.51
     *           step 2: g = -0.25 + 0.009031 = -0.240969; buf = 0.459 - 0.240969 = 0.218031;
     *                   g = -0.240969 + 0.9*0.218031 = -0.0447411; p = 0.9031 + 0.00447411 = 0.90757411 */
    float p[2] = {1.0f, 1.0f}, buf[2], g1[2] = {0.5f, 0.5f}, g2[2] = {-0.25f, -0.25f};
    dt_sgd_args a = {.lr = 0.1, .momentum = 0.9, .dampening = 0.0, .weight_decay = 0.01, .grad_scale = 1.0, .first_step = 1};
    ops->sgd_update(p, g1, buf, 1, &a);
    a.first_step = 0;
    ops->sgd_update(p, g2, buf, 1, &a);
    ok(fabs(p[0] - 0.927151) < 1e-6 && fabs(buf[0] - 0.21849) < 1e-6, "sgd momentum+weight decay, two steps (p %.7f)", p[0]);
    a.nesterov = 1; a.first_step = 1;
    ops->sgd_update(p + 1, g1, buf + 1, 1, &a);
    a.first_step = 0;
    ops->sgd_update(p + 1, g2, buf + 1, 1, &a);
    ok(fabs(p[1] - 0.90757411) < 1e-6, "sgd nesterov, two steps (p %.7f)", p[1]);
    float q = 2.0f, gq = 4.0f;
    dt_sgd_args plain = {.lr = 0.5f, .grad_scale = 0.25f};
    ops->sgd_update(&q, &gq, NULL, 1, &plain);
    ok(q == 1.5f, "plain sgd with grad_scale, no momentum buffer needed");
    dt_sgd_args badn = {.lr = 0.1f, .momentum = 0.0f, .nesterov = 1, .grad_scale = 1.0f};
    is_int(ops->sgd_update(&q, &gq, buf, 1, &badn), DT_ERR_INVALID, "sgd rejects nesterov without momentum (as PyTorch)");

    /* AdamW lr 0.01, betas (0.9, 0.999), eps 1e-8, wd 0.1, p = 1, grads 0.5 then -0.25:
     * step 1: p = 1*(1-0.001) = 0.999; m = 0.05; v = 0.00025; mhat = 0.5; vhat = 0.25;
     *         p = 0.999 - 0.01*0.5/(0.5+1e-8) = 0.989 (approx 0.98900000002)
     * step 2: p = 0.989*0.999 = 0.988011; m = 0.045 - 0.025 = 0.02; v = 0.00024975 + 0.0000625 = 0.00031225
     *         bc1 = 0.19, bc2 = 0.001999; mhat = 0.105263158; vhat = 0.156203102 -> sqrt 0.395225381
     *         p = 0.988011 - 0.01*0.105263158/0.395225381 = 0.988011 - 0.002663371 = 0.985347629 */
    float w = 1.0f, m = 0.0f, v = 0.0f;
    dt_adamw_args ad = {.lr = 0.01, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.1, .grad_scale = 1.0, .step = 1};
    ops->adamw_update(&w, g1, &m, &v, 1, &ad);
    ok(fabs(w - 0.989) < 1e-6, "adamw step 1 (p %.7f)", w);
    ad.step = 2;
    ops->adamw_update(&w, g2, &m, &v, 1, &ad);
    ok(fabs(w - 0.985347629) < 2e-6 && fabs(m - 0.02) < 1e-7 && fabs(v - 0.00031225) < 1e-9, "adamw step 2 (p %.7f, m %.7f, v %.9f)", w, m, v);
    ad.step = 0;
    is_int(ops->adamw_update(&w, g2, &m, &v, 1, &ad), DT_ERR_INVALID, "adamw rejects step 0");
}

/* ---- tensors and the backend table ---- */

static void test_tensor(void) {
    dt_tensor t, v;
    int64_t shape[4] = {2, 3, 4, 5};
    ok(dt_tensor_zeros(&t, ops, DT_F32, 4, shape) == DT_OK && t.numel == 120 && dt_tensor_bytes(&t) == 480 &&
       ((uintptr_t)t.data % 64) == 0 && ((float *)t.data)[119] == 0.0f, "tensor zeros: 120 f32, 64-byte aligned");
    char buf[64];
    is_str(dt_tensor_str(&t, buf, sizeof buf), "f32[2, 3, 4, 5]", "tensor_str");
    int64_t vs[2] = {3, 20};
    ok(dt_tensor_view(&v, &t, 60, 2, vs) == DT_OK && v.data == (float *)t.data + 60 && !v.owns, "view of the second sample");
    int64_t big[1] = {61};
    is_int(dt_tensor_view(&v, &t, 60, 1, big), DT_ERR_INVALID, "a view past the end is rejected");
    like(dt_last_error(), "do not fit", "with a message saying so");
    float host[120];
    for (int i = 0; i < 120; i++) host[i] = (float)i;
    ok(dt_tensor_from_host(&t, host, sizeof host) == DT_OK && ((float *)t.data)[77] == 77.0f, "from_host");
    is_int(dt_tensor_from_host(&t, host, 4), DT_ERR_INVALID, "from_host with the wrong size is rejected");
    int64_t neg[1] = {-1};
    is_int(dt_tensor_alloc(&v, ops, DT_F32, 1, neg), DT_ERR_INVALID, "a negative dimension is rejected");
    dt_tensor w2, small;
    int64_t s2[2] = {4, 30}, s3[1] = {7};
    ok(dt_tensor_alloc(&w2, ops, DT_F32, 2, s2) == DT_OK && dt_tensor_copy(&w2, &t) == DT_OK &&
       memcmp(w2.data, host, sizeof host) == 0, "tensor_copy between shapes of the same size");
    ok(dt_tensor_alloc(&small, ops, DT_F32, 1, s3) == DT_OK, "alloc 7 floats");
    is_int(dt_tensor_copy(&small, &t), DT_ERR_INVALID, "tensor_copy of different sizes is rejected");
    is_int(dt_tensor_wrap(&v, ops, NULL, DT_F32, 1, s3), DT_ERR_INVALID, "wrapping NULL data is rejected");
    ok(dt_tensor_wrap(&v, ops, host, DT_F32, 1, s3) == DT_OK && v.data == host && !v.owns, "wrap host memory");
    dt_tensor_free(&v);
    ok(host[0] == 0.0f, "freeing a wrapped tensor leaves its memory alone");
    dt_tensor_free(&w2);
    dt_tensor_free(&small);
    dt_tensor_free(&t);
    ok(t.data == NULL && t.numel == 0, "tensor_free empties the tensor");
    is_int(ops->alloc(NULL, 16), DT_ERR_INVALID, "alloc with a NULL result pointer is rejected");
    void *none = &t;
    ok(ops->alloc(&none, 0) == DT_OK && none == NULL, "alloc of 0 bytes gives NULL");
    float lossv, pr[2] = {0.5f, 0.5f};
    int32_t lb = 0;
    is_int(ops->xent_forward(&lossv, pr, pr, &lb, 1, 2, 0.0f, 0.0f), DT_ERR_INVALID, "xent_forward rejects norm 0");
    is_int(ops->layernorm_forward(pr, pr, pr, pr, NULL, NULL, 1, 0, 1e-5f), DT_ERR_INVALID, "layernorm_forward rejects 0 columns");

    ok(dt_ops_get("cpu") == dt_ops_cpu(), "dt_ops_get(\"cpu\")");
    const dt_ops *cuda = dt_ops_get("cuda");
#ifdef DT_HAVE_CUDA
    if (cuda) {
        is_str(cuda->name, "cuda", "dt_ops_get(\"cuda\") gives the CUDA table in a CUDA build");
        ok(1, "(a CUDA device is usable)");
    } else {
        ok(1, "dt_ops_get(\"cuda\") in a CUDA build without a usable device is NULL");
        ok(dt_last_error()[0] != '\0', "and says why: %s", dt_last_error());
    }
#else
    ok(cuda == NULL, "dt_ops_get(\"cuda\") is NULL in a build without CUDA");
    like(dt_last_error(), "no CUDA backend", "and says why");
#endif
    ok(dt_ops_get("tpu") == NULL, "an unknown device is NULL");
    like(dt_last_error(), "unknown device \"tpu\"", "naming it");
    ok(dt_ops_get(NULL) == NULL, "no device name is NULL too");
    dt_device_opts o = {.index = 3, .allow_tf32 = 1};
    ok(dt_ops_get_ex("cpu", &o) == dt_ops_cpu(), "dt_ops_get_ex(\"cpu\") ignores the device options");
    o.index = -1;
    ok(dt_ops_get_ex("cpu", &o) == NULL, "a negative device index is rejected");
    like(dt_last_error(), "index -1", "naming it");
    /* the debugging variables the programs read for the device */
    dt_device_opts e = {.index = 1};
    setenv("DT_CUDA_SYNC", "1", 1);
    setenv("DT_CU_MAX_BLOCKS", "7", 1);
    ok(dt_device_opts_env(&e) == DT_OK && e.sync == 1 && e.max_blocks == 7 && e.index == 1,
       "dt_device_opts_env: DT_CUDA_SYNC=1 and DT_CU_MAX_BLOCKS=7, the rest untouched");
    const char *bad[] = {"0", "-3", "7x", "", "99999999999"};
    for (int i = 0; i < 5; i++) {
        setenv("DT_CU_MAX_BLOCKS", bad[i], 1);
        e.max_blocks = 7;
        dt_status st = dt_device_opts_env(&e);
        int good = bad[i][0] ? st == DT_ERR_INVALID && strstr(dt_last_error(), "DT_CU_MAX_BLOCKS") != NULL
                             : st == DT_OK && e.max_blocks == 7;
        ok(good, "DT_CU_MAX_BLOCKS='%s' is %s", bad[i], bad[i][0] ? "refused, naming the variable" : "unset");
    }
    unsetenv("DT_CU_MAX_BLOCKS");
    setenv("DT_CUDA_SYNC", "yes", 1);
    ok(dt_device_opts_env(&e) == DT_ERR_INVALID && strstr(dt_last_error(), "DT_CUDA_SYNC='yes'"),
       "DT_CUDA_SYNC=yes is refused, naming it");
    unsetenv("DT_CUDA_SYNC");
    /* the CUDA memory switches: sparse allocations and the convolution's kept columns */
    dt_device_opts m = {0};
    ok(dt_device_opts_env(&m) == DT_OK && m.no_vmm == 0 && m.conv_cache_mb == 0,
       "unset, DT_CUDA_VMM and DT_CUDA_CONV_CACHE_MB leave the defaults (0)");
    setenv("DT_CUDA_VMM", "0", 1);
    setenv("DT_CUDA_CONV_CACHE_MB", "0", 1);
    ok(dt_device_opts_env(&m) == DT_OK && m.no_vmm == 1 && m.conv_cache_mb < 0,
       "DT_CUDA_VMM=0 sets no_vmm; DT_CUDA_CONV_CACHE_MB=0 keeps no columns (conv_cache_mb < 0)");
    setenv("DT_CUDA_VMM", "1", 1);
    setenv("DT_CUDA_CONV_CACHE_MB", "64", 1);
    ok(dt_device_opts_env(&m) == DT_OK && m.no_vmm == 0 && m.conv_cache_mb == 64,
       "DT_CUDA_VMM=1 clears it; DT_CUDA_CONV_CACHE_MB=64 is 64 MiB");
    const char *badvmm[] = {"yes", "2", "off", " 1"};
    for (int i = 0; i < 4; i++) {
        setenv("DT_CUDA_VMM", badvmm[i], 1);
        char want[64];
        snprintf(want, sizeof want, "DT_CUDA_VMM='%s'", badvmm[i]);
        ok(dt_device_opts_env(&m) == DT_ERR_INVALID && strstr(dt_last_error(), want) && m.no_vmm == 0,
           "DT_CUDA_VMM='%s' is refused, naming it, and changes nothing", badvmm[i]);
    }
    unsetenv("DT_CUDA_VMM");
    const char *badcache[] = {"-1", "1.5", "64M", "x", "9999999999999"};
    for (int i = 0; i < 5; i++) {
        setenv("DT_CUDA_CONV_CACHE_MB", badcache[i], 1);
        ok(dt_device_opts_env(&m) == DT_ERR_INVALID && strstr(dt_last_error(), "DT_CUDA_CONV_CACHE_MB") &&
               m.conv_cache_mb == 64,
           "DT_CUDA_CONV_CACHE_MB='%s' is refused, naming it, and changes nothing", badcache[i]);
    }
    unsetenv("DT_CUDA_CONV_CACHE_MB");
    char about[64] = "x";
    ok(dt_ops_describe(ops, about, sizeof about) == DT_OK && about[0] == 0, "dt_ops_describe of the cpu is empty");
    is_int(ops->set_threads(0), DT_ERR_INVALID, "set_threads(0) is rejected");
    is_int(ops->set_threads(2), DT_OK, "set_threads(2)");
}

/* ---- the op list and the table-driven op test ---- */

static void test_table(void) {
    tc_check_complete(ops);
    int names = DT_OPS_COUNT > 0 && dt_ops_op_name(-1) == NULL && dt_ops_op_name(DT_OPS_COUNT) == NULL;
    for (int i = 0; i < DT_OPS_COUNT; i++) {
        if (!dt_ops_op_name(i) || strcmp(dt_ops_op_name(i), tc_cases[i].name) != 0) names = 0;
        for (int j = 0; j < i; j++)
            if (dt_ops_op_name(j) && dt_ops_op_name(i) && strcmp(dt_ops_op_name(i), dt_ops_op_name(j)) == 0) names = 0;
    }
    ok(names, "dt_ops_op_name: %d distinct names, in the order of the case table", DT_OPS_COUNT);
    is_str(dt_ops_op_name(DT_OP_silu_backward), "silu_backward", "DT_OP_<name> indexes the names");

    /* every op on 1 and on 2 threads: the same bytes (docs/DESIGN.md rule 2) */
    for (int i = 0; i < DT_OPS_COUNT; i++) {
        const tc_case *c = &tc_cases[i];
        tc_run one, two;
        char why[300] = "";
        double worst;
        ops->set_threads(1);
        dt_status s1 = tc_exec(c, ops, &one);
        ops->set_threads(2);
        dt_status s2 = tc_exec(c, ops, &two);
        int good = s1 == DT_OK && s2 == DT_OK && tc_all_written(&one, why, sizeof why) &&
                   tc_same(&one, &two, 1, why, sizeof why, &worst);
        ok(good, "%s: every output written, 1 and 2 threads give the same bytes (%d outputs)", c->name, one.nout);
        if (s1 != DT_OK) diag("   1 thread: %s", one.error);
        if (s2 != DT_OK) diag("   2 threads: %s", two.error);
        if (why[0]) diag("   %s", why);
        tc_result_free(&one);
        tc_result_free(&two);
    }
}

int main(void) {
    ops = dt_ops_get("cpu");
    if (!ops) { printf("Bail out! no cpu backend: %s\n", dt_last_error()); return 1; }
    test_rng();
    test_casts();
    test_bias();
    test_activations();
    test_silu_sigmoid();
    test_dropout();
    test_losses();
    test_batchnorm();
    test_layernorm();
    test_vector();
    test_optim();
    test_tensor();
    test_table();
    return done_testing();
}
