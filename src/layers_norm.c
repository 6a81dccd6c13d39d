/*
 * layers_norm.c: the normalisation rows of the layer table — batchnorm (1d
 * and 2d), layer norm and RMS norm.
 *
 * Batchnorm's statistics are plain per-channel sums so that DDP can make them
 * global (synchronised batchnorm, the bn_sync hook) and so that the trainer
 * can defer the running-statistics update (a record per micro-batch, replayed
 * in global order on every rank: world-size invariance of the buffers).
 */
#include "layers.h"

#include <stddef.h>
#include <string.h>

#define BN_EPS      1e-5f
#define BN_MOMENTUM 0.1f
#define LN_EPS      1e-5f

/* ---- batchnorm ------------------------------------------------------------
 * tensors: 0 weight (C), 1 bias (C), 2 running_mean (C), 3 running_var (C),
 * 4 num_batches_tracked; save = [mean | invstd | s1 | s2 | zero], each (C). */

typedef struct {
    int64_t num_batches_tracked;
    int64_t count;           /* values per channel behind the last train statistics */
    float  *save;
} bn_self;

static dt_status bn_infer(dt_layer *L, dt_shape *out) {
    bn_self *s = LAYER_SELF(bn_self, L);
    int64_t C = L->in.d[0];
    *out = L->in;
    DT_TRY(dt_layer_tensor_add(L, "weight", DT_TENSOR_PARAM, NULL, 1, &C));
    DT_TRY(dt_layer_tensor_add(L, "bias", DT_TENSOR_PARAM, NULL, 1, &C));
    DT_TRY(dt_layer_tensor_add(L, "running_mean", DT_TENSOR_BUFFER, NULL, 1, &C));
    DT_TRY(dt_layer_tensor_add(L, "running_var", DT_TENSOR_BUFFER, NULL, 1, &C));
    DT_TRY(dt_layer_tensor_add(L, "num_batches_tracked", DT_TENSOR_COUNTER, &s->num_batches_tracked, 0, NULL));
    L->nrecord = 2 * (size_t)C;   /* [sum | sumsq]; the count is the host's (bn_replay) */
    return DT_OK;
}

static dt_status bn_alloc(dt_layer_mem *a, dt_layer *L, int max_batch) {
    (void)max_batch;
    return dt_layer_mem_take(a, L, (void **)&LAYER_SELF(bn_self, L)->save, 5 * (size_t)L->in.d[0] * sizeof(float));
}

static dt_status bn_init(const dt_nn_ctx *c, dt_layer *L) {
    const dt_ops *o = c->ops;
    size_t C = (size_t)L->in.d[0];
    DT_TRY(o->fill(dt_layer_tensor_ptr(c, L, 2), 0.0f, C));
    DT_TRY(o->fill(dt_layer_tensor_ptr(c, L, 3), 1.0f, C));
    LAYER_SELF(bn_self, L)->num_batches_tracked = 0;
    DT_TRY(o->fill(dt_layer_tensor_ptr(c, L, 0), 1.0f, C));
    return o->fill(dt_layer_tensor_ptr(c, L, 1), 0.0f, C);
}

static dt_status bn_forward(const dt_nn_ctx *c, dt_layer *L, const float *x, int B) {
    const dt_ops *o = c->ops;
    bn_self *s = LAYER_SELF(bn_self, L);
    int C = (int)L->in.d[0], HW = layer_hw(&L->in);
    float *mean = s->save, *invstd = s->save + C, *s1 = s->save + 2 * C, *s2 = s->save + 3 * C;
    float *gamma = dt_layer_tensor_ptr(c, L, 0), *beta = dt_layer_tensor_ptr(c, L, 1);
    float *rm = dt_layer_tensor_ptr(c, L, 2), *rv = dt_layer_tensor_ptr(c, L, 3);
    if (!c->train) {
        DT_TRY(o->bn_invstd(invstd, rv, C, BN_EPS));
        return o->bn_apply(L->y, x, rm, invstd, gamma, beta, B, C, HW, L->fuse_relu);
    }
    int64_t count = (int64_t)B * HW;
    DT_TRY(o->bn_stats(s1, s2, x, B, C, HW));
    if (c->bn_sync) DT_TRY(c->bn_sync(c->bn_sync_ctx, 0, s1, 2 * (size_t)C, &count));
    if (count < 2)
        return dt_error(DT_ERR_INVALID, "layer %s '%s': batchnorm in training needs more than "
                        "1 value per channel, got %lld", L->name, L->text, (long long)count);
    if (c->bn_record || c->recompute) {
        /* deferred: keep the sums; the replay updates the buffers later. A recomputation
         * leaves the running buffers (and the record, the same) alone. */
        DT_TRY(o->bn_finalize(mean, invstd, s1, s2, C, count, BN_EPS, NULL, NULL, BN_MOMENTUM));
        if (c->bn_record && !c->recompute) {
            float *rec = c->bn_record + L->rec_off;
            DT_TRY(o->copy_d2d(rec, s1, 2 * (size_t)C * sizeof(float)));
        }
    } else {
        DT_TRY(o->bn_finalize(mean, invstd, s1, s2, C, count, BN_EPS, rm, rv, BN_MOMENTUM));
        s->num_batches_tracked++;
    }
    s->count = count;
    return o->bn_apply(L->y, x, mean, invstd, gamma, beta, B, C, HW, L->fuse_relu);
}

