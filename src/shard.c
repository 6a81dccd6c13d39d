/*
 * shard.c: sharding over the flat parameter array (see shard.h): the modes as rows, the
 * shards, ZeRO-1/2's reduce-scatter, the norm, the step and its all-gather. ZeRO-3's
 * gathers, pool and gradient sums are in shard_params.c.
 *
 * All collectives here are in place on the model's padded arrays: the all-gather
 * sends a rank's shard from where it lies, the reduce-scatter leaves the sum of a
 * rank's shard where it lies. When the device's memory is not host memory and the
 * backend takes host buffers (tcp or mpi with a GPU), they go through one host copy
 * of the padded array.
 */
#include "shard_impl.h"
#include "mem.h"

#include <math.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- the modes ---------------------------------------------------------------------- */

const dt_shard_mode_row_ dt_shard_modes_[DT_SHARD_COUNT] = {
    [DT_SHARD_NONE]   = {.name = "none"},
    [DT_SHARD_OPTIM]  = {.name = "optim", .optim = 1},
    [DT_SHARD_GRADS]  = {.name = "grads", .optim = 1, .grads = 1},
    [DT_SHARD_PARAMS] = {.name = "params", .optim = 1, .grads = 1, .params = 1},
};

const char *dt_shard_name(dt_shard_mode m) {
    return (int)m >= 0 && m < DT_SHARD_COUNT && dt_shard_modes_[m].name ? dt_shard_modes_[m].name : "?";
}

dt_status dt_shard_parse(const char *s, dt_shard_mode *out) {
    char names[96] = "";
    for (int i = 0; i < DT_SHARD_COUNT; i++) {
        if (s && !strcmp(s, dt_shard_modes_[i].name)) {
            *out = (dt_shard_mode)i;
            return DT_OK;
        }
        size_t k = strlen(names);
        snprintf(names + k, sizeof names - k, "%s%s", i == 0 ? "" : i + 1 < DT_SHARD_COUNT ? ", " : " or ",
                 dt_shard_modes_[i].name);
    }
    return dt_error(DT_ERR_INVALID, "shard: expected %s, got '%s'", names, s ? s : "(null)");
}

dt_status dt_shard_pool_env(int *on) {
    const char *v = getenv("DT_SHARD_POOL");
    if (v && *v && strcmp(v, "0") && strcmp(v, "1"))
        return dt_error(DT_ERR_INVALID, "DT_SHARD_POOL='%s': expected 0 or 1", v);
    *on = !(v && !strcmp(v, "0"));
    return DT_OK;
}

dt_status dt_shard_prefetch_parse(const char *s, dt_shard_prefetch *out) {
    if (s && !strcmp(s, "pre")) *out = DT_PREFETCH_PRE;
    else if (s && !strcmp(s, "post")) *out = DT_PREFETCH_POST;
    else return dt_error(DT_ERR_INVALID, "backward_prefetch: expected pre or post, got '%s'", s ? s : "(null)");
    return DT_OK;
}

/* The shards of n parameters over world ranks: per floats each (whole chunks), rank's
 * range [*lo, *lo + *len) of [0, n). */
size_t dt_shard_floats(size_t n, int world) {
    const size_t C = DT_SUM_CHUNK;
    size_t per = ((n + C - 1) / C + (size_t)world - 1) / (size_t)world * C;
    return per ? per : C;   /* no parameters: one empty chunk each */
}

static void cut(size_t n, int world, int rank, dt_shard_mode mode, size_t *per, size_t *lo, size_t *len) {
    if (!dt_shard_modes_[mode].optim) {
        *per = n;
        *lo = 0;
        *len = n;
        return;
    }
    *per = dt_shard_floats(n, world);
    *lo = *per * (size_t)rank;
    if (*lo > n) *lo = n;
    *len = n - *lo < *per ? n - *lo : *per;
}

dt_status dt_shard_layout(size_t nparams, dt_comm *comm, dt_shard_mode mode, dt_model_layout *out) {
    if ((int)mode < 0 || mode >= DT_SHARD_COUNT) return dt_error(DT_ERR_INVALID, "shard: unknown mode %d", (int)mode);
    int world = comm ? dt_comm_size(comm) : 1, rank = comm ? dt_comm_rank(comm) : 0;
    size_t per, lo, len;
    cut(nparams, world, rank, mode, &per, &lo, &len);
    memset(out, 0, sizeof *out);
    out->capacity = dt_shard_modes_[mode].optim ? per * (size_t)world : nparams;
    if (dt_shard_modes_[mode].params && world > 1) {
        out->keep_lo = per * (size_t)rank;
        out->keep_hi = out->keep_lo + per;
    }
    return DT_OK;
}

