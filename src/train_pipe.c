/*
 * train_pipe.c: the trainer's pipeline (--pipeline P; the schedules are pipeline.h's).
 *
 * The world is dp replicas x P stages: rank r is stage r % P of replica r / P, so the
 * ranks of one pipeline are consecutive (on one host first, where its boundary tensors
 * cross shared memory). The stages of a replica take its k = S/dp micro-batches through
 * the model's top-level modules cut into P runs; the replicas of a stage sum their
 * gradients over dp_comm as data parallelism does.
 *
 * Bits (docs/DESIGN.md rule 2): a stage runs its backwards in micro-batch order 0 .. k - 1
 * and DDP sums them in the fixed tree, so its gradients are one process's. Two places
 * need more than that:
 *   - a tied head (gpt's unembed) writes its part of the embedding's gradient on the
 *     last stage, and one process's embedding backward adds its own part to it, micro-batch
 *     by micro-batch. So the head's part rides back with the boundary gradient of every
 *     micro-batch, stage by stage, to the stage that owns the embedding, which lays it in
 *     its gradient array before that micro-batch's backward, as one process would. After
 *     the step the owner sends the updated weight to the stage that reads it.
 *   - the global gradient norm is one process's pairwise sum of fixed 4096-float chunk
 *     sums. A rank computes the chunks wholly in its part (its stage's range, or its shard
 *     of it with --shard grads); a chunk that a stage or shard edge cuts is put together
 *     from its parts (a sum with zeros everywhere else: exact) and summed whole.
 *
 * Memory: the model is built with the stage's parameter range kept (model.h, the
 * layout's kept range): a rank holds its stage's parameters, gradients and optimizer
 * state, the tied head's weight and gradient where it reads or relays them, and only its
 * stage's layers' activations. A stage keeps the inputs and the activations of the
 * micro-batches in flight (the model's activation sets: up to P - s on stage s with
 * 1f1b, all k with gpipe). With --recompute it keeps the inputs only, and before a
 * backward runs the forward of that micro-batch again unless the model still holds its
 * activations (GPipe's re-materialisation): the same kernels on the same input, the same
 * bits. Checkpoints are written stage by stage (as a sharded run's are: they resume on
 * any layout); an evaluation gathers every stage's parameters (and gives them back), and
 * so does the end of the run, for the model handed back.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "mem.h"
#include "pipeline.h"
#include "train_impl.h"

enum { TAG_ACT = 0x5050, TAG_GRAD, TAG_TIED, TAG_PARAM };

struct train_pipe {
    dt_comm *pp_comm;          /* this replica's stages, pp_comm rank = stage */
    dt_pp_cut cut;             /* the stages (pipeline.h); the three below are its arrays */
    int *mod_lo;               /* stage s: top-level modules [mod_lo[s], mod_lo[s + 1]) */
    int *layer_lo;             /* stage s: layers [layer_lo[s], layer_lo[s + 1]) */
    size_t *plo;               /* stage s: parameters [plo[s], plo[s + 1]) */
    dt_pp_list list;
    int nslots;                /* stage inputs held at once */
    int nsets;                 /* > 1: the model keeps this many micro-batches' activations
                                * (dt_model_act_sets), else a backward runs its forward again */
    float **in;                /* nslots inputs (B x in_n), not on the first stage */
    float *gin, *gout;         /* the gradient of our output (not on the last), of our input (not on the first) */
    size_t in_n, out_n;        /* floats per sample of the stage's input and output */
    const float *out;          /* the output of the last forward */
    int cur;                   /* the micro-batch whose activations the model holds, -1: none */
    dt_pp_rider *ride;         /* the tied tensors a stage reads but another owns */
    int nride;
    float *host;               /* staging for device memory the transport cannot take; host_n floats */
    size_t host_n;
    /* the norm */
    size_t nch;                /* chunks of the parameter array */
    double *parts, *dparts;    /* every chunk's sum (host), device scratch */
    int nbc;                   /* chunks a stage or shard edge cuts */
    size_t *bch;
    float *bbuf, *dbbuf;       /* their values, nbc x DT_SUM_CHUNK: host, device */
    float *losses;             /* world x k: every rank's local losses */
    float *bnall;              /* world x k batchnorm records (host), then one put together */
    /* what this rank holds of the arrays: its stage's kept range [keep_lo, keep_hi) (the
     * model was built so), the tied tensors it reads or relays (counted here: held), and
     * between dt_train_pipe_gather_ and dt_train_pipe_drop_ every other stage's
     * parameters (counted: whole) */
    size_t keep_lo, keep_hi, held_params, held_grads, whole;   /* whole: the bytes counted for the others' */
    char *text;                /* the layout (and the lists) for the start */
};

