/*
 * test_cuda_ops.c: the CUDA backend held against the CPU backend, op by op.
 *
 * The ops come from the table-driven op test (ops_cases.h): every op of the list runs
 * on fresh random inputs on both backends, and the GPU's outputs must match the CPU's
 * within the tolerance each case states (bitwise where the kernels compute the CPU's
 * formulas in the CPU's order; 1e-6 for transcendentals; 1e-5 for GEMMs and
 * convolutions). Each op also runs twice on the GPU and must give the same bytes
 * (fixed reduction trees, no atomics). Then: the table is complete, bad inputs fail
 * naming the kernel (kernel-found errors surface at the next synchronize), memory
 * statistics, streams, the device options. Without a usable CUDA device the file
 * skips, saying why, unless nvidia-smi lists a GPU: then it fails (an insufficient
 * driver must not pass as "no GPU"). DT_CUDA_SYNC and DT_CU_MAX_BLOCKS apply
 * (dt_device_opts_env); tests/gpu_emu.sh runs it with a grid cap of 3 blocks.
 *
 * The reductions and the convolution also run at the shapes of real models (an MLP of
 * width 4096, GPT-2's layer norm and vocabulary, the cnn's convolutions), with rows at
 * an odd address beside aligned ones: the float4 and the scalar loads must give the
 * same bytes.
 *
 * DT_CUDA_TEST_SELF=1 runs the comparisons CPU against CPU (a check of the harness on
 * machines without a GPU; every comparison must then be exact).
 * DT_CUDA_TEST_TIMING=N times N more calls of each op at a real shape on the device and
 * prints "# time <op> <shape>: <us> us" (bench/gpu.sh reads them).
 * DT_CUDA_TEST_DUMP=FILE writes a hash of every device output, one line each, so two
 * builds (tests/gpu_emu.sh: two grid caps) or two runs can be shown to give the same
 * bytes. DT_CUDA_TEST_PARTS=table,seq,real,errors,memory runs only those parts.
 * tests/gpu_emu.sh builds this file against the backend's kernels compiled for the CPU
 * (DT_CUDA_TEST_EMU=1), so the kernels' logic is tested on machines without a GPU too.
 */
#include "config.h"   /* _GNU_SOURCE: clock_gettime, setenv */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda/dt_cuda.h"
#include "ops.h"
#include "ops_cases.h"
#include "status.h"
#include "tap.h"

static const dt_ops *C, *G;   /* reference (cpu) and device under test */
static int self_test;

#define MUST(expr) do { \
    dt_status must_s_ = (expr); \
    if (must_s_ != DT_OK) { printf("Bail out! %s: %s\n", #expr, dt_last_error()); exit(1); } \
} while (0)

static void *dev_bytes(const void *h, size_t bytes) {
    void *d = NULL;
    MUST(G->alloc(&d, bytes ? bytes : 4));
    if (h && bytes) MUST(G->copy_h2d(d, h, bytes));
    return d;
}
static float *dev_zero(size_t n) {
    float *d = dev_bytes(NULL, n * sizeof(float));
    MUST(G->zero(d, n * sizeof(float)));
    return d;
}

/* ---- every op against the cpu, and twice on the device ---- */

static int timing_reps;   /* DT_CUDA_TEST_TIMING */
static int timing_now;    /* set during the first device run of a case */
static FILE *dump;        /* DT_CUDA_TEST_DUMP */

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Call an op; during the first device run of a case with DT_CUDA_TEST_TIMING, call it
 * timing_reps more times between synchronisations and print the mean time. */
#define TIMED(r, label, call) do { \
    TC(r, call); \
    if (timing_now && (r)->ops == G && (r)->status == DT_OK) { \
        TC(r, G->synchronize()); \
        double t0_ = now_s(); \
        for (int k_ = 0; k_ < timing_reps; k_++) TC(r, call); \
        TC(r, G->synchronize()); \
        diag("time %s: %.1f us", label, (now_s() - t0_) * 1e6 / timing_reps); \
    } \
} while (0)

