/*
 * report.c: `dtrain report` turns the metrics files of runs into one HTML page that
 * opens offline: the loss (and validation loss) of every run on one chart, the
 * throughput and MFU, each rank's step split into compute, communication wait and data
 * wait with the slowest rank marked, memory by category over the steps, and tables of
 * the settings and a summary.
 *
 *   dtrain report run.jsonl -o report.html
 *   dtrain report 1proc=np1.jsonl 2procs=np2.jsonl -o compare.html
 *
 * This file reads the files (every event of `dtrain train --metrics`, dtrain.c's
 * on_event, through the strict JSON reader of jsonl.c) and runs the command;
 * report_html.c writes the page. A line that is not JSON or not a metrics event is
 * skipped and counted, so a run cut short (its last line half written) still reports.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "args.h"
#include "fileio.h"
#include "jsonl.h"
#include "report.h"
#include "tools.h"

static const char *usage_report =
    "usage: dtrain report [flags] [LABEL=]METRICS.jsonl... -o report.html\n"
    "       dtrain report --trace TRACE.json -o timeline.html\n"
    "\n"
    "Writes one self-contained HTML page (inline SVG, no network) about one or more\n"
    "runs, from the files `dtrain train --metrics FILE` writes: the loss of every step\n"
    "and the validation loss (the runs overlaid, one colour each), the throughput\n"
    "(tokens/s or samples/s) and MFU, each rank's step split into compute,\n"
    "communication wait and data wait at the last --rank-stats report with the slowest\n"
    "rank marked, memory by category over the steps (MiB), and tables of the run's\n"
    "settings and a summary. A chart whose events a file lacks is left out with a note\n"
    "saying which flag writes them (--log-every 1 for every step, --rank-stats N,\n"
    "--eval-every N). A file appended to by several runs is reported from its last run.\n"
    "The legend is the file name, or LABEL when an argument reads LABEL=PATH.\n"
    "Lines that are not JSON or not metrics events are skipped and counted on stderr.\n"
    "\n"
    "  -o, --output FILE   the HTML page to write (atomically)\n"
    "  --title TEXT        the page's title  [dtrain report]\n"
    "  --trace FILE        instead of metrics files: the timeline of a file of\n"
    "                      dtrain train --trace, a lane per thread of each rank (main,\n"
    "                      comm, loader, device), each span a box at its time and\n"
    "                      depth, its name, detail and duration in its tooltip\n"
    "\n"
    "Exit status: 0 done, 2 bad flags or files (one that cannot be read or has no\n"
    "step events), 1 out of memory or the page could not be written.\n";

/* ---- events ------------------------------------------------------------------------- */

static void *grown(void *p, size_t *cap, size_t size) {
    size_t nc = *cap ? 2 * *cap : 64;
    void *np = realloc(p, nc * size);
    if (np) *cap = nc;
    return np;
}

/* out = a new element at the end of arr; return -1 from the caller when memory runs out */
#define PUSH(arr, n, cap, out)                                 \
    do {                                                       \
        if ((n) == (cap)) {                                    \
            void *np_ = grown((arr), &(cap), sizeof *(arr));   \
            if (!np_) return -1;                               \
            (arr) = np_;                                       \
        }                                                      \
        (out) = &(arr)[(n)++];                                 \
        memset((out), 0, sizeof *(out));                       \
    } while (0)

static void free_settings(rpt_run *r) {
    for (size_t i = 0; i < r->nset; i++) {
        free(r->set[i].key);
        free(r->set[i].val);
    }
    r->nset = 0;
}

/* A new run appended to the file: what the last one left is dropped. */
static void new_run(rpt_run *r) {
    r->nstep = r->nval = r->nrank = r->nmem = r->nresume = 0;
    r->tokens = r->world = 0;
    free_settings(r);
    r->runs++;
}

