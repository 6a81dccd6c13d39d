/*
 * train_ckpt.c: the trainer's checkpoint and resume protocol.
 *
 * A checkpoint holds the model, the optimizer state, the loop's position and the
 * settings that decide the computation: the structured ones of dt_ckpt_info (seed,
 * batch, micro-batches, model, schedule), the optimizer's hyper-parameters, and as
 * text every row of options.h marked DT_OPT_RECORD. A resume is held to all of them,
 * naming each that differs, unless overridden. A run whose state is sharded over
 * several ranks writes a sharded checkpoint (every rank its part); either kind loads
 * on any world size and in any sharding mode.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checkpoint.h"
#include "clock.h"
#include "options.h"
#include "trace.h"
#include "train_impl.h"

/* A sharded run's checkpoint (ckpt.h): every rank writes its shard of parameters and
 * optimizer state at once, rank 0 the buffers and the manifest; every rank learns the
 * outcome. No rank gathers anything. */
/* Rank r's piece of a sharded checkpoint: r, or in a pipeline stage-major (stage r % pp,
 * replica r / pp). */
static int piece_of(const trainer *t, int r) { return t->pipe ? (r % t->pp) * t->dp + r / t->pp : r; }

static dt_status save_sharded(trainer *t, const dt_ckpt_info *info, const char *const *extra, int nextra) {
    const dt_train_opts *o = t->o;
    char tmp[4096] = "";
    int64_t st = DT_OK;
    if (t->rank == 0) st = dt_ckpt_begin(o->ckpt_dir, info->step, tmp, sizeof tmp);
    DT_TRY(dt_broadcast(t->comm, &st, 1, DT_I64, 0));
    if (st != DT_OK) return t->rank == 0 ? (dt_status)st : dt_error((dt_status)st, "rank 0 could not start the checkpoint");
    DT_TRY(dt_broadcast(t->comm, tmp, sizeof tmp, DT_U8, 0));
    typedef struct { int64_t st, lo, len; char sum[DT_CKPT_SUM_LEN]; } piece;
    piece mine = {0};
    size_t lo, len;
    dt_shard_range(t->shard, &lo, &len);
    /* A pipeline's pieces in the manifest go stage by stage, each stage's replicas in
     * order (so they tile the array); a stage's state not sharded over its replicas is
     * written by replica 0, the others' pieces empty. */
    int empty = t->pipe && t->dpr > 0 && !dt_shard_state_sharded(t->shard);
    if (empty) lo += len, len = 0;
    mine.lo = (int64_t)lo;
    mine.len = (int64_t)len;
    mine.st = dt_ckpt_write_shard(tmp, piece_of(t, t->rank), t->world, t->model, empty ? NULL : t->optim, lo, len,
                                  mine.sum);
    char why[1024];
    snprintf(why, sizeof why, "%s", mine.st != DT_OK ? dt_last_error() : "");
    piece *all = calloc((size_t)t->world, sizeof *all);
    size_t *los = calloc((size_t)t->world, sizeof *los), *lens = calloc((size_t)t->world, sizeof *lens);
    char (*sums)[DT_CKPT_SUM_LEN] = calloc((size_t)t->world, sizeof *sums);
    dt_status s = all && los && lens && sums ? DT_OK : dt_error(DT_ERR_NOMEM, "out of memory for the checkpoint's list");
    if (s == DT_OK) s = dt_allgather(t->comm, &mine, all, sizeof mine, DT_U8);
    int bad = -1;
    for (int r = 0; s == DT_OK && r < t->world; r++) {
        if (all[r].st != DT_OK && bad < 0) bad = r;
        int k = piece_of(t, r);
        los[k] = (size_t)all[r].lo;
        lens[k] = (size_t)all[r].len;
        memcpy(sums[k], all[r].sum, sizeof sums[k]);
        sums[k][DT_CKPT_SUM_LEN - 1] = '\0';
    }
    if (s == DT_OK && bad >= 0)
        s = bad == t->rank ? dt_error((dt_status)mine.st, "%s", why)
                           : dt_error((dt_status)all[bad].st, "rank %d could not write its shard", bad);
    if (t->rank == 0) {
        if (s == DT_OK) s = dt_ckpt_commit(o->ckpt_dir, o->ckpt_keep, tmp, t->model, t->optim, info, extra, nextra,
                                           t->world, los, lens, (const char (*)[DT_CKPT_SUM_LEN])sums);
        else dt_ckpt_abort(tmp);
    }
    free(all);
    free(los);
    free(lens);
    free(sums);
    /* rank 0's outcome for all */
    if (bad < 0) {
        st = s;
        DT_TRY(dt_broadcast(t->comm, &st, 1, DT_I64, 0));
        if (st != DT_OK && t->rank != 0) s = dt_error((dt_status)st, "rank 0 could not complete the checkpoint");
    }
    return s;
}

