/*
 * dtrain.c: the dtrain program — train, eval, model and prepare-text (check, plot,
 * report, sample and plan live in files of their own, tools.h).
 *
 *   dtrain train [flags]                         train (default: cnn on Fashion-MNIST)
 *   dtrain eval --model SPEC --weights FILE      test accuracy and loss of saved weights
 *   dtrain model --model SPEC                    layers, output shapes, parameter counts
 *   dtrain prepare-text OUT_DIR FILE...          byte-level token files for tokens:OUT_DIR
 *   dtrain export CKPT -o FILE                   a checkpoint's whole model as one file (export.c)
 *
 * Run it as it is for one process, or under `dtrun -n N`, `mpirun -np N` or
 * `srun`: the launch environment says the rank and world size, and then every
 * rank trains its share of each global batch (train.h). Only rank 0 prints,
 * writes metrics and saves weights; errors name the rank that speaks.
 * Exit codes: 0 success, 2 bad input (flags, files, specs), 1 runtime failure,
 * 75 (EX_TEMPFAIL) `train` stopped on SIGTERM or SIGUSR1 after a checkpoint: resume later.
 */
#include "config.h"   /* _GNU_SOURCE: sched_getaffinity */

#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

#include "amp.h"   /* dt_precision_parse */
#include "args.h"
#include "checkpoint.h"
#include "comm.h"
#include "data.h"
#include "launch_env.h"
#include "model.h"
#include "ops.h"
#include "optim.h"
#include "testing.h"
#include "sbuf.h"
#include "tool_util.h"
#include "peak.h"
#include "tools.h"
#include "clock.h"
#include "train.h"

static const char *usage_main =
    "usage: dtrain COMMAND [flags]\n"
    "\n"
    "Commands:\n"
    "  train         train a model (default: the cnn preset on Fashion-MNIST)\n"
    "  eval          evaluate saved weights on the test split\n"
    "  sample        generate text with a trained token model (gpt)\n"
    "  model         print a model's layers, output shapes and parameter counts\n"
    "  check         prove that N processes compute what 1 process computes (dtrain check --np 2)\n"
    "  plan          the memory per rank of a run, by sharding mode and precision, and its wall\n"
    "  plot          draw the loss curves of metrics files (PNG through gnuplot, or --text)\n"
    "  report        one HTML page of charts about runs, from their metrics files\n"
    "  prepare-text  byte-level token files (train.bin, val.bin) from text, for --data tokens:DIR\n"
    "  export        the whole model of a checkpoint (sharded or not) as one safetensors file\n"
    "\n"
    "Run `dtrain COMMAND --help` for the flags of a command, `dtrain --version` for the\n"
    "version. For several processes,\n"
    "start it under a launcher: `dtrun -n 2 dtrain train`, `mpirun -np 2 dtrain train`\n"
    "or `srun dtrain train`.\n";

static const char *usage_eval =
    "usage: dtrain eval --model SPEC --weights FILE [--data SPEC]\n"
    "                   [--normalize auto|standard|unit|none] [--loss ce|mse] [--threads N]\n"
    "\n"
    "Prints the test accuracy and mean loss of FILE (safetensors written by\n"
    "dtrain train --save, or a sharded checkpoint's index JSON or directory) for the\n"
    "model SPEC on the test split of --data, normalised as in training (give the\n"
    "--normalize that training had), the loss being --loss (default ce; see dtrain\n"
    "train --help).\n";

static const char *usage_model =
    "usage: dtrain model --model SPEC [--input C,H,W | --data SPEC]\n"
    "\n"
    "Prints each layer with its output shape and parameter count, and the totals.\n"
    "The input shape comes from --input or from the data (default: a token model's\n"
    "window, else 1,28,28).\n";

static const char *usage_prepare_text =
    "usage: dtrain prepare-text OUT_DIR FILE...\n"
    "\n"
    "Writes token files for --data tokens:OUT_DIR: every byte of the FILEs, one\n"
    "after another in the order given, is one token (vocabulary 256). The first\n"
    "90 % (int(total * 0.9)) go to OUT_DIR/train.bin, the rest to OUT_DIR/val.bin,\n"
    "in llm.c's format (a 1024-byte header: int32 magic 20240520, version 1, token\n"
    "count; then uint16 little-endian tokens). Each file is written atomically;\n"
    "OUT_DIR is created if missing. Prints \"N tokens: train A, val B\".\n"
    "make_bytes_bin.py sorts its inputs: give the FILEs in sorted order (a glob\n"
    "under LC_ALL=C) for byte-identical files.\n";

/* ---- shared setup ----------------------------------------------------------------- */

static int g_rank = 0, g_world = 1;

/* A file can be created at path: its directory exists and is writable, and path is
 * not a directory. Bad input (exit 2) otherwise, naming the flag. */
static dt_status check_writable(const char *flag, const char *path) {
    char dir[4096];
    struct stat st;
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash) snprintf(dir, sizeof dir, ".");
    else if (slash == dir) dir[1] = '\0';
    else *slash = '\0';
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        return dt_error(DT_ERR_INVALID, "%s: %s is a directory, expected a file name", flag, path);
    if (access(dir, W_OK | X_OK) != 0)
        return dt_error(DT_ERR_INVALID, "%s: cannot create %s: directory %s: %s", flag, path, dir, strerror(errno));
    return DT_OK;
}

static int fail(dt_status s) {
    char buf[1200];
    const char *msg = dt_tool_error(buf, sizeof buf);   /* the flag, where the library names a field */
    if (g_world > 1 && strncmp(msg, "rank ", 5) != 0)
        fprintf(stderr, "dtrain: rank %d: %s\n", g_rank, msg);
    else
        fprintf(stderr, "dtrain: %s\n", msg);
    return dt_exit_code(s);
}

static dt_status setup_threads(const dt_ops *ops, int64_t threads, int local_size, int *used) {
    if (threads <= 0) {
        const char *e = getenv("OMP_NUM_THREADS");
        if (e && *e) DT_TRY(dt_arg_int("OMP_NUM_THREADS", e, 1, 4096, 0, &threads));
    }
    if (threads <= 0) {
        /* the host's cores shared by its ranks, but no more than this process may run
         * on: a launcher that binds each rank to its cores (mpirun, srun) says so in
         * the affinity mask */
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        threads = cores / (local_size > 0 ? local_size : 1);
        cpu_set_t mask;
        if (sched_getaffinity(0, sizeof mask, &mask) == 0 && CPU_COUNT(&mask) > 0 && CPU_COUNT(&mask) < threads)
            threads = CPU_COUNT(&mask);
        if (threads < 1) threads = 1;
    }
    if (used) *used = (int)threads;
    return ops->set_threads((int)threads);
}

