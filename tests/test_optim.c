/* test_optim.c: SGD (momentum, dampening, nesterov, weight decay) and AdamW two
 * steps against values computed by hand (and equal to torch.optim's), LR
 * schedules at chosen steps, clipping, a short training run on synthetic
 * separable data that must reach a loss threshold, and determinism: two runs
 * give the same bytes, and 1 vs 2 threads give the same bytes. */
#include "model.h"
#include "optim.h"
#include "rng.h"
#include "tap.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const dt_ops *ops;

/* Two steps of an optimizer on p = [1, -2] with grad [0.5, 0.25] each step. */
static void two_steps(dt_optim_config cfg, const float want[4], const char *what) {
    float p[2] = { 1.0f, -2.0f }, g[2] = { 0.5f, 0.25f };
    dt_optim *o = NULL;
    if (!ok(dt_optim_init(&cfg, ops, 2, &o) == DT_OK, "%s: init", what)) return;
    dt_optim_step(o, p, g, cfg.lr, 1.0f);
    ok(fabsf(p[0] - want[0]) < 1e-6f && fabsf(p[1] - want[1]) < 1e-6f, "%s step 1: [%.7f, %.7f] want [%.7f, %.7f]",
       what, (double)p[0], (double)p[1], (double)want[0], (double)want[1]);
    dt_optim_step(o, p, g, cfg.lr, 1.0f);
    ok(fabsf(p[0] - want[2]) < 1e-6f && fabsf(p[1] - want[3]) < 1e-6f, "%s step 2: [%.7f, %.7f] want [%.7f, %.7f]",
       what, (double)p[0], (double)p[1], (double)want[2], (double)want[3]);
    is_int(dt_optim_steps(o), 2, "%s: step count", what);
    dt_optim_free(o);
}