static uint64_t fnv1a(const void *p, size_t n) {
    const unsigned char *b = p;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

/* Case fn from `seed` on the cpu and twice on the device: within the case's tolerances
 * of the cpu, and the same bytes twice; the outputs paired in `eq` (index pairs, ending
 * with -1) are the same bytes within the device run. */
static void compare_case_eq(const char *name, void (*fn)(tc_run *), uint64_t seed, const int *eq) {
    tc_run want, got, again;
    char why[300] = "";
    double worst = 0.0;
    dt_status sc = tc_exec_fn(fn, seed, C, &want);
    timing_now = timing_reps > 0;
    dt_status s1 = tc_exec_fn(fn, seed, G, &got);
    timing_now = 0;
    dt_status s2 = tc_exec_fn(fn, seed, G, &again);
    if (sc != DT_OK) diag("   cpu: %s", want.error);
    if (s1 != DT_OK) diag("   %s: %s", G->name, got.error);
    if (s2 != DT_OK && s1 == DT_OK) diag("   %s, second run: %s", G->name, again.error);
    int good = sc == DT_OK && s1 == DT_OK && tc_same(&want, &got, self_test, why, sizeof why, &worst);
    ok(good, "%s: %s matches cpu within the stated tolerance (%d outputs, worst normwise %.1e)", name, G->name,
       got.nout, worst);
    if (why[0]) diag("   %s", why);
    why[0] = 0;
    ok(s1 == DT_OK && s2 == DT_OK && tc_same(&got, &again, 1, why, sizeof why, &worst),
       "%s: two %s runs give the same bytes", name, G->name);
    if (why[0]) diag("   %s", why);
    for (int i = 0; eq && eq[i] >= 0; i += 2) {
        const tc_output *a = &got.out[eq[i]], *b = &got.out[eq[i + 1]];
        ok(s1 == DT_OK && a->bytes == b->bytes && memcmp(a->host, b->host, a->bytes) == 0,
           "%s: %s and %s are the same bytes", name, a->what, b->what);
    }
    for (int i = 0; dump && s1 == DT_OK && i < got.nout; i++)
        fprintf(dump, "%s: %s %016llx\n", name, got.out[i].what,
                (unsigned long long)fnv1a(got.out[i].host, got.out[i].bytes));
    tc_result_free(&want);
    tc_result_free(&got);
    tc_result_free(&again);
}

static void compare_case(const char *name, void (*fn)(tc_run *), uint64_t seed) {
    compare_case_eq(name, fn, seed, NULL);
}

static void test_table(void) {
    tc_check_complete(G);
    for (int i = 0; i < DT_OPS_COUNT; i++)
        compare_case(tc_cases[i].name, tc_cases[i].fn, (uint64_t)i * 0x100000001b3ull);
}

/* ---- sequence kernels on shapes the table leaves out: every head-width build of the
 * attention kernels (cuda_seq.cu: up to 32, 64, 128, 256; decode unbounded), several
 * tiles, the cuBLAS path of long sequences, and embeddings over several column blocks, vocabulary ranges and id batches ---- */

static int seq_D, seq_T = 70;   /* head width and length of the next attention case */
static int seq_dtype = DT_F32;  /* DT_BF16: q, k, v and dy rounded to it, and said so */

static void seq_attn(tc_run *r) {
    const int B = 2, T = seq_T, H = 2, D = seq_D, Cw = H * D;
    size_t bt = (size_t)B * T;
    for (int K = H; K >= 1; K--) {   /* multi-head, then one key/value head for both */
        const int W = (H + 2 * K) * D;
        float *qkv = tc_rand(r, bt * W, -2.0f, 2.0f), *dy = tc_rand(r, bt * Cw, -1.0f, 1.0f);
        if (seq_dtype != DT_F32) {
            TC(r, r->ops->round_to(qkv, qkv, bt * W, seq_dtype));
            TC(r, r->ops->round_to(dy, dy, bt * Cw, seq_dtype));
        }
        float *y = tc_out(r, bt * Cw * sizeof(float), 1, TC_GEMM, "y (D=%d, K=%d)", D, K);
        float *lse = tc_out(r, bt * H * sizeof(float), 1, TC_GEMM, "lse (D=%d, K=%d)", D, K);
        TC(r, r->ops->attn_forward(y, lse, qkv, B, T, H, K, D, seq_dtype));
        float *dqkv = tc_out(r, bt * W * sizeof(float), 1, TC_GEMM, "dqkv (D=%d, K=%d)", D, K);
        TC(r, r->ops->attn_backward(dqkv, dy, qkv, y, lse, B, T, H, K, D, seq_dtype));
        float *y1 = tc_out(r, Cw * sizeof(float), 1, TC_GEMM, "decode y (D=%d, K=%d, t=%d)", D, K, T - 1);
        float *kv = tc_rand(r, (size_t)T * 2 * K * D, -2.0f, 2.0f);
        TC(r, r->ops->attn_decode(y1, qkv, kv, T - 1, H, K, D));
    }
}

static void seq_decode_wide(tc_run *r) {
    const int T = 300, H = 2, D = 300, Cw = H * D;
    float *q = tc_rand(r, (size_t)Cw, -2.0f, 2.0f), *kv = tc_rand(r, (size_t)T * 2 * Cw, -2.0f, 2.0f);
    float *y = tc_out(r, Cw * sizeof(float), 1, TC_GEMM, "decode y (D=%d, t=%d)", D, T - 1);
    TC(r, r->ops->attn_decode(y, q, kv, T - 1, H, H, D));
}

static void seq_embedding(tc_run *r) {
    const int n = 1100, Cw = 200, V = 3000;
    float *ids = tc_ids(r, n, V), *W = tc_rand(r, (size_t)V * Cw, -1.0f, 1.0f), *dy = tc_rand(r, (size_t)n * Cw, -1.0f, 1.0f);
    float *y = tc_out(r, (size_t)n * Cw * sizeof(float), 1, TC_EXACT, "y");
    TC(r, r->ops->embedding_forward(y, ids, W, n, Cw, V));
    float *dW = tc_out(r, (size_t)V * Cw * sizeof(float), 1, TC_EXACT, "dW");
    TC(r, r->ops->embedding_backward(dW, ids, dy, n, Cw, V, 0));
    TC(r, r->ops->embedding_backward(dW, ids, dy, n, Cw, V, 1));
}

static void test_seq(void) {
    const int widths[] = {40, 100, 200};
    for (int i = 0; i < 3; i++) {
        char name[64];
        seq_D = widths[i];
        snprintf(name, sizeof name, "attention, head width %d", seq_D);
        compare_case(name, seq_attn, 1000 + (uint64_t)i);
    }
    /* from 256 positions on, the products run on cuBLAS (cuda_seq.cu) */
    seq_D = 64;
    seq_T = 300;
    compare_case("attention through cuBLAS's batched GEMMs, 300 positions, head width 64", seq_attn, 1005);
    /* in bf16 the products of two 16-bit operands run on tensor cores (exact products) */
    seq_dtype = DT_BF16;
    compare_case("attention through cuBLAS, bf16 operands on 16-bit tensor cores", seq_attn, 1006);
    seq_dtype = DT_F32;
    /* ... which they do: given values that are not bf16, the 16-bit units round them, so
     * the output moves (that path ran), and f32 does not (the same bytes twice) */
    if (!self_test) {
        const int T = 300, H = 2, D = 64, W = 3 * H * D;
        float *h = malloc((size_t)T * W * sizeof(float)), *out[3];
        for (int i = 0; i < T * W; i++) h[i] = (float)((i * 7919) % 2001 - 1000) * 1.0009765625e-3f;
        float *qkv = dev_bytes(h, (size_t)T * W * sizeof(float)), *lse = dev_zero((size_t)H * T);
        const int dt[3] = {DT_F32, DT_F32, DT_BF16};
        for (int v = 0; v < 3; v++) {
            float *y = dev_zero((size_t)T * H * D);
            MUST(G->attn_forward(y, lse, qkv, 1, T, H, H, D, dt[v]));
            out[v] = malloc((size_t)T * H * D * sizeof(float));
            MUST(G->copy_d2h(out[v], y, (size_t)T * H * D * sizeof(float)));
            G->free(y);
        }
        size_t bytes = (size_t)T * H * D * sizeof(float);
        ok(!memcmp(out[0], out[1], bytes) && memcmp(out[0], out[2], bytes),
           "attn_forward with dtype bf16 on values that are not bf16 differs from f32 (16-bit units ran), f32 twice "
           "does not");
        for (int v = 0; v < 3; v++) free(out[v]);
        free(h);
        G->free(qkv);
        G->free(lse);
    } else {
        skip(1, "the cpu backend under test (its attention ignores the dtype)");
    }
    seq_T = 70;
    compare_case("attn_decode, head width 300", seq_decode_wide, 1003);
    compare_case("embedding, 2 column blocks, 1100 ids", seq_embedding, 1004);
}

/* ---- the reductions and the convolution at the shapes of real models ---- */

/* A device copy of host data at an address 4 bytes past a 16-byte boundary. */
static float *upload_odd(tc_run *r, const float *h, size_t n) {
    float *d = tc_dev(r, (n + 1) * sizeof(float));
    if (!d) return NULL;
    TC(r, r->ops->copy_h2d(d + 1, h, n * sizeof(float)));
    return d + 1;
}

/* The bias gradient of an MLP of width 4096 at batch 1024. */
static void real_bias_grad(tc_run *r) {
    const int rows = 1024, cols = 4096;
    const size_t n = (size_t)rows * cols;
    float *h = tc_hrand(r, n, -1.0f, 1.0f), *dy = tc_upload(r, h, n * sizeof(float)), *dy1 = upload_odd(r, h, n);
    float *db = tc_out(r, cols * sizeof(float), 1, TC_SUM, "db");
    TIMED(r, "bias_grad 1024x4096", r->ops->bias_grad(db, dy, rows, cols));
    float *db1 = tc_out(r, cols * sizeof(float), 1, TC_SUM, "db (dy at an odd address)");
    TC(r, r->ops->bias_grad(db1, dy1, rows, cols));
}

/* GPT-2's layer norm: 1024 rows of 768. */
static void real_layernorm(tc_run *r) {
    const int rows = 1024, cols = 768;
    const size_t n = (size_t)rows * cols;
    float *hx = tc_hrand(r, n, -1.0f, 3.0f), *hd = tc_hrand(r, n, -1.0f, 1.0f);
    float *x = tc_upload(r, hx, n * sizeof(float)), *x1 = upload_odd(r, hx, n);
    float *dy = tc_upload(r, hd, n * sizeof(float)), *dy1 = upload_odd(r, hd, n);
    float *g = tc_rand(r, cols, -1.0f, 1.0f), *b = tc_rand(r, cols, -1.0f, 1.0f);
    float *y = tc_out(r, n * sizeof(float), 1, TC_SUM, "y");
    float *mean = tc_out(r, rows * sizeof(float), 1, TC_SUM, "mean"), *rstd = tc_out(r, rows * sizeof(float), 1, TC_SUM, "rstd");
    TIMED(r, "layernorm_forward 1024x768", r->ops->layernorm_forward(y, mean, rstd, x, g, b, rows, cols, 1e-5f));
    float *y1 = tc_out(r, n * sizeof(float), 1, TC_SUM, "y (x at an odd address)");
    float *scratch = tc_dev(r, 2 * rows * sizeof(float));
    TC(r, r->ops->layernorm_forward(y1, scratch, scratch ? scratch + rows : NULL, x1, g, b, rows, cols, 1e-5f));
    float *dx = tc_out(r, n * sizeof(float), 1, TC_SUM, "dx");
    float *dg = tc_out(r, cols * sizeof(float), 1, TC_SUM, "dgamma"), *db = tc_out(r, cols * sizeof(float), 1, TC_SUM, "dbeta");
    TIMED(r, "layernorm_backward 1024x768", r->ops->layernorm_backward(dx, dg, db, dy, x, mean, rstd, g, rows, cols));
    float *dx1 = tc_out(r, n * sizeof(float), 1, TC_SUM, "dx (dy at an odd address)");
    float *dg1 = tc_out(r, cols * sizeof(float), 1, TC_SUM, "dgamma (dy at an odd address)");
    TC(r, r->ops->layernorm_backward(dx1, dg1, NULL, dy1, x, mean, rstd, g, rows, cols));
}

/* Cross-entropy over GPT-2's vocabulary, 8 rows (row 3 ignored), label smoothing. */
static void real_xent(tc_run *r) {
    const int B = 8, V = 50304;
    const size_t n = (size_t)B * V;
    float *h = tc_hrand(r, n, -5.0f, 5.0f), *logits = tc_upload(r, h, n * sizeof(float)), *logits1 = upload_odd(r, h, n);
    int32_t *labels = tc_labels(r, B, V);
    float *loss = tc_out(r, sizeof(float), 1, TC_TRANSC, "loss"), *probs = tc_out(r, n * sizeof(float), 1, TC_TRANSC, "probs");
    TIMED(r, "xent_forward 8x50304", r->ops->xent_forward(loss, probs, logits, labels, B, V, 0.1f, 8.0f));
    float *loss1 = tc_out(r, sizeof(float), 1, TC_TRANSC, "loss (logits at an odd address)");
    float *probs1 = tc_out(r, n * sizeof(float), 1, TC_TRANSC, "probs (logits at an odd address)");
    TC(r, r->ops->xent_forward(loss1, probs1, logits1, labels, B, V, 0.1f, 8.0f));
}

/* Accuracy over GPT-2's vocabulary, 64 rows: each row's label is its argmax under the
 * CPU's rule on every other row, and the rows plant what a parallel argmax gets wrong:
 * ties and NaNs whose later copy sits in a lane that finishes first, a row of -inf, a
 * maximum in the last group of a row whose length is no multiple of 4 (the odd copy). */
static void real_count_row(float *h, int32_t *labels, int B, int V) {
    for (int i = 0; i < B; i++) {
        float *x = h + (size_t)i * V;
        switch (i % 8) {
        case 1: x[4100] = x[9] = 9.0f; break;            /* a tie across lanes: 9 wins */
        case 3: x[40000] = nanf(""); x[130] = nanf(""); break;   /* two NaNs: 130 wins */
        case 5: for (int c = 0; c < V; c++) x[c] = -INFINITY; break;   /* all equal: 0 wins */
        case 7: x[V - 1] = 9.0f; break;                   /* the last element */
        default: break;
        }
        int best = 0;
        for (int c = 1; c < V; c++)
            if (x[c] > x[best] || (isnan(x[c]) && !isnan(x[best]))) best = c;
        labels[i] = i % 2 ? best : (best + 1) % V;   /* odd rows right, even rows wrong */
    }
}

static void real_count_correct(tc_run *r) {
    const int B = 64, V = 50304, Vodd = 50303;
    float *h = tc_hrand(r, (size_t)B * V, -5.0f, 5.0f);
    int32_t *hl = malloc(sizeof(int32_t) * B), *hl1 = malloc(sizeof(int32_t) * B);
    if (!h || !hl || !hl1) { free(hl); free(hl1); return; }
    real_count_row(h, hl, B, V);
    float *logits = tc_upload(r, h, (size_t)B * V * sizeof(float));
    int32_t *labels = tc_upload(r, hl, sizeof(int32_t) * B);
    int32_t *correct = tc_out(r, sizeof(int32_t), 0, TC_EXACT, "correct");
    TIMED(r, "count_correct 64x50304", r->ops->count_correct(correct, logits, labels, B, V));
    real_count_row(h, hl1, B, Vodd);   /* rows of an odd length: the scalar loads */
    float *logits1 = upload_odd(r, h, (size_t)B * Vodd);
    int32_t *labels1 = tc_upload(r, hl1, sizeof(int32_t) * B);
    int32_t *correct1 = tc_out(r, sizeof(int32_t), 0, TC_EXACT, "correct (rows of 50303 at an odd address)");
    TC(r, r->ops->count_correct(correct1, logits1, labels1, B, Vodd));
    free(hl);
    free(hl1);
}

/* Batch-norm sums at the cnn's first layer, batch 256: (256, 32, 28*28). */
static void real_channel_sums(tc_run *r) {
    const int N = 256, Cc = 32, HW = 784;
    const size_t n = (size_t)N * Cc * HW;
    float *x = tc_rand(r, n, 1.0f, 5.0f), *dy = tc_rand(r, n, -1.0f, 1.0f);
    float *mean = tc_rand(r, Cc, 2.0f, 4.0f), *invstd = tc_rand(r, Cc, 0.5f, 2.0f);
    float *sum = tc_out(r, Cc * sizeof(float), 1, TC_SUM, "sum"), *sumsq = tc_out(r, Cc * sizeof(float), 1, TC_SUM, "sumsq");
    TIMED(r, "bn_stats 256x32x784", r->ops->bn_stats(sum, sumsq, x, N, Cc, HW));
    float *s1 = tc_out(r, Cc * sizeof(float), 1, TC_SUM, "sum_dy"), *s2 = tc_out(r, Cc * sizeof(float), 1, TC_SUM, "sum_dy_xhat");
    TIMED(r, "bn_backward_reduce 256x32x784", r->ops->bn_backward_reduce(s1, s2, dy, x, mean, invstd, N, Cc, HW));
}

/* The cnn's convolutions at batch 128 (3x3, pad 1): 1 -> 32 on 28x28, 32 -> 64 on
 * 14x14; backward right after forward, so it reuses the forward's columns. */
static void real_conv(tc_run *r) {
    static const int shapes[2][4] = {{1, 28, 32, 0}, {32, 14, 64, 1}};   /* C, H = W, K, has dx */
    for (int v = 0; v < 2; v++) {
        dt_conv2d_desc d = {.N = 128, .C = shapes[v][0], .H = shapes[v][1], .W = shapes[v][1], .K = shapes[v][2],
                            .R = 3, .S = 3, .stride_h = 1, .stride_w = 1, .pad_h = 1, .pad_w = 1};
        TC(r, dt_conv2d_desc_init(&d));
        size_t nx = (size_t)d.N * d.C * d.H * d.W, nw = (size_t)d.K * d.C * 9, ny = (size_t)d.N * d.K * d.P * d.Q;
        float *x = tc_rand(r, nx, -1.0f, 1.0f), *w = tc_rand(r, nw, -1.0f, 1.0f), *b = tc_rand(r, d.K, -1.0f, 1.0f);
        float *dy = tc_rand(r, ny, -1.0f, 1.0f);
        char label[80];
        float *y = tc_out(r, ny * sizeof(float), 1, TC_GEMM, "y (%d -> %d)", d.C, d.K);
        snprintf(label, sizeof label, "conv2d_forward 128x%dx%dx%d -> %d", d.C, d.H, d.W, d.K);
        TIMED(r, label, r->ops->conv2d_forward(&d, y, x, w, b, 1));
        float *dx = shapes[v][3] ? tc_out(r, nx * sizeof(float), 1, TC_GEMM, "dx (%d -> %d)", d.C, d.K) : NULL;
        float *dw = tc_out(r, nw * sizeof(float), 1, TC_GEMM, "dw (%d -> %d)", d.C, d.K);
        float *db = tc_out(r, d.K * sizeof(float), 1, TC_SUM, "dbias (%d -> %d)", d.C, d.K);
        snprintf(label, sizeof label, "conv2d_backward 128x%dx%dx%d -> %d", d.C, d.H, d.W, d.K);
        TIMED(r, label, r->ops->conv2d_backward(&d, dx, dw, db, dy, x, w));
    }
}

/* Backward with the forward's kept columns and with columns rebuilt (nothing kept:
 * dt_cuda_set_memory_opts(1, -1)) on two copies of one input; then an input freed after its
 * forward and a new one, likely at the same address, with other data: backward must
 * not take the old columns. */
static void real_conv_kept(tc_run *r) {
    dt_conv2d_desc d = {.N = 48, .C = 32, .H = 14, .W = 14, .K = 64, .R = 3, .S = 3, .stride_h = 1, .stride_w = 1,
                        .pad_h = 1, .pad_w = 1};
    TC(r, dt_conv2d_desc_init(&d));
    size_t nx = (size_t)d.N * d.C * d.H * d.W, nw = (size_t)d.K * d.C * 9, ny = (size_t)d.N * d.K * d.P * d.Q;
    float *h = tc_hrand(r, nx, -1.0f, 1.0f), *xa = tc_upload(r, h, nx * sizeof(float)), *xb = tc_upload(r, h, nx * sizeof(float));
    float *w = tc_rand(r, nw, -1.0f, 1.0f), *dy = tc_rand(r, ny, -1.0f, 1.0f), *y = tc_dev(r, ny * sizeof(float));
    float *dxa = tc_out(r, nx * sizeof(float), 1, TC_GEMM, "dx (kept columns)");
    float *dwa = tc_out(r, nw * sizeof(float), 1, TC_GEMM, "dw (kept columns)");
    TC(r, r->ops->conv2d_forward(&d, y, xa, w, NULL, 0));
    TC(r, r->ops->conv2d_backward(&d, dxa, dwa, NULL, dy, xa, w));
    float *dxb = tc_out(r, nx * sizeof(float), 1, TC_GEMM, "dx (columns rebuilt)");
    float *dwb = tc_out(r, nw * sizeof(float), 1, TC_GEMM, "dw (columns rebuilt)");
    dt_cuda_set_memory_opts(1, -1);   /* keep none */
    TC(r, r->ops->conv2d_forward(&d, y, xb, w, NULL, 0));
    TC(r, r->ops->conv2d_backward(&d, dxb, dwb, NULL, dy, xb, w));
    dt_cuda_set_memory_opts(1, 0);
    /* freed and allocated again: outside the case's buffer list, freed here */
    float *xc = NULL, *xd = NULL;
    TC(r, r->ops->alloc((void **)&xc, nx * sizeof(float)));
    if (!xc) return;
    TC(r, r->ops->copy_h2d(xc, h, nx * sizeof(float)));
    TC(r, r->ops->conv2d_forward(&d, y, xc, w, NULL, 0));
    TC(r, r->ops->synchronize());
    r->ops->free(xc);
    TC(r, r->ops->alloc((void **)&xd, nx * sizeof(float)));
    if (!xd) return;
    if (r->ops == G) diag("   the new input is %s the freed one", xd == xc ? "at the address of" : "elsewhere than");
    TC(r, r->ops->copy_h2d(xd, tc_hrand(r, nx, -1.0f, 1.0f), nx * sizeof(float)));
    float *dwd = tc_out(r, nw * sizeof(float), 1, TC_GEMM, "dw (input freed and allocated again)");
    TC(r, r->ops->conv2d_backward(&d, NULL, dwd, NULL, dy, xd, w));
    TC(r, r->ops->synchronize());
    r->ops->free(xd);
}

static void test_real_shapes(void) {
    static const int odd_bias[] = {0, 1, -1}, odd_ln[] = {0, 3, 4, 7, 5, 8, -1}, odd_xent[] = {0, 2, 1, 3, -1};
    static const int kept[] = {0, 2, 1, 3, -1};
    compare_case_eq("bias_grad, 1024 x 4096", real_bias_grad, 2001, odd_bias);
    compare_case_eq("layernorm, 1024 x 768", real_layernorm, 2002, odd_ln);
    compare_case_eq("xent_forward, 8 x 50304", real_xent, 2003, odd_xent);
    compare_case("count_correct, 64 x 50304 with ties, NaNs and -inf rows", real_count_correct, 2007);
    compare_case("bn_stats and bn_backward_reduce, 256 x 32 x 784", real_channel_sums, 2004);
    compare_case("conv2d, the cnn's layers at batch 128", real_conv, 2005);
    compare_case_eq("conv2d backward with kept and rebuilt columns", real_conv_kept, 2006, kept);
}

/* ---- bad inputs: the error names the kernel ---- */

static void test_errors(void) {
    dt_status s = G->sgemm(0, 0, -1, 4, 4, 1.0f, NULL, 4, NULL, 4, 0.0f, NULL, 4);
    is_int(s, DT_ERR_INVALID, "sgemm with M = -1 is invalid");
    like(dt_last_error(), "sgemm", "the message names the kernel");
    s = G->sgemm(0, 0, 4, 4, 4, 1.0f, (float *)16, 2, (float *)16, 4, 0.0f, (float *)16, 4);
    is_int(s, DT_ERR_INVALID, "sgemm with lda < K is invalid");

    float *buf = dev_zero(64);
    is_int(G->dropout_forward(buf, buf, 4, 4, 1.0f, 1, 0, 0, 0), DT_ERR_INVALID, "dropout with p = 1 is invalid");
    is_int(G->sigmoid_backward(buf, NULL, buf, 4), DT_ERR_INVALID, "sigmoid_backward with a NULL input is invalid");
    like(dt_last_error(), "sigmoid_backward", "the message names the kernel");

    dt_conv2d_desc d = { .N = 1, .C = 1, .H = 5, .W = 5, .K = 1, .R = 3, .S = 3, .stride_h = 1, .stride_w = 1 };
    MUST(dt_conv2d_desc_init(&d));
    d.P = 7;
    is_int(G->conv2d_forward(&d, buf, buf, buf, NULL, 0), DT_ERR_INVALID, "conv2d with a stale descriptor is invalid");
    like(dt_last_error(), "conv2d_forward", "the message names the kernel");

    /* a label >= C: reported by the next synchronisation, naming the kernel */
    int32_t labels[4] = {0, 1, 5, 2};
    int32_t *gl = dev_bytes(labels, sizeof labels);
    s = G->xent_forward(buf, buf + 16, buf + 32, gl, 4, 3, 0.0f, 1.0f);
    if (s == DT_OK) s = G->synchronize();
    is_int(s, DT_ERR_INVALID, "xent_forward with a label >= C fails");
    like(dt_last_error(), "xent_forward", "the message names the kernel");
    is_int(G->synchronize(), DT_OK, "the error is reported once");

    /* a corrupt argmax index: reported at the next synchronisation */
    dt_pool2d_desc pd = { .N = 1, .C = 1, .H = 4, .W = 4, .kh = 2, .kw = 2, .stride_h = 2, .stride_w = 2 };
    MUST(dt_pool2d_desc_init(&pd));
    int32_t bad[4] = { 0, 2, 99, 10 };
    int32_t *gi = dev_bytes(bad, sizeof bad);
    s = G->maxpool2d_backward(&pd, buf + 16, buf, gi);
    if (s == DT_OK) s = G->synchronize();
    is_int(s, DT_ERR_INVALID, "maxpool2d_backward with an index outside the plane fails");
    like(dt_last_error(), "maxpool2d_backward", "the message names the kernel");
    G->free(gi); G->free(gl); G->free(buf);

    /* token ids outside [0, V) or not integers: reported at the next synchronisation */
    float ids[3] = {1, 7, 2}, *gids = dev_bytes(ids, sizeof ids), *w = dev_zero(7 * 4), *e = dev_zero(3 * 4);
    s = G->embedding_forward(e, gids, w, 3, 4, 7);
    if (s == DT_OK) s = G->synchronize();
    is_int(s, DT_ERR_INVALID, "embedding_forward with a token id = V fails");
    like(dt_last_error(), "embedding_forward", "the message names the kernel");
    ids[1] = 2.5f;
    MUST(G->copy_h2d(gids, ids, sizeof ids));
    s = G->embedding_backward(w, gids, e, 3, 4, 7, 0);
    if (s == DT_OK) s = G->synchronize();
    is_int(s, DT_ERR_INVALID, "embedding_backward with a token id 2.5 fails");
    like(dt_last_error(), "embedding_backward", "the message names the kernel");
    is_int(G->synchronize(), DT_OK, "the error is reported once");
    G->free(gids); G->free(w); G->free(e);

    /* the attention kernels' widest head is 256, and a sample's convolution columns stay
     * below 2^31 elements (the cpu has neither bound) */
    if (!self_test) {
        float *p = dev_zero(4);
        dt_conv2d_desc big = { .N = 1, .C = 4096, .H = 256, .W = 256, .K = 1, .R = 3, .S = 3, .stride_h = 1,
                               .stride_w = 1, .pad_h = 1, .pad_w = 1 };
        MUST(dt_conv2d_desc_init(&big));
        is_int(G->conv2d_forward(&big, p, p, p, NULL, 0), DT_ERR_UNSUPPORTED, "conv2d with 2.4e9 columns per sample is unsupported");
        like(dt_last_error(), "conv2d_forward", "the message names the kernel");
        G->free(p);
        float *qkv = dev_zero(3 * 257), *y = dev_zero(257), *lse = dev_zero(1);
        is_int(G->attn_forward(y, lse, qkv, 1, 1, 1, 1, 257, DT_F32), DT_ERR_UNSUPPORTED, "attn_forward with D = 257 is unsupported");
        like(dt_last_error(), "attn_forward", "the message names the kernel");
        G->free(qkv); G->free(y); G->free(lse);
    } else {
        skip(4, "the cpu has no bound on the head width or the columns");
    }
}

/* ---- memory, streams and the device ---- */

/* Sparse memory (the driver's virtual memory management; page_block is its granule):
 * alloc_sparse maps nothing, populate maps the granules a range touches, discard gives
 * back the whole granules inside a range once the work queued before it is done, and
 * what is populated again holds what is written. Without it (page_block 0) these are
 * plain allocations and discard keeps the memory. */
static void test_sparse(void) {
    size_t pb = G->page_block, before = dt_cuda_memory_allocated();
    if (!pb) {
        skip(10, "no sparse memory here (page_block 0: the driver lacks the calls, or DT_CUDA_VMM=0)");
        return;
    }
    ok((pb & (pb - 1)) == 0 && pb >= 4096, "page_block is a granule of %zu bytes", pb);
    float *a = NULL;
    MUST(G->alloc_sparse((void **)&a, 4 * pb));
    ok(a && (uintptr_t)a % pb == 0 && dt_cuda_memory_allocated() == before,
       "alloc_sparse of 4 granules: aligned to a granule, nothing mapped");
    MUST(G->populate(a + pb / sizeof(float) - 1, 8));   /* the last float of granule 0, the first of 1 */
    is_int((long long)(dt_cuda_memory_allocated() - before), (long long)(2 * pb), "populate maps the 2 granules a range touches");
    size_t n = 2 * pb / sizeof(float);
    MUST(G->fill(a, 3.0f, n));
    MUST(G->discard(a + 1, 2 * pb - 2 * sizeof(float)));   /* inside both granules, neither whole */
    MUST(G->synchronize());
    MUST(G->populate(a, 4));   /* settles what was given back */
    is_int((long long)(dt_cuda_memory_allocated() - before), (long long)(2 * pb),
           "discard keeps the granules it does not cover whole");
    MUST(G->discard(a + n / 2, pb));   /* granule 1 whole */
    MUST(G->synchronize());
    MUST(G->populate(a, 4));
    is_int((long long)(dt_cuda_memory_allocated() - before), (long long)pb,
           "and gives back a granule inside the range once the queued work is done");
    MUST(G->populate(a + n / 2, pb));
    MUST(G->fill(a + n / 2, 5.0f, n / 2));
    float got[2] = {0, 0};
    MUST(G->copy_d2h(&got[0], a, sizeof(float)));
    MUST(G->copy_d2h(&got[1], a + n - 1, sizeof(float)));
    ok(got[0] == 3.0f && got[1] == 5.0f, "a granule kept keeps its data; one mapped again holds what is written (%g %g)",
       (double)got[0], (double)got[1]);
    /* turned off (dtrain: DT_CUDA_VMM=0), from the next opening on alloc_sparse is a
     * whole allocation; one made before keeps its kind and is freed as one */
    dt_cuda_set_memory_opts(0, 0);
    ok(dt_ops_cuda(0, 0) == G && G->page_block == 0, "sparse memory turned off: the table's page_block is 0");
    size_t mid = dt_cuda_memory_allocated();
    float *b = NULL;
    MUST(G->alloc_sparse((void **)&b, 4 * pb));
    is_int((long long)(dt_cuda_memory_allocated() - mid), (long long)(4 * pb), "and alloc_sparse maps all its bytes at once");
    G->free(b);
    G->free(a);
    is_int((long long)dt_cuda_memory_allocated(), (long long)before, "the sparse allocation made before is freed as one");
    dt_cuda_set_memory_opts(1, 0);
    ok(dt_ops_cuda(0, 0) == G && G->page_block == pb, "turned on again, page_block is the granule again");
}

static void test_memory(void) {
    void *p = (void *)1;
    is_int(G->alloc(&p, 0), DT_OK, "alloc of 0 bytes is fine");
    ok(p == NULL, "and gives NULL");
    G->free(NULL);
    is_int(G->set_threads(0), DT_ERR_INVALID, "set_threads(0) is invalid");
    is_int(G->set_threads(3), DT_OK, "set_threads(3)");
    if (self_test) return;
    size_t before = dt_cuda_memory_allocated();
    void *q = NULL;
    MUST(G->alloc(&q, 3u << 20));
    is_int((long long)(dt_cuda_memory_allocated() - before), 3 << 20, "memory_allocated counts an allocation");
    ok(dt_cuda_max_memory_allocated() >= before + (3u << 20), "max_memory_allocated is at least the current peak");
    G->free(q);
    is_int((long long)dt_cuda_memory_allocated(), (long long)before, "and forgets it when freed");
    dt_cuda_reset_peak_memory();
    is_int((long long)dt_cuda_max_memory_allocated(), (long long)before, "reset_peak_memory sets the peak to the current");
    MUST(G->alloc(&q, 1u << 20));
    G->free(q);
    size_t cur = 0, peak = 0;
    G->memory(&cur, &peak, 0);
    ok(cur == before && peak == before + (1u << 20), "the table's memory: current and peak (%zu, %zu)", cur, peak);
    dt_ops_reset_peak(G);
    G->memory(&cur, &peak, 0);
    ok(cur == before && peak == before, "dt_ops_reset_peak starts the peak again from the current, through it");
    test_sparse();
    void *h = NULL;
    is_int(G->host_alloc(&h, 1 << 16), DT_OK, "pinned host memory");
    memset(h, 1, 1 << 16);
    G->host_free(h);
    ok(dt_cuda_device() >= 0, "a device is selected (device %d)", dt_cuda_device());
    ok(dt_cuda_compute_stream() != NULL, "the compute stream exists");
    is_int(dt_cuda_stream_wait_compute(NULL), DT_OK, "the legacy stream can wait for the compute stream");
    is_int(dt_cuda_compute_wait_stream(NULL), DT_OK, "and the compute stream for it");
    is_int(dt_cuda_allow_tf32(), 0, "TF32 is off unless asked for");
    int n = 0;
    MUST(dt_cuda_device_count(&n));
    ok(dt_ops_cuda(n, 1) == G && dt_cuda_allow_tf32() == 1, "the device index is taken modulo the %d visible devices; TF32 on when asked", n);
    ok(dt_ops_cuda(0, 0) == G && dt_cuda_allow_tf32() == 0, "asking again for device 0 gives the same table, TF32 off again");
    if (n > 1) {
        ok(dt_ops_cuda(dt_cuda_device() + 1, 0) == NULL, "another device in the same process is refused");
        like(dt_last_error(), "already uses device", "saying which device the process uses");
    } else {
        skip(2, "one visible device: no other device to refuse");
    }
    is_int(G->copy_h2d(NULL, &p, 4), DT_ERR_INVALID, "copy to NULL is invalid");
    is_int(G->synchronize(), DT_OK, "synchronize");
}

/* DT_CUDA_TEST_PARTS=table,seq,real,errors,memory (default: all) picks what runs. */
static int part(const char *name) {
    const char *p = getenv("DT_CUDA_TEST_PARTS");
    if (!p || !*p) return 1;
    size_t n = strlen(name);
    for (const char *q = p; (q = strstr(q, name)) != NULL; q += n)
        if ((q == p || q[-1] == ',') && (q[n] == 0 || q[n] == ',')) return 1;
    return 0;
}

/* GPUs that `nvidia-smi -L` lists (0 without nvidia-smi). */
static int nvidia_smi_gpus(void) {
    FILE *p = popen("nvidia-smi -L 2>/dev/null", "r");
    if (!p) return 0;
    char line[512];
    int n = 0;
    while (fgets(line, sizeof line, p))
        if (!strncmp(line, "GPU ", 4)) n++;
    pclose(p);
    return n;
}

int main(void) {
    self_test = getenv("DT_CUDA_TEST_SELF") && strcmp(getenv("DT_CUDA_TEST_SELF"), "0") != 0;
    int emulated = getenv("DT_CUDA_TEST_EMU") && strcmp(getenv("DT_CUDA_TEST_EMU"), "0") != 0;
    C = dt_ops_cpu();
    if (self_test) {
        G = dt_ops_cpu();
        diag("DT_CUDA_TEST_SELF: comparing the cpu backend with itself (harness check)");
    } else {
        int n = 0;
        if (dt_cuda_device_count(&n) != DT_OK) {
            /* no driver or no GPU: a skip; a GPU the driver lists but CUDA cannot use
             * (an insufficient driver, a broken install) is a failure */
            int listed = nvidia_smi_gpus();
            if (listed > 0) {
                printf("Bail out! nvidia-smi lists %d GPU%s but CUDA cannot use them: %s\n", listed,
                       listed == 1 ? "" : "s", dt_last_error());
                return 1;
            }
            char why[600];
            snprintf(why, sizeof why, "no usable CUDA device (%s)", dt_last_error());
            skip_all(why);
        }
        if (n < 1) skip_all("no CUDA device is visible");
        G = dt_ops_cuda(0, 0);
        if (!G) {
            printf("Bail out! dt_ops_cuda(0, 0) failed with %d devices: %s\n", n, dt_last_error());
            return 1;
        }
        is_str(G->name, "cuda", "the cuda table is named cuda");
        if (emulated) diag("DT_CUDA_TEST_EMU: the kernels run on the CPU (tests/gpu_emu.sh)");
        dt_device_opts o = {.index = 0, .allow_tf32 = 0};
        MUST(dt_device_opts_env(&o));   /* DT_CUDA_SYNC, DT_CU_MAX_BLOCKS, DT_CUDA_VMM, ... */
        if (emulated) {   /* libdtrain may have no CUDA backend: what dt_ops_get_ex does */
            MUST(dt_cuda_set_debug(o.sync, o.max_blocks));
            dt_cuda_set_memory_opts(!o.no_vmm, o.conv_cache_mb);
            G = dt_ops_cuda(0, 0);
        }
        else ok(dt_ops_get_ex("cuda", &o) == G && dt_ops_get("cuda") == G,
                "dt_ops_get_ex and dt_ops_get give the cuda table");
        if (o.max_blocks) diag("DT_CU_MAX_BLOCKS=%u: grid-stride kernels run on at most that many blocks", o.max_blocks);
        if (o.sync) diag("DT_CUDA_SYNC=1: every launch is followed by a synchronisation");
        char about[400];
        MUST(dt_ops_describe(G, about, sizeof about));
        diag("device: %s", about);
    }
    const char *t = getenv("DT_CUDA_TEST_TIMING"), *dp = getenv("DT_CUDA_TEST_DUMP");
    timing_reps = t ? atoi(t) : 0;
    if (dp && !(dump = fopen(dp, "w"))) {
        printf("Bail out! DT_CUDA_TEST_DUMP: cannot write %s\n", dp);
        return 1;
    }
    MUST(C->set_threads(2));
    if (part("table")) test_table();
    if (part("seq")) test_seq();
    if (part("real")) test_real_shapes();
    if (part("errors")) test_errors();
    if (part("memory")) test_memory();
    if (dump) fclose(dump);
    return done_testing();
}
