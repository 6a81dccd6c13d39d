/*
 * train_trace.c: --trace and --trace-steps (trace.h records; train.c marks the spans).
 *
 * One time line for every rank: at the start the ranks take their clocks just after a
 * barrier, a few times; rank 0's readings are broadcast and each rank's offset is the
 * difference of the round whose barrier was shortest (every rank leaves a barrier
 * after the last one entered it, so their readings lie within that round's barrier
 * time of each other: that time is the error bound written into the file). At the end
 * every rank's events go to rank 0 (an all-gather of their lengths, then of the texts
 * padded to the longest), which writes one file atomically.
 */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "fileio.h"
#include "trace.h"
#include "train_impl.h"

#define SYNC_ROUNDS 5

/* "A:B" or "A:" into [lo, hi] (hi 0: to the end) */
static dt_status parse_steps(const char *v, int64_t *lo, int64_t *hi) {
    *lo = 1;
    *hi = 0;
    if (!v) return DT_OK;
    char *end;
    long long a = strtoll(v, &end, 10), b = 0;
    int ok = end != v && *end == ':' && a >= 1;
    if (ok && end[1]) {
        char *e2;
        b = strtoll(end + 1, &e2, 10);
        ok = e2 != end + 1 && *e2 == '\0' && b >= a;
    }
    if (!ok)
        return dt_error(DT_ERR_INVALID, "trace_steps: expected A:B (the first and last step traced, 1 <= A <= B) or "
                        "A: (from step A on), got '%s'", v);
    *lo = a;
    *hi = b;
    return DT_OK;
}

/* Each rank's clock against rank 0's, from the shortest of SYNC_ROUNDS barriers. */
static dt_status sync_clocks(trainer *t) {
    double mine[SYNC_ROUNDS], took[SYNC_ROUNDS], worst[SYNC_ROUNDS], zero[SYNC_ROUNDS];
    for (int i = 0; i < SYNC_ROUNDS; i++) {
        double b0 = dt_now();
        DT_TRY(dt_barrier(t->comm));
        mine[i] = dt_now();
        took[i] = mine[i] - b0;
    }
    memcpy(zero, mine, sizeof zero);
    DT_TRY(dt_broadcast(t->comm, zero, SYNC_ROUNDS, DT_F64, 0));
    /* the round every rank agrees was shortest: the longest wait over the ranks, least */
    DT_TRY(dt_allreduce(t->comm, took, worst, SYNC_ROUNDS, DT_F64, DT_MAX));
    int best = 0;
    for (int i = 1; i < SYNC_ROUNDS; i++) if (worst[i] < worst[best]) best = i;
    t->trace_offset = zero[best] - mine[best];
    t->trace_err = worst[best];
    t->trace_base = zero[0];
    return DT_OK;
}

dt_status dt_train_trace_setup_(trainer *t) {
    const dt_train_opts *o = t->o;
    if (!o->trace) {
        if (o->trace_steps) return dt_error(DT_ERR_INVALID, "trace_steps: needs --trace FILE");
        return DT_OK;
    }
    DT_TRY(parse_steps(o->trace_steps, &t->trace_lo, &t->trace_hi));
    dt_trace_reset();
    dt_trace_thread("main");
    dt_trace_device(t->ops->mark, t->ops->marks_read);   /* a GPU's own time too (trace.h) */
    t->trace_offset = t->trace_err = 0.0;
    t->trace_base = dt_now();
    return t->comm && t->world > 1 ? sync_clocks(t) : DT_OK;
}

void dt_train_trace_step_(const trainer *t, int64_t g) {
    if (!t->o->trace) return;
    int64_t step = g + 1;
    dt_trace_enable(step >= t->trace_lo && (t->trace_hi == 0 || step <= t->trace_hi));
}

/* rank 0: the file, every rank's events (texts of len[r] bytes, `stride` apart) */
static dt_status write_file(trainer *t, const char *all, const double *len, size_t stride) {
    dt_afile *f;
    DT_TRY(dt_afile_open(t->o->trace, &f));
    char head[512];
    int n = snprintf(head, sizeof head,
                     "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"producer\":\"dtrain\",\"ranks\":%d,"
                     "\"clock_error_us\":%.3f,\"clock\":\"each rank's monotonic clock moved onto rank 0's "
                     "(offsets from the shortest of %d barriers; the error bound is that barrier's time)\"},"
                     "\"traceEvents\":[\n", t->world, t->trace_err * 1e6, SYNC_ROUNDS);
    dt_status s = dt_afile_write(f, head, (size_t)n);
    for (int r = 0; s == DT_OK && r < t->world; r++) {
        if (r > 0 && len[r] > 0) s = dt_afile_write(f, ",\n", 2);
        if (s == DT_OK) s = dt_afile_write(f, all + (size_t)r * stride, (size_t)len[r]);
    }
    if (s == DT_OK) s = dt_afile_write(f, "\n]}\n", 4);
    if (s == DT_OK) return dt_afile_commit(f);
    dt_afile_abort(f);
    return s;
}

dt_status dt_train_trace_write_(trainer *t) {
    if (!t->o->trace) return DT_OK;
    dt_trace_enable(0);
    dt_status fs = dt_trace_dev_flush();   /* spans still waiting for their device times */
    dt_trace_device(NULL, NULL);
    DT_TRY(fs);
    char *mine = NULL;
    size_t n = 0;
    DT_TRY(dt_trace_json(t->rank, t->trace_base, t->trace_offset, &mine, &n));
    int W = t->comm && t->world > 1 ? t->world : 1;
    double *len = calloc((size_t)W, sizeof *len), me = (double)n, most = me;
    dt_status s = len ? DT_OK : dt_error(DT_ERR_NOMEM, "trace: out of memory");
    char *all = NULL;
    if (s == DT_OK && W > 1) s = dt_allgather(t->comm, &me, len, 1, DT_F64);
    else if (s == DT_OK) len[0] = me;
    for (int r = 0; s == DT_OK && r < W; r++) if (len[r] > most) most = len[r];
    size_t stride = (size_t)most;
    char *pad = s == DT_OK ? calloc(stride ? stride : 1, 1) : NULL;
    if (s == DT_OK && !pad) s = dt_error(DT_ERR_NOMEM, "trace: out of memory");
    if (s == DT_OK) {
        memcpy(pad, mine, n);
        all = W > 1 ? malloc((size_t)W * (stride ? stride : 1)) : pad;
        if (!all) s = dt_error(DT_ERR_NOMEM, "trace: out of memory gathering %d ranks' events", W);
    }
    if (s == DT_OK && W > 1) s = dt_allgather(t->comm, pad, all, stride, DT_U8);
    if (s == DT_OK && t->rank == 0) {
        s = write_file(t, all, len, stride);
        if (s != DT_OK) dt_error_wrap(s, "--trace %s: ", t->o->trace);
    }
    if (all != pad) free(all);
    free(pad);
    free(len);
    free(mine);
    dt_trace_reset();
    return s;
}
