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
 * Chunks (--pipeline-schedule interleaved, --virtual-stages V): the modules are cut into
 * P x V chunks and stage s runs chunks s, s + P, ..., s + (V - 1) P, a micro-batch passing
 * from the last stage back to the first between them. Each chunk a stage runs has a model,
 * DDP, sharding, optimizer and mixed precision of its own, built over that chunk's range
 * as a stage of a P x V-stage pipeline would be (the trainer's model, ddp, shard, optim
 * and amp are those of the chunk dt_train_pipe_use_ chose; chunk 0's between the
 * phases of a step). So everything said here of a stage holds of a chunk.
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

/* One chunk of the model that this rank runs: the cut's stage c = j P + stage for the
 * stage's j-th chunk (one chunk, c = stage, but for the interleaved schedule). */
typedef struct {
    int c;                     /* its index in the cut */
    dt_model *model;           /* its own model, DDP, sharding, optimizer and mixed precision */
    dt_ddp *ddp;
    dt_shard *shard;
    dt_optim *optim;
    dt_amp *amp;
    int nslots;                /* inputs held at once */
    int nsets;                 /* > 1: the model keeps this many micro-batches' activations
                                * (dt_model_act_sets), else a backward runs its forward again */
    float **in;                /* nslots inputs (B x in_n), not on the model's first chunk */
    int ngin;                  /* gradients of our output received and not yet backwarded */
    float **gin, *gout;        /* the gradient of our output (not on the last chunk: ngin slots, micro-batch
                                * m's in m % ngin), of our input (not on the first) */
    size_t in_n, out_n;        /* floats per sample of the chunk's input and output */
    const float *out;          /* the output of the last forward */
    int cur;                   /* the micro-batch whose activations the model holds, -1: none */
    int nrelay;                /* slots of relay (0: none) */
    float **relay;             /* the tied gradients that arrive with the boundary gradient of
                                * micro-batch m wait in slot m % nrelay until they are sent on (a
                                * chunk between the owner and the user) or laid in the owner's
                                * gradient before its backward, where later micro-batches' may
                                * arrive first (the interleaved schedule); NULL: the owner takes
                                * them in its gradient array at once */
    /* what the chunk's model holds of the arrays: its kept range [keep_lo, keep_hi) (the
     * model was built so), the tied tensors it reads or relays (counted here: held), and
     * between dt_train_pipe_gather_ and dt_train_pipe_drop_ every other chunk's
     * parameters (counted: whole; chunk 0 only) */
    size_t keep_lo, keep_hi, held_params, held_grads, whole;
} pipe_chunk;

struct train_pipe {
    dt_comm *pp_comm;          /* this replica's stages, pp_comm rank = stage */
    int V;                     /* chunks per stage */
    pipe_chunk *ch;            /* V: this stage's chunks */
    int j;                     /* the chunk whose objects the trainer holds */
    dt_pp_cut cut;             /* the P x V chunks (pipeline.h); the three below are its arrays */
    int *mod_lo;               /* chunk c: top-level modules [mod_lo[c], mod_lo[c + 1]) */
    int *layer_lo;             /* chunk c: layers [layer_lo[c], layer_lo[c + 1]) */
    size_t *plo;               /* chunk c: parameters [plo[c], plo[c + 1]) */
    dt_pp_list list;
    dt_pp_rider *ride;         /* the tied tensors a chunk reads but another owns */
    int nride;
    size_t *roff, rlen;        /* rider r's floats in a relay slot: [roff[r], roff[r] + len); rlen in all */
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
    char *text;                /* the layout (and the lists) for the start */
    char why[160];             /* why the cut is not the one --stages names ("": it is) */
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
    const int P = o->pipeline > 1 ? o->pipeline : 1, V = o->virtual_stages > 1 ? o->virtual_stages : 1;
    if (P == 1 && V > 1)
        return dt_error(DT_ERR_INVALID, "pipeline: --virtual-stages %d cuts the stages of a pipeline into chunks; it "
                        "needs --pipeline P above 1 (and --pipeline-schedule interleaved)", V);
    if (V > DT_TRAIN_MAX_CHUNKS)   /* (the option's bound; a library caller sets the field itself) */
        return dt_error(DT_ERR_INVALID, "pipeline: --virtual-stages %d: at most %d chunks a stage", V,
                        DT_TRAIN_MAX_CHUNKS);
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
    int dp = world / P;
    int64_t k, b;
    DT_TRY(dt_train_split(o->batch, S, dp, &k, &b));
    if (k < P)
        return dt_error(DT_ERR_INVALID, "pipeline: %lld micro-batches per replica cannot fill %d stages (--micro-batches "
                        "%lld over %d replica%s); give at least %lld", (long long)k, P, (long long)S, dp,
                        dp == 1 ? "" : "s", (long long)P * dp);
    dt_pp_list l;   /* the schedule takes these chunks and micro-batches (the builder's messages) */
    dt_status s = dt_pp_build(sch, P, V, 0, (int)k, &l);
    if (s == DT_OK) dt_pp_list_free(&l);
    return s;
}