/* Checkpoints every --checkpoint-every steps and at the end. The state is the
 * same on every rank, so rank 0 alone writes it; a run that shards its state over
 * several ranks writes a sharded checkpoint (every rank its part). Either loads on any
 * world size and in any shard mode. */
dt_status dt_train_checkpoint_(trainer *t, int64_t done, int force) {
    const dt_train_opts *o = t->o;
    if (!o->ckpt_dir) return DT_OK;
    if (!force && !((o->ckpt_every > 0 && done % o->ckpt_every == 0) || done == t->total)) return DT_OK;
    char loss[64], total[32], shape[128] = "", scaler[96];
    snprintf(loss, sizeof loss, "%.17g", t->epoch_loss);
    snprintf(total, sizeof total, "%lld", (long long)t->total);
    dt_amp_scaler_text(t->amp, scaler, sizeof scaler);
    /* the per-sample input shape, so `dtrain export` can build the model */
    const dt_dataset_info *di = dt_dataset_get_info(t->train);
    for (int i = 0; i < di->ndim; i++) {
        size_t k = strlen(shape);
        snprintf(shape + k, sizeof shape - k, "%s%lld", i ? "," : "", (long long)di->shape[i]);
    }
    /* the loop's own values, then every recorded row (options.h): resume_compare holds a
     * resumed run to them */
    enum { MAX_EXTRA = 64 };
    const char *extra[2 * MAX_EXTRA] = {"epoch_loss", loss, "total_steps", total, "loss_scaler", scaler,
                                        "input_shape", shape};
    char text[MAX_EXTRA][48];
    int nextra = 4, n;
    const dt_opt_row *rows = dt_train_options(&n);
    for (int i = 0; i < n; i++) {
        if (!(rows[i].where & DT_OPT_RECORD)) continue;
        if (nextra == MAX_EXTRA) return dt_error(DT_ERR_INTERNAL, "checkpoint: more than %d recorded settings", MAX_EXTRA);
        extra[2 * nextra] = rows[i].field;
        extra[2 * nextra + 1] = dt_opt_text(&rows[i], o, text[nextra], sizeof text[nextra]);
        nextra++;
    }
    dt_ckpt_info info = {.step = done, .epoch = done / t->spe, .step_in_epoch = done % t->spe,
                         .seed = o->seed, .batch = o->batch, .micro_batches = t->S, .world_size = t->world,
                         .model_spec = o->model, .schedule = o->schedule};
    dt_status s = DT_OK;
    double t0 = dt_now();
    if (dt_shard_state_sharded(t->shard) || t->pipe) s = save_sharded(t, &info, extra, nextra);
    else if (t->rank == 0) s = dt_ckpt_save(o->ckpt_dir, o->ckpt_keep, t->model, t->optim, &info, extra, nextra);
    if (s != DT_OK) dt_error_wrap(s, "checkpoint at step %lld: ", (long long)done);
    char d[48];
    snprintf(d, sizeof d, "step %lld", (long long)done);
    dt_trace_span("checkpoint", "checkpoint", t0, dt_now(), d);
    return s;
}

/* Which checkpoint to resume from: rank 0 decides and tells the others, so all
 * ranks load the same one (the directory must be visible to every rank). */
