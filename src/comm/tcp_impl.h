/*
 * tcp_impl.h: state shared by the tcp backend's setup (tcp.c) and data path (tcp_xfer.c).
 *
 * One tcp_world per process holds the full mesh of connections of the world
 * communicator; communicators split from it reuse those connections through a rank map
 * (comm.c serialises the family's operations, and every message header carries the
 * communicator's context id, so streams of different communicators cannot be confused).
 * Same-host pairs move to shared-memory rings when they first talk (tcp_ring.c).
 */
#ifndef DT_TCP_IMPL_H
#define DT_TCP_IMPL_H

#include "comm_impl.h"
#include "shm.h"
#include "store.h"
#include "auth.h"
#include "seal.h"

/* Message header, on sockets and rings alike (little-endian):
 *   magic u32, ctx u32, seq u64, fp.a u64, fp.b u64, payload bytes u64 */
#define TCP_MSG_MAGIC 0x534d5444u   /* "DTMS" */
#define TCP_HDR_BYTES 40
#define SHM_HDR_BYTES 64            /* ring records are 64-byte aligned */
/* A ring header whose bytes 40..43 hold CMA_MAGIC carries no payload: the receiver reads
 * the bytes straight out of the sender's buffer at the address in bytes 48..55
 * (process_vm_readv) and acknowledges through the ring's ack counter (tcp_xfer.c). */
#define CMA_MAGIC 0x414d4344u       /* "DCMA" */
/* Control records on a socket, between messages (tcp_ring.c): a TCP header whose magic is
 * RING_OFFER_MAGIC (bytes = RING_OFFER_BYTES of payload follow) or RING_SWITCH_MAGIC (none). */
#define RING_OFFER_MAGIC  0x524f5444u   /* "DTOR" */
#define RING_SWITCH_MAGIC 0x53525444u   /* "DTRS" */
#define RING_OFFER_BYTES  128
#define RING_CTL_MAX      (TCP_HDR_BYTES + RING_OFFER_BYTES)

/* Where one direction of a pair stands (tcp_ring.c): no ring yet; a ring exists but the
 * messages still go over TCP (offered, or mapped and waiting for the switch record); the
 * messages go through the ring; never a ring (another host, DT_SHM=0, over budget, failed). */
enum { RING_UNTRIED, RING_OFFERED, RING_ON, RING_OFF };

typedef struct {
    int          fd;                /* connection to the peer; -1 for this rank */
    dt_shm_ring *in, *out;          /* same-host rings (in: the peer made it; out: we did), or NULL */
    unsigned char in_st, out_st;    /* RING_*: the peer's messages to us, ours to it */
    unsigned char local;            /* same host and boot id: rings may be tried */
    unsigned char cma_in;           /* 1: we can read its memory and accept its cross-memory messages */
    unsigned char cma_out;          /* 1: it can read ours and we send large collective messages
                                       that way (DT_CMA=1) */
    int          pid;               /* the peer's process id */
    uint64_t     cma_sent;          /* cross-memory messages sent to it (acks expected) */
    dt_seal     *seal;              /* --secure-transport: the socket's records are sealed, or NULL */
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
    int              spin_yield;    /* more local ranks than cores: spin by yielding */
    volatile uint64_t cma_token;    /* random; same-host peers read it to test process_vm_readv */
    int              shm;           /* rings may be made (DT_SHM is not 0, other local ranks) */
    int              cma_want;      /* DT_CMA is not 0: cross-memory reads are allowed both ways */
    int              cma_send;      /* DT_CMA=1: send large collective messages that way */
    size_t           ring_bytes;    /* data bytes of each ring this rank creates */
    size_t           shm_budget;    /* bytes of rings this rank may create (tcp_ring.c) */
    size_t           shm_used;      /* and has created */
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

/* tcp_ring.c: same-host rings, made when a pair first talks */
/* At init, once peers[].local and .pid are set: sweep leftovers (first_local: this is the
 * host's first rank), read DT_SHM/DT_CMA/DT_SHM_BUDGET, size the rings for `local` ranks
 * on this host. */
dt_status tcp_ring_setup  (tcp_world *w, int local, int first_local);
/* Before a message to peer p: the control record (an offer, or the switch) to write on its
 * socket first, into rec (RING_CTL_MAX bytes); returns its length, 0 for none. */
size_t    tcp_ring_prepare(tcp_world *w, tcp_peer *p, unsigned char *rec);
/* A control record (header and payload) came from rank `peer` of tc on p's socket. */
dt_status tcp_ring_control(tcp_comm *tc, int peer, tcp_peer *p, const unsigned char *rec);

#endif /* DT_TCP_IMPL_H */