/* An integer member (a count: step, rank) into *v; 0 when absent or not one. */
static int count_of(const jsonl_obj *o, const char *key, int64_t *v) {
    const jsonl_member *m = jsonl_get(o, key);
    if (!m || m->kind != JSONL_NUM || strpbrk(m->val, ".eE-")) return 0;
    errno = 0;
    long long x = strtoll(m->val, NULL, 10);
    if (errno) return 0;
    *v = x;
    return 1;
}

/* The categories of mem.h under prefix ("mem_bytes", "mem_peak_bytes") into v. */
static int mem_of(const jsonl_obj *o, const char *prefix, double *v) {
    char key[64];
    for (int c = 0; c < RPT_NMEM; c++) {
        snprintf(key, sizeof key, "%s.%s", prefix, dt_mem_cat_name(c));
        if (!jsonl_num(o, key, &v[c]) || v[c] < 0) return 0;
    }
    return 1;
}

/* A start line begins a run, or, starting after step N > 0, continues the run before
 * from its checkpoint at N: what that run logged after N was redone, and is dropped;
 * the resumption is noted among the settings. */
static int take_start(rpt_run *r, const jsonl_obj *o) {
    int64_t from;
    const char *change = jsonl_str(o, "membership");   /* an elastic job's change (dtrun) */
    if (r->nstep && count_of(o, "step", &from) && (from > 0 || change)) {
        while (r->nstep && r->step[r->nstep - 1].step > from) r->nstep--;
        while (r->nval && r->val[r->nval - 1].step > from) r->nval--;
        while (r->nresume && r->resume[r->nresume - 1] >= from) {
            r->nresume--;
            free(r->change[r->nresume]);
        }
        int64_t *at;
        PUSH(r->resume, r->nresume, r->capresume, at);
        *at = from;
        if (r->capchange < r->capresume) {
            char **c = realloc(r->change, r->capresume * sizeof *c);
            if (!c) return -1;
            r->change = c;
            r->capchange = r->capresume;
        }
        r->change[r->nresume - 1] = change ? strdup(change) : NULL;
        if (change && !r->change[r->nresume - 1]) return -1;
        if (change) {
            rpt_setting *m;
            PUSH(r->set, r->nset, r->capset, m);
            m->key = strdup("membership change");
            m->val = strdup(jsonl_get(o, "membership")->val);
            if (!m->key || !m->val) return -1;
        }
        rpt_setting *s;
        PUSH(r->set, r->nset, r->capset, s);
        s->key = strdup("resumed after step");
        s->val = strdup(jsonl_get(o, "step")->val);
        return s->key && s->val ? 1 : -1;
    }
    if (r->nstep || r->nval || r->nrank || r->nmem || r->nset) new_run(r);
    double plan;
    if (jsonl_num(o, "plan_bytes", &plan) && plan > 0 && isfinite(plan)) r->plan = plan;
    for (size_t i = 0; i < o->n; i++) {
        if (!strcmp(o->m[i].key, "event")) continue;
        rpt_setting *s;
        PUSH(r->set, r->nset, r->capset, s);
        s->key = strdup(o->m[i].key);
        s->val = strdup(o->m[i].val);
        if (!s->key || !s->val) return -1;
    }
    return 1;
}

static int take_step(rpt_run *r, const jsonl_obj *o) {
    int64_t step, world;
    double loss;
    const jsonl_member *lm = jsonl_get(o, "loss");
    if (!count_of(o, "step", &step) || !jsonl_num(o, "loss", &loss) || strlen(lm->val) >= sizeof r->step->loss_text)
        return 0;
    if (r->nstep && step <= r->step[r->nstep - 1].step) new_run(r);
    rpt_step *s;
    PUSH(r->step, r->nstep, r->capstep, s);
    s->step = step;
    s->loss = loss;
    snprintf(s->loss_text, sizeof s->loss_text, "%s", lm->val);
    s->thr = s->mfu = s->elapsed = -1;
    if (jsonl_num(o, "tokens_per_s", &s->thr)) r->tokens = 1;
    else if (!jsonl_num(o, "samples_per_s", &s->thr)) s->thr = -1;
    if (!jsonl_num(o, "mfu", &s->mfu)) s->mfu = -1;
    if (!jsonl_num(o, "elapsed_s", &s->elapsed)) s->elapsed = -1;
    if (count_of(o, "world_size", &world)) r->world = (int)world;
    return 1;
}

