/*
 * plan.c: per-rank memory estimates (see plan.h): the two tables of rows, and the
 * one formula that reads them.
 */
#include "plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"    /* dt_comm_shm_plan */
#include "dtype.h"
#include "lowp.h"    /* dt_lowp_copy_floats */
#include "ops.h"     /* dt_ops_gemm_lp_rounds */
#include "ddp.h"     /* dt_ddp_tree_arrays, dt_ddp_opts_default */
#include "optim.h"
#include "pipeline.h" /* dt_pp_cut_chunks, dt_pp_chunk_held, dt_pp_riders, dt_pp_keep, dt_pp_norm_edges */
#include "shard.h"   /* dt_shard_prefetch_parse, dt_shard_floats, dt_shard_pool_in_use */

/* ---- the rows ------------------------------------------------------------------------ */

static const dt_plan_shard shards[] = {
    { .name = "none", .help = "every rank holds everything (DDP)" },
    { .name = "optim", .optim_sharded = 1, .help = "ZeRO-1: optimizer state of P/W parameters" },
    /* the gradient array stays whole as backward's output; the reduce-scatter is in place */
    { .name = "grads", .optim_sharded = 1,
      .help = "ZeRO-2: as optim, gradients reduce-scattered (the array stays whole)" },
    /* the current and the prefetched unit of parameters; a unit's worth of finished
     * gradient being summed (shard.c). With --backward-prefetch post, one unit of
     * parameters less: two units at most (forward's two of parameters count the same
     * bytes in fp32) */
    { .name = "params", .optim_sharded = 1, .grads_sharded = 1, .params_sharded = 1, .gather_units = 2,
      .grad_units = 1, .help = "ZeRO-3 / FSDP: 1/W of everything, plus two units gathered" },
};

static const dt_plan_precision precisions[] = {
    { .name = "fp32", .master_bytes = 4, .copy_bytes = 0, .grad_bytes = 4, .state_bytes = 4, .gather_bytes = 4,
      .act_factor = 1.0, .help = "everything in 4 bytes" },
    /* the matrix products read rounded values held in f32 (lowp.h): a copy of the whole
     * parameter array, or with --shard params the gathered units rounded in place */
    { .name = "bf16", .master_bytes = 4, .copy_bytes = 4, .grad_bytes = 4, .state_bytes = 4, .gather_bytes = 4,
      .act_factor = 1.0, .lp = DT_BF16,
      .help = "fp32 master weights and state, a rounded copy of the weights (none with params, or on 16-bit units)" },
    { .name = "fp16", .master_bytes = 4, .copy_bytes = 4, .grad_bytes = 4, .state_bytes = 4, .gather_bytes = 4,
      .act_factor = 1.0, .lp = DT_F16, .help = "as bf16, with loss scaling" },
};

const dt_plan_shard *dt_plan_shards(int *n) {
    *n = (int)(sizeof shards / sizeof shards[0]);
    return shards;
}

const dt_plan_precision *dt_plan_precisions(int *n) {
    *n = (int)(sizeof precisions / sizeof precisions[0]);
    return precisions;
}

const dt_plan_shard *dt_plan_shard_find(const char *name) {
    for (size_t i = 0; name && i < sizeof shards / sizeof shards[0]; i++)
        if (!strcmp(shards[i].name, name)) return &shards[i];
    return NULL;
}

const dt_plan_precision *dt_plan_precision_find(const char *name) {
    for (size_t i = 0; name && i < sizeof precisions / sizeof precisions[0]; i++)
        if (!strcmp(precisions[i].name, name)) return &precisions[i];
    return NULL;
}

/* ---- the formula ------------------------------------------------------------------------ */

/* n parameters of `bytes` each, divided over w ranks when sharded (shard.c's shards) */
static int64_t shard_floats(int64_t n, int64_t w) { return (int64_t)dt_shard_floats((size_t)n, (int)w); }

static size_t per_rank(int64_t n, int bytes, int sharded, int w) {
    int64_t k = sharded ? shard_floats(n, w) : n;
    return (size_t)(k < n ? k : n) * (size_t)bytes;
}

/* An array of n parameters of `bytes` each held whole on a rank: with any sharding the
 * model's arrays are W shards long (shard.c, dt_shard_layout), the last shard padded */
static size_t whole(int64_t n, int bytes, int sharding, int w) {
    int64_t k = sharding ? shard_floats(n, w) * w : n;
    return (size_t)(k > n ? k : n) * (size_t)bytes;
}

