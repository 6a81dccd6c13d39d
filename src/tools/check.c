/*
 * check.c: `dtrain check --np N [train flags]` proves that a distributed run is
 * the 1-process run (docs/DESIGN.md rule 2), with the checks practitioners use to
 * trust data parallelism, each turned from "looks similar" into an exact test:
 *
 *   end to end     a short run on N processes (dtrun) exits 0
 *   loss curve     the loss of every step, 1 process against N, is bitwise equal
 *                  (N a power of two) or within 1e-5 relative (otherwise)
 *   batch order    the fingerprint of every step's global batch is the same
 *   epoch order    step s of epoch 1 draws another batch than step s of epoch 0
 *                  (the classic bug: the sampler is never told the epoch)
 *   ranks agree    the N-process run's end-of-run comparison of every parameter
 *                  across ranks passed
 *   bitwise        the saved weights of 1 and N processes are byte for byte equal
 *
 * It runs `dtrain train` as child processes (1 process, then N under dtrun) with
 * the user's flags plus its own (--steps, --log-every 1, --metrics, --save), each
 * under a deadline, their output in a temporary directory that is kept and named
 * when something fails. Run length: enough steps to cross one epoch boundary
 * (steps per epoch + 1) when that is at most CHECK_MAX_STEPS, else 4 steps (fewer
 * if --steps says so); when the runs do not cross an epoch, the epoch-order check
 * gets its own N-process run of 3 steps on a data set of 2 global batches (the
 * sampler does not look at the data): a synthetic one of the same sample shape, or
 * for token data a token file of 2 global batches of windows, written in the runs'
 * directory. The data set is opened as the trainer opens it (token windows as long
 * as the model's block), and a gpt or llama preset on token data takes the trainer's
 * token recipe as its defaults (batch 12, ...), as `dtrain train` does.
 */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "args.h"
#include "clock.h"
#include "data.h"
#include "fileio.h"
#include "safetensors.h"
#include "sampler.h"
#include "tool_util.h"
#include "tools.h"
#include "train.h"

#define CHECK_MAX_STEPS 32      /* longest run that crosses an epoch boundary */
#define CHECK_SHORT_STEPS 4     /* run length when an epoch is longer than that */
#define CHECK_LOSS_RTOL 1e-5    /* loss tolerance when N is not a power of two */
#define CHECK_WEIGHT_TOL 1e-4   /* weight tolerance (relative to max(1, |w|max)) then */

static const char *usage_check =
    "usage: dtrain check --np N [--timeout SEC] [--keep-runs] [train flags...]\n"
    "\n"
    "Trains briefly on 1 process and on N processes (started with dtrun) with the\n"
    "given `dtrain train` flags, and proves that the distributed run is the\n"
    "1-process run:\n"
    "  end to end    the N-process run exits 0\n"
    "  loss curve    the loss of every step is bitwise equal when N is a power of\n"
    "                two (docs/DESIGN.md rule 2), within 1e-5 relative otherwise; the\n"
    "                first step that differs is shown with both values\n"
    "  batch order   every step's global batch has the same fingerprint\n"
    "  epoch order   step s of epoch 1 draws another batch than step s of epoch 0\n"
    "                (a sampler that is not told the epoch repeats its order)\n"
    "  ranks agree   the N-process run's end-of-run comparison of every parameter\n"
    "                across ranks passed (else: the parameter and the ranks)\n"
    "  bitwise       the final weights of 1 and N processes are byte for byte\n"
    "                equal (N not a power of two: within 1e-4 of max(1, |w|))\n"
    "\n"
    "Both runs use the same global batch and S micro-batches (--micro-batches,\n"
    "default N). They run steps-per-epoch + 1 steps when that is at most 32, so they\n"
    "cross an epoch boundary; else 4 steps, and the epoch-order check gets its own\n"
    "3-step N-process run on synthetic data of the same shape (2 global batches;\n"
    "token data: a token file of 2 global batches of windows). A gpt or llama preset on\n"
    "token data starts from the same defaults as `dtrain train` (nanoGPT's recipe).\n"
    "A smaller --steps shortens the runs. check sets --steps, --epochs, --log-every,\n"
    "--metrics, --save, --no-eval and --quiet itself, cuts --warmup to fit the runs\n"
    "(the same for both), and drops the checkpoint flags\n"
    "(both runs start from scratch); --batch-per-rank B means a\n"
    "global batch of B x N for both runs; --lr-scale is refused (it would change\n"
    "the learning rate with the world size). --pipeline P (and --pipeline-schedule,\n"
    "--stages) go to the N-process run only: N/P replicas of a P-stage pipeline\n"
    "against 1 process.\n"
    "\n"
    "  --np N          processes of the distributed run (2..1024; required)\n"
    "  --timeout SEC   limit for each run; it is killed after that  [300]\n"
    "  --keep-runs     keep the runs' directory even when every check passes\n"
    "\n"
    "dtrun is found next to dtrain or at $DTRUN. Prints a table of the checks;\n"
    "exit status 0 when all pass, 1 when one fails (the runs' output directory is\n"
    "printed), 2 for bad flags.\n";

