/*
 * tcp_xfer.c: the tcp backend's data path — one dt_xfer (send to one peer while receiving
 * from another, optionally reducing as data arrives) over sockets or shared-memory rings.
 *
 * Both directions are driven by one thread with non-blocking steps, so a rank sends and
 * receives at once (the exchanges of halving/doubling and rings are full duplex) and a
 * reduction consumes data chunk by chunk as it arrives: on a ring the receiver combines
 * straight out of shared memory (no extra copy), over TCP through a small staging
 * buffer. Chunks are CHUNK bytes so sending, receiving and summing interleave.
 *
 * Every message starts with a header {magic, context, sequence number, fingerprint,
 * bytes}; the receiver checks it against its own call, which turns "ranks called
 * different collectives" into an error naming both calls (docs/DESIGN.md rule 3).
 * Waiting spins briefly, then sleeps: on a futex in the ring when only shared memory is
 * involved (the peer wakes us), in poll() on the sockets otherwise. A peer that talks to
 * us over shared memory is checked on every wake-up: its socket reports end of file when
 * it dies.
 *
 * Between messages a socket may carry a ring's control records (tcp_ring.c): the sender
 * writes them before the message's header, the receiver acts on them while it looks for
 * the header, and the two sides move from the socket to the ring at the same point of
 * the stream.
 */
#include "config.h"
#include "tcp_impl.h"
#include "reduce.h"
#include "sock.h"

#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#define CHUNK (256u << 10)
/* With DT_CMA=1, collective messages of at least CMA_MIN_BYTES between same-host ranks
 * travel without payload in the ring: the receiver reads them from the sender's buffer
 * (process_vm_readv), CMA_COPY_CHUNK bytes at a time straight into its own buffer, or
 * CMA_REDUCE_CHUNK bytes at a time into the (cache-resident) staging buffer and reduces
 * from there; the sender waits for its ack before its buffer may change. Same bytes, same
 * reduction order. It is off by default because it is slower when the two processes share
 * a last-level cache: the ring then hands data from cache to cache faster than the
 * kernel's copy (2-rank all_reduce on a 2-vCPU EPYC VM: ring 6-7 GB/s busbw at 256 MiB,
 * cross-memory 4-5 GB/s). It pays where the ring is slow, which it is when the ranks do
 * not run side by side on cores sharing a cache (the same VM in some runs: ring 2-2.5
 * GB/s, cross-memory still 4-5 GB/s; both ranks pinned to one CPU: 1.2 against 2.3). */
#define CMA_MIN_BYTES (1u << 20)
#define CMA_COPY_CHUNK (2u << 20)
#define CMA_REDUCE_CHUNK (1u << 20)
/* A ring message of at least STREAM_MIN_BYTES is copied out with non-temporal stores:
 * its destination is too large to stay in cache, and skipping the read-for-ownership of
 * every destination line saves a pass over memory. */
#define STREAM_MIN_BYTES (8u << 20)

typedef struct {
    int on, peer;
    tcp_peer *tp;
    unsigned char pre[RING_CTL_MAX];    /* a control record to write on the socket first */
    size_t pre_len, pre_done;
    unsigned char hdr[SHM_HDR_BYTES];
    size_t hdone;
    const char *buf;
    size_t len, done;
    char *copy;             /* the bytes sent are also copied here (dt_xfer.scopy), or NULL */
    int cma;                /* 1: offered for a cross-memory read, waiting for the ack */
    uint64_t want_ack;      /* the peer's ack count that releases buf */
} snd_t;

typedef struct {
    int on, peer, have_hdr;
    tcp_peer *tp;
    unsigned char hdr[RING_CTL_MAX];    /* a message header, or a control record */
    size_t hdone, hneed;                /* bytes of it read, and expected (0: a header's) */
    char *buf;
    const char *acc;
    size_t len, done, fill;
    int cma;                /* 1: the payload is read from the sender's memory */
    uint64_t raddr;         /* its address there */
} rcv_t;

