/*
 * optim.c: the optimizer rows (SGD, AdamW) and the optimizer over the flat
 * parameter array, LR schedules, and clipping by global norm.
 *
 * The update rules themselves are the fused kernels of the dt_ops table
 * (sgd_update, adamw_update, with PyTorch's formulas spelled out in ops.h); a
 * row's step only maps the configuration onto its kernel's arguments. This
 * file holds the rows, the state arrays and the host-side arithmetic of
 * schedules.
 */
#include "optim.h"
#include "mem.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- SGD ---------------------------------------------------------------------- */

static int sgd_nstate(const dt_optim_config *c) { return c->momentum != 0.0f ? 1 : 0; }

static dt_status sgd_check(const dt_optim_config *c) {
    if (!(c->momentum >= 0.0f)) return dt_error(DT_ERR_INVALID, "sgd: momentum must be >= 0, got %g", (double)c->momentum);
    if (c->nesterov && (c->momentum <= 0.0f || c->dampening != 0.0f))
        return dt_error(DT_ERR_INVALID, "sgd: nesterov momentum requires a momentum and zero dampening");
    return DT_OK;
}

static dt_status sgd_step(const dt_ops *ops, const dt_optim_config *c, const dt_optim_step_args *a) {
    dt_sgd_args s = {
        .lr = a->lr, .momentum = c->momentum, .dampening = c->dampening,
        .weight_decay = c->weight_decay, .grad_scale = a->grad_scale,
        .nesterov = c->nesterov, .first_step = a->steps_done == 0, .gate = a->gate,
    };
    return ops->sgd_update(a->params, a->grads, a->state[0], a->n, &s);
}

/* ---- AdamW -------------------------------------------------------------------- */

static dt_status adamw_check(const dt_optim_config *c) {
    if (!(c->beta1 >= 0.0f && c->beta1 < 1.0f))
        return dt_error(DT_ERR_INVALID, "adamw: beta1 must be in [0, 1), got %g", (double)c->beta1);
    if (!(c->beta2 >= 0.0f && c->beta2 < 1.0f))
        return dt_error(DT_ERR_INVALID, "adamw: beta2 must be in [0, 1), got %g", (double)c->beta2);
    if (!(c->eps >= 0.0f)) return dt_error(DT_ERR_INVALID, "adamw: eps must be >= 0, got %g", (double)c->eps);
    return DT_OK;
}

static dt_status adamw_step(const dt_ops *ops, const dt_optim_config *c, const dt_optim_step_args *a) {
    dt_adamw_args s = {
        .lr = a->lr, .beta1 = c->beta1, .beta2 = c->beta2, .eps = c->eps,
        .weight_decay = c->weight_decay, .grad_scale = a->grad_scale, .step = a->steps_done + 1, .gate = a->gate,
    };
    return ops->adamw_update(a->params, a->grads, a->state[0], a->state[1], a->n, &s);
}

/* ---- the rows ----------------------------------------------------------------- */

static const dt_optim_def defs[] = {
    [DT_OPTIM_SGD] = {
        .name        = "sgd",
        .help        = "SGD with momentum, dampening and Nesterov (torch.optim.SGD)",
        .nstate      = 1,
        .state_names = { "momentum_buffer" },
        .hparams     = DT_OPTIM_HP_MOMENTUM,
        .defaults    = { .kind = DT_OPTIM_SGD },
        .train_lr    = 0.05,
        .train_weight_decay = 5e-4,
        .nstate_of   = sgd_nstate,
        .check       = sgd_check,
        .step        = sgd_step,
    },
    [DT_OPTIM_ADAMW] = {
        .name        = "adamw",
        .help        = "Adam with decoupled weight decay (torch.optim.AdamW, amsgrad off)",
        .nstate      = 2,
        .state_names = { "exp_avg", "exp_avg_sq" },
        .hparams     = DT_OPTIM_HP_BETAS | DT_OPTIM_HP_EPS,
        .defaults    = { .kind = DT_OPTIM_ADAMW, .weight_decay = 0.01f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f },
        .train_lr    = 1e-3,
        .train_weight_decay = 0.01,
        .check       = adamw_check,
        .step        = adamw_step,
    },
};
_Static_assert(sizeof defs / sizeof defs[0] == DT_OPTIM_COUNT, "one row of defs per dt_optim_kind");

