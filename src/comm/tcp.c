/*
 * tcp.c: the "tcp" backend — rendezvous, the connection mesh, shared memory set-up.
 *
 * Init, in order:
 *   1. who am I: rank/size from the options or the launch environment (launch_env.h);
 *      where is the store: env:// (MASTER_ADDR/MASTER_PORT), tcp://host:port, or
 *      file:///path (rank 0 binds a free port and publishes "job host port nonce" there
 *      in the line of rdzv_file.h, and a fresh job secret when none is set: the file is
 *      private, mode 0600; the other ranks refuse any file that is not,
 *      file_open_private);
 *      under mpirun with neither MASTER_ADDR nor MASTER_PORT (and MPI built in), rank 0
 *      serves the store on a free port and MPI broadcasts where, and a fresh secret
 *      (mpi_boot.h); every connection, to the store and between ranks, first proves the
 *      job secret (auth.h; without a secret only on loopback), and every server listens
 *      on the chosen interface's address only, never on the wildcard;
 *   2. rank 0 serves the store; every rank connects, checks the world size against
 *      rank 0's, claims its rank with an atomic counter (two processes claiming one rank
 *      are told about each other), and registers its listening address, host, pid, boot
 *      id and a random nonce;
 *   3. the full mesh: rank i connects to every j < i and accepts every j > i; each
 *      connection opens with a handshake (magic, job id, world size, ranks, the target's
 *      nonce), so junk bytes or another job's process on a port are refused and ignored;
 *   4. pairs on the same host (same host name and boot id) move their data path to
 *      shared-memory rings when they first talk (unless DT_SHM=0; tcp_ring.c says how,
 *      and why not at init); the socket stays open so the death of the peer is still
 *      seen as end of file. A waiting rank spins DT_SHM_SPIN_US microseconds before
 *      sleeping (default 1000 for blocking calls and 20 on the async worker; 200 and 5,
 *      spinning by sched_yield, when ranks outnumber cores), and yields at once to a
 *      peer that runs on its own CPU. Large collective messages can skip the ring
 *      (process_vm_readv) when the sender sets DT_CMA=1 (tcp_xfer.c).
 * The mesh holds a socket per peer, so a large job needs as many open files: the soft
 * limit is raised to the hard one when it is too low (fd_limit).
 * The data path lives in tcp_xfer.c; the algorithms in algo.c run over it.
 */
#include "config.h"
#include "tcp_impl.h"
#include "launch_env.h"
#include "mpi_boot.h"
#include "rdzv_file.h"
#include "sock.h"
#include "gate.h"
#include "testing.h"

#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <poll.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define HS_MAGIC  0x53484454u   /* "DTHS" */
#define HS_REPLY  0x41484454u   /* "DTHA" */
#define HS_BYTES  32

typedef struct {
    char addr[64];
    int port, pid;
    unsigned long long nonce;
    char boot[64];
    char host[256];
} reg_t;

/* n bytes from /dev/urandom. */
static dt_status random_bytes(void *p, size_t n) {
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return dt_error(DT_ERR_IO, "/dev/urandom: %s", strerror(errno));
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, (char *)p + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            int e = r < 0 ? errno : EIO;
            close(fd);
            return dt_error(DT_ERR_IO, "/dev/urandom: %s", strerror(e));
        }
        got += (size_t)r;
    }
    close(fd);
    return DT_OK;
}

static unsigned long long make_nonce(void) {
    unsigned long long n = 0;
    if (random_bytes(&n, sizeof n) != DT_OK) n = 0;
    if (!n) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        n = ((unsigned long long)ts.tv_nsec << 20) ^ (unsigned long long)getpid() ^ (unsigned long long)ts.tv_sec;
    }
    return n ? n : 1;
}

static void read_boot_id(char *out, size_t n) {
    snprintf(out, n, "-");
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (!f) return;
    char b[64];
    if (fgets(b, sizeof b, f)) {
        b[strcspn(b, "\n ")] = '\0';
        if (*b) snprintf(out, n, "%s", b);
    }
    fclose(f);
}

/* ---- init method -------------------------------------------------------------------- */

typedef struct {
    int file;                /* file:// */
    char path[1024];
    char host[256];
    int port;
} method_t;

static dt_status parse_method(const char *m, const dt_launch_env *env, method_t *out) {
    memset(out, 0, sizeof *out);
    if (!m || strcmp(m, "env://") == 0) {
        if (!env->master_addr[0] || env->master_port <= 0)
            return dt_error(DT_ERR_INVALID, "init method env:// needs MASTER_ADDR and MASTER_PORT "
                            "(set by dtrun, torchrun or srun)%s",
                            env->master_addr[0] ? ": MASTER_PORT is not set" :
                            env->master_port > 0 ? ": MASTER_ADDR is not set" : "");
        snprintf(out->host, sizeof out->host, "%s", env->master_addr);
        out->port = env->master_port;
        return DT_OK;
    }
    if (strncmp(m, "tcp://", 6) == 0) {
        const char *h = m + 6, *colon = strrchr(h, ':');
        char *end = NULL;
        long port = colon ? strtol(colon + 1, &end, 10) : 0;
        if (!colon || colon == h || (size_t)(colon - h) >= sizeof out->host || !end || *end || end == colon + 1 ||
            port < 1 || port > 65535)
            return dt_error(DT_ERR_INVALID, "malformed init method '%s': expected tcp://HOST:PORT (port 1..65535)", m);
        memcpy(out->host, h, (size_t)(colon - h));
        out->port = (int)port;
        return DT_OK;
    }
    if (strncmp(m, "file://", 7) == 0) {
        const char *p = m + 7;
        if (p[0] != '/' || strlen(p) >= sizeof out->path - 16)
            return dt_error(DT_ERR_INVALID, "malformed init method '%s': expected file:///ABSOLUTE/PATH", m);
        out->file = 1;
        snprintf(out->path, sizeof out->path, "%s", p);
        return DT_OK;
    }
    return dt_error(DT_ERR_INVALID, "malformed init method '%s': expected env://, tcp://HOST:PORT or file:///PATH", m);
}

