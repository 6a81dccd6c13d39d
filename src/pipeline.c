/*
 * pipeline.c: the schedules' rows, their builders, and the check that simulates every
 * stage's list (see pipeline.h).
 */
#include "pipeline.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- building a list ------------------------------------------------------------------ */

typedef struct {
    dt_pp_list *l;
    int         cap;
    int         first, last;   /* this stage receives nothing forward / sends nothing forward */
    dt_status   s;
} builder;

static void put_c(builder *b, dt_pp_op op, int micro, int chunk) {
    if (b->s != DT_OK) return;
    if (b->l->n == b->cap) {
        int cap = b->cap ? 2 * b->cap : 16;
        dt_pp_action *a = realloc(b->l->a, (size_t)cap * sizeof *a);
        if (!a) { b->s = dt_error(DT_ERR_NOMEM, "pipeline: out of memory for a schedule"); return; }
        b->l->a = a;
        b->cap = cap;
    }
    b->l->a[b->l->n++] = (dt_pp_action){.op = op, .micro = micro, .chunk = chunk};
}

static void put(builder *b, dt_pp_op op, int micro) { put_c(b, op, micro, 0); }

/* A forward with its boundary tensors: the input received, the output sent. */
static void fwd(builder *b, int m) {
    if (!b->first) put(b, DT_PP_RECV_ACT, m);
    put(b, DT_PP_FWD, m);
    if (!b->last) put(b, DT_PP_SEND_ACT, m);
}

/* A backward with its boundary tensors: the output's gradient received, the input's sent. */
static void bwd(builder *b, int m) {
    if (!b->last) put(b, DT_PP_RECV_GRAD, m);
    put(b, DT_PP_BWD, m);
    if (!b->first) put(b, DT_PP_SEND_GRAD, m);
}

/* GPipe: every forward, then every backward, both in micro-batch order. */
static void build_gpipe(builder *b, int P, int s, int M) {
    (void)P;
    (void)s;
    for (int m = 0; m < M; m++) fwd(b, m);
    for (int m = 0; m < M; m++) bwd(b, m);
}

/* 1F1B: w = P - 1 - s warm-up forwards, then forward w + i and backward i alternate, then
 * the last w backwards. In the steady phase a stage receives the gradient of backward i
 * before it sends the output of forward w + i: its successor, one warm-up forward
 * behind, sends that gradient before it waits for that output, so with blocking sends
 * neither waits on the other (dt_pp_check proves it for each P and M it is given). */
static void build_1f1b(builder *b, int P, int s, int M) {
    int w = P - 1 - s < M ? P - 1 - s : M;
    for (int m = 0; m < w; m++) fwd(b, m);
    for (int i = 0; i + w < M; i++) {
        int f = w + i;
        if (!b->first) put(b, DT_PP_RECV_ACT, f);
        put(b, DT_PP_FWD, f);
        if (!b->last) put(b, DT_PP_RECV_GRAD, i);
        if (!b->last) put(b, DT_PP_SEND_ACT, f);
        put(b, DT_PP_BWD, i);
        if (!b->first) put(b, DT_PP_SEND_GRAD, i);
    }
    for (int i = M - w; i < M; i++) bwd(b, i);
}

/* ---- interleaved ----------------------------------------------------------------------- */

/* Stage s's k-th forward (or backward) of its V x M: micro-batches in groups of P pass
 * chunk 0, then chunk 1, ... (backwards: chunk V - 1 first), group after group. */
static void nth(int P, int V, int k, int backward, int *chunk, int *micro) {
    int v = (k / P) % V;
    *chunk = backward ? V - 1 - v : v;
    *micro = (k / (P * V)) * P + k % P;
}

typedef struct {
    dt_pp_op op;
    int chunk, micro;
} item;

/* Stage s's computations in order: w warm-up forwards, then one forward and one backward
 * alternating, then the last backwards. */
