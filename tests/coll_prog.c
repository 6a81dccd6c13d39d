/*
 * coll_prog.c: a multi-process driver for the communication tests. Started N times (by
 * the tests/comm_*.sh scripts with RANK/WORLD_SIZE/MASTER_* set, by dtrun or by mpirun),
 * it joins the job and runs one mode:
 *
 *   --mode all      every collective x type x operator, in and out of place, counts 0, 1,
 *                   odd and not divisible by the world size, large (pipelined) ones,
 *                   async work, split, send/recv; inputs are small integers, so every
 *                   result is exact and compared bit for bit. --big adds one 64 MiB
 *                   all_reduce. Rank 0 prints TAP lines; every rank's exit code is 0
 *                   only if all its checks passed.
 *   --mode every    every collective of the list (src/comm/coll.h) on host buffers, from the
 *                   table of tests/coll_cases.h: each element type, operator and placement,
 *                   exact. TAP from rank 0, as --mode all.
 *   --mode tree     the world-size invariance check of docs/DESIGN.md rule 2: 8 fixed buffers
 *                   of awkward floats, rank r holds 8/W of them and pre-sums them
 *                   pairwise, then all_reduce; rank 0 writes the result bytes to --dump
 *                   FILE, which must be identical for W = 1, 2, 4, 8.
 *   --mode slices   reduce_scatter is all_reduce cut into blocks, bit for bit (the sharded
 *                   optimizer relies on it): awkward floats in f32, bf16 and f64, sum and
 *                   avg, odd counts per rank on the small and large paths; in place, out
 *                   of place and async; and all_gather of the blocks gives all_reduce's
 *                   array back exactly. TAP from rank 0, as --mode all.
 *   --mode mismatch rank 0 calls all_reduce, the others broadcast, asynchronously
 *                   (expect an error).
 *   --mode timeout  rank 1 never calls (sleeps past the timeout); the others call all_reduce.
 *   --mode hang0    rank 0, the store's host, stops itself (SIGSTOP); the others call all_reduce.
 *   --mode loop     all_reduce of 8 MiB forever (until --iters), for kill tests.
 *   --mode nullbuf  all_reduce with a NULL send buffer.
 *   --mode init     init, print "rank R of W on HOST", barrier, destroy.
 *   --mode env      init, print "rank R of W rendezvous 'HOW' MASTER_ADDR=.. MASTER_PORT=..
 *                   DT_JOB_SECRET=.." (the environment after init: "-" when unset), barrier.
 *   --mode rings    one small all_reduce (recursive doubling: log2(W) partners, checked),
 *                   then print "rank R rings out N in M nofile L" and barrier: the shared-memory
 *                   rings this rank has mapped that it made (out) and that peers made
 *                   (in), told apart by the creator's pid in their names, and its soft
 *                   limit on open files.
 * Options: --init METHOD (default env://), --backend NAME, --iters N, --dump FILE,
 * --timeout S (dt_comm_set_timeout after init).
 * Errors print "ERROR: <message>" on stderr and exit 1 (2 for bad arguments).
 */
#include "comm.h"
#include "rank_tap.h"
#include "coll_cases.h"
#include "dtype.h"   /* dt_f32_to_f16, dt_f32_to_bf16 */

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

static dt_comm *comm;

static int fail_status(dt_status s, const char *what) {
    if (s == DT_OK) return 0;
    fprintf(stderr, "ERROR: %s: %s\n", what, dt_last_error());
    return 1;
}

/* ---- typed element access for exact small values ------------------------------------ */

/* Elements are written by cc_set and inputs come from cc_input (coll_cases.h): small
 * positive integers; prod stays tiny so every type, bf16 included, represents the
 * product exactly. */

/* Expected element i of op over ranks, encoded in type t into out[i]. */
static void expect_elem(dt_dtype t, dt_redop op, size_t i, void *out, int nranks, const int *ranks) {
    long acc = op == DT_PROD ? 1 : op == DT_MIN ? 1000 : op == DT_MAX ? -1000 : 0;
    for (int k = 0; k < nranks; k++) {
        int v = cc_input(ranks ? ranks[k] : k, i, op);
        if (op == DT_SUM || op == DT_AVG) acc += v;
        else if (op == DT_PROD) acc *= v;
        else if (op == DT_MIN) acc = v < acc ? v : acc;
        else acc = v > acc ? v : acc;
    }
    if (op != DT_AVG) { cc_set(t, out, i, (double)acc); return; }
    switch (t) {   /* avg: the exact sum, then one division in the type's arithmetic */
    case DT_F32:  ((float *)out)[i] = (float)acc / (float)nranks; break;
    case DT_F64:  ((double *)out)[i] = (double)acc / nranks; break;
    case DT_F16:  ((uint16_t *)out)[i] = dt_f32_to_f16((float)acc / (float)nranks); break;
    case DT_BF16: ((uint16_t *)out)[i] = dt_f32_to_bf16((float)acc / (float)nranks); break;
    default:      cc_set(t, out, i, (double)(acc / nranks)); break;
    }
}

