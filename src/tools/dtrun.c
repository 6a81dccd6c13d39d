/*
 * dtrun.c: start the N ranks of a job on this node and watch over them.
 *
 *   dtrun -n 2 ./dtbench -o all_reduce
 *
 * It does what torchrun does for PyTorch, for any program: every rank gets RANK,
 * LOCAL_RANK, WORLD_SIZE, ... (the variables launch_env.c reads), its stdout and stderr
 * come back through pipes with a "[rankK]:" prefix on every whole line, and the job
 * ends as a unit: the first rank that fails takes the others down (SIGTERM, then
 * SIGKILL after a grace period) and dtrun names it, so a crash on one rank never
 * leaves the others hanging in a collective (DESIGN.md rule 3).
 *
 * No rank outlives dtrun: the ranks share their own process group, which dtrun
 * signals as a whole (grandchildren included), and each child asks the kernel for
 * SIGKILL if dtrun dies (PR_SET_PDEATHSIG) in case dtrun itself is killed with SIGKILL.
 *
 * Structure, so that multiple nodes and restarts fit later: a job is described by
 * dtrun_cfg (nnodes and node_rank are fixed to 1 and 0 today), one attempt is
 * spawn_ranks() + supervise(), which returns an outcome saying who failed first and
 * how; a restart loop would call them again with a new port and attempt number.
 *
 * Everything runs in one thread with poll(): rank output pipes and a signalfd for
 * SIGCHLD, SIGINT, SIGTERM and SIGHUP, so there is no signal-handler reentrancy.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define DTRUN_MAX_RANKS  4096
#define DTRUN_LINE_MAX   (4u << 20)   /* a "line" longer than this is flushed in pieces */
#define DTRUN_DRAIN_S    2.0          /* after the ranks exit, wait this long for pipes to close */

static const char usage[] =
"usage: dtrun -n N [options] [--] PROGRAM [ARGS...]\n"
"\n"
"Start N ranks of PROGRAM on this node, each with the launch variables dtrain (and\n"
"torchrun-style programs) read, and supervise them as one job.\n"
"\n"
"options:\n"
"  -n N, --nproc-per-node N  number of ranks to start (1..4096; required)\n"
"  --master-addr A           rendezvous address given to the ranks (default 127.0.0.1)\n"
"  --master-port P           rendezvous port (default: a free port chosen by dtrun)\n"
"  --grace S                 seconds between SIGTERM and SIGKILL when the job is\n"
"                            being stopped (default 5)\n"
"  -h, --help                this text\n"
"  --                        end of options (PROGRAM may also simply follow them)\n"
"\n"
"every rank's environment:\n"
"  RANK, LOCAL_RANK          0..N-1\n"
"  WORLD_SIZE, LOCAL_WORLD_SIZE   N\n"
"  NODE_RANK, GROUP_RANK     0\n"
"  MASTER_ADDR, MASTER_PORT  as above\n"
"  DT_JOB_ID                 inherited if set, else a fresh random id shared by the ranks\n"
"  OMP_NUM_THREADS, OPENBLAS_NUM_THREADS   max(1, cores / N) unless already set\n"
"stdin of every rank is /dev/null.\n"
"\n"
"output: each line a rank writes is printed whole, prefixed \"[rankK]:\", on dtrun's\n"
"stdout or stderr like the rank wrote it; a last line without a newline is printed\n"
"with one added.\n"
"\n"
"failure: when a rank exits non-zero or is killed by a signal, dtrun sends SIGTERM\n"
"to the other ranks, SIGKILL after the grace period, and prints\n"
"  dtrun: rank K (pid P) failed first: exit code C   (or: killed by signal SIGNAME)\n"
"SIGINT, SIGTERM and SIGHUP sent to dtrun are forwarded to every rank (a second one\n"
"sends SIGKILL); dtrun waits for all ranks before it exits. Ranks run in their own\n"
"process group and are killed if dtrun dies.\n"
"\n"
"exit status:\n"
"  0        every rank exited 0\n"
"  C        the first rank to fail exited with code C\n"
"  128+S    the first rank to fail was killed by signal S, or dtrun itself was\n"
"           stopped by signal S (130 for SIGINT)\n"
"  1        dtrun could not start the job (fork, pipe, exec setup failed)\n"
"  2        bad command line\n";

