/*
 * trace.c: the records of trace.h, in one growable array under a mutex (a few dozen a
 * step, from the main, communication and loader threads), written as trace events.
 */
#include "config.h"

#include "trace.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "sbuf.h"

#define MAX_THREADS 16

typedef struct {
    char   name[48], cat[16], detail[96];
    double t0, t1;        /* a counter: t0 = t1 = its time */
    double value;
    double wait;          /* a collective's wait for its peers (s), longest for wait_peer */
    int    tid, counter, wait_peer;
} record;

static atomic_int       g_on;
static pthread_mutex_t  g_mu = PTHREAD_MUTEX_INITIALIZER;
static record          *g_rec;
static size_t           g_n, g_cap;
static const char      *g_thread_name[MAX_THREADS];
static atomic_int       g_threads;
static _Thread_local int t_tid = -1;

void dt_trace_enable(int on) { atomic_store_explicit(&g_on, on ? 1 : 0, memory_order_relaxed); }
int  dt_trace_on(void) { return atomic_load_explicit(&g_on, memory_order_relaxed); }

/* The calling thread's id: 0, 1, ... in the order threads first record (the last id
 * is shared by threads beyond MAX_THREADS). */
static int tid(void) {
    if (t_tid < 0) {
        int id = atomic_fetch_add(&g_threads, 1);
        t_tid = id < MAX_THREADS ? id : MAX_THREADS - 1;
    }
    return t_tid;
}

void dt_trace_thread(const char *name) {
    int id = tid();
    pthread_mutex_lock(&g_mu);
    if (!g_thread_name[id]) g_thread_name[id] = name;
    pthread_mutex_unlock(&g_mu);
}

static void add(const record *r) {
    pthread_mutex_lock(&g_mu);
    if (g_n == g_cap) {
        size_t cap = g_cap ? 2 * g_cap : 1024;
        record *p = realloc(g_rec, cap * sizeof *p);
        if (!p) {   /* out of memory: the record is lost, the run goes on */
            pthread_mutex_unlock(&g_mu);
            return;
        }
        g_rec = p;
        g_cap = cap;
    }
    g_rec[g_n++] = *r;
    pthread_mutex_unlock(&g_mu);
}

static void copy(char *dst, size_t n, const char *src) {
    size_t len = src ? strlen(src) : 0;
    if (len >= n) len = n - 1;
    if (len) memcpy(dst, src, len);
    dst[len] = '\0';
}

void dt_trace_span(const char *name, const char *cat, double t0, double t1, const char *detail) {
    dt_trace_span_wait(name, cat, t0, t1, detail, 0.0, -1);
}

void dt_trace_span_wait(const char *name, const char *cat, double t0, double t1, const char *detail,
                        double wait_s, int peer) {
    if (!dt_trace_on()) return;
    record r = {.t0 = t0, .t1 = t1 >= t0 ? t1 : t0, .tid = tid(), .wait = wait_s, .wait_peer = peer};
    copy(r.name, sizeof r.name, name);
    copy(r.cat, sizeof r.cat, cat);
    copy(r.detail, sizeof r.detail, detail);
    add(&r);
}

void dt_trace_counter(const char *name, double t, double value) {
    if (!dt_trace_on()) return;
    record r = {.t0 = t, .t1 = t, .value = value, .tid = tid(), .counter = 1, .wait_peer = -1};
    copy(r.name, sizeof r.name, name);
    add(&r);
}

/* ---- device time ---- */

static dt_status (*g_mark)(int *id);
static dt_status (*g_read)(double *sec, int n);
static record    *g_dev;          /* spans waiting for their marks' times: t0, t1 hold the marks */
static size_t     g_ndev, g_capdev;
static int        g_dev_tid = -1;
static int        g_marks;        /* marks taken since the last flush */

void dt_trace_device(dt_status (*mark)(int *id), dt_status (*read)(double *sec, int n)) {
    g_mark = mark && read ? mark : NULL;
    g_read = mark && read ? read : NULL;
}

int dt_trace_dev_mark(void) {
    int id = -1;
    if (dt_trace_on() && g_mark && g_mark(&id) != DT_OK) id = -1;
    if (id >= 0) g_marks++;
    return id;
}

int dt_trace_dev_span(int begin, const char *name, const char *cat, const char *detail) {
    if (begin < 0) return -1;
    int end = dt_trace_dev_mark();
    if (end < 0) return -1;
    if (g_ndev == g_capdev) {
        size_t cap = g_capdev ? 2 * g_capdev : 256;
        record *p = realloc(g_dev, cap * sizeof *p);
        if (!p) return end;   /* out of memory: the span is lost, the run goes on */
        g_dev = p;
        g_capdev = cap;
    }
    record *r = &g_dev[g_ndev++];
    memset(r, 0, sizeof *r);
    r->t0 = begin;
    r->t1 = end;
    r->wait_peer = -1;
    copy(r->name, sizeof r->name, name);
    copy(r->cat, sizeof r->cat, cat);
    copy(r->detail, sizeof r->detail, detail);
    return end;
}

