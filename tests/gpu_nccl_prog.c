/*
 * gpu_nccl_prog.c: the multi-process driver of tests/gpu_nccl.sh — the "nccl" backend
 * on device buffers. Started N times by dtrun (one GPU per local rank), it runs a mode:
 *
 *   --mode all       all_reduce for every type x operator, in and out of place; broadcast,
 *                    all_gather and reduce_scatter in and out of place; reduce; send/recv
 *                    in pairs; barrier; an async all_reduce; split. Inputs are small
 *                    integers ((rank + i) % 3 + 1), so sums, products, minima and maxima
 *                    are exact in every type and compared exactly (avg of floating types
 *                    within rounding). Rank 0 prints TAP lines; a rank exits 0 only if all
 *                    its checks passed.
 *   --mode every     every collective of the list (src/comm/coll.h) on device buffers, from
 *                    the table of tests/coll_cases.h (the one tests/comm_every.sh runs on the
 *                    host backends): each element type, operator and placement.
 *   --mode mismatch  rank 0 calls all_reduce, the others broadcast: every rank must get
 *                    DT_ERR_MISMATCH naming the calls (exit 0 when it does).
 *   --mode timeout   rank 1 sleeps past the timeout; the others all_reduce with a 3 s
 *                    timeout and must get DT_ERR_TIMEOUT naming rank 1 (exit 0 when so).
 *   --mode tree      (run with DT_DETERMINISTIC=1) all_reduce of non-integer f32, f64,
 *                    f16 and bf16 values (sum, avg, max; 1 to 100003 elements) equals, byte
 *                    for byte, dtrain's tree computed here on the host with the tcp
 *                    backend's arithmetic (reduce.c): ((x0 + x1) + (x2 + x3)) + ...
 *   --mode init      join, open the GPU, print "rank R: local rank L of S, device D, PCI
 *                    bus id B" and leave.
 *   --mode host      the checks of "all" on HOST buffers (pageable and pinned in turn),
 *                    which the backend sends over its tcp side channel; then a call that
 *                    mixes a device send buffer with a host receive buffer (DT_ERR_INVALID
 *                    naming both kinds), and rank 0 passing host buffers where the others
 *                    pass device buffers (DT_ERR_MISMATCH on every rank, naming the kinds).
 * Errors print "ERROR: <message>" on stderr and exit 1.
 */
#include "comm.h"
#include "reduce.h"
#include "cuda/dt_cuda.h"
#include "rank_tap.h"
#include "coll_cases.h"
#include "ops.h"
#include "status.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const dt_ops *G;
static dt_comm *comm;
static int on_host;   /* --mode host: buffers in host memory */

static void die(const char *what) {
    fprintf(stderr, "ERROR: %s: %s\n", what, dt_last_error());
    exit(1);
}
#define MUST(expr) do { if ((expr) != DT_OK) die(#expr); } while (0)

/* ---- typed host values ---- */

static double get(const void *buf, dt_dtype t, size_t i) {
    switch (t) {
    case DT_F32: return ((const float *)buf)[i];
    case DT_F64: return ((const double *)buf)[i];
    case DT_I32: return ((const int32_t *)buf)[i];
    case DT_I64: return (double)((const int64_t *)buf)[i];
    case DT_U8:  return ((const uint8_t *)buf)[i];
    case DT_F16: { float f; MUST(dt_ops_cpu()->f16_to_f32(&f, (const uint16_t *)buf + i, 1)); return f; }
    default:     { float f; MUST(dt_ops_cpu()->bf16_to_f32(&f, (const uint16_t *)buf + i, 1)); return f; }
    }
}

static void put(void *buf, dt_dtype t, size_t i, double v) {
    float f = (float)v;
    switch (t) {
    case DT_F32: ((float *)buf)[i] = f; break;
    case DT_F64: ((double *)buf)[i] = v; break;
    case DT_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case DT_I64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case DT_U8:  ((uint8_t *)buf)[i] = (uint8_t)v; break;
    case DT_F16: MUST(dt_ops_cpu()->f32_to_f16((uint16_t *)buf + i, &f, 1)); break;
    default:     MUST(dt_ops_cpu()->f32_to_bf16((uint16_t *)buf + i, &f, 1)); break;
    }
}