/* A communicator when a launcher started several processes (or a backend was
 * asked for); NULL for a plain single-process run. */
static dt_status setup_comm(const char *backend, const char *init, const char *secure, int quiet, dt_comm **out,
                            int *local_size) {
    dt_launch_env env;
    *out = NULL;
    *local_size = 1;
    DT_TRY(dt_launch_env_discover(&env));
    if (env.size <= 1 && !backend && !init) return DT_OK;
    dt_comm_opts o;
    dt_comm_opts_default(&o);
    o.backend = backend;
    o.init_method = init;
    o.secure = secure;
    DT_TRY(dt_comm_init(&o, out));
    g_rank = dt_comm_rank(*out);
    g_world = dt_comm_size(*out);
    *local_size = dt_comm_local_size(*out);
    if (g_rank == 0 && !quiet && strcmp(dt_comm_secure(*out), "off") != 0) {
        printf("dtrain: secure transport: %s between ranks' sockets\n", dt_comm_secure(*out));
        fflush(stdout);
    }
    /* the laptop path, `mpirun -np 2 dtrain train`: say what was chosen for the user */
    const char *rdzv = dt_comm_rendezvous(*out);
    if (g_rank == 0 && !quiet && strncmp(rdzv, "mpirun ", 7) == 0) {
        printf("dtrain: mpirun set no MASTER_ADDR/MASTER_PORT: %s backend, rendezvous at %s through MPI "
               "(--backend mpi for MPI's own collectives)\n", dt_comm_backend(*out), rdzv + 7);
        fflush(stdout);
    }
    return DT_OK;
}

/* ---- progress and metrics ------------------------------------------------------------ */

typedef struct {
    FILE *metrics;           /* NULL once a write to it failed */
    const char *metrics_path;
    int   metrics_best_effort;
    int   metrics_errno;     /* > 0: a write to the metrics file failed with this */
    int64_t metrics_lost_at; /* ... at this step: its lines from there on are lost */
    int   quiet, tty, rank0;
    int   bar_open;
    int64_t tokens;          /* tokens per sample (> 1: a token model; progress in tokens/s) */
    double  flops_per_token; /* for model FLOPs utilisation */
    dt_peak peak;            /* one process's peak (peak.h); MFU is against it x the world size */
    int     peak_raised;     /* the run went above it once: said */
    int     world;
    int     threads;         /* compute threads of this process */
    const char *gemm;        /* the kernel of the run's matrix products (ops.h dt_ops_gemm_name) */
    const dt_train_opts *o;  /* the run's settings, for the metrics file's start line */
    const char *change;      /* an elastic job's membership change before this run (dtrun's
                                DT_ELASTIC_CHANGE), said at the first step; NULL when none */
    double change_at;        /* when dtrun noticed it (DT_ELASTIC_SINCE, seconds since the epoch) */
    int64_t resumed_at;      /* the step this run starts after */
} reporter;

static void metrics_flush(reporter *r, int64_t step);

/* The metrics file's first line of a run: its settings (a resumed run writes one too,
 * with the step it starts after) */
static void metrics_start(reporter *r, const dt_train_event *ev) {
    const dt_train_opts *o = r->o;
    dt_sbuf b = {0};
    dt_sbuf_str_(&b, "{\"event\":\"start\",\"model\":\"");
    dt_sbuf_json_(&b, o ? o->model : "");
    dt_sbuf_printf_(&b, "\",\"step\":%lld,\"total_steps\":%lld,\"world_size\":%d,\"threads\":%d,\"batch\":%lld,"
                    "\"micro_batches\":%d,\"nparams\":%lld,\"train_samples\":%lld,\"precision\":\"",
                    (long long)ev->step, (long long)ev->total_steps, ev->world_size, r->threads,
                    (long long)(o ? o->batch : 0), ev->micro_batches, (long long)ev->nparams,
                    (long long)ev->train_samples);
    dt_sbuf_json_(&b, ev->precision ? ev->precision : "fp32");
    dt_sbuf_str_(&b, "\",\"optim\":\"");
    dt_sbuf_json_(&b, o ? o->optim : "");
    dt_sbuf_printf_(&b, "\",\"lr\":%.9g,\"shard\":\"", o ? o->lr : 0.0);
    dt_sbuf_json_(&b, o && o->shard ? o->shard : "none");
    dt_sbuf_str_(&b, "\",\"gemm\":\"");
    dt_sbuf_json_(&b, r->gemm ? r->gemm : "");
    dt_sbuf_str_(&b, "\"");
    if (r->tokens > 1 && r->peak.gflops > 0) {
        dt_sbuf_printf_(&b, ",\"peak_gflops\":%.1f,\"peak\":\"", r->peak.gflops);
        dt_sbuf_json_(&b, r->peak.source);
        dt_sbuf_str_(&b, "\"");
    }
    if (ev->plan_bytes > 0) dt_sbuf_printf_(&b, ",\"plan_bytes\":%.0f", ev->plan_bytes);
    if (ev->pipeline) {
        dt_sbuf_str_(&b, ",\"pipeline\":\"");
        dt_sbuf_json_(&b, ev->pipeline);
        dt_sbuf_str_(&b, "\"");
    }
    if (r->change) {
        dt_sbuf_str_(&b, ",\"membership\":\"");
        dt_sbuf_json_(&b, r->change);
        dt_sbuf_str_(&b, "\"");
    }
    dt_sbuf_str_(&b, "}\n");
    if (!b.oom) fputs(b.p, r->metrics);
    dt_sbuf_free_(&b);
    metrics_flush(r, ev->step);
}

/* Model FLOPs utilisation (percent) at s samples per second of the whole job, against
 * the peaks of all its processes. A rate above the peak proves the peak low: the rate
 * becomes the peak (peak.h), said once, so MFU is never above 100%. */
static double mfu(reporter *r, double s) {
    int w = r->world > 0 ? r->world : 1;
    double got = s * (double)r->tokens * r->flops_per_token / w / 1e9;   /* GFLOP/s per process */
    if (r->peak.gflops > 0 && got > r->peak.gflops) {
        double was = r->peak.gflops;
        char src[sizeof r->peak.source];
        snprintf(src, sizeof src, "%s", r->peak.source);
        dt_peak_raise(&r->peak, got);
        char where[1100] = "";
        if (!r->peak.given && r->peak.path[0]) snprintf(where, sizeof where, " (kept in %s at the end)", r->peak.path);
        if (!r->peak_raised && !r->quiet)
            printf("dtrain: MFU: this run reached %.1f GFLOP/s per process, above the peak of %.1f (%s): it is the "
                   "peak from now on%s\n", got, was, src, where);
        r->peak_raised = 1;
    }
    return r->peak.gflops > 0 ? 100.0 * got / r->peak.gflops : 0.0;
}