/* Mixed precision's memory beside the master weights, for the whole model and a pipeline's
 * stage alike: *lp_scratch the bytes of its scratch (none in fp32), and whether it keeps a
 * rounded copy of the weights (1), which it does not where the device's gemm_lp rounds
 * its operands itself (dt_ops_gemm_lp_rounds) and no row rounds for another op. */
static int lp_rounding(const dt_plan_opts *o, const dt_plan_precision *pr, const dt_model_mem *mm, size_t *lp_scratch) {
    int rounds = pr->lp && o->ops && dt_ops_gemm_lp_rounds(o->ops, pr->lp);
    *lp_scratch = !pr->copy_bytes ? 0 : rounds ? mm->lp_scratch_rounding : mm->lp_scratch;
    return pr->copy_bytes && (!rounds || mm->lp_copy_rounding);
}

/* The CPU's pool of --shard params (shard.c) on the rank it costs most: *pool_bytes its
 * slots, *grad_bytes the most of them holding gradients at once. A rank's slots are the
 * size of its largest unit that is not wholly in its own shard (in mixed precision none
 * is: every unit is rounded in a slot); its own units are read where they lie and take
 * none. The slots in use at once for its longest run of such units: dt_shard_pool_in_use. */
static dt_status pool_slots(const dt_plan_opts *o, size_t unit_floats, int lowp, int post, size_t *pool_bytes,
                            size_t *grad_bytes) {
    *pool_bytes = *grad_bytes = 0;
    dt_spec sp;
    DT_TRY(dt_spec_parse(o->train->model, &sp));
    dt_status s = dt_spec_infer(&sp, &o->input);
    int *unit = s == DT_OK ? calloc((size_t)sp.n + 1, sizeof *unit) : NULL;
    if (s == DT_OK && !unit) s = dt_error(DT_ERR_NOMEM, "plan: out of memory");
    int nu = s == DT_OK ? dt_spec_units(&sp, unit_floats, unit, NULL) : 0;
    struct { size_t lo, hi, floats; } *U = s == DT_OK ? calloc((size_t)nu + 1, sizeof *U) : NULL;   /* per unit */
    if (s == DT_OK && !U) s = dt_error(DT_ERR_NOMEM, "plan: out of memory");
    const int64_t W = o->world, n = sp.nparams;
    for (int u = 0; s == DT_OK && u < nu; u++) U[u].lo = (size_t)n;
    for (int i = 0; s == DT_OK && i < sp.n; i++) {   /* each unit's tensors: their extent and floats */
        const dt_layer *L = &sp.layers[i];
        for (int t = 0; t < L->ntensors; t++) {
            const dt_layer_tensor *T = &L->t[t];
            if ((T->role != DT_TENSOR_PARAM && T->role != DT_TENSOR_TIED) || T->numel == 0) continue;
            int u = unit[i];
            if (T->offset < U[u].lo) U[u].lo = T->offset;
            if (T->offset + (size_t)T->numel > U[u].hi) U[u].hi = T->offset + (size_t)T->numel;
            U[u].floats += (size_t)T->numel;
        }
    }
    const size_t per = (size_t)shard_floats(n, W);
    for (int64_t r = 0; s == DT_OK && r < W; r++) {
        size_t mine = per * (size_t)r, end = mine + per, slot = 0;
        int run = 0, longest = 0;
        for (int u = 0; u < nu; u++) {
            int own = !lowp && U[u].floats && U[u].lo >= mine && U[u].hi <= end;
            run = own || !U[u].floats ? 0 : run + 1;
            if (run > longest) longest = run;
            if (!own && U[u].floats > slot) slot = U[u].floats;
        }
        int slots, gslots;
        dt_shard_pool_in_use(longest, post, &slots, &gslots);
        if ((size_t)slots * slot * sizeof(float) > *pool_bytes) {
            *pool_bytes = (size_t)slots * slot * sizeof(float);
            *grad_bytes = (size_t)gslots * slot * sizeof(float);
        }
    }
    free(U);
    free(unit);
    dt_spec_free(&sp);
    return s;
}

/* DDP's accumulation beside the gradient of the whole model, floats (ddp.h; in place
 * but with sharded parameters). */
static dt_status tree_floats(const dt_plan_opts *o, int64_t k, int in_place, size_t *out) {
    dt_spec sp;
    DT_TRY(dt_spec_parse(o->train->model, &sp));
    dt_status s = dt_spec_infer(&sp, &o->input);
    if (s == DT_OK) *out = dt_ddp_tree_floats(sp.layers, sp.n, k, 0, (size_t)sp.nparams, in_place);
    dt_spec_free(&sp);
    return s;
}

