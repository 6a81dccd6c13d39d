/*
 * layers.c: the rows of the layer table — linear, convolution, pooling,
 * activations, the gated MLP (swiglu), dropout, flatten and the residual block (normalisation rows
 * are in layers_norm.c).
 *
 * Each row says how its kind is written (argument schema), what shape it
 * produces and which parameters it has (infer declares them with their
 * PyTorch names and layouts), how PyTorch initialises them, and its forward
 * and backward over the dt_ops table. Layouts are PyTorch's: activations
 * (B, C, H, W) or (B, F); linear weight (out, in); conv weight (out, in, k, k).
 */
#include "layers.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

#define POSITIVE  1, 1e9, 0
#define NONNEG    0, 1e9, 0

/* ---- shared pieces -------------------------------------------------------- */

/* kaiming_uniform(a=sqrt(5)) reduces to U(-1/sqrt(fan_in), 1/sqrt(fan_in)); the
 * bias uses the same bound. Streams: the parameter's index in the model. */
static dt_status init_fan_in(const dt_nn_ctx *c, dt_layer *L, int out) {
    float *w = dt_layer_tensor_ptr(c, L, 0), *b = dt_layer_tensor_ptr(c, L, 1);
    double fan_in = (double)L->t[0].numel / (double)out;
    float bound = (float)(1.0 / sqrt(fan_in));
    DT_TRY(c->ops->rng_uniform(w, (size_t)L->t[0].numel, -bound, bound, c->seed, (uint64_t)L->first_param, 0));
    if (b) DT_TRY(c->ops->rng_uniform(b, (size_t)L->t[1].numel, -bound, bound, c->seed,
                                      (uint64_t)L->first_param + 1, 0));
    return DT_OK;
}

/* Output size of a window op along one dimension, 0 when it does not fit. */
static int64_t window_out(int64_t in, int k, int stride, int pad) {
    int64_t span = in + 2 * (int64_t)pad - k;
    return span < 0 ? 0 : span / stride + 1;
}

/* (C, H, W) -> (C', H', W') of a k x k window with stride and pad. */
static dt_status window_infer(dt_layer *L, const char *what, int64_t channels, int k, int stride, int pad,
                              dt_shape *out) {
    if (L->in.ndim != 3) return layer_shape_error(L, what, "");
    *out = L->in;
    out->d[0] = channels;
    out->d[1] = window_out(L->in.d[1], k, stride, pad);
    out->d[2] = window_out(L->in.d[2], k, stride, pad);
    if (out->d[1] <= 0 || out->d[2] <= 0) {
        char sh[64];
        dt_shape_str(&L->in, 1, sh, sizeof sh);
        return dt_error(DT_ERR_INVALID, "model spec: layer %s '%s': output would be empty for input %s "
                        "(kernel %d, stride %d, pad %d); use a smaller kernel or more padding",
                        L->name, L->text, sh, k, stride, pad);
    }
    return DT_OK;
}

/* ---- linear ---------------------------------------------------------------
 * On the last dimension: (F) -> (out), or (T, F) -> (T, out) for sequences (the
 * rows of all samples go through one GEMM). */

typedef struct { int out, bias; float std; } linear_self;

static const dt_arg_def linear_args[] = {
    { "out",  DT_ARG_INT,   offsetof(linear_self, out),  1, 0, POSITIVE, "'out' expects a positive integer" },
    { "bias", DT_ARG_BOOL,  offsetof(linear_self, bias), 0, 1, 0, 1, 0,  "'bias' expects 0 or 1" },
    { "std",  DT_ARG_FLOAT, offsetof(linear_self, std),  0, 0, 0, 1e3, 0,
      "'std' expects 0 (PyTorch's default init) or the standard deviation of a normal init (bias zero)" },
    { 0 }
};

/* features of the last dimension, and rows per sample */
static int64_t last_dim(const dt_layer *L) { return L->in.d[L->in.ndim - 1]; }
static int64_t rows_per_sample(const dt_layer *L) { return L->in_numel / last_dim(L); }

