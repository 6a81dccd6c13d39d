/*
 * dtrun.c: start the ranks of a job on this node, meet the other nodes, and watch over
 * the whole job.
 *
 *   dtrun -n 2 ./dtbench -o all_reduce                               one node
 *   dtrun -n 4 --nnodes 2 --node-rank R --master-addr node0 --master-port 29500 ./dtrain train
 *   dtrun -n 2 --nnodes 1:4 --node-rank R --master-addr node0 ./dtrain train --micro-batches 8 ...
 *
 * It does what torchrun does for PyTorch, for any program: every rank gets RANK,
 * LOCAL_RANK, WORLD_SIZE, ... (the variables launch_env.c reads), its output comes back
 * prefixed "[rankK]:", and the job ends as a unit: the first rank that fails on any node
 * takes every rank down and every dtrun names it — rank, node, how, when and its last
 * stderr lines — so a crash never leaves the others hanging in a collective (docs/DESIGN.md
 * rule 3). With --max-restarts K the job is started again, up to K times. With
 * --nnodes MIN:MAX nodes may leave and join: the job goes on at the largest world size
 * that keeps the program's result exact (dtrun_elastic.c), from its newest checkpoint.
 *
 * This file holds the command line, the attempt loop and the final report; the ranks
 * of one attempt are in dtrun_ranks.c, the meeting of the nodes in dtrun_rdzv.c, and
 * what all of them use (messages, stopping the ranks) in dtrun_util.c.
 */
#include "config.h"
#include "dtrun.h"
#include "shm_name.h"
#include "auth.h"

