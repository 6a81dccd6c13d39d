/*
 * algo.c: the collective algorithms, written once over the point-to-point primitive
 * dt_p2p (comm_impl.h), so the tcp backend and the mpi backend in deterministic mode
 * compute bitwise the same results.
 *
 * Reduction order (docs/DESIGN.md rule 2). For a power-of-two world size W, all_reduce is
 * recursive halving (a reduce-scatter) then recursive doubling (an all-gather). Step k
 * pairs rank r with r ^ (1 << k): first (0,1),(2,3),..., then (01,23),... Every element
 * is therefore the sum over one fixed binary tree of ranks,
 *     ((x0 + x1) + (x2 + x3)) + ((x4 + x5) + (x6 + x7)),
 * whatever block of the array a rank happens to own, and since IEEE addition commutes
 * both ranks of a pair compute the same bits. A rank that holds 2 local buffers and
 * pre-sums them (b0 + b1) is indistinguishable from the pair (0,1) of a world twice as
 * large. Small messages use recursive doubling on the whole buffer (one exchange per
 * step, fewer latencies) over the same pairs, hence the same tree. reduce_scatter
 * halves over the same pairs; reduce is a binomial tree over the same pairs (rings:
 * all_reduce kept on the root).
 *
 * Other world sizes use rings (reduce-scatter then all-gather, W-1 steps each); their
 * results agree with the power-of-two ones to rounding only.
 *
 * Blocks: an array of count elements is cut into W blocks, the first count % W of them
 * one element longer, so any count (0, 1, not divisible by W) works.
 */
#include "config.h"
#include "comm_impl.h"
#include "reduce.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static int is_pow2(int w) { return w > 0 && (w & (w - 1)) == 0; }
static int log2i(int w) { int l = 0; while ((1 << l) < w) l++; return l; }

size_t dt_algo_block_offset(size_t count, int nb, int b) {
    size_t q = count / (size_t)nb, r = count % (size_t)nb;
    return (size_t)b * q + ((size_t)b < r ? (size_t)b : r);
}
#define boff dt_algo_block_offset

static dt_status xchg(const dt_p2p *p, const dt_call *call, int dst, const void *sbuf, size_t sb,
                      int src, void *rbuf, size_t rb, const void *racc) {
    dt_xfer x = { .dst = dst, .sbuf = sbuf, .sbytes = sb, .src = src, .rbuf = rbuf, .rbytes = rb, .racc = racc };
    return p->xfer(p->ctx, &x, call);
}

/* Scratch space. From TMP_KEEP bytes on, each thread reuses one buffer (grown, never
 * shrunk; a nested request while it is taken gets its own): malloc maps a fresh
 * allocation of 32 MiB or more on every call, and every page of it faults at first
 * touch (4 ranks, reduce_scatter of 128 and 256 MiB, whose scratch is 32 and 64 MiB:
 * 0.37 and 0.32 GB/s where 1-64 MiB ran at 3.0-5.5, 2026-12-03). */
#define TMP_KEEP ((size_t)1 << 20)
static _Thread_local char  *tmp_keep;
static _Thread_local size_t tmp_keep_n;
static _Thread_local int    tmp_keep_taken;
static pthread_key_t  tmp_key;      /* the same pointer, freed when its thread exits */
static pthread_once_t tmp_once = PTHREAD_ONCE_INIT;
static int            tmp_key_ok;

static void tmp_key_make(void) { tmp_key_ok = pthread_key_create(&tmp_key, free) == 0; }

static void *tmp_alloc(size_t bytes) {
    if (bytes < TMP_KEEP || tmp_keep_taken) return malloc(bytes ? bytes : 1);
    pthread_once(&tmp_once, tmp_key_make);
    if (!tmp_key_ok) return malloc(bytes);
    if (tmp_keep_n < bytes) {
        free(tmp_keep);
        tmp_keep_n = (tmp_keep = malloc(bytes)) ? bytes : 0;
        pthread_setspecific(tmp_key, tmp_keep);
        if (!tmp_keep) return NULL;
    }
    tmp_keep_taken = 1;
    return tmp_keep;
}

static void tmp_free(void *p) {
    if (p && p == tmp_keep) tmp_keep_taken = 0;
    else free(p);
}
static dt_status nomem(size_t bytes) {
    return dt_error(DT_ERR_NOMEM, "out of memory (%zu bytes of scratch space)", bytes);
}

