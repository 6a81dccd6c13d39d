/*
 * peak.c: one process's GEMM peak and its cache file (peak.h).
 *
 * The cache is text, a line per key: "<GFLOP/s> <YYYY-MM-DD> <key>". Lines that do not
 * parse are dropped when the file is written again; the file is read up to 64 KiB and
 * replaced atomically (fileio.h), so two runs that write at once leave one of their
 * versions, each complete.
 */
#include "peak.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "amp.h"
#include "clock.h"
#include "fileio.h"
#include "sbuf.h"

#define CACHE_MAX (64 * 1024)

/* "AMD EPYC 9R45" from /proc/cpuinfo's model name (or the Arm CPU part), "" if none */
static void cpu_name(char *buf, size_t n) {
    buf[0] = '\0';
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) != 0 && strncmp(line, "CPU part", 8) != 0) continue;
        const char *v = strchr(line, ':');
        if (!v) continue;
        for (v++; *v == ' ' || *v == '\t'; v++) {}
        snprintf(buf, n, "%s", v);
        buf[strcspn(buf, "\n")] = '\0';
        break;
    }
    fclose(f);
    for (char *c = buf; *c; c++)
        if (*c == ';' || (unsigned char)*c < 0x20) *c = ' ';   /* the key's separator, control bytes */
}

static void cache_path(char *buf, size_t n) {
    buf[0] = '\0';
    const char *e = getenv("DT_PEAK_CACHE"), *x = getenv("XDG_CACHE_HOME"), *h = getenv("HOME");
    if (e) {
        if (*e && strcmp(e, "off") != 0) snprintf(buf, n, "%s", e);
    } else if (x && *x == '/') {
        snprintf(buf, n, "%s/dtrain/peak", x);
    } else if (h && *h == '/') {
        snprintf(buf, n, "%s/.cache/dtrain/peak", h);
    }
}

/* The cache's text (NUL-terminated, NULL when there is none or it cannot be read). */
static char *cache_read(const char *path) {
    FILE *f = NULL;
    if (!*path || dt_file_fopen_read(path, &f) != DT_OK) {
        dt_error_clear();
        return NULL;
    }
    char *text = malloc(CACHE_MAX + 1);
    size_t got = text ? fread(text, 1, CACHE_MAX, f) : 0;
    fclose(f);
    if (text) text[got] = '\0';
    return text;
}

int dt_peak_parse_line(const char *line, size_t len, double *g, char date[11], const char **key, size_t *klen) {
    char buf[512];
    if (len >= sizeof buf) return 0;
    memcpy(buf, line, len);
    buf[len] = '\0';
    char *end = NULL;
    errno = 0;
    double v = strtod(buf, &end);
    if (errno || end == buf || *end != ' ' || !(v > 0 && v < 1e9)) return 0;
    const char *d = end + 1;
    int y, m, dd, used = 0;
    if (sscanf(d, "%4d-%2d-%2d %n", &y, &m, &dd, &used) != 3 || used != 11 || m < 1 || m > 12 || dd < 1 || dd > 31)
        return 0;
    memcpy(date, d, 10);
    date[10] = '\0';
    *g = v;
    *key = line + (d - buf) + 11;
    *klen = len - (size_t)(d - buf) - 11;
    return *klen > 0;
}

/* The cached line for key: its rate and date; 0 when there is none. */
static int cache_find(const char *text, const char *key, double *g, char date[11]) {
    size_t kl = strlen(key);
    for (const char *l = text; l && *l;) {
        const char *nl = strchr(l, '\n');
        size_t len = nl ? (size_t)(nl - l) : strlen(l);
        const char *k;
        size_t klen;
        if (dt_peak_parse_line(l, len, g, date, &k, &klen) && klen == kl && !memcmp(k, key, kl)) return 1;
        l = nl ? nl + 1 : NULL;
    }
    return 0;
}

static int mkdirs(const char *path) {   /* the directories above the file path */
    char d[1024];
    snprintf(d, sizeof d, "%s", path);
    for (char *s = d + 1; *s; s++) {
        if (*s != '/') continue;
        *s = '\0';
        if (mkdir(d, 0700) != 0 && errno != EEXIST) return -1;
        *s = '/';
    }
    return 0;
}