/* After metrics lines are written: a write that failed (a full disk, a quota) is said at
 * once, once, naming the file. The file is closed then and gets no further lines (a file
 * with a hole in the middle would read as complete); the run goes on and fails at its
 * end unless --metrics-best-effort (cmd_train). */
static void metrics_lost(reporter *r, int err, int64_t step) {
    if (r->metrics_errno) return;
    r->metrics_errno = err ? err : EIO;
    r->metrics_lost_at = step;
    if (r->bar_open) {
        fputs("\r\033[K", stderr);
        r->bar_open = 0;
    }
    fflush(stdout);
    fprintf(stderr, "dtrain: %swarning: --metrics: cannot write %s: %s; its lines from step %lld on are lost (%s)\n",
            g_world > 1 ? "rank 0: " : "", r->metrics_path, strerror(r->metrics_errno), (long long)step,
            r->metrics_best_effort ? "--metrics-best-effort: the run goes on"
                                   : "the run goes on and exits 1 at its end; --metrics-best-effort accepts this");
}

static void metrics_flush(reporter *r, int64_t step) {
    if (!r->metrics) return;
    errno = 0;
    if (fflush(r->metrics) == 0 && !ferror(r->metrics)) return;
    int err = errno;
    fclose(r->metrics);   /* fails again on what is still buffered: nothing more to learn */
    r->metrics = NULL;
    metrics_lost(r, err, step);
}

static void fmt_duration(double s, char *buf, size_t n) {
    long t = (long)(s + 0.5);
    if (t >= 3600) snprintf(buf, n, "%ldh%02ldm", t / 3600, (t / 60) % 60);
    else if (t >= 60) snprintf(buf, n, "%ldm%02lds", t / 60, t % 60);
    else snprintf(buf, n, "%lds", t);
}

/* The accounted memory as JSON members: "mem_bytes":{"params":N,...,"total":N},
 * "mem_peak_bytes":{...} (cur and peak hold DT_MEM_NCAT categories and the total). */
static void mem_json(const double *cur, const double *peak, char *buf, size_t n) {
    size_t off = 0;
    for (int which = 0; which < 2 && off < n; which++) {
        const double *v = which ? peak : cur;
        off += (size_t)snprintf(buf + off, n - off, "%s\"%s\":{", which ? "," : "", which ? "mem_peak_bytes" : "mem_bytes");
        for (int c = 0; c <= DT_MEM_TOTAL && off < n; c++)
            off += (size_t)snprintf(buf + off, n - off, "%s\"%s\":%.0f", c ? "," : "", dt_mem_cat_name(c), v[c]);
        if (off < n) off += (size_t)snprintf(buf + off, n - off, "}");
    }
}

/* The end of a run: rank 0's accounted memory, one line per category, and every
 * rank's in the metrics file ({"event":"memory","rank":R,...}; all holds `world`
 * ranks' dt_mem_stats, gathered). */
static void mem_doubles(const dt_mem_stats *m, double *cur, double *peak) {
    for (int c = 0; c <= DT_MEM_TOTAL; c++) {
        cur[c] = (double)m->cur[c];
        peak[c] = (double)m->peak[c];
    }
}

static void show_memory(reporter *r, const dt_mem_stats *all, int world, int64_t step) {
    double cur[DT_MEM_NCAT + 1], peak[DT_MEM_NCAT + 1];
    for (int q = world - 1; r->metrics && q >= 0; q--) {   /* rank 0's line last */
        char mem[1024];
        mem_doubles(&all[q], cur, peak);
        mem_json(cur, peak, mem, sizeof mem);
        fprintf(r->metrics, "{\"event\":\"memory\",\"step\":%lld,\"rank\":%d,%s}\n", (long long)step, q, mem);
        metrics_flush(r, step);
    }
    mem_doubles(&all[0], cur, peak);
    if (r->quiet) return;
    printf("dtrain: memory of rank 0 (accounted), MiB at the end and at peak:\n");
    for (int c = 0; c <= DT_MEM_TOTAL; c++)
        printf("  %-6s %10.2f %10.2f  %s\n", dt_mem_cat_name(c), cur[c] / 1048576.0, peak[c] / 1048576.0,
               dt_mem_cat_help(c));
    fflush(stdout);
}

/* The per-rank table: one row per rank, the slowest named, so an unbalanced or
 * slow rank stands out. */
static void show_ranks(reporter *r, const dt_train_event *ev) {
    const double *st = ev->rank_stats;
    int W = ev->world_size, slow = 0, P = ev->stages > 1 ? ev->stages : 1;
    /* the slowest: the longest step, or in a pipeline (whose stages wait for each other
     * and end together) the most compute */
    int col = P > 1 ? 3 : 1;
    for (int q = 1; q < W; q++) {
        double a = st[q * DT_RANK_STATS + col] / (st[q * DT_RANK_STATS] > 0 ? st[q * DT_RANK_STATS] : 1);
        double b = st[slow * DT_RANK_STATS + col] / (st[slow * DT_RANK_STATS] > 0 ? st[slow * DT_RANK_STATS] : 1);
        if (a > b) slow = q;
    }
    if (r->metrics) {
        for (int q = 0; q < W; q++) {
            const double *x = st + q * DT_RANK_STATS;
            char mem[1024];
            mem_json(x + DT_RANK_MEM, x + DT_RANK_MEM_PEAK, mem, sizeof mem);
            fprintf(r->metrics,
                    "{\"event\":\"rank\",\"step\":%lld,\"rank\":%d,\"steps\":%.0f,\"step_s\":%.6f,\"data_s\":%.6f,"
                    "\"compute_s\":%.6f,\"comm_s\":%.6f,\"peak_mem_mb\":%.1f,\"samples\":%.0f,\"stage\":%d,%s}\n",
                    (long long)ev->step, q, x[0], x[1], x[2], x[3], x[4], x[5], x[6], q % P, mem);
        }
        metrics_flush(r, ev->step);
    }
    if (r->quiet) return;
    if (r->bar_open) {
        fputs("\r\033[K", stderr);
        r->bar_open = 0;
    }
    printf("per-rank, ms per step over the last %.0f steps (step %lld):\n", st[0], (long long)ev->step);
    printf("  rank    step    data  compute    comm  peak MiB    samples%s\n", P > 1 ? "  stage  idle" : "");
    for (int q = 0; q < W; q++) {
        const double *x = st + q * DT_RANK_STATS;
        double n = x[0] > 0 ? x[0] : 1;
        char stage[48] = "";
        /* a stage's idle fraction: its step less its compute and data wait (the bubble and
         * the boundary transfers, and the gradient sums) */
        if (P > 1) snprintf(stage, sizeof stage, "  %5d %4.0f%%", q % P, x[1] > 0 ? 100.0 * (x[1] - x[2] - x[3]) / x[1] : 0.0);
        printf("  %4d %7.1f %7.1f %8.1f %7.1f %9.1f %10.0f%s%s\n", q, 1e3 * x[1] / n, 1e3 * x[2] / n,
               1e3 * x[3] / n, 1e3 * x[4] / n, x[5], x[6], stage,
               (W > 1 && q == slow) ? (P > 1 ? "  <- slowest stage" : "  <- slowest") : "");
    }
    printf("per-rank memory, MiB now/peak (accounted):\n  rank");
    for (int c = 0; c <= DT_MEM_TOTAL; c++) printf(" %13s", dt_mem_cat_name(c));
    printf("\n");
    for (int q = 0; q < W; q++) {
        const double *x = st + q * DT_RANK_STATS;
        printf("  %4d", q);
        for (int c = 0; c <= DT_MEM_TOTAL; c++) {
            char cell[64];
            snprintf(cell, sizeof cell, "%.1f/%.1f", x[DT_RANK_MEM + c] / 1048576.0, x[DT_RANK_MEM_PEAK + c] / 1048576.0);
            printf(" %13s", cell);
        }
        printf("\n");
    }
    fflush(stdout);
}