typedef struct train_pipe train_pipe;

/* ---- the world ------------------------------------------------------------------------ */

/* The world holds whole pipelines. */
static dt_status check_world(int world, int P) {
    if (world % P != 0)
        return dt_error(DT_ERR_INVALID, "pipeline: %d process%s cannot hold whole pipelines of %d stages (the world "
                        "size must be a multiple of --pipeline)", world, world == 1 ? "" : "es", P);
    return DT_OK;
}

dt_status dt_train_pipe_layout_(trainer *t) {
    t->pp = t->o->pipeline > 1 ? t->o->pipeline : 1;
    t->dp = t->world / t->pp;
    t->dpr = t->rank / t->pp;
    t->stage = t->rank % t->pp;
    t->dp_comm = t->comm;
    return check_world(t->world, t->pp);
}

dt_status dt_train_pipe_check(const dt_train_opts *o, int world, int64_t S) {
    const int P = o->pipeline > 1 ? o->pipeline : 1;
    if (P == 1) return DT_OK;
    DT_TRY(check_world(world, P));
    dt_shard_mode mode;
    DT_TRY(dt_shard_parse(o->shard, &mode));
    if (mode == DT_SHARD_PARAMS)
        return dt_error(DT_ERR_UNSUPPORTED, "pipeline: --shard params with --pipeline is not supported yet (none, "
                        "optim and grads are: over each stage's replicas)");
    if (o->sync_bn) return dt_error(DT_ERR_UNSUPPORTED, "pipeline: --sync-bn with --pipeline is not supported yet");
    const dt_pp_schedule *sch = dt_pp_find(o->pipeline_schedule);
    if (!sch) {
        char names[64];
        return dt_error(DT_ERR_INVALID, "pipeline_schedule: expected %s, got '%s'", dt_pp_names(names, sizeof names),
                        o->pipeline_schedule ? o->pipeline_schedule : "(null)");
    }
    if (dt_pp_chunked(sch))
        return dt_error(DT_ERR_UNSUPPORTED, "pipeline: the %s schedule is not run by the trainer yet (a stage would "
                        "hold several runs of the model's modules, and its parameters one run each); gpipe and 1f1b "
                        "are", dt_pp_name(sch));
    int dp = world / P;
    int64_t k, b;
    DT_TRY(dt_train_split(o->batch, S, dp, &k, &b));
    if (k < P)
        return dt_error(DT_ERR_INVALID, "pipeline: %lld micro-batches per replica cannot fill %d stages (--micro-batches "
                        "%lld over %d replica%s); give at least %lld", (long long)k, P, (long long)S, dp,
                        dp == 1 ? "" : "s", (long long)P * dp);
    return DT_OK;
}

dt_status dt_train_pipe_world_(trainer *t) {
    if (t->pp == 1) return DT_OK;
    DT_TRY(dt_train_pipe_check(t->o, t->world, t->S));
    t->pipe = calloc(1, sizeof *t->pipe);
    if (!t->pipe) return dt_error(DT_ERR_NOMEM, "pipeline: out of memory");
    t->pipe->cur = -1;
    DT_TRY(dt_comm_split(t->comm, t->stage, t->dpr, &t->dp_comm));
    return dt_comm_split(t->comm, t->dpr, t->stage, &t->pipe->pp_comm);
}

/* ---- the cut -------------------------------------------------------------------------- */

/* The tied tensors beyond the kept range: the user holds their parameters and
 * gradient, a stage between it and the owner their gradient (it relays it). The
 * parameters come from the owner after the start (dt_train_pipe_after_step_). */
static dt_status hold_riders(trainer *t) {
    train_pipe *p = t->pipe;
    dt_train_pipe_keep_(t, &p->keep_lo, &p->keep_hi);
    for (int r = 0; r < p->nride; r++) {
        const dt_pp_rider *R = &p->ride[r];
        size_t bytes = R->len * sizeof(float);
        if (t->stage == R->user) {
            DT_TRY(t->ops->populate(dt_model_params(t->model) + R->off, bytes));
            dt_mem_add(DT_MEM_PARAMS, bytes);
            p->held_params += bytes;
        }
        if (R->owner < t->stage && t->stage <= R->user) {
            DT_TRY(t->ops->populate(dt_model_grads(t->model) + R->off, bytes));
            dt_mem_add(DT_MEM_GRADS, bytes);
            p->held_grads += bytes;
        }
    }
    return DT_OK;
}

