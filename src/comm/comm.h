/*
 * comm.h: dtrain's communication interface — communicators and collectives.
 *
 * Everything above src/comm/ (DDP, sharding, the trainer) talks to other ranks only
 * through this header (docs/DESIGN.md rule 1). A communicator is created once per process
 * with dt_comm_init(); the backend is chosen by name ("tcp": sockets + shared memory
 * for same-host peers, always built; "mpi" when configured with MPI; "nccl" with NCCL).
 *
 * Conventions:
 *   - counts are in elements of the given dtype, never bytes;
 *   - send == recv means in place (for all_gather: send may also be recv + rank*count;
 *     for reduce_scatter: recv may also be send + rank*recv_count);
 *   - every call is collective over the communicator unless it says otherwise, and
 *     every rank must issue the same collectives in the same order: a rank that calls
 *     a different one gets DT_ERR_MISMATCH naming both calls, never wrong data;
 *   - every blocking wait honours the communicator's timeout (docs/DESIGN.md rule 3);
 *   - one thread at a time issues calls on a communicator (its async work runs on the
 *     communicator's own worker thread);
 *   - errors come back as a dt_status with a message for dt_last_error() that starts
 *     with "rank R: ". After a transport error the communicator is broken: later calls
 *     fail fast with the same message; destroy it.
 *
 * Environment (each overridden by the corresponding option where there is one):
 *   DT_BACKEND        tcp | mpi | nccl                 DT_TIMEOUT       seconds (600)
 *   DT_DETERMINISTIC  1: mpi/nccl run dtrain's tree    DT_SHM           0: no shared memory
 *   DT_SOCKET_IFNAME  "eth0,ib0" or "^docker0": interfaces for peer connections
 *   DT_SHM_SPIN_US    busy-wait before sleeping on shared memory (default 1000 in blocking
 *                     calls, 20 on the async worker; 200 and 5 when ranks outnumber
 *                     cores, spinning by sched_yield); a rank whose peer runs on the
 *                     same CPU yields to it instead
 *   DT_SHM_BUDGET     bytes of shared-memory rings a rank may create, e.g. 8M (default:
 *                     its share of 1/8 of the host's memory, at most 32M); peers past it
 *                     talk over TCP
 *   DT_CMA            1: same-host ranks read large collective messages (>= 1 MiB) from
 *                     the sender's memory instead of through the ring (faster when the
 *                     ranks do not share a cache or compete for cores); 0: never
 *   RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, DT_JOB_ID, ... (launch_env.h)
 *   Under mpirun with neither MASTER_ADDR nor MASTER_PORT set, a build with MPI finds
 *   rank 0's store through MPI and then sets MASTER_ADDR, MASTER_PORT and (when unset)
 *   DT_JOB_SECRET in every rank's environment (mpi_boot.h).
 *
 * Reduction order: on the "tcp" backend (and "mpi" in deterministic mode) all_reduce,
 * reduce_scatter and reduce over a power-of-two world size sum every element over one
 * fixed binary tree of ranks ((0,1),(2,3) first, then (01,23), ...), so a rank that
 * pre-sums its 2 local buffers pairwise and joins a world of W/2 ranks gets the same
 * bits as W ranks with one buffer each (docs/DESIGN.md rule 2).
 */
#ifndef DT_COMM_H
#define DT_COMM_H

#include <stddef.h>
#include <stdint.h>
#include "dtype.h"
#include "status.h"

/* ---- element types and reduction operators ----------------------------------- */

/* Element types are dt_dtype (dtype.h). The collectives take the first
 * DT_COMM_NDTYPES of them: f32, f64, f16, bf16, i32, i64, u8. */
#define DT_COMM_NDTYPES 7
/* avg = sum, then divide by the number of ranks (integer types: truncating division).
 * f16/bf16 are combined in f32 and rounded back to nearest-even at every step. */
typedef enum { DT_SUM, DT_AVG, DT_MIN, DT_MAX, DT_PROD } dt_redop;
#define DT_REDOP_COUNT 5