dt_status dt_train_resume_open_(trainer *t) {
    const dt_train_opts *o = t->o;
    char path[4096] = "", skipped[1024] = "";
    int found = 0;
    if (t->rank == 0) {
        const char *where = o->resume;
        if (!strcmp(where, "auto")) {
            if (!o->ckpt_dir) return dt_error(DT_ERR_INVALID, "ckpt_dir: required to resume 'auto' (from the newest checkpoint in it)");
            where = o->ckpt_dir;
        }
        char probe[4096];
        snprintf(probe, sizeof probe, "%s/train_state.safetensors", where);
        if (access(probe, F_OK) == 0) {            /* one step-* directory */
            snprintf(path, sizeof path, "%s", where);
            found = 1;
        } else {
            dt_status s = dt_ckpt_latest(where, path, sizeof path, skipped, sizeof skipped);
            if (s == DT_OK) found = 1;
            else if (s == DT_ERR_IO && strcmp(o->resume, "auto") != 0)
                return DT_ERR_INVALID;                   /* a named checkpoint that is not there: bad input */
            else if (s != DT_ERR_IO) return s;           /* auto: nothing yet is fine */
        }
    }
    if (t->world > 1) {
        int64_t f = found;
        DT_TRY(dt_broadcast(t->comm, &f, 1, DT_I64, 0));
        DT_TRY(dt_broadcast(t->comm, path, sizeof path, DT_U8, 0));
        found = (int)f;
    }
    if (!found) {
        snprintf(t->note, sizeof t->note, "no checkpoint in %s yet: starting from step 0", o->ckpt_dir);
        return DT_OK;
    }
    DT_TRY(dt_ckpt_open(path, &t->resume));
    const dt_ckpt_info *ci = dt_ckpt_info_of(t->resume);
    if (ci->seed != o->seed)
        return dt_error(DT_ERR_INVALID, "resume: %s was written with seed %llu, this run has seed %llu",
                        path, (unsigned long long)ci->seed, (unsigned long long)o->seed);
    if (ci->batch != o->batch)
        return dt_error(DT_ERR_INVALID, "resume: %s was written with a global batch of %lld, this run has a global batch of %lld",
                        path, (long long)ci->batch, (long long)o->batch);
    if (o->micro_batches > 0 && o->micro_batches != ci->micro_batches)
        return dt_error(DT_ERR_INVALID, "resume: %s was written with %lld micro-batches; resume with as many "
                        "(or leave the count to the checkpoint) to continue the same computation",
                        path, (long long)ci->micro_batches);
    if (snprintf(t->note, sizeof t->note, "resumed from %s (step %lld)%s%s", path, (long long)ci->step,
                 skipped[0] ? "; skipped: " : "", skipped) >= (int)sizeof t->note)
        memcpy(t->note + sizeof t->note - 4, "...", 4);   /* a long path and list: cut, and said to be */
    return DT_OK;
}

/* Append "what: recorded -> now" to list (n bytes) when the two texts differ. */
static void note_change(char *list, size_t n, const char *what, const char *was, const char *now) {
    if (!strcmp(was, now)) return;
    size_t len = strlen(list);
    snprintf(list + len, n - len, "%s%s '%s' -> '%s'", len ? ", " : "", what, was, now);
}

/* A resumed run continues the recorded computation only with the recorded model,
 * data and hyper-parameters: refuse a difference, naming each, unless overridden
 * (then the START note says what changed). */
