/* test_nn.c: finite-difference gradient checks of every layer and loss on the
 * CPU backend.
 *
 * For a layer y = f(x; w) and a fixed random r, the scalar L = sum(r * y) has
 * dL/dx = backward(dy = r) and dL/dw = the layer's parameter gradients. Each is
 * compared with the central difference (L(v + h) - L(v - h)) / 2h, L summed in
 * double from the float forward. Tolerance: |num - ana| <= ATOL + RTOL*|ana|
 * with ATOL = 2e-3, RTOL = 2e-2 (float forward, h = 1e-2 for smooth layers;
 * piecewise layers use inputs kept more than h away from their kinks).
 */
#include "model.h"
#include "nn.h"
#include "ops_elem.h"
#include "rng.h"
#include "tap.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ATOL 2e-3
#define RTOL 2e-2
#define MAXCHECK 120   /* elements checked per tensor (spread evenly) */

static const dt_ops *ops;

typedef struct {
    dt_spec  spec;
    dt_layer *L;
    float   *params, *grads, *buffers;
    dt_nn_ctx c;
    int      B;
} harness;

static float urand(uint64_t stream, uint64_t i) { return 2.0f * dt_rng_unit(1234, stream, i) - 1.0f; }

static int setup(harness *h, const char *text, dt_shape in, int B, int train) {
    memset(h, 0, sizeof *h);
    if (dt_spec_parse(text, &h->spec) != DT_OK || dt_spec_infer(&h->spec, &in) != DT_OK) {
        diag("spec '%s': %s", text, dt_last_error());
        return 0;
    }
    h->L = &h->spec.layers[0];
    size_t np = (size_t)h->spec.nparams;
    h->params = calloc(np + 1, sizeof(float));
    h->grads = calloc(np + 1, sizeof(float));
    h->buffers = calloc(2 * 64 + 1, sizeof(float));
    h->B = B;
    dt_nn_ctx c = { .ops = ops, .params = h->params, .grads = h->grads, .buffers = h->buffers,
                    .train = train, .seed = 99, .epoch = 3, .sample0 = 1000 };
    h->c = c;
    if (dt_layer_alloc(ops, h->L, B) != DT_OK || dt_layer_init(&h->c, h->L) != DT_OK) {
        diag("alloc/init: %s", dt_last_error());
        return 0;
    }
    /* move parameters off their defaults (bn/ln weight 1, bias 0) so every term matters */
    for (size_t i = 0; i < np; i++) h->params[i] += 0.3f * urand(7, i);
    return 1;
}

static void teardown(harness *h) {
    dt_layer_free(ops, h->L);
    free(h->params); free(h->grads); free(h->buffers);
    dt_spec_free(&h->spec);
}

static double objective(harness *h, const float *x, const float *r) {
    if (dt_layer_forward(&h->c, h->L, x, h->B) != DT_OK) return NAN;
    size_t n = (size_t)h->B * (size_t)h->L->out_numel;
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)r[i] * (double)h->L->out_ptr[i];
    return s;
}

/* Compare ana (n) with central differences of the objective over v (n). */
static int compare(harness *h, const float *x, const float *r, float *v, const float *ana, size_t n,
                   float step, double *maxerr) {
    int good = 1;
    size_t stride = n > MAXCHECK ? n / MAXCHECK : 1;
    for (size_t i = 0; i < n; i += stride) {
        float keep = v[i];
        v[i] = keep + step;
        double lp = objective(h, x, r);
        v[i] = keep - step;
        double lm = objective(h, x, r);
        v[i] = keep;
        double num = (lp - lm) / (2.0 * step), err = fabs(num - ana[i]);
        if (err > *maxerr) *maxerr = err;
        if (!(err <= ATOL + RTOL * fabs(ana[i]))) {
            if (good) diag("   element %zu: numeric %.6g, analytic %.6g", i, num, (double)ana[i]);
            good = 0;
        }
    }
    return good;
}

/* Gradient check of one layer on input shape `in` with batch B. x_kind: 0
 * uniform(-1,1); 1 values kept >= 0.05 from 0 (relu); 2 distinct values 0.03
 * apart (maxpool). */