#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static const char usage[] =
"usage: dtrun -n N [options] [--] PROGRAM [ARGS...]\n"
"\n"
"Start N ranks of PROGRAM on this node, each with the launch variables dtrain (and\n"
"torchrun-style programs) read, and supervise them as one job, on one node or many.\n"
"\n"
"options (each may also be given as the variable in brackets; a flag wins):\n"
"  -n N, --nproc-per-node N  ranks on this node (1..4096; required)  [DTRUN_NPROC_PER_NODE]\n"
"  --nnodes M                nodes in the job (default 1)             [DTRUN_NNODES]\n"
"  --nnodes MIN:MAX          an elastic job: nodes may leave and join (see below)\n"
"  --node-rank R             this node's index, 0..M-1 (default 0)    [DTRUN_NODE_RANK]\n"
"  --master-addr A           node 0's address, given to the ranks as MASTER_ADDR\n"
"                            (default 127.0.0.1)                      [DTRUN_MASTER_ADDR]\n"
"  --master-port P           one node: the ranks' MASTER_PORT (default: a free port);\n"
"                            several nodes: the port node 0's dtrun serves the\n"
"                            rendezvous on (default 29500)            [DTRUN_MASTER_PORT]\n"
"  --rdzv-endpoint HOST:PORT the same as --master-addr HOST --master-port PORT\n"
"                                                                     [DTRUN_RDZV_ENDPOINT]\n"
"  --rdzv-timeout S          how long the nodes wait for each other (default 300)\n"
"                                                                     [DTRUN_RDZV_TIMEOUT]\n"
"  --rdzv-last-call S        elastic: once MIN nodes have joined, start when no other\n"
"                            node joined for S seconds (default 1)    [DTRUN_RDZV_LAST_CALL]\n"
"  --max-restarts K          restart all ranks after a failure, up to K times\n"
"                            (default 0)                              [DTRUN_MAX_RESTARTS]\n"
"  --monitor-interval S      seconds between the heartbeats the dtruns of a job send\n"
"                            each other (default 1)                   [DTRUN_MONITOR_INTERVAL]\n"
"  --heartbeat-timeout S     a node silent this long is lost (default 30)\n"
"                                                                     [DTRUN_HEARTBEAT_TIMEOUT]\n"
"  --log-dir DIR             write each rank's output to DIR/rankK.log and dtrun's own\n"
"                            messages to DIR/dtrun-nodeR.log instead of the console\n"
"                                                                     [DTRUN_LOG_DIR]\n"
"  --tee                     with --log-dir, print on the console too [DTRUN_TEE=1]\n"
"  --ranks-filter LIST       show only these ranks' output on the console, e.g. 0,2-3\n"
"                            (log files still get everything)         [DTRUN_RANKS_FILTER]\n"
"  --run-id ID               the job's id, given to the ranks as DT_JOB_ID; nodes that\n"
"                            give different ids are refused           [DTRUN_RUN_ID]\n"
"  --grace S                 seconds between SIGTERM and SIGKILL when the job is\n"
"                            being stopped (default 30, Slurm's KillWait): time for\n"
"                            dtrain to checkpoint on SIGTERM          [DTRUN_GRACE]\n"
"  --secure-transport MODE   seal the ranks' traffic between hosts after the handshake:\n"
"                            off (default), auth (integrity) or encrypt (and secrecy);\n"
"                            every node the same        [DTRUN_SECURE_TRANSPORT, DT_SECURE]\n"
"  -h, --help                this text\n"
"  --                        end of options (PROGRAM may also simply follow them)\n"
"\n"
"every rank's environment:\n"
"  RANK                      node_rank * N + LOCAL_RANK\n"
"  LOCAL_RANK                0..N-1\n"
"  WORLD_SIZE                M * N;  LOCAL_WORLD_SIZE  N;  DT_NNODES  M\n"
"  NODE_RANK, GROUP_RANK     this node's index\n"
"  MASTER_ADDR, MASTER_PORT  where rank 0 serves the job's store (on several nodes the\n"
"                            port is a free one node 0 chooses for each attempt)\n"
"  DT_JOB_ID                 --run-id, else inherited if set, else a fresh random id;\n"
"                            \"-rK\" is appended on restart K\n"
"  DT_JOB_SECRET             inherited when set (or DT_JOB_SECRET_FILE); else, on one node,\n"
"                            a fresh random secret every connection of the job proves;\n"
"                            nodes of a multi-node job must share one (see README, Security)\n"
"  DT_RESTART_COUNT          0 on the first attempt, K on restart K\n"
"  DT_MAX_RESTARTS           --max-restarts\n"
"  OMP_NUM_THREADS, OPENBLAS_NUM_THREADS   max(1, cores / N) unless already set\n"
"stdin of every rank is /dev/null.\n"
"\n"
"output: each line a rank writes is printed whole, prefixed \"[rankK]:\", on dtrun's\n"
"stdout or stderr like the rank wrote it; a last line without a newline is printed\n"
"with one added.\n"
"\n"
"several nodes: start one dtrun per node with the same -n, --nnodes, --master-addr and\n"
"--master-port and its own --node-rank. Node 0's dtrun serves the rendezvous; the others\n"
"retry reaching it until --rdzv-timeout, saying why they cannot. Nodes that disagree\n"
"about --nnodes, --nproc-per-node or --run-id, or a node rank given twice, are refused\n"
"with a message naming both. The dtruns watch each other: a node whose dtrun dies, or\n"
"that stays silent for --heartbeat-timeout, is lost, and the job ends.\n"
"\n"
"failure: when a rank on any node exits non-zero or is killed by a signal, every node\n"
"sends its ranks SIGTERM, SIGKILL after the grace period, and every dtrun prints\n"
"  dtrun: rank K (pid P) failed first: exit code C   (or: killed by signal SIGNAME)\n"
"  dtrun:   on node R (host), local rank L, at TIME, attempt A of K+1\n"
"  dtrun:   last lines of its stderr: ...\n"
"With --max-restarts K every rank is then started again, up to K times. SIGINT, SIGTERM,\n"
"SIGHUP and SIGUSR1 sent to a dtrun are forwarded to its ranks, once to each (a second\n"
"one, or the end of --grace, sends SIGKILL), and end the job on every node, without\n"
"restart; dtrun waits for its ranks before it exits. dtrain train takes SIGTERM and\n"
"SIGUSR1 as preemption: every rank finishes its step, the checkpoint is written, and the\n"
"ranks exit 75.\n"
"Ranks run in their own process group, with what they start, and are killed if dtrun\n"
"dies, also by SIGKILL: a process named dtrun-watch leads the group and ends it then.\n"
"\n"
"exit status:\n"
"  0        every rank exited 0 (on the last attempt)\n"
"  C        the first rank to fail exited with code C\n"
"  128+S    the first rank to fail was killed by signal S, or a dtrun of the job was\n"
"           stopped by signal S (130 for SIGINT)\n"
"  E        stopped by a signal, one node: every rank exited by itself with status E\n"
"           (dtrain train on SIGTERM or SIGUSR1: 75, checkpointed; --resume auto)\n"
"  1        dtrun could not start the job, or a node was lost\n"
"  2        bad command line, or nodes that disagree\n"
"\n"
"elastic jobs (--nnodes MIN:MAX; every node gives the same MIN:MAX, -n and program):\n"
"node 0 serves the rendezvous; the others give --node-rank 1..MAX-1 as\n"
"their id. Node 0 first asks the program (DT_ELASTIC_PROBE=1) which world sizes keep its\n"
"result exact (dtrain train: the powers of two dividing --micro-batches, times\n"
"--pipeline) and refuses MIN:MAX where none fits. The job starts once MAX nodes joined,\n"
"or MIN and then none for --rdzv-last-call. Each attempt runs the largest allowed world\n"
"the live nodes hold (node 0 first, then by node rank); the other nodes wait as spares.\n"
"A node whose dtrun ends or stays silent for --heartbeat-timeout is lost: the ranks\n"
"still running are killed and the job starts again on the nodes left (a spare takes\n"
"the lost ranks) from the newest state (give dtrain --resume auto): the snapshot the\n"
"nodes keep in memory (each dtrun gives its ranks a directory in /dev/shm as\n"
"DT_SNAPSHOT_DIR; dtrain --snapshot-every), or the newest checkpoint when newer\n"
"(--checkpoint-dir). A node that joins a running job waits as a spare; when it lets the world grow,\n"
"the ranks are sent SIGTERM (dtrain checkpoints the step and exits 75) and the job\n"
"starts again at the new size. Each change is one line 'dtrun: membership: ...' on\n"
"node 0, and the ranks get it as DT_ELASTIC_CHANGE (dtrain writes it to its metrics).\n"
"Fewer than MIN nodes, or none of the allowed sizes, for --rdzv-timeout ends the job\n"
"(exit 1), naming the lost nodes and the newest checkpoint. Losses and joins do not\n"
"count against --max-restarts; a rank that fails while every node is alive does.\n"
"Node 0 may be lost too: the first node left of the live nodes it listed serves the\n"
"rendezvous from then on, if more than half of the nodes meet there again; a server\n"
"that keeps fewer than half stops (exit 1), so a cut link cannot make two jobs (with\n"
"two nodes, node 0 goes on and node 1 ends). Nodes started later cannot join then.\n";