/* A record's count is the replay's batch (the model's micro-batch size) times the
 * positions per channel, or this layer's last train forward's, known on the host: every
 * micro-batch of a step has the same size on every rank, so no record needs to carry it
 * (and the replay reads nothing back from the device). */
static dt_status bn_replay(const dt_nn_ctx *c, dt_layer *L, const float *rec) {
    const dt_ops *o = c->ops;
    bn_self *s = LAYER_SELF(bn_self, L);
    int C = (int)L->in.d[0];
    int64_t count = c->replay_batch > 0 ? (int64_t)c->replay_batch * layer_hw(&L->in) : s->count;
    if (count < 2) return dt_error(DT_ERR_INVALID, "layer %s '%s': batchnorm replay before a train forward "
                                   "(count %lld)", L->name, L->text, (long long)count);
    /* mean/invstd outputs go to scratch (the model's, or s1, s2): the saved ones belong to
     * backward */
    float *m0 = c->replay_scratch[0] ? c->replay_scratch[0] : s->save + 2 * C;
    float *m1 = c->replay_scratch[1] ? c->replay_scratch[1] : s->save + 3 * C;
    DT_TRY(o->bn_finalize(m0, m1, rec, rec + C, C, count, BN_EPS,
                          dt_layer_tensor_ptr(c, L, 2), dt_layer_tensor_ptr(c, L, 3), BN_MOMENTUM));
    s->num_batches_tracked++;
    return DT_OK;
}

static dt_status bn_backward(const dt_nn_ctx *c, dt_layer *L, const float *x, const float *dy,
                             float *dx, int B) {
    const dt_ops *o = c->ops;
    bn_self *s = LAYER_SELF(bn_self, L);
    int C = (int)L->in.d[0], HW = layer_hw(&L->in);
    float *mean = s->save, *invstd = s->save + C, *s1 = s->save + 2 * C, *zero = s->save + 4 * C;
    float *gamma = dt_layer_tensor_ptr(c, L, 0);
    float *dgamma = c->grads + L->t[0].offset, *dbeta = c->grads + L->t[1].offset;
    if (!L->last_train) {
        /* Running statistics are constants: dx = dy * gamma * invstd, i.e. an
         * affine map of dy with zero mean. */
        DT_TRY(o->bn_backward_reduce(dbeta, dgamma, dy, x, dt_layer_tensor_ptr(c, L, 2), invstd, B, C, HW));
        if (dx) {   /* the save's memory may be shared (recomputed blocks): zero it here */
            DT_TRY(o->fill(zero, 0.0f, (size_t)C));
            DT_TRY(o->bn_apply(dx, dy, zero, invstd, gamma, NULL, B, C, HW, 0));
        }
        return DT_OK;
    }
    /* dgamma, dbeta are this process's sums; dx needs the global ones under sync-BN. */
    DT_TRY(o->bn_backward_reduce(dbeta, dgamma, dy, x, mean, invstd, B, C, HW));
    if (!dx) return DT_OK;
    const float *sdy = dbeta, *sdyx = dgamma;
    if (c->bn_sync) {
        float *st = s1;  /* s1, s2 are contiguous: [sum_dy | sum_dy_xhat] */
        DT_TRY(o->copy_d2d(st, dbeta, (size_t)C * sizeof(float)));
        DT_TRY(o->copy_d2d(st + C, dgamma, (size_t)C * sizeof(float)));
        int64_t count = s->count;
        DT_TRY(c->bn_sync(c->bn_sync_ctx, 1, st, 2 * (size_t)C, &count));
        sdy = st;
        sdyx = st + C;
    }
    return o->bn_backward_dx(dx, dy, x, mean, invstd, gamma, sdy, sdyx, B, C, HW, s->count);
}

const dt_layer_def dt_layer_def_bn = {
    .name = "bn", .help = "bn", .torch = "nn.BatchNorm1d / nn.BatchNorm2d",
    .flags = DT_LDEF_FUSE_RELU, .self_size = sizeof(bn_self),
    .infer = bn_infer, .alloc = bn_alloc, .init = bn_init,
    .forward = bn_forward, .backward = bn_backward, .replay = bn_replay,
};

/* ---- layer norm over the last dimension ------------------------------------
 * tensors: 0 weight (cols), 1 bias (cols); save = [mean | rstd], (rows) each. */

typedef struct { float *save; } ln_self;

static int64_t ln_cols(const dt_layer *L) { return L->in.d[L->in.ndim - 1]; }
static int64_t ln_rows(const dt_layer *L) { return L->in_numel / ln_cols(L); }

static dt_status ln_infer(dt_layer *L, dt_shape *out) {
    int64_t cols = ln_cols(L);
    *out = L->in;
    DT_TRY(dt_layer_tensor_add(L, "weight", DT_TENSOR_PARAM, NULL, 1, &cols));
    return dt_layer_tensor_add(L, "bias", DT_TENSOR_PARAM, NULL, 1, &cols);
}

