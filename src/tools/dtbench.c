/*
 * dtbench.c: collective benchmark in the manner of nccl-tests.
 *
 *   dtrun -n 2 dtbench -b 4K -e 256M -f 4 -o all_reduce
 *   mpirun -np 2 dtbench --backend mpi
 *
 * Every rank joins the job from its launch environment (dt_comm_init with defaults),
 * warms up as nccl-tests does (-w runs at the largest size, then -w at the smallest, so
 * connections, shared-memory rings and buffers are set up) and goes on at the smallest
 * size until -W seconds have passed (so the ranks are settled on their cores before
 * anything is timed), then for each size from -b to -e (times -f each
 * step) runs the collective -w times to warm up, checks one result, and times -n
 * iterations. Rank 0 prints one row per size:
 *
 *   size (B)  count  type  redop  time (us)  algbw (GB/s)  busbw (GB/s)  #wrong
 *
 * with nccl-tests' definitions: size is the whole array (for all_gather the gathered
 * output, for reduce_scatter the input), algbw = size / time / 1e9, busbw = algbw times
 * 2(n-1)/n for all_reduce, (n-1)/n for all_gather and reduce_scatter, 1 for broadcast
 * and reduce. time is the largest over ranks of each rank's mean time per iteration.
 *
 * Inputs are small integers (1..4, or 1..2 for prod), so every reduction is exact in
 * every type and the expected result is known bit for bit; #wrong is the number of
 * wrong elements summed over ranks, and dtbench exits 1 when it is not 0.
 *
 * The collectives are the library's list (src/comm/coll.h): -o takes their names, and
 * what they take (an operator, counts per rank) comes from their rows; dtbench adds a row
 * of its own per collective (colls below: the other spelling, the bus factor, the check).
 */
#include "config.h"
#include "args.h"
#include "clock.h"
#include "coll.h"
#include "comm.h"
#include "reduce.h"
#include "status.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The usage text around the -o line, which names the collectives of the list. */
static const char usage_head[] =
"usage: dtbench [options]   (run under dtrun, mpirun or srun)\n"
"\n"
"  -b SIZE        smallest size in bytes (default 4K; suffixes K, M, G = 2^10, 2^20, 2^30)\n"
"  -e SIZE        largest size in bytes (default 64M)\n"
"  -f FACTOR      size multiplier between rows (default 2)\n";
static const char usage_tail[] =
"  -d TYPE        f32 | f64 | f16 | bf16 | i32 | i64 | u8 (default f32)\n"
"  -r REDOP       sum | avg | min | max | prod (default sum)\n"
"  -w N           warm-up iterations per size, and at the largest and smallest size\n"
"                 before the first row (default 5)\n"
"  -W SECONDS     then keep warming up at the smallest size until this long has\n"
"                 passed since the first warm-up (default 0.2; 0: do not)\n"
"  -n N           timed iterations per size (default 20)\n"
"  -c 0|1         check results (default 1)\n"
"  --backend B    tcp | mpi | nccl (default: $DT_BACKEND or tcp)\n"
"  -h, --help     this text\n"
"\n"
"Rank 0 prints size (B), count, type, redop, time (us), algbw (GB/s), busbw (GB/s) and\n"
"#wrong per size (nccl-tests definitions; time = max over ranks of the mean per\n"
"iteration). Exit status: 0, 1 if any result was wrong or the job failed, 2 for a bad\n"
"command line.\n";

typedef struct {
    size_t    minb, maxb;
    double    factor;
    dt_call_kind op;      /* a collective of the list */
    dt_dtype  dtype;
    dt_redop  redop;
    int       warmup, iters, check;
    double    settle;     /* -W: seconds of warm-up before the first row */
    const char *backend;
} bench_cfg;

typedef struct {
    void  *send, *recv, *want;   /* max bytes each */
} bench_bufs;

/* Set the inputs, run once, and count this rank's wrong elements (*wrong starts at 0). */
typedef dt_status bench_check(dt_comm *c, const bench_cfg *cfg, bench_bufs *b, size_t total, size_t per,
                              int64_t *wrong);
static bench_check check_reduction, check_broadcast, check_allgather;

/* busbw = algbw times this (nccl-tests' factors) on n ranks */
static double bus_allreduce(int n) { return 2.0 * (n - 1) / n; }
static double bus_gather   (int n) { return (double)(n - 1) / n; }
static double bus_one      (int n) { (void)n; return 1.0; }

/* dtbench's row of each collective of the list, by kind: the other spelling -o takes, the
 * bus bandwidth factor and the check. A collective without a check is not benchmarked
 * (barrier: no data to time or check). */