static dt_status linear_infer(dt_layer *L, dt_shape *out) {
    linear_self *s = LAYER_SELF(linear_self, L);
    if (L->in.ndim == 3)
        return layer_shape_error(L, "linear expects a flat (B, features) or (B, T, features) input",
                                 "; add 'flatten' before it");
    *out = L->in;
    out->d[out->ndim - 1] = s->out;
    DT_TRY(dt_layer_tensor_add(L, "weight", DT_TENSOR_PARAM, NULL, 2, (int64_t[]){ s->out, last_dim(L) }));
    if (s->bias) DT_TRY(dt_layer_tensor_add(L, "bias", DT_TENSOR_PARAM, NULL, 1, (int64_t[]){ s->out }));
    return DT_OK;
}

dt_status layer_init_normal(const dt_nn_ctx *c, dt_layer *L, int t, float std) {
    return c->ops->rng_normal(dt_layer_tensor_ptr(c, L, t), (size_t)L->t[t].numel, 0.0f, std, c->seed,
                              (uint64_t)L->first_param + (uint64_t)t, 0);
}

static dt_status linear_init(const dt_nn_ctx *c, dt_layer *L) {
    linear_self *s = LAYER_SELF(linear_self, L);
    if (s->std <= 0.0f) return init_fan_in(c, L, s->out);
    DT_TRY(layer_init_normal(c, L, 0, s->std));   /* GPT-2's init: normal weights, zero bias */
    return s->bias ? c->ops->fill(dt_layer_tensor_ptr(c, L, 1), 0.0f, (size_t)s->out) : DT_OK;
}

dt_status layer_linear_forward(const dt_nn_ctx *c, float *y, const float *x, const float *w, const float *b,
                               int rows, int in, int out, int relu) {
    const dt_ops *o = c->ops;
    /* y (rows, out) = x (rows, in) @ W^T (in, out) + b; in low precision x and W rounded */
    DT_TRY(layer_lp_gemm_operand(c, 0, &x, (size_t)rows * (size_t)in));
    DT_TRY(layer_gemm(c, 0, 1, rows, out, in, x, in, layer_lp_gemm_weight(c, w), in, y, out));
    if (b) return relu ? o->bias_relu(y, b, rows, out) : o->bias_add(y, b, rows, out);
    return relu ? o->relu_forward(y, y, (size_t)rows * (size_t)out) : DT_OK;
}

dt_status layer_linear_backward(const dt_nn_ctx *c, float *dx, float *dw, float *db, const float *dy, const float *x,
                                const float *w, int rows, int in, int out) {
    /* in low precision every GEMM operand rounded: dy, the saved x, W (dy for the bias
     * gradient too, which sums it rounded, as autocast's bf16 output gradient) */
    if (db || !c->lp_gemm_rounds) DT_TRY(layer_lp_operand(c, 0, &dy, (size_t)rows * (size_t)out));
    return layer_linear_backward_rounded(c, dx, dw, db, dy, x, w, rows, in, out);
}

dt_status layer_linear_backward_rounded(const dt_nn_ctx *c, float *dx, float *dw, float *db, const float *dy,
                                        const float *x, const float *w, int rows, int in, int out) {
    /* dW (out, in) = dy^T (out, rows) @ x (rows, in); db (out) = column sums of dy */
    if (dw && c->in16 && x == c->in16_of)   /* the layer's input, kept in 16 bits */
        DT_TRY(c->ops->gemm_lp_b16(c->lp, 1, out, in, rows, 1.0f, dy, out, c->in16, in, 0.0f, dw, in));
    else if (dw) {
        DT_TRY(layer_lp_gemm_operand(c, 1, &x, (size_t)rows * (size_t)in));
        DT_TRY(layer_gemm(c, 1, 0, out, in, rows, dy, out, x, in, dw, in));
    }
    if (db) DT_TRY(c->ops->bias_grad(db, dy, rows, out));
    /* dx (rows, in) = dy (rows, out) @ W (out, in) */
    if (dx) DT_TRY(layer_gemm(c, 0, 0, rows, in, out, dy, out, layer_lp_gemm_weight(c, w), in, dx, in));
    return DT_OK;
}

static dt_status linear_forward(const dt_nn_ctx *c, dt_layer *L, const float *x, int B) {
    return layer_linear_forward(c, L->y, x, dt_layer_tensor_ptr(c, L, 0), dt_layer_tensor_ptr(c, L, 1),
                                (int)(B * rows_per_sample(L)), (int)last_dim(L), LAYER_SELF(linear_self, L)->out,
                                L->fuse_relu);
}

