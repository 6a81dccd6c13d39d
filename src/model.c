/*
 * model.c: a built model: flat parameter / gradient / buffer arrays, the
 * PyTorch-named registry over them, and forward / loss / backward of the layer
 * list (spec.c parses the list and infers shapes).
 *
 * Memory (all from the dt_ops table, counted by category: mem.h):
 *   params, grads  (nparams)          PyTorch parameter order, one flat array each
 *   buffers        (nbuffers)         batchnorm running_mean / running_var
 *   per layer      (max_batch, outs)  output activations, saved state
 *   dbuf[2]        (max_batch, max input)  ping-pong gradient buffers for backward (a
 *                                          layer's input gradient: the last layer's
 *                                          output gradient is head)
 *   scratch        the layers' scratch (nn.h dt_layer_scratch: attention's backward,
 *                  the residual blocks' skip gradient), one buffer for all
 *   head           (max_batch, outputs)         dloss (cross-entropy: the softmax first,
 *                                               turned into dloss in place); none when
 *                                               the last layer's backward does not read
 *                                               its output: dloss takes the outputs' place
 *   arena          recompute: the largest block's layers, shared by every block
 * One function (model_layout) takes all of it, either allocating or only counting
 * (dt_model_plan_memory), so a plan and a built model cannot disagree.
 */
#include "model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "lowp.h"
#include "trace.h"

/* One entry of the state registry: tensor t of layer `layer`. */
typedef struct {
    char     name[64];  /* "<module path>.<suffix>": "3.0.weight" */
    int      layer, t;
    int      param_index;
} state_entry;

struct dt_model {
    const dt_ops *ops;
    dt_spec       spec;
    dt_shape      input;
    uint64_t      seed;
    int           max_batch;
    size_t        nparams, nbuffers;
    size_t        cap;         /* floats allocated for params and grads (>= nparams) */
    float        *params, *grads, *buffers;
    float        *dbuf[2];     /* (max_batch, max input) */
    unsigned char *scratch;    /* the layers' scratch, laid out by scr */
    dt_layer_scratch scr;
    float        *head;        /* (max_batch, outputs): dloss / doutputs (the softmax before) */
    int           head_in_place;   /* no head: dloss is written over the last layer's output */
    float        *scalar;      /* (2): loss, correct (device) */
    const float  *x;           /* input of the last forward (of layer x_at: a range's first) */
    int           x_at;
    int           last_B, last_train;
    uint32_t      epoch;
    uint64_t      sample0;
    int           nstate;
    state_entry  *state;
    int          *param_state; /* param index -> state index */
    dt_bn_sync_fn    bn_sync;
    void            *bn_sync_ctx;
    float           *bn_record;
    dt_grad_ready_fn grad_ready;
    void            *grad_ready_ctx;
    dt_layer_hook_fn layer_hook;
    void            *layer_hook_ctx;
    float          **pview;        /* per layer: where its parameters are read (NULL: params) */
    int              views_only;   /* every layer with parameters reads them through pview */
    size_t           res_lo, res_hi;   /* the parameters resident in the flat array (sharded) */
    int              lp_partial;       /* dt_model_precision_partial */
    float          **gview;        /* per layer: where its gradient is written (NULL: grads) */
    float           *gcur;         /* where the layer whose backward ran last wrote it */
    int              decode_pos;   /* < 0: ordinary passes */
    dt_model_opts    mo;
    /* recompute: the outermost residual blocks [start, end] (their opening and closing
     * rows), the block of each layer (-1 outside), the shared arena and the block whose
     * activations it holds now (-1: none) */
    int              nblocks;
    int             (*blocks)[2];
    int             *block_of;
    int             *mod_first;    /* per layer: the first layer of its top-level module */
    int             *mod_index;    /* per layer: that module's place (0, 1, ...) */
    unsigned char   *arena;
    int              arena_owner;
    dt_lowp         *lp;           /* mixed precision (lowp.h), NULL in f32 */
    float            loss_scale;   /* the loss gradient's factor before backward (fp16 loss scaling) */
    /* activation sets (dt_model_act_sets): layers [set_lo, set_hi) hold their buffers in
     * set set_cur of nsets blocks of set_bytes; each set remembers the pass that filled it */
    int              nsets, set_cur, set_lo, set_hi;
    size_t           set_bytes;
    unsigned char   *sets;
    struct set_pass { const float *x; int x_at, B, train, valid; uint32_t epoch; uint64_t sample0; } *set_pass;
    float          **set_out;      /* per set, the range's layers' outputs as the pass left them */
    int              acts_out;     /* dt_model_acts_only gave some layers' buffers back */
};

/* Where layer i reads its parameters: the flat array, or a view set by
 * dt_model_set_param_view (base + offset is each of its tensors). */
static float *layer_params(const dt_model *m, int i) {
    return m->pview && m->pview[i] ? m->pview[i] : m->params;
}

/* The input of layer i in the last forward: the range's input for its first layer, else
 * the output of the layer before. */
static const float *input_of(const dt_model *m, int i) {
    return i == m->x_at ? m->x : m->spec.layers[i - 1].out_ptr;
}

/* Point a pass's context at layer i's parameters, and at their rounded GEMM weights in
 * mixed precision: the flat array's copy, or the view itself (rounded in place as the
 * parameters arrived: dt_model_params_arrived). */
static dt_status layer_ctx(const dt_model *m, dt_nn_ctx *c, int i) {
    int view = m->pview && m->pview[i];
    c->params = layer_params(m, i);
    if (!c->lp) return DT_OK;
    c->lp_params = view ? c->params : dt_lowp_weights(m->lp);
    unsigned f = m->spec.layers[i].def->flags;
    if (!c->lp_params && (f & DT_LDEF_GEMM) && (!c->lp_gemm_rounds || (f & DT_LDEF_LP_OWN)))
        return dt_error(DT_ERR_INTERNAL, "model: layer %d has no rounded weights (no view, and the copy was not made)", i);
    return DT_OK;
}

static float *layer_grads(const dt_model *m, int i) {
    return m->gview && m->gview[i] ? m->gview[i] : m->grads;
}

static dt_nn_ctx nn_ctx(dt_model *m, int train) {
    dt_nn_ctx c = {
        .ops = m->ops, .params = m->params, .grads = m->grads, .buffers = m->buffers,
        .train = train, .seed = m->seed, .epoch = m->epoch, .sample0 = m->sample0,
        .bn_sync = m->bn_sync, .bn_sync_ctx = m->bn_sync_ctx, .bn_record = m->bn_record,
        .decode = m->decode_pos >= 0, .decode_pos = m->decode_pos,
    };
    dt_lowp_ctx(m->lp, &c);
    return c;
}

/* Build the state_dict-ordered registry: the layers' tensors in flat (pre-)order,
 * each layer's as its row declared them (parameters, then buffers). */
static dt_status build_registry(dt_model *m) {
    int cap = 0;
    for (int i = 0; i < m->spec.n; i++) cap += m->spec.layers[i].ntensors;
    m->state = calloc((size_t)cap + 1, sizeof *m->state);
    m->param_state = calloc((size_t)m->spec.ntensors + 1, sizeof *m->param_state);
    if (!m->state || !m->param_state) return dt_error(DT_ERR_NOMEM, "model: out of memory");
    int n = 0, np = 0;
    for (int i = 0; i < m->spec.n; i++) {
        const dt_layer *L = &m->spec.layers[i];
        for (int t = 0; t < L->ntensors; t++) {
            state_entry *e = &m->state[n];
            snprintf(e->name, sizeof e->name, "%s.%s", L->name, L->t[t].suffix);
            e->layer = i;
            e->t = t;
            e->param_index = L->t[t].role == DT_TENSOR_PARAM ? np : -1;
            if (L->t[t].role == DT_TENSOR_PARAM) m->param_state[np++] = n;
            n++;
        }
    }
    m->nstate = n;
    return DT_OK;
}

