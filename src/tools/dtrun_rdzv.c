/*
 * dtrun_rdzv.c: how the dtruns of a multi-node job meet and stay in touch.
 *
 * Node 0's dtrun listens on --master-port; every other dtrun connects (retrying until
 * --rdzv-timeout, saying why it cannot) and keeps that one connection for the whole job.
 * The protocol is text, one message per line:
 *
 *   node -> 0   HELLO 2 <node_rank> <nnodes or MIN:MAX> <nproc> <run_id|-> <host> <port>
 *               (port: elastic, where this node would serve should node 0 be lost; 0: none)
 *   0 -> node   REFUSE <exit> <why>            (and the connection is closed)
 *   0 -> node   LAYOUT <run_id> <host of node 0> <host of node 1> ...
 *   0 -> node   EXACT <the program's answer>   (elastic: the sizes that keep the result exact)
 *   0 -> node   PEERS <n> <node> <address> <port> ...   (elastic, each round and join: the
 *                                               live nodes and where each would serve)
 *   0 -> node   START <attempt> <kind> <restarts> <port> <world> <rank0> <nlocal> <group>
 *                     <ngroups> <change time> <change|->
 *               (kind 0 the first attempt, 1 a restart after a failure, 2 a membership
 *               change; port the ranks' MASTER_PORT; this node runs ranks rank0 ..
 *               rank0+nlocal-1 of world, nlocal 0 on a spare)
 *   node -> 0   FAIL <attempt> <exit> <no_restart> <report>
 *   0 -> node   STOP <exit> <no_restart> <report>   (the job's first failure)
 *   0 -> node   LOST <report>                  (elastic: a node running ranks was lost;
 *                                               kill the ranks now)
 *   0 -> node   DRAIN                          (elastic: the world can grow; SIGTERM the
 *                                               ranks, which checkpoint and exit)
 *   node -> 0   IDLE <attempt> <status>        (every local rank of the attempt ended; the
 *                                               status they all exited with, -1 if not one,
 *                                               -2 on a spare)
 *   0 -> node   EXIT <exit>                    (the job is over)
 *   both ways   HB                             (every --monitor-interval)
 *
 * Every connection first proves the job secret (src/comm/auth.h: DT_JOB_SECRET or
 * DT_JOB_SECRET_FILE; without one, node 0 must be on loopback) through a gate that
 * handles unauthenticated connections concurrently (gate.h: a flood of them cannot
 * evict a node's); an authenticated connection then has 2 s to say HELLO. Node 0 listens on --master-addr when it is
 * one of its addresses (else the interface DT_SOCKET_IFNAME names, or that routes
 * there), never on every interface.
 *
 * A report's newlines travel as tabs (control characters were removed before). Node 0
 * decides: the first failure it hears of (its own, a FAIL, a lost node) is the job's;
 * when every node is idle it restarts the job (START with a new port) or ends it.
 * A connection that closes, or stays silent for --heartbeat-timeout, is a lost node;
 * a node that loses node 0 stops its ranks and exits 1.
 *
 * Elastic jobs (--nnodes MIN:MAX): a lost node ends the attempt, not the job; a node may
 * join while the job runs (it gets a START as a spare at once) and node ranks are ids
 * whose slot a lost node frees. Each attempt node 0 lays the largest exact world out over
 * the live nodes (server_round); every attempt has its own job id (DT_JOB_ID + "-rK"),
 * which the ranks' authentication binds, so ranks of a dropped node cannot enter the next.
 *
 * Node 0 may be lost too. Every other node listens from the start on a port of the
 * address it reaches node 0 from (connections wait in the kernel's queue until it serves)
 * and node 0 lists every live node's address and port (PEERS). A node that loses node 0
 * goes to the first node of that list still there, by node rank; that node serves the
 * rendezvous from then on, with the same job id, attempts and exact sizes (EXACT), and its
 * ranks come first (MASTER_ADDR is its address). Who goes on is decided by the majority of
 * the last list, so that a network cut cannot make two jobs: the nodes without the server
 * go on only when more than half of the list reached the new one, and the server stops
 * when it has kept fewer than half of the largest list current within the time the others
 * have to meet (with two nodes, node 0 goes on alone and node 1 does not). A node that joins later still asks --master-addr, which no longer answers.
 */
#include "config.h"
#include "dtrun.h"
#include "auth.h"
#include "gate.h"
#include "sock.h"

#include <errno.h>
#include <signal.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_LINE     (1u << 20)
#define MAX_PENDING  64
#define AUTH_JOB     "dtrun-rendezvous"   /* the run id is checked in HELLO, with a clear message */

typedef struct {
    int    fd;          /* -1: none */
    char  *buf;
    size_t len, cap;
    double last_rx;
    char   host[256];
    char   addr[64];    /* server: the peer's address, to tell apart nodes with one name */
    int    tport;       /* server, elastic: where it would serve should the server be lost (0: it cannot) */
    int    joined;      /* server: HELLO accepted */
    int    idle;        /* server: its ranks of this attempt ended */
    int    lost;
    int    ranks;       /* server: ranks it runs this attempt (0: a spare) */
    int    code;        /* server: the status its IDLE reported */
} peer;

struct dtrun_net {
    int    server;
    int    lfd;                    /* server: listening socket */
    dt_auth auth;                  /* the job secret every connection proves */
    dt_gate *gate;                 /* server: authenticates connections on lfd */
    peer  *nodes;                  /* server: by node rank (slot 0 unused) */
    peer   pending[MAX_PENDING];   /* server: authenticated, have 2 s to say HELLO */
    peer   master;                 /* others: the connection to node 0 */
    double next_hb;
    int    started;                /* past the rendezvous: heartbeats count */
    int    decided;                /* 0 none, 1 restart, 2 exit */
    int    decided_code;
    int    any_lost;
    dtrun_start next;              /* the next attempt's layout, from START (node 0: its kind) */
    /* elastic, node 0 */
    dtrun_exact ex;                /* the world sizes that keep the result exact */
    int    running;                /* an attempt runs (from its START to the decision) */
    int    changed;                /* the membership changed during this attempt */
    char   change[DTRUN_CHANGE_MAX];   /* what changed, for the line and the ranks (START carries it whole) */
    double change_at;              /* when it was first noticed */
    double short_since;            /* > 0: since then too few nodes for an allowed world */
    char   lost_list[600];         /* every node lost so far, for a final message */
    double last_join;              /* when the last node joined (the rendezvous' last call) */
    /* elastic: going on without node 0 */
    int    self;                   /* this node's rank (the server's own slot among nodes) */
    int    mnode;                  /* the node that serves the rendezvous: 0, or one that took over */
    char   maddr[256];             /* ... where */
    int    mport;
    int    tfd;                    /* not the server: where this node would serve (-1: nowhere) */
    int    tport;
    char   taddr[DTRUN_ADDR_MAX];  /* ... its address (the server's own, in PEERS) */
    dtrun_peers *peers;            /* the live nodes in the last PEERS (a lost one's port: -1) */
    int    members;                /* nodes in the last PEERS: the majority is of these */
    int    recent;                 /* server: the most nodes a PEERS listed that was the last one */
    double recent_until;           /* ... until this time (meet_window after it was replaced):
                                    * a node cut off then may not have heard the next one */
    int    minority;               /* server: it kept fewer than half of the nodes, and stops */
    int    have_ex;                /* not node 0: net->ex came in EXACT */
    int    orphan;                 /* lost the server: the nodes that remain choose another */
    char   orphan_why[1024];       /* how it was lost */
    double orphan_at;              /* when (seconds since the epoch) */
};

