/* test_amp.c: mixed precision — the precision names, GradScaler's update rule on known
 * sequences, the scaler's checkpoint text, and a model in bf16/fp16: its GEMM and
 * convolution inputs rounded (outputs bitwise those of f32 on rounded operands), the
 * rounded weights made again after the parameters change, loss scaling exact, and a
 * token model (attention's 3C-wide operands) through forward and backward. CPU backend. */
#include "amp.h"
#include "cpu/cpu.h"   /* the bf16 kernel's choice and its slice depth */
#include "dtype.h"
#include "lowp.h"    /* dt_lowp_copy_floats */
#include "mem.h"
#include "model.h"
#include "tap.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static void test_names(void) {
    dt_dtype t = DT_U8;
    is_int(dt_precision_parse("fp32", &t), DT_OK, "fp32 parses");
    is_int(t, DT_F32, "fp32 is f32");
    is_int(dt_precision_parse("bf16", &t), DT_OK, "bf16 parses");
    is_int(t, DT_BF16, "bf16 is bf16");
    is_int(dt_precision_parse("fp16", &t), DT_OK, "fp16 parses");
    is_int(t, DT_F16, "fp16 is f16");
    is_str(dt_precision_name(DT_BF16), "bf16", "bf16's name");
    is_str(dt_precision_name(DT_I32), "?", "no precision is i32");
    is_int(dt_precision_parse("half", &t), DT_ERR_INVALID, "'half' is not a precision");
    like(dt_last_error(), "precision: expected fp32, bf16 or fp16, got 'half'", "the message lists the names");
    is_int(dt_precision_parse(NULL, &t), DT_ERR_INVALID, "NULL is not a precision");
    is_int(dt_grad_dtype_parse("bf16", &t), DT_OK, "grad dtype bf16 parses");
    is_int(t, DT_BF16, "grad dtype bf16");
    is_int(dt_grad_dtype_parse("f16", &t), DT_ERR_INVALID, "grad dtype f16 is refused");
    like(dt_last_error(), "grad_dtype: expected f32 or bf16, got 'f16'", "naming the field and the choices");
}

static void test_scaler(void) {
    dt_scaler s;
    dt_scaler_init(&s, NULL);
    ok(s.scale == 65536.0f && s.growth_tracker == 0, "GradScaler's initial state: 2^16, tracker 0");
    is_int(s.o.growth_interval, 2000, "growth interval 2000");
    dt_scaler_update(&s, 1);
    ok(s.scale == 32768.0f && s.growth_tracker == 0, "an inf halves the scale");
    for (int i = 0; i < 1999; i++) dt_scaler_update(&s, 0);
    ok(s.scale == 32768.0f && s.growth_tracker == 1999, "1999 good steps: unchanged, tracker 1999");
    dt_scaler_update(&s, 0);
    ok(s.scale == 65536.0f && s.growth_tracker == 0, "the 2000th good step doubles it and resets the tracker");
    for (int i = 0; i < 1500; i++) dt_scaler_update(&s, 0);
    dt_scaler_update(&s, 1);
    ok(s.scale == 32768.0f && s.growth_tracker == 0, "an inf resets the tracker");
    /* growth stops at f32's largest power of two instead of overflowing to inf */
    dt_scaler_opts o;
    dt_scaler_opts_default(&o);
    o.growth_interval = 1;
    o.init_scale = ldexp(1.0, 126);
    dt_scaler_init(&s, &o);
    dt_scaler_update(&s, 0);
    ok(s.scale == ldexpf(1.0f, 127), "2^126 grows to 2^127");
    dt_scaler_update(&s, 0);
    ok(s.scale == ldexpf(1.0f, 127) && s.growth_tracker == 0, "2^127 x 2 would be inf: kept, tracker reset");
    /* backoff to below f32's normals keeps halving exactly (GradScaler does not clamp) */
    dt_scaler_init(&s, NULL);
    for (int i = 0; i < 16; i++) dt_scaler_update(&s, 1);
    ok(s.scale == 1.0f, "16 overflows in a row bring 2^16 to 1");
    dt_scaler_update(&s, 1);
    ok(s.scale == 0.5f, "and below 1");
}

