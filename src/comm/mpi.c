/*
 * mpi.c: the "mpi" communication backend — dtrain's collectives on top of an MPI library.
 *
 * Built only when configure found MPI (DT_HAVE_MPI); this is the one file that includes
 * mpi.h. Two modes:
 *
 *   default        every collective maps onto MPI's own (MPI_Allreduce, MPI_Bcast, ...),
 *                  so a cluster's tuned MPI is used as it is. f16/bf16 reductions go
 *                  through user-defined MPI_Ops that combine in f32 and round back, like
 *                  the tcp backend. MPI picks the reduction order, so results may differ
 *                  in the last bits from tcp and between world sizes.
 *   deterministic  (opts.deterministic or DT_DETERMINISTIC=1) the shared algorithms of
 *                  algo.c run over a point-to-point exchange built on MPI_Isend/Irecv,
 *                  so every bit equals the tcp backend's (docs/DESIGN.md rule 2).
 *
 * Rule 3 under MPI. In default mode each collective is preceded by a tiny MPI_Allreduce
 * of the call's fingerprint, so ranks that call different collectives get an error
 * naming both calls instead of corrupt data (DT_MPI_CHECK=0 skips it, for measuring
 * MPI alone). Timeouts: a blocking MPI collective cannot be interrupted, so in default
 * mode the communicator's timeout is NOT enforced inside MPI_Allreduce & co.; a rank that
 * never arrives leaves its peers waiting until the launcher (mpirun, srun, dtrun) ends
 * the job, and a rank that dies makes the MPI runtime abort the job. Point-to-point
 * messages and everything in deterministic mode are waited for with MPI_Test and a
 * deadline, so there the timeout holds; after a timeout the communicator is broken.
 *
 * Threading: comm.c serialises a communicator family's operations (comm_impl.h), and the
 * async worker calls in from its own thread, so MPI must give at least
 * MPI_THREAD_SERIALIZED. With MPI_THREAD_MULTIPLE unavailable, a process-wide lock also
 * keeps two independent families from calling MPI at once.
 *
 * MPI_Init_thread is called only when MPI is not initialised yet; MPI_Finalize only
 * when dtrain initialised it, at the destruction of the last communicator (MPI cannot
 * be initialised twice, so a later dt_comm_init with backend "mpi" then fails clearly).
 *
 * This file also carries the tcp backend's rendezvous under a bare mpirun (mpi_boot.h):
 * one MPI_Bcast of rank 0's store address between MPI_Init_thread and MPI_Finalize.
 */
#include "config.h"
#include "comm_impl.h"
#include "mpi_boot.h"
#include "reduce.h"

#include <limits.h>
#include <mpi.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- process-wide MPI state ------------------------------------------------------- */

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;   /* guards the fields below */
static int g_worlds;          /* live world communicators of this backend */
static int g_we_initialised;  /* dtrain called MPI_Init_thread */
static int g_serialize;       /* MPI gave SERIALIZED only: take g_call_lock around calls */
static int g_broken;          /* a communicator failed: do not call MPI_Finalize (below) */
static pthread_mutex_t g_call_lock = PTHREAD_MUTEX_INITIALIZER;
/* user-defined reductions for f16 and bf16: [0] f16, [1] bf16; by dt_redop */
static MPI_Op g_half_ops[2][DT_REDOP_COUNT];
static int    g_half_ops_made;

typedef struct {
    MPI_Comm coll;     /* collectives and deterministic exchanges */
    MPI_Comm p2p;      /* dt_send / dt_recv, so user messages never meet collective ones */
    dt_comm *c;
    int      check;    /* fingerprint check before native collectives */
    int      broken;
    char     broken_msg[512];
    unsigned char *stage;   /* receive staging for reducing exchanges */
    size_t   stage_cap;
} mpi_state;

static void call_lock(void)   { if (g_serialize) pthread_mutex_lock(&g_call_lock); }
static void call_unlock(void) { if (g_serialize) pthread_mutex_unlock(&g_call_lock); }

/* An MPI error code as a dt_status with "what: MPI's message". */
static dt_status mpi_fail(int rc, const char *what) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "MPI error %d", rc);
    return dt_error(DT_ERR_PEER, "%s failed: %s", what, msg);
}

#define MPI_TRY(call, what) do { int mpi_rc_ = (call); if (mpi_rc_ != MPI_SUCCESS) return mpi_fail(mpi_rc_, what); } while (0)

static dt_status broken(mpi_state *st, dt_status s) {
    st->broken = 1;
    snprintf(st->broken_msg, sizeof st->broken_msg, "%s", dt_last_error());
    return s;
}

/* ---- f16 / bf16 reductions as MPI_Ops ------------------------------------------------ */

/* MPI calls fn(in, inout, len): inout[i] = in[i] op inout[i]. dt_reduce_apply does the
 * f32 round trip with round-to-nearest-even, exactly as the tcp backend. */
#define HALF_OP(name, type, op)                                                             \
    static void name(void *in, void *inout, int *len, MPI_Datatype *dt) {                  \
        (void)dt;                                                                           \
        dt_reduce_apply(op, type, inout, in, inout, (size_t)*len);                          \
    }
