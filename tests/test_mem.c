/* test_mem.c: memory accounting (mem.h) — counts, peaks, the registry, threads —
 * against known sizes (an mlp's parameters are 4P bytes, AdamW's state 8P, DDP's
 * accumulation tree for k micro-batches a known number of gradients); the model's
 * plan (dt_model_plan_memory) equal to what building it allocates, category by
 * category, with and without recomputation; recomputation giving the gradients and
 * batchnorm buffers of a run without it, bit for bit; and the plan's formula rows
 * (plan.h) for the sharding modes and precisions; the CPU's large arrays in 2 MiB
 * blocks of huge pages, and what giving back part of one leaves. */
#include "comm.h"
#include "ddp.h"
#include "mem.h"
#include "model.h"
#include "optim.h"
#include "plan.h"
#include "shard.h"
#include "rng.h"
#include "tap.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

static const dt_shape MNIST = { 3, { 1, 28, 28 } };
#define GPT "gpt(layers=2,heads=2,dim=16,block=8,vocab=32,dropout=0.1)"
/* a block with a nested block, batchnorm and dropout inside, recomputed (the last
 * block's activations are still in the arena after forward: it is not) */
#define TREE "conv(4,3,pad=1) residual(bn relu seq(conv(4,3,pad=1) dropout(0.2)) residual(relu conv(4,1))) " \
             "residual(bn conv(4,3,pad=1)) gap linear(4)"

static size_t cur_of(int cat) {
    dt_mem_stats m;
    dt_mem_get(&m);
    return m.cur[cat];
}

static void test_counts(void) {
    const dt_ops *ops = dt_ops_cpu();
    dt_mem_stats a, b;
    dt_mem_get(&a);
    dt_mem_add(DT_MEM_GRADS, 100);
    dt_mem_get(&b);
    is_int(b.cur[DT_MEM_GRADS] - a.cur[DT_MEM_GRADS], 100, "dt_mem_add counts under its category");
    is_int(b.cur[DT_MEM_TOTAL] - a.cur[DT_MEM_TOTAL], 100, "... and in the total");
    dt_mem_sub(DT_MEM_GRADS, 100);
    dt_mem_add(DT_MEM_OPTIM, 60);
    dt_mem_get(&b);
    is_int(b.cur[DT_MEM_GRADS], a.cur[DT_MEM_GRADS], "dt_mem_sub takes it back");
    ok(b.peak[DT_MEM_GRADS] >= a.cur[DT_MEM_GRADS] + 100, "the category keeps its peak");
    ok(b.peak[DT_MEM_TOTAL] == a.cur[DT_MEM_TOTAL] + 100 || b.peak[DT_MEM_TOTAL] > a.peak[DT_MEM_TOTAL],
       "the total's peak is the most held at once (100), not the sum of the peaks (160)");
    dt_mem_reset_peak();
    dt_mem_get(&b);
    ok(b.peak[DT_MEM_TOTAL] == b.cur[DT_MEM_TOTAL] && b.peak[DT_MEM_GRADS] == b.cur[DT_MEM_GRADS],
       "dt_mem_reset_peak starts the peaks from the counts");
    dt_mem_sub(DT_MEM_OPTIM, 60);
    dt_mem_reset_peak();
    dt_mem_add(DT_MEM_ACTS, 100);
    dt_mem_sub(DT_MEM_ACTS, 100);
    dt_mem_add(DT_MEM_COMM, 100);
    dt_mem_get(&b);
    is_int(b.peak[DT_MEM_TOTAL] - b.cur[DT_MEM_TOTAL] + 100, 100, "one buffer after another: the total peaks at 100");
    dt_mem_sub(DT_MEM_COMM, 100);

    size_t acts = cur_of(DT_MEM_ACTS), comm = cur_of(DT_MEM_COMM);
    void *p = NULL, *h = NULL, *z = (void *)1;
    is_int(dt_mem_alloc(ops, DT_MEM_ACTS, &p, 1000), DT_OK, "dt_mem_alloc");
    is_int(dt_mem_host_alloc(ops, DT_MEM_COMM, &h, 3000), DT_OK, "dt_mem_host_alloc");
    is_int(cur_of(DT_MEM_ACTS) - acts, 1000, "device memory counted under its category");
    is_int(cur_of(DT_MEM_COMM) - comm, 3000, "host memory counted under its category");
    dt_mem_free(ops, p);
    dt_mem_free(ops, h);
    is_int(cur_of(DT_MEM_ACTS), acts, "dt_mem_free finds the size again (device)");
    is_int(cur_of(DT_MEM_COMM), comm, "dt_mem_free finds the size again (host)");
    is_int(dt_mem_alloc(ops, DT_MEM_OTHER, &z, 0), DT_OK, "0 bytes are fine");
    ok(z == NULL, "... and give NULL");
    dt_mem_free(ops, NULL);
    void *raw = NULL;
    ops->alloc(&raw, 64);
    size_t total = cur_of(DT_MEM_TOTAL);
    dt_mem_free(ops, raw);   /* memory the registry never saw: freed, uncounted */
    is_int(cur_of(DT_MEM_TOTAL), total, "freeing uncounted memory changes no count");
    is_int(dt_mem_alloc(ops, DT_MEM_NCAT, &p, 8), DT_ERR_INVALID, "an unknown category is refused");
    is_str(dt_mem_cat_name(DT_MEM_PARAMS), "params", "category names");
    is_str(dt_mem_cat_name(DT_MEM_TOTAL), "total", "... and the total's");
}