dt_status dt_train_pipe_world_(trainer *t) {
    if (t->pp == 1) return dt_train_pipe_check(t->o, t->world, t->S);   /* (--virtual-stages alone is refused) */
    DT_TRY(dt_train_pipe_check(t->o, t->world, t->S));
    t->pipe = calloc(1, sizeof *t->pipe);
    if (!t->pipe) return dt_error(DT_ERR_NOMEM, "pipeline: out of memory");
    train_pipe *p = t->pipe;
    p->V = t->o->virtual_stages > 1 ? t->o->virtual_stages : 1;
    p->ch = calloc((size_t)p->V, sizeof *p->ch);
    if (!p->ch) return dt_error(DT_ERR_NOMEM, "pipeline: out of memory");
    for (int j = 0; j < p->V; j++) p->ch[j].c = j * t->pp + t->stage, p->ch[j].cur = -1;
    DT_TRY(dt_comm_split(t->comm, t->stage, t->dpr, &t->dp_comm));
    return dt_comm_split(t->comm, t->dpr, t->stage, &t->pipe->pp_comm);
}

/* ---- the chunks ----------------------------------------------------------------------- */

/* The trainer's objects go back to the chunk they are (it may have made them). */
static void sync(trainer *t) {
    pipe_chunk *a = &t->pipe->ch[t->pipe->j];
    a->model = t->model, a->ddp = t->ddp, a->shard = t->shard, a->optim = t->optim, a->amp = t->amp;
}

void dt_train_pipe_use_(trainer *t, int j) {
    train_pipe *p = t->pipe;
    if (!p || j == p->j) return;
    sync(t);
    const pipe_chunk *b = &p->ch[j];
    t->model = b->model, t->ddp = b->ddp, t->shard = b->shard, t->optim = b->optim, t->amp = b->amp;
    p->j = j;
}

int dt_train_pipe_chunks_(const trainer *t) { return t->pipe ? t->pipe->V : 1; }

void dt_train_pipe_amp_follow_(trainer *t) {
    train_pipe *p = t->pipe;
    if (!p) return;
    dt_train_pipe_use_(t, 0);
    sync(t);
    for (int j = 1; j < p->V; j++) dt_amp_follow(p->ch[j].amp, p->ch[0].amp);
}

/* " (chunk c)" where a stage runs several, else "": for messages. */
static const char *chunk_name(const train_pipe *p, int c, char *buf, size_t n) {
    if (p->V > 1) snprintf(buf, n, " (chunk %d)", c);
    else buf[0] = '\0';
    return buf;
}

/* ---- the cut -------------------------------------------------------------------------- */

static void keep_of(const trainer *t, int c, size_t *lo, size_t *hi) {
    dt_shard_mode mode = DT_SHARD_NONE;
    dt_shard_parse(t->o->shard, &mode);
    dt_pp_keep(&t->pipe->cut, c, t->dp, mode != DT_SHARD_NONE, lo, hi);
}

/* The tied tensors beyond the chunk's kept range: the user holds their parameters and
 * gradient, a chunk between it and the owner their gradient (it relays it). The
 * parameters come from the owner after the start (dt_train_pipe_after_step_). */
static dt_status hold_riders(trainer *t, pipe_chunk *ch) {
    train_pipe *p = t->pipe;
    keep_of(t, ch->c, &ch->keep_lo, &ch->keep_hi);
    for (int r = 0; r < p->nride; r++) {
        const dt_pp_rider *R = &p->ride[r];
        size_t bytes = R->len * sizeof(float);
        if (ch->c == R->user) {
            DT_TRY(t->ops->populate(dt_model_params(ch->model) + R->off, bytes));
            dt_mem_add(DT_MEM_PARAMS, bytes);
            ch->held_params += bytes;
        }
        if (ch->c == R->user) {
            DT_TRY(t->ops->populate(dt_model_grads(ch->model) + R->off, bytes));
            dt_mem_add(DT_MEM_GRADS, bytes);
            ch->held_grads += bytes;
        }
    }
    ch->nrelay = dt_pp_relay_slots(p->ride, p->nride, ch->c, ch->nrelay, ch->ngin);
    if (!ch->nrelay) return DT_OK;
    ch->relay = calloc((size_t)ch->nrelay, sizeof *ch->relay);
    if (!ch->relay) return dt_error(DT_ERR_NOMEM, "pipeline: out of memory");
    for (int i = 0; i < ch->nrelay; i++)
        DT_TRY(dt_mem_alloc(t->ops, DT_MEM_GRADS, (void **)&ch->relay[i], p->rlen * sizeof(float)));
    return DT_OK;
}