/* An fp16 trainer state's checkpoint text round-trips; bad texts are refused. */
static void test_scaler_text(const dt_ops *ops) {
    static const dt_shape in = {1, {6, 0, 0}};
    dt_model *m = NULL;
    is_int(dt_model_build("linear(3)", &in, ops, 1, 4, &m), DT_OK, "a tiny model");
    dt_amp *a = NULL, *b = NULL, *f32 = NULL, *bad = NULL;
    is_int(dt_amp_init("fp16", "f32", m, NULL, &a), DT_OK, "fp16 state");
    is_int(dt_amp_init("fp16", NULL, m, NULL, &b), DT_OK, "a second one");
    is_int(dt_amp_init("fp32", NULL, m, NULL, &f32), DT_OK, "an fp32 state");
    is_int(dt_amp_init("fp8", NULL, m, NULL, &bad), DT_ERR_INVALID, "an unknown precision is refused");
    ok(bad == NULL, "and gives no state");
    is_int(dt_amp_init(NULL, "f64", m, NULL, &bad), DT_ERR_INVALID, "an unknown gradient dtype is refused");
    char buf[96];
    dt_amp_scaler_text(f32, buf, sizeof buf);
    is_str(buf, "none", "fp32 has no scaler");
    is_int(dt_amp_restore(a, "1073741824 17 3"), DT_OK, "a scaler state is read");
    ok(dt_amp_scale(a) == 1073741824.0 && dt_amp_skipped(a) == 3, "scale 2^30, 3 skipped");
    dt_amp_scaler_text(a, buf, sizeof buf);
    is_str(buf, "1073741824 17 3", "written back exactly");
    is_int(dt_amp_restore(b, buf), DT_OK, "and read by another");
    ok(dt_amp_scale(b) == 1073741824.0, "the same scale");
    is_int(dt_amp_restore(b, "65536 2000 0"), DT_ERR_FORMAT, "a tracker at the interval is refused");
    is_int(dt_amp_restore(b, "16777217 1 0"), DT_ERR_FORMAT, "a scale that is not an f32 is refused");
    is_int(dt_amp_restore(b, "65536 1"), DT_ERR_FORMAT, "a missing field is refused");
    is_int(dt_amp_restore(b, "65536 1 0 x"), DT_ERR_FORMAT, "trailing text is refused");
    is_int(dt_amp_restore(b, "-2 1 0"), DT_ERR_FORMAT, "a negative scale is refused");
    is_int(dt_amp_restore(b, "inf 1 0"), DT_ERR_FORMAT, "an infinite scale is refused");
    like(dt_last_error(), "loss scaler's state 'inf 1 0'", "the message quotes the text");
    is_int(dt_amp_restore(b, "none"), DT_OK, "'none' keeps the state");
    dt_scaler_opts so;
    dt_scaler_opts_default(&so);
    so.growth_interval = 3;
    is_int(dt_amp_set_scaler(b, &so), DT_OK, "GradScaler's settings can be changed");
    ok(dt_amp_scale(b) == 65536.0, "and the scaler restarts from init_scale");
    is_int(dt_amp_set_scaler(f32, &so), DT_ERR_INVALID, "fp32 has no scaler to set");
    so.growth_factor = 1.0;
    is_int(dt_amp_set_scaler(b, &so), DT_ERR_INVALID, "a growth factor of 1 is refused, as GradScaler does");
    dt_scaler_opts_default(&so);
    so.backoff_factor = 1.0;
    is_int(dt_amp_set_scaler(b, &so), DT_ERR_INVALID, "a backoff factor of 1 is refused");
    dt_amp_free(a);
    dt_amp_free(b);
    dt_amp_free(f32);
    dt_model_free(m);
}

/* round_to is the casts there and back, bit for bit, on the special values (NaN, infinities,
 * overflow to inf in f16, subnormals, ties) and random ones; it refuses other types. */
static void test_round_to(const dt_ops *ops) {
    enum { N = 1 << 18 };
    float *x = malloc(N * sizeof *x), *y = malloc(N * sizeof *y), *z = malloc(N * sizeof *z);
    static const float sp[] = {0.0f, -0.0f, 1.0f, -2.5f, 65504.0f, 65519.0f, 65520.0f, -1e6f, 1e-8f, 6e-8f, 3e-5f,
                               INFINITY, -INFINITY, NAN, -NAN, 3.4e38f, -3.4e38f, 1.00390625f, 1.005859375f,
                               1.00048828125f, 1.0009765625f, -1e-40f, 1.4e-45f};
    srand(11);
    for (int i = 0; i < N; i++) {
        /* random bit patterns, and below 2^-10 by as many (f16's subnormal range and its edge) */
        uint32_t u = ((uint32_t)rand() << 16) ^ (uint32_t)rand();
        if (i & 1) u = (u & 0x80000000u) | (0x30000000u + (u & 0x0fffffffu));
        memcpy(&x[i], &u, 4);
    }
    memcpy(x, sp, sizeof sp);
    for (int k = 0; k < 2; k++) {
        int dt = k ? DT_F16 : DT_BF16, bad = 0, bad_in = 0;
        const char *name = k ? "f16" : "bf16";
        memcpy(z, x, N * sizeof *z);
        is_int(ops->round_to(y, x, N, dt), DT_OK, "round_to %s", name);
        is_int(ops->round_to(z, z, N, dt), DT_OK, "round_to %s in place", name);
        for (int i = 0; i < N; i++) {
            float want = k ? dt_f16_to_f32(dt_f32_to_f16(x[i])) : dt_bf16_to_f32(dt_f32_to_bf16(x[i]));
            bad += memcmp(&want, &y[i], 4) != 0;
            bad_in += memcmp(&want, &z[i], 4) != 0;
        }
        is_int(bad, 0, "round_to %s is the casts there and back, bit for bit (%d values)", name, N);
        is_int(bad_in, 0, "in place too");
    }
    ok(isinf(y[6]) && y[5] == 65504.0f, "f16: 65520 overflows to inf, 65519 rounds to 65504");
    is_int(ops->round_to(y, x, N, DT_F32), DT_ERR_INVALID, "round_to f32 is refused");
    like(dt_last_error(), "round_to: dtype must be bf16 or f16", "naming the kernel");
    is_int(ops->round_to(x + 1, x, 100, DT_BF16), DT_ERR_INVALID, "overlapping arrays are refused");
    int32_t flag = 7;
    is_int(ops->nonfinite(&flag, x + 16, 4), DT_OK, "nonfinite");
    is_int(flag, 0, "finite values: 0");
    is_int(ops->nonfinite(&flag, x, 16), DT_OK, "nonfinite with inf and NaN");
    is_int(flag, 1, "an inf or NaN: 1");
    free(x);
    free(y);
    free(z);
}

static float *rand_vec(size_t n, unsigned seed, float scale) {
    float *v = malloc(n * sizeof *v);
    srand(seed);
    for (size_t i = 0; i < n; i++) v[i] = scale * ((float)rand() / (float)RAND_MAX - 0.5f);
    return v;
}

