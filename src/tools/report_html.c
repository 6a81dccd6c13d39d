/*
 * report_html.c: the page of `dtrain report` (report.h): one HTML file with inline
 * CSS and SVG drawn here, no script and nothing fetched, so it opens offline and
 * prints. Charts are 960 units wide and scale to the page (at most 980 px); each
 * has its axis labels with units and tick values. The numbers drawn are also in a
 * <script type="application/json" id="dtrain-report-data"> block (not run by the
 * browser), so a program can check the page against the metrics file.
 *
 * Every text from outside (file names, labels, settings, the title) goes through
 * put_html or put_json: escaped, and invalid UTF-8 replaced by U+FFFD.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "report.h"

#define CHART_W 960.0

/* one colour per file (Tableau 10), per memory category, per part of a rank's step */
static const char *const file_colour[RPT_MAX_FILES] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                                       "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
static const char *const mem_colour[DT_MEM_NCAT] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948"};

/* ---- text ------------------------------------------------------------------------- */

/* The length of the valid UTF-8 sequence at s, 0 when it is not one. */
static size_t utf8_seq(const unsigned char *s) {
    size_t n = s[0] < 0x80 ? 1 : (s[0] & 0xE0) == 0xC0 ? 2 : (s[0] & 0xF0) == 0xE0 ? 3 : (s[0] & 0xF8) == 0xF0 ? 4 : 0;
    if (n == 2 && s[0] < 0xC2) return 0;                                   /* overlong */
    for (size_t i = 1; i < n; i++)
        if ((s[i] & 0xC0) != 0x80) return 0;
    if (n == 3 && ((s[0] == 0xE0 && s[1] < 0xA0) || (s[0] == 0xED && s[1] >= 0xA0))) return 0;
    if (n == 4 && ((s[0] == 0xF0 && s[1] < 0x90) || s[0] > 0xF4 || (s[0] == 0xF4 && s[1] >= 0x90))) return 0;
    return n;
}

/* s as HTML text or attribute value. */
void rpt_put_html(dt_sbuf *b, const char *s) {
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        size_t n = utf8_seq(p);
        const char *e = *p == '&' ? "&amp;" : *p == '<' ? "&lt;" : *p == '>' ? "&gt;" : *p == '"' ? "&quot;"
                      : *p == '\'' ? "&#39;" : *p < 0x20 && *p != '\t' && *p != '\n' ? "&#xFFFD;" : NULL;
        if (!n) e = "&#xFFFD;", n = 1;
        if (e) dt_sbuf_str_(b, e);
        else dt_sbuf_put_(b, p, n);
        p += n;
    }
}

/* s as a JSON string that cannot end the <script> element it is in. */
static void put_json(dt_sbuf *b, const char *s) {
    dt_sbuf_put_(b, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        size_t n = utf8_seq(p);
        if (!n) dt_sbuf_str_(b, "\\ufffd"), n = 1;
        else if (*p < 0x20 || strchr("\"\\<>&", *p)) dt_sbuf_printf_(b, "\\u%04x", *p);
        else dt_sbuf_put_(b, p, n);
        p += n;
    }
    dt_sbuf_put_(b, "\"", 1);
}

/* A number of the data block (null when not finite). */
static void put_num(dt_sbuf *b, double v) {
    if (isfinite(v)) dt_sbuf_printf_(b, "%.10g", v);
    else dt_sbuf_str_(b, "null");
}

/* A figure for a table: 4 significant digits, thousands as k and millions as M. */
static void fmt_value(char *buf, size_t n, double v) {
    if (!isfinite(v)) snprintf(buf, n, "-");
    else if (fabs(v) >= 1e6) snprintf(buf, n, "%.4gM", v / 1e6);
    else if (fabs(v) >= 1e4) snprintf(buf, n, "%.4gk", v / 1e3);
    else snprintf(buf, n, "%.4g", v);
}

/* ---- axes ------------------------------------------------------------------------- */

typedef struct {
    double lo, hi, step;   /* the range drawn and the distance between ticks */
} axis;

/* A range from lo to hi in about `want` ticks of 1, 2 or 5 x 10^k (whole numbers when
 * integer; from 0 when zero). */
static axis axis_fit(double lo, double hi, int want, int integer, int zero) {
    if (!(lo <= hi)) lo = 0, hi = 1;              /* nothing to draw */
    if (zero && lo > 0) lo = 0;
    if (hi == lo) {
        double pad = integer ? 1 : lo != 0 ? fabs(lo) * 0.1 : 1;
        lo -= pad, hi += pad;
    }
    double raw = (hi - lo) / want, mag = pow(10, floor(log10(raw))), f = raw / mag;
    axis a = {.step = mag * (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10)};
    if (integer && a.step < 1) a.step = 1;
    a.lo = floor(lo / a.step) * a.step;
    a.hi = ceil(hi / a.step) * a.step;
    if (a.hi <= a.lo) a.hi = a.lo + a.step;
    return a;
}

/* A tick's value: as many decimals as the step needs; k and M for large ones. */
static void fmt_tick(char *buf, size_t n, double v, double step) {
    if (fabs(v) < step * 1e-9) v = 0;
    if (fabs(v) >= 1e6 && step >= 1e5) snprintf(buf, n, "%gM", v / 1e6);
    else if (fabs(v) >= 1e4 && step >= 1e3) snprintf(buf, n, "%gk", v / 1e3);
    else snprintf(buf, n, "%.*f", step >= 1 ? 0 : (int)ceil(-log10(step) - 1e-9), v);
}

/* ---- charts ------------------------------------------------------------------------- */

typedef struct {
    dt_sbuf *b;
    double   h, x0, x1, y0, y1;   /* the SVG's height; the plot area */
    axis     x, y, y2;            /* y2.step 0: no right axis */
} chart;

static double px(const chart *c, double v) { return c->x0 + (v - c->x.lo) / (c->x.hi - c->x.lo) * (c->x1 - c->x0); }
static double py(const chart *c, double v) { return c->y1 - (v - c->y.lo) / (c->y.hi - c->y.lo) * (c->y1 - c->y0); }
static double py2(const chart *c, double v) { return c->y1 - (v - c->y2.lo) / (c->y2.hi - c->y2.lo) * (c->y1 - c->y0); }