dt_status dt_shard_init(dt_model *m, dt_comm *comm, dt_shard_mode mode, dt_shard **out) {
    return dt_shard_init_range(m, comm, mode, 0, dt_model_nparams(m), out);
}

dt_status dt_shard_init_range(dt_model *m, dt_comm *comm, dt_shard_mode mode, size_t lo, size_t hi, dt_shard **out) {
    *out = NULL;
    if ((int)mode < 0 || mode >= DT_SHARD_COUNT) return dt_error(DT_ERR_INVALID, "shard: unknown mode %d", (int)mode);
    if (lo > hi || hi > dt_model_nparams(m))
        return dt_error(DT_ERR_INVALID, "shard: range [%zu, %zu) outside the %zu parameters", lo, hi, dt_model_nparams(m));
    if (dt_shard_modes_[mode].params && (lo > 0 || hi < dt_model_nparams(m)))
        return dt_error(DT_ERR_UNSUPPORTED, "shard params: over the whole model only (not a pipeline stage's range)");
    dt_shard *s = calloc(1, sizeof *s);
    if (!s) return dt_error(DT_ERR_NOMEM, "out of memory for sharding");
    s->model = m;
    s->ops = dt_model_ops(m);
    s->comm = comm;
    s->mode = mode;
    s->world = comm ? dt_comm_size(comm) : 1;
    s->rank = comm ? dt_comm_rank(comm) : 0;
    s->base = lo;
    s->n = hi - lo;
    const size_t C = DT_SUM_CHUNK;
    cut(s->n, s->world, s->rank, mode, &s->per, &s->lo, &s->len);
    s->lo += s->base;
    size_t padded = dt_shard_modes_[mode].optim ? s->per * (size_t)s->world : s->n;
    size_t npart = (padded + C - 1) / C;
    size_t reserve = s->base + padded;
    dt_status st = dt_model_reserve(m, reserve > dt_model_nparams(m) ? reserve : dt_model_nparams(m));
    /* twice: the second half is step_checks' scratch (dt_shard_clip_device) */
    if (st == DT_OK) st = s->ops->alloc((void **)&s->dparts, 2 * (npart ? npart : 1) * sizeof(double));
    if (st == DT_OK && !(s->parts = malloc((npart ? npart : 1) * sizeof(double))))
        st = dt_error(DT_ERR_NOMEM, "out of memory for the gradient norm's chunk sums");
    s->stage = distributed(s) && !s->ops->host_memory && !dt_comm_device_buffers(comm);
    if (st == DT_OK && s->stage) st = s->ops->host_alloc((void **)&s->host, padded * sizeof(float));
    if (st != DT_OK) {
        dt_shard_free(s);
        return st;
    }
    *out = s;
    return DT_OK;
}

void dt_shard_free(dt_shard *s) {
    if (!s) return;
    dt_mem_sub(DT_MEM_PARAMS, s->full_held);   /* the model's own accounting takes over */
    dt_mem_add(DT_MEM_GRADS, s->grads_gone);   /* and frees the gradient array it counts */
    dt_shard_params_free_(s);
    free(s->blk_need);
    free(s->blk_dead);
    if (s->host) s->ops->host_free(s->host);
    s->ops->free(s->dparts);
    free(s->parts);
    free(s);
}

dt_shard_mode dt_shard_mode_of(const dt_shard *s) { return s->mode; }
int           dt_shard_mode_grads(dt_shard_mode m) { return (int)m >= 0 && m < DT_SHARD_COUNT && dt_shard_modes_[m].grads; }
int           dt_shard_ddp_reduces(const dt_shard *s) { return !dt_shard_mode_grads(s->mode) && !s->scatter; }

void dt_shard_scatter_sums(dt_shard *s, int may) {
    int W = s->world;
    s->scatter = may && s->mode == DT_SHARD_OPTIM && W > 1 && (W & (W - 1)) == 0 && s->ops->host_memory && s->base == 0 &&
                 s->n == dt_model_nparams(s->model);
}
int           dt_shard_state_sharded(const dt_shard *s) { return distributed(s); }
int           dt_shard_params_sharded(const dt_shard *s) { return params_sharded(s); }

void dt_shard_note(const dt_shard *s, char *buf, size_t n) {
    if (n) buf[0] = '\0';
    if (dt_shard_modes_[s->mode].optim)
        snprintf(buf, n, "shard %s: rank %d of %d keeps the optimizer state of %zu of %zu parameters",
                 dt_shard_name(s->mode), s->rank, s->world, s->len, s->n);
}

void dt_shard_range(const dt_shard *s, size_t *lo, size_t *len) {
    *lo = s->lo;
    *len = s->len;
}

