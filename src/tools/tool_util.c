/*
 * tool_util.c: what the commands of the dtrain program share (see tool_util.h):
 * the flag names of the trainer's option fields, the reader of metrics files and
 * the child-process runner. `dtrain check` and `dtrain plot` (which runs gnuplot)
 * use the last two; kept here, below both commands, they leave neither command's
 * file depending on the other.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "fileio.h"
#include "optim.h"
#include "tool_util.h"

extern char **environ;

/* ---- messages ----------------------------------------------------------------------- */

#define CLI(name) offsetof(dt_tool_train_cli, name)
const dt_opt_row dt_tool_train_rows[] = {
    {.field = "threads", .flag = "--threads", .arg = "N", .type = DT_OPT_I64, .off = CLI(threads), .lo = 1,
     .hi = 4096, .sec = DT_OPT_SEC_RUN, .shown = "", .example = "1",
     .help = "compute threads per process (default: $OMP_NUM_THREADS,\n"
             "else cores / local processes, at most the cores this\n"
             "process is bound to)"},
    {.field = "peak_gflops", .flag = "--peak-gflops", .arg = "X", .type = DT_OPT_F64, .off = CLI(peak_gflops),
     .lo = 1e-6, .hi = 1e12, .sec = DT_OPT_SEC_RUN, .shown = "measured once, cached", .example = "100",
     .help = "token models: one process's GEMM peak in GFLOP/s; MFU is\n"
             "stated against it times the processes (default: the best\n"
             "rate of 1024^3 products, up to 8192^3 on a GPU, in the run's\n"
             "precision and threads, kept in $DT_PEAK_CACHE or\n"
             "~/.cache/dtrain/peak on a CPU)"},
    {.field = "save", .flag = "--save", .arg = "FILE", .type = DT_OPT_STR, .off = CLI(save),
     .where = DT_OPT_CHECK, .sec = DT_OPT_SEC_RUN, .example = "w.safetensors",
     .help = "write the final weights (safetensors, PyTorch names)"},
    {.field = "metrics", .flag = "--metrics", .arg = "FILE", .type = DT_OPT_STR, .off = CLI(metrics),
     .where = DT_OPT_CHECK, .sec = DT_OPT_SEC_RUN, .example = "m.jsonl",
     .help = "append JSON lines: one per logged step and per epoch; a\n"
             "write that fails (a full disk) is warned about at once\n"
             "and the run exits 1 at its end"},
    {.field = "metrics_best_effort", .flag = "--metrics-best-effort", .type = DT_OPT_ON,
     .off = CLI(metrics_best_effort), .where = DT_OPT_CHECK, .sec = DT_OPT_SEC_RUN, .example = "1",
     .help = "a --metrics file that cannot be written: warn, and exit 0\n"
             "all the same"},
    {.field = "quiet", .flag = "--quiet", .type = DT_OPT_ON, .off = CLI(quiet), .where = DT_OPT_CHECK,
     .sec = DT_OPT_SEC_RUN, .example = "1", .help = "no progress, only the final summary"},
    {.field = "device", .flag = "--device", .arg = "cpu|cuda", .type = DT_OPT_STR, .off = CLI(device), .def = "cpu",
     .sec = DT_OPT_SEC_RUN, .example = "cuda",
     .help = "compute device (cuda needs a --with-cuda build; each rank\n"
             "takes the GPU of its local rank)"},
    {.field = "allow_tf32", .flag = "--allow-tf32", .type = DT_OPT_ON, .off = CLI(allow_tf32),
     .sec = DT_OPT_SEC_RUN, .example = "1", .help = "let cuBLAS use TF32 for GEMMs (faster, fewer mantissa bits)"},
    {.field = "batch_per_rank", .flag = "--batch-per-rank", .arg = "N", .type = DT_OPT_I64,
     .off = CLI(batch_per_rank), .lo = 1, .hi = 1 << 24, .where = DT_OPT_CHECK, .sec = DT_OPT_SEC_DIST, .shown = "", .example = "8",
     .help = "global batch = N x world size (instead of --batch)"},
    {.field = "backend", .flag = "--backend", .arg = "tcp|mpi|nccl", .type = DT_OPT_STR, .off = CLI(backend),
     .sec = DT_OPT_SEC_DIST, .shown = "$DT_BACKEND or tcp", .example = "tcp", .help = "communication backend"},
    {.field = "init_method", .flag = "--init-method", .arg = "URL", .type = DT_OPT_STR, .off = CLI(init_method),
     .sec = DT_OPT_SEC_DIST, .example = "env://",
     .help = "env:// (default), tcp://HOST:PORT or file:///PATH; under\n"
             "mpirun without MASTER_ADDR/MASTER_PORT, rank 0's address\n"
             "travels through MPI (tcp backend; README \"Launching\")"},
    {.field = "secure_transport", .flag = "--secure-transport", .arg = "off|auth|encrypt", .type = DT_OPT_STR,
     .off = CLI(secure_transport), .sec = DT_OPT_SEC_DIST, .shown = "$DT_SECURE or off", .example = "encrypt",
     .help = "tcp backend: seal the traffic between ranks after the\n"
             "handshake with an AEAD, for integrity (auth) or integrity\n"
             "and secrecy (encrypt); every rank the same (needs a job\n"
             "secret; README \"Security\")"},
    /* for tests/check_planted.sh: plant a known bug (testing.h) */
    {.field = "fault", .flag = "--testing-fault", .arg = "NAME", .type = DT_OPT_STR, .off = CLI(fault),
     .where = DT_OPT_HIDDEN, .sec = DT_OPT_SEC_RUN, .example = "lr-rank1", .help = "plant a known bug"},
};
const int dt_tool_train_nrows = (int)(sizeof dt_tool_train_rows / sizeof dt_tool_train_rows[0]);