static void check_layer(const char *spec, dt_shape in, int B, int train, int x_kind, float step) {
    harness h;
    char text[128], sh[48];
    dt_shape_str(&in, 1, sh, sizeof sh);
    snprintf(text, sizeof text, "%s on %s%s", spec, sh, train ? "" : " (eval)");
    if (!ok(setup(&h, spec, in, B, train), "%s: setup", text)) return;
    size_t nx = (size_t)B * (size_t)h.L->in_numel, ny = (size_t)B * (size_t)h.L->out_numel;
    float *x = malloc(nx * sizeof(float)), *r = malloc(ny * sizeof(float));
    float *dx = malloc(nx * sizeof(float));
    for (size_t i = 0; i < nx; i++) {
        float u = urand(1, i);
        if (x_kind == 1) u = u < 0 ? u - 0.05f : u + 0.05f;
        if (x_kind == 2) u = 0.03f * (float)((i * 7919) % nx) - 0.015f * (float)nx;
        x[i] = u;
    }
    for (size_t i = 0; i < ny; i++) r[i] = urand(2, i);
    dt_status s = dt_layer_forward(&h.c, h.L, x, B);
    if (s == DT_OK) s = dt_layer_backward(&h.c, h.L, x, r, dx, B);
    if (!ok(s == DT_OK, "%s: forward and backward", text)) diag("%s", dt_last_error());
    /* the analytic gradients are from one pass; later forwards only perturb */
    float *gp = malloc(((size_t)h.spec.nparams + 1) * sizeof(float));
    memcpy(gp, h.grads, (size_t)h.spec.nparams * sizeof(float));
    double ex = 0, ep = 0;
    int good_x = compare(&h, x, r, x, dx, nx, step, &ex);
    ok(good_x, "%s: dL/dx matches central differences (max err %.2g)", text, ex);
    if (h.spec.nparams) {
        int good = compare(&h, x, r, h.params, gp, (size_t)h.spec.nparams, step, &ep);
        ok(good, "%s: dL/dparams match central differences (max err %.2g)", text, ep);
    }
    free(gp); free(x); free(r); free(dx);
    teardown(&h);
}

/* Gradient of a model loss with respect to all parameters, through dt_model. */
static void check_model_loss(const char *spec, const dt_loss *loss, const char *what) {
    dt_shape in = { 1, { 6 } };
    int B = 5;
    dt_model *m = NULL;
    if (!ok(dt_model_build(spec, &in, ops, 5, B, &m) == DT_OK, "%s: build", what)) return;
    float x[30], target[5 * 4];
    int32_t labels[5] = { 0, 3, 1, 3, 2 };
    for (int i = 0; i < 30; i++) x[i] = urand(3, (uint64_t)i);
    for (int i = 0; i < 20; i++) target[i] = urand(4, (uint64_t)i);
    const void *tg = loss->kind == DT_LOSS_CE ? (const void *)labels : (const void *)target;
    float norm = 8.0f, l0;
    dt_model_forward(m, x, B, 1, 0, 0, NULL);
    is_int(dt_model_loss_backward(m, loss, tg, B, norm, &l0), DT_OK, "%s: loss backward", what);
    size_t n = dt_model_nparams(m);
    float *g = malloc(n * sizeof(float)), *p = dt_model_params(m);
    memcpy(g, dt_model_grads(m), n * sizeof(float));
    double maxerr = 0;
    int good = 1;
    for (size_t i = 0; i < n; i++) {
        float keep = p[i], lp, lm, step = 1e-2f;
        p[i] = keep + step;
        dt_model_forward(m, x, B, 1, 0, 0, NULL);
        dt_model_loss(m, loss, tg, B, norm, &lp, NULL);
        p[i] = keep - step;
        dt_model_forward(m, x, B, 1, 0, 0, NULL);
        dt_model_loss(m, loss, tg, B, norm, &lm, NULL);
        p[i] = keep;
        double num = ((double)lp - (double)lm) / (2.0 * step), err = fabs(num - g[i]);
        if (err > maxerr) maxerr = err;
        if (!(err <= 1e-3 + RTOL * fabs(g[i]))) good = 0;
    }
    ok(good, "%s: parameter gradients of the loss match central differences (max err %.2g)", what, maxerr);
    free(g);
    dt_model_free(m);
}

/* A token model (ids in, logits per position out, cross-entropy per position): every
 * parameter's gradient, the tied embedding/head weight included (it sums the gradient
 * of both uses), against central differences of the mean loss over B x T tokens. */
