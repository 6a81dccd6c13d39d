/*
 * nn.c: forward and backward of each layer kind, over the dt_ops table.
 *
 * Nothing here touches tensor data directly: every numeric step is a call into
 * the device's table, so the CUDA backend reuses this file as it is (DESIGN.md
 * rule 1). Gradient kernels overwrite their outputs; a layer's parameter
 * gradients are final when its backward returns.
 *
 * Layouts are PyTorch's: activations (B, C, H, W) or (B, F); linear weight
 * (out, in); conv weight (out, in, k, k).
 */
#include "nn.h"

#include <math.h>
#include <string.h>

#define BN_EPS      1e-5f
#define BN_MOMENTUM 0.1f
#define LN_EPS      1e-5f

/* Rows of a LayerNorm over the last dimension, per sample. */
static int64_t ln_rows(const dt_layer *L) { return L->in_numel / L->in.d[L->in.ndim - 1]; }

/* Spatial size of a (C, H, W) shape, 1 for (F). */
static int hw_of(const dt_shape *s) { return s->ndim == 3 ? (int)(s->d[1] * s->d[2]) : 1; }

dt_status dt_layer_alloc(const dt_ops *ops, dt_layer *L, int max_batch) {
    size_t outb = (size_t)max_batch * (size_t)L->out_numel * sizeof(float);
    if (L->kind != DT_LAYER_FLATTEN) DT_TRY(ops->alloc((void **)&L->y, outb));
    if (L->kind == DT_LAYER_MAXPOOL)
        DT_TRY(ops->alloc((void **)&L->idx, (size_t)max_batch * (size_t)L->out_numel * sizeof(int32_t)));
    if (L->kind == DT_LAYER_BN) {
        DT_TRY(ops->alloc((void **)&L->save, 5 * (size_t)L->in.d[0] * sizeof(float)));
        DT_TRY(ops->zero(L->save, 5 * (size_t)L->in.d[0] * sizeof(float)));
    }
    if (L->kind == DT_LAYER_LN)
        DT_TRY(ops->alloc((void **)&L->save, 2 * (size_t)max_batch * (size_t)ln_rows(L) * sizeof(float)));
    return DT_OK;
}

void dt_layer_free(const dt_ops *ops, dt_layer *L) {
    ops->free(L->y);
    ops->free(L->idx);
    ops->free(L->save);
    L->y = L->save = L->out_ptr = NULL;
    L->idx = NULL;
}

dt_status dt_layer_init(const dt_nn_ctx *c, dt_layer *L) {
    const dt_ops *o = c->ops;
    float *w = c->params + L->w_off, *b = c->params + L->b_off;
    switch (L->kind) {
    case DT_LAYER_LINEAR:
    case DT_LAYER_CONV: {
        /* kaiming_uniform(a=sqrt(5)) reduces to U(-1/sqrt(fan_in), 1/sqrt(fan_in));
         * the bias uses the same bound. */
        double fan_in = (double)L->w_numel / (double)L->out;
        float bound = (float)(1.0 / sqrt(fan_in));
        DT_TRY(o->rng_uniform(w, L->w_numel, -bound, bound, c->seed, (uint64_t)L->first_param, 0));
        if (L->b_numel)
            DT_TRY(o->rng_uniform(b, L->b_numel, -bound, bound, c->seed, (uint64_t)L->first_param + 1, 0));
        break;
    }
    case DT_LAYER_BN:
        DT_TRY(o->fill(c->buffers + L->rm_off, 0.0f, (size_t)L->in.d[0]));
        DT_TRY(o->fill(c->buffers + L->rv_off, 1.0f, (size_t)L->in.d[0]));
        L->num_batches_tracked = 0;
        DT_TRY(o->fill(w, 1.0f, L->w_numel));
        DT_TRY(o->fill(b, 0.0f, L->b_numel));
        break;
    case DT_LAYER_LN:
        DT_TRY(o->fill(w, 1.0f, L->w_numel));
        DT_TRY(o->fill(b, 0.0f, L->b_numel));
        break;
    default:
        break;
    }
    return DT_OK;
}

