/*
 * tuner.c: the compute thread count, adapted to the cores a process gets (tuner.h).
 *
 * States: steady at n threads, or trying `trial` threads (1 step to settle, then
 * TRIAL_STEPS measured). The signs that start a trial are read over a window of at
 * least WINDOW_STEPS steady steps and WINDOW_S seconds.
 */
#define _GNU_SOURCE
#include "tuner.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "testing.h"

#define RING          8      /* steady steps the trial is compared against */
#define RING_MIN      4      /* fewer will do for the first trial (the mean of those there are) */
#define TRIAL_STEPS   4      /* measured steps of a trial */
#define WINDOW_STEPS  4
#define WINDOW_S      0.2
#define COOL_MIN      16     /* steps between trials, x1.5 after a trial that did not pay */
#define COOL_MAX      512
#define GAIN          0.95   /* a trial is kept when its mean is below GAIN x the steady one */
#define SHORT_CORES   0.4    /* fewer: CPU time / wall below n - this */
#define IDLE_CORES    0.6    /* more: idle cores of the affinity mask at least this */

struct dt_tuner {
    const dt_ops *ops;
    int     max, start, n;        /* most threads, the count it began with, the count now */
    int     trial;                /* the count tried, 0 when steady */
    int     trial_done;           /* steps of the trial so far (the first settles) */
    double  trial_t[TRIAL_STEPS];
    double  ring[RING];           /* the last steady step times at n */
    int     ring_n;               /* steady steps at n since the last change (the ring holds min(RING, this)) */
    int64_t since;                /* steps since the last trial ended (or the start) */
    int64_t cool;                 /* steps to wait after a trial before the next */
    int64_t steps;
    double  thread_steps;         /* sum over steps of the count */
    int     changes;
    int     tried;                /* a trial has begun */
    /* the window: wall, process CPU and idle CPU seconds at its start */
    int     win_steps;
    double  win_wall, win_cpu, win_idle;
    int     have_idle;            /* idle time readable (/proc/stat) */
    cpu_set_t mask;               /* the CPUs this process may run on */
    dt_tuner_clocks clk;          /* the system's, or a test's */
};

static double cpu_seconds(void *ctx) {
    (void)ctx;
    struct timespec ts;
    if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts) != 0) return 0.0;
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double wall_seconds(void *ctx) {
    (void)ctx;
    return dt_now();
}

/* Idle (and I/O wait) seconds of the CPUs in the tuner's mask since boot; < 0 when
 * /proc/stat cannot be read. */
static double idle_seconds(void *ctx) {
    const cpu_set_t *mask = &((const dt_tuner *)ctx)->mask;
    FILE *f = fopen("/proc/stat", "r");
    if (!f) return -1.0;
    long hz = sysconf(_SC_CLK_TCK);
    char line[512];
    double idle = 0.0;
    int seen = 0;
    while (fgets(line, sizeof line, f)) {
        int cpu;
        unsigned long long user, nice, sys, idl, iow;
        if (strncmp(line, "cpu", 3) != 0) {
            if (seen) break;   /* the cpu lines come first */
            continue;
        }
        if (sscanf(line, "cpu%d %llu %llu %llu %llu %llu", &cpu, &user, &nice, &sys, &idl, &iow) != 6) continue;
        seen = 1;
        if (cpu >= 0 && cpu < CPU_SETSIZE && CPU_ISSET(cpu, mask)) idle += (double)(idl + iow);
    }
    fclose(f);
    return seen && hz > 0 ? idle / (double)hz : -1.0;
}

static void window_start(dt_tuner *t) {
    t->win_steps = 0;
    t->win_wall = t->clk.wall(t->clk.ctx);
    t->win_cpu = t->clk.cpu(t->clk.ctx);
    if (t->have_idle) t->win_idle = t->clk.idle(t->clk.ctx);
}

/* The mean of v[0..n) without its largest value: throughput is a mean, and under
 * contention step times come in two kinds (a thread preempted or not) that a median
 * would choose between; one stray step (a page fault storm) is left out. */
static double trimmed_mean(const double *v, int n) {
    double sum = 0.0, max = v[0];
    for (int i = 0; i < n; i++) {
        sum += v[i];
        if (v[i] > max) max = v[i];
    }
    return (sum - max) / (double)(n - 1);
}