static void check_token_model(const char *spec, const char *what, float step, int small_init) {
    enum { T = 5, B = 3, V = 11 };
    dt_shape in = { 1, { T } };
    dt_model *m = NULL;
    if (!ok(dt_model_build(spec, &in, ops, 5, B, &m) == DT_OK, "%s: build", what)) { diag("%s", dt_last_error()); return; }
    float x[B * T];
    int32_t labels[B * T];
    for (int i = 0; i < B * T; i++) {
        x[i] = (float)((i * 7 + 3) % V);
        labels[i] = (i * 5 + 1) % V;
    }
    dt_loss ce = { DT_LOSS_CE, 0.0f };
    float norm = (float)B, l0;
    dt_model_forward(m, x, B, 1, 0, 0, NULL);
    is_int(dt_model_loss_backward(m, &ce, labels, B, norm, &l0), DT_OK, "%s: loss backward", what);
    size_t n = dt_model_nparams(m);
    float *g = malloc(n * sizeof(float)), *p = dt_model_params(m);
    memcpy(g, dt_model_grads(m), n * sizeof(float));
    double maxerr = 0;
    int good = 1;
    size_t stride = n > 400 ? n / 400 : 1;
    for (size_t i = 0; i < n; i += stride) {
        float keep = p[i], lp, lm;
        p[i] = keep + step;
        dt_model_forward(m, x, B, 1, 0, 0, NULL);
        dt_model_loss(m, &ce, labels, B, norm, &lp, NULL);
        p[i] = keep - step;
        dt_model_forward(m, x, B, 1, 0, 0, NULL);
        dt_model_loss(m, &ce, labels, B, norm, &lm, NULL);
        p[i] = keep;
        double num = ((double)lp - (double)lm) / (2.0 * step), err = fabs(num - g[i]);
        if (err > maxerr) maxerr = err;
        if (!(err <= 1e-3 + RTOL * fabs(g[i]))) {
            if (good) diag("   parameter element %zu: numeric %.6g, analytic %.6g", i, num, (double)g[i]);
            good = 0;
        }
    }
    ok(good, "%s: parameter gradients of the per-token loss match central differences (max err %.2g)", what, maxerr);
    if (small_init)   /* GPT-2's init: logits near 0, every token about equally likely */
        ok(fabsf(l0 - logf((float)V)) < 0.05f, "%s: the initial loss is ln(%d) = 2.398 (got %.4f)", what, V, (double)l0);
    free(g);
    dt_model_free(m);
}

/* attn_forward (and rope before it) against a naive reference: the rotation and the
 * T x T softmax materialised in double, key/value head h / (H/K) for query head h, at
 * several lengths, head counts and key/value head counts K (1, 2, H). Then the inverse
 * rotation undoes the rotation. */
