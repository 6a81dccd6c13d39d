/*
 * report_trace.c: `dtrain report --trace FILE`, the timeline of a --trace file as one
 * self-contained HTML page: a lane per thread of each rank (main, comm, loader, device),
 * each span a box at its time and nesting depth, coloured by its category, its name,
 * detail and duration in its tooltip. No network, no script. It reads the events the
 * trainer writes, one per line (src/trace.c); other lines (the file's head and tail)
 * are not events and are passed over.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fileio.h"
#include "jsonl.h"
#include "report.h"

#define MAX_SPANS 200000
#define ROW       16      /* px per nesting level */
#define LEFT      170     /* px for the lanes' names */
#define WIDTH     1100    /* px of time */

typedef struct {
    double ts, dur;       /* microseconds */
    int    pid, tid, depth;
    char   name[64], cat[16], detail[96];
} span;

typedef struct {
    int    pid, tid, depth;
    char   name[32];
} lane;

typedef struct {
    span  *s;
    size_t n, cap;
    lane  *l;
    size_t nl;
    size_t dropped;       /* spans beyond MAX_SPANS */
    double clock_error;   /* otherData.clock_error_us, or < 0 */
} trace;

static void copy(char *dst, size_t n, const char *src) {
    snprintf(dst, n, "%s", src ? src : "");
}

static lane *lane_of(trace *t, int pid, int tid) {
    for (size_t i = 0; i < t->nl; i++)
        if (t->l[i].pid == pid && t->l[i].tid == tid) return &t->l[i];
    lane *l = realloc(t->l, (t->nl + 1) * sizeof *l);
    if (!l) return NULL;
    t->l = l;
    l = &t->l[t->nl++];
    *l = (lane){.pid = pid, .tid = tid};
    snprintf(l->name, sizeof l->name, "thread %d", tid);
    return l;
}

/* One line of the file: an event, or something else (skipped). -1: out of memory. */
static int take(trace *t, char *line) {
    size_t n = strlen(line);
    while (n && strchr(" \t\r\n,", line[n - 1])) line[--n] = '\0';
    char *p = line;
    while (*p == ',' || *p == ' ') p++;
    const char *ce = strstr(p, "\"clock_error_us\":");
    if (ce && t->clock_error < 0) t->clock_error = atof(ce + 17);
    if (*p != '{') return 0;
    jsonl_obj o = {0};
    if (jsonl_parse(p, &o) != 0) return 0;
    const char *ph = jsonl_str(&o, "ph");
    double pid, tid, ts, dur;
    int rc = 0;
    if (ph && jsonl_num(&o, "pid", &pid) && jsonl_num(&o, "tid", &tid)) {
        if (!strcmp(ph, "M") && jsonl_str(&o, "name") && !strcmp(jsonl_str(&o, "name"), "thread_name")) {
            lane *l = lane_of(t, (int)pid, (int)tid);
            if (!l) rc = -1;
            else copy(l->name, sizeof l->name, jsonl_str(&o, "args.name"));
        } else if (!strcmp(ph, "X") && jsonl_num(&o, "ts", &ts) && jsonl_num(&o, "dur", &dur) && isfinite(ts) &&
                   isfinite(dur) && dur >= 0) {
            if (t->n == MAX_SPANS) {
                t->dropped++;
            } else if (!lane_of(t, (int)pid, (int)tid)) {
                rc = -1;
            } else {
                if (t->n == t->cap) {
                    size_t cap = t->cap ? 2 * t->cap : 1024;
                    span *s = realloc(t->s, cap * sizeof *s);
                    if (!s) rc = -1;
                    else t->s = s, t->cap = cap;
                }
                if (rc == 0) {
                    span *s = &t->s[t->n++];
                    *s = (span){.ts = ts, .dur = dur, .pid = (int)pid, .tid = (int)tid};
                    copy(s->name, sizeof s->name, jsonl_str(&o, "name"));
                    copy(s->cat, sizeof s->cat, jsonl_str(&o, "cat"));
                    copy(s->detail, sizeof s->detail, jsonl_str(&o, "args.detail"));
                }
            }
        }
    }
    jsonl_free(&o);
    return rc;
}

static int by_lane_time(const void *a, const void *b) {
    const span *x = a, *y = b;
    if (x->pid != y->pid) return x->pid < y->pid ? -1 : 1;
    if (x->tid != y->tid) return x->tid < y->tid ? -1 : 1;
    if (x->ts != y->ts) return x->ts < y->ts ? -1 : 1;
    return x->dur > y->dur ? -1 : x->dur < y->dur;
}

