/*
 * train_eval.c: what training and evaluation share of the data path, and evaluation:
 * the loss targets (labels, or MSE's one-hot rows), the device batch, the test-set
 * pass (dt_evaluate) and the fixed validation windows of token data.
 */
#include <stdlib.h>
#include <string.h>

#include "mem.h"
#include "train_impl.h"

/* ---- loss targets ---------------------------------------------------------------------- */

dt_status dt_train_loss_check_(const dt_loss *lf, int64_t lw) {
    const dt_loss_def *d = dt_loss_def_of(lf->kind);
    if (!d) return dt_error(DT_ERR_INVALID, "loss: unknown kind %d", (int)lf->kind);
    if (lw > 1 && !d->windows)
        return dt_error(DT_ERR_INVALID, "loss: %s needs one label per sample; token data takes ce", d->name);
    return DT_OK;
}

dt_status dt_train_loss_target_(const dt_ops *ops, const dt_loss *lf, const int32_t *labels, size_t n, int C,
                             const int32_t *dy, float *hot, float *dhot, const void **target) {
    if (!dt_loss_def_of(lf->kind)->one_hot) {
        *target = dy;
        return DT_OK;
    }
    memset(hot, 0, n * (size_t)C * sizeof *hot);
    for (size_t i = 0; i < n; i++)
        if (labels[i] >= 0 && labels[i] < C) hot[i * (size_t)C + (size_t)labels[i]] = 1.0f;
    *target = dhot;
    return ops->copy_h2d(dhot, hot, n * (size_t)C * sizeof *hot);
}

dt_train_batch_bytes dt_train_batch_size(int64_t n, int64_t sample_floats, int64_t labels, int64_t C, int mse) {
    dt_train_batch_bytes b = {.x = (size_t)n * (size_t)sample_floats * sizeof(float),
                              .y = (size_t)n * (size_t)labels * sizeof(int32_t),
                              .hot = mse ? (size_t)n * (size_t)C * sizeof(float) : 0};
    return b;
}

dt_status dt_train_batch_alloc_(const dt_ops *ops, const dt_loss *lf, size_t n, int64_t ss, int64_t lw, int C,
                             float **dx, int32_t **dy, float **hot, float **dhot) {
    dt_train_batch_bytes b = dt_train_batch_size((int64_t)n, ss, lw, C, dt_loss_def_of(lf->kind)->one_hot);
    *hot = *dhot = NULL;
    DT_TRY(dt_mem_alloc(ops, DT_MEM_OTHER, (void **)dx, b.x));
    DT_TRY(dt_mem_alloc(ops, DT_MEM_OTHER, (void **)dy, b.y));
    if (!b.hot) return DT_OK;
    if (!(*hot = malloc(b.hot))) return dt_error(DT_ERR_NOMEM, "out of memory for %zu one-hot targets", n);
    return dt_mem_alloc(ops, DT_MEM_OTHER, (void **)dhot, b.hot);
}

/* ---- evaluation -------------------------------------------------------------------- */

/* Mean loss (lf; NULL: cross-entropy) and accuracy over samples idx[0..count) of ds (all
 * of it when idx is NULL), each rank taking a contiguous share, gathered through host
 * memory. Per position for token windows: the loss is the mean over count x T tokens. */
