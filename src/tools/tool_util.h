/*
 * tool_util.h: the helpers the commands of the dtrain program share: reading the
 * step lines of a metrics file (the JSON lines that `dtrain train --metrics`
 * appends), running a child program under a deadline with its output in a file,
 * and the library's error message with the flag in place of the option field.
 * `dtrain check`, `dtrain plot` and dtrain.c use them, so they sit below all three.
 *
 * These live in the dtrain program, not in the library: they start processes
 * and print, which the library never does (docs/DESIGN.md rule 5).
 */
#ifndef DT_TOOL_UTIL_H
#define DT_TOOL_UTIL_H

#include <signal.h>
#include <stdio.h>
#include <stddef.h>
#include <stdint.h>
#include "args.h"
#include "status.h"
#include "train.h"

/* ---- messages ----------------------------------------------------------------------- */

/* The flags of `dtrain train` that belong to the program, not to dt_train_opts: rows
 * (options.h) over this struct, shown in --help beside the library's rows. */
typedef struct {
    int64_t     threads;         /* compute threads per process (0: the default) */
    int64_t     batch_per_rank;  /* global batch = this x the world size (0: --batch) */
    double      peak_gflops;     /* MFU's peak (0: measured) */
    const char *save, *metrics, *device, *backend, *init_method, *secure_transport, *fault;
    int         quiet, allow_tf32;
    int         metrics_best_effort; /* a metrics file that cannot be written: warn, exit 0 */
} dt_tool_train_cli;
extern const dt_opt_row dt_tool_train_rows[];
extern const int        dt_tool_train_nrows;

/* The defaults of the program's rows. */
void dt_tool_train_cli_default(dt_tool_train_cli *c);
/* When argv[*i] is a flag of `dtrain train` (the library's rows or the program's), set
 * it in o or c, advance *i and return its row (*err set for a bad value); else NULL. */
const dt_opt_row *dt_tool_train_flag(int argc, char **argv, int *i, dt_train_opts *o, dt_tool_train_cli *c,
                                     dt_status *err);
/* The row of a `dtrain train` flag (exactly "--flag"), the library's or the program's. */
const dt_opt_row *dt_tool_train_row(const char *flag);
/* `dtrain train --help`, from the rows. */
void dt_tool_train_help(FILE *f);

/* dt_last_error() into buf (size n), naming the flag where the library named the
 * option field ("micro_batches: ..." -> "--micro-batches: ..."). Returns buf. */
const char *dt_tool_error(char *buf, size_t n);
/* Print "dtrain: <that message>" to stderr; returns the exit code of s (2 bad input,
 * 1 runtime failure). For the commands that run on one process. */
int         dt_tool_fail(dt_status s);
/* The CPU backend opened as the environment asks (dt_device_opts_env: DT_CPU_GEMM),
 * for the commands that compute on the CPU only (eval, sample); *ops NULL on failure. */
dt_status   dt_tool_cpu(const dt_ops **ops);

/* ---- models and data ----------------------------------------------------------------- */

/* The per-sample input shape of a model and the labels per sample: from the data set
 * `data` (its test split) when given, else from `input` ("C,H,W" or "F"; flag names it
 * in errors) when given, else the token window of a token model (spec: a gpt preset),
 * else Fashion-MNIST's (1, 28, 28) with one label. A data set that cannot be opened is
 * bad input (DT_ERR_INVALID). */
dt_status dt_tool_input_shape(const char *spec, const char *data, const char *input, const char *flag,
                              dt_shape *shape, int64_t *labels);

/* ---- the gpt recipe ------------------------------------------------------------------ */

/* 1 when model names a token preset: gpt, gpt2, gpt(...), llama, llama(...) or a named
 * Llama shape (smollm-135m, llama-1b). */
int  dt_tool_token_preset(const char *model);
/* 1 when the flags train a token preset (--model gpt..., llama...) on token data (--data
 * tokens:...): then `dtrain train` starts from nanoGPT's recipe (the one of
 * ../peers/torch_gpt.py and torch_llama.py), so `dtrain train --model llama --data
 * tokens:DIR` needs no other flag, and `dtrain check` takes the same defaults. Flags
 * given on the command line still win. */
int  dt_tool_gpt_workload(int argc, char **argv);
/* Set nanoGPT's recipe in o: AdamW (0.9, 0.99), lr 1e-3 with 100 warm-up steps and a
 * cosine to 1e-4, weight decay 0.1 on matrices, clipping at 1, batch 12, 2000 steps,
 * validation every 250 steps over 20 batches. */
void dt_tool_gpt_recipe(dt_train_opts *o);

/* ---- metrics files ------------------------------------------------------------------ */

/* One {"event":"step",...} line. loss_text keeps the number as printed (%.9g), so
 * two runs compare bit for bit without a round trip through binary. */
typedef struct {
    int     epoch;
    int64_t step;
    double  loss;
    char    loss_text[40];
    char    hash[24];      /* batch_hash, 16 hex digits; "" when the line has none */
} dt_step_rec;

/* The step lines of a metrics file. A file that was appended to by several runs
 * holds several sequences of steps (the step number starts again); only the last
 * run is returned and *runs says how many there were. DT_ERR_INVALID naming the
 * file and line for an unreadable file or a malformed step line. */
dt_status dt_tool_read_steps(const char *path, dt_step_rec **out, size_t *n, int *runs);
/* The same for the validation losses: the "eval" lines (val_loss, every --eval-every
 * steps) and the "epoch" lines that evaluated (test_loss), by step. */
dt_status dt_tool_read_validation(const char *path, dt_step_rec **out, size_t *n, int *runs);

/* ---- child processes ---------------------------------------------------------------- */

/* Run argv[0] (a path) with stdin from /dev/null and stdout and stderr appended
 * to log, in its own process group, with the launch variables of this process
 * (RANK, WORLD_SIZE, OMPI_*, SLURM_*, ...) removed so it cannot mistake itself for
 * a rank of a job that started us. After timeout_s seconds the group gets
 * SIGTERM, then SIGKILL 5 s later; so it does, at once, when dt_tool_stop is set.
 * Returns the exit status (128+S when killed by signal S), 124 on timeout
 * (*timed_out = 1), 128+S when stopped by signal S, or -1 when it could not be
 * started (message in dt_last_error()). */
int dt_tool_run(char *const argv[], const char *log, double timeout_s, int *timed_out);

/* The signal (SIGINT, SIGTERM) that asked the command to stop, 0 while none did.
 * dt_tool_on_signal is the handler that records it: a command installs it around
 * its child runs. */
extern volatile sig_atomic_t dt_tool_stop;
void dt_tool_on_signal(int sig);

/* The last non-empty line of a file that does not start with "#", without its
 * newline, into buf (size n); "" when none. Used to quote a failed child. */
void dt_tool_last_line(const char *path, char *buf, size_t n);

#endif /* DT_TOOL_UTIL_H */