static void *churn(void *arg) {
    const dt_ops *ops = dt_ops_cpu();
    dt_mem_cat cat = (dt_mem_cat)(intptr_t)arg;
    for (int i = 0; i < 2000; i++) {
        void *p = NULL;
        if (dt_mem_alloc(ops, cat, &p, (size_t)(16 + i % 64)) != DT_OK) return (void *)1;
        dt_mem_add(DT_MEM_OTHER, 8);
        dt_mem_free(ops, p);
        dt_mem_sub(DT_MEM_OTHER, 8);
    }
    return NULL;
}

static void test_threads(void) {
    dt_mem_stats a, b;
    dt_mem_get(&a);
    pthread_t th[4];
    for (int i = 0; i < 4; i++) pthread_create(&th[i], NULL, churn, (void *)(intptr_t)(i % DT_MEM_NCAT));
    int bad = 0;
    for (int i = 0; i < 4; i++) {
        void *r;
        pthread_join(th[i], &r);
        bad |= r != NULL;
    }
    dt_mem_get(&b);
    ok(!bad && !memcmp(a.cur, b.cur, sizeof a.cur), "4 threads allocating and freeing leave every count as it was");
}

/* The cap (dt_mem_set_limit): an allocation over it is refused and nothing kept, one
 * that lands exactly on it is not; counted bytes may pass it and dt_mem_check_limit
 * says so, with what was held at the peak, until the peaks start again. */
static void test_limit(void) {
    const dt_ops *ops = dt_ops_cpu();
    dt_mem_reset_peak();
    size_t base = cur_of(DT_MEM_TOTAL);
    is_int((long long)dt_mem_limit(), 0, "no cap by default");
    dt_mem_set_limit(base + 4096);
    is_int((long long)dt_mem_limit(), (long long)(base + 4096), "dt_mem_limit gives the cap back");
    void *p = NULL, *q = NULL;
    is_int(dt_mem_alloc(ops, DT_MEM_ACTS, &p, 3000), DT_OK, "an allocation under the cap");
    is_int(dt_mem_alloc(ops, DT_MEM_OPTIM, &q, 2000), DT_ERR_NOMEM, "one that would cross it is refused");
    ok(q == NULL && cur_of(DT_MEM_TOTAL) == base + 3000, "and nothing of it is kept or counted");
    like(dt_last_error(), "MiB more of optim would take this process to ", "the error names the category");
    like(dt_last_error(), "over its cap of ", "the cap");
    like(dt_last_error(), "; it holds params 0.00, grads 0.00, optim 0.00, acts 0.00, comm 0.00, other 0.00 MiB",
         "and what is held, by category");
    is_int(dt_mem_host_alloc(ops, DT_MEM_COMM, &q, 2000), DT_ERR_NOMEM, "host memory counts against it too");
    is_int(dt_mem_alloc(ops, DT_MEM_OPTIM, &q, 1096), DT_OK, "an allocation that lands on the cap exactly is fine");
    is_int(dt_mem_check_limit(), DT_OK, "at the cap, not over it: dt_mem_check_limit is content");
    dt_mem_add(DT_MEM_PARAMS, 10);   /* held already: counted, over the cap */
    dt_mem_sub(DT_MEM_PARAMS, 10);
    is_int(dt_mem_check_limit(), DT_ERR_NOMEM, "counted bytes that went over it, even given back: the peak was over");
    like(dt_last_error(), "memory cap: this process held ", "the error names the peak");
    like(dt_last_error(), "MiB at its peak, over its cap of ", "and the cap");
    like(dt_last_error(), " MiB (params 0.00, grads 0.00", "and what was held then, by category");
    dt_mem_reset_peak();
    is_int(dt_mem_check_limit(), DT_OK, "the peaks started again: content again");
    dt_mem_free(ops, p);
    dt_mem_free(ops, q);
    dt_mem_set_limit(0);
    is_int(dt_mem_alloc(ops, DT_MEM_ACTS, &p, 1 << 20), DT_OK, "cap 0: none");
    dt_mem_free(ops, p);
    dt_mem_reset_peak();
}

/* Building spec allocates exactly what dt_model_plan_memory says, by category, and
 * freeing it gives it all back. */
static void check_plan_equals_build(const char *spec, const dt_shape *in, int B, int recompute,
                                    dt_model_mem *plan) {
    dt_model_opts mo;
    dt_model_opts_default(&mo);
    mo.recompute = recompute;
    dt_mem_stats a, b, c;
    if (!ok(dt_model_plan_memory(spec, in, B, &mo, plan) == DT_OK, "%s (recompute %d): plan", spec, recompute)) {
        diag("%s", dt_last_error());
        return;
    }
    dt_mem_get(&a);
    dt_model *m = NULL;
    if (!ok(dt_model_build_ex(spec, in, dt_ops_cpu(), 1, B, &mo, &m) == DT_OK, "%s (recompute %d): build", spec,
            recompute))
        return;
    dt_mem_get(&b);
    int same = 1;
    for (int k = 0; k < DT_MEM_NCAT; k++) {
        if (b.cur[k] - a.cur[k] != plan->bytes[k]) {
            diag("%s: %s built %zu, planned %zu", spec, dt_mem_cat_name(k), b.cur[k] - a.cur[k], plan->bytes[k]);
            same = 0;
        }
    }
    ok(same, "%s (recompute %d): every category built as planned", spec, recompute);
    dt_model_free(m);
    dt_mem_get(&c);
    ok(!memcmp(a.cur, c.cur, sizeof a.cur), "%s (recompute %d): freeing gives every byte back", spec, recompute);
}

