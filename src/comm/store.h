/*
 * store.h: the rendezvous key-value store (served by rank 0, used by every rank at init).
 *
 * A tiny binary protocol over TCP. Every connection first proves the job secret (auth.h,
 * through a gate: unauthenticated connections are handled concurrently, each within
 * about 2 s, so a flood cannot shut a rank out); nothing else is read before that.
 * Every request then carries a magic number, the protocol version and the job id; the
 * server closes connections that send anything else. Length fields are bounded (keys
 * 4 KiB, values 64 MiB) before anything is allocated.
 *
 *   set(key, value)             store (replace)
 *   get(key, timeout)           wait until the key exists, return its value
 *   wait(keys, timeout)         wait until every key exists
 *   add(key, delta) -> new      atomic counter (the value is a decimal integer)
 *   del(key)                    remove
 */
#ifndef DT_STORE_H
#define DT_STORE_H

#include <stddef.h>
#include <stdint.h>
#include "status.h"
#include "auth.h"

typedef struct dt_store_server dt_store_server;
typedef struct dt_store dt_store;

/* Serve on addr:port (addr NULL: all interfaces; port 0: a free port) for the job of
 * auth (copied). */
dt_status dt_store_server_start(const char *addr, int port, const dt_auth *auth, dt_store_server **out);
int       dt_store_server_port (const dt_store_server *s);
/* What the server's gate refused so far ("" or "; meanwhile N unauthenticated
 * connections from HOST were dropped"), for error messages. */
void      dt_store_server_report(dt_store_server *s, char *buf, size_t n);
/* Testing (the fuzz target): serve the requests on fd, an already authenticated
 * stream, in the calling thread until it ends or breaks the protocol; gets and waits
 * block at most max_wait seconds. */
void      dt_store_serve_stream(dt_store_server *s, int fd, double max_wait);
/* Stop serving, close every client, join the threads. NULL is fine. */
void      dt_store_server_stop (dt_store_server *s);

/* Connect and authenticate (retrying refused, reset and timed-out attempts until
 * timeout_s: a server busy with a flood sheds connections). A server that proves
 * another secret or job is an error at once, and so is a full one (DT_ERR_PEER, "store
 * full: N clients connected"). */
dt_status dt_store_connect(const char *host, int port, const dt_auth *auth, double timeout_s, dt_store **out);
void      dt_store_close  (dt_store *st);
/* How long a round trip may take beyond its own wait (default 30 s): a store
 * host that stopped answering is reported after this (the comm layer sets
 * DT_TIMEOUT, and less while diagnosing a timeout). */
void      dt_store_set_slack(dt_store *st, double seconds);
double    dt_store_slack    (dt_store *st);
dt_status dt_store_set    (dt_store *st, const char *key, const void *val, size_t n);
/* *val is malloc'd (with a NUL after the n bytes); DT_ERR_TIMEOUT when the key never came. */
dt_status dt_store_get    (dt_store *st, const char *key, void **val, size_t *n, double timeout_s);
dt_status dt_store_wait   (dt_store *st, const char *const *keys, size_t nkeys, double timeout_s);
dt_status dt_store_add    (dt_store *st, const char *key, int64_t delta, int64_t *result);
dt_status dt_store_delete (dt_store *st, const char *key);

#define DT_STORE_MAX_KEY   4096u
#define DT_STORE_MAX_VALUE (64u << 20)
#define DT_STORE_MAX_JOB   127u
#define DT_STORE_MAX_CLIENTS 4096   /* connections one store serves at once (one per rank) */

#endif /* DT_STORE_H */