/* ---- configuration ------------------------------------------------------------------ */

typedef struct {
    int    nproc;          /* ranks on this node */
    int    nnodes;         /* always 1 for now */
    int    node_rank;      /* always 0 for now */
    char   master_addr[256];
    int    master_port;    /* 0: pick a free one */
    double grace_s;
    char   job_id[64];     /* generated id, or "" to keep the inherited DT_JOB_ID */
    char **argv;           /* PROGRAM ARGS..., NULL-terminated */
} dtrun_cfg;

static void die_usage(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die_usage(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("dtrun: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputs(" (see dtrun --help)\n", stderr);
    va_end(ap);
    exit(2);
}

static long parse_long_flag(const char *flag, const char *v, long lo, long hi) {
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (!*v || *end || errno || x < lo || x > hi)
        die_usage("%s: expected an integer in %ld..%ld, got '%s'", flag, lo, hi, v);
    return x;
}

/* "--flag VALUE" or "--flag=VALUE": return the value and advance *i. */
static const char *flag_value(int argc, char **argv, int *i, const char *name) {
    const char *a = argv[*i];
    size_t n = strlen(name);
    if (strncmp(a, name, n) == 0 && a[n] == '=') return a + n + 1;
    if (*i + 1 >= argc) die_usage("%s: missing value", name);
    return argv[++*i];
}

static int flag_is(const char *a, const char *name) {
    size_t n = strlen(name);
    return strncmp(a, name, n) == 0 && (a[n] == '\0' || a[n] == '=');
}

static void parse_args(int argc, char **argv, dtrun_cfg *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->nproc = 0;
    cfg->nnodes = 1;
    cfg->grace_s = 5.0;
    snprintf(cfg->master_addr, sizeof cfg->master_addr, "127.0.0.1");
    int i = 1;
    for (; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--") == 0) { i++; break; }
        if (a[0] != '-' || a[1] == '\0') break;   /* PROGRAM */
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            fputs(usage, stdout);
            exit(0);
        } else if (strcmp(a, "-n") == 0 || flag_is(a, "--nproc-per-node")) {
            const char *name = a[1] == 'n' ? "-n" : "--nproc-per-node";
            cfg->nproc = (int)parse_long_flag(name, flag_value(argc, argv, &i, name), 1, DTRUN_MAX_RANKS);
        } else if (strncmp(a, "-n", 2) == 0 && a[2] != '-') {
            cfg->nproc = (int)parse_long_flag("-n", a + 2, 1, DTRUN_MAX_RANKS);
        } else if (flag_is(a, "--master-addr")) {
            const char *v = flag_value(argc, argv, &i, "--master-addr");
            if (!*v || strlen(v) >= sizeof cfg->master_addr)
                die_usage("--master-addr: expected a host name or address, got '%s'", v);
            snprintf(cfg->master_addr, sizeof cfg->master_addr, "%s", v);
        } else if (flag_is(a, "--master-port")) {
            cfg->master_port = (int)parse_long_flag("--master-port",
                                   flag_value(argc, argv, &i, "--master-port"), 1, 65535);
        } else if (flag_is(a, "--grace")) {
            const char *v = flag_value(argc, argv, &i, "--grace");
            char *end;
            errno = 0;
            double g = strtod(v, &end);
            if (!*v || *end || errno || !(g >= 0 && g <= 3600))
                die_usage("--grace: expected seconds in 0..3600, got '%s'", v);
            cfg->grace_s = g;
        } else {
            die_usage("unknown option '%s'", a);
        }
    }
    if (cfg->nproc == 0) die_usage("-n N (the number of ranks) is required");
    if (i >= argc) die_usage("no program to run");
    cfg->argv = argv + i;
}

/* ---- small helpers -------------------------------------------------------------------- */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static const char *signame(int sig) {
    static char buf[32];
    switch (sig) {
    case SIGHUP: return "SIGHUP";   case SIGINT: return "SIGINT";   case SIGQUIT: return "SIGQUIT";
    case SIGILL: return "SIGILL";   case SIGTRAP: return "SIGTRAP"; case SIGABRT: return "SIGABRT";
    case SIGBUS: return "SIGBUS";   case SIGFPE: return "SIGFPE";   case SIGKILL: return "SIGKILL";
    case SIGUSR1: return "SIGUSR1"; case SIGSEGV: return "SIGSEGV"; case SIGUSR2: return "SIGUSR2";
    case SIGPIPE: return "SIGPIPE"; case SIGALRM: return "SIGALRM"; case SIGTERM: return "SIGTERM";
    case SIGXCPU: return "SIGXCPU"; case SIGXFSZ: return "SIGXFSZ"; case SIGSYS: return "SIGSYS";
    }
    snprintf(buf, sizeof buf, "signal %d", sig);
    return buf;
}

/* Write all of buf; on EPIPE (our reader went away) stop writing to that fd for good. */
static void write_all(int fd, const char *buf, size_t n) {
    static int dead[3];
    if (fd < 3 && dead[fd]) return;
    while (n > 0) {
        ssize_t w = write(fd, buf, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            if (fd < 3) dead[fd] = 1;
            return;
        }
        buf += w;
        n -= (size_t)w;
    }
}

/* A free TCP port: bind port 0, read what the kernel chose, release it. The ranks bind
 * it again moments later; a race with another program is possible but rare. */
static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return 0;
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_ANY);
    sa.sin_port = 0;
    socklen_t len = sizeof sa;
    int port = 0;
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0 &&
        getsockname(fd, (struct sockaddr *)&sa, &len) == 0)
        port = ntohs(sa.sin_port);
    close(fd);
    return port;
}