/* The vertical axes' ticks and grid lines (left: y, right: y2). */
static void y_ticks(const chart *c) {
    char t[32];
    for (double v = c->y.lo; c->y.step > 0 && v <= c->y.hi + c->y.step * 1e-6; v += c->y.step) {
        fmt_tick(t, sizeof t, v, c->y.step);
        dt_sbuf_printf_(c->b, "<line class=\"grid\" x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\"/>"
                              "<text class=\"tick\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n",
                        c->x0, c->x1, py(c, v), py(c, v), c->x0 - 6, py(c, v) + 4, t);
    }
    for (double v = c->y2.lo; c->y2.step > 0 && v <= c->y2.hi + c->y2.step * 1e-6; v += c->y2.step) {
        fmt_tick(t, sizeof t, v, c->y2.step);
        dt_sbuf_printf_(c->b, "<text class=\"tick\" x=\"%.1f\" y=\"%.1f\">%s</text>\n", c->x1 + 6, py2(c, v) + 4, t);
    }
}

static void x_ticks(const chart *c) {
    char t[32];
    for (double v = c->x.lo; v <= c->x.hi + c->x.step * 1e-6; v += c->x.step) {
        fmt_tick(t, sizeof t, v, c->x.step);
        dt_sbuf_printf_(c->b, "<line class=\"grid\" x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\"/>"
                              "<text class=\"tick\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n",
                        px(c, v), px(c, v), c->y0, c->y1, px(c, v), c->y1 + 16, t);
    }
}

