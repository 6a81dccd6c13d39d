/*
 * nccl.c: the "nccl" communication backend — dtrain's collectives on NVIDIA's NCCL,
 * for buffers in GPU memory.
 *
 * Built only with ./configure --with-cuda --with-nccl (DT_HAVE_NCCL); the one file
 * that includes nccl.h. Buffers are classified per call (cudaPointerGetAttributes):
 * DEVICE buffers (from the CUDA compute backend's alloc, on the device of this rank)
 * go to NCCL; HOST buffers (the trainer's control
 * traffic: sizes, checksums, losses, flags, pinned or not) cannot, and go over the tcp
 * side channel with dtrain's own algorithms (algo.c). Every rank must pass the same
 * kind to a call (the preflight below checks it); a call that mixes them is refused.
 *
 * Set-up never needs MPI. The backend first runs the tcp backend's rendezvous
 * (tcp.c: the store, rank claims, host names, a socket mesh). Each rank then takes the
 * GPU of its local rank (dt_cuda_open), once the ranks have compared PCI bus ids so that
 * no two of a host share one (pick_device). Rank 0 then makes the ncclUniqueId and
 * sets it in dtrain's store; the other ranks wait for it there. So
 * Slurm clusters without PMIx work, and every rank knows its peers' host names for
 * error messages. The tcp mesh stays up as a side channel (below).
 *
 * Rule 3 (fail loudly, never hang):
 *   - before each collective, the ranks all-gather their calls' fingerprints over the
 *     tcp side channel (point-to-point calls: the pair exchanges them), so a rank that
 *     calls a different collective gets DT_ERR_MISMATCH naming both calls on EVERY rank,
 *     and a rank that never arrives gets the tcp backend's timeout naming the missing
 *     rank, before anything is handed to NCCL (DT_NCCL_CHECK=0 skips this: one small
 *     host round trip per call);
 *   - the NCCL communicator is non-blocking (ncclCommInitRankConfig with blocking = 0):
 *     init and every operation are polled with ncclCommGetAsyncError and
 *     cudaStreamQuery until done or until the communicator's timeout, then the
 *     communicator is aborted (ncclCommAbort) and the error names this rank, the
 *     collective's sequence number and description; later calls fail fast.
 *
 * Streams: NCCL runs on the backend's own stream, ordered after the compute stream
 * with an event, so a collective sees every kernel queued before it. For an async call
 * the event is recorded on the caller's thread when the call is queued (nccl_queued:
 * DDP's backward hook, the moment its bucket's gradients are queued), so NCCL waits for
 * exactly that work rather than for whatever the host queued until the worker thread
 * got to it; a blocking call records it when it starts. Calls return (and async work is
 * done) when the result is in place.
 *
 * Reduction order: NCCL chooses rings or trees by size and topology, so sums may differ
 * in the last bits from the tcp backend and between world sizes; that is the default,
 * the fast one. With deterministic mode (opts.deterministic or DT_DETERMINISTIC=1) the
 * reductions follow dtrain's own tree (algo.c), bitwise equal to the tcp backend
 * (docs/DESIGN.md rule 2): all_reduce over a power-of-two world stays on the device
 * (recursive halving with ncclSend/ncclRecv pairs and dt_cuda_combine adding what
 * arrives, then recursive doubling: tree_allreduce below); other world sizes, and
 * reduce_scatter and reduce, copy to pinned host memory and run algo.c over the tcp side
 * channel, at host speed. Broadcast and all_gather move data without arithmetic and
 * always use NCCL.
 *
 * Types: f32, f64, f16, bf16, i32, i64, u8; ops: sum, avg (ncclAvg), min, max, prod.
 * NCCL_SOCKET_IFNAME is set from DT_SOCKET_IFNAME when it is unset.
 */
#include "config.h"
#include "comm_impl.h"
#include "tcp_impl.h"
#include "cuda/dt_cuda.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
    dt_comm      *c;
    void         *tcp;          /* the tcp backend's state: store, side channel (c->p2p) */
    ncclComm_t    nc;
    cudaStream_t  stream;
    int           check;        /* fingerprint barrier before each call */
    int           broken;
    char          broken_msg[512];
    void         *stage;        /* pinned host staging for deterministic reductions */
    size_t        stage_cap;
    void         *dtmp;         /* device scratch of the deterministic all_reduce */
    size_t        dtmp_cap;
    int           gated;        /* this call is between dt_cuda_collective_begin and _end */
} nccl_state;

/* ---- errors ------------------------------------------------------------------------ */

static dt_status nccl_status(ncclResult_t r) {
    switch (r) {
    case ncclInvalidArgument: case ncclInvalidUsage: return DT_ERR_INVALID;
    case ncclInternalError:                          return DT_ERR_INTERNAL;
    case ncclUnhandledCudaError:                     return DT_ERR_IO;
    default:                                         return DT_ERR_PEER;
    }
}

static dt_status set_broken(nccl_state *st, dt_status s) {
    st->broken = 1;
    snprintf(st->broken_msg, sizeof st->broken_msg, "%s", dt_last_error());
    return s;
}

/* "in collective #57 all_reduce (f32, 1048576 elems, sum)" or "in send (f32, ...)" */
static const char *where(const dt_call *call, char *buf, size_t n) {
    if (call->seq) snprintf(buf, n, "in collective #%llu %s", (unsigned long long)call->seq, call->desc);
    else snprintf(buf, n, "in %s", call->desc);
    return buf;
}