/* file://: rank 0 publishes where its store listens, atomically (temporary + rename). */
static dt_status file_publish(const char *path, const char *job, const char *addr, int port, unsigned long long nonce,
                              const char *secret) {
    char tmp[1100];
    /* mkostemp: a fresh name, created exclusively (never through a planted symlink), mode 0600 */
    snprintf(tmp, sizeof tmp, "%s.tmp.XXXXXX", path);
    int fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0) return dt_error(DT_ERR_IO, "file:// rendezvous: cannot create a file beside %s: %s", path, strerror(errno));
    FILE *f = fdopen(fd, "w");
    if (!f) {
        int e = errno;
        close(fd);
        unlink(tmp);
        return dt_error(DT_ERR_IO, "file:// rendezvous: cannot write %s: %s", tmp, strerror(e));
    }
    int bad = fprintf(f, DT_RDZV_FILE_LINE, *job ? job : "-", addr, port, nonce, secret && *secret ? secret : "-") < 0;
    bad |= fflush(f) != 0 || fsync(fileno(f)) != 0;
    bad |= fclose(f) != 0;
    if (bad || rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return dt_error(DT_ERR_IO, "file:// rendezvous: cannot write %s: %s", path, strerror(e));
    }
    return DT_OK;
}

/* file://: the rendezvous file is trusted only when it is this user's alone: a regular
 * file, not a symbolic link, owned by this user, with no access for group or others
 * (mode 0600, as file_publish writes it). Anything else is refused at once, whatever it
 * holds: a file planted by another user must not lead the ranks to a store of theirs,
 * with a secret in it or without one. *out is NULL (and DT_OK) while there is no file. */
static dt_status file_open_private(const char *path, FILE **out) {
    *out = NULL;
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0 && errno == ENOENT) return DT_OK;   /* rank 0 has not written it yet */
    struct stat sb;
    int got = fd >= 0 ? fstat(fd, &sb) == 0 : lstat(path, &sb) == 0;
    int e = errno;
    if (fd >= 0 && got && S_ISREG(sb.st_mode) && sb.st_uid == geteuid() && !(sb.st_mode & 077)) {
        if ((*out = fdopen(fd, "r")) != NULL) return DT_OK;
        e = errno;
        close(fd);
        return dt_error(DT_ERR_IO, "file://%s: cannot read the rendezvous file: %s", path, strerror(e));
    }
    if (fd >= 0) close(fd);
    if (!got) return dt_error(DT_ERR_IO, "file://%s: cannot open the rendezvous file: %s", path, strerror(e));
    char owner[64];
    struct passwd pw, *pwp = NULL;
    char pwbuf[1024];
    if (getpwuid_r(sb.st_uid, &pw, pwbuf, sizeof pwbuf, &pwp) == 0 && pwp)
        snprintf(owner, sizeof owner, "%u (%s)", (unsigned)sb.st_uid, pw.pw_name);
    else
        snprintf(owner, sizeof owner, "%u", (unsigned)sb.st_uid);
    const char *what = S_ISLNK(sb.st_mode) ? "a symbolic link" : !S_ISREG(sb.st_mode) ? "not a regular file"
                     : sb.st_uid != geteuid() ? "another user's" : "readable or writable by others";
    return dt_error(DT_ERR_INVALID, "file://%s: the rendezvous file is %s (owner %s, mode %04o); only a regular "
                    "file of this user (%u) with mode 0600, as rank 0 writes it, is trusted: remove it or use "
                    "another path", path, what, owner, (unsigned)(sb.st_mode & 07777), (unsigned)geteuid());
}

/* file://: wait for a file naming this job, connect, and check the nonce with the store
 * (a stale file from an earlier job, a reused port, or a file that does not parse
 * (dt_rdzv_file_parse) is skipped until the deadline). */
static dt_status file_connect(const char *path, dt_auth *auth, double deadline, char *host, size_t hn,
                              dt_store **out) {
    char seen[400] = "no file";
    const char *job = auth->job;
    int own_secret = auth->has_secret;
    for (;;) {
        FILE *f;
        DT_TRY(file_open_private(path, &f));
        if (f) {
            char text[DT_RDZV_FILE_MAX];
            size_t tn = fread(text, 1, sizeof text, f);
            fclose(f);
            dt_rdzv_file rf;
            if (tn == sizeof text) {
                snprintf(seen, sizeof seen, "the file is longer than a dtrain rendezvous file");
            } else if (dt_rdzv_file_parse(text, tn, &rf) != DT_OK) {
                snprintf(seen, sizeof seen, "%s", dt_last_error());
            } else if (strcmp(rf.job, *job ? job : "-") != 0) {
                snprintf(seen, sizeof seen, "the file is from job '%s'", rf.job);
            } else {
                dt_store *st = NULL;
                double left = deadline - dt_now();
                int usable = 1;
                if (!own_secret) {
                    int has = strcmp(rf.secret, "-") != 0;
                    usable = dt_auth_init_secret(auth, job, has ? rf.secret : NULL, has ? strlen(rf.secret) : 0) == DT_OK;
                }
                if (usable && dt_store_connect(rf.addr, rf.port, auth, left < 2 ? (left > 0.1 ? left : 0.1) : 2, &st) == DT_OK) {
                    void *v = NULL;
                    size_t vn;
                    char want[32];
                    snprintf(want, sizeof want, "%llx", rf.nonce);
                    if (dt_store_get(st, "nonce", &v, &vn, 1.0) == DT_OK && strcmp(v, want) == 0) {
                        free(v);
                        snprintf(host, hn, "%s", rf.addr);
                        *out = st;
                        return DT_OK;
                    }
                    free(v);
                    dt_store_close(st);
                }
                if (usable)
                    snprintf(seen, sizeof seen, "the file names %s:%d, which does not answer for this job", rf.addr,
                             rf.port);
            }
        }
        if (dt_now() > deadline)
            return dt_error(DT_ERR_TIMEOUT, "file://%s: no store for job '%s' appeared before the timeout (%s)",
                            path, job, seen);
        struct timespec ts = { 0, 20 * 1000 * 1000 };
        nanosleep(&ts, NULL);
    }
}

/* ---- rendezvous through MPI (mpi_boot.h) ------------------------------------------- */

#ifdef DT_HAVE_MPI
typedef struct {
    tcp_world  *w;
    const char *job;
    int         all_local;   /* every rank runs on this host */
} boot_ctx;

/* Rank 0: a job secret for the ranks that have none, the store on a port the kernel
 * picks (held from here on: no other process can take it in between), and the line
 * "ADDR PORT SECRET" for every rank. The store listens on loopback when the whole job
 * runs on this host, else on the interface of the default route; DT_SOCKET_IFNAME
 * overrides both. */
