/*
 * tcp_ring.c: shared-memory rings between ranks on one host, made when a pair first talks
 * (DT_SHM_WARM=1: tcp.c's warm_rings has the collectives' partners talk once at the start).
 *
 * Why lazy. A ring for every pair of local ranks, made at init, costs a host
 * local * (local - 1) segments: 261,632 at 512 ranks, more memory than the machine has,
 * and set-up time quadratic in the ranks. A rank talks to few peers (the collectives of
 * algo.c pair it with log2(W) partners, or with its two ring neighbours), so a ring is made
 * when a rank first sends to a same-host peer, and each rank creates at most shm_budget
 * bytes of rings: the memory of a host is at most local * budget, linear in its ranks,
 * whatever the traffic. A pair over the budget, or whose ring cannot be made, keeps its
 * TCP connection, which exists anyway (the full mesh); DT_SHM_BUDGET sets the bytes per
 * rank (default: its share of an eighth of the host's memory or a quarter of /dev/shm,
 * at most 32 MiB; rings of 1 MiB for small jobs, down to 64 KiB). One pooled arena per host was the
 * other choice; it needs an owner per host, keeps a name in /dev/shm (or a descriptor
 * passed around) for the whole job, and reserves its full size up front.
 *
 * The offer travels in band on the pair's socket, so nothing waits for a reply:
 *   1. the sender creates the ring (it is the producer) and, before its first message,
 *      writes an offer record on the socket: the ring's name, whether the peer may read
 *      the sender's memory, and the address and value of a token to test that. This
 *      message and the next ones still go over TCP;
 *   2. the receiver finds the offer in the stream before that message, maps the ring,
 *      unlinks its name (both sides have it mapped now), tests the cross-memory read and
 *      says so in the ring's control page (dt_shm_accept);
 *   3. at a later send the sender sees that, writes a switch record on the socket and
 *      from then on sends through the ring; the receiver, reading the switch record,
 *      follows. The socket carries nothing more that way.
 * A receiver that cannot map the ring (another /dev/shm: containers that share the host's
 * network and name but not its IPC namespace; or DT_SHM=0 on its side) never accepts, and
 * the pair stays on TCP; the sender unlinks the name when it closes the ring. The two
 * directions of a pair are independent.
 *
 * Cross-memory messages (DT_CMA=1, tcp_xfer.c) go from A to B only when B could read A's
 * token through process_vm_readv, neither side set DT_CMA=0, and A set DT_CMA=1.
 */
#include "config.h"
#include "tcp_impl.h"
#include "shm_name.h"
#include "sock.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <sys/uio.h>
#include <unistd.h>

/* 1 MiB: dtbench on 2 and 4 ranks of a 2-core VM (2026-12-02, two or three sweeps
 * each) moved 4-64 MiB all_reduce, reduce_scatter and all_gather at 1.0-2.7x (mostly
 * about 1.3x) the bandwidth it had with 4 MiB rings, and smaller messages as fast: a
 * smaller ring cycled through stays in cache. Four CHUNKs (tcp_xfer.c) in flight. */
#define DEFAULT_RING_BYTES (1u << 20)
#define MIN_RING_BYTES     (64u << 10)
#define RANK_BUDGET_BYTES  (32u << 20)
/* offsets in the offer payload */
#define OFFER_CMA   96      /* u8: the sender allows cross-memory reads */
#define OFFER_ADDR  104     /* u64: address of its token */
#define OFFER_TOKEN 112     /* u64: the token's value */

/* What the rings of one host may take: an eighth of the memory, a quarter of /dev/shm. */
static size_t host_cap(void) {
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGE_SIZE);
    size_t mem = pages > 0 && psz > 0 ? (size_t)pages * (size_t)psz / 8 : (size_t)RANK_BUDGET_BYTES;
    struct statvfs sv;
    if (statvfs("/dev/shm", &sv) == 0) {
        size_t shm = (size_t)sv.f_blocks * (size_t)sv.f_frsize / 4;
        if (shm < mem) mem = shm;
    }
    return mem;
}

