/*
 * plot.c: `dtrain plot` draws the per-step loss of one or more runs on one chart,
 * so a user sees that the 1-process and the N-process curves lie on top of each
 * other. The metrics files are read by tool_util.c.
 *
 *   dtrain plot np1.jsonl np2.jsonl -o loss.png     a PNG, through gnuplot
 *   dtrain plot --text 1proc=np1.jsonl np2.jsonl    an ASCII chart on stdout
 *
 * The PNG is drawn by gnuplot (Debian: gnuplot-nox) from a script and data files
 * written to a temporary directory: gnuplot draws better charts than anything
 * we would write here, and is one package away. The text chart needs nothing and
 * works over ssh. Identical curves must stay visible as identical: the PNG draws
 * the first run solid and wide and the others dashed and thin on top of it; the
 * text chart marks a cell that several runs share with '#'.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "args.h"
#include "tool_util.h"
#include "tools.h"

static const char *usage_plot =
    "usage: dtrain plot [flags] [LABEL=]METRICS.jsonl... (-o loss.png | --text)\n"
    "\n"
    "Draws the loss of every step of one or more runs on one chart, one line per\n"
    "file, so the curves of a 1-process and an N-process run can be seen to lie on\n"
    "top of each other. The files are what `dtrain train --metrics FILE` writes\n"
    "(use --log-every 1 for every step); a file appended to by several runs is\n"
    "plotted from its last run. The legend is the file name, or LABEL when an\n"
    "argument reads LABEL=PATH.\n"
    "\n"
    "  -o, --output FILE   write a PNG (needs gnuplot: Debian package gnuplot-nox;\n"
    "                      $GNUPLOT names another gnuplot program)\n"
    "  --text              print an ASCII chart on stdout (no gnuplot needed);\n"
    "                      '#' marks a cell where several runs coincide\n"
    "  --val               draw the validation loss instead (the points of --eval-every\n"
    "                      and of each epoch's evaluation)\n"
    "  --title TEXT        chart title  [loss per step, or validation loss]\n"
    "  --width N           PNG pixels or text columns  [960 / 72]\n"
    "  --height N          PNG pixels or text rows  [540 / 20]\n"
    "\n"
    "Exit status: 0 done, 2 bad flags or files, 1 gnuplot missing or failed.\n";

#define PLOT_MAX_SERIES 16

/* ---- the series to draw ------------------------------------------------------------- */

typedef struct {
    const char  *label;   /* points into argv or the label buffer */
    const char  *path;
    char         label_buf[256];
    dt_step_rec *recs;
    size_t       n;
} series;

/* "LABEL=PATH" when the argument is not itself an existing file and has a label. */
static void series_name(series *sr, const char *arg) {
    const char *eq = strchr(arg, '=');
    sr->path = arg;
    sr->label = arg;
    if (eq && eq != arg && access(arg, F_OK) != 0) {
        size_t ll = (size_t)(eq - arg);
        if (ll >= sizeof sr->label_buf) ll = sizeof sr->label_buf - 1;
        memcpy(sr->label_buf, arg, ll);
        sr->label_buf[ll] = '\0';
        sr->label = sr->label_buf;
        sr->path = eq + 1;
    } else {
        const char *slash = strrchr(arg, '/');
        if (slash && slash[1]) sr->label = slash + 1;
    }
}

/* ---- text chart --------------------------------------------------------------------- */

static const char text_marks[] = "*+ox%@&=~^$!?<>:";