static void test_known_sizes(void) {
    const dt_ops *ops = dt_ops_cpu();
    const int64_t P = 1863690;   /* mlp: PyTorch's count */
    dt_model_mem pm;
    check_plan_equals_build("mlp", &MNIST, 16, 0, &pm);
    is_int(pm.nparams, P, "mlp: P parameters");
    is_int(pm.bytes[DT_MEM_PARAMS], 4 * P, "mlp: parameters take 4P bytes");
    is_int(pm.bytes[DT_MEM_GRADS], 4 * P, "mlp: gradients take 4P bytes");
    is_int(pm.unit_params_max, 1024 * 1024 + 1024, "mlp: the largest unit is the 1024 x 1024 linear");
    /* activations: outputs (16 x (1024 + 1024 + 1024 + 1024 + 10)), two gradient buffers
     * of the largest input of a layer (1024); the loss's gradient takes the place of the
     * last linear's output (no head) */
    int64_t acts = 16 * (4 * 1024 + 10) + 2 * 16 * 1024;
    is_int(pm.bytes[DT_MEM_ACTS], 4 * acts, "mlp: activations as counted by hand");

    struct { const char *name; double momentum; int64_t want; } opt[] = {
        { "adamw", 0.0, 8 * P }, { "sgd", 0.9, 4 * P }, { "sgd", 0.0, 0 },
    };
    for (size_t i = 0; i < sizeof opt / sizeof opt[0]; i++) {
        const dt_optim_def *d = dt_optim_find(opt[i].name);
        dt_optim_config cfg = dt_optim_defaults(d->defaults.kind, 0.1f);
        cfg.momentum = (float)opt[i].momentum;
        size_t before = cur_of(DT_MEM_OPTIM);
        dt_optim *o = NULL;
        is_int(dt_optim_init(&cfg, ops, (size_t)P, &o), DT_OK, "%s (momentum %g) over the mlp", opt[i].name,
               opt[i].momentum);
        is_int(cur_of(DT_MEM_OPTIM) - before, opt[i].want, "%s (momentum %g): state of %lld bytes", opt[i].name,
               opt[i].momentum, (long long)opt[i].want);
        is_int(dt_optim_nstate_of(&cfg) * 4 * P, opt[i].want, "... as dt_optim_nstate_of says");
        dt_optim_free(o);
        is_int(cur_of(DT_MEM_OPTIM), before, "... and gives it back");
    }

    /* a tree of k's bits; a power of two closes it in the gradient itself: one array
     * fewer. In place (the default) level 0 is the gradient array and an odd leaf lands
     * in a scratch of the largest layer (the mlp's second linear, 1024 x 1024 + 1024) */
    int64_t ks[] = { 1, 2, 3, 4, 5, 8 }, arrays[] = { 0, 1, 2, 2, 3, 3 };
    const int64_t largest = 1024 * 1024 + 1024;
    dt_model *m = NULL;
    dt_model_build("mlp", &MNIST, ops, 1, 4, &m);
    for (size_t i = 0; m && i < sizeof ks / sizeof ks[0]; i++) {
        const dt_layer *layers = dt_model_layer(m, 0);
        int nl = dt_model_nlayers(m);
        for (int in_place = 0; in_place <= 1; in_place++) {
            size_t before = cur_of(DT_MEM_GRADS);
            dt_ddp_opts o;
            dt_ddp_opts_default(&o);
            o.in_place = in_place;
            dt_ddp *d = NULL;
            is_int(dt_ddp_init(m, NULL, ks[i], &o, &d), DT_OK, "DDP with %lld micro-batches%s", (long long)ks[i],
                   in_place ? ", in place" : "");
            int64_t want = in_place && arrays[i] ? (arrays[i] - 1) * 4 * P + 4 * largest : arrays[i] * 4 * P;
            is_int(cur_of(DT_MEM_GRADS) - before, want, "k = %lld%s: the tree takes %lld bytes of gradients",
                   (long long)ks[i], in_place ? ", in place" : "", (long long)want);
            is_int(dt_ddp_tree_floats(layers, nl, ks[i], 0, (size_t)P, in_place) * 4, want,
                   "... as dt_ddp_tree_floats says");
            dt_ddp_free(d);
        }
        is_int(dt_ddp_tree_arrays(ks[i]), arrays[i], "k = %lld: %lld tree arrays", (long long)ks[i], (long long)arrays[i]);
    }
    dt_model_free(m);
}

/* The accumulation in place sums the same leaves in the same order as the copied tree:
 * the gradients after k micro-batches are bitwise the same, for every k, on a model with
 * a tied embedding and head (whose layers keep the copied slot) and on one without, with
 * every node rounded to bf16 (--grad-dtype bf16) too. */