static void fill_input(dt_dtype t, dt_redop op, void *p, size_t n, int r, size_t base) {
    for (size_t i = 0; i < n; i++) cc_set(t, p, i, cc_input(r, base + i, op));
}

/* ---- mode all ----------------------------------------------------------------------------- */

static const dt_dtype types[] = { DT_F32, DT_F64, DT_F16, DT_BF16, DT_I32, DT_I64, DT_U8 };
static const dt_redop ops[] = { DT_SUM, DT_AVG, DT_MIN, DT_MAX, DT_PROD };

static void test_allreduce(dt_dtype t, dt_redop op, size_t n, int inplace) {
    size_t es = dt_dtype_size(t);
    char *send = malloc(n * es + 1), *recv = malloc(n * es + 1), *want = malloc(n * es + 1);
    fill_input(t, op, send, n, R, 0);
    for (size_t i = 0; i < n; i++) expect_elem(t, op, i, want, W, NULL);
    dt_status s;
    if (inplace) s = dt_allreduce(comm, send, send, n, t, op);
    else { memset(recv, 0xab, n * es); s = dt_allreduce(comm, send, recv, n, t, op); }
    check(s == DT_OK && memcmp(inplace ? send : recv, want, n * es) == 0, "all_reduce %s %s n=%zu %s%s%s",
          dt_dtype_name(t), dt_redop_name(op), n, inplace ? "in place" : "out of place",
          s ? ": " : "", s ? dt_last_error() : "");
    free(send); free(recv); free(want);
}

static void test_reduce_scatter(dt_dtype t, dt_redop op, size_t rc, int inplace) {
    size_t es = dt_dtype_size(t), n = rc * (size_t)W;
    char *send = malloc(n * es + 1), *recv = malloc(rc * es + 1), *want = malloc(n * es + 1);
    fill_input(t, op, send, n, R, 0);
    for (size_t i = 0; i < n; i++) expect_elem(t, op, i, want, W, NULL);
    char *out = inplace ? send + (size_t)R * rc * es : recv;
    dt_status s = dt_reduce_scatter(comm, send, out, rc, t, op);
    check(s == DT_OK && memcmp(out, want + (size_t)R * rc * es, rc * es) == 0, "reduce_scatter %s %s rc=%zu %s%s%s",
          dt_dtype_name(t), dt_redop_name(op), rc, inplace ? "in place" : "out of place",
          s ? ": " : "", s ? dt_last_error() : "");
    free(send); free(recv); free(want);
}

/* inplace 0: send apart; 1: send is this rank's block of recv; 2: send == recv (this
 * rank's block starts recv and is moved into place) */
static void test_allgather(dt_dtype t, size_t cnt, int inplace) {
    size_t es = dt_dtype_size(t), n = cnt * (size_t)W;
    char *send = malloc(cnt * es + 1), *recv = malloc(n * es + 1), *want = malloc(n * es + 1);
    for (int r = 0; r < W; r++) fill_input(t, DT_SUM, want + (size_t)r * cnt * es, cnt, r, 0);
    fill_input(t, DT_SUM, send, cnt, R, 0);
    memset(recv, 0xcd, n * es);
    dt_status s;
    if (inplace == 1) {
        memcpy(recv + (size_t)R * cnt * es, send, cnt * es);
        s = dt_allgather(comm, recv + (size_t)R * cnt * es, recv, cnt, t);
    } else if (inplace == 2) {
        memcpy(recv, send, cnt * es);
        s = dt_allgather(comm, recv, recv, cnt, t);
    } else {
        s = dt_allgather(comm, send, recv, cnt, t);
    }
    check(s == DT_OK && memcmp(recv, want, n * es) == 0, "all_gather %s cnt=%zu %s%s%s", dt_dtype_name(t), cnt,
          inplace == 1 ? "in place" : inplace ? "send == recv" : "out of place", s ? ": " : "", s ? dt_last_error() : "");
    free(send); free(recv); free(want);
}

