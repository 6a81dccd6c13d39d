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

static void put(builder *b, dt_pp_op op, int micro) {
    if (b->s != DT_OK) return;
    if (b->l->n == b->cap) {
        int cap = b->cap ? 2 * b->cap : 16;
        dt_pp_action *a = realloc(b->l->a, (size_t)cap * sizeof *a);
        if (!a) { b->s = dt_error(DT_ERR_NOMEM, "pipeline: out of memory for a schedule"); return; }
        b->l->a = a;
        b->cap = cap;
    }
    b->l->a[b->l->n++] = (dt_pp_action){.op = op, .micro = micro};
}

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

struct dt_pp_schedule {
    const char *name;
    void (*build)(builder *b, int stages, int stage, int micro);
};

static const dt_pp_schedule schedules[] = {
    {"gpipe", build_gpipe},
    {"1f1b", build_1f1b},
};
#define NSCHED ((int)(sizeof schedules / sizeof schedules[0]))

const dt_pp_schedule *dt_pp_find(const char *name) {
    for (int i = 0; name && i < NSCHED; i++)
        if (!strcmp(schedules[i].name, name)) return &schedules[i];
    return NULL;
}

const char *dt_pp_name(const dt_pp_schedule *s) { return s ? s->name : "?"; }

const char *dt_pp_names(char *buf, size_t n) {
    if (n) buf[0] = '\0';
    for (int i = 0; i < NSCHED; i++) {
        size_t k = strlen(buf);
        snprintf(buf + k, n - k, "%s%s", i == 0 ? "" : i + 1 < NSCHED ? ", " : " or ", schedules[i].name);
    }
    return buf;
}