static void conv_desc(const dt_layer *L, int B, dt_conv2d_desc *d) {
    memset(d, 0, sizeof *d);
    d->N = B; d->C = (int)L->in.d[0]; d->H = (int)L->in.d[1]; d->W = (int)L->in.d[2];
    d->K = L->out; d->R = d->S = L->k;
    d->stride_h = d->stride_w = L->stride;
    d->pad_h = d->pad_w = L->pad;
}

static void pool_desc(const dt_layer *L, int B, dt_pool2d_desc *d) {
    memset(d, 0, sizeof *d);
    d->N = B; d->C = (int)L->in.d[0]; d->H = (int)L->in.d[1]; d->W = (int)L->in.d[2];
    d->kh = d->kw = L->k;
    d->stride_h = d->stride_w = L->stride;
    d->pad_h = d->pad_w = L->pad;
}

/* Batchnorm forward. save = [mean | invstd | s1 | s2 | zero], each (C). */
static dt_status bn_forward(const dt_nn_ctx *c, dt_layer *L, const float *x, int B) {
    const dt_ops *o = c->ops;
    int C = (int)L->in.d[0], HW = hw_of(&L->in);
    float *mean = L->save, *invstd = L->save + C, *s1 = L->save + 2 * C, *s2 = L->save + 3 * C;
    float *gamma = c->params + L->w_off, *beta = c->params + L->b_off;
    if (c->train) {
        int64_t count = (int64_t)B * HW;
        DT_TRY(o->bn_stats(s1, s2, x, B, C, HW));
        if (c->bn_sync) DT_TRY(c->bn_sync(c->bn_sync_ctx, 0, s1, 2 * (size_t)C, &count));
        if (count < 2)
            return dt_error(DT_ERR_INVALID, "layer %d '%s': batchnorm in training needs more than "
                            "1 value per channel, got %lld", L->index, L->text, (long long)count);
        if (c->bn_record) {
            /* deferred: keep the sums and count; dt_layer_bn_replay updates later */
            float *rec = c->bn_record + L->rec_off;
            DT_TRY(o->bn_finalize(mean, invstd, s1, s2, C, count, BN_EPS, NULL, NULL, BN_MOMENTUM));
            DT_TRY(o->copy_d2d(rec, s1, 2 * (size_t)C * sizeof(float)));
            DT_TRY(o->copy_h2d(rec + 2 * C, &count, sizeof count));   /* int64 bits in 2 floats */
        } else {
            DT_TRY(o->bn_finalize(mean, invstd, s1, s2, C, count, BN_EPS, c->buffers + L->rm_off,
                                  c->buffers + L->rv_off, BN_MOMENTUM));
            L->num_batches_tracked++;
        }
        L->bn_count = count;
        DT_TRY(o->bn_apply(L->y, x, mean, invstd, gamma, beta, B, C, HW, L->fuse_relu));
    } else {
        DT_TRY(o->bn_invstd(invstd, c->buffers + L->rv_off, C, BN_EPS));
        DT_TRY(o->bn_apply(L->y, x, c->buffers + L->rm_off, invstd, gamma, beta, B, C, HW, L->fuse_relu));
    }
    return DT_OK;
}

dt_status dt_layer_bn_replay(const dt_nn_ctx *c, dt_layer *L, const float *rec) {
    if (L->kind != DT_LAYER_BN) return DT_OK;
    const dt_ops *o = c->ops;
    int C = (int)L->in.d[0];
    int64_t count;
    rec += L->rec_off;
    DT_TRY(o->copy_d2h(&count, rec + 2 * C, sizeof count));
    if (count < 2) return dt_error(DT_ERR_INVALID, "layer %d '%s': batchnorm record holds count %lld",
                                   L->index, L->text, (long long)count);
    /* mean/invstd outputs go to scratch (s1, s2): the saved ones belong to backward */
    DT_TRY(o->bn_finalize(L->save + 2 * C, L->save + 3 * C, rec, rec + C, C, count, BN_EPS,
                          c->buffers + L->rm_off, c->buffers + L->rv_off, BN_MOMENTUM));
    L->num_batches_tracked++;
    return DT_OK;
}

