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
#include "ckpt_impl.h"
#include "clock.h"
#include "options.h"
#include "trace.h"
#include "train_impl.h"

/* A sharded state (ckpt.h), saved to pl's directory: every rank writes its shard of
 * parameters and optimizer state at once, the first rank of each group sharing the
 * directory begins it and commits the buffers and the manifest; every rank learns the
 * outcome. No rank gathers anything. */
/* Rank r's piece of a sharded checkpoint for its chunk j: r, or in a pipeline chunk-major
 * (chunk j pp + r % pp of the cut, replica r / pp). */
int dt_train_piece_(const trainer *t, int r, int j) {
    return t->pipe ? (j * t->pp + r % t->pp) * t->dp + r / t->pp : r;
}

int dt_train_pieces_(const trainer *t) { return t->world * dt_train_pipe_chunks_(t); }

static dt_status save_sharded(trainer *t, const dt_train_meta *me, const dt_train_place_ *pl) {
    char tmp[4096] = "";
    int64_t st = DT_OK;
    int leader = dt_comm_rank(pl->group) == 0;
    if (leader) st = dt_ckpt_begin_(pl->dir, me->info.step, pl->reuse ? pl->keep : 0, tmp, sizeof tmp);
    DT_TRY(dt_broadcast(pl->group, &st, 1, DT_I64, 0));
    if (st != DT_OK)
        return leader ? (dt_status)st : dt_error((dt_status)st, "the first rank writing to %s could not start "
                                                 "the checkpoint", pl->dir);
    DT_TRY(dt_broadcast(pl->group, tmp, sizeof tmp, DT_U8, 0));
    typedef struct { int64_t st, lo, len; char sum[DT_CKPT_SUM_LEN]; } piece;
    const int V = dt_train_pipe_chunks_(t), W = dt_train_pieces_(t);   /* a piece a chunk */
    piece *mine = calloc((size_t)V, sizeof *mine);
    if (!mine) return dt_error(DT_ERR_NOMEM, "out of memory for the checkpoint's list");
    char why[1024] = "";
    dt_status wrote = DT_OK;
    for (int j = V - 1; j >= 0; j--) {   /* a pipeline stage's chunks, 0's last */
        dt_train_pipe_use_(t, j);
        size_t lo, len;
        dt_shard_range(t->shard, &lo, &len);
        /* A pipeline's pieces in the manifest go chunk by chunk, each chunk's replicas in
         * order (so they tile the array); a chunk's state not sharded over its replicas is
         * written by replica 0, the others' pieces empty. */
        int empty = t->pipe && t->dpr > 0 && !dt_shard_state_sharded(t->shard);
        if (empty) lo += len, len = 0;
        mine[j].lo = (int64_t)lo;
        mine[j].len = (int64_t)len;
        mine[j].st = wrote == DT_OK ? dt_ckpt_write_shard(tmp, dt_train_piece_(t, t->rank, j), W, t->model,
                                                          empty ? NULL : t->optim, lo, len, mine[j].sum)
                                    : wrote;
        if (mine[j].st != DT_OK && wrote == DT_OK) {
            wrote = (dt_status)mine[j].st;
            snprintf(why, sizeof why, "%s", dt_last_error());
        }
    }
    if (pl->copy) {   /* every rank takes part, so that a failed write fails no exchange */
        dt_status c = pl->copy(t, tmp, wrote);
        if (c != DT_OK && wrote == DT_OK) {
            wrote = c;
            for (int j = 0; j < V; j++) mine[j].st = c;
            snprintf(why, sizeof why, "%s", dt_last_error());
        }
    }
    piece *all = calloc((size_t)W, sizeof *all);
    size_t *los = calloc((size_t)W, sizeof *los), *lens = calloc((size_t)W, sizeof *lens);
    char (*sums)[DT_CKPT_SUM_LEN] = calloc((size_t)W, sizeof *sums);
    dt_status s = all && los && lens && sums ? DT_OK : dt_error(DT_ERR_NOMEM, "out of memory for the checkpoint's list");
    if (s == DT_OK) s = dt_allgather(t->comm, mine, all, (size_t)V * sizeof *mine, DT_U8);
    int bad = -1;
    for (int r = 0; s == DT_OK && r < t->world; r++)
        for (int j = 0; j < V; j++) {
            const piece *pc = &all[(size_t)r * V + j];
            if (pc->st != DT_OK && bad < 0) bad = r;
            int k = dt_train_piece_(t, r, j);
            los[k] = (size_t)pc->lo;
            lens[k] = (size_t)pc->len;
            memcpy(sums[k], pc->sum, sizeof sums[k]);
            sums[k][DT_CKPT_SUM_LEN - 1] = '\0';
        }
    int64_t bad_st = bad >= 0 ? all[(size_t)bad * V].st : DT_OK;
    for (int j = 0; bad >= 0 && j < V && bad_st == DT_OK; j++) bad_st = all[(size_t)bad * V + j].st;
    if (s == DT_OK && bad >= 0)
        s = bad == t->rank ? dt_error(wrote, "%s", why)
                           : dt_error((dt_status)bad_st, "rank %d could not write its shard", bad);
    if (leader) {
        if (s == DT_OK) s = dt_ckpt_commit(pl->dir, pl->keep, tmp, t->model, t->optim, &me->info, me->extra,
                                           me->nextra, W, los, lens, (const char (*)[DT_CKPT_SUM_LEN])sums);
        else dt_ckpt_abort(tmp);
    }
    free(mine);
    free(all);
    free(los);
    free(lens);
    free(sums);
    /* the committing ranks' outcomes for all */
    if (bad < 0) {
        st = s;
        int who;
        DT_TRY(dt_train_agree_(t, &st, &who));
        if (st != DT_OK && who != t->rank)
            s = dt_error((dt_status)st, "rank %d could not complete the checkpoint", who);
    }
    return s;
}

