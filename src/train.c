/*
 * train.c: the training loop shared by every device and transport (see train.h).
 *
 * One step, on rank r of W with S micro-batches of b = B/S samples:
 *   1. the loader thread has gathered this rank's k = S/W micro-batches
 *      (k*b samples, micro-batch after micro-batch) into host memory;
 *   2. for each local micro-batch: forward, then backward of (sum of its
 *      losses)/B, which overwrites the model's gradient array; the k gradients
 *      are summed pairwise with a binary counter (acc[l] holds a finished
 *      subtree of 2^l micro-batches, combined left + right);
 *   3. the all-reduce sums the per-rank subtrees across ranks in the same tree
 *      (the tcp backend pairs (0,1),(2,3) first, then (01,23), ...), so the
 *      gradient is the mean over the global batch with the same bits for every
 *      power-of-two W dividing S;
 *   4. optional clipping by the global norm, then the optimizer step at the
 *      scheduled learning rate.
 * Micro-batch losses are all-gathered and summed in micro-batch order, so the
 * reported loss is also the same for every world size.
 */
#include "train.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "amp.h"
#include "checkpoint.h"
#include "ckpt.h"
#include "clock.h"
#include "data.h"
#include "ddp.h"
#include "hash.h"
#include "mem.h"
#include "model.h"
#include "optim.h"
#include "plan.h"
#include "sampler.h"
#include "shard.h"
#include "testing.h"
#include "trace.h"
#include "train_impl.h"

/* ---- the loop ------------------------------------------------------------------------ */

static dt_status check_opts(const dt_train_opts *o) {
    if (o->epochs < 1 && o->max_steps < 1)
        return dt_error(DT_ERR_INVALID, "epochs: expected at least 1, got %d", o->epochs);
    if (o->batch < 1) return dt_error(DT_ERR_INVALID, "batch: expected a positive global batch, got %lld",
                                      (long long)o->batch);
    if (o->micro_batches < 0)
        return dt_error(DT_ERR_INVALID, "micro_batches: expected a positive count, got %lld",
                        (long long)o->micro_batches);
    if (!(o->lr > 0.0) || !isfinite(o->lr))
        return dt_error(DT_ERR_INVALID, "lr: expected a positive learning rate, got %g", o->lr);
    if (o->weight_decay < 0.0) return dt_error(DT_ERR_INVALID, "weight_decay: expected >= 0, got %g", o->weight_decay);
    if (o->clip < 0.0) return dt_error(DT_ERR_INVALID, "clip: expected >= 0, got %g", o->clip);
    if (o->label_smoothing < 0.0 || o->label_smoothing >= 1.0)
        return dt_error(DT_ERR_INVALID, "label_smoothing: expected a value in [0, 1), got %g", o->label_smoothing);
    dt_loss_kind loss;
    DT_TRY(dt_loss_parse(o->loss, &loss));
    if (!dt_loss_def_of(loss)->smoothing && o->label_smoothing > 0.0)
        return dt_error(DT_ERR_INVALID, "label_smoothing: smooths cross-entropy targets only, not those of loss '%s'",
                        o->loss);
    if (!(o->bucket_mb > 0.0)) return dt_error(DT_ERR_INVALID, "bucket_mb: expected a positive size, got %g", o->bucket_mb);
    if (o->warmup < 0) return dt_error(DT_ERR_INVALID, "warmup: expected >= 0, got %lld", (long long)o->warmup);
    if (!(o->min_lr >= 0.0) || o->min_lr > o->lr)
        return dt_error(DT_ERR_INVALID, "min_lr: expected a value in [0, lr = %g], got %g", o->lr, o->min_lr);
    if (o->eval_every < 0) return dt_error(DT_ERR_INVALID, "eval_every: expected >= 0, got %lld", (long long)o->eval_every);
    if (o->eval_batches < 1)
        return dt_error(DT_ERR_INVALID, "eval_batches: expected at least 1, got %lld", (long long)o->eval_batches);
    dt_dtype precision, grad_dtype;
    DT_TRY(dt_precision_parse(o->precision, &precision));
    DT_TRY(dt_grad_dtype_parse(o->grad_dtype, &grad_dtype));
    return DT_OK;
}

dt_status dt_train_data_opts(const dt_train_opts *o, dt_data_opts *out) {
    DT_TRY(dt_data_opts_from_name(o->normalize, out));
    /* token windows are as long as the model's block, their tokens inside its vocabulary */
    if (dt_data_windows(o->data)) DT_TRY(dt_spec_token_dims(o->model, &out->window, &out->classes));
    return DT_OK;
}

/* Weight decay on matrices only: the runs of the flat parameter array made of
 * parameters of 2 or more dimensions, within the range [lo, lo + len) this rank's
 * optimizer updates (offsets relative to lo). */
static dt_status decay_matrices(trainer *t, size_t lo, size_t len) {
    int np = dt_model_nparam_tensors(t->model);
    size_t *bounds = malloc(((size_t)np + 2) * sizeof *bounds);
    unsigned char *decay = malloc((size_t)np + 2);
    if (!bounds || !decay) { free(bounds); free(decay); return dt_error(DT_ERR_NOMEM, "out of memory"); }
    size_t nr = 0;
    dt_status s = DT_OK;
    for (int i = 0; i < np && s == DT_OK; i++) {
        dt_tensor_info ti;
        if ((s = dt_model_param(t->model, i, &ti)) != DT_OK) break;
        if (ti.offset + (size_t)ti.numel <= lo || ti.offset >= lo + len) continue;   /* outside the range */
        unsigned char d = ti.ndim >= 2;
        if (nr && decay[nr - 1] == d) continue;   /* extends the current run */
        bounds[nr] = ti.offset > lo ? ti.offset - lo : 0;
        decay[nr++] = d;
    }
    bounds[nr] = len;
    if (s == DT_OK) s = dt_optim_set_decay_runs(t->optim, bounds, decay, nr);
    free(bounds);
    free(decay);
    return s;
}

dt_status dt_train_split(int64_t batch, int64_t S, int world, int64_t *k, int64_t *b) {
    if (S < 1 || S % world != 0)
        return dt_error(DT_ERR_INVALID, "micro_batches: %lld is not a multiple of the world size %d", (long long)S, world);
    if (batch % S != 0)
        return dt_error(DT_ERR_INVALID, "batch: the global batch %lld is not divisible by %lld micro-batches",
                        (long long)batch, (long long)S);
    *k = S / world;
    *b = batch / S;
    return DT_OK;
}