/* The whole model on every rank (no pipeline). */
static dt_status plan_whole(const dt_plan_opts *o, const dt_plan_shard *sh, const dt_plan_precision *pr,
                            dt_plan_estimate *out) {
    const dt_train_opts *t = o->train;
    memset(out, 0, sizeof *out);
    int W = o->world;
    if (W < 1) return dt_error(DT_ERR_INVALID, "world: expected at least 1 rank, got %d", W);
    int64_t S = t->micro_batches > 0 ? t->micro_batches : W, k, b;
    DT_TRY(dt_train_split(t->batch, S, W, &k, &b));
    if (b > (1 << 30)) return dt_error(DT_ERR_INVALID, "batch: micro-batches of %lld samples are too large", (long long)b);
    dt_optim_config cfg;
    DT_TRY(dt_train_optim_config(t, &cfg));
    dt_model_opts mo;
    dt_model_opts_default(&mo);
    mo.recompute = t->recompute;
    mo.act_dtype = pr->lp;   /* 0 (f32) for fp32 */
    mo.unit_floats = t->shard_unit_mb > 0 ? (size_t)(t->shard_unit_mb * 1048576.0) / sizeof(float) : 0;
    dt_model_mem *mm = &out->model;
    DT_TRY(dt_model_plan_memory(t->model, &o->input, (int)b, &mo, mm));
    int64_t P = mm->nparams;
    size_t *B = out->bytes;
    dt_shard_prefetch pf;
    DT_TRY(dt_shard_prefetch_parse(t->backward_prefetch, &pf));
    int gather_units = sh->gather_units - (sh->params_sharded && pf == DT_PREFETCH_POST);
    int grad_units = sh->grad_units, pool = 0;
    DT_TRY(dt_shard_pool_env(&pool));
    /* the CPU's pool: its slots count under params while free and under grads while a
     * unit's gradient is written in them, so the total holds them once */
    size_t pool_bytes = 0, pool_grads = 0;
    if (sh->params_sharded && pool && W > 1) {
        DT_TRY(pool_slots(o, mo.unit_floats ? mo.unit_floats : DT_MODEL_UNIT_FLOATS, pr->copy_bytes != 0,
                          pf == DT_PREFETCH_POST, &pool_bytes, &pool_grads));
        gather_units = grad_units = 0;
    }

    /* parameters: master weights (their shard), the rounded copy (not with the pool: its
     * units are rounded where they were gathered; lp_rounding says where else not),
     * buffers, gathered units */
    size_t lp_scratch;
    int copy = lp_rounding(o, pr, mm, &lp_scratch) && !(sh->params_sharded && pool && W > 1);
    int sharding = sh->optim_sharded || sh->grads_sharded || sh->params_sharded;
    B[DT_MEM_PARAMS] = (sh->params_sharded ? per_rank(P, pr->master_bytes, 1, W) : whole(P, pr->master_bytes, sharding, W)) +
                       (copy ? (size_t)P * (size_t)pr->copy_bytes : 0) +
                       mm->nbuffers * sizeof(float) + pool_bytes +
                       (size_t)gather_units * (size_t)mm->unit_params_max * (size_t)pr->gather_bytes;
    /* gradients: the model's array (or its shard) and DDP's accumulation tree */
    size_t tree = 0;
    if (k > 1) DT_TRY(tree_floats(o, k, !(sh->params_sharded && W > 1), &tree));
    B[DT_MEM_GRADS] = (sh->grads_sharded ? per_rank(P, pr->grad_bytes, 1, W) : whole(P, pr->grad_bytes, sharding, W)) +
                      (size_t)grad_units * (size_t)mm->unit_params_max * (size_t)pr->grad_bytes + pool_grads +
                      tree * sizeof(float);
    B[DT_MEM_OPTIM] = (size_t)dt_optim_nstate_of(&cfg) * per_rank(P, pr->state_bytes, sh->optim_sharded, W);
    B[DT_MEM_ACTS] = (size_t)((double)mm->bytes[DT_MEM_ACTS] * pr->act_factor) + lp_scratch;
    if (sh->grad_bucket) {
        dt_ddp_opts d;
        dt_ddp_opts_default(&d);
        size_t bucket = t->bucket_mb > 0 ? (size_t)(t->bucket_mb * 1048576.0) : d.bucket_bytes;
        size_t all = (size_t)P * (size_t)pr->grad_bytes;
        B[DT_MEM_COMM] = bucket < all ? bucket : all;
    }
    /* the tcp backend's shared-memory rings, the ranks on one host */
    size_t rings;
    DT_TRY(dt_comm_shm_plan(W, &rings));
    B[DT_MEM_COMM] += rings;
    /* other: the model's scalars, the step's batch (k micro-batches), the batchnorm
     * records of S micro-batches (replayed unless synchronised), evaluation's batch while
     * it runs, and the step's k losses and its 3 checks (train.c's dlosses) */
    int64_t ss = dt_shape_numel(&o->input);
    dt_train_batch_bytes step = dt_train_batch_size(k * b, ss, o->labels, 0, 0);
    dt_train_batch_bytes eval = dt_train_batch_size(b, ss, o->labels, 0, 0);
    size_t bnrec = (t->sync_bn && W > 1) ? 0 : (size_t)S * mm->nrecord * sizeof(float);
    B[DT_MEM_OTHER] = mm->bytes[DT_MEM_OTHER] + step.x + step.y + bnrec + (t->eval ? eval.x + eval.y : 0) +
                      (size_t)(k + 3) * sizeof(float);
    for (int c = 0; c < DT_MEM_NCAT; c++) out->total += B[c];
    out->shared = pool_grads;   /* the slots holding gradients: counted under params too */
    out->total -= out->shared;
    out->nparams = P;
    out->micro_batches = S;
    out->local_micro = k;
    out->micro_size = b;
    return DT_OK;
}