/* The <svg> of a chart: its frame, ticks and the axes' labels (units in them). */
static void chart_open(chart *c, const char *id, const char *xlabel, const char *ylabel, const char *y2label) {
    dt_sbuf *b = c->b;
    dt_sbuf_printf_(b, "<svg class=\"chart\" id=\"%s\" viewBox=\"0 0 %.0f %.0f\" role=\"img\" "
                       "xmlns=\"http://www.w3.org/2000/svg\">\n<rect class=\"bg\" width=\"%.0f\" height=\"%.0f\"/>\n",
                    id, CHART_W, c->h, CHART_W, c->h);
    y_ticks(c);
    x_ticks(c);
    dt_sbuf_printf_(b, "<rect class=\"frame\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\"/>\n", c->x0, c->y0,
                    c->x1 - c->x0, c->y1 - c->y0);
    dt_sbuf_printf_(b, "<text class=\"label\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">", (c->x0 + c->x1) / 2, c->h - 8);
    rpt_put_html(b, xlabel);
    dt_sbuf_printf_(b, "</text>\n<text class=\"label\" transform=\"translate(16 %.1f) rotate(-90)\" "
                       "text-anchor=\"middle\">", (c->y0 + c->y1) / 2);
    rpt_put_html(b, ylabel);
    dt_sbuf_str_(b, "</text>\n");
    if (!y2label) return;
    dt_sbuf_printf_(b, "<text class=\"label\" transform=\"translate(%.1f %.1f) rotate(90)\" text-anchor=\"middle\">",
                    CHART_W - 14, (c->y0 + c->y1) / 2);
    rpt_put_html(b, y2label);
    dt_sbuf_str_(b, "</text>\n");
}

/* A chart of height h over the axes x and y (and y2 when its step is not 0). */
static chart chart_new(dt_sbuf *b, double h, axis x, axis y, axis y2, double right) {
    return (chart){.b = b, .h = h, .x0 = 72, .x1 = CHART_W - right, .y0 = 14, .y1 = h - 46, .x = x, .y = y, .y2 = y2};
}

/* One line of a legend: a swatch of the colour (dashed when dash) and the text. */
static void legend_item(dt_sbuf *b, const char *colour, int dash, const char *text) {
    dt_sbuf_printf_(b, "<span class=\"item\"><span class=\"sw%s\" style=\"border-color:%s;background:%s\"></span>",
                    dash ? " dash" : "", colour, dash ? "transparent" : colour);
    rpt_put_html(b, text);
    dt_sbuf_str_(b, "</span>");
}

static void note(dt_sbuf *b, const char *text) {
    dt_sbuf_str_(b, "<p class=\"note\">");
    rpt_put_html(b, text);
    dt_sbuf_str_(b, "</p>\n");
}

/* ---- 1. loss ----------------------------------------------------------------------- */

static void loss_range(const rpt_run *runs, int n, double *x0, double *x1, double *y0, double *y1) {
    *x0 = *y0 = INFINITY;
    *x1 = *y1 = -INFINITY;
    for (int k = 0; k < n; k++) {
        for (size_t i = 0; i < runs[k].nstep; i++) {
            const rpt_step *s = &runs[k].step[i];
            *x0 = fmin(*x0, (double)s->step), *x1 = fmax(*x1, (double)s->step);
            if (isfinite(s->loss)) *y0 = fmin(*y0, s->loss), *y1 = fmax(*y1, s->loss);
        }
        for (size_t i = 0; i < runs[k].nval; i++) {
            const rpt_val *v = &runs[k].val[i];
            *x0 = fmin(*x0, (double)v->step), *x1 = fmax(*x1, (double)v->step);
            if (isfinite(v->loss)) *y0 = fmin(*y0, v->loss), *y1 = fmax(*y1, v->loss);
        }
    }
}

/* The training loss of run k: a polyline whose points are its step events. */
static void loss_line(const chart *c, const rpt_run *r, int k) {
    size_t pts = 0;
    for (size_t i = 0; i < r->nstep; i++) pts += isfinite(r->step[i].loss);
    dt_sbuf_printf_(c->b, "<polyline class=\"loss\" data-file=\"%d\" data-points=\"%zu\" stroke=\"%s\" points=\"", k,
                    pts, file_colour[k]);
    for (size_t i = 0, first = 1; i < r->nstep; i++)
        if (isfinite(r->step[i].loss)) {
            dt_sbuf_printf_(c->b, "%s%.1f,%.1f", first ? "" : " ", px(c, (double)r->step[i].step), py(c, r->step[i].loss));
            first = 0;
        }
    dt_sbuf_str_(c->b, "\"><title>");
    rpt_put_html(c->b, r->label);
    dt_sbuf_str_(c->b, ": training loss</title></polyline>\n");
    for (size_t i = 0; pts == 1 && i < r->nstep; i++)   /* one point makes no line: a dot */
        if (isfinite(r->step[i].loss))
            dt_sbuf_printf_(c->b, "<circle r=\"3\" fill=\"%s\" cx=\"%.1f\" cy=\"%.1f\"/>\n", file_colour[k],
                            px(c, (double)r->step[i].step), py(c, r->step[i].loss));
}

/* The validation losses of run k: dashed, a dot at each evaluation. */
static void val_line(const chart *c, const rpt_run *r, int k) {
    if (!r->nval) return;
    dt_sbuf_printf_(c->b, "<polyline class=\"val\" data-file=\"%d\" stroke=\"%s\" points=\"", k, file_colour[k]);
    for (size_t i = 0, first = 1; i < r->nval; i++)
        if (isfinite(r->val[i].loss)) {
            dt_sbuf_printf_(c->b, "%s%.1f,%.1f", first ? "" : " ", px(c, (double)r->val[i].step), py(c, r->val[i].loss));
            first = 0;
        }
    dt_sbuf_str_(c->b, "\"/>\n");
    for (size_t i = 0; i < r->nval; i++) {
        if (!isfinite(r->val[i].loss)) continue;
        dt_sbuf_printf_(c->b, "<circle class=\"dot\" r=\"3.5\" fill=\"%s\" cx=\"%.1f\" cy=\"%.1f\"><title>", file_colour[k],
                        px(c, (double)r->val[i].step), py(c, r->val[i].loss));
        rpt_put_html(c->b, r->label);
        dt_sbuf_printf_(c->b, ": validation loss %s at step %lld</title></circle>\n", r->val[i].loss_text,
                        (long long)r->val[i].step);
    }
}

/* A run's resumptions: a dotted vertical line at each step it was resumed after. */
static void resume_marks(const chart *c, const rpt_run *r) {
    for (size_t i = 0; i < r->nresume; i++) {
        double x = (double)r->resume[i];
        const char *change = r->change ? r->change[i] : NULL;
        if (x < c->x.lo || x > c->x.hi) continue;
        dt_sbuf_printf_(c->b, "<line class=\"%s\" data-step=\"%lld\" x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" "
                        "y2=\"%.1f\" stroke=\"%s\" stroke-dasharray=\"2 3\"><title>", change ? "membership" : "resume",
                        (long long)r->resume[i], px(c, x), px(c, x), c->y0, c->y1, change ? "#d95f02" : "#555");
        rpt_put_html(c->b, r->label);
        dt_sbuf_printf_(c->b, ": resumed after step %lld", (long long)r->resume[i]);
        if (change) {
            dt_sbuf_str_(c->b, " on a membership change: ");
            rpt_put_html(c->b, change);
        }
        dt_sbuf_str_(c->b, "</title></line>\n");
    }
}

/* The legend's word for the marks, when a run has any. */
static void resume_legend(dt_sbuf *b, const rpt_run *runs, int n) {
    int plain = 0, change = 0;
    for (int k = 0; k < n; k++)
        for (size_t i = 0; i < runs[k].nresume; i++) {
            if (runs[k].change && runs[k].change[i]) change = 1;
            else plain = 1;
        }
    if (plain) legend_item(b, "#555", 1, "resumed from a checkpoint (dotted)");
    if (change) legend_item(b, "#d95f02", 1, "membership change: nodes left or joined (dotted)");
}

static void section_loss(dt_sbuf *b, const rpt_run *runs, int n) {
    double x0, x1, y0, y1;
    int nval = 0;
    loss_range(runs, n, &x0, &x1, &y0, &y1);
    dt_sbuf_str_(b, "<h2>Loss</h2>\n<div class=\"legend\">");
    for (int k = 0; k < n; k++) legend_item(b, file_colour[k], 0, runs[k].label), nval += runs[k].nval > 0;
    dt_sbuf_str_(b, nval ? "<span class=\"item\">solid: training loss of each step; dashed with dots: validation "
                           "loss</span>" : "");
    resume_legend(b, runs, n);
    dt_sbuf_str_(b, "</div>\n");
    chart c = chart_new(b, 380, axis_fit(x0, x1, 10, 1, 0), axis_fit(y0, y1, 6, 0, 0), (axis){0}, 24);
    chart_open(&c, "chart-loss", "step", "loss (per sample, as logged)", NULL);
    for (int k = 0; k < n; k++) loss_line(&c, &runs[k], k);
    for (int k = 0; k < n; k++) val_line(&c, &runs[k], k);
    for (int k = 0; k < n; k++) resume_marks(&c, &runs[k]);
    dt_sbuf_str_(b, "</svg>\n");
    if (!nval)
        note(b, "No validation loss: no file has \"eval\" events or epochs that evaluated (dtrain train "
                "--eval-every N, or whole epochs).");
    for (int k = 0; nval && k < n; k++)
        if (!runs[k].nval) {
            dt_sbuf_str_(b, "<p class=\"note\">No validation loss in ");
            rpt_put_html(b, runs[k].label);
            dt_sbuf_str_(b, ": it has no \"eval\" events or epochs that evaluated.</p>\n");
        }
}

/* ---- 2. throughput ----------------------------------------------------------------- */

/* The runs of one unit (tokens: tokens/s, else samples/s) that have throughput. */
static int thr_runs(const rpt_run *runs, int n, int tokens, double *x0, double *x1, double *ymax, double *mfumax) {
    int m = 0;
    *x0 = INFINITY, *x1 = -INFINITY, *ymax = 0, *mfumax = -1;
    for (int k = 0; k < n; k++) {
        int has = 0;
        for (size_t i = 0; runs[k].tokens == tokens && i < runs[k].nstep; i++) {
            const rpt_step *s = &runs[k].step[i];
            if (!(s->thr >= 0) || !isfinite(s->thr)) continue;
            has = 1;
            *x0 = fmin(*x0, (double)s->step), *x1 = fmax(*x1, (double)s->step), *ymax = fmax(*ymax, s->thr);
            if (s->mfu >= 0 && isfinite(s->mfu)) *mfumax = fmax(*mfumax, s->mfu);
        }
        m += has;
    }
    return m;
}

/* One run's throughput (solid) or MFU (dashed, on the right axis). */
static void thr_line(const chart *c, const rpt_run *r, int k, int mfu) {
    dt_sbuf_printf_(c->b, "<polyline class=\"%s\" data-file=\"%d\" stroke=\"%s\" points=\"", mfu ? "mfu" : "thr", k,
                    file_colour[k]);
    int first = 1;
    for (size_t i = 0; i < r->nstep; i++) {
        double v = mfu ? r->step[i].mfu : r->step[i].thr;
        if (!(v >= 0) || !isfinite(v)) continue;
        dt_sbuf_printf_(c->b, "%s%.1f,%.1f", first ? "" : " ", px(c, (double)r->step[i].step), mfu ? py2(c, v) : py(c, v));
        first = 0;
    }
    dt_sbuf_str_(c->b, "\"><title>");
    rpt_put_html(c->b, r->label);
    dt_sbuf_str_(c->b, mfu ? ": MFU</title></polyline>\n" : ": throughput</title></polyline>\n");
}

/* MFU over throughput when it is the same for every step of every run of the chart
 * (MFU is the throughput times the FLOPs per token over the peak, so one run's MFU is
 * its throughput line read on another scale); 0 when the runs differ or have none. */
static double mfu_ratio(const rpt_run *runs, int n, int tokens) {
    double k = 0;
    for (int q = 0; q < n; q++)
        for (size_t i = 0; runs[q].tokens == tokens && i < runs[q].nstep; i++) {
            const rpt_step *s = &runs[q].step[i];
            if (!(s->mfu >= 0) || !(s->thr >= 1) || !isfinite(s->mfu) || !isfinite(s->thr)) continue;
            double r = s->mfu / s->thr;
            if (k == 0) k = r;
            else if (fabs(r - k) > 0.01 * k) return 0;
        }
    return k;
}

static void thr_chart(dt_sbuf *b, const rpt_run *runs, int n, int tokens) {
    double x0, x1, ymax, mfumax;
    const char *unit = tokens ? "tokens/s" : "samples/s";
    if (!thr_runs(runs, n, tokens, &x0, &x1, &ymax, &mfumax)) return;
    int mfu = mfumax >= 0;
    double ratio = mfu ? mfu_ratio(runs, n, tokens) : 0;
    axis y = axis_fit(0, ymax, 6, 0, 1), y2 = {0};
    if (ratio > 0) {        /* the right axis reads the throughput line as MFU */
        y2 = axis_fit(0, y.hi * ratio, 5, 0, 1);
        y2.hi = y.hi * ratio;
    } else if (mfu) {
        y2 = axis_fit(0, mfumax, 5, 0, 1);
    }
    dt_sbuf_str_(b, "<div class=\"legend\">");
    for (int k = 0; k < n; k++)
        if (runs[k].tokens == tokens) legend_item(b, file_colour[k], 0, runs[k].label);
    dt_sbuf_printf_(b, "<span class=\"item\">%s of the whole job%s</span>", unit,
                    ratio > 0 ? "; the right axis reads the same line as MFU"
                    : mfu ? " (solid); dashed: MFU (right axis)" : "");
    resume_legend(b, runs, n);
    dt_sbuf_str_(b, "</div>\n");
    chart c = chart_new(b, 340, axis_fit(x0, x1, 10, 1, 0), y, y2, mfu ? 64 : 24);
    chart_open(&c, tokens ? "chart-tokens" : "chart-samples", "step", unit, mfu ? "MFU (% of peak)" : NULL);
    for (int k = 0; k < n; k++)
        if (runs[k].tokens == tokens) {
            thr_line(&c, &runs[k], k, 0);
            if (mfu && ratio == 0) thr_line(&c, &runs[k], k, 1);
            resume_marks(&c, &runs[k]);
        }
    dt_sbuf_str_(b, "</svg>\n");
}

static void section_throughput(dt_sbuf *b, const rpt_run *runs, int n) {
    double x0, x1, ymax, mfumax;
    int tok = thr_runs(runs, n, 1, &x0, &x1, &ymax, &mfumax), smp = thr_runs(runs, n, 0, &x0, &x1, &ymax, &mfumax);
    dt_sbuf_str_(b, "<h2>Throughput</h2>\n");
    if (!tok && !smp) {
        note(b, "No throughput chart: the step events have no tokens_per_s or samples_per_s.");
        return;
    }
    thr_chart(b, runs, n, 1);
    thr_chart(b, runs, n, 0);
}

/* ---- 3. each rank's step ------------------------------------------------------------ */

static const char *const part_name[4] = {"compute", "communication wait", "data wait", "rest of the step"};
static const char *const part_colour[4] = {"#4e79a7", "#e15759", "#f28e2b", "#bab0ac"};

/* A rank's milliseconds per step: compute, communication wait, data wait, the rest. */
static void rank_parts(const rpt_rank *x, double ms[4]) {
    double n = x->steps > 0 ? x->steps : 1;
    ms[0] = 1e3 * x->compute_s / n;
    ms[1] = 1e3 * x->comm_s / n;
    ms[2] = 1e3 * x->data_s / n;
    ms[3] = 1e3 * x->step_s / n - ms[0] - ms[1] - ms[2];
    if (ms[3] < 1e-6 * ms[0]) ms[3] = 0;   /* the rounding of the printed seconds */
}

/* The last report's "rank" events: r->rank[*first .. r->nrank) (written together, in
 * rank order). The slowest is the longest step, or in a pipeline (whose stages end
 * together) the most compute, as dtrain train's table says. */
static size_t last_ranks(const rpt_run *r, size_t *first) {
    size_t i = r->nrank, slow;
    while (i > 0 && r->rank[i - 1].step == r->rank[r->nrank - 1].step) i--;
    int pipe = 0;
    for (size_t q = i; q < r->nrank; q++) pipe |= r->rank[q].stage != 0;
    slow = i;
    for (size_t q = i; q < r->nrank; q++) {
        const rpt_rank *a = &r->rank[q], *s = &r->rank[slow];
        double va = (pipe ? a->compute_s : a->step_s) / (a->steps > 0 ? a->steps : 1);
        double vs = (pipe ? s->compute_s : s->step_s) / (s->steps > 0 ? s->steps : 1);
        if (va > vs) slow = q;
    }
    *first = i;
    return slow;
}

static void rank_bar(const chart *c, const rpt_rank *x, double top, double hgt, int slowest) {
    double ms[4], at = 0;
    rank_parts(x, ms);
    for (int p = 0; p < 4; p++) {
        dt_sbuf_printf_(c->b, "<rect class=\"seg\" data-rank=\"%d\" data-part=\"%s\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" "
                              "height=\"%.1f\" fill=\"%s\"><title>rank %d: %s %.3g ms per step</title></rect>\n",
                        x->rank, part_name[p], px(c, at), top, px(c, at + ms[p]) - px(c, at), hgt, part_colour[p],
                        x->rank, part_name[p], ms[p]);
        at += ms[p];
    }
    dt_sbuf_printf_(c->b, "<text class=\"tick\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">rank %d</text>\n", c->x0 - 6,
                    top + hgt / 2 + 4, x->rank);
    if (!slowest) return;
    dt_sbuf_printf_(c->b, "<rect class=\"slowest\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\"/>"
                          "<text class=\"mark\" x=\"%.1f\" y=\"%.1f\">&#9664; slowest (%.3g ms)</text>\n",
                    c->x0, top - 2, px(c, at) - c->x0, hgt + 4, px(c, at) + 6, top + hgt / 2 + 4, at);
}

static void section_ranks(dt_sbuf *b, const rpt_run *r, int k) {
    dt_sbuf_str_(b, "<h3>Step time per rank</h3>\n");
    if (!r->nrank) {
        note(b, "No per-rank step split: the file has no \"rank\" events (dtrain train --rank-stats N writes them).");
        return;
    }
    size_t first, slow = last_ranks(r, &first), rows = r->nrank - first;
    double ms[4], max = 0;
    for (size_t q = first; q < r->nrank; q++) {
        rank_parts(&r->rank[q], ms);
        max = fmax(max, ms[0] + ms[1] + ms[2] + ms[3]);
    }
    dt_sbuf_str_(b, "<div class=\"legend\">");
    for (int p = 0; p < 4; p++) legend_item(b, part_colour[p], 0, part_name[p]);
    dt_sbuf_str_(b, "</div>\n");
    char xl[160];
    snprintf(xl, sizeof xl, "ms per step (mean of the %.0f steps up to step %lld)", r->rank[first].steps,
             (long long)r->rank[first].step);
    chart c = chart_new(b, 60 + 30.0 * (double)rows, axis_fit(0, max, 8, 0, 1), (axis){0, 1, 0}, (axis){0}, 150);
    char id[32];
    snprintf(id, sizeof id, "chart-ranks-%d", k);
    chart_open(&c, id, xl, "rank", NULL);
    double band = (c.y1 - c.y0) / (double)rows;
    for (size_t q = first; q < r->nrank; q++)
        rank_bar(&c, &r->rank[q], c.y0 + band * (double)(q - first) + band * 0.2, band * 0.6, rows > 1 && q == slow);
    dt_sbuf_str_(b, "</svg>\n");
}

/* ---- 4. memory ---------------------------------------------------------------------- */

#define MIB(x) ((x) / 1048576.0)

/* Rank 0's figures over the steps: the polygon (or with one point, the column) of
 * category cat, stacked on those before it. */
static void mem_layer(const chart *c, const rpt_mem *const *m, size_t n, int cat) {
    dt_sbuf_printf_(c->b, "<polygon class=\"mem\" data-cat=\"%s\" fill=\"%s\" points=\"", dt_mem_cat_name(cat),
                    mem_colour[cat]);
    for (int back = 0; back < 2; back++)       /* along the top, then back along the bottom */
        for (size_t j = 0; j < n; j++) {
            size_t i = back ? n - 1 - j : j;
            double below = 0;
            for (int k = 0; k < cat; k++) below += m[i]->cur[k];
            double x = px(c, (double)m[i]->step), y = py(c, MIB(back ? below : below + m[i]->cur[cat]));
            if (n == 1) dt_sbuf_printf_(c->b, "%.1f,%.1f %.1f,%.1f ", x + (back ? 12 : -12), y, x + (back ? -12 : 12), y);
            else dt_sbuf_printf_(c->b, "%.1f,%.1f ", x, y);
        }
    dt_sbuf_printf_(c->b, "\"><title>%s, MiB</title></polygon>\n", dt_mem_cat_name(cat));
}

/* The running peak of the total, dashed, where the events give it. */
static void mem_peak(const chart *c, const rpt_mem *const *m, size_t n) {
    dt_sbuf_str_(c->b, "<polyline class=\"peak\" points=\"");
    for (size_t i = 0; i < n; i++) {
        if (!m[i]->has_peak) continue;
        double x = px(c, (double)m[i]->step), y = py(c, MIB(m[i]->peak[DT_MEM_TOTAL]));
        if (n == 1) dt_sbuf_printf_(c->b, "%.1f,%.1f %.1f,%.1f", x - 16, y, x + 16, y);
        else dt_sbuf_printf_(c->b, "%.1f,%.1f ", x, y);
    }
    dt_sbuf_str_(c->b, "\"><title>peak total, MiB</title></polyline>\n");
}

static void mem_chart(dt_sbuf *b, const rpt_mem *const *m, size_t n, int run, const rpt_run *r) {
    double x0 = INFINITY, x1 = -INFINITY, ymax = 0;
    for (size_t i = 0; i < n; i++) {
        x0 = fmin(x0, (double)m[i]->step), x1 = fmax(x1, (double)m[i]->step);
        ymax = fmax(ymax, MIB(m[i]->cur[DT_MEM_TOTAL]));
        if (m[i]->has_peak) ymax = fmax(ymax, MIB(m[i]->peak[DT_MEM_TOTAL]));
    }
    ymax = fmax(ymax, MIB(r->plan));
    dt_sbuf_str_(b, "<div class=\"legend\">");
    for (int k = 0; k < DT_MEM_NCAT; k++) legend_item(b, mem_colour[k], 0, dt_mem_cat_name(k));
    legend_item(b, "#222", 1, "peak of the total");
    if (r->plan > 0) {
        char t[96];
        snprintf(t, sizeof t, "dtrain plan's peak, %.1f MiB (dotted)", MIB(r->plan));
        legend_item(b, "#b07aa1", 1, t);
    }
    resume_legend(b, r, 1);
    dt_sbuf_str_(b, "</div>\n");
    chart c = chart_new(b, 320, axis_fit(x0, x1, 10, 1, 0), axis_fit(0, ymax, 6, 0, 1), (axis){0}, 24);
    char id[32];
    snprintf(id, sizeof id, "chart-memory-%d", run);
    chart_open(&c, id, "step", "MiB held by rank 0 (accounted)", NULL);
    for (int k = 0; k < DT_MEM_NCAT; k++) mem_layer(&c, m, n, k);
    mem_peak(&c, m, n);
    if (r->plan > 0)
        dt_sbuf_printf_(b, "<line class=\"plan\" data-mib=\"%.1f\" x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" "
                        "stroke=\"#b07aa1\" stroke-dasharray=\"1 3\" stroke-width=\"2\"><title>dtrain plan's estimate "
                        "of the peak: %.1f MiB</title></line>\n", MIB(r->plan), c.x0, c.x1, py(&c, MIB(r->plan)),
                        py(&c, MIB(r->plan)), MIB(r->plan));
    resume_marks(&c, r);
    dt_sbuf_str_(b, "</svg>\n");
}

/* Each rank's last figures: (*last)[q] for rank q < the count returned (NULL for a
 * rank without any); 0 when there are none (*last NULL) or memory runs out (b->oom). */
static int mem_last(dt_sbuf *b, const rpt_run *r, const rpt_mem ***last) {
    int ranks = 0;
    for (size_t i = 0; i < r->nmem; i++)
        if (r->mem[i].rank >= ranks) ranks = r->mem[i].rank + 1;
    *last = ranks ? calloc((size_t)ranks, sizeof **last) : NULL;
    if (ranks && !*last) b->oom = 1;
    if (!*last) return 0;
    for (size_t i = 0; i < r->nmem; i++) (*last)[r->mem[i].rank] = &r->mem[i];
    return ranks;
}

/* Each rank's last figures: MiB now and at peak, by category. */
static void mem_table(dt_sbuf *b, const rpt_run *r) {
    const rpt_mem **last;
    int ranks = mem_last(b, r, &last);
    dt_sbuf_str_(b, "<table class=\"mem\"><tr><th>rank</th><th>step</th>");
    for (int k = 0; k < RPT_NMEM; k++) dt_sbuf_printf_(b, "<th>%s</th>", dt_mem_cat_name(k));
    dt_sbuf_str_(b, "</tr>\n");
    for (int q = 0; q < ranks; q++) {
        const rpt_mem *m = last[q];
        if (!m) continue;
        dt_sbuf_printf_(b, "<tr><td>%d</td><td>%lld</td>", q, (long long)m->step);
        for (int k = 0; k < RPT_NMEM; k++) {
            if (m->has_peak) dt_sbuf_printf_(b, "<td>%.1f / %.1f</td>", MIB(m->cur[k]), MIB(m->peak[k]));
            else dt_sbuf_printf_(b, "<td>%.1f</td>", MIB(m->cur[k]));
        }
        dt_sbuf_str_(b, "</tr>\n");
    }
    free(last);
    dt_sbuf_str_(b, "</table>\n<p class=\"caption\">MiB at the last report of each rank, now / peak.</p>\n");
}

static void section_memory(dt_sbuf *b, const rpt_run *r, int k) {
    dt_sbuf_str_(b, "<h3>Memory</h3>\n");
    const rpt_mem **m = r->nmem ? malloc(r->nmem * sizeof *m) : NULL;
    size_t n = 0;
    for (size_t i = 0; m && i < r->nmem; i++)
        if (r->mem[i].rank == 0) m[n++] = &r->mem[i];
    if (!n) {
        if (r->nmem && !m) b->oom = 1;
        note(b, "No memory chart: the file has no \"memory\" event of rank 0 (written when a run ends) and no "
                "\"rank\" events with memory figures (dtrain train --rank-stats N).");
        free(m);
        return;
    }
    mem_chart(b, m, n, k, r);
    free(m);
    mem_table(b, r);
}

/* ---- 5. settings and summary ------------------------------------------------------- */

static void section_settings(dt_sbuf *b, const rpt_run *r) {
    dt_sbuf_str_(b, "<h3>Settings</h3>\n");
    if (!r->nset) {
        note(b, "No settings table: the file has no \"start\" event (the summary above is from its step events).");
        return;
    }
    dt_sbuf_str_(b, "<table class=\"settings\"><tr><th>setting</th><th>value</th></tr>\n");
    for (size_t i = 0; i < r->nset; i++) {
        dt_sbuf_str_(b, "<tr><td>");
        rpt_put_html(b, r->set[i].key);
        dt_sbuf_str_(b, "</td><td class=\"text\">");
        rpt_put_html(b, r->set[i].val);
        dt_sbuf_str_(b, "</td></tr>\n");
    }
    dt_sbuf_str_(b, "</table>\n");
}

/* The best validation loss of a run, NULL when it has none. */
static const rpt_val *best_val(const rpt_run *r) {
    const rpt_val *best = NULL;
    for (size_t i = 0; i < r->nval; i++)
        if (isfinite(r->val[i].loss) && (!best || r->val[i].loss < best->loss)) best = &r->val[i];
    return best;
}

static void summary_row(dt_sbuf *b, const rpt_run *r, int k) {
    const rpt_step *last = &r->step[r->nstep - 1];
    const rpt_val *bv = best_val(r);
    char thr[32] = "-", mfu[32] = "-", t[32] = "-";
    dt_sbuf_printf_(b, "<tr><td class=\"text\"><span class=\"sw\" style=\"border-color:%s;background:%s\"></span>",
                    file_colour[k], file_colour[k]);
    rpt_put_html(b, r->label);
    dt_sbuf_printf_(b, "</td><td>%d</td><td>%lld</td><td>%zu</td><td class=\"final-loss\">%s</td>", r->world,
                    (long long)last->step, r->nstep, last->loss_text);
    if (bv) dt_sbuf_printf_(b, "<td class=\"best-val\">%s (step %lld)</td>", bv->loss_text, (long long)bv->step);
    else dt_sbuf_str_(b, "<td class=\"best-val\">-</td>");
    if (last->thr >= 0) fmt_value(thr, sizeof thr, last->thr);
    if (last->mfu >= 0) snprintf(mfu, sizeof mfu, "%.2f %%", last->mfu);
    if (last->elapsed >= 0) snprintf(t, sizeof t, "%.1f s", last->elapsed);
    dt_sbuf_printf_(b, "<td>%s%s</td><td>%s</td><td>%s</td></tr>\n", thr, last->thr >= 0 ? (r->tokens ? " tokens/s" : " samples/s") : "",
                    mfu, t);
}

static void section_summary(dt_sbuf *b, const rpt_run *runs, int n) {
    dt_sbuf_str_(b, "<h2>Summary</h2>\n<table class=\"summary\"><tr><th>run</th><th>processes</th><th>last step</th>"
                    "<th>steps logged</th><th>final loss</th><th>best validation loss</th><th>throughput</th>"
                    "<th>MFU</th><th>time</th></tr>\n");
    for (int k = 0; k < n; k++) summary_row(b, &runs[k], k);
    dt_sbuf_str_(b, "</table>\n<p class=\"caption\">Throughput, MFU and time as the last logged step states them "
                    "(the job's rate so far).</p>\n");
    for (int k = 0; k < n; k++) {
        dt_sbuf_printf_(b, "<p class=\"file\"><span class=\"sw\" style=\"border-color:%s;background:%s\"></span>",
                        file_colour[k], file_colour[k]);
        if (strcmp(runs[k].label, runs[k].path)) {
            rpt_put_html(b, runs[k].label);
            dt_sbuf_str_(b, ": ");
        }
        rpt_put_html(b, runs[k].path);
        if (runs[k].runs > 1) dt_sbuf_printf_(b, " (the last of its %d runs)", runs[k].runs);
        if (runs[k].skipped) dt_sbuf_printf_(b, " (%ld lines skipped: not metrics events)", runs[k].skipped);
        dt_sbuf_str_(b, "</p>\n");
    }
}

/* ---- the data block ------------------------------------------------------------------ */

static void json_ranks(dt_sbuf *b, const rpt_run *r) {
    size_t first = 0, slow = r->nrank ? last_ranks(r, &first) : 0;
    double ms[4];
    dt_sbuf_str_(b, ",\"ranks\":[");
    for (size_t q = first; q < r->nrank; q++) {
        const rpt_rank *x = &r->rank[q];
        rank_parts(x, ms);
        dt_sbuf_printf_(b, "%s{\"rank\":%d,\"stage\":%d,\"step\":%lld,\"steps\":", q > first ? "," : "", x->rank, x->stage,
                        (long long)x->step);
        put_num(b, x->steps);
        const char *key[4] = {"compute_ms", "comm_ms", "data_ms", "rest_ms"};
        for (int p = 0; p < 4; p++) {
            dt_sbuf_printf_(b, ",\"%s\":", key[p]);
            put_num(b, ms[p]);
        }
        dt_sbuf_str_(b, "}");
    }
    if (r->nrank > first + 1) dt_sbuf_printf_(b, "],\"slowest\":%d", r->rank[slow].rank);
    else dt_sbuf_str_(b, "],\"slowest\":null");
}

/* Rank 0's figures at every step they were reported, and each other rank's last. */
static void json_memory(dt_sbuf *b, const rpt_run *r) {
    const rpt_mem **last;
    int ranks = mem_last(b, r, &last), first = 1;
    dt_sbuf_str_(b, ",\"memory\":[");
    for (size_t i = 0; i < r->nmem; i++) {
        const rpt_mem *m = &r->mem[i];
        if (m->rank != 0 && (m->rank >= ranks || last[m->rank] != m)) continue;
        dt_sbuf_printf_(b, "%s{\"step\":%lld,\"rank\":%d", first ? "" : ",", (long long)m->step, m->rank);
        first = 0;
        for (int w = 0; w < 1 + m->has_peak; w++) {
            dt_sbuf_str_(b, w ? ",\"peak_mib\":{" : ",\"mib\":{");
            for (int k = 0; k < RPT_NMEM; k++) {
                dt_sbuf_printf_(b, "%s\"%s\":", k ? "," : "", dt_mem_cat_name(k));
                put_num(b, MIB(w ? m->peak[k] : m->cur[k]));
            }
            dt_sbuf_str_(b, "}");
        }
        dt_sbuf_str_(b, "}");
    }
    free(last);
    dt_sbuf_str_(b, "]");
}

/* A list of the steps' figures: which 0 step, 1 loss (as printed), 2 throughput, 3 MFU. */
static void json_steps(dt_sbuf *b, const char *key, const rpt_run *r, int which) {
    dt_sbuf_printf_(b, ",\"%s\":[", key);
    for (size_t i = 0; i < r->nstep; i++) {
        const rpt_step *s = &r->step[i];
        if (i) dt_sbuf_str_(b, ",");
        if (which == 0) dt_sbuf_printf_(b, "%lld", (long long)s->step);
        else if (which == 1) dt_sbuf_str_(b, s->loss_text);          /* a JSON number: jsonl.c checked it */
        else put_num(b, which == 2 ? (s->thr >= 0 ? s->thr : NAN) : (s->mfu >= 0 ? s->mfu : NAN));
    }
    dt_sbuf_str_(b, "]");
}

static void json_run(dt_sbuf *b, const rpt_run *r) {
    dt_sbuf_str_(b, "{\"label\":");
    put_json(b, r->label);
    dt_sbuf_str_(b, ",\"path\":");
    put_json(b, r->path);
    dt_sbuf_printf_(b, ",\"runs\":%d,\"skipped\":%ld,\"world_size\":%d,\"unit\":\"%s\"", r->runs, r->skipped, r->world,
                    r->tokens ? "tokens/s" : "samples/s");
    json_steps(b, "step", r, 0);
    json_steps(b, "loss", r, 1);
    json_steps(b, "throughput", r, 2);
    json_steps(b, "mfu", r, 3);
    dt_sbuf_str_(b, ",\"val_step\":[");
    for (size_t i = 0; i < r->nval; i++) dt_sbuf_printf_(b, "%s%lld", i ? "," : "", (long long)r->val[i].step);
    dt_sbuf_str_(b, "],\"val_loss\":[");
    for (size_t i = 0; i < r->nval; i++) dt_sbuf_printf_(b, "%s%s", i ? "," : "", r->val[i].loss_text);
    dt_sbuf_str_(b, "]");
    json_ranks(b, r);
    json_memory(b, r);
    dt_sbuf_str_(b, ",\"settings\":{");
    for (size_t i = 0; i < r->nset; i++) {
        if (i) dt_sbuf_str_(b, ",");
        put_json(b, r->set[i].key);
        dt_sbuf_str_(b, ":");
        put_json(b, r->set[i].val);
    }
    dt_sbuf_str_(b, "}}");
}

/* ---- the page ------------------------------------------------------------------------ */

static const char page_style[] =
    "body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,'DejaVu Sans',Arial,sans-serif;color:#222;"
    "background:#fff;max-width:980px;margin:0 auto;padding:8px 14px 40px;font-size:14px;line-height:1.4}\n"
    "h1{font-size:22px;margin:10px 0 4px}h2{font-size:18px;margin:26px 0 6px;border-bottom:1px solid #ddd}"
    "h3{font-size:15px;margin:18px 0 4px}\n"
    "svg.chart{display:block;width:100%;height:auto;margin:2px 0 4px}\n"
    "svg .bg{fill:#fff}svg .frame{fill:none;stroke:#888;stroke-width:1}svg .grid{stroke:#e6e6e6;stroke-width:1}\n"
    "svg text{font-family:inherit}svg .tick{font-size:12px;fill:#444}svg .label{font-size:13px;fill:#222}\n"
    "svg .mark{font-size:12px;fill:#000;font-weight:bold}\n"
    "svg polyline{fill:none;stroke-width:1.8;stroke-linejoin:round}svg polyline.val{stroke-width:1.5;stroke-dasharray:6 4}\n"
    "svg polyline.mfu{stroke-width:1.3;stroke-dasharray:3 3}svg polyline.peak{stroke:#222;stroke-width:1.5;"
    "stroke-dasharray:6 4}\n"
    "svg .dot{stroke:#fff;stroke-width:1}svg .mem{stroke:#fff;stroke-width:.5}"
    "svg .slowest{fill:none;stroke:#000;stroke-width:2}\n"
    ".legend{font-size:13px;margin:4px 0}.legend .item{display:inline-block;margin-right:16px}\n"
    ".sw{display:inline-block;width:18px;height:0;border-top:4px solid;vertical-align:middle;margin-right:5px}\n"
    ".sw.dash{border-top-style:dashed}\n"
    "table{border-collapse:collapse;font-size:13px;margin:4px 0}th,td{border:1px solid #ddd;padding:3px 8px;"
    "text-align:right}th{background:#f5f5f5}td.text,td:first-child{text-align:left;word-break:break-all}\n"
    ".note{color:#666;font-style:italic;margin:4px 0}.caption,.file{color:#555;font-size:12px;margin:2px 0;"
    "word-break:break-all}\n";

static void page_head(dt_sbuf *b, const char *title) {
    dt_sbuf_str_(b, "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
                    "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<title>");
    rpt_put_html(b, title);
    dt_sbuf_printf_(b, "</title>\n<style>\n%s</style>\n</head>\n<body>\n<h1>", page_style);
    rpt_put_html(b, title);
    dt_sbuf_str_(b, "</h1>\n");
}

void rpt_html(dt_sbuf *b, const rpt_run *runs, int n, const char *title) {
    page_head(b, title);
    section_summary(b, runs, n);
    section_loss(b, runs, n);
    section_throughput(b, runs, n);
    for (int k = 0; k < n; k++) {
        dt_sbuf_printf_(b, "<h2 class=\"run\"><span class=\"sw\" style=\"border-color:%s;background:%s\"></span>",
                        file_colour[k], file_colour[k]);
        rpt_put_html(b, runs[k].label);
        dt_sbuf_str_(b, "</h2>\n");
        section_ranks(b, &runs[k], k);
        section_memory(b, &runs[k], k);
        section_settings(b, &runs[k]);
    }
    dt_sbuf_str_(b, "<script type=\"application/json\" id=\"dtrain-report-data\">{\"files\":[");
    for (int k = 0; k < n; k++) {
        if (k) dt_sbuf_str_(b, ",\n");
        json_run(b, &runs[k]);
    }
    dt_sbuf_str_(b, "]}</script>\n</body>\n</html>\n");
}