dt_status dt_train_exact_worlds(const dt_train_opts *o, int *sizes, int max, int *n) {
    *n = 0;
    const int64_t S = o->micro_batches, P = o->pipeline > 1 ? o->pipeline : 1;
    if (S < 1)
        return dt_error(DT_ERR_INVALID, "elastic: give --micro-batches S: without it the batch is split by the world "
                        "size, so a world that changes would change the weights");
    if (o->lr_scale && strcmp(o->lr_scale, "none") != 0)
        return dt_error(DT_ERR_INVALID, "elastic: --lr-scale %s scales the learning rate with the world size, so a "
                        "world that changes would change the weights (use --lr-scale none)", o->lr_scale);
    if (o->sync_bn)
        return dt_error(DT_ERR_INVALID, "elastic: --sync-bn computes its statistics over the world's micro-batches, "
                        "so a world that changes would change the weights");
    int64_t k, b;
    DT_TRY(dt_train_split(o->batch, S, 1, &k, &b));
    const int chunked = o->virtual_stages > 1;   /* interleaved: each replica's micro-batches in groups of P */
    for (int64_t d = 1; d <= S && *n < max; d *= 2) {
        if (S % d != 0 || S / d < P) break;
        if (P * d > INT32_MAX) break;
        if (chunked && (S / d) % P != 0) continue;
        sizes[(*n)++] = (int)(P * d);
    }
    if (*n == 0)
        return dt_error(DT_ERR_INVALID, "elastic: --micro-batches %lld cannot fill %lld pipeline stages on any world",
                        (long long)S, (long long)P);
    return DT_OK;
}

dt_status dt_train_optim_config(const dt_train_opts *o, dt_optim_config *out) {
    const dt_optim_def *def = dt_optim_find(o->optim);
    if (!def) {
        char names[128];
        return dt_error(DT_ERR_INVALID, "optim: expected one of %s, got '%s'", dt_optim_names(names, sizeof names),
                        o->optim);
    }
    dt_optim_config cfg = dt_optim_defaults(def->defaults.kind, (float)o->lr);
    cfg.weight_decay = (float)o->weight_decay;
    if (def->hparams & DT_OPTIM_HP_MOMENTUM) {
        cfg.momentum = (float)o->momentum;
        cfg.dampening = (float)o->dampening;
        cfg.nesterov = o->nesterov;
    }
    if (def->hparams & DT_OPTIM_HP_BETAS) {
        cfg.beta1 = (float)o->beta1;
        cfg.beta2 = (float)o->beta2;
    }
    if (def->hparams & DT_OPTIM_HP_EPS) cfg.eps = (float)o->eps;
    *out = cfg;
    return DT_OK;
}

static dt_status make_optim(trainer *t) {
    const dt_train_opts *o = t->o;
    dt_optim_config cfg;
    DT_TRY(dt_train_optim_config(o, &cfg));
    size_t lo, len;
    dt_shard_range(t->shard, &lo, &len);
    DT_TRY(dt_optim_init(&cfg, t->ops, len, &t->optim));
    if (!strcmp(o->decay, "matrices")) DT_TRY(decay_matrices(t, lo, len));
    else if (strcmp(o->decay, "all") != 0)
        return dt_error(DT_ERR_INVALID, "decay: expected all or matrices, got '%s'", o->decay);
    memset(&t->sched, 0, sizeof t->sched);
    double lr = o->lr;
    if (strcmp(o->lr_scale, "linear") == 0) lr *= (double)t->world;
    else if (strcmp(o->lr_scale, "sqrt") == 0) lr *= sqrt((double)t->world);
    else if (strcmp(o->lr_scale, "none") != 0)
        return dt_error(DT_ERR_INVALID, "lr_scale: expected none, linear or sqrt, got '%s'", o->lr_scale);
    t->sched.base_lr = (float)lr;
    t->sched.min_lr = (float)o->min_lr;
    t->sched.warmup_steps = o->warmup;
    t->sched.total_steps = t->total;
    t->sched.gamma = (float)o->gamma;
    t->sched.step_size = o->step_size > 0 ? o->step_size : (t->spe > 0 ? t->spe : 1);
    if (strcmp(o->schedule, "cosine") == 0) t->sched.kind = DT_SCHED_COSINE;
    else if (strcmp(o->schedule, "constant") == 0) t->sched.kind = DT_SCHED_CONSTANT;
    else if (strcmp(o->schedule, "step") == 0) t->sched.kind = DT_SCHED_STEP;
    else return dt_error(DT_ERR_INVALID, "schedule: expected cosine, constant or step, got '%s'", o->schedule);
    return dt_schedule_check(&t->sched);
}

/* This rank's sample indices of global step g (k*b values in micro-batch order). */
static dt_status step_indices(trainer *t, int64_t g, int64_t *idx, size_t *n) {
    int64_t epoch = g / t->spe, step = g % t->spe;
    if (dt_testing_fault() == DT_FAULT_SAMPLER_EPOCH) epoch = 0;  /* planted bug (testing.h) */
    return dt_sampler_rank_indices(t->sampler, epoch, step, t->dp, t->dpr, idx, n);
}

/* Queue the sample indices of global step g with the loader, and note this
 * rank's term of the step's fingerprint: the sum over positions p of
 * hash(p, sample index at p), so each rank adds its block's terms and the total
 * is the same for every world size. */
static dt_status queue_step(trainer *t, int64_t g) {
    size_t n = 0;
    DT_TRY(step_indices(t, g, t->idx, &n));
    uint64_t h = 0, base = (uint64_t)(t->first_micro * t->b);
    for (size_t j = 0; j < n; j++) h += dt_hash_u64(0x62617463ULL, base + j, (uint64_t)t->idx[j]);
    t->hash_term[g % 4] = h;
    return dt_loader_submit(t->loader, t->idx, n);
}

/* The fingerprint of the global batch of step g (collective when distributed). */
static dt_status batch_hash(trainer *t, int64_t g, uint64_t *out) {
    uint64_t h = t->stage == 0 ? t->hash_term[g % 4] : 0;   /* one term per replica */
    if (t->world > 1) {
        DT_TRY(dt_allgather(t->comm, &h, t->hash_all, 1, DT_I64));
        h = 0;
        for (int r = 0; r < t->world; r++) h += t->hash_all[r];
    }
    *out = h;
    return DT_OK;
}

/* --trace: micro-batch `micro`'s forward [f0, f1] and backward [f1, f2] */
static void trace_micro(int64_t micro, double f0, double f1, double f2) {
    char d[48];
    snprintf(d, sizeof d, "micro-batch %lld", (long long)micro);
    dt_trace_span("forward", "compute", f0, f1, d);
    dt_trace_span("backward", "compute", f1, f2, d);
}

/* --trace on a device (trace.h): micro-batch `micro`'s work of one pass, queued from the
 * device mark `begin` until now; the mark that ends it */
static int trace_dev_micro(const char *pass, int64_t micro, int begin) {
    char d[48];
    snprintf(d, sizeof d, "micro-batch %lld", (long long)micro);
    return dt_trace_dev_span(begin, pass, "compute", d);
}

/* --trace: step g's phases (at[0..4]: start, batch in, backward done, gradients summed,
 * parameters updated) and the memory held at its end */