static double val(int rank, size_t i) { return (double)((rank + (int)(i % 7)) % 3 + 1); }

static double expect(dt_redop op, dt_dtype t, size_t i) {
    double a = op == DT_PROD ? 1 : op == DT_MIN ? 1e9 : op == DT_MAX ? -1e9 : 0;
    for (int r = 0; r < W; r++) {
        double v = val(r, i);
        if (op == DT_SUM || op == DT_AVG) a += v;
        else if (op == DT_PROD) a *= v;
        else if (op == DT_MIN) a = v < a ? v : a;
        else a = v > a ? v : a;
    }
    if (op == DT_AVG) a = (t == DT_I32 || t == DT_I64 || t == DT_U8) ? floor(a / W) : a / W;
    if (t == DT_U8) a = fmod(a, 256.0);
    return a;
}

/* ---- test buffers: device memory, or host memory (pinned every other time) ---- */

#define MAX_PINNED 16
static void *pinned[MAX_PINNED];

static void *buf_alloc(size_t bytes) {
    static unsigned turn;
    void *p = NULL;
    if (!on_host) {
        MUST(G->alloc(&p, bytes));
    } else if (turn++ % 2 == 0) {
        if (!(p = malloc(bytes))) die("malloc");
    } else {
        MUST(G->host_alloc(&p, bytes));
        int i = 0;
        while (i < MAX_PINNED && pinned[i]) i++;
        if (i == MAX_PINNED) die("too many pinned test buffers");
        pinned[i] = p;
    }
    return p;
}

static void buf_free(void *p) {
    if (!on_host) { G->free(p); return; }
    for (int i = 0; i < MAX_PINNED; i++)
        if (pinned[i] == p) { pinned[i] = NULL; G->host_free(p); return; }
    free(p);
}

/* Copies between test buffers and plain host memory (d2d between test buffers). */
static void buf_put(void *b, const void *h, size_t n) { if (on_host) memcpy(b, h, n); else MUST(G->copy_h2d(b, h, n)); }
static void buf_get(void *h, const void *b, size_t n) { if (on_host) memcpy(h, b, n); else MUST(G->copy_d2h(h, b, n)); }
static void buf_copy(void *d, const void *s, size_t n) { if (on_host) memcpy(d, s, n); else MUST(G->copy_d2d(d, s, n)); }

/* Fill a test buffer of n elements of t with f(rank, i). */
static void *dev_filled(dt_dtype t, size_t n, int rank) {
    size_t es = dt_dtype_size(t);
    unsigned char *h = malloc(n * es + 1);
    if (!h) die("malloc");
    for (size_t i = 0; i < n; i++) put(h, t, i, val(rank, i));
    void *d = buf_alloc(n * es + 64);
    buf_put(d, h, n * es);
    free(h);
    return d;
}

static void *host_of(const void *d, size_t bytes) {
    void *h = malloc(bytes + 1);
    if (!h) die("malloc");
    buf_get(h, d, bytes);
    return h;
}

/* ---- mode all ---- */

static void test_allreduce(void) {
    const size_t n = 100003;
    for (int t = 0; t < DT_COMM_NDTYPES; t++)
        for (int op = 0; op < DT_REDOP_COUNT; op++)
            for (int inplace = 0; inplace < 2; inplace++) {
                size_t es = dt_dtype_size((dt_dtype)t);
                void *s = dev_filled((dt_dtype)t, n, R), *r = inplace ? s : dev_filled((dt_dtype)t, n, 99);
                MUST(dt_allreduce(comm, s, r, n, (dt_dtype)t, (dt_redop)op));
                unsigned char *h = host_of(r, n * es);
                int good = 1;
                for (size_t i = 0; i < n && good; i++) {
                    double want = expect((dt_redop)op, (dt_dtype)t, i), got = get(h, (dt_dtype)t, i);
                    double tol = op == DT_AVG && (t == DT_F16 || t == DT_BF16) ? 1e-2 * want
                               : op == DT_AVG && t == DT_F32 ? 1e-6 * want : op == DT_AVG && t == DT_F64 ? 1e-12 * want : 0;
                    if (fabs(got - want) > tol) {
                        good = 0;
                        fprintf(stderr, "rank %d: element %zu: got %g, want %g\n", R, i, got, want);
                    }
                }
                check(good, "all_reduce %s %s %s", dt_dtype_name((dt_dtype)t), dt_redop_name((dt_redop)op),
                      inplace ? "in place" : "out of place");
                free(h);
                buf_free(s);
                if (!inplace) buf_free(r);
            }
}