/* Seconds since the epoch: a change's time travels to other hosts and into the ranks. */
static double dt_wall(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* How long the nodes have to meet again after losing the server: each notices within
 * --heartbeat-timeout (a heartbeat late by up to --monitor-interval, its check too), and
 * proves the secret in DT_AUTH_DEADLINE. */
static double meet_window(const dtrun_cfg *cfg) { return cfg->hb_timeout_s + 2 * cfg->monitor_s + DT_AUTH_DEADLINE; }

/* --nnodes as the nodes compare it: "4", or "1:4" */
static void nodes_spec(const dtrun_cfg *cfg, char *out, size_t n) {
    if (cfg->elastic) snprintf(out, n, "%d:%d", cfg->min_nodes, cfg->nnodes);
    else snprintf(out, n, "%d", cfg->nnodes);
}

/* ---- connections ---------------------------------------------------------------------- */

static void peer_init(peer *p) {
    memset(p, 0, sizeof *p);
    p->fd = -1;
}

static void peer_close(peer *p) {
    if (p->fd >= 0) close(p->fd);
    p->fd = -1;
    free(p->buf);
    p->buf = NULL;
    p->len = p->cap = 0;
}

static void send_line(peer *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void send_line(peer *p, const char *fmt, ...) {
    if (p->fd < 0) return;
    char stack[4096], *buf = stack;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(stack, sizeof stack, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n + 2 > sizeof stack) {
        if (!(buf = malloc((size_t)n + 2))) return;
        va_start(ap, fmt);
        vsnprintf(buf, (size_t)n + 1, fmt, ap);
        va_end(ap);
    }
    buf[n++] = '\n';
    size_t off = 0;
    double give_up = dt_now() + 2.0;   /* a peer that takes nothing for 2 s is lost anyway */
    while (off < (size_t)n) {
        ssize_t w = send(p->fd, buf + off, (size_t)n - off, MSG_NOSIGNAL);
        if (w > 0) { off += (size_t)w; continue; }
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && dt_now() < give_up) {
            struct pollfd pf = { .fd = p->fd, .events = POLLOUT };
            (void)poll(&pf, 1, 100);
            continue;
        }
        break;   /* the reader notices the broken connection */
    }
    if (buf != stack) free(buf);
}

/* Read what is there. 0: fine; -1: closed or failed (why in *err). */
static int peer_fill(peer *p, const char **err) {
    for (;;) {
        if (p->cap - p->len < 4096) {
            size_t cap = p->cap ? 2 * p->cap : 8192;
            if (cap > MAX_LINE + 8192) { *err = "a message longer than 1 MiB"; return -1; }
            char *b = realloc(p->buf, cap);
            if (!b) { *err = "out of memory"; return -1; }
            p->buf = b;
            p->cap = cap;
        }
        ssize_t r = recv(p->fd, p->buf + p->len, p->cap - p->len, 0);
        if (r > 0) { p->len += (size_t)r; p->last_rx = dt_now(); continue; }
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
        /* a peer process that dies with bytes unread resets the connection instead of
         * closing it (the kernel's abortive close): the same event for the job */
        *err = r == 0 || errno == ECONNRESET ? "its connection closed" : strerror(errno);
        return -1;
    }
}

/* Take the next whole line out of p's buffer (NUL-terminated in place, valid until the
 * next call); NULL when there is none. */
static char *peer_line(peer *p, size_t *consumed) {
    char *nl = p->len ? memchr(p->buf + *consumed, '\n', p->len - *consumed) : NULL;
    if (!nl) {
        memmove(p->buf, p->buf + *consumed, p->len - *consumed);
        p->len -= *consumed;
        *consumed = 0;
        return NULL;
    }
    char *line = p->buf + *consumed;
    *nl = '\0';
    *consumed = (size_t)(nl - p->buf) + 1;
    return line;
}

static void set_socket_opts(int fd) {
    int one = 1;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    (void)setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    (void)fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    (void)fcntl(fd, F_SETFD, FD_CLOEXEC);
}

/* Report text <-> one line: newlines travel as tabs (dtrun_decode turns them back). */
static char *encode(const char *desc) {
    char *e = strdup(desc);
    if (!e) return NULL;
    for (char *p = e; *p; p++) {
        if (*p == '\n') *p = '\t';
        else if (*p == '\t') *p = ' ';
    }
    return e;
}

/* Wait up to ms for the signalfd (and fds); returns a signal that arrived, or 0. */
static int sleep_or_signal(dtrun_job *job, int ms) {
    struct pollfd pf = { .fd = job->sfd, .events = POLLIN };
    if (poll(&pf, 1, ms) > 0) return dtrun_read_signal(job);
    return 0;
}

/* ---- node 0 -------------------------------------------------------------------------- */

static void broadcast(dtrun_net *net, int nnodes, const char *fmt, const char *arg) {
    for (int i = 1; i < nnodes; i++)
        if (net->nodes[i].fd >= 0 && net->nodes[i].joined) send_line(&net->nodes[i], fmt, arg);
}

/* A failure of the job heard by node 0: the first one is the job's, and goes to all. */
static void server_failure(dtrun_job *job, const char *desc, int code, int no_restart) {
    dtrun_net *net = job->net;
    if (!job->fail) {
        dtrun_stop(job, desc, code, no_restart);
        char *e = encode(desc);
        if (e) {
            char head[64];
            snprintf(head, sizeof head, "%d %d ", code, no_restart);
            for (int i = 1; i < job->cfg->nnodes; i++)
                if (net->nodes[i].fd >= 0) send_line(&net->nodes[i], "STOP %s%s", head, e);
            free(e);
        }
    } else {
        dtrun_stop(job, NULL, 0, 0);
    }
    if (no_restart) job->no_restart = 1;
}

/* Elastic, node 0: note a change of membership (the first one's time is the attempt's). */
static void note_change(dtrun_net *net, const char *what) {
    size_t l = strlen(net->change);
    if (!l) net->change_at = dt_wall();
    snprintf(net->change + l, sizeof net->change - l, "%s%s", l ? "; " : "", what);
}

static int live_nodes(const dtrun_job *job);
static void send_peers(dtrun_job *job);

/* Stop the local ranks at once: a peer is gone, so they can neither finish a step nor
 * checkpoint it; the next attempt starts from the newest checkpoint. */
static void kill_ranks_now(dtrun_job *job) {
    job->stopping = 1;
    if (job->alive > 0) dtrun_signal_ranks(job, SIGKILL);
}

/* Elastic, node 0: node i is gone. A spare goes quietly; a node that ran ranks ends the
 * attempt (everyone's ranks are killed) and the next round goes on without it. */
static void elastic_lost(dtrun_job *job, int i, const char *why) {
    dtrun_net *net = job->net;
    peer *p = &net->nodes[i];
    char when[64], d[1024];
    dtrun_clock(when, sizeof when);
    int working = net->running && p->ranks > 0 && !p->idle;
    snprintf(d, sizeof d, "node %d (%s) lost at %s: %s", i, p->host, when, why);
    dtrun_say(job, "%s%s", d, working ? "; stopping the attempt" : p->ranks > 0 ? "" : " (a spare)");
    size_t l = strlen(net->lost_list);
    snprintf(net->lost_list + l, sizeof net->lost_list - l, "%s%d (%s)", l ? ", " : "", i, p->host);
    peer_close(p);
    p->joined = 0;
    p->lost = 1;
    if (p->ranks > 0) {
        snprintf(d, sizeof d, "node %d (%s) lost: %s", i, p->host, why);
        note_change(net, d);
        net->changed = 1;
    }
    /* measured against the membership the lost node may have known last: a node cut off
     * does not hear a list sent after it */
    int live = live_nodes(job), of = net->members;
    if (dt_now() < net->recent_until && net->recent > of) of = net->recent;
    if (net->started && 2 * live < of && !net->minority) {   /* the others may be the majority, going on */
        snprintf(d, sizeof d, "node %d (%s), serving the rendezvous, kept %d of the %d nodes of the last membership, "
                 "fewer than half: it stops, and the others go on without it if more than half of them remain "
                 "together (nodes lost: %s)", net->self, job->host, live, of, net->lost_list);
        net->minority = 1;
        free(job->fail);   /* a rank that failed after the cut is not why the job stops here */
        job->fail = NULL;
        server_failure(job, d, 1, 1);
        kill_ranks_now(job);
        return;
    }
    if (!working) return;
    char *e = encode(d);
    for (int k = 1; k < job->cfg->nnodes; k++)
        if (net->nodes[k].fd >= 0 && net->nodes[k].joined && net->nodes[k].ranks > 0)
            send_line(&net->nodes[k], "LOST %s", e ? e : "a node was lost");
    free(e);
    kill_ranks_now(job);
}

static void node_lost(dtrun_job *job, int i, const char *why) {
    dtrun_net *net = job->net;
    peer *p = &net->nodes[i];
    if (job->cfg->elastic) {
        elastic_lost(job, i, why);
        return;
    }
    char when[64], d[1024];
    dtrun_clock(when, sizeof when);
    snprintf(d, sizeof d, "node %d (%s) was lost at %s: %s", i, p->host, when, why);
    if (job->fail) dtrun_say(job, "%s", d);   /* else it is the first failure, reported at the end */
    peer_close(p);
    p->lost = p->idle = 1;
    net->any_lost = 1;
    server_failure(job, d, 1, 1);
}

static void server_line(dtrun_job *job, int i, char *line) {
    int a, code, nr, off = 0;
    if (strcmp(line, "HB") == 0) return;
    if (sscanf(line, "FAIL %d %d %d %n", &a, &code, &nr, &off) == 3 && off > 0) {
        if (a != job->attempt) return;   /* a report from an attempt already over */
        dtrun_decode(line + off);
        server_failure(job, line + off, code, nr);
    } else if (sscanf(line, "IDLE %d %d", &a, &code) == 2) {
        if (a == job->attempt) {
            job->net->nodes[i].idle = 1;
            job->net->nodes[i].code = code;
        }
    } else {
        dtrun_say(job, "node %d (%s) sent something unexpected: '%.80s'", i, job->net->nodes[i].host, line);
    }
}

/* Node 0: the nodes that are part of the job now (node 0 itself included). */
static int live_nodes(const dtrun_job *job) {
    int n = 1;
    for (int i = 1; i < job->cfg->nnodes; i++) n += job->net->nodes[i].fd >= 0 && job->net->nodes[i].joined;
    return n;
}

/* The world the live nodes hold now: the whole job when fixed, else the largest exact
 * size (0: none, or fewer than MIN nodes). */
static int world_now(const dtrun_job *job) {
    const dtrun_cfg *cfg = job->cfg;
    if (!cfg->elastic) return cfg->nnodes * cfg->nproc;
    int live = live_nodes(job);
    return live < cfg->min_nodes ? 0 : dtrun_pick_world(&job->net->ex, live * cfg->nproc);
}

/* This node's part of the attempt, said once per attempt. */
static void say_layout(dtrun_job *job) {
    const dtrun_cfg *cfg = job->cfg;
    if (!cfg->elastic) {
        char nodes[1024] = "";
        for (int i = 0; i < cfg->nnodes && strlen(nodes) < 900; i++)
            snprintf(nodes + strlen(nodes), sizeof nodes - strlen(nodes), "%s%d=%s", i ? " " : "", i,
                     job->hosts && job->hosts[i] ? job->hosts[i] : "?");
        dtrun_say(job, "node %d of %d (%s): ranks %d..%d of %d; nodes: %s", cfg->node_rank, cfg->nnodes, job->host,
                  job->rank0, job->rank0 + job->nlocal - 1, job->world, nodes);
    } else if (job->nlocal > 0) {
        dtrun_say(job, "node %d (%s), attempt %d: ranks %d..%d of %d", cfg->node_rank, job->host, job->attempt,
                  job->rank0, job->rank0 + job->nlocal - 1, job->world);
    } else {
        dtrun_say(job, "node %d (%s), attempt %d: a spare (the job runs %d rank%s)", cfg->node_rank, job->host,
                  job->attempt, job->world, job->world == 1 ? "" : "s");
    }
}

/* Node 0: lay attempt a out on the live nodes (node 0 first, then by node rank, each
 * with up to -n ranks of the world; the rest spares) and send each node its START.
 * -1 when the live nodes hold no allowed world. */
static int server_round(dtrun_job *job, int a, int kind, int port) {
    const dtrun_cfg *cfg = job->cfg;
    dtrun_net *net = job->net;
    int W = world_now(job);
    if (W <= 0) return -1;
    if (cfg->elastic) send_peers(job);
    int groups = (W + cfg->nproc - 1) / cfg->nproc, next = 0, g = 0;
    char *e = net->change[0] ? encode(net->change) : NULL;
    job->attempt = a;
    job->world = W;
    job->rank0 = 0;
    job->nlocal = W < cfg->nproc ? W : cfg->nproc;
    job->group = 0;
    job->ngroups = groups;
    next = job->nlocal;
    g = 1;
    snprintf(job->change, sizeof job->change, "%s", net->change);
    job->change_at = net->change_at;
    for (int i = 1; i < cfg->nnodes; i++) {
        peer *p = &net->nodes[i];
        p->idle = 0;
        p->ranks = 0;
        if (p->fd < 0 || !p->joined) continue;
        int r = W - next < cfg->nproc ? W - next : cfg->nproc;
        p->ranks = r;
        send_line(p, "START %d %d %d %d %d %d %d %d %d %.3f %s", a, kind, job->restarts, port, W, next, r,
                  r > 0 ? g : -1, groups, net->change_at, e ? e : "-");
        if (r > 0) g++;
        next += r;
    }
    free(e);
    job->rank_port = port;
    net->running = 1;
    net->changed = 0;
    net->short_since = 0;
    net->change[0] = '\0';
    return 0;
}

/* LAYOUT <run id> <hosts...>: the job's id (every node's ranks prove it) and its nodes. */
static void send_layout(dtrun_job *job, peer *p) {
    const dtrun_cfg *cfg = job->cfg;
    size_t cap = 256 + (size_t)cfg->nnodes * 258;
    char *lay = malloc(cap);
    if (!lay) return;   /* the node's ranks then fail to authenticate, saying so */
    snprintf(lay, cap, "%s", dtrun_base_id);
    for (int i = 0; i < cfg->nnodes; i++) {
        peer *q = &job->net->nodes[i];
        snprintf(lay + strlen(lay), cap - strlen(lay), " %s",
                 i == job->net->self || (q->joined && q->fd >= 0) ? q->host : "-");
    }
    send_line(p, "LAYOUT %s", lay);
    free(lay);
    if (cfg->elastic) {   /* what a node that takes over from this one needs */
        char ex[2200], sz[800] = "";
        for (int i = 0; i < job->net->ex.nsizes; i++)
            snprintf(sz + strlen(sz), sizeof sz - strlen(sz), "%s%d", i ? "," : "", job->net->ex.sizes[i]);
        snprintf(ex, sizeof ex, "sizes=%s resume=%s checkpoint-dir=%s", sz, job->net->ex.resume, job->net->ex.ckpt_dir);
        send_line(p, "EXACT %s", ex);
    }
}

/* An address PEERS can carry (numeric), else "0" with port 0. */
static int plain_addr(const char *a) {
    size_t n = strspn(a, "0123456789abcdefABCDEF.:");
    return n > 0 && n < DTRUN_ADDR_MAX && a[n] == '\0';
}

/* Elastic, the server: every live node, where each would serve should the server be
 * lost, to every node; the count is the membership whose majority goes on. */
static void send_peers(dtrun_job *job) {
    dtrun_net *net = job->net;
    const dtrun_cfg *cfg = job->cfg;
    size_t cap = 32 + (size_t)cfg->nnodes * (DTRUN_ADDR_MAX + 24), len;
    char *list = malloc(cap);
    if (!list) return;   /* the nodes keep the last list */
    int n = 0;
    for (int i = 0; i < cfg->nnodes; i++) n += i == net->self || (net->nodes[i].fd >= 0 && net->nodes[i].joined);
    len = (size_t)snprintf(list, cap, "%d", n);
    for (int i = 0; i < cfg->nnodes; i++) {
        const peer *q = &net->nodes[i];
        if (i == net->self)
            len += (size_t)snprintf(list + len, cap - len, " %d %s 0", i, plain_addr(net->taddr) ? net->taddr : "0");
        else if (q->fd >= 0 && q->joined)
            len += (size_t)snprintf(list + len, cap - len, " %d %s %d", i, plain_addr(q->addr) ? q->addr : "0",
                                    plain_addr(q->addr) ? q->tport : 0);
    }
    double now = dt_now();
    if (net->members > 0) {   /* the list replaced stays the measure for a while */
        if (now >= net->recent_until) net->recent = 0;
        if (net->members > net->recent) net->recent = net->members;
        net->recent_until = now + meet_window(cfg);
    }
    net->members = n;
    for (int i = 0; i < cfg->nnodes; i++)
        if (net->nodes[i].fd >= 0 && net->nodes[i].joined) send_line(&net->nodes[i], "PEERS %s", list);
    free(list);
}

/* Elastic, node 0: node i joined a job that has started. It waits as a spare of the
 * running attempt; if the world can grow with it, the ranks are asked to checkpoint and
 * stop (SIGTERM: dtrain writes the step and exits 75), and the next round takes it in. */
static void elastic_joined(dtrun_job *job, int i) {
    dtrun_net *net = job->net;
    peer *p = &net->nodes[i];
    char d[512];
    snprintf(d, sizeof d, "node %d (%s) joined", i, p->host);
    dtrun_say(job, "%s", d);
    send_layout(job, p);
    send_peers(job);   /* before START: the new node reads no further until its START */
    send_line(p, "START %d 2 %d 0 %d 0 0 -1 %d 0 -", job->attempt, job->restarts, job->world, job->ngroups);
    p->ranks = 0;
    p->idle = 1;   /* until the next round it runs nothing */
    int W = world_now(job);
    if (W <= job->world) return;
    note_change(net, d);
    net->changed = 1;
    if (!net->running || job->stopping) return;   /* the round that comes takes it in */
    dtrun_say(job, "the world can grow from %d to %d ranks: asking the ranks to checkpoint and stop", job->world, W);
    for (int k = 1; k < job->cfg->nnodes; k++)
        if (net->nodes[k].fd >= 0 && net->nodes[k].joined && net->nodes[k].ranks > 0) send_line(&net->nodes[k], "DRAIN");
    dtrun_stop(job, NULL, 0, 0);   /* SIGTERM, SIGKILL after --grace */
}

/* Check a HELLO against this node's configuration; "" if it may join, else why not. */
static int check_hello(dtrun_job *job, const char *line, int *node, peer *p, char *why, size_t n) {
    const dtrun_cfg *cfg = job->cfg;
    int ver, nr, np, tport;
    char run[160], host[340], nn[32], spec[32];
    nodes_spec(cfg, spec, sizeof spec);
    if (sscanf(line, "HELLO %d %d %31s %d %159s %255s %d", &ver, &nr, nn, &np, run, host, &tport) != 7 || ver != 2 ||
        tport < 0 || tport > 65535) {
        snprintf(why, n, "not a dtrun of this version (sent '%.60s')", line);
        return 2;
    }
    snprintf(p->host, sizeof p->host, "%.255s", host);
    p->tport = tport;
    *node = nr;
    snprintf(host + strlen(host), sizeof host - strlen(host), " at %s", p->addr);
    if (strcmp(nn, spec) != 0)
        snprintf(why, n, "the nodes disagree about --nnodes: node %d (%s) says %s, node 0 (%s) says %s",
                 nr, host, nn, job->host, spec);
    else if (np != cfg->nproc)
        snprintf(why, n, "the nodes disagree about --nproc-per-node: node %d (%s) says %d, node 0 (%s) says %d",
                 nr, host, np, job->host, cfg->nproc);
    else if (nr == job->net->self)
        snprintf(why, n, "node rank %d given twice: %s (serving the rendezvous) and %s", nr, job->host, host);
    else if (nr < 0 || nr >= cfg->nnodes)
        snprintf(why, n, "node %s says --node-rank %d, outside 0..%d for --nnodes %d", host, nr, cfg->nnodes - 1,
                 cfg->nnodes);
    else if (job->net->nodes[nr].joined && job->net->nodes[nr].fd >= 0)
        snprintf(why, n, "node rank %d given twice: %s at %s (joined first) and %s", nr, job->net->nodes[nr].host,
                 job->net->nodes[nr].addr, host);
    else if (cfg->run_id[0] && strcmp(run, cfg->run_id) != 0)
        snprintf(why, n, "the nodes disagree about --run-id: node %d (%s) %s%s%s, node 0 (%s) says '%s'",
                 nr, host, strcmp(run, "-") ? "says '" : "gives none", strcmp(run, "-") ? run : "",
                 strcmp(run, "-") ? "'" : "", job->host, cfg->run_id);
    else if (strcmp(run, "-") != 0 && !cfg->run_id[0])
        snprintf(why, n, "the nodes disagree about --run-id: node %d (%s) says '%s', node 0 (%s) gives none",
                 nr, host, run, job->host);
    else if (job->net->started && !cfg->elastic)
        snprintf(why, n, "node %d (%s) came too late: the job has started without it", nr, host);
    else
        return 0;
    return 2;
}

/* Read from pending connections: a HELLO joins or is refused. */
static void pending_ready(dtrun_job *job, peer *p) {
    const char *err;
    int bad = peer_fill(p, &err);
    size_t used = 0;
    char *line = peer_line(p, &used);
    if (!line) {
        if (bad || p->len > 4096) peer_close(p);
        return;
    }
    char why[1400];
    int node = -1;
    int rc = check_hello(job, line, &node, p, why, sizeof why);
    if (rc) {
        dtrun_say(job, "refused a node: %s", why);
        send_line(p, "REFUSE %d %s", rc, why);
        peer_close(p);
        return;
    }
    peer *slot = &job->net->nodes[node];
    peer_close(slot);
    *slot = *p;
    slot->joined = 1;
    slot->lost = slot->idle = slot->ranks = 0;
    slot->last_rx = dt_now();
    peer_init(p);
    slot->len = 0;   /* nothing may follow a HELLO before START */
    job->net->last_join = dt_now();
    if (job->net->started) elastic_joined(job, node);
}

/* Drop pending connections that did not say HELLO within 2 s of authenticating. */
static void expire_pending(dtrun_net *net) {
    double now = dt_now();
    for (int k = 0; k < MAX_PENDING; k++)
        if (net->pending[k].fd >= 0 && now - net->pending[k].last_rx > DT_AUTH_DEADLINE) peer_close(&net->pending[k]);
}

/* Take the connections the gate has authenticated; a full pending list drops its oldest. */
static void accept_ready(dtrun_job *job) {
    dtrun_net *net = job->net;
    int fd;
    expire_pending(net);
    while (dt_gate_accept(net->gate, 0, -1, &fd) == DT_OK) {
        int k = 0;
        while (k < MAX_PENDING && net->pending[k].fd >= 0) k++;
        if (k == MAX_PENDING) {
            k = 0;
            for (int i = 1; i < MAX_PENDING; i++) if (net->pending[i].last_rx < net->pending[k].last_rx) k = i;
            peer_close(&net->pending[k]);
        }
        set_socket_opts(fd);
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        char a[64] = "?";
        if (getpeername(fd, (struct sockaddr *)&ss, &sl) == 0 && ss.ss_family == AF_INET)
            inet_ntop(AF_INET, &((struct sockaddr_in *)&ss)->sin_addr, a, sizeof a);
        else if (ss.ss_family == AF_INET6)
            inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&ss)->sin6_addr, a, sizeof a);
        snprintf(net->pending[k].addr, sizeof net->pending[k].addr, "%s", a);
        net->pending[k].fd = fd;
        net->pending[k].last_rx = dt_now();
    }
}