static void test_broadcast(dt_dtype t, size_t n, int root) {
    size_t es = dt_dtype_size(t);
    char *buf = malloc(n * es + 1), *want = malloc(n * es + 1);
    fill_input(t, DT_SUM, want, n, root, 0);
    if (R == root) memcpy(buf, want, n * es); else memset(buf, 0, n * es);
    dt_status s = dt_broadcast(comm, buf, n, t, root);
    check(s == DT_OK && memcmp(buf, want, n * es) == 0, "broadcast %s n=%zu root %d%s%s", dt_dtype_name(t), n, root,
          s ? ": " : "", s ? dt_last_error() : "");
    free(buf); free(want);
}

static void test_reduce(dt_dtype t, dt_redop op, size_t n, int root) {
    size_t es = dt_dtype_size(t);
    char *send = malloc(n * es + 1), *recv = malloc(n * es + 1), *want = malloc(n * es + 1);
    fill_input(t, op, send, n, R, 0);
    for (size_t i = 0; i < n; i++) expect_elem(t, op, i, want, W, NULL);
    memset(recv, 0x5a, n * es);
    dt_status s = dt_reduce(comm, send, R == root ? recv : NULL, n, t, op, root);
    check(s == DT_OK && (R != root || memcmp(recv, want, n * es) == 0), "reduce %s %s n=%zu root %d%s%s",
          dt_dtype_name(t), dt_redop_name(op), n, root, s ? ": " : "", s ? dt_last_error() : "");
    free(send); free(recv); free(want);
}

static void test_sendrecv(void) {
    if (W < 2) return;
    enum { N = 100003 };   /* larger than socket buffers and rings: ordering must not deadlock */
    int32_t *a = malloc(N * sizeof *a), *b = malloc(N * sizeof *b);
    for (int i = 0; i < N; i++) a[i] = R * 1000000 + i;
    int next = (R + 1) % W, prev = (R + W - 1) % W;
    dt_status s1, s2;
    if (R % 2 == 0) { s1 = dt_send(comm, a, N, DT_I32, next, 7); s2 = dt_recv(comm, b, N, DT_I32, prev, 7); }
    else { s2 = dt_recv(comm, b, N, DT_I32, prev, 7); s1 = dt_send(comm, a, N, DT_I32, next, 7); }
    int good = s1 == DT_OK && s2 == DT_OK;
    for (int i = 0; good && i < N; i++) good = b[i] == prev * 1000000 + i;
    check(good, "send/recv around the ring%s%s", good ? "" : ": ", good ? "" : dt_last_error());
    check(dt_send(comm, NULL, 3, DT_I32, next, 0) == DT_ERR_INVALID, "send of a NULL buffer is refused");
    check(dt_recv(comm, b, 3, DT_I32, R, 0) == DT_ERR_INVALID && strstr(dt_last_error(), "rank"),
          "recv from this rank is refused, naming the rank");
    free(a); free(b);
}

static void test_async(void) {
    enum { K = 4, N = 50000 };
    float *buf[K];
    dt_work *w[K + 1];
    for (int k = 0; k < K; k++) {
        buf[k] = malloc(N * sizeof(float));
        for (int i = 0; i < N; i++) buf[k][i] = (float)(R + k + i % 3);
        check(dt_allreduce_async(comm, buf[k], buf[k], N, DT_F32, DT_SUM, &w[k]) == DT_OK, "queue all_reduce %d", k);
    }
    int32_t bc[5] = { 0 };
    if (R == 0) for (int i = 0; i < 5; i++) bc[i] = 40 + i;
    check(dt_broadcast_async(comm, bc, 5, DT_I32, 0, &w[K]) == DT_OK, "queue broadcast");
    dt_status s = dt_barrier(comm);    /* a blocking call after pending work: runs after it */
    check(s == DT_OK, "barrier after queued work");
    int good = 1;
    for (int k = 0; k < K; k++) {
        good &= dt_work_wait(w[k]) == DT_OK;
        for (int i = 0; i < N; i++) {
            float want = 0;
            for (int r = 0; r < W; r++) want += (float)(r + k + i % 3);
            good &= buf[k][i] == want;
        }
        free(buf[k]);
    }
    check(good, "async all_reduces complete with exact results");
    check(dt_work_test(w[K]) == 1, "work is done after a later blocking call returned");
    check(dt_work_wait(w[K]) == DT_OK && bc[0] == 40 && bc[4] == 44, "async broadcast delivered");
    float x = 1;
    dt_work *wx = NULL;
    check(dt_allreduce_async(comm, NULL, &x, 1, DT_F32, DT_SUM, &wx) == DT_ERR_INVALID && !wx,
          "async call with a NULL buffer fails at once");
}

