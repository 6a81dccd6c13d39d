/* test_algo.c: the collective algorithms of algo.c over an in-process point-to-point
 * primitive (one thread per rank, buffered mailboxes), at world sizes a process test
 * could not afford on a small machine: 1..8 and 16, power-of-two (halving/doubling) and
 * not (rings). Exact integer inputs check every collective and count; awkward floats
 * check that power-of-two all_reduce and reduce_scatter equal the fixed pairwise tree
 * ((x0+x1)+(x2+x3))+... bit for bit, on the small and the large path. */
#include "comm_impl.h"
#include "reduce.h"
#include "tap.h"

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- a buffered in-process p2p ---------------------------------------------------- */

typedef struct msg { struct msg *next; size_t n; char data[]; } msg;

typedef struct {
    int size;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    msg **head, **tail;     /* [src * size + dst] FIFO */
} world;

typedef struct { world *w; int rank; } endpoint;

static dt_status fake_xfer(void *ctx, const dt_xfer *x, const dt_call *call) {
    endpoint *e = ctx;
    world *w = e->w;
    if (x->dst >= 0) {
        msg *m = malloc(sizeof *m + x->sbytes + 1);
        if (!m) return dt_error(DT_ERR_NOMEM, "out of memory");
        m->next = NULL;
        m->n = x->sbytes;
        if (x->sbytes) memcpy(m->data, x->sbuf, x->sbytes);
        if (x->sbytes && x->scopy) memcpy(x->scopy, x->sbuf, x->sbytes);
        pthread_mutex_lock(&w->mu);
        int q = e->rank * w->size + x->dst;
        if (w->tail[q]) w->tail[q]->next = m; else w->head[q] = m;
        w->tail[q] = m;
        pthread_cond_broadcast(&w->cv);
        pthread_mutex_unlock(&w->mu);
    }
    if (x->src >= 0) {
        int q = x->src * w->size + e->rank;
        pthread_mutex_lock(&w->mu);
        while (!w->head[q]) pthread_cond_wait(&w->cv, &w->mu);
        msg *m = w->head[q];
        w->head[q] = m->next;
        if (!w->head[q]) w->tail[q] = NULL;
        pthread_mutex_unlock(&w->mu);
        dt_status s = DT_OK;
        if (m->n != x->rbytes) s = dt_error(DT_ERR_MISMATCH, "rank %d: got %zu bytes from %d, expected %zu",
                                            e->rank, m->n, x->src, x->rbytes);
        else if (x->racc) dt_reduce_apply(call->op, call->dtype, x->rbuf, x->racc, m->data, m->n / dt_dtype_size(call->dtype));
        else if (m->n) memcpy(x->rbuf, m->data, m->n);
        free(m);
        return s;
    }
    return DT_OK;
}

/* ---- running one collective on W threads ------------------------------------------- */

typedef struct {
    world *w;
    int rank;
    dt_call call;
    const void *send;
    void *recv;
    dt_status status;
} job;

static void *run_rank(void *arg) {
    job *j = arg;
    endpoint e = { j->w, j->rank };
    dt_p2p p = { .ctx = &e, .rank = j->rank, .size = j->w->size, .xfer = fake_xfer };
    dt_algo_fn algo = dt_algo_of(j->call.kind);
    j->status = algo ? algo(&p, &j->call, j->send, j->recv) : DT_ERR_INTERNAL;
    return NULL;
}

/* Run call on W ranks; send[r], recv[r] are the buffers of rank r. Returns 1 if all ok. */
static int run(int W, dt_call call, void **send, void **recv) {
    world w = { .size = W };
    pthread_mutex_init(&w.mu, NULL);
    pthread_cond_init(&w.cv, NULL);
    w.head = calloc((size_t)(W * W), sizeof *w.head);
    w.tail = calloc((size_t)(W * W), sizeof *w.tail);
    job jobs[16];
    pthread_t th[16];
    for (int r = 0; r < W; r++) {
        jobs[r] = (job){ .w = &w, .rank = r, .call = call, .send = send ? send[r] : NULL, .recv = recv[r] };
        pthread_create(&th[r], NULL, run_rank, &jobs[r]);
    }
    int good = 1;
    for (int r = 0; r < W; r++) {
        pthread_join(th[r], NULL);
        if (jobs[r].status != DT_OK) { good = 0; diag("rank %d: %s", r, dt_last_error()); }
    }
    for (int q = 0; q < W * W; q++) if (w.head[q]) { good = 0; diag("message left over in queue %d", q); }
    free(w.head); free(w.tail);
    pthread_mutex_destroy(&w.mu);
    pthread_cond_destroy(&w.cv);
    return good;
}