/* ---- collectives over the padded arrays ------------------------------------------- */

static dt_status allgather(dt_shard *s, float *buf) {
    buf += s->base;
    size_t mine = s->per * (size_t)s->rank;
    if (!s->stage) return dt_allgather(s->comm, buf + mine, buf, s->per, DT_F32);
    DT_TRY(s->ops->copy_d2h(s->host + mine, buf + mine, s->per * sizeof(float)));
    DT_TRY(dt_allgather(s->comm, s->host + mine, s->host, s->per, DT_F32));
    return s->ops->copy_h2d(buf, s->host, s->per * (size_t)s->world * sizeof(float));
}

dt_status dt_shard_reduce(dt_shard *s) {
    if (params_sharded(s)) return dt_shard_grads_settle_(s, s->npend);   /* the sums launched during backward */
    if (!grads_sharded(s)) return DT_OK;
    float *g = dt_model_grads(s->model) + s->base;
    size_t mine = s->per * (size_t)s->rank, all = s->per * (size_t)s->world;
    if (!s->stage) return dt_reduce_scatter(s->comm, g, g + mine, s->per, DT_F32, DT_SUM);
    DT_TRY(s->ops->copy_d2h(s->host, g, all * sizeof(float)));
    DT_TRY(dt_reduce_scatter(s->comm, s->host, s->host + mine, s->per, DT_F32, DT_SUM));
    return s->ops->copy_h2d(g + mine, s->host + mine, s->per * sizeof(float));
}

/* ---- norm, clipping, step ------------------------------------------------------------ */

dt_status dt_shard_clip(dt_shard *s, float max_norm, float unscale, float *norm) {
    const size_t C = DT_SUM_CHUNK;
    if (s->base > 0 || s->n < dt_model_nparams(s->model))
        return dt_error(DT_ERR_INTERNAL, "shard: the norm of a range is its caller's (dt_shard_init_range)");
    float *g = dt_model_grads(s->model);
    size_t nch = (s->n + C - 1) / C;
    double sq;
    if (grads_sharded(s)) {
        /* only this rank's shard holds its global sum: its chunk sums, gathered */
        size_t mine = s->per * (size_t)s->rank, k = s->per / C;
        DT_TRY(s->ops->sumsq_chunks(s->dparts, g + mine, s->per));
        DT_TRY(s->ops->copy_d2h(s->parts + k * (size_t)s->rank, s->dparts, k * sizeof(double)));
        DT_TRY(dt_allgather(s->comm, s->parts + k * (size_t)s->rank, s->parts, k, DT_F64));
    } else {
        DT_TRY(s->ops->sumsq_chunks(s->dparts, g, s->n));
        DT_TRY(s->ops->copy_d2h(s->parts, s->dparts, nch * sizeof(double)));
    }
    sq = dt_pairwise_sum(s->parts, nch);
    float total = dt_clip_norm(sq, unscale);
    if (norm) *norm = total;
    float coef = dt_clip_coef(max_norm, total);
    if (coef < 1.0f && s->len) DT_TRY(s->ops->scale(g + s->lo, coef, s->len));
    return DT_OK;
}

dt_status dt_shard_clip_device(dt_shard *s, float max_norm, float unscale, int norm, const float *losses, size_t k,
                               float *checks) {
    const size_t C = DT_SUM_CHUNK;
    if (distributed(s) || s->base > 0 || s->n < dt_model_nparams(s->model))
        return dt_error(DT_ERR_INTERNAL, "shard: the norm on the device is one whole rank's");
    size_t nch = norm || max_norm > 0.0f ? (s->n + C - 1) / C : 0;
    float *g = dt_model_grads(s->model);
    if (nch) DT_TRY(s->ops->sumsq_chunks(s->dparts, g, s->n));
    DT_TRY(s->ops->step_checks(checks, s->dparts, s->dparts + nch, nch, losses, k, max_norm, unscale));
    return max_norm > 0.0f ? s->ops->clip_scale(g + s->lo, checks, s->len) : DT_OK;
}

dt_status dt_shard_step(dt_shard *s, dt_optim *o, float lr, float grad_scale) {
    if (dt_optim_size(o) != s->len)
        return dt_error(DT_ERR_INTERNAL, "shard: the optimizer holds %zu parameters, the shard %zu",
                        dt_optim_size(o), s->len);
    float *p = dt_model_params(s->model);
    DT_TRY(dt_optim_step(o, p + s->lo, dt_model_grads(s->model) + s->lo, lr, grad_scale));
    /* params: the other ranks gather what they need when their layers run */
    return distributed(s) && !params_sharded(s) ? allgather(s, p) : DT_OK;
}