/* ---- recursive halving / doubling over blocks [0, nb) ------------------------------- */

typedef struct { int lo, hi; } brange;

/* Recursive halving. Step 0 reads src0 (which may be const user input), later steps and
 * every result go to work; both are laid out as nb blocks of the count elements. After
 * the L steps, blocks *own are fully reduced in work; hist[k] holds the range before step k. */
static dt_status halve(const dt_p2p *p, const dt_call *call, const char *src0, char *work,
                       size_t count, int nb, brange *hist, brange *own) {
    size_t es = dt_dtype_size(call->dtype);
    int r = p->rank, L = log2i(p->size);
    brange cur = { 0, nb };
    for (int k = 0; k < L; k++) {
        int partner = r ^ (1 << k), mid = (cur.lo + cur.hi) / 2;
        brange keep = (r & (1 << k)) ? (brange){ mid, cur.hi } : (brange){ cur.lo, mid };
        brange give = (r & (1 << k)) ? (brange){ cur.lo, mid } : (brange){ mid, cur.hi };
        const char *src = k == 0 ? src0 : work;
        size_t ko = boff(count, nb, keep.lo) * es, kn = boff(count, nb, keep.hi) * es - ko;
        size_t go = boff(count, nb, give.lo) * es, gn = boff(count, nb, give.hi) * es - go;
        hist[k] = cur;
        DT_TRY(xchg(p, call, partner, src + go, gn, partner, work + ko, kn, src + ko));
        cur = keep;
    }
    *own = cur;
    return DT_OK;
}

/* Recursive doubling that undoes halve(): step k (from L-1 down) swaps the blocks each
 * rank owns with its partner's, until every rank holds all nb blocks. */
static dt_status double_back(const dt_p2p *p, const dt_call *call, char *work, size_t count, int nb,
                             const brange *hist, brange own) {
    size_t es = dt_dtype_size(call->dtype);
    int r = p->rank, L = log2i(p->size);
    for (int k = L - 1; k >= 0; k--) {
        int partner = r ^ (1 << k);
        brange other = own.lo == hist[k].lo ? (brange){ own.hi, hist[k].hi } : (brange){ hist[k].lo, own.lo };
        size_t mo = boff(count, nb, own.lo) * es, mn = boff(count, nb, own.hi) * es - mo;
        size_t oo = boff(count, nb, other.lo) * es, on = boff(count, nb, other.hi) * es - oo;
        DT_TRY(xchg(p, call, partner, work + mo, mn, partner, work + oo, on, NULL));
        own = hist[k];
    }
    return DT_OK;
}

/* ---- rings ------------------------------------------------------------------------ */

static int mod(int a, int w) { return ((a % w) + w) % w; }

/* Ring reduce-scatter in place over work (nb = W blocks): rank r ends with block r reduced. */
static dt_status ring_reduce_scatter(const dt_p2p *p, const dt_call *call, char *work, size_t count) {
    size_t es = dt_dtype_size(call->dtype);
    int r = p->rank, W = p->size, next = mod(r + 1, W), prev = mod(r - 1, W);
    for (int s = 0; s < W - 1; s++) {
        int sb = mod(r - s - 1, W), rb = mod(r - s - 2, W);
        size_t so = boff(count, W, sb) * es, sn = boff(count, W, sb + 1) * es - so;
        size_t ro = boff(count, W, rb) * es, rn = boff(count, W, rb + 1) * es - ro;
        DT_TRY(xchg(p, call, next, work + so, sn, prev, work + ro, rn, work + ro));
    }
    return DT_OK;
}

/* Ring all-gather in place over work: rank r starts with block r, ends with all. */
static dt_status ring_allgather(const dt_p2p *p, const dt_call *call, char *work, size_t count) {
    size_t es = dt_dtype_size(call->dtype);
    int r = p->rank, W = p->size, next = mod(r + 1, W), prev = mod(r - 1, W);
    for (int s = 0; s < W - 1; s++) {
        int sb = mod(r - s, W), rb = mod(r - s - 1, W);
        size_t so = boff(count, W, sb) * es, sn = boff(count, W, sb + 1) * es - so;
        size_t ro = boff(count, W, rb) * es, rn = boff(count, W, rb + 1) * es - ro;
        DT_TRY(xchg(p, call, next, work + so, sn, prev, work + ro, rn, NULL));
    }
    return DT_OK;
}

