/*
 * coll_cases.h: one case per collective of the list (src/comm/coll.h), and the harness
 * that runs every case on a communicator, whatever its backend.
 *
 * The case table is generated from the list (DT_COLLECTIVES): collective `id` is run by
 * cc_<id>, so a collective added to the list without a case here does not compile. A
 * case calls the collective's public function (dt_allreduce, ...) for one element type
 * (the harness runs it for each of the collectives' types), with every operator where
 * it takes one, out of place and in place where it can be, from the last rank where it
 * takes a root, on counts the world size does not divide. Inputs are small integers, so
 * every result is exact and compared as a number: equal, but avg of a floating type
 * within its rounding (NCCL's ncclAvg multiplies each input by 1/W before summing).
 * Every rank issues the same calls whatever its results, so one failure cannot hang
 * the others.
 *
 * Buffers come from the program (cc_mem): host memory in tests/coll_prog.c --mode every
 * (the tcp and mpi backends, tests/comm_every.sh), device memory in
 * tests/gpu_nccl_prog.c --mode every (the nccl backend, tests/gpu_lib.sh). One TAP line
 * per collective and type, through rank_tap.h's check().
 */
#ifndef DT_COLL_CASES_H
#define DT_COLL_CASES_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll.h"
#include "dtype.h"
#include "rank_tap.h"

/* The memory the collectives run on. */
typedef struct {
    void *(*alloc)(size_t bytes);                        /* exits on failure */
    void  (*release)(void *buf);
    void  (*put)(void *buf, const void *host, size_t bytes);
    void  (*get)(void *host, const void *buf, size_t bytes);
} cc_mem;

/* ---- inputs and expected values ---- */

/* Input element i of rank r: small positive integers; prod's stay 1 or 2. */
static int cc_input(int r, size_t i, dt_redop op) {
    if (op == DT_PROD) return 1 + (int)((i + (size_t)r) % 2);
    return 1 + (int)((i * 7 + (size_t)r * 3) % 5);
}

static int cc_floating(dt_dtype t) { return t == DT_F32 || t == DT_F64 || t == DT_F16 || t == DT_BF16; }

static void cc_set(dt_dtype t, void *p, size_t i, double v) {
    switch (t) {
    case DT_F32:  ((float *)p)[i] = (float)v; break;
    case DT_F64:  ((double *)p)[i] = v; break;
    case DT_F16:  ((uint16_t *)p)[i] = dt_f32_to_f16((float)v); break;
    case DT_BF16: ((uint16_t *)p)[i] = dt_f32_to_bf16((float)v); break;
    case DT_I32:  ((int32_t *)p)[i] = (int32_t)v; break;
    case DT_I64:  ((int64_t *)p)[i] = (int64_t)v; break;
    default:      ((uint8_t *)p)[i] = (uint8_t)v; break;
    }
}

static double cc_get(dt_dtype t, const void *p, size_t i) {
    switch (t) {
    case DT_F32:  return ((const float *)p)[i];
    case DT_F64:  return ((const double *)p)[i];
    case DT_F16:  return dt_f16_to_f32(((const uint16_t *)p)[i]);
    case DT_BF16: return dt_bf16_to_f32(((const uint16_t *)p)[i]);
    case DT_I32:  return ((const int32_t *)p)[i];
    case DT_I64:  return (double)((const int64_t *)p)[i];
    default:      return ((const uint8_t *)p)[i];
    }
}

/* Input element i reduced over the W ranks with op (avg of an integer type truncates). */
static double cc_reduced(dt_dtype t, dt_redop op, size_t i) {
    double acc = op == DT_PROD ? 1 : op == DT_MIN ? 1e9 : op == DT_MAX ? -1e9 : 0;
    for (int r = 0; r < W; r++) {
        double v = cc_input(r, i, op);
        if (op == DT_SUM || op == DT_AVG) acc += v;
        else if (op == DT_PROD) acc *= v;
        else if (op == DT_MIN) acc = v < acc ? v : acc;
        else acc = v > acc ? v : acc;
    }
    if (op == DT_AVG) acc = cc_floating(t) ? acc / W : floor(acc / W);
    return acc;
}

/* ---- buffers ---- */