static void trace_step(const trainer *t, int64_t g, const double *at) {
    char d[48];
    snprintf(d, sizeof d, "step %lld", (long long)g + 1);
    dt_trace_span("step", "step", at[0], at[4], d);
    dt_trace_span("data wait", "data", at[0], at[1], d);
    if (t->pipe) dt_trace_span("pipeline actions", "compute", at[1], at[2], d);
    dt_trace_span("gradient sums", "comm", at[2], at[3], d);
    dt_trace_span("optimizer", "compute", at[3], at[4], d);
    dt_mem_stats m;
    dt_mem_get(&m);
    dt_trace_counter("memory MiB", at[4], (double)m.cur[DT_MEM_TOTAL] / 1048576.0);
    for (int c = 0; c < DT_MEM_NCAT; c++) {   /* and by category, a track each */
        char name[48];
        snprintf(name, sizeof name, "memory MiB: %s", dt_mem_cat_name(c));
        dt_trace_counter(name, at[4], (double)m.cur[c] / 1048576.0);
    }
    if (at[4] > at[0])   /* the job's rate over this rank's step */
        dt_trace_counter(t->lw > 1 ? "tokens/s" : "samples/s", at[4],
                         (double)t->o->batch * (double)t->lw / (at[4] - at[0]));
}

/* A non-finite loss stops the job before the update, so no NaN weights are ever applied
 * or saved. Every rank holds every micro-batch's loss: all decide alike. */
static dt_status check_losses(const trainer *t, int64_t g) {
    for (int64_t j = 0; j < t->S; j++)
        if (!isfinite(t->all_losses[j]))
            return dt_error(DT_ERR_NONFINITE, "step %lld: the loss of micro-batch %lld (computed by rank %lld) is %s; "
                            "stopped before the update (a learning rate too high, or non-finite input data?)",
                            (long long)g + 1, (long long)j, (long long)(j / t->k * t->pp + t->pp - 1),
                            isnan(t->all_losses[j]) ? "NaN" : "infinite");
    return DT_OK;
}

static dt_status check_norm(int64_t g, float norm) {
    if (isfinite(norm)) return DT_OK;
    return dt_error(DT_ERR_NONFINITE, "step %lld: the gradient norm is %s; stopped before the update", (long long)g + 1,
                    isnan(norm) ? "NaN" : "infinite");
}

/* One optimizer step on global step g; *loss receives the global mean loss.
 *
 * One process (no pipeline, no loss scaler) reads the device once a step, at its end:
 * the norm, the clipping coefficient and whether the step may be applied are decided on
 * the device (dt_shard_clip_device), the optimizer's kernels read that gate, and the
 * losses and the norm come back together after the update was queued; a non-finite loss
 * or norm then stops the job as before, the gate having kept the weights as they were.
 * Several processes read the losses before the update: every rank must see every loss
 * (gathered) to decide alike. */
static dt_status train_step(trainer *t, int64_t g, int logged, double *loss, double *lr_out, double *norm_out) {
    const dt_ops *ops = t->ops;
    const dt_dataset_info *info = dt_dataset_get_info(t->train);
    size_t ss = (size_t)info->sample_size;
    int64_t epoch = g / t->spe, step = g % t->spe;

    double t0 = dt_now();
    float *hx;
    int32_t *hy;
    size_t n;
    DT_TRY(dt_loader_next(t->loader, &hx, &hy, &n));
    if ((int64_t)n != t->k * t->b)
        return dt_error(DT_ERR_INTERNAL, "loader returned %zu samples, expected %lld", n, (long long)(t->k * t->b));
    double t1 = dt_now();
    /* queued uploads from the loader's pinned slot, held until the losses are read back */
    DT_TRY(ops->copy_h2d_async(t->dx, hx, n * ss * sizeof(float)));
    DT_TRY(ops->copy_h2d_async(t->dy, hy, n * (size_t)t->lw * sizeof(int32_t)));
    const void *target;
    DT_TRY(dt_train_loss_target_(ops, &t->lf, hy, n, t->C, t->dy, t->hot, t->dhot, &target));
    /* keep the loader one step ahead */
    if (t->queued < t->total) DT_TRY(queue_step(t, t->queued++));

    DT_TRAIN_EACH_CHUNK(t, j) {
        dt_amp_begin_step(t->amp);   /* fp16: backward of the loss x the scale */
    }
    double pipe_wait = 0.0;   /* a pipeline stage's waits for its neighbours */
    if (t->pipe) DT_TRY(dt_train_pipe_run_(t, (uint64_t)epoch, step, target, &pipe_wait));
    for (int64_t i = 0; !t->pipe && i < t->k; i++) {
        int64_t micro = t->first_micro + i;
        int64_t sample_base = step * t->o->batch + micro * t->b;
        if (t->bnrec_n) dt_model_set_bn_record(t->model, t->bnrec + (size_t)micro * t->bnrec_n);
        double f0 = dt_trace_on() ? dt_now() : 0.0;
        int d0 = dt_trace_dev_mark();
        DT_TRY(dt_model_forward(t->model, t->dx + (size_t)(i * t->b) * ss, (int)t->b, 1,
                                (uint64_t)epoch, sample_base, NULL));
        double f1 = f0 > 0.0 ? dt_now() : 0.0;
        int d1 = trace_dev_micro("forward", micro, d0);
        DT_TRY(dt_ddp_begin_micro(t->ddp, i));
        /* micro-batch i's targets: b x lw labels, or b one-hot rows of C (the loss's row says) */
        const void *ti = !dt_loss_def_of(t->lf.kind)->one_hot
                             ? (const void *)((const int32_t *)target + i * t->b * t->lw)
                             : (const void *)((const float *)target + (size_t)(i * t->b) * (size_t)t->C);
        DT_TRY(dt_model_loss_backward(t->model, &t->lf, ti, (int)t->b, (float)t->o->batch, NULL));
        DT_TRY(ops->copy_d2d(t->dlosses + i, dt_model_loss_dev(t->model), sizeof(float)));
        if (f0 > 0.0) trace_micro(micro, f0, f1, dt_now());
        trace_dev_micro("backward", micro, d1);
    }
    const int one = t->world == 1 && !t->pipe && dt_amp_scale(t->amp) == 0.0;
    float *checks = t->dlosses + t->k;   /* one: the norm, the clipping coefficient, the gate (device) */
    if (!one) {
        DT_TRY(ops->copy_d2h(t->losses, t->dlosses, (size_t)t->k * sizeof(float)));
        dt_loader_release(t->loader);   /* the uploads are done */
    }
    double t2 = dt_now();
    double wait = 0.0;
    DT_TRAIN_EACH_CHUNK(t, j) {
        double w = 0.0;
        DT_TRY(dt_ddp_finish(t->ddp, &w));
        DT_TRY(dt_shard_reduce(t->shard));
        wait += w;
    }

    if (t->pipe) {
        DT_TRY(dt_train_pipe_losses_(t));
        if (t->bnrec_n) DT_TRY(dt_train_pipe_bn_(t));
    } else if (t->world > 1) {
        DT_TRY(dt_allgather(t->comm, t->losses, t->all_losses, (size_t)t->k, DT_F32));
        /* records are gathered, never combined */
        if (t->bnrec_n)
            DT_TRY(dt_ddp_allgather_dev(t->ddp, t->bnrec + (size_t)t->first_micro * t->bnrec_n, t->bnrec,
                                        (size_t)t->k * t->bnrec_n * sizeof(float)));
    } else if (!one) {   /* one process that reads its losses now (fp16's scaler): they are all */
        memcpy(t->all_losses, t->losses, (size_t)t->k * sizeof(float));
    }
    /* Running statistics advance once per micro-batch in global micro-batch order on
     * every rank, so the buffers equal those of a single process bit for bit. */
    for (int64_t j = 0; t->bnrec_n && j < t->S; j++)
        DT_TRY(dt_model_bn_replay(t->model, t->bnrec + (size_t)j * t->bnrec_n));
    double t3 = dt_now();
    int d3 = dt_trace_dev_mark();   /* the optimizer's work on a device (trace.h) */
    if (!one) DT_TRY(check_losses(t, g));

    /* fp16: inf/NaN in the gradient on any rank skips the step on every rank (the loss
     * scaler's business, not an error); unscale folds 1/scale into clipping and the step.
     * Each rank looks at the part it applies (its shard when sharded). */
    int skip = 0;
    float norm = 0.0f, unscale = 1.0f;
    float *part[DT_TRAIN_MAX_CHUNKS];   /* a pipeline stage's chunks: one decision over their parts */
    size_t plen[DT_TRAIN_MAX_CHUNKS];
    const int V = dt_train_pipe_chunks_(t);
    for (int j = V - 1; j >= 0; j--) {
        size_t glo, glen;
        dt_train_pipe_use_(t, j);
        dt_shard_range(t->shard, &glo, &glen);
        part[j] = dt_model_grads(t->model) + glo, plen[j] = glen;
    }
    DT_TRY(dt_amp_check_parts(t->amp, g, part, plen, V, &skip, &unscale));
    dt_train_pipe_amp_follow_(t);
    dt_optim_set_gate(t->optim, one ? checks + 2 : NULL);
    if (one)
        DT_TRY(dt_shard_clip_device(t->shard, (float)t->o->clip, unscale, logged, t->dlosses, (size_t)t->k, checks));
    else if (!skip && (t->o->clip > 0.0 || logged))
        DT_TRY(t->pipe ? dt_train_pipe_clip_(t, (float)t->o->clip, unscale, &norm)
                       : dt_shard_clip(t->shard, (float)t->o->clip, unscale, &norm));
    float lr = dt_schedule_lr(&t->sched, g);
    if (dt_testing_fault() == DT_FAULT_LR_RANK1 && t->rank == 1) lr *= 2.0f;  /* planted bug (testing.h) */
    if (!one) DT_TRY(check_norm(g, norm));
    if (!skip)
        DT_TRAIN_EACH_CHUNK(t, j) DT_TRY(dt_shard_step(t->shard, t->optim, lr, unscale));
    if (!skip && t->pipe) DT_TRY(dt_train_pipe_after_step_(t));
    if (d3 >= 0) {
        char sd[48];
        snprintf(sd, sizeof sd, "step %lld", (long long)g + 1);
        dt_trace_dev_span(d3, "optimizer", "compute", sd);
    }
    if (one) {   /* the step's one read: its losses and checks, once the update ran */
        DT_TRY(ops->copy_d2h(t->losses, t->dlosses, (size_t)(t->k + 3) * sizeof(float)));
        dt_loader_release(t->loader);
        memcpy(t->all_losses, t->losses, (size_t)t->k * sizeof(float));
        norm = t->losses[t->k];
        DT_TRY(check_losses(t, g));   /* the gate (losses[k + 2] = 0) kept the weights */
        DT_TRY(check_norm(g, norm));
    } else {
        DT_TRY(ops->synchronize());
    }
    double t4 = dt_now();
    if (dt_trace_on()) {
        trace_step(t, g, (double[]){ t0, t1, t2, t3, t4 });
        DT_TRY(dt_trace_dev_flush());   /* the step's device spans, on the host clock */
    }

    double sum = 0.0;
    for (int64_t i = 0; i < t->S; i++) sum += (double)t->all_losses[i];
    *loss = sum;
    *lr_out = lr;
    *norm_out = norm;
    t->t_data += t1 - t0;
    t->t_compute += (t2 - t1) + (t4 - t3) - pipe_wait;
    t->t_comm += t3 - t2 + pipe_wait;
    t->t_step += dt_now() - t0;
    t->steps_since++;
    if (t->tuner) {
        t->threads_sum += dt_tuner_threads(t->tuner);
        t->threads_steps++;
        DT_TRY(dt_tuner_step(t->tuner, t4 - t0, NULL));
    }
    return DT_OK;
}