static dt_status linear_backward(const dt_nn_ctx *c, dt_layer *L, const float *x, const float *dy,
                                 float *dx, int B) {
    float *db = L->ntensors > 1 ? c->grads + L->t[1].offset : NULL;
    return layer_linear_backward(c, dx, c->grads + L->t[0].offset, db, dy, x, dt_layer_tensor_ptr(c, L, 0),
                                 (int)(B * rows_per_sample(L)), (int)last_dim(L), LAYER_SELF(linear_self, L)->out);
}

const dt_layer_def dt_layer_def_linear = {
    .name = "linear", .help = "linear(out[, bias=1][, std=0])", .torch = "nn.Linear",
    .flags = DT_LDEF_FUSE_RELU | DT_LDEF_GEMM | DT_LDEF_OUT_UNREAD | DT_LDEF_IN_GEMM, .self_size = sizeof(linear_self),
    .args = linear_args,
    .infer = linear_infer, .init = linear_init, .forward = linear_forward, .backward = linear_backward,
};

/* ---- conv ----------------------------------------------------------------- */

typedef struct { int out, k, stride, pad, bias; } conv_self;

static const dt_arg_def conv_args[] = {
    { "out",    DT_ARG_INT,  offsetof(conv_self, out),    1, 0, POSITIVE, "'out' expects a positive integer" },
    { "k",      DT_ARG_INT,  offsetof(conv_self, k),      1, 0, POSITIVE, "kernel size 'k' expects a positive integer" },
    { "stride", DT_ARG_INT,  offsetof(conv_self, stride), 0, 1, POSITIVE, "'stride' expects a positive integer" },
    { "pad",    DT_ARG_INT,  offsetof(conv_self, pad),    0, 0, NONNEG,   "'pad' expects a non-negative integer" },
    { "bias",   DT_ARG_BOOL, offsetof(conv_self, bias),   0, 1, 0, 1, 0,  "'bias' expects 0 or 1" },
    { 0 }
};

static dt_status conv_infer(dt_layer *L, dt_shape *out) {
    conv_self *s = LAYER_SELF(conv_self, L);
    DT_TRY(window_infer(L, "conv expects a (B, C, H, W) input", s->out, s->k, s->stride, s->pad, out));
    DT_TRY(dt_layer_tensor_add(L, "weight", DT_TENSOR_PARAM, NULL, 4,
                               (int64_t[]){ s->out, L->in.d[0], s->k, s->k }));
    if (s->bias) DT_TRY(dt_layer_tensor_add(L, "bias", DT_TENSOR_PARAM, NULL, 1, (int64_t[]){ s->out }));
    return DT_OK;
}

static dt_status conv_init(const dt_nn_ctx *c, dt_layer *L) {
    return init_fan_in(c, L, LAYER_SELF(conv_self, L)->out);
}

static dt_status conv_desc(const dt_layer *L, int B, dt_conv2d_desc *d) {
    const conv_self *s = LAYER_SELF(conv_self, L);
    memset(d, 0, sizeof *d);
    d->N = B; d->C = (int)L->in.d[0]; d->H = (int)L->in.d[1]; d->W = (int)L->in.d[2];
    d->K = s->out; d->R = d->S = s->k;
    d->stride_h = d->stride_w = s->stride;
    d->pad_h = d->pad_w = s->pad;
    return dt_conv2d_desc_init(d);
}

/* In low precision the convolution's operands are rounded (x and w; dy, x and w in
 * backward) and it runs in f32: the arithmetic of a 16-bit convolution with f32
 * accumulation, on every backend's f32 kernel. */
static dt_status conv_forward(const dt_nn_ctx *c, dt_layer *L, const float *x, int B) {
    dt_conv2d_desc d;
    DT_TRY(conv_desc(L, B, &d));
    DT_TRY(layer_lp_operand(c, 0, &x, (size_t)B * (size_t)L->in_numel));
    return c->ops->conv2d_forward(&d, L->y, x, layer_lp_weight(c, dt_layer_tensor_ptr(c, L, 0)),
                                  dt_layer_tensor_ptr(c, L, 1), L->fuse_relu);
}