DT_API const char *dt_redop_name (dt_redop op);                       /* "sum", "avg", ...; "?" if invalid */
DT_API dt_status   dt_redop_parse(const char *s, dt_redop *out);      /* "sum" | "avg" | "mean" | ... */

/* ---- communicators -------------------------------------------------------------- */

typedef struct dt_comm dt_comm;   /* opaque */
typedef struct dt_work dt_work;   /* an asynchronous operation in flight */

typedef struct {
    const char *backend;       /* "tcp" | "mpi" | "nccl"; NULL: $DT_BACKEND or "tcp" */
    const char *init_method;   /* "env://" | "tcp://host:port" | "file:///path"; NULL: env:// */
    int         rank, size;    /* -1: from the launch environment (launch_env.h) */
    double      timeout_s;     /* <= 0: $DT_TIMEOUT (seconds) or 600 */
    const char *job_id;        /* NULL: the launch environment's job id ("" if none) */
    int         deterministic; /* -1: $DT_DETERMINISTIC (mpi/nccl: use dtrain's own tree) */
    const char *secure;        /* tcp: seal the frames between ranks after the handshake, "off",
                                * "auth" (integrity) or "encrypt" (and secrecy); NULL: $DT_SECURE
                                * or off (docs/security.md; every rank the same) */
} dt_comm_opts;

/* Defaults: every field "from the environment". */
DT_API void        dt_comm_opts_default(dt_comm_opts *opts);

/* Join the job: rendezvous through the store, connect to every peer, exchange host
 * names. Collective over all ranks of the job. */
DT_API dt_status   dt_comm_init   (const dt_comm_opts *opts, dt_comm **out);
/* Wait for pending async work, close connections, free. NULL is fine. Not collective. */
DT_API void        dt_comm_destroy(dt_comm *c);

DT_API int         dt_comm_rank      (const dt_comm *c);             /* 0 .. size-1 */
DT_API int         dt_comm_size      (const dt_comm *c);
DT_API int         dt_comm_local_rank(const dt_comm *c);             /* index among ranks on this host */
DT_API int         dt_comm_local_size(const dt_comm *c);             /* ranks on this host */
DT_API int         dt_comm_node_rank (const dt_comm *c);             /* index of this host (order of first rank) */
DT_API const char *dt_comm_backend   (const dt_comm *c);             /* "tcp", "mpi", "nccl" */
/* The library under the backend and its version ("NCCL 2.27.3", "Open MPI v4.1.4") into
 * buf; "" for tcp (dtrain's own). Returns buf. */
DT_API const char *dt_comm_library   (const dt_comm *c, char *buf, size_t n);
/* How the ranks found each other: "env:// HOST:PORT", "tcp://HOST:PORT", "file:///PATH",
 * "mpirun HOST:PORT" (mpirun set no MASTER_ADDR/MASTER_PORT: rank 0's store address went
 * through MPI, see README), "MPI_COMM_WORLD" (mpi backend); "" for a world of one. */
DT_API const char *dt_comm_rendezvous(const dt_comm *c);
/* How the traffic between ranks is sealed (dt_comm_opts.secure): "off", or the mode and
 * the cipher, "encrypt (AES-256-GCM)" (both ciphers named where the pairs differ). */
DT_API const char *dt_comm_secure(const dt_comm *c);
DT_API int         dt_comm_device_buffers(const dt_comm *c);     /* 1: takes device (GPU) buffers (nccl; host ones too) */
DT_API const char *dt_comm_host      (const dt_comm *c, int rank);   /* that rank's host name; NULL if out of range */
DT_API dt_status   dt_comm_set_timeout(dt_comm *c, double seconds);  /* for later calls; > 0 */
DT_API double      dt_comm_timeout   (const dt_comm *c);
/* The bytes of shared-memory rings one rank of the tcp backend holds mapped (and counts
 * as communication memory, mem.h) when `local` ranks of a job share its host, with this
 * process's DT_SHM and DT_SHM_BUDGET: rings to and from each partner of the collectives,
 * log2(local) of them on a power-of-two host (halving/doubling pairs), at most the
 * budget's worth otherwise. For planning; 0 for one rank or DT_SHM=0. */