/* ---- ports ---------------------------------------------------------------------------- */

/* Is a given port free to listen on here? 0 if so, else errno. (Like the store, with
 * SO_REUSEADDR, so a port in TIME_WAIT from a previous run counts as free.) */
static int port_taken(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return errno;
    int one = 1, err = 0;
    (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_ANY);
    sa.sin_port = htons((uint16_t)port);
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, 1) != 0) err = errno;
    close(fd);
    return err;
}

/* ---- command line ------------------------------------------------------------------- */

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

static long parse_long(const char *what, const char *v, long lo, long hi) {
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (!*v || *end || errno || x < lo || x > hi)
        die_usage("%s: expected an integer in %ld..%ld, got '%s'", what, lo, hi, v);
    return x;
}

static double parse_seconds(const char *what, const char *v, double lo, double hi) {
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (!*v || *end || errno || !(x >= lo && x <= hi))
        die_usage("%s: expected seconds in %g..%g, got '%s'", what, lo, hi, v);
    return x;
}

static void copy_value(const char *what, char *dst, size_t cap, const char *v, const char *expected) {
    if (!*v || strlen(v) >= cap) die_usage("%s: expected %s, got '%s'", what, expected, v);
    snprintf(dst, cap, "%s", v);
}

enum { O_NPROC, O_NNODES, O_NODE_RANK, O_ADDR, O_PORT, O_RDZV, O_RDZV_TIMEOUT, O_LAST_CALL, O_RESTARTS,
       O_MONITOR, O_HB_TIMEOUT, O_LOG_DIR, O_TEE, O_FILTER, O_RUN_ID, O_GRACE, O_SECURE,
       O_COUNT };