/* ---- the runs ------------------------------------------------------------------------- */

/* What check learned from its flags and the data set. */
typedef struct {
    int      np;
    double   timeout_s;
    int      keep;
    int      sync_bn;          /* --sync-bn given: a note, the runs differ by design */
    const char *data;
    int64_t  batch, micro, steps, epochs, spe;
    int64_t  warmup;           /* --warmup (or the gpt recipe's); each run gets at most its steps - 1 */
    int      spans;            /* the runs cross an epoch boundary */
    char     synth[4200];      /* the sampler run's data set when they do not */
    int64_t  window;           /* token data: the window (the model's block), else 0 */
    int      vocab;            /* token data: the model's vocabulary */
    char   **pass;             /* the user's train flags that go through unchanged */
    unsigned char *layout;     /* per pass: a layout's flag (DT_OPT_LAYOUT), for the N-process run only */
    int      npass;
    char     self[4096], dtrun[4200], dir[4096];
} check_cfg;

typedef struct {
    const char *name;          /* "np1", "np2", "sampler" */
    int  rc, timed_out;
    double secs;
    char log[4200], metrics[4200], weights[4200];
} run_info;

static dt_status find_programs(check_cfg *c) {
    ssize_t len = readlink("/proc/self/exe", c->self, sizeof c->self - 1);
    if (len <= 0) return dt_error(DT_ERR_IO, "cannot find the dtrain program (/proc/self/exe: %s)", strerror(errno));
    c->self[len] = '\0';
    const char *env = getenv("DTRUN");
    if (env && *env) {
        if (access(env, X_OK) != 0) return dt_error(DT_ERR_INVALID, "$DTRUN: %s is not an executable program", env);
        snprintf(c->dtrun, sizeof c->dtrun, "%s", env);
        return DT_OK;
    }
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", c->self);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = '\0';
    snprintf(c->dtrun, sizeof c->dtrun, "%s/dtrun", dir);
    if (access(c->dtrun, X_OK) == 0) return DT_OK;
    /* a libtool build runs the program from .libs/, next to which dtrun is not */
    size_t dl = strlen(dir);
    if (dl >= 6 && !strcmp(dir + dl - 6, "/.libs")) {
        dir[dl - 6] = '\0';
        snprintf(c->dtrun, sizeof c->dtrun, "%s/dtrun", dir);
        if (access(c->dtrun, X_OK) == 0) return DT_OK;
    }
    return dt_error(DT_ERR_IO, "dtrun not found next to %s (set $DTRUN to the launcher)", c->self);
}

/* Parse check's own flags and the train flags (options.h's rows and the program's): a
 * row marked DT_OPT_CHECK is check's to set, one marked DT_OPT_PER_WORLD is refused
 * unless at its default, the rest pass through to both runs. A flag that is no row
 * passes through too, for the trainer to refuse. */
