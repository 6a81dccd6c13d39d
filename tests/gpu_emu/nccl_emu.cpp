/* gpu_emu/nccl_emu.cpp: the NCCL stand-in (see nccl.h here): communicators over dtrain's
 * own tcp backend between real processes, operations queued on gpu_emu's lazy streams. */
#include "nccl.h"

#include <algorithm>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string>
#include <unistd.h>
#include <vector>

extern "C" {
#include "comm.h"
#include "status.h"
}

struct emu_nccl {
    dt_comm              *c = NULL;
    int                   rank = 0, size = 1, device = 0;
    ncclResult_t          async = ncclSuccess;
    int                   blocking = 1;   /* config.blocking */
    long                  pending = 0;    /* a non-blocking split still "in progress": polls left */
    std::string           last;
    std::string           dir;     /* the rendezvous directory rank 0 of a world removes */
};

static thread_local std::string t_last;

static ncclResult_t nfail(emu_nccl *nc, ncclResult_t r, const std::string &msg) {
    fprintf(stderr, "gpu_emu: %s\n", msg.c_str());
    (nc ? nc->last : t_last) = msg;
    return r;
}

/* ---- types ---- */

static int dtype_of(ncclDataType_t t, dt_dtype *out) {
    switch (t) {
    case ncclFloat32:  *out = DT_F32; return 1;
    case ncclFloat64:  *out = DT_F64; return 1;
    case ncclFloat16:  *out = DT_F16; return 1;
    case ncclBfloat16: *out = DT_BF16; return 1;
    case ncclInt32:    *out = DT_I32; return 1;
    case ncclInt64:    *out = DT_I64; return 1;
    case ncclUint8:    *out = DT_U8; return 1;
    default:           return 0;
    }
}

static dt_redop op_of(ncclRedOp_t op) {
    switch (op) {
    case ncclProd: return DT_PROD;
    case ncclMax:  return DT_MAX;
    case ncclMin:  return DT_MIN;
    case ncclAvg:  return DT_AVG;
    default:       return DT_SUM;
    }
}

/* ---- checks and queueing ---- */

/* The communicator is usable and the type known; *es = its element size. */
#define TRY(x) do { ncclResult_t r_ = (x); if (r_ != ncclSuccess) return r_; } while (0)

/* A non-blocking communicator that is "in progress" (a split not yet polled to its end)
 * takes no other call: NCCL requires ncclCommGetAsyncError to leave ncclInProgress first. */
static ncclResult_t not_pending(emu_nccl *nc, const char *call) {
    if (nc->pending <= 0) return ncclSuccess;
    return nfail(nc, ncclInvalidUsage, std::string(call) + ": the communicator's ncclCommSplit is still in progress "
                 "(ncclCommGetAsyncError has not yet reported its end)");
}

static ncclResult_t start(emu_nccl *nc, const char *call, ncclDataType_t t, dt_dtype *dt) {
    if (!nc) return nfail(NULL, ncclInvalidArgument, std::string(call) + ": comm is NULL");
    TRY(not_pending(nc, call));
    if (nc->async != ncclSuccess) return nfail(nc, ncclInvalidUsage, std::string(call) + ": the communicator has "
                                               "an error (ncclCommGetAsyncError): " + nc->last);
    if (!dtype_of(t, dt)) return nfail(nc, ncclInvalidArgument, std::string(call) + ": a type the emulation lacks");
    return ncclSuccess;
}

static ncclResult_t buf_ok(emu_nccl *nc, const char *call, const char *arg, const void *p, size_t bytes) {
    char msg[400];
    if (emu_check_range(call, arg, p, bytes, msg, sizeof msg)) return ncclSuccess;
    return nfail(nc, ncclInvalidArgument, msg);
}

/* Queue op on the stream; a failure stalls the stream (a hung NCCL kernel) and becomes
 * the communicator's asynchronous error. */
static ncclResult_t enqueue(emu_nccl *nc, const char *call, cudaStream_t s, std::function<dt_status()> op) {
    emu_enqueue(s, call, nc, [nc, call, op] {
        if (nc->async != ncclSuccess) return false;
        if (op() == DT_OK) return true;
        nc->async = ncclRemoteError;
        nfail(nc, ncclRemoteError, std::string(call) + ": " + dt_last_error());
        return false;
    });
    return ncclSuccess;
}

/* ---- set-up ---- */

extern "C" ncclResult_t ncclGetVersion(int *v) { *v = NCCL_VERSION_CODE; return ncclSuccess; }

