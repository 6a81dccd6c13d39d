/*
 * dtrun_ranks.c: one attempt of the job on this node — start the local ranks, carry
 * their output, and supervise them until every one has been reaped.
 *
 * Output: each whole line a rank writes is printed with one write(), prefixed
 * "[rankK]:" (K the global rank), on dtrun's stdout or stderr like the rank wrote it,
 * so lines of different ranks never interleave. With --log-dir the lines go (without
 * prefix) to DIR/rankK.log instead, and also to the console with --tee; --ranks-filter
 * limits what reaches the console. The last DTRUN_TAIL stderr lines of every rank are
 * kept whatever is shown, for the failure report.
 *
 * No rank outlives dtrun: the ranks share their own process group, which dtrun signals
 * as a whole (grandchildren included) and SIGKILLs at the end of every attempt. If
 * dtrun itself ends without running any code of its own (SIGKILL, a crash), a watcher
 * process ends the group (watcher_run): PR_SET_PDEATHSIG, which each child also asks
 * for, reaches dtrun's direct children only, not a rank started through a wrapper
 * (dtrun -n 2 sh -c "dtrain ...; echo"). Once they are reaped, the shared-memory
 * segments of dead processes are swept (shm_name.h), so a rank killed mid-set-up leaves
 * nothing in /dev/shm.
 *
 * Everything runs in one thread with poll(): rank output pipes, a signalfd for SIGCHLD,
 * SIGINT, SIGTERM, SIGHUP and SIGUSR1 (no signal-handler reentrancy), and on several nodes the
 * connections of the rendezvous (dtrun_rdzv.c).
 */
#include "config.h"
#include "dtrun.h"
#include "shm_name.h"   /* dt_shm_sweep: what killed ranks leave in /dev/shm */

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define DTRUN_LINE_MAX   (4u << 20)   /* a "line" longer than this is flushed in pieces */
#define DTRUN_DRAIN_S    2.0          /* after the ranks exit, wait this long for pipes to close */
#define DTRUN_NET_FDS    (DTRUN_MAX_NODES + 8)