static dt_status nccl_fail(nccl_state *st, ncclResult_t r, const char *what, const dt_call *call) {
    char w[200];
    const char *detail = st->nc ? ncclGetLastError(st->nc) : NULL;
    dt_status s = dt_error(nccl_status(r), "%s failed %s: %s%s%s", what, where(call, w, sizeof w),
                           ncclGetErrorString(r), detail && *detail ? ": " : "", detail ? detail : "");
    if (st->nc) {
        ncclCommAbort(st->nc);
        st->nc = NULL;
    }
    return set_broken(st, s);
}

static dt_status cuda_fail(nccl_state *st, cudaError_t e, const char *what, const dt_call *call) {
    char w[200];
    return set_broken(st, dt_error(DT_ERR_IO, "%s failed %s: %s", what, where(call, w, sizeof w), cudaGetErrorString(e)));
}

/* ---- waiting with a deadline --------------------------------------------------------- */

static void pause_briefly(unsigned long spins) {
    if (spins < 1000) { sched_yield(); return; }
    struct timespec ts = { 0, 50000 };   /* 50 us: latency is not the point once we wait this long */
    nanosleep(&ts, NULL);
}

static dt_status timed_out(nccl_state *st, const dt_call *call, const char *phase) {
    char w[200];
    if (st->nc) {
        ncclCommAbort(st->nc);
        st->nc = NULL;
    }
    return set_broken(st, dt_error(DT_ERR_TIMEOUT, "timed out after %g s %s (nccl, %s): a peer stopped or died "
                                   "during the operation; the NCCL communicator was aborted",
                                   st->c->timeout_s, where(call, w, sizeof w), phase));
}

/* A non-blocking NCCL call returned r: wait until the communicator leaves ncclInProgress. */
static dt_status settle(nccl_state *st, ncclResult_t r, const char *what, const dt_call *call, double deadline) {
    for (unsigned long spins = 0; r == ncclInProgress; spins++) {
        if (dt_now() > deadline) return timed_out(st, call, what);
        pause_briefly(spins);
        ncclResult_t a = ncclCommGetAsyncError(st->nc, &r);
        if (a != ncclSuccess) r = a;
    }
    if (r != ncclSuccess) return nccl_fail(st, r, what, call);
    return DT_OK;
}

/* Wait for the backend's stream to drain, watching NCCL's asynchronous errors. */
static dt_status wait_stream(nccl_state *st, const dt_call *call, double deadline) {
    for (unsigned long spins = 0;; spins++) {
        cudaError_t q = cudaStreamQuery(st->stream);
        if (q == cudaSuccess) return DT_OK;
        if (q != cudaErrorNotReady) return cuda_fail(st, q, "cudaStreamQuery", call);
        ncclResult_t a = ncclSuccess;
        ncclResult_t g = ncclCommGetAsyncError(st->nc, &a);
        if (g != ncclSuccess) a = g;
        if (a != ncclSuccess && a != ncclInProgress) return nccl_fail(st, a, "NCCL", call);
        if (dt_now() > deadline) return timed_out(st, call, "waiting for the stream");
        pause_briefly(spins);
    }
}

/* ---- the tcp side channel ------------------------------------------------------------ */

/* Run a tcp backend entry with c->priv pointing at its own state. */
#define WITH_TCP(c, st, stmt) do { void *nccl_save_ = (c)->priv; (c)->priv = (st)->tcp; stmt; (c)->priv = nccl_save_; } while (0)

/* Every rank of the call agrees on it before NCCL sees it. Collectives: an all-gather
 * over the tcp side channel of each rank's (fingerprint, sequence number, buffer kind),
 * under a call that is the same on every rank, so it always completes and every rank
 * can name the first rank whose call differs; a rank that never arrives gets the tcp
 * timeout naming it. p2p: a zero-byte message each way whose header carries the
 * fingerprint (host p2p skips it: its message carries the fingerprint itself). */
static const char *kind_name(uint64_t host) { return host ? "host" : "device"; }

static dt_status preflight(nccl_state *st, const dt_call *call, int host) {
    dt_comm *c = st->c;
    if (!st->check || c->size == 1) return DT_OK;
    const dt_p2p *p = &c->p2p;
    dt_status s;
    if (call->kind == DT_CALL_P2P) {
        dt_xfer x = { .dst = call->is_send ? call->root : -1, .src = call->is_send ? -1 : call->root };
        s = p->xfer(p->ctx, &x, call);
        return s == DT_OK ? DT_OK : set_broken(st, s);
    }
    dt_call pre = { .kind = DT_CALL_ALLGATHER, .dtype = DT_U8, .op = DT_SUM, .count = 4 * sizeof(uint64_t),
                    .root = -1, .seq = call->seq, .ctx = call->ctx };
    snprintf(pre.desc, sizeof pre.desc, "%s", call->desc);   /* errors name the real call */
    dt_fp fp = dt_call_fp(call);
    uint64_t mine[4] = { fp.a, fp.b, call->seq, (uint64_t)host };
    uint64_t *all = malloc(sizeof mine * (size_t)c->size);
    if (!all) return dt_error(DT_ERR_NOMEM, "out of memory");
    s = dt_algo_allgather(p, &pre, mine, all);
    for (int k = 0; s == DT_OK && k < c->size; k++) {
        const uint64_t *o = all + 4 * k;
        if (o[0] == fp.a && o[1] == fp.b && o[2] == call->seq) {
            if (o[3] != (uint64_t)host)
                s = dt_error(DT_ERR_MISMATCH, "collective #%llu %s: this rank passed %s buffers, rank %d %s buffers "
                             "(the nccl backend sends device buffers through NCCL and host buffers over its tcp "
                             "side channel: every rank must pass the same kind)", (unsigned long long)call->seq,
                             call->desc, kind_name((uint64_t)host), k, kind_name(o[3]));
            continue;
        }
        char theirs[112];
        dt_fp_describe((dt_fp){ o[0], o[1] }, theirs, sizeof theirs);
        if (o[2] == call->seq)
            s = dt_error(DT_ERR_MISMATCH, "collective #%llu mismatch: this rank called %s, rank %d called %s",
                         (unsigned long long)call->seq, call->desc, k, theirs);
        else
            s = dt_error(DT_ERR_MISMATCH, "mismatch: this rank called %s as its collective #%llu, rank %d called %s "
                         "as its collective #%llu", call->desc, (unsigned long long)call->seq, k, theirs,
                         (unsigned long long)o[2]);
    }
    free(all);
    return s == DT_OK ? DT_OK : set_broken(st, s);
}