static void test_tree_in_place(void) {
    const dt_ops *ops = dt_ops_cpu();
    enum { B = 2, T = 8 };
    static const struct { const char *spec; dt_shape in; int tokens; } cases[] = {
        {"gpt(layers=2,heads=2,dim=16,block=8,vocab=32)", {1, {T}}, 1},
        {"flatten linear(16) relu linear(8) gelu linear(4)", {1, {12}}, 0},
    };
    const dt_loss ce = {.kind = DT_LOSS_CE};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const size_t in_n = (size_t)dt_shape_numel(&cases[c].in), lw = cases[c].tokens ? T : 1;
        float x[B * 12 > B * T ? B * 12 : B * T];
        int32_t labels[B * T];
        for (int64_t k = 2; k <= 7 + 6; k++) {
            const int bf16 = k > 7;   /* k = 2 .. 7 again, rounded */
            const int64_t kk = bf16 ? k - 6 : k;
            float *g[2] = {NULL, NULL};
            size_t n = 0;
            int run = 1;
            for (int in_place = 0; in_place <= 1 && run; in_place++) {
                dt_model *m = NULL;
                dt_ddp *d = NULL;
                dt_ddp_opts o;
                dt_ddp_opts_default(&o);
                o.in_place = in_place;
                if (bf16) o.grad_dtype = DT_BF16;
                run = dt_model_build(cases[c].spec, &cases[c].in, ops, 7, B, &m) == DT_OK &&
                      dt_ddp_init(m, NULL, kk, &o, &d) == DT_OK;
                for (int64_t i = 0; run && i < kk; i++) {
                    for (size_t j = 0; j < B * in_n; j++)
                        x[j] = cases[c].tokens ? (float)((j * 7 + (size_t)i * 5 + 3) % 32)
                                               : (float)(((j + 1) * 7919 + (size_t)i * 31) % 103) / 51.0f - 1.0f;
                    for (size_t j = 0; j < B * lw; j++) labels[j] = (int32_t)((j * 5 + (size_t)i * 3 + 1) % (cases[c].tokens ? 32 : 4));
                    run = dt_model_forward(m, x, B, 1, 0, i * B, NULL) == DT_OK && dt_ddp_begin_micro(d, i) == DT_OK &&
                          dt_model_loss_backward(m, &ce, labels, B, (float)(kk * B), NULL) == DT_OK;
                }
                run = run && dt_ddp_finish(d, NULL) == DT_OK;
                if (run) {
                    n = dt_model_nparams(m);
                    g[in_place] = malloc(n * sizeof(float));
                    if (g[in_place]) memcpy(g[in_place], dt_model_grads(m), n * sizeof(float));
                }
                dt_ddp_free(d);
                dt_model_free(m);
            }
            const char *r = bf16 ? ", bf16" : "";
            if (ok(run && g[0] && g[1], "%s, k = %lld%s: both trees run (%s)", cases[c].spec, (long long)kk, r,
                   run ? "ok" : dt_last_error()))
                ok(!memcmp(g[0], g[1], n * sizeof(float)), "%s, k = %lld%s: in place gives the copied tree's "
                   "gradients, bit for bit", cases[c].spec, (long long)kk, r);
            free(g[0]), free(g[1]);
        }
    }
}

static void test_plans(void) {
    const dt_shape img = { 3, { 1, 12, 12 } }, seq = { 1, { 8 } };
    dt_model_mem a, b;
    check_plan_equals_build("cnn", &MNIST, 8, 0, &a);
    check_plan_equals_build("resnet", &img, 8, 0, &a);
    check_plan_equals_build("resnet", &img, 8, 1, &b);
    is_int(a.nblocks, 2, "resnet: 2 residual blocks");
    ok(b.bytes[DT_MEM_ACTS] < a.bytes[DT_MEM_ACTS], "resnet: recompute takes fewer activation bytes (%zu < %zu)",
       b.bytes[DT_MEM_ACTS], a.bytes[DT_MEM_ACTS]);
    is_int(a.bytes[DT_MEM_ACTS] - b.bytes[DT_MEM_ACTS], (a.block_acts + a.scratch) - (b.block_acts + b.scratch),
           "resnet: ... by what the blocks no longer keep (their scratch moves into the arena)");
    check_plan_equals_build(TREE, &img, 8, 0, &a);
    check_plan_equals_build(TREE, &img, 8, 1, &b);
    check_plan_equals_build(GPT, &seq, 4, 0, &a);
    check_plan_equals_build(GPT, &seq, 4, 1, &b);
    is_int(a.nblocks, 4, "gpt: 2 layers are 4 residual blocks");
    /* with recompute a block keeps its output (4 samples x 8 positions x 16) and shares the arena */
    is_int(b.block_acts - b.arena, (size_t)a.nblocks * 4 * 8 * 16 * 4, "gpt: with recompute a block keeps only its output");
    ok(b.arena > 0 && b.arena < a.block_acts / (size_t)a.nblocks + a.scratch + 4096,
       "gpt: the arena holds one block and its scratch (%zu bytes)", b.arena);
    check_plan_equals_build("mlp", &MNIST, 4, 1, &b);
    is_int(b.arena, 0, "mlp: no blocks, no arena");

    /* what one transformer layer keeps, counted by hand (4 samples, T = 8, C = 16, 2
     * heads): the attention block's ln output and statistics (TC + 2T), the attention's
     * output, qkv, pre-projection output and lse (TC + 3TC + TC + 2T); the MLP block's ln
     * (TC + 2T), c_fc, gelu and c_proj (4TC + 4TC + TC). Each block adds its skip over
     * its last layer's output (the attention's, c_proj's), which no backward reads: no
     * output of its own. Attention's backward scratch and the skip gradients are the
     * model's, shared by every layer: a third layer adds none of them */
    dt_model_mem l2, l3;
    check_plan_equals_build("gpt(layers=2,heads=2,dim=16,block=8,vocab=32)", &seq, 4, 0, &l2);
    check_plan_equals_build("gpt(layers=3,heads=2,dim=16,block=8,vocab=32)", &seq, 4, 0, &l3);
    const int64_t T = 8, C = 16, layer = 16 * T * C + 2 * T + 2 * T + 2 * T;
    is_int(l3.bytes[DT_MEM_ACTS] - l2.bytes[DT_MEM_ACTS], 4 * 4 * layer, "gpt: a layer keeps %lld floats a sample",
           (long long)layer);
}

