/*
 * amp.c: mixed-precision training above the model (see amp.h): names, the loss
 * scaler, the found-inf decision across ranks and the trainer's state.
 *
 * The scaler's rule is ATen's _amp_update_scale_ (aten/src/ATen/native/cuda/
 * AmpKernels.cu, amp_update_scale_cuda_kernel, the only implementation in PyTorch 1.13):
 * the scale is an f32 multiplied by the double factor and narrowed to f32, the tracker
 * an int32. tests/torch_amp.sh holds it against GradScaler's Python driven step by step.
 */
#include "amp.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testing.h"

/* ---- names ---- */

static const struct { const char *name; dt_dtype t; } precisions[] = {
    {"fp32", DT_F32}, {"bf16", DT_BF16}, {"fp16", DT_F16},
};

dt_status dt_precision_parse(const char *name, dt_dtype *out) {
    for (size_t i = 0; name && i < sizeof precisions / sizeof precisions[0]; i++)
        if (!strcmp(name, precisions[i].name)) {
            *out = precisions[i].t;
            return DT_OK;
        }
    return dt_error(DT_ERR_INVALID, "precision: expected fp32, bf16 or fp16, got '%s'", name ? name : "(null)");
}

const char *dt_precision_name(dt_dtype p) {
    for (size_t i = 0; i < sizeof precisions / sizeof precisions[0]; i++)
        if (precisions[i].t == p) return precisions[i].name;
    return "?";
}

dt_status dt_grad_dtype_parse(const char *name, dt_dtype *out) {
    if (name && !strcmp(name, "f32")) *out = DT_F32;
    else if (name && !strcmp(name, "bf16")) *out = DT_BF16;
    else return dt_error(DT_ERR_INVALID, "grad_dtype: expected f32 or bf16, got '%s'", name ? name : "(null)");
    return DT_OK;
}

/* ---- the scaler ---- */

void dt_scaler_opts_default(dt_scaler_opts *o) {
    o->init_scale = 65536.0;
    o->growth_factor = 2.0;
    o->backoff_factor = 0.5;
    o->growth_interval = 2000;
}

void dt_scaler_init(dt_scaler *s, const dt_scaler_opts *o) {
    if (o) s->o = *o;
    else dt_scaler_opts_default(&s->o);
    s->scale = (float)s->o.init_scale;   /* torch.full((1,), init_scale, dtype=float32) */
    s->growth_tracker = 0;
}

void dt_scaler_update(dt_scaler *s, int found_inf) {
    if (found_inf) {
        s->scale = (float)((double)s->scale * s->o.backoff_factor);
        s->growth_tracker = 0;
        return;
    }
    int32_t successful = s->growth_tracker + 1;
    if (successful == s->o.growth_interval) {
        float grown = (float)((double)s->scale * s->o.growth_factor);
        if (isfinite(grown)) s->scale = grown;   /* never past f32's range to inf */
        s->growth_tracker = 0;
    } else {
        s->growth_tracker = successful;
    }
}

dt_status dt_found_inf(const dt_ops *ops, dt_comm *comm, int32_t *flag, const float *grads, size_t n, int *found) {
    int32_t f = 0;
    DT_TRY(ops->nonfinite(flag, grads, n));
    DT_TRY(ops->copy_d2h(&f, flag, sizeof f));
    if (comm && dt_comm_size(comm) > 1) DT_TRY(dt_allreduce(comm, &f, &f, 1, DT_I32, DT_MAX));
    *found = f != 0;
    return DT_OK;
}

/* ---- a trainer's state ---- */

struct dt_amp {
    dt_model  *model;
    dt_comm   *comm;
    dt_dtype   precision, grad_dtype;
    int        scaling;      /* fp16: the loss scaler runs */
    dt_scaler  scaler;
    float      step_scale;   /* the scale of the last checked step */
    int64_t    skipped;
    int32_t   *flag;         /* device word for nonfinite */
};

dt_status dt_amp_init(const char *precision, const char *grad_dtype, dt_model *m, dt_comm *comm, dt_amp **out) {
    *out = NULL;
    dt_dtype p = DT_F32, g = DT_F32;
    if (precision) DT_TRY(dt_precision_parse(precision, &p));
    if (grad_dtype) DT_TRY(dt_grad_dtype_parse(grad_dtype, &g));
    dt_amp *a = calloc(1, sizeof *a);
    if (!a) return dt_error(DT_ERR_NOMEM, "precision: out of memory");
    a->model = m;
    a->comm = comm;
    a->precision = p;
    a->grad_dtype = g;
    a->scaling = p == DT_F16;
    dt_scaler_init(&a->scaler, NULL);
    const dt_ops *ops = dt_model_ops(m);
    dt_status s = dt_model_set_precision(m, p);
    if (s == DT_OK && a->scaling) s = ops->alloc((void **)&a->flag, sizeof *a->flag);
    if (s != DT_OK) {
        dt_amp_free(a);
        return s;
    }
    *out = a;
    return DT_OK;
}