/* Every rank's status: the first rank's that failed into *st (and that rank into *who),
 * DT_OK when none did. */
dt_status dt_train_agree_(trainer *t, int64_t *st, int *who) {
    *who = -1;
    if (t->world < 2) {
        if (*st != DT_OK) *who = t->rank;
        return DT_OK;
    }
    int64_t *all = calloc((size_t)t->world, sizeof *all);
    if (!all) return dt_error(DT_ERR_NOMEM, "out of memory for %d statuses", t->world);
    dt_status s = dt_allgather(t->comm, st, all, 1, DT_I64);
    *st = DT_OK;
    for (int r = 0; s == DT_OK && r < t->world && *who < 0; r++)
        if (all[r] != DT_OK) *st = all[r], *who = r;
    free(all);
    return s;
}

/* What a checkpoint after step done records beside the state: the loop's own values, then
 * every recorded row (options.h), which resume_compare holds a resumed run to. */
dt_status dt_train_meta_(trainer *t, int64_t done, dt_train_meta *me) {
    const dt_train_opts *o = t->o;
    memset(me, 0, sizeof *me);
    snprintf(me->loss, sizeof me->loss, "%.17g", t->epoch_loss);
    snprintf(me->total, sizeof me->total, "%lld", (long long)t->total);
    dt_amp_scaler_text(t->amp, me->scaler, sizeof me->scaler);
    /* the per-sample input shape, so `dtrain export` can build the model */
    const dt_dataset_info *di = dt_dataset_get_info(t->train);
    for (int i = 0; i < di->ndim; i++) {
        size_t k = strlen(me->shape);
        snprintf(me->shape + k, sizeof me->shape - k, "%s%lld", i ? "," : "", (long long)di->shape[i]);
    }
    const char *first[] = {"epoch_loss", me->loss, "total_steps", me->total, "loss_scaler", me->scaler,
                           "input_shape", me->shape};
    memcpy(me->extra, first, sizeof first);
    me->nextra = 4;
    int n;
    const dt_opt_row *rows = dt_train_options(&n);
    for (int i = 0; i < n; i++) {
        if (!(rows[i].where & DT_OPT_RECORD)) continue;
        if (me->nextra == DT_TRAIN_META_MAX_)
            return dt_error(DT_ERR_INTERNAL, "checkpoint: more than %d recorded settings", DT_TRAIN_META_MAX_);
        me->extra[2 * me->nextra] = rows[i].field;
        me->extra[2 * me->nextra + 1] = dt_opt_text(&rows[i], o, me->text[me->nextra], sizeof me->text[me->nextra]);
        me->nextra++;
    }
    me->info = (dt_ckpt_info){.step = done, .epoch = done / t->spe, .step_in_epoch = done % t->spe,
                              .seed = o->seed, .batch = o->batch, .micro_batches = t->S, .world_size = t->world,
                              .model_spec = o->model, .schedule = o->schedule};
    return DT_OK;
}

/* The state after step done into pl's directory: a sharded checkpoint where the state is
 * sharded (or pipelined), else one written by each group's first rank. */
dt_status dt_train_save_(trainer *t, int64_t done, const dt_train_place_ *pl) {
    dt_train_meta *me = malloc(sizeof *me);
    if (!me) return dt_error(DT_ERR_NOMEM, "checkpoint: out of memory");
    dt_status s = dt_train_meta_(t, done, me);
    if (s == DT_OK && (dt_shard_state_sharded(t->shard) || t->pipe)) s = save_sharded(t, me, pl);
    else if (s == DT_OK) {
        int64_t st = !pl->group || dt_comm_rank(pl->group) == 0
                   ? dt_ckpt_save_(pl->dir, pl->keep, pl->reuse, t->model, t->optim, &me->info, me->extra, me->nextra)
                   : DT_OK;
        s = (dt_status)st;
        if (pl->group != t->comm) {   /* a writer per group: every rank learns each outcome */
            int who;
            s = dt_train_agree_(t, &st, &who);
            if (s == DT_OK && st != DT_OK && who != t->rank)
                s = dt_error((dt_status)st, "rank %d could not complete the checkpoint", who);
            else if (s == DT_OK) s = (dt_status)st;
        }
    }
    free(me);
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
    double t0 = dt_now();
    dt_train_place_ disk = {.dir = o->ckpt_dir, .keep = o->ckpt_keep, .group = t->comm};
    dt_status s = dt_train_save_(t, done, &disk);
    if (s != DT_OK) dt_error_wrap(s, "checkpoint at step %lld: ", (long long)done);
    char d[48];
    snprintf(d, sizeof d, "step %lld", (long long)done);
    dt_trace_span("checkpoint", "checkpoint", t0, dt_now(), d);
    return s;
}