void dt_tool_train_cli_default(dt_tool_train_cli *c) {
    memset(c, 0, sizeof *c);
    for (int i = 0; i < dt_tool_train_nrows; i++) dt_opt_set_default(&dt_tool_train_rows[i], c);
}

const dt_opt_row *dt_tool_train_flag(int argc, char **argv, int *i, dt_train_opts *o, dt_tool_train_cli *c,
                                     dt_status *err) {
    int n;
    const dt_opt_row *rows = dt_train_options(&n), *r = dt_arg_match_row(rows, n, argc, argv, i, o, err);
    return r ? r : dt_arg_match_row(dt_tool_train_rows, dt_tool_train_nrows, argc, argv, i, c, err);
}

const dt_opt_row *dt_tool_train_row(const char *flag) {
    const dt_opt_row *r = dt_train_option_flag(flag);
    return r ? r : dt_arg_find_row(dt_tool_train_rows, dt_tool_train_nrows, flag);
}

void dt_tool_train_help(FILE *f) {
    int n;
    const dt_opt_row *rows = dt_train_options(&n);
    fputs("usage: dtrain train [flags]\n", f);
    for (int sec = 0; sec < DT_OPT_NSEC; sec++) {
        const char *intro = dt_opt_section_intro((dt_opt_section)sec);
        fprintf(f, "%s%s%s%s:\n", sec ? "" : "\n", dt_opt_section_name((dt_opt_section)sec), *intro ? " " : "", intro);
        for (int pass = 0; pass < 2; pass++) {
            const dt_opt_row *rs = pass ? dt_tool_train_rows : rows;
            for (int i = 0; i < (pass ? dt_tool_train_nrows : n); i++) {
                if ((int)rs[i].sec != sec || (rs[i].where & DT_OPT_HIDDEN)) continue;
                dt_arg_help_row(f, &rs[i]);
                if (pass == 0 && !strcmp(rs[i].field, "optim")) {   /* one line per optimizer row (optim.h) */
                    for (int k = 0; k < DT_OPTIM_COUNT; k++) {
                        const dt_optim_def *d = dt_optim_def_of((dt_optim_kind)k);
                        fprintf(f, "    %-20s%s\n", d->name, d->help);
                        fprintf(f, "%24sdefaults: --lr %g --weight-decay %g\n", "", d->train_lr, d->train_weight_decay);
                    }
                }
            }
        }
        if (sec == DT_OPT_SEC_OPTIM)
            fputs("Token workload: with a gpt or llama preset and --data tokens:DIR the defaults become nanoGPT's\n"
                  "recipe: --optim adamw --lr 1e-3 --betas 0.9,0.99 --weight-decay 0.1 --decay matrices\n"
                  "--warmup 100 --min-lr 1e-4 (lr/10 when --lr is given) --clip 1 --batch 12 --steps 2000\n"
                  "--eval-every 250 --eval-batches 20; flags given still win.\n", f);
    }
}

const char *dt_tool_error(char *buf, size_t n) {
    int nrows;
    const dt_opt_row *rows = dt_train_options(&nrows);
    return dt_arg_flag_message(rows, nrows, dt_last_error(), buf, n);
}

int dt_tool_fail(dt_status s) {
    char buf[1200];
    fprintf(stderr, "dtrain: %s\n", dt_tool_error(buf, sizeof buf));
    return dt_exit_code(s);
}