static void emit(trainer *t, dt_train_event *ev) {
    ev->world_size = t->world;
    ev->micro_batches = (int)t->S;
    ev->stages = t->pp;
    if (t->o->on_event) t->o->on_event(t->o->event_ctx, ev);
}

static void trainer_free(trainer *t) {
    dt_tuner_free(t->tuner);
    dt_ddp_free(t->ddp);
    dt_shard_free(t->shard);
    dt_train_pipe_free_(t);
    dt_amp_free(t->amp);
    dt_ckpt_close(t->resume);
    dt_train_snap_free_(t);
    dt_loader_free(t->loader);
    dt_sampler_free(t->sampler);
    dt_optim_free(t->optim);
    if (t->ops) {
        dt_mem_free(t->ops, t->dx);
        dt_mem_free(t->ops, t->dy);
        dt_mem_free(t->ops, t->dhot);
        dt_mem_free(t->ops, t->bnrec);
        dt_mem_free(t->ops, t->dlosses);
    }
    free(t->hot);
    free(t->idx);
    free(t->hash_all);
    free(t->rank_stats);
    free(t->losses);
    free(t->all_losses);
    dt_dataset_free(t->train);
    dt_dataset_free(t->test);
}

static void *loader_alloc(void *ctx, size_t bytes) {
    void *p = NULL;
    return ((const dt_ops *)ctx)->host_alloc(&p, bytes) == DT_OK ? p : NULL;
}
static void loader_free(void *ctx, void *p) { ((const dt_ops *)ctx)->host_free(p); }

/* Every rank must train on the same data (the sampler draws the same global
 * batches everywhere): a rank that read other data would silently train other
 * weights. Each rank's fingerprint is gathered; every rank names the first that
 * differs from rank 0. */
static dt_status check_same_data(trainer *t) {
    if (t->world < 2) return DT_OK;
    uint64_t mine[2] = {0, 0};
    DT_TRY(dt_dataset_fingerprint(t->train, &mine[0]));
    if (t->test) DT_TRY(dt_dataset_fingerprint(t->test, &mine[1]));
    uint64_t *all = calloc((size_t)t->world * 2, sizeof *all);
    if (!all) return dt_error(DT_ERR_NOMEM, "data: out of memory");
    dt_status s = dt_allgather(t->comm, mine, all, 2, DT_I64);
    for (int r = 1; s == DT_OK && r < t->world; r++)
        if (all[2 * r] != all[0] || all[2 * r + 1] != all[1])
            s = dt_error(DT_ERR_MISMATCH, "data: rank %d read other %s data than rank 0 (fingerprint %016llx, rank 0 "
                         "%016llx); every rank must read the same files", r, all[2 * r] != all[0] ? "training" : "test",
                         (unsigned long long)all[2 * r + (all[2 * r] == all[0])],
                         (unsigned long long)all[all[2 * r] == all[0]]);
    free(all);
    return s;
}

