/*
 * test_tuner.c: the compute thread tuner (tuner.h) against a simulated machine.
 *
 * A fake device keeps the thread count; fake clocks say how many cores the process ran
 * on and how many stood idle; each step's time is a function of the count the tuner
 * set. Checked: nothing to tune at one thread; an idle machine never sees a trial; a
 * busy core moves 2 threads to 1 and idle cores move it back; with long steps the first
 * trial runs steps 6-10 and is kept; a sign that lies (few
 * cores, but fewer threads are slower) costs trials that back off (at most 2% of the
 * steps) and never a change;
 * 4 threads on 2.2 free cores settle at 2; one slow outlier step does not decide a
 * trial; steps that alternate fast and slow under contention are judged by their mean; without idle figures the tuner still climbs back, less often; free restores the
 * count it began with; the planted "threads-flip" visits every count.
 */
#include <stdio.h>
#include <string.h>

#include "tap.h"
#include "testing.h"
#include "tuner.h"

static int g_threads, g_sets;

static dt_status fake_set_threads(int n) {
    g_threads = n;
    g_sets++;
    return DT_OK;
}
static int fake_threads(void) { return g_threads; }

/* The simulated machine: `cores` of CPU the process gets while it runs (at most its
 * threads), `idle` cores idle beside it, and the step time of n threads. */
typedef struct {
    double wall, cpu, idle_s;
    double cores, idle;            /* idle < 0: unknown */
    double (*step_time)(int n, void *ctx);
    void  *ctx;
} sim;

static double sim_wall(void *c) { return ((sim *)c)->wall; }
static double sim_cpu(void *c) { return ((sim *)c)->cpu; }
static double sim_idle(void *c) { return ((sim *)c)->idle < 0 ? -1.0 : ((sim *)c)->idle_s; }

static dt_ops g_ops;

static dt_tuner *new_tuner(int n, sim *m) {
    g_threads = n;
    g_sets = 0;
    dt_tuner *t = NULL;
    dt_status s = dt_tuner_new(&g_ops, &t);
    if (s != DT_OK || !t) return NULL;
    dt_tuner_clocks c = {.wall = sim_wall, .cpu = sim_cpu, .idle = sim_idle, .ctx = m};
    dt_tuner_set_clocks(t, &c);
    return t;
}

/* Run `steps` steps; returns the step at which the count first became `want` (-1: never). */
static int run(dt_tuner *t, sim *m, int steps, int want) {
    int at = -1;
    for (int i = 0; i < steps; i++) {
        int n = dt_tuner_threads(t);
        if (n != g_threads) return -2;   /* the tuner's count is the device's */
        double dt = m->step_time(n, m->ctx);
        double busy = m->cores < n ? m->cores : (double)n;
        m->wall += dt;
        m->cpu += busy * dt;
        if (m->idle > 0) m->idle_s += m->idle * dt;
        if (dt_tuner_step(t, dt, NULL) != DT_OK) return -3;
        if (at < 0 && dt_tuner_threads(t) == want) at = i + 1;
    }
    return at;
}

/* step times: table[n] seconds at n threads */
static double table_time(int n, void *ctx) { return ((const double *)ctx)[n]; }

static void test_nothing_to_tune(void) {
    g_threads = 1;
    dt_tuner *t = (dt_tuner *)&g_ops;
    ok(dt_tuner_new(&g_ops, &t) == DT_OK && t == NULL, "one thread: no tuner");
    ok(dt_tuner_step(NULL, 0.1, NULL) == DT_OK && dt_tuner_threads(NULL) == 0, "a NULL tuner steps and has no count");
    dt_tuner_free(NULL);
}

static void test_idle(void) {
    double tt[3] = {0, 0.020, 0.010};
    sim m = {.cores = 2.0, .idle = 0.0, .step_time = table_time, .ctx = tt};
    dt_tuner *t = new_tuner(2, &m);
    int r = run(t, &m, 3000, 1);
    ok(r == -1 && g_sets == 0, "idle machine: no trial in 3000 steps (set_threads called %d times)", g_sets);
    ok(dt_tuner_mean(t) == 2.0 && dt_tuner_changes(t) == 0, "idle machine: 2 threads at every step");
    dt_tuner_free(t);
}