/* ---- types ----------------------------------------------------------------------------- */

static ncclDataType_t nccl_type(dt_dtype t) {
    switch (t) {
    case DT_F32:  return ncclFloat32;
    case DT_F64:  return ncclFloat64;
    case DT_F16:  return ncclFloat16;
    case DT_BF16: return ncclBfloat16;
    case DT_I32:  return ncclInt32;
    case DT_I64:  return ncclInt64;
    case DT_U8:   return ncclUint8;
    default:      break;   /* not a collective type (comm.c refuses it) */
    }
    return ncclFloat32;
}

static ncclRedOp_t nccl_op(dt_redop op) {
    switch (op) {
    case DT_SUM:  return ncclSum;
    case DT_AVG:  return ncclAvg;
    case DT_MIN:  return ncclMin;
    case DT_MAX:  return ncclMax;
    case DT_PROD: return ncclProd;
    }
    return ncclSum;
}

/* ---- one operation: checks, ordering, launch, wait ------------------------------------ */

/* 1 for a buffer in host memory (pageable or pinned), 0 for device memory; -1 for NULL.
 * *dev: a device buffer's GPU (-1 when not known). The CUDA backend is asked first: its
 * own buffers are device memory even where a sparse array's granule is not mapped, which
 * cudaPointerGetAttributes reports as unregistered, host, memory. */
static int buf_where(const void *p, int *dev) {
    *dev = -1;
    if (!p) return -1;
    if (dt_cuda_owns(p)) {
        *dev = dt_cuda_device();
        return 0;
    }
    struct cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        cudaGetLastError();   /* an old runtime's "not a CUDA pointer": host memory */
        return 1;
    }
    if (a.type == cudaMemoryTypeDevice) *dev = a.device;
    return a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged;
}

static int is_host(const void *p) {
    int dev;
    return buf_where(p, &dev);
}

/* Start of every operation: fail fast when broken, bind the device, say where the
 * buffers are (*host), agree on the call, and for device buffers order our stream
 * after the compute stream. */
static dt_status begin(dt_comm *c, const dt_call *call, const void *send, const void *recv, nccl_state **out,
                       int *host) {
    nccl_state *st = c->priv;
    *out = st;
    if (st->broken || !st->nc) return dt_error(DT_ERR_PEER, "%s", st->broken_msg[0] ? st->broken_msg : "the NCCL communicator is gone");
    DT_TRY(dt_cuda_bind_thread());
    int da, db, a = buf_where(send, &da), b = buf_where(recv, &db), mine = dt_cuda_device();
    if (a >= 0 && b >= 0 && a != b)
        return dt_error(DT_ERR_INVALID, "%s: the send buffer is %s memory and the receive buffer %s memory; the nccl "
                        "backend takes both on the device or both on the host", call->desc, kind_name((uint64_t)a),
                        kind_name((uint64_t)b));
    if ((da >= 0 && da != mine) || (db >= 0 && db != mine))
        return dt_error(DT_ERR_INVALID, "%s: the %s buffer is memory of GPU %d; this rank's GPU is %d, and NCCL "
                        "takes its buffers there", call->desc, da >= 0 && da != mine ? "send" : "receive",
                        da >= 0 && da != mine ? da : db, mine);
    *host = a > 0 || b > 0;
    if (call->kind == DT_CALL_P2P && *host) return DT_OK;
    DT_TRY(preflight(st, call, *host));
    if (*host) return DT_OK;
    /* NCCL work from here until the call returns (ungate): the CUDA backend makes no
     * device-synchronising call on another thread meanwhile (dt_cuda.h) */
    dt_cuda_collective_begin();
    st->gated = 1;
    if (c->op_token) {   /* an async call: the compute stream as it stood when the call was queued */
        cudaError_t e = cudaStreamWaitEvent(st->stream, (cudaEvent_t)c->op_token, 0);
        return e == cudaSuccess ? DT_OK : cuda_fail(st, e, "cudaStreamWaitEvent", call);
    }
    dt_status s = dt_cuda_stream_wait_compute((void *)st->stream);
    return s == DT_OK ? DT_OK : set_broken(st, s);
}

/* An async call on device buffers: record the compute stream's position now, on the
 * caller's thread (the token begin() waits for on the worker). */
