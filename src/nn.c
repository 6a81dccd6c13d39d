/*
 * nn.c: the layer table and the driver that runs a layer through its row.
 *
 * The table is generated from DT_LAYER_LIST, so it cannot lose a kind; the
 * driver allocates each layer's output, forwards every pass to the row, and
 * keeps what all kinds share (output pointer, train mode, tensor views).
 * Nothing here touches tensor data: every numeric step is a dt_ops call made
 * by a row, so the CUDA backend reuses this code as it is (docs/DESIGN.md rule 1).
 */
#include "dtype.h"
#include "layers.h"
#include "mem.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* ---- shapes ------------------------------------------------------------- */

int64_t dt_shape_numel(const dt_shape *s) {
    int64_t n = 1;
    for (int i = 0; i < s->ndim; i++)
        if (__builtin_mul_overflow(n, s->d[i], &n)) return INT64_MAX;   /* saturates: callers bound it */
    return n;
}

void dt_shape_str(const dt_shape *s, int with_batch, char *buf, size_t n) {
    size_t off = 0;
    if (n == 0) return;
    buf[0] = '\0';
    off += (size_t)snprintf(buf, n, "(%s", with_batch ? "B" : "");
    for (int i = 0; i < s->ndim && off < n; i++)
        off += (size_t)snprintf(buf + off, n - off, "%s%lld", (i || with_batch) ? ", " : "",
                                (long long)s->d[i]);
    if (off < n) snprintf(buf + off, n - off, ")");
}

dt_status dt_shape_parse(const char *text, dt_shape *s) {
    memset(s, 0, sizeof *s);
    const char *p = text ? text : "";
    for (;;) {
        /* digits only: no sign, space or empty field; at most 3 of them (dt_shape's d[]) */
        int64_t v = 0;
        const char *start = p;
        while (*p >= '0' && *p <= '9' && v <= (INT64_C(1) << 31)) v = v * 10 + (*p++ - '0');
        if (p == start || v < 1 || v > (INT64_C(1) << 31) || s->ndim == 3 || (*p && *p != ','))
            break;
        s->d[s->ndim++] = v;
        if (!*p) return DT_OK;
        p++;
    }
    memset(s, 0, sizeof *s);
    return dt_error(DT_ERR_FORMAT, "input shape \"%.64s\" is not C,H,W, T,C or F (1 to 3 sizes in 1..2^31, "
                    "comma-separated)", text ? text : "");
}

static const dt_layer_def *const defs[] = {
#define DT_LAYER_ROW_(K, name) [DT_LAYER_##K] = &dt_layer_def_##name,
    DT_LAYER_LIST(DT_LAYER_ROW_)
#undef DT_LAYER_ROW_
};
_Static_assert(sizeof defs / sizeof defs[0] == DT_LAYER_NKINDS, "one row per layer kind");

const dt_layer_def *dt_layer_def_of(dt_layer_kind k) {
    return (k >= 0 && k < DT_LAYER_NKINDS) ? defs[k] : NULL;
}

const char *dt_layer_kind_name(dt_layer_kind k) {
    const dt_layer_def *d = dt_layer_def_of(k);
    return d && d->name ? d->name : "?";
}

int dt_layer_kind_find(const char *name) {
    for (int k = 0; k < DT_LAYER_NKINDS; k++)
        if (defs[k]->name && !(defs[k]->flags & DT_LDEF_INTERNAL) && !strcmp(defs[k]->name, name))
            return k;
    return -1;
}

const char *dt_layer_kind_list(void) {
    static char list[512];
    if (list[0]) return list;
    size_t off = 0;
    for (int k = 0; k < DT_LAYER_NKINDS && off < sizeof list; k++) {
        if (defs[k]->flags & DT_LDEF_INTERNAL) continue;
        off += (size_t)snprintf(list + off, sizeof list - off, "%s%s", off ? ", " : "", defs[k]->name);
    }
    return list;
}

const char *dt_layer_def_missing(const dt_layer_def *d) {
    if (!d) return "row";
    if (!d->name || !d->name[0]) return "name";
    if (!d->help) return "help";
    if (!d->torch) return "torch";
    if (!d->infer) return "infer";
    if (!d->forward) return "forward";
    if (!d->backward) return "backward";
    if (!!(d->flags & DT_LDEF_CONTAINER) != !!d->closer) return "closer (exactly for containers)";
    for (const dt_arg_def *a = d->args; a && a->name; a++) {
        if (!a->expect) return "args[].expect";
        if (a->offset + (a->type == DT_ARG_FLOAT ? sizeof(float) : sizeof(int)) > d->self_size)
            return "self_size (an argument lies outside it)";
        if (a->required && a != d->args && !a[-1].required) return "args[] (required after optional)";
    }
    return NULL;
}

