/*
 * shard.c: ZeRO-1/2/3 over the flat parameter array (see shard.h).
 *
 * All collectives here are in place on the model's padded arrays: the all-gather
 * sends a rank's shard from where it lies, the reduce-scatter leaves the sum of a
 * rank's shard where it lies. When the device's memory is not host memory and the
 * backend takes host buffers (tcp or mpi with a GPU), they go through one host copy
 * of the padded array.
 */
#include "shard.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *const mode_names[DT_SHARD_COUNT] = {"none", "optim", "grads", "params"};

const char *dt_shard_name(dt_shard_mode m) {
    return (int)m >= 0 && m < DT_SHARD_COUNT ? mode_names[m] : "?";
}

dt_status dt_shard_parse(const char *s, dt_shard_mode *out) {
    for (int i = 0; s && i < DT_SHARD_COUNT; i++)
        if (!strcmp(s, mode_names[i])) {
            *out = (dt_shard_mode)i;
            return DT_OK;
        }
    return dt_error(DT_ERR_INVALID, "shard: expected none, optim, grads or params, got '%s'", s ? s : "(null)");
}

struct dt_shard {
    dt_model     *model;
    const dt_ops *ops;
    dt_comm      *comm;
    dt_shard_mode mode;
    int           world, rank;
    size_t        n;          /* parameters */
    size_t        per;        /* floats per shard (a multiple of DT_SUM_CHUNK); n with none */
    size_t        lo, len;    /* this rank's range of [0, n) */
    int           stage;      /* collectives through host: host holds world*per floats */
    float        *host;
    double       *dparts;     /* device: the chunk sums of the range the norm needs */
    double       *parts;      /* host: every chunk sum of the padded array */
    /* params mode */
    int           full;       /* every rank holds the whole parameter array: layer hooks pause */
    int           nlayers;
    int          *rfirst;     /* layer i reads the parameter ranges rfirst[i] .. rfirst[i+1]-1 */
    size_t       *rlo, *rhi;
};

dt_status dt_shard_init(dt_model *m, dt_comm *comm, dt_shard_mode mode, dt_shard **out) {
    *out = NULL;
    if ((int)mode < 0 || mode >= DT_SHARD_COUNT) return dt_error(DT_ERR_INVALID, "shard: unknown mode %d", (int)mode);
    dt_shard *s = calloc(1, sizeof *s);
    if (!s) return dt_error(DT_ERR_NOMEM, "out of memory for sharding");
    s->model = m;
    s->ops = dt_model_ops(m);
    s->comm = comm;
    s->mode = mode;
    s->world = comm ? dt_comm_size(comm) : 1;
    s->rank = comm ? dt_comm_rank(comm) : 0;
    s->n = dt_model_nparams(m);
    const size_t C = DT_SUM_CHUNK;
    size_t nch = (s->n + C - 1) / C;
    if (mode == DT_SHARD_NONE) {
        s->per = s->n;
        s->lo = 0;
        s->len = s->n;
    } else {
        s->per = (nch + (size_t)s->world - 1) / (size_t)s->world * C;
        if (s->per == 0) s->per = C;   /* no parameters: one empty chunk each */
        s->lo = s->per * (size_t)s->rank;
        if (s->lo > s->n) s->lo = s->n;
        s->len = s->n - s->lo < s->per ? s->n - s->lo : s->per;
    }
    size_t padded = mode == DT_SHARD_NONE ? s->n : s->per * (size_t)s->world;
    size_t npart = (padded + C - 1) / C;
    dt_status st = dt_model_reserve(m, padded);
    if (st == DT_OK) st = s->ops->alloc((void **)&s->dparts, (npart ? npart : 1) * sizeof(double));
    if (st == DT_OK && !(s->parts = malloc((npart ? npart : 1) * sizeof(double))))
        st = dt_error(DT_ERR_NOMEM, "out of memory for the gradient norm's chunk sums");
    s->stage = s->world > 1 && mode != DT_SHARD_NONE && !s->ops->host_memory && !dt_comm_device_buffers(comm);
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
    if (s->rfirst) dt_model_set_layer_hook(s->model, NULL, NULL);
    free(s->rfirst);
    free(s->rlo);
    free(s->rhi);
    if (s->host) s->ops->host_free(s->host);
    s->ops->free(s->dparts);
    free(s->parts);
    free(s);
}

dt_shard_mode dt_shard_mode_of(const dt_shard *s) { return s->mode; }
int           dt_shard_ddp_reduces(const dt_shard *s) { return s->mode == DT_SHARD_NONE || s->mode == DT_SHARD_OPTIM; }

void dt_shard_range(const dt_shard *s, size_t *lo, size_t *len) {
    *lo = s->lo;
    *len = s->len;
}