static dt_status bn_backward(const dt_nn_ctx *c, dt_layer *L, const float *x, const float *dy,
                             float *dx, int B) {
    const dt_ops *o = c->ops;
    int C = (int)L->in.d[0], HW = hw_of(&L->in);
    float *mean = L->save, *invstd = L->save + C, *s1 = L->save + 2 * C, *zero = L->save + 4 * C;
    float *gamma = c->params + L->w_off;
    float *dgamma = c->grads + L->w_off, *dbeta = c->grads + L->b_off;
    if (!L->last_train) {
        /* Running statistics are constants: dx = dy * gamma * invstd, i.e. an
         * affine map of dy with zero mean. */
        const float *rm = c->buffers + L->rm_off;
        DT_TRY(o->bn_backward_reduce(dbeta, dgamma, dy, x, rm, invstd, B, C, HW));
        if (dx) DT_TRY(o->bn_apply(dx, dy, zero, invstd, gamma, NULL, B, C, HW, 0));
        return DT_OK;
    }
    /* dgamma, dbeta are this process's sums; dx needs the global ones under sync-BN. */
    DT_TRY(o->bn_backward_reduce(dbeta, dgamma, dy, x, mean, invstd, B, C, HW));
    if (!dx) return DT_OK;
    const float *sdy = dbeta, *sdyx = dgamma;
    if (c->bn_sync) {
        float *s = s1;  /* s1, s2 are contiguous: [sum_dy | sum_dy_xhat] */
        DT_TRY(o->copy_d2d(s, dbeta, (size_t)C * sizeof(float)));
        DT_TRY(o->copy_d2d(s + C, dgamma, (size_t)C * sizeof(float)));
        int64_t count = L->bn_count;
        DT_TRY(c->bn_sync(c->bn_sync_ctx, 1, s, 2 * (size_t)C, &count));
        sdy = s;
        sdyx = s + C;
    }
    return o->bn_backward_dx(dx, dy, x, mean, invstd, gamma, sdy, sdyx, B, C, HW, L->bn_count);
}

dt_status dt_layer_forward(const dt_nn_ctx *c, dt_layer *L, const float *x, int B) {
    const dt_ops *o = c->ops;
    size_t n = (size_t)B * (size_t)L->out_numel;
    float *w = c->params + L->w_off, *b = L->b_numel ? c->params + L->b_off : NULL;
    L->out_ptr = L->y;
    L->last_train = c->train;
    switch (L->kind) {
    case DT_LAYER_LINEAR: {
        /* y (B, out) = x (B, in) @ W^T (in, out) + b */
        int in = (int)L->in_numel;
        DT_TRY(o->sgemm(0, 1, B, L->out, in, 1.0f, x, in, w, in, 0.0f, L->y, L->out));
        if (b) return L->fuse_relu ? o->bias_relu(L->y, b, B, L->out) : o->bias_add(L->y, b, B, L->out);
        return L->fuse_relu ? o->relu_forward(L->y, L->y, n) : DT_OK;
    }
    case DT_LAYER_CONV: {
        dt_conv2d_desc d;
        conv_desc(L, B, &d);
        DT_TRY(dt_conv2d_desc_init(&d));
        return o->conv2d_forward(&d, L->y, x, w, b, L->fuse_relu);
    }
    case DT_LAYER_MAXPOOL:
    case DT_LAYER_AVGPOOL: {
        dt_pool2d_desc d;
        pool_desc(L, B, &d);
        DT_TRY(dt_pool2d_desc_init(&d));
        if (L->kind == DT_LAYER_MAXPOOL) return o->maxpool2d_forward(&d, L->y, L->idx, x);
        return o->avgpool2d_forward(&d, L->y, x);
    }
    case DT_LAYER_GAP:
        return o->global_avgpool_forward(L->y, x, B, (int)L->in.d[0], hw_of(&L->in));
    case DT_LAYER_BN:
        return bn_forward(c, L, x, B);
    case DT_LAYER_LN: {
        int cols = (int)L->in.d[L->in.ndim - 1];
        int rows = (int)((int64_t)B * ln_rows(L));
        return o->layernorm_forward(L->y, L->save, L->save + rows, x, w, b, rows, cols, LN_EPS);
    }
    case DT_LAYER_RELU:
        if (L->relu_fused) { L->out_ptr = (float *)x; return DT_OK; }  /* applied by the layer before */
        return o->relu_forward(L->y, x, n);
    case DT_LAYER_GELU: return o->gelu_forward(L->y, x, n);
    case DT_LAYER_TANH: return o->tanh_forward(L->y, x, n);
    case DT_LAYER_DROPOUT:
        if (!c->train) { L->out_ptr = (float *)x; return DT_OK; }
        return o->dropout_forward(L->y, x, B, (int)L->in_numel, L->p, c->seed, (uint32_t)L->index,
                                  c->epoch, c->sample0);
    case DT_LAYER_FLATTEN:
        L->out_ptr = (float *)x;   /* same memory, another shape */
        return DT_OK;
    case DT_LAYER_NKINDS:
        break;
    }
    return dt_error(DT_ERR_INTERNAL, "layer %d: unknown kind %d", L->index, (int)L->kind);
}