/* The newest step-* name in dir (not opened: only to compare with the snapshots); -1: none. */
static int64_t newest_on_disk(const char *dir) {
    dt_ckpt_entry_ *v = NULL;
    size_t n = 0;
    int missing = 0;
    int64_t step = dt_ckpt_list_(dir, &v, &n, &missing) == DT_OK && n > 0 ? v[0].step : -1;
    free(v);
    return step;
}

/* The opened checkpoint t->resume (at path) against this run: seed, batch, micro-batches. */
static dt_status resume_check(trainer *t, const char *path) {
    const dt_train_opts *o = t->o;
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
    return DT_OK;
}

/* Which checkpoint to resume from: rank 0 decides and tells the others, so all
 * ranks load the same one (the directory must be visible to every rank). With
 * snapshots (train_snap.c) and "auto", the nodes' in-memory state when it is at least
 * as new as the disk's newest. */
dt_status dt_train_resume_open_(trainer *t) {
    const dt_train_opts *o = t->o;
    char path[4096] = "", skipped[1024] = "";
    int found = 0, is_auto = !strcmp(o->resume, "auto");
    if (t->snap && is_auto) {
        int64_t disk = t->rank == 0 && o->ckpt_dir ? newest_on_disk(o->ckpt_dir) : -1;
        if (t->world > 1) DT_TRY(dt_broadcast(t->comm, &disk, 1, DT_I64, 0));
        int used;
        DT_TRY(dt_train_snap_resume_(t, disk, path, sizeof path, &used));
        if (used) return resume_check(t, path);
    }
    if (t->rank == 0) {
        const char *where = o->resume;
        if (is_auto) {
            if (!o->ckpt_dir && !t->snap)
                return dt_error(DT_ERR_INVALID, "ckpt_dir: required to resume 'auto' (from the newest checkpoint in it)");
            where = o->ckpt_dir;
        }
        char probe[4096];
        snprintf(probe, sizeof probe, "%s/train_state.safetensors", where ? where : "");
        if (!where) {
            /* snapshots only, and none to resume from: a fresh start */
        } else if (access(probe, F_OK) == 0) {            /* one step-* directory */
            snprintf(path, sizeof path, "%s", where);
            found = 1;
        } else {
            dt_status s = dt_ckpt_latest(where, path, sizeof path, skipped, sizeof skipped);
            if (s == DT_OK) found = 1;
            else if (s == DT_ERR_IO && !is_auto)
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
    size_t nl = strlen(t->note);   /* after a snapshot passed over, what it says */
    if (!found) {
        if (o->ckpt_dir) snprintf(t->note + nl, sizeof t->note - nl, "no checkpoint in %s yet: starting from step 0",
                                  o->ckpt_dir);
        else snprintf(t->note + nl, sizeof t->note - nl, "no snapshot yet: starting from step 0");
        return DT_OK;
    }
    DT_TRY(dt_ckpt_open(path, &t->resume));
    DT_TRY(resume_check(t, path));
    if (snprintf(t->note + nl, sizeof t->note - nl, "resumed from %s (step %lld)%s%s", path,
                 (long long)dt_ckpt_info_of(t->resume)->step, skipped[0] ? "; skipped: " : "",
                 skipped) >= (int)(sizeof t->note - nl))
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
    DT_TRAIN_EACH_CHUNK(t, j) {
        size_t lo, len, n = dt_model_nparams(t->model), plo = 0, phi = n;
        dt_shard_range(t->shard, &lo, &len);
        if (dt_shard_params_sharded(t->shard)) plo = lo, phi = lo + len;
        if (t->pipe) dt_train_pipe_range_(t, &plo, &phi);   /* a chunk's own (the tied head's comes from its owner) */
        DT_TRY(dt_ckpt_restore_range(t->resume, t->model, plo, phi, t->optim, lo));
    }
    DT_TRY(resume_compare(t));
    DT_TRY(dt_amp_restore(t->amp, dt_ckpt_extra(t->resume, "loss_scaler")));
    dt_train_pipe_amp_follow_(t);   /* a pipeline stage's other chunks */
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