static int server_start(dtrun_job *job) {
    const dtrun_cfg *cfg = job->cfg;
    dtrun_net *net = job->net;
    char spec[32];
    nodes_spec(cfg, spec, sizeof spec);
    net->server = 1;
    if (!(net->nodes = calloc((size_t)cfg->nnodes, sizeof *net->nodes))) {
        dtrun_say(job, "out of memory");
        return 1;
    }
    for (int i = 0; i < cfg->nnodes; i++) peer_init(&net->nodes[i]);
    for (int i = 0; i < MAX_PENDING; i++) peer_init(&net->pending[i]);
    snprintf(net->nodes[0].host, sizeof net->nodes[0].host, "%s", job->host);
    if (cfg->elastic) {   /* which worlds keep the result exact: before anyone waits */
        int rc = dtrun_probe(job, &net->ex);
        if (rc) return rc;
        char sz[400];
        dtrun_sizes_text(&net->ex, sz, sizeof sz);
        if (dtrun_pick_world(&net->ex, cfg->min_nodes * cfg->nproc) == 0) {
            dtrun_say(job, "--nnodes %d:%d with -n %d: %d node%s hold%s %d rank%s, fewer than any world size that "
                      "keeps the result exact (%s)", cfg->min_nodes, cfg->nnodes, cfg->nproc, cfg->min_nodes,
                      cfg->min_nodes == 1 ? "" : "s", cfg->min_nodes == 1 ? "s" : "", cfg->min_nodes * cfg->nproc,
                      cfg->min_nodes * cfg->nproc == 1 ? "" : "s", sz);
            return 2;
        }
        dtrun_say(job, "elastic job of %d to %d nodes x %d ranks: world sizes that keep the result exact: %s",
                  cfg->min_nodes, cfg->nnodes, cfg->nproc, sz);
        if (strcmp(net->ex.resume, "auto") != 0)
            dtrun_say(job, "warning: the program has no --resume auto: after a membership change it starts again "
                      "from step 0");
        else if (!net->ex.ckpt_dir[0])
            dtrun_say(job, "warning: the program has no --checkpoint-dir: its state lives only in the nodes' memory "
                      "(dtrain --snapshot-every); should a node and the next one be lost together, the job starts "
                      "again from step 0");
    }
    char addr[64];
    int fd = -1;
    if (dt_auth_init(&net->auth, AUTH_JOB) != DT_OK || dt_auth_allow(&net->auth, cfg->master_addr) != DT_OK ||
        dt_sock_bind_addr(cfg->master_addr, addr, sizeof addr) != DT_OK) {
        dtrun_say(job, "node 0: %s", dt_last_error());
        return 2;
    }
    if (dt_sock_listen(addr, cfg->master_port, &fd, NULL) != DT_OK) {
        dtrun_say(job, "node 0 cannot serve the rendezvous on %s:%d (--master-port): %s "
                  "(another job may hold it; choose another port)", addr, cfg->master_port, dt_last_error());
        return 1;
    }
    set_socket_opts(fd);
    net->lfd = fd;
    snprintf(net->taddr, sizeof net->taddr, "%s", addr);
    if (dt_gate_new(&net->auth, DT_AUTH_LAUNCH, fd, &net->gate) != DT_OK) {
        dtrun_say(job, "node 0: %s", dt_last_error());
        return 1;
    }
    dtrun_say(job, "node 0 of %s (%s): waiting up to %g s for the other nodes on port %d",
              spec, job->host, cfg->rdzv_timeout_s, cfg->master_port);
    double deadline = dt_now() + cfg->rdzv_timeout_s;
    net->last_join = dt_now();
    for (;;) {
        int missing = 0;
        for (int i = 1; i < cfg->nnodes; i++) if (!net->nodes[i].joined) missing++;
        if (!missing) break;
        double t = dt_now();
        /* elastic: MIN nodes, then none for the last call */
        if (cfg->elastic && cfg->nnodes - missing >= cfg->min_nodes && t - net->last_join >= cfg->last_call_s) break;
        if (t >= deadline && cfg->elastic) {
            if (cfg->nnodes - missing >= cfg->min_nodes) break;
            char why[512];
            snprintf(why, sizeof why, "the rendezvous timed out after %g s (--rdzv-timeout): %d of at least %d nodes "
                     "joined", cfg->rdzv_timeout_s, cfg->nnodes - missing, cfg->min_nodes);
            dtrun_say(job, "%s", why);
            broadcast(net, cfg->nnodes, "REFUSE 1 %s", why);
            return 1;
        }
        if (t >= deadline) {
            char list[512] = "";
            for (int i = 1, n = 0; i < cfg->nnodes && n < 40; i++)
                if (!net->nodes[i].joined)
                    snprintf(list + strlen(list), sizeof list - strlen(list), "%s%d", n++ ? "," : "", i);
            char why[768];
            snprintf(why, sizeof why, "the rendezvous timed out after %g s (--rdzv-timeout): node%s %s never joined",
                     cfg->rdzv_timeout_s, missing > 1 ? "s" : "", list);
            dtrun_say(job, "%s", why);
            broadcast(net, cfg->nnodes, "REFUSE 1 %s", why);
            return 1;
        }
        struct pollfd pfd[2 + MAX_PENDING + DTRUN_MAX_NODES + DT_GATE_SLOTS];
        int np = 0;
        pfd[np++] = (struct pollfd){ .fd = job->sfd, .events = POLLIN };
        for (int k = 0; k < MAX_PENDING; k++) pfd[np++] = (struct pollfd){ .fd = net->pending[k].fd, .events = POLLIN };
        for (int i = 1; i < cfg->nnodes; i++) pfd[np++] = (struct pollfd){ .fd = net->nodes[i].fd, .events = POLLIN };
        np += dt_gate_pollfds(net->gate, pfd + np, DT_GATE_SLOTS + 1);
        int ms = (int)((deadline - t) * 1000) + 1;
        if (ms > 1000) ms = 1000;
        if (cfg->elastic && ms > 50) ms = 50;   /* the last call is counted here */
        if (poll(pfd, (nfds_t)np, ms) < 0 && errno != EINTR) {
            dtrun_say(job, "poll: %s", strerror(errno));
            return 1;
        }
        if (pfd[0].revents) {
            int sig = dtrun_read_signal(job);
            if (sig) {
                char why[512];
                snprintf(why, sizeof why, "dtrun on node 0 (%s) was stopped by %s during the rendezvous",
                         job->host, dtrun_signame(sig));
                broadcast(net, cfg->nnodes, "REFUSE 1 %s", why);
                dtrun_say(job, "stopped by %s during the rendezvous", dtrun_signame(sig));
                return 128 + sig;
            }
        }
        for (int k = 0; k < MAX_PENDING; k++) if (pfd[1 + k].revents) pending_ready(job, &net->pending[k]);
        for (int i = 1; i < cfg->nnodes; i++) {
            peer *p = &net->nodes[i];
            if (p->fd < 0 || !pfd[1 + MAX_PENDING + i - 1].revents) continue;
            const char *err;
            if (peer_fill(p, &err) != 0) {   /* it left before the start: its slot is free again */
                dtrun_say(job, "node %d (%s) left during the rendezvous: %s; waiting for it again", i, p->host, err);
                peer_close(p);
                p->joined = 0;
            }
            p->len = 0;
        }
        /* the gate drops unauthenticated connections past their 2 s, so look at it each time */
        accept_ready(job);
    }
    job->rank_port = dtrun_free_port();
    if (!job->rank_port) {
        dtrun_say(job, "cannot find a free TCP port for the ranks: %s", strerror(errno));
        broadcast(net, cfg->nnodes, "REFUSE 1 %s", "node 0 found no free port for the ranks");
        return 1;
    }
    for (int i = 1; i < cfg->nnodes; i++) if (net->nodes[i].joined) send_layout(job, &net->nodes[i]);
    server_round(job, 0, 0, job->rank_port);
    for (int i = 1; i < cfg->nnodes; i++) net->nodes[i].last_rx = dt_now();
    return 0;
}