/* n elements of t at buf: the inputs of rank r from element base (r < 0: 0xA5 bytes, so
 * an element a collective leaves unwritten shows). */
static void cc_fill(const cc_mem *m, void *buf, dt_dtype t, dt_redop op, size_t n, int r, size_t base) {
    size_t bytes = n * dt_dtype_size(t);
    unsigned char *h = malloc(bytes + 1);
    if (!h) { fprintf(stderr, "ERROR: out of memory\n"); exit(1); }
    if (r < 0) memset(h, 0xA5, bytes);
    else for (size_t i = 0; i < n; i++) cc_set(t, h, i, cc_input(r, base + i, op));
    m->put(buf, h, bytes);
    free(h);
}

static void *cc_buf(const cc_mem *m, dt_dtype t, dt_redop op, size_t n, int r, size_t base) {
    void *b = m->alloc(n * dt_dtype_size(t) + 1);
    cc_fill(m, b, t, op, n, r, base);
    return b;
}

/* The call's status and the n elements of t at buf against what they should be: input
 * element base + i of rank `from`, or with from < 0 that element reduced over the ranks;
 * with per > 0, element i is element i % per of rank i / per (a gather). The first
 * difference goes to why (when it is still empty) as "<what>: ...". Returns 1 if all
 * agree. */
static int cc_expect(const cc_mem *m, dt_status s, const void *buf, dt_dtype t, dt_redop op, size_t n, int from,
                     size_t base, size_t per, const char *what, char *why, size_t nwhy) {
    if (s != DT_OK) {
        if (!why[0]) snprintf(why, nwhy, "%s: %s", what, dt_last_error());
        return 0;
    }
    size_t bytes = n * dt_dtype_size(t);
    unsigned char *h = malloc(bytes + 1);
    if (!h) { fprintf(stderr, "ERROR: out of memory\n"); exit(1); }
    m->get(h, buf, bytes);
    int good = 1;
    for (size_t i = 0; i < n && good; i++) {
        int r = per ? (int)(i / per) : from;
        size_t k = per ? i % per : base + i;
        double want = r < 0 ? cc_reduced(t, op, k) : cc_input(r, k, op), got = cc_get(t, h, i);
        double tol = op != DT_AVG || !cc_floating(t) ? 0 : t == DT_F64 ? 1e-12 : t == DT_F32 ? 1e-6 : 1e-2;
        good = fabs(got - want) <= tol * fabs(want);
        if (!good && !why[0]) snprintf(why, nwhy, "%s: element %zu is %g, expected %g", what, i, got, want);
    }
    free(h);
    return good;
}

/* ---- the cases: run collective `id` on elements of t; 1 when every result is right ---- */

typedef int cc_fn(dt_comm *c, const cc_mem *m, dt_dtype t, char *why, size_t nwhy);

static int cc_allreduce(dt_comm *c, const cc_mem *m, dt_dtype t, char *why, size_t nwhy) {
    size_t n = 7 * (size_t)W + 1;
    int good = 1;
    for (int op = 0; op < DT_REDOP_COUNT; op++)
        for (int inplace = 0; inplace < 2; inplace++) {
            void *s = cc_buf(m, t, op, n, R, 0), *d = inplace ? s : cc_buf(m, t, op, n, -1, 0);
            char what[64];
            snprintf(what, sizeof what, "%s, %s", dt_redop_name(op), inplace ? "in place" : "out of place");
            dt_status st = dt_allreduce(c, s, d, n, t, op);
            good &= cc_expect(m, st, d, t, op, n, -1, 0, 0, what, why, nwhy);
            if (!inplace) m->release(d);
            m->release(s);
        }
    return good;
}

static int cc_broadcast(dt_comm *c, const cc_mem *m, dt_dtype t, char *why, size_t nwhy) {
    size_t n = 7 * (size_t)W + 1;
    int root = W - 1;
    void *b = cc_buf(m, t, DT_SUM, n, R == root ? root : -1, 0);
    char what[32];
    snprintf(what, sizeof what, "root %d", root);
    int good = cc_expect(m, dt_broadcast(c, b, n, t, root), b, t, DT_SUM, n, root, 0, 0, what, why, nwhy);
    m->release(b);
    return good;
}