/* Forward and backward of one batch; the gradients (and buffers) into host memory. */
static int run_once(const char *spec, const dt_shape *in, int recompute, int tokens, float *grads, float *bufs,
                    size_t *np, size_t *nb) {
    const dt_ops *ops = dt_ops_cpu();
    dt_model_opts mo;
    dt_model_opts_default(&mo);
    mo.recompute = recompute;
    dt_model *m = NULL;
    if (dt_model_build_ex(spec, in, ops, 3, 4, &mo, &m) != DT_OK) return 0;
    int64_t n = 4 * dt_shape_numel(in), nl = tokens ? n : 4;
    float *x = malloc((size_t)n * sizeof *x);
    int32_t *y = malloc((size_t)nl * sizeof *y);
    for (int64_t i = 0; i < n; i++) x[i] = tokens ? (float)(int)(dt_rng_unit(9, 0, (uint64_t)i) * 32) : dt_rng_unit(9, 1, (uint64_t)i);
    for (int64_t i = 0; i < nl; i++) y[i] = (int32_t)(dt_rng_unit(9, 2, (uint64_t)i) * 4);
    dt_loss lf = { .kind = DT_LOSS_CE };
    int good = 1;
    for (int step = 0; step < 2 && good; step++)   /* twice: batchnorm's buffers move twice */
        good = dt_model_forward(m, x, 4, 1, 0, step * 4, NULL) == DT_OK &&
               dt_model_loss_backward(m, &lf, y, 4, 4.0f, NULL) == DT_OK;
    *np = dt_model_nparams(m);
    *nb = dt_model_nbuffers(m);
    if (good) {
        memcpy(grads, dt_model_grads(m), *np * sizeof(float));
        if (*nb) memcpy(bufs, dt_model_buffers(m), *nb * sizeof(float));
    }
    dt_model_free(m);
    free(x);
    free(y);
    return good;
}

static void test_recompute_bits(void) {
    const dt_shape img = { 3, { 1, 12, 12 } }, seq = { 1, { 8 } };
    struct { const char *spec; const dt_shape *in; int tokens; } cases[] = {
        { "resnet", &img, 0 }, { TREE, &img, 0 }, { GPT, &seq, 1 },
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        static float g0[1 << 18], g1[1 << 18], b0[1 << 12], b1[1 << 12];
        size_t n0, n1, m0, m1;
        int ok0 = run_once(cases[c].spec, cases[c].in, 0, cases[c].tokens, g0, b0, &n0, &m0);
        int ok1 = run_once(cases[c].spec, cases[c].in, 1, cases[c].tokens, g1, b1, &n1, &m1);
        if (!ok(ok0 && ok1, "%s: forward and backward with and without recompute", cases[c].spec)) {
            diag("%s", dt_last_error());
            continue;
        }
        ok(n0 == n1 && !memcmp(g0, g1, n0 * sizeof(float)), "%s: recompute gives bitwise the same gradients",
           cases[c].spec);
        ok(m0 == m1 && !memcmp(b0, b1, m0 * sizeof(float)),
           "%s: ... and the same batchnorm running statistics (updated once per forward)", cases[c].spec);
    }
}