static int usable_cores(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int n = CPU_COUNT(&set);
        if (n > 0) return n;
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

/* ---- ranks and their output ------------------------------------------------------------ */

/* The unfinished line of one stream of one rank. */
typedef struct {
    int    fd;        /* read end of the pipe; -1 once closed */
    int    out;       /* 1 or 2: where its lines go */
    char  *buf;
    size_t len, cap;
} dtrun_stream;

typedef struct {
    int          rank;
    pid_t        pid;     /* 0 once reaped */
    int          status;  /* wait status once reaped */
    int          reaped;
    dtrun_stream s[2];    /* stdout, stderr */
} dtrun_rank;

typedef struct {
    int   failed_rank;   /* -1: nobody failed */
    pid_t failed_pid;
    int   failed_status;
    int   signal;        /* a signal that stopped dtrun, 0 if none */
} dtrun_outcome;

/* Print one line "[rankK]:" + text + "\n" with a single write, so lines of different
 * ranks never interleave. */
static void emit_line(int out, int rank, const char *text, size_t n) {
    char pre[32];
    int pn = snprintf(pre, sizeof pre, "[rank%d]:", rank);
    char stackbuf[8192];
    char *line = n + (size_t)pn + 1 <= sizeof stackbuf ? stackbuf : malloc(n + (size_t)pn + 1);
    if (!line) {   /* no memory: still print, in pieces */
        write_all(out, pre, (size_t)pn);
        write_all(out, text, n);
        write_all(out, "\n", 1);
        return;
    }
    memcpy(line, pre, (size_t)pn);
    memcpy(line + pn, text, n);
    line[(size_t)pn + n] = '\n';
    write_all(out, line, (size_t)pn + n + 1);
    if (line != stackbuf) free(line);
}

/* Read what is available; print every complete line; at EOF print the rest and close. */
static void stream_read(dtrun_stream *st, int rank) {
    for (;;) {
        if (st->cap - st->len < 65536) {
            size_t cap = st->cap ? st->cap * 2 : 65536 * 2;
            char *b = realloc(st->buf, cap);
            if (!b) {   /* keep going with what we have: flush the partial line */
                emit_line(st->out, rank, st->buf, st->len);
                st->len = 0;
                if (st->cap - st->len < 1) return;
            } else {
                st->buf = b;
                st->cap = cap;
            }
        }
        ssize_t r = read(st->fd, st->buf + st->len, st->cap - st->len);
        if (r < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return;
            r = 0;   /* treat a read error as EOF */
        }
        if (r == 0) {
            if (st->len) emit_line(st->out, rank, st->buf, st->len);
            st->len = 0;
            close(st->fd);
            st->fd = -1;
            return;
        }
        size_t start = 0, end = st->len + (size_t)r;
        for (size_t i = st->len; i < end; i++)
            if (st->buf[i] == '\n') {
                emit_line(st->out, rank, st->buf + start, i - start);
                start = i + 1;
            }
        st->len = end - start;
        memmove(st->buf, st->buf + start, st->len);
        if (st->len >= DTRUN_LINE_MAX) {   /* runaway line: print it in pieces */
            emit_line(st->out, rank, st->buf, st->len);
            st->len = 0;
        }
    }
}

/* In the child, after fork: become rank r and exec the program. Never returns. */
static void child_exec(const dtrun_cfg *cfg, const dtrun_rank *rk, int pgid, pid_t parent,
                       int out_w, int err_w, const char *threads) {
    /* die with dtrun, even if dtrun is SIGKILLed; then check dtrun did not die already */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent) _exit(127);
    setpgid(0, pgid);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    signal(SIGPIPE, SIG_DFL);
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull < 0 || dup2(devnull, 0) < 0 || dup2(out_w, 1) < 0 || dup2(err_w, 2) < 0) _exit(127);
    if (devnull > 2) close(devnull);   /* the pipe ends are close-on-exec already */
    char v[64];
    int global = cfg->node_rank * cfg->nproc + rk->rank;
    snprintf(v, sizeof v, "%d", global);                    setenv("RANK", v, 1);
    snprintf(v, sizeof v, "%d", rk->rank);                  setenv("LOCAL_RANK", v, 1);
    snprintf(v, sizeof v, "%d", cfg->nnodes * cfg->nproc);  setenv("WORLD_SIZE", v, 1);
    snprintf(v, sizeof v, "%d", cfg->nproc);                setenv("LOCAL_WORLD_SIZE", v, 1);
    snprintf(v, sizeof v, "%d", cfg->node_rank);            setenv("NODE_RANK", v, 1);
    setenv("GROUP_RANK", v, 1);
    setenv("MASTER_ADDR", cfg->master_addr, 1);
    snprintf(v, sizeof v, "%d", cfg->master_port);          setenv("MASTER_PORT", v, 1);
    if (cfg->job_id[0]) setenv("DT_JOB_ID", cfg->job_id, 1);
    setenv("OMP_NUM_THREADS", threads, 0);
    setenv("OPENBLAS_NUM_THREADS", threads, 0);
    execvp(cfg->argv[0], cfg->argv);
    dprintf(2, "dtrun: cannot run '%s': %s\n", cfg->argv[0], strerror(errno));
    _exit(127);
}