dt_status dt_tool_cpu(const dt_ops **ops) {
    dt_device_opts dev = {0};
    *ops = NULL;
    DT_TRY(dt_device_opts_env(&dev));
    if (!(*ops = dt_ops_get_ex("cpu", &dev))) return DT_ERR_INVALID;
    return DT_OK;
}

/* ---- models and data ----------------------------------------------------------------- */

dt_status dt_tool_input_shape(const char *spec, const char *data, const char *input, const char *flag,
                              dt_shape *shape, int64_t *labels) {
    memset(shape, 0, sizeof *shape);
    *labels = 1;
    dt_data_opts dopt;
    dt_data_opts_default(&dopt);
    if (data) {
        dt_dataset *ds = NULL;
        if (dt_data_windows(data)) DT_TRY(dt_spec_token_dims(spec, &dopt.window, &dopt.classes));
        dt_status s = dt_dataset_open_opts(data, DT_SPLIT_TEST, &dopt, &ds);
        if (s != DT_OK) return s == DT_ERR_IO ? DT_ERR_INVALID : s;
        const dt_dataset_info *info = dt_dataset_get_info(ds);
        shape->ndim = info->ndim;
        for (int i = 0; i < info->ndim; i++) shape->d[i] = info->shape[i];
        *labels = info->label_width;
        dt_dataset_free(ds);
        return DT_OK;
    }
    int vocab;
    int token = dt_spec_token_dims(spec, &dopt.window, &vocab) == DT_OK;
    dt_error_clear();
    if (!input && token) {
        *shape = (dt_shape){.ndim = 1, .d = {dopt.window}};
        *labels = dopt.window;
        return DT_OK;
    }
    char buf[64], *save = NULL;
    snprintf(buf, sizeof buf, "%s", input ? input : "1,28,28");
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (shape->ndim == 3) return dt_error(DT_ERR_INVALID, "%s: expected C,H,W or F, got '%s'", flag, input);
        DT_TRY(dt_arg_int(flag, tok, 1, INT64_C(1) << 31, 0, &shape->d[shape->ndim++]));
    }
    if (shape->ndim != 1 && shape->ndim != 3)
        return dt_error(DT_ERR_INVALID, "%s: expected C,H,W or F, got '%s'", flag, input);
    if (token) *labels = shape->d[0];   /* a token model's window of T positions has T labels */
    return DT_OK;
}

/* ---- the gpt recipe ------------------------------------------------------------------ */

int dt_tool_token_preset(const char *model) {
    return model && (!strncmp(model, "gpt", 3) || !strncmp(model, "llama", 5) || !strcmp(model, "smollm-135m"));
}

int dt_tool_gpt_workload(int argc, char **argv) {
    const char *model = NULL, *data = NULL;
    for (int i = 1; i < argc; i++) {
        if (i + 1 < argc && !strcmp(argv[i], "--model")) model = argv[i + 1];
        if (i + 1 < argc && !strcmp(argv[i], "--data")) data = argv[i + 1];
        if (!strncmp(argv[i], "--model=", 8)) model = argv[i] + 8;
        if (!strncmp(argv[i], "--data=", 7)) data = argv[i] + 7;
    }
    return dt_tool_token_preset(model) && data && dt_data_windows(data);
}

void dt_tool_gpt_recipe(dt_train_opts *o) {
    o->optim = "adamw";
    o->lr = 1e-3;
    o->beta1 = 0.9;
    o->beta2 = 0.99;
    o->weight_decay = 0.1;
    o->decay = "matrices";
    o->warmup = 100;
    o->schedule = "cosine";
    o->min_lr = 1e-4;
    o->clip = 1.0;
    o->batch = 12;
    o->max_steps = 2000;
    o->eval_every = 250;
    o->eval_batches = 20;
}

/* ---- metrics files ------------------------------------------------------------------ */

/* The value that follows "key": in a JSON line (spaces skipped), or NULL. Keys of
 * the metrics lines are plain words and values are numbers or hex strings, so a
 * textual search cannot land inside a value. */
static const char *json_field(const char *line, const char *key) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\"", key);
    size_t pl = strlen(pat);
    for (const char *p = strstr(line, pat); p; p = strstr(p + 1, pat)) {
        const char *q = p + pl;
        while (*q == ' ' || *q == '\t') q++;
        if (*q != ':') continue;
        q++;
        while (*q == ' ' || *q == '\t') q++;
        return q;
    }
    return NULL;
}

/* A number token (up to ',', '}' or space) into buf; 0 when absent or too long. */
static int json_token(const char *v, char *buf, size_t n) {
    size_t len = strcspn(v, ",} \t\r\n");
    if (len == 0 || len >= n) return 0;
    memcpy(buf, v, len);
    buf[len] = '\0';
    return 1;
}