/* A model in low precision computes what the f32 model computes on rounded operands:
 * for one GEMM (or convolution) layer, bitwise on the f32 kernel; on 16-bit units (whose
 * gemm_lp rounds its operands itself: no weight copy then, unless a convolution needs
 * one) to their order's rounding. */
static void check_rounded(const dt_ops *ops, const char *spec, const dt_shape *in, dt_dtype lp, const char *what) {
    const int B = 5;
    dt_model *a = NULL, *f = NULL;
    int ok_build = dt_model_build(spec, in, ops, 7, B, &a) == DT_OK && dt_model_build(spec, in, ops, 7, B, &f) == DT_OK;
    ok(ok_build, "%s: built", what);
    if (!ok_build) return;
    is_int(dt_model_set_precision(a, lp), DT_OK, "%s: precision %s", what, dt_precision_name(lp));
    is_int(dt_model_precision(a), lp, "%s: the model says so", what);
    size_t before = dt_model_precision_bytes(a);   /* the scratch: the weight copy comes with the first forward */
    int copies = !dt_ops_gemm_lp_rounds(ops, lp) || strstr(spec, "conv");
    size_t nx = (size_t)B * (size_t)dt_shape_numel(in), np = dt_model_nparams(a);
    float *x = rand_vec(nx, 3, 8.0f), *xr = malloc(nx * sizeof *xr);
    ops->round_to(xr, x, nx, lp);
    /* the reference: f32 on rounded inputs and rounded weights (tensors of 2+ dimensions) */
    for (int i = 0; i < dt_model_nparam_tensors(f); i++) {
        dt_tensor_info ti;
        dt_model_param(f, i, &ti);
        if (ti.ndim >= 2) ops->round_to(ti.data, ti.data, (size_t)ti.numel, lp);
    }
    const float *ya = NULL, *yf = NULL;
    size_t ny = (size_t)B * (size_t)dt_shape_numel(dt_model_output_shape(a));
    if (lp == DT_BF16 && dt_cpu_gemm_bf16_on()) {   /* the 16-bit units: the f32 result to their order's rounding */
        is_int(dt_model_forward(f, xr, B, 1, 0, 0, &yf), DT_OK, "%s: f32 forward on rounded operands", what);
        float *keep = malloc(ny * sizeof *keep);
        memcpy(keep, yf, ny * sizeof *keep);
        is_int(dt_model_forward(a, x, B, 1, 0, 0, &ya), DT_OK, "%s: forward on AVX512-BF16", what);
        double worst = 0, top = 0;
        for (size_t i = 0; i < ny; i++) {
            worst = fmax(worst, fabs((double)ya[i] - keep[i]));
            top = fmax(top, fabs((double)keep[i]));
        }
        ok(worst <= 1e-5 * top, "%s: AVX512-BF16 within 1e-5 of the f32 kernel normwise (%.2g of %.3g)", what, worst, top);
        is_int(dt_model_precision_bytes(a) - before, copies ? np * sizeof(float) : 0,
               copies ? "%s: a convolution's weights still rounded into a copy" : "%s: no rounded weight copy", what);
        free(keep);
    }
    /* the kernels are chosen before a model is set to low precision */
    is_int(dt_cpu_gemm_select(DT_CPU_GEMM_OPENBLAS), DT_OK, "%s: GEMMs on the f32 kernel", what);
    is_int(dt_model_set_precision(a, DT_F32), DT_OK, "%s: f32 to change kernels", what);
    is_int(dt_model_set_precision(a, lp), DT_OK, "%s: and %s again", what, dt_precision_name(lp));
    before = dt_model_precision_bytes(a);
    is_int(dt_model_forward(a, x, B, 1, 0, 0, &ya), DT_OK, "%s: low-precision forward", what);
    is_int(dt_model_forward(f, xr, B, 1, 0, 0, &yf), DT_OK, "%s: f32 forward on rounded operands", what);
    ok(memcmp(ya, yf, ny * sizeof(float)) == 0, "%s: outputs bitwise equal", what);
    is_int(dt_model_precision_bytes(a) - before, dt_model_nparams(a) * sizeof(float), "%s: the forward made the rounded weight copy", what);
    /* the parameters change: the next forward rounds them again */
    float *p = dt_model_params(a);
    for (size_t i = 0; i < np; i++) p[i] *= 1.5f;
    memcpy(dt_model_params(f), p, np * sizeof(float));
    for (int i = 0; i < dt_model_nparam_tensors(f); i++) {
        dt_tensor_info ti;
        dt_model_param(f, i, &ti);
        if (ti.ndim >= 2) ops->round_to(ti.data, ti.data, (size_t)ti.numel, lp);
    }
    is_int(dt_model_forward(a, x, B, 1, 0, 0, &ya), DT_OK, "%s: forward after an update", what);
    is_int(dt_model_forward(f, xr, B, 1, 0, 0, &yf), DT_OK, "%s: reference after the update", what);
    ok(memcmp(ya, yf, ny * sizeof(float)) == 0, "%s: the new weights were rounded again", what);
    is_int(dt_cpu_gemm_select(DT_CPU_GEMM_AUTO), DT_OK, "%s: back to the default kernels", what);
    is_int(dt_model_set_precision(a, DT_F32), DT_OK, "%s: back to f32", what);
    is_int(dt_model_precision_bytes(a), 0, "%s: the copy is released", what);
    is_int(dt_model_set_precision(a, DT_I8), DT_ERR_INVALID, "%s: i8 is not a precision", what);
    free(x);
    free(xr);
    dt_model_free(a);
    dt_model_free(f);
}