/* The parameters outside the kept range and the riders: [0, keep_lo) and [keep_hi, n). */
static size_t outside_bytes(const trainer *t) {
    const train_pipe *p = t->pipe;
    size_t n = dt_model_nparams(t->model);
    return (p->keep_lo + (n > p->keep_hi ? n - p->keep_hi : 0)) * sizeof(float) - p->held_params;
}

/* Give back params [a, b) but the tied tensors this stage reads (their values stay). */
static dt_status discard_but_riders(trainer *t, float *params, size_t a, size_t b) {
    train_pipe *p = t->pipe;
    while (a < b) {
        size_t next = b, skip = b;   /* the first rider this stage reads that ends after a */
        for (int r = 0; r < p->nride; r++) {
            const dt_pp_rider *R = &p->ride[r];
            if (R->user != t->stage || R->off + R->len <= a || R->off >= b) continue;
            if (R->off < next || (R->off == next && R->off + R->len > skip)) next = R->off, skip = R->off + R->len;
        }
        if (next > a) DT_TRY(t->ops->discard(params + a, (next - a) * sizeof(float)));
        a = skip > next ? skip : next;
    }
    return DT_OK;
}

dt_status dt_train_pipe_drop_(trainer *t) {
    train_pipe *p = t->pipe;
    size_t n = dt_model_nparams(t->model);
    float *params = dt_model_params(t->model);
    DT_TRY(discard_but_riders(t, params, 0, p->keep_lo));
    if (n > p->keep_hi) DT_TRY(discard_but_riders(t, params, p->keep_hi, n));
    dt_mem_sub(DT_MEM_PARAMS, p->whole);
    p->whole = 0;
    dt_model_set_resident(t->model, p->keep_lo, p->keep_hi);
    DT_TRY(dt_model_precision_keep(t->model, p->keep_lo, p->keep_hi));   /* a tied weight's is rounded again */
    return dt_model_acts_only(t->model, p->layer_lo[t->stage], p->layer_lo[t->stage + 1]);
}

/* The part of the summed gradient rank (stage, replica) answers for in the norm. */
static void norm_part(const trainer *t, int stage, int replica, size_t *a, size_t *b) {
    dt_pp_norm_part(&t->pipe->cut, stage, replica, t->dp, !dt_shard_ddp_reduces(t->shard), a, b);
}

/* The chunks of the norm that the parts' edges cut (after dt_shard_init_range). */
dt_status dt_train_pipe_norm_setup_(trainer *t) {
    train_pipe *p = t->pipe;
    const size_t C = DT_SUM_CHUNK, n = dt_model_nparams(t->model);
    p->nch = (n + C - 1) / C;
    p->bch = calloc((size_t)t->world, sizeof *p->bch);
    p->parts = calloc(p->nch ? p->nch : 1, sizeof *p->parts);
    if (!p->bch || !p->parts) return dt_error(DT_ERR_NOMEM, "pipeline: out of memory");
    p->nbc = dt_pp_norm_edges(&p->cut, t->dp, !dt_shard_ddp_reduces(t->shard), C, p->bch);
    DT_TRY(t->ops->alloc((void **)&p->dparts, (p->nch ? p->nch : 1) * sizeof(double)));
    if (p->nbc) {
        p->bbuf = malloc((size_t)p->nbc * C * sizeof(float));
        if (!p->bbuf) return dt_error(DT_ERR_NOMEM, "pipeline: out of memory");
        DT_TRY(dt_mem_alloc(t->ops, DT_MEM_OTHER, (void **)&p->dbbuf, (size_t)p->nbc * C * sizeof(float)));
    }
    return DT_OK;
}

/* Neighbouring stages agree on the tensors between them (a rank that built another
 * model would otherwise wait for a message of another size): each stage's cut, its input
 * and output per sample, and the model's size, gathered over the pipeline. */