dt_status dt_pp_build(const dt_pp_schedule *sch, int stages, int stage, int micro, dt_pp_list *out) {
    memset(out, 0, sizeof *out);
    if (!sch) return dt_error(DT_ERR_INVALID, "pipeline: no schedule");
    if (stages < 1 || stage < 0 || stage >= stages)
        return dt_error(DT_ERR_INVALID, "pipeline: stage %d of %d", stage, stages);
    if (micro < stages)
        return dt_error(DT_ERR_INVALID, "pipeline: %d micro-batches cannot fill %d stages (the %s schedule needs at "
                        "least as many micro-batches as stages)", micro, stages, sch->name);
    builder b = {.l = out, .first = stage == 0, .last = stage == stages - 1, .s = DT_OK};
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

size_t dt_pp_dump(const dt_pp_list *l, char *buf, size_t n) {
    size_t len = 0;
    if (n) buf[0] = '\0';
    for (int i = 0; i < l->n; i++) {
        char line[48];
        int k = snprintf(line, sizeof line, "%s %d\n", op_names[l->a[i].op], l->a[i].micro);
        if (len + (size_t)k < n) memcpy(buf + len, line, (size_t)k + 1);
        len += (size_t)k;
    }
    return len;
}

/* Stage s's list alone: counts, order, boundary tensors on the right stages. */
static dt_status check_one(const dt_pp_list *l, int s, int P, int M, int *held_max) {
    int *seen = calloc((size_t)M * 6, sizeof *seen);   /* per micro and op: its position + 1 */
    if (!seen) return dt_error(DT_ERR_NOMEM, "pipeline: out of memory");
    dt_status st = DT_OK;
    int held = 0, next_bwd = 0;
    *held_max = 0;
    for (int i = 0; i < l->n && st == DT_OK; i++) {
        dt_pp_action a = l->a[i];
        const char *op = (unsigned)a.op < 6 ? op_names[a.op] : "?";
        if ((unsigned)a.op >= 6 || a.micro < 0 || a.micro >= M)
            st = dt_error(DT_ERR_INTERNAL, "pipeline: stage %d, action %d: %s %d is no action of %d micro-batches", s, i,
                          op, a.micro, M);
        else if (seen[a.micro * 6 + a.op])
            st = dt_error(DT_ERR_INTERNAL, "pipeline: stage %d, action %d: %s %d twice", s, i, op, a.micro);
        else if ((a.op == DT_PP_RECV_ACT || a.op == DT_PP_SEND_GRAD) && s == 0)
            st = dt_error(DT_ERR_INTERNAL, "pipeline: stage 0, action %d: %s, but the first stage has no predecessor", i, op);
        else if ((a.op == DT_PP_SEND_ACT || a.op == DT_PP_RECV_GRAD) && s == P - 1)
            st = dt_error(DT_ERR_INTERNAL, "pipeline: stage %d, action %d: %s, but the last stage has no successor", s, i, op);
        else if (a.op == DT_PP_FWD && s > 0 && !seen[a.micro * 6 + DT_PP_RECV_ACT])
            st = dt_error(DT_ERR_INTERNAL, "pipeline: stage %d, action %d: FWD %d before its input arrived", s, i, a.micro);
        else if (a.op == DT_PP_SEND_ACT && !seen[a.micro * 6 + DT_PP_FWD])
            st = dt_error(DT_ERR_INTERNAL, "pipeline: stage %d, action %d: SEND_ACT %d before its forward", s, i, a.micro);
        else if (a.op == DT_PP_BWD && !seen[a.micro * 6 + DT_PP_FWD])
            st = dt_error(DT_ERR_INTERNAL, "pipeline: stage %d, action %d: BWD %d before its forward", s, i, a.micro);
        else if (a.op == DT_PP_BWD && s < P - 1 && !seen[a.micro * 6 + DT_PP_RECV_GRAD])
            st = dt_error(DT_ERR_INTERNAL, "pipeline: stage %d, action %d: BWD %d before its output's gradient arrived", s,
                          i, a.micro);
        else if (a.op == DT_PP_BWD && a.micro != next_bwd)
            st = dt_error(DT_ERR_INTERNAL, "pipeline: stage %d, action %d: BWD %d out of micro-batch order (%d is next): "
                          "the gradient sum would differ from one process's", s, i, a.micro, next_bwd);
        else if (a.op == DT_PP_SEND_GRAD && !seen[a.micro * 6 + DT_PP_BWD])
            st = dt_error(DT_ERR_INTERNAL, "pipeline: stage %d, action %d: SEND_GRAD %d before its backward", s, i, a.micro);
        if (st != DT_OK) break;
        seen[a.micro * 6 + a.op] = i + 1;
        if (a.op == DT_PP_FWD && ++held > *held_max) *held_max = held;
        if (a.op == DT_PP_BWD) { held--; next_bwd++; }
    }
    for (int m = 0; st == DT_OK && m < M; m++)
        for (int op = 0; st == DT_OK && op < 6; op++) {
            int needed = op == DT_PP_FWD || op == DT_PP_BWD || ((op == DT_PP_RECV_ACT || op == DT_PP_SEND_GRAD) && s > 0) ||
                         ((op == DT_PP_SEND_ACT || op == DT_PP_RECV_GRAD) && s < P - 1);
            if (needed && !seen[m * 6 + op])
                st = dt_error(DT_ERR_INTERNAL, "pipeline: stage %d never runs %s %d", s, op_names[op], m);
        }
    free(seen);
    return st;
}

/* Whether action a of stage s can complete now: a send or a receive meets its peer's
 * matching action at the head of the peer's list (a rendezvous); anything else runs. */
static int matched(const dt_pp_list *lists, const int *pos, int s, dt_pp_action a) {
    int peer = a.op == DT_PP_SEND_ACT || a.op == DT_PP_RECV_GRAD ? s + 1 : s - 1;
    dt_pp_op want = a.op == DT_PP_SEND_ACT ? DT_PP_RECV_ACT : a.op == DT_PP_RECV_ACT ? DT_PP_SEND_ACT
                  : a.op == DT_PP_SEND_GRAD ? DT_PP_RECV_GRAD : DT_PP_SEND_GRAD;
    if (pos[peer] >= lists[peer].n) return 0;
    dt_pp_action b = lists[peer].a[pos[peer]];
    return b.op == want && b.micro == a.micro;
}

dt_status dt_pp_check(const dt_pp_list *lists, int P, int M, int *in_flight) {
    int most = 0;
    for (int s = 0; s < P; s++) {
        int held = 0;
        DT_TRY(check_one(&lists[s], s, P, M, &held));
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
                if (!matched(lists, pos, s, a)) break;
                int peer = a.op == DT_PP_SEND_ACT || a.op == DT_PP_RECV_GRAD ? s + 1 : s - 1;
                pos[s]++;
                pos[peer]++;
                moved = 1;
            }
        }
    }
    dt_status st = DT_OK;
    for (int s = 0; s < P && st == DT_OK; s++)
        if (pos[s] < lists[s].n)
            st = dt_error(DT_ERR_INTERNAL, "pipeline: the schedule hangs: stage %d waits at %s %d (action %d of %d)", s,
                          op_names[lists[s].a[pos[s]].op], lists[s].a[pos[s]].micro, pos[s], lists[s].n);
    free(pos);
    return st;
}