static int by_id(const void *a, const void *b) {
    const lane *x = a, *y = b;
    return x->pid != y->pid ? (x->pid < y->pid ? -1 : 1) : x->tid < y->tid ? -1 : x->tid > y->tid;
}

/* Each span's depth in its lane: how many spans it lies inside. */
static void nest(trace *t) {
    qsort(t->s, t->n, sizeof *t->s, by_lane_time);
    qsort(t->l, t->nl, sizeof *t->l, by_id);
    double stack[64];
    int top = 0;
    for (size_t i = 0; i < t->n; i++) {
        span *s = &t->s[i];
        if (i == 0 || s->pid != s[-1].pid || s->tid != s[-1].tid) top = 0;
        while (top && stack[top - 1] <= s->ts + 0.5) top--;
        s->depth = top;
        if (top < 64) stack[top++] = s->ts + s->dur;
        lane *l = lane_of(t, s->pid, s->tid);
        if (l && s->depth > l->depth) l->depth = s->depth;
    }
}

static const char *colour(const char *cat) {
    static const struct { const char *cat, *rgb; } c[] = {
        {"step", "#c7c7c7"}, {"data", "#59a14f"}, {"compute", "#4e79a7"}, {"forward", "#4e79a7"},
        {"backward", "#76b7b2"}, {"comm", "#f28e2b"}, {"eval", "#b07aa1"}, {"checkpoint", "#e15759"},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++)
        if (!strcmp(c[i].cat, cat)) return c[i].rgb;
    return "#9c755f";
}