static dt_status boot_publish(void *ctx, char *line, size_t n) {
    boot_ctx *b = ctx;
    char secret[65], addr[64];
    dt_status s;
    dt_auth_new_secret(secret);
    if (setenv("DT_JOB_SECRET", secret, 0) != 0)
        return dt_error(DT_ERR_NOMEM, "cannot set DT_JOB_SECRET: %s", strerror(errno));
    if ((s = dt_auth_init(&b->w->auth, b->job)) != DT_OK) return s;   /* the secret rank 0 now has */
    if ((s = dt_sock_pick_addr(b->all_local ? "127.0.0.1" : "8.8.8.8", addr, sizeof addr)) != DT_OK)
        return dt_error_wrap(s, "choosing the address of the rendezvous store (set DT_SOCKET_IFNAME, or MASTER_ADDR "
                             "and MASTER_PORT): ");
    if ((s = dt_store_server_start(addr, 0, &b->w->auth, &b->w->server)) != DT_OK)
        return dt_error_wrap(s, "serving the rendezvous store on %s: ", addr);
    snprintf(line, n, "%s %d %s", addr, dt_store_server_port(b->w->server), secret);
    return DT_OK;
}

/* mpirun set no MASTER_ADDR/MASTER_PORT: rank 0's store address arrives through MPI.
 * Every rank then sets MASTER_ADDR and MASTER_PORT, so a later communicator of this
 * process finds the job the usual way, and DT_JOB_SECRET where the user set none. */
static dt_status boot_rendezvous(tcp_world *w, const dt_launch_env *env, const char *job, method_t *m) {
    boot_ctx b = {.w = w, .job = job, .all_local = env->local_size == env->size};
    char line[DT_MPI_BOOT_LINE], secret[80], port[16];
    DT_TRY(dt_mpi_boot(w->rank, w->size, boot_publish, &b, line));
    memset(m, 0, sizeof *m);
    if (sscanf(line, "%255s %d %79s", m->host, &m->port, secret) != 3 || m->port < 1 || m->port > 65535 ||
        strlen(secret) != 64)
        return dt_error(DT_ERR_FORMAT, "rendezvous through MPI: rank 0 sent '%.100s', expected ADDR PORT SECRET", line);
    snprintf(port, sizeof port, "%d", m->port);
    if (setenv("MASTER_ADDR", m->host, 1) != 0 || setenv("MASTER_PORT", port, 1) != 0 ||
        setenv("DT_JOB_SECRET", secret, 0) != 0)
        return dt_error(DT_ERR_NOMEM, "rendezvous through MPI: cannot set the environment: %s", strerror(errno));
    return dt_auth_init(&w->auth, job);   /* the job's secret, as every rank now has it */
}
#endif

/* ---- registration ------------------------------------------------------------------ */

static dt_status wait_ranks(tcp_world *w, dt_store *st, reg_t *regs, double deadline, double timeout) {
    char key[32];
    for (int i = 0; i < w->size; i++) {
        if (i == w->rank) continue;
        snprintf(key, sizeof key, "rank/%d", i);
        void *v = NULL;
        size_t n;
        double left = deadline - dt_now();
        dt_status s = dt_store_get(st, key, &v, &n, left > 0 ? left : 0);
        if (s == DT_ERR_TIMEOUT) {
            char missing[256] = "";
            size_t ml = 0;
            for (int j = i; j < w->size && ml < sizeof missing - 16; j++) {
                if (j == w->rank) continue;
                snprintf(key, sizeof key, "rank/%d", j);
                void *x = NULL;
                if (dt_store_get(st, key, &x, &n, 0) != DT_OK)
                    ml += (size_t)snprintf(missing + ml, sizeof missing - ml, "%s%d", ml ? "," : "", j);
                free(x);
            }
            return dt_error(DT_ERR_TIMEOUT, "timed out after %g s waiting for rank(s) %s to join", timeout, missing);
        }
        if (s != DT_OK) return s;
        reg_t *r = &regs[i];
        int k = sscanf(v, "%63s %d %d %llx %63s %255s", r->addr, &r->port, &r->pid, &r->nonce, r->boot, r->host);
        free(v);
        if (k != 6) return dt_error(DT_ERR_FORMAT, "rank %d registered a malformed address", i);
    }
    return DT_OK;
}

static dt_status check_world_size(tcp_world *w, dt_store *st, double deadline) {
    if (w->rank == 0) {
        char v[16];
        int n = snprintf(v, sizeof v, "%d", w->size);
        return dt_store_set(st, "world_size", v, (size_t)n);
    }
    void *v = NULL;
    size_t n;
    double left = deadline - dt_now();
    dt_status s = dt_store_get(st, "world_size", &v, &n, left > 0 ? left : 0);
    if (s != DT_OK) return dt_error_wrap(s, "waiting for rank 0 to publish the world size: ");
    int theirs = atoi(v);
    free(v);
    if (theirs != w->size)
        return dt_error(DT_ERR_MISMATCH, "world size mismatch: this process has WORLD_SIZE=%d, rank 0 has %d",
                        w->size, theirs);
    return DT_OK;
}

static dt_status claim_rank(tcp_world *w, dt_store *st, const reg_t *me) {
    char key[32];
    snprintf(key, sizeof key, "claim/%d", w->rank);
    int64_t n = 0;
    DT_TRY(dt_store_add(st, key, 1, &n));
    if (n <= 1) return DT_OK;
    snprintf(key, sizeof key, "rank/%d", w->rank);
    void *v = NULL;
    size_t vn;
    reg_t other = { .pid = 0 };
    snprintf(other.host, sizeof other.host, "another process");
    if (dt_store_get(st, key, &v, &vn, 2.0) == DT_OK) {
        if (sscanf(v, "%63s %d %d %llx %63s %255s", other.addr, &other.port, &other.pid, &other.nonce,
                   other.boot, other.host) != 6)
            other.pid = 0;
        free(v);
    }
    return dt_error(DT_ERR_INVALID, "rank %d is claimed twice: by %s:%d and by this process (%s:%d)",
                    w->rank, other.host, other.pid, me->host, me->pid);
}

/* ---- the mesh ------------------------------------------------------------------------ */

static void put_handshake(unsigned char *h, const tcp_world *w, int to, const char *job, unsigned long long nonce) {
    dt_put32(h, HS_MAGIC);
    dt_put32(h + 4, 1);
    dt_put32(h + 8, (unsigned)w->size);
    dt_put32(h + 12, (unsigned)w->rank);
    dt_put32(h + 16, (unsigned)to);
    dt_put32(h + 20, (unsigned)strlen(job));
    dt_put64(h + 24, nonce);
}