static dt_status evaluate_idx(dt_model *m, const dt_dataset *ds, const dt_loss *lf, dt_comm *comm,
                              const int64_t *idx, int64_t count, double *loss, double *acc) {
    const dt_ops *ops = dt_model_ops(m);
    const dt_dataset_info *info = dt_dataset_get_info(ds);
    int W = comm ? dt_comm_size(comm) : 1, r = comm ? dt_comm_rank(comm) : 0;
    int64_t lo = count * r / W, hi = count * (r + 1) / W;
    int maxb = dt_model_max_batch(m);
    int C = (int)dt_shape_numel(dt_model_output_shape(m));
    size_t ss = (size_t)info->sample_size, lw = (size_t)info->label_width;
    const dt_loss ce = {.kind = DT_LOSS_CE, .label_smoothing = 0.0f};
    if (!lf) lf = &ce;
    DT_TRY(dt_train_loss_check_(lf, (int64_t)lw));
    float *dx = NULL, *hot = NULL, *dhot = NULL, *hx = malloc((size_t)maxb * ss * sizeof(float));
    int32_t *dy = NULL, *hy = malloc((size_t)maxb * lw * sizeof(int32_t));
    int64_t *bi = malloc((size_t)maxb * sizeof *bi);
    dt_status s = hx && hy && bi ? DT_OK : dt_error(DT_ERR_NOMEM, "evaluation: out of memory");
    if (s == DT_OK) s = dt_train_batch_alloc_(ops, lf, (size_t)maxb, (int64_t)ss, (int64_t)lw, C, &dx, &dy, &hot, &dhot);
    /* Every rank runs as many forwards as the largest share takes: with --shard params a
     * forward gathers each unit of parameters from the ranks that hold it, so all must
     * take part. A rank whose share is done runs a one-sample forward and ignores it. */
    int64_t rounds = 0;
    for (int q = 0; q < W; q++) {
        int64_t share = count * (q + 1) / W - count * q / W, nb = (share + maxb - 1) / maxb;
        if (nb > rounds) rounds = nb;
    }
    double sums[2] = {0.0, 0.0};  /* loss sum, correct count */
    for (int64_t k = 0; s == DT_OK && k < rounds; k++) {
        int64_t i = lo + k * maxb;
        int idle = i >= hi;
        int b = idle ? 1 : (int)((hi - i) < maxb ? (hi - i) : maxb);
        const void *target = NULL;
        for (int j = 0; j < b; j++) bi[j] = idle ? (idx ? idx[0] : 0) : idx ? idx[i + j] : i + j;
        s = dt_dataset_gather(ds, bi, (size_t)b, hx, hy);
        if (s == DT_OK) s = ops->copy_h2d(dx, hx, (size_t)b * ss * sizeof(float));
        if (s == DT_OK) s = ops->copy_h2d(dy, hy, (size_t)b * lw * sizeof(int32_t));
        if (s == DT_OK) s = dt_train_loss_target_(ops, lf, hy, (size_t)b, C, dy, hot, dhot, &target);
        if (s == DT_OK) s = dt_model_forward(m, dx, b, 0, 0, i, NULL);
        if (idle) continue;
        float l = 0.0f;
        int64_t correct = 0;
        if (s == DT_OK) s = dt_model_loss(m, lf, target, b, 1.0f, &l, NULL);
        if (s == DT_OK) s = dt_model_correct(m, dy, b, &correct);
        sums[0] += l;
        sums[1] += (double)correct;
    }
    dt_mem_free(ops, dx);
    dt_mem_free(ops, dy);
    dt_mem_free(ops, dhot);
    free(hot);
    free(hx);
    free(hy);
    free(bi);
    if (s != DT_OK) return s;
    if (comm && W > 1) DT_TRY(dt_allreduce(comm, sums, sums, 2, DT_F64, DT_SUM));
    if (loss) *loss = count ? sums[0] / (double)count : 0.0;
    if (acc) *acc = count ? sums[1] / ((double)count * (double)lw) : 0.0;
    return DT_OK;
}

/* Token data is evaluated on a fixed set of windows, the same on every rank and
 * world size. */
static dt_status evaluate_windows(dt_model *m, const dt_dataset *ds, dt_comm *comm, int64_t count, uint64_t seed,
                                  double *loss, double *acc) {
    int64_t n = dt_dataset_get_info(ds)->n;
    if (count > n) count = n;
    int64_t *idx = malloc((size_t)(count > 0 ? count : 1) * sizeof *idx);
    if (!idx) return dt_error(DT_ERR_NOMEM, "evaluation: out of memory");
    dt_status s = dt_dataset_eval_windows(ds, count, seed, idx);
    if (s == DT_OK) s = evaluate_idx(m, ds, NULL, comm, idx, count, loss, acc);
    free(idx);
    return s;
}

dt_status dt_evaluate(dt_model *m, const dt_dataset *test, const dt_loss *lf, dt_comm *comm, double *loss,
                      double *acc) {
    const dt_dataset_info *info = dt_dataset_get_info(test);
    if (info->label_width > 1)   /* token windows: 20 batches of fixed windows */
        return evaluate_windows(m, test, comm, 20 * (int64_t)dt_model_max_batch(m), 0, loss, acc);
    return evaluate_idx(m, test, lf, comm, NULL, info->n, loss, acc);
}

/* Validation: the whole test split, or for token data the fixed windows of
 * eval_batches global batches. The forward runs as in training: with --shard params
 * each unit's parameters are gathered as it runs and dropped after it (the layer
 * hooks), so evaluating holds no more of the model than a step does. */
dt_status dt_train_validate_(trainer *t, double *loss, double *acc) {
    const dt_loss plain = {.kind = t->lf.kind, .label_smoothing = 0.0f};   /* the test loss is unsmoothed */
    if (t->pipe) DT_TRY(dt_train_pipe_gather_(t));   /* every rank evaluates the whole model */
    DT_TRY(t->lw > 1 ? evaluate_windows(t->model, t->test, t->comm, t->o->eval_batches * t->o->batch, t->o->seed,
                                        loss, acc)
                     : dt_evaluate(t->model, t->test, &plain, t->comm, loss, acc));
    if (t->pipe) DT_TRY(dt_train_pipe_drop_(t));     /* and goes back to its stage's */
    return dt_shard_drop_units(t->shard);   /* params: the last unit, which no backward drops */
}