/* A validation loss at a step; one at the step of the one before replaces it (an
 * epoch's evaluation at the step of an --eval-every evaluation). */
static int take_val(rpt_run *r, const jsonl_obj *o, const char *key, const char *acc_key) {
    int64_t step;
    double loss, acc = -1;
    const jsonl_member *lm = jsonl_get(o, key);
    if (!count_of(o, "step", &step) || !jsonl_num(o, key, &loss) || strlen(lm->val) >= sizeof r->val->loss_text)
        return 0;
    if (!jsonl_num(o, acc_key, &acc)) acc = -1;
    rpt_val *v;
    if (r->nval && r->val[r->nval - 1].step == step) v = &r->val[r->nval - 1];
    else PUSH(r->val, r->nval, r->capval, v);
    *v = (rpt_val){.step = step, .loss = loss, .acc = acc};
    snprintf(v->loss_text, sizeof v->loss_text, "%s", lm->val);
    return 1;
}

static int take_eval(rpt_run *r, const jsonl_obj *o) { return take_val(r, o, "val_loss", "val_acc"); }

/* An epoch's line; it gives a validation loss when the epoch evaluated. */
static int take_epoch(rpt_run *r, const jsonl_obj *o) {
    int64_t step;
    if (!jsonl_get(o, "test_loss")) return count_of(o, "step", &step);
    return take_val(r, o, "test_loss", "test_acc");
}

/* A rank's memory at a step; the "memory" event of the end replaces the "rank"
 * event's figures of the same step and rank. */
static int take_mem(rpt_run *r, const jsonl_obj *o, int64_t step, int rank, int peak) {
    rpt_mem m = {.step = step, .rank = rank};
    if (!mem_of(o, "mem_bytes", m.cur)) return 0;
    m.has_peak = peak && mem_of(o, "mem_peak_bytes", m.peak);
    for (size_t i = r->nmem; i-- > 0 && r->mem[i].step == step;)
        if (r->mem[i].rank == rank) {
            r->mem[i] = m;
            return 1;
        }
    rpt_mem *out;
    PUSH(r->mem, r->nmem, r->capmem, out);
    *out = m;
    return 1;
}

static int take_rank(rpt_run *r, const jsonl_obj *o) {
    int64_t step, rank, stage = 0;
    rpt_rank x = {0};
    if (!count_of(o, "step", &step) || !count_of(o, "rank", &rank) || !jsonl_num(o, "steps", &x.steps) ||
        !jsonl_num(o, "step_s", &x.step_s) || !jsonl_num(o, "data_s", &x.data_s) ||
        !jsonl_num(o, "compute_s", &x.compute_s) || !jsonl_num(o, "comm_s", &x.comm_s) || rank > 1 << 20)
        return 0;
    count_of(o, "stage", &stage);
    x.step = step;
    x.rank = (int)rank;
    x.stage = (int)stage;
    rpt_rank *out;
    PUSH(r->rank, r->nrank, r->caprank, out);
    *out = x;
    return take_mem(r, o, step, (int)rank, 1) < 0 ? -1 : 1;
}

static int take_memory(rpt_run *r, const jsonl_obj *o) {
    int64_t step, rank;
    if (!count_of(o, "step", &step) || !count_of(o, "rank", &rank) || rank > 1 << 20) return 0;
    return take_mem(r, o, step, (int)rank, 1);
}

/* A membership event (an elastic job's first step after a change): the start line before
 * it has said the change already. */
static int take_membership(rpt_run *r, const jsonl_obj *o) {
    (void)r;
    (void)o;
    return 1;
}

/* The events of a metrics file (dtrain.c, on_event): 1 taken, 0 not usable (the line
 * is counted as skipped), -1 out of memory. */