static dt_status parse_flags(int argc, char **argv, check_cfg *c, int *help) {
    dt_train_opts o;
    dt_train_opts_default(&o);
    if (dt_tool_gpt_workload(argc, argv)) dt_tool_gpt_recipe(&o);   /* the trainer's defaults then */
    dt_tool_train_cli cli;
    dt_tool_train_cli_default(&cli);
    int64_t user_steps = 0, iv;
    c->timeout_s = 300;
    c->pass = calloc((size_t)argc + 1, sizeof *c->pass);
    c->layout = calloc((size_t)argc + 1, 1);
    if (!c->pass || !c->layout) return dt_error(DT_ERR_NOMEM, "out of memory");
    for (int i = 1; i < argc;) {
        const char *a = argv[i], *v = NULL;
        dt_status s = DT_OK;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { *help = 1; return DT_OK; }
        if (!strcmp(a, "--keep-runs")) { c->keep = 1; i++; continue; }
        if (strncmp(a, "--", 2) != 0 || !a[2])
            return dt_error(DT_ERR_INVALID, "unexpected argument '%s' (dtrain check takes flags only; see --help)", a);
        if (dt_arg_match("--np", argc, argv, &i, &v, &s)) {
            DT_TRY(s);
            DT_TRY(dt_arg_int("--np", v, 2, 1024, 0, &iv));
            c->np = (int)iv;
            continue;
        }
        if (dt_arg_match("--timeout", argc, argv, &i, &v, &s)) {
            DT_TRY(s);
            DT_TRY(dt_arg_double("--timeout", v, 1, 1e6, &c->timeout_s));
            continue;
        }
        int start = i;
        const dt_opt_row *r = dt_tool_train_flag(argc, argv, &i, &o, &cli, &s);
        if (!r) {   /* not a train flag: "--flag VALUE" or "--flag=VALUE" passes on as it is */
            char name[64];
            size_t nl = strcspn(a, "=");
            if (nl >= sizeof name) return dt_error(DT_ERR_INVALID, "unknown flag '%s' (see dtrain check --help)", a);
            memcpy(name, a, nl);
            name[nl] = '\0';
            dt_arg_match(name, argc, argv, &i, &v, &s);
        }
        DT_TRY(s);
        if (r && r == dt_train_option_field("max_steps")) user_steps = o.max_steps;
        if (r && (r->where & DT_OPT_CHECK)) continue;   /* check sets it (the runs' tail, run_train) */
        if (r && (r->where & DT_OPT_PER_WORLD)) {
            char now[64];
            if (strcmp(dt_opt_text(r, &o, now, sizeof now), r->def) != 0)
                return dt_error(DT_ERR_INVALID, "%s: '%s' makes the computation depend on the world size, so 1 and "
                                "N processes cannot agree; pass the value it would give instead", r->flag, now);
            continue;
        }
        for (int j = start; j < i; j++) {
            c->layout[c->npass] = r && (r->where & DT_OPT_LAYOUT);
            c->pass[c->npass++] = argv[j];
        }
    }
    c->sync_bn = o.sync_bn;
    c->data = o.data;
    c->batch = cli.batch_per_rank > 0 ? cli.batch_per_rank * (c->np > 0 ? c->np : 1) : o.batch;
    c->micro = o.micro_batches;
    c->warmup = o.warmup;
    if (c->np == 0) return dt_error(DT_ERR_INVALID, "--np: required (the number of processes to compare with 1)");
    if (c->micro == 0) c->micro = c->np;
    if (c->micro % c->np != 0)
        return dt_error(DT_ERR_INVALID, "--micro-batches: %lld is not a multiple of --np %d", (long long)c->micro, c->np);
    if (c->batch % c->micro != 0)
        return dt_error(DT_ERR_INVALID, "--batch: the global batch %lld is not divisible by %lld micro-batches",
                        (long long)c->batch, (long long)c->micro);

    /* the data set, opened as the trainer opens it: its size says how long an epoch
     * is, its shape the synthetic one */
    dt_dataset *ds = NULL;
    dt_data_opts dopt;
    o.data = c->data;
    dt_status s = dt_train_data_opts(&o, &dopt);
    if (s == DT_OK) s = dt_dataset_open_opts(c->data, DT_SPLIT_TRAIN, &dopt, &ds);
    if (s != DT_OK) return s == DT_ERR_IO ? DT_ERR_INVALID : s;
    const dt_dataset_info *info = dt_dataset_get_info(ds);
    int64_t n = info->n;
    int64_t C = info->ndim == 3 ? info->shape[0] : 1, H = info->ndim == 3 ? info->shape[1] : 1;
    int64_t W = info->ndim == 3 ? info->shape[2] : info->shape[0];
    int classes = info->classes, windows = info->label_width > 1;
    dt_dataset_free(ds);
    if (!windows && c->batch > n)
        return dt_error(DT_ERR_INVALID, "--batch: the global batch %lld is larger than the %lld training samples of %s",
                        (long long)c->batch, (long long)n, c->data);
    /* the trainer's sampler says how many steps an epoch has: token windows are drawn at
     * random, max(1, N/B) steps to an epoch */
    dt_sampler *smp = NULL;
    s = windows ? dt_sampler_init_random(n, c->batch, c->micro, 0, &smp)
                : dt_sampler_init(n, c->batch, c->micro, 0, 1, &smp);
    if (s != DT_OK) return s;
    c->spe = dt_sampler_steps_per_epoch(smp);
    dt_sampler_free(smp);
    c->steps = c->spe + 1 <= CHECK_MAX_STEPS ? (c->spe + 1 > CHECK_SHORT_STEPS ? c->spe + 1 : CHECK_SHORT_STEPS)
                                             : CHECK_SHORT_STEPS;
    if (user_steps > 0 && user_steps < c->steps) c->steps = user_steps;
    c->epochs = (c->steps + c->spe - 1) / c->spe;
    c->spans = c->steps > c->spe;
    if (windows) {
        c->window = dopt.window;
        c->vocab = classes;
    } else {
        snprintf(c->synth, sizeof c->synth, "synthetic:%lld,%lld,%lld,%lld,%d", (long long)(2 * c->batch),
                 (long long)C, (long long)H, (long long)W, classes);
    }
    return DT_OK;
}

/* Token data: the epoch-order run's data set, 2 global batches of windows (window + 2B
 * tokens, token i being i mod vocab) in raw uint16 files c->dir/sampler/{train,val}.bin. */
