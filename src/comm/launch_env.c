/*
 * launch_env.c: rank discovery from whatever launched this process, and Slurm host lists.
 *
 * Every launcher says "you are rank r of n" in its own variables; this file reads them
 * in the order launch_env.h documents so that the comm layer and dtrun never need to
 * know which launcher ran. Values are validated strictly: a typo in RANK or a port out
 * of range is a clear DT_ERR_INVALID naming the variable, never a silent rank 0 that
 * hangs the rendezvous for ten minutes.
 *
 * Slurm's compressed host lists ("node[01-03,7],gpu5") are expanded here too, because
 * the master address under Slurm is the first host of the step's node list.
 */
#include "launch_env.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A hostlist may not expand to more hosts than this: a typo like n[1-999999999] must
 * fail, not allocate gigabytes. Slurm's largest clusters are far below it. */
#define DT_HOSTLIST_MAX 1000000

/* ---- strict integer parsing ------------------------------------------------------ */

/* Parse the variable `name` (value `v`) as an integer in [lo, hi]. */
static dt_status parse_int_var(const char *name, const char *v, long lo, long hi, int *out) {
    const char *p = v;
    while (*p == ' ' || *p == '\t') p++;
    if (*p == '\0')
        return dt_error(DT_ERR_INVALID, "%s='%s': expected an integer in %ld..%ld", name, v, lo, hi);
    errno = 0;
    char *end = NULL;
    long x = strtol(p, &end, 10);
    while (end && (*end == ' ' || *end == '\t' || *end == '\n')) end++;
    if (errno != 0 || end == p || *end != '\0' || x < lo || x > hi)
        return dt_error(DT_ERR_INVALID, "%s='%s': expected an integer in %ld..%ld", name, v, lo, hi);
    *out = (int)x;
    return DT_OK;
}

/* Read an optional integer variable: *out = -1 (unchanged semantics "unknown") when unset. */
static dt_status env_int(const char *name, long lo, long hi, int *out) {
    const char *v = getenv(name);
    if (!v) { *out = -1; return DT_OK; }
    return parse_int_var(name, v, lo, hi, out);
}

/* Read an integer variable that this launcher must define. */
static dt_status env_int_required(const char *source, const char *name, long lo, long hi, int *out) {
    const char *v = getenv(name);
    if (!v)
        return dt_error(DT_ERR_INVALID, "%s launch environment: %s is not set", source, name);
    return parse_int_var(name, v, lo, hi, out);
}

/* Copy src into a fixed buffer; too long is an error rather than a truncated host name. */
static dt_status copy_str(const char *name, char *dst, size_t cap, const char *src) {
    size_t n = strlen(src);
    if (n >= cap)
        return dt_error(DT_ERR_INVALID, "%s: value of %zu characters is too long (at most %zu)",
                        name, n, cap - 1);
    memcpy(dst, src, n + 1);
    return DT_OK;
}

/* ---- Slurm helpers ------------------------------------------------------------------ */

/* SLURM_STEP_TASKS_PER_NODE / SLURM_TASKS_PER_NODE look like "2(x3),1": the number of
 * tasks on node 0, 1, ... in order. Return the count for node `node`, or -1 if the list
 * is absent, malformed or too short (local size then stays unknown). */
static int slurm_tasks_on_node(const char *list, int node) {
    if (!list || node < 0) return -1;
    const char *p = list;
    long seen = 0;
    while (*p) {
        char *end;
        errno = 0;
        long tasks = strtol(p, &end, 10);
        if (end == p || errno || tasks < 0) return -1;
        long reps = 1;
        p = end;
        if (p[0] == '(' && p[1] == 'x') {
            reps = strtol(p + 2, &end, 10);
            if (end == p + 2 || *end != ')' || reps < 1) return -1;
            p = end + 1;
        }
        if (node < seen + reps) return tasks > INT_MAX ? -1 : (int)tasks;
        seen += reps;
        if (*p == ',') p++;
        else if (*p) return -1;
    }
    return -1;
}

/* The default rendezvous port of a Slurm job: fixed by the job id, so every task of
 * the job computes the same one without talking, and spread over 20000..39999 so two
 * jobs sharing a node rarely collide. */
