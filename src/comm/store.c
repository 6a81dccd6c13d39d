/*
 * store.c: the rendezvous store — a server thread on rank 0 and a client per rank.
 *
 * Wire format (little-endian):
 *   request  = magic u32 'DTST', version u32, op u32, job_len u32, key_len u32,
 *              val_len u32, timeout_ms u32, then job id, key, value bytes
 *   response = magic u32, status u32, len u32, then len bytes (value, or error text)
 * Connections come through a gate (gate.h): only authenticated ones reach the server.
 * It gives each a thread with a small stack (one per rank); a request that fails the
 * magic/version/length checks closes that connection only. Waits for keys sleep on one
 * condition variable that every set broadcasts.
 */
#include "config.h"
#include "store.h"
#include "sock.h"
#include "comm_impl.h"
#include "gate.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define STORE_MAGIC   0x54535444u   /* "DTST" */
#define STORE_VERSION 1u
#define REQ_BYTES     28
#define RESP_BYTES    12
#define CLIENT_STACK  (256u << 10)

enum { OP_PING = 1, OP_SET, OP_GET, OP_WAIT, OP_ADD, OP_DEL };
enum { ST_OK = 0, ST_TIMEOUT, ST_JOB, ST_BAD, ST_NOTFOUND, ST_FULL };

/* ---- server ----------------------------------------------------------------------- */

typedef struct { char *key; char *val; size_t n; } kv;

typedef struct {
    int fd;
    pthread_t th;
    int used, done;
    struct dt_store_server *srv;
} client;

struct dt_store_server {
    int lfd, port, wake[2];
    dt_auth auth;           /* its job id is the store's */
    dt_gate *gate;
    double max_wait;        /* testing: caps how long a get or wait may block (0: no cap) */
    pthread_t acceptor;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stopping;
    kv *kvs; size_t nkv, capkv;
    client clients[DT_STORE_MAX_CLIENTS];
};

static kv *kv_find(struct dt_store_server *s, const char *key) {
    for (size_t i = 0; i < s->nkv; i++) if (strcmp(s->kvs[i].key, key) == 0) return &s->kvs[i];
    return NULL;
}

/* Store a copy of (key, val); caller holds mu. Returns 0 on allocation failure. */
static int kv_set(struct dt_store_server *s, const char *key, const char *val, size_t n) {
    char *v = malloc(n + 1);
    if (!v) return 0;
    memcpy(v, val, n);
    v[n] = '\0';
    kv *e = kv_find(s, key);
    if (e) { free(e->val); e->val = v; e->n = n; return 1; }
    if (s->nkv == s->capkv) {
        size_t cap = s->capkv ? 2 * s->capkv : 64;
        kv *nk = realloc(s->kvs, cap * sizeof *nk);
        if (!nk) { free(v); return 0; }
        s->kvs = nk; s->capkv = cap;
    }
    char *k = strdup(key);
    if (!k) { free(v); return 0; }
    s->kvs[s->nkv++] = (kv){ k, v, n };
    return 1;
}

static int respond(int fd, unsigned status, const void *data, size_t n) {
    unsigned char h[RESP_BYTES];
    dt_put32(h, STORE_MAGIC); dt_put32(h + 4, status); dt_put32(h + 8, (unsigned)n);
    double dl = dt_now() + 30;
    if (dt_sock_write_all(fd, h, sizeof h, dl) != DT_OK) return 0;
    if (n && dt_sock_write_all(fd, data, n, dl) != DT_OK) return 0;
    return 1;
}

/* Wait (mu held) until key exists or the deadline passes. */
static kv *wait_key(struct dt_store_server *s, const char *key, double timeout_s) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    double t = (double)ts.tv_sec + 1e-9 * ts.tv_nsec + timeout_s;
    ts.tv_sec = (time_t)t;
    ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
    kv *e;
    while (!(e = kv_find(s, key)) && !s->stopping) {
        if (timeout_s <= 0) break;
        if (pthread_cond_timedwait(&s->cv, &s->mu, &ts) == ETIMEDOUT) { e = kv_find(s, key); break; }
    }
    return e;
}

