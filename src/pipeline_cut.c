/*
 * pipeline_cut.c: where a pipeline's stages lie in a model (see pipeline.h, "the cut"):
 * the model's top-level modules cut into P runs (balanced by their planned work, or
 * named with --stages), the tied tensors that ride between stages, and the parts of the
 * gradient each rank answers for in the global norm. The trainer (train_pipe.c) runs
 * these stages and dtrain plan (plan.c) estimates their memory from the same cut.
 */
#include "pipeline.h"

#include <stdlib.h>
#include <string.h>

#include "shard.h"   /* dt_shard_floats */

/* The parameters layers [lo, hi) own: [*plo, *phi) (a tied tensor is its owner's). */
static void layer_params(const dt_spec *sp, int lo, int hi, size_t at, size_t *plo, size_t *phi) {
    *plo = *phi = at;
    int any = 0;
    for (int i = lo; i < hi; i++) {
        const dt_layer *L = &sp->layers[i];
        for (int k = 0; k < L->ntensors; k++) {
            if (L->t[k].role != DT_TENSOR_PARAM) continue;
            if (!any) *plo = L->t[k].offset;
            any = 1;
            *phi = L->t[k].offset + (size_t)L->t[k].numel;
        }
    }
}

/* A module's planned work: twice its GEMM weights per position plus its outputs (the
 * element-wise work), per sample. */
static double module_cost(const dt_spec *sp, int lo, int hi) {
    double c = 0.0;
    for (int i = lo; i < hi; i++) {
        const dt_layer *L = &sp->layers[i];
        double pos = L->outs.ndim == 2 ? (double)L->outs.d[0] : L->outs.ndim == 3 ? (double)L->outs.d[1] * L->outs.d[2] : 1.0;
        if (L->def->flags & DT_LDEF_GEMM)
            for (int k = 0; k < L->ntensors; k++)
                if ((L->t[k].role == DT_TENSOR_PARAM || L->t[k].role == DT_TENSOR_TIED) && L->t[k].ndim >= 2)
                    c += 2.0 * (double)L->t[k].numel * pos;
        c += (double)L->out_numel;
    }
    return c;
}

/* The contiguous cut of n module costs into P runs, each with parameters (has[i]: module
 * i has some), whose largest sum is smallest. */
static dt_status balance(const double *cost, const int *has, int n, int P, int *mod_lo) {
    const double NONE = 1e300;
    double *pre = calloc((size_t)n + 1, sizeof *pre), *best = malloc((size_t)(n + 1) * (size_t)P * sizeof *best);
    int *from = malloc((size_t)(n + 1) * (size_t)P * sizeof *from), *cnt = calloc((size_t)n + 1, sizeof *cnt);
    if (!pre || !best || !from || !cnt) {
        free(pre), free(best), free(from), free(cnt);
        return dt_error(DT_ERR_NOMEM, "pipeline: out of memory");
    }
    for (int i = 0; i < n; i++) pre[i + 1] = pre[i] + cost[i], cnt[i + 1] = cnt[i] + (has[i] != 0);
    /* best[s * (n + 1) + i]: stages 0 .. s over modules [0, i) */
    for (int i = 0; i <= n; i++) best[i] = cnt[i] ? pre[i] : NONE, from[i] = 0;
    for (int s = 1; s < P; s++)
        for (int i = 0; i <= n; i++) {
            double b = NONE;
            int f = -1;
            for (int j = s; j < i; j++) {
                double a = best[(s - 1) * (n + 1) + j], run = pre[i] - pre[j], v = a > run ? a : run;
                if (a < NONE && cnt[i] > cnt[j] && v < b) b = v, f = j;
            }
            best[s * (n + 1) + i] = b;
            from[s * (n + 1) + i] = f;
        }
    dt_status st = best[(P - 1) * (n + 1) + n] < NONE ? DT_OK
                 : dt_error(DT_ERR_INVALID, "pipeline: the model has %d modules with parameters, fewer than the %d "
                            "stages (each stage needs some)", cnt[n], P);
    mod_lo[P] = n;
    for (int s = P - 1; st == DT_OK && s > 0; s--) mod_lo[s] = from[s * (n + 1) + mod_lo[s + 1]];
    mod_lo[0] = 0;
    free(pre), free(best), free(from), free(cnt);
    return st;
}