static int slurm_port_from_job(const char *job_id) {
    char *end;
    errno = 0;
    unsigned long long id = strtoull(job_id, &end, 10);
    if (errno || end == job_id) return 0;
    return 20000 + (int)(id % 20000ULL);
}

/* ---- discovery ------------------------------------------------------------------------ */

/* Fill rank/size/local fields for the source that defines a rank. */
static dt_status read_ranks(dt_launch_env *env) {
    int rank, size, lr, ls, nr;
    if (getenv("RANK")) {
        snprintf(env->source, sizeof env->source, "dtrain");
        DT_TRY(env_int_required("dtrain/torchrun", "WORLD_SIZE", 1, INT_MAX, &size));
        DT_TRY(env_int_required("dtrain/torchrun", "RANK", 0, size - 1, &rank));
        DT_TRY(env_int("LOCAL_WORLD_SIZE", 1, size, &ls));
        DT_TRY(env_int("LOCAL_RANK", 0, ls > 0 ? ls - 1 : size - 1, &lr));
        if (getenv("NODE_RANK")) DT_TRY(env_int("NODE_RANK", 0, size - 1, &nr));
        else                     DT_TRY(env_int("GROUP_RANK", 0, size - 1, &nr));
    } else if (getenv("OMPI_COMM_WORLD_RANK")) {
        snprintf(env->source, sizeof env->source, "openmpi");
        DT_TRY(env_int_required("Open MPI", "OMPI_COMM_WORLD_SIZE", 1, INT_MAX, &size));
        DT_TRY(env_int_required("Open MPI", "OMPI_COMM_WORLD_RANK", 0, size - 1, &rank));
        DT_TRY(env_int("OMPI_COMM_WORLD_LOCAL_SIZE", 1, size, &ls));
        DT_TRY(env_int("OMPI_COMM_WORLD_LOCAL_RANK", 0, ls > 0 ? ls - 1 : size - 1, &lr));
        nr = -1;   /* OMPI_COMM_WORLD_NODE_RANK numbers ranks within a node, not nodes */
    } else if (getenv("PMI_RANK")) {
        snprintf(env->source, sizeof env->source, "mpich");
        DT_TRY(env_int_required("MPICH", "PMI_SIZE", 1, INT_MAX, &size));
        DT_TRY(env_int_required("MPICH", "PMI_RANK", 0, size - 1, &rank));
        DT_TRY(env_int("MPI_LOCALNRANKS", 1, size, &ls));
        DT_TRY(env_int("MPI_LOCALRANKID", 0, ls > 0 ? ls - 1 : size - 1, &lr));
        nr = -1;
    } else if (getenv("SLURM_PROCID")) {
        snprintf(env->source, sizeof env->source, "slurm");
        if (!getenv("SLURM_NTASKS") && !getenv("SLURM_NPROCS"))
            return dt_error(DT_ERR_INVALID, "Slurm launch environment: SLURM_PROCID is set but "
                            "SLURM_NTASKS (or SLURM_NPROCS) is not set");
        const char *ntasks = getenv("SLURM_NTASKS") ? "SLURM_NTASKS" : "SLURM_NPROCS";
        DT_TRY(env_int_required("Slurm", ntasks, 1, INT_MAX, &size));
        DT_TRY(env_int_required("Slurm", "SLURM_PROCID", 0, size - 1, &rank));
        DT_TRY(env_int("SLURM_NODEID", 0, size - 1, &nr));
        const char *tpn = getenv("SLURM_STEP_TASKS_PER_NODE");
        if (!tpn) tpn = getenv("SLURM_TASKS_PER_NODE");
        ls = slurm_tasks_on_node(tpn, nr);
        if (ls < 1 || ls > size) ls = -1;
        DT_TRY(env_int("SLURM_LOCALID", 0, ls > 0 ? ls - 1 : size - 1, &lr));
    } else {
        snprintf(env->source, sizeof env->source, "none");
        return DT_OK;
    }
    env->rank = rank; env->size = size;
    env->local_rank = lr; env->local_size = ls;
    env->node_rank = nr;
    return DT_OK;
}