typedef struct {
    const char  *alias;
    double     (*bus)(int n);
    bench_check *check;
} bench_coll;

_Static_assert(DT_COLL_COUNT == 6, "a collective added to src/comm/coll.h needs its row here");
static const bench_coll colls[DT_COLL_COUNT + 1] = {
    [DT_CALL_ALLREDUCE]      = { .alias = "allreduce",     .bus = bus_allreduce, .check = check_reduction },
    [DT_CALL_BROADCAST]      = { .alias = "bcast",         .bus = bus_one,       .check = check_broadcast },
    [DT_CALL_ALLGATHER]      = { .alias = "allgather",     .bus = bus_gather,    .check = check_allgather },
    [DT_CALL_REDUCE_SCATTER] = { .alias = "reducescatter", .bus = bus_gather,    .check = check_reduction },
    [DT_CALL_REDUCE]         = { .alias = "reduce",        .bus = bus_one,       .check = check_reduction },
    [DT_CALL_BARRIER]        = { .alias = NULL },
};

static unsigned coll_flags(dt_call_kind k) { return dt_coll_get(k)->flags; }

/* The names of the benchmarked collectives into buf, "a, b or c" (sep ", ", last " or "). */
static const char *coll_choices(char *buf, size_t n, const char *sep, const char *last) {
    int total = 0, i = 0;
    for (int k = 1; k <= DT_COLL_COUNT; k++) total += colls[k].check != NULL;
    size_t len = 0;
    buf[0] = 0;
    for (int k = 1; k <= DT_COLL_COUNT; k++) {
        if (!colls[k].check) continue;
        const char *pre = i == 0 ? "" : i == total - 1 ? last : sep;
        int w = snprintf(buf + len, n - len, "%s%s", pre, dt_coll_get(k)->name);
        if (w < 0 || (size_t)w >= n - len) break;
        len += (size_t)w;
        i++;
    }
    return buf;
}

static void print_usage(void) {
    char ops[256];
    fputs(usage_head, stdout);
    printf("  -o OP          %s\n", coll_choices(ops, sizeof ops, " | ", " | "));
    printf("                 (default %s)\n", dt_coll_get(DT_CALL_ALLREDUCE)->name);
    fputs(usage_tail, stdout);
}