static void test_moves(void) {
    const size_t n = 4099;
    /* broadcast from the last rank */
    float *b = dev_filled(DT_F32, n, R);
    MUST(dt_broadcast(comm, b, n, DT_F32, W - 1));
    float *h = host_of(b, n * 4);
    int good = 1;
    for (size_t i = 0; i < n; i++) good &= h[i] == (float)val(W - 1, i);
    check(good, "broadcast f32 from rank %d", W - 1);
    free(h);
    buf_free(b);

    /* all_gather out of place, and in place with send == recv */
    for (int inplace = 0; inplace < 2; inplace++) {
        float *s = dev_filled(DT_F32, n, R), *r = NULL;
        r = buf_alloc(n * W * 4);
        if (inplace) buf_copy(r, s, n * 4);
        MUST(dt_allgather(comm, inplace ? r : s, r, n, DT_F32));
        h = host_of(r, n * W * 4);
        good = 1;
        for (int k = 0; k < W; k++)
            for (size_t i = 0; i < n; i++) good &= h[k * n + i] == (float)val(k, i);
        check(good, "all_gather f32 %s", inplace ? "in place (send == recv)" : "out of place");
        free(h);
        buf_free(s);
        buf_free(r);
    }

    /* reduce_scatter out of place, and in place with send == recv */
    for (int inplace = 0; inplace < 2; inplace++) {
        float *s = dev_filled(DT_F32, n * W, R), *r = inplace ? s : dev_filled(DT_F32, n, 99);
        MUST(dt_reduce_scatter(comm, s, r, n, DT_F32, DT_SUM));
        h = host_of(r, n * 4);
        good = 1;
        for (size_t i = 0; i < n; i++) good &= h[i] == (float)expect(DT_SUM, DT_F32, R * n + i);
        check(good, "reduce_scatter f32 sum %s", inplace ? "in place (send == recv)" : "out of place");
        free(h);
        buf_free(s);
        if (!inplace) buf_free(r);
    }

    /* reduce to rank 0 */
    float *s = dev_filled(DT_F32, n, R), *r = dev_filled(DT_F32, n, 99);
    MUST(dt_reduce(comm, s, R == 0 ? r : NULL, n, DT_F32, DT_MAX, 0));
    if (R == 0) {
        h = host_of(r, n * 4);
        good = 1;
        for (size_t i = 0; i < n; i++) good &= h[i] == (float)expect(DT_MAX, DT_F32, i);
        free(h);
    }
    check(good, "reduce f32 max to rank 0");

    /* send/recv in pairs (0,1), (2,3), ...: even ranks send first */
    if (W % 2 == 0 || R < W - 1) {
        int peer = R ^ 1;
        if (R % 2 == 0) {
            MUST(dt_send(comm, s, n, DT_F32, peer, 7));
            MUST(dt_recv(comm, r, n, DT_F32, peer, 8));
        } else {
            MUST(dt_recv(comm, r, n, DT_F32, peer, 7));
            MUST(dt_send(comm, s, n, DT_F32, peer, 8));
        }
        h = host_of(r, n * 4);
        good = 1;
        for (size_t i = 0; i < n; i++) good &= h[i] == (float)val(peer, i);
        free(h);
        check(good, "send/recv f32 with rank %d", peer);
    }
    MUST(dt_barrier(comm));
    check(1, "barrier");

    /* async all_reduce: the worker thread binds the device itself */
    dt_work *wk = NULL;
    MUST(dt_allreduce_async(comm, s, r, n, DT_F32, DT_SUM, &wk));
    MUST(dt_work_wait(wk));
    h = host_of(r, n * 4);
    good = 1;
    for (size_t i = 0; i < n; i++) good &= h[i] == (float)expect(DT_SUM, DT_F32, i);
    free(h);
    check(good, "all_reduce_async f32 sum");

    /* split by parity, all_reduce in the child */
    dt_comm *child = NULL;
    MUST(dt_comm_split(comm, R % 2, R, &child));
    MUST(dt_allreduce(child, s, r, n, DT_F32, DT_SUM));
    h = host_of(r, n * 4);
    good = 1;
    for (size_t i = 0; i < n; i++) {
        double want = 0;
        for (int k = R % 2; k < W; k += 2) want += val(k, i);
        good &= h[i] == (float)want;
    }
    free(h);
    check(good, "split by parity: all_reduce within the group of %d", dt_comm_size(child));
    dt_comm_destroy(child);
    buf_free(s);
    buf_free(r);
}

