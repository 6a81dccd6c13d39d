/*
 * lowp.c: mixed precision inside a model (see lowp.h): the rounded copy of the GEMM
 * weights, the activation scratch, and the layer rows' helpers (layers.h).
 *
 * Memory (counted: mem.h): the weight copy has the layout of the parameter array
 * (nparams floats, counted as parameters; only the GEMM weights are written), so a
 * parameter pointer maps to its copy by its offset. It is made at the first forward
 * that reads the parameter array; a model whose layers read through views (sharding's
 * pool) rounds the GEMM weights there, in place, and never makes it. Each scratch
 * buffer (counted as activations) holds max_batch x the largest operand a GEMM row
 * rounds: its input, its output gradient, or rows x the widest dimension of its 2-d
 * weights (attention's fused QKV gradient is 3C wide while its input and output are C).
 *
 * A pipeline's stage (dt_lowp_partial) runs its own layers only: its copy is sparse, the
 * ranges rounded into it resident and counted (its range's GEMM weights, and a tied
 * weight it reads from another stage), and dt_lowp_keep gives back what lies outside a
 * range once the stage goes back to its own after holding the whole model.
 *
 * Where gemm_lp rounds its operands itself (the CPU's AVX512-BF16 kernel), a matrix
 * product takes the f32 activations and master weights as they are: the same bits, as
 * rounding twice to nearest even is rounding once. Then there is no weight copy and one
 * scratch buffer, for the output gradients whose bias gradients sum them rounded, unless
 * a row rounds for another op (a convolution: DT_LDEF_LP_OWN), which keeps all of it.
 */
#include "lowp.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "layers.h"
#include "mem.h"

struct dt_lowp {
    dt_dtype       dtype;
    const dt_spec *spec;
    size_t         nparams;
    int            gemm_rounds;    /* gemm_lp rounds its operands (dt_ops_gemm_lp_rounds) */
    int            copy;           /* a weight copy is needed: some row's weights are read rounded */
    float         *wcopy;          /* (nparams): GEMM weights rounded to dtype; NULL until needed */
    int            fresh;          /* wcopy holds the current parameters' rounding */
    size_t         scratch_n;      /* floats of each scratch buffer */
    float         *scratch[2];     /* [1] NULL when only output gradients need one (gemm_rounds) */
    int            partial;        /* dt_lowp_partial: only what was rounded into the copy is held */
    size_t       (*held)[2];       /* partial: the copy's resident ranges, ascending and disjoint */
    int            nheld, capheld;
    size_t         held_floats;    /* their floats, counted as parameters */
};

/* 1 when a row of spec rounds operands for an op other than gemm_lp (a convolution). */
static int spec_lp_own(const dt_spec *spec) {
    for (int i = 0; i < spec->n; i++)
        if (spec->layers[i].def->flags & DT_LDEF_LP_OWN) return 1;
    return 0;
}

/* 1 when layer L has a bias (a 1-d parameter) whose gradient sums a rounded dy. */
static int has_bias(const dt_layer *L) {
    for (int t = 0; t < L->ntensors; t++)
        if (L->t[t].ndim == 1 && L->t[t].role == DT_TENSOR_PARAM) return 1;
    return 0;
}

/* Floats one sample needs in a scratch buffer for layer L. When gemm_lp rounds its own
 * operands, a GEMM row rounds only an output gradient whose bias gradient sums it
 * (layer_linear_backward), its output's width; a row that rounds for another op
 * (DT_LDEF_LP_OWN) everything, as below. */
static int64_t scratch_need(const dt_layer *L, int gemm_rounds) {
    int64_t need = L->in_numel > L->out_numel ? L->in_numel : L->out_numel;
    if (gemm_rounds && !(L->def->flags & DT_LDEF_LP_OWN))
        return (L->def->flags & DT_LDEF_GEMM) && has_bias(L) ? L->out_numel : 0;
    if (!(L->def->flags & DT_LDEF_GEMM) || L->in.ndim < 1) return need;
    int64_t last = L->in.d[L->in.ndim - 1], rows = last > 0 ? L->in_numel / last : 0;
    for (int t = 0; t < L->ntensors; t++)
        if (L->t[t].ndim == 2 && L->t[t].role != DT_TENSOR_BUFFER && L->t[t].role != DT_TENSOR_COUNTER)
            for (int k = 0; k < 2; k++)
                if (rows * L->t[t].shape[k] > need) need = rows * L->t[t].shape[k];
    return need;
}