static void plot_text(const series *sr, int ns, int width, int height, const char *title) {
    double ymin = INFINITY, ymax = -INFINITY;
    int64_t xmin = INT64_MAX, xmax = INT64_MIN;
    for (int k = 0; k < ns; k++)
        for (size_t i = 0; i < sr[k].n; i++) {
            const dt_step_rec *r = &sr[k].recs[i];
            if (r->step < xmin) xmin = r->step;
            if (r->step > xmax) xmax = r->step;
            if (!isfinite(r->loss)) continue;
            if (r->loss < ymin) ymin = r->loss;
            if (r->loss > ymax) ymax = r->loss;
        }
    if (!(ymin <= ymax)) ymin = 0, ymax = 1;  /* every loss non-finite */
    if (ymax == ymin) {
        double pad = fabs(ymin) > 0 ? 0.5 * fabs(ymin) : 1.0;
        ymin -= pad;
        ymax += pad;
    }
    /* cells hold a bitmask of the series that pass through them: (height, width) */
    unsigned *cell = calloc((size_t)width * (size_t)height, sizeof *cell);
    if (!cell) {
        fputs("dtrain plot: out of memory for the text chart\n", stderr);
        return;
    }
    for (int k = 0; k < ns; k++)
        for (size_t i = 0; i < sr[k].n; i++) {
            const dt_step_rec *r = &sr[k].recs[i];
            if (!isfinite(r->loss)) continue;
            int col = xmax > xmin ? (int)llround((double)(r->step - xmin) / (double)(xmax - xmin) * (width - 1)) : 0;
            int row = (int)llround((ymax - r->loss) / (ymax - ymin) * (height - 1));
            cell[(size_t)row * (size_t)width + (size_t)col] |= 1u << k;
        }
    printf("%s\n", title);
    for (int row = 0; row < height; row++) {
        double y = ymax - (ymax - ymin) * row / (height - 1);
        if (row == 0 || row == height - 1 || row == (height - 1) / 2) printf("%10.4g |", y);
        else printf("%10s |", "");
        int last = -1;
        for (int c = 0; c < width; c++)
            if (cell[(size_t)row * (size_t)width + (size_t)c]) last = c;
        for (int c = 0; c <= last; c++) {
            unsigned m = cell[(size_t)row * (size_t)width + (size_t)c];
            char ch = ' ';
            if (m && (m & (m - 1))) ch = '#';
            else if (m) ch = text_marks[__builtin_ctz(m)];
            putchar(ch);
        }
        putchar('\n');
    }
    printf("%10s +", "");
    for (int c = 0; c < width; c++) putchar('-');
    putchar('\n');
    char lo[32], hi[32];
    snprintf(lo, sizeof lo, "%lld", (long long)xmin);
    snprintf(hi, sizeof hi, "%lld", (long long)xmax);
    int gap = width - (int)strlen(lo) - (int)strlen(hi);
    printf("%10s  %s%*s%s  step\n", "", lo, gap > 1 ? gap : 1, "", hi);
    for (int k = 0; k < ns; k++)
        printf("  %c %s (%zu step%s)\n", text_marks[k], sr[k].label, sr[k].n, sr[k].n == 1 ? "" : "s");
    if (ns > 1) printf("  # several runs on the same point\n");
    free(cell);
}

/* ---- PNG through gnuplot -------------------------------------------------------------- */

/* The gnuplot program: $GNUPLOT, else `gnuplot` on $PATH; NULL when absent. */
static char *find_gnuplot(void) {
    const char *g = getenv("GNUPLOT");
    if (g && *g) return access(g, X_OK) == 0 ? strdup(g) : NULL;
    const char *path = getenv("PATH");
    if (!path || !*path) path = "/usr/local/bin:/usr/bin:/bin";
    while (*path) {
        size_t len = strcspn(path, ":");
        char buf[4096];
        if (len > 0 && len + sizeof "/gnuplot" < sizeof buf) {
            memcpy(buf, path, len);
            strcpy(buf + len, "/gnuplot");
            if (access(buf, X_OK) == 0) return strdup(buf);
        }
        path += len;
        if (*path == ':') path++;
    }
    return NULL;
}

/* s as a gnuplot single-quoted string (a quote is doubled). */
static void put_quoted(FILE *f, const char *s) {
    fputc('\'', f);
    for (; *s; s++) {
        if (*s == '\'') fputc('\'', f);
        if (*s != '\n') fputc(*s, f);
    }
    fputc('\'', f);
}

static void rm_tree(const char *dir, int ns) {
    char p[4200];
    for (int k = 0; k < ns; k++) {
        snprintf(p, sizeof p, "%s/series%d.dat", dir, k);
        unlink(p);
    }
    snprintf(p, sizeof p, "%s/plot.gp", dir);
    unlink(p);
    snprintf(p, sizeof p, "%s/gnuplot.log", dir);
    unlink(p);
    rmdir(dir);
}

