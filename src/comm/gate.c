/*
 * gate.c: authenticated accepts (see gate.h).
 */
#include "config.h"
#include "gate.h"
#include "clock.h"
#include "sock.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define GATE_SOURCES 8     /* distinct addresses remembered for the report */
#define GATE_GRACE   0.25  /* seconds a client that said HELLO keeps its slot in a flood */

typedef struct { char addr[64]; unsigned long dropped, refused; } source;

struct dt_gate {
    const dt_auth *a;
    unsigned purpose;
    int lfd;
    dt_auth_conn slot[DT_GATE_SLOTS];   /* fd < 0: free */
    pthread_mutex_t mu;                  /* guards the counts (reports may come from other threads) */
    source src[GATE_SOURCES];
    unsigned long dropped, refused;
};

dt_status dt_gate_new(const dt_auth *a, unsigned purpose, int lfd, dt_gate **out) {
    int fl = fcntl(lfd, F_GETFL);
    if (fl < 0 || fcntl(lfd, F_SETFL, fl | O_NONBLOCK) < 0)   /* accepts below never block */
        return dt_error(DT_ERR_IO, "fcntl: %s", strerror(errno));
    dt_gate *g = calloc(1, sizeof *g);
    if (!g) return dt_error(DT_ERR_NOMEM, "out of memory");
    g->a = a;
    g->purpose = purpose;
    g->lfd = lfd;
    for (int i = 0; i < DT_GATE_SLOTS; i++) g->slot[i].fd = -1;
    pthread_mutex_init(&g->mu, NULL);
    *out = g;
    return DT_OK;
}

void dt_gate_free(dt_gate *g) {
    if (!g) return;
    for (int i = 0; i < DT_GATE_SLOTS; i++) if (g->slot[i].fd >= 0) close(g->slot[i].fd);
    pthread_mutex_destroy(&g->mu);
    free(g);
}

/* Close a connection that did not authenticate, and count it by where it came from. */
static void drop(dt_gate *g, dt_auth_conn *c) {
    pthread_mutex_lock(&g->mu);
    int k = 0;
    while (k < GATE_SOURCES && g->src[k].addr[0] && strcmp(g->src[k].addr, c->addr) != 0) k++;
    if (k == GATE_SOURCES) k = GATE_SOURCES - 1;   /* the last entry gathers the rest */
    if (!g->src[k].addr[0]) snprintf(g->src[k].addr, sizeof g->src[k].addr, "%s", c->addr);
    if (c->bad_mac) { g->refused++; g->src[k].refused++; }
    else { g->dropped++; g->src[k].dropped++; }
    pthread_mutex_unlock(&g->mu);
    close(c->fd);
    c->fd = -1;
}

void dt_gate_report(dt_gate *g, char *buf, size_t n) {
    if (!n) return;
    buf[0] = '\0';
    if (!g) return;
    pthread_mutex_lock(&g->mu);
    size_t l = 0;
    for (int k = 0; k < GATE_SOURCES && g->src[k].addr[0] && l + 1 < n; k++) {
        const source *s = &g->src[k];
        if (s->dropped)
            l += (size_t)snprintf(buf + l, n - l, "%s%lu unauthenticated connection%s from %s",
                                  l ? ", " : "; meanwhile ", s->dropped, s->dropped == 1 ? "" : "s", s->addr);
        if (s->refused && l + 1 < n)
            l += (size_t)snprintf(buf + l, n - l, "%s%lu connection%s from %s with a wrong proof of the job secret",
                                  l ? ", " : "; meanwhile ", s->refused, s->refused == 1 ? "" : "s", s->addr);
    }
    if (l && l + 1 < n) snprintf(buf + l, n - l, " %s dropped", g->dropped + g->refused == 1 ? "was" : "were");
    pthread_mutex_unlock(&g->mu);
}

/* The slot a new connection may take: a free one; else the oldest silent one (no HELLO
 * yet: a real client sends it with its connect); else the oldest that has had
 * GATE_GRACE seconds to answer the challenge. -1: none (leave it in the backlog). */