/* ---- setup, step by step ----------------------------------------------------------------- */

/* The options, this rank's place, the checkpoint to resume from (its micro-batch count
 * when none is given) and the split of the global batch. */
static dt_status setup_world(trainer *t) {
    const dt_train_opts *o = t->o;
    DT_TRY(check_opts(o));
    t->world = t->comm ? dt_comm_size(t->comm) : 1;
    t->rank = t->comm ? dt_comm_rank(t->comm) : 0;
    DT_TRY(dt_train_pipe_layout_(t));
    DT_TRY(dt_train_snap_setup_(t));
    if (o->resume) DT_TRY(dt_train_resume_open_(t));
    DT_TRY(dt_train_check_ckpt_dir_(t));
    t->S = o->micro_batches > 0 ? o->micro_batches
         : t->resume ? dt_ckpt_info_of(t->resume)->micro_batches : t->world;
    if (t->S % t->dp != 0 && t->resume && o->micro_batches == 0)
        return dt_error(DT_ERR_INVALID, "resume: the checkpoint was written with %lld micro-batches, which %d "
                        "replicas cannot split; resume on a world size dividing %lld",
                        (long long)t->S, t->dp, (long long)t->S);
    DT_TRY(dt_train_split(o->batch, t->S, t->dp, &t->k, &t->b));
    return dt_train_pipe_world_(t);
}

/* The data (the same on every rank), the sampler and the length of the run. */
static dt_status setup_data(trainer *t) {
    const dt_train_opts *o = t->o;
    /* A data file that cannot be read is bad input (exit 2), not a runtime failure. */
    dt_data_opts data_opts;
    DT_TRY(dt_train_data_opts(o, &data_opts));
    dt_status ds = dt_dataset_open_pair(o->data, &data_opts, &t->train, o->eval ? &t->test : NULL);
    if (ds != DT_OK) return ds == DT_ERR_IO ? DT_ERR_INVALID : ds;
    DT_TRY(check_same_data(t));
    const dt_dataset_info *info = dt_dataset_get_info(t->train);
    t->lw = info->label_width;
    /* windows are drawn at random from (seed, step, position): an epoch over every
     * window start would be T times the corpus */
    if (t->lw > 1) DT_TRY(dt_sampler_init_random(info->n, o->batch, t->S, o->seed, &t->sampler));
    else DT_TRY(dt_sampler_init(info->n, o->batch, t->S, o->seed, 1, &t->sampler));
    t->spe = dt_sampler_steps_per_epoch(t->sampler);
    t->total = t->spe * (int64_t)(o->epochs > 0 ? o->epochs : 1);
    if (o->max_steps > 0 && (o->epochs < 1 || o->max_steps < t->total)) t->total = o->max_steps;
    int64_t dummy;
    return dt_sampler_rank_block(t->sampler, t->dp, t->dpr, &t->first_micro, &dummy);
}

/* dtrain plan's view of this run (its options, shard mode, precision, world and data):
 * 0 where it cannot plan it (a row the plan does not know). */
static int plan_view(const trainer *t, const dt_dataset_info *info, dt_plan_opts *po, const dt_plan_shard **sh,
                     const dt_plan_precision **pr) {
    const dt_train_opts *o = t->o;
    *sh = dt_plan_shard_find(o->shard ? o->shard : "none");
    *pr = dt_plan_precision_find(o->precision ? o->precision : "fp32");
    *po = (dt_plan_opts){.train = o, .world = t->world, .labels = info->label_width, .ops = t->ops};
    po->input.ndim = info->ndim;
    for (int i = 0; i < info->ndim; i++) po->input.d[i] = info->shape[i];
    return *sh && *pr;
}

/* The pipeline's cut: --stages, resolved as dtrain plan does (auto under --max-memory may
 * take the parameters' cut); where the run cannot be planned, --stages as given. */
static dt_status cut_stages(trainer *t, const dt_spec *spec, const dt_dataset_info *info) {
    dt_plan_opts po;
    const dt_plan_shard *sh;
    const dt_plan_precision *pr;
    const char *stages = t->o->stages;
    size_t work = 0, params = 0;
    if (plan_view(t, info, &po, &sh, &pr) && dt_plan_stages(&po, sh, pr, &stages, &work, &params) != DT_OK) {
        dt_error_clear();   /* the cut itself says what is wrong */
        stages = t->o->stages;
    }
    return dt_train_pipe_cut_(t, spec, stages, work, params);
}

/* The model, built where sharding puts its parameters, from its initial or given
 * weights, with outputs the data can be scored against. */
static dt_status setup_model(trainer *t) {
    const dt_train_opts *o = t->o;
    const dt_dataset_info *info = dt_dataset_get_info(t->train);
    dt_shape shape = {.ndim = info->ndim};
    for (int i = 0; i < info->ndim; i++) shape.d[i] = info->shape[i];
    /* sharding decides where the parameters live before the model is built: with
     * params, no rank ever holds the whole array */
    DT_TRY(dt_shard_parse(o->shard, &t->mode));
    DT_TRY(dt_shard_prefetch_parse(o->backward_prefetch, &t->prefetch));
    dt_spec spec;
    DT_TRY(dt_spec_parse(o->model, &spec));
    dt_status ss = dt_spec_infer(&spec, &shape);
    size_t nparams = (size_t)spec.nparams;
    if (ss == DT_OK && t->pipe) ss = cut_stages(t, &spec, info);   /* the stages, from the spec */
    dt_spec_free(&spec);
    DT_TRY(ss);
    dt_model_opts mo;
    dt_model_opts_default(&mo);
    mo.recompute = o->recompute;
    DT_TRY(dt_precision_parse(o->precision, &mo.act_dtype));   /* what dt_amp_init sets the model to */
    DT_TRY(dt_shard_layout(nparams, t->dp_comm, t->mode, &mo.layout));
    const dt_model_layout whole = mo.layout;
    DT_TRAIN_EACH_CHUNK(t, j) {   /* a model a chunk */
        mo.layout = whole;
        if (t->pipe) {   /* a chunk keeps its own parameters and gradients only */
            dt_train_pipe_keep_(t, &mo.layout.keep_lo, &mo.layout.keep_hi);
            mo.layout.capacity = mo.layout.keep_hi > nparams ? mo.layout.keep_hi : nparams;
        }
        DT_TRY(dt_model_build_ex(o->model, &shape, t->ops, o->seed, (int)t->b, &mo, &t->model));
        if (o->init_weights && !t->resume) {   /* a file that cannot be used is bad input */
            dt_status ls = dt_model_load(t->model, o->init_weights);
            if (ls != DT_OK) return dt_error_wrap(ls == DT_ERR_IO ? DT_ERR_INVALID : ls, "init_weights: ");
        }
        DT_TRY(dt_train_pipe_built_(t));
    }
    const dt_shape *os = dt_model_output_shape(t->model);
    if (t->lw > 1 ? (os->ndim != 2 || os->d[0] != t->lw || os->d[1] < info->classes)
                  : (os->ndim != 1 || os->d[0] < info->classes)) {
        char sh[64];
        dt_shape_str(os, 1, sh, sizeof sh);
        if (t->lw > 1)
            return dt_error(DT_ERR_INVALID, "model: the model's output must be (B, %lld, %d) token scores for this "
                            "data, got %s", (long long)t->lw, info->classes, sh);
        return dt_error(DT_ERR_INVALID, "model: the model's output must be (%d) class scores for this data, got %lld values",
                        info->classes, (long long)dt_shape_numel(os));
    }
    t->C = (int)dt_shape_numel(os);
    return t->pipe ? dt_train_pipe_setup_(t) : DT_OK;
}