HALF_OP(op_f16_sum,  DT_F16,  DT_SUM)  HALF_OP(op_f16_min,  DT_F16,  DT_MIN)
HALF_OP(op_f16_max,  DT_F16,  DT_MAX)  HALF_OP(op_f16_prod, DT_F16,  DT_PROD)
HALF_OP(op_bf16_sum, DT_BF16, DT_SUM)  HALF_OP(op_bf16_min, DT_BF16, DT_MIN)
HALF_OP(op_bf16_max, DT_BF16, DT_MAX)  HALF_OP(op_bf16_prod, DT_BF16, DT_PROD)

static dt_status make_half_ops(void) {
    MPI_User_function *fns[2][DT_REDOP_COUNT] = {
        [0] = { [DT_SUM] = op_f16_sum,  [DT_AVG] = op_f16_sum,  [DT_MIN] = op_f16_min,
                [DT_MAX] = op_f16_max,  [DT_PROD] = op_f16_prod },
        [1] = { [DT_SUM] = op_bf16_sum, [DT_AVG] = op_bf16_sum, [DT_MIN] = op_bf16_min,
                [DT_MAX] = op_bf16_max, [DT_PROD] = op_bf16_prod },
    };
    for (int t = 0; t < 2; t++)
        for (int o = 0; o < DT_REDOP_COUNT; o++)
            MPI_TRY(MPI_Op_create(fns[t][o], 1, &g_half_ops[t][o]), "MPI_Op_create");
    g_half_ops_made = 1;
    return DT_OK;
}

static void free_half_ops(void) {
    if (!g_half_ops_made) return;
    for (int t = 0; t < 2; t++)
        for (int o = 0; o < DT_REDOP_COUNT; o++) MPI_Op_free(&g_half_ops[t][o]);
    g_half_ops_made = 0;
}

static MPI_Datatype mpi_type(dt_dtype t) {
    switch (t) {
    case DT_F32:  return MPI_FLOAT;
    case DT_F64:  return MPI_DOUBLE;
    case DT_F16:
    case DT_BF16: return MPI_UINT16_T;   /* combined by g_half_ops */
    case DT_I32:  return MPI_INT32_T;
    case DT_I64:  return MPI_INT64_T;
    case DT_U8:   return MPI_UINT8_T;
    default:      break;   /* not a collective type (comm.c refuses it) */
    }
    return MPI_DATATYPE_NULL;
}

static MPI_Op mpi_op(dt_redop op, dt_dtype t) {
    if (t == DT_F16)  return g_half_ops[0][op];
    if (t == DT_BF16) return g_half_ops[1][op];
    switch (op) {
    case DT_SUM:
    case DT_AVG:  return MPI_SUM;   /* then divided by the size */
    case DT_MIN:  return MPI_MIN;
    case DT_MAX:  return MPI_MAX;
    case DT_PROD: return MPI_PROD;
    }
    return MPI_OP_NULL;
}

/* ---- waiting with a deadline --------------------------------------------------------- */

/* Complete n requests, polling so the communicator's timeout holds: spin on MPI_Testall
 * (which also drives MPI's progress) a little, then yield the core between polls (ranks
 * may share cores). On timeout the requests are abandoned and the communicator is broken. */
static dt_status wait_all(mpi_state *st, MPI_Request *req, int n, const dt_call *call,
                          int peer, const char *what) {
    double deadline = dt_now() + st->c->timeout_s;
    for (unsigned long spins = 0;; spins++) {
        int done = 0;
        int rc = MPI_Testall(n, req, &done, MPI_STATUSES_IGNORE);
        if (rc != MPI_SUCCESS) return broken(st, mpi_fail(rc, what));
        if (done) return DT_OK;
        if (spins < 2000) continue;   /* a short spin: most exchanges finish in microseconds */
        if (dt_now() > deadline) {
            char who[300];
            dt_comm_peer_name(st->c, peer, who, sizeof who);
            if (call->seq)
                return broken(st, dt_error(DT_ERR_TIMEOUT, "timed out after %g s in collective #%llu %s "
                                           "waiting for rank %d (%s)", st->c->timeout_s,
                                           (unsigned long long)call->seq, call->desc, peer, who));
            return broken(st, dt_error(DT_ERR_TIMEOUT, "timed out after %g s in %s waiting for rank %d (%s)",
                                       st->c->timeout_s, call->desc, peer, who));
        }
        sched_yield();
    }
}

/* ---- point-to-point exchange for algo.c (deterministic mode) ----------------------- */

/* Header of every exchange message, checked by the receiver like the tcp backend's:
 * context, sequence number, fingerprint and payload bytes. */
enum { HDR_CTX, HDR_SEQ, HDR_FPA, HDR_FPB, HDR_BYTES, HDR_WORDS };
#define XFER_TAG_HDR  1
#define XFER_TAG_DATA 2
/* MPI counts are int: payloads go as MPI_BYTE in pieces of at most this. */
#define MPI_PIECE ((size_t)1 << 30)

static void fill_header(uint64_t *h, const dt_call *call, size_t bytes) {
    dt_fp fp = dt_call_fp(call);
    h[HDR_CTX] = call->ctx;
    h[HDR_SEQ] = call->seq;
    h[HDR_FPA] = fp.a;
    h[HDR_FPB] = fp.b;
    h[HDR_BYTES] = bytes;
}