/* ---- the collectives ------------------------------------------------------------------ */

static void finish_avg(const dt_p2p *p, const dt_call *call, void *buf, size_t n) {
    if (call->op == DT_AVG) dt_reduce_divide(call->dtype, buf, n, p->size);
}

dt_status dt_algo_allreduce(const dt_p2p *p, const dt_call *call, const void *send, void *recv) {
    size_t es = dt_dtype_size(call->dtype), n = call->count, bytes = n * es;
    int W = p->size, r = p->rank;
    if (W == 1 || n == 0) {
        if (send != recv && bytes) memmove(recv, send, bytes);
        finish_avg(p, call, recv, n);
        return DT_OK;
    }
    if (is_pow2(W) && (bytes <= (W == 2 ? DT_ALGO_SMALL_BYTES_2 : DT_ALGO_SMALL_BYTES) || n < (size_t)W)) {
        /* recursive doubling on whole buffers: same pairs, same tree, log2(W) messages.
         * What is sent must not change while the reduction writes recv, so from recv it
         * goes out of a snapshot (a transport may receive before it has sent). */
        char local[4096], *snap = local;
        if (bytes > sizeof local && !(snap = tmp_alloc(bytes))) return nomem(bytes);
        dt_status s = DT_OK;
        const char *cur = send;
        for (int k = 0; (1 << k) < W && s == DT_OK; k++) {
            int partner = r ^ (1 << k);
            if (k > 0 || send == recv) { memcpy(snap, recv, bytes); cur = snap; }
            s = xchg(p, call, partner, cur, bytes, partner, recv, bytes, cur);
        }
        if (snap != local) tmp_free(snap);
        if (s == DT_OK) finish_avg(p, call, recv, n);
        return s;
    }
    if (is_pow2(W)) {
        brange hist[32], own;
        DT_TRY(halve(p, call, send, recv, n, W, hist, &own));
        DT_TRY(double_back(p, call, recv, n, W, hist, own));
        finish_avg(p, call, recv, n);
        return DT_OK;
    }
    if (send != recv) memmove(recv, send, bytes);
    DT_TRY(ring_reduce_scatter(p, call, recv, n));
    DT_TRY(ring_allgather(p, call, recv, n));
    finish_avg(p, call, recv, n);
    return DT_OK;
}

static unsigned bitrev(unsigned x, int bits) {
    unsigned y = 0;
    for (int i = 0; i < bits; i++) y |= ((x >> i) & 1u) << (bits - 1 - i);
    return y;
}

/* Power-of-two reduce_scatter, block by block: step k pairs rank r with r ^ (1 << k), as
 * halve() does, so every element is summed over the same tree as all_reduce's; the blocks
 * a rank keeps are those that agree with r in bits 0..k, so rank r ends with block r
 * itself and nothing is permuted or copied. Block b's partial sum is read from send at
 * step 0 and lives afterwards in recv (b == r) or in a slot of work (the other blocks
 * with r's parity, W/2 - 1 of them). Step k sends W >> (k + 1) blocks, one message each,
 * pairing the i-th block given with the i-th kept in increasing order (which are the
 * partner's i-th kept and given). W <= 128. */
static dt_status rs_blocks(const dt_p2p *p, const dt_call *call, const char *send, char *recv, size_t rb, char *work) {
    int W = p->size, r = p->rank;
    for (int k = 0; (1 << k) < W; k++) {
        int partner = r ^ (1 << k), give[64], keep[64], ng = 0, nk = 0;
        /* the blocks held before step k agree with r in bits 0..k-1 */
        for (int b = r & ((1 << k) - 1); b < W; b += 1 << k)
            if ((b ^ r) & (1 << k)) give[ng++] = b; else keep[nk++] = b;
        for (int i = 0; i < nk; i++) {
            int g = give[i], q = keep[i];
            int gs = (g >> 1) - ((g >> 1) > (r >> 1)), qs = (q >> 1) - ((q >> 1) > (r >> 1));   /* slots */
            const char *gp = k == 0 ? send + (size_t)g * rb : work + (size_t)gs * rb;
            char *qd = q == r ? recv : work + (size_t)qs * rb;
            DT_TRY(xchg(p, call, partner, gp, rb, partner, qd, rb, k == 0 ? send + (size_t)q * rb : qd));
        }
    }
    return DT_OK;
}