/* ---- a pipeline's stage ------------------------------------------------------------------ */

/* One chunk of a stage (the stage itself but for the interleaved schedule): what it
 * holds of the arrays and the boundary tensors, in floats and bytes (train_pipe.c's
 * pipe_chunk). */
typedef struct {
    int c;                     /* its index in the cut of P x V chunks */
    size_t keep, rider, mine;  /* floats: its kept range, the tied tensors it reads, its own parameters */
    size_t copy, tree, relay;  /* floats: its rounded copy, its accumulation tree, its relay slots */
    size_t own, acts, bound;   /* bytes: its layers' own buffers, their activations in a step, the boundary slots */
    int inputs, sets;
} plan_chunk;

/* What stage `stage` holds, at each moment of the run (train_pipe.c). Each of its V chunks
 * has a model of its own, built with every layer's buffers and its range kept; the
 * others' buffers go at once, and the chunks are built V - 1 down to 0:
 *   start  the chunks built before, each with its own layers' buffers, beside chunk 0's
 *          model whole; then chunk by chunk (0 first) its activation sets taken beside its
 *          layers' own buffers, which they replace, and its boundary slots
 *   step   each chunk's range, the tied tensors it reads or relays, its tree, the optimizer
 *          state, its layers' activations in flight, its boundary tensors; the batch
 *   eval   chunk 0 gathers every chunk's parameters and takes every layer's buffers again
 *   end    the same, the optimizer state given back first */