static dt_status check_header(mpi_state *st, const uint64_t *h, const dt_call *call, int peer, size_t bytes) {
    dt_fp my = dt_call_fp(call);
    char d[112], mine[200];
    if (h[HDR_CTX] != call->ctx || h[HDR_SEQ] != call->seq || h[HDR_FPA] != my.a || h[HDR_FPB] != my.b) {
        dt_fp fp = { h[HDR_FPA], h[HDR_FPB] };
        dt_fp_describe(fp, d, sizeof d);
        if (call->seq && h[HDR_SEQ] == call->seq && h[HDR_CTX] == call->ctx)
            return broken(st, dt_error(DT_ERR_MISMATCH, "collective #%llu mismatch: this rank called %s, "
                                       "rank %d called %s", (unsigned long long)call->seq, call->desc, peer, d));
        if (call->seq) snprintf(mine, sizeof mine, "collective #%llu %s", (unsigned long long)call->seq, call->desc);
        else snprintf(mine, sizeof mine, "%s", call->desc);
        return broken(st, dt_error(DT_ERR_MISMATCH, "mismatch: this rank called %s, rank %d called %s%s%s",
                                   mine, peer, d, h[HDR_SEQ] ? " as a collective" : "",
                                   h[HDR_CTX] != call->ctx ? " on another communicator" : ""));
    }
    if (h[HDR_BYTES] != bytes)
        return broken(st, dt_error(DT_ERR_MISMATCH, "rank %d sent %llu bytes where this rank expected %zu in %s",
                                   peer, (unsigned long long)h[HDR_BYTES], bytes, call->desc));
    return DT_OK;
}

/* Post the pieces of a payload; *n grows by the number of requests. */
static dt_status post_payload(mpi_state *st, int is_send, void *buf, size_t bytes, int peer, int tag,
                              MPI_Comm comm, MPI_Request *req, int *n, int max) {
    for (size_t off = 0; off < bytes; off += MPI_PIECE) {
        if (*n == max) return dt_error(DT_ERR_UNSUPPORTED, "message of %zu bytes is too large for the mpi backend", bytes);
        size_t k = bytes - off < MPI_PIECE ? bytes - off : MPI_PIECE;
        int rc = is_send ? MPI_Isend((char *)buf + off, (int)k, MPI_BYTE, peer, tag, comm, &req[*n])
                         : MPI_Irecv((char *)buf + off, (int)k, MPI_BYTE, peer, tag, comm, &req[*n]);
        if (rc != MPI_SUCCESS) return broken(st, mpi_fail(rc, is_send ? "MPI_Isend" : "MPI_Irecv"));
        (*n)++;
    }
    return DT_OK;
}

#define MAX_REQ 64   /* header + payload pieces in both directions: payloads up to ~30 GiB */

static dt_status mpi_xfer(void *ctx, const dt_xfer *x, const dt_call *call) {
    mpi_state *st = ctx;
    if (st->broken) return dt_error(DT_ERR_PEER, "%s", st->broken_msg);
    uint64_t sh[HDR_WORDS], rh[HDR_WORDS];
    MPI_Request hreq[2], dreq[MAX_REQ];
    int nh = 0, nd = 0;
    void *rbuf = x->rbuf;
    if (x->src >= 0 && x->racc) {   /* receive into staging, then combine */
        if (st->stage_cap < x->rbytes) {
            unsigned char *s = realloc(st->stage, x->rbytes);
            if (!s) return dt_error(DT_ERR_NOMEM, "out of memory (%zu bytes of receive staging)", x->rbytes);
            st->stage = s;
            st->stage_cap = x->rbytes;
        }
        rbuf = st->stage;
    }
    /* Headers and payloads are all posted at once, so an exchange costs one round trip;
     * the received header is checked before the payload is waited for and used. After
     * a mismatch the payload requests are abandoned with the broken communicator. */
    if (x->src >= 0 && MPI_Irecv(rh, HDR_WORDS, MPI_UINT64_T, x->src, XFER_TAG_HDR, st->coll, &hreq[nh++]) != MPI_SUCCESS)
        return broken(st, dt_error(DT_ERR_PEER, "MPI_Irecv of a message header failed"));
    if (x->src >= 0) DT_TRY(post_payload(st, 0, rbuf, x->rbytes, x->src, XFER_TAG_DATA, st->coll, dreq, &nd, MAX_REQ));
    if (x->dst >= 0) {
        if (x->scopy && x->sbytes) memcpy(x->scopy, x->sbuf, x->sbytes);
        fill_header(sh, call, x->sbytes);
        if (MPI_Isend(sh, HDR_WORDS, MPI_UINT64_T, x->dst, XFER_TAG_HDR, st->coll, &hreq[nh++]) != MPI_SUCCESS)
            return broken(st, dt_error(DT_ERR_PEER, "MPI_Isend of a message header failed"));
        DT_TRY(post_payload(st, 1, (void *)x->sbuf, x->sbytes, x->dst, XFER_TAG_DATA, st->coll, dreq, &nd, MAX_REQ));
    }
    int peer = x->src >= 0 ? x->src : x->dst;
    DT_TRY(wait_all(st, hreq, nh, call, peer, "exchanging message headers"));
    if (x->src >= 0) DT_TRY(check_header(st, rh, call, x->src, x->rbytes));
    DT_TRY(wait_all(st, dreq, nd, call, peer, "exchanging data"));
    if (x->src >= 0 && x->racc) {
        size_t n = x->rbytes / dt_dtype_size(call->dtype);
        dt_reduce_apply(call->op, call->dtype, x->rbuf, x->racc, st->stage, n);
    }
    return DT_OK;
}