static dt_status write_sampler_tokens(check_cfg *c) {
    char path[4300];
    snprintf(c->synth, sizeof c->synth, "tokens:%s/sampler", c->dir);
    const char *dir = c->synth + 7;
    if (mkdir(dir, 0700) != 0) return dt_error(DT_ERR_IO, "cannot create %s (%s)", dir, strerror(errno));
    size_t count = (size_t)(c->window + 2 * c->batch);
    unsigned char *b = malloc(2 * count);
    if (!b) return dt_error(DT_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < count; i++) {
        unsigned tok = (unsigned)(i % (size_t)c->vocab);
        b[2 * i] = (unsigned char)(tok & 0xff);
        b[2 * i + 1] = (unsigned char)(tok >> 8);
    }
    dt_status s = DT_OK;
    for (int k = 0; k < 2 && s == DT_OK; k++) {
        snprintf(path, sizeof path, "%s/%s", dir, k ? "val.bin" : "train.bin");
        s = dt_write_atomic(path, b, 2 * count);
    }
    free(b);
    return s;
}

/* One `dtrain train` run: 1 process, or N under dtrun; sampler != 0: the epoch-order run. */
static void run_train(const check_cfg *c, run_info *r, int nproc, int sampler) {
    char num[6][32];
    const char *argv[64 + 256];
    int k = 0;
    if (nproc > 1) {
        snprintf(num[0], sizeof num[0], "%d", nproc);
        argv[k++] = c->dtrun;
        argv[k++] = "-n";
        argv[k++] = num[0];
    }
    argv[k++] = c->self;
    argv[k++] = "train";
    int nf = c->npass < 256 ? c->npass : 256;
    for (int i = 0; i < nf; i++) {
        /* --backend/--init-method and a layout (--pipeline) belong to the distributed run;
         * the reference is a plain one */
        if (nproc == 1 && c->layout[i]) continue;
        if (nproc == 1 && (!strncmp(c->pass[i], "--backend", 9) || !strncmp(c->pass[i], "--init-method", 13))) {
            if (!strchr(c->pass[i], '=')) i++;
            continue;
        }
        argv[k++] = c->pass[i];
    }
    int64_t steps = sampler ? 3 : c->steps, epochs = sampler ? 2 : c->epochs;
    snprintf(num[1], sizeof num[1], "%lld", (long long)c->batch);
    snprintf(num[2], sizeof num[2], "%lld", (long long)c->micro);
    snprintf(num[3], sizeof num[3], "%lld", (long long)steps);
    snprintf(num[4], sizeof num[4], "%lld", (long long)epochs);
    /* a cosine schedule needs more steps than its warm-up; the schedule is the same for
     * both runs of a comparison, so shortening it changes nothing that is compared */
    snprintf(num[5], sizeof num[5], "%lld", (long long)(c->warmup < steps ? c->warmup : steps - 1));
    const char *tail[] = {"--data", sampler ? c->synth : c->data, "--batch", num[1], "--micro-batches", num[2],
                          "--steps", num[3], "--epochs", num[4], "--warmup", num[5], "--log-every", "1",
                          "--metrics", r->metrics, "--no-eval", "--quiet"};
    for (size_t i = 0; i < sizeof tail / sizeof tail[0]; i++) argv[k++] = tail[i];
    if (!sampler) {
        argv[k++] = "--save";
        argv[k++] = r->weights;
    }
    argv[k] = NULL;
    double t0 = dt_now();
    r->rc = dt_tool_run((char *const *)argv, r->log, c->timeout_s, &r->timed_out);
    r->secs = dt_now() - t0;
    if (r->rc < 0) {
        /* could not even start it: say so in its log, where the checks look */
        FILE *f = fopen(r->log, "a");
        if (f) { fprintf(f, "dtrain check: %s\n", dt_last_error()); fclose(f); }
        r->rc = 1;
    }
    printf("  run %-8s %d process%s: exit %d%s, %.1f s\n", r->name, nproc, nproc == 1 ? "" : "es", r->rc,
           r->timed_out ? " (timed out)" : "", r->secs);
    fflush(stdout);
}

static void run_paths(const check_cfg *c, run_info *r, const char *name) {
    r->name = name;
    snprintf(r->log, sizeof r->log, "%s/%s.log", c->dir, name);
    snprintf(r->metrics, sizeof r->metrics, "%s/%s.jsonl", c->dir, name);
    snprintf(r->weights, sizeof r->weights, "%s/%s.safetensors", c->dir, name);
}

/* A run's step lines; a run that died before its first step wrote no file: no steps. */
static dt_status read_run_steps(const run_info *r, dt_step_rec **out, size_t *n) {
    int runs = 0;
    *out = NULL;
    *n = 0;
    if (access(r->metrics, F_OK) != 0) return DT_OK;
    return dt_tool_read_steps(r->metrics, out, n, &runs);
}

