/*
 * trace.h: a timeline of what each thread of this process did (dtrain train --trace),
 * for the Chrome trace-event format that Perfetto and chrome://tracing load.
 *
 * Spans (name, category, start, end on the monotonic clock of clock.h, a short
 * detail) and counters are recorded from any thread while tracing is on; a thread is
 * named once (dt_trace_thread: "main", "comm", "loader"). dt_trace_json writes this
 * process's records as trace events with pid = its rank, timestamps in microseconds
 * on a clock shifted by `offset` seconds (the trainer measures each rank's offset to
 * rank 0's clock, so that every rank's events share one time line) and relative to
 * `base`. Recording costs a clock read and, for a span, a short critical section; off,
 * a relaxed atomic load.
 */
#ifndef DT_TRACE_H
#define DT_TRACE_H

#include <stddef.h>

#include "status.h"

/* Recording on (from now) or off; records are kept until dt_trace_reset. */
void      dt_trace_enable(int on);
int       dt_trace_on(void);
/* Name the calling thread (a string literal: not copied). */
void      dt_trace_thread(const char *name);
/* A span [t0, t1] (dt_now() seconds) of the calling thread; detail may be NULL. Names
 * and details longer than the record's fields are cut. */
void      dt_trace_span(const char *name, const char *cat, double t0, double t1, const char *detail);
/* The same for a collective that waited wait_s seconds for its peers, longest for rank
 * `peer` (its args carry waited_ms and waited_for; peer < 0: none). */
void      dt_trace_span_wait(const char *name, const char *cat, double t0, double t1, const char *detail,
                             double wait_s, int peer);
/* A counter sample: series `name`, value at t. */
void      dt_trace_counter(const char *name, double t, double value);
/* Device time, where the compute is queued on a device (a GPU) rather than run by the
 * host threads whose clock the spans above read. The backend gives two functions
 * (ops.h: mark, marks_read): `mark` queues a timestamp behind the work queued so far,
 * `read` waits for them and gives each one's seconds from the first. With them set
 * (dt_trace_device; NULL, NULL: none), the thread that queues the work takes a mark where
 * a span of it begins (dt_trace_dev_mark: -1 when off or none) and closes the span with
 * dt_trace_dev_span, which takes the end mark and returns it (the next span may begin
 * there). dt_trace_dev_flush, after a step, reads the marks and records the spans on a
 * thread named "device", placed on the host clock through the last mark, which it takes
 * itself and which completes before the host sees it (at most the synchronisation's
 * latency earlier than placed). Marks a backend cannot queue any more (its list full)
 * are -1 and their spans dropped. */
void      dt_trace_device(dt_status (*mark)(int *id), dt_status (*read)(double *sec, int n));
int       dt_trace_dev_mark(void);
int       dt_trace_dev_span(int begin, const char *name, const char *cat, const char *detail);
dt_status dt_trace_dev_flush(void);
/* This process's records as trace-event JSON objects separated by ",\n" (no enclosing
 * brackets; empty when there are none), with metadata events naming the process
 * "rank R" and its threads; *out is malloc'ed. */
dt_status dt_trace_json(int rank, double base, double offset, char **out, size_t *len);
/* The number of records kept. */
size_t    dt_trace_count(void);
/* Forget every record (tracing stays as it was). */
void      dt_trace_reset(void);

#endif /* DT_TRACE_H */