/* ---- the fingerprint check before a native collective ----------------------------- */

/* One MPI_Allreduce(MAX) of {ctx, seq, fp.a, fp.b} and their complements: every rank
 * learns the largest and smallest value of each word, so all agree iff max == min. */
static dt_status check_call(mpi_state *st, const dt_call *call) {
    if (!st->check) return DT_OK;
    dt_fp fp = dt_call_fp(call);
    uint64_t v[8] = { call->ctx, call->seq, fp.a, fp.b, ~(uint64_t)call->ctx, ~call->seq, ~fp.a, ~fp.b };
    int rc = MPI_Allreduce(MPI_IN_PLACE, v, 8, MPI_UINT64_T, MPI_MAX, st->coll);
    if (rc != MPI_SUCCESS) return broken(st, mpi_fail(rc, "MPI_Allreduce (collective check)"));
    int same = 1;
    for (int i = 0; i < 4; i++) same &= v[i] == ~v[i + 4];
    if (same) return DT_OK;
    /* name another call: whichever extreme is not ours */
    dt_fp other = { v[2], v[3] };
    if (other.a == fp.a && other.b == fp.b) other = (dt_fp){ ~v[6], ~v[7] };
    char d[112];
    dt_fp_describe(other, d, sizeof d);
    if (other.a == fp.a && other.b == fp.b)
        return broken(st, dt_error(DT_ERR_MISMATCH, "collective #%llu %s: ranks disagree on the collective "
                                   "number (%llu..%llu) or communicator", (unsigned long long)call->seq,
                                   call->desc, (unsigned long long)~v[5], (unsigned long long)v[1]));
    return broken(st, dt_error(DT_ERR_MISMATCH, "collective #%llu mismatch: this rank called %s, another rank called %s",
                               (unsigned long long)call->seq, call->desc, d));
}

/* ---- native collectives ------------------------------------------------------------ */

static mpi_state *state(dt_comm *c) { return c->priv; }

/* Most collectives take int counts: larger arrays go in pieces of at most INT_MAX. */
#define MAX_COUNT ((size_t)INT_MAX)

static dt_status entry(mpi_state *st, const dt_call *call) {
    if (st->broken) return dt_error(DT_ERR_PEER, "%s", st->broken_msg);
    return check_call(st, call);
}

static dt_status mpi_allreduce(dt_comm *c, const dt_call *call, const void *send, void *recv) {
    mpi_state *st = state(c);
    if (c->deterministic) return dt_algo_allreduce(&c->p2p, call, send, recv);
    call_lock();
    dt_status s = entry(st, call);
    size_t es = dt_dtype_size(call->dtype);
    for (size_t off = 0; s == DT_OK && off < call->count; off += MAX_COUNT) {
        size_t k = call->count - off < MAX_COUNT ? call->count - off : MAX_COUNT;
        const void *sb = send == recv ? MPI_IN_PLACE : (const char *)send + off * es;
        int rc = MPI_Allreduce(sb, (char *)recv + off * es, (int)k, mpi_type(call->dtype),
                               mpi_op(call->op, call->dtype), st->coll);
        if (rc != MPI_SUCCESS) s = broken(st, mpi_fail(rc, "MPI_Allreduce"));
    }
    call_unlock();
    if (s == DT_OK && call->op == DT_AVG) dt_reduce_divide(call->dtype, recv, call->count, c->size);
    return s;
}

static dt_status mpi_broadcast(dt_comm *c, const dt_call *call, const void *send, void *buf) {
    mpi_state *st = state(c);
    if (c->deterministic) return dt_algo_broadcast(&c->p2p, call, send, buf);
    call_lock();
    dt_status s = entry(st, call);
    size_t es = dt_dtype_size(call->dtype);
    for (size_t off = 0; s == DT_OK && off < call->count; off += MAX_COUNT) {
        size_t k = call->count - off < MAX_COUNT ? call->count - off : MAX_COUNT;
        int rc = MPI_Bcast((char *)buf + off * es, (int)k, mpi_type(call->dtype), call->root, st->coll);
        if (rc != MPI_SUCCESS) s = broken(st, mpi_fail(rc, "MPI_Bcast"));
    }
    call_unlock();
    return s;
}

static dt_status mpi_allgather(dt_comm *c, const dt_call *call, const void *send, void *recv) {
    mpi_state *st = state(c);
    if (c->deterministic) return dt_algo_allgather(&c->p2p, call, send, recv);
    size_t cb = call->count * dt_dtype_size(call->dtype);
    if (call->count > MAX_COUNT)
        return dt_error(DT_ERR_UNSUPPORTED, "%s: the mpi backend gathers at most %d elements per rank",
                        call->desc, INT_MAX);
    char *mine = (char *)recv + (size_t)c->rank * cb;
    /* in place: MPI wants this rank's block already at its place in recv */
    if ((const char *)send != mine && cb) memmove(mine, send, cb);
    call_lock();
    dt_status s = entry(st, call);
    if (s == DT_OK) {
        int rc = MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, (int)call->count,
                               mpi_type(call->dtype), st->coll);
        if (rc != MPI_SUCCESS) s = broken(st, mpi_fail(rc, "MPI_Allgather"));
    }
    call_unlock();
    return s;
}