static void check_attention_reference(void) {
    static const struct { int T, H, K, D; float theta; } cfg[] = {
        { 1, 1, 1, 4, 0 }, { 1, 2, 1, 4, 10000 }, { 1, 2, 2, 4, 10000 },
        { 7, 2, 2, 8, 0 }, { 7, 4, 1, 8, 10000 }, { 7, 4, 2, 8, 10000 }, { 7, 4, 4, 8, 500000 },
        { 64, 4, 4, 16, 0 }, { 64, 4, 1, 16, 10000 }, { 64, 4, 2, 16, 10000 }, { 64, 4, 4, 16, 10000 },
        { 257, 3, 3, 8, 0 }, { 257, 6, 2, 8, 10000 }, { 257, 4, 1, 8, 10000 },
    };
    for (size_t k = 0; k < sizeof cfg / sizeof cfg[0]; k++) {
        int T = cfg[k].T, H = cfg[k].H, K = cfg[k].K, D = cfg[k].D, C = H * D, W = (H + 2 * K) * D, B = 2;
        int rep = H / K, half = D / 2;
        size_t nq = (size_t)B * T * W, ny = (size_t)B * T * C;
        float *qkv = malloc(nq * sizeof(float)), *orig = malloc(nq * sizeof(float)), *y = malloc(ny * sizeof(float));
        float *lse = malloc((size_t)B * H * T * sizeof(float));
        double *s = malloc((size_t)T * sizeof(double)), *rot = malloc(nq * sizeof(double));
        for (size_t i = 0; i < nq; i++) orig[i] = qkv[i] = 2.0f * urand(11, i);
        /* the reference rotation of every q and k head, in double */
        for (size_t i = 0; i < nq; i++) rot[i] = orig[i];
        if (cfg[k].theta > 0)
            for (int r = 0; r < B * T; r++)
                for (int hh = 0; hh < H + K; hh++)
                    for (int i = 0; i < half; i++) {
                        double a = (double)(r % T) * pow((double)cfg[k].theta, -2.0 * i / D);
                        size_t o = (size_t)r * W + (size_t)hh * D + (size_t)i;
                        rot[o] = orig[o] * cos(a) - orig[o + half] * sin(a);
                        rot[o + half] = orig[o + half] * cos(a) + orig[o] * sin(a);
                    }
        int good = cfg[k].theta <= 0 || ops->rope(qkv, B, T, H, K, D, cfg[k].theta, 0, 0) == DT_OK;
        good = good && ops->attn_forward(y, lse, qkv, B, T, H, K, D, DT_F32) == DT_OK;
        double maxerr = 0, roterr = 0;
        for (size_t i = 0; good && i < nq; i++)
            if (fabs(qkv[i] - rot[i]) > roterr) roterr = fabs(qkv[i] - rot[i]);
        for (int b = 0; b < B && good; b++)
            for (int h = 0; h < H; h++)
                for (int t = 0; t < T; t++) {
                    const double *q = rot + ((size_t)b * T + t) * W + (size_t)h * D;
                    const size_t ko = (size_t)C + (size_t)(h / rep) * D, vo = (size_t)C + (size_t)(K + h / rep) * D;
                    double m = -INFINITY, l = 0;
                    for (int j = 0; j <= t; j++) {
                        const double *kk = rot + ((size_t)b * T + j) * W + ko;
                        double d = 0;
                        for (int e = 0; e < D; e++) d += q[e] * kk[e];
                        s[j] = d / sqrt((double)D);
                        if (s[j] > m) m = s[j];
                    }
                    for (int j = 0; j <= t; j++) l += exp(s[j] - m);
                    for (int e = 0; e < D; e++) {
                        double acc = 0;
                        for (int j = 0; j <= t; j++) acc += exp(s[j] - m) / l * rot[((size_t)b * T + j) * W + vo + e];
                        double err = fabs(acc - y[((size_t)b * T + t) * C + (size_t)h * D + e]);
                        if (err > maxerr) maxerr = err;
                    }
                    double el = fabs(m + log(l) - lse[((size_t)b * H + h) * T + t]);
                    if (el > maxerr) maxerr = el;
                }
        ok(good && maxerr < 1e-4 && roterr < 1e-5, "attention T=%d, %d heads of %d, %d key/value heads, rope %g: matches "
           "the materialised softmax (max err %.2g, rotation %.2g)", T, H, D, K, (double)cfg[k].theta, maxerr, roterr);
        if (cfg[k].theta > 0) {
            double back = 0;
            good = ops->rope(qkv, B, T, H, K, D, cfg[k].theta, 0, 1) == DT_OK;
            for (size_t i = 0; good && i < nq; i++)
                if (fabs(qkv[i] - orig[i]) > back) back = fabs(qkv[i] - orig[i]);
            ok(good && back < 1e-5, "rope T=%d: the inverse rotation undoes it (max err %.2g)", T, back);
        }
        free(qkv); free(orig); free(y); free(lse); free(s); free(rot);
    }
    /* the operands' dtype is f32, bf16 or f16: another is refused, in both directions */
    float q1[3] = {0.5f, 0.25f, 1.0f}, y1[1], l1[1], d1[3];
    is_int(ops->attn_forward(y1, l1, q1, 1, 1, 1, 1, 1, DT_I32), DT_ERR_INVALID, "attn_forward refuses operands of int32");
    is_int(ops->attn_backward(d1, y1, q1, y1, l1, 1, 1, 1, 1, 1, DT_F64), DT_ERR_INVALID,
           "attn_backward refuses operands of f64");
    is_int(ops->attn_forward(y1, l1, q1, 1, 1, 1, 1, 1, DT_BF16), DT_OK, "attn_forward takes bf16 operands");
}