dt_status dt_algo_reduce_scatter(const dt_p2p *p, const dt_call *call, const void *send, void *recv) {
    size_t es = dt_dtype_size(call->dtype), rc = call->count, rb = rc * es;
    int W = p->size, r = p->rank;
    size_t total = rb * (size_t)W;
    const char *sp = send;
    char *rp = recv;
    if (W == 1 || rc == 0) {
        if (rb && rp != sp) memmove(rp, sp, rb);
        finish_avg(p, call, recv, rc);
        return DT_OK;
    }
    /* recv may be block r of send itself (in place); any other overlap works on a copy.
     * Block by block sends W - 1 messages where halving a permuted copy sends log2(W):
     * it pays once the copy it saves outweighs the extra messages (with 4 ranks on 2
     * cores, from about 1 MiB; 512 KiB per extra message). */
    int overlap = rp < sp + total && sp < rp + rb && rp != sp + (size_t)r * rb;
    dt_status s;
    if (is_pow2(W) && W <= 128 && !overlap && total > (size_t)(W - 1 - log2i(W)) * (512u << 10)) {
        size_t wb = (size_t)(W / 2 - 1) * rb;
        char *work = wb ? tmp_alloc(wb) : NULL;
        if (wb && !work) return nomem(wb);
        s = rs_blocks(p, call, sp, rp, rb, work);
        tmp_free(work);
        if (s == DT_OK) finish_avg(p, call, recv, rc);
        return s;
    }
    char *work = tmp_alloc(total);
    if (!work) return nomem(total);
    if (is_pow2(W)) {
        /* Small arrays: one message per step. Lay the blocks out bit-reversed, so halving
         * (which keeps the lower half on the rank whose bit k is 0) leaves rank r with
         * block r, over the usual pairs. */
        int L = log2i(W);
        for (int pos = 0; pos < W; pos++)
            memcpy(work + (size_t)pos * rb, sp + (size_t)bitrev((unsigned)pos, L) * rb, rb);
        brange hist[32], own;
        s = halve(p, call, work, work, rc * (size_t)W, W, hist, &own);
        if (s == DT_OK) memcpy(rp, work + (size_t)own.lo * rb, rb);
    } else {
        memcpy(work, sp, total);
        s = ring_reduce_scatter(p, call, work, rc * (size_t)W);
        if (s == DT_OK) memcpy(rp, work + (size_t)r * rb, rb);
    }
    tmp_free(work);
    if (s == DT_OK) finish_avg(p, call, recv, rc);
    return s;
}

dt_status dt_algo_allgather(const dt_p2p *p, const dt_call *call, const void *send, void *recv) {
    size_t es = dt_dtype_size(call->dtype), cb = call->count * es;
    int W = p->size, r = p->rank;
    char *rp = recv, *own = rp + (size_t)r * cb;
    const char *sp = send;
    /* send is this rank's block of recv (in place), lies outside recv, or elsewhere in it
     * (send == recv): then it is moved into place first */
    int placed = sp == own, apart = sp + cb <= rp || rp + (size_t)W * cb <= sp;
    if (cb && !placed && !apart) { memmove(own, sp, cb); placed = 1; }
    if (is_pow2(W) && W > 1) {
        /* Recursive doubling. Step 0 sends this rank's block alone, straight from send,
         * and the transport copies it into recv as it goes (one pass over send instead of
         * a copy and a send). */
        for (int k = 0; (1 << k) < W; k++) {
            int partner = r ^ (1 << k);
            size_t mine = (size_t)((r >> k) << k) * cb, theirs = (size_t)((partner >> k) << k) * cb;
            dt_xfer x = { .dst = partner, .sbuf = rp + mine, .sbytes = cb << k, .src = partner,
                          .rbuf = rp + theirs, .rbytes = cb << k };
            if (k == 0 && !placed) { x.sbuf = sp; x.scopy = own; }
            DT_TRY(p->xfer(p->ctx, &x, call));
        }
        return DT_OK;
    }
    if (cb && !placed) memcpy(own, sp, cb);
    if (W == 1) return DT_OK;
    return ring_allgather(p, call, recv, call->count * (size_t)W);
}

