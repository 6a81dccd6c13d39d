/*
 * gate.c: authenticated accepts (see gate.h).
 *
 * Each wakeup takes every connection the kernel has queued (up to DT_GATE_SLOTS), so
 * the listening socket's backlog stays short however fast connections arrive, and a
 * real client's connection is answered within a round trip instead of waiting behind
 * a thousand strangers (a backlog of 1024 drained 256 a second kept a rank waiting 4 s
 * a try). With every slot taken, a newcomer evicts the oldest pending connection of
 * the source address holding the most slots: a HELLO costs nothing to send and earns
 * nothing, and a flood from other addresses cannot evict a rank's one connection.
 */
#include "config.h"
#include "gate.h"
#include "clock.h"
#include "sock.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define GATE_SOURCES 8      /* distinct addresses remembered for the report */
#define GATE_PAUSE   0.01   /* seconds the gate stops accepting when the process is out of descriptors */

typedef struct { char addr[64]; unsigned long dropped, refused; } source;
/* a source address (an IPv6 /64: what one host is given) and how many slots it holds */
typedef struct { unsigned char key[16]; int n; } holder;

struct dt_gate {
    const dt_auth *a;
    unsigned purpose;
    int lfd;
    dt_auth_conn slot[DT_GATE_SLOTS];   /* fd < 0: free */
    short who[DT_GATE_SLOTS];           /* its holder; -1 once authenticated */
    holder held[DT_GATE_SLOTS];         /* n == 0: unused */
    int used, ready;                    /* slots taken; of them, authenticated and not yet handed out */
    double pause_until;                 /* out of descriptors: no accepts before this dt_now() time */
    pthread_mutex_t mu;                 /* guards the counts (reports may come from other threads) */
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
    for (int i = 0; i < DT_GATE_SLOTS; i++) { g->slot[i].fd = -1; g->who[i] = -1; }
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

static void source_key(const struct sockaddr_storage *ss, unsigned char key[16]) {
    memset(key, 0, 16);
    if (ss->ss_family == AF_INET) {
        memcpy(key, &((const struct sockaddr_in *)ss)->sin_addr, 4);
    } else if (ss->ss_family == AF_INET6) {
        memcpy(key, &((const struct sockaddr_in6 *)ss)->sin6_addr, 8);
        key[15] = 6;
    }
}

/* Slot k is no longer pending: its source holds one slot less. */
static void unhold(dt_gate *g, int k) {
    if (g->who[k] >= 0) g->held[g->who[k]].n--;
    g->who[k] = -1;
}

static void release(dt_gate *g, int k) {
    unhold(g, k);
    g->slot[k].fd = -1;
    g->used--;
}

/* Close slot k, which did not authenticate, and count it by where it came from (not a
 * client that had given up before it was answered: that is often a rank retrying). */
static void drop(dt_gate *g, int k) {
    dt_auth_conn *c = &g->slot[k];
    if (!c->gone) {
        pthread_mutex_lock(&g->mu);
        int i = 0;
        while (i < GATE_SOURCES && g->src[i].addr[0] && strcmp(g->src[i].addr, c->addr) != 0) i++;
        if (i == GATE_SOURCES) i = GATE_SOURCES - 1;   /* the last entry gathers the rest */
        if (!g->src[i].addr[0]) {   /* both are char[64] */
            memcpy(g->src[i].addr, c->addr, sizeof g->src[i].addr);
            g->src[i].addr[sizeof g->src[i].addr - 1] = '\0';
        }
        if (c->bad_mac) { g->refused++; g->src[i].refused++; }
        else { g->dropped++; g->src[i].dropped++; }
        pthread_mutex_unlock(&g->mu);
    }
    close(c->fd);
    release(g, k);
}

/* Slot k proved the secret: it waits to be handed out. */
static void authenticated(dt_gate *g, int k) {
    unhold(g, k);
    g->ready++;
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

/* The pending slot to give up for a newcomer: the oldest of the source that holds the
 * most. -1: none (every slot is authenticated and waiting to be handed out). */
static int victim(const dt_gate *g) {
    int h = -1;
    for (int i = 0; i < DT_GATE_SLOTS; i++)
        if (g->held[i].n > 0 && (h < 0 || g->held[i].n > g->held[h].n)) h = i;
    int k = -1;
    for (int i = 0; h >= 0 && i < DT_GATE_SLOTS; i++)
        if (g->slot[i].fd >= 0 && g->who[i] == h && (k < 0 || g->slot[i].since < g->slot[k].since)) k = i;
    return k;
}

/* Free a slot (all are taken). A victim whose proof is already waiting is not dropped
 * but authenticated, and another is chosen. -1 when there is none to give up. */
static int make_room(dt_gate *g) {
    for (;;) {
        int k = victim(g);
        if (k < 0) return -1;
        dt_auth_conn *c = &g->slot[k];
        int r = dt_auth_conn_silent(c) ? 0 : dt_auth_conn_step(g->a, c, g->purpose);
        if (r == 1) { authenticated(g, k); continue; }
        drop(g, k);
        return k;
    }
}

/* Take one connection off the listening socket and answer its HELLO if it is there.
 * 1: one was taken (or had vanished), 0: none was queued, -1: no descriptor left. */
static int take(dt_gate *g) {
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    int fd = accept4(g->lfd, (struct sockaddr *)&ss, &sl, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0 && (errno == EMFILE || errno == ENFILE) && g->used > g->ready && make_room(g) >= 0) {
        sl = sizeof ss;
        fd = accept4(g->lfd, (struct sockaddr *)&ss, &sl, SOCK_CLOEXEC | SOCK_NONBLOCK);
    }
    if (fd < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) return -1;
        return 1;   /* ECONNABORTED, EINTR, a network error on that one: the next */
    }
    int k = -1;
    if (g->used < DT_GATE_SLOTS) {
        for (k = 0; g->slot[k].fd >= 0; k++) {}
    } else if ((k = make_room(g)) < 0) {
        close(fd);   /* every slot holds a proven client not yet handed out */
        return 1;
    }
    unsigned char key[16];
    source_key(&ss, key);
    int h = -1, fresh = -1;
    for (int i = 0; i < DT_GATE_SLOTS && h < 0; i++) {
        if (g->held[i].n == 0) { if (fresh < 0) fresh = i; continue; }
        if (memcmp(g->held[i].key, key, sizeof key) == 0) h = i;
    }
    if (h < 0) { h = fresh; memcpy(g->held[h].key, key, sizeof key); }   /* fewer holders than slots: there is one */
    g->held[h].n++;
    g->who[k] = (short)h;
    g->used++;
    dt_auth_conn *c = &g->slot[k];
    dt_auth_conn_start(c, fd, dt_now());
    int r = dt_auth_conn_step(g->a, c, g->purpose);
    if (r < 0) drop(g, k);
    else if (r == 1) authenticated(g, k);
    return 1;
}

int dt_gate_pollfds(const dt_gate *g, struct pollfd *pf, int max) {
    int n = 0;
    if (n < max) pf[n++] = (struct pollfd){ .fd = g->lfd, .events = POLLIN };
    for (int i = 0; i < DT_GATE_SLOTS && n < max; i++)
        if (g->slot[i].fd >= 0 && g->who[i] >= 0) pf[n++] = (struct pollfd){ .fd = g->slot[i].fd, .events = POLLIN };
    return n;
}

/* Hand out an authenticated slot: its socket, blocking and tuned. 0 if it could not be. */
static int hand_out(dt_gate *g, int *out) {
    int k = 0;
    while (g->slot[k].fd < 0 || g->who[k] >= 0) k++;
    int fd = g->slot[k].fd, fl = fcntl(fd, F_GETFL);
    release(g, k);
    g->ready--;
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) < 0) { close(fd); return 0; }
    dt_sock_tune(fd);
    *out = fd;
    return 1;
}

