/*
 * comm.c: the public communication API — everything that is the same for every backend.
 *
 *   - names and parsers of element types and operators;
 *   - dt_comm_init: options from the environment, backend by name, the family lock;
 *   - argument checks with clear errors (NULL buffers, bad type/op/root, size overflow);
 *   - sequence numbers and fingerprints, so ranks that call different collectives get an
 *     error naming both calls instead of wrong data (docs/DESIGN.md rule 3);
 *   - dispatch: a backend's own collective when it has one, else algo.c over its p2p;
 *   - the checks, descriptions and dispatch read each collective's row of the list
 *     (coll.h): one entry point, dt_coll_run, behind the public functions;
 *   - async work: one worker thread per communicator runs queued operations in issue
 *     order; a blocking call first waits for the queue to drain;
 *   - split: agree on groups with an all-gather, then let the backend attach transport;
 *   - every error message starts with "rank R: ".
 */
#include "config.h"
#include "comm_impl.h"
#include "launch_env.h"
#include "reduce.h"
#include "seal.h"
#include "clock.h"
#include "trace.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* ---- types and operators -------------------------------------------------------------- */

static const char *const redops[DT_REDOP_COUNT] = { "sum", "avg", "min", "max", "prod" };

static int dtype_ok(dt_dtype t) { return (unsigned)t < DT_COMM_NDTYPES; }
static int redop_ok(dt_redop op) { return (unsigned)op < DT_REDOP_COUNT; }

const char *dt_redop_name(dt_redop op) { return redop_ok(op) ? redops[op] : "?"; }

dt_status dt_redop_parse(const char *s, dt_redop *out) {
    if (!s) return dt_error(DT_ERR_INVALID, "reduction operator is NULL");
    for (int i = 0; i < DT_REDOP_COUNT; i++)
        if (strcasecmp(s, redops[i]) == 0) { *out = (dt_redop)i; return DT_OK; }
    if (strcasecmp(s, "mean") == 0) { *out = DT_AVG; return DT_OK; }
    if (strcasecmp(s, "product") == 0) { *out = DT_PROD; return DT_OK; }
    return dt_error(DT_ERR_INVALID, "unknown reduction '%s': expected sum, avg, min, max or prod", s);
}

/* ---- fingerprints ------------------------------------------------------------------- */

/* The calls that are not collectives; a collective's name is its row's (coll.h). */
static const char *kind_name(unsigned k) {
    const dt_coll_row *row = dt_coll_get((int)k);
    if (row) return row->name;
    switch (k) {
    case DT_CALL_P2P:   return "send/recv";
    case DT_CALL_SPLIT: return "comm_split";
    case DT_CALL_INIT:  return "init";
    }
    return "unknown call";
}

dt_fp dt_call_fp(const dt_call *call) {
    const dt_coll_row *row = dt_coll_get(call->kind);
    int arg = call->kind == DT_CALL_P2P ? call->tag : call->root;
    unsigned op = row && (row->flags & DT_COLL_REDOP) ? (unsigned)call->op : 0xffu;
    dt_fp fp;
    fp.a = (uint64_t)(call->kind & 0xff) | ((uint64_t)(call->dtype & 0xff) << 8) | ((uint64_t)(op & 0xff) << 16) |
           ((uint64_t)(uint32_t)arg << 32);
    fp.b = call->count;
    return fp;
}

/* "all_reduce (f32, 1048576 elems, sum)": a collective as its flags say (per rank, the
 * operator, the root), a send or recv with its tag; other calls by name. */
static const char *describe(unsigned kind, unsigned dtype, unsigned op, int arg, uint64_t count, const char *p2p,
                            char *buf, size_t n) {
    const char *t = dt_dtype_name((dt_dtype)dtype), *o = dt_redop_name((dt_redop)op);
    unsigned long long cnt = (unsigned long long)count;
    const dt_coll_row *row = dt_coll_get((int)kind);
    if (row && !(row->flags & DT_COLL_NO_DATA)) {
        unsigned f = row->flags;
        char root[32] = "";
        if (f & DT_COLL_ROOT) snprintf(root, sizeof root, ", root %d", arg);
        snprintf(buf, n, "%s (%s, %llu elems%s%s%s%s)", row->name, t, cnt, f & DT_COLL_PER_RANK ? " per rank" : "",
                 f & DT_COLL_REDOP ? ", " : "", f & DT_COLL_REDOP ? o : "", root);
    } else if (kind == DT_CALL_P2P) {
        snprintf(buf, n, "%s (%s, %llu elems, tag %d)", p2p, t, cnt, arg);
    } else {
        snprintf(buf, n, "%s", kind_name(kind));
    }
    return buf;
}

