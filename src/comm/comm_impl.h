/*
 * comm_impl.h: what a communication backend implements, and what comm.c gives it.
 *
 * comm.c does everything every backend needs once: argument validation, sequence
 * numbers, the fingerprint of each call and its human-readable form, the async worker,
 * "rank R: " prefixes on errors. A backend (tcp.c, mpi.c, nccl.c) fills a dt_backend
 * table with labelled initialisers and is handed validated calls.
 *
 * The collective algorithms are written once, in algo.c, over a point-to-point
 * primitive (dt_p2p). The tcp backend provides dt_p2p over sockets / shared memory;
 * the mpi backend in deterministic mode provides it over MPI_Sendrecv and runs the very
 * same algo.c functions, so both give bitwise the same results (docs/DESIGN.md rule 2).
 *
 * Threading: comm.c runs a backend's operations one at a time per communicator family
 * (a communicator and everything split from it share one lock, c->family), either on
 * the caller's thread (blocking calls, after pending async work has drained) or on the
 * communicator's worker thread (async calls). A backend therefore never sees two calls
 * at once on a family, and MPI_THREAD_SERIALIZED is enough.
 */
#ifndef DT_COMM_IMPL_H
#define DT_COMM_IMPL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include "clock.h"   /* dt_now(): every deadline */
#include "coll.h"    /* the collectives (DT_COLLECTIVES) and dt_call_kind */
#include "comm.h"

/* ---- one call, as validated by comm.c ------------------------------------------------ */

typedef struct {
    dt_call_kind kind;
    dt_dtype     dtype;
    dt_redop     op;        /* reductions only */
    size_t       count;     /* elements: all_reduce/broadcast/reduce: the array;
                               all_gather: per rank; reduce_scatter: per rank (recv_count);
                               p2p: the message */
    int          root;      /* broadcast/reduce root; p2p: the peer; else -1 */
    int          tag;       /* p2p only */
    int          is_send;   /* p2p only: 1 send, 0 recv */
    uint64_t     seq;       /* collective number in this communicator (1, 2, ...); p2p: 0 */
    uint32_t     ctx;       /* communicator context id (parent and split children differ) */
    char         desc[112]; /* "all_reduce (f32, 1048576 elems, sum)" */
} dt_call;

/* The fingerprint of a call as it travels in message headers: two words that decode back
 * into the call's description, so a mismatch can name what the other rank called. */
typedef struct { uint64_t a, b; } dt_fp;
dt_fp       dt_call_fp(const dt_call *call);
/* Describe a fingerprint ("broadcast (f32, 100 elems, root 0)") into buf. */
const char *dt_fp_describe(dt_fp fp, char *buf, size_t n);
/* Fill call->desc from its fields. */
void        dt_call_describe(dt_call *call);

/* ---- the point-to-point primitive the algorithms run on ------------------------------ */

/* One simultaneous exchange: send sbytes from sbuf to rank dst while receiving rbytes
 * from rank src into rbuf. dst < 0: nothing is sent; src < 0: nothing is received.
 * racc == NULL: received bytes are copied into rbuf. racc != NULL: the exchange reduces,
 * rbuf[i] = racc[i] (call->op) received[i] elementwise in call->dtype (avg reduces as
 * sum; racc may equal rbuf); a transport may combine as data arrives (pipelining).
 * scopy != NULL: the sent bytes are also copied there (overlapping neither sbuf nor
 * rbuf); a transport may do it piece by piece as it sends, while they are in cache. */
typedef struct {
    int         dst;
    const void *sbuf;
    size_t      sbytes;
    int         src;
    void       *rbuf;
    size_t      rbytes;
    const void *racc;
    void       *scopy;
} dt_xfer;

typedef struct dt_p2p {
    void     *ctx;
    int       rank, size;       /* within the communicator the algorithms run over */
    dt_status (*xfer)(void *ctx, const dt_xfer *x, const dt_call *call);
} dt_p2p;

/* algo.c: the collectives over dt_p2p, dt_algo_<id> for every row of DT_COLLECTIVES (call
 * validated by comm.c; in place when send == recv; send and recv as dt_coll_run passes
 * them: broadcast's buffer is recv, barrier has none). Power-of-two sizes: recursive
 * halving / doubling over the fixed tree; others: rings. */
typedef dt_status (*dt_algo_fn)(const dt_p2p *p, const dt_call *call, const void *send, void *recv);
#define DT_ALGO_DECL_(ID, id, name, flags) \
    dt_status dt_algo_##id(const dt_p2p *p, const dt_call *call, const void *send, void *recv);
DT_COLLECTIVES(DT_ALGO_DECL_)
#undef DT_ALGO_DECL_
/* dt_algo_<id> of collective `kind`; NULL when kind is not a collective. */
dt_algo_fn dt_algo_of(int kind);
/* Element offset of block b when count elements are cut into nb blocks (the first
 * count % nb one element longer): the blocks of the algorithms above. */
size_t    dt_algo_block_offset(size_t count, int nb, int b);
/* Bytes up to which all_reduce uses whole-buffer recursive doubling: one message of the
 * whole array per step instead of two of the halving/doubling per step. With 2 ranks both
 * move the same bytes, so one round wins until the message outgrows the caches; with more
 * ranks doubling moves log2(W) arrays against 2(W-1)/W, so it stops sooner. */