static dt_status nccl_queued(dt_comm *c, const dt_call *call, const void *send, const void *recv, void **token) {
    (void)c;
    *token = NULL;
    if (call->kind == DT_CALL_SPLIT || is_host(send) > 0 || is_host(recv) > 0) return DT_OK;
    DT_TRY(dt_cuda_bind_thread());
    cudaEvent_t ev;
    cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (e != cudaSuccess) return dt_error(DT_ERR_IO, "%s: cudaEventCreateWithFlags failed: %s", call->desc,
                                          cudaGetErrorString(e));
    e = cudaEventRecord(ev, (cudaStream_t)dt_cuda_compute_stream());
    if (e != cudaSuccess) {
        cudaEventDestroy(ev);
        return dt_error(DT_ERR_IO, "%s: cudaEventRecord failed: %s", call->desc, cudaGetErrorString(e));
    }
    *token = ev;
    return DT_OK;
}

static void nccl_dequeued(dt_comm *c, void *token) {
    (void)c;
    cudaEventDestroy((cudaEvent_t)token);   /* a pending wait on it still happens */
}

static dt_status finish(nccl_state *st, ncclResult_t r, const char *what, const dt_call *call) {
    double deadline = dt_now() + st->c->timeout_s;
    DT_TRY(settle(st, r, what, call, deadline));
    return wait_stream(st, call, deadline);
}

/* Device-to-device copy on our stream (in-place rearrangements). */
static dt_status d2d(nccl_state *st, void *dst, const void *src, size_t bytes, const dt_call *call) {
    if (!bytes || dst == src) return DT_OK;
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, st->stream);
    return e == cudaSuccess ? DT_OK : cuda_fail(st, e, "cudaMemcpyAsync", call);
}

static int overlaps(const void *a, size_t an, const void *b, size_t bn) {
    const char *x = a, *y = b;
    return x < y + bn && y < x + an;
}

/* ---- deterministic reductions: host staging + algo.c over the tcp side channel ------- */

static dt_status stage_reserve(nccl_state *st, size_t bytes, const dt_call *call) {
    if (bytes <= st->stage_cap) return DT_OK;
    if (st->stage) cudaFreeHost(st->stage);
    st->stage = NULL;
    st->stage_cap = 0;
    cudaError_t e = cudaHostAlloc(&st->stage, bytes, cudaHostAllocPortable);
    if (e != cudaSuccess) return cuda_fail(st, e, "cudaHostAlloc of the staging buffer", call);
    st->stage_cap = bytes;
    return DT_OK;
}

static dt_status copy_sync(nccl_state *st, void *dst, const void *src, size_t bytes, enum cudaMemcpyKind k,
                           const dt_call *call) {
    if (!bytes) return DT_OK;
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, k, st->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(st->stream);
    return e == cudaSuccess ? DT_OK : cuda_fail(st, e, "cudaMemcpyAsync (staging)", call);
}

/* A call on host buffers: dtrain's own algorithm over the tcp side channel. */
static dt_status on_host(dt_comm *c, nccl_state *st, const dt_call *call, const void *send, void *recv) {
    const dt_p2p *p = &c->p2p;
    dt_status s;
    dt_algo_fn algo = dt_algo_of(call->kind);
    if (algo) {
        s = algo(p, call, send, recv);
    } else {   /* p2p */
        size_t bytes = call->count * dt_dtype_size(call->dtype);
        dt_xfer x = { .dst = call->is_send ? call->root : -1, .sbuf = send, .sbytes = call->is_send ? bytes : 0,
                      .src = call->is_send ? -1 : call->root, .rbuf = recv, .rbytes = call->is_send ? 0 : bytes };
        s = p->xfer(p->ctx, &x, call);
    }
    return s == DT_OK ? DT_OK : set_broken(st, s);
}

/* in_bytes of send go to the host, the algorithm runs there, out_bytes come back to recv. */
static dt_status staged(dt_comm *c, nccl_state *st, const dt_call *call, const void *send, void *recv,
                        size_t in_bytes, size_t out_bytes, int write_back) {
    DT_TRY(stage_reserve(st, in_bytes + out_bytes, call));
    char *hin = st->stage, *hout = hin + in_bytes;
    DT_TRY(copy_sync(st, hin, send, in_bytes, cudaMemcpyDeviceToHost, call));
    DT_TRY(on_host(c, st, call, hin, hout));
    return write_back ? copy_sync(st, recv, hout, out_bytes, cudaMemcpyHostToDevice, call) : DT_OK;
}

/* ---- the deterministic all_reduce on the device ------------------------------------------
 * algo.c's tree with NCCL moving the bytes: step k pairs rank r with r ^ (1 << k), as the
 * tcp backend does, so every element is summed over the same binary tree of ranks; the
 * received half is combined by dt_cuda_combine in reduce.c's arithmetic (the local
 * value first), then recursive doubling gives every rank every block. */

static int pow2(int w) { return w > 0 && (w & (w - 1)) == 0; }

/* One exchange with partner: sn elements of sbuf out, rn into rbuf, in one NCCL group. */
static dt_status exchange(nccl_state *st, const dt_call *call, int partner, const void *sbuf, size_t sn, void *rbuf,
                          size_t rn, double deadline) {
    ncclDataType_t t = nccl_type(call->dtype);
    ncclResult_t r = ncclGroupStart();
    if (r != ncclSuccess) return nccl_fail(st, r, "ncclGroupStart", call);
    if (sn) r = ncclSend(sbuf, sn, t, partner, st->nc, st->stream);
    if (rn && (r == ncclSuccess || r == ncclInProgress)) r = ncclRecv(rbuf, rn, t, partner, st->nc, st->stream);
    ncclResult_t e = ncclGroupEnd();
    if (r != ncclSuccess && r != ncclInProgress) return nccl_fail(st, r, "ncclSend/ncclRecv", call);
    return settle(st, e, "ncclGroupEnd", call, deadline);
}