/* Write key's line (the other valid lines kept); a warning when it cannot. */
static void cache_store(const dt_peak *p) {
    if (!*p->path) return;
    char *old = cache_read(p->path);
    dt_sbuf b = {0};
    for (const char *l = old; l && *l;) {
        const char *nl = strchr(l, '\n');
        size_t len = nl ? (size_t)(nl - l) : strlen(l);
        double g;
        char date[11];
        const char *k;
        size_t klen;
        if (dt_peak_parse_line(l, len, &g, date, &k, &klen) && !(klen == strlen(p->key) && !memcmp(k, p->key, klen)))
            dt_sbuf_printf_(&b, "%.*s\n", (int)len, l);
        l = nl ? nl + 1 : NULL;
    }
    free(old);
    time_t now = time(NULL);
    struct tm tm;
    char date[16] = "1970-01-01";
    if (gmtime_r(&now, &tm)) strftime(date, sizeof date, "%Y-%m-%d", &tm);
    dt_sbuf_printf_(&b, "%.1f %s %s\n", p->gflops, date, p->key);
    dt_status s = b.oom ? dt_error(DT_ERR_NOMEM, "out of memory")
                        : mkdirs(p->path) != 0 ? dt_error(DT_ERR_IO, "cannot make its directory: %s", strerror(errno))
                                              : dt_write_atomic(p->path, b.p, b.len);
    if (s != DT_OK) {
        fprintf(stderr, "dtrain: warning: MFU's peak is not cached in %s (%s); DT_PEAK_CACHE=off skips the cache\n",
                p->path, dt_last_error());
        dt_error_clear();
    }
    dt_sbuf_free_(&b);
}

/* The best rate of n^3 products on `ops` over at least min_s seconds and 3 products (at
 * most 1000), after one to warm up; *fastest (if given) gets the fastest product's
 * seconds. */
static double measure_n(const dt_ops *ops, int lp, int n, double min_s, double *fastest) {
    float *a = NULL, *c = NULL;
    double best = 0.0, quick = 0.0;
    if (fastest) *fastest = 0.0;
    if (ops->alloc((void **)&a, (size_t)n * n * sizeof(float)) != DT_OK ||
        ops->alloc((void **)&c, (size_t)n * n * sizeof(float)) != DT_OK || ops->fill(a, 0.5f, (size_t)n * n) != DT_OK) {
        ops->free(a);
        dt_error_clear();
        return 0.0;
    }
    double start = 0.0;
    for (int r = 0; r <= 1000; r++) {
        double t0 = dt_now();
        dt_status st = lp ? ops->gemm_lp(lp, 0, 0, n, n, n, 1.0f, a, n, a, n, 0.0f, c, n)
                          : ops->sgemm(0, 0, n, n, n, 1.0f, a, n, a, n, 0.0f, c, n);
        if (st != DT_OK || ops->synchronize() != DT_OK) break;
        double t1 = dt_now(), g = 2.0 * n * n * (double)n / (t1 - t0) / 1e9;
        if (r == 0) start = t1;
        else if (t1 > t0 && g > best) { best = g; quick = t1 - t0; }
        if (r >= 3 && t1 - start >= min_s) break;
    }
    ops->free(a);
    ops->free(c);
    dt_error_clear();
    if (fastest) *fastest = quick;
    return best;
}

/* One process's peak: the best rate of 1024^3 products for a second on a CPU. On a GPU a
 * 1024^3 product (2 GFLOP, microseconds there) times the launch and the synchronisation
 * more than the arithmetic: on an H200 it gave a bf16 peak of about 88 TFLOP/s and
 * gpt2's MFU read 66 %. There the size doubles, after a few products at each, while one
 * product takes under 5 ms, up to 8192^3; the second is measured at the size reached
 * (an emulated GPU, whose 1024^3 product takes tens of milliseconds, stays at 1024). */
static double measure(const dt_ops *ops, int lp) {
    int n = 1024;
    double t = 0.0;
    while (!ops->host_memory && n < 8192 && measure_n(ops, lp, n, 0.0, &t) > 0 && t < 0.005) n *= 2;
    return measure_n(ops, lp, n, 1.0, NULL);
}

void dt_peak_get(const dt_ops *ops, int dtype, int threads, dt_peak *p) {
    char cpu[160];
    cpu_name(cpu, sizeof cpu);
    snprintf(p->key, sizeof p->key, "cpu=%s;gemm=%s;precision=%s;threads=%d", *cpu ? cpu : "unknown",
             dt_ops_gemm_name(ops, dtype), dt_precision_name((dt_dtype)dtype), threads);
    p->given = 0;
    /* a GPU's model is not in the key: its peak is measured at every start */
    if (ops->host_memory) cache_path(p->path, sizeof p->path);
    else p->path[0] = '\0';
    char *text = cache_read(p->path);
    char date[11];
    double g = 0.0;
    int hit = text && cache_find(text, p->key, &g, date);
    free(text);
    if (hit) {
        p->gflops = g;
        snprintf(p->source, sizeof p->source, "measured %s", date);
        return;
    }
    p->gflops = measure(ops, dtype == DT_F32 ? 0 : dtype);
    snprintf(p->source, sizeof p->source, "measured now");
    if (p->gflops > 0) cache_store(p);
}

void dt_peak_raise(dt_peak *p, double gflops) {
    if (!(gflops > p->gflops)) return;
    p->gflops = gflops;
    p->raised = 1;
    snprintf(p->source, sizeof p->source, "the rate this run reached");
}

void dt_peak_keep(dt_peak *p) {
    if (p->raised && !p->given) cache_store(p);
    p->raised = 0;
}