static dt_call mkcall(dt_call_kind k, dt_dtype t, dt_redop op, size_t count, int root) {
    dt_call c = { .kind = k, .dtype = t, .op = op, .count = count, .root = root, .seq = 1 };
    dt_call_describe(&c);
    return c;
}

static int32_t val(int r, size_t i) { return (int32_t)((i * 7 + (size_t)r * 13) % 11) - 5; }

/* ---- exact checks ----------------------------------------------------------------- */

static int check_allreduce(int W, size_t n, int inplace, dt_redop op) {
    void *s[16], *d[16];
    for (int r = 0; r < W; r++) {
        s[r] = malloc(n * 4 + 4); d[r] = inplace ? s[r] : malloc(n * 4 + 4);
        for (size_t i = 0; i < n; i++) ((int32_t *)s[r])[i] = val(r, i);
    }
    int good = run(W, mkcall(DT_CALL_ALLREDUCE, DT_I32, op, n, -1), s, d);
    for (size_t i = 0; good && i < n; i++) {
        int64_t acc = op == DT_MAX ? INT32_MIN : 0;
        for (int r = 0; r < W; r++) acc = op == DT_MAX ? (val(r, i) > acc ? val(r, i) : acc) : acc + val(r, i);
        if (op == DT_AVG) acc /= W;
        for (int r = 0; r < W; r++) if (((int32_t *)d[r])[i] != acc) { good = 0; diag("W=%d n=%zu i=%zu rank %d", W, n, i, r); break; }
    }
    for (int r = 0; r < W; r++) { free(s[r]); if (!inplace) free(d[r]); }
    return good;
}

/* inplace: recv is block r of send */
static int check_reduce_scatter(int W, size_t rc, int inplace) {
    void *s[16], *d[16];
    for (int r = 0; r < W; r++) {
        s[r] = malloc(rc * (size_t)W * 4 + 4); d[r] = inplace ? (int32_t *)s[r] + (size_t)r * rc : malloc(rc * 4 + 4);
        for (size_t i = 0; i < rc * (size_t)W; i++) ((int32_t *)s[r])[i] = val(r, i);
    }
    int good = run(W, mkcall(DT_CALL_REDUCE_SCATTER, DT_I32, DT_SUM, rc, -1), s, d);
    for (int r = 0; good && r < W; r++)
        for (size_t i = 0; i < rc; i++) {
            int32_t acc = 0;
            for (int k = 0; k < W; k++) acc += val(k, (size_t)r * rc + i);
            if (((int32_t *)d[r])[i] != acc) { good = 0; break; }
        }
    for (int r = 0; r < W; r++) { free(s[r]); if (!inplace) free(d[r]); }
    return good;
}

static int check_allgather_bcast_reduce(int W, size_t n) {
    void *s[16], *d[16];
    int good = 1;
    for (int r = 0; r < W; r++) {
        s[r] = malloc(n * 4 + 4); d[r] = malloc(n * (size_t)W * 4 + 4);
        for (size_t i = 0; i < n; i++) ((int32_t *)s[r])[i] = val(r, i);
    }
    good &= run(W, mkcall(DT_CALL_ALLGATHER, DT_I32, DT_SUM, n, -1), s, d);
    for (int r = 0; good && r < W; r++)
        for (int k = 0; k < W; k++)
            for (size_t i = 0; i < n; i++) if (((int32_t *)d[r])[(size_t)k * n + i] != val(k, i)) good = 0;
    int root = W / 2;
    for (int r = 0; r < W; r++) memcpy(d[r], r == root ? s[r] : s[(r + 1) % W], n * 4);
    good &= run(W, mkcall(DT_CALL_BROADCAST, DT_I32, DT_SUM, n, root), NULL, d);
    for (int r = 0; good && r < W; r++) if (memcmp(d[r], s[root], n * 4)) good = 0;
    good &= run(W, mkcall(DT_CALL_REDUCE, DT_I32, DT_SUM, n, root), s, d);
    for (size_t i = 0; good && i < n; i++) {
        int32_t acc = 0;
        for (int k = 0; k < W; k++) acc += val(k, i);
        if (((int32_t *)d[root])[i] != acc) good = 0;
    }
    good &= run(W, mkcall(DT_CALL_BARRIER, DT_U8, DT_SUM, 0, -1), NULL, d);
    for (int r = 0; r < W; r++) { free(s[r]); free(d[r]); }
    return good;
}

/* ---- the fixed tree ------------------------------------------------------------------ */