/* DT_SHM_BUDGET: bytes, with an optional K, M or G (powers of 2) */
static dt_status parse_budget(const char *v, size_t *out) {
    char *end = NULL;
    errno = 0;
    unsigned long long n = strtoull(v, &end, 10);
    unsigned shift = 0;
    if (end && (*end == 'K' || *end == 'k')) shift = 10, end++;
    else if (end && (*end == 'M' || *end == 'm')) shift = 20, end++;
    else if (end && (*end == 'G' || *end == 'g')) shift = 30, end++;
    if (!*v || *v == '-' || !end || end == v || *end || errno || n > (SIZE_MAX >> 30))
        return dt_error(DT_ERR_INVALID, "DT_SHM_BUDGET='%s': expected the bytes of shared-memory rings a rank may "
                        "create, e.g. 32M (K, M, G: powers of 2)", v);
    *out = (size_t)n << shift;
    return DT_OK;
}

/* A rank's ring size and budget when `local` ranks share the host: its share of the
 * host's cap, at most RANK_BUDGET_BYTES (or DT_SHM_BUDGET); rings sized so that the
 * partners of the collectives (2 log2(local) + 2 covers halving/doubling, trees and ring
 * neighbours) fit in it, 1 MiB for small jobs. *partners: that partner count. */
static int ceil_log2(int n) {
    int l = 0;
    while ((1 << l) < n) l++;
    return l;
}

static dt_status ring_sizing(int local, size_t *ring_out, size_t *budget_out, size_t *partners_out) {
    const char *e;
    size_t budget = host_cap() / (size_t)(local > 0 ? local : 1);
    if (budget > RANK_BUDGET_BYTES) budget = RANK_BUDGET_BYTES;
    if ((e = getenv("DT_SHM_BUDGET")) && *e) DT_TRY(parse_budget(e, &budget));
    int l2 = ceil_log2(local);
    size_t partners = (size_t)(local - 1 < 2 * l2 + 2 ? local - 1 : 2 * l2 + 2);
    if (partners < 1) partners = 1;
    size_t ring = DEFAULT_RING_BYTES;
    while (ring > MIN_RING_BYTES && (ring + DT_SHM_CTRL_BYTES) * partners > budget) ring /= 2;
    *ring_out = ring;
    *budget_out = budget;
    *partners_out = partners;
    return DT_OK;
}

static int shm_wanted(int local) {
    const char *e = getenv("DT_SHM");
    return !(e && strcmp(e, "0") == 0) && local > 1;
}

dt_status dt_comm_shm_plan(int local, size_t *bytes) {
    *bytes = 0;
    if (!shm_wanted(local)) return DT_OK;
    size_t ring, budget, partners;
    DT_TRY(ring_sizing(local, &ring, &budget, &partners));
    /* power-of-two worlds: the log2(local) partners of halving/doubling, which every
     * collective uses; others: up to the partners the sizing allows for */
    if ((local & (local - 1)) == 0) partners = (size_t)ceil_log2(local);
    size_t one = ring + DT_SHM_CTRL_BYTES, made = budget / one;
    if (made > partners) made = partners;
    *bytes = 2 * made * one;   /* the rings it creates and as many of its partners' */
    return DT_OK;
}

dt_status dt_comm_shm_ring(int local, size_t *bytes) {
    *bytes = 0;
    if (!shm_wanted(local)) return DT_OK;
    size_t ring, budget, partners;
    DT_TRY(ring_sizing(local, &ring, &budget, &partners));
    *bytes = ring + DT_SHM_CTRL_BYTES;
    return DT_OK;
}

dt_status tcp_ring_setup(tcp_world *w, int local, int first_local) {
    if (first_local) dt_shm_sweep();
    w->shm = shm_wanted(local);
    const char *e = getenv("DT_CMA");
    w->cma_want = !(e && strcmp(e, "0") == 0);
    w->cma_send = e && strcmp(e, "1") == 0;
    size_t ring, budget, partners;
    DT_TRY(ring_sizing(local, &ring, &budget, &partners));
    w->ring_bytes = ring;
    w->shm_budget = budget;
    w->shm_used = 0;
    for (int j = 0; j < w->size; j++) {
        tcp_peer *p = &w->peers[j];
        p->in_st = RING_UNTRIED;
        p->out_st = w->shm && p->local ? RING_UNTRIED : RING_OFF;
    }
    return DT_OK;
}