static void test_plan_rows(void) {
    setenv("DT_SHM", "0", 1);   /* the formula without the tcp rings (test_plan_rings) */
    dt_train_opts t;
    dt_train_opts_default(&t);
    t.model = "mlp";
    t.batch = 64;
    t.optim = "adamw";
    t.eval = 0;
    dt_plan_opts o = { .train = &t, .world = 4, .input = MNIST, .labels = 1 };
    /* a rank's shard: whole chunks of 4096, ceil(455 / 4) = 114 of them (shard.c) */
    const int64_t P = 1863690, U = 1024 * 1024 + 1024, Ps = 114 * 4096;
    dt_plan_estimate none, e;
    const dt_plan_precision *fp32 = dt_plan_precision_find("fp32"), *bf16 = dt_plan_precision_find("bf16");
    ok(fp32 && bf16 && dt_plan_precision_find("fp16") && !dt_plan_precision_find("fp8"), "precision rows by name");
    ok(dt_plan_shard_find("none") && dt_plan_shard_find("params") && !dt_plan_shard_find("all"), "shard rows by name");
    int nmodes;
    const dt_plan_shard *modes = dt_plan_shards(&nmodes);
    int same = nmodes == DT_SHARD_COUNT;
    for (int i = 0; same && i < nmodes; i++) {
        dt_shard_mode m;
        same = dt_shard_parse(modes[i].name, &m) == DT_OK && (int)m == i;
    }
    ok(same, "the plan has a row for each sharding mode of shard.c, in its order");
    is_int(dt_plan_run(&o, dt_plan_shard_find("none"), fp32, &none), DT_OK, "plan: none, fp32 on 4 ranks");
    is_int(none.bytes[DT_MEM_PARAMS], 4 * P, "none: 4P of parameters");
    is_int(none.bytes[DT_MEM_OPTIM], 8 * P, "none: AdamW's 8P");
    is_int(none.bytes[DT_MEM_COMM], 0, "none: no communication buffer");
    dt_plan_run(&o, dt_plan_shard_find("optim"), fp32, &e);
    is_int(e.bytes[DT_MEM_OPTIM], 8 * Ps, "optim: the state of P/W parameters");
    is_int(e.bytes[DT_MEM_GRADS], 4 * 4 * Ps, "optim: whole gradients, W shards long (the last one padded)");
    is_int(e.bytes[DT_MEM_PARAMS], 4 * 4 * Ps, "optim: whole parameters, W shards long");
    dt_plan_run(&o, dt_plan_shard_find("grads"), fp32, &e);
    is_int(e.bytes[DT_MEM_GRADS], 4 * 4 * Ps,
           "grads: the whole gradient array (backward's output, reduce-scattered in place), W shards long");
    is_int(e.bytes[DT_MEM_OPTIM], 8 * Ps, "grads: the state of P/W parameters");
    is_int(e.bytes[DT_MEM_COMM], 0, "grads: no communication buffer");
    /* the CPU's pool: on rank 0 none of the 3 units is its own, a run of 3: four slots of
     * the largest, two of them holding gradients at once, counted once in the total */
    dt_plan_run(&o, dt_plan_shard_find("params"), fp32, &e);
    is_int(e.bytes[DT_MEM_PARAMS], 4 * Ps + 4 * 4 * U, "params, the CPU's pool: P/W of the parameters and four slots");
    is_int(e.bytes[DT_MEM_GRADS], 4 * Ps + 2 * 4 * U,
           "params, the CPU's pool: P/W of the gradient and two of the slots (one written, one summed)");
    size_t sum = 0;
    for (int c = 0; c < DT_MEM_NCAT; c++) sum += e.bytes[c];
    is_int(e.total, sum - 2 * 4 * U, "params, the CPU's pool: the total counts the gradients' slots once");
    o.world = 2;   /* a rank's shard holds a unit: runs of 2, three slots */
    dt_plan_run(&o, dt_plan_shard_find("params"), fp32, &e);
    is_int(e.bytes[DT_MEM_PARAMS], 4 * 228 * 4096 + 3 * 4 * U,
           "params on 2 ranks: each holds a unit of its own, the others are a run of 2: three slots");
    o.world = 4;
    setenv("DT_SHARD_POOL", "0", 1);   /* the gathers in place */
    dt_plan_run(&o, dt_plan_shard_find("params"), fp32, &e);
    is_int(e.bytes[DT_MEM_PARAMS], 4 * Ps + 2 * 4 * U, "params in place: P/W of the parameters and two gathered units");
    is_int(e.bytes[DT_MEM_GRADS], 4 * Ps + 4 * U, "params in place: P/W of the gradient and a unit being summed");
    unsetenv("DT_SHARD_POOL");
    ok(e.bytes[DT_MEM_ACTS] == none.bytes[DT_MEM_ACTS] && e.bytes[DT_MEM_OTHER] == none.bytes[DT_MEM_OTHER],
       "params: activations and the rest as unsharded");
    t.backward_prefetch = "post";
    dt_plan_run(&o, dt_plan_shard_find("params"), fp32, &e);
    ok(e.bytes[DT_MEM_PARAMS] == 4 * Ps + 2 * 4 * U && e.bytes[DT_MEM_GRADS] == 4 * Ps + 4 * U &&
           e.total == 8 * Ps + 2 * 4 * U + e.bytes[DT_MEM_OPTIM] + e.bytes[DT_MEM_ACTS] + e.bytes[DT_MEM_COMM] +
                          e.bytes[DT_MEM_OTHER],
       "params, backward prefetch post: the shards and two slots in all, one of them for gradients");
    dt_plan_run(&o, dt_plan_shard_find("none"), fp32, &e);
    is_int(e.bytes[DT_MEM_PARAMS], 4 * P, "... which --shard none does not change");
    t.backward_prefetch = "late";
    is_int(dt_plan_run(&o, dt_plan_shard_find("params"), fp32, &e), DT_ERR_INVALID, "backward prefetch 'late': refused");
    like(dt_last_error(), "backward_prefetch: expected pre or post", "... naming the choices");
    t.backward_prefetch = "pre";
    dt_plan_run(&o, dt_plan_shard_find("none"), bf16, &e);
    is_int(e.bytes[DT_MEM_PARAMS], 8 * P, "bf16: fp32 master weights and a copy of rounded values in fp32");
    ok(e.bytes[DT_MEM_ACTS] > none.bytes[DT_MEM_ACTS], "bf16: and scratch for rounded activations");
    is_int(e.bytes[DT_MEM_OPTIM], 8 * P, "bf16: fp32 optimizer state");
    dt_plan_run(&o, dt_plan_shard_find("params"), bf16, &e);
    is_int(e.bytes[DT_MEM_PARAMS], 4 * Ps + 4 * 4 * U,
           "bf16, params: the shard's master and the pool's slots, no copy (the units are rounded where gathered)");
    setenv("DT_SHARD_POOL", "0", 1);   /* the gathers in place round into a copy of the whole array */
    dt_plan_run(&o, dt_plan_shard_find("params"), bf16, &e);
    is_int(e.bytes[DT_MEM_PARAMS], 4 * Ps + 4 * P + 2 * 4 * U, "bf16, params in place: and a copy of the whole array");
    unsetenv("DT_SHARD_POOL");
    t.micro_batches = 8;
    dt_plan_run(&o, dt_plan_shard_find("none"), fp32, &e);
    is_int(e.bytes[DT_MEM_GRADS], 4 * P + 4 * (1024 * 1024 + 1024),
           "2 micro-batches per rank: the tree in place, its scratch of the largest layer");
    t.micro_batches = 6;
    is_int(dt_plan_run(&o, dt_plan_shard_find("none"), fp32, &e), DT_ERR_INVALID, "6 micro-batches on 4 ranks: refused");
    like(dt_last_error(), "micro_batches", "... naming micro-batches");
    t.micro_batches = 0;
    /* the wall: 4 ranks cannot hold it in 20 MB; sharding the state on 4 does (none is ~41 MB) */
    const dt_plan_shard *sh = NULL;
    int w = 0;
    ok(dt_plan_fit(&o, fp32, (size_t)(none.total - 8 * P + 8 * Ps + 8 * (4 * Ps - P) + 4096), 1024, &sh, &w) && sh &&
       !strcmp(sh->name, "optim") && w == 4, "the wall: --shard optim on the same 4 ranks fits");
    sh = NULL;
    w = 0;
    int found = dt_plan_fit(&o, fp32, (size_t)16 << 20, 1 << 20, &sh, &w);
    dt_plan_opts q = o;
    q.world = w;
    ok(found && w > 4 && dt_plan_run(&q, sh, fp32, &e) == DT_OK && e.total <= (size_t)16 << 20,
       "the wall: 16 MiB needs more ranks (%d, --shard %s), and fits there", w, sh ? sh->name : "-");
    q.world = w / 2;
    int smaller = 0;
    int nsh;
    const dt_plan_shard *rows = dt_plan_shards(&nsh);
    for (int i = 0; i < nsh; i++) smaller |= dt_plan_run(&q, &rows[i], fp32, &e) == DT_OK && e.total <= (size_t)16 << 20;
    ok(found && !smaller, "... and no mode fits on half as many");
    ok(!dt_plan_fit(&o, fp32, 1000, 1 << 20, &sh, &w), "nothing fits in 1000 bytes");
}