static void die_usage(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die_usage(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("dtbench: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputs(" (see dtbench --help)\n", stderr);
    va_end(ap);
    exit(2);
}

/* A flag value parsed by args.c, or the program ends with its one-line message. */
static void arg_or_die(dt_status s) {
    if (s != DT_OK) die_usage("%s", dt_last_error());
}

static void parse_args(int argc, char **argv, bench_cfg *cfg) {
    *cfg = (bench_cfg){ .minb = 4096, .maxb = 64u << 20, .factor = 2, .op = DT_CALL_ALLREDUCE,
                        .dtype = DT_F32, .redop = DT_SUM, .warmup = 5, .iters = 20, .check = 1,
                        .settle = 0.2 };
    static const char *const flags[] = { "-b", "-e", "-f", "-o", "-d", "-r", "-w", "-W", "-n", "-c", "--backend" };
    for (int i = 1; i < argc;) {
        const char *a = argv[i], *v = NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { print_usage(); exit(0); }
        dt_status err = DT_OK;
        size_t k = 0;
        while (k < sizeof flags / sizeof flags[0] && !dt_arg_match(flags[k], argc, argv, &i, &v, &err)) k++;
        if (k == sizeof flags / sizeof flags[0]) die_usage("unknown option '%s'", a);
        arg_or_die(err);
        const char *f = flags[k];
        int64_t x;
        if (!strcmp(f, "-b") || !strcmp(f, "-e")) {
            arg_or_die(dt_arg_int(f, v, 1, (int64_t)1 << 40, 1, &x));
            *(f[1] == 'b' ? &cfg->minb : &cfg->maxb) = (size_t)x;
        } else if (!strcmp(f, "-f")) {
            arg_or_die(dt_arg_double(f, v, 1, 1024, &cfg->factor));
            if (!(cfg->factor > 1)) die_usage("-f: expected a factor > 1, got '%s'", v);
        } else if (!strcmp(f, "-W")) {
            arg_or_die(dt_arg_double(f, v, 0, 3600, &cfg->settle));
        } else if (!strcmp(f, "-o")) {
            int found = 0;
            for (int k = 1; k <= DT_COLL_COUNT; k++)
                if (colls[k].check && (!strcmp(v, dt_coll_get(k)->name) || !strcmp(v, colls[k].alias))) found = k;
            char ops[256];
            if (!found) die_usage("-o: expected %s, got '%s'", coll_choices(ops, sizeof ops, ", ", " or "), v);
            cfg->op = (dt_call_kind)found;
        } else if (!strcmp(f, "-d")) {
            if (dt_dtype_parse(v, &cfg->dtype) != DT_OK || cfg->dtype >= DT_COMM_NDTYPES)
                die_usage("-d: expected f32, f64, f16, bf16, i32, i64 or u8, got '%s'", v);
        } else if (!strcmp(f, "-r")) {
            if (dt_redop_parse(v, &cfg->redop) != DT_OK)
                die_usage("-r: expected sum, avg, min, max or prod, got '%s'", v);
        } else if (!strcmp(f, "--backend")) {
            if (strcmp(v, "tcp") && strcmp(v, "mpi") && strcmp(v, "nccl"))
                die_usage("--backend: expected tcp, mpi or nccl, got '%s'", v);
            cfg->backend = v;
        } else {   /* -w, -n, -c */
            int64_t lo = f[1] == 'n' ? 1 : 0, hi = f[1] == 'c' ? 1 : 1000000;
            arg_or_die(dt_arg_int(f, v, lo, hi, 0, &x));
            *(f[1] == 'w' ? &cfg->warmup : f[1] == 'n' ? &cfg->iters : &cfg->check) = (int)x;
        }
    }
    if (cfg->minb > cfg->maxb) die_usage("-b %zu is larger than -e %zu", cfg->minb, cfg->maxb);
}

/* ---- inputs and expected results ------------------------------------------------------ */

/* The input of rank r at element i: a small integer, so every reduction is exact. */
static int input_value(const bench_cfg *cfg, int r, size_t i) {
    if (cfg->redop == DT_PROD) return 1 + (int)((i + (size_t)r) % 2);
    return 1 + (int)((i * 7 + (size_t)r * 3) % 4);
}

static void store(dt_dtype t, void *buf, size_t i, double v) {
    switch (t) {
    case DT_F32:  ((float *)buf)[i] = (float)v; break;
    case DT_F64:  ((double *)buf)[i] = v; break;
    case DT_F16:  ((uint16_t *)buf)[i] = dt_f32_to_f16((float)v); break;
    case DT_BF16: ((uint16_t *)buf)[i] = dt_f32_to_bf16((float)v); break;
    case DT_I32:  ((int32_t *)buf)[i] = (int32_t)v; break;
    case DT_I64:  ((int64_t *)buf)[i] = (int64_t)v; break;
    case DT_U8:   ((uint8_t *)buf)[i] = (uint8_t)(int64_t)v; break;
    default:      break;   /* -d takes the collectives' types only */
    }
}

/* buf[0..n) = inputs of rank r for elements first..first+n. */
static void fill(const bench_cfg *cfg, void *buf, size_t first, size_t n, int r) {
    for (size_t i = 0; i < n; i++) store(cfg->dtype, buf, i, input_value(cfg, r, first + i));
}

/* exp[0..n) = the reduction over all ranks of elements first..first+n: folded with the
 * library's own elementwise operator (exact here, whatever the order), then avg's divide. */
static dt_status expected_reduction(const bench_cfg *cfg, void *exp, size_t first, size_t n, int size) {
    size_t es = dt_dtype_size(cfg->dtype);
    void *tmp = malloc(n * es + 1);
    if (!tmp) return dt_error(DT_ERR_NOMEM, "out of memory (%zu bytes)", n * es);
    fill(cfg, exp, first, n, 0);
    for (int r = 1; r < size; r++) {
        fill(cfg, tmp, first, n, r);
        dt_reduce_apply(cfg->redop, cfg->dtype, exp, exp, tmp, n);
    }
    if (cfg->redop == DT_AVG) dt_reduce_divide(cfg->dtype, exp, n, size);
    free(tmp);
    return DT_OK;
}

/* Elements of got[0..n) that differ bitwise from want. */
static int64_t count_wrong(const void *got, const void *want, size_t n, size_t es) {
    int64_t bad = 0;
    for (size_t i = 0; i < n; i++)
        if (memcmp((const char *)got + i * es, (const char *)want + i * es, es) != 0) bad++;
    return bad;
}

/* ---- one size ------------------------------------------------------------------------- */

/* Element counts of one row: total (the whole array) and per rank (all_gather's send,
 * reduce_scatter's recv). */
static void row_counts(const bench_cfg *cfg, size_t bytes, int n, size_t *total, size_t *per) {
    size_t es = dt_dtype_size(cfg->dtype);
    *total = bytes / es;
    *per = *total;
    if (coll_flags(cfg->op) & DT_COLL_PER_RANK) {
        *per = *total / (size_t)n;
        *total = *per * (size_t)n;
    }
}

static dt_status run_once(dt_comm *c, const bench_cfg *cfg, bench_bufs *b, size_t total, size_t per) {
    size_t count = coll_flags(cfg->op) & DT_COLL_PER_RANK ? per : total;
    return dt_coll_run(c, cfg->op, b->send, b->recv, count, cfg->dtype, cfg->redop, 0, NULL);
}

/* all_reduce, reduce_scatter (recv is block r of per elements) and reduce to root 0 (only
 * the root's recv is written). */
static dt_status check_reduction(dt_comm *c, const bench_cfg *cfg, bench_bufs *b, size_t total, size_t per,
                                 int64_t *wrong) {
    int r = dt_comm_rank(c), n = dt_comm_size(c);
    size_t es = dt_dtype_size(cfg->dtype);
    int block = (coll_flags(cfg->op) & DT_COLL_PER_RANK) != 0;
    size_t len = block ? per : total, first = block ? (size_t)r * per : 0;
    fill(cfg, b->send, 0, total, r);
    memset(b->recv, 0xA5, len * es);
    DT_TRY(run_once(c, cfg, b, total, per));
    if ((coll_flags(cfg->op) & DT_COLL_ROOT_RECV) && r != 0) return DT_OK;
    DT_TRY(expected_reduction(cfg, b->want, first, len, n));
    *wrong = count_wrong(b->recv, b->want, len, es);
    return DT_OK;
}

static dt_status check_broadcast(dt_comm *c, const bench_cfg *cfg, bench_bufs *b, size_t total, size_t per,
                                 int64_t *wrong) {
    int r = dt_comm_rank(c);
    size_t es = dt_dtype_size(cfg->dtype);
    /* root holds rank 0's inputs; the others start with something else */
    if (r == 0) fill(cfg, b->recv, 0, total, 0);
    else memset(b->recv, 0xA5, total * es);
    DT_TRY(run_once(c, cfg, b, total, per));
    fill(cfg, b->want, 0, total, 0);
    *wrong = count_wrong(b->recv, b->want, total, es);
    return DT_OK;
}

static dt_status check_allgather(dt_comm *c, const bench_cfg *cfg, bench_bufs *b, size_t total, size_t per,
                                 int64_t *wrong) {
    int r = dt_comm_rank(c), n = dt_comm_size(c);
    size_t es = dt_dtype_size(cfg->dtype);
    /* rank r contributes elements [r*per, (r+1)*per) of the array */
    fill(cfg, b->send, (size_t)r * per, per, r);
    memset(b->recv, 0xA5, total * es);
    DT_TRY(run_once(c, cfg, b, total, per));
    for (int q = 0; q < n; q++) fill(cfg, (char *)b->want + (size_t)q * per * es, (size_t)q * per, per, q);
    *wrong = count_wrong(b->recv, b->want, total, es);
    return DT_OK;
}

static dt_status bench(dt_comm *c, const bench_cfg *cfg, int64_t *wrong_total) {
    int r = dt_comm_rank(c), n = dt_comm_size(c);
    size_t es = dt_dtype_size(cfg->dtype);
    bench_bufs b = { malloc(cfg->maxb + es), malloc(cfg->maxb + es), malloc(cfg->maxb + es) };
    if (!b.send || !b.recv || !b.want) {
        free(b.send); free(b.recv); free(b.want);
        return dt_error(DT_ERR_NOMEM, "rank %d: cannot allocate 3 x %zu bytes", r, cfg->maxb);
    }
    /* valid inputs from the start (warm-up runs too reduce them: no overflow on garbage) */
    fill(cfg, b.send, 0, cfg->maxb / es, r);
    fill(cfg, b.recv, 0, cfg->maxb / es, r);
    int is_red = (coll_flags(cfg->op) & DT_COLL_REDOP) != 0;
    if (r == 0) {
        char sealed[96] = "";   /* --secure-transport's records */
        if (strcmp(dt_comm_secure(c), "off") != 0) snprintf(sealed, sizeof sealed, " (sealed: %s)", dt_comm_secure(c));
        printf("# dtbench: %s, backend %s%s, %d ranks, %s%s%s, warmup %d, iters %d, check %d\n",
               dt_coll_get(cfg->op)->name, dt_comm_backend(c), sealed, n, dt_dtype_name(cfg->dtype),
               is_red ? " " : "", is_red ? dt_redop_name(cfg->redop) : "", cfg->warmup, cfg->iters, cfg->check);
        printf("# %12s %12s %6s %6s %12s %12s %12s %8s\n",
               "size(B)", "count", "type", "redop", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong");
        fflush(stdout);
    }
    dt_status s = DT_OK;
    *wrong_total = 0;
    size_t ends[2] = { cfg->maxb, cfg->minb };
    double start = dt_now(), waited = 0;
    for (int e = 0; e < 2; e++) {
        size_t total, per;
        row_counts(cfg, ends[e], n, &total, &per);
        for (int w = 0; w < cfg->warmup && s == DT_OK; w++) s = run_once(c, cfg, &b, total, per);
    }
    /* -W: the ranks of a job just started may share cores until the scheduler spreads
     * them (tens of milliseconds, longer when other work keeps the cores busy); the
     * slowest rank's clock decides, so every rank runs the same calls */
    while (s == DT_OK && cfg->settle > 0) {
        double mine = dt_now() - start;
        if ((s = dt_allreduce(c, &mine, &waited, 1, DT_F64, DT_MAX)) != DT_OK || waited >= cfg->settle) break;
        size_t total, per;
        row_counts(cfg, cfg->minb, n, &total, &per);
        for (int w = 0; w < (cfg->warmup > 0 ? cfg->warmup : 1) && s == DT_OK; w++) s = run_once(c, cfg, &b, total, per);
    }
    /* the barrier before each timed loop talks to other peers than most collectives:
     * their connections are set up here, not in the first row */
    for (int k = 0; k < 2 && s == DT_OK; k++) s = dt_barrier(c);
    for (double bytes_d = (double)cfg->minb; s == DT_OK && bytes_d <= (double)cfg->maxb * (1 + 1e-12);
         bytes_d *= cfg->factor) {
        size_t total, per;
        row_counts(cfg, (size_t)bytes_d, n, &total, &per);
        size_t bytes = total * es;
        /* warm up (and let every rank arrive), then one checked run, then the timed loop */
        for (int w = 0; w < cfg->warmup && s == DT_OK; w++) s = run_once(c, cfg, &b, total, per);
        int64_t wrong = 0;
        if (s == DT_OK && cfg->check) s = colls[cfg->op].check(c, cfg, &b, total, per, &wrong);
        if (s == DT_OK) s = dt_barrier(c);
        double t0 = dt_now();
        for (int it = 0; it < cfg->iters && s == DT_OK; it++) s = run_once(c, cfg, &b, total, per);
        double mean = (dt_now() - t0) / cfg->iters;
        /* time: the slowest rank's mean; #wrong: summed over ranks */
        double tmax = mean;
        if (s == DT_OK) s = dt_allreduce(c, &mean, &tmax, 1, DT_F64, DT_MAX);
        if (s == DT_OK) s = dt_allreduce(c, &wrong, &wrong, 1, DT_I64, DT_SUM);
        if (s != DT_OK) break;
        *wrong_total += wrong;
        if (r == 0) {
            double algbw = tmax > 0 ? (double)bytes / tmax / 1e9 : 0;
            char wr[24];
            if (cfg->check) snprintf(wr, sizeof wr, "%lld", (long long)wrong);
            else snprintf(wr, sizeof wr, "N/A");
            printf("  %12zu %12zu %6s %6s %12.2f %12.3f %12.3f %8s\n", bytes, total, dt_dtype_name(cfg->dtype),
                   is_red ? dt_redop_name(cfg->redop) : "-", tmax * 1e6, algbw, algbw * colls[cfg->op].bus(n), wr);
            fflush(stdout);
        }
    }
    free(b.send); free(b.recv); free(b.want);
    return s;
}

int main(int argc, char **argv) {
    bench_cfg cfg;
    parse_args(argc, argv, &cfg);
    dt_comm_opts opts;
    dt_comm_opts_default(&opts);
    opts.backend = cfg.backend;
    dt_comm *c = NULL;
    dt_status s = dt_comm_init(&opts, &c);
    if (s != DT_OK) {
        fprintf(stderr, "dtbench: %s\n", dt_last_error());
        return dt_exit_code(s);
    }
    int64_t wrong = 0;
    s = bench(c, &cfg, &wrong);
    if (s != DT_OK) fprintf(stderr, "dtbench: %s\n", dt_last_error());
    else if (wrong > 0 && dt_comm_rank(c) == 0)
        fprintf(stderr, "dtbench: %lld wrong elements\n", (long long)wrong);
    dt_comm_destroy(c);
    if (s != DT_OK) return dt_exit_code(s) ? dt_exit_code(s) : 1;
    return wrong > 0 ? 1 : 0;
}