static dt_status agree(trainer *t) {
    train_pipe *p = t->pipe;
    enum { LO, HI, IN, OUT, NL, NP, NV };
    int64_t mine[NV] = {p->layer_lo[t->stage], p->layer_lo[t->stage + 1], (int64_t)p->in_n, (int64_t)p->out_n,
                        dt_model_nlayers(t->model), (int64_t)dt_model_nparams(t->model)};
    int64_t *all = calloc((size_t)t->pp * NV, sizeof *all);
    if (!all) return dt_error(DT_ERR_NOMEM, "pipeline: out of memory");
    dt_status s = dt_allgather(p->pp_comm, mine, all, NV, DT_I64);
    for (int st = 0; s == DT_OK && st + 1 < t->pp; st++) {
        const int64_t *a = all + st * NV, *b = all + (st + 1) * NV;
        int r = t->dpr * t->pp + st;
        if (a[NL] != b[NL] || a[NP] != b[NP])
            s = dt_error(DT_ERR_MISMATCH, "pipeline: stage %d (rank %d) built a model of %lld layers and %lld parameters, "
                         "stage %d (rank %d) one of %lld and %lld; every rank must build the same model", st, r,
                         (long long)a[NL], (long long)a[NP], st + 1, r + 1, (long long)b[NL], (long long)b[NP]);
        else if (a[HI] != b[LO])
            s = dt_error(DT_ERR_MISMATCH, "pipeline: stage %d (rank %d) ends before layer %lld, stage %d (rank %d) starts "
                         "at layer %lld", st, r, (long long)a[HI], st + 1, r + 1, (long long)b[LO]);
        else if (a[OUT] != b[IN])
            s = dt_error(DT_ERR_MISMATCH, "pipeline: stage %d (rank %d) sends %lld floats per sample, stage %d (rank %d) "
                         "expects %lld", st, r, (long long)a[OUT], st + 1, r + 1, (long long)b[IN]);
    }
    free(all);
    return s;
}

static void put_text(train_pipe *p, size_t *len, size_t *cap, const char *s) {
    size_t k = strlen(s);
    if (*len + k + 1 > *cap) {
        size_t c = (*len + k + 1) * 2;
        char *x = realloc(p->text, c);
        if (!x) return;
        p->text = x;
        *cap = c;
    }
    memcpy(p->text + *len, s, k + 1);
    *len += k;
}

dt_status dt_train_pipe_cut_(trainer *t, const dt_spec *sp) {
    train_pipe *p = t->pipe;
    DT_TRY(dt_pp_cut_spec(sp, t->pp, t->o->stages, &p->cut));
    p->mod_lo = p->cut.mod_lo;
    p->layer_lo = p->cut.layer_lo;
    p->plo = p->cut.plo;
    return DT_OK;
}

void dt_train_pipe_keep_(const trainer *t, size_t *lo, size_t *hi) {
    dt_shard_mode mode = DT_SHARD_NONE;
    dt_shard_parse(t->o->shard, &mode);
    dt_pp_keep(&t->pipe->cut, t->stage, t->dp, mode != DT_SHARD_NONE, lo, hi);
}