const char *dt_fp_describe(dt_fp fp, char *buf, size_t n) {
    return describe((unsigned)(fp.a & 0xff), (unsigned)((fp.a >> 8) & 0xff), (unsigned)((fp.a >> 16) & 0xff),
                    (int)(uint32_t)(fp.a >> 32), fp.b, "send", buf, n);
}

void dt_call_describe(dt_call *call) {
    describe(call->kind, call->dtype, call->op, call->kind == DT_CALL_P2P ? call->tag : call->root, call->count,
             call->is_send ? "send" : "recv", call->desc, sizeof call->desc);
}

/* ---- options and init ------------------------------------------------------------- */

void dt_comm_opts_default(dt_comm_opts *o) {
    o->backend = NULL;
    o->init_method = NULL;
    o->rank = -1;
    o->size = -1;
    o->timeout_s = 0;
    o->job_id = NULL;
    o->deterministic = -1;
    o->secure = NULL;
}

double dt_comm_timeout(const dt_comm *c) { return c->timeout_s; }

const char *dt_comm_secure(const dt_comm *c) { return c->secure_desc[0] ? c->secure_desc : "off"; }

static dt_status env_timeout(double *out) {
    const char *v = getenv("DT_TIMEOUT");
    *out = 600;
    if (!v || !*v) return DT_OK;
    char *end = NULL;
    errno = 0;
    double t = strtod(v, &end);
    if (errno || end == v || *end || !(t > 0))
        return dt_error(DT_ERR_INVALID, "DT_TIMEOUT='%s': expected a positive number of seconds", v);
    *out = t;
    return DT_OK;
}

static const dt_backend *find_backend(const char *name) {
    if (strcmp(name, "tcp") == 0) return &dt_backend_tcp;
#ifdef DT_HAVE_MPI
    if (strcmp(name, "mpi") == 0) return &dt_backend_mpi;
#endif
#ifdef DT_HAVE_NCCL
    if (strcmp(name, "nccl") == 0) return &dt_backend_nccl;
#endif
    return NULL;
}

static void free_comm(dt_comm *c) {
    if (!c) return;
    for (int i = 0; c->hosts && i < c->size; i++) free(c->hosts[i]);
    free(c->hosts);
    free(c->pids);
    free(c->parent_ranks);
    if (c->family) {
        pthread_mutex_lock(&c->family->lock);
        int last = --c->family->refs == 0;
        pthread_mutex_unlock(&c->family->lock);
        if (last) {
            pthread_mutex_destroy(&c->family->lock);
            free(c->family);
        }
    }
    free(c);
}