static void test_busy_and_back(void) {
    double busy[3] = {0, 0.012, 0.020};   /* a busy loop on one core: 2 threads are slower */
    sim m = {.cores = 1.3, .idle = 0.0, .step_time = table_time, .ctx = busy};
    dt_tuner *t = new_tuner(2, &m);
    int r = run(t, &m, 200, 1);
    ok(r >= 5 && r <= 20, "a busy core: 2 -> 1 thread after %d steps (5 to 20)", r);
    ok(dt_tuner_threads(t) == 1 && dt_tuner_changes(t) == 1, "stays at 1 while the core is busy");
    int sets = g_sets;
    run(t, &m, 2000, 2);
    ok(dt_tuner_threads(t) == 1 && g_sets == sets, "no idle core: no trial of 2 threads in 2000 steps");
    double free_[3] = {0, 0.012, 0.006};   /* the busy loop ended */
    m.ctx = free_;
    m.cores = 2.0;
    m.idle = 0.9;   /* at 1 thread, the other core idles */
    r = run(t, &m, 200, 2);
    ok(r >= 5 && r <= 40, "cores idle again: back to 2 threads after %d steps", r);
    ok(dt_tuner_changes(t) == 2, "two changes in all");
    m.idle = 0.0;
    sets = g_sets;
    run(t, &m, 2000, 1);
    ok(dt_tuner_threads(t) == 2 && g_sets == sets, "and stays there");
    dt_tuner_free(t);
}

/* steps long enough for the window's 0.2 s: the first trial needs 4 steady steps after
 * the first (which warms up), then 1 to settle and 4 measured */
static void test_busy_first_steps(void) {
    double busy[3] = {0, 0.060, 0.100};
    sim m = {.cores = 1.3, .idle = 0.0, .step_time = table_time, .ctx = busy};
    dt_tuner *t = new_tuner(2, &m);
    int r = run(t, &m, 10, 1);
    is_int(r, 5, "a busy core, 100 ms steps: the trial of 1 thread runs from step 6");
    ok(dt_tuner_threads(t) == 1 && dt_tuner_changes(t) == 1, "and is kept after step 10");
    dt_tuner_free(t);
}

static void test_lying_sign(void) {
    /* the process seems short of cores (it waits for its peers, say), but 1 thread is slower */
    double tt[3] = {0, 0.018, 0.010};
    sim m = {.cores = 1.2, .idle = 0.0, .step_time = table_time, .ctx = tt};
    dt_tuner *t = new_tuner(2, &m);
    int r = run(t, &m, 4000, 1);
    int trials = g_sets / 2;   /* each trial sets 1 and then 2 again */
    ok(r > 0, "a lying sign: a trial of 1 thread (from step %d)", r);
    ok(dt_tuner_threads(t) == 2 && dt_tuner_changes(t) == 0, "never changed");
    ok(trials >= 8 && trials <= 16, "trials back off: %d in 4000 steps (16, 24, 36, ... at most 512 apart)", trials);
    ok(dt_tuner_mean(t) > 1.98, "at 1 thread for %.2f%% of the steps", 100.0 * (2.0 - dt_tuner_mean(t)));
    dt_tuner_free(t);
}

/* 4 threads on a machine with 2.2 cores free: the time of n threads */
static double four_time(int n, void *ctx) {
    (void)ctx;
    double k = n < 2.2 ? (double)n : 2.2;
    return 0.040 / k * (n > 2.2 ? 1.0 + 0.35 * (n - 2.2) : 1.0);
}

static void test_four(void) {
    sim m = {.cores = 2.2, .idle = 0.0, .step_time = four_time};
    dt_tuner *t = new_tuner(4, &m);
    run(t, &m, 3000, 2);
    ok(dt_tuner_threads(t) == 2, "4 threads on 2.2 free cores settle at %d (2)", dt_tuner_threads(t));
    ok(dt_tuner_changes(t) == 2, "through 3: %d changes", dt_tuner_changes(t));
    dt_tuner_free(t);
    is_int(g_threads, 4, "free restores the count it began with");
}