void dt_model_free(dt_model *m) {
    if (!m) return;
    const dt_ops *o = m->ops;
    if (o) {
        for (int i = 0; i < m->spec.n; i++) dt_layer_free(o, &m->spec.layers[i]);
        void *bufs[] = {m->params, m->grads, m->buffers, m->dbuf[0], m->dbuf[1], m->head, m->scalar, m->scratch,
                        m->arena, m->sets};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) dt_mem_free(o, bufs[i]);
        dt_lowp_free(o, m->lp);
    }
    dt_spec_free(&m->spec);
    free(m->state);
    free(m->param_state);
    free(m->set_pass);
    free(m->set_out);
    free(m->blocks);
    free(m->block_of);
    free(m->mod_first);
    free(m->mod_index);
    free(m->pview);
    free(m->gview);
    free(m);
}

void dt_model_opts_default(dt_model_opts *o) { memset(o, 0, sizeof *o); }

/* ---- memory layout ------------------------------------------------------------------ */

int dt_model_units(const dt_model *m, size_t unit_floats, int *unit, int64_t *max) {
    return dt_spec_units(&m->spec, unit_floats, unit, max);
}

int dt_spec_units(const dt_spec *s, size_t unit_floats, int *unit, int64_t *max) {
    int nu = 0;
    int64_t floats = 0, most = 0;
    for (int i = 0, open = 0; i < s->n; i++) {
        const dt_layer *L = &s->layers[i];
        if (!open) {
            nu++;
            floats = 0;
            open = 1;
        }
        for (int t = 0; t < L->ntensors; t++)
            if (L->t[t].role == DT_TENSOR_PARAM || L->t[t].role == DT_TENSOR_TIED) floats += L->t[t].numel;
        if (unit) unit[i] = nu - 1;
        if (floats > most) most = floats;
        if ((size_t)floats >= unit_floats) open = 0;
    }
    if (max) *max = most;
    return nu;
}

/* The outermost residual blocks (with recompute; their count either way), and the
 * largest number of parameters of one of sharding's units. */
static dt_status find_blocks(dt_model *m, int64_t *unit_max) {
    int n = m->spec.n;
    m->block_of = malloc((size_t)(n > 0 ? n : 1) * sizeof *m->block_of);
    m->blocks = malloc((size_t)(n > 0 ? n : 1) * sizeof *m->blocks);
    if (!m->block_of || !m->blocks) return dt_error(DT_ERR_NOMEM, "model: out of memory");
    dt_model_units(m, m->mo.unit_floats ? m->mo.unit_floats : DT_MODEL_UNIT_FLOATS, NULL, unit_max);
    m->nblocks = 0;
    for (int i = 0; i < n;) {
        const dt_layer *L = &m->spec.layers[i];
        int end = i;
        if (L->kind == DT_LAYER_RESIDUAL) end = (int)(L->partner - m->spec.layers);
        for (int j = i; j <= end; j++) m->block_of[j] = end > i ? m->nblocks : -1;
        if (end > i) {
            m->blocks[m->nblocks][0] = i;
            m->blocks[m->nblocks][1] = end;
            m->nblocks++;
        }
        i = end + 1;
    }
    if (!m->mo.recompute)
        for (int i = 0; i < n; i++) m->block_of[i] = -1;
    return DT_OK;
}

/* Whether layer i's output is its own memory that no backward reads (not in a recomputed
 * block: its layers live in the arena). */
static int out_unread(const dt_model *m, int i) {
    const dt_layer *L = &m->spec.layers[i];
    return (L->def->flags & DT_LDEF_OUT_UNREAD) && !L->fuse_relu && m->block_of[i] < 0;
}

/* What layers do for their neighbours, before memory is laid out: a layer followed by a
 * relu applies it itself; a residual block whose last layer's output nothing reads again
 * adds the skip over it; the loss's gradient takes the place of such a last layer's
 * output; in low precision such an output that the next layer of its module only
 * multiplies is kept in 16 bits (out16: 1 and 2 alternate along a chain, each the f32
 * scratch the next one reads while it writes its own). */
static void fuse_layers(dt_model *m) {
    int lp = m->mo.act_dtype == DT_BF16 || m->mo.act_dtype == DT_F16;
    for (int i = 0; i + 1 < m->spec.n; i++) {
        dt_layer *L = &m->spec.layers[i], *N = &m->spec.layers[i + 1];
        if ((L->def->flags & DT_LDEF_FUSE_RELU) && N->kind == DT_LAYER_RELU) L->fuse_relu = N->relu_fused = 1;
    }
    for (int i = 0; i + 1 < m->spec.n; i++) {
        dt_layer *L = &m->spec.layers[i], *N = &m->spec.layers[i + 1];
        N->out_in_place = N->kind == DT_LAYER_RESIDUAL_END && L != N->partner && m->block_of[i + 1] < 0 &&
                          out_unread(m, i);
        L->out16 = lp && out_unread(m, i) && (N->def->flags & DT_LDEF_IN_GEMM) && m->block_of[i + 1] < 0 &&
                   m->mod_first[i] == m->mod_first[i + 1];
        if (L->out16) L->out16 = i > 0 && m->spec.layers[i - 1].out16 == 1 ? 2 : 1;
    }
    /* (not for one layer: a layer norm that is also the first writes over its output) */
    m->head_in_place = m->spec.n > 1 && out_unread(m, m->spec.n - 1);
    /* (not in a recomputed block: its arena holds one block, and the f32 working copies
     * would be scratch on top) */
    for (int i = 0; i < m->spec.n; i++) m->spec.layers[i].lp16 = lp && m->block_of[i] < 0 ? (int)m->mo.act_dtype : 0;
}

/* Forward left layer i's output in f32 scratch: keep it in 16 bits for backward. */
static dt_status keep16(const dt_model *m, const dt_layer *L, int B) {
    return dt_keep16(m->ops, (int)m->mo.act_dtype, L->y16, L->y, (size_t)B * (size_t)L->out_numel);
}

/* Backward needs layer i's output (the next layer's input) kept in 16 bits: widen it into
 * its f32 scratch. */
static dt_status widen16(const dt_model *m, const dt_layer *L, int B) {
    return dt_widen16(m->ops, (int)m->mo.act_dtype, L->y, L->y16, (size_t)B * (size_t)L->out_numel);
}

/* Where the loss's gradient goes: the head, or the last layer's output it replaces. */
static float *out_grad(const dt_model *m) {
    return m->head_in_place ? m->spec.layers[m->spec.n - 1].out_ptr : m->head;
}

/* Take bytes of category cat for *p, of which `counted` are resident: allocate, or only
 * count into mi (measuring). */
static dt_status take_part(dt_model *m, dt_model_mem *mi, dt_mem_cat cat, void **p, size_t bytes, size_t counted) {
    *p = NULL;
    if (mi) {
        mi->bytes[cat] += counted < bytes ? counted : bytes;
        return DT_OK;
    }
    return dt_mem_alloc_part(m->ops, cat, p, bytes, counted);
}

static dt_status take(dt_model *m, dt_model_mem *mi, dt_mem_cat cat, void **p, size_t bytes) {
    return take_part(m, mi, cat, p, bytes, bytes);
}

