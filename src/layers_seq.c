/*
 * layers_seq.c: the rows of the layer table for transformers — token embedding,
 * learned positions, causal self-attention and the tied output head.
 *
 * A sequence sample is (T) token ids (floats holding integers) before the embedding
 * and (T, C) after it; linear and layer norm act on its last dimension. The names and
 * layouts are those of nanoGPT / GPT-2 in PyTorch: nn.Embedding weight (V, C), the
 * positions' weight (block, C), attention's fused c_attn (3C, C) and c_proj (C, C)
 * as nn.Linear, and the head's weight tied to the embedding's (its own name in the
 * state dict, the same memory and gradient).
 */
#include "layers.h"
#include "mem.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

#define POSITIVE 1, 1e9, 0
#define STD_ARG(type, field, what) \
    { "std", DT_ARG_FLOAT, offsetof(type, field), 0, 1.0, 0, 1e3, 0, "'std' expects the standard deviation of " what }

static dt_status need_sequence(const dt_layer *L, const char *what) {
    return L->in.ndim == 2 ? DT_OK : layer_shape_error(L, what, "");
}

/* ---- embed(vocab, dim): (T) ids -> (T, dim) ---------------------------------- */

typedef struct { int vocab, dim; float std; int tied; } embed_self;

static const dt_arg_def embed_args[] = {
    { "vocab", DT_ARG_INT, offsetof(embed_self, vocab), 1, 0, POSITIVE, "'vocab' expects a positive integer" },
    { "dim",   DT_ARG_INT, offsetof(embed_self, dim),   1, 0, POSITIVE, "'dim' expects a positive integer" },
    STD_ARG(embed_self, std, "its normal init (nn.Embedding: 1)"),
    { 0 }
};

static dt_status embed_infer(dt_layer *L, dt_shape *out) {
    embed_self *s = LAYER_SELF(embed_self, L);
    if (L->in.ndim != 1) return layer_shape_error(L, "embed expects (B, T) token ids", "");
    out->ndim = 2;
    out->d[0] = L->in.d[0];
    out->d[1] = s->dim;
    s->tied = 0;
    return dt_layer_tensor_add(L, "weight", DT_TENSOR_PARAM, NULL, 2, (int64_t[]){ s->vocab, s->dim });
}

static dt_status embed_init(const dt_nn_ctx *c, dt_layer *L) {
    return layer_init_normal(c, L, 0, LAYER_SELF(embed_self, L)->std);
}

static dt_status embed_forward(const dt_nn_ctx *c, dt_layer *L, const float *x, int B) {
    embed_self *s = LAYER_SELF(embed_self, L);
    return c->ops->embedding_forward(L->y, x, dt_layer_tensor_ptr(c, L, 0), (int)(B * L->in.d[0]), s->dim, s->vocab);
}

static dt_status embed_backward(const dt_nn_ctx *c, dt_layer *L, const float *x, const float *dy, float *dx, int B) {
    (void)dx;   /* token ids have no gradient */
    embed_self *s = LAYER_SELF(embed_self, L);
    /* a tied head's backward ran first and wrote its part of the gradient */
    return c->ops->embedding_backward(c->grads + L->t[0].offset, x, dy, (int)(B * L->in.d[0]), s->dim, s->vocab,
                                      s->tied);
}

const dt_layer_def dt_layer_def_embed = {
    .name = "embed", .help = "embed(vocab, dim[, std=1])", .torch = "nn.Embedding",
    .self_size = sizeof(embed_self), .args = embed_args,
    .infer = embed_infer, .init = embed_init, .forward = embed_forward, .backward = embed_backward,
};

/* ---- pos(block): (T, C) + P[t], P (block, C) --------------------------------- */

typedef struct { int block; float std; } pos_self;

static const dt_arg_def pos_args[] = {
    { "block", DT_ARG_INT, offsetof(pos_self, block), 1, 0, POSITIVE, "'block' expects a positive integer" },
    STD_ARG(pos_self, std, "its normal init (nn.Embedding: 1)"),
    { 0 }
};

static dt_status pos_infer(dt_layer *L, dt_shape *out) {
    pos_self *s = LAYER_SELF(pos_self, L);
    DT_TRY(need_sequence(L, "pos expects a (B, T, C) sequence; put it after embed"));
    if (L->in.d[0] > s->block) {
        char sh[64];
        dt_shape_str(&L->in, 1, sh, sizeof sh);
        return dt_error(DT_ERR_INVALID, "model spec: layer %s '%s': the input %s has %lld positions, more than "
                        "the block of %d", L->name, L->text, sh, (long long)L->in.d[0], s->block);
    }
    *out = L->in;
    return dt_layer_tensor_add(L, "weight", DT_TENSOR_PARAM, NULL, 2, (int64_t[]){ s->block, L->in.d[1] });
}