dt_status dt_comm_init(const dt_comm_opts *opts, dt_comm **out) {
    if (!out) return dt_error(DT_ERR_INVALID, "dt_comm_init: out is NULL");
    *out = NULL;
    dt_comm_opts def;
    if (!opts) { dt_comm_opts_default(&def); opts = &def; }
    const char *bname = opts->backend;
    if (!bname || !*bname) bname = getenv("DT_BACKEND");
    if (!bname || !*bname) bname = "tcp";
    const dt_backend *b = find_backend(bname);
    /* errors before the backend knows the rank still name it, when the launcher told */
    dt_launch_env env;
    int rank = opts->rank;
    if (rank < 0 && dt_launch_env_discover(&env) == DT_OK) rank = env.rank;
    if (!b) {
        char pre[32] = "";
        if (rank >= 0) snprintf(pre, sizeof pre, "rank %d: ", rank);
        int known = !strcmp(bname, "mpi") || !strcmp(bname, "nccl");
        if (known)
            return dt_error(DT_ERR_UNSUPPORTED, "%sbackend '%s' is not built in (reconfigure with --with-%s)",
                            pre, bname, bname);
        return dt_error(DT_ERR_INVALID, "%sunknown backend '%s': expected tcp, mpi or nccl", pre, bname);
    }
    dt_comm *c = calloc(1, sizeof *c);
    if (!c || !(c->family = calloc(1, sizeof *c->family))) {
        free(c);
        return dt_error(DT_ERR_NOMEM, "out of memory");
    }
    pthread_mutex_init(&c->family->lock, NULL);
    c->family->refs = 1;
    c->family->next_ctx = 1;
    c->rank = -1;
    c->backend = b;
    dt_status s = DT_OK;
    if (opts->timeout_s > 0) c->timeout_s = opts->timeout_s;
    else s = env_timeout(&c->timeout_s);
    if (s == DT_OK) {
        if (opts->job_id) snprintf(c->job_id, sizeof c->job_id, "%s", opts->job_id);
        if (strlen(opts->job_id ? opts->job_id : "") >= sizeof c->job_id)
            s = dt_error(DT_ERR_INVALID, "job id is longer than %zu bytes", sizeof c->job_id - 1);
    }
    if (s == DT_OK) {
        const char *d = getenv("DT_DETERMINISTIC");
        c->deterministic = opts->deterministic >= 0 ? opts->deterministic : (d && *d && strcmp(d, "0") != 0);
        const char *sec = opts->secure && *opts->secure ? opts->secure : getenv("DT_SECURE");
        s = dt_seal_parse(sec, &c->secure);
        if (s == DT_OK && c->secure != DT_SEAL_OFF && strcmp(b->name, "tcp") != 0)
            s = dt_error(DT_ERR_UNSUPPORTED, "secure transport (%s) seals the tcp backend's traffic only; the %s "
                         "backend's cannot be: use --backend tcp, or secure transport off", dt_seal_name(c->secure),
                         b->name);
    }
    if (s == DT_OK) {
        s = b->init(c, opts);
    }
    if (s != DT_OK) {
        if (c->rank >= 0 || rank >= 0) dt_error_wrap(s, "rank %d: ", c->rank >= 0 ? c->rank : rank);
        free_comm(c);
        return s;
    }
    *out = c;
    return DT_OK;
}

int         dt_comm_rank(const dt_comm *c)       { return c->rank; }
int         dt_comm_size(const dt_comm *c)       { return c->size; }
int         dt_comm_local_rank(const dt_comm *c) { return c->local_rank; }
int         dt_comm_local_size(const dt_comm *c) { return c->local_size; }
int         dt_comm_node_rank(const dt_comm *c)  { return c->node_rank; }
const char *dt_comm_backend(const dt_comm *c)    { return c->backend->name; }
const char *dt_comm_rendezvous(const dt_comm *c) { return c ? c->rendezvous : ""; }
const char *dt_comm_library(const dt_comm *c, char *buf, size_t n) {
    if (!buf || !n) return buf;
    buf[0] = 0;
    if (c && c->backend->library) c->backend->library(buf, n);
    return buf;
}
int         dt_comm_device_buffers(const dt_comm *c) { return c && c->backend->device_buffers; }
const char *dt_comm_host(const dt_comm *c, int r) {
    return c && r >= 0 && r < c->size && c->hosts ? c->hosts[r] : NULL;
}

dt_status dt_comm_set_timeout(dt_comm *c, double s) {
    if (!c) return dt_error(DT_ERR_INVALID, "dt_comm_set_timeout: communicator is NULL");
    if (!(s > 0)) return dt_error(DT_ERR_INVALID, "rank %d: timeout must be positive, got %g", c->rank, s);
    c->timeout_s = s;
    return DT_OK;
}

const char *dt_comm_peer_name(const dt_comm *c, int r, char *buf, size_t n) {
    const char *h = c->hosts && r >= 0 && r < c->size && c->hosts[r] ? c->hosts[r] : "?";
    if (c->pids && r >= 0 && r < c->size && c->pids[r]) snprintf(buf, n, "%s:pid %d", h, c->pids[r]);
    else snprintf(buf, n, "%s", h);
    return buf;
}

/* ---- operations: validation, dispatch, async --------------------------------------------- */

typedef struct {
    dt_call     call;
    const void *send;
    void       *recv;
    void       *token;      /* async: what backend->queued left */
} op_t;

struct dt_work {
    op_t       op;
    dt_comm   *c;
    dt_status  status;
    _Atomic int done;         /* set last, with release order: a done handle never touches c */
    char       msg[1024];
    dt_work   *next;
};

struct dt_async {
    pthread_t       th;
    pthread_mutex_t mu;
    pthread_cond_t  cv;       /* queue changed / work finished */
    dt_work        *head, *tail;
    int             pending;  /* queued or running */
    int             stop;
};