static dt_status conv_backward(const dt_nn_ctx *c, dt_layer *L, const float *x, const float *dy,
                               float *dx, int B) {
    dt_conv2d_desc d;
    DT_TRY(conv_desc(L, B, &d));
    float *dw = c->grads + L->t[0].offset, *db = L->ntensors > 1 ? c->grads + L->t[1].offset : NULL;
    DT_TRY(layer_lp_operand(c, 0, &dy, (size_t)B * (size_t)L->out_numel));
    DT_TRY(layer_lp_operand(c, 1, &x, (size_t)B * (size_t)L->in_numel));
    return c->ops->conv2d_backward(&d, dx, dw, db, dy, x, layer_lp_weight(c, dt_layer_tensor_ptr(c, L, 0)));
}

const dt_layer_def dt_layer_def_conv = {
    .name = "conv", .help = "conv(out, k[, stride=1][, pad=0][, bias=1])", .torch = "nn.Conv2d",
    .flags = DT_LDEF_FUSE_RELU | DT_LDEF_GEMM | DT_LDEF_LP_OWN | DT_LDEF_OUT_UNREAD, .self_size = sizeof(conv_self),
    .args = conv_args,
    .infer = conv_infer, .init = conv_init, .forward = conv_forward, .backward = conv_backward,
};

/* ---- max and average pooling ---------------------------------------------- */

typedef struct { int k, stride, pad; int32_t *idx; } pool_self;

static const dt_arg_def pool_args[] = {
    { "k",      DT_ARG_INT, offsetof(pool_self, k),      1, 0,  POSITIVE, "kernel size 'k' expects a positive integer" },
    { "stride", DT_ARG_INT, offsetof(pool_self, stride), 0, -1, POSITIVE, "'stride' expects a positive integer" },
    { "pad",    DT_ARG_INT, offsetof(pool_self, pad),    0, 0,  NONNEG,   "'pad' expects a non-negative integer" },
    { 0 }
};

static dt_status pool_check(dt_layer *L) {
    pool_self *s = LAYER_SELF(pool_self, L);
    if (s->stride < 0) s->stride = s->k;   /* PyTorch: stride defaults to the kernel size */
    if (s->pad * 2 > s->k)
        return dt_error(DT_ERR_INVALID, "model spec: layer %s '%s': pad %d must be at most half "
                        "the kernel size %d", L->name, L->text, s->pad, s->k);
    return DT_OK;
}

static dt_status pool_infer(dt_layer *L, dt_shape *out) {
    pool_self *s = LAYER_SELF(pool_self, L);
    return window_infer(L, "pooling expects a (B, C, H, W) input", L->in.ndim == 3 ? L->in.d[0] : 0,
                        s->k, s->stride, s->pad, out);
}

static dt_status pool_desc(const dt_layer *L, int B, dt_pool2d_desc *d) {
    const pool_self *s = LAYER_SELF(pool_self, L);
    memset(d, 0, sizeof *d);
    d->N = B; d->C = (int)L->in.d[0]; d->H = (int)L->in.d[1]; d->W = (int)L->in.d[2];
    d->kh = d->kw = s->k;
    d->stride_h = d->stride_w = s->stride;
    d->pad_h = d->pad_w = s->pad;
    return dt_pool2d_desc_init(d);
}

/* maxpool keeps the argmax of each output (B, outs) for backward */
static dt_status maxpool_alloc(dt_layer_mem *a, dt_layer *L, int max_batch) {
    return dt_layer_mem_take(a, L, (void **)&LAYER_SELF(pool_self, L)->idx,
                             (size_t)max_batch * (size_t)L->out_numel * sizeof(int32_t));
}

static dt_status maxpool_forward(const dt_nn_ctx *c, dt_layer *L, const float *x, int B) {
    dt_pool2d_desc d;
    DT_TRY(pool_desc(L, B, &d));
    return c->ops->maxpool2d_forward(&d, L->y, LAYER_SELF(pool_self, L)->idx, x);
}

static dt_status maxpool_backward(const dt_nn_ctx *c, dt_layer *L, const float *x, const float *dy,
                                  float *dx, int B) {
    (void)x;
    dt_pool2d_desc d;
    if (!dx) return DT_OK;
    DT_TRY(pool_desc(L, B, &d));
    return c->ops->maxpool2d_backward(&d, dx, dy, LAYER_SELF(pool_self, L)->idx);
}