/* --stages A-B,C-D,...: P runs of module indices, in order, covering 0 .. n - 1. */
static dt_status parse_stages(const char *text, int n, int P, int *mod_lo) {
    const char *p = text;
    int next = 0;
    for (int s = 0; s < P; s++) {
        char *end;
        long a = strtol(p, &end, 10), b;
        if (end == p) goto bad;
        if (*end == '-') {
            p = end + 1;
            b = strtol(p, &end, 10);
            if (end == p) goto bad;
        } else {
            b = a;
        }
        if (a != next || b < a || b >= n)
            return dt_error(DT_ERR_INVALID, "stages: stage %d is modules %ld-%ld; expected a run starting at module %d "
                            "and ending before %d (the model has %d top-level modules, 0-%d)", s, a, b, next, n, n, n - 1);
        mod_lo[s] = (int)a;
        next = (int)b + 1;
        p = end;
        if (s + 1 < P) {
            if (*p != ',') goto bad;
            p++;
        }
    }
    if (*p) goto bad;
    if (next != n)
        return dt_error(DT_ERR_INVALID, "stages: '%s' leaves modules %d-%d out (the stages must cover 0-%d)", text, next,
                        n - 1, n - 1);
    mod_lo[P] = n;
    return DT_OK;
bad:
    return dt_error(DT_ERR_INVALID, "stages: expected auto, params or %d runs of module indices such as 0-3,4-7, got "
                    "'%s'", P, text);
}

dt_status dt_pp_cut_spec(const dt_spec *sp, int P, const char *text, dt_pp_cut *out) {
    memset(out, 0, sizeof *out);
    int nm = dt_spec_modules(sp, NULL);
    if (P < 1) return dt_error(DT_ERR_INVALID, "pipeline: expected at least 1 stage, got %d", P);
    if (nm < P)
        return dt_error(DT_ERR_INVALID, "pipeline: %d stages, but the model has %d top-level modules (a stage holds at "
                        "least one)", P, nm);
    int *cuts = calloc((size_t)nm + 1, sizeof *cuts);
    double *cost = calloc((size_t)nm, sizeof *cost);
    int *has = calloc((size_t)nm, sizeof *has);
    out->stages = P;
    out->mod_lo = calloc((size_t)P + 1, sizeof *out->mod_lo);
    out->layer_lo = calloc((size_t)P + 1, sizeof *out->layer_lo);
    out->plo = calloc((size_t)P + 1, sizeof *out->plo);
    out->work = calloc((size_t)P, sizeof *out->work);
    dt_status s = cuts && cost && has && out->mod_lo && out->layer_lo && out->plo && out->work
                      ? DT_OK : dt_error(DT_ERR_NOMEM, "pipeline: out of memory");
    if (s == DT_OK) {
        dt_spec_modules(sp, cuts);
        /* auto: the planned work; params: the parameters a module owns (a stage's state) */
        const int by_params = text && !strcmp(text, "params");
        for (int i = 0; i < nm; i++) {
            size_t a, b;
            layer_params(sp, cuts[i], cuts[i + 1], 0, &a, &b);
            cost[i] = by_params ? (double)(b - a) : module_cost(sp, cuts[i], cuts[i + 1]);
            has[i] = b > a;
        }
        s = !text || !strcmp(text, "auto") || by_params ? balance(cost, has, nm, P, out->mod_lo)
                                                        : parse_stages(text, nm, P, out->mod_lo);
    }
    for (int st = 0; s == DT_OK && st <= P; st++) out->layer_lo[st] = cuts[out->mod_lo[st]];
    size_t at = 0;
    for (int st = 0; s == DT_OK && st < P; st++) {
        size_t lo, hi;
        layer_params(sp, out->layer_lo[st], out->layer_lo[st + 1], at, &lo, &hi);
        if (hi == lo)
            s = dt_error(DT_ERR_INVALID, "pipeline: stage %d (modules %d-%d) holds no parameters; name a cut with "
                         "--stages", st, out->mod_lo[st], out->mod_lo[st + 1] - 1);
        out->plo[st] = at;   /* parameterless layers before a stage's first parameter are its */
        at = hi;
    }
    if (s == DT_OK) out->plo[P] = (size_t)sp->nparams;
    double all = 0.0;
    for (int st = 0; s == DT_OK && st < P; st++) {
        double w = module_cost(sp, out->layer_lo[st], out->layer_lo[st + 1]);
        out->work[st] = w;
        all += w;
    }
    for (int st = 0; s == DT_OK && st < P && all > 0.0; st++) out->work[st] /= all;
    free(cuts);
    free(cost);
    free(has);
    if (s != DT_OK) dt_pp_cut_free(out);
    return s;
}

