/*
 * dtrun_util.c: what dtrun.c, dtrun_ranks.c and dtrun_rdzv.c all use (see dtrun.h):
 * dtrun's messages (on stderr and in its --log-dir log), clocks, signal names, a free
 * port, the job's base id, and stopping the local ranks (the first failure recorded,
 * SIGTERM, SIGKILL after the grace period). It calls none of the other three, so the
 * files form a tree: dtrun.c over dtrun_ranks.c over dtrun_rdzv.c, all over this one.
 */
#include "config.h"
#include "dtrun.h"

#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

char dtrun_base_id[160];

/* ---- messages and small helpers ------------------------------------------------------ */

static void say_line(dtrun_job *job, const char *line) {
    char buf[8192];
    int n = snprintf(buf, sizeof buf, "dtrun: %s\n", line);
    if (n > (int)sizeof buf - 1) n = (int)sizeof buf - 1;
    ssize_t w = write(2, buf, (size_t)n);
    (void)w;
    if (job->log) {
        char when[64];
        dtrun_clock(when, sizeof when);
        fprintf(job->log, "%s %s\n", when, line);
        fflush(job->log);
    }
}

void dtrun_say(dtrun_job *job, const char *fmt, ...) {
    char buf[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    say_line(job, buf);
}

/* A multi-line text, each line behind "dtrun: ". */
void dtrun_say_block(dtrun_job *job, const char *text) {
    const char *p = text;
    while (*p) {
        const char *e = strchr(p, '\n');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        char line[4096];
        snprintf(line, sizeof line, "%.*s", (int)(n < sizeof line ? n : sizeof line - 1), p);
        say_line(job, line);
        p += n + (e ? 1 : 0);
    }
}

/* Wall-clock time, UTC, to the millisecond: "2026-11-29 10:50:01.123 UTC". */
void dtrun_clock(char *out, size_t n) {
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    char d[32];
    strftime(d, sizeof d, "%Y-%m-%d %H:%M:%S", &tm);
    snprintf(out, n, "%s.%03d UTC", d, (int)(ts.tv_nsec / 1000000));
}

const char *dtrun_signame(int sig) {
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

/* A free TCP port: bind port 0, read what the kernel chose, release it. The ranks bind
 * it again moments later; a race with another program is possible but rare. */
int dtrun_free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return 0;
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_ANY);
    socklen_t len = sizeof sa;
    int port = 0;
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0 &&
        getsockname(fd, (struct sockaddr *)&sa, &len) == 0)
        port = ntohs(sa.sin_port);
    close(fd);
    return port;
}

/* ---- stopping the local ranks ------------------------------------------------------- */

void dtrun_signal_ranks(dtrun_job *job, int sig) {
    if (job->pgid > 0) kill(-job->pgid, sig);   /* the whole group: grandchildren too */
    /* a rank outside the group gets it by its pid; one inside must not get it twice (a
     * second SIGTERM means "now" to a program that stops gracefully on the first) */
    for (int r = 0; r < job->nlocal; r++)
        if (job->rk[r].pid > 0 && !job->rk[r].reaped && (job->pgid <= 0 || getpgid(job->rk[r].pid) != job->pgid))
            kill(job->rk[r].pid, sig);
}

void dtrun_stop(dtrun_job *job, const char *desc, int code, int no_restart) {
    if (!job->fail && desc) {
        job->fail = strdup(desc);
        job->fail_code = code;
        job->no_restart = no_restart;
    }
    if (!job->stopping && job->alive > 0) {
        job->stopping = 1;
        dtrun_signal_ranks(job, SIGTERM);
        job->kill_at = dt_now() + job->cfg->grace_s;
    }
    job->stopping = 1;
}

int dtrun_read_signal(dtrun_job *job) {
    struct signalfd_siginfo si;
    int sig = 0;
    while (read(job->sfd, &si, sizeof si) == (ssize_t)sizeof si)
        if ((int)si.ssi_signo != SIGCHLD && !sig) sig = (int)si.ssi_signo;
    while (waitpid(-1, NULL, WNOHANG) > 0) {}
    return sig;
}

/* The status every local rank exited with, when all exited by themselves (none killed)
 * with the same one; else -1. After a forwarded signal this is the program's answer to it
 * (dtrain train: 75, stopped at a step boundary and checkpointed), which dtrun passes on
 * instead of 128 + the signal. */
int dtrun_common_exit(const dtrun_job *job) {
    int code = -1;
    for (int r = 0; r < job->nlocal; r++) {
        int st = job->rk[r].status;
        if (!WIFEXITED(st) || (code >= 0 && WEXITSTATUS(st) != code)) return -1;
        code = WEXITSTATUS(st);
    }
    return code;
}