static int usable_cores(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int n = CPU_COUNT(&set);
        if (n > 0) return n;
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
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

static int global_rank(const dtrun_job *job, int local) {
    return job->rank0 + local;
}

/* One whole line of rank r's stream k (0 stdout, 1 stderr): keep, log, show. */
static void emit_line(dtrun_job *job, dtrun_rank *rk, int k, const char *text, size_t n) {
    const dtrun_cfg *cfg = job->cfg;
    int g = global_rank(job, rk->rank);
    if (k == 1) {
        char *copy = malloc(n + 1);
        if (copy) {
            memcpy(copy, text, n);
            copy[n] = '\0';
            int slot = rk->ntail % DTRUN_TAIL;
            free(rk->tail[slot]);
            rk->tail[slot] = copy;
            rk->ntail++;
        }
    }
    if (rk->log) {
        fwrite(text, 1, n, rk->log);
        fputc('\n', rk->log);
    }
    if (cfg->log_dir[0] && !cfg->tee) return;
    if (cfg->ranks_filter && !cfg->ranks_filter[g]) return;
    char pre[32];
    int pn = snprintf(pre, sizeof pre, "[rank%d]:", g);
    char stackbuf[8192];
    char *line = n + (size_t)pn + 1 <= sizeof stackbuf ? stackbuf : malloc(n + (size_t)pn + 1);
    int out = rk->s[k].out;
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

/* Read what is available; emit every complete line; at EOF emit the rest and close. */
static void stream_read(dtrun_job *job, dtrun_rank *rk, int k) {
    dtrun_stream *st = &rk->s[k];
    for (;;) {
        if (st->cap - st->len < 65536) {
            size_t cap = st->cap ? st->cap * 2 : 65536 * 2;
            char *b = realloc(st->buf, cap);
            if (!b) {   /* keep going with what we have: flush the partial line */
                if (st->len) emit_line(job, rk, k, st->buf, st->len);
                st->len = 0;
                if (st->cap == 0) return;
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
            if (st->len) emit_line(job, rk, k, st->buf, st->len);
            st->len = 0;
            close(st->fd);
            st->fd = -1;
            return;
        }
        size_t start = 0, end = st->len + (size_t)r;
        for (size_t i = st->len; i < end; i++)
            if (st->buf[i] == '\n') {
                emit_line(job, rk, k, st->buf + start, i - start);
                start = i + 1;
            }
        st->len = end - start;
        memmove(st->buf, st->buf + start, st->len);
        if (st->len >= DTRUN_LINE_MAX) {   /* runaway line: emit it in pieces */
            emit_line(job, rk, k, st->buf, st->len);
            st->len = 0;
        }
    }
}

/* ---- the watcher --------------------------------------------------------------------
 * Why a separate process: when dtrun is SIGKILLed, none of its code runs, and the kernel's
 * parent-death signal reaches only its direct children; a rank behind a wrapper shell is a
 * grandchild, reparented to init, and would run on. What the kernel does do on every way
 * out of dtrun is close its descriptors. So before the ranks, dtrun forks a watcher that
 * leads a new process group (the ranks join it) and holds the read end of a pipe whose
 * only write end stays in dtrun (close-on-exec: no rank inherits it). When dtrun is gone,
 * however it went, the read returns end-of-file and the watcher SIGKILLs the group,
 * grandchildren and itself included. It does not ask for a parent-death signal (it must
 * outlive dtrun), ignores the signals dtrun forwards to the group, holds no other
 * descriptor (no rank output pipe, socket or terminal stays open through it), and, as the
 * group's leader left unreaped until the attempt's final kill, keeps the group id from
 * being reused while dtrun may still signal it. */

/* Close every descriptor but keep (dtrun is single-threaded: opendir is safe after fork). */
static void close_all_but(int keep) {
    DIR *d = opendir("/proc/self/fd");
    if (d) {
        int dfd = dirfd(d), fds[256], n;
        do {   /* in batches: closing while listing is not something readdir promises to survive */
            struct dirent *e;
            n = 0;
            rewinddir(d);
            while (n < 256 && (e = readdir(d)) != NULL) {
                int fd = atoi(e->d_name);
                if (e->d_name[0] != '.' && fd != keep && fd != dfd) fds[n++] = fd;
            }
            for (int i = 0; i < n; i++) close(fds[i]);
        } while (n == 256);
        closedir(d);
        return;
    }
    struct rlimit rl;
    int max = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < 65536 ? (int)rl.rlim_cur : 65536;
    for (int fd = 0; fd < max; fd++) if (fd != keep) close(fd);
}

/* In the watcher, after fork: wait for dtrun to go, then end the group. Never returns. */
static void watcher_run(int rfd, int wfd) {
    close(wfd);
    (void)setpgid(0, 0);
    if (getpgrp() != getpid()) _exit(1);   /* never kill(0) from dtrun's own group */
    signal(SIGINT, SIG_IGN);
    signal(SIGTERM, SIG_IGN);
    signal(SIGHUP, SIG_IGN);
    signal(SIGUSR1, SIG_IGN);
    signal(SIGPIPE, SIG_IGN);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    close_all_but(rfd);
    int devnull = open("/dev/null", O_RDWR);
    if (devnull >= 0) {
        for (int fd = 0; fd < 3; fd++) if (fd != rfd && fd != devnull) dup2(devnull, fd);
        if (devnull > 2 && devnull != rfd) close(devnull);
    }
    prctl(PR_SET_NAME, "dtrun-watch", 0, 0, 0);
    char c;
    for (;;) {
        ssize_t r = read(rfd, &c, 1);
        if (r == 0 || (r < 0 && errno != EINTR)) break;   /* dtrun is gone (it never writes) */
    }
    kill(0, SIGKILL);   /* the whole group: the ranks, what they started, and this process */
    _exit(0);
}

/* Start this attempt's watcher; job->pgid becomes its group. 0, or -1 with errno set. */
static int watcher_start(dtrun_job *job) {
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) return -1;
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        int e = errno;
        close(p[0]);
        close(p[1]);
        errno = e;
        return -1;
    }
    if (pid == 0) watcher_run(p[0], p[1]);
    (void)setpgid(pid, pid);   /* also here: the ranks join the group before the watcher runs */
    close(p[0]);
    job->watcher = pid;
    job->watch_fd = p[1];
    job->pgid = pid;
    return 0;
}

/* End this attempt's watcher (after the group's final SIGKILL) and reap it. */
static void watcher_end(dtrun_job *job) {
    if (job->watch_fd >= 0) close(job->watch_fd);   /* end-of-file: it kills the group and exits */
    job->watch_fd = -1;
    if (job->watcher > 0) {
        kill(job->watcher, SIGKILL);
        waitpid(job->watcher, NULL, 0);
    }
    job->watcher = 0;
    job->pgid = 0;   /* its id may be reused from now on: signal it no more */
}

/* In the child, after fork: become the rank and exec the program. Never returns. */
static void child_exec(const dtrun_job *job, const dtrun_rank *rk, pid_t parent,
                       int out_w, int err_w, const char *threads) {
    const dtrun_cfg *cfg = job->cfg;
    /* die with dtrun, even if dtrun is SIGKILLed; then check dtrun did not die already */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent) _exit(127);
    setpgid(0, job->pgid);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    signal(SIGPIPE, SIG_DFL);
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull < 0 || dup2(devnull, 0) < 0 || dup2(out_w, 1) < 0 || dup2(err_w, 2) < 0) _exit(127);
    if (devnull > 2) close(devnull);   /* the pipe ends are close-on-exec already */
    char v[64];
    snprintf(v, sizeof v, "%d", global_rank(job, rk->rank)); setenv("RANK", v, 1);
    snprintf(v, sizeof v, "%d", rk->rank);                  setenv("LOCAL_RANK", v, 1);
    snprintf(v, sizeof v, "%d", job->world);                setenv("WORLD_SIZE", v, 1);
    snprintf(v, sizeof v, "%d", job->nlocal);               setenv("LOCAL_WORLD_SIZE", v, 1);
    snprintf(v, sizeof v, "%d", job->group);                setenv("NODE_RANK", v, 1);
    setenv("GROUP_RANK", v, 1);
    snprintf(v, sizeof v, "%d", job->ngroups);              setenv("DT_NNODES", v, 1);
    setenv("MASTER_ADDR", job->rank_addr[0] ? job->rank_addr : cfg->master_addr, 1);
    snprintf(v, sizeof v, "%d", job->rank_port);            setenv("MASTER_PORT", v, 1);
    if (job->job_id[0]) setenv("DT_JOB_ID", job->job_id, 1);
    snprintf(v, sizeof v, "%d", job->attempt);              setenv("DT_RESTART_COUNT", v, 1);
    snprintf(v, sizeof v, "%d", cfg->max_restarts);         setenv("DT_MAX_RESTARTS", v, 1);
    if (job->change[0]) {   /* elastic: what changed before this attempt, for the program's log */
        setenv("DT_ELASTIC_CHANGE", job->change, 1);
        snprintf(v, sizeof v, "%.3f", job->change_at);      setenv("DT_ELASTIC_SINCE", v, 1);
    } else {
        unsetenv("DT_ELASTIC_CHANGE");
        unsetenv("DT_ELASTIC_SINCE");
    }
    setenv("OMP_NUM_THREADS", threads, 0);
    setenv("OPENBLAS_NUM_THREADS", threads, 0);
    execvp(cfg->argv[0], cfg->argv);
    dprintf(2, "dtrun: cannot run '%s': %s\n", cfg->argv[0], strerror(errno));
    _exit(127);
}

