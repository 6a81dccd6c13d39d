/*
 * clock.h: the one clock dtrain measures time and deadlines with.
 *
 * Seconds as a double on CLOCK_MONOTONIC: it never jumps when the wall clock is
 * set, so a timeout or a step time cannot go negative or fire early, and a double
 * keeps sub-microsecond resolution for years of uptime. The library (trainer,
 * loader, DDP, comm deadlines) and the programs (dtrun, dtbench, dtrain check)
 * all read this one function; dtrun, which does not link libdtrain, compiles
 * clock.c itself.
 */
#ifndef DT_CLOCK_H
#define DT_CLOCK_H

/* The time now in seconds on the monotonic clock (an arbitrary origin: only
 * differences and deadlines mean anything). */
double dt_now(void);

#endif /* DT_CLOCK_H */