/* An authenticated connection whose handshake is still arriving. */
typedef struct {
    int fd;                                  /* -1: free */
    double deadline;
    size_t got;
    unsigned char in[HS_BYTES + DT_STORE_MAX_JOB];
} hs_pending;

#define HS_PENDING 64

/* Read what slot p's handshake has sent. 1: complete (HS_BYTES and its job id), 0: more
 * to come, -1: not one of us (closed). */
static int hs_read(hs_pending *p) {
    for (;;) {
        size_t need = HS_BYTES;
        if (p->got >= HS_BYTES) {
            if (dt_get32(p->in) != HS_MAGIC || dt_get32(p->in + 4) != 1 || dt_get32(p->in + 20) > DT_STORE_MAX_JOB)
                break;
            need += dt_get32(p->in + 20);
        }
        if (p->got == need) return 1;
        ssize_t r = recv(p->fd, p->in + p->got, need - p->got, MSG_DONTWAIT);
        if (r > 0) { p->got += (size_t)r; continue; }
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
        break;
    }
    close(p->fd);
    p->fd = -1;
    return -1;
}

/* Accept connections until every higher rank is connected. Only connections that proved
 * the job secret get past the gate; their handshakes are read side by side, each within
 * DT_AUTH_DEADLINE, so one that sends half a handshake and stalls holds up nobody; a
 * handshake that names another job, world or rank is closed and ignored. */
static dt_status accept_peers(tcp_world *w, int lfd, const char *job, unsigned long long my_nonce,
                              double deadline, double timeout) {
    int need = w->size - 1 - w->rank;
    if (need <= 0) return DT_OK;
    dt_gate *gate;
    DT_TRY(dt_gate_new(&w->auth, DT_AUTH_PEER, lfd, &gate));
    hs_pending *hs = malloc(HS_PENDING * sizeof *hs);
    if (!hs) { dt_gate_free(gate); return dt_error(DT_ERR_NOMEM, "out of memory"); }
    for (int k = 0; k < HS_PENDING; k++) hs[k].fd = -1;
    struct pollfd pf[HS_PENDING + 1 + DT_GATE_SLOTS];
    int idx[HS_PENDING];
    dt_status s = DT_OK;
    while (need > 0) {
        /* the authenticated connections the gate has, each a pending handshake (a full
         * list gives up its oldest) */
        int fd;
        while (dt_gate_accept(gate, 0, -1, &fd) == DT_OK) {
            int k = 0, old = 0;
            for (; k < HS_PENDING && hs[k].fd >= 0; k++) if (hs[k].deadline < hs[old].deadline) old = k;
            if (k == HS_PENDING) { close(hs[old].fd); k = old; }
            double dl = dt_now() + DT_AUTH_DEADLINE;
            hs[k] = (hs_pending){ .fd = fd, .deadline = dl < deadline ? dl : deadline, .got = 0 };
        }
        double now = dt_now(), next = deadline;
        int np = 0;
        for (int k = 0; k < HS_PENDING; k++) {
            if (hs[k].fd < 0) continue;
            if (hs[k].deadline <= now) { close(hs[k].fd); hs[k].fd = -1; continue; }
            if (hs[k].deadline < next) next = hs[k].deadline;
            idx[np] = k;
            pf[np++] = (struct pollfd){ .fd = hs[k].fd, .events = POLLIN };
        }
        if (now >= deadline) {
            char missing[256] = "", flood[512];
            size_t ml = 0;
            for (int j = w->rank + 1; j < w->size && ml < sizeof missing - 16; j++)
                if (w->peers[j].fd < 0) ml += (size_t)snprintf(missing + ml, sizeof missing - ml, "%s%d", ml ? "," : "", j);
            dt_gate_report(gate, flood, sizeof flood);
            s = dt_error(DT_ERR_TIMEOUT, "timed out after %g s waiting for rank(s) %s to connect%s", timeout, missing,
                         flood);
            break;
        }
        int nh = np;
        np += dt_gate_pollfds(gate, pf + np, 1 + DT_GATE_SLOTS);
        /* the gate's own deadlines are a fraction of a second: look at it that often */
        double wait = next - now;
        int ms = wait > DT_AUTH_STEP / 4 ? (int)(DT_AUTH_STEP / 4 * 1000) : (int)(wait * 1000) + 1;
        if (poll(pf, (nfds_t)np, ms) < 0 && errno != EINTR) {
            s = dt_error(DT_ERR_IO, "poll: %s", strerror(errno));
            break;
        }
        for (int j = 0; j < nh && need > 0; j++) {
            if (!pf[j].revents) continue;
            hs_pending *p = &hs[idx[j]];
            if (hs_read(p) <= 0) continue;
            const unsigned char *h = p->in;
            unsigned size = dt_get32(h + 8), from = dt_get32(h + 12), to = dt_get32(h + 16), jl = dt_get32(h + 20);
            unsigned long long nonce = dt_get64(h + 24);
            char pjob[DT_STORE_MAX_JOB + 1];
            memcpy(pjob, h + HS_BYTES, jl);
            pjob[jl] = '\0';
            unsigned char rep[16];
            dt_put32(rep, HS_REPLY);
            dt_put64(rep + 8, my_nonce);
            int good = size == (unsigned)w->size && to == (unsigned)w->rank && from > (unsigned)w->rank &&
                       from < (unsigned)w->size && w->peers[from].fd < 0 && strcmp(pjob, job) == 0 && nonce == my_nonce;
            dt_put32(rep + 4, good ? 0 : 1);
            fd = p->fd;
            p->fd = -1;
            if (dt_sock_write_all(fd, rep, sizeof rep, p->deadline) != DT_OK || !good) { close(fd); continue; }
            w->peers[from].fd = fd;
            need--;
        }
    }
    for (int k = 0; k < HS_PENDING; k++) if (hs[k].fd >= 0) close(hs[k].fd);
    free(hs);
    dt_gate_free(gate);
    return s;
}