/* The backend's member for collective `kind` (NULL: it has none, or kind is no collective). */
typedef dt_status (*coll_fn)(dt_comm *c, const dt_call *call, const void *send, void *recv);
static coll_fn backend_coll(const dt_backend *b, int kind) {
    switch (kind) {
#define BACKEND_CASE_(ID, id, name, flags) case DT_CALL_##ID: return b->id;
    DT_COLLECTIVES(BACKEND_CASE_)
#undef BACKEND_CASE_
    }
    return NULL;
}

static dt_status exec(dt_comm *c, const op_t *o) {
    const dt_backend *b = c->backend;
    const dt_p2p *p = &c->p2p;
    const dt_call *k = &o->call;
    int have_p2p = p->xfer != NULL;
    if (k->kind == DT_CALL_P2P) {
        if (k->is_send && b->send) return b->send(c, k, o->send);
        if (!k->is_send && b->recv) return b->recv(c, k, o->recv);
        if (have_p2p) {
            size_t bytes = k->count * dt_dtype_size(k->dtype);
            dt_xfer x = { .dst = k->is_send ? k->root : -1, .sbuf = o->send, .sbytes = k->is_send ? bytes : 0,
                          .src = k->is_send ? -1 : k->root, .rbuf = o->recv, .rbytes = k->is_send ? 0 : bytes };
            return p->xfer(p->ctx, &x, k);
        }
    } else {
        /* a split agrees on the groups with an all_gather (the call keeps its own kind) */
        int kind = k->kind == DT_CALL_SPLIT ? DT_CALL_ALLGATHER : (int)k->kind;
        coll_fn fn = backend_coll(b, kind);
        if (fn) return fn(c, k, o->send, o->recv);
        dt_algo_fn algo = dt_algo_of(kind);
        if (algo && have_p2p) return algo(p, k, o->send, o->recv);
    }
    return dt_error(DT_ERR_UNSUPPORTED, "backend %s cannot do %s", b->name, k->desc);
}

/* --trace: the current operation's waits for its peers on this thread (a few peers
 * each: a ring's neighbours, halving's partners; waits for more are in the total). */
#define WAIT_PEERS 16
static _Thread_local struct {
    int    n, peer[WAIT_PEERS];
    double s[WAIT_PEERS], total;
} t_wait;

void dt_comm_wait_note(int peer, double since) {
    if (!dt_trace_on()) return;
    double s = dt_now() - since;
    t_wait.total += s;
    int i = 0;
    while (i < t_wait.n && t_wait.peer[i] != peer) i++;
    if (i == WAIT_PEERS) return;
    if (i == t_wait.n) {
        t_wait.peer[t_wait.n++] = peer;
        t_wait.s[i] = 0.0;
    }
    t_wait.s[i] += s;
}

/* The span of an operation that ran from t0 until now, named by its kind (the first
 * word of its description: "all_reduce", "send", ...), with its waits. */
static void trace_op(const op_t *o, double t0) {
    char kind[32];
    size_t n = strcspn(o->call.desc, " ");
    if (n >= sizeof kind) n = sizeof kind - 1;
    memcpy(kind, o->call.desc, n);
    kind[n] = '\0';
    int most = -1;
    for (int i = 0; i < t_wait.n; i++)
        if (most < 0 || t_wait.s[i] > t_wait.s[most]) most = i;
    dt_trace_span_wait(kind, "comm", t0, dt_now(), o->call.desc, t_wait.total, most < 0 ? -1 : t_wait.peer[most]);
}

/* Run one operation now (the caller has ordered it after earlier async work). */
static dt_status run(dt_comm *c, const op_t *o) {
    pthread_mutex_lock(&c->family->lock);
    dt_status s;
    if (c->broken) {
        s = dt_error(DT_ERR_PEER, "%s", c->broken_msg);
    } else {
        c->op_token = o->token;
        double t0 = dt_trace_on() ? dt_now() : 0.0;
        if (t0 > 0.0) memset(&t_wait, 0, sizeof t_wait);
        s = exec(c, o);
        if (t0 > 0.0) trace_op(o, t0);
        c->op_token = NULL;
        if (s != DT_OK) {
            dt_error_wrap(s, "rank %d: ", c->rank);
            if (s == DT_ERR_PEER || s == DT_ERR_TIMEOUT || s == DT_ERR_MISMATCH || s == DT_ERR_IO) {
                c->broken = 1;
                snprintf(c->broken_msg, sizeof c->broken_msg, "%s", dt_last_error());
            }
        }
    }
    pthread_mutex_unlock(&c->family->lock);
    return s;
}