static dt_status tree_allreduce(dt_comm *c, nccl_state *st, const dt_call *call, const void *send, void *recv) {
    size_t es = dt_dtype_size(call->dtype), n = call->count;
    int W = c->size, r = c->rank, nb = W, lo = 0, hi = W, L = 0, hist[2 * 32];
    while ((1 << L) < W) L++;
    double deadline = dt_now() + c->timeout_s;
    char *work = recv;
    DT_TRY(d2d(st, recv, send, n * es, call));
    size_t tmp = (n / 2 + (size_t)W) * es;   /* the largest half a rank receives */
    if (tmp > st->dtmp_cap) {   /* grown in stream order: cudaFree would wait for the whole device */
        if (st->dtmp) cudaFreeAsync(st->dtmp, st->stream);
        st->dtmp = NULL;
        st->dtmp_cap = 0;
        cudaError_t e = cudaMallocAsync(&st->dtmp, tmp, st->stream);
        if (e != cudaSuccess) return cuda_fail(st, e, "cudaMallocAsync of the all_reduce scratch", call);
        st->dtmp_cap = tmp;
    }
    int op = call->op == DT_PROD ? DT_CUDA_PROD : call->op == DT_MIN ? DT_CUDA_MIN
           : call->op == DT_MAX ? DT_CUDA_MAX : DT_CUDA_SUM;
    for (int k = 0; k < L; k++) {   /* recursive halving: keep one half, receive its other summand */
        int partner = r ^ (1 << k), mid = (lo + hi) / 2, up = (r >> k) & 1;
        int klo = up ? mid : lo, khi = up ? hi : mid, glo = up ? lo : mid, ghi = up ? mid : hi;
        size_t ko = dt_algo_block_offset(n, nb, klo), kn = dt_algo_block_offset(n, nb, khi) - ko;
        size_t go = dt_algo_block_offset(n, nb, glo), gn = dt_algo_block_offset(n, nb, ghi) - go;
        hist[2 * k] = lo;
        hist[2 * k + 1] = hi;
        DT_TRY(exchange(st, call, partner, work + go * es, gn, st->dtmp, kn, deadline));
        dt_status s = dt_cuda_combine(work + ko * es, st->dtmp, kn, call->dtype, op, (void *)st->stream);
        if (s != DT_OK) return set_broken(st, s);
        lo = klo;
        hi = khi;
    }
    for (int k = L - 1; k >= 0; k--) {   /* recursive doubling: swap the blocks each side holds */
        int partner = r ^ (1 << k), low = lo == hist[2 * k];   /* we hold the lower half of hist[k] */
        int olo = low ? hi : hist[2 * k], ohi = low ? hist[2 * k + 1] : lo;
        size_t mo = dt_algo_block_offset(n, nb, lo), mn = dt_algo_block_offset(n, nb, hi) - mo;
        size_t oo = dt_algo_block_offset(n, nb, olo), on = dt_algo_block_offset(n, nb, ohi) - oo;
        DT_TRY(exchange(st, call, partner, work + mo * es, mn, work + oo * es, on, deadline));
        lo = hist[2 * k];
        hi = hist[2 * k + 1];
    }
    if (call->op == DT_AVG) {
        dt_status s = dt_cuda_divide(work, n, call->dtype, W, (void *)st->stream);
        if (s != DT_OK) return set_broken(st, s);
    }
    return wait_stream(st, call, deadline);
}

/* ---- collectives ------------------------------------------------------------------------ */

static dt_status nccl_allreduce_(dt_comm *c, const dt_call *call, const void *send, void *recv) {
    nccl_state *st;
    int host;
    DT_TRY(begin(c, call, send, recv, &st, &host));
    if (host) return on_host(c, st, call, send, recv);
    size_t bytes = call->count * dt_dtype_size(call->dtype);
    if (c->deterministic && pow2(c->size) && c->size > 1) return tree_allreduce(c, st, call, send, recv);
    if (c->deterministic) return staged(c, st, call, send, recv, bytes, bytes, 1);
    return finish(st, ncclAllReduce(send, recv, call->count, nccl_type(call->dtype), nccl_op(call->op), st->nc, st->stream),
                  "ncclAllReduce", call);
}

static dt_status nccl_broadcast_(dt_comm *c, const dt_call *call, const void *send, void *buf) {
    (void)send;   /* the root's data is in buf */
    nccl_state *st;
    int host;
    DT_TRY(begin(c, call, buf, buf, &st, &host));
    if (host) return on_host(c, st, call, buf, buf);
    return finish(st, ncclBroadcast(buf, buf, call->count, nccl_type(call->dtype), call->root, st->nc, st->stream),
                  "ncclBroadcast", call);
}

/* NCCL's in-place all_gather wants send == recv + rank*count; comm.h also allows
 * send == recv (this rank's block at the start) and any disjoint send. */
static dt_status nccl_allgather_(dt_comm *c, const dt_call *call, const void *send, void *recv) {
    nccl_state *st;
    if (call->kind == DT_CALL_SPLIT) {   /* comm.c's agreement on the groups: host memory */
        st = c->priv;
        if (st->broken) return dt_error(DT_ERR_PEER, "%s", st->broken_msg);
        dt_status s = dt_algo_allgather(&c->p2p, call, send, recv);
        return s == DT_OK ? DT_OK : set_broken(st, s);
    }
    int host;
    DT_TRY(begin(c, call, send, recv, &st, &host));
    if (host) return on_host(c, st, call, send, recv);
    size_t cb = call->count * dt_dtype_size(call->dtype);
    char *mine = (char *)recv + (size_t)c->rank * cb;
    const void *src = send;
    if (send != mine && overlaps(send, cb, recv, cb * (size_t)c->size)) {
        DT_TRY(d2d(st, mine, send, cb, call));   /* send == recv: block 0 -> block rank, disjoint for rank > 0 */
        src = mine;
    }
    return finish(st, ncclAllGather(src, recv, call->count, nccl_type(call->dtype), st->nc, st->stream),
                  "ncclAllGather", call);
}