/* A pipeline's stage (dt_model_precision_partial) holds the rounded copy of what it runs:
 * a range's forward rounds and counts that range's weights only, the whole model's its
 * own, dt_model_precision_keep gives the rest back (counted), and every output is the
 * bits of a model that keeps the whole copy. fp16: the copy is made on every CPU. */
static void test_partial(const dt_ops *ops) {
    const int B = 3;
    static const dt_shape in = {1, {37, 0, 0}};
    const char *spec = "linear(16) relu linear(8) linear(4)";
    dt_model *a = NULL, *f = NULL;
    int built = dt_model_build(spec, &in, ops, 5, B, &a) == DT_OK && dt_model_build(spec, &in, ops, 5, B, &f) == DT_OK;
    ok(built, "partial copy: built");
    if (!built) return;
    dt_model_precision_partial(a);
    is_int(dt_model_set_precision(a, DT_F16), DT_OK, "partial copy: fp16");
    is_int(dt_model_set_precision(f, DT_F16), DT_OK, "partial copy: its whole twin");
    dt_spec sp;
    int parsed = dt_spec_parse(spec, &sp) == DT_OK && dt_spec_infer(&sp, &in) == DT_OK;
    ok(parsed, "partial copy: the spec");
    size_t n = dt_model_nparams(a), lo = 0, hi = 37 * 16 + 16;   /* layer 0: its weight and bias */
    size_t mine = parsed ? dt_lowp_copy_floats(&sp, lo, hi) : 0, all = parsed ? dt_lowp_copy_floats(&sp, 0, n) : 0;
    is_int(mine, 37 * 16, "partial copy: layer 0 holds its weight (not its bias)");
    is_int(all, 37 * 16 + 16 * 8 + 8 * 4, "partial copy: the model holds every weight");
    float *x = rand_vec((size_t)B * 37, 11, 4.0f);
    const float *ya = NULL, *yf = NULL;
    size_t base = dt_model_precision_bytes(a);   /* the scratch */
    is_int(dt_model_forward(f, x, B, 0, 0, 0, &yf), DT_OK, "partial copy: the twin makes its whole copy first");
    dt_mem_stats m0, m1, m2, m3;
    dt_mem_get(&m0);
    dt_model_set_resident(a, lo, hi);
    is_int(dt_model_forward_range(a, 0, 1, x, B, 1, 0, 0, &ya), DT_OK, "partial copy: layer 0's forward");
    dt_mem_get(&m1);
    is_int(dt_model_precision_bytes(a) - base, mine * sizeof(float), "partial copy: holds layer 0's rounded weight");
    is_int(m1.cur[DT_MEM_PARAMS] - m0.cur[DT_MEM_PARAMS], mine * sizeof(float), "partial copy: and counts it");
    is_int(dt_model_forward_range(f, 0, 1, x, B, 1, 0, 0, &yf), DT_OK, "partial copy: the twin's");
    ok(ya && yf && memcmp(ya, yf, (size_t)B * 16 * sizeof(float)) == 0, "partial copy: the same bits");
    dt_model_set_resident(a, 0, n);   /* a stage holding the whole model (an evaluation) */
    is_int(dt_model_forward(a, x, B, 0, 0, 0, &ya), DT_OK, "partial copy: the whole model's forward");
    dt_mem_get(&m2);
    is_int(m2.cur[DT_MEM_PARAMS] - m0.cur[DT_MEM_PARAMS], all * sizeof(float), "partial copy: every weight rounded, counted once");
    is_int(dt_model_forward(f, x, B, 0, 0, 0, &yf), DT_OK, "partial copy: the twin's whole forward");
    ok(ya && yf && memcmp(ya, yf, (size_t)B * 4 * sizeof(float)) == 0, "partial copy: the same bits, whole");
    dt_model_set_resident(a, lo, hi);
    is_int(dt_model_precision_keep(a, lo, hi), DT_OK, "partial copy: back to layer 0");
    dt_mem_get(&m3);
    is_int(m3.cur[DT_MEM_PARAMS], m1.cur[DT_MEM_PARAMS], "partial copy: the rest given back and no longer counted");
    float *p = dt_model_params(a);   /* an update: layer 0 rounded again, in what it kept */
    for (size_t i = 0; i < n; i++) p[i] *= 0.75f;
    memcpy(dt_model_params(f), p, n * sizeof(float));
    dt_model_params_changed(a);
    dt_model_params_changed(f);
    is_int(dt_model_forward_range(a, 0, 1, x, B, 1, 0, 0, &ya), DT_OK, "partial copy: layer 0 after an update");
    is_int(dt_model_forward_range(f, 0, 1, x, B, 1, 0, 0, &yf), DT_OK, "partial copy: the twin's");
    ok(ya && yf && memcmp(ya, yf, (size_t)B * 16 * sizeof(float)) == 0, "partial copy: the same bits after the update");
    dt_mem_get(&m3);
    dt_model_free(a);
    dt_mem_stats m4;
    dt_mem_get(&m4);
    is_int(m3.cur[DT_MEM_PARAMS] - m4.cur[DT_MEM_PARAMS], (n + mine) * sizeof(float),
           "partial copy: freed, its parameters and what its copy held no longer counted");
    dt_model_free(f);
    if (parsed) dt_spec_free(&sp);
    free(x);
}

