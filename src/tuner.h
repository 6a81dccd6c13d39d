/*
 * tuner.h: the compute thread count, adapted to the cores a process actually gets
 * (not installed).
 *
 * A process of N compute threads whose cores are shared with other work (a browser, a
 * compile, another job) runs every parallel region at the pace of its slowest thread:
 * a thread that waits for a core holds the others at every join, and OpenMP's waiting
 * threads spin on the cores the other work needs. On 2 cores with one busy process
 * beside it, the mlp ran at 0.53x on 2 threads what it ran on 1.
 *
 * The tuner watches each step and moves the count between 1 and N. It tries another
 * count only when a sign says that one might pay, and keeps it only when the steps
 * say it does:
 *   - fewer: the process ran on fewer cores than it has threads (its CPU time over the
 *     wall time of the last steps is below n - 0.4: a thread waited for a core);
 *   - more: cores it may run on stood idle (from /proc/stat, the CPUs of its affinity
 *     mask: at least 0.6 of a core idle over the last steps); where /proc/stat cannot
 *     be read, now and then.
 * A trial runs 1 step to settle and 4 measured steps at the other count; it is kept
 * when their mean step time is at least 5% below the mean of the last 8 steps at the
 * current count (each mean without its largest step; before the first trial 4 steps
 * will do, so a run that starts beside a busy process moves early; the first step of
 * all, which warms up, is left out). A trial that does not pay makes
 * the wait before the next one 1.5 times longer (16 steps at first, at most 512):
 * conditions change, and a trial costs 5 steps. Thread counts never change results (docs/DESIGN.md
 * rule 2: fixed blocks, whichever thread runs them), so neither does the tuner.
 */
#ifndef DT_TUNER_H
#define DT_TUNER_H

#include "ops.h"

typedef struct dt_tuner dt_tuner;

/* A tuner of ops's compute threads between 1 and ops->threads() (its count now); NULL
 * in *out (and DT_OK) when there is nothing to tune: one thread. */
dt_status dt_tuner_new(const dt_ops *ops, dt_tuner **out);
void      dt_tuner_free(dt_tuner *t);   /* sets the count back to where it began; NULL is fine */
/* After each training step of `seconds` (wall time, data wait included): may change the
 * thread count for the next step. *changed (may be NULL) is set to the new count when it
 * changed and to 0 otherwise. NULL is fine. */
dt_status dt_tuner_step(dt_tuner *t, double seconds, int *changed);
int       dt_tuner_threads(const dt_tuner *t);     /* the count of the next step */
double    dt_tuner_mean(const dt_tuner *t);        /* threads per step, averaged over the steps so far */
int       dt_tuner_changes(const dt_tuner *t);     /* counts kept after a trial so far */

/* For tests: the clocks the tuner reads, in seconds: wall time, this process's CPU time
 * (all its threads), and the idle time of the CPUs it may run on (< 0: unknown). NULL
 * puts back the system's (dt_now, CLOCK_PROCESS_CPUTIME_ID, /proc/stat). A new window
 * of steps begins. */
typedef struct {
    double (*wall)(void *ctx);
    double (*cpu)(void *ctx);
    double (*idle)(void *ctx);
    void   *ctx;
} dt_tuner_clocks;
void dt_tuner_set_clocks(dt_tuner *t, const dt_tuner_clocks *c);

#endif /* DT_TUNER_H */