/* Where chunk ch keeps rider r's gradient part of micro-batch m: its relay slot, or the
 * model's gradient array (the owner lays it there, the user's head writes it there). */
static float *rider_grad(const train_pipe *p, const pipe_chunk *ch, int r, int m) {
    const dt_pp_rider *R = &p->ride[r];
    if (ch->relay && R->owner <= ch->c && ch->c < R->user) return ch->relay[m % ch->nrelay] + p->roff[r];
    return dt_model_grads(ch->model) + R->off;
}

/* The parameters outside the kept range and the riders: [0, keep_lo) and [keep_hi, n). */
static size_t outside_bytes(const pipe_chunk *ch) {
    size_t n = dt_model_nparams(ch->model);
    return (ch->keep_lo + (n > ch->keep_hi ? n - ch->keep_hi : 0)) * sizeof(float) - ch->held_params;
}

/* Give back params [a, b) but the tied tensors this chunk reads (their values stay). */
static dt_status discard_but_riders(trainer *t, const pipe_chunk *ch, float *params, size_t a, size_t b) {
    train_pipe *p = t->pipe;
    while (a < b) {
        size_t next = b, skip = b;   /* the first rider this chunk reads that ends after a */
        for (int r = 0; r < p->nride; r++) {
            const dt_pp_rider *R = &p->ride[r];
            if (R->user != ch->c || R->off + R->len <= a || R->off >= b) continue;
            if (R->off < next || (R->off == next && R->off + R->len > skip)) next = R->off, skip = R->off + R->len;
        }
        if (next > a) DT_TRY(t->ops->discard(params + a, (next - a) * sizeof(float)));
        a = skip > next ? skip : next;
    }
    return DT_OK;
}

dt_status dt_train_pipe_drop_(trainer *t) {
    train_pipe *p = t->pipe;
    sync(t);
    for (int j = 0; j < p->V; j++) {
        pipe_chunk *ch = &p->ch[j];
        size_t n = dt_model_nparams(ch->model);
        float *params = dt_model_params(ch->model);
        DT_TRY(discard_but_riders(t, ch, params, 0, ch->keep_lo));
        if (n > ch->keep_hi) DT_TRY(discard_but_riders(t, ch, params, ch->keep_hi, n));
        dt_mem_sub(DT_MEM_PARAMS, ch->whole);
        ch->whole = 0;
        dt_model_set_resident(ch->model, ch->keep_lo, ch->keep_hi);
        DT_TRY(dt_model_precision_keep(ch->model, ch->keep_lo, ch->keep_hi));   /* a tied weight's is rounded again */
        DT_TRY(dt_model_acts_only(ch->model, p->layer_lo[ch->c], p->layer_lo[ch->c + 1]));
    }
    return DT_OK;
}

/* The part of the summed gradient rank (chunk c's stage, replica) answers for in the norm. */
static void norm_part(const trainer *t, int c, int replica, size_t *a, size_t *b) {
    dt_pp_norm_part(&t->pipe->cut, c, replica, t->dp, !dt_shard_ddp_reduces(t->shard), a, b);
}