static dt_status mpi_reduce_scatter(dt_comm *c, const dt_call *call, const void *send, void *recv) {
    mpi_state *st = state(c);
    if (c->deterministic) return dt_algo_reduce_scatter(&c->p2p, call, send, recv);
    if (call->count > MAX_COUNT)
        return dt_error(DT_ERR_UNSUPPORTED, "%s: the mpi backend reduce-scatters at most %d elements per rank",
                        call->desc, INT_MAX);
    size_t rb = call->count * dt_dtype_size(call->dtype), total = rb * (size_t)c->size;
    const char *sp = send;
    char *rp = recv, *out = rp;
    int inplace = sp == rp;   /* MPI_IN_PLACE: input in recv, result in its first block */
    if (!inplace && rp < sp + total && sp < rp + rb) {
        out = malloc(rb ? rb : 1);   /* recv inside send (block `rank`): reduce into scratch */
        if (!out) return dt_error(DT_ERR_NOMEM, "out of memory (%zu bytes of scratch space)", rb);
    }
    call_lock();
    dt_status s = entry(st, call);
    if (s == DT_OK) {
        int rc = MPI_Reduce_scatter_block(inplace ? MPI_IN_PLACE : send, out, (int)call->count,
                                          mpi_type(call->dtype), mpi_op(call->op, call->dtype), st->coll);
        if (rc != MPI_SUCCESS) s = broken(st, mpi_fail(rc, "MPI_Reduce_scatter_block"));
    }
    call_unlock();
    if (out != rp) {
        if (s == DT_OK && rb) memcpy(rp, out, rb);
        free(out);
    }
    if (s == DT_OK && call->op == DT_AVG) dt_reduce_divide(call->dtype, recv, call->count, c->size);
    return s;
}

static dt_status mpi_reduce(dt_comm *c, const dt_call *call, const void *send, void *recv) {
    mpi_state *st = state(c);
    if (c->deterministic) return dt_algo_reduce(&c->p2p, call, send, recv);
    int root = c->rank == call->root;
    size_t es = dt_dtype_size(call->dtype);
    call_lock();
    dt_status s = entry(st, call);
    for (size_t off = 0; s == DT_OK && off < call->count; off += MAX_COUNT) {
        size_t k = call->count - off < MAX_COUNT ? call->count - off : MAX_COUNT;
        const void *sb = root && send == recv ? MPI_IN_PLACE : (const char *)send + off * es;
        void *rb = root ? (char *)recv + off * es : NULL;
        int rc = MPI_Reduce(sb, rb, (int)k, mpi_type(call->dtype), mpi_op(call->op, call->dtype),
                            call->root, st->coll);
        if (rc != MPI_SUCCESS) s = broken(st, mpi_fail(rc, "MPI_Reduce"));
    }
    call_unlock();
    if (s == DT_OK && root && call->op == DT_AVG) dt_reduce_divide(call->dtype, recv, call->count, c->size);
    return s;
}

static dt_status mpi_barrier(dt_comm *c, const dt_call *call, const void *send, void *recv) {
    mpi_state *st = state(c);
    if (c->deterministic) return dt_algo_barrier(&c->p2p, call, send, recv);
    call_lock();
    dt_status s = entry(st, call);
    if (s == DT_OK) {
        int rc = MPI_Barrier(st->coll);
        if (rc != MPI_SUCCESS) s = broken(st, mpi_fail(rc, "MPI_Barrier"));
    }
    call_unlock();
    return s;
}

/* Deterministic mode: the exchange runs under the call lock as a whole. */
static dt_status locked_xfer(void *ctx, const dt_xfer *x, const dt_call *call) {
    call_lock();
    dt_status s = mpi_xfer(ctx, x, call);
    call_unlock();
    return s;
}

/* ---- point to point ---------------------------------------------------------------- */

/* A message on st->p2p is a header {dtype, tag, count, bytes} then the payload; MPI keeps
 * them in order per (source, communicator), and the receiver checks the header against
 * its own call so a mismatch is an error naming both sides. */
enum { P2P_DTYPE, P2P_TAG, P2P_COUNT, P2P_WORDS };

static dt_status mpi_send(dt_comm *c, const dt_call *call, const void *buf) {
    mpi_state *st = state(c);
    if (st->broken) return dt_error(DT_ERR_PEER, "%s", st->broken_msg);
    uint64_t h[P2P_WORDS] = { (uint64_t)call->dtype, (uint64_t)(int64_t)call->tag, call->count };
    MPI_Request req[MAX_REQ];
    int n = 0;
    size_t bytes = call->count * dt_dtype_size(call->dtype);
    call_lock();
    dt_status s = DT_OK;
    if (MPI_Isend(h, P2P_WORDS, MPI_UINT64_T, call->root, XFER_TAG_HDR, st->p2p, &req[n++]) != MPI_SUCCESS)
        s = broken(st, dt_error(DT_ERR_PEER, "MPI_Isend of a message header to rank %d failed", call->root));
    if (s == DT_OK) s = post_payload(st, 1, (void *)buf, bytes, call->root, XFER_TAG_DATA, st->p2p, req, &n, MAX_REQ);
    if (s == DT_OK) s = wait_all(st, req, n, call, call->root, "MPI send");
    call_unlock();
    return s;
}