/* Open DIR/rankK.log for appending (one file over all attempts, a header per restart). */
static FILE *open_rank_log(dtrun_job *job, int g) {
    char path[1100];
    snprintf(path, sizeof path, "%s/rank%d.log", job->cfg->log_dir, g);
    FILE *f = fopen(path, job->attempt == 0 ? "w" : "a");
    if (!f) {
        dtrun_say(job, "cannot open the log file %s: %s", path, strerror(errno));
        return NULL;
    }
    setvbuf(f, NULL, _IOLBF, 0);
    if (job->attempt > 0) fprintf(f, "--- dtrun: restart %d ---\n", job->attempt);
    return f;
}

void dtrun_close_logs(dtrun_job *job) {
    for (int r = 0; r < job->cfg->nproc; r++) {
        dtrun_rank *rk = &job->rk[r];
        if (rk->log) fclose(rk->log);
        rk->log = NULL;
        for (int i = 0; i < DTRUN_TAIL; i++) { free(rk->tail[i]); rk->tail[i] = NULL; }
        rk->ntail = 0;
    }
}

int dtrun_spawn(dtrun_job *job) {
    const dtrun_cfg *cfg = job->cfg;
    char threads[16];
    int t = usable_cores() / cfg->nproc;
    snprintf(threads, sizeof threads, "%d", t < 1 ? 1 : t);
    pid_t parent = getpid();
    job->pgid = 0;
    job->watcher = 0;
    job->watch_fd = -1;
    job->alive = 0;
    job->stopping = 0;
    job->kill_at = 0;
    memset(job->rk, 0, (size_t)cfg->nproc * sizeof *job->rk);
    if (watcher_start(job) != 0) {
        dtrun_say(job, "cannot start the process that ends the ranks with dtrun: %s", strerror(errno));
        return -1;
    }
    for (int r = 0; r < job->nlocal; r++) {
        dtrun_rank *rk = &job->rk[r];
        int po[2], pe[2];
        rk->rank = r;
        rk->s[0].fd = rk->s[1].fd = -1;
        rk->s[0].out = 1;
        rk->s[1].out = 2;
        if (cfg->log_dir[0] && !(rk->log = open_rank_log(job, global_rank(job, r)))) goto fail_quiet;
        if (pipe2(po, O_CLOEXEC) != 0) goto fail;
        if (pipe2(pe, O_CLOEXEC) != 0) { close(po[0]); close(po[1]); goto fail; }
        fflush(NULL);
        pid_t pid = fork();
        if (pid < 0) { close(po[0]); close(po[1]); close(pe[0]); close(pe[1]); goto fail; }
        if (pid == 0) child_exec(job, rk, parent, po[1], pe[1], threads);
        /* also set the group here, so kill(-pgid) reaches the child before it runs */
        (void)setpgid(pid, job->pgid);   /* EACCES once the child has exec'd: it set it itself */
        rk->pid = pid;
        job->alive++;
        close(po[1]);
        close(pe[1]);
        rk->s[0].fd = po[0];
        rk->s[1].fd = pe[0];
        fcntl(po[0], F_SETFL, O_NONBLOCK);
        fcntl(pe[0], F_SETFL, O_NONBLOCK);
        continue;
    fail:
        dtrun_say(job, "cannot start rank %d: %s", global_rank(job, r), strerror(errno));
    fail_quiet:
        for (int q = 0; q < r; q++) {
            kill(job->rk[q].pid, SIGKILL);
            waitpid(job->rk[q].pid, NULL, 0);
            job->rk[q].reaped = 1;
            for (int k = 0; k < 2; k++) if (job->rk[q].s[k].fd >= 0) close(job->rk[q].s[k].fd);
        }
        job->alive = 0;
        kill(-job->pgid, SIGKILL);
        watcher_end(job);
        dtrun_close_logs(job);
        return -1;
    }
    return 0;
}