static void test_split(void) {
    dt_comm *sub = NULL;
    int color = R % 2, key = -R;    /* reverse order inside each group */
    dt_status s = dt_comm_split(comm, color, key, &sub);
    check(s == DT_OK && sub, "split by rank parity%s%s", s ? ": " : "", s ? dt_last_error() : "");
    if (!sub) return;
    int members[64], n = 0;
    for (int r = W - 1; r >= 0; r--) if (r % 2 == color) members[n++] = r;
    int myidx = -1;
    for (int i = 0; i < n; i++) if (members[i] == R) myidx = i;
    check(dt_comm_size(sub) == n && dt_comm_rank(sub) == myidx, "group size %d, rank %d (ordered by key)", n, myidx);
    enum { N = 3001 };
    int32_t *v = malloc(N * sizeof *v), *want = malloc(N * sizeof *want);
    fill_input(DT_I32, DT_SUM, v, N, R, 0);
    for (int i = 0; i < N; i++) expect_elem(DT_I32, DT_SUM, (size_t)i, want, n, members);
    s = dt_allreduce(sub, v, v, N, DT_I32, DT_SUM);
    int bad = -1;
    for (int i = 0; i < N && bad < 0; i++) if (v[i] != want[i]) bad = i;
    check(s == DT_OK && bad < 0, "all_reduce inside the group%s%s", s ? ": " : "", s ? dt_last_error() : "");
    if (bad >= 0) fprintf(stderr, "rank %d: element %d is %d, expected %d\n", R, bad, v[bad], want[bad]);
    /* the parent still works, interleaved with the child */
    float one = 1;
    s = dt_allreduce(comm, &one, &one, 1, DT_F32, DT_SUM);
    check(s == DT_OK && one == (float)W, "parent all_reduce after split");
    s = dt_barrier(sub);
    check(s == DT_OK, "barrier in the group");
    free(v); free(want);
    dt_comm *none = (dt_comm *)1;
    s = dt_comm_split(comm, R == 0 ? -1 : 0, 0, &none);
    check(s == DT_OK && (R == 0 ? none == NULL : none != NULL), "color < 0 joins no group");
    if (none && R != 0) {
        check(dt_comm_size(none) == W - 1, "the others form a group of %d", W - 1);
        dt_comm_destroy(none);
    }
    dt_comm_destroy(sub);
}