static void test_optimizers(void) {
    dt_optim_config c = dt_optim_defaults(DT_OPTIM_SGD, 0.1f);
    /* p1 = p - lr*g = [1 - .05, -2 - .025] */
    two_steps(c, (const float[]){ 0.95f, -2.025f, 0.9f, -2.05f }, "sgd plain");
    /* buf1 = g' = g + wd p = [.51, .23]; p1 = [.949, -2.023]; buf2 = .9 buf1 + g'(p1) */
    c.momentum = 0.9f; c.weight_decay = 0.01f;
    two_steps(c, (const float[]){ 0.949f, -2.023f, 0.852151f, -2.066677f }, "sgd momentum + wd");
    c.nesterov = 1;
    two_steps(c, (const float[]){ 0.9031f, -2.0437f, 0.76507413f, -2.105947f }, "sgd nesterov + wd");
    c.nesterov = 0; c.weight_decay = 0; c.dampening = 0.5f;
    /* first buf = g (no dampening on the first step, as PyTorch), then .9 buf + .5 g */
    two_steps(c, (const float[]){ 0.95f, -2.025f, 0.88f, -2.06f }, "sgd dampening");
    /* AdamW step 1: p *= 1 - lr*wd; m_hat/sqrt(v_hat) = sign(g) -> p - lr */
    dt_optim_config a = dt_optim_defaults(DT_OPTIM_ADAMW, 0.1f);
    two_steps(a, (const float[]){ 0.899f, -2.098f, 0.798101f, -2.1959019f }, "adamw");

    dt_optim *o = NULL;
    is_int(dt_optim_init(&a, ops, 5, &o), DT_OK, "adamw over 5");
    is_int(dt_optim_nstate(o), 2, "adamw has two state arrays");
    is_str(dt_optim_state_name(o, 1), "exp_avg_sq", "state names as PyTorch");
    dt_optim_free(o);
    c.nesterov = 1;
    is_int(dt_optim_init(&c, ops, 2, &o), DT_ERR_INVALID, "nesterov with dampening rejected");
    like(dt_last_error(), "nesterov", "nesterov message");
    c = dt_optim_defaults(DT_OPTIM_SGD, -1.0f);
    is_int(dt_optim_init(&c, ops, 2, &o), DT_ERR_INVALID, "negative lr rejected");
    a.beta2 = 1.0f;
    is_int(dt_optim_init(&a, ops, 2, &o), DT_ERR_INVALID, "beta2 = 1 rejected");
    /* grad_scale multiplies the gradient first: scale 2 on g/2 is the plain step */
    c = dt_optim_defaults(DT_OPTIM_SGD, 0.1f);
    float p[2] = { 1.0f, -2.0f }, g[2] = { 0.25f, 0.125f };
    dt_optim_init(&c, ops, 2, &o);
    dt_optim_step(o, p, g, 0.1f, 2.0f);
    ok(p[0] == 0.95f && fabsf(p[1] + 2.025f) < 1e-6f, "grad_scale applied");
    dt_optim_free(o);
    /* the gate (dt_optim_set_gate): 0 leaves parameters and state as they were, 1 steps */
    for (int k = 0; k < DT_OPTIM_COUNT; k++) {
        dt_optim_config gc = dt_optim_defaults((dt_optim_kind)k, 0.1f);
        gc.momentum = k == DT_OPTIM_SGD ? 0.9f : gc.momentum;
        float gp[2] = { 1.0f, -2.0f }, gg[2] = { 0.5f, 0.25f }, gate = 0.0f;
        if (dt_optim_init(&gc, ops, 2, &o) != DT_OK) continue;
        dt_optim_step(o, gp, gg, 0.1f, 1.0f);
        float after1[2] = { gp[0], gp[1] }, st1 = dt_optim_state(o, 0)[0];
        dt_optim_set_gate(o, &gate);
        dt_optim_step(o, gp, gg, 0.1f, 1.0f);
        ok(gp[0] == after1[0] && gp[1] == after1[1] && dt_optim_state(o, 0)[0] == st1,
           "%s: a closed gate leaves the parameters and the state", dt_optim_def_of((dt_optim_kind)k)->name);
        gate = 1.0f;
        dt_optim_step(o, gp, gg, 0.1f, 1.0f);
        ok(gp[0] != after1[0] && gp[1] != after1[1], "%s: an open gate steps",
           dt_optim_def_of((dt_optim_kind)k)->name);
        dt_optim_free(o);
    }
}

/* Every row of the optimizer table is complete, so a half-added optimizer fails here
 * and not at run time. */