_Thread_local int dt_comm_on_worker;

static void *worker_main(void *arg) {
    dt_comm *c = arg;
    dt_comm_on_worker = 1;
    dt_trace_thread("comm");
    dt_async *a = c->async;
    pthread_mutex_lock(&a->mu);
    for (;;) {
        while (!a->head && !a->stop) pthread_cond_wait(&a->cv, &a->mu);
        if (!a->head) break;
        dt_work *w = a->head;
        pthread_mutex_unlock(&a->mu);
        dt_error_clear();
        dt_status s = run(c, &w->op);
        if (w->op.token && c->backend->dequeued) c->backend->dequeued(c, w->op.token);
        pthread_mutex_lock(&a->mu);
        w->status = s;
        snprintf(w->msg, sizeof w->msg, "%s", s == DT_OK ? "" : dt_last_error());
        a->head = w->next;
        if (!a->head) a->tail = NULL;
        atomic_store_explicit(&w->done, 1, memory_order_release);
        a->pending--;
        pthread_cond_broadcast(&a->cv);
    }
    pthread_mutex_unlock(&a->mu);
    return NULL;
}

static dt_status async_start(dt_comm *c) {
    if (c->async) return DT_OK;
    dt_async *a = calloc(1, sizeof *a);
    if (!a) return dt_error(DT_ERR_NOMEM, "rank %d: out of memory", c->rank);
    pthread_mutex_init(&a->mu, NULL);
    pthread_cond_init(&a->cv, NULL);
    c->async = a;
    if (pthread_create(&a->th, NULL, worker_main, c) != 0) {
        c->async = NULL;
        pthread_mutex_destroy(&a->mu);
        pthread_cond_destroy(&a->cv);
        free(a);
        return dt_error(DT_ERR_IO, "rank %d: cannot start the communication thread", c->rank);
    }
    return DT_OK;
}

/* Wait until every queued operation has run. */
static void drain(dt_comm *c) {
    dt_async *a = c->async;
    if (!a) return;
    pthread_mutex_lock(&a->mu);
    while (a->pending > 0) pthread_cond_wait(&a->cv, &a->mu);
    pthread_mutex_unlock(&a->mu);
}

/* Blocking (w == NULL): drain, then run here. Async: queue for the worker. */
static dt_status submit(dt_comm *c, const op_t *o, dt_work **w) {
    if (!w) {
        drain(c);
        return run(c, o);
    }
    *w = NULL;
    DT_TRY(async_start(c));
    dt_work *wk = calloc(1, sizeof *wk);
    if (!wk) return dt_error(DT_ERR_NOMEM, "rank %d: out of memory", c->rank);
    wk->op = *o;
    dt_status s = c->backend->queued ? c->backend->queued(c, &o->call, o->send, o->recv, &wk->op.token) : DT_OK;
    if (s != DT_OK) {
        free(wk);
        return dt_error_wrap(s, "rank %d: ", c->rank);
    }
    wk->c = c;
    dt_async *a = c->async;
    pthread_mutex_lock(&a->mu);
    if (a->tail) a->tail->next = wk; else a->head = wk;
    a->tail = wk;
    a->pending++;
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->mu);
    *w = wk;
    return DT_OK;
}

dt_status dt_work_wait(dt_work *w) {
    if (!w) return dt_error(DT_ERR_INVALID, "dt_work_wait: work handle is NULL");
    if (!atomic_load_explicit(&w->done, memory_order_acquire)) {
        dt_async *a = w->c->async;
        pthread_mutex_lock(&a->mu);
        while (!w->done) pthread_cond_wait(&a->cv, &a->mu);
        pthread_mutex_unlock(&a->mu);
    }
    dt_status s = w->status;
    if (s != DT_OK) dt_error(s, "%s", w->msg);
    free(w);
    return s;
}

int dt_work_test(dt_work *w) {
    if (!w) return 1;
    return atomic_load_explicit(&w->done, memory_order_acquire);
}

