/*
 * rank_tap.h: TAP from a multi-process test driver. Every rank counts the same
 * test points; rank 0 prints each one, the other ranks print only their failures
 * on stderr (and report them through their exit code: nfail).
 *   R, W         this rank and the world size (the driver sets them)
 *   check(cond, "fmt", ...)   one test point
 */
#ifndef DT_RANK_TAP_H
#define DT_RANK_TAP_H

#include <stdarg.h>
#include <stdio.h>

static int R, W, nfail, ntest;

static void check(int cond, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void check(int cond, const char *fmt, ...) {
    ntest++;
    if (!cond) nfail++;
    if (R != 0 && cond) return;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (R == 0) printf("%sok %d - %s\n", cond ? "" : "not ", ntest, msg);
    else fprintf(stderr, "rank %d: not ok - %s\n", R, msg);
    fflush(stdout);
}

#endif /* DT_RANK_TAP_H */