/* The chunks of the norm that the parts' edges cut (after dt_shard_init_range). */
dt_status dt_train_pipe_norm_setup_(trainer *t) {
    train_pipe *p = t->pipe;
    const size_t C = DT_SUM_CHUNK, n = dt_model_nparams(t->model);
    p->nch = (n + C - 1) / C;
    p->bch = calloc((size_t)t->world * (size_t)p->V, sizeof *p->bch);
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

/* Neighbouring chunks agree on the tensors between them (a rank that built another
 * model would otherwise wait for a message of another size): each chunk's cut, its input
 * and output per sample, and the model's size, gathered over the pipeline. */
static dt_status agree(trainer *t) {
    train_pipe *p = t->pipe;
    enum { LO, HI, IN, OUT, NL, NP, NV };
    const int V = p->V, P = t->pp;
    int64_t *mine = calloc((size_t)V * NV, sizeof *mine), *all = calloc((size_t)P * V * NV, sizeof *all);
    dt_status s = mine && all ? DT_OK : dt_error(DT_ERR_NOMEM, "pipeline: out of memory");
    for (int j = 0; s == DT_OK && j < V; j++) {
        const pipe_chunk *ch = &p->ch[j];
        int64_t one[NV] = {p->layer_lo[ch->c], p->layer_lo[ch->c + 1], (int64_t)ch->in_n, (int64_t)ch->out_n,
                           dt_model_nlayers(ch->model), (int64_t)dt_model_nparams(ch->model)};
        memcpy(mine + (size_t)j * NV, one, sizeof one);
    }
    if (s == DT_OK) s = dt_allgather(p->pp_comm, mine, all, (size_t)V * NV, DT_I64);
    for (int c = 0; s == DT_OK && c + 1 < P * V; c++) {
        const int sa = c % P, sb = (c + 1) % P, ra = t->dpr * P + sa, rb = t->dpr * P + sb;
        const int64_t *a = all + ((size_t)sa * V + (size_t)(c / P)) * NV;
        const int64_t *b = all + ((size_t)sb * V + (size_t)((c + 1) / P)) * NV;
        char na[32], nb[32];
        chunk_name(p, c, na, sizeof na), chunk_name(p, c + 1, nb, sizeof nb);
        if (a[NL] != b[NL] || a[NP] != b[NP])
            s = dt_error(DT_ERR_MISMATCH, "pipeline: stage %d%s (rank %d) built a model of %lld layers and %lld "
                         "parameters, stage %d%s (rank %d) one of %lld and %lld; every rank must build the same model",
                         sa, na, ra, (long long)a[NL], (long long)a[NP], sb, nb, rb, (long long)b[NL], (long long)b[NP]);
        else if (a[HI] != b[LO])
            s = dt_error(DT_ERR_MISMATCH, "pipeline: stage %d%s (rank %d) ends before layer %lld, stage %d%s (rank %d) "
                         "starts at layer %lld", sa, na, ra, (long long)a[HI], sb, nb, rb, (long long)b[LO]);
        else if (a[OUT] != b[IN])
            s = dt_error(DT_ERR_MISMATCH, "pipeline: stage %d%s (rank %d) sends %lld floats per sample, stage %d%s "
                         "(rank %d) expects %lld", sa, na, ra, (long long)a[OUT], sb, nb, rb, (long long)b[IN]);
    }
    free(mine);
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

dt_status dt_train_pipe_cut_(trainer *t, const dt_spec *sp, const char *stages, size_t work, size_t params) {
    train_pipe *p = t->pipe;
    if (stages != t->o->stages && stages && !strcmp(stages, "params"))
        snprintf(p->why, sizeof p->why, " (--stages auto cut by parameters: the work's cut needs %.2f MiB on a "
                 "rank, over --max-memory %.2f MiB; this one %.2f)", (double)work / 1048576.0,
                 (double)t->o->max_memory / 1048576.0, (double)params / 1048576.0);
    DT_TRY(dt_pp_cut_chunks(sp, t->pp, p->V, stages, &p->cut));
    p->mod_lo = p->cut.mod_lo;
    p->layer_lo = p->cut.layer_lo;
    p->plo = p->cut.plo;
    return DT_OK;
}

dt_status dt_train_pipe_built_(trainer *t) {
    const train_pipe *p = t->pipe;
    if (!p) return DT_OK;
    int c = p->ch[p->j].c;   /* the other layers' buffers go before the next chunk's model or this one's sets come */
    return dt_model_acts_only(t->model, p->layer_lo[c], p->layer_lo[c + 1]);
}

void dt_train_pipe_keep_(const trainer *t, size_t *lo, size_t *hi) {
    keep_of(t, t->pipe->ch[t->pipe->j].c, lo, hi);
}

/* Chunk j's boundary buffers and activation sets. */
static dt_status chunk_setup(trainer *t, pipe_chunk *ch, int j) {
    train_pipe *p = t->pipe;
    const int last = t->pp * p->V - 1;
    const dt_layer *first = dt_model_layer(ch->model, p->layer_lo[ch->c]);
    const dt_layer *end = dt_model_layer(ch->model, p->layer_lo[ch->c + 1] - 1);
    ch->in_n = (size_t)first->in_numel;
    ch->out_n = (size_t)end->out_numel;
    /* from its list: the inputs, activation sets and boundary gradients it holds at once,
     * and the gradients it has not yet sent on (hold_riders sizes its relay slots by them) */
    DT_TRY(dt_pp_chunk_held(&p->list, j, &ch->nslots, &ch->nsets, &ch->ngin, &ch->nrelay));
    if (t->o->recompute) ch->nsets = 1;   /* recomputation's stages run their forward again: the least memory */
    if (ch->nsets > 1)
        DT_TRY(dt_model_act_sets(ch->model, p->layer_lo[ch->c], p->layer_lo[ch->c + 1], ch->nsets));
    size_t B = (size_t)t->b;
    if (ch->c > 0) {
        ch->in = calloc((size_t)ch->nslots, sizeof *ch->in);
        if (!ch->in) return dt_error(DT_ERR_NOMEM, "pipeline: out of memory");
        for (int i = 0; i < ch->nslots; i++)
            DT_TRY(dt_mem_alloc(t->ops, DT_MEM_ACTS, (void **)&ch->in[i], B * ch->in_n * sizeof(float)));
        DT_TRY(dt_mem_alloc(t->ops, DT_MEM_ACTS, (void **)&ch->gout, B * ch->in_n * sizeof(float)));
    }
    if (ch->c < last) {
        if (ch->ngin < 1) ch->ngin = 1;
        ch->gin = calloc((size_t)ch->ngin, sizeof *ch->gin);
        if (!ch->gin) return dt_error(DT_ERR_NOMEM, "pipeline: out of memory");
        for (int i = 0; i < ch->ngin; i++)
            DT_TRY(dt_mem_alloc(t->ops, DT_MEM_ACTS, (void **)&ch->gin[i], B * ch->out_n * sizeof(float)));
    }
    return DT_OK;
}

dt_status dt_train_pipe_setup_(trainer *t) {
    train_pipe *p = t->pipe;
    const dt_train_opts *o = t->o;
    const int P = t->pp, V = p->V;
    dt_status s = DT_OK;
    sync(t);
    /* every stage's list, checked together: definitions, order, no hang */
    const dt_pp_schedule *sch = dt_pp_find(o->pipeline_schedule);
    dt_pp_list *lists = calloc((size_t)P, sizeof *lists);
    if (!lists) return dt_error(DT_ERR_NOMEM, "pipeline: out of memory");
    for (int st = 0; s == DT_OK && st < P; st++) s = dt_pp_build(sch, P, V, st, (int)t->k, &lists[st]);
    int in_flight = 0;
    if (s == DT_OK) s = dt_pp_check(lists, P, (int)t->k, &in_flight);
    /* the layout, and with --schedule-dump every list */
    size_t len = 0, cap = 0;
    char line[256], with[48] = "";
    if (V > 1) snprintf(with, sizeof with, " with %d chunks a stage", V);
    snprintf(line, sizeof line, "pipeline: %d stages x %d replica%s, schedule %s%s, %lld micro-batches per replica "
             "(at most %d in flight); %s:modules:parameters", P, t->dp, t->dp == 1 ? "" : "s", dt_pp_name(sch), with,
             (long long)t->k, in_flight, V > 1 ? "chunk" : "stage");
    put_text(p, &len, &cap, line);
    for (int c = 0; c < P * V && s == DT_OK; c++) {
        snprintf(line, sizeof line, " %d:%d-%d:%zu", c, p->mod_lo[c], p->mod_lo[c + 1] - 1, p->plo[c + 1] - p->plo[c]);
        put_text(p, &len, &cap, line);
    }
    if (s == DT_OK) put_text(p, &len, &cap, p->why);
    for (int st = 0; o->schedule_dump && st < P && s == DT_OK; st++) {
        snprintf(line, sizeof line, "\nstage %d:", st);
        put_text(p, &len, &cap, line);
        for (int i = 0; i < lists[st].n; i++) {
            char one[48];
            dt_pp_list l1 = {.a = &lists[st].a[i], .n = 1, .chunks = lists[st].chunks};
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
    for (int j = 0; j < V; j++) DT_TRY(chunk_setup(t, &p->ch[j], j));
    DT_TRY(agree(t));
    for (int j = 0; j < V; j++) dt_model_precision_partial(p->ch[j].model);   /* the rounded copy: this chunk's weights only */
    DT_TRY(dt_pp_riders(&p->cut, dt_model_layer(t->model, 0), dt_model_nlayers(t->model), &p->ride, &p->nride));
    if (!(p->roff = calloc((size_t)p->nride + 1, sizeof *p->roff))) return dt_error(DT_ERR_NOMEM, "pipeline: out of memory");
    for (int r = 0; r < p->nride; r++) p->roff[r] = p->rlen, p->rlen += p->ride[r].len;
    for (int j = 0; j < V; j++) DT_TRY(hold_riders(t, &p->ch[j]));
    if (o->init_weights && !t->resume) DT_TRY(dt_train_pipe_drop_(t));   /* the load wrote every stage's */
    p->losses = calloc((size_t)t->world * (size_t)t->k, sizeof *p->losses);
    if (!p->losses) return dt_error(DT_ERR_NOMEM, "pipeline: out of memory");
    size_t rec = dt_model_bn_record_size(t->model);
    if (rec && !(p->bnall = malloc((size_t)t->world * (size_t)t->k * rec * sizeof(float) + rec * sizeof(float))))
        return dt_error(DT_ERR_NOMEM, "pipeline: out of memory for the batchnorm records");
    if (!t->ops->host_memory && !dt_comm_device_buffers(t->comm)) {
        size_t most = 0, B = (size_t)t->b;
        for (int j = 0; j < V; j++) {
            size_t io = B * (p->ch[j].in_n > p->ch[j].out_n ? p->ch[j].in_n : p->ch[j].out_n);
            if (io > most) most = io;
        }
        for (int c = 0; c < P * V; c++)
            if (p->plo[c + 1] - p->plo[c] > most) most = p->plo[c + 1] - p->plo[c];
        for (int r = 0; r < p->nride; r++)
            if (p->ride[r].len > most) most = p->ride[r].len;
        p->host_n = most;
        DT_TRY(dt_mem_host_alloc(t->ops, DT_MEM_COMM, (void **)&p->host, most * sizeof(float)));
    }
    return DT_OK;
}

void dt_train_pipe_range_(const trainer *t, size_t *lo, size_t *hi) {
    const train_pipe *p = t->pipe;
    int c = p->ch[p->j].c;
    *lo = p->plo[c];
    *hi = p->plo[c + 1];
}

void dt_train_pipe_free_(trainer *t) {
    train_pipe *p = t->pipe;
    if (!p) {
        return;
    }
    for (int j = 0; p->ch && j < p->V; j++) {
        pipe_chunk *ch = &p->ch[j];
        for (int i = 0; ch->in && i < ch->nslots; i++) dt_mem_free(t->ops, ch->in[i]);
        for (int i = 0; ch->relay && i < ch->nrelay; i++) dt_mem_free(t->ops, ch->relay[i]);
        for (int i = 0; ch->gin && i < ch->ngin; i++) dt_mem_free(t->ops, ch->gin[i]);
        free(ch->in), free(ch->relay), free(ch->gin);
        dt_mem_free(t->ops, ch->gout);
        dt_mem_sub(DT_MEM_PARAMS, ch->held_params + ch->whole);   /* the model counts its own (it may outlive the run) */
        dt_mem_sub(DT_MEM_GRADS, ch->held_grads);
        if (j == p->j) continue;   /* the trainer's own, freed with it */
        dt_ddp_free(ch->ddp);
        dt_shard_free(ch->shard);
        dt_amp_free(ch->amp);
        dt_optim_free(ch->optim);
        dt_model_free(ch->model);
    }
    free(p->ch);
    dt_mem_free(t->ops, p->dbbuf);
    dt_mem_free(t->ops, p->host);
    if (p->dparts) t->ops->free(p->dparts);
    dt_pp_list_free(&p->list);
    dt_comm_destroy(p->pp_comm);
    dt_pp_cut_free(&p->cut);
    free(p->ride), free(p->roff), free(p->bch), free(p->parts), free(p->bbuf);
    free(p->losses), free(p->text), free(p->bnall);
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

static dt_status forward(trainer *t, pipe_chunk *ch, int m, uint64_t epoch, int64_t step) {
    train_pipe *p = t->pipe;
    size_t ss = (size_t)dt_dataset_get_info(t->train)->sample_size;
    int64_t sample_base = step * t->o->batch + (t->first_micro + m) * t->b;
    const float *x = ch->c == 0 ? t->dx + (size_t)m * (size_t)t->b * ss : ch->in[m % ch->nslots];
    if (ch->nsets > 1) DT_TRY(dt_model_act_use(ch->model, m % ch->nsets));
    if (t->bnrec_n) dt_model_set_bn_record(ch->model, t->bnrec + (size_t)(t->first_micro + m) * t->bnrec_n);
    DT_TRY(dt_model_forward_range(ch->model, p->layer_lo[ch->c], p->layer_lo[ch->c + 1], x, (int)t->b, 1, epoch,
                                  sample_base, &ch->out));
    ch->cur = m;
    return DT_OK;
}

static dt_status backward(trainer *t, pipe_chunk *ch, int m, uint64_t epoch, int64_t step, const void *target) {
    train_pipe *p = t->pipe;
    if (ch->nsets > 1) {
        DT_TRY(dt_model_act_use(ch->model, m % ch->nsets));   /* its activations, kept */
        ch->cur = m;
    }
    if (ch->cur != m) DT_TRY(forward(t, ch, m, epoch, step));   /* its activations again */
    for (int r = 0; ch->relay && r < p->nride; r++)   /* the tied parts that arrived for m, laid in place */
        if (p->ride[r].owner == ch->c)
            DT_TRY(t->ops->copy_d2d(dt_model_grads(ch->model) + p->ride[r].off, rider_grad(p, ch, r, m),
                                    p->ride[r].len * sizeof(float)));
    DT_TRY(dt_ddp_begin_micro(ch->ddp, m));
    ch->cur = -1;
    if (ch->c == t->pp * p->V - 1) {
        const void *tm = !dt_loss_def_of(t->lf.kind)->one_hot
                             ? (const void *)((const int32_t *)target + (size_t)m * (size_t)(t->b * t->lw))
                             : (const void *)((const float *)target + (size_t)m * (size_t)t->b * (size_t)t->C);
        DT_TRY(dt_model_loss_backward_to(ch->model, &t->lf, tm, (int)t->b, (float)t->o->batch, NULL, ch->gout));
        return t->ops->copy_d2d(t->dlosses + m, dt_model_loss_dev(ch->model), sizeof(float));
    }
    return dt_model_backward_range(ch->model, p->layer_lo[ch->c], p->layer_lo[ch->c + 1], ch->gin[m % ch->ngin],
                                   ch->gout);
}

dt_status dt_train_pipe_run_(trainer *t, uint64_t epoch, int64_t step, const void *target, double *wait) {
    train_pipe *p = t->pipe;
    *wait = 0.0;
    const size_t B = (size_t)t->b;
    const int P = t->pp, next = (t->stage + 1) % P, prev = (t->stage + P - 1) % P;
    sync(t);
    DT_TRY(t->ops->zero(t->dlosses, (size_t)t->k * sizeof(float)));
    /* mixed precision rounds the kept range's weights at the first forward; a tied tensor
     * this chunk reads lies outside it: rounded here, from what its owner sent */
    for (int j = 0; j < p->V; j++)
        for (int r = 0; r < p->nride; r++)
            if (p->ride[r].user == p->ch[j].c)
                DT_TRY(dt_model_params_arrived(p->ch[j].model, p->ride[r].layer, p->ride[r].off,
                                               p->ride[r].off + p->ride[r].len));
    for (int i = 0; i < p->list.n; i++) {
        dt_pp_action a = p->list.a[i];
        pipe_chunk *ch = &p->ch[a.chunk];
        const int c = ch->c;
        dt_status s = DT_OK;
        double t0 = a.op == DT_PP_FWD || a.op == DT_PP_BWD ? 0.0 : dt_now();   /* the boundary's waits */
        switch (a.op) {
        case DT_PP_FWD: s = forward(t, ch, a.micro, epoch, step); break;
        case DT_PP_BWD: s = backward(t, ch, a.micro, epoch, step, target); break;
        case DT_PP_RECV_ACT: s = xrecv(t, ch->in[a.micro % ch->nslots], B * ch->in_n, prev, TAG_ACT); break;
        case DT_PP_SEND_ACT:
            if (ch->cur != a.micro)
                return dt_error(DT_ERR_INTERNAL, "pipeline: stage %d sends the output of micro-batch %d, but holds %d's",
                                t->stage, a.micro, ch->cur);
            s = xsend(t, ch->out, B * ch->out_n, next, TAG_ACT);
            break;
        case DT_PP_RECV_GRAD:
            s = xrecv(t, ch->gin[a.micro % ch->ngin], B * ch->out_n, next, TAG_GRAD);
            /* tied parts on their way to their owner, or arriving there */
            for (int r = 0; s == DT_OK && r < p->nride; r++)
                if (p->ride[r].owner <= c && c < p->ride[r].user)
                    s = xrecv(t, rider_grad(p, ch, r, a.micro), p->ride[r].len, next, TAG_TIED);
            break;
        case DT_PP_SEND_GRAD:
            s = xsend(t, ch->gout, B * ch->in_n, prev, TAG_GRAD);
            for (int r = 0; s == DT_OK && r < p->nride; r++)
                if (p->ride[r].owner < c && c <= p->ride[r].user)
                    s = xsend(t, rider_grad(p, ch, r, a.micro), p->ride[r].len, prev, TAG_TIED);
            break;
        }
        char cn[32];
        if (s != DT_OK && (a.op == DT_PP_FWD || a.op == DT_PP_BWD))
            return dt_error_wrap(s, "pipeline stage %d%s, micro-batch %d: ", t->stage, chunk_name(p, c, cn, sizeof cn),
                                 a.micro);
        if (s != DT_OK) {   /* a neighbour that died or hangs: name its stage and rank */
            int peer = a.op == DT_PP_SEND_ACT || a.op == DT_PP_RECV_GRAD ? next : prev;
            return dt_error_wrap(s, "pipeline stage %d%s, micro-batch %d, %s stage %d (rank %d): ", t->stage,
                                 chunk_name(p, c, cn, sizeof cn), a.micro,
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
            for (int c = 0, l = 0; l < n; l++) {
                while (l >= p->layer_lo[c + 1]) c++;
                const dt_layer *L = dt_model_layer(t->model, l);
                if (!L->nrecord) continue;
                const float *from = p->bnall + ((size_t)(r * t->pp + c % t->pp) * k + i) * rec;
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
    sync(t);
    memset(p->parts, 0, p->nch * sizeof *p->parts);
    /* the chunks wholly in this rank's parts (each chunk's sum comes from one rank: the
     * sums over the world add zeros to it, which is exact) */
    for (int j = 0; j < p->V; j++) {
        size_t lo, hi;
        norm_part(t, p->ch[j].c, t->dpr, &lo, &hi);
        const float *g = dt_model_grads(p->ch[j].model);
        size_t c0 = (lo + C - 1) / C, c1 = hi == n ? p->nch : hi / C;
        if (hi > lo && c1 > c0) {
            size_t end = c1 * C < n ? c1 * C : n;
            DT_TRY(ops->sumsq_chunks(p->dparts, g + c0 * C, end - c0 * C));
            DT_TRY(ops->copy_d2h(p->parts + c0, p->dparts, (c1 - c0) * sizeof(double)));
        }
    }
    DT_TRY(dt_allreduce(t->comm, p->parts, p->parts, p->nch, DT_F64, DT_SUM));
    /* the chunks the parts' edges cut: every part's values of them, summed whole */
    if (p->nbc) {
        memset(p->bbuf, 0, (size_t)p->nbc * C * sizeof(float));
        for (int j = 0; j < p->V; j++) {
            size_t lo, hi;
            norm_part(t, p->ch[j].c, t->dpr, &lo, &hi);
            const float *g = dt_model_grads(p->ch[j].model);
            for (int e = 0; e < p->nbc; e++) {
                size_t a = p->bch[e] * C, z = a + C < n ? a + C : n;
                size_t x = lo > a ? lo : a, y = hi < z ? hi : z;
                if (x < y) DT_TRY(ops->copy_d2h(p->bbuf + (size_t)e * C + (x - a), g + x, (y - x) * sizeof(float)));
            }
        }
        DT_TRY(dt_allreduce(t->comm, p->bbuf, p->bbuf, (size_t)p->nbc * C, DT_F32, DT_SUM));
        DT_TRY(ops->copy_h2d(p->dbbuf, p->bbuf, (size_t)p->nbc * C * sizeof(float)));
        for (int e = 0; e < p->nbc; e++) {
            size_t a = p->bch[e] * C, z = a + C < n ? a + C : n;
            DT_TRY(ops->sumsq_chunks(p->dparts, p->dbbuf + (size_t)e * C, z - a));
            DT_TRY(ops->copy_d2h(p->parts + p->bch[e], p->dparts, sizeof(double)));
        }
    }
    double sq = dt_pairwise_sum(p->parts, p->nch);
    float total = dt_clip_norm(sq, unscale);
    if (norm) *norm = total;
    float coef = dt_clip_coef(max_norm, total);
    for (int j = 0; coef < 1.0f && j < p->V; j++) {
        size_t alo, alen;   /* what this rank applies */
        dt_shard_range(p->ch[j].shard, &alo, &alen);
        if (alen) DT_TRY(ops->scale(dt_model_grads(p->ch[j].model) + alo, coef, alen));
    }
    return DT_OK;
}

/* The chunk of this stage that is the cut's chunk c; NULL if another stage runs it. */
static pipe_chunk *chunk_of(trainer *t, int c) {
    return c % t->pp == t->stage ? &t->pipe->ch[c / t->pp] : NULL;
}

dt_status dt_train_pipe_after_step_(trainer *t) {
    train_pipe *p = t->pipe;
    sync(t);
    for (int r = 0; r < p->nride; r++) {
        const dt_pp_rider *R = &p->ride[r];
        pipe_chunk *o = chunk_of(t, R->owner), *u = chunk_of(t, R->user);
        if (o) DT_TRY(xsend(t, dt_model_params(o->model) + R->off, R->len, R->user % t->pp, TAG_PARAM));
        if (u) DT_TRY(xrecv(t, dt_model_params(u->model) + R->off, R->len, R->owner % t->pp, TAG_PARAM));
    }
    return DT_OK;
}

dt_status dt_train_pipe_gather_(trainer *t) {
    train_pipe *p = t->pipe;
    dt_train_pipe_use_(t, 0);
    sync(t);
    pipe_chunk *ch0 = &p->ch[0];
    float *params = dt_model_params(ch0->model);
    size_t n = dt_model_nparams(ch0->model);
    if (!ch0->whole) {   /* the other chunks' pages, back and counted */
        if (ch0->keep_lo > 0) DT_TRY(t->ops->populate(params, ch0->keep_lo * sizeof(float)));
        if (n > ch0->keep_hi) DT_TRY(t->ops->populate(params + ch0->keep_hi, (n - ch0->keep_hi) * sizeof(float)));
        ch0->whole = outside_bytes(ch0);
        dt_mem_add(DT_MEM_PARAMS, ch0->whole);
    }
    for (int c = 0; c < t->pp * p->V; c++) {
        pipe_chunk *own = chunk_of(t, c);
        size_t len = p->plo[c + 1] - p->plo[c];
        if (own && own != ch0) {   /* another of this stage's chunks: sent from its model, copied into ours */
            float *from = dt_model_params(own->model) + p->plo[c];
            DT_TRY(xbcast(t, from, len, c % t->pp));
            DT_TRY(t->ops->copy_d2d(params + p->plo[c], from, len * sizeof(float)));
        } else {
            DT_TRY(xbcast(t, params + p->plo[c], len, c % t->pp));
        }
    }
    dt_model_set_resident(ch0->model, 0, n);   /* mixed precision rounds every layer's weights again */
    return dt_model_acts_all(ch0->model);      /* and every layer may run */
}