static dt_status avgpool_forward(const dt_nn_ctx *c, dt_layer *L, const float *x, int B) {
    dt_pool2d_desc d;
    DT_TRY(pool_desc(L, B, &d));
    return c->ops->avgpool2d_forward(&d, L->y, x);
}

static dt_status avgpool_backward(const dt_nn_ctx *c, dt_layer *L, const float *x, const float *dy,
                                  float *dx, int B) {
    (void)x;
    dt_pool2d_desc d;
    if (!dx) return DT_OK;
    DT_TRY(pool_desc(L, B, &d));
    return c->ops->avgpool2d_backward(&d, dx, dy);
}

const dt_layer_def dt_layer_def_maxpool = {
    .name = "maxpool", .help = "maxpool(k[, stride=k][, pad=0])", .torch = "nn.MaxPool2d",
    .self_size = sizeof(pool_self), .args = pool_args, .check = pool_check, .infer = pool_infer,
    .alloc = maxpool_alloc, .forward = maxpool_forward, .backward = maxpool_backward,
};

const dt_layer_def dt_layer_def_avgpool = {
    .name = "avgpool", .help = "avgpool(k[, stride=k][, pad=0])", .torch = "nn.AvgPool2d",
    .self_size = sizeof(pool_self), .args = pool_args, .check = pool_check, .infer = pool_infer,
    .forward = avgpool_forward, .backward = avgpool_backward,
};

/* ---- global average pool -------------------------------------------------- */

static dt_status gap_infer(dt_layer *L, dt_shape *out) {
    if (L->in.ndim != 3) return layer_shape_error(L, "gap expects a (B, C, H, W) input", "");
    out->ndim = 1;
    out->d[0] = L->in.d[0];
    return DT_OK;
}

static dt_status gap_forward(const dt_nn_ctx *c, dt_layer *L, const float *x, int B) {
    return c->ops->global_avgpool_forward(L->y, x, B, (int)L->in.d[0], layer_hw(&L->in));
}

static dt_status gap_backward(const dt_nn_ctx *c, dt_layer *L, const float *x, const float *dy,
                              float *dx, int B) {
    (void)x;
    return dx ? c->ops->global_avgpool_backward(dx, dy, B, (int)L->in.d[0], layer_hw(&L->in)) : DT_OK;
}

const dt_layer_def dt_layer_def_gap = {
    .name = "gap", .help = "gap", .torch = "nn.AdaptiveAvgPool2d(1) + nn.Flatten",
    .infer = gap_infer, .forward = gap_forward, .backward = gap_backward,
};

/* ---- activations ---------------------------------------------------------- */

/* relu: when the layer before applied it (relu_fused), pass its output on. */
static dt_status relu_forward(const dt_nn_ctx *c, dt_layer *L, const float *x, int B) {
    if (L->relu_fused) { L->out_ptr = (float *)x; return DT_OK; }
    return c->ops->relu_forward(L->y, x, (size_t)B * (size_t)L->out_numel);
}

static dt_status relu_backward(const dt_nn_ctx *c, dt_layer *L, const float *x, const float *dy,
                               float *dx, int B) {
    if (!dx) return DT_OK;
    return c->ops->relu_backward(dx, dy, L->relu_fused ? x : L->y, (size_t)B * (size_t)L->in_numel);
}

const dt_layer_def dt_layer_def_relu = {
    .name = "relu", .help = "relu", .torch = "nn.ReLU",
    .infer = layer_same_shape, .forward = relu_forward, .backward = relu_backward,
};

/* An element-wise activation whose backward reads the forward's input (SAVED = x)
 * or output (SAVED = L->y), as its row in src/ops_elem.h says: one line per kind
 * over its two ops. */
#define ELEMENTWISE_ROW(NAME, TORCH, SAVED, FLAGS)                                                \
    static dt_status NAME##_fwd(const dt_nn_ctx *c, dt_layer *L, const float *x, int B) {         \
        return c->ops->NAME##_forward(L->y, x, (size_t)B * (size_t)L->out_numel);                 \
    }                                                                                             \
    static dt_status NAME##_bwd(const dt_nn_ctx *c, dt_layer *L, const float *x, const float *dy, \
                                float *dx, int B) {                                               \
        (void)x;                                                                                  \
        return dx ? c->ops->NAME##_backward(dx, dy, SAVED, (size_t)B * (size_t)L->in_numel) : DT_OK; \
    }                                                                                             \
    const dt_layer_def dt_layer_def_##NAME = {                                                    \
        .name = #NAME, .help = #NAME, .torch = TORCH, .flags = FLAGS,                             \
        .infer = layer_same_shape, .forward = NAME##_fwd, .backward = NAME##_bwd,                 \
    };