dt_status dt_trace_dev_flush(void) {
    if (!g_read || !g_marks) return DT_OK;
    g_marks = 0;
    int last = -1;
    if (g_mark && g_mark(&last) != DT_OK) last = -1;   /* taken whether tracing is on or not */
    double *sec = last >= 0 ? malloc(((size_t)last + 1) * sizeof *sec) : NULL;
    dt_status s = g_read(sec, sec ? last + 1 : 0);     /* also forgets the marks */
    double host = dt_now();
    if (s == DT_OK && sec && g_ndev) {
        if (g_dev_tid < 0) {
            int id = atomic_fetch_add(&g_threads, 1);
            g_dev_tid = id < MAX_THREADS ? id : MAX_THREADS - 1;
            pthread_mutex_lock(&g_mu);
            if (!g_thread_name[g_dev_tid]) g_thread_name[g_dev_tid] = "device";
            pthread_mutex_unlock(&g_mu);
        }
        for (size_t i = 0; i < g_ndev; i++) {
            record r = g_dev[i];
            int a = (int)r.t0, b = (int)r.t1;
            if (a > last || b > last) continue;
            r.t0 = host - (sec[last] - sec[a]);
            r.t1 = host - (sec[last] - sec[b]);
            if (r.t1 < r.t0) r.t1 = r.t0;
            r.tid = g_dev_tid;
            add(&r);
        }
    }
    g_ndev = 0;
    free(sec);
    return s;
}

static void meta_event(dt_sbuf *b, int rank, int id, const char *what, const char *name, int n) {
    dt_sbuf_printf_(b, "%s{\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"name\":\"%s\",\"args\":{\"name\":\"", n ? ",\n" : "",
                    rank, id, what);
    dt_sbuf_json_(b, name);
    dt_sbuf_str_(b, "\"}}");
}

dt_status dt_trace_json(int rank, double base, double offset, char **out, size_t *len) {
    dt_sbuf b = {0};
    pthread_mutex_lock(&g_mu);
    char pname[32];
    snprintf(pname, sizeof pname, "rank %d", rank);
    meta_event(&b, rank, 0, "process_name", pname, 0);
    dt_sbuf_printf_(&b, ",\n{\"ph\":\"M\",\"pid\":%d,\"name\":\"process_sort_index\",\"args\":{\"sort_index\":%d}}",
                    rank, rank);
    int nthreads = atomic_load(&g_threads);
    for (int i = 0; i < nthreads && i < MAX_THREADS; i++)
        if (g_thread_name[i]) meta_event(&b, rank, i, "thread_name", g_thread_name[i], 1);
    for (size_t i = 0; i < g_n; i++) {
        const record *r = &g_rec[i];
        double ts = (r->t0 + offset - base) * 1e6;
        dt_sbuf_str_(&b, ",\n{\"name\":\"");
        dt_sbuf_json_(&b, r->name);
        if (r->counter) {
            dt_sbuf_printf_(&b, "\",\"ph\":\"C\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"args\":{\"value\":%.6g}}", rank,
                            r->tid, ts, r->value);
            continue;
        }
        dt_sbuf_str_(&b, "\",\"cat\":\"");
        dt_sbuf_json_(&b, r->cat);
        dt_sbuf_printf_(&b, "\",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f", rank, r->tid, ts,
                        (r->t1 - r->t0) * 1e6);
        if (r->detail[0] || r->wait_peer >= 0) {
            dt_sbuf_str_(&b, ",\"args\":{\"detail\":\"");
            dt_sbuf_json_(&b, r->detail);
            dt_sbuf_str_(&b, "\"");
            if (r->wait_peer >= 0)
                dt_sbuf_printf_(&b, ",\"waited_ms\":%.3f,\"waited_for\":%d", r->wait * 1e3, r->wait_peer);
            dt_sbuf_str_(&b, "}");
        }
        dt_sbuf_str_(&b, "}");
    }
    pthread_mutex_unlock(&g_mu);
    if (b.oom) {
        dt_sbuf_free_(&b);
        return dt_error(DT_ERR_NOMEM, "trace: out of memory writing the events");
    }
    *out = b.p;
    *len = b.len;
    return DT_OK;
}

size_t dt_trace_count(void) {
    pthread_mutex_lock(&g_mu);
    size_t n = g_n;
    pthread_mutex_unlock(&g_mu);
    return n;
}

void dt_trace_reset(void) {
    pthread_mutex_lock(&g_mu);
    free(g_rec);
    g_rec = NULL;
    g_n = g_cap = 0;
    g_ndev = 0;
    pthread_mutex_unlock(&g_mu);
}