/* The end of a step's progress line: fp16's loss scaler "  loss scale S (N skipped)" and,
 * when the thread tuner ran fewer threads than set, "  threads T of N"; else "". */
static const char *step_text(const reporter *r, const dt_train_event *ev, char *buf, size_t n) {
    int k = 0;
    buf[0] = '\0';
    if (ev->loss_scale > 0)
        k = snprintf(buf, n, "  loss scale %.9g (%lld skipped)", ev->loss_scale, (long long)ev->skipped);
    if (ev->threads > 0 && ev->threads < r->threads - 0.05 && k >= 0 && (size_t)k < n)
        snprintf(buf + k, n - (size_t)k, "  threads %.1f of %d", ev->threads, r->threads);
    return buf;
}

/* The same in a step's JSON line: ',"loss_scale":S,"skipped":N' and ',"threads":T' (the
 * tuner's mean since the last line), else "". */
static const char *step_json(const dt_train_event *ev, char *buf, size_t n) {
    int k = 0;
    buf[0] = '\0';
    if (ev->loss_scale > 0) k = snprintf(buf, n, ",\"loss_scale\":%.9g,\"skipped\":%lld", ev->loss_scale, (long long)ev->skipped);
    if (ev->threads > 0 && k >= 0 && (size_t)k < n) snprintf(buf + k, n - (size_t)k, ",\"threads\":%.2f", ev->threads);
    return buf;
}

