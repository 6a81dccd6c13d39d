/*
 * model.c: a built model: flat parameter / gradient / buffer arrays, the
 * PyTorch-named registry over them, and forward / loss / backward of the layer
 * list (spec.c parses the list and infers shapes).
 *
 * Memory (all from the dt_ops table):
 *   params, grads  (nparams)          PyTorch parameter order, one flat array each
 *   buffers        (nbuffers)         batchnorm running_mean / running_var
 *   per layer      (max_batch, outs)  output activations, saved state
 *   dbuf[2]        (max_batch, max activation)  ping-pong gradient buffers for backward
 *   head, probs    (max_batch, outputs)         dloss, softmax probabilities
 */
#include "model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    float        *params, *grads, *buffers;
    float        *dbuf[2];     /* (max_batch, max activation) */
    float        *head;        /* (max_batch, outputs): dloss / doutputs */
    float        *probs;       /* (max_batch, outputs): softmax of the outputs */
    float        *scalar;      /* (2): loss, correct (device) */
    const float  *x;           /* input of the last forward */
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
    int              decode_pos;   /* < 0: ordinary passes */
};

static dt_nn_ctx nn_ctx(dt_model *m, int train) {
    dt_nn_ctx c = {
        .ops = m->ops, .params = m->params, .grads = m->grads, .buffers = m->buffers,
        .train = train, .seed = m->seed, .epoch = m->epoch, .sample0 = m->sample0,
        .bn_sync = m->bn_sync, .bn_sync_ctx = m->bn_sync_ctx, .bn_record = m->bn_record,
        .decode = m->decode_pos >= 0, .decode_pos = m->decode_pos,
    };
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
    for (int i = 0; i < m->spec.n; i++) dt_layer_free(o, &m->spec.layers[i]);
    o->free(m->params);
    o->free(m->grads);
    o->free(m->buffers);
    o->free(m->dbuf[0]);
    o->free(m->dbuf[1]);
    o->free(m->head);
    o->free(m->probs);
    o->free(m->scalar);
    dt_spec_free(&m->spec);
    free(m->state);
    free(m->param_state);
    free(m);
}

dt_status dt_model_build(const char *spec, const dt_shape *input, const dt_ops *ops,
                         uint64_t seed, int max_batch, dt_model **out) {
    *out = NULL;
    if (!ops) return dt_error(DT_ERR_INVALID, "model: no compute backend");
    if (max_batch <= 0) return dt_error(DT_ERR_INVALID, "model: max batch must be positive, got %d", max_batch);
    dt_model *m = calloc(1, sizeof *m);
    if (!m) return dt_error(DT_ERR_NOMEM, "model: out of memory");
    m->ops = ops;
    m->seed = seed;
    m->decode_pos = -1;
    m->max_batch = max_batch;
    m->input = *input;
    dt_status s = dt_spec_parse(spec, &m->spec);
    if (s != DT_OK) { free(m); return s; }
    s = dt_spec_infer(&m->spec, input);
    if (s != DT_OK) goto fail;
    if ((s = build_registry(m)) != DT_OK) goto fail;
    m->nparams = (size_t)m->spec.nparams;
    m->nbuffers = m->spec.nbuffers;
    int64_t maxact = dt_shape_numel(input);
    for (int i = 0; i < m->spec.n; i++)
        if (m->spec.layers[i].out_numel > maxact) maxact = m->spec.layers[i].out_numel;
    const dt_layer *last = &m->spec.layers[m->spec.n - 1];
    if ((uint64_t)max_batch * (uint64_t)maxact > (UINT64_C(1) << 58)) {
        s = dt_error(DT_ERR_INVALID, "model: %d samples of %lld activations each are more than a device can hold",
                     max_batch, (long long)maxact);
        goto fail;
    }
    size_t actb = (size_t)max_batch * (size_t)maxact * sizeof(float);
    if ((s = ops->alloc((void **)&m->params, m->nparams * sizeof(float))) != DT_OK ||
        (s = ops->alloc((void **)&m->grads, m->nparams * sizeof(float))) != DT_OK ||
        (s = ops->alloc((void **)&m->buffers, m->nbuffers * sizeof(float))) != DT_OK ||
        (s = ops->alloc((void **)&m->dbuf[0], actb)) != DT_OK ||
        (s = ops->alloc((void **)&m->dbuf[1], actb)) != DT_OK ||
        (s = ops->alloc((void **)&m->head, (size_t)max_batch * (size_t)last->out_numel * sizeof(float))) != DT_OK ||
        (s = ops->alloc((void **)&m->probs, (size_t)max_batch * (size_t)last->out_numel * sizeof(float))) != DT_OK ||
        (s = ops->alloc((void **)&m->scalar, 2 * sizeof(float))) != DT_OK)
        goto fail;
    if (m->nparams && (s = ops->zero(m->grads, m->nparams * sizeof(float))) != DT_OK) goto fail;
    for (int i = 0; i + 1 < m->spec.n; i++) {
        dt_layer *L = &m->spec.layers[i], *N = &m->spec.layers[i + 1];
        if ((L->def->flags & DT_LDEF_FUSE_RELU) && N->kind == DT_LAYER_RELU) L->fuse_relu = N->relu_fused = 1;
    }
    dt_nn_ctx c = nn_ctx(m, 0);
    for (int i = 0; i < m->spec.n; i++) {
        dt_layer *L = &m->spec.layers[i];
        if ((s = dt_layer_alloc(ops, L, max_batch)) != DT_OK) goto fail;
        if ((s = dt_layer_init(&c, L)) != DT_OK) goto fail;
    }
    *out = m;
    return DT_OK;
fail:
    dt_model_free(m);
    return s;
}