/* Loss scaling multiplies every gradient by the scale, exactly (a power of two). */
static void test_loss_scale(const dt_ops *ops) {
    static const dt_shape in = {1, {12, 0, 0}};
    const int B = 8;
    dt_model *m = NULL;
    is_int(dt_model_build("linear(16) relu linear(4)", &in, ops, 2, B, &m), DT_OK, "model for loss scaling");
    is_int(dt_model_set_precision(m, DT_F16), DT_OK, "fp16");
    size_t np = dt_model_nparams(m);
    float *x = rand_vec((size_t)B * 12, 5, 2.0f), *g1 = malloc(np * sizeof *g1);
    int32_t y[8] = {0, 1, 2, 3, 0, 1, 2, 3};
    dt_loss lf = {.kind = DT_LOSS_CE};
    float l1 = 0, l2 = 0;
    dt_model_forward(m, x, B, 1, 0, 0, NULL);
    is_int(dt_model_loss_backward(m, &lf, y, B, (float)B, &l1), DT_OK, "backward, scale 1");
    memcpy(g1, dt_model_grads(m), np * sizeof *g1);
    dt_model_set_loss_scale(m, 1024.0f);
    dt_model_forward(m, x, B, 1, 0, 0, NULL);
    is_int(dt_model_loss_backward(m, &lf, y, B, (float)B, &l2), DT_OK, "backward, scale 1024");
    ok(l1 == l2, "the reported loss is unscaled (%g, %g)", (double)l1, (double)l2);
    const float *g2 = dt_model_grads(m);
    size_t exact = 0, near = 0;
    for (size_t i = 0; i < np; i++) {
        exact += g2[i] == 1024.0f * g1[i];
        near += fabsf(g2[i] / 1024.0f - g1[i]) <= 2e-3f * (fabsf(g1[i]) + 1e-4f);
    }
    /* f16 rounding of the scaled gradient differs from that of the unscaled one only where
     * the unscaled one falls into f16's subnormals; here every value is normal */
    ok(near == np, "scaled gradients are the unscaled ones x 1024 to f16's rounding (%zu of %zu)", near, np);
    diag("bitwise x 1024: %zu of %zu", exact, np);
    free(x);
    free(g1);
    dt_model_free(m);
}

/* A token model in bf16: the fused QKV gradient is 3C wide, wider than the layer's input
 * and output; forward and backward run, and the loss is f32's to bf16's precision. */
static void test_token_model(const dt_ops *ops) {
    static const dt_shape in = {1, {16, 0, 0}};
    const int B = 3;
    dt_model *a = NULL, *f = NULL;
    const char *spec = "embed(11,24) pos(16) attn(3) unembed";
    is_int(dt_model_build(spec, &in, ops, 4, B, &a), DT_OK, "token model");
    is_int(dt_model_build(spec, &in, ops, 4, B, &f), DT_OK, "its f32 twin");
    is_int(dt_model_set_precision(a, DT_BF16), DT_OK, "bf16");
    float x[48];
    int32_t y[48];
    for (int i = 0; i < 48; i++) {
        x[i] = (float)((i * 7) % 11);
        y[i] = (i * 5 + 3) % 11;
    }
    dt_loss lf = {.kind = DT_LOSS_CE};
    float la = 0, lf32 = 0;
    is_int(dt_model_forward(a, x, B, 1, 0, 0, NULL), DT_OK, "bf16 forward");
    is_int(dt_model_loss_backward(a, &lf, y, B, (float)B, &la), DT_OK, "bf16 backward");
    dt_model_forward(f, x, B, 1, 0, 0, NULL);
    dt_model_loss_backward(f, &lf, y, B, (float)B, &lf32);
    ok(fabsf(la - lf32) < 0.02f * lf32 && la != lf32, "bf16 loss %.6f is near f32's %.6f and not equal", (double)la,
       (double)lf32);
    size_t np = dt_model_nparams(a), finite = 0;
    const float *ga = dt_model_grads(a), *gf = dt_model_grads(f);
    double num = 0, den = 0;
    for (size_t i = 0; i < np; i++) {
        finite += isfinite(ga[i]) != 0;
        num += ((double)ga[i] - gf[i]) * ((double)ga[i] - gf[i]);
        den += (double)gf[i] * gf[i];
    }
    ok(finite == np, "every bf16 gradient is finite");
    ok(sqrt(num / den) < 0.05, "bf16 gradients within 5%% of f32's (normwise %.4f)", sqrt(num / den));
    dt_model_free(a);
    dt_model_free(f);
}

/* Outputs that only matrix products read, kept in 16 bits (dt_model_opts.act_dtype): the
 * same loss and gradients, bit for bit, as the model that keeps them in f32, in fewer
 * activation bytes (the two f32 scratch lanes are paid once: four blocks outweigh them);
 * a chain of such layers (ln, two linears) included. */