static int mode_all(int big) {
    size_t counts[] = { 0, 1, 7, (size_t)W * 5 + 3, 70001 };
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++)
        for (size_t oi = 0; oi < sizeof ops / sizeof ops[0]; oi++)
            for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++) {
                if (counts[ci] > 100 && types[ti] != DT_F32 && types[ti] != DT_BF16 && types[ti] != DT_U8 &&
                    ops[oi] != DT_SUM)
                    continue;   /* keep the run short: large counts for a few types */
                for (int inplace = 0; inplace < 2; inplace++)
                    test_allreduce(types[ti], ops[oi], counts[ci], inplace);
            }
    size_t rcs[] = { 0, 1, 5, 40001 };
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++)
        for (size_t oi = 0; oi < sizeof ops / sizeof ops[0]; oi++)
            for (size_t ci = 0; ci < sizeof rcs / sizeof rcs[0]; ci++) {
                if (rcs[ci] > 100 && (ops[oi] != DT_SUM || types[ti] == DT_F64)) continue;
                for (int inplace = 0; inplace < 2; inplace++)
                    test_reduce_scatter(types[ti], ops[oi], rcs[ci], inplace);
            }
    size_t ags[] = { 0, 1, 13, 30001 };
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++)
        for (size_t ci = 0; ci < sizeof ags / sizeof ags[0]; ci++)
            for (int inplace = 0; inplace < 3; inplace++) test_allgather(types[ti], ags[ci], inplace);
    size_t bcs[] = { 0, 1, 77, 300001 };
    for (int root = 0; root < W; root++)
        for (size_t ci = 0; ci < sizeof bcs / sizeof bcs[0]; ci++)
            test_broadcast(root % 2 ? DT_U8 : DT_F32, bcs[ci], root);
    for (int root = 0; root < W; root++) {
        test_reduce(DT_F32, DT_SUM, 1001, root);
        test_reduce(DT_I64, DT_MAX, 3, root);
        test_reduce(DT_BF16, DT_AVG, 70001, root);
    }
    check(dt_barrier(comm) == DT_OK, "barrier");
    test_sendrecv();
    test_async();
    test_split();
    /* argument errors name the rank and do not disturb the sequence */
    float f = 0;
    dt_status s = dt_allreduce(comm, &f, &f, 1, (dt_dtype)42, DT_SUM);
    check(s == DT_ERR_INVALID && strstr(dt_last_error(), "rank"), "invalid dtype refused: %s", dt_last_error());
    s = dt_broadcast(comm, &f, 1, DT_F32, W);
    check(s == DT_ERR_INVALID && strstr(dt_last_error(), "root"), "root out of range refused: %s", dt_last_error());
    s = dt_allreduce(comm, &f, &f, (size_t)-1 / 2, DT_F32, DT_SUM);
    check(s == DT_ERR_INVALID && strstr(dt_last_error(), "overflow"), "count overflow refused: %s", dt_last_error());
    int hosts_ok = 1;
    for (int r = 0; r < W; r++) hosts_ok &= dt_comm_host(comm, r) != NULL;
    check(hosts_ok && dt_comm_host(comm, W) == NULL, "host names of every rank");
    check(dt_comm_local_size(comm) == W && dt_comm_local_rank(comm) == R && dt_comm_node_rank(comm) == 0,
          "one host: local rank = rank, local size = world size, node 0");
    if (big) test_allreduce(DT_F32, DT_SUM, (64u << 20) / 4, 1);
    /* results after everything: the communicator still agrees */
    int32_t x = 1;
    s = dt_allreduce(comm, &x, &x, 1, DT_I32, DT_SUM);
    check(s == DT_OK && x == W, "final all_reduce");
    if (R == 0) printf("1..%d\n", ntest);
    return nfail ? 1 : 0;
}

/* ---- mode every: the table of tests/coll_cases.h on host memory ------------------------------- */

static void *host_alloc(size_t bytes) {
    void *p = malloc(bytes);
    if (!p) { fprintf(stderr, "ERROR: out of memory (%zu bytes)\n", bytes); exit(1); }
    return p;
}
static void host_copy(void *dst, const void *src, size_t bytes) { memcpy(dst, src, bytes); }

static int mode_every(void) {
    static const cc_mem host = { .alloc = host_alloc, .release = free, .put = host_copy, .get = host_copy };
    cc_run_all(comm, &host);
    if (R == 0) printf("1..%d\n", ntest);
    return nfail ? 1 : 0;
}

/* ---- mode tree: world-size invariance ------------------------------------------------------- */

/* Awkward floats: random signs, exponents over 2^-20..2^20, full mantissas. */
static float awkward(uint64_t j, uint64_t i) {
    uint64_t x = (j + 1) * 0x9e3779b97f4a7c15ull ^ (i + 1) * 0xbf58476d1ce4e5b9ull;
    x ^= x >> 31; x *= 0x94d049bb133111ebull; x ^= x >> 29;
    float m = 1.0f + (float)(x & 0xffffff) / 16777216.0f;
    int e = (int)((x >> 24) % 41) - 20;
    return ((x >> 40) & 1 ? -1.0f : 1.0f) * ldexpf(m, e);
}

