/*
 * gate.h: a listening socket that hands out authenticated connections only.
 *
 * The store and every rank's peer port accept through a gate. It runs the exchange of
 * auth.h on up to DT_GATE_SLOTS connections at once, taking every queued connection
 * each time it wakes, so the kernel's backlog stays short whatever the rate of
 * arrivals; a client has DT_AUTH_STEP seconds for its HELLO and again for its proof.
 * When every slot is taken, a newcomer takes the place of the oldest pending connection
 * of the source address that holds the most slots: a flood of silent connections or of
 * HELLOs (which need no secret) from other addresses cannot evict a real client, and
 * one from the client's own address leaves it DT_GATE_SLOTS / rate seconds for a round
 * trip (50 ms at 5,000 connections a second). Nothing a client sends is read before it
 * has proved the secret, and then only what the caller reads. The gate counts the
 * connections it dropped and where they came from, so a job that fails during a flood
 * says "N unauthenticated connections from HOST" instead of blaming an innocent rank.
 */
#ifndef DT_GATE_H
#define DT_GATE_H

#include "auth.h"
#include "status.h"
#include <poll.h>

#define DT_GATE_SLOTS 256

typedef struct dt_gate dt_gate;

/* Serve lfd (a listening socket, kept by the caller; made non-blocking) for purpose. a must outlive the gate. */
dt_status dt_gate_new(const dt_auth *a, unsigned purpose, int lfd, dt_gate **out);
/* The next authenticated connection (a blocking, tuned socket) before the absolute
 * deadline: DT_ERR_TIMEOUT after it (a deadline already past still takes one look at
 * what is there, for callers with their own poll loop). When wake_fd (>= 0) becomes
 * readable: DT_ERR_STOPPED. */
dt_status dt_gate_accept(dt_gate *g, double deadline, int wake_fd, int *fd);
/* The descriptors the gate waits on (the listening socket and the pending ones), for
 * a caller's own poll: when one is ready, call dt_gate_accept with a past deadline.
 * Returns how many were written (at most max). */
int       dt_gate_pollfds(const dt_gate *g, struct pollfd *pf, int max);
/* What the gate refused so far, for error messages: "" or, for example,
 * "; meanwhile 1100 unauthenticated connections from 127.0.0.1 were dropped". */
void      dt_gate_report(dt_gate *g, char *buf, size_t n);
/* Closes the pending connections (not lfd). NULL is fine. */
void      dt_gate_free(dt_gate *g);

#endif /* DT_GATE_H */