DT_API dt_status   dt_comm_shm_plan  (int local, size_t *bytes);
/* The bytes of one such ring with its control block: what a rank maps beyond the plan's
 * for each direction of traffic with a rank that is not a partner of the collectives
 * (a pipeline's neighbour). 0 for one rank or DT_SHM=0. */
DT_API dt_status   dt_comm_shm_ring  (int local, size_t *bytes);

/* Ranks with the same color form a new communicator, ordered by (key, old rank).
 * color < 0: this rank joins none and *out = NULL. Collective over c. */
DT_API dt_status   dt_comm_split(dt_comm *c, int color, int key, dt_comm **out);

/* ---- collectives (blocking) ------------------------------------------------------ */

/* recv[i] = op over ranks of send[i]; count elements. */
DT_API dt_status dt_allreduce     (dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t, dt_redop op);
/* buf on every rank = buf on root. */
DT_API dt_status dt_broadcast     (dt_comm *c, void *buf, size_t count, dt_dtype t, int root);
/* recv is (size, count_per_rank): block r = send of rank r. */
DT_API dt_status dt_allgather     (dt_comm *c, const void *send, void *recv, size_t count_per_rank, dt_dtype t);
/* send is (size, recv_count); recv = block `rank` of the elementwise reduction. */
DT_API dt_status dt_reduce_scatter(dt_comm *c, const void *send, void *recv, size_t recv_count, dt_dtype t, dt_redop op);
/* Like all_reduce, but only root's recv is written (recv may be NULL elsewhere). */
DT_API dt_status dt_reduce        (dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t, dt_redop op, int root);
/* Returns when every rank has entered it. */
DT_API dt_status dt_barrier       (dt_comm *c);

/* ---- point to point (not collective: only the two ranks take part) -------------- */

/* Messages between a pair arrive in the order sent; the receiver's peer, tag, count
 * and dtype must match the sender's (a mismatch is DT_ERR_MISMATCH). They share the
 * pair's stream with the collectives: receive a message before joining a collective the
 * sender joined after sending it. A large send may block until the peer receives it. */
DT_API dt_status dt_send(dt_comm *c, const void *buf, size_t count, dt_dtype t, int peer, int tag);
DT_API dt_status dt_recv(dt_comm *c, void *buf, size_t count, dt_dtype t, int peer, int tag);

/* ---- asynchronous collectives ------------------------------------------------------ */

/* Queue the operation on the communicator's worker thread and return at once. Work runs
 * in issue order; a blocking call issued while work is pending waits for it first.
 * Buffers must stay valid and untouched until dt_work_wait/dt_work_test says done.
 * Argument errors are reported here, transport errors by dt_work_wait. */
DT_API dt_status dt_allreduce_async     (dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t, dt_redop op, dt_work **w);
DT_API dt_status dt_broadcast_async     (dt_comm *c, void *buf, size_t count, dt_dtype t, int root, dt_work **w);
DT_API dt_status dt_allgather_async     (dt_comm *c, const void *send, void *recv, size_t count_per_rank, dt_dtype t, dt_work **w);
DT_API dt_status dt_reduce_scatter_async(dt_comm *c, const void *send, void *recv, size_t recv_count, dt_dtype t, dt_redop op, dt_work **w);

/* Block until done; return the operation's status (its message set on this thread)
 * and free the handle. Handles stay valid after dt_comm_destroy (which waits for the
 * work to finish), so they may be waited on or tested later. */
DT_API dt_status dt_work_wait(dt_work *w);
/* 1 when done (dt_work_wait will not block), 0 when still running. */
DT_API int       dt_work_test(dt_work *w);

#endif /* DT_COMM_H */