static dt_status pos_init(const dt_nn_ctx *c, dt_layer *L) {
    return layer_init_normal(c, L, 0, LAYER_SELF(pos_self, L)->std);
}

static dt_status pos_forward(const dt_nn_ctx *c, dt_layer *L, const float *x, int B) {
    const float *P = dt_layer_tensor_ptr(c, L, 0);
    int T = (int)L->in.d[0], C = (int)L->in.d[1];
    if (c->decode) {   /* one position: the row of the one being decoded */
        if (c->decode_pos < 0 || c->decode_pos >= LAYER_SELF(pos_self, L)->block)
            return dt_error(DT_ERR_INVALID, "pos: position %d is outside the block of %d", c->decode_pos,
                            LAYER_SELF(pos_self, L)->block);
        P += (size_t)c->decode_pos * C;
    }
    return c->ops->pos_forward(L->y, x, P, B, T, C);
}

static dt_status pos_backward(const dt_nn_ctx *c, dt_layer *L, const float *x, const float *dy, float *dx, int B) {
    (void)x;
    int T = (int)L->in.d[0], C = (int)L->in.d[1];
    DT_TRY(c->ops->pos_backward(c->grads + L->t[0].offset, dy, B, T, C));
    /* the rows of positions T..block-1 got no gradient */
    int64_t rest = (int64_t)(LAYER_SELF(pos_self, L)->block - T) * C;
    if (rest > 0) DT_TRY(c->ops->fill(c->grads + L->t[0].offset + (size_t)T * C, 0.0f, (size_t)rest));
    if (dx && dx != dy) DT_TRY(c->ops->copy_d2d(dx, dy, (size_t)B * (size_t)L->in_numel * sizeof(float)));
    return DT_OK;
}

const dt_layer_def dt_layer_def_pos = {
    .name = "pos", .help = "pos(block[, std=1])", .torch = "nn.Embedding (positions, added)",
    .flags = DT_LDEF_GRAD_IN_PLACE, .self_size = sizeof(pos_self), .args = pos_args,
    .infer = pos_infer, .init = pos_init, .forward = pos_forward, .backward = pos_backward,
};

/* ---- attn(heads): causal self-attention with a fused QKV projection ----------
 * tensors: 0 c_attn.weight (3C, C), 1 c_attn.bias (3C), 2 c_proj.weight (C, C),
 * 3 c_proj.bias (C). Saved: qkv (B, T, 3C), att (B, T, C) before c_proj, lse
 * (B, H, T); scratch for backward: datt (B, T, C), dqkv (B, T, 3C). Decoding keeps
 * the qkv rows of every position so far in a cache (block, 3C). */

typedef struct {
    int heads;
    float std, proj_std;
    float *qkv, *att, *lse, *datt, *dqkv;
    float *cache;    /* decoding: (block, 3C) */
    int cache_rows;
} attn_self;

static const dt_arg_def attn_args[] = {
    { "heads", DT_ARG_INT, offsetof(attn_self, heads), 1, 0, POSITIVE, "'heads' expects a positive integer" },
    { "std",   DT_ARG_FLOAT, offsetof(attn_self, std), 0, 0, 0, 1e3, 0,
      "'std' expects 0 (PyTorch's default init) or the standard deviation of c_attn's normal init" },
    { "proj_std", DT_ARG_FLOAT, offsetof(attn_self, proj_std), 0, 0, 0, 1e3, 0,
      "'proj_std' expects 0 (PyTorch's default init) or the standard deviation of c_proj's normal init" },
    { 0 }
};

static int attn_C(const dt_layer *L) { return (int)L->in.d[1]; }
static int attn_T(const dt_layer *L) { return (int)L->in.d[0]; }

static dt_status attn_infer(dt_layer *L, dt_shape *out) {
    attn_self *s = LAYER_SELF(attn_self, L);
    DT_TRY(need_sequence(L, "attn expects a (B, T, C) sequence"));
    int64_t C = L->in.d[1];
    if (C % s->heads)
        return dt_error(DT_ERR_INVALID, "model spec: layer %s '%s': %d heads do not divide the width %lld",
                        L->name, L->text, s->heads, (long long)C);
    *out = L->in;
    DT_TRY(dt_layer_tensor_add(L, "c_attn.weight", DT_TENSOR_PARAM, NULL, 2, (int64_t[]){ 3 * C, C }));
    DT_TRY(dt_layer_tensor_add(L, "c_attn.bias", DT_TENSOR_PARAM, NULL, 1, (int64_t[]){ 3 * C }));
    DT_TRY(dt_layer_tensor_add(L, "c_proj.weight", DT_TENSOR_PARAM, NULL, 2, (int64_t[]){ C, C }));
    return dt_layer_tensor_add(L, "c_proj.bias", DT_TENSOR_PARAM, NULL, 1, (int64_t[]){ C });
}