static dt_status setup_chunk(trainer *t);

/* Where each part of the state lives and how gradients meet: sharding, mixed
 * precision, the optimizer over this rank's range, DDP's buckets. */
static dt_status setup_parallel(trainer *t) {
    DT_TRAIN_EACH_CHUNK(t, j) {
        DT_TRY(setup_chunk(t));
    }
    return t->pipe ? dt_train_pipe_norm_setup_(t) : DT_OK;
}

/* The same for one model: the whole, or a pipeline chunk's. */
static dt_status setup_chunk(trainer *t) {
    const dt_train_opts *o = t->o;
    size_t plo = 0, phi = 0;   /* a pipeline chunk's parameters (0, 0: all) */
    if (t->pipe) dt_train_pipe_range_(t, &plo, &phi);
    DT_TRY(dt_shard_init_range(t->model, t->dp_comm, t->mode, plo, t->pipe ? phi : dt_model_nparams(t->model),
                               &t->shard));
    DT_TRY(dt_amp_init(o->precision, o->grad_dtype, t->model, t->comm, &t->amp));
    dt_shard_scatter_sums(t->shard, dt_amp_grad_dtype(t->amp) == DT_F32);
    if (dt_amp_grad_dtype(t->amp) != DT_F32 && !dt_shard_ddp_reduces(t->shard))
        return dt_error(DT_ERR_INVALID, "grad_dtype: bf16 gradients go with --shard none or optim (the sharded "
                        "reductions of grads and params sum in f32)");
    DT_TRY(make_optim(t));
    dt_ddp_opts dopt;
    dt_ddp_opts_default(&dopt);
    dopt.bucket_bytes = (size_t)(o->bucket_mb * 1048576.0);
    if (dopt.first_bucket_bytes > dopt.bucket_bytes) dopt.first_bucket_bytes = dopt.bucket_bytes;
    /* a stage of several chunks launches its gradient sums after its last action: its
     * chunks' sums over the replicas and its sends to the next stage would otherwise wait
     * on each other across the replicas (a sum started during a backward blocks that
     * stage's sends until the other replica's stage joins it) */
    dopt.overlap = o->overlap && dt_train_pipe_chunks_(t) == 1;
    dopt.sync_bn = o->sync_bn;
    dopt.local_only = !dt_shard_ddp_reduces(t->shard);
    dopt.sharded_params = dt_shard_params_sharded(t->shard);
    dopt.grad_dtype = dt_amp_grad_dtype(t->amp);
    dopt.range_lo = plo;
    dopt.range_hi = phi;
    DT_TRY(dt_ddp_init(t->model, t->dp_comm, t->k, &dopt, &t->ddp));
    return dt_shard_attach(t->shard, t->ddp, (size_t)(o->shard_unit_mb * 1048576.0), t->prefetch);
}

/* The step's buffers: sample indices, losses, the device batch, batchnorm records and
 * the loader that fills them ahead of the step. */
static dt_status setup_buffers(trainer *t) {
    const dt_train_opts *o = t->o;
    const dt_dataset_info *info = dt_dataset_get_info(t->train);
    size_t local = (size_t)(t->k * t->b);
    t->idx = malloc(local * sizeof *t->idx);
    t->hash_all = calloc((size_t)t->world, sizeof *t->hash_all);
    t->rank_stats = calloc((size_t)t->world * DT_RANK_STATS, sizeof *t->rank_stats);
    if (!t->hash_all || !t->rank_stats) return dt_error(DT_ERR_NOMEM, "out of memory for the step buffers");
    t->losses = calloc((size_t)t->k + 3, sizeof *t->losses);   /* + the step's checks (train_step) */
    t->all_losses = calloc((size_t)t->S, sizeof *t->all_losses);
    if (!t->idx || !t->losses || !t->all_losses) return dt_error(DT_ERR_NOMEM, "out of memory for the step buffers");
    DT_TRY(dt_loss_parse(o->loss, &t->lf.kind));
    DT_TRY(dt_train_loss_check_(&t->lf, t->lw));
    t->lf.label_smoothing = (float)o->label_smoothing;
    DT_TRY(dt_train_batch_alloc_(t->ops, &t->lf, local, info->sample_size, t->lw, t->C, &t->dx, &t->dy, &t->hot, &t->dhot));
    DT_TRY(dt_mem_alloc(t->ops, DT_MEM_OTHER, (void **)&t->dlosses, (size_t)(t->k + 3) * sizeof(float)));
    /* With synchronised batchnorm every rank already sees the global statistics
     * and updates its buffers in place; otherwise records are replayed in order. */
    t->bnrec_n = o->sync_bn && t->world > 1 ? 0 : dt_model_bn_record_size(t->model);
    if (t->bnrec_n) DT_TRY(dt_mem_alloc(t->ops, DT_MEM_OTHER, (void **)&t->bnrec, (size_t)t->S * t->bnrec_n * sizeof(float)));
    /* batches are gathered into the device's pinned host memory, so the copy to
     * the device can be a queued DMA (on the CPU this is plain aligned memory); three
     * slots: one uploading, one ready, one gathering */
    dt_loader_opts lo = {.depth = 3, .timeout_s = 600, .alloc = loader_alloc, .free = loader_free,
                         .alloc_ctx = (void *)t->ops};
    return dt_loader_init_opts(t->train, local, &lo, &t->loader);
}

/* The state to start from: the checkpoint's, or rank 0's broadcast; with sharded
 * parameters each rank then keeps its shard only. */
static dt_status setup_start(trainer *t) {
    if (t->resume) DT_TRY(dt_train_resume_restore_(t));
    DT_TRAIN_EACH_CHUNK(t, j) {
        DT_TRY(dt_ddp_sync_start(t->ddp));
    }
    if (t->pipe) DT_TRY(dt_train_pipe_after_step_(t));   /* a tied head's weight, from its owner */
    DT_TRY(dt_shard_drop_params(t->shard));
    char what[256];
    dt_shard_note(t->shard, what, sizeof what);
    size_t nl = strlen(t->note);
    if (what[0]) snprintf(t->note + nl, sizeof t->note - nl, "%s%s", nl ? "; " : "", what);
    return DT_OK;
}