static dt_status mpi_recv(dt_comm *c, const dt_call *call, void *buf) {
    mpi_state *st = state(c);
    if (st->broken) return dt_error(DT_ERR_PEER, "%s", st->broken_msg);
    uint64_t h[P2P_WORDS];
    MPI_Request req[MAX_REQ];
    int n = 0;
    size_t bytes = call->count * dt_dtype_size(call->dtype);
    call_lock();
    dt_status s = DT_OK;
    if (MPI_Irecv(h, P2P_WORDS, MPI_UINT64_T, call->root, XFER_TAG_HDR, st->p2p, &req[n++]) != MPI_SUCCESS)
        s = broken(st, dt_error(DT_ERR_PEER, "MPI_Irecv of a message header from rank %d failed", call->root));
    if (s == DT_OK) s = wait_all(st, req, n, call, call->root, "MPI recv");
    if (s == DT_OK && (h[P2P_DTYPE] != (uint64_t)call->dtype || h[P2P_TAG] != (uint64_t)(int64_t)call->tag ||
                       h[P2P_COUNT] != call->count)) {
        const char *tn = h[P2P_DTYPE] < DT_COMM_NDTYPES ? dt_dtype_name((dt_dtype)h[P2P_DTYPE]) : "?";
        s = broken(st, dt_error(DT_ERR_MISMATCH, "recv from rank %d: this rank expected %s x %zu with tag %d, "
                                "rank %d sent %s x %llu with tag %lld", call->root, dt_dtype_name(call->dtype),
                                call->count, call->tag, call->root, tn, (unsigned long long)h[P2P_COUNT],
                                (long long)(int64_t)h[P2P_TAG]));
    }
    n = 0;
    if (s == DT_OK) s = post_payload(st, 0, buf, bytes, call->root, XFER_TAG_DATA, st->p2p, req, &n, MAX_REQ);
    if (s == DT_OK) s = wait_all(st, req, n, call, call->root, "MPI recv");
    call_unlock();
    return s;
}

/* ---- setup ---------------------------------------------------------------------------- */

static int env_flag(const char *name, int dflt) {
    const char *v = getenv(name);
    if (!v || !*v) return dflt;
    return !(strcmp(v, "0") == 0 || strcmp(v, "no") == 0 || strcmp(v, "false") == 0);
}

static void free_state(mpi_state *st) {
    if (!st) return;
    if (st->coll != MPI_COMM_NULL) MPI_Comm_free(&st->coll);
    if (st->p2p != MPI_COMM_NULL) MPI_Comm_free(&st->p2p);
    free(st->stage);
    free(st);
}

/* A state over comm (taken over: freed with the state). */
static dt_status new_state(dt_comm *c, MPI_Comm comm, mpi_state **out) {
    mpi_state *st = calloc(1, sizeof *st);
    if (!st) { MPI_Comm_free(&comm); return dt_error(DT_ERR_NOMEM, "out of memory"); }
    st->coll = comm;
    st->p2p = MPI_COMM_NULL;
    st->c = c;
    st->check = env_flag("DT_MPI_CHECK", 1);
    int rc = MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_dup(comm, &st->p2p);
    if (rc != MPI_SUCCESS) { free_state(st); return mpi_fail(rc, "setting up an MPI communicator"); }
    c->priv = st;
    c->p2p = (dt_p2p){ .ctx = st, .rank = c->rank, .size = c->size, .xfer = locked_xfer };
    *out = st;
    return DT_OK;
}

/* MPI_Init_thread unless someone already did; make the f16/bf16 ops once. */
static dt_status mpi_start(void) {
    int inited = 0, finalized = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (finalized)
        return dt_error(DT_ERR_UNSUPPORTED, "MPI was already finalized in this process and cannot be "
                        "initialised again (create the mpi communicator once per process)");
    int provided = MPI_THREAD_SINGLE;
    if (!inited) {
        int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
        if (rc != MPI_SUCCESS) return mpi_fail(rc, "MPI_Init_thread");
        g_we_initialised = 1;
    } else {
        MPI_Query_thread(&provided);
    }
    if (provided < MPI_THREAD_SERIALIZED)
        return dt_error(DT_ERR_UNSUPPORTED, "MPI provides thread level %d; dtrain needs at least "
                        "MPI_THREAD_SERIALIZED (its async worker calls MPI from another thread)", provided);
    g_serialize = provided < MPI_THREAD_MULTIPLE;
    if (!g_half_ops_made) DT_TRY(make_half_ops());
    return DT_OK;
}

/* After a failure (a peer missing, a mismatch) MPI_Finalize would wait for the peers
 * that never come, so it is skipped: the process then exits without it, which makes
 * mpirun/srun end the whole job at once instead of leaving it hanging. */
static void mpi_stop(void) {
    free_half_ops();
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (g_we_initialised && !finalized && !g_broken) MPI_Finalize();
    g_we_initialised = 0;
}

