/*
 * dtrun.h: what the files of dtrun share.
 *
 *   dtrun.c        command line (flags and DTRUN_* variables), the attempt loop, the
 *                  final report and exit status
 *   dtrun_ranks.c  one attempt on this node: fork the ranks, carry their output
 *                  (prefix, filter, log files, the last stderr lines), supervise them
 *   dtrun_rdzv.c   multi-node: node 0's dtrun serves a small line protocol on
 *                  --master-port; the other nodes join, learn the layout, report local
 *                  failures and hear the job's first failure, restarts and the end;
 *                  in an elastic job a majority of the nodes goes on without node 0
 *   dtrun_elastic.c  --nnodes MIN:MAX: asking the program which world sizes keep its
 *                  result exact, choosing a world from them and laying it out on the nodes
 *   dtrun_util.c   what all of them use: messages, clocks, signal names, a free port,
 *                  stopping the local ranks
 *   dtrun_parse.c  the probe's answer and START read into fields (dtrun_parse.h: it needs
 *                  nothing else, for the fuzz targets and the unit test)
 *
 * Each file calls only those listed below it, so there is no cycle between them.
 *
 * The rendezvous is dtrun's own and not the comm layer's store: the dtruns must notice
 * at once when a node disappears (a closed connection, missing heartbeats), which a
 * request/response store cannot tell, and everything runs in one poll() loop.
 */
#ifndef DTRUN_H
#define DTRUN_H

#include <poll.h>
#include <stdio.h>
#include <sys/types.h>
#include "clock.h"   /* dt_now() */
#include "dtrun_parse.h"   /* DTRUN_MAX_RANKS, DTRUN_MAX_NODES, dtrun_exact, dtrun_start */

#define DTRUN_TAIL       10           /* stderr lines of a rank kept for the failure report */

typedef struct {
    int    nproc;          /* ranks on this node */
    int    nnodes;         /* nodes; with --nnodes MIN:MAX the most (MAX) */
    int    min_nodes;      /* --nnodes MIN:MAX: MIN; else nnodes */
    int    elastic;        /* --nnodes MIN:MAX was given: nodes may leave and join */
    double last_call_s;    /* elastic: after MIN nodes joined, start when none joined for this long */
    int    node_rank;
    char   master_addr[256];
    int    master_port;    /* 0: pick a free one (single node only) */
    int    port_given;
    double grace_s;
    int    max_restarts;
    double monitor_s;      /* heartbeat period between the dtruns */
    double hb_timeout_s;   /* a node silent this long is lost */
    double rdzv_timeout_s; /* how long to wait for the nodes to meet */
    char   log_dir[1024];  /* "" : no log files */
    int    tee;            /* with log_dir: also print on the console */
    char  *ranks_filter;   /* NULL: show every rank; else a bitmap over global ranks */
    char   run_id[128];    /* given with --run-id, or "" */
    char **argv;           /* PROGRAM ARGS..., NULL-terminated */
} dtrun_cfg;

/* The unfinished line of one stream of one rank. */
typedef struct {
    int    fd;        /* read end of the pipe; -1 once closed */
    int    out;       /* 1 or 2: where its lines go */
    char  *buf;
    size_t len, cap;
} dtrun_stream;

typedef struct {
    int          rank;        /* local rank */
    pid_t        pid;
    int          status;      /* wait status once reaped */
    int          reaped;      /* 1; 2 while handle_signals has yet to report it */
    dtrun_stream s[2];        /* stdout, stderr */
    FILE        *log;         /* --log-dir file, or NULL */
    char        *tail[DTRUN_TAIL];   /* ring of the last stderr lines */
    int          ntail;
} dtrun_rank;

typedef struct dtrun_net dtrun_net;