static void test_keep16(const dt_ops *ops) {
    static const struct { const char *spec; dt_shape in; int tokens; } cases[] = {
        {"gpt(layers=2,heads=2,dim=16,block=8,vocab=32)", {1, {8, 0, 0}}, 1},
        {"llama(layers=2,heads=2,dim=16,block=8,vocab=32)", {1, {8, 0, 0}}, 1},
        {"residual(ln linear(48) linear(48) gelu linear(16)) residual(ln linear(48) linear(48) gelu linear(16)) "
         "residual(ln linear(48) linear(48) gelu linear(16)) residual(ln linear(48) linear(48) gelu linear(16)) "
         "ln linear(5)", {1, {16, 0, 0}}, 0},
    };
    const dt_dtype types[] = {DT_BF16, DT_F16};
    enum { B = 3 };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
        for (int t = 0; t < 2; t++) {
            const char *spec = cases[k].spec;
            const char *tn = dt_dtype_name(types[t]);
            dt_model_opts mo;
            dt_model_opts_default(&mo);
            mo.act_dtype = types[t];
            dt_model *h = NULL, *f = NULL;
            int built = dt_model_build_ex(spec, &cases[k].in, ops, 6, B, &mo, &h) == DT_OK &&
                        dt_model_build(spec, &cases[k].in, ops, 6, B, &f) == DT_OK &&
                        dt_model_set_precision(h, types[t]) == DT_OK && dt_model_set_precision(f, types[t]) == DT_OK;
            if (!ok(built, "%s (%s): built twice, 16-bit activations and f32 ones (%s)", spec, tn,
                    built ? "ok" : dt_last_error())) {
                dt_model_free(h);
                dt_model_free(f);
                continue;
            }
            size_t n = (size_t)B * (size_t)dt_shape_numel(&cases[k].in), nl = cases[k].tokens ? n : B;
            float *x = malloc(n * sizeof *x);
            int32_t *y = malloc(nl * sizeof *y);
            for (size_t i = 0; i < n; i++) x[i] = cases[k].tokens ? (float)((i * 7) % 32) : (float)((int)(i * 37 % 19) - 9) / 4.0f;
            for (size_t i = 0; i < nl; i++) y[i] = (int32_t)((i * 5 + 3) % 5);
            dt_loss lf = {.kind = DT_LOSS_CE};
            float lh = -1, l32 = -2;
            int run = dt_model_forward(h, x, B, 1, 0, 0, NULL) == DT_OK &&
                      dt_model_loss_backward(h, &lf, y, B, (float)B, &lh) == DT_OK &&
                      dt_model_forward(f, x, B, 1, 0, 0, NULL) == DT_OK &&
                      dt_model_loss_backward(f, &lf, y, B, (float)B, &l32) == DT_OK;
            ok(run && !memcmp(&lh, &l32, sizeof lh) && !memcmp(dt_model_grads(h), dt_model_grads(f),
                                                               dt_model_nparams(h) * sizeof(float)),
               "%s (%s): the same loss (%.7g) and gradients, bit for bit", spec, tn, (double)lh);
            dt_model_mem mh, mf;
            dt_model_plan_memory(spec, &cases[k].in, B, &mo, &mh);
            dt_model_plan_memory(spec, &cases[k].in, B, NULL, &mf);
            ok(mh.bytes[DT_MEM_ACTS] < mf.bytes[DT_MEM_ACTS], "%s (%s): in fewer activation bytes (%zu < %zu)", spec,
               tn, mh.bytes[DT_MEM_ACTS], mf.bytes[DT_MEM_ACTS]);
            is_int(dt_model_set_precision(h, DT_F32), DT_ERR_INVALID, "%s (%s): and it refuses to run in f32", spec, tn);
            free(x);
            free(y);
            dt_model_free(h);
            dt_model_free(f);
        }
    dt_model_opts mo;
    dt_model_opts_default(&mo);
    mo.act_dtype = DT_BF16;
    dt_model *m = NULL;
    static const dt_shape flat = {1, {4, 0, 0}};
    float x4[8] = {0};
    if (dt_model_build_ex("ln linear(2)", &flat, ops, 1, 2, &mo, &m) == DT_OK) {
        is_int(dt_model_forward(m, x4, 2, 1, 0, 0, NULL), DT_ERR_INVALID,
               "a model built for bf16 activations does not run before its precision is set");
        like(dt_last_error(), "runs in bf16 only", "... saying so");
    }
    dt_model_free(m);
    m = NULL;
    mo.act_dtype = DT_I32;
    is_int(dt_model_build_ex("linear(2)", &flat, ops, 1, 2, &mo, &m), DT_ERR_INVALID, "activations in i32 are refused");
    like(dt_last_error(), "expected f32, bf16 or f16", "... naming the choices");
}

/* ---- the bf16 GEMM on AVX512-BF16 (src/cpu/cpu_gemm_bf16.c) ---- */

static float bf16_at(const float *X, int ld, int trans, int r, int k) {
    return trans ? X[(size_t)k * ld + r] : X[(size_t)r * ld + k];
}

/* The kernel's order as its header states it, one output at a time in scalar code:
 * per slice of DT_CPU_GEMM_BF16_KC, acc += a[2p+1] b[2p+1], then acc += a[2p] b[2p]
 * (products exact, sums rounded, results below FLT_MIN flushed), then C += alpha acc. */
static void model_bf16(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                       int ldb, float beta, float *C, int ldc) {
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            float *c = C + (size_t)i * ldc + j;
            if (beta != 0.0f && beta != 1.0f) *c *= beta;
            for (int k0 = 0; k0 < K; k0 += DT_CPU_GEMM_BF16_KC) {
                int kc = K - k0 < DT_CPU_GEMM_BF16_KC ? K - k0 : DT_CPU_GEMM_BF16_KC;
                volatile float acc = 0.0f;
                for (int k = 0; k < kc; k += 2) {
                    float hi = k + 1 < kc ? bf16_at(A, lda, ta, i, k0 + k + 1) * bf16_at(B, ldb, !tb, j, k0 + k + 1) : 0.0f;
                    float lo = bf16_at(A, lda, ta, i, k0 + k) * bf16_at(B, ldb, !tb, j, k0 + k);
                    acc = acc + hi;
                    if (fabsf(acc) < FLT_MIN) acc = 0.0f * acc;
                    acc = acc + lo;
                    if (fabsf(acc) < FLT_MIN) acc = 0.0f * acc;
                }
                volatile float t = alpha * acc;
                *c = k0 == 0 && beta == 0.0f ? t : *c + t;
            }
        }
}