static dt_status read_job_id(dt_launch_env *env) {
    static const char *const vars[] = {
        "DT_JOB_ID", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "OMPI_MCA_ess_base_jobid",
        "PMIX_NAMESPACE", "PMI_JOBID",
    };
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v && *v) return copy_str(vars[i], env->job_id, sizeof env->job_id, v);
    }
    env->job_id[0] = '\0';
    return DT_OK;
}

/* MASTER_ADDR / MASTER_PORT when set; otherwise Slurm's guess when under Slurm. */
static dt_status read_master(dt_launch_env *env) {
    const char *addr = getenv("MASTER_ADDR");
    if (addr && *addr) {
        DT_TRY(copy_str("MASTER_ADDR", env->master_addr, sizeof env->master_addr, addr));
    } else {
        const char *var = "SLURM_STEP_NODELIST";
        const char *list = getenv(var);
        if (!list || !*list) { var = "SLURM_JOB_NODELIST"; list = getenv(var); }
        if (list && *list) {
            char **hosts;
            size_t n;
            dt_status s = dt_hostlist_expand(list, &hosts, &n);
            if (s != DT_OK) return dt_error_wrap(s, "%s: ", var);
            s = copy_str(var, env->master_addr, sizeof env->master_addr, hosts[0]);
            dt_hostlist_free(hosts, n);
            if (s != DT_OK) return s;
        }
    }
    const char *port = getenv("MASTER_PORT");
    if (port) {
        DT_TRY(parse_int_var("MASTER_PORT", port, 1, 65535, &env->master_port));
    } else {
        const char *job = getenv("SLURM_JOB_ID");
        if (job && *job) env->master_port = slurm_port_from_job(job);
    }
    return DT_OK;
}

dt_status dt_launch_env_discover(dt_launch_env *env) {
    if (!env) return dt_error(DT_ERR_INVALID, "dt_launch_env_discover: env is NULL");
    memset(env, 0, sizeof *env);
    env->rank = env->size = -1;
    env->local_rank = env->local_size = -1;
    env->node_rank = -1;
    DT_TRY(read_ranks(env));
    DT_TRY(read_job_id(env));
    DT_TRY(read_master(env));
    return DT_OK;
}

/* ---- Slurm compressed host lists ---------------------------------------------------- */

/* One item of a list, e.g. "r[1-2]n[01-03,7]x", as alternating literal text and bracket
 * groups. A group is a list of ranges lo..hi printed with `width` digits (zero padded).
 * The expansion is the Cartesian product, leftmost group varying slowest. */
typedef struct { uint64_t lo, hi; int width; } hl_range;
typedef struct {
    const char *text; size_t text_len;    /* literal before the group */
    hl_range   *ranges; size_t nranges;   /* nranges == 0: no group (trailing text) */
} hl_seg;

typedef struct { char **v; size_t n, cap; } hl_out;

static dt_status hl_push(hl_out *o, const char *s, size_t len) {
    if (o->n == o->cap) {
        size_t cap = o->cap ? o->cap * 2 : 16;
        char **v = realloc(o->v, cap * sizeof *v);
        if (!v) return dt_error(DT_ERR_NOMEM, "host list: out of memory");
        o->v = v; o->cap = cap;
    }
    char *h = malloc(len + 1);
    if (!h) return dt_error(DT_ERR_NOMEM, "host list: out of memory");
    memcpy(h, s, len);
    h[len] = '\0';
    o->v[o->n++] = h;
    return DT_OK;
}

/* Parse the digits at *p (at most 18, so they fit in uint64_t). */
static int hl_number(const char **p, uint64_t *x, int *width) {
    const char *s = *p;
    uint64_t v = 0;
    int w = 0;
    while (isdigit((unsigned char)*s)) {
        if (++w > 18) return 0;
        v = v * 10 + (uint64_t)(*s - '0');
        s++;
    }
    if (w == 0) return 0;
    *p = s; *x = v; *width = w;
    return 1;
}