/* ---- the other nodes ----------------------------------------------------------------- */

/* One connection attempt, bounded by ms; fd or -1 with errno set. */
static int try_connect(const char *host, int port, int ms, char *err, size_t n) {
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    int g = getaddrinfo(host, ps, &hints, &res);
    if (g != 0) { snprintf(err, n, "%s", gai_strerror(g)); return -1; }
    int fd = -1;
    for (struct addrinfo *a = res; a; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
        if (fd < 0) { snprintf(err, n, "%s", strerror(errno)); continue; }
        (void)fcntl(fd, F_SETFL, O_NONBLOCK);
        int rc = connect(fd, a->ai_addr, a->ai_addrlen);
        if (rc != 0 && errno == EINPROGRESS) {
            struct pollfd pf = { .fd = fd, .events = POLLOUT };
            int e = 0;
            socklen_t el = sizeof e;
            rc = poll(&pf, 1, ms);
            if (rc == 0) { errno = ETIMEDOUT; rc = -1; }
            else if (rc > 0 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &el) == 0 && e != 0) { errno = e; rc = -1; }
            else if (rc > 0) rc = 0;
        }
        if (rc == 0) break;
        snprintf(err, n, "%s", strerror(errno));
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    return fd;
}

static void master_lost(dtrun_job *job, const char *why) {
    dtrun_net *net = job->net;
    char when[64], d[1024];
    dtrun_clock(when, sizeof when);
    const char *mh = job->hosts && job->hosts[net->mnode] ? job->hosts[net->mnode] : "?";
    snprintf(d, sizeof d, "lost node %d (%s, the master at %s:%d) at %s: %s", net->mnode, mh, net->maddr, net->mport,
             when, why);
    if (job->cfg->elastic && net->started && net->peers && !job->no_restart && !job->signal) {
        /* the nodes that remain choose who serves (takeover, after the ranks ended) */
        dtrun_say(job, "%s; the nodes that remain choose who serves the rendezvous", d);
        snprintf(net->orphan_why, sizeof net->orphan_why, "node %d (%s) lost: %s", net->mnode, mh, why);
        net->orphan_at = dt_wall();
        net->orphan = 1;
        for (int i = 0; i < net->peers->n; i++)
            if (net->peers->node[i] == net->mnode) net->peers->port[i] = -1;
        peer_close(&net->master);
        kill_ranks_now(job);
        return;
    }
    if (job->fail) dtrun_say(job, "%s", d);   /* else it is the first failure, reported at the end */
    peer_close(&net->master);
    net->any_lost = 1;
    dtrun_stop(job, d, 1, 1);
    if (!net->decided) { net->decided = 2; net->decided_code = 1; }
}