/* a trial whose first measured step is an outlier still decides by the others */
static int g_outlier_at;
static double outlier_time(int n, void *ctx) {
    int *calls = ctx;
    ++*calls;
    if (n == 1 && g_outlier_at == 0) g_outlier_at = *calls + 1;   /* the trial's first measured step */
    if (*calls == g_outlier_at) return 0.5;
    return n == 1 ? 0.012 : 0.020;
}

static void test_outlier(void) {
    int calls = 0;
    g_outlier_at = 0;
    sim m = {.cores = 1.3, .idle = 0.0, .step_time = outlier_time, .ctx = &calls};
    dt_tuner *t = new_tuner(2, &m);
    run(t, &m, 60, 1);
    ok(g_outlier_at > 0 && dt_tuner_threads(t) == 1, "one slow step in a trial: left out, the trial kept");
    dt_tuner_free(t);
}

/* under contention 2 threads alternate fast and slow steps: their mean loses to 1 thread */
static double bimodal_time(int n, void *ctx) {
    int *calls = ctx;
    ++*calls;
    if (n == 1) return 0.016;
    return *calls % 2 ? 0.012 : 0.032;
}

static void test_bimodal(void) {
    int calls = 0;
    sim m = {.cores = 1.3, .idle = 0.0, .step_time = bimodal_time, .ctx = &calls};
    dt_tuner *t = new_tuner(2, &m);
    run(t, &m, 100, 1);
    ok(dt_tuner_threads(t) == 1, "2 threads at 12 and 32 ms in turn lose to 1 thread at 16 ms");
    dt_tuner_free(t);
}

static void test_no_idle_figures(void) {
    double busy[3] = {0, 0.012, 0.020};
    sim m = {.cores = 1.3, .idle = -1.0, .step_time = table_time, .ctx = busy};
    dt_tuner *t = new_tuner(2, &m);
    run(t, &m, 100, 1);
    ok(dt_tuner_threads(t) == 1, "without idle figures: a busy core still moves it to 1");
    int sets = g_sets;
    run(t, &m, 4000, 2);
    int trials = (g_sets - sets) / 2;
    ok(dt_tuner_threads(t) == 1 && trials >= 8 && trials <= 16, "trials of 2 threads back off: %d in 4000 steps",
       trials);
    double free_[3] = {0, 0.012, 0.006};
    m.ctx = free_;
    m.cores = 2.0;
    int r = run(t, &m, 4200, 2);
    ok(r > 0 && dt_tuner_threads(t) == 2, "and climbs back when 2 pay (after %d steps)", r);
    dt_tuner_free(t);
}

static void test_flip(void) {
    ok(dt_testing_set_fault("threads-flip") == DT_OK, "the planted threads-flip is known");
    double tt[4] = {0, 0.01, 0.01, 0.01};
    sim m = {.cores = 3.0, .idle = 0.0, .step_time = table_time, .ctx = tt};
    dt_tuner *t = new_tuner(3, &m);
    int seen[4] = {0};
    for (int i = 0; i < 9; i++) {
        int changed = -1;
        dt_tuner_step(t, 0.01, &changed);
        if (changed >= 1 && changed <= 3 && changed == g_threads) seen[changed]++;
    }
    ok(seen[1] == 3 && seen[2] == 3 && seen[3] == 3, "threads-flip: 1, 2 and 3 threads in turn (%d %d %d)", seen[1],
       seen[2], seen[3]);
    dt_tuner_free(t);
    dt_testing_set_fault(NULL);
}

int main(void) {
    g_ops.name = "fake";
    g_ops.host_memory = 1;
    g_ops.set_threads = fake_set_threads;
    g_ops.threads = fake_threads;
    test_nothing_to_tune();
    test_idle();
    test_busy_and_back();
    test_busy_first_steps();
    test_lying_sign();
    test_four();
    test_outlier();
    test_bimodal();
    test_no_idle_figures();
    test_flip();
    return done_testing();
}