/* The erf behind GELU (ops_elem.h) against double-precision erf, and GELU itself. */
static void check_erf(void) {
    double maxe = 0, maxg = 0;
    for (double x = -7.0; x <= 7.0; x += 1e-4) {
        float xf = (float)x;
        double e = fabs((double)dt_erf(xf) - erf((double)xf));
        if (e > maxe) maxe = e;
        double g = 0.5 * xf * (1.0 + erf(xf / sqrt(2.0)));
        double eg = fabs((double)dt_gelu_fwd(xf) - g) / (1.0 + fabs(g));   /* absolute near 0, relative beyond */
        if (eg > maxg) maxg = eg;
    }
    ok(maxe < 5e-7, "erf: max error %.3g over [-7, 7] (bound 5e-7)", maxe);
    ok(maxg < 1.5e-6, "gelu: max error %.3g relative to 1 + |gelu(x)| (bound 1.5e-6)", maxg);
    ok(isnan(dt_erf(NAN)) && isnan(dt_gelu_fwd(NAN)), "erf and gelu keep NaN");
    ok(dt_erf(100.0f) == 1.0f && dt_erf(-100.0f) == -1.0f && dt_erf(0.0f) == 0.0f, "erf saturates at +-1, erf(0) = 0");
    double maxx = 0;
    for (double a = -87.0; a <= 0.0; a += 1e-4) {
        float af = (float)a;
        double r = fabs((double)dt_exp_nonpos(af) - exp((double)af)) / exp((double)af);
        if (r > maxx) maxx = r;
    }
    ok(maxx < 2e-7, "exp of non-positive arguments: max relative error %.3g over [-87, 0]", maxx);
    ok(dt_exp_nonpos(0.0f) == 1.0f && isnan(dt_exp_nonpos(NAN)) && dt_exp_nonpos(-1000.0f) > 0.0f &&
       dt_exp_nonpos(-1000.0f) < 2e-38f, "exp(0) = 1, NaN stays NaN, very negative arguments give about 0");
}

/* Values of the losses against a double-precision reference. */
static void check_loss_values(void) {
    dt_shape in = { 1, { 4 } };
    dt_model *m = NULL;
    dt_model_build("tanh", &in, ops, 1, 3, &m);
    float x[12], tg[12];
    int32_t lab[3] = { 2, 0, 3 };
    for (int i = 0; i < 12; i++) { x[i] = urand(5, (uint64_t)i); tg[i] = urand(6, (uint64_t)i); }
    const float *y;
    dt_model_forward(m, x, 3, 1, 0, 0, &y);
    for (int ls = 0; ls < 2; ls++) {
        double eps = ls ? 0.1 : 0.0, ref = 0;
        for (int b = 0; b < 3; b++) {
            double mx = -1e30, z = 0;
            for (int j = 0; j < 4; j++) mx = fmax(mx, y[b * 4 + j]);
            for (int j = 0; j < 4; j++) z += exp(y[b * 4 + j] - mx);
            for (int j = 0; j < 4; j++) {
                double t = (1 - eps) * (j == lab[b]) + eps / 4;
                ref -= t * (y[b * 4 + j] - mx - log(z));
            }
        }
        ref /= 3.0;
        dt_loss ce = { DT_LOSS_CE, (float)eps };
        float l = 0;
        dt_model_loss(m, &ce, lab, 3, 3.0f, &l, NULL);
        ok(fabs(l - ref) < 1e-5, "cross-entropy%s value %g equals reference %g", ls ? " (smoothing 0.1)" : "", (double)l, ref);
    }
    double ref = 0;
    for (int i = 0; i < 12; i++) ref += (y[i] - tg[i]) * (double)(y[i] - tg[i]);
    ref /= 12.0;   /* PyTorch's mean MSE over B*C elements when normaliser = B */
    dt_loss mse = { DT_LOSS_MSE, 0 };
    float l = 0;
    dt_model_loss(m, &mse, tg, 3, 3.0f, &l, NULL);
    ok(fabs(l - ref) < 1e-5, "MSE value %g equals PyTorch's mean reduction %g", (double)l, ref);
    dt_loss bad = { DT_LOSS_CE, 1.5f };
    is_int(dt_model_loss(m, &bad, lab, 3, 3.0f, &l, NULL), DT_ERR_INVALID, "label smoothing above 1 rejected");
    is_int(dt_model_loss(m, &mse, tg, 3, 0.0f, &l, NULL), DT_ERR_INVALID, "normaliser 0 rejected");
    is_int(dt_model_loss(m, &mse, tg, 2, 3.0f, &l, NULL), DT_ERR_INVALID, "loss batch must match the forward");
    dt_model_free(m);
}