ELEMENTWISE_ROW(gelu, "nn.GELU", x, DT_LDEF_OUT_UNREAD)
ELEMENTWISE_ROW(tanh, "nn.Tanh", L->y, 0)
ELEMENTWISE_ROW(silu, "nn.SiLU", x, DT_LDEF_OUT_UNREAD)
ELEMENTWISE_ROW(sigmoid, "nn.Sigmoid", L->y, 0)

/* ---- swiglu(hidden): Llama's gated MLP on the last dimension ------------------
 * y = down_proj(silu(gate_proj(x)) * up_proj(x)), three bias-free nn.Linear.
 * tensors: 0 gate_proj.weight (hid, C), 1 up_proj.weight (hid, C), 2 down_proj.weight
 * (C, hid). The first two lie one after the other in the parameter array, so they are
 * one (2 hid, C) matrix and one GEMM gives gu (rows, 2 hid) = [g | u]. Saved: gu and
 * h = silu(g) * u (rows, hid); backward writes dh over h (after down_proj's gradient
 * has read it) and dgu over gu. */

typedef struct { int hidden; float std; float *gu, *h; } swiglu_self;

static const dt_arg_def swiglu_args[] = {
    { "hidden", DT_ARG_INT, offsetof(swiglu_self, hidden), 1, 0, POSITIVE, "'hidden' expects a positive integer" },
    { "std", DT_ARG_FLOAT, offsetof(swiglu_self, std), 0, 0, 0, 1e3, 0,
      "'std' expects 0 (PyTorch's default init) or the standard deviation of a normal init" },
    { 0 }
};

static dt_status swiglu_infer(dt_layer *L, dt_shape *out) {
    swiglu_self *s = LAYER_SELF(swiglu_self, L);
    if (L->in.ndim == 3)
        return layer_shape_error(L, "swiglu expects a flat (B, features) or (B, T, features) input",
                                 "; add 'flatten' before it");
    int64_t C = last_dim(L), H = s->hidden;
    *out = L->in;
    DT_TRY(dt_layer_tensor_add(L, "gate_proj.weight", DT_TENSOR_PARAM, NULL, 2, (int64_t[]){ H, C }));
    DT_TRY(dt_layer_tensor_add(L, "up_proj.weight", DT_TENSOR_PARAM, NULL, 2, (int64_t[]){ H, C }));
    return dt_layer_tensor_add(L, "down_proj.weight", DT_TENSOR_PARAM, NULL, 2, (int64_t[]){ C, H });
}

static dt_status swiglu_alloc(dt_layer_mem *a, dt_layer *L, int max_batch) {
    swiglu_self *s = LAYER_SELF(swiglu_self, L);
    size_t rh = (size_t)max_batch * (size_t)rows_per_sample(L) * (size_t)s->hidden;
    DT_TRY(dt_layer_mem_take(a, L, (void **)&s->gu, 2 * rh * sizeof(float)));
    return dt_layer_mem_take(a, L, (void **)&s->h, rh * sizeof(float));
}

/* each weight as nn.Linear(bias=False) initialises it (U(+-1/sqrt(fan_in))), or normal(0, std) */
static dt_status swiglu_init(const dt_nn_ctx *c, dt_layer *L) {
    swiglu_self *s = LAYER_SELF(swiglu_self, L);
    for (int t = 0; t < 3; t++) {
        if (s->std > 0.0f) { DT_TRY(layer_init_normal(c, L, t, s->std)); continue; }
        float bound = (float)(1.0 / sqrt((double)L->t[t].shape[1]));
        DT_TRY(c->ops->rng_uniform(dt_layer_tensor_ptr(c, L, t), (size_t)L->t[t].numel, -bound, bound, c->seed,
                                   (uint64_t)L->first_param + (uint64_t)t, 0));
    }
    return DT_OK;
}

