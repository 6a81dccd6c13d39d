/*
 * layers_seq.c: the rows of the layer table for transformers — token embedding,
 * learned positions, causal self-attention (multi-head or grouped-query, with rotary
 * positions or without) and the tied output head.
 *
 * A sequence sample is (T) token ids (floats holding integers) before the embedding
 * and (T, C) after it; linear and layer norm act on its last dimension. The names and
 * layouts are those of nanoGPT / GPT-2 in PyTorch: nn.Embedding weight (V, C), the
 * positions' weight (block, C), attention's fused c_attn (3C, C) and c_proj (C, C)
 * as nn.Linear (or Llama's q_proj, k_proj, v_proj, o_proj), and the head's weight tied to the embedding's (its own name in the
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

/* ---- attn(heads[, kv_heads][, rope]): causal self-attention ------------------
 * Two layouts of the same computation. Without kv_heads, nanoGPT's: tensors c_attn.weight
 * (3C, C), c_attn.bias (3C), c_proj.weight (C, C), c_proj.bias (C). With kv_heads = K,
 * Hugging Face Llama's: q_proj.weight (HD, C), k_proj.weight (KD, C), v_proj.weight
 * (KD, C), their biases (HD), (KD), (KD), o_proj.weight (C, HD), o_proj.bias (C), with
 * D = C / H and K key/value heads shared by H / K query heads each (grouped-query
 * attention); the biases only with bias=1. q, k and v's weights (and biases) lie one
 * after the other in the parameter array, so either way they are one ((H + 2K) D, C)
 * matrix and one GEMM writes qkv (B, T, (H + 2K) D), the layout of ops.h's attention.
 * rope = theta turns q and k by rotary position embedding (ops.h rope) before the
 * scores. Saved: qkv (after the rotation), att (B, T, C) before the output projection,
 * lse (B, H, T); scratch for backward: datt (B, T, C), dqkv (B, T, (H + 2K) D).
 * Decoding keeps the key and value heads of every position so far in a cache (block,
 * 2KD): with grouped-query attention K/H of the rows' query width, as a Llama's. */

typedef struct {
    int heads;
    float std, proj_std;
    int kv_heads;    /* 0: heads, nanoGPT's fused layout */
    float rope;      /* theta; 0: no rotary embedding */
    int bias;
    int block;       /* the longest sequence (0: any): the window of token data */
    int K, tw, tb, tow, tob;   /* key/value heads; tensor indices (-1: none) */
    float *qkv, *att, *lse, *datt, *dqkv;
    uint16_t *qkv16, *att16;   /* in low precision: qkv and att kept (they are rounded), the f32 ones scratch */
    float *cache;    /* decoding: (rows, 2KD), the k then v heads of positions 0..rows-1 */
    int cache_rows;
} attn_self;

static const dt_arg_def attn_args[] = {
    { "heads", DT_ARG_INT, offsetof(attn_self, heads), 1, 0, POSITIVE, "'heads' expects a positive integer" },
    { "std",   DT_ARG_FLOAT, offsetof(attn_self, std), 0, 0, 0, 1e3, 0,
      "'std' expects 0 (PyTorch's default init) or the standard deviation of the q, k, v projections' normal init" },
    { "proj_std", DT_ARG_FLOAT, offsetof(attn_self, proj_std), 0, 0, 0, 1e3, 0,
      "'proj_std' expects 0 (PyTorch's default init) or the standard deviation of the output projection's normal init" },
    { "kv_heads", DT_ARG_INT, offsetof(attn_self, kv_heads), 0, 0, 1, 1e9, 0,
      "'kv_heads' expects a positive integer that divides 'heads'" },
    { "rope", DT_ARG_FLOAT, offsetof(attn_self, rope), 0, 0, 0, 1e12, 0,
      "'rope' expects 0 (no rotary embedding) or its base theta (10000 for Llama 2)" },
    { "bias", DT_ARG_BOOL, offsetof(attn_self, bias), 0, 1, 0, 1, 0, "'bias' expects 0 or 1" },
    { "block", DT_ARG_INT, offsetof(attn_self, block), 0, 0, 0, 1e9, 0,
      "'block' expects 0 (any length) or the longest sequence, a positive integer" },
    { 0 }
};

static int attn_C(const dt_layer *L) { return (int)L->in.d[1]; }
static int attn_T(const dt_layer *L) { return (int)L->in.d[0]; }
static int attn_D(const dt_layer *L) { return attn_C(L) / LAYER_SELF(attn_self, L)->heads; }
/* width of a qkv row: (H + 2K) D */
static int attn_W(const dt_layer *L) {
    const attn_self *s = LAYER_SELF(attn_self, L);
    return (s->heads + 2 * s->K) * attn_D(L);
}