static void test_rows(void) {
    for (int k = 0; k < DT_OPTIM_COUNT; k++) {
        const dt_optim_def *d = dt_optim_def_of((dt_optim_kind)k);
        if (!ok(d != NULL, "row %d exists", k)) continue;
        const char *n = d->name ? d->name : "(no name)";
        ok(d->name && d->name[0], "row %d has a name (%s)", k, n);
        ok(d->help && strlen(d->help) > 10 && !strchr(d->help, '\n'), "%s: one-line help", n);
        ok(d->step != NULL, "%s: a step function", n);
        ok(d->check != NULL, "%s: an argument check", n);
        ok(d->nstate >= 0 && d->nstate <= DT_OPTIM_MAX_STATE, "%s: %d state arrays, at most %d", n, d->nstate,
           DT_OPTIM_MAX_STATE);
        int named = 1;
        for (int i = 0; i < d->nstate; i++) named &= d->state_names[i] && d->state_names[i][0];
        for (int i = d->nstate; i < DT_OPTIM_MAX_STATE; i++) named &= d->state_names[i] == NULL;
        ok(named, "%s: a PyTorch name for each of its %d state arrays, none beyond", n, d->nstate);
        is_int(d->defaults.kind, k, "%s: its defaults carry its own kind", n);
        ok(d->train_lr > 0 && d->train_weight_decay >= 0, "%s: dtrain train defaults (lr %g, weight decay %g)", n,
           d->train_lr, d->train_weight_decay);
        ok(dt_optim_find(d->name) == d, "%s: found by its name", n);
        for (int j = 0; j < k; j++)
            ok(strcmp(dt_optim_def_of((dt_optim_kind)j)->name, n) != 0, "%s: name differs from row %d", n, j);
        /* the defaults pass the row's own check, and an optimizer built from them
         * keeps at most nstate arrays, each with its name */
        dt_optim_config c = dt_optim_defaults((dt_optim_kind)k, 0.01f);
        ok(c.kind == (dt_optim_kind)k && c.lr == 0.01f, "%s: dt_optim_defaults sets kind and lr", n);
        dt_optim *o = NULL;
        if (ok(dt_optim_init(&c, ops, 3, &o) == DT_OK, "%s: builds from its defaults", n)) {
            ok(dt_optim_def_in(o) == d, "%s: the optimizer knows its row", n);
            int ns = dt_optim_nstate(o), good = ns >= 0 && ns <= d->nstate;
            for (int i = 0; good && i < ns; i++)
                good = dt_optim_state(o, i) && strcmp(dt_optim_state_name(o, i), d->state_names[i]) == 0;
            ok(good, "%s: %d state arrays named as the row says", n, ns);
            float p[3] = { 1, 2, 3 }, g[3] = { 0.5f, -0.5f, 0.25f };
            ok(dt_optim_step(o, p, g, 0.01f, 1.0f) == DT_OK && p[0] != 1.0f, "%s: a step moves the parameters", n);
            dt_optim_free(o);
        }
    }
    ok(dt_optim_def_of(DT_OPTIM_COUNT) == NULL && dt_optim_def_of((dt_optim_kind)-1) == NULL,
       "no row outside the enum");
    ok(dt_optim_find("lion") == NULL && dt_optim_find(NULL) == NULL, "an unknown name finds no row");
    char names[64];
    is_str(dt_optim_names(names, sizeof names), "sgd, adamw", "the names, for messages");
    char tiny[6];
    is_str(dt_optim_names(tiny, sizeof tiny), "sgd, ", "a short buffer is cut and terminated");
    dt_optim_config bad = dt_optim_defaults(DT_OPTIM_SGD, 0.1f);
    bad.kind = DT_OPTIM_COUNT;
    dt_optim *o = NULL;
    is_int(dt_optim_init(&bad, ops, 2, &o), DT_ERR_INVALID, "an unknown kind is refused");
    /* PyTorch's checks, per row */
    bad = dt_optim_defaults(DT_OPTIM_SGD, 0.1f);
    bad.nesterov = 1;
    is_int(dt_optim_init(&bad, ops, 2, &o), DT_ERR_INVALID, "sgd: nesterov without momentum is refused");
    bad.momentum = 0.9f;
    is_int(dt_optim_init(&bad, ops, 2, &o), DT_OK, "sgd: nesterov with momentum and no dampening is fine");
    dt_optim_free(o);
    bad = dt_optim_defaults(DT_OPTIM_ADAMW, 0.1f);
    bad.eps = -1;
    is_int(dt_optim_init(&bad, ops, 2, &o), DT_ERR_INVALID, "adamw: a negative eps is refused");
    like(dt_last_error(), "adamw: eps", "... naming the row and the field");
    /* every hyper-parameter field is listed once, for checkpoints */
    int nhp;
    const dt_optim_hparam *hp = dt_optim_hparams(&nhp);
    size_t covered = 0;
    for (int i = 0; i < nhp; i++) covered += hp[i].is_int ? sizeof(int) : sizeof(float);
    is_int((long long)(covered + sizeof(dt_optim_kind)), (long long)sizeof(dt_optim_config),
           "the hyper-parameter list covers every field of dt_optim_config but kind");
}