/* ---- mode tree: the deterministic all_reduce is dtrain's tree, bit for bit ---- */

static double fval(int rank, size_t i) { return 3.7 * sin(0.37 * (double)i + 1.3 * rank) + 0.001 * (double)(i % 13); }

static void test_tree(void) {
    if (W & (W - 1)) {
        check(1, "%d ranks: not a power of two, so no device tree to check", W);
        return;
    }
    const size_t counts[] = {1, 3, 1000, 100003};
    const dt_dtype types[] = {DT_F32, DT_F64, DT_F16, DT_BF16};
    const dt_redop ops[] = {DT_SUM, DT_AVG, DT_MAX};
    for (int ti = 0; ti < 4; ti++)
        for (int oi = 0; oi < 3; oi++)
            for (int ci = 0; ci < 4; ci++) {
                dt_dtype t = types[ti];
                size_t n = counts[ci], es = dt_dtype_size(t);
                unsigned char *all = malloc((size_t)W * n * es + 1), *mine = NULL;
                if (!all) die("malloc");
                for (int k = 0; k < W; k++)
                    for (size_t i = 0; i < n; i++) put(all + (size_t)k * n * es, t, i, fval(k, i));
                void *d = buf_alloc(n * es + 64);
                buf_put(d, all + (size_t)R * n * es, n * es);
                MUST(dt_allreduce(comm, d, d, n, t, ops[oi]));
                mine = host_of(d, n * es);
                /* the tree on the host: level by level, block k absorbs block k + step */
                for (int step = 1; step < W; step *= 2)
                    for (int k = 0; k < W; k += 2 * step)
                        dt_reduce_apply(ops[oi], t, all + (size_t)k * n * es, all + (size_t)k * n * es,
                                        all + (size_t)(k + step) * n * es, n);
                if (ops[oi] == DT_AVG) dt_reduce_divide(t, all, n, W);
                check(memcmp(mine, all, n * es) == 0, "all_reduce %s %s of %zu elements is dtrain's tree bit for bit",
                      dt_dtype_name(t), dt_redop_name(ops[oi]), n);
                free(mine);
                free(all);
                buf_free(d);
            }
}

/* ---- mode host: what the backend refuses ---- */