static dt_status build_mesh(tcp_world *w, const reg_t *regs, int lfd, const char *job, unsigned long long my_nonce,
                            double deadline, double timeout) {
    size_t jl = strlen(job);
    for (int j = 0; j < w->rank; j++) {
        int fd;
        dt_status s = dt_auth_connect(&w->auth, regs[j].addr, regs[j].port, DT_AUTH_PEER, deadline, &fd);
        if (s != DT_OK)
            return dt_error_wrap(s, "connecting to rank %d (%s:%d): ", j, regs[j].host, regs[j].pid);
        w->peers[j].fd = fd;
        unsigned char h[HS_BYTES];
        put_handshake(h, w, j, job, regs[j].nonce);
        if ((s = dt_sock_write_all(fd, h, HS_BYTES, deadline)) != DT_OK ||
            (s = dt_sock_write_all(fd, job, jl, deadline)) != DT_OK)
            return dt_error_wrap(s, "handshake with rank %d (%s:%d): ", j, regs[j].host, regs[j].pid);
    }
    DT_TRY(accept_peers(w, lfd, job, my_nonce, deadline, timeout));
    for (int j = 0; j < w->rank; j++) {
        unsigned char rep[16];
        dt_status s = dt_sock_read_all(w->peers[j].fd, rep, sizeof rep, deadline);
        if (s != DT_OK)
            return dt_error_wrap(s, "handshake with rank %d (%s:%d): ", j, regs[j].host, regs[j].pid);
        if (dt_get32(rep) != HS_REPLY || dt_get32(rep + 4) != 0 || dt_get64(rep + 8) != regs[j].nonce)
            return dt_error(DT_ERR_PEER, "rank %d (%s:%d) refused the connection handshake", j, regs[j].host, regs[j].pid);
    }
    return DT_OK;
}

/* ---- sealing (seal.h) --------------------------------------------------------------------- */

#define SK_MAGIC 0x4b534454u   /* "DTSK": how a rank seals, and its nonce for the keys */
#define SK_BYTES (16 + DT_SEAL_NONCE)
#define SC_MAGIC 0x43534454u   /* "DTSC": the first sealed record each way */

/* After the mesh, every pair says how it seals its traffic (every rank must say the
 * same; also with sealing off, so that a rank that seals and one that does not are named
 * rather than left waiting) and, sealing, sends a fresh nonce for the connection's keys.
 * The first sealed record each way then proves that both ends hold the same keys: a
 * wrong secret or an altered exchange fails here, naming the peer. */
static dt_status seal_mesh(tcp_world *w, dt_comm *c, const reg_t *regs, double deadline) {
    int mode = c->secure;
    int aes = mode != DT_SEAL_OFF && dt_seal_have_aes();
    unsigned char *mine = calloc((size_t)w->size, DT_SEAL_NONCE);
    if (!mine) return dt_error(DT_ERR_NOMEM, "out of memory");
    dt_status s = DT_OK;
    for (int j = 0; s == DT_OK && j < w->size; j++) {
        if (j == w->rank) continue;
        unsigned char m[SK_BYTES];
        dt_put32(m, SK_MAGIC);
        dt_put32(m + 4, 1);
        dt_put32(m + 8, (unsigned)mode);
        dt_put32(m + 12, (unsigned)aes);
        if (mode != DT_SEAL_OFF) s = random_bytes(mine + (size_t)j * DT_SEAL_NONCE, DT_SEAL_NONCE);
        memcpy(m + 16, mine + (size_t)j * DT_SEAL_NONCE, DT_SEAL_NONCE);
        if (s == DT_OK) s = dt_sock_write_all(w->peers[j].fd, m, sizeof m, deadline);
        if (s != DT_OK) dt_error_wrap(s, "secure transport with rank %d (%s:%d): ", j, regs[j].host, regs[j].pid);
    }
    for (int j = 0; s == DT_OK && j < w->size; j++) {
        if (j == w->rank) continue;
        unsigned char m[SK_BYTES];
        s = dt_sock_read_all(w->peers[j].fd, m, sizeof m, deadline);
        if (s != DT_OK) {
            dt_error_wrap(s, "secure transport with rank %d (%s:%d): ", j, regs[j].host, regs[j].pid);
            break;
        }
        unsigned theirs = dt_get32(m + 8);
        if (dt_get32(m) != SK_MAGIC || dt_get32(m + 4) != 1)
            s = dt_error(DT_ERR_PEER, "rank %d (%s:%d) sent no secure transport message after the handshake", j,
                         regs[j].host, regs[j].pid);
        else if (theirs != (unsigned)mode)
            s = dt_error(DT_ERR_MISMATCH, "rank %d (%s:%d) runs with secure transport %s, this rank with %s: every "
                         "rank needs the same --secure-transport (DT_SECURE)", j, regs[j].host, regs[j].pid,
                         dt_seal_name((int)theirs), dt_seal_name(mode));
        else if (mode != DT_SEAL_OFF)
            s = dt_seal_new(&w->auth, mode, aes && dt_get32(m + 12) == 1, (unsigned)w->rank, (unsigned)j,
                            mine + (size_t)j * DT_SEAL_NONCE, m + 16, &w->peers[j].seal);
        if (s == DT_OK && mode != DT_SEAL_OFF && w->rank == w->size - 1 && dt_testing_fault() == DT_FAULT_SEAL_FLIP)
            dt_seal_testing_flip(w->peers[j].seal, (unsigned long long)dt_testing_fault_step());
    }
    sodium_memzero(mine, (size_t)w->size * DT_SEAL_NONCE);
    free(mine);
    const dt_seal *with_aes = NULL, *without = NULL;   /* a connection of each cipher, if any */
    for (int j = 0; s == DT_OK && j < w->size; j++)
        if (w->peers[j].seal) *(dt_seal_uses_aes(w->peers[j].seal) ? &with_aes : &without) = w->peers[j].seal;
    if (with_aes || without)
        snprintf(c->secure_desc, sizeof c->secure_desc, "%s (%s%s%s)", dt_seal_name(mode),
                 with_aes ? dt_seal_cipher(with_aes) : "", with_aes && without ? " and " : "",
                 without ? dt_seal_cipher(without) : "");
    for (int j = 0; s == DT_OK && mode != DT_SEAL_OFF && j < w->size; j++) {
        if (j == w->rank) continue;
        unsigned char m[12];
        dt_put32(m, SC_MAGIC);
        dt_put32(m + 4, (unsigned)w->rank);
        dt_put32(m + 8, (unsigned)j);
        if ((s = dt_seal_write_all(w->peers[j].seal, w->peers[j].fd, m, sizeof m, deadline)) != DT_OK)
            dt_error_wrap(s, "secure transport with rank %d (%s:%d): ", j, regs[j].host, regs[j].pid);
    }
    for (int j = 0; s == DT_OK && mode != DT_SEAL_OFF && j < w->size; j++) {
        if (j == w->rank) continue;
        unsigned char m[12];
        s = dt_seal_read_all(w->peers[j].seal, w->peers[j].fd, m, sizeof m, deadline);
        if (s == DT_OK && (dt_get32(m) != SC_MAGIC || dt_get32(m + 4) != (unsigned)j || dt_get32(m + 8) != (unsigned)w->rank))
            s = dt_error(DT_ERR_PEER, "its first sealed record is not the expected one");
        if (s != DT_OK)
            dt_error_wrap(s, "secure transport with rank %d (%s:%d), checking the keys (the job secrets differ, or "
                          "the connection was altered): ", j, regs[j].host, regs[j].pid);
    }
    return s;
}