static item *order(int P, int V, int s, int M, int *n) {
    int total = V * M, w = V == 1 ? P - 1 - s : 2 * (P - 1 - s) + (V - 1) * P;
    if (w > total) w = total;
    item *it = malloc((size_t)2 * (size_t)total * sizeof *it);
    if (!it) return NULL;
    int k = 0;
    for (int f = 0; f < w; f++, k++) it[k].op = DT_PP_FWD, nth(P, V, f, 0, &it[k].chunk, &it[k].micro);
    for (int i = 0; i + w < total; i++) {
        it[k].op = DT_PP_FWD, nth(P, V, w + i, 0, &it[k].chunk, &it[k].micro), k++;
        it[k].op = DT_PP_BWD, nth(P, V, i, 1, &it[k].chunk, &it[k].micro), k++;
    }
    for (int i = total - w; i < total; i++, k++) it[k].op = DT_PP_BWD, nth(P, V, i, 1, &it[k].chunk, &it[k].micro);
    *n = k;
    return it;
}

/* A boundary tensor on its way: made at `at` by chunk `from` (on stage from % P) for
 * chunk `to`, of micro-batch `micro`; grad: the gradient of to's output, else to's input. */
typedef struct {
    double at;
    int from, to, micro, grad;
} transfer;

/* Every stage's list: each stage runs its computations in order on one clock, a forward
 * taking 1 and a backward 2; a tensor another stage needs goes to it the moment it is
 * made (a send right after the computation, a receive before any computation its
 * receiver starts from then on), and a computation starts once its stage is free and
 * its input has arrived. Events in time order (a transfer before a computation that
 * starts at the same time, lower stages first) are one sequence of atomic events, and
 * each list is its projection: no rendezvous can hang, and where a send does not wait
 * for its receiver nobody waits longer than the clock says. */
static dt_status build_interleaved(int P, int V, int M, dt_pp_list *lists) {
    const int C = P * V;   /* model chunks; chunk c is stage c % P's chunk c / P */
    item **it = calloc((size_t)P, sizeof *it);
    int *n = calloc((size_t)P, sizeof *n), *at = calloc((size_t)P, sizeof *at);
    double *free_at = calloc((size_t)P, sizeof *free_at);
    double *here = malloc((size_t)C * (size_t)M * 2 * sizeof *here);   /* [c][m][fwd, bwd]: input there since, or < 0 */
    transfer *q = malloc((size_t)C * (size_t)M * 2 * sizeof *q);       /* on their way */
    int nq = 0;
    builder *b = calloc((size_t)P, sizeof *b);
    dt_status st = it && n && at && free_at && here && q && b ? DT_OK : dt_error(DT_ERR_NOMEM, "pipeline: out of memory");
    for (int s = 0; st == DT_OK && s < P; s++) {
        if (!(it[s] = order(P, V, s, M, &n[s]))) st = dt_error(DT_ERR_NOMEM, "pipeline: out of memory");
        lists[s].chunks = V;
        b[s] = (builder){.l = &lists[s], .s = DT_OK};
    }
    for (size_t i = 0; st == DT_OK && i < (size_t)C * (size_t)M * 2; i++) here[i] = -1.0;
    for (int m = 0; st == DT_OK && m < M; m++) here[(size_t)m * 2] = 0.0;                                  /* chunk 0's data */
    for (int m = 0; st == DT_OK && m < M; m++) here[((size_t)(C - 1) * (size_t)M + (size_t)m) * 2 + 1] = 0.0;   /* the loss */
    while (st == DT_OK) {
        /* the earliest transfer, and the computation that can start earliest */
        int tq = -1, cs = -1;
        double start = 0.0;
        for (int i = 0; i < nq; i++)
            if (tq < 0 || q[i].at < q[tq].at) tq = i;
        for (int s = 0; s < P; s++) {
            if (at[s] == n[s]) continue;
            item x = it[s][at[s]];
            int c = x.chunk * P + s, bwd = x.op == DT_PP_BWD;
            double t = here[((size_t)c * (size_t)M + (size_t)x.micro) * 2 + (size_t)bwd];
            if (t < 0) continue;
            if (free_at[s] > t) t = free_at[s];
            if (cs < 0 || t < start) cs = s, start = t;
        }
        if (tq >= 0 && (cs < 0 || q[tq].at <= start)) {
            transfer x = q[tq];
            q[tq] = q[--nq];
            int fs = x.from % P, ts = x.to % P;
            put_c(&b[fs], x.grad ? DT_PP_SEND_GRAD : DT_PP_SEND_ACT, x.micro, x.from / P);
            put_c(&b[ts], x.grad ? DT_PP_RECV_GRAD : DT_PP_RECV_ACT, x.micro, x.to / P);
            here[((size_t)x.to * (size_t)M + (size_t)x.micro) * 2 + (size_t)x.grad] = x.at;
            continue;
        }
        if (cs < 0) break;
        int s = cs;
        item x = it[s][at[s]++];
        int c = x.chunk * P + s, bwd = x.op == DT_PP_BWD, to = bwd ? c - 1 : c + 1;
        put_c(&b[s], x.op, x.micro, x.chunk);
        free_at[s] = start + (bwd ? 2.0 : 1.0);
        if (to >= 0 && to < C)   /* the output (or the input's gradient) goes to its chunk's stage */
            q[nq++] = (transfer){.at = free_at[s], .from = c, .to = to, .micro = x.micro, .grad = bwd};
    }
    for (int s = 0; st == DT_OK && s < P; s++) {
        if (b[s].s != DT_OK) st = b[s].s;
        else if (at[s] < n[s])
            st = dt_error(DT_ERR_INTERNAL, "pipeline: interleaved: stage %d cannot run its computation %d of %d", s,
                          at[s], n[s]);
    }
    for (int s = 0; it && s < P; s++) free(it[s]);
    free(it), free(n), free(at), free(free_at), free(here), free(q), free(b);
    return st;
}