/* rank of relative rank v in a tree rooted at root: by XOR on a power-of-two world
 * (relative rank r ^ root), by rotation otherwise */
static int unrel(int v, int root, int W) { return is_pow2(W) ? v ^ root : mod(v + root, W); }

dt_status dt_algo_broadcast(const dt_p2p *p, const dt_call *call, const void *send, void *buf) {
    (void)send;   /* the root's data is in buf */
    size_t bytes = call->count * dt_dtype_size(call->dtype);
    int W = p->size, root = call->root, vr = is_pow2(W) ? p->rank ^ root : mod(p->rank - root, W);
    /* binomial tree: at step `mask` the ranks [0, mask) (relative to root) hold the data
     * and send it to [mask, 2 mask). On a power-of-two world the step pairs rank r with
     * r ^ mask, whatever the root: the pairs of all_reduce's halving and doubling, so a
     * broadcast from any root (sharding broadcasts from every shard's owner) needs no
     * connection or shared-memory ring of its own */
    for (int mask = 1; mask < W; mask <<= 1) {
        if (vr < mask && vr + mask < W)
            DT_TRY(xchg(p, call, unrel(vr + mask, root, W), buf, bytes, -1, NULL, 0, NULL));
        else if (vr >= mask && vr < 2 * mask)
            DT_TRY(xchg(p, call, -1, NULL, 0, unrel(vr - mask, root, W), buf, bytes, NULL));
    }
    return DT_OK;
}

dt_status dt_algo_reduce(const dt_p2p *p, const dt_call *call, const void *send, void *recv) {
    size_t n = call->count, bytes = n * dt_dtype_size(call->dtype);
    int W = p->size, root = call->root, vr = p->rank ^ root;
    if (!is_pow2(W) || W == 1 || n == 0) {
        /* the ring's tree: all_reduce kept on the root */
        if (p->rank == root) return dt_algo_allreduce(p, call, send, recv);
        void *tmp = tmp_alloc(bytes);
        if (!tmp) return nomem(bytes);
        dt_status s = dt_algo_allreduce(p, call, send, tmp);
        tmp_free(tmp);
        return s;
    }
    /* Binomial tree over all_reduce's pairs: step k pairs rank r with r ^ (1 << k), so
     * every element is summed over the same tree of ranks as all_reduce's, whichever the
     * root: ((x0 + x1) + (x2 + x3)) + ... (IEEE addition commutes). A rank whose bit k
     * of r ^ root is the lowest one set sends its partial sum up and is done; the others
     * add their partner's. Each rank sends the array at most once (all_reduce: twice its
     * size in halves), and a leaf sends straight from send. */
    char *work = p->rank == root ? recv : NULL;
    const char *cur = send;
    dt_status s = DT_OK;
    for (int k = 0; (1 << k) < W && s == DT_OK; k++) {
        int partner = p->rank ^ (1 << k);
        if (vr & (1 << k)) {
            s = xchg(p, call, partner, cur, bytes, -1, NULL, 0, NULL);
            break;
        }
        if (!work && !(work = tmp_alloc(bytes))) return nomem(bytes);
        s = xchg(p, call, -1, NULL, 0, partner, work, bytes, cur);
        cur = work;
    }
    if (s == DT_OK && p->rank == root) finish_avg(p, call, recv, n);   /* the root's work is recv */
    if (work && work != recv) tmp_free(work);
    return s;
}

dt_status dt_algo_barrier(const dt_p2p *p, const dt_call *call, const void *send, void *recv) {
    (void)send; (void)recv;
    /* dissemination: after ceil(log2 W) rounds every rank has heard from every other */
    int W = p->size, r = p->rank;
    for (int d = 1; d < W; d <<= 1)
        DT_TRY(xchg(p, call, mod(r + d, W), NULL, 0, mod(r - d, W), NULL, 0, NULL));
    return DT_OK;
}

/* The algorithms in the list's order (comm_impl.h declares one per row, so a collective
 * without its algorithm does not link). */
dt_algo_fn dt_algo_of(int kind) {
    static const dt_algo_fn algos[] = {
#define ALGO_ROW_(ID, id, name, flags) dt_algo_##id,
        DT_COLLECTIVES(ALGO_ROW_)
#undef ALGO_ROW_
    };
    return dt_coll_get(kind) ? algos[kind - 1] : NULL;
}