static int plot_png(const series *sr, int ns, const char *out, int width, int height, const char *title) {
    char *gp = find_gnuplot();
    if (!gp) {
        fprintf(stderr, "dtrain plot: gnuplot not found%s (install the Debian package gnuplot-nox, "
                        "or use --text for a chart without it)\n",
                getenv("GNUPLOT") && *getenv("GNUPLOT") ? " at $GNUPLOT" : " on $PATH");
        return 1;
    }
    const char *tmp = getenv("TMPDIR");
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/dtrain-plot-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) {
        fprintf(stderr, "dtrain plot: cannot create a temporary directory in %s (%s)\n", tmp && *tmp ? tmp : "/tmp",
                strerror(errno));
        free(gp);
        return 1;
    }
    int rc = 1;
    char p[4200], script[4200], log[4200];
    size_t finite[PLOT_MAX_SERIES] = {0};
    for (int k = 0; k < ns; k++) {
        snprintf(p, sizeof p, "%s/series%d.dat", dir, k);
        FILE *f = fopen(p, "w");
        if (!f) { fprintf(stderr, "dtrain plot: cannot write %s (%s)\n", p, strerror(errno)); goto out; }
        for (size_t i = 0; i < sr[k].n; i++)
            if (isfinite(sr[k].recs[i].loss)) {
                fprintf(f, "%lld %s\n", (long long)sr[k].recs[i].step, sr[k].recs[i].loss_text);
                finite[k]++;
            }
        if (fclose(f) != 0) { fprintf(stderr, "dtrain plot: cannot write %s (%s)\n", p, strerror(errno)); goto out; }
    }
    snprintf(script, sizeof script, "%s/plot.gp", dir);
    FILE *f = fopen(script, "w");
    if (!f) { fprintf(stderr, "dtrain plot: cannot write %s (%s)\n", script, strerror(errno)); goto out; }
    /* pngcairo draws anti-aliased lines; the plain png terminal is the fallback */
    fprintf(f, "if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) {\n"
               "  set terminal pngcairo size %d,%d noenhanced font 'sans,11'\n"
               "} else {\n"
               "  set terminal png size %d,%d noenhanced\n"
               "}\n",
            width, height, width, height);
    fputs("set output ", f);
    put_quoted(f, out);
    fputs("\nset title ", f);
    put_quoted(f, title);
    fputs("\nset xlabel 'step'\nset ylabel 'loss'\nset grid\nset key top right box opaque\n"
          "set offsets graph 0.02, graph 0.02, 0, 0\n"
          "set style line 1 lc rgb '#1f77b4' lw 5\n"
          "set style line 2 lc rgb '#d62728' lw 2 dt 2\n"
          "set style line 3 lc rgb '#2ca02c' lw 2 dt 3\n"
          "set style line 4 lc rgb '#ff7f0e' lw 2 dt 4\n"
          "set style line 5 lc rgb '#9467bd' lw 2 dt 5\n"
          "plot ", f);
    for (int k = 0; k < ns; k++) {
        snprintf(p, sizeof p, "%s/series%d.dat", dir, k);
        if (k) fputs(", \\\n     ", f);
        put_quoted(f, p);
        /* a single point makes no line: draw it as a point */
        fprintf(f, " using 1:2 with %s ls %d title ", finite[k] > 1 ? "lines" : "linespoints", k % 5 + 1);
        put_quoted(f, sr[k].label);
    }
    fputc('\n', f);
    if (fclose(f) != 0) { fprintf(stderr, "dtrain plot: cannot write %s (%s)\n", script, strerror(errno)); goto out; }

    snprintf(log, sizeof log, "%s/gnuplot.log", dir);
    char *argv[] = {gp, script, NULL};
    int timed_out = 0;
    int st = dt_tool_run(argv, log, 60.0, &timed_out);
    if (st != 0) {
        char last[512];
        dt_tool_last_line(log, last, sizeof last);
        if (st < 0) fprintf(stderr, "dtrain plot: %s\n", dt_last_error());
        else if (timed_out) fprintf(stderr, "dtrain plot: %s did not finish in 60 s\n", gp);
        else fprintf(stderr, "dtrain plot: %s failed (exit %d)%s%s\n", gp, st, last[0] ? ": " : "", last);
        goto out;
    }
    /* gnuplot can exit 0 without writing (a terminal it lacks): check the file */
    unsigned char magic[8];
    FILE *png = fopen(out, "rb");
    size_t got = png ? fread(magic, 1, sizeof magic, png) : 0;
    if (png) fclose(png);
    if (got != 8 || memcmp(magic, "\x89PNG\r\n\x1a\n", 8) != 0) {
        fprintf(stderr, "dtrain plot: %s did not write a PNG to %s\n", gp, out);
        goto out;
    }
    printf("dtrain plot: wrote %s (%d run%s)\n", out, ns, ns == 1 ? "" : "s");
    rc = 0;