extern "C" ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    memset(id, 0, sizeof *id);
    const char *tmp = getenv("TMPDIR");
    char dir[96];
    snprintf(dir, sizeof dir, "%s/gpu_emu-nccl-XXXXXX", tmp && *tmp && strlen(tmp) < 60 ? tmp : "/tmp");
    if (!mkdtemp(dir)) return nfail(NULL, ncclSystemError, "ncclGetUniqueId: cannot make a rendezvous directory");
    snprintf(id->internal, sizeof id->internal, "file://%s/rdzv", dir);
    return ncclSuccess;
}

/* Rank 0's rendezvous directory, from the id. */
static std::string id_dir(const ncclUniqueId &id) {
    std::string p(id.internal + 7);
    return p.substr(0, p.rfind('/'));
}

static void remove_dir(const std::string &dir) {
    if (dir.empty()) return;
    if (DIR *d = opendir(dir.c_str())) {
        while (struct dirent *e = readdir(d))
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) unlink((dir + "/" + e->d_name).c_str());
        closedir(d);
    }
    rmdir(dir.c_str());
}

/* NCCL refuses two ranks of one communicator on one GPU: compare (host, PCI bus id). */
static ncclResult_t no_duplicate_gpu(emu_nccl *nc) {
    char mine[128] = {0}, bus[32] = "?";
    cudaDeviceGetPCIBusId(bus, sizeof bus, nc->device);
    char host[80] = "?";
    gethostname(host, sizeof host - 1);
    snprintf(mine, sizeof mine, "%s %s", host, bus);
    std::vector<char> all((size_t)nc->size * sizeof mine);
    if (dt_allgather(nc->c, mine, all.data(), sizeof mine, DT_U8) != DT_OK)
        return nfail(nc, ncclSystemError, std::string("ncclCommInitRank: ") + dt_last_error());
    for (int r = 0; r < nc->size; r++)
        if (r != nc->rank && !strcmp(&all[(size_t)r * sizeof mine], mine)) {
            char msg[300];
            snprintf(msg, sizeof msg, "ncclCommInitRank: Duplicate GPU detected : rank %d and rank %d both on CUDA "
                     "device %s (%s)", r < nc->rank ? r : nc->rank, r < nc->rank ? nc->rank : r, bus, host);
            return nfail(nc, ncclInvalidUsage, msg);
        }
    return ncclSuccess;
}

extern "C" ncclResult_t ncclCommInitRankConfig(ncclComm_t *out, int nranks, ncclUniqueId id, int rank,
                                               ncclConfig_t *cfg) {
    *out = NULL;
    if (nranks < 1 || rank < 0 || rank >= nranks)
        return nfail(NULL, ncclInvalidArgument, "ncclCommInitRank: rank " + std::to_string(rank) + " of " +
                                                    std::to_string(nranks));
    if (strncmp(id.internal, "file:///", 8) != 0)
        return nfail(NULL, ncclInvalidArgument, "ncclCommInitRank: the id was not made by ncclGetUniqueId");
    emu_nccl *nc = new emu_nccl;
    nc->rank = rank;
    nc->size = nranks;
    nc->device = emu_device();
    nc->blocking = !cfg || cfg->blocking != 0;
    dt_comm_opts o;
    dt_comm_opts_default(&o);
    o.backend = "tcp";
    o.init_method = id.internal;
    o.rank = rank;
    o.size = nranks;
    o.job_id = "gpu_emu-nccl";
    o.deterministic = 1;
    if (dt_comm_init(&o, &nc->c) != DT_OK) {
        ncclResult_t r = nfail(NULL, ncclSystemError, std::string("ncclCommInitRank: ") + dt_last_error());
        if (rank == 0) remove_dir(id_dir(id));
        delete nc;
        return r;
    }
    if (rank == 0) nc->dir = id_dir(id);
    ncclResult_t r = no_duplicate_gpu(nc);
    if (r != ncclSuccess) {
        t_last = nc->last;
        dt_comm_destroy(nc->c);
        remove_dir(nc->dir);
        delete nc;
        return r;
    }
    *out = nc;
    return ncclSuccess;
}

extern "C" ncclResult_t ncclCommInitRank(ncclComm_t *out, int nranks, ncclUniqueId id, int rank) {
    return ncclCommInitRankConfig(out, nranks, id, rank, NULL);
}

/* On a non-blocking parent the split is done at once but reported "in progress" on the
 * parent (at least one poll, K more with DT_GPU_EMU_NOTREADY=K), as NCCL may: a caller
 * that does not poll the parent to the end fails its next call on it. */
