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
 * DT_CUDA_TEST_SELF=1 runs the comparisons CPU against CPU (a check of the harness on
 * machines without a GPU; every comparison must then be exact).
 * tests/gpu_emu.sh builds this file against the backend's kernels compiled for the CPU
 * (DT_CUDA_TEST_EMU=1), so the kernels' logic is tested on machines without a GPU too.
 */
#define _POSIX_C_SOURCE 200809L   /* popen */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* Case fn from `seed` on the cpu and twice on the device: within the case's tolerances
 * of the cpu, and the same bytes twice. */
static void compare_case(const char *name, void (*fn)(tc_run *), uint64_t seed) {
    tc_run want, got, again;
    char why[300] = "";
    double worst = 0.0;
    dt_status sc = tc_exec_fn(fn, seed, C, &want), s1 = tc_exec_fn(fn, seed, G, &got), s2 = tc_exec_fn(fn, seed, G, &again);
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
    tc_result_free(&want);
    tc_result_free(&got);
    tc_result_free(&again);
}

static void test_table(void) {
    tc_check_complete(G);
    for (int i = 0; i < DT_OPS_COUNT; i++)
        compare_case(tc_cases[i].name, tc_cases[i].fn, (uint64_t)i * 0x100000001b3ull);
}

/* ---- sequence kernels on shapes the table leaves out: every head-width build of the
 * attention kernels (cuda_seq.cu: up to 32, 64, 128, 256; decode unbounded), several
 * tiles, and embeddings over several column blocks, vocabulary ranges and id batches ---- */

static int seq_D;   /* head width of the next attention case */

static void seq_attn(tc_run *r) {
    const int B = 2, T = 70, H = 2, D = seq_D, Cw = H * D;
    size_t bt = (size_t)B * T;
    float *qkv = tc_rand(r, bt * 3 * Cw, -2.0f, 2.0f), *dy = tc_rand(r, bt * Cw, -1.0f, 1.0f);
    float *y = tc_out(r, bt * Cw * sizeof(float), 1, TC_GEMM, "y (D=%d)", D);
    float *lse = tc_out(r, bt * H * sizeof(float), 1, TC_GEMM, "lse (D=%d)", D);
    TC(r, r->ops->attn_forward(y, lse, qkv, B, T, H, D));
    float *dqkv = tc_out(r, bt * 3 * Cw * sizeof(float), 1, TC_GEMM, "dqkv (D=%d)", D);
    TC(r, r->ops->attn_backward(dqkv, dy, qkv, y, lse, B, T, H, D));
    float *y1 = tc_out(r, Cw * sizeof(float), 1, TC_GEMM, "decode y (D=%d, t=%d)", D, T - 1);
    TC(r, r->ops->attn_decode(y1, qkv, T - 1, H, D));
}

static void seq_decode_wide(tc_run *r) {
    const int T = 300, H = 2, D = 300, Cw = H * D;
    float *qkv = tc_rand(r, (size_t)T * 3 * Cw, -2.0f, 2.0f);
    float *y = tc_out(r, Cw * sizeof(float), 1, TC_GEMM, "decode y (D=%d, t=%d)", D, T - 1);
    TC(r, r->ops->attn_decode(y, qkv, T - 1, H, D));
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
    compare_case("attn_decode, head width 300", seq_decode_wide, 1003);
    compare_case("embedding, 2 column blocks, 1100 ids", seq_embedding, 1004);
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

    /* the attention kernels' widest head is 256 (the cpu has no bound) */
    if (!self_test) {
        float *qkv = dev_zero(3 * 257), *y = dev_zero(257), *lse = dev_zero(1);
        is_int(G->attn_forward(y, lse, qkv, 1, 1, 1, 257), DT_ERR_UNSUPPORTED, "attn_forward with D = 257 is unsupported");
        like(dt_last_error(), "attn_forward", "the message names the kernel");
        G->free(qkv); G->free(y); G->free(lse);
    } else {
        skip(2, "the cpu has no bound on the head width");
    }
}

/* ---- memory, streams and the device ---- */

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
        MUST(dt_device_opts_env(&o));   /* DT_CUDA_SYNC, DT_CU_MAX_BLOCKS */
        if (emulated) MUST(dt_cuda_set_debug(o.sync, o.max_blocks));   /* libdtrain may have no CUDA backend */
        else ok(dt_ops_get_ex("cuda", &o) == G && dt_ops_get("cuda") == G,
                "dt_ops_get_ex and dt_ops_get give the cuda table");
        if (o.max_blocks) diag("DT_CU_MAX_BLOCKS=%u: grid-stride kernels run on at most that many blocks", o.max_blocks);
        if (o.sync) diag("DT_CUDA_SYNC=1: every launch is followed by a synchronisation");
        char about[400];
        MUST(dt_ops_describe(G, about, sizeof about));
        diag("device: %s", about);
    }
    MUST(C->set_threads(2));
    test_table();
    test_seq();
    test_errors();
    test_memory();
    return done_testing();
}