/* ---- the checks ------------------------------------------------------------------------ */

typedef struct {
    const char *name;
    int  pass;                 /* 1 pass, 0 fail */
    char detail[640];
} check_row;

static void row_set(check_row *r, int pass, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void row_set(check_row *r, int pass, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->detail, sizeof r->detail, fmt, ap);
    va_end(ap);
    r->pass = pass;
}

/* A run's failure in a few words: "timed out after 300 s" or "exit 1: <last line>". */
static void run_failure(const run_info *r, double timeout_s, char *buf, size_t n) {
    char last[400];
    dt_tool_last_line(r->log, last, sizeof last);
    if (r->timed_out) snprintf(buf, n, "timed out after %.0f s (killed)", timeout_s);
    else snprintf(buf, n, "exit %d%s%s", r->rc, last[0] ? ": " : "", last);
}

/* The cross-rank comparison's message from a log ("rank R: parameter 'X' has a
 * different value (checksum) on rank(s) ... than on rank 0"), or 0. */
static int find_rank_mismatch(const char *log, char *buf, size_t n) {
    FILE *f = fopen(log, "r");
    if (!f) return 0;
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int found = 0;
    while (!found && (len = getline(&line, &cap, f)) != -1) {
        if (!strstr(line, "parameter '") || !strstr(line, "has a different")) continue;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = '\0';
        const char *p = strstr(line, "dtrain: ");
        p = p ? p + 8 : line;
        snprintf(buf, n, "%s", p);
        found = 1;
    }
    free(line);
    fclose(f);
    return found;
}

static void check_loss_and_order(const check_cfg *c, const dt_step_rec *a, size_t na, const dt_step_rec *b,
                                 size_t nb, check_row *loss, check_row *order) {
    int pow2 = (c->np & (c->np - 1)) == 0;
    char rule[96];
    if (pow2) snprintf(rule, sizeof rule, "bitwise: %d is a power of two", c->np);
    else snprintf(rule, sizeof rule, "within %g relative: %d is not a power of two", CHECK_LOSS_RTOL, c->np);
    size_t n = na < nb ? na : nb;
    double worst = 0;
    loss->pass = order->pass = -1;
    for (size_t i = 0; i < n; i++) {
        if (a[i].step != b[i].step) {
            row_set(loss, 0, "the runs logged different steps (%lld and %lld at line %zu)", (long long)a[i].step,
                    (long long)b[i].step, i + 1);
            break;
        }
        int same = !strcmp(a[i].loss_text, b[i].loss_text);
        if (!same && !pow2) {
            double d = fabs(a[i].loss - b[i].loss), m = fmax(fabs(a[i].loss), fabs(b[i].loss));
            double rel = m > 0 ? d / m : d;
            if (rel > worst) worst = rel;
            same = rel <= CHECK_LOSS_RTOL;
        }
        if (!same) {
            row_set(loss, 0, "diverges at step %lld: 1 process %s, %d processes %s (%s)", (long long)a[i].step,
                    a[i].loss_text, c->np, b[i].loss_text, rule);
            break;
        }
    }
    if (loss->pass < 0) {
        if (na != nb || na != (size_t)c->steps)
            row_set(loss, 0, "1 process logged %zu steps, %d processes %zu (expected %lld)", na, c->np, nb,
                    (long long)c->steps);
        else if (pow2) row_set(loss, 1, "%zu steps, every loss bitwise equal (%s)", n, rule);
        else row_set(loss, 1, "%zu steps, largest relative difference %.2g (%s)", n, worst, rule);
    }
    if (nb == 0) {
        row_set(loss, 0, "the %d-process run logged no steps (see end to end)", c->np);
        row_set(order, 0, "the %d-process run logged no steps (see end to end)", c->np);
        return;
    }
    for (size_t i = 0; i < n && order->pass < 0; i++) {
        if (!a[i].hash[0] || !b[i].hash[0])
            row_set(order, 0, "step %lld has no batch_hash in the metrics", (long long)a[i].step);
        else if (strcmp(a[i].hash, b[i].hash) != 0)
            row_set(order, 0, "step %lld: 1 process trained on batch %s, %d processes on %s", (long long)a[i].step,
                    a[i].hash, c->np, b[i].hash);
    }
    if (order->pass < 0) {
        if (n == 0) row_set(order, 0, "no steps to compare");
        else row_set(order, 1, "the %zu steps' global batches have the same fingerprints", n);
    }
}