static void test_kinds(void) {
    on_host = 0;
    float *d = dev_filled(DT_F32, 64, R), h[64];
    dt_status s = dt_allreduce(comm, d, h, 64, DT_F32, DT_SUM);
    check(s == DT_ERR_INVALID && strstr(dt_last_error(), "send buffer is device memory") &&
          strstr(dt_last_error(), "receive buffer host memory"),
          "a device send buffer with a host receive buffer is refused, naming both (%s)", dt_last_error());
    /* a sparse array (sharding's) where nothing is mapped yet: the runtime reports such an
     * address as unregistered, host, memory; the backend's own memory is device memory, so
     * with a host receive buffer it is refused as a mix, never read as host memory */
    void *sp = NULL;
    MUST(G->alloc_sparse(&sp, (size_t)4 << 20));
    s = dt_allreduce(comm, sp, h, 64, DT_F32, DT_SUM);
    check(s == DT_ERR_INVALID && strstr(dt_last_error(), "send buffer is device memory"),
          "an unmapped part of a sparse device array is device memory, not host memory (%s)", dt_last_error());
    G->free(sp);
    s = dt_allreduce(comm, R == 0 ? (void *)h : (void *)d, R == 0 ? (void *)h : (void *)d, 64, DT_F32, DT_SUM);
    check(s == DT_ERR_MISMATCH && strstr(dt_last_error(), R == 0 ? "this rank passed host buffers" :
                                         "this rank passed device buffers"),
          "rank 0 on host buffers, the others on device buffers: a mismatch on every rank (%s)", dt_last_error());
    buf_free(d);
}

int main(int argc, char **argv) {
    const char *mode = "all";
    for (int i = 1; i + 1 < argc; i += 2)
        if (!strcmp(argv[i], "--mode")) mode = argv[i + 1];
    dt_comm_opts o;
    dt_comm_opts_default(&o);
    o.backend = "nccl";
    MUST(dt_comm_init(&o, &comm));   /* first: it opens the GPU of this local rank */
    R = dt_comm_rank(comm);
    W = dt_comm_size(comm);
    dt_device_opts dev = {.index = dt_comm_local_rank(comm)};
    G = dt_ops_get_ex("cuda", &dev);
    if (!G) die("dt_ops_get_ex(\"cuda\")");
    if (!strcmp(mode, "init")) {
        char bus[64] = "?";
        MUST(dt_cuda_pci_bus_id(dt_comm_local_rank(comm), bus, sizeof bus));
        printf("rank %d: local rank %d of %d, device %d, PCI bus id %s\n", R, dt_comm_local_rank(comm),
               dt_comm_local_size(comm), dt_cuda_device(), bus);
        dt_comm_destroy(comm);
        return 0;
    }

    if (!strcmp(mode, "mismatch")) {
        float *b = dev_filled(DT_F32, 16, R);
        dt_status s = R == 0 ? dt_allreduce(comm, b, b, 16, DT_F32, DT_SUM) : dt_broadcast(comm, b, 16, DT_F32, 0);
        const char *m = dt_last_error();
        printf("rank %d: status %d: %s\n", R, (int)s, m);
        dt_comm_destroy(comm);
        return s == DT_ERR_MISMATCH && strstr(m, "all_reduce") && strstr(m, "broadcast") ? 0 : 1;
    }
    if (!strcmp(mode, "timeout")) {
        MUST(dt_comm_set_timeout(comm, 3.0));
        float *b = dev_filled(DT_F32, 16, R);
        if (R == 1) {
            sleep(6);
            return 0;
        }
        dt_status s = dt_allreduce(comm, b, b, 16, DT_F32, DT_SUM);
        const char *m = dt_last_error();
        printf("rank %d: status %d: %s\n", R, (int)s, m);
        return s == DT_ERR_TIMEOUT && strstr(m, "rank 1") ? 0 : 1;
    }
    if (!strcmp(mode, "tree")) {
        test_tree();
        dt_comm_destroy(comm);
        if (R == 0) printf("1..%d\n", ntest);
        return nfail ? 1 : 0;
    }
    if (!strcmp(mode, "every")) {
        static const cc_mem device = { .alloc = buf_alloc, .release = buf_free, .put = buf_put, .get = buf_get };
        cc_run_all(comm, &device);
        dt_comm_destroy(comm);
        if (R == 0) printf("1..%d\n", ntest);
        return nfail ? 1 : 0;
    }
    on_host = !strcmp(mode, "host");
    test_allreduce();
    test_moves();
    if (on_host) test_kinds();
    dt_comm_destroy(comm);
    if (R == 0) printf("1..%d\n", ntest);
    return nfail ? 1 : 0;
}