static void on_event(void *ctx, const dt_train_event *ev) {
    reporter *r = ctx;
    char amp[128];
    if (!r->rank0) return;
    if (ev->kind == DT_EV_START) {
        const char *ch = getenv("DT_ELASTIC_CHANGE"), *at = getenv("DT_ELASTIC_SINCE");
        r->change = ch && *ch ? ch : NULL;
        r->change_at = at ? strtod(at, NULL) : 0;
        r->resumed_at = ev->step;
        r->tokens = ev->tokens_per_sample;
        r->flops_per_token = ev->flops_per_token;
        r->world = ev->world_size;
        if (r->metrics) metrics_start(r, ev);
        if (ev->note) printf("dtrain: %s\n", ev->note);
        if (ev->pipeline) printf("dtrain: %s\n", ev->pipeline);
        if (!r->quiet && r->tokens > 1)
            printf("dtrain: token model: %.2f MFLOP per token; MFU against %d x %.1f GFLOP/s (per process: the peak "
                   "of its GEMM, %s)\n", r->flops_per_token / 1e6, r->world > 0 ? r->world : 1, r->peak.gflops,
                   r->peak.source);
        if (!r->quiet)
            printf("dtrain: %lld parameters, %lld training samples, %lld steps per epoch, %d process%s x %d thread%s, "
                   "%d micro-batch%s%s%s, GEMM %s\n", (long long)ev->nparams, (long long)ev->train_samples,
                   (long long)ev->steps_per_epoch, ev->world_size, ev->world_size == 1 ? "" : "es", r->threads,
                   r->threads == 1 ? "" : "s", ev->micro_batches, ev->micro_batches == 1 ? "" : "es",
                   ev->precision && strcmp(ev->precision, "fp32") ? ", precision " : "",
                   ev->precision && strcmp(ev->precision, "fp32") ? ev->precision : "", r->gemm ? r->gemm : "?");
        fflush(stdout);
        return;
    }
    if (ev->kind == DT_EV_RANKS) {
        show_ranks(r, ev);
        return;
    }
    if (ev->kind == DT_EV_FIRST && r->change) {   /* the first step after a membership change */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        double now = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
        double took = r->change_at > 0 ? now - r->change_at : -1;
        printf("dtrain: membership changed (%s): world %d, resumed after step %lld, its first step done %.1f s after "
               "the change\n", r->change, r->world, (long long)r->resumed_at, took);
        fflush(stdout);
        if (r->metrics) {
            dt_sbuf b = {0};
            dt_sbuf_printf_(&b, "{\"event\":\"membership\",\"step\":%lld,\"resumed_after\":%lld,\"world_size\":%d,"
                            "\"seconds\":%.3f,\"at\":%.3f,\"change\":\"", (long long)ev->step, (long long)r->resumed_at,
                            r->world, took, now);
            dt_sbuf_json_(&b, r->change);
            dt_sbuf_str_(&b, "\"}\n");
            if (!b.oom) fputs(b.p, r->metrics);
            dt_sbuf_free_(&b);
        }
        r->change = NULL;
    }
    if (ev->kind == DT_EV_FIRST) return;
    if (r->metrics) {
        if (ev->kind == DT_EV_EVAL)
            fprintf(r->metrics, "{\"event\":\"eval\",\"step\":%lld,\"val_loss\":%.9g,\"val_acc\":%.6f,\"elapsed_s\":%.3f,"
                    "\"world_size\":%d}\n", (long long)ev->step, ev->test_loss, ev->test_acc, ev->elapsed_s, ev->world_size);
        else if (ev->kind == DT_EV_STEP && r->tokens > 1)
            fprintf(r->metrics,
                    "{\"event\":\"step\",\"epoch\":%d,\"step\":%lld,\"loss\":%.9g,\"lr\":%.9g,\"grad_norm\":%.9g,"
                    "\"batch_hash\":\"%016llx\",\"samples_per_s\":%.1f,\"tokens_per_s\":%.1f,\"mfu\":%.4f,"
                    "\"elapsed_s\":%.3f,\"world_size\":%d%s}\n",
                    ev->epoch, (long long)ev->step, ev->loss, ev->lr, ev->grad_norm,
                    (unsigned long long)ev->batch_hash, ev->samples_per_s, ev->samples_per_s * (double)r->tokens,
                    mfu(r, ev->samples_per_s), ev->elapsed_s, ev->world_size, step_json(ev, amp, sizeof amp));
        else if (ev->kind == DT_EV_STEP)
            fprintf(r->metrics,
                    "{\"event\":\"step\",\"epoch\":%d,\"step\":%lld,\"loss\":%.9g,\"lr\":%.9g,\"grad_norm\":%.9g,"
                    "\"batch_hash\":\"%016llx\",\"samples_per_s\":%.1f,\"elapsed_s\":%.3f,\"world_size\":%d%s}\n",
                    ev->epoch, (long long)ev->step, ev->loss, ev->lr, ev->grad_norm,
                    (unsigned long long)ev->batch_hash, ev->samples_per_s, ev->elapsed_s, ev->world_size,
                    step_json(ev, amp, sizeof amp));
        else if (ev->evaluated)
            fprintf(r->metrics,
                    "{\"event\":\"epoch\",\"epoch\":%d,\"step\":%lld,\"train_loss\":%.9g,\"test_loss\":%.9g,"
                    "\"test_acc\":%.6f,\"samples_per_s\":%.1f,\"elapsed_s\":%.3f,\"world_size\":%d}\n",
                    ev->epoch, (long long)ev->step, ev->loss, ev->test_loss, ev->test_acc, ev->samples_per_s,
                    ev->elapsed_s, ev->world_size);
        else
            fprintf(r->metrics,
                    "{\"event\":\"epoch\",\"epoch\":%d,\"step\":%lld,\"train_loss\":%.9g,\"samples_per_s\":%.1f,"
                    "\"elapsed_s\":%.3f,\"world_size\":%d}\n",
                    ev->epoch, (long long)ev->step, ev->loss, ev->samples_per_s, ev->elapsed_s, ev->world_size);
        metrics_flush(r, ev->step);
    }
    if (r->quiet) return;
    char eta[32];
    fmt_duration(ev->eta_s, eta, sizeof eta);
    if (r->tokens > 1) {   /* a token model counts steps, tokens/s and MFU; no epochs */
        if (r->bar_open) { fputs("\r\033[K", stderr); r->bar_open = 0; }
        if (ev->kind == DT_EV_STEP)
            printf("step %lld/%lld  loss %.4f  lr %.3g  %.0f tokens/s  MFU %.1f%%  ETA %s%s\n", (long long)ev->step,
                   (long long)ev->total_steps, ev->loss, ev->lr, ev->samples_per_s * (double)r->tokens,
                   mfu(r, ev->samples_per_s), eta, step_text(r, ev, amp, sizeof amp));
        else if (ev->evaluated)
            printf("step %lld/%lld  val loss %.4f\n", (long long)ev->step, (long long)ev->total_steps, ev->test_loss);
        fflush(stdout);
        return;
    }
    if (ev->kind == DT_EV_STEP) {
        if (r->tty) {
            int width = 24;
            int filled = ev->steps_per_epoch ? (int)(width * ev->step_in_epoch / ev->steps_per_epoch) : width;
            char bar[32];
            for (int i = 0; i < width; i++) bar[i] = i < filled ? '#' : '.';
            bar[width] = '\0';
            fprintf(stderr, "\r\033[Kepoch %d/%d [%s] step %lld/%lld  loss %.4f  %.0f samples/s  ETA %s",
                    ev->epoch + 1, ev->epochs, bar, (long long)ev->step, (long long)ev->total_steps, ev->loss,
                    ev->samples_per_s, eta);
            fflush(stderr);
            r->bar_open = 1;
        } else {
            printf("epoch %d/%d  step %lld/%lld  loss %.4f  lr %.4g  %.0f samples/s  ETA %s%s\n", ev->epoch + 1,
                   ev->epochs, (long long)ev->step, (long long)ev->total_steps, ev->loss, ev->lr, ev->samples_per_s,
                   eta, step_text(r, ev, amp, sizeof amp));
            fflush(stdout);
        }
        return;
    }
    if (r->bar_open) {
        fputs("\r\033[K", stderr);
        r->bar_open = 0;
    }
    if (ev->evaluated)
        printf("epoch %d/%d  train loss %.4f  test loss %.4f  test accuracy %.4f  %.0f samples/s\n", ev->epoch + 1,
               ev->epochs, ev->loss, ev->test_loss, ev->test_acc, ev->samples_per_s);
    else
        printf("epoch %d/%d  train loss %.4f  %.0f samples/s\n", ev->epoch + 1, ev->epochs, ev->loss,
               ev->samples_per_s);
    fflush(stdout);
}

/* ---- train ----------------------------------------------------------------------------- */

/* Preemption. Slurm, Kubernetes and dtrun send SIGTERM some time (a grace period) before
 * SIGKILL; SIGUSR1 asks the same ahead of time (Slurm's --signal=USR1@SECONDS before a
 * time limit; Open MPI's mpirun forwards it at once, where it delivers SIGTERM only at
 * its kill, a second before SIGKILL). The handler only records the signal
 * (async-signal-safe); the trainer reads it at each step's end, where the ranks agree on
 * it, so every rank stops after the same step and writes the checkpoint there
 * (dt_train_opts.stop_request). SA_RESETHAND: a second one takes its default action and
 * ends the process at once. SA_RESTART, and every wait of the library retries on EINTR,
 * so the signal interrupts no read or write. */
static volatile sig_atomic_t g_sigterm = 0;

static void on_sigterm(int sig) {
    g_sigterm = sig;
}

static void catch_sigterm(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigterm;
    sa.sa_flags = SA_RESTART | SA_RESETHAND;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);
}