/* Common checks; fills the call and takes a sequence number. */
static dt_status prep(dt_comm *c, dt_call_kind kind, dt_dtype t, dt_redop op, size_t count, size_t mult,
                      int root, op_t *o, const char *what) {
    const dt_coll_row *row = dt_coll_get(kind);
    unsigned f = row ? row->flags : 0;
    if (!c) return dt_error(DT_ERR_INVALID, "%s: communicator is NULL", what);
    if (!dtype_ok(t))
        return dt_error(DT_ERR_INVALID, "rank %d: %s: element type %s (%d) is not one of the collectives' "
                        "(f32, f64, f16, bf16, i32, i64, u8)", c->rank, what, dt_dtype_name(t), (int)t);
    if ((f & DT_COLL_REDOP) && !redop_ok(op))
        return dt_error(DT_ERR_INVALID, "rank %d: %s: invalid reduction operator %d", c->rank, what, (int)op);
    size_t es = dt_dtype_size(t);
    if (count > SIZE_MAX / es / (mult ? mult : 1) || count > (size_t)INT64_MAX / es)
        return dt_error(DT_ERR_INVALID, "rank %d: %s: count %zu overflows the size of a buffer", c->rank, what, count);
    if ((f & DT_COLL_ROOT) && (root < 0 || root >= c->size))
        return dt_error(DT_ERR_INVALID, "rank %d: %s: root %d is out of range (world size %d)", c->rank, what, root, c->size);
    memset(o, 0, sizeof *o);
    o->call.kind = kind;
    o->call.dtype = t;
    o->call.op = op;
    o->call.count = count;
    o->call.root = root;
    o->call.ctx = c->ctx;
    if (kind != DT_CALL_P2P) o->call.seq = ++c->seq;
    return DT_OK;
}

static dt_status null_buf(dt_comm *c, const char *what, const char *which, size_t count) {
    return dt_error(DT_ERR_INVALID, "rank %d: %s: %s buffer is NULL with count %zu", c->rank, what, which, count);
}

dt_status dt_coll_run(dt_comm *c, dt_call_kind kind, const void *send, void *recv, size_t count, dt_dtype t,
                      dt_redop op, int root, dt_work **w) {
    const dt_coll_row *row = dt_coll_get(kind);
    if (!row) return dt_error(DT_ERR_INTERNAL, "dt_coll_run: %d is not a collective", (int)kind);
    const char *what = row->name;
    unsigned f = row->flags;
    if (!(f & DT_COLL_REDOP)) op = DT_SUM;
    if (!(f & DT_COLL_ROOT)) root = -1;
    if (f & DT_COLL_ONE_BUF) send = NULL;
    if (f & DT_COLL_NO_DATA) { send = NULL; recv = NULL; count = 0; t = DT_U8; }
    if (c && count) {
        if (f & DT_COLL_ONE_BUF) {
            if (!recv) return null_buf(c, what, "data", count);
        } else if (!send) {
            return null_buf(c, what, "send", count);
        } else if (!recv && (!(f & DT_COLL_ROOT_RECV) || c->rank == root)) {
            return null_buf(c, what, f & DT_COLL_ROOT_RECV ? "recv (on the root)" : "recv", count);
        }
    }
    op_t o;
    DT_TRY(prep(c, kind, t, op, count, (f & DT_COLL_PER_RANK) && c ? (size_t)c->size : 1, root, &o, what));
    o.send = send;
    o.recv = recv;
    dt_call_describe(&o.call);
    return submit(c, &o, w);
}

/* The public functions, one per collective of the list (and _async forms for four). */
_Static_assert(DT_COLL_COUNT == 6, "a collective added to coll.h needs its public functions here and in comm.h");

dt_status dt_allreduce(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t, dt_redop op) {
    return dt_coll_run(c, DT_CALL_ALLREDUCE, send, recv, count, t, op, -1, NULL);
}
dt_status dt_broadcast(dt_comm *c, void *buf, size_t count, dt_dtype t, int root) {
    return dt_coll_run(c, DT_CALL_BROADCAST, NULL, buf, count, t, DT_SUM, root, NULL);
}
dt_status dt_allgather(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t) {
    return dt_coll_run(c, DT_CALL_ALLGATHER, send, recv, count, t, DT_SUM, -1, NULL);
}
dt_status dt_reduce_scatter(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t, dt_redop op) {
    return dt_coll_run(c, DT_CALL_REDUCE_SCATTER, send, recv, count, t, op, -1, NULL);
}
dt_status dt_reduce(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t, dt_redop op, int root) {
    return dt_coll_run(c, DT_CALL_REDUCE, send, recv, count, t, op, root, NULL);
}
dt_status dt_barrier(dt_comm *c) {
    return dt_coll_run(c, DT_CALL_BARRIER, NULL, NULL, 0, DT_U8, DT_SUM, -1, NULL);
}