struct dt_pp_schedule {
    const char *name;
    int chunked;   /* takes V > 1 chunks per stage */
    void (*build)(builder *b, int stages, int stage, int micro);   /* one stage's list */
    dt_status (*build_all)(int stages, int chunks, int micro, dt_pp_list *lists);   /* or every stage's */
};

static const dt_pp_schedule schedules[] = {
    {"gpipe", 0, build_gpipe, NULL},
    {"1f1b", 0, build_1f1b, NULL},
    {"interleaved", 1, NULL, build_interleaved},
};
#define NSCHED ((int)(sizeof schedules / sizeof schedules[0]))

const dt_pp_schedule *dt_pp_find(const char *name) {
    for (int i = 0; name && i < NSCHED; i++)
        if (!strcmp(schedules[i].name, name)) return &schedules[i];
    return NULL;
}

const char *dt_pp_name(const dt_pp_schedule *s) { return s ? s->name : "?"; }

int dt_pp_chunked(const dt_pp_schedule *s) { return s && s->chunked; }

const char *dt_pp_names(char *buf, size_t n) {
    if (n) buf[0] = '\0';
    for (int i = 0; i < NSCHED; i++) {
        size_t k = strlen(buf);
        snprintf(buf + k, n - k, "%s%s", i == 0 ? "" : i + 1 < NSCHED ? ", " : " or ", schedules[i].name);
    }
    return buf;
}

dt_status dt_pp_build(const dt_pp_schedule *sch, int stages, int chunks, int stage, int micro, dt_pp_list *out) {
    memset(out, 0, sizeof *out);
    if (!sch) return dt_error(DT_ERR_INVALID, "pipeline: no schedule");
    if (stages < 1 || stage < 0 || stage >= stages)
        return dt_error(DT_ERR_INVALID, "pipeline: stage %d of %d", stage, stages);
    if (chunks < 1 || (chunks > 1 && !sch->chunked))
        return dt_error(DT_ERR_INVALID, "pipeline: the %s schedule holds one chunk of the model per stage, not %d "
                        "(--virtual-stages needs the interleaved schedule)", sch->name, chunks);
    if (chunks > 1 && stages < 2)
        return dt_error(DT_ERR_INVALID, "pipeline: %d chunks on one stage: interleaving needs at least 2 stages",
                        chunks);
    if (micro < stages)
        return dt_error(DT_ERR_INVALID, "pipeline: %d micro-batches cannot fill %d stages (the %s schedule needs at "
                        "least as many micro-batches as stages)", micro, stages, sch->name);
    if (chunks > 1 && micro % stages)
        return dt_error(DT_ERR_INVALID, "pipeline: %d micro-batches are not a multiple of the %d stages (the "
                        "interleaved schedule with %d chunks per stage passes them in groups of %d)", micro, stages,
                        chunks, stages);
    if (!sch->build) {
        dt_pp_list *all = calloc((size_t)stages, sizeof *all);
        if (!all) return dt_error(DT_ERR_NOMEM, "pipeline: out of memory");
        dt_status s = sch->build_all(stages, chunks, micro, all);
        if (s == DT_OK) {
            *out = all[stage];
            all[stage] = (dt_pp_list){0};
        }
        for (int i = 0; i < stages; i++) dt_pp_list_free(&all[i]);
        free(all);
        return s;
    }
    builder b = {.l = out, .first = stage == 0, .last = stage == stages - 1, .s = DT_OK};
    out->chunks = 1;
    sch->build(&b, stages, stage, micro);
    if (b.s != DT_OK) dt_pp_list_free(out);
    return b.s;
}