dt_status dt_train_pipe_setup_(trainer *t) {
    train_pipe *p = t->pipe;
    const dt_train_opts *o = t->o;
    const int P = t->pp;
    dt_status s = DT_OK;
    /* every stage's list, checked together: definitions, order, no hang */
    const dt_pp_schedule *sch = dt_pp_find(o->pipeline_schedule);
    dt_pp_list *lists = calloc((size_t)P, sizeof *lists);
    if (!lists) return dt_error(DT_ERR_NOMEM, "pipeline: out of memory");
    for (int st = 0; s == DT_OK && st < P; st++) s = dt_pp_build(sch, P, 1, st, (int)t->k, &lists[st]);
    int in_flight = 0;
    if (s == DT_OK) s = dt_pp_check(lists, P, (int)t->k, &in_flight);
    /* the layout, and with --schedule-dump every list */
    size_t len = 0, cap = 0;
    char line[256];
    snprintf(line, sizeof line, "pipeline: %d stages x %d replica%s, schedule %s, %lld micro-batches per replica "
             "(at most %d in flight); stage:modules:parameters", P, t->dp, t->dp == 1 ? "" : "s", dt_pp_name(sch),
             (long long)t->k, in_flight);
    put_text(p, &len, &cap, line);
    for (int st = 0; st < P && s == DT_OK; st++) {
        snprintf(line, sizeof line, " %d:%d-%d:%zu", st, p->mod_lo[st], p->mod_lo[st + 1] - 1, p->plo[st + 1] - p->plo[st]);
        put_text(p, &len, &cap, line);
    }
    for (int st = 0; o->schedule_dump && st < P && s == DT_OK; st++) {
        snprintf(line, sizeof line, "\nstage %d:", st);
        put_text(p, &len, &cap, line);
        for (int i = 0; i < lists[st].n; i++) {
            char one[48];
            dt_pp_list l1 = {.a = &lists[st].a[i], .n = 1};
            dt_pp_dump(&l1, one, sizeof one);
            one[strcspn(one, "\n")] = '\0';
            snprintf(line, sizeof line, "%s%s", i ? ", " : " ", one);
            put_text(p, &len, &cap, line);
        }
    }
    if (s == DT_OK) {
        p->list = lists[t->stage];
        lists[t->stage] = (dt_pp_list){0};
    }
    for (int st = 0; st < P; st++) dt_pp_list_free(&lists[st]);
    free(lists);
    DT_TRY(s);
    /* the boundary tensors: inputs of the micro-batches in flight, the gradients */
    const dt_layer *first = dt_model_layer(t->model, p->layer_lo[t->stage]);
    const dt_layer *last = dt_model_layer(t->model, p->layer_lo[t->stage + 1] - 1);
    p->in_n = (size_t)first->in_numel;
    p->out_n = (size_t)last->out_numel;
    dt_pp_held(&p->list, &p->nslots, &p->nsets);   /* inputs received, and micro-batches forwarded, not yet backwarded */
    if (o->recompute) p->nsets = 1;   /* recomputation's stages run their forward again: the least memory */
    if (p->nsets > 1)
        DT_TRY(dt_model_act_sets(t->model, p->layer_lo[t->stage], p->layer_lo[t->stage + 1], p->nsets));
    DT_TRY(dt_model_acts_only(t->model, p->layer_lo[t->stage], p->layer_lo[t->stage + 1]));   /* the others' go */
    size_t B = (size_t)t->b;
    if (t->stage > 0) {
        p->in = calloc((size_t)p->nslots, sizeof *p->in);
        if (!p->in) return dt_error(DT_ERR_NOMEM, "pipeline: out of memory");
        for (int i = 0; i < p->nslots; i++) DT_TRY(dt_mem_alloc(t->ops, DT_MEM_ACTS, (void **)&p->in[i], B * p->in_n * sizeof(float)));
        DT_TRY(dt_mem_alloc(t->ops, DT_MEM_ACTS, (void **)&p->gout, B * p->in_n * sizeof(float)));
    }
    if (t->stage < P - 1) DT_TRY(dt_mem_alloc(t->ops, DT_MEM_ACTS, (void **)&p->gin, B * p->out_n * sizeof(float)));
    DT_TRY(agree(t));
    dt_model_precision_partial(t->model);   /* the rounded copy: this stage's weights only */
    DT_TRY(dt_pp_riders(&p->cut, dt_model_layer(t->model, 0), dt_model_nlayers(t->model), &p->ride, &p->nride));
    DT_TRY(hold_riders(t));
    if (o->init_weights && !t->resume) DT_TRY(dt_train_pipe_drop_(t));   /* the load wrote every stage's */
    p->losses = calloc((size_t)t->world * (size_t)t->k, sizeof *p->losses);
    if (!p->losses) return dt_error(DT_ERR_NOMEM, "pipeline: out of memory");
    size_t rec = dt_model_bn_record_size(t->model);
    if (rec && !(p->bnall = malloc((size_t)t->world * (size_t)t->k * rec * sizeof(float) + rec * sizeof(float))))
        return dt_error(DT_ERR_NOMEM, "pipeline: out of memory for the batchnorm records");
    if (!t->ops->host_memory && !dt_comm_device_buffers(t->comm)) {
        size_t most = B * (p->in_n > p->out_n ? p->in_n : p->out_n);
        for (int st = 0; st < P; st++)
            if (p->plo[st + 1] - p->plo[st] > most) most = p->plo[st + 1] - p->plo[st];
        for (int r = 0; r < p->nride; r++)
            if (p->ride[r].len > most) most = p->ride[r].len;
        p->host_n = most;
        DT_TRY(dt_mem_host_alloc(t->ops, DT_MEM_COMM, (void **)&p->host, most * sizeof(float)));
    }
    return DT_OK;
}

void dt_train_pipe_range_(const trainer *t, size_t *lo, size_t *hi) {
    *lo = t->pipe->plo[t->stage];
    *hi = t->pipe->plo[t->stage + 1];
}

void dt_train_pipe_free_(trainer *t) {
    train_pipe *p = t->pipe;
    if (!p) {
        return;
    }
    for (int i = 0; p->in && i < p->nslots; i++) dt_mem_free(t->ops, p->in[i]);
    free(p->in);
    dt_mem_free(t->ops, p->gin);
    dt_mem_free(t->ops, p->gout);
    dt_mem_free(t->ops, p->dbbuf);
    dt_mem_free(t->ops, p->host);
    if (p->dparts) t->ops->free(p->dparts);
    dt_pp_list_free(&p->list);
    dt_comm_destroy(p->pp_comm);
    dt_pp_cut_free(&p->cut);
    free(p->ride), free(p->bch), free(p->parts), free(p->bbuf);
    free(p->losses), free(p->text), free(p->bnall);
    dt_mem_sub(DT_MEM_PARAMS, p->held_params + p->whole);   /* the model counts its own (it may outlive the run) */
    dt_mem_sub(DT_MEM_GRADS, p->held_grads);
    free(p);
    t->pipe = NULL;
    if (t->dp_comm != t->comm) dt_comm_destroy(t->dp_comm);
    t->dp_comm = NULL;
}