/* The exit status of a run stopped on SIGTERM after its checkpoint: EX_TEMPFAIL of
 * sysexits.h ("a temporary failure; retry later"). Not 0, which would tell a Kubernetes
 * Job or a Slurm script that training is complete; not 1 or 2 (a failure, bad input); not
 * 143 (128 + SIGTERM), which a shell reports for a process that SIGTERM killed, i.e.
 * one that saved nothing. */
#define DTRAIN_EXIT_PREEMPTED 75

/* dtrun --nnodes MIN:MAX asks (DT_ELASTIC_PROBE=1) which world sizes keep this run's
 * weights, and where its checkpoints go: one line, then exit (dtrun_elastic.c reads it;
 * the checkpoint directory last, as it may hold spaces). */
static int elastic_probe(const dt_train_opts *o) {
    int sizes[64], n = 0;
    dt_status s = dt_train_exact_worlds(o, sizes, 64, &n);
    if (s != DT_OK) return fail(s);
    printf("dtrain-elastic: sizes=");
    for (int i = 0; i < n; i++) printf("%s%d", i ? "," : "", sizes[i]);
    printf(" resume=%s", !o->resume || !*o->resume ? "none" : strcmp(o->resume, "auto") == 0 ? "auto" : "path");
    if (o->ckpt_dir && *o->ckpt_dir) printf(" checkpoint-dir=%s", o->ckpt_dir);
    printf("\n");
    return fflush(stdout) == 0 ? 0 : 1;
}