size_t dt_lowp_scratch_floats(const dt_spec *spec, int max_batch, int gemm_rounds) {
    int64_t need = gemm_rounds ? 0 : 1;
    for (int i = 0; i < spec->n; i++) {
        int64_t s = scratch_need(&spec->layers[i], gemm_rounds);
        if (s > need) need = s;
    }
    return (size_t)max_batch * (size_t)need;
}

int dt_lowp_scratch_count(const dt_spec *spec, int gemm_rounds) { return gemm_rounds && !spec_lp_own(spec) ? 1 : 2; }

int dt_lowp_copies_weights(const dt_spec *spec, int gemm_rounds) { return !gemm_rounds || spec_lp_own(spec); }

dt_status dt_lowp_init(const dt_ops *ops, const dt_spec *spec, int max_batch, dt_dtype dtype, dt_lowp **out) {
    *out = NULL;
    if (dtype != DT_BF16 && dtype != DT_F16)
        return dt_error(DT_ERR_INVALID, "precision: low precision is bf16 or f16, got %s", dt_dtype_name(dtype));
    dt_lowp *lp = calloc(1, sizeof *lp);
    if (!lp) return dt_error(DT_ERR_NOMEM, "precision: out of memory");
    lp->dtype = dtype;
    lp->spec = spec;
    lp->nparams = (size_t)spec->nparams;
    lp->gemm_rounds = dt_ops_gemm_lp_rounds(ops, dtype);
    lp->copy = dt_lowp_copies_weights(spec, lp->gemm_rounds);
    lp->scratch_n = dt_lowp_scratch_floats(spec, max_batch, lp->gemm_rounds);
    dt_status s = DT_OK;
    for (int k = 0; k < dt_lowp_scratch_count(spec, lp->gemm_rounds) && s == DT_OK && lp->scratch_n; k++)
        s = dt_mem_alloc(ops, DT_MEM_ACTS, (void **)&lp->scratch[k], lp->scratch_n * sizeof(float));
    if (s != DT_OK) {
        dt_lowp_free(ops, lp);
        return s;
    }
    *out = lp;
    return DT_OK;
}

void dt_lowp_free(const dt_ops *ops, dt_lowp *lp) {
    if (!lp) return;
    dt_mem_sub(DT_MEM_PARAMS, lp->held_floats * sizeof(float));   /* what dt_mem_free does not know of */
    free(lp->held);
    dt_mem_free(ops, lp->wcopy);
    dt_mem_free(ops, lp->scratch[0]);
    dt_mem_free(ops, lp->scratch[1]);
    free(lp);
}

dt_dtype     dt_lowp_dtype(const dt_lowp *lp) { return lp ? lp->dtype : DT_F32; }
const float *dt_lowp_weights(const dt_lowp *lp) { return lp ? lp->wcopy : NULL; }
void         dt_lowp_stale(dt_lowp *lp) { if (lp) lp->fresh = 0; }

size_t dt_lowp_bytes(const dt_lowp *lp) {
    if (!lp) return 0;
    size_t copy = !lp->wcopy ? 0 : lp->partial ? lp->held_floats : lp->nparams;
    return (copy + (lp->scratch[0] ? lp->scratch_n : 0) + (lp->scratch[1] ? lp->scratch_n : 0)) * sizeof(float);
}

/* The weight copy, made on first use (partial: none of it resident yet). */
static dt_status wcopy_need(dt_lowp *lp, const dt_ops *ops) {
    if (lp->wcopy) return DT_OK;
    return dt_mem_alloc_part(ops, DT_MEM_PARAMS, (void **)&lp->wcopy, lp->nparams * sizeof(float),
                             lp->partial ? 0 : lp->nparams * sizeof(float));
}

void dt_lowp_partial(dt_lowp *lp) {
    if (lp && !lp->wcopy) lp->partial = 1;
}