const char *dt_train_pipe_text_(const trainer *t) { return t->pipe ? t->pipe->text : NULL; }

/* ---- moving device memory -------------------------------------------------------------- */

static dt_status xsend(trainer *t, const float *buf, size_t n, int stage, int tag) {
    train_pipe *p = t->pipe;
    int peer = t->dpr * t->pp + stage;
    if (!p->host) return dt_send(t->comm, buf, n, DT_F32, peer, tag);
    DT_TRY(t->ops->copy_d2h(p->host, buf, n * sizeof(float)));
    return dt_send(t->comm, p->host, n, DT_F32, peer, tag);
}

static dt_status xrecv(trainer *t, float *buf, size_t n, int stage, int tag) {
    train_pipe *p = t->pipe;
    int peer = t->dpr * t->pp + stage;
    if (!p->host) return dt_recv(t->comm, buf, n, DT_F32, peer, tag);
    DT_TRY(dt_recv(t->comm, p->host, n, DT_F32, peer, tag));
    return t->ops->copy_h2d(buf, p->host, n * sizeof(float));
}

static dt_status xbcast(trainer *t, float *buf, size_t n, int root) {
    train_pipe *p = t->pipe;
    if (!p->host) return dt_broadcast(p->pp_comm, buf, n, DT_F32, root);
    if (t->stage == root) DT_TRY(t->ops->copy_d2h(p->host, buf, n * sizeof(float)));
    DT_TRY(dt_broadcast(p->pp_comm, p->host, n, DT_F32, root));
    return t->stage == root ? DT_OK : t->ops->copy_h2d(buf, p->host, n * sizeof(float));
}

/* ---- the step ------------------------------------------------------------------------- */

static dt_status forward(trainer *t, int m, uint64_t epoch, int64_t step) {
    train_pipe *p = t->pipe;
    size_t ss = (size_t)dt_dataset_get_info(t->train)->sample_size;
    int64_t sample_base = step * t->o->batch + (t->first_micro + m) * t->b;
    const float *x = t->stage == 0 ? t->dx + (size_t)m * (size_t)t->b * ss : p->in[m % p->nslots];
    if (p->nsets > 1) DT_TRY(dt_model_act_use(t->model, m % p->nsets));
    if (t->bnrec_n) dt_model_set_bn_record(t->model, t->bnrec + (size_t)(t->first_micro + m) * t->bnrec_n);
    DT_TRY(dt_model_forward_range(t->model, p->layer_lo[t->stage], p->layer_lo[t->stage + 1], x, (int)t->b, 1, epoch,
                                  sample_base, &p->out));
    p->cur = m;
    return DT_OK;
}

static dt_status backward(trainer *t, int m, uint64_t epoch, int64_t step, const void *target) {
    train_pipe *p = t->pipe;
    if (p->nsets > 1) {
        DT_TRY(dt_model_act_use(t->model, m % p->nsets));   /* its activations, kept */
        p->cur = m;
    }
    if (p->cur != m) DT_TRY(forward(t, m, epoch, step));   /* its activations again */
    DT_TRY(dt_ddp_begin_micro(t->ddp, m));
    p->cur = -1;
    if (t->stage == t->pp - 1) {
        const void *tm = !dt_loss_def_of(t->lf.kind)->one_hot
                             ? (const void *)((const int32_t *)target + (size_t)m * (size_t)(t->b * t->lw))
                             : (const void *)((const float *)target + (size_t)m * (size_t)t->b * (size_t)t->C);
        DT_TRY(dt_model_loss_backward_to(t->model, &t->lf, tm, (int)t->b, (float)t->o->batch, NULL, p->gout));
        return t->ops->copy_d2d(t->dlosses + m, dt_model_loss_dev(t->model), sizeof(float));
    }
    return dt_model_backward_range(t->model, p->layer_lo[t->stage], p->layer_lo[t->stage + 1], p->gin, p->gout);
}