/* An async form: the work handle pointer is checked first, then the call as the blocking one. */
static dt_status coll_async(dt_comm *c, dt_call_kind kind, const void *send, void *recv, size_t count, dt_dtype t,
                            dt_redop op, int root, dt_work **w) {
    if (!w)
        return dt_error(DT_ERR_INVALID, "rank %d: %s_async: work handle pointer is NULL", c ? c->rank : -1,
                        dt_coll_get(kind)->name);
    return dt_coll_run(c, kind, send, recv, count, t, op, root, w);
}
dt_status dt_allreduce_async(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t, dt_redop op, dt_work **w) {
    return coll_async(c, DT_CALL_ALLREDUCE, send, recv, count, t, op, -1, w);
}
dt_status dt_broadcast_async(dt_comm *c, void *buf, size_t count, dt_dtype t, int root, dt_work **w) {
    return coll_async(c, DT_CALL_BROADCAST, NULL, buf, count, t, DT_SUM, root, w);
}
dt_status dt_allgather_async(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t, dt_work **w) {
    return coll_async(c, DT_CALL_ALLGATHER, send, recv, count, t, DT_SUM, -1, w);
}
dt_status dt_reduce_scatter_async(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t, dt_redop op,
                                  dt_work **w) {
    return coll_async(c, DT_CALL_REDUCE_SCATTER, send, recv, count, t, op, -1, w);
}

static dt_status p2p_op(dt_comm *c, const void *sbuf, void *rbuf, size_t count, dt_dtype t, int peer, int tag, int is_send) {
    const char *what = is_send ? "send" : "recv";
    op_t o;
    if (c && count && !(is_send ? sbuf : (const void *)rbuf)) return null_buf(c, what, "data", count);
    DT_TRY(prep(c, DT_CALL_P2P, t, DT_SUM, count, 1, peer, &o, what));
    if (peer < 0 || peer >= c->size || peer == c->rank)
        return dt_error(DT_ERR_INVALID, "rank %d: %s: peer %d is out of range or this rank (world size %d)",
                        c->rank, what, peer, c->size);
    if (tag < 0) return dt_error(DT_ERR_INVALID, "rank %d: %s: tag %d is negative", c->rank, what, tag);
    o.call.tag = tag;
    o.call.is_send = is_send;
    o.send = sbuf;
    o.recv = rbuf;
    dt_call_describe(&o.call);
    return submit(c, &o, NULL);
}

dt_status dt_send(dt_comm *c, const void *buf, size_t count, dt_dtype t, int peer, int tag) {
    return p2p_op(c, buf, NULL, count, t, peer, tag, 1);
}
dt_status dt_recv(dt_comm *c, void *buf, size_t count, dt_dtype t, int peer, int tag) {
    return p2p_op(c, NULL, buf, count, t, peer, tag, 0);
}

/* ---- split ------------------------------------------------------------------------------ */