/* Every buffer of the model, allocated (mi NULL) or counted into mi. */
static dt_status model_layout(dt_model *m, dt_model_mem *mi) {
    int max_batch = m->max_batch, measure = mi != NULL;
    /* the largest activation, and the largest input of a layer: backward's ping-pong
     * buffers hold input gradients (the last layer's output gradient is head's) */
    int64_t maxact = dt_shape_numel(&m->input), maxin = maxact;
    for (int i = 0; i < m->spec.n; i++) {
        if (m->spec.layers[i].out_numel > maxact) maxact = m->spec.layers[i].out_numel;
        if (m->spec.layers[i].in_numel > maxin) maxin = m->spec.layers[i].in_numel;
    }
    const dt_layer *last = &m->spec.layers[m->spec.n - 1];
    if ((uint64_t)max_batch * (uint64_t)maxact > (UINT64_C(1) << 58))
        return dt_error(DT_ERR_INVALID, "model: %d samples of %lld activations each are more than a device can hold",
                        max_batch, (long long)maxact);
    size_t actb = (size_t)max_batch * (size_t)maxin * sizeof(float);
    size_t outb = (size_t)max_batch * (size_t)last->out_numel * sizeof(float);
    /* sharded (a kept range): only that range is resident, and counted; sharding counts
     * what it gathers */
    const dt_model_layout *lay = &m->mo.layout;
    size_t resident = (lay->keep_hi > lay->keep_lo ? lay->keep_hi - lay->keep_lo : m->cap) * sizeof(float);
    DT_TRY(take_part(m, mi, DT_MEM_PARAMS, (void **)&m->params, m->cap * sizeof(float), resident));
    DT_TRY(take_part(m, mi, DT_MEM_GRADS, (void **)&m->grads, m->cap * sizeof(float), resident));
    DT_TRY(take(m, mi, DT_MEM_PARAMS, (void **)&m->buffers, m->nbuffers * sizeof(float)));
    DT_TRY(take(m, mi, DT_MEM_ACTS, (void **)&m->dbuf[0], actb));
    DT_TRY(take(m, mi, DT_MEM_ACTS, (void **)&m->dbuf[1], actb));
    if (!m->head_in_place) DT_TRY(take(m, mi, DT_MEM_ACTS, (void **)&m->head, outb));
    DT_TRY(take(m, mi, DT_MEM_OTHER, (void **)&m->scalar, 2 * sizeof(float)));

    /* the layers' scratch: each lane as large as the layer that takes the most of it. Not
     * for the layers of recomputed blocks: their arena holds one block's layers at a time,
     * and their scratch with them (a shared lane would add the largest block's scratch to
     * the largest block's activations, often two different blocks) */
    memset(&m->scr, 0, sizeof m->scr);
    dt_layer_mem probe = {.ops = m->ops, .measure = 1, .scratch = &m->scr};
    for (int i = 0; i < m->spec.n; i++)
        if (m->block_of[i] < 0) DT_TRY(dt_layer_alloc_in(&probe, &probe, &m->spec.layers[i], max_batch));
    DT_TRY(take(m, mi, DT_MEM_ACTS, (void **)&m->scratch, dt_layer_scratch_layout(&m->scr)));
    m->scr.base = m->scratch;

    /* the arena: as large as the largest block's layers (each block's inner layers, and
     * the closing row's state; the closing row's output is the block's, kept) */
    size_t arena = 0;
    for (int b = 0; m->mo.recompute && b < m->nblocks; b++) {
        dt_layer_mem a = {.ops = m->ops, .in_arena = 1, .measure = 1};
        int start = m->blocks[b][0], end = m->blocks[b][1];
        dt_layer_mem none = {.ops = m->ops, .measure = 1};
        for (int i = start; i <= end; i++) DT_TRY(dt_layer_alloc_in(i < end ? &a : &none, &a, &m->spec.layers[i], max_batch));
        if (a.used > arena) arena = a.used;
    }
    DT_TRY(take(m, mi, DT_MEM_ACTS, (void **)&m->arena, arena));
    dt_layer_mem own = {.ops = m->ops, .measure = measure, .scratch = &m->scr};
    dt_layer_mem share = {.ops = m->ops, .in_arena = 1, .measure = measure};
    size_t block_acts = 0;
    for (int i = 0, kb = 0; i < m->spec.n; i++) {
        dt_layer *L = &m->spec.layers[i];
        int b = m->block_of[i];
        size_t before = own.used;
        if (b < 0) DT_TRY(dt_layer_alloc_in(&own, &own, L, max_batch));
        else {
            if (i == m->blocks[b][0]) share = (dt_layer_mem){.ops = m->ops, .arena = m->arena, .in_arena = 1,
                                                             .measure = measure};
            DT_TRY(dt_layer_alloc_in(i < m->blocks[b][1] ? &share : &own, &share, L, max_batch));
        }
        /* what the blocks hold: all of a block's layers, or with recompute their outputs */
        while (kb < m->nblocks && m->blocks[kb][1] < i) kb++;
        if (kb < m->nblocks && i >= m->blocks[kb][0]) block_acts += own.used - before;
    }
    m->arena_owner = -1;
    if (mi) {
        mi->bytes[DT_MEM_ACTS] += own.used;
        mi->block_acts = block_acts + arena;
        mi->arena = arena;
        mi->scratch = dt_layer_scratch_layout(&m->scr);
    }
    return DT_OK;
}

/* Before initialising layer L of a sharded model: its parameters outside the kept range
 * are brought in (a GPU's sparse array has nothing mapped there). */
static dt_status populate_layer(dt_model *m, const dt_layer *L) {
    for (int t = 0; t < L->ntensors; t++)
        if (L->t[t].role == DT_TENSOR_PARAM)
            DT_TRY(m->ops->populate(m->params + L->t[t].offset, (size_t)L->t[t].numel * sizeof(float)));
    return DT_OK;
}

/* After initialising layer L: drop its parameters' pages outside the kept range. */
static dt_status drop_outside(dt_model *m, const dt_layer *L, const dt_model_layout *lay) {
    for (int t = 0; t < L->ntensors; t++) {
        const dt_layer_tensor *T = &L->t[t];
        if (T->role != DT_TENSOR_PARAM) continue;
        size_t a = T->offset, b = T->offset + (size_t)T->numel;
        if (a < lay->keep_lo) DT_TRY(m->ops->discard(m->params + a, ((b < lay->keep_lo ? b : lay->keep_lo) - a) * sizeof(float)));
        if (b > lay->keep_hi) {
            size_t x = a > lay->keep_hi ? a : lay->keep_hi;
            DT_TRY(m->ops->discard(m->params + x, (b - x) * sizeof(float)));
        }
    }
    return DT_OK;
}

/* Each layer's top-level module, as its first layer (for --trace's spans). */
static dt_status find_modules(dt_model *m) {
    int n = m->spec.n, nmod = dt_spec_modules(&m->spec, NULL);
    int *cuts = malloc((size_t)(nmod + 1) * sizeof *cuts);
    m->mod_first = malloc((size_t)(n > 0 ? n : 1) * sizeof *m->mod_first);
    m->mod_index = malloc((size_t)(n > 0 ? n : 1) * sizeof *m->mod_index);
    if (!cuts || !m->mod_first || !m->mod_index) {
        free(cuts);
        return dt_error(DT_ERR_NOMEM, "model: out of memory");
    }
    dt_spec_modules(&m->spec, cuts);
    for (int k = 0; k < nmod; k++)
        for (int i = cuts[k]; i < cuts[k + 1]; i++) {
            m->mod_first[i] = cuts[k];
            m->mod_index[i] = k;
        }
    free(cuts);
    return DT_OK;
}

/* --trace: the span of the pass (forward or backward) over the module whose first
 * layer is `first`, from t0 until now; named by that layer and the module's place (a
 * block's two residuals share their first layer's name) */