static int mode_tree(const char *dump) {
    if (8 % W) { fprintf(stderr, "ERROR: --mode tree needs a world size dividing 8\n"); return 2; }
    /* the small (doubling) path, the large (halving) path through the rings, and a size
     * whose messages (4 MiB at 2 ranks) go by cross-memory reads between same-host ranks
     * under DT_CMA=1 */
    size_t counts[] = { 1000, 100000, 1u << 21 };
    FILE *f = NULL;
    if (R == 0 && dump && !(f = fopen(dump, "wb"))) { fprintf(stderr, "ERROR: cannot write %s\n", dump); return 1; }
    int rc = 0;
    for (size_t ci = 0; ci < sizeof counts / sizeof counts[0] && !rc; ci++) {
        size_t n = counts[ci];
        int per = 8 / W;
        float *b[8];
        for (int k = 0; k < per; k++) {
            b[k] = malloc(n * sizeof(float));
            for (size_t i = 0; i < n; i++) b[k][i] = awkward((uint64_t)(R * per + k), i);
        }
        for (int step = 1; step < per; step *= 2)       /* pairwise: (b0+b1), (b2+b3), then ... */
            for (int k = 0; k + step < per; k += 2 * step)
                for (size_t i = 0; i < n; i++) b[k][i] = b[k][i] + b[k + step][i];
        if (R == 0 && W == 1) {
            /* control: summing the same buffers left to right gives other bits, so the
             * comparison between world sizes can fail */
            float *seq = calloc(n, sizeof(float));
            for (int k = 0; k < 8; k++)
                for (size_t i = 0; i < n; i++) seq[i] += awkward((uint64_t)k, i);
            if (memcmp(seq, b[0], n * sizeof(float)) != 0) printf("sequential order differs (n=%zu)\n", n);
            free(seq);
        }
        dt_status s = dt_allreduce(comm, b[0], b[0], n, DT_F32, DT_SUM);
        if (s != DT_OK) rc = fail_status(s, "all_reduce");
        else if (f && fwrite(b[0], sizeof(float), n, f) != n) rc = 1;
        /* and reduce_scatter over the same tree: gather it back to compare the same bytes */
        if (!rc) {
            for (int k = 0; k < per; k++)
                for (size_t i = 0; i < n; i++) b[k][i] = awkward((uint64_t)(R * per + k), i);
            for (int step = 1; step < per; step *= 2)
                for (int k = 0; k + step < per; k += 2 * step)
                    for (size_t i = 0; i < n; i++) b[k][i] = b[k][i] + b[k + step][i];
            size_t rcn = n / (size_t)W;
            float *part = malloc((rcn + 1) * sizeof(float)), *all = malloc((n + 1) * sizeof(float));
            s = dt_reduce_scatter(comm, b[0], part, rcn, DT_F32, DT_SUM);
            if (s == DT_OK) s = dt_allgather(comm, part, all, rcn, DT_F32);
            if (s != DT_OK) rc = fail_status(s, "reduce_scatter");
            else if (f && fwrite(all, sizeof(float), rcn * (size_t)W, f) != rcn * (size_t)W) rc = 1;
            free(part); free(all);
        }
        for (int k = 0; k < per; k++) free(b[k]);
    }
    if (f && fclose(f) != 0) rc = 1;
    return rc;
}

/* ---- mode slices: reduce_scatter = all_reduce cut into blocks -------------------------------- */

static void put_awkward(dt_dtype t, void *p, size_t i, uint64_t j) {
    float v = awkward(j, i);
    if (t == DT_F32) ((float *)p)[i] = v;
    else if (t == DT_BF16) ((uint16_t *)p)[i] = dt_f32_to_bf16(v);
    else ((double *)p)[i] = (double)v * (1.0 + 1.0 / 3.0);   /* f64: mantissa bits past f32's */
}