/* ---- shared memory, open files --------------------------------------------------------- */

static int same_host(const reg_t *a, const reg_t *b) {
    return strcmp(a->host, b->host) == 0 && strcmp(a->boot, b->boot) == 0;
}

/* Same-host pairs get shared-memory rings when they first talk (tcp_ring.c); here each
 * peer is marked local or not (same host name and boot id), nothing is exchanged. */
static dt_status setup_shm(tcp_world *w, const reg_t *regs) {
    int local = 0, first = w->rank;
    for (int j = 0; j < w->size; j++) {
        tcp_peer *p = &w->peers[j];
        p->pid = regs[j].pid;
        p->local = j != w->rank && same_host(&regs[j], &regs[w->rank]);
        local += p->local;
        if (p->local && j < first) first = j;
    }
    w->cma_token = make_nonce();
    return tcp_ring_setup(w, local + 1, first == w->rank);
}

/* The job's first collective runs over TCP with every partner: a pair's ring is
 * offered at its first message and used from a later one (tcp_ring.c), and the
 * collectives meet each partner once per call (4-16 MiB all_reduce on 4 ranks: 0.3-0.8
 * GB/s for the first call, 5.4-7.4 after, 2026-12-04). So the same-host partners of the
 * collectives (algo.c: rank ^ 2^k; the ring's neighbours where the world is not a power of
 * two) exchange one byte twice at the start, outside the collective numbering: the first
 * carries the offers, the second the switch. Both sides of a pair walk the same list.
 * Off unless DT_SHM_WARM=1: measured with bench/cold.sh (2026-12-04, 2 cores), a job's
 * first all_reduce ran 1.0-2.2x faster with it on 4 ranks, but on 2 ranks at 16 MiB
 * three runs in five took 30 ms (0.5 GB/s) on the fresh rings against 2-8 ms over TCP:
 * not a gain to turn on for everyone until that is understood. */
static dt_status warm_rings(dt_comm *c, tcp_comm *tc) {
    tcp_world *w = tc->w;
    const int r = c->rank, n = c->size;
    const char *e = getenv("DT_SHM_WARM");   /* 1: make them now; else at first use */
    if (!w->shm || n < 2 || !e || strcmp(e, "1") != 0) return DT_OK;
    dt_call call = { .kind = DT_CALL_P2P, .dtype = DT_U8, .count = 1, .root = -1, .tag = -1, .ctx = c->ctx };
    snprintf(call.desc, sizeof call.desc, "the shared-memory rings' set-up with the same-host ranks");
    unsigned char out = 1, in = 0;
    for (int round = 0; round < 2; round++) {
        for (int k = 0; (1 << k) < n; k++) {
            int q = r ^ (1 << k);
            if (q >= n || !w->peers[tc->map[q]].local) continue;
            dt_xfer x = { .dst = q, .sbuf = &out, .sbytes = 1, .src = q, .rbuf = &in, .rbytes = 1 };
            DT_TRY(tcp_xfer(tc, &x, &call));
        }
        if ((n & (n - 1)) == 0) continue;
        int next = (r + 1) % n, prev = (r + n - 1) % n;
        dt_xfer x = { .dst = w->peers[tc->map[next]].local ? next : -1, .sbuf = &out, .sbytes = 1,
                      .src = w->peers[tc->map[prev]].local ? prev : -1, .rbuf = &in, .rbytes = 1 };
        if (x.dst >= 0 || x.src >= 0) DT_TRY(tcp_xfer(tc, &x, &call));
    }
    return DT_OK;
}

/* A socket per peer, and on rank 0 one per rank for the store, plus a margin for the
 * program's own files: raise the soft limit on open files to the hard one if that is
 * short, or say what to change. The gates' pending connections (the peer port's, and
 * the store's on rank 0) want room too, but a gate short of descriptors sheds its
 * oldest stranger, so only a limit short of the first count is an error. */
static dt_status fd_limit(int size, int rank) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return DT_OK;
    rlim_t need = (rlim_t)size * (rank == 0 ? 2 : 1) + 64;
    rlim_t want = need + (rlim_t)(rank == 0 ? 2 : 1) * (DT_GATE_SLOTS + 1);
    if (rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= want) return DT_OK;
    if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < need)
        return dt_error(DT_ERR_INVALID, "a world of %d ranks needs about %llu open files on rank %d (a connection per "
                        "peer%s), but the hard limit is %llu: raise it (ulimit -Hn, /etc/security/limits.conf, "
                        "LimitNOFILE= of a systemd unit)", size, (unsigned long long)need, rank,
                        rank == 0 ? " and one per rank for the store" : "", (unsigned long long)rl.rlim_max);
    if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max <= rl.rlim_cur) return DT_OK;   /* enough for need already */
    rl.rlim_cur = rl.rlim_max == RLIM_INFINITY ? want : rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
        return dt_error(DT_ERR_IO, "cannot raise the limit on open files to %llu (a world of %d ranks needs "
                        "about %llu): %s", (unsigned long long)rl.rlim_cur, size, (unsigned long long)need,
                        strerror(errno));
    return DT_OK;
}

/* ---- backend entries ----------------------------------------------------------------- */

static void world_release(tcp_world *w) {
    if (!w || --w->refs > 0) return;
    for (int i = 0; w->peers && i < w->size; i++) {
        if (w->peers[i].fd >= 0) close(w->peers[i].fd);
        dt_seal_free(w->peers[i].seal);
        dt_shm_close(w->peers[i].in);
        dt_shm_close(w->peers[i].out);
    }
    free(w->peers);
    dt_store_close(w->store);
    dt_store_server_stop(w->server);
    if (w->file_path[0]) unlink(w->file_path);
    free(w->stage);
    free(w);
}