/* ---- tensors and arguments ------------------------------------------------ */

dt_status dt_layer_tensor_add(dt_layer *L, const char *suffix, dt_tensor_role role, int64_t *counter,
                              int ndim, const int64_t *shape) {
    if (L->ntensors == DT_LAYER_MAX_TENSORS || ndim < 0 || ndim > 4)
        return dt_error(DT_ERR_INTERNAL, "layer %s '%s': too many tensors or dims", L->name, L->text);
    dt_layer_tensor *t = &L->t[L->ntensors++];
    memset(t, 0, sizeof *t);
    t->suffix = suffix;
    t->role = role;
    t->counter = counter;
    t->ndim = ndim;
    t->numel = 1;
    for (int i = 0; i < ndim; i++) {
        t->shape[i] = shape[i];
        /* kernels index a tensor with 32-bit counts: refuse what they could not address */
        if (shape[i] <= 0 || __builtin_mul_overflow(t->numel, shape[i], &t->numel) || t->numel > DT_LAYER_MAX_NUMEL)
            return dt_error(DT_ERR_INVALID, "model spec: layer %s '%s': its %s would have more than %lld "
                            "elements", L->name, L->text, suffix, (long long)DT_LAYER_MAX_NUMEL);
    }
    if (role == DT_TENSOR_PARAM) L->nparams++;
    return DT_OK;
}

float *dt_layer_tensor_ptr(const dt_nn_ctx *c, const dt_layer *L, int i) {
    if (i < 0 || i >= L->ntensors) return NULL;
    const dt_layer_tensor *t = &L->t[i];
    if (t->role == DT_TENSOR_PARAM || t->role == DT_TENSOR_TIED) return c->params + t->offset;
    if (t->role == DT_TENSOR_BUFFER) return c->buffers + t->offset;
    return NULL;
}

dt_layer *dt_layer_find_before(dt_layer *L, dt_layer_kind k) {
    for (int i = L->index - 1; i >= 0; i--) {
        dt_layer *P = L - (L->index - i);   /* the spec's array, in execution order */
        if (P->kind == k) return P;
    }
    return NULL;
}

double dt_layer_arg(const dt_layer *L, const char *name) {
    for (const dt_arg_def *a = L->def ? L->def->args : NULL; a && a->name; a++) {
        if (strcmp(a->name, name)) continue;
        const char *p = (const char *)L->self + a->offset;
        if (a->type == DT_ARG_FLOAT) { float f; memcpy(&f, p, sizeof f); return f; }
        int v;
        memcpy(&v, p, sizeof v);
        return v;
    }
    return NAN;
}

dt_status layer_shape_error(const dt_layer *L, const char *what, const char *hint) {
    char sh[64];
    dt_shape_str(&L->in, 1, sh, sizeof sh);
    return dt_error(DT_ERR_INVALID, "model spec: layer %s '%s': %s, but its input is %s%s",
                    L->name, L->text, what, sh, hint);
}

dt_status layer_same_shape(dt_layer *L, dt_shape *out) {
    *out = L->in;
    return DT_OK;
}

dt_status layer_view_forward(const dt_nn_ctx *c, dt_layer *L, const float *x, int B) {
    (void)c; (void)L; (void)x; (void)B;   /* the driver pointed out_ptr at x */
    return DT_OK;
}

/* ---- the driver ----------------------------------------------------------- */

dt_status dt_layer_mem_take(dt_layer_mem *a, dt_layer *L, void **p, size_t bytes) {
    *p = NULL;
    if (a->in_arena) {
        size_t share = (bytes + DT_LAYER_MEM_ALIGN - 1) / DT_LAYER_MEM_ALIGN * DT_LAYER_MEM_ALIGN;
        if (!a->measure) *p = a->arena + a->used;
        a->used += share;
        return DT_OK;
    }
    a->used += bytes;
    if (a->measure) return DT_OK;
    if (L->nown == DT_LAYER_MAX_OWN)
        return dt_error(DT_ERR_INTERNAL, "layer %s '%s': more than %d buffers", L->name, L->text, DT_LAYER_MAX_OWN);
    DT_TRY(dt_mem_alloc(a->ops, DT_MEM_ACTS, p, bytes));
    L->own[L->nown++] = *p;
    return DT_OK;
}

static int scratch_lane(const dt_layer *L, dt_scratch_kind kind) {
    if (kind != DT_SCRATCH_BLOCK) return (int)kind;
    int d = L->depth < 0 ? 0 : L->depth;
    return DT_SCRATCH_BLOCK + (d < DT_LAYER_MAX_DEPTH ? d : DT_LAYER_MAX_DEPTH - 1);
}