static dt_status attn_check(dt_layer *L) {
    attn_self *s = LAYER_SELF(attn_self, L);
    if (s->kv_heads && s->heads % s->kv_heads)
        return dt_error(DT_ERR_INVALID, "model spec: layer %s '%s': 'kv_heads' %d does not divide 'heads' %d",
                        L->name, L->text, s->kv_heads, s->heads);
    if (s->rope != 0.0f && !(s->rope > 1.0f))
        return dt_error(DT_ERR_INVALID, "model spec: layer %s '%s': 'rope' expects 0 or a base theta above 1, got %g",
                        L->name, L->text, (double)s->rope);
    s->K = s->kv_heads ? s->kv_heads : s->heads;
    return DT_OK;
}

static dt_status attn_infer(dt_layer *L, dt_shape *out) {
    attn_self *s = LAYER_SELF(attn_self, L);
    DT_TRY(need_sequence(L, "attn expects a (B, T, C) sequence"));
    int64_t C = L->in.d[1];
    if (C % s->heads)
        return dt_error(DT_ERR_INVALID, "model spec: layer %s '%s': %d heads do not divide the width %lld",
                        L->name, L->text, s->heads, (long long)C);
    int64_t D = C / s->heads;
    if (s->rope > 0.0f && D % 2)
        return dt_error(DT_ERR_INVALID, "model spec: layer %s '%s': 'rope' needs an even head width, but %lld / %d "
                        "heads is %lld", L->name, L->text, (long long)C, s->heads, (long long)D);
    if (s->block && L->in.d[0] > s->block)
        return dt_error(DT_ERR_INVALID, "model spec: layer %s '%s': the input has %lld positions, more than "
                        "the block of %d", L->name, L->text, (long long)L->in.d[0], s->block);
    *out = L->in;
    s->tb = s->tob = -1;
    if (!s->kv_heads) {   /* nanoGPT's fused projection */
        s->tw = L->ntensors;
        DT_TRY(dt_layer_tensor_add(L, "c_attn.weight", DT_TENSOR_PARAM, NULL, 2, (int64_t[]){ 3 * C, C }));
        if (s->bias) {
            s->tb = L->ntensors;
            DT_TRY(dt_layer_tensor_add(L, "c_attn.bias", DT_TENSOR_PARAM, NULL, 1, (int64_t[]){ 3 * C }));
        }
        s->tow = L->ntensors;
        DT_TRY(dt_layer_tensor_add(L, "c_proj.weight", DT_TENSOR_PARAM, NULL, 2, (int64_t[]){ C, C }));
        if (s->bias) {
            s->tob = L->ntensors;
            DT_TRY(dt_layer_tensor_add(L, "c_proj.bias", DT_TENSOR_PARAM, NULL, 1, (int64_t[]){ C }));
        }
        return DT_OK;
    }
    /* Llama's: the q, k, v weights first, then their biases (each group contiguous) */
    int64_t rows[3] = { C, s->K * D, s->K * D };
    static const char *const wn[3] = { "q_proj.weight", "k_proj.weight", "v_proj.weight" };
    static const char *const bn[3] = { "q_proj.bias", "k_proj.bias", "v_proj.bias" };
    s->tw = L->ntensors;
    for (int i = 0; i < 3; i++) DT_TRY(dt_layer_tensor_add(L, wn[i], DT_TENSOR_PARAM, NULL, 2, (int64_t[]){ rows[i], C }));
    if (s->bias) {
        s->tb = L->ntensors;
        for (int i = 0; i < 3; i++) DT_TRY(dt_layer_tensor_add(L, bn[i], DT_TENSOR_PARAM, NULL, 1, &rows[i]));
    }
    s->tow = L->ntensors;
    DT_TRY(dt_layer_tensor_add(L, "o_proj.weight", DT_TENSOR_PARAM, NULL, 2, (int64_t[]){ C, C }));
    if (s->bias) {
        s->tob = L->ntensors;
        DT_TRY(dt_layer_tensor_add(L, "o_proj.bias", DT_TENSOR_PARAM, NULL, 1, (int64_t[]){ C }));
    }
    return DT_OK;
}