static void test_schedules(void) {
    dt_schedule s = { .kind = DT_SCHED_COSINE, .base_lr = 0.05f, .total_steps = 100 };
    is_int(dt_schedule_check(&s), DT_OK, "cosine schedule valid");
    /* CosineAnnealingLR(T_max=100) stepped per iteration gives these */
    ok(dt_schedule_lr(&s, 0) == 0.05f, "cosine step 0 = base");
    ok(fabsf(dt_schedule_lr(&s, 25) - 0.0426776695f) < 1e-8f, "cosine step 25");
    ok(fabsf(dt_schedule_lr(&s, 50) - 0.025f) < 1e-8f, "cosine step 50 = base/2");
    ok(fabsf(dt_schedule_lr(&s, 99) - 1.2335990856710008e-05f) < 1e-9f, "cosine step 99");
    ok(dt_schedule_lr(&s, 100) == 0.0f && dt_schedule_lr(&s, 150) == 0.0f, "cosine reaches 0 and stays");
    s.min_lr = 0.01f;
    ok(fabsf(dt_schedule_lr(&s, 50) - 0.03f) < 1e-8f, "cosine with eta_min");
    dt_schedule st = { .kind = DT_SCHED_STEP, .base_lr = 0.1f, .step_size = 10, .gamma = 0.5f };
    ok(dt_schedule_lr(&st, 9) == 0.1f && dt_schedule_lr(&st, 10) == 0.05f && dt_schedule_lr(&st, 25) == 0.025f,
       "step schedule halves every 10");
    dt_schedule c = { .kind = DT_SCHED_CONSTANT, .base_lr = 0.1f, .warmup_steps = 5 };
    ok(fabsf(dt_schedule_lr(&c, 0) - 0.02f) < 1e-8f && fabsf(dt_schedule_lr(&c, 2) - 0.06f) < 1e-8f, "warm-up ramps linearly");
    ok(dt_schedule_lr(&c, 4) == 0.1f && dt_schedule_lr(&c, 5) == 0.1f && dt_schedule_lr(&c, 1000) == 0.1f, "warm-up ends at base");
    dt_schedule wc = { .kind = DT_SCHED_COSINE, .base_lr = 0.05f, .total_steps = 105, .warmup_steps = 5 };
    ok(dt_schedule_lr(&wc, 5) == 0.05f && fabsf(dt_schedule_lr(&wc, 55) - 0.025f) < 1e-8f && dt_schedule_lr(&wc, 105) == 0.0f,
       "warm-up then cosine over the remaining steps");
    dt_schedule ws = { .kind = DT_SCHED_STEP, .base_lr = 0.1f, .step_size = 10, .gamma = 0.1f, .warmup_steps = 3 };
    ok(dt_schedule_lr(&ws, 12) == 0.1f && fabsf(dt_schedule_lr(&ws, 13) - 0.01f) < 1e-9f, "warm-up then step");
    dt_schedule bad = { .kind = DT_SCHED_STEP, .base_lr = 0.1f, .step_size = 0, .gamma = 0.5f };
    is_int(dt_schedule_check(&bad), DT_ERR_INVALID, "step size 0 rejected");
    bad = (dt_schedule){ .kind = DT_SCHED_COSINE, .base_lr = 0.1f, .total_steps = 5, .warmup_steps = 5 };
    is_int(dt_schedule_check(&bad), DT_ERR_INVALID, "cosine shorter than warm-up rejected");
    like(dt_last_error(), "total steps (5) must exceed the warm-up steps (5)", "cosine message");
}

static void test_clip(void) {
    float g[2] = { 3.0f, 4.0f }, norm = 0;
    is_int(dt_clip_grad_norm(ops, g, 2, 10.0f, &norm), DT_OK, "clip above the norm");
    ok(norm == 5.0f && g[0] == 3.0f && g[1] == 4.0f, "norm 5, unchanged under max 10");
    is_int(dt_clip_grad_norm(ops, g, 2, 1.0f, &norm), DT_OK, "clip to 1");
    /* torch.nn.utils.clip_grad_norm_ gives [0.599999905, 0.799999833] */
    ok(norm == 5.0f && fabsf(g[0] - 0.599999905f) < 1e-7f && fabsf(g[1] - 0.799999833f) < 1e-7f,
       "scaled by max/(norm + 1e-6): [%.9f, %.9f]", (double)g[0], (double)g[1]);
    dt_clip_grad_norm(ops, g, 2, 0.0f, &norm);
    ok(fabsf(norm - 1.0f) < 1e-6f, "max 0 only measures (%g)", (double)norm);
}