/* Partial: the copy's [a, b) resident and counted before it is written. */
static dt_status hold(dt_lowp *lp, const dt_ops *ops, size_t a, size_t b) {
    if (!lp->partial) return DT_OK;
    while (a < b) {
        int i = 0;   /* the first held range that ends after a */
        while (i < lp->nheld && lp->held[i][1] <= a) i++;
        if (i < lp->nheld && lp->held[i][0] <= a) {   /* a is held: on past that range */
            a = lp->held[i][1];
            continue;
        }
        size_t e = i < lp->nheld && lp->held[i][0] < b ? lp->held[i][0] : b;   /* the gap [a, e) */
        if (lp->nheld == lp->capheld) {
            int cap = lp->capheld ? 2 * lp->capheld : 8;
            size_t(*h)[2] = realloc(lp->held, (size_t)cap * sizeof *h);
            if (!h) return dt_error(DT_ERR_NOMEM, "precision: out of memory");
            lp->held = h;
            lp->capheld = cap;
        }
        DT_TRY(ops->populate(lp->wcopy + a, (e - a) * sizeof(float)));
        memmove(lp->held + i + 1, lp->held + i, (size_t)(lp->nheld - i) * sizeof *lp->held);
        lp->held[i][0] = a;
        lp->held[i][1] = e;
        lp->nheld++;
        lp->held_floats += e - a;
        dt_mem_add(DT_MEM_PARAMS, (e - a) * sizeof(float));
        a = e;
    }
    /* neighbours that now touch become one */
    int k = 0;
    for (int i = 0; i < lp->nheld; i++) {
        if (k > 0 && lp->held[k - 1][1] == lp->held[i][0]) lp->held[k - 1][1] = lp->held[i][1];
        else lp->held[k][0] = lp->held[i][0], lp->held[k][1] = lp->held[i][1], k++;
    }
    lp->nheld = k;
    return DT_OK;
}

dt_status dt_lowp_keep(dt_lowp *lp, const dt_ops *ops, size_t lo, size_t hi) {
    if (!lp || !lp->partial) return DT_OK;
    int k = 0;
    for (int i = 0; i < lp->nheld; i++) {
        size_t a = lp->held[i][0], b = lp->held[i][1];
        size_t x = a > lo ? a : lo, y = b < hi ? b : hi;   /* what stays: [x, y) */
        if (x >= y) x = y = b;
        if (x > a) DT_TRY(ops->discard(lp->wcopy + a, (x - a) * sizeof(float)));
        if (b > y) DT_TRY(ops->discard(lp->wcopy + y, (b - y) * sizeof(float)));
        size_t gone = (x - a) + (b - y);
        lp->held_floats -= gone;
        dt_mem_sub(DT_MEM_PARAMS, gone * sizeof(float));
        if (y > x) lp->held[k][0] = x, lp->held[k][1] = y, k++;
    }
    lp->nheld = k;
    return DT_OK;
}

dt_status dt_lowp_round_layer(dt_lowp *lp, const dt_ops *ops, const dt_layer *L, const float *src, float *dst,
                              size_t lo, size_t hi) {
    if (!lp || !lp->copy || !(L->def->flags & DT_LDEF_GEMM)) return DT_OK;   /* no copy: gemm_lp rounds */
    if (!dst) {
        DT_TRY(wcopy_need(lp, ops));
        dst = lp->wcopy;
    }
    for (int t = 0; t < L->ntensors; t++) {
        const dt_layer_tensor *T = &L->t[t];
        if ((T->role != DT_TENSOR_PARAM && T->role != DT_TENSOR_TIED) || T->ndim < 2) continue;
        size_t a = T->offset > lo ? T->offset : lo, b = T->offset + (size_t)T->numel;
        if (b > hi) b = hi;
        if (a < b && dst == lp->wcopy) DT_TRY(hold(lp, ops, a, b));
        if (a < b) DT_TRY(ops->round_to(dst + a, src + a, b - a, (int)lp->dtype));
    }
    return DT_OK;
}

static int range_cmp(const void *x, const void *y) {
    const size_t *a = x, *b = y;
    return a[0] < b[0] ? -1 : a[0] > b[0];
}