static void tcp_destroy(dt_comm *c) {
    tcp_comm *tc = c->priv;
    if (!tc) return;
    world_release(tc->w);
    free(tc->map);
    free(tc);
    c->priv = NULL;
}

static dt_status fill_comm(dt_comm *c, tcp_world *w, const reg_t *regs) {
    int n = w->size;
    c->hosts = calloc((size_t)n, sizeof *c->hosts);
    c->pids = calloc((size_t)n, sizeof *c->pids);
    if (!c->hosts || !c->pids) return dt_error(DT_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n; i++) {
        if (!(c->hosts[i] = strdup(regs[i].host))) return dt_error(DT_ERR_NOMEM, "out of memory");
        c->pids[i] = regs[i].pid;
    }
    /* nodes are numbered in the order of their first rank */
    int node = 0;
    c->local_rank = 0;
    c->local_size = 0;
    for (int i = 0; i < n; i++) {
        int first = 1;
        for (int j = 0; j < i && first; j++) if (same_host(&regs[i], &regs[j])) first = 0;
        if (first && i <= w->rank && !same_host(&regs[i], &regs[w->rank])) node++;
        if (same_host(&regs[i], &regs[w->rank])) {
            if (i < w->rank) c->local_rank++;
            c->local_size++;
        }
    }
    c->node_rank = node;
    return DT_OK;
}

