/*
 * mem.c: the memory accounting of one process (see mem.h).
 *
 * A registry of the live allocations (pointer, bytes, category, host or device)
 * lets dt_mem_free find what it frees; it is a plain array searched from the
 * newest entry, as a model holds a few hundred buffers and frees them at the end
 * (or frees the newest first, as evaluation's buffers). One mutex guards the
 * registry and the counts.
 */
#include "mem.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    void      *p;
    size_t     bytes;
    dt_mem_cat cat;
    int        host;
} mem_entry;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static size_t cur[DT_MEM_NCAT + 1], peak[DT_MEM_NCAT + 1];
static size_t at_peak[DT_MEM_NCAT + 1];   /* the counts when the total last peaked */
static size_t limit;                      /* dt_mem_set_limit; 0: none */
static mem_entry *reg;
static size_t nreg, capreg;

static const char *const names[DT_MEM_NCAT + 1] = {
#define DT_MEM_NAME_(K, name, what) [DT_MEM_##K] = name,
    DT_MEM_CATEGORIES(DT_MEM_NAME_)
#undef DT_MEM_NAME_
    [DT_MEM_TOTAL] = "total",
};

static const char *const helps[DT_MEM_NCAT + 1] = {
#define DT_MEM_HELP_(K, name, what) [DT_MEM_##K] = what,
    DT_MEM_CATEGORIES(DT_MEM_HELP_)
#undef DT_MEM_HELP_
    [DT_MEM_TOTAL] = "everything above",
};

const char *dt_mem_cat_name(int cat) { return cat >= 0 && cat <= DT_MEM_TOTAL ? names[cat] : "?"; }
const char *dt_mem_cat_help(int cat) { return cat >= 0 && cat <= DT_MEM_TOTAL ? helps[cat] : "?"; }

/* with mu held */
static void count_add(dt_mem_cat cat, size_t bytes) {
    cur[cat] += bytes;
    cur[DT_MEM_TOTAL] += bytes;
    if (cur[cat] > peak[cat]) peak[cat] = cur[cat];
    if (cur[DT_MEM_TOTAL] > peak[DT_MEM_TOTAL]) {
        peak[DT_MEM_TOTAL] = cur[DT_MEM_TOTAL];
        memcpy(at_peak, cur, sizeof at_peak);
    }
}