static dt_status attn_alloc(dt_layer_mem *a, dt_layer *L, int max_batch) {
    attn_self *s = LAYER_SELF(attn_self, L);
    size_t bt = (size_t)max_batch * (size_t)attn_T(L), C = (size_t)attn_C(L);
    DT_TRY(dt_layer_mem_take(a, L, (void **)&s->qkv, bt * 3 * C * sizeof(float)));
    DT_TRY(dt_layer_mem_take(a, L, (void **)&s->att, bt * C * sizeof(float)));
    DT_TRY(dt_layer_mem_take(a, L, (void **)&s->lse, bt * (size_t)s->heads * sizeof(float)));
    DT_TRY(dt_layer_mem_take(a, L, (void **)&s->datt, bt * C * sizeof(float)));
    return dt_layer_mem_take(a, L, (void **)&s->dqkv, bt * 3 * C * sizeof(float));
}

/* the decoding cache (the buffers of attn_alloc are the driver's to free) */
static void attn_free(const dt_ops *ops, dt_layer *L) {
    attn_self *s = LAYER_SELF(attn_self, L);
    dt_mem_free(ops, s->cache);
    s->cache = NULL;
    s->cache_rows = 0;
}

/* nn.Linear's default init (U(+-1/sqrt(fan_in)) for weight and bias), or GPT-2's */
static dt_status attn_init_pair(const dt_nn_ctx *c, dt_layer *L, int t, float std) {
    if (std > 0.0f) {
        DT_TRY(layer_init_normal(c, L, t, std));
        return c->ops->fill(dt_layer_tensor_ptr(c, L, t + 1), 0.0f, (size_t)L->t[t + 1].numel);
    }
    float bound = (float)(1.0 / sqrt((double)attn_C(L)));
    for (int k = t; k < t + 2; k++)
        DT_TRY(c->ops->rng_uniform(dt_layer_tensor_ptr(c, L, k), (size_t)L->t[k].numel, -bound, bound, c->seed,
                                   (uint64_t)L->first_param + (uint64_t)k, 0));
    return DT_OK;
}

static dt_status attn_init(const dt_nn_ctx *c, dt_layer *L) {
    attn_self *s = LAYER_SELF(attn_self, L);
    DT_TRY(attn_init_pair(c, L, 0, s->std));
    return attn_init_pair(c, L, 2, s->proj_std);
}

/* decoding: append this position's qkv row to the cache and attend over it */
static dt_status attn_decode_step(const dt_nn_ctx *c, dt_layer *L, int B) {
    attn_self *s = LAYER_SELF(attn_self, L);
    const dt_ops *o = c->ops;
    int C = attn_C(L), t = c->decode_pos;
    if (B != 1 || attn_T(L) != 1) return dt_error(DT_ERR_INVALID, "attn: decoding takes one sequence, one position");
    if (t + 1 > s->cache_rows) {   /* grow the cache (positions only ever increase by one) */
        int rows = s->cache_rows ? 2 * s->cache_rows : 64;
        while (rows < t + 1) rows *= 2;
        float *nc;
        DT_TRY(dt_mem_alloc(o, DT_MEM_ACTS, (void **)&nc, (size_t)rows * 3 * C * sizeof(float)));
        dt_status st = s->cache ? o->copy_d2d(nc, s->cache, (size_t)s->cache_rows * 3 * C * sizeof(float)) : DT_OK;
        if (st != DT_OK) { dt_mem_free(o, nc); return st; }
        dt_mem_free(o, s->cache);
        s->cache = nc;
        s->cache_rows = rows;
    }
    DT_TRY(o->copy_d2d(s->cache + (size_t)t * 3 * C, s->qkv, (size_t)3 * C * sizeof(float)));
    return o->attn_decode(s->att, s->cache, t, s->heads, C / s->heads);
}

/* In low precision the attention's own matrix products take rounded operands too: q, k
 * and v (qkv rounded in place, as the projection's bf16 output would be), its output
 * (the input of c_proj) and the output's gradient; the softmax stays f32. */