/* Serve one request. Returns 0 when the connection must be closed. */
static int serve_one(struct dt_store_server *s, int fd) {
    unsigned char h[REQ_BYTES];
    /* the first byte may take forever (an idle rank); the rest of a request may not */
    if (dt_sock_read_all(fd, h, 1, 1e18) != DT_OK) return 0;
    if (dt_sock_read_all(fd, h + 1, 3, dt_now() + 10) != DT_OK) return 0;
    if (dt_get32(h) != STORE_MAGIC) return 0;                /* not our protocol: hang up at once */
    if (dt_sock_read_all(fd, h + 4, REQ_BYTES - 4, dt_now() + 10) != DT_OK) return 0;
    unsigned ver = dt_get32(h + 4), op = dt_get32(h + 8), jl = dt_get32(h + 12);
    unsigned kl = dt_get32(h + 16), vl = dt_get32(h + 20), tmo = dt_get32(h + 24);
    if (ver != STORE_VERSION) {
        char m[128];
        snprintf(m, sizeof m, "store protocol version %u, client speaks %u", STORE_VERSION, ver);
        respond(fd, ST_BAD, m, strlen(m));
        return 0;
    }
    if (jl > DT_STORE_MAX_JOB || kl > DT_STORE_MAX_KEY || vl > DT_STORE_MAX_VALUE || op < OP_PING || op > OP_DEL) {
        const char *m = "malformed store request (bad operation or length)";
        respond(fd, ST_BAD, m, strlen(m));
        return 0;
    }
    char job[DT_STORE_MAX_JOB + 1], *key = malloc(kl + 1), *val = malloc(vl + 1);
    int keep = 0;
    if (!key || !val) goto out;
    double dl = dt_now() + 30;
    if (dt_sock_read_all(fd, job, jl, dl) != DT_OK || dt_sock_read_all(fd, key, kl, dl) != DT_OK ||
        dt_sock_read_all(fd, val, vl, dl) != DT_OK)
        goto out;
    job[jl] = key[kl] = val[vl] = '\0';
    if (strcmp(job, s->auth.job) != 0) {
        char m[2 * DT_STORE_MAX_JOB + 64];
        snprintf(m, sizeof m, "this store serves job '%s', the request came from job '%s'", s->auth.job, job);
        respond(fd, ST_JOB, m, strlen(m));
        goto out;
    }
    pthread_mutex_lock(&s->mu);
    switch (op) {
    case OP_PING:
        pthread_mutex_unlock(&s->mu);
        keep = respond(fd, ST_OK, NULL, 0);
        break;
    case OP_SET: {
        int okay = kv_set(s, key, val, vl);
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
        keep = okay ? respond(fd, ST_OK, NULL, 0) : respond(fd, ST_BAD, "store out of memory", 19);
        break;
    }
    case OP_GET: case OP_WAIT: {
        double w = tmo / 1000.0;
        if (s->max_wait > 0 && w > s->max_wait) w = s->max_wait;
        kv *e = wait_key(s, key, w);
        if (!e) { pthread_mutex_unlock(&s->mu); keep = respond(fd, ST_TIMEOUT, NULL, 0); break; }
        if (op == OP_WAIT) { pthread_mutex_unlock(&s->mu); keep = respond(fd, ST_OK, NULL, 0); break; }
        /* copy out so the lock is not held across the write */
        size_t n = e->n;
        char *copy = malloc(n + 1);
        if (copy) memcpy(copy, e->val, n);
        pthread_mutex_unlock(&s->mu);
        keep = copy ? respond(fd, ST_OK, copy, n) : respond(fd, ST_BAD, "store out of memory", 19);
        free(copy);
        break;
    }
    case OP_ADD: {
        char *end = NULL;
        errno = 0;
        long long d = strtoll(val, &end, 10);
        if (errno || end == val || *end) {
            pthread_mutex_unlock(&s->mu);
            keep = respond(fd, ST_BAD, "add: the delta is not an integer", 32);
            break;
        }
        kv *e = kv_find(s, key);
        long long cur = e ? strtoll(e->val, NULL, 10) : 0, sum;
        if (__builtin_add_overflow(cur, d, &sum)) {
            pthread_mutex_unlock(&s->mu);
            keep = respond(fd, ST_BAD, "add: the counter would overflow", 31);
            break;
        }
        char num[32];
        int nl = snprintf(num, sizeof num, "%lld", sum);
        int okay = kv_set(s, key, num, (size_t)nl);
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
        keep = okay ? respond(fd, ST_OK, num, (size_t)nl) : respond(fd, ST_BAD, "store out of memory", 19);
        break;
    }
    case OP_DEL: {
        kv *e = kv_find(s, key);
        if (e) {
            free(e->key); free(e->val);
            *e = s->kvs[--s->nkv];
        }
        pthread_mutex_unlock(&s->mu);
        keep = respond(fd, e ? ST_OK : ST_NOTFOUND, NULL, 0);
        break;
    }
    }
out:
    free(key);
    free(val);
    return keep;
}