static const struct { const char *flag, *env; int takes_value; } options[O_COUNT] = {
    [O_NPROC]        = { "--nproc-per-node",    "DTRUN_NPROC_PER_NODE",    1 },
    [O_NNODES]       = { "--nnodes",            "DTRUN_NNODES",            1 },
    [O_NODE_RANK]    = { "--node-rank",         "DTRUN_NODE_RANK",         1 },
    [O_ADDR]         = { "--master-addr",       "DTRUN_MASTER_ADDR",       1 },
    [O_PORT]         = { "--master-port",       "DTRUN_MASTER_PORT",       1 },
    [O_RDZV]         = { "--rdzv-endpoint",     "DTRUN_RDZV_ENDPOINT",     1 },
    [O_RDZV_TIMEOUT] = { "--rdzv-timeout",      "DTRUN_RDZV_TIMEOUT",      1 },
    [O_LAST_CALL]    = { "--rdzv-last-call",    "DTRUN_RDZV_LAST_CALL",    1 },
    [O_RESTARTS]     = { "--max-restarts",      "DTRUN_MAX_RESTARTS",      1 },
    [O_MONITOR]      = { "--monitor-interval",  "DTRUN_MONITOR_INTERVAL",  1 },
    [O_HB_TIMEOUT]   = { "--heartbeat-timeout", "DTRUN_HEARTBEAT_TIMEOUT", 1 },
    [O_LOG_DIR]      = { "--log-dir",           "DTRUN_LOG_DIR",           1 },
    [O_TEE]          = { "--tee",               "DTRUN_TEE",               0 },
    [O_FILTER]       = { "--ranks-filter",      "DTRUN_RANKS_FILTER",      1 },
    [O_RUN_ID]       = { "--run-id",            "DTRUN_RUN_ID",            1 },
    [O_GRACE]        = { "--grace",             "DTRUN_GRACE",             1 },
    [O_SECURE]       = { "--secure-transport",  "DTRUN_SECURE_TRANSPORT",  1 },
};

static const char *filter_text;   /* checked once the world size is known */