size_t dt_lowp_copy_floats(const dt_spec *spec, size_t lo, size_t hi) {
    size_t(*r)[2] = NULL, n = 0, cap = 0, floats = 0;
    for (int i = 0; i < spec->n; i++) {   /* the ranges dt_lowp_round_layer writes */
        const dt_layer *L = &spec->layers[i];
        for (int t = 0; (L->def->flags & DT_LDEF_GEMM) && t < L->ntensors; t++) {
            const dt_layer_tensor *T = &L->t[t];
            if ((T->role != DT_TENSOR_PARAM && T->role != DT_TENSOR_TIED) || T->ndim < 2) continue;
            size_t a = T->offset > lo ? T->offset : lo, b = T->offset + (size_t)T->numel;
            if (b > hi) b = hi;
            if (a >= b) continue;
            if (n == cap) {
                size_t(*x)[2] = realloc(r, (cap = cap ? 2 * cap : 16) * sizeof *x);
                if (!x) {
                    free(r);
                    return hi > lo ? hi - lo : 0;   /* out of memory: at most the whole range */
                }
                r = x;
            }
            r[n][0] = a, r[n][1] = b, n++;
        }
    }
    if (n > 1) qsort(r, n, sizeof *r, range_cmp);
    for (size_t i = 0, end = 0; i < n; i++) {   /* the union: a range another layer reads too, once */
        size_t a = r[i][0] > end ? r[i][0] : end;
        if (r[i][1] > a) floats += r[i][1] - a;
        if (r[i][1] > end) end = r[i][1];
    }
    free(r);
    return floats;
}

dt_status dt_lowp_prepare(dt_lowp *lp, const dt_ops *ops, const float *params, size_t lo, size_t hi) {
    if (!lp || lp->fresh) return DT_OK;
    for (int i = 0; i < lp->spec->n; i++)
        DT_TRY(dt_lowp_round_layer(lp, ops, &lp->spec->layers[i], params, NULL, lo, hi));
    lp->fresh = 1;
    return DT_OK;
}

void dt_lowp_ctx(const dt_lowp *lp, dt_nn_ctx *c) {
    c->lp = lp ? (int)lp->dtype : 0;
    c->lp_gemm_rounds = lp ? lp->gemm_rounds : 0;
    c->lp_params = lp ? lp->wcopy : NULL;
    c->lp_scratch[0] = lp ? lp->scratch[0] : NULL;
    c->lp_scratch[1] = lp ? lp->scratch[1] : NULL;
    c->lp_scratch_n = lp ? lp->scratch_n : 0;
}

/* ---- the layer rows' helpers (layers.h) ---- */

dt_status layer_lp_operand(const dt_nn_ctx *c, int slot, const float **x, size_t n) {
    if (!c->lp) return DT_OK;
    if (n > c->lp_scratch_n)
        return dt_error(DT_ERR_INTERNAL, "precision: an operand of %zu values exceeds the scratch of %zu", n, c->lp_scratch_n);
    DT_TRY(c->ops->round_to(c->lp_scratch[slot], *x, n, c->lp));
    *x = c->lp_scratch[slot];
    return DT_OK;
}

dt_status layer_lp_gemm_operand(const dt_nn_ctx *c, int slot, const float **x, size_t n) {
    return c->lp_gemm_rounds ? DT_OK : layer_lp_operand(c, slot, x, n);
}

dt_status layer_lp_round(const dt_nn_ctx *c, float *buf, size_t n) {
    return c->lp ? c->ops->round_to(buf, buf, n, c->lp) : DT_OK;
}

const float *layer_lp_weight(const dt_nn_ctx *c, const float *w) {
    return c->lp && w ? c->lp_params + (w - c->params) : w;
}

const float *layer_lp_gemm_weight(const dt_nn_ctx *c, const float *w) {
    return c->lp_gemm_rounds ? w : layer_lp_weight(c, w);
}

dt_status layer_gemm(const dt_nn_ctx *c, int transA, int transB, int M, int N, int K, const float *A, int lda,
                     const float *B, int ldb, float *C, int ldc) {
    if (c->lp) return c->ops->gemm_lp(c->lp, transA, transB, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C, ldc);
    return c->ops->sgemm(transA, transB, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C, ldc);
}