/* A string value ("...") into buf; 0 when absent, not a string or too long. */
static int json_string(const char *v, char *buf, size_t n) {
    if (*v != '"') return 0;
    const char *e = strchr(v + 1, '"');
    if (!e || (size_t)(e - v - 1) >= n) return 0;
    memcpy(buf, v + 1, (size_t)(e - v - 1));
    buf[e - v - 1] = '\0';
    return 1;
}

/* The value key of a record: "loss" of a step line, "val_loss" of a validation line
 * (an "eval" event), "test_loss" of an "epoch" line that evaluated. */
static dt_status parse_step_line(const char *path, long lineno, const char *line, const char *key, dt_step_rec *r) {
    char tok[64];
    const char *v;
    char *end;
    memset(r, 0, sizeof *r);
    if (!(v = json_field(line, "step")) || !json_token(v, tok, sizeof tok))
        return dt_error(DT_ERR_INVALID, "%s:%ld: a step line without a \"step\" number", path, lineno);
    errno = 0;
    long long step = strtoll(tok, &end, 10);
    if (*end || errno || step < 0)
        return dt_error(DT_ERR_INVALID, "%s:%ld: \"step\": expected a count, got '%s'", path, lineno, tok);
    r->step = step;
    if (!(v = json_field(line, key)) || !json_token(v, r->loss_text, sizeof r->loss_text))
        return dt_error(DT_ERR_INVALID, "%s:%ld: a line without a \"%s\" number", path, lineno, key);
    r->loss = strtod(r->loss_text, &end);
    if (*end) return dt_error(DT_ERR_INVALID, "%s:%ld: \"%s\": expected a number, got '%s'", path, lineno, key, r->loss_text);
    if ((v = json_field(line, "epoch"))) {
        if (!json_token(v, tok, sizeof tok) || (r->epoch = (int)strtol(tok, &end, 10), *end) || r->epoch < 0)
            return dt_error(DT_ERR_INVALID, "%s:%ld: \"epoch\": expected a count", path, lineno);
    }
    if ((v = json_field(line, "batch_hash")) && !json_string(v, r->hash, sizeof r->hash))
        return dt_error(DT_ERR_INVALID, "%s:%ld: \"batch_hash\": expected a string of hex digits", path, lineno);
    return DT_OK;
}

/* The key of the value this line gives to the series asked for, NULL when none: step
 * losses, or validation losses (eval events, and epoch lines that evaluated). */
static const char *series_key(const char *line, int validation) {
    const char *v = json_field(line, "event");
    char ev[16];
    if (!v || !json_string(v, ev, sizeof ev)) return NULL;
    if (!validation) return strcmp(ev, "step") ? NULL : "loss";
    if (!strcmp(ev, "eval")) return "val_loss";
    return !strcmp(ev, "epoch") && json_field(line, "test_loss") ? "test_loss" : NULL;
}

static dt_status read_series(const char *path, int validation, dt_step_rec **out, size_t *n, int *runs);

dt_status dt_tool_read_steps(const char *path, dt_step_rec **out, size_t *n, int *runs) {
    return read_series(path, 0, out, n, runs);
}

dt_status dt_tool_read_validation(const char *path, dt_step_rec **out, size_t *n, int *runs) {
    return read_series(path, 1, out, n, runs);
}

static dt_status read_series(const char *path, int validation, dt_step_rec **out, size_t *n, int *runs) {
    *out = NULL;
    *n = 0;
    *runs = 0;
    FILE *f;
    /* a metrics file that cannot be opened is bad input; the message is already there */
    if (dt_file_fopen_read(path, &f) != DT_OK) return DT_ERR_INVALID;
    dt_step_rec *recs = NULL;
    size_t cnt = 0, cap = 0, lsize = 0;
    char *line = NULL;
    long lineno = 0;
    dt_status s = DT_OK;
    while (s == DT_OK && getline(&line, &lsize, f) != -1) {
        lineno++;
        const char *key = series_key(line, validation);
        if (!key) continue;
        dt_step_rec r;
        if ((s = parse_step_line(path, lineno, line, key, &r)) != DT_OK) break;
        /* the step count starts again: a new run appended to the same file (a
         * validation at the step of the one before replaces it) */
        if (validation && cnt > 0 && r.step == recs[cnt - 1].step) {
            recs[cnt - 1] = r;
            continue;
        }
        if (cnt == 0 || r.step <= recs[cnt - 1].step) {
            (*runs)++;
            cnt = 0;
        }
        if (cnt == cap) {
            size_t nc = cap ? 2 * cap : 256;
            dt_step_rec *nr = realloc(recs, nc * sizeof *nr);
            if (!nr) { s = dt_error(DT_ERR_NOMEM, "out of memory reading %s", path); break; }
            recs = nr;
            cap = nc;
        }
        recs[cnt++] = r;
    }
    if (s == DT_OK && ferror(f)) s = dt_error(DT_ERR_INVALID, "%s: read error (%s)", path, strerror(errno));
    free(line);
    fclose(f);
    if (s != DT_OK) {
        free(recs);
        *runs = 0;
        return s;
    }
    *out = recs;
    *n = cnt;
    return DT_OK;
}