void dt_amp_free(dt_amp *a) {
    if (!a) return;
    dt_model_ops(a->model)->free(a->flag);
    free(a);
}

dt_status dt_amp_set_scaler(dt_amp *a, const dt_scaler_opts *o) {
    if (!a->scaling) return dt_error(DT_ERR_INVALID, "loss scaler: only fp16 scales its loss");
    if (!(o->init_scale > 0.0) || !isfinite((float)o->init_scale) || !(o->growth_factor > 1.0) ||
        !(o->backoff_factor > 0.0 && o->backoff_factor < 1.0) || o->growth_interval < 1)
        return dt_error(DT_ERR_INVALID, "loss scaler: expected init_scale > 0, growth_factor > 1, backoff_factor in "
                        "(0, 1) and growth_interval >= 1");
    dt_scaler_init(&a->scaler, o);
    return DT_OK;
}

dt_dtype dt_amp_precision(const dt_amp *a) { return a->precision; }
dt_dtype dt_amp_grad_dtype(const dt_amp *a) { return a->grad_dtype; }
double   dt_amp_step_scale(const dt_amp *a) { return a->scaling ? (double)a->step_scale : 0.0; }
double   dt_amp_scale(const dt_amp *a) { return a->scaling ? (double)a->scaler.scale : 0.0; }
int64_t  dt_amp_skipped(const dt_amp *a) { return a->skipped; }

void dt_amp_begin_step(dt_amp *a) { dt_model_set_loss_scale(a->model, a->scaling ? a->scaler.scale : 1.0f); }

/* A planted overflow (testing.h): the last rank's gradient gets an inf at the named step. */
static dt_status plant_inf(dt_amp *a, int64_t g, float *grads, size_t n) {
    int rank = a->comm ? dt_comm_rank(a->comm) : 0, world = a->comm ? dt_comm_size(a->comm) : 1;
    if (dt_testing_fault() != DT_FAULT_GRAD_INF || g + 1 != dt_testing_fault_step() || rank != world - 1 || !n)
        return DT_OK;
    const float inf = INFINITY;
    return dt_model_ops(a->model)->copy_h2d(grads + n / 2, &inf, sizeof inf);
}

dt_status dt_amp_check(dt_amp *a, int64_t g, float *grads, size_t n, int *skip, float *unscale) {
    return dt_amp_check_parts(a, g, &grads, &n, 1, skip, unscale);
}

dt_status dt_amp_check_parts(dt_amp *a, int64_t g, float *const *parts, const size_t *n, int nparts, int *skip,
                             float *unscale) {
    *skip = 0;
    *unscale = 1.0f;
    if (nparts > 0) DT_TRY(plant_inf(a, g, parts[0], n[0]));
    if (!a->scaling) return DT_OK;
    int found = 0;
    for (int i = 0; i < nparts; i++) {
        int one = 0;
        DT_TRY(dt_found_inf(dt_model_ops(a->model), a->comm, a->flag, parts[i], n[i], &one));
        found |= one;
    }
    a->step_scale = a->scaler.scale;
    *unscale = (float)(1.0 / (double)a->scaler.scale);   /* GradScaler: scale.double().reciprocal().float() */
    *skip = found;
    a->skipped += found;
    dt_scaler_update(&a->scaler, found);
    return DT_OK;
}

void dt_amp_follow(dt_amp *a, const dt_amp *from) {
    a->scaler = from->scaler;
    a->step_scale = from->step_scale;
    a->skipped = from->skipped;
}

void dt_amp_scaler_text(const dt_amp *a, char *buf, size_t n) {
    if (!a->scaling) snprintf(buf, n, "none");
    else snprintf(buf, n, "%.17g %ld %lld", (double)a->scaler.scale, (long)a->scaler.growth_tracker,
                  (long long)a->skipped);
}

dt_status dt_amp_restore(dt_amp *a, const char *text) {
    if (!a->scaling || !text || !strcmp(text, "none")) return DT_OK;
    double scale = 0.0;
    long tracker = -1;
    long long skipped = -1;
    int used = 0;
    int fields = sscanf(text, "%lf %ld %lld%n", &scale, &tracker, &skipped, &used);
    float f = (float)scale;
    if (fields != 3 || text[used] || !(f > 0.0f) || !isfinite(f) || (double)f != scale || tracker < 0 ||
        tracker >= a->scaler.o.growth_interval || skipped < 0)
        return dt_error(DT_ERR_FORMAT, "checkpoint: the loss scaler's state '%s' is not 'SCALE TRACKER SKIPPED'", text);
    a->scaler.scale = f;
    a->scaler.growth_tracker = (int32_t)tracker;
    a->skipped = skipped;
    return DT_OK;
}