const dt_optim_def *dt_optim_def_of(dt_optim_kind kind) {
    return (unsigned)kind < DT_OPTIM_COUNT ? &defs[kind] : NULL;
}

const dt_optim_def *dt_optim_find(const char *name) {
    for (int k = 0; name && k < DT_OPTIM_COUNT; k++)
        if (strcmp(name, defs[k].name) == 0) return &defs[k];
    return NULL;
}

const char *dt_optim_names(char *buf, size_t n) {
    size_t at = 0;
    if (!buf || n == 0) return buf;
    buf[0] = '\0';
    for (int k = 0; k < DT_OPTIM_COUNT && at < n; k++) {
        int w = snprintf(buf + at, n - at, "%s%s", k ? ", " : "", defs[k].name);
        if (w > 0) at += (size_t)w;
    }
    return buf;
}

dt_optim_config dt_optim_defaults(dt_optim_kind kind, float lr) {
    dt_optim_config c = { .kind = kind };
    if (dt_optim_def_of(kind)) c = defs[kind].defaults;
    c.lr = lr;
    return c;
}

int dt_optim_nstate_of(const dt_optim_config *c) {
    const dt_optim_def *d = dt_optim_def_of(c->kind);
    if (!d) return 0;
    return d->nstate_of ? d->nstate_of(c) : d->nstate;
}

static const dt_optim_hparam hparams[] = {
    { "lr", offsetof(dt_optim_config, lr), 0 },
    { "weight_decay", offsetof(dt_optim_config, weight_decay), 0 },
    { "momentum", offsetof(dt_optim_config, momentum), 0 },
    { "dampening", offsetof(dt_optim_config, dampening), 0 },
    { "nesterov", offsetof(dt_optim_config, nesterov), 1 },
    { "beta1", offsetof(dt_optim_config, beta1), 0 },
    { "beta2", offsetof(dt_optim_config, beta2), 0 },
    { "eps", offsetof(dt_optim_config, eps), 0 },
};

const dt_optim_hparam *dt_optim_hparams(int *count) {
    *count = (int)(sizeof hparams / sizeof hparams[0]);
    return hparams;
}

/* ---- the optimizer -------------------------------------------------------------- */

struct dt_optim {
    dt_optim_config     cfg;
    const dt_optim_def *def;
    const dt_ops       *ops;
    size_t              n;
    int64_t             steps;
    int                 nstate;
    float              *state[DT_OPTIM_MAX_STATE];   /* the row's state_names, in order */
    size_t             *bounds;      /* decay runs: [bounds[i], bounds[i+1]), NULL: one run */
    unsigned char      *decay;       /* per run: 1 weight decay, 0 none */
    size_t              nruns;
    const float        *gate;        /* dt_optim_set_gate */
};

static dt_status check_config(const dt_optim_config *c) {
    const dt_optim_def *d = dt_optim_def_of(c->kind);
    if (!d) return dt_error(DT_ERR_INVALID, "optimizer: unknown kind %d", (int)c->kind);
    if (!(c->lr >= 0.0f)) return dt_error(DT_ERR_INVALID, "optimizer: learning rate must be >= 0, got %g", (double)c->lr);
    if (!(c->weight_decay >= 0.0f))
        return dt_error(DT_ERR_INVALID, "optimizer: weight decay must be >= 0, got %g", (double)c->weight_decay);
    return d->check ? d->check(c) : DT_OK;
}

void dt_optim_free(dt_optim *o) {
    if (!o) return;
    for (int i = 0; i < DT_OPTIM_MAX_STATE; i++) dt_mem_free(o->ops, o->state[i]);
    free(o->bounds);
    free(o->decay);
    free(o);
}

dt_status dt_optim_set_decay_runs(dt_optim *o, const size_t *bounds, const unsigned char *decay, size_t nruns) {
    free(o->bounds);
    free(o->decay);
    o->bounds = NULL;
    o->decay = NULL;
    o->nruns = 0;
    if (!nruns) return DT_OK;
    if (bounds[0] != 0 || bounds[nruns] != o->n)
        return dt_error(DT_ERR_INVALID, "optimizer: decay runs must cover [0, %zu)", o->n);
    for (size_t i = 0; i < nruns; i++)
        if (bounds[i + 1] < bounds[i]) return dt_error(DT_ERR_INVALID, "optimizer: decay runs out of order");
    o->bounds = malloc((nruns + 1) * sizeof *o->bounds);
    o->decay = malloc(nruns);
    if (!o->bounds || !o->decay) return dt_error(DT_ERR_NOMEM, "out of memory");
    memcpy(o->bounds, bounds, (nruns + 1) * sizeof *bounds);
    memcpy(o->decay, decay, nruns);
    o->nruns = nruns;
    return DT_OK;
}