/* The report of a local rank's failure: what, where, when, and its last stderr lines. */
static char *describe_failure(dtrun_job *job, dtrun_rank *rk) {
    size_t cap = 1024;
    for (int i = 0; i < DTRUN_TAIL; i++) if (rk->tail[i]) cap += strlen(rk->tail[i]) + 8;
    char *d = malloc(cap);
    if (!d) return NULL;
    char how[64], when[64];
    if (WIFSIGNALED(rk->status)) snprintf(how, sizeof how, "killed by signal %s", dtrun_signame(WTERMSIG(rk->status)));
    else snprintf(how, sizeof how, "exit code %d", WEXITSTATUS(rk->status));
    dtrun_clock(when, sizeof when);
    size_t n = (size_t)snprintf(d, cap, "rank %d (pid %d) failed first: %s\n"
                                "  on node %d (%s), local rank %d, at %s, attempt %d of %d",
                                global_rank(job, rk->rank), (int)rk->pid, how, job->cfg->node_rank,
                                job->host, rk->rank, when, job->restarts + 1, job->cfg->max_restarts + 1);
    int have = rk->ntail < DTRUN_TAIL ? rk->ntail : DTRUN_TAIL;
    if (have == 0) {
        n += (size_t)snprintf(d + n, cap - n, "\n  it wrote nothing to stderr");
    } else {
        n += (size_t)snprintf(d + n, cap - n, "\n  last %d line%s of its stderr:", have, have == 1 ? "" : "s");
        for (int i = rk->ntail - have; i < rk->ntail; i++)
            n += (size_t)snprintf(d + n, cap - n, "\n  | %s", rk->tail[i % DTRUN_TAIL]);
    }
    /* the text travels between nodes as one line: no control characters in it */
    for (char *p = d; *p; p++) if ((unsigned char)*p < 32 && *p != '\n') *p = ' ';
    return d;
}