/* Fork the ranks. On failure the ranks already started are killed and reaped. */
static int spawn_ranks(const dtrun_cfg *cfg, dtrun_rank *rk, pid_t *pgid) {
    char threads[16];
    int t = usable_cores() / cfg->nproc;
    snprintf(threads, sizeof threads, "%d", t < 1 ? 1 : t);
    pid_t parent = getpid();
    *pgid = 0;
    for (int r = 0; r < cfg->nproc; r++) {
        int po[2], pe[2];
        rk[r].rank = r;
        rk[r].s[0].fd = rk[r].s[1].fd = -1;
        rk[r].s[0].out = 1;
        rk[r].s[1].out = 2;
        if (pipe2(po, O_CLOEXEC) != 0) goto fail;
        if (pipe2(pe, O_CLOEXEC) != 0) { close(po[0]); close(po[1]); goto fail; }
        fflush(NULL);
        pid_t pid = fork();
        if (pid < 0) { close(po[0]); close(po[1]); close(pe[0]); close(pe[1]); goto fail; }
        if (pid == 0) child_exec(cfg, &rk[r], *pgid, parent, po[1], pe[1], threads);
        /* also set the group here, so kill(-pgid) reaches the child before it runs */
        (void)setpgid(pid, *pgid);   /* EACCES once the child has exec'd: it set it itself */
        if (*pgid == 0) *pgid = pid;
        rk[r].pid = pid;
        close(po[1]);
        close(pe[1]);
        rk[r].s[0].fd = po[0];
        rk[r].s[1].fd = pe[0];
        fcntl(po[0], F_SETFL, O_NONBLOCK);
        fcntl(pe[0], F_SETFL, O_NONBLOCK);
        continue;
    fail:
        fprintf(stderr, "dtrun: cannot start rank %d: %s\n", r, strerror(errno));
        for (int q = 0; q < r; q++) {
            kill(rk[q].pid, SIGKILL);
            waitpid(rk[q].pid, NULL, 0);
            rk[q].reaped = 1;
            for (int k = 0; k < 2; k++) if (rk[q].s[k].fd >= 0) close(rk[q].s[k].fd);
        }
        return -1;
    }
    return 0;
}