/* NCCL's in-place reduce_scatter wants recv == send + rank*count; for send == recv the
 * result is computed there, then moved to the start. */
static dt_status nccl_reduce_scatter_(dt_comm *c, const dt_call *call, const void *send, void *recv) {
    nccl_state *st;
    int host;
    DT_TRY(begin(c, call, send, recv, &st, &host));
    if (host) return on_host(c, st, call, send, recv);
    size_t rb = call->count * dt_dtype_size(call->dtype), total = rb * (size_t)c->size;
    if (c->deterministic) return staged(c, st, call, send, recv, total, rb, 1);
    char *natural = (char *)send + (size_t)c->rank * rb;
    void *dst = recv;
    if ((char *)recv != natural && overlaps(send, total, recv, rb)) dst = natural;
    DT_TRY(finish(st, ncclReduceScatter(send, dst, call->count, nccl_type(call->dtype), nccl_op(call->op), st->nc,
                                        st->stream), "ncclReduceScatter", call));
    if (dst != recv) {
        DT_TRY(d2d(st, recv, dst, rb, call));
        return wait_stream(st, call, dt_now() + st->c->timeout_s);
    }
    return DT_OK;
}

static dt_status nccl_reduce_(dt_comm *c, const dt_call *call, const void *send, void *recv) {
    nccl_state *st;
    int host;
    DT_TRY(begin(c, call, send, recv, &st, &host));
    if (host) return on_host(c, st, call, send, recv);
    size_t bytes = call->count * dt_dtype_size(call->dtype);
    if (c->deterministic) return staged(c, st, call, send, recv, bytes, bytes, c->rank == call->root);
    return finish(st, ncclReduce(send, c->rank == call->root ? recv : NULL, call->count, nccl_type(call->dtype),
                                 nccl_op(call->op), call->root, st->nc, st->stream), "ncclReduce", call);
}

/* ---- point to point: one ncclSend / ncclRecv in a group ------------------------------- */

static dt_status p2p(dt_comm *c, const dt_call *call, void *buf) {
    nccl_state *st;
    int host;
    DT_TRY(begin(c, call, buf, NULL, &st, &host));
    if (host) return on_host(c, st, call, buf, buf);
    double deadline = dt_now() + c->timeout_s;
    ncclResult_t r = ncclGroupStart();
    if (r != ncclSuccess) return nccl_fail(st, r, "ncclGroupStart", call);
    r = call->is_send ? ncclSend(buf, call->count, nccl_type(call->dtype), call->root, st->nc, st->stream)
                      : ncclRecv(buf, call->count, nccl_type(call->dtype), call->root, st->nc, st->stream);
    ncclResult_t e = ncclGroupEnd();
    if (r != ncclSuccess && r != ncclInProgress) return nccl_fail(st, r, call->is_send ? "ncclSend" : "ncclRecv", call);
    DT_TRY(settle(st, e, "ncclGroupEnd", call, deadline));
    return wait_stream(st, call, deadline);
}


/* ---- set-up and tear-down ---------------------------------------------------------------- */

/* Close the NCCL communicator: finalize (non-blocking, polled within the timeout) and
 * destroy; a broken communicator, or one that does not finalize, is aborted. */
static void comm_close(nccl_state *st) {
    if (!st->nc) return;
    if (!st->broken) {
        ncclResult_t r = ncclCommFinalize(st->nc);
        double deadline = dt_now() + st->c->timeout_s;
        for (unsigned long spins = 0; r == ncclInProgress && dt_now() < deadline; spins++) {
            pause_briefly(spins);
            if (ncclCommGetAsyncError(st->nc, &r) != ncclSuccess) r = ncclInternalError;
        }
        if (r == ncclSuccess && ncclCommDestroy(st->nc) == ncclSuccess) {
            st->nc = NULL;
            return;
        }
    }
    ncclCommAbort(st->nc);
    st->nc = NULL;
}

static void state_free(nccl_state *st) {
    if (!st) return;
    comm_close(st);
    if (st->stream) cudaStreamDestroy(st->stream);
    if (st->stage) cudaFreeHost(st->stage);
    if (st->dtmp) cudaFree(st->dtmp);
    free(st);
}

static dt_status state_new(dt_comm *c, nccl_state **out) {
    nccl_state *st = calloc(1, sizeof *st);
    if (!st) return dt_error(DT_ERR_NOMEM, "out of memory");
    st->c = c;
    const char *chk = getenv("DT_NCCL_CHECK");
    st->check = !(chk && strcmp(chk, "0") == 0);
    cudaError_t e = cudaStreamCreateWithFlags(&st->stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        free(st);
        return dt_error(DT_ERR_IO, "cudaStreamCreateWithFlags failed: %s", cudaGetErrorString(e));
    }
    *out = st;
    return DT_OK;
}

/* Wait for a non-blocking init or split to finish. */
static dt_status settle_init(nccl_state *st, ncclResult_t r, const char *what, double deadline) {
    dt_call call = { .kind = DT_CALL_INIT };
    snprintf(call.desc, sizeof call.desc, "NCCL communicator set-up (%d ranks)", st->c->size);
    return settle(st, r, what, &call, deadline);
}

