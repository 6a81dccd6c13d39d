/*
 * test_options.c: the train options' rows (options.h), walked one by one.
 *
 * Every row (the library's and the dtrain program's) is complete: a field that
 * names it, a flag, help, a section, a placeholder exactly when it takes a value,
 * a default that the flag's own parser accepts and that dt_train_opts_default
 * writes, and an example value that parses and differs from the default. Every
 * field of dt_train_opts has a row. --help shows every flag; a library message
 * naming any field comes out naming its flag. Every row a checkpoint records
 * round-trips: a run checkpointed with the example value resumes with it, and a
 * resume with another value is refused, naming the field.
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ops.h"
#include "options.h"
#include "tap.h"
#include "tools/args.h"
#include "tools/tool_util.h"
#include "train.h"

static size_t field_size(const dt_opt_row *r) {
    switch (r->type) {
    case DT_OPT_STR: return sizeof(const char *);
    case DT_OPT_INT: case DT_OPT_ON: case DT_OPT_OFF: return sizeof(int);
    case DT_OPT_I64: return sizeof(int64_t);
    case DT_OPT_U64: return sizeof(uint64_t);
    case DT_OPT_SIZE: return sizeof(size_t);
    case DT_OPT_F64: return sizeof(double);
    case DT_OPT_PAIR: return sizeof(double);
    }
    return 0;
}

/* Rows complete, flags and fields unique, defaults and examples parse. */
static void check_rows(const char *what, const dt_opt_row *rows, int n, size_t size, void *scratch, void *defaults) {
    for (int i = 0; i < n; i++) {
        const dt_opt_row *r = &rows[i];
        int sw = r->type == DT_OPT_ON || r->type == DT_OPT_OFF;
        ok(r->field && *r->field && r->flag && !strncmp(r->flag, "--", 2) && r->help && *r->help && r->example &&
           (unsigned)r->sec < DT_OPT_NSEC && r->off + field_size(r) <= size &&
           (r->type != DT_OPT_PAIR || (r->field2 && r->off2 + sizeof(double) <= size)),
           "%s row %d (%s): field, flag, help, example, section and offset", what, i, r->field ? r->field : "?");
        ok(sw == (r->arg == NULL), "%s: a placeholder exactly when the flag takes a value", r->flag);
        for (int j = 0; j < i; j++)
            if (!strcmp(rows[j].flag, r->flag) || !strcmp(rows[j].field, r->field))
                ok(0, "%s: flag and field unique (row %d has one of them too)", r->flag, j);
        char dtext[64], text[64];
        const char *def = dt_opt_text(r, defaults, dtext, sizeof dtext);
        /* the default through the flag's parser: accepted (a count whose default 0 means
         * "automatic" is outside the flag's range by design) and the same value */
        if (!sw && r->def && !(r->type != DT_OPT_STR && r->lo > 0 && !strcmp(r->def, "0"))) {
            memcpy(scratch, defaults, size);
            dt_status s = dt_arg_set(r, r->def, scratch);
            ok(s == DT_OK && !strcmp(dt_opt_text(r, scratch, text, sizeof text), def),
               "%s: the default '%s' parses to what the defaults hold ('%s')", r->flag, r->def, def);
        }
        memcpy(scratch, defaults, size);
        dt_status s = dt_arg_set(r, sw ? NULL : r->example, scratch);
        const char *ex = dt_opt_text(r, scratch, text, sizeof text);
        ok(s == DT_OK && strcmp(ex, def) != 0, "%s: the example '%s' parses and differs from the default", r->flag,
           r->example);
    }
}

/* Every byte of dt_train_opts belongs to a row, the event callback, the stop flag, or padding
 * before an 8-byte member: a field added without a row leaves a hole. */
static void check_coverage(const dt_opt_row *rows, int n) {
    unsigned char covered[sizeof(dt_train_opts)] = {0};
    for (int i = 0; i < n; i++) {
        memset(covered + rows[i].off, 1, field_size(&rows[i]));
        if (rows[i].type == DT_OPT_PAIR) memset(covered + rows[i].off2, 1, sizeof(double));
    }
    memset(covered + offsetof(dt_train_opts, on_event), 1, sizeof(dt_train_event_fn));
    memset(covered + offsetof(dt_train_opts, event_ctx), 1, sizeof(void *));
    /* the caller's stop flag (a pointer a signal handler sets), not an option either */
    memset(covered + offsetof(dt_train_opts, stop_request), 1, sizeof(void *));
    size_t hole = 0, worst = 0;
    for (size_t b = 0; b < sizeof covered; b++) {
        hole = covered[b] ? 0 : hole + 1;
        if (hole > worst) worst = hole;
    }
    ok(worst < 8, "every field of dt_train_opts has a row (the longest uncovered run is %zu bytes)", worst);
}