static int cmd_train(int argc, char **argv) {
    dt_train_opts o;
    dt_train_opts_default(&o);
    int gpt = dt_tool_gpt_workload(argc, argv);
    if (gpt) dt_tool_gpt_recipe(&o);
    dt_tool_train_cli cli;
    dt_tool_train_cli_default(&cli);
    int wd_given = gpt, lr_given = gpt, lr_flag = 0, min_lr_flag = 0;
    dt_status s = DT_OK;
    for (int i = 1; i < argc && s == DT_OK;) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { dt_tool_train_help(stdout); return 0; }
        const dt_opt_row *r = dt_tool_train_flag(argc, argv, &i, &o, &cli, &s);
        if (!r) { s = dt_error(DT_ERR_INVALID, "unknown flag '%s' (see dtrain train --help)", a); break; }
        /* the optimizer's own defaults and the gpt recipe's floor yield to a given flag */
        if (r == dt_train_option_field("lr")) lr_given = lr_flag = 1;
        else if (r == dt_train_option_field("weight_decay")) wd_given = 1;
        else if (r == dt_train_option_field("min_lr")) min_lr_flag = 1;
    }
    if (s == DT_OK && cli.fault && (s = dt_testing_set_fault(cli.fault)) != DT_OK) dt_error_wrap(s, "--testing-fault: ");
    if (s != DT_OK) return fail(s);
    if (!o.snapshot_dir && getenv("DT_SNAPSHOT_DIR") && *getenv("DT_SNAPSHOT_DIR"))
        o.snapshot_dir = getenv("DT_SNAPSHOT_DIR");   /* dtrun --nnodes MIN:MAX: this node's memory */
    const char *probe = getenv("DT_ELASTIC_PROBE");
    if (probe && strcmp(probe, "1") == 0) return elastic_probe(&o);
    const dt_optim_def *optim = dt_optim_find(o.optim);   /* unknown: the trainer lists the names */
    if (optim && !wd_given) o.weight_decay = optim->train_weight_decay;
    if (optim && !lr_given) o.lr = optim->train_lr;
    /* the recipe's cosine floor is a tenth of its rate (nanoGPT's rule): another --lr moves it too */
    if (gpt && lr_flag && !min_lr_flag) o.min_lr = o.lr / 10.0;

    dt_comm *comm = NULL;
    int local_size = 1;
    if ((s = setup_comm(cli.backend, cli.init_method, cli.secure_transport, cli.quiet, &comm, &local_size)) != DT_OK) return fail(s);
    /* the device after the communicator: each rank of a node takes the GPU of its local
     * rank (modulo the visible ones; the nccl backend has opened it already) */
    dt_device_opts dev = {.index = comm ? dt_comm_local_rank(comm) : 0, .allow_tf32 = cli.allow_tf32};
    const dt_ops *ops = NULL;
    if ((s = dt_device_opts_env(&dev)) == DT_OK && !(ops = dt_ops_get_ex(cli.device, &dev))) s = DT_ERR_INVALID;
    char about[400], lib[200];
    if (s == DT_OK) s = dt_ops_describe(ops, about, sizeof about);
    if (s != DT_OK) {
        int rc = fail(s);
        dt_comm_destroy(comm);
        return rc;
    }
    /* first contact with a GPU: what each rank runs on, for the log */
    dt_comm_library(comm, lib, sizeof lib);
    if (about[0] && !cli.quiet) printf("dtrain: rank %d: %s %s%s%s\n", g_rank, ops->name, about, lib[0] ? "; " : "", lib);
    if (cli.batch_per_rank > 0) o.batch = cli.batch_per_rank * g_world;
    int nthreads = 1;
    if ((s = setup_threads(ops, cli.threads, local_size, &nthreads)) != DT_OK) goto out;

    if (g_rank == 0 && cli.save && (s = check_writable("--save", cli.save)) != DT_OK) goto out;   /* before, not after, training */
    if (g_rank == 0 && o.trace && (s = check_writable("--trace", o.trace)) != DT_OK) goto out;
    reporter rep = {.quiet = cli.quiet, .tty = isatty(STDERR_FILENO), .rank0 = g_rank == 0, .threads = nthreads,
                    .peak = {.gflops = cli.peak_gflops, .given = 1, .source = "--peak-gflops"}, .o = &o};
    dt_dtype lp = DT_F32;
    if (o.precision && dt_precision_parse(o.precision, &lp) != DT_OK) lp = DT_F32;   /* the trainer names it */
    rep.gemm = dt_ops_gemm_name(ops, lp);
    if (g_rank == 0 && gpt && cli.peak_gflops <= 0) dt_peak_get(ops, lp, nthreads, &rep.peak);
    if (g_rank == 0 && cli.metrics) {
        rep.metrics_path = cli.metrics;
        rep.metrics_best_effort = cli.metrics_best_effort;
        rep.metrics = fopen(cli.metrics, "a");
        if (!rep.metrics) {
            s = dt_error(DT_ERR_IO, "--metrics: cannot open %s for appending", cli.metrics);
            goto out;
        }
    }
    o.on_event = on_event;
    o.event_ctx = &rep;
    o.stop_request = &g_sigterm;
    catch_sigterm();
    dt_model *model = NULL;
    dt_train_result res;
    s = dt_train_run(&o, ops, comm, &model, &res);
    /* every rank's memory at the end, for the metrics file */
    dt_mem_stats *mems = calloc((size_t)g_world, sizeof *mems);
    if (s == DT_OK && !mems) s = dt_error(DT_ERR_NOMEM, "out of memory");
    if (s == DT_OK && g_world > 1)
        s = dt_allgather(comm, &res.mem, mems, sizeof res.mem, DT_U8);
    else if (s == DT_OK)
        mems[0] = res.mem;
    if (s == DT_OK && g_rank == 0) {
        show_memory(&rep, mems, g_world, res.steps);
        /* the signal this rank got (another rank's, which the ranks agreed on: SIGTERM) */
        const char *sig = g_sigterm == SIGUSR1 ? "SIGUSR1" : "SIGTERM";
        if (res.stopped == 2 && o.ckpt_dir)
            printf("dtrain: stopped at step %lld on %s, checkpointed in %s; resume with --resume auto\n",
                   (long long)res.steps, sig, o.ckpt_dir);
        else if (res.stopped == 2 && o.snapshot_dir && o.snapshot_every != 0)
            printf("dtrain: stopped at step %lld on %s, snapshot kept in the nodes' memory; resume with "
                   "--resume auto under the same dtrun\n", (long long)res.steps, sig);
        else if (res.stopped == 2)
            printf("dtrain: stopped at step %lld on %s; without --checkpoint-dir there is nothing to "
                   "resume from\n", (long long)res.steps, sig);
        else if (res.stopped)
            printf("dtrain: stopped at step %lld as asked (--stop-at); resume with --resume auto\n",
                   (long long)res.steps);
        else if (!res.evaluated && rep.tokens > 1)
            printf("dtrain: done: %lld steps in %.1f s, %.0f tokens/s (MFU %.1f%%), final loss %.4f\n",
                   (long long)res.steps, res.seconds, res.samples_per_s * (double)rep.tokens,
                   mfu(&rep, res.samples_per_s), res.final_loss);
        else if (res.evaluated && rep.tokens > 1)
            printf("dtrain: done: %lld steps in %.1f s, %.0f tokens/s (MFU %.1f%%), final loss %.4f, val loss %.4f\n",
                   (long long)res.steps, res.seconds, res.samples_per_s * (double)rep.tokens, mfu(&rep, res.samples_per_s),
                   res.final_loss, res.test_loss);
        else if (res.evaluated)
            printf("dtrain: done: %lld steps in %.1f s, %.0f samples/s, final loss %.4f, test accuracy %.4f\n",
                   (long long)res.steps, res.seconds, res.samples_per_s, res.final_loss, res.test_acc);
        else if (rep.tokens > 1)
            printf("dtrain: done: %lld steps in %.1f s, %.0f tokens/s (MFU %.1f%%), final loss %.4f\n",
                   (long long)res.steps, res.seconds, res.samples_per_s * (double)rep.tokens,
                   mfu(&rep, res.samples_per_s), res.final_loss);
        else
            printf("dtrain: done: %lld steps in %.1f s, %.0f samples/s, final loss %.4f\n", (long long)res.steps,
                   res.seconds, res.samples_per_s, res.final_loss);
        dt_peak_keep(&rep.peak);   /* a peak this run proved low */
        if (res.loss_scale > 0)
            printf("dtrain: fp16 loss scaling: %lld step%s skipped for inf/NaN gradients, final scale %.9g\n",
                   (long long)res.skipped_steps, res.skipped_steps == 1 ? "" : "s", res.loss_scale);
        if (cli.save && res.stopped != 2) {   /* preempted: the checkpoint holds the state; keep the grace */
            /* the input normalisation goes with the weights: a PyTorch user repeats it */
            char mean[1100] = "", std[1100] = "";
            for (int c = 0; c < res.norm_channels && c < 64; c++) {
                size_t lm = strlen(mean), ls = strlen(std);
                snprintf(mean + lm, sizeof mean - lm, "%s%.9g", c ? "," : "", (double)res.norm_mean[c]);
                snprintf(std + ls, sizeof std - ls, "%s%.9g", c ? "," : "", (double)res.norm_std[c]);
            }
            const char *meta[] = {"format", "pt", "model", o.model, "loss", o.loss, "normalize", o.normalize,
                                  "input_mean", mean, "input_std", std};
            s = dt_model_save(model, cli.save, meta, 6);
            if (s == DT_OK) printf("dtrain: saved weights to %s\n", cli.save);
        }
    }
    free(mems);
    if (rep.metrics) {
        errno = 0;
        int bad = ferror(rep.metrics), err = errno;
        if (fclose(rep.metrics) != 0 || bad) metrics_lost(&rep, bad ? err : errno, res.steps);
        rep.metrics = NULL;
    }
    /* metrics lost on the way: said at once; the run fails now, after the weights are saved */
    if (s == DT_OK && rep.metrics_errno && !cli.metrics_best_effort)
        s = dt_error(DT_ERR_IO, "--metrics: could not write %s: %s; its lines from step %lld on are lost "
                     "(--metrics-best-effort to accept this)", cli.metrics, strerror(rep.metrics_errno),
                     (long long)rep.metrics_lost_at);
    dt_model_free(model);
out:
    if (s != DT_OK) {
        int rc = fail(s);
        dt_comm_destroy(comm);
        return rc;
    }
    dt_comm_destroy(comm);
    return res.stopped == 2 ? DTRAIN_EXIT_PREEMPTED : 0;
}

/* ---- eval and model -------------------------------------------------------------------- */