/* Parse the inside of "[...]" starting after '['; on success *p points after ']'. */
static dt_status hl_group(const char *list, const char **p, hl_range **out, size_t *nout) {
    const char *s = *p;
    hl_range *r = NULL;
    size_t n = 0, cap = 0;
    dt_status st = DT_OK;
    for (;;) {
        hl_range x;
        int wlo, whi;
        if (!hl_number(&s, &x.lo, &wlo)) {
            st = dt_error(DT_ERR_INVALID, "host list '%s': expected a number at offset %td inside []",
                          list, s - list);
            goto fail;
        }
        x.hi = x.lo;
        x.width = wlo;
        if (*s == '-') {
            s++;
            if (!hl_number(&s, &x.hi, &whi)) {
                st = dt_error(DT_ERR_INVALID, "host list '%s': expected a number after '-' at offset %td",
                              list, s - list);
                goto fail;
            }
            if (x.hi < x.lo) {
                st = dt_error(DT_ERR_INVALID, "host list '%s': reversed range %llu-%llu", list,
                              (unsigned long long)x.lo, (unsigned long long)x.hi);
                goto fail;
            }
        }
        if (n == cap) {
            cap = cap ? cap * 2 : 4;
            hl_range *nr = realloc(r, cap * sizeof *nr);
            if (!nr) { st = dt_error(DT_ERR_NOMEM, "host list: out of memory"); goto fail; }
            r = nr;
        }
        r[n++] = x;
        if (*s == ',') { s++; continue; }
        if (*s == ']') { s++; break; }
        if (*s == '\0')
            st = dt_error(DT_ERR_INVALID, "host list '%s': unbalanced '[' (no closing ']')", list);
        else
            st = dt_error(DT_ERR_INVALID, "host list '%s': unexpected '%c' at offset %td inside []",
                          list, *s, s - list);
        goto fail;
    }
    *p = s; *out = r; *nout = n;
    return DT_OK;
fail:
    free(r);
    return st;
}

/* Expand segs[0..nseg) into o: odometer over the groups, rightmost fastest. */
static dt_status hl_emit(const char *list, hl_seg *segs, size_t nseg, hl_out *o) {
    /* Count first so a huge product fails before allocating anything. */
    uint64_t total = 1;
    size_t len = 0;
    for (size_t i = 0; i < nseg; i++) {
        len += segs[i].text_len;
        if (!segs[i].nranges) continue;
        uint64_t k = 0;
        int wmax = 0;
        for (size_t j = 0; j < segs[i].nranges; j++) {
            k += segs[i].ranges[j].hi - segs[i].ranges[j].lo + 1;
            if (k > DT_HOSTLIST_MAX) break;
            int w = segs[i].ranges[j].width > 20 ? segs[i].ranges[j].width : 20;   /* digits of a uint64_t */
            if (w > wmax) wmax = w;
        }
        if (k > DT_HOSTLIST_MAX)
            return dt_error(DT_ERR_INVALID, "host list '%s': expands to more than %d hosts",
                            list, DT_HOSTLIST_MAX);
        total *= k;
        len += (size_t)wmax;
        if (total + o->n > DT_HOSTLIST_MAX)
            return dt_error(DT_ERR_INVALID, "host list '%s': expands to more than %d hosts",
                            list, DT_HOSTLIST_MAX);
    }
    char *buf = malloc(len + 1);
    size_t *ri = calloc(nseg, sizeof *ri);     /* which range of group i */
    uint64_t *val = calloc(nseg, sizeof *val); /* current value of group i */
    dt_status st = DT_OK;
    if (!buf || !ri || !val) { st = dt_error(DT_ERR_NOMEM, "host list: out of memory"); goto done; }
    for (size_t i = 0; i < nseg; i++)
        if (segs[i].nranges) val[i] = segs[i].ranges[0].lo;
    for (;;) {
        size_t at = 0;
        for (size_t i = 0; i < nseg; i++) {
            memcpy(buf + at, segs[i].text, segs[i].text_len);
            at += segs[i].text_len;
            if (segs[i].nranges)
                at += (size_t)sprintf(buf + at, "%0*llu", segs[i].ranges[ri[i]].width,
                                      (unsigned long long)val[i]);
        }
        if ((st = hl_push(o, buf, at)) != DT_OK) goto done;
        /* Advance the odometer: bump the rightmost group that can move, reset those
         * to its right; when none can move, every combination has been written. */
        size_t i = nseg;
        for (;;) {
            if (i == 0) goto done;
            i--;
            if (!segs[i].nranges) continue;
            if (val[i] < segs[i].ranges[ri[i]].hi) { val[i]++; break; }
            if (ri[i] + 1 < segs[i].nranges) { ri[i]++; val[i] = segs[i].ranges[ri[i]].lo; break; }
            ri[i] = 0;
            val[i] = segs[i].ranges[0].lo;
        }
    }
done:
    free(buf); free(ri); free(val);
    return st;
}