/* memcpy with non-temporal stores (see STREAM_MIN_BYTES) */
#if defined(__x86_64__)
static void copy_stream(char *dst, const char *src, size_t n) {
    size_t head = (size_t)(-(uintptr_t)dst & 15);
    if (head > n) head = n;
    memcpy(dst, src, head);
    dst += head; src += head; n -= head;
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(src + i));
        __m128i b = _mm_loadu_si128((const __m128i *)(src + i + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(src + i + 32));
        __m128i d = _mm_loadu_si128((const __m128i *)(src + i + 48));
        _mm_stream_si128((__m128i *)(dst + i), a);
        _mm_stream_si128((__m128i *)(dst + i + 16), b);
        _mm_stream_si128((__m128i *)(dst + i + 32), c);
        _mm_stream_si128((__m128i *)(dst + i + 48), d);
    }
    memcpy(dst + i, src + i, n - i);
    _mm_sfence();
}
#else
static void copy_stream(char *dst, const char *src, size_t n) { memcpy(dst, src, n); }
#endif
static size_t round64(size_t n) { return (n + 63) & ~(size_t)63; }

/* "collective #57 all_reduce (...)" or, for point to point, "recv (...)" */
static const char *where(const dt_call *call, char *buf, size_t n) {
    if (call->seq) snprintf(buf, n, "collective #%llu %s", (unsigned long long)call->seq, call->desc);
    else snprintf(buf, n, "%s", call->desc);
    return buf;
}

/* After an error the byte streams may be out of step, so the world is unusable. Hang up
 * on every peer as well: ranks waiting on this one then fail within moments ("rank R
 * disconnected") instead of sitting out their timeout (docs/DESIGN.md rule 3). */
static dt_status broken(tcp_world *w, dt_status s) {
    w->broken = 1;
    snprintf(w->broken_msg, sizeof w->broken_msg, "%s", dt_last_error());
    for (int i = 0; i < w->size; i++)
        if (w->peers[i].fd >= 0) shutdown(w->peers[i].fd, SHUT_RDWR);
    return s;
}

static dt_status lost(tcp_comm *tc, int peer, const dt_call *call) {
    char who[300], wh[200];
    dt_comm_peer_name(tc->c, peer, who, sizeof who);
    return broken(tc->w, dt_error(DT_ERR_PEER, "rank %d (%s) disconnected during %s", peer, who,
                                  where(call, wh, sizeof wh)));
}

static void put_header(unsigned char *h, const dt_call *call, size_t bytes) {
    dt_fp fp = dt_call_fp(call);
    memset(h, 0, SHM_HDR_BYTES);
    dt_put32(h, TCP_MSG_MAGIC);
    dt_put32(h + 4, call->ctx);
    dt_put64(h + 8, call->seq);
    dt_put64(h + 16, fp.a);
    dt_put64(h + 24, fp.b);
    dt_put64(h + 32, bytes);
}

static dt_status check_header(tcp_comm *tc, rcv_t *r, const dt_call *call) {
    const unsigned char *h = r->hdr;
    char who[300], wh[200], mine[160], theirs[160], d[112];
    if (dt_get32(h) != TCP_MSG_MAGIC) {
        dt_comm_peer_name(tc->c, r->peer, who, sizeof who);
        return broken(tc->w, dt_error(DT_ERR_PEER, "rank %d (%s) sent a corrupt message header during %s",
                                      r->peer, who, where(call, wh, sizeof wh)));
    }
    unsigned ctx = dt_get32(h + 4);
    unsigned long long seq = dt_get64(h + 8), bytes = dt_get64(h + 32);
    dt_fp fp = { dt_get64(h + 16), dt_get64(h + 24) }, my = dt_call_fp(call);
    if (ctx != call->ctx || seq != call->seq || fp.a != my.a || fp.b != my.b) {
        dt_fp_describe(fp, d, sizeof d);
        if (seq) snprintf(theirs, sizeof theirs, "%s as its collective #%llu", d, seq);
        else snprintf(theirs, sizeof theirs, "%s", d);
        if (seq == call->seq && ctx == call->ctx && seq)
            return broken(tc->w, dt_error(DT_ERR_MISMATCH, "collective #%llu mismatch: this rank called %s, rank %d called %s",
                                          seq, call->desc, r->peer, d));
        return broken(tc->w, dt_error(DT_ERR_MISMATCH, "mismatch: this rank called %s, rank %d called %s%s",
                                      where(call, mine, sizeof mine), r->peer, theirs,
                                      ctx != call->ctx ? " on another communicator" : ""));
    }
    if (bytes != r->len)
        return broken(tc->w, dt_error(DT_ERR_MISMATCH, "rank %d sent %llu bytes where this rank expected %zu in %s",
                                      r->peer, bytes, r->len, where(call, wh, sizeof wh)));
    r->have_hdr = 1;
    return DT_OK;
}