dt_status dt_optim_init(const dt_optim_config *cfg, const dt_ops *ops, size_t n, dt_optim **out) {
    *out = NULL;
    DT_TRY(check_config(cfg));
    dt_optim *o = calloc(1, sizeof *o);
    if (!o) return dt_error(DT_ERR_NOMEM, "optimizer: out of memory");
    o->cfg = *cfg;
    o->def = &defs[cfg->kind];
    o->ops = ops;
    o->n = n;
    o->nstate = dt_optim_nstate_of(cfg);
    for (int i = 0; i < o->nstate; i++) {
        dt_status s = dt_mem_alloc(ops, DT_MEM_OPTIM, (void **)&o->state[i], n * sizeof(float));
        if (s == DT_OK && n) s = ops->zero(o->state[i], n * sizeof(float));
        if (s != DT_OK) { dt_optim_free(o); return s; }
    }
    *out = o;
    return DT_OK;
}

dt_status dt_optim_step(dt_optim *o, float *params, const float *grads, float lr, float grad_scale) {
    if (o->n == 0) { o->steps++; return DT_OK; }
    dt_optim_step_args a = {
        .params = params, .grads = grads, .state = o->state, .n = o->n,
        .lr = lr, .grad_scale = grad_scale, .steps_done = o->steps, .gate = o->gate,
    };
    if (!o->nruns) {
        DT_TRY(o->def->step(o->ops, &o->cfg, &a));
    } else {   /* run by run: the update is element-wise, so the bits are those of one call */
        dt_optim_config nodecay = o->cfg;
        nodecay.weight_decay = 0.0f;
        for (size_t r = 0; r < o->nruns; r++) {
            size_t off = o->bounds[r], len = o->bounds[r + 1] - off;
            if (!len) continue;
            float *st[DT_OPTIM_MAX_STATE] = { 0 };
            for (int i = 0; i < o->nstate; i++) st[i] = o->state[i] + off;
            dt_optim_step_args ra = a;
            ra.params = params + off;
            ra.grads = grads + off;
            ra.state = st;
            ra.n = len;
            DT_TRY(o->def->step(o->ops, o->decay[r] ? &o->cfg : &nodecay, &ra));
        }
    }
    o->steps++;
    return DT_OK;
}

const dt_optim_def *dt_optim_def_in(const dt_optim *o) { return o->def; }
int     dt_optim_nstate(const dt_optim *o) { return o->nstate; }
float  *dt_optim_state(dt_optim *o, int i) { return (i >= 0 && i < o->nstate) ? o->state[i] : NULL; }
size_t  dt_optim_size(const dt_optim *o) { return o->n; }
int64_t dt_optim_steps(const dt_optim *o) { return o->steps; }
void    dt_optim_set_steps(dt_optim *o, int64_t steps) { o->steps = steps; }
void    dt_optim_set_gate(dt_optim *o, const float *gate) { o->gate = gate; }
const dt_optim_config *dt_optim_config_of(const dt_optim *o) { return &o->cfg; }

const char *dt_optim_state_name(const dt_optim *o, int i) {
    return (i >= 0 && i < o->nstate) ? o->def->state_names[i] : NULL;
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
    return dt_clip_grad_norm_scaled(ops, grads, n, max_norm, 1.0f, norm);
}

dt_status dt_clip_grad_norm_scaled(const dt_ops *ops, float *grads, size_t n, float max_norm, float unscale,
                                   float *norm) {
    float *dev = NULL, sq = 0.0f;
    if (n) {
        DT_TRY(dt_mem_alloc(ops, DT_MEM_OTHER, (void **)&dev, sizeof(float)));
        dt_status s = ops->sumsq(dev, grads, n);
        if (s == DT_OK) s = ops->copy_d2h(&sq, dev, sizeof sq);
        dt_mem_free(ops, dev);
        DT_TRY(s);
    }
    float total = dt_clip_norm(sq, unscale);
    if (norm) *norm = total;
    float coef = dt_clip_coef(max_norm, total);
    if (coef < 1.0f && n) DT_TRY(ops->scale(grads, coef, n));
    return DT_OK;
}