static void nccl_destroy(dt_comm *c) {
    nccl_state *st = c->priv;
    if (!st) return;
    dt_cuda_bind_thread();
    void *tcp = st->tcp;
    state_free(st);
    c->priv = tcp;
    dt_backend_tcp.destroy(c);
}

/* The GPU of this rank: its local rank modulo the visible devices (dt_cuda.h). Before
 * NCCL starts, every rank all-gathers its PCI bus id (or why it has none) over the side
 * channel, so all ranks fail alike, naming the culprits, when one has no device or two
 * ranks of a host would share one (NCCL would refuse that too, less clearly). */
#define GPU_REC 160
static dt_status pick_device(dt_comm *c) {
    char mine[GPU_REC] = "", *all = NULL;
    int n = 0;
    if (dt_cuda_device_count(&n) == DT_OK && n < 1) dt_error(DT_ERR_UNSUPPORTED, "no CUDA device is visible");
    if (n < 1 || dt_cuda_pci_bus_id(c->local_rank, mine, sizeof mine) != DT_OK)
        snprintf(mine, sizeof mine, "!%.*s", GPU_REC - 2, dt_last_error());
    dt_call call = { .kind = DT_CALL_ALLGATHER, .dtype = DT_U8, .op = DT_SUM, .count = GPU_REC, .root = -1,
                     .ctx = c->ctx };
    snprintf(call.desc, sizeof call.desc, "the GPU check before NCCL starts");
    if (!(all = calloc((size_t)c->size, GPU_REC))) return dt_error(DT_ERR_NOMEM, "out of memory");
    dt_status s = dt_algo_allgather(&c->p2p, &call, mine, all);
    for (int i = 0; s == DT_OK && i < c->size; i++) {
        const char *a = all + (size_t)i * GPU_REC;
        if (a[0] == '!') {
            s = dt_error(DT_ERR_UNSUPPORTED, "nccl: rank %d (%s) has no usable GPU: %s", i, c->hosts[i], a + 1);
            break;
        }
        int shared = 0;
        char ranks[160] = "";
        for (int j = i; j < c->size; j++) {
            const char *b = all + (size_t)j * GPU_REC;
            if (strcmp(c->hosts[i], c->hosts[j]) || strcmp(a, b)) continue;
            size_t used = strlen(ranks);
            if (used < sizeof ranks - 16) snprintf(ranks + used, sizeof ranks - used, "%s%d", shared++ ? ", " : "", j);
        }
        if (shared > 1)
            s = dt_error(DT_ERR_INVALID, "nccl: ranks %s on host %s would share the GPU at PCI bus id %s (%d ranks on "
                         "that host, %d GPU%s visible to this one); NCCL needs one GPU per rank: run fewer ranks per "
                         "host, or give each rank its own GPU (CUDA_VISIBLE_DEVICES)", ranks, c->hosts[i], a,
                         c->local_size, n, n == 1 ? "" : "s");
    }
    free(all);
    return s == DT_OK ? dt_cuda_open(c->local_rank) : s;
}

static dt_status nccl_init(dt_comm *c, const dt_comm_opts *opts) {
    const char *ifn = getenv("DT_SOCKET_IFNAME");
    if (ifn && *ifn && !getenv("NCCL_SOCKET_IFNAME") && setenv("NCCL_SOCKET_IFNAME", ifn, 0) != 0)
        return dt_error(DT_ERR_IO, "cannot set NCCL_SOCKET_IFNAME");
    DT_TRY(dt_backend_tcp.init(c, opts));   /* rank, size, hosts, store, side channel */
    void *tcp = c->priv;
    nccl_state *st = NULL;
    dt_status s = pick_device(c);           /* the device of this local rank */
    if (s == DT_OK) s = state_new(c, &st);
    if (s != DT_OK) {
        dt_backend_tcp.destroy(c);
        return s;
    }
    st->tcp = tcp;
    c->priv = st;
    double deadline = dt_now() + c->timeout_s;

    /* the unique id: made by rank 0, carried by dtrain's store */
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    ncclResult_t r = ncclSuccess;
    if (c->rank == 0) r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) {
        s = dt_error(nccl_status(r), "ncclGetUniqueId failed: %s", ncclGetErrorString(r));
    } else if (c->size > 1) {
        dt_store *store = ((tcp_comm *)tcp)->w->store;
        char key[64];
        snprintf(key, sizeof key, "nccl/unique_id/%u", (unsigned)c->ctx);
        if (c->rank == 0) {
            s = dt_store_set(store, key, &id, sizeof id);
        } else {
            void *v = NULL;
            size_t n = 0;
            double left = deadline - dt_now();
            s = dt_store_get(store, key, &v, &n, left > 0 ? left : 0);
            if (s == DT_OK && n != sizeof id)
                s = dt_error(DT_ERR_FORMAT, "the NCCL unique id in the store has %zu bytes, expected %zu", n, sizeof id);
            if (s == DT_OK) memcpy(&id, v, sizeof id);
            else dt_error_wrap(s, "waiting for rank 0's NCCL unique id in the store: ");
            free(v);
        }
    }
    if (s == DT_OK) {
        ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
        cfg.blocking = 0;
        r = ncclCommInitRankConfig(&st->nc, c->size, id, c->rank, &cfg);
        if (r != ncclSuccess && r != ncclInProgress)
            s = dt_error(nccl_status(r), "ncclCommInitRankConfig failed: %s", ncclGetErrorString(r));
        else
            s = settle_init(st, r, "ncclCommInitRankConfig", deadline);
    }
    if (s != DT_OK) nccl_destroy(c);   /* also the tcp side channel */
    return s;
}