void dt_pp_list_free(dt_pp_list *l) {
    if (!l) return;
    free(l->a);
    l->a = NULL;
    l->n = 0;
}

/* ---- checking every list ----------------------------------------------------------------- */

static const char *const op_names[] = {"FWD", "BWD", "SEND_ACT", "RECV_ACT", "SEND_GRAD", "RECV_GRAD"};

void dt_pp_held(const dt_pp_list *l, int *inputs, int *sets) {
    int in = 0, most_in = 0, fw = 0, most_fw = 0;
    for (int i = 0; i < l->n; i++) {
        if (l->a[i].op == DT_PP_RECV_ACT && ++in > most_in) most_in = in;
        if (l->a[i].op == DT_PP_FWD && ++fw > most_fw) most_fw = fw;
        if (l->a[i].op == DT_PP_BWD) in--, fw--;
    }
    if (inputs) *inputs = most_in;
    if (sets) *sets = most_fw;
}

dt_status dt_pp_chunk_held(const dt_pp_list *l, int j, int *inputs, int *sets, int *grads, int *unsent) {
    dt_pp_list one = {.a = malloc((size_t)(l->n ? l->n : 1) * sizeof *l->a), .chunks = 1};
    if (!one.a) return dt_error(DT_ERR_NOMEM, "pipeline: out of memory");
    int now = 0, held = 0;
    *grads = *unsent = 0;
    for (int i = 0; i < l->n; i++) {
        if (l->a[i].chunk != j) continue;
        one.a[one.n++] = l->a[i];
        dt_pp_op op = l->a[i].op;
        now += op == DT_PP_RECV_GRAD ? 1 : op == DT_PP_SEND_GRAD ? -1 : 0;
        held += op == DT_PP_RECV_GRAD ? 1 : op == DT_PP_BWD && held > 0 ? -1 : 0;
        if (now > *unsent) *unsent = now;
        if (held > *grads) *grads = held;
    }
    dt_pp_held(&one, inputs, sets);
    free(one.a);
    return DT_OK;
}

size_t dt_pp_dump(const dt_pp_list *l, char *buf, size_t n) {
    size_t len = 0;
    if (n) buf[0] = '\0';
    for (int i = 0; i < l->n; i++) {
        char line[64];
        int k = l->chunks > 1 ? snprintf(line, sizeof line, "%s %d.%d\n", op_names[l->a[i].op], l->a[i].micro, l->a[i].chunk)
                              : snprintf(line, sizeof line, "%s %d\n", op_names[l->a[i].op], l->a[i].micro);
        if (len + (size_t)k < n) memcpy(buf + len, line, (size_t)k + 1);
        len += (size_t)k;
    }
    return len;
}

/* Stage s's list alone (V chunks, model chunk c = chunk x P + s of C = V P): counts,
 * order, boundary tensors on the right chunks. */