dt_status dt_pp_cut_chunks(const dt_spec *sp, int P, int V, const char *text, dt_pp_cut *out) {
    dt_status s = dt_pp_cut_spec(sp, P * V, text, out);
    if (s != DT_OK && V > 1)   /* the cut's stages are the chunks */
        return dt_error_wrap(s, "pipeline: %d stages x %d chunks (--virtual-stages) are %d chunks of the model: ", P, V,
                             P * V);
    return s;
}

void dt_pp_cut_free(dt_pp_cut *c) {
    free(c->mod_lo);
    free(c->layer_lo);
    free(c->plo);
    free(c->work);
    memset(c, 0, sizeof *c);
}

void dt_pp_keep(const dt_pp_cut *c, int stage, int replicas, int sharding, size_t *lo, size_t *hi) {
    size_t a = c->plo[stage], b = c->plo[stage + 1];
    if (sharding) b = a + dt_shard_floats(b - a, replicas) * (size_t)replicas;
    *lo = a;
    *hi = b;
}

/* ---- the tied tensors ------------------------------------------------------------------- */

dt_status dt_pp_riders(const dt_pp_cut *c, const dt_layer *layers, int nlayers, dt_pp_rider **out, int *n) {
    *out = NULL;
    *n = 0;
    for (int s = 0; s < c->stages; s++)
        for (int i = c->layer_lo[s]; i < c->layer_lo[s + 1] && i < nlayers; i++) {
            const dt_layer *L = &layers[i];
            for (int k = 0; k < L->ntensors; k++) {
                if (L->t[k].role != DT_TENSOR_TIED) continue;
                int owner = 0;
                while (owner + 1 < c->stages && c->plo[owner + 1] <= L->t[k].offset) owner++;
                if (owner == s) continue;
                dt_pp_rider *r = realloc(*out, (size_t)(*n + 1) * sizeof *r);
                if (!r) {
                    free(*out);
                    *out = NULL;
                    *n = 0;
                    return dt_error(DT_ERR_NOMEM, "pipeline: out of memory");
                }
                *out = r;
                r[(*n)++] = (dt_pp_rider){.off = L->t[k].offset, .len = (size_t)L->t[k].numel, .owner = owner,
                                          .user = s, .layer = i};
            }
        }
    return DT_OK;
}

void dt_pp_rider_floats(const dt_pp_rider *r, int n, int chunk, size_t *floats) {
    *floats = 0;
    for (int i = 0; i < n; i++)
        if (chunk == r[i].user) *floats += r[i].len;
}

int dt_pp_relay_slots(const dt_pp_rider *r, int n, int chunk, int unsent, int grads) {
    int need = 0;
    for (int i = 0; i < n; i++) {
        if (r[i].owner < chunk && chunk < r[i].user && unsent > need) need = unsent;
        if (r[i].owner == chunk && chunk < r[i].user && grads > 1 && grads > need) need = grads;
    }
    return need;
}

/* ---- the global norm's parts -------------------------------------------------------------- */

void dt_pp_norm_part(const dt_pp_cut *c, int stage, int replica, int replicas, int sharded, size_t *a, size_t *b) {
    size_t lo = c->plo[stage], hi = c->plo[stage + 1];
    if (!sharded) {
        *a = replica == 0 ? lo : hi;
        *b = hi;
        return;
    }
    size_t per = dt_shard_floats(hi - lo, replicas);
    *a = lo + per * (size_t)replica < hi ? lo + per * (size_t)replica : hi;
    *b = *a + per < hi ? *a + per : hi;
}

static int cmp_size(const void *a, const void *b) {
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    return (x > y) - (x < y);
}

int dt_pp_norm_edges(const dt_pp_cut *c, int replicas, int sharded, size_t chunk, size_t *bch) {
    int n = 0;
    for (int st = 0; st < c->stages; st++)
        for (int r = 0; r < replicas; r++) {
            size_t a, b;
            dt_pp_norm_part(c, st, r, replicas, sharded, &a, &b);
            if (a < b && a % chunk) bch[n++] = a / chunk;
        }
    qsort(bch, (size_t)n, sizeof *bch, cmp_size);
    int k = 0;   /* a chunk several edges cut, once */
    for (int j = 0; j < n; j++)
        if (!k || bch[k - 1] != bch[j]) bch[k++] = bch[j];
    return k;
}