static dt_status trainer_setup(trainer *t) {
    DT_TRY(setup_world(t));
    DT_TRY(dt_train_trace_setup_(t));
    DT_TRY(setup_data(t));
    DT_TRY(setup_model(t));
    DT_TRY(setup_parallel(t));
    DT_TRY(setup_buffers(t));
    /* a host device's threads follow the cores this process gets (tuner.h) */
    if (t->o->adapt_threads && t->ops->host_memory) DT_TRY(dt_tuner_new(t->ops, &t->tuner));
    return setup_start(t);
}

/* Per-rank figures since the last report, gathered so rank 0 can show them:
 * steps, step time, data wait, compute, communication wait, peak RSS, samples. */
static dt_status rank_report(trainer *t, int64_t done, int epoch) {
    double mine[DT_RANK_STATS], *all = t->rank_stats;
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    mine[0] = (double)t->steps_since;
    mine[1] = t->t_step;
    mine[2] = t->t_data;
    mine[3] = t->t_compute;
    mine[4] = t->t_comm;
    mine[5] = (double)ru.ru_maxrss / 1024.0;
    if (t->ops->memory) {   /* a device that tracks its memory: its peak, as torch.cuda does */
        size_t cur = 0, peak = 0;
        t->ops->memory(&cur, &peak, 0);
        mine[5] = (double)peak / 1048576.0;
    }
    mine[6] = (double)(done * t->k * t->b);
    dt_mem_stats ms;
    dt_mem_get(&ms);
    for (int c = 0; c <= DT_MEM_TOTAL; c++) {
        mine[DT_RANK_MEM + c] = (double)ms.cur[c];
        mine[DT_RANK_MEM_PEAK + c] = (double)ms.peak[c];
    }
    if (t->world > 1) DT_TRY(dt_allgather(t->comm, mine, all, DT_RANK_STATS, DT_F64));
    else memcpy(all, mine, sizeof mine);
    dt_train_event e = {.kind = DT_EV_RANKS, .epoch = epoch, .epochs = t->o->epochs, .step = done,
                        .total_steps = t->total, .steps_per_epoch = t->spe, .rank_stats = all};
    emit(t, &e);
    t->steps_since = 0;
    t->t_step = t->t_data = t->t_compute = t->t_comm = 0.0;
    return DT_OK;
}

/* nanoGPT's estimate of a token model's training FLOPs per token (for MFU): 6 per
 * parameter (forward and backward), the position table left out, plus 12 C T per
 * attention layer for the scores and their weighted sums. */
static double flops_per_token(const dt_model *m) {
    double n = (double)dt_model_nparams(m), att = 0.0;
    for (int i = 0; i < dt_model_nlayers(m); i++) {
        const dt_layer *L = dt_model_layer(m, i);
        if (L->kind == DT_LAYER_POS) n -= (double)L->t[0].numel;
        if (L->kind == DT_LAYER_ATTN) att += 12.0 * (double)L->in.d[1] * (double)L->in.d[0];
    }
    return 6.0 * n + att;
}

/* Has the caller asked any rank to stop (opts.stop_request, set by a signal handler)?
 * The ranks agree, so every one ends after the same step: one all-reduce of an int
 * (max) a step, a few bytes beside the step's gradients. *stop becomes 2 when asked. */
static dt_status stop_requested(trainer *t, int *stop) {
    int32_t mine = *t->o->stop_request != 0, any = mine;
    if (t->comm && t->world > 1) DT_TRY(dt_allreduce(t->comm, &mine, &any, 1, DT_I32, DT_MAX));
    if (any) *stop = 2;
    return DT_OK;
}

/* An evaluation, a span of the trace when one is recorded. */
static dt_status validate(trainer *t, double *loss, double *acc) {
    double t0 = dt_now();
    dt_status s = dt_train_validate_(t, loss, acc);
    dt_trace_span("evaluation", "eval", t0, dt_now(), NULL);
    dt_status fs = dt_trace_dev_flush();   /* its modules' device spans */
    return s != DT_OK ? s : fs;
}

/* dtrain plan's estimate of this rank's peak accounted memory for this very run (its
 * shard mode, precision, world and data; in a pipeline its own stage's: rank 0, which
 * emits it, is stage 0, and the report's memory chart holds it to rank 0's peak); 0
 * where it cannot plan. */
static double planned_bytes(const trainer *t, const dt_dataset_info *info) {
    dt_plan_opts po;
    const dt_plan_shard *sh;
    const dt_plan_precision *pr;
    if (!plan_view(t, info, &po, &sh, &pr)) return 0.0;
    dt_plan_estimate e;
    if (dt_plan_run_stage(&po, sh, pr, t->pp > 1 ? t->stage : 0, &e) != DT_OK) {
        dt_error_clear();
        return 0.0;
    }
    return (double)e.total;
}

