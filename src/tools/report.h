/*
 * report.h: what `dtrain report` knows of a run, shared by its reader (report.c:
 * the events of a metrics file) and its page writer (report_html.c: one HTML file of
 * inline SVG charts and tables). The writer never reads a file, the reader never
 * writes HTML.
 */
#ifndef DT_REPORT_H
#define DT_REPORT_H

#include <stddef.h>
#include <stdint.h>

#include "mem.h"
#include "sbuf.h"
#include "status.h"

#define RPT_MAX_FILES 10
#define RPT_NMEM      (DT_MEM_NCAT + 1)   /* the categories, then the total (mem.h) */

/* A "step" event. thr is tokens/s for a token model, else samples/s; mfu < 0 when the
 * line has none. loss_text is the loss as the file prints it. */
typedef struct {
    int64_t step;
    double  loss, thr, mfu, elapsed;
    char    loss_text[40];
} rpt_step;

/* A validation loss: an "eval" event's val_loss, or an "epoch" event's test_loss. */
typedef struct {
    int64_t step;
    double  loss, acc;
    char    loss_text[40];
} rpt_val;

/* A "rank" event: the rank's seconds over its last `steps` steps. */
typedef struct {
    int64_t step;
    int     rank, stage;
    double  steps, step_s, data_s, compute_s, comm_s;
} rpt_rank;

/* A rank's accounted bytes by category at a step: from a "rank" event's mem_bytes, or
 * a "memory" event (the end of the run), which also has the peaks. */
typedef struct {
    int64_t step;
    int     rank, has_peak;
    double  cur[RPT_NMEM], peak[RPT_NMEM];
} rpt_mem;

/* One member of a "start" event, as text. */
typedef struct {
    char *key, *val;
} rpt_setting;

/* One metrics file: its last run (a file appended to by several runs holds several). */
typedef struct {
    const char  *path, *label;
    char         label_buf[256];
    rpt_step    *step;
    size_t       nstep, capstep;
    rpt_val     *val;
    size_t       nval, capval;
    rpt_rank    *rank;
    size_t       nrank, caprank;
    rpt_mem     *mem;
    size_t       nmem, capmem;
    rpt_setting *set;
    size_t       nset, capset;
    int64_t     *resume;     /* the steps it was resumed after (a start line after step N > 0, or
                                one that says a membership change) */
    char       **change;     /* per resumption: the elastic job's membership change, or NULL */
    size_t       nresume, capresume, capchange;
    double       plan;      /* dtrain plan's estimate of a rank's peak, bytes (start's plan_bytes; 0: none) */
    int          tokens;    /* the steps give tokens/s (a token model); else samples/s */
    int          world;     /* world_size of the last step (0: not given) */
    int          runs;      /* runs in the file; only the last is kept */
    long         skipped;   /* lines that are not metrics events */
} rpt_run;

/* Read path's events into r (zeroed, with path and label set). DT_ERR_INVALID naming
 * the file when it cannot be read. */
dt_status rpt_read(rpt_run *r);
void      rpt_free(rpt_run *r);

/* The whole page about the runs into b (b->oom on failure); title is its heading. */
void rpt_html(dt_sbuf *b, const rpt_run *runs, int nruns, const char *title);
/* s as HTML text or attribute value (escaped; bad UTF-8 replaced). */
void rpt_put_html(dt_sbuf *b, const char *s);

/* `dtrain report --trace FILE`: the timeline of a --trace file (report_trace.c) as one
 * page written to out; the exit status (0; 2 for a file that cannot be read or holds no
 * span; 1 when memory runs out or the page cannot be written). */
int rpt_trace_page(const char *trace, const char *out, const char *title);

#endif /* DT_REPORT_H */