/* gemm_lp_b16's bad inputs, on whichever kernel runs here */
static void test_gemm_b16_bad(const dt_ops *ops) {
    float A[6] = {1, 2, 3, 4, 5, 6}, C[4] = {0};
    uint16_t B[6] = {0x3f80, 0x4000, 0x4040, 0x3f80, 0x3f80, 0x3f80};
    is_int(ops->gemm_lp_b16(DT_F32, 0, 2, 2, 3, 1.0f, A, 3, B, 2, 0.0f, C, 2), DT_ERR_INVALID, "gemm_lp_b16: f32 is refused");
    is_int(ops->gemm_lp_b16(DT_BF16, 0, 2, 2, 3, 1.0f, A, 3, B, 1, 0.0f, C, 2), DT_ERR_INVALID,
           "gemm_lp_b16: a row stride of B under its width is refused");
    is_int(ops->gemm_lp_b16(DT_BF16, 0, 2, 2, 3, 1.0f, A, 3, NULL, 2, 0.0f, C, 2), DT_ERR_INVALID,
           "gemm_lp_b16: a NULL B is refused");
    is_int(ops->gemm_lp_b16(DT_F16, 0, -1, 2, 3, 1.0f, A, 3, B, 2, 0.0f, C, 2), DT_ERR_INVALID,
           "gemm_lp_b16: a negative size is refused");
    /* B = (1 2; 3 1; 1 1) */
    dt_status st = ops->gemm_lp_b16(DT_BF16, 0, 2, 2, 3, 1.0f, A, 3, B, 2, 0.0f, C, 2);
    ok(st == DT_OK && C[0] == 10 && C[1] == 7 && C[2] == 25 && C[3] == 19,
       "gemm_lp_b16: a 2 x 2 x 3 product of small integers is exact (%g %g %g %g)", C[0], C[1], C[2], C[3]);
}