static dt_status tcp_init(dt_comm *c, const dt_comm_opts *opts) {
    dt_launch_env env;
    dt_status s = dt_launch_env_discover(&env);
    int explicit_ids = opts->rank >= 0 && opts->size > 0;
    if (s != DT_OK && !explicit_ids) return s;
    if (s != DT_OK) memset(&env, 0, sizeof env);
    int rank = opts->rank >= 0 ? opts->rank : env.rank, size = opts->size > 0 ? opts->size : env.size;
    if (rank < 0 || size < 1)
        return dt_error(DT_ERR_INVALID, "cannot tell this process's rank and world size: set RANK and WORLD_SIZE "
                        "(or start it with dtrun, mpirun or srun)");
    c->rank = rank;
    c->size = size;
    if (rank >= size) return dt_error(DT_ERR_INVALID, "rank %d is out of range for world size %d", rank, size);
    if (!opts->job_id) snprintf(c->job_id, sizeof c->job_id, "%s", env.job_id);
    method_t m;
    int boot = 0;   /* mpirun gave no master: rank 0's store address comes through MPI */
#ifdef DT_HAVE_MPI
    boot = size > 1 && (!opts->init_method || strcmp(opts->init_method, "env://") == 0) && !env.master_addr[0] &&
           env.master_port <= 0 && dt_mpi_boot_available(env.source);
#endif
    if (!boot && (size > 1 || opts->init_method)) DT_TRY(parse_method(opts->init_method, &env, &m));

    tcp_world *w = calloc(1, sizeof *w);
    tcp_comm *tc = calloc(1, sizeof *tc);
    reg_t *regs = calloc((size_t)size, sizeof *regs);
    if (!w || !tc || !regs || !(w->peers = calloc((size_t)size, sizeof *w->peers)) ||
        !(tc->map = calloc((size_t)size, sizeof *tc->map))) {
        free(regs);
        if (w) free(w->peers);
        free(w);
        if (tc) free(tc->map);
        free(tc);
        return dt_error(DT_ERR_NOMEM, "out of memory");
    }
    w->rank = rank;
    w->size = size;
    w->refs = 1;
    for (int i = 0; i < size; i++) { w->peers[i].fd = -1; tc->map[i] = i; }
    tc->w = w;
    tc->c = c;
    c->priv = tc;

    reg_t *me = &regs[rank];
    me->pid = (int)getpid();
    if (gethostname(me->host, sizeof me->host - 1) != 0 || !me->host[0]) snprintf(me->host, sizeof me->host, "localhost");
    for (char *p = me->host; *p; p++) if (*p == ' ') *p = '_';
    read_boot_id(me->boot, sizeof me->boot);
    me->nonce = make_nonce();

    double timeout = c->timeout_s, deadline = dt_now() + timeout;
    int lfd = -1;
    const char *job = c->job_id;
    if (size == 1) goto done;
    if ((s = fd_limit(size, rank)) != DT_OK) goto fail;

    /* a bad DT_SOCKET_IFNAME or secret fails every rank alike, before anyone waits for anyone */
    if (getenv("DT_SOCKET_IFNAME") && (s = dt_sock_pick_addr("127.0.0.1", me->addr, sizeof me->addr)) != DT_OK)
        goto fail;
    if ((s = dt_auth_init(&w->auth, job)) != DT_OK) goto fail;

    /* 1-2: the store */
#ifdef DT_HAVE_MPI
    if (boot && (s = boot_rendezvous(w, &env, job, &m)) != DT_OK) goto fail;
#endif
    char store_host[256];
    if (m.file) {
        if (rank == 0) {
            char addr[64], fresh[65] = "";
            if (dt_sock_pick_addr("8.8.8.8", addr, sizeof addr) != DT_OK) snprintf(addr, sizeof addr, "127.0.0.1");
            if (!w->auth.has_secret && !dt_auth_is_loopback(addr)) {
                /* the rendezvous file is private (mode 0600): it carries the job's secret */
                dt_auth_new_secret(fresh);
                if ((s = dt_auth_init_secret(&w->auth, job, fresh, strlen(fresh))) != DT_OK) goto fail;
            }
            if ((s = dt_store_server_start(addr, 0, &w->auth, &w->server)) != DT_OK) goto fail;
            unsigned long long nonce = make_nonce();
            char nv[32];
            int nl = snprintf(nv, sizeof nv, "%llx", nonce);
            if ((s = dt_store_connect(addr, dt_store_server_port(w->server), &w->auth, timeout, &w->store)) != DT_OK ||
                (s = dt_store_set(w->store, "nonce", nv, (size_t)nl)) != DT_OK ||
                (s = file_publish(m.path, job, addr, dt_store_server_port(w->server), nonce, fresh)) != DT_OK)
                goto fail;
            snprintf(w->file_path, sizeof w->file_path, "%s", m.path);
            snprintf(store_host, sizeof store_host, "%s", addr);
        } else if ((s = file_connect(m.path, &w->auth, deadline, store_host, sizeof store_host, &w->store)) != DT_OK) {
            goto fail;
        }
    } else {
        snprintf(store_host, sizeof store_host, "%s", m.host);
        if ((s = dt_auth_allow(&w->auth, m.host)) != DT_OK) goto fail;
        if (rank == 0 && !w->server) {
            /* serve on the master address itself when it is one of ours, else on the
             * chosen interface: never on every interface */
            char bind_addr[64];
            if ((s = dt_sock_bind_addr(m.host, bind_addr, sizeof bind_addr)) != DT_OK) goto fail;
            if ((s = dt_store_server_start(bind_addr, m.port, &w->auth, &w->server)) != DT_OK) {
                dt_error_wrap(s, "cannot serve the rendezvous store on %s:%d (is another job using the port?): ",
                              bind_addr, m.port);
                goto fail;
            }
            snprintf(store_host, sizeof store_host, "%s", bind_addr);
        }
        if ((s = dt_store_connect(store_host, m.port, &w->auth, timeout, &w->store)) != DT_OK) goto fail;
    }
    if (m.file) snprintf(c->rendezvous, sizeof c->rendezvous, "file://%.300s", m.path);
    else snprintf(c->rendezvous, sizeof c->rendezvous, "%s%s:%d", boot ? "mpirun " : opts->init_method &&
                  strncmp(opts->init_method, "tcp://", 6) == 0 ? "tcp://" : "env:// ", m.host, m.port);
    /* a store host that stops answering is reported within the job's timeout, not 30 s later */
    dt_store_set_slack(w->store, timeout < 30 ? timeout : 30);
    /* the address peers reach us at: the interface that routes to the store */
    if ((s = dt_sock_pick_addr(store_host, me->addr, sizeof me->addr)) != DT_OK)
        goto fail;
    if ((s = dt_auth_allow(&w->auth, me->addr)) != DT_OK) goto fail;
    if ((s = dt_sock_listen(me->addr, 0, &lfd, &me->port)) != DT_OK) goto fail;

    if ((s = check_world_size(w, w->store, deadline)) != DT_OK) goto fail;
    if ((s = claim_rank(w, w->store, me)) != DT_OK) goto fail;
    char key[32], val[512];
    snprintf(key, sizeof key, "rank/%d", rank);
    int vl = snprintf(val, sizeof val, "%s %d %d %llx %s %s", me->addr, me->port, me->pid, me->nonce, me->boot, me->host);
    if ((s = dt_store_set(w->store, key, val, (size_t)vl)) != DT_OK) goto fail;
    if ((s = wait_ranks(w, w->store, regs, deadline, timeout)) != DT_OK) {
        char flood[512];
        dt_store_server_report(w->server, flood, sizeof flood);
        if (flood[0]) dt_error_wrap(s, "%s: ", flood + 2);   /* "meanwhile N ... were dropped: " */
        goto fail;
    }

    /* 3-4: mesh and shared memory */
    if (c->secure != DT_SEAL_OFF && !w->auth.has_secret) {
        s = dt_error(DT_ERR_INVALID, "secure transport (%s) needs a job secret (DT_JOB_SECRET or DT_JOB_SECRET_FILE; "
                     "dtrun makes one): without one anybody could compute the keys", dt_seal_name(c->secure));
        goto fail;
    }
    if ((s = build_mesh(w, regs, lfd, job, me->nonce, deadline, timeout)) != DT_OK) goto fail;
    if ((s = seal_mesh(w, c, regs, deadline)) != DT_OK) goto fail;
    close(lfd);
    lfd = -1;
    if ((s = setup_shm(w, regs)) != DT_OK) goto fail;
    {
        /* When every local rank can have a core of its own, a blocked caller spins like
         * MPI does (yielding hands the core to whatever else runs, and getting it back
         * costs a scheduler round), while the async worker, which shares the process's
         * cores with computation, sleeps soon. With more local ranks than cores the peer a
         * rank waits for may be queued behind it on its own core: there it spins by
         * sched_yield, as Open MPI does when oversubscribed, and longer (200 us), since a
         * sleep on the ring's futex costs a wake-up (4 ranks on 2 cores, dtbench 4 KiB
         * to 128 KiB, 2026-12-03: 14-45 us a call yielding for 20-200 us; 13-160 us, most
         * runs about 110, pausing 5 us then sleeping; a 500 us pause-spin took 1 ms). */
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        int local = 0;
        for (int i = 0; i < size; i++) local += same_host(&regs[i], me);
        const char *spin = getenv("DT_SHM_SPIN_US");
        int own_core = cores >= local;
        w->spin_s = spin && *spin ? atof(spin) * 1e-6 : own_core ? 1e-3 : 200e-6;
        w->spin_worker_s = spin && *spin ? atof(spin) * 1e-6 : own_core ? 20e-6 : 5e-6;
        w->spin_yield = !own_core;
    }
done:
    if ((s = fill_comm(c, w, regs)) != DT_OK) goto fail;
    free(regs);
    c->p2p = (dt_p2p){ .ctx = tc, .rank = rank, .size = size, .xfer = tcp_xfer };
    if ((s = warm_rings(c, tc)) != DT_OK) goto fail_late;
    return DT_OK;
fail_late:
    tcp_destroy(c);
    return s;
fail:
    if (lfd >= 0) close(lfd);
    free(regs);
    tcp_destroy(c);
    return s;
}

static dt_status tcp_split(dt_comm *parent, const dt_call *call, int color, int key, dt_comm *child) {
    (void)call; (void)color; (void)key;
    if (!child) return DT_OK;
    tcp_comm *ptc = parent->priv, *tc = calloc(1, sizeof *tc);
    if (!tc || !(tc->map = calloc((size_t)child->size, sizeof *tc->map))) {
        free(tc);
        return dt_error(DT_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; i < child->size; i++) tc->map[i] = ptc->map[child->parent_ranks[i]];
    tc->w = ptc->w;
    tc->w->refs++;
    tc->c = child;
    child->priv = tc;
    child->p2p = (dt_p2p){ .ctx = tc, .rank = child->rank, .size = child->size, .xfer = tcp_xfer };
    return DT_OK;
}

const dt_backend dt_backend_tcp = {
    .name          = "tcp",
    .init          = tcp_init,
    .destroy       = tcp_destroy,
    .split         = tcp_split,
    .split_destroy = tcp_destroy,
};