static const struct {
    const char *name;
    int (*take)(rpt_run *r, const jsonl_obj *o);
} events[] = {
    {"start", take_start}, {"step", take_step},   {"eval", take_eval},
    {"epoch", take_epoch}, {"rank", take_rank},   {"memory", take_memory},
    {"membership", take_membership},
};

/* One line: 1 taken, 0 skipped, -1 out of memory. */
static int take_line(rpt_run *r, const char *line) {
    jsonl_obj o = {0};
    if (jsonl_parse(line, &o)) return 0;
    const char *ev = jsonl_str(&o, "event");
    int rc = 0;
    for (size_t i = 0; ev && i < sizeof events / sizeof events[0]; i++)
        if (!strcmp(ev, events[i].name)) rc = events[i].take(r, &o);
    jsonl_free(&o);
    return rc;
}

dt_status rpt_read(rpt_run *r) {
    FILE *f;
    /* a file that cannot be opened is bad input; the message names it */
    if (dt_file_fopen_read(r->path, &f) != DT_OK) return DT_ERR_INVALID;
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int rc = 0;
    r->runs = 1;
    while (rc >= 0 && (len = getline(&line, &cap, f)) != -1) {
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = '\0';
        if (strspn(line, " \t") == (size_t)len) continue;                    /* a blank line */
        rc = strlen(line) == (size_t)len ? take_line(r, line) : 0;          /* a NUL inside: not text */
        if (rc == 0) r->skipped++;
    }
    int err = ferror(f) ? errno : 0;
    free(line);
    fclose(f);
    if (rc < 0) return dt_error(DT_ERR_NOMEM, "%s: out of memory reading it", r->path);
    if (err) return dt_error(DT_ERR_INVALID, "%s: read error (%s)", r->path, strerror(err));
    return DT_OK;
}

void rpt_free(rpt_run *r) {
    free_settings(r);
    free(r->set);
    free(r->step);
    free(r->val);
    free(r->rank);
    free(r->mem);
    for (size_t i = 0; i < r->nresume; i++) free(r->change[i]);
    free(r->change);
    free(r->resume);
}

/* ---- the command ------------------------------------------------------------------- */

/* "LABEL=PATH" when the argument is not itself an existing file and has a label; else
 * the file's name, or the path as given when another file has the same name. */
static void run_name(rpt_run *r, const char *arg) {
    const char *eq = strchr(arg, '=');
    r->path = r->label = arg;
    if (eq && eq != arg && access(arg, F_OK) != 0) {
        snprintf(r->label_buf, sizeof r->label_buf, "%.*s", (int)(eq - arg), arg);
        r->label = r->label_buf;
        r->path = eq + 1;
    }
}

static const char *base_name(const char *p) {
    const char *s = strrchr(p, '/');
    return s && s[1] ? s + 1 : p;
}

static void short_labels(rpt_run *runs, int n) {
    for (int k = 0; k < n; k++) {
        if (runs[k].label != runs[k].path) continue;
        int same = 0;
        for (int j = 0; j < n; j++)
            same |= j != k && !strcmp(base_name(runs[j].path), base_name(runs[k].path));
        if (!same) runs[k].label = base_name(runs[k].path);
    }
}

/* The page can be created at out (its directory exists and is writable, it is not a
 * directory) and is none of the metrics files. Bad input otherwise, naming it. */
static dt_status check_output(const char *out, const rpt_run *runs, int n) {
    char dir[4096];
    struct stat st, in;
    snprintf(dir, sizeof dir, "%s", out);
    char *slash = strrchr(dir, '/');
    if (!slash) snprintf(dir, sizeof dir, ".");
    else if (slash == dir) dir[1] = '\0';
    else *slash = '\0';
    int exists = stat(out, &st) == 0;
    if (exists && S_ISDIR(st.st_mode)) return dt_error(DT_ERR_INVALID, "-o: %s is a directory, expected a file name", out);
    if (access(dir, W_OK | X_OK) != 0)
        return dt_error(DT_ERR_INVALID, "-o: cannot create %s: directory %s: %s", out, dir, strerror(errno));
    for (int k = 0; exists && k < n; k++)
        if (stat(runs[k].path, &in) == 0 && in.st_dev == st.st_dev && in.st_ino == st.st_ino)
            return dt_error(DT_ERR_INVALID, "-o: %s is one of the metrics files", out);
    return DT_OK;
}