/* Dropout: fixed mask from (seed, epoch, sample), scaling, eval identity. */
static void check_dropout(void) {
    harness h;
    dt_shape in = { 1, { 50 } };
    if (!setup(&h, "dropout(0.4)", in, 4, 1)) return;
    float x[200], y1[200];
    for (int i = 0; i < 200; i++) x[i] = 1.0f + urand(8, (uint64_t)i) * 0.5f;
    dt_layer_forward(&h.c, h.L, x, 4);
    memcpy(y1, h.L->out_ptr, sizeof y1);
    int kept = 0, right = 1;
    for (int i = 0; i < 200; i++) {
        int keep = dt_rng_dropout_keep(99, 0, 3, 1000 + (uint64_t)(i / 50), (uint64_t)(i % 50), 0.4f);
        kept += keep;
        float want = keep ? x[i] / 0.6f : 0.0f;
        if (fabsf(y1[i] - want) > 1e-6f * fabsf(want)) right = 0;
    }
    ok(right, "dropout keeps by (seed, stream=index, epoch, sample, element) and scales by 1/(1-p)");
    ok(kept > 90 && kept < 150, "dropout keeps about 60%% (%d of 200)", kept);
    /* the same sample at another batch position gets the same mask */
    h.c.sample0 = 1001;
    dt_layer_forward(&h.c, h.L, x + 50, 1);
    ok(memcmp(h.L->out_ptr, y1 + 50, 50 * sizeof(float)) == 0, "a sample's mask does not depend on its batch position");
    h.c.train = 0;
    dt_layer_forward(&h.c, h.L, x, 4);
    ok(h.L->out_ptr == x, "eval dropout is the identity");
    teardown(&h);
}

/* Every row of the layer table is complete and its name finds it again. */
static void check_rows(void) {
    for (int k = 0; k < DT_LAYER_NKINDS; k++) {
        const dt_layer_def *d = dt_layer_def_of((dt_layer_kind)k);
        const char *missing = dt_layer_def_missing(d);
        ok(missing == NULL, "layer row %d (%s) is complete%s%s", k, d && d->name ? d->name : "?",
           missing ? ": missing " : "", missing ? missing : "");
        if (d && !(d->flags & DT_LDEF_INTERNAL))
            is_int(dt_layer_kind_find(d->name), k, "layer row %s is found by its name", d->name);
        else
            is_int(d ? dt_layer_kind_find(d->name) : 0, -1, "internal row %s cannot be written in a spec",
                   d && d->name ? d->name : "?");
    }
    dt_layer_def broken = *dt_layer_def_of(DT_LAYER_LINEAR);
    broken.backward = NULL;
    is_str(dt_layer_def_missing(&broken), "backward", "a row without backward is reported incomplete");
    broken = *dt_layer_def_of(DT_LAYER_LINEAR);
    broken.self_size = 4;
    ok(dt_layer_def_missing(&broken) != NULL, "an argument outside the kind's struct is reported");
}