dt_status dt_tuner_new(const dt_ops *ops, dt_tuner **out) {
    *out = NULL;
    int n = ops->threads();
    if (n <= 1) return DT_OK;
    dt_tuner *t = calloc(1, sizeof *t);
    if (!t) return dt_error(DT_ERR_NOMEM, "threads: out of memory");
    t->ops = ops;
    t->max = t->start = t->n = n;
    t->cool = t->since = COOL_MIN;   /* the first trial as soon as a window says so */
    if (sched_getaffinity(0, sizeof t->mask, &t->mask) != 0) {
        CPU_ZERO(&t->mask);
        for (int c = 0; c < CPU_SETSIZE; c++) CPU_SET(c, &t->mask);
    }
    dt_tuner_set_clocks(t, NULL);
    *out = t;
    return DT_OK;
}

void dt_tuner_set_clocks(dt_tuner *t, const dt_tuner_clocks *c) {
    if (c) t->clk = *c;
    else t->clk = (dt_tuner_clocks){.wall = wall_seconds, .cpu = cpu_seconds, .idle = idle_seconds, .ctx = t};
    t->have_idle = t->clk.idle(t->clk.ctx) >= 0.0;
    window_start(t);
}

void dt_tuner_free(dt_tuner *t) {
    if (!t) return;
    if (t->n != t->start) (void)t->ops->set_threads(t->start);
    free(t);
}

int    dt_tuner_threads(const dt_tuner *t) { return t ? (t->trial ? t->trial : t->n) : 0; }
double dt_tuner_mean(const dt_tuner *t) { return t && t->steps ? t->thread_steps / (double)t->steps : 0.0; }
int    dt_tuner_changes(const dt_tuner *t) { return t ? t->changes : 0; }

static dt_status begin_trial(dt_tuner *t, int count) {
    DT_TRY(t->ops->set_threads(count));
    t->trial = count;
    t->trial_done = 0;
    t->tried = 1;
    return DT_OK;
}

/* The trial's last step is in: keep its count or go back. */
static dt_status end_trial(dt_tuner *t, int *changed) {
    int ring = t->ring_n < RING ? t->ring_n : RING;
    int keep = trimmed_mean(t->trial_t, TRIAL_STEPS) < GAIN * trimmed_mean(t->ring, ring);
    if (keep) {
        t->n = t->trial;
        t->ring_n = 0;
        t->cool = COOL_MIN;
        t->changes++;
        if (changed) *changed = t->n;
    } else {
        DT_TRY(t->ops->set_threads(t->n));
        t->cool = t->cool * 3 / 2 > COOL_MAX ? COOL_MAX : t->cool * 3 / 2;
    }
    t->trial = 0;
    t->since = 0;
    window_start(t);
    return DT_OK;
}

/* A steady step is in: when the window is long enough, read the signs and perhaps
 * begin a trial. */
static dt_status steady(dt_tuner *t) {
    double wall = t->clk.wall(t->clk.ctx) - t->win_wall;
    if (++t->win_steps < WINDOW_STEPS || wall < WINDOW_S) return DT_OK;
    double cores = (t->clk.cpu(t->clk.ctx) - t->win_cpu) / wall;
    double idle = -1.0;
    if (t->have_idle) {
        double i = t->clk.idle(t->clk.ctx);
        idle = i >= 0.0 ? (i - t->win_idle) / wall : -1.0;
    }
    window_start(t);
    if (t->ring_n < (t->tried ? RING : RING_MIN) || t->since < t->cool) return DT_OK;
    if (t->n > 1 && cores < (double)t->n - SHORT_CORES) return begin_trial(t, t->n - 1);
    if (t->n < t->max && (idle >= IDLE_CORES || !t->have_idle)) return begin_trial(t, t->n + 1);
    return DT_OK;
}

dt_status dt_tuner_step(dt_tuner *t, double seconds, int *changed) {
    if (changed) *changed = 0;
    if (!t) return DT_OK;
    t->steps++;
    t->thread_steps += t->trial ? t->trial : t->n;
    if (dt_testing_fault() == DT_FAULT_THREADS_FLIP) {   /* testing.h: every count in turn */
        t->n = (int)(t->steps % t->max) + 1;
        if (changed) *changed = t->n;
        return t->ops->set_threads(t->n);
    }
    if (t->trial) {
        if (t->trial_done++ > 0) t->trial_t[t->trial_done - 2] = seconds;   /* the first step settles */
        return t->trial_done == TRIAL_STEPS + 1 ? end_trial(t, changed) : DT_OK;
    }
    if (t->steps == 1) {   /* the first step warms up (pages touched, the team started): left out */
        window_start(t);
        return DT_OK;
    }
    t->since++;
    t->ring[t->ring_n++ % RING] = seconds;
    if (t->ring_n > 1000000) t->ring_n = RING + t->ring_n % RING;   /* keep the slot order */
    return steady(t);
}