/* The tcp backend's shared-memory rings in the plan: a ring each way with each partner
 * of halving/doubling on a power-of-two host, with every partner the sizing allows
 * otherwise, none past the budget; the plan's comm row adds them. */
static void test_plan_rings(void) {
    const size_t one = (1u << 20) + 4096;   /* a 1 MiB ring and its control page */
    const int W[] = {1, 2, 3, 4, 8};
    const size_t want[] = {0, 2 * one, 4 * one, 4 * one, 6 * one};
    unsetenv("DT_SHM");
    setenv("DT_SHM_BUDGET", "64M", 1);
    for (int i = 0; i < 5; i++) {
        size_t b = 1;
        dt_status st = dt_comm_shm_plan(W[i], &b);
        ok(st == DT_OK && b == want[i], "rings of one rank among %d on a host: %zu bytes (want %zu)", W[i], b, want[i]);
    }
    size_t b = 1;
    setenv("DT_SHM_BUDGET", "1", 1);
    ok(dt_comm_shm_plan(4, &b) == DT_OK && b == 0, "a budget below one ring: none");
    setenv("DT_SHM_BUDGET", "12x", 1);
    ok(dt_comm_shm_plan(4, &b) == DT_ERR_INVALID && strstr(dt_last_error(), "DT_SHM_BUDGET='12x'"),
       "a bad DT_SHM_BUDGET is named");
    setenv("DT_SHM_BUDGET", "64M", 1);
    dt_train_opts t;
    dt_train_opts_default(&t);
    t.model = "mlp";
    t.batch = 64;
    t.eval = 0;
    dt_plan_opts o = { .train = &t, .world = 2, .input = MNIST, .labels = 1 };
    dt_plan_estimate with, without;
    const dt_plan_precision *fp32 = dt_plan_precision_find("fp32");
    dt_status s1 = dt_plan_run(&o, dt_plan_shard_find("none"), fp32, &with);
    setenv("DT_SHM", "0", 1);
    dt_status s2 = dt_plan_run(&o, dt_plan_shard_find("none"), fp32, &without);
    ok(s1 == DT_OK && s2 == DT_OK && with.bytes[DT_MEM_COMM] == without.bytes[DT_MEM_COMM] + 2 * one &&
       with.total == without.total + 2 * one, "the plan's comm row holds the rings of 2 ranks");
    unsetenv("DT_SHM");
    unsetenv("DT_SHM_BUDGET");
}