static dt_status swiglu_forward(const dt_nn_ctx *c, dt_layer *L, const float *x, int B) {
    swiglu_self *s = LAYER_SELF(swiglu_self, L);
    int rows = (int)(B * rows_per_sample(L)), C = (int)last_dim(L), H = s->hidden;
    /* gate_proj and up_proj as one (2H, C) weight: gu (rows, 2H) */
    DT_TRY(layer_linear_forward(c, s->gu, x, dt_layer_tensor_ptr(c, L, 0), NULL, rows, C, 2 * H, 0));
    DT_TRY(c->ops->swiglu_forward(s->h, s->gu, rows, H));
    DT_TRY(layer_lp_round(c, s->h, (size_t)rows * (size_t)H));
    return layer_linear_forward(c, L->y, s->h, dt_layer_tensor_ptr(c, L, 2), NULL, rows, H, C, 0);
}

static dt_status swiglu_backward(const dt_nn_ctx *c, dt_layer *L, const float *x, const float *dy, float *dx, int B) {
    swiglu_self *s = LAYER_SELF(swiglu_self, L);
    int rows = (int)(B * rows_per_sample(L)), C = (int)last_dim(L), H = s->hidden;
    float *g = c->grads;
    /* d down_proj from the saved h first; then dh (rows, H) over h */
    DT_TRY(layer_linear_backward(c, s->h, g + L->t[2].offset, NULL, dy, s->h, dt_layer_tensor_ptr(c, L, 2), rows, H, C));
    DT_TRY(c->ops->swiglu_backward(s->gu, s->h, s->gu, rows, H));
    /* gate_proj and up_proj's gradients as one (2H, C) block; dgu rounded in place, as it
     * is wider than the scratch of a low-precision operand */
    DT_TRY(layer_lp_round(c, s->gu, (size_t)rows * 2 * (size_t)H));
    return layer_linear_backward_rounded(c, dx, g + L->t[0].offset, NULL, s->gu, x, dt_layer_tensor_ptr(c, L, 0),
                                         rows, C, 2 * H);
}

const dt_layer_def dt_layer_def_swiglu = {
    .name = "swiglu", .help = "swiglu(hidden[, std=0])", .torch = "LlamaMLP (gate_proj, up_proj, down_proj)",
    .flags = DT_LDEF_GEMM | DT_LDEF_OUT_UNREAD | DT_LDEF_IN_GEMM, .self_size = sizeof(swiglu_self), .args = swiglu_args,
    .infer = swiglu_infer, .alloc = swiglu_alloc, .init = swiglu_init,
    .forward = swiglu_forward, .backward = swiglu_backward,
};

/* ---- dropout -------------------------------------------------------------- */

typedef struct { float p; } dropout_self;

static const dt_arg_def dropout_args[] = {
    { "p", DT_ARG_FLOAT, offsetof(dropout_self, p), 0, 0.5, 0, 1, 1, "dropout 'p' expects a number in [0, 1)" },
    { 0 }
};

/* The mask is keyed by (seed, layer index, epoch, sample, element) and
 * recomputed in backward, never stored. */
static dt_status dropout_forward(const dt_nn_ctx *c, dt_layer *L, const float *x, int B) {
    if (!c->train) { L->out_ptr = (float *)x; return DT_OK; }
    return c->ops->dropout_forward(L->y, x, B, (int)L->in_numel, LAYER_SELF(dropout_self, L)->p, c->seed,
                                   (uint32_t)L->index, c->epoch, c->sample0);
}

static dt_status dropout_backward(const dt_nn_ctx *c, dt_layer *L, const float *x, const float *dy,
                                  float *dx, int B) {
    (void)x;
    if (!dx) return DT_OK;
    if (!L->last_train)
        return dx == dy ? DT_OK : c->ops->copy_d2d(dx, dy, (size_t)B * (size_t)L->in_numel * sizeof(float));
    return c->ops->dropout_backward(dx, dy, B, (int)L->in_numel, LAYER_SELF(dropout_self, L)->p, c->seed,
                                    (uint32_t)L->index, c->epoch, c->sample0);
}

const dt_layer_def dt_layer_def_dropout = {
    .name = "dropout", .help = "dropout([p=0.5])", .torch = "nn.Dropout",
    .self_size = sizeof(dropout_self), .args = dropout_args,
    .infer = layer_same_shape, .forward = dropout_forward, .backward = dropout_backward,
};

/* ---- flatten: same memory, another shape ---------------------------------- */