/* Expand one top-level item [s, e). */
static dt_status hl_item(const char *list, const char *s, const char *e, hl_out *o) {
    hl_seg segs[16];
    size_t nseg = 0;
    dt_status st = DT_OK;
    if (s == e) return dt_error(DT_ERR_INVALID, "host list '%s': empty host name", list);
    const char *p = s;
    while (p < e) {
        if (nseg == sizeof segs / sizeof segs[0]) {
            st = dt_error(DT_ERR_INVALID, "host list '%s': too many [] groups in one name", list);
            goto done;
        }
        const char *t = p;
        while (p < e && *p != '[' && *p != ']') p++;
        hl_seg *g = &segs[nseg++];
        g->text = t; g->text_len = (size_t)(p - t);
        g->ranges = NULL; g->nranges = 0;
        if (p == e) break;
        if (*p == ']') {
            st = dt_error(DT_ERR_INVALID, "host list '%s': unbalanced ']' at offset %td", list, p - list);
            goto done;
        }
        p++;   /* '[' */
        if ((st = hl_group(list, &p, &g->ranges, &g->nranges)) != DT_OK) goto done;
        if (p > e) {   /* cannot happen: items end outside brackets */
            st = dt_error(DT_ERR_INTERNAL, "host list '%s': parser overran an item", list);
            goto done;
        }
    }
    st = hl_emit(list, segs, nseg, o);
done:
    for (size_t i = 0; i < nseg; i++) free(segs[i].ranges);
    return st;
}

dt_status dt_hostlist_expand(const char *list, char ***hosts, size_t *n) {
    if (!hosts || !n) return dt_error(DT_ERR_INVALID, "dt_hostlist_expand: NULL output");
    *hosts = NULL;
    *n = 0;
    if (!list || !*list) return dt_error(DT_ERR_INVALID, "host list is empty");
    for (const char *c = list; *c; c++)
        if (isspace((unsigned char)*c) || !isprint((unsigned char)*c))
            return dt_error(DT_ERR_INVALID, "host list '%s': unexpected whitespace or control character "
                            "at offset %td", list, c - list);
    hl_out o = {0};
    const char *s = list;
    dt_status st = DT_OK;
    for (;;) {
        /* an item ends at a ',' outside brackets */
        const char *e = s;
        int depth = 0;
        while (*e && !(depth == 0 && *e == ',')) {
            if (*e == '[' && ++depth > 1) {
                st = dt_error(DT_ERR_INVALID, "host list '%s': nested '[' at offset %td", list, e - list);
                goto fail;
            }
            if (*e == ']' && --depth < 0) {
                st = dt_error(DT_ERR_INVALID, "host list '%s': unbalanced ']' at offset %td", list, e - list);
                goto fail;
            }
            e++;
        }
        if (depth != 0) {
            st = dt_error(DT_ERR_INVALID, "host list '%s': unbalanced '[' (no closing ']')", list);
            goto fail;
        }
        if ((st = hl_item(list, s, e, &o)) != DT_OK) goto fail;
        if (!*e) break;
        s = e + 1;
    }
    *hosts = o.v;
    *n = o.n;
    return DT_OK;
fail:
    dt_hostlist_free(o.v, o.n);
    return st;
}

void dt_hostlist_free(char **hosts, size_t n) {
    if (!hosts) return;
    for (size_t i = 0; i < n; i++) free(hosts[i]);
    free(hosts);
}