dt_status dt_train_pipe_run_(trainer *t, uint64_t epoch, int64_t step, const void *target, double *wait) {
    train_pipe *p = t->pipe;
    *wait = 0.0;
    const size_t B = (size_t)t->b;
    float *grads = dt_model_grads(t->model);
    DT_TRY(t->ops->zero(t->dlosses, (size_t)t->k * sizeof(float)));
    /* mixed precision rounds the kept range's weights at the first forward; a tied tensor
     * this stage reads lies outside it: rounded here, from what its owner sent */
    for (int r = 0; r < p->nride; r++)
        if (p->ride[r].user == t->stage)
            DT_TRY(dt_model_params_arrived(t->model, p->ride[r].layer, p->ride[r].off, p->ride[r].off + p->ride[r].len));
    for (int i = 0; i < p->list.n; i++) {
        dt_pp_action a = p->list.a[i];
        dt_status s = DT_OK;
        double t0 = a.op == DT_PP_FWD || a.op == DT_PP_BWD ? 0.0 : dt_now();   /* the boundary's waits */
        switch (a.op) {
        case DT_PP_FWD: s = forward(t, a.micro, epoch, step); break;
        case DT_PP_BWD: s = backward(t, a.micro, epoch, step, target); break;
        case DT_PP_RECV_ACT: s = xrecv(t, p->in[a.micro % p->nslots], B * p->in_n, t->stage - 1, TAG_ACT); break;
        case DT_PP_SEND_ACT:
            if (p->cur != a.micro)
                return dt_error(DT_ERR_INTERNAL, "pipeline: stage %d sends the output of micro-batch %d, but holds %d's",
                                t->stage, a.micro, p->cur);
            s = xsend(t, p->out, B * p->out_n, t->stage + 1, TAG_ACT);
            break;
        case DT_PP_RECV_GRAD:
            s = xrecv(t, p->gin, B * p->out_n, t->stage + 1, TAG_GRAD);
            /* tied parts on their way to their owner, or arriving there */
            for (int r = 0; s == DT_OK && r < p->nride; r++)
                if (p->ride[r].owner <= t->stage && t->stage < p->ride[r].user)
                    s = xrecv(t, grads + p->ride[r].off, p->ride[r].len, t->stage + 1, TAG_TIED);
            break;
        case DT_PP_SEND_GRAD:
            s = xsend(t, p->gout, B * p->in_n, t->stage - 1, TAG_GRAD);
            for (int r = 0; s == DT_OK && r < p->nride; r++)
                if (p->ride[r].owner < t->stage && t->stage <= p->ride[r].user)
                    s = xsend(t, grads + p->ride[r].off, p->ride[r].len, t->stage - 1, TAG_TIED);
            break;
        }
        if (s != DT_OK && (a.op == DT_PP_FWD || a.op == DT_PP_BWD))
            return dt_error_wrap(s, "pipeline stage %d, micro-batch %d: ", t->stage, a.micro);
        if (s != DT_OK) {   /* a neighbour that died or hangs: name its stage and rank */
            int peer = a.op == DT_PP_SEND_ACT || a.op == DT_PP_RECV_GRAD ? t->stage + 1 : t->stage - 1;
            return dt_error_wrap(s, "pipeline stage %d, micro-batch %d, %s stage %d (rank %d): ", t->stage, a.micro,
                                 a.op == DT_PP_SEND_ACT || a.op == DT_PP_SEND_GRAD ? "sending to" : "receiving from",
                                 peer, t->dpr * t->pp + peer);
        }
        if (t0 > 0.0) *wait += dt_now() - t0;
    }
    return DT_OK;
}

dt_status dt_train_pipe_losses_(trainer *t) {
    train_pipe *p = t->pipe;
    DT_TRY(dt_allgather(t->comm, t->losses, p->losses, (size_t)t->k, DT_F32));
    for (int r = 0; r < t->dp; r++)
        memcpy(t->all_losses + (size_t)r * (size_t)t->k, p->losses + (size_t)(r * t->pp + t->pp - 1) * (size_t)t->k,
               (size_t)t->k * sizeof(float));
    return DT_OK;
}

dt_status dt_train_pipe_bn_(trainer *t) {
    train_pipe *p = t->pipe;
    const size_t rec = t->bnrec_n, k = (size_t)t->k;
    float *mine = p->bnall + (size_t)t->rank * k * rec;
    DT_TRY(t->ops->copy_d2h(mine, t->bnrec + (size_t)t->first_micro * rec, k * rec * sizeof(float)));
    DT_TRY(dt_allgather(t->comm, mine, p->bnall, k * rec, DT_F32));
    float *one = p->bnall + (size_t)t->world * k * rec;
    int n = dt_model_nlayers(t->model);
    for (int r = 0; r < t->dp; r++)
        for (size_t i = 0; i < k; i++) {
            /* micro-batch r k + i: each layer's record from the stage that ran it */
            for (int st = 0, l = 0; l < n; l++) {
                while (l >= p->layer_lo[st + 1]) st++;
                const dt_layer *L = dt_model_layer(t->model, l);
                if (!L->nrecord) continue;
                const float *from = p->bnall + ((size_t)(r * t->pp + st) * k + i) * rec;
                memcpy(one + L->rec_off, from + L->rec_off, (size_t)L->nrecord * sizeof(float));
            }
            DT_TRY(t->ops->copy_h2d(t->bnrec + ((size_t)r * k + i) * rec, one, rec * sizeof(float)));
        }
    return DT_OK;
}