/* One node's view of the job. */
typedef struct {
    const dtrun_cfg *cfg;
    char         host[256];
    char       **hosts;       /* host of every node (the layout), or NULL */
    dtrun_rank  *rk;
    pid_t        pgid;        /* the ranks' process group: the watcher's pid (dtrun_ranks.c) */
    pid_t        watcher;     /* this attempt's watcher, 0 when none */
    int          watch_fd;    /* the write end of its pipe, -1 when none */
    int          sfd;         /* signalfd: SIGCHLD, SIGINT, SIGTERM, SIGHUP */
    FILE        *log;         /* dtrun's own log in --log-dir, or NULL */
    dtrun_net   *net;         /* NULL on a single node */
    /* this attempt */
    int          attempt;     /* attempts so far: restarts and (elastic) membership rounds */
    int          restarts;    /* restarts after a rank failed (bounded by --max-restarts) */
    int          world;       /* ranks in the job this attempt */
    int          rank0;       /* this node's first global rank */
    int          nlocal;      /* ranks on this node this attempt; 0: a spare (elastic) */
    int          group;       /* this node's index among the nodes that run ranks */
    int          ngroups;     /* nodes that run ranks this attempt */
    char         change[DTRUN_CHANGE_MAX]; /* elastic: the membership change this attempt follows, or "" */
    double       change_at;   /* ... when it was noticed (seconds since the epoch) */
    int          rank_port;   /* MASTER_PORT given to the ranks */
    char         rank_addr[256]; /* MASTER_ADDR given to the ranks: --master-addr, or the
                                  * address of the node that took over from a lost node 0 */
    char         job_id[192]; /* DT_JOB_ID given to the ranks, "" to inherit */
    int          alive;
    int          stopping;
    double       kill_at;     /* > 0: SIGKILL the ranks at this time */
    int          signal;      /* a signal that stopped this dtrun */
    /* the job's first failure (this node's or another's), NULL while there is none */
    char        *fail;        /* lines without "dtrun: " */
    int          fail_code;   /* the exit status it implies */
    int          no_restart;  /* restarting would not help (a signal, a lost node) */
    char         snap_dir[4096]; /* elastic: this node's memory directory for the ranks'
                                  * snapshots (DT_SNAPSHOT_DIR), "" when none */
} dtrun_job;

/* dtrun_util.c (calls none of the others) */
extern char dtrun_base_id[160];   /* the job's id before restarts; node 0's on every node */
/* A line (or each line of a text) behind "dtrun: " on stderr, and in job->log. */
void   dtrun_say(dtrun_job *job, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void   dtrun_say_block(dtrun_job *job, const char *text);
const char *dtrun_signame(int sig);
void   dtrun_clock(char *out, size_t n);       /* wall-clock time, UTC, for messages */
int    dtrun_free_port(void);
void   dtrun_signal_ranks(dtrun_job *job, int sig);
/* Record the job's first failure (if none yet) and stop the local ranks. */
void   dtrun_stop(dtrun_job *job, const char *desc, int code, int no_restart);
/* Drain the signalfd while no rank runs: the first SIGINT/SIGTERM/SIGHUP, or 0. */
int    dtrun_read_signal(dtrun_job *job);
/* The status every local rank of this attempt exited with, when all exited by themselves
 * with the same one; else -1. */
int    dtrun_common_exit(const dtrun_job *job);

/* dtrun_ranks.c (uses dtrun_rdzv.c for the connections it polls) */
int  dtrun_spawn(dtrun_job *job);                 /* 0, or -1 after a message */
void dtrun_supervise(dtrun_job *job);             /* until every local rank is reaped */
void dtrun_close_logs(dtrun_job *job);

/* dtrun_elastic.c (uses dtrun_util.c and dtrun_parse.c) */
/* Ask the program (DT_ELASTIC_PROBE=1, ranks' variables unset) which world sizes keep its
 * result exact; 0, or an exit status after a message. */
int  dtrun_probe(dtrun_job *job, dtrun_exact *ex);
/* The largest allowed world of at most `ranks` ranks; 0 if none. */
int  dtrun_pick_world(const dtrun_exact *ex, int ranks);
/* "1, 2, 4 and 8" */
void dtrun_sizes_text(const dtrun_exact *ex, char *out, size_t n);
/* The newest complete checkpoint under ex->ckpt_dir ("DIR/step-000000000040"), or a
 * sentence saying there is none. */
void dtrun_newest_checkpoint(const dtrun_exact *ex, char *out, size_t n);
/* The step of that checkpoint (0: none yet), or of this node's newest snapshot in
 * snap_dir (NULL or "": none) when newer: where the next attempt resumes; -1 when there is
 * neither. */
long long dtrun_newest_step(const dtrun_exact *ex, const char *snap_dir);

/* dtrun_rdzv.c (uses dtrun_elastic.c, dtrun_util.c and dtrun_parse.c) */
int  dtrun_net_start(dtrun_job *job);             /* rendezvous; 0, or an exit status */
int  dtrun_net_pollfds(dtrun_job *job, struct pollfd *pfd, int max);
void dtrun_net_ready(dtrun_job *job, struct pollfd *pfd, int n);
double dtrun_net_deadline(dtrun_job *job);        /* next heartbeat due, 0 if none */
void dtrun_net_tick(dtrun_job *job);              /* send and check heartbeats */
/* A local failure: tell the master (or, on node 0, tell everyone). */
void dtrun_net_failure(dtrun_job *job, const char *desc, int code, int no_restart);
/* Local ranks ended: wait for the job's decision. Returns -1 to run the next attempt
 * (job->attempt and rank_port updated), else the exit status of the job. */
int  dtrun_net_after(dtrun_job *job);
void dtrun_net_close(dtrun_job *job);

#endif /* DTRUN_H */
