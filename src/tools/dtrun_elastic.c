/*
 * dtrun_elastic.c: what node 0's dtrun needs to know to run a job whose nodes come and go
 * (--nnodes MIN:MAX) and still get the bits of the uninterrupted run.
 *
 * A world size keeps the result exact only where the program says so: dtrain train gives
 * the same weights on every power-of-two world that divides --micro-batches (times the
 * pipeline depth), and nowhere else. So before the rendezvous node 0 runs the program once
 * with DT_ELASTIC_PROBE=1 and without the ranks' variables; the program checks its flags,
 * prints one line and exits:
 *
 *   dtrain-elastic: sizes=1,2,4,8 resume=auto checkpoint-dir=DIR
 *
 * (checkpoint-dir last, so that the directory may hold spaces). A program that prints no
 * such line cannot run elastically, and dtrun says so. From then on every membership round
 * runs the largest allowed world that the live nodes hold; ranks beyond it wait as spares.
 */
#include "config.h"
#include "dtrun.h"

#include <dirent.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define PROBE_S      60.0           /* the program has this long to answer */
#define PROBE_MAX    (64 * 1024)    /* bytes of its stdout kept */
#define PROBE_TAG    "dtrain-elastic: "

int dtrun_probe(dtrun_job *job, dtrun_exact *ex) {
    const dtrun_cfg *cfg = job->cfg;
    int out[2];
    if (pipe(out) != 0) {
        dtrun_say(job, "pipe: %s", strerror(errno));
        return 1;
    }
    pid_t pid = fork();
    if (pid < 0) {
        dtrun_say(job, "fork: %s", strerror(errno));
        close(out[0]);
        close(out[1]);
        return 1;
    }
    if (pid == 0) {
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        dup2(out[1], 1);
        close(out[0]);
        close(out[1]);
        static const char *const unset[] = { "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK",
                                             "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT" };
        for (size_t i = 0; i < sizeof unset / sizeof unset[0]; i++) unsetenv(unset[i]);
        setenv("DT_ELASTIC_PROBE", "1", 1);
        execvp(cfg->argv[0], cfg->argv);
        dprintf(2, "dtrun: cannot run '%s': %s\n", cfg->argv[0], strerror(errno));
        _exit(127);
    }
    close(out[1]);
    char *buf = malloc(PROBE_MAX + 1);
    size_t len = 0;
    double deadline = dt_now() + PROBE_S;
    int timed_out = 0;
    while (buf) {
        double left = deadline - dt_now();
        if (left <= 0) { timed_out = 1; break; }
        struct pollfd pf = { .fd = out[0], .events = POLLIN };
        int pr = poll(&pf, 1, (int)(left * 1000) + 1);
        if (pr < 0 && errno == EINTR) continue;
        if (pr <= 0) { timed_out = pr == 0; break; }
        char tmp[4096];
        ssize_t r = read(out[0], tmp, sizeof tmp);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        size_t take = (size_t)r < PROBE_MAX - len ? (size_t)r : PROBE_MAX - len;
        memcpy(buf + len, tmp, take);
        len += take;
    }
    close(out[0]);
    if (timed_out) kill(pid, SIGKILL);
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
    if (!buf) {
        dtrun_say(job, "out of memory");
        return 1;
    }
    buf[len] = '\0';
    int rc = 0;
    const char *line = NULL;
    for (char *p = buf; p && *p; ) {
        char *nl = strchr(p, '\n');
        if (nl) *nl = '\0';
        if (strncmp(p, PROBE_TAG, strlen(PROBE_TAG)) == 0) line = p + strlen(PROBE_TAG);
        p = nl ? nl + 1 : NULL;
    }
    if (timed_out) {
        dtrun_say(job, "--nnodes %d:%d: '%s' did not answer which world sizes keep its result exact within %g s "
                  "(DT_ELASTIC_PROBE=1)", cfg->min_nodes, cfg->nnodes, cfg->argv[0], PROBE_S);
        rc = 1;
    } else if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        dtrun_say(job, "--nnodes %d:%d: '%s' refused to run elastically (its message is above; exit status %d)",
                  cfg->min_nodes, cfg->nnodes, cfg->argv[0], WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
        rc = 2;
    } else if (!line) {
        dtrun_say(job, "--nnodes %d:%d: '%s' does not say which world sizes keep its result exact (asked with "
                  "DT_ELASTIC_PROBE=1, it printed no line '" PROBE_TAG "sizes=...'); nodes that come and go need "
                  "a program that does (dtrain train)", cfg->min_nodes, cfg->nnodes, cfg->argv[0]);
        rc = 2;
    } else if (dtrun_parse_answer(line, ex) != 0) {
        dtrun_say(job, "--nnodes %d:%d: '%s' answered the elastic probe with '%.200s', which is not "
                  "'sizes=N,N,... resume=... checkpoint-dir=...'", cfg->min_nodes, cfg->nnodes, cfg->argv[0], line);
        rc = 2;
    }
    free(buf);
    return rc;
}

int dtrun_pick_world(const dtrun_exact *ex, int ranks) {
    int w = 0;
    for (int i = 0; i < ex->nsizes; i++) if (ex->sizes[i] <= ranks) w = ex->sizes[i];
    return w;
}

void dtrun_sizes_text(const dtrun_exact *ex, char *out, size_t n) {
    out[0] = '\0';
    for (int i = 0; i < ex->nsizes; i++) {
        size_t l = strlen(out);
        const char *sep = i == 0 ? "" : i == ex->nsizes - 1 ? " and " : ", ";
        snprintf(out + l, n - l, "%s%d", sep, ex->sizes[i]);
    }
}

/* The name of the newest complete checkpoint in dir (step-<12 digits>, as ckpt_dir.c
 * installs them) into best[18]; 0, or errno when the directory cannot be read. */
static int newest_name(const char *dir, char best[18]) {
    best[0] = '\0';
    DIR *d = opendir(dir);
    if (!d) return errno;
    struct dirent *e;
    while ((e = readdir(d))) {
        const char *nm = e->d_name;
        if (strncmp(nm, "step-", 5) != 0 || strlen(nm) != 17 || strspn(nm + 5, "0123456789") != 12) continue;
        if (strcmp(nm, best) > 0) memcpy(best, nm, 18);   /* 17 characters and the NUL */
    }
    closedir(d);
    return 0;
}

long long dtrun_newest_step(const dtrun_exact *ex, const char *snap_dir) {
    char best[18];
    long long disk = -1, mem = -1;
    if (ex->ckpt_dir[0] && newest_name(ex->ckpt_dir, best) == 0) disk = best[0] ? strtoll(best + 5, NULL, 10) : 0;
    /* this node's newest snapshot (the ranks resume from the newest the nodes hold
     * together: with two nodes, this one; with more, it may be older) */
    if (snap_dir && snap_dir[0] && newest_name(snap_dir, best) == 0 && best[0]) mem = strtoll(best + 5, NULL, 10);
    return mem > disk ? mem : disk;
}

void dtrun_newest_checkpoint(const dtrun_exact *ex, char *out, size_t n) {
    char best[18];
    int err;
    if (!ex->ckpt_dir[0]) snprintf(out, n, "none was kept (no --checkpoint-dir)");
    else if ((err = newest_name(ex->ckpt_dir, best)) != 0) snprintf(out, n, "none in %s (%s)", ex->ckpt_dir, strerror(err));
    else if (best[0]) snprintf(out, n, "%s/%s", ex->ckpt_dir, best);
    else snprintf(out, n, "none in %s yet", ex->ckpt_dir);
}