/* A node's part of the attempt that START announced. */
static void apply_start(dtrun_job *job) {
    dtrun_net *net = job->net;
    const dtrun_start *st = &net->next;
    job->attempt = st->attempt;
    job->restarts = st->restarts;
    job->rank_port = st->port;
    job->world = st->world;
    job->rank0 = st->rank0;
    job->nlocal = st->nlocal < job->cfg->nproc ? st->nlocal : job->cfg->nproc;
    job->group = st->group;
    job->ngroups = st->ngroups;
    job->change_at = st->change_at;
    snprintf(job->change, sizeof job->change, "%s", st->change);
}

static void client_line(dtrun_job *job, char *line) {
    dtrun_net *net = job->net;
    int code, nr, off = 0;
    if (strcmp(line, "HB") == 0) return;
    if (sscanf(line, "STOP %d %d %n", &code, &nr, &off) == 2 && off > 0) {
        dtrun_decode(line + off);
        free(job->fail);   /* node 0's word on the first failure replaces what we saw */
        job->fail = NULL;
        dtrun_stop(job, line + off, code, nr);
    } else if (strncmp(line, "START ", 6) == 0) {
        dtrun_start st;   /* a START that does not parse leaves the last one as it was */
        if (dtrun_parse_start(line + 6, &st) == 0) {
            net->next = st;
            net->decided = 1;
        } else dtrun_say(job, "node %d sent a START this dtrun cannot read: '%.80s'", net->mnode, line);
    } else if (strncmp(line, "LOST ", 5) == 0) {   /* elastic: a node with ranks is gone */
        dtrun_decode(line + 5);
        if (job->alive > 0 && !job->fail) dtrun_say(job, "%s: stopping the ranks", line + 5);
        kill_ranks_now(job);
    } else if (strcmp(line, "DRAIN") == 0) {        /* elastic: the world can grow */
        if (job->alive > 0 && !job->stopping)
            dtrun_say(job, "a node joined and the world can grow: asking the ranks to checkpoint and stop");
        dtrun_stop(job, NULL, 0, 0);
    } else if (sscanf(line, "EXIT %d", &code) == 1) {
        net->decided = 2;
        net->decided_code = code;
    } else if (sscanf(line, "REFUSE %d %n", &code, &off) == 1 && off > 0) {
        dtrun_say(job, "refused by node %d at %s:%d: %s", net->mnode, net->maddr, net->mport, line + off);
        net->decided = 2;   /* the caller closes the connection */
        net->decided_code = code;
    } else if (strncmp(line, "EXACT ", 6) == 0) {   /* elastic: kept should this node take over */
        net->have_ex = dtrun_parse_answer(line + 6, &net->ex) == 0;
    } else if (strncmp(line, "PEERS ", 6) == 0) {   /* elastic: where to go should the server be lost */
        dtrun_peers *pe = malloc(sizeof *pe);   /* a list that does not parse leaves the last one */
        int ok = pe && dtrun_parse_peers(line + 6, pe) == 0 && pe->node[pe->n - 1] < job->cfg->nnodes;
        if (ok) {
            free(net->peers);
            net->peers = pe;
            net->members = pe->n;
        } else {
            free(pe);
            dtrun_say(job, "node %d sent a PEERS this dtrun cannot read: '%.80s'", net->mnode, line);
        }
    } else if (strncmp(line, "LAYOUT ", 7) == 0) {
        char *save = NULL, *tok = strtok_r(line + 7, " ", &save);
        if (tok) snprintf(dtrun_base_id, sizeof dtrun_base_id, "%s", tok);
        int nn = job->cfg->nnodes;
        if (!job->hosts && !(job->hosts = calloc((size_t)nn, sizeof *job->hosts))) return;
        for (int i = 0; i < nn && (tok = strtok_r(NULL, " ", &save)); i++) {
            free(job->hosts[i]);
            job->hosts[i] = strdup(tok);
        }
    }
}

/* Connect to the node serving the rendezvous (node `node` at host:port) and prove the job
 * secret, retrying for `span` seconds: 0 with *out, 1 when it could not be reached in time
 * (said), 2 when it refused, 128 + a signal that stopped this dtrun. */