dt_status dt_layer_scratch_take(dt_layer_mem *a, dt_layer *L, dt_scratch_kind kind, void **p, size_t bytes) {
    dt_layer_scratch *sc = a->scratch;
    if (!sc) return dt_layer_mem_take(a, L, p, bytes);
    int lane = scratch_lane(L, kind);
    size_t share = (bytes + DT_LAYER_MEM_ALIGN - 1) / DT_LAYER_MEM_ALIGN * DT_LAYER_MEM_ALIGN, at = sc->used[lane];
    sc->used[lane] += share;
    *p = NULL;
    if (sc->used[lane] > sc->most[lane]) {
        if (sc->base && !a->measure)
            return dt_error(DT_ERR_INTERNAL, "layer %s '%s': %zu bytes of scratch beyond the %zu measured", L->name,
                            L->text, sc->used[lane], sc->most[lane]);
        sc->most[lane] = sc->used[lane];
    }
    if (sc->base && !a->measure) *p = sc->base + sc->off[lane] + at;
    return DT_OK;
}

size_t dt_layer_scratch_layout(dt_layer_scratch *sc) {
    size_t at = 0;
    for (int l = 0; l < DT_SCRATCH_LANES; l++) {
        sc->off[l] = at;
        at += sc->most[l];
    }
    return at;
}

dt_status dt_layer_alloc_in(dt_layer_mem *y_mem, dt_layer_mem *state_mem, dt_layer *L, int max_batch) {
    if (state_mem->scratch) memset(state_mem->scratch->used, 0, sizeof state_mem->scratch->used);
    if (L->out16) {   /* kept in 16 bits; the f32 output is scratch */
        size_t n = (size_t)max_batch * (size_t)L->out_numel;
        DT_TRY(dt_layer_mem_take(y_mem, L, (void **)&L->y16, n * sizeof(uint16_t)));
        DT_TRY(dt_layer_scratch_take(y_mem, L, L->out16 == 1 ? DT_SCRATCH_STAGE0 : DT_SCRATCH_STAGE1, (void **)&L->y,
                                     n * sizeof(float)));
    } else if (!(L->def->flags & DT_LDEF_NO_OUTPUT) && !L->out_in_place)
        DT_TRY(dt_layer_mem_take(y_mem, L, (void **)&L->y, (size_t)max_batch * (size_t)L->out_numel * sizeof(float)));
    return L->def->alloc ? L->def->alloc(state_mem, L, max_batch) : DT_OK;
}

dt_status dt_layer_alloc(const dt_ops *ops, dt_layer *L, int max_batch) {
    dt_layer_mem own = {.ops = ops};
    return dt_layer_alloc_in(&own, &own, L, max_batch);
}

void dt_layer_free(const dt_ops *ops, dt_layer *L) {
    if (L->def && L->def->free) L->def->free(ops, L);
    for (int i = 0; i < L->nown; i++) dt_mem_free(ops, L->own[i]);
    L->nown = 0;
    L->y = L->out_ptr = NULL;
    L->y16 = NULL;
}

dt_status dt_keep16(const dt_ops *o, int t, uint16_t *dst, const float *src, size_t n) {
    return t == DT_F16 ? o->f32_to_f16(dst, src, n) : o->f32_to_bf16(dst, src, n);
}

dt_status dt_widen16(const dt_ops *o, int t, float *dst, const uint16_t *src, size_t n) {
    return t == DT_F16 ? o->f16_to_f32(dst, src, n) : o->bf16_to_f32(dst, src, n);
}

dt_status dt_layer_init(const dt_nn_ctx *c, dt_layer *L) {
    return L->def->init ? L->def->init(c, L) : DT_OK;
}

dt_status dt_layer_bn_replay(const dt_nn_ctx *c, dt_layer *L, const float *rec) {
    return L->def->replay ? L->def->replay(c, L, rec + L->rec_off) : DT_OK;
}

dt_status dt_layer_forward(const dt_nn_ctx *c, dt_layer *L, const float *x, int B) {
    L->out_ptr = ((L->def->flags & DT_LDEF_NO_OUTPUT) || L->out_in_place) ? (float *)x : L->y;
    L->last_train = c->train;
    return L->def->forward(c, L, x, B);
}

dt_status dt_layer_backward(const dt_nn_ctx *c, dt_layer *L, const float *x, const float *dy,
                            float *dx, int B) {
    return L->def->backward(c, L, x, dy, dx, B);
}