static int rank_code(int status) {
    return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
}

/* A local rank ended: a failure stops the job (on every node). */
static void rank_ended(dtrun_job *job, dtrun_rank *rk) {
    if (WIFEXITED(rk->status) && WEXITSTATUS(rk->status) == 0) return;
    if (job->stopping) return;   /* ending because we stopped it */
    char *desc = describe_failure(job, rk);
    const char *d = desc ? desc : "a rank failed (no memory for the details)";
    int code = rank_code(rk->status);
    if (job->net) dtrun_net_failure(job, d, code, 0);
    dtrun_stop(job, d, code, 0);
    free(desc);
}

/* A signal to dtrun: forward it (a second one means SIGKILL now); the job ends. */
static void got_signal(dtrun_job *job, int sig) {
    if (job->signal && job->stopping) {
        dtrun_signal_ranks(job, SIGKILL);
        return;
    }
    if (!job->signal) job->signal = sig;
    if (!job->stopping) {
        job->stopping = 1;
        if (job->alive > 0) {
            dtrun_signal_ranks(job, sig);
            job->kill_at = dt_now() + job->cfg->grace_s;
        }
    }
    if (job->net) {   /* the other nodes stop too */
        char d[512], when[64];
        dtrun_clock(when, sizeof when);
        snprintf(d, sizeof d, "dtrun on node %d (%s) was stopped by %s at %s",
                 job->cfg->node_rank, job->host, dtrun_signame(sig), when);
        dtrun_net_failure(job, d, 128 + sig, 1);
    }
    job->no_restart = 1;
}

/* Read the signalfd: signals to forward, children to reap. Every child that has ended
 * is reaped before any is reported, and a rank killed by a signal is reported before
 * ranks that exited: when one rank is killed and another exits on losing it, both can
 * be waiting by the time dtrun runs, in any order, and the killed one is the cause. */
static void handle_signals(dtrun_job *job) {
    struct signalfd_siginfo si;
    while (read(job->sfd, &si, sizeof si) == (ssize_t)sizeof si)
        if ((int)si.ssi_signo != SIGCHLD) got_signal(job, (int)si.ssi_signo);
    /* the ranks only: the watcher stays unreaped, holding the group's id, until the end */
    for (int r = 0; r < job->nlocal; r++) {
        dtrun_rank *rk = &job->rk[r];
        int status;
        if (rk->reaped || waitpid(rk->pid, &status, WNOHANG) != rk->pid) continue;
        rk->reaped = 2;   /* reaped, not reported yet */
        rk->status = status;
        job->alive--;
    }
    for (int pass = 0; pass < 2; pass++)   /* the signalled first, then the rest */
        for (int r = 0; r < job->nlocal; r++) {
            dtrun_rank *rk = &job->rk[r];
            if (rk->reaped != 2 || (pass == 0 && !WIFSIGNALED(rk->status))) continue;
            rk->reaped = 1;
            rank_ended(job, rk);
        }
    if (job->alive == 0) job->kill_at = 0;
}