/* Kilobytes of huge pages in the mapping that holds p (/proc/self/smaps), -1 unknown. */
static long huge_kb_at(const void *p) {
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return -1;
    char line[512];
    int in = 0;
    long kb = -1;
    while (fgets(line, sizeof line, f)) {
        unsigned long a, b;
        if (sscanf(line, "%lx-%lx ", &a, &b) == 2 && strchr(line, '-') < strchr(line, ' ')) {
            in = (uintptr_t)p >= a && (uintptr_t)p < b;
            continue;
        }
        if (in && sscanf(line, "AnonHugePages: %ld kB", &kb) == 1) break;
    }
    fclose(f);
    return kb;
}

/* Resident pages among the n 4 KiB pages from p (mincore); 0 where it fails. */
static size_t resident_pages(const void *p, size_t n) {
    unsigned char *vec = malloc(n ? n : 1);
    size_t in = 0;
    if (vec && mincore((void *)p, n * 4096, vec) == 0)
        for (size_t i = 0; i < n; i++) in += vec[i] & 1;
    free(vec);
    return in;
}

/* The CPU backend's arrays of 2 MiB or more (ops page_block) start on a block and
 * come in huge pages where the kernel has them; discard gives back the whole pages of
 * a range, zeros where they were, and keeps the bytes around it. */
static void test_page_blocks(void) {
    const dt_ops *ops = dt_ops_cpu();
    /* 40 MiB: beyond the largest size glibc serves from memory used before (32 MiB),
     * which earlier tests touched in 4 KiB pages */
    const size_t pb = ops->page_block, n = (40u << 20) / sizeof(float) + 25;
    is_int((long long)pb, 2 << 20, "cpu page_block is 2 MiB");
    float *a = NULL, *small = NULL;
    if (!ok(ops->alloc((void **)&a, n * sizeof(float)) == DT_OK && ops->alloc((void **)&small, 1000) == DT_OK,
            "alloc 40 MiB and 1000 bytes")) return;
    ok((uintptr_t)a % pb == 0, "an array of 40 MiB starts on a 2 MiB block");
    ok((uintptr_t)small % 64 == 0, "a small one on 64 bytes");
    ok(ops->fill(a, 1.0f, n) == DT_OK, "fill");
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    char mode[128] = "";
    if (f && !fgets(mode, sizeof mode, f)) mode[0] = 0;
    if (f) fclose(f);
    if (strstr(mode, "[always]") || strstr(mode, "[madvise]"))
        ok(huge_kb_at(a) >= 2048, "its whole blocks are huge pages (%ld kB; transparent huge pages: %.*s)",
           huge_kb_at(a), (int)strcspn(mode, "\n"), mode);
    else
        skip(1, "no transparent huge pages here");
    /* give back [1 MiB + 3 floats, 3.5 MiB + 5 floats): what lies in whole 4 KiB pages
     * reads 0, the rest of the range and everything around it 1 */
    const size_t lo = (1u << 20) / sizeof(float) + 3, hi = (7u << 19) / sizeof(float) + 5, pg = 4096 / sizeof(float);
    ok(ops->discard(a + lo, (hi - lo) * sizeof(float)) == DT_OK, "discard part of two blocks");
    size_t wlo = (lo + pg - 1) / pg * pg, whi = hi / pg * pg, bad = 0;
    for (size_t i = 0; i < n; i++) bad += a[i] != (i >= wlo && i < whi ? 0.0f : 1.0f);
    is_int((long long)bad, 0, "zeros in the whole pages given back, ones elsewhere");
    /* populate brings them back before they are written: where the kernel has
     * MADV_POPULATE_WRITE (Linux 5.14) every page is resident after it (mincore, asked
     * before anything reads them), none before; and no byte changes */
    size_t npg = (whi - wlo) / pg;
    ok(ops->discard(a + lo, (hi - lo) * sizeof(float)) == DT_OK, "discard the range again");
    size_t before = resident_pages(a + wlo, npg);
    ok(ops->populate(a + lo, (hi - lo) * sizeof(float)) == DT_OK, "populate the range");
    size_t after = resident_pages(a + wlo, npg);
    char probe[8192] __attribute__((aligned(4096)));
    if (madvise(probe, 4096, 23 /* MADV_POPULATE_WRITE */) == 0)
        ok(before == 0 && after == npg, "its %zu pages: %zu resident before populate, %zu after", npg, before, after);
    else
        skip(1, "no MADV_POPULATE_WRITE in this kernel: populate is a hint it ignores");
    bad = 0;
    for (size_t i = 0; i < n; i++) bad += a[i] != (i >= wlo && i < whi ? 0.0f : 1.0f);
    is_int((long long)bad, 0, "populate changes no byte");
    ok(ops->fill(a + lo, 2.0f, hi - lo) == DT_OK, "the range written again");
    bad = 0;
    for (size_t i = 0; i < n; i++) bad += a[i] != (i >= lo && i < hi ? 2.0f : 1.0f);
    is_int((long long)bad, 0, "and it reads back");
    ops->free(a);
    ops->free(small);
}

int main(void) {
    test_counts();
    test_threads();
    test_limit();
    test_known_sizes();
    test_plans();
    test_tree_in_place();
    test_recompute_bits();
    test_plan_rows();
    test_plan_rings();
    test_page_blocks();
    return done_testing();
}