extern "C" ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *out, ncclConfig_t *cfg) {
    *out = NULL;
    if (!comm) return nfail(NULL, ncclInvalidArgument, "ncclCommSplit: comm is NULL");
    TRY(not_pending(comm, "ncclCommSplit"));
    dt_comm *child = NULL;
    if (dt_comm_split(comm->c, color == NCCL_SPLIT_NOCOLOR ? -1 : color, key, &child) != DT_OK)
        return nfail(comm, ncclSystemError, std::string("ncclCommSplit: ") + dt_last_error());
    if (!comm->blocking) comm->pending = 1 + emu_not_ready_count();
    if (child) {
        emu_nccl *nc = new emu_nccl;
        nc->c = child;
        nc->rank = dt_comm_rank(child);
        nc->size = dt_comm_size(child);
        nc->device = comm->device;
        nc->blocking = cfg ? cfg->blocking != 0 : comm->blocking;
        *out = nc;
    }
    return comm->blocking ? ncclSuccess : ncclInProgress;
}

static void comm_free(emu_nccl *nc) {
    emu_drop_owner(nc);
    dt_comm_destroy(nc->c);
    remove_dir(nc->dir);
    delete nc;
}

extern "C" ncclResult_t ncclCommFinalize(ncclComm_t comm) {
    if (!comm) return ncclInvalidArgument;
    cudaDeviceSynchronize();   /* flush: running queued work early is always allowed */
    return comm->async;
}

extern "C" ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    if (comm) comm_free(comm);
    return ncclSuccess;
}

extern "C" ncclResult_t ncclCommAbort(ncclComm_t comm) {
    if (comm) comm_free(comm);
    return ncclSuccess;
}

extern "C" ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *async) {
    if (!comm) return ncclInvalidArgument;
    if (comm->async == ncclSuccess && comm->pending > 0) {   /* a split's end, after its polls */
        comm->pending--;
        *async = ncclInProgress;
        return ncclSuccess;
    }
    *async = comm->async == ncclSuccess && emu_not_ready_of(comm) ? ncclInProgress : comm->async;
    return ncclSuccess;
}

extern "C" ncclResult_t ncclCommCount(const ncclComm_t comm, int *n) { *n = comm->size; return ncclSuccess; }
extern "C" ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *r) { *r = comm->rank; return ncclSuccess; }

extern "C" const char *ncclGetErrorString(ncclResult_t r) {
    switch (r) {
    case ncclSuccess:            return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError:        return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError:      return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument:    return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage:       return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError:        return "remote process exited or there was a network error";
    case ncclInProgress:         return "NCCL operation in progress";
    }
    return "unknown result code";
}

extern "C" const char *ncclGetLastError(ncclComm_t comm) { return comm ? comm->last.c_str() : t_last.c_str(); }

/* ---- collectives ---- */

extern "C" ncclResult_t ncclAllReduce(const void *s, void *r, size_t n, ncclDataType_t t, ncclRedOp_t op,
                                      ncclComm_t nc, cudaStream_t st) {
    dt_dtype dt;
    TRY(start(nc, "ncclAllReduce", t, &dt));
    size_t b = n * dt_dtype_size(dt);
    TRY(buf_ok(nc, "ncclAllReduce", "sendbuff", s, b));
    TRY(buf_ok(nc, "ncclAllReduce", "recvbuff", r, b));
    dt_comm *c = nc->c;
    return enqueue(nc, "ncclAllReduce", st, [=] { return dt_allreduce(c, s, r, n, dt, op_of(op)); });
}

extern "C" ncclResult_t ncclBroadcast(const void *s, void *r, size_t n, ncclDataType_t t, int root, ncclComm_t nc,
                                      cudaStream_t st) {
    dt_dtype dt;
    TRY(start(nc, "ncclBroadcast", t, &dt));
    size_t b = n * dt_dtype_size(dt);
    if (nc->rank == root) TRY(buf_ok(nc, "ncclBroadcast", "sendbuff", s, b));
    TRY(buf_ok(nc, "ncclBroadcast", "recvbuff", r, b));
    dt_comm *c = nc->c;
    int me = nc->rank;
    return enqueue(nc, "ncclBroadcast", st, [=] {
        if (me == root && s != r) memmove(r, s, b);
        return dt_broadcast(c, r, n, dt, root);
    });
}

extern "C" ncclResult_t ncclReduce(const void *s, void *r, size_t n, ncclDataType_t t, ncclRedOp_t op, int root,
                                   ncclComm_t nc, cudaStream_t st) {
    dt_dtype dt;
    TRY(start(nc, "ncclReduce", t, &dt));
    size_t b = n * dt_dtype_size(dt);
    TRY(buf_ok(nc, "ncclReduce", "sendbuff", s, b));
    if (nc->rank == root) TRY(buf_ok(nc, "ncclReduce", "recvbuff", r, b));
    dt_comm *c = nc->c;
    return enqueue(nc, "ncclReduce", st, [=] { return dt_reduce(c, s, r, n, dt, op_of(op), root); });
}