/* ---- training on synthetic separable data --------------------------------------- */

#define NCLS 4
#define NSAMP 256
#define BATCH 32

/* Four classes, each a blob around its own corner of a 1x6x6 image. */
static void make_data(float *x, int32_t *y) {
    for (int i = 0; i < NSAMP; i++) {
        int c = i % NCLS;
        y[i] = c;
        for (int j = 0; j < 36; j++) {
            int r = j / 6, q = j % 6;
            float base = ((r < 3) == (c & 1) && (q < 3) == ((c >> 1) & 1)) ? 1.0f : 0.0f;
            x[i * 36 + j] = base + 0.3f * (2.0f * dt_rng_unit(77, 0, (uint64_t)(i * 36 + j)) - 1.0f);
        }
    }
}

/* Train for `steps` on the data; returns the final parameters (malloc'ed) and the last loss. */
static float *train(const char *spec, int threads, int steps, float *first_loss, float *last_loss) {
    static float x[NSAMP * 36];
    static int32_t y[NSAMP];
    make_data(x, y);
    dt_shape in = { 3, { 1, 6, 6 } };
    dt_model *m = NULL;
    dt_optim *o = NULL;
    if (ops->set_threads(threads) != DT_OK) return NULL;
    if (dt_model_build(spec, &in, ops, 7, BATCH, &m) != DT_OK) { diag("%s", dt_last_error()); return NULL; }
    dt_optim_config cfg = dt_optim_defaults(DT_OPTIM_SGD, 0.05f);
    cfg.momentum = 0.9f;
    cfg.weight_decay = 5e-4f;
    dt_schedule sch = { .kind = DT_SCHED_COSINE, .base_lr = 0.05f, .total_steps = steps, .warmup_steps = 5 };
    dt_optim_init(&cfg, ops, dt_model_nparams(m), &o);
    dt_loss ce = { DT_LOSS_CE, 0.0f };
    float loss = 0, avg = 0;
    for (int s = 0; s < steps; s++) {
        int off = (s * BATCH) % NSAMP;
        dt_status st = dt_model_forward(m, x + off * 36, BATCH, 1, 0, off, NULL);
        if (st == DT_OK) st = dt_model_loss_backward(m, &ce, y + off, BATCH, (float)BATCH, &loss);
        if (st == DT_OK) st = dt_clip_grad_norm(ops, dt_model_grads(m), dt_model_nparams(m), 5.0f, NULL);
        if (st == DT_OK) st = dt_optim_step(o, dt_model_params(m), dt_model_grads(m), dt_schedule_lr(&sch, s), 1.0f);
        if (st != DT_OK) { diag("step %d: %s", s, dt_last_error()); break; }
        if (s == 0) *first_loss = loss;
        if (s >= steps - NSAMP / BATCH) avg += loss / (float)(NSAMP / BATCH);   /* mean over the last epoch */
    }
    *last_loss = avg;
    size_t n = dt_model_nparams(m), nb = dt_model_nbuffers(m);
    float *out = malloc((n + nb) * sizeof(float));
    memcpy(out, dt_model_params(m), n * sizeof(float));
    memcpy(out + n, dt_model_buffers(m), nb * sizeof(float));
    dt_optim_free(o);
    dt_model_free(m);
    ops->set_threads(1);
    return out;
}