static dt_status attn_alloc(dt_layer_mem *a, dt_layer *L, int max_batch) {
    attn_self *s = LAYER_SELF(attn_self, L);
    size_t bt = (size_t)max_batch * (size_t)attn_T(L), C = (size_t)attn_C(L), W = (size_t)attn_W(L);
    s->qkv16 = s->att16 = NULL;
    if (L->lp16) {   /* qkv and att are rounded: kept in 16 bits, f32 while the layer runs */
        DT_TRY(dt_layer_mem_take(a, L, (void **)&s->qkv16, bt * W * sizeof(uint16_t)));
        DT_TRY(dt_layer_mem_take(a, L, (void **)&s->att16, bt * C * sizeof(uint16_t)));
        DT_TRY(dt_layer_scratch_take(a, L, DT_SCRATCH_PASS, (void **)&s->qkv, bt * W * sizeof(float)));
        DT_TRY(dt_layer_scratch_take(a, L, DT_SCRATCH_PASS, (void **)&s->att, bt * C * sizeof(float)));
    } else {
        DT_TRY(dt_layer_mem_take(a, L, (void **)&s->qkv, bt * W * sizeof(float)));
        DT_TRY(dt_layer_mem_take(a, L, (void **)&s->att, bt * C * sizeof(float)));
    }
    DT_TRY(dt_layer_mem_take(a, L, (void **)&s->lse, bt * (size_t)s->heads * sizeof(float)));
    DT_TRY(dt_layer_scratch_take(a, L, DT_SCRATCH_PASS, (void **)&s->datt, bt * C * sizeof(float)));
    return dt_layer_scratch_take(a, L, DT_SCRATCH_PASS, (void **)&s->dqkv, bt * W * sizeof(float));
}

/* the decoding cache (the buffers of attn_alloc are the driver's to free) */
static void attn_free(const dt_ops *ops, dt_layer *L) {
    attn_self *s = LAYER_SELF(attn_self, L);
    dt_mem_free(ops, s->cache);
    s->cache = NULL;
    s->cache_rows = 0;
}

/* Tensor t as nn.Linear's default init draws it (U(+-1/sqrt(fan_in)), fan_in the width
 * C for every projection), or GPT-2's (weights normal(0, std), biases zero); each from
 * its own stream, the parameter's index. */
static dt_status attn_init_tensor(const dt_nn_ctx *c, dt_layer *L, int t, float std) {
    if (t < 0) return DT_OK;
    if (std > 0.0f)
        return L->t[t].ndim == 2 ? layer_init_normal(c, L, t, std)
                                 : c->ops->fill(dt_layer_tensor_ptr(c, L, t), 0.0f, (size_t)L->t[t].numel);
    float bound = (float)(1.0 / sqrt((double)attn_C(L)));
    return c->ops->rng_uniform(dt_layer_tensor_ptr(c, L, t), (size_t)L->t[t].numel, -bound, bound, c->seed,
                               (uint64_t)L->first_param + (uint64_t)t, 0);
}

static dt_status attn_init(const dt_nn_ctx *c, dt_layer *L) {
    attn_self *s = LAYER_SELF(attn_self, L);
    for (int t = 0; t < L->ntensors; t++)
        DT_TRY(attn_init_tensor(c, L, t, t < s->tow ? s->std : s->proj_std));
    return DT_OK;
}

/* decoding: append this position's qkv row to the cache and attend over it */
static dt_status attn_decode_step(const dt_nn_ctx *c, dt_layer *L, int B) {
    attn_self *s = LAYER_SELF(attn_self, L);
    const dt_ops *o = c->ops;
    int W = 2 * s->K * attn_D(L), t = c->decode_pos;   /* a cache row: the k and v heads */
    if (B != 1 || attn_T(L) != 1) return dt_error(DT_ERR_INVALID, "attn: decoding takes one sequence, one position");
    if (s->block && t >= s->block)
        return dt_error(DT_ERR_INVALID, "attn: position %d is outside the block of %d", t, s->block);
    if (t + 1 > s->cache_rows) {   /* grow the cache (positions only ever increase by one) */
        int rows = s->cache_rows ? 2 * s->cache_rows : 64;
        while (rows < t + 1) rows *= 2;
        float *nc;
        DT_TRY(dt_mem_alloc(o, DT_MEM_ACTS, (void **)&nc, (size_t)rows * W * sizeof(float)));
        dt_status st = s->cache ? o->copy_d2d(nc, s->cache, (size_t)s->cache_rows * W * sizeof(float)) : DT_OK;
        if (st != DT_OK) { dt_mem_free(o, nc); return st; }
        dt_mem_free(o, s->cache);
        s->cache = nc;
        s->cache_rows = rows;
    }
    DT_TRY(o->copy_d2d(s->cache + (size_t)t * W, s->qkv + (size_t)attn_C(L), (size_t)W * sizeof(float)));
    return o->attn_decode(s->att, s->qkv, s->cache, t, s->heads, s->K, attn_D(L));
}