dt_status dt_train_pipe_clip_(trainer *t, float max_norm, float unscale, float *norm) {
    train_pipe *p = t->pipe;
    const dt_ops *ops = t->ops;
    const size_t C = DT_SUM_CHUNK, n = dt_model_nparams(t->model);
    size_t lo, hi;
    norm_part(t, t->stage, t->dpr, &lo, &hi);
    float *g = dt_model_grads(t->model);
    memset(p->parts, 0, p->nch * sizeof *p->parts);
    /* the chunks wholly this rank's part (each chunk's sum comes from one rank: the sums
     * over the world add zeros to it, which is exact) */
    size_t c0 = (lo + C - 1) / C, c1 = hi == n ? p->nch : hi / C;
    if (hi > lo && c1 > c0) {
        size_t end = c1 * C < n ? c1 * C : n;
        DT_TRY(ops->sumsq_chunks(p->dparts, g + c0 * C, end - c0 * C));
        DT_TRY(ops->copy_d2h(p->parts + c0, p->dparts, (c1 - c0) * sizeof(double)));
    }
    DT_TRY(dt_allreduce(t->comm, p->parts, p->parts, p->nch, DT_F64, DT_SUM));
    /* the chunks the parts' edges cut: every part's values of them, summed whole */
    if (p->nbc) {
        memset(p->bbuf, 0, (size_t)p->nbc * C * sizeof(float));
        for (int j = 0; j < p->nbc; j++) {
            size_t a = p->bch[j] * C, e = a + C < n ? a + C : n;
            size_t x = lo > a ? lo : a, y = hi < e ? hi : e;
            if (x < y) DT_TRY(ops->copy_d2h(p->bbuf + (size_t)j * C + (x - a), g + x, (y - x) * sizeof(float)));
        }
        DT_TRY(dt_allreduce(t->comm, p->bbuf, p->bbuf, (size_t)p->nbc * C, DT_F32, DT_SUM));
        DT_TRY(ops->copy_h2d(p->dbbuf, p->bbuf, (size_t)p->nbc * C * sizeof(float)));
        for (int j = 0; j < p->nbc; j++) {
            size_t a = p->bch[j] * C, e = a + C < n ? a + C : n;
            DT_TRY(ops->sumsq_chunks(p->dparts, p->dbbuf + (size_t)j * C, e - a));
            DT_TRY(ops->copy_d2h(p->parts + p->bch[j], p->dparts, sizeof(double)));
        }
    }
    double sq = dt_pairwise_sum(p->parts, p->nch);
    float total = dt_clip_norm(sq, unscale);
    if (norm) *norm = total;
    size_t alo, alen;   /* what this rank applies */
    dt_shard_range(t->shard, &alo, &alen);
    float coef = dt_clip_coef(max_norm, total);
    if (coef < 1.0f && alen) DT_TRY(ops->scale(g + alo, coef, alen));
    return DT_OK;
}

dt_status dt_train_pipe_after_step_(trainer *t) {
    train_pipe *p = t->pipe;
    float *params = dt_model_params(t->model);
    for (int r = 0; r < p->nride; r++) {
        if (p->ride[r].owner == t->stage) DT_TRY(xsend(t, params + p->ride[r].off, p->ride[r].len, p->ride[r].user, TAG_PARAM));
        if (p->ride[r].user == t->stage) DT_TRY(xrecv(t, params + p->ride[r].off, p->ride[r].len, p->ride[r].owner, TAG_PARAM));
    }
    return DT_OK;
}

dt_status dt_train_pipe_gather_(trainer *t) {
    train_pipe *p = t->pipe;
    float *params = dt_model_params(t->model);
    size_t n = dt_model_nparams(t->model);
    if (!p->whole) {   /* the other stages' pages, back and counted */
        if (p->keep_lo > 0) DT_TRY(t->ops->populate(params, p->keep_lo * sizeof(float)));
        if (n > p->keep_hi) DT_TRY(t->ops->populate(params + p->keep_hi, (n - p->keep_hi) * sizeof(float)));
        p->whole = outside_bytes(t);
        dt_mem_add(DT_MEM_PARAMS, p->whole);
    }
    for (int s = 0; s < t->pp; s++) DT_TRY(xbcast(t, params + p->plo[s], p->plo[s + 1] - p->plo[s], s));
    dt_model_set_resident(t->model, 0, n);   /* mixed precision rounds every layer's weights again */
    return dt_model_acts_all(t->model);      /* and every layer may run */
}