static void put_ctl(unsigned char *rec, unsigned magic, size_t payload) {
    memset(rec, 0, TCP_HDR_BYTES + payload);
    dt_put32(rec, magic);
    dt_put64(rec + 32, payload);
}

size_t tcp_ring_prepare(tcp_world *w, tcp_peer *p, unsigned char *rec) {
    if (p->out_st == RING_OFFERED) {
        unsigned f = dt_shm_accepted(p->out);
        if (!(f & DT_SHM_MAPPED)) return 0;                /* not yet (or never): TCP */
        p->out_st = RING_ON;
        p->cma_out = w->cma_send && (f & DT_SHM_CMA);
        put_ctl(rec, RING_SWITCH_MAGIC, 0);
        return TCP_HDR_BYTES;
    }
    if (p->out_st != RING_UNTRIED) return 0;
    p->out_st = RING_OFF;
    size_t total = w->ring_bytes + DT_SHM_CTRL_BYTES;
    if (w->shm_used + total > w->shm_budget) return 0;
    char name[DT_SHM_NAME_MAX];
    /* a full /dev/shm and the like only cost speed: the pair stays on TCP */
    if (dt_shm_create(w->ring_bytes, name, sizeof name, &p->out) != DT_OK) return 0;
    w->shm_used += total;
    p->out_st = RING_OFFERED;
    put_ctl(rec, RING_OFFER_MAGIC, RING_OFFER_BYTES);
    unsigned char *o = rec + TCP_HDR_BYTES;
    memcpy(o, name, strlen(name) + 1);
    o[OFFER_CMA] = (unsigned char)w->cma_want;
    dt_put64(o + OFFER_ADDR, (uint64_t)(uintptr_t)&w->cma_token);
    dt_put64(o + OFFER_TOKEN, w->cma_token);
    return TCP_HDR_BYTES + RING_OFFER_BYTES;
}

/* Can we read the peer's token through its memory? Whether it works depends on the kernel
 * (ENOSYS), the ptrace policy (EPERM under Yama scope >= 1 for non-descendants) and pid
 * namespaces (the peer's pid may name another process here), so it is tested. */
static int cma_works(const tcp_peer *p, const unsigned char *o) {
    if (p->pid <= 0) return 0;
    uint64_t v = 0;
    struct iovec lo = { &v, sizeof v }, ro = { (void *)(uintptr_t)dt_get64(o + OFFER_ADDR), sizeof v };
    return process_vm_readv((pid_t)p->pid, &lo, 1, &ro, 1, 0) == (ssize_t)sizeof v && v == dt_get64(o + OFFER_TOKEN);
}

dt_status tcp_ring_control(tcp_comm *tc, int peer, tcp_peer *p, const unsigned char *rec) {
    tcp_world *w = tc->w;
    char who[300];
    if (dt_get32(rec) == RING_SWITCH_MAGIC) {
        if (p->in_st != RING_OFFERED)
            return dt_error(DT_ERR_PEER, "rank %d (%s) switched to a shared-memory ring this rank never mapped",
                            peer, dt_comm_peer_name(tc->c, peer, who, sizeof who));
        p->in_st = RING_ON;
        return DT_OK;
    }
    const unsigned char *o = rec + TCP_HDR_BYTES;
    if (p->in_st != RING_UNTRIED || dt_get64(rec + 32) != RING_OFFER_BYTES || !memchr(o, 0, DT_SHM_NAME_MAX))
        return dt_error(DT_ERR_PEER, "rank %d (%s) sent a malformed or repeated shared-memory ring offer",
                        peer, dt_comm_peer_name(tc->c, peer, who, sizeof who));
    const char *name = (const char *)o;
    p->in_st = RING_OFF;                                   /* unless mapped below: TCP for good */
    if (!w->shm || !p->local || !dt_shm_name_ours(name)) return DT_OK;
    if (dt_shm_open(name, &p->in) != DT_OK) return DT_OK; /* another /dev/shm: decline */
    dt_shm_unlink(name);                                   /* both sides have it mapped */
    p->cma_in = w->cma_want && o[OFFER_CMA] && cma_works(p, o);
    dt_shm_accept(p->in, p->cma_in ? DT_SHM_CMA : 0);
    p->in_st = RING_OFFERED;
    return DT_OK;
}