static void trace_module(const dt_model *m, int first, const char *pass, double t0, int mark) {
    char name[80];
    snprintf(name, sizeof name, "%.48s (module %d)", m->spec.layers[first].name[0] ? m->spec.layers[first].name : "-",
             m->mod_index[first]);
    dt_trace_span(name, pass, t0, dt_now(), pass);
    dt_trace_dev_span(mark, name, pass, pass);   /* and its work on a device (trace.h) */
}

/* The spec of a model parsed and inferred, its registry and blocks: everything but memory. */
static dt_status model_prepare(const char *spec, const dt_shape *input, const dt_ops *ops, int max_batch,
                               const dt_model_opts *mo, dt_model **out, int64_t *unit_max) {
    *out = NULL;
    if (max_batch <= 0) return dt_error(DT_ERR_INVALID, "model: max batch must be positive, got %d", max_batch);
    dt_model *m = calloc(1, sizeof *m);
    if (!m) return dt_error(DT_ERR_NOMEM, "model: out of memory");
    m->ops = ops;
    m->decode_pos = -1;
    m->loss_scale = 1.0f;
    m->max_batch = max_batch;
    m->input = *input;
    if (mo) m->mo = *mo;
    else dt_model_opts_default(&m->mo);
    dt_dtype act = m->mo.act_dtype;
    if (act != DT_F32 && act != DT_BF16 && act != DT_F16) {
        free(m);
        return dt_error(DT_ERR_INVALID, "model: activations kept in %s: expected f32, bf16 or f16", dt_dtype_name(act));
    }
    dt_status s = dt_spec_parse(spec, &m->spec);
    if (s != DT_OK) { free(m); return s; }
    if ((s = dt_spec_infer(&m->spec, input)) == DT_OK && (s = build_registry(m)) == DT_OK)
        s = find_blocks(m, unit_max);
    if (s == DT_OK) s = find_modules(m);
    if (s == DT_OK) fuse_layers(m);
    if (s != DT_OK) {
        dt_model_free(m);
        return s;
    }
    m->nparams = (size_t)m->spec.nparams;
    m->cap = m->mo.layout.capacity > m->nparams ? m->mo.layout.capacity : m->nparams;
    m->nbuffers = m->spec.nbuffers;
    *out = m;
    return DT_OK;
}

dt_status dt_model_plan_memory(const char *spec, const dt_shape *input, int max_batch, const dt_model_opts *mo,
                               dt_model_mem *out) {
    memset(out, 0, sizeof *out);
    dt_model *m;
    int64_t unit_max;
    DT_TRY(model_prepare(spec, input, NULL, max_batch, mo, &m, &unit_max));
    dt_status s = model_layout(m, out);
    out->nparams = (int64_t)m->nparams;
    out->nbuffers = m->nbuffers;
    out->nrecord = m->spec.nrecord;
    out->unit_params_max = unit_max;
    out->nblocks = m->nblocks;
    out->lp_scratch = 2 * dt_lowp_scratch_floats(&m->spec, max_batch, 0) * sizeof(float);
    out->lp_scratch_rounding = (size_t)dt_lowp_scratch_count(&m->spec, 1) * dt_lowp_scratch_floats(&m->spec, max_batch, 1) *
                               sizeof(float);
    out->lp_copy_rounding = dt_lowp_copies_weights(&m->spec, 1);
    dt_model_free(m);
    return s;
}

static dt_status check_range(const dt_model *m, int lo, int hi, const char *what);

dt_status dt_model_plan_ranges(const char *spec, const dt_shape *input, int max_batch, const dt_model_opts *mo,
                               int n, const int *bounds, size_t *own, size_t *set) {
    dt_model *m;
    int64_t unit_max;
    dt_model_mem mi;
    memset(&mi, 0, sizeof mi);
    for (int r = 0; r < n; r++) own[r] = set[r] = 0;
    DT_TRY(model_prepare(spec, input, NULL, max_batch, mo, &m, &unit_max));
    dt_status s = model_layout(m, &mi);   /* the layers' scratch lanes, as a build takes them */
    for (int r = 0; s == DT_OK && r < n; r++) {
        s = check_range(m, bounds[r], bounds[r + 1], "plan");
        /* as dt_model_acts_all takes a layer's buffers again, and dt_model_act_sets a set */
        dt_layer_mem o = {.measure = 1, .scratch = &m->scr}, a = {.in_arena = 1, .measure = 1, .scratch = &m->scr};
        for (int i = bounds[r]; s == DT_OK && !m->mo.recompute && i < bounds[r + 1]; i++) {
            s = dt_layer_alloc_in(&o, &o, &m->spec.layers[i], max_batch);
            if (s == DT_OK) s = dt_layer_alloc_in(&a, &a, &m->spec.layers[i], max_batch);
        }
        own[r] = o.used;
        set[r] = a.used;
    }
    dt_model_free(m);
    return s;
}

dt_status dt_model_build_ex(const char *spec, const dt_shape *input, const dt_ops *ops, uint64_t seed,
                            int max_batch, const dt_model_opts *mo, dt_model **out) {
    *out = NULL;
    if (!ops) return dt_error(DT_ERR_INVALID, "model: no compute backend");
    dt_model *m;
    int64_t unit_max;
    DT_TRY(model_prepare(spec, input, ops, max_batch, mo, &m, &unit_max));
    m->seed = seed;
    dt_status s = model_layout(m, NULL);
    if (s != DT_OK) goto fail;
    /* zero gradients and padding (only in the kept range when sharded, the arrays'
     * resident part: the rest is written before it is read) */
    const dt_model_layout *lay = &m->mo.layout;
    int keep = lay->keep_hi > lay->keep_lo;
    size_t zlo = keep ? lay->keep_lo : 0, zhi = keep && lay->keep_hi < m->cap ? lay->keep_hi : m->cap;
    size_t plo = m->nparams > zlo ? m->nparams : zlo;
    m->res_lo = zlo;
    m->res_hi = keep ? zhi : SIZE_MAX;
    if (keep && ((s = ops->populate(m->params + zlo, (zhi - zlo) * sizeof(float))) != DT_OK ||
                 (s = ops->populate(m->grads + zlo, (zhi - zlo) * sizeof(float))) != DT_OK))
        goto fail;
    if (zhi > zlo && (s = ops->zero(m->grads + zlo, (zhi - zlo) * sizeof(float))) != DT_OK) goto fail;
    if (zhi > plo && (s = ops->zero(m->params + plo, (zhi - plo) * sizeof(float))) != DT_OK) goto fail;
    dt_nn_ctx c = nn_ctx(m, 0);
    for (int i = 0; i < m->spec.n; i++) {
        if (keep && (s = populate_layer(m, &m->spec.layers[i])) != DT_OK) goto fail;
        if ((s = dt_layer_init(&c, &m->spec.layers[i])) != DT_OK) goto fail;
        if (keep && (s = drop_outside(m, &m->spec.layers[i], lay)) != DT_OK) goto fail;
    }
    *out = m;
    return DT_OK;
fail:
    dt_model_free(m);
    return s;
}

dt_status dt_model_build(const char *spec, const dt_shape *input, const dt_ops *ops,
                         uint64_t seed, int max_batch, dt_model **out) {
    return dt_model_build_ex(spec, input, ops, seed, max_batch, NULL, out);
}

int             dt_model_nlayers(const dt_model *m) { return m->spec.n; }
const dt_layer *dt_model_layer(const dt_model *m, int i) { return (i >= 0 && i < m->spec.n) ? &m->spec.layers[i] : NULL; }
const dt_shape *dt_model_output_shape(const dt_model *m) { return &m->spec.layers[m->spec.n - 1].outs; }
int             dt_model_max_batch(const dt_model *m) { return m->max_batch; }
const dt_ops   *dt_model_ops(const dt_model *m) { return m->ops; }
size_t          dt_model_nparams(const dt_model *m) { return m->nparams; }