void dt_store_serve_stream(dt_store_server *s, int fd, double max_wait) {
    s->max_wait = max_wait;
    while (serve_one(s, fd)) {}
}

static void *client_main(void *arg) {
    client *cl = arg;
    while (serve_one(cl->srv, cl->fd)) {}
    shutdown(cl->fd, SHUT_RDWR);   /* the peer sees the hang-up now; the fd is closed when reaped */
    pthread_mutex_lock(&cl->srv->mu);
    cl->done = 1;
    pthread_mutex_unlock(&cl->srv->mu);
    return NULL;
}

/* No room for an authenticated client: it reads why in answer to its first request
 * rather than a bare hang-up. Its request is read (briefly) before the close, since
 * closing with unread bytes would send a reset that may overtake the reply. */
static void refuse_full(int fd) {
    char m[96];
    int ml = snprintf(m, sizeof m, "store full: %d clients connected (the most it serves; a rank holds one)",
                      DT_STORE_MAX_CLIENTS);
    unsigned char h[RESP_BYTES];
    dt_put32(h, STORE_MAGIC); dt_put32(h + 4, ST_FULL); dt_put32(h + 8, (unsigned)ml);
    double dl = dt_now() + 0.5;
    if (dt_sock_write_all(fd, h, sizeof h, dl) == DT_OK && dt_sock_write_all(fd, m, (size_t)ml, dl) == DT_OK) {
        shutdown(fd, SHUT_WR);
        char sink[256];
        while (dt_sock_read_all(fd, sink, 1, dl) == DT_OK) {   /* until the client hangs up */
            ssize_t r;
            do r = recv(fd, sink, sizeof sink, MSG_DONTWAIT); while (r > 0);
        }
    }
    close(fd);
}

static void *acceptor_main(void *arg) {
    struct dt_store_server *s = arg;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, CLIENT_STACK);
    for (;;) {
        int fd;
        dt_status st = dt_gate_accept(s->gate, 1e18, s->wake[0], &fd);
        if (st == DT_ERR_STOPPED) break;
        if (st != DT_OK) continue;
        pthread_mutex_lock(&s->mu);
        client *slot = NULL;
        for (int i = 0; i < DT_STORE_MAX_CLIENTS; i++) {
            client *c = &s->clients[i];
            if (c->used && c->done) {        /* reap a finished connection */
                pthread_join(c->th, NULL);
                close(c->fd);
                c->used = 0;
            }
            if (!c->used && !slot) slot = c;
        }
        if (slot) {
            *slot = (client){ .fd = fd, .used = 1, .done = 0, .srv = s };
            if (pthread_create(&slot->th, &attr, client_main, slot) != 0) { slot->used = 0; slot = NULL; }
        }
        pthread_mutex_unlock(&s->mu);
        if (!slot) refuse_full(fd);
    }
    pthread_attr_destroy(&attr);
    return NULL;
}

dt_status dt_store_server_start(const char *addr, int port, const dt_auth *auth, dt_store_server **out) {
    *out = NULL;
    struct dt_store_server *s = calloc(1, sizeof *s);
    if (!s) return dt_error(DT_ERR_NOMEM, "out of memory starting the store");
    s->auth = *auth;
    s->wake[0] = s->wake[1] = -1;
    dt_status st = dt_sock_listen(addr, port, &s->lfd, &s->port);
    if (st != DT_OK) { free(s); return dt_error_wrap(st, "store: "); }
    if ((st = dt_gate_new(&s->auth, DT_AUTH_STORE, s->lfd, &s->gate)) != DT_OK) {
        close(s->lfd); free(s);
        return st;
    }
    if (pipe2(s->wake, O_CLOEXEC) < 0) {
        int e = errno; close(s->lfd); dt_gate_free(s->gate); free(s);
        return dt_error(DT_ERR_IO, "store: pipe: %s", strerror(e));
    }
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    if (pthread_create(&s->acceptor, NULL, acceptor_main, s) != 0) {
        close(s->lfd); close(s->wake[0]); close(s->wake[1]); dt_gate_free(s->gate); free(s);
        return dt_error(DT_ERR_IO, "store: cannot start the server thread");
    }
    *out = s;
    return DT_OK;
}

int dt_store_server_port(const dt_store_server *s) { return s->port; }