int main(void) {
    ops = dt_ops_cpu();
    const dt_shape flat = { 1, { 7 } }, img = { 3, { 3, 6, 5 } }, img2 = { 3, { 2, 5, 6 } }, seq = { 2, { 5, 8 } };
    /* spec, input shape, batch, train, input kind (see check_layer), step */
    static const struct { const char *spec; int shape, B, train, x_kind; float step; } cases[] = {
        { "linear(4)", 0, 3, 1, 0, 1e-2f },
        { "linear(5,bias=0)", 0, 2, 1, 0, 1e-2f },
        { "conv(4,3)", 1, 2, 1, 0, 1e-2f },
        { "conv(3,3,stride=2,pad=1)", 1, 2, 1, 0, 1e-2f },
        { "conv(2,2,stride=1,pad=1,bias=0)", 2, 2, 1, 0, 1e-2f },
        { "maxpool(2)", 1, 2, 1, 2, 1e-3f },
        { "maxpool(3,stride=2,pad=1)", 2, 2, 1, 2, 1e-3f },
        { "avgpool(2)", 1, 2, 1, 0, 1e-2f },
        { "avgpool(3,stride=2,pad=1)", 2, 2, 1, 0, 1e-2f },
        { "gap", 1, 3, 1, 0, 1e-2f },
        { "bn", 0, 6, 1, 0, 1e-2f },                 /* BatchNorm1d, batch statistics */
        { "bn", 1, 3, 1, 0, 1e-2f },                 /* BatchNorm2d */
        { "bn", 1, 3, 0, 0, 1e-2f },                 /* eval mode: running statistics */
        { "ln", 0, 4, 1, 0, 1e-2f },
        { "ln", 2, 2, 1, 0, 1e-2f },
        { "relu", 1, 2, 1, 1, 1e-2f },
        { "gelu", 1, 2, 1, 0, 1e-2f },
        { "tanh", 0, 3, 1, 0, 1e-2f },
        { "silu", 1, 2, 1, 0, 1e-2f },
        { "sigmoid", 0, 3, 1, 0, 1e-2f },
        { "dropout(0.3)", 0, 4, 1, 0, 1e-2f },       /* fixed mask: same (seed, epoch, sample) */
        { "flatten", 1, 2, 1, 0, 1e-2f },
        /* sequences (T = 5, C = 8) */
        { "linear(6)", 3, 2, 1, 0, 1e-2f },
        { "ln", 3, 2, 1, 0, 1e-2f },
        { "pos(7)", 3, 2, 1, 0, 1e-2f },
        { "attn(2)", 3, 2, 1, 0, 1e-2f },
        { "attn(1,std=0.5,proj_std=0.5)", 3, 3, 1, 0, 1e-2f },
        { "attn(8)", 3, 1, 1, 0, 1e-2f },
        { "attn(2,bias=0)", 3, 2, 1, 0, 1e-2f },
        { "attn(4,kv_heads=2,rope=10000,bias=0)", 3, 2, 1, 0, 1e-2f },   /* grouped-query, rotary */
        { "attn(2,kv_heads=1,rope=100,std=0.5,proj_std=0.5)", 3, 2, 1, 0, 1e-2f },   /* with biases */
        { "attn(2,kv_heads=2)", 3, 2, 1, 0, 1e-2f },
        { "attn(1,kv_heads=1,rope=10)", 3, 2, 1, 0, 1e-2f },
        { "rmsnorm", 0, 4, 1, 0, 1e-2f },
        { "rmsnorm(eps=0.1)", 3, 2, 1, 0, 1e-2f },
        { "swiglu(6)", 3, 2, 1, 0, 1e-2f },
        { "swiglu(3,std=0.5)", 0, 3, 1, 0, 1e-2f },
    };
    const dt_shape *shapes[] = { &flat, &img, &img2, &seq };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        check_layer(cases[i].spec, *shapes[cases[i].shape], cases[i].B, cases[i].train, cases[i].x_kind, cases[i].step);
    check_dropout();

    dt_loss ce = { DT_LOSS_CE, 0.0f }, ls = { DT_LOSS_CE, 0.1f }, mse = { DT_LOSS_MSE, 0.0f };
    check_model_loss("linear(4)", &ce, "cross-entropy");
    check_model_loss("linear(4)", &ls, "cross-entropy with label smoothing");
    check_model_loss("linear(4)", &mse, "MSE");
    check_model_loss("linear(5) bn tanh linear(4)", &ce, "linear-bn-tanh-linear through the model");
    /* residual blocks: the gradient reaches the layers before a block through
     * both the skip path and f; nested blocks and seq containers too */
    check_model_loss("linear(5) residual(tanh linear(5)) linear(4)", &ce, "residual block");
    check_model_loss("linear(5) tanh residual(linear(5) bn relu linear(5)) tanh linear(4)", &ce,
                     "residual block with a fused bn-relu inside");
    check_model_loss("linear(6) residual(ln residual(gelu linear(6)) seq(tanh linear(6))) linear(4)", &mse,
                     "nested residual blocks and a seq");
    check_model_loss("residual(linear(6) tanh) linear(4)", &ce, "residual block as the first layer");
    check_rows();
    check_loss_values();
    check_attention_reference();
    check_erf();
    check_token_model("embed(11,8) pos(5) residual(ln attn(2)) residual(ln linear(16) gelu linear(8)) ln unembed",
                      "a one-block GPT with a tied head", 1e-2f, 0);
    /* the preset's weights are small (std 0.02): a smaller step keeps layer norm linear */
    check_token_model("gpt(layers=2,heads=2,dim=8,block=6,vocab=11)", "the gpt preset (2 layers)", 1e-3f, 1);
    check_token_model("llama(layers=2,heads=4,kv_heads=2,dim=8,hidden=12,block=6,vocab=11)",
                      "the llama preset (2 layers, grouped-query, rotary)", 1e-3f, 1);
    return done_testing();
}