static dt_status resume_compare(trainer *t) {
    const dt_ckpt_info *ci = dt_ckpt_info_of(t->resume);
    char diff[1024] = "";
    note_change(diff, sizeof diff, "model", ci->model_spec, t->o->model);
    note_change(diff, sizeof diff, "schedule", ci->schedule, t->o->schedule);
    /* the rows kept as text beside the state (options.h); a checkpoint from before a row
     * was recorded is not held to it */
    int n;
    const dt_opt_row *rows = dt_train_options(&n);
    for (int i = 0; i < n; i++) {
        const char *was = rows[i].where & DT_OPT_RECORD ? dt_ckpt_extra(t->resume, rows[i].field) : NULL;
        char now[48];
        if (was) note_change(diff, sizeof diff, rows[i].field, was, dt_opt_text(&rows[i], t->o, now, sizeof now));
    }
    if (ci->has_optim) {
        const dt_optim_config *now = dt_optim_config_of(t->optim);
        int nhp;
        const dt_optim_hparam *hp = dt_optim_hparams(&nhp);
        for (int i = 0; i < nhp; i++) {
            char was[32], cur[32];
            const char *a = (const char *)&ci->optim + hp[i].offset, *b = (const char *)now + hp[i].offset;
            size_t width = hp[i].is_int ? sizeof(int) : sizeof(float);
            if (!memcmp(a, b, width)) continue;     /* the exact value, bit for bit */
            if (hp[i].is_int) {
                snprintf(was, sizeof was, "%d", *(const int *)a);
                snprintf(cur, sizeof cur, "%d", *(const int *)b);
            } else {   /* shortest text that still tells two floats apart */
                int prec = 6;
                do {
                    snprintf(was, sizeof was, "%.*g", prec, (double)*(const float *)a);
                    snprintf(cur, sizeof cur, "%.*g", prec, (double)*(const float *)b);
                } while (!strcmp(was, cur) && ++prec <= 9);
            }
            note_change(diff, sizeof diff, hp[i].name, was, cur);
        }
    }
    if (!diff[0]) return DT_OK;
    if (!t->o->resume_override)
        return dt_error(DT_ERR_INVALID, "resume: this run differs from the checkpoint: %s; resume with the recorded "
                        "settings to continue the same computation, or override this check to continue anyway", diff);
    size_t len = strlen(t->note);
    snprintf(t->note + len, sizeof t->note - len, "; changed on resume (overridden): %s", diff);
    return DT_OK;
}

/* Restore model, optimizer and loop position from the opened checkpoint. */
dt_status dt_train_resume_restore_(trainer *t) {
    const dt_ckpt_info *ci = dt_ckpt_info_of(t->resume);
    const char *total = dt_ckpt_extra(t->resume, "total_steps");
    if (total && strtoll(total, NULL, 10) != t->total)
        return dt_error(DT_ERR_INVALID, "resume: the checkpointed run has %s steps in all, this one %lld; resume "
                        "with the same epochs and step limit so the schedule continues unchanged", total, (long long)t->total);
    if (ci->step > t->total)
        return dt_error(DT_ERR_INVALID, "resume: the checkpoint is at step %lld, past this run's %lld steps",
                        (long long)ci->step, (long long)t->total);
    /* the tensors first: another model gets the message naming the first tensor that
     * differs. A rank reads the parameters it holds (its shard with --shard params) and
     * its range of the optimizer state, from a sharded checkpoint or not. */
    size_t lo, len, n = dt_model_nparams(t->model), plo = 0, phi = n;
    dt_shard_range(t->shard, &lo, &len);
    if (dt_shard_params_sharded(t->shard)) plo = lo, phi = lo + len;
    if (t->pipe) dt_train_pipe_range_(t, &plo, &phi);   /* a stage's own (the tied head's comes from its owner) */
    DT_TRY(dt_ckpt_restore_range(t->resume, t->model, plo, phi, t->optim, lo));
    DT_TRY(resume_compare(t));
    DT_TRY(dt_amp_restore(t->amp, dt_ckpt_extra(t->resume, "loss_scaler")));
    const char *el = dt_ckpt_extra(t->resume, "epoch_loss");
    t->g0 = ci->step;
    t->epoch_loss = el ? strtod(el, NULL) : 0.0;
    t->epoch_steps = ci->step % t->spe;
    dt_ckpt_close(t->resume);
    t->resume = NULL;
    return DT_OK;
}

/* The checkpoint directory must be writable before the first step: rank 0 (the
 * writer) prepares it and every rank learns the outcome, so a bad directory
 * costs no training. */
dt_status dt_train_check_ckpt_dir_(trainer *t) {
    const char *dir = t->o->ckpt_dir;
    if (!dir) return DT_OK;
    int64_t okay = 1;
    char msg[512] = "";
    if (t->rank == 0 && dt_ckpt_prepare_dir(dir) != DT_OK) {
        okay = 0;
        snprintf(msg, sizeof msg, "%s", dt_last_error());
    }
    if (t->world > 1) DT_TRY(dt_broadcast(t->comm, &okay, 1, DT_I64, 0));
    if (okay) return DT_OK;
    if (t->rank == 0) return dt_error(DT_ERR_INVALID, "ckpt_dir: %s", msg);
    return dt_error(DT_ERR_INVALID, "ckpt_dir: rank 0 cannot write checkpoints into %s", dir);
}