dt_status dt_model_reserve(dt_model *m, size_t floats) {
    if (floats <= m->cap) return DT_OK;
    const dt_ops *o = m->ops;
    float *p = NULL, *g = NULL;
    dt_status s = dt_mem_alloc(o, DT_MEM_PARAMS, (void **)&p, floats * sizeof(float));
    if (s == DT_OK) s = dt_mem_alloc(o, DT_MEM_GRADS, (void **)&g, floats * sizeof(float));
    if (s == DT_OK) s = o->zero(p, floats * sizeof(float));
    if (s == DT_OK) s = o->zero(g, floats * sizeof(float));
    if (s == DT_OK && m->nparams) s = o->copy_d2d(p, m->params, m->nparams * sizeof(float));
    if (s != DT_OK) {
        dt_mem_free(o, p);
        dt_mem_free(o, g);
        return s;
    }
    dt_mem_free(o, m->params);
    dt_mem_free(o, m->grads);
    m->params = p;
    m->grads = g;
    m->cap = floats;
    return DT_OK;
}
float          *dt_model_params(dt_model *m) { dt_lowp_stale(m->lp); return m->params; }
float          *dt_model_grads(dt_model *m) { return m->grads; }
size_t          dt_model_nbuffers(const dt_model *m) { return m->nbuffers; }
float          *dt_model_buffers(dt_model *m) { return m->buffers; }
int             dt_model_nparam_tensors(const dt_model *m) { return m->spec.ntensors; }
int             dt_model_nstate(const dt_model *m) { return m->nstate; }

void dt_model_set_decode(dt_model *m, int pos) { m->decode_pos = pos < 0 ? -1 : pos; }

dt_status dt_model_set_precision(dt_model *m, dt_dtype precision) {
    if (precision == dt_lowp_dtype(m->lp)) return DT_OK;
    if (m->mo.act_dtype != DT_F32 && precision != m->mo.act_dtype)
        return dt_error(DT_ERR_INVALID, "model: built to keep activations in %s, it cannot run in %s",
                        dt_dtype_name(m->mo.act_dtype), dt_dtype_name(precision));
    dt_lowp *lp = NULL;
    if (precision != DT_F32) DT_TRY(dt_lowp_init(m->ops, &m->spec, m->max_batch, precision, &lp));
    if (m->lp_partial) dt_lowp_partial(lp);
    dt_lowp_free(m->ops, m->lp);
    m->lp = lp;
    return DT_OK;
}

dt_dtype dt_model_precision(const dt_model *m) { return dt_lowp_dtype(m->lp); }
size_t   dt_model_precision_bytes(const dt_model *m) { return dt_lowp_bytes(m->lp); }
void     dt_model_set_loss_scale(dt_model *m, float scale) { m->loss_scale = scale; }
void     dt_model_params_changed(dt_model *m) { dt_lowp_stale(m->lp); }
dt_status dt_model_params_arrived(dt_model *m, int layer, size_t lo, size_t hi) {
    if (layer < 0 || layer >= m->spec.n) return dt_error(DT_ERR_INVALID, "model: no layer %d", layer);
    float *p = layer_params(m, layer);
    return dt_lowp_round_layer(m->lp, m->ops, &m->spec.layers[layer], p, p == m->params ? NULL : p, lo, hi);
}
void dt_model_set_views_only(dt_model *m, int on) { m->views_only = on; }
void dt_model_precision_partial(dt_model *m) {
    m->lp_partial = 1;
    dt_lowp_partial(m->lp);
}
dt_status dt_model_precision_keep(dt_model *m, size_t lo, size_t hi) { return dt_lowp_keep(m->lp, m->ops, lo, hi); }
void dt_model_set_resident(dt_model *m, size_t lo, size_t hi) {
    m->res_lo = lo;
    m->res_hi = hi;
    dt_lowp_stale(m->lp);
}

/* Layer `layer`'s entry of a per-layer view array, made on first use. */
static dt_status set_view(dt_model *m, float ***views, int layer, float *base) {
    if (layer < 0 || layer >= m->spec.n) return dt_error(DT_ERR_INVALID, "model: no layer %d", layer);
    if (!*views && !(*views = calloc((size_t)m->spec.n, sizeof **views)))
        return dt_error(DT_ERR_NOMEM, "model: out of memory");
    (*views)[layer] = base;
    return DT_OK;
}

dt_status dt_model_set_grad_view(dt_model *m, int layer, float *base) { return set_view(m, &m->gview, layer, base); }

float *dt_model_grads_written(const dt_model *m) { return m->gcur ? m->gcur : m->grads; }

dt_status dt_model_set_param_view(dt_model *m, int layer, float *base) { return set_view(m, &m->pview, layer, base); }

void dt_model_set_bn_sync(dt_model *m, dt_bn_sync_fn fn, void *ctx) { m->bn_sync = fn; m->bn_sync_ctx = ctx; }
void dt_model_set_grad_ready(dt_model *m, dt_grad_ready_fn fn, void *ctx) { m->grad_ready = fn; m->grad_ready_ctx = ctx; }
void dt_model_set_layer_hook(dt_model *m, dt_layer_hook_fn fn, void *ctx) { m->layer_hook = fn; m->layer_hook_ctx = ctx; }

size_t dt_model_bn_record_size(const dt_model *m) { return m->spec.nrecord; }
void   dt_model_set_bn_record(dt_model *m, float *record) { m->bn_record = record; }

dt_status dt_model_bn_replay(dt_model *m, const float *record) {
    if (!record) return dt_error(DT_ERR_INVALID, "model: NULL batchnorm record");
    dt_nn_ctx c = nn_ctx(m, 1);
    c.replay_batch = m->last_B;   /* every record is of a micro-batch of the last forward's size */
    c.replay_scratch[0] = m->dbuf[0];   /* free between passes; a layer may have given its own back */
    c.replay_scratch[1] = m->dbuf[1];
    for (int i = 0; i < m->spec.n; i++) DT_TRY(dt_layer_bn_replay(&c, &m->spec.layers[i], record));
    return DT_OK;
}

dt_status dt_model_state(dt_model *m, int i, dt_tensor_info *info) {
    if (i < 0 || i >= m->nstate)
        return dt_error(DT_ERR_INVALID, "model: state tensor %d out of range [0, %d)", i, m->nstate);
    const state_entry *e = &m->state[i];
    const dt_layer_tensor *T = &m->spec.layers[e->layer].t[e->t];
    dt_lowp_stale(m->lp);   /* info->data may be written through */
    memset(info, 0, sizeof *info);
    info->name = e->name;
    info->is_param = T->role == DT_TENSOR_PARAM;
    info->in_params = T->role == DT_TENSOR_PARAM || T->role == DT_TENSOR_TIED;
    info->param_index = e->param_index;
    info->ndim = T->ndim;
    memcpy(info->shape, T->shape, sizeof info->shape);
    info->numel = T->numel;
    info->offset = T->offset;
    switch (T->role) {
    case DT_TENSOR_PARAM:
        info->dtype = DT_F32;
        info->data = m->params + T->offset;
        info->grad = m->grads + T->offset;
        break;
    case DT_TENSOR_BUFFER:
        info->dtype = DT_F32;
        info->data = m->buffers + T->offset;
        break;
    case DT_TENSOR_COUNTER:
        info->dtype = DT_I64;
        info->on_host = 1;
        info->data = T->counter;
        break;
    case DT_TENSOR_TIED:    /* the same memory as the parameter it names; its gradient is that one's */
        info->dtype = DT_F32;
        info->data = m->params + T->offset;
        break;
    }
    return DT_OK;
}

