/*
 * optim.c: SGD and AdamW over the flat parameter array, LR schedules, and
 * clipping by global norm.
 *
 * The update rules themselves are the fused kernels of the dt_ops table
 * (sgd_update, adamw_update, with PyTorch's formulas spelled out in ops.h);
 * this file holds their state and the host-side arithmetic of schedules.
 */
#include "optim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct dt_optim {
    dt_optim_config cfg;
    const dt_ops   *ops;
    size_t          n;
    int64_t         steps;
    int             nstate;
    float          *state[2];   /* SGD: momentum_buffer; AdamW: exp_avg, exp_avg_sq */
};

dt_optim_config dt_optim_sgd_defaults(float lr) {
    dt_optim_config c = { .kind = DT_OPTIM_SGD, .lr = lr };
    return c;
}

dt_optim_config dt_optim_adamw_defaults(float lr) {
    dt_optim_config c = { .kind = DT_OPTIM_ADAMW, .lr = lr, .weight_decay = 0.01f,
                          .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f };
    return c;
}

static dt_status check_config(const dt_optim_config *c) {
    if (!(c->lr >= 0.0f)) return dt_error(DT_ERR_INVALID, "optimizer: learning rate must be >= 0, got %g", (double)c->lr);
    if (!(c->weight_decay >= 0.0f))
        return dt_error(DT_ERR_INVALID, "optimizer: weight decay must be >= 0, got %g", (double)c->weight_decay);
    if (c->kind == DT_OPTIM_SGD) {
        if (!(c->momentum >= 0.0f)) return dt_error(DT_ERR_INVALID, "sgd: momentum must be >= 0, got %g", (double)c->momentum);
        if (c->nesterov && (c->momentum <= 0.0f || c->dampening != 0.0f))
            return dt_error(DT_ERR_INVALID, "sgd: nesterov momentum requires a momentum and zero dampening");
    } else if (c->kind == DT_OPTIM_ADAMW) {
        if (!(c->beta1 >= 0.0f && c->beta1 < 1.0f))
            return dt_error(DT_ERR_INVALID, "adamw: beta1 must be in [0, 1), got %g", (double)c->beta1);
        if (!(c->beta2 >= 0.0f && c->beta2 < 1.0f))
            return dt_error(DT_ERR_INVALID, "adamw: beta2 must be in [0, 1), got %g", (double)c->beta2);
        if (!(c->eps >= 0.0f)) return dt_error(DT_ERR_INVALID, "adamw: eps must be >= 0, got %g", (double)c->eps);
    } else {
        return dt_error(DT_ERR_INVALID, "optimizer: unknown kind %d", (int)c->kind);
    }
    return DT_OK;
}

void dt_optim_free(dt_optim *o) {
    if (!o) return;
    o->ops->free(o->state[0]);
    o->ops->free(o->state[1]);
    free(o);
}

dt_status dt_optim_init(const dt_optim_config *cfg, const dt_ops *ops, size_t n, dt_optim **out) {
    *out = NULL;
    DT_TRY(check_config(cfg));
    dt_optim *o = calloc(1, sizeof *o);
    if (!o) return dt_error(DT_ERR_NOMEM, "optimizer: out of memory");
    o->cfg = *cfg;
    o->ops = ops;
    o->n = n;
    o->nstate = cfg->kind == DT_OPTIM_ADAMW ? 2 : (cfg->momentum != 0.0f ? 1 : 0);
    for (int i = 0; i < o->nstate; i++) {
        dt_status s = ops->alloc((void **)&o->state[i], n * sizeof(float));
        if (s == DT_OK && n) s = ops->zero(o->state[i], n * sizeof(float));
        if (s != DT_OK) { dt_optim_free(o); return s; }
    }
    *out = o;
    return DT_OK;
}

dt_status dt_optim_step(dt_optim *o, float *params, const float *grads, float lr, float grad_scale) {
    if (o->n == 0) { o->steps++; return DT_OK; }
    if (o->cfg.kind == DT_OPTIM_SGD) {
        dt_sgd_args a = {
            .lr = lr, .momentum = o->cfg.momentum, .dampening = o->cfg.dampening,
            .weight_decay = o->cfg.weight_decay, .grad_scale = grad_scale,
            .nesterov = o->cfg.nesterov, .first_step = o->steps == 0,
        };
        DT_TRY(o->ops->sgd_update(params, grads, o->state[0], o->n, &a));
    } else {
        dt_adamw_args a = {
            .lr = lr, .beta1 = o->cfg.beta1, .beta2 = o->cfg.beta2, .eps = o->cfg.eps,
            .weight_decay = o->cfg.weight_decay, .grad_scale = grad_scale, .step = o->steps + 1,
        };
        DT_TRY(o->ops->adamw_update(params, grads, o->state[0], o->state[1], o->n, &a));
    }
    o->steps++;
    return DT_OK;
}