/* ---- collectives over the padded arrays ------------------------------------------- */

static int distributed(const dt_shard *s) { return s->world > 1 && s->mode != DT_SHARD_NONE; }
/* only this rank's shard of the gradient holds the global sum */
static int grads_sharded(const dt_shard *s) {
    return s->world > 1 && (s->mode == DT_SHARD_GRADS || s->mode == DT_SHARD_PARAMS);
}
static int params_sharded(const dt_shard *s) { return s->world > 1 && s->mode == DT_SHARD_PARAMS; }

/* Every rank's shard of buf (world*per floats, device) to every rank. */
static dt_status allgather(dt_shard *s, float *buf) {
    size_t mine = s->per * (size_t)s->rank;
    if (!s->stage) return dt_allgather(s->comm, buf + mine, buf, s->per, DT_F32);
    DT_TRY(s->ops->copy_d2h(s->host + mine, buf + mine, s->per * sizeof(float)));
    DT_TRY(dt_allgather(s->comm, s->host + mine, s->host, s->per, DT_F32));
    return s->ops->copy_h2d(buf, s->host, s->per * (size_t)s->world * sizeof(float));
}

dt_status dt_shard_reduce(dt_shard *s) {
    if (s->mode != DT_SHARD_GRADS || s->world == 1) return DT_OK;
    float *g = dt_model_grads(s->model);
    size_t mine = s->per * (size_t)s->rank, all = s->per * (size_t)s->world;
    if (!s->stage) return dt_reduce_scatter(s->comm, g, g + mine, s->per, DT_F32, DT_SUM);
    DT_TRY(s->ops->copy_d2h(s->host, g, all * sizeof(float)));
    DT_TRY(dt_reduce_scatter(s->comm, s->host, s->host + mine, s->per, DT_F32, DT_SUM));
    return s->ops->copy_h2d(g + mine, s->host + mine, s->per * sizeof(float));
}

/* ---- norm, clipping, step ------------------------------------------------------------ */