static size_t state_bytes(const char *spec) {
    dt_shape in = { 3, { 1, 6, 6 } };
    dt_model *m = NULL;
    dt_model_build(spec, &in, ops, 7, 1, &m);
    size_t n = m ? (dt_model_nparams(m) + dt_model_nbuffers(m)) * sizeof(float) : 0;
    dt_model_free(m);
    return n;
}

static void test_training(void) {
    const char *spec = "conv(8,3,pad=1) bn relu maxpool(2) dropout(0.1) flatten linear(16) relu linear(4)";
    float f1 = 0, l1 = 0, f2 = 0, l2 = 0, f3 = 0, l3 = 0;
    float *a = train(spec, 1, 80, &f1, &l1);
    float *b = train(spec, 1, 80, &f2, &l2);
    float *c = train(spec, 2, 80, &f3, &l3);
    ok(f1 > 1.0f, "initial loss %.3f is that of a guess (ln 4 = 1.386)", (double)f1);
    size_t nb = state_bytes(spec);
    ok(a && l1 < 0.1f, "training reaches mean loss %.4f < 0.1 on separable data", (double)l1);
    ok(a && b && nb && memcmp(a, b, nb) == 0, "two runs give the same parameter bytes");
    if (ops->set_threads(2) == DT_OK) {
        ops->set_threads(1);
        ok(a && c && memcmp(a, c, nb) == 0 && l1 == l3, "1 and 2 threads give the same parameter bytes");
    } else {
        skip(1, "backend cannot use 2 threads (built without OpenMP)");
    }
    free(a); free(b); free(c);
}

/* Decay on chosen runs: each run gets the bits of an optimizer with (or without)
 * weight decay over the whole array, for SGD with momentum and for AdamW. */
static void test_decay_runs(void) {
    enum { N = 1000 };
    for (int k = 0; k < 2; k++) {
        dt_optim_config cfg = dt_optim_defaults(k ? DT_OPTIM_ADAMW : DT_OPTIM_SGD, 0.01f);
        cfg.weight_decay = 0.1f;
        if (!k) cfg.momentum = 0.9f;
        dt_optim_config none = cfg;
        none.weight_decay = 0.0f;
        static float p[3][N], g[N];
        for (int i = 0; i < N; i++) {
            p[0][i] = p[1][i] = p[2][i] = sinf((float)i);
            g[i] = cosf(0.7f * (float)i);
        }
        dt_optim *runs = NULL, *all = NULL, *off = NULL;
        dt_optim_init(&cfg, ops, N, &runs);
        dt_optim_init(&cfg, ops, N, &all);
        dt_optim_init(&none, ops, N, &off);
        size_t bounds[4] = { 0, 300, 301, N };
        unsigned char decay[3] = { 1, 0, 1 };
        is_int(dt_optim_set_decay_runs(runs, bounds, decay, 3), DT_OK, "%s: decay runs accepted", k ? "adamw" : "sgd");
        for (int step = 0; step < 3; step++) {
            dt_optim_step(runs, p[0], g, 0.01f, 1.0f);
            dt_optim_step(all, p[1], g, 0.01f, 1.0f);
            dt_optim_step(off, p[2], g, 0.01f, 1.0f);
        }
        int same = !memcmp(p[0], p[1], 300 * sizeof(float)) && p[0][300] == p[2][300] &&
                   !memcmp(p[0] + 301, p[1] + 301, (N - 301) * sizeof(float)) && p[1][300] != p[2][300];
        ok(same, "%s: decayed runs equal full decay bit for bit, the other run equals no decay", k ? "adamw" : "sgd");
        size_t bad[3] = { 0, 5, N - 1 };
        is_int(dt_optim_set_decay_runs(runs, bad, decay, 2), DT_ERR_INVALID, "runs that do not cover the array are refused");
        dt_optim_free(runs);
        dt_optim_free(all);
        dt_optim_free(off);
    }
}

int main(void) {
    ops = dt_ops_cpu();
    test_decay_runs();
    test_optimizers();
    test_rows();
    test_schedules();
    test_clip();
    test_training();
    return done_testing();
}