int             dt_model_nlayers(const dt_model *m) { return m->spec.n; }
const dt_layer *dt_model_layer(const dt_model *m, int i) { return (i >= 0 && i < m->spec.n) ? &m->spec.layers[i] : NULL; }
const dt_shape *dt_model_output_shape(const dt_model *m) { return &m->spec.layers[m->spec.n - 1].outs; }
int             dt_model_max_batch(const dt_model *m) { return m->max_batch; }
const dt_ops   *dt_model_ops(const dt_model *m) { return m->ops; }
size_t          dt_model_nparams(const dt_model *m) { return m->nparams; }
float          *dt_model_params(dt_model *m) { return m->params; }
float          *dt_model_grads(dt_model *m) { return m->grads; }
size_t          dt_model_nbuffers(const dt_model *m) { return m->nbuffers; }
float          *dt_model_buffers(dt_model *m) { return m->buffers; }
int             dt_model_nparam_tensors(const dt_model *m) { return m->spec.ntensors; }
int             dt_model_nstate(const dt_model *m) { return m->nstate; }

void dt_model_set_decode(dt_model *m, int pos) { m->decode_pos = pos < 0 ? -1 : pos; }

void dt_model_set_bn_sync(dt_model *m, dt_bn_sync_fn fn, void *ctx) { m->bn_sync = fn; m->bn_sync_ctx = ctx; }
void dt_model_set_grad_ready(dt_model *m, dt_grad_ready_fn fn, void *ctx) { m->grad_ready = fn; m->grad_ready_ctx = ctx; }

size_t dt_model_bn_record_size(const dt_model *m) { return m->spec.nrecord; }
void   dt_model_set_bn_record(dt_model *m, float *record) { m->bn_record = record; }

dt_status dt_model_bn_replay(dt_model *m, const float *record) {
    if (!record) return dt_error(DT_ERR_INVALID, "model: NULL batchnorm record");
    dt_nn_ctx c = nn_ctx(m, 1);
    for (int i = 0; i < m->spec.n; i++) DT_TRY(dt_layer_bn_replay(&c, &m->spec.layers[i], record));
    return DT_OK;
}