/* ---- sockets ----------------------------------------------------------------------- */

/* The socket's bytes, sealed into records where --secure-transport is on (seal.h; its
 * sender retries with the same bytes, which every caller here does). */
static ssize_t io_sendv(tcp_peer *p, struct iovec *iov, int n) {
    if (p->seal) return dt_seal_sendv(p->seal, p->fd, iov, n);
    struct msghdr m = { .msg_iov = iov, .msg_iovlen = (size_t)n };
    return sendmsg(p->fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
}

static ssize_t io_recv(tcp_peer *p, void *buf, size_t n) {
    return p->seal ? dt_seal_recv(p->seal, p->fd, buf, n) : recv(p->fd, buf, n, MSG_DONTWAIT);
}

/* A sealed record that failed its check: the stream cannot be trusted from here on. */
static dt_status forged(tcp_comm *tc, int peer, const dt_call *call) {
    char who[300], wh[200];
    dt_comm_peer_name(tc->c, peer, who, sizeof who);
    return broken(tc->w, dt_error(DT_ERR_PEER, "a record from rank %d (%s) failed its check during %s: altered on "
                                  "the way, or not sealed by that rank (secure transport)", peer, who,
                                  where(call, wh, sizeof wh)));
}

/* The control record ahead of the message (an offer, a switch), without blocking. */
static dt_status snd_pre(tcp_comm *tc, snd_t *s, const dt_call *call, int *prog) {
    while (s->pre_done < s->pre_len) {
        struct iovec iov = { s->pre + s->pre_done, s->pre_len - s->pre_done };
        ssize_t w = io_sendv(s->tp, &iov, 1);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return DT_OK;
        if (w <= 0) return lost(tc, s->peer, call);
        *prog = 1;
        s->pre_done += (size_t)w;
    }
    return DT_OK;
}

static dt_status snd_tcp(tcp_comm *tc, snd_t *s, const dt_call *call, int *prog) {
    while (s->hdone < TCP_HDR_BYTES || s->done < s->len) {
        struct iovec iov[2];
        int n = 0;
        if (s->hdone < TCP_HDR_BYTES) iov[n++] = (struct iovec){ s->hdr + s->hdone, TCP_HDR_BYTES - s->hdone };
        if (s->done < s->len) iov[n++] = (struct iovec){ (void *)(s->buf + s->done), s->len - s->done };
        ssize_t w = io_sendv(s->tp, iov, n);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return DT_OK;
        if (w <= 0) return lost(tc, s->peer, call);
        *prog = 1;
        size_t k = (size_t)w;
        if (s->hdone < TCP_HDR_BYTES) {
            size_t h = TCP_HDR_BYTES - s->hdone < k ? TCP_HDR_BYTES - s->hdone : k;
            s->hdone += h;
            k -= h;
        }
        s->done += k;
    }
    s->on = 0;
    return DT_OK;
}

static dt_status rcv_tcp(tcp_comm *tc, rcv_t *r, const dt_call *call, int *prog) {
    while (!r->have_hdr) {
        size_t need = r->hneed ? r->hneed : TCP_HDR_BYTES;
        ssize_t n = io_recv(r->tp, r->hdr + r->hdone, need - r->hdone);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return DT_OK;
        if (n < 0 && errno == EBADMSG) return forged(tc, r->peer, call);
        if (n <= 0) return lost(tc, r->peer, call);
        *prog = 1;
        r->hdone += (size_t)n;
        if (r->hdone < need) continue;
        unsigned magic = dt_get32(r->hdr);
        if (magic == RING_OFFER_MAGIC && need == TCP_HDR_BYTES) {
            r->hneed = RING_CTL_MAX;                 /* the offer's payload follows */
            continue;
        }
        if (magic == RING_OFFER_MAGIC || magic == RING_SWITCH_MAGIC) {
            dt_status st = tcp_ring_control(tc, r->peer, r->tp, r->hdr);
            if (st != DT_OK) return broken(tc->w, st);
            r->hdone = r->hneed = 0;
            if (r->tp->in_st == RING_ON) return DT_OK;   /* the message comes through the ring */
            continue;
        }
        DT_TRY(check_header(tc, r, call));
    }
    size_t es = dt_dtype_size(call->dtype);
    tcp_world *w = tc->w;
    while (r->done < r->len) {
        ssize_t n;
        if (!r->acc) {
            n = io_recv(r->tp, r->buf + r->done, r->len - r->done);
        } else {
            size_t cap = w->stage_cap < CHUNK ? w->stage_cap : CHUNK;
            size_t want = r->len - r->done - r->fill, room = cap - r->fill;
            n = io_recv(r->tp, w->stage + r->fill, want < room ? want : room);
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return DT_OK;
        if (n < 0 && errno == EBADMSG) return forged(tc, r->peer, call);
        if (n <= 0) return lost(tc, r->peer, call);
        *prog = 1;
        if (!r->acc) { r->done += (size_t)n; continue; }
        r->fill += (size_t)n;
        size_t whole = r->fill / es * es;       /* combine whole elements; keep a split one */
        dt_reduce_apply(call->op, call->dtype, r->buf + r->done, r->acc + r->done, w->stage, whole / es);
        r->done += whole;
        r->fill -= whole;
        if (r->fill) memmove(w->stage, w->stage + whole, r->fill);
    }
    r->on = 0;
    return DT_OK;
}

/* ---- rings --------------------------------------------------------------------------- */

/* dt_xfer.scopy: bytes [off, off + n) of the message were just read to be sent; copy them
 * too while they are in cache (with non-temporal stores when the message is large, as a
 * large received message is copied out). */
static void snd_copy(const snd_t *s, size_t off, size_t n) {
    if (!s->copy || !n) return;
    if (s->len >= STREAM_MIN_BYTES) copy_stream(s->copy + off, s->buf + off, n);
    else memcpy(s->copy + off, s->buf + off, n);
}

/* Messages follow one another around the ring; none jumps back to its start. Going back
 * whenever the next message fitted there kept a pair's working set small, but then every
 * message rewrote the lines the receiver had just read, and each write first had to take
 * them back from the other core's cache. 2 ranks on 2 cores (2026-12-03, dtbench, 200
 * calls, 1 MiB rings): all_reduce 128 KiB-1 MiB took half the time walking the ring
 * (256 KiB: 27 against 57 us), reduce_scatter and all_gather 256 KiB-1 MiB 1.6-2.3x less,
 * 4 KiB-64 KiB and 2 MiB up the same; with two to six memory-copying processes beside
 * them, 256 KiB-1 MiB ran 1.3-5x faster walking. */
static void snd_shm(snd_t *s, const dt_call *call, int *prog) {
    dt_shm_ring *q = s->tp->out;
    void *p;
    size_t span;
    if (s->cma) {
        /* the peer reads buf itself; buf may change only once it says it is done */
        if (dt_shm_acks(q) - s->want_ack < ((uint64_t)1 << 63)) { s->on = 0; *prog = 1; }
        return;
    }
    if (!s->hdone && s->tp->cma_out && s->len >= CMA_MIN_BYTES && call->kind != DT_CALL_P2P) {
        /* Collectives only: their exchanges always have the matching receive running, so
         * waiting for the ack cannot deadlock; a dt_send may rely on ring buffering. */
        span = dt_shm_write_span(q, &p);
        if (span < SHM_HDR_BYTES) return;
        dt_put32(s->hdr + TCP_HDR_BYTES, CMA_MAGIC);
        dt_put64(s->hdr + TCP_HDR_BYTES + 8, (uint64_t)(uintptr_t)s->buf);
        s->cma = 1;
        s->want_ack = ++s->tp->cma_sent;
        snd_copy(s, 0, s->len);
        memcpy(p, s->hdr, SHM_HDR_BYTES);
        s->hdone = SHM_HDR_BYTES;
        s->done = s->len;
        dt_shm_write_commit(q, SHM_HDR_BYTES);
        *prog = 1;
        return;
    }
    if (!s->hdone) {
        span = dt_shm_write_span(q, &p);
        if (span < SHM_HDR_BYTES) return;
        memcpy(p, s->hdr, SHM_HDR_BYTES);
        s->hdone = SHM_HDR_BYTES;
        *prog = 1;
        if (s->len && s->len <= span - SHM_HDR_BYTES && s->len <= CHUNK) {
            /* a small message goes out with its header in one publication */
            memcpy((char *)p + SHM_HDR_BYTES, s->buf, s->len);
            snd_copy(s, 0, s->len);
            s->done = s->len;
            dt_shm_write_commit(q, SHM_HDR_BYTES + round64(s->len));
            s->on = 0;
            return;
        }
        dt_shm_write_commit(q, SHM_HDR_BYTES);
    }
    while (s->done < s->len && (span = dt_shm_write_span(q, &p)) > 0) {
        size_t n = s->len - s->done;
        if (n > span) n = span;
        if (n > CHUNK) n = CHUNK;
        int last = s->done + n == s->len;
        if (!last) n &= ~(size_t)63;            /* publish whole 64-byte granules until the end */
        memcpy(p, s->buf + s->done, n);
        snd_copy(s, s->done, n);
        s->done += n;
        dt_shm_write_commit(q, last ? round64(n) : n);
        *prog = 1;
        break;                                   /* one chunk, then let the receive side run */
    }
    if (s->done == s->len) s->on = 0;
}

/* One chunk of a cross-memory message: read it from the sender's buffer (into ours, or
 * into the staging buffer and reduce from there); the last one acknowledges. */
static dt_status rcv_cma(tcp_comm *tc, rcv_t *r, const dt_call *call, int *prog) {
    tcp_world *w = tc->w;
    size_t es = dt_dtype_size(call->dtype), n = r->len - r->done;
    if (r->acc) {
        size_t cap = w->stage_cap < CMA_REDUCE_CHUNK ? w->stage_cap : CMA_REDUCE_CHUNK;
        cap = cap / es * es;
        if (n > cap) n = cap;
    } else if (n > CMA_COPY_CHUNK) {
        n = CMA_COPY_CHUNK;
    }
    char *dst = r->acc ? (char *)w->stage : r->buf + r->done;
    size_t got = 0;
    while (got < n) {
        struct iovec lo = { dst + got, n - got }, ro = { (void *)(uintptr_t)(r->raddr + r->done + got), n - got };
        ssize_t k = process_vm_readv((pid_t)r->tp->pid, &lo, 1, &ro, 1, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            char who[300], wh[200];
            int e = k < 0 ? errno : EIO;
            if (e == ESRCH) return lost(tc, r->peer, call);
            dt_comm_peer_name(tc->c, r->peer, who, sizeof who);
            return broken(w, dt_error(DT_ERR_IO, "reading %zu bytes from the memory of rank %d (%s) in %s: %s",
                                      n - got, r->peer, who, where(call, wh, sizeof wh), strerror(e)));
        }
        got += (size_t)k;
    }
    if (r->acc) dt_reduce_apply(call->op, call->dtype, r->buf + r->done, r->acc + r->done, w->stage, n / es);
    r->done += n;
    *prog = 1;
    if (r->done == r->len) {
        dt_shm_ack(r->tp->in);
        r->on = 0;
    }
    return DT_OK;
}

static dt_status rcv_shm(tcp_comm *tc, rcv_t *r, const dt_call *call, int *prog) {
    dt_shm_ring *q = r->tp->in;
    const void *p;
    size_t span;
    if (!r->have_hdr) {
        span = dt_shm_read_span(q, &p);
        if (span < SHM_HDR_BYTES) return DT_OK;
        memcpy(r->hdr, p, SHM_HDR_BYTES);
        DT_TRY(check_header(tc, r, call));
        if (dt_get32(r->hdr + TCP_HDR_BYTES) == CMA_MAGIC) {
            if (!r->tp->cma_in) {
                char wh[200];
                return broken(tc->w, dt_error(DT_ERR_PEER, "rank %d sent a cross-memory message that this rank cannot read in %s",
                                              r->peer, where(call, wh, sizeof wh)));
            }
            r->cma = 1;
            r->raddr = dt_get64(r->hdr + TCP_HDR_BYTES + 8);
        }
        dt_shm_read_commit(q, SHM_HDR_BYTES);
        *prog = 1;
    }
    size_t es = dt_dtype_size(call->dtype);
    if (r->cma) return rcv_cma(tc, r, call, prog);
    while (r->done < r->len && (span = dt_shm_read_span(q, &p)) > 0) {
        size_t n = r->len - r->done;
        if (n > span) n = span;
        if (n > CHUNK) n = CHUNK;
        int last = r->done + n == r->len;
        if (r->acc) dt_reduce_apply(call->op, call->dtype, r->buf + r->done, r->acc + r->done, p, n / es);
        else if (r->len >= STREAM_MIN_BYTES) copy_stream(r->buf + r->done, p, n);
        else memcpy(r->buf + r->done, p, n);
        r->done += n;
        dt_shm_read_commit(q, last ? round64(n) : n);
        *prog = 1;
        break;
    }
    if (r->done == r->len) r->on = 0;
    return DT_OK;
}

/* Has a shared-memory peer hung up its socket? POLLRDHUP: the end of its stream has
 * arrived, whether or not bytes before it are still unread (its direction of the socket
 * carries its messages to us as long as that direction is not on a ring, so "readable"
 * would not do). What it wrote to the ring before it went stays readable, so the caller
 * only gives up when a further attempt makes no progress. */
static int peer_gone(tcp_comm *tc, int peer) {
    struct pollfd p = { .fd = tc->w->peers[tc->map[peer]].fd, .events = POLLRDHUP };
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

/* ---- timeouts ---------------------------------------------------------------------------- */

/* Who never arrived? Each rank that times out in a collective leaves a mark in the store
 * and, for a moment, looks for the others' marks: the ranks without one are the ones
 * that never joined (docs/DESIGN.md rule 3). Without a store the message names the peer this
 * rank was waiting for. */
static dt_status timed_out(tcp_comm *tc, const dt_call *call, int who) {
    dt_comm *c = tc->c;
    dt_store *st = tc->w->store;
    char wh[200], tail[400] = "";
    where(call, wh, sizeof wh);
    char key[96];
    snprintf(key, sizeof key, "stuck/%u/%llu/%d", call->ctx, (unsigned long long)call->seq, c->rank);
    /* the diagnosis gets its own short window, also when the store host itself hangs */
    double window = c->timeout_s < 2 ? c->timeout_s / 2 : 1.0, until = dt_now() + window;
    double slack = st ? dt_store_slack(st) : 0;
    if (st) dt_store_set_slack(st, window);
    if (st && call->seq && c->size > 1 && dt_store_set(st, key, "", 0) == DT_OK) {
        int *waiting = calloc((size_t)c->size, sizeof *waiting), nwait = 0;
        while (waiting) {
            nwait = 0;
            for (int i = 0; i < c->size; i++) {
                void *v = NULL;
                size_t n;
                snprintf(key, sizeof key, "stuck/%u/%llu/%d", call->ctx, (unsigned long long)call->seq, i);
                if (!waiting[i] && dt_store_get(st, key, &v, &n, 0) == DT_OK) waiting[i] = 1;
                free(v);
                nwait += waiting[i];
            }
            if (nwait == c->size || dt_now() > until) break;
            struct timespec ts = { 0, 50 * 1000 * 1000 };
            nanosleep(&ts, NULL);
        }
        if (waiting && nwait < c->size) {
            char absent[200] = "", present[200] = "", who_s[300] = "";
            size_t la = 0, lp = 0;
            int nabs = 0, first = -1;
            for (int i = 0; i < c->size; i++) {
                char *b = waiting[i] ? present : absent;
                size_t *l = waiting[i] ? &lp : &la;
                if (*l < sizeof absent - 12) *l += (size_t)snprintf(b + *l, sizeof absent - *l, "%s%d", *l ? "," : "", i);
                if (!waiting[i] && first < 0) first = i;
                nabs += !waiting[i];
            }
            if (nabs == 1) {
                dt_comm_peer_name(c, first, who_s, sizeof who_s);
                snprintf(tail, sizeof tail, "; rank %d (%s) never joined it, rank(s) %s waiting", first, who_s, present);
            } else {
                snprintf(tail, sizeof tail, "; ranks %s never joined it, rank(s) %s waiting", absent, present);
            }
        }
        free(waiting);
    }
    if (st) dt_store_set_slack(st, slack);
    return dt_error(DT_ERR_TIMEOUT, "timed out after %g s in %s waiting for rank %d (%s)%s", c->timeout_s, wh, who,
                    c->hosts[who], tail);
}

/* ---- the exchange --------------------------------------------------------------------- */

dt_status tcp_xfer(void *ctx, const dt_xfer *x, const dt_call *call) {
    tcp_comm *tc = ctx;
    tcp_world *w = tc->w;
    dt_comm *c = tc->c;
    if (w->broken) return dt_error(DT_ERR_PEER, "%s", w->broken_msg);
    snd_t s = { 0 };
    rcv_t r = { 0 };
    if (x->dst >= 0) {
        s = (snd_t){ .on = 1, .peer = x->dst, .tp = &w->peers[tc->map[x->dst]], .buf = x->sbuf, .len = x->sbytes,
                     .copy = x->scopy };
        put_header(s.hdr, call, x->sbytes);
        if (s.tp->out_st == RING_UNTRIED || s.tp->out_st == RING_OFFERED)
            s.pre_len = tcp_ring_prepare(w, s.tp, s.pre);
        if (s.tp->out_st != RING_ON) { snd_copy(&s, 0, s.len); s.copy = NULL; }   /* over TCP: copy at once */
    }
    if (x->src >= 0) {
        r = (rcv_t){ .on = 1, .peer = x->src, .tp = &w->peers[tc->map[x->src]], .buf = x->rbuf,
                     .acc = x->racc, .len = x->rbytes };
        if (r.acc && !w->stage) {
            w->stage_cap = CMA_REDUCE_CHUNK > CHUNK ? CMA_REDUCE_CHUNK : CHUNK;
            w->stage = malloc(w->stage_cap);
            if (!w->stage) return dt_error(DT_ERR_NOMEM, "out of memory (receive staging buffer)");
        }
    }
    if (s.on && s.tp->out_st == RING_ON) dt_shm_set_cpu(s.tp->out, sched_getcpu());
    if (r.on && r.tp->in_st == RING_ON) dt_shm_set_cpu(r.tp->in, sched_getcpu());
    double deadline = dt_now() + c->timeout_s, idle_since = 0;
    double spin = dt_comm_on_worker ? w->spin_worker_s : w->spin_s;
    int s_gone = 0, r_gone = 0, waited = -1;   /* the peer an idle spell waits for */
    while (s.on || r.on) {
        int prog = 0;
        if (s.on) {
            if (s.pre_done < s.pre_len) DT_TRY(snd_pre(tc, &s, call, &prog));
            else if (s.tp->out_st == RING_ON) snd_shm(&s, call, &prog);
            else DT_TRY(snd_tcp(tc, &s, call, &prog));
        }
        if (r.on) {
            if (r.tp->in_st == RING_ON) DT_TRY(rcv_shm(tc, &r, call, &prog));
            else DT_TRY(rcv_tcp(tc, &r, call, &prog));
        }
        if (prog || (!s.on && !r.on)) {
            if (idle_since > 0) dt_comm_wait_note(waited, idle_since);
            idle_since = 0;
            continue;
        }
        if (r.on && r_gone) return lost(tc, r.peer, call);
        if (s.on && s_gone) return lost(tc, s.peer, call);
        double now = dt_now();
        if (idle_since == 0) {
            idle_since = now;
            waited = tc->map[r.on ? r.peer : s.peer];
        }
        if (now > deadline) return broken(w, timed_out(tc, call, r.on ? r.peer : s.peer));
        int s_shm = s.on && s.pre_done == s.pre_len && s.tp->out_st == RING_ON;
        int r_shm = r.on && r.tp->in_st == RING_ON;
        int s_tcp = s.on && !s_shm, r_tcp = r.on && !r_shm;
        double idle = now - idle_since;
        if ((s_shm || r_shm) && idle < spin) {
            /* a peer on this very CPU cannot move until this rank lets it run */
            int cpu = sched_getcpu();
            if (s_shm) dt_shm_set_cpu(s.tp->out, cpu);
            if (r_shm) dt_shm_set_cpu(r.tp->in, cpu);
            int shared = cpu >= 0 && ((r_shm && dt_shm_peer_cpu(r.tp->in) == cpu) ||
                                      (s_shm && dt_shm_peer_cpu(s.tp->out) == cpu));
            if (shared || w->spin_yield) {
                sched_yield();
                continue;
            }
            /* shared memory: spin while the peer is likely running on another core (not
             * on sockets: there the poll() below wakes sooner than busy retries get data) */
#if defined(__x86_64__) || defined(__i386__)
            __builtin_ia32_pause();
#endif
            continue;
        }
        if ((s_shm || r_shm) && !s_tcp && !r_tcp) {
            /* then sleep until the peer rings (bounded, to notice its death and the
             * deadline); with both directions pending either may move, so nap briefly */
            double nap = (r_shm && s_shm) ? 1e-3 : 50e-3, left = deadline - now;
            if (nap > left) nap = left > 0 ? left : 0;
            if (r_shm) dt_shm_wait_data(r.tp->in, nap);
            else if (s.cma) dt_shm_wait_ack(s.tp->out, s.want_ack - 1, nap);
            else dt_shm_wait_space(s.tp->out, nap);
            if (r_shm && peer_gone(tc, r.peer)) r_gone = 1;
            if (s_shm && peer_gone(tc, s.peer)) s_gone = 1;
            continue;
        }
        struct pollfd pf[4];
        int np = 0, ps = -1, pr = -1;
        if (s_tcp) pf[np++] = (struct pollfd){ .fd = s.tp->fd, .events = POLLOUT };
        if (r_tcp) pf[np++] = (struct pollfd){ .fd = r.tp->fd, .events = POLLIN };
        if (s_shm) { ps = np; pf[np++] = (struct pollfd){ .fd = s.tp->fd, .events = POLLRDHUP }; }
        if (r_shm) { pr = np; pf[np++] = (struct pollfd){ .fd = r.tp->fd, .events = POLLRDHUP }; }
        double left = deadline - now;
        int ms = (s_shm || r_shm) ? 1 : (left > 1.0 ? 1000 : (int)(left * 1000) + 1);
        int rc = poll(pf, (nfds_t)np, ms);
        if (rc < 0 && errno != EINTR) return dt_error(DT_ERR_IO, "poll: %s", strerror(errno));
        if (rc > 0 && ps >= 0 && pf[ps].revents) s_gone = peer_gone(tc, s.peer);
        if (rc > 0 && pr >= 0 && pf[pr].revents) r_gone = peer_gone(tc, r.peer);
    }
    return DT_OK;
}