static int reach(dtrun_job *job, int node, const char *host, int port, double span, int *out) {
    const dtrun_cfg *cfg = job->cfg;
    dtrun_net *net = job->net;
    char err[256] = "", said[256] = "";
    double next_note = 0, deadline = dt_now() + span;
    /* the server answers at once or drops the connection (shedding a flood of strangers):
     * an attempt that hears nothing is retried on a fresh connection, soon, with more
     * patience each time (as dt_auth_connect does) */
    double attempt = 0.5;
    int failed = 0;
    for (;;) {
        int pause_ms = 500;   /* the server is not up yet */
        int fd = try_connect(host, port, 2000, err, sizeof err);
        if (fd >= 0) {
            dt_status as = dt_auth_client(&net->auth, fd, DT_AUTH_LAUNCH, dt_now() + attempt);
            if (as == DT_OK) {
                *out = fd;
                return 0;
            }
            close(fd);
            snprintf(err, sizeof err, "%s", dt_last_error());
            if (as == DT_ERR_MISMATCH) {
                dtrun_say(job, "node %d: node %d at %s:%d refused: %s", cfg->node_rank, node, host, port, err);
                return 2;
            }
            if (attempt < 2 * DT_AUTH_DEADLINE) attempt *= 2;
            pause_ms = failed < 6 ? 2 << failed : 100;   /* 2 ms, doubling */
            failed++;
        }
        double t = dt_now();
        if (t >= deadline) {
            dtrun_say(job, "node %d could not reach node %d at %s:%d within %g s%s: %s", cfg->node_rank, node, host,
                      port, span, node == 0 ? " (--rdzv-timeout)" : "", err);
            return 1;
        }
        if (strcmp(err, said) != 0 || t >= next_note) {
            dtrun_say(job, "node %d cannot reach node %d at %s:%d: %s; retrying for up to %.0f s more", cfg->node_rank,
                      node, host, port, err, deadline - t);
            snprintf(said, sizeof said, "%s", err);
            next_note = t + 30;
        }
        int sig = sleep_or_signal(job, pause_ms);
        if (sig) {
            dtrun_say(job, "stopped by %s while waiting for node %d", dtrun_signame(sig), node);
            return 128 + sig;
        }
    }
}

/* Elastic, not the server: listen on the address this node reaches the server from (fd:
 * that connection), where it would serve should the server be lost. Connections wait in
 * the kernel's queue until then. */
static void open_takeover(dtrun_job *job, int fd) {
    dtrun_net *net = job->net;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    char a[64];
    int lfd, port;
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) != 0 || ss.ss_family != AF_INET ||
        !inet_ntop(AF_INET, &((struct sockaddr_in *)&ss)->sin_addr, a, sizeof a)) {
        dtrun_say(job, "warning: node %d reaches node 0 other than over IPv4: it cannot take over the rendezvous "
                  "should node 0 be lost", job->cfg->node_rank);
        return;
    }
    if (dt_sock_listen(a, 0, &lfd, &port) != DT_OK) {
        dtrun_say(job, "warning: node %d cannot take over the rendezvous should node 0 be lost: %s",
                  job->cfg->node_rank, dt_last_error());
        return;
    }
    set_socket_opts(lfd);
    net->tfd = lfd;
    net->tport = port;
    snprintf(net->taddr, sizeof net->taddr, "%s", a);
}

/* Say HELLO on the connection just made to the server. */
static void hello(dtrun_job *job) {
    const dtrun_cfg *cfg = job->cfg;
    char spec[32];
    nodes_spec(cfg, spec, sizeof spec);
    send_line(&job->net->master, "HELLO 2 %d %s %d %s %s %d", cfg->node_rank, spec, cfg->nproc,
              cfg->run_id[0] ? cfg->run_id : "-", job->host, job->net->tport);
}

static int client_start(dtrun_job *job) {
    const dtrun_cfg *cfg = job->cfg;
    dtrun_net *net = job->net;
    peer_init(&net->master);
    double deadline = dt_now() + cfg->rdzv_timeout_s;
    int fd = -1;
    if (dt_auth_init(&net->auth, AUTH_JOB) != DT_OK || dt_auth_allow(&net->auth, cfg->master_addr) != DT_OK) {
        dtrun_say(job, "node %d: %s", cfg->node_rank, dt_last_error());
        return 2;
    }
    int rc = reach(job, 0, cfg->master_addr, cfg->master_port, cfg->rdzv_timeout_s, &fd);
    if (rc) return rc == 2 ? 1 : rc;
    set_socket_opts(fd);
    net->master.fd = fd;
    if (cfg->elastic) open_takeover(job, fd);
    hello(job);
    while (!net->decided) {
        double t = dt_now();
        if (t >= deadline) {
            dtrun_say(job, "node %d: the rendezvous at %s:%d did not complete within %g s (--rdzv-timeout)",
                      cfg->node_rank, cfg->master_addr, cfg->master_port, cfg->rdzv_timeout_s);
            return 1;
        }
        struct pollfd pfd[2] = { { .fd = job->sfd, .events = POLLIN }, { .fd = fd, .events = POLLIN } };
        int ms = (int)((deadline - t) * 1000) + 1;
        if (poll(pfd, 2, ms > 1000 ? 1000 : ms) < 0 && errno != EINTR) {
            dtrun_say(job, "poll: %s", strerror(errno));
            return 1;
        }
        if (pfd[0].revents) {
            int sig = dtrun_read_signal(job);
            if (sig) {
                dtrun_say(job, "stopped by %s during the rendezvous", dtrun_signame(sig));
                return 128 + sig;
            }
        }
        if (!pfd[1].revents) continue;
        const char *e;
        int bad = peer_fill(&net->master, &e);
        size_t used = 0;
        char *line;
        while (!net->decided && (line = peer_line(&net->master, &used))) client_line(job, line);
        /* keep what follows START for the supervisor */
        if (used && net->master.buf) {
            memmove(net->master.buf, net->master.buf + used, net->master.len - used);
            net->master.len -= used;
        }
        if (net->decided == 2) return net->decided_code;
        if (bad && !net->decided) {
            dtrun_say(job, "node 0 at %s:%d closed the connection during the rendezvous: %s",
                      cfg->master_addr, cfg->master_port, e);
            return 1;
        }
    }
    /* decided == 1: the first START (an elastic job's late node: the running attempt's) */
    net->decided = 0;
    apply_start(job);
    net->master.last_rx = dt_now();
    return 0;
}

/* ---- the interface to dtrun.c and dtrun_ranks.c ------------------------------------- */

int dtrun_net_start(dtrun_job *job) {
    const dtrun_cfg *cfg = job->cfg;
    if (!(job->net = calloc(1, sizeof *job->net))) {
        dtrun_say(job, "out of memory");
        return 1;
    }
    dtrun_net *net = job->net;
    net->lfd = net->tfd = -1;
    net->self = cfg->node_rank;
    snprintf(net->maddr, sizeof net->maddr, "%s", cfg->master_addr);
    net->mport = cfg->master_port;
    int rc = cfg->node_rank == 0 ? server_start(job) : client_start(job);
    if (rc) return rc;
    if (cfg->node_rank == 0) {
        if ((job->hosts = calloc((size_t)cfg->nnodes, sizeof *job->hosts)))
            for (int i = 0; i < cfg->nnodes; i++) job->hosts[i] = strdup(job->net->nodes[i].host);
    }
    job->net->started = 1;
    job->net->next_hb = dt_now() + cfg->monitor_s;
    say_layout(job);
    return 0;
}

int dtrun_net_pollfds(dtrun_job *job, struct pollfd *pfd, int max) {
    dtrun_net *net = job->net;
    int n = 0;
    if (!net->server) {
        if (net->master.fd >= 0 && n < max) pfd[n++] = (struct pollfd){ .fd = net->master.fd, .events = POLLIN };
        return n;
    }
    /* the nodes first: if max cuts the list short, it cuts strangers */
    for (int i = 1; i < job->cfg->nnodes && n < max; i++)
        if (net->nodes[i].fd >= 0) pfd[n++] = (struct pollfd){ .fd = net->nodes[i].fd, .events = POLLIN };
    for (int k = 0; k < MAX_PENDING && n < max; k++)
        if (net->pending[k].fd >= 0) pfd[n++] = (struct pollfd){ .fd = net->pending[k].fd, .events = POLLIN };
    n += dt_gate_pollfds(net->gate, pfd + n, max - n);
    return n;
}

void dtrun_net_ready(dtrun_job *job, struct pollfd *pfd, int n) {
    dtrun_net *net = job->net;
    for (int j = 0; j < n; j++) {
        if (!pfd[j].revents) continue;
        int fd = pfd[j].fd;
        if (!net->server) {
            if (fd != net->master.fd) continue;
            const char *err;
            int bad = peer_fill(&net->master, &err);
            size_t used = 0;
            char *line;
            while ((line = peer_line(&net->master, &used))) client_line(job, line);
            if (bad && net->decided == 2) peer_close(&net->master);   /* closed after EXIT: fine */
            else if (bad && net->master.fd >= 0) master_lost(job, err);
            continue;
        }
        int known = 0;
        for (int k = 0; k < MAX_PENDING; k++)
            if (net->pending[k].fd == fd) { pending_ready(job, &net->pending[k]); known = 1; }
        for (int i = 1; i < job->cfg->nnodes; i++) known |= net->nodes[i].fd == fd;
        if (!known) { accept_ready(job); continue; }   /* the gate's */
        for (int i = 1; i < job->cfg->nnodes; i++) {
            peer *p = &net->nodes[i];
            if (p->fd != fd) continue;
            const char *err;
            int bad = peer_fill(p, &err);
            size_t used = 0;
            char *line;
            while ((line = peer_line(p, &used))) server_line(job, i, line);
            if (bad) node_lost(job, i, err);
        }
    }
}