static dt_status check_one(const dt_pp_list *l, int s, int P, int V, int M, int *held_max) {
    const int C = P * V;
    int *seen = calloc((size_t)V * (size_t)M * 6, sizeof *seen);   /* per chunk, micro and op: position + 1 */
    int *next_bwd = calloc((size_t)V, sizeof *next_bwd);
    if (!seen || !next_bwd) {
        free(seen), free(next_bwd);
        return dt_error(DT_ERR_NOMEM, "pipeline: out of memory");
    }
    dt_status st = DT_OK;
    int held = 0;
    *held_max = 0;
#define SEEN(a, o) seen[((size_t)(a).chunk * (size_t)M + (size_t)(a).micro) * 6 + (o)]
    for (int i = 0; i < l->n && st == DT_OK; i++) {
        dt_pp_action a = l->a[i];
        const char *op = (unsigned)a.op < 6 ? op_names[a.op] : "?";
        char what[64];
        if (V > 1) snprintf(what, sizeof what, "%s %d.%d", op, a.micro, a.chunk);
        else snprintf(what, sizeof what, "%s %d", op, a.micro);
        int c = a.chunk * P + s;
        if ((unsigned)a.op >= 6 || a.micro < 0 || a.micro >= M || a.chunk < 0 || a.chunk >= V) {
            st = dt_error(DT_ERR_INTERNAL, "pipeline: stage %d, action %d: %s is no action of %d micro-batches and %d "
                          "chunks", s, i, what, M, V);
            break;
        }
        if (SEEN(a, a.op))
            st = dt_error(DT_ERR_INTERNAL, "pipeline: stage %d, action %d: %s twice", s, i, what);
        else if ((a.op == DT_PP_RECV_ACT || a.op == DT_PP_SEND_GRAD) && c == 0)
            st = dt_error(DT_ERR_INTERNAL, "pipeline: stage %d, action %d: %s, but the model's first chunk has no "
                          "predecessor", s, i, what);
        else if ((a.op == DT_PP_SEND_ACT || a.op == DT_PP_RECV_GRAD) && c == C - 1)
            st = dt_error(DT_ERR_INTERNAL, "pipeline: stage %d, action %d: %s, but the model's last chunk has no "
                          "successor", s, i, what);
        else if (a.op == DT_PP_FWD && c > 0 && !SEEN(a, DT_PP_RECV_ACT))
            st = dt_error(DT_ERR_INTERNAL, "pipeline: stage %d, action %d: %s before its input arrived", s, i, what);
        else if (a.op == DT_PP_SEND_ACT && !SEEN(a, DT_PP_FWD))
            st = dt_error(DT_ERR_INTERNAL, "pipeline: stage %d, action %d: %s before its forward", s, i, what);
        else if (a.op == DT_PP_BWD && !SEEN(a, DT_PP_FWD))
            st = dt_error(DT_ERR_INTERNAL, "pipeline: stage %d, action %d: %s before its forward", s, i, what);
        else if (a.op == DT_PP_BWD && c < C - 1 && !SEEN(a, DT_PP_RECV_GRAD))
            st = dt_error(DT_ERR_INTERNAL, "pipeline: stage %d, action %d: %s before its output's gradient arrived", s,
                          i, what);
        else if (a.op == DT_PP_BWD && a.micro != next_bwd[a.chunk])
            st = dt_error(DT_ERR_INTERNAL, "pipeline: stage %d, action %d: %s out of micro-batch order (%d is next): "
                          "the gradient sum would differ from one process's", s, i, what, next_bwd[a.chunk]);
        else if (a.op == DT_PP_SEND_GRAD && !SEEN(a, DT_PP_BWD))
            st = dt_error(DT_ERR_INTERNAL, "pipeline: stage %d, action %d: %s before its backward", s, i, what);
        if (st != DT_OK) break;
        SEEN(a, a.op) = i + 1;
        if (a.op == DT_PP_FWD && ++held > *held_max) *held_max = held;
        if (a.op == DT_PP_BWD) { held--; next_bwd[a.chunk]++; }
    }
    for (int v = 0; st == DT_OK && v < V; v++)
        for (int m = 0; st == DT_OK && m < M; m++)
            for (int op = 0; st == DT_OK && op < 6; op++) {
                int c = v * P + s;
                int needed = op == DT_PP_FWD || op == DT_PP_BWD || ((op == DT_PP_RECV_ACT || op == DT_PP_SEND_GRAD) && c > 0) ||
                             ((op == DT_PP_SEND_ACT || op == DT_PP_RECV_GRAD) && c < C - 1);
                dt_pp_action a = {.op = (dt_pp_op)op, .micro = m, .chunk = v};
                if (needed && !SEEN(a, op)) {
                    if (V > 1) st = dt_error(DT_ERR_INTERNAL, "pipeline: stage %d never runs %s %d.%d", s, op_names[op], m, v);
                    else st = dt_error(DT_ERR_INTERNAL, "pipeline: stage %d never runs %s %d", s, op_names[op], m);
                }
            }
#undef SEEN
    free(seen);
    free(next_bwd);
    return st;
}

