/*
 * data_loader.c: the batch loader: a background thread gathers the samples of
 * submitted batches into host buffers while the current step runs.
 *
 * The loader holds `depth` slots (2 = double buffering), used in ring order.
 * A slot goes FREE -> QUEUED (submit copied its indices) -> READY (the thread
 * gathered x and y) -> HELD (next() handed it out) -> FREE (the following
 * next(), or release()). The usual loop is
 *
 *     submit(batch 0)
 *     for each step t: next() -> x, y; submit(batch t+1); compute on x, y
 *
 * so batch t+1 is gathered while step t computes. With depth d, up to d-1
 * batches can be queued ahead of the one in use; submit() fails instead of
 * blocking when none is free, since waiting there could never end.
 *
 * The time next() spends blocked is summed: that is the per-rank "data wait".
 * A failure in the thread is stored in its slot and returned by the next()
 * that reaches it, with the thread's message.
 */
#include "config.h"

#include "data.h"
#include "clock.h"
#include "trace.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef enum { SLOT_FREE, SLOT_QUEUED, SLOT_READY, SLOT_HELD } slot_state;

typedef struct {
    slot_state st;
    int64_t   *idx;       /* (max_batch) */
    size_t     n;
    float     *x;         /* (max_batch, sample_size) */
    int32_t   *y;         /* (max_batch, label_width) */
    dt_status  err;       /* what the thread hit while gathering */
    char       msg[512];
} slot;

struct dt_loader {
    const dt_dataset *ds;
    size_t            max_batch;
    dt_loader_opts    o;
    slot             *slots;
    int               submit_pos, work_pos, next_pos, held; /* held: slot index or -1 */
    pthread_t         thread;
    int               thread_started, stop;
    pthread_mutex_t   mu;
    pthread_cond_t    work_cv, done_cv;
    double            wait_s;
    int64_t           batches;
};

static void *default_alloc(void *ctx, size_t bytes) {
    (void)ctx;
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0) return NULL;
    return p;
}

static void default_free(void *ctx, void *p) {
    (void)ctx;
    free(p);
}