double dtrun_net_deadline(dtrun_job *job) {
    return job->net && job->net->started ? job->net->next_hb : 0;
}

void dtrun_net_tick(dtrun_job *job) {
    dtrun_net *net = job->net;
    const dtrun_cfg *cfg = job->cfg;
    double t = dt_now();
    if (t < net->next_hb) return;
    net->next_hb = t + cfg->monitor_s;
    char why[128];
    snprintf(why, sizeof why, "no heartbeat for %g s (--heartbeat-timeout)", cfg->hb_timeout_s);
    if (!net->server) {
        send_line(&net->master, "HB");
        if (net->master.fd >= 0 && t - net->master.last_rx > cfg->hb_timeout_s) master_lost(job, why);
        return;
    }
    for (int i = 1; i < cfg->nnodes; i++) {
        peer *p = &net->nodes[i];
        if (p->fd < 0) continue;
        send_line(p, "HB");
        if (t - p->last_rx > cfg->hb_timeout_s) node_lost(job, i, why);
    }
}

void dtrun_net_failure(dtrun_job *job, const char *desc, int code, int no_restart) {
    dtrun_net *net = job->net;
    if (net->server) {
        server_failure(job, desc, code, no_restart);
        return;
    }
    char *e = encode(desc);
    if (e) send_line(&net->master, "FAIL %d %d %d %s", job->attempt, code, no_restart, e);
    free(e);
}

/* Node 0: end the job with this status, on every node. */
static int server_exit(dtrun_job *job, int code) {
    dtrun_net *net = job->net;
    net->decided = 2;
    net->decided_code = code;
    char m[32];
    snprintf(m, sizeof m, "%d", code);
    broadcast(net, job->cfg->nnodes, "EXIT %s", m);
    return 1;
}

/* Node 0, fixed membership: is every node done with this attempt? Then restart or end. */
static int server_decide_fixed(dtrun_job *job) {
    dtrun_net *net = job->net;
    const dtrun_cfg *cfg = job->cfg;
    for (int i = 1; i < cfg->nnodes; i++) if (!net->nodes[i].idle && !net->nodes[i].lost) return 0;
    if (job->fail && !job->no_restart && !net->any_lost && job->restarts < cfg->max_restarts) {
        int port = dtrun_free_port();
        if (port) {
            job->restarts++;
            server_round(job, job->attempt + 1, 1, port);
            net->decided = 1;
            return 1;
        }
        dtrun_say(job, "no free TCP port for a restart: %s", strerror(errno));
    }
    return server_exit(job, job->fail ? job->fail_code : job->signal ? 128 + job->signal : 0);
}

/* Node 0, elastic: once every node that ran ranks is done with the attempt, end the job
 * (the ranks finished, a dtrun was stopped, or the failures ran out of restarts) or lay
 * out the next round: a restart after a rank failed while every node was alive, or a
 * membership change. With too few nodes for an allowed world it waits for joins, up to
 * --rdzv-timeout. */
static int server_decide_elastic(dtrun_job *job) {
    dtrun_net *net = job->net;
    const dtrun_cfg *cfg = job->cfg;
    if (net->running) {
        int done = dtrun_common_exit(job) == 0;
        for (int i = 1; i < cfg->nnodes; i++) {
            peer *p = &net->nodes[i];
            if (p->fd < 0 || !p->joined || p->ranks == 0) continue;
            if (!p->idle) return 0;
            done &= p->code == 0;
        }
        net->running = 0;
        if (done) return server_exit(job, 0);
        if (job->no_restart || job->signal)
            return server_exit(job, job->fail ? job->fail_code : job->signal ? 128 + job->signal : 1);
        if (!net->changed) {   /* a rank failed and every node is alive */
            if (!job->fail || job->restarts >= cfg->max_restarts) return server_exit(job, job->fail ? job->fail_code : 1);
            job->restarts++;
            net->next.kind = 1;
            dtrun_say_block(job, job->fail);
            dtrun_say(job, "restarting all ranks (restart %d of %d)", job->restarts, cfg->max_restarts);
        } else {
            net->next.kind = 2;
        }
    }
    if (job->fail && job->no_restart) return server_exit(job, job->fail_code);   /* kept too few nodes */
    int was = job->world, port = dtrun_free_port();
    if (!port) {
        dtrun_say(job, "no free TCP port for the next attempt: %s", strerror(errno));
        return server_exit(job, 1);
    }
    char what[600];
    snprintf(what, sizeof what, "%s", net->change);
    double since = net->change_at;
    if (server_round(job, job->attempt + 1, net->next.kind, port) != 0) {
        double t = dt_now();
        char sz[400];
        dtrun_sizes_text(&net->ex, sz, sizeof sz);
        int live = live_nodes(job);
        if (!net->short_since) {
            net->short_since = t;
            dtrun_say(job, "waiting up to %g s (--rdzv-timeout) for nodes: %d live node%s of at least %d, %d rank%s; "
                      "exact world sizes %s", cfg->rdzv_timeout_s, live, live == 1 ? "" : "s", cfg->min_nodes,
                      live * cfg->nproc, live * cfg->nproc == 1 ? "" : "s", sz);
        }
        if (t - net->short_since < cfg->rdzv_timeout_s) return 0;
        char ck[1200];
        dtrun_newest_checkpoint(&net->ex, ck, sizeof ck);
        dtrun_say(job, "the job stops: %d live node%s (at least %d needed, for a world of %s ranks) for %g s "
                  "(--rdzv-timeout); nodes lost: %s; newest checkpoint: %s", live, live == 1 ? "" : "s",
                  cfg->min_nodes, sz, cfg->rdzv_timeout_s, net->lost_list[0] ? net->lost_list : "none", ck);
        return server_exit(job, 1);
    }
    if (net->next.kind == 2) {
        int used = 0;
        for (int i = 1; i < cfg->nnodes; i++) used += net->nodes[i].ranks > 0;
        int spares = live_nodes(job) - 1 - used;
        long long at = dtrun_newest_step(&net->ex, job->snap_dir);
        char from[64] = "";
        if (at >= 0) snprintf(from, sizeof from, "; resumes after step %lld", at);
        dtrun_say(job, "membership: %s; world %d -> %d rank%s on %d node%s%s; %.1f s after the change",
                  what[0] ? what : "the nodes changed", was, job->world, job->world == 1 ? "" : "s", job->ngroups,
                  job->ngroups == 1 ? "" : "s", from, dt_wall() - since);
        if (spares > 0) {
            char list[400] = "";
            for (int i = 1; i < cfg->nnodes; i++)
                if (net->nodes[i].fd >= 0 && net->nodes[i].joined && net->nodes[i].ranks == 0)
                    snprintf(list + strlen(list), sizeof list - strlen(list), "%s%d", list[0] ? "," : "", i);
            dtrun_say(job, "spare node%s: %s", spares == 1 ? "" : "s", list);
        }
    }
    net->decided = 1;
    return 1;
}

static int server_decide(dtrun_job *job) {
    return job->cfg->elastic ? server_decide_elastic(job) : server_decide_fixed(job);
}

/* ---- going on without node 0 (elastic) ------------------------------------------------ */

/* This node serves the rendezvous from now on: the nodes of the last PEERS have until
 * the window's end to reach it (each notices the loss within --heartbeat-timeout); it goes
 * on when more than half of them did. 0, or the exit status. */