static float awkward(int r, size_t i) {
    uint64_t x = (uint64_t)(r + 1) * 0x9e3779b97f4a7c15ull ^ (uint64_t)(i + 1) * 0xbf58476d1ce4e5b9ull;
    x ^= x >> 31; x *= 0x94d049bb133111ebull; x ^= x >> 29;
    return ((x >> 40) & 1 ? -1.0f : 1.0f) * ldexpf(1.0f + (float)(x & 0xffffff) / 16777216.0f, (int)((x >> 24) % 41) - 20);
}

/* element i summed over ranks [lo, hi) as a balanced binary tree */
static float tree(int lo, int hi, size_t i) {
    if (hi - lo == 1) return awkward(lo, i);
    int mid = (lo + hi) / 2;
    return tree(lo, mid, i) + tree(mid, hi, i);
}

/* rs: 0 all_reduce, 1 reduce_scatter, 2 + q reduce to root q (checked on q only) */
static int check_tree(int W, size_t n, int rs) {
    void *s[16], *d[16];
    for (int r = 0; r < W; r++) {
        s[r] = malloc(n * 4 + 4); d[r] = malloc(n * 4 + 4);
        for (size_t i = 0; i < n; i++) ((float *)s[r])[i] = awkward(r, i);
    }
    int root = rs >= 2 ? rs - 2 : -1;
    if (root >= 0) rs = 0;
    size_t rc = n / (size_t)W;
    int good = run(W, rs ? mkcall(DT_CALL_REDUCE_SCATTER, DT_F32, DT_SUM, rc, -1)
                  : root >= 0 ? mkcall(DT_CALL_REDUCE, DT_F32, DT_SUM, n, root)
                              : mkcall(DT_CALL_ALLREDUCE, DT_F32, DT_SUM, n, -1), s, d);
    int differs = 0;
    for (int r = root >= 0 ? root : 0; good && r < (root >= 0 ? root + 1 : W); r++)
        for (size_t j = 0; j < (rs ? rc : n); j++) {
            size_t i = rs ? (size_t)r * rc + j : j;
            float want = tree(0, W, i), got = ((float *)d[r])[j];
            if (memcmp(&want, &got, 4)) { good = 0; diag("W=%d i=%zu: %a vs tree %a", W, i, got, want); break; }
            float seq = 0;
            for (int k = 0; k < W; k++) seq += awkward(k, i);
            differs |= memcmp(&seq, &want, 4) != 0;
        }
    if (good && W >= 4 && !differs) { good = 0; diag("W=%d: inputs too tame, left-to-right equals the tree", W); }
    for (int r = 0; r < W; r++) { free(s[r]); free(d[r]); }
    return good;
}

int main(void) {
    int sizes[] = { 1, 2, 3, 4, 5, 6, 7, 8, 16 };
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        int W = sizes[k];
        size_t counts[] = { 0, 1, (size_t)W - 1, (size_t)W + 1, 1000, 40001 };
        int good = 1;
        for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++)
            for (int inplace = 0; inplace < 2; inplace++) {
                good &= check_allreduce(W, counts[c], inplace, DT_SUM);
                good &= check_allreduce(W, counts[c], inplace, counts[c] % 2 ? DT_MAX : DT_AVG);
            }
        ok(good, "W=%d: all_reduce (sum/avg/max, in and out of place, counts 0, 1, W+-1, 1000, 40001)", W);
        good = 1;
        size_t rcs[] = { 0, 1, 3, 20001, 70001 };
        for (size_t c = 0; c < 5; c++)
            for (int inplace = 0; inplace < 2; inplace++) good &= check_reduce_scatter(W, rcs[c], inplace);
        ok(good, "W=%d: reduce_scatter (in and out of place, counts per rank 0, 1, 3, 20001, 70001)", W);
        good = 1;
        size_t ns[] = { 0, 1, 77, 30001 };
        for (size_t c = 0; c < 4; c++) good &= check_allgather_bcast_reduce(W, ns[c]);
        ok(good, "W=%d: all_gather, broadcast, reduce, barrier", W);
        if ((W & (W - 1)) == 0 && W > 1) {
            ok(check_tree(W, 1000, 0), "W=%d: all_reduce (small path) is the fixed pairwise tree, bitwise", W);
            ok(check_tree(W, 160000, 0), "W=%d: all_reduce (large path) is the fixed pairwise tree, bitwise", W);
            ok(check_tree(W, 1000, 1), "W=%d: reduce_scatter (small path) is the same tree, bitwise", W);
            ok(check_tree(W, 600000, 1), "W=%d: reduce_scatter (large path) is the same tree, bitwise", W);
            int good_reduce = 1;
            for (int q = 0; q < W; q++) good_reduce &= check_tree(W, 70001, 2 + q);
            ok(good_reduce, "W=%d: reduce to every root is the same tree, bitwise", W);
        }
    }
    return done_testing();
}