dt_status dt_model_param(dt_model *m, int i, dt_tensor_info *info) {
    if (i < 0 || i >= m->spec.ntensors)
        return dt_error(DT_ERR_INVALID, "model: parameter %d out of range [0, %d)", i, m->spec.ntensors);
    return dt_model_state(m, m->param_state[i], info);
}

dt_status dt_model_state_find(dt_model *m, const char *name, dt_tensor_info *info) {
    for (int i = 0; i < m->nstate; i++)
        if (!strcmp(m->state[i].name, name)) return dt_model_state(m, i, info);
    return dt_error(DT_ERR_INVALID, "model: no tensor named '%s'", name);
}

static dt_status layer_hook(dt_model *m, int i, dt_layer_phase phase) {
    return m->layer_hook ? m->layer_hook(m->layer_hook_ctx, i, phase) : DT_OK;
}

int dt_model_modules(const dt_model *m, int *cuts) { return dt_spec_modules(&m->spec, cuts); }

int dt_spec_modules(const dt_spec *s, int *cuts) {
    int n = 0;
    for (int i = 0; i < s->n;) {
        const dt_layer *L = &s->layers[i];
        if (cuts) cuts[n] = i;
        n++;
        i = L->kind == DT_LAYER_RESIDUAL ? (int)(L->partner - s->layers) + 1 : i + 1;
    }
    if (cuts) cuts[n] = s->n;
    return n;
}

/* [lo, hi) is a non-empty run of whole top-level modules. */
static dt_status check_range(const dt_model *m, int lo, int hi, const char *what) {
    if (lo < 0 || hi > m->spec.n || lo >= hi)
        return dt_error(DT_ERR_INVALID, "model %s: layers [%d, %d) outside [0, %d) or empty", what, lo, hi, m->spec.n);
    int at_lo = 0, at_hi = hi == m->spec.n;
    for (int i = 0; i < m->spec.n && !(at_lo && at_hi);) {
        const dt_layer *L = &m->spec.layers[i];
        at_lo |= i == lo;
        at_hi |= i == hi;
        i = L->kind == DT_LAYER_RESIDUAL ? (int)(L->partner - m->spec.layers) + 1 : i + 1;
    }
    if (!at_lo || !at_hi)
        return dt_error(DT_ERR_INVALID, "model %s: layers [%d, %d) cut a residual block (a range is whole top-level "
                        "modules)", what, lo, hi);
    return DT_OK;
}

dt_status dt_model_forward_range(dt_model *m, int lo, int hi, const float *x, int B, int train, uint64_t epoch,
                                 int64_t sample_base, const float **out) {
    DT_TRY(check_range(m, lo, hi, "forward"));
    if (B <= 0 || B > m->max_batch)
        return dt_error(DT_ERR_INVALID, "model forward: batch %d outside [1, %d]", B, m->max_batch);
    if (!x) return dt_error(DT_ERR_INVALID, "model forward: NULL input");
    if (m->mo.act_dtype != DT_F32 && dt_lowp_dtype(m->lp) != m->mo.act_dtype)
        return dt_error(DT_ERR_INVALID, "model forward: built to keep activations in %s, it runs in %s only "
                        "(dt_model_set_precision)", dt_dtype_name(m->mo.act_dtype), dt_dtype_name(m->mo.act_dtype));
    m->epoch = (uint32_t)epoch;
    m->sample0 = (uint64_t)sample_base;
    m->x = x;
    m->x_at = lo;
    m->last_B = B;
    m->last_train = train;
    if (!m->views_only) DT_TRY(dt_lowp_prepare(m->lp, m->ops, m->params, m->res_lo, m->res_hi));
    dt_nn_ctx c = nn_ctx(m, train);
    const float *cur = x;
    double tm = 0.0;   /* --trace: the start of the module running, and its device mark */
    int dm = -1;
    for (int i = lo; i < hi; i++) {
        dt_layer *L = &m->spec.layers[i];
        if (dt_trace_on() && (i == lo || m->mod_first[i] == i)) tm = dt_now(), dm = dt_trace_dev_mark();
        dt_status s = layer_hook(m, i, DT_HOOK_FWD_PRE);
        if (s == DT_OK) s = layer_ctx(m, &c, i);
        if (s == DT_OK) s = dt_layer_forward(&c, L, cur, B);
        if (s == DT_OK && L->out16 && !c.decode) s = keep16(m, L, B);
        if (s == DT_OK) s = layer_hook(m, i, DT_HOOK_FWD_POST);
        if (s != DT_OK) return dt_error_wrap(s, "forward, layer %s '%s': ", L->name, L->text);
        if (tm > 0.0 && (i + 1 == hi || m->mod_first[i + 1] == i + 1)) {
            trace_module(m, m->mod_first[i], "forward", tm, dm);
            tm = 0.0;
        }
        if (m->block_of[i] >= 0) m->arena_owner = m->block_of[i];
        cur = L->out_ptr;
    }
    if (out) *out = cur;
    if (m->nsets && lo <= m->set_lo && hi >= m->set_hi)
    {
        m->set_pass[m->set_cur] = (struct set_pass){.x = x, .x_at = lo, .B = B, .train = train, .valid = 1,
                                                    .epoch = m->epoch, .sample0 = m->sample0};
        for (int i = m->set_lo; i < m->set_hi; i++)   /* a layer's own choice (a fused relu passes x on) */
            m->set_out[(size_t)m->set_cur * (size_t)(m->set_hi - m->set_lo) + (size_t)(i - m->set_lo)] =
                m->spec.layers[i].out_ptr;
    }
    return DT_OK;
}

dt_status dt_model_act_sets(dt_model *m, int lo, int hi, int n) {
    DT_TRY(check_range(m, lo, hi, "activation sets"));
    if (n < 1) return dt_error(DT_ERR_INVALID, "model activation sets: expected at least 1, got %d", n);
    if (m->mo.recompute || m->nsets)
        return dt_error(DT_ERR_UNSUPPORTED, "model activation sets: not with recomputation, and only once");
    dt_layer_mem a = {.ops = m->ops, .in_arena = 1, .measure = 1, .scratch = &m->scr};
    for (int i = lo; i < hi; i++) DT_TRY(dt_layer_alloc_in(&a, &a, &m->spec.layers[i], m->max_batch));
    m->set_pass = calloc((size_t)n, sizeof *m->set_pass);
    m->set_out = calloc((size_t)n * (size_t)(hi - lo), sizeof *m->set_out);
    if (!m->set_pass || !m->set_out) return dt_error(DT_ERR_NOMEM, "model: out of memory");
    DT_TRY(dt_mem_alloc(m->ops, DT_MEM_ACTS, (void **)&m->sets, (a.used ? a.used : 1) * (size_t)n));
    for (int i = lo; i < hi; i++) {   /* the range's own buffers give way to the sets */
        dt_layer *L = &m->spec.layers[i];
        for (int k = 0; k < L->nown; k++) dt_mem_free(m->ops, L->own[k]);
        L->nown = 0;
    }
    m->nsets = n;
    m->set_lo = lo;
    m->set_hi = hi;
    m->set_bytes = a.used;
    m->set_cur = -1;
    return dt_model_act_use(m, 0);
}

/* The layers outside [lo, hi) that own their buffers (no activation sets, no recompute's
 * arena): release gives the buffers back, take allocates them again. */
static int owns_acts(const dt_model *m, int i) {
    return !m->mo.recompute && !(m->nsets && i >= m->set_lo && i < m->set_hi);
}