static void signal_ranks(dtrun_rank *rk, int n, pid_t pgid, int sig) {
    if (pgid > 0) kill(-pgid, sig);   /* the whole group: grandchildren too */
    for (int r = 0; r < n; r++)
        if (!rk[r].reaped) kill(rk[r].pid, sig);   /* in case a rank left the group */
}

static int rank_failed(int status) {
    return !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/* Run the job until every rank is reaped and its output drained. */
static void supervise(const dtrun_cfg *cfg, dtrun_rank *rk, pid_t pgid, int sfd, dtrun_outcome *oc) {
    int n = cfg->nproc, alive = n;
    double kill_at = 0;   /* > 0: SIGKILL the group at this time */
    double drain_until = 0;
    int stopping = 0;
    oc->failed_rank = -1;
    oc->signal = 0;
    struct pollfd *pfd = calloc((size_t)(2 * n + 1), sizeof *pfd);
    dtrun_stream **which = calloc((size_t)(2 * n + 1), sizeof *which);
    int *rank_of = calloc((size_t)(2 * n + 1), sizeof *rank_of);
    if (!pfd || !which || !rank_of) {
        fprintf(stderr, "dtrun: out of memory; stopping the ranks\n");
        signal_ranks(rk, n, pgid, SIGKILL);
        for (int r = 0; r < n; r++) if (!rk[r].reaped) waitpid(rk[r].pid, &rk[r].status, 0);
        oc->failed_rank = -2;
        free(pfd); free(which); free(rank_of);
        return;
    }
    for (;;) {
        int np = 0;
        pfd[np].fd = sfd; pfd[np].events = POLLIN; np++;
        for (int r = 0; r < n; r++)
            for (int k = 0; k < 2; k++)
                if (rk[r].s[k].fd >= 0) {
                    pfd[np].fd = rk[r].s[k].fd;
                    pfd[np].events = POLLIN;
                    which[np] = &rk[r].s[k];
                    rank_of[np] = r;
                    np++;
                }
        double t = now_s();
        if (alive == 0) {
            if (np == 1) break;                       /* all output drained */
            if (drain_until == 0) drain_until = t + DTRUN_DRAIN_S;
            if (t >= drain_until) break;              /* a grandchild holds a pipe open */
        }
        if (kill_at > 0 && t >= kill_at) {
            signal_ranks(rk, n, pgid, SIGKILL);
            kill_at = 0;
        }
        int timeout = -1;
        double next = 0;
        if (kill_at > 0) next = kill_at;
        if (drain_until > 0 && (next == 0 || drain_until < next)) next = drain_until;
        if (next > 0) timeout = (int)((next - t) * 1000) + 1;
        int pr = poll(pfd, (nfds_t)np, timeout);
        if (pr < 0) {
            if (errno == EINTR) continue;
            fprintf(stderr, "dtrun: poll: %s; stopping the ranks\n", strerror(errno));
            signal_ranks(rk, n, pgid, SIGKILL);
            break;
        }
        for (int i = 1; i < np; i++)
            if (pfd[i].revents) stream_read(which[i], rank_of[i]);
        if (!pfd[0].revents) continue;
        struct signalfd_siginfo si;
        while (read(sfd, &si, sizeof si) == (ssize_t)sizeof si) {
            int sig = (int)si.ssi_signo;
            if (sig == SIGCHLD) continue;   /* reaped below */
            /* SIGINT/SIGTERM/SIGHUP: forward; a second one means "now" */
            if (!oc->signal) oc->signal = sig;
            if (!stopping) {
                stopping = 1;
                signal_ranks(rk, n, pgid, sig);
                kill_at = now_s() + cfg->grace_s;
            } else {
                signal_ranks(rk, n, pgid, SIGKILL);
            }
        }
        for (;;) {
            int status;
            pid_t pid = waitpid(-1, &status, WNOHANG);
            if (pid <= 0) break;
            for (int r = 0; r < n; r++) {
                if (rk[r].reaped || rk[r].pid != pid) continue;
                rk[r].reaped = 1;
                rk[r].status = status;
                alive--;
                if (rank_failed(status) && !stopping) {
                    oc->failed_rank = r;
                    oc->failed_pid = pid;
                    oc->failed_status = status;
                    stopping = 1;
                    signal_ranks(rk, n, pgid, SIGTERM);
                    kill_at = now_s() + cfg->grace_s;
                }
            }
        }
        if (alive == 0) kill_at = 0;
    }
    /* Anything still open belongs to a process that outlived its rank: flush and close. */
    for (int r = 0; r < n; r++)
        for (int k = 0; k < 2; k++) {
            dtrun_stream *st = &rk[r].s[k];
            if (st->fd >= 0) {
                if (st->len) emit_line(st->out, r, st->buf, st->len);
                close(st->fd);
                st->fd = -1;
            }
            free(st->buf);
            st->buf = NULL;
        }
    /* make sure nothing of the job survives (a grandchild in our group) */
    if (pgid > 0) kill(-pgid, SIGKILL);
    free(pfd); free(which); free(rank_of);
}

/* ---- main ------------------------------------------------------------------------------ */

/* A fresh job id when DT_JOB_ID is not set ("" when it is: the ranks inherit it as is). */
static void make_job_id(char *out, size_t n) {
    const char *env = getenv("DT_JOB_ID");
    out[0] = '\0';
    if (env && *env) return;
    unsigned char rnd[8];
    if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd) {
        uint64_t x = (uint64_t)getpid() * 0x9E3779B97F4A7C15ULL ^ (uint64_t)time(NULL);
        memcpy(rnd, &x, sizeof rnd);
    }
    snprintf(out, n, "dtrun-");
    for (size_t i = 0; i < sizeof rnd; i++)
        snprintf(out + strlen(out), n - strlen(out), "%02x", rnd[i]);
}