/* Step s of epoch 1 against step s of epoch 0, in one run's metrics. */
static void check_epochs(const dt_step_rec *r, size_t n, const char *what, check_row *row) {
    size_t e0 = 0, e1 = 0, repeats = 0, first = 0;
    while (e0 < n && r[e0].epoch == 0) e0++;
    for (size_t i = e0; i < n && r[i].epoch == 1; i++) e1++;
    if (e0 == 0 || e1 == 0) {
        row_set(row, 0, "%s did not log steps of both epoch 0 and epoch 1", what);
        return;
    }
    size_t m = e1 < e0 ? e1 : e0;
    for (size_t j = 0; j < m; j++) {
        if (!r[j].hash[0] || !r[e0 + j].hash[0]) {
            row_set(row, 0, "%s: step %lld has no batch_hash in the metrics", what, (long long)r[j].step);
            return;
        }
        if (!strcmp(r[j].hash, r[e0 + j].hash) && repeats++ == 0) first = j;
    }
    if (repeats == m)
        row_set(row, 0, "epoch 1 repeats epoch 0's batches (step 1 of both: %s; %zu of %zu compared): the sampler "
                "ignores the epoch (%s)", r[0].hash, repeats, m, what);
    else if (repeats)
        row_set(row, 0, "step %zu of epoch 1 repeats step %zu of epoch 0 (batch %s; %zu of %zu compared) (%s)", first + 1,
                first + 1, r[first].hash, repeats, m, what);
    else
        row_set(row, 1, "%zu step%s of epoch 1 draw%s other batches than epoch 0 (%s)", m, m == 1 ? "" : "s",
                m == 1 ? "s" : "", what);
}

/* Largest |x - y| over two tensors of the same dtype and size; -1 for non-numeric dtypes. */
static double max_abs_diff(const dt_st_tensor *x, const dt_st_tensor *y, double *maxabs) {
    size_t esz = dt_dtype_size(x->dtype), cnt = esz ? x->nbytes / esz : 0;
    double worst = 0;
    *maxabs = 0;
    for (size_t i = 0; i < cnt; i++) {
        double a, b;
        switch (x->dtype) {
        case DT_F32: a = ((const float *)x->data)[i]; b = ((const float *)y->data)[i]; break;
        case DT_F64: a = ((const double *)x->data)[i]; b = ((const double *)y->data)[i]; break;
        case DT_I64: a = (double)((const int64_t *)x->data)[i]; b = (double)((const int64_t *)y->data)[i]; break;
        case DT_I32: a = ((const int32_t *)x->data)[i]; b = ((const int32_t *)y->data)[i]; break;
        default: return -1;
        }
        double d = fabs(a - b);
        if (!(d <= worst)) worst = d;  /* NaN counts as the worst */
        if (fabs(a) > *maxabs) *maxabs = fabs(a);
    }
    return worst;
}

static void check_weights(const check_cfg *c, const run_info *r1, const run_info *rn, check_row *row) {
    int pow2 = (c->np & (c->np - 1)) == 0;
    dt_st_file *fa = NULL, *fb = NULL;
    if (dt_st_open(r1->weights, &fa) != DT_OK) {
        row_set(row, 0, "cannot read the 1-process weights: %s", dt_last_error());
        return;
    }
    if (access(rn->weights, F_OK) != 0) {
        row_set(row, 0, "the %d-process run saved no weights (it failed; see end to end)", c->np);
        dt_st_close(fa);
        return;
    }
    if (dt_st_open(rn->weights, &fb) != DT_OK) {
        row_set(row, 0, "cannot read the %d-process weights: %s", c->np, dt_last_error());
        dt_st_close(fa);
        return;
    }
    size_t nt = dt_st_count(fa), differ = 0, bytes = 0;
    int failed = 0;
    double worst = 0;
    if (dt_st_count(fb) != nt) {
        row_set(row, 0, "1 process saved %zu tensors, %d processes %zu", nt, c->np, dt_st_count(fb));
        failed = 1;
    }
    for (size_t i = 0; i < nt && failed != 1; i++) {
        dt_st_tensor x, y;
        if (dt_st_tensor_at(fa, i, &x) != DT_OK) { row_set(row, 0, "%s", dt_last_error()); failed = 1; break; }
        if (dt_st_find(fb, x.name, &y) != DT_OK) {
            row_set(row, 0, "'%s' is missing from the %d-process weights", x.name, c->np);
            failed = 1;
            break;
        }
        if (x.dtype != y.dtype || x.ndim != y.ndim || x.nbytes != y.nbytes ||
            memcmp(x.shape, y.shape, (size_t)x.ndim * sizeof x.shape[0]) != 0) {
            row_set(row, 0, "'%s' has another dtype or shape in the %d-process weights", x.name, c->np);
            failed = 1;
            break;
        }
        bytes += x.nbytes;
        if (memcmp(x.data, y.data, x.nbytes) == 0) continue;
        differ++;
        if (failed == 2) continue;  /* the first failing tensor is named already; count the rest */
        double maxabs = 0, d = max_abs_diff(&x, &y, &maxabs);
        int integer = x.dtype == DT_I64 || x.dtype == DT_I32;
        if (d > worst) worst = d;
        if (!pow2 && !integer && d >= 0 && d <= CHECK_WEIGHT_TOL * fmax(1.0, maxabs)) continue;
        if (d >= 0) row_set(row, 0, "'%s' is the first tensor that differs: max abs difference %.3g", x.name, d);
        else row_set(row, 0, "'%s' is the first tensor that differs (dtype %s)", x.name, dt_dtype_st_name(x.dtype));
        failed = 2;
    }
    /* a mismatch of names or shapes stops the loop; otherwise every tensor was seen */
    if (failed == 2) {
        size_t len = strlen(row->detail);
        snprintf(row->detail + len, sizeof row->detail - len, "; %zu of %zu tensors differ", differ, nt);
    } else if (!failed) {
        if (differ == 0)
            row_set(row, 1, "%zu tensors, %zu bytes, every byte equal", nt, bytes);
        else
            row_set(row, 1, "%zu of %zu tensors differ, by at most %.3g, within %g of max(1, |w|) (%d is not a "
                    "power of two, so bitwise equality is not promised)", differ, nt, worst, CHECK_WEIGHT_TOL, c->np);
    }
    dt_st_close(fa);
    dt_st_close(fb);
}