void dt_store_server_report(dt_store_server *s, char *buf, size_t n) {
    if (n) buf[0] = '\0';
    if (s) dt_gate_report(s->gate, buf, n);
}

void dt_store_server_stop(dt_store_server *s) {
    if (!s) return;
    char b = 1;
    if (write(s->wake[1], &b, 1) < 0) { /* the acceptor also exits when the socket closes */ }
    pthread_join(s->acceptor, NULL);
    dt_gate_free(s->gate);
    close(s->lfd);
    pthread_mutex_lock(&s->mu);
    s->stopping = 1;
    pthread_cond_broadcast(&s->cv);
    for (int i = 0; i < DT_STORE_MAX_CLIENTS; i++)
        if (s->clients[i].used) shutdown(s->clients[i].fd, SHUT_RDWR);
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; i < DT_STORE_MAX_CLIENTS; i++) {
        if (!s->clients[i].used) continue;
        pthread_join(s->clients[i].th, NULL);
        close(s->clients[i].fd);
    }
    for (size_t i = 0; i < s->nkv; i++) { free(s->kvs[i].key); free(s->kvs[i].val); }
    free(s->kvs);
    close(s->wake[0]); close(s->wake[1]);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}

/* ---- client ---------------------------------------------------------------------- */

struct dt_store {
    int fd;
    char host[256];
    int port;
    char job[DT_STORE_MAX_JOB + 1];
    double slack;           /* seconds a round trip may take beyond its own wait */
    pthread_mutex_t mu;
};

/* One round trip. *val (if wanted) gets the malloc'd response payload. */
static dt_status request(dt_store *st, unsigned op, const char *key, const void *v, size_t vn,
                         double timeout_s, unsigned *status, char **val, size_t *n) {
    size_t kl = strlen(key), jl = strlen(st->job);
    if (kl > DT_STORE_MAX_KEY) return dt_error(DT_ERR_INVALID, "store key longer than %u bytes", DT_STORE_MAX_KEY);
    if (vn > DT_STORE_MAX_VALUE) return dt_error(DT_ERR_INVALID, "store value larger than %u bytes", DT_STORE_MAX_VALUE);
    unsigned tmo = timeout_s <= 0 ? 0 : timeout_s > 4e6 ? 4000000000u : (unsigned)(timeout_s * 1000);
    unsigned char h[REQ_BYTES];
    dt_put32(h, STORE_MAGIC); dt_put32(h + 4, STORE_VERSION); dt_put32(h + 8, op);
    dt_put32(h + 12, (unsigned)jl); dt_put32(h + 16, (unsigned)kl); dt_put32(h + 20, (unsigned)vn);
    dt_put32(h + 24, tmo);
    pthread_mutex_lock(&st->mu);
    double dl = dt_now() + (timeout_s > 0 ? timeout_s : 0) + st->slack;
    if (st->fd < 0) {
        pthread_mutex_unlock(&st->mu);
        return dt_error(DT_ERR_PEER, "store at %s:%d: the connection was dropped after an earlier failure",
                        st->host, st->port);
    }
    dt_status s;
    unsigned char r[RESP_BYTES];
    char *body = NULL;
    size_t len = 0;
    if ((s = dt_sock_write_all(st->fd, h, sizeof h, dl)) != DT_OK ||
        (s = dt_sock_write_all(st->fd, st->job, jl, dl)) != DT_OK ||
        (s = dt_sock_write_all(st->fd, key, kl, dl)) != DT_OK ||
        (s = dt_sock_write_all(st->fd, v, vn, dl)) != DT_OK ||
        (s = dt_sock_read_all(st->fd, r, sizeof r, dl)) != DT_OK)
        goto fail;
    len = dt_get32(r + 8);
    if (dt_get32(r) != STORE_MAGIC || len > DT_STORE_MAX_VALUE) {
        s = dt_error(DT_ERR_FORMAT, "the reply is not from a dtrain store");
        goto fail;
    }
    body = malloc(len + 1);
    if (!body) { s = dt_error(DT_ERR_NOMEM, "out of memory"); goto fail; }
    if ((s = dt_sock_read_all(st->fd, body, len, dl)) != DT_OK) goto fail;
    body[len] = '\0';
    pthread_mutex_unlock(&st->mu);
    *status = dt_get32(r + 4);
    if (*status == ST_FULL) {   /* it closes the connection after saying so */
        pthread_mutex_lock(&st->mu);
        if (st->fd >= 0) close(st->fd);
        st->fd = -1;
        pthread_mutex_unlock(&st->mu);
        s = dt_error(DT_ERR_PEER, "store at %s:%d refused the connection: %s", st->host, st->port, body);
        free(body);
        return s;
    }
    if (*status == ST_JOB || *status == ST_BAD) {
        s = dt_error(*status == ST_JOB ? DT_ERR_MISMATCH : DT_ERR_FORMAT, "store at %s:%d refused the request: %s",
                     st->host, st->port, body);
        free(body);
        return s;
    }
    if (val) { *val = body; *n = len; } else free(body);
    return DT_OK;
fail:
    /* the stream may hold half a request or reply: nothing after it can be trusted */
    close(st->fd);
    st->fd = -1;
    pthread_mutex_unlock(&st->mu);
    free(body);
    return dt_error_wrap(s, "store at %s:%d: ", st->host, st->port);
}