dt_status dt_model_acts_only(dt_model *m, int lo, int hi) {
    DT_TRY(check_range(m, lo, hi, "activations"));
    if (m->mo.recompute) return DT_OK;   /* the blocks share one arena: nothing to give back by layer */
    for (int i = 0; i < m->spec.n; i++) {
        dt_layer *L = &m->spec.layers[i];
        if ((i >= lo && i < hi) || !owns_acts(m, i) || !L->nown) continue;
        for (int k = 0; k < L->nown; k++) dt_mem_free(m->ops, L->own[k]);
        L->nown = 0;
        L->y = L->out_ptr = NULL;
        L->y16 = NULL;
        m->acts_out = 1;
    }
    return DT_OK;
}

dt_status dt_model_acts_all(dt_model *m) {
    if (!m->acts_out) return DT_OK;
    for (int i = 0; i < m->spec.n; i++) {
        dt_layer *L = &m->spec.layers[i];
        if (!owns_acts(m, i) || L->nown) continue;
        dt_layer_mem own = {.ops = m->ops, .scratch = &m->scr};
        DT_TRY(dt_layer_alloc_in(&own, &own, L, m->max_batch));
    }
    m->acts_out = 0;
    return DT_OK;
}

dt_status dt_model_act_use(dt_model *m, int set) {
    if (set < 0 || set >= m->nsets)
        return dt_error(DT_ERR_INVALID, "model activation sets: set %d outside [0, %d)", set, m->nsets);
    if (set == m->set_cur) return DT_OK;
    dt_layer_mem a = {.ops = m->ops, .arena = m->sets + (size_t)set * m->set_bytes, .in_arena = 1,
                      .scratch = &m->scr};
    for (int i = m->set_lo; i < m->set_hi; i++) DT_TRY(dt_layer_alloc_in(&a, &a, &m->spec.layers[i], m->max_batch));
    m->set_cur = set;
    const struct set_pass *p = &m->set_pass[set];
    if (!p->valid) return DT_OK;
    /* the pass that filled it, as its backward needs it */
    m->x = p->x;
    m->x_at = p->x_at;
    m->last_B = p->B;
    m->last_train = p->train;
    m->epoch = p->epoch;
    m->sample0 = p->sample0;
    for (int i = m->set_lo; i < m->set_hi; i++)
        m->spec.layers[i].out_ptr = m->set_out[(size_t)set * (size_t)(m->set_hi - m->set_lo) + (size_t)(i - m->set_lo)];
    return DT_OK;
}

dt_status dt_model_forward(dt_model *m, const float *x, int B, int train,
                           uint64_t epoch, int64_t sample_base, const float **out) {
    return dt_model_forward_range(m, 0, m->spec.n, x, B, train, epoch, sample_base, out);
}

/* Recompute: run block b's forward again from its input (the output of the layer
 * before it, kept), unless the arena still holds its activations (the last block
 * of a forward). Same inputs, same kernels, dropout keyed by sample: the same bits. */
static dt_status recompute_block(dt_model *m, int b) {
    if (m->arena_owner == b) return DT_OK;
    dt_nn_ctx c = nn_ctx(m, m->last_train);
    c.recompute = 1;
    int start = m->blocks[b][0], end = m->blocks[b][1];
    const float *cur = input_of(m, start);
    for (int i = start; i < end; i++) {
        dt_layer *L = &m->spec.layers[i];
        /* its parameters are needed now, before its backward (sharded: gathered, and the
         * next layer's fetched meanwhile) */
        dt_status s = layer_hook(m, i, DT_HOOK_RECOMPUTE);
        if (s == DT_OK && i + 1 < end) s = layer_hook(m, i + 1, DT_HOOK_PREFETCH);
        if (s == DT_OK) s = layer_ctx(m, &c, i);
        if (s == DT_OK) s = dt_layer_forward(&c, L, cur, m->last_B);
        if (s == DT_OK && i + 1 < end) s = layer_hook(m, i, DT_HOOK_RECOMPUTE_POST);
        if (s != DT_OK) return dt_error_wrap(s, "recomputing forward, layer %s '%s': ", L->name, L->text);
        cur = L->out_ptr;
    }
    m->arena_owner = b;
    return DT_OK;
}

/* ---- losses ---------------------------------------------------------------------- */

/* Cross-entropy over the last layer's (B, classes) or (B, T, classes) scores: a sequence is
 * T rows of classes, each with its label, and the loss is the mean over all B x T
 * positions of the global batch. */
static dt_status ce_head(dt_model *m, const dt_loss *loss, const void *target, int B, float normaliser, int grad) {
    const dt_layer *last = &m->spec.layers[m->spec.n - 1];
    if (last->outs.ndim > 2)
        return dt_error(DT_ERR_INVALID, "cross-entropy needs (B, classes) or (B, T, classes) outputs; add 'flatten'");
    int per = last->outs.ndim == 2 ? (int)last->outs.d[0] : 1;
    int C = (int)last->outs.d[last->outs.ndim - 1];
    if (!(loss->label_smoothing >= 0.0f && loss->label_smoothing <= 1.0f))
        return dt_error(DT_ERR_INVALID, "label smoothing must be in [0, 1], got %g", (double)loss->label_smoothing);
    /* with a gradient, the softmax into its buffer (the head, or over the scores
     * themselves), then the gradient over it in place: no array of probabilities beside
     * the gradient's (B x T x vocabulary floats: gpt2's largest); the loss alone keeps
     * no probabilities (the scores stay for the accuracy) */
    float *d = grad ? out_grad(m) : NULL;
    DT_TRY(m->ops->xent_forward(m->scalar, d, last->out_ptr, target, B * per, C, loss->label_smoothing,
                                normaliser * per));
    if (grad) DT_TRY(m->ops->xent_backward(d, d, target, B * per, C, loss->label_smoothing, normaliser * per));
    return DT_OK;
}

/* Mean squared error against (B, C) targets: a sample's loss is the mean over its C
 * outputs, so the sum is divided by normaliser * C. */
static dt_status mse_head(dt_model *m, const dt_loss *loss, const void *target, int B, float normaliser, int grad) {
    (void)loss;
    const dt_layer *last = &m->spec.layers[m->spec.n - 1];
    int C = (int)last->out_numel;
    size_t n = (size_t)B * (size_t)C;
    DT_TRY(m->ops->mse_forward(m->scalar, last->out_ptr, target, n, normaliser * (float)C));
    if (grad) DT_TRY(m->ops->mse_backward(out_grad(m), last->out_ptr, target, n, normaliser * (float)C));
    return DT_OK;
}

static const struct {
    dt_loss_def def;
    dt_status (*head)(dt_model *m, const dt_loss *loss, const void *target, int B, float normaliser, int grad);
} losses[DT_LOSS_COUNT] = {
    [DT_LOSS_CE] = {{.name = "ce", .smoothing = 1, .windows = 1}, ce_head},
    [DT_LOSS_MSE] = {{.name = "mse", .one_hot = 1}, mse_head},
};

const dt_loss_def *dt_loss_def_of(dt_loss_kind kind) {
    return (unsigned)kind < DT_LOSS_COUNT ? &losses[kind].def : NULL;
}

const char *dt_loss_name(dt_loss_kind kind) {
    return (unsigned)kind < DT_LOSS_COUNT ? losses[kind].def.name : "?";
}

dt_status dt_loss_parse(const char *name, dt_loss_kind *kind) {
    char list[64] = "";
    for (int k = 0; k < DT_LOSS_COUNT; k++) {
        if (name && strcmp(name, losses[k].def.name) == 0) { *kind = (dt_loss_kind)k; return DT_OK; }
        size_t l = strlen(list);
        snprintf(list + l, sizeof list - l, "%s%s", k == 0 ? "" : k + 1 < DT_LOSS_COUNT ? ", " : " or ",
                 losses[k].def.name);
    }
    return dt_error(DT_ERR_INVALID, "loss: expected %s, got '%s'", list, name ? name : "(null)");
}