/* ---- main ------------------------------------------------------------------------------ */

static void remove_dir(const char *dir, const run_info *runs, int nrun) {
    for (int i = 0; i < nrun; i++) {
        unlink(runs[i].log);
        unlink(runs[i].metrics);
        unlink(runs[i].weights);
    }
    char tok[4200];   /* the token files of write_sampler_tokens, if it wrote them */
    snprintf(tok, sizeof tok, "%s/sampler/train.bin", dir);
    unlink(tok);
    snprintf(tok, sizeof tok, "%s/sampler/val.bin", dir);
    unlink(tok);
    snprintf(tok, sizeof tok, "%s/sampler", dir);
    rmdir(tok);
    if (rmdir(dir) != 0) fprintf(stderr, "dtrain check: could not remove %s (%s)\n", dir, strerror(errno));
}

static int bad(dt_status s) {
    char buf[1200];
    fprintf(stderr, "dtrain check: %s\n", dt_tool_error(buf, sizeof buf));
    return dt_exit_code(s) == 0 ? 2 : dt_exit_code(s);
}

/* Judge the runs: the table of checks on stdout; returns how many failed. */
static int judge(const check_cfg *c, const run_info *r1, const run_info *rn, const run_info *rs) {
    check_row rows[6] = {{.name = "end to end"}, {.name = "loss curve"}, {.name = "batch order"},
                         {.name = "epoch order"}, {.name = "ranks agree"}, {.name = "bitwise"}};
    dt_step_rec *a = NULL, *b = NULL, *e = NULL;
    size_t na = 0, nb = 0, ne = 0;
    char mismatch[512], why[512];
    int has_mismatch = find_rank_mismatch(rn->log, mismatch, sizeof mismatch);

    /* end to end */
    if (rn->rc == 0) {
        row_set(&rows[0], 1, "%d processes ran %lld steps and exited 0 (%.1f s)", c->np, (long long)c->steps, rn->secs);
    } else {
        run_failure(rn, c->timeout_s, why, sizeof why);
        if (has_mismatch)
            row_set(&rows[0], 0, "exit %d after its steps: the end-of-run parameter comparison failed (see ranks agree)",
                    rn->rc);
        else row_set(&rows[0], 0, "%d processes: %s", c->np, why);
    }
    /* loss curve and batch order */
    if (read_run_steps(r1, &a, &na) != DT_OK || read_run_steps(rn, &b, &nb) != DT_OK) {
        row_set(&rows[1], 0, "%s", dt_last_error());
        row_set(&rows[2], 0, "%s", dt_last_error());
    } else {
        check_loss_and_order(c, a, na, b, nb, &rows[1], &rows[2]);
    }
    /* epoch order: from the N-process run when it crossed an epoch, else its own run */
    if (c->spans) {
        char what[64];
        snprintf(what, sizeof what, "the %d-process run", c->np);
        check_epochs(b, nb, what, &rows[3]);
    } else if (read_run_steps(rs, &e, &ne) != DT_OK) {
        row_set(&rows[3], 0, "%s", dt_last_error());
    } else {
        char what[4400];
        snprintf(what, sizeof what, "%d processes on %s", c->np, c->synth);
        if (rs->rc != 0 && ne < 3) {
            run_failure(rs, c->timeout_s, why, sizeof why);
            row_set(&rows[3], 0, "the epoch-order run failed: %s", why);
        } else {
            check_epochs(e, ne, what, &rows[3]);
        }
    }
    /* ranks agree */
    if (rn->rc == 0) row_set(&rows[4], 1, "every parameter has the same checksum on all %d ranks", c->np);
    else if (has_mismatch) row_set(&rows[4], 0, "%s", mismatch);
    else row_set(&rows[4], 0, "not reached: the %d-process run failed before the comparison (see end to end)", c->np);
    /* bitwise */
    check_weights(c, r1, rn, &rows[5]);
    if (c->np & (c->np - 1)) rows[5].name = "weights";  /* not a power of two: tolerance */
    free(a);
    free(b);
    free(e);

    int failed = 0;
    printf("\n%-12s %-6s %s\n", "check", "result", "detail");
    for (int i = 0; i < 6; i++) {
        printf("%-12s %-6s %s\n", rows[i].name, rows[i].pass == 1 ? "PASS" : "FAIL", rows[i].detail);
        failed += rows[i].pass != 1;
    }
    return failed;
}