/* Apply option o with value v; `what` names the flag or variable in messages. */
static void apply(dtrun_cfg *cfg, int o, const char *what, const char *v) {
    switch (o) {
    case O_NPROC:   cfg->nproc = (int)parse_long(what, v, 1, DTRUN_MAX_RANKS); break;
    case O_NNODES: {
        const char *colon = strchr(v, ':');
        if (!colon) {
            cfg->nnodes = cfg->min_nodes = (int)parse_long(what, v, 1, DTRUN_MAX_NODES);
            cfg->elastic = 0;
            break;
        }
        char lo[32], w[160];
        if ((size_t)(colon - v) >= sizeof lo) die_usage("%s: expected M or MIN:MAX, got '%s'", what, v);
        snprintf(lo, sizeof lo, "%.*s", (int)(colon - v), v);
        snprintf(w, sizeof w, "%s (MIN)", what);
        cfg->min_nodes = (int)parse_long(w, lo, 1, DTRUN_MAX_NODES);
        snprintf(w, sizeof w, "%s (MAX)", what);
        cfg->nnodes = (int)parse_long(w, colon + 1, 1, DTRUN_MAX_NODES);
        if (cfg->min_nodes > cfg->nnodes)
            die_usage("%s: MIN %d is more than MAX %d in '%s'", what, cfg->min_nodes, cfg->nnodes, v);
        if (cfg->nnodes < 2)
            die_usage("%s: '%s' allows one node only: nodes that come and go need MAX >= 2 (or give --nnodes 1)",
                      what, v);
        cfg->elastic = 1;
        break;
    }
    case O_NODE_RANK: cfg->node_rank = (int)parse_long(what, v, 0, DTRUN_MAX_NODES - 1); break;
    case O_ADDR:
        copy_value(what, cfg->master_addr, sizeof cfg->master_addr, v, "a host name or address");
        break;
    case O_PORT:
        cfg->master_port = (int)parse_long(what, v, 1, 65535);
        cfg->port_given = 1;
        break;
    case O_RDZV: {
        const char *colon = strrchr(v, ':');
        if (!colon || colon == v || (size_t)(colon - v) >= sizeof cfg->master_addr)
            die_usage("%s: expected HOST:PORT, got '%s'", what, v);
        snprintf(cfg->master_addr, sizeof cfg->master_addr, "%.*s", (int)(colon - v), v);
        char pw[128];
        snprintf(pw, sizeof pw, "%s (the port)", what);
        cfg->master_port = (int)parse_long(pw, colon + 1, 1, 65535);
        cfg->port_given = 1;
        break;
    }
    case O_RDZV_TIMEOUT: cfg->rdzv_timeout_s = parse_seconds(what, v, 0.1, 86400); break;
    case O_LAST_CALL: cfg->last_call_s = parse_seconds(what, v, 0, 3600); break;
    case O_RESTARTS: cfg->max_restarts = (int)parse_long(what, v, 0, 1000000); break;
    case O_MONITOR:  cfg->monitor_s = parse_seconds(what, v, 0.01, 3600); break;
    case O_HB_TIMEOUT: cfg->hb_timeout_s = parse_seconds(what, v, 0.1, 86400); break;
    case O_LOG_DIR:
        copy_value(what, cfg->log_dir, sizeof cfg->log_dir, v, "a directory");
        break;
    case O_TEE:
        if (!v || strcmp(v, "1") == 0) cfg->tee = 1;
        else if (strcmp(v, "0") == 0) cfg->tee = 0;
        else die_usage("%s: expected 0 or 1, got '%s'", what, v);
        break;
    case O_FILTER: filter_text = v; break;
    case O_RUN_ID:
        copy_value(what, cfg->run_id, sizeof cfg->run_id, v, "an id of 1..127 characters");
        for (const char *p = v; *p; p++)
            if (*p <= ' ' || *p == 127) die_usage("%s: expected an id without spaces, got '%s'", what, v);
        break;
    case O_GRACE: cfg->grace_s = parse_seconds(what, v, 0, 3600); break;
    case O_SECURE:   /* the ranks' comm layer reads it (seal.h); every node must give the same */
        if (strcmp(v, "off") && strcmp(v, "auth") && strcmp(v, "encrypt"))
            die_usage("%s: expected off, auth or encrypt, got '%s'", what, v);
        setenv("DT_SECURE", v, 1);
        break;
    }
}

/* "0,2-3" over ranks 0..world-1 into a bitmap. */
static char *parse_filter(const char *what, const char *text, int world) {
    char *map = calloc((size_t)world, 1);
    if (!map) die_usage("out of memory");
    const char *p = text;
    while (*p) {
        char *end;
        long a = strtol(p, &end, 10), b;
        if (end == p || a < 0) goto bad;
        b = a;
        if (*end == '-') {
            const char *q = end + 1;
            b = strtol(q, &end, 10);
            if (end == q || b < a) goto bad;
        }
        if (b >= world)
            die_usage("%s: rank %ld is outside 0..%d of this job, got '%s'", what, b, world - 1, text);
        for (long r = a; r <= b; r++) map[r] = 1;
        if (*end == ',') end++;
        else if (*end) goto bad;
        p = end;
    }
    return map;
bad:
    die_usage("%s: expected ranks like 0,2-3, got '%s'", what, text);
}