void dtrun_supervise(dtrun_job *job) {
    int n = job->nlocal;
    double drain_until = 0;
    size_t max = (size_t)(2 * n + 1 + DTRUN_NET_FDS);
    struct pollfd *pfd = calloc(max, sizeof *pfd);
    int *who = calloc(max, sizeof *who);   /* 2 * local rank + stream */
    if (!pfd || !who) {
        dtrun_say(job, "out of memory; stopping the ranks");
        dtrun_signal_ranks(job, SIGKILL);
        for (int r = 0; r < n; r++)
            if (!job->rk[r].reaped) { waitpid(job->rk[r].pid, &job->rk[r].status, 0); job->rk[r].reaped = 1; }
        watcher_end(job);
        job->alive = 0;
        dtrun_stop(job, "dtrun ran out of memory", 1, 1);
        free(pfd); free(who);
        return;
    }
    for (;;) {
        int np = 0;
        pfd[np].fd = job->sfd; pfd[np].events = POLLIN; np++;
        for (int r = 0; r < n; r++)
            for (int k = 0; k < 2; k++)
                if (job->rk[r].s[k].fd >= 0) {
                    pfd[np].fd = job->rk[r].s[k].fd;
                    pfd[np].events = POLLIN;
                    who[np] = 2 * r + k;
                    np++;
                }
        int nout = np;
        if (job->net) np += dtrun_net_pollfds(job, pfd + np, DTRUN_NET_FDS);
        double t = dt_now();
        if (job->alive == 0) {
            if (nout == 1) break;                     /* all output drained */
            if (drain_until == 0) drain_until = t + DTRUN_DRAIN_S;
            if (t >= drain_until) break;              /* a grandchild holds a pipe open */
        }
        if (job->kill_at > 0 && t >= job->kill_at) {
            dtrun_signal_ranks(job, SIGKILL);
            job->kill_at = 0;
        }
        double next = 0;
        if (job->kill_at > 0) next = job->kill_at;
        if (drain_until > 0 && (next == 0 || drain_until < next)) next = drain_until;
        double hb = job->net ? dtrun_net_deadline(job) : 0;
        if (hb > 0 && (next == 0 || hb < next)) next = hb;
        int timeout = next > 0 ? (int)((next - t) * 1000) + 1 : -1;
        if (timeout < -1) timeout = 0;
        int pr = poll(pfd, (nfds_t)np, timeout);
        if (pr < 0) {
            if (errno == EINTR) continue;
            dtrun_say(job, "poll: %s; stopping the ranks", strerror(errno));
            dtrun_signal_ranks(job, SIGKILL);
            dtrun_stop(job, "dtrun's poll() failed", 1, 1);
            break;
        }
        for (int i = 1; i < nout; i++)
            if (pfd[i].revents) stream_read(job, &job->rk[who[i] / 2], who[i] % 2);
        if (job->net) {
            dtrun_net_ready(job, pfd + nout, np - nout);
            dtrun_net_tick(job);
        }
        if (pfd[0].revents) handle_signals(job);
    }
    /* what a rank's survivor still holds open: flush and close */
    for (int r = 0; r < n; r++)
        for (int k = 0; k < 2; k++) {
            dtrun_stream *st = &job->rk[r].s[k];
            if (st->fd >= 0) {
                if (st->len) emit_line(job, &job->rk[r], k, st->buf, st->len);
                close(st->fd);
                st->fd = -1;
            }
            free(st->buf);
            st->buf = NULL;
            st->len = st->cap = 0;
        }
    /* make sure nothing of the attempt survives (a grandchild in our group, the watcher) */
    if (job->pgid > 0) kill(-job->pgid, SIGKILL);
    /* the ranks are gone: reap what is left so the next attempt starts clean */
    for (int r = 0; r < n; r++)
        if (!job->rk[r].reaped) { waitpid(job->rk[r].pid, &job->rk[r].status, 0); job->rk[r].reaped = 1; }
    watcher_end(job);
    /* a rank killed (SIGKILL, the OOM killer) while a shared-memory ring it made was not
     * yet mapped by its peer leaves the name in /dev/shm: remove what dead processes left */
    dt_shm_sweep();
    free(pfd); free(who);
}