dt_status dt_comm_split(dt_comm *c, int color, int key, dt_comm **out) {
    if (!out) return dt_error(DT_ERR_INVALID, "dt_comm_split: out is NULL");
    *out = NULL;
    if (!c) return dt_error(DT_ERR_INVALID, "dt_comm_split: communicator is NULL");
    int n = c->size;
    int32_t mine[2] = { color < 0 ? -1 : color, key }, *all = malloc(sizeof(int32_t) * 2 * (size_t)n);
    if (!all) return dt_error(DT_ERR_NOMEM, "rank %d: out of memory", c->rank);
    op_t o;
    dt_status s = prep(c, DT_CALL_SPLIT, DT_I32, DT_SUM, 2, (size_t)n, -1, &o, "comm_split");
    if (s != DT_OK) { free(all); return s; }
    o.send = mine;
    o.recv = all;
    dt_call_describe(&o.call);
    if ((s = submit(c, &o, NULL)) != DT_OK) { free(all); return s; }

    dt_comm *ch = NULL;
    if (color >= 0) {
        /* members ordered by (key, old rank): insertion sort, n is small */
        int *m = malloc(sizeof(int) * (size_t)n), cnt = 0;
        ch = calloc(1, sizeof *ch);
        if (!m || !ch) { free(m); free(ch); free(all); return dt_error(DT_ERR_NOMEM, "rank %d: out of memory", c->rank); }
        for (int r = 0; r < n; r++) {
            if (all[2 * r] != color) continue;
            int i = cnt++;
            while (i > 0 && all[2 * m[i - 1] + 1] > all[2 * r + 1]) { m[i] = m[i - 1]; i--; }
            m[i] = r;
        }
        ch->size = cnt;
        ch->parent_ranks = m;
        ch->hosts = calloc((size_t)cnt, sizeof *ch->hosts);
        ch->pids = calloc((size_t)cnt, sizeof *ch->pids);
        s = ch->hosts && ch->pids ? DT_OK : dt_error(DT_ERR_NOMEM, "rank %d: out of memory", c->rank);
        for (int i = 0; i < cnt && s == DT_OK; i++) {
            if (m[i] == c->rank) ch->rank = i;
            ch->hosts[i] = strdup(c->hosts && c->hosts[m[i]] ? c->hosts[m[i]] : "?");
            ch->pids[i] = c->pids ? c->pids[m[i]] : 0;
            if (!ch->hosts[i]) s = dt_error(DT_ERR_NOMEM, "rank %d: out of memory", c->rank);
        }
        /* local ranks and node index within the group, from the host names */
        for (int i = 0; s == DT_OK && i < cnt; i++) {
            int same = strcmp(ch->hosts[i], ch->hosts[ch->rank]) == 0;
            if (same && i < ch->rank) ch->local_rank++;
            if (same) ch->local_size++;
            int first = 1;
            for (int j = 0; j < i && first; j++) if (strcmp(ch->hosts[i], ch->hosts[j]) == 0) first = 0;
            if (first && i < ch->rank && !same) ch->node_rank++;
        }
        /* a context id every member derives alike: parent ctx, split number, color */
        uint64_t h = ((uint64_t)c->ctx * 0x9e3779b97f4a7c15ull) ^ (o.call.seq * 0xbf58476d1ce4e5b9ull) ^ (uint64_t)color;
        h ^= h >> 31;
        ch->ctx = (uint32_t)(h ^ (h >> 32)) | 1u;
        ch->timeout_s = c->timeout_s;
        ch->deterministic = c->deterministic;
        memcpy(ch->job_id, c->job_id, sizeof ch->job_id);
        memcpy(ch->rendezvous, c->rendezvous, sizeof ch->rendezvous);
        ch->backend = c->backend;
        ch->parent = c;
        ch->family = c->family;
        pthread_mutex_lock(&c->family->lock);
        c->family->refs++;
        pthread_mutex_unlock(&c->family->lock);
    }
    free(all);
    if (s == DT_OK) {
        pthread_mutex_lock(&c->family->lock);
        s = c->backend->split ? c->backend->split(c, &o.call, color, key, ch)
                              : dt_error(DT_ERR_UNSUPPORTED, "backend %s cannot split communicators", c->backend->name);
        pthread_mutex_unlock(&c->family->lock);
        if (s != DT_OK) dt_error_wrap(s, "rank %d: comm_split: ", c->rank);
    }
    if (s != DT_OK) { free_comm(ch); return s; }
    *out = ch;
    return DT_OK;
}

/* ---- destroy --------------------------------------------------------------------------- */

void dt_comm_destroy(dt_comm *c) {
    if (!c) return;
    dt_async *a = c->async;
    if (a) {
        drain(c);
        pthread_mutex_lock(&a->mu);
        a->stop = 1;
        pthread_cond_broadcast(&a->cv);
        pthread_mutex_unlock(&a->mu);
        pthread_join(a->th, NULL);
        pthread_mutex_destroy(&a->mu);
        pthread_cond_destroy(&a->cv);
        free(a);
    }
    pthread_mutex_lock(&c->family->lock);
    if (c->parent) { if (c->backend->split_destroy) c->backend->split_destroy(c); }
    else if (c->backend->destroy) c->backend->destroy(c);
    pthread_mutex_unlock(&c->family->lock);
    free_comm(c);
}