static int mode_slices(void) {
    /* per-rank counts: odd, from one element to blocks of several pipeline chunks (1 MiB+ of
     * f32 per block, the size cross-memory reads take under DT_CMA=1) */
    static const size_t rcs[] = { 1, 3, 1001, 25001, 300001 };
    static const dt_dtype types[] = { DT_F32, DT_BF16, DT_F64 };
    static const dt_redop ops[] = { DT_SUM, DT_AVG };
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++)
        for (size_t oi = 0; oi < 2; oi++) {
            dt_dtype t = types[ti];
            dt_redop op = ops[oi];
            size_t es = dt_dtype_size(t);
            int rs_same = 1, rs_inplace = 1, rs_async = 1, ag_exact = 1, ag_inplace = 1, ok_calls = 1;
            for (size_t k = 0; k < sizeof rcs / sizeof rcs[0]; k++) {
                size_t rc = rcs[k], n = rc * (size_t)W, rb = rc * es;
                char *x = malloc(n * es), *ar = malloc(n * es), *y = malloc(n * es), *part = malloc(rb), *all = malloc(n * es);
                if (!x || !ar || !y || !part || !all) { fprintf(stderr, "ERROR: out of memory\n"); return 1; }
                for (size_t i = 0; i < n; i++) put_awkward(t, x, i, (uint64_t)R);
                dt_work *w = NULL;
                int good = fail_status(dt_allreduce(comm, x, ar, n, t, op), "all_reduce") == 0;
                good = good && fail_status(dt_reduce_scatter(comm, x, part, rc, t, op), "reduce_scatter") == 0;
                if (good) rs_same &= memcmp(part, ar + (size_t)R * rb, rb) == 0;
                memcpy(y, x, n * es);
                good = good && fail_status(dt_reduce_scatter(comm, y, y + (size_t)R * rb, rc, t, op), "reduce_scatter in place") == 0;
                if (good) rs_inplace &= memcmp(y + (size_t)R * rb, ar + (size_t)R * rb, rb) == 0;
                memset(y, 0, rb);
                good = good && fail_status(dt_reduce_scatter_async(comm, x, y, rc, t, op, &w), "reduce_scatter_async") == 0;
                good = good && fail_status(dt_work_wait(w), "reduce_scatter_async wait") == 0;
                if (good) rs_async &= memcmp(y, ar + (size_t)R * rb, rb) == 0;
                memset(all, 0, n * es);
                good = good && fail_status(dt_allgather(comm, part, all, rc, t), "all_gather") == 0;
                if (good) ag_exact &= memcmp(all, ar, n * es) == 0;
                memset(all, 0, n * es);
                memcpy(all + (size_t)R * rb, part, rb);
                good = good && fail_status(dt_allgather_async(comm, all + (size_t)R * rb, all, rc, t, &w), "all_gather_async") == 0;
                good = good && fail_status(dt_work_wait(w), "all_gather_async wait") == 0;
                if (good) ag_inplace &= memcmp(all, ar, n * es) == 0;
                ok_calls &= good;
                free(x); free(ar); free(y); free(part); free(all);
                if (!good) return 1;
            }
            const char *tn = dt_dtype_name(t), *on = dt_redop_name(op);
            check(ok_calls && rs_same, "%s %s: reduce_scatter block r is bitwise all_reduce's block r", tn, on);
            check(ok_calls && rs_inplace, "%s %s: the same in place (recv = send + r * count)", tn, on);
            check(ok_calls && rs_async, "%s %s: the same through reduce_scatter_async", tn, on);
            check(ok_calls && ag_exact, "%s %s: all_gather of the blocks is all_reduce's array", tn, on);
            check(ok_calls && ag_inplace, "%s %s: the same through all_gather_async in place", tn, on);
        }
    if (R == 0) printf("1..%d\n", ntest);
    return nfail ? 1 : 0;
}

/* ---- mode rings --------------------------------------------------------------------------------- */

static int mode_rings(void) {
    float v[16];
    for (int i = 0; i < 16; i++) v[i] = (float)(R + 1);
    int rc = fail_status(dt_allreduce(comm, v, v, 16, DT_F32, DT_SUM), "all_reduce");
    for (int i = 0; i < 16 && !rc; i++)
        if (v[i] != (float)W * (float)(W + 1) / 2) {
            fprintf(stderr, "ERROR: all_reduce gave %g, expected %g\n", v[i], (double)W * (W + 1) / 2);
            rc = 1;
        }
    /* mappings of /dev/shm/dtrain-PID-...: a ring is mapped once on each side */
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f) { fprintf(stderr, "ERROR: /proc/self/maps: cannot open\n"); return 1; }
    char line[1024];
    int out = 0, in = 0;
    while (fgets(line, sizeof line, f)) {
        const char *p = strstr(line, "/dev/shm/dtrain-");
        if (p && atoi(p + strlen("/dev/shm/dtrain-")) == (int)getpid()) out++;
        else if (p) in++;
    }
    fclose(f);
    struct rlimit rl = { 0, 0 };
    getrlimit(RLIMIT_NOFILE, &rl);
    printf("rank %d rings out %d in %d nofile %llu\n", R, out, in, (unsigned long long)rl.rlim_cur);
    /* nobody closes (and unlinks) a ring before every peer has looked at its offers */
    return rc | fail_status(dt_barrier(comm), "barrier");
}

/* ---- main ---------------------------------------------------------------------------------- */