static int cmd_eval(int argc, char **argv) {
    const char *spec = NULL, *weights = NULL, *data = "/usr/share/datasets/fashion-mnist", *norm = "auto";
    dt_loss lf = {.kind = DT_LOSS_CE, .label_smoothing = 0.0f};
    int64_t threads = 0;
    dt_status s = DT_OK;
    for (int i = 1; i < argc && s == DT_OK;) {
        const char *v = NULL;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) { fputs(usage_eval, stdout); return 0; }
        if (dt_arg_match("--model", argc, argv, &i, &v, &s)) spec = v;
        else if (dt_arg_match("--weights", argc, argv, &i, &v, &s)) weights = v;
        else if (dt_arg_match("--data", argc, argv, &i, &v, &s)) data = v;
        else if (dt_arg_match("--normalize", argc, argv, &i, &v, &s)) norm = v;
        else if (dt_arg_match("--loss", argc, argv, &i, &v, &s)) { if (s == DT_OK) s = dt_loss_parse(v, &lf.kind); }
        else if (dt_arg_match("--threads", argc, argv, &i, &v, &s)) { if (s == DT_OK) s = dt_arg_int("--threads", v, 1, 4096, 0, &threads); }
        else s = dt_error(DT_ERR_INVALID, "unknown flag '%s' (see dtrain eval --help)", argv[i]);
    }
    if (s == DT_OK && !spec) s = dt_error(DT_ERR_INVALID, "--model: required (a preset, a layer list or @FILE)");
    if (s == DT_OK && !weights) s = dt_error(DT_ERR_INVALID, "--weights: required (a .safetensors file)");
    const dt_ops *ops = NULL;
    if (s == DT_OK) s = dt_tool_cpu(&ops);
    if (s != DT_OK) return fail(s);
    dt_dataset *test = NULL;
    dt_model *m = NULL;
    double loss = 0, acc = 0;
    s = setup_threads(ops, threads, 1, NULL);
    dt_data_opts dopt;
    if (s == DT_OK) s = dt_data_opts_from_name(norm, &dopt);
    if (s == DT_OK && dt_data_windows(data)) s = dt_spec_token_dims(spec, &dopt.window, &dopt.classes);
    if (s == DT_OK && (s = dt_dataset_open_opts(data, DT_SPLIT_TEST, &dopt, &test)) == DT_ERR_IO) s = DT_ERR_INVALID;
    if (s == DT_OK) {
        const dt_dataset_info *info = dt_dataset_get_info(test);
        dt_shape shape = {.ndim = info->ndim};
        for (int i = 0; i < info->ndim; i++) shape.d[i] = info->shape[i];
        s = dt_model_build(spec, &shape, ops, 0, 500, &m);
    }
    if (s == DT_OK && (s = dt_model_load(m, weights)) == DT_ERR_IO) s = DT_ERR_INVALID;
    if (s == DT_OK) s = dt_evaluate(m, test, &lf, NULL, &loss, &acc);
    if (s == DT_OK)
        printf("test accuracy %.4f  test loss %.4f  (%lld samples, %s)\n", acc, loss,
               (long long)dt_dataset_get_info(test)->n, weights);
    dt_model_free(m);
    dt_dataset_free(test);
    return s == DT_OK ? 0 : fail(s);
}

static int cmd_model(int argc, char **argv) {
    const char *spec = NULL, *data = NULL, *input = NULL;
    dt_status s = DT_OK;
    for (int i = 1; i < argc && s == DT_OK;) {
        const char *v = NULL;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) { fputs(usage_model, stdout); return 0; }
        if (dt_arg_match("--model", argc, argv, &i, &v, &s)) spec = v;
        else if (dt_arg_match("--data", argc, argv, &i, &v, &s)) data = v;
        else if (dt_arg_match("--input", argc, argv, &i, &v, &s)) input = v;
        else s = dt_error(DT_ERR_INVALID, "unknown flag '%s' (see dtrain model --help)", argv[i]);
    }
    if (s == DT_OK && !spec) s = dt_error(DT_ERR_INVALID, "--model: required (a preset, a layer list or @FILE)");
    if (s != DT_OK) return fail(s);
    dt_shape shape;
    int64_t labels;
    if ((s = dt_tool_input_shape(spec, data, input, "--input", &shape, &labels)) != DT_OK) return fail(s);
    dt_spec sp;
    if ((s = dt_spec_parse(spec, &sp)) != DT_OK) return fail(s == DT_ERR_IO ? DT_ERR_INVALID : s);
    if ((s = dt_spec_infer(&sp, &shape)) != DT_OK) { dt_spec_free(&sp); return fail(s); }
    size_t need = dt_spec_summary(&sp, &shape, NULL, 0);
    char *text = malloc(need + 1);
    if (!text) { dt_spec_free(&sp); return fail(dt_error(DT_ERR_NOMEM, "out of memory")); }
    dt_spec_summary(&sp, &shape, text, need + 1);
    fputs(text, stdout);
    free(text);
    dt_spec_free(&sp);
    return 0;
}

/* ---- prepare-text ------------------------------------------------------------------------ */

static int cmd_prepare_text(int argc, char **argv) {
    int first = 1;
    if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) { fputs(usage_prepare_text, stdout); return 0; }
    if (argc > 1 && !strcmp(argv[1], "--")) first = 2;
    else if (argc > 1 && argv[1][0] == '-' && argv[1][1])
        return fail(dt_error(DT_ERR_INVALID, "prepare-text: unknown flag '%s' (see dtrain prepare-text --help)", argv[1]));
    if (argc - first < 2)
        return fail(dt_error(DT_ERR_INVALID, "prepare-text: expected OUT_DIR and at least one FILE "
                             "(see dtrain prepare-text --help)"));
    int64_t ntrain, nval;
    dt_status s = dt_tokens_from_bytes(argv[first], (const char *const *)argv + first + 1, (size_t)(argc - first - 1),
                                       0.9, &ntrain, &nval);
    if (s != DT_OK) return fail(s);
    printf("%lld tokens: train %lld, val %lld\n", (long long)(ntrain + nval), (long long)ntrain, (long long)nval);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        fputs(usage_main, argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "--version")) { printf("dtrain %s\n", PACKAGE_VERSION); return 0; }
    if (!strcmp(argv[1], "train")) return cmd_train(argc - 1, argv + 1);
    if (!strcmp(argv[1], "eval")) return cmd_eval(argc - 1, argv + 1);
    if (!strcmp(argv[1], "model")) return cmd_model(argc - 1, argv + 1);
    if (!strcmp(argv[1], "check")) return dtrain_check_main(argc - 1, argv + 1);
    if (!strcmp(argv[1], "plot")) return dtrain_plot_main(argc - 1, argv + 1);
    if (!strcmp(argv[1], "report")) return dtrain_report_main(argc - 1, argv + 1);
    if (!strcmp(argv[1], "sample")) return dtrain_sample_main(argc - 1, argv + 1);
    if (!strcmp(argv[1], "plan")) return dtrain_plan_main(argc - 1, argv + 1);
    if (!strcmp(argv[1], "prepare-text")) return cmd_prepare_text(argc - 1, argv + 1);
    if (!strcmp(argv[1], "export")) return dtrain_export_main(argc - 1, argv + 1);
    fprintf(stderr, "dtrain: unknown command '%s' (expected train, eval, model, check, plot, report, sample, plan, "
            "prepare-text or export; see dtrain --help)\n", argv[1]);
    return 2;
}