dt_status dt_store_connect(const char *host, int port, const dt_auth *auth, double timeout_s, dt_store **out) {
    *out = NULL;
    dt_store *st = calloc(1, sizeof *st);
    if (!st) return dt_error(DT_ERR_NOMEM, "out of memory");
    snprintf(st->host, sizeof st->host, "%s", host);
    st->port = port;
    st->slack = 30;
    st->fd = -1;
    snprintf(st->job, sizeof st->job, "%s", auth->job);
    pthread_mutex_init(&st->mu, NULL);
    dt_status s = dt_auth_connect(auth, host, port, DT_AUTH_STORE, dt_now() + timeout_s, &st->fd);
    if (s != DT_OK) {
        dt_error_wrap(s, "store at %s:%d: ", host, port);
        dt_store_close(st);
        return s;
    }
    unsigned status;
    s = request(st, OP_PING, "", NULL, 0, 0, &status, NULL, NULL);
    if (s != DT_OK) { dt_store_close(st); return s; }
    *out = st;
    return DT_OK;
}

void dt_store_set_slack(dt_store *st, double seconds) {
    pthread_mutex_lock(&st->mu);
    st->slack = seconds > 0 ? seconds : 0;
    pthread_mutex_unlock(&st->mu);
}

double dt_store_slack(dt_store *st) {
    pthread_mutex_lock(&st->mu);
    double v = st->slack;
    pthread_mutex_unlock(&st->mu);
    return v;
}

void dt_store_close(dt_store *st) {
    if (!st) return;
    if (st->fd >= 0) close(st->fd);
    pthread_mutex_destroy(&st->mu);
    free(st);
}

dt_status dt_store_set(dt_store *st, const char *key, const void *val, size_t n) {
    unsigned status;
    return request(st, OP_SET, key, val, n, 0, &status, NULL, NULL);
}

dt_status dt_store_get(dt_store *st, const char *key, void **val, size_t *n, double timeout_s) {
    unsigned status;
    char *v = NULL;
    size_t len = 0;
    DT_TRY(request(st, OP_GET, key, NULL, 0, timeout_s, &status, &v, &len));
    if (status != ST_OK) {
        free(v);
        return dt_error(DT_ERR_TIMEOUT, "store key '%s' did not appear within %g s", key, timeout_s);
    }
    *val = v;
    if (n) *n = len;
    return DT_OK;
}

dt_status dt_store_wait(dt_store *st, const char *const *keys, size_t nkeys, double timeout_s) {
    double dl = dt_now() + timeout_s;
    for (size_t i = 0; i < nkeys; i++) {
        unsigned status;
        double left = dl - dt_now();
        DT_TRY(request(st, OP_WAIT, keys[i], NULL, 0, left > 0 ? left : 0, &status, NULL, NULL));
        if (status != ST_OK)
            return dt_error(DT_ERR_TIMEOUT, "store key '%s' did not appear within %g s", keys[i], timeout_s);
    }
    return DT_OK;
}

dt_status dt_store_add(dt_store *st, const char *key, int64_t delta, int64_t *result) {
    char num[32], *v = NULL;
    size_t len;
    unsigned status;
    snprintf(num, sizeof num, "%" PRId64, delta);
    DT_TRY(request(st, OP_ADD, key, num, strlen(num), 0, &status, &v, &len));
    if (result) *result = strtoll(v, NULL, 10);
    free(v);
    return DT_OK;
}

dt_status dt_store_delete(dt_store *st, const char *key) {
    unsigned status;
    return request(st, OP_DEL, key, NULL, 0, 0, &status, NULL, NULL);
}