static void *loader_main(void *arg) {
    dt_loader *l = arg;
    dt_trace_thread("loader");
    pthread_mutex_lock(&l->mu);
    for (;;) {
        while (!l->stop && l->slots[l->work_pos].st != SLOT_QUEUED) pthread_cond_wait(&l->work_cv, &l->mu);
        if (l->stop) break;
        slot *s = &l->slots[l->work_pos];
        pthread_mutex_unlock(&l->mu);
        /* The slot is ours while QUEUED: nobody else touches it. */
        double t0 = dt_trace_on() ? dt_now() : 0.0;
        s->err = dt_dataset_gather(l->ds, s->idx, s->n, s->x, s->y);
        if (t0 > 0.0) dt_trace_span("gather batch", "data", t0, dt_now(), NULL);
        if (s->err != DT_OK) snprintf(s->msg, sizeof s->msg, "loader thread: %s", dt_last_error());
        pthread_mutex_lock(&l->mu);
        s->st = SLOT_READY;
        l->work_pos = (l->work_pos + 1) % l->o.depth;
        pthread_cond_broadcast(&l->done_cv);
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

dt_status dt_loader_init(const dt_dataset *ds, size_t max_batch, dt_loader **out) {
    return dt_loader_init_opts(ds, max_batch, NULL, out);
}

dt_status dt_loader_init_opts(const dt_dataset *ds, size_t max_batch, const dt_loader_opts *opts, dt_loader **out) {
    *out = NULL;
    if (!ds) return dt_error(DT_ERR_INVALID, "loader: no dataset");
    if (max_batch == 0) return dt_error(DT_ERR_INVALID, "loader: batch size must be positive");
    size_t row = (size_t)dt_dataset_get_info(ds)->sample_size, lw = (size_t)dt_dataset_get_info(ds)->label_width;
    if (max_batch > SIZE_MAX / sizeof(float) / row || max_batch > SIZE_MAX / sizeof(int32_t) / lw)
        return dt_error(DT_ERR_INVALID, "loader: batch of %zu samples is too large", max_batch);
    dt_loader *l = calloc(1, sizeof *l);
    if (!l) return dt_error(DT_ERR_NOMEM, "loader: out of memory");
    l->ds = ds;
    l->max_batch = max_batch;
    if (opts) l->o = *opts;
    if (l->o.depth == 0) l->o.depth = 2;
    if (l->o.timeout_s <= 0) l->o.timeout_s = 600.0;
    if (!l->o.alloc || !l->o.free) {
        l->o.alloc = default_alloc;
        l->o.free = default_free;
        l->o.alloc_ctx = NULL;
    }
    l->held = -1;
    if (l->o.depth < 2 || l->o.depth > 64) {
        free(l);
        return dt_error(DT_ERR_INVALID, "loader: depth %d out of range [2, 64]", opts->depth);
    }
    dt_status s = DT_OK;
    l->slots = calloc((size_t)l->o.depth, sizeof *l->slots);
    if (!l->slots) s = dt_error(DT_ERR_NOMEM, "loader: out of memory");
    for (int i = 0; s == DT_OK && i < l->o.depth; i++) {
        slot *sl = &l->slots[i];
        sl->idx = malloc(max_batch * sizeof(int64_t));
        sl->x = l->o.alloc(l->o.alloc_ctx, max_batch * row * sizeof(float));
        sl->y = l->o.alloc(l->o.alloc_ctx, max_batch * lw * sizeof(int32_t));
        if (!sl->idx || !sl->x || !sl->y)
            s = dt_error(DT_ERR_NOMEM, "loader: out of memory for %d buffers of %zu samples", l->o.depth, max_batch);
    }
    int mu_ok = 0, work_ok = 0, done_ok = 0;
    if (s == DT_OK) {
        pthread_condattr_t ca;
        mu_ok = pthread_mutex_init(&l->mu, NULL) == 0;
        work_ok = pthread_cond_init(&l->work_cv, NULL) == 0;
        done_ok = pthread_condattr_init(&ca) == 0 && pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) == 0 &&
                  pthread_cond_init(&l->done_cv, &ca) == 0;
        if (!mu_ok || !work_ok || !done_ok) s = dt_error(DT_ERR_INTERNAL, "loader: cannot create its locks");
    }
    if (s == DT_OK) {
        int rc = pthread_create(&l->thread, NULL, loader_main, l);
        if (rc != 0) s = dt_error(DT_ERR_IO, "loader: cannot start its thread: %s", strerror(rc));
        else l->thread_started = 1;
    }
    if (s != DT_OK) {
        if (mu_ok) pthread_mutex_destroy(&l->mu);
        if (work_ok) pthread_cond_destroy(&l->work_cv);
        if (done_ok) pthread_cond_destroy(&l->done_cv);
        l->thread_started = 0;
        mu_ok = 0;
        /* dt_loader_free without locks: free the buffers only. */
        for (int i = 0; l->slots && i < l->o.depth; i++) {
            free(l->slots[i].idx);
            if (l->slots[i].x) l->o.free(l->o.alloc_ctx, l->slots[i].x);
            if (l->slots[i].y) l->o.free(l->o.alloc_ctx, l->slots[i].y);
        }
        free(l->slots);
        free(l);
        return s;
    }
    *out = l;
    return DT_OK;
}

dt_status dt_loader_submit(dt_loader *l, const int64_t *idx, size_t n) {
    if (n == 0 || n > l->max_batch)
        return dt_error(DT_ERR_INVALID, "loader: batch of %zu samples, expected 1 to %zu", n, l->max_batch);
    pthread_mutex_lock(&l->mu);
    slot *s = &l->slots[l->submit_pos];
    if (s->st != SLOT_FREE) {
        pthread_mutex_unlock(&l->mu);
        return dt_error(DT_ERR_INVALID,
                        "loader: %d batches already queued or in use; call next() before submitting more",
                        l->o.depth);
    }
    memcpy(s->idx, idx, n * sizeof *idx);
    s->n = n;
    s->err = DT_OK;
    s->msg[0] = '\0';
    s->st = SLOT_QUEUED;
    l->submit_pos = (l->submit_pos + 1) % l->o.depth;
    pthread_cond_signal(&l->work_cv);
    pthread_mutex_unlock(&l->mu);
    return DT_OK;
}

/* With the lock held: hand the HELD slot back. */
static void release_locked(dt_loader *l) {
    if (l->held >= 0) {
        l->slots[l->held].st = SLOT_FREE;
        l->held = -1;
    }
}

void dt_loader_release(dt_loader *l) {
    pthread_mutex_lock(&l->mu);
    release_locked(l);
    pthread_mutex_unlock(&l->mu);
}

dt_status dt_loader_next(dt_loader *l, float **x, int32_t **y, size_t *n) {
    *x = NULL;
    *y = NULL;
    *n = 0;
    pthread_mutex_lock(&l->mu);
    release_locked(l);
    slot *s = &l->slots[l->next_pos];
    if (s->st == SLOT_FREE) {
        pthread_mutex_unlock(&l->mu);
        return dt_error(DT_ERR_INVALID, "loader: next() with no batch submitted");
    }
    double t0 = dt_now();
    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    deadline.tv_sec += (time_t)l->o.timeout_s;
    int rc = 0;
    while (s->st != SLOT_READY && rc != ETIMEDOUT) rc = pthread_cond_timedwait(&l->done_cv, &l->mu, &deadline);
    l->wait_s += dt_now() - t0;
    if (s->st != SLOT_READY) {
        pthread_mutex_unlock(&l->mu);
        return dt_error(DT_ERR_TIMEOUT, "loader: batch not ready after %.0f s", l->o.timeout_s);
    }
    l->next_pos = (l->next_pos + 1) % l->o.depth;
    if (s->err != DT_OK) {
        dt_status err = dt_error(s->err, "%s", s->msg);
        s->st = SLOT_FREE;
        pthread_mutex_unlock(&l->mu);
        return err;
    }
    s->st = SLOT_HELD;
    l->held = (int)(s - l->slots);
    l->batches++;
    pthread_mutex_unlock(&l->mu);
    *x = s->x;
    *y = s->y;
    *n = s->n;
    return DT_OK;
}

double dt_loader_wait_seconds(const dt_loader *l) { return l->wait_s; }
int64_t dt_loader_batches(const dt_loader *l) { return l->batches; }
void dt_loader_reset_wait(dt_loader *l) {
    l->wait_s = 0.0;
    l->batches = 0;
}

void dt_loader_free(dt_loader *l) {
    if (!l) return;
    pthread_mutex_lock(&l->mu);
    l->stop = 1;
    pthread_cond_broadcast(&l->work_cv);
    pthread_mutex_unlock(&l->mu);
    if (l->thread_started) pthread_join(l->thread, NULL);
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->work_cv);
    pthread_cond_destroy(&l->done_cv);
    for (int i = 0; i < l->o.depth; i++) {
        free(l->slots[i].idx);
        l->o.free(l->o.alloc_ctx, l->slots[i].x);
        l->o.free(l->o.alloc_ctx, l->slots[i].y);
    }
    free(l->slots);
    free(l);
}