static dt_status nccl_split_(dt_comm *parent, const dt_call *call, int color, int key, dt_comm *child) {
    nccl_state *pst;
    int host;
    DT_TRY(begin(parent, call, NULL, NULL, &pst, &host));
    dt_status s;
    WITH_TCP(parent, pst, s = dt_backend_tcp.split(parent, call, color, key, child));
    if (s != DT_OK) return s;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclComm_t nc = NULL;
    double deadline = dt_now() + parent->timeout_s;
    ncclResult_t r = ncclCommSplit(pst->nc, child ? color : NCCL_SPLIT_NOCOLOR, key, &nc, &cfg);
    if (r != ncclSuccess && r != ncclInProgress) {
        if (child) dt_backend_tcp.split_destroy(child);
        return nccl_fail(pst, r, "ncclCommSplit", call);
    }
    /* a non-blocking split may leave the parent in progress as well as the new
     * communicator: both are polled to the end before either is used again */
    if (!child) return settle(pst, r, "ncclCommSplit", call, deadline);
    void *tcp = child->priv;
    nccl_state *st = NULL;
    if ((s = state_new(child, &st)) != DT_OK) {
        if (nc) ncclCommAbort(nc);
        dt_backend_tcp.split_destroy(child);
        return s;
    }
    st->tcp = tcp;
    st->nc = nc;
    child->priv = st;
    DT_TRY(settle(st, ncclInProgress, "ncclCommSplit", call, deadline));
    return settle(pst, r, "ncclCommSplit", call, deadline);
}

static void nccl_split_destroy(dt_comm *child) {
    nccl_state *st = child->priv;
    if (!st) return;
    dt_cuda_bind_thread();
    void *tcp = st->tcp;
    state_free(st);
    child->priv = tcp;
    dt_backend_tcp.split_destroy(child);
}

/* ---- the table's entries: each call that queued NCCL work (begin) ends its window ---- */

static dt_status ungate(dt_comm *c, dt_status s) {
    nccl_state *st = c->priv;
    if (st && st->gated) {
        st->gated = 0;
        dt_cuda_collective_end();
    }
    return s;
}

static dt_status nccl_allreduce(dt_comm *c, const dt_call *call, const void *send, void *recv) {
    return ungate(c, nccl_allreduce_(c, call, send, recv));
}
static dt_status nccl_broadcast(dt_comm *c, const dt_call *call, const void *send, void *buf) {
    return ungate(c, nccl_broadcast_(c, call, send, buf));
}
static dt_status nccl_allgather(dt_comm *c, const dt_call *call, const void *send, void *recv) {
    return ungate(c, nccl_allgather_(c, call, send, recv));
}
static dt_status nccl_reduce_scatter(dt_comm *c, const dt_call *call, const void *send, void *recv) {
    return ungate(c, nccl_reduce_scatter_(c, call, send, recv));
}
static dt_status nccl_reduce(dt_comm *c, const dt_call *call, const void *send, void *recv) {
    return ungate(c, nccl_reduce_(c, call, send, recv));
}
static dt_status nccl_send(dt_comm *c, const dt_call *call, const void *buf) { return ungate(c, p2p(c, call, (void *)buf)); }
static dt_status nccl_recv(dt_comm *c, const dt_call *call, void *buf) { return ungate(c, p2p(c, call, buf)); }
static dt_status nccl_split(dt_comm *parent, const dt_call *call, int color, int key, dt_comm *child) {
    return ungate(parent, nccl_split_(parent, call, color, key, child));
}

/* "NCCL 2.27.3", and the header's version when the library loaded is another. */
static void nccl_library(char *buf, size_t n) {
    int v = 0;
    if (ncclGetVersion(&v) != ncclSuccess) { snprintf(buf, n, "NCCL (version unknown)"); return; }
    int len = snprintf(buf, n, "NCCL %d.%d.%d", v / 10000, v / 100 % 100, v % 100);
    if (v != NCCL_VERSION_CODE && len > 0 && (size_t)len < n)
        snprintf(buf + len, n - (size_t)len, " (built against %d.%d.%d)", NCCL_VERSION_CODE / 10000,
                 NCCL_VERSION_CODE / 100 % 100, NCCL_VERSION_CODE % 100);
}

/* Every collective of the list needs NCCL's own call here: comm.c's fallback, algo.c over
 * c->p2p, is the tcp side channel, which cannot read device buffers (barrier has none). */
_Static_assert(DT_COLL_COUNT == 6, "a collective added to coll.h needs its nccl_ function in this table");

const dt_backend dt_backend_nccl = {
    .name           = "nccl",
    .device_buffers = 1,
    .init           = nccl_init,
    .destroy        = nccl_destroy,
    .allreduce      = nccl_allreduce,
    .broadcast      = nccl_broadcast,
    .allgather      = nccl_allgather,
    .reduce_scatter = nccl_reduce_scatter,
    .reduce         = nccl_reduce,
    /* barrier: NULL, so comm.c runs algo.c's barrier over the tcp side channel */
    .send           = nccl_send,
    .recv           = nccl_recv,
    .split          = nccl_split,
    .split_destroy  = nccl_split_destroy,
    .library        = nccl_library,
    .queued         = nccl_queued,
    .dequeued       = nccl_dequeued,
};