/* The stage and chunk at the other end of action a of stage s: the next model chunk for
 * an output sent or a gradient received, the previous one otherwise. */
static void peer_of(dt_pp_action a, int s, int P, int *stage, int *chunk) {
    int c = a.chunk * P + s + (a.op == DT_PP_SEND_ACT || a.op == DT_PP_RECV_GRAD ? 1 : -1);
    *stage = c % P;
    *chunk = c / P;
}

/* Whether action a of stage s can complete now: a send or a receive meets its peer's
 * matching action at the head of the peer's list (a rendezvous); anything else runs. */
static int matched(const dt_pp_list *lists, const int *pos, int s, int P, dt_pp_action a) {
    int peer, chunk;
    peer_of(a, s, P, &peer, &chunk);
    dt_pp_op want = a.op == DT_PP_SEND_ACT ? DT_PP_RECV_ACT : a.op == DT_PP_RECV_ACT ? DT_PP_SEND_ACT
                  : a.op == DT_PP_SEND_GRAD ? DT_PP_RECV_GRAD : DT_PP_SEND_GRAD;
    if (pos[peer] >= lists[peer].n) return 0;
    dt_pp_action b = lists[peer].a[pos[peer]];
    return b.op == want && b.micro == a.micro && b.chunk == chunk;
}

dt_status dt_pp_check(const dt_pp_list *lists, int P, int M, int *in_flight) {
    int most = 0, V = P > 0 && lists[0].chunks > 0 ? lists[0].chunks : 1;
    for (int s = 0; s < P; s++) {
        int held = 0;
        if ((lists[s].chunks > 0 ? lists[s].chunks : 1) != V)
            return dt_error(DT_ERR_INTERNAL, "pipeline: stage %d holds %d chunks, stage 0 %d", s, lists[s].chunks, V);
        DT_TRY(check_one(&lists[s], s, P, V, M, &held));
        if (held > most) most = held;
    }
    if (in_flight) *in_flight = most;
    int *pos = calloc((size_t)P, sizeof *pos);
    if (!pos) return dt_error(DT_ERR_NOMEM, "pipeline: out of memory");
    for (int moved = 1; moved;) {
        moved = 0;
        for (int s = 0; s < P; s++) {
            while (pos[s] < lists[s].n) {
                dt_pp_action a = lists[s].a[pos[s]];
                if (a.op == DT_PP_FWD || a.op == DT_PP_BWD) { pos[s]++; moved = 1; continue; }
                if (!matched(lists, pos, s, P, a)) break;
                int peer, chunk;
                peer_of(a, s, P, &peer, &chunk);
                pos[s]++;
                pos[peer]++;
                moved = 1;
            }
        }
    }
    dt_status st = DT_OK;
    for (int s = 0; s < P && st == DT_OK; s++)
        if (pos[s] < lists[s].n) {
            dt_pp_action a = lists[s].a[pos[s]];
            if (V > 1)
                st = dt_error(DT_ERR_INTERNAL, "pipeline: the schedule hangs: stage %d waits at %s %d.%d (action %d of %d)",
                              s, op_names[a.op], a.micro, a.chunk, pos[s], lists[s].n);
            else
                st = dt_error(DT_ERR_INTERNAL, "pipeline: the schedule hangs: stage %d waits at %s %d (action %d of %d)",
                              s, op_names[a.op], a.micro, pos[s], lists[s].n);
        }
    free(pos);
    return st;
}
