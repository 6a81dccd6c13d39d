/*
 * clock.c: dt_now(), the monotonic clock of clock.h.
 */
#include "clock.h"

#include <time.h>

double dt_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