/* Loss of the last forward into m->scalar[0] and, when grad, dloss into out_grad(m). */
static dt_status loss_head(dt_model *m, const dt_loss *loss, const void *target, int B,
                           float normaliser, int grad) {
    if (!m->x || B != m->last_B)
        return dt_error(DT_ERR_INVALID, "model loss: batch %d does not match the last forward (%d)", B, m->last_B);
    if (!target) return dt_error(DT_ERR_INVALID, "model loss: NULL target");
    if (!(normaliser > 0.0f)) return dt_error(DT_ERR_INVALID, "model loss: normaliser must be positive");
    if ((unsigned)loss->kind >= DT_LOSS_COUNT)
        return dt_error(DT_ERR_INVALID, "model loss: unknown loss kind %d", (int)loss->kind);
    DT_TRY(losses[loss->kind].head(m, loss, target, B, normaliser, grad));
    /* fp16 loss scaling: backward starts from the gradient of loss x scale (exact for
     * the powers of two a scaler uses) */
    const dt_layer *last = &m->spec.layers[m->spec.n - 1];
    if (grad && m->loss_scale != 1.0f) DT_TRY(m->ops->scale(out_grad(m), m->loss_scale, (size_t)B * (size_t)last->out_numel));
    return DT_OK;
}

dt_status dt_model_correct(dt_model *m, const int32_t *labels, int B, int64_t *correct) {
    if (!m->x || B != m->last_B)
        return dt_error(DT_ERR_INVALID, "model accuracy: batch %d does not match the last forward (%d)", B, m->last_B);
    if (!labels) return dt_error(DT_ERR_INVALID, "model accuracy: NULL labels");
    const dt_layer *last = &m->spec.layers[m->spec.n - 1];
    int32_t cnt = 0;
    int per = last->outs.ndim == 2 ? (int)last->outs.d[0] : 1;   /* positions of a sequence, a label each */
    DT_TRY(m->ops->count_correct((int32_t *)(m->scalar + 1), last->out_ptr, labels, B * per,
                                 (int)last->outs.d[last->outs.ndim - 1]));
    DT_TRY(m->ops->copy_d2h(&cnt, m->scalar + 1, sizeof cnt));
    *correct = cnt;
    return DT_OK;
}

dt_status dt_model_loss(dt_model *m, const dt_loss *loss, const void *target, int B,
                        float normaliser, float *loss_out, int64_t *correct) {
    DT_TRY(loss_head(m, loss, target, B, normaliser, 0));
    if (loss_out) DT_TRY(m->ops->copy_d2h(loss_out, m->scalar, sizeof(float)));
    if (correct) {
        if (dt_loss_def_of(loss->kind)->one_hot)
            return dt_error(DT_ERR_INVALID, "model: accuracy needs class labels, not loss %s's targets",
                            dt_loss_name(loss->kind));
        DT_TRY(dt_model_correct(m, target, B, correct));
    }
    return DT_OK;
}

const float *dt_model_loss_dev(const dt_model *m) { return m->scalar; }

dt_status dt_model_backward_range(dt_model *m, int lo, int hi, const float *dy, float *dx_out) {
    DT_TRY(check_range(m, lo, hi, "backward"));
    if (!m->x || lo < m->x_at)
        return dt_error(DT_ERR_INVALID, "model backward: layers [%d, %d) were not all run by the last forward (from "
                        "layer %d)", lo, hi, m->x_at);
    if (!dy) return dt_error(DT_ERR_INVALID, "model backward: NULL output gradient");
    const int B = m->last_B;
    dt_nn_ctx c = nn_ctx(m, m->last_train);
    int which = 0;
    float *dx = NULL;
    double tm = 0.0;   /* --trace: the start of the module running, and its device mark */
    int dm = -1;
    for (int i = hi - 1; i >= lo; i--) {
        dt_layer *L = &m->spec.layers[i];
        const float *x = input_of(m, i);
        const uint16_t *x16 = NULL;
        if (i > m->x_at && m->spec.layers[i - 1].out16) {   /* kept in 16 bits: read so, or widened for this layer */
            x = m->spec.layers[i - 1].y;
            if (dt_ops_gemm_lp_reads16(m->ops, (int)m->mo.act_dtype)) x16 = m->spec.layers[i - 1].y16;
            else DT_TRY(widen16(m, &m->spec.layers[i - 1], B));
        }
        if (dt_trace_on() && (i == hi - 1 || m->mod_first[i + 1] == i + 1)) tm = dt_now(), dm = dt_trace_dev_mark();
        if (L->def->flags & DT_LDEF_GRAD_IN_PLACE) dx = (float *)dy;   /* same memory */
        else if (i == lo) dx = dx_out;                                  /* the range's input: the caller's, or none */
        else { dx = m->dbuf[which]; which ^= 1; }
        dt_status s = layer_hook(m, i, DT_HOOK_BWD_PRE);
        if (s == DT_OK) s = layer_ctx(m, &c, i);
        c.grads = m->gcur = layer_grads(m, i);
        c.in16_of = x, c.in16 = x16;
        if (s == DT_OK) s = dt_layer_backward(&c, L, x, dy, dx, B);
        if (s != DT_OK) return dt_error_wrap(s, "backward, layer %s '%s': ", L->name, L->text);
        if (L->nparams && m->grad_ready) {
            s = m->grad_ready(m->grad_ready_ctx, L->first_param, L->nparams);
            if (s != DT_OK) return dt_error_wrap(s, "gradient hook after layer %s: ", L->name);
        }
        if ((s = layer_hook(m, i, DT_HOOK_BWD_POST)) != DT_OK)
            return dt_error_wrap(s, "backward, layer %s '%s': ", L->name, L->text);
        /* a block's closing row is done (its state, dskip, lies outside its layers' part
         * of the arena): bring the block's activations back before its layers' backward.
         * After the row's POST hook, so sharding has dropped the unit that row shares
         * with the next block before this block's units are gathered again */
        int b = m->block_of[i];
        if (b >= 0 && i == m->blocks[b][1]) DT_TRY(recompute_block(m, b));
        if (tm > 0.0 && (i == lo || m->mod_first[i] == i)) {
            trace_module(m, m->mod_first[i], "backward", tm, dm);
            tm = 0.0;
        }
        dy = dx;
    }
    m->gcur = NULL;
    /* the first layer computed its input's gradient in place: hand it over */
    if (dx_out && dx != dx_out) {
        const dt_layer *L = &m->spec.layers[lo];
        DT_TRY(m->ops->copy_d2d(dx_out, dx, (size_t)B * (size_t)L->in_numel * sizeof(float)));
    }
    return DT_OK;
}

dt_status dt_model_loss_backward_to(dt_model *m, const dt_loss *loss, const void *target, int B, float normaliser,
                                    float *loss_out, float *dx) {
    DT_TRY(loss_head(m, loss, target, B, normaliser, 1));
    if (loss_out) DT_TRY(m->ops->copy_d2h(loss_out, m->scalar, sizeof(float)));
    return dt_model_backward_range(m, m->x_at, m->spec.n, out_grad(m), dx);
}

dt_status dt_model_loss_backward(dt_model *m, const dt_loss *loss, const void *target,
                                 int B, float normaliser, float *loss_out) {
    return dt_model_loss_backward_to(m, loss, target, B, normaliser, loss_out, NULL);
}

size_t dt_model_summary(const dt_model *m, char *buf, size_t n) {
    return dt_spec_summary(&m->spec, &m->input, buf, n);
}