static dt_status flatten_infer(dt_layer *L, dt_shape *out) {
    out->ndim = 1;
    out->d[0] = dt_shape_numel(&L->in);
    return DT_OK;
}

static dt_status flatten_backward(const dt_nn_ctx *c, dt_layer *L, const float *x, const float *dy,
                                  float *dx, int B) {
    (void)x;
    if (!dx || dx == dy) return DT_OK;
    return c->ops->copy_d2d(dx, dy, (size_t)B * (size_t)L->in_numel * sizeof(float));
}

const dt_layer_def dt_layer_def_flatten = {
    .name = "flatten", .help = "flatten", .torch = "nn.Flatten",
    .flags = DT_LDEF_NO_OUTPUT | DT_LDEF_GRAD_IN_PLACE,
    .infer = flatten_infer, .forward = layer_view_forward, .backward = flatten_backward,
};

/* ---- residual blocks: y = x + f(x) -----------------------------------------
 * "residual" opens the block: its output is its input x, which the layers of f
 * read. "residual_end" closes it: y = f(x) + x. In backward, residual_end
 * passes dy on to f in place and keeps a copy for the skip path; residual adds
 * that copy to the gradient f returns: dx = df(x)^T dy + dy. */

typedef struct { float *dskip; } residual_end_self;

static dt_status residual_backward(const dt_nn_ctx *c, dt_layer *L, const float *x, const float *dy,
                                   float *dx, int B) {
    (void)x;
    if (!dx) return DT_OK;
    const float *dskip = LAYER_SELF(residual_end_self, L->partner)->dskip;
    return c->ops->add(dx, dy, dskip, (size_t)B * (size_t)L->in_numel);
}

const dt_layer_def dt_layer_def_residual = {
    .name = "residual", .help = "residual(layers...)", .torch = "Residual (nn.Sequential with x + f(x))",
    .flags = DT_LDEF_NO_OUTPUT | DT_LDEF_CONTAINER, .closer = &dt_layer_def_residual_end,
    .infer = layer_same_shape, .forward = layer_view_forward, .backward = residual_backward,
};

static dt_status residual_end_infer(dt_layer *L, dt_shape *out) {
    const dt_shape *x = &L->partner->in;
    int same = x->ndim == L->in.ndim;
    for (int i = 0; same && i < x->ndim; i++) same = x->d[i] == L->in.d[i];
    if (!same) {
        char fx[64], xs[64];
        dt_shape_str(&L->in, 1, fx, sizeof fx);
        dt_shape_str(x, 1, xs, sizeof xs);
        return dt_error(DT_ERR_INVALID, "model spec: layer %s '%s': the block's output %s differs from "
                        "its input %s; a residual block must keep the shape", L->name, L->partner->text, fx, xs);
    }
    *out = L->in;
    return DT_OK;
}

static dt_status residual_end_alloc(dt_layer_mem *a, dt_layer *L, int max_batch) {
    return dt_layer_scratch_take(a, L, DT_SCRATCH_BLOCK, (void **)&LAYER_SELF(residual_end_self, L)->dskip,
                                 (size_t)max_batch * (size_t)L->out_numel * sizeof(float));
}

static dt_status residual_end_forward(const dt_nn_ctx *c, dt_layer *L, const float *x, int B) {
    return c->ops->add(L->out_ptr, x, L->partner->out_ptr, (size_t)B * (size_t)L->out_numel);
}

static dt_status residual_end_backward(const dt_nn_ctx *c, dt_layer *L, const float *x, const float *dy,
                                       float *dx, int B) {
    (void)x; (void)dx;   /* dx == dy: the gradient of f(x) + x with respect to f(x) */
    return c->ops->copy_d2d(LAYER_SELF(residual_end_self, L)->dskip, dy,
                            (size_t)B * (size_t)L->out_numel * sizeof(float));
}

const dt_layer_def dt_layer_def_residual_end = {
    .name = "residual_end", .help = "(closes a residual block)", .torch = "x + f(x)",
    .flags = DT_LDEF_INTERNAL | DT_LDEF_GRAD_IN_PLACE, .self_size = sizeof(residual_end_self),
    .infer = residual_end_infer, .alloc = residual_end_alloc,
    .forward = residual_end_forward, .backward = residual_end_backward,
};