extern "C" ncclResult_t ncclAllGather(const void *s, void *r, size_t n, ncclDataType_t t, ncclComm_t nc,
                                      cudaStream_t st) {
    dt_dtype dt;
    TRY(start(nc, "ncclAllGather", t, &dt));
    size_t b = n * dt_dtype_size(dt);
    TRY(buf_ok(nc, "ncclAllGather", "sendbuff", s, b));
    TRY(buf_ok(nc, "ncclAllGather", "recvbuff", r, b * (size_t)nc->size));
    dt_comm *c = nc->c;
    return enqueue(nc, "ncclAllGather", st, [=] { return dt_allgather(c, s, r, n, dt); });
}

extern "C" ncclResult_t ncclReduceScatter(const void *s, void *r, size_t n, ncclDataType_t t, ncclRedOp_t op,
                                          ncclComm_t nc, cudaStream_t st) {
    dt_dtype dt;
    TRY(start(nc, "ncclReduceScatter", t, &dt));
    size_t b = n * dt_dtype_size(dt);
    TRY(buf_ok(nc, "ncclReduceScatter", "sendbuff", s, b * (size_t)nc->size));
    TRY(buf_ok(nc, "ncclReduceScatter", "recvbuff", r, b));
    dt_comm *c = nc->c;
    return enqueue(nc, "ncclReduceScatter", st, [=] { return dt_reduce_scatter(c, s, r, n, dt, op_of(op)); });
}

/* ---- point to point, grouped ---- */

struct p2p_op {
    int          send;
    void        *buf;
    size_t       bytes;
    int          peer;
    emu_nccl    *nc;
    cudaStream_t st;
};
static thread_local int group_depth;
static thread_local std::vector<p2p_op> group_ops;

/* Queue one group's operations (one communicator and stream): per peer, in order of first
 * appearance, the lower rank sends first. */
static ncclResult_t flush_group(void) {
    std::vector<p2p_op> ops;
    ops.swap(group_ops);
    if (ops.empty()) return ncclSuccess;
    emu_nccl *nc = ops[0].nc;
    for (auto &o : ops)
        if (o.nc != nc || o.st != ops[0].st)
            return nfail(nc, ncclInvalidUsage, "ncclGroupEnd: the emulation takes one communicator and stream a group");
    std::vector<int> peers;
    for (auto &o : ops)
        if (std::find(peers.begin(), peers.end(), o.peer) == peers.end()) peers.push_back(o.peer);
    dt_comm *c = nc->c;
    int me = nc->rank;
    return enqueue(nc, ops[0].send ? "ncclSend" : "ncclRecv", ops[0].st, [=] {
        for (int p : peers)
            for (int pass = 0; pass < 2; pass++) {
                int sends = (pass == 0) == (me < p);   /* the lower rank's first pass sends */
                for (auto &o : ops) {
                    if (o.peer != p || o.send != sends) continue;
                    dt_status s = o.send ? dt_send(c, o.buf, o.bytes, DT_U8, p, 0) : dt_recv(c, o.buf, o.bytes, DT_U8, p, 0);
                    if (s != DT_OK) return s;
                }
            }
        return DT_OK;
    });
}

static ncclResult_t p2p(int send, const char *call, void *buf, size_t n, ncclDataType_t t, int peer, emu_nccl *nc,
                        cudaStream_t st) {
    dt_dtype dt;
    TRY(start(nc, call, t, &dt));
    if (peer < 0 || peer >= nc->size || peer == nc->rank)
        return nfail(nc, ncclInvalidArgument, std::string(call) + ": peer " + std::to_string(peer) + " is not another rank");
    size_t b = n * dt_dtype_size(dt);
    TRY(buf_ok(nc, call, send ? "sendbuff" : "recvbuff", buf, b));
    group_ops.push_back(p2p_op{send, buf, b, peer, nc, st});
    return group_depth ? ncclSuccess : flush_group();
}

extern "C" ncclResult_t ncclSend(const void *s, size_t n, ncclDataType_t t, int peer, ncclComm_t nc, cudaStream_t st) {
    return p2p(1, "ncclSend", (void *)s, n, t, peer, nc, st);
}
extern "C" ncclResult_t ncclRecv(void *r, size_t n, ncclDataType_t t, int peer, ncclComm_t nc, cudaStream_t st) {
    return p2p(0, "ncclRecv", r, n, t, peer, nc, st);
}

extern "C" ncclResult_t ncclGroupStart(void) { group_depth++; return ncclSuccess; }
extern "C" ncclResult_t ncclGroupEnd(void) {
    if (group_depth <= 0) return nfail(NULL, ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
    return --group_depth ? ncclSuccess : flush_group();
}