static dt_status attn_forward(const dt_nn_ctx *c, dt_layer *L, const float *x, int B) {
    attn_self *s = LAYER_SELF(attn_self, L);
    const dt_ops *o = c->ops;
    int C = attn_C(L), T = attn_T(L), rows = B * T;
    DT_TRY(layer_linear_forward(c, s->qkv, x, dt_layer_tensor_ptr(c, L, 0), dt_layer_tensor_ptr(c, L, 1),
                                rows, C, 3 * C, 0));
    DT_TRY(layer_lp_round(c, s->qkv, (size_t)rows * 3 * (size_t)C));
    if (c->decode) DT_TRY(attn_decode_step(c, L, B));
    else DT_TRY(o->attn_forward(s->att, s->lse, s->qkv, B, T, s->heads, C / s->heads));
    DT_TRY(layer_lp_round(c, s->att, (size_t)rows * (size_t)C));
    return layer_linear_forward(c, L->y, s->att, dt_layer_tensor_ptr(c, L, 2), dt_layer_tensor_ptr(c, L, 3),
                                rows, C, C, 0);
}

static dt_status attn_backward(const dt_nn_ctx *c, dt_layer *L, const float *x, const float *dy, float *dx, int B) {
    attn_self *s = LAYER_SELF(attn_self, L);
    const dt_ops *o = c->ops;
    int C = attn_C(L), T = attn_T(L), rows = B * T;
    float *g = c->grads;
    DT_TRY(layer_linear_backward(c, s->datt, g + L->t[2].offset, g + L->t[3].offset, dy, s->att,
                                 dt_layer_tensor_ptr(c, L, 2), rows, C, C));
    DT_TRY(layer_lp_round(c, s->datt, (size_t)rows * (size_t)C));
    DT_TRY(o->attn_backward(s->dqkv, s->datt, s->qkv, s->att, s->lse, B, T, s->heads, C / s->heads));
    return layer_linear_backward(c, dx, g + L->t[0].offset, g + L->t[1].offset, s->dqkv, x,
                                 dt_layer_tensor_ptr(c, L, 0), rows, C, 3 * C);
}

const dt_layer_def dt_layer_def_attn = {
    .name = "attn", .help = "attn(heads[, std=0][, proj_std=0])", .torch = "causal self-attention (nanoGPT)",
    .flags = DT_LDEF_GEMM, .self_size = sizeof(attn_self), .args = attn_args,
    .infer = attn_infer, .alloc = attn_alloc, .free = attn_free, .init = attn_init,
    .forward = attn_forward, .backward = attn_backward,
};

/* ---- unembed: (T, C) -> (T, V) logits with the embedding's weight ------------ */

typedef struct { int vocab; } unembed_self;

static dt_status unembed_infer(dt_layer *L, dt_shape *out) {
    DT_TRY(need_sequence(L, "unembed expects a (B, T, C) sequence"));
    dt_layer *E = dt_layer_find_before(L, DT_LAYER_EMBED);
    if (!E) return dt_error(DT_ERR_INVALID, "model spec: layer %s '%s': no embed layer before it to tie to",
                            L->name, L->text);
    embed_self *es = LAYER_SELF(embed_self, E);
    if (es->dim != L->in.d[1])
        return dt_error(DT_ERR_INVALID, "model spec: layer %s '%s': its input width %lld differs from the "
                        "embedding's %d (layer %s)", L->name, L->text, (long long)L->in.d[1], es->dim, E->name);
    es->tied = 1;
    LAYER_SELF(unembed_self, L)->vocab = es->vocab;
    *out = L->in;
    out->d[1] = es->vocab;
    DT_TRY(dt_layer_tensor_add(L, "weight", DT_TENSOR_TIED, NULL, 2, (int64_t[]){ es->vocab, es->dim }));
    L->t[L->ntensors - 1].tie = &E->t[0];
    return DT_OK;
}

static dt_status unembed_forward(const dt_nn_ctx *c, dt_layer *L, const float *x, int B) {
    return layer_linear_forward(c, L->y, x, dt_layer_tensor_ptr(c, L, 0), NULL, (int)(B * L->in.d[0]),
                                (int)L->in.d[1], LAYER_SELF(unembed_self, L)->vocab, 0);
}

/* writes (overwrites) the tied weight's gradient; the embedding's backward adds to it */
static dt_status unembed_backward(const dt_nn_ctx *c, dt_layer *L, const float *x, const float *dy, float *dx, int B) {
    return layer_linear_backward(c, dx, c->grads + L->t[0].offset, NULL, dy, x, dt_layer_tensor_ptr(c, L, 0),
                                 (int)(B * L->in.d[0]), (int)L->in.d[1], LAYER_SELF(unembed_self, L)->vocab);
}

const dt_layer_def dt_layer_def_unembed = {
    .name = "unembed", .help = "unembed", .torch = "nn.Linear(bias=False), weight tied to the embedding",
    .flags = DT_LDEF_GEMM, .self_size = sizeof(unembed_self),
    .infer = unembed_infer, .forward = unembed_forward, .backward = unembed_backward,
};
