/*
 * tcp_impl.h: state shared by the tcp backend's setup (tcp.c) and data path (tcp_xfer.c).
 *
 * One tcp_world per process holds the full mesh of connections of the world
 * communicator; communicators split from it reuse those connections through a rank map
 * (comm.c serialises the family's operations, and every message header carries the
 * communicator's context id, so streams of different communicators cannot be confused).
 */
#ifndef DT_TCP_IMPL_H
#define DT_TCP_IMPL_H

#include "comm_impl.h"
#include "shm.h"
#include "store.h"
#include "auth.h"

/* Message header, on sockets and rings alike (little-endian):
 *   magic u32, ctx u32, seq u64, fp.a u64, fp.b u64, payload bytes u64 */
#define TCP_MSG_MAGIC 0x534d5444u   /* "DTMS" */
#define SHM_SKIP_MAGIC 0x4b534444u  /* "DDSK": ring record "skip to the start of the ring" */
#define TCP_HDR_BYTES 40
#define SHM_HDR_BYTES 64            /* ring records are 64-byte aligned */
/* A ring header whose bytes 40..43 hold CMA_MAGIC carries no payload: the receiver reads
 * the bytes straight out of the sender's buffer at the address in bytes 48..55
 * (process_vm_readv) and acknowledges through the ring's ack counter (tcp_xfer.c). */
#define CMA_MAGIC 0x414d4344u       /* "DCMA" */

typedef struct {
    int          fd;                /* connection to the peer; -1 for this rank */
    dt_shm_ring *in, *out;          /* same-host rings, or NULL for TCP */
    int          pid;               /* the peer's process id */
    int          cma;               /* 0: no cross-memory reads with this peer; 1: both sides
                                       can read each other's memory (process_vm_readv) and
                                       accept such messages; 2: and this side sends large
                                       collective messages that way (DT_CMA=1) */
    uint64_t     cma_sent;          /* cross-memory messages sent to it (acks expected) */
} tcp_peer;

typedef struct {
    int              rank, size;
    tcp_peer        *peers;         /* [size] */
    dt_auth          auth;          /* the job secret and id every connection proves */
    dt_store_server *server;        /* rank 0 only */
    dt_store        *store;
    char             file_path[1024]; /* file:// rendezvous file written by rank 0 */
    unsigned char   *stage;         /* receive staging for reductions over TCP */
    size_t           stage_cap;
    double           spin_s;        /* busy-wait this long on rings before yielding */
    double           spin_worker_s; /* the same on the async worker thread */
    volatile uint64_t cma_token;    /* random; same-host peers read it to test process_vm_readv */
    int              refs;          /* the world communicator and its split children */
    int              broken;        /* an error desynchronised the streams */
    char             broken_msg[512];
} tcp_world;

typedef struct {
    tcp_world *w;
    dt_comm   *c;                   /* the communicator this state belongs to */
    int       *map;                 /* [c->size] rank in c -> world rank */
} tcp_comm;

/* tcp_xfer.c: the dt_p2p exchange over sockets and rings */
dt_status tcp_xfer(void *ctx, const dt_xfer *x, const dt_call *call);

#endif /* DT_TCP_IMPL_H */