static dt_status plan_stage(const dt_plan_opts *o, const dt_plan_shard *sh, const dt_plan_precision *pr, int stage,
                            dt_plan_estimate *out) {
    const dt_train_opts *t = o->train;
    memset(out, 0, sizeof *out);
    const int W = o->world, P = t->pipeline, V = t->virtual_stages > 1 ? t->virtual_stages : 1, C = P * V;
    if (W < 1) return dt_error(DT_ERR_INVALID, "world: expected at least 1 rank, got %d", W);
    int64_t S = t->micro_batches > 0 ? t->micro_batches : W, k, b;
    DT_TRY(dt_train_pipe_check(t, W, S));
    const int dp = W / P;
    DT_TRY(dt_train_split(t->batch, S, dp, &k, &b));
    if (b > (1 << 30)) return dt_error(DT_ERR_INVALID, "batch: micro-batches of %lld samples are too large", (long long)b);
    if (stage < 0 || stage >= P) return dt_error(DT_ERR_INVALID, "plan: stage %d outside 0-%d", stage, P - 1);
    if (sh->params_sharded)   /* dt_train_pipe_check refuses --shard params: the row, named */
        return dt_error(DT_ERR_UNSUPPORTED, "pipeline: --shard %s with --pipeline is not supported yet", sh->name);
    dt_optim_config cfg;
    DT_TRY(dt_train_optim_config(t, &cfg));
    dt_shard_mode mode;
    DT_TRY(dt_shard_parse(sh->name, &mode));
    dt_model_opts mo;
    dt_model_opts_default(&mo);
    mo.recompute = t->recompute;
    mo.act_dtype = pr->lp;
    dt_model_mem *mm = &out->model;
    DT_TRY(dt_model_plan_memory(t->model, &o->input, (int)b, &mo, mm));

    dt_spec sp;
    DT_TRY(dt_spec_parse(t->model, &sp));
    dt_pp_cut cut = {0};
    dt_pp_rider *ride = NULL;
    dt_pp_list list = {0};
    int nride = 0;
    size_t *own = calloc((size_t)C, sizeof *own), *set = calloc((size_t)C, sizeof *set);
    size_t *bch = calloc((size_t)W * (size_t)V, sizeof *bch);
    plan_chunk *ch = calloc((size_t)V, sizeof *ch);
    dt_status s = own && set && bch && ch ? dt_spec_infer(&sp, &o->input) : dt_error(DT_ERR_NOMEM, "plan: out of memory");
    if (s == DT_OK) s = dt_pp_cut_chunks(&sp, P, V, t->stages, &cut);
    if (s == DT_OK) s = dt_pp_riders(&cut, sp.layers, sp.n, &ride, &nride);
    if (s == DT_OK) s = dt_model_plan_ranges(t->model, &o->input, (int)b, &mo, C, cut.layer_lo, own, set);
    if (s == DT_OK) s = dt_pp_build(dt_pp_find(t->pipeline_schedule), P, V, stage, (int)k, &list);
    if (s != DT_OK) goto done;

    const int sharding = sh->optim_sharded || sh->grads_sharded;
    const size_t n = (size_t)mm->nparams;
    size_t rlen = 0, own_all = 0;   /* a relay slot's floats; every layer's own buffers */
    for (int r = 0; r < nride; r++) rlen += ride[r].len;
    for (int c = 0; c < C; c++) own_all += own[c];
    size_t lp;
    const int keeps_copy = lp_rounding(o, pr, mm, &lp);
    /* a model's activations: its fixed buffers (backward's, the head, the scratch, the
     * arena, mixed precision's scratch) and every layer's own, or (recomputation, whose
     * blocks share one arena) all of them in every chunk's model */
    const size_t acts = mm->bytes[DT_MEM_ACTS] + lp, fixed = acts - own_all, bufs = mm->nbuffers * sizeof(float);
    size_t keep_all = 0, rider_all = 0, mine_all = 0, copy_all = 0, tree_all = 0, relay_all = 0, bound_all = 0;
    size_t acts_all = 0, all0 = n;
    int64_t sends = 0;
    char *mods = out->modules;   /* (zeroed with *out) */
    int cut_off = 0;
    for (int j = 0; j < V; j++) {
        plan_chunk *q = &ch[j];
        q->c = j * P + stage;
        size_t lo, hi;
        dt_pp_keep(&cut, q->c, dp, sharding, &lo, &hi);
        q->keep = hi - lo;
        q->mine = cut.plo[q->c + 1] - cut.plo[q->c];
        dt_pp_rider_floats(ride, nride, q->c, &q->rider);
        int grads, unsent;
        if ((s = dt_pp_chunk_held(&list, j, &q->inputs, &q->sets, &grads, &unsent)) != DT_OK) goto done;
        if (t->recompute) q->sets = 1;   /* a backward runs its forward again */
        if (q->c < C - 1 && grads < 1) grads = 1;
        q->relay = (size_t)dt_pp_relay_slots(ride, nride, q->c, unsent, grads) * rlen;
        const dt_layer *first = &sp.layers[cut.layer_lo[q->c]], *last = &sp.layers[cut.layer_lo[q->c + 1] - 1];
        q->bound = ((q->c > 0 ? (size_t)(q->inputs + 1) * (size_t)first->in_numel : 0) +
                    (q->c < C - 1 ? (size_t)grads * (size_t)last->out_numel : 0)) * (size_t)b * sizeof(float);
        sends += k * b * ((q->c < C - 1 ? last->out_numel : 0) + (q->c > 0 ? first->in_numel : 0));
        q->own = own[q->c];
        q->acts = t->recompute ? acts : fixed + (q->sets > 1 ? (size_t)q->sets * set[q->c] : own[q->c]);
        /* the rounded copy (lowp.c), partial: the GEMM weights of the chunk's range and of
         * the tied tensors it reads */
        if (keeps_copy) {
            q->copy = dt_lowp_copy_floats(&sp, lo, hi);
            for (int r = 0; r < nride; r++)
                if (ride[r].user == q->c) q->copy += dt_lowp_copy_floats(&sp, ride[r].off, ride[r].off + ride[r].len);
        }
        q->tree = dt_ddp_tree_floats(sp.layers, sp.n, k, cut.plo[q->c], cut.plo[q->c + 1], 1);
        if (j == 0) all0 = hi > n ? hi : n;   /* gathered: every chunk's, and its padding */
        out->work += cut.work[q->c];
        keep_all += q->keep, rider_all += q->rider, mine_all += q->mine, copy_all += q->copy;
        tree_all += q->tree, relay_all += q->relay, bound_all += q->bound, acts_all += q->acts;
        int ma = cut.mod_lo[q->c], mb = cut.mod_lo[q->c + 1] - 1;   /* "A-B" a chunk, "A" for one module */
        char run[32];
        if (mb > ma) snprintf(run, sizeof run, "%s%d-%d", j ? "," : "", ma, mb);
        else snprintf(run, sizeof run, "%s%d", j ? "," : "", ma);
        size_t room = sizeof out->modules - strlen(mods) - 1, more = j + 1 < V ? 4 : 0;   /* ",..." may follow */
        if (!cut_off && strlen(run) + more <= room) strcat(mods, run);
        else if (!cut_off++) strcat(mods, ",...");   /* the rest left out */
        out->in_flight += q->sets;
        out->inputs += q->c > 0 ? q->inputs : 0;
    }
    const plan_chunk *c0 = &ch[0];

    /* activations at the start (before mixed precision's scratch: dt_amp_init follows the
     * chunks' set-up), in a step (and the boundary tensors), and gathered */
    size_t a_start = (size_t)V * (acts - lp), a_step = acts_all + bound_all, a_gather = a_step;
    if (!t->recompute) {
        const size_t F = fixed - lp;
        size_t rest = 0;   /* the chunks built before chunk 0's model, or not yet set up */
        for (int j = 1; j < V; j++) rest += F + ch[j].own;
        a_start = rest + F + own_all;
        size_t done = 0;
        for (int j = 0; j < V; j++) {   /* chunk j's sets beside its layers' own buffers */
            if (j > 0) rest -= F + ch[j].own;
            size_t now = done + rest + F + ch[j].own + (ch[j].sets > 1 ? (size_t)ch[j].sets * set[ch[j].c] : 0);
            if (now > a_start) a_start = now;
            done += ch[j].acts - lp + ch[j].bound;
        }
        a_gather = a_step + own_all - c0->own;
    }
    size_t *B = out->bytes;
    /* parameters: each chunk's kept range, buffers, the tied tensors it reads and its
     * rounded copy; gathered, chunk 0 holds every one (and rounds all of them once an
     * evaluation ran the gathered model; the end gathers without a forward) */
    size_t copy_whole = keeps_copy ? dt_lowp_copy_floats(&sp, 0, n) : 0;
    size_t p_start = keep_all * (size_t)pr->master_bytes + (size_t)V * bufs;
    size_t p_step = p_start + (rider_all * sizeof(float) + copy_all * (size_t)pr->copy_bytes);
    size_t p_gather = p_step - (c0->keep * (size_t)pr->master_bytes + c0->rider * sizeof(float)) +
                      all0 * (size_t)pr->master_bytes;
    if (t->eval) p_gather += (copy_whole - c0->copy) * (size_t)pr->copy_bytes;
    B[DT_MEM_PARAMS] = p_step > p_gather ? p_step : p_gather;
    B[DT_MEM_GRADS] = (keep_all + rider_all) * (size_t)pr->grad_bytes + (tree_all + relay_all) * sizeof(float);
    B[DT_MEM_OPTIM] = 0;
    for (int j = 0; j < V; j++)
        B[DT_MEM_OPTIM] += (size_t)dt_optim_nstate_of(&cfg) * per_rank((int64_t)ch[j].mine, pr->state_bytes,
                                                                       sh->optim_sharded, dp);
    B[DT_MEM_ACTS] = a_start > a_step ? a_start : a_step;
    if (a_gather > B[DT_MEM_ACTS]) B[DT_MEM_ACTS] = a_gather;
    if (sh->grad_bucket) {   /* each chunk's DDP */
        dt_ddp_opts d;
        dt_ddp_opts_default(&d);
        size_t bucket = t->bucket_mb > 0 ? (size_t)(t->bucket_mb * 1048576.0) : d.bucket_bytes;
        for (int j = 0; j < V; j++)
            B[DT_MEM_COMM] += bucket < ch[j].mine * (size_t)pr->grad_bytes ? bucket : ch[j].mine * (size_t)pr->grad_bytes;
    }
    size_t rings, one;
    if ((s = dt_comm_shm_plan(W, &rings)) != DT_OK || (s = dt_comm_shm_ring(W, &one)) != DT_OK) goto done;
    /* beyond the collectives' partners (halving/doubling on a power-of-two host: ranks
     * whose XOR is a power of two), a ring for each direction of traffic with another
     * rank: both to a neighbouring stage (with chunks, the last stage's neighbour is the
     * first), one from a tied tensor's owner to its user. Stage s of replica 0 is rank s. */
    int nb[4] = {stage - 1, stage + 1, V > 1 ? (stage + P - 1) % P : -1, V > 1 ? (stage + 1) % P : -1};
    for (int i = 0; (W & (W - 1)) == 0 && i < 4; i++) {
        int x = nb[i] ^ stage, seen = 0;
        for (int e = 0; e < i; e++) seen |= nb[e] == nb[i];
        if (!seen && nb[i] >= 0 && nb[i] < P && nb[i] != stage && (x & (x - 1)) != 0) rings += 2 * one;
    }
    for (int i = 0; (W & (W - 1)) == 0 && i < nride; i++) {
        int so = ride[i].owner % P, su = ride[i].user % P;
        int peer = so == stage ? su : su == stage ? so : -1, x = peer ^ stage, near = 0;
        for (int e = 0; e < 4; e++) near |= nb[e] == peer;
        if (peer >= 0 && peer != stage && !near && (x & (x - 1)) != 0) rings += one;
    }
    B[DT_MEM_COMM] += rings;
    /* other: as the whole model's, a model's each chunk (every stage loads its replica's
     * batch), and the norm's chunks that the chunks' (or their shards') edges cut */
    int64_t ss = dt_shape_numel(&o->input);
    dt_train_batch_bytes step = dt_train_batch_size(k * b, ss, o->labels, 0, 0);
    dt_train_batch_bytes eval = dt_train_batch_size(b, ss, o->labels, 0, 0);
    int nbc = dt_pp_norm_edges(&cut, dp, dt_shard_mode_grads(mode), DT_SUM_CHUNK, bch);
    size_t o_step = (size_t)V * mm->bytes[DT_MEM_OTHER] + step.x + step.y + (size_t)S * mm->nrecord * sizeof(float) +
                    (size_t)(k + 3) * sizeof(float) + (size_t)nbc * DT_SUM_CHUNK * sizeof(float);
    size_t o_eval = t->eval ? eval.x + eval.y : 0;
    B[DT_MEM_OTHER] = o_step + o_eval;
    /* the moments */
    const size_t comm = B[DT_MEM_COMM], g = B[DT_MEM_GRADS], opt = B[DT_MEM_OPTIM];
    size_t m_start = p_start + keep_all * (size_t)pr->grad_bytes + a_start + rings + (size_t)V * mm->bytes[DT_MEM_OTHER];
    size_t m_step = p_step + g + opt + a_step + comm + o_step;
    size_t m_eval = t->eval ? p_gather + g + opt + a_gather + comm + o_step + o_eval : 0;
    size_t m_end = p_gather + g + a_gather + comm + o_step;
    out->total = m_step;
    if (m_start > out->total) out->total = m_start;
    if (m_eval > out->total) out->total = m_eval;
    if (m_end > out->total) out->total = m_end;
    size_t sum = 0;
    for (int c = 0; c < DT_MEM_NCAT; c++) sum += B[c];
    out->shared = sum - out->total;   /* the categories' peaks come at different moments */
    out->step_total = m_step;
    out->nparams = mm->nparams;
    out->micro_batches = S;
    out->local_micro = k;
    out->micro_size = b;
    out->stages = P;
    out->chunks = V;
    out->by_params = t->stages && !strcmp(t->stages, "params");
    out->stage = stage;
    out->replicas = dp;
    out->stage_params = (int64_t)mine_all;
    out->pipe_sends = sends;
done:
    dt_pp_list_free(&list);
    dt_pp_cut_free(&cut);
    free(ride);
    free(own);
    free(set);
    free(bch);
    free(ch);
    dt_spec_free(&sp);
    return s;
}