static int serve(dtrun_job *job) {
    const dtrun_cfg *cfg = job->cfg;
    dtrun_net *net = job->net;
    const dtrun_peers *pe = net->peers;
    if (!net->have_ex) {
        dtrun_say(job, "node %d cannot serve the rendezvous: node %d never said which world sizes keep the result "
                  "exact", net->self, net->mnode);
        return 1;
    }
    if (!(net->nodes = calloc((size_t)cfg->nnodes, sizeof *net->nodes))) {
        dtrun_say(job, "out of memory");
        return 1;
    }
    for (int i = 0; i < cfg->nnodes; i++) peer_init(&net->nodes[i]);
    for (int i = 0; i < MAX_PENDING; i++) peer_init(&net->pending[i]);
    snprintf(net->nodes[net->self].host, sizeof net->nodes[net->self].host, "%s", job->host);
    for (int i = 0; i < cfg->nnodes; i++)   /* the hosts as the last LAYOUT named them, for messages */
        if (i != net->self && job->hosts && job->hosts[i] && strcmp(job->hosts[i], "-") != 0)
            snprintf(net->nodes[i].host, sizeof net->nodes[i].host, "%s", job->hosts[i]);
    net->lfd = net->tfd;
    net->tfd = -1;
    if (dt_gate_new(&net->auth, DT_AUTH_LAUNCH, net->lfd, &net->gate) != DT_OK) {
        dtrun_say(job, "node %d: %s", net->self, dt_last_error());
        return 1;
    }
    net->server = 1;
    net->started = 0;   /* a HELLO now joins this round, not the running one */
    int lost = net->mnode, expect = 0;
    net->mnode = net->self;
    snprintf(net->lost_list, sizeof net->lost_list, "%d (%s)", lost, net->nodes[lost].host[0] ? net->nodes[lost].host : "?");
    for (int i = 0; i < pe->n; i++) expect += pe->node[i] != net->self && pe->port[i] != -1;
    dtrun_say(job, "node %d (%s) serves the rendezvous now on %s:%d; waiting up to %g s for the %d other node%s of "
              "the last membership of %d", net->self, job->host, net->taddr, net->tport,
              meet_window(cfg), expect, expect == 1 ? "" : "s", net->members);
    double deadline = dt_now() + meet_window(cfg);
    while (live_nodes(job) - 1 < expect && dt_now() < deadline) {
        struct pollfd pfd[1 + MAX_PENDING + DTRUN_MAX_NODES + DT_GATE_SLOTS + 1];
        pfd[0] = (struct pollfd){ .fd = job->sfd, .events = POLLIN };
        int np = 1 + dtrun_net_pollfds(job, pfd + 1, MAX_PENDING + DTRUN_MAX_NODES + DT_GATE_SLOTS + 1);
        if (poll(pfd, (nfds_t)np, 100) < 0 && errno != EINTR) {
            dtrun_say(job, "poll: %s", strerror(errno));
            return 1;
        }
        int sig = pfd[0].revents ? dtrun_read_signal(job) : 0;
        if (sig) {
            dtrun_say(job, "stopped by %s while the nodes met again", dtrun_signame(sig));
            server_exit(job, 128 + sig);
            return 128 + sig;
        }
        dtrun_net_ready(job, pfd + 1, np - 1);
        accept_ready(job);
        dtrun_net_tick(job);   /* heartbeats both ways: a node that came early must not lose us */
    }
    int live = live_nodes(job);
    if (2 * live <= net->members) {
        dtrun_say(job, "node %d (%s): %d of the %d nodes of the last membership met again, not more than half: the job "
                  "stops here (should the others be together, node %d's side goes on)", net->self, job->host, live,
                  net->members, lost);
        server_exit(job, 1);
        return 1;
    }
    if ((job->hosts || (job->hosts = calloc((size_t)cfg->nnodes, sizeof *job->hosts))))
        for (int i = 0; i < cfg->nnodes; i++) {
            free(job->hosts[i]);
            job->hosts[i] = strdup(net->nodes[i].host[0] ? net->nodes[i].host : "-");
        }
    snprintf(job->rank_addr, sizeof job->rank_addr, "%s", net->taddr);
    snprintf(net->maddr, sizeof net->maddr, "%s", net->taddr);
    net->mport = net->tport;
    net->change[0] = '\0';
    note_change(net, net->orphan_why);
    for (int i = 0; i < pe->n; i++) {   /* the nodes of the list that did not come */
        peer *q = &net->nodes[pe->node[i]];
        if (pe->node[i] == net->self || pe->node[i] == lost || (q->fd >= 0 && q->joined)) continue;
        char d[400];
        snprintf(d, sizeof d, "node %d (%s) did not meet again", pe->node[i], q->host[0] ? q->host : "?");
        note_change(net, d);
        size_t l = strlen(net->lost_list);
        snprintf(net->lost_list + l, sizeof net->lost_list - l, ", %d (%s)", pe->node[i], q->host[0] ? q->host : "?");
    }
    net->change_at = net->orphan_at;
    net->changed = 1;
    net->running = 0;
    net->next.kind = 2;
    double now = dt_now();
    for (int i = 0; i < cfg->nnodes; i++)
        if (net->nodes[i].fd >= 0 && net->nodes[i].joined) {
            send_layout(job, &net->nodes[i]);
            net->nodes[i].last_rx = now;
        }
    net->started = 1;
    return 0;
}

/* The server was lost: go to the first node of the last PEERS still there (by node rank),
 * or serve if that is this one; a node that cannot be reached within the window is passed
 * over. 0 (the loop goes on: a START comes, or this node decides), or the exit status. */
static int takeover(dtrun_job *job) {
    const dtrun_cfg *cfg = job->cfg;
    dtrun_net *net = job->net;
    dtrun_peers *pe = net->peers;
    net->orphan = 0;
    for (;;) {
        int c = -1;
        for (int i = 0; i < pe->n && c < 0; i++)
            if (pe->node[i] == net->self ? net->tfd >= 0 : pe->port[i] > 0) c = i;
        if (c < 0) {
            dtrun_say(job, "node %d: no node of the last membership is left to serve the rendezvous", net->self);
            return 1;
        }
        if (pe->node[c] == net->self) return serve(job);
        int fd = -1;
        int rc = reach(job, pe->node[c], pe->addr[c], pe->port[c], meet_window(cfg), &fd);
        if (rc == 2) return 1;
        if (rc > 2) return rc;
        if (rc == 1) {   /* lost too, or cut off from this node */
            pe->port[c] = -1;
            continue;
        }
        set_socket_opts(fd);
        peer_init(&net->master);
        net->master.fd = fd;
        net->master.last_rx = dt_now();
        net->mnode = pe->node[c];
        snprintf(net->maddr, sizeof net->maddr, "%s", pe->addr[c]);
        net->mport = pe->port[c];
        snprintf(job->rank_addr, sizeof job->rank_addr, "%s", pe->addr[c]);
        dtrun_say(job, "node %d: node %d at %s:%d serves the rendezvous now", net->self, net->mnode, net->maddr,
                  net->mport);
        hello(job);
        return 0;
    }
}

/* Until the job's decision (or, elastic, the server's loss): 0, or 1 after a failed poll. */
static int wait_decision(dtrun_job *job) {
    dtrun_net *net = job->net;
    const dtrun_cfg *cfg = job->cfg;
    while (!net->decided && !net->orphan && !(net->server && server_decide(job))) {
        struct pollfd pfd[1 + MAX_PENDING + DTRUN_MAX_NODES + 1 + DT_GATE_SLOTS];
        pfd[0] = (struct pollfd){ .fd = job->sfd, .events = POLLIN };
        int np = 1 + dtrun_net_pollfds(job, pfd + 1, MAX_PENDING + DTRUN_MAX_NODES + 1 + DT_GATE_SLOTS);
        double wait = net->next_hb - dt_now();
        int ms = wait > 0 ? (int)(wait * 1000) + 1 : 0;
        if (poll(pfd, (nfds_t)np, ms) < 0 && errno != EINTR) {
            dtrun_say(job, "poll: %s", strerror(errno));
            return 1;
        }
        if (pfd[0].revents) {
            int sig = dtrun_read_signal(job);
            if (sig && !job->signal) {
                job->signal = sig;
                char d[512], when[64];
                dtrun_clock(when, sizeof when);
                snprintf(d, sizeof d, "dtrun on node %d (%s) was stopped by %s at %s", cfg->node_rank, job->host,
                         dtrun_signame(sig), when);
                dtrun_net_failure(job, d, 128 + sig, 1);
                if (!job->fail) dtrun_stop(job, d, 128 + sig, 1);
                job->no_restart = 1;
                if (!net->server) {   /* do not wait for node 0 once told to stop */
                    net->decided = 2;
                    net->decided_code = 128 + sig;
                } else if (cfg->elastic && !net->running) {   /* waiting for nodes: end now */
                    server_exit(job, 128 + sig);
                }
            }
        }
        dtrun_net_ready(job, pfd + 1, np - 1);
        dtrun_net_tick(job);
    }
    return 0;
}

int dtrun_net_after(dtrun_job *job) {
    dtrun_net *net = job->net;
    const dtrun_cfg *cfg = job->cfg;
    if (!net->server) send_line(&net->master, "IDLE %d %d", job->attempt, job->nlocal > 0 ? dtrun_common_exit(job) : -2);
    for (;;) {   /* elastic: a server lost while waiting is replaced, and the wait goes on */
        int rc = net->orphan ? takeover(job) : 0;
        if (rc || (rc = wait_decision(job))) return rc;
        if (!net->orphan) break;
    }
    if (net->decided == 1) {
        net->decided = 0;
        if (!net->server) {
            apply_start(job);
            if (net->next.kind == 1) {
                if (job->fail) dtrun_say_block(job, job->fail);
                dtrun_say(job, "restarting all ranks (restart %d of %d)", job->restarts, cfg->max_restarts);
            } else if (net->next.kind == 2 && job->change[0]) {
                dtrun_say(job, "membership: %s", job->change);
            }
        } else if (!cfg->elastic) {
            if (job->fail) dtrun_say_block(job, job->fail);
            dtrun_say(job, "restarting all ranks (restart %d of %d)", job->restarts, cfg->max_restarts);
        }
        if (cfg->elastic) say_layout(job);
        return -1;
    }
    if (job->fail && !(cfg->elastic && net->decided_code == 0)) dtrun_say_block(job, job->fail);
    return net->decided_code;
}

void dtrun_net_close(dtrun_job *job) {
    dtrun_net *net = job->net;
    if (job->hosts) {
        for (int i = 0; i < job->cfg->nnodes; i++) free(job->hosts[i]);
        free(job->hosts);
        job->hosts = NULL;
    }
    if (!net) return;
    peer_close(&net->master);
    if (net->nodes) for (int i = 0; i < job->cfg->nnodes; i++) peer_close(&net->nodes[i]);
    if (net->server) for (int k = 0; k < MAX_PENDING; k++) peer_close(&net->pending[k]);
    dt_gate_free(net->gate);
    if (net->lfd >= 0) close(net->lfd);
    if (net->tfd >= 0) close(net->tfd);
    free(net->peers);
    free(net->nodes);
    free(net);
    job->net = NULL;
}