static dt_status ln_alloc(dt_layer_mem *a, dt_layer *L, int max_batch) {
    return dt_layer_mem_take(a, L, (void **)&LAYER_SELF(ln_self, L)->save,
                             2 * (size_t)max_batch * (size_t)ln_rows(L) * sizeof(float));
}

static dt_status ln_init(const dt_nn_ctx *c, dt_layer *L) {
    DT_TRY(c->ops->fill(dt_layer_tensor_ptr(c, L, 0), 1.0f, (size_t)ln_cols(L)));
    return c->ops->fill(dt_layer_tensor_ptr(c, L, 1), 0.0f, (size_t)ln_cols(L));
}

static dt_status ln_forward(const dt_nn_ctx *c, dt_layer *L, const float *x, int B) {
    float *save = LAYER_SELF(ln_self, L)->save;
    int cols = (int)ln_cols(L), rows = (int)((int64_t)B * ln_rows(L));
    return c->ops->layernorm_forward(L->y, save, save + rows, x, dt_layer_tensor_ptr(c, L, 0),
                                     dt_layer_tensor_ptr(c, L, 1), rows, cols, LN_EPS);
}

static dt_status ln_backward(const dt_nn_ctx *c, dt_layer *L, const float *x, const float *dy,
                             float *dx, int B) {
    float *save = LAYER_SELF(ln_self, L)->save;
    int cols = (int)ln_cols(L), rows = (int)((int64_t)B * ln_rows(L));
    /* the kernel always writes dx; use the output buffer as scratch when the caller does
     * not want it (the first layer of a range: its output is dead in backward, and it is
     * not the loss's gradient, which a model of one layer keeps in the head) */
    return c->ops->layernorm_backward(dx ? dx : L->y, c->grads + L->t[0].offset, c->grads + L->t[1].offset,
                                      dy, x, save, save + rows, dt_layer_tensor_ptr(c, L, 0), rows, cols);
}

const dt_layer_def dt_layer_def_ln = {
    .name = "ln", .help = "ln", .torch = "nn.LayerNorm",
    .flags = DT_LDEF_OUT_UNREAD, .self_size = sizeof(ln_self),
    .infer = ln_infer, .alloc = ln_alloc, .init = ln_init,
    .forward = ln_forward, .backward = ln_backward,
};

/* ---- RMS norm over the last dimension (Llama's RMSNorm: no mean, no bias) ------
 * tensors: 0 weight (cols); save = rstd (rows). */

typedef struct { float eps; float *rstd; } rms_self;

static const dt_arg_def rms_args[] = {
    { "eps", DT_ARG_FLOAT, offsetof(rms_self, eps), 0, 1e-5, 0, 1, 0, "'eps' expects a number in [0, 1]" },
    { 0 }
};

static dt_status rms_infer(dt_layer *L, dt_shape *out) {
    int64_t cols = ln_cols(L);
    *out = L->in;
    return dt_layer_tensor_add(L, "weight", DT_TENSOR_PARAM, NULL, 1, &cols);
}

static dt_status rms_alloc(dt_layer_mem *a, dt_layer *L, int max_batch) {
    return dt_layer_mem_take(a, L, (void **)&LAYER_SELF(rms_self, L)->rstd,
                             (size_t)max_batch * (size_t)ln_rows(L) * sizeof(float));
}

static dt_status rms_init(const dt_nn_ctx *c, dt_layer *L) {
    return c->ops->fill(dt_layer_tensor_ptr(c, L, 0), 1.0f, (size_t)ln_cols(L));
}

static dt_status rms_forward(const dt_nn_ctx *c, dt_layer *L, const float *x, int B) {
    rms_self *s = LAYER_SELF(rms_self, L);
    int cols = (int)ln_cols(L), rows = (int)((int64_t)B * ln_rows(L));
    return c->ops->rmsnorm_forward(L->y, s->rstd, x, dt_layer_tensor_ptr(c, L, 0), rows, cols, s->eps);
}

static dt_status rms_backward(const dt_nn_ctx *c, dt_layer *L, const float *x, const float *dy, float *dx, int B) {
    int cols = (int)ln_cols(L), rows = (int)((int64_t)B * ln_rows(L));
    return c->ops->rmsnorm_backward(dx, c->grads + L->t[0].offset, dy, x, LAYER_SELF(rms_self, L)->rstd,
                                    dt_layer_tensor_ptr(c, L, 0), rows, cols);
}

const dt_layer_def dt_layer_def_rmsnorm = {
    .name = "rmsnorm", .help = "rmsnorm([eps=1e-5])", .torch = "RMSNorm (transformers' LlamaRMSNorm)",
    .flags = DT_LDEF_OUT_UNREAD, .self_size = sizeof(rms_self), .args = rms_args,
    .infer = rms_infer, .alloc = rms_alloc, .init = rms_init,
    .forward = rms_forward, .backward = rms_backward,
};