/* rank/size, local rank/size (ranks sharing memory), node rank, host names and pids. */
static dt_status describe_world(dt_comm *c, MPI_Comm comm) {
    MPI_Comm local = MPI_COMM_NULL, leaders = MPI_COMM_NULL;
    MPI_TRY(MPI_Comm_rank(comm, &c->rank), "MPI_Comm_rank");
    MPI_TRY(MPI_Comm_size(comm, &c->size), "MPI_Comm_size");
    MPI_TRY(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, c->rank, MPI_INFO_NULL, &local),
            "MPI_Comm_split_type");
    dt_status s = DT_OK;
    int rc = MPI_Comm_rank(local, &c->local_rank);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_size(local, &c->local_size);
    /* node index: rank of this node's first rank among the first ranks of all nodes,
     * so nodes are numbered in the order of their lowest world rank */
    if (rc == MPI_SUCCESS)
        rc = MPI_Comm_split(comm, c->local_rank == 0 ? 0 : MPI_UNDEFINED, c->rank, &leaders);
    c->node_rank = 0;
    if (rc == MPI_SUCCESS && leaders != MPI_COMM_NULL) rc = MPI_Comm_rank(leaders, &c->node_rank);
    if (rc == MPI_SUCCESS) rc = MPI_Bcast(&c->node_rank, 1, MPI_INT, 0, local);
    if (rc != MPI_SUCCESS) s = mpi_fail(rc, "finding the ranks of this node");
    if (leaders != MPI_COMM_NULL) MPI_Comm_free(&leaders);
    if (local != MPI_COMM_NULL) MPI_Comm_free(&local);
    if (s != DT_OK) return s;

    /* host names and pids of every rank, for error messages */
    char name[MPI_MAX_PROCESSOR_NAME > 256 ? MPI_MAX_PROCESSOR_NAME : 256];
    int len = 0;
    memset(name, 0, sizeof name);
    if (MPI_Get_processor_name(name, &len) != MPI_SUCCESS || len <= 0) gethostname(name, sizeof name - 1);
    name[255] = '\0';
    size_t n = (size_t)c->size;
    char *all = malloc(n * 256);
    int pid = (int)getpid();
    c->hosts = calloc(n, sizeof *c->hosts);
    c->pids = calloc(n, sizeof *c->pids);
    if (!all || !c->hosts || !c->pids) { free(all); return dt_error(DT_ERR_NOMEM, "out of memory"); }
    rc = MPI_Allgather(name, 256, MPI_CHAR, all, 256, MPI_CHAR, comm);
    if (rc == MPI_SUCCESS) rc = MPI_Allgather(&pid, 1, MPI_INT, c->pids, 1, MPI_INT, comm);
    if (rc != MPI_SUCCESS) { free(all); return mpi_fail(rc, "exchanging host names"); }
    for (size_t i = 0; i < n; i++) {
        all[i * 256 + 255] = '\0';
        c->hosts[i] = strdup(all + i * 256);
        if (!c->hosts[i]) { free(all); return dt_error(DT_ERR_NOMEM, "out of memory"); }
    }
    free(all);
    return DT_OK;
}

static dt_status mpi_init(dt_comm *c, const dt_comm_opts *opts) {
    pthread_mutex_lock(&g_lock);
    dt_status s = mpi_start();
    if (s != DT_OK) {
        if (g_worlds == 0 && g_we_initialised) mpi_stop();
        pthread_mutex_unlock(&g_lock);
        return s;
    }
    g_worlds++;
    pthread_mutex_unlock(&g_lock);

    MPI_Comm world = MPI_COMM_NULL;
    int rc = MPI_Comm_dup(MPI_COMM_WORLD, &world);
    if (rc != MPI_SUCCESS) { s = mpi_fail(rc, "MPI_Comm_dup"); goto fail; }
    MPI_Comm_set_errhandler(world, MPI_ERRORS_RETURN);
    if ((s = describe_world(c, world)) != DT_OK) { MPI_Comm_free(&world); goto fail; }
    if ((opts->rank >= 0 && opts->rank != c->rank) || (opts->size >= 0 && opts->size != c->size)) {
        s = dt_error(DT_ERR_INVALID, "backend mpi: rank %d of %d was requested but MPI says rank %d of %d",
                     opts->rank, opts->size, c->rank, c->size);
        MPI_Comm_free(&world);
        goto fail;
    }
    mpi_state *st;
    if ((s = new_state(c, world, &st)) != DT_OK) goto fail;
    snprintf(c->rendezvous, sizeof c->rendezvous, "MPI_COMM_WORLD");
    return DT_OK;
fail:
    pthread_mutex_lock(&g_lock);
    if (--g_worlds == 0) mpi_stop();
    pthread_mutex_unlock(&g_lock);
    return s;
}

static void mpi_destroy(dt_comm *c) {
    mpi_state *st = state(c);
    int failed = c->broken || (st && st->broken);
    if (!failed) free_state(st);   /* after a failure, freeing communicators may block too */
    else if (st) free(st->stage), free(st);
    c->priv = NULL;
    pthread_mutex_lock(&g_lock);
    if (failed) g_broken = 1;
    if (--g_worlds == 0) mpi_stop();
    pthread_mutex_unlock(&g_lock);
}

static dt_status mpi_split(dt_comm *parent, const dt_call *call, int color, int key, dt_comm *child) {
    (void)call;
    mpi_state *pst = state(parent);
    if (pst->broken) return dt_error(DT_ERR_PEER, "%s", pst->broken_msg);
    MPI_Comm nc = MPI_COMM_NULL;
    call_lock();
    int rc = MPI_Comm_split(pst->coll, child ? color : MPI_UNDEFINED, key, &nc);
    call_unlock();
    if (rc != MPI_SUCCESS) return broken(pst, mpi_fail(rc, "MPI_Comm_split"));
    if (!child) return DT_OK;
    int r = -1, n = -1;
    MPI_Comm_rank(nc, &r);
    MPI_Comm_size(nc, &n);
    if (r != child->rank || n != child->size) {
        MPI_Comm_free(&nc);
        return dt_error(DT_ERR_INTERNAL, "MPI_Comm_split made rank %d of %d where dtrain expected rank %d of %d",
                        r, n, child->rank, child->size);
    }
    mpi_state *st;
    return new_state(child, nc, &st);
}