static int bad(const char *msg) {
    fprintf(stderr, "dtrain report: %s\n", msg);
    return 2;
}

/* Read every file, saying on stderr what was skipped; 0, or the exit status. */
static int read_all(rpt_run *runs, int n) {
    for (int k = 0; k < n; k++) {
        rpt_run *r = &runs[k];
        dt_status s = rpt_read(r);
        if (s != DT_OK) return s == DT_ERR_NOMEM ? (bad(dt_last_error()), 1) : bad(dt_last_error());
        if (r->skipped)
            fprintf(stderr, "dtrain report: %s: %ld line%s skipped (not metrics events)\n", r->path, r->skipped,
                    r->skipped == 1 ? "" : "s");
        if (r->nstep == 0 && r->runs > 1) {
            fprintf(stderr, "dtrain report: %s: the last of its %d runs has no step events\n", r->path, r->runs);
            return 2;
        }
        if (r->nstep == 0) {
            fprintf(stderr, "dtrain report: %s: no step events (write them with dtrain train --metrics FILE "
                            "--log-every N)\n", r->path);
            return 2;
        }
        if (r->runs > 1)
            fprintf(stderr, "dtrain report: %s holds %d runs (metrics files are appended to); reporting the last\n",
                    r->path, r->runs);
    }
    return 0;
}

static int write_page(const char *out, const rpt_run *runs, int n, const char *title) {
    dt_sbuf b = {0};
    dt_sbuf_str_(&b, "");
    rpt_html(&b, runs, n, title);
    if (b.oom) {
        dt_sbuf_free_(&b);
        return bad("out of memory building the page"), 1;
    }
    dt_status s = dt_write_atomic(out, b.p, b.len);
    dt_sbuf_free_(&b);
    if (s != DT_OK) return bad(dt_last_error()), 1;
    printf("dtrain report: wrote %s (%d run%s)\n", out, n, n == 1 ? "" : "s");
    return 0;
}

int dtrain_report_main(int argc, char **argv) {
    const char *out = NULL, *title = "dtrain report", *trace = NULL;
    rpt_run runs[RPT_MAX_FILES];
    int n = 0;
    dt_status s = DT_OK;
    memset(runs, 0, sizeof runs);
    for (int i = 1; i < argc && s == DT_OK;) {
        const char *v = NULL, *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { fputs(usage_report, stdout); return 0; }
        if (dt_arg_match("-o", argc, argv, &i, &v, &s) || dt_arg_match("--output", argc, argv, &i, &v, &s)) out = v;
        else if (dt_arg_match("--title", argc, argv, &i, &v, &s)) title = v;
        else if (dt_arg_match("--trace", argc, argv, &i, &v, &s)) trace = v;
        else if (a[0] == '-' && a[1]) s = dt_error(DT_ERR_INVALID, "unknown flag '%s' (see dtrain report --help)", a);
        else if (n == RPT_MAX_FILES) s = dt_error(DT_ERR_INVALID, "at most %d metrics files in one report", RPT_MAX_FILES);
        else run_name(&runs[n++], argv[i++]);
    }
    if (s != DT_OK) return bad(dt_last_error());
    if (trace && n) return bad("--trace: the timeline of one trace file, without metrics files (one page or the other)");
    if (trace && !out) return bad("-o: required (the HTML page to write)");
    if (trace) return rpt_trace_page(trace, out, title);
    if (n == 0) return bad("expected one or more metrics files (see dtrain report --help)");
    if (!out) return bad("-o: required (the HTML page to write)");
    if ((s = check_output(out, runs, n)) != DT_OK) return bad(dt_last_error());
    short_labels(runs, n);
    int rc = read_all(runs, n);
    if (rc == 0) rc = write_page(out, runs, n, title);
    for (int k = 0; k < n; k++) rpt_free(&runs[k]);
    return rc;
}