int main(int argc, char **argv) {
    dtrun_cfg cfg;
    parse_args(argc, argv, &cfg);
    if (cfg.master_port == 0 && (cfg.master_port = free_port()) == 0) {
        fprintf(stderr, "dtrun: cannot find a free TCP port: %s (give --master-port)\n", strerror(errno));
        return 1;
    }
    make_job_id(cfg.job_id, sizeof cfg.job_id);

    /* Signals arrive through a signalfd; blocked before fork, unblocked in the children. */
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGCHLD);
    sigaddset(&mask, SIGINT);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGHUP);
    if (sigprocmask(SIG_BLOCK, &mask, NULL) != 0) {
        fprintf(stderr, "dtrun: sigprocmask: %s\n", strerror(errno));
        return 1;
    }
    int sfd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
    if (sfd < 0) {
        fprintf(stderr, "dtrun: signalfd: %s\n", strerror(errno));
        return 1;
    }
    signal(SIGPIPE, SIG_IGN);   /* a closed stdout must not kill the supervisor */
    /* A blocked signal that is also ignored is discarded, never reaching the signalfd.
     * Shells start background commands with SIGINT ignored; dtrun still wants to hear
     * it, so restore the default (it stays blocked). SIGHUP ignored by nohup stays so. */
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);

    dtrun_rank *rk = calloc((size_t)cfg.nproc, sizeof *rk);
    if (!rk) {
        fprintf(stderr, "dtrun: out of memory\n");
        return 1;
    }
    pid_t pgid;
    if (spawn_ranks(&cfg, rk, &pgid) != 0) return 1;

    dtrun_outcome oc = {0};
    supervise(&cfg, rk, pgid, sfd, &oc);
    free(rk);
    if (oc.failed_rank == -2) return 1;
    if (oc.failed_rank >= 0) {
        int st = oc.failed_status;
        if (WIFSIGNALED(st)) {
            fprintf(stderr, "dtrun: rank %d (pid %d) failed first: killed by signal %s\n",
                    oc.failed_rank, (int)oc.failed_pid, signame(WTERMSIG(st)));
            return 128 + WTERMSIG(st);
        }
        fprintf(stderr, "dtrun: rank %d (pid %d) failed first: exit code %d\n",
                oc.failed_rank, (int)oc.failed_pid, WEXITSTATUS(st));
        return WEXITSTATUS(st);
    }
    if (oc.signal) {
        fprintf(stderr, "dtrun: stopped by %s; all ranks ended\n", signame(oc.signal));
        return 128 + oc.signal;
    }
    return 0;
}