static void page(dt_sbuf *b, const trace *t, const char *path, const char *title) {
    double t0 = INFINITY, t1 = -INFINITY;
    int ranks = 0;
    for (size_t i = 0; i < t->n; i++) {
        if (t->s[i].ts < t0) t0 = t->s[i].ts;
        if (t->s[i].ts + t->s[i].dur > t1) t1 = t->s[i].ts + t->s[i].dur;
        if (t->s[i].pid + 1 > ranks) ranks = t->s[i].pid + 1;
    }
    if (t1 <= t0) t1 = t0 + 1.0;
    double us = t1 - t0, sx = WIDTH / us;
    dt_sbuf_str_(b, "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>");
    rpt_put_html(b, title);
    dt_sbuf_str_(b, "</title><style>body{font:13px sans-serif;margin:16px;color:#222}"
                    "svg{background:#fff}.lane{font-size:12px}.tick{font-size:11px;fill:#555}"
                    "rect.span{stroke:#fff;stroke-width:0.5}.label{font-size:10px;fill:#fff;pointer-events:none}"
                    ".key span{display:inline-block;width:12px;height:12px;margin:0 4px 0 12px;vertical-align:middle}"
                    "</style></head><body><h1>");
    rpt_put_html(b, title);
    dt_sbuf_str_(b, "</h1><p>");
    rpt_put_html(b, path);
    dt_sbuf_printf_(b, ": %zu spans of %d rank%s over %.3f ms", t->n, ranks, ranks == 1 ? "" : "s", us / 1000.0);
    if (t->clock_error >= 0) dt_sbuf_printf_(b, "; the ranks' clocks agree within %.1f &micro;s", t->clock_error);
    if (t->dropped) dt_sbuf_printf_(b, "; %zu more spans not drawn", t->dropped);
    dt_sbuf_str_(b, ". Each box is a span at its time and nesting depth; hover for its name, detail and duration.</p>\n");
    double h = 30;
    for (size_t i = 0; i < t->nl; i++) h += (t->l[i].depth + 1) * ROW + 6 + (i == 0 || t->l[i].pid != t->l[i - 1].pid ? 18 : 0);
    dt_sbuf_printf_(b, "<svg id=\"timeline\" width=\"%d\" height=\"%.0f\" viewBox=\"0 0 %d %.0f\">\n", LEFT + WIDTH + 10, h,
                    LEFT + WIDTH + 10, h);
    /* the time axis: about ten ticks at 1, 2 or 5 times a power of ten (ms) */
    double raw = us / 1000.0 / 10.0, p10 = pow(10.0, floor(log10(raw))), step = p10;
    if (raw / p10 > 5) step = 10 * p10;
    else if (raw / p10 > 2) step = 5 * p10;
    else if (raw / p10 > 1) step = 2 * p10;
    for (double v = 0; v <= us / 1000.0 + 1e-9; v += step) {
        double x = LEFT + v * 1000.0 * sx;
        dt_sbuf_printf_(b, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"18\" y2=\"%.0f\" stroke=\"#eee\"/>"
                           "<text class=\"tick\" x=\"%.1f\" y=\"14\">%g ms</text>\n", x, x, h, x + 2, v);
    }
    double y = 26;
    size_t k = 0;
    for (size_t i = 0; i < t->nl; i++) {
        const lane *l = &t->l[i];
        if (i == 0 || l->pid != t->l[i - 1].pid) {
            dt_sbuf_printf_(b, "<text class=\"lane\" x=\"4\" y=\"%.0f\" font-weight=\"bold\">rank %d</text>\n", y + 12, l->pid);
            y += 18;
        }
        double lh = (l->depth + 1) * ROW;
        dt_sbuf_printf_(b, "<text class=\"lane\" x=\"14\" y=\"%.0f\">", y + ROW - 4);
        rpt_put_html(b, l->name);
        dt_sbuf_printf_(b, "</text><line x1=\"%d\" x2=\"%d\" y1=\"%.0f\" y2=\"%.0f\" stroke=\"#ddd\"/>\n", LEFT,
                        LEFT + WIDTH, y + lh + 3, y + lh + 3);
        while (k < t->n && (t->s[k].pid < l->pid || (t->s[k].pid == l->pid && t->s[k].tid < l->tid))) k++;
        for (; k < t->n && t->s[k].pid == l->pid && t->s[k].tid == l->tid; k++) {
            const span *s = &t->s[k];
            double x = LEFT + (s->ts - t0) * sx, w = s->dur * sx;
            if (w < 0.5) w = 0.5;
            dt_sbuf_printf_(b, "<rect class=\"span\" x=\"%.2f\" y=\"%.0f\" width=\"%.2f\" height=\"%d\" fill=\"%s\"><title>",
                            x, y + s->depth * ROW, w, ROW - 1, colour(s->cat));
            rpt_put_html(b, s->name);
            if (s->detail[0]) dt_sbuf_str_(b, " \xe2\x80\x94 "), rpt_put_html(b, s->detail);
            dt_sbuf_printf_(b, " \xe2\x80\x94 %.3f ms</title></rect>", s->dur / 1000.0);
            if (w > 8.0 * (double)strlen(s->name) * 0.6 + 6) {
                dt_sbuf_printf_(b, "<text class=\"label\" x=\"%.1f\" y=\"%.0f\">", x + 3, y + s->depth * ROW + ROW - 5);
                rpt_put_html(b, s->name);
                dt_sbuf_str_(b, "</text>");
            }
            dt_sbuf_str_(b, "\n");
        }
        y += lh + 6;
    }
    dt_sbuf_str_(b, "</svg>\n<p class=\"key\">");
    static const char *const keys[] = {"step", "data", "compute", "backward", "comm", "eval", "checkpoint"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        dt_sbuf_printf_(b, "<span style=\"background:%s\"></span>%s", colour(keys[i]), keys[i]);
    dt_sbuf_str_(b, "<span style=\"background:#9c755f\"></span>other</p>\n</body></html>\n");
}

int rpt_trace_page(const char *path, const char *out, const char *title) {
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "dtrain report: --trace %s: cannot read it\n", path);
        return 2;
    }
    trace t = {.clock_error = -1};
    char *line = NULL;
    size_t cap = 0;
    int rc = 0;
    while (rc == 0 && getline(&line, &cap, f) >= 0)
        if (take(&t, line) != 0) rc = 1;
    free(line);
    fclose(f);
    if (rc) fprintf(stderr, "dtrain report: out of memory reading %s\n", path);
    else if (!t.n) fprintf(stderr, "dtrain report: --trace %s: no spans in it (is it a file of dtrain train --trace?)\n", path), rc = 2;
    if (rc == 0) {
        nest(&t);
        dt_sbuf b = {0};
        page(&b, &t, path, title);
        if (b.oom) {
            fprintf(stderr, "dtrain report: out of memory\n");
            rc = 1;
        } else if (dt_write_atomic(out, b.p, b.len) != DT_OK) {
            fprintf(stderr, "dtrain report: %s\n", dt_last_error());
            rc = 1;
        } else {
            printf("dtrain report: wrote %s (%zu spans)\n", out, t.n);
        }
        dt_sbuf_free_(&b);
    }
    free(t.s);
    free(t.l);
    return rc;
}