/* --help names every flag; a message naming a field names its flag instead. */
static void check_help_and_messages(const dt_opt_row *rows, int n) {
    char *help = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&help, &len);
    dt_tool_train_help(f);
    fclose(f);
    for (int pass = 0; pass < 2; pass++) {
        const dt_opt_row *rs = pass ? dt_tool_train_rows : rows;
        for (int i = 0; i < (pass ? dt_tool_train_nrows : n); i++) {
            char want[96];
            snprintf(want, sizeof want, "  %s%s%s", rs[i].flag, rs[i].arg ? " " : "", rs[i].arg ? rs[i].arg : "");
            const char *at = help;
            while ((at = strstr(at, want)) && at[strlen(want)] != ' ' && at[strlen(want)] != '\n') at++;
            if (rs[i].where & DT_OPT_HIDDEN) ok(!at, "--help hides %s", rs[i].flag);
            else ok(at != NULL, "--help shows %s", rs[i].flag);
        }
    }
    free(help);
    char buf[256], msg[128];
    for (int i = 0; i < n; i++) {
        const char *names[2] = {rows[i].field, rows[i].field2};
        for (int j = 0; j < 2 && names[j]; j++) {
            snprintf(msg, sizeof msg, "rank 1: %s: bad", names[j]);
            char want[128];
            snprintf(want, sizeof want, "rank 1: %s: bad", rows[i].flag);
            is_str(dt_arg_flag_message(rows, n, msg, buf, sizeof buf), want, "an error naming %s names %s",
                   names[j], rows[i].flag);
        }
    }
}

/* A short run on synthetic data, checkpointed: the base of the resume checks. */
static void base_opts(dt_train_opts *o, const char *dir) {
    dt_train_opts_default(o);
    o->model = "flatten linear(3)";
    o->data = "synthetic:32,1,4,4,3";
    o->batch = 8;
    o->max_steps = 2;
    o->epochs = 1;
    o->eval = 0;
    o->ckpt_dir = dir;
    o->log_every = 0;
}

static void check_recorded(const dt_opt_row *rows, int n, const dt_ops *ops) {
    char tmpl[] = "/tmp/dt_options_XXXXXX";
    const char *root = mkdtemp(tmpl);
    if (!root) { ok(0, "a temporary directory"); return; }
    int nrec = 0;
    for (int i = 0; i < n; i++) {
        const dt_opt_row *r = &rows[i];
        if (!(r->where & DT_OPT_RECORD)) continue;
        nrec++;
        char dir[256], cmd[300], was[64], now[64];
        snprintf(dir, sizeof dir, "%s/%s", root, r->field);
        dt_train_opts a, b;
        base_opts(&a, dir);
        b = a;
        ok(dt_arg_set(r, r->example, &a) == DT_OK, "%s: set to its example", r->flag);
        if (!strcmp(dt_opt_text(r, &a, was, sizeof was), dt_opt_text(r, &b, now, sizeof now))) {
            ok(0, "%s: the example differs from the base run's value", r->flag);
            continue;
        }
        a.stop_at = 1;   /* a checkpoint at step 1 of 2, as an interruption would leave */
        dt_status s = dt_train_run(&a, ops, NULL, NULL, NULL);
        ok(s == DT_OK, "%s %s: the first step checkpointed (%s)", r->flag, r->example, s ? dt_last_error() : "ok");
        b.resume = "auto";
        s = dt_train_run(&b, ops, NULL, NULL, NULL);
        ok(s == DT_ERR_INVALID && strstr(dt_last_error(), "differs from the checkpoint") &&
           strstr(dt_last_error(), r->field),
           "%s: a resume with another value is refused, naming %s (%s)", r->flag, r->field, dt_last_error());
        a.stop_at = 0;
        a.resume = "auto";
        dt_train_result res;
        s = dt_train_run(&a, ops, NULL, NULL, &res);
        ok(s == DT_OK && res.steps == 2, "%s: resumed with the recorded value, the run ends at step 2 (%s)", r->flag,
           s ? dt_last_error() : "ok");
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        if (system(cmd) != 0) diag("could not remove %s", dir);
    }
    ok(nrec >= 8, "%d rows are recorded by checkpoints", nrec);
    rmdir(root);
}

int main(void) {
    int n;
    const dt_opt_row *rows = dt_train_options(&n);
    dt_train_opts defaults, scratch;
    dt_train_opts_default(&defaults);
    check_rows("train", rows, n, sizeof defaults, &scratch, &defaults);
    dt_tool_train_cli cdef, cscratch;
    dt_tool_train_cli_default(&cdef);
    check_rows("program", dt_tool_train_rows, dt_tool_train_nrows, sizeof cdef, &cscratch, &cdef);
    check_coverage(rows, n);
    ok(dt_train_option_field("beta2") == dt_train_option_flag("--betas") && dt_train_option_field("max_steps") ==
       dt_train_option_flag("--steps") && !dt_train_option_field("nope") && !dt_train_option_flag("--nope"),
       "rows by field (either of a pair's) and by flag");
    check_help_and_messages(rows, n);
    const dt_ops *ops = dt_ops_get("cpu");
    if (!ops) skip(1, "no cpu backend");
    else check_recorded(rows, n, ops);
    return done_testing();
}