static void mpi_split_destroy(dt_comm *child) {
    mpi_state *st = state(child);
    if (child->broken || (st && st->broken)) {
        pthread_mutex_lock(&g_lock);
        g_broken = 1;
        pthread_mutex_unlock(&g_lock);
        if (st) free(st->stage), free(st);
    } else {
        free_state(st);
    }
    child->priv = NULL;
}

/* ---- the tcp backend's rendezvous through MPI (mpi_boot.h) ---------------------------- */

int dt_mpi_boot_available(const char *source) {
#if defined(OPEN_MPI)
    return source && strcmp(source, "openmpi") == 0;
#elif defined(MPICH_VERSION)
    return source && strcmp(source, "mpich") == 0;
#else
    (void)source;
    return 0;
#endif
}

/* MPI started and the line broadcast; the caller finalises. Rank 0's line starts with
 * '+' (publish's line follows) or '!' (publish's error follows). */
static dt_status boot_exchange(int rank, int size, dt_status (*publish)(void *, char *, size_t), void *ctx,
                               char *line, int *mpi_failed) {
    MPI_Comm comm = MPI_COMM_NULL;
    int rc = MPI_Comm_dup(MPI_COMM_WORLD, &comm);
    if (rc != MPI_SUCCESS) { *mpi_failed = 1; return mpi_fail(rc, "MPI_Comm_dup"); }
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    int r = -1, n = -1;
    MPI_Comm_rank(comm, &r);
    MPI_Comm_size(comm, &n);
    if (r != rank || n != size) {
        /* the ranks cannot agree on a broadcast: end here, without MPI_Finalize */
        *mpi_failed = 1;
        return dt_error(DT_ERR_INVALID, "the launcher says rank %d of %d but MPI says rank %d of %d (is dtrain "
                        "built against this mpirun's MPI?); set MASTER_ADDR and MASTER_PORT instead", rank, size, r, n);
    }
    char buf[DT_MPI_BOOT_LINE + 1];
    memset(buf, 0, sizeof buf);
    dt_status ps = DT_OK;
    if (rank == 0) {
        ps = publish(ctx, buf + 1, DT_MPI_BOOT_LINE);
        buf[0] = ps == DT_OK ? '+' : '!';
        if (ps != DT_OK) snprintf(buf + 1, DT_MPI_BOOT_LINE, "%s", dt_last_error());
    }
    rc = MPI_Bcast(buf, (int)sizeof buf, MPI_CHAR, 0, comm);
    if (rc != MPI_SUCCESS) { *mpi_failed = 1; return mpi_fail(rc, "MPI_Bcast of the rendezvous address"); }
    MPI_Comm_free(&comm);
    buf[DT_MPI_BOOT_LINE] = '\0';
    memcpy(line, buf + 1, DT_MPI_BOOT_LINE);
    if (buf[0] != '+') {
        if (rank == 0) return dt_error(ps, "%s", line);
        return dt_error(DT_ERR_PEER, "rank 0 could not start the rendezvous: %s", line);
    }
    return DT_OK;
}

dt_status dt_mpi_boot(int rank, int size, dt_status (*publish)(void *, char *, size_t), void *ctx, char *line) {
    line[0] = '\0';
    pthread_mutex_lock(&g_lock);
    dt_status s = mpi_start();
    if (s != DT_OK) {
        if (g_worlds == 0 && g_we_initialised) mpi_stop();
        pthread_mutex_unlock(&g_lock);
        return dt_error_wrap(s, "rendezvous through MPI: ");
    }
    g_worlds++;
    pthread_mutex_unlock(&g_lock);
    int mpi_failed = 0;
    s = boot_exchange(rank, size, publish, ctx, line, &mpi_failed);
    pthread_mutex_lock(&g_lock);
    if (mpi_failed) g_broken = 1;   /* MPI_Finalize would wait for ranks that are not coming */
    if (--g_worlds == 0) mpi_stop();
    pthread_mutex_unlock(&g_lock);
    return s;
}

/* The first line of MPI_Get_library_version ("Open MPI v4.1.4, ..."). */
static void mpi_library(char *buf, size_t n) {
    char v[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    if (MPI_Get_library_version(v, &len) != MPI_SUCCESS) len = 0;
    v[len < (int)sizeof v ? len : (int)sizeof v - 1] = 0;
    v[strcspn(v, "\n")] = 0;
    snprintf(buf, n, "%s", v);
}

const dt_backend dt_backend_mpi = {
    .name           = "mpi",
    .init           = mpi_init,
    .destroy        = mpi_destroy,
    .allreduce      = mpi_allreduce,
    .broadcast      = mpi_broadcast,
    .allgather      = mpi_allgather,
    .reduce_scatter = mpi_reduce_scatter,
    .reduce         = mpi_reduce,
    .barrier        = mpi_barrier,
    .send           = mpi_send,
    .recv           = mpi_recv,
    .split          = mpi_split,
    .split_destroy  = mpi_split_destroy,
    .library        = mpi_library,
};