/* Every stage of the cut o's options name (auto and params taken as they are): the
 * largest into *out, each into stages[] (may be NULL). */
static dt_status plan_stages(const dt_plan_opts *o, const dt_plan_shard *sh, const dt_plan_precision *pr,
                             dt_plan_estimate *out, dt_plan_estimate *stages) {
    /* the verdict is per rank: the stage that needs the most decides */
    double most = 0.0;
    for (int st = 0; st < o->train->pipeline; st++) {
        dt_plan_estimate e;
        DT_TRY(plan_stage(o, sh, pr, st, &e));
        if (stages) stages[st] = e;
        if (st == 0 || e.total > out->total) *out = e;
        if (e.work > most) most = e.work;
    }
    out->most_work = most;
    for (int st = 0; stages && st < o->train->pipeline; st++) stages[st].most_work = most;
    return DT_OK;
}

dt_status dt_plan_stages(const dt_plan_opts *o, const dt_plan_shard *sh, const dt_plan_precision *pr,
                         const char **text, size_t *work, size_t *params) {
    const dt_train_opts *t = o->train;
    *text = t->stages;
    if (work) *work = 0;
    if (params) *params = 0;
    if (t->pipeline <= 1 || (t->stages && strcmp(t->stages, "auto")) || !t->max_memory) return DT_OK;
    dt_train_opts a = *t;
    dt_plan_opts q = *o;
    q.train = &a;
    dt_plan_estimate ew, ep;
    a.stages = "auto";
    DT_TRY(plan_stages(&q, sh, pr, &ew, NULL));
    if (work) *work = ew.total;
    if (ew.total <= t->max_memory) return DT_OK;
    a.stages = "params";
    if (plan_stages(&q, sh, pr, &ep, NULL) != DT_OK) {   /* the work's cut stands, and the cap will say */
        dt_error_clear();
        return DT_OK;
    }
    if (params) *params = ep.total;
    if (ep.total <= t->max_memory) *text = "params";
    return DT_OK;
}