#define DT_ALGO_SMALL_BYTES   (64u * 1024u)
#define DT_ALGO_SMALL_BYTES_2 (256u * 1024u)

/* ---- backends ---------------------------------------------------------------------- */

typedef struct dt_store dt_store;   /* store.h: the rendezvous key-value store */
typedef struct dt_async dt_async;   /* comm.c: the worker thread and its queue */

/* Shared by a communicator and every communicator split from it. */
typedef struct {
    pthread_mutex_t lock;           /* held while a backend operation runs */
    int             refs;
    uint32_t        next_ctx;       /* context ids handed to split children */
} dt_family;

typedef struct dt_backend dt_backend;

struct dt_comm {
    int               rank, size;
    int               local_rank, local_size, node_rank;
    char            **hosts;        /* [size] malloc'd host names, filled by the backend's init;
                                       comm.c frees them (and the array) at destroy */
    int              *pids;         /* [size] process ids (0 if unknown); malloc'd, freed by comm.c */
    double            timeout_s;
    char              job_id[128];
    int               deterministic;
    int               secure;       /* DT_SEAL_* (seal.h): the tcp backend seals its sockets' traffic */
    char              secure_desc[64]; /* dt_comm_secure; "" is "off" */
    char              rendezvous[320]; /* how the ranks met (dt_comm_rendezvous), set by init */
    uint64_t          seq;          /* collectives issued so far (comm.c increments) */
    uint32_t          ctx;          /* context id: 0 for the world, unique per split */
    const dt_backend *backend;
    void             *priv;         /* the backend's state */
    dt_p2p            p2p;          /* filled by backends that can; algo.c runs over it */
    dt_family        *family;
    dt_async         *async;        /* comm.c's worker; NULL until the first async call */
    int               broken;       /* a transport error happened: later calls fail fast */
    char              broken_msg[512];
    dt_comm          *parent;       /* split children: the communicator they came from */
    void             *op_token;     /* the running async operation's token (backend->queued), else NULL */
    int              *parent_ranks; /* split children: [size] rank in the parent */
};

/* A backend fills what it can; a NULL collective entry means comm.c runs algo.c over
 * c->p2p instead. Every entry gets a validated call (seq, ctx and desc filled). */
struct dt_backend {
    const char *name;
    int         device_buffers;  /* 1: collectives take device (GPU) pointers, as NCCL does */
    /* Fill rank, size, local_rank, local_size, node_rank, hosts, pids, priv and (if it can)
     * p2p. c->timeout_s, job_id and deterministic are already set from the options. */
    dt_status (*init)          (dt_comm *c, const dt_comm_opts *opts);
    void      (*destroy)       (dt_comm *c);
    /* One member per collective, named by the row's id (.allreduce, .broadcast, ...), with
     * send and recv as dt_coll_run passes them (broadcast's buffer is recv, barrier has none). */
#define DT_BACKEND_COLL_(ID, id, name, flags) \
    dt_status (*id)(dt_comm *c, const dt_call *call, const void *send, void *recv);
    DT_COLLECTIVES(DT_BACKEND_COLL_)
#undef DT_BACKEND_COLL_
    dt_status (*send)          (dt_comm *c, const dt_call *call, const void *buf);
    dt_status (*recv)          (dt_comm *c, const dt_call *call, void *buf);
    /* Called on every rank of parent after comm.c has agreed on the groups. child == NULL
     * when this rank's color < 0. Otherwise child has rank, size, hosts, pids, ctx,
     * parent_ranks, timeout and family set; the backend fills priv and p2p. */
    dt_status (*split)         (dt_comm *parent, const dt_call *call, int color, int key, dt_comm *child);
    /* Free what split put in child->priv. */
    void      (*split_destroy) (dt_comm *child);
    /* The library underneath and its version ("NCCL 2.27.3") into buf; NULL: none. */
    void      (*library)       (char *buf, size_t n);
    /* Optional, for async calls: run on the caller's thread when the call is queued (to
     * note where the device's queue stands then); the token it leaves is c->op_token
     * while the operation runs on the worker, and goes to dequeued() after it ran (or
     * was skipped because the communicator broke). */
    dt_status (*queued)        (dt_comm *c, const dt_call *call, const void *send, const void *recv, void **token);
    void      (*dequeued)      (dt_comm *c, void *token);
};

extern const dt_backend dt_backend_tcp;
#ifdef DT_HAVE_MPI
extern const dt_backend dt_backend_mpi;
#endif
#ifdef DT_HAVE_NCCL
extern const dt_backend dt_backend_nccl;
#endif

/* 1 on comm.c's async worker threads, 0 elsewhere: computation usually runs beside
 * async work, so a transport should not busy-wait long there. */
extern _Thread_local int dt_comm_on_worker;

/* --trace: a transport's wait for world rank `peer` that began at `since` (clock.h
 * seconds) ended now. The operation's span names the peer it waited for longest and the
 * time it waited in all (comm.c); nothing is done when tracing is off. */
void dt_comm_wait_note(int peer, double since);

/* comm.c helpers for backends */
/* "host:pid 4711" (or "host" when the pid is unknown) for rank r, into buf. */
const char *dt_comm_peer_name(const dt_comm *c, int r, char *buf, size_t n);

#endif /* DT_COMM_IMPL_H */