static int room(const dt_gate *g, double now, double *retry) {
    int k = -1;
    for (int i = 0; i < DT_GATE_SLOTS; i++) {
        const dt_auth_conn *c = &g->slot[i];
        if (c->fd < 0) return i;
        double since = c->deadline - DT_AUTH_DEADLINE;
        if (!dt_auth_conn_silent(c) && since + GATE_GRACE > now) {
            if (since + GATE_GRACE < *retry) *retry = since + GATE_GRACE;
            continue;
        }
        if (k < 0) { k = i; continue; }
        const dt_auth_conn *b = &g->slot[k];
        int cs = dt_auth_conn_silent(c), bs = dt_auth_conn_silent(b);
        if (cs > bs || (cs == bs && c->deadline < b->deadline)) k = i;
    }
    return k;
}

/* Take one connection off the listening socket into slot k and answer its HELLO if it
 * is there. 0 when there was nothing to take. */
static int take(dt_gate *g, int k, double now) {
    int fd = accept4(g->lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) return 0;
    if (g->slot[k].fd >= 0) drop(g, &g->slot[k]);
    dt_auth_conn_start(&g->slot[k], fd, now);
    if (dt_auth_conn_step(g->a, &g->slot[k], g->purpose) < 0) drop(g, &g->slot[k]);
    return 1;
}

int dt_gate_pollfds(const dt_gate *g, struct pollfd *pf, int max) {
    int n = 0;
    if (n < max) pf[n++] = (struct pollfd){ .fd = g->lfd, .events = POLLIN };
    for (int i = 0; i < DT_GATE_SLOTS && n < max; i++)
        if (g->slot[i].fd >= 0) pf[n++] = (struct pollfd){ .fd = g->slot[i].fd, .events = POLLIN };
    return n;
}

dt_status dt_gate_accept(dt_gate *g, double deadline, int wake_fd, int *out) {
    for (int first = 1;; first = 0) {
        double now = dt_now();
        struct pollfd pf[2 + DT_GATE_SLOTS];
        int idx[DT_GATE_SLOTS], np = 0, ns = 0;
        double next = deadline;
        for (int i = 0; i < DT_GATE_SLOTS; i++) {
            dt_auth_conn *c = &g->slot[i];
            if (c->fd < 0) continue;
            if (c->deadline <= now) { drop(g, c); continue; }
            if (c->deadline < next) next = c->deadline;
            idx[ns++] = i;
        }
        /* past the deadline, one look at what is already there */
        if (now >= deadline && !first)
            return dt_error(DT_ERR_TIMEOUT, "no authenticated connection arrived before the deadline");
        int free_slot = room(g, now, &next);
        pf[np++] = (struct pollfd){ .fd = free_slot >= 0 ? g->lfd : -1, .events = POLLIN };
        pf[np++] = (struct pollfd){ .fd = wake_fd, .events = POLLIN };   /* fd -1 is ignored by poll */
        for (int j = 0; j < ns; j++) pf[np++] = (struct pollfd){ .fd = g->slot[idx[j]].fd, .events = POLLIN };
        double wait = next - now;
        int ms = wait <= 0 ? 0 : wait > 1.0 ? 1000 : (int)(wait * 1000) + 1;
        int pr = poll(pf, (nfds_t)np, ms);
        if (pr < 0 && errno != EINTR) return dt_error(DT_ERR_IO, "poll: %s", strerror(errno));
        if (pr <= 0) continue;
        if (pf[1].revents) return dt_error(DT_ERR_STOPPED, "stopped");
        now = dt_now();
        for (int j = 0; j < ns; j++) {
            if (!pf[2 + j].revents) continue;
            dt_auth_conn *c = &g->slot[idx[j]];
            int r = dt_auth_conn_step(g->a, c, g->purpose);
            if (r < 0) { drop(g, c); continue; }
            if (r == 0) continue;
            int fd = c->fd, fl = fcntl(fd, F_GETFL);
            c->fd = -1;
            if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) < 0) { close(fd); continue; }
            dt_sock_tune(fd);
            *out = fd;
            return DT_OK;
        }
        /* new connections after the pending ones had their turn: a burst cannot evict
         * a client whose answer is already waiting */
        for (int k = 0; pf[0].revents && k < DT_GATE_SLOTS; k++) {
            int slot = room(g, now, &next);
            if (slot < 0 || !take(g, slot, now)) break;
        }
    }
}