dt_status dt_layer_backward(const dt_nn_ctx *c, dt_layer *L, const float *x, const float *dy,
                            float *dx, int B) {
    const dt_ops *o = c->ops;
    size_t n = (size_t)B * (size_t)L->in_numel;
    float *w = c->params + L->w_off;
    float *dw = c->grads + L->w_off, *db = L->b_numel ? c->grads + L->b_off : NULL;
    switch (L->kind) {
    case DT_LAYER_LINEAR: {
        int in = (int)L->in_numel;
        /* dW (out, in) = dy^T (out, B) @ x (B, in); db (out) = column sums of dy */
        DT_TRY(o->sgemm(1, 0, L->out, in, B, 1.0f, dy, L->out, x, in, 0.0f, dw, in));
        if (db) DT_TRY(o->bias_grad(db, dy, B, L->out));
        /* dx (B, in) = dy (B, out) @ W (out, in) */
        if (dx) DT_TRY(o->sgemm(0, 0, B, in, L->out, 1.0f, dy, L->out, w, in, 0.0f, dx, in));
        return DT_OK;
    }
    case DT_LAYER_CONV: {
        dt_conv2d_desc d;
        conv_desc(L, B, &d);
        DT_TRY(dt_conv2d_desc_init(&d));
        return o->conv2d_backward(&d, dx, dw, db, dy, x, w);
    }
    case DT_LAYER_MAXPOOL:
    case DT_LAYER_AVGPOOL: {
        if (!dx) return DT_OK;
        dt_pool2d_desc d;
        pool_desc(L, B, &d);
        DT_TRY(dt_pool2d_desc_init(&d));
        if (L->kind == DT_LAYER_MAXPOOL) return o->maxpool2d_backward(&d, dx, dy, L->idx);
        return o->avgpool2d_backward(&d, dx, dy);
    }
    case DT_LAYER_GAP:
        if (!dx) return DT_OK;
        return o->global_avgpool_backward(dx, dy, B, (int)L->in.d[0], hw_of(&L->in));
    case DT_LAYER_BN:
        return bn_backward(c, L, x, dy, dx, B);
    case DT_LAYER_LN: {
        int cols = (int)L->in.d[L->in.ndim - 1];
        int rows = (int)((int64_t)B * ln_rows(L));
        /* the kernel always writes dx; use the output buffer as scratch when the
         * caller does not want it (this layer's output is dead in backward) */
        return o->layernorm_backward(dx ? dx : L->y, dw, db, dy, x, L->save, L->save + rows, w, rows, cols);
    }
    case DT_LAYER_RELU: return dx ? o->relu_backward(dx, dy, L->relu_fused ? x : L->y, n) : DT_OK;
    case DT_LAYER_GELU: return dx ? o->gelu_backward(dx, dy, x, n) : DT_OK;
    case DT_LAYER_TANH: return dx ? o->tanh_backward(dx, dy, L->y, n) : DT_OK;
    case DT_LAYER_DROPOUT:
        if (!dx) return DT_OK;
        if (!L->last_train) return dx == dy ? DT_OK : o->copy_d2d(dx, dy, n * sizeof(float));
        return o->dropout_backward(dx, dy, B, (int)L->in_numel, L->p, c->seed, (uint32_t)L->index,
                                   c->epoch, c->sample0);
    case DT_LAYER_FLATTEN:
        if (!dx || dx == dy) return DT_OK;
        return o->copy_d2d(dx, dy, n * sizeof(float));
    case DT_LAYER_NKINDS:
        break;
    }
    return dt_error(DT_ERR_INTERNAL, "layer %d: unknown kind %d", L->index, (int)L->kind);
}