static int cc_allgather(dt_comm *c, const cc_mem *m, dt_dtype t, char *why, size_t nwhy) {
    size_t per = 5, es = dt_dtype_size(t), n = per * (size_t)W;
    int good = 1;
    for (int inplace = 0; inplace < 2; inplace++) {
        void *d = cc_buf(m, t, DT_SUM, n, -1, 0), *mine = (char *)d + (size_t)R * per * es;
        void *s = inplace ? mine : cc_buf(m, t, DT_SUM, per, R, 0);
        if (inplace) cc_fill(m, mine, t, DT_SUM, per, R, 0);
        dt_status st = dt_allgather(c, s, d, per, t);
        good &= cc_expect(m, st, d, t, DT_SUM, n, 0, 0, per, inplace ? "in place" : "out of place", why, nwhy);
        if (!inplace) m->release(s);
        m->release(d);
    }
    return good;
}

static int cc_reduce_scatter(dt_comm *c, const cc_mem *m, dt_dtype t, char *why, size_t nwhy) {
    size_t per = 7, es = dt_dtype_size(t), n = per * (size_t)W;
    int good = 1;
    for (int op = 0; op < DT_REDOP_COUNT; op++)
        for (int inplace = 0; inplace < 2; inplace++) {
            void *s = cc_buf(m, t, op, n, R, 0);
            void *d = inplace ? (char *)s + (size_t)R * per * es : cc_buf(m, t, op, per, -1, 0);
            char what[64];
            snprintf(what, sizeof what, "%s, %s", dt_redop_name(op), inplace ? "in place" : "out of place");
            dt_status st = dt_reduce_scatter(c, s, d, per, t, op);
            good &= cc_expect(m, st, d, t, op, per, -1, (size_t)R * per, 0, what, why, nwhy);
            if (!inplace) m->release(d);
            m->release(s);
        }
    return good;
}

static int cc_reduce(dt_comm *c, const cc_mem *m, dt_dtype t, char *why, size_t nwhy) {
    size_t n = 7 * (size_t)W + 1;
    int root = W - 1, good = 1;
    for (int op = 0; op < DT_REDOP_COUNT; op++) {
        void *s = cc_buf(m, t, op, n, R, 0), *d = R == root ? cc_buf(m, t, op, n, -1, 0) : NULL;
        char what[64];
        snprintf(what, sizeof what, "%s, root %d", dt_redop_name(op), root);
        dt_status st = dt_reduce(c, s, d, n, t, op, root);
        if (R == root) good &= cc_expect(m, st, d, t, op, n, -1, 0, 0, what, why, nwhy);
        else good &= cc_expect(m, st, s, t, op, 0, -1, 0, 0, what, why, nwhy);   /* the status only */
        if (d) m->release(d);
        m->release(s);
    }
    return good;
}

static int cc_barrier(dt_comm *c, const cc_mem *m, dt_dtype t, char *why, size_t nwhy) {
    (void)m; (void)t;
    dt_status s = dt_barrier(c);
    if (s != DT_OK) snprintf(why, nwhy, "%s", dt_last_error());
    return s == DT_OK;
}

/* The table, in the order of the list: a missing cc_<id> is a compile error. */
static const struct { const char *name; cc_fn *fn; } cc_cases[DT_COLL_COUNT] = {
#define CC_ROW_(ID, id, name, flags) { name, cc_##id },
    DT_COLLECTIVES(CC_ROW_)
#undef CC_ROW_
};

/* ---- the harness ---- */

/* Every case of the table on c: one test point per collective and element type (one for
 * a collective without data). */
static void cc_run_all(dt_comm *c, const cc_mem *m) {
    for (int k = 1; k <= DT_COLL_COUNT; k++) {
        int ntypes = dt_coll_get(k)->flags & DT_COLL_NO_DATA ? 1 : DT_COMM_NDTYPES;
        for (int t = 0; t < ntypes; t++) {
            char why[512] = "";
            int good = cc_cases[k - 1].fn(c, m, (dt_dtype)t, why, sizeof why);
            check(good, "%s%s%s on %s%s%s", cc_cases[k - 1].name, ntypes > 1 ? " " : "",
                  ntypes > 1 ? dt_dtype_name((dt_dtype)t) : "", dt_comm_backend(c), good ? "" : ": ", why);
        }
    }
}

#endif /* DT_COLL_CASES_H */