static dt_status run_loop(trainer *t, dt_train_result *res) {
    const dt_train_opts *o = t->o;
    const dt_dataset_info *info = dt_dataset_get_info(t->train);
    dt_train_event ev = {.kind = DT_EV_START, .epochs = o->epochs, .step = t->g0, .total_steps = t->total,
                         .steps_per_epoch = t->spe, .nparams = (int64_t)dt_model_nparams(t->model),
                         .train_samples = info->n,
                         .test_samples = t->test ? dt_dataset_get_info(t->test)->n : 0,
                         .tokens_per_sample = t->lw,
                         .flops_per_token = t->lw > 1 ? flops_per_token(t->model) : 0.0,
                         .plan_bytes = t->rank == 0 ? planned_bytes(t, info) : 0.0,
                         .precision = dt_precision_name(dt_amp_precision(t->amp)),
                         .note = t->note[0] ? t->note : NULL, .pipeline = dt_train_pipe_text_(t)};
    emit(t, &ev);

    t->queued = t->g0;
    for (int d = 0; d < 2 && t->queued < t->total; d++) DT_TRY(queue_step(t, t->queued++));

    double epoch_start = dt_now(), train_time = 0.0;
    double loss = 0.0, lr = 0.0, norm = 0.0;
    int64_t run_steps = 0;   /* steps of this epoch run by this process (for samples/s) */
    for (int64_t g = t->g0; g < t->total; g++) {
        int64_t done = g + 1;
        int epoch = (int)(g / t->spe);
        int logged = (o->log_every > 0 && done % o->log_every == 0) || done == t->total;
        dt_train_trace_step_(t, g);
        DT_TRY(train_step(t, g, logged, &loss, &lr, &norm));
        DT_TRY(dt_mem_check_limit());
        t->epoch_loss += loss;
        t->epoch_steps++;
        run_steps++;
        int end_of_epoch = (done % t->spe == 0) || done == t->total;
        double now = dt_now();
        double elapsed = train_time + (now - epoch_start);
        double sps = (double)(run_steps * o->batch) / (now - epoch_start);
        int64_t left = t->total - done;
        double eta = elapsed / (double)(done - t->g0) * (double)left;
        if (g == t->g0) {   /* the first step of this run: how long a start (or a resume) took */
            dt_train_event e = {.kind = DT_EV_FIRST, .epoch = epoch, .epochs = o->epochs, .step = done,
                                .total_steps = t->total, .steps_per_epoch = t->spe, .elapsed_s = elapsed};
            emit(t, &e);
        }
        if (logged) {
            dt_train_event e = {.kind = DT_EV_STEP, .epoch = epoch, .epochs = o->epochs, .step = done,
                                .total_steps = t->total, .steps_per_epoch = t->spe,
                                .step_in_epoch = done - (int64_t)epoch * t->spe, .loss = loss, .lr = lr,
                                .grad_norm = norm, .samples_per_s = sps, .elapsed_s = elapsed, .eta_s = eta,
                                .loss_scale = dt_amp_step_scale(t->amp), .skipped = dt_amp_skipped(t->amp),
                                .threads = t->threads_steps ? t->threads_sum / (double)t->threads_steps : 0.0};
            t->threads_sum = 0.0;
            t->threads_steps = 0;
            DT_TRY(batch_hash(t, g, &e.batch_hash));
            emit(t, &e);
        }
        if (o->rank_stats_every > 0 && done % o->rank_stats_every == 0 && !end_of_epoch)
            DT_TRY(rank_report(t, done, epoch));
        if (t->test && o->eval_every > 0 && done % o->eval_every == 0 && !end_of_epoch) {
            dt_train_event e = {.kind = DT_EV_EVAL, .epoch = epoch, .epochs = o->epochs, .step = done,
                                .total_steps = t->total, .steps_per_epoch = t->spe, .loss = loss, .lr = lr,
                                .elapsed_s = elapsed, .eta_s = eta, .evaluated = 1};
            DT_TRY(validate(t, &e.test_loss, &e.test_acc));
            emit(t, &e);
        }
        if (end_of_epoch) {
            train_time += now - epoch_start;
            dt_train_event e = {.kind = DT_EV_EPOCH, .epoch = epoch, .epochs = o->epochs, .step = done,
                                .total_steps = t->total, .steps_per_epoch = t->spe,
                                .step_in_epoch = t->epoch_steps, .loss = t->epoch_loss / (double)t->epoch_steps,
                                .lr = lr, .grad_norm = norm, .samples_per_s = sps, .elapsed_s = train_time,
                                .eta_s = eta};
            if (t->test) {
                DT_TRY(validate(t, &e.test_loss, &e.test_acc));
                e.evaluated = 1;
                res->test_loss = e.test_loss;
                res->test_acc = e.test_acc;
                res->evaluated = 1;
            }
            emit(t, &e);
            if (t->world > 1 || o->rank_stats_every > 0) DT_TRY(rank_report(t, done, epoch));
            t->epoch_loss = 0.0;
            t->epoch_steps = 0;
            run_steps = 0;
            epoch_start = dt_now();
        }
        int stop = o->stop_at > 0 && done >= o->stop_at && done < t->total;
        if (!stop && done < t->total && o->stop_request) DT_TRY(stop_requested(t, &stop));
        DT_TRY(dt_train_checkpoint_(t, done, stop != 0));
        DT_TRY(dt_train_snapshot_(t, done, stop && !o->ckpt_dir));   /* a stop without a checkpoint keeps one */
        if (stop) {
            /* an interruption on purpose: checkpointed above, end without finishing */
            DT_TRY(dt_shard_gather_root(t->shard));
            if (t->pipe) DT_TRY(dt_train_pipe_gather_(t));
            DT_TRY(dt_mem_check_limit());
            res->stopped = stop;
            dt_mem_get(&res->mem);
            res->steps = done;
            res->final_loss = loss;
            return DT_OK;
        }
    }
    /* Training is over. With sharded parameters each one has a single owner, so there
     * is nothing to compare: rank 0 receives the whole model to hand to the caller
     * (after giving back its optimizer state and gradient shard, 12/W bytes a parameter,
     * before 4 - 4/W arrive), the others end with their shard. Otherwise every rank
     * must end with the same parameters: a hash per tensor, compared. */
    if (dt_shard_params_sharded(t->shard)) {
        dt_optim_free(t->optim);
        t->optim = NULL;
        DT_TRY(dt_shard_release_grads(t->shard));
        DT_TRY(dt_shard_gather_root(t->shard));
    } else {
        DT_TRAIN_EACH_CHUNK(t, j) {
            DT_TRY(dt_ddp_check_equal(t->ddp));   /* each chunk's range over its replicas */
            if (!t->pipe) continue;
            dt_optim_free(t->optim);   /* the whole model comes next: the optimizer state goes first */
            t->optim = NULL;
        }
        if (t->pipe) DT_TRY(dt_train_pipe_gather_(t));   /* every rank: the whole model */
    }
    DT_TRY(dt_mem_check_limit());
    dt_mem_get(&res->mem);
    res->steps = t->total;
    res->final_loss = loss;
    res->seconds = train_time;
    res->samples_per_s = train_time > 0 ? (double)((t->total - t->g0) * o->batch) / train_time : 0.0;
    return DT_OK;
}

dt_status dt_train_run(const dt_train_opts *o, const dt_ops *ops, dt_comm *comm,
                       dt_model **model_out, dt_train_result *res) {
    trainer t;
    dt_train_result r;
    memset(&t, 0, sizeof t);
    memset(&r, 0, sizeof r);
    t.o = o;
    t.ops = ops;
    t.comm = comm;
    dt_mem_reset_peak();   /* this run's peaks, not those of what the process did before */
    dt_ops_reset_peak(ops);
    const size_t cap_before = dt_mem_limit();
    dt_mem_set_limit(o->max_memory);
    dt_status s = trainer_setup(&t);
    if (s == DT_OK) {   /* the normalisation a user must repeat to feed these weights */
        const dt_dataset_info *di = dt_dataset_get_info(t.train);
        _Static_assert(sizeof r.norm_mean / sizeof r.norm_mean[0] == DT_DATA_MAX_CHANNELS, "one slot per channel");
        r.norm_channels = di->channels;
        memcpy(r.norm_mean, di->mean, sizeof r.norm_mean);
        memcpy(r.norm_std, di->std, sizeof r.norm_std);
        s = run_loop(&t, &r);
        if (s == DT_OK) s = dt_train_trace_write_(&t);
        r.skipped_steps = dt_amp_skipped(t.amp);
        r.loss_scale = dt_amp_scale(t.amp);
    }
    if (s != DT_OK && t.world > 1 && strncmp(dt_last_error(), "rank ", 5) != 0)
        dt_error_wrap(s, "rank %d: ", t.rank);
    if (res) *res = r;
    if (s == DT_OK && model_out) {
        *model_out = t.model;
        t.model = NULL;
    }
    dt_trace_enable(0);        /* a run that failed leaves no trace file and no records */
    dt_trace_reset();
    trainer_free(&t);          /* first: DDP unhooks itself from the model */
    dt_model_free(t.model);
    dt_mem_set_limit(cap_before);   /* the caller's model outlives the run, and so does its cap */
    return s;
}