dt_status dt_model_state(dt_model *m, int i, dt_tensor_info *info) {
    if (i < 0 || i >= m->nstate)
        return dt_error(DT_ERR_INVALID, "model: state tensor %d out of range [0, %d)", i, m->nstate);
    const state_entry *e = &m->state[i];
    const dt_layer_tensor *T = &m->spec.layers[e->layer].t[e->t];
    memset(info, 0, sizeof *info);
    info->name = e->name;
    info->is_param = T->role == DT_TENSOR_PARAM;
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

dt_status dt_model_forward(dt_model *m, const float *x, int B, int train,
                           uint64_t epoch, int64_t sample_base, const float **out) {
    if (B <= 0 || B > m->max_batch)
        return dt_error(DT_ERR_INVALID, "model forward: batch %d outside [1, %d]", B, m->max_batch);
    if (!x) return dt_error(DT_ERR_INVALID, "model forward: NULL input");
    m->epoch = (uint32_t)epoch;
    m->sample0 = (uint64_t)sample_base;
    m->x = x;
    m->last_B = B;
    m->last_train = train;
    dt_nn_ctx c = nn_ctx(m, train);
    const float *cur = x;
    for (int i = 0; i < m->spec.n; i++) {
        dt_layer *L = &m->spec.layers[i];
        dt_status s = dt_layer_forward(&c, L, cur, B);
        if (s != DT_OK) return dt_error_wrap(s, "forward, layer %s '%s': ", L->name, L->text);
        cur = L->out_ptr;
    }
    if (out) *out = cur;
    return DT_OK;
}

/* ---- losses ---------------------------------------------------------------------- */

static const char *const loss_names[DT_LOSS_COUNT] = { [DT_LOSS_CE] = "ce", [DT_LOSS_MSE] = "mse" };

const char *dt_loss_name(dt_loss_kind kind) {
    return (unsigned)kind < DT_LOSS_COUNT ? loss_names[kind] : "?";
}

dt_status dt_loss_parse(const char *name, dt_loss_kind *kind) {
    char list[64] = "";
    for (int k = 0; k < DT_LOSS_COUNT; k++) {
        if (name && strcmp(name, loss_names[k]) == 0) { *kind = (dt_loss_kind)k; return DT_OK; }
        size_t l = strlen(list);
        snprintf(list + l, sizeof list - l, "%s%s", k == 0 ? "" : k + 1 < DT_LOSS_COUNT ? ", " : " or ", loss_names[k]);
    }
    return dt_error(DT_ERR_INVALID, "loss: expected %s, got '%s'", list, name ? name : "(null)");
}

/* Loss of the last forward into m->scalar[0] and, when grad, dloss into m->head. */
static dt_status loss_head(dt_model *m, const dt_loss *loss, const void *target, int B,
                           float normaliser, int grad) {
    if (!m->x || B != m->last_B)
        return dt_error(DT_ERR_INVALID, "model loss: batch %d does not match the last forward (%d)", B, m->last_B);
    if (!target) return dt_error(DT_ERR_INVALID, "model loss: NULL target");
    if (!(normaliser > 0.0f)) return dt_error(DT_ERR_INVALID, "model loss: normaliser must be positive");
    const dt_ops *o = m->ops;
    const dt_layer *last = &m->spec.layers[m->spec.n - 1];
    const float *y = last->out_ptr;
    int C = (int)last->out_numel;
    if (loss->kind == DT_LOSS_CE) {
        if (last->outs.ndim > 2)
            return dt_error(DT_ERR_INVALID, "cross-entropy needs (B, classes) or (B, T, classes) outputs; add 'flatten'");
        /* a sequence is T rows of classes, each with its label: the loss is the mean over
         * all B x T positions of the global batch */
        int per = last->outs.ndim == 2 ? (int)last->outs.d[0] : 1;
        C = (int)last->outs.d[last->outs.ndim - 1];
        if (!(loss->label_smoothing >= 0.0f && loss->label_smoothing <= 1.0f))
            return dt_error(DT_ERR_INVALID, "label smoothing must be in [0, 1], got %g", (double)loss->label_smoothing);
        DT_TRY(o->xent_forward(m->scalar, m->probs, y, target, B * per, C, loss->label_smoothing, normaliser * per));
        if (grad)
            DT_TRY(o->xent_backward(m->head, m->probs, target, B * per, C, loss->label_smoothing, normaliser * per));
    } else if (loss->kind == DT_LOSS_MSE) {
        /* per-sample loss is the mean over the C outputs: divide by normaliser * C */
        size_t n = (size_t)B * (size_t)C;
        DT_TRY(o->mse_forward(m->scalar, y, target, n, normaliser * (float)C));
        if (grad) DT_TRY(o->mse_backward(m->head, y, target, n, normaliser * (float)C));
    } else {
        return dt_error(DT_ERR_INVALID, "model loss: unknown loss kind %d", (int)loss->kind);
    }
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
        if (loss->kind != DT_LOSS_CE) return dt_error(DT_ERR_INVALID, "model: accuracy needs cross-entropy labels");
        DT_TRY(dt_model_correct(m, target, B, correct));
    }
    return DT_OK;
}

const float *dt_model_loss_dev(const dt_model *m) { return m->scalar; }

dt_status dt_model_loss_backward(dt_model *m, const dt_loss *loss, const void *target,
                                 int B, float normaliser, float *loss_out) {
    DT_TRY(loss_head(m, loss, target, B, normaliser, 1));
    if (loss_out) DT_TRY(m->ops->copy_d2h(loss_out, m->scalar, sizeof(float)));
    dt_nn_ctx c = nn_ctx(m, m->last_train);
    const float *dy = m->head;
    int which = 0;
    for (int i = m->spec.n - 1; i >= 0; i--) {
        dt_layer *L = &m->spec.layers[i];
        const float *x = i ? m->spec.layers[i - 1].out_ptr : m->x;
        float *dx;
        if (L->def->flags & DT_LDEF_GRAD_IN_PLACE) dx = (float *)dy; /* same memory */
        else if (i == 0) dx = NULL;                                  /* no gradient for the data */
        else { dx = m->dbuf[which]; which ^= 1; }
        dt_status s = dt_layer_backward(&c, L, x, dy, dx, B);
        if (s != DT_OK) return dt_error_wrap(s, "backward, layer %s '%s': ", L->name, L->text);
        if (L->nparams && m->grad_ready) {
            s = m->grad_ready(m->grad_ready_ctx, L->first_param, L->nparams);
            if (s != DT_OK) return dt_error_wrap(s, "gradient hook after layer %s: ", L->name);
        }
        dy = dx;
    }
    return DT_OK;
}

size_t dt_model_summary(const dt_model *m, char *buf, size_t n) {
    return dt_spec_summary(&m->spec, &m->input, buf, n);
}