static void test_gemm_bf16(const dt_ops *ops) {
    if (!dt_cpu_has_avx512bf16()) {
        skip(1, "this CPU has no AVX512-BF16: bf16 products run on the f32 kernel (tested by test_ops)");
        is_int(dt_cpu_gemm_select(DT_CPU_GEMM_AVX512BF16), DT_ERR_UNSUPPORTED, "DT_CPU_GEMM=avx512bf16 is refused here");
        like(dt_last_error(), "no AVX512-BF16", "the refusal names the missing instructions");
        return;
    }
    is_int(dt_cpu_gemm_select(DT_CPU_GEMM_AVX512BF16), DT_OK, "AVX512-BF16 chosen");
    is_str(dt_ops_gemm_name(ops, DT_BF16), "avx512-bf16", "bf16 products are named avx512-bf16");
    is_str(dt_ops_gemm_name(ops, DT_F16), dt_cpu_has_avx512f() ? "avx512" : "openblas", "f16 products stay on the f32 kernel");
    static const int shapes[][3] = {{1, 1, 1}, {37, 45, 2}, {8, 32, 512}, {263, 141, 129}, {130, 70, 1100}, {9, 1031, 33},
                                     {301, 600, 523}};
    static const float ab[][2] = {{1.0f, 0.0f}, {0.7f, 0.3f}, {-1.25f, 1.0f}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        for (int v = 0; v < 4; v++) {
            int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2], ta = v & 1, tb = v >> 1;
            int lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 1, ldc = N + 2;
            size_t na = (size_t)(ta ? K : M) * lda, nb = (size_t)(tb ? N : K) * ldb, nc = (size_t)M * ldc;
            float *A = rand_vec(na, 11 + (unsigned)s, 4.0f), *Bm = rand_vec(nb, 17 + (unsigned)v, 2.0f);
            float *C0 = rand_vec(nc, 23, 1.0f), *C = malloc(nc * sizeof *C), *R = malloc(nc * sizeof *R);
            ops->round_to(A, A, na, DT_BF16);
            ops->round_to(Bm, Bm, nb, DT_BF16);
            const float *al = ab[(s + (size_t)v) % 3];
            memcpy(C, C0, nc * sizeof *C);
            memcpy(R, C0, nc * sizeof *R);
            int st = ops->gemm_lp(DT_BF16, ta, tb, M, N, K, al[0], A, lda, Bm, ldb, al[1], C, ldc);
            model_bf16(ta, tb, M, N, K, al[0], A, lda, Bm, ldb, al[1], R, ldc);
            ok(st == DT_OK && memcmp(C, R, nc * sizeof *C) == 0,
               "bf16 GEMM %dx%dx%d transA=%d transB=%d alpha %g beta %g: bitwise the stated order", M, N, K, ta, tb,
               al[0], al[1]);
            if (!tb) {   /* B held in 16 bits: the same bits */
                uint16_t *B16 = malloc(nb * sizeof *B16);
                ops->f32_to_bf16(B16, Bm, nb);
                memcpy(R, C0, nc * sizeof *R);
                st = ops->gemm_lp_b16(DT_BF16, ta, M, N, K, al[0], A, lda, B16, ldb, al[1], R, ldc);
                ok(st == DT_OK && memcmp(C, R, nc * sizeof *C) == 0, "bf16 GEMM %dx%dx%d transA=%d, B in 16 bits: the "
                   "bits of B in f32", M, N, K, ta);
                free(B16);
            }
            if (M >= 100) {   /* rows apart (micro-batches) are the rows of the whole */
                int m1 = 50;
                memcpy(R, C0, nc * sizeof *R);
                ops->gemm_lp(DT_BF16, ta, tb, m1, N, K, al[0], A, lda, Bm, ldb, al[1], R, ldc);
                ops->gemm_lp(DT_BF16, ta, tb, M - m1, N, K, al[0], ta ? A + m1 : A + (size_t)m1 * lda, lda, Bm, ldb,
                             al[1], R + (size_t)m1 * ldc, ldc);
                ok(memcmp(C, R, nc * sizeof *C) == 0, "bf16 GEMM %dx%dx%d transA=%d transB=%d: rows 0..%d and %d..%d "
                   "apart are the whole product's", M, N, K, ta, tb, m1, m1, M);
            }
            free(A), free(Bm), free(C0), free(C), free(R);
        }
    /* it rounds its operands itself (dt_ops_gemm_lp_rounds): f32 values give the bits of
     * their rounding, subnormals, values that round up to a power of two and to inf too */
    ok(dt_ops_gemm_lp_rounds(ops, DT_BF16) && !dt_ops_gemm_lp_rounds(ops, DT_F16), "gemm_lp rounds bf16 operands itself, not f16");
    {
        const int M = 67, N = 75, K = 301;
        size_t na = (size_t)M * K, nb = (size_t)K * N;
        float *A = rand_vec(na, 5, 6.0f), *Bm = rand_vec(nb, 6, 3.0f), *Ar = malloc(na * sizeof *Ar), *Br = malloc(nb * sizeof *Br);
        float *C = malloc((size_t)M * N * sizeof *C), *R = malloc((size_t)M * N * sizeof *R);
        A[3] = 1e-39f, A[10] = -3e-41f, A[20] = 1.9999999f, Bm[7] = 1e-40f, Bm[9] = 0x1.fffffep+127f;
        A[(size_t)5 * K + 9] = 3.3895e38f;   /* rounds to bf16's largest finite value */
        ops->round_to(Ar, A, na, DT_BF16);
        ops->round_to(Br, Bm, nb, DT_BF16);
        for (int v = 0; v < 2; v++) {   /* row-major B, and B^T */
            const float *b = Bm, *br = Br;
            float *bt = NULL, *btr = NULL;
            if (v) {
                bt = malloc(nb * sizeof *bt), btr = malloc(nb * sizeof *btr);
                for (int k = 0; k < K; k++)
                    for (int j = 0; j < N; j++) bt[(size_t)j * K + k] = Bm[(size_t)k * N + j], btr[(size_t)j * K + k] = Br[(size_t)k * N + j];
                b = bt, br = btr;
            }
            ops->gemm_lp(DT_BF16, 0, v, M, N, K, 1.0f, A, K, b, v ? K : N, 0.0f, C, N);
            ops->gemm_lp(DT_BF16, 0, v, M, N, K, 1.0f, Ar, K, br, v ? K : N, 0.0f, R, N);
            ok(memcmp(C, R, (size_t)M * N * sizeof *C) == 0, "f32 operands give the bits of their bf16 rounding (transB=%d)", v);
            free(bt), free(btr);
        }
        uint16_t *B16 = malloc(nb * sizeof *B16);   /* as a layer keeps its output: the same values in 16 bits */
        ops->f32_to_bf16(B16, Bm, nb);
        ops->gemm_lp_b16(DT_BF16, 0, M, N, K, 1.0f, A, K, B16, N, 0.0f, R, N);
        ops->gemm_lp(DT_BF16, 0, 0, M, N, K, 1.0f, A, K, Bm, N, 0.0f, C, N);
        ok(memcmp(C, R, (size_t)M * N * sizeof *C) == 0, "B in 16 bits (a subnormal, a value rounding to inf): the bits "
           "of B in f32");
        ok(dt_ops_gemm_lp_reads16(ops, DT_BF16) && !dt_ops_gemm_lp_reads16(ops, DT_F16), "gemm_lp_b16 reads bf16 "
           "words directly, not f16");
        free(B16);
        free(A), free(Bm), free(Ar), free(Br), free(C), free(R);
    }
    /* inf and NaN pass through as they would in f32 */
    float A[4] = {1.0f, INFINITY, 2.0f, 0.5f}, Bv[4] = {1.0f, 1.0f, NAN, 1.0f}, C[2] = {0};
    ops->gemm_lp(DT_BF16, 0, 0, 1, 1, 2, 1.0f, A, 2, Bv, 1, 0.0f, C, 1);
    ok(isinf(C[0]), "an inf operand gives inf (%g)", C[0]);
    ops->gemm_lp(DT_BF16, 0, 0, 1, 1, 2, 1.0f, A + 2, 2, Bv + 2, 1, 0.0f, C, 1);
    ok(isnan(C[0]), "a NaN operand gives NaN (%g)", C[0]);
    is_int(dt_cpu_gemm_select(DT_CPU_GEMM_AUTO), DT_OK, "back to auto");
}

int main(void) {
    const dt_ops *ops = dt_ops_cpu();
    test_names();
    test_scaler();
    test_scaler_text(ops);
    test_round_to(ops);
    test_gemm_b16_bad(ops);
    test_gemm_bf16(ops);
    static const dt_shape flat = {1, {37, 0, 0}}, img = {3, {2, 7, 6}};
    check_rounded(ops, "linear(23)", &flat, DT_BF16, "linear bf16");
    check_rounded(ops, "linear(23)", &flat, DT_F16, "linear fp16");
    check_rounded(ops, "conv(4,3,pad=1) flatten", &img, DT_BF16, "conv bf16");
    check_rounded(ops, "conv(4,3,stride=2) flatten", &img, DT_F16, "conv fp16");
    test_loss_scale(ops);
    test_token_model(ops);
    test_keep16(ops);
    test_partial(ops);
    return done_testing();
}