static void parse_args(int argc, char **argv, dtrun_cfg *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->nnodes = cfg->min_nodes = 1;
    cfg->last_call_s = 1.0;
    cfg->grace_s = 30.0;   /* Slurm's KillWait */
    cfg->monitor_s = 1.0;
    cfg->hb_timeout_s = 30.0;
    cfg->rdzv_timeout_s = 300.0;
    snprintf(cfg->master_addr, sizeof cfg->master_addr, "127.0.0.1");
    const char *filter_what = "--ranks-filter";
    /* variables first, so that flags win */
    for (int o = 0; o < O_COUNT; o++) {
        const char *v = getenv(options[o].env);
        if (!v || (!*v && o != O_TEE)) continue;
        apply(cfg, o, options[o].env, v);
        if (o == O_FILTER) filter_what = options[o].env;
    }
    int i = 1;
    for (; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--") == 0) { i++; break; }
        if (a[0] != '-' || a[1] == '\0') break;   /* PROGRAM */
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            fputs(usage, stdout);
            exit(0);
        }
        if (strcmp(a, "-n") == 0) {
            if (i + 1 >= argc) die_usage("-n: missing value");
            apply(cfg, O_NPROC, "-n", argv[++i]);
            continue;
        }
        if (strncmp(a, "-n", 2) == 0 && a[2] != '-') {
            apply(cfg, O_NPROC, "-n", a + 2);
            continue;
        }
        int o = 0;
        size_t fl = 0;
        for (; o < O_COUNT; o++) {
            fl = strlen(options[o].flag);
            if (strncmp(a, options[o].flag, fl) == 0 && (a[fl] == '\0' || a[fl] == '=')) break;
        }
        if (o == O_COUNT) die_usage("unknown option '%s'", a);
        const char *v = NULL;
        if (a[fl] == '=') v = a + fl + 1;
        else if (options[o].takes_value) {
            if (i + 1 >= argc) die_usage("%s: missing value", options[o].flag);
            v = argv[++i];
        }
        apply(cfg, o, options[o].flag, v);
        if (o == O_FILTER) filter_what = options[o].flag;
    }
    if (cfg->nproc == 0) die_usage("-n N (the number of ranks) is required");
    if (cfg->node_rank >= cfg->nnodes)
        die_usage("--node-rank %d: expected 0..%d for --nnodes %d", cfg->node_rank, cfg->nnodes - 1, cfg->nnodes);
    if ((long)cfg->nnodes * cfg->nproc > 1000000)
        die_usage("--nnodes %d x --nproc-per-node %d: more than 1000000 ranks", cfg->nnodes, cfg->nproc);
    if (cfg->nnodes > 1 && !cfg->port_given) cfg->master_port = 29500;
    if (filter_text) cfg->ranks_filter = parse_filter(filter_what, filter_text, cfg->nnodes * cfg->nproc);
    if (i >= argc) die_usage("no program to run");
    if (cfg->elastic && getenv("OMPI_COMM_WORLD_RANK"))
        die_usage("--nnodes %d:%d under mpirun: mpirun's job cannot change its processes; an elastic job needs "
                  "one dtrun per node, started by itself or by srun", cfg->min_nodes, cfg->nnodes);
    cfg->argv = argv + i;
}

/* ---- the job ------------------------------------------------------------------------ */

/* The id of the first attempt: --run-id, else the inherited DT_JOB_ID, else a fresh one. */
static void base_run_id(const dtrun_cfg *cfg, char *out, size_t n) {
    const char *env = getenv("DT_JOB_ID");
    if (cfg->run_id[0]) { snprintf(out, n, "%s", cfg->run_id); return; }
    if (env && *env) { snprintf(out, n, "%s", env); return; }
    unsigned char rnd[8];
    if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd) {
        uint64_t x = (uint64_t)getpid() * 0x9E3779B97F4A7C15ULL ^ (uint64_t)time(NULL);
        memcpy(rnd, &x, sizeof rnd);
    }
    snprintf(out, n, "dtrun-");
    for (size_t i = 0; i < sizeof rnd; i++)
        snprintf(out + strlen(out), n - strlen(out), "%02x", rnd[i]);
}