/* "params 1.0, grads 1.0, ... MiB": the counts c by category into buf. */
static const char *split(const size_t *c, char *buf, size_t n) {
    size_t k = 0;
    for (int i = 0; i < DT_MEM_NCAT && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s%s %.2f", i ? ", " : "", names[i], (double)c[i] / 1048576.0);
    if (k < n) snprintf(buf + k, n - k, " MiB");
    return buf;
}

static void count_sub(dt_mem_cat cat, size_t bytes) {
    cur[cat] -= bytes < cur[cat] ? bytes : cur[cat];
    cur[DT_MEM_TOTAL] -= bytes < cur[DT_MEM_TOTAL] ? bytes : cur[DT_MEM_TOTAL];
}

static int valid_cat(dt_mem_cat cat) { return (unsigned)cat < DT_MEM_NCAT; }

void dt_mem_add(dt_mem_cat cat, size_t bytes) {
    if (!valid_cat(cat)) return;
    pthread_mutex_lock(&mu);
    count_add(cat, bytes);
    pthread_mutex_unlock(&mu);
}

void dt_mem_sub(dt_mem_cat cat, size_t bytes) {
    if (!valid_cat(cat)) return;
    pthread_mutex_lock(&mu);
    count_sub(cat, bytes);
    pthread_mutex_unlock(&mu);
}

/* Record a new allocation; on failure the caller frees it. */
static dt_status remember(void *p, size_t bytes, dt_mem_cat cat, int host) {
    dt_status s = DT_OK;
    pthread_mutex_lock(&mu);
    if (limit && (bytes > limit || cur[DT_MEM_TOTAL] > limit - bytes)) {
        char held[200];
        s = dt_error(DT_ERR_NOMEM, "memory cap: %.2f MiB more of %s would take this process to %.2f MiB, over its cap of "
                     "%.2f MiB; it holds %s", (double)bytes / 1048576.0, names[cat],
                     (double)(cur[DT_MEM_TOTAL] + bytes) / 1048576.0, (double)limit / 1048576.0,
                     split(cur, held, sizeof held));
    } else if (nreg == capreg) {
        size_t ncap = capreg ? 2 * capreg : 256;
        mem_entry *n = realloc(reg, ncap * sizeof *n);
        if (!n) s = dt_error(DT_ERR_NOMEM, "memory accounting: out of memory");
        else { reg = n; capreg = ncap; }
    }
    if (s == DT_OK) {
        reg[nreg++] = (mem_entry){.p = p, .bytes = bytes, .cat = cat, .host = host};
        count_add(cat, bytes);
    }
    pthread_mutex_unlock(&mu);
    return s;
}

static dt_status mem_alloc(const dt_ops *ops, dt_mem_cat cat, void **p, size_t bytes, size_t counted, int host) {
    if (!p) return dt_error(DT_ERR_INVALID, "memory accounting: NULL result pointer");
    *p = NULL;
    if (!valid_cat(cat)) return dt_error(DT_ERR_INVALID, "memory accounting: unknown category %d", (int)cat);
    DT_TRY(host ? ops->host_alloc(p, bytes) : counted < bytes ? ops->alloc_sparse(p, bytes) : ops->alloc(p, bytes));
    if (!*p) return DT_OK;   /* 0 bytes */
    dt_status s = remember(*p, counted < bytes ? counted : bytes, cat, host);
    if (s != DT_OK) {
        if (host) ops->host_free(*p);
        else ops->free(*p);
        *p = NULL;
    }
    return s;
}

dt_status dt_mem_alloc(const dt_ops *ops, dt_mem_cat cat, void **p, size_t bytes) {
    return mem_alloc(ops, cat, p, bytes, bytes, 0);
}

dt_status dt_mem_alloc_part(const dt_ops *ops, dt_mem_cat cat, void **p, size_t bytes, size_t counted) {
    return mem_alloc(ops, cat, p, bytes, counted, 0);
}

dt_status dt_mem_host_alloc(const dt_ops *ops, dt_mem_cat cat, void **p, size_t bytes) {
    return mem_alloc(ops, cat, p, bytes, bytes, 1);
}

void dt_mem_free(const dt_ops *ops, void *p) {
    if (!p) return;
    int host = 0;
    pthread_mutex_lock(&mu);
    for (size_t i = nreg; i-- > 0;) {
        if (reg[i].p != p) continue;
        count_sub(reg[i].cat, reg[i].bytes);
        host = reg[i].host;
        reg[i] = reg[--nreg];
        break;
    }
    if (!nreg) {   /* nothing left: give the registry back too */
        free(reg);
        reg = NULL;
        capreg = 0;
    }
    pthread_mutex_unlock(&mu);
    if (host) ops->host_free(p);
    else ops->free(p);
}

void dt_mem_get(dt_mem_stats *out) {
    pthread_mutex_lock(&mu);
    for (int c = 0; c <= DT_MEM_TOTAL; c++) {
        out->cur[c] = cur[c];
        out->peak[c] = peak[c];
    }
    pthread_mutex_unlock(&mu);
}

void dt_mem_reset_peak(void) {
    pthread_mutex_lock(&mu);
    for (int c = 0; c <= DT_MEM_TOTAL; c++) peak[c] = at_peak[c] = cur[c];
    pthread_mutex_unlock(&mu);
}

void dt_mem_set_limit(size_t bytes) {
    pthread_mutex_lock(&mu);
    limit = bytes;
    pthread_mutex_unlock(&mu);
}

size_t dt_mem_limit(void) {
    pthread_mutex_lock(&mu);
    size_t l = limit;
    pthread_mutex_unlock(&mu);
    return l;
}

dt_status dt_mem_check_limit(void) {
    dt_status s = DT_OK;
    pthread_mutex_lock(&mu);
    if (limit && peak[DT_MEM_TOTAL] > limit) {
        char held[200];
        s = dt_error(DT_ERR_NOMEM, "memory cap: this process held %.2f MiB at its peak, over its cap of %.2f MiB (%s)",
                     (double)peak[DT_MEM_TOTAL] / 1048576.0, (double)limit / 1048576.0, split(at_peak, held, sizeof held));
    }
    pthread_mutex_unlock(&mu);
    return s;
}