int dtrain_check_main(int argc, char **argv) {
    check_cfg c;
    memset(&c, 0, sizeof c);
    int help = 0;
    dt_status s = parse_flags(argc, argv, &c, &help);
    if (help) { free(c.pass), free(c.layout); fputs(usage_check, stdout); return 0; }
    if (s == DT_OK) s = find_programs(&c);
    if (s != DT_OK) { free(c.pass), free(c.layout); return bad(s); }

    const char *tmp = getenv("TMPDIR");
    snprintf(c.dir, sizeof c.dir, "%s/dtrain-check-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(c.dir)) {
        free(c.pass), free(c.layout);
        return bad(dt_error(DT_ERR_IO, "cannot create a directory for the runs in %s (%s)", tmp && *tmp ? tmp : "/tmp",
                            strerror(errno)));
    }
    struct sigaction sa, old_int, old_term;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = dt_tool_on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);

    int pow2 = (c.np & (c.np - 1)) == 0;
    printf("dtrain check: 1 process against %d, %lld step%s (%lld per epoch), global batch %lld in %lld micro-batches\n",
           c.np, (long long)c.steps, c.steps == 1 ? "" : "s", (long long)c.spe, (long long)c.batch,
           (long long)c.micro);
    if (c.sync_bn)
        printf("note: --sync-bn computes batchnorm statistics over all ranks' samples together, one process over\n"
               "each micro-batch: the loss curve and the weights are not expected to agree\n");
    fflush(stdout);
    char nname[16];
    snprintf(nname, sizeof nname, "np%d", c.np);
    run_info runs[3];
    memset(runs, 0, sizeof runs);
    int nrun = 0, rc = 0;
    run_info *r1 = &runs[nrun++], *rn = &runs[nrun++], *rs = NULL;
    run_paths(&c, r1, "np1");
    run_paths(&c, rn, nname);
    char why[512];

    run_train(&c, r1, 1, 0);
    if (dt_tool_stop) { rc = 128 + dt_tool_stop; goto out; }
    if (r1->rc != 0) {
        run_failure(r1, c.timeout_s, why, sizeof why);
        if (r1->rc == 2) {
            char last[400];
            dt_tool_last_line(r1->log, last, sizeof last);
            fprintf(stderr, "dtrain check: the 1-process run rejected the flags: %s\n", last);
            rc = 2;
        } else {
            fprintf(stderr, "dtrain check: the 1-process reference run failed (%s); its output is in %s\n", why,
                    r1->log);
            rc = 1;
        }
        goto out;
    }
    run_train(&c, rn, c.np, 0);
    if (dt_tool_stop) { rc = 128 + dt_tool_stop; goto out; }
    if (!c.spans) {
        rs = &runs[nrun++];
        run_paths(&c, rs, "sampler");
        if (c.window > 0 && (s = write_sampler_tokens(&c)) != DT_OK) {
            rc = bad(s);
            goto out;
        }
        run_train(&c, rs, c.np, 1);
        if (dt_tool_stop) { rc = 128 + dt_tool_stop; goto out; }
    }

    int failed = judge(&c, r1, rn, rs);
    if (failed) {
        printf("\ndtrain check: %d of 6 checks failed; the runs' output is in %s\n", failed, c.dir);
        rc = 1;
    } else {
        printf("\ndtrain check: all 6 checks passed: %d processes compute what 1 process computes%s\n", c.np,
               pow2 ? "" : " (to floating-point tolerance)");
    }
out:
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    fflush(stdout);
    if ((rc == 0 && !c.keep) || rc == 2) remove_dir(c.dir, runs, nrun);  /* bad flags: the child said why */
    else if (rc == 0 || rc > 128) printf("dtrain check: the runs' output is in %s\n", c.dir);
    free(c.pass), free(c.layout);
    return rc;
}