static void set_job_id(dtrun_job *job) {
    const char *env = getenv("DT_JOB_ID");
    if (job->attempt == 0 && !job->cfg->run_id[0] && env && *env && strcmp(env, dtrun_base_id) == 0)
        job->job_id[0] = '\0';   /* inherited as it is, whatever its length */
    else if (job->attempt == 0)
        snprintf(job->job_id, sizeof job->job_id, "%s", dtrun_base_id);
    else
        snprintf(job->job_id, sizeof job->job_id, "%.*s-r%d", 120, dtrun_base_id, job->attempt);
}

static int open_log_dir(dtrun_job *job) {
    const dtrun_cfg *cfg = job->cfg;
    if (mkdir(cfg->log_dir, 0777) != 0 && errno != EEXIST) {
        fprintf(stderr, "dtrun: --log-dir %s: cannot create it: %s\n", cfg->log_dir, strerror(errno));
        return -1;
    }
    char path[1100];
    snprintf(path, sizeof path, "%s/dtrun-node%d.log", cfg->log_dir, cfg->node_rank);
    if (!(job->log = fopen(path, "w"))) {
        fprintf(stderr, "dtrun: --log-dir: cannot write %s: %s\n", path, strerror(errno));
        return -1;
    }
    return 0;
}

int main(int argc, char **argv) {
    dtrun_cfg cfg;
    parse_args(argc, argv, &cfg);
    dtrun_job job;
    memset(&job, 0, sizeof job);
    job.cfg = &cfg;
    snprintf(job.rank_addr, sizeof job.rank_addr, "%s", cfg.master_addr);
    if (gethostname(job.host, sizeof job.host - 1) != 0) snprintf(job.host, sizeof job.host, "unknown-host");
    base_run_id(&cfg, dtrun_base_id, sizeof dtrun_base_id);
    /* The ranks of a one-node job prove a fresh secret to each other; the nodes of a
     * multi-node job must share one the user gives (DT_JOB_SECRET or _FILE). */
    if (cfg.nnodes == 1 && !(getenv("DT_JOB_SECRET") && *getenv("DT_JOB_SECRET")) &&
        !(getenv("DT_JOB_SECRET_FILE") && *getenv("DT_JOB_SECRET_FILE"))) {
        char secret[65];
        dt_auth_new_secret(secret);
        setenv("DT_JOB_SECRET", secret, 1);
    }
    int rc = 1;
    if (cfg.log_dir[0] && open_log_dir(&job) != 0) goto out;

    /* Signals arrive through a signalfd; blocked before fork, unblocked in the children. */
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGCHLD);
    sigaddset(&mask, SIGINT);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGHUP);
    sigaddset(&mask, SIGUSR1);
    if (sigprocmask(SIG_BLOCK, &mask, NULL) != 0) {
        dtrun_say(&job, "sigprocmask: %s", strerror(errno));
        goto out;
    }
    job.sfd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
    if (job.sfd < 0) {
        dtrun_say(&job, "signalfd: %s", strerror(errno));
        goto out;
    }
    signal(SIGPIPE, SIG_IGN);   /* a closed stdout or peer must not kill the supervisor */
    /* A blocked signal that is also ignored is discarded, never reaching the signalfd.
     * Shells start background commands with SIGINT ignored; dtrun still wants to hear
     * it, so restore the default (it stays blocked). SIGHUP ignored by nohup stays so. */
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGUSR1, SIG_DFL);

    /* the layout of a single node, and of a fixed multi-node job until node 0 says it */
    job.world = cfg.nnodes * cfg.nproc;
    job.rank0 = cfg.node_rank * cfg.nproc;
    job.nlocal = cfg.nproc;
    job.group = cfg.node_rank;
    job.ngroups = cfg.nnodes;
    if (!(job.rk = calloc((size_t)cfg.nproc, sizeof *job.rk))) {
        dtrun_say(&job, "out of memory");
        goto out;
    }
    if (cfg.nnodes > 1) {
        if ((rc = dtrun_net_start(&job)) != 0) goto out;   /* meets the other nodes; sets rank_port */
    } else if (cfg.port_given) {
        int err = port_taken(cfg.master_port);
        if (err) {
            dtrun_say(&job, "--master-port %d cannot be used on this host: %s (another job may hold it; "
                      "choose another port or omit --master-port)", cfg.master_port, strerror(err));
            goto out;
        }
        job.rank_port = cfg.master_port;
    }

    if (cfg.elastic) {   /* the ranks keep their snapshots in this node's memory (train_snap.c) */
        int err = dt_shm_dir_make(job.snap_dir, sizeof job.snap_dir, "snap");
        if (err) {
            dtrun_say(&job, "warning: no in-memory snapshots on this node: cannot create a directory in /dev/shm: %s",
                      strerror(err));
            job.snap_dir[0] = '\0';
            unsetenv("DT_SNAPSHOT_DIR");
        } else {
            setenv("DT_SNAPSHOT_DIR", job.snap_dir, 1);
        }
    }
    for (;;) {
        if (cfg.nnodes == 1 && !cfg.port_given && !(job.rank_port = dtrun_free_port())) {
            dtrun_say(&job, "cannot find a free TCP port: %s (give --master-port)", strerror(errno));
            rc = 1;
            goto out;
        }
        set_job_id(&job);
        if (job.nlocal == 0) {
            /* a spare of an elastic job: no ranks this attempt */
        } else if (dtrun_spawn(&job) != 0) {
            if (!job.net) { rc = 1; goto out; }
            char d[512];
            snprintf(d, sizeof d, "node %d (%s) could not start its ranks", cfg.node_rank, job.host);
            dtrun_net_failure(&job, d, 1, 1);
            dtrun_stop(&job, d, 1, 1);
        } else {
            dtrun_supervise(&job);
        }
        dtrun_close_logs(&job);
        if (job.net) {
            rc = dtrun_net_after(&job);   /* the job's decision, from node 0 */
        } else if (job.fail && !job.no_restart && job.restarts < cfg.max_restarts) {
            dtrun_say_block(&job, job.fail);
            dtrun_say(&job, "restarting all ranks (restart %d of %d)", job.restarts + 1, cfg.max_restarts);
            job.attempt++;
            job.restarts++;
            rc = -1;
        } else {
            rc = job.fail ? job.fail_code : job.signal ? 128 + job.signal : 0;
            if (job.fail) dtrun_say_block(&job, job.fail);
        }
        int own = -1;   /* after a signal: the status every rank exited with by itself, if one */
        if (rc >= 0 && job.signal && !job.fail && !job.net) {
            own = dtrun_common_exit(&job);
            if (own >= 0) rc = own;
        }
        if (rc >= 0) {
            if (job.signal && own >= 0)
                dtrun_say(&job, "stopped by %s; every rank exited by itself with status %d", dtrun_signame(job.signal), own);
            else if (job.signal)
                dtrun_say(&job, "stopped by %s; all ranks ended", dtrun_signame(job.signal));
            break;
        }
        free(job.fail);
        job.fail = NULL;
        job.no_restart = 0;
    }
out:   /* everything dtrun holds, released on every way out (LeakSanitizer stays quiet) */
    dtrun_net_close(&job);
    if (job.snap_dir[0]) dt_shm_dir_remove(job.snap_dir);
    free(job.rk);
    free(job.fail);
    free(cfg.ranks_filter);
    if (job.sfd > 0) close(job.sfd);
    if (job.log) fclose(job.log);
    return rc;
}