/* ---- child processes ------------------------------------------------------------------ */

volatile sig_atomic_t dt_tool_stop;

void dt_tool_on_signal(int sig) { dt_tool_stop = sig; }

/* The launch variables a child must not inherit (launch_env.c reads them). */
static int is_launch_var(const char *kv) {
    static const char *const names[] = {
        "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK", "MASTER_ADDR",
        "MASTER_PORT", "DT_JOB_ID", "TORCHELASTIC_RUN_ID", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID",
        "MPI_LOCALNRANKS", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_NODEID",
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        size_t n = strlen(names[i]);
        if (!strncmp(kv, names[i], n) && kv[n] == '=') return 1;
    }
    return 0;
}

/* Wait for pid until the deadline; 1 when it ended (*st set), 0 when not. */
static int wait_until(pid_t pid, double deadline, int *st) {
    for (;;) {
        pid_t w = waitpid(pid, st, WNOHANG);
        if (w == pid) return 1;
        if (w < 0 && errno != EINTR) {  /* not our child any more: nothing to wait for */
            *st = -1;
            return 1;
        }
        if (dt_now() >= deadline || dt_tool_stop) return 0;
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

/* dup2 in a child; when src already is dst (a parent started with that descriptor
 * closed), only its close-on-exec flag must go. */
static int redirect(int src, int dst) {
    if (src == dst) return fcntl(dst, F_SETFD, 0);
    return dup2(src, dst);
}

int dt_tool_run(char *const argv[], const char *log, double timeout_s, int *timed_out) {
    *timed_out = 0;
    size_t ne = 0;
    while (environ[ne]) ne++;
    char **envp = malloc((ne + 1) * sizeof *envp);
    if (!envp) { dt_error(DT_ERR_NOMEM, "out of memory starting %s", argv[0]); return -1; }
    size_t k = 0;
    for (size_t i = 0; i < ne; i++)
        if (!is_launch_var(environ[i])) envp[k++] = environ[i];
    envp[k] = NULL;
    int fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) {
        dt_error(DT_ERR_IO, "cannot open %s for the output of %s (%s)", log, argv[0], strerror(errno));
        free(envp);
        return -1;
    }
    int in = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (in < 0) {
        dt_error(DT_ERR_IO, "cannot open /dev/null (%s)", strerror(errno));
        close(fd);
        free(envp);
        return -1;
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        /* its own process group, so a timeout can stop it and everything it started */
        setpgid(0, 0);
        if (redirect(in, 0) < 0 || redirect(fd, 1) < 0 || redirect(fd, 2) < 0) _exit(127);
        execve(argv[0], argv, envp);
        dprintf(2, "cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    int err = errno;
    close(fd);
    close(in);
    free(envp);
    if (pid < 0) { dt_error(DT_ERR_IO, "cannot start %s: fork: %s", argv[0], strerror(err)); return -1; }
    setpgid(pid, pid);  /* also here: whichever runs first */
    int st = 0;
    if (!wait_until(pid, dt_now() + timeout_s, &st)) {
        *timed_out = !dt_tool_stop;
        kill(-pid, SIGTERM);
        if (!wait_until(pid, dt_now() + 5.0, &st)) {
            kill(-pid, SIGKILL);
            while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
        }
        if (dt_tool_stop) return 128 + dt_tool_stop;
        return 124;
    }
    if (st == -1) { dt_error(DT_ERR_IO, "waiting for %s: %s", argv[0], strerror(errno)); return -1; }
    if (WIFEXITED(st)) return WEXITSTATUS(st);
    if (WIFSIGNALED(st)) return 128 + WTERMSIG(st);
    return 1;
}

void dt_tool_last_line(const char *path, char *buf, size_t n) {
    buf[0] = '\0';
    FILE *f = fopen(path, "r");
    if (!f) return;
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    while ((len = getline(&line, &cap, f)) != -1) {
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = '\0';
        if (len == 0 || line[0] == '#') continue;
        snprintf(buf, n, "%s", line);
    }
    free(line);
    fclose(f);
}