out:
    rm_tree(dir, ns);
    free(gp);
    return rc;
}

/* ---- main ------------------------------------------------------------------------------ */

static int bad(const char *msg) {
    fprintf(stderr, "dtrain plot: %s\n", msg);
    return 2;
}

int dtrain_plot_main(int argc, char **argv) {
    const char *out = NULL, *title = "loss per step";
    int text = 0, ns = 0, val = 0, title_given = 0;
    int64_t width = 0, height = 0;
    series sr[PLOT_MAX_SERIES];
    dt_status s = DT_OK;
    memset(sr, 0, sizeof sr);
    for (int i = 1; i < argc && s == DT_OK;) {
        const char *v = NULL, *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { fputs(usage_plot, stdout); return 0; }
        if (!strcmp(a, "--text")) { text = 1; i++; continue; }
        if (!strcmp(a, "--val")) { val = 1; if (!title_given) title = "validation loss"; i++; continue; }
        if (dt_arg_match("-o", argc, argv, &i, &v, &s) || dt_arg_match("--output", argc, argv, &i, &v, &s)) out = v;
        else if (dt_arg_match("--title", argc, argv, &i, &v, &s)) { title = v; title_given = 1; }
        else if (dt_arg_match("--width", argc, argv, &i, &v, &s)) { if (s == DT_OK) s = dt_arg_int("--width", v, 16, 8192, 0, &width); }
        else if (dt_arg_match("--height", argc, argv, &i, &v, &s)) { if (s == DT_OK) s = dt_arg_int("--height", v, 4, 8192, 0, &height); }
        else if (a[0] == '-' && a[1]) s = dt_error(DT_ERR_INVALID, "unknown flag '%s' (see dtrain plot --help)", a);
        else if (ns == PLOT_MAX_SERIES) s = dt_error(DT_ERR_INVALID, "at most %d metrics files on one chart", PLOT_MAX_SERIES);
        else series_name(&sr[ns++], argv[i++]);
    }
    if (s != DT_OK) return bad(dt_last_error());
    if (ns == 0) return bad("expected one or more metrics files (see dtrain plot --help)");
    if (!out && !text) return bad("-o: required (the PNG to write), or --text for a chart on the terminal");
    int rc = 0;
    for (int k = 0; k < ns && rc == 0; k++) {
        int runs = 0;
        if ((s = (val ? dt_tool_read_validation : dt_tool_read_steps)(sr[k].path, &sr[k].recs, &sr[k].n, &runs)) != DT_OK) {
            rc = bad(dt_last_error());
        } else if (sr[k].n == 0) {
            if (val)
                fprintf(stderr, "dtrain plot: %s: no validation lines (write them with dtrain train --metrics FILE "
                                "--eval-every N)\n", sr[k].path);
            else
                fprintf(stderr, "dtrain plot: %s: no step lines (write them with dtrain train --metrics FILE "
                                "--log-every N)\n", sr[k].path);
            rc = 2;
        } else if (runs > 1) {
            fprintf(stderr, "dtrain plot: %s holds %d runs (metrics files are appended to); plotting the last\n",
                    sr[k].path, runs);
        }
    }
    if (rc == 0 && text) plot_text(sr, ns, width ? (int)width : 72, height ? (int)height : 20, title);
    if (rc == 0 && out) rc = plot_png(sr, ns, out, width ? (int)width : 960, height ? (int)height : 540, title);
    for (int k = 0; k < ns; k++) free(sr[k].recs);
    return rc;
}