int     dt_optim_nstate(const dt_optim *o) { return o->nstate; }
float  *dt_optim_state(dt_optim *o, int i) { return (i >= 0 && i < o->nstate) ? o->state[i] : NULL; }
size_t  dt_optim_size(const dt_optim *o) { return o->n; }
int64_t dt_optim_steps(const dt_optim *o) { return o->steps; }
void    dt_optim_set_steps(dt_optim *o, int64_t steps) { o->steps = steps; }
const dt_optim_config *dt_optim_config_of(const dt_optim *o) { return &o->cfg; }

const char *dt_optim_state_name(const dt_optim *o, int i) {
    if (i < 0 || i >= o->nstate) return NULL;
    if (o->cfg.kind == DT_OPTIM_SGD) return "momentum_buffer";
    return i == 0 ? "exp_avg" : "exp_avg_sq";
}

/* ---- schedules ---------------------------------------------------------------- */

dt_status dt_schedule_check(const dt_schedule *s) {
    if (!(s->base_lr >= 0.0f)) return dt_error(DT_ERR_INVALID, "schedule: learning rate must be >= 0, got %g", (double)s->base_lr);
    if (s->warmup_steps < 0) return dt_error(DT_ERR_INVALID, "schedule: warm-up steps must be >= 0");
    switch (s->kind) {
    case DT_SCHED_CONSTANT: return DT_OK;
    case DT_SCHED_STEP:
        if (s->step_size <= 0) return dt_error(DT_ERR_INVALID, "schedule step: step size must be positive, got %lld", (long long)s->step_size);
        if (!(s->gamma > 0.0f)) return dt_error(DT_ERR_INVALID, "schedule step: gamma must be positive, got %g", (double)s->gamma);
        return DT_OK;
    case DT_SCHED_COSINE:
        if (s->total_steps <= s->warmup_steps)
            return dt_error(DT_ERR_INVALID, "schedule cosine: total steps (%lld) must exceed the warm-up steps (%lld)",
                            (long long)s->total_steps, (long long)s->warmup_steps);
        return DT_OK;
    }
    return dt_error(DT_ERR_INVALID, "schedule: unknown kind %d", (int)s->kind);
}

float dt_schedule_lr(const dt_schedule *s, int64_t step) {
    if (step < 0) step = 0;
    if (step < s->warmup_steps) return (float)((double)s->base_lr * (double)(step + 1) / (double)s->warmup_steps);
    int64_t t = step - s->warmup_steps;
    switch (s->kind) {
    case DT_SCHED_STEP:
        return (float)((double)s->base_lr * pow((double)s->gamma, (double)(t / s->step_size)));
    case DT_SCHED_COSINE: {
        int64_t T = s->total_steps - s->warmup_steps;
        if (T <= 0) return s->min_lr;
        if (t > T) t = T;
        return (float)((double)s->min_lr + ((double)s->base_lr - (double)s->min_lr) *
                       (1.0 + cos(3.14159265358979323846 * (double)t / (double)T)) / 2.0);
    }
    case DT_SCHED_CONSTANT:
    default:
        return s->base_lr;
    }
}

/* ---- clipping ------------------------------------------------------------------ */

dt_status dt_clip_grad_norm(const dt_ops *ops, float *grads, size_t n, float max_norm, float *norm) {
    float *dev = NULL, sq = 0.0f;
    if (n) {
        DT_TRY(ops->alloc((void **)&dev, sizeof(float)));
        dt_status s = ops->sumsq(dev, grads, n);
        if (s == DT_OK) s = ops->copy_d2h(&sq, dev, sizeof sq);
        ops->free(dev);
        DT_TRY(s);
    }
    float total = sqrtf(sq);
    if (norm) *norm = total;
    if (max_norm > 0.0f && n) {
        float coef = max_norm / (total + 1e-6f);
        if (coef < 1.0f) DT_TRY(ops->scale(grads, coef, n));
    }
    return DT_OK;
}