dt_status dt_gate_accept(dt_gate *g, double deadline, int wake_fd, int *out) {
    for (int first = 1;; first = 0) {
        double now = dt_now();
        struct pollfd pf[2 + DT_GATE_SLOTS];
        int idx[DT_GATE_SLOTS], np = 0, ns = 0;
        double next = deadline;
        for (int i = 0; i < DT_GATE_SLOTS; i++) {
            dt_auth_conn *c = &g->slot[i];
            if (c->fd < 0 || g->who[i] < 0) continue;
            if (c->deadline <= now) { drop(g, i); continue; }
            if (c->deadline < next) next = c->deadline;
            idx[ns++] = i;
        }
        while (g->ready) if (hand_out(g, out)) return DT_OK;
        /* past the deadline, one look at what is already there */
        if (now >= deadline && !first)
            return dt_error(DT_ERR_TIMEOUT, "no authenticated connection arrived before the deadline");
        int paused = now < g->pause_until;
        if (paused && g->pause_until < next) next = g->pause_until;
        pf[np++] = (struct pollfd){ .fd = paused ? -1 : g->lfd, .events = POLLIN };
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
            int k = idx[j];
            int r = dt_auth_conn_step(g->a, &g->slot[k], g->purpose);
            if (r < 0) drop(g, k);
            else if (r == 1) authenticated(g, k);
        }
        /* then everything queued: the pending ones had their turn first, so a burst
         * cannot evict a client whose answer is already waiting */
        for (int n = 0; pf[0].revents && n < DT_GATE_SLOTS; n++) {
            int t = take(g);
            if (t < 0) g->pause_until = now + GATE_PAUSE;
            if (t <= 0) break;
        }
    }
}