int main(int argc, char **argv) {
    const char *mode = "all", *dump = NULL;
    long iters = -1;
    int big = 0;
    double set_timeout = 0;
    dt_comm_opts o;
    dt_comm_opts_default(&o);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--mode") && i + 1 < argc) mode = argv[++i];
        else if (!strcmp(argv[i], "--init") && i + 1 < argc) o.init_method = argv[++i];
        else if (!strcmp(argv[i], "--backend") && i + 1 < argc) o.backend = argv[++i];
        else if (!strcmp(argv[i], "--dump") && i + 1 < argc) dump = argv[++i];
        else if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atol(argv[++i]);
        else if (!strcmp(argv[i], "--big")) big = 1;
        else if (!strcmp(argv[i], "--timeout") && i + 1 < argc) set_timeout = atof(argv[++i]);
        else { fprintf(stderr, "coll_prog: unknown argument '%s'\n", argv[i]); return 2; }
    }
    dt_status s = dt_comm_init(&o, &comm);
    if (s != DT_OK) { fail_status(s, "init"); return dt_exit_code(s); }
    if (set_timeout > 0 && (s = dt_comm_set_timeout(comm, set_timeout)) != DT_OK) {
        fail_status(s, "set_timeout");
        return 1;
    }
    R = dt_comm_rank(comm);
    W = dt_comm_size(comm);
    int rc = 0;
    if (!strcmp(mode, "all")) {
        rc = mode_all(big);
    } else if (!strcmp(mode, "every")) {
        rc = mode_every();
    } else if (!strcmp(mode, "tree")) {
        rc = mode_tree(dump);
    } else if (!strcmp(mode, "slices")) {
        rc = mode_slices();
    } else if (!strcmp(mode, "rings")) {
        rc = mode_rings();
    } else if (!strcmp(mode, "init")) {
        printf("rank %d of %d on %s (%s)\n", R, W, dt_comm_host(comm, R), dt_comm_backend(comm));
        rc = fail_status(dt_barrier(comm), "barrier");
    } else if (!strcmp(mode, "env")) {
        const char *v[3] = { getenv("MASTER_ADDR"), getenv("MASTER_PORT"), getenv("DT_JOB_SECRET") };
        printf("rank %d of %d rendezvous '%s' MASTER_ADDR=%s MASTER_PORT=%s DT_JOB_SECRET=%s\n", R, W,
               dt_comm_rendezvous(comm), v[0] ? v[0] : "-", v[1] ? v[1] : "-", v[2] ? v[2] : "-");
        fflush(stdout);
        rc = fail_status(dt_barrier(comm), "barrier");
    } else if (!strcmp(mode, "mismatch")) {
        float v[100] = { 0 };
        dt_allreduce(comm, v, v, 100, DT_F32, DT_SUM);   /* collective #1 agrees */
        if (R == 0) {
            s = dt_allreduce(comm, v, v, 100, DT_F32, DT_SUM);
        } else {   /* async, so the message must travel from the worker thread to here */
            dt_work *w = NULL;
            s = dt_broadcast_async(comm, v, 100, DT_F32, 0, &w);
            if (s == DT_OK) s = dt_work_wait(w);
        }
        rc = s == DT_OK ? 0 : fail_status(s, "collective");
    } else if (!strcmp(mode, "timeout")) {
        if (R == 1) { sleep((unsigned)dt_comm_timeout(comm) + 2); rc = 0; }   /* never calls */
        else {
            float v[10] = { 0 };
            rc = fail_status(dt_allreduce(comm, v, v, 10, DT_F32, DT_SUM), "all_reduce");
        }
    } else if (!strcmp(mode, "hang0")) {
        /* rank 0 (which serves the store) stops, threads and all; the others must still report in time */
        if (R == 0) { printf("stopping\n"); fflush(stdout); raise(SIGSTOP); rc = 0; }
        else {
            float v[10] = { 0 };
            rc = fail_status(dt_allreduce(comm, v, v, 10, DT_F32, DT_SUM), "all_reduce");
        }
    } else if (!strcmp(mode, "loop")) {
        size_t n = (8u << 20) / 4;
        float *v = calloc(n, sizeof(float));
        if (R == 0) { printf("looping\n"); fflush(stdout); }
        for (long it = 0; (iters < 0 || it < iters) && !rc; it++)
            rc = fail_status(dt_allreduce(comm, v, v, n, DT_F32, DT_SUM), "all_reduce");
        free(v);
    } else if (!strcmp(mode, "nullbuf")) {
        float v[4] = { 0 };
        rc = fail_status(dt_allreduce(comm, NULL, v, 4, DT_F32, DT_SUM), "all_reduce");
    } else {
        fprintf(stderr, "coll_prog: unknown mode '%s'\n", mode);
        rc = 2;
    }
    dt_comm_destroy(comm);
    return rc;
}