static const float *attn_ptr(const dt_nn_ctx *c, dt_layer *L, int t) {
    return t < 0 ? NULL : dt_layer_tensor_ptr(c, L, t);
}

/* In low precision the attention's own matrix products take rounded operands too: q, k
 * and v (qkv rounded in place after the rotation, as the projection's bf16 output would
 * be), its output (the input of the output projection) and the output's gradient, and
 * dqkv before the projection's backward; the softmax stays f32. */
static dt_status attn_forward(const dt_nn_ctx *c, dt_layer *L, const float *x, int B) {
    attn_self *s = LAYER_SELF(attn_self, L);
    const dt_ops *o = c->ops;
    int C = attn_C(L), T = attn_T(L), W = attn_W(L), D = attn_D(L), rows = B * T;
    DT_TRY(layer_linear_forward(c, s->qkv, x, attn_ptr(c, L, s->tw), attn_ptr(c, L, s->tb), rows, C, W, 0));
    if (s->rope > 0.0f) DT_TRY(o->rope(s->qkv, B, T, s->heads, s->K, D, s->rope, c->decode ? c->decode_pos : 0, 0));
    DT_TRY(layer_lp_round(c, s->qkv, (size_t)rows * (size_t)W));
    if (c->decode) DT_TRY(attn_decode_step(c, L, B));
    else DT_TRY(o->attn_forward(s->att, s->lse, s->qkv, B, T, s->heads, s->K, D, c->lp));
    DT_TRY(layer_lp_round(c, s->att, (size_t)rows * (size_t)C));
    if (s->qkv16 && !c->decode) {   /* what backward reads, kept in 16 bits */
        DT_TRY(dt_keep16(o, L->lp16, s->qkv16, s->qkv, (size_t)rows * (size_t)W));
        DT_TRY(dt_keep16(o, L->lp16, s->att16, s->att, (size_t)rows * (size_t)C));
    }
    return layer_linear_forward(c, L->y, s->att, attn_ptr(c, L, s->tow), attn_ptr(c, L, s->tob), rows, C, C, 0);
}

static dt_status attn_backward(const dt_nn_ctx *c, dt_layer *L, const float *x, const float *dy, float *dx, int B) {
    attn_self *s = LAYER_SELF(attn_self, L);
    const dt_ops *o = c->ops;
    int C = attn_C(L), T = attn_T(L), W = attn_W(L), D = attn_D(L), rows = B * T;
    float *g = c->grads;
    if (s->qkv16) {
        DT_TRY(dt_widen16(o, L->lp16, s->qkv, s->qkv16, (size_t)rows * (size_t)W));
        DT_TRY(dt_widen16(o, L->lp16, s->att, s->att16, (size_t)rows * (size_t)C));
    }
    DT_TRY(layer_linear_backward(c, s->datt, g + L->t[s->tow].offset, s->tob < 0 ? NULL : g + L->t[s->tob].offset,
                                 dy, s->att, attn_ptr(c, L, s->tow), rows, C, C));
    DT_TRY(layer_lp_round(c, s->datt, (size_t)rows * (size_t)C));
    DT_TRY(o->attn_backward(s->dqkv, s->datt, s->qkv, s->att, s->lse, B, T, s->heads, s->K, D, c->lp));
    if (s->rope > 0.0f) DT_TRY(o->rope(s->dqkv, B, T, s->heads, s->K, D, s->rope, 0, 1));
    DT_TRY(layer_lp_round(c, s->dqkv, (size_t)rows * (size_t)W));
    return layer_linear_backward_rounded(c, dx, g + L->t[s->tw].offset, s->tb < 0 ? NULL : g + L->t[s->tb].offset,
                                         s->dqkv, x, attn_ptr(c, L, s->tw), rows, C, W);
}

const dt_layer_def dt_layer_def_attn = {
    .name = "attn", .help = "attn(heads[, std=0][, proj_std=0][, kv_heads][, rope=0][, bias=1][, block=0])",
    .torch = "causal self-attention (nanoGPT; with kv_heads, LlamaAttention)",
    .flags = DT_LDEF_GEMM | DT_LDEF_OUT_UNREAD | DT_LDEF_IN_GEMM, .self_size = sizeof(attn_self), .args = attn_args,
    .check = attn_check,
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
    .flags = DT_LDEF_GEMM | DT_LDEF_OUT_UNREAD | DT_LDEF_IN_GEMM, .self_size = sizeof(unembed_self),
    .infer = unembed_infer, .forward = unembed_forward, .backward = unembed_backward,
};