dt_status dt_shard_clip(dt_shard *s, float max_norm, float *norm) {
    const size_t C = DT_SUM_CHUNK;
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
    float total = sqrtf((float)sq);
    if (norm) *norm = total;
    if (max_norm > 0.0f && s->len) {
        float coef = max_norm / (total + 1e-6f);
        if (coef < 1.0f) DT_TRY(s->ops->scale(g + s->lo, coef, s->len));
    }
    return DT_OK;
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

/* ---- params: gather before a layer runs, drop after ---------------------------------- */

/* Drop [a, b) of buf (a model array) except this rank's shard. */
static dt_status drop_range(dt_shard *s, float *buf, size_t a, size_t b) {
    size_t mine = s->per * (size_t)s->rank, end = mine + s->per;
    if (a < mine) DT_TRY(s->ops->discard(buf + a, ((b < mine ? b : mine) - a) * sizeof(float)));
    if (b > end) DT_TRY(s->ops->discard(buf + (a > end ? a : end), (b - (a > end ? a : end)) * sizeof(float)));
    return DT_OK;
}

/* For each rank q whose shard meets [a, b): broadcast its part from q (reduce = 0), or
 * sum every rank's part onto q (reduce = 1: the all-reduce's tree, comm.h). */
static dt_status per_owner(dt_shard *s, float *buf, size_t a, size_t b, int reduce) {
    for (int q = (int)(a / s->per); q < s->world && (size_t)q * s->per < b; q++) {
        size_t x = (size_t)q * s->per > a ? (size_t)q * s->per : a;
        size_t y = (size_t)(q + 1) * s->per < b ? (size_t)(q + 1) * s->per : b;
        float *p = buf + x, *h = s->stage ? s->host + x : p;
        if (s->stage && (reduce || q == s->rank)) DT_TRY(s->ops->copy_d2h(h, p, (y - x) * sizeof(float)));
        if (reduce) DT_TRY(dt_reduce(s->comm, h, h, y - x, DT_F32, DT_SUM, q));
        else DT_TRY(dt_broadcast(s->comm, h, y - x, DT_F32, q));
        if (s->stage && (reduce ? q == s->rank : q != s->rank)) DT_TRY(s->ops->copy_h2d(p, h, (y - x) * sizeof(float)));
    }
    return DT_OK;
}

static dt_status on_layer(void *ctx, int layer, dt_layer_phase phase) {
    dt_shard *s = ctx;
    if (s->full) return DT_OK;
    float *p = dt_model_params(s->model);
    for (int r = s->rfirst[layer]; r < s->rfirst[layer + 1]; r++) {
        if (phase == DT_HOOK_FWD_PRE || phase == DT_HOOK_BWD_PRE) DT_TRY(per_owner(s, p, s->rlo[r], s->rhi[r], 0));
        else DT_TRY(drop_range(s, p, s->rlo[r], s->rhi[r]));
    }
    return DT_OK;
}

/* A gradient slice is final on this rank: sum it onto its owners, keep only ours. */
static dt_status on_final(void *ctx, size_t lo, size_t hi) {
    dt_shard *s = ctx;
    float *g = dt_model_grads(s->model);
    DT_TRY(per_owner(s, g, lo, hi, 1));
    return drop_range(s, g, lo, hi);
}

dt_status dt_shard_attach(dt_shard *s, dt_ddp *ddp) {
    if (!params_sharded(s)) return DT_OK;
    int n = dt_model_nlayers(s->model), cap = 0;
    for (int i = 0; i < n; i++) cap += dt_model_layer(s->model, i)->ntensors;
    s->rfirst = calloc((size_t)n + 1, sizeof *s->rfirst);
    s->rlo = calloc((size_t)cap + 1, sizeof *s->rlo);
    s->rhi = calloc((size_t)cap + 1, sizeof *s->rhi);
    if (!s->rfirst || !s->rlo || !s->rhi) return dt_error(DT_ERR_NOMEM, "out of memory for sharding");
    int nr = 0;
    for (int i = 0; i < n; i++) {
        const dt_layer *L = dt_model_layer(s->model, i);
        s->rfirst[i] = nr;
        for (int t = 0; t < L->ntensors; t++) {
            const dt_layer_tensor *T = &L->t[t];
            if (T->role != DT_TENSOR_PARAM && T->role != DT_TENSOR_TIED) continue;
            s->rlo[nr] = T->offset;
            s->rhi[nr++] = T->offset + (size_t)T->numel;
        }
    }
    s->rfirst[n] = nr;
    s->nlayers = n;
    s->full = 1;   /* until the start-of-run broadcast is done and drop_params is called */
    dt_model_set_layer_hook(s->model, on_layer, s);
    dt_ddp_set_final_hook(ddp, on_final, s);
    return DT_OK;
}

dt_status dt_shard_gather_params(dt_shard *s) {
    if (!params_sharded(s) || s->full) return DT_OK;
    DT_TRY(allgather(s, dt_model_params(s->model)));
    s->full = 1;
    return DT_OK;
}

dt_status dt_shard_drop_params(dt_shard *s) {
    if (!params_sharded(s)) return DT_OK;
    size_t all = s->per * (size_t)s->world;
    DT_TRY(drop_range(s, dt_model_params(s->model), 0, all));
    DT_TRY(drop_range(s, dt_model_grads(s->model), 0, all));
    s->full = 0;
    return DT_OK;
}

/* ---- checkpoints: the whole optimizer state -------------------------------------------- */

dt_status dt_shard_gather_optim(dt_shard *s, dt_optim *o, dt_optim **full) {
    *full = NULL;
    if (!distributed(s)) {
        *full = o;
        return DT_OK;
    }
    dt_optim *f = NULL;
    float *buf = NULL;
    size_t all = s->per * (size_t)s->world;
    DT_TRY(dt_optim_init(dt_optim_config_of(o), s->ops, s->n, &f));
    dt_status st = s->ops->alloc((void **)&buf, all * sizeof(float));
    for (int i = 0; st == DT_OK && i < dt_optim_nstate(o); i++) {
        size_t mine = s->per * (size_t)s->rank;
        st = s->ops->zero(buf + mine, s->per * sizeof(float));
        if (st == DT_OK && s->len) st = s->ops->copy_d2d(buf + mine, dt_optim_state(o, i), s->len * sizeof(float));
        if (st == DT_OK) st = allgather(s, buf);
        if (st == DT_OK && s->n) st = s->ops->copy_d2d(dt_optim_state(f, i), buf, s->n * sizeof(float));
    }
    s->ops->free(buf);
    if (st != DT_OK) {
        dt_optim_free(f);
        return st;
    }
    dt_optim_set_steps(f, dt_optim_steps(o));
    *full = f;
    return DT_OK;
}

dt_status dt_shard_scatter_optim(dt_shard *s, dt_optim *full, dt_optim *o) {
    if (full == o) return DT_OK;
    if (dt_optim_nstate(full) != dt_optim_nstate(o) || dt_optim_size(full) != s->n || dt_optim_size(o) != s->len)
        return dt_error(DT_ERR_INTERNAL, "shard: optimizer state layouts differ");
    for (int i = 0; i < dt_optim_nstate(o) && s->len; i++)
        DT_TRY(s->ops->copy_d2d(dt_optim_state(o, i), dt_optim_state(full, i) + s->lo, s->len * sizeof(float)));
    dt_optim_set_steps(o, dt_optim_steps(full));
    return DT_OK;
}