/* o with its --stages as dt_plan_stages resolves it, in *t (o's train options). */
static dt_status resolved(const dt_plan_opts *o, const dt_plan_shard *sh, const dt_plan_precision *pr,
                          dt_plan_opts *q, dt_train_opts *t) {
    *t = *o->train;
    *q = *o;
    q->train = t;
    return dt_plan_stages(o, sh, pr, &t->stages, NULL, NULL);
}

dt_status dt_plan_run_stage(const dt_plan_opts *o, const dt_plan_shard *sh, const dt_plan_precision *pr, int stage,
                            dt_plan_estimate *out) {
    if (o->train->pipeline <= 1) {
        if (stage != 0) return dt_error(DT_ERR_INVALID, "plan: stage %d without a pipeline", stage);
        return plan_whole(o, sh, pr, out);
    }
    dt_plan_opts q;
    dt_train_opts t;
    DT_TRY(resolved(o, sh, pr, &q, &t));
    return plan_stage(&q, sh, pr, stage, out);
}

dt_status dt_plan_run_all(const dt_plan_opts *o, const dt_plan_shard *sh, const dt_plan_precision *pr,
                          dt_plan_estimate *out, dt_plan_estimate *stages) {
    if (o->train->pipeline <= 1) return plan_whole(o, sh, pr, out);
    dt_plan_opts q;
    dt_train_opts t;
    DT_TRY(resolved(o, sh, pr, &q, &t));
    return plan_stages(&q, sh, pr, out, stages);
}

dt_status dt_plan_run(const dt_plan_opts *o, const dt_plan_shard *sh, const dt_plan_precision *pr,
                      dt_plan_estimate *out) {
    return dt_plan_run_all(o, sh, pr, out, NULL);
}

int dt_plan_fit(const dt_plan_opts *o, const dt_plan_precision *pr, size_t capacity, int max_world,
                const dt_plan_shard **sh_out, int *world_out) {
    int n;
    const dt_plan_shard *rows = dt_plan_shards(&n);
    for (int64_t w = o->world; w <= max_world; w *= 2) {
        dt_plan_opts q = *o;
        q.world = (int)w;
        for (int i = 0; i < n; i++) {
            dt_plan_estimate e;
            if (dt_plan_run(&q, &rows[i], pr, &e) != DT_OK) break;   /* this world size cannot split the batch */
            if (e.total <= capacity) {
                *sh_out = &rows[i];
                *world_out = (int)w;
                return 1;
            }
        }
    }
    dt_error_clear();
    return 0;
}
